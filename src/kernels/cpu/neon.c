/*
 * neon.c - arm64 Advanced SIMD kernels (base ARMv8-A, every arm64 CPU has them): F32/F16/BF16
 * x F32 dot products and gemm, F16 -> F32 conversion, the Q8_0, Q8_1 and Q8_K activation
 * quantizers (the references' bytes), and the integer products of neon_impl.h (every quantised
 * weight type) with widening multiplies. Built only for arm64; dispatch.c picks it as the
 * "neon" level. Pure functions: any thread, no heap (a few floats of stack for tails).
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

/* max(m, a) lane-wise by the scalar rule `a > m ? a : m`: a NaN a is never taken (as fmaxf
 * and the references' comparisons drop it). */
NE_INLINE float32x4_t
ne_amax4(float32x4_t m, float32x4_t x)
{
    const float32x4_t a = vabsq_f32(x);
    return vbslq_f32(vcgtq_f32(a, m), a, m);
}

/* v clamped to [-127, 127] (a NaN becomes -127: FMAXNM returns the number, as fmaxf), rounded
 * half to even (vrndnq: rintf / nearbyintf in the default rounding mode), as int32. */
NE_INLINE int32x4_t
ne_q127(float32x4_t v)
{
    v = vminnmq_f32(vmaxnmq_f32(v, vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f));
    return vcvtq_s32_f32(vrndnq_f32(v));
}

/* Sixteen int32 quants in [-127, 127] to int8 (exact). */
NE_INLINE int8x16_t
ne_narrow16(const int32x4_t q[4])
{
    const int16x8_t lo = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
    const int16x8_t hi = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
    return vcombine_s8(vmovn_s16(lo), vmovn_s16(hi));
}

/* The Q8_0 activations of cpu/ref.c (q8_0_act_from_float, llama.cpp's rule), byte for byte:
 * the same amax, the same scalar d and 127 / amax, and per element the same product, clamp and
 * rounding. */
static void
q8_0_act_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        const float *x = src + i * SP_QK8_0;
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        for (int j = 0; j < 8; j++) {
            v[j] = vld1q_f32(x + 4 * j);
            m = ne_amax4(m, v[j]);
        }
        const float amax = vmaxvq_f32(m); /* no NaN lanes left */
        b[i].d = sp_fp32_to_fp16(amax / 127.0f);
        if (sp_fp16_to_fp32(b[i].d) == 0.0f) {
            memset(b[i].qs, 0, sizeof(b[i].qs));
            continue;
        }
        const float id = 127.0f / amax;
        for (int h = 0; h < 2; h++) {
            int32x4_t q[4];
            for (int j = 0; j < 4; j++) {
                q[j] = ne_q127(vmulq_n_f32(v[4 * h + j], id));
            }
            vst1q_s8(b[i].qs + 16 * h, ne_narrow16(q));
        }
    }
}

/* The Q8_1 activations of Q4_1 / Q5_1 products (cpu/ref_q32.c, sp__q8_1_from_float_ref), byte
 * for byte: Q8_0's rule, plus s = half(d * sum q) with the unrounded d = amax / 127. */
static void
q8_1_act_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / SP_QK32; i++) {
        const float *x = src + i * SP_QK32;
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        for (int j = 0; j < 8; j++) {
            v[j] = vld1q_f32(x + 4 * j);
            m = ne_amax4(m, v[j]);
        }
        const float amax = vmaxvq_f32(m);
        const float d = amax / 127.0f;
        b[i].d = sp_fp32_to_fp16(d);
        if (sp_fp16_to_fp32(b[i].d) == 0.0f) {
            memset(b[i].qs, 0, sizeof(b[i].qs));
            b[i].s = 0;
            continue;
        }
        const float id = 127.0f / amax;
        int32_t sum = 0;
        for (int h = 0; h < 2; h++) {
            int32x4_t q[4];
            for (int j = 0; j < 4; j++) {
                q[j] = ne_q127(vmulq_n_f32(v[4 * h + j], id));
            }
            const int8x16_t q8 = ne_narrow16(q);
            vst1q_s8(b[i].qs + 16 * h, q8);
            sum += vaddlvq_s8(q8);
        }
        b[i].s = sp_fp32_to_fp16(d * (float)sum);
    }
}

/* The Q8_K activations of cpu/ref_kquants.c (sp__q8k_from_float_ref), byte for byte: clamping
 * the product to [-127, 127] before rounding equals the reference's round, then clamp (a value
 * in (127, 127.5] rounds to 127 or 128 and clamps to 127 either way); NaN (also inf * 0 when
 * amax is inf) gives -127 in both. bsums: the exact int8 sums of each 16. */
static void
q8k_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q8_k *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int j = 0; j < SP_QK_K / 4; j++) {
            m = ne_amax4(m, vld1q_f32(src + 4 * j));
        }
        const float amax = vmaxvq_f32(m);
        const float iscale = sp__q8k_iscale(amax);
        y[b].d = sp__q8k_d(amax);
        for (int g = 0; g < SP_QK_K / 16; g++) {
            int32x4_t q[4];
            for (int j = 0; j < 4; j++) {
                q[j] = ne_q127(vmulq_n_f32(vld1q_f32(src + 16 * g + 4 * j), iscale));
            }
            const int8x16_t q8 = ne_narrow16(q);
            vst1q_s8(y[b].qs + 16 * g, q8);
            y[b].bsums[g] = vaddlvq_s8(q8);
        }
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
    k->from_float[SP_TYPE_Q8_0] = q8_0_act_from_float;
    k->from_float[SP_TYPE_Q8_K] = q8k_from_float;
    k->from_float[SP_TYPE_Q8_1] = q8_1_act_from_float;
    neon_register_int(k);
}
