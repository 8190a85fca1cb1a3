/*
 * heap.h - a growable 4-ary min-heap of 64-bit keys.
 *
 * The tokenizers' merge queues: callers pack (priority, position) into one
 * key, so "smallest key first" is "best merge first, leftmost on ties" and
 * no comparator is needed. Four children per node keep the sift-down's
 * comparisons in one cache line.
 */
#ifndef SP_CORE_HEAP_H
#define SP_CORE_HEAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct sp_heap_u64 {
    uint64_t *keys;
    size_t n, cap;
} sp_heap_u64_t;

/* 0, or -1 when growing fails (the heap is unchanged). */
int sp_heap_u64_push(sp_heap_u64_t *h, uint64_t key);
/* The smallest key; the heap must not be empty. */
uint64_t sp_heap_u64_pop(sp_heap_u64_t *h);
void sp_heap_u64_free(sp_heap_u64_t *h); /* releases the storage; the heap is empty again */

#endif /* SP_CORE_HEAP_H */
