/*
 * avx2_q8gemm.c - the AVX2 prefill gemm of packed Q8_0 weights (8-row groups,
 * repack_impl.h) against Q8_0 activations, for calls with many tokens.
 *
 * The block sums are taken in int16 with VPMADDWD alone. Without VNNI the int8 form needs,
 * per 32 multiply-adds, a VPSIGNB (the sign trick), a VPMADDUBSW and a VPMADDWD (the
 * widening), and VPSIGNB shares the two multiply pipes of an AMD Zen 2/3; two VPMADDWD of
 * int16 pairs do the same 32 multiply-adds with nothing beside them but the adds.
 * bench/q8_ceiling.c measures both loops: on a Zen 3, 22.4 MACs per cycle for the int8 form
 * against 25.6 for this one (operands in L1); docs/design.md has the whole account.
 *
 * Loop order, per chunk of tokens (up to QW_MAX_TOK, their activations kept in L2) and piece
 * of up to QW_PIECE_GROUPS row groups (the piece's float sums for the chunk in L1):
 *   for each block b:
 *     the chunk's activations of block b widened to int16 pairs (xb), once for the piece;
 *     for each pair of groups: their weights of block b widened (ws, 1 KiB), then tiles of
 *     2 groups x 4 tokens: 16 pair steps of 2 loads, 2 broadcasts, 8 VPMADDWD and 8 VPADDD
 *     into 8 exact int32 block sums, then the reference's float step.
 * Lane r of every vector is row r of a group, so no horizontal step is needed. The tile's
 * pair loop is written in asm: it needs all 16 ymm registers (8 sums, 2 weight vectors, 2
 * broadcasts, 4 products), and GCC 12 allocating the same intrinsics adds register copies
 * and a spill that cost 8-12% (94 against 101-106 cycles per 2048 multiply-adds in L1).
 *
 * Pairing: a weight dword (4 bytes of one row) becomes two int16 pairs, bytes (0, 2) and
 * (1, 3), sign-extended by shifts (the even bytes: shift left 8 then arithmetic right 8; the
 * odd bytes: arithmetic right 8), and the activations are paired the same way, so each
 * VPMADDWD lane adds two products of the same row and token.
 *
 * Numerics: the scalar reference's (ref.c's Q8_0 vec_dot). isum is the exact block sum (int16
 * operands |w| <= 128, |x| <= 127: a VPMADDWD lane at most 2 * 128 * 127, 16 of them at most
 * 520192, far from overflow), d = w.d * x.d (exact: two F16 significands), then
 * sum = sum + (float)isum * d per block in order, multiplies and adds kept apart (no FMA
 * contraction of intrinsics in C11 mode). The same bits as avx2_repack.c's tiles and the
 * reference for any number of tokens per call (batch invariance).
 *
 * Pure function, any thread, no heap; about 54 KiB of stack (the chunk's activation scales,
 * the piece's sums, the widened block of activations and of weights).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/repack_impl.h"

#define QW_INLINE static inline __attribute__((always_inline))

#define QW_MAX_TOK 64                 /* tokens of a chunk */
#define QW_SCRATCH 8192               /* activation scales of a chunk (token x block) */
#define QW_X_CHUNK_BYTES (256 * 1024) /* a chunk's activations, kept in L2 while pieces sweep */
#define QW_PIECE_GROUPS 16             /* row groups whose sums a chunk keeps (16 KiB) */
#define QW_PIECE_ROWS (QW_PIECE_GROUPS * SP_REPACK_ROWS)
#define QW_G 2                        /* groups of a tile */
#define QW_T 4                        /* tokens of a tile */
#define QW_PAIRS 16                   /* int16 pairs per row and block */

_Static_assert(QW_SCRATCH >= SP_REPACK_MAX_N / 32, "one token's scales fit the scratch");
_Static_assert(SP_REPACK_ROWS == 8, "a group is one register of 8 lanes");
_Static_assert(QW_PIECE_GROUPS % QW_G == 0, "pieces hold whole tiles of groups");

/* Bytes 0 and 2 of each dword of v as an int16 pair (the even bytes), and bytes 1 and 3. */
QW_INLINE __m256i
qw_even(__m256i v)
{
    return _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
}

QW_INLINE __m256i
qw_odd(__m256i v)
{
    return _mm256_srai_epi16(v, 8);
}

/*
 * Block pb of one group widened into ws[p * QW_G], p = 0..15: pair p < 8 is the even bytes of
 * the 4-byte slice p of the 8 rows, pair 8 + p the odd bytes (lane r = row r).
 */
QW_INLINE void
qw_widen_weights(const uint8_t *pb, __m256i *ws)
{
    /* Chunk 2j holds bytes 8j..8j+7 of rows {0,1,4,5} (one row a 64-bit lane), chunk 2j+1
     * the same bytes of rows {2,3,6,7}. Dwords 0 and 2 of each 128-bit lane of the pair,
     * then 1 and 3, give slices 2j and 2j+1 of rows 0..7 in order. */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256 c0 = _mm256_castsi256_ps(
            _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * (2 * j))));
        const __m256 c1 = _mm256_castsi256_ps(
            _mm256_loadu_si256((const __m256i *)(pb + 16 + 32 * (2 * j + 1))));
        const __m256i lo = _mm256_castps_si256(_mm256_shuffle_ps(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)));
        const __m256i hi = _mm256_castps_si256(_mm256_shuffle_ps(c0, c1, _MM_SHUFFLE(3, 1, 3, 1)));
        ws[(2 * j) * QW_G] = qw_even(lo);
        ws[(2 * j + 1) * QW_G] = qw_even(hi);
        ws[(8 + 2 * j) * QW_G] = qw_odd(lo);
        ws[(8 + 2 * j + 1) * QW_G] = qw_odd(hi);
    }
}

/* The 16 pair steps of a full tile (2 groups x 4 tokens) into the 8 block sums s[g][t]. */
QW_INLINE void
qw_pairs_full(const __m256i *ws, const int32_t (*xb)[QW_PAIRS], __m256i s[QW_G][QW_T])
{
    for (int p = 0; p < QW_PAIRS; p++) {
        __m256i w0, w1, b0, b1, t0, t1, t2, t3;
        /* xb rows are 64 bytes apart: tokens 0..3 at 0, 64, 128, 192 */
        __asm__("vmovdqa (%[w]), %[w0]\n\t"
                "vmovdqa 32(%[w]), %[w1]\n\t"
                "vpbroadcastd (%[x]), %[b0]\n\t"
                "vpbroadcastd 64(%[x]), %[b1]\n\t"
                "vpmaddwd %[b0], %[w0], %[t0]\n\t"
                "vpmaddwd %[b0], %[w1], %[t1]\n\t"
                "vpmaddwd %[b1], %[w0], %[t2]\n\t"
                "vpmaddwd %[b1], %[w1], %[t3]\n\t"
                "vpaddd %[t0], %[s00], %[s00]\n\t"
                "vpaddd %[t1], %[s10], %[s10]\n\t"
                "vpaddd %[t2], %[s01], %[s01]\n\t"
                "vpaddd %[t3], %[s11], %[s11]\n\t"
                "vpbroadcastd 128(%[x]), %[b0]\n\t"
                "vpbroadcastd 192(%[x]), %[b1]\n\t"
                "vpmaddwd %[b0], %[w0], %[t0]\n\t"
                "vpmaddwd %[b0], %[w1], %[t1]\n\t"
                "vpmaddwd %[b1], %[w0], %[t2]\n\t"
                "vpmaddwd %[b1], %[w1], %[t3]\n\t"
                "vpaddd %[t0], %[s02], %[s02]\n\t"
                "vpaddd %[t1], %[s12], %[s12]\n\t"
                "vpaddd %[t2], %[s03], %[s03]\n\t"
                "vpaddd %[t3], %[s13], %[s13]"
                : [s00] "+x"(s[0][0]), [s01] "+x"(s[0][1]), [s02] "+x"(s[0][2]),
                  [s03] "+x"(s[0][3]), [s10] "+x"(s[1][0]), [s11] "+x"(s[1][1]),
                  [s12] "+x"(s[1][2]), [s13] "+x"(s[1][3]), [w0] "=&x"(w0), [w1] "=&x"(w1),
                  [b0] "=&x"(b0), [b1] "=&x"(b1), [t0] "=&x"(t0), [t1] "=&x"(t1),
                  [t2] "=&x"(t2), [t3] "=&x"(t3)
                : [w] "r"(ws + p * QW_G), [x] "r"(&xb[0][p]), "m"(*(const __m256i(*)[2])(ws + p * QW_G)),
                  "m"(*(const int32_t(*)[QW_T][QW_PAIRS])xb));
    }
}

/*
 * G groups x T tokens of one block: block sums into s, then per (group, token)
 * a = a + (float)isum * (w.d * x.d), the reference's step. xd[t * nb]: token t's block scale;
 * a + t * QW_PIECE_ROWS + 8 g: the sums of group g and token t.
 */
QW_INLINE void
qw_tile(const int G, const int T, const __m256i *ws, const __m256 *dw,
        const int32_t (*xb)[QW_PAIRS], const float *xd, int64_t nb, float *a)
{
    __m256i s[QW_G][QW_T];
#pragma GCC unroll 2
    for (int g = 0; g < QW_G; g++) {
#pragma GCC unroll 4
        for (int t = 0; t < QW_T; t++) {
            s[g][t] = _mm256_setzero_si256();
        }
    }
    if (G == QW_G && T == QW_T) {
        qw_pairs_full(ws, xb, s);
    } else {
        for (int p = 0; p < QW_PAIRS; p++) {
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m256i x = _mm256_set1_epi32(xb[t][p]);
#pragma GCC unroll 2
                for (int g = 0; g < G; g++) {
                    s[g][t] = _mm256_add_epi32(s[g][t], _mm256_madd_epi16(ws[p * QW_G + g], x));
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m256 xd_t = _mm256_set1_ps(xd[(int64_t)t * nb]);
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            const __m256 d = _mm256_mul_ps(dw[g], xd_t);
            float *at = a + t * QW_PIECE_ROWS + g * SP_REPACK_ROWS;
            _mm256_store_ps(at, _mm256_add_ps(_mm256_load_ps(at),
                                              _mm256_mul_ps(_mm256_cvtepi32_ps(s[g][t]), d)));
        }
    }
}

#define QW_TILE_FN(G, T)                                                                      \
    static void qw_tile_##G##_##T(const __m256i *ws, const __m256 *dw,                       \
                                  const int32_t (*xb)[QW_PAIRS], const float *xd, int64_t nb, \
                                  float *a)                                                   \
    {                                                                                         \
        qw_tile(G, T, ws, dw, xb, xd, nb, a);                                                 \
    }
QW_TILE_FN(1, 1)
QW_TILE_FN(1, 2)
QW_TILE_FN(1, 3)
QW_TILE_FN(1, 4)
QW_TILE_FN(2, 1)
QW_TILE_FN(2, 2)
QW_TILE_FN(2, 3)
QW_TILE_FN(2, 4)

typedef void (*qw_tile_fn)(const __m256i *, const __m256 *, const int32_t (*)[QW_PAIRS],
                           const float *, int64_t, float *);

static const qw_tile_fn qw_tiles[QW_G][QW_T] = {
    {qw_tile_1_1, qw_tile_1_2, qw_tile_1_3, qw_tile_1_4},
    {qw_tile_2_1, qw_tile_2_2, qw_tile_2_3, qw_tile_2_4},
};

/*
 * One piece: groups [0, PG) from g (gs bytes apart) x the chunk's T tokens (x, xs bytes apart)
 * over all nb blocks, into acc[t][0, 8 PG). xd[t * nb + b]: token t's block b scale.
 */
static void
qw_piece(int PG, int64_t nb, const uint8_t *g, size_t gs, const uint8_t *x, size_t xs, int T,
         const float *xd, float (*acc)[QW_PIECE_ROWS])
{
    _Alignas(32) int32_t xb[QW_MAX_TOK][QW_PAIRS];
    __m256i ws[QW_PAIRS * QW_G];
    __m256 dw[QW_G];
    for (int t = 0; t < T; t++) {
        for (int r = 0; r < PG * SP_REPACK_ROWS; r += SP_REPACK_ROWS) {
            _mm256_store_ps(acc[t] + r, _mm256_setzero_ps());
        }
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *xq = x + (size_t)b * sizeof(sp_block_q8_0) + offsetof(sp_block_q8_0, qs);
        for (int t = 0; t < T; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(xq + (size_t)t * xs));
            _mm256_store_si256((__m256i *)xb[t], qw_even(v));
            _mm256_store_si256((__m256i *)(xb[t] + 8), qw_odd(v));
        }
        for (int k = 0; k < PG; k += QW_G) {
            const int G = PG - k < QW_G ? PG - k : QW_G;
            for (int i = 0; i < G; i++) {
                const uint8_t *pb = g + (size_t)(k + i) * gs + (size_t)b * SP_REPACK_Q8_0_BLOCK_BYTES;
                dw[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
                qw_widen_weights(pb, ws + i);
            }
            float *a = acc[0] + k * SP_REPACK_ROWS;
            int t = 0;
            for (; t + QW_T <= T; t += QW_T) {
                qw_tiles[G - 1][QW_T - 1](ws, dw, xb + t, xd + t * nb + b, nb,
                                          a + t * QW_PIECE_ROWS);
            }
            if (t < T) {
                qw_tiles[G - 1][T - t - 1](ws, dw, xb + t, xd + t * nb + b, nb,
                                           a + t * QW_PIECE_ROWS);
            }
        }
    }
}

void
sp__repack_q8_0_gemm_wide_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                               const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    const int64_t nb = n / 32;
    float xd[QW_SCRATCH];
    _Alignas(32) float acc[QW_MAX_TOK][QW_PIECE_ROWS];
    int64_t tc = (int64_t)(QW_X_CHUNK_BYTES / (xs ? xs : 1));
    if (tc > QW_SCRATCH / nb) {
        tc = QW_SCRATCH / nb;
    }
    if (tc > QW_MAX_TOK) {
        tc = QW_MAX_TOK;
    }
    if (tc < 1) {
        tc = 1; /* n <= SP_REPACK_MAX_N: one token's scales always fit */
    }
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = t0 + tc < n_tok ? t0 + tc : n_tok;
        const uint8_t *xc = (const uint8_t *)x + (size_t)t0 * xs;
        for (int64_t t = t0; t < t1; t++) {
            const sp_block_q8_0 *xr = (const sp_block_q8_0 *)((const uint8_t *)x + (size_t)t * xs);
            for (int64_t b = 0; b < nb; b++) {
                xd[(t - t0) * nb + b] = _cvtsh_ss(xr[b].d);
            }
        }
        for (int64_t g = g0; g < g1; g += QW_PIECE_GROUPS) {
            const int PG = g1 - g < QW_PIECE_GROUPS ? (int)(g1 - g) : QW_PIECE_GROUPS;
            qw_piece(PG, nb, (const uint8_t *)w + (size_t)g * ws, ws, xc, xs, (int)(t1 - t0), xd,
                     acc);
            const int64_t ra = g * SP_REPACK_ROWS > r0 ? g * SP_REPACK_ROWS : r0;
            const int64_t re = (g + PG) * SP_REPACK_ROWS;
            const int64_t rb = re < r1 ? re : r1;
            for (int64_t t = t0; t < t1; t++) {
                memcpy(y + t * ldy + ra, acc[t - t0] + (ra - g * SP_REPACK_ROWS),
                       sizeof(float) * (size_t)(rb - ra));
            }
        }
    }
}
