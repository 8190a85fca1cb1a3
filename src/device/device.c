/*
 * device.c - device enumeration: the CPU from cgroups or /proc/meminfo, GPUs and
 * MIG instances from NVML loaded with dlopen (see device.h for the rules).
 *
 * Nothing here trusts the files or the library: numbers are parsed strictly,
 * counts are capped, strings are cut to their buffers and made printable.
 */
#include "device/device.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "device/nvml_abi.h"

/* ---- NVML ---------------------------------------------------------------------- */

typedef struct sp_nvml {
    void *lib;
    int (*init)(void);
    int (*shutdown)(void);
    const char *(*error_string)(int);
    int (*get_count)(unsigned int *);
    int (*get_handle)(unsigned int, sp_nvml_dev_t *);
    int (*get_name)(sp_nvml_dev_t, char *, unsigned int);
    int (*get_uuid)(sp_nvml_dev_t, char *, unsigned int);
    int (*get_memory)(sp_nvml_dev_t, sp_nvml_memory_t *);
    int (*get_util)(sp_nvml_dev_t, sp_nvml_util_t *);                /* optional */
    int (*get_mig_mode)(sp_nvml_dev_t, unsigned int *, unsigned int *); /* optional (MIG) */
    int (*get_max_mig)(sp_nvml_dev_t, unsigned int *);              /* optional (MIG) */
    int (*get_mig_handle)(sp_nvml_dev_t, unsigned int, sp_nvml_dev_t *); /* optional (MIG) */
} sp_nvml_t;

struct sp_devices {
    sp_device_info_t *dev;
    sp_nvml_dev_t *handle; /* parallel to dev; NULL for the cpu */
    int n, cap;
    double budget_fraction;
    char root[256];
    sp_nvml_t nvml; /* nvml.lib != NULL while loaded (and initialised) */
    char note[256];
};

/* ---- small helpers ---------------------------------------------------------- */

/* Read a whole small file into buf (NUL-terminated); false when absent or unreadable. */
static bool
read_small(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    size_t n = fread(buf, 1, len - 1, f);
    bool ok = !ferror(f);
    fclose(f);
    buf[n] = '\0';
    return ok;
}

/* A decimal uint64 followed only by whitespace; false on anything else or overflow. */
static bool
parse_u64(const char *s, uint64_t *out)
{
    while (*s == ' ' || *s == '\t') {
        s++;
    }
    if (!isdigit((unsigned char)*s)) {
        return false;
    }
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) {
        return false;
    }
    while (*end == ' ' || *end == '\t' || *end == '\n') {
        end++;
    }
    if (*end != '\0') {
        return false;
    }
    *out = v;
    return true;
}

/* Copy a string from an untrusted source, keeping printable ASCII only. */
static void
copy_printable(char *dst, size_t len, const char *src)
{
    size_t j = 0;
    for (size_t i = 0; src[i] != '\0' && j + 1 < len; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[j++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    dst[j] = '\0';
}

static uint64_t
budget_of(uint64_t total, double frac)
{
    double b = (double)total * frac;
    return b >= (double)total ? total : (uint64_t)b;
}

static bool
path_fmt(char *buf, size_t len, const char *fmt, ...) SP_PRINTF(3, 4);

static bool
path_fmt(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < len;
}

/* ---- the CPU ---------------------------------------------------------------- */

typedef struct {
    uint64_t total, avail; /* bytes */
} meminfo_t;

static sp_status_t
read_meminfo(const char *root, meminfo_t *mi, char *err, size_t err_len)
{
    char path[512];
    if (!path_fmt(path, sizeof path, "%s/proc/meminfo", root)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "devices: root path too long");
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return sp_errf(err, err_len, SP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char line[256];
    bool have_total = false, have_avail = false;
    uint64_t free_kb = 0, buffers_kb = 0, cached_kb = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        char key[64];
        unsigned long long kb;
        if (sscanf(line, "%63[^:]: %llu", key, &kb) != 2 || kb > UINT64_MAX / 1024) {
            continue;
        }
        if (strcmp(key, "MemTotal") == 0) {
            mi->total = kb * 1024;
            have_total = true;
        } else if (strcmp(key, "MemAvailable") == 0) {
            mi->avail = kb * 1024;
            have_avail = true;
        } else if (strcmp(key, "MemFree") == 0) {
            free_kb = kb;
        } else if (strcmp(key, "Buffers") == 0) {
            buffers_kb = kb;
        } else if (strcmp(key, "Cached") == 0) {
            cached_kb = kb;
        }
    }
    fclose(f);
    if (!have_total || mi->total == 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: no MemTotal line", path);
    }
    if (!have_avail) { /* kernels before 3.14: the usual estimate */
        mi->avail = (free_kb + buffers_kb + cached_kb) * 1024;
    }
    if (mi->avail > mi->total) {
        mi->avail = mi->total;
    }
    return SP_OK;
}

/* The process's cgroup path for the v2 hierarchy (v2 = true) or the v1 memory
 * controller, from <root>/proc/self/cgroup; "/" when the file says nothing. */
static void
cgroup_path(const char *root, bool v2, char *out, size_t len)
{
    snprintf(out, len, "/");
    char path[512];
    if (!path_fmt(path, sizeof path, "%s/proc/self/cgroup", root)) {
        return;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return;
    }
    char line[1024];
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL || c2[1] != '/') {
            continue;
        }
        *c1 = '\0';
        *c2 = '\0';
        const char *ctrl = c1 + 1;
        bool match = false;
        if (v2) {
            match = strcmp(line, "0") == 0 && ctrl[0] == '\0';
        } else { /* "4:memory:/x" or "4:cpu,memory:/x" */
            char list[256];
            snprintf(list, sizeof list, ",%s,", ctrl);
            match = strstr(list, ",memory,") != NULL;
        }
        if (match && strstr(c2 + 1, "/..") == NULL) { /* never walk out of the mount */
            snprintf(out, len, "%s", c2 + 1);
            break;
        }
    }
    fclose(f);
}

/* Walk from <mount><cgpath> up to <mount>: the smallest limit in limit_file ("max" or
 * absurd values mean none) and the usage of the deepest directory that has usage_file.
 * Returns false when no level has limit_file (that hierarchy does not control memory). */
static bool
cgroup_walk(const char *mount, const char *cgpath, const char *limit_file, const char *usage_file,
            uint64_t *limit, bool *limited, uint64_t *usage)
{
    char dir[768], path[1024], buf[64];
    if (!path_fmt(dir, sizeof dir, "%s%s", mount, strcmp(cgpath, "/") == 0 ? "" : cgpath)) {
        return false;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        /* The cgroup namespace hides the path: the mount is our own cgroup. */
        snprintf(dir, sizeof dir, "%s", mount);
    }
    size_t mlen = strlen(mount);
    bool found = false, have_usage = false;
    *limited = false;
    for (int depth = 0; depth < 64; depth++) {
        if (path_fmt(path, sizeof path, "%s/%s", dir, limit_file) &&
            read_small(path, buf, sizeof buf)) {
            found = true;
            uint64_t v;
            if (parse_u64(buf, &v) && (!*limited || v < *limit)) {
                *limit = v;
                *limited = true;
            } /* "max" (v2) or junk: no limit at this level */
        }
        if (!have_usage && path_fmt(path, sizeof path, "%s/%s", dir, usage_file) &&
            read_small(path, buf, sizeof buf) && parse_u64(buf, usage)) {
            have_usage = true;
        }
        if (strlen(dir) <= mlen) {
            break;
        }
        char *slash = strrchr(dir, '/');
        if (slash == NULL || (size_t)(slash - dir) < mlen) {
            break;
        }
        *slash = '\0';
        if (strlen(dir) < mlen) {
            break;
        }
    }
    if (!have_usage) {
        *usage = 0;
    }
    return found;
}

static void
cpu_name(const char *root, char *out, size_t len)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    char model[96] = "";
    char path[512];
    if (path_fmt(path, sizeof path, "%s/proc/cpuinfo", root)) {
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            char line[512];
            while (fgets(line, sizeof line, f) != NULL) {
                if (strncmp(line, "model name", 10) == 0 && strchr(line, ':') != NULL) {
                    const char *v = strchr(line, ':') + 1;
                    while (*v == ' ' || *v == '\t') {
                        v++;
                    }
                    char tmp[96];
                    snprintf(tmp, sizeof tmp, "%.*s", (int)strcspn(v, "\n"), v);
                    copy_printable(model, sizeof model, tmp);
                    break;
                }
            }
            fclose(f);
        }
    }
    if (model[0] == '\0') {
        snprintf(model, sizeof model, "cpu");
    }
    char full[160];
    snprintf(full, sizeof full, "%s, %ld threads", model, n > 0 ? n : 1);
    copy_printable(out, len, full);
}

/* Fill the cpu's figures (d->kind etc. set by the caller). */
static sp_status_t
cpu_read(const char *root, double frac, sp_device_info_t *d, char *err, size_t err_len)
{
    meminfo_t mi = {0, 0};
    sp_status_t st = read_meminfo(root, &mi, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    char mount[512], cg[512];
    uint64_t limit = 0, usage = 0;
    bool limited = false;
    const char *source = "meminfo";

    /* v2 first (unified mount, or the hybrid layout's /sys/fs/cgroup/unified), then v1. */
    static const char *const v2_mounts[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
    bool found = false;
    cgroup_path(root, true, cg, sizeof cg);
    for (size_t i = 0; i < 2 && !found; i++) {
        if (path_fmt(mount, sizeof mount, "%s%s", root, v2_mounts[i]) &&
            cgroup_walk(mount, cg, "memory.max", "memory.current", &limit, &limited, &usage)) {
            found = true;
            source = "cgroup v2";
        }
    }
    if (!found) {
        cgroup_path(root, false, cg, sizeof cg);
        if (path_fmt(mount, sizeof mount, "%s/sys/fs/cgroup/memory", root) &&
            cgroup_walk(mount, cg, "memory.limit_in_bytes", "memory.usage_in_bytes", &limit,
                        &limited, &usage)) {
            found = true;
            source = "cgroup v1";
        }
    }
    /* A limit at or above the machine's memory (v1 writes 2^63 rounded to a page for
     * "none") is no limit: the machine's figures are the truth then. */
    if (found && limited && limit > 0 && limit < mi.total) {
        d->total_bytes = limit;
        d->used_bytes = usage < limit ? usage : limit;
        uint64_t left = limit - d->used_bytes;
        d->free_bytes = left < mi.avail ? left : mi.avail;
    } else {
        source = "meminfo";
        d->total_bytes = mi.total;
        d->free_bytes = mi.avail;
        d->used_bytes = mi.total - mi.avail;
    }
    snprintf(d->source, sizeof d->source, "%s", source);
    d->budget_bytes = budget_of(d->total_bytes, frac);
    d->util_percent = -1;
    return SP_OK;
}

/* ---- NVML ------------------------------------------------------------------- */

static void
nvml_unload(sp_nvml_t *nv)
{
    if (nv->lib != NULL) {
        if (nv->shutdown != NULL) {
            nv->shutdown();
        }
        dlclose(nv->lib);
    }
    memset(nv, 0, sizeof *nv);
}

/* dlsym into a function pointer without the object/function pointer cast. */
static bool
sym(void *lib, const char *name, void *fnptr, size_t size)
{
    void *p = dlsym(lib, name);
    if (p == NULL) {
        return false;
    }
    memcpy(fnptr, &p, size);
    return true;
}

#define SYM(nv, field, name) sym((nv)->lib, name, &(nv)->field, sizeof (nv)->field)

static const char *
nvml_err(const sp_nvml_t *nv, int rc, char *buf, size_t len)
{
    const char *s = nv->error_string != NULL ? nv->error_string(rc) : NULL;
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s (%d)", s != NULL ? s : "error", rc);
    copy_printable(buf, len, tmp);
    return buf;
}

/* Load and initialise NVML; false with devs->note set when that is impossible. */
static bool
nvml_load(sp_devices_t *devs, const char *lib_name)
{
    sp_nvml_t *nv = &devs->nvml;
    memset(nv, 0, sizeof *nv);
    nv->lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL);
    if (nv->lib == NULL) {
        const char *e = dlerror();
        char tmp[256];
        snprintf(tmp, sizeof tmp, "no NVML, CPU only: %s", e != NULL ? e : lib_name);
        copy_printable(devs->note, sizeof devs->note, tmp);
        return false;
    }
    const char *missing = NULL;
    if (!SYM(nv, init, "nvmlInit_v2")) missing = "nvmlInit_v2";
    else if (!SYM(nv, shutdown, "nvmlShutdown")) missing = "nvmlShutdown";
    else if (!SYM(nv, get_count, "nvmlDeviceGetCount_v2")) missing = "nvmlDeviceGetCount_v2";
    else if (!SYM(nv, get_handle, "nvmlDeviceGetHandleByIndex_v2")) missing = "nvmlDeviceGetHandleByIndex_v2";
    else if (!SYM(nv, get_name, "nvmlDeviceGetName")) missing = "nvmlDeviceGetName";
    else if (!SYM(nv, get_uuid, "nvmlDeviceGetUUID")) missing = "nvmlDeviceGetUUID";
    else if (!SYM(nv, get_memory, "nvmlDeviceGetMemoryInfo")) missing = "nvmlDeviceGetMemoryInfo";
    if (missing != NULL) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "NVML unusable, CPU only: %s has no %s", lib_name, missing);
        copy_printable(devs->note, sizeof devs->note, tmp);
        nv->shutdown = NULL; /* never initialised */
        nvml_unload(nv);
        return false;
    }
    SYM(nv, error_string, "nvmlErrorString");
    SYM(nv, get_util, "nvmlDeviceGetUtilizationRates");
    /* MIG needs all three; a driver without them has no MIG. */
    if (!SYM(nv, get_mig_mode, "nvmlDeviceGetMigMode") ||
        !SYM(nv, get_max_mig, "nvmlDeviceGetMaxMigDeviceCount") ||
        !SYM(nv, get_mig_handle, "nvmlDeviceGetMigDeviceHandleByIndex")) {
        nv->get_mig_mode = NULL;
    }
    int rc = nv->init();
    if (rc != SP_NVML_SUCCESS) {
        char e[128], tmp[256];
        snprintf(tmp, sizeof tmp, "NVML init failed, CPU only: %s", nvml_err(nv, rc, e, sizeof e));
        copy_printable(devs->note, sizeof devs->note, tmp);
        nv->shutdown = NULL;
        nvml_unload(nv);
        return false;
    }
    return true;
}

/* used/free/utilisation of one GPU or MIG instance; false when NVML refuses. */
static bool
nvml_read(const sp_nvml_t *nv, sp_nvml_dev_t h, sp_device_info_t *d)
{
    sp_nvml_memory_t m = {0, 0, 0};
    if (nv->get_memory(h, &m) != SP_NVML_SUCCESS) {
        return false;
    }
    d->total_bytes = m.total;
    d->used_bytes = m.used < m.total ? m.used : m.total;
    d->free_bytes = m.free < m.total ? m.free : m.total - d->used_bytes;
    d->util_percent = -1;
    sp_nvml_util_t u;
    if (nv->get_util != NULL && nv->get_util(h, &u) == SP_NVML_SUCCESS && u.gpu <= 100) {
        d->util_percent = (int)u.gpu;
    }
    return true;
}

/* Candidate devices found through NVML, before CUDA_VISIBLE_DEVICES selects. */
typedef struct {
    sp_device_info_t info;
    sp_nvml_dev_t handle;
    int parent; /* candidate index of a MIG instance's GPU */
    bool taken;
} cand_t;

static bool
describe(const sp_nvml_t *nv, sp_nvml_dev_t h, sp_device_info_t *d)
{
    char buf[SP_NVML_UUID_LEN > SP_NVML_NAME_LEN ? SP_NVML_UUID_LEN : SP_NVML_NAME_LEN];
    memset(buf, 0, sizeof buf);
    if (nv->get_uuid(h, buf, sizeof buf - 1) != SP_NVML_SUCCESS || buf[0] == '\0') {
        return false;
    }
    copy_printable(d->id, sizeof d->id, buf);
    memset(buf, 0, sizeof buf);
    if (nv->get_name(h, buf, sizeof buf - 1) != SP_NVML_SUCCESS) {
        snprintf(buf, sizeof buf, "unknown GPU");
    }
    copy_printable(d->name, sizeof d->name, buf);
    snprintf(d->source, sizeof d->source, "nvml");
    return nvml_read(nv, h, d);
}

/* Every GPU, each followed by its MIG instances. Returns the number found (<= cap). */
static int
nvml_candidates(const sp_nvml_t *nv, cand_t *c, int cap, char *note, size_t note_len)
{
    unsigned int count = 0;
    int rc = nv->get_count(&count);
    if (rc != SP_NVML_SUCCESS) {
        char e[128];
        snprintf(note, note_len, "NVML device count failed: %s", nvml_err(nv, rc, e, sizeof e));
        return 0;
    }
    if (count > SP_DEVICE_MAX_GPUS) {
        snprintf(note, note_len, "NVML reports %u GPUs (more than %d): ignored", count,
                 SP_DEVICE_MAX_GPUS);
        return 0;
    }
    int n = 0;
    for (unsigned int g = 0; g < count && n < cap; g++) {
        sp_nvml_dev_t h = NULL;
        if (nv->get_handle(g, &h) != SP_NVML_SUCCESS || h == NULL) {
            continue; /* a GPU we may not see (permissions, fallen off the bus) */
        }
        cand_t *gc = &c[n];
        memset(gc, 0, sizeof *gc);
        gc->info.kind = SP_DEVICE_GPU;
        gc->info.nvml_index = (int)g;
        gc->info.mig_slot = -1;
        gc->parent = -1;
        gc->handle = h;
        if (!describe(nv, h, &gc->info)) {
            continue;
        }
        int gi = n++;
        unsigned int cur = 0, pending = 0, max_mig = 0;
        if (nv->get_mig_mode == NULL || nv->get_mig_mode(h, &cur, &pending) != SP_NVML_SUCCESS ||
            cur != SP_NVML_MIG_ENABLE) {
            continue;
        }
        c[gi].info.mig_enabled = true;
        if (nv->get_max_mig(h, &max_mig) != SP_NVML_SUCCESS) {
            continue;
        }
        if (max_mig > SP_DEVICE_MAX_MIG) {
            max_mig = SP_DEVICE_MAX_MIG;
        }
        for (unsigned int m = 0; m < max_mig && n < cap; m++) {
            sp_nvml_dev_t mh = NULL;
            if (nv->get_mig_handle(h, m, &mh) != SP_NVML_SUCCESS || mh == NULL) {
                continue; /* an empty slot */
            }
            cand_t *mc = &c[n];
            memset(mc, 0, sizeof *mc);
            mc->info.kind = SP_DEVICE_MIG;
            mc->info.nvml_index = (int)g;
            mc->info.mig_slot = (int)m;
            mc->parent = gi;
            mc->handle = mh;
            if (describe(nv, mh, &mc->info)) {
                n++;
            }
        }
    }
    return n;
}

/* The candidate a CUDA_VISIBLE_DEVICES entry names, or -1. */
static int
match_entry(const cand_t *c, int n, const char *e)
{
    if (isdigit((unsigned char)e[0])) {
        char *end;
        errno = 0;
        long v = strtol(e, &end, 10);
        if (errno != 0 || *end != '\0') {
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (c[i].info.kind == SP_DEVICE_GPU && c[i].info.nvml_index == v) {
                return i;
            }
        }
        return -1;
    }
    bool gpu = strncmp(e, "GPU-", 4) == 0, mig = strncmp(e, "MIG-", 4) == 0;
    if ((!gpu && !mig) || e[4] == '\0') {
        return -1;
    }
    int found = -1;
    size_t len = strlen(e);
    for (int i = 0; i < n; i++) {
        if (strncmp(c[i].info.id, e, len) == 0) {
            if (found >= 0) {
                return -1; /* an ambiguous prefix names nothing */
            }
            found = i;
        }
    }
    return found;
}

static void
push(sp_devices_t *devs, const cand_t *c)
{
    if (devs->n < devs->cap) {
        devs->dev[devs->n] = c->info;
        devs->dev[devs->n].index = devs->n;
        devs->handle[devs->n] = c->handle;
        devs->n++;
    }
}

/* Take candidate i (a GPU brings its MIG instances, a MIG instance its GPU's row first). */
static void
take(sp_devices_t *devs, cand_t *c, int n, int i, int *cand_to_list)
{
    if (c[i].taken) {
        return;
    }
    if (c[i].info.kind == SP_DEVICE_MIG && !c[c[i].parent].taken) {
        /* The GPU row shows the whole card; it is split and runs nothing itself. */
        c[c[i].parent].taken = true;
        cand_to_list[c[i].parent] = devs->n;
        push(devs, &c[c[i].parent]);
    }
    c[i].taken = true;
    cand_to_list[i] = devs->n;
    push(devs, &c[i]);
    if (c[i].info.kind == SP_DEVICE_GPU && c[i].info.mig_enabled) {
        for (int j = 0; j < n; j++) {
            if (c[j].parent == i && !c[j].taken) {
                c[j].taken = true;
                cand_to_list[j] = devs->n;
                push(devs, &c[j]);
            }
        }
    }
}

static void
select_gpus(sp_devices_t *devs, cand_t *c, int n, const char *visible)
{
    int *cand_to_list = sp_calloc((size_t)(n > 0 ? n : 1), sizeof *cand_to_list);
    if (cand_to_list == NULL) {
        snprintf(devs->note, sizeof devs->note, "out of memory listing GPUs");
        return;
    }
    if (visible == NULL) {
        for (int i = 0; i < n; i++) {
            take(devs, c, n, i, cand_to_list);
        }
    } else {
        char list[1024];
        snprintf(list, sizeof list, "%s", visible);
        char *save = NULL;
        for (char *e = strtok_r(list, ",", &save); e != NULL; e = strtok_r(NULL, ",", &save)) {
            while (*e == ' ' || *e == '\t') {
                e++;
            }
            e[strcspn(e, " \t\n")] = '\0';
            int i = match_entry(c, n, e);
            if (i < 0) {
                if (devs->note[0] == '\0' && strcmp(e, "-1") != 0 && e[0] != '\0') {
                    char tmp[256];
                    snprintf(tmp, sizeof tmp,
                             "CUDA_VISIBLE_DEVICES: '%.64s' names no device; the entries from it on "
                             "are ignored, as CUDA does", e);
                    copy_printable(devs->note, sizeof devs->note, tmp);
                }
                break; /* CUDA stops at the first invalid entry */
            }
            take(devs, c, n, i, cand_to_list);
        }
    }
    /* Parents by list index; CUDA ordinals in list order, skipping split GPUs
     * and every MIG instance after the first: a CUDA process enumerates one
     * MIG instance at most (NVIDIA's MIG guide, CUDA 11 and 12), however many
     * CUDA_VISIBLE_DEVICES names or the machine has. The others stay in the
     * list (their memory is still reported) with no ordinal, so nothing is
     * placed on a device CUDA would not open. */
    int ordinal = 0, migs = 0;
    const char *first_mig = NULL;
    for (int k = 1; k < devs->n; k++) {
        sp_device_info_t *d = &devs->dev[k];
        d->parent = -1;
        if (d->kind == SP_DEVICE_MIG) {
            for (int i = 0; i < n; i++) {
                if (c[i].handle == devs->handle[k] && c[i].parent >= 0 && c[c[i].parent].taken) {
                    d->parent = cand_to_list[c[i].parent];
                }
            }
            if (migs++ > 0) {
                d->ordinal = -1;
                continue;
            }
            first_mig = d->id;
        }
        d->ordinal = d->mig_enabled ? -1 : ordinal++;
    }
    if (migs > 1 && devs->note[0] == '\0') {
        char tmp[256];
        snprintf(tmp, sizeof tmp,
                 "%d MIG instances visible; a CUDA process uses one (%.60s): the others have no "
                 "CUDA ordinal (run one server per instance)", migs, first_mig);
        copy_printable(devs->note, sizeof devs->note, tmp);
    }
    sp_free(cand_to_list);
}

/* ---- the list ----------------------------------------------------------------- */

sp_status_t
sp_devices_open(const sp_device_opts_t *opts, sp_devices_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_device_opts_t o = opts != NULL ? *opts : (sp_device_opts_t){0};
    double frac = o.budget_fraction == 0 ? SP_DEVICE_BUDGET_DEFAULT : o.budget_fraction;
    if (!(frac > 0 && frac <= 1)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "devices: budget fraction %g is not in (0, 1]", frac);
    }
    const char *root = o.root != NULL ? o.root : "";
    if (strlen(root) >= 200) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "devices: root path too long");
    }
    sp_devices_t *devs = sp_calloc(1, sizeof *devs);
    if (devs == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "devices: out of memory");
    }
    devs->budget_fraction = frac;
    snprintf(devs->root, sizeof devs->root, "%s", root);
    devs->cap = 1 + SP_DEVICE_MAX_GPUS * (1 + SP_DEVICE_MAX_MIG);
    devs->dev = sp_calloc((size_t)devs->cap, sizeof *devs->dev);
    devs->handle = sp_calloc((size_t)devs->cap, sizeof *devs->handle);
    cand_t *cand = sp_calloc((size_t)devs->cap, sizeof *cand);
    if (devs->dev == NULL || devs->handle == NULL || cand == NULL) {
        sp_free(cand);
        sp_devices_close(devs);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "devices: out of memory");
    }

    sp_device_info_t *cpu = &devs->dev[0];
    cpu->kind = SP_DEVICE_CPU;
    cpu->ordinal = cpu->nvml_index = cpu->mig_slot = cpu->parent = -1;
    snprintf(cpu->id, sizeof cpu->id, "cpu");
    cpu_name(root, cpu->name, sizeof cpu->name);
    sp_status_t st = cpu_read(root, frac, cpu, err, err_len);
    if (st != SP_OK) {
        sp_free(cand);
        sp_devices_close(devs);
        return st;
    }
    devs->n = 1;

    const char *lib = o.nvml_lib != NULL ? o.nvml_lib : getenv("SAMPAN_NVML_LIB");
    if (lib == NULL) {
        lib = "libnvidia-ml.so.1";
    }
    if (lib[0] == '\0') {
        snprintf(devs->note, sizeof devs->note, "GPUs disabled (empty NVML library name)");
    } else if (nvml_load(devs, lib)) {
        int n = nvml_candidates(&devs->nvml, cand, devs->cap - 1, devs->note, sizeof devs->note);
        const char *visible = o.visible != NULL ? o.visible : getenv("CUDA_VISIBLE_DEVICES");
        select_gpus(devs, cand, n, visible);
        for (int k = 1; k < devs->n; k++) {
            devs->dev[k].budget_bytes = budget_of(devs->dev[k].total_bytes, frac);
        }
        if (n == 0 && devs->note[0] == '\0') {
            snprintf(devs->note, sizeof devs->note, "NVML found no GPU");
        }
    }
    sp_free(cand);
    *out = devs;
    return SP_OK;
}

sp_status_t
sp_devices_refresh(sp_devices_t *devs, char *err, size_t err_len)
{
    sp_status_t st = cpu_read(devs->root, devs->budget_fraction, &devs->dev[0], err, err_len);
    if (st != SP_OK) {
        return st;
    }
    for (int k = 1; k < devs->n; k++) {
        sp_device_info_t *d = &devs->dev[k];
        uint64_t total = d->total_bytes;
        if (devs->nvml.lib == NULL || !nvml_read(&devs->nvml, devs->handle[k], d)) {
            return sp_errf(err, err_len, SP_ERR_DEVICE, "devices: NVML cannot read %s", d->id);
        }
        d->total_bytes = total; /* the list's shape and budgets do not move */
        if (d->used_bytes > total) {
            d->used_bytes = total;
        }
        if (d->free_bytes > total - d->used_bytes) {
            d->free_bytes = total - d->used_bytes;
        }
    }
    return SP_OK;
}

void
sp_devices_close(sp_devices_t *devs)
{
    if (devs == NULL) {
        return;
    }
    nvml_unload(&devs->nvml);
    sp_free(devs->dev);
    sp_free(devs->handle);
    sp_free(devs);
}

int
sp_devices_count(const sp_devices_t *devs)
{
    return devs->n;
}

const sp_device_info_t *
sp_devices_get(const sp_devices_t *devs, int i)
{
    return i >= 0 && i < devs->n ? &devs->dev[i] : NULL;
}

const char *
sp_devices_note(const sp_devices_t *devs)
{
    return devs->note;
}

double
sp_devices_budget_fraction(const sp_devices_t *devs)
{
    return devs->budget_fraction;
}

int
sp_devices_find(const sp_devices_t *devs, const char *spec)
{
    if (strcmp(spec, "cpu") == 0) {
        return 0;
    }
    const char *num = NULL;
    if (strncmp(spec, "cuda:", 5) == 0) {
        num = spec + 5;
    } else if (strncmp(spec, "gpu:", 4) == 0) {
        num = spec + 4;
    }
    if (num != NULL) {
        uint64_t v;
        if (!parse_u64(num, &v) || strchr(num, ' ') != NULL) {
            return -1;
        }
        for (int k = 1; k < devs->n; k++) {
            if (devs->dev[k].ordinal >= 0 && (uint64_t)devs->dev[k].ordinal == v) {
                return k;
            }
        }
        return -1;
    }
    if ((strncmp(spec, "GPU-", 4) != 0 && strncmp(spec, "MIG-", 4) != 0) || spec[4] == '\0') {
        return -1;
    }
    int found = -1;
    for (int k = 1; k < devs->n; k++) {
        if (strncmp(devs->dev[k].id, spec, strlen(spec)) == 0) {
            if (found >= 0) {
                return -1;
            }
            found = k;
        }
    }
    return found;
}

const char *
sp_device_kind_name(sp_device_kind_t kind)
{
    switch (kind) {
    case SP_DEVICE_CPU: return "cpu";
    case SP_DEVICE_GPU: return "gpu";
    case SP_DEVICE_MIG: return "mig";
    }
    return "?";
}
