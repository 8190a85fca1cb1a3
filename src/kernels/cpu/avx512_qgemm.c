/*
 * avx512_qgemm.c - Q8_0 / Q4_0 weights x Q8_0 activations with AVX-512 VNNI, as
 * row panels: 16 weight rows side by side in the 16 lanes of a register.
 *
 * Numerics are the scalar reference's, bit for bit: per 32-element block an
 * exact int32 dot product, then in float  sum = sum + (float)isum * (d_w * d_x),
 * blocks in order. Each (row, token) pair owns one float lane and sees exactly
 * that sequence whatever the tile, the panel, the chunking or the token count,
 * so gemm == vec_dot == the reference (batch invariance and level invariance).
 *
 * Layout: a panel holds, per block, 8 registers G0..G7; lane i of Gg is the 4
 * weight bytes of row i that meet bytes 4g..4g+3 of the activation block. One
 * vpdpbusd per Gg with those 4 activation bytes broadcast (an embedded
 * broadcast load) adds 4 products to each of the 16 rows. vpdpbusd multiplies
 * unsigned by signed bytes, so the weights are made unsigned and the excess is
 * removed exactly with the activation's block sum, which seeds the int32 sum:
 *   Q4_0: raw nibble q = (q - 8) + 8         -> seed -8 * sum(x)
 *   Q8_0: w ^ 0x80 = w + 128                 -> seed -128 * sum(x)
 * Per (token, block, 16 rows): 8 vpdpbusd, one convert, two multiplies, one add.
 *
 * Prefill (more than QG_FUSE_T tokens) packs each panel once per token chunk
 * into a stack scratch (unpacked nibbles, +128 bytes, scales as floats) and
 * reuses it for every token of the chunk. The chunk's activations are copied
 * once into records that a token tile reads as one sequential stream (per
 * block: the 8 tokens' quants, seeds and scales), and stay in L2 while all
 * panels sweep them. Decode (few tokens) unpacks each panel block in registers
 * and uses it at once (Q8_0 with one token: four rows to a register, see
 * fused_q8_0_one). K is cut into chunks whose partial sums go through y (a
 * float store and reload is exact), which bounds the scratch whatever n is.
 *
 * Stack: about 180 KiB per call (see QG_* below); pool threads have 8 MiB.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/avx512_panels.h"
#include "kernels/cpu/avx512_simd.h"
#include "kernels/cpu/repack_impl.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define SP_INLINE static inline __attribute__((always_inline))

#define QG_ROWS 16   /* rows per panel: the lanes of a register */
#define QG_KC 32     /* blocks per K chunk when packing (panel: 16 KiB + 2 KiB of scales) */
#define QG_TC 128    /* tokens per token chunk (160 KiB of activation records at QG_KC) */
#define QG_T 8       /* tokens per register tile (packed path) */
#define QG_FUSE_T 4  /* up to this many tokens: no packing, unpack in registers */
#define QG_XREC SP512_Q8REC /* bytes per (token, block) record: 32 quants, int32 seed, float scale */
#define QG_XBUF (QG_TC * QG_KC * QG_XREC)

enum { WT_Q8_0, WT_Q4_0 };

SP_INLINE size_t
wblock_size(int wt)
{
    return wt == WT_Q8_0 ? sizeof(sp_block_q8_0) : sizeof(sp_block_q4_0);
}

/* ---- panel unpacking ---------------------------------------------------------- */

/* Block b of the 16 rows rp[] as G0..G7 (unsigned bytes) and the 16 scales. */
SP_INLINE void
unpack_block(int wt, const uint8_t *const rp[QG_ROWS], __m512i d_idx, int64_t b, __m512i g[8],
             __m512 *dw)
{
    const size_t off = (size_t)b * wblock_size(wt);
    if (wt == WT_Q8_0) {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        sp512_transpose16x4(rp, off + 2, g);
        sp512_transpose16x4(rp, off + 18, g + 4);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            g[i] = _mm512_xor_si512(g[i], flip);
        }
    } else {
        /* low nibbles are elements 0..15 (x bytes 0..15), high ones 16..31 */
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        __m512i v[4];
        sp512_transpose16x4(rp, off + 2, v);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            g[i] = _mm512_and_si512(v[i], m4);
            g[4 + i] = _mm512_and_si512(_mm512_srli_epi32(v[i], 4), m4);
        }
    }
    /* the dword at each block start holds d in its low half */
    const __m512i raw = _mm512_i32gather_epi32(d_idx, rp[0] + off, 1);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
}

/* ---- the tiles ------------------------------------------------------------------ */

/* Where a tile's results go and whether they continue earlier partial sums. */
typedef struct {
    float *y;      /* y of the tile's first token, first row of the panel */
    int64_t ldy;
    __mmask16 m;   /* the panel's real rows */
    bool cont;     /* add to the partial sums in y (not the first K chunk) */
} tile_out_t;

SP_INLINE void
acc_init(const int T, __m512 *acc, const tile_out_t *o)
{
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        acc[t] = o->cont ? _mm512_maskz_loadu_ps(o->m, o->y + t * o->ldy) : _mm512_setzero_ps();
    }
}

SP_INLINE void
acc_store(const int T, const __m512 *acc, const tile_out_t *o)
{
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        _mm512_mask_storeu_ps(o->y + t * o->ldy, o->m, acc[t]);
    }
}

/*
 * One block of T tokens (record r of a group of tw) against 16 rows g[8], dw:
 * acc[t] += (float)(dot + seed) * (dw * dx). The T integer sums advance
 * together (weight group outer, token inner) so the core always has T
 * independent vpdpbusd chains; with one or two tokens each sum is split in
 * two chains instead (integer adds: the same exact sum).
 */
SP_INLINE void
block_step(const int T, const int tw, const __m512i g[8], __m512 dw, const uint8_t *r,
           __m512 *acc)
{
    __m512i ia[QG_T];
    if (T <= 2) {
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            __m512i a = _mm512_set1_epi32(sp512_ld_i32(r + tw * 32 + t * 4));
            __m512i b = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                a = sp512_dpbusd_bcast(a, g[i], r + t * 32 + 4 * i);
                b = sp512_dpbusd_bcast(b, g[4 + i], r + t * 32 + 16 + 4 * i);
            }
            ia[t] = _mm512_add_epi32(a, b);
        }
    } else {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            ia[t] = _mm512_set1_epi32(sp512_ld_i32(r + tw * 32 + t * 4));
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                ia[t] = sp512_dpbusd_bcast(ia[t], g[i], r + t * 32 + 4 * i);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(sp512_ld_f32(r + tw * 36 + t * 4)));
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(ia[t]), d));
    }
}

/* Weight rows whose next K chunk a tile fetches while it computes, so the next
 * panel is read from memory while this one is busy with its tokens (one
 * prefetch per row and block: every line of the row's chunk, blocks being
 * shorter than a line). */
typedef struct {
    const uint8_t *row[QG_ROWS]; /* at the chunk's first block */
    int n;
    size_t bsz;
} tile_pf_t;

/* T tokens (records of groups of QG_T) x one packed panel of nbk blocks. */
SP_INLINE void
tile_packed(const int T, int64_t nbk, const uint8_t *pw, const float *pd, const uint8_t *xr,
            const tile_out_t *o, const tile_pf_t *pf)
{
    __m512 acc[QG_T];
    acc_init(T, acc, o);
    for (int64_t j = 0; j < nbk; j++) {
        for (int i = 0; i < pf->n; i++) {
            _mm_prefetch((const char *)pf->row[i] + (size_t)j * pf->bsz, _MM_HINT_T0);
        }
        __m512i g[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            g[i] = _mm512_load_si512((const void *)(pw + j * 512 + i * 64));
        }
        block_step(T, QG_T, g, _mm512_load_ps(pd + j * 16), xr + j * (QG_T * QG_XREC), acc);
    }
    acc_store(T, acc, o);
}

/* T tokens (records of a group of T) x one panel unpacked block by block in
 * registers (decode). */
SP_INLINE void
tile_fused(const int wt, const int T, int64_t b0, int64_t nbk, const uint8_t *const rp[QG_ROWS],
           size_t ws, __m512i d_idx, const uint8_t *xr, const tile_out_t *o)
{
    __m512 acc[QG_FUSE_T];
    acc_init(T, acc, o);
    /* The panel's rows are adjacent, so the next panel is the QG_ROWS * ws
     * bytes after rp[0]: fetch them spread evenly over this panel's steps, and
     * the 16 short weight streams never wait on memory (with a single K chunk
     * exactly the next panel). Addresses as integers: past the last panel they
     * point outside the matrix, which a prefetch may do (it never faults). */
    const size_t bsz = wblock_size(wt);
    uintptr_t pf = (uintptr_t)rp[0] + QG_ROWS * ws + (size_t)b0 * QG_ROWS * bsz;
    for (int64_t j = 0; j < nbk; j++) {
        for (size_t l = 0; l < QG_ROWS * bsz; l += 64) {
            _mm_prefetch((const char *)(pf + l), _MM_HINT_T0);
        }
        pf += QG_ROWS * bsz;
        __m512i g[8];
        __m512 dw;
        unpack_block(wt, rp, d_idx, b0 + j, g, &dw);
        block_step(T, T, g, dw, xr + j * (T * QG_XREC), acc);
    }
    acc_store(T, acc, o);
}

/*
 * Q8_0 with one token (decode). The 16 x 4-byte transpose and the scale
 * gather cost more than the products here, so rows are taken four to a
 * register instead (row 4j + q in 128-bit lane j of register q), each lane
 * meeting the token's 16-byte halves broadcast to all lanes; a short add tree
 * then leaves the 16 rows' block sums in row order. Three 16-byte loads per row
 * and block (at 0, 16 and 18) cover d and the 32 quants without a gather: the
 * first two, shifted by 2 bytes, give quants 0..15, the third 16..31.
 */
SP_INLINE __m512i
load_quad(const uint8_t *const rp[QG_ROWS], int q, size_t off)
{
    __m512i a = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[q] + off)));
    a = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(rp[4 + q] + off)), 1);
    a = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(rp[8 + q] + off)), 2);
    return _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(rp[12 + q] + off)), 3);
}

static void
fused_q8_0_one(int64_t b0, int64_t nbk, const uint8_t *const rp[QG_ROWS], size_t ws,
               __m512i d_idx, const uint8_t *xr, const tile_out_t *o)
{
    const size_t bsz = sizeof(sp_block_q8_0);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[1];
    acc_init(1, acc, o);
    uintptr_t pf = (uintptr_t)rp[0] + QG_ROWS * ws + (size_t)b0 * QG_ROWS * bsz;
    (void)d_idx;
    for (int64_t j = 0; j < nbk; j++) {
        for (size_t l = 0; l < QG_ROWS * bsz; l += 64) {
            _mm_prefetch((const char *)(pf + l), _MM_HINT_T0);
        }
        pf += QG_ROWS * bsz;
        const uint8_t *r = xr + j * QG_XREC;
        const __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)r));
        const __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(r + 16)));
        const size_t off = (size_t)(b0 + j) * bsz;
        __m512i ia[4], hd[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            hd[q] = load_quad(rp, q, off);                        /* d, quants 0..13 */
            const __m512i mid = load_quad(rp, q, off + 16);      /* quants 14..29 */
            const __m512i hi = load_quad(rp, q, off + 18);       /* quants 16..31 */
            const __m512i lo = _mm512_alignr_epi8(mid, hd[q], 2); /* quants 0..15 */
            ia[q] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(lo, flip), xlo);
            ia[q] = _mm512_dpbusd_epi32(ia[q], _mm512_xor_si512(hi, flip), xhi);
        }
        /* lane j of ia[q] holds 4 partial sums of row 4j + q: two levels of
         * pairwise adds leave lane j = (rows 4j .. 4j+3), i.e. rows in order */
        const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(ia[0], ia[1]),
                                            _mm512_unpackhi_epi32(ia[0], ia[1]));
        const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(ia[2], ia[3]),
                                            _mm512_unpackhi_epi32(ia[2], ia[3]));
        const __m512i sum = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1),
                                             _mm512_unpackhi_epi64(t0, t1));
        /* the same shape picks dword 0 (d in its low half) of each row */
        const __m512i dd = _mm512_unpacklo_epi64(_mm512_unpacklo_epi32(hd[0], hd[1]),
                                                 _mm512_unpacklo_epi32(hd[2], hd[3]));
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        const __m512i isum = _mm512_add_epi32(sum, _mm512_set1_epi32(sp512_ld_i32(r + 32)));
        const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(sp512_ld_f32(r + 36)));
        acc[0] = _mm512_add_ps(acc[0], _mm512_mul_ps(_mm512_cvtepi32_ps(isum), d));
    }
    acc_store(1, acc, o);
}

typedef void (*packed_fn)(int64_t nbk, const uint8_t *pw, const float *pd, const uint8_t *xr,
                          const tile_out_t *o, const tile_pf_t *pf);
typedef void (*fused_fn)(int64_t b0, int64_t nbk, const uint8_t *const rp[QG_ROWS], size_t ws,
                         __m512i d_idx, const uint8_t *xr, const tile_out_t *o);

#define PACKED(T)                                                                              \
    static void packed_##T(int64_t nbk, const uint8_t *pw, const float *pd, const uint8_t *xr, \
                           const tile_out_t *o, const tile_pf_t *pf)                           \
    {                                                                                          \
        tile_packed(T, nbk, pw, pd, xr, o, pf);                                                \
    }
PACKED(1)
PACKED(2)
PACKED(3)
PACKED(4)
PACKED(5)
PACKED(6)
PACKED(7)
PACKED(8)
static const packed_fn packed_tiles[QG_T + 1] = {NULL,     packed_1, packed_2, packed_3, packed_4,
                                                 packed_5, packed_6, packed_7, packed_8};

#define FUSED(name, wt, T)                                                                     \
    static void fused_##name##_##T(int64_t b0, int64_t nbk, const uint8_t *const rp[QG_ROWS],  \
                                   size_t ws, __m512i d_idx, const uint8_t *xr,                \
                                   const tile_out_t *o)                                        \
    {                                                                                          \
        tile_fused(wt, T, b0, nbk, rp, ws, d_idx, xr, o);                                      \
    }
FUSED(q8_0, WT_Q8_0, 2)
FUSED(q8_0, WT_Q8_0, 3)
FUSED(q8_0, WT_Q8_0, 4)
FUSED(q4_0, WT_Q4_0, 1)
FUSED(q4_0, WT_Q4_0, 2)
FUSED(q4_0, WT_Q4_0, 3)
FUSED(q4_0, WT_Q4_0, 4)
static const fused_fn fused_q8_0[QG_FUSE_T + 1] = {NULL, fused_q8_0_one, fused_q8_0_2,
                                                   fused_q8_0_3, fused_q8_0_4};
static const fused_fn fused_q4_0[QG_FUSE_T + 1] = {NULL, fused_q4_0_1, fused_q4_0_2, fused_q4_0_3,
                                                   fused_q4_0_4};

/* nbk blocks from b0 of the panel rp[] into pw (8 x 64 bytes per block) and pd. */
SP_INLINE void
pack_panel(int wt, const uint8_t *const rp[QG_ROWS], __m512i d_idx, int64_t b0, int64_t nbk,
           uint8_t *pw, float *pd)
{
    for (int64_t j = 0; j < nbk; j++) {
        __m512i g[8];
        __m512 dw;
        unpack_block(wt, rp, d_idx, b0 + j, g, &dw);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            _mm512_store_si512((void *)(pw + j * 512 + i * 64), g[i]);
        }
        _mm512_store_ps(pd + j * 16, dw);
    }
}

static void
pack_q8_0(const uint8_t *const rp[QG_ROWS], __m512i d_idx, int64_t b0, int64_t nbk, uint8_t *pw,
          float *pd)
{
    pack_panel(WT_Q8_0, rp, d_idx, b0, nbk, pw, pd);
}

static void
pack_q4_0(const uint8_t *const rp[QG_ROWS], __m512i d_idx, int64_t b0, int64_t nbk, uint8_t *pw,
          float *pd)
{
    pack_panel(WT_Q4_0, rp, d_idx, b0, nbk, pw, pd);
}

/* ---- single dot products ------------------------------------------------------ */

/* One row, one token: per block a 256-bit vpdpbusd, the exact int32 sum, and the
 * reference's float steps. */
SP_INLINE void
vec_dot_q(int wt, int64_t n, float *s, const void *w, const void *x)
{
    const sp_block_q8_0 *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i c = _mm256_set1_epi8(wt == WT_Q8_0 ? (char)0x80 : 8);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / SP_QK8_0; b++) {
        __m256i wu;
        sp_fp16_t wd;
        if (wt == WT_Q8_0) {
            const sp_block_q8_0 *p = (const sp_block_q8_0 *)w + b;
            wu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p->qs), c);
            wd = p->d;
        } else {
            const sp_block_q4_0 *p = (const sp_block_q4_0 *)w + b;
            const __m128i raw = _mm_loadu_si128((const __m128i *)p->qs);
            const __m256i r2 = _mm256_inserti128_si256(_mm256_castsi128_si256(raw),
                                                       _mm_srli_epi16(raw, 4), 1);
            wu = _mm256_and_si256(r2, m4);
            wd = p->d;
        }
        const __m256i xq = _mm256_loadu_si256((const __m256i *)xb[b].qs);
        const __m256i v =
            _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, xq),
                             _mm256_dpbusd_epi32(_mm256_setzero_si256(), c, xq));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        const int32_t isum = _mm_cvtsi128_si32(h);
        /* separate statements: a compiler that contracts a * b + c inside one
         * expression (clang's default) must not fuse these into an FMA */
        const float d = _cvtsh_ss(wd) * _cvtsh_ss(xb[b].d);
        const float p = (float)isum * d;
        sum += p;
    }
    *s = sum;
}

/* ---- the driver ------------------------------------------------------------- */

/* What the records of a call are made from: the weight type, the tokens per tile, x. */
typedef struct {
    int wt, tw;
    const uint8_t *xb;
    size_t xs;
} qg_x_t;

/* A row-major call's state for the panel nest (avx512_panels.h). */
typedef struct {
    qg_x_t x;    /* first: qg_prep's view */
    int wt;
    bool fused;  /* few tokens: each panel block unpacked in registers, no packing */
    const uint8_t *wb;
    size_t ws;
    int64_t r0, r1, nb;
    float *y;
    int64_t ldy;
    uint8_t *pw; /* the panel chunk packed last (prefill) */
    float *pd;
} qg_ctx_t;

/* Panel p's 16 row pointers (rows past r1 repeat the last one; their lanes are never
 * stored), the scale gathers' offsets, and its real rows. */
static int
qg_panel(const qg_ctx_t *c, int64_t p, const uint8_t *rp[QG_ROWS], __m512i *d_idx)
{
    const int64_t r = c->r0 + p * QG_ROWS;
    const int nr = c->r1 - r < QG_ROWS ? (int)(c->r1 - r) : QG_ROWS;
    int32_t idx[QG_ROWS];
    for (int i = 0; i < QG_ROWS; i++) {
        const int ri = i < nr ? i : nr - 1;
        rp[i] = c->wb + (size_t)(r + ri) * c->ws;
        idx[i] = (int32_t)((size_t)ri * c->ws);
    }
    *d_idx = _mm512_loadu_si512(idx);
    return nr;
}

/* The records of both drivers' calls (qg_ctx_t and p16_ctx_t begin with a qg_x_t). */
static void
qg_prep(void *ctx, int64_t t0, int64_t nt, int64_t kb, int64_t nrk, uint8_t *xr)
{
    const qg_x_t *c = ctx;
    sp512_q8_records(c->xb + (size_t)t0 * c->xs, c->xs, nt, kb, nrk, c->tw,
                     c->wt == WT_Q8_0 ? 128 : 8, 0, xr);
}

static void
qg_pack(void *ctx, int64_t p, int64_t b0, int64_t nbk)
{
    qg_ctx_t *c = ctx;
    const uint8_t *rp[QG_ROWS];
    __m512i d_idx;
    qg_panel(c, p, rp, &d_idx);
    if (c->wt == WT_Q8_0) {
        pack_q8_0(rp, d_idx, b0, nbk, c->pw, c->pd);
    } else {
        pack_q4_0(rp, d_idx, b0, nbk, c->pw, c->pd);
    }
}

static void
qg_tile(void *ctx, const sp512_tile_t *t)
{
    const qg_ctx_t *c = ctx;
    const int64_t r = c->r0 + t->panel * QG_ROWS;
    const int nr = c->r1 - r < QG_ROWS ? (int)(c->r1 - r) : QG_ROWS;
    const tile_out_t o = {c->y + t->t0 * c->ldy + r, c->ldy, (__mmask16)((1u << nr) - 1),
                          t->b0 > 0};
    if (c->fused) {
        const uint8_t *rp[QG_ROWS];
        __m512i d_idx;
        qg_panel(c, t->panel, rp, &d_idx);
        (c->wt == WT_Q8_0 ? fused_q8_0 : fused_q4_0)[t->tn](t->b0, t->nbk, rp, c->ws, d_idx,
                                                              t->xr, &o);
        return;
    }
    /* the panel packed next: the following rows, else the first ones of the next K chunk
     * or token chunk; tile u fetches the rows i of that panel with i % ntiles == u */
    int64_t pr = r + QG_ROWS, pb = t->b0;
    if (pr >= c->r1) {
        pr = c->r0;
        pb = t->b0 + t->nbk < c->nb ? t->b0 + t->nbk : 0;
    }
    const int pn = c->r1 - pr < QG_ROWS ? (int)(c->r1 - pr) : QG_ROWS;
    tile_pf_t pf = {.n = 0, .bsz = wblock_size(c->wt)};
    for (int64_t i = t->u; i < pn; i += t->ntiles) {
        pf.row[pf.n++] = c->wb + (size_t)(pr + i) * c->ws + (size_t)pb * pf.bsz;
    }
    packed_tiles[t->tn](t->nbk, c->pw, c->pd, t->xr, &o, &pf);
}

static void
qgemm(int wt, int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
      size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t pw[QG_KC * 512];
    _Alignas(64) float pd[QG_KC * QG_ROWS];
    _Alignas(64) uint8_t xr[QG_XBUF];
    const int64_t nb = n / SP_QK8_0;
    const bool fused = n_tok <= QG_FUSE_T;
    const uint8_t *wb = w, *xb = x;

    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    if (nb == 0) { /* an empty dot product is 0, as in the reference */
        for (int64_t t = 0; t < n_tok; t++) {
            memset(y + t * ldy + r0, 0, sizeof(float) * (size_t)(r1 - r0));
        }
        return;
    }
    if (ws > (size_t)INT32_MAX / QG_ROWS) {
        /* rows too long for the gathers' int32 offsets: one dot at a time
         * (vec_dot_q has the same bits) */
        for (int64_t t = 0; t < n_tok; t++) {
            for (int64_t r = r0; r < r1; r++) {
                vec_dot_q(wt, n, &y[t * ldy + r], wb + (size_t)r * ws, xb + (size_t)t * xs);
            }
        }
        return;
    }
    const int tw = fused ? (int)n_tok : QG_T;
    qg_ctx_t c = {.x = {wt, tw, xb, xs}, .wt = wt, .fused = fused, .wb = wb, .ws = ws,
                  .r0 = r0, .r1 = r1, .nb = nb, .y = y, .ldy = ldy, .pw = pw, .pd = pd};
    /* fused: all tokens in one tile, K chunks as long as the records allow */
    const int64_t kc = fused ? QG_XBUF / (n_tok * QG_XREC) : QG_KC;
    const sp512_panels_t d = {
        .nb = nb, .n_panels = (r1 - r0 + QG_ROWS - 1) / QG_ROWS,
        .tc = fused ? n_tok : QG_TC, .rkc = kc, .pkc = kc, .tw = tw,
        .rec = (size_t)tw * QG_XREC, .xr = xr, .ctx = &c,
        .prep = qg_prep, .pack = fused ? NULL : qg_pack, .tile = qg_tile, .finish = NULL,
    };
    sp512_panels_run(&d, n_tok);
}

/* The panels for any token count (one included): the gemm before the one-token kernel,
 * kept callable for bench/decode_bench.c's A/B runs. */
static void
panels_q8_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
            size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    qgemm(WT_Q8_0, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

static void
panels_q4_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
            size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    qgemm(WT_Q4_0, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

sp_gemm_fn
sp__avx512_qgemm_panels(sp_type_t type)
{
    return type == SP_TYPE_Q8_0 ? panels_q8_0 : type == SP_TYPE_Q4_0 ? panels_q4_0 : NULL;
}

/* The table's entries: one token (batch-1 decode) goes to avx512_gemv.c's kernel, which
 * reads the row layout at the memory's rate where a panel's transpose would not; more
 * tokens to the panels. Both give the reference's bits, so the split is invisible. */
static void
gemm_q8_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
          int64_t n_tok, float *y, int64_t ldy)
{
    if (n_tok == 1) {
        sp__avx512_gemv_q8_0(n, w, ws, r0, r1, x, y);
        return;
    }
    qgemm(WT_Q8_0, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

static void
gemm_q4_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
          int64_t n_tok, float *y, int64_t ldy)
{
    if (n_tok == 1) {
        sp__avx512_gemv_q4_0(n, w, ws, r0, r1, x, y);
        return;
    }
    qgemm(WT_Q4_0, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

/* ---- the load-time packed form (SP_REPACK_PANEL16, kernels.h) ---------------------- */

/*
 * The packed weights hold, for every panel of the matrix, what pack_panel makes per call:
 * Q8_0 as G0..G7 already + 128 (8 x 64 bytes a block), Q4_0 as the four registers whose
 * AND 0x0f gives G0..G3 and whose shift by 4 then AND gives G4..G7 (4 x 64 bytes a block:
 * dword i of register m is row i's quant bytes 4m..4m+3, the file's nibbles moved, not
 * changed), then the 16 scales in row order as F16. So prefill, batched decode and one
 * token all run tile_packed's arithmetic straight from them: no transpose, no gather, no
 * per-call packing. A tile of T tokens reads a panel's K chunk as one contiguous stream
 * (pairs of blocks: 17 cache lines for Q8_0, 9 for Q4_0) and, when pf is set, fetches the
 * same stretch of the panel computed next, spread over its blocks.
 */
/* Block b of the panel group gw as G0..G7 and the 16 scales; with pf, first ask for block b's
 * bytes of the stream at pf (the pair's half that holds it). */
SP_INLINE void
p16_block(const int wt, const uint8_t *gw, int64_t b, const uint8_t *pf, __m512i g[8],
          __m512 *dw)
{
    const sp_type_t type = wt == WT_Q8_0 ? SP_TYPE_Q8_0 : SP_TYPE_Q4_0;
    if (pf != NULL) {
        /* blocks b of a group cover bytes [b, b + 1) * half a pair: the pair, whole */
        const size_t half_pair = sp__p16_pair_bytes_of(type) / 2;
        const uintptr_t p = (uintptr_t)pf + (size_t)b * half_pair;
        for (size_t l = 0; l < half_pair; l += 64) {
            _mm_prefetch((const char *)(p + l), _MM_HINT_T0);
        }
    }
    const uint8_t *q = gw + sp__p16_qs_off_of(type, b);
    if (wt == WT_Q8_0) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            g[i] = _mm512_loadu_si512((const void *)(q + i * 64));
        }
    } else {
        const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + i * 64));
            g[i] = _mm512_and_si512(v, m4);
            g[4 + i] = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
        }
    }
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gw + sp__p16_d_off_of(type, b))));
}

SP_INLINE void
tile_p16(const int wt, const int T, int tw, int64_t b0, int64_t nbk, const uint8_t *gw,
         const uint8_t *xr, const tile_out_t *o, const uint8_t *pf)
{
    __m512 acc[QG_T];
    acc_init(T, acc, o);
    for (int64_t j = 0; j < nbk; j++) {
        __m512i g[8];
        __m512 dw;
        p16_block(wt, gw, b0 + j, pf, g, &dw);
        block_step(T, tw, g, dw, xr + j * tw * QG_XREC, acc);
    }
    acc_store(T, acc, o);
}

/*
 * One token over two groups at once, ga and gb, their blocks interleaved (a block of one, then
 * the same block of the other), each fetching its own stream SP_PF_ONE_TOKEN ahead: the
 * one-token form of tile_p16 over two weight streams, as avx2_repack_impl.h's rpx_gemv_two.
 * A thread's groups are one sequential stream otherwise, and on one stream next to the
 * tile's arithmetic the core's prefetchers fall behind a plain read (docs/design.md, "Two
 * weight streams at AVX-512"). Each group's blocks see tile_p16's operations in the same
 * order: the same bits.
 */
SP_INLINE void
tile_p16_two(const int wt, int64_t nb, const uint8_t *ga, const uint8_t *gb, const uint8_t *xr,
             const tile_out_t *oa, const tile_out_t *ob)
{
    __m512 acc[2];
    acc_init(1, acc, oa);
    acc_init(1, acc + 1, ob);
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            const uint8_t *gw = s == 0 ? ga : gb;
            __m512i g[8];
            __m512 dw;
            p16_block(wt, gw, b, gw + SP_PF_ONE_TOKEN, g, &dw);
            block_step(1, 1, g, dw, xr + b * QG_XREC, acc + s);
        }
    }
    acc_store(1, acc, oa);
    acc_store(1, acc + 1, ob);
}

static void
p16_two_q8_0(int64_t nb, const uint8_t *ga, const uint8_t *gb, const uint8_t *xr,
             const tile_out_t *oa, const tile_out_t *ob)
{
    tile_p16_two(WT_Q8_0, nb, ga, gb, xr, oa, ob);
}

static void
p16_two_q4_0(int64_t nb, const uint8_t *ga, const uint8_t *gb, const uint8_t *xr,
             const tile_out_t *oa, const tile_out_t *ob)
{
    tile_p16_two(WT_Q4_0, nb, ga, gb, xr, oa, ob);
}

typedef void (*p16_fn)(int tw, int64_t b0, int64_t nbk, const uint8_t *gw, const uint8_t *xr,
                       const tile_out_t *o, const uint8_t *pf);
#define P16(W, T)                                                                          \
    static void p16_##W##_##T(int tw, int64_t b0, int64_t nbk, const uint8_t *gw,          \
                              const uint8_t *xr, const tile_out_t *o, const uint8_t *pf)   \
    {                                                                                      \
        tile_p16(WT_##W, T, tw, b0, nbk, gw, xr, o, pf);                                   \
    }
#define P16_ALL(W)                                                                         \
    P16(W, 1) P16(W, 2) P16(W, 3) P16(W, 4) P16(W, 5) P16(W, 6) P16(W, 7) P16(W, 8)         \
    static const p16_fn p16_tiles_##W[QG_T + 1] = {NULL,          p16_##W##_1, p16_##W##_2, \
                                                   p16_##W##_3,   p16_##W##_4, p16_##W##_5, \
                                                   p16_##W##_6,   p16_##W##_7, p16_##W##_8};
P16_ALL(Q8_0)
P16_ALL(Q4_0)

/* A packed call's state for the panel nest: w = group 0 of the packed matrix, gs its group
 * bytes; rows [r0, r1) may start and end inside a group (the lanes outside are masked off,
 * never stored). */
typedef struct {
    qg_x_t x; /* first: qg_prep's view */
    int wt, tw;
    const uint8_t *wb;
    size_t gs;
    int64_t r0, r1, nb, n_tok;
    float *y;
    int64_t ldy;
} p16_ctx_t;

/* The lanes of group g that rows [r0, r1) hold. */
SP_INLINE __mmask16
p16_mask(int64_t g, int64_t r0, int64_t r1)
{
    const int64_t lo = r0 > g * SP_P16_ROWS ? r0 - g * SP_P16_ROWS : 0;
    const int64_t hi = r1 < (g + 1) * SP_P16_ROWS ? r1 - g * SP_P16_ROWS : SP_P16_ROWS;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

static void
p16_tile(void *ctx, const sp512_tile_t *t)
{
    const p16_ctx_t *c = ctx;
    const int64_t g0 = c->r0 / SP_P16_ROWS, g1 = (c->r1 + SP_P16_ROWS - 1) / SP_P16_ROWS;
    const int64_t g = g0 + t->panel;
    const __mmask16 m = p16_mask(g, c->r0, c->r1);
    const uint8_t *gw = c->wb + (size_t)g * c->gs;
    const size_t half_pair =
        sp__p16_pair_bytes_of(c->wt == WT_Q8_0 ? SP_TYPE_Q8_0 : SP_TYPE_Q4_0) / 2;
    /* the panel computed next: the next group, else the first one at the next K chunk
     * (shifted so that its blocks line up with this chunk's). With one token the tile
     * streams the contiguous groups once, so it fetches its own stream SP_PF_ONE_TOKEN
     * bytes ahead (repack_impl.h) instead: a whole group ahead cost on Zen 5 (repack_bench
     * q8_0, one thread, 1.16-1.31x the old kernel without, 1.05-1.14x with), none lost
     * 35-50% of the read's rate on the Emerald Rapids class VM (Q4_0 at 50-60% of it, 78-80%
     * with 4 KiB ahead: bench/decode_bench.c). */
    const uint8_t *pf = c->n_tok == 1 ? gw + SP_PF_ONE_TOKEN
                        : t->u != 0 ? NULL
                        : g + 1 < g1             ? gw + c->gs
                        : t->b0 + t->nbk < c->nb
                            ? c->wb + (size_t)g0 * c->gs + (size_t)t->nbk * half_pair
                            : NULL;
    const tile_out_t o = {c->y + t->t0 * c->ldy + g * SP_P16_ROWS, c->ldy, m, t->b0 > 0};
    (c->wt == WT_Q8_0 ? p16_tiles_Q8_0 : p16_tiles_Q4_0)[t->tn](c->tw, t->b0, t->nbk, gw, t->xr,
                                                               &o, pf);
}

static void
packed_gemm(int wt, int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x,
            size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t xr[QG_XBUF];
    const int64_t nb = n / SP_QK8_0;
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    if (nb == 0) { /* an empty dot product is 0, as in the reference */
        for (int64_t t = 0; t < n_tok; t++) {
            memset(y + t * ldy + r0, 0, sizeof(float) * (size_t)(r1 - r0));
        }
        return;
    }
    /* Up to QG_T tokens: one tile, records of exactly those tokens, K chunks as long as the
     * record buffer allows (each panel is read once anyway). More: tiles of QG_T sweep a
     * panel's K chunk of QG_KC blocks (17 KiB of Q8_0, 9 KiB of Q4_0) while it sits in L1.
     * Chunks start on even blocks, so a chunk's panel bytes are whole pairs, contiguous. */
    const int tw = n_tok < QG_T ? (int)n_tok : QG_T;
    const int64_t kc = n_tok <= QG_T ? (QG_XBUF / (tw * QG_XREC)) & ~(int64_t)1 : QG_KC;
    const int64_t g0 = r0 / SP_P16_ROWS, g1 = (r1 + SP_P16_ROWS - 1) / SP_P16_ROWS;
    p16_ctx_t c = {.x = {wt, tw, x, xs}, .wt = wt, .tw = tw, .wb = w, .gs = gs, .r0 = r0,
                   .r1 = r1, .nb = nb, .n_tok = n_tok, .y = y, .ldy = ldy};
    if (n_tok == 1 && nb <= kc && g1 - g0 >= 2) {
        /* one token, the whole K in one record chunk: group g0 + i with g0 + h + i over two
         * streams, an odd last group alone (tile_p16_two) */
        const int64_t h = (g1 - g0) / 2;
        const uint8_t *wb = w;
        qg_prep(&c, 0, 1, 0, nb, xr);
        for (int64_t g = g0; g < g0 + h; g++) {
            const tile_out_t oa = {y + g * SP_P16_ROWS, ldy, p16_mask(g, r0, r1), false};
            const tile_out_t ob = {y + (g + h) * SP_P16_ROWS, ldy, p16_mask(g + h, r0, r1),
                                   false};
            (wt == WT_Q8_0 ? p16_two_q8_0 : p16_two_q4_0)(nb, wb + (size_t)g * gs,
                                                          wb + (size_t)(g + h) * gs, xr, &oa,
                                                          &ob);
        }
        if (g0 + 2 * h < g1) {
            const int64_t g = g1 - 1;
            const tile_out_t o = {y + g * SP_P16_ROWS, ldy, p16_mask(g, r0, r1), false};
            const uint8_t *gw = wb + (size_t)g * gs;
            (wt == WT_Q8_0 ? p16_tiles_Q8_0 : p16_tiles_Q4_0)[1](1, 0, nb, gw, xr, &o,
                                                                gw + SP_PF_ONE_TOKEN);
        }
        return;
    }
    const sp512_panels_t d = {
        .nb = nb, .n_panels = g1 - g0, .tc = n_tok <= QG_T ? n_tok : QG_TC, .rkc = kc,
        .pkc = kc, .tw = tw, .rec = (size_t)tw * QG_XREC, .xr = xr, .ctx = &c,
        .prep = qg_prep, .pack = NULL, .tile = p16_tile, .finish = NULL,
    };
    sp512_panels_run(&d, n_tok);
}

static void
packed_gemm_q8_0(int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x,
                 size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm(WT_Q8_0, n, w, gs, r0, r1, x, xs, n_tok, y, ldy);
}

static void
packed_gemm_q4_0(int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x,
                 size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm(WT_Q4_0, n, w, gs, r0, r1, x, xs, n_tok, y, ldy);
}

sp_gemm_fn
sp__avx512_qgemm_packed(sp_type_t type)
{
    return type == SP_TYPE_Q8_0 ? packed_gemm_q8_0 : type == SP_TYPE_Q4_0 ? packed_gemm_q4_0 : NULL;
}

void
sp__avx512_qgemm_packed_register(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_Q8_0] = packed_gemm_q8_0;
    k->repack_layout[SP_TYPE_Q8_0] = SP_REPACK_PANEL16;
    k->repack_gemm[SP_TYPE_Q4_0] = packed_gemm_q4_0;
    k->repack_layout[SP_TYPE_Q4_0] = SP_REPACK_PANEL16;
}

static void
vec_dot_q8_0(int64_t n, float *s, const void *w, const void *x)
{
    vec_dot_q(WT_Q8_0, n, s, w, x);
}

static void
vec_dot_q4_0(int64_t n, float *s, const void *w, const void *x)
{
    vec_dot_q(WT_Q4_0, n, s, w, x);
}

void
sp__avx512_qgemm_register(sp_cpu_kernels_t *k)
{
    k->vec_dot[SP_TYPE_Q8_0] = vec_dot_q8_0;
    k->gemm[SP_TYPE_Q8_0] = gemm_q8_0;
    k->vec_dot[SP_TYPE_Q4_0] = vec_dot_q4_0;
    k->gemm[SP_TYPE_Q4_0] = gemm_q4_0;
}
