/*
 * avx512_panels.h - the one loop nest of the AVX-512 VNNI 16-row panel gemms (avx512_qgemm.c,
 * avx512_q4panel.c) and the Q8_0 activation records they read.
 *
 * Every panel gemm of these files walks the same nest: token chunks; in each, K cut into record
 * chunks whose activation records are built once; for each panel (16 output rows), the record
 * chunk cut into panel chunks, each optionally packed into a scratch (decoded, transposed) and
 * then swept by the token tiles; after the panel's last chunk, optionally, a finishing step
 * (a lane tree that stores y). What differs between the types and layouts is only what a panel
 * chunk is (pack), what one tile computes (tile), how the records are built (prep) and how a
 * panel's sums end (finish): those are the callbacks. The driver decides no numerics: each
 * (row, token) sum is advanced only by the tile that owns it, block chunks in ascending order,
 * so the result is the callbacks' bits whatever the chunk sizes.
 *
 * Records: the driver gives tile u of a token chunk the records of its tokens at block b0 as
 * xr + (u * nrk + (b0 - kb)) * rec, nrk the record chunk's blocks, kb its first block, rec the
 * bytes of one (tile, block) record: prep must lay them out that way (sp512_q8_records does).
 *
 * Pure, any thread, no heap; the callbacks are called from the calling thread only.
 */
#ifndef SP_KERNELS_CPU_AVX512_PANELS_H
#define SP_KERNELS_CPU_AVX512_PANELS_H

#include <stddef.h>
#include <stdint.h>

/* What one tile call is to compute. */
typedef struct {
    int64_t panel;      /* the panel, 0 .. n_panels - 1 */
    int64_t t0;         /* the tile's first token (of the whole call) */
    int64_t tn;         /* its tokens, 1 .. tw */
    int64_t u, ntiles;  /* its index in the token chunk, and the chunk's tiles */
    int64_t b0, nbk;    /* the panel chunk's blocks [b0, b0 + nbk) (of the whole K) */
    int64_t kb, nrk;    /* the record chunk's blocks [kb, kb + nrk) */
    const uint8_t *xr;  /* the tile's records at block b0 */
} sp512_tile_t;

typedef struct {
    int64_t nb;       /* blocks of K (> 0) */
    int64_t n_panels; /* panels (> 0) */
    int64_t tc;       /* tokens per token chunk, a multiple of tw */
    int64_t rkc;      /* blocks per record chunk */
    int64_t pkc;      /* blocks per panel chunk (<= rkc; a record chunk's last may be short) */
    int tw;           /* tokens per tile */
    size_t rec;       /* bytes of one (tile, block) record */
    uint8_t *xr;      /* the records' buffer: tc / tw * rkc * rec bytes */
    void *ctx;        /* the callbacks' state */
    /* records of tokens [t0, t0 + nt), blocks [kb, kb + nrk), into xr */
    void (*prep)(void *ctx, int64_t t0, int64_t nt, int64_t kb, int64_t nrk, uint8_t *xr);
    /* NULL, or: make panel chunk (panel, b0, nbk) ready for the tiles */
    void (*pack)(void *ctx, int64_t panel, int64_t b0, int64_t nbk);
    void (*tile)(void *ctx, const sp512_tile_t *t);
    /* NULL, or: the panel's sums over the record chunk are complete for tokens [t0, t0 + nt) */
    void (*finish)(void *ctx, int64_t panel, int64_t t0, int64_t nt);
} sp512_panels_t;

/* Runs the nest over n_tok tokens (n_tok > 0). Inlined into each driver, whose descriptor is
 * a constant there: the compiler then calls (or inlines) its callbacks directly, no indirect
 * call per tile. */
static inline __attribute__((always_inline)) void
sp512_panels_run(const sp512_panels_t *d, int64_t n_tok)
{
    for (int64_t t0 = 0; t0 < n_tok; t0 += d->tc) {
        const int64_t nt = n_tok - t0 < d->tc ? n_tok - t0 : d->tc;
        const int64_t ntiles = (nt + d->tw - 1) / d->tw;
        for (int64_t kb = 0; kb < d->nb; kb += d->rkc) {
            const int64_t nrk = d->nb - kb < d->rkc ? d->nb - kb : d->rkc;
            d->prep(d->ctx, t0, nt, kb, nrk, d->xr);
            for (int64_t p = 0; p < d->n_panels; p++) {
                for (int64_t b0 = kb; b0 < kb + nrk; b0 += d->pkc) {
                    const int64_t nbk = kb + nrk - b0 < d->pkc ? kb + nrk - b0 : d->pkc;
                    if (d->pack != NULL) {
                        d->pack(d->ctx, p, b0, nbk);
                    }
                    for (int64_t u = 0; u < ntiles; u++) {
                        const int64_t tn = nt - u * d->tw < d->tw ? nt - u * d->tw : d->tw;
                        const sp512_tile_t t = {
                            .panel = p, .t0 = t0 + u * d->tw, .tn = tn, .u = u,
                            .ntiles = ntiles, .b0 = b0, .nbk = nbk, .kb = kb, .nrk = nrk,
                            .xr = d->xr + ((size_t)u * (size_t)nrk + (size_t)(b0 - kb)) * d->rec,
                        };
                        d->tile(d->ctx, &t);
                    }
                }
                if (d->finish != NULL) {
                    d->finish(d->ctx, p, t0, nt);
                }
            }
        }
    }
}


/*
 * Q8_0 activation records: tokens [0, nt) of x (rows xs bytes apart), blocks [b0, b0 + nbk), in
 * groups of tw tokens; group g's record of block position p at xr + (g * nbk + p) * tw * 40
 * holds the tw tokens' 32 quants, then their int32 seeds -off * sum(quants), then their scales
 * as floats (a tile of up to tw tokens reads one sequential stream). Positions: block order
 * when lane_kc is 0; else, within each chunk of lane_kc blocks from b0, the blocks visited lane
 * by lane (lane k = 0..7: blocks k, k + 8, ... of the chunk), the order of q32_impl.h's 8
 * partial sums.
 */
#define SP512_Q8REC 40 /* record bytes per token and block */
void sp512_q8_records(const uint8_t *x, size_t xs, int64_t nt, int64_t b0, int64_t nbk, int tw,
                      int32_t off, int64_t lane_kc, uint8_t *xr);

#endif
