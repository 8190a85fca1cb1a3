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

#if defined(__AVX512F__)
#define SP_READ_VBYTES 64
#else
#define SP_READ_VBYTES 32
#endif
typedef uint64_t sp_read_vec __attribute__((vector_size(SP_READ_VBYTES), aligned(1)));

/* The sum of a vector's lanes */
static inline uint64_t
sp__read_lanes(sp_read_vec a)
{
    uint64_t s = 0;
    for (size_t i = 0; i < SP_READ_VBYTES / sizeof(uint64_t); i++) {
        s += a[i];
    }
    return s;
}

/* The sum of the whole 8-vector steps of p[0, bytes) (a tail shorter than one step is not
 * read); callers keep it so that the loads are not dropped. Eight named accumulators, not an
 * array: GCC 12 at -O2 (decode_bench's build) kept an array of them in memory, a load, add and
 * store per vector, and the read ran at about 0.8x of the -O3 build's. */
static inline uint64_t
sp_read_sum(const void *p, size_t bytes)
{
    const unsigned char *b = p;
    sp_read_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    const size_t n = bytes / (8 * SP_READ_VBYTES);
    for (size_t i = 0; i < n; i++) {
        const sp_read_vec *v = (const sp_read_vec *)(b + i * 8 * SP_READ_VBYTES);
        a0 += v[0];
        a1 += v[1];
        a2 += v[2];
        a3 += v[3];
        a4 += v[4];
        a5 += v[5];
        a6 += v[6];
        a7 += v[7];
    }
    return sp__read_lanes(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
}

/* The bytes [*a, *b) of a matrix stored in units of unit_rows rows, unit_bytes each (load-time
 * packed groups, or rows with unit_rows 1) that hold its rows [r0, r1): the whole units, as a
 * product over those rows reads them. */
static inline void
sp_read_span(size_t unit_bytes, int64_t unit_rows, int64_t r0, int64_t r1, size_t *a, size_t *b)
{
    *a = (size_t)(r0 / unit_rows) * unit_bytes;
    *b = (size_t)((r1 + unit_rows - 1) / unit_rows) * unit_bytes;
}

/* The plain read of those bytes (bench/decode_bench.c, bench/step_bench.c). */
static inline uint64_t
sp_read_rows(const void *base, size_t unit_bytes, int64_t unit_rows, int64_t r0, int64_t r1)
{
    size_t a, b;
    sp_read_span(unit_bytes, unit_rows, r0, r1, &a, &b);
    return sp_read_sum((const unsigned char *)base + a, b - a);
}

/* The same sum over two streams at once: the halves of p[0, bytes) read in step, one vector
 * step of each in turn (the shape of the AVX2 one-token products since rpx_gemv_two, which ran
 * faster from memory than over one stream). membw reports the better of the two reads. */
static inline uint64_t
sp_read_sum_two(const void *p, size_t bytes)
{
    const size_t step = 4 * SP_READ_VBYTES, half = bytes / 2 / step * step;
    const unsigned char *b0 = p, *b1 = b0 + half;
    sp_read_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (size_t o = 0; o < half; o += step) {
        const sp_read_vec *v = (const sp_read_vec *)(b0 + o), *u = (const sp_read_vec *)(b1 + o);
        a0 += v[0];
        a1 += v[1];
        a2 += v[2];
        a3 += v[3];
        a4 += u[0];
        a5 += u[1];
        a6 += u[2];
        a7 += u[3];
    }
    return sp__read_lanes(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
}

#endif /* SP_BENCH_READ_SUM_H */
