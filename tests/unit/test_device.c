/*
 * test_device.c - the device layer: CPU memory from fake /proc and /sys trees
 * (cgroup v2 limit, v2 "max", v1, none), and GPUs from the fake NVML library the
 * Makefile builds next to test_unit ($(BUILD)/libfake_nvml*.so): two GPUs, one
 * split into two MIG instances, CUDA_VISIBLE_DEVICES by index and by UUID, a
 * missing library, a library missing a symbol, and an init failure; one CUDA
 * ordinal for the first MIG instance only; and the hand-declared NVML ABI
 * (device/nvml_abi.h) against Debian's Rust bindings of nvml.h when installed.
 */
#include "test.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/device.h"
#include "device/nvml_abi.h"

#define GIB (1024ull * 1024 * 1024)
#define MIB (1024ull * 1024)

/* Write root/rel (creating its directories). */
static void
put(const char *root, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                SP_TEST_FAIL("mkdir %s: %s", path, strerror(errno));
            }
            *p = '/';
        }
    }
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* A fake root with 16 GiB MemTotal and 12 GiB MemAvailable. */
static const char *
fake_root(const char *name)
{
    static char root[512];
    snprintf(root, sizeof root, "%s/%s", sp_test_tmpdir(), name);
    mkdir(root, 0755);
    put(root, "proc/meminfo",
        "MemTotal:       16777216 kB\nMemFree:         1048576 kB\n"
        "MemAvailable:   12582912 kB\nBuffers:          100 kB\n");
    put(root, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Test CPU \x1b[31m 9000\n");
    return root;
}

static sp_devices_t *
open_cpu_only(const char *root)
{
    sp_device_opts_t o = {.root = root, .nvml_lib = ""};
    sp_devices_t *devs = NULL;
    char err[256];
    sp_status_t st = sp_devices_open(&o, &devs, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("sp_devices_open: %s", err);
    }
    ASSERT_EQ(sp_devices_count(devs), 1);
    return devs;
}

TEST(device_cpu_meminfo)
{
    const char *root = fake_root("none");
    sp_devices_t *devs = open_cpu_only(root);
    const sp_device_info_t *d = sp_devices_get(devs, 0);
    ASSERT_EQ(d->kind, SP_DEVICE_CPU);
    ASSERT_STR_EQ(d->id, "cpu");
    ASSERT_STR_EQ(d->source, "meminfo");
    ASSERT_EQ(d->total_bytes, 16 * GIB);
    ASSERT_EQ(d->free_bytes, 12 * GIB);
    ASSERT_EQ(d->used_bytes, 4 * GIB);
    ASSERT_EQ(d->budget_bytes, (uint64_t)(16 * GIB * 0.8));
    ASSERT(strstr(d->name, "Test CPU ?[31m 9000") == d->name); /* escape byte made printable */
    ASSERT(sp_devices_get(devs, 1) == NULL);
    ASSERT(sp_devices_get(devs, -1) == NULL);
    sp_devices_close(devs);
}

TEST(device_cpu_cgroup_v2_limit)
{
    const char *root = fake_root("v2");
    put(root, "proc/self/cgroup", "0::/app/worker\n");
    put(root, "sys/fs/cgroup/memory.max", "max\n");           /* root: none */
    put(root, "sys/fs/cgroup/app/memory.max", "4294967296\n"); /* parent: 4 GiB */
    put(root, "sys/fs/cgroup/app/worker/memory.max", "max\n");
    put(root, "sys/fs/cgroup/app/worker/memory.current", "1073741824\n");
    sp_devices_t *devs = open_cpu_only(root);
    const sp_device_info_t *d = sp_devices_get(devs, 0);
    ASSERT_STR_EQ(d->source, "cgroup v2");
    ASSERT_EQ(d->total_bytes, 4 * GIB);
    ASSERT_EQ(d->used_bytes, 1 * GIB);
    ASSERT_EQ(d->free_bytes, 3 * GIB);
    ASSERT_EQ(d->budget_bytes, (uint64_t)(4 * GIB * 0.8));
    sp_devices_close(devs);

    /* The limit tightens; free is also capped by MemAvailable. */
    put(root, "sys/fs/cgroup/app/worker/memory.max", "2147483648\n");
    put(root, "sys/fs/cgroup/app/worker/memory.current", "0\n");
    put(root, "proc/meminfo", "MemTotal: 16777216 kB\nMemAvailable: 1048576 kB\n");
    devs = open_cpu_only(root);
    d = sp_devices_get(devs, 0);
    ASSERT_EQ(d->total_bytes, 2 * GIB);
    ASSERT_EQ(d->free_bytes, 1 * GIB);
    sp_devices_close(devs);
}

TEST(device_cpu_cgroup_v2_max_and_namespace)
{
    /* A cgroup namespace: /proc/self/cgroup says "/" and the mount is our own cgroup. */
    const char *root = fake_root("v2max");
    put(root, "proc/self/cgroup", "0::/\n");
    put(root, "sys/fs/cgroup/memory.max", "max\n");
    put(root, "sys/fs/cgroup/memory.current", "123\n");
    sp_devices_t *devs = open_cpu_only(root);
    ASSERT_STR_EQ(sp_devices_get(devs, 0)->source, "meminfo");
    ASSERT_EQ(sp_devices_get(devs, 0)->total_bytes, 16 * GIB);
    sp_devices_close(devs);

    /* The path in /proc/self/cgroup is absent from the mount (namespaced): read the mount. */
    put(root, "proc/self/cgroup", "0::/not/here\n");
    put(root, "sys/fs/cgroup/memory.max", "536870912\n");
    devs = open_cpu_only(root);
    ASSERT_STR_EQ(sp_devices_get(devs, 0)->source, "cgroup v2");
    ASSERT_EQ(sp_devices_get(devs, 0)->total_bytes, 512 * MIB);
    ASSERT_EQ(sp_devices_get(devs, 0)->used_bytes, 123);
    sp_devices_close(devs);

    /* A limit above the machine's memory is no limit; junk is no limit. */
    put(root, "sys/fs/cgroup/memory.max", "99999999999999999\n");
    devs = open_cpu_only(root);
    ASSERT_STR_EQ(sp_devices_get(devs, 0)->source, "meminfo");
    sp_devices_close(devs);
    put(root, "sys/fs/cgroup/memory.max", "12abc\n");
    devs = open_cpu_only(root);
    ASSERT_STR_EQ(sp_devices_get(devs, 0)->source, "meminfo");
    sp_devices_close(devs);
}

TEST(device_cpu_cgroup_v1)
{
    /* The hybrid layout: v2 at .../unified without memory files, v1 memory controller. */
    const char *root = fake_root("v1");
    put(root, "proc/self/cgroup", "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n");
    put(root, "sys/fs/cgroup/unified/cgroup.procs", "1\n");
    put(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put(root, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "8589934592\n");
    put(root, "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "2147483648\n");
    sp_devices_t *devs = open_cpu_only(root);
    const sp_device_info_t *d = sp_devices_get(devs, 0);
    ASSERT_STR_EQ(d->source, "cgroup v1");
    ASSERT_EQ(d->total_bytes, 8 * GIB);
    ASSERT_EQ(d->used_bytes, 2 * GIB);
    ASSERT_EQ(d->free_bytes, 6 * GIB);
    sp_devices_close(devs);

    /* v1 with the "unlimited" value only. */
    put(root, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
    devs = open_cpu_only(root);
    ASSERT_STR_EQ(sp_devices_get(devs, 0)->source, "meminfo");
    sp_devices_close(devs);

    /* A path that tries to climb out of the mount is ignored. */
    put(root, "proc/self/cgroup", "4:memory:/../../etc\n");
    devs = open_cpu_only(root);
    ASSERT_STR_EQ(sp_devices_get(devs, 0)->source, "meminfo");
    sp_devices_close(devs);
}

TEST(device_bad_input)
{
    char err[256] = "";
    sp_devices_t *devs = (sp_devices_t *)1;
    sp_device_opts_t o = {.root = "/nonexistent-sampan-root", .nvml_lib = ""};
    ASSERT_EQ(sp_devices_open(&o, &devs, err, sizeof err), SP_ERR_IO);
    ASSERT(devs == NULL);
    ASSERT(strstr(err, "/nonexistent-sampan-root/proc/meminfo") != NULL);

    const char *root = fake_root("bad");
    put(root, "proc/meminfo", "MemFree: 12 kB\n");
    o.root = root;
    ASSERT_EQ(sp_devices_open(&o, &devs, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(strstr(err, "MemTotal") != NULL);

    o.budget_fraction = 1.5;
    ASSERT_EQ(sp_devices_open(&o, &devs, err, sizeof err), SP_ERR_INVALID);
    o.budget_fraction = -0.1;
    ASSERT_EQ(sp_devices_open(&o, &devs, err, sizeof err), SP_ERR_INVALID);
    sp_devices_close(NULL);
}

/* ---- GPUs through the fake NVML ---------------------------------------------- */

/* $(BUILD)/<name>, found beside the running test_unit; SKIP when not built. */
static const char *
fake_lib(const char *name)
{
    static char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
    ASSERT(n > 0);
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    ASSERT(slash != NULL);
    snprintf(slash + 1, 64, "%s", name);
    if (access(path, R_OK) != 0) {
        SKIP("%s not built (make unit builds it)", path);
    }
    return path;
}

static sp_devices_t *
open_gpu(const char *lib, const char *visible, double frac)
{
    sp_device_opts_t o = {.root = fake_root("gpu"), .nvml_lib = lib, .visible = visible,
                          .budget_fraction = frac};
    sp_devices_t *devs = NULL;
    char err[256];
    if (sp_devices_open(&o, &devs, err, sizeof err) != SP_OK) {
        SP_TEST_FAIL("sp_devices_open: %s", err);
    }
    return devs;
}

TEST(device_nvml_all)
{
    unsetenv("CUDA_VISIBLE_DEVICES");
    sp_devices_t *devs = open_gpu(fake_lib("libfake_nvml.so"), NULL, 0.5);
    ASSERT(strstr(sp_devices_note(devs), "2 MIG instances visible") != NULL);
    ASSERT_EQ(sp_devices_count(devs), 5);
    const sp_device_info_t *g0 = sp_devices_get(devs, 1), *g1 = sp_devices_get(devs, 2);
    const sp_device_info_t *m0 = sp_devices_get(devs, 3), *m1 = sp_devices_get(devs, 4);
    ASSERT_EQ(g0->kind, SP_DEVICE_GPU);
    ASSERT_STR_EQ(g0->name, "Fake H100 80GB");
    ASSERT_STR_EQ(g0->id, "GPU-11111111-2222-3333-4444-555555555555");
    ASSERT_EQ(g0->total_bytes, 80 * GIB);
    ASSERT_EQ(g0->budget_bytes, 40 * GIB);
    ASSERT_EQ(g0->used_bytes, 1 * GIB);
    ASSERT_EQ(g0->free_bytes, 79 * GIB);
    ASSERT_EQ(g0->util_percent, 37);
    ASSERT_EQ(g0->ordinal, 0);
    ASSERT(!g0->mig_enabled);
    ASSERT_EQ(g1->kind, SP_DEVICE_GPU);
    ASSERT(g1->mig_enabled);
    ASSERT_EQ(g1->ordinal, -1);
    ASSERT_EQ(m0->kind, SP_DEVICE_MIG);
    ASSERT_STR_EQ(m0->id, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001");
    ASSERT_EQ(m0->total_bytes, 20 * GIB);
    ASSERT_EQ(m0->used_bytes, 3 * GIB);
    ASSERT_EQ(m0->util_percent, -1);
    ASSERT_EQ(m0->parent, 2);
    ASSERT_EQ(m0->mig_slot, 0);
    ASSERT_EQ(m0->ordinal, 1);
    ASSERT_EQ(m1->mig_slot, 2); /* slot 1 is empty */
    ASSERT_EQ(m1->ordinal, -1); /* a CUDA process opens one MIG instance: the first */
    ASSERT_EQ(m1->nvml_index, 1);
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(sp_devices_get(devs, i)->index, i);
    }

    ASSERT_EQ(sp_devices_find(devs, "cpu"), 0);
    ASSERT_EQ(sp_devices_find(devs, "cuda:0"), 1);
    ASSERT_EQ(sp_devices_find(devs, "gpu:1"), 3);
    ASSERT_EQ(sp_devices_find(devs, "gpu:2"), -1);
    ASSERT_EQ(sp_devices_find(devs, "cuda:x"), -1);
    ASSERT_EQ(sp_devices_find(devs, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000002"), 4);
    ASSERT_EQ(sp_devices_find(devs, "MIG-aaaa"), -1); /* ambiguous */
    ASSERT_EQ(sp_devices_find(devs, "GPU-6666"), 2);
    ASSERT_EQ(sp_devices_find(devs, "GPU-"), -1);

    /* Refresh sees new figures from the same handles. */
    setenv("FAKE_NVML_USED_MIB", "10240", 1);
    char err[256];
    ASSERT_OK(sp_devices_refresh(devs, err, sizeof err));
    ASSERT_EQ(g0->used_bytes, 10 * GIB);
    ASSERT_EQ(g0->free_bytes, 70 * GIB);
    ASSERT_EQ(g0->total_bytes, 80 * GIB);
    unsetenv("FAKE_NVML_USED_MIB");
    sp_devices_close(devs);
}

TEST(device_nvml_env_lib)
{
    /* The library name from SAMPAN_NVML_LIB, the selection from CUDA_VISIBLE_DEVICES. */
    setenv("SAMPAN_NVML_LIB", fake_lib("libfake_nvml.so"), 1);
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    sp_devices_t *devs = open_gpu(NULL, NULL, 0);
    ASSERT_EQ(sp_devices_count(devs), 2);
    ASSERT_STR_EQ(sp_devices_get(devs, 1)->name, "Fake H100 80GB");
    ASSERT_EQ(sp_devices_get(devs, 1)->budget_bytes, (uint64_t)(80 * GIB * 0.8));
    sp_devices_close(devs);
    unsetenv("SAMPAN_NVML_LIB");
    unsetenv("CUDA_VISIBLE_DEVICES");
}

TEST(device_nvml_visible)
{
    const char *lib = fake_lib("libfake_nvml.so");
    /* By index, reordered: GPU 1 (split, with its instances) then GPU 0. */
    sp_devices_t *devs = open_gpu(lib, "1,0", 0);
    ASSERT_EQ(sp_devices_count(devs), 5);
    ASSERT(sp_devices_get(devs, 1)->mig_enabled);
    ASSERT_EQ(sp_devices_get(devs, 2)->ordinal, 0);
    ASSERT_EQ(sp_devices_get(devs, 2)->kind, SP_DEVICE_MIG);
    ASSERT_EQ(sp_devices_get(devs, 3)->ordinal, -1); /* the second MIG instance */
    ASSERT_EQ(sp_devices_get(devs, 4)->ordinal, 1);
    ASSERT_STR_EQ(sp_devices_get(devs, 4)->name, "Fake H100 80GB");
    sp_devices_close(devs);

    /* One MIG instance by UUID: its GPU row (not a CUDA device) and the instance. */
    devs = open_gpu(lib, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000002", 0);
    ASSERT_EQ(sp_devices_count(devs), 3);
    ASSERT(sp_devices_get(devs, 1)->mig_enabled);
    ASSERT_STR_EQ(sp_devices_get(devs, 2)->id, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000002");
    ASSERT_EQ(sp_devices_get(devs, 2)->ordinal, 0);
    ASSERT_EQ(sp_devices_get(devs, 2)->parent, 1);
    ASSERT_EQ(sp_devices_find(devs, "cuda:0"), 2);
    ASSERT_STR_EQ(sp_devices_note(devs), "");
    sp_devices_close(devs);

    /* GPU UUID prefix, spaces, a duplicate, then an invalid entry that ends the list. */
    devs = open_gpu(lib, " GPU-1111 , 0 ,7,1", 0);
    ASSERT_EQ(sp_devices_count(devs), 2);
    ASSERT_STR_EQ(sp_devices_get(devs, 1)->name, "Fake H100 80GB");
    ASSERT(strstr(sp_devices_note(devs), "'7' names no device") != NULL);
    sp_devices_close(devs);

    /* Empty and -1 hide every GPU; junk too. */
    const char *none[] = {"", "-1", "nonsense", "GPU-", "MIG-ffff", "99999999999999999999"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        devs = open_gpu(lib, none[i], 0);
        ASSERT_EQ(sp_devices_count(devs), 1);
        sp_devices_close(devs);
    }
}

/* Several MIG UUIDs in CUDA_VISIBLE_DEVICES: CUDA enumerates only the first
 * MIG instance, so only it gets an ordinal; the others are listed (their
 * memory counts) but nothing can be placed on them, and the note says why.
 * A whole GPU named after the instance keeps the next ordinal. */
TEST(device_nvml_mig_one_per_process)
{
    const char *lib = fake_lib("libfake_nvml.so");
    sp_devices_t *devs = open_gpu(lib, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000002,"
                                       "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001,0", 0);
    ASSERT_EQ(sp_devices_count(devs), 5);
    const sp_device_info_t *g1 = sp_devices_get(devs, 1), *a = sp_devices_get(devs, 2);
    const sp_device_info_t *b = sp_devices_get(devs, 3), *g0 = sp_devices_get(devs, 4);
    ASSERT(g1->mig_enabled && g1->ordinal == -1);
    ASSERT_STR_EQ(a->id, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000002");
    ASSERT_EQ(a->ordinal, 0);
    ASSERT_STR_EQ(b->id, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001");
    ASSERT_EQ(b->ordinal, -1);
    ASSERT_EQ(b->parent, 1);
    ASSERT_EQ(b->total_bytes, 20 * GIB); /* still listed with its memory */
    ASSERT_STR_EQ(g0->name, "Fake H100 80GB");
    ASSERT_EQ(g0->ordinal, 1);
    ASSERT_EQ(sp_devices_find(devs, "cuda:0"), 2);
    ASSERT_EQ(sp_devices_find(devs, "cuda:1"), 4);
    ASSERT_EQ(sp_devices_find(devs, "cuda:2"), -1);
    ASSERT_EQ(sp_devices_find(devs, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001"), 3);
    const char *note = sp_devices_note(devs);
    ASSERT(strstr(note, "2 MIG instances visible") != NULL);
    ASSERT(strstr(note, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000002") != NULL);
    sp_devices_close(devs);

    /* The GPU first, then one instance: the instance is CUDA device 1. */
    devs = open_gpu(lib, "0,MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001", 0);
    ASSERT_EQ(sp_devices_count(devs), 4);
    ASSERT_EQ(sp_devices_find(devs, "cuda:0"), 1);
    ASSERT_EQ(sp_devices_find(devs, "cuda:1"), 3);
    ASSERT_STR_EQ(sp_devices_note(devs), "");
    sp_devices_close(devs);
}

/* The hand declarations of device/nvml_abi.h against Debian's Rust bindings
 * of nvml.h (librust-nvml-wrapper-sys-dev, generated by bindgen from
 * NVIDIA's header): the two structs' fields in order and type, the
 * constants, and the parameter types of every function device.c loads. */
static char *
read_bindings(void)
{
    static const char *const paths[] = {
        "/usr/share/cargo/registry/nvml-wrapper-sys-0.7.0/src/bindings.rs",
        "/usr/share/cargo/registry/nvml-wrapper-sys-0.8.0/src/bindings.rs",
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        FILE *f = fopen(paths[i], "r");
        if (f == NULL) {
            continue;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = malloc((size_t)n + 1);
        ASSERT(buf != NULL && fread(buf, 1, (size_t)n, f) == (size_t)n);
        buf[n] = '\0';
        fclose(f);
        return buf;
    }
    return NULL;
}

/* The parameter types of `pub unsafe fn NAME(&self, a: T1, b: T2, ) -> R`
 * joined by ", " (names dropped), and R. */
static void
rust_sig(const char *text, const char *name, char *params, size_t cap, char *ret, size_t ret_cap)
{
    char key[128];
    snprintf(key, sizeof key, "pub unsafe fn %s(", name);
    const char *p = strstr(text, key);
    ASSERT(p != NULL);
    p += strlen(key);
    const char *close = strstr(p, ") ->");
    const char *close_void = strstr(p, ")");
    params[0] = '\0';
    const char *end = close != NULL && close == close_void ? close : close_void;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        const char *colon = memchr(p, ':', (size_t)(stop - p));
        if (colon != NULL) {
            const char *t = colon + 1;
            while (*t == ' ') t++;
            size_t l = strlen(params);
            snprintf(params + l, cap - l, "%s%.*s", l ? ", " : "", (int)(stop - t), t);
        }
        p = stop + 1;
    }
    ret[0] = '\0';
    if (end == close) {
        const char *r = close + 4;
        while (*r == ' ') r++;
        snprintf(ret, ret_cap, "%.*s", (int)strcspn(r, " {\n"), r);
    }
}

TEST(device_nvml_abi_matches_bindings)
{
    char *b = read_bindings();
    if (b == NULL) {
        SKIP("librust-nvml-wrapper-sys-dev is not installed (scripts/deps.sh --test)");
    }
    ASSERT(strstr(b, "pub struct nvmlMemory_st {\n    pub total: raw::c_ulonglong,\n"
                     "    pub free: raw::c_ulonglong,\n    pub used: raw::c_ulonglong,\n}") != NULL);
    ASSERT(offsetof(sp_nvml_memory_t, total) == 0 && offsetof(sp_nvml_memory_t, free) == 8 &&
           offsetof(sp_nvml_memory_t, used) == 16 && sizeof(sp_nvml_memory_t) == 24);
    ASSERT(strstr(b, "pub struct nvmlUtilization_st {\n    pub gpu: raw::c_uint,\n"
                     "    pub memory: raw::c_uint,\n}") != NULL);
    ASSERT(offsetof(sp_nvml_util_t, gpu) == 0 && offsetof(sp_nvml_util_t, memory) == 4 &&
           sizeof(sp_nvml_util_t) == 8);
    char want[160];
    snprintf(want, sizeof want, "pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: u32 = %d;", SP_NVML_UUID_LEN);
    ASSERT(strstr(b, want) != NULL);
    snprintf(want, sizeof want, "pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: u32 = %d;", SP_NVML_NAME_LEN);
    ASSERT(strstr(b, want) != NULL);
    snprintf(want, sizeof want, "pub const NVML_DEVICE_MIG_ENABLE: u32 = %d;", SP_NVML_MIG_ENABLE);
    ASSERT(strstr(b, want) != NULL);
    snprintf(want, sizeof want, "NVML_SUCCESS: nvmlReturn_enum = %d;", SP_NVML_SUCCESS);
    ASSERT(strstr(b, want) != NULL);
    snprintf(want, sizeof want, "NVML_ERROR_NOT_FOUND: nvmlReturn_enum = %d;", SP_NVML_ERROR_NOT_FOUND);
    ASSERT(strstr(b, want) != NULL);
    /* nvmlReturn_t is a C enum of non-negative values: an int-sized return. */
    ASSERT(strstr(b, "pub type nvmlReturn_enum = raw::c_uint;") != NULL);
    ASSERT(strstr(b, "pub type nvmlDevice_t = *mut nvmlDevice_st;") != NULL);
    /* device.c's function pointer types, as the bindings spell them. */
    static const char *const sigs[][2] = {
        {"nvmlInit_v2", ""},
        {"nvmlShutdown", ""},
        {"nvmlDeviceGetCount_v2", "*mut raw::c_uint"},
        {"nvmlDeviceGetHandleByIndex_v2", "raw::c_uint, *mut nvmlDevice_t"},
        {"nvmlDeviceGetName", "nvmlDevice_t, *mut raw::c_char, raw::c_uint"},
        {"nvmlDeviceGetUUID", "nvmlDevice_t, *mut raw::c_char, raw::c_uint"},
        {"nvmlDeviceGetMemoryInfo", "nvmlDevice_t, *mut nvmlMemory_t"},
        {"nvmlDeviceGetUtilizationRates", "nvmlDevice_t, *mut nvmlUtilization_t"},
        {"nvmlDeviceGetMigMode", "nvmlDevice_t, *mut raw::c_uint, *mut raw::c_uint"},
        {"nvmlDeviceGetMaxMigDeviceCount", "nvmlDevice_t, *mut raw::c_uint"},
        {"nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDevice_t, raw::c_uint, *mut nvmlDevice_t"},
    };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        char params[256], ret[64];
        rust_sig(b, sigs[i][0], params, sizeof params, ret, sizeof ret);
        if (strcmp(params, sigs[i][1]) != 0 || strcmp(ret, "nvmlReturn_t") != 0) {
            SP_TEST_FAIL("%s: bindings (%s) -> %s, Sampan (%s) -> int", sigs[i][0], params, ret,
                         sigs[i][1]);
        }
    }
    char params[256], ret[64];
    rust_sig(b, "nvmlErrorString", params, sizeof params, ret, sizeof ret);
    ASSERT_STR_EQ(params, "nvmlReturn_t");
    free(b);
}

TEST(device_nvml_failures)
{
    char err[256];
    /* No library: the CPU alone and a note. */
    sp_devices_t *devs = open_gpu("/nonexistent/libnvidia-ml.so.1", NULL, 0);
    ASSERT_EQ(sp_devices_count(devs), 1);
    ASSERT(strstr(sp_devices_note(devs), "no NVML") != NULL);
    ASSERT_OK(sp_devices_refresh(devs, err, sizeof err));
    sp_devices_close(devs);

    /* A library without nvmlDeviceGetMemoryInfo. */
    devs = open_gpu(fake_lib("libfake_nvml_nosym.so"), NULL, 0);
    ASSERT_EQ(sp_devices_count(devs), 1);
    ASSERT(strstr(sp_devices_note(devs), "nvmlDeviceGetMemoryInfo") != NULL);
    sp_devices_close(devs);

    /* A file that is not a library at all. */
    const char *root = fake_root("notlib");
    put(root, "libjunk.so", "not an ELF file\n");
    char junk[600];
    snprintf(junk, sizeof junk, "%s/libjunk.so", root);
    devs = open_gpu(junk, NULL, 0);
    ASSERT_EQ(sp_devices_count(devs), 1);
    ASSERT(strstr(sp_devices_note(devs), "no NVML") != NULL);
    sp_devices_close(devs);

    /* nvmlInit_v2 fails. */
    const char *lib = fake_lib("libfake_nvml.so");
    setenv("FAKE_NVML_INIT_FAIL", "1", 1);
    devs = open_gpu(lib, NULL, 0);
    ASSERT_EQ(sp_devices_count(devs), 1);
    ASSERT(strstr(sp_devices_note(devs), "NVML init failed") != NULL);
    ASSERT(strstr(sp_devices_note(devs), "Driver Not Loaded") != NULL);
    sp_devices_close(devs);
    unsetenv("FAKE_NVML_INIT_FAIL");

    /* A bogus device count is refused, not allocated for. */
    setenv("FAKE_NVML_COUNT", "4000000000", 1);
    devs = open_gpu(lib, NULL, 0);
    ASSERT_EQ(sp_devices_count(devs), 1);
    ASSERT(strstr(sp_devices_note(devs), "4000000000") != NULL);
    sp_devices_close(devs);
    /* More GPUs claimed than handles given: the missing ones are skipped. */
    setenv("FAKE_NVML_COUNT", "5", 1);
    devs = open_gpu(lib, NULL, 0);
    ASSERT_EQ(sp_devices_count(devs), 5);
    sp_devices_close(devs);
    unsetenv("FAKE_NVML_COUNT");
}
