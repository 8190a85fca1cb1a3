/*
 * api.cu - libsampan_cuda.so's side of cuda_api.h: device contexts, memory,
 * copies, cuBLAS, and argument checks in front of the kernels of kernels.cu.
 *
 * Errors: every CUDA or cuBLAS status is checked; the first failure is kept
 * in the context's message ("<op>: <driver string>"), the context becomes
 * unhealthy, and every later call fails at once with SP_ERR_DEVICE. Nothing
 * here aborts: sampan turns the status into a failed request and marks the
 * device unhealthy (docs/cuda.md).
 *
 * Memory: plain cudaMalloc only (never managed memory); each live allocation
 * is recorded with its size so bytes_in_use is exact and sampan can account
 * device memory in the device layer's budget. Allocations happen at model
 * load and at batch/pool creation, never per step. Host memory the caller
 * registers (host_register: cudaHostRegister, portable) is recorded the same
 * way, counted (pinned_bytes) and unregistered by ctx_destroy if the caller
 * did not.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_api.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels_cu.h"
#include "sampan/status.h"

#define SP_EXPORT extern "C" __attribute__((visibility("default")))

typedef struct alloc_rec {
    void *ptr;
    size_t bytes;
} alloc_rec_t;

struct sp_cuda_ctx {
    int ordinal;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *workspace; /* cuBLAS workspace: ours, so it is counted (and graphs need it set) */
    int broken;
    int capturing;   /* between graph_begin and graph_end */
    int capture_bad; /* an op could not be captured: graph_end refuses */
    char err[320];
    uint64_t used;
    alloc_rec_t *recs;
    size_t n_recs, cap_recs;
    alloc_rec_t *pins; /* host ranges registered through this context */
    size_t n_pins, cap_pins;
    uint64_t pinned;
};

#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

static void
put_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (err == NULL || err_len == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* Record the first failure of c and poison it. */
static int
fail(sp_cuda_ctx_t *c, int st, const char *fmt, ...)
{
    if (!c->broken || c->err[0] == '\0') {
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

static int
cuda_fail(sp_cuda_ctx_t *c, const char *what, cudaError_t e)
{
    return fail(c, SP_ERR_DEVICE, "cuda:%d %s: %s (%s)", c->ordinal, what, cudaGetErrorString(e),
                cudaGetErrorName(e));
}

/* A launch that failed while capturing: the capture cannot be made, but the
 * context is not poisoned (nothing ran; an error that is sticky anyway comes
 * back at the next synchronising call). */
static int
capture_fail(sp_cuda_ctx_t *c, const char *what, const char *why)
{
    c->capture_bad = 1;
    (void)cudaGetLastError();
    return fail(c, SP_ERR_UNSUPPORTED, "cuda:%d %s while capturing a graph: %s", c->ordinal, what,
                why);
}

static int
launch_fail(sp_cuda_ctx_t *c, const char *what, cudaError_t e)
{
    return c->capturing ? capture_fail(c, what, cudaGetErrorName(e)) : cuda_fail(c, what, e);
}

/* Synchronous calls break a capture: refuse them while one is open. */
#define NOT_CAPTURING(c, what)                                                                  \
    do {                                                                                        \
        if ((c) != NULL && (c)->capturing) {                                                    \
            (c)->capture_bad = 1;                                                               \
            return fail((c), SP_ERR_INVALID, "cuda:%d %s: not while capturing a graph",         \
                        (c)->ordinal, (what));                                                  \
        }                                                                                       \
    } while (0)

static const char *
blas_str(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown cuBLAS status";
    }
}

/* Every entry: refuse a poisoned context, and make its device current for
 * this thread (one engine thread may drive contexts on several devices). */
#define ENTER(c)                                                                                \
    do {                                                                                        \
        if ((c) == NULL) return SP_ERR_INVALID;                                                 \
        if ((c)->broken) return SP_ERR_DEVICE;                                                  \
        cudaError_t e_ = cudaSetDevice((c)->ordinal);                                           \
        if (e_ != cudaSuccess) return cuda_fail((c), "cudaSetDevice", e_);                      \
    } while (0)

#define LAUNCHED(c, what, call)                                                                 \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) return launch_fail((c), (what), e_);                             \
        return SP_OK;                                                                           \
    } while (0)

/* ------------------------------------------------------------ devices */

static int
device_count(int *n, char *err, size_t err_len)
{
    *n = 0;
    int k = 0;
    cudaError_t e = cudaGetDeviceCount(&k);
    if (e != cudaSuccess) {
        put_err(err, err_len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                cudaGetErrorName(e));
        (void)cudaGetLastError();
        return SP_ERR_DEVICE;
    }
    *n = k;
    return SP_OK;
}

static int
device_info(int ordinal, char *name, size_t name_len, int *cc_major, int *cc_minor,
            uint64_t *total, uint64_t *freeb, char *err, size_t err_len)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, ordinal);
    if (e == cudaSuccess) {
        e = cudaSetDevice(ordinal);
    }
    size_t fr = 0, tot = 0;
    if (e == cudaSuccess) {
        e = cudaMemGetInfo(&fr, &tot);
    }
    if (e != cudaSuccess) {
        put_err(err, err_len, "cuda:%d: %s (%s)", ordinal, cudaGetErrorString(e),
                cudaGetErrorName(e));
        return SP_ERR_DEVICE;
    }
    if (name && name_len) {
        snprintf(name, name_len, "%s", p.name);
    }
    *cc_major = p.major;
    *cc_minor = p.minor;
    *total = tot;
    *freeb = fr;
    return SP_OK;
}

static void ctx_destroy(sp_cuda_ctx_t *c);

static int
ctx_create(int ordinal, sp_cuda_ctx_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_cuda_ctx_t *c = (sp_cuda_ctx_t *)calloc(1, sizeof *c);
    if (c == NULL) {
        put_err(err, err_len, "out of host memory");
        return SP_ERR_NOMEM;
    }
    c->ordinal = ordinal;
    cudaError_t e = cudaSetDevice(ordinal);
    if (e == cudaSuccess) {
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    }
    if (e != cudaSuccess) {
        put_err(err, err_len, "cuda:%d: %s (%s)", ordinal, cudaGetErrorString(e),
                cudaGetErrorName(e));
        ctx_destroy(c);
        return SP_ERR_DEVICE;
    }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) {
        bs = cublasSetStream(c->blas, c->stream);
    }
    if (bs != CUBLAS_STATUS_SUCCESS) {
        put_err(err, err_len, "cuda:%d cuBLAS: %s", ordinal, blas_str(bs));
        c->blas = NULL;
        ctx_destroy(c);
        return SP_ERR_DEVICE;
    }
    e = cudaMalloc(&c->workspace, CUBLAS_WORKSPACE_BYTES);
    if (e == cudaSuccess) {
        c->used += CUBLAS_WORKSPACE_BYTES;
        bs = cublasSetWorkspace(c->blas, c->workspace, CUBLAS_WORKSPACE_BYTES);
    }
    if (e != cudaSuccess || bs != CUBLAS_STATUS_SUCCESS) {
        put_err(err, err_len, "cuda:%d: cuBLAS workspace of %zu bytes: %s", ordinal,
                CUBLAS_WORKSPACE_BYTES,
                e != cudaSuccess ? cudaGetErrorString(e) : blas_str(bs));
        ctx_destroy(c);
        return e != cudaSuccess ? SP_ERR_NOMEM : SP_ERR_DEVICE;
    }
    *out = c;
    return SP_OK;
}

static void
ctx_destroy(sp_cuda_ctx_t *c)
{
    if (c == NULL) {
        return;
    }
    (void)cudaSetDevice(c->ordinal);
    if (c->capturing) { /* an owner that died mid-capture: end it, drop the graph */
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g != NULL) {
            (void)cudaGraphDestroy(g);
        }
    }
    if (c->stream) {
        (void)cudaStreamSynchronize(c->stream);
    }
    if (c->blas) {
        cublasDestroy(c->blas);
    }
    for (size_t i = 0; i < c->n_recs; i++) { /* whatever the owner leaked */
        (void)cudaFree(c->recs[i].ptr);
    }
    for (size_t i = 0; i < c->n_pins; i++) { /* registrations too: the memory is the owner's */
        (void)cudaHostUnregister(c->pins[i].ptr);
    }
    if (c->workspace) {
        (void)cudaFree(c->workspace);
    }
    if (c->stream) {
        (void)cudaStreamDestroy(c->stream);
    }
    (void)cudaGetLastError();
    free(c->recs);
    free(c->pins);
    free(c);
}

static const char *
last_error(const sp_cuda_ctx_t *c)
{
    return c ? c->err : "";
}

static int
healthy(const sp_cuda_ctx_t *c)
{
    return c && !c->broken;
}

static uint64_t
bytes_in_use(const sp_cuda_ctx_t *c)
{
    return c ? c->used : 0;
}

/* ------------------------------------------------------------- memory */

static int
dev_alloc(sp_cuda_ctx_t *c, size_t bytes, void **out)
{
    *out = NULL;
    ENTER(c);
    NOT_CAPTURING(c, "alloc");
    if (c->n_recs == c->cap_recs) {
        size_t cap = c->cap_recs ? 2 * c->cap_recs : 64;
        alloc_rec_t *r = (alloc_rec_t *)realloc(c->recs, cap * sizeof *r);
        if (r == NULL) {
            return fail(c, SP_ERR_NOMEM, "cuda:%d: out of host memory", c->ordinal);
        }
        c->recs = r;
        c->cap_recs = cap;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is not sticky: the device stays usable */
        return fail(c, SP_ERR_NOMEM, "cuda:%d cudaMalloc(%zu bytes): %s", c->ordinal, bytes,
                    cudaGetErrorString(e));
    }
    c->recs[c->n_recs].ptr = p;
    c->recs[c->n_recs].bytes = bytes;
    c->n_recs++;
    c->used += bytes;
    *out = p;
    return SP_OK;
}

static void
dev_free(sp_cuda_ctx_t *c, void *p)
{
    if (c == NULL || p == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n_recs; i++) {
        if (c->recs[i].ptr == p) {
            c->used -= c->recs[i].bytes;
            c->recs[i] = c->recs[--c->n_recs];
            (void)cudaSetDevice(c->ordinal);
            (void)cudaFree(p);
            return;
        }
    }
}

static int
h2d(sp_cuda_ctx_t *c, void *dst, const void *src, size_t bytes)
{
    ENTER(c);
    NOT_CAPTURING(c, "h2d");
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(c->stream);
    }
    return e == cudaSuccess ? SP_OK : cuda_fail(c, "h2d copy", e);
}

static int
d2h(sp_cuda_ctx_t *c, void *dst, const void *src, size_t bytes)
{
    ENTER(c);
    NOT_CAPTURING(c, "d2h");
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(c->stream);
    }
    return e == cudaSuccess ? SP_OK : cuda_fail(c, "d2h copy (or an earlier kernel)", e);
}

static int
d2d(sp_cuda_ctx_t *c, void *dst, const void *src, size_t bytes)
{
    ENTER(c);
    LAUNCHED(c, "d2d copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static int
dev_sync(sp_cuda_ctx_t *c)
{
    ENTER(c);
    NOT_CAPTURING(c, "sync");
    cudaError_t e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? SP_OK : cuda_fail(c, "stream (a kernel failed)", e);
}

/* -------------------------------------------------- pinned host memory */

static int
host_register(sp_cuda_ctx_t *c, void *p, size_t bytes)
{
    ENTER(c);
    NOT_CAPTURING(c, "host_register");
    if (p == NULL || bytes == 0) {
        return fail(c, SP_ERR_INVALID, "cuda:%d host_register: empty range", c->ordinal);
    }
    if (c->n_pins == c->cap_pins) {
        size_t cap = c->cap_pins ? 2 * c->cap_pins : 16;
        alloc_rec_t *r = (alloc_rec_t *)realloc(c->pins, cap * sizeof *r);
        if (r == NULL) {
            return fail(c, SP_ERR_NOMEM, "cuda:%d: out of host memory", c->ordinal);
        }
        c->pins = r;
        c->cap_pins = cap;
    }
    /* Portable: pinned for every context of the process, as the engine
     * thread's current device may change between calls. */
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: the context stays usable, the copy pageable */
        return fail(c, e == cudaErrorNotSupported ? SP_ERR_UNSUPPORTED : SP_ERR_NOMEM,
                    "cuda:%d cudaHostRegister(%zu bytes): %s (%s)", c->ordinal, bytes,
                    cudaGetErrorString(e), cudaGetErrorName(e));
    }
    c->pins[c->n_pins].ptr = p;
    c->pins[c->n_pins].bytes = bytes;
    c->n_pins++;
    c->pinned += bytes;
    return SP_OK;
}

static void
host_unregister(sp_cuda_ctx_t *c, void *p)
{
    if (c == NULL || p == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n_pins; i++) {
        if (c->pins[i].ptr == p) {
            c->pinned -= c->pins[i].bytes;
            c->pins[i] = c->pins[--c->n_pins];
            (void)cudaSetDevice(c->ordinal);
            (void)cudaHostUnregister(p);
            (void)cudaGetLastError(); /* a poisoned context may refuse: the memory is freed anyway */
            return;
        }
    }
}

static uint64_t
pinned_bytes(const sp_cuda_ctx_t *c)
{
    return c ? c->pinned : 0;
}

/* ---------------------------------------------------------------- ops */

static int
op_to_f16(sp_cuda_ctx_t *c, int type, const void *src, void *dst, int64_t n)
{
    ENTER(c);
    const bool blocky = type == SP_CU_Q8_0 || type == SP_CU_Q4_0;
    if (n < 0 || (type != SP_CU_F32 && type != SP_CU_F16 && type != SP_CU_BF16 && !blocky) ||
        (blocky && n % SP_CU_QK != 0)) {
        return fail(c, SP_ERR_INVALID, "to_f16: type %d or n %lld not supported", type,
                    (long long)n);
    }
    if (n == 0) {
        return SP_OK;
    }
    LAUNCHED(c, "to_f16", sp_cu_to_f16(c->stream, type, src, dst, n));
}

static int
op_embed(sp_cuda_ctx_t *c, const void *table, int64_t n_embd, const int32_t *tok, int64_t n_rows,
         float *x)
{
    ENTER(c);
    if (n_rows <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "embed", sp_cu_embed(c->stream, table, n_embd, tok, n_rows, x));
}

static int
op_add_rmsnorm(sp_cuda_ctx_t *c, float *x, const float *add, const float *w, const int32_t *rows,
               int64_t n_rows, int64_t n, float eps, void *out, int out_f16)
{
    ENTER(c);
    if (add && rows) {
        return fail(c, SP_ERR_INVALID, "add_rmsnorm: add and rows together");
    }
    if (n_rows <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "add_rmsnorm",
             sp_cu_add_rmsnorm(c->stream, x, add, w, rows, n_rows, n, eps, out, out_f16));
}

static int
op_gemm(sp_cuda_ctx_t *c, const void *w, int64_t n_out, int64_t n_in, const void *x,
        int64_t n_rows, float *y, const float *bias)
{
    ENTER(c);
    if (n_rows <= 0) {
        return SP_OK;
    }
    if (n_out > INT32_MAX || n_in > INT32_MAX || n_rows > INT32_MAX) {
        return fail(c, SP_ERR_INVALID, "gemm: dimensions past int");
    }
    /* Row-major y (n_rows, n_out) is column-major (n_out, n_rows) = W^T' x':
     * W row-major (n_out, n_in) is column-major (n_in, n_out), transposed. */
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_rows,
                                    (int)n_in, &alpha, w, CUDA_R_16F, (int)n_in, x, CUDA_R_16F,
                                    (int)n_in, &beta, y, CUDA_R_32F, (int)n_out,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS && c->capturing) {
        return capture_fail(c, "cublasGemmEx", blas_str(s));
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        return fail(c, SP_ERR_DEVICE, "cuda:%d cublasGemmEx(%lld x %lld x %lld): %s", c->ordinal,
                    (long long)n_out, (long long)n_rows, (long long)n_in, blas_str(s));
    }
    if (bias) {
        LAUNCHED(c, "bias", sp_cu_bias(c->stream, y, bias, n_rows, n_out));
    }
    return SP_OK;
}

static int
op_rope_cs(sp_cuda_ctx_t *c, const int32_t *pos, int64_t n_rows, const float *inv_freq,
           int64_t n_rot, double mscale, float *cs)
{
    ENTER(c);
    LAUNCHED(c, "rope_cs", sp_cu_rope_cs(c->stream, pos, n_rows, inv_freq, n_rot, mscale, cs));
}

static int
op_rope(sp_cuda_ctx_t *c, float *v, int64_t n_rows, int64_t n_heads, int64_t head_dim,
        int64_t n_rot, const float *cs, int neox)
{
    ENTER(c);
    LAUNCHED(c, "rope", sp_cu_rope(c->stream, v, n_rows, n_heads, head_dim, n_rot, cs, neox));
}

static sp_cu_kv_args_t
kv_args(const sp_cuda_kv_t *kv)
{
    sp_cu_kv_args_t a;
    a.data = kv->d_data;
    a.f16 = kv->f16;
    a.n_head_kv = kv->n_head_kv;
    a.head_dim = kv->head_dim;
    a.tile_elems = kv->tile_elems;
    a.block_elems = kv->block_elems;
    return a;
}

static sp_cu_rows_args_t
rows_args(const sp_cuda_rows_t *r)
{
    sp_cu_rows_args_t a;
    a.n_rows = r->n_rows;
    a.pos = r->d_pos;
    a.bt = r->d_bt;
    a.btab = r->d_btab;
    return a;
}

static int
op_kv_write(sp_cuda_ctx_t *c, const sp_cuda_kv_t *kv, int64_t il, const float *k, const float *v,
            const sp_cuda_rows_t *rows)
{
    ENTER(c);
    if (il < 0 || il >= kv->n_layer) {
        return fail(c, SP_ERR_INVALID, "kv_write: layer %lld not in this pool", (long long)il);
    }
    if (rows->n_rows <= 0) {
        return SP_OK;
    }
    sp_cu_kv_args_t a = kv_args(kv);
    sp_cu_rows_args_t r = rows_args(rows);
    LAUNCHED(c, "kv_write", sp_cu_kv_write(c->stream, &a, il, k, v, &r));
}

static int
op_attn(sp_cuda_ctx_t *c, const sp_cuda_kv_t *kv, int64_t il, const float *q, int64_t n_head,
        float scale, int64_t window, float softcap, const float *sinks,
        const sp_cuda_rows_t *rows, void *out)
{
    ENTER(c);
    if (il < 0 || il >= kv->n_layer || kv->head_dim > SP_CU_MAX_HEAD_DIM || kv->n_head_kv < 1 ||
        n_head % kv->n_head_kv != 0 || n_head > 65535 || window < 0 || !(softcap >= 0.0f)) {
        return fail(c, SP_ERR_INVALID, "attn: layer %lld, head_dim %lld, heads %lld/%lld, "
                    "window %lld or softcap %g not supported", (long long)il,
                    (long long)kv->head_dim, (long long)n_head, (long long)kv->n_head_kv,
                    (long long)window, (double)softcap);
    }
    if (rows->n_rows <= 0) {
        return SP_OK;
    }
    sp_cu_kv_args_t a = kv_args(kv);
    sp_cu_rows_args_t r = rows_args(rows);
    LAUNCHED(c, "attn",
             sp_cu_attn(c->stream, &a, il, q, n_head, scale, window, softcap, sinks, &r, out));
}

static int
op_swiglu(sp_cuda_ctx_t *c, const float *g, const float *u, int64_t n, void *out)
{
    ENTER(c);
    if (n <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "swiglu", sp_cu_swiglu(c->stream, g, u, n, out));
}

static int
op_head_rmsnorm(sp_cuda_ctx_t *c, float *v, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                const float *w, float eps)
{
    ENTER(c);
    if (n_heads < 1 || head_dim < 1 || w == NULL) {
        return fail(c, SP_ERR_INVALID, "head_rmsnorm: %lld heads of %lld, or no weight",
                    (long long)n_heads, (long long)head_dim);
    }
    if (n_rows <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "head_rmsnorm",
             sp_cu_head_rmsnorm(c->stream, v, n_rows, n_heads, head_dim, w, eps));
}

static int
op_gelu_mul(sp_cuda_ctx_t *c, const float *g, const float *u, int64_t n, void *out)
{
    ENTER(c);
    if (n <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "gelu_mul", sp_cu_gelu_mul(c->stream, g, u, n, out));
}

static int
op_softcap(sp_cuda_ctx_t *c, float *x, int64_t n, float cap)
{
    ENTER(c);
    if (!(cap > 0.0f)) {
        return fail(c, SP_ERR_INVALID, "softcap: cap %g is not positive", (double)cap);
    }
    if (n <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "softcap", sp_cu_softcap(c->stream, x, n, cap));
}

static int
op_scale(sp_cuda_ctx_t *c, float *x, int64_t n, float f)
{
    ENTER(c);
    if (!isfinite(f)) {
        return fail(c, SP_ERR_INVALID, "scale: factor %g is not finite", (double)f);
    }
    if (n <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "scale", sp_cu_scale(c->stream, x, n, f));
}

static int
op_softmax(sp_cuda_ctx_t *c, float *x, int64_t n_rows, int64_t n)
{
    ENTER(c);
    if (n_rows <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "softmax", sp_cu_softmax(c->stream, x, n_rows, n));
}

static int
op_topk(sp_cuda_ctx_t *c, const float *x, int64_t n_rows, int64_t n, int k, int32_t *idx,
        float *val)
{
    ENTER(c);
    if (k < 1 || k > SP_CU_MAX_TOPK || n > INT32_MAX - 1) {
        return fail(c, SP_ERR_INVALID, "topk: k %d out of 1..%d", k, SP_CU_MAX_TOPK);
    }
    if (n_rows <= 0) {
        return SP_OK;
    }
    LAUNCHED(c, "topk", sp_cu_topk(c->stream, x, n_rows, n, k, idx, val));
}

/* ------------------------------------------------------ quantised weights */

static int
op_qsplit_to_f16(sp_cuda_ctx_t *c, int type, const void *src, void *dst, int64_t n)
{
    ENTER(c);
    if ((type != SP_CU_Q8_0 && type != SP_CU_Q4_0) || n < 0 || n % SP_CU_QK != 0) {
        return fail(c, SP_ERR_INVALID, "qsplit_to_f16: type %d or n %lld not supported", type,
                    (long long)n);
    }
    if (n == 0) {
        return SP_OK;
    }
    LAUNCHED(c, "qsplit_to_f16", sp_cu_qsplit_to_f16(c->stream, type, src, dst, n));
}

static int
op_gemv_q(sp_cuda_ctx_t *c, int type, const void *w, int64_t n_out, int64_t n_in, const void *x,
          int64_t n_rows, float *y, const float *bias)
{
    ENTER(c);
    if ((type != SP_CU_Q8_0 && type != SP_CU_Q4_0) || n_rows < 1 ||
        n_rows > SP_CUDA_GEMV_MAX_ROWS || n_in <= 0 || n_in % SP_CU_QK != 0 || n_out <= 0 ||
        n_out / 4 >= INT32_MAX || (uintptr_t)w % 16 != 0 || (uintptr_t)x % 16 != 0) {
        return fail(c, SP_ERR_INVALID, "gemv_q: type %d, %lld rows, %lld x %lld or alignment "
                    "not supported", type, (long long)n_rows, (long long)n_out, (long long)n_in);
    }
    LAUNCHED(c, "gemv_q", sp_cu_gemv_q(c->stream, type, w, n_out, n_in, x, n_rows, y, bias));
}

/* ---------------------------------------------------------------- graphs */

struct sp_cuda_graph {
    cudaGraphExec_t exec;
};

static int
graph_begin(sp_cuda_ctx_t *c)
{
    ENTER(c);
    NOT_CAPTURING(c, "graph_begin");
    /* Relaxed: this thread may still make calls CUDA deems unsafe during a
     * capture (cuBLAS's internals are not ours to vouch for); our own code
     * only enqueues in a capture, and the host emulation refuses anything
     * else, so the stricter modes would only add ways to fail. */
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(c, SP_ERR_UNSUPPORTED, "cuda:%d cudaStreamBeginCapture: %s (%s)", c->ordinal,
                    cudaGetErrorString(e), cudaGetErrorName(e));
    }
    c->capturing = 1;
    c->capture_bad = 0;
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
    (void)cudaSetDevice(c->ordinal);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (c->broken || e != cudaSuccess || c->capture_bad || g == NULL) {
        if (g != NULL) {
            (void)cudaGraphDestroy(g);
        }
        (void)cudaGetLastError();
        if (c->broken) {
            return SP_ERR_DEVICE;
        }
        if (!c->capture_bad) {
            fail(c, SP_ERR_UNSUPPORTED, "cuda:%d cudaStreamEndCapture: %s (%s)", c->ordinal,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        }
        return SP_ERR_UNSUPPORTED;
    }
    sp_cuda_graph_t *gr = (sp_cuda_graph_t *)calloc(1, sizeof *gr);
    if (gr == NULL) {
        (void)cudaGraphDestroy(g);
        return fail(c, SP_ERR_NOMEM, "cuda:%d: out of host memory", c->ordinal);
    }
    e = cudaGraphInstantiate(&gr->exec, g, 0);
    (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        free(gr);
        (void)cudaGetLastError();
        return fail(c, SP_ERR_UNSUPPORTED, "cuda:%d cudaGraphInstantiate: %s (%s)", c->ordinal,
                    cudaGetErrorString(e), cudaGetErrorName(e));
    }
    *out = gr;
    return SP_OK;
}

static int
graph_launch(sp_cuda_ctx_t *c, sp_cuda_graph_t *g)
{
    ENTER(c);
    NOT_CAPTURING(c, "graph_launch");
    if (g == NULL) {
        return fail(c, SP_ERR_INVALID, "graph_launch: no graph");
    }
    LAUNCHED(c, "graph launch", cudaGraphLaunch(g->exec, c->stream));
}

static void
graph_destroy(sp_cuda_ctx_t *c, sp_cuda_graph_t *g)
{
    if (g == NULL) {
        return;
    }
    if (c != NULL) {
        (void)cudaSetDevice(c->ordinal);
    }
    (void)cudaGraphExecDestroy(g->exec);
    free(g);
}

/* ---------------------------------------------------------------- table */


static const sp_cuda_api_t api = {
    SP_CUDA_ABI_VERSION,
    (uint32_t)sizeof(sp_cuda_api_t),
    "cuda",
    device_count,
    device_info,
    ctx_create,
    ctx_destroy,
    last_error,
    healthy,
    bytes_in_use,
    dev_alloc,
    dev_free,
    h2d,
    d2h,
    d2d,
    dev_sync,
    op_to_f16,
    op_embed,
    op_add_rmsnorm,
    op_gemm,
    op_rope_cs,
    op_rope,
    op_kv_write,
    op_attn,
    op_swiglu,
    op_softmax,
    op_topk,
    graph_begin,
    graph_end,
    graph_launch,
    graph_destroy,
    op_qsplit_to_f16,
    op_gemv_q,
    host_register,
    host_unregister,
    pinned_bytes,
    op_head_rmsnorm,
    op_gelu_mul,
    op_softcap,
    op_scale,
};

SP_EXPORT const sp_cuda_api_t *
sp_cuda_get_api(uint32_t abi_version)
{
    return abi_version == SP_CUDA_ABI_VERSION ? &api : NULL;
}
