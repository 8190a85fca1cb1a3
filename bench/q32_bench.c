/*
 * q32_bench.c - single-thread throughput of the Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 kernels
 * (and Q4_0 / Q8_0 for comparison), in GB/s of weight bytes read, for every level this CPU
 * has. Not a test: numbers depend on the machine (and on its load). A few seconds.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc bench/q32_bench.c build/libsampan.a -lm -pthread -o build/q32bench
 *   nice ./build/q32bench [LEVEL ...] [TYPE ...]     (e.g. avx2 iq4_nl; none: all)
 *
 * 64 rows x 4096 (the weights stay in L2: kernel speed, not memory). gemm runs 32 tokens per
 * row and reports weight bytes x tokens per second (the work vec_dot would do in that time).
 * Timed in thread CPU time (qbench.h), best of 5.
 */
#include "qbench.h"

#include "kernels/cpu/cpu_impl.h"

enum { N = 4096, ROWS = 64, TOK = 32, REPS = 200 };

typedef struct {
    const sp_cpu_kernels_t *k;
    sp_type_t wt;
    const uint8_t *w;
    size_t wrow;
    const uint8_t *x;
    size_t xrow;
    float *out;
} run_t;

static void
run_vec_dot(void *ctx)
{
    const run_t *c = ctx;
    for (int r = 0; r < ROWS; r++)
        c->k->vec_dot[c->wt](N, &c->out[r], c->w + (size_t)r * c->wrow, c->x);
}

static void
run_gemm(void *ctx)
{
    const run_t *c = ctx;
    sp_cpu_gemm(c->k, c->wt, N, c->w, c->wrow, 0, ROWS, c->x, c->xrow, TOK, c->out, ROWS);
}

static void
bench(const sp_cpu_kernels_t *k, sp_type_t wt, const float *wf, const float *xf)
{
    const sp_type_t at = k->vec_dot_type[wt];
    const size_t wrow = sp_row_size(wt, N), xrow = sp_row_size(at, N);
    uint8_t *w = malloc(wrow * ROWS), *x = malloc(xrow * TOK);
    float *out = malloc(sizeof(float) * ROWS * TOK);
    for (int r = 0; r < ROWS; r++)
        sp_quantize_row(wt, wf + (size_t)r * N, w + (size_t)r * wrow, N);
    for (int t = 0; t < TOK; t++)
        k->from_float[at](xf + (size_t)t * N, x + (size_t)t * xrow, N);
    run_t c = {k, wt, w, wrow, x, xrow, out};
    double best = qbench_best(run_vec_dot, &c, REPS, 5);
    printf("%-8s %-7s vec_dot %6.1f GB/s", k->name, sp_type_name(wt),
           (double)ROWS * (double)wrow / best / 1e9);
    best = qbench_best(run_gemm, &c, REPS / TOK > 0 ? REPS / TOK : 1, 5);
    printf("   gemm(%d tok) %6.1f GB/s-equivalent\n", TOK,
           (double)ROWS * (double)wrow * TOK / best / 1e9);
    free(w);
    free(x);
    free(out);
}

int
main(int argc, char **argv)
{
    static const sp_type_t types[] = {SP_TYPE_Q4_0, SP_TYPE_Q8_0, SP_TYPE_Q4_1, SP_TYPE_Q5_0,
                                      SP_TYPE_Q5_1, SP_TYPE_IQ4_NL, SP_TYPE_MXFP4};
    float *wf = malloc(sizeof(float) * N * ROWS), *xf = malloc(sizeof(float) * N * TOK);
    uint64_t s = 12345;
    for (int i = 0; i < N * ROWS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        wf[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) * 1e-4f;
    }
    for (int i = 0; i < N * TOK; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        xf[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) * 1e-3f;
    }
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL)
            continue;
        for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
            if (qbench_selected(argc, argv, k->name, sp_type_name(types[ti])))
                bench(k, types[ti], wf, xf);
    }
    free(wf);
    free(xf);
    return 0;
}
