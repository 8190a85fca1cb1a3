/*
 * step_bench.c - whole decode steps of a real model against a plain read of the weight bytes
 * the step streams, paired step by step in one process.
 *
 *   make BUILD=build build/step_bench
 *   ./build/step_bench -m MODEL [--prompt P] [--gen G] [-t T] [--kv-type f32|f16|q8_0] [--json]
 *   SAMPAN_CPU=avx2 ./build/step_bench ...        (a lower level)
 *
 * Why: the decode target is a share of the memory read limit, and on a shared host
 * the read moves 30-60% from one minute to the next (BENCHMARKS.md), so a decode rate taken
 * in one minute and a read taken in another do not make a share. Here every decode step
 * (sp_ctx_eval of one token after a P-token prompt, greedy) is paired with a read of the
 * same weight bytes a few milliseconds before or after it (the order alternates): the same
 * number of threads, the matrices in decode order (gemma4's per-layer-input projection, then
 * per layer q/k/v, o, gate/up, down and gemma4's per-layer input gate and projection, then
 * the output matrix), each job split into the engine's work items (sp_mm_split_t) and summed
 * as 64-bit integers (read_sum.h: the plain read of bench/membw.c and decode_bench.c). The
 * packed copy where the model was repacked at load, the file's rows elsewhere.
 *
 * Printed: the bytes of one read, the median step and read times, and the share = read time
 * / step time per pair (its median and the 10th and 90th percentiles): 100% = the step
 * streams its weights as fast as a plain read; below that, the time the step spends on
 * anything else (attention over the cache, activation conversion, norms, the pool's waits,
 * the logits) or streams more slowly than the read. The cache the attention reads (grows
 * with P) is not in the read: it is part of what the share charges to the step. A second
 * share counts it as read too: (weights + the step's cache bytes) at the pair's read rate /
 * step time, the step's bytes against the read bandwidth, for long contexts where the cache
 * is a few percent of the bytes (sp_kv_block_bytes a block of 16 positions; the sliding
 * layers' part over their window). --json: the same as one JSON object (bench/run.sh keeps
 * it beside each type's runs, bench/report.py prints it in the table).
 *
 * Dense models only (no experts, no latent attention, no encoder). Between a step and a
 * read the process sleeps 5 ms so that the other pool's workers (they spin up to 2 ms after
 * a job, core/pool.c) are asleep. Not a test: nothing here asserts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "read_sum.h"
#include "core/alloc.h"
#include "core/pool.h"
#include "core/timer.h"
#include "engine/batch.h"
#include "engine/model.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"
#include "gguf/gguf.h"

/* One matrix as a product reads it. */
typedef struct mat {
    const uint8_t *base; /* packed groups or rows */
    size_t unit_bytes;   /* bytes of one packed group or one row */
    int64_t unit_rows;   /* rows per unit */
    int64_t rows;
} mat_t;

/* One read job: up to three matrices sharing an input, as batch.c's matmul. */
typedef struct job {
    mat_t w[SP_MM_SPLIT_MAX_W];
    int n_w;
    sp_mm_split_t split;
    uint64_t sink[64];
} job_t;

static void
job_run(void *arg, int64_t item, int ith)
{
    job_t *j = arg;
    int wi;
    int64_t r0, r1, t0, t1; /* one token: t0, t1 = 0, 1 */
    sp__mm_split_item(&j->split, item, &wi, &r0, &r1, &t0, &t1);
    const mat_t *w = &j->w[wi];
    j->sink[ith] += sp_read_rows(w->base, w->unit_bytes, w->unit_rows, r0, r1) & 1;
}

static int
add_mat(job_t *j, const sp_weight_t *w)
{
    if (w->data == NULL || w->n_out <= 0) {
        return 0;
    }
    mat_t *m = &j->w[j->n_w++];
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    m->rows = w->n_out;
    if (w->packed != NULL) {
        m->base = w->packed;
        m->unit_bytes = w->packed_stride;
        m->unit_rows = sp_repack_layout_rows(k->repack_layout[w->type]);
    } else {
        m->base = w->data;
        m->unit_bytes = w->row_bytes;
        m->unit_rows = 1;
    }
    return m->unit_rows > 0 ? 0 : -1;
}

static void
nap_ms(int ms)
{
    struct timespec ts = {0, (long)ms * 1000000};
    nanosleep(&ts, NULL);
}

static int
cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double
pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* Bytes of the cache a decode step at n_kv positions reads: every layer's keys and values of
 * its blocks (the last one whole: the kernels read its unused lanes and ignore them), the
 * sliding layers' over their window only (which may straddle one more block). */
static double
cache_bytes(const sp_model_t *m, sp_kv_type_t type, int64_t n_kv)
{
    const sp_hparams_t *hp = sp_model_hparams(m);
    const double blk = (double)sp_kv_block_bytes(m, type);
    const double swa = (double)sp_kv_swa_block_bytes(m, type);
    const int64_t nb = (n_kv + SP_KV_BLOCK - 1) / SP_KV_BLOCK;
    int64_t nb_swa = nb;
    if (swa > 0 && hp->n_swa > 0 && n_kv > hp->n_swa) {
        nb_swa = (hp->n_swa + SP_KV_BLOCK - 1) / SP_KV_BLOCK + 1;
    }
    return (blk - swa) * (double)nb + swa * (double)nb_swa;
}

int
main(int argc, char **argv)
{
    const char *path = NULL, *kv = "f32";
    int64_t n_prompt = 512, n_gen = 64, n_threads = 2;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            path = argv[++i];
        } else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) {
            n_prompt = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--gen") && i + 1 < argc) {
            n_gen = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            n_threads = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--kv-type") && i + 1 < argc) {
            kv = argv[++i];
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else {
            path = NULL;
            break;
        }
    }
    if (path == NULL || n_prompt < 1 || n_prompt > 65536 || n_gen < 2 || n_gen > 4096 ||
        n_threads < 1 || n_threads > 64 || sp_kv_type_from_name(kv) < 0) {
        fprintf(stderr, "usage: step_bench -m MODEL [--prompt P (1-65536)] [--gen G (2-4096)] "
                        "[-t T (1-64)] [--kv-type f32|f16|q8_0] [--json]\n");
        return 2;
    }

    char err[512];
    sp_model_t *m = NULL;
    sp_ctx_t *c = NULL;
    sp_pool_t *pool = NULL;
    job_t *jobs = NULL;
    int32_t *toks = NULL;
    double *share = NULL, *share_kv = NULL, *step = NULL, *rd = NULL;
    int rc = 1;
    sp_gguf_set_copy_max(SP_GGUF_COPY_MAX_DEFAULT); /* as the server and `sampan eval` */
    if (sp_model_load(path, &m, err, sizeof err) != SP_OK) {
        fprintf(stderr, "step_bench: %s\n", err);
        return 1;
    }
    const sp_hparams_t *hp = sp_model_hparams(m);
    if (m->layers == NULL || m->moe != NULL || m->mla != NULL) {
        fprintf(stderr, "step_bench: %s: dense decoder models only\n", path);
        goto done;
    }
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = n_prompt + n_gen + 1;
    cp.n_threads = (int)n_threads;
    cp.kv_type = (sp_kv_type_t)sp_kv_type_from_name(kv);
    if (sp_ctx_create(m, &cp, &c, err, sizeof err) != SP_OK) {
        fprintf(stderr, "step_bench: %s\n", err);
        goto done;
    }

    /* The read: the step's matrices in decode order, one job per product. */
    const int64_t n_layer = hp->n_layer;
    /* gemma4's per-layer-input projection, 6 a layer, the output's slots */
    jobs = sp_calloc((size_t)(1 + 6 * (n_layer + 1)), sizeof *jobs);
    toks = sp_malloc(sizeof *toks * (size_t)(n_prompt + n_gen));
    share = sp_malloc(sizeof(double) * (size_t)n_gen);
    share_kv = sp_malloc(sizeof(double) * (size_t)n_gen);
    step = sp_malloc(sizeof(double) * (size_t)n_gen);
    rd = sp_malloc(sizeof(double) * (size_t)n_gen);
    if (jobs == NULL || toks == NULL || share == NULL || share_kv == NULL || step == NULL ||
        rd == NULL || sp_pool_create((int)n_threads, &pool) != SP_OK) {
        fprintf(stderr, "step_bench: out of memory\n");
        goto done;
    }
    int n_jobs = 0;
    size_t bytes = 0;
    for (int64_t il = -1; il <= n_layer; il++) { /* -1: the step's start, n_layer: its end */
        const sp_layer_t *L = il >= 0 && il < n_layer ? &m->layers[il] : NULL;
        const sp_weight_t *first = il < 0 ? &m->pl_model_proj : &m->output;
        const sp_weight_t *groups[6][3] = {
            {L ? &L->wq : first, L ? &L->wk : NULL, L ? &L->wv : NULL},
            {L ? &L->wo : NULL, NULL, NULL},
            {L ? &L->w_gate : NULL, L ? &L->w_up : NULL, NULL},
            {L ? &L->w_down : NULL, NULL, NULL},
            {L ? &L->pl_gate : NULL, NULL, NULL}, /* gemma4's per-layer input: gate, projection */
            {L ? &L->pl_proj : NULL, NULL, NULL},
        };
        for (int g = 0; g < 6; g++) {
            job_t *j = &jobs[n_jobs];
            int64_t rows[SP_MM_SPLIT_MAX_W];
            for (int w = 0; w < 3; w++) {
                if (groups[g][w] != NULL && add_mat(j, groups[g][w]) != 0) {
                    fprintf(stderr, "step_bench: %s: a packed layout of unknown rows\n", path);
                    goto done;
                }
            }
            if (j->n_w == 0) {
                continue;
            }
            for (int w = 0; w < j->n_w; w++) {
                size_t a, b;
                rows[w] = j->w[w].rows;
                sp_read_span(j->w[w].unit_bytes, j->w[w].unit_rows, 0, rows[w], &a, &b);
                bytes += b - a;
            }
            sp__mm_split_init(&j->split, j->n_w, rows, (int)n_threads, 1);
            n_jobs++;
        }
    }

    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n_prompt; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        toks[i] = (int32_t)(s % (uint64_t)hp->n_vocab);
    }
    if (sp_ctx_eval(c, toks, n_prompt, 0) != SP_OK) {
        fprintf(stderr, "step_bench: the prompt failed\n");
        goto done;
    }
    for (int64_t i = 0; i < n_gen; i++) {
        const float *lg = sp_ctx_logits(c);
        int32_t best = 0;
        for (int64_t v = 1; v < hp->n_vocab; v++) {
            best = lg[v] > lg[best] ? (int32_t)v : best;
        }
        toks[n_prompt + i] = best;
        double t_step = 0, t_read = 0;
        for (int half = 0; half < 2; half++) {
            nap_ms(5);
            const int64_t t0 = sp_time_ns();
            if ((half == 0) == (i % 2 == 0)) {
                if (sp_ctx_eval(c, &toks[n_prompt + i], 1, n_prompt + i) != SP_OK) {
                    fprintf(stderr, "step_bench: decode step %lld failed\n", (long long)i);
                    goto done;
                }
                t_step = (double)(sp_time_ns() - t0) / 1e6;
            } else {
                for (int jj = 0; jj < n_jobs; jj++) {
                    sp_pool_run(pool, job_run, &jobs[jj], jobs[jj].split.total);
                }
                t_read = (double)(sp_time_ns() - t0) / 1e6;
            }
        }
        step[i] = t_step;
        rd[i] = t_read;
        share[i] = t_read / t_step;
        const double cache = cache_bytes(m, cp.kv_type, n_prompt + i + 1);
        share_kv[i] = share[i] * (1.0 + cache / (double)bytes);
    }
    uint64_t keep = 0;
    for (int jj = 0; jj < n_jobs; jj++) {
        for (int t = 0; t < 64; t++) {
            keep += jobs[jj].sink[t];
        }
    }
    const double st50 = pct(step, (int)n_gen, 0.5), rd50 = pct(rd, (int)n_gen, 0.5);
    const double sh50 = pct(share, (int)n_gen, 0.5), sh10 = pct(share, (int)n_gen, 0.1),
                 sh90 = pct(share, (int)n_gen, 0.9);
    const double kv50 = pct(share_kv, (int)n_gen, 0.5), kv10 = pct(share_kv, (int)n_gen, 0.1),
                 kv90 = pct(share_kv, (int)n_gen, 0.9);
    const double cache_mid = cache_bytes(m, cp.kv_type, n_prompt + n_gen / 2 + 1);
    if (json) {
        printf("{\"kernels\": \"%s\", \"threads\": %lld, \"kv_type\": \"%s\", \"prompt\": %lld, "
               "\"pairs\": %lld, \"read_bytes\": %zu, \"step_ms_median\": %.3f, "
               "\"read_ms_median\": %.3f, \"share_median\": %.4f, \"share_p10\": %.4f, "
               "\"share_p90\": %.4f, \"cache_bytes_mid\": %.0f, "
               "\"share_with_cache_median\": %.4f, \"share_with_cache_p10\": %.4f, "
               "\"share_with_cache_p90\": %.4f, \"checksum\": %llu}\n",
               sp_ctx_kernels_name(c), (long long)n_threads, kv, (long long)n_prompt,
               (long long)n_gen, bytes, st50, rd50, sh50, sh10, sh90, cache_mid, kv50, kv10,
               kv90, (unsigned long long)(keep & 1));
    } else {
        printf("model %s, kernels %s, %lld threads, KV %s, positions %lld-%lld, %d read jobs "
               "(checksum %llu)\n",
               path, sp_ctx_kernels_name(c), (long long)n_threads, kv, (long long)n_prompt,
               (long long)(n_prompt + n_gen - 1), n_jobs, (unsigned long long)(keep & 1));
        printf("weights read per step %.1f MB; median step %.2f ms (%.1f tok/s), median read "
               "%.2f ms (%.1f GB/s)\n",
               (double)bytes / 1e6, st50, 1e3 / st50, rd50, (double)bytes / rd50 / 1e6);
        printf("share (read / step, per pair): median %.1f%%, p10 %.1f%%, p90 %.1f%% of %lld "
               "pairs\n",
               100 * sh50, 100 * sh10, 100 * sh90, (long long)n_gen);
        printf("with the cache read too (%.1f MB a step at the middle position): median "
               "%.1f%%, p10 %.1f%%, p90 %.1f%%\n",
               cache_mid / 1e6, 100 * kv50, 100 * kv10, 100 * kv90);
    }
    rc = 0;
done:
    sp_free(share);
    sp_free(share_kv);
    sp_free(step);
    sp_free(rd);
    sp_free(toks);
    sp_free(jobs);
    sp_pool_destroy(pool);
    sp_ctx_destroy(c);
    sp_model_free(m);
    return rc;
}
