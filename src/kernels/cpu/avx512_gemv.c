/*
 * avx512_gemv.c - Q4_0 and Q8_0 weights x one Q8_0 token (batch-1 decode) with AVX-512
 * VNNI, straight from the file's row layout, at the memory's read rate.
 *
 * Why a kernel of its own: the row panels of avx512_qgemm.c put 16 rows in the 16 lanes
 * of a register, which costs a 16 x 4-byte transpose and a scale gather per block; with one
 * token nothing amortises them and the kernel ran at about 34 GB/s per core on cached
 * weights, under the 40 GB/s per core that two threads need to follow the memory of a
 * Zen 5 (bench/decode_bench.c, docs/design.md). Here each row is read as it lies:
 *
 *   one step = 4 blocks (72 bytes) of each of 4 rows. Per row a 64-byte load and an 8-byte
 *   load hold the 4 blocks; one vpermt2w moves their 4 x 16 quant bytes (at even offsets:
 *   18-byte blocks, 2-byte scale first) into the four 128-bit lanes; the low and high
 *   nibbles (elements 0..15 and 16..31) meet the token's matching 16 bytes of each block in
 *   two vpdpbusd. A 4 x 4 transpose-and-add over the 4 rows' registers leaves, in dword
 *   4b + r, row r's exact int32 sum for block b; the seed -8 * sum(x_b) makes it the
 *   reference's isum. A masked vpermw per row collects the 4 rows' block scales in the same
 *   lane order.
 *   Q8_0 (34-byte blocks): per row two 68-byte halves of 2 blocks, each one vpermt2w of its
 *   64 quant bytes, made unsigned (x ^ 0x80 = x + 128, seed -128 * sum(x_b)) and one
 *   vpdpbusd against the token's 2 blocks; the same transpose-add per half, then one
 *   lane-pair add leaves the same (block, row) lanes.
 *
 * Numerics: the scalar reference's, bit for bit (so gemm == vec_dot == reference, every
 * level, any split): per block the exact integer sum, d = d_w * d_x in float, p = isum * d
 * in float, and per row sum = sum + p over the blocks in order, starting from +0.0 (four
 * dependent scalar-lane adds per step, one per block; a K chunk's partial sums go through y,
 * a float store and reload being exact). No FMA anywhere.
 *
 * Only n_tok == 1 takes this path: avx512_qgemm.c's gemm entries call it for one token and
 * keep every call with more tokens on their panels (no table state of its own here).
 * Prefetch: while 8 rows are computed, the next 8 rows' bytes are fetched, one line per
 * prefetch spread evenly over the steps (one panel ahead, as the panels' decode path did).
 */
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define SP_INLINE static inline __attribute__((always_inline))

#define GV_KC 1024   /* blocks per K chunk: activation records of 64 KiB on the stack */
#define GV_REC 256   /* bytes of activation record per 4 blocks (see prep) */
#define GV_ROWS 8    /* rows per step: two groups of 4 */

enum { WT_Q4_0, WT_Q8_0 };

/*
 * Blocks [b0, b0 + nbk) of the token as records of 4 blocks: 128 bytes of quants (Q4_0:
 * bytes 0..15 of each block, then bytes 16..31 of each, to meet the low and high nibbles;
 * Q8_0: the 4 blocks' 32 bytes in order), the seed -c * sum(q) of block b in dwords 4b..4b+3
 * (c = 8 for Q4_0's nibble offset, 128 for Q8_0's sign flip), the scale d_x(b) as float in
 * lanes 4b..4b+3. A last partial record has zero quants, seeds and scales past the end.
 */
SP_INLINE void
prep(const int wt, const sp_block_q8_0 *x, int64_t b0, int64_t nbk, uint8_t *xr)
{
    const int32_t c = wt == WT_Q8_0 ? 128 : 8;
    const __m128i flip = _mm_set1_epi8((char)0x80);
    for (int64_t g = 0; g < (nbk + 3) / 4; g++) {
        uint8_t *o = xr + g * GV_REC;
        int32_t seed[16];
        float dx[16];
        for (int b = 0; b < 4; b++) {
            const int64_t j = g * 4 + b;
            __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128();
            int32_t s = 0;
            float d = 0.0f;
            if (j < nbk) {
                const sp_block_q8_0 *xb = x + b0 + j;
                lo = _mm_loadu_si128((const __m128i *)xb->qs);
                hi = _mm_loadu_si128((const __m128i *)(xb->qs + 16));
                /* sum of signed bytes = sum of (q + 128) - 32 * 128, via vpsadbw */
                __m128i sl = _mm_sad_epu8(_mm_xor_si128(lo, flip), _mm_setzero_si128());
                __m128i sh = _mm_sad_epu8(_mm_xor_si128(hi, flip), _mm_setzero_si128());
                __m128i t = _mm_add_epi64(sl, sh);
                t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
                s = -c * ((int32_t)_mm_cvtsi128_si32(t) - 32 * 128);
                d = _cvtsh_ss(xb->d);
            }
            if (wt == WT_Q4_0) {
                _mm_storeu_si128((__m128i *)(o + 16 * b), lo);
                _mm_storeu_si128((__m128i *)(o + 64 + 16 * b), hi);
            } else {
                _mm_storeu_si128((__m128i *)(o + 32 * b), lo);
                _mm_storeu_si128((__m128i *)(o + 32 * b + 16), hi);
            }
            for (int r = 0; r < 4; r++) {
                seed[4 * b + r] = s;
                dx[4 * b + r] = d;
            }
        }
        memcpy(o + 128, seed, sizeof seed);
        memcpy(o + 192, dx, sizeof dx);
    }
}

/* 4 blocks of one row at p (nvalid of them real): dword 4i + k of lane b holds bytes
 * 4k..4k+3 of block b's quants times the token, low and high nibbles together. Also the
 * row's 4 raw 64 bytes (for the scales). */
SP_INLINE __m512i
row_step(const uint8_t *p, int nvalid, const __m512i qidx, const __m512i xlo, const __m512i xhi,
         __m512i *raw)
{
    __m512i a, b;
    if (nvalid == 4) {
        a = _mm512_loadu_si512((const void *)p);
        b = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(p + 64)));
    } else {
        /* a short last step: only the real bytes are read (masked loads never fault) */
        const int bytes = 18 * nvalid;
        a = _mm512_maskz_loadu_epi8(bytes >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << bytes) - 1, p);
        b = _mm512_setzero_si512();
    }
    *raw = a;
    const __m512i q = _mm512_permutex2var_epi16(a, qidx, b);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i lo = _mm512_and_si512(q, m4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo), hi, xhi);
}

/* Two Q8_0 blocks (nbytes <= 68 real bytes) of one row at p against the token's 64 quant
 * bytes x: lanes 0-1 hold block 0's 8 partial sums, lanes 2-3 block 1's. The raw first 64
 * bytes and the last 4 (for the scales) are kept. */
SP_INLINE __m512i
q8_half(const uint8_t *p, int nbytes, const __m512i qidx, const __m512i x, __m512i *raw,
        __m512i *tail)
{
    __m512i a, b;
    if (nbytes == 68) {
        int32_t t;
        memcpy(&t, p + 64, sizeof t);
        a = _mm512_loadu_si512((const void *)p);
        b = _mm512_castsi128_si512(_mm_cvtsi32_si128(t));
    } else if (nbytes > 0) {
        a = _mm512_maskz_loadu_epi8(((__mmask64)1 << nbytes) - 1, p);
        b = _mm512_setzero_si512();
    } else {
        a = b = _mm512_setzero_si512();
    }
    *raw = a;
    *tail = b;
    const __m512i q = _mm512_xor_si512(_mm512_permutex2var_epi16(a, qidx, b),
                                       _mm512_set1_epi8((char)0x80));
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x);
}

/* Four registers of 16 dwords (one per row) -> dword r of each 128-bit lane L: the sum of
 * register r's 4 dwords in lane L (exact integer adds). */
SP_INLINE __m512i
transpose_add(const __m512i v[4])
{
    const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]),
                                         _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]),
                                         _mm512_unpackhi_epi32(v[2], v[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

/* The Q8_0 step: 4 rows x 4 blocks (nvalid real) from offset off. */
SP_INLINE __m512
q8_group_step(const uint8_t *const *rp, size_t off, int nvalid, const __m512i qidx,
              const __m512i didx, const uint8_t *r, const __m512i seed, const __m512 dx)
{
    const __m512i xa = _mm512_loadu_si512((const void *)r);
    const __m512i xb = _mm512_loadu_si512((const void *)(r + 64));
    const int na = nvalid >= 2 ? 68 : 34 * nvalid, nb = nvalid > 2 ? 34 * (nvalid - 2) : 0;
    __m512i va[4], vb[4], d16 = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512i ra, ta, rb, tb;
        va[i] = q8_half(rp[i] + off, na, qidx, xa, &ra, &ta);
        vb[i] = q8_half(rp[i] + off + 68, nb, qidx, xb, &rb, &tb);
        (void)ta;
        (void)tb;
        /* word 4b + i <- block b's d: words 0 and 17 of the first half, of the second */
        d16 = _mm512_mask_blend_epi16((__mmask32)(0x1111u << i), d16,
                                      _mm512_permutex2var_epi16(ra, didx, rb));
    }
    const __m512i ua = transpose_add(va), ub = transpose_add(vb);
    /* lanes (2k, 2k + 1) of ua / ub are block k's (ub: block 2 + k) two halves */
    __m512i isum = _mm512_add_epi32(_mm512_shuffle_i32x4(ua, ub, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_i32x4(ua, ub, _MM_SHUFFLE(3, 1, 3, 1)));
    isum = _mm512_add_epi32(isum, seed);
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(d16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx));
}

/* 4 rows rp[0..3] from block offset off: float products p of (row r, block b) in lane
 * 4b + r, the reference's (float)isum * (d_w * d_x). */
SP_INLINE __m512
group_step(const uint8_t *const *rp, size_t off, int nvalid, const __m512i qidx,
           const __m512i didx, const __m512i xlo, const __m512i xhi, const __m512i seed,
           const __m512 dx)
{
    __m512i raw[4], v[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        v[r] = row_step(rp[r] + off, nvalid, qidx, xlo, xhi, &raw[r]);
    }
    /* lane b of v[r] = 4 partial sums of row r, block b -> dword r of lane b: their sum */
    const __m512i isum = _mm512_add_epi32(transpose_add(v), seed);
    /* the scales: word 4b + r <- word 9b of row r's bytes (block b's d) */
    __m512i dw16 = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        dw16 = _mm512_mask_permutexvar_epi16(dw16, (__mmask32)(0x1111u << r), didx, raw[r]);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(dw16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx));
}

/* sum_r += p(r, b) for b = 0 .. nvalid - 1 in order (row r in lane r of acc). */
SP_INLINE __m128
acc_add(__m128 acc, __m512 p, int nvalid)
{
    acc = _mm_add_ps(acc, _mm512_castps512_ps128(p));
    if (nvalid > 1) {
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(p, 1));
    }
    if (nvalid > 2) {
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(p, 2));
    }
    if (nvalid > 3) {
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(p, 3));
    }
    return acc;
}

/* Rows rp[0..7] over nbk blocks from b0 (records at xr), y[0..7] (nr real rows) updated:
 * started from +0.0, or from y when cont. Prefetches next_bytes from next (the rows after). */
SP_INLINE void
rows8(const int wt, const uint8_t *const rp[GV_ROWS], int64_t b0, int64_t nbk, const uint8_t *xr,
      float *y, int nr, bool cont, const uint8_t *next, size_t next_bytes)
{
    /* Q4_0: word 8b + j <- word 9b + 1 + j (block b's quant bytes of the 72-byte window);
     * Q8_0: word 16b + j <- word 17b + 1 + j (of a 68-byte half). Scales: word 4b + r <-
     * block b's d (Q4_0: word 9b; Q8_0: words 0 and 17 of each half, the second half's
     * from 32 on). */
    const __m512i qidx =
        wt == WT_Q4_0
            ? _mm512_set_epi16(35, 34, 33, 32, 31, 30, 29, 28, 26, 25, 24, 23, 22, 21, 20, 19, 17,
                               16, 15, 14, 13, 12, 11, 10, 8, 7, 6, 5, 4, 3, 2, 1)
            : _mm512_set_epi16(33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 16,
                               15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i didx =
        wt == WT_Q4_0
            ? _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 27, 27, 27, 27, 18,
                               18, 18, 18, 9, 9, 9, 9, 0, 0, 0, 0)
            : _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 49, 49, 49, 49, 32,
                               32, 32, 32, 17, 17, 17, 17, 0, 0, 0, 0);
    const size_t bsz = wt == WT_Q4_0 ? sizeof(sp_block_q4_0) : sizeof(sp_block_q8_0);
    const __mmask8 m = (__mmask8)((1u << nr) - 1);
    __m128 acc0, acc1;
    if (cont) {
        acc0 = _mm_maskz_loadu_ps(m & 0xf, y);
        acc1 = _mm_maskz_loadu_ps(m >> 4, y + 4);
    } else {
        acc0 = acc1 = _mm_setzero_ps();
    }
    /* The next rows' bytes, one line per prefetch, spread over this call's steps so the
     * streams are in flight before they are needed (past the matrix end a prefetch points
     * outside it, which never faults). */
    const int64_t steps = (nbk + 3) / 4;
    const size_t pf_step = (next_bytes / (size_t)steps + 63) & ~(size_t)63;
    uintptr_t pf = (uintptr_t)next, pf_end = (uintptr_t)next + next_bytes;
    for (int64_t g = 0; g < steps; g++) {
        const int nvalid = nbk - 4 * g >= 4 ? 4 : (int)(nbk - 4 * g);
        for (size_t l = 0; l < pf_step && pf < pf_end; l += 64, pf += 64) {
            _mm_prefetch((const char *)pf, _MM_HINT_T0);
        }
        const uint8_t *r = xr + g * GV_REC;
        const __m512i seed = _mm512_loadu_si512((const void *)(r + 128));
        const __m512 dx = _mm512_loadu_ps((const void *)(r + 192));
        const size_t off = (size_t)(b0 + 4 * g) * bsz;
        if (wt == WT_Q8_0) {
            if (nvalid == 4) {
                acc0 = acc_add(acc0, q8_group_step(rp, off, 4, qidx, didx, r, seed, dx), 4);
                acc1 = acc_add(acc1, q8_group_step(rp + 4, off, 4, qidx, didx, r, seed, dx), 4);
            } else {
                acc0 = acc_add(acc0, q8_group_step(rp, off, nvalid, qidx, didx, r, seed, dx),
                               nvalid);
                acc1 = acc_add(acc1, q8_group_step(rp + 4, off, nvalid, qidx, didx, r, seed, dx),
                               nvalid);
            }
            continue;
        }
        const __m512i xlo = _mm512_loadu_si512((const void *)r);
        const __m512i xhi = _mm512_loadu_si512((const void *)(r + 64));
        if (nvalid == 4) {
            acc0 = acc_add(acc0, group_step(rp, off, 4, qidx, didx, xlo, xhi, seed, dx), 4);
            acc1 = acc_add(acc1, group_step(rp + 4, off, 4, qidx, didx, xlo, xhi, seed, dx), 4);
        } else {
            acc0 = acc_add(acc0, group_step(rp, off, nvalid, qidx, didx, xlo, xhi, seed, dx),
                           nvalid);
            acc1 = acc_add(acc1, group_step(rp + 4, off, nvalid, qidx, didx, xlo, xhi, seed, dx),
                           nvalid);
        }
    }
    _mm_mask_storeu_ps(y, m & 0xf, acc0);
    _mm_mask_storeu_ps(y + 4, m >> 4, acc1);
}

static void
rows8_q4_0(const uint8_t *const rp[GV_ROWS], int64_t b0, int64_t nbk, const uint8_t *xr, float *y,
           int nr, bool cont, const uint8_t *next, size_t next_bytes)
{
    rows8(WT_Q4_0, rp, b0, nbk, xr, y, nr, cont, next, next_bytes);
}

static void
rows8_q8_0(const uint8_t *const rp[GV_ROWS], int64_t b0, int64_t nbk, const uint8_t *xr, float *y,
           int nr, bool cont, const uint8_t *next, size_t next_bytes)
{
    rows8(WT_Q8_0, rp, b0, nbk, xr, y, nr, cont, next, next_bytes);
}

static void
prep_q4_0(const sp_block_q8_0 *x, int64_t b0, int64_t nbk, uint8_t *xr)
{
    prep(WT_Q4_0, x, b0, nbk, xr);
}

static void
prep_q8_0(const sp_block_q8_0 *x, int64_t b0, int64_t nbk, uint8_t *xr)
{
    prep(WT_Q8_0, x, b0, nbk, xr);
}

/* y[r] = dot(row r, token) for r in [r0, r1): rows ws bytes apart, x one Q8_0 row. */
static void
gemv(int wt, int64_t n, const uint8_t *w, size_t ws, int64_t r0, int64_t r1, const void *x,
     float *y)
{
    _Alignas(64) uint8_t xr[GV_KC / 4 * GV_REC];
    const int64_t nb = n / SP_QK8_0;
    const size_t bsz = wt == WT_Q4_0 ? sizeof(sp_block_q4_0) : sizeof(sp_block_q8_0);
    if (nb == 0) { /* an empty dot product is 0, as in the reference */
        memset(y + r0, 0, sizeof(float) * (size_t)(r1 - r0));
        return;
    }
    for (int64_t b0 = 0; b0 < nb; b0 += GV_KC) {
        const int64_t nbk = nb - b0 < GV_KC ? nb - b0 : GV_KC;
        if (wt == WT_Q4_0) {
            prep_q4_0(x, b0, nbk, xr);
        } else {
            prep_q8_0(x, b0, nbk, xr);
        }
        for (int64_t r = r0; r < r1; r += GV_ROWS) {
            const int nr = r1 - r < GV_ROWS ? (int)(r1 - r) : GV_ROWS;
            /* rows past the end repeat the last one; their sums are never stored */
            const uint8_t *rp[GV_ROWS];
            for (int i = 0; i < GV_ROWS; i++) {
                rp[i] = w + (size_t)(r + (i < nr ? i : nr - 1)) * ws;
            }
            /* the next call's rows, from this K chunk's first block */
            const int64_t rn = r + GV_ROWS;
            const int nn = r1 - rn < GV_ROWS ? (r1 > rn ? (int)(r1 - rn) : 0) : GV_ROWS;
            const uint8_t *next = w + (size_t)rn * ws + (size_t)b0 * bsz;
            const size_t next_bytes = nn > 0 ? (size_t)(nn - 1) * ws + (size_t)nbk * bsz : 0;
            if (wt == WT_Q4_0) {
                rows8_q4_0(rp, b0, nbk, xr, y + r, nr, b0 > 0, next, next_bytes);
            } else {
                rows8_q8_0(rp, b0, nbk, xr, y + r, nr, b0 > 0, next, next_bytes);
            }
        }
    }
}

void
sp__avx512_gemv_q4_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
                     float *y)
{
    if (r1 > r0) {
        gemv(WT_Q4_0, n, w, ws, r0, r1, x, y);
    }
}

void
sp__avx512_gemv_q8_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
                     float *y)
{
    if (r1 > r0) {
        gemv(WT_Q8_0, n, w, ws, r0, r1, x, y);
    }
}
