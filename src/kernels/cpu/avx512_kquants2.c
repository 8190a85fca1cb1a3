/*
 * avx512_kquants2.c - AVX-512 (F/BW/VL) kernels for Q2_K / Q3_K / Q5_K / IQ4_XS weights x Q8_K
 * activations. Built with the AVX-512 flags; dispatch.c only registers them on CPUs that have
 * AVX-512 F/BW/VL/DQ (VNNI is not needed). Pure functions, callable from any thread.
 *
 * Same scheme as avx2_kquants2.c, 64 elements (four 16-element groups) per instruction: the
 * super-block is unpacked once (kquants2_simd.h), two 32-byte quant vectors are joined into one
 * ZMM, maddubs (|w| x sign-adjusted q8, at most 127 * 127 * 2: no saturation) and madd by the
 * four groups' scales (VPERMW puts group 4m + i's scale over 128-bit lane i) sum exactly in
 * int32; then kquants2_impl.h's fixed float finish. Bit-identical to the scalar reference and to
 * its own vec_dot whatever the batch.
 */
#include <immintrin.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants2_simd.h"

#define TILE_TOK 4

/* VPERMW indices: word w of pair m reads scale word 4m + w / 8. */
#define I8(g) g, g, g, g, g, g, g, g
static const uint16_t scale_idx[4][32] __attribute__((aligned(64))) = {
    {I8(0), I8(1), I8(2), I8(3)},
    {I8(4), I8(5), I8(6), I8(7)},
    {I8(8), I8(9), I8(10), I8(11)},
    {I8(12), I8(13), I8(14), I8(15)},
};
#undef I8

KQ2_INLINE int32_t
hsum_i32x8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

KQ2_INLINE __m512i
join(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* int32 partial sums of sc[g] * sum(q * q8) over the four groups of q (64 elements against
 * q8[0..64)); `sgn`: q may be negative (|q| times q8 negated where q < 0; |q8| <= 127). */
KQ2_INLINE __m512i
group_dot(__m512i q, const int8_t *q8, __m512i sc, int sgn)
{
    const __m512i y = _mm512_loadu_si512((const void *)q8);
    __m512i p;
    if (sgn) {
        const __mmask64 neg = _mm512_movepi8_mask(q);
        const __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
        p = _mm512_maddubs_epi16(_mm512_abs_epi8(q), ys);
    } else {
        p = _mm512_maddubs_epi16(q, y);
    }
    return _mm512_madd_epi16(p, sc);
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

/* sumi of one (super-block, token); bias: the unpacked quants are q + bias, so subtract
 * bias * sum_g sc[g] * bsums[g] (exact: |sc| <= 32, |bsums| <= 16 * 127). */
KQ2_INLINE int32_t
tile_sumi(__m512i acc, int bias, __m256i sc16, const sp_block_q8_k *yb)
{
    int32_t sumi = _mm512_reduce_add_epi32(acc);
    if (bias)
        sumi -= bias * hsum_i32x8(_mm256_madd_epi16(
                           sc16, _mm256_loadu_si256((const __m256i *)yb->bsums)));
    return sumi;
}

#define FINISH_MIN(yb, xb, sumi, mn16)                                                           \
    finish_scale_min((yb)->d, (xb)->d, (xb)->dmin, sumi,                                         \
                     hsum_i32x8(_mm256_madd_epi16(                                               \
                         mn16, _mm256_loadu_si256((const __m256i *)(yb)->bsums))))
#define FINISH_SCALE(yb, xb, sumi, mn16) finish_scale((yb)->d, (xb)->d, sumi)

#define DEFINE_TILE(name, wblock, unpack, sgn, bias, finish)                                     \
    KQ2_INLINE void name(int64_t nb, const wblock *x, const sp_block_q8_k *const *y, int nt,     \
                         float *out)                                                             \
    {                                                                                            \
        float sumf[TILE_TOK] = {0};                                                              \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            __m256i q[8], sc16, mn16;                                                            \
            unpack(&x[b], q, &sc16, &mn16);                                                      \
            (void)mn16;                                                                          \
            const __m512i sc512 = _mm512_castsi256_si512(sc16);                                  \
            __m512i acc[TILE_TOK];                                                               \
            _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) acc[t] =                        \
                _mm512_setzero_si512();                                                          \
            _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++)                                  \
            {                                                                                    \
                const __m512i qm = join(q[2 * m], q[2 * m + 1]);                                 \
                const __m512i s = _mm512_permutexvar_epi16(                                      \
                    _mm512_load_si512((const void *)scale_idx[m]), sc512);                       \
                _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) acc[t] =                    \
                    _mm512_add_epi32(acc[t], group_dot(qm, y[t][b].qs + 64 * m, s, sgn));        \
            }                                                                                    \
            _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++)                                 \
            {                                                                                    \
                const int32_t sumi = tile_sumi(acc[t], bias, sc16, &y[t][b]);                    \
                const float blk = finish(&y[t][b], &x[b], sumi, mn16);                           \
                sumf[t] = sumf[t] + blk;                                                         \
            }                                                                                    \
        }                                                                                        \
        for (int t = 0; t < nt; t++)                                                             \
            out[t] = sumf[t];                                                                    \
    }

DEFINE_TILE(q2k_tile, sp_block_q2_k, kq2_unpack_q2k, 0, 0, FINISH_MIN)
DEFINE_TILE(q3k_tile, sp_block_q3_k, kq2_unpack_q3k, 0, 4, FINISH_SCALE)
DEFINE_TILE(q5k_tile, sp_block_q5_k, kq2_unpack_q5k, 0, 0, FINISH_MIN)
DEFINE_TILE(iq4xs_tile, sp_block_iq4_xs, kq2_unpack_iq4xs, 1, 0, FINISH_SCALE)

/* Rows outer, tokens in tiles of TILE_TOK; the tail tile uses a smaller NT of the same
 * microkernel. */
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

DEFINE_ENTRIES(sp__q2k_vec_dot_avx512, sp__q2k_gemm_avx512, q2k_tile, sp_block_q2_k)
DEFINE_ENTRIES(sp__q3k_vec_dot_avx512, sp__q3k_gemm_avx512, q3k_tile, sp_block_q3_k)
DEFINE_ENTRIES(sp__q5k_vec_dot_avx512, sp__q5k_gemm_avx512, q5k_tile, sp_block_q5_k)
DEFINE_ENTRIES(sp__iq4xs_vec_dot_avx512, sp__iq4xs_gemm_avx512, iq4xs_tile, sp_block_iq4_xs)

void
sp__kquants2_register_avx512(sp_cpu_kernels_t *k)
{
    k->vec_dot[SP_TYPE_Q2_K] = sp__q2k_vec_dot_avx512;
    k->vec_dot[SP_TYPE_Q3_K] = sp__q3k_vec_dot_avx512;
    k->vec_dot[SP_TYPE_Q5_K] = sp__q5k_vec_dot_avx512;
    k->vec_dot[SP_TYPE_IQ4_XS] = sp__iq4xs_vec_dot_avx512;
    /* The gemms stay the AVX2 8-token panels registered before (the same bits as these vec_dots,
     * so batch invariance holds): on a Zen 5 the engine's 512-token prefill ran 1.3-1.6x faster
     * with them than with sp__*_gemm_avx512 (Q2_K 124 vs 77 tok/s, Q3_K 104 vs 73, Q5_K 95 vs 73;
     * BENCHMARKS.md, "Ten types on an AVX-512 host"). The AVX-512 gemms stay, tested
     * (test_kquants2.c), until a 512-bit panel beats the AVX2 one. With VNNI, Q2_K's gemm is then
     * avx512_kpanel.c's (sp__kpanels_register_avx512, after this). */
}
