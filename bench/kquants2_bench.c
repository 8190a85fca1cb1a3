/*
 * kquants2_bench.c - single-thread throughput of the Q2_K / Q3_K / Q5_K / IQ4_XS x Q8_K kernels
 * (with Q4_K / Q6_K alongside for comparison), in GB/s of weight bytes read, for every level
 * this CPU has. Not a test: numbers depend on the machine (and on its load). A few seconds.
 *
 *   make build/libsampan.a
 *   cc -O2 -Iinclude -Isrc bench/kquants2_bench.c build/libsampan.a -lm -pthread -o build/kq2bench
 *   nice ./build/kq2bench
 *
 * 64 rows x 4096 (the weights stay in L2: kernel speed, not memory bandwidth); gemm runs 32
 * tokens per row and reports weight bytes x tokens per second (the work vec_dot would do).
 * Timed in thread CPU time, so other processes' time slices do not count (their cache
 * pressure still does).
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

static double
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine is shared */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { N = 4096, TOK = 32, ROWS = 64, REPS = 160 };

static void
bench(const sp_cpu_kernels_t *k, sp_type_t wt, const float *f, const sp_block_q8_k *x)
{
    const size_t rb = sp_row_size(wt, N);
    char *w = malloc(rb * ROWS);
    float *out = malloc(sizeof(float) * ROWS * TOK);
    for (int r = 0; r < ROWS; r++)
        sp_quantize_row(wt, f + (size_t)(r % TOK) * N, w + (size_t)r * rb, N);
    double best = 1e30;
    for (int t = 0; t < 3; t++) { /* best of 3: the machine is shared */
        const double t0 = now();
        for (int rep = 0; rep < REPS; rep++)
            for (int r = 0; r < ROWS; r++)
                k->vec_dot[wt](N, &out[r], w + (size_t)r * rb, x);
        const double dt = (now() - t0) / REPS;
        best = dt < best ? dt : best;
    }
    printf("%-8s %-7s vec_dot %6.1f GB/s", k->name, sp_type_name(wt), ROWS * rb / best / 1e9);
    if (k->gemm[wt] != NULL) {
        best = 1e30;
        for (int t = 0; t < 3; t++) {
            const double t0 = now();
            for (int rep = 0; rep < REPS / TOK * 2; rep++)
                k->gemm[wt](N, w, rb, 0, ROWS, x, sizeof(sp_block_q8_k) * (N / SP_QK_K), TOK, out,
                            ROWS);
            const double dt = (now() - t0) / (REPS / TOK * 2);
            best = dt < best ? dt : best;
        }
        printf("   gemm(%d tok) %6.1f GB/s-equivalent", TOK, (double)ROWS * rb * TOK / best / 1e9);
    }
    printf("\n");
    free(w);
    free(out);
}

int
main(void)
{
    float *f = malloc(sizeof(float) * N * TOK);
    for (int i = 0; i < N * TOK; i++)
        f[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    sp_block_q8_k *x = malloc(sizeof(sp_block_q8_k) * (N / SP_QK_K) * TOK);
    sp_quantize_row(SP_TYPE_Q8_K, f, x, (int64_t)N * TOK);
    static const sp_type_t types[] = {SP_TYPE_Q4_K, SP_TYPE_Q6_K, SP_TYPE_Q5_K,
                                      SP_TYPE_Q3_K, SP_TYPE_IQ4_XS, SP_TYPE_Q2_K};
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_AVX512; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL)
            continue;
        for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
            bench(k, types[i], f, x);
    }
    free(f);
    free(x);
    return 0;
}
