/*
 * avx512_attn.c - AVX-512 attention over an F32, F16 or Q8_0 KV cache, vector
 * exp, RMSNorm and SwiGLU.
 *
 * Attention, per call (one token, the n_q query heads of one KV head), in
 * three passes so every cache row is read once per pass for all n_q heads:
 *   1. scores: one block of 16 positions at a time (keys stored transposed,
 *      see kernels.h): per head, 16 lanes of q[d] * k[.][d] FMAs, one load
 *      of the key block shared by up to 8 heads, no horizontal sums. Lanes
 *      past n_kv are computed and ignored.
 *   2. per head: max, e = exp(s - max) with the polynomial exp, sum.
 *   3. o_h = (sum_p e_p v_p) / sum: up to 4 heads x 64 dims of accumulators
 *      stay in registers while the rows stream by, one broadcast FMA each.
 * Every score, exp, sum and output element of a head goes through the same
 * operations in the same order whatever n_q is and whichever tile it lands
 * in, so results are batch-invariant. Chunks of head_dim past the end are
 * masked in the value pass (zero in, nothing out), so any head_dim works.
 * A Q8_0 cache is dequantised in registers (int8 widened, times the F16
 * scale: exact), then the same FMAs run as over an F32 cache.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/attn_pf.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define SP_INLINE static inline __attribute__((always_inline))

SP_INLINE __m512
exp512(__m512 x)
{
    /* max/min return their second operand when one is NaN: NaN passes. */
    x = _mm512_max_ps(_mm512_set1_ps(SP_EXP_LO), x);
    x = _mm512_min_ps(_mm512_set1_ps(SP_EXP_HI), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SP_EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SP_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SP_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(SP_EXP_P5);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SP_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SP_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SP_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SP_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SP_EXP_P0));
    const __m512 y =
        _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    /* scalef rounds once into the denormal range and overflows to inf. */
    return _mm512_scalef_ps(y, n);
}

SP_INLINE __mmask16
tail_mask(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* 16 floats of the cache from element i, masked; F16 is widened. */
SP_INLINE __m512
load_kv(const void *base, int f16, int64_t i, __mmask16 m)
{
    if (f16) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const sp_fp16_t *)base + i));
    }
    return _mm512_maskz_loadu_ps(m, (const float *)base + i);
}

SP_INLINE __m512
load_k16(const void *base, int f16, int64_t i)
{
    if (f16) {
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const sp_fp16_t *)base + i)));
    }
    return _mm512_loadu_ps((const float *)base + i);
}

/* Row d of a Q8_0 key tile (16 int8 lanes), dequantised with the lanes'
 * scales sv: exact, the F32 keys these numbers stand for. */
SP_INLINE __m512
load_kq8(const char *kb, int64_t d, __m512 sv)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)(kb + d * 16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), sv);
}

/* Pass 1 over a Q8_0 key block: as scores_block, the two chains of even and
 * odd d, group by group (groups start at even d, so a pair never straddles
 * two scales). */
SP_INLINE void
scores_block_q8(const sp_attn_args_t *a, int64_t p0, int64_t h0, int NH, const attn_pf_t *pf)
{
    const int64_t hd = a->head_dim, ss = sp_attn_scratch_stride(a->n_kv);
    const char *kb = attn_kv_ptr(a->k, 2, a->blocks[p0 / 16] * a->k_block_stride);
    const float *q[8];
    __m512 acc0[8], acc1[8];
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++) {
        q[h] = a->q + (h0 + h) * a->q_stride;
        acc0[h] = _mm512_setzero_ps();
        acc1[h] = _mm512_setzero_ps();
    }
    for (int64_t g0 = 0; g0 < hd; g0 += 32) {
        const __m512 sv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kb + 16 * hd + g0)));
        const int64_t g1 = g0 + 32 < hd ? g0 + 32 : hd;
        int64_t d = g0;
        for (; d + 2 <= g1; d += 2) {
            attn_pf_step(pf, d);
            attn_pf_step(pf, d + 1);
            const __m512 k0 = load_kq8(kb, d, sv);
            const __m512 k1 = load_kq8(kb, d + 1, sv);
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) {
                acc0[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d]), k0, acc0[h]);
                acc1[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d + 1]), k1, acc1[h]);
            }
        }
        if (d < g1) {
            attn_pf_step(pf, d);
            const __m512 k0 = load_kq8(kb, d, sv);
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) {
                acc0[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d]), k0, acc0[h]);
            }
        }
    }
    attn_pf_rest(pf, hd);
    const __m512 scale = _mm512_set1_ps(a->scale);
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++) {
        _mm512_store_ps(a->scratch + (h0 + h) * ss + p0,
                        _mm512_mul_ps(_mm512_add_ps(acc0[h], acc1[h]), scale));
    }
}

/*
 * Pass 1 for the block of 16 positions at p0 and NH (<= 8) heads from h0:
 * lane j of head h's accumulators sums q_h[d] * k[p0 + j][d], even d in one
 * and odd d in the other (two chains keep the FMA units busy even for one
 * head), then scores = (even + odd) * scale.
 */
SP_INLINE void
scores_block(const sp_attn_args_t *a, int f16, int64_t p0, int64_t h0, int NH,
             const attn_pf_t *pf)
{
    const int64_t hd = a->head_dim, ss = sp_attn_scratch_stride(a->n_kv);
    const void *kb = attn_kv_ptr(a->k, f16, a->blocks[p0 / 16] * a->k_block_stride);
    const float *q[8];
    __m512 acc0[8], acc1[8];
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++) {
        q[h] = a->q + (h0 + h) * a->q_stride;
        acc0[h] = _mm512_setzero_ps();
        acc1[h] = _mm512_setzero_ps();
    }
    int64_t d = 0;
    for (; d + 2 <= hd; d += 2) {
        attn_pf_step(pf, d);
        attn_pf_step(pf, d + 1);
        const __m512 k0 = load_k16(kb, f16, d * 16);
        const __m512 k1 = load_k16(kb, f16, d * 16 + 16);
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            acc0[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d]), k0, acc0[h]);
            acc1[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d + 1]), k1, acc1[h]);
        }
    }
    if (d < hd) {
        attn_pf_step(pf, d);
        const __m512 k0 = load_k16(kb, f16, d * 16);
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            acc0[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d]), k0, acc0[h]);
        }
    }
    attn_pf_rest(pf, hd);
    const __m512 scale = _mm512_set1_ps(a->scale);
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++) {
        _mm512_store_ps(a->scratch + (h0 + h) * ss + p0,
                        _mm512_mul_ps(_mm512_add_ps(acc0[h], acc1[h]), scale));
    }
}

/* Lanes p + i in [lo, n). */
SP_INLINE __mmask16
range_mask(int64_t p, int64_t lo, int64_t n)
{
    /* tail_mask takes n >= 0 only (a negative shift is undefined). */
    return (__mmask16)(tail_mask(n - p) & ~tail_mask(lo > p ? lo - p : 0));
}

/* Pass 2 for one head over positions lo..n-1 (lo: sp_attn_first): the
 * soft-cap (scalar, kernels.h's rule), then e = exp(s - max) in place (max
 * and sum with the sink when there is one); returns 1 / sum. */
SP_INLINE float
softmax_row(float *sc, int64_t lo, int64_t n, float softcap, const float *sink)
{
    if (softcap > 0.0f) {
        for (int64_t p = lo; p < n; p++) {
            sc[p] = sp_attn_softcap(sc[p], softcap);
        }
    }
    const int64_t p_start = lo & ~(int64_t)15;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t p = p_start; p < n; p += 16) {
        mx = _mm512_mask_max_ps(mx, range_mask(p, lo, n), mx, _mm512_load_ps(sc + p));
    }
    float mxs = _mm512_reduce_max_ps(mx);
    if (sink != NULL && *sink > mxs) {
        mxs = *sink;
    }
    const __m512 mv = _mm512_set1_ps(mxs);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t p = p_start; p < n; p += 16) {
        const __mmask16 m = range_mask(p, lo, n);
        const __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_load_ps(sc + p), mv)));
        _mm512_store_ps(sc + p, e);
        sum = _mm512_add_ps(sum, e);
    }
    return 1.0f / (_mm512_reduce_add_ps(sum) + (sink != NULL ? expf(*sink - mxs) : 0.0f));
}

/* Pass 1 prefetches the cache as attn_pf.h says; when the values do not fit V_L2_BYTES, pass
 * 3's first head group asks for them AV_AHEAD positions ahead of its reads. */
#ifndef AV_AHEAD
#define AV_AHEAD 64
#endif

/* Pass 3's prefetch (long contexts, attn_512): the columns d0..d0+63 of row p's value into L1,
 * when there is such a row. */
SP_INLINE void
av_prefetch_row(const sp_attn_args_t *a, int kind, int64_t p, int64_t d0)
{
    if (p >= a->n_kv) {
        return;
    }
    const int64_t hd = a->head_dim, nd = hd - d0 < 64 ? hd - d0 : 64;
    const int64_t lo = kind == 2 ? (d0 / 32) * 34 : d0 * attn_kv_elt(kind);
    const int64_t n = kind == 2 ? ((nd + 31) / 32) * 34 : nd * attn_kv_elt(kind);
    const char *row = attn_kv_ptr(a->v, kind, a->blocks[p >> 4] * a->v_block_stride) +
                      (p & 15) * attn_row_step(a, kind);
    attn_prefetch_bytes(row + lo, n, 0);
}

/* Pass 3 for NH heads from h0 and dims d0..d0+63: o = inv * sum_p e_p v_p;
 * pf: ask for the row AV_AHEAD positions on as each row is read. */
SP_INLINE void
av_tile(const sp_attn_args_t *a, int f16, const float *inv, int64_t h0, int NH, int64_t d0,
        int pf)
{
    const int64_t ss = sp_attn_scratch_stride(a->n_kv);
    __mmask16 m[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        m[c] = d0 + 16 * c < a->head_dim ? tail_mask(a->head_dim - d0 - 16 * c) : 0;
    }
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            acc[h][c] = _mm512_setzero_ps();
        }
    }
    /* Positions in order, block by block: the same FMA chain as one
     * contiguous cache; the block's base is looked up once per 16 rows. */
    const float *e = a->scratch + h0 * ss;
    const void *vb = a->v;
    const int64_t lo = sp_attn_first(a);
    for (int64_t p = lo; p < a->n_kv; p++) {
        if ((p & 15) == 0 || p == lo) {
            vb = attn_kv_ptr(a->v, f16, a->blocks[p >> 4] * a->v_block_stride);
        }
        if (pf) {
            av_prefetch_row(a, f16, p + AV_AHEAD, d0);
        }
        const int64_t row = (p & 15) * a->v_stride + d0;
        __m512 v[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            v[c] = load_kv(vb, f16, row + 16 * c, m[c]);
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            const __m512 w = _mm512_set1_ps(e[h * ss + p]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        float *o = a->o + (h0 + h) * a->o_stride + d0;
        const __m512 s = _mm512_set1_ps(inv[h]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            _mm512_mask_storeu_ps(o + 16 * c, m[c], _mm512_mul_ps(acc[h][c], s));
        }
    }
}

/* The scale of the Q8_0 block at p (an F16 at any byte address), broadcast. */
SP_INLINE __m512
q8_scale(const char *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _mm512_set1_ps(_cvtsh_ss(h));
}

/* Pass 3 over a Q8_0 cache: as av_tile, with each row's 64 dims (two Q8_0
 * blocks: chunks 0-1 in the first, 2-3 in the second) dequantised in
 * registers, masked loads of int8 for the chunks past head_dim. */
SP_INLINE void
av_tile_q8(const sp_attn_args_t *a, const float *inv, int64_t h0, int NH, int64_t d0, int pf)
{
    const int64_t ss = sp_attn_scratch_stride(a->n_kv);
    __mmask16 m[4];
    int64_t off[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const int64_t d = d0 + 16 * c;
        m[c] = d < a->head_dim ? tail_mask(a->head_dim - d) : 0;
        off[c] = (d / 32) * 34 + 2 + d % 32; /* every block before d is full */
    }
    const int64_t s0 = (d0 / 32) * 34, s1 = s0 + 34; /* the two blocks' scales */
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            acc[h][c] = _mm512_setzero_ps();
        }
    }
    const float *e = a->scratch + h0 * ss;
    const char *vb = a->v;
    const int64_t lo = sp_attn_first(a);
    for (int64_t p = lo; p < a->n_kv; p++) {
        if ((p & 15) == 0 || p == lo) {
            vb = attn_kv_ptr(a->v, 2, a->blocks[p >> 4] * a->v_block_stride);
        }
        if (pf) {
            av_prefetch_row(a, 2, p + AV_AHEAD, d0);
        }
        const char *row = vb + (p & 15) * a->v_stride;
        const __m512 sa = q8_scale(row + s0);
        const __m512 sb = m[2] != 0 ? q8_scale(row + s1) : _mm512_setzero_ps();
        __m512 v[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m128i qv = _mm_maskz_loadu_epi8(m[c], row + off[c]);
            v[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qv)), c < 2 ? sa : sb);
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            const __m512 w = _mm512_set1_ps(e[h * ss + p]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        float *o = a->o + (h0 + h) * a->o_stride + d0;
        const __m512 s = _mm512_set1_ps(inv[h]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            _mm512_mask_storeu_ps(o + 16 * c, m[c], _mm512_mul_ps(acc[h][c], s));
        }
    }
}

/* Pass 1 for one block, NH (<= 8) heads from h0: the key type's version. */
SP_INLINE void
scores_any(const sp_attn_args_t *a, int kind, int64_t p0, int64_t h0, int NH, const attn_pf_t *pf)
{
    if (kind == 2) {
        scores_block_q8(a, p0, h0, NH, pf);
    } else {
        scores_block(a, kind, p0, h0, NH, pf);
    }
}

SP_INLINE void
av_any(const sp_attn_args_t *a, int kind, const float *inv, int64_t h0, int NH, int64_t d0,
       int pf)
{
    if (kind == 2) {
        av_tile_q8(a, inv, h0, NH, d0, pf);
    } else {
        av_tile(a, kind, inv, h0, NH, d0, pf);
    }
}

/* Pass 1 for nh (<= 8) heads from h0: constant head counts let the accumulators live in
 * registers. */
SP_INLINE void
scores_group(const sp_attn_args_t *a, int kind, int64_t p0, int64_t h0, int64_t nh,
             const attn_pf_t *pf)
{
    switch (nh < 8 ? nh : 8) {
    case 8: scores_any(a, kind, p0, h0, 8, pf); break;
    case 7: scores_any(a, kind, p0, h0, 7, pf); break;
    case 6: scores_any(a, kind, p0, h0, 6, pf); break;
    case 5: scores_any(a, kind, p0, h0, 5, pf); break;
    case 4: scores_any(a, kind, p0, h0, 4, pf); break;
    case 3: scores_any(a, kind, p0, h0, 3, pf); break;
    case 2: scores_any(a, kind, p0, h0, 2, pf); break;
    default: scores_any(a, kind, p0, h0, 1, pf); break;
    }
}

SP_INLINE void
attn_512(const sp_attn_args_t *a, int kind)
{
    const int64_t n_kv = a->n_kv, ss = sp_attn_scratch_stride(n_kv);
    const int64_t lo = sp_attn_first(a), p_start = lo & ~(int64_t)15;
    const int v_l2 = attn_v_in_l2(a, kind, p_start);
    attn_pf_first(a, kind, p_start, v_l2);
    for (int64_t p0 = p_start; p0 < n_kv; p0 += 16) {
        const attn_pf_t pf = attn_pf_plan(a, kind, p0, v_l2);
        scores_group(a, kind, p0, 0, a->n_q, pf.k != NULL ? &pf : NULL);
        for (int64_t h0 = 8; h0 < a->n_q; h0 += 8) {
            scores_group(a, kind, p0, h0, a->n_q - h0, NULL);
        }
    }
    for (int64_t h0 = 0; h0 < a->n_q; h0 += 4) {
        float inv[4];
        const int nh = a->n_q - h0 < 4 ? (int)(a->n_q - h0) : 4;
        for (int h = 0; h < nh; h++) {
            inv[h] = softmax_row(a->scratch + (h0 + h) * ss, lo, n_kv, a->softcap,
                                 a->sinks != NULL ? &a->sinks[h0 + h] : NULL);
        }
        for (int64_t d0 = 0; d0 < a->head_dim; d0 += 64) {
            const int pf = !v_l2 && h0 == 0; /* the first group reads the values from memory */
            switch (nh * 2 + pf) {
            case 9: av_any(a, kind, inv, h0, 4, d0, 1); break;
            case 8: av_any(a, kind, inv, h0, 4, d0, 0); break;
            case 7: av_any(a, kind, inv, h0, 3, d0, 1); break;
            case 6: av_any(a, kind, inv, h0, 3, d0, 0); break;
            case 5: av_any(a, kind, inv, h0, 2, d0, 1); break;
            case 4: av_any(a, kind, inv, h0, 2, d0, 0); break;
            case 3: av_any(a, kind, inv, h0, 1, d0, 1); break;
            default: av_any(a, kind, inv, h0, 1, d0, 0); break;
            }
        }
    }
}

static void
attn_f32(const sp_attn_args_t *a)
{
    attn_512(a, 0);
}

static void
attn_f16(const sp_attn_args_t *a)
{
    attn_512(a, 1);
}

static void
attn_q8_0(const sp_attn_args_t *a)
{
    attn_512(a, 2);
}

static void
exp_f32(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, exp512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void
rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        acc[(i >> 4) & 3] = _mm512_fmadd_ps(v, v, acc[(i >> 4) & 3]);
    }
    const __m512 s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    const double ss = (double)_mm512_reduce_add_ps(s);
    const __m512 scale = _mm512_set1_ps((float)(1.0 / sqrt(ss / (double)n + (double)eps)));
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

static void
swiglu(float *g, const float *u, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 den = _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
        const __m512 r = _mm512_mul_ps(_mm512_div_ps(gv, den), _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(g + i, m, r);
    }
}

void
sp__attn_register_avx512(sp_cpu_kernels_t *k)
{
    k->attn[SP_TYPE_F32] = attn_f32;
    k->attn[SP_TYPE_F16] = attn_f16;
    k->attn[SP_TYPE_Q8_0] = attn_q8_0;
    k->exp_f32 = exp_f32;
    k->rmsnorm = rmsnorm;
    k->swiglu = swiglu;
}
