/*
 * fake_cuda.c - a host emulation of libsampan_cuda.so's op table (cuda_api.h),
 * built as libfake_cuda.so. "Device" memory is host memory and every op is a
 * plain loop with the semantics cuda_api.h states, indexing through
 * cuda_common.h like the kernels do.
 *
 * Why: no GPU in CI. With this library sampan's whole GPU path (the loader,
 * weight upload and dequantisation, the device KV pool, the forward pass of
 * src/cuda/gpu.c, partial offload, error handling) runs on the CPU and is
 * compared with the CPU engine (tests/gpu/host_test.c); the kernel test
 * (tests/gpu/kernel_test.c) runs against it too, so the test itself is
 * checked before a GPU ever runs it.
 *
 * Fault injection (exported, found with dlsym): fake_cuda_fail_at(n) makes
 * the n-th op from now fail as a CUDA error would (sticky); fake_cuda_set_mem
 * caps the bytes alloc may hand out; fake_cuda_set_devices sets the device
 * count (0: device_count fails as without a driver); fake_cuda_set_abi makes
 * sp_cuda_get_api claim another ABI version.
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

struct sp_cuda_ctx {
    int ordinal;
    int broken;
    char err[256];
    uint64_t used;
    hdr_t *live; /* every live allocation, freed with the context as cudaFree would */
};

static long fail_at = -1; /* ops until an injected failure; -1 = never */
static uint64_t mem_cap = UINT64_MAX;
static uint64_t mem_used;
static int n_devices = 1;
static uint32_t abi = SP_CUDA_ABI_VERSION;

EXPORT void fake_cuda_fail_at(long n) { fail_at = n; }
EXPORT void fake_cuda_set_mem(uint64_t bytes) { mem_cap = bytes; }
EXPORT void fake_cuda_set_devices(int n) { n_devices = n; }
EXPORT void fake_cuda_set_abi(uint32_t v) { abi = v; }

static int
fail(sp_cuda_ctx_t *c, int st, const char *fmt, ...)
{
    if (c->err[0] == '\0') {
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

static void
ctx_destroy(sp_cuda_ctx_t *c)
{
    if (c == NULL) {
        return;
    }
    while (c->live) {
        dev_free(c, c->live + 1);
    }
    free(c);
}

static const char *last_error(const sp_cuda_ctx_t *c) { return c ? c->err : ""; }
static int healthy(const sp_cuda_ctx_t *c) { return c && !c->broken; }
static uint64_t bytes_in_use(const sp_cuda_ctx_t *c) { return c ? c->used : 0; }

static int
dev_alloc(sp_cuda_ctx_t *c, size_t bytes, void **out)
{
    *out = NULL;
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

static int
h2d(sp_cuda_ctx_t *c, void *dst, const void *src, size_t n)
{
    ENTER(c, "h2d");
    memcpy(dst, src, n);
    return SP_OK;
}

static int
d2h(sp_cuda_ctx_t *c, void *dst, const void *src, size_t n)
{
    ENTER(c, "d2h");
    memcpy(dst, src, n);
    return SP_OK;
}

static int
d2d(sp_cuda_ctx_t *c, void *dst, const void *src, size_t n)
{
    ENTER(c, "d2d");
    memmove(dst, src, n);
    return SP_OK;
}

static int
dev_sync(sp_cuda_ctx_t *c)
{
    ENTER(c, "sync");
    return SP_OK;
}

static int
to_f16(sp_cuda_ctx_t *c, int type, const void *src, void *dst, int64_t n)
{
    ENTER(c, "to_f16");
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
        float *cs)
{
    ENTER(c, "rope_cs");
    for (int64_t t = 0; t < R; t++) {
        for (int64_t i = 0; i < n_rot / 2; i++) {
            const double th = (double)pos[t] * (double)inv_freq[i];
            cs[t * n_rot + 2 * i] = (float)cos(th);
            cs[t * n_rot + 2 * i + 1] = (float)sin(th);
        }
    }
    return SP_OK;
}

static int
rope(sp_cuda_ctx_t *c, float *v, int64_t R, int64_t n_heads, int64_t hd, int64_t n_rot,
     const float *cs, int neox)
{
    ENTER(c, "rope");
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
     float scale, const sp_cuda_rows_t *r, void *out)
{
    ENTER(c, "attn");
    const int64_t hd = kv->head_dim, group = n_head / kv->n_head_kv;
    for (int64_t t = 0; t < r->n_rows; t++) {
        const int64_t n_kv = (int64_t)r->d_pos[t] + 1;
        const int32_t *table = r->d_btab + r->d_bt[t];
        float *sc = malloc((size_t)n_kv * sizeof(float));
        if (sc == NULL) {
            return fail(c, SP_ERR_NOMEM, "fake: host out of memory");
        }
        for (int64_t h = 0; h < n_head; h++) {
            const int64_t g = h / group;
            const float *qh = q + (t * n_head + h) * hd;
            float mx = -INFINITY;
            for (int64_t p = 0; p < n_kv; p++) {
                const int64_t tile = sp_cu_kv_tile(table[p / SP_CU_KV_BLOCK], il, g,
                                                   kv->n_head_kv, kv->tile_elems, kv->block_elems);
                double s = 0.0;
                for (int64_t d = 0; d < hd; d++) {
                    s += (double)qh[d] * kv_get(kv, tile + sp_cu_key_in_tile(p % 16, d));
                }
                sc[p] = (float)s * scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            double sum = 0.0;
            for (int64_t p = 0; p < n_kv; p++) {
                sc[p] = expf(sc[p] - mx);
                sum += sc[p];
            }
            for (int64_t d = 0; d < hd; d++) {
                double acc = 0.0;
                for (int64_t p = 0; p < n_kv; p++) {
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
    for (int64_t i = 0; i < n; i++) {
        ((uint16_t *)out)[i] = sp_cu_f32_to_f16(sp_cu_silu_mul(g[i], u[i], expf(-g[i])));
    }
    return SP_OK;
}

static int
softmax(sp_cuda_ctx_t *c, float *x, int64_t R, int64_t n)
{
    ENTER(c, "softmax");
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

static const sp_cuda_api_t api = {
    SP_CUDA_ABI_VERSION, (uint32_t)sizeof(sp_cuda_api_t), "fake",
    device_count, device_info, ctx_create, ctx_destroy, last_error, healthy, bytes_in_use,
    dev_alloc, dev_free, h2d, d2h, d2d, dev_sync,
    to_f16, embed, add_rmsnorm, gemm, rope_cs, rope, kv_write, attn, swiglu, softmax, topk,
};

static sp_cuda_api_t api_other;

EXPORT const sp_cuda_api_t *
sp_cuda_get_api(uint32_t v)
{
    if (abi != SP_CUDA_ABI_VERSION) {
        /* A library of another version answers with its own table. */
        api_other = api;
        api_other.abi_version = abi;
        return &api_other;
    }
    return v == SP_CUDA_ABI_VERSION ? &api : NULL;
}
