/*
 * mla_attn.c - attention over the latent cache stored once (deepseek2).
 *
 * A latent layer has one KV head whose value is its key: [k_pe (R), c (r)]
 * (engine/mla.h). The cache keeps only the key tile of each block (keys
 * transposed: element (lane, d) at d * 16 + lane, F32, F16 or Q8_0 as
 * kernels.h lays them out), half of what a key tile plus a value tile took.
 * This kernel reads the values from that tile: for a block, the weights of
 * its 16 positions times the tile's row d is a 16-lane product, so the
 * value pass is a small product per block, (heads x 16) times (16 x D).
 *
 * Order of work, per group of up to 16 query heads (HB), whose query rows
 * are first transposed (qt[d][h]: a dimension's heads side by side):
 *   1. scores: per block, for each dimension d and head h the 16 lanes'
 *      q[h][d] * key[d][lane] (4 heads' sums in registers per sweep of the
 *      tile at 8 lanes a vector, all 16 at the AVX-512 level); a Q8_0 row is
 *      the int8 row widened times its group's 16 scales (exact), in a
 *      register at the AVX-512 level, through an L1 buffer once per block
 *      below it; then scaled, soft-capped, their maximum;
 *   2. exp and sum per head (the kernel table's exp), as the other kernels;
 *   3. values: per block, acc[d][h] += sum over lanes w[lane][h] key[d][lane]
 *      for d >= v_lo (the first R lanes of the output are the rotated part,
 *      which no one reads: set to 0), then divided by the sum. For Q8_0 the
 *      weights are multiplied by a group's scales once (per group and lane)
 *      and the sum runs over the widened integers.
 * Numerics: pass 1 over Q8_0 gives the bits of an F32 cache holding the
 * dequantised values; pass 3 differs from it by at most (n_kv + 2) 2^-24
 * max|v| (docs/design.md; test_mla.c: mla_attn_levels_agree). The AVX2
 * and AVX-512 copies give the same bits (same FMAs, same order).
 * Every head's result depends on its own query row and the sequence's cache
 * alone, in a fixed order (blocks in position order, d, lanes): the same
 * bits whatever other heads or rows share the call, so batch invariance holds
 * as with the other kernels. It is not bit-identical to the two-tile path
 * (that path's kernels sum in their own order): the difference is float
 * rounding (tests/py/test_mla.py bounds it against the float64 reference).
 *
 * Threads: one call per work item, on the caller's thread. Memory: the
 * caller's scratch (sp__mla_attn_scratch_floats), nothing allocated.
 */
#include "engine/mla.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "core/assert.h"

#define LN SP_ATTN_BLOCK /* positions per block: the tile's lanes */
#define HB 16            /* query heads per pass */
#define GQ SP_QK8_0      /* dimensions per Q8_0 scale group */

/* The scratch after the scores, in floats, in this order. */
typedef struct mla_scratch {
    float *qt;  /* (hd, HB) the group's query rows transposed: qt[d][h] */
    float *buf; /* (max(hd, GQ), LN) an F16 tile in float, or a Q8_0 group's int8 rows */
    float *sf;  /* (groups, LN) a Q8_0 tile's scales in float */
    float *acc; /* (hd, HB) value accumulators */
    float *w;   /* (LN, HB) a block's weights: w[lane][h] */
    float *wq;  /* (LN, HB) those times a Q8_0 group's scales */
} mla_scratch_t;

static mla_scratch_t
mla_scratch(float *base, int64_t hd)
{
    mla_scratch_t s;
    s.qt = base;
    s.buf = s.qt + hd * HB;
    s.sf = s.buf + (hd > GQ ? hd : GQ) * LN;
    s.acc = s.sf + sp_kv_q8_groups(hd) * LN;
    s.w = s.acc + hd * HB;
    s.wq = s.w + LN * HB;
    return s;
}

int64_t
sp__mla_attn_scratch_floats(int64_t head_dim)
{
    const int64_t hd = head_dim;
    return hd * HB + (hd > GQ ? hd : GQ) * LN + sp_kv_q8_groups(hd) * LN + hd * HB + 2 * LN * HB;
}

/* GCC's vector extension. v8 is an AVX2 register in the AVX2 copy below, two
 * SSE registers in the baseline build, a NEON pair on arm64; v16 is used by
 * the AVX-512 copy only (one zmm register: a block's 16 lanes, or a group's
 * 16 heads). Loads and stores through may_alias types: the scratch and the
 * cache are plain float / byte arrays. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
#define LD8(p) (*(const v8u *)(const void *)(p))
#define ST8(p, v) (*(v8u *)(void *)(p) = (v))
#define LD16(p) (*(const v16u *)(const void *)(p))
#define ST16(p, v) (*(v16u *)(void *)(p) = (v))
#define SP_AI static inline __attribute__((always_inline))

/*
 * Pass 1 for one block: sl[h][lane] = sum_d qt[d][h] kt[d][lane] for the
 * group's heads 0..nh-1 (kt: the tile's rows in float). Heads go 4 (8-wide)
 * or 16 (16-wide) per sweep of the tile, their sums held in registers; heads
 * past nh read zero query rows and are not stored.
 */
SP_AI void
scores_w8(int64_t hd, int64_t nh, const float *qt, const float *kt, float *sl)
{
    for (int64_t hh = 0; hh < nh; hh += 4) {
        v8 c0l = {0}, c0h = {0}, c1l = {0}, c1h = {0};
        v8 c2l = {0}, c2h = {0}, c3l = {0}, c3h = {0};
        for (int64_t d = 0; d < hd; d++) {
            const v8 kl = LD8(kt + d * LN), kh = LD8(kt + d * LN + 8);
            const float *qd = qt + d * HB + hh;
            c0l += qd[0] * kl;
            c0h += qd[0] * kh;
            c1l += qd[1] * kl;
            c1h += qd[1] * kh;
            c2l += qd[2] * kl;
            c2h += qd[2] * kh;
            c3l += qd[3] * kl;
            c3h += qd[3] * kh;
        }
        const int64_t n4 = nh - hh < 4 ? nh - hh : 4;
        float *s = sl + hh * LN;
        ST8(s, c0l);
        ST8(s + 8, c0h);
        if (n4 > 1) {
            ST8(s + LN, c1l);
            ST8(s + LN + 8, c1h);
        }
        if (n4 > 2) {
            ST8(s + 2 * LN, c2l);
            ST8(s + 2 * LN + 8, c2h);
        }
        if (n4 > 3) {
            ST8(s + 3 * LN, c3l);
            ST8(s + 3 * LN + 8, c3h);
        }
    }
}

SP_AI void
scores_w16(int64_t hd, int64_t nh, const float *qt, const float *kt, float *sl)
{
    v16 c[HB]; /* all 16 heads in one sweep: 16 of the 32 zmm registers */
#pragma GCC unroll 16
    for (int j = 0; j < HB; j++) {
        c[j] = (v16){0};
    }
    for (int64_t d = 0; d < hd; d++) {
        const v16 kr = LD16(kt + d * LN);
        const float *qd = qt + d * HB;
#pragma GCC unroll 16
        for (int j = 0; j < HB; j++) {
            c[j] += qd[j] * kr;
        }
    }
    for (int64_t j = 0; j < nh; j++) {
        ST16(sl + j * LN, c[j]);
    }
}

/*
 * Pass 3 for rows d0..d0+n-1 of a block: acc[d][h] += sum_{l0 <= lane < l1}
 * w[lane][h] kr[d - d0][lane] (kr: those rows, LN floats apart). 4 (8-wide)
 * or 8 (16-wide) dimensions per sweep of the weights, their sums in registers.
 */
SP_AI void
values_w8(float *acc, const float *kr, int64_t d0, int64_t n, const float *w, int64_t l0,
          int64_t l1)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *r = kr + i * LN;
        float *ad = acc + (d0 + i) * HB;
        v8 a0l = LD8(ad), a0h = LD8(ad + 8), a1l = LD8(ad + 16), a1h = LD8(ad + 24);
        v8 a2l = LD8(ad + 32), a2h = LD8(ad + 40), a3l = LD8(ad + 48), a3h = LD8(ad + 56);
        for (int64_t l = l0; l < l1; l++) {
            const v8 wl = LD8(w + l * HB), wh = LD8(w + l * HB + 8);
            a0l += wl * r[l];
            a0h += wh * r[l];
            a1l += wl * r[LN + l];
            a1h += wh * r[LN + l];
            a2l += wl * r[2 * LN + l];
            a2h += wh * r[2 * LN + l];
            a3l += wl * r[3 * LN + l];
            a3h += wh * r[3 * LN + l];
        }
        ST8(ad, a0l);
        ST8(ad + 8, a0h);
        ST8(ad + 16, a1l);
        ST8(ad + 24, a1h);
        ST8(ad + 32, a2l);
        ST8(ad + 40, a2h);
        ST8(ad + 48, a3l);
        ST8(ad + 56, a3h);
    }
    for (; i < n; i++) {
        const float *r = kr + i * LN;
        float *ad = acc + (d0 + i) * HB;
        v8 al = LD8(ad), ah = LD8(ad + 8);
        for (int64_t l = l0; l < l1; l++) {
            al += LD8(w + l * HB) * r[l];
            ah += LD8(w + l * HB + 8) * r[l];
        }
        ST8(ad, al);
        ST8(ad + 8, ah);
    }
}

SP_AI void
values_w16(float *acc, const float *kr, int64_t d0, int64_t n, const float *w, int64_t l0,
           int64_t l1)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float *r = kr + i * LN;
        float *ad = acc + (d0 + i) * HB;
        v16 a[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            a[j] = LD16(ad + j * HB);
        }
        for (int64_t l = l0; l < l1; l++) {
            const v16 wv = LD16(w + l * HB);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                a[j] += wv * r[j * LN + l];
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            ST16(ad + j * HB, a[j]);
        }
    }
    for (; i < n; i++) {
        const float *r = kr + i * LN;
        float *ad = acc + (d0 + i) * HB;
        v16 av = LD16(ad);
        for (int64_t l = l0; l < l1; l++) {
            av += LD16(w + l * HB) * r[l];
        }
        ST16(ad, av);
    }
}

/*
 * Rows d0..d1-1 of a Q8_0 tile's int8 q[d][lane] in float, row d at
 * out + (d - d0) * LN: times their group's scales sf[d / 32][lane] (the
 * dequantised key, exact: 8 bits times an F16's 11) when sf is set, else the
 * integers alone. One copy per level (the SIMD ones with the sign extension
 * and conversion instructions: GCC 12 lowers a vector-extension int8 -> float
 * conversion to scalar code).
 */
static void
widen_base(const int8_t *q, const float *sf, int64_t d0, int64_t d1, float *out)
{
    for (int64_t d = d0; d < d1; d++) {
        for (int64_t l = 0; l < LN; l++) {
            const float x = (float)q[d * LN + l];
            out[(d - d0) * LN + l] = sf != NULL ? x * sf[d / GQ * LN + l] : x;
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void
widen_avx2(const int8_t *q, const float *sf, int64_t d0, int64_t d1, float *out)
{
    for (int64_t d = d0; d < d1; d++) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(q + d * LN));
        __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
        __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
        if (sf != NULL) {
            lo = _mm256_mul_ps(lo, _mm256_loadu_ps(sf + d / GQ * LN));
            hi = _mm256_mul_ps(hi, _mm256_loadu_ps(sf + d / GQ * LN + 8));
        }
        _mm256_storeu_ps(out + (d - d0) * LN, lo);
        _mm256_storeu_ps(out + (d - d0) * LN + 8, hi);
    }
}

__attribute__((target("avx512f"))) static void
widen_avx512(const int8_t *q, const float *sf, int64_t d0, int64_t d1, float *out)
{
    for (int64_t d = d0; d < d1; d++) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(q + d * LN));
        __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x));
        if (sf != NULL) {
            v = _mm512_mul_ps(v, _mm512_loadu_ps(sf + d / GQ * LN));
        }
        _mm512_storeu_ps(out + (d - d0) * LN, v);
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * Pass 1 over a Q8_0 block at the AVX-512 level: each int8 row widened and
 * times its group's scales in a register (the exact dequantised key, as
 * widen_avx512 writes it), then the 16 heads' FMAs: the same operations in
 * the same order as scores_w16 over the dequantised tile, so the same bits,
 * without writing and reading the tile in float.
 */
__attribute__((target("avx512f"))) static void
scores_q8_avx512(int64_t hd, int64_t nh, const float *qt, const int8_t *q8, const float *sf,
                 float *sl)
{
    __m512 c[HB];
#pragma GCC unroll 16
    for (int j = 0; j < HB; j++) {
        c[j] = _mm512_setzero_ps();
    }
    for (int64_t g0 = 0; g0 < hd; g0 += GQ) {
        const int64_t g1 = g0 + GQ < hd ? g0 + GQ : hd;
        const __m512 sv = _mm512_loadu_ps(sf + g0 / GQ * LN);
        for (int64_t d = g0; d < g1; d++) {
            const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(q8 + d * LN));
            const __m512 kr = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x)), sv);
            const float *qd = qt + d * HB;
#pragma GCC unroll 16
            for (int j = 0; j < HB; j++) {
                c[j] = _mm512_fmadd_ps(_mm512_set1_ps(qd[j]), kr, c[j]);
            }
        }
    }
    for (int64_t j = 0; j < nh; j++) {
        _mm512_storeu_ps(sl + j * LN, c[j]);
    }
}

/* Pass 1 over an F16 block at the AVX-512 level: each row converted in a
 * register (exact), then scores_q8_avx512's FMAs: the bits of scores_w16 over
 * the tile converted to float. */
__attribute__((target("avx512f"))) static void
scores_f16_avx512(int64_t hd, int64_t nh, const float *qt, const sp_fp16_t *kt, float *sl)
{
    __m512 c[HB];
#pragma GCC unroll 16
    for (int j = 0; j < HB; j++) {
        c[j] = _mm512_setzero_ps();
    }
    for (int64_t d = 0; d < hd; d++) {
        const __m512 kr =
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(kt + d * LN)));
        const float *qd = qt + d * HB;
#pragma GCC unroll 16
        for (int j = 0; j < HB; j++) {
            c[j] = _mm512_fmadd_ps(_mm512_set1_ps(qd[j]), kr, c[j]);
        }
    }
    for (int64_t j = 0; j < nh; j++) {
        _mm512_storeu_ps(sl + j * LN, c[j]);
    }
}
#endif

/* The level's widen (lvl: 0 baseline, 1 AVX2, 2 AVX-512; a constant in each copy). */
SP_AI void
widen(int lvl, const int8_t *q, const float *sf, int64_t d0, int64_t d1, float *out)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (lvl == 2) {
        widen_avx512(q, sf, d0, d1, out);
        return;
    }
    if (lvl == 1) {
        widen_avx2(q, sf, d0, d1, out);
        return;
    }
#endif
    (void)lvl;
    widen_base(q, sf, d0, d1, out);
}

/* A block's key tile for pass 1: its rows in float, F32 in place, F16
 * converted and Q8_0 dequantised into s->buf. For Q8_0, *q8 is set to the
 * int8 rows and s->sf holds every group's 16 scales in float. */
SP_AI const float *
block_tile(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int32_t id,
           const mla_scratch_t *s, const int8_t **q8)
{
    const int64_t hd = a->head_dim;
    if (type == SP_TYPE_F32) {
        return (const float *)a->k + (int64_t)id * a->k_block_stride;
    }
    if (type == SP_TYPE_F16) {
        k->to_float[SP_TYPE_F16]((const sp_fp16_t *)a->k + (int64_t)id * a->k_block_stride,
                                 s->buf, hd * LN);
        return s->buf;
    }
    /* Q8_0 (kernels.h): int8 q[d][lane], then F16 scales [d / 32][lane] */
    const char *t = (const char *)a->k + (int64_t)id * a->k_block_stride;
    k->to_float[SP_TYPE_F16](t + LN * hd, s->sf, sp_kv_q8_groups(hd) * LN);
    *q8 = (const int8_t *)t;
    return NULL;
}

/* Pass 1 for block id: the group's scores sl[h][lane], h < nh. */
SP_AI void
block_scores(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int32_t id,
             const mla_scratch_t *s, int64_t nh, int lvl, float *sl)
{
    const int64_t hd = a->head_dim;
#if defined(__x86_64__) && defined(__GNUC__)
    if (lvl == 2 && type == SP_TYPE_F16) {
        scores_f16_avx512(hd, nh, s->qt, (const sp_fp16_t *)a->k + (int64_t)id * a->k_block_stride,
                          sl);
        return;
    }
#endif
    const int8_t *q8 = NULL;
    const float *kt = block_tile(k, type, a, id, s, &q8);
    if (type == SP_TYPE_Q8_0) {
#if defined(__x86_64__) && defined(__GNUC__)
        if (lvl == 2) {
            scores_q8_avx512(hd, nh, s->qt, q8, s->sf, sl);
            return;
        }
#endif
        widen(lvl, q8, s->sf, 0, hd, s->buf); /* the dequantised tile */
        kt = s->buf;
    }
    if (lvl == 2) {
        scores_w16(hd, nh, s->qt, kt, sl);
    } else {
        scores_w8(hd, nh, s->qt, kt, sl);
    }
}

/*
 * Pass 3 over a Q8_0 block: the int8 rows v_lo..hd-1 widened to float
 * (exact, no scale: s->buf), then per scale group the weights of lanes
 * l0..l1 times the group's scales (wq: the scale applied once per group and
 * lane, not per element) and the float tile's sweep over the group's rows.
 */
SP_AI void
values_q8(const mla_scratch_t *s, const int8_t *q8, int64_t hd, int64_t v_lo, int64_t l0,
          int64_t l1, int lvl)
{
    widen(lvl, q8, NULL, v_lo, hd, s->buf);
    for (int64_t g = v_lo / GQ; g * GQ < hd; g++) {
        const int64_t dlo = g * GQ > v_lo ? g * GQ : v_lo;
        const int64_t dhi = g * GQ + GQ < hd ? g * GQ + GQ : hd;
        const float *sg = s->sf + g * LN;
        for (int64_t l = l0; l < l1; l++) {
            if (lvl == 2) {
                ST16(s->wq + l * HB, LD16(s->w + l * HB) * sg[l]);
            } else {
                ST8(s->wq + l * HB, LD8(s->w + l * HB) * sg[l]);
                ST8(s->wq + l * HB + 8, LD8(s->w + l * HB + 8) * sg[l]);
            }
        }
        const float *kr = s->buf + (dlo - v_lo) * LN;
        if (lvl == 2) {
            values_w16(s->acc, kr, dlo, dhi - dlo, s->wq, l0, l1);
        } else {
            values_w8(s->acc, kr, dlo, dhi - dlo, s->wq, l0, l1);
        }
    }
}

/* The kernel's body, inlined into a baseline, an AVX2 and an AVX-512 copy
 * (lvl 0, 1, 2; 16-float vectors in the AVX-512 copy only). */
SP_AI void
mla_attn_body(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int64_t v_lo,
              const int lvl)
{
    const int64_t hd = a->head_dim, n_kv = a->n_kv, lo = sp_attn_first(a);
    const int64_t stride = sp_attn_scratch_stride(n_kv);
    const int64_t b0 = lo / LN, b1 = (n_kv + LN - 1) / LN;
    const int q8 = type == SP_TYPE_Q8_0;
    /* scratch: scores (n_q x stride), then mla_scratch_t */
    const mla_scratch_t s = mla_scratch(a->scratch + a->n_q * stride, hd);

    for (int64_t h0 = 0; h0 < a->n_q; h0 += HB) {
        const int64_t nh = a->n_q - h0 < HB ? a->n_q - h0 : HB;
        float mx[HB], sum[HB];
        for (int64_t h = 0; h < HB; h++) {
            mx[h] = h < nh && a->sinks != NULL ? a->sinks[h0 + h] : -INFINITY;
        }
        /* the group's query rows, transposed: a dimension's heads side by side */
        for (int64_t d = 0; d < hd; d++) {
            for (int64_t h = 0; h < HB; h++) {
                s.qt[d * HB + h] = h < nh ? a->q[(h0 + h) * a->q_stride + d] : 0.0f;
            }
        }
        /* 1. scores: s[h] (16 lanes) += q[h][d] key[d] */
        for (int64_t bi = b0; bi < b1; bi++) {
            float sl[HB * LN]; /* the group's 16 scores of this block */
            block_scores(k, type, a, a->blocks[bi], &s, nh, lvl, sl);
            const int64_t p0 = bi * LN > lo ? bi * LN : lo;
            const int64_t p1 = bi * LN + LN < n_kv ? bi * LN + LN : n_kv;
            for (int64_t h = 0; h < nh; h++) {
                float *sc = a->scratch + (h0 + h) * stride;
                for (int64_t p = p0; p < p1; p++) {
                    float v = sl[h * LN + p - bi * LN] * a->scale;
                    if (a->softcap > 0.0f) {
                        v = sp_attn_softcap(v, a->softcap);
                    }
                    sc[p] = v;
                    mx[h] = v > mx[h] ? v : mx[h];
                }
            }
        }
        /* 2. exp and sum */
        for (int64_t h = 0; h < nh; h++) {
            float *sc = a->scratch + (h0 + h) * stride;
            for (int64_t p = lo; p < n_kv; p++) {
                sc[p] -= mx[h];
            }
            k->exp_f32(sc + lo, sc + lo, n_kv - lo);
            float t = a->sinks != NULL ? expf(a->sinks[h0 + h] - mx[h]) : 0.0f;
            for (int64_t p = lo; p < n_kv; p++) {
                t += sc[p];
            }
            sum[h] = t;
        }
        /* 3. values from the key tile: acc[d] (16 heads) += w[lane] key[d][lane] */
        memset(s.acc, 0, sizeof(float) * (size_t)(hd * HB));
        for (int64_t bi = b0; bi < b1; bi++) {
            const int8_t *q8p = NULL;
            const float *kt = block_tile(k, type, a, a->blocks[bi], &s, &q8p);
            memset(s.w, 0, sizeof(float) * HB * LN);
            const int64_t p0 = bi * LN > lo ? bi * LN : lo;
            const int64_t p1 = bi * LN + LN < n_kv ? bi * LN + LN : n_kv;
            for (int64_t h = 0; h < nh; h++) {
                const float *sc = a->scratch + (h0 + h) * stride;
                for (int64_t p = p0; p < p1; p++) {
                    s.w[(p - bi * LN) * HB + h] = sc[p];
                }
            }
            /* only the lanes of positions the row sees: the others may hold anything
             * (another sequence's rows, never-written memory), even a NaN */
            const int64_t l0 = p0 - bi * LN, l1 = p1 - bi * LN;
            if (q8) {
                values_q8(&s, q8p, hd, v_lo, l0, l1, lvl);
            } else if (lvl == 2) {
                values_w16(s.acc, kt + v_lo * LN, v_lo, hd - v_lo, s.w, l0, l1);
            } else {
                values_w8(s.acc, kt + v_lo * LN, v_lo, hd - v_lo, s.w, l0, l1);
            }
        }
        for (int64_t h = 0; h < nh; h++) {
            float *o = a->o + (h0 + h) * a->o_stride;
            for (int64_t d = 0; d < v_lo; d++) {
                o[d] = 0.0f; /* the rotated lanes: no value reads them */
            }
            for (int64_t d = v_lo; d < hd; d++) {
                o[d] = s.acc[d * HB + h] / sum[h];
            }
        }
    }
}

static void
mla_attn_base(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int64_t v_lo)
{
    mla_attn_body(k, type, a, v_lo, 0);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Products and sums contracted into FMAs in these copies (GCC's ISO mode
 * keeps them apart; clang has no optimize attribute and contracts within a
 * statement by default). GCC forms FMAs in a pass that -O1 skips (the
 * sanitizer build's level): expensive-optimizations keeps it on there, so
 * every build fuses the same operations and the AVX2 copy's vector-extension
 * FMAs match the AVX-512 copy's explicit ones. */
#if defined(__clang__)
#define MLA_CONTRACT
#else
#define MLA_CONTRACT __attribute__((optimize("fp-contract=fast", "expensive-optimizations")))
#endif

/* Picked by the kernel table's level, so SAMPAN_CPU=scalar runs the baseline
 * copy. The AVX2 copy works on 8-float vectors, the AVX-512 one on 16: every
 * output element is the same sequence of FMAs in both (lanes and heads are
 * independent), so the two levels compute the same bits. */
__attribute__((target("avx2,fma"))) MLA_CONTRACT static void
mla_attn_avx2(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int64_t v_lo)
{
    mla_attn_body(k, type, a, v_lo, 1);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) MLA_CONTRACT static void
mla_attn_avx512(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a,
                int64_t v_lo)
{
    mla_attn_body(k, type, a, v_lo, 2);
}
#endif

void
sp__mla_attn(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int64_t v_lo)
{
    SP_ASSERT(v_lo >= 0 && v_lo <= a->head_dim && a->n_kv >= 1);
#if defined(__x86_64__) && defined(__GNUC__)
    if (k->level >= SP_CPU_AVX512) {
        mla_attn_avx512(k, type, a, v_lo);
        return;
    }
    if (k->level >= SP_CPU_AVX2) {
        mla_attn_avx2(k, type, a, v_lo);
        return;
    }
#endif
    mla_attn_base(k, type, a, v_lo);
}
