/*
 * fake_cuda.c - a host emulation of libsampan_cuda.so's op table (cuda_api.h),
 * built as libfake_cuda.so. "Device" memory is host memory and every op is a
 * plain loop with the semantics cuda_api.h states, indexing through
 * cuda_common.h like the kernels do.
 *
 * Why: no GPU in CI. With this library sampan's whole GPU path (the loader,
 * weight upload and dequantisation, the device KV pool, the forward pass of
 * src/engine/gpu.c, partial offload, error handling) runs on the CPU and is
 * compared with the CPU engine (tests/gpu/host_test.c); the kernel test
 * (tests/gpu/kernel_test.c) runs against it too, so the test itself is
 * checked before a GPU ever runs it.
 *
 * Fault injection (exported, found with dlsym): fake_cuda_fail_at(n) makes
 * the n-th op from now fail as a CUDA error would (sticky); fake_cuda_set_mem
 * caps the bytes alloc may hand out; fake_cuda_set_devices sets the device
 * count (0: device_count fails as without a driver); fake_cuda_set_abi makes
 * sp_cuda_get_api claim another ABI version (fake_cuda_set_struct_size: a
 * shorter table, as before members were appended); fake_cuda_fail_capture(1) makes
 * the next graph_end fail as a capture that cannot be instantiated.
 *
 * Graphs, emulated so that a test catches what a real graph would get wrong:
 * between graph_begin and graph_end an op is checked and RECORDED with its
 * arguments, not run; graph_launch REPLAYS the list through the same entry
 * points. So a forward pass that hands a captured op a per-step host value
 * (a row count, a position, a host pointer) replays the stale value, as a
 * CUDA graph would, and its results differ from the eager run. Stricter than
 * CUDA on purpose: every pointer a captured op takes must lie inside a live
 * allocation of the context (a host pointer in a graph is a bug even where
 * CUDA would accept it), and alloc, h2d, d2h and sync are refused while
 * capturing (they would break a real capture). fake_cuda_stats counts
 * captures, launches and the quantised ops, for tests that must know a
 * graph or gemv_q really ran.
 *
 * Pinned host memory: host_register records the range (pages, as CUDA pins
 * them: a range whose pages overlap a registered one is refused, as CUDA's
 * cudaErrorHostMemoryAlreadyRegistered); h2d and d2h count each copy as
 * pinned when its host range lies inside one registered range, else as
 * pageable, with the bytes each way (fake_cuda_copy_stats), so a test can
 * check that a step's copies are all pinned and how much a step downloads.
 * fake_cuda_pinned gives the bytes registered (a test checks they return to
 * 0); fake_cuda_fail_pin(n) makes the next n registrations fail as
 * exhausted pinned memory would.
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_api.h"
#include "cuda/cuda_common.h"
#include "sampan/status.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct hdr hdr_t;

/* One captured op: which, and its arguments by value (the structs too, as a
 * kernel launch copies them). */
enum { OP_D2D, OP_TO_F16, OP_EMBED, OP_ADD_RMSNORM, OP_GEMM, OP_ROPE_CS, OP_ROPE, OP_KV_WRITE,
       OP_ATTN, OP_SWIGLU, OP_SOFTMAX, OP_TOPK, OP_QSPLIT_TO_F16, OP_GEMV_Q, OP_HEAD_RMSNORM,
       OP_GELU_MUL, OP_SOFTCAP, OP_SCALE };

typedef struct rec {
    int op;
    void *p[6];
    int64_t i[6];
    float f, f2;
    double d;
    sp_cuda_kv_t kv;
    sp_cuda_rows_t rows;
} rec_t;

struct sp_cuda_graph {
    rec_t *recs;
    size_t n;
};

struct sp_cuda_ctx {
    int ordinal;
    int broken;
    char err[256];
    uint64_t used;
    hdr_t *live; /* every live allocation, freed with the context as cudaFree would */
    /* capture in progress */
    int capturing;
    int capture_bad; /* something in it cannot be captured: graph_end refuses */
    rec_t *recs;
    size_t n_recs, cap_recs;
};

static long fail_at = -1; /* ops until an injected failure; -1 = never */
static uint64_t mem_cap = UINT64_MAX;
static uint64_t mem_used;
static int n_devices = 1;
static uint32_t abi = SP_CUDA_ABI_VERSION;
static int fail_capture;
static long n_captures, n_launches, n_gemv_q, n_qsplit;

/* Registered host ranges (process-wide, as CUDA's). */
#define FAKE_PAGE 4096u
#define MAX_PINS 256
typedef struct pin_rec {
    const sp_cuda_ctx_t *ctx;
    const char *p;
    size_t n;
} pin_rec_t;
static pin_rec_t pins[MAX_PINS];
static int n_pins;
static uint64_t pinned_total;
static long fail_pin;
static long n_copy_pinned, n_copy_pageable;
static uint64_t h2d_bytes, d2h_bytes;

EXPORT void fake_cuda_fail_pin(long n) { fail_pin = n; }
/* Bytes and ranges registered now (every context). */
EXPORT void
fake_cuda_pinned(uint64_t *bytes, int *ranges)
{
    *bytes = pinned_total;
    *ranges = n_pins;
}
/* h2d/d2h copies whose host range was pinned / pageable, and the bytes each
 * way, since the library was loaded. */
EXPORT void
fake_cuda_copy_stats(long *pinned, long *pageable, uint64_t *h2d, uint64_t *d2h)
{
    *pinned = n_copy_pinned;
    *pageable = n_copy_pageable;
    *h2d = h2d_bytes;
    *d2h = d2h_bytes;
}

EXPORT void fake_cuda_fail_at(long n) { fail_at = n; }
EXPORT void fake_cuda_set_mem(uint64_t bytes) { mem_cap = bytes; }
EXPORT void fake_cuda_set_devices(int n) { n_devices = n; }
EXPORT void fake_cuda_set_abi(uint32_t v) { abi = v; }
EXPORT void fake_cuda_fail_capture(int on) { fail_capture = on; }
/* Graphs instantiated, graphs launched, gemv_q and qsplit_to_f16 calls run
 * (replayed ones included) since the library was loaded. */
EXPORT void
fake_cuda_stats(long *captures, long *launches, long *gemv_q, long *qsplit)
{
    *captures = n_captures;
    *launches = n_launches;
    *gemv_q = n_gemv_q;
    *qsplit = n_qsplit;
}

static int
fail(sp_cuda_ctx_t *c, int st, const char *fmt, ...)
{
    if (!c->broken || c->err[0] == '\0') { /* the first CUDA error stays */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, sizeof c->err, fmt, ap);
        va_end(ap);
    }
    if (st == SP_ERR_DEVICE) {
        c->broken = 1;
    }
    return st;
}

/* Every op: refuse a poisoned context; count down to an injected failure.
 * FAKE_CUDA_FAIL_OP=name (environment, for whole-server tests): the first op
 * of that name fails, e.g. "attn", which only a forward step runs. */
static int
enter(sp_cuda_ctx_t *c, const char *op)
{
    static int env_done;
    static const char *fail_op;
    if (c == NULL) {
        return SP_ERR_INVALID;
    }
    if (c->broken) {
        return SP_ERR_DEVICE;
    }
    if (c->capturing) {
        return SP_OK; /* recorded, not run: no fault to inject yet */
    }
    if (!env_done) {
        env_done = 1;
        fail_op = getenv("FAKE_CUDA_FAIL_OP");
    }
    if (fail_op != NULL && strcmp(op, fail_op) == 0) {
        fail_op = NULL;
        return fail(c, SP_ERR_DEVICE, "fake:%d %s: injected failure (an illegal memory access)",
                    c->ordinal, op);
    }
    if (fail_at == 0) {
        fail_at = -1;
        return fail(c, SP_ERR_DEVICE, "fake:%d %s: injected failure (an illegal memory access)",
                    c->ordinal, op);
    }
    if (fail_at > 0) {
        fail_at--;
    }
    return SP_OK;
}

#define ENTER(c, op)                                                                            \
    do {                                                                                        \
        int st_ = enter((c), (op));                                                             \
        if (st_ != SP_OK) return st_;                                                           \
    } while (0)

/* A call that a real capture cannot take (it synchronises or allocates). */
static int
no_capture(sp_cuda_ctx_t *c, const char *op)
{
    if (c == NULL || !c->capturing) {
        return SP_OK;
    }
    c->capture_bad = 1;
    return fail(c, SP_ERR_INVALID, "fake:%d %s: not while capturing a graph", c->ordinal, op);
}

#define NO_CAPTURE(c, op)                                                                       \
    do {                                                                                        \
        int st_ = no_capture((c), (op));                                                        \
        if (st_ != SP_OK) return st_;                                                           \
    } while (0)

/* Whether [p, p + bytes) lies inside one live allocation of c. */
static bool in_device(const sp_cuda_ctx_t *c, const void *p, size_t bytes);

/* Record op r; every non-NULL pointer of the n in ptrs must be device memory
 * of c (an optional argument may be NULL). */
static int
record(sp_cuda_ctx_t *c, const char *name, const rec_t *r, const void *const *ptrs, int n)
{
    for (int k = 0; k < n; k++) {
        if (ptrs[k] != NULL && !in_device(c, ptrs[k], 1)) {
            c->capture_bad = 1;
            return fail(c, SP_ERR_INVALID, "fake:%d %s: a captured op got pointer %p outside "
                        "device memory (a host value baked into a graph)", c->ordinal, name,
                        ptrs[k]);
        }
    }
    if (c->n_recs == c->cap_recs) {
        size_t cap = c->cap_recs ? 2 * c->cap_recs : 256;
        rec_t *nr = realloc(c->recs, cap * sizeof *nr);
        if (nr == NULL) {
            c->capture_bad = 1;
            return fail(c, SP_ERR_NOMEM, "fake: host out of memory");
        }
        c->recs = nr;
        c->cap_recs = cap;
    }
    c->recs[c->n_recs++] = *r;
    return SP_OK;
}

#define PTRS(...) ((const void *const[]){__VA_ARGS__}), \
    (int)(sizeof((const void *const[]){__VA_ARGS__}) / sizeof(void *))

static int
device_count(int *n, char *err, size_t err_len)
{
    *n = 0;
    if (n_devices < 1) {
        snprintf(err, err_len, "cudaGetDeviceCount: no CUDA-capable device is detected (fake)");
        return SP_ERR_DEVICE;
    }
    *n = n_devices;
    return SP_OK;
}

static int
device_info(int ordinal, char *name, size_t name_len, int *ma, int *mi, uint64_t *total,
            uint64_t *freeb, char *err, size_t err_len)
{
    if (ordinal < 0 || ordinal >= n_devices) {
        snprintf(err, err_len, "fake:%d: invalid device ordinal", ordinal);
        return SP_ERR_DEVICE;
    }
    snprintf(name, name_len, "Fake GPU");
    *ma = 9;
    *mi = 0;
    *total = mem_cap == UINT64_MAX ? ((uint64_t)16 << 30) : mem_cap;
    *freeb = *total - mem_used;
    return SP_OK;
}

static int
ctx_create(int ordinal, sp_cuda_ctx_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (ordinal < 0 || ordinal >= n_devices) {
        snprintf(err, err_len, "fake:%d: invalid device ordinal", ordinal);
        return SP_ERR_DEVICE;
    }
    sp_cuda_ctx_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return SP_ERR_NOMEM;
    }
    c->ordinal = ordinal;
    *out = c;
    return SP_OK;
}

/* Allocations carry their size and list links in a 64-byte header (the
 * payload stays 64-byte aligned, as cudaMalloc's 256 would). */
struct hdr {
    uint64_t bytes;
    hdr_t *prev, *next;
    uint64_t pad[5];
};

static void dev_free(sp_cuda_ctx_t *c, void *p);
static void host_unregister(sp_cuda_ctx_t *c, void *p);

static void
ctx_destroy(sp_cuda_ctx_t *c)
{
    if (c == NULL) {
        return;
    }
    while (c->live) {
        dev_free(c, c->live + 1);
    }
    for (int i = n_pins - 1; i >= 0; i--) { /* as cudaHostUnregister of what is left */
        if (pins[i].ctx == c) {
            host_unregister(c, (void *)pins[i].p);
        }
    }
    free(c->recs);
    free(c);
}

static bool
in_device(const sp_cuda_ctx_t *c, const void *p, size_t bytes)
{
    const char *q = p;
    for (const hdr_t *h = c->live; h != NULL; h = h->next) {
        const char *base = (const char *)(h + 1);
        if (q >= base && q + bytes <= base + (h->bytes ? h->bytes : 1)) {
            return true;
        }
    }
    return false;
}

static const char *last_error(const sp_cuda_ctx_t *c) { return c ? c->err : ""; }
static int healthy(const sp_cuda_ctx_t *c) { return c && !c->broken; }
static uint64_t bytes_in_use(const sp_cuda_ctx_t *c) { return c ? c->used : 0; }

static int
dev_alloc(sp_cuda_ctx_t *c, size_t bytes, void **out)
{
    *out = NULL;
    NO_CAPTURE(c, "alloc");
    ENTER(c, "alloc");
    if (mem_used + bytes > mem_cap) {
        return fail(c, SP_ERR_NOMEM, "fake:%d cudaMalloc(%zu bytes): out of memory", c->ordinal,
                    bytes);
    }
    hdr_t *h = aligned_alloc(64, sizeof(hdr_t) + ((bytes + 63) & ~(size_t)63));
    if (h == NULL) {
        return fail(c, SP_ERR_NOMEM, "fake: host out of memory");
    }
    h->bytes = bytes;
    h->prev = NULL;
    h->next = c->live;
    if (c->live) {
        c->live->prev = h;
    }
    c->live = h;
    mem_used += bytes;
    c->used += bytes;
    *out = h + 1;
    return SP_OK;
}

static void
dev_free(sp_cuda_ctx_t *c, void *p)
{
    if (c == NULL || p == NULL) {
        return;
    }
    hdr_t *h = (hdr_t *)p - 1;
    if (h->prev) {
        h->prev->next = h->next;
    } else {
        c->live = h->next;
    }
    if (h->next) {
        h->next->prev = h->prev;
    }
    mem_used -= h->bytes;
    c->used -= h->bytes;
    free(h);
}

/* Count a copy's host range as pinned (inside one registered range) or pageable. */
static int
host_side(sp_cuda_ctx_t *c, const void *h, size_t n, const char *op)
{
    (void)c;
    (void)op;
    const char *q = h;
    for (int i = 0; i < n_pins; i++) {
        if (q >= pins[i].p && q + n <= pins[i].p + pins[i].n) {
            n_copy_pinned++;
            return SP_OK;
        }
    }
    n_copy_pageable++;
    return SP_OK;
}

static int
h2d(sp_cuda_ctx_t *c, void *dst, const void *src, size_t n)
{
    NO_CAPTURE(c, "h2d");
    ENTER(c, "h2d");
    int st = host_side(c, src, n, "h2d");
    if (st != SP_OK) {
        return st;
    }
    h2d_bytes += n;
    memcpy(dst, src, n);
    return SP_OK;
}

static int
d2h(sp_cuda_ctx_t *c, void *dst, const void *src, size_t n)
{
    NO_CAPTURE(c, "d2h");
    ENTER(c, "d2h");
    int st = host_side(c, dst, n, "d2h");
    if (st != SP_OK) {
        return st;
    }
    d2h_bytes += n;
    memcpy(dst, src, n);
    return SP_OK;
}

/* ---------------------------------------------------- pinned host memory */

static int
host_register(sp_cuda_ctx_t *c, void *p, size_t n)
{
    NO_CAPTURE(c, "host_register");
    ENTER(c, "host_register");
    if (p == NULL || n == 0) {
        return fail(c, SP_ERR_INVALID, "fake:%d host_register: empty range", c->ordinal);
    }
    if (fail_pin > 0) {
        fail_pin--;
        return fail(c, SP_ERR_NOMEM, "fake:%d cudaHostRegister(%zu bytes): out of memory "
                    "(cudaErrorMemoryAllocation, injected)", c->ordinal, n);
    }
    /* CUDA pins whole pages: a range whose pages meet a registered range's
     * is refused, even when the bytes themselves do not overlap. */
    const uintptr_t lo = (uintptr_t)p / FAKE_PAGE, hi = ((uintptr_t)p + n - 1) / FAKE_PAGE;
    for (int i = 0; i < n_pins; i++) {
        const uintptr_t l2 = (uintptr_t)pins[i].p / FAKE_PAGE;
        const uintptr_t h2 = ((uintptr_t)pins[i].p + pins[i].n - 1) / FAKE_PAGE;
        if (lo <= h2 && l2 <= hi) {
            return fail(c, SP_ERR_NOMEM, "fake:%d cudaHostRegister(%p, %zu bytes): part of the "
                        "range is already registered (cudaErrorHostMemoryAlreadyRegistered)",
                        c->ordinal, p, n);
        }
    }
    if (n_pins == MAX_PINS) {
        return fail(c, SP_ERR_NOMEM, "fake:%d cudaHostRegister: too many ranges", c->ordinal);
    }
    pins[n_pins++] = (pin_rec_t){c, p, n};
    pinned_total += n;
    return SP_OK;
}

static void
host_unregister(sp_cuda_ctx_t *c, void *p)
{
    for (int i = 0; c != NULL && i < n_pins; i++) {
        if (pins[i].ctx == c && pins[i].p == (const char *)p) {
            pinned_total -= pins[i].n;
            pins[i] = pins[--n_pins];
            return;
        }
    }
}

static uint64_t
pinned_bytes(const sp_cuda_ctx_t *c)
{
    uint64_t b = 0;
    for (int i = 0; i < n_pins; i++) {
        b += pins[i].ctx == c ? pins[i].n : 0;
    }
    return b;
}

static int
d2d(sp_cuda_ctx_t *c, void *dst, const void *src, size_t n)
{
    ENTER(c, "d2d");
    if (c->capturing) {
        const rec_t r = {.op = OP_D2D, .p = {dst, (void *)src}, .i = {(int64_t)n}};
        return record(c, "d2d", &r, PTRS(dst, src));
    }
    memmove(dst, src, n);
    return SP_OK;
}

static int
dev_sync(sp_cuda_ctx_t *c)
{
    NO_CAPTURE(c, "sync");
    ENTER(c, "sync");
    return SP_OK;
}

static int
to_f16(sp_cuda_ctx_t *c, int type, const void *src, void *dst, int64_t n)
{
    ENTER(c, "to_f16");
    if (c->capturing) {
        const rec_t r = {.op = OP_TO_F16, .p = {(void *)src, dst}, .i = {type, n}};
        return record(c, "to_f16", &r, PTRS(src, dst));
    }
    uint16_t *o = dst;
    for (int64_t i = 0; i < n; i++) {
        float v;
        switch (type) {
        case SP_CU_F32: v = ((const float *)src)[i]; break;
        case SP_CU_F16: o[i] = ((const uint16_t *)src)[i]; continue;
        case SP_CU_BF16: v = sp_cu_bf16_to_f32(((const uint16_t *)src)[i]); break;
        case SP_CU_Q8_0:
            v = sp_cu_q8_0_elem((const sp_cu_block_q8_0 *)src + i / SP_CU_QK, (int)(i % SP_CU_QK));
            break;
        case SP_CU_Q4_0:
            v = sp_cu_q4_0_elem((const sp_cu_block_q4_0 *)src + i / SP_CU_QK, (int)(i % SP_CU_QK));
            break;
        default: return fail(c, SP_ERR_INVALID, "to_f16: type %d", type);
        }
        o[i] = sp_cu_f32_to_f16(v);
    }
    return SP_OK;
}

static int
embed(sp_cuda_ctx_t *c, const void *table, int64_t E, const int32_t *tok, int64_t R, float *x)
{
    ENTER(c, "embed");
    if (c->capturing) {
        const rec_t r = {.op = OP_EMBED, .p = {(void *)table, (void *)tok, x}, .i = {E, R}};
        return record(c, "embed", &r, PTRS(table, tok, x));
    }
    for (int64_t t = 0; t < R; t++) {
        for (int64_t i = 0; i < E; i++) {
            x[t * E + i] = sp_cu_f16_to_f32(((const uint16_t *)table)[(int64_t)tok[t] * E + i]);
        }
    }
    return SP_OK;
}

static int
add_rmsnorm(sp_cuda_ctx_t *c, float *x, const float *add, const float *w, const int32_t *rows,
            int64_t R, int64_t n, float eps, void *out, int out_f16)
{
    ENTER(c, "add_rmsnorm");
    if (c->capturing) {
        const rec_t r = {.op = OP_ADD_RMSNORM, .p = {x, (void *)add, (void *)w, (void *)rows, out},
                         .i = {R, n, out_f16}, .f = eps};
        return record(c, "add_rmsnorm", &r, PTRS(x, add, w, rows, out));
    }
    for (int64_t i = 0; i < R; i++) {
        const int64_t src = rows ? rows[i] : i;
        float *xr = x + src * n;
        double ss = 0.0;
        for (int64_t k = 0; k < n; k++) {
            if (add) {
                xr[k] += add[src * n + k];
            }
            ss += (double)xr[k] * xr[k];
        }
        if (w == NULL) {
            continue;
        }
        const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t k = 0; k < n; k++) {
            const float v = xr[k] * scale * w[k];
            if (out_f16) {
                ((uint16_t *)out)[i * n + k] = sp_cu_f32_to_f16(v);
            } else {
                ((float *)out)[i * n + k] = v;
            }
        }
    }
    return SP_OK;
}

static int
gemm(sp_cuda_ctx_t *c, const void *w, int64_t n_out, int64_t n_in, const void *x, int64_t R,
     float *y, const float *bias)
{
    ENTER(c, "gemm");
    if (c->capturing) {
        const rec_t r = {.op = OP_GEMM, .p = {(void *)w, (void *)x, y, (void *)bias},
                         .i = {n_out, n_in, R}};
        return record(c, "gemm", &r, PTRS(w, x, y, bias));
    }
    const uint16_t *W = w, *X = x;
    float *xf = malloc((size_t)n_in * sizeof(float));
    if (xf == NULL) {
        return fail(c, SP_ERR_NOMEM, "fake: host out of memory");
    }
    for (int64_t t = 0; t < R; t++) {
        for (int64_t k = 0; k < n_in; k++) {
            xf[k] = sp_cu_f16_to_f32(X[t * n_in + k]);
        }
        for (int64_t r = 0; r < n_out; r++) {
            const uint16_t *wr = W + r * n_in;
            float acc = 0.0f;
            for (int64_t k = 0; k < n_in; k++) {
                acc += sp_cu_f16_to_f32(wr[k]) * xf[k];
            }
            y[t * n_out + r] = acc + (bias ? bias[r] : 0.0f);
        }
    }
    free(xf);
    return SP_OK;
}

static int
rope_cs(sp_cuda_ctx_t *c, const int32_t *pos, int64_t R, const float *inv_freq, int64_t n_rot,
        double mscale, float *cs)
{
    ENTER(c, "rope_cs");
    if (c->capturing) {
        const rec_t r = {.op = OP_ROPE_CS, .p = {(void *)pos, (void *)inv_freq, cs},
                         .i = {R, n_rot}, .d = mscale};
        return record(c, "rope_cs", &r, PTRS(pos, inv_freq, cs));
    }
    for (int64_t t = 0; t < R; t++) {
        for (int64_t i = 0; i < n_rot / 2; i++) {
            const double th = (double)pos[t] * (double)inv_freq[i];
            cs[t * n_rot + 2 * i] = (float)(cos(th) * mscale);
            cs[t * n_rot + 2 * i + 1] = (float)(sin(th) * mscale);
        }
    }
    return SP_OK;
}

static int
rope(sp_cuda_ctx_t *c, float *v, int64_t R, int64_t n_heads, int64_t hd, int64_t n_rot,
     const float *cs, int neox)
{
    ENTER(c, "rope");
    if (c->capturing) {
        const rec_t r = {.op = OP_ROPE, .p = {v, (void *)cs}, .i = {R, n_heads, hd, n_rot, neox}};
        return record(c, "rope", &r, PTRS(v, cs));
    }
    for (int64_t t = 0; t < R; t++) {
        for (int64_t h = 0; h < n_heads; h++) {
            float *x = v + (t * n_heads + h) * hd;
            for (int64_t i = 0; i < n_rot / 2; i++) {
                int64_t a, b;
                sp_cu_rope_pair(i, n_rot, neox, &a, &b);
                const float co = cs[t * n_rot + 2 * i], sn = cs[t * n_rot + 2 * i + 1];
                const float x0 = x[a], x1 = x[b];
                x[a] = x0 * co - x1 * sn;
                x[b] = x0 * sn + x1 * co;
            }
        }
    }
    return SP_OK;
}

static float
kv_get(const sp_cuda_kv_t *kv, int64_t off)
{
    return kv->f16 ? sp_cu_f16_to_f32(((const uint16_t *)kv->d_data)[off])
                   : ((const float *)kv->d_data)[off];
}

static void
kv_put(const sp_cuda_kv_t *kv, int64_t off, float v)
{
    if (kv->f16) {
        ((uint16_t *)kv->d_data)[off] = sp_cu_f32_to_f16(v);
    } else {
        ((float *)kv->d_data)[off] = v;
    }
}

static int
kv_write(sp_cuda_ctx_t *c, const sp_cuda_kv_t *kv, int64_t il, const float *k, const float *v,
         const sp_cuda_rows_t *r)
{
    ENTER(c, "kv_write");
    if (c->capturing) {
        const rec_t rc = {.op = OP_KV_WRITE, .p = {(void *)k, (void *)v}, .i = {il}, .kv = *kv,
                          .rows = *r};
        return record(c, "kv_write", &rc, PTRS(k, v, kv->d_data, r->d_pos, r->d_bt, r->d_btab));
    }
    if (il < 0 || il >= kv->n_layer) {
        return fail(c, SP_ERR_INVALID, "kv_write: layer %lld", (long long)il);
    }
    const int64_t hd = kv->head_dim, kvd = kv->n_head_kv * hd;
    for (int64_t t = 0; t < r->n_rows; t++) {
        const int64_t pos = r->d_pos[t];
        const int64_t block = r->d_btab[r->d_bt[t] + pos / SP_CU_KV_BLOCK];
        if (block < 0 || block >= kv->n_blocks) {
            return fail(c, SP_ERR_DEVICE, "fake kv_write: block %lld out of the pool (an illegal "
                        "address on a GPU)", (long long)block);
        }
        const int64_t lane = pos % SP_CU_KV_BLOCK;
        for (int64_t g = 0; g < kv->n_head_kv; g++) {
            const int64_t tile = sp_cu_kv_tile(block, il, g, kv->n_head_kv, kv->tile_elems,
                                               kv->block_elems);
            for (int64_t d = 0; d < hd; d++) {
                kv_put(kv, tile + sp_cu_key_in_tile(lane, d), k[t * kvd + g * hd + d]);
                kv_put(kv, tile + sp_cu_val_in_tile(lane, d, hd, kv->tile_elems),
                       v[t * kvd + g * hd + d]);
            }
        }
    }
    return SP_OK;
}

static int
attn(sp_cuda_ctx_t *c, const sp_cuda_kv_t *kv, int64_t il, const float *q, int64_t n_head,
     float scale, int64_t window, float softcap, const float *sinks, const sp_cuda_rows_t *r,
     void *out)
{
    ENTER(c, "attn");
    if (il < 0 || il >= kv->n_layer || kv->n_head_kv < 1 || n_head % kv->n_head_kv != 0 ||
        window < 0 || !(softcap >= 0.0f)) {
        return fail(c, SP_ERR_INVALID, "attn: layer %lld, heads %lld/%lld, window %lld or "
                    "softcap %g", (long long)il, (long long)n_head, (long long)kv->n_head_kv,
                    (long long)window, (double)softcap);
    }
    if (c->capturing) {
        const rec_t rc = {.op = OP_ATTN, .p = {(void *)q, out, (void *)sinks},
                          .i = {il, n_head, window}, .f = scale, .f2 = softcap, .kv = *kv,
                          .rows = *r};
        return record(c, "attn", &rc,
                      PTRS(q, out, sinks, kv->d_data, r->d_pos, r->d_bt, r->d_btab));
    }
    const int64_t hd = kv->head_dim, group = n_head / kv->n_head_kv;
    for (int64_t t = 0; t < r->n_rows; t++) {
        const int64_t n_kv = (int64_t)r->d_pos[t] + 1;
        /* A sliding window: positions before lo are never read. */
        const int64_t lo = sp_cu_attn_first(n_kv - 1, window);
        const int32_t *table = r->d_btab + r->d_bt[t];
        /* Every block the window reads must be in the pool: a table entry of
         * a freed sliding block is -1 (an illegal address on a GPU). */
        for (int64_t jb = lo / SP_CU_KV_BLOCK; jb <= (n_kv - 1) / SP_CU_KV_BLOCK; jb++) {
            if (table[jb] < 0 || table[jb] >= kv->n_blocks) {
                return fail(c, SP_ERR_DEVICE, "fake attn: block %lld (table entry %lld) out "
                            "of the pool (an illegal address on a GPU)",
                            (long long)table[jb], (long long)jb);
            }
        }
        float *sc = malloc((size_t)n_kv * sizeof(float));
        if (sc == NULL) {
            return fail(c, SP_ERR_NOMEM, "fake: host out of memory");
        }
        for (int64_t h = 0; h < n_head; h++) {
            const int64_t g = h / group;
            const float *qh = q + (t * n_head + h) * hd;
            /* A sink joins the max and the denominator, with no value. */
            float mx = sinks != NULL ? sinks[h] : -INFINITY;
            for (int64_t p = lo; p < n_kv; p++) {
                const int64_t tile = sp_cu_kv_tile(table[p / SP_CU_KV_BLOCK], il, g,
                                                   kv->n_head_kv, kv->tile_elems, kv->block_elems);
                double s = 0.0;
                for (int64_t d = 0; d < hd; d++) {
                    s += (double)qh[d] * kv_get(kv, tile + sp_cu_key_in_tile(p % 16, d));
                }
                sc[p] = (float)s * scale;
                if (softcap > 0.0f) {
                    sc[p] = softcap * tanhf(sc[p] / softcap);
                }
                mx = sc[p] > mx ? sc[p] : mx;
            }
            double sum = sinks != NULL ? (double)expf(sinks[h] - mx) : 0.0;
            for (int64_t p = lo; p < n_kv; p++) {
                sc[p] = expf(sc[p] - mx);
                sum += sc[p];
            }
            for (int64_t d = 0; d < hd; d++) {
                double acc = 0.0;
                for (int64_t p = lo; p < n_kv; p++) {
                    const int64_t tile = sp_cu_kv_tile(table[p / SP_CU_KV_BLOCK], il, g,
                                                       kv->n_head_kv, kv->tile_elems,
                                                       kv->block_elems);
                    acc += (double)sc[p] *
                           kv_get(kv, tile + sp_cu_val_in_tile(p % 16, d, hd, kv->tile_elems));
                }
                ((uint16_t *)out)[(t * n_head + h) * hd + d] = sp_cu_f32_to_f16((float)(acc / sum));
            }
        }
        free(sc);
    }
    return SP_OK;
}

static int
swiglu(sp_cuda_ctx_t *c, const float *g, const float *u, int64_t n, void *out)
{
    ENTER(c, "swiglu");
    if (c->capturing) {
        const rec_t r = {.op = OP_SWIGLU, .p = {(void *)g, (void *)u, out}, .i = {n}};
        return record(c, "swiglu", &r, PTRS(g, u, out));
    }
    for (int64_t i = 0; i < n; i++) {
        ((uint16_t *)out)[i] = sp_cu_f32_to_f16(sp_cu_silu_mul(g[i], u[i], expf(-g[i])));
    }
    return SP_OK;
}

static int
head_rmsnorm(sp_cuda_ctx_t *c, float *v, int64_t R, int64_t n_heads, int64_t hd, const float *w,
             float eps)
{
    ENTER(c, "head_rmsnorm");
    if (n_heads < 1 || hd < 1 || w == NULL) {
        return fail(c, SP_ERR_INVALID, "head_rmsnorm: %lld heads of %lld, or no weight",
                    (long long)n_heads, (long long)hd);
    }
    if (c->capturing) {
        const rec_t r = {.op = OP_HEAD_RMSNORM, .p = {v, (void *)w}, .i = {R, n_heads, hd},
                         .f = eps};
        return record(c, "head_rmsnorm", &r, PTRS(v, w));
    }
    for (int64_t k = 0; k < R * n_heads; k++) {
        float *x = v + k * hd;
        double ss = 0.0;
        for (int64_t d = 0; d < hd; d++) {
            ss += (double)x[d] * x[d];
        }
        const float scale = (float)(1.0 / sqrt(ss / (double)hd + (double)eps));
        for (int64_t d = 0; d < hd; d++) {
            x[d] = x[d] * scale * w[d];
        }
    }
    return SP_OK;
}

static int
gelu_mul(sp_cuda_ctx_t *c, const float *g, const float *u, int64_t n, void *out)
{
    ENTER(c, "gelu_mul");
    if (c->capturing) {
        const rec_t r = {.op = OP_GELU_MUL, .p = {(void *)g, (void *)u, out}, .i = {n}};
        return record(c, "gelu_mul", &r, PTRS(g, u, out));
    }
    for (int64_t i = 0; i < n; i++) {
        ((uint16_t *)out)[i] =
            sp_cu_f32_to_f16(sp_cu_gelu_mul(g[i], u[i], tanhf(sp_cu_gelu_arg(g[i]))));
    }
    return SP_OK;
}

static int
softcap_op(sp_cuda_ctx_t *c, float *x, int64_t n, float cap)
{
    ENTER(c, "softcap");
    if (!(cap > 0.0f)) {
        return fail(c, SP_ERR_INVALID, "softcap: cap %g is not positive", (double)cap);
    }
    if (c->capturing) {
        const rec_t r = {.op = OP_SOFTCAP, .p = {x}, .i = {n}, .f = cap};
        return record(c, "softcap", &r, PTRS(x));
    }
    for (int64_t i = 0; i < n; i++) {
        x[i] = cap * tanhf(x[i] / cap);
    }
    return SP_OK;
}

static int
scale_op(sp_cuda_ctx_t *c, float *x, int64_t n, float f)
{
    ENTER(c, "scale");
    if (!isfinite(f)) {
        return fail(c, SP_ERR_INVALID, "scale: factor %g is not finite", (double)f);
    }
    if (c->capturing) {
        const rec_t r = {.op = OP_SCALE, .p = {x}, .i = {n}, .f = f};
        return record(c, "scale", &r, PTRS(x));
    }
    for (int64_t i = 0; i < n; i++) {
        x[i] *= f;
    }
    return SP_OK;
}

static int
softmax(sp_cuda_ctx_t *c, float *x, int64_t R, int64_t n)
{
    ENTER(c, "softmax");
    if (c->capturing) {
        const rec_t r = {.op = OP_SOFTMAX, .p = {x}, .i = {R, n}};
        return record(c, "softmax", &r, PTRS(x));
    }
    for (int64_t t = 0; t < R; t++) {
        float *row = x + t * n, mx = -INFINITY;
        for (int64_t k = 0; k < n; k++) {
            mx = row[k] > mx ? row[k] : mx;
        }
        double sum = 0.0;
        for (int64_t k = 0; k < n; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (int64_t k = 0; k < n; k++) {
            row[k] = (float)(row[k] / sum);
        }
    }
    return SP_OK;
}

static bool
before(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

static int
topk(sp_cuda_ctx_t *c, const float *x, int64_t R, int64_t n, int k, int32_t *idx, float *val)
{
    ENTER(c, "topk");
    if (c->capturing) {
        const rec_t r = {.op = OP_TOPK, .p = {(void *)x, idx, val}, .i = {R, n, k}};
        return record(c, "topk", &r, PTRS(x, idx, val));
    }
    if (k < 1 || k > SP_CU_MAX_TOPK) {
        return fail(c, SP_ERR_INVALID, "topk: k %d", k);
    }
    for (int64_t t = 0; t < R; t++) {
        float pv = INFINITY;
        int32_t pi = -1;
        for (int j = 0; j < k; j++) {
            float v = -INFINITY;
            int32_t vi = INT32_MAX;
            for (int64_t e = 0; e < n; e++) {
                float xv = x[t * n + e];
                if (xv != xv) {
                    xv = -INFINITY;
                }
                if (before(pv, pi, xv, (int32_t)e) && before(xv, (int32_t)e, v, vi)) {
                    v = xv;
                    vi = (int32_t)e;
                }
            }
            idx[t * k + j] = vi < (int32_t)n ? vi : -1;
            val[t * k + j] = v;
            pv = v;
            pi = vi;
        }
    }
    return SP_OK;
}

/* ---------------------------------------------------- quantised weights */

static int
qsplit_to_f16(sp_cuda_ctx_t *c, int type, const void *src, void *dst, int64_t n)
{
    ENTER(c, "qsplit_to_f16");
    if ((type != SP_CU_Q8_0 && type != SP_CU_Q4_0) || n < 0 || n % SP_CU_QK != 0) {
        return fail(c, SP_ERR_INVALID, "qsplit_to_f16: type %d or n %lld", type, (long long)n);
    }
    if (c->capturing) {
        const rec_t r = {.op = OP_QSPLIT_TO_F16, .p = {(void *)src, dst}, .i = {type, n}};
        return record(c, "qsplit_to_f16", &r, PTRS(src, dst));
    }
    n_qsplit++;
    for (int64_t i = 0; i < n; i++) {
        ((uint16_t *)dst)[i] = sp_cu_f32_to_f16(sp_cu_qsplit_elem(type, src, n, i));
    }
    return SP_OK;
}

static int
gemv_q(sp_cuda_ctx_t *c, int type, const void *w, int64_t n_out, int64_t n_in, const void *x,
       int64_t R, float *y, const float *bias)
{
    ENTER(c, "gemv_q");
    if ((type != SP_CU_Q8_0 && type != SP_CU_Q4_0) || R < 1 || R > SP_CUDA_GEMV_MAX_ROWS ||
        n_in <= 0 || n_in % SP_CU_QK != 0 || n_out <= 0 || (uintptr_t)w % 16 != 0 ||
        (uintptr_t)x % 16 != 0) {
        return fail(c, SP_ERR_INVALID, "gemv_q: type %d, %lld rows, n_in %lld or alignment not "
                    "supported", type, (long long)R, (long long)n_in);
    }
    if (c->capturing) {
        const rec_t r = {.op = OP_GEMV_Q, .p = {(void *)w, (void *)x, y, (void *)bias},
                         .i = {type, n_out, n_in, R}};
        return record(c, "gemv_q", &r, PTRS(w, x, y, bias));
    }
    n_gemv_q++;
    /* The kernel's order within a block (sum of q x, times the scale), F32. */
    const int64_t n = n_out * n_in;
    const uint16_t *X = x;
    for (int64_t t = 0; t < R; t++) {
        for (int64_t o = 0; o < n_out; o++) {
            float acc = 0.0f;
            for (int64_t b0 = 0; b0 < n_in; b0 += SP_CU_QK) {
                const int64_t e0 = o * n_in + b0;
                float s = 0.0f;
                for (int64_t j = 0; j < SP_CU_QK; j++) {
                    s += (float)sp_cu_qsplit_q(type, w, e0 + j) *
                         sp_cu_f16_to_f32(X[t * n_in + b0 + j]);
                }
                acc += sp_cu_qsplit_scale(type, w, n, e0) * s;
            }
            y[t * n_out + o] = acc + (bias ? bias[o] : 0.0f);
        }
    }
    return SP_OK;
}

/* ---------------------------------------------------------------- graphs */

static int
graph_begin(sp_cuda_ctx_t *c)
{
    NO_CAPTURE(c, "graph_begin");
    ENTER(c, "graph_begin");
    c->capturing = 1;
    c->capture_bad = 0;
    c->n_recs = 0;
    return SP_OK;
}

static int
graph_end(sp_cuda_ctx_t *c, sp_cuda_graph_t **out)
{
    *out = NULL;
    if (c == NULL || !c->capturing) {
        return SP_ERR_INVALID;
    }
    c->capturing = 0;
    if (c->broken) {
        return SP_ERR_DEVICE;
    }
    if (c->capture_bad || fail_capture) {
        if (!c->capture_bad) {
            fail_capture = 0;
            fail(c, SP_ERR_UNSUPPORTED, "fake:%d graph_end: injected capture failure "
                 "(cudaErrorStreamCaptureInvalidated)", c->ordinal);
        }
        return SP_ERR_UNSUPPORTED;
    }
    sp_cuda_graph_t *g = calloc(1, sizeof *g);
    if (g == NULL) {
        return fail(c, SP_ERR_NOMEM, "fake: host out of memory");
    }
    g->recs = c->recs;
    g->n = c->n_recs;
    c->recs = NULL;
    c->n_recs = c->cap_recs = 0;
    n_captures++;
    *out = g;
    return SP_OK;
}

static int
graph_launch(sp_cuda_ctx_t *c, sp_cuda_graph_t *g)
{
    NO_CAPTURE(c, "graph_launch");
    ENTER(c, "graph_launch");
    if (g == NULL) {
        return fail(c, SP_ERR_INVALID, "graph_launch: no graph");
    }
    n_launches++;
    /* Each replayed op goes through its entry point, so an injected failure
     * can hit any op of the replay. */
    for (size_t k = 0; k < g->n; k++) {
        const rec_t *r = &g->recs[k];
        void *const *p = r->p;
        const int64_t *i = r->i;
        int st;
        switch (r->op) {
        case OP_D2D: st = d2d(c, p[0], p[1], (size_t)i[0]); break;
        case OP_TO_F16: st = to_f16(c, (int)i[0], p[0], p[1], i[1]); break;
        case OP_EMBED: st = embed(c, p[0], i[0], p[1], i[1], p[2]); break;
        case OP_ADD_RMSNORM:
            st = add_rmsnorm(c, p[0], p[1], p[2], p[3], i[0], i[1], r->f, p[4], (int)i[2]);
            break;
        case OP_GEMM: st = gemm(c, p[0], i[0], i[1], p[1], i[2], p[2], p[3]); break;
        case OP_ROPE_CS: st = rope_cs(c, p[0], i[0], p[1], i[1], r->d, p[2]); break;
        case OP_ROPE: st = rope(c, p[0], i[0], i[1], i[2], i[3], p[1], (int)i[4]); break;
        case OP_KV_WRITE: st = kv_write(c, &r->kv, i[0], p[0], p[1], &r->rows); break;
        case OP_ATTN:
            st = attn(c, &r->kv, i[0], p[0], i[1], r->f, i[2], r->f2, p[2], &r->rows, p[1]);
            break;
        case OP_HEAD_RMSNORM: st = head_rmsnorm(c, p[0], i[0], i[1], i[2], p[1], r->f); break;
        case OP_GELU_MUL: st = gelu_mul(c, p[0], p[1], i[0], p[2]); break;
        case OP_SOFTCAP: st = softcap_op(c, p[0], i[0], r->f); break;
        case OP_SCALE: st = scale_op(c, p[0], i[0], r->f); break;
        case OP_SWIGLU: st = swiglu(c, p[0], p[1], i[0], p[2]); break;
        case OP_SOFTMAX: st = softmax(c, p[0], i[0], i[1]); break;
        case OP_TOPK: st = topk(c, p[0], i[0], i[1], (int)i[2], p[1], p[2]); break;
        case OP_QSPLIT_TO_F16: st = qsplit_to_f16(c, (int)i[0], p[0], p[1], i[1]); break;
        default: st = gemv_q(c, (int)i[0], p[0], i[1], i[2], p[1], i[3], p[2], p[3]); break;
        }
        if (st != SP_OK) {
            return st;
        }
    }
    return SP_OK;
}

static void
graph_destroy(sp_cuda_ctx_t *c, sp_cuda_graph_t *g)
{
    (void)c;
    if (g != NULL) {
        free(g->recs);
        free(g);
    }
}

static const sp_cuda_api_t api = {
    SP_CUDA_ABI_VERSION, (uint32_t)sizeof(sp_cuda_api_t), "fake",
    device_count, device_info, ctx_create, ctx_destroy, last_error, healthy, bytes_in_use,
    dev_alloc, dev_free, h2d, d2h, d2d, dev_sync,
    to_f16, embed, add_rmsnorm, gemm, rope_cs, rope, kv_write, attn, swiglu, softmax, topk,
    graph_begin, graph_end, graph_launch, graph_destroy, qsplit_to_f16, gemv_q,
    host_register, host_unregister, pinned_bytes, head_rmsnorm, gelu_mul, softcap_op, scale_op,
};

static sp_cuda_api_t api_other;
static uint32_t struct_size_claim; /* 0: the real size */

/* Claim a shorter table, as a library built before members were appended. */
EXPORT void fake_cuda_set_struct_size(uint32_t bytes) { struct_size_claim = bytes; }

EXPORT const sp_cuda_api_t *
sp_cuda_get_api(uint32_t v)
{
    if (struct_size_claim != 0) {
        api_other = api;
        api_other.struct_size = struct_size_claim;
        return &api_other;
    }
    if (abi != SP_CUDA_ABI_VERSION) {
        /* A library of another version answers with its own table. */
        api_other = api;
        api_other.abi_version = abi;
        return &api_other;
    }
    return v == SP_CUDA_ABI_VERSION ? &api : NULL;
}
