/*
 * device.h - the devices a model instance can be placed on: the CPU, each
 * CUDA GPU and each MIG instance, with total, budget, used and free bytes.
 *
 * The CPU's memory is the cgroup limit when one is set (v2 memory.max /
 * memory.current, v1 memory.limit_in_bytes / memory.usage_in_bytes, the
 * smallest limit on the way from the process's cgroup up to the root),
 * else /proc/meminfo MemTotal / MemAvailable.
 *
 * GPUs come from NVML (libnvidia-ml.so.1), loaded with dlopen at run time:
 * the binary has no link-time dependency on NVIDIA libraries and runs where
 * they are absent (then the list is the CPU alone and sp_devices_note says
 * why). CUDA_VISIBLE_DEVICES selects GPUs the way CUDA does: indices,
 * GPU-<uuid> or MIG-<uuid> (unique prefixes), comma-separated, the list
 * ending at the first entry that names nothing; empty or "-1" hides every
 * GPU. Indices are NVML's (PCI bus) order, which is CUDA's order only with
 * CUDA_DEVICE_ORDER=PCI_BUS_ID.
 *
 * MIG: a GPU split into MIG instances is listed (mig_enabled, no ordinal)
 * followed by its instances. A CUDA process enumerates one MIG instance at
 * most, so only the first MIG instance of the list (in CUDA_VISIBLE_DEVICES
 * order, else NVML's) gets a CUDA ordinal; further instances are listed with
 * ordinal -1 and the note says so. Several instances mean several servers,
 * one per instance (CUDA_VISIBLE_DEVICES=MIG-<uuid> each).
 *
 * Usage:
 *     sp_devices_t *devs;
 *     if (sp_devices_open(NULL, &devs, err, sizeof err) != SP_OK) ...
 *     for (int i = 0; i < sp_devices_count(devs); i++) {
 *         const sp_device_info_t *d = sp_devices_get(devs, i); ...
 *     }
 *     sp_devices_refresh(devs, err, sizeof err);   // new used/free figures
 *     sp_devices_close(devs);
 *
 * A sp_devices_t is not thread-safe: one owner refreshes it.
 */
#ifndef SP_DEVICE_DEVICE_H
#define SP_DEVICE_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "sampan/status.h"

typedef enum sp_device_kind {
    SP_DEVICE_CPU = 0,
    SP_DEVICE_GPU = 1,
    SP_DEVICE_MIG = 2,
} sp_device_kind_t;

#define SP_DEVICE_BUDGET_DEFAULT 0.8 /* share of total bytes a device may be given */
#define SP_DEVICE_MAX_GPUS 64        /* NVML counts above this are refused as bogus */
#define SP_DEVICE_MAX_MIG 16         /* MIG slots read per GPU (real parts have <= 7) */

typedef struct sp_device_info {
    sp_device_kind_t kind;
    int index;        /* position in the list; 0 is always the CPU */
    int ordinal;      /* CUDA device number under CUDA_VISIBLE_DEVICES; -1: cpu, a MIG-split
                       * GPU, a MIG instance after the first (CUDA opens one) */
    int nvml_index;   /* physical GPU (a MIG instance: its parent); -1 for the cpu */
    int mig_slot;     /* MIG instance slot on the parent, -1 otherwise */
    int parent;       /* list index of a MIG instance's GPU, -1 otherwise */
    bool mig_enabled; /* a GPU split into MIG instances: it runs nothing itself */
    char id[96];      /* "cpu", "GPU-..." or "MIG-..." */
    char name[96];    /* CPU model name or GPU product name (printable ASCII) */
    char source[16];  /* where the figures come from: "cgroup v2", "cgroup v1", "meminfo", "nvml" */
    uint64_t total_bytes;  /* memory the device has (the cgroup limit for the cpu) */
    uint64_t budget_bytes; /* what Sampan may use: total x budget fraction */
    uint64_t used_bytes;   /* in use by anyone at the last refresh */
    uint64_t free_bytes;   /* available at the last refresh */
    int util_percent;      /* GPU utilisation at the last refresh; -1 unknown */
} sp_device_info_t;

typedef struct sp_device_opts {
    const char *root;       /* prefix of /proc and /sys (tests); NULL or "" = the real ones */
    const char *nvml_lib;   /* NULL: $SAMPAN_NVML_LIB, else "libnvidia-ml.so.1"; "" = no GPUs */
    const char *visible;    /* NULL: $CUDA_VISIBLE_DEVICES (unset = every GPU) */
    double budget_fraction; /* (0, 1]; 0 = SP_DEVICE_BUDGET_DEFAULT */
} sp_device_opts_t;

typedef struct sp_devices sp_devices_t;

/* Enumerate the devices. Fails (SP_ERR_IO / SP_ERR_INVALID, err says which file or option)
 * only when the CPU's memory cannot be read or an option is bad; a missing or failing NVML
 * leaves the CPU alone in the list and a note. opts may be NULL. */
sp_status_t sp_devices_open(const sp_device_opts_t *opts, sp_devices_t **out, char *err,
                            size_t err_len);
/* Re-read used, free and utilisation of every device (the list itself does not change). */
sp_status_t sp_devices_refresh(sp_devices_t *devs, char *err, size_t err_len);
void sp_devices_close(sp_devices_t *devs); /* NULL is a no-op */

int sp_devices_count(const sp_devices_t *devs);
/* Device i (0 <= i < count), or NULL. Valid until sp_devices_close. */
const sp_device_info_t *sp_devices_get(const sp_devices_t *devs, int i);
/* Why there are no GPUs ("no NVML: ...", "NVML init failed: ..."), what CUDA_VISIBLE_DEVICES
 * or MIG leaves out, or "" when none to say. */
const char *sp_devices_note(const sp_devices_t *devs);
double sp_devices_budget_fraction(const sp_devices_t *devs);
/* List index of a device named "cpu", "cuda:N"/"gpu:N" (CUDA ordinal), or a GPU-/MIG- UUID
 * (unique prefix); -1 when nothing matches. */
int sp_devices_find(const sp_devices_t *devs, const char *spec);

const char *sp_device_kind_name(sp_device_kind_t kind); /* "cpu", "gpu", "mig" */

#endif /* SP_DEVICE_DEVICE_H */
