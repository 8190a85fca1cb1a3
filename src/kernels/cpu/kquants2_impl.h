/*
 * kquants2_impl.h - private to the second K-quant family's kernel files
 * (ref/avx2/avx512_kquants2.c: Q2_K, Q3_K, Q5_K, IQ4_XS weights x Q8_K activations) and their
 * unit test: per-level entry points, so tests and benches can call every level directly.
 *
 * Numerics contract (all levels), the same as kquants_impl.h's: per 256-element super-block the
 * integer part is exact int32 (scales applied), then a fixed float finish in separate statements
 * (no FMA contraction), super-blocks in ascending order from sumf = 0:
 *
 *   Q2_K, Q5_K (scale and min):  d = y.d * fp16(x.d); dm = y.d * fp16(x.dmin);
 *                                a = d * (float)sumi; c = dm * (float)summs; blk = a - c
 *   Q3_K, IQ4_XS (scale only):   d = y.d * fp16(x.d); blk = d * (float)sumi
 *   sumf = sumf + blk
 *
 * where sumi = sum over 16-element groups g of sc[g] * sum(q * q8), summs = sum_g m[g] *
 * bsums[g]. So every SIMD level gives the scalar reference's exact bits, and the gemms the bits
 * of vec_dot (batch invariance). Bounds: |sumi| <= 16 * 63 * 16 * 31 * 127 (Q5_K) or
 * 8 * 32 * 32 * 127 * 127 (IQ4_XS), both far below 2^31.
 */
#ifndef SP_KERNELS_CPU_KQUANTS2_IMPL_H
#define SP_KERNELS_CPU_KQUANTS2_IMPL_H

#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* IQ4_NL / IQ4_XS's 16 levels (ggml's kvalues_iq4nl): a non-uniform grid, denser near 0. */
extern const int8_t sp_iq4nl_values[16];

/* The 16 six-bit Q3_K scales (0..63, stored + 32): low nibbles in bytes 0..7 (scale j in byte
 * j % 8, low nibble for j < 8, high for j >= 8), the top 2 bits in bytes 8..11 (scale j in byte
 * 8 + j % 4 at bit 2 * (j / 4)). Four at a time on 32-bit words. */
static inline void
sp__q3k_unpack_scales(const uint8_t packed[SP_K_SCALE_SIZE], uint8_t sc[16])
{
    uint32_t a[3], out[4];
    memcpy(a, packed, sizeof(a));
    out[0] = (a[0] & 0x0f0f0f0fu) | ((a[2] & 0x03030303u) << 4);
    out[1] = (a[1] & 0x0f0f0f0fu) | (((a[2] >> 2) & 0x03030303u) << 4);
    out[2] = ((a[0] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 4) & 0x03030303u) << 4);
    out[3] = ((a[1] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 6) & 0x03030303u) << 4);
    memcpy(sc, out, 16);
}

/* The 8 six-bit IQ4_XS scales (0..63, stored + 32). */
static inline void
sp__iq4xs_unpack_scales(const sp_block_iq4_xs *x, uint8_t sc[8])
{
    for (int ib = 0; ib < 8; ib++)
        sc[ib] = (uint8_t)(((x->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
                           (((x->scales_h >> (2 * ib)) & 3) << 4));
}

/* ---- per-level entry points -------------------------------------------------------------- */

/* dequantizers and ggml's reference quantizers (scalar only) */

void sp__q2k_to_float_ref(const void *src, float *dst, int64_t n);
void sp__q3k_to_float_ref(const void *src, float *dst, int64_t n);
void sp__q5k_to_float_ref(const void *src, float *dst, int64_t n);
void sp__iq4xs_to_float_ref(const void *src, float *dst, int64_t n);
void sp__q2k_from_float_ref(const float *src, void *dst, int64_t n);
void sp__q3k_from_float_ref(const float *src, void *dst, int64_t n);
void sp__q5k_from_float_ref(const float *src, void *dst, int64_t n);
void sp__iq4xs_from_float_ref(const float *src, void *dst, int64_t n);

/* vec_dot and gemm of each level: ref (scalar), avx2, avx512 */
#define SP__KQ2_DECL(lvl)                                                                       \
    void sp__q2k_vec_dot_##lvl(int64_t n, float *s, const void *w, const void *x);              \
    void sp__q3k_vec_dot_##lvl(int64_t n, float *s, const void *w, const void *x);              \
    void sp__q5k_vec_dot_##lvl(int64_t n, float *s, const void *w, const void *x);              \
    void sp__iq4xs_vec_dot_##lvl(int64_t n, float *s, const void *w, const void *x);            \
    void sp__q2k_gemm_##lvl(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,  \
                            const void *x, size_t x_stride, int64_t n_tok, float *y,            \
                            int64_t ldy);                                                       \
    void sp__q3k_gemm_##lvl(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,  \
                            const void *x, size_t x_stride, int64_t n_tok, float *y,            \
                            int64_t ldy);                                                       \
    void sp__q5k_gemm_##lvl(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,  \
                            const void *x, size_t x_stride, int64_t n_tok, float *y,            \
                            int64_t ldy);                                                       \
    void sp__iq4xs_gemm_##lvl(int64_t n, const void *w, size_t w_stride, int64_t r0,            \
                              int64_t r1, const void *x, size_t x_stride, int64_t n_tok,        \
                              float *y, int64_t ldy);

SP__KQ2_DECL(ref)
SP__KQ2_DECL(avx2)
SP__KQ2_DECL(avx512)
#undef SP__KQ2_DECL

/* AVX2: the row-at-a-time gemms before the 8-token panel kernels (bench A/B only) */
void sp__q3k_gemm_avx2_prev(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                            const void *x, size_t x_stride, int64_t n_tok, float *y,
                            int64_t ldy);
void sp__q5k_gemm_avx2_prev(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                            const void *x, size_t x_stride, int64_t n_tok, float *y,
                            int64_t ldy);
void sp__q2k_gemm_avx2_prev(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                            const void *x, size_t x_stride, int64_t n_tok, float *y,
                            int64_t ldy);
void sp__iq4xs_gemm_avx2_prev(int64_t n, const void *w, size_t w_stride, int64_t r0,
                              int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                              float *y, int64_t ldy);

/* AVX-512 VNNI row panels (avx512_kpanel.c): only where cpuid reports VNNI. */
void sp__q2k_gemm_avx512_vnni(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);

#endif /* SP_KERNELS_CPU_KQUANTS2_IMPL_H */
