/*
 * alloc.h - the one allocation choke point (redis zmalloc, sqlite3_malloc).
 *
 * All heap memory of Sampan goes through these calls. They never abort: a NULL
 * return is an SP_ERR_NOMEM for the caller to report. The byte counter feeds
 * /metrics, and tests can make the Nth allocation fail (sp_alloc_fail_after)
 * to prove that every constructor cleans up after an OOM.
 */
#ifndef SP_CORE_ALLOC_H
#define SP_CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *sp_malloc(size_t n);
void *sp_calloc(size_t count, size_t size);   /* checks count*size for overflow */
void *sp_realloc(void *p, size_t n);
void  sp_free(void *p);                       /* sp_free(NULL) is a no-op */
/* Allocation aligned to `align` (a power of two >= sizeof(void *)); free with sp_free. */
void *sp_malloc_aligned(size_t n, size_t align);
/* Large data the kernels stream (the packed weights, the KV cache): blocks of SP_HUGE_PAGE bytes
 * or more are aligned to it, rounded up to whole huge pages and advised for transparent huge
 * pages (MADV_HUGEPAGE, a hint: the kernel may say no) before any page is touched, so that a
 * stream over them walks one TLB entry per 2 MiB instead of one per 4 KiB and a first write
 * faults once per 2 MiB; smaller ones are 64-byte aligned. Free with sp_free. */
#define SP_HUGE_PAGE ((size_t)2 << 20)
void *sp_malloc_huge(size_t n);
/* The bytes sp_malloc_huge(n) takes and counts (sp_alloc_bytes_in_use): n rounded up to whole
 * huge pages from SP_HUGE_PAGE on, n below it; 0 when that overflows. For estimates. */
size_t sp_huge_size(size_t n);
char *sp_strndup(const char *s, size_t n);

/* Bytes currently allocated through this module. */
size_t sp_alloc_bytes_in_use(void);
/* Tests: the next n allocations succeed, then every one fails until reset (n < 0). */
void sp_alloc_fail_after(int64_t n);

/* Checked size arithmetic: return 0 on success, -1 on overflow. */
static inline int sp_mul_size(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int sp_add_size(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

#endif /* SP_CORE_ALLOC_H */
