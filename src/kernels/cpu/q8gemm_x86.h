/*
 * q8gemm_x86.h - the x86 prefill gemm of packed Q8_0 weights (8-row groups, repack_impl.h)
 * against Q8_0 activations, for calls with many tokens: the body avx2_q8gemm.c (AVX2) and
 * avxvnni_q8gemm.c (AVX2 + AVX-VNNI) compile with their own ISA flags. The including file
 * defines QW_FN, the function's name, and QW_VNNI, 1 where VPDPBUSD is there; avx2_q4gemm.c and
 * avxvnni_q4gemm.c also QW_Q4 1, the same loop order over packed Q4_0 weights (qw_q4_weights;
 * without VNNI a block's eight VPMADDUBSW add in int16, see qw_block_sum). avx2_kwide.c has
 * the loop order for Q4_K.
 *
 * avx2_repack.c's tile keeps each block's weights in their packed order (a 32-byte chunk
 * holds 8 bytes of 4 rows) and runs 4 tokens over all blocks. Three costs remain per block
 * and token there: a VPHADDD that folds each row's two int32 halves, the spills of 16 weight
 * registers (quants and their absolute values) next to the tile's accumulators, and the
 * weight loads and VPSIGNB of |w|, shared by only 4 tokens. Here the loop order is turned
 * round: for each block of a group, the weights are rearranged once into eight registers
 * of 8 rows x 4 bytes (VSHUFPS of a chunk pair: 32-bit lane r = row r), their absolute
 * values taken once (AVX2), and then every token of the chunk (up to QW_MAX_TOK) runs
 * against them. A token's 4 activation bytes are broadcast to all lanes, so after
 * VPMADDUBSW and VPMADDWD (or one VPDPBUSD) lane r holds row r's partial sum: the block sum
 * of the 8 rows is 7 adds, no horizontal step. The float accumulators of the chunk's tokens
 * (8 rows each) live in a small stack array (QW_MAX_TOK x 32 bytes, in L1).
 *
 * With VNNI, Q8_0 needs no sign step at all (QW_UQ): VPDPBUSD multiplies unsigned by signed
 * bytes into int32 lanes without a 16-bit step, so the chunk's quants are copied once made
 * unsigned (x + 128, qw_unsigned_quants) and run against the signed weights as they are;
 * 128 times each row's weight sum, taken once per block of a group, comes off. That drops
 * the VPSIGNB of every token and block and the eight |w| registers (the sign form spilled
 * them), and two chains of VPDPBUSD hide its latency: 1.3x the sign form on an AMD Zen 5.
 *
 * Numerics: the scalar reference's (ref.c's Q8_0 vec_dot), lane r being row r: isum is the
 * exact block sum. AVX2, sign trick: |w| <= 128 as unsigned, x carrying w's sign, |x| <= 127
 * from the activation quantiser, a VPMADDUBSW pair sum at most 2 * 128 * 127 = 32512,
 * widened by VPMADDWD before any add. VNNI: sum((x + 128) w) - 128 sum(w) over int32 lanes,
 * at most 32 * 255 * 128 before the offset, for any int8 x and w. So both give the same
 * integer; then d = w.d * x.d (exact: two F16 significands) and sum = sum + (float)isum * d
 * per block in order, multiplies and adds kept apart (no FMA contraction of intrinsics in C11
 * mode). The same bits as avx2_repack.c's tiles and the reference for any number of tokens
 * per call (batch invariance), in either form.
 *
 * The AVX2 Q8_0 form takes the row groups two at a time (qw_pair, register tiles of 2 groups
 * x 3 tokens sharing each broadcast and weight load), the last odd group through qw_group.
 *
 * Pure function, any thread, no heap; about 39 KiB of stack (activation scales of a chunk
 * and the accumulators), 162 KiB for the VNNI Q8_0 form (the unsigned copy of a chunk).
 */
#if !defined(QW_FN) || !defined(QW_VNNI)
#error "define QW_FN and QW_VNNI before including q8gemm_x86.h"
#endif
#ifndef QW_Q4
#define QW_Q4 0 /* 1: packed Q4_0 weights, see qw_q4_weights */
#endif

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/avx2_repack_impl.h"

#define QW_INLINE static inline __attribute__((always_inline))

#define QW_MAX_TOK 64                 /* tokens of a chunk: the accumulators' rows */
#define QW_SCRATCH 8192               /* activation scales (and Q4_0 sums) of a chunk */
#define QW_X_CHUNK_BYTES (128 * 1024) /* a chunk's activations, kept in L2 while groups sweep */

_Static_assert(QW_SCRATCH >= SP_REPACK_MAX_N / 32, "one token's scales fit the scratch");
_Static_assert(SP_REPACK_ROWS == 8, "a group is one register of 8 float lanes");

#if QW_Q4
/*
 * Q4_0: a packed block (repack_impl.h) is the 8 rows' F16 scales, then 4 chunks of 32 bytes:
 * chunk 2j holds bytes 8j..8j+7 of rows {0,1,4,5}, chunk 2j+1 of rows {2,3,6,7}; byte i of a
 * row holds element i in its low nibble and element i + 16 in its high one. The same VSHUFPS
 * as for Q8_0 gives bytes 4m..4m+3 of rows 0..7 in lane order; their low nibbles are elements
 * 4m..4m+3 and their high nibbles 16 + 4m..: w[k] holds elements 4k..4k+3 of every row,
 * unsigned 0..15, the unsigned side (VPDPBUSD, VPMADDUBSW) against the token's int8 quants.
 * The block sum is sum(nibble * x) - 8 * sum(x) (xsum: the reference's -8 offset), exact.
 */
QW_INLINE void
qw_q4_weights(const uint8_t *pb, __m256i w[8])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) {
        __m256i lo, hi;
        rpx_rows8_at(pb + 16 + 64 * j, &lo, &hi);
        w[2 * j] = _mm256_and_si256(lo, m4);                               /* 8j .. 8j + 3 */
        w[2 * j + 1] = _mm256_and_si256(hi, m4);                           /* 8j + 4 .. */
        w[4 + 2 * j] = _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);     /* 16 + 8j .. */
        w[4 + 2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4); /* 20 + 8j .. */
    }
}
#define QW_BLOCK_BYTES SP_REPACK_BLOCK_BYTES
#else
#define QW_BLOCK_BYTES SP_REPACK_Q8_0_BLOCK_BYTES
#endif

/* The VNNI form of Q8_0 reads a copy of the chunk's quants made unsigned (QW_UQ: 32 bytes a
 * block, no scale); the others read the Q8_0 rows themselves. */
#define QW_UQ (QW_VNNI && !QW_Q4)
#if QW_UQ
#define QW_XB_BYTES 32
#define QW_XB_QS 0
_Static_assert(QW_X_CHUNK_BYTES >= SP_REPACK_MAX_N, "one token's quants fit the copy");

/* The quants of T tokens (x, xs bytes apart) as unsigned bytes, x ^ 0x80 = x + 128 for any
 * int8 x, dense: token t's block b at xu + (t * nb + b) * 32. */
static void
qw_unsigned_quants(const uint8_t *x, size_t xs, int64_t T, int64_t nb, uint8_t *xu)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int64_t t = 0; t < T; t++) {
        const sp_block_q8_0 *xb = (const sp_block_q8_0 *)(x + (size_t)t * xs);
        for (int64_t b = 0; b < nb; b++, xu += 32) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)xb[b].qs);
            _mm256_store_si256((__m256i *)xu, _mm256_xor_si256(q, bias));
        }
    }
}
#else
#define QW_XB_BYTES sizeof(sp_block_q8_0)
#define QW_XB_QS offsetof(sp_block_q8_0, qs)
#endif

/* The AVX2 Q8_0 form runs two groups at a time in register tiles of 3 tokens (qw_pair). */
#define QW_TILE (!QW_VNNI && !QW_Q4)
#define QW_TILE_TOK 3

#if !QW_Q4
/* A packed Q8_0 block's weights (at pb) as 8 registers, w[k] = bytes 4k..4k + 3 of rows 0..7
 * in lane order: chunk 2j holds bytes 8j..8j+7 of rows {0,1,4,5}, chunk 2j+1 the same bytes
 * of rows {2,3,6,7}. */
QW_INLINE void
qw_q8_weights(const uint8_t *pb, __m256i w[8])
{
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        rpx_rows8_at(pb + 16 + 64 * j, &w[2 * j], &w[2 * j + 1]);
    }
}
#endif

#if !QW_Q4 && !QW_UQ
/* |w| of the 8 weight registers, the sign trick's unsigned operand (-128 reads as 128). */
QW_INLINE void
qw_abs8(const __m256i w[8], __m256i aw[8])
{
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        aw[k] = _mm256_sign_epi8(w[k], w[k]);
    }
}
#endif

/* The reference's float step of one block for 8 rows: d = w.d * x.d (exact), then
 * acc = acc + (float)isum * d, multiplies and adds kept apart. */
QW_INLINE void
qw_float_step(float *acc, __m256 dw, float xd, __m256i isum)
{
    const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xd));
    _mm256_store_ps(acc, _mm256_add_ps(_mm256_load_ps(acc),
                                       _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d)));
}

/* One block's 8 x 32 weights (lane r = row r) against token t's quants at xq: the exact
 * integer block sums of the 8 rows. aw: |w| for the AVX2 Q8_0 form, aw[0] = 128 * each row's
 * weight sum for the VNNI one (qw_group), unused for Q4_0. */
QW_INLINE __m256i
qw_block_sum(const __m256i w[8], const __m256i aw[8], const uint8_t *xq, int32_t xsum)
{
    __m256i s = _mm256_setzero_si256();
#if QW_Q4
    (void)aw;
#if QW_VNNI
    s = rpx_dot8_vnni(s, w, xq);
#else
    /* nibble x quant pair sums are at most 2 * 15 * 127 = 3810: the block's eight add in
     * int16 (at most 30480) and one VPMADDWD widens them */
    __m256i p[4];
    rpx_dot8_pairs(w, xq, p);
    s = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]),
                                           _mm256_add_epi16(p[2], p[3])),
                          _mm256_set1_epi16(1));
#endif
    return _mm256_sub_epi32(s, _mm256_set1_epi32(xsum));
#elif QW_UQ
    /* xq: the token's quants made unsigned (qw_unsigned_quants), against the signed weights:
     * no sign step and no |w|. aw[0] holds 128 * each row's sum of the block's weights, the
     * offset those quants carry (qw_group). Two chains of four: VPDPBUSD's latency is four
     * or five cycles, and the int32 sums are exact in any order. */
    (void)xsum;
    __m256i s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
        s = _mm256_dpbusd_avx_epi32(s, rpx_bcast4(xq + 4 * k), w[k]);
        s1 = _mm256_dpbusd_avx_epi32(s1, rpx_bcast4(xq + 4 * k + 4), w[k + 1]);
    }
    return _mm256_sub_epi32(_mm256_add_epi32(s, s1), aw[0]);
#else
    (void)xsum;
    const __m256i ones16 = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i sx = _mm256_sign_epi8(rpx_bcast4(xq + 4 * k), w[k]);
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[k], sx), ones16));
    }
    return s;
#endif
}

/*
 * One group (8 rows, g) x tokens [0, T) of a chunk (x, xs bytes apart) over all nb blocks.
 * xd[t * nb + b]: token t's block b scale, xsum[t * nb + b] 8 times its quants' sum (Q4_0
 * only). acc[t]: the 8 rows' sums of token t. pf: the group's first pass (its weights come
 * from memory; later chunks find them in L2), which prefetches SP_PF_ONE_TOKEN ahead as the
 * few-token tiles do (avx2_repack.c): 8-16 tokens over weights streaming from memory ran
 * 1.00-1.12x with it on an AMD Zen 3 (bench/kernel_ab).
 */
static void
qw_group(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs, int T, const float *xd,
         const int32_t *xsum, bool pf, float (*acc)[SP_REPACK_ROWS])
{
    for (int t = 0; t < T; t++) {
        _mm256_store_ps(acc[t], _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * QW_BLOCK_BYTES;
        if (pf) {
            rpx_prefetch(pb + SP_PF_ONE_TOKEN, QW_BLOCK_BYTES);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
        __m256i w[8], aw[8];
#if QW_Q4
        qw_q4_weights(pb, w);
#else
        qw_q8_weights(pb, w);
#if QW_UQ
        /* 128 * sum(w) per row lane, the offset of the unsigned quants (qw_block_sum) */
        __m256i ws = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            ws = _mm256_dpbusd_avx_epi32(ws, _mm256_set1_epi8(1), w[k]);
        }
        aw[0] = _mm256_slli_epi32(ws, 7);
#else
        qw_abs8(w, aw);
#endif
#endif
        const uint8_t *xb = x + (size_t)b * QW_XB_BYTES + QW_XB_QS;
        for (int t = 0; t < T; t++) {
            const int32_t off = QW_Q4 ? xsum[t * nb + b] : 0;
            const __m256i s = qw_block_sum(w, aw, xb + (size_t)t * xs, off);
            qw_float_step(acc[t], dw, xd[t * nb + b], s);
        }
    }
}

#if QW_TILE
/*
 * The AVX2 Q8_0 form over two groups at once (QW_TILE). qw_group's one-token step keeps 16
 * weight registers (w and |w|) and issues a broadcast per group; here a block's weights of
 * both groups are rearranged once into an L1 scratch (w, |w|) and register tiles of 2 groups
 * x NT (<= 3) tokens run the same sign-trick step, each broadcast serving both groups and each
 * weight load NT tokens: 6 sums, 4 weights, a broadcast and two products in registers. On
 * an AMD Zen 5 core VPMADDUBSW, VPMADDWD and VMULPS share two pipes, so 18 of a token-block's
 * operations (and VPSIGNB's 8 beside them) bound any exact form at 9 cycles per 256
 * multiply-adds; the tile runs at about 11.4, qw_group's loop at 12.3 (docs/design.md, "The
 * AVX2 Q8_0 gemm in tiles of two groups"). s[g][t]: the exact int32 block sums of group g's
 * 8 rows for token t, the same integers as qw_block_sum's.
 */
QW_INLINE void
qw_tile_sums(const __m256i (*wq)[8], const __m256i (*aq)[8], const uint8_t *xq, size_t xs, int NT,
             __m256i s[2][QW_TILE_TOK])
{
    const __m256i ones16 = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        s[0][t] = s[1][t] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i w0 = _mm256_load_si256(&wq[0][k]), w1 = _mm256_load_si256(&wq[1][k]);
        const __m256i a0 = _mm256_load_si256(&aq[0][k]), a1 = _mm256_load_si256(&aq[1][k]);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const __m256i xb = rpx_bcast4(xq + (size_t)t * xs + 4 * k);
            s[0][t] = _mm256_add_epi32(
                s[0][t], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0)),
                                           ones16));
            s[1][t] = _mm256_add_epi32(
                s[1][t], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1)),
                                           ones16));
            /* opaque: else GCC regroups the adds and keeps all 48 products live (spilled) */
            __asm__("" : "+x"(s[0][t]), "+x"(s[1][t]));
        }
    }
}

/* NT tokens from t of a block: the tile's sums, then the reference's float step per group. */
QW_INLINE void
qw_tile_run(const __m256i (*wq)[8], const __m256i (*aq)[8], const __m256 dw[2], const uint8_t *xb,
            size_t xs, int64_t t, int NT, const float *xd, int64_t nb, int64_t b,
            float (*acc)[2 * SP_REPACK_ROWS])
{
    __m256i s[2][QW_TILE_TOK];
    qw_tile_sums(wq, aq, xb + (size_t)t * xs, xs, NT, s);
#pragma GCC unroll 4
    for (int i = 0; i < NT; i++) {
        qw_float_step(acc[t + i], dw[0], xd[(t + i) * nb + b], s[0][i]);
        qw_float_step(acc[t + i] + 8, dw[1], xd[(t + i) * nb + b], s[1][i]);
    }
}

/* Two groups (the one at g and the next, gs bytes on) x tokens [0, T) of a chunk, as qw_group. */
static void
qw_pair(int64_t nb, const uint8_t *g, size_t gs, const uint8_t *x, size_t xs, int T,
        const float *xd, bool pf, float (*acc)[2 * SP_REPACK_ROWS])
{
    _Alignas(32) __m256i wq[2][8], aq[2][8];
    for (int t = 0; t < T; t++) {
        _mm256_store_ps(acc[t], _mm256_setzero_ps());
        _mm256_store_ps(acc[t] + 8, _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; b++) {
        __m256 dw[2];
#pragma GCC unroll 2
        for (int gi = 0; gi < 2; gi++) {
            const uint8_t *pb = g + (size_t)gi * gs + (size_t)b * QW_BLOCK_BYTES;
            if (pf) {
                rpx_prefetch(pb + SP_PF_ONE_TOKEN, QW_BLOCK_BYTES);
            }
            dw[gi] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
            qw_q8_weights(pb, wq[gi]);
            qw_abs8(wq[gi], aq[gi]);
        }
        /* the tiles read the scratch back from L1: kept out of registers (32 of them) */
        __asm__ volatile("" ::: "memory");
        const uint8_t *xb = x + (size_t)b * QW_XB_BYTES + QW_XB_QS;
        int64_t t = 0;
        for (; t + QW_TILE_TOK <= T; t += QW_TILE_TOK) {
            qw_tile_run(wq, aq, dw, xb, xs, t, QW_TILE_TOK, xd, nb, b, acc);
        }
        if (T - t == 2) {
            qw_tile_run(wq, aq, dw, xb, xs, t, 2, xd, nb, b, acc);
        } else if (T - t == 1) {
            qw_tile_run(wq, aq, dw, xb, xs, t, 1, xd, nb, b, acc);
        }
    }
}
#endif

void
QW_FN(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
      int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    const int64_t nb = n / 32;
    float xd[QW_SCRATCH];
    int32_t xsum[QW_Q4 ? QW_SCRATCH : 1];
    _Alignas(32) float acc[QW_MAX_TOK][SP_REPACK_ROWS];
#if QW_TILE
    _Alignas(32) float acc2[QW_MAX_TOK][2 * SP_REPACK_ROWS]; /* a pair of groups' sums */
#endif
#if QW_UQ
    _Alignas(32) uint8_t xu[QW_X_CHUNK_BYTES]; /* the chunk's unsigned quants */
#endif
    /* n <= SP_REPACK_MAX_N: one token's scales always fit */
    const int64_t cap = QW_SCRATCH / nb < QW_MAX_TOK ? QW_SCRATCH / nb : QW_MAX_TOK;
    const int64_t tc = rpx_chunk_tokens(QW_X_CHUNK_BYTES, xs, cap, 1);
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = t0 + tc < n_tok ? t0 + tc : n_tok;
        const uint8_t *xc = (const uint8_t *)x + (size_t)t0 * xs;
        rpx_fill_q8_scratch(xc, xs, t1 - t0, nb, QW_Q4 ? xsum : NULL, xd);
        size_t xcs = xs;
#if QW_UQ
        qw_unsigned_quants(xc, xs, t1 - t0, nb, xu);
        xc = xu;
        xcs = (size_t)nb * 32;
#endif
        int64_t g = g0;
#if QW_TILE
        for (; g + 2 <= g1; g += 2) {
            qw_pair(nb, (const uint8_t *)w + (size_t)g * ws, ws, xc, xcs, (int)(t1 - t0), xd,
                    t0 == 0, acc2);
            for (int64_t t = t0; t < t1; t++) {
                rpx_store_group(y + t * ldy, g, r0, r1, _mm256_load_ps(acc2[t - t0]));
                rpx_store_group(y + t * ldy, g + 1, r0, r1, _mm256_load_ps(acc2[t - t0] + 8));
            }
        }
#endif
        for (; g < g1; g++) {
            qw_group(nb, (const uint8_t *)w + (size_t)g * ws, xc, xcs, (int)(t1 - t0), xd, xsum,
                     t0 == 0, acc);
            for (int64_t t = t0; t < t1; t++) {
                rpx_store_group(y + t * ldy, g, r0, r1, _mm256_load_ps(acc[t - t0]));
            }
        }
    }
}
