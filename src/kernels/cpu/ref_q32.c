/*
 * ref_q32.c - scalar reference kernels of the 32-element block types Q4_1, Q5_0, Q5_1,
 * IQ4_NL and MXFP4, and of the Q8_1 activation format.
 *
 * Plain C, always built, the oracle of avx2_q32.c and avx512_q32.c. Pure functions of their
 * arguments: no state, no allocation, any thread. The dot products follow the numerics
 * contract of q32_impl.h; the weight quantizers follow ggml's reference rules (what
 * llama-quantize writes without an importance matrix), with one difference: where ggml would
 * convert a NaN, infinite or out-of-range float to an integer (undefined behaviour), the value
 * is clamped first, so a hostile input gives some block, never a crash.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/q32_impl.h"

#include <float.h>
#include <math.h>

/* ---- dequantizers --------------------------------------------------------------------- */

static void
q4_1_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_q4_1 *b = src;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float d = sp_fp16_to_fp32(b[i].d), m = sp_fp16_to_fp32(b[i].m);
        float *y = dst + i * SP_QK32;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
            y[j + SP_QK32 / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void
q5_0_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_q5_0 *b = src;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float d = sp_fp16_to_fp32(b[i].d);
        const uint32_t qh = sp__q5_high_bits(b[i].qh);
        float *y = dst + i * SP_QK32;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            const int q0 = (b[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(q0 - 16) * d;
            y[j + SP_QK32 / 2] = (float)(q1 - 16) * d;
        }
    }
}

static void
q5_1_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_q5_1 *b = src;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float d = sp_fp16_to_fp32(b[i].d), m = sp_fp16_to_fp32(b[i].m);
        const uint32_t qh = sp__q5_high_bits(b[i].qh);
        float *y = dst + i * SP_QK32;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            const int q0 = (b[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)q0 * d + m;
            y[j + SP_QK32 / 2] = (float)q1 * d + m;
        }
    }
}

static void
q8_1_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_q8_1 *b = src;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float d = sp_fp16_to_fp32(b[i].d);
        for (int j = 0; j < SP_QK32; j++) {
            dst[i * SP_QK32 + j] = (float)b[i].qs[j] * d;
        }
    }
}

static void
iq4_nl_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float d = sp_fp16_to_fp32(b[i].d);
        float *y = dst + i * SP_QK32;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            y[j] = (float)sp__kvalues_iq4nl[b[i].qs[j] & 0x0f] * d;
            y[j + SP_QK32 / 2] = (float)sp__kvalues_iq4nl[b[i].qs[j] >> 4] * d;
        }
    }
}

static void
mxfp4_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float d = sp__e8m0_half(b[i].e);
        float *y = dst + i * SP_QK32;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            y[j] = (float)sp__kvalues_mxfp4[b[i].qs[j] & 0x0f] * d;
            y[j + SP_QK32 / 2] = (float)sp__kvalues_mxfp4[b[i].qs[j] >> 4] * d;
        }
    }
}

/* ---- weight quantizers (ggml's reference rules) --------------------------------------- */

/* (int)v for v clamped to [0, hi]: ggml's truncating casts, without UB for NaN / inf. */
static inline int
trunc_clamp(float v, float hi)
{
    v = fmaxf(v, 0.0f); /* fmaxf(NaN, 0) = 0 */
    v = fminf(v, hi);
    return (int)v;
}

/* Smallest and largest element (NaN ignored; FLT_MAX / -FLT_MAX when all are NaN). */
static void
block_min_max(const float *x, float *min, float *max)
{
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < SP_QK32; j++) {
        if (x[j] < lo) {
            lo = x[j];
        }
        if (x[j] > hi) {
            hi = x[j];
        }
    }
    *min = lo;
    *max = hi;
}

/* d = (max - min) / 15, q = trunc((x - min) / d + 0.5) capped at 15 (divides by the
 * unrounded d through its float reciprocal, as ggml does). */
static void
q4_1_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float *x = src + i * SP_QK32;
        float min, max;
        block_min_max(x, &min, &max);
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = sp_fp32_to_fp16(d);
        b[i].m = sp_fp32_to_fp16(min);
        for (int j = 0; j < SP_QK32 / 2; j++) {
            const int q0 = trunc_clamp((x[j] - min) * id + 0.5f, 15.0f);
            const int q1 = trunc_clamp((x[j + SP_QK32 / 2] - min) * id + 0.5f, 15.0f);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void
put_q5(uint8_t qs[SP_QK32 / 2], uint8_t qh_out[4], const int q[SP_QK32])
{
    uint32_t qh = 0;
    for (int j = 0; j < SP_QK32 / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + SP_QK32 / 2] & 0x0f) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + SP_QK32 / 2] >> 4) & 1) << (j + SP_QK32 / 2);
    }
    for (int k = 0; k < 4; k++) {
        qh_out[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* Like Q4_0: the element of largest magnitude maps to q = 0 exactly (d = max / -16),
 * q = trunc(x / d + 16.5) capped at 31. */
static void
q5_0_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float *x = src + i * SP_QK32;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < SP_QK32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = sp_fp32_to_fp16(d);
        int q[SP_QK32];
        for (int j = 0; j < SP_QK32; j++) {
            q[j] = trunc_clamp(x[j] * id + 16.5f, 31.0f);
        }
        put_q5(b[i].qs, b[i].qh, q);
    }
}

/* d = (max - min) / 31, q = trunc((x - min) / d + 0.5). */
static void
q5_1_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float *x = src + i * SP_QK32;
        float min, max;
        block_min_max(x, &min, &max);
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = sp_fp32_to_fp16(d);
        b[i].m = sp_fp32_to_fp16(min);
        int q[SP_QK32];
        for (int j = 0; j < SP_QK32; j++) {
            q[j] = trunc_clamp((x[j] - min) * id + 0.5f, 31.0f);
        }
        put_q5(b[i].qs, b[i].qh, q);
    }
}

/* Index of the grid value nearest x (ggml's best_index_int8: ties go to the upper one
 * unless strictly nearer the lower; a NaN lands on the last entry). */
static int
grid_index(const int8_t *val, float x)
{
    if (x <= val[0]) {
        return 0;
    }
    if (x >= val[15]) {
        return 15;
    }
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < val[mid]) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return x - val[hi - 1] < val[hi] - x ? hi - 1 : hi;
}

/* The weighted fit sum(w q x) and sum(w q^2) of x on the grid at inverse scale id. */
static void
iq4_nl_fit(const float *x, const float *weight, float id, uint8_t *L, float *sumqx,
           float *sumq2)
{
    float sqx = 0.0f, sq2 = 0.0f;
    for (int j = 0; j < SP_QK32; j++) {
        const int l = grid_index(sp__kvalues_iq4nl, id * x[j]);
        if (L != NULL) {
            L[j] = (uint8_t)l;
        }
        const float q = sp__kvalues_iq4nl[l];
        sqx += weight[j] * q * x[j];
        sq2 += weight[j] * q * q;
    }
    *sumqx = sqx;
    *sumq2 = sq2;
}

/*
 * IQ4_NL, as llama-quantize writes it without an importance matrix (ggml's
 * quantize_iq4_nl: weights x^2, 7 tries each side): start from the scale that puts the
 * largest-magnitude element on the grid's end (-127), take the least-squares scale of that
 * assignment, then try the 15 inverse scales (t - 127) / max, t = -7..7, keeping the one with
 * the best weighted fit; the quants are finally chosen again with the kept (unrounded) scale.
 */
static void
iq4_nl_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_iq4_nl *b = dst;
    enum { NTRY = 7 };
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float *x = src + i * SP_QK32;
        float weight[SP_QK32];
        uint8_t L[SP_QK32];
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < SP_QK32; j++) {
            weight[j] = x[j] * x[j];
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float scale = 0.0f;
        if (amax >= 1e-15f) { /* ggml's GROUP_MAX_EPS: below it the block is all zero */
            float d = -max / (float)sp__kvalues_iq4nl[0];
            float sumqx, sumq2;
            iq4_nl_fit(x, weight, 1.0f / d, NULL, &sumqx, &sumq2);
            d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
            float best = d * sumqx;
            for (int t = -NTRY; t <= NTRY; t++) {
                const float id = (float)(t + sp__kvalues_iq4nl[0]) / max;
                iq4_nl_fit(x, weight, id, NULL, &sumqx, &sumq2);
                if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            scale = d;
        }
        b[i].d = sp_fp32_to_fp16(scale);
        const float id = scale != 0.0f ? 1.0f / scale : 0.0f;
        for (int j = 0; j < SP_QK32; j++) {
            L[j] = (uint8_t)grid_index(sp__kvalues_iq4nl, id * x[j]);
        }
        for (int j = 0; j < SP_QK32 / 2; j++) {
            b[i].qs[j] = (uint8_t)(L[j] | (L[j + SP_QK32 / 2] << 4));
        }
    }
}

/* MXFP4: e = floor(log2(amax)) - 2 + 127, so amax is 8 to 16 units of the half scale and the
 * largest elements may clip to the grid's end (12 units, E2M1's 6.0); each element takes the
 * nearest grid value (the first of equals). The exponent is clamped to [0, 254] where ggml's
 * cast would overflow (tiny or infinite amax). */
static void
mxfp4_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float *x = src + i * SP_QK32;
        float amax = 0.0f;
        for (int j = 0; j < SP_QK32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
            }
        }
        float ef = amax > 0.0f ? floorf(log2f(amax)) - 2.0f + 127.0f : 0.0f;
        ef = fminf(fmaxf(ef, 0.0f), 254.0f);
        const uint8_t e = (uint8_t)ef;
        const float d = sp__e8m0_half(e);
        b[i].e = e;
        uint8_t L[SP_QK32];
        for (int j = 0; j < SP_QK32; j++) {
            int best = 0;
            float best_err = fabsf((float)sp__kvalues_mxfp4[0] * d - x[j]);
            for (int k = 1; k < 16; k++) {
                const float err = fabsf((float)sp__kvalues_mxfp4[k] * d - x[j]);
                if (err < best_err) {
                    best = k;
                    best_err = err;
                }
            }
            L[j] = (uint8_t)best;
        }
        for (int j = 0; j < SP_QK32 / 2; j++) {
            b[i].qs[j] = (uint8_t)(L[j] | (L[j + SP_QK32 / 2] << 4));
        }
    }
}

/*
 * Q8_1 activations, llama.cpp's x86 rule (like the engine's Q8_0 activations): d = amax / 127
 * stored as half, q = round-half-even(x * (127 / amax)) clamped to [-127, 127], s = half of
 * d * sum(q) with the unrounded d. A block whose half d is 0 gets q = 0 and s = 0 (127 / amax
 * could overflow, and such a block is below half's resolution anyway).
 */
void
sp__q8_1_from_float_ref(const float *src, void *dst, int64_t n)
{
    sp_block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float *x = src + i * SP_QK32;
        float amax = 0.0f;
        for (int j = 0; j < SP_QK32; j++) {
            amax = fmaxf(amax, fabsf(x[j]));
        }
        const float d = amax / 127.0f;
        b[i].d = sp_fp32_to_fp16(d);
        if (sp_fp16_to_fp32(b[i].d) == 0.0f) {
            memset(b[i].qs, 0, sizeof(b[i].qs));
            b[i].s = 0;
            continue;
        }
        const float id = 127.0f / amax;
        int32_t sum = 0;
        for (int j = 0; j < SP_QK32; j++) {
            const float v = fminf(fmaxf(x[j] * id, -127.0f), 127.0f);
            b[i].qs[j] = (int8_t)rintf(v);
            sum += b[i].qs[j];
        }
        b[i].s = sp_fp32_to_fp16(d * (float)sum);
    }
}

/* ---- dot products (numerics contract: q32_impl.h) ------------------------------------- */

void
sp__q4_1_vec_dot_ref(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q4_1 *a = w;
    const sp_block_q8_1 *b = x;
    float acc[SP_Q32_LANES] = {0.0f};
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        int32_t isum = 0;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            isum += (a[i].qs[j] & 0x0f) * (int32_t)b[i].qs[j];
            isum += (a[i].qs[j] >> 4) * (int32_t)b[i].qs[j + SP_QK32 / 2];
        }
        const float d = sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d);
        const float p = d * (float)isum;
        const float q = sp_fp16_to_fp32(a[i].m) * sp_fp16_to_fp32(b[i].s);
        const float blk = p + q;
        acc[i % SP_Q32_LANES] = acc[i % SP_Q32_LANES] + blk;
    }
    *s = sp__q32_sum_lanes(acc);
}

void
sp__q5_1_vec_dot_ref(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q5_1 *a = w;
    const sp_block_q8_1 *b = x;
    float acc[SP_Q32_LANES] = {0.0f};
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const uint32_t qh = sp__q5_high_bits(a[i].qh);
        int32_t isum = 0;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            const int q0 = (a[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (a[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += q0 * (int32_t)b[i].qs[j];
            isum += q1 * (int32_t)b[i].qs[j + SP_QK32 / 2];
        }
        const float d = sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d);
        const float p = d * (float)isum;
        const float q = sp_fp16_to_fp32(a[i].m) * sp_fp16_to_fp32(b[i].s);
        const float blk = p + q;
        acc[i % SP_Q32_LANES] = acc[i % SP_Q32_LANES] + blk;
    }
    *s = sp__q32_sum_lanes(acc);
}

void
sp__q5_0_vec_dot_ref(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q5_0 *a = w;
    const sp_block_q8_0 *b = x;
    float acc[SP_Q32_LANES] = {0.0f};
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const uint32_t qh = sp__q5_high_bits(a[i].qh);
        int32_t isum = 0;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            const int q0 = (a[i].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int q1 = (a[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += (q0 - 16) * (int32_t)b[i].qs[j];
            isum += (q1 - 16) * (int32_t)b[i].qs[j + SP_QK32 / 2];
        }
        const float d = sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d);
        const float blk = d * (float)isum;
        acc[i % SP_Q32_LANES] = acc[i % SP_Q32_LANES] + blk;
    }
    *s = sp__q32_sum_lanes(acc);
}

void
sp__iq4_nl_vec_dot_ref(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_iq4_nl *a = w;
    const sp_block_q8_0 *b = x;
    float acc[SP_Q32_LANES] = {0.0f};
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        int32_t isum = 0;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            isum += sp__kvalues_iq4nl[a[i].qs[j] & 0x0f] * (int32_t)b[i].qs[j];
            isum += sp__kvalues_iq4nl[a[i].qs[j] >> 4] * (int32_t)b[i].qs[j + SP_QK32 / 2];
        }
        const float d = sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d);
        const float blk = d * (float)isum;
        acc[i % SP_Q32_LANES] = acc[i % SP_Q32_LANES] + blk;
    }
    *s = sp__q32_sum_lanes(acc);
}

void
sp__mxfp4_vec_dot_ref(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_mxfp4 *a = w;
    const sp_block_q8_0 *b = x;
    float acc[SP_Q32_LANES] = {0.0f};
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        int32_t isum = 0;
        for (int j = 0; j < SP_QK32 / 2; j++) {
            isum += sp__kvalues_mxfp4[a[i].qs[j] & 0x0f] * (int32_t)b[i].qs[j];
            isum += sp__kvalues_mxfp4[a[i].qs[j] >> 4] * (int32_t)b[i].qs[j + SP_QK32 / 2];
        }
        const float d = sp_fp16_to_fp32(b[i].d) * sp__e8m0_half(a[i].e);
        const float blk = d * (float)isum;
        acc[i % SP_Q32_LANES] = acc[i % SP_Q32_LANES] + blk;
    }
    *s = sp__q32_sum_lanes(acc);
}

/* The batched entry: vec_dot for every (row, token); bit-identical to it by construction. */
#define REF_GEMM(name, dot)                                                                   \
    static void name(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,      \
                     const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)    \
    {                                                                                         \
        const char *wb = w, *xb = x;                                                          \
        for (int64_t t = 0; t < n_tok; t++) {                                                 \
            for (int64_t r = r0; r < r1; r++) {                                               \
                dot(n, &y[t * ldy + r], wb + (size_t)r * w_stride, xb + (size_t)t * x_stride);\
            }                                                                                 \
        }                                                                                     \
    }

REF_GEMM(q4_1_gemm_ref, sp__q4_1_vec_dot_ref)
REF_GEMM(q5_0_gemm_ref, sp__q5_0_vec_dot_ref)
REF_GEMM(q5_1_gemm_ref, sp__q5_1_vec_dot_ref)
REF_GEMM(iq4_nl_gemm_ref, sp__iq4_nl_vec_dot_ref)
REF_GEMM(mxfp4_gemm_ref, sp__mxfp4_vec_dot_ref)

/* ---- registration and the public quantizer hooks -------------------------------------- */

void
sp__q32_level_ref(sp_q32_level_t *l)
{
    l->vec_dot[SP_TYPE_Q4_1] = sp__q4_1_vec_dot_ref;
    l->vec_dot[SP_TYPE_Q5_0] = sp__q5_0_vec_dot_ref;
    l->vec_dot[SP_TYPE_Q5_1] = sp__q5_1_vec_dot_ref;
    l->vec_dot[SP_TYPE_IQ4_NL] = sp__iq4_nl_vec_dot_ref;
    l->vec_dot[SP_TYPE_MXFP4] = sp__mxfp4_vec_dot_ref;
    l->gemm[SP_TYPE_Q4_1] = q4_1_gemm_ref;
    l->gemm[SP_TYPE_Q5_0] = q5_0_gemm_ref;
    l->gemm[SP_TYPE_Q5_1] = q5_1_gemm_ref;
    l->gemm[SP_TYPE_IQ4_NL] = iq4_nl_gemm_ref;
    l->gemm[SP_TYPE_MXFP4] = mxfp4_gemm_ref;
}

/* Copy a level's entries for the five weight types into the kernel table. */
void
sp__q32_apply(sp_cpu_kernels_t *k, const sp_q32_level_t *l)
{
    static const sp_type_t types[] = {SP_TYPE_Q4_1, SP_TYPE_Q5_0, SP_TYPE_Q5_1, SP_TYPE_IQ4_NL,
                                      SP_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (l->vec_dot[types[i]] != NULL) {
            k->vec_dot[types[i]] = l->vec_dot[types[i]];
        }
        if (l->gemm[types[i]] != NULL) {
            k->gemm[types[i]] = l->gemm[types[i]];
        }
    }
}

void
sp__q32_register_ref(sp_cpu_kernels_t *k)
{
    k->vec_dot_type[SP_TYPE_Q4_1] = SP_TYPE_Q8_1;
    k->vec_dot_type[SP_TYPE_Q5_1] = SP_TYPE_Q8_1;
    k->vec_dot_type[SP_TYPE_Q5_0] = SP_TYPE_Q8_0;
    k->vec_dot_type[SP_TYPE_IQ4_NL] = SP_TYPE_Q8_0;
    k->vec_dot_type[SP_TYPE_MXFP4] = SP_TYPE_Q8_0;

    k->from_float[SP_TYPE_Q8_1] = sp__q8_1_from_float_ref; /* activations */
    k->from_float[SP_TYPE_Q4_1] = q4_1_from_float;
    k->from_float[SP_TYPE_Q5_0] = q5_0_from_float;
    k->from_float[SP_TYPE_Q5_1] = q5_1_from_float;
    k->from_float[SP_TYPE_IQ4_NL] = iq4_nl_from_float;
    k->from_float[SP_TYPE_MXFP4] = mxfp4_from_float;

    k->to_float[SP_TYPE_Q4_1] = q4_1_to_float;
    k->to_float[SP_TYPE_Q5_0] = q5_0_to_float;
    k->to_float[SP_TYPE_Q5_1] = q5_1_to_float;
    k->to_float[SP_TYPE_Q8_1] = q8_1_to_float;
    k->to_float[SP_TYPE_IQ4_NL] = iq4_nl_to_float;
    k->to_float[SP_TYPE_MXFP4] = mxfp4_to_float;

    sp_q32_level_t l = {0};
    sp__q32_level_ref(&l);
    sp__q32_apply(k, &l);
}

bool
sp__q32_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n)
{
    switch (type) {
    case SP_TYPE_Q4_1: q4_1_from_float(src, dst, n); return true;
    case SP_TYPE_Q5_0: q5_0_from_float(src, dst, n); return true;
    case SP_TYPE_Q5_1: q5_1_from_float(src, dst, n); return true;
    case SP_TYPE_Q8_1: sp__q8_1_from_float_ref(src, dst, n); return true;
    case SP_TYPE_IQ4_NL: iq4_nl_from_float(src, dst, n); return true;
    case SP_TYPE_MXFP4: mxfp4_from_float(src, dst, n); return true;
    default: return false;
    }
}

bool
sp__q32_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n)
{
    switch (type) {
    case SP_TYPE_Q4_1: q4_1_to_float(src, dst, n); return true;
    case SP_TYPE_Q5_0: q5_0_to_float(src, dst, n); return true;
    case SP_TYPE_Q5_1: q5_1_to_float(src, dst, n); return true;
    case SP_TYPE_Q8_1: q8_1_to_float(src, dst, n); return true;
    case SP_TYPE_IQ4_NL: iq4_nl_to_float(src, dst, n); return true;
    case SP_TYPE_MXFP4: mxfp4_to_float(src, dst, n); return true;
    default: return false;
    }
}
