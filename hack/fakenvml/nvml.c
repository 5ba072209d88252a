/* The NVML calls gpusched's agent (through nvidia-ml-py) and NVIDIA's device plugin, GFD and MPS daemon (through
 * go-nvml / go-nvlib) make, answered from the fake GPUs of $GPUSCHED_FAKE_NVML_CONFIG. Every other symbol of
 * the NVML API is exported by stubs.c (generated from stubs.list) and returns NVML_ERROR_NOT_SUPPORTED. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakenvml.h"

#define API __attribute__((visibility("default")))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static struct fake_system sys_;

/* --------------------------------------------------------------------------------------------- helpers */

static int ready(void) { return refcount > 0; }

static struct fake_gpu *as_gpu(nvmlDevice_t d) {
    return d && d->kind == FAKE_GPU ? (struct fake_gpu *)d : NULL;
}

static struct fake_ci *as_mig(nvmlDevice_t d) {
    return d && d->kind == FAKE_MIG ? (struct fake_ci *)d : NULL;
}

/* The physical GPU behind a handle (a MIG device's parent). */
static struct fake_gpu *parent(nvmlDevice_t d) {
    struct fake_ci *m = as_mig(d);
    return m ? m->gi->gpu : as_gpu(d);
}

static nvmlReturn_t put_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

#define CHECK_INIT() \
    do { if (!ready()) return NVML_ERROR_UNINITIALIZED; } while (0)
#define GPU_OR_RETURN(var, dev)                               \
    struct fake_gpu *var = as_gpu(dev);                       \
    do {                                                      \
        if (!ready()) return NVML_ERROR_UNINITIALIZED;        \
        if (!var) return as_mig(dev) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT; \
    } while (0)
#define ANY_OR_RETURN(var, dev)                               \
    struct fake_gpu *var = parent(dev);                       \
    do {                                                      \
        if (!ready()) return NVML_ERROR_UNINITIALIZED;        \
        if (!var) return NVML_ERROR_INVALID_ARGUMENT;         \
    } while (0)

/* ------------------------------------------------------------------------------------ injected failure */

/* $GPUSCHED_FAKE_NVML_FAIL = "<call>[:<n>[:<code>]]": the n-th call (default 1st) of <call> after nvmlInit fails
 * with NVML error <code> (default NVML_ERROR_UNKNOWN) and changes nothing. Read at the first nvmlInit. Calls that
 * honour it: the MIG create/destroy calls and nvmlDeviceSetMigMode (the agent's reshape, rolled back). */
static char fail_call[96];
static long fail_nth, fail_seen;
static nvmlReturn_t fail_code;

static void read_fail_spec(void) {
    const char *spec = getenv("GPUSCHED_FAKE_NVML_FAIL");
    fail_call[0] = '\0';
    fail_seen = 0;
    fail_nth = 1;
    fail_code = NVML_ERROR_UNKNOWN;
    if (!spec || !*spec) return;
    snprintf(fail_call, sizeof(fail_call), "%s", spec);
    char *colon = strchr(fail_call, ':');
    if (!colon) return;
    *colon = '\0';
    char *end;
    fail_nth = strtol(colon + 1, &end, 10);
    if (*end == ':') fail_code = (nvmlReturn_t)strtol(end + 1, NULL, 10);
}

/* The injected error for this call of `name`, else NVML_SUCCESS. */
static nvmlReturn_t injected(const char *name) {
    if (!fail_call[0] || strcmp(fail_call, name)) return NVML_SUCCESS;
    pthread_mutex_lock(&mu);
    long seen = ++fail_seen;
    pthread_mutex_unlock(&mu);
    return seen == fail_nth ? fail_code : NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------ init and system */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (refcount == 0) {
        const char *path = getenv("GPUSCHED_FAKE_NVML_CONFIG");
        if (!path || !*path) {
            fprintf(stderr, "fake libnvidia-ml: GPUSCHED_FAKE_NVML_CONFIG is not set (the flat fake-GPU file)\n");
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else if (fake_load(path, &sys_) != 0) {
            rc = NVML_ERROR_UNKNOWN;
        }
        read_fail_spec();
    }
    if (rc == NVML_SUCCESS) refcount++;
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlInit(void) { return do_init(); }
API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (refcount > 0) refcount--;
    pthread_mutex_unlock(&mu);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    CHECK_INIT();
    return put_str(version, length, sys_.driver);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    CHECK_INIT();
    char buf[96];
    snprintf(buf, sizeof(buf), "%d.%s", sys_.cuda / 1000, sys_.driver);
    return put_str(version, length, buf);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    CHECK_INIT();
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = sys_.cuda;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ------------------------------------------------------------------------------------------- devices */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    CHECK_INIT();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)sys_.n_gpus;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    CHECK_INIT();
    if (!device || index >= (unsigned int)sys_.n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &sys_.gpus[index].h;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    CHECK_INIT();
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < sys_.n_gpus; i++) {
        struct fake_gpu *g = &sys_.gpus[i];
        if (!strcmp(g->uuid, uuid)) {
            *device = &g->h;
            return NVML_SUCCESS;
        }
        for (int j = 0; j < FAKE_MAX_GIS; j++)
            for (int k = 0; k < FAKE_MAX_CIS; k++) {
                struct fake_ci *c = &g->gis[j].cis[k];
                if (g->gis[j].used && c->used && !strcmp(c->uuid, uuid)) {
                    *device = &c->h;
                    return NVML_SUCCESS;
                }
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Bus ids compare without case and with or without the 8-digit domain's leading zeros. */
static int same_bus_id(const char *a, const char *b) {
    unsigned int d1, b1, s1, f1, d2, b2, s2, f2;
    if (sscanf(a, "%x:%x:%x.%x", &d1, &b1, &s1, &f1) != 4) return 0;
    if (sscanf(b, "%x:%x:%x.%x", &d2, &b2, &s2, &f2) != 4) return 0;
    return d1 == d2 && b1 == b2 && s1 == s2 && f1 == f2;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    CHECK_INIT();
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < sys_.n_gpus; i++)
        if (same_bus_id(sys_.gpus[i].bus_id, bus_id)) {
            *device = &sys_.gpus[i].h;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    GPU_OR_RETURN(g, dev);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = g->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    GPU_OR_RETURN(g, dev);
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    ANY_OR_RETURN(g, dev);
    struct fake_ci *m = as_mig(dev);
    if (!m) return put_str(name, length, g->name);
    char buf[FAKE_NAME_LEN * 2];
    snprintf(buf, sizeof(buf), "%s MIG %s", g->name, m->gi->profile->name);
    return put_str(name, length, buf);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    ANY_OR_RETURN(g, dev);
    struct fake_ci *m = as_mig(dev);
    return put_str(uuid, length, m ? m->uuid : g->uuid);
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t dev, int *brand) {
    ANY_OR_RETURN(g, dev);
    if (!brand) return NVML_ERROR_INVALID_ARGUMENT;
    *brand = strstr(g->name, "Tesla") ? 2 /* TESLA */ : 14 /* NVIDIA */;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned int *arch) {
    ANY_OR_RETURN(g, dev);
    if (!arch) return NVML_ERROR_INVALID_ARGUMENT;
    int cc = g->cc_major * 10 + g->cc_minor;
    *arch = cc >= 100 ? 10 : cc >= 90 ? 9 : cc == 89 ? 8 : cc >= 80 ? 7 : cc >= 75 ? 6 : cc >= 70 ? 5 : cc >= 60 ? 4 : 0xffffffffu;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor) {
    ANY_OR_RETURN(g, dev);
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

static void fill_pci(struct fake_gpu *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof(*pci));
    unsigned int dom = 0, bus = 0, dev = 0, fn = 0;
    sscanf(g->bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = 0;
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", dom, bus, dev, fn);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", dom & 0xffff, bus, dev, fn);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    ANY_OR_RETURN(g, dev);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(g, pci);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(dev, pci); }

/* Memory: a MIG device's is its GPU instance's; used is what the file says (0 when it says nothing). */
static void memory_of(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used) {
    struct fake_ci *m = as_mig(dev);
    struct fake_gpu *g = parent(dev);
    const unsigned long long mib = 1024ULL * 1024ULL;
    if (m) {
        *total = (unsigned long long)m->gi->profile->memory_mib * mib;
        *used = (unsigned long long)m->gi->mem_used_mib * mib; /* the GI's, which its CIs share */
    } else {
        *total = g->memory_mib * mib;
        *used = g->mem_used_mib > 0 ? (unsigned long long)g->mem_used_mib * mib : 0;
    }
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    ANY_OR_RETURN(g, dev);
    (void)g;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    memory_of(dev, &mem->total, &mem->used);
    mem->free = mem->total - mem->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    ANY_OR_RETURN(g, dev);
    (void)g;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != FAKE_STRUCT_VERSION(nvmlMemory_v2_t, 2)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory_of(dev, &mem->total, &mem->used);
    mem->reserved = 0;
    mem->free = mem->total - mem->used;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ readings */

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    GPU_OR_RETURN(g, dev); /* NVML attributes no utilization to MIG devices */
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->util < 0 || g->mig_mode) return NVML_ERROR_NOT_SUPPORTED; /* nor to a GPU in MIG mode */
    u->gpu = (unsigned int)g->util;
    u->memory = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp) {
    GPU_OR_RETURN(g, dev);
    if (!temp || sensor != 0 /* NVML_TEMPERATURE_GPU */) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->temp < 0) return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned int)g->temp;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *mw) {
    GPU_OR_RETURN(g, dev);
    if (!mw) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->power_mw < 0) return NVML_ERROR_NOT_SUPPORTED;
    *mw = (unsigned int)g->power_mw;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, int *mode) {
    ANY_OR_RETURN(g, dev);
    (void)g;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = 0; /* NVML_COMPUTEMODE_DEFAULT */
    return NVML_SUCCESS;
}

/* No processes run on fake GPUs. */
static nvmlReturn_t no_processes(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    ANY_OR_RETURN(g, dev);
    (void)g;
    (void)infos;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return no_processes(d, c, p); }
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return no_processes(d, c, p); }
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return no_processes(d, c, p); }

/* ---------------------------------------------------------------------------------- NVLink, topology */

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, int *active) {
    GPU_OR_RETURN(g, dev);
    if (!active || link >= FAKE_NVLINK_MAX) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->n_peers == 0) return NVML_ERROR_NOT_SUPPORTED;
    *active = link < (unsigned int)g->n_peers; /* link k goes to the k-th listed peer */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t dev, unsigned int link, unsigned int *version) {
    GPU_OR_RETURN(g, dev);
    if (!version || link >= FAKE_NVLINK_MAX) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= (unsigned int)g->n_peers) return NVML_ERROR_NOT_SUPPORTED;
    *version = g->cc_major >= 9 ? 4 : 3;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned int link, nvmlPciInfo_t *pci) {
    GPU_OR_RETURN(g, dev);
    if (!pci || link >= FAKE_NVLINK_MAX) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= (unsigned int)g->n_peers) return NVML_ERROR_NOT_SUPPORTED;
    int peer = g->peers[link];
    if (peer < 0 || peer >= sys_.n_gpus) return NVML_ERROR_UNKNOWN;
    fill_pci(&sys_.gpus[peer], pci);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t dev, unsigned int link, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, link, pci);
}

/* The fake has no PCIe tree: one GPU is INTERNAL to itself; GPUs on one NUMA node share NODE; else SYSTEM. */
static int topology(struct fake_gpu *a, struct fake_gpu *b) {
    if (a == b) return 0;
    if (a->numa >= 0 && a->numa == b->numa) return 40;
    return 50;
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2, int *level) {
    CHECK_INIT();
    struct fake_gpu *a = as_gpu(d1), *b = as_gpu(d2);
    if (!a || !b || !level) return NVML_ERROR_INVALID_ARGUMENT;
    *level = topology(a, b);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t dev, int level, unsigned int *count, nvmlDevice_t *out) {
    GPU_OR_RETURN(g, dev);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (int i = 0; i < sys_.n_gpus; i++) {
        struct fake_gpu *o = &sys_.gpus[i];
        if (o == g || topology(g, o) > level) continue;
        if (out && n < *count) out[n] = &o->h;
        n++;
    }
    if (out && n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, int caps, int *status) {
    CHECK_INIT();
    struct fake_gpu *a = as_gpu(d1), *b = as_gpu(d2);
    if (!a || !b || !status) return NVML_ERROR_INVALID_ARGUMENT;
    int linked = 0;
    for (int i = 0; i < a->n_peers; i++) linked |= a->peers[i] == (int)b->index;
    (void)caps;
    *status = linked ? 0 /* NVML_P2P_STATUS_OK */ : 4 /* NOT_SUPPORTED */;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, unsigned int *node) {
    GPU_OR_RETURN(g, dev);
    if (!node) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->numa < 0) return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)g->numa;
    return NVML_SUCCESS;
}

/* CPU affinity: the host's CPUs of the GPU's NUMA node (/sys/devices/system/node/node<N>/cpulist). */
API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t dev, unsigned int size, unsigned long *set) {
    GPU_OR_RETURN(g, dev);
    if (!set || size == 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->numa < 0) return NVML_ERROR_NOT_SUPPORTED;
    char path[96], list[4096];
    snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", g->numa);
    FILE *fp = fopen(path, "r");
    if (!fp) return NVML_ERROR_NOT_SUPPORTED;
    if (!fgets(list, sizeof(list), fp)) list[0] = '\0';
    fclose(fp);
    memset(set, 0, size * sizeof(unsigned long));
    const unsigned int bits = 8 * sizeof(unsigned long);
    for (char *p = list; *p && *p != '\n';) {
        char *end;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;
        if (end == p) break;
        if (*end == '-') hi = strtoul(end + 1, &end, 10);
        for (unsigned long c = lo; c <= hi && c < (unsigned long)size * bits; c++) set[c / bits] |= 1UL << (c % bits);
        p = *end == ',' ? end + 1 : end;
    }
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t dev, unsigned int size, unsigned long *set, int scope) {
    (void)scope;
    return nvmlDeviceGetCpuAffinity(dev, size, set);
}

API nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t dev, unsigned int size, unsigned long *set, int scope) {
    GPU_OR_RETURN(g, dev);
    (void)scope;
    if (!set || size == 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->numa < 0) return NVML_ERROR_NOT_SUPPORTED;
    const unsigned int bits = 8 * sizeof(unsigned long);
    if ((unsigned int)g->numa >= size * bits) return NVML_ERROR_INSUFFICIENT_SIZE;
    memset(set, 0, size * sizeof(unsigned long));
    set[g->numa / bits] |= 1UL << (g->numa % bits);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------- MIG: the mode */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    GPU_OR_RETURN(g, dev);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)g->mig_mode;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t dev, unsigned int mode, nvmlReturn_t *activation) {
    GPU_OR_RETURN(g, dev);
    if (!activation || mode > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t fail = injected("nvmlDeviceSetMigMode");
    if (fail) return *activation = fail;
    pthread_mutex_lock(&mu);
    int busy = 0;
    for (int i = 0; i < FAKE_MAX_GIS; i++) busy |= g->gis[i].used;
    if (!(busy && mode == 0)) g->mig_mode = (int)mode; /* turning MIG off with instances left: IN_USE */
    pthread_mutex_unlock(&mu);
    *activation = busy && mode == 0 ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    return *activation;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *is_mig) {
    CHECK_INIT();
    if (!is_mig || !parent(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = as_mig(dev) != NULL;
    return NVML_SUCCESS;
}

/* MIG devices of a GPU in (GI id, CI id) order: index k is the k-th of them. */
static struct fake_ci *mig_by_index(struct fake_gpu *g, unsigned int k) {
    unsigned int n = 0;
    for (unsigned int gid = 0; gid < 64; gid++)
        for (int i = 0; i < FAKE_MAX_GIS; i++) {
            struct fake_gi *gi = &g->gis[i];
            if (!gi->used || gi->id != gid) continue;
            for (unsigned int cid = 0; cid < FAKE_MAX_CIS; cid++)
                for (int j = 0; j < FAKE_MAX_CIS; j++)
                    if (gi->cis[j].used && gi->cis[j].id == cid && n++ == k) return &gi->cis[j];
        }
    return NULL;
}

static unsigned int max_sm_slices(struct fake_gpu *g) {
    unsigned int m = 0;
    for (int i = 0; i < FAKE_MAX_PROFILES; i++)
        if (g->profiles[i].present && g->profiles[i].sm_slices > m) m = g->profiles[i].sm_slices;
    return m;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    GPU_OR_RETURN(g, dev);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *count = g->mig_mode ? max_sm_slices(g) : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int k, nvmlDevice_t *mig) {
    GPU_OR_RETURN(g, dev);
    if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable || !g->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (k >= max_sm_slices(g)) return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_ci *c = mig_by_index(g, k);
    if (!c) return NVML_ERROR_NOT_FOUND;
    *mig = &c->h;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *dev) {
    CHECK_INIT();
    struct fake_ci *m = as_mig(mig);
    if (!m || !dev) return NVML_ERROR_INVALID_ARGUMENT;
    *dev = &m->gi->gpu->h;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    CHECK_INIT();
    if (!id || !parent(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_ci *m = as_mig(dev);
    if (!m) return NVML_ERROR_NOT_SUPPORTED;
    *id = m->gi->id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id) {
    CHECK_INIT();
    if (!id || !parent(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_ci *m = as_mig(dev);
    if (!m) return NVML_ERROR_NOT_SUPPORTED;
    *id = m->id;
    return NVML_SUCCESS;
}

/* A compute instance of `slices` SM slices inside a GI: its share of the GI's SMs (whole SMs per slice). */
static unsigned int ci_sms(struct fake_gi *gi, unsigned int slices) {
    return gi->profile->sm_slices ? gi->profile->sms / gi->profile->sm_slices * slices : 0;
}

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t dev, nvmlDeviceAttributes_t *a) {
    CHECK_INIT();
    if (!a || !parent(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_ci *m = as_mig(dev);
    if (!m) return NVML_ERROR_NOT_SUPPORTED;
    struct fake_profile *p = m->gi->profile;
    memset(a, 0, sizeof(*a));
    a->multiprocessorCount = m->slices == p->sm_slices ? p->sms : ci_sms(m->gi, m->slices);
    a->sharedCopyEngineCount = p->copy;
    a->sharedDecoderCount = p->decoder;
    a->sharedEncoderCount = p->encoder;
    a->sharedJpegCount = p->jpeg;
    a->sharedOfaCount = p->ofa;
    a->gpuInstanceSliceCount = p->sm_slices;
    a->computeInstanceSliceCount = m->slices;
    a->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t dev, nvmlDeviceAttributes_t *a) { return nvmlDeviceGetAttributes_v2(dev, a); }

/* ------------------------------------------------------------------------- MIG: GPU-instance profiles */

static struct fake_profile *profile_by_id(struct fake_gpu *g, unsigned int id) {
    for (int i = 0; i < FAKE_MAX_PROFILES; i++)
        if (g->profiles[i].present && g->profiles[i].id == id) return &g->profiles[i];
    return NULL;
}

static nvmlReturn_t profile_of(nvmlDevice_t dev, unsigned int index, struct fake_profile **out) {
    GPU_OR_RETURN(g, dev);
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= FAKE_MAX_PROFILES) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->profiles[index].present) return NVML_ERROR_NOT_SUPPORTED;
    *out = &g->profiles[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t dev, unsigned int index, nvmlGpuInstanceProfileInfo_t *info) {
    struct fake_profile *p;
    nvmlReturn_t rc = profile_of(dev, index, &p);
    if (rc) return rc;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof(*info));
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->sm_slices;
    info->instanceCount = p->max_count;
    info->multiprocessorCount = p->sms;
    info->copyEngineCount = p->copy;
    info->decoderCount = p->decoder;
    info->encoderCount = p->encoder;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t dev, unsigned int index, void *out) {
    struct fake_profile *p;
    nvmlReturn_t rc = profile_of(dev, index, &p);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = *(unsigned int *)out;
    if (version == FAKE_STRUCT_VERSION(nvmlGpuInstanceProfileInfo_v2_t, 2)) {
        nvmlGpuInstanceProfileInfo_v2_t *i = out;
        memset(i, 0, sizeof(*i));
        i->version = version;
        i->id = p->id;
        i->sliceCount = p->sm_slices;
        i->instanceCount = p->max_count;
        i->multiprocessorCount = p->sms;
        i->copyEngineCount = p->copy;
        i->decoderCount = p->decoder;
        i->encoderCount = p->encoder;
        i->jpegCount = p->jpeg;
        i->ofaCount = p->ofa;
        i->memorySizeMB = p->memory_mib;
        snprintf(i->name, sizeof(i->name), "MIG %s", p->name);
        return NVML_SUCCESS;
    }
    if (version == FAKE_STRUCT_VERSION(nvmlGpuInstanceProfileInfo_v3_t, 3)) {
        nvmlGpuInstanceProfileInfo_v3_t *i = out;
        memset(i, 0, sizeof(*i));
        i->version = version;
        i->id = p->id;
        i->sliceCount = p->sm_slices;
        i->instanceCount = p->max_count;
        i->multiprocessorCount = p->sms;
        i->copyEngineCount = p->copy;
        i->decoderCount = p->decoder;
        i->encoderCount = p->encoder;
        i->jpegCount = p->jpeg;
        i->ofaCount = p->ofa;
        i->memorySizeMB = p->memory_mib;
        snprintf(i->name, sizeof(i->name), "MIG %s", p->name);
        i->capabilities = 0;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}

/* Memory slices 0..7 taken by the GPU's instances, as a bit mask. */
static unsigned int occupied(struct fake_gpu *g) {
    unsigned int mask = 0;
    for (int i = 0; i < FAKE_MAX_GIS; i++)
        if (g->gis[i].used) mask |= ((1u << g->gis[i].profile->size) - 1) << g->gis[i].start;
    return mask;
}

static unsigned int sm_used(struct fake_gpu *g) {
    unsigned int n = 0;
    for (int i = 0; i < FAKE_MAX_GIS; i++)
        if (g->gis[i].used) n += g->gis[i].profile->sm_slices;
    return n;
}

static unsigned int count_of(struct fake_gpu *g, struct fake_profile *p) {
    unsigned int n = 0;
    for (int i = 0; i < FAKE_MAX_GIS; i++) n += g->gis[i].used && g->gis[i].profile == p;
    return n;
}

/* Whether a GI of profile p fits at `start` now: an allowed start, no overlap, SM slices and count left. */
static int fits(struct fake_gpu *g, struct fake_profile *p, unsigned int start) {
    if (start >= 32 || !(p->starts >> start & 1)) return 0;
    unsigned int span = ((1u << p->size) - 1) << start;
    return !(occupied(g) & span) && sm_used(g) + p->sm_slices <= max_sm_slices(g) && count_of(g, p) < p->max_count;
}

static nvmlReturn_t mig_profile(nvmlDevice_t dev, unsigned int profile_id, struct fake_gpu **gout, struct fake_profile **pout) {
    GPU_OR_RETURN(g, dev);
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (!g->mig_mode) return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_profile *p = profile_by_id(g, profile_id);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    *gout = g;
    *pout = p;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t dev, unsigned int profile_id,
                                                               nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    struct fake_gpu *g;
    struct fake_profile *p;
    nvmlReturn_t rc = mig_profile(dev, profile_id, &g, &p);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (unsigned int s = 0; s < 32; s++) {
        if (!(p->starts >> s & 1)) continue;
        if (out && n < *count) {
            out[n].start = s;
            out[n].size = p->size;
        }
        n++;
    }
    if (out && n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t dev, unsigned int profile_id, unsigned int *count) {
    struct fake_gpu *g;
    struct fake_profile *p;
    nvmlReturn_t rc = mig_profile(dev, profile_id, &g, &p);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    /* greedy, lowest start first: how many more of this profile can be created */
    pthread_mutex_lock(&mu);
    unsigned int mask = occupied(g), sm = sm_used(g), have = count_of(g, p), n = 0, total = max_sm_slices(g);
    for (unsigned int s = 0; s < 32; s++) {
        unsigned int span = ((1u << p->size) - 1) << s;
        if (!(p->starts >> s & 1) || (mask & span) || sm + p->sm_slices > total || have + n >= p->max_count) continue;
        mask |= span;
        sm += p->sm_slices;
        n++;
    }
    pthread_mutex_unlock(&mu);
    *count = n;
    return NVML_SUCCESS;
}

static unsigned int next_gi_id(struct fake_gpu *g) {
    for (unsigned int id = 1;; id++) {
        int taken = 0;
        for (int i = 0; i < FAKE_MAX_GIS; i++) taken |= g->gis[i].used && g->gis[i].id == id;
        if (!taken) return id;
    }
}

static nvmlReturn_t create_gi(const char *call, nvmlDevice_t dev, unsigned int profile_id, const nvmlGpuInstancePlacement_t *where,
                              nvmlGpuInstance_t *out) {
    struct fake_gpu *g;
    struct fake_profile *p;
    nvmlReturn_t rc = mig_profile(dev, profile_id, &g, &p);
    if (rc || (rc = injected(call))) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    int start = -1;
    if (where) {
        if (where->size != p->size) rc = NVML_ERROR_INVALID_ARGUMENT;
        else if (fits(g, p, where->start)) start = (int)where->start;
        else rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else {
        for (unsigned int s = 0; s < 32 && start < 0; s++)
            if (fits(g, p, s)) start = (int)s;
        if (start < 0) rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    struct fake_gi *gi = NULL;
    for (int i = 0; i < FAKE_MAX_GIS && !rc && !gi; i++)
        if (!g->gis[i].used) gi = &g->gis[i];
    if (!rc && !gi) rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!rc) {
        memset(gi, 0, sizeof(*gi));
        gi->used = 1;
        gi->gpu = g;
        gi->id = next_gi_id(g);
        gi->profile = p;
        gi->start = (unsigned int)start;
        *out = gi;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t dev, unsigned int profile_id, nvmlGpuInstance_t *gi) {
    return create_gi("nvmlDeviceCreateGpuInstance", dev, profile_id, NULL, gi);
}

API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t dev, unsigned int profile_id,
                                                          const nvmlGpuInstancePlacement_t *placement, nvmlGpuInstance_t *gi) {
    if (!placement) return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi("nvmlDeviceCreateGpuInstanceWithPlacement", dev, profile_id, placement, gi);
}

static int gi_live(nvmlGpuInstance_t gi) {
    if (!gi) return 0;
    for (int i = 0; i < sys_.n_gpus; i++)
        if (gi >= sys_.gpus[i].gis && gi < sys_.gpus[i].gis + FAKE_MAX_GIS) return gi->used;
    return 0;
}

API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) {
    CHECK_INIT();
    nvmlReturn_t rc = gi_live(gi) ? injected("nvmlGpuInstanceDestroy") : NVML_SUCCESS;
    if (rc) return rc;
    pthread_mutex_lock(&mu);
    if (!gi_live(gi)) rc = NVML_ERROR_INVALID_ARGUMENT;
    for (int j = 0; j < FAKE_MAX_CIS && !rc; j++)
        if (gi->cis[j].used) rc = NVML_ERROR_IN_USE; /* a compute instance is left in it */
    if (!rc) gi->used = 0;
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t dev, unsigned int profile_id, nvmlGpuInstance_t *out, unsigned int *count) {
    struct fake_gpu *g;
    struct fake_profile *p;
    nvmlReturn_t rc = mig_profile(dev, profile_id, &g, &p);
    if (rc) return rc;
    if (!count || !out) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (int i = 0; i < FAKE_MAX_GIS; i++)
        if (g->gis[i].used && g->gis[i].profile == p) {
            if (n >= *count) return NVML_ERROR_INSUFFICIENT_SIZE;
            out[n++] = &g->gis[i];
        }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t dev, unsigned int id, nvmlGpuInstance_t *out) {
    GPU_OR_RETURN(g, dev);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (!g->mig_mode) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < FAKE_MAX_GIS; i++)
        if (g->gis[i].used && g->gis[i].id == id) {
            *out = &g->gis[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    CHECK_INIT();
    if (!gi_live(gi) || !info) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &gi->gpu->h;
    info->id = gi->id;
    info->profileId = gi->profile->id;
    info->placement.start = gi->start;
    info->placement.size = gi->profile->size;
    return NVML_SUCCESS;
}

/* --------------------------------------------------------------------------------- compute instances */

/* CI profile index -> its slice count (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7,8,6}_SLICE, 1_SLICE_REV1). */
static const unsigned int ci_slices_of[FAKE_MAX_CI_PROFILES] = {1, 2, 3, 4, 7, 8, 6, 1};

static nvmlReturn_t ci_profile_ok(nvmlGpuInstance_t gi, unsigned int index, unsigned int eng) {
    CHECK_INIT();
    if (!gi_live(gi)) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= FAKE_MAX_CI_PROFILES || eng != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (index == 7 || ci_slices_of[index] > gi->profile->sm_slices) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static void ci_name(nvmlGpuInstance_t gi, unsigned int slices, char *out, size_t cap) {
    if (slices == gi->profile->sm_slices) snprintf(out, cap, "MIG %s", gi->profile->name);
    else snprintf(out, cap, "MIG %uc.%s", slices, gi->profile->name);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned int index, unsigned int eng,
                                                              nvmlComputeInstanceProfileInfo_t *info) {
    nvmlReturn_t rc = ci_profile_ok(gi, index, eng);
    if (rc) return rc;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_profile *p = gi->profile;
    unsigned int s = ci_slices_of[index];
    info->id = index;
    info->sliceCount = s;
    info->instanceCount = p->sm_slices / s;
    info->multiprocessorCount = s == p->sm_slices ? p->sms : ci_sms(gi, s);
    info->sharedCopyEngineCount = p->copy;
    info->sharedDecoderCount = p->decoder;
    info->sharedEncoderCount = p->encoder;
    info->sharedJpegCount = p->jpeg;
    info->sharedOfaCount = p->ofa;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gi, unsigned int index, unsigned int eng, void *out) {
    nvmlReturn_t rc = ci_profile_ok(gi, index, eng);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = *(unsigned int *)out;
    nvmlComputeInstanceProfileInfo_t base;
    nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, eng, &base);
    if (version == FAKE_STRUCT_VERSION(nvmlComputeInstanceProfileInfo_v2_t, 2) ||
        version == FAKE_STRUCT_VERSION(nvmlComputeInstanceProfileInfo_v3_t, 3)) {
        /* v2 and v3 share their first fields; v3 adds capabilities (0) after the name */
        nvmlComputeInstanceProfileInfo_v3_t *i = out;
        size_t size = version >> 24 == 3 ? sizeof(nvmlComputeInstanceProfileInfo_v3_t) : sizeof(nvmlComputeInstanceProfileInfo_v2_t);
        memset(i, 0, size);
        i->version = version;
        i->id = base.id;
        i->sliceCount = base.sliceCount;
        i->instanceCount = base.instanceCount;
        i->multiprocessorCount = base.multiprocessorCount;
        i->sharedCopyEngineCount = base.sharedCopyEngineCount;
        i->sharedDecoderCount = base.sharedDecoderCount;
        i->sharedEncoderCount = base.sharedEncoderCount;
        i->sharedJpegCount = base.sharedJpegCount;
        i->sharedOfaCount = base.sharedOfaCount;
        ci_name(gi, base.sliceCount, i->name, sizeof(i->name));
        return NVML_SUCCESS;
    }
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}

static unsigned int ci_occupied(nvmlGpuInstance_t gi) {
    unsigned int mask = 0;
    for (int j = 0; j < FAKE_MAX_CIS; j++)
        if (gi->cis[j].used) mask |= ((1u << gi->cis[j].slices) - 1) << gi->cis[j].start;
    return mask;
}

/* A CI of s slices may start at any multiple of s inside the GI (start + s <= GI slices). */
static int ci_fits(nvmlGpuInstance_t gi, unsigned int s, unsigned int start) {
    if (start % s || start + s > gi->profile->sm_slices) return 0;
    return !(ci_occupied(gi) & (((1u << s) - 1) << start));
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gi, unsigned int profile_id, unsigned int *count) {
    nvmlReturn_t rc = ci_profile_ok(gi, profile_id, 0);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int s = ci_slices_of[profile_id], n = 0, mask = ci_occupied(gi);
    for (unsigned int st = 0; st + s <= gi->profile->sm_slices; st += s)
        if (!(mask & (((1u << s) - 1) << st))) n++;
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t gi, unsigned int profile_id,
                                                                     nvmlComputeInstancePlacement_t *out, unsigned int *count) {
    nvmlReturn_t rc = ci_profile_ok(gi, profile_id, 0);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int s = ci_slices_of[profile_id], n = 0;
    for (unsigned int st = 0; st + s <= gi->profile->sm_slices; st += s) {
        if (out && n < *count) {
            out[n].start = st;
            out[n].size = s;
        }
        n++;
    }
    if (out && n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_ci(const char *call, nvmlGpuInstance_t gi, unsigned int profile_id,
                              const nvmlComputeInstancePlacement_t *where, nvmlComputeInstance_t *out) {
    nvmlReturn_t rc = ci_profile_ok(gi, profile_id, 0);
    if (rc || (rc = injected(call))) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int s = ci_slices_of[profile_id];
    pthread_mutex_lock(&mu);
    int start = -1;
    if (where) {
        if (where->size != s) rc = NVML_ERROR_INVALID_ARGUMENT;
        else if (ci_fits(gi, s, where->start)) start = (int)where->start;
        else rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else {
        for (unsigned int st = 0; st + s <= gi->profile->sm_slices && start < 0; st += s)
            if (ci_fits(gi, s, st)) start = (int)st;
        if (start < 0) rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    struct fake_ci *c = NULL;
    for (int j = 0; j < FAKE_MAX_CIS && !rc && !c; j++)
        if (!gi->cis[j].used) c = &gi->cis[j];
    if (!rc && !c) rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!rc) {
        unsigned int id = 0;
        for (int taken = 1; taken; id += taken) {
            taken = 0;
            for (int j = 0; j < FAKE_MAX_CIS; j++) taken |= gi->cis[j].used && gi->cis[j].id == id;
        }
        struct fake_gpu *g = gi->gpu;
        memset(c, 0, sizeof(*c));
        c->h.kind = FAKE_MIG;
        c->used = 1;
        c->gi = gi;
        c->id = id;
        c->profile_index = profile_id;
        c->slices = s;
        c->start = (unsigned int)start;
        /* a UUID that is new for this GPU: its UUID's tail with the GI, CI and a sequence number */
        const char *tail = strlen(g->uuid) > 12 ? g->uuid + strlen(g->uuid) - 12 : g->uuid;
        snprintf(c->uuid, sizeof(c->uuid), "MIG-%08x-%04x-%04x-8000-%s", 0xfa4e0000u + g->index, gi->id, id + (++g->mig_seq << 4), tail);
        *out = c;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned int profile_id, nvmlComputeInstance_t *ci) {
    return create_ci("nvmlGpuInstanceCreateComputeInstance", gi, profile_id, NULL, ci);
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t gi, unsigned int profile_id,
                                                                   const nvmlComputeInstancePlacement_t *placement,
                                                                   nvmlComputeInstance_t *ci) {
    if (!placement) return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci("nvmlGpuInstanceCreateComputeInstanceWithPlacement", gi, profile_id, placement, ci);
}

static int ci_live(nvmlComputeInstance_t ci) {
    return ci && ci->h.kind == FAKE_MIG && ci->used && gi_live(ci->gi);
}

API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci) {
    CHECK_INIT();
    nvmlReturn_t rc = ci_live(ci) ? injected("nvmlComputeInstanceDestroy") : NVML_SUCCESS;
    if (rc) return rc;
    pthread_mutex_lock(&mu);
    rc = ci_live(ci) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) ci->used = 0;
    pthread_mutex_unlock(&mu);
    return rc;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gi, unsigned int profile_id, nvmlComputeInstance_t *out,
                                                    unsigned int *count) {
    nvmlReturn_t rc = ci_profile_ok(gi, profile_id, 0);
    if (rc) return rc;
    if (!out || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (int j = 0; j < FAKE_MAX_CIS; j++)
        if (gi->cis[j].used && gi->cis[j].profile_index == profile_id) {
            if (n >= *count) return NVML_ERROR_INSUFFICIENT_SIZE;
            out[n++] = &gi->cis[j];
        }
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id, nvmlComputeInstance_t *out) {
    CHECK_INIT();
    if (!gi_live(gi) || !out) return NVML_ERROR_INVALID_ARGUMENT;
    for (int j = 0; j < FAKE_MAX_CIS; j++)
        if (gi->cis[j].used && gi->cis[j].id == id) {
            *out = &gi->cis[j];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    CHECK_INIT();
    if (!ci_live(ci) || !info) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &ci->gi->gpu->h;
    info->gpuInstance = ci->gi;
    info->id = ci->id;
    info->profileId = ci->profile_index;
    info->placement.start = ci->start;
    info->placement.size = ci->slices;
    return NVML_SUCCESS;
}

/* The first version had no placement: the same fields up to profileId. */
API nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    CHECK_INIT();
    if (!ci_live(ci) || !info) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &ci->gi->gpu->h;
    info->gpuInstance = ci->gi;
    info->id = ci->id;
    info->profileId = ci->profile_index;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------ events and XIDs */

#define XID_EVENT 0x8ULL /* nvmlEventTypeXidCriticalError */

struct fake_event_set {
    unsigned long long mask[FAKE_MAX_GPUS];
    int next_injected; /* the file's 'xid' lines, delivered once per set */
    long offset;       /* how far the XID file has been read */
};

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    CHECK_INIT();
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(struct fake_event_set));
    return *set ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    CHECK_INIT();
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    GPU_OR_RETURN(g, dev);
    (void)g;
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = XID_EVENT;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    GPU_OR_RETURN(g, dev);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~XID_EVENT) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    set->mask[g->index] |= types;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

static int deliver(nvmlEventSet_t set, int gpu, unsigned long long xid, nvmlEventData_t *data, int v2) {
    if (gpu < 0 || gpu >= sys_.n_gpus || !(set->mask[gpu] & XID_EVENT)) return 0;
    data->device = &sys_.gpus[gpu].h;
    data->eventType = XID_EVENT;
    data->eventData = xid;
    if (v2) data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu; /* not a MIG device's event */
    return 1;
}

/* The next complete "<gpu index> <xid>" line of the XID file after set->offset, if any. */
static int next_file_event(nvmlEventSet_t set, nvmlEventData_t *data, int v2) {
    if (!sys_.xid_file[0]) return 0;
    FILE *fp = fopen(sys_.xid_file, "r");
    if (!fp) return 0;
    int got = 0;
    char line[256];
    if (fseek(fp, set->offset, SEEK_SET) == 0) {
        while (!got && fgets(line, sizeof(line), fp)) {
            if (!strchr(line, '\n')) break; /* a line still being written */
            set->offset = ftell(fp);
            int gpu;
            unsigned long long xid;
            char extra;
            if (sscanf(line, "%d %llu %c", &gpu, &xid, &extra) == 2) got = deliver(set, gpu, xid, data, v2);
        }
    }
    fclose(fp);
    return got;
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms, int v2) {
    CHECK_INIT();
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start, now, nap = {0, 10 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&mu);
        int got = 0;
        while (!got && set->next_injected < sys_.n_xids) {
            struct fake_xid *x = &sys_.xids[set->next_injected++];
            got = deliver(set, x->gpu, x->xid, data, v2);
        }
        if (!got) got = next_file_event(set, data, v2);
        pthread_mutex_unlock(&mu);
        if (got) return NVML_SUCCESS;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited >= timeout_ms) return NVML_ERROR_TIMEOUT;
        nanosleep(&nap, NULL);
    }
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return wait_event(set, data, timeout_ms, 1);
}
API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return wait_event(set, data, timeout_ms, 0);
}
