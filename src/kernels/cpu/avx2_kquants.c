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

SP_INLINE int32_t
hsum_i32x4(__m128i s)
{
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* ---- F32 -> Q8_K ---------------------------------------------------------------------------- */

void
sp__q8k_from_float_avx2(const float *src, void *dst, int64_t n)
{
    sp_block_q8_k *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    /* packs_epi32/packs_epi16 interleave the 128-bit lanes; this puts the dwords back. */
    const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i lo_clamp = _mm256_set1_epi8(-127);
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        __m256 vmax = _mm256_setzero_ps();
        for (int i = 0; i < SP_QK_K; i += 8)
            vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const __m256 is = _mm256_set1_ps(sp__q8k_iscale(amax));
        y[b].d = sp__q8k_d(amax);
        for (int i = 0; i < SP_QK_K; i += 32) {
            /* x * iscale then round-half-even: the same two roundings as the reference. */
            __m256i v0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i), is));
            __m256i v1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8), is));
            __m256i v2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 16), is));
            __m256i v3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 24), is));
            y[b].bsums[i / 16] = (int16_t)hsum_i32x8(_mm256_add_epi32(v0, v1));
            y[b].bsums[i / 16 + 1] = (int16_t)hsum_i32x8(_mm256_add_epi32(v2, v3));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));
            p = _mm256_max_epi8(_mm256_permutevar8x32_epi32(p, unshuffle), lo_clamp);
            _mm256_storeu_si256((__m256i *)(y[b].qs + i), p);
        }
    }
}

/* ---- Q4_K x Q8_K ------------------------------------------------------------------------------ */

SP_INLINE void
q4k_tile(int64_t nb, const sp_block_q4_k *x, const sp_block_q8_k *const *y, int nt, float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[8], m[8];
        sp__q4k_unpack_scales(x[b].scales, sc, m);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
        __m256i acc[TILE_TOK];
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            /* 32 bytes: low nibbles are sub-block 2h, high nibbles sub-block 2h+1. */
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            const __m256i lo = _mm256_and_si256(q4, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i sc_lo = _mm256_set1_epi16(sc[2 * h]);
            const __m256i sc_hi = _mm256_set1_epi16(sc[2 * h + 1]);
            for (int t = 0; t < nt; t++) {
                const int8_t *q8 = y[t][b].qs + 64 * h;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
                __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                p0 = _mm256_madd_epi16(p0, sc_lo);
                p1 = _mm256_madd_epi16(p1, sc_hi);
                acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(p0, p1));
            }
        }
        const float xd = _cvtsh_ss(x[b].d), xdmin = _cvtsh_ss(x[b].dmin);
        for (int t = 0; t < nt; t++) {
            const sp_block_q8_k *yb = &y[t][b];
            /* min term: sum_j m[j] * (bsums[2j] + bsums[2j+1]) */
            const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)yb->bsums),
                                                 _mm_loadu_si128((const __m128i *)(yb->bsums + 8)));
            const int32_t summs = hsum_i32x4(_mm_madd_epi16(mins, pairs));
            const int32_t sumi = hsum_i32x8(acc[t]);
            const float d = yb->d * xd;
            const float dm = yb->d * xdmin;
            const float a = d * (float)sumi;
            const float c = dm * (float)summs;
            const float blk = a - c;
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

/* ---- Q6_K x Q8_K ------------------------------------------------------------------------------ */

SP_INLINE void
q6k_tile(int64_t nb, const sp_block_q6_k *x, const sp_block_q8_k *const *y, int nt, float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    /* Byte shuffles that spread int16 scale pair (2g, 2g+1) of a 128-bit lane over the low
     * (8 x scale 2g) and high (8 x scale 2g+1) halves of a 256-bit vector. */
    __m256i spread[4];
    for (int g = 0; g < 4; g++) {
        const char a = (char)(4 * g), c = (char)(4 * g + 2);
        spread[g] = _mm256_setr_epi8(a, (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1), a,
                                     (char)(a + 1), a, (char)(a + 1), a, (char)(a + 1), a,
                                     (char)(a + 1), a, (char)(a + 1), c, (char)(c + 1), c,
                                     (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1), c,
                                     (char)(c + 1), c, (char)(c + 1), c, (char)(c + 1), c,
                                     (char)(c + 1));
    }
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
        __m256i acc[TILE_TOK];
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            /* scales 8h..8h+7 in both 128-bit lanes */
            const __m256i sch = _mm256_permute2x128_si256(sc16, sc16, h ? 0x11 : 0x00);
            const uint8_t *ql = x[b].ql + 64 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[b].qh + 32 * h));
            /* 6-bit quants of elements 0-31, 32-63, 64-95, 96-127 of this half */
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            __m256i scv[4];
            for (int g = 0; g < 4; g++)
                scv[g] = _mm256_shuffle_epi8(sch, spread[g]);
            for (int t = 0; t < nt; t++) {
                const int8_t *q8 = y[t][b].qs + 128 * h;
                for (int g = 0; g < 4; g++) {
                    __m256i p = _mm256_maddubs_epi16(
                        q[g], _mm256_loadu_si256((const __m256i *)(q8 + 32 * g)));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, scv[g]));
                }
            }
        }
        const float xd = _cvtsh_ss(x[b].d);
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

/* ---- gemm tiles ------------------------------------------------------------------------------- */

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
