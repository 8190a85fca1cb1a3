/*
 * avx2_repack.c - AVX2 gemm (prefill) and gemv (decode, one token) of Q4_0, IQ4_NL, Q8_0
 * and Q4_K weights in the packed forms of kernels.h / repack_impl.h: 8 rows interleaved per
 * group.
 *
 * One 32-byte load holds 8 quant bytes of 4 rows; it meets the same 8 activation bytes
 * broadcast to its four 64-bit lanes, so VPMADDUBSW + VPMADDWD give 2 int32 per row, and
 * one VPHADDD of the chunks of rows {0,1,4,5} and {2,3,6,7} leaves the exact block sum of
 * rows 0..7 in lanes 0..7. The float work of a block (scale, convert, add) is then one
 * vector op for 8 rows, where the row kernels spend one per row and block: that, and
 * one contiguous weight stream per group, is what the layout buys.
 *
 * Numerics: the scalar reference's, lane r being row r. Q4_0: d = w.d * x.d (exact),
 * sum = sum + (float)isum * d per block in order (ref.c). IQ4_NL: q32_impl.h's eight
 * partial sums acc[b % 8] and its final tree, lane-wise. Multiplies and adds stay separate
 * (C11 mode compiles intrinsics without FMA contraction), so the results are the
 * reference's bits for any number of tokens per call (batch invariance).
 *
 * Integer ranges: Q4_0 keeps the nibble unsigned (0..15) and subtracts 8 * sum(x) per
 * block (computed once per token and block); four VPMADDUBSW pair sums add in int16 to at
 * most 4 * 2 * 15 * 127 = 15240. IQ4_NL's grid is signed, so it goes through the sign
 * trick (|w| against x carrying w's sign, |w| <= 127, |x| <= 127: a pair sum is at most
 * 32258) and each VPMADDUBSW is widened by VPMADDWD before the adds.
 *
 * Q8_0: the weight bytes are signed (-128 included), so the sign trick again (|w| <= 128
 * as unsigned, x carrying w's sign, |x| <= 127 from the activation quantiser: a pair sum
 * is at most 2 * 128 * 127 = 32512), each VPMADDUBSW widened by VPMADDWD. Numerics as Q4_0's
 * (ref.c's serial block sum), so the results are the reference's bits. Calls of more tokens
 * (from a count per type, RPX_BY_TOKENS below) go to the wide gemms instead (the same bits,
 * faster): avx2_q8gemm.c (Q8_0), avx2_q4gemm.c (Q4_0), avx2_kwide.c (Q4_K; avx2_kpack.c's Q5_K
 * and Q6_K too).
 *
 * Q4_K x Q8_K: per sub-block j (32 elements) the four VPMADDUBSW of a row set add in int16
 * (at most 4 * 2 * 15 * 127 = 15240), and the VPMADDWD that widens them multiplies by the
 * rows' 6-bit sub-block scales at the same time (at most 2 * 15240 * 63 per lane), so the
 * scaled sum sum_j sc[j] dot_j accumulates in int32 over the super-block and one VPHADDD at
 * its end puts rows 0..7 in lanes 0..7. The mins term sum_j m[j] (bsums[2j] + bsums[2j+1])
 * is four VPMADDWD of the rows' mins against the token's pair sums. Both are exact integer
 * sums, and the float finish is kquants_impl.h's sequence lane-wise: the reference's bits.
 *
 * IQ4_XS x Q8_K: per sub-block the grid lookup (VPSHUFB) and the sign trick as IQ4_NL's, and
 * the VPMADDWD that widens each VPMADDUBSW (pair sums <= 32258) multiplies by the rows' signed
 * sub-block scale (ls - 32, |.| <= 32): <= 2.07e6 per lane and step, the super-block's sum
 * sum_j (ls_j - 32) dot_j exact in int32 (<= 256 * 127 * 127 * 32). Float finish lane-wise as
 * ref_kquants2.c's: d = y.d * x.d; blk = d * sumi; sumf = sumf + blk.
 *
 * Token tiles: Q4_0, Q8_0 and Q4_K run 4 tokens per weight pass. IQ4_NL and IQ4_XS, whose
 * decode is a table lookup per 8-element slice, run up to 8 (RP_XS_TM) in a loop order that
 * decodes one slice of one row set and then runs every token against it, so only the tokens'
 * int32 sums, the slice (w, |w|) and the scale are live: no spills in the hot loop. One token
 * keeps the 4-token tile's code (the decode path); Q4_0, IQ4_NL, Q8_0 and Q4_K run it over two
 * groups at once (rpx_gemv_two: two weight streams from memory instead of one, 1.1-1.3x).
 * docs/design.md has the measurements.
 *
 * Pure functions, any thread, no heap; up to 64 KiB of stack for the per-token scratch
 * (8 * sum(x) and x's scale per block of the tokens in flight).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/avx2_repack_impl.h"
#include "kernels/cpu/q32_impl.h"

#define RP_INLINE RPX_INLINE

/* tokens per tile, and the scratch entries (token x block) of one token chunk */
#define RP_TM 4
/* IQ4_XS's wide tile (rp_tile_iq4xs_wide): tokens per tile */
#define RP_XS_TM 8
#define RP_SCRATCH 8192

_Static_assert(RP_SCRATCH >= RP_TM * (SP_REPACK_MAX_N / 32), "a tile's tokens fit the scratch");
_Static_assert(RP_XS_TM >= RP_TM && RP_XS_TM <= RPX_OUT_MAX, "the driver's out array holds a tile");

enum { RP_Q4_0, RP_IQ4_NL, RP_Q8_0, RP_Q4_K, RP_IQ4_XS };

/* One block b of a group (its packed bytes at pb) x T tokens, into acc[t] (token t's lanes).
 * xsum[t * nb + b] = 8 * sum of token t's block b quants (Q4_0 only), xd[t * nb + b] = its
 * scale. */
RP_INLINE void
rp_block(int kind, int T, const uint8_t *pb, int64_t b, int64_t nb, const uint8_t *x, size_t xs,
         const int32_t *xsum, const float *xd, __m256 acc[][SP_Q32_LANES])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m128i grid = _mm_loadu_si128((const __m128i *)sp__kvalues_iq4nl);
    const __m256i lut = _mm256_set_m128i(grid, grid);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
    if (kind == RP_Q8_0) {
        /* chunk c: bytes 8 (c / 2) .. + 7 of rows {0,1,4,5} (c even) or {2,3,6,7} */
        __m256i wq[8], aw[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            wq[c] = _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * c));
            aw[c] = _mm256_sign_epi8(wq[c], wq[c]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const int8_t *xq = (const int8_t *)(x + (size_t)t * xs + (size_t)b * 34 + 2);
            __m256i p[2];
#pragma GCC unroll 8
            for (int s = 0; s < 2; s++) {
                __m256i v = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int k = 0; k < 4; k++) {
                    const int c = s + 2 * k;
                    const __m256i pr = _mm256_maddubs_epi16(
                        aw[c], _mm256_sign_epi8(rpx_bcast8(xq + 8 * k), wq[c]));
                    v = _mm256_add_epi32(v, _mm256_madd_epi16(pr, ones16));
                }
                p[s] = v;
            }
            const __m256i isum = _mm256_hadd_epi32(p[0], p[1]);
            const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + b]));
            acc[t][0] = _mm256_add_ps(acc[t][0], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d));
        }
        return;
    }
    /* q[c][0]: low nibbles of chunk c, q[c][1]: high nibbles. Chunk 0 / 2 hold rows
     * {0,1,4,5} bytes 0..7 / 8..15, chunk 1 / 3 rows {2,3,6,7}; a byte's low nibble is
     * element j, its high nibble element j + 16. */
    __m256i q[4][2];
#pragma GCC unroll 8
    for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * c));
        q[c][0] = _mm256_and_si256(raw, m4);
        q[c][1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if (kind == RP_IQ4_NL) {
            q[c][0] = _mm256_shuffle_epi8(lut, q[c][0]);
            q[c][1] = _mm256_shuffle_epi8(lut, q[c][1]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const int8_t *xq = (const int8_t *)(x + (size_t)t * xs + (size_t)b * 34 + 2);
        /* elements 0..7, 8..15, 16..23, 24..31 of the token, in every 64-bit lane */
        const __m256i X[4] = {rpx_bcast8(xq), rpx_bcast8(xq + 8), rpx_bcast8(xq + 16),
                              rpx_bcast8(xq + 24)};
        __m256i isum;
        if (kind == RP_Q4_0) {
            __m256i p[2];
#pragma GCC unroll 8
            for (int s = 0; s < 2; s++) { /* s = 0: rows {0,1,4,5}, 1: {2,3,6,7} */
                __m256i v = _mm256_maddubs_epi16(q[s][0], X[0]);
                v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[s + 2][0], X[1]));
                v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[s][1], X[2]));
                v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[s + 2][1], X[3]));
                p[s] = _mm256_madd_epi16(v, ones16);
            }
            isum = _mm256_sub_epi32(_mm256_hadd_epi32(p[0], p[1]),
                                    _mm256_set1_epi32(xsum[t * nb + b]));
        } else {
            __m256i p[2];
#pragma GCC unroll 8
            for (int s = 0; s < 2; s++) {
                const __m256i *w4[4] = {&q[s][0], &q[s + 2][0], &q[s][1], &q[s + 2][1]};
                __m256i v = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int k = 0; k < 4; k++) {
                    const __m256i w = *w4[k];
                    const __m256i pr =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(X[k], w));
                    v = _mm256_add_epi32(v, _mm256_madd_epi16(pr, ones16));
                }
                p[s] = v;
            }
            isum = _mm256_hadd_epi32(p[0], p[1]);
        }
        const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + b]));
        if (kind == RP_Q4_0) {
            acc[t][0] = _mm256_add_ps(acc[t][0], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d));
        } else {
            const int l = (int)(b % SP_Q32_LANES);
            acc[t][l] = _mm256_add_ps(acc[t][l], _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)));
        }
    }
}

/*
 * G groups (8 rows each, gstep bytes apart) x T tokens over all nb blocks, the groups' blocks
 * interleaved (G = 2 only at one token: rpx_gemv_two). Out: out[gi * T + t] holds group gi's
 * 8 rows' results for token t (lane r = row r).
 */
RP_INLINE void
rp_tile(int kind, int G, int T, bool pf, int64_t nb, const uint8_t *g, size_t gstep,
        const uint8_t *x, size_t xs, const int32_t *xsum, const float *xd, __m256 out[RP_TM])
{
    __m256 acc[RP_TM][SP_Q32_LANES];
#pragma GCC unroll 8
    for (int t = 0; t < G * T; t++) {
#pragma GCC unroll 8
        for (int l = 0; l < SP_Q32_LANES; l++) {
            acc[t][l] = _mm256_setzero_ps();
        }
    }
    const size_t pblk = kind == RP_Q8_0 ? SP_REPACK_Q8_0_BLOCK_BYTES : SP_REPACK_BLOCK_BYTES;
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++) { /* acc[gi * T + t]: group gi, token t */
            const uint8_t *pb = g + (size_t)gi * gstep + (size_t)b * pblk;
            if (pf) { /* the group's first pass: SP_PF_ONE_TOKEN ahead (repack_impl.h) */
                rpx_prefetch(pb + SP_PF_ONE_TOKEN, (int)pblk);
            }
            rp_block(kind, T, pb, b, nb, x, xs, xsum, xd, acc + gi * T);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < G * T; t++) {
        if (kind != RP_IQ4_NL) {
            out[t] = acc[t][0];
        } else { /* sp__q32_sum_lanes, lane-wise */
            const __m256 b0 = _mm256_add_ps(acc[t][0], acc[t][4]);
            const __m256 b1 = _mm256_add_ps(acc[t][1], acc[t][5]);
            const __m256 b2 = _mm256_add_ps(acc[t][2], acc[t][6]);
            const __m256 b3 = _mm256_add_ps(acc[t][3], acc[t][7]);
            out[t] = _mm256_add_ps(_mm256_add_ps(b0, b2), _mm256_add_ps(b1, b3));
        }
    }
}

/*
 * IQ4_XS: one group (8 rows) x T tokens over all nb super-blocks; x is Q8_K.
 * Its loop skeleton looks like rpx_tile_k45's but is left apart: the weights are signed grid
 * values (lookup and sign trick, each VPMADDUBSW widened on its own, not four int16 adds),
 * the scale is ls - 32, and there is no mins term.
 */
RP_INLINE void
rp_tile_iq4xs(int T, bool pf, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,
              __m256 out[RP_TM])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i bias = _mm256_set1_epi16(32);
    const __m128i grid = _mm_loadu_si128((const __m128i *)sp__kvalues_iq4nl);
    const __m256i lut = _mm256_set_m128i(grid, grid);
    __m256i spread[2];
    rpx_row_set_spread(spread);
    __m256 acc[RP_TM];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_IQ4XS_BLOCK_BYTES;
        if (pf) {
            rpx_prefetch(pb + SP_PF_ONE_TOKEN, SP_REPACK_IQ4XS_BLOCK_BYTES);
        }
        __m256i ai[RP_TM][2];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            ai[t][0] = ai[t][1] = _mm256_setzero_si256();
        }
        /* Unrolled: sub-blocks 2i and 2i + 1 are the low and high nibbles of the same bytes,
         * so the loads are shared and the shift is a constant (0 for the low ones). */
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            int64_t scj;
            memcpy(&scj, pb + SP_REPACK_IQ4XS_SC + 8 * j, sizeof scj);
            const __m256i scv = _mm256_set1_epi64x(scj);
            const uint8_t *qp = pb + SP_REPACK_IQ4XS_QS + 128 * j;
#pragma GCC unroll 2
            for (int s = 0; s < 2; s++) {
                const __m256i S = _mm256_sub_epi16(_mm256_shuffle_epi8(scv, spread[s]), bias);
                /* elements 0..7, 8..15 (low nibbles of bytes 0..7, 8..15), 16..23, 24..31 */
                const __m256i raw0 = _mm256_loadu_si256((const __m256i *)(qp + 32 * s));
                const __m256i raw1 = _mm256_loadu_si256((const __m256i *)(qp + 32 * (s + 2)));
                __m256i w[4], aw[4];
                w[0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw0, m4));
                w[1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw1, m4));
                w[2] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(raw0, 4), m4));
                w[3] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(raw1, 4), m4));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    aw[k] = _mm256_sign_epi8(w[k], w[k]);
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = (const int8_t *)(x + (size_t)t * xs +
                                                        (size_t)b * sizeof(sp_block_q8_k) + 4) +
                                       32 * j;
                    __m256i v = ai[t][s];
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        const __m256i pr = _mm256_maddubs_epi16(
                            aw[k], _mm256_sign_epi8(rpx_bcast8(xq + 8 * k), w[k]));
                        v = _mm256_add_epi32(v, _mm256_madd_epi16(pr, S));
                    }
                    ai[t][s] = v;
                }
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float yd;
            memcpy(&yd, x + (size_t)t * xs + (size_t)b * sizeof(sp_block_q8_k), sizeof yd);
            const __m256i sumi = _mm256_hadd_epi32(ai[t][0], ai[t][1]);
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(yd), dw);
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        out[t] = acc[t];
    }
}

/* The wide tiles' slice decode: elements 8k .. 8k + 7 (k = 0..3) of row set s's 32, from the
 * 128 bytes at qp (chunk s + 2 (k & 1), low nibbles for k < 2, high ones after): the signed
 * grid values w (VPSHUFB) and |w| (VPABSB). */
RP_INLINE __m256i
rp_iq4_slice(const uint8_t *qp, int s, int k, __m256i lut, __m256i m4, __m256i *aw)
{
    __m256i raw = _mm256_loadu_si256((const __m256i *)(qp + 32 * (s + 2 * (k & 1))));
    if (k >= 2) {
        raw = _mm256_srli_epi16(raw, 4);
    }
    const __m256i w = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m4));
    *aw = _mm256_abs_epi8(w);
    return w;
}

/* One token against a decoded slice: ai + VPMADDWD(VPMADDUBSW(|w|, x signed as w), S), S the
 * rows' sub-block scales (IQ4_XS) or ones (IQ4_NL). The empty asm keeps the sum a running
 * one: GCC otherwise reassociates it into a tree of 32 products per sub-block, which spill. */
RP_INLINE __m256i
rp_iq4_step(__m256i ai, __m256i aw, __m256i w, const int8_t *xq, __m256i S)
{
    const __m256i pr = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(rpx_bcast8(xq), w));
    ai = _mm256_add_epi32(ai, _mm256_madd_epi16(pr, S));
    __asm__("" : "+x"(ai));
    return ai;
}

/*
 * IQ4_XS, the wide tile of the batched product: one group (8 rows) x T <= RP_XS_TM tokens.
 * The loop order keeps the token work in registers: per row set s (rows {0,1,4,5} or
 * {2,3,6,7}), sub-block j and 8-element slice k, one grid lookup (VPSHUFB) and one VPABSB give
 * the slice's signed weights w and |w|, and then every token of the tile runs VPSIGNB +
 * VPMADDUBSW + VPMADDWD (by the rows' sub-block scale) + VPADDD into its own accumulator. So
 * the weights are decoded once per T tokens and only T int32 accumulators, w, |w| and the
 * scale are live (the 4-token tile kept 8 decoded slices and 8 accumulators, more than the 16
 * YMM registers, and spilled). Integer ranges and the float finish as rp_tile_iq4xs's: the
 * same exact sums, so the same bits for any T.
 */
RP_INLINE void
rp_tile_iq4xs_wide(int T, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,
                   __m256 out[RP_XS_TM])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i bias = _mm256_set1_epi16(32);
    const __m128i grid = _mm_loadu_si128((const __m128i *)sp__kvalues_iq4nl);
    const __m256i lut = _mm256_set_m128i(grid, grid);
    __m256i spread[2];
    rpx_row_set_spread(spread);
    const int8_t *xt[RP_XS_TM];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        out[t] = _mm256_setzero_ps();
        xt[t] = (const int8_t *)(x + (size_t)t * xs + offsetof(sp_block_q8_k, qs));
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_IQ4XS_BLOCK_BYTES;
        const size_t xb = (size_t)b * sizeof(sp_block_q8_k);
        __m256i half[RP_XS_TM]; /* row set 0's sums while row set 1 runs */
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            __m256i ai[RP_XS_TM];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                ai[t] = _mm256_setzero_si256();
            }
#pragma GCC unroll 1
            for (int j = 0; j < 8; j++) {
                int64_t scj;
                memcpy(&scj, pb + SP_REPACK_IQ4XS_SC + 8 * j, sizeof scj);
                const __m256i S =
                    _mm256_sub_epi16(_mm256_shuffle_epi8(_mm256_set1_epi64x(scj), spread[s]), bias);
                const uint8_t *qp = pb + SP_REPACK_IQ4XS_QS + 128 * j;
                /* k = 0..3: elements 8k .. 8k + 7 of the sub-block: the low nibbles of the row
                 * set's bytes 0..7 (chunk s) and 8..15 (chunk s + 2), then their high ones */
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    __m256i aw;
                    const __m256i w = rp_iq4_slice(qp, s, k, lut, m4, &aw);
#pragma GCC unroll 8
                    for (int t = 0; t < T; t++) {
                        ai[t] = rp_iq4_step(ai[t], aw, w, xt[t] + xb + 32 * j + 8 * k, S);
                    }
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                if (s == 0) {
                    half[t] = ai[t];
                } else {
                    half[t] = _mm256_hadd_epi32(half[t], ai[t]);
                }
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float yd;
            memcpy(&yd, x + (size_t)t * xs + xb, sizeof yd);
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(yd), dw);
            out[t] = _mm256_add_ps(out[t], _mm256_mul_ps(d, _mm256_cvtepi32_ps(half[t])));
        }
    }
}

/*
 * IQ4_NL, the wide tile of the batched product (its block loop looks like IQ4_XS's wide tile
 * but is left apart: 32-element blocks with no sub-block scales, and q32_impl.h's eight float
 * partial sums where IQ4_XS has one): one group x T <= RP_XS_TM tokens, the loop
 * order of rp_tile_iq4xs_wide (per row set and 8-element slice one lookup, then every token)
 * within each 32-element block. The int32 sums go through VPMADDWD by ones (pair sums
 * <= 32258, no int16 adds), and each token's eight partial sums acc[b % 8] (q32_impl.h's
 * order) live in memory: touched once per block and token, where the 4-token tile's 32
 * accumulator registers spilled anyway. Same sums, same float sequence: the same bits.
 */
RP_INLINE void
rp_tile_iq4nl_wide(int T, bool pf, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,
                   const float *xd, __m256 out[RP_XS_TM])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m128i grid = _mm_loadu_si128((const __m128i *)sp__kvalues_iq4nl);
    const __m256i lut = _mm256_set_m128i(grid, grid);
    __m256 acc[RP_XS_TM][SP_Q32_LANES];
    const int8_t *xt[RP_XS_TM];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        for (int l = 0; l < SP_Q32_LANES; l++) {
            acc[t][l] = _mm256_setzero_ps();
        }
        xt[t] = (const int8_t *)(x + (size_t)t * xs + 2);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_BLOCK_BYTES;
        if (pf) {
            rpx_prefetch(pb + SP_PF_ONE_TOKEN, SP_REPACK_BLOCK_BYTES);
        }
        const size_t xb = (size_t)b * 34;
        __m256i half[RP_XS_TM]; /* row set 0's sums while row set 1 runs */
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            __m256i ai[RP_XS_TM];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                ai[t] = _mm256_setzero_si256();
            }
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i aw;
                const __m256i w = rp_iq4_slice(pb + 2 * SP_REPACK_ROWS, s, k, lut, m4, &aw);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    ai[t] = rp_iq4_step(ai[t], aw, w, xt[t] + xb + 8 * k, ones16);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                half[t] = s == 0 ? ai[t] : _mm256_hadd_epi32(half[t], ai[t]);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
        const int l = (int)(b % SP_Q32_LANES);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + b]));
            acc[t][l] = _mm256_add_ps(acc[t][l], _mm256_mul_ps(d, _mm256_cvtepi32_ps(half[t])));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) { /* sp__q32_sum_lanes, lane-wise */
        const __m256 b0 = _mm256_add_ps(acc[t][0], acc[t][4]);
        const __m256 b1 = _mm256_add_ps(acc[t][1], acc[t][5]);
        const __m256 b2 = _mm256_add_ps(acc[t][2], acc[t][6]);
        const __m256 b3 = _mm256_add_ps(acc[t][3], acc[t][7]);
        out[t] = _mm256_add_ps(_mm256_add_ps(b0, b2), _mm256_add_ps(b1, b3));
    }
}

typedef rpx_tile_fn rp_tile_fn;

/* Every tile comes twice: name_T reads weights already in cache (a group's later token tiles
 * and chunks), name_pf_T prefetches them SP_PF_ONE_TOKEN ahead (the first pass over a group,
 * which streams them from memory: rpx_gemm picks it). */
#define RP_TILE_PAIR(name, T, call_plain, call_pf)                                             \
    RPX_TILE_FN(name##_##T, call_plain)                                                        \
    RPX_TILE_FN(name##_pf_##T, call_pf)

#define RP_TILE(name, kind, T)                                                                 \
    RP_TILE_PAIR(name, T, rp_tile(kind, 1, T, false, nb, g, 0, x, xs, xsum, xd, out),          \
                 rp_tile(kind, 1, T, true, nb, g, 0, x, xs, xsum, xd, out))
RP_TILE(q4_0_tile, RP_Q4_0, 1)
RP_TILE(q4_0_tile, RP_Q4_0, 2)
RP_TILE(q4_0_tile, RP_Q4_0, 3)
RP_TILE(q4_0_tile, RP_Q4_0, 4)
RP_TILE(iq4_nl_tile, RP_IQ4_NL, 1)
RP_TILE(q8_0_tile, RP_Q8_0, 1)
RP_TILE(q8_0_tile, RP_Q8_0, 2)
RP_TILE(q8_0_tile, RP_Q8_0, 3)
RP_TILE(q8_0_tile, RP_Q8_0, 4)

/* One token, two groups (rpx_gemv_two): always a group's first pass, so always prefetching */
RPX_TWO_FN(q4_0_two, rp_tile(RP_Q4_0, 2, 1, true, nb, g, gstep, x, xs, xsum, xd, out))
RPX_TWO_FN(iq4_nl_two, rp_tile(RP_IQ4_NL, 2, 1, true, nb, g, gstep, x, xs, xsum, xd, out))
RPX_TWO_FN(q8_0_two, rp_tile(RP_Q8_0, 2, 1, true, nb, g, gstep, x, xs, xsum, xd, out))
RPX_TWO_FN(q4_k_two, rpx_tile_k45(false, true, 2, 1, nb, g, gstep, x, xs, out))

/* Q4_K tiles: the Q8_K rows carry their own scale and block sums, no scratch */
#define RP_TILE_Q4K(T)                                                                         \
    RP_TILE_PAIR(q4_k_tile, T, rpx_tile_k45(false, false, 1, T, nb, g, 0, x, xs, out),         \
                 rpx_tile_k45(false, true, 1, T, nb, g, 0, x, xs, out))
RP_TILE_Q4K(1)
RP_TILE_Q4K(2)
RP_TILE_Q4K(3)
RP_TILE_Q4K(4)

#define RP_TILE_IQ4XS(T)                                                                       \
    RP_TILE_PAIR(iq4_xs_tile, T, rp_tile_iq4xs(T, false, nb, g, x, xs, out),                   \
                 rp_tile_iq4xs(T, true, nb, g, x, xs, out))
RP_TILE_IQ4XS(1)

/* IQ4_XS's wide tiles have no prefetching form: their lookups make 2-8 tokens compute-bound,
 * and a prefetch there measured 0.92-0.97x even on weights streaming from memory (kernel_ab) */
#define RP_TILE_IQ4XS_WIDE(T)                                                                  \
    RPX_TILE_FN(iq4_xs_wide_##T, rp_tile_iq4xs_wide(T, nb, g, x, xs, out))
RP_TILE_IQ4XS_WIDE(2)
RP_TILE_IQ4XS_WIDE(3)
RP_TILE_IQ4XS_WIDE(4)
RP_TILE_IQ4XS_WIDE(5)
RP_TILE_IQ4XS_WIDE(6)
RP_TILE_IQ4XS_WIDE(7)
RP_TILE_IQ4XS_WIDE(8)

#define RP_TILE_IQ4NL_WIDE(T)                                                                  \
    RP_TILE_PAIR(iq4_nl_wide, T, rp_tile_iq4nl_wide(T, false, nb, g, x, xs, xd, out),          \
                 rp_tile_iq4nl_wide(T, true, nb, g, x, xs, xd, out))
RP_TILE_IQ4NL_WIDE(2)
RP_TILE_IQ4NL_WIDE(3)
RP_TILE_IQ4NL_WIDE(4)
RP_TILE_IQ4NL_WIDE(5)
RP_TILE_IQ4NL_WIDE(6)
RP_TILE_IQ4NL_WIDE(7)
RP_TILE_IQ4NL_WIDE(8)

/* A type's tiles by token count: [0] in cache, [1] the prefetching first pass. */
typedef const rp_tile_fn rp_tiles_t[2][RP_XS_TM + 1];

static rp_tiles_t q4_0_tiles = {
    {NULL, q4_0_tile_1, q4_0_tile_2, q4_0_tile_3, q4_0_tile_4},
    {NULL, q4_0_tile_pf_1, q4_0_tile_pf_2, q4_0_tile_pf_3, q4_0_tile_pf_4}};
static rp_tiles_t q8_0_tiles = {
    {NULL, q8_0_tile_1, q8_0_tile_2, q8_0_tile_3, q8_0_tile_4},
    {NULL, q8_0_tile_pf_1, q8_0_tile_pf_2, q8_0_tile_pf_3, q8_0_tile_pf_4}};
static rp_tiles_t q4_k_tiles = {
    {NULL, q4_k_tile_1, q4_k_tile_2, q4_k_tile_3, q4_k_tile_4},
    {NULL, q4_k_tile_pf_1, q4_k_tile_pf_2, q4_k_tile_pf_3, q4_k_tile_pf_4}};
/* one token: the 4-token tile's code (the decode path's; its decoded slices fit the
 * registers at T = 1); two or more: the wide tile */
static rp_tiles_t iq4_xs_tiles = {
    {NULL, iq4_xs_tile_1, iq4_xs_wide_2, iq4_xs_wide_3, iq4_xs_wide_4, iq4_xs_wide_5,
     iq4_xs_wide_6, iq4_xs_wide_7, iq4_xs_wide_8},
    {NULL, iq4_xs_tile_pf_1, iq4_xs_wide_2, iq4_xs_wide_3, iq4_xs_wide_4, iq4_xs_wide_5,
     iq4_xs_wide_6, iq4_xs_wide_7, iq4_xs_wide_8}};
static rp_tiles_t iq4_nl_tiles = {
    {NULL, iq4_nl_tile_1, iq4_nl_wide_2, iq4_nl_wide_3, iq4_nl_wide_4, iq4_nl_wide_5,
     iq4_nl_wide_6, iq4_nl_wide_7, iq4_nl_wide_8},
    {NULL, iq4_nl_tile_pf_1, iq4_nl_wide_pf_2, iq4_nl_wide_pf_3, iq4_nl_wide_pf_4,
     iq4_nl_wide_pf_5, iq4_nl_wide_pf_6, iq4_nl_wide_pf_7, iq4_nl_wide_pf_8}};

/* The scratch of a token chunk of Q8_0 activations: x's scale per block, and 8 * sum(x) for
 * Q4_0's offset. */
static void
rp_fill(int kind, const uint8_t *x, size_t xs, int64_t n_tok, int64_t nb, int32_t *xsum,
        float *xd)
{
    rpx_fill_q8_scratch(x, xs, n_tok, nb, kind == RP_Q4_0 ? xsum : NULL, xd);
}

/* rpx_gemm with this file's tiles; the Q8_0-activation forms fill a per-chunk scratch. */
static void
rp_gemm(int kind, rp_tiles_t tiles, rpx_two_fn two, int tm, int64_t n, const void *w, size_t ws,
        int64_t r0, int64_t r1, const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    const bool super = kind == RP_Q4_K || kind == RP_IQ4_XS; /* Q8_K: no scratch */
    const int64_t nb = n / (super ? SP_QK_K : 32);
    int32_t xsum[RP_SCRATCH];
    float xd[RP_SCRATCH];
    if (!super && (int64_t)tm * nb > RP_SCRATCH) {
        tm = (int)(RP_SCRATCH / nb); /* >= RP_TM (the assert above): narrower tiles of long rows */
    }
    const rpx_plan_t plan = {
        .tiles = tiles[0],
        .tiles_pf = tiles[1],
        .two = two,
        .tm = tm,
        /* n <= SP_REPACK_MAX_N: tm fit */
        .tc = rpx_chunk_tokens(RPX_X_CHUNK_BYTES, xs, RP_SCRATCH / nb, tm),
        .nb = nb,
        .fill = super ? NULL : rp_fill,
        .kind = kind,
        .xsum = xsum,
        .xd = xd,
    };
    rpx_gemm(&plan, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

void
sp__repack_q4_0_gemm_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                          const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 > r0 && n_tok > 0) {
        rp_gemm(RP_Q4_0, q4_0_tiles, q4_0_two, RP_TM, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
    }
}

static void
iq4_nl_gemm(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
            size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 > r0 && n_tok > 0) {
        rp_gemm(RP_IQ4_NL, iq4_nl_tiles, iq4_nl_two, RP_XS_TM, n, w, ws, r0, r1, x, xs, n_tok, y,
                ldy);
    }
}

void
sp__repack_q8_0_gemm_few_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                              const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 > r0 && n_tok > 0) {
        rp_gemm(RP_Q8_0, q8_0_tiles, q8_0_two, RP_TM, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
    }
}

/*
 * Q8_0 and Q4_0 in q8gemm_x86.h's loop order from 8 and 5 tokens (the same bits either way).
 * Each wide entry's count, here and in avx2_kpack.c and avxvnni_q8gemm.c, is where the wide
 * form became the faster in decode steps of that many sequences (bench/batch_bench, weights
 * from memory, on an AMD Zen 5 at both AVX2 levels) and alone (qgemm_shape_bench): the tiles'
 * 4-token steps leave 5-7 tokens as a full and a part tile, the wide forms decode a block's
 * weights once for all of them; with 2-3 tokens and the weights streaming from memory the
 * tiles, which prefetch their rows, are faster. docs/design.md, "Where the wide gemms start".
 */
RPX_BY_TOKENS(q8_0_gemm, sp__repack_q8_0_gemm_wide_avx2, sp__repack_q8_0_gemm_few_avx2, 8)
RPX_BY_TOKENS(q4_0_gemm, sp__repack_q4_0_gemm_wide_avx2, sp__repack_q4_0_gemm_avx2, 5)

void
sp__repack_q4_k_gemm_few_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                              const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 > r0 && n_tok > 0) {
        rp_gemm(RP_Q4_K, q4_k_tiles, q4_k_two, RP_TM, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
    }
}

/* Q4_K: 6 tokens and up in avx2_kwide.c's loop order (the same bits; the count: above) */
RPX_BY_TOKENS(q4_k_gemm, sp__repack_q4_k_gemm_wide_avx2, sp__repack_q4_k_gemm_few_avx2, 6)

void
sp__repack_iq4_xs_gemm_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                            const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 > r0 && n_tok > 0) {
        rp_gemm(RP_IQ4_XS, iq4_xs_tiles, NULL, RP_XS_TM, n, w, ws, r0, r1, x, xs, n_tok, y,
                ldy);
    }
}

void
sp__repack_register_avx2(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_Q4_0] = q4_0_gemm;
    k->repack_gemm[SP_TYPE_IQ4_NL] = iq4_nl_gemm;
    k->repack_gemm[SP_TYPE_Q8_0] = q8_0_gemm;
    k->repack_gemm[SP_TYPE_Q4_K] = q4_k_gemm;
    k->repack_gemm[SP_TYPE_IQ4_XS] = sp__repack_iq4_xs_gemm_avx2;
}
