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
 * Pure functions, any thread, no heap; about 470 KiB of stack per MXFP4 / IQ4_NL call (records
 * 384 KiB, one decoded panel chunk, the lane carries), about 200 KiB per IQ4_XS call (records
 * 160 KiB): pool threads have 8 MiB. The loop nest is avx512_panels.h's.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/q32_impl.h"
#include "kernels/cpu/avx512_panels.h"
#include "kernels/cpu/avx512_simd.h"
#include "kernels/cpu/repack_impl.h"

#define QP_INLINE static inline __attribute__((always_inline))

#define QP_ROWS 16           /* rows per panel: the lanes of a register */
#define QP_T 8               /* tokens per register tile */
#define QP_TC 128            /* most tokens per token chunk */
#define QP_XBUF (160 * 1024) /* activation record bytes of one token chunk */
/* (tile, super-block) record of IQ4_XS: 8 x 256 quants, seeds [sub-block][token], scales */
#define QP_SREC (QP_T * 256 + 8 * QP_T * 4 + QP_T * 4)
#define QP_SKC 4 /* IQ4_XS super-blocks per K chunk: QP_TC tokens' records fit QP_XBUF */
/* packed IQ4_XS super-block of a panel: 8 sub-blocks x G0..G7, 8 x 16 scales, 16 d */
#define QP_SPW (8 * 512 + 8 * 64 + 64)

_Static_assert((QP_TC / QP_T) * QP_SKC * QP_SREC <= QP_XBUF, "IQ4_XS records fit");

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

/* VPERMT2D selectors that gather one dword of each of the 16 rows of two packed groups (rows
 * 0..7 from the first, 8..15 from the second) from a 64-byte half of a packed block's quants:
 * in a half, row r's 8 bytes sit in chunk (r >> 1) & 1, 64-bit lane (r & 1) | (r >> 2) << 1
 * (repack_impl.h); sel[h] picks dword h of those 8 bytes. */
QP_INLINE void
qp_group_sel(__m512i sel[2])
{
    int32_t ix[2][QP_ROWS];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < QP_ROWS; i++) {
            const int r = i & 7;
            ix[h][i] = 8 * ((r >> 1) & 1) + 2 * ((r & 1) | ((r >> 2) << 1)) + h + (i >= 8 ? 16 : 0);
        }
    sel[0] = _mm512_loadu_si512(ix[0]);
    sel[1] = _mm512_loadu_si512(ix[1]);
}

/* The 128 packed quant bytes of two groups' block (qa: rows 0..7, qb: rows 8..15) -> G0..G7
 * through lut: the first 64 bytes hold dwords 0 and 1 of every row, the next 64 dwords 2 and 3. */
QP_INLINE void
qp_decode_groups(const uint8_t *qa, const uint8_t *qb, const __m512i sel[2], __m512i lut,
                 __m512i g[8])
{
    const __m512i a0 = _mm512_loadu_si512(qa), a1 = _mm512_loadu_si512(qa + 64);
    const __m512i b0 = _mm512_loadu_si512(qb), b1 = _mm512_loadu_si512(qb + 64);
    const __m512i v[4] = {
        _mm512_permutex2var_epi32(a0, sel[0], b0),
        _mm512_permutex2var_epi32(a0, sel[1], b0),
        _mm512_permutex2var_epi32(a1, sel[0], b1),
        _mm512_permutex2var_epi32(a1, sel[1], b1),
    };
    qp_decode(v, lut, g);
}

/* ---- MXFP4 and IQ4_NL x Q8_0: row-major blocks or their packed form --------------------- */

/*
 * One driver for both layouts (avx512_panels.h's nest): the activations as records, the whole
 * K of a token chunk at once (a tile reads one sequential stream through one pointer: per block
 * its 8 tokens' quants, seeds, scales), then per panel of 16 rows its K chunks, each decoded into
 * a stack scratch (G0..G7 and 16 float scales a block) that every token tile of the chunk
 * sweeps, and at the panel's end q32_impl.h's lane tree, which stores y. The two layouts differ
 * only in how a panel chunk is decoded:
 * - row-major rows (the engine's fallback with --no-repack): 16 row streams, a 16 x 4 dword
 *   transpose per block, the scales by a gather;
 * - the load-time packed form (repack_impl.h: per block the 8 rows' scales, F16 d or E8M0 byte,
 *   then their 16 quant bytes in four 32-byte chunks), read as panels of two groups: a panel
 *   block is 4 contiguous 64-byte loads and 4 VPERMT2D, the 16 scales two 8- or 16-byte loads,
 *   the panel's weights two sequential streams.
 * Numerics (q32_impl.h's 8 lanes, carried across K chunks, the fixed tree at the end) are the
 * same whatever the layout and chunking.
 */

/* (tile, block) record: the 8 tokens' 32 quants, int32 seeds -off * sum(x), scales as floats
 * (avx512_panels.h's sp512_q8_records; 5 cache lines) */
#define QP_PREC (QP_T * SP512_Q8REC)
/* record bytes of one token chunk: the whole K of up to QP_TC tokens for K <= 2048, about 48
 * tokens at K = 5632, held in L2 while every panel sweeps them */
#ifndef QP_PBUF
#define QP_PBUF (384 * 1024)
#endif
/* blocks per K chunk: the panel scratch (16 KiB) stays in L1 beside the records (32 and 64
 * within noise in qgemm_shape_bench, 32 ahead at K = 5632) */
#ifndef QP_PKC
#define QP_PKC 32
#endif
_Static_assert(QP_PKC % 8 == 0, "K chunks hold whole lane rounds");

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
qp_chunk32(int64_t nb)
{
    const int64_t tc = QP_PBUF / (nb * QP_PREC) * QP_T;
    return tc > QP_TC ? QP_TC : tc;
}

/* The visiting position of block w of a K chunk of nbk blocks: lane k = w % 8 starts after
 * k * full + min(k, rem) blocks of the lanes before it (sp512_q8_records' lane order). */
QP_INLINE int64_t
qp_visit(int64_t w, int64_t nbk)
{
    const int64_t full = nbk / 8, rem = nbk % 8, k = w % 8;
    return k * full + (k < rem ? k : rem) + w / 8;
}

/* MXFP4's e8m0_half(e) lane-wise (q32_impl.h): e >= 2 -> (e - 1) << 23, else 0x00200000 << e */
QP_INLINE __m512
qp_e8m0_half(__m512i e)
{
    const __m512i norm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i den = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 big = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(big, den, norm));
}

/* Row-major: blocks [b0, b0 + nbk) of the panel rp[] (idx: the rows' offsets from rp[0]), in
 * memory order (16 sequential streams), each stored at its visiting position into pw (512
 * bytes a block) and pd (16 scales a block). */
QP_INLINE void
qp_pack_rows(int kind, const uint8_t *const rp[QP_ROWS], __m512i idx, int64_t b0, int64_t nbk,
             uint8_t *pw, float *pd)
{
    const __m512i lut = qp_lut(kind == QP_MXFP4 ? sp__kvalues_mxfp4 : sp__kvalues_iq4nl,
                               qp_off(kind));
    const size_t bsz = qp_bsz(kind);
    for (int64_t w = 0; w < nbk; w++) {
        const int64_t p = qp_visit(w, nbk), b = b0 + w;
        __m512i v[4], g[8];
        sp512_transpose16x4(rp, (size_t)b * bsz + qp_qs(kind), v);
        qp_decode(v, lut, g);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            _mm512_store_si512((void *)(pw + (size_t)p * 512 + i * 64), g[i]);
        /* the dword at each block start holds the scale in its low byte (MXFP4's E8M0) or
         * half (IQ4_NL's F16 d) */
        const __m512i raw = _mm512_i32gather_epi32(idx, rp[0] + (size_t)b * bsz, 1);
        _mm512_store_ps(pd + p * 16,
                        kind == QP_MXFP4
                            ? qp_e8m0_half(_mm512_and_si512(raw, _mm512_set1_epi32(0xff)))
                            : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw)));
    }
}

/*
 * Packed: blocks [b0, b0 + nbk) of the panel of groups ga (rows 0..7) and gb (rows 8..15), in
 * memory order, each at its visiting position into pw and pd. A block's 128 quant bytes: the
 * first 64 are bytes 0..7 of every row (dwords 0 and 1), the next 64 bytes 8..15 (dwords 2 and
 * 3), a row's 8 bytes in 64-bit lane (r & 1) | (r >> 2) << 1 of chunk (r >> 1) & 1; VPERMT2D
 * gathers one dword of the 16 rows into the 16 lanes.
 */
QP_INLINE void
qp_pack_groups(int kind, const uint8_t *ga, const uint8_t *gb, int64_t b0, int64_t nbk,
               uint8_t *pw, float *pd)
{
    const __m512i lut = qp_lut(kind == QP_MXFP4 ? sp__kvalues_mxfp4 : sp__kvalues_iq4nl,
                               qp_off(kind));
    const size_t pblk = qp_pblk(kind);
    const int hdr = qp_hdr(kind);
    __m512i sel[2];
    qp_group_sel(sel);
    for (int64_t w = 0; w < nbk; w++) {
        const int64_t p = qp_visit(w, nbk), b = b0 + w;
        const uint8_t *pa = ga + (size_t)b * pblk, *pb = gb + (size_t)b * pblk;
        const uint8_t *qa = pa + SP_REPACK_ROWS * hdr, *qb = pb + SP_REPACK_ROWS * hdr;
        __m512i g[8];
        qp_decode_groups(qa, qb, sel, lut, g);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            _mm512_store_si512((void *)(pw + (size_t)p * 512 + i * 64), g[i]);
        __m512 dw;
        if (kind == QP_MXFP4) {
            int64_t ea, eb;
            memcpy(&ea, pa, 8);
            memcpy(&eb, pb, 8);
            dw = qp_e8m0_half(_mm512_cvtepu8_epi32(_mm_set_epi64x(eb, ea)));
        } else {
            const __m256i d16 = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                _mm_loadu_si128((const __m128i *)pb), 1);
            dw = _mm512_cvtph_ps(d16);
        }
        _mm512_store_ps(pd + p * 16, dw);
    }
}

/* The panel chunk decoded next, which the tiles fetch while they compute (the decoding would
 * otherwise wait on memory): n byte ranges (16 rows, or 2 groups) of `lines` cache lines from
 * line-aligned starts; block step s = p * ntiles + u fetches lines [s * per, s * per + per) of
 * each, per = lines / steps rounded up, so the tiles together cover the chunk whatever their
 * number, early in the chunk rather than spread to its end (with one token an even spread
 * lost 13-17% on the packed IQ4_NL decode in repack_bench: the fetches came too late). */
typedef struct {
    uintptr_t a[QP_ROWS];
    int n;
    int64_t lines, u, ntiles, per;
} qp_pf_t;

/*
 * T tokens (records in visiting order from xr) x one decoded K chunk of nbk blocks from b0,
 * lane by lane: carry[k][t] holds lane k's partial sums of the 16 rows (zero before the first
 * chunk).
 */
QP_INLINE void
qp_tile32(const int T, int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,
          const uint8_t *xr, __m512 *carry, const qp_pf_t *pf)
{
    int64_t p = 0;
    for (int k = 0; k < 8; k++) {
        __m512 acc[QP_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[t] = b0 > 0 ? carry[k * QP_T + t] : _mm512_setzero_ps();
        for (int64_t b = k; b < nbk; b += 8, p++) {
            const int64_t l0 = (p * pf->ntiles + pf->u) * pf->per;
            for (int64_t li = l0; li < l0 + pf->per && li < pf->lines; li++)
                for (int i = 0; i < pf->n; i++)
                    _mm_prefetch((const char *)(pf->a[i] + 64 * (uintptr_t)li), _MM_HINT_T0);
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

typedef void (*qp_tile32_fn)(int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,
                             const uint8_t *xr, __m512 *carry, const qp_pf_t *pf);
#define QP_TILE32(T)                                                                           \
    static void qp_tile32_##T(int64_t b0, int64_t nbk, const uint8_t *pw, const float *pd,     \
                              const uint8_t *xr, __m512 *carry, const qp_pf_t *pf)             \
    {                                                                                          \
        qp_tile32(T, b0, nbk, pw, pd, xr, carry, pf);                                          \
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

/* A call's state for the panel nest. Row-major: panel p is rows r0 + 16 p .. + 15 (rows past
 * r1 repeat the last one; their lanes are never stored), ws the row bytes. Packed: panel p is
 * groups g0 + 2 p and the next one (the last group alone when the count is odd: its second
 * half repeats it and is never stored), ws the group bytes. */
typedef struct {
    int kind;
    bool packed;
    const uint8_t *wb, *xb;
    size_t ws, xs;
    int64_t r0, r1, nb, n_panels;
    float *y;
    int64_t ldy;
    uint8_t *pw;
    float *pd;
    __m512 (*carry)[8 * QP_T]; /* per tile: the 8 lane sums of its tokens */
} qp_ctx_t;

/* Panel p's first row and its lanes inside [r0, r1). */
static int64_t
qp_panel_rows(const qp_ctx_t *c, int64_t p, __mmask16 *m)
{
    if (!c->packed) {
        const int64_t r = c->r0 + p * QP_ROWS;
        *m = (__mmask16)((1u << (c->r1 - r < QP_ROWS ? c->r1 - r : QP_ROWS)) - 1);
        return r;
    }
    const int64_t g0 = c->r0 / SP_REPACK_ROWS, g1 = (c->r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    const int64_t g = g0 + 2 * p, base = g * SP_REPACK_ROWS;
    uint32_t mask = 0;
    for (int i = 0; i < QP_ROWS; i++)
        if (base + i >= c->r0 && base + i < c->r1 && (i < 8 || g + 1 < g1))
            mask |= 1u << i;
    *m = (__mmask16)mask;
    return base;
}

/* The bytes of panel p's chunk from block b0, as pf's ranges (n of them, each from `*start`). */
static int
qp_panel_ranges(const qp_ctx_t *c, int64_t p, int64_t b0, const uint8_t *start[QP_ROWS])
{
    if (!c->packed) {
        const int64_t r = c->r0 + p * QP_ROWS;
        const int nr = c->r1 - r < QP_ROWS ? (int)(c->r1 - r) : QP_ROWS;
        for (int i = 0; i < QP_ROWS; i++)
            start[i] = c->wb + (size_t)(r + (i < nr ? i : nr - 1)) * c->ws +
                       (size_t)b0 * qp_bsz(c->kind);
        return nr;
    }
    const int64_t g0 = c->r0 / SP_REPACK_ROWS, g1 = (c->r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    const int64_t g = g0 + 2 * p;
    start[0] = c->wb + (size_t)g * c->ws + (size_t)b0 * qp_pblk(c->kind);
    start[1] = g + 1 < g1 ? start[0] + c->ws : start[0];
    return 2;
}

static void
qp_prep32(void *ctx, int64_t t0, int64_t nt, int64_t kb, int64_t nrk, uint8_t *xr)
{
    const qp_ctx_t *c = ctx;
    sp512_q8_records(c->xb + (size_t)t0 * c->xs, c->xs, nt, kb, nrk, QP_T, qp_off(c->kind),
                     QP_PKC, xr);
}

static void
qp_pack32(void *ctx, int64_t p, int64_t b0, int64_t nbk)
{
    const qp_ctx_t *c = ctx;
    const uint8_t *start[QP_ROWS];
    qp_panel_ranges(c, p, 0, start);
    if (c->packed) {
        qp_pack_groups(c->kind, start[0], start[1], b0, nbk, c->pw, c->pd);
        return;
    }
    int32_t idx[QP_ROWS];
    for (int i = 0; i < QP_ROWS; i++)
        idx[i] = (int32_t)(start[i] - start[0]);
    qp_pack_rows(c->kind, start, _mm512_loadu_si512(idx), b0, nbk, c->pw, c->pd);
}

static void
qp_tile32_call(void *ctx, const sp512_tile_t *t)
{
    const qp_ctx_t *c = ctx;
    /* fetched next: this panel's next K chunk, else the next panel's first (none after the
     * last panel: the next token chunk finds it in cache) */
    int64_t np = t->panel, nb0 = t->b0 + t->nbk;
    if (nb0 >= c->nb) {
        np = t->panel + 1;
        nb0 = 0;
    }
    qp_pf_t pf = {.n = 0, .u = t->u, .ntiles = t->ntiles};
    if (np < c->n_panels) {
        const uint8_t *start[QP_ROWS];
        const int64_t nn = c->nb - nb0 < QP_PKC ? c->nb - nb0 : QP_PKC;
        const size_t bytes = (size_t)nn * (c->packed ? qp_pblk(c->kind) : qp_bsz(c->kind));
        pf.n = qp_panel_ranges(c, np, nb0, start);
        for (int i = 0; i < pf.n; i++)
            pf.a[i] = (uintptr_t)start[i] & ~(uintptr_t)63;
        pf.lines = (int64_t)((bytes + 63) / 64) + 1; /* + 1: the starts are not aligned */
        const int64_t steps = t->nbk * t->ntiles;
        pf.per = (pf.lines + steps - 1) / steps;
    }
    qp_tiles32[t->tn](t->b0, t->nbk, c->pw, c->pd, t->xr, c->carry[t->u], &pf);
}

/* q32_impl.h's lane tree: (0 + 4, 1 + 5, 2 + 6, 3 + 7), then (0 + 2, 1 + 3), then the two;
 * 16 rows at a time */
static void
qp_finish32(void *ctx, int64_t p, int64_t t0, int64_t nt)
{
    const qp_ctx_t *c = ctx;
    __mmask16 m;
    const int64_t base = qp_panel_rows(c, p, &m);
    for (int64_t t = 0; t < nt; t++) {
        const __m512 *a = c->carry[t / QP_T];
        const int tt = (int)(t % QP_T);
        const __m512 b0v = _mm512_add_ps(a[0 * QP_T + tt], a[4 * QP_T + tt]);
        const __m512 b1v = _mm512_add_ps(a[1 * QP_T + tt], a[5 * QP_T + tt]);
        const __m512 b2v = _mm512_add_ps(a[2 * QP_T + tt], a[6 * QP_T + tt]);
        const __m512 b3v = _mm512_add_ps(a[3 * QP_T + tt], a[7 * QP_T + tt]);
        const __m512 s = _mm512_add_ps(_mm512_add_ps(b0v, b2v), _mm512_add_ps(b1v, b3v));
        _mm512_mask_storeu_ps(c->y + (t0 + t) * c->ldy + base, m, s);
    }
}

/* Rows [r0, r1) of an MXFP4 / IQ4_NL matrix, row-major (ws: row bytes) or packed (w = group
 * 0, ws = the group bytes). qp_chunk32(nb) >= QP_T and, row-major, ws * QP_ROWS within the
 * gathers' int32 offsets (the callers check). */
static void
qp_gemm32(int kind, bool packed, int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
          const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t pw[QP_PKC * 512];
    _Alignas(64) float pd[QP_PKC * QP_ROWS];
    _Alignas(64) uint8_t xr[QP_PBUF];
    _Alignas(64) __m512 carry[QP_TC / QP_T][8 * QP_T];
    const int64_t nb = n / SP_QK32;
    const int64_t n_panels =
        packed ? ((r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS - r0 / SP_REPACK_ROWS + 1) / 2
               : (r1 - r0 + QP_ROWS - 1) / QP_ROWS;
    qp_ctx_t c = {.kind = kind, .packed = packed, .wb = w, .xb = x, .ws = ws, .xs = xs,
                  .r0 = r0, .r1 = r1, .nb = nb, .n_panels = n_panels, .y = y, .ldy = ldy,
                  .pw = pw, .pd = pd, .carry = carry};
    const sp512_panels_t d = {
        .nb = nb, .n_panels = n_panels, .tc = qp_chunk32(nb), .rkc = nb, .pkc = QP_PKC,
        .tw = QP_T, .rec = QP_PREC, .xr = xr, .ctx = &c,
        .prep = qp_prep32, .pack = qp_pack32, .tile = qp_tile32_call, .finish = qp_finish32,
    };
    sp512_panels_run(&d, n_tok);
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
    __m512i sel[2];
    qp_group_sel(sel);
    for (int64_t j = 0; j < nsk; j++) {
        const uint8_t *pa = ga + (size_t)(s0 + j) * SP_REPACK_IQ4XS_BLOCK_BYTES;
        const uint8_t *pb = gb + (size_t)(s0 + j) * SP_REPACK_IQ4XS_BLOCK_BYTES;
        uint8_t *o = pw + (size_t)j * QP_SPW;
        for (int s = 0; s < 8; s++) {
            const uint8_t *qa = pa + SP_REPACK_IQ4XS_QS + 128 * s;
            const uint8_t *qb = pb + SP_REPACK_IQ4XS_QS + 128 * s;
            __m512i g[8];
            qp_decode_groups(qa, qb, sel, lut, g);
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

/* A packed IQ4_XS call's state for the panel nest: w = group 0, ws = the group bytes; panel p
 * is groups g0 + 2 p and the next one (the last group alone when the count is odd: its second
 * half repeats it and is never stored). */
typedef struct {
    const uint8_t *wb, *xb;
    size_t ws, xs;
    int64_t r0, r1;
    float *y;
    int64_t ldy;
    uint8_t *pw;
} qp_xs_ctx_t;

static void
qp_xs_prep(void *ctx, int64_t t0, int64_t nt, int64_t kb, int64_t nrk, uint8_t *xr)
{
    const qp_xs_ctx_t *c = ctx;
    qp_prep_q8_k(c->xb + (size_t)t0 * c->xs, c->xs, nt, kb, nrk, xr);
}

/* Panel p's two groups. */
static void
qp_xs_groups(const qp_xs_ctx_t *c, int64_t p, const uint8_t **ga, const uint8_t **gb)
{
    const int64_t g0 = c->r0 / SP_REPACK_ROWS, g1 = (c->r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    const int64_t g = g0 + 2 * p;
    *ga = c->wb + (size_t)g * c->ws;
    *gb = g + 1 < g1 ? *ga + c->ws : *ga;
}

static void
qp_xs_pack(void *ctx, int64_t p, int64_t b0, int64_t nbk)
{
    const qp_xs_ctx_t *c = ctx;
    const uint8_t *ga, *gb;
    qp_xs_groups(c, p, &ga, &gb);
    qp_pack_xs(ga, gb, b0, nbk, c->pw);
}

static void
qp_xs_tile(void *ctx, const sp512_tile_t *t)
{
    const qp_xs_ctx_t *c = ctx;
    const int64_t g0 = c->r0 / SP_REPACK_ROWS, g1 = (c->r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    const int64_t g = g0 + 2 * t->panel, base = g * SP_REPACK_ROWS;
    /* lanes of rows outside [r0, r1) are computed and not stored */
    uint32_t mask = 0;
    for (int i = 0; i < QP_ROWS; i++)
        if (base + i >= c->r0 && base + i < c->r1 && (i < 8 || g + 1 < g1))
            mask |= 1u << i;
    qp_tiles_xs[t->tn](t->nbk, c->pw, t->xr, c->y + t->t0 * c->ldy + base, c->ldy,
                       (__mmask16)mask, t->b0 > 0);
}

/* Rows [r0, r1) of a packed IQ4_XS matrix (w = group 0, ws = the group bytes): K chunks of
 * QP_SKC super-blocks, partial sums through y. */
static void
qp_gemm_xs(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
           size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t pw[QP_SKC * QP_SPW];
    _Alignas(64) uint8_t xr[QP_XBUF];
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    qp_xs_ctx_t c = {.wb = w, .xb = x, .ws = ws, .xs = xs, .r0 = r0, .r1 = r1, .y = y,
                     .ldy = ldy, .pw = pw};
    const sp512_panels_t d = {
        .nb = n / SP_QK_K, .n_panels = (g1 - g0 + 1) / 2, .tc = QP_TC, .rkc = QP_SKC,
        .pkc = QP_SKC, .tw = QP_T, .rec = QP_SREC, .xr = xr, .ctx = &c,
        .prep = qp_xs_prep, .pack = qp_xs_pack, .tile = qp_xs_tile, .finish = NULL,
    };
    sp512_panels_run(&d, n_tok);
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
    qp_gemm32(type == SP_TYPE_MXFP4 ? QP_MXFP4 : QP_IQ4_NL, false, n, w, ws, r0, r1, x, xs, n_tok,
              y, ldy);
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
    if (nb <= 0 || qp_chunk32(nb) < QP_T) {
        (kind == QP_MXFP4 ? sp__repack_mxfp4_gemm_ref : sp__repack_iq4_nl_gemm_ref)(
            n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
        return;
    }
    qp_gemm32(kind, true, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
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
