/*
 * neon_attn.c - arm64 Advanced SIMD attention over an F32, F16 or Q8_0 KV cache, vector exp,
 * RMSNorm and SwiGLU (base ARMv8-A: every arm64 CPU; dispatch.c registers it at the "neon"
 * level and the "dotprod" level keeps it, as nothing here is an integer product).
 *
 * The same three passes as avx2_attn.c, with four float32x4 per 16 lanes:
 *   1. scores: a key block of 16 positions (transposed, kernels.h) for up to 4 heads at a time,
 *      per head four 4-lane accumulators summing q[d] * k[.][d] over d in order (one FMA chain
 *      of head_dim terms per position, as AVX2's), then times scale;
 *   2. softmax per head: soft-cap (kernels.h's scalar rule), max, e = exp(s - max) in place and
 *      the sum in two 4-lane accumulators (positions p % 8 < 4 and >= 4: AVX2's 8 lanes, so
 *      chains of n_kv / 8 terms), with the sink when there is one;
 *   3. o = (1 / sum) sum_p e_p v_p for up to 4 heads x 16 dims per sweep over the value rows,
 *      positions in order.
 * Each head's result depends only on its own q row and the cache, with a fixed order of
 * operations: not on n_q, the other heads or where the blocks live (batch invariance). The
 * error bounds are AVX2's (tests/unit/test_attn.c states them). NEON has no masked loads: the
 * head_dim tails and the element-wise tails go through zero-padded copies, so no byte outside
 * the arguments is read or written. Pure functions: any thread, no heap.
 */
#include "kernels/cpu/cpu_impl.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define NA_INLINE static inline __attribute__((always_inline))

/* ---- exp ----------------------------------------------------------------------------------- */

/* e^x by cpu_impl.h's rule (the constants and the split 2^n1 2^n2 scaling of avx2_attn.c). */
NA_INLINE float32x4_t
na_exp4(float32x4_t x)
{
    /* FMAX / FMIN return NaN when either operand is NaN: NaN passes through. */
    x = vmaxq_f32(vdupq_n_f32(SP_EXP_LO), x);
    x = vminq_f32(vdupq_n_f32(SP_EXP_HI), x);
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(SP_EXP_LOG2E)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(SP_EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(SP_EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(SP_EXP_P5);
    p = vfmaq_f32(vdupq_n_f32(SP_EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(SP_EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(SP_EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(SP_EXP_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(SP_EXP_P0), p, r);
    const float32x4_t y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    /* n is integral in [-150, 128] (NaN converts to 0; y is NaN then anyway) */
    const int32x4_t ni = vcvtq_s32_f32(n);
    const int32x4_t n1 = vshrq_n_s32(ni, 1);
    const int32x4_t n2 = vsubq_s32(ni, n1);
    const int32x4_t bias = vdupq_n_s32(127);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
    return vmulq_f32(vmulq_f32(y, s1), s2);
}

/* ---- loads ----------------------------------------------------------------------------------- */

/* Four halves from any byte address (value rows and Q8_0 tiles may be odd-aligned): byte
 * loads reinterpreted, little-endian lane order. */
NA_INLINE float32x4_t
na_h4(const void *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8((const uint8_t *)p)));
}

NA_INLINE float
na_h1(const void *p)
{
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
}

/* Sixteen int8 as four float32x4 times s (exact: int8 x F16 fits a float). */
NA_INLINE void
na_q16(int8x16_t q, const float32x4_t s[4], float32x4_t out[4])
{
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    out[0] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), s[0]);
    out[1] = vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), s[1]);
    out[2] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), s[2]);
    out[3] = vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), s[3]);
}

/* kind: 0 F32, 1 F16, 2 Q8_0 (whose offsets count bytes, kernels.h). */
NA_INLINE const char *
na_kv(const void *base, int kind, int64_t i)
{
    return (const char *)base + i * (kind == 0 ? 4 : kind == 1 ? 2 : 1);
}

/* ---- pass 1: scores ------------------------------------------------------------------------- */

/* The 16 keys of dim d of a block, in float. */
NA_INLINE void
na_key_row(const char *kb, int kind, int64_t hd, int64_t d, float32x4_t k[4])
{
    if (kind == 0) {
        const float *r = (const float *)kb + d * 16;
        for (int j = 0; j < 4; j++) {
            k[j] = vld1q_f32(r + 4 * j);
        }
    } else if (kind == 1) {
        const char *r = kb + d * 32;
        for (int j = 0; j < 4; j++) {
            k[j] = na_h4(r + 8 * j);
        }
    } else {
        /* int8 [hd][16], then F16 scales [G][16]: group d / 32's 16 lane scales */
        const char *sp = kb + 16 * hd + 32 * (d / 32);
        float32x4_t s[4];
        for (int j = 0; j < 4; j++) {
            s[j] = na_h4(sp + 8 * j);
        }
        na_q16(vld1q_s8((const int8_t *)kb + d * 16), s, k);
    }
}

/* Scores of the block at p0 for NH (<= 4) heads from h0 into the scratch. */
NA_INLINE void
na_scores(const sp_attn_args_t *a, int kind, int64_t p0, int64_t h0, int NH)
{
    const int64_t hd = a->head_dim, ss = sp_attn_scratch_stride(a->n_kv);
    const char *kb = na_kv(a->k, kind, a->blocks[p0 / 16] * a->k_block_stride);
    const float *q[4];
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        q[h] = a->q + (h0 + h) * a->q_stride;
        for (int j = 0; j < 4; j++) {
            acc[h][j] = vdupq_n_f32(0.0f);
        }
    }
    for (int64_t d = 0; d < hd; d++) {
        float32x4_t k[4];
        na_key_row(kb, kind, hd, d, k);
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            const float qd = q[h][d];
            for (int j = 0; j < 4; j++) {
                acc[h][j] = vfmaq_n_f32(acc[h][j], k[j], qd);
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        float *s = a->scratch + (h0 + h) * ss + p0;
        for (int j = 0; j < 4; j++) {
            vst1q_f32(s + 4 * j, vmulq_n_f32(acc[h][j], a->scale));
        }
    }
}

/* ---- pass 2: softmax ------------------------------------------------------------------------ */

/* Lanes p + i with lo <= p + i < n, as an all-ones / zero mask. */
NA_INLINE uint32x4_t
na_range(int64_t p, int64_t lo, int64_t n)
{
    static const int32_t iota[4] = {0, 1, 2, 3};
    const int64_t a = lo - p < 0 ? 0 : lo - p > 4 ? 4 : lo - p;
    const int64_t b = n - p < 0 ? 0 : n - p > 4 ? 4 : n - p;
    const int32x4_t i = vld1q_s32(iota);
    return vandq_u32(vcgeq_s32(i, vdupq_n_s32((int32_t)a)), vcltq_s32(i, vdupq_n_s32((int32_t)b)));
}

/* One head over positions lo..n-1: soft-cap, exp(s - max) in place; returns 1 / sum. */
NA_INLINE float
na_softmax(float *sc, int64_t lo, int64_t n, float softcap, const float *sink)
{
    if (softcap > 0.0f) {
        for (int64_t p = lo; p < n; p++) {
            sc[p] = sp_attn_softcap(sc[p], softcap);
        }
    }
    const int64_t p_start = lo & ~(int64_t)15;
    float32x4_t mx = vdupq_n_f32(-INFINITY);
    for (int64_t p = p_start; p < n; p += 4) {
        mx = vbslq_f32(na_range(p, lo, n), vmaxq_f32(mx, vld1q_f32(sc + p)), mx);
    }
    float mxs = vmaxvq_f32(mx);
    if (sink != NULL && *sink > mxs) {
        mxs = *sink;
    }
    const float32x4_t mv = vdupq_n_f32(mxs);
    float32x4_t sum[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t p = p_start; p < n; p += 4) {
        const uint32x4_t m = na_range(p, lo, n);
        const float32x4_t e = vreinterpretq_f32_u32(
            vandq_u32(m, vreinterpretq_u32_f32(na_exp4(vsubq_f32(vld1q_f32(sc + p), mv)))));
        vst1q_f32(sc + p, e);
        sum[(p >> 2) & 1] = vaddq_f32(sum[(p >> 2) & 1], e);
    }
    const float total = vaddvq_f32(vaddq_f32(sum[0], sum[1]));
    return 1.0f / (total + (sink != NULL ? expf(*sink - mxs) : 0.0f));
}

/* ---- pass 3: values ------------------------------------------------------------------------- */

/* Dims d0..d0+15 of the value row starting at `row`, in float; nv (1..16) of them exist, the
 * rest are zero and never read. Q8_0: the row's groups {F16 d, int8 q[32]} (d0 is a multiple
 * of 16, so the 16 dims lie in one group). */
NA_INLINE void
na_value16(const char *row, int kind, int64_t d0, int64_t nv, float32x4_t v[4])
{
    if (kind == 2) {
        const char *g = row + (d0 / 32) * 34;
        const float32x4_t s = vdupq_n_f32(na_h1(g));
        const float32x4_t s4[4] = {s, s, s, s};
        int8x16_t q;
        if (nv >= 16) {
            q = vld1q_s8((const int8_t *)g + 2 + d0 % 32);
        } else {
            int8_t tmp[16] = {0};
            memcpy(tmp, g + 2 + d0 % 32, (size_t)nv);
            q = vld1q_s8(tmp);
        }
        na_q16(q, s4, v);
        return;
    }
    const size_t esz = kind == 0 ? 4 : 2;
    const char *src = row + (size_t)d0 * esz;
    float tmp[16]; /* float storage: F32 lanes are read as floats, F16 ones as bytes */
    if (nv < 16) {
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, src, (size_t)nv * esz);
        src = (const char *)tmp;
    }
    for (int j = 0; j < 4; j++) {
        v[j] = kind == 0 ? vld1q_f32((const float *)src + 4 * j) : na_h4(src + 8 * j);
    }
}

/* NH heads from h0, dims d0..d0+15 (nv of them inside head_dim). */
NA_INLINE void
na_values(const sp_attn_args_t *a, int kind, const float *inv, int64_t h0, int NH, int64_t d0)
{
    const int64_t ss = sp_attn_scratch_stride(a->n_kv), hd = a->head_dim;
    const int64_t nv = hd - d0 < 16 ? hd - d0 : 16;
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        for (int j = 0; j < 4; j++) {
            acc[h][j] = vdupq_n_f32(0.0f);
        }
    }
    const int64_t lo = sp_attn_first(a);
    for (int64_t p0 = lo & ~(int64_t)15; p0 < a->n_kv; p0 += 16) {
        const char *vb = na_kv(a->v, kind, a->blocks[p0 / 16] * a->v_block_stride);
        const float *e = a->scratch + h0 * ss + p0;
        const int64_t n = a->n_kv - p0 < 16 ? a->n_kv - p0 : 16;
        for (int64_t p = p0 < lo ? lo - p0 : 0; p < n; p++) {
            float32x4_t v[4];
            na_value16(na_kv(vb, kind, p * a->v_stride), kind, d0, nv, v);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) {
                const float w = e[h * ss + p];
                for (int j = 0; j < 4; j++) {
                    acc[h][j] = vfmaq_n_f32(acc[h][j], v[j], w);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) {
        float *o = a->o + (h0 + h) * a->o_stride + d0;
        float out[16];
        for (int j = 0; j < 4; j++) {
            vst1q_f32(out + 4 * j, vmulq_n_f32(acc[h][j], inv[h]));
        }
        memcpy(o, out, (size_t)nv * sizeof(float));
    }
}

/* ---- the three passes ------------------------------------------------------------------------ */

/* Key blocks PF_BLOCKS ahead into L1, value rows into L2 (as avx2_attn.c). */
#define PF_BLOCKS 4

NA_INLINE void
na_prefetch(const sp_attn_args_t *a, int kind, int64_t p0)
{
    if (p0 >= a->n_kv) {
        return;
    }
    const int64_t elt = kind == 0 ? 4 : kind == 1 ? 2 : 1;
    const int64_t row_bytes = kind == 2 ? sp_kv_q8_row_bytes(a->head_dim) : a->head_dim * elt;
    const char *k = na_kv(a->k, kind, a->blocks[p0 / 16] * a->k_block_stride);
    const char *vb = na_kv(a->v, kind, a->blocks[p0 / 16] * a->v_block_stride);
    for (int64_t off = 0; off < 16 * row_bytes; off += 64) {
        __builtin_prefetch(k + off, 0, 3);
    }
    const int64_t n = a->n_kv - p0 < 16 ? a->n_kv - p0 : 16;
    for (int64_t p = 0; p < n; p++) {
        const char *v = vb + p * a->v_stride * elt;
        for (int64_t off = 0; off < row_bytes; off += 64) {
            __builtin_prefetch(v + off, 0, 2);
        }
    }
}

NA_INLINE void
na_attn(const sp_attn_args_t *a, int kind)
{
    const int64_t n_kv = a->n_kv, ss = sp_attn_scratch_stride(n_kv);
    const int64_t lo = sp_attn_first(a), p_start = lo & ~(int64_t)15;
    for (int b = 0; b < PF_BLOCKS; b++) {
        na_prefetch(a, kind, p_start + 16 * b);
    }
    for (int64_t p0 = p_start; p0 < n_kv; p0 += 16) {
        na_prefetch(a, kind, p0 + 16 * PF_BLOCKS);
        for (int64_t h0 = 0; h0 < a->n_q; h0 += 4) {
            switch (a->n_q - h0 < 4 ? a->n_q - h0 : 4) {
            case 4: na_scores(a, kind, p0, h0, 4); break;
            case 3: na_scores(a, kind, p0, h0, 3); break;
            case 2: na_scores(a, kind, p0, h0, 2); break;
            default: na_scores(a, kind, p0, h0, 1); break;
            }
        }
    }
    for (int64_t h0 = 0; h0 < a->n_q; h0 += 4) {
        float inv[4];
        const int nh = a->n_q - h0 < 4 ? (int)(a->n_q - h0) : 4;
        for (int h = 0; h < nh; h++) {
            inv[h] = na_softmax(a->scratch + (h0 + h) * ss, lo, n_kv, a->softcap,
                                a->sinks != NULL ? &a->sinks[h0 + h] : NULL);
        }
        for (int64_t d0 = 0; d0 < a->head_dim; d0 += 16) {
            switch (nh) {
            case 4: na_values(a, kind, inv, h0, 4, d0); break;
            case 3: na_values(a, kind, inv, h0, 3, d0); break;
            case 2: na_values(a, kind, inv, h0, 2, d0); break;
            default: na_values(a, kind, inv, h0, 1, d0); break;
            }
        }
    }
}

static void
attn_f32(const sp_attn_args_t *a)
{
    na_attn(a, 0);
}

static void
attn_f16(const sp_attn_args_t *a)
{
    na_attn(a, 1);
}

static void
attn_q8_0(const sp_attn_args_t *a)
{
    na_attn(a, 2);
}

/* ---- element-wise ops ------------------------------------------------------------------------ */

static void
exp_f32(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, na_exp4(vld1q_f32(x + i)));
    }
    if (i < n) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        vst1q_f32(t, na_exp4(vld1q_f32(t)));
        memcpy(y + i, t, (size_t)(n - i) * sizeof(float));
    }
}

/* Sum of squares in 64 lanes (16 accumulators; element i in lane i % 64, as AVX-512's 4 x 16),
 * so each lane's chain is n / 64 terms: within (n / 64 + 7) u of the exact sum. */
static void
rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    float32x4_t acc[16];
    for (int j = 0; j < 16; j++) {
        acc[j] = vdupq_n_f32(0.0f);
    }
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        for (int j = 0; j < 16; j++) {
            const float32x4_t v = vld1q_f32(x + i + 4 * j);
            acc[j] = vfmaq_f32(acc[j], v, v);
        }
    }
    if (i < n) {
        float t[64] = {0.0f};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        for (int j = 0; j < 16; j++) {
            const float32x4_t v = vld1q_f32(t + 4 * j);
            acc[j] = vfmaq_f32(acc[j], v, v);
        }
    }
    for (int s = 8; s >= 1; s /= 2) {
        for (int j = 0; j < s; j++) {
            acc[j] = vaddq_f32(acc[j], acc[j + s]);
        }
    }
    const double ss = (double)vaddvq_f32(acc[0]);
    const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    /* x * scale * w in the reference's order (two roundings per element) */
    for (i = 0; i + 4 <= n; i += 4) {
        vst1q_f32(out + i, vmulq_f32(vmulq_n_f32(vld1q_f32(x + i), scale), vld1q_f32(w + i)));
    }
    for (; i < n; i++) {
        out[i] = x[i] * scale * w[i];
    }
}

NA_INLINE float32x4_t
na_swiglu4(float32x4_t g, float32x4_t u)
{
    const float32x4_t den = vaddq_f32(vdupq_n_f32(1.0f), na_exp4(vnegq_f32(g)));
    return vmulq_f32(vdivq_f32(g, den), u);
}

static void
swiglu(float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(g + i, na_swiglu4(vld1q_f32(g + i), vld1q_f32(u + i)));
    }
    if (i < n) {
        float tg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        memcpy(tg, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(tu, u + i, (size_t)(n - i) * sizeof(float));
        vst1q_f32(tg, na_swiglu4(vld1q_f32(tg), vld1q_f32(tu)));
        memcpy(g + i, tg, (size_t)(n - i) * sizeof(float));
    }
}

void
sp__attn_register_neon(sp_cpu_kernels_t *k)
{
    k->attn[SP_TYPE_F32] = attn_f32;
    k->attn[SP_TYPE_F16] = attn_f16;
    k->attn[SP_TYPE_Q8_0] = attn_q8_0;
    k->exp_f32 = exp_f32;
    k->rmsnorm = rmsnorm;
    k->swiglu = swiglu;
}
