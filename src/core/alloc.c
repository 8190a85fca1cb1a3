/*
 * alloc.c - counted allocation with fault injection.
 *
 * Each block carries a 64-byte header holding its size (and, for aligned
 * blocks, the offset back to the malloc'd base), so the counter stays exact and
 * sp_free needs no size. Plain blocks keep malloc's alignment (16 bytes);
 * sp_malloc_aligned serves anything stricter.
 */
#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HDR 64

static atomic_size_t in_use;
static atomic_int_fast64_t fail_after = -1;

static int
should_fail(void)
{
    int_fast64_t n = atomic_load_explicit(&fail_after, memory_order_relaxed);
    if (n < 0) {
        return 0;
    }
    if (n == 0) {
        return 1;
    }
    atomic_fetch_sub(&fail_after, 1);
    return 0;
}

void
sp_alloc_fail_after(int64_t n)
{
    atomic_store(&fail_after, n < 0 ? -1 : n);
}

size_t
sp_alloc_bytes_in_use(void)
{
    return atomic_load(&in_use);
}

/* Header layout: [0] = user size, [1] = distance from malloc base to header. */
static void *
finish(unsigned char *base, size_t off, size_t n)
{
    size_t *h = (size_t *)(base + off);
    h[0] = n;
    h[1] = off;
    atomic_fetch_add(&in_use, n);
    return base + off + HDR;
}

void *
sp_malloc_aligned(size_t n, size_t align)
{
    size_t total;
    if (align < HDR) {
        align = HDR;
    }
    if (should_fail() || sp_add_size(n, HDR + align, &total) != 0) {
        return NULL;
    }
    unsigned char *base = malloc(total);
    if (base == NULL) {
        return NULL;
    }
    uintptr_t user = ((uintptr_t)base + HDR + align - 1) & ~(uintptr_t)(align - 1);
    return finish(base, (size_t)(user - HDR - (uintptr_t)base), n);
}

size_t
sp_huge_size(size_t n)
{
    size_t whole;
    if (n < SP_HUGE_PAGE) {
        return n;
    }
    if (sp_add_size(n, SP_HUGE_PAGE - 1, &whole) != 0) {
        return 0;
    }
    return whole & ~(SP_HUGE_PAGE - 1);
}

void *
sp_malloc_huge(size_t n)
{
    if (n < SP_HUGE_PAGE) {
        return sp_malloc_aligned(n, 64);
    }
    const size_t whole = sp_huge_size(n);
    if (whole == 0) {
        return NULL;
    }
    void *p = sp_malloc_aligned(whole, SP_HUGE_PAGE);
#ifdef MADV_HUGEPAGE
    if (p != NULL) {
        /* before the first write: the faults then take huge pages where the kernel has them */
        (void)madvise(p, whole, MADV_HUGEPAGE);
    }
#endif
    return p;
}

void *
sp_malloc(size_t n)
{
    size_t total;
    if (should_fail() || sp_add_size(n, HDR, &total) != 0) {
        return NULL;
    }
    unsigned char *base = malloc(total);
    return base == NULL ? NULL : finish(base, 0, n);
}

void *
sp_calloc(size_t count, size_t size)
{
    size_t n;
    if (sp_mul_size(count, size, &n) != 0) {
        return NULL;
    }
    void *p = sp_malloc(n);
    if (p != NULL) {
        memset(p, 0, n);
    }
    return p;
}

void
sp_free(void *p)
{
    if (p == NULL) {
        return;
    }
    size_t *h = (size_t *)((unsigned char *)p - HDR);
    atomic_fetch_sub(&in_use, h[0]);
    free((unsigned char *)h - h[1]);
}

void *
sp_realloc(void *p, size_t n)
{
    if (p == NULL) {
        return sp_malloc(n);
    }
    size_t *h = (size_t *)((unsigned char *)p - HDR);
    size_t old = h[0];
    void *q = sp_malloc(n);
    if (q == NULL) {
        return NULL;
    }
    memcpy(q, p, old < n ? old : n);
    sp_free(p);
    return q;
}

char *
sp_strndup(const char *s, size_t n)
{
    char *d = sp_malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}
