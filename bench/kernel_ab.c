/*
 * kernel_ab.c - the AVX2 packed gemms (repack_gemm of the AVX2 kernel table: avx2_repack.c and
 * avx2_q8gemm.c) of another revision against this tree's, in one process, alternated: on a
 * shared host whose speed drifts 20-30% between minutes, two binaries run one after the other
 * compare the host more than the kernels. bench/kernel_ab.sh builds the other revision's two
 * objects, renames their entry points (old_*) and links them here beside this tree's library.
 *
 *   bench/kernel_ab.sh REV [TYPE ROWS ...]      (e.g. bench/kernel_ab.sh HEAD~1 q8_0 65536)
 *
 * For each type and row count: a ROWS x 2048 packed matrix (128 rows, about 280 KB, stays in L2:
 * "hot"; 65536 rows, about 140 MB at 8 bits, streams from memory: "cold"), and token counts
 * 1, 2, 3, 4, 6, 8, 16, 64 (distinct activation rows). Per count, 7 rounds of new then old;
 * GMAC/s of the best of each and old / new time ("x1.20": the new one 20% faster). One thread,
 * thread CPU time (qbench.h); AB_THREADS=2: two threads, half the rows each, wall time, 9
 * rounds, cold sizes only (a thread is started per call, which would swamp a cached one). The outputs of both are compared bit for bit (a kernel change must not change them).
 * Not a test: nothing fails but a mismatch (exit 1); numbers depend on the machine and its load.
 */
#include "qbench.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/cpu/cpu_impl.h"

void old_sp__repack_register_avx2(sp_cpu_kernels_t *k);

typedef struct {
    sp_gemm_fn f;
    int64_t n, rows, toks;
    const uint8_t *wp, *x;
    size_t gb, xrow;
    float *out;
} run_t;

typedef struct {
    const run_t *c;
    int64_t r0, r1;
} part_t;

static void *
run_part(void *arg)
{
    const part_t *p = arg;
    const run_t *c = p->c;
    c->f(c->n, c->wp, c->gb, p->r0, p->r1, c->x, c->xrow, c->toks, c->out, c->rows);
    return NULL;
}

static void
run1(void *ctx)
{
    part_t p = {ctx, 0, ((const run_t *)ctx)->rows};
    run_part(&p);
}

/* Two threads, half the rows each (a whole number of 8-row groups): wall seconds. */
static double
run2(const run_t *c)
{
    const int64_t mid = c->rows / 16 * 8;
    part_t a = {c, 0, mid}, b = {c, mid, c->rows};
    struct timespec t0, t1;
    pthread_t th;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int spawned = pthread_create(&th, NULL, run_part, &b) == 0;
    run_part(&a);
    if (spawned) {
        pthread_join(th, NULL);
    } else {
        run_part(&b); /* no second thread: both halves here */
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

static uint64_t seed = 1;

/* One type and row count; 0 when the outputs agree, 1 on a mismatch, -1 when not measured. */
static int
ab(const sp_cpu_kernels_t *k, const sp_cpu_kernels_t *ko, sp_type_t wt, int64_t rows, int threads)
{
    enum { N = 2048, MAX_TOK = 64 };
    if (k->repack_gemm[wt] == NULL || ko->repack_gemm[wt] == NULL) {
        printf("%s: no packed gemm at this level\n", sp_type_name(wt));
        return -1;
    }
    const sp_repack_layout_t l = k->repack_layout[wt];
    const size_t pbytes = (sp_repack_bytes_in(l, wt, N, rows) + 63) & ~(size_t)63;
    const int cold = (double)pbytes > 32e6; /* beyond this CPU's L3: streams from memory */
    if (threads > 1 && !cold) {
        return -1; /* hot: see the header */
    }
    const sp_type_t at = k->vec_dot_type[wt];
    const size_t wrow = sp_row_size(wt, N), xrow = sp_row_size(at, N);
    uint8_t *w = malloc(wrow * (size_t)rows), *x = malloc(xrow * MAX_TOK);
    uint8_t *wp = sp_malloc_huge(pbytes); /* huge pages, as the engine's packed weights */
    float *f = malloc(sizeof(float) * N);
    float *out = malloc(sizeof(float) * (size_t)rows * MAX_TOK);
    float *out_old = malloc(sizeof(float) * (size_t)rows * MAX_TOK);
    int rc = -1;
    if (!w || !x || !wp || !f || !out || !out_old) {
        printf("%s: cannot allocate %lld rows\n", sp_type_name(wt), (long long)rows);
        goto done;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int i = 0; i < N; i++) {
            f[i] = 0.05f * qbench_rnd(&seed);
        }
        sp_quantize_row(wt, f, w + (size_t)r * wrow, N);
    }
    for (int t = 0; t < MAX_TOK; t++) {
        for (int i = 0; i < N; i++) {
            f[i] = qbench_rnd(&seed);
        }
        k->from_float[at](f, x + (size_t)t * xrow, N);
    }
    const int gr = sp_repack_layout_rows(l);
    sp_repack_pack_in(l, wt, N, w, wrow, rows, 0, (rows + gr - 1) / gr, wp);
    const size_t gb = sp_repack_group_bytes_in(l, wt, N);
    static const int toks[] = {1, 2, 3, 4, 6, 8, 16, 64};
    printf("%-7s %6lld rows (%s, %d thread%s):", sp_type_name(wt), (long long)rows,
           cold ? "cold" : "hot", threads, threads > 1 ? "s" : "");
    rc = 0;
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        run_t cn = {k->repack_gemm[wt], N, rows, toks[i], wp, x, gb, xrow, out};
        run_t co = {ko->repack_gemm[wt], N, rows, toks[i], wp, x, gb, xrow, out_old};
        const int reps = pbytes > (4u << 20) ? 1 : 20;
        double sn = 1e30, so = 1e30;
        for (int r = 0; r < (threads > 1 ? 9 : 7); r++) {
            double v = threads > 1 ? run2(&cn) : qbench_best(run1, &cn, reps, 1);
            sn = v < sn ? v : sn;
            v = threads > 1 ? run2(&co) : qbench_best(run1, &co, reps, 1);
            so = v < so ? v : so;
        }
        const double macs = (double)N * (double)rows * toks[i];
        const int same = !memcmp(out, out_old, sizeof(float) * (size_t)rows * toks[i]);
        printf("  %d: %.1f/%.1f x%.2f%s", toks[i], macs / sn * 1e-9, macs / so * 1e-9, so / sn,
               same ? "" : " MISMATCH");
        rc |= !same;
        fflush(stdout);
    }
    printf("   (GMAC/s new/old, old/new time)\n");
done:
    free(w);
    free(x);
    sp_free(wp);
    free(f);
    free(out);
    free(out_old);
    return rc;
}

int
main(int argc, char **argv)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL) {
        printf("kernel_ab: this CPU has no AVX2 level; nothing to measure\n");
        return 0;
    }
    static sp_cpu_kernels_t ko;
    ko = *k;
    old_sp__repack_register_avx2(&ko);
    const int threads = getenv("AB_THREADS") && atoi(getenv("AB_THREADS")) > 1 ? 2 : 1;
    int bad = 0;
    if (argc < 3) {
        static const sp_type_t def[] = {SP_TYPE_Q8_0, SP_TYPE_Q4_0, SP_TYPE_Q4_K, SP_TYPE_IQ4_XS,
                                        SP_TYPE_IQ4_NL};
        for (size_t i = 0; i < sizeof def / sizeof def[0]; i++) {
            bad |= ab(k, &ko, def[i], 128, threads) > 0;
            bad |= ab(k, &ko, def[i], 65536, threads) > 0;
        }
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        const int t = sp_type_from_name(argv[i]);
        const long long rows = atoll(argv[i + 1]);
        if (t < 0 || rows < 8 || rows > (1 << 20)) {
            fprintf(stderr, "kernel_ab: TYPE ROWS pairs (a type name, 8..1048576 rows)\n");
            return 2;
        }
        bad |= ab(k, &ko, (sp_type_t)t, rows / 8 * 8, threads) > 0;
    }
    return bad;
}
