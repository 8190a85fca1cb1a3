/*
 * avx512_repack.c - AVX-512 VNNI gemm of Q4_K weights in the packed form of repack_impl.h
 * (8 rows interleaved per group, a row's 8 consecutive quant bytes in one 64-bit lane) x Q8_K
 * activations: the prefill and many-row decode kernel at the AVX-512 level on CPUs with VNNI.
 *
 * One 64-byte load is octet o of the super-block's quant bytes for all 8 rows (chunks 2o and
 * 2o + 1: 64-bit lanes in row order 0,1,4,5,2,3,6,7). Its low nibbles are elements 8 (o % 4)
 * .. + 7 of sub-block 2 (o / 4), its high nibbles the same of sub-block 2 (o / 4) + 1 (the
 * GGUF's Q4_K layout). VPDPBUSD multiplies the unsigned nibbles by the token's 8 signed Q8_K
 * bytes (one 64-bit broadcast) and adds groups of four into int32: lane (row, e) holds the
 * row's products of elements 4e .. 4e + 3 of the octet. Decoded once per group and block,
 * each weight vector serves every token of the tile (T <= 8).
 *
 * Sub-block scales: after the four octets of a sub-block a lane holds 16 products, at most
 * 16 * 15 * 127 = 30480 in magnitude, so VPACKSSDW packs the two sub-blocks of a chunk to
 * int16 without saturating, and one VPDPWSSD multiplies each adjacent pair (the two halves of
 * one row) by the row's 6-bit scale and adds it to the super-block's int32 sum: exact
 * (|sumi| <= 256 * 15 * 127 * 63). The mins term sum_j m[j] (bsums[2j] + bsums[2j + 1]) is four
 * VPDPWSSD of (m[j], m[j]) int16 pairs against the token's bsums read straight from the Q8_K
 * block (one 64-bit broadcast each), exact too. Both sums go to row order with one VPERMT2D and
 * the float finish is kquants_impl.h's sequence lane-wise (d = y.d * x.d, dm = y.d * x.dmin,
 * a = d * sumi, c = dm * summs, blk = a - c, sumf = sumf + blk, super-blocks in order): the
 * scalar reference's bits, so the same as every level's vec_dot for any batch.
 *
 * Pure functions, any thread, no heap, no scratch.
 */
#include <immintrin.h>

#include "kernels/cpu/avx2_repack_impl.h"
#include "kernels/cpu/avx512_simd.h"

#define R5_INLINE static inline __attribute__((always_inline))

/* tokens per tile, and the activation bytes a token chunk keeps in L2 while groups sweep it
 * (512 KiB: 5-15% faster than 192 KiB in repack_bench on a 1 MiB-L2 Zen 5) */
#define R5_TM 8
_Static_assert(R5_TM <= RPX_OUT_MAX, "the driver's out array holds a tile");
#define R5_X_CHUNK_BYTES (512 * 1024)

/* VPSHUFB patterns (0x80: a zero byte, so every index is zero-extended to int16). The scale
 * vector of chunk h is its two sub-blocks' 16 scale bytes sc[2h + i][r] (byte 8 i + r),
 * broadcast to the four 128-bit lanes; word u of lane L pairs with the VPACKSSDW of the
 * sub-block sums of the rows in 64-bit lanes 2L, 2L + 1: words 0-3 are sub-block 2h (rows of
 * lanes 2L, 2L, 2L + 1, 2L + 1), words 4-7 sub-block 2h + 1. */
#define Z 0x80
static const uint8_t q4k_sc_idx[64] __attribute__((aligned(64))) = {
    0, Z, 0, Z, 1, Z, 1, Z, 8,  Z, 8,  Z, 9,  Z, 9,  Z, 4, Z, 4, Z, 5, Z, 5, Z,
    12, Z, 12, Z, 13, Z, 13, Z, 2, Z, 2, Z, 3, Z, 3, Z, 10, Z, 10, Z, 11, Z, 11, Z,
    6, Z, 6, Z, 7, Z, 7, Z, 14, Z, 14, Z, 15, Z, 15, Z};
/* The 64 min bytes m[r][j] (byte 8 r + j; 128-bit lane L holds rows 2L, 2L + 1): dword k =
 * (row k / 2, parity e = k % 2) becomes the int16 pair (m[r][2s + e], m[r][2s + e]). Table
 * for s = 0; s adds 2 (a zero byte stays one: bit 7 stays set). */
static const uint8_t q4k_m_idx[64] __attribute__((aligned(64))) = {
    0, Z, 0, Z, 1, Z, 1, Z, 8, Z, 8, Z, 9, Z, 9, Z, 0, Z, 0, Z, 1, Z, 1, Z,
    8, Z, 8, Z, 9, Z, 9, Z, 0, Z, 0, Z, 1, Z, 1, Z, 8, Z, 8, Z, 9, Z, 9, Z,
    0, Z, 0, Z, 1, Z, 1, Z, 8, Z, 8, Z, 9, Z, 9, Z};
#undef Z
/* VPERMT2D: rows 0..7 of the scaled sums (after folding, row r of 128-bit lane L sits in
 * dword 4L + (0 or 1), lanes holding rows {0,1}, {4,5}, {2,3}, {6,7}), then the mins sums
 * (row r in dword 2r of the second source). */
static const int32_t q4k_rows_idx[16] __attribute__((aligned(64))) = {
    0, 1, 8, 9, 4, 5, 12, 13, 16, 18, 20, 22, 24, 26, 28, 30};

/* G groups (8 rows each, gstep bytes apart; G = 2 only at one token: two weight streams, as
 * the AVX2 tiles read them, avx2_repack_impl.h) x T tokens over nb super-blocks, the groups'
 * super-blocks interleaved; x is Q8_K, xs bytes per token. Out[gi * T + t]: token t's 8
 * results of group gi in row order. Each group's super-blocks see the same operations in the
 * same order whatever G is: the same bits. */
R5_INLINE void
q4k_tile(int G, int T, int64_t nb, const uint8_t *g0, size_t gstep, const uint8_t *x, size_t xs,
         __m256 out[R5_TM])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i sc_idx = _mm512_load_si512((const void *)q4k_sc_idx);
    const __m512i m_idx0 = _mm512_load_si512((const void *)q4k_m_idx);
    const __m512i rows_idx = _mm512_load_si512((const void *)q4k_rows_idx);
    __m256 acc_all[R5_TM];
#pragma GCC unroll 8
    for (int t = 0; t < G * T; t++) {
        acc_all[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++) {
            __m256 *acc = acc_all + gi * T;
            const uint8_t *pb = g0 + (size_t)gi * gstep + (size_t)b * SP_REPACK_Q4K_BLOCK_BYTES;
            if (T == 1) { /* one token: SP_PF_ONE_TOKEN ahead (repack_impl.h) */
                rpx_prefetch(pb + SP_PF_ONE_TOKEN, SP_REPACK_Q4K_BLOCK_BYTES);
            }
            const uint8_t *xb = x + (size_t)b * sizeof(sp_block_q8_k);
            __m512i sumi[R5_TM];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                sumi[t] = _mm512_setzero_si512();
            }
#pragma GCC unroll 1
            for (int h = 0; h < 4; h++) {
                __m512i lo[R5_TM], hi[R5_TM];
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    lo[t] = hi[t] = _mm512_setzero_si512();
                }
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    const __m512i raw = _mm512_loadu_si512(
                        (const void *)(pb + SP_REPACK_Q4K_QS + 64 * (4 * h + q)));
                    const __m512i wl = _mm512_and_si512(raw, m4);
                    const __m512i wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                    const uint8_t *xq = xb + offsetof(sp_block_q8_k, qs) + 64 * h + 8 * q;
#pragma GCC unroll 8
                    for (int t = 0; t < T; t++) {
                        lo[t] = _mm512_dpbusd_epi32(lo[t], wl, sp512_bcast8(xq + (size_t)t * xs));
                        hi[t] = _mm512_dpbusd_epi32(hi[t], wh,
                                                    sp512_bcast8(xq + (size_t)t * xs + 32));
                    }
                }
                const __m512i S = _mm512_shuffle_epi8(
                    _mm512_broadcast_i32x4(
                        _mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q4K_SC + 16 * h))),
                    sc_idx);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_packs_epi32(lo[t], hi[t]), S);
                }
            }
            /* mins: four (m, m) pair vectors, shared by the tile's tokens */
            const __m512i mb = _mm512_loadu_si512((const void *)(pb + SP_REPACK_Q4K_M));
            __m512i M[4];
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                M[s] = _mm512_shuffle_epi8(
                    mb, _mm512_add_epi8(m_idx0, _mm512_set1_epi8((char)(2 * s))));
            }
            /* [d0..d7, dmin0..dmin7]: SP_REPACK_Q4K_DMIN follows SP_REPACK_Q4K_D */
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pb));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const uint8_t *xt = xb + (size_t)t * xs;
                const uint8_t *bs = xt + offsetof(sp_block_q8_k, bsums);
                __m512i mm = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++) {
                    mm = _mm512_dpwssd_epi32(mm, M[s], sp512_bcast8(bs + 8 * s));
                }
                const __m512i si = _mm512_add_epi32(sumi[t], _mm512_shuffle_epi32(sumi[t], 0x4E));
                mm = _mm512_add_epi32(mm, _mm512_shuffle_epi32(mm, 0xB1));
                acc[t] = _mm256_add_ps(acc[t], sp512_kquant_blk(si, mm, rows_idx, xt, dw));
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < G * T; t++) {
        out[t] = acc_all[t];
    }
}

#define R5_TILE_Q4K(T)                                                                         \
    static void q4k_tile_##T(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,        \
                             const int32_t *xsum, const float *xd, __m256 *out)                \
    {                                                                                          \
        (void)xsum;                                                                            \
        (void)xd;                                                                              \
        q4k_tile(1, T, nb, g, 0, x, xs, out);                                                  \
    }
R5_TILE_Q4K(1)
R5_TILE_Q4K(2)
R5_TILE_Q4K(3)
R5_TILE_Q4K(4)
R5_TILE_Q4K(5)
R5_TILE_Q4K(6)
R5_TILE_Q4K(7)
R5_TILE_Q4K(8)

static const rpx_tile_fn q4k_tiles[R5_TM + 1] = {NULL,        q4k_tile_1, q4k_tile_2,
                                                 q4k_tile_3,  q4k_tile_4, q4k_tile_5,
                                                 q4k_tile_6,  q4k_tile_7, q4k_tile_8};

RPX_TWO_FN(q4k_two, q4k_tile(2, 1, nb, g, gstep, x, xs, out))

/* avx2_repack_impl.h's group x token driver: Q8_K activations, no scratch; wider chunks; one
 * token over two weight streams (q4k_two) */
static void
r5_gemm(const rpx_tile_fn *tiles, rpx_two_fn two, int64_t nb, const void *w, size_t ws,
        int64_t r0, int64_t r1, const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    const rpx_plan_t plan = {
        .tiles = tiles,
        .two = two,
        .tm = R5_TM,
        .tc = rpx_chunk_tokens(R5_X_CHUNK_BYTES, xs, 0, R5_TM),
        .nb = nb,
    };
    rpx_gemm(&plan, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

void
sp__repack_q4_k_gemm_avx512(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                            const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 > r0 && n_tok > 0) {
        r5_gemm(q4k_tiles, q4k_two, n / SP_QK_K, w, ws, r0, r1, x, xs, n_tok, y, ldy);
    }
}

void
sp__repack_register_avx512(sp_cpu_kernels_t *k, bool has_vnni)
{
    if (has_vnni) { /* without VNNI the AVX2 packed kernels stay */
        k->repack_gemm[SP_TYPE_Q4_K] = sp__repack_q4_k_gemm_avx512;
    }
}
