/*
 * avx2_kquants2.c - AVX2 (+FMA, F16C) kernels for Q2_K / Q3_K / Q5_K / IQ4_XS weights x Q8_K
 * activations. Built with -mavx2 -mfma -mf16c; dispatch.c only registers them on CPUs that have
 * them. Pure functions, callable from any thread; a few hundred bytes of stack.
 *
 * One microkernel per weight type does 1 weight row x NT tokens (NT <= 4): the super-block is
 * unpacked once (kquants2_simd.h) into 256 signed int8 quants and 16 int16 scales, then each
 * token's 16-element group sums are maddubs (|w| x sign-adjusted q8: at most 127 * 127 * 2, no
 * int16 saturation) and madd by the group's scale, all exact in int32. vec_dot is the NT = 1
 * instance and the gemm tiles use NT = 4, so every (row, token) pair takes the same
 * instructions; the float finish is kquants2_impl.h's fixed sequence, which makes the result
 * bit-identical to the scalar reference.
 */
#include <immintrin.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants2_simd.h"

#define TILE_TOK 4

/* vpshufb masks: int16 word 2g of each 128-bit lane over the low lane, word 2g+1 over the high
 * lane (the scales of the two 16-element groups of one 32-byte quant vector). */
#define W(j) 2 * (j), 2 * (j) + 1
#define W8(j) W(j), W(j), W(j), W(j), W(j), W(j), W(j), W(j)
static const uint8_t word_pair[4][32] __attribute__((aligned(32))) = {
    {W8(0), W8(1)}, {W8(2), W8(3)}, {W8(4), W8(5)}, {W8(6), W8(7)},
};
#undef W8
#undef W

KQ2_INLINE int32_t
hsum_i32x8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* int32 partial sums of sc[g] * sum(q * q8) for the two groups of quant vector q (32 elements
 * against q8[0..32)); `sgn`: q may be negative (then |q| x sign(q) q8, exact since |q8| <= 127). */
KQ2_INLINE __m256i
group_dot(__m256i q, const int8_t *q8, __m256i sc, int sgn)
{
    const __m256i y = _mm256_loadu_si256((const __m256i *)q8);
    const __m256i p = sgn ? _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(y, q))
                          : _mm256_maddubs_epi16(q, y);
    return _mm256_madd_epi16(p, sc);
}

/* The float finishes of kquants2_impl.h, one statement per rounding (no contraction in C11). */
KQ2_INLINE float
finish_scale_min(float yd, sp_fp16_t xd, sp_fp16_t xdmin, int32_t sumi, int32_t summs)
{
    const float d = yd * _cvtsh_ss(xd);
    const float dm = yd * _cvtsh_ss(xdmin);
    const float a = d * (float)sumi;
    const float c = dm * (float)summs;
    return a - c;
}

KQ2_INLINE float
finish_scale(float yd, sp_fp16_t xd, int32_t sumi)
{
    const float d = yd * _cvtsh_ss(xd);
    return d * (float)sumi;
}

/* The finish of one (super-block, token): FINISH_MIN adds Q2_K's / Q5_K's min term
 * (sum_g m[g] * bsums[g], exact: 15 or 63 times |bsums| <= 16 * 127). */
#define FINISH_MIN(yb, xb, sumi, mn16)                                                           \
    finish_scale_min((yb)->d, (xb)->d, (xb)->dmin, sumi,                                         \
                     hsum_i32x8(_mm256_madd_epi16(                                               \
                         mn16, _mm256_loadu_si256((const __m256i *)(yb)->bsums))))
#define FINISH_SCALE(yb, xb, sumi, mn16) finish_scale((yb)->d, (xb)->d, sumi)

/* One weight row x nt tokens. */
#define DEFINE_TILE(name, wblock, unpack, sgn, finish)                                           \
    KQ2_INLINE void name(int64_t nb, const wblock *x, const sp_block_q8_k *const *y, int nt,     \
                         float *out)                                                             \
    {                                                                                            \
        float sumf[TILE_TOK] = {0};                                                              \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            __m256i q[8], sc16, mn16;                                                            \
            unpack(&x[b], q, &sc16, &mn16);                                                      \
            (void)mn16;                                                                          \
            const __m256i sc_lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);                  \
            const __m256i sc_hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);                   \
            __m256i acc[TILE_TOK];                                                               \
            _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) acc[t] =                        \
                _mm256_setzero_si256();                                                          \
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)                                  \
            {                                                                                    \
                const __m256i s = _mm256_shuffle_epi8(                                           \
                    k < 4 ? sc_lo : sc_hi,                                                       \
                    _mm256_load_si256((const __m256i *)word_pair[k % 4]));                       \
                _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) acc[t] =                    \
                    _mm256_add_epi32(acc[t], group_dot(q[k], y[t][b].qs + 32 * k, s, sgn));      \
            }                                                                                    \
            _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++)                                 \
            {                                                                                    \
                const float blk = finish(&y[t][b], &x[b], hsum_i32x8(acc[t]), mn16);             \
                sumf[t] = sumf[t] + blk;                                                         \
            }                                                                                    \
        }                                                                                        \
        for (int t = 0; t < nt; t++)                                                             \
            out[t] = sumf[t];                                                                    \
    }

DEFINE_TILE(q2k_tile, sp_block_q2_k, kq2_unpack_q2k, 0, FINISH_MIN)
DEFINE_TILE(q3k_tile, sp_block_q3_k, kq2_unpack_q3k, 1, FINISH_SCALE)
DEFINE_TILE(q5k_tile, sp_block_q5_k, kq2_unpack_q5k, 0, FINISH_MIN)
DEFINE_TILE(iq4xs_tile, sp_block_iq4_xs, kq2_unpack_iq4xs, 1, FINISH_SCALE)

/* Rows outer (one weight row stays in L1 while the tokens sweep it), tokens in tiles of
 * TILE_TOK; the tail tile uses a smaller NT of the same microkernel. */
#define DEFINE_ENTRIES(vec_dot, gemm, tile, wblock)                                             \
    void vec_dot(int64_t n, float *s, const void *w, const void *x)                             \
    {                                                                                           \
        const sp_block_q8_k *y = x;                                                             \
        tile(n / SP_QK_K, w, &y, 1, s);                                                         \
    }                                                                                           \
    void gemm(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1, const void *x, \
              size_t x_stride, int64_t n_tok, float *y, int64_t ldy)                            \
    {                                                                                           \
        const int64_t nb = n / SP_QK_K;                                                         \
        for (int64_t r = r0; r < r1; r++) {                                                     \
            const wblock *wr = (const wblock *)((const char *)w + (size_t)r * w_stride);        \
            for (int64_t t0 = 0; t0 < n_tok; t0 += TILE_TOK) {                                  \
                const sp_block_q8_k *yr[TILE_TOK];                                              \
                float out[TILE_TOK];                                                            \
                const int nt = n_tok - t0 < TILE_TOK ? (int)(n_tok - t0) : TILE_TOK;            \
                for (int t = 0; t < nt; t++)                                                    \
                    yr[t] = (const sp_block_q8_k *)((const char *)x +                           \
                                                    (size_t)(t0 + t) * x_stride);               \
                switch (nt) {                                                                   \
                case 4: tile(nb, wr, yr, 4, out); break;                                        \
                case 3: tile(nb, wr, yr, 3, out); break;                                        \
                case 2: tile(nb, wr, yr, 2, out); break;                                        \
                default: tile(nb, wr, yr, 1, out); break;                                       \
                }                                                                               \
                for (int t = 0; t < nt; t++)                                                    \
                    y[(t0 + t) * ldy + r] = out[t];                                             \
            }                                                                                   \
        }                                                                                       \
    }

DEFINE_ENTRIES(sp__q2k_vec_dot_avx2, sp__q2k_gemm_avx2, q2k_tile, sp_block_q2_k)
DEFINE_ENTRIES(sp__q3k_vec_dot_avx2, sp__q3k_gemm_avx2, q3k_tile, sp_block_q3_k)
DEFINE_ENTRIES(sp__q5k_vec_dot_avx2, sp__q5k_gemm_avx2, q5k_tile, sp_block_q5_k)
DEFINE_ENTRIES(sp__iq4xs_vec_dot_avx2, sp__iq4xs_gemm_avx2, iq4xs_tile, sp_block_iq4_xs)

void
sp__kquants2_register_avx2(sp_cpu_kernels_t *k)
{
    k->vec_dot[SP_TYPE_Q2_K] = sp__q2k_vec_dot_avx2;
    k->vec_dot[SP_TYPE_Q3_K] = sp__q3k_vec_dot_avx2;
    k->vec_dot[SP_TYPE_Q5_K] = sp__q5k_vec_dot_avx2;
    k->vec_dot[SP_TYPE_IQ4_XS] = sp__iq4xs_vec_dot_avx2;
    k->gemm[SP_TYPE_Q2_K] = sp__q2k_gemm_avx2;
    k->gemm[SP_TYPE_Q3_K] = sp__q3k_gemm_avx2;
    k->gemm[SP_TYPE_Q5_K] = sp__q5k_gemm_avx2;
    k->gemm[SP_TYPE_IQ4_XS] = sp__iq4xs_gemm_avx2;
}
