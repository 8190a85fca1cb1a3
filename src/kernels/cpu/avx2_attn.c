/*
 * avx2_attn.c - AVX2 attention over an F32, F16 or Q8_0 KV cache, vector exp,
 * RMSNorm and SwiGLU.
 *
 * The same three passes as avx512_attn.c (see there for why each result is
 * batch-invariant): scores a key block of 16 positions as two 8-lane halves
 * for up to 4 heads at a time, exp/max/sum per head, then the value rows in
 * chunks of a few KiB, each swept from L1 by tiles of up to 4 heads x 24 (F32,
 * F16) or 16 (Q8_0) dims whose sums wait in o between chunks. Every (head,
 * dim) output keeps one FMA chain over the positions in order, whatever the
 * tile or chunk (attn_256 says how the cache is prefetched). head_dim tails
 * are masked loads (F16 tails go through a zeroed copy: AVX2 has no 16-bit
 * masked load).
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/attn_pf.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define SP_INLINE static inline __attribute__((always_inline))

SP_INLINE __m256
exp256(__m256 x)
{
    /* max/min return their second operand when one is NaN: NaN passes. */
    x = _mm256_max_ps(_mm256_set1_ps(SP_EXP_LO), x);
    x = _mm256_min_ps(_mm256_set1_ps(SP_EXP_HI), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(SP_EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SP_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SP_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(SP_EXP_P5);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SP_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SP_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SP_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SP_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SP_EXP_P0));
    const __m256 y =
        _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    /* 2^n as 2^n1 * 2^n2 (n in [-150, 128], both halves normal): the first
     * product is exact, the second rounds once, into the denormals if need be. */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}

/* Lanes i < n set. */
SP_INLINE __m256i
tail_mask(int64_t n)
{
    const int k = n >= 8 ? 8 : (n <= 0 ? 0 : (int)n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 floats of the cache from element i; n_valid < 8 reads only that many. */
SP_INLINE __m256
load_kv(const void *base, int f16, int64_t i, int64_t n_valid, __m256i m)
{
    if (f16) {
        const sp_fp16_t *src = (const sp_fp16_t *)base + i;
        if (n_valid >= 8) {
            return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
        }
        sp_fp16_t tmp[8] = {0};
        memcpy(tmp, src, (size_t)(n_valid > 0 ? n_valid : 0) * sizeof(sp_fp16_t));
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp));
    }
    if (n_valid >= 8) {
        return _mm256_loadu_ps((const float *)base + i);
    }
    return _mm256_maskload_ps((const float *)base + i, m);
}

SP_INLINE __m256
load_f32(const float *x, int64_t n_valid, __m256i m)
{
    return n_valid >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, m);
}

SP_INLINE void
store_f32(float *x, int64_t n_valid, __m256i m, __m256 v)
{
    if (n_valid >= 8) {
        _mm256_storeu_ps(x, v);
    } else {
        _mm256_maskstore_ps(x, m, v);
    }
}

/* 8 int8 widened to float; n_valid < 8 reads only that many (zeros after). */
SP_INLINE __m256
load_q8x8(const char *p, int64_t n_valid)
{
    if (n_valid >= 8) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    }
    int8_t tmp[8] = {0};
    memcpy(tmp, p, (size_t)(n_valid > 0 ? n_valid : 0));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)tmp)));
}

/* Pass 1 over a Q8_0 key block (layout in kernels.h): as scores_block, each
 * row of 16 int8 lanes widened and multiplied by its group's scales (exact)
 * before the same FMAs. */
SP_INLINE void
scores_block_q8(const sp_attn_args_t *a, int64_t p0, int64_t h0, int NH, const attn_pf_t *pf)
{
    const int64_t hd = a->head_dim, ss = sp_attn_scratch_stride(a->n_kv);
    const char *kb = attn_kv_ptr(a->k, 2, a->blocks[p0 / 16] * a->k_block_stride);
    const float *q[4];
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        q[h] = a->q + (h0 + h) * a->q_stride;
        acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    }
    for (int64_t g0 = 0; g0 < hd; g0 += 32) {
        const char *sp = kb + 16 * hd + g0; /* 16 F16 scales */
        const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sp));
        const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 16)));
        const int64_t g1 = g0 + 32 < hd ? g0 + 32 : hd;
        for (int64_t d = g0; d < g1; d++) {
            attn_pf_step(pf, d);
            const __m128i qv = _mm_loadu_si128((const __m128i *)(kb + d * 16));
            const __m256 k0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qv)), s0);
            const __m256 k1 = _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(qv, qv))), s1);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) {
                const __m256 qd = _mm256_broadcast_ss(&q[h][d]);
                acc[h][0] = _mm256_fmadd_ps(qd, k0, acc[h][0]);
                acc[h][1] = _mm256_fmadd_ps(qd, k1, acc[h][1]);
            }
        }
    }
    attn_pf_rest(pf, hd);
    const __m256 scale = _mm256_set1_ps(a->scale);
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        float *s = a->scratch + (h0 + h) * ss + p0;
        _mm256_store_ps(s, _mm256_mul_ps(acc[h][0], scale));
        _mm256_store_ps(s + 8, _mm256_mul_ps(acc[h][1], scale));
    }
}

/*
 * Pass 1 for the block of 16 positions at p0 and NH (<= 4) heads from h0:
 * per head two 8-lane accumulators (positions p0..p0+7 and p0+8..p0+15) sum
 * q_h[d] * k[.][d] over d in order, then times scale.
 */
SP_INLINE void
scores_block(const sp_attn_args_t *a, int f16, int64_t p0, int64_t h0, int NH, const attn_pf_t *pf)
{
    const int64_t hd = a->head_dim, ss = sp_attn_scratch_stride(a->n_kv);
    const void *kb = attn_kv_ptr(a->k, f16, a->blocks[p0 / 16] * a->k_block_stride);
    const float *q[4];
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        q[h] = a->q + (h0 + h) * a->q_stride;
        acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    }
    for (int64_t d = 0; d < hd; d++) {
        attn_pf_step(pf, d);
        const __m256 k0 = load_kv(kb, f16, d * 16, 8, _mm256_setzero_si256());
        const __m256 k1 = load_kv(kb, f16, d * 16 + 8, 8, _mm256_setzero_si256());
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            const __m256 qd = _mm256_broadcast_ss(&q[h][d]);
            acc[h][0] = _mm256_fmadd_ps(qd, k0, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(qd, k1, acc[h][1]);
        }
    }
    attn_pf_rest(pf, hd);
    const __m256 scale = _mm256_set1_ps(a->scale);
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        float *s = a->scratch + (h0 + h) * ss + p0;
        _mm256_store_ps(s, _mm256_mul_ps(acc[h][0], scale));
        _mm256_store_ps(s + 8, _mm256_mul_ps(acc[h][1], scale));
    }
}

SP_INLINE float
hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

SP_INLINE float
hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* Lanes p + i in [lo, n). */
SP_INLINE __m256
range_mask(int64_t p, int64_t lo, int64_t n)
{
    return _mm256_castsi256_ps(_mm256_andnot_si256(tail_mask(lo - p), tail_mask(n - p)));
}

/* Pass 2 for one head over positions lo..n-1 (lo: sp_attn_first): the
 * soft-cap (scalar, kernels.h's rule), then e = exp(s - max) in place (max
 * and sum with the sink when there is one); returns 1 / sum. Lanes outside
 * [lo, n) are masked out; a vector wholly inside skips the mask (an all-ones
 * blend or and changes no bit). */
SP_INLINE float
softmax_row(float *sc, int64_t lo, int64_t n, float softcap, const float *sink)
{
    if (softcap > 0.0f) {
        for (int64_t p = lo; p < n; p++) {
            sc[p] = sp_attn_softcap(sc[p], softcap);
        }
    }
    const int64_t p_start = lo & ~(int64_t)15;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t p = p_start; p < n; p += 8) {
        if (p >= lo && p + 8 <= n) {
            mx = _mm256_max_ps(mx, _mm256_load_ps(sc + p));
        } else {
            const __m256 m = range_mask(p, lo, n);
            mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, _mm256_load_ps(sc + p)), m);
        }
    }
    float mxs = hmax8(mx);
    if (sink != NULL && *sink > mxs) {
        mxs = *sink;
    }
    const __m256 mv = _mm256_set1_ps(mxs);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t p = p_start; p < n; p += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(sc + p), mv));
        if (!(p >= lo && p + 8 <= n)) {
            e = _mm256_and_ps(range_mask(p, lo, n), e);
        }
        _mm256_store_ps(sc + p, e);
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / (hsum8(sum) + (sink != NULL ? expf(*sink - mxs) : 0.0f));
}

/*
 * Pass 3 for NH heads from h0, dims d0..d0 + 8 NV - 1 and the positions of
 * blocks c0 / 16 .. c1 / 16 - 1 (those from lo): o = inv * sum_p e_p v_p.
 * Between chunks a head's running sums wait in o, unscaled (a store and a
 * load: exact), so each accumulator still adds its positions in order from
 * zero: the same FMA chain as one sweep over the whole cache. The last chunk
 * scales. full = 0: the head_dim tail (NV 2, masked). A Q8_0 row's 16 dims
 * (NV 2 within one Q8_0 group: d0 is a multiple of 16) are widened and
 * multiplied by the group's scale (exact) before the same FMAs. pf: ask for
 * this tile's columns of the rows `ahead` positions on into L1 as these rows
 * are read.
 */
SP_INLINE void
av_tile(const sp_attn_args_t *a, int kind, const float *inv, int64_t h0, int NH, int NV, int64_t d0,
        int64_t c0, int64_t c1, int first, int last, int full, int pf, int64_t ahead)
{
    const int64_t ss = sp_attn_scratch_stride(a->n_kv), hd = a->head_dim;
    const int64_t nv = full ? 8 * NV : hd - d0, lo = sp_attn_first(a);
    __m256i m[3];
#pragma GCC unroll 3
    for (int j = 0; j < NV; j++) {
        m[j] = tail_mask(nv - 8 * j);
    }
    const int64_t step = attn_row_step(a, kind);
    /* the tile's first byte in a row: Q8_0 skips the group's scale */
    const int64_t sc = (d0 / 32) * 34,
                  off = kind == 2 ? sc + 2 + d0 % 32 : d0 * attn_kv_elt(kind);
    /* the first and last byte of the tile's columns in a row (Q8_0: from its scale) */
    const int64_t pf_lo = kind == 2 ? sc : off;
    const int64_t pf_hi = off + nv * attn_kv_elt(kind) - 1;
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        const float *o = a->o + (h0 + h) * a->o_stride + d0;
#pragma GCC unroll 3
        for (int j = 0; j < NV; j++) {
            acc[h][j] = first || nv - 8 * j <= 0 ? _mm256_setzero_ps()
                                                 : load_f32(o + 8 * j, nv - 8 * j, m[j]);
        }
    }
    for (int64_t p0 = c0; p0 < c1; p0 += 16) {
        const int64_t n = a->n_kv - p0 < 16 ? a->n_kv - p0 : 16, p1 = p0 < lo ? lo - p0 : 0;
        const char *row =
            attn_kv_ptr(a->v, kind, a->blocks[p0 / 16] * a->v_block_stride) + p1 * step + off;
        const char *next = NULL;
        if (pf && p0 + ahead < a->n_kv) {
            next = attn_kv_ptr(a->v, kind, a->blocks[(p0 + ahead) / 16] * a->v_block_stride) +
                   p1 * step;
        }
        const float *e = a->scratch + h0 * ss + p0 + p1;
        for (int64_t p = p1; p < n; p++, row += step, e++) {
            if (pf && next != NULL) {
                _mm_prefetch(next + pf_lo, _MM_HINT_T0);
                _mm_prefetch(next + pf_hi, _MM_HINT_T0);
                next += step;
            }
            __m256 v[3];
            if (kind == 2) {
                uint16_t h16;
                memcpy(&h16, row - off + sc, sizeof h16);
                const __m256 s = _mm256_set1_ps(_cvtsh_ss(h16));
                v[0] = _mm256_mul_ps(load_q8x8(row, nv), s);
                v[1] = nv > 8 ? _mm256_mul_ps(load_q8x8(row + 8, nv - 8), s) : _mm256_setzero_ps();
            } else {
#pragma GCC unroll 3
                for (int j = 0; j < NV; j++) {
                    v[j] = nv - 8 * j > 0 ? load_kv(row, kind, 8 * j, nv - 8 * j, m[j])
                                          : _mm256_setzero_ps();
                }
            }
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) {
                const __m256 w = _mm256_broadcast_ss(&e[h * ss]);
#pragma GCC unroll 3
                for (int j = 0; j < NV; j++) {
                    acc[h][j] = _mm256_fmadd_ps(w, v[j], acc[h][j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        float *o = a->o + (h0 + h) * a->o_stride + d0;
        const __m256 s = _mm256_set1_ps(inv[h]);
#pragma GCC unroll 3
        for (int j = 0; j < NV; j++) {
            if (nv - 8 * j > 0) {
                store_f32(o + 8 * j, nv - 8 * j, m[j],
                          last ? _mm256_mul_ps(acc[h][j], s) : acc[h][j]);
            }
        }
    }
}

/* Every tile of NH heads over one chunk: 24 dims at a time (12 accumulators)
 * for F32 and F16 while that leaves whole 16-dim tiles, 16 at a time for Q8_0
 * (one scale per tile), then the masked tail. pf: each tile asks for its own
 * columns of the rows a chunk on, so the requests spread over the tiles. */
SP_INLINE void
av_heads(const sp_attn_args_t *a, int kind, const float *inv, int64_t h0, int NH, int64_t c0,
         int64_t c1, int first, int last, int pf, int64_t ahead)
{
    const int64_t hd = a->head_dim;
    int64_t d0 = 0;
    if (kind != 2) {
        for (; hd - d0 >= 24 && hd - d0 != 32 && hd - d0 != 16; d0 += 24) {
            if (pf) {
                av_tile(a, kind, inv, h0, NH, 3, d0, c0, c1, first, last, 1, 1, ahead);
            } else {
                av_tile(a, kind, inv, h0, NH, 3, d0, c0, c1, first, last, 1, 0, 0);
            }
        }
    }
    for (; hd - d0 >= 16; d0 += 16) {
        if (pf) {
            av_tile(a, kind, inv, h0, NH, 2, d0, c0, c1, first, last, 1, 1, ahead);
        } else {
            av_tile(a, kind, inv, h0, NH, 2, d0, c0, c1, first, last, 1, 0, 0);
        }
    }
    if (d0 < hd) {
        av_tile(a, kind, inv, h0, NH, 2, d0, c0, c1, first, last, 0, pf, ahead);
    }
}

/* Pass 1 in the cache type's version. */
SP_INLINE void
scores_any(const sp_attn_args_t *a, int kind, int64_t p0, int64_t h0, int NH, const attn_pf_t *pf)
{
    if (kind == 2) {
        scores_block_q8(a, p0, h0, NH, pf);
    } else {
        scores_block(a, kind, p0, h0, NH, pf);
    }
}

/*
 * Pass 1 prefetches the cache as attn_pf.h says (PF_BLOCKS, V_L2_BYTES there); when the values
 * do not fit V_L2_BYTES, pass 3 asks for them, a chunk ahead. Pass 3 goes over the values in
 * chunks of about AV_CHUNK_BYTES (whole blocks), each read once from L2 or memory and then
 * reused from L1 by every (head group, 16 dims) tile.
 */
#ifndef AV_CHUNK_BYTES
#define AV_CHUNK_BYTES (16 * 1024)
#endif
#define AV_HEADS 16 /* heads per softmax group (inv on the stack) */

SP_INLINE void
scores_group(const sp_attn_args_t *a, int kind, int64_t p0, int64_t h0, int nh, const attn_pf_t *pf)
{
    switch (nh) {
    case 4: scores_any(a, kind, p0, h0, 4, pf); break;
    case 3: scores_any(a, kind, p0, h0, 3, pf); break;
    case 2: scores_any(a, kind, p0, h0, 2, pf); break;
    default: scores_any(a, kind, p0, h0, 1, pf); break;
    }
}

SP_INLINE void
attn_256(const sp_attn_args_t *a, int kind)
{
    const int64_t n_kv = a->n_kv, ss = sp_attn_scratch_stride(n_kv);
    const int64_t lo = sp_attn_first(a), p_start = lo & ~(int64_t)15;
    const int64_t tile = 16 * attn_row_bytes(a, kind);
    const int v_l2 = attn_v_in_l2(a, kind, p_start);
    attn_pf_first(a, kind, p_start, v_l2);
    for (int64_t p0 = p_start; p0 < n_kv; p0 += 16) {
        const attn_pf_t pf = attn_pf_plan(a, kind, p0, v_l2);
        const int nh0 = a->n_q < 4 ? (int)a->n_q : 4;
        if (pf.k != NULL) {
            scores_group(a, kind, p0, 0, nh0, &pf);
        } else {
            scores_group(a, kind, p0, 0, nh0, NULL);
        }
        for (int64_t h0 = 4; h0 < a->n_q; h0 += 4) {
            scores_group(a, kind, p0, h0, a->n_q - h0 < 4 ? (int)(a->n_q - h0) : 4, NULL);
        }
    }
    int64_t chunk = AV_CHUNK_BYTES / tile;
    chunk = 16 * (chunk < 1 ? 1 : chunk);
    for (int64_t g0 = 0; g0 < a->n_q; g0 += AV_HEADS) {
        const int64_t g1 = a->n_q - g0 < AV_HEADS ? a->n_q : g0 + AV_HEADS;
        float inv[AV_HEADS];
        for (int64_t h = g0; h < g1; h++) {
            inv[h - g0] = softmax_row(a->scratch + h * ss, lo, n_kv, a->softcap,
                                      a->sinks != NULL ? &a->sinks[h] : NULL);
        }
        for (int64_t c0 = p_start; c0 < n_kv; c0 += chunk) {
            const int64_t c1 = n_kv - c0 < chunk ? n_kv : c0 + chunk;
            const int first = c0 == p_start, last = c1 == n_kv;
            const int pf = !v_l2 && g0 == 0 && c1 < n_kv;
            for (int64_t h0 = g0; h0 < g1; h0 += 4) {
                const float *iv = inv + (h0 - g0);
                const int pf1 = pf && h0 == g0;
                switch (g1 - h0 < 4 ? g1 - h0 : 4) {
                case 4: av_heads(a, kind, iv, h0, 4, c0, c1, first, last, pf1, chunk); break;
                case 3: av_heads(a, kind, iv, h0, 3, c0, c1, first, last, pf1, chunk); break;
                case 2: av_heads(a, kind, iv, h0, 2, c0, c1, first, last, pf1, chunk); break;
                default: av_heads(a, kind, iv, h0, 1, c0, c1, first, last, pf1, chunk); break;
                }
            }
        }
    }
}

static void
attn_f32(const sp_attn_args_t *a)
{
    attn_256(a, 0);
}

static void
attn_f16(const sp_attn_args_t *a)
{
    attn_256(a, 1);
}

static void
attn_q8_0(const sp_attn_args_t *a)
{
    attn_256(a, 2);
}

static void
exp_f32(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n - i);
        store_f32(y + i, n - i, m, exp256(load_f32(x + i, n - i, m)));
    }
}

static void
rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = load_f32(x + i, n - i, tail_mask(n - i));
        acc[(i >> 3) & 3] = _mm256_fmadd_ps(v, v, acc[(i >> 3) & 3]);
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    const double ss = (double)hsum8(s);
    const __m256 scale = _mm256_set1_ps((float)(1.0 / sqrt(ss / (double)n + (double)eps)));
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n - i);
        const __m256 v = _mm256_mul_ps(load_f32(x + i, n - i, m), scale);
        store_f32(out + i, n - i, m, _mm256_mul_ps(v, load_f32(w + i, n - i, m)));
    }
}

static void
swiglu(float *g, const float *u, int64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n - i);
        const __m256 gv = load_f32(g + i, n - i, m);
        const __m256 den = _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
        const __m256 r = _mm256_mul_ps(_mm256_div_ps(gv, den), load_f32(u + i, n - i, m));
        store_f32(g + i, n - i, m, r);
    }
}

void
sp__attn_register_avx2(sp_cpu_kernels_t *k)
{
    k->attn[SP_TYPE_F32] = attn_f32;
    k->attn[SP_TYPE_F16] = attn_f16;
    k->attn[SP_TYPE_Q8_0] = attn_q8_0;
    k->exp_f32 = exp_f32;
    k->rmsnorm = rmsnorm;
    k->swiglu = swiglu;
}
