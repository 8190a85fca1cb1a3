/*
 * blocks.c - free list, reference counts, prefix cache with LRU reclaim.
 *
 * Per block: refcount, serial (0 = not published), hash, parent serial and a
 * copy of its tokens (for collision-safe lookups: 64 bytes per block, nothing
 * next to the KV data itself). The hash table chains through per-block
 * links, the LRU is a doubly linked list through per-block links, the free
 * list is a stack: every operation is O(1) but a lookup, which walks one
 * bucket's chain.
 */
#include "sched/blocks.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"

struct sp_blocks {
    int64_t n;
    int32_t *ref;
    uint64_t *serial;
    uint64_t *hash;
    uint64_t *parent;
    int32_t *toks;       /* n * SP_KV_BLOCK */
    int32_t *bucket;     /* nb heads, -1 = empty */
    int32_t *hnext;
    uint64_t nb_mask;
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail; /* oldest, newest */
    int64_t n_cached;
    int32_t *free_stack;
    int64_t n_free;
    uint64_t next_serial;
    int64_t lookups, hits, evictions;
};

sp_status_t
sp_blocks_create(int64_t n_blocks, sp_blocks_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (n_blocks < 1 || n_blocks > (int64_t)1 << 30) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "kv blocks: %lld is outside 1..2^30",
                       (long long)n_blocks);
    }
    sp_blocks_t *b = sp_calloc(1, sizeof *b);
    if (b == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "kv blocks: out of memory");
    }
    uint64_t nb = 16;
    while (nb < (uint64_t)n_blocks) {
        nb <<= 1;
    }
    size_t n = (size_t)n_blocks;
    b->n = n_blocks;
    b->nb_mask = nb - 1;
    b->ref = sp_calloc(n, sizeof *b->ref);
    b->serial = sp_calloc(n, sizeof *b->serial);
    b->hash = sp_calloc(n, sizeof *b->hash);
    b->parent = sp_calloc(n, sizeof *b->parent);
    b->toks = sp_calloc(n * SP_KV_BLOCK, sizeof *b->toks);
    b->bucket = sp_malloc((size_t)nb * sizeof *b->bucket);
    b->hnext = sp_malloc(n * sizeof *b->hnext);
    b->lru_prev = sp_malloc(n * sizeof *b->lru_prev);
    b->lru_next = sp_malloc(n * sizeof *b->lru_next);
    b->free_stack = sp_malloc(n * sizeof *b->free_stack);
    if (!b->ref || !b->serial || !b->hash || !b->parent || !b->toks || !b->bucket || !b->hnext ||
        !b->lru_prev || !b->lru_next || !b->free_stack) {
        sp_blocks_destroy(b);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "kv blocks: out of memory");
    }
    for (uint64_t i = 0; i < nb; i++) {
        b->bucket[i] = -1;
    }
    /* Lowest ids on top of the stack: allocation order is predictable in tests. */
    for (int64_t i = 0; i < n_blocks; i++) {
        b->free_stack[i] = (int32_t)(n_blocks - 1 - i);
        b->hnext[i] = -1;
        b->lru_prev[i] = b->lru_next[i] = -1;
    }
    b->n_free = n_blocks;
    b->lru_head = b->lru_tail = -1;
    b->next_serial = 1;
    *out = b;
    return SP_OK;
}

void
sp_blocks_destroy(sp_blocks_t *b)
{
    if (b == NULL) {
        return;
    }
    sp_free(b->ref);
    sp_free(b->serial);
    sp_free(b->hash);
    sp_free(b->parent);
    sp_free(b->toks);
    sp_free(b->bucket);
    sp_free(b->hnext);
    sp_free(b->lru_prev);
    sp_free(b->lru_next);
    sp_free(b->free_stack);
    sp_free(b);
}

/* ------------------------------------------------------------------- LRU */

static void
lru_remove(sp_blocks_t *b, int32_t id)
{
    int32_t p = b->lru_prev[id], n = b->lru_next[id];
    if (p >= 0) {
        b->lru_next[p] = n;
    } else {
        b->lru_head = n;
    }
    if (n >= 0) {
        b->lru_prev[n] = p;
    } else {
        b->lru_tail = p;
    }
    b->lru_prev[id] = b->lru_next[id] = -1;
    b->n_cached--;
}

static void
lru_push_newest(sp_blocks_t *b, int32_t id)
{
    b->lru_prev[id] = b->lru_tail;
    b->lru_next[id] = -1;
    if (b->lru_tail >= 0) {
        b->lru_next[b->lru_tail] = id;
    } else {
        b->lru_head = id;
    }
    b->lru_tail = id;
    b->n_cached++;
}

/* ------------------------------------------------------------ hash table */

static void
table_remove(sp_blocks_t *b, int32_t id)
{
    int32_t *pp = &b->bucket[b->hash[id] & b->nb_mask];
    while (*pp >= 0 && *pp != id) {
        pp = &b->hnext[*pp];
    }
    if (*pp == id) {
        *pp = b->hnext[id];
    }
    b->hnext[id] = -1;
    b->serial[id] = 0;
}

static int32_t
table_find(const sp_blocks_t *b, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    for (int32_t id = b->bucket[hash & b->nb_mask]; id >= 0; id = b->hnext[id]) {
        if (b->hash[id] == hash && b->parent[id] == parent &&
            memcmp(b->toks + (size_t)id * SP_KV_BLOCK, tokens, SP_KV_BLOCK * sizeof *tokens) == 0) {
            return id;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ API */

int32_t
sp_blocks_alloc(sp_blocks_t *b)
{
    int32_t id;
    if (b->n_free > 0) {
        id = b->free_stack[--b->n_free];
        /* A free block is neither held nor in the prefix cache. */
        SP_ASSERT(b->ref[id] == 0 && b->serial[id] == 0);
    } else if (b->lru_head >= 0) {
        id = b->lru_head;
        SP_ASSERT(b->ref[id] == 0); /* the LRU holds released blocks only */
        lru_remove(b, id);
        table_remove(b, id);
        b->evictions++;
    } else {
        return -1;
    }
    b->ref[id] = 1;
    return id;
}

int64_t
sp_blocks_available(const sp_blocks_t *b)
{
    return b->n_free + b->n_cached;
}

void
sp_blocks_ref(sp_blocks_t *b, int32_t id)
{
    SP_ASSERT(id >= 0 && id < b->n);
    if (b->ref[id] == 0 && b->serial[id] != 0) {
        lru_remove(b, id);
    }
    b->ref[id]++;
}

void
sp_blocks_unref(sp_blocks_t *b, int32_t id)
{
    SP_ASSERT(id >= 0 && id < b->n);
    if (b->ref[id] <= 0) {
        return; /* a bug in the caller; never corrupt the lists over it */
    }
    if (--b->ref[id] > 0) {
        return;
    }
    if (b->serial[id] != 0) {
        lru_push_newest(b, id);
    } else {
        SP_ASSERT(b->n_free < b->n);
        b->free_stack[b->n_free++] = id;
    }
}

int32_t
sp_blocks_refcount(const sp_blocks_t *b, int32_t id)
{
    return b->ref[id];
}

uint64_t
sp_blocks_hash(uint64_t prev_hash, const int32_t *tokens)
{
    /* splitmix64-style mixing of each token into the running value: cheap and
     * well spread; collisions are checked anyway. */
    uint64_t h = prev_hash ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < SP_KV_BLOCK; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h ^= h >> 30;
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 27;
        h *= 0x94d049bb133111ebull;
        h ^= h >> 31;
    }
    return h;
}

int32_t
sp_blocks_lookup(sp_blocks_t *b, uint64_t hash, uint64_t parent_serial, const int32_t *tokens,
                 uint64_t *serial)
{
    b->lookups++;
    int32_t id = table_find(b, hash, parent_serial, tokens);
    if (id < 0) {
        return -1;
    }
    b->hits++;
    sp_blocks_ref(b, id);
    *serial = b->serial[id];
    return id;
}

int32_t
sp_blocks_probe(const sp_blocks_t *b, uint64_t hash, uint64_t parent_serial, const int32_t *tokens,
                uint64_t *serial)
{
    int32_t id = table_find(b, hash, parent_serial, tokens);
    if (id >= 0) {
        *serial = b->serial[id];
    }
    return id;
}

uint64_t
sp_blocks_publish(sp_blocks_t *b, int32_t id, uint64_t hash, uint64_t parent_serial,
                  const int32_t *tokens)
{
    SP_ASSERT(id >= 0 && id < b->n);
    if (b->serial[id] != 0) {
        return b->serial[id];
    }
    int32_t other = table_find(b, hash, parent_serial, tokens);
    if (other >= 0) {
        return b->serial[other];
    }
    b->serial[id] = b->next_serial++;
    b->hash[id] = hash;
    b->parent[id] = parent_serial;
    memcpy(b->toks + (size_t)id * SP_KV_BLOCK, tokens, SP_KV_BLOCK * sizeof *tokens);
    int32_t *head = &b->bucket[hash & b->nb_mask];
    b->hnext[id] = *head;
    *head = id;
    if (b->ref[id] == 0) {
        lru_push_newest(b, id); /* not the usual case: publishing a released block */
    }
    return b->serial[id];
}

void
sp_blocks_get_stats(const sp_blocks_t *b, sp_blocks_stats_t *o)
{
    o->n_blocks = b->n;
    o->n_free = b->n_free;
    o->n_cached = b->n_cached;
    o->n_held = b->n - b->n_free - b->n_cached;
    o->lookups = b->lookups;
    o->hits = b->hits;
    o->evictions = b->evictions;
}

bool
sp_blocks_check(const sp_blocks_t *b, char *err, size_t err_len)
{
    int64_t held = 0, published = 0, lru = 0, in_table = 0;
    for (int64_t i = 0; i < b->n; i++) {
        if (b->ref[i] < 0) {
            snprintf(err, err_len, "block %lld: refcount %d", (long long)i, b->ref[i]);
            return false;
        }
        held += b->ref[i] > 0;
        published += b->serial[i] != 0;
    }
    for (int32_t id = b->lru_head, prev = -1; id >= 0; prev = id, id = b->lru_next[id]) {
        if (b->ref[id] != 0 || b->serial[id] == 0 || b->lru_prev[id] != prev || lru > b->n) {
            snprintf(err, err_len, "LRU: block %d (ref %d, serial %llu) is wrong there", id,
                     b->ref[id], (unsigned long long)b->serial[id]);
            return false;
        }
        lru++;
    }
    for (uint64_t k = 0; k <= b->nb_mask; k++) {
        for (int32_t id = b->bucket[k]; id >= 0; id = b->hnext[id]) {
            if (b->serial[id] == 0 || (b->hash[id] & b->nb_mask) != k || in_table > b->n) {
                snprintf(err, err_len, "hash table: block %d in the wrong bucket", id);
                return false;
            }
            in_table++;
        }
    }
    for (int64_t i = 0; i < b->n_free; i++) {
        int32_t id = b->free_stack[i];
        if (b->ref[id] != 0 || b->serial[id] != 0) {
            snprintf(err, err_len, "free list: block %d is held or published", id);
            return false;
        }
    }
    if (lru != b->n_cached || in_table != published || held + b->n_free + lru != b->n) {
        snprintf(err, err_len,
                 "counts: held %lld + free %lld + cached %lld (listed %lld) != %lld blocks, "
                 "published %lld, in table %lld",
                 (long long)held, (long long)b->n_free, (long long)b->n_cached, (long long)lru,
                 (long long)b->n, (long long)published, (long long)in_table);
        return false;
    }
    return true;
}
