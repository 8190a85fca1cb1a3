/*
 * avx2_q32panel.c - AVX2 gemm of MXFP4, Q5_0 (x Q8_0) and Q4_1 (x Q8_1) weights for prefill and
 * batched decode, as row panels: 8 weight rows side by side, so that the exact block sums of the
 * 8 rows come out in the 8 int32 lanes of one register and the float work of a block (scale,
 * convert, add) is one vector operation for 8 rows. The row tiles of q32_x86.h instead fold each
 * (row, token)'s 8 block sums with a horizontal-add tree; this layout needs one VPHADDD per 8
 * rows and block.
 *
 * A panel block is unpacked once into registers and used for every token of a chunk: 8 rows'
 * 16 quant bytes are interleaved into four 32-byte chunks (A: rows 0,1,4,5 bytes 0..7; B: rows
 * 2,3,6,7 bytes 0..7; C and D: the same rows, bytes 8..15); the low nibbles of a chunk are
 * elements 0..7 (or 8..15) of its rows, the high nibbles elements 16..23 (or 24..31), and they
 * meet the token's activation bytes broadcast to the four 64-bit lanes. The weight values are
 * made unsigned by an offset, u = w + off, and the block sum is  sum(u * x) - off * sum(x),
 * sum(x) computed once per token and block: MXFP4 u = doubled E2M1 value + 12 (0..24, a table
 * lookup), Q5_0 u = the stored 5-bit q (0..31, w = q - 16), Q4_1 u = q (0..15, no offset: its
 * minimum meets the Q8_1 block's s in float). VPMADDUBSW pair sums are then at most
 * 2 * 31 * 128 = 7936, so the four products of one row group (A lo, A hi, C lo, C hi) add in
 * int16 (<= 31744 < 2^15) before one VPMADDWD: per 8 rows, token and block, 8 VPMADDUBSW,
 * 2 VPMADDWD and 1 VPHADDD, no sign operations.
 *
 * Numerics: q32_impl.h's contract exactly. The block sum is the exact int32; then, lane-wise for
 * the 8 rows, the contract's float terms (MXFP4 / Q5_0: d = x.d * w's scale, blk = d * isum;
 * Q4_1: plus m * s), acc[i % 8] = acc[i % 8] + blk in block order from +0, and the contract's
 * lane tree at the end: the reference's bits for any token count, chunking or row split (batch
 * invariance). Rows past the last full panel, and calls with fewer tokens than pn_min_tok
 * (decode), go to the row tiles (the same bits).
 *
 * Pure functions, any thread, no heap; about 56 KiB of stack (per-token sums and scales of a
 * token chunk, and its accumulators).
 */
#include <immintrin.h>

#include "kernels/cpu/q32_impl.h"

#define PN_INLINE static inline __attribute__((always_inline))

#define PN_ROWS 8
#define PN_TC 32        /* tokens per chunk: their accumulators (8 KiB) stay in L1 */
#define PN_SCRATCH 4096 /* (token, block) entries of the per-chunk sums and scales */

/* weight kinds (compile-time constants after inlining) */
enum { PN_MXFP4, PN_Q4_1, PN_Q5_0 };

/* Fewer tokens than this go to the row tiles: the panel's unpacking (per block, for all
 * tokens) pays from here on (bench/qgemm_shape_bench.c, K = 2048, on an AVX-512 Zen host at
 * the AVX2 level; MXFP4's grid lookup is the dearest row-tile unpack, so it gains first). */
PN_INLINE int
pn_min_tok(int kind)
{
    return kind == PN_MXFP4 ? 2 : kind == PN_Q5_0 ? 5 : 6;
}

/* The unsigned offset of a kind's values: u = w + offset, isum = sum(u x) - offset sum(x).
 * MXFP4: |w| <= 12 on the doubled E2M1 grid; Q5_0: w = q - 16, u = q (0..31); Q4_1: w = q. */
PN_INLINE int
pn_offset(int kind)
{
    return kind == PN_MXFP4 ? 12 : kind == PN_Q5_0 ? 16 : 0;
}

PN_INLINE size_t
pn_wbytes(int kind)
{
    return kind == PN_MXFP4 ? sizeof(sp_block_mxfp4)
           : kind == PN_Q4_1 ? sizeof(sp_block_q4_1)
                             : sizeof(sp_block_q5_0);
}

PN_INLINE size_t
pn_qs_off(int kind)
{
    return kind == PN_MXFP4 ? offsetof(sp_block_mxfp4, qs)
           : kind == PN_Q4_1 ? offsetof(sp_block_q4_1, qs)
                             : offsetof(sp_block_q5_0, qs);
}

/* Q4_1 pairs with Q8_1 activations (d, s, qs), the others with Q8_0 (d, qs) */
PN_INLINE size_t
pn_xbytes(int kind)
{
    return kind == PN_Q4_1 ? sizeof(sp_block_q8_1) : sizeof(sp_block_q8_0);
}

PN_INLINE size_t
pn_xqs_off(int kind)
{
    return kind == PN_Q4_1 ? offsetof(sp_block_q8_1, qs) : offsetof(sp_block_q8_0, qs);
}

PN_INLINE __m256i
pn_bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi64x(v);
}

PN_INLINE float
pn_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* The halves at p, p + ws, ..., p + 7 ws as floats (lane r = row r; exact). */
PN_INLINE __m256
pn_halves(const uint8_t *p, size_t ws)
{
    uint16_t h[PN_ROWS];
    for (int r = 0; r < PN_ROWS; r++)
        memcpy(&h[r], p + (size_t)r * ws, sizeof h[r]);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* The weight scale of 8 rows (lane r = row r): e8m0_half(e) as q32_x86.h's q32_wscale8 for
 * MXFP4, the fp16 d otherwise. */
PN_INLINE __m256
pn_wscale(int kind, const uint8_t *w, size_t ws)
{
    if (kind != PN_MXFP4)
        return pn_halves(w, ws); /* d at byte 0 of Q4_1 and Q5_0 */
    const __m256i e = _mm256_setr_epi32(w[0], w[ws], w[2 * ws], w[3 * ws], w[4 * ws], w[5 * ws],
                                        w[6 * ws], w[7 * ws]);
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i den = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i big = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(den, norm, big));
}

/* Q5_0's fifth bits for one chunk half: byte j of 64-bit lane l gets bit j of byte sel of the
 * qh word of the lane's row (qv: the 8 rows' qh words, rows 0..3 in the low 128-bit lane, 4..7
 * in the high one), as 0x10 or 0. */
PN_INLINE __m256i
pn_q5_bits(__m256i qv, int b0, int b1)
{
    const __m256i sel = _mm256_setr_epi64x((int64_t)0x0101010101010101ll * b0,
                                           (int64_t)0x0101010101010101ll * b1,
                                           (int64_t)0x0101010101010101ll * b0,
                                           (int64_t)0x0101010101010101ll * b1);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i h = _mm256_and_si256(_mm256_shuffle_epi8(qv, sel), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(h, bit), _mm256_set1_epi8(0x10));
}

/*
 * One panel (8 rows from w, ws bytes apart) x nt tokens (x, xs bytes apart), all nb blocks.
 * Per (token, block) entry e = t * nb + b: corr[e] = offset * the block's sum of quants, xd[e]
 * its scale, xs_[e] (Q4_1) the Q8_1 block's s. Writes y[t * ldy + 0..7].
 */
PN_INLINE void
pn_panel(int kind, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *x, size_t xs,
         int nt, const int32_t *corr, const float *xd, const float *xsv, float *y, int64_t ldy)
{
    const size_t wbs = pn_wbytes(kind), xbs = pn_xbytes(kind);
    __m256 acc[PN_TC][SP_Q32_LANES];
    for (int t = 0; t < nt; t++)
        for (int l = 0; l < SP_Q32_LANES; l++)
            acc[t][l] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    int8_t ut[16];
    for (int i = 0; i < 16; i++)
        ut[i] = (int8_t)(sp__kvalues_mxfp4[i] + pn_offset(PN_MXFP4));
    const __m128i lut128 = _mm_loadu_si128((const __m128i *)ut);
    const __m256i lut = _mm256_set_m128i(lut128, lut128);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + (size_t)b * wbs;
        __m128i q[PN_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < PN_ROWS; r++)
            q[r] = _mm_loadu_si128((const __m128i *)(wb + (size_t)r * ws + pn_qs_off(kind)));
        /* chunk c of the 4, half h: u[2 c + h]; A = rows 0,1,4,5 bytes 0..7, B = rows 2,3,6,7
         * bytes 0..7, C and D = the same rows, bytes 8..15; low nibbles are elements j (A, B)
         * or 8 + j (C, D), high nibbles 16 more */
        const __m256i ch[4] = {
            _mm256_set_m128i(_mm_unpacklo_epi64(q[4], q[5]), _mm_unpacklo_epi64(q[0], q[1])),
            _mm256_set_m128i(_mm_unpacklo_epi64(q[6], q[7]), _mm_unpacklo_epi64(q[2], q[3])),
            _mm256_set_m128i(_mm_unpackhi_epi64(q[4], q[5]), _mm_unpackhi_epi64(q[0], q[1])),
            _mm256_set_m128i(_mm_unpackhi_epi64(q[6], q[7]), _mm_unpackhi_epi64(q[2], q[3])),
        };
        __m256i u[8];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            u[2 * c] = _mm256_and_si256(ch[c], m4);
            u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(ch[c], 4), m4);
        }
        if (kind == PN_MXFP4) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                u[i] = _mm256_shuffle_epi8(lut, u[i]);
        } else if (kind == PN_Q5_0) {
            uint32_t qh[PN_ROWS];
            for (int r = 0; r < PN_ROWS; r++)
                memcpy(&qh[r], wb + (size_t)r * ws + offsetof(sp_block_q5_0, qh), 4);
            const __m256i qv = _mm256_loadu_si256((const __m256i *)qh);
            /* qh byte k of row r sits at byte 4 (r % 4) + k of its 128-bit lane; elements
             * 0..7 / 8..15 / 16..23 / 24..31 are qh bytes 0 / 1 / 2 / 3 */
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const int row0 = c % 2 ? 8 : 0, k0 = c / 2; /* B, D: rows 2, 3 (6, 7) */
                u[2 * c] = _mm256_or_si256(u[2 * c], pn_q5_bits(qv, row0 + k0, row0 + 4 + k0));
                u[2 * c + 1] = _mm256_or_si256(u[2 * c + 1],
                                               pn_q5_bits(qv, row0 + k0 + 2, row0 + 6 + k0));
            }
        }
        const __m256 dw = pn_wscale(kind, wb, ws);
        const __m256 mw = kind == PN_Q4_1 ? pn_halves(wb + offsetof(sp_block_q4_1, m), ws)
                                          : _mm256_setzero_ps();
        const int lane = (int)(b % SP_Q32_LANES);
        for (int t = 0; t < nt; t++) {
            const int8_t *xq =
                (const int8_t *)(x + (size_t)t * xs + (size_t)b * xbs + pn_xqs_off(kind));
            const __m256i x0 = pn_bcast8(xq), x1 = pn_bcast8(xq + 8);
            const __m256i x2 = pn_bcast8(xq + 16), x3 = pn_bcast8(xq + 24);
            const __m256i sa = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(u[0], x0), _mm256_maddubs_epi16(u[1], x2)),
                _mm256_add_epi16(_mm256_maddubs_epi16(u[4], x1), _mm256_maddubs_epi16(u[5], x3)));
            const __m256i sb = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(u[2], x0), _mm256_maddubs_epi16(u[3], x2)),
                _mm256_add_epi16(_mm256_maddubs_epi16(u[6], x1), _mm256_maddubs_epi16(u[7], x3)));
            /* lanes: rows 0..3 in the low half, 4..7 in the high half */
            __m256i isum = _mm256_hadd_epi32(_mm256_madd_epi16(sa, ones),
                                             _mm256_madd_epi16(sb, ones));
            const int64_t e = (int64_t)t * nb + b;
            if (pn_offset(kind) != 0)
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(corr[e]));
            /* q32_impl.h: MXFP4 d = x.d * w; the others d = w.d * x.d (the same product) */
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(xd[e]), dw);
            __m256 blk = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
            if (kind == PN_Q4_1)
                blk = _mm256_add_ps(blk, _mm256_mul_ps(mw, _mm256_set1_ps(xsv[e])));
            acc[t][lane] = _mm256_add_ps(acc[t][lane], blk);
        }
    }
    for (int t = 0; t < nt; t++) {
        const __m256 *a = acc[t];
        const __m256 b0 = _mm256_add_ps(a[0], a[4]), b1 = _mm256_add_ps(a[1], a[5]);
        const __m256 b2 = _mm256_add_ps(a[2], a[6]), b3 = _mm256_add_ps(a[3], a[7]);
        const __m256 c0 = _mm256_add_ps(b0, b2), c1 = _mm256_add_ps(b1, b3);
        _mm256_storeu_ps(y + t * ldy, _mm256_add_ps(c0, c1));
    }
}

/* offset * sum(q), the scale (and Q8_1's s) of every block of nt tokens: the panels'
 * per-token inputs, computed once for all the panels of a chunk */
PN_INLINE void
pn_token_sums(int kind, int64_t nb, const uint8_t *x, size_t xs, int nt, int32_t *corr,
              float *xd, float *xsv)
{
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int t = 0; t < nt; t++) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = x + (size_t)t * xs + (size_t)b * pn_xbytes(kind);
            const int64_t e = (int64_t)t * nb + b;
            xd[e] = pn_half(blk); /* d first in Q8_0 and Q8_1 */
            if (kind == PN_Q4_1) {
                xsv[e] = pn_half(blk + offsetof(sp_block_q8_1, s));
                continue;
            }
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + pn_xqs_off(kind)));
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);
            __m128i f = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            f = _mm_add_epi32(f, _mm_shuffle_epi32(f, 0x4E));
            f = _mm_add_epi32(f, _mm_shuffle_epi32(f, 0xB1));
            corr[e] = pn_offset(kind) * _mm_cvtsi128_si32(f);
        }
    }
}

PN_INLINE void
pn_gemm(int kind, sp_gemm_fn rows, int64_t n, const void *w, size_t w_stride, int64_t r0,
        int64_t r1, const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    const int64_t nb = n / SP_QK32;
    const int64_t np = (r1 - r0) / PN_ROWS;
    if (n_tok < pn_min_tok(kind) || np == 0 || nb == 0 || nb > PN_SCRATCH) {
        rows(n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        return;
    }
    int32_t corr[PN_SCRATCH];
    float xd[PN_SCRATCH], xsv[PN_SCRATCH];
    const int64_t tcap = PN_SCRATCH / nb;
    const int tc = (int)(tcap < PN_TC ? tcap : PN_TC);
    const uint8_t *wb = w, *xb = x;
    for (int64_t c0 = 0; c0 < n_tok; c0 += tc) {
        const int nt = n_tok - c0 < tc ? (int)(n_tok - c0) : tc;
        const uint8_t *xc = xb + (size_t)c0 * x_stride;
        pn_token_sums(kind, nb, xc, x_stride, nt, corr, xd, xsv);
        for (int64_t p = 0; p < np; p++) {
            const int64_t r = r0 + p * PN_ROWS;
            pn_panel(kind, nb, wb + (size_t)r * w_stride, w_stride, xc, x_stride, nt, corr, xd,
                     xsv, y + c0 * ldy + r, ldy);
        }
    }
    const int64_t rp = r0 + np * PN_ROWS;
    if (rp < r1)
        rows(n, w, w_stride, rp, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__q32_panel_gemm_avx2(sp_type_t type, sp_gemm_fn rows, int64_t n, const void *w,
                        size_t w_stride, int64_t r0, int64_t r1, const void *x, size_t x_stride,
                        int64_t n_tok, float *y, int64_t ldy)
{
    switch (type) {
    case SP_TYPE_MXFP4:
        pn_gemm(PN_MXFP4, rows, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        break;
    case SP_TYPE_Q4_1:
        pn_gemm(PN_Q4_1, rows, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        break;
    case SP_TYPE_Q5_0:
        pn_gemm(PN_Q5_0, rows, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        break;
    default: /* no panel for this type: the row tiles do it all */
        rows(n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        break;
    }
}

#define PN_DEFINE(name, type, rows)                                                             \
    void name(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1, const void *x, \
              size_t x_stride, int64_t n_tok, float *y, int64_t ldy)                            \
    {                                                                                           \
        sp__q32_panel_gemm_avx2(type, rows, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy); \
    }

PN_DEFINE(sp__q32_mxfp4_gemm_avx2_panel, SP_TYPE_MXFP4, sp__q32_mxfp4_gemm_avx2_prev)
PN_DEFINE(sp__q32_q4_1_gemm_avx2_panel, SP_TYPE_Q4_1, sp__q32_q4_1_gemm_avx2_prev)
PN_DEFINE(sp__q32_q5_0_gemm_avx2_panel, SP_TYPE_Q5_0, sp__q32_q5_0_gemm_avx2_prev)

void
sp__q32_panels_register_avx2(sp_cpu_kernels_t *k)
{
    k->gemm[SP_TYPE_MXFP4] = sp__q32_mxfp4_gemm_avx2_panel;
    k->gemm[SP_TYPE_Q4_1] = sp__q32_q4_1_gemm_avx2_panel;
    k->gemm[SP_TYPE_Q5_0] = sp__q32_q5_0_gemm_avx2_panel;
}
