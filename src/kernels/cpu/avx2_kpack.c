/*
 * avx2_kpack.c - AVX2 gemm (prefill) and gemv (decode, one token) of Q6_K and Q5_K weights in
 * the packed forms of repack_impl.h: 8 rows interleaved per group, x Q8_K activations. Q6_K's
 * one-token calls read two groups' weight streams at once (avx2_repack_impl.h's rpx_gemv_two);
 * Q5_K's tile is compute-bound at one token, where a second stream gained nothing.
 *
 * The chunk rule of avx2_repack.c: one 32-byte load holds 8 quant bytes of 4 rows (row set
 * {0,1,4,5} or {2,3,6,7}); it meets the token's 8 matching activation bytes broadcast to the
 * four 64-bit lanes, VPMADDUBSW gives 4 int16 pair sums per row, the VPMADDWD that widens
 * them multiplies by the rows' sub-block scales, and one VPHADDD of the two row sets' sums at
 * the end of a super-block puts rows 0..7 in lanes 0..7, so the float finish is one vector
 * op for 8 rows.
 *
 * Q6_K: the values are repack_impl.h's "6+2" bytes, 0..63 = q + 32, unsigned: the
 * VPMADDUBSW operand as it is. Three loads give a row set's 32 values of a value group: 24 by
 * one AND each, the last 8 from the three top bit pairs (three shifts, three ANDs, two ORs).
 * Per 16-element sub-block two VPMADDUBSW add in int16 (at most 2 * 2 * 63 * 127 = 32004),
 * the widening VPMADDWD takes the signed 8-bit scale (|sc| <= 128), and the super-block's
 * sum_k sc[k] * sum(q + 32) y stays below 16 * 16 * 63 * 127 * 128 < 2^31. The offset is
 * taken off as 32 * sum_k sc[k] * bsums[k]: the scales of sub-blocks 2p, 2p + 1 of the 8 rows
 * are one 16-byte load (repack_impl.h's sc[p][r][e]), VPMOVSXBW, and VPMADDWD against the
 * token's (bsums[2p], bsums[2p+1]) leaves row r's part in int32 lane r. The packed scales
 * also serve the sub-block loop: one VPSHUFB spreads a pair's int16 scales to a row set's
 * lanes, with no 6-bit field decoding in the loop (Q6_K's scales are whole bytes).
 * Exact integers, then kquants_impl.h's finish lane-wise (d = y.d * x.d; blk = d * sumi;
 * sumf = sumf + blk): the reference's bits.
 *
 * Q5_K: Q4_K's tile (avx2_repack_impl.h's rpx_tile_k45, shared with avx2_repack.c) with qh's bit j
 * of a byte moved to bit 4 and ORed in; values 0..31, four VPMADDUBSW add in int16 to at most
 * 4 * 2 * 31 * 127 = 31496. The 6-bit scales and mins are unpacked at load (repack_impl.h), the
 * mins term is Q4_K's. Exact integers, then kquants2_impl.h's scale-and-min finish lane-wise: the
 * reference's bits.
 *
 * Multiplies and adds stay separate (no FMA contraction in C11 mode), so any number of tokens
 * per call gives the same bits (batch invariance). Pure functions, any thread, no heap.
 */
#include "kernels/cpu/avx2_repack_impl.h"

#define KP_INLINE RPX_INLINE

/* tokens per tile */
#define KP_TM 4
#define KP_QS_OFF offsetof(sp_block_q8_k, qs)

_Static_assert(KP_TM <= RPX_OUT_MAX, "the driver's out array holds a tile");

KP_INLINE const int8_t *
xq_of(const uint8_t *x, size_t xs, int t, int64_t b)
{
    return (const int8_t *)(x + (size_t)t * xs + (size_t)b * sizeof(sp_block_q8_k) + KP_QS_OFF);
}

/* VPSHUFB pattern: int16 i of a 128-bit lane (bytes 2i, 2i + 1) repeated in a 64-bit lane */
#define KP_W4(i) 2 * (i), 2 * (i) + 1, 2 * (i), 2 * (i) + 1, 2 * (i), 2 * (i) + 1, 2 * (i), 2 * (i) + 1

/* One super-block b of a Q6_K group (its packed bytes at pb) x T tokens, into acc[t]. */
KP_INLINE void
kp_block_q6k(int T, const uint8_t *pb, int64_t b, const uint8_t *x, size_t xs, __m256 *acc)
{
    const __m256i m3f = _mm256_set1_epi8(0x3f), m03 = _mm256_set1_epi8(0x03);
    const __m256i m0c = _mm256_set1_epi8(0x0c), m30 = _mm256_set1_epi8(0x30);
    /* sub-block pair register: int16 2 r + e (rows 0..3 in the low 128-bit lane, 4..7 in the
     * high one, each lane-relative r' = r % 4). Row set s keeps rows r' = 2s, 2s + 1. */
    const __m256i spread[2][2] = {
        {_mm256_setr_epi8(KP_W4(0), KP_W4(2), KP_W4(0), KP_W4(2)),
         _mm256_setr_epi8(KP_W4(1), KP_W4(3), KP_W4(1), KP_W4(3))},
        {_mm256_setr_epi8(KP_W4(4), KP_W4(6), KP_W4(4), KP_W4(6)),
         _mm256_setr_epi8(KP_W4(5), KP_W4(7), KP_W4(5), KP_W4(7))},
    };
    __m256i ai[KP_TM][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        ai[t][0] = ai[t][1] = _mm256_setzero_si256();
    }
    /* value group J: 32 elements, sub-blocks 2J and 2J + 1 */
#pragma GCC unroll 8
    for (int J = 0; J < 8; J++) {
        const __m256i P = _mm256_cvtepi8_epi16(
            _mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q6K_SC + 16 * J)));
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            const __m256i S0 = _mm256_shuffle_epi8(P, spread[s][0]);
            const __m256i S1 = _mm256_shuffle_epi8(P, spread[s][1]);
            /* the row set's three "6+2" vectors (repack_impl.h): elements 0-23 in their
             * low 6 bits, element 24 + i's bit pairs in the top bits of byte i of each.
             * The 16-bit shifts pull a neighbour byte's bits in above, which the AND
             * drops. */
            const uint8_t *qp = pb + SP_REPACK_Q6K_Q + 32 * s + 192 * J;
            const __m256i A = _mm256_loadu_si256((const __m256i *)qp);
            const __m256i B = _mm256_loadu_si256((const __m256i *)(qp + 64));
            const __m256i C = _mm256_loadu_si256((const __m256i *)(qp + 128));
            __m256i q[4];
            q[0] = _mm256_and_si256(A, m3f);
            q[1] = _mm256_and_si256(B, m3f);
            q[2] = _mm256_and_si256(C, m3f);
            q[3] = _mm256_or_si256(
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 6), m03),
                                _mm256_and_si256(_mm256_srli_epi16(B, 4), m0c)),
                _mm256_and_si256(_mm256_srli_epi16(C, 2), m30));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int8_t *xq = xq_of(x, xs, t, b) + 32 * J;
                const __m256i v0 = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], rpx_bcast8(xq)),
                                                    _mm256_maddubs_epi16(q[1], rpx_bcast8(xq + 8)));
                const __m256i v1 =
                    _mm256_add_epi16(_mm256_maddubs_epi16(q[2], rpx_bcast8(xq + 16)),
                                     _mm256_maddubs_epi16(q[3], rpx_bcast8(xq + 24)));
                ai[t][s] = _mm256_add_epi32(
                    ai[t][s], _mm256_add_epi32(_mm256_madd_epi16(v0, S0),
                                               _mm256_madd_epi16(v1, S1)));
            }
        }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q6K_D)));
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *xb = x + (size_t)t * xs + (size_t)b * sizeof(sp_block_q8_k);
        acc[t] = rpx_q6k_finish(acc[t], _mm256_hadd_epi32(ai[t][0], ai[t][1]), pb, xb, dw);
    }
}

/*
 * Q6_K: G groups gstep bytes apart (G = 2 only at one token: rpx_gemv_two) x T tokens over
 * all nb super-blocks, the groups' super-blocks interleaved; out[gi * T + t], lane r = row r.
 */
KP_INLINE void
kp_tile_q6k(int G, int T, int64_t nb, const uint8_t *g, size_t gstep, const uint8_t *x,
            size_t xs, __m256 *out)
{
    __m256 acc[KP_TM]; /* G * T <= KP_TM: two groups only at one token */
#pragma GCC unroll 4
    for (int t = 0; t < G * T; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++) {
            const uint8_t *pb = g + (size_t)gi * gstep + (size_t)b * SP_REPACK_Q6K_BLOCK_BYTES;
            rpx_prefetch(pb + RPX_PF_DIST * SP_REPACK_Q6K_BLOCK_BYTES, SP_REPACK_Q6K_BLOCK_BYTES);
            kp_block_q6k(T, pb, b, x, xs, acc + gi * T);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < G * T; t++) {
        out[t] = acc[t];
    }
}

/* Q8_K activations carry their scale and block sums: no scratch */
/* Q5_K: avx2_repack_impl.h's Q4_K-form tile with the qh bit */
KP_INLINE void
kp_tile_q5k(int T, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, __m256 *out)
{
    rpx_tile_k45(true, false, 1, T, nb, g, 0, x, xs, out);
}

RPX_TILE_FN(q6k_tile_1, kp_tile_q6k(1, 1, nb, g, 0, x, xs, out))
RPX_TILE_FN(q6k_tile_2, kp_tile_q6k(1, 2, nb, g, 0, x, xs, out))
RPX_TILE_FN(q5k_tile_1, kp_tile_q5k(1, nb, g, x, xs, out))
RPX_TILE_FN(q5k_tile_2, kp_tile_q5k(2, nb, g, x, xs, out))
RPX_TILE_FN(q5k_tile_3, kp_tile_q5k(3, nb, g, x, xs, out))
RPX_TILE_FN(q5k_tile_4, kp_tile_q5k(4, nb, g, x, xs, out))

/* One token over two groups' weight streams at once (rpx_gemv_two) */
RPX_TWO_FN(q6k_two, kp_tile_q6k(2, 1, nb, g, gstep, x, xs, out))

/* Q6_K's tiles take 1 or 2 tokens: from 3 the tables hand Q6_K to the wide gemm (below) */
static const rpx_tile_fn q6k_tiles[KP_TM + 1] = {NULL, q6k_tile_1, q6k_tile_2, NULL, NULL};
static const rpx_tile_fn q5k_tiles[KP_TM + 1] = {NULL, q5k_tile_1, q5k_tile_2, q5k_tile_3,
                                                 q5k_tile_4};

/* avx2_repack_impl.h's driver: no scratch, chunks of the activation budget */
static void
kp_gemm(const rpx_tile_fn *tiles, int tm, rpx_two_fn two, int64_t n, const void *w, size_t ws,
        int64_t r0, int64_t r1, const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    const rpx_plan_t plan = {
        .tiles = tiles,
        .two = two,
        .tm = tm,
        .tc = rpx_chunk_tokens(RPX_X_CHUNK_BYTES, xs, 0, tm),
        .nb = n / SP_QK_K,
    };
    rpx_gemm(&plan, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

void
sp__kpack_q6_k_gemm_few_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                             const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    kp_gemm(q6k_tiles, 2, q6k_two, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

/* Q6_K: 3 tokens and up in avx2_kwide.c's loop order (the same bits; the count: avx2_repack.c's
 * Q8_0 entry) */
RPX_BY_TOKENS(q6_k_gemm, sp__repack_q6_k_gemm_wide_avx2, sp__kpack_q6_k_gemm_few_avx2, 3)

void
sp__kpack_q5_k_gemm_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                         const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    kp_gemm(q5k_tiles, KP_TM, NULL, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

/* Q5_K: the same from 5 tokens (avx2_kwide.c, Q4_K's form with the fifth bit) */
RPX_BY_TOKENS(q5_k_gemm, sp__repack_q5_k_gemm_wide_avx2, sp__kpack_q5_k_gemm_avx2, 5)

void
sp__kpack_register_avx2(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_Q6_K] = q6_k_gemm;
    k->repack_gemm[SP_TYPE_Q5_K] = q5_k_gemm;
}
