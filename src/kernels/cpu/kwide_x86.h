/*
 * kwide_x86.h - the x86 prefill gemms of packed Q4_K, Q5_K and Q6_K weights
 * (repack_impl.h's 8-row groups) against Q8_K activations, for calls with many tokens:
 * q8gemm_x86.h's loop order for the K-quant forms. The tiles (avx2_repack.c's Q4_K,
 * avx2_kpack.c's Q5_K and Q6_K) run 4 tokens over each super-block with the weights as two
 * row sets (two int32 lanes a row, a VPHADDD per super-block and token to fold them) and
 * decode a sub-block's values once per 4 tokens. Here each 32 values of a super-block are
 * laid out once as eight registers of 8 rows x 4 elements (VSHUFPS of the two row sets'
 * chunks: 32-bit lane r = row r) and every token of the chunk (up to KW_MAX_TOK) runs against
 * them: a token's 4 quants broadcast to all lanes, so lane r holds row r's sums throughout.
 *
 * Numerics: the same integers as the tiles, so the same bits (the reference's).
 * Q4_K: a sub-block's eight VPMADDUBSW (nibble 0..15 against a quant of at most 128 in
 * magnitude: a pair sum at most 3840) add in int16, at most 30720; the VPMADDWD that widens
 * them multiplies by the rows' 6-bit scale (both int16 of a row's lane carry it), at most
 * 2 * 30720 * 63 a sub-block and eight sub-blocks in int32. The mins term and the float finish
 * are the tiles' (rpx_kmins_sum, rpx_kfinish). Q5_K: the same with values up to 31 (pair sums
 * at most 7936), four pair sums in int16 (31744) and two VPMADDWD a sub-block.
 * Q6_K: values 0..63 (q + 32), a VPMADDUBSW pair sum at most 2 * 63 * 128 = 16128, so two add
 * in int16 (32256) and each 16-element sub-block is two VPMADDWD by its signed 8-bit scale;
 * the -32 offset comes off as 32 * sum_k sc[k] bsums[k], and the finish is avx2_kpack.c's.
 * avx2_repack.c and avx2_kpack.c hand these gemms calls from a token count per type and table
 * (RPX_BY_TOKENS; the AVX-512 table keeps the AVX2 packed Q5_K gemm, so this one there too).
 *
 * The body is compiled twice: by avx2_kwide.c (KW_VNNI 0, the forms above) and by
 * avxvnni_kwide.c for the "avx2-vnni" table (KW_VNNI 1): there VPDPBUSD adds the byte products
 * of a sub-block (Q6_K: a 16-element half) straight into int32 lanes and one VPMULLD applies
 * the row's scale, where the AVX2 form spends VPMADDUBSW, the int16 adds and a VPMADDWD; the
 * same integers (each block sum and scaled sum fits int32 exactly), so the same bits. The
 * including file defines KW_VNNI and the names KW_Q4K_FN, KW_Q5K_FN, KW_Q6K_FN.
 *
 * Pure functions, any thread, no heap; about 4 KiB of stack (a chunk's accumulators).
 */
#if !defined(KW_VNNI) || !defined(KW_Q4K_FN) || !defined(KW_Q5K_FN) || !defined(KW_Q6K_FN)
#error "define KW_VNNI and KW_Q4K_FN, KW_Q5K_FN, KW_Q6K_FN before including kwide_x86.h"
#endif

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/avx2_repack_impl.h"

#define KW_INLINE static inline __attribute__((always_inline))

#define KW_MAX_TOK 64                 /* tokens of a chunk: the accumulators' rows */
#define KW_X_CHUNK_BYTES (128 * 1024) /* a chunk's activations, kept in L2 while groups sweep */

_Static_assert(SP_REPACK_ROWS == 8, "a group is one register of 8 lanes");

/*
 * Sub-block j of a packed Q4_K (q5 false) or Q5_K super-block (pb): w[m] = elements 4m .. 4m + 3
 * of rows 0..7 (lane r = row r), unsigned (0..15, Q5_K 0..31), S = each row's scale in both
 * int16 of its lane. The quants of sub-blocks 2i and 2i + 1 are the low and high nibbles of the
 * 256 bytes at QS + 256 i: chunk s + 2k holds bytes 8k .. 8k + 7 of row set s ({0,1,4,5} or
 * {2,3,6,7}, a row a 64-bit lane); Q5_K's qh chunk s + 2k holds the same elements' fifth bits,
 * bit j for sub-block j, moved to bit 4 by q5_hi (the dword shuffle keeps bytes whole, so it
 * commutes with both).
 */
KW_INLINE void
kw_subblock(bool q5, const uint8_t *pb, int j, __m256i w[8], __m256i *S)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    const uint8_t *qp = pb + (q5 ? SP_REPACK_Q5K_QS : SP_REPACK_Q4K_QS) + 256 * (j >> 1);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m256i lo, hi;
        rpx_rows8_at(qp + 64 * k, &lo, &hi);
        if (j & 1) {
            lo = _mm256_srli_epi16(lo, 4);
            hi = _mm256_srli_epi16(hi, 4);
        }
        w[2 * k] = _mm256_and_si256(lo, m4);     /* 8k .. 8k + 3 */
        w[2 * k + 1] = _mm256_and_si256(hi, m4); /* 8k + 4 .. 8k + 7 */
        if (q5) {
            __m256i hl, hh;
            rpx_rows8_at(pb + SP_REPACK_Q5K_QH + 64 * k, &hl, &hh);
            w[2 * k] = _mm256_or_si256(w[2 * k], q5_hi(hl, j, m10));
            w[2 * k + 1] = _mm256_or_si256(w[2 * k + 1], q5_hi(hh, j, m10));
        }
    }
    int64_t scj;
    memcpy(&scj, pb + SP_REPACK_Q4K_SC + 8 * j, sizeof scj);
    const __m256i s32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(scj));
    *S = KW_VNNI ? s32 : _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16)); /* VNNI: VPMULLD's */
}

/* The scaled sum of one sub-block (w, S) against a token's 32 quants xq, lane r = row r.
 * Q4_K's eight pair sums add in int16 (at most 30720); Q5_K's (at most 2 * 31 * 128 = 7936
 * each) four at a time (31744), then two VPMADDWD. */
KW_INLINE __m256i
kw_dot(bool q5, const __m256i w[8], __m256i S, const int8_t *xq)
{
#if KW_VNNI
    (void)q5; /* a block sum of 32 products of at most 31 * 128: exact in int32 either way */
    return _mm256_mullo_epi32(rpx_dot8_vnni(_mm256_setzero_si256(), w, xq), S);
#else
    __m256i p[4];
    rpx_dot8_pairs(w, xq, p);
    if (q5) {
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), S),
                                _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), S));
    }
    return _mm256_madd_epi16(
        _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])), S);
#endif
}

/* One group (8 rows, g) x tokens [0, T) of a chunk (x, xs bytes apart) over all nb
 * super-blocks of Q4_K (q5 false) or Q5_K: acc[t] the 8 rows' sums of token t. pf: the group's
 * first pass (weights from memory), prefetched SP_PF_ONE_TOKEN ahead as the tiles do. Both
 * types share the header (d, dmin, scales, mins) and so the finish. */
KW_INLINE void
kw_group_k45(bool q5, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, int T, bool pf,
             __m256 *acc, __m256i *isum)
{
    const size_t bb = q5 ? SP_REPACK_Q5K_BLOCK_BYTES : SP_REPACK_Q4K_BLOCK_BYTES;
    for (int t = 0; t < T; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * bb;
        if (pf) {
            rpx_prefetch(pb + SP_PF_ONE_TOKEN, (int)bb);
        }
        const uint8_t *xb = x + (size_t)b * sizeof(sp_block_q8_k);
        for (int j = 0; j < 8; j++) {
            __m256i w[8], S;
            kw_subblock(q5, pb, j, w, &S);
            const int8_t *xq = (const int8_t *)(xb + offsetof(sp_block_q8_k, qs)) + 32 * j;
            if (j == 0) {
                for (int t = 0; t < T; t++) {
                    isum[t] = kw_dot(q5, w, S, xq + (size_t)t * xs);
                }
            } else {
                for (int t = 0; t < T; t++) {
                    isum[t] = _mm256_add_epi32(isum[t], kw_dot(q5, w, S, xq + (size_t)t * xs));
                }
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q4K_D)));
        const __m256 dmw =
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q4K_DMIN)));
        __m256i M[4];
        rpx_kmins_load(pb, M);
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = xb + (size_t)t * xs;
            acc[t] = rpx_kfinish(acc[t], isum[t], rpx_kmins_sum(xt, M), xt, dw, dmw);
        }
    }
}

static void
kw_group_q4k(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, int T, bool pf,
             __m256 *acc, __m256i *isum)
{
    kw_group_k45(false, nb, g, x, xs, T, pf, acc, isum);
}

static void
kw_group_q5k(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, int T, bool pf,
             __m256 *acc, __m256i *isum)
{
    kw_group_k45(true, nb, g, x, xs, T, pf, acc, isum);
}

/*
 * Value group J (elements 32 J .. 32 J + 31, sub-blocks 2J and 2J + 1) of a packed Q6_K
 * super-block (pb): w[m] = elements 4m .. 4m + 3 of rows 0..7 (lane r = row r), 0..63. Row set
 * s's three "6+2" vectors (repack_impl.h) give its elements 0-23 in their low 6 bits and
 * element 24 + i's bit pairs in the top bits of byte i, as in avx2_kpack.c; the two row sets'
 * vectors of the same 8 elements then meet in one VSHUFPS pair.
 */
KW_INLINE void
kw_q6k_values(const uint8_t *pb, int J, __m256i w[8])
{
    const __m256i m3f = _mm256_set1_epi8(0x3f), m03 = _mm256_set1_epi8(0x03);
    const __m256i m0c = _mm256_set1_epi8(0x0c), m30 = _mm256_set1_epi8(0x30);
    __m256i q[2][4];
#pragma GCC unroll 2
    for (int s = 0; s < 2; s++) {
        const uint8_t *qp = pb + SP_REPACK_Q6K_Q + 32 * s + 192 * J;
        const __m256i A = _mm256_loadu_si256((const __m256i *)qp);
        const __m256i B = _mm256_loadu_si256((const __m256i *)(qp + 64));
        const __m256i C = _mm256_loadu_si256((const __m256i *)(qp + 128));
        q[s][0] = _mm256_and_si256(A, m3f);
        q[s][1] = _mm256_and_si256(B, m3f);
        q[s][2] = _mm256_and_si256(C, m3f);
        q[s][3] = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 6), m03),
                                                  _mm256_and_si256(_mm256_srli_epi16(B, 4), m0c)),
                                  _mm256_and_si256(_mm256_srli_epi16(C, 2), m30));
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        rpx_rows8(q[0][k], q[1][k], &w[2 * k], &w[2 * k + 1]);
    }
}

/* Q6_K: one group (8 rows, g) x tokens [0, T) of a chunk over all nb super-blocks, as
 * kw_group. The scales of sub-blocks 2J, 2J + 1 of the 8 rows are one 16-byte load (int16
 * 2r + e after VPMOVSXBW: row r's pair in its 32-bit lane); one VPSHUFB each puts sub-block
 * 2J + e's scale in both int16 of a row's lane. */
static void
kw_group_q6k(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, int T, bool pf,
             __m256 *acc, __m256i *isum)
{
    for (int t = 0; t < T; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_Q6K_BLOCK_BYTES;
        if (pf) {
            rpx_prefetch(pb + SP_PF_ONE_TOKEN, SP_REPACK_Q6K_BLOCK_BYTES);
        }
        const uint8_t *xb = x + (size_t)b * sizeof(sp_block_q8_k);
        for (int J = 0; J < 8; J++) {
            __m256i w[8];
            kw_q6k_values(pb, J, w);
            const __m256i P = _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q6K_SC + 16 * J)));
            const int8_t *xq = (const int8_t *)(xb + offsetof(sp_block_q8_k, qs)) + 32 * J;
#if KW_VNNI
            /* row r's scales of sub-blocks 2J, 2J + 1 as int32 (the low / high int16 of lane r) */
            const __m256i S0 = _mm256_srai_epi32(_mm256_slli_epi32(P, 16), 16);
            const __m256i S1 = _mm256_srai_epi32(P, 16);
            for (int t = 0; t < T; t++) {
                const int8_t *xt = xq + (size_t)t * xs;
                __m256i d0 = _mm256_setzero_si256(), d1 = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    d0 = _mm256_dpbusd_avx_epi32(d0, w[k], rpx_bcast4(xt + 4 * k));
                    d1 = _mm256_dpbusd_avx_epi32(d1, w[4 + k], rpx_bcast4(xt + 16 + 4 * k));
                }
                const __m256i v =
                    _mm256_add_epi32(_mm256_mullo_epi32(d0, S0), _mm256_mullo_epi32(d1, S1));
                isum[t] = J == 0 ? v : _mm256_add_epi32(isum[t], v);
            }
#else
            const __m256i dup0 = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12,
                                                  13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13,
                                                  12, 13);
            const __m256i dup1 = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15,
                                                  14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11,
                                                  14, 15, 14, 15);
            const __m256i S0 = _mm256_shuffle_epi8(P, dup0), S1 = _mm256_shuffle_epi8(P, dup1);
            for (int t = 0; t < T; t++) {
                const int8_t *xt = xq + (size_t)t * xs;
                __m256i p[4]; /* each at most 2 * 2 * 63 * 128 = 32256 */
                rpx_dot8_pairs(w, xt, p);
                const __m256i v = _mm256_add_epi32(
                    _mm256_add_epi32(_mm256_madd_epi16(p[0], S0), _mm256_madd_epi16(p[1], S0)),
                    _mm256_add_epi32(_mm256_madd_epi16(p[2], S1), _mm256_madd_epi16(p[3], S1)));
                isum[t] = J == 0 ? v : _mm256_add_epi32(isum[t], v);
            }
#endif
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q6K_D)));
        for (int t = 0; t < T; t++) {
            acc[t] = rpx_q6k_finish(acc[t], isum[t], pb, xb + (size_t)t * xs, dw);
        }
    }
}

/* A K-quant group function: group g x tokens [0, T) of a chunk into acc[t] (isum: scratch). */
typedef void (*kw_group_fn)(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, int T,
                            bool pf, __m256 *acc, __m256i *isum);

/* The token chunks (activations of KW_X_CHUNK_BYTES, kept in L2) x the groups of [r0, r1). */
KW_INLINE void
kw_gemm(kw_group_fn group, int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
        const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    const int64_t nb = n / SP_QK_K;
    __m256 acc[KW_MAX_TOK];
    __m256i isum[KW_MAX_TOK];
    const int64_t tc = rpx_chunk_tokens(KW_X_CHUNK_BYTES, xs, KW_MAX_TOK, 1);
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = t0 + tc < n_tok ? t0 + tc : n_tok;
        const uint8_t *xc = (const uint8_t *)x + (size_t)t0 * xs;
        for (int64_t g = g0; g < g1; g++) {
            group(nb, (const uint8_t *)w + (size_t)g * ws, xc, xs, (int)(t1 - t0), t0 == 0, acc,
                  isum);
            for (int64_t t = t0; t < t1; t++) {
                rpx_store_group(y + t * ldy, g, r0, r1, acc[t - t0]);
            }
        }
    }
}

void
KW_Q4K_FN(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
          int64_t n_tok, float *y, int64_t ldy)
{
    kw_gemm(kw_group_q4k, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

void
KW_Q5K_FN(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
          int64_t n_tok, float *y, int64_t ldy)
{
    kw_gemm(kw_group_q5k, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

void
KW_Q6K_FN(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
          int64_t n_tok, float *y, int64_t ldy)
{
    kw_gemm(kw_group_q6k, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}
