/*
 * amx_qgemm.c - Q8_0 / Q4_0 weights x Q8_0 activations on AMX-INT8 tiles, over the same
 * packed 16-row panels (SP_REPACK_PANEL16) that avx512_qgemm.c reads: a model packed once runs
 * at the avx512 or the amx level.
 *
 * Numerics are the scalar reference's, bit for bit: per 32-element block an exact int32 dot
 * product, then in float  sum = sum + (float)isum * (d_w * d_x),  blocks in order, per (row,
 * token). One TDPBSSD over one block (K = 32 bytes) gives exactly the 16 x 16 int32 block sums
 * of a tile of 16 tokens against a panel's 16 rows: products of signed bytes added in int32
 * (at most 32 * 128 * 128 in magnitude, no overflow), in whatever order, which integer
 * addition makes irrelevant. The float epilogue then runs on AVX-512 from the stored C tile:
 * C row t is token t's 16 row sums, the lanes of one register, so each (row, token) pair owns
 * one float lane and sees the reference's sequence whatever the tiles, chunks or token count
 * (batch and level invariance).
 *
 * B operand: a panel block's G0..G7 (8 rows of 64 bytes; byte 4i + k of row g is row i's
 * weight byte 4g + k) already are K/4 rows of 16 columns of 4 bytes. The panels hold the VNNI
 * kernel's unsigned codes (Q8_0 w + 128, Q4_0 the raw nibble w + 8), so each panel chunk is
 * turned back into signed quants once, into a 16 KiB scratch that all token tiles of the chunk
 * read (Q8_0: XOR 0x80; Q4_0: AND / shift, minus 8). Signed x signed needs no activation-sum
 * correction: the epilogue is one load, one convert, two multiplies and one add per token and
 * block; TDPBSUD on the unsigned codes plus the VNNI kernels' seeds measured about 1.2x slower
 * (docs/design.md, "AMX-INT8 tiles for the packed Q8_0 and Q4_0 panels").
 *
 * Blocks cannot share a tile product (K = 64 would add two blocks' sums before their different
 * scales apply), so every block costs one TDPBSSD, one C store and 16 epilogue rows; the VNNI
 * kernel spends 8 VPDPBUSD more per row. The product of block j + 1 runs on the tile unit while
 * the epilogue of block j runs on the vector units (two C tiles, alternated).
 *
 * Tiles: tmm0, tmm1 C (16 tokens x 16 int32), tmm2, tmm3 A (16 tokens x 32 activation bytes:
 * a record group's quants, 32 bytes apart), tmm4, tmm5 B (8 x 64 weight bytes).
 *
 * Few tokens: the VNNI kernel (sp__avx512_qgemm_packed); the tiles only pay once a tile is
 * mostly full (AMX_MIN_TOK, measured: docs/design.md). Stack: about 180 KiB per call.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/avx512_panels.h"
#include "kernels/cpu/repack_impl.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AX_TT 16                    /* tokens per tile: A's and C's rows */
#define AX_KC 32                    /* blocks per K chunk (the B scratch: 16 KiB) */
#define AX_TC 128                   /* tokens per token chunk (160 KiB of records) */
#define AX_REC (AX_TT * SP512_Q8REC) /* bytes of one (tile, block) record */
#define AX_XBUF ((AX_TC / AX_TT) * AX_KC * AX_REC)
#define AX_BQ 512                   /* B bytes per block: 8 rows of 64 */

enum { WT_Q8_0, WT_Q4_0 };

/* The tile configuration (palette 1): C 16 x 64 bytes, A 16 x 32, B 8 x 64. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ax_cfg_t;

static void
ax_config(void)
{
    _Alignas(64) ax_cfg_t c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 2; i++) {
        c.colsb[i] = 64;
        c.rows[i] = AX_TT;
        c.colsb[2 + i] = 32;
        c.rows[2 + i] = AX_TT;
        c.colsb[4 + i] = 64;
        c.rows[4 + i] = 8;
    }
    _tile_loadconfig(&c);
}

/* Where a tile's results go and whether they continue earlier partial sums. */
typedef struct {
    float *y;    /* y of the tile's first token, first row of the panel */
    int64_t ldy;
    __mmask16 m; /* the panel's rows in [r0, r1) */
    int tn;      /* the tile's real tokens (the others are zero records, never stored) */
    bool cont;   /* add to the partial sums in y (not the first K chunk) */
} ax_out_t;

/*
 * Block j's epilogue: C (stored, token t's 16 row sums at c + 16 t) in float, times d_w * d_x,
 * added to the accumulators. Separate multiply and add (no FMA): the reference rounds the
 * product before the sum.
 */
static inline __attribute__((always_inline)) void
ax_epilogue(const int32_t *c, const uint8_t *rec, __m512 dw, __m512 acc[AX_TT])
{
    const float *dx = (const float *)(rec + AX_TT * 36);
#pragma GCC unroll 16
    for (int t = 0; t < AX_TT; t++) {
        const __m512i isum = _mm512_load_si512(c + 16 * t);
        const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t]));
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(isum), d));
    }
}

/*
 * One token tile (16 records) x one panel chunk of nbk blocks. bq: block 0's B bytes, block
 * j's at bq + (j / 2) * bps + (j & 1) * AX_BQ (the packed pairs, or the scratch with bps =
 * 2 * AX_BQ); ds: block 0's 16 F16 scales, block j's at ds + (j / 2) * dps + (j & 1) * 32.
 * xr: the tile's records, AX_REC apart. pf: NULL or the panel computed next, block 0 of the
 * chunk, fetched half a pair (pfb bytes) a block.
 */
static void
ax_tile(int64_t nbk, const uint8_t *bq, size_t bps, const uint8_t *ds, size_t dps,
        const uint8_t *xr, const ax_out_t *o, const uint8_t *pf, size_t pfb)
{
    _Alignas(64) int32_t c[2][AX_TT * 16];
    __m512 acc[AX_TT];
#pragma GCC unroll 16
    for (int t = 0; t < AX_TT; t++) {
        acc[t] = o->cont && t < o->tn ? _mm512_maskz_loadu_ps(o->m, o->y + t * o->ldy)
                                      : _mm512_setzero_ps();
    }
#define AX_BQ_AT(j) (bq + (size_t)((j) / 2) * bps + (size_t)((j) & 1) * AX_BQ)
#define AX_DW_AT(j)                                                                            \
    _mm512_cvtph_ps(_mm256_loadu_si256(                                                        \
        (const __m256i *)(ds + (size_t)((j) / 2) * dps + (size_t)((j) & 1) * 32)))
    /* block 0 into C0; then per pair: block j + 1 into C1 while C0's epilogue runs, block
     * j + 2 into C0 while C1's does (tile numbers must be constants: unrolled by hand) */
    _tile_loadd(2, xr, 32);
    _tile_loadd(4, AX_BQ_AT(0), 64);
    _tile_zero(0);
    _tile_dpbssd(0, 2, 4);
    for (int64_t j = 0; j < nbk; j += 2) {
        if (pf != NULL) {
            for (size_t l = 0; l < pfb; l += 64) {
                _mm_prefetch((const char *)(pf + (size_t)(j / 2) * pfb * 2 + l), _MM_HINT_T0);
                _mm_prefetch((const char *)(pf + (size_t)(j / 2) * pfb * 2 + pfb + l), _MM_HINT_T0);
            }
        }
        const bool two = j + 1 < nbk;
        if (two) {
            _tile_loadd(3, xr + (size_t)(j + 1) * AX_REC, 32);
            _tile_loadd(5, AX_BQ_AT(j + 1), 64);
            _tile_zero(1);
            _tile_dpbssd(1, 3, 5);
        }
        _tile_stored(0, c[0], 64);
        ax_epilogue(c[0], xr + (size_t)j * AX_REC, AX_DW_AT(j), acc);
        if (!two) {
            break;
        }
        if (j + 2 < nbk) {
            _tile_loadd(2, xr + (size_t)(j + 2) * AX_REC, 32);
            _tile_loadd(4, AX_BQ_AT(j + 2), 64);
            _tile_zero(0);
            _tile_dpbssd(0, 2, 4);
        }
        _tile_stored(1, c[1], 64);
        ax_epilogue(c[1], xr + (size_t)(j + 1) * AX_REC, AX_DW_AT(j + 1), acc);
    }
#undef AX_BQ_AT
#undef AX_DW_AT
    /* a constant trip count, so that acc[] stays in registers */
#pragma GCC unroll 16
    for (int t = 0; t < AX_TT; t++) {
        if (t < o->tn) {
            _mm512_mask_storeu_ps(o->y + t * o->ldy, o->m, acc[t]);
        }
    }
}

/* A call's state for the panel nest (avx512_panels.h): w = group 0 of the packed matrix, gs
 * its group bytes; rows [r0, r1) may start and end inside a group. */
typedef struct {
    int wt;
    const uint8_t *xb;
    size_t xs;
    int64_t n_tok;
    const uint8_t *wb;
    size_t gs;
    int64_t r0, r1, nb;
    float *y;
    int64_t ldy;
    uint8_t *scratch; /* the panel chunk's signed B blocks */
} ax_ctx_t;

/* Records of 16-token groups (seed slots unused: 0); a chunk's last group, when short, gets
 * zero records for its missing tokens, so the tile's spare rows multiply zeros (and are never
 * stored). */
static void
ax_prep(void *ctx, int64_t t0, int64_t nt, int64_t kb, int64_t nrk, uint8_t *xr)
{
    const ax_ctx_t *c = ctx;
    sp512_q8_records(c->xb + (size_t)t0 * c->xs, c->xs, nt, kb, nrk, AX_TT, 0, 0, xr);
    const int64_t real = nt % AX_TT;
    if (real != 0) {
        uint8_t *g = xr + (size_t)(nt / AX_TT) * (size_t)nrk * AX_REC;
        for (int64_t b = 0; b < nrk; b++) {
            uint8_t *r = g + (size_t)b * AX_REC;
            memset(r + real * 32, 0, (size_t)(AX_TT - real) * 32);
            memset(r + AX_TT * 32 + real * 4, 0, (size_t)(AX_TT - real) * 4);
            memset(r + AX_TT * 36 + real * 4, 0, (size_t)(AX_TT - real) * 4);
        }
    }
}

/* Q4_0: the panel chunk's nibble registers split into signed B blocks (G_m = (v & 0x0f) - 8,
 * G_m+4 = ((v >> 4) & 0x0f) - 8; avx512_qgemm.c's layout comment). */
static void
ax_pack_q4(void *ctx, int64_t panel, int64_t b0, int64_t nbk)
{
    const ax_ctx_t *c = ctx;
    const uint8_t *gw = c->wb + (size_t)(c->r0 / SP_P16_ROWS + panel) * c->gs;
    const __m512i m4 = _mm512_set1_epi8(0x0f), e8 = _mm512_set1_epi8(8);
    for (int64_t j = 0; j < nbk; j++) {
        const uint8_t *q = gw + sp__p16_qs_off_of(SP_TYPE_Q4_0, b0 + j);
        uint8_t *o = c->scratch + (size_t)j * AX_BQ;
        for (int i = 0; i < 4; i++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + i * 64));
            _mm512_store_si512((void *)(o + i * 64), _mm512_sub_epi8(_mm512_and_si512(v, m4), e8));
            _mm512_store_si512((void *)(o + (4 + i) * 64),
                               _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi32(v, 4), m4), e8));
        }
    }
}

/* Q8_0: the panel chunk's codes back to the signed quants (w + 128 ^ 0x80 = w). */
static void
ax_pack_q8(void *ctx, int64_t panel, int64_t b0, int64_t nbk)
{
    const ax_ctx_t *c = ctx;
    const uint8_t *gw = c->wb + (size_t)(c->r0 / SP_P16_ROWS + panel) * c->gs;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t j = 0; j < nbk; j++) {
        const uint8_t *q = gw + sp__p16_qs_off_of(SP_TYPE_Q8_0, b0 + j);
        uint8_t *o = c->scratch + (size_t)j * AX_BQ;
        for (int i = 0; i < 8; i++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + i * 64));
            _mm512_store_si512((void *)(o + i * 64), _mm512_xor_si512(v, flip));
        }
    }
}

static void
ax_tile_cb(void *ctx, const sp512_tile_t *t)
{
    const ax_ctx_t *c = ctx;
    const sp_type_t type = c->wt == WT_Q8_0 ? SP_TYPE_Q8_0 : SP_TYPE_Q4_0;
    const int64_t g0 = c->r0 / SP_P16_ROWS, g1 = (c->r1 + SP_P16_ROWS - 1) / SP_P16_ROWS;
    const int64_t g = g0 + t->panel;
    const int64_t lo = c->r0 > g * SP_P16_ROWS ? c->r0 - g * SP_P16_ROWS : 0;
    const int64_t hi = c->r1 < (g + 1) * SP_P16_ROWS ? c->r1 - g * SP_P16_ROWS : SP_P16_ROWS;
    const uint8_t *gw = c->wb + (size_t)g * c->gs;
    const size_t pair = sp__p16_pair_bytes_of(type);
    const ax_out_t o = {c->y + t->t0 * c->ldy + g * SP_P16_ROWS, c->ldy,
                        (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1)), (int)t->tn,
                        t->b0 > 0};
    /* the first tile of a chunk fetches the same stretch of the panel computed next (the
     * next group, else the first group at the next K chunk), so the tiles after it, and
     * the next panel's, find their weights in L1 / L2 */
    const uint8_t *pf = t->u != 0                 ? NULL
                        : g + 1 < g1              ? gw + c->gs + sp__p16_qs_off_of(type, t->b0)
                        : t->b0 + t->nbk < c->nb ? c->wb + (size_t)g0 * c->gs +
                                                        sp__p16_qs_off_of(type, t->b0 + t->nbk)
                                                  : NULL;
    const uint8_t *ds = gw + sp__p16_d_off_of(type, t->b0);
    ax_tile(t->nbk, c->scratch, 2 * AX_BQ, ds, pair, t->xr, &o, pf, pair / 2);
}

/* The tiles for any token count: the AMX level's entry above AMX_MIN_TOK, the tests' and
 * benches' for every count. */
static void
ax_gemm(int wt, int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x,
        size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(64) uint8_t xr[AX_XBUF];
    _Alignas(64) uint8_t scratch[AX_KC * AX_BQ];
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
    const int64_t g0 = r0 / SP_P16_ROWS, g1 = (r1 + SP_P16_ROWS - 1) / SP_P16_ROWS;
    ax_ctx_t c = {.wt = wt, .xb = x, .xs = xs, .n_tok = n_tok, .wb = w, .gs = gs, .r0 = r0,
                  .r1 = r1, .nb = nb, .y = y, .ldy = ldy, .scratch = scratch};
    /* K chunks start on even blocks (AX_KC is even), so block pairs never straddle them */
    const sp512_panels_t d = {
        .nb = nb, .n_panels = g1 - g0, .tc = AX_TC, .rkc = AX_KC, .pkc = AX_KC, .tw = AX_TT,
        .rec = AX_REC, .xr = xr, .ctx = &c, .prep = ax_prep,
        .pack = wt == WT_Q4_0 ? ax_pack_q4 : ax_pack_q8, .tile = ax_tile_cb, .finish = NULL,
    };
    ax_config();
    sp512_panels_run(&d, n_tok);
    _tile_release();
}

static void
tiles_q8_0(int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x,
           size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    ax_gemm(WT_Q8_0, n, w, gs, r0, r1, x, xs, n_tok, y, ldy);
}

static void
tiles_q4_0(int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x,
           size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    ax_gemm(WT_Q4_0, n, w, gs, r0, r1, x, xs, n_tok, y, ldy);
}

sp_gemm_fn
sp__amx_qgemm_tiles(sp_type_t type)
{
    return type == SP_TYPE_Q8_0 ? tiles_q8_0 : type == SP_TYPE_Q4_0 ? tiles_q4_0 : NULL;
}

/*
 * The table's entries. Fewer than AMX_MIN_TOK tokens: the VNNI kernel. More: whole tiles of 16
 * on AMX, and a last partial tile too when it has AMX_MIN_REM tokens or more; a smaller rest
 * goes to the VNNI kernel (a tile costs the same whatever its real tokens). Both give the
 * reference's bits, so which tokens take which path is invisible.
 */
static void
amx_entry(int wt, int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x,
          size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    const sp_gemm_fn vnni = sp__avx512_qgemm_packed(wt == WT_Q8_0 ? SP_TYPE_Q8_0 : SP_TYPE_Q4_0);
    const int64_t rest = n_tok % AX_TT;
    const int64_t on_tiles = n_tok < AMX_MIN_TOK ? 0 : rest >= AMX_MIN_REM ? n_tok : n_tok - rest;
    if (on_tiles > 0) {
        ax_gemm(wt, n, w, gs, r0, r1, x, xs, on_tiles, y, ldy);
    }
    if (on_tiles < n_tok) {
        vnni(n, w, gs, r0, r1, (const uint8_t *)x + (size_t)on_tiles * xs, xs, n_tok - on_tiles,
             y + on_tiles * ldy, ldy);
    }
}

static void
gemm_q8_0(int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x, size_t xs,
          int64_t n_tok, float *y, int64_t ldy)
{
    amx_entry(WT_Q8_0, n, w, gs, r0, r1, x, xs, n_tok, y, ldy);
}

static void
gemm_q4_0(int64_t n, const void *w, size_t gs, int64_t r0, int64_t r1, const void *x, size_t xs,
          int64_t n_tok, float *y, int64_t ldy)
{
    amx_entry(WT_Q4_0, n, w, gs, r0, r1, x, xs, n_tok, y, ldy);
}

void
sp__amx_qgemm_register(sp_cpu_kernels_t *k)
{
    /* the layout stays the VNNI panels' (the avx512 table already set it) */
    k->repack_gemm[SP_TYPE_Q8_0] = gemm_q8_0;
    k->repack_gemm[SP_TYPE_Q4_0] = gemm_q4_0;
}
