/*
 * blocks.h - the scheduler's block manager over a paged KV pool: which block
 * is free, who holds it (reference counts) and the prefix cache.
 *
 * Blocks are ids 0..n-1 of a sp_kv_pool (the pool only stores; this module
 * decides). A block is in exactly one of three states:
 *   - free:   on the free list, content meaningless;
 *   - held:   refcount > 0 (one or more sequences' block tables);
 *   - cached: refcount 0 but published in the prefix cache, kept in an LRU
 *             and reclaimed (oldest first) only when the free list is empty.
 *
 * Prefix cache: a *full* block (SP_KV_BLOCK positions computed) can be
 * published under the hash of its tokens chained with the hash of the block
 * before it, so equal hashes mean equal prefixes. Collisions are harmless: an
 * entry keeps its tokens and the serial number of its parent block, and a
 * lookup matches only when both are equal; serials are never reused, so a
 * match proves the whole prefix by induction. Only full blocks are ever
 * shared: they are never written again, so sharers need no copy.
 *
 * Single-threaded (the engine thread). Everything is allocated at create.
 */
#ifndef SP_SCHED_BLOCKS_H
#define SP_SCHED_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/batch.h"
#include "sampan/status.h"

typedef struct sp_blocks sp_blocks_t;

typedef struct sp_blocks_stats {
    int64_t n_blocks;   /* total */
    int64_t n_free;     /* on the free list */
    int64_t n_cached;   /* refcount 0, kept for the prefix cache (reclaimable) */
    int64_t n_held;     /* refcount > 0 */
    int64_t lookups;    /* blocks looked up in the prefix cache */
    int64_t hits;       /* of which found */
    int64_t evictions;  /* cached blocks reclaimed for new content */
} sp_blocks_stats_t;

/* The chain start: the parent serial/hash of a sequence's first block. */
#define SP_BLOCKS_ROOT 0

sp_status_t sp_blocks_create(int64_t n_blocks, sp_blocks_t **out, char *err, size_t err_len);
void sp_blocks_destroy(sp_blocks_t *b);

/* A block for new content, refcount 1: from the free list, else the least
 * recently used cached block (its cache entry is dropped). -1 when every block
 * is held. */
int32_t sp_blocks_alloc(sp_blocks_t *b);
/* Blocks that sp_blocks_alloc can still return (free + cached). */
int64_t sp_blocks_available(const sp_blocks_t *b);
void sp_blocks_ref(sp_blocks_t *b, int32_t id);
/* Drop one reference; at zero a published block goes to the LRU's newest end,
 * any other to the free list. */
void sp_blocks_unref(sp_blocks_t *b, int32_t id);
int32_t sp_blocks_refcount(const sp_blocks_t *b, int32_t id);

/* Hash of SP_KV_BLOCK tokens chained with the previous block's hash. */
uint64_t sp_blocks_hash(uint64_t prev_hash, const int32_t *tokens);

/*
 * Look up the block following parent_serial (SP_BLOCKS_ROOT for the first)
 * whose SP_KV_BLOCK tokens are these and whose chained hash is hash. On a hit
 * returns its id with a reference taken (a cached block leaves the LRU) and
 * sets *serial (the parent serial for the next lookup); -1 on a miss. Counts
 * toward the hit rate.
 */
int32_t sp_blocks_lookup(sp_blocks_t *b, uint64_t hash, uint64_t parent_serial,
                         const int32_t *tokens, uint64_t *serial);
/* The same match without taking a reference or counting: for admission
 * checks. -1 on a miss. */
int32_t sp_blocks_probe(const sp_blocks_t *b, uint64_t hash, uint64_t parent_serial,
                        const int32_t *tokens, uint64_t *serial);
/*
 * Publish held block id (its SP_KV_BLOCK positions computed) as the block
 * after parent_serial with these tokens. Returns the serial that the next
 * block of the chain uses as its parent: the block's new serial, or that of an
 * equal block already published (then id stays private and goes to the free
 * list when released). Publishing a block twice returns its serial.
 */
uint64_t sp_blocks_publish(sp_blocks_t *b, int32_t id, uint64_t hash, uint64_t parent_serial,
                           const int32_t *tokens);

void sp_blocks_get_stats(const sp_blocks_t *b, sp_blocks_stats_t *out);
/* Consistency check for tests: every block in exactly one state, the lists
 * and the hash table agree. Returns false and describes the first problem. */
bool sp_blocks_check(const sp_blocks_t *b, char *err, size_t err_len);

#endif /* SP_SCHED_BLOCKS_H */
