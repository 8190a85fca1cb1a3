/*
 * avx2_q32panel.c - AVX2 gemm of MXFP4 weights x Q8_0 activations (prefill and batched decode)
 * as row panels: 8 weight rows side by side, so that the exact block sums of the 8 rows come out
 * in the 8 int32 lanes of one register and the float work of a block (scale, convert, add) is one
 * vector operation for 8 rows. The row tiles of q32_x86.h instead fold each (row, token)'s 8
 * block sums with a horizontal-add tree; this layout needs one VPHADDD per 8 rows and block.
 *
 * A panel block is unpacked once into registers and used for every token of a chunk: 8 rows'
 * 16 quant bytes are interleaved into four 32-byte chunks (A: rows 0,1,4,5 bytes 0..7; B: rows
 * 2,3,6,7 bytes 0..7; C and D: the same rows, bytes 8..15); the low nibbles of a chunk are
 * elements 0..7 (or 8..15) of its rows, the high nibbles elements 16..23 (or 24..31), and they
 * meet the token's activation bytes broadcast to the four 64-bit lanes. The E2M1 values are
 * made unsigned by an offset: u = w + 12 (0..24, w the doubled grid of q32_impl.h), and the
 * block sum is  sum(u * x) - 12 * sum(x),  sum(x) computed once per token and block. VPMADDUBSW
 * pair sums are then at most 2 * 24 * 128 = 6144, so the four products of one row group (A lo,
 * A hi, C lo, C hi) add in int16 (<= 24576 < 2^15) before one VPMADDWD: per 8 rows, token and
 * block, 8 VPMADDUBSW, 2 VPMADDWD and 1 VPHADDD, no sign operations.
 *
 * Numerics: q32_impl.h's contract exactly. The block sum is the exact int32; then, lane-wise for
 * the 8 rows, d = fp16(x.d) * e8m0_half(w.e), blk = d * (float)isum, acc[i % 8] = acc[i % 8] +
 * blk in block order from +0, and the contract's lane tree at the end: the reference's bits for
 * any token count, chunking or row split (batch invariance). Rows past the last full panel, and
 * calls with fewer than PN_MIN_TOK tokens (decode), go to the row tiles (the same bits).
 *
 * Pure function, any thread, no heap; about 40 KiB of stack (per-token sums and scales of a
 * token chunk, and its accumulators).
 */
#include <immintrin.h>

#include "kernels/cpu/q32_impl.h"

#define PN_INLINE static inline __attribute__((always_inline))

#define PN_ROWS 8
#define PN_TC 32        /* tokens per chunk: their accumulators (8 KiB) stay in L1 */
#define PN_SCRATCH 4096 /* (token, block) entries of the per-chunk sums and scales */
#define PN_MIN_TOK 4    /* fewer tokens: the row tiles (decode keeps its streaming kernel) */
#define PN_OFFSET 12    /* |w| <= 12 on the doubled E2M1 grid */

PN_INLINE __m256i
pn_bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi64x(v);
}

/* e8m0_half of the exponent bytes of 8 rows (lane r = row r), as q32_x86.h's q32_wscale8 */
PN_INLINE __m256
pn_wscale(const uint8_t *w, size_t ws)
{
    const __m256i e = _mm256_setr_epi32(w[0], w[ws], w[2 * ws], w[3 * ws], w[4 * ws], w[5 * ws],
                                        w[6 * ws], w[7 * ws]);
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i den = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i big = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(den, norm, big));
}

/*
 * One panel (8 rows from w, ws bytes apart) x nt tokens (x, xs bytes apart), all nb blocks.
 * corr[t * nb + b] = 12 * sum of token t's block b quants, xd[t * nb + b] = its scale. Writes
 * y[t * ldy + 0..7].
 */
static void
pn_panel(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *x, size_t xs, int nt,
         const int32_t *corr, const float *xd, float *y, int64_t ldy)
{
    __m256 acc[PN_TC][SP_Q32_LANES];
    for (int t = 0; t < nt; t++)
        for (int l = 0; l < SP_Q32_LANES; l++)
            acc[t][l] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    int8_t ut[16];
    for (int i = 0; i < 16; i++)
        ut[i] = (int8_t)(sp__kvalues_mxfp4[i] + PN_OFFSET);
    const __m128i lut128 = _mm_loadu_si128((const __m128i *)ut);
    const __m256i lut = _mm256_set_m128i(lut128, lut128);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + (size_t)b * sizeof(sp_block_mxfp4);
        __m128i q[PN_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < PN_ROWS; r++)
            q[r] = _mm_loadu_si128(
                (const __m128i *)(wb + (size_t)r * ws + offsetof(sp_block_mxfp4, qs)));
        const __m256i ca = _mm256_set_m128i(_mm_unpacklo_epi64(q[4], q[5]),
                                            _mm_unpacklo_epi64(q[0], q[1]));
        const __m256i cb = _mm256_set_m128i(_mm_unpacklo_epi64(q[6], q[7]),
                                            _mm_unpacklo_epi64(q[2], q[3]));
        const __m256i cc = _mm256_set_m128i(_mm_unpackhi_epi64(q[4], q[5]),
                                            _mm_unpackhi_epi64(q[0], q[1]));
        const __m256i cd = _mm256_set_m128i(_mm_unpackhi_epi64(q[6], q[7]),
                                            _mm_unpackhi_epi64(q[2], q[3]));
        /* unsigned values: lo = elements j, hi = elements j + 16 */
        const __m256i alo = _mm256_shuffle_epi8(lut, _mm256_and_si256(ca, m4));
        const __m256i ahi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(ca, 4), m4));
        const __m256i blo = _mm256_shuffle_epi8(lut, _mm256_and_si256(cb, m4));
        const __m256i bhi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(cb, 4), m4));
        const __m256i clo = _mm256_shuffle_epi8(lut, _mm256_and_si256(cc, m4));
        const __m256i chi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(cc, 4), m4));
        const __m256i dlo = _mm256_shuffle_epi8(lut, _mm256_and_si256(cd, m4));
        const __m256i dhi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(cd, 4), m4));
        const __m256 dw = pn_wscale(wb, ws);
        const int lane = (int)(b % SP_Q32_LANES);
        for (int t = 0; t < nt; t++) {
            const int8_t *xq = (const int8_t *)(x + (size_t)t * xs +
                                                (size_t)b * sizeof(sp_block_q8_0) +
                                                offsetof(sp_block_q8_0, qs));
            const __m256i x0 = pn_bcast8(xq), x1 = pn_bcast8(xq + 8);
            const __m256i x2 = pn_bcast8(xq + 16), x3 = pn_bcast8(xq + 24);
            const __m256i sa = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(alo, x0), _mm256_maddubs_epi16(ahi, x2)),
                _mm256_add_epi16(_mm256_maddubs_epi16(clo, x1), _mm256_maddubs_epi16(chi, x3)));
            const __m256i sb = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(blo, x0), _mm256_maddubs_epi16(bhi, x2)),
                _mm256_add_epi16(_mm256_maddubs_epi16(dlo, x1), _mm256_maddubs_epi16(dhi, x3)));
            /* lanes: rows 0..3 in the low half, 4..7 in the high half */
            const __m256i h = _mm256_hadd_epi32(_mm256_madd_epi16(sa, ones),
                                                _mm256_madd_epi16(sb, ones));
            const int64_t e = (int64_t)t * nb + b;
            const __m256i isum = _mm256_sub_epi32(h, _mm256_set1_epi32(corr[e]));
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(xd[e]), dw);
            const __m256 blk = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
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

/* 12 * sum(q) and the scale of every block of nt tokens (the panels' per-token inputs) */
static void
pn_token_sums(int64_t nb, const uint8_t *x, size_t xs, int nt, int32_t *corr, float *xd)
{
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int t = 0; t < nt; t++) {
        for (int64_t b = 0; b < nb; b++) {
            const sp_block_q8_0 *blk =
                (const sp_block_q8_0 *)(x + (size_t)t * xs + (size_t)b * sizeof(sp_block_q8_0));
            const __m256i v = _mm256_loadu_si256((const __m256i *)blk->qs);
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);
            __m128i f = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            f = _mm_add_epi32(f, _mm_shuffle_epi32(f, 0x4E));
            f = _mm_add_epi32(f, _mm_shuffle_epi32(f, 0xB1));
            corr[(int64_t)t * nb + b] = PN_OFFSET * _mm_cvtsi128_si32(f);
            xd[(int64_t)t * nb + b] = _cvtsh_ss(blk->d);
        }
    }
}

void
sp__q32_mxfp4_gemm_avx2_panel(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy)
{
    const int64_t nb = n / SP_QK32;
    const int64_t np = (r1 - r0) / PN_ROWS;
    if (n_tok < PN_MIN_TOK || np == 0 || nb == 0 || nb > PN_SCRATCH) {
        sp__q32_mxfp4_gemm_avx2_prev(n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        return;
    }
    int32_t corr[PN_SCRATCH];
    float xd[PN_SCRATCH];
    const int64_t tcap = PN_SCRATCH / nb;
    const int tc = (int)(tcap < PN_TC ? tcap : PN_TC);
    const uint8_t *wb = w, *xb = x;
    for (int64_t c0 = 0; c0 < n_tok; c0 += tc) {
        const int nt = n_tok - c0 < tc ? (int)(n_tok - c0) : tc;
        const uint8_t *xc = xb + (size_t)c0 * x_stride;
        pn_token_sums(nb, xc, x_stride, nt, corr, xd);
        for (int64_t p = 0; p < np; p++) {
            const int64_t r = r0 + p * PN_ROWS;
            pn_panel(nb, wb + (size_t)r * w_stride, w_stride, xc, x_stride, nt, corr, xd,
                     y + c0 * ldy + r, ldy);
        }
    }
    const int64_t rp = r0 + np * PN_ROWS;
    if (rp < r1)
        sp__q32_mxfp4_gemm_avx2_prev(n, w, w_stride, rp, r1, x, x_stride, n_tok, y, ldy);
}
