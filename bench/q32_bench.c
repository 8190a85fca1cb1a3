/*
 * q32_bench.c - single-thread throughput of the Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 kernels
 * (and Q4_0 / Q8_0 for comparison), in GB/s of weight bytes read, for every level this CPU
 * has. Not a test: numbers depend on the machine.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc bench/q32_bench.c build/libsampan.a -lm -pthread -o build/q32bench
 *   ./build/q32bench [reps]
 *
 * 64 rows x 4096 (the weights stay in L2: kernel speed, not memory). gemm runs 32 tokens per
 * row and reports weight bytes x tokens per second (the work vec_dot would do in that time).
 * One thread, no heap beyond the buffers below. Times are this thread's CPU time, so other
 * load on a shared machine changes them less than wall time would.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/kernels.h"

static double
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine is shared */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { N = 4096, ROWS = 64, TOK = 32 };

int
main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    static const sp_type_t types[] = {SP_TYPE_Q4_0, SP_TYPE_Q8_0, SP_TYPE_Q4_1, SP_TYPE_Q5_0,
                                      SP_TYPE_Q5_1, SP_TYPE_IQ4_NL, SP_TYPE_MXFP4};
    float *wf = malloc(sizeof(float) * N * ROWS), *xf = malloc(sizeof(float) * N * TOK);
    uint8_t *w = malloc((size_t)N / 32 * 34 * ROWS), *x = malloc((size_t)N / 32 * 36 * TOK);
    float *out = malloc(sizeof(float) * ROWS * TOK);
    uint64_t s = 12345;
    for (int i = 0; i < N * ROWS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        wf[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) * 1e-4f;
    }
    for (int i = 0; i < N * TOK; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        xf[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) * 1e-3f;
    }
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_AVX512; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL)
            continue;
        for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
            const sp_type_t wt = types[ti], at = k->vec_dot_type[wt];
            const size_t wrow = sp_row_size(wt, N), xrow = sp_row_size(at, N);
            for (int r = 0; r < ROWS; r++)
                sp_quantize_row(wt, wf + (size_t)r * N, w + (size_t)r * wrow, N);
            for (int t = 0; t < TOK; t++)
                k->from_float[at](xf + (size_t)t * N, x + (size_t)t * xrow, N);
            double best = 1e30;
            for (int rep = 0; rep < 5; rep++) { /* best of 5: the machine is shared */
                double t0 = now();
                for (int i = 0; i < reps; i++)
                    for (int r = 0; r < ROWS; r++)
                        k->vec_dot[wt](N, &out[r], w + (size_t)r * wrow, x);
                double dt = (now() - t0) / reps;
                best = dt < best ? dt : best;
            }
            printf("%-8s %-7s vec_dot %6.1f GB/s", k->name, sp_type_name(wt),
                   (double)ROWS * (double)wrow / best / 1e9);
            best = 1e30;
            const int greps = reps / TOK > 0 ? reps / TOK : 1;
            for (int rep = 0; rep < 5; rep++) {
                double t0 = now();
                for (int i = 0; i < greps; i++)
                    sp_cpu_gemm(k, wt, N, w, wrow, 0, ROWS, x, xrow, TOK, out, ROWS);
                double dt = (now() - t0) / greps;
                best = dt < best ? dt : best;
            }
            printf("   gemm(%d tok) %6.1f GB/s-equivalent\n", TOK,
                   (double)ROWS * (double)wrow * TOK / best / 1e9);
        }
    }
    free(wf);
    free(xf);
    free(w);
    free(x);
    free(out);
    return 0;
}
