/*
 * swa.h - a sequence's table of sliding-part blocks in a two-part KV pool
 * (engine/batch.h, sp_kv_pool_create_split): the sliding-window layers keep
 * only the blocks the window still reads, the others go back to the block
 * manager (which keeps a published one in the prefix cache while another
 * sequence may want it).
 *
 * A table is indexed like the global block table (entry i holds positions
 * 16i..16i+15 of the sliding layers); entries before `lo` are -1 (released),
 * entries lo..n-1 are held (one reference each). The token at position p
 * reads entries sp_swa_first(window, p) onwards.
 *
 * Single-threaded (the engine thread); no allocation (the caller owns the
 * ids array).
 */
#ifndef SP_SCHED_SWA_H
#define SP_SCHED_SWA_H

#include <stdbool.h>
#include <stdint.h>

#include "sched/blocks.h"

typedef struct sp_swa_table {
    int32_t *ids; /* cap entries */
    int64_t cap;
    int64_t n;    /* entries 0..n-1 assigned */
    int64_t lo;   /* entries 0..lo-1 released (-1) */
} sp_swa_table_t;

/* The first entry a token at position pos reads under a window of this many
 * positions: the block of pos + 1 - window (0 when that is negative). */
int64_t sp_swa_first(int64_t window, int64_t pos);
/* Release entries before keep (those no later token reads). */
void sp_swa_trim(sp_blocks_t *b, sp_swa_table_t *t, int64_t keep);
/* Entries up to need - 1 assigned (new blocks from b); false when b ran out
 * (the entries taken so far stay). */
bool sp_swa_cover(sp_blocks_t *b, sp_swa_table_t *t, int64_t need);
/* Release every held entry, last first (a chain's tail becomes older in the
 * LRU than its head); the table is empty after. */
void sp_swa_release(sp_blocks_t *b, sp_swa_table_t *t);
/* Entries held now (n - lo, less any -1 inside). */
int64_t sp_swa_held(const sp_swa_table_t *t);
/*
 * Of a cached prefix of k full blocks, the longest usable one: k' <= k blocks
 * such that have[i] (the sliding block i is cached too) for every i in
 * sp_swa_first(window, 16 k') .. k' - 1, the blocks the next token reads.
 * 0 always qualifies (nothing cached, everything recomputed).
 */
int64_t sp_swa_usable_prefix(int64_t window, int64_t k, const uint8_t *have);

#endif /* SP_SCHED_SWA_H */
