/* Reads the flat fake-GPU description that `gpusched agent fake-nvml-config` writes from the agent's fake-GPU
 * file (one line per record, fields separated by tabs; see hack/fakenvml/README.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakenvml.h"

#define MAX_FIELDS 16

static int split(char *line, char **f) {
    int n = 0;
    char *p = line;
    while (n < MAX_FIELDS) {
        f[n++] = p;
        char *tab = strchr(p, '\t');
        if (!tab) break;
        *tab = '\0';
        p = tab + 1;
    }
    return n;
}

static int num(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static void copy(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
}

int fake_load(const char *path, struct fake_system *sys) {
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "fake libnvidia-ml: %s: cannot read: %s\n", path, strerror(errno));
        return -1;
    }
    memset(sys, 0, sizeof(*sys));
    copy(sys->driver, sizeof(sys->driver), "550.107.02");
    sys->cuda = 12040;
    char line[8192];
    int lineno = 0, header = 0;
    struct fake_gpu *g = NULL;
    const char *err = NULL;
    while (fgets(line, sizeof(line), fp)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0] || line[0] == '#') continue;
        char *f[MAX_FIELDS];
        int n = split(line, f);
        long long v[MAX_FIELDS] = {0};
        if (!header) {
            if (strcmp(f[0], "gpusched-fake-nvml") || n != 2 || strcmp(f[1], "1")) {
                err = "the first line must be 'gpusched-fake-nvml<TAB>1'";
                break;
            }
            header = 1;
        } else if (!strcmp(f[0], "driver") && n == 2) {
            copy(sys->driver, sizeof(sys->driver), f[1]);
        } else if (!strcmp(f[0], "cuda") && n == 2) {
            if (num(f[1], &v[1])) { err = "cuda: not a number"; break; }
            sys->cuda = (int)v[1];
        } else if (!strcmp(f[0], "xidfile") && n == 2) {
            copy(sys->xid_file, sizeof(sys->xid_file), f[1]);
        } else if (!strcmp(f[0], "gpu") && n == 11) {
            if (sys->n_gpus >= FAKE_MAX_GPUS) { err = "too many GPUs"; break; }
            for (int i = 4; i <= 9; i++)
                if (num(f[i], &v[i])) { err = "gpu: a numeric field is not a number"; break; }
            if (err) break;
            if (num(f[1], &v[1]) || v[1] != sys->n_gpus) { err = "gpu: indices must run 0, 1, 2..."; break; }
            g = &sys->gpus[sys->n_gpus++];
            g->h.kind = FAKE_GPU;
            g->index = (unsigned int)v[1];
            g->minor = g->index;
            copy(g->uuid, sizeof(g->uuid), f[2]);
            copy(g->bus_id, sizeof(g->bus_id), f[3]);
            g->pci_device_id = (unsigned int)v[4];
            g->memory_mib = (unsigned long long)v[5];
            g->cc_major = (int)v[6];
            g->cc_minor = (int)v[7];
            g->numa = (int)v[8];
            g->mig_capable = (int)v[9] >> 1 & 1;
            g->mig_mode = (int)v[9] & 1;
            copy(g->name, sizeof(g->name), f[10]);
            g->util = g->temp = -1;
            g->mem_used_mib = g->power_mw = -1;
        } else if (!g) {
            err = "a per-GPU line before the first 'gpu' line";
            break;
        } else if (!strcmp(f[0], "minor") && n == 2) {
            if (num(f[1], &v[1]) || v[1] < 0) { err = "minor: not a non-negative number"; break; }
            g->minor = (unsigned int)v[1];
        } else if (!strcmp(f[0], "peers") && n >= 2) {
            for (int i = 1; i < n; i++) {
                if (num(f[i], &v[i]) || v[i] < 0 || g->n_peers >= FAKE_NVLINK_MAX) { err = "peers: bad GPU index"; break; }
                g->peers[g->n_peers++] = (int)v[i];
            }
            if (err) break;
        } else if (!strcmp(f[0], "readings") && n == 5) {
            for (int i = 1; i < 5; i++)
                if (num(f[i], &v[i])) { err = "readings: not a number (use -1 for none)"; break; }
            if (err) break;
            g->util = (double)v[1];
            g->mem_used_mib = v[2];
            g->temp = (double)v[3];
            g->power_mw = v[4];
        } else if (!strcmp(f[0], "profile") && n == 15) {
            for (int i = 1; i < 14; i++)
                if (num(f[i], &v[i]) || v[i] < 0) { err = "profile: a numeric field is not a number"; break; }
            if (err) break;
            if (v[1] >= FAKE_MAX_PROFILES) { err = "profile: index out of range"; break; }
            struct fake_profile *p = &g->profiles[v[1]];
            p->present = 1;
            p->index = (unsigned int)v[1];
            p->id = (unsigned int)v[2];
            p->sm_slices = (unsigned int)v[3];
            p->max_count = (unsigned int)v[4];
            p->memory_mib = (unsigned int)v[5];
            p->sms = (unsigned int)v[6];
            p->copy = (unsigned int)v[7];
            p->decoder = (unsigned int)v[8];
            p->encoder = (unsigned int)v[9];
            p->jpeg = (unsigned int)v[10];
            p->ofa = (unsigned int)v[11];
            p->size = (unsigned int)v[12];
            p->starts = (unsigned int)v[13];
            copy(p->name, sizeof(p->name), f[14]);
        } else if (!strcmp(f[0], "mig") && (n == 6 || n == 7)) {
            for (int i = 1; i < 5; i++)
                if (num(f[i], &v[i]) || v[i] < 0) { err = "mig: a numeric field is not a number"; break; }
            if (err) break;
            v[6] = 0; /* memory used MiB: optional, -1 for none */
            if (n == 7 && num(f[6], &v[6])) { err = "mig: memory used is not a number (use -1 for none)"; break; }
            if (v[2] >= FAKE_MAX_PROFILES || !g->profiles[v[2]].present) { err = "mig: unknown profile index"; break; }
            struct fake_gi *gi = NULL;
            for (int i = 0; i < FAKE_MAX_GIS && !gi; i++)
                if (!g->gis[i].used) gi = &g->gis[i];
            if (!gi) { err = "mig: too many GPU instances"; break; }
            gi->used = 1;
            gi->gpu = g;
            gi->id = (unsigned int)v[1];
            gi->profile = &g->profiles[v[2]];
            gi->start = (unsigned int)v[3];
            gi->mem_used_mib = v[6] > 0 ? v[6] : 0;
            struct fake_ci *ci = &gi->cis[0];
            ci->h.kind = FAKE_MIG;
            ci->used = 1;
            ci->gi = gi;
            ci->id = 0;
            ci->slices = (unsigned int)v[4];
            ci->start = 0;
            /* the CI profile index whose slice count this is (1, 2, 3, 4, 7, 8, 6 slices: indices 0..6) */
            static const unsigned int by_slices[9] = {0, 0, 1, 2, 3, 0, 6, 4, 5};
            ci->profile_index = ci->slices <= 8 ? by_slices[ci->slices] : 0;
            copy(ci->uuid, sizeof(ci->uuid), f[5]);
        } else if (!strcmp(f[0], "xid") && n == 2) {
            if (num(f[1], &v[1]) || v[1] <= 0) { err = "xid: not a positive number"; break; }
            if (sys->n_xids < (int)(sizeof(sys->xids) / sizeof(sys->xids[0]))) {
                sys->xids[sys->n_xids].gpu = (int)g->index;
                sys->xids[sys->n_xids++].xid = (unsigned long long)v[1];
            }
        } else {
            err = "unknown record, or a wrong number of fields";
            break;
        }
    }
    fclose(fp);
    if (!err && !header) err = "empty file";
    if (err) {
        fprintf(stderr, "fake libnvidia-ml: %s: line %d: %s\n", path, lineno, err);
        return -1;
    }
    return 0;
}
