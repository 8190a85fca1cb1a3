/*
 * kernels.cu - the CUDA kernels of the engine's ops and their launchers.
 *
 * Every launcher enqueues on the given stream and returns the launch status
 * (cudaGetLastError); api.cu turns a failure into the context's error. The
 * semantics of each op are cuda_api.h's; indexing goes through
 * cuda_common.h so that host tests check the same index math.
 *
 * Precision: activations and every reduction in F32 (the CPU reference sums
 * in double); GEMM inputs and the attention output in F16; the KV cache in
 * the pool's type (F32 or F16). tests/gpu/kernel_test.c states the
 * tolerances that follow from this.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuda_common.h"
#include "cuda/kernels_cu.h"

#define WARP 32
#define FULL_MASK 0xffffffffu

static __device__ __forceinline__ float
h2f(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ uint16_t
f2h(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

static inline unsigned
blocks_for(int64_t n, int threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* ---------------------------------------------------------------- to_f16 */

__global__ void
to_f16_kernel(int type, const void *src, uint16_t *dst, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    float v;
    switch (type) {
    case SP_CU_F32:
        v = ((const float *)src)[i];
        break;
    case SP_CU_F16:
        dst[i] = ((const uint16_t *)src)[i];
        return;
    case SP_CU_BF16:
        v = sp_cu_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case SP_CU_Q8_0:
        v = sp_cu_q8_0_elem((const sp_cu_block_q8_0 *)src + i / SP_CU_QK, (int)(i % SP_CU_QK));
        break;
    default: /* SP_CU_Q4_0, checked by the launcher */
        v = sp_cu_q4_0_elem((const sp_cu_block_q4_0 *)src + i / SP_CU_QK, (int)(i % SP_CU_QK));
        break;
    }
    dst[i] = f2h(v);
}

cudaError_t
sp_cu_to_f16(cudaStream_t s, int type, const void *src, void *dst, int64_t n)
{
    to_f16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(type, src, (uint16_t *)dst, n);
    return cudaGetLastError();
}

/* ----------------------------------------------------------------- embed */

__global__ void
embed_kernel(const uint16_t *table, int64_t n_embd, const int32_t *tok, float *x)
{
    const int64_t t = blockIdx.x;
    const uint16_t *row = table + (int64_t)tok[t] * n_embd;
    for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) {
        x[t * n_embd + i] = h2f(row[i]);
    }
}

cudaError_t
sp_cu_embed(cudaStream_t s, const void *table, int64_t n_embd, const int32_t *tok, int64_t n_rows,
            float *x)
{
    embed_kernel<<<(unsigned)n_rows, 256, 0, s>>>((const uint16_t *)table, n_embd, tok, x);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ reductions */

static __device__ __forceinline__ float
warp_sum(float v)
{
    for (int off = WARP / 2; off > 0; off /= 2) {
        v += __shfl_xor_sync(FULL_MASK, v, off);
    }
    return v;
}

static __device__ __forceinline__ float
warp_max(float v)
{
    for (int off = WARP / 2; off > 0; off /= 2) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    }
    return v;
}

/* Sum (or max) over the block; blockDim.x a multiple of 32, at most 1024. */
static __device__ float
block_reduce(float v, bool is_max)
{
    __shared__ float part[32];
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) {
        part[w] = v;
    }
    __syncthreads();
    const int nw = blockDim.x / WARP;
    v = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}

/* ------------------------------------------------------------ add_rmsnorm */

__global__ void
add_rmsnorm_kernel(float *x, const float *add, const float *w, const int32_t *rows, int64_t n,
                   float eps, void *out, int out_f16)
{
    const int64_t i = blockIdx.x;
    const int64_t src = rows ? rows[i] : i;
    float *xr = x + src * n;
    float ss = 0.0f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        float v = xr[k];
        if (add) {
            v += add[src * n + k];
            xr[k] = v;
        }
        ss += v * v;
    }
    if (w == NULL) {
        return;
    }
    ss = block_reduce(ss, false);
    const float scale = rsqrtf(ss / (float)n + eps);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const float v = xr[k] * scale * w[k];
        if (out_f16) {
            ((uint16_t *)out)[i * n + k] = f2h(v);
        } else {
            ((float *)out)[i * n + k] = v;
        }
    }
}

cudaError_t
sp_cu_add_rmsnorm(cudaStream_t s, float *x, const float *add, const float *w, const int32_t *rows,
                  int64_t n_rows, int64_t n, float eps, void *out, int out_f16)
{
    add_rmsnorm_kernel<<<(unsigned)n_rows, 256, 0, s>>>(x, add, w, rows, n, eps, out, out_f16);
    return cudaGetLastError();
}

/* ---------------------------------------------------------- head_rmsnorm */

/* One warp per (row, head): heads are short (64..256), a warp's shuffles
 * sum them without shared memory. */
#define HN_WARPS 4

__global__ void
head_rmsnorm_kernel(float *v, int64_t n_total, int64_t head_dim, const float *w, float eps)
{
    const int64_t hidx = (int64_t)blockIdx.x * HN_WARPS + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (hidx >= n_total) {
        return; /* the whole warp leaves together */
    }
    float *x = v + hidx * head_dim;
    float ss = 0.0f;
    for (int64_t k = lane; k < head_dim; k += WARP) {
        ss += x[k] * x[k];
    }
    ss = warp_sum(ss);
    const float scale = rsqrtf(ss / (float)head_dim + eps);
    for (int64_t k = lane; k < head_dim; k += WARP) {
        x[k] = x[k] * scale * w[k];
    }
}

cudaError_t
sp_cu_head_rmsnorm(cudaStream_t s, float *v, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                   const float *w, float eps)
{
    const int64_t n_total = n_rows * n_heads;
    head_rmsnorm_kernel<<<blocks_for(n_total, HN_WARPS), HN_WARPS * WARP, 0, s>>>(
        v, n_total, head_dim, w, eps);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ bias */

__global__ void
bias_kernel(float *y, const float *bias, int64_t n_out, int64_t total)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        y[i] += bias[i % n_out];
    }
}

cudaError_t
sp_cu_bias(cudaStream_t s, float *y, const float *bias, int64_t n_rows, int64_t n_out)
{
    const int64_t total = n_rows * n_out;
    bias_kernel<<<blocks_for(total, 256), 256, 0, s>>>(y, bias, n_out, total);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ rope */

__global__ void
rope_cs_kernel(const int32_t *pos, const float *inv_freq, int64_t half, double mscale, float *cs,
               int64_t total)
{
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= total) {
        return;
    }
    const int64_t t = k / half, i = k % half;
    /* In double as on the CPU (batch.c): the angle of a long position must
     * not depend on float rounding; the attention factor multiplies before
     * the one rounding to float, as there. */
    const double theta = (double)pos[t] * (double)inv_freq[i];
    cs[t * 2 * half + 2 * i] = (float)(cos(theta) * mscale);
    cs[t * 2 * half + 2 * i + 1] = (float)(sin(theta) * mscale);
}

cudaError_t
sp_cu_rope_cs(cudaStream_t s, const int32_t *pos, int64_t n_rows, const float *inv_freq,
              int64_t n_rot, double mscale, float *cs)
{
    const int64_t total = n_rows * (n_rot / 2);
    if (total == 0) {
        return cudaSuccess;
    }
    rope_cs_kernel<<<blocks_for(total, 256), 256, 0, s>>>(pos, inv_freq, n_rot / 2, mscale, cs,
                                                          total);
    return cudaGetLastError();
}

__global__ void
rope_kernel(float *v, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs, int neox,
            int64_t total)
{
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= total) {
        return;
    }
    const int64_t half = n_rot / 2;
    const int64_t i = k % half, h = (k / half) % n_heads, t = k / (half * n_heads);
    int64_t a, b;
    sp_cu_rope_pair(i, n_rot, neox, &a, &b);
    float *x = v + (t * n_heads + h) * head_dim;
    const float c = cs[t * n_rot + 2 * i], sn = cs[t * n_rot + 2 * i + 1];
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * sn;
    x[b] = x0 * sn + x1 * c;
}

cudaError_t
sp_cu_rope(cudaStream_t s, float *v, int64_t n_rows, int64_t n_heads, int64_t head_dim,
           int64_t n_rot, const float *cs, int neox)
{
    const int64_t total = n_rows * n_heads * (n_rot / 2);
    if (total == 0) {
        return cudaSuccess;
    }
    rope_kernel<<<blocks_for(total, 256), 256, 0, s>>>(v, n_heads, head_dim, n_rot, cs, neox,
                                                       total);
    return cudaGetLastError();
}

/* -------------------------------------------------------------- kv_write */

template <typename T>
static __device__ __forceinline__ void
store(T *p, float v);
template <>
__device__ __forceinline__ void
store<float>(float *p, float v)
{
    *p = v;
}
template <>
__device__ __forceinline__ void
store<uint16_t>(uint16_t *p, float v)
{
    *p = f2h(v);
}

template <typename T>
static __device__ __forceinline__ float
load(const T *p);
template <>
__device__ __forceinline__ float
load<float>(const float *p)
{
    return *p;
}
template <>
__device__ __forceinline__ float
load<uint16_t>(const uint16_t *p)
{
    return h2f(*p);
}

template <typename T>
__global__ void
kv_write_kernel(sp_cu_kv_args_t kv, int64_t il, const float *k, const float *v,
                sp_cu_rows_args_t r, int64_t total)
{
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) {
        return;
    }
    const int64_t hd = kv.head_dim, kv_dim = kv.n_head_kv * hd;
    const int64_t t = e / kv_dim, g = (e % kv_dim) / hd, d = e % hd;
    const int64_t pos = r.pos[t];
    const int64_t block = r.btab[r.bt[t] + pos / SP_CU_KV_BLOCK];
    const int64_t lane = pos % SP_CU_KV_BLOCK;
    T *tile = (T *)kv.data +
              sp_cu_kv_tile(block, il, g, kv.n_head_kv, kv.tile_elems, kv.block_elems);
    store<T>(tile + sp_cu_key_in_tile(lane, d), k[t * kv_dim + g * hd + d]);
    store<T>(tile + sp_cu_val_in_tile(lane, d, hd, kv.tile_elems), v[t * kv_dim + g * hd + d]);
}

cudaError_t
sp_cu_kv_write(cudaStream_t s, const sp_cu_kv_args_t *kv, int64_t il, const float *k,
               const float *v, const sp_cu_rows_args_t *r)
{
    const int64_t total = r->n_rows * kv->n_head_kv * kv->head_dim;
    if (kv->f16) {
        kv_write_kernel<uint16_t><<<blocks_for(total, 256), 256, 0, s>>>(*kv, il, k, v, *r, total);
    } else {
        kv_write_kernel<float><<<blocks_for(total, 256), 256, 0, s>>>(*kv, il, k, v, *r, total);
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------- attention */

/*
 * One thread block per (row, query head), ATTN_WARPS warps. Warp w takes the
 * KV blocks w, w + ATTN_WARPS, ... of the row's sequence, in order, and keeps
 * an online softmax (running max m, running sum l, running weighted sum of
 * values acc). Scores of one KV block: lane l computes position l % 16 over
 * the dims of parity l / 16 (the keys are transposed, so the 16 lanes of a
 * half-warp read 16 consecutive elements), the halves add up by a shuffle.
 * Values: lane l owns dims l, l + 32, ... (a row of values is contiguous).
 * At the end the warps' (m, l, acc) are merged through shared memory.
 */
#define ATTN_WARPS 4
#define ATTN_DPL (SP_CU_MAX_HEAD_DIM / WARP) /* value dims per lane */

template <typename T>
__global__ void __launch_bounds__(ATTN_WARPS *WARP)
attn_kernel(sp_cu_kv_args_t kv, int64_t il, const float *q, int64_t n_head, float scale,
            int64_t window, float softcap, const float *sinks, sp_cu_rows_args_t r,
            uint16_t *out)
{
    __shared__ float sq[SP_CU_MAX_HEAD_DIM];
    __shared__ float sm[ATTN_WARPS], sl[ATTN_WARPS];
    __shared__ float sacc[ATTN_WARPS][SP_CU_MAX_HEAD_DIM];

    const int64_t t = blockIdx.x, h = blockIdx.y;
    const int64_t hd = kv.head_dim;
    const int64_t g = h / (n_head / kv.n_head_kv);
    const int64_t n_kv = (int64_t)r.pos[t] + 1;
    const int64_t n_blk = (n_kv + SP_CU_KV_BLOCK - 1) / SP_CU_KV_BLOCK;
    /* A sliding window: positions before lo are never read (their blocks
     * may hold anything), the blocks before lo's not even visited. */
    const int64_t lo = sp_cu_attn_first(n_kv - 1, window);
    const int64_t blk0 = lo / SP_CU_KV_BLOCK;
    const int32_t *table = r.btab + r.bt[t];
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;

    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
        sq[d] = q[(t * n_head + h) * hd + d];
    }
    __syncthreads();

    float m = -INFINITY, l = 0.0f;
    float acc[ATTN_DPL];
#pragma unroll
    for (int i = 0; i < ATTN_DPL; i++) {
        acc[i] = 0.0f;
    }
    const int p_lane = lane % SP_CU_KV_BLOCK;
    for (int64_t jb = blk0 + w; jb < n_blk; jb += ATTN_WARPS) {
        const T *tile = (const T *)kv.data + sp_cu_kv_tile(table[jb], il, g, kv.n_head_kv,
                                                           kv.tile_elems, kv.block_elems);
        float s = 0.0f;
        for (int64_t d = lane / SP_CU_KV_BLOCK; d < hd; d += 2) {
            s += sq[d] * load<T>(tile + sp_cu_key_in_tile(p_lane, d));
        }
        s += __shfl_xor_sync(FULL_MASK, s, 16);
        s *= scale;
        if (softcap > 0.0f) {
            s = softcap * tanhf(s / softcap); /* kernels.h sp_attn_softcap */
        }
        const int64_t p_here = jb * SP_CU_KV_BLOCK + p_lane;
        const bool valid = p_here >= lo && p_here < n_kv;
        if (!valid) {
            s = -INFINITY;
        }
        /* Every visited block holds a valid position (lo's block holds lo, a
         * later one its first), so the block max is finite. */
        const float m_new = fmaxf(m, warp_max(s));
        const float corr = expf(m - m_new); /* 0 on the first block (m = -inf) */
        const float e = valid ? expf(s - m_new) : 0.0f;
        /* Both half-warps hold the same 16 values: half the warp sum. */
        l = l * corr + 0.5f * warp_sum(e);
#pragma unroll
        for (int i = 0; i < ATTN_DPL; i++) {
            acc[i] *= corr;
        }
        const int64_t n_here = n_kv - jb * SP_CU_KV_BLOCK < SP_CU_KV_BLOCK
                                   ? n_kv - jb * SP_CU_KV_BLOCK
                                   : SP_CU_KV_BLOCK;
        const int p_lo = jb == blk0 ? (int)(lo - blk0 * SP_CU_KV_BLOCK) : 0;
        for (int pp = p_lo; pp < n_here; pp++) {
            const float wgt = __shfl_sync(FULL_MASK, e, pp);
#pragma unroll
            for (int i = 0; i < ATTN_DPL; i++) {
                const int64_t d = lane + WARP * i;
                if (d < hd) {
                    acc[i] += wgt * load<T>(tile + sp_cu_val_in_tile(pp, d, hd, kv.tile_elems));
                }
            }
        }
        m = m_new;
    }
    if (lane == 0) {
        sm[w] = m;
        sl[w] = l;
    }
#pragma unroll
    for (int i = 0; i < ATTN_DPL; i++) {
        const int64_t d = lane + WARP * i;
        if (d < hd) {
            sacc[w][d] = acc[i];
        }
    }
    __syncthreads();
    /* A sink (gpt-oss) joins the max and the denominator, with no value. */
    const float sink = sinks != NULL ? sinks[h] : -INFINITY;
    float mx = sink;
    for (int k = 0; k < ATTN_WARPS; k++) {
        mx = fmaxf(mx, sm[k]);
    }
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f, den = sinks != NULL ? expf(sink - mx) : 0.0f;
        for (int k = 0; k < ATTN_WARPS; k++) {
            if (sm[k] != -INFINITY) { /* a warp that had no block */
                const float c = expf(sm[k] - mx);
                num += c * sacc[k][d];
                den += c * sl[k];
            }
        }
        out[(t * n_head + h) * hd + d] = f2h(num / den);
    }
}

cudaError_t
sp_cu_attn(cudaStream_t s, const sp_cu_kv_args_t *kv, int64_t il, const float *q, int64_t n_head,
           float scale, int64_t window, float softcap, const float *sinks,
           const sp_cu_rows_args_t *r, void *out)
{
    dim3 grid((unsigned)r->n_rows, (unsigned)n_head);
    if (kv->f16) {
        attn_kernel<uint16_t><<<grid, ATTN_WARPS * WARP, 0, s>>>(
            *kv, il, q, n_head, scale, window, softcap, sinks, *r, (uint16_t *)out);
    } else {
        attn_kernel<float><<<grid, ATTN_WARPS * WARP, 0, s>>>(
            *kv, il, q, n_head, scale, window, softcap, sinks, *r, (uint16_t *)out);
    }
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- swiglu */

__global__ void
swiglu_kernel(const float *g, const float *u, int64_t n, uint16_t *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = f2h(sp_cu_silu_mul(g[i], u[i], expf(-g[i])));
    }
}

cudaError_t
sp_cu_swiglu(cudaStream_t s, const float *g, const float *u, int64_t n, void *out)
{
    swiglu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(g, u, n, (uint16_t *)out);
    return cudaGetLastError();
}

/* -------------------------------------------------------------- gelu_mul */

__global__ void
gelu_mul_kernel(const float *g, const float *u, int64_t n, uint16_t *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = f2h(sp_cu_gelu_mul(g[i], u[i], tanhf(sp_cu_gelu_arg(g[i]))));
    }
}

cudaError_t
sp_cu_gelu_mul(cudaStream_t s, const float *g, const float *u, int64_t n, void *out)
{
    gelu_mul_kernel<<<blocks_for(n, 256), 256, 0, s>>>(g, u, n, (uint16_t *)out);
    return cudaGetLastError();
}

/* --------------------------------------------------------------- softcap */

__global__ void
softcap_kernel(float *x, int64_t n, float cap)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = cap * tanhf(x[i] / cap);
    }
}

cudaError_t
sp_cu_softcap(cudaStream_t s, float *x, int64_t n, float cap)
{
    softcap_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, n, cap);
    return cudaGetLastError();
}

/* ----------------------------------------------------------------- scale */

__global__ void
scale_kernel(float *x, int64_t n, float f)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] *= f;
    }
}

cudaError_t
sp_cu_scale(cudaStream_t s, float *x, int64_t n, float f)
{
    scale_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, n, f);
    return cudaGetLastError();
}

/* --------------------------------------------------------------- softmax */

__global__ void
softmax_kernel(float *x, int64_t n)
{
    float *row = x + (int64_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        mx = fmaxf(mx, row[k]);
    }
    mx = block_reduce(mx, true);
    float sum = 0.0f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const float e = expf(row[k] - mx);
        row[k] = e;
        sum += e;
    }
    sum = block_reduce(sum, false);
    const float inv = 1.0f / sum;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        row[k] *= inv;
    }
}

cudaError_t
sp_cu_softmax(cudaStream_t s, float *x, int64_t n_rows, int64_t n)
{
    softmax_kernel<<<(unsigned)n_rows, 256, 0, s>>>(x, n);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ topk */

/* Order of the selection: a before b when a's value is larger, or equal with
 * a lower index. NaNs are treated as -inf (never chosen before a number). */
static __device__ __forceinline__ bool
before(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

/*
 * One block per row, k passes: pass j finds the first element (in the order
 * above) that comes after the one pass j-1 chose. O(k n) reads, no scratch
 * and no sort: k is small (greedy is k = 1, sampling's top-k at most 64).
 */
__global__ void
topk_kernel(const float *x, int64_t n, int k, int32_t *idx, float *val)
{
    __shared__ float bv[32];
    __shared__ int32_t bi[32];
    const float *row = x + (int64_t)blockIdx.x * n;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    float pv = INFINITY;
    int32_t pi = -1; /* the previous choice; (inf, -1) comes before everything */
    for (int j = 0; j < k; j++) {
        float v = -INFINITY;
        int32_t vi = INT32_MAX;
        for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
            float xv = row[e];
            if (xv != xv) {
                xv = -INFINITY;
            }
            if (before(pv, pi, xv, (int32_t)e) && before(xv, (int32_t)e, v, vi)) {
                v = xv;
                vi = (int32_t)e;
            }
        }
        for (int off = WARP / 2; off > 0; off /= 2) {
            const float ov = __shfl_xor_sync(FULL_MASK, v, off);
            const int32_t oi = __shfl_xor_sync(FULL_MASK, vi, off);
            if (before(ov, oi, v, vi)) {
                v = ov;
                vi = oi;
            }
        }
        __syncthreads();
        if (lane == 0) {
            bv[w] = v;
            bi[w] = vi;
        }
        __syncthreads();
        v = -INFINITY;
        vi = INT32_MAX;
        for (int q = 0; q < nw; q++) {
            if (before(bv[q], bi[q], v, vi)) {
                v = bv[q];
                vi = bi[q];
            }
        }
        if (threadIdx.x == 0) {
            idx[(int64_t)blockIdx.x * k + j] = vi < (int32_t)n ? vi : -1;
            val[(int64_t)blockIdx.x * k + j] = v;
        }
        pv = v;
        pi = vi;
    }
}

cudaError_t
sp_cu_topk(cudaStream_t s, const float *x, int64_t n_rows, int64_t n, int k, int32_t *idx,
           float *val)
{
    topk_kernel<<<(unsigned)n_rows, 256, 0, s>>>(x, n, k, idx, val);
    return cudaGetLastError();
}

/* ------------------------------------------------- quantised weights */

__global__ void
qsplit_to_f16_kernel(int type, const void *src, uint16_t *dst, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        dst[i] = f2h(sp_cu_qsplit_elem(type, src, n, i));
    }
}

cudaError_t
sp_cu_qsplit_to_f16(cudaStream_t s, int type, const void *src, void *dst, int64_t n)
{
    qsplit_to_f16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(type, src, (uint16_t *)dst, n);
    return cudaGetLastError();
}

/*
 * gemv_q: one warp per output row o, GEMV_WARPS rows per thread block, R
 * activation rows (1..8, a template parameter so the accumulators stay in
 * registers). The weights are read once, 16 bytes per lane per load, so a
 * warp's load is 512 contiguous bytes: Q8_0 takes 16 quants per lane (half a
 * block; the two lanes of a block read the same scale), Q4_0 a whole block
 * (32 nibbles). The activations are F16 and read from L1/L2 (every warp of
 * the grid reads the same R rows). The products q * x add up in F32 and are
 * scaled once per 16 (Q8_0) or 32 (Q4_0) elements, then summed over the warp.
 */
#define GEMV_WARPS 4

static __device__ __forceinline__ void
load_x8(const uint16_t *__restrict__ x, float *f)
{
    const uint4 v = __ldg((const uint4 *)x);
    const __half2 *h = (const __half2 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 p = __half22float2(h[k]);
        f[2 * k] = p.x;
        f[2 * k + 1] = p.y;
    }
}

template <int R>
__global__ void __launch_bounds__(GEMV_WARPS *WARP)
gemv_q8_kernel(const int8_t *__restrict__ qs, const uint16_t *__restrict__ sc, int64_t n_out,
               int64_t n_in, const uint16_t *__restrict__ x, float *__restrict__ y,
               const float *__restrict__ bias)
{
    const int lane = threadIdx.x % WARP;
    const int64_t o = (int64_t)blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (o >= n_out) {
        return; /* the whole warp: no shuffle is left waiting */
    }
    const int8_t *row = qs + o * n_in;
    const uint16_t *srow = sc + o * (n_in / SP_CU_QK);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        acc[r] = 0.0f;
    }
#pragma unroll 2
    for (int64_t e = (int64_t)lane * 16; e < n_in; e += WARP * 16) {
        const int4 qv = __ldg((const int4 *)(row + e));
        const int8_t *q = (const int8_t *)&qv;
        const float d = h2f(__ldg(srow + e / SP_CU_QK));
#pragma unroll
        for (int r = 0; r < R; r++) {
            float xf[16];
            load_x8(x + r * n_in + e, xf);
            load_x8(x + r * n_in + e + 8, xf + 8);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; k++) {
                s += (float)q[k] * xf[k];
            }
            acc[r] += d * s;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) {
            y[r * n_out + o] = v + (bias ? bias[o] : 0.0f);
        }
    }
}

template <int R>
__global__ void __launch_bounds__(GEMV_WARPS *WARP)
gemv_q4_kernel(const uint8_t *__restrict__ qs, const uint16_t *__restrict__ sc, int64_t n_out,
               int64_t n_in, const uint16_t *__restrict__ x, float *__restrict__ y,
               const float *__restrict__ bias)
{
    const int lane = threadIdx.x % WARP;
    const int64_t o = (int64_t)blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (o >= n_out) {
        return;
    }
    const int64_t nb = n_in / SP_CU_QK;
    const uint8_t *row = qs + o * (n_in / 2);
    const uint16_t *srow = sc + o * nb;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        acc[r] = 0.0f;
    }
#pragma unroll 2
    for (int64_t b = lane; b < nb; b += WARP) {
        const uint4 qv = __ldg((const uint4 *)(row + b * 16));
        const uint8_t *q = (const uint8_t *)&qv;
        const float d = h2f(__ldg(srow + b));
        const int64_t e = b * SP_CU_QK;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float lo[16], hi[16];
            load_x8(x + r * n_in + e, lo);
            load_x8(x + r * n_in + e + 8, lo + 8);
            load_x8(x + r * n_in + e + 16, hi);
            load_x8(x + r * n_in + e + 24, hi + 8);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; k++) {
                s += (float)((int)(q[k] & 0x0f) - 8) * lo[k] + (float)((int)(q[k] >> 4) - 8) * hi[k];
            }
            acc[r] += d * s;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) {
            y[r * n_out + o] = v + (bias ? bias[o] : 0.0f);
        }
    }
}

template <int R>
static void
gemv_launch(cudaStream_t s, int type, const void *w, int64_t n_out, int64_t n_in,
            const uint16_t *x, float *y, const float *bias)
{
    const int64_t n = n_out * n_in;
    const uint16_t *sc = (const uint16_t *)((const char *)w + sp_cu_qsplit_scales_off(type, n));
    const unsigned grid = (unsigned)((n_out + GEMV_WARPS - 1) / GEMV_WARPS);
    if (type == SP_CU_Q8_0) {
        gemv_q8_kernel<R><<<grid, GEMV_WARPS * WARP, 0, s>>>((const int8_t *)w, sc, n_out, n_in, x,
                                                             y, bias);
    } else {
        gemv_q4_kernel<R><<<grid, GEMV_WARPS * WARP, 0, s>>>((const uint8_t *)w, sc, n_out, n_in,
                                                             x, y, bias);
    }
}

cudaError_t
sp_cu_gemv_q(cudaStream_t s, int type, const void *w, int64_t n_out, int64_t n_in, const void *x,
             int64_t n_rows, float *y, const float *bias)
{
    const uint16_t *xh = (const uint16_t *)x;
    switch (n_rows) {
    case 1: gemv_launch<1>(s, type, w, n_out, n_in, xh, y, bias); break;
    case 2: gemv_launch<2>(s, type, w, n_out, n_in, xh, y, bias); break;
    case 3: gemv_launch<3>(s, type, w, n_out, n_in, xh, y, bias); break;
    case 4: gemv_launch<4>(s, type, w, n_out, n_in, xh, y, bias); break;
    case 5: gemv_launch<5>(s, type, w, n_out, n_in, xh, y, bias); break;
    case 6: gemv_launch<6>(s, type, w, n_out, n_in, xh, y, bias); break;
    case 7: gemv_launch<7>(s, type, w, n_out, n_in, xh, y, bias); break;
    default: gemv_launch<8>(s, type, w, n_out, n_in, xh, y, bias); break;
    }
    return cudaGetLastError();
}
