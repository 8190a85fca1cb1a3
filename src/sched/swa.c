/*
 * swa.c - per-sequence tables of sliding-part KV blocks: trim to the window,
 * extend for new positions, release, and the usable length of a cached
 * prefix (docs/design.md, "KV cache with sliding windows").
 *
 * Single-threaded (the engine thread); allocates nothing (the block manager
 * hands out ids, the caller owns the table's array).
 */
#include "sched/swa.h"

#include "core/assert.h"
#include "engine/batch.h"

int64_t
sp_swa_first(int64_t window, int64_t pos)
{
    const int64_t start = pos + 1 - window;
    return start > 0 ? start / SP_KV_BLOCK : 0;
}

void
sp_swa_trim(sp_blocks_t *b, sp_swa_table_t *t, int64_t keep)
{
    for (; t->lo < keep && t->lo < t->cap; t->lo++) {
        if (t->lo < t->n && t->ids[t->lo] >= 0) {
            sp_blocks_unref(b, t->ids[t->lo]);
        }
        t->ids[t->lo] = -1;
    }
    if (t->n < t->lo) {
        t->n = t->lo; /* nothing was assigned there: the next entries start at lo */
    }
}

bool
sp_swa_cover(sp_blocks_t *b, sp_swa_table_t *t, int64_t need)
{
    SP_ASSERT(need <= t->cap); /* the table was sized for the longest sequence */
    while (t->n < need) {
        int32_t id = sp_blocks_alloc(b);
        if (id < 0) {
            return false;
        }
        t->ids[t->n++] = id;
    }
    return true;
}

void
sp_swa_release(sp_blocks_t *b, sp_swa_table_t *t)
{
    for (int64_t i = t->n - 1; i >= t->lo; i--) {
        if (t->ids[i] >= 0) {
            sp_blocks_unref(b, t->ids[i]);
            t->ids[i] = -1;
        }
    }
    t->n = 0;
    t->lo = 0;
}

int64_t
sp_swa_held(const sp_swa_table_t *t)
{
    int64_t n = 0;
    for (int64_t i = t->lo; i < t->n; i++) {
        n += t->ids[i] >= 0;
    }
    return n;
}

int64_t
sp_swa_usable_prefix(int64_t window, int64_t k, const uint8_t *have)
{
    for (;;) {
        int64_t missing = -1;
        for (int64_t i = k - 1; i >= sp_swa_first(window, k * SP_KV_BLOCK) && i >= 0; i--) {
            if (!have[i]) {
                missing = i;
                break;
            }
        }
        if (missing < 0) {
            return k;
        }
        /* A prefix of `missing` blocks does not need block `missing`. */
        k = missing;
    }
}
