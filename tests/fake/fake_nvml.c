/*
 * fake_nvml.c - a stand-in for libnvidia-ml.so.1 that tests/unit/test_device.c loads
 * through SAMPAN_NVML_LIB / sp_device_opts_t.nvml_lib. Built by the Makefile as
 * $(BUILD)/libfake_nvml.so, and with -DFAKE_NVML_NO_MEMINFO as
 * $(BUILD)/libfake_nvml_nosym.so (a library that lacks a required symbol).
 *
 * Two GPUs: GPU 0 a plain 80 GiB card; GPU 1 a 40 GiB card in MIG mode with
 * instances in slots 0 and 2 (slot 1 empty, to exercise the gap).
 * Environment knobs: FAKE_NVML_INIT_FAIL=1 makes nvmlInit_v2 fail,
 * FAKE_NVML_COUNT=N overrides the GPU count (a bogus large one must be refused),
 * FAKE_NVML_USED_MIB=N changes GPU 0's used memory (to see a refresh).
 * Only the signatures Sampan declares are implemented, with NVML's return codes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK 0
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_NOT_FOUND 6
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_DRIVER_NOT_LOADED 9
#define ERR_UNINITIALIZED 1

#define GIB (1024ull * 1024 * 1024)

typedef struct {
    unsigned long long total, free, used;
} mem_t;

typedef struct {
    unsigned int gpu, memory;
} util_t;

typedef struct fake_dev {
    const char *name, *uuid;
    unsigned long long total, used;
    int util;            /* -1: not supported (MIG) */
    int mig;             /* MIG mode */
    int parent;          /* -1 or GPU index */
} fake_dev;

static fake_dev devs[] = {
    {"Fake H100 80GB", "GPU-11111111-2222-3333-4444-555555555555", 80 * GIB, 1 * GIB, 37, 0, -1},
    {"Fake A100 40GB", "GPU-66666666-7777-8888-9999-000000000000", 40 * GIB, 2 * GIB, 5, 1, -1},
    {"Fake A100 MIG 3g.20gb", "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001", 20 * GIB, 3 * GIB, -1, 0, 1},
    {"Fake A100 MIG 2g.10gb", "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000002", 10 * GIB, 0, -1, 0, 1},
};

static int initialised;

static int
put_str(char *buf, unsigned int len, const char *s)
{
    if (buf == NULL) {
        return ERR_INVALID_ARGUMENT;
    }
    if (strlen(s) + 1 > len) {
        return ERR_INSUFFICIENT_SIZE;
    }
    memcpy(buf, s, strlen(s) + 1);
    return OK;
}

int
nvmlInit_v2(void)
{
    const char *f = getenv("FAKE_NVML_INIT_FAIL");
    if (f != NULL && strcmp(f, "1") == 0) {
        return ERR_DRIVER_NOT_LOADED;
    }
    initialised++;
    return OK;
}

int
nvmlShutdown(void)
{
    if (initialised == 0) {
        return ERR_UNINITIALIZED;
    }
    initialised--;
    return OK;
}

const char *
nvmlErrorString(int rc)
{
    switch (rc) {
    case OK: return "Success";
    case ERR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case ERR_NOT_FOUND: return "Not Found";
    default: return "Unknown Error";
    }
}

int
nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialised) {
        return ERR_UNINITIALIZED;
    }
    const char *c = getenv("FAKE_NVML_COUNT");
    *count = c != NULL ? (unsigned int)strtoul(c, NULL, 10) : 2;
    return OK;
}

int
nvmlDeviceGetHandleByIndex_v2(unsigned int i, fake_dev **h)
{
    if (!initialised) {
        return ERR_UNINITIALIZED;
    }
    if (i >= 2) {
        return ERR_INVALID_ARGUMENT;
    }
    *h = &devs[i];
    return OK;
}

int
nvmlDeviceGetName(fake_dev *h, char *buf, unsigned int len)
{
    return put_str(buf, len, h->name);
}

int
nvmlDeviceGetUUID(fake_dev *h, char *buf, unsigned int len)
{
    return put_str(buf, len, h->uuid);
}

#ifndef FAKE_NVML_NO_MEMINFO
int
nvmlDeviceGetMemoryInfo(fake_dev *h, mem_t *m)
{
    unsigned long long used = h->used;
    const char *u = getenv("FAKE_NVML_USED_MIB");
    if (h == &devs[0] && u != NULL) {
        used = strtoull(u, NULL, 10) * 1024 * 1024;
    }
    m->total = h->total;
    m->used = used;
    m->free = h->total - used;
    return OK;
}
#endif

int
nvmlDeviceGetUtilizationRates(fake_dev *h, util_t *u)
{
    if (h->util < 0) {
        return ERR_NOT_SUPPORTED;
    }
    u->gpu = (unsigned int)h->util;
    u->memory = 1;
    return OK;
}

int
nvmlDeviceGetMigMode(fake_dev *h, unsigned int *cur, unsigned int *pending)
{
    if (h->parent >= 0) {
        return ERR_NOT_SUPPORTED;
    }
    *cur = *pending = (unsigned int)h->mig;
    return OK;
}

int
nvmlDeviceGetMaxMigDeviceCount(fake_dev *h, unsigned int *count)
{
    *count = h->mig ? 7 : 0;
    return OK;
}

int
nvmlDeviceGetMigDeviceHandleByIndex(fake_dev *h, unsigned int i, fake_dev **out)
{
    if (h != &devs[1] || !h->mig) {
        return ERR_INVALID_ARGUMENT;
    }
    if (i == 0) {
        *out = &devs[2];
        return OK;
    }
    if (i == 2) {
        *out = &devs[3];
        return OK;
    }
    return ERR_NOT_FOUND;
}
