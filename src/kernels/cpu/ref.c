/*
 * ref.c - scalar reference kernels for F32, F16, BF16, Q8_0 and Q4_0.
 *
 * Plain C, always built, and the oracle the SIMD files are tested against.
 * Dot products of float weights accumulate in double, so the reference is
 * accurate to about one float rounding whatever n is; quantized dots sum each
 * block's exact integer dot times d_w * d_x in float, block by block.
 *
 * The weight quantizers (sp_quantize_row: `sampan quantize`, the Q8_0 KV
 * cache's rule) divide by the scale as it is stored (rounded to half), not by
 * the unrounded max/127: every element then dequantizes to within half a step
 * of its input, which the tests check. The activations of Q8_0 / Q4_0
 * products are quantized by llama.cpp's rule instead (q8_0_act_from_float).
 */
#include "kernels/cpu/cpu_impl.h"

#include <math.h>
#include <string.h>

/* ---- conversions --------------------------------------------------------- */

static void
f32_to_float(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void
f32_from_float(const float *src, void *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void
f16_to_float(const void *src, float *dst, int64_t n)
{
    const sp_fp16_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        dst[i] = sp_fp16_to_fp32(s[i]);
    }
}

static void
f16_from_float(const float *src, void *dst, int64_t n)
{
    sp_fp16_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        d[i] = sp_fp32_to_fp16(src[i]);
    }
}

static void
bf16_to_float(const void *src, float *dst, int64_t n)
{
    const sp_bf16_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        dst[i] = sp_bf16_to_fp32(s[i]);
    }
}

static void
bf16_from_float(const float *src, void *dst, int64_t n)
{
    sp_bf16_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        d[i] = sp_fp32_to_bf16(src[i]);
    }
}

static void
q8_0_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        float d = sp_fp16_to_fp32(b[i].d);
        for (int j = 0; j < SP_QK8_0; j++) {
            dst[i * SP_QK8_0 + j] = (float)b[i].qs[j] * d;
        }
    }
}

/* roundf() with the argument clamped first: a NaN or huge quotient must not
 * reach the int conversion (undefined behaviour). */
static inline int
round_clamp(float v, float lo, float hi)
{
    v = fmaxf(v, lo); /* fmaxf(NaN, lo) = lo */
    v = fminf(v, hi);
    return (int)roundf(v);
}

/* The largest magnitude of a Q8_0 block's SP_QK8_0 inputs (NaN ignored). */
static float
block_amax(const float *x)
{
    float amax = 0.0f;
    for (int j = 0; j < SP_QK8_0; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
    }
    return amax;
}

static void
q8_0_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        const float *x = src + i * SP_QK8_0;
        b[i].d = sp_fp32_to_fp16(block_amax(x) / 127.0f);
        float d = sp_fp16_to_fp32(b[i].d);
        for (int j = 0; j < SP_QK8_0; j++) {
            /* d == 0 (all zero, or amax below half's range): every q is 0 */
            b[i].qs[j] = (int8_t)(d != 0.0f ? round_clamp(x[j] / d, -127.0f, 127.0f) : 0);
        }
    }
}

/*
 * The activation quantiser of Q8_0 / Q4_0 products (from_float[SP_TYPE_Q8_0]),
 * llama.cpp's rule on x86 so the products agree with it: d = amax / 127
 * stored as half, q = x * (127 / amax) in float, rounded half to even (rintf
 * in the default rounding mode). The quotient uses the unrounded scale, so
 * an element dequantizes to within half a step plus 127 times the scale's
 * half rounding (2^-11 relative) of its input. A block whose scale rounds to
 * zero (amax below about 3.8e-6, or all zero) gets q = 0: it contributes
 * exactly 0 to a product either way, and a tiny amax must not make 127 / amax
 * overflow. Every SIMD level reproduces these bytes exactly.
 */
static void
q8_0_act_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        const float *x = src + i * SP_QK8_0;
        const float amax = block_amax(x);
        b[i].d = sp_fp32_to_fp16(amax / 127.0f);
        if (sp_fp16_to_fp32(b[i].d) == 0.0f) {
            memset(b[i].qs, 0, sizeof(b[i].qs));
            continue;
        }
        const float id = 127.0f / amax;
        for (int j = 0; j < SP_QK8_0; j++) {
            /* the clamp keeps NaN (-> -127) and inf away from the int conversion */
            float v = fminf(fmaxf(x[j] * id, -127.0f), 127.0f);
            b[i].qs[j] = (int8_t)rintf(v);
        }
    }
}

static void
q4_0_to_float(const void *src, float *dst, int64_t n)
{
    const sp_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / SP_QK4_0; i++) {
        float d = sp_fp16_to_fp32(b[i].d);
        float *y = dst + i * SP_QK4_0;
        for (int j = 0; j < SP_QK4_0 / 2; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
            y[j + SP_QK4_0 / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* GGUF's Q4_0: the element of largest magnitude maps to q = 0 exactly
 * (d = max / -8), so the grid is asymmetric: -8d .. 7d around that sign. */
static void
q4_0_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / SP_QK4_0; i++) {
        const float *x = src + i * SP_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < SP_QK4_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        b[i].d = sp_fp32_to_fp16(max / -8.0f);
        float d = sp_fp16_to_fp32(b[i].d);
        for (int j = 0; j < SP_QK4_0 / 2; j++) {
            int q0 = 8, q1 = 8;
            if (d != 0.0f) {
                /* (int)(v + 8.5) truncates; v + 8.5 >= 0 after the clamp, so it floors */
                float v0 = fminf(fmaxf(x[j] / d + 8.5f, 0.0f), 15.0f);
                float v1 = fminf(fmaxf(x[j + SP_QK4_0 / 2] / d + 8.5f, 0.0f), 15.0f);
                q0 = (int)v0;
                q1 = (int)v1;
            }
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ---- dot products -------------------------------------------------------- */

static void
vec_dot_f32(int64_t n, float *s, const void *w, const void *x)
{
    const float *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)a[i] * (double)b[i];
    }
    *s = (float)sum;
}

static void
vec_dot_f16(int64_t n, float *s, const void *w, const void *x)
{
    const sp_fp16_t *a = w;
    const float *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)sp_fp16_to_fp32(a[i]) * (double)b[i];
    }
    *s = (float)sum;
}

static void
vec_dot_bf16(int64_t n, float *s, const void *w, const void *x)
{
    const sp_bf16_t *a = w;
    const float *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)sp_bf16_to_fp32(a[i]) * (double)b[i];
    }
    *s = (float)sum;
}

static void
vec_dot_q8_0(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q8_0 *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < SP_QK8_0; j++) {
            isum += (int32_t)a[i].qs[j] * (int32_t)b[i].qs[j];
        }
        /* two halves: the product is exact in float */
        float d = sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d);
        sum += (float)isum * d;
    }
    *s = sum;
}

static void
vec_dot_q4_0(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q4_0 *a = w;
    const sp_block_q8_0 *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / SP_QK4_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < SP_QK4_0 / 2; j++) {
            isum += ((a[i].qs[j] & 0x0f) - 8) * (int32_t)b[i].qs[j];
            isum += ((a[i].qs[j] >> 4) - 8) * (int32_t)b[i].qs[j + SP_QK4_0 / 2];
        }
        float d = sp_fp16_to_fp32(a[i].d) * sp_fp16_to_fp32(b[i].d);
        sum += (float)isum * d;
    }
    *s = sum;
}

/* ---- table and the public quantizers ------------------------------------- */

void
sp__ref_register(sp_cpu_kernels_t *k)
{
    k->vec_dot_type[SP_TYPE_F32] = SP_TYPE_F32;
    k->vec_dot_type[SP_TYPE_F16] = SP_TYPE_F32;
    k->vec_dot_type[SP_TYPE_BF16] = SP_TYPE_F32;
    k->vec_dot_type[SP_TYPE_Q8_0] = SP_TYPE_Q8_0;
    k->vec_dot_type[SP_TYPE_Q4_0] = SP_TYPE_Q8_0;

    k->from_float[SP_TYPE_F32] = f32_from_float;
    k->from_float[SP_TYPE_F16] = f16_from_float;
    k->from_float[SP_TYPE_BF16] = bf16_from_float;
    k->from_float[SP_TYPE_Q8_0] = q8_0_act_from_float; /* activations, not weights */
    k->from_float[SP_TYPE_Q4_0] = q4_0_from_float;

    k->to_float[SP_TYPE_F32] = f32_to_float;
    k->to_float[SP_TYPE_F16] = f16_to_float;
    k->to_float[SP_TYPE_BF16] = bf16_to_float;
    k->to_float[SP_TYPE_Q8_0] = q8_0_to_float;
    k->to_float[SP_TYPE_Q4_0] = q4_0_to_float;

    k->vec_dot[SP_TYPE_F32] = vec_dot_f32;
    k->vec_dot[SP_TYPE_F16] = vec_dot_f16;
    k->vec_dot[SP_TYPE_BF16] = vec_dot_bf16;
    k->vec_dot[SP_TYPE_Q8_0] = vec_dot_q8_0;
    k->vec_dot[SP_TYPE_Q4_0] = vec_dot_q4_0;
}

bool
sp_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n)
{
    switch (type) {
    case SP_TYPE_F32: f32_from_float(src, dst, n); return true;
    case SP_TYPE_F16: f16_from_float(src, dst, n); return true;
    case SP_TYPE_BF16: bf16_from_float(src, dst, n); return true;
    case SP_TYPE_Q8_0: q8_0_from_float(src, dst, n); return true;
    case SP_TYPE_Q4_0: q4_0_from_float(src, dst, n); return true;
    case SP_TYPE_Q8_K:
    case SP_TYPE_Q4_K:
    case SP_TYPE_Q6_K: return sp__kquants_quantize_row(type, src, dst, n);
    case SP_TYPE_Q2_K:
    case SP_TYPE_Q3_K:
    case SP_TYPE_Q5_K:
    case SP_TYPE_IQ4_XS: return sp__kquants2_quantize_row(type, src, dst, n);
    default: return false;
    }
}

bool
sp_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n)
{
    switch (type) {
    case SP_TYPE_F32: f32_to_float(src, dst, n); return true;
    case SP_TYPE_F16: f16_to_float(src, dst, n); return true;
    case SP_TYPE_BF16: bf16_to_float(src, dst, n); return true;
    case SP_TYPE_Q8_0: q8_0_to_float(src, dst, n); return true;
    case SP_TYPE_Q4_0: q4_0_to_float(src, dst, n); return true;
    case SP_TYPE_Q8_K:
    case SP_TYPE_Q4_K:
    case SP_TYPE_Q6_K: return sp__kquants_dequantize_row(type, src, dst, n);
    case SP_TYPE_Q2_K:
    case SP_TYPE_Q3_K:
    case SP_TYPE_Q5_K:
    case SP_TYPE_IQ4_XS: return sp__kquants2_dequantize_row(type, src, dst, n);
    default: return false;
    }
}
