/*
 * avx2_repack_impl.h - what the AVX2 packed-weight gemms share: avx2_repack.c (Q4_0, IQ4_NL, Q8_0,
 * Q4_K, IQ4_XS) and avx2_kpack.c (Q6_K, Q5_K), and avx512_repack.c's driver. They read
 * repack_impl.h's 8-row groups with the chunk rule of avx2_repack.c's header comment; here are the
 * pieces whose code is the same in both: the 8-byte activation broadcast, the spread of 8 rows'
 * byte scales to a row set's int16 lanes, the VPMADDUBSW chain of one 32-element sub-block, the
 * Q4_K-form mins and scale-and-min finish (Q4_K and Q5_K share that header), and the group x token
 * driver.
 *
 * The tile helpers are always_inline: the tiles are instantiated per token count and rely on
 * the helpers being expanded into their unrolled loops (constant offsets, registers kept).
 * Include only from files built with the AVX2 flags.
 */
#ifndef SP_KERNELS_CPU_AVX2_REPACK_IMPL_H
#define SP_KERNELS_CPU_AVX2_REPACK_IMPL_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/repack_impl.h"

#define RPX_INLINE static inline __attribute__((always_inline))

/* the widest token tile of any packed gemm (the out array the driver hands a tile) */
#define RPX_OUT_MAX 8
/* activation bytes a token chunk of the AVX2 gemms keeps in cache while the groups sweep it */
#define RPX_X_CHUNK_BYTES (128 * 1024)

/* VPSHUFB pattern: byte r (unsigned) of each 128-bit lane as the four int16 of a 64-bit lane */
#define RPX_SC4(r) (r), -1, (r), -1, (r), -1, (r), -1

/* the 8 activation bytes at p in each of the four 64-bit lanes */
RPX_INLINE __m256i
rpx_bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi64x(v);
}

/* 4 quant bytes broadcast to every 32-bit lane (the wide gemms' token operand) */
RPX_INLINE __m256i
rpx_bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* The wide gemms' weight registers from the packed chunks: c0 and c1 hold the same 8 bytes of
 * row sets {0,1,4,5} and {2,3,6,7} (a row a 64-bit lane); dwords 0 and 2 of each 128-bit lane
 * of the pair, then 1 and 3 (VSHUFPS), give bytes 0..3 (*lo) and 4..7 (*hi) of rows 0..7,
 * 32-bit lane r = row r. It moves whole dwords, so byte-wise masks and shifts commute with it. */
RPX_INLINE void
rpx_rows8(__m256i c0, __m256i c1, __m256i *lo, __m256i *hi)
{
    const __m256 a = _mm256_castsi256_ps(c0), b = _mm256_castsi256_ps(c1);
    *lo = _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    *hi = _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* rpx_rows8 of the chunk pair at p (p and p + 32) */
RPX_INLINE void
rpx_rows8_at(const uint8_t *p, __m256i *lo, __m256i *hi)
{
    rpx_rows8(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32)),
              lo, hi);
}

/* The wide gemms' step (q8gemm_x86.h's Q4_0, kwide_x86.h): eight registers w[k] of unsigned
 * bytes (elements 4k .. 4k + 3 of each lane's row) against a token's 32 quants xq, broadcast 4
 * at a time. p[k] = the int16 pair sums of registers 2k and 2k + 1 (VPMADDUBSW, VPADDW); the
 * callers bound the magnitudes (each adds p[] further in int16 only where that fits). */
RPX_INLINE void
rpx_dot8_pairs(const __m256i w[8], const void *xq, __m256i p[4])
{
    const int8_t *x = xq;
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        p[k] = _mm256_add_epi16(_mm256_maddubs_epi16(w[2 * k], rpx_bcast4(x + 8 * k)),
                                _mm256_maddubs_epi16(w[2 * k + 1], rpx_bcast4(x + 8 * k + 4)));
    }
}

#ifdef __AVXVNNI__
/* The same step with VPDPBUSD (the avx2-vnni files): s plus the exact int32 sum of the 32
 * products per lane. */
RPX_INLINE __m256i
rpx_dot8_vnni(__m256i s, const __m256i w[8], const void *xq)
{
    const int8_t *x = xq;
    __m256i s1 = _mm256_setzero_si256(); /* two chains of four: VPDPBUSD's latency */
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
        s = _mm256_dpbusd_avx_epi32(s, w[k], rpx_bcast4(x + 4 * k));
        s1 = _mm256_dpbusd_avx_epi32(s1, w[k + 1], rpx_bcast4(x + 4 * k + 4));
    }
    return _mm256_add_epi32(s, s1);
}
#endif

/* The VPSHUFB patterns that spread 8 rows' byte scales (bytes 0..7 of each 128-bit lane) to a
 * row set's chunk: rows {0,1,4,5} (s = 0) or {2,3,6,7} (s = 1), each row's scale in the four
 * int16 of its 64-bit lane. */
RPX_INLINE void
rpx_row_set_spread(__m256i spread[2])
{
    spread[0] = _mm256_setr_epi8(RPX_SC4(0), RPX_SC4(1), RPX_SC4(4), RPX_SC4(5));
    spread[1] = _mm256_setr_epi8(RPX_SC4(2), RPX_SC4(3), RPX_SC4(6), RPX_SC4(7));
}

/* One 32-element sub-block of a row set: q[k] holds elements 8k .. 8k + 7 of its 4 rows as
 * unsigned bytes (<= 31), xq the token's 32 quants. Four VPMADDUBSW add in int16 (at most
 * 4 * 2 * 31 * 127 = 31496) and the widening VPMADDWD multiplies by the rows' scales S: the
 * int32 sum sc * dot per row, two lanes a row. */
RPX_INLINE __m256i
rpx_subblock_dot(const __m256i q[4], const int8_t *xq, __m256i S)
{
    __m256i v = _mm256_maddubs_epi16(q[0], rpx_bcast8(xq));
    v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[1], rpx_bcast8(xq + 8)));
    v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[2], rpx_bcast8(xq + 16)));
    v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[3], rpx_bcast8(xq + 24)));
    return _mm256_madd_epi16(v, S);
}

/* A Q4_K-form super-block's 8 x 8 mins (repack_impl.h's m[r][j]) as int16: M[i] holds rows
 * 2i (low lane) and 2i + 1 (high lane). */
RPX_INLINE void
rpx_kmins_load(const uint8_t *pb, __m256i M[4])
{
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        M[i] = _mm256_cvtepu8_epi16(
            _mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q4K_M + 16 * i)));
    }
}

/* The mins term of a Q4_K-form super-block for one token (xb its Q8_K block), lane r = row r:
 * sum_j m[r][j] (bsums[2j] + bsums[2j + 1]) (pair sums |p_j| <= 32 * 128), four VPMADDWD of
 * the rows' mins against the pairs. */
RPX_INLINE __m256i
rpx_kmins_sum(const uint8_t *xb, const __m256i M[4])
{
    const __m256i row_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    /* p_0..p_7 in each 128-bit lane */
    const __m256i bs = _mm256_loadu_si256((const __m256i *)(xb + offsetof(sp_block_q8_k, bsums)));
    const __m256i pairs = _mm256_permute4x64_epi64(_mm256_hadd_epi16(bs, bs), 0x88);
    const __m256i h0 =
        _mm256_hadd_epi32(_mm256_madd_epi16(M[0], pairs), _mm256_madd_epi16(M[1], pairs));
    const __m256i h1 =
        _mm256_hadd_epi32(_mm256_madd_epi16(M[2], pairs), _mm256_madd_epi16(M[3], pairs));
    return _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(h0, h1), row_order);
}

/* The float finish of a Q4_K-form super-block and token, lane r = row r: sumi the scaled sums,
 * summs the mins term, xb the token's Q8_K block, dw / dmw the rows' d and dmin;
 * kquants_impl.h's sequence lane-wise: d = y.d * x.d; dm = y.d * x.dmin; a = d * sumi;
 * c = dm * summs; blk = a - c; sumf = sumf + blk. */
RPX_INLINE __m256
rpx_kfinish(__m256 acc, __m256i sumi, __m256i summs, const uint8_t *xb, __m256 dw, __m256 dmw)
{
    float yd;
    memcpy(&yd, xb, sizeof yd);
    const __m256 ydv = _mm256_set1_ps(yd);
    const __m256 d = _mm256_mul_ps(ydv, dw);
    const __m256 dm = _mm256_mul_ps(ydv, dmw);
    const __m256 a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi));
    const __m256 c = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(summs));
    return _mm256_add_ps(acc, _mm256_sub_ps(a, c));
}

/* The finish for the 4-row-set tiles (Q4_K, Q5_K): ai0 / ai1 the row sets' scaled sums, two
 * lanes a row, which one VPHADDD puts in row order. */
RPX_INLINE __m256
rpx_kmins_finish(__m256 acc, __m256i ai0, __m256i ai1, const uint8_t *xb, __m256 dw,
                 __m256 dmw, const __m256i M[4])
{
    return rpx_kfinish(acc, _mm256_hadd_epi32(ai0, ai1), rpx_kmins_sum(xb, M), xb, dw, dmw);
}

/* The Q6_K finish of one super-block and token (avx2_kpack.c's tiles, avx2_kwide.c): raw the
 * rows' sums sum_k sc[k] sum(q + 32) y (lane r = row r), pb the packed super-block (its signed
 * scales sc[p][r][e], repack_impl.h), xb the token's Q8_K block, dw the rows' d. The offset
 * comes off as 32 * sum_k sc[k] bsums[k] (the pair of sub-blocks 2p, 2p + 1 of the 8 rows: one
 * 16-byte load, VPMOVSXBW, one VPMADDWD against the token's bsums pair), then
 * kquants_impl.h's sequence lane-wise: d = y.d * x.d; blk = d * sumi; sumf = sumf + blk. */
RPX_INLINE __m256
rpx_q6k_finish(__m256 acc, __m256i raw, const uint8_t *pb, const uint8_t *xb, __m256 dw)
{
    __m256i corr = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        int32_t bp;
        memcpy(&bp, xb + offsetof(sp_block_q8_k, bsums) + 4 * p, sizeof bp);
        const __m256i P = _mm256_cvtepi8_epi16(
            _mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q6K_SC + 16 * p)));
        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(P, _mm256_set1_epi32(bp)));
    }
    const __m256i sumi = _mm256_sub_epi32(raw, _mm256_slli_epi32(corr, 5));
    float yd;
    memcpy(&yd, xb, sizeof yd);
    const __m256 d = _mm256_mul_ps(_mm256_set1_ps(yd), dw);
    return _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)));
}

/* The super-block RPX_PF_DIST ahead is prefetched, its cache lines in order: a super-block's
 * loads jump between its ql and qh (qs and qh) parts, which the hardware prefetchers follow
 * poorly. One token from memory: 0.68x of the row kernels without, 1.2x with (repack_bench's
 * 192 MiB decode, docs/design.md); 4 super-blocks ahead beat 1 and 2, and the token tiles
 * of a batch gain too (8 tokens 0.95x -> 1.2x). */
#define RPX_PF_DIST 4

RPX_INLINE void
rpx_prefetch(const uint8_t *p, int bytes)
{
    for (int i = 0; i < bytes; i += 64) {
        _mm_prefetch((const char *)p + i, _MM_HINT_T0);
    }
}

/* Q5_K's bit j of a qh byte moved to bit 4 */
RPX_INLINE __m256i
q5_hi(__m256i qh, int j, __m256i m10)
{
    switch (j) {
    case 0: return _mm256_and_si256(_mm256_slli_epi16(qh, 4), m10);
    case 1: return _mm256_and_si256(_mm256_slli_epi16(qh, 3), m10);
    case 2: return _mm256_and_si256(_mm256_slli_epi16(qh, 2), m10);
    case 3: return _mm256_and_si256(_mm256_slli_epi16(qh, 1), m10);
    case 4: return _mm256_and_si256(qh, m10);
    case 5: return _mm256_and_si256(_mm256_srli_epi16(qh, 1), m10);
    case 6: return _mm256_and_si256(_mm256_srli_epi16(qh, 2), m10);
    default: return _mm256_and_si256(_mm256_srli_epi16(qh, 3), m10);
    }
}

/*
 * Q4_K (q5 false) and Q5_K: one group (8 rows) x T tokens over all nb super-blocks; x is Q8_K
 * (xs bytes per token). The two forms share the header (scales, mins, d, dmin) and the qs
 * layout; Q5_K adds qh, whose bit j of a byte becomes bit 4 of sub-block j's values (values
 * 0..31, the int16 bound of rpx_subblock_dot), and prefetches ahead (its super-block's loads
 * jump between qs and qh). Unrolled: sub-blocks 2i and 2i + 1 are the low and high nibbles of
 * the same bytes, so the loads are shared and the shift is a constant. Out: lane r = row r.
 */
/* the Q4_K-form tiles' widest (4 tokens: the four VPMADDUBSW slices and the accumulators fit
 * the 16 YMM registers) */
#define RPX_K45_TM 4

/* One super-block b of a Q4_K / Q5_K group (its packed bytes at pb) x T tokens, into acc[t]. */
RPX_INLINE void
rpx_block_k45(bool q5, int T, const uint8_t *pb, int64_t b, const uint8_t *x, size_t xs,
              __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    __m256i spread[2];
    rpx_row_set_spread(spread);
    __m256i ai[RPX_K45_TM][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        ai[t][0] = ai[t][1] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        int64_t scj;
        memcpy(&scj, pb + SP_REPACK_Q4K_SC + 8 * j, sizeof scj);
        const __m256i scv = _mm256_set1_epi64x(scj);
        const uint8_t *qp = pb + (q5 ? SP_REPACK_Q5K_QS : SP_REPACK_Q4K_QS) + 256 * (j >> 1);
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            const __m256i S = _mm256_shuffle_epi8(scv, spread[s]);
            __m256i q[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(qp + 32 * (s + 2 * k)));
                q[k] = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)
                               : _mm256_and_si256(raw, m4);
                if (q5) {
                    const __m256i qh = _mm256_loadu_si256(
                        (const __m256i *)(pb + SP_REPACK_Q5K_QH + 32 * (s + 2 * k)));
                    q[k] = _mm256_or_si256(q[k], q5_hi(qh, j, m10));
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int8_t *xq =
                    (const int8_t *)(x + (size_t)t * xs + (size_t)b * sizeof(sp_block_q8_k) +
                                     offsetof(sp_block_q8_k, qs)) +
                    32 * j;
                ai[t][s] = _mm256_add_epi32(ai[t][s], rpx_subblock_dot(q, xq, S));
            }
        }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q4K_D)));
    const __m256 dmw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + SP_REPACK_Q4K_DMIN)));
    __m256i M[4];
    rpx_kmins_load(pb, M);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const uint8_t *xb = x + (size_t)t * xs + (size_t)b * sizeof(sp_block_q8_k);
        acc[t] = rpx_kmins_finish(acc[t], ai[t][0], ai[t][1], xb, dw, dmw, M);
    }
}

/* The tile: G groups gstep bytes apart (G = 2 only at one token: rpx_gemv_two) x T tokens,
 * the groups' super-blocks interleaved; out[gi * T + t]. */
RPX_INLINE void
rpx_tile_k45(bool q5, bool pf, int G, int T, int64_t nb, const uint8_t *g, size_t gstep,
             const uint8_t *x, size_t xs, __m256 *out)
{
    const size_t bb = q5 ? SP_REPACK_Q5K_BLOCK_BYTES : SP_REPACK_Q4K_BLOCK_BYTES;
    __m256 acc[RPX_K45_TM];
#pragma GCC unroll 8
    for (int t = 0; t < G * T; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++) { /* acc[gi * T + t]: group gi, token t */
            const uint8_t *pb = g + (size_t)gi * gstep + (size_t)b * bb;
            if (q5) {
                rpx_prefetch(pb + RPX_PF_DIST * bb, (int)bb);
            } else if (pf) { /* the group's first pass: SP_PF_ONE_TOKEN ahead (repack_impl.h) */
                rpx_prefetch(pb + SP_PF_ONE_TOKEN, (int)bb);
            }
            /* An opaque copy of x per group: otherwise GCC shares the token's 32 broadcasts
             * of a super-block between the two groups and spills them (182 stack operands in
             * the two-group tile against 48 so; kernel_ab 0.98-1.11x, within the noise). Not
             * with one group, whose 2-4 token tiles ran 0.90-0.96x with it. */
            const uint8_t *xg = x;
            if (G > 1) {
                __asm__("" : "+r"(xg));
            }
            rpx_block_k45(q5, T, pb, b, xg, xs, acc + gi * T);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < G * T; t++) {
        out[t] = acc[t];
    }
}

/* A tile: one group (8 rows) x T tokens over all nb blocks, T fixed per instance. xsum / xd
 * are the token chunk's per-block scratch of the forms that need it (NULL otherwise). Out:
 * lane r = row r, one vector a token. */
typedef void (*rpx_tile_fn)(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,
                            const int32_t *xsum, const float *xd, __m256 *out);

/* One token over two groups at once, g and g + gstep, interleaved block by block: out[0] and
 * out[1] (lane r = row r of each). rpx_gemm's one-token calls, see there. */
typedef void (*rpx_two_fn)(int64_t nb, const uint8_t *g, size_t gstep, const uint8_t *x, size_t xs,
                           const int32_t *xsum, const float *xd, __m256 *out);

/* A tile as an rpx_tile_fn named fname whose body is call (over nb, g, x, xs, xsum, xd, out),
 * and a two-group tile as an rpx_two_fn (the same, and gstep). */
#define RPX_TILE_FN(fname, call)                                                               \
    static void fname(int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,               \
                      const int32_t *xsum, const float *xd, __m256 *out)                       \
    {                                                                                          \
        (void)xsum;                                                                            \
        (void)xd;                                                                              \
        call;                                                                                  \
    }
#define RPX_TWO_FN(fname, call)                                                                \
    static void fname(int64_t nb, const uint8_t *g, size_t gstep, const uint8_t *x, size_t xs, \
                      const int32_t *xsum, const float *xd, __m256 *out)                       \
    {                                                                                          \
        (void)xsum;                                                                            \
        (void)xd;                                                                              \
        call;                                                                                  \
    }

/* Fills a token chunk's scratch (n_tok tokens from x): xsum / xd[t * nb + b]. */
typedef void (*rpx_fill_fn)(int kind, const uint8_t *x, size_t xs, int64_t n_tok, int64_t nb,
                            int32_t *xsum, float *xd);

typedef struct {
    const rpx_tile_fn *tiles; /* tiles[T], T = 1..tm */
    /* the same tiles prefetching the weights, for a group's first tile (NULL: tiles) */
    const rpx_tile_fn *tiles_pf;
    /* one token over two groups' weight streams at once (NULL: one group at a time) */
    rpx_two_fn two;
    int tm;                   /* widest tile (<= RPX_OUT_MAX) */
    int64_t tc;               /* tokens per chunk, a multiple of tm */
    int64_t nb;               /* blocks per row */
    rpx_fill_fn fill;         /* NULL: no scratch (Q8_K activations carry their sums) */
    int kind;                 /* passed to fill */
    int32_t *xsum;            /* tc * nb entries each, when fill is set */
    float *xd;
} rpx_plan_t;

/* One token's results of group g (lane r = row 8 g + r) into its output row yt, the rows
 * [r0, r1) only: one vector store for a whole group, lane by lane for a range's cut first or
 * last group. */
static inline void
rpx_store_group(float *yt, int64_t g, int64_t r0, int64_t r1, __m256 v)
{
    const int64_t row0 = g * SP_REPACK_ROWS;
    if (row0 >= r0 && row0 + SP_REPACK_ROWS <= r1) {
        _mm256_storeu_ps(yt + row0, v);
        return;
    }
    float o[SP_REPACK_ROWS];
    _mm256_storeu_ps(o, v);
    for (int r = 0; r < SP_REPACK_ROWS; r++) {
        if (row0 + r >= r0 && row0 + r < r1) {
            yt[row0 + r] = o[r];
        }
    }
}

/* Tokens per chunk: the activations of chunk_bytes, at most cap (0: none), a multiple of tm
 * and at least tm. */
static inline int64_t
rpx_chunk_tokens(size_t chunk_bytes, size_t xs, int64_t cap, int tm)
{
    int64_t tc = (int64_t)(chunk_bytes / (xs ? xs : 1));
    if (cap > 0 && tc > cap) {
        tc = cap;
    }
    tc = tc / tm * tm;
    return tc < tm ? tm : tc;
}

/*
 * One token over groups [g0, g1) (rows [r0, r1) stored): the first half of the groups and the
 * second half in pairs, each pair one call of the two-stream tile, so the weights come from
 * memory as two sequential streams, not one. On an AMD Zen 3 (AVX2, bench/kernel_ab.sh) one
 * thread's one-token Q8_0 product ran 1.2-1.3x faster this way, two threads 1.1-1.2x; a read
 * gained nothing from a second stream. The odd group left over, if any, runs alone. The same
 * arithmetic per group, so the same bits.
 */
static inline void
rpx_gemv_two(const rpx_plan_t *p, const void *w, size_t ws, int64_t g0, int64_t g1, int64_t r0,
             int64_t r1, const void *x, size_t xs, float *y)
{
    const int64_t h = (g1 - g0) / 2;
    const uint8_t *wb = w;
    __m256 out[RPX_OUT_MAX];
    for (int64_t g = g0; g < g0 + h; g++) {
        p->two(p->nb, wb + (size_t)g * ws, (size_t)h * ws, x, xs, p->xsum, p->xd, out);
        rpx_store_group(y, g, r0, r1, out[0]);
        rpx_store_group(y, g + h, r0, r1, out[1]);
    }
    if (g0 + 2 * h < g1) {
        const rpx_tile_fn *tiles = p->tiles_pf ? p->tiles_pf : p->tiles;
        tiles[1](p->nb, wb + (size_t)(g1 - 1) * ws, x, xs, p->xsum, p->xd, out);
        rpx_store_group(y, g1 - 1, r0, r1, out[0]);
    }
}

/*
 * Rows [r0, r1) x n_tok tokens: the groups that cover the rows, each computed whole and
 * stored only where the row is asked for. Tokens go in chunks whose activations stay in
 * cache while the groups sweep them; each chunk's scratch is filled once.
 */
static inline void
rpx_gemm(const rpx_plan_t *p, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
         size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    for (int64_t t0 = 0; t0 < n_tok; t0 += p->tc) {
        const int64_t t1 = t0 + p->tc < n_tok ? t0 + p->tc : n_tok;
        if (p->fill) {
            p->fill(p->kind, (const uint8_t *)x + (size_t)t0 * xs, xs, t1 - t0, p->nb, p->xsum,
                    p->xd);
        }
        if (n_tok == 1 && p->two) {
            rpx_gemv_two(p, w, ws, g0, g1, r0, r1, x, xs, y);
            continue;
        }
        for (int64_t g = g0; g < g1; g++) {
            const uint8_t *wg = (const uint8_t *)w + (size_t)g * ws;
            for (int64_t t = t0; t < t1; t += p->tm) {
                const int T = (int)(t1 - t < p->tm ? t1 - t : p->tm);
                const size_t so = (size_t)((t - t0) * p->nb);
                /* The call's first tile on a group streams its weights from memory; the
                 * later ones find them in L1 / L2, where a prefetch would only cost. */
                const rpx_tile_fn *tiles = t == 0 && p->tiles_pf ? p->tiles_pf : p->tiles;
                __m256 out[RPX_OUT_MAX];
                tiles[T](p->nb, wg, (const uint8_t *)x + (size_t)t * xs, xs,
                         p->fill ? p->xsum + so : NULL, p->fill ? p->xd + so : NULL, out);
                for (int tt = 0; tt < T; tt++) {
                    rpx_store_group(y + (t + tt) * ldy, g, r0, r1, out[tt]);
                }
            }
        }
    }
}

/* The sum of a Q8_0 block's 32 signed quants: VPSADBW of q + 128 (x ^ 0x80) less 32 * 128.
 * Exact; runs once per token, block and call, and a one-token call covers only a few groups
 * (a pool chunk), where the scalar loop it replaces cost 5-7% of the products' time. Q4_0's
 * offset term in avx2_repack.c's tiles and q8gemm_x86.h. */
RPX_INLINE int32_t
rpx_q8_block_sum(const int8_t *qs)
{
    const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)qs),
                                       _mm256_set1_epi8((char)0x80));
    const __m256i s4 = _mm256_sad_epu8(q, _mm256_setzero_si256());
    __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    s2 = _mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2));
    return (int32_t)_mm_cvtsi128_si32(s2) - 32 * 128;
}

/* The scratch of a chunk of n_tok Q8_0 activation rows (x, xs bytes apart): each block's scale
 * xd[t * nb + b], and, where xsum is not NULL, 8 * the sum of its quants for Q4_0's offset
 * (avx2_repack.c's tiles and q8gemm_x86.h). */
RPX_INLINE void
rpx_fill_q8_scratch(const uint8_t *x, size_t xs, int64_t n_tok, int64_t nb, int32_t *xsum,
                    float *xd)
{
    for (int64_t t = 0; t < n_tok; t++) {
        const sp_block_q8_0 *xb = (const sp_block_q8_0 *)(x + (size_t)t * xs);
        for (int64_t b = 0; b < nb; b++) {
            xd[t * nb + b] = _cvtsh_ss(xb[b].d);
            if (xsum != NULL) {
                xsum[t * nb + b] = 8 * rpx_q8_block_sum(xb[b].qs);
            }
        }
    }
}

/* A packed gemm's table entry that hands calls of min_tok tokens and up to `wide` (the loop
 * order of q8gemm_x86.h and kwide_x86.h) and fewer to `few` (the tiles of avx2_repack.c and
 * avx2_kpack.c): the same bits either way, so min_tok is only where the wide form starts to
 * be the faster (each use says what measured it). */
#define RPX_BY_TOKENS(name, wide, few, min_tok)                                                 \
    static void name(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, \
                     size_t xs, int64_t n_tok, float *y, int64_t ldy)                           \
    {                                                                                           \
        if (n_tok >= (min_tok)) {                                                               \
            wide(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);                                       \
        } else {                                                                                \
            few(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);                                        \
        }                                                                                       \
    }

#endif
