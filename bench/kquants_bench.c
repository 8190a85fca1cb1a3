/*
 * kquants_bench.c - single-thread throughput of the Q4_K / Q6_K x Q8_K kernels, in GB/s of
 * weight bytes read, for every level this CPU has. Not a test: numbers depend on the machine.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc bench/kquants_bench.c build/libsampan.a -lm -pthread -o build/kqbench
 *   ./build/kqbench
 *
 * "L2" runs 64 rows x 4096 (weights stay in cache: kernel speed); "DRAM" runs 16384 rows x
 * 4096 (36-54 MB, larger than most L3s: what decode sees). gemm runs 32 tokens per row
 * and reports weight bytes x tokens per second (the work vec_dot would do in that time).
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants_impl.h"
#include "kernels/kernels.h"

static double
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { N = 4096, TOK = 32 };

static void
bench(const char *level, sp_type_t wt, sp_vec_dot_fn dot, sp_gemm_fn gemm, const void *w,
      size_t row_bytes, int64_t rows, const sp_block_q8_k *x, const char *where)
{
    float *out = malloc(sizeof(float) * (size_t)rows * TOK);
    double best = 1e30;
    const int reps = rows > 1000 ? 3 : 640;
    for (int k = 0; k < 7; k++) { /* best of 7: the machine is shared */
        double t0 = now();
        for (int r = 0; r < reps; r++)
            for (int64_t i = 0; i < rows; i++)
                dot(N, &out[i], (const char *)w + (size_t)i * row_bytes, x);
        double dt = (now() - t0) / reps;
        best = dt < best ? dt : best;
    }
    double gbs = (double)rows * (double)row_bytes / best / 1e9;
    printf("%-18s %-5s %-5s vec_dot %7.1f GB/s", level, sp_type_name(wt), where, gbs);
    if (gemm != NULL && rows <= 1000) {
        best = 1e30;
        for (int k = 0; k < 7; k++) { /* best of 7: the machine is shared */
            double t0 = now();
            for (int r = 0; r < reps / TOK; r++)
                gemm(N, w, row_bytes, 0, rows, x, sizeof(sp_block_q8_k) * (N / SP_QK_K), TOK, out,
                     rows);
            double dt = (now() - t0) / (reps / TOK);
            best = dt < best ? dt : best;
        }
        printf("   gemm(%d tok) %7.1f GB/s-equivalent", TOK,
               (double)rows * (double)row_bytes * TOK / best / 1e9);
    }
    printf("\n");
    free(out);
}

int
main(void)
{
    const int64_t big = 16384;
    float *f = malloc(sizeof(float) * N * TOK);
    for (int i = 0; i < N * TOK; i++)
        f[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    const size_t r4 = sp_row_size(SP_TYPE_Q4_K, N), r6 = sp_row_size(SP_TYPE_Q6_K, N);
    char *w4 = malloc(r4 * (size_t)big), *w6 = malloc(r6 * (size_t)big);
    sp__kquants_quantize_row(SP_TYPE_Q4_K, f, w4, N);
    sp__kquants_quantize_row(SP_TYPE_Q6_K, f, w6, N);
    for (int64_t i = 1; i < big; i++) { /* same row everywhere: quantizing 64M values is slow */
        memcpy(w4 + (size_t)i * r4, w4, r4);
        memcpy(w6 + (size_t)i * r6, w6, r6);
    }
    sp_block_q8_k *x = malloc(sizeof(sp_block_q8_k) * (N / SP_QK_K) * TOK);
    sp__kquants_quantize_row(SP_TYPE_Q8_K, f, x, (int64_t)N * TOK);

    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL)
            continue;
        for (int sz = 0; sz < 2; sz++) {
            const int64_t rows = sz ? big : 64;
            const char *where = sz ? "DRAM" : "L2";
            bench(k->name, SP_TYPE_Q4_K, k->vec_dot[SP_TYPE_Q4_K], k->gemm[SP_TYPE_Q4_K], w4, r4,
                  rows, x, where);
            bench(k->name, SP_TYPE_Q6_K, k->vec_dot[SP_TYPE_Q6_K], k->gemm[SP_TYPE_Q6_K], w6, r6,
                  rows, x, where);
        }
    }
    if (sp_cpu_kernels_for(SP_CPU_AVX512) != NULL) {
        bench("avx512 (no vnni)", SP_TYPE_Q4_K, sp__q4k_vec_dot_avx512, sp__q4k_gemm_avx512, w4,
              r4, 64, x, "L2");
        bench("avx512 (no vnni)", SP_TYPE_Q6_K, sp__q6k_vec_dot_avx512, sp__q6k_gemm_avx512, w6,
              r6, 64, x, "L2");
    }
    free(f);
    free(w4);
    free(w6);
    free(x);
    return 0;
}
