/*
 * avx512_kquants.c - AVX-512 kernels for Q4_K / Q6_K weights x Q8_K activations.
 * Built with AVX-512 F/BW/VL/DQ/VNNI/BF16 flags; dispatch.c calls sp__kquants_register_avx512
 * only on CPUs with F/BW/VL, and passes has_vnni: the VPDPWSSD variants are registered only then.
 *
 * Same structure and numerics as avx2_kquants.c: a 1 row x NT token microkernel (vec_dot is
 * NT = 1, gemm uses NT = 4), an exact int32 sum per super-block, then the fixed float sequence
 * of kquants_impl.h, so results are bit-identical to the scalar reference and to vec_dot.
 * A 512-bit register holds 64 quants: for Q4_K the two nibble planes of a 64-element chunk, for
 * Q6_K the low or the high 64 elements of a 128-element half.
 */
#include <immintrin.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants_impl.h"

#define SP_INLINE static inline __attribute__((always_inline))
#define TILE_TOK 4

SP_INLINE int32_t
hsum_i32x8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

SP_INLINE __m256i
fold_i32x16(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* acc + scale-weighted pair sums: VPDPWSSD fuses the multiply-add and the accumulate. */
SP_INLINE __m512i
dot_i16(__m512i acc, __m512i p, __m512i scale, bool vnni)
{
    if (vnni)
        return _mm512_dpwssd_epi32(acc, p, scale);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, scale));
}

/* ---- F32 -> Q8_K ---------------------------------------------------------------------------- */

void
sp__q8k_from_float_avx512(const float *src, void *dst, int64_t n)
{
    sp_block_q8_k *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        __m512 vmax = _mm512_setzero_ps();
        for (int i = 0; i < SP_QK_K; i += 16)
            vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(src + i)), vmax); /* NaN dropped */
        const float amax = _mm512_reduce_max_ps(vmax); /* max is exact in any order */
        const __m512 is = _mm512_set1_ps(sp__q8k_iscale(amax));
        y[b].d = sp__q8k_d(amax);
        for (int i = 0; i < SP_QK_K; i += 16) {
            /* clamped before the rounding, NaN to -127 (avx2_kquants.c, q8k_round) */
            __m512 f = _mm512_mul_ps(_mm512_loadu_ps(src + i), is);
            f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            const __m512i v = _mm512_cvtps_epi32(f);
            y[b].bsums[i / 16] = (int16_t)_mm512_reduce_add_epi32(v);
            _mm_storeu_si128((__m128i *)(y[b].qs + i), _mm512_cvtepi32_epi8(v));
        }
    }
}

/* ---- Q4_K x Q8_K ---------------------------------------------------------------------------- */

/*
 * The float finish of one Q4_K super-block, in SSE lanes (no GPR round trip): a4 holds four
 * int32 partial sums of sumi, mm four of summs. Lane-wise IEEE operations, so this is exactly
 * the scalar sequence of kquants_impl.h: d = y.d * x.d, dm = y.d * x.dmin, a = d * sumi,
 * c = dm * summs, blk = a - c. xdd holds (x.d, x.dmin) as floats in lanes 0 and 1.
 */
SP_INLINE float
q4k_finish(__m128i a4, __m128i mm, __m128 xdd, float yd)
{
    /* (sumi, summs, 0, 0), exact, then to float */
    const __m128i ii = _mm_hadd_epi32(_mm_hadd_epi32(a4, mm), _mm_setzero_si128());
    const __m128 ac = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(yd), xdd), _mm_cvtepi32_ps(ii));
    return _mm_cvtss_f32(_mm_sub_ss(ac, _mm_movehdup_ps(ac)));
}

SP_INLINE __m128
q4k_load_d_dmin(const sp_block_q4_k *x)
{
    uint32_t dd;
    memcpy(&dd, &x->d, sizeof(dd)); /* d and dmin are adjacent fp16 */
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
}

SP_INLINE void
q4k_tile(int64_t nb, const sp_block_q4_k *x, const sp_block_q8_k *const *y, int nt, float *out,
         bool vnni)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* word shift counts: 0 for the low 256 bits (sub-block 2h), 4 for the high (2h+1) */
    const __m512i nib_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    /* word permutes spreading scale 2h over words 0-15 and scale 2h+1 over words 16-31 */
    __m512i spread[4];
    for (int h = 0; h < 4; h++)
        spread[h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * h))),
                                       _mm256_set1_epi16((short)(2 * h + 1)), 1);
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        uint64_t sc64, m64;
        sp__q4k_unpack_scales_u64(x[b].scales, &sc64, &m64);
        const __m512i sc16 =
            _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc64)));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m64));
        __m512i acc[TILE_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            /* the 32 bytes of 64-element chunk h in both 256-bit halves, then the low /
             * high nibbles: sub-blocks 2h and 2h+1, matching 64 contiguous Q8_K quants */
            const __m512i raw =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h)));
            const __m512i q4 = _mm512_and_si512(_mm512_srlv_epi16(raw, nib_shift), m4);
            const __m512i scv = _mm512_permutexvar_epi16(spread[h], sc16);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m512i q8 = _mm512_loadu_si512(y[t][b].qs + 64 * h);
                acc[t] = dot_i16(acc[t], _mm512_maddubs_epi16(q4, q8), scv, vnni);
            }
        }
        const __m128 xdd = q4k_load_d_dmin(&x[b]);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const sp_block_q8_k *yb = &y[t][b];
            /* min term: sum_j m[j] * (bsums[2j] + bsums[2j+1]) */
            const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)yb->bsums),
                                                 _mm_loadu_si128((const __m128i *)(yb->bsums + 8)));
            const __m256i a8 = fold_i32x16(acc[t]);
            const __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(a8),
                                             _mm256_extracti128_si256(a8, 1));
            const float blk = q4k_finish(a4, _mm_madd_epi16(mins, pairs), xdd, yb->d);
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

/* ---- Q6_K x Q8_K ---------------------------------------------------------------------------- */

#define SPREAD4(b) b, b, b, b, b, b, b, b, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, \
                   b + 2, b + 2, b + 2, b + 2, b + 2, b + 2, b + 2, b + 2, b + 3, b + 3, b + 3,   \
                   b + 3, b + 3, b + 3, b + 3, b + 3
static const int16_t q6k_spread[4][32] __attribute__((aligned(64))) = {
    {SPREAD4(0)}, {SPREAD4(4)}, {SPREAD4(8)}, {SPREAD4(12)},
};
#undef SPREAD4

SP_INLINE void
q6k_tile(int64_t nb, const sp_block_q6_k *x, const sp_block_q8_k *const *y, int nt, float *out,
         bool vnni)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    /* qh bits 0-1 (elements 0-31) and 2-3 (32-63) to bits 4-5: left shifts 4 and 2;
     * bits 4-5 (64-95) and 6-7 (96-127): right shifts 0 and 2. */
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* Word permutes of the 16 int16 scales: 64 elements are 4 scale groups of 16, i.e. 8
     * maddubs words each; table i serves scales 4i..4i+3 (half i/2, low or high 64). */
    __m512i spread[4];
    for (int i = 0; i < 4; i++)
        spread[i] = _mm512_loadu_si512(q6k_spread[i]);
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sc16_256 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
        const __m512i sc16 = _mm512_zextsi256_si512(sc16_256);
        __m512i acc[TILE_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(x[b].ql + 64 * h);
            const __m512i qh =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[b].qh + 32 * h)));
            const __m512i qa = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                               _mm512_and_si512(_mm512_sllv_epi16(qh, sh_lo), m30));
            const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                               _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30));
            const __m512i sca = _mm512_permutexvar_epi16(spread[2 * h], sc16);
            const __m512i scb = _mm512_permutexvar_epi16(spread[2 * h + 1], sc16);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const int8_t *q8 = y[t][b].qs + 128 * h;
                acc[t] = dot_i16(acc[t], _mm512_maddubs_epi16(qa, _mm512_loadu_si512(q8)), sca,
                                 vnni);
                acc[t] = dot_i16(acc[t], _mm512_maddubs_epi16(qb, _mm512_loadu_si512(q8 + 64)),
                                 scb, vnni);
            }
        }
        const float xd = _cvtsh_ss(x[b].d);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const sp_block_q8_k *yb = &y[t][b];
            const __m256i corr = _mm256_madd_epi16(
                sc16_256, _mm256_loadu_si256((const __m256i *)yb->bsums));
            const int32_t sumi =
                hsum_i32x8(_mm256_sub_epi32(fold_i32x16(acc[t]), _mm256_slli_epi32(corr, 5)));
            const float d = yb->d * xd;
            const float blk = d * (float)sumi;
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

/* ---- instances ------------------------------------------------------------------------------ */

#define DEFINE_VEC_DOT(name, tile, vnni)                                                        \
    void name(int64_t n, float *s, const void *w, const void *x)                                \
    {                                                                                           \
        const sp_block_q8_k *y = x;                                                             \
        tile(n / SP_QK_K, w, &y, 1, s, vnni);                                                   \
    }

/* Rows outer (one weight row stays in L1 while all tokens sweep it), tokens in tiles of
 * TILE_TOK; the tail tile uses a smaller NT of the same microkernel. */
#define DEFINE_GEMM(name, tile, wblock, vnni)                                                   \
    void name(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1, const void *x, \
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
                case 4: tile(nb, wr, yr, 4, out, vnni); break;                                  \
                case 3: tile(nb, wr, yr, 3, out, vnni); break;                                  \
                case 2: tile(nb, wr, yr, 2, out, vnni); break;                                  \
                default: tile(nb, wr, yr, 1, out, vnni); break;                                 \
                }                                                                               \
                for (int t = 0; t < nt; t++)                                                    \
                    y[(t0 + t) * ldy + r] = out[t];                                             \
            }                                                                                   \
        }                                                                                       \
    }

DEFINE_VEC_DOT(sp__q4k_vec_dot_avx512, q4k_tile, false)
DEFINE_VEC_DOT(sp__q6k_vec_dot_avx512, q6k_tile, false)
DEFINE_VEC_DOT(sp__q4k_vec_dot_avx512_vnni, q4k_tile, true)
DEFINE_VEC_DOT(sp__q6k_vec_dot_avx512_vnni, q6k_tile, true)
DEFINE_GEMM(sp__q4k_gemm_avx512, q4k_tile, sp_block_q4_k, false)
DEFINE_GEMM(sp__q6k_gemm_avx512, q6k_tile, sp_block_q6_k, false)
DEFINE_GEMM(sp__q4k_gemm_avx512_vnni, q4k_tile, sp_block_q4_k, true)
DEFINE_GEMM(sp__q6k_gemm_avx512_vnni, q6k_tile, sp_block_q6_k, true)

void
sp__kquants_register_avx512(sp_cpu_kernels_t *k, bool has_vnni, bool has_bf16)
{
    (void)has_bf16; /* no bf16 in the K-quant path */
    k->vec_dot_type[SP_TYPE_Q4_K] = SP_TYPE_Q8_K;
    k->vec_dot_type[SP_TYPE_Q6_K] = SP_TYPE_Q8_K;
    k->from_float[SP_TYPE_Q8_K] = sp__q8k_from_float_avx512;
    k->vec_dot[SP_TYPE_Q4_K] = has_vnni ? sp__q4k_vec_dot_avx512_vnni : sp__q4k_vec_dot_avx512;
    k->vec_dot[SP_TYPE_Q6_K] = has_vnni ? sp__q6k_vec_dot_avx512_vnni : sp__q6k_vec_dot_avx512;
    k->gemm[SP_TYPE_Q4_K] = has_vnni ? sp__q4k_gemm_avx512_vnni : sp__q4k_gemm_avx512;
    k->gemm[SP_TYPE_Q6_K] = has_vnni ? sp__q6k_gemm_avx512_vnni : sp__q6k_gemm_avx512;
}
