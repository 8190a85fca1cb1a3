/*
 * backends/onnx/cuda/dev.cu - the device operations of dev.h on CUDA:
 * cuDNN for convolutions (bias and Relu fused where cuDNN allows), cuBLAS
 * for matrix products, small kernels for the rest. Built into
 * libsampan_onnx_cuda.so with exec.c by `make cuda`.
 *
 * Numerics: FP32 tensors use FP32 arithmetic throughout (cuDNN's FMA math
 * and cuBLAS's CUBLAS_COMPUTE_32F: no TF32, so results match the CPU's
 * within FP32 rounding); FP16 tensors are stored half and computed with
 * FP32 accumulation (tensor cores allowed). Kernels load to float, compute
 * in float and store once.
 * Errors: every CUDA, cuDNN and cuBLAS status is checked; the first failure
 * is kept ("cuda:0 conv: CUDNN_STATUS_...") and poisons the context, except
 * an out-of-memory cudaMalloc, which the caller may retry after freeing.
 * One stream per context; every op is stream-ordered, d2h waits for it.
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu_api.h"
#include "dev.h"

struct oxd {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cudnnHandle_t dnn;
    int poisoned;
    char err[320];
};

static int
set_err(oxd_t *d, const char *op, const char *msg, int poison)
{
    if (!d->poisoned) snprintf(d->err, sizeof d->err, "cuda:%d %s: %s", d->device, op, msg);
    if (poison) d->poisoned = 1;
    return -1;
}

static int
ck_cuda(oxd_t *d, cudaError_t e, const char *op)
{
    if (e == cudaSuccess) return 0;
    char msg[200];
    snprintf(msg, sizeof msg, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return set_err(d, op, msg, 1);
}

static int
ck_dnn(oxd_t *d, cudnnStatus_t s, const char *op)
{
    return s == CUDNN_STATUS_SUCCESS ? 0 : set_err(d, op, cudnnGetErrorString(s), 1);
}

/* A planning failure: a shape or parameter cuDNN does not take is the model's limit, not a
 * broken device, so it does not poison the context. */
static int
ck_dnn_plan(oxd_t *d, cudnnStatus_t s, const char *op)
{
    if (s == CUDNN_STATUS_SUCCESS) return 0;
    if (s == CUDNN_STATUS_NOT_SUPPORTED || s == CUDNN_STATUS_BAD_PARAM) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s: this convolution is not supported by cuDNN", cudnnGetErrorString(s));
        return set_err(d, op, msg, 0);
    }
    return set_err(d, op, cudnnGetErrorString(s), 1);
}

static int
ck_blas(oxd_t *d, cublasStatus_t s, const char *op)
{
    return s == CUBLAS_STATUS_SUCCESS ? 0 : set_err(d, op, cublasGetStatusString(s), 1);
}

/* A kernel launch: the launch's own error (bad configuration) now, faults at the next sync. */
static int
ck_launch(oxd_t *d, const char *op)
{
    return ck_cuda(d, cudaGetLastError(), op);
}

#define LIVE(d) \
    do { \
        if ((d)->poisoned) return -1; \
    } while (0)

extern "C" int
oxd_probe(int device, char *err, size_t err_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "no CUDA device: cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return -1;
    }
    if (device < 0 || device >= n) {
        snprintf(err, err_len, "CUDA device %d does not exist (%d visible)", device, n);
        return -1;
    }
    size_t ver = cudnnGetVersion();
    if (ver / 10000 != CUDNN_MAJOR) {
        snprintf(err, err_len, "cuDNN %zu loaded, built against %d", ver, CUDNN_MAJOR);
        return -1;
    }
    return 0;
}

extern "C" int
oxd_open(int device, oxd_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (oxd_probe(device, err, err_len)) return -1;
    oxd_t *d = (oxd_t *)calloc(1, sizeof *d);
    if (d == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    d->device = device;
    if (ck_cuda(d, cudaSetDevice(device), "cudaSetDevice") ||
        ck_cuda(d, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "cudaStreamCreate") ||
        ck_blas(d, cublasCreate(&d->blas), "cublasCreate") ||
        ck_blas(d, cublasSetStream(d->blas, d->stream), "cublasSetStream") ||
        ck_dnn(d, cudnnCreate(&d->dnn), "cudnnCreate") ||
        ck_dnn(d, cudnnSetStream(d->dnn, d->stream), "cudnnSetStream")) {
        snprintf(err, err_len, "%s", d->err);
        oxd_close(d);
        return -1;
    }
    *out = d;
    return 0;
}

extern "C" void
oxd_close(oxd_t *d)
{
    if (d == NULL) return;
    cudaSetDevice(d->device);
    if (d->stream) cudaStreamSynchronize(d->stream);
    if (d->dnn) cudnnDestroy(d->dnn);
    if (d->blas) cublasDestroy(d->blas);
    if (d->stream) cudaStreamDestroy(d->stream);
    free(d);
}

extern "C" int
oxd_bind(oxd_t *d)
{
    LIVE(d);
    return ck_cuda(d, cudaSetDevice(d->device), "cudaSetDevice");
}

extern "C" const char *
oxd_error(const oxd_t *d)
{
    return d->err[0] ? d->err : "no error";
}

extern "C" int
oxd_alloc(oxd_t *d, size_t bytes, void **p)
{
    LIVE(d);
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* not sticky: clear it */
        char msg[96];
        snprintf(msg, sizeof msg, "out of memory for %zu bytes", bytes);
        return set_err(d, "cudaMalloc", msg, 0);
    }
    return ck_cuda(d, e, "cudaMalloc");
}

extern "C" void
oxd_free(oxd_t *d, void *p)
{
    (void)d;
    if (p) cudaFree(p); /* synchronizes with the device: no pending op still uses p */
}

extern "C" int
oxd_h2d(oxd_t *d, void *dst, const void *src, size_t bytes)
{
    LIVE(d);
    /* pageable source: the call returns once the data is staged, so src may be reused */
    return ck_cuda(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, d->stream), "h2d");
}

extern "C" int
oxd_d2h(oxd_t *d, void *dst, const void *src, size_t bytes)
{
    LIVE(d);
    return ck_cuda(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->stream), "d2h") ||
           ck_cuda(d, cudaStreamSynchronize(d->stream), "d2h sync");
}

extern "C" int
oxd_sync(oxd_t *d)
{
    LIVE(d);
    return ck_cuda(d, cudaStreamSynchronize(d->stream), "sync");
}

/* ---- kernels ---- */

__device__ __forceinline__ float ldv(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ldv(const __half *p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void stv(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stv(__half *p, int64_t i, float v) { p[i] = __float2half_rn(v); }

static unsigned
blocks_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535 * 32 ? 65535 * 32 : b); /* grid-stride loops cover the rest */
}

#define GRID_LOOP(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

template <typename S, typename D>
__global__ void k_convert(D *y, const S *x, int64_t n)
{
    GRID_LOOP(i, n) stv(y, i, ldv(x, i));
}

extern "C" int
oxd_convert(oxd_t *d, int dst_dt, void *dst, int src_dt, const void *src, int64_t n)
{
    LIVE(d);
    if (n == 0) return 0;
    if (dst_dt == OXD_F16 && src_dt == OXD_F32) {
        k_convert<float, __half><<<blocks_for(n, 256), 256, 0, d->stream>>>((__half *)dst, (const float *)src, n);
    } else if (dst_dt == OXD_F32 && src_dt == OXD_F16) {
        k_convert<__half, float><<<blocks_for(n, 256), 256, 0, d->stream>>>((float *)dst, (const __half *)src, n);
    } else {
        return set_err(d, "convert", "unsupported types", 0);
    }
    return ck_launch(d, "convert");
}

__device__ __forceinline__ float
unary1(int op, float x, float a, float b)
{
    switch (op) {
    case SP_OXG_RELU: return x > 0.0f ? x : 0.0f;
    case SP_OXG_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case SP_OXG_TANH: return tanhf(x);
    case SP_OXG_GELU:
        if (a != 0.0f) return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
        return 0.5f * x * (1.0f + erff(x * 0.70710678f));
    case SP_OXG_ERF: return erff(x);
    case SP_OXG_CLIP: return fminf(fmaxf(x, a), b);
    case SP_OXG_HARDSWISH: return x * fminf(fmaxf(x / 6.0f + 0.5f, 0.0f), 1.0f);
    case SP_OXG_LEAKYRELU: return x >= 0.0f ? x : a * x;
    case SP_OXG_HARDSIGMOID: return fminf(fmaxf(a * x + b, 0.0f), 1.0f);
    case SP_OXG_SQRT: return sqrtf(x);
    case SP_OXG_EXP: return expf(x);
    case SP_OXG_LOG: return logf(x);
    case SP_OXG_NEG: return -x;
    case SP_OXG_ABS: return fabsf(x);
    case SP_OXG_RECIP: return 1.0f / x;
    default: return x;
    }
}

template <typename T>
__global__ void k_unary(int op, float a, float b, const T *x, T *y, int64_t n)
{
    GRID_LOOP(i, n) stv(y, i, unary1(op, ldv(x, i), a, b));
}

extern "C" int
oxd_unary(oxd_t *d, int dt, int op, float a, float b, const void *x, void *y, int64_t n)
{
    LIVE(d);
    if (n == 0) return 0;
    if (dt == OXD_F16) k_unary<__half><<<blocks_for(n, 256), 256, 0, d->stream>>>(op, a, b, (const __half *)x, (__half *)y, n);
    else k_unary<float><<<blocks_for(n, 256), 256, 0, d->stream>>>(op, a, b, (const float *)x, (float *)y, n);
    return ck_launch(d, "unary");
}

struct shape8 {
    int nd;
    int64_t dims[OXD_MAX_DIMS], s0[OXD_MAX_DIMS], s1[OXD_MAX_DIMS];
};

template <typename T>
__global__ void k_binary(int op, shape8 sh, const T *a, const T *b, T *y, int64_t n)
{
    GRID_LOOP(i, n) {
        int64_t r = i, oa = 0, ob = 0;
        for (int k = sh.nd - 1; k >= 0; k--) {
            int64_t c = r % sh.dims[k];
            r /= sh.dims[k];
            oa += c * sh.s0[k];
            ob += c * sh.s1[k];
        }
        float u = ldv(a, oa), v = ldv(b, ob), o;
        switch (op) {
        case SP_OXG_ADD: o = u + v; break;
        case SP_OXG_SUB: o = u - v; break;
        case SP_OXG_MUL: o = u * v; break;
        case SP_OXG_DIV: o = u / v; break;
        default: o = powf(u, v); break;
        }
        stv(y, i, o);
    }
}

static int
make_shape(oxd_t *d, int nd, const int64_t *dims, const int64_t *s0, const int64_t *s1, shape8 *sh, int64_t *n)
{
    if (nd < 0 || nd > OXD_MAX_DIMS) return set_err(d, "shape", "rank out of range", 0);
    memset(sh, 0, sizeof *sh);
    sh->nd = nd;
    *n = 1;
    for (int k = 0; k < nd; k++) {
        sh->dims[k] = dims[k];
        sh->s0[k] = s0[k];
        sh->s1[k] = s1[k];
        *n *= dims[k];
    }
    return 0;
}

extern "C" int
oxd_binary(oxd_t *d, int dt, int op, int nd, const int64_t *dims, const int64_t *sa, const int64_t *sb,
           const void *a, const void *b, void *y)
{
    LIVE(d);
    shape8 sh;
    int64_t n;
    if (make_shape(d, nd, dims, sa, sb, &sh, &n)) return -1;
    if (n == 0) return 0;
    if (dt == OXD_F16) k_binary<__half><<<blocks_for(n, 256), 256, 0, d->stream>>>(op, sh, (const __half *)a, (const __half *)b, (__half *)y, n);
    else k_binary<float><<<blocks_for(n, 256), 256, 0, d->stream>>>(op, sh, (const float *)a, (const float *)b, (float *)y, n);
    return ck_launch(d, "binary");
}

template <typename E>
__global__ void k_copy(shape8 sh, const E *x, E *y, int64_t n)
{
    GRID_LOOP(i, n) {
        int64_t r = i, ox = 0, oy = 0;
        for (int k = sh.nd - 1; k >= 0; k--) {
            int64_t c = r % sh.dims[k];
            r /= sh.dims[k];
            ox += c * sh.s0[k];
            oy += c * sh.s1[k];
        }
        y[oy] = x[ox];
    }
}

extern "C" int
oxd_copy(oxd_t *d, size_t elem, int nd, const int64_t *dims, const void *x, const int64_t *sx, void *y,
         const int64_t *sy)
{
    LIVE(d);
    shape8 sh;
    int64_t n;
    if (make_shape(d, nd, dims, sx, sy, &sh, &n)) return -1;
    if (n == 0) return 0;
    unsigned g = blocks_for(n, 256);
    switch (elem) {
    case 2: k_copy<uint16_t><<<g, 256, 0, d->stream>>>(sh, (const uint16_t *)x, (uint16_t *)y, n); break;
    case 4: k_copy<uint32_t><<<g, 256, 0, d->stream>>>(sh, (const uint32_t *)x, (uint32_t *)y, n); break;
    case 8: k_copy<uint64_t><<<g, 256, 0, d->stream>>>(sh, (const uint64_t *)x, (uint64_t *)y, n); break;
    default: return set_err(d, "copy", "element size not 2, 4 or 8", 0);
    }
    return ck_launch(d, "copy");
}

template <typename T>
__global__ void k_affine(const T *x, const T *scale, const T *shift, T *y, int64_t c, int64_t inner, int relu, int64_t n)
{
    GRID_LOOP(i, n) {
        int64_t ch = (i / inner) % c;
        float v = ldv(x, i) * (scale ? ldv(scale, ch) : 1.0f) + (shift ? ldv(shift, ch) : 0.0f);
        stv(y, i, relu && v < 0.0f ? 0.0f : v);
    }
}

extern "C" int
oxd_affine(oxd_t *d, int dt, const void *x, const void *scale, const void *shift, void *y, int64_t outer,
           int64_t c, int64_t inner, int relu)
{
    LIVE(d);
    int64_t n = outer * c * inner;
    if (n == 0) return 0;
    if (dt == OXD_F16) k_affine<__half><<<blocks_for(n, 256), 256, 0, d->stream>>>((const __half *)x, (const __half *)scale, (const __half *)shift, (__half *)y, c, inner, relu, n);
    else k_affine<float><<<blocks_for(n, 256), 256, 0, d->stream>>>((const float *)x, (const float *)scale, (const float *)shift, (float *)y, c, inner, relu, n);
    return ck_launch(d, "affine");
}

/* One thread per output element; count_pad counts the window's cells inside the padded input
 * (as the CPU runtime). */
template <typename T>
__global__ void k_pool(oxd_pool_t p, const T *x, T *y, int64_t n)
{
    GRID_LOOP(i, n) {
        int64_t ox = i % p.ow, oy = (i / p.ow) % p.oh, pl = i / (p.ow * p.oh);
        float mx = -INFINITY, sum = 0.0f;
        int64_t cnt = 0, cnt_pad = 0;
        for (int64_t ky = 0; ky < p.kh; ky++) {
            int64_t iy = oy * p.sh - p.pad_t + ky * p.dh;
            for (int64_t kx = 0; kx < p.kw; kx++) {
                int64_t ix = ox * p.sw - p.pad_l + kx * p.dw;
                if (iy >= -p.pad_t && iy < p.h + p.pad_b && ix >= -p.pad_l && ix < p.w + p.pad_r) cnt_pad++;
                if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                float v = ldv(x, (pl * p.h + iy) * p.w + ix);
                mx = fmaxf(mx, v);
                sum += v;
                cnt++;
            }
        }
        int64_t div = p.count_pad ? cnt_pad : cnt;
        stv(y, i, p.max ? mx : sum / (float)(div ? div : 1));
    }
}

extern "C" int
oxd_pool(oxd_t *d, int dt, const oxd_pool_t *p, const void *x, void *y)
{
    LIVE(d);
    int64_t n = p->n * p->c * p->oh * p->ow;
    if (n == 0) return 0;
    if (dt == OXD_F16) k_pool<__half><<<blocks_for(n, 256), 256, 0, d->stream>>>(*p, (const __half *)x, (__half *)y, n);
    else k_pool<float><<<blocks_for(n, 256), 256, 0, d->stream>>>(*p, (const float *)x, (float *)y, n);
    return ck_launch(d, "pool");
}

/* Softmax and reductions: one warp per (outer, inner) line of n elements, lanes striding the
 * line, warp-shuffle reductions; accumulation in float. */
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T>
__global__ void k_softmax(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, int lg)
{
    int64_t lines = outer * inner;
    int lane = threadIdx.x & 31;
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < lines;
         w += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        int64_t base = (w / inner) * n * inner + w % inner;
        float mx = -INFINITY;
        for (int64_t j = lane; j < n; j += 32) mx = fmaxf(mx, ldv(x, base + j * inner));
        mx = warp_max(mx);
        float s = 0.0f;
        for (int64_t j = lane; j < n; j += 32) s += expf(ldv(x, base + j * inner) - mx);
        s = warp_sum(s);
        float ls = logf(s);
        for (int64_t j = lane; j < n; j += 32) {
            float v = ldv(x, base + j * inner) - mx;
            stv(y, base + j * inner, lg ? v - ls : expf(v) / s);
        }
    }
}

static unsigned
warp_blocks(int64_t lines)
{
    return blocks_for(lines * 32, 256);
}

extern "C" int
oxd_softmax(oxd_t *d, int dt, const void *x, void *y, int64_t outer, int64_t n, int64_t inner, int lg)
{
    LIVE(d);
    if (outer * inner == 0) return 0;
    unsigned g = warp_blocks(outer * inner);
    if (dt == OXD_F16) k_softmax<__half><<<g, 256, 0, d->stream>>>((const __half *)x, (__half *)y, outer, n, inner, lg);
    else k_softmax<float><<<g, 256, 0, d->stream>>>((const float *)x, (float *)y, outer, n, inner, lg);
    return ck_launch(d, "softmax");
}

template <typename T>
__global__ void k_reduce(int op, const T *x, T *y, int64_t outer, int64_t n, int64_t inner)
{
    int64_t lines = outer * inner;
    int lane = threadIdx.x & 31;
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < lines;
         w += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        int64_t base = (w / inner) * n * inner + w % inner;
        float s = 0.0f, mx = -INFINITY;
        for (int64_t j = lane; j < n; j += 32) {
            float v = ldv(x, base + j * inner);
            s += v;
            mx = fmaxf(mx, v);
        }
        s = warp_sum(s);
        mx = warp_max(mx);
        if (lane == 0) stv(y, w, op == SP_OXG_RMAX ? mx : op == SP_OXG_RMEAN ? (n ? s / (float)n : NAN) : s);
    }
}

extern "C" int
oxd_reduce(oxd_t *d, int dt, int op, const void *x, void *y, int64_t outer, int64_t n, int64_t inner)
{
    LIVE(d);
    if (outer * inner == 0) return 0;
    unsigned g = warp_blocks(outer * inner);
    if (dt == OXD_F16) k_reduce<__half><<<g, 256, 0, d->stream>>>(op, (const __half *)x, (__half *)y, outer, n, inner);
    else k_reduce<float><<<g, 256, 0, d->stream>>>(op, (const float *)x, (float *)y, outer, n, inner);
    return ck_launch(d, "reduce");
}

/* One warp per row; mean first, then the centred variance (two passes, as the CPU). */
template <typename T>
__global__ void k_layernorm(const T *x, const T *scale, int64_t sstep, const T *bias, int64_t bstep, T *y, T *mo, T *io,
                            int64_t rows, int64_t cols, float eps)
{
    int lane = threadIdx.x & 31;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        const int64_t base = r * cols;
        float s = 0.0f;
        for (int64_t j = lane; j < cols; j += 32) s += ldv(x, base + j);
        float mean = warp_sum(s) / (float)cols;
        float q = 0.0f;
        for (int64_t j = lane; j < cols; j += 32) {
            float t = ldv(x, base + j) - mean;
            q += t * t;
        }
        float inv = rsqrtf(warp_sum(q) / (float)cols + eps);
        for (int64_t j = lane; j < cols; j += 32) {
            float v = (ldv(x, base + j) - mean) * inv * ldv(scale, j * sstep) + (bias ? ldv(bias, j * bstep) : 0.0f);
            stv(y, base + j, v);
        }
        if (lane == 0 && mo) stv(mo, r, mean);
        if (lane == 0 && io) stv(io, r, inv);
    }
}

extern "C" int
oxd_layernorm(oxd_t *d, int dt, const void *x, const void *scale, int64_t sstep, const void *bias, int64_t bstep,
              void *y, void *mean, void *inv, int64_t rows, int64_t cols, float eps)
{
    LIVE(d);
    if (rows * cols == 0) return 0;
    unsigned g = warp_blocks(rows);
    if (dt == OXD_F16) {
        k_layernorm<__half><<<g, 256, 0, d->stream>>>((const __half *)x, (const __half *)scale, sstep, (const __half *)bias, bstep,
                                                       (__half *)y, (__half *)mean, (__half *)inv, rows, cols, eps);
    } else {
        k_layernorm<float><<<g, 256, 0, d->stream>>>((const float *)x, (const float *)scale, sstep, (const float *)bias, bstep,
                                                      (float *)y, (float *)mean, (float *)inv, rows, cols, eps);
    }
    return ck_launch(d, "layernorm");
}

template <typename E>
__global__ void k_gather(const E *x, const int64_t *idx, E *y, int64_t n_axis, int64_t inner, int64_t n_idx, int64_t n)
{
    GRID_LOOP(i, n) {
        int64_t in = i % inner, j = (i / inner) % n_idx, o = i / (inner * n_idx);
        y[i] = x[(o * n_axis + idx[j]) * inner + in]; /* idx checked on the host */
    }
}

extern "C" int
oxd_gather(oxd_t *d, size_t elem, const void *x, const int64_t *idx, void *y, int64_t outer, int64_t n_axis,
           int64_t inner, int64_t n_idx)
{
    LIVE(d);
    int64_t n = outer * n_idx * inner;
    if (n == 0) return 0;
    unsigned g = blocks_for(n, 256);
    switch (elem) {
    case 2: k_gather<uint16_t><<<g, 256, 0, d->stream>>>((const uint16_t *)x, idx, (uint16_t *)y, n_axis, inner, n_idx, n); break;
    case 4: k_gather<uint32_t><<<g, 256, 0, d->stream>>>((const uint32_t *)x, idx, (uint32_t *)y, n_axis, inner, n_idx, n); break;
    case 8: k_gather<uint64_t><<<g, 256, 0, d->stream>>>((const uint64_t *)x, idx, (uint64_t *)y, n_axis, inner, n_idx, n); break;
    default: return set_err(d, "gather", "element size not 2, 4 or 8", 0);
    }
    return ck_launch(d, "gather");
}

/* Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets B first. */
extern "C" int
oxd_gemm(oxd_t *d, int dt, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
         int64_t lda, int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b, float beta, void *c,
         int64_t ldc, int64_t stride_c, int64_t batch)
{
    LIVE(d);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX || batch > INT_MAX) {
        return set_err(d, "gemm", "a dimension past cuBLAS's 32-bit range", 0);
    }
    cudaDataType_t t = dt == OXD_F16 ? CUDA_R_16F : CUDA_R_32F;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (batch == 1) {
        s = cublasGemmEx(d->blas, ob, oa, (int)n, (int)m, (int)k, &alpha, b, t, (int)ldb, a, t, (int)lda, &beta, c, t,
                         (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        s = cublasGemmStridedBatchedEx(d->blas, ob, oa, (int)n, (int)m, (int)k, &alpha, b, t, (int)ldb, stride_b, a, t,
                                       (int)lda, stride_a, &beta, c, t, (int)ldc, stride_c, (int)batch,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    return ck_blas(d, s, "gemm");
}

/* ---- convolution ---- */

typedef struct cplan {
    oxd_conv_t cv;
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnActivationDescriptor_t relu;
    cudnnConvolutionFwdAlgo_t algo;
} cplan_t;

extern "C" void
oxd_conv_plan_free(oxd_t *d, void *p)
{
    (void)d;
    cplan_t *c = (cplan_t *)p;
    if (c == NULL) return;
    if (c->x) cudnnDestroyTensorDescriptor(c->x);
    if (c->y) cudnnDestroyTensorDescriptor(c->y);
    if (c->b) cudnnDestroyTensorDescriptor(c->b);
    if (c->w) cudnnDestroyFilterDescriptor(c->w);
    if (c->conv) cudnnDestroyConvolutionDescriptor(c->conv);
    if (c->relu) cudnnDestroyActivationDescriptor(c->relu);
    free(c);
}

extern "C" int
oxd_conv_plan(oxd_t *d, const oxd_conv_t *cv, size_t ws_limit, int *algo, void **plan, size_t *ws_bytes)
{
    LIVE(d);
    *plan = NULL;
    *ws_bytes = 0;
    if (cv->n > INT_MAX || cv->c > INT_MAX || cv->h > INT_MAX || cv->w > INT_MAX || cv->k > INT_MAX) {
        return set_err(d, "conv", "a dimension past cuDNN's 32-bit range", 0);
    }
    cplan_t *c = (cplan_t *)calloc(1, sizeof *c);
    if (c == NULL) return set_err(d, "conv", "out of host memory", 0);
    c->cv = *cv;
    cudnnDataType_t t = cv->dt == OXD_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
    int on, oc, oh, ow;
    if (ck_dnn_plan(d, cudnnCreateTensorDescriptor(&c->x), "conv descriptor") ||
        ck_dnn_plan(d, cudnnCreateTensorDescriptor(&c->y), "conv descriptor") ||
        ck_dnn_plan(d, cudnnCreateTensorDescriptor(&c->b), "conv descriptor") ||
        ck_dnn_plan(d, cudnnCreateFilterDescriptor(&c->w), "conv descriptor") ||
        ck_dnn_plan(d, cudnnCreateConvolutionDescriptor(&c->conv), "conv descriptor") ||
        ck_dnn_plan(d, cudnnCreateActivationDescriptor(&c->relu), "conv descriptor") ||
        ck_dnn_plan(d, cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NCHW, t, (int)cv->n, (int)cv->c, (int)cv->h, (int)cv->w), "conv input") ||
        ck_dnn_plan(d, cudnnSetFilter4dDescriptor(c->w, t, CUDNN_TENSOR_NCHW, (int)cv->k, (int)(cv->c / cv->group), (int)cv->r, (int)cv->s), "conv filter") ||
        ck_dnn_plan(d, cudnnSetConvolution2dDescriptor(c->conv, (int)cv->pad_h, (int)cv->pad_w, (int)cv->sh, (int)cv->sw, (int)cv->dh, (int)cv->dw,
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), "conv descriptor") ||
        ck_dnn_plan(d, cudnnSetConvolutionGroupCount(c->conv, (int)cv->group), "conv group") ||
        /* FP32 stays FP32 (no TF32); FP16 may use tensor cores */
        ck_dnn_plan(d, cudnnSetConvolutionMathType(c->conv, cv->dt == OXD_F16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH), "conv math") ||
        ck_dnn_plan(d, cudnnGetConvolution2dForwardOutputDim(c->conv, c->x, c->w, &on, &oc, &oh, &ow), "conv output") ||
        ck_dnn_plan(d, cudnnSetActivationDescriptor(c->relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0), "conv relu")) {
        oxd_conv_plan_free(d, c);
        return -1;
    }
    if (on != cv->n || oc != cv->k || oh != cv->oh || ow != cv->ow) {
        oxd_conv_plan_free(d, c);
        return set_err(d, "conv", "cuDNN's output shape differs from the ONNX one (not supported)", 0);
    }
    if (ck_dnn_plan(d, cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NCHW, t, on, oc, oh, ow), "conv output") ||
        ck_dnn_plan(d, cudnnSetTensor4dDescriptor(c->b, CUDNN_TENSOR_NCHW, t, 1, oc, 1, 1), "conv bias")) {
        oxd_conv_plan_free(d, c);
        return -1;
    }
    if (*algo >= 0) {
        /* the algorithm measured for a similar shape (same layer, batch in the same bucket) */
        size_t ws = 0;
        c->algo = (cudnnConvolutionFwdAlgo_t)*algo;
        if (cudnnGetConvolutionForwardWorkspaceSize(d->dnn, c->x, c->w, c->conv, c->y, c->algo, &ws) == CUDNN_STATUS_SUCCESS &&
            ws <= ws_limit) {
            *ws_bytes = ws;
            *plan = c;
            return 0;
        }
        cudnnConvolutionFwdAlgoPerf_t h[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int got = 0;
        if (ck_dnn_plan(d, cudnnGetConvolutionForwardAlgorithm_v7(d->dnn, c->x, c->w, c->conv, c->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, h),
                        "cudnnGetConvolutionForwardAlgorithm_v7")) {
            oxd_conv_plan_free(d, c);
            return -1;
        }
        for (int i = 0; i < got; i++) {
            if (h[i].status == CUDNN_STATUS_SUCCESS && h[i].memory <= ws_limit) {
                c->algo = h[i].algo;
                *algo = (int)h[i].algo;
                *ws_bytes = h[i].memory;
                *plan = c;
                return 0;
            }
        }
        oxd_conv_plan_free(d, c);
        return set_err(d, "conv", "no cuDNN algorithm fits the workspace limit (not supported)", 0);
    }
    /* Measure every algorithm once for this shape (cuDNN runs them) and keep the fastest whose
     * workspace fits the limit. */
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    if (ck_dnn_plan(d, cudnnFindConvolutionForwardAlgorithm(d->dnn, c->x, c->w, c->conv, c->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf),
               "cudnnFindConvolutionForwardAlgorithm")) {
        oxd_conv_plan_free(d, c);
        return -1;
    }
    int pick = -1;
    for (int i = 0; i < got && pick < 0; i++) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_limit) pick = i;
    }
    if (pick < 0) {
        oxd_conv_plan_free(d, c);
        return set_err(d, "conv", "no cuDNN algorithm fits the workspace limit (not supported)", 0);
    }
    c->algo = perf[pick].algo;
    *algo = (int)perf[pick].algo;
    *ws_bytes = perf[pick].memory;
    *plan = c;
    return 0;
}

extern "C" int
oxd_conv(oxd_t *d, void *p, const void *x, const void *w, const void *bias, int relu, void *y, void *ws, size_t ws_bytes)
{
    LIVE(d);
    cplan_t *c = (cplan_t *)p;
    float one = 1.0f, zero = 0.0f;
    if (bias && relu) {
        /* y = relu(conv(x) + bias) in one call; z = y with weight 0, cleared first so that no
         * stale NaN in the pool buffer can leak through 0 * NaN */
        size_t bytes = (size_t)(c->cv.n * c->cv.k * c->cv.oh * c->cv.ow) * (c->cv.dt == OXD_F16 ? 2 : 4);
        if (ck_cuda(d, cudaMemsetAsync(y, 0, bytes, d->stream), "conv clear")) return -1;
        return ck_dnn(d, cudnnConvolutionBiasActivationForward(d->dnn, &one, c->x, x, c->w, w, c->conv, c->algo, ws, ws_bytes, &zero,
                                                               c->y, y, c->b, bias, c->relu, c->y, y),
                      "conv+bias+relu");
    }
    if (ck_dnn(d, cudnnConvolutionForward(d->dnn, &one, c->x, x, c->w, w, c->conv, c->algo, ws, ws_bytes, &zero, c->y, y), "conv")) {
        return -1;
    }
    if (bias && ck_dnn(d, cudnnAddTensor(d->dnn, &one, c->b, bias, &one, c->y, y), "conv bias")) return -1;
    if (relu && ck_dnn(d, cudnnActivationForward(d->dnn, c->relu, &one, c->y, y, &zero, c->y, y), "conv relu")) return -1;
    return 0;
}
