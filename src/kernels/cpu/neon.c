/*
 * neon.c - arm64 Advanced SIMD kernels (base ARMv8-A, every arm64 CPU has them): F32/F16/BF16
 * x F32 dot products and gemm, F16 -> F32 conversion, and the integer products of neon_impl.h
 * (Q8_0, Q4_0, Q4_K, Q6_K) with widening multiplies. Built only for arm64; dispatch.c picks it
 * as the "neon" level. Pure functions: any thread, no heap (a few floats of stack for tails).
 *
 * Float products: 16 lanes (four float32x4 accumulators) of fused multiply-adds over the row,
 * then acc0 + acc1 + acc2 + acc3 and a lane sum. Each lane sums n / 16 products, so the error
 * is within (n / 16 + 5) u sum |w x|, inside the (n / 8 + 6) u bound the AVX2 kernels document
 * and the tests check. The gemm runs each (row, token) pair through the same operations as
 * vec_dot (one weight row converted once, dotted with up to four tokens): batch invariance.
 */
#define SP_NEON_DOT(acc, a, b)                                                                 \
    vpadalq_s16(vpadalq_s16((acc), vmull_s8(vget_low_s8(a), vget_low_s8(b))),                 \
                vmull_high_s8((a), (b)))
#define SP_NEON_NAME(x) neon_##x

#include "kernels/cpu/neon_impl.h"

enum { NE_F32, NE_F16, NE_BF16 };

/* Four floats of weight row `row` at element i. */
NE_INLINE float32x4_t
ne_load_w4(int wt, const uint8_t *row, int64_t i)
{
    switch (wt) {
    case NE_F32:
        return vld1q_f32((const float *)row + i);
    case NE_F16:
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)row + i)));
    default:
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)row + i), 16));
    }
}

/* Lane sum in a fixed tree: (a0 + a1) + (a2 + a3) per lane, then the four lanes. */
NE_INLINE float
ne_hsum4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3)
{
    return vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
}

/* One weight row against T tokens xs bytes apart: y[t * ys]. The tail (n % 16 elements) goes
 * through zero-padded buffers, so it adds exact zeros to the lanes it does not fill. */
NE_INLINE void
ne_float_row(const int wt, const int T, int64_t n, const uint8_t *w, const uint8_t *x, size_t xs,
             float *y, int64_t ys)
{
    float32x4_t acc[NE_T][4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < 4; j++) {
            acc[t][j] = vdupq_n_f32(0.0f);
        }
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float32x4_t wv[4];
        for (int j = 0; j < 4; j++) {
            wv[j] = ne_load_w4(wt, w, i + 4 * j);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const float *xr = (const float *)(x + (size_t)t * xs) + i;
            for (int j = 0; j < 4; j++) {
                acc[t][j] = vfmaq_f32(acc[t][j], wv[j], vld1q_f32(xr + 4 * j));
            }
        }
    }
    if (i < n) {
        const int64_t left = n - i;
        const size_t wsz = wt == NE_F32 ? sizeof(float) : sizeof(uint16_t);
        uint8_t wbuf[16 * sizeof(float)] = {0};
        memcpy(wbuf, w + (size_t)i * wsz, (size_t)left * wsz);
        float32x4_t wv[4];
        for (int j = 0; j < 4; j++) {
            wv[j] = ne_load_w4(wt, wbuf, 4 * j);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float xbuf[16] = {0};
            memcpy(xbuf, (const float *)(x + (size_t)t * xs) + i, (size_t)left * sizeof(float));
            for (int j = 0; j < 4; j++) {
                acc[t][j] = vfmaq_f32(acc[t][j], wv[j], vld1q_f32(xbuf + 4 * j));
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        y[t * ys] = ne_hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    }
}

/* The float rows take n (elements), not a block count: QK = 1 below. */
NE_ROWS(f32, ne_float_row, NE_F32)
NE_ROWS(f16, ne_float_row, NE_F16)
NE_ROWS(bf16, ne_float_row, NE_BF16)
NE_GEMM_AND_DOT(f32, 1)
NE_GEMM_AND_DOT(f16, 1)
NE_GEMM_AND_DOT(bf16, 1)

static void
f16_to_float(const void *src, float *dst, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s + i))));
    }
    for (; i < n; i++) {
        dst[i] = ne_h2f(s[i]);
    }
}

void
sp__neon_register(sp_cpu_kernels_t *k)
{
    k->vec_dot[SP_TYPE_F32] = vec_dot_f32;
    k->gemm[SP_TYPE_F32] = gemm_f32;
    k->vec_dot[SP_TYPE_F16] = vec_dot_f16;
    k->gemm[SP_TYPE_F16] = gemm_f16;
    k->vec_dot[SP_TYPE_BF16] = vec_dot_bf16;
    k->gemm[SP_TYPE_BF16] = gemm_bf16;
    k->to_float[SP_TYPE_F16] = f16_to_float;
    neon_register_int(k);
}
