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
 * Order of work, per group of up to 16 query heads (HB):
 *   1. scores: per block, the tile in float, then for each dimension d and
 *      head h the 16 lanes' q[h][d] * key[d][lane] (GCC vector types, four
 *      heads' sums held in registers over the tile); scaled, soft-capped,
 *      their maximum;
 *   2. exp and sum per head (the kernel table's exp), as the other kernels;
 *   3. values: per block, acc[d][h] += sum over lanes w[lane][h] key[d][lane]
 *      for d >= v_lo (the first R lanes of the output are the rotated part,
 *      which no one reads: set to 0), then divided by the sum.
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

#include "core/assert.h"

#define LN SP_ATTN_BLOCK /* positions per block: the tile's lanes */
#define HB 16            /* query heads per pass */

int64_t
sp__mla_attn_scratch_floats(int64_t head_dim)
{
    /* tile in float (and a Q8_0 tile's scales), value accumulators, weights */
    return 2 * head_dim * HB + ((head_dim + SP_QK8_0 - 1) / SP_QK8_0) * LN + HB * LN;
}

/* The key tile of block id `id` in float (hd rows of 16 lanes): the cache
 * itself for F32, else converted into buf. */
static inline __attribute__((always_inline)) const float *
tile_f32(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int32_t id,
         float *buf)
{
    const int64_t hd = a->head_dim;
    if (type == SP_TYPE_F32) {
        return (const float *)a->k + (int64_t)id * a->k_block_stride;
    }
    if (type == SP_TYPE_F16) {
        k->to_float[SP_TYPE_F16]((const sp_fp16_t *)a->k + (int64_t)id * a->k_block_stride, buf,
                                 hd * LN);
        return buf;
    }
    /* Q8_0 (kernels.h): int8 q[d][lane], then F16 scales [d / 32][lane] */
    const char *t = (const char *)a->k + (int64_t)id * a->k_block_stride;
    const int8_t *q = (const int8_t *)t;
    const int64_t n_g = (hd + SP_QK8_0 - 1) / SP_QK8_0;
    float *sf = buf + hd * LN; /* the groups' scales in float, then the tile */
    k->to_float[SP_TYPE_F16](t + LN * hd, sf, n_g * LN);
    for (int64_t d = 0; d < hd; d++) {
        const float *sd = sf + (d / SP_QK8_0) * LN;
        for (int64_t l = 0; l < LN; l++) {
            buf[d * LN + l] = (float)q[d * LN + l] * sd[l];
        }
    }
    return buf;
}

/* 8 floats, GCC's vector extension: an AVX2 register in the AVX2 and AVX-512
 * copies below, two SSE registers in the baseline build, NEON pairs on arm64.
 * A row of 16 (one block's lanes, or one group's heads) is two of them. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
#define LD8(p) (*(const v8u *)(const void *)(p))
#define ST8(p, v) (*(v8u *)(void *)(p) = (v))

/* The kernel's body, inlined into a baseline and an AVX2 copy (mla_attn_run). */
static inline __attribute__((always_inline)) void
mla_attn_body(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int64_t v_lo)
{
    const int64_t hd = a->head_dim, n_kv = a->n_kv, lo = sp_attn_first(a);
    const int64_t stride = sp_attn_scratch_stride(n_kv);
    const int64_t b0 = lo / LN, b1 = (n_kv + LN - 1) / LN;
    /* scratch: scores (n_q x stride), then the tile, the accumulators and the weights */
    float *buf = a->scratch + a->n_q * stride;
    float *acc = buf + hd * LN + ((hd + SP_QK8_0 - 1) / SP_QK8_0) * LN;
    float *w = acc + hd * HB;

    for (int64_t h0 = 0; h0 < a->n_q; h0 += HB) {
        const int64_t nh = a->n_q - h0 < HB ? a->n_q - h0 : HB;
        float mx[HB], sum[HB];
        for (int64_t h = 0; h < HB; h++) {
            mx[h] = h < nh && a->sinks != NULL ? a->sinks[h0 + h] : -INFINITY;
        }
        /* 1. scores: s[h] (16 lanes) += q[h][d] key[d] */
        for (int64_t bi = b0; bi < b1; bi++) {
            const float *kt = tile_f32(k, type, a, a->blocks[bi], buf);
            float sl[HB * LN]; /* the group's 16 scores of this block */
            /* 4 heads per sweep of the tile: their sums stay in registers */
            for (int64_t hh = 0; hh < nh; hh += 4) {
                const float *q0 = a->q + (h0 + hh) * a->q_stride;
                const int64_t qs = a->q_stride, n4 = nh - hh < 4 ? nh - hh : 4;
                const float *q1 = n4 > 1 ? q0 + qs : q0, *q2 = n4 > 2 ? q0 + 2 * qs : q0;
                const float *q3 = n4 > 3 ? q0 + 3 * qs : q0; /* missing heads: recomputed */
                v8 c0l = {0}, c0h = {0}, c1l = {0}, c1h = {0};
                v8 c2l = {0}, c2h = {0}, c3l = {0}, c3h = {0};
                for (int64_t d = 0; d < hd; d++) {
                    const v8 kl = LD8(kt + d * LN), kh = LD8(kt + d * LN + 8);
                    c0l += q0[d] * kl;
                    c0h += q0[d] * kh;
                    c1l += q1[d] * kl;
                    c1h += q1[d] * kh;
                    c2l += q2[d] * kl;
                    c2h += q2[d] * kh;
                    c3l += q3[d] * kl;
                    c3h += q3[d] * kh;
                }
                ST8(sl + hh * LN, c0l);
                ST8(sl + hh * LN + 8, c0h);
                if (n4 > 1) {
                    ST8(sl + (hh + 1) * LN, c1l);
                    ST8(sl + (hh + 1) * LN + 8, c1h);
                }
                if (n4 > 2) {
                    ST8(sl + (hh + 2) * LN, c2l);
                    ST8(sl + (hh + 2) * LN + 8, c2h);
                }
                if (n4 > 3) {
                    ST8(sl + (hh + 3) * LN, c3l);
                    ST8(sl + (hh + 3) * LN + 8, c3h);
                }
            }
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
        memset(acc, 0, sizeof(float) * (size_t)(hd * HB));
        for (int64_t bi = b0; bi < b1; bi++) {
            const float *kt = tile_f32(k, type, a, a->blocks[bi], buf);
            memset(w, 0, sizeof(float) * HB * LN);
            const int64_t p0 = bi * LN > lo ? bi * LN : lo;
            const int64_t p1 = bi * LN + LN < n_kv ? bi * LN + LN : n_kv;
            for (int64_t h = 0; h < nh; h++) {
                const float *sc = a->scratch + (h0 + h) * stride;
                for (int64_t p = p0; p < p1; p++) {
                    w[(p - bi * LN) * HB + h] = sc[p];
                }
            }
            /* only the lanes of positions the row sees: the others may hold anything
             * (another sequence's rows, never-written memory), even a NaN */
            const int64_t l0 = p0 - bi * LN, l1 = p1 - bi * LN;
            /* 4 dimensions per sweep of the weights: their sums stay in registers */
            int64_t d = v_lo;
            for (; d + 4 <= hd; d += 4) {
                const float *kr = kt + d * LN;
                float *ad = acc + d * HB;
                v8 a0l = LD8(ad), a0h = LD8(ad + 8), a1l = LD8(ad + 16), a1h = LD8(ad + 24);
                v8 a2l = LD8(ad + 32), a2h = LD8(ad + 40), a3l = LD8(ad + 48), a3h = LD8(ad + 56);
                for (int64_t l = l0; l < l1; l++) {
                    const v8 wl = LD8(w + l * HB), wh = LD8(w + l * HB + 8);
                    a0l += wl * kr[l];
                    a0h += wh * kr[l];
                    a1l += wl * kr[LN + l];
                    a1h += wh * kr[LN + l];
                    a2l += wl * kr[2 * LN + l];
                    a2h += wh * kr[2 * LN + l];
                    a3l += wl * kr[3 * LN + l];
                    a3h += wh * kr[3 * LN + l];
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
            for (; d < hd; d++) {
                const float *kr = kt + d * LN;
                float *ad = acc + d * HB;
                v8 al = LD8(ad), ah = LD8(ad + 8);
                for (int64_t l = l0; l < l1; l++) {
                    al += LD8(w + l * HB) * kr[l];
                    ah += LD8(w + l * HB + 8) * kr[l];
                }
                ST8(ad, al);
                ST8(ad + 8, ah);
            }
        }
        for (int64_t h = 0; h < nh; h++) {
            float *o = a->o + (h0 + h) * a->o_stride;
            for (int64_t d = 0; d < v_lo; d++) {
                o[d] = 0.0f; /* the rotated lanes: no value reads them */
            }
            for (int64_t d = v_lo; d < hd; d++) {
                o[d] = acc[d * HB + h] / sum[h];
            }
        }
    }
}

static void
mla_attn_base(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int64_t v_lo)
{
    mla_attn_body(k, type, a, v_lo);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Products and sums contracted into FMAs in these copies (GCC's ISO mode
 * keeps them apart; clang has no optimize attribute and contracts within a
 * statement by default). */
#if defined(__clang__)
#define MLA_CONTRACT
#else
#define MLA_CONTRACT __attribute__((optimize("fp-contract=fast")))
#endif

/* The same code for the AVX2 and AVX-512 levels (8- and 16-wide registers):
 * picked by the kernel table's level, so SAMPAN_CPU=scalar runs the baseline
 * copy and each level computes the same bits wherever it runs. */
__attribute__((target("avx2,fma"))) MLA_CONTRACT static void
mla_attn_avx2(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a, int64_t v_lo)
{
    mla_attn_body(k, type, a, v_lo);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) MLA_CONTRACT static void
mla_attn_avx512(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a,
                int64_t v_lo)
{
    mla_attn_body(k, type, a, v_lo);
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
