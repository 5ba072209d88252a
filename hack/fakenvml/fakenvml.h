/* A fake libnvidia-ml.so.1 for tests without a GPU: the NVML C ABI over a description of fake GPUs.
 *
 * The types below are written from NVML's documented ABI (nvml.h, API version 12: field order, widths and the
 * struct-version encoding). tests/test_fakenvml_abi.py prints every size, offset and constant used here
 * compiled against this file and against NVIDIA's nvml.h (go-nvml's copy in the Go module cache) and compares.
 */
#ifndef GPUSCHED_FAKENVML_H
#define GPUSCHED_FAKENVML_H

#include <stddef.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define FAKE_NAME_LEN 96      /* NVML_DEVICE_NAME_V2_BUFFER_SIZE (profile names too) */
#define FAKE_UUID_LEN 96      /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define FAKE_BUSID_LEN 32     /* NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE */
#define FAKE_BUSID_V2_LEN 16  /* NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE */
#define FAKE_NVLINK_MAX 18    /* NVML_NVLINK_MAX_LINKS */
#define FAKE_MAX_GPUS 64
#define FAKE_MAX_PROFILES 17  /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define FAKE_MAX_CI_PROFILES 8 /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define FAKE_MAX_GIS 8
#define FAKE_MAX_CIS 8

/* An NVML struct's version word: its size in the low bits, the version in the top byte. */
#define FAKE_STRUCT_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((ver) << 24U)))

typedef struct fake_handle *nvmlDevice_t;
typedef struct fake_gi *nvmlGpuInstance_t;
typedef struct fake_ci *nvmlComputeInstance_t;
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[FAKE_BUSID_V2_LEN];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[FAKE_BUSID_LEN];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[FAKE_NAME_LEN];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[FAKE_NAME_LEN];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef nvmlGpuInstancePlacement_t nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[FAKE_NAME_LEN];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[FAKE_NAME_LEN];
    unsigned int capabilities;
} nvmlComputeInstanceProfileInfo_v3_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* the v2 layout, which the _v3 calls take */

/* ------------------------------------------------------------------------------------------ the model */

enum fake_kind { FAKE_GPU = 0x47505531, FAKE_MIG = 0x4d494731 };

/* What a device handle points at: a whole GPU or a MIG device (one compute instance). */
struct fake_handle {
    int kind;
};

struct fake_profile { /* one GPU-instance profile, by its NVML index constant */
    int present;
    unsigned int index, id, sm_slices, max_count, memory_mib, sms;
    unsigned int copy, decoder, encoder, jpeg, ofa;
    unsigned int size;     /* placement size, in memory slices */
    unsigned int starts;   /* bit i set: may start at memory slice i */
    char name[FAKE_NAME_LEN];
};

struct fake_gpu;
struct fake_gi;

struct fake_ci {
    struct fake_handle h; /* FAKE_MIG: this CI is also a MIG device handle */
    int used;
    struct fake_gi *gi;
    unsigned int id, profile_index, slices, start;
    char uuid[FAKE_UUID_LEN];
};

struct fake_gi {
    int used;
    struct fake_gpu *gpu;
    unsigned int id;
    struct fake_profile *profile;
    unsigned int start;
    long long mem_used_mib; /* framebuffer in use, shared by its CIs (the flat file's, else 0) */
    struct fake_ci cis[FAKE_MAX_CIS];
};

struct fake_gpu {
    struct fake_handle h; /* FAKE_GPU */
    unsigned int index;
    unsigned int minor; /* nvmlDeviceGetMinorNumber: the 'minor' line, else the index */
    char name[FAKE_NAME_LEN];
    char uuid[FAKE_UUID_LEN];
    char bus_id[FAKE_BUSID_LEN];
    unsigned int pci_device_id;
    unsigned long long memory_mib;
    int cc_major, cc_minor;
    int numa;  /* -1: unknown */
    int mig_capable, mig_mode;
    int n_peers;
    int peers[FAKE_NVLINK_MAX];
    double util, temp;               /* < 0: not given */
    long long mem_used_mib, power_mw; /* < 0: not given */
    struct fake_profile profiles[FAKE_MAX_PROFILES];
    struct fake_gi gis[FAKE_MAX_GIS];
    unsigned int mig_seq; /* for the UUIDs of created compute instances */
};

struct fake_xid {
    int gpu;
    unsigned long long xid;
};

struct fake_system {
    char driver[80];
    int cuda; /* 12040 */
    char xid_file[4096];
    int n_gpus;
    struct fake_gpu gpus[FAKE_MAX_GPUS];
    int n_xids; /* injected once, at start */
    struct fake_xid xids[256];
};

/* config.c: reads the flat description (see hack/fakenvml/README.md); 0 on success, else -1 with a message
 * on stderr naming the file and line. */
int fake_load(const char *path, struct fake_system *sys);

#endif
