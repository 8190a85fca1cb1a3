/*
 * q32_x86.h - the x86 SIMD body shared by avx2_q32.c and avx512_q32.c (each compiles it with
 * its own ISA flags; the AVX-512 paths exist only where __AVX512F__ is defined). Static inline
 * functions, no state; the callers are pure functions usable from any thread.
 *
 * A weight row is walked in groups of 8 blocks. Each block is unpacked to 32 bytes in the
 * order of the activation quants (elements 0..15 from the low nibbles, 16..31 from the high
 * ones, the fifth bit of Q5 types from qh), multiplied with the activation's 32 int8 by
 * VPMADDUBSW + VPMADDWD (or VPDPBUSD), and the 8 lanes of each block summed exactly into one
 * int32 (a transposing horizontal-add tree, 8 blocks -> 8 lanes). The per-block float terms of
 * q32_impl.h's contract are then computed lane-wise with the same operations as the reference
 * (multiplies and adds, never FMA) and added to the contract's 8 partial sums in one vector add.
 * So the result is the reference's bits, for any number of tokens per call. gemm works in
 * tiles of up to 4 rows x 4 tokens: each weight group is unpacked once for the tile's tokens,
 * each activation group's scales are read once for its rows.
 *
 * Integer ranges: the unsigned side of VPMADDUBSW is the weight's magnitude (<= 127: Q4_1 15,
 * Q5_1 31, Q5_0 16, IQ4_NL 127, MXFP4 12), the signed side an activation (|q| <= 127, the
 * quantizers never produce -128), so a pair sum is at most 2 * 127 * 127 = 32258 < 2^15: no
 * saturation; the block sums (<= 32 * 127 * 127) fit int32.
 */
#ifndef SP_KERNELS_CPU_Q32_X86_H
#define SP_KERNELS_CPU_Q32_X86_H

#include <immintrin.h>

#include "kernels/cpu/q32_impl.h"

/* Forced inlining and unrolling make the kinds compile-time constants and the
 * group loops straight code. Sanitizer builds keep calls and loops as written:
 * ASan instruments every inlined, unrolled copy, and clang took over ten
 * minutes on avx512_q32.c with them (2 s without). Neither changes a result:
 * the order of operations is the source's either way. */
#if defined(__SANITIZE_ADDRESS__)
#define Q32_PLAIN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define Q32_PLAIN 1
#endif
#endif
#ifdef Q32_PLAIN
#define Q32_INLINE static inline
#define Q32_UNROLL(n)
#else
#define Q32_INLINE static inline __attribute__((always_inline))
#define Q32_PRAGMA(x) _Pragma(#x)
#define Q32_UNROLL(n) Q32_PRAGMA(GCC unroll n)
#endif

/* weight kinds (compile-time constants after inlining) */
enum { Q32_Q4_1, Q32_Q5_0, Q32_Q5_1, Q32_IQ4_NL, Q32_MXFP4 };
/* SIMD flavours of the integer products */
enum { Q32_AVX2, Q32_AVX512, Q32_AVX512_VNNI };

Q32_INLINE size_t
q32_wbytes(int kind)
{
    switch (kind) {
    case Q32_Q4_1: return sizeof(sp_block_q4_1);
    case Q32_Q5_0: return sizeof(sp_block_q5_0);
    case Q32_Q5_1: return sizeof(sp_block_q5_1);
    case Q32_IQ4_NL: return sizeof(sp_block_iq4_nl);
    default: return sizeof(sp_block_mxfp4);
    }
}

/* Q4_1 and Q5_1 pair with Q8_1 (and carry an offset m), the others with Q8_0. */
Q32_INLINE int
q32_asym(int kind)
{
    return kind == Q32_Q4_1 || kind == Q32_Q5_1;
}

Q32_INLINE size_t
q32_xbytes(int kind)
{
    return q32_asym(kind) ? sizeof(sp_block_q8_1) : sizeof(sp_block_q8_0);
}

/* offset of the 16 nibble bytes in a weight block, and of the 32 int8 in an activation block */
Q32_INLINE size_t
q32_qs_off(int kind)
{
    switch (kind) {
    case Q32_Q4_1: return offsetof(sp_block_q4_1, qs);
    case Q32_Q5_0: return offsetof(sp_block_q5_0, qs);
    case Q32_Q5_1: return offsetof(sp_block_q5_1, qs);
    case Q32_IQ4_NL: return offsetof(sp_block_iq4_nl, qs);
    default: return offsetof(sp_block_mxfp4, qs);
    }
}

Q32_INLINE size_t
q32_xqs_off(int kind)
{
    return q32_asym(kind) ? offsetof(sp_block_q8_1, qs) : offsetof(sp_block_q8_0, qs);
}

Q32_INLINE float
q32_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return _cvtsh_ss(h); /* exact, like sp_fp16_to_fp32 */
}

/* 32 bytes of weight quants: unsigned q for Q4_1 / Q5_1, signed values for the others. */
Q32_INLINE __m256i
q32_unpack(int kind, const uint8_t *blk)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + q32_qs_off(kind)));
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
    if (kind == Q32_Q5_0 || kind == Q32_Q5_1) {
        const size_t qh_off =
            kind == Q32_Q5_0 ? offsetof(sp_block_q5_0, qh) : offsetof(sp_block_q5_1, qh);
        uint32_t qh;
        memcpy(&qh, blk + qh_off, sizeof(qh));
        /* byte j <- byte j / 8 of qh, then test bit j % 8 */
        __m256i h = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
        if (kind == Q32_Q5_0) {
            v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
        }
    } else if (kind == Q32_IQ4_NL || kind == Q32_MXFP4) {
        const int8_t *g = kind == Q32_IQ4_NL ? sp__kvalues_iq4nl : sp__kvalues_mxfp4;
        const __m128i t = _mm_loadu_si128((const __m128i *)g);
        v = _mm256_shuffle_epi8(_mm256_set_m128i(t, t), v);
    }
    return v;
}

/* Make the weight side unsigned: |w| and the activations carrying w's sign. */
Q32_INLINE void
q32_signs(int kind, __m256i *w, __m256i *x)
{
    if (!q32_asym(kind)) {
        *x = _mm256_sign_epi8(*x, *w);
        *w = _mm256_sign_epi8(*w, *w);
    }
}

/* 8 int32 lanes summing to the block's dot product (AVX2). */
Q32_INLINE __m256i
q32_dot_avx2(int kind, __m256i w, __m256i x)
{
    q32_signs(kind, &w, &x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

/* lane k of the result = the sum of the 8 lanes of p[k] (exact int32) */
Q32_INLINE __m256i
q32_reduce8(const __m256i p[8])
{
    const __m256i s01 = _mm256_hadd_epi32(p[0], p[1]);
    const __m256i s23 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i s45 = _mm256_hadd_epi32(p[4], p[5]);
    const __m256i s67 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i s0123 = _mm256_hadd_epi32(s01, s23); /* lanes: 0 1 2 3 (low) | 0 1 2 3 (high) */
    const __m256i s4567 = _mm256_hadd_epi32(s45, s67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                            _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

/* The int32 dot products of 8 consecutive weight blocks (already unpacked) with 8 activation
 * blocks starting at x. */
Q32_INLINE __m256i
q32_isum8(int kind, int flavour, const __m256i wq[8], const uint8_t *x)
{
    const size_t xb = q32_xbytes(kind), xo = q32_xqs_off(kind);
    __m256i p[8];
#ifdef __AVX512F__
    if (flavour != Q32_AVX2) {
Q32_UNROLL(4)
        for (int k = 0; k < 8; k += 2) {
            __m256i w0 = wq[k], w1 = wq[k + 1];
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + (size_t)k * xb + xo));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + (size_t)(k + 1) * xb + xo));
            q32_signs(kind, &w0, &x0);
            q32_signs(kind, &w1, &x1);
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
            const __m512i xx = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
            __m512i s;
            if (flavour == Q32_AVX512_VNNI) {
                s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xx);
            } else {
                s = _mm512_madd_epi16(_mm512_maddubs_epi16(w, xx), _mm512_set1_epi16(1));
            }
            p[k] = _mm512_castsi512_si256(s);
            p[k + 1] = _mm512_extracti64x4_epi64(s, 1);
        }
        return q32_reduce8(p);
    }
#endif
    (void)flavour;
Q32_UNROLL(8)
    for (int k = 0; k < 8; k++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(x + (size_t)k * xb + xo));
        p[k] = q32_dot_avx2(kind, wq[k], xq);
    }
    return q32_reduce8(p);
}

Q32_INLINE __m256
q32_d8(int kind, __m256 dw, __m256 dx)
{
    return kind == Q32_MXFP4 ? _mm256_mul_ps(dx, dw) : _mm256_mul_ps(dw, dx);
}

/* The 8 halves at p, p + stride, ..., as floats (exact). Each comes in with a 4-byte load
 * (every block is at least that long) and the eight are merged by unpacks: cheaper than eight
 * word inserts, and no vector load of separately stored bytes. */
Q32_INLINE __m256
q32_halves8(const uint8_t *p, size_t stride)
{
    __m128i v[8];
Q32_UNROLL(8)
    for (int k = 0; k < 8; k++) {
        v[k] = _mm_loadu_si32(p + (size_t)k * stride);
    }
    const __m128i v01 = _mm_unpacklo_epi16(v[0], v[1]), v23 = _mm_unpacklo_epi16(v[2], v[3]);
    const __m128i v45 = _mm_unpacklo_epi16(v[4], v[5]), v67 = _mm_unpacklo_epi16(v[6], v[7]);
    const __m128i lo = _mm_unpacklo_epi32(v01, v23), hi = _mm_unpacklo_epi32(v45, v67);
    return _mm256_cvtph_ps(_mm_unpacklo_epi64(lo, hi));
}

_Static_assert(offsetof(sp_block_q4_1, m) == 2 && offsetof(sp_block_q5_1, m) == 2 &&
                   offsetof(sp_block_q8_1, s) == 2,
               "the second half of a block at byte 2");

/* The halves at p + k * stride (into *a) and p + k * stride + 2 (into *b), k < 8, as floats:
 * Q4_1 / Q5_1's d and m, Q8_1's d and s. One 4-byte load per block gives both. */
Q32_INLINE void
q32_halfpairs8(const uint8_t *p, size_t stride, __m256 *a, __m256 *b)
{
    __m128i v[8];
Q32_UNROLL(8)
    for (int k = 0; k < 8; k++) {
        v[k] = _mm_loadu_si32(p + (size_t)k * stride);
    }
    /* a0 b0 a1 b1 a2 b2 a3 b3 -> a0 a1 a2 a3 b0 b1 b2 b3 (and the same for blocks 4..7) */
    const __m128i sep = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m128i lo = _mm_shuffle_epi8(
        _mm_unpacklo_epi64(_mm_unpacklo_epi32(v[0], v[1]), _mm_unpacklo_epi32(v[2], v[3])), sep);
    const __m128i hi = _mm_shuffle_epi8(
        _mm_unpacklo_epi64(_mm_unpacklo_epi32(v[4], v[5]), _mm_unpacklo_epi32(v[6], v[7])), sep);
    *a = _mm256_cvtph_ps(_mm_unpacklo_epi64(lo, hi));
    *b = _mm256_cvtph_ps(_mm_unpackhi_epi64(lo, hi));
}

/* The weight scales of 8 consecutive blocks (q32_wscale lane-wise). */
Q32_INLINE __m256
q32_wscale8(int kind, const uint8_t *w)
{
    const size_t wb = q32_wbytes(kind);
    if (kind == Q32_MXFP4) {
        /* sp__e8m0_half lane-wise: e >= 2 -> (e - 1) << 23, else 0x00200000 << e */
        const __m256i e = _mm256_setr_epi32(w[0], w[wb], w[2 * wb], w[3 * wb], w[4 * wb],
                                            w[5 * wb], w[6 * wb], w[7 * wb]);
        const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        const __m256i den = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        const __m256i big = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
        return _mm256_castsi256_ps(_mm256_blendv_epi8(den, norm, big));
    }
    return q32_halves8(w, wb);
}

/* A tile is up to Q32_RM weight rows x Q32_TM tokens; each (row, token) pair owns one vector
 * of the contract's 8 partial sums (lane k: the blocks i with i % 8 == k). */
#define Q32_RM 4
#define Q32_TM 4

/*
 * One group of 8 blocks of a tile: the activation scales of each token are read once for all
 * rows, each weight row is unpacked once for all tokens. Rows are ws bytes apart, tokens xs
 * bytes apart; the 8 blocks of each are contiguous.
 */
Q32_INLINE void
q32_group(int kind, int flavour, int R, int T, const uint8_t *w, size_t ws, const uint8_t *x,
          size_t xs, __m256 acc[Q32_RM][Q32_TM])
{
    const size_t wb = q32_wbytes(kind), xb = q32_xbytes(kind);
    __m256 dx[Q32_TM], sx[Q32_TM];
Q32_UNROLL(8)
    for (int t = 0; t < T; t++) {
        if (q32_asym(kind)) {
            q32_halfpairs8(x + (size_t)t * xs, xb, &dx[t], &sx[t]); /* Q8_1: d, s */
        } else {
            dx[t] = q32_halves8(x + (size_t)t * xs, xb);
        }
    }
Q32_UNROLL(8)
    for (int r = 0; r < R; r++) {
        const uint8_t *wr = w + (size_t)r * ws;
        __m256i wq[8];
Q32_UNROLL(8)
        for (int k = 0; k < 8; k++) {
            wq[k] = q32_unpack(kind, wr + (size_t)k * wb);
        }
        __m256 dw, mw = _mm256_setzero_ps();
        if (q32_asym(kind)) {
            q32_halfpairs8(wr, wb, &dw, &mw); /* d, m */
        } else {
            dw = q32_wscale8(kind, wr);
        }
Q32_UNROLL(8)
        for (int t = 0; t < T; t++) {
            const __m256i isum = q32_isum8(kind, flavour, wq, x + (size_t)t * xs);
            const __m256 d = q32_d8(kind, dw, dx[t]);
            __m256 blk = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
            if (q32_asym(kind)) {
                blk = _mm256_add_ps(blk, _mm256_mul_ps(mw, sx[t]));
            }
            acc[r][t] = _mm256_add_ps(acc[r][t], blk);
        }
    }
}

/* q32_impl.h's sp__q32_sum_lanes on a register: the same tree, the same bits */
Q32_INLINE float
q32_sum_lanes(__m256 v)
{
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/*
 * y[t * ldy + r * ys] = dot(weight row r, token t) for r < R, t < T; n / 32 blocks. A last
 * group of fewer than 8 blocks is copied into zeroed buffers first: the padding blocks have
 * scale 0 (activation d = 0, so d * isum = +-0) and add nothing to their lanes.
 */
Q32_INLINE void
q32_tile(int kind, int flavour, int R, int T, int64_t n, const uint8_t *w, size_t ws,
         const uint8_t *x, size_t xs, float *y, int64_t ldy, int64_t ys)
{
    const int64_t nb = n / SP_QK32;
    const size_t wb = q32_wbytes(kind), xb = q32_xbytes(kind);
    __m256 acc[Q32_RM][Q32_TM];
Q32_UNROLL(8)
    for (int r = 0; r < R; r++) {
Q32_UNROLL(8)
        for (int t = 0; t < T; t++) {
            acc[r][t] = _mm256_setzero_ps();
        }
    }
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        q32_group(kind, flavour, R, T, w + (size_t)i * wb, ws, x + (size_t)i * xb, xs, acc);
    }
    if (i < nb) {
        enum { WPAD = 8 * 24, XPAD = 8 * 36 }; /* 8 of the largest blocks (Q5_1, Q8_1) */
        _Static_assert(sizeof(sp_block_q5_1) == 24 && sizeof(sp_block_q8_1) == 36, "pads");
        uint8_t wt[Q32_RM][WPAD], xt[Q32_TM][XPAD];
        const size_t left = (size_t)(nb - i);
        memset(wt, 0, sizeof(wt));
        memset(xt, 0, sizeof(xt));
Q32_UNROLL(8)
        for (int r = 0; r < R; r++) {
            memcpy(wt[r], w + (size_t)r * ws + (size_t)i * wb, left * wb);
        }
Q32_UNROLL(8)
        for (int t = 0; t < T; t++) {
            memcpy(xt[t], x + (size_t)t * xs + (size_t)i * xb, left * xb);
        }
        q32_group(kind, flavour, R, T, wt[0], WPAD, xt[0], XPAD, acc);
    }
Q32_UNROLL(8)
    for (int r = 0; r < R; r++) {
Q32_UNROLL(8)
        for (int t = 0; t < T; t++) {
            y[t * ldy + r * ys] = q32_sum_lanes(acc[r][t]);
        }
    }
}

typedef void (*q32_tile_fn)(int64_t n, const uint8_t *w, size_t ws, const uint8_t *x,
                            size_t xs, float *y, int64_t ldy, int64_t ys);

/* the activations of this many bytes stay in cache while a token chunk is swept by all rows */
#define Q32_X_CHUNK_BYTES (128 * 1024)

/*
 * gemm over rows [r0, r1) and n_tok tokens. A full row tile takes rows q = (r1 - r0) / RM
 * apart, so its RM weight streams are long runs the hardware prefetcher follows; the rows
 * left over go one at a time. Tokens go in tiles of TM within chunks that stay in cache.
 */
Q32_INLINE void
q32_gemm(const q32_tile_fn *full, const q32_tile_fn *single, int64_t n, const void *w,
         size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs, int64_t n_tok, float *y,
         int64_t ldy)
{
    int64_t tc = (int64_t)(Q32_X_CHUNK_BYTES / (xs ? xs : 1)) / Q32_TM * Q32_TM;
    if (tc < Q32_TM) {
        tc = Q32_TM;
    }
    const int64_t q = (r1 - r0) / Q32_RM, rest = r0 + q * Q32_RM;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = t0 + tc < n_tok ? t0 + tc : n_tok;
        for (int64_t r = r0; r < r1;) {
            const bool tiled = r < r0 + q;
            const q32_tile_fn *tiles = tiled ? full : single;
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * ws;
            for (int64_t t = t0; t < t1; t += Q32_TM) {
                const int64_t tn = t1 - t < Q32_TM ? t1 - t : Q32_TM;
                tiles[tn](n, wr, ws * (size_t)q, (const uint8_t *)x + (size_t)t * xs, xs,
                          y + t * ldy + r, ldy, q);
            }
            r = r + 1 == r0 + q ? rest : r + 1;
        }
    }
}

#define Q32_TILE(prefix, kind, flavour, R, T)                                                 \
    static void prefix##_tile_##R##x##T(int64_t n, const uint8_t *w, size_t ws,               \
                                        const uint8_t *x, size_t xs, float *y, int64_t ldy,   \
                                        int64_t ys)                                           \
    {                                                                                         \
        q32_tile(kind, flavour, R, T, n, w, ws, x, xs, y, ldy, ys);                           \
    }

/* vec_dot (the 1 x 1 tile) and gemm functions of one kind and flavour */
#define Q32_DEFINE(prefix, kind, flavour)                                                     \
    Q32_TILE(prefix, kind, flavour, 1, 1) Q32_TILE(prefix, kind, flavour, 1, 2)               \
    Q32_TILE(prefix, kind, flavour, 1, 3) Q32_TILE(prefix, kind, flavour, 1, 4)               \
    Q32_TILE(prefix, kind, flavour, 4, 1) Q32_TILE(prefix, kind, flavour, 4, 2)               \
    Q32_TILE(prefix, kind, flavour, 4, 3) Q32_TILE(prefix, kind, flavour, 4, 4)               \
    static const q32_tile_fn prefix##_tiles[2][Q32_TM + 1] = {                                \
        {NULL, prefix##_tile_1x1, prefix##_tile_1x2, prefix##_tile_1x3, prefix##_tile_1x4},   \
        {NULL, prefix##_tile_4x1, prefix##_tile_4x2, prefix##_tile_4x3, prefix##_tile_4x4},   \
    };                                                                                        \
    static void prefix##_vec_dot(int64_t n, float *s, const void *w, const void *x)           \
    {                                                                                         \
        prefix##_tile_1x1(n, w, 0, x, 0, s, 0, 0);                                            \
    }                                                                                         \
    static void prefix##_gemm(int64_t n, const void *w, size_t w_stride, int64_t r0,          \
                              int64_t r1, const void *x, size_t x_stride, int64_t n_tok,      \
                              float *y, int64_t ldy)                                          \
    {                                                                                         \
        q32_gemm(prefix##_tiles[1], prefix##_tiles[0], n, w, w_stride, r0, r1, x, x_stride,   \
                 n_tok, y, ldy);                                                              \
    }

#endif /* SP_KERNELS_CPU_Q32_X86_H */
