/*
 * read_sum.h - the plain read that the bench tools measure the memory against
 * (bench/membw.c's read bandwidth, bench/decode_bench.c's read column): a sum
 * of the bytes as 64-bit integers (bytes read as floats would hit denormal
 * assists), in the target's widest native vector over 8 independent
 * accumulators, so the adds are never the limit. Header only.
 *
 * Why the native width: a 64-byte generic vector on an AVX2-only target is
 * lowered through the stack (GCC 12: a store and two reloads per add), which
 * made the read compute-bound at about 0.6x the machine's rate on an AMD Zen 3
 * (24 against 34-43 GB/s on 2 threads).
 */
#ifndef SP_BENCH_READ_SUM_H
#define SP_BENCH_READ_SUM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define SP_READ_VBYTES 64
#else
#define SP_READ_VBYTES 32
#endif
typedef uint64_t sp_read_vec __attribute__((vector_size(SP_READ_VBYTES), aligned(1)));

/* The sum of the whole 8-vector steps of p[0, bytes) (a tail shorter than one step is not
 * read); callers keep it so that the loads are not dropped. */
static inline uint64_t
sp_read_sum(const void *p, size_t bytes)
{
    const unsigned char *b = p;
    sp_read_vec a[8];
    memset(a, 0, sizeof a);
    const size_t n = bytes / (8 * SP_READ_VBYTES);
    for (size_t i = 0; i < n; i++) {
        const sp_read_vec *v = (const sp_read_vec *)(b + i * 8 * SP_READ_VBYTES);
        for (int q = 0; q < 8; q++) {
            a[q] += v[q];
        }
    }
    for (int q = 1; q < 8; q++) {
        a[0] += a[q];
    }
    uint64_t s = 0;
    for (size_t i = 0; i < SP_READ_VBYTES / sizeof(uint64_t); i++) {
        s += a[0][i];
    }
    return s;
}

#endif /* SP_BENCH_READ_SUM_H */
