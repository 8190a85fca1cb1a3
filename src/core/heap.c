/*
 * heap.c - see heap.h.
 */
#include "core/heap.h"

#include "core/alloc.h"

int
sp_heap_u64_push(sp_heap_u64_t *h, uint64_t key)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 256, bytes;
        if (sp_mul_size(cap, sizeof(uint64_t), &bytes)) {
            return -1;
        }
        uint64_t *k = sp_realloc(h->keys, bytes);
        if (k == NULL) {
            return -1;
        }
        h->keys = k;
        h->cap = cap;
    }
    uint64_t *k = h->keys;
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (k[p] <= key) {
            break;
        }
        k[i] = k[p];
        i = p;
    }
    k[i] = key;
    return 0;
}

uint64_t
sp_heap_u64_pop(sp_heap_u64_t *h)
{
    uint64_t *k = h->keys;
    uint64_t top = k[0], last = k[--h->n];
    size_t n = h->n, i = 0;
    for (;;) {
        size_t c = 4 * i + 1, best = c;
        if (c >= n) {
            break;
        }
        size_t end = c + 4 < n ? c + 4 : n;
        for (size_t j = c + 1; j < end; j++) {
            if (k[j] < k[best]) {
                best = j;
            }
        }
        if (k[best] >= last) {
            break;
        }
        k[i] = k[best];
        i = best;
    }
    if (n > 0) {
        k[i] = last;
    }
    return top;
}

void
sp_heap_u64_free(sp_heap_u64_t *h)
{
    sp_free(h->keys);
    h->keys = NULL;
    h->n = h->cap = 0;
}
