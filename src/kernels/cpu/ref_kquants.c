/*
 * ref_kquants.c - scalar reference for the K-quant family: Q4_K and Q6_K weights, Q8_K
 * activations. These are the oracle the SIMD files are tested against, and the quantizers that
 * `sampan quantize` and the test generators use (deterministic: the same floats always give the
 * same bytes).
 *
 * Dot products follow the numerics contract of kquants_impl.h (exact int32 per super-block,
 * then a fixed float sequence), so every level gives these exact bits.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants_impl.h"

static inline int
clampi(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* Round half to even, like the SIMD conversions in the default rounding mode. The clamp keeps
 * the float -> int conversion defined for garbage input (inf, NaN -> -1e9); every caller clamps
 * the result to a small range anyway. */
static inline int
round_int(float v)
{
    return (int)nearbyintf(fminf(fmaxf(v, -1e9f), 1e9f));
}

/* ---- Q8_K (activations) --------------------------------------------------------------------- */

void
sp__q8k_from_float_ref(const float *src, void *dst, int64_t n)
{
    sp_block_q8_k *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        float amax = 0.0f;
        for (int i = 0; i < SP_QK_K; i++) {
            float a = fabsf(src[i]);
            if (a > amax)
                amax = a;
        }
        const float iscale = sp__q8k_iscale(amax);
        y[b].d = sp__q8k_d(amax);
        for (int i = 0; i < SP_QK_K; i++)
            y[b].qs[i] = (int8_t)clampi(round_int(src[i] * iscale), -127, 127);
        for (int g = 0; g < SP_QK_K / 16; g++) {
            int sum = 0;
            for (int i = 0; i < 16; i++)
                sum += y[b].qs[16 * g + i];
            y[b].bsums[g] = (int16_t)sum;
        }
    }
}

void
sp__q8k_to_float_ref(const void *src, float *dst, int64_t n)
{
    const sp_block_q8_k *x = src;
    for (int64_t b = 0; b < n / SP_QK_K; b++)
        for (int i = 0; i < SP_QK_K; i++)
            *dst++ = x[b].d * (float)x[b].qs[i];
}

/* ---- Q4_K ----------------------------------------------------------------------------------- */

void
sp__q4k_to_float_ref(const void *src, float *dst, int64_t n)
{
    const sp_block_q4_k *x = src;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        uint8_t sc[8], m[8];
        sp__q4k_unpack_scales(x[b].scales, sc, m);
        const float d = sp_fp16_to_fp32(x[b].d);
        const float dmin = sp_fp16_to_fp32(x[b].dmin);
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = x[b].qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            const float ds = d * sc[j], dm = dmin * m[j];
            for (int l = 0; l < 32; l++)
                *dst++ = ds * (float)((q[l] >> shift) & 0xF) - dm;
        }
    }
}

/* Squared error of x ~= s * q + b over one sub-block. */
static float
q4k_sub_error(const float *x, const uint8_t *q, float s, float b)
{
    float err = 0.0f;
    for (int i = 0; i < 32; i++) {
        float e = s * (float)q[i] + b - x[i];
        err += e * e;
    }
    return err;
}

/*
 * Fit x[0..32) ~= scale * q - mn, q in 0..15, scale >= 0, mn >= 0 (the format can only shift
 * down). Candidates: the plain min/max grid, and 21 grids whose step is stretched by up to +-7%
 * around it; for each the levels are rounded and (scale, offset) re-fitted by least squares.
 * The smallest squared error wins, so the result is never worse than plain min/max rounding.
 */
static void
q4k_fit_subblock(const float *x, float *scale, float *mn)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    if (lo > 0.0f)
        lo = 0.0f;
    if (!(hi > lo)) { /* constant (<= 0) sub-block */
        *scale = 0.0f;
        *mn = -lo;
        return;
    }
    uint8_t q[32];
    const float range = hi - lo;
    float best_s = range / 15.0f, best_b = lo;
    for (int i = 0; i < 32; i++)
        q[i] = (uint8_t)clampi(round_int((x[i] - lo) / best_s), 0, 15);
    float best_err = q4k_sub_error(x, q, best_s, best_b);

    for (int t = -10; t <= 10; t++) {
        const float iscale = (15.0f + 0.1f * (float)t) / range;
        float sq = 0, sqq = 0, sx = 0, sxq = 0;
        for (int i = 0; i < 32; i++) {
            q[i] = (uint8_t)clampi(round_int((x[i] - lo) * iscale), 0, 15);
            sq += q[i];
            sqq += (float)q[i] * q[i];
            sx += x[i];
            sxq += x[i] * q[i];
        }
        const float det = 32.0f * sqq - sq * sq;
        if (!(det > 0.0f))
            continue;
        float s = (32.0f * sxq - sq * sx) / det;
        float b = (sqq * sx - sq * sxq) / det;
        if (b > 0.0f) { /* offset must be <= 0: refit the scale alone */
            b = 0.0f;
            s = sxq / sqq;
        }
        if (!(s > 0.0f))
            continue;
        const float err = q4k_sub_error(x, q, s, b);
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_b = b;
        }
    }
    *scale = best_s;
    *mn = -best_b;
}

void
sp__q4k_from_float_ref(const float *src, void *dst, int64_t n)
{
    sp_block_q4_k *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        float scale[8], mn[8], max_scale = 0.0f, max_mn = 0.0f;
        for (int j = 0; j < 8; j++) {
            q4k_fit_subblock(src + 32 * j, &scale[j], &mn[j]);
            max_scale = scale[j] > max_scale ? scale[j] : max_scale;
            max_mn = mn[j] > max_mn ? mn[j] : max_mn;
        }
        /* 6-bit scales against the fp16 super-block scales actually stored. */
        y[b].d = sp_fp32_to_fp16(max_scale / 63.0f);
        y[b].dmin = sp_fp32_to_fp16(max_mn / 63.0f);
        const float d = sp_fp16_to_fp32(y[b].d), dmin = sp_fp16_to_fp32(y[b].dmin);
        uint8_t ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = (uint8_t)(d > 0.0f ? clampi(round_int(scale[j] / d), 0, 63) : 0);
            lm[j] = (uint8_t)(dmin > 0.0f ? clampi(round_int(mn[j] / dmin), 0, 63) : 0);
        }
        for (int j = 0; j < 4; j++) {
            y[b].scales[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
            y[b].scales[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
            y[b].scales[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
        }
        /* Re-quantize with the final rounded scales: nearest level of d*ls*q - dmin*lm. */
        uint8_t q[SP_QK_K];
        for (int j = 0; j < 8; j++) {
            const float ds = d * ls[j], dm = dmin * lm[j];
            for (int i = 0; i < 32; i++) {
                const float v = src[32 * j + i];
                q[32 * j + i] = (uint8_t)(ds > 0.0f ? clampi(round_int((v + dm) / ds), 0, 15) : 0);
            }
        }
        for (int h = 0; h < 4; h++) /* 32 bytes per 64 elements: two sub-blocks */
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * h + l] = (uint8_t)(q[64 * h + l] | (q[64 * h + 32 + l] << 4));
    }
}

void
sp__q4k_vec_dot_ref(int64_t n, float *s, const void *w, const void *xv)
{
    const sp_block_q4_k *x = w;
    const sp_block_q8_k *y = xv;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        uint8_t sc[8], m[8];
        sp__q4k_unpack_scales(x[b].scales, sc, m);
        int32_t sumi = 0, summs = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = x[b].qs + 32 * (j / 2);
            const int8_t *q8 = y[b].qs + 32 * j;
            const int shift = 4 * (j & 1);
            int32_t dot = 0;
            for (int l = 0; l < 32; l++)
                dot += ((q[l] >> shift) & 0xF) * q8[l];
            sumi += sc[j] * dot;
            summs += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        }
        /* The fixed float sequence of kquants_impl.h: one statement per rounding. */
        const float d = y[b].d * sp_fp16_to_fp32(x[b].d);
        const float dm = y[b].d * sp_fp16_to_fp32(x[b].dmin);
        const float a = d * (float)sumi;
        const float c = dm * (float)summs;
        const float blk = a - c;
        sumf = sumf + blk;
    }
    *s = sumf;
}

/* ---- Q6_K ----------------------------------------------------------------------------------- */

/* Unpack the 256 six-bit quants of a Q6_K block to q - 32, in element order. */
static void
q6k_unpack(const sp_block_q6_k *x, int8_t q[SP_QK_K])
{
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        int8_t *o = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

void
sp__q6k_to_float_ref(const void *src, float *dst, int64_t n)
{
    const sp_block_q6_k *x = src;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        int8_t q[SP_QK_K];
        q6k_unpack(&x[b], q);
        const float d = sp_fp16_to_fp32(x[b].d);
        for (int i = 0; i < SP_QK_K; i++)
            *dst++ = d * (float)x[b].scales[i / 16] * (float)q[i];
    }
}

/*
 * Fit x[0..16) ~= s * q, q in -32..31. The sign of s is free, so the grid may put the
 * largest-magnitude value at -32 (one level more than +31). Candidates stretch that grid by
 * -3..+1 levels in quarter steps, on both sides; each gets its least-squares scale
 * s = sum(x q) / sum(q q), and the one explaining most energy ((sum x q)^2 / sum q q) wins.
 */
static float
q6k_fit_subblock(const float *x)
{
    float amax = 0.0f, vmax = 0.0f;
    for (int i = 0; i < 16; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            vmax = x[i];
        }
    }
    if (amax == 0.0f)
        return 0.0f;
    float best_s = 0.0f, best_score = -1.0f;
    for (int side = 0; side < 2; side++) {
        const float top = side == 0 ? -32.0f : 31.0f;
        for (int t = -12; t <= 4; t++) {
            const float iscale = (top + (side == 0 ? -0.25f : 0.25f) * (float)t) / vmax;
            float sxq = 0.0f, sqq = 0.0f;
            for (int i = 0; i < 16; i++) {
                const float q = (float)clampi(round_int(x[i] * iscale), -32, 31);
                sxq += x[i] * q;
                sqq += q * q;
            }
            if (!(sqq > 0.0f))
                continue;
            const float score = sxq * sxq / sqq;
            if (score > best_score) {
                best_score = score;
                best_s = sxq / sqq;
            }
        }
    }
    return best_s;
}

void
sp__q6k_from_float_ref(const float *src, void *dst, int64_t n)
{
    sp_block_q6_k *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        float scale[16], smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            scale[j] = q6k_fit_subblock(src + 16 * j);
            if (fabsf(scale[j]) > fabsf(smax))
                smax = scale[j];
        }
        /* int8 scales: the largest-magnitude one goes to -128. */
        y[b].d = sp_fp32_to_fp16(smax / -128.0f);
        const float d = sp_fp16_to_fp32(y[b].d);
        for (int j = 0; j < 16; j++)
            y[b].scales[j] = (int8_t)(d != 0.0f ? clampi(round_int(scale[j] / d), -128, 127) : 0);
        uint8_t q[SP_QK_K];
        for (int j = 0; j < 16; j++) {
            const float ds = d * y[b].scales[j];
            for (int i = 0; i < 16; i++) {
                const float v = src[16 * j + i];
                const int l = ds != 0.0f ? clampi(round_int(v / ds), -32, 31) : 0;
                q[16 * j + i] = (uint8_t)(l + 32);
            }
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *o = q + 128 * h;
            uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((o[l] & 0xF) | ((o[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((o[l + 32] & 0xF) | ((o[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((o[l] >> 4) | ((o[l + 32] >> 4) << 2) | ((o[l + 64] >> 4) << 4) |
                                  ((o[l + 96] >> 4) << 6));
            }
        }
    }
}

void
sp__q6k_vec_dot_ref(int64_t n, float *s, const void *w, const void *xv)
{
    const sp_block_q6_k *x = w;
    const sp_block_q8_k *y = xv;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        int8_t q[SP_QK_K];
        q6k_unpack(&x[b], q);
        int32_t sumi = 0;
        for (int k = 0; k < SP_QK_K / 16; k++) {
            int32_t dot = 0;
            for (int i = 0; i < 16; i++)
                dot += q[16 * k + i] * y[b].qs[16 * k + i];
            sumi += x[b].scales[k] * dot;
        }
        const float d = y[b].d * sp_fp16_to_fp32(x[b].d);
        const float blk = d * (float)sumi;
        sumf = sumf + blk;
    }
    *s = sumf;
}

/* ---- registration and the quantize/dequantize entry points ---------------------------------- */

void
sp__kquants_register_ref(sp_cpu_kernels_t *k)
{
    k->vec_dot_type[SP_TYPE_Q4_K] = SP_TYPE_Q8_K;
    k->vec_dot_type[SP_TYPE_Q6_K] = SP_TYPE_Q8_K;
    k->from_float[SP_TYPE_Q8_K] = sp__q8k_from_float_ref;
    k->vec_dot[SP_TYPE_Q4_K] = sp__q4k_vec_dot_ref;
    k->vec_dot[SP_TYPE_Q6_K] = sp__q6k_vec_dot_ref;
    k->to_float[SP_TYPE_Q4_K] = sp__q4k_to_float_ref;
    k->to_float[SP_TYPE_Q6_K] = sp__q6k_to_float_ref;
    k->to_float[SP_TYPE_Q8_K] = sp__q8k_to_float_ref;
}

bool
sp__kquants_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n)
{
    if (n < 0 || n % SP_QK_K != 0)
        return false;
    switch (type) {
    case SP_TYPE_Q8_K: sp__q8k_from_float_ref(src, dst, n); return true;
    case SP_TYPE_Q4_K: sp__q4k_from_float_ref(src, dst, n); return true;
    case SP_TYPE_Q6_K: sp__q6k_from_float_ref(src, dst, n); return true;
    default: return false;
    }
}

bool
sp__kquants_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n)
{
    if (n < 0 || n % SP_QK_K != 0)
        return false;
    switch (type) {
    case SP_TYPE_Q8_K: sp__q8k_to_float_ref(src, dst, n); return true;
    case SP_TYPE_Q4_K: sp__q4k_to_float_ref(src, dst, n); return true;
    case SP_TYPE_Q6_K: sp__q6k_to_float_ref(src, dst, n); return true;
    default: return false;
    }
}
