/*
 * kernels_bench.c - single-thread speed of the CPU kernels, per level and type.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc -D_GNU_SOURCE -pthread bench/kernels_bench.c build/libsampan.a -lm \
 *      -o build/kernels_bench
 *   ./build/kernels_bench [level...]     levels: scalar avx2 avx512 (default: all this CPU has)
 *
 * decode: one token against a weight matrix much bigger than the caches,
 *   as vec_dot row by row and as sp_cpu_gemm with n_tok = 1, in GB/s of
 *   weight bytes (the memory-read limit is what decode can reach); "read" is
 *   a plain streaming read of the same bytes for comparison.
 * prefill: sp_cpu_gemm over a cache-sized weight block and 64 tokens, in
 *   GFLOP/s (2 * n * rows * tokens per call).
 * Not a test: nothing here asserts, and numbers depend on the machine.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "kernels/kernels.h"

/* Thread CPU time, not wall time: the bench shares small machines with
 * builds, and time spent descheduled is not the kernel's. */
static int64_t
sp_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define DEC_N 4096
#define DEC_BYTES (256u << 20) /* weight bytes streamed per decode pass */
#define PRE_N 2048
#define PRE_ROWS 512
#define PRE_TOK 64

static void
fill(float *x, int64_t n, uint32_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) * 0x1p-23f - 1.0f;
    }
}

/* Plain read bandwidth with 8 independent 256-bit loads in flight. */
__attribute__((target("avx2"))) static double
read_gbs(const uint8_t *p, size_t bytes)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        int64_t t0 = sp_time_ns();
        __m256i a[8];
        for (int j = 0; j < 8; j++) {
            a[j] = _mm256_setzero_si256();
        }
        for (size_t i = 0; i + 256 <= bytes; i += 256) {
            for (int j = 0; j < 8; j++) {
                const __m256i *q = (const __m256i *)(p + i + 32 * j);
                a[j] = _mm256_xor_si256(a[j], _mm256_loadu_si256(q));
            }
        }
        for (int j = 1; j < 8; j++) {
            a[0] = _mm256_xor_si256(a[0], a[j]);
        }
        volatile int sink = _mm256_extract_epi32(a[0], 0);
        (void)sink;
        double gbs = (double)bytes / (double)(sp_time_ns() - t0);
        best = gbs > best ? gbs : best;
    }
    return best;
}

static void
bench_level(const sp_cpu_kernels_t *k)
{
    static const sp_type_t types[] = {SP_TYPE_F32, SP_TYPE_F16, SP_TYPE_BF16, SP_TYPE_Q8_0,
                                      SP_TYPE_Q4_0};
    printf("== %s\n", k->name);
    printf("%-6s %10s %11s %10s %10s %13s\n", "type", "dot GB/s", "gemm1 GB/s", "read GB/s",
           "hot1 GB/s", "gemm GFLOP/s");
    float *xf = sp_malloc(sizeof(float) * PRE_N * PRE_TOK);
    fill(xf, PRE_N * PRE_TOK, 99);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        sp_type_t wt = types[ti];
        sp_type_t xt = k->vec_dot_type[wt];
        /* decode */
        size_t ws = sp_row_size(wt, DEC_N);
        int64_t rows = (int64_t)(DEC_BYTES / ws);
        uint8_t *w = sp_malloc(ws * (size_t)rows);
        float *row = sp_malloc(sizeof(float) * DEC_N);
        for (int64_t r = 0; r < rows; r++) {
            if (r < 64) {
                fill(row, DEC_N, (uint32_t)r);
                sp_quantize_row(wt, row, w + (size_t)r * ws, DEC_N);
            } else { /* same bytes repeated: the speed does not depend on values */
                memcpy(w + (size_t)r * ws, w + (size_t)(r % 64) * ws, ws);
            }
        }
        uint8_t *x = sp_malloc(sp_row_size(xt, DEC_N));
        k->from_float[xt](xf, x, DEC_N);
        float *y = sp_malloc(sizeof(float) * (size_t)rows);
        double dot_best = 0, gemm_best = 0;
        for (int rep = 0; rep < 5; rep++) {
            int64_t t0 = sp_time_ns();
            for (int64_t r = 0; r < rows; r++) {
                k->vec_dot[wt](DEC_N, &y[r], w + (size_t)r * ws, x);
            }
            double g = (double)(ws * (size_t)rows) / (double)(sp_time_ns() - t0);
            dot_best = g > dot_best ? g : dot_best;
            t0 = sp_time_ns();
            sp_cpu_gemm(k, wt, DEC_N, w, ws, 0, rows, x, 0, 1, y, rows);
            g = (double)(ws * (size_t)rows) / (double)(sp_time_ns() - t0);
            gemm_best = g > gemm_best ? g : gemm_best;
        }
        double rd = read_gbs(w, ws * (size_t)rows);
        /* the same with 512 KiB of weights that stay in L2: the compute ceiling of decode */
        int64_t hot_rows = (int64_t)((512u << 10) / ws), hot_reps = rows / hot_rows;
        double hot_best = 0;
        for (int rep = 0; rep < 3; rep++) {
            int64_t t0 = sp_time_ns();
            for (int64_t i = 0; i < hot_reps; i++) {
                sp_cpu_gemm(k, wt, DEC_N, w, ws, 0, hot_rows, x, 0, 1, y, rows);
            }
            double g = (double)(ws * (size_t)(hot_rows * hot_reps)) / (double)(sp_time_ns() - t0);
            hot_best = g > hot_best ? g : hot_best;
        }
        sp_free(w);
        sp_free(x);
        sp_free(y);
        sp_free(row);
        /* prefill */
        ws = sp_row_size(wt, PRE_N);
        size_t xs = sp_row_size(xt, PRE_N);
        w = sp_malloc(ws * PRE_ROWS);
        row = sp_malloc(sizeof(float) * PRE_N);
        for (int64_t r = 0; r < PRE_ROWS; r++) {
            fill(row, PRE_N, (uint32_t)(r + 1000));
            sp_quantize_row(wt, row, w + (size_t)r * ws, PRE_N);
        }
        x = sp_malloc(xs * PRE_TOK);
        for (int t = 0; t < PRE_TOK; t++) {
            k->from_float[xt](xf + (size_t)t * PRE_N, x + (size_t)t * xs, PRE_N);
        }
        y = sp_malloc(sizeof(float) * PRE_ROWS * PRE_TOK);
        double flops = 2.0 * PRE_N * PRE_ROWS * PRE_TOK, best = 0;
        int reps = k->level == SP_CPU_SCALAR ? 1 : 10;
        for (int rep = 0; rep < reps; rep++) {
            int64_t t0 = sp_time_ns();
            sp_cpu_gemm(k, wt, PRE_N, w, ws, 0, PRE_ROWS, x, xs, PRE_TOK, y, PRE_ROWS);
            double g = flops / (double)(sp_time_ns() - t0);
            best = g > best ? g : best;
        }
        printf("%-6s %10.1f %11.1f %10.1f %10.1f %13.1f\n", sp_type_name(wt), dot_best, gemm_best,
               rd, hot_best, best);
        fflush(stdout);
        sp_free(w);
        sp_free(x);
        sp_free(y);
        sp_free(row);
    }
    sp_free(xf);
}

int
main(int argc, char **argv)
{
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        bool want = argc < 2;
        for (int i = 1; i < argc; i++) {
            want = want || strcmp(argv[i], sp_cpu_level_name((sp_cpu_level_t)l)) == 0;
        }
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (want && k != NULL) {
            bench_level(k);
        }
    }
    return 0;
}
