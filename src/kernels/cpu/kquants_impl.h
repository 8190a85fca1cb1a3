/*
 * kquants_impl.h - private to the K-quant kernel files (ref/avx2/avx512_kquants.c) and their
 * unit test: the per-level entry points, so tests and benches can call every level directly
 * without the dispatcher, and the small helpers all levels must share bit for bit.
 *
 * Numerics contract (all levels): a Q4_K/Q6_K x Q8_K dot product is computed per 256-element
 * super-block as one exact int32 sum (the scales already applied), then finished in float in one
 * fixed order of separate statements (no FMA contraction):
 *
 *   Q4_K:  d = y.d * fp16(x.d); dm = y.d * fp16(x.dmin);
 *          a = d * (float)sumi; b = dm * (float)summs; blk = a - b; sumf = sumf + blk
 *   Q6_K:  d = y.d * fp16(x.d); blk = d * (float)sumi; sumf = sumf + blk
 *
 * super-blocks in ascending order, starting from sumf = 0. The int32 sums are order-independent,
 * so the SIMD levels give exactly the bits of the scalar reference, and the gemm tiles exactly the
 * bits of vec_dot (batch invariance, and the same answer on every CPU).
 */
#ifndef SP_KERNELS_CPU_KQUANTS_IMPL_H
#define SP_KERNELS_CPU_KQUANTS_IMPL_H

#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* Unpack the 8 six-bit scales and 8 six-bit mins of a Q4_K block (GGUF packing, see kernels.h):
 * bytes 0..3 hold sc[0..3] in bits 0-5, bytes 4..7 m[0..3]; bytes 8..11 hold the low 4 bits of
 * sc[4..7] (low nibble) and m[4..7] (high nibble), whose top 2 bits sit in bits 6-7 of bytes
 * 0..3 (sc) and 4..7 (m). Done on 32-bit words, four sub-blocks at a time. */
static inline void
sp__q4k_unpack_scales(const uint8_t packed[SP_K_SCALE_SIZE], uint8_t sc[8], uint8_t m[8])
{
    uint32_t a[3], out[4];
    memcpy(a, packed, sizeof(a));
    out[0] = a[0] & 0x3f3f3f3fu;
    out[1] = (a[2] & 0x0f0f0f0fu) | (((a[0] >> 6) & 0x03030303u) << 4);
    out[2] = a[1] & 0x3f3f3f3fu;
    out[3] = ((a[2] >> 4) & 0x0f0f0f0fu) | (((a[1] >> 6) & 0x03030303u) << 4);
    memcpy(sc, &out[0], 8);
    memcpy(m, &out[2], 8);
}

/* The same, returned as two little-endian 64-bit words (byte j = sub-block j): lets SIMD code
 * move them to a vector register directly, without a store / reload of mismatched widths. */
static inline void
sp__q4k_unpack_scales_u64(const uint8_t packed[SP_K_SCALE_SIZE], uint64_t *sc, uint64_t *m)
{
    uint32_t a[3];
    memcpy(a, packed, sizeof(a));
    const uint32_t s_lo = a[0] & 0x3f3f3f3fu;
    const uint32_t s_hi = (a[2] & 0x0f0f0f0fu) | (((a[0] >> 6) & 0x03030303u) << 4);
    const uint32_t m_lo = a[1] & 0x3f3f3f3fu;
    const uint32_t m_hi = ((a[2] >> 4) & 0x0f0f0f0fu) | (((a[1] >> 6) & 0x03030303u) << 4);
    *sc = (uint64_t)s_lo | ((uint64_t)s_hi << 32);
    *m = (uint64_t)m_lo | ((uint64_t)m_hi << 32);
}

/* Q8_K quantization of one 256-value block: d = amax / 127, q = round-half-even(x * (127 / amax))
 * in [-127, 127] (symmetric; -128 is never produced, so |q| <= 127 keeps every SIMD product
 * safe). amax = 0 gives d = 0 and all-zero quants. Every level computes amax (exact), iscale and
 * d with these scalar expressions, so the quants are identical on all levels. */
static inline float
sp__q8k_iscale(float amax)
{
    return amax > 0.0f ? 127.0f / amax : 0.0f;
}
static inline float
sp__q8k_d(float amax)
{
    return amax / 127.0f;
}

/* ---- per-level entry points -------------------------------------------------------------- */

void sp__q8k_from_float_ref(const float *src, void *dst, int64_t n);
void sp__q8k_to_float_ref(const void *src, float *dst, int64_t n);
void sp__q4k_to_float_ref(const void *src, float *dst, int64_t n);
void sp__q6k_to_float_ref(const void *src, float *dst, int64_t n);
void sp__q4k_from_float_ref(const float *src, void *dst, int64_t n);
void sp__q6k_from_float_ref(const float *src, void *dst, int64_t n);
void sp__q4k_vec_dot_ref(int64_t n, float *s, const void *w, const void *x);
void sp__q6k_vec_dot_ref(int64_t n, float *s, const void *w, const void *x);

void sp__q8k_from_float_avx2(const float *src, void *dst, int64_t n);
void sp__q4k_vec_dot_avx2(int64_t n, float *s, const void *w, const void *x);
void sp__q6k_vec_dot_avx2(int64_t n, float *s, const void *w, const void *x);
void sp__q4k_gemm_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                       const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy);
void sp__q6k_gemm_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                       const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy);

/* AVX-512: the _vnni variants use VPDPWSSD and must only run where cpuid reports VNNI. */
void sp__q8k_from_float_avx512(const float *src, void *dst, int64_t n);
void sp__q4k_vec_dot_avx512(int64_t n, float *s, const void *w, const void *x);
void sp__q6k_vec_dot_avx512(int64_t n, float *s, const void *w, const void *x);
void sp__q4k_vec_dot_avx512_vnni(int64_t n, float *s, const void *w, const void *x);
void sp__q6k_vec_dot_avx512_vnni(int64_t n, float *s, const void *w, const void *x);
void sp__q4k_gemm_avx512(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy);
void sp__q6k_gemm_avx512(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy);
void sp__q4k_gemm_avx512_vnni(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
void sp__q6k_gemm_avx512_vnni(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);

/* avx512_kpanel.c: the VNNI row panels of Q6_K (decoded 8-row panels swept by the tokens;
 * fewer than 20 tokens go to sp__q6k_gemm_avx512_vnni). */
void sp__q6k_gemm_panel_avx512_vnni(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                    int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                    float *y, int64_t ldy);

#endif /* SP_KERNELS_CPU_KQUANTS_IMPL_H */
