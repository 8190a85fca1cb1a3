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
 * (multiplies and adds, never FMA) and added to the row's sum one block at a time, in order.
 * So the result is the reference's bits, for any number of tokens per call.
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

#define Q32_INLINE static inline __attribute__((always_inline))

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

Q32_INLINE int32_t
q32_hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
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
    for (int k = 0; k < 8; k++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(x + (size_t)k * xb + xo));
        p[k] = q32_dot_avx2(kind, wq[k], xq);
    }
    return q32_reduce8(p);
}

/* The weight's scale (and offset) of one block, as q32_impl.h's contract reads them. */
Q32_INLINE float
q32_wscale(int kind, const uint8_t *blk)
{
    return kind == Q32_MXFP4 ? sp__e8m0_half(blk[0]) : q32_half(blk);
}

_Static_assert(offsetof(sp_block_q4_1, m) == 2 && offsetof(sp_block_q5_1, m) == 2, "m at 2");

Q32_INLINE float
q32_wmin(int kind, const uint8_t *blk)
{
    (void)kind;
    return q32_half(blk + 2);
}

/* d = (weight scale) x (activation scale), in the contract's operand order */
Q32_INLINE float
q32_d(int kind, float dw, float dx)
{
    return kind == Q32_MXFP4 ? dx * dw : dw * dx;
}

Q32_INLINE __m256
q32_d8(int kind, __m256 dw, __m256 dx)
{
    return kind == Q32_MXFP4 ? _mm256_mul_ps(dx, dw) : _mm256_mul_ps(dw, dx);
}

/* The 8 halves at p, p + stride, ..., as floats (exact); built in a register from scalar loads
 * (a vector load of 8 separate stores would stall on store forwarding). */
Q32_INLINE __m256
q32_halves8(const uint8_t *p, size_t stride)
{
    uint16_t h[8];
    for (int k = 0; k < 8; k++) {
        memcpy(&h[k], p + (size_t)k * stride, sizeof(uint16_t));
    }
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3],
                                          (short)h[4], (short)h[5], (short)h[6], (short)h[7]));
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

/*
 * out[t] = dot(weight row w, activation row x + t * x_stride) for t < ntok (1..4), n / 32
 * blocks. The weight blocks are unpacked once per group of 8 and used for every token.
 */
Q32_INLINE void
q32_row(int kind, int flavour, int64_t n, const uint8_t *w, const uint8_t *x, size_t x_stride,
        int ntok, float *out)
{
    const int64_t nb = n / SP_QK32;
    const size_t wb = q32_wbytes(kind), xb = q32_xbytes(kind);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        const uint8_t *wg = w + (size_t)i * wb;
        __m256i wq[8];
        for (int k = 0; k < 8; k++) {
            wq[k] = q32_unpack(kind, wg + (size_t)k * wb);
        }
        const __m256 dw = q32_wscale8(kind, wg);
        /* the offsets m (Q4_1 / Q5_1; both at byte 2 of the block) */
        const __m256 mw = q32_asym(kind) ? q32_halves8(wg + 2, wb) : _mm256_setzero_ps();
        for (int t = 0; t < ntok; t++) {
            const uint8_t *xg = x + (size_t)t * x_stride + (size_t)i * xb;
            const __m256i isum = q32_isum8(kind, flavour, wq, xg);
            const __m256 dx = q32_halves8(xg, xb);
            const __m256 d = q32_d8(kind, dw, dx);
            __m256 blk = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
            if (q32_asym(kind)) {
                const __m256 sx = q32_halves8(xg + offsetof(sp_block_q8_1, s), xb);
                blk = _mm256_add_ps(blk, _mm256_mul_ps(mw, sx));
            }
            float b[8];
            _mm256_storeu_ps(b, blk);
            float a = acc[t];
            for (int k = 0; k < 8; k++) {
                a = a + b[k];
            }
            acc[t] = a;
        }
    }
    for (; i < nb; i++) { /* the last < 8 blocks, one at a time */
        const uint8_t *wbk = w + (size_t)i * wb;
        const __m256i wq = q32_unpack(kind, wbk);
        const float dw = q32_wscale(kind, wbk);
        for (int t = 0; t < ntok; t++) {
            const uint8_t *xbk = x + (size_t)t * x_stride + (size_t)i * xb;
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(xbk + q32_xqs_off(kind)));
            const int32_t isum = q32_hsum_i32(q32_dot_avx2(kind, wq, xq));
            const float d = q32_d(kind, dw, q32_half(xbk));
            float blk = d * (float)isum;
            if (q32_asym(kind)) {
                const float mb = q32_wmin(kind, wbk) * q32_half(xbk + offsetof(sp_block_q8_1, s));
                blk = blk + mb;
            }
            acc[t] = acc[t] + blk;
        }
    }
    for (int t = 0; t < ntok; t++) {
        out[t] = acc[t];
    }
}

/* gemm over rows [r0, r1) and n_tok tokens, 4 tokens per pass over a weight row */
Q32_INLINE void
q32_gemm(int kind, int flavour, int64_t n, const void *w, size_t w_stride, int64_t r0,
         int64_t r1, const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    const uint8_t *wb = w, *xb = x;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t = 0; t < n_tok; t += 4) {
            const int nt = n_tok - t < 4 ? (int)(n_tok - t) : 4;
            float out[4];
            const uint8_t *wr = wb + (size_t)r * w_stride, *xt = xb + (size_t)t * x_stride;
            if (nt == 4) { /* a constant count: the token loop unrolls, sums stay in registers */
                q32_row(kind, flavour, n, wr, xt, x_stride, 4, out);
            } else {
                q32_row(kind, flavour, n, wr, xt, x_stride, nt, out);
            }
            for (int k = 0; k < nt; k++) {
                y[(t + k) * ldy + r] = out[k];
            }
        }
    }
}

/* vec_dot and gemm functions of one kind and flavour */
#define Q32_DEFINE(prefix, kind, flavour)                                                     \
    static void prefix##_vec_dot(int64_t n, float *s, const void *w, const void *x)           \
    {                                                                                         \
        q32_row(kind, flavour, n, w, x, 0, 1, s);                                             \
    }                                                                                         \
    static void prefix##_gemm(int64_t n, const void *w, size_t w_stride, int64_t r0,          \
                              int64_t r1, const void *x, size_t x_stride, int64_t n_tok,      \
                              float *y, int64_t ldy)                                          \
    {                                                                                         \
        q32_gemm(kind, flavour, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);          \
    }

#endif /* SP_KERNELS_CPU_Q32_X86_H */
