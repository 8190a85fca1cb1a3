/*
 * kquants2_bench.c - single-thread throughput of the Q2_K / Q3_K / Q5_K / IQ4_XS x Q8_K kernels
 * (with Q4_K / Q6_K alongside for comparison), in GB/s of weight bytes read, for every level
 * this CPU has. Not a test: numbers depend on the machine (and on its load). A few seconds.
 *
 *   make build/libsampan.a
 *   cc -O2 -Iinclude -Isrc bench/kquants2_bench.c build/libsampan.a -lm -pthread -o build/kq2bench
 *   nice ./build/kq2bench [LEVEL ...] [TYPE ...]     (e.g. avx2 iq4_xs; none: all)
 *
 * 64 rows x 4096 (the weights stay in L2: kernel speed, not memory bandwidth); gemm runs 32
 * tokens per row and reports weight bytes x tokens per second (the work vec_dot would do).
 * Timed in thread CPU time (qbench.h), best of 3.
 */
#include "qbench.h"

enum { N = 4096, TOK = 32, ROWS = 64, REPS = 160 };

typedef struct {
    const sp_cpu_kernels_t *k;
    sp_type_t wt;
    const char *w;
    size_t rb;
    const sp_block_q8_k *x;
    float *out;
} run_t;

static void
run_vec_dot(void *ctx)
{
    const run_t *c = ctx;
    for (int r = 0; r < ROWS; r++)
        c->k->vec_dot[c->wt](N, &c->out[r], c->w + (size_t)r * c->rb, c->x);
}

static void
run_gemm(void *ctx)
{
    const run_t *c = ctx;
    c->k->gemm[c->wt](N, c->w, c->rb, 0, ROWS, c->x, sizeof(sp_block_q8_k) * (N / SP_QK_K), TOK,
                      c->out, ROWS);
}

static void
bench(const sp_cpu_kernels_t *k, sp_type_t wt, const float *f, const sp_block_q8_k *x)
{
    const size_t rb = sp_row_size(wt, N);
    char *w = malloc(rb * ROWS);
    float *out = malloc(sizeof(float) * ROWS * TOK);
    for (int r = 0; r < ROWS; r++)
        sp_quantize_row(wt, f + (size_t)(r % TOK) * N, w + (size_t)r * rb, N);
    run_t c = {k, wt, w, rb, x, out};
    double best = qbench_best(run_vec_dot, &c, REPS, 3);
    printf("%-8s %-7s vec_dot %6.1f GB/s", k->name, sp_type_name(wt), ROWS * rb / best / 1e9);
    if (k->gemm[wt] != NULL) {
        best = qbench_best(run_gemm, &c, REPS / TOK * 2, 3);
        printf("   gemm(%d tok) %6.1f GB/s-equivalent", TOK, (double)ROWS * rb * TOK / best / 1e9);
    }
    printf("\n");
    free(w);
    free(out);
}

int
main(int argc, char **argv)
{
    float *f = malloc(sizeof(float) * N * TOK);
    for (int i = 0; i < N * TOK; i++)
        f[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    sp_block_q8_k *x = malloc(sizeof(sp_block_q8_k) * (N / SP_QK_K) * TOK);
    sp_quantize_row(SP_TYPE_Q8_K, f, x, (int64_t)N * TOK);
    static const sp_type_t types[] = {SP_TYPE_Q4_K, SP_TYPE_Q6_K, SP_TYPE_Q5_K,
                                      SP_TYPE_Q3_K, SP_TYPE_IQ4_XS, SP_TYPE_Q2_K};
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL)
            continue;
        for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
            if (qbench_selected(argc, argv, k->name, sp_type_name(types[i])))
                bench(k, types[i], f, x);
    }
    free(f);
    free(x);
    return 0;
}
