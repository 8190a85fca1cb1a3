/*
 * attn_pf.h - how the x86 attention kernels (avx2_attn.c, avx512_attn.c) address the paged KV
 * cache and fetch it ahead of a decode's passes. Static inline functions, no state.
 *
 * A cache block holds 16 positions of every layer and KV head (engine/kv.c), so one call's key
 * and value tiles (16 rows each, a few KiB) lie a whole block apart: every tile starts a new
 * stream, which the hardware prefetcher picks up too late, and a decode's cache comes from
 * memory (the weights that stream between two layers evict it). So pass 1 asks for the key
 * tile PF_BLOCKS blocks ahead into L1 while it scores a block and, when all the values fit in
 * V_L2_BYTES, for that block's value rows into L2 as well (else pass 3 asks for them, ahead of
 * its own reads). The requests are spread over the block's steps d (attn_pf_step: as many bytes
 * per step as the tile holds per d) rather than issued as one burst: a burst of a tile's 64 or
 * 128 lines fills the core's miss buffers and holds up the loads of the block being scored,
 * so the read and the arithmetic add up instead of overlapping (docs/design.md, "Attention's
 * prefetch spread at AVX-512": 1.3x on a Zen 5 core; AVX2 on Zen 3 0.75-0.8x with bursts).
 */
#ifndef SP_KERNELS_CPU_ATTN_PF_H
#define SP_KERNELS_CPU_ATTN_PF_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifndef PF_BLOCKS
#define PF_BLOCKS 4
#endif
/* Above this many bytes of values pass 3 fetches them ahead of its reads, overlapped with its
 * arithmetic; at or below it pass 1 takes them along with the keys (a short context, whose value
 * pass is too short to hide a fetch). It was 256 KiB, but in decode steps at 512 positions (an F32
 * cache's 128 KiB of values a head) pass 1 then read keys and values at one core's rate while
 * passes 2 and 3 left the memory idle; at 64 KiB the attention stage took 20-25% less time at the
 * AVX2 level and 4-22% less at AVX-512 on an AMD Zen 5 (`sampan eval --profile`, the F16 cache
 * within the noise; docs/design.md, "The AVX-VNNI Q8_0 gemm without a sign step; decode values
 * fetched in pass 3"). */
#ifndef V_L2_BYTES
#define V_L2_BYTES (64 * 1024)
#endif

/* kind: 0 F32, 1 F16, 2 Q8_0 (whose offsets count bytes, kernels.h): bytes per offset unit. */
static inline int64_t
attn_kv_elt(int kind)
{
    return kind == 0 ? 4 : kind == 1 ? 2 : 1;
}

static inline const char *
attn_kv_ptr(const void *base, int kind, int64_t i)
{
    return (const char *)base + i * attn_kv_elt(kind);
}

/* Bytes of one cache row, and from one row to the next. */
static inline int64_t
attn_row_bytes(const sp_attn_args_t *a, int kind)
{
    return kind == 2 ? sp_kv_q8_row_bytes(a->head_dim) : a->head_dim * attn_kv_elt(kind);
}

static inline int64_t
attn_row_step(const sp_attn_args_t *a, int kind)
{
    return a->v_stride * attn_kv_elt(kind);
}

/* Prefetch n bytes from p, one instruction per 64-byte line, into L1 (l2 = 0) or L2. */
static inline __attribute__((always_inline)) void
attn_prefetch_bytes(const char *p, int64_t n, int l2)
{
    const uintptr_t first = (uintptr_t)p & ~(uintptr_t)63;
    for (uintptr_t x = first; x < (uintptr_t)p + (uintptr_t)n; x += 64) {
        if (l2) {
            _mm_prefetch((const char *)x, _MM_HINT_T1);
        } else {
            _mm_prefetch((const char *)x, _MM_HINT_T0);
        }
    }
}

/*
 * What pass 1 prefetches while it scores one block: the key tile and, when they go to L2 in
 * pass 1, the value rows of a later block, `step` bytes per step d (the tile's bytes over
 * head_dim), the few bytes past hd * step (a Q8_0 tile whose size is not a multiple of hd)
 * after the loop. v is NULL when the values are not asked for here or not back to back.
 */
typedef struct attn_pf {
    const char *k, *v;
    int64_t step, bytes;
} attn_pf_t;

static inline __attribute__((always_inline)) void
attn_pf_step(const attn_pf_t *pf, int64_t d)
{
    if (pf != NULL) {
        _mm_prefetch(pf->k + d * pf->step, _MM_HINT_T0);
        if (pf->v != NULL) {
            _mm_prefetch(pf->v + d * pf->step, _MM_HINT_T1);
        }
    }
}

static inline __attribute__((always_inline)) void
attn_pf_rest(const attn_pf_t *pf, int64_t hd)
{
    if (pf != NULL && hd * pf->step < pf->bytes) {
        attn_prefetch_bytes(pf->k + hd * pf->step, pf->bytes - hd * pf->step, 0);
        if (pf->v != NULL) {
            attn_prefetch_bytes(pf->v + hd * pf->step, pf->bytes - hd * pf->step, 1);
        }
    }
}

/* Whether pass 1 takes the values into L2 (all of them fit V_L2_BYTES). */
static inline int
attn_v_in_l2(const sp_attn_args_t *a, int kind, int64_t p_start)
{
    return (a->n_kv - p_start) * attn_row_bytes(a, kind) <= V_L2_BYTES;
}

/* Pass 1's start: the first PF_BLOCKS blocks' keys (and values, v_l2) in one go. */
static inline __attribute__((always_inline)) void
attn_pf_first(const sp_attn_args_t *a, int kind, int64_t p_start, int v_l2)
{
    const int64_t tile = 16 * attn_row_bytes(a, kind);
    for (int64_t b = 0; b < PF_BLOCKS && p_start + 16 * b < a->n_kv; b++) {
        const int64_t id = a->blocks[(p_start + 16 * b) / 16];
        attn_prefetch_bytes(attn_kv_ptr(a->k, kind, id * a->k_block_stride), tile, 0);
        if (v_l2) {
            attn_prefetch_bytes(attn_kv_ptr(a->v, kind, id * a->v_block_stride), tile, 1);
        }
    }
}

/*
 * The plan for scoring the block at p0: the block PF_BLOCKS on (none past the end). Value
 * rows that are not back to back (a strided V view) are asked for here in one go; back to
 * back they join the spread plan.
 */
static inline __attribute__((always_inline)) attn_pf_t
attn_pf_plan(const sp_attn_args_t *a, int kind, int64_t p0, int v_l2)
{
    const int64_t rb = attn_row_bytes(a, kind), tile = 16 * rb, pn = p0 + 16 * PF_BLOCKS;
    attn_pf_t pf = {NULL, NULL, tile / a->head_dim, tile};
    if (pn < a->n_kv) {
        const int64_t id = a->blocks[pn / 16];
        pf.k = attn_kv_ptr(a->k, kind, id * a->k_block_stride);
        if (v_l2 && attn_row_step(a, kind) == rb) {
            pf.v = attn_kv_ptr(a->v, kind, id * a->v_block_stride);
        } else if (v_l2) {
            for (int64_t p = 0; p < 16; p++) {
                attn_prefetch_bytes(attn_kv_ptr(a->v, kind, id * a->v_block_stride) +
                                        p * attn_row_step(a, kind),
                                    rb, 1);
            }
        }
    }
    return pf;
}

#endif
