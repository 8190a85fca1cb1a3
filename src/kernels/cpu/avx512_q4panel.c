/*
 * avx512_q4panel.c - AVX-512 VNNI prefill (and batched decode) of the 4-bit table types:
 * MXFP4 and IQ4_NL (row-major blocks of 32 x Q8_0, and their load-time packed form: the
 * engine's path, decode included) and IQ4_XS (the packed form of repack_impl.h x Q8_K), as
 * 16-row panels: the 16 rows of a panel sit in the 16 int32 / float
 * lanes of a register, so a block's float work (convert, scale, add) is one instruction for 16
 * rows and no horizontal sums are needed.
 *
 * Weights: a panel block is decoded once per token chunk into 8 registers G0..G7 (lane i of Gg
 * = the 4 weight bytes of row i that meet activation bytes 4g..4g+3) and kept in a stack scratch
 * that every token tile of the chunk reads. The 4-bit codes go through the type's 16-entry table
 * with VPSHUFB (the table fits one 128-bit lane, so every lane holds a copy and the lookup is one
 * instruction for 64 codes; VPERMB would index 64 entries, which these tables do not have, and
 * would need VBMI). VPDPBUSD multiplies unsigned by signed bytes; the activations are the signed
 * side (broadcast 4 bytes at a time to the 16 lanes, the embedded {1to16} operand), so the
 * weights are made unsigned by an offset: u = value + OFF (MXFP4: doubled E2M1 -12..12, OFF 12;
 * IQ4_NL / IQ4_XS: -127..113, OFF 128), and the excess is removed exactly by seeding the int32
 * sum with -OFF * sum(x) of the activation block (or sub-block). The sign trick (|w| and x with
 * w's sign) is not usable: the activation side is one broadcast shared by 16 rows of different
 * signs. Bounds: |seed| <= 128 * 32 * 128, a VPDPBUSD step adds at most 4 * 241 * 128: the block
 * sums are exact int32 (far below 2^31).
 *
 * Numerics, the scalar reference's bits (so gemm == vec_dot == ref at any batch, chunking or row
 * split):
 * - MXFP4, IQ4_NL (q32_impl.h's contract): per block blk = d * (float)isum, d = x.d * e8m0_half(e)
 *   (MXFP4) or w.d * x.d (IQ4_NL), added to partial sum acc[b % 8], blocks in ascending order,
 *   then the contract's lane tree. A tile walks a K chunk lane by lane: for k = 0..7 the blocks
 *   b = k, k + 8, ... in order, so lane k's sum is one register per token; the 8 lane sums of a
 *   (token, 16 rows) are kept in a carry buffer across K chunks and reduced with the tree at the
 *   end. The weight scratch and the activation records are written in that visiting order, so a
 *   tile reads both as sequential streams.
 * - IQ4_XS (kquants2_impl.h's contract): per super-block sumi = sum_j (ls_j - 32) * dot_j exact
 *   (VPMULLD of the 16 rows' sub-block scales by their sub-block sums), then d = y.d * x.d;
 *   blk = d * (float)sumi; sumf = sumf + blk, super-blocks in order; partial sums of a K chunk go
 *   through y (a float store and reload is exact).
 * Multiplies and adds are separate intrinsics (no FMA contraction in C11 mode).
 *
 * Calls with few tokens (decode) go to the kernels this level had before (the caller's fallback):
 * packing a panel pays only when several token tiles share it (bench/qgemm_shape_bench.c).
 *
 * Pure functions, any thread, no heap; about 260 KiB of stack per call (activation records
 * 160 KiB, one packed panel chunk, the lane carries), about 470 KiB for the packed MXFP4 /
 * IQ4_NL path (records 384 KiB): pool threads have 8 MiB.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/q32_impl.h"
#include "kernels/cpu/avx512_simd.h"
#include "kernels/cpu/repack_impl.h"

#define QP_INLINE static inline __attribute__((always_inline))

#define QP_ROWS 16           /* rows per panel: the lanes of a register */
#define QP_T 8               /* tokens per register tile */
#define QP_TC 128            /* most tokens per token chunk */
#define QP_KC 64             /* 32-element blocks per packed K chunk (MXFP4, IQ4_NL) */
#define QP_XBUF (160 * 1024) /* activation record bytes of one token chunk */
/* (tile, block) record of the 32-element types: the 8 tokens' int32 seeds and scales */
#define QP_XREC (QP_T * 8)
/* (tile, super-block) record of IQ4_XS: 8 x 256 quants, seeds [sub-block][token], scales */
#define QP_SREC (QP_T * 256 + 8 * QP_T * 4 + QP_T * 4)
#define QP_SKC 4 /* IQ4_XS super-blocks per K chunk: QP_TC tokens' records fit QP_XBUF */
/* packed IQ4_XS super-block of a panel: 8 sub-blocks x G0..G7, 8 x 16 scales, 16 d */
#define QP_SPW (8 * 512 + 8 * 64 + 64)

_Static_assert((QP_TC / QP_T) * QP_SKC * QP_SREC <= QP_XBUF, "IQ4_XS records fit");
_Static_assert(QP_KC % 8 == 0, "K chunks hold whole lane rounds");

enum { QP_MXFP4, QP_IQ4_NL };

/* sum of the 32 signed bytes at p: sum of (x + 128) by VPSADBW, less 32 * 128 */
QP_INLINE int32_t
qp_sum32(const int8_t *p)
{
    const __m256i q = _mm256_loadu_si256((const __m256i *)p);
    const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)),
                                      _mm256_setzero_si256());
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
    return (int32_t)_mm_cvtsi128_si32(h) - 32 * 128;
}

/* The table with the offset added, in every 128-bit lane (u = value + off, 0..255). */
QP_INLINE __m512i
qp_lut(const int8_t tab[16], int off)
{
    uint8_t u[16];
    for (int i = 0; i < 16; i++)
        u[i] = (uint8_t)(tab[i] + off);
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)u));
}

/* 16-byte nibble groups v[0..3] (Vg lane i = dword g of row i's 16 quant bytes) -> G0..G7:
 * low nibbles are elements 0..15, high ones 16..31, looked up in lut. */
QP_INLINE void
qp_decode(const __m512i v[4], __m512i lut, __m512i g[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        g[i] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v[i], m4));
        g[4 + i] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi32(v[i], 4), m4));
    }
}

/* ---- MXFP4 and IQ4_NL: row-major blocks x Q8_0 ------------------------------------------ */

QP_INLINE size_t
qp_bsz(int kind)
{
    return kind == QP_MXFP4 ? sizeof(sp_block_mxfp4) : sizeof(sp_block_iq4_nl);
}

QP_INLINE size_t
qp_qs(int kind)
{
    return kind == QP_MXFP4 ? offsetof(sp_block_mxfp4, qs) : offsetof(sp_block_iq4_nl, qs);
}

QP_INLINE int
qp_off(int kind)
{
    return kind == QP_MXFP4 ? 12 : 128;
}


/*
 * The per-block terms of tokens [0, nt) of x (Q8_0 rows xs bytes apart), all nb blocks, as
 * records: tile u (tokens 8u..8u+7), K chunk from block b0, visiting position p at
 * xr + (u * nb + b0 + p) * QP_XREC, each one cache line: the tile's int32 seeds -off * sum(x),
 * then its scales as floats. The quants themselves are read from the rows.
 */
static void
qp_prep_q8_0(int off, const uint8_t *x, size_t xs, int64_t nt, int64_t nb, uint8_t *xr)
{
    for (int64_t t = 0; t < nt; t++) {
        /* the row in memory order (a sequential read), each block's record at its visiting
         * position: in the chunk of nbk = 8 full + rem blocks, lane k starts after
         * k * full + min(k, rem) blocks of the lanes before it */
        const sp_block_q8_0 *xb = (const sp_block_q8_0 *)(x + (size_t)t * xs);
        const int lane = (int)(t % QP_T);
        uint8_t *o = xr + (size_t)(t / QP_T) * (size_t)nb * QP_XREC;
        for (int64_t b0 = 0; b0 < nb; b0 += QP_KC) {
            const int64_t nbk = nb - b0 < QP_KC ? nb - b0 : QP_KC;
            const int64_t full = nbk / 8, rem = nbk % 8;
            for (int64_t w = 0; w < nbk; w++) {
                const int64_t k = w % 8, p = k * full + (k < rem ? k : rem) + w / 8;
                uint8_t *r = o + (size_t)(b0 + p) * QP_XREC;
                const int32_t seed = -off * qp_sum32(xb[b0 + w].qs);
                const float d = _cvtsh_ss(xb[b0 + w].d);
                memcpy(r + lane * 4, &seed, 4);
                memcpy(r + QP_T * 4 + lane * 4, &d, 4);
            }
        }
    }
}

/* The 16 rows' weight scales of block b as floats: MXFP4 e8m0_half(e) (q32_impl.h, lane-wise:
 * e >= 2 -> (e - 1) << 23, else 0x00200000 << e), IQ4_NL the F16 d. */
QP_INLINE __m512
qp_wscale(int kind, const uint8_t *row0, __m512i idx)
{
    const __m512i raw = _mm512_i32gather_epi32(idx, row0, 1);
    if (kind == QP_MXFP4) {
        const __m512i e = _mm512_and_si512(raw, _mm512_set1_epi32(0xff));
        const __m512i norm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
        const __m512i den = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
        const __mmask16 big = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1));
        return _mm512_castsi512_ps(_mm512_mask_blend_epi32(big, den, norm));
    }
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
}

/* Blocks [b0, b0 + nbk) of the panel rp[] in visiting order into pw (512 bytes a block) and
 * pd (16 scales a block). */
QP_INLINE void
qp_pack32(int kind, const uint8_t *const rp[QP_ROWS], __m512i idx, int64_t b0, int64_t nbk,
          uint8_t *pw, float *pd)
{
    const __m512i lut = qp_lut(kind == QP_MXFP4 ? sp__kvalues_mxfp4 : sp__kvalues_iq4nl,
                               qp_off(kind));
    const size_t bsz = qp_bsz(kind);
    /* visiting order: lane k = 0..7, then its blocks b0 + k, b0 + k + 8, ... */
    int64_t p = 0;
    for (int64_t k = 0; k < 8; k++) {
        for (int64_t b = b0 + k; b < b0 + nbk; b += 8, p++) {
            __m512i v[4], g[8];
            sp512_transpose16x4(rp, (size_t)b * bsz + qp_qs(kind), v);
            qp_decode(v, lut, g);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                _mm512_store_si512((void *)(pw + (size_t)p * 512 + i * 64), g[i]);
            _mm512_store_ps(pd + p * 16, qp_wscale(kind, rp[0] + (size_t)b * bsz, idx));
        }
    }
}

/* Weight rows of the panel chunk packed next, which a tile fetches while it computes (the
 * packing would otherwise wait on memory for each of its 16 row streams): row[i] at that
 * chunk's first block, one prefetch per row and block step, for nbk steps. */
typedef struct {
    const uint8_t *row[QP_ROWS];
    int n;
    int64_t nbk;
    size_t bsz;
} qp_pf_t;

/*
 * T tokens (quants at xq[t] + b * 34, per-block records from xr in visiting order) x one
 * packed K chunk of nbk blocks from b0, lane by lane: carry[k][t] holds lane k's partial sums
 * of the 16 rows (zero before the first chunk).
 */
QP_INLINE void
qp_tile32(const int T, int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,
          const uint8_t *xr, const uint8_t *const xq[QP_T], __m512 *carry, const qp_pf_t *pf)
{
    int64_t p = 0;
    for (int k = 0; k < 8; k++) {
        __m512 acc[QP_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[t] = b0 > 0 ? carry[k * QP_T + t] : _mm512_setzero_ps();
        for (int64_t b = k; b < nbk; b += 8, p++) {
            for (int i = 0; i < pf->n && p < pf->nbk; i++)
                _mm_prefetch((const char *)pf->row[i] + (size_t)p * pf->bsz, _MM_HINT_T0);
            const uint8_t *r = xr + (size_t)p * QP_XREC;
            const uint8_t *wp = pw + (size_t)p * 512;
            const size_t xo = (size_t)(b0 + b) * sizeof(sp_block_q8_0);
            __m512i ia[QP_T];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                ia[t] = _mm512_set1_epi32(sp512_ld_i32(r + t * 4));
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m512i g = _mm512_load_si512((const void *)(wp + i * 64));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    ia[t] = sp512_dpbusd_bcast(ia[t], g, xq[t] + xo + 4 * i);
            }
            const __m512 dw = _mm512_load_ps(pd + p * 16);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                /* d = x.d * w's scale (MXFP4) or w.d * x.d: one exact-order product either
                 * way (multiplication commutes); blk = d * isum; acc + blk */
                const __m512 d =
                    _mm512_mul_ps(_mm512_set1_ps(sp512_ld_f32(r + QP_T * 4 + t * 4)), dw);
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(ia[t])));
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            carry[k * QP_T + t] = acc[t];
    }
}

typedef void (*qp_tile32_fn)(int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,
                             const uint8_t *xr, const uint8_t *const xq[QP_T], __m512 *carry,
                             const qp_pf_t *pf);
#define QP_TILE32(T)                                                                           \
    static void qp_tile32_##T(int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,     \
                              const uint8_t *xr, const uint8_t *const xq[QP_T], __m512 *carry, \
                              const qp_pf_t *pf)                                               \
    {                                                                                          \
        qp_tile32(T, b0, nbk, pw, pd, xr, xq, carry, pf);                                      \
    }
QP_TILE32(1)
QP_TILE32(2)
QP_TILE32(3)
QP_TILE32(4)
QP_TILE32(5)
QP_TILE32(6)
QP_TILE32(7)
QP_TILE32(8)
static const qp_tile32_fn qp_tiles32[QP_T + 1] = {NULL,        qp_tile32_1, qp_tile32_2,
                                                  qp_tile32_3, qp_tile32_4, qp_tile32_5,
                                                  qp_tile32_6, qp_tile32_7, qp_tile32_8};

/* The tokens of one chunk at most: QP_TC, and records of the whole K within QP_XBUF. */
static int64_t
qp_chunk32(int64_t nb)
{
    int64_t tc = QP_XBUF / (nb * QP_XREC) * QP_T;
    return tc > QP_TC ? QP_TC : tc;
}

static void
qp_gemm32(int kind, int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
          size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t pw[QP_KC * 512];
    _Alignas(64) float pd[QP_KC * QP_ROWS];
    _Alignas(64) uint8_t xr[QP_XBUF];
    _Alignas(64) __m512 carry[QP_TC / QP_T][8 * QP_T];
    const int64_t nb = n / SP_QK32;
    const int64_t tc = qp_chunk32(nb);
    const size_t bsz = qp_bsz(kind);
    const uint8_t *wb = w, *xb = x;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t nt = n_tok - t0 < tc ? n_tok - t0 : tc;
        const int ntiles = (int)((nt + QP_T - 1) / QP_T);
        qp_prep_q8_0(qp_off(kind), xb + (size_t)t0 * xs, xs, nt, nb, xr);
        for (int64_t r = r0; r < r1; r += QP_ROWS) {
            const int nr = r1 - r < QP_ROWS ? (int)(r1 - r) : QP_ROWS;
            /* rows past the end repeat the last one; their lanes are never stored */
            const uint8_t *rp[QP_ROWS];
            int32_t idx[QP_ROWS];
            for (int i = 0; i < QP_ROWS; i++) {
                const int ri = i < nr ? i : nr - 1;
                rp[i] = wb + (size_t)(r + ri) * ws;
                idx[i] = (int32_t)((size_t)ri * ws);
            }
            const __m512i vidx = _mm512_loadu_si512(idx);
            for (int64_t b0 = 0; b0 < nb; b0 += QP_KC) {
                const int64_t nbk = nb - b0 < QP_KC ? nb - b0 : QP_KC;
                qp_pack32(kind, rp, vidx, b0, nbk, pw, pd);
                /* packed next: this panel's next K chunk, else the next panel's first one
                 * (none after the last panel: the next token chunk finds them in cache) */
                int64_t nr0 = r, nb0 = b0 + QP_KC;
                if (nb0 >= nb) {
                    nr0 = r + QP_ROWS;
                    nb0 = 0;
                }
                const int pn = nr0 >= r1 ? 0 : r1 - nr0 < QP_ROWS ? (int)(r1 - nr0) : QP_ROWS;
                /* the rows go to the first tiles (all but the last quarter), so that the
                 * last prefetches are issued well before the packing reads them */
                const int npf = ntiles > 3 ? ntiles - ntiles / 4 : ntiles;
                for (int u = 0; u < ntiles; u++) {
                    qp_pf_t pf = {.n = 0, .bsz = bsz};
                    pf.nbk = nb - nb0 < QP_KC ? nb - nb0 : QP_KC;
                    for (int i = u; u < npf && i < pn; i += npf)
                        pf.row[pf.n++] = wb + (size_t)(nr0 + i) * ws + (size_t)nb0 * bsz;
                    const int64_t tn = nt - u * QP_T < QP_T ? nt - u * QP_T : QP_T;
                    const uint8_t *xq[QP_T];
                    for (int t = 0; t < QP_T; t++)
                        xq[t] = xb + (size_t)(t0 + u * QP_T + (t < tn ? t : 0)) * xs +
                                offsetof(sp_block_q8_0, qs);
                    qp_tiles32[tn](b0, nbk, pw, pd,
                                   xr + ((size_t)u * (size_t)nb + (size_t)b0) * QP_XREC, xq,
                                   carry[u], &pf);
                }
            }
            /* q32_impl.h's lane tree: (0 + 4, 1 + 5, 2 + 6, 3 + 7), then (0 + 2, 1 + 3), then
             * the two; 16 rows at a time */
            const __mmask16 m = (__mmask16)((1u << nr) - 1);
            for (int64_t t = 0; t < nt; t++) {
                const __m512 *a = carry[t / QP_T];
                const int tt = (int)(t % QP_T);
                const __m512 b0v = _mm512_add_ps(a[0 * QP_T + tt], a[4 * QP_T + tt]);
                const __m512 b1v = _mm512_add_ps(a[1 * QP_T + tt], a[5 * QP_T + tt]);
                const __m512 b2v = _mm512_add_ps(a[2 * QP_T + tt], a[6 * QP_T + tt]);
                const __m512 b3v = _mm512_add_ps(a[3 * QP_T + tt], a[7 * QP_T + tt]);
                const __m512 s = _mm512_add_ps(_mm512_add_ps(b0v, b2v), _mm512_add_ps(b1v, b3v));
                _mm512_mask_storeu_ps(y + (t0 + t) * ldy + r, m, s);
            }
        }
    }
}

/* ---- MXFP4 and IQ4_NL: the packed form (8-row groups) x Q8_0 ----------------------------- */

/*
 * The load-time packed form (repack_impl.h: per block the 8 rows' scales, F16 d or E8M0 byte,
 * then their 16 quant bytes in four 32-byte chunks) read as panels of two groups. Against the
 * row-major panels above: a panel block is 4 contiguous 64-byte loads and 4 VPERMT2D instead of
 * 16 row loads, 12 inserts and 8 unpacks; the 16 scales are two 8-byte or 16-byte loads instead
 * of a gather; the panel's weights are two sequential streams instead of 16. The activations'
 * quants are copied into the records with their seeds and scales, so a tile reads one
 * sequential stream through one pointer (the row-major tile kept 8 token pointers, more than
 * the free registers: spills and moves in the inner loop). The numerics are the same as above
 * (q32_impl.h's 8 lanes, carried across K chunks, the fixed tree at the end).
 */

/* (tile, block) record: the 8 tokens' 32 quants, their int32 seeds -off * sum(x), their
 * scales as floats (5 cache lines) */
#define QP_PREC (QP_T * 32 + QP_T * 4 + QP_T * 4)
/* record bytes of one token chunk: the whole K of up to QP_TC tokens for K <= 2048, about 48
 * tokens at K = 5632, held in L2 while every panel sweeps them */
#ifndef QP_PBUF
#define QP_PBUF (384 * 1024)
#endif
/* blocks per packed K chunk: the panel scratch (16 KiB) stays in L1 beside the records (32 and
 * 64 within noise in qgemm_shape_bench, 32 ahead at K = 5632) */
#ifndef QP_PKC
#define QP_PKC 32
#endif
_Static_assert(QP_PKC % 8 == 0, "K chunks hold whole lane rounds");

QP_INLINE size_t
qp_pblk(int kind)
{
    return kind == QP_MXFP4 ? SP_REPACK_MXFP4_BLOCK_BYTES : SP_REPACK_BLOCK_BYTES;
}

/* header bytes a row (the scale) before a packed block's quants */
QP_INLINE int
qp_hdr(int kind)
{
    return kind == QP_MXFP4 ? 1 : 2;
}

/* The tokens of one chunk: QP_TC at most, and their records of the whole K within QP_PBUF
 * (0: not one tile's records fit, K > QP_PBUF / QP_PREC * 32, about 39000). */
static int64_t
qp_chunk_pk(int64_t nb)
{
    const int64_t tc = QP_PBUF / (nb * QP_PREC) * QP_T;
    return tc > QP_TC ? QP_TC : tc;
}

/*
 * Tokens [0, nt) of x (Q8_0 rows xs bytes apart), all nb blocks, as records: tile u, K chunk
 * from b0, visiting position p (qp_prep_q8_0's order) at xr + (u * nb + b0 + p) * QP_PREC.
 */
static void
qp_prep_pk(int off, const uint8_t *x, size_t xs, int64_t nt, int64_t nb, uint8_t *xr)
{
    for (int64_t t = 0; t < nt; t++) {
        const sp_block_q8_0 *xb = (const sp_block_q8_0 *)(x + (size_t)t * xs);
        const int lane = (int)(t % QP_T);
        uint8_t *o = xr + (size_t)(t / QP_T) * (size_t)nb * QP_PREC;
        for (int64_t b0 = 0; b0 < nb; b0 += QP_PKC) {
            const int64_t nbk = nb - b0 < QP_PKC ? nb - b0 : QP_PKC;
            const int64_t full = nbk / 8, rem = nbk % 8;
            for (int64_t w = 0; w < nbk; w++) {
                const int64_t k = w % 8, p = k * full + (k < rem ? k : rem) + w / 8;
                uint8_t *r = o + (size_t)(b0 + p) * QP_PREC;
                const __m256i q = _mm256_loadu_si256((const __m256i *)xb[b0 + w].qs);
                _mm256_storeu_si256((__m256i *)(r + lane * 32), q);
                const int32_t seed = -off * qp_sum32(xb[b0 + w].qs);
                const float d = _cvtsh_ss(xb[b0 + w].d);
                memcpy(r + QP_T * 32 + lane * 4, &seed, 4);
                memcpy(r + QP_T * 36 + lane * 4, &d, 4);
            }
        }
    }
}

/*
 * Blocks [b0, b0 + nbk) of the panel of packed groups ga (rows 0..7) and gb (rows 8..15), in
 * visiting order, into pw (G0..G7, 512 bytes a block) and pd (the 16 rows' scales as floats).
 * A block's 128 quant bytes: the first 64 are bytes 0..7 of every row (dwords 0 and 1), the
 * next 64 bytes 8..15 (dwords 2 and 3), a row's 8 bytes in 64-bit lane (r & 1) | (r >> 2) << 1
 * of chunk (r >> 1) & 1; VPERMT2D gathers one dword of the 16 rows into the 16 lanes.
 */
QP_INLINE void
qp_pack_pk(int kind, const uint8_t *ga, const uint8_t *gb, int64_t b0, int64_t nbk, uint8_t *pw,
           float *pd)
{
    const __m512i lut = qp_lut(kind == QP_MXFP4 ? sp__kvalues_mxfp4 : sp__kvalues_iq4nl,
                               qp_off(kind));
    const size_t pblk = qp_pblk(kind);
    const int hdr = qp_hdr(kind);
    int32_t ix[2][QP_ROWS];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < QP_ROWS; i++) {
            const int r = i & 7;
            ix[h][i] = 8 * ((r >> 1) & 1) + 2 * ((r & 1) | ((r >> 2) << 1)) + h + (i >= 8 ? 16 : 0);
        }
    const __m512i sel0 = _mm512_loadu_si512(ix[0]), sel1 = _mm512_loadu_si512(ix[1]);
    /* the blocks in memory order (two sequential streams for the hardware prefetcher: with one
     * token the unpack waits on memory), each stored at its visiting position (qp_prep_pk) */
    const int64_t full = nbk / 8, rem = nbk % 8;
    for (int64_t w = 0; w < nbk; w++) {
        const int64_t k = w % 8, p = k * full + (k < rem ? k : rem) + w / 8;
        const int64_t b = b0 + w;
        const uint8_t *pa = ga + (size_t)b * pblk, *pb = gb + (size_t)b * pblk;
        const uint8_t *qa = pa + SP_REPACK_ROWS * hdr, *qb = pb + SP_REPACK_ROWS * hdr;
        const __m512i a0 = _mm512_loadu_si512(qa), a1 = _mm512_loadu_si512(qa + 64);
        const __m512i c0 = _mm512_loadu_si512(qb), c1 = _mm512_loadu_si512(qb + 64);
        const __m512i v[4] = {
            _mm512_permutex2var_epi32(a0, sel0, c0),
            _mm512_permutex2var_epi32(a0, sel1, c0),
            _mm512_permutex2var_epi32(a1, sel0, c1),
            _mm512_permutex2var_epi32(a1, sel1, c1),
        };
        __m512i g[8];
        qp_decode(v, lut, g);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            _mm512_store_si512((void *)(pw + (size_t)p * 512 + i * 64), g[i]);
        __m512 dw;
        if (kind == QP_MXFP4) {
            /* e8m0_half(e) lane-wise (q32_impl.h): e >= 2 -> (e - 1) << 23, else
             * 0x00200000 << e */
            int64_t ea, eb;
            memcpy(&ea, pa, 8);
            memcpy(&eb, pb, 8);
            const __m512i e = _mm512_cvtepu8_epi32(_mm_set_epi64x(eb, ea));
            const __m512i norm =
                _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            const __m512i den = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
            const __mmask16 big = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1));
            dw = _mm512_castsi512_ps(_mm512_mask_blend_epi32(big, den, norm));
        } else {
            const __m256i d16 = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                _mm_loadu_si128((const __m128i *)pb), 1);
            dw = _mm512_cvtph_ps(d16);
        }
        _mm512_store_ps(pd + p * 16, dw);
    }
}

/* The panel chunk packed next, which the tiles fetch while they compute: at block step p,
 * tile u fetches `per` lines of both groups' byte ranges from line (p * ntiles + u) * per, so
 * the tiles together cover the chunk whatever their number (one, with one token). */
typedef struct {
    const uint8_t *a, *b; /* NULL: nothing to fetch */
    int64_t lines, u, ntiles;
    int64_t per; /* lines of each group a block step fetches: all of them by the last step */
} qp_pfk_t;

/*
 * T tokens (records in visiting order from xr) x one packed K chunk of nbk blocks from b0,
 * lane by lane: carry[k][t] holds lane k's partial sums of the 16 rows (zero before the first
 * chunk).
 */
QP_INLINE void
qp_tile_pk(const int T, int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,
           const uint8_t *xr, __m512 *carry, const qp_pfk_t *pf)
{
    int64_t p = 0;
    for (int k = 0; k < 8; k++) {
        __m512 acc[QP_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[t] = b0 > 0 ? carry[k * QP_T + t] : _mm512_setzero_ps();
        for (int64_t b = k; b < nbk; b += 8, p++) {
            for (int64_t li = (p * pf->ntiles + pf->u) * pf->per, j = 0;
                 pf->a != NULL && j < pf->per && li < pf->lines; j++, li++) {
                _mm_prefetch((const char *)pf->a + 64 * li, _MM_HINT_T0);
                _mm_prefetch((const char *)pf->b + 64 * li, _MM_HINT_T0);
            }
            const uint8_t *r = xr + (size_t)p * QP_PREC;
            const uint8_t *wp = pw + (size_t)p * 512;
            __m512i ia[QP_T];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                ia[t] = _mm512_set1_epi32(sp512_ld_i32(r + QP_T * 32 + t * 4));
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m512i g = _mm512_load_si512((const void *)(wp + i * 64));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    ia[t] = sp512_dpbusd_bcast(ia[t], g, r + t * 32 + 4 * i);
            }
            const __m512 dw = _mm512_load_ps(pd + p * 16);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                /* d = x.d * w's scale (MXFP4) or w.d * x.d (one exact-order product either
                 * way); blk = d * isum; acc + blk */
                const __m512 d =
                    _mm512_mul_ps(_mm512_set1_ps(sp512_ld_f32(r + QP_T * 36 + t * 4)), dw);
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(ia[t])));
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            carry[k * QP_T + t] = acc[t];
    }
}

typedef void (*qp_tile_pk_fn)(int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,
                              const uint8_t *xr, __m512 *carry, const qp_pfk_t *pf);
#define QP_TILE_PK(T)                                                                          \
    static void qp_tile_pk_##T(int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,    \
                               const uint8_t *xr, __m512 *carry, const qp_pfk_t *pf)           \
    {                                                                                          \
        qp_tile_pk(T, b0, nbk, pw, pd, xr, carry, pf);                                         \
    }
QP_TILE_PK(1)
QP_TILE_PK(2)
QP_TILE_PK(3)
QP_TILE_PK(4)
QP_TILE_PK(5)
QP_TILE_PK(6)
QP_TILE_PK(7)
QP_TILE_PK(8)
static const qp_tile_pk_fn qp_tiles_pk[QP_T + 1] = {NULL,         qp_tile_pk_1, qp_tile_pk_2,
                                                    qp_tile_pk_3, qp_tile_pk_4, qp_tile_pk_5,
                                                    qp_tile_pk_6, qp_tile_pk_7, qp_tile_pk_8};

/* Rows [r0, r1) of a packed MXFP4 / IQ4_NL matrix (w = group 0, ws = the group bytes): panels
 * of two groups (the last one alone when the group count is odd: its second half repeats it
 * and is never stored). nb * QP_PREC <= QP_PBUF (the caller checks). */
static void
qp_gemm_pk(int kind, int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
           const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t pw[QP_PKC * 512];
    _Alignas(64) float pd[QP_PKC * QP_ROWS];
    _Alignas(64) uint8_t xr[QP_PBUF];
    _Alignas(64) __m512 carry[QP_TC / QP_T][8 * QP_T];
    const int64_t nb = n / SP_QK32;
    const int64_t tc = qp_chunk_pk(nb);
    const size_t pblk = qp_pblk(kind);
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    const uint8_t *wb = w, *xb = x;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t nt = n_tok - t0 < tc ? n_tok - t0 : tc;
        const int ntiles = (int)((nt + QP_T - 1) / QP_T);
        qp_prep_pk(qp_off(kind), xb + (size_t)t0 * xs, xs, nt, nb, xr);
        for (int64_t g = g0; g < g1; g += 2) {
            const uint8_t *ga = wb + (size_t)g * ws;
            const uint8_t *gb = g + 1 < g1 ? ga + ws : ga;
            /* lanes of rows outside [r0, r1) are computed and not stored */
            const int64_t base = g * SP_REPACK_ROWS;
            uint32_t mask = 0;
            for (int i = 0; i < QP_ROWS; i++) {
                const int64_t row = base + i;
                if (row >= r0 && row < r1 && (i < 8 || g + 1 < g1))
                    mask |= 1u << i;
            }
            for (int64_t b0 = 0; b0 < nb; b0 += QP_PKC) {
                const int64_t nbk = nb - b0 < QP_PKC ? nb - b0 : QP_PKC;
                qp_pack_pk(kind, ga, gb, b0, nbk, pw, pd);
                /* fetched next: this panel's next K chunk, else the next panel's first */
                qp_pfk_t pf = {.a = NULL, .ntiles = ntiles};
                if (b0 + QP_PKC < nb) {
                    const int64_t nn = nb - b0 - QP_PKC < QP_PKC ? nb - b0 - QP_PKC : QP_PKC;
                    pf.a = ga + (size_t)(b0 + QP_PKC) * pblk;
                    pf.b = gb + (size_t)(b0 + QP_PKC) * pblk;
                    pf.lines = (int64_t)(((size_t)nn * pblk + 63) / 64);
                } else if (g + 2 < g1) {
                    const int64_t nn = nb < QP_PKC ? nb : QP_PKC;
                    pf.a = ga + 2 * ws;
                    pf.b = g + 3 < g1 ? pf.a + ws : pf.a;
                    pf.lines = (int64_t)(((size_t)nn * pblk + 63) / 64);
                }
                const int64_t steps = nbk * ntiles;
                pf.per = pf.a != NULL ? (pf.lines + steps - 1) / steps : 0;
                for (int u = 0; u < ntiles; u++) {
                    const int64_t tn = nt - u * QP_T < QP_T ? nt - u * QP_T : QP_T;
                    pf.u = u;
                    qp_tiles_pk[tn](b0, nbk, pw, pd,
                                    xr + ((size_t)u * (size_t)nb + (size_t)b0) * QP_PREC,
                                    carry[u], &pf);
                }
            }
            /* q32_impl.h's lane tree, 16 rows at a time (as qp_gemm32) */
            for (int64_t t = 0; t < nt; t++) {
                const __m512 *a = carry[t / QP_T];
                const int tt = (int)(t % QP_T);
                const __m512 b0v = _mm512_add_ps(a[0 * QP_T + tt], a[4 * QP_T + tt]);
                const __m512 b1v = _mm512_add_ps(a[1 * QP_T + tt], a[5 * QP_T + tt]);
                const __m512 b2v = _mm512_add_ps(a[2 * QP_T + tt], a[6 * QP_T + tt]);
                const __m512 b3v = _mm512_add_ps(a[3 * QP_T + tt], a[7 * QP_T + tt]);
                const __m512 s = _mm512_add_ps(_mm512_add_ps(b0v, b2v), _mm512_add_ps(b1v, b3v));
                _mm512_mask_storeu_ps(y + (t0 + t) * ldy + base, (__mmask16)mask, s);
            }
        }
    }
}

/* ---- IQ4_XS: the packed form (8-row groups) x Q8_K -------------------------------------- */

/*
 * Tokens [0, nt) (Q8_K rows xs bytes apart), super-blocks [s0, s0 + nsk), as records: tile u,
 * super-block j at xr + (u * nsk + j) * QP_SREC: the 8 tokens' 256 quants, the seeds
 * -128 * sum(sub-block) as [sub-block][token], the scales.
 */
static void
qp_prep_q8_k(const uint8_t *x, size_t xs, int64_t nt, int64_t s0, int64_t nsk, uint8_t *xr)
{
    for (int64_t t = 0; t < nt; t++) {
        const sp_block_q8_k *xb = (const sp_block_q8_k *)(x + (size_t)t * xs) + s0;
        const int lane = (int)(t % QP_T);
        uint8_t *o = xr + (size_t)(t / QP_T) * (size_t)nsk * QP_SREC;
        for (int64_t j = 0; j < nsk; j++, o += QP_SREC) {
            memcpy(o + lane * 256, xb[j].qs, 256);
            for (int s = 0; s < 8; s++) {
                const int32_t seed = -128 * qp_sum32(xb[j].qs + 32 * s);
                memcpy(o + QP_T * 256 + (s * QP_T + lane) * 4, &seed, 4);
            }
            memcpy(o + QP_T * 256 + 8 * QP_T * 4 + lane * 4, &xb[j].d, 4);
        }
    }
}

/*
 * Packed groups ga (rows 0..7 of the panel) and gb (rows 8..15), super-blocks [s0, s0 + nsk),
 * into pw (QP_SPW bytes a super-block: per sub-block G0..G7, then the 8 sub-blocks' scales
 * ls - 32 as int32, then the 16 d as floats).
 *
 * A packed sub-block's 128 quant bytes are four 32-byte chunks (repack_impl.h): chunk c holds
 * bytes 8 (c / 2) .. + 7 of rows {0,1,4,5} (c even) or {2,3,6,7} (c odd), a row's 8 bytes in
 * 64-bit lane (r & 1) | (r >> 2) << 1. Chunks 0-1 (one 64-byte load) give byte dwords 0 and 1
 * of every row, chunks 2-3 dwords 2 and 3; VPERMT2D gathers one dword of the 8 rows of each
 * group into the 16 lanes.
 */
QP_INLINE void
qp_pack_xs(const uint8_t *ga, const uint8_t *gb, int64_t s0, int64_t nsk, uint8_t *pw)
{
    const __m512i lut = qp_lut(sp__kvalues_iq4nl, 128);
    int32_t ix[2][QP_ROWS];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < QP_ROWS; i++) {
            const int r = i & 7;
            ix[h][i] = 8 * ((r >> 1) & 1) + 2 * ((r & 1) | ((r >> 2) << 1)) + h + (i >= 8 ? 16 : 0);
        }
    const __m512i sel0 = _mm512_loadu_si512(ix[0]), sel1 = _mm512_loadu_si512(ix[1]);
    for (int64_t j = 0; j < nsk; j++) {
        const uint8_t *pa = ga + (size_t)(s0 + j) * SP_REPACK_IQ4XS_BLOCK_BYTES;
        const uint8_t *pb = gb + (size_t)(s0 + j) * SP_REPACK_IQ4XS_BLOCK_BYTES;
        uint8_t *o = pw + (size_t)j * QP_SPW;
        for (int s = 0; s < 8; s++) {
            const uint8_t *qa = pa + SP_REPACK_IQ4XS_QS + 128 * s;
            const uint8_t *qb = pb + SP_REPACK_IQ4XS_QS + 128 * s;
            const __m512i a0 = _mm512_loadu_si512(qa), a1 = _mm512_loadu_si512(qa + 64);
            const __m512i b0 = _mm512_loadu_si512(qb), b1 = _mm512_loadu_si512(qb + 64);
            const __m512i v[4] = {
                _mm512_permutex2var_epi32(a0, sel0, b0),
                _mm512_permutex2var_epi32(a0, sel1, b0),
                _mm512_permutex2var_epi32(a1, sel0, b1),
                _mm512_permutex2var_epi32(a1, sel1, b1),
            };
            __m512i g[8];
            qp_decode(v, lut, g);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                _mm512_store_si512((void *)(o + s * 512 + i * 64), g[i]);
            /* sc[s][r] bytes: rows 0..7 of ga, then gb */
            int64_t sa, sb;
            memcpy(&sa, pa + SP_REPACK_IQ4XS_SC + 8 * s, 8);
            memcpy(&sb, pb + SP_REPACK_IQ4XS_SC + 8 * s, 8);
            const __m512i sc = _mm512_sub_epi32(
                _mm512_cvtepu8_epi32(_mm_set_epi64x(sb, sa)), _mm512_set1_epi32(32));
            _mm512_store_si512((void *)(o + 8 * 512 + s * 64), sc);
        }
        const __m256i da = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa));
        const __m256i d16 =
            _mm256_inserti128_si256(da, _mm_loadu_si128((const __m128i *)pb), 1);
        _mm512_store_ps((float *)(o + 8 * 512 + 8 * 64), _mm512_cvtph_ps(d16));
    }
}

/* T tokens x one packed K chunk of nsk super-blocks; y holds the partial sums of earlier
 * chunks when cont. */
QP_INLINE void
qp_tile_xs(const int T, int64_t nsk, const uint8_t *pw, const uint8_t *xr, float *y, int64_t ldy,
           __mmask16 m, bool cont)
{
    __m512 acc[QP_T];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = cont ? _mm512_maskz_loadu_ps(m, y + t * ldy) : _mm512_setzero_ps();
    for (int64_t j = 0; j < nsk; j++) {
        const uint8_t *o = pw + (size_t)j * QP_SPW;
        const uint8_t *r = xr + (size_t)j * QP_SREC;
        __m512i sumi[QP_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            sumi[t] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            __m512i ia[QP_T];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                ia[t] = _mm512_set1_epi32(sp512_ld_i32(r + QP_T * 256 + (s * QP_T + t) * 4));
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m512i g = _mm512_load_si512((const void *)(o + s * 512 + i * 64));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    ia[t] = sp512_dpbusd_bcast(ia[t], g, r + t * 256 + 32 * s + 4 * i);
            }
            const __m512i sc = _mm512_load_si512((const void *)(o + 8 * 512 + s * 64));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(ia[t], sc));
        }
        const __m512 dw = _mm512_load_ps((const float *)(o + 8 * 512 + 8 * 64));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const float yd = sp512_ld_f32(r + QP_T * 256 + 8 * QP_T * 4 + t * 4);
            const __m512 d = _mm512_mul_ps(_mm512_set1_ps(yd), dw);
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi[t])));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(y + t * ldy, m, acc[t]);
}

typedef void (*qp_tile_xs_fn)(int64_t nsk, const uint8_t *pw, const uint8_t *xr, float *y,
                              int64_t ldy, __mmask16 m, bool cont);
#define QP_TILE_XS(T)                                                                          \
    static void qp_tile_xs_##T(int64_t nsk, const uint8_t *pw, const uint8_t *xr, float *y,    \
                               int64_t ldy, __mmask16 m, bool cont)                            \
    {                                                                                          \
        qp_tile_xs(T, nsk, pw, xr, y, ldy, m, cont);                                           \
    }
QP_TILE_XS(1)
QP_TILE_XS(2)
QP_TILE_XS(3)
QP_TILE_XS(4)
QP_TILE_XS(5)
QP_TILE_XS(6)
QP_TILE_XS(7)
QP_TILE_XS(8)
static const qp_tile_xs_fn qp_tiles_xs[QP_T + 1] = {NULL,          qp_tile_xs_1, qp_tile_xs_2,
                                                    qp_tile_xs_3,  qp_tile_xs_4, qp_tile_xs_5,
                                                    qp_tile_xs_6,  qp_tile_xs_7, qp_tile_xs_8};

/* Rows [r0, r1) of a packed IQ4_XS matrix (w = group 0, ws = the group bytes): panels of two
 * groups (the last one alone when the group count is odd: its second half repeats it and is
 * never stored). */
static void
qp_gemm_xs(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
           size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t pw[QP_SKC * QP_SPW];
    _Alignas(64) uint8_t xr[QP_XBUF];
    const int64_t nsb = n / SP_QK_K;
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    const uint8_t *wb = w, *xb = x;
    for (int64_t t0 = 0; t0 < n_tok; t0 += QP_TC) {
        const int64_t nt = n_tok - t0 < QP_TC ? n_tok - t0 : QP_TC;
        for (int64_t s0 = 0; s0 < nsb; s0 += QP_SKC) {
            const int64_t nsk = nsb - s0 < QP_SKC ? nsb - s0 : QP_SKC;
            qp_prep_q8_k(xb + (size_t)t0 * xs, xs, nt, s0, nsk, xr);
            for (int64_t g = g0; g < g1; g += 2) {
                const uint8_t *ga = wb + (size_t)g * ws;
                const uint8_t *gb = g + 1 < g1 ? ga + ws : ga;
                /* lanes of rows outside [r0, r1) are computed and not stored */
                const int64_t base = g * SP_REPACK_ROWS;
                uint32_t mask = 0;
                for (int i = 0; i < QP_ROWS; i++) {
                    const int64_t row = base + i;
                    if (row >= r0 && row < r1 && (i < 8 || g + 1 < g1))
                        mask |= 1u << i;
                }
                qp_pack_xs(ga, gb, s0, nsk, pw);
                for (int64_t t = 0; t < nt; t += QP_T) {
                    const int64_t tn = nt - t < QP_T ? nt - t : QP_T;
                    qp_tiles_xs[tn](nsk, pw, xr + (size_t)(t / QP_T) * (size_t)nsk * QP_SREC,
                                    y + (t0 + t) * ldy + base, ldy, (__mmask16)mask, s0 > 0);
                }
            }
        }
    }
}

/* ---- entries ------------------------------------------------------------------------------ */

/* The fewest tokens a call needs to take the panels; fewer go to the caller's fallback. From
 * bench/qgemm_shape_bench.c (K = 2048, 128 rows, AVX-512 Zen host, loaded): with 2 tokens the
 * panels gain 1.4-1.6x on IQ4_NL / IQ4_XS and tie on MXFP4 (whose fallback, the AVX2 row
 * panels, is the quicker one), 1.1x on MXFP4 at 3. One token (decode) keeps the old kernels:
 * there the weights stream from memory once and the panel packing is pure overhead. */
QP_INLINE int64_t
qp_min_tok(sp_type_t type)
{
    return type == SP_TYPE_MXFP4 ? 3 : 2;
}

void
sp__q4panel_gemm_avx512(sp_type_t type, sp_gemm_fn small, int64_t n, const void *w, size_t ws,
                        int64_t r0, int64_t r1, const void *x, size_t xs, int64_t n_tok,
                        float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
    if (type == SP_TYPE_IQ4_XS) {
        if (n_tok < qp_min_tok(type) || n % SP_QK_K != 0 || n <= 0)
            small(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
        else
            qp_gemm_xs(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
        return;
    }
    const int64_t nb = n / SP_QK32;
    /* too few tokens, an empty or too long row (its records would not fit QP_XBUF), rows too
     * far apart for the scale gathers' int32 offsets: the fallback (the same bits) */
    if (n_tok < qp_min_tok(type) || nb <= 0 || qp_chunk32(nb) < QP_T ||
        ws > (size_t)INT32_MAX / QP_ROWS ||
        (type != SP_TYPE_MXFP4 && type != SP_TYPE_IQ4_NL)) {
        small(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
        return;
    }
    qp_gemm32(type == SP_TYPE_MXFP4 ? QP_MXFP4 : QP_IQ4_NL, n, w, ws, r0, r1, x, xs, n_tok, y,
              ldy);
}

/* The packed MXFP4 / IQ4_NL gemm, any token count (one token included: a block's unpack is a
 * few instructions and the weights stream once, so decode keeps its memory-bound speed). Rows
 * too long for one tile's records (K > about 39000) take the scalar packed gemm (the same
 * bits). */
static void
qp_packed32(int kind, int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
            const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    const int64_t nb = n / SP_QK32;
    if (r1 <= r0 || n_tok <= 0)
        return;
    if (nb <= 0 || qp_chunk_pk(nb) < QP_T) {
        (kind == QP_MXFP4 ? sp__repack_mxfp4_gemm_ref : sp__repack_iq4_nl_gemm_ref)(
            n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
        return;
    }
    qp_gemm_pk(kind, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

static void
mxfp4_packed_gemm(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
                  size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    qp_packed32(QP_MXFP4, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

static void
iq4_nl_packed_gemm(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
                   size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    qp_packed32(QP_IQ4_NL, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

static void
iq4_xs_packed_gemm(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
                   size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    sp__q4panel_gemm_avx512(SP_TYPE_IQ4_XS, sp__repack_iq4_xs_gemm_avx2, n, w, ws, r0, r1, x, xs,
                            n_tok, y, ldy);
}

void
sp__q4panel_register_avx512(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_IQ4_XS] = iq4_xs_packed_gemm;
    k->repack_gemm[SP_TYPE_IQ4_NL] = iq4_nl_packed_gemm;
    k->repack_gemm[SP_TYPE_MXFP4] = mxfp4_packed_gemm;
}
