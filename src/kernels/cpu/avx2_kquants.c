/*
 * avx2_kquants.c - AVX2 (+FMA, F16C) kernels for Q4_K / Q6_K weights x Q8_K activations.
 * Built with -mavx2 -mfma -mf16c; dispatch.c only calls sp__kquants_register_avx2 on CPUs that
 * have them.
 *
 * One microkernel per weight type does 1 weight row x NT tokens (NT <= 4); vec_dot is the
 * NT = 1 instance and gemm tiles use NT = 4, so every (row, token) pair goes through the same
 * instructions in the same order whatever the batch. Per super-block the integer sum is exact
 * (maddubs products fit int16: 15*127*2 and 63*127*2), then the float finish is the fixed
 * sequence of kquants_impl.h, which makes the result bit-identical to the scalar reference.
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

/* ---- F32 -> Q8_K ---------------------------------------------------------------------------- */

/* v rounded half to even into [-127, 127], as the reference's clamp(round(v)): clamping
 * first gives the same integers (a value in (127, 127.5] rounds to 127 or 128 and is clamped to
 * 127 either way), and max/min return their second operand for a NaN lane, so NaN becomes
 * -127 as the reference's fmaxf makes it, instead of INT_MIN, which would wrap the bsums. */
static inline __m256i
q8k_round(__m256 v)
{
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(v);
}

void
sp__q8k_from_float_avx2(const float *src, void *dst, int64_t n)
{
    sp_block_q8_k *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    /* packs_epi32/packs_epi16 interleave the 128-bit lanes; this puts the dwords back. */
    const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        __m256 vmax = _mm256_setzero_ps();
        for (int i = 0; i < SP_QK_K; i += 8)
            /* max returns its second operand when either is NaN: the running max, so a
             * NaN is dropped as the reference's `a > amax` drops it. */
            vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)), vmax);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const __m256 is = _mm256_set1_ps(sp__q8k_iscale(amax));
        y[b].d = sp__q8k_d(amax);
        for (int i = 0; i < SP_QK_K; i += 32) {
            /* x * iscale then round-half-even: the same two roundings as the reference. */
            __m256i v0 = q8k_round(_mm256_mul_ps(_mm256_loadu_ps(src + i), is));
            __m256i v1 = q8k_round(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8), is));
            __m256i v2 = q8k_round(_mm256_mul_ps(_mm256_loadu_ps(src + i + 16), is));
            __m256i v3 = q8k_round(_mm256_mul_ps(_mm256_loadu_ps(src + i + 24), is));
            y[b].bsums[i / 16] = (int16_t)hsum_i32x8(_mm256_add_epi32(v0, v1));
            y[b].bsums[i / 16 + 1] = (int16_t)hsum_i32x8(_mm256_add_epi32(v2, v3));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));
            p = _mm256_permutevar8x32_epi32(p, unshuffle);
            _mm256_storeu_si256((__m256i *)(y[b].qs + i), p);
        }
    }
}

/* ---- Q4_K x Q8_K ---------------------------------------------------------------------------- */

/* vpshufb masks repeating int16 word j (bytes 2j, 2j+1) of each 128-bit lane over the lane */
#define W(j) 2 * (j), 2 * (j) + 1
#define W8(j) W(j), W(j), W(j), W(j), W(j), W(j), W(j), W(j)
static const uint8_t word_bcast[8][32] __attribute__((aligned(32))) = {
    {W8(0), W8(0)}, {W8(1), W8(1)}, {W8(2), W8(2)}, {W8(3), W8(3)},
    {W8(4), W8(4)}, {W8(5), W8(5)}, {W8(6), W8(6)}, {W8(7), W8(7)},
};
/* Q6_K: word 2g of the lane over the low 128 bits, word 2g+1 over the high 128 bits */
static const uint8_t word_pair[4][32] __attribute__((aligned(32))) = {
    {W8(0), W8(1)}, {W8(2), W8(3)}, {W8(4), W8(5)}, {W8(6), W8(7)},
};
#undef W8
#undef W

SP_INLINE __m256i
bcast_word(__m256i v, const uint8_t mask[32])
{
    return _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)mask));
}

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
q4k_tile(int64_t nb, const sp_block_q4_k *x, const sp_block_q8_k *const *y, int nt, float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        uint64_t sc64, m64;
        sp__q4k_unpack_scales_u64(x[b].scales, &sc64, &m64);
        const __m256i sc16 = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc64)));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m64));
        __m256i acc[TILE_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            /* 64-element chunk h, 32 bytes: low nibbles are sub-block 2h, high 2h+1. */
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            const __m256i lo = _mm256_and_si256(q4, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i sc_lo = bcast_word(sc16, word_bcast[2 * h]);
            const __m256i sc_hi = bcast_word(sc16, word_bcast[2 * h + 1]);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const int8_t *q8 = y[t][b].qs + 64 * h;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
                __m256i p1 =
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                p0 = _mm256_madd_epi16(p0, sc_lo);
                p1 = _mm256_madd_epi16(p1, sc_hi);
                acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(p0, p1));
            }
        }
        const __m128 xdd = q4k_load_d_dmin(&x[b]);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const sp_block_q8_k *yb = &y[t][b];
            /* min term: sum_j m[j] * (bsums[2j] + bsums[2j+1]) */
            const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)yb->bsums),
                                                 _mm_loadu_si128((const __m128i *)(yb->bsums + 8)));
            const __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(acc[t]),
                                             _mm256_extracti128_si256(acc[t], 1));
            const float blk = q4k_finish(a4, _mm_madd_epi16(mins, pairs), xdd, yb->d);
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

void
sp__q4k_vec_dot_avx2(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q8_k *y = x;
    q4k_tile(n / SP_QK_K, w, &y, 1, s);
}

/* ---- Q6_K x Q8_K ---------------------------------------------------------------------------- */

SP_INLINE void
q6k_tile(int64_t nb, const sp_block_q6_k *x, const sp_block_q8_k *const *y, int nt, float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
        __m256i acc[TILE_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            /* scales 8h..8h+7 in both 128-bit lanes */
            const __m256i sch = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                       : _mm256_permute2x128_si256(sc16, sc16, 0x11);
            const uint8_t *ql = x[b].ql + 64 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[b].qh + 32 * h));
            /* 6-bit quants of elements 0-31, 32-63, 64-95, 96-127 of this half */
            const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_and_si256(qh, m30));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            /* scale 8h+2g over the low 16 elements of group g, 8h+2g+1 over the high 16 */
            const __m256i s0 = bcast_word(sch, word_pair[0]);
            const __m256i s1 = bcast_word(sch, word_pair[1]);
            const __m256i s2 = bcast_word(sch, word_pair[2]);
            const __m256i s3 = bcast_word(sch, word_pair[3]);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m256i *q8 = (const __m256i *)(y[t][b].qs + 128 * h);
                const __m256i p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(q0, _mm256_loadu_si256(q8)), s0);
                const __m256i p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(q1, _mm256_loadu_si256(q8 + 1)), s1);
                const __m256i p2 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(q2, _mm256_loadu_si256(q8 + 2)), s2);
                const __m256i p3 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(q3, _mm256_loadu_si256(q8 + 3)), s3);
                acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(_mm256_add_epi32(p0, p1),
                                                                   _mm256_add_epi32(p2, p3)));
            }
        }
        const float xd = _cvtsh_ss(x[b].d);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const sp_block_q8_k *yb = &y[t][b];
            /* the -32 offset: sum_k sc[k] * 32 * bsums[k] */
            const __m256i corr = _mm256_madd_epi16(
                sc16, _mm256_loadu_si256((const __m256i *)yb->bsums));
            const int32_t sumi = hsum_i32x8(_mm256_sub_epi32(acc[t], _mm256_slli_epi32(corr, 5)));
            const float d = yb->d * xd;
            const float blk = d * (float)sumi;
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

void
sp__q6k_vec_dot_avx2(int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q8_k *y = x;
    q6k_tile(n / SP_QK_K, w, &y, 1, s);
}

/* ---- gemm tiles ----------------------------------------------------------------------------- */

/* Rows outer (one weight row stays in L1 while all tokens sweep it), tokens in tiles of
 * TILE_TOK; the tail tile uses a smaller NT of the same microkernel. */
#define DEFINE_GEMM(name, tile, wblock)                                                         \
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

DEFINE_GEMM(sp__q4k_gemm_avx2, q4k_tile, sp_block_q4_k)
DEFINE_GEMM(sp__q6k_gemm_avx2, q6k_tile, sp_block_q6_k)

void
sp__kquants_register_avx2(sp_cpu_kernels_t *k)
{
    k->vec_dot_type[SP_TYPE_Q4_K] = SP_TYPE_Q8_K;
    k->vec_dot_type[SP_TYPE_Q6_K] = SP_TYPE_Q8_K;
    k->from_float[SP_TYPE_Q8_K] = sp__q8k_from_float_avx2;
    k->vec_dot[SP_TYPE_Q4_K] = sp__q4k_vec_dot_avx2;
    k->vec_dot[SP_TYPE_Q6_K] = sp__q6k_vec_dot_avx2;
    k->gemm[SP_TYPE_Q4_K] = sp__q4k_gemm_avx2;
    k->gemm[SP_TYPE_Q6_K] = sp__q6k_gemm_avx2;
}
