/*
 * qgemm_shape_bench.c - the quantized gemms at the shape a prefill step gives them: one work
 * item of the engine's matmul (ROWS weight rows, as batch.c's split of a 2048-row matrix over 2
 * threads gives) times a whole prompt chunk of tokens, K = 2048 and 5632 (TinyLlama's widths).
 * Reports GMAC/s per thread (thread CPU time, best of 3). With a second kernel table entry for
 * the same type (the `_prev` gemm a kernel file keeps for A/B), the two are timed interleaved
 * in the same process and their ratio printed: the host may be loaded, ratios are what count.
 * At the AVX-512 level "prev" is the gemm the table had before the VNNI panels of
 * avx512_kpanel.c: the AVX2 table's for Q2_K, the 1-row x 4-token VNNI tiles for Q6_K. At the
 * AMX level, for Q8_0 and Q4_0, "new" is the AMX tile kernel itself (amx_qgemm.c, whatever the
 * token count: its threshold is chosen from these lines) and "prev" the AVX-512 VNNI one.
 *
 *   make build/qgemm_shape_bench
 *   nice ./build/qgemm_shape_bench [LEVEL] [TYPE ...] [TOKENS]
 *
 * tests/py/test_bench_qgemm.py runs it at 8 tokens: every line there, the A/B's bits equal.
 */
#include "qbench.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants2_impl.h"
#include "kernels/cpu/kquants_impl.h"
#include "kernels/cpu/q32_impl.h"
#include "kernels/cpu/repack_impl.h"

enum { ROWS = 128 };

typedef struct {
    sp_gemm_fn gemm;
    int64_t n;
    const uint8_t *w;
    size_t wrow;
    const uint8_t *x;
    size_t xrow;
    int64_t tok;
    float *out;
} run_t;

static void
run_gemm(void *ctx)
{
    const run_t *c = ctx;
    c->gemm(c->n, c->w, c->wrow, 0, ROWS, c->x, c->xrow, c->tok, c->out, ROWS);
}

/* the previous kernel of a type at a level, kept by its file for this comparison (NULL: none).
 * AVX-512 VNNI: MXFP4 and IQ4_NL packed against the row-major 16-row panels before the load-time
 * packing (on the file's rows), IQ4_XS's AVX2 packed gemm (the new one is the table's
 * repack_gemm; both run on the packed weights). */
static sp_gemm_fn
prev_gemm(const sp_cpu_kernels_t *k, sp_type_t wt)
{
    /* the AVX2 level's AVX-VNNI table: against the plain AVX2 table's gemm (same layout) */
    if (k == sp_cpu_kernels_avx2_vnni())
        return sp_cpu_kernels_for(SP_CPU_AVX2)->repack_gemm[wt];
    /* AMX: the tile kernel (timed at any token count, below its threshold too) against the
     * AVX-512 VNNI table's packed gemm, both on the same 16-row panels */
    if (k->level == SP_CPU_AMX && sp__amx_qgemm_tiles(wt) != NULL)
        return sp_cpu_kernels_for(SP_CPU_AVX512)->repack_gemm[wt];
    if (k->level >= SP_CPU_AVX512) {
        if (!__builtin_cpu_supports("avx512vnni"))
            return NULL;
        /* the VNNI kernels against what the table had before them: the AVX2 packed gemm of a
         * packed type (IQ4_XS, Q4_K), the 512-bit Q6_K gemm, the q32 previous panels, else the
         * AVX2 table's gemm where it differs */
        const sp_cpu_kernels_t *k2 = sp_cpu_kernels_for(SP_CPU_AVX2);
        /* MXFP4 / IQ4_NL packed: the row-major 16-row panels of the same table (on the rows) */
        if (k->repack_gemm[wt] != NULL && (wt == SP_TYPE_MXFP4 || wt == SP_TYPE_IQ4_NL))
            return k->gemm[wt];
        /* another table's packed gemm only where it reads the same layout (Q8_0 / Q4_0 are
         * 8-row groups at AVX2, 16-row VNNI panels here) */
        if (k->repack_gemm[wt] != NULL)
            return k2->repack_gemm[wt] != k->repack_gemm[wt] &&
                           k2->repack_layout[wt] == k->repack_layout[wt]
                       ? k2->repack_gemm[wt]
                       : NULL;
        if (wt == SP_TYPE_Q6_K && k->gemm[wt] == sp__q6k_gemm_panel_avx512_vnni)
            return sp__q6k_gemm_avx512_vnni;
        sp_gemm_fn q = sp__q32_avx512_vnni_prev_gemm(wt);
        if (q != NULL)
            return q;
        return k2->gemm[wt] != k->gemm[wt] ? k2->gemm[wt] : NULL;
    }
    switch (wt) {
    /* the wide gemms of 8 tokens and up against the few-token tiles they replaced there */
    case SP_TYPE_Q4_0: return sp__repack_q4_0_gemm_avx2;
    case SP_TYPE_Q8_0: return sp__repack_q8_0_gemm_few_avx2;
    case SP_TYPE_Q4_K: return sp__repack_q4_k_gemm_few_avx2;
    case SP_TYPE_Q6_K: return sp__kpack_q6_k_gemm_few_avx2;
    case SP_TYPE_Q2_K: return sp__q2k_gemm_avx2_prev;
    case SP_TYPE_IQ4_XS: return sp__iq4xs_gemm_avx2_prev;
    case SP_TYPE_Q3_K: return sp__q3k_gemm_avx2_prev;
    case SP_TYPE_Q5_K: return sp__q5k_gemm_avx2_prev;
    case SP_TYPE_MXFP4: return sp__q32_mxfp4_gemm_avx2_prev;
    case SP_TYPE_Q4_1: return sp__q32_q4_1_gemm_avx2_prev;
    case SP_TYPE_Q5_0: return sp__q32_q5_0_gemm_avx2_prev;
    default: return NULL;
    }
}

static void
bench(const sp_cpu_kernels_t *k, sp_type_t wt, int64_t n, int64_t tok)
{
    const sp_type_t at = k->vec_dot_type[wt];
    const size_t wrow = sp_row_size(wt, n), xrow = sp_row_size(at, n);
    float *f = malloc(sizeof(float) * (size_t)n);
    uint8_t *w = malloc(wrow * ROWS), *x = malloc(xrow * (size_t)tok);
    float *out = malloc(sizeof(float) * ROWS * (size_t)tok);
    float *out2 = malloc(sizeof(float) * ROWS * (size_t)tok);
    uint64_t s = 12345;
    for (int r = 0; r < ROWS; r++) {
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            f[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) * 1e-4f;
        }
        sp_quantize_row(wt, f, w + (size_t)r * wrow, n);
    }
    for (int64_t t = 0; t < tok; t++) {
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            f[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) * 1e-3f;
        }
        k->from_float[at](f, x + (size_t)t * xrow, n);
    }
    const double macs = (double)ROWS * (double)n * (double)tok;
    run_t cur = {k->gemm[wt], n, w, wrow, x, xrow, tok, out};
    sp_gemm_fn pg = prev_gemm(k, wt);
    uint8_t *wp = NULL;
    if (k->repack_gemm[wt] != NULL) {
        /* the table runs this type on packed weights (the engine's path), in the table's own
         * form (AVX-512 Q8_0 / Q4_0: 16-row panels; AVX2: 8-row groups) */
        const sp_repack_layout_t lay = k->repack_layout[wt];
        const int gr = sp_repack_layout_rows(lay);
        wp = aligned_alloc(64, (sp_repack_bytes_in(lay, wt, n, ROWS) + 63) & ~(size_t)63);
        sp_repack_pack_in(lay, wt, n, w, wrow, ROWS, 0, (ROWS + gr - 1) / gr, wp);
        cur.gemm = k->level == SP_CPU_AMX && sp__amx_qgemm_tiles(wt) != NULL
                       ? sp__amx_qgemm_tiles(wt)
                       : k->repack_gemm[wt];
        cur.w = wp;
        cur.wrow = sp_repack_group_bytes_in(lay, wt, n);
    }
    if (cur.gemm == NULL) {
        printf("%-8s %-7s K=%-5lld no gemm\n", k->name, sp_type_name(wt), (long long)n);
        goto done;
    }
    if (pg != NULL && (k->level == SP_CPU_AVX2 || k->level >= SP_CPU_AVX512)) {
        /* on the rows: every AVX2 _prev kernel, and an AVX-512 table's own row gemm (the
         * AVX-VNNI table's prev is the AVX2 table's packed gemm, the AVX2 wide gemms' the
         * packed tiles) */
        const bool tiles =
            pg == sp__repack_q4_0_gemm_avx2 || pg == sp__repack_q8_0_gemm_few_avx2 ||
            pg == sp__repack_q4_k_gemm_few_avx2 || pg == sp__kpack_q6_k_gemm_few_avx2;
        const bool rows =
            (k->level == SP_CPU_AVX2 && k != sp_cpu_kernels_avx2_vnni() && !tiles) ||
            pg == k->gemm[wt];
        run_t prev = {pg, n, rows ? w : cur.w, rows ? wrow : cur.wrow, x, xrow, tok, out2};
        double bc = 1e30, bp = 1e30;
        for (int rnd = 0; rnd < 3; rnd++) { /* interleaved: both see the same load */
            const double a = qbench_best(run_gemm, &prev, 1, 2);
            const double b = qbench_best(run_gemm, &cur, 1, 2);
            bp = a < bp ? a : bp;
            bc = b < bc ? b : bc;
        }
        const int same = memcmp(out, out2, sizeof(float) * ROWS * (size_t)tok) == 0;
        printf("%-8s %-7s K=%-5lld %4lld tok  prev %6.1f  new %6.1f GMAC/s  new/prev %.2fx  %s\n",
               k->name, sp_type_name(wt), (long long)n, (long long)tok, macs / bp / 1e9,
               macs / bc / 1e9, bp / bc, same ? "same bits" : "RESULTS DIFFER");
    } else {
        const double b = qbench_best(run_gemm, &cur, 1, 3);
        printf("%-8s %-7s K=%-5lld %4lld tok  %6.1f GMAC/s\n", k->name, sp_type_name(wt),
               (long long)n, (long long)tok, macs / b / 1e9);
    }
done:
    free(wp);
    free(f);
    free(w);
    free(x);
    free(out);
    free(out2);
}

int
main(int argc, char **argv)
{
    static const sp_type_t types[] = {SP_TYPE_Q4_0, SP_TYPE_Q8_0, SP_TYPE_Q4_K,  SP_TYPE_Q2_K,
                                      SP_TYPE_IQ4_XS, SP_TYPE_MXFP4, SP_TYPE_Q3_K, SP_TYPE_Q5_K,
                                      SP_TYPE_Q4_1, SP_TYPE_Q5_0, SP_TYPE_IQ4_NL, SP_TYPE_Q6_K};
    int64_t tok = 256;
    int nargs = 0;
    char *args[32];
    args[nargs++] = argv[0];
    for (int i = 1; i < argc && nargs < 32; i++) {
        if (atoi(argv[i]) > 0)
            tok = atoi(argv[i]);
        else
            args[nargs++] = argv[i];
    }
    if (sp_cpu_kernels_for(SP_CPU_AVX2) == NULL) {
        printf("skipped: no AVX2 on this CPU\n");
        return 0;
    }
    /* AVX2 with its A/B against the previous kernels, then the AVX-512 table where the CPU
     * has one (which level's gemm is faster for a type decides what the AVX-512 table keeps) */
    static const int64_t widths[] = {2048, 5632};
    for (int lv = SP_CPU_AVX2; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        for (size_t wi = 0; k != NULL && wi < 2; wi++)
            for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
                if (qbench_selected(nargs, args, k->name, sp_type_name(types[ti])))
                    bench(k, types[ti], widths[wi], tok);
        /* after AVX2, its AVX-VNNI table where the CPU has one: the types whose packed gemm
         * it changes (Q8_0, Q4_0), each against the AVX2 table's */
        const sp_cpu_kernels_t *v = lv == SP_CPU_AVX2 ? sp_cpu_kernels_avx2_vnni() : NULL;
        for (size_t wi = 0; v != NULL && wi < 2; wi++)
            for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
                if (v->repack_gemm[types[ti]] != k->repack_gemm[types[ti]] &&
                    qbench_selected(nargs, args, v->name, sp_type_name(types[ti])))
                    bench(v, types[ti], widths[wi], tok);
    }
    return 0;
}
