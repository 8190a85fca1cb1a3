/*
 * repack_bench.c - A/B in one process: the row-major gemm of the kernel table (gemm[type])
 * against the packed-weight gemm (repack_gemm[type], kernels.h) on the TinyLlama-1.1B
 * projection shapes, for prefill (512 tokens; a slice of the rows, which stay in L2 the way
 * a work item of batch.c's split does) and decode (1 token over the whole matrix, read from
 * memory, or L3 where it fits), and batched decode (8 and 32 tokens over the whole matrix). At the AVX-512 level, where a packed gemm of its own replaces
 * the AVX2 one (Q4_K with VNNI: avx512_repack.c), the AVX2 packed gemm is timed in the same
 * alternation and the line ends with "vs avx2 packed xR" (R > 1: the AVX-512 one is faster);
 * at the AMX level (Q4_K and Q5_K on tiles: amx_kquants.c) the AVX-512 level's packed gemm is
 * the one compared, and a token sweep on a 128-row slice places the hand-off between the two. GB/s = weight bytes x tokens per second. Single thread, thread CPU time, best of 5 runs that alternate old and new so both
 * see the same machine load. Not a test: numbers depend on the machine and its load.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc bench/repack_bench.c build/libsampan.a -lm -pthread -o build/repackbench
 *   nice ./build/repackbench [q4_0|iq4_nl|q8_0|q4_k|iq4_xs|q6_k|q5_k]   (SAMPAN_CPU=avx2 on an AVX-512
 *   machine: that level has no packed kernels yet)
 */
#include "qbench.h"

#include "kernels/cpu/cpu_impl.h"

typedef struct {
    const sp_cpu_kernels_t *k;
    sp_type_t wt;
    int packed;
    int64_t n, rows, toks;
    const uint8_t *w, *wp, *x;
    size_t wrow, gb, xrow;
    float *out;
} run_t;

static void
run(void *ctx)
{
    const run_t *c = ctx;
    if (c->packed)
        c->k->repack_gemm[c->wt](c->n, c->wp, c->gb, 0, c->rows, c->x, c->xrow, c->toks, c->out,
                                 c->rows);
    else
        sp_cpu_gemm(c->k, c->wt, c->n, c->w, c->wrow, 0, c->rows, c->x, c->xrow, c->toks, c->out,
                    c->rows);
}

static uint64_t seed = 12345;

/* old and new seconds per call, best of 5 alternating runs */
static void
ab(const sp_cpu_kernels_t *k, sp_type_t wt, const char *what, int64_t rows, int64_t n,
   int64_t toks, int reps)
{
    const sp_type_t at = k->vec_dot_type[wt];
    const size_t wrow = sp_row_size(wt, n), xrow = sp_row_size(at, n);
    uint8_t *w = malloc(wrow * (size_t)rows), *x = malloc(xrow * (size_t)toks);
    /* the level below's packed gemm: AVX2 under AVX-512, AVX-512 under AMX */
    const sp_cpu_kernels_t *k2 = sp_cpu_kernels_for(k->level >= SP_CPU_AMX ? SP_CPU_AVX512
                                                                             : SP_CPU_AVX2);
    /* each table's own packed form (Q8_0: 16-row panels at AVX-512 VNNI, 8-row groups at AVX2) */
    const sp_repack_layout_t l1 = k->repack_layout[wt], l2 = k2 != NULL ? k2->repack_layout[wt] : l1;
    uint8_t *wp = aligned_alloc(64, (sp_repack_bytes_in(l1, wt, n, rows) + 63) & ~(size_t)63);
    uint8_t *wp2 = aligned_alloc(64, (sp_repack_bytes_in(l2, wt, n, rows) + 63) & ~(size_t)63);
    float *f = malloc(sizeof(float) * (size_t)n), *out = malloc(sizeof(float) * (size_t)(rows * toks));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = 0.05f * qbench_rnd(&seed);
        sp_quantize_row(wt, f, w + (size_t)r * wrow, n);
    }
    for (int64_t t = 0; t < toks; t++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = qbench_rnd(&seed);
        k->from_float[at](f, x + (size_t)t * xrow, n);
    }
    const int gr1 = sp_repack_layout_rows(l1), gr2 = sp_repack_layout_rows(l2);
    sp_repack_pack_in(l1, wt, n, w, wrow, rows, 0, (rows + gr1 - 1) / gr1, wp);
    sp_repack_pack_in(l2, wt, n, w, wrow, rows, 0, (rows + gr2 - 1) / gr2, wp2);
    const int nv = k->level >= SP_CPU_AVX512 && k2 != NULL && k2->repack_gemm[wt] != NULL &&
                           k2->repack_gemm[wt] != k->repack_gemm[wt]
                       ? 3
                       : 2;
    const size_t gb1 = sp_repack_group_bytes_in(l1, wt, n), gb2 = sp_repack_group_bytes_in(l2, wt, n);
    run_t c[3] = {{k, wt, 0, n, rows, toks, w, wp, x, wrow, gb1, xrow, out},
                  {k, wt, 1, n, rows, toks, w, wp, x, wrow, gb1, xrow, out},
                  {k2, wt, 1, n, rows, toks, w, wp2, x, wrow, gb2, xrow, out}};
    double best[3] = {1e30, 1e30, 1e30};
    for (int tr = 0; tr < 5; tr++)
        for (int v = 0; v < nv; v++) {
            const double s = qbench_best(run, &c[v], reps, 1);
            best[v] = s < best[v] ? s : best[v];
        }
    const double bytes = (double)wrow * (double)rows * (double)toks; /* weight bytes x tokens */
    printf("%-6s %-7s %-22s old %8.3f ms (%6.2f GB/s)  packed %8.3f ms (%6.2f GB/s)  x%.2f",
           k->name, sp_type_name(wt), what, best[0] * 1e3, bytes / best[0] / 1e9, best[1] * 1e3,
           bytes / best[1] / 1e9, best[0] / best[1]);
    if (nv == 3)
        printf("  vs %s packed x%.2f", sp_cpu_level_name(k2->level), best[2] / best[1]);
    printf("\n");
    free(w);
    free(x);
    free(wp);
    free(wp2);
    free(f);
    free(out);
}

int
main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int64_t rows, n;
    } shapes[] = {{"attn_q/o 2048x2048", 2048, 2048},
                  {"attn_k/v 256x2048", 256, 2048},
                  {"ffn_gate/up 5632x2048", 5632, 2048},
                  {"ffn_down 2048x5632", 2048, 5632}};
    static const sp_type_t types[] = {SP_TYPE_Q4_0, SP_TYPE_IQ4_NL, SP_TYPE_Q8_0, SP_TYPE_Q4_K,
                                      SP_TYPE_IQ4_XS, SP_TYPE_Q6_K,   SP_TYPE_Q5_K};
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        if (!qbench_selected(argc, argv, k->name, sp_type_name(types[ti])))
            continue;
        if (k->repack_gemm[types[ti]] == NULL) {
            printf("%s: no packed %s kernel at this level\n", k->name, sp_type_name(types[ti]));
            continue;
        }
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            char what[64];
            snprintf(what, sizeof what, "%s prefill", shapes[s].name);
            ab(k, types[ti], what, 128, shapes[s].n, 512, 1); /* 128 rows: one work item */
            snprintf(what, sizeof what, "%s decode", shapes[s].name);
            ab(k, types[ti], what, shapes[s].rows, shapes[s].n, 1, 5);
            /* batched decode: the rows of 8 and 32 running sequences in one product */
            for (int64_t bt = 8; bt <= 32; bt *= 4) {
                snprintf(what, sizeof what, "%s batch %d", shapes[s].name, (int)bt);
                ab(k, types[ti], what, shapes[s].rows, shapes[s].n, bt, 2);
            }
        }
        /* decode over 192 MiB of weights, far more than any cache: GB/s against
         * bench/membw's single-thread read bandwidth */
        const int64_t big_rows = (int64_t)((192u << 20) / sp_row_size(types[ti], 2048)) / 8 * 8;
        ab(k, types[ti], "2048-wide 192 MiB decode", big_rows, 2048, 1, 2);
        if (k->level >= SP_CPU_AMX && (types[ti] == SP_TYPE_Q4_K || types[ti] == SP_TYPE_Q5_K)) {
            static const int64_t sweep[] = {4, 8, 12, 16, 24, 32, 48, 64, 128};
            for (size_t i = 0; i < sizeof sweep / sizeof sweep[0]; i++) {
                char what[64];
                snprintf(what, sizeof what, "128x2048 %d tokens", (int)sweep[i]);
                ab(k, types[ti], what, 128, 2048, sweep[i], sweep[i] < 32 ? 20 : 4);
            }
        }
    }
    return 0;
}
