/*
 * gpu_bench.c - end-to-end checks and timings of the GPU path (bench/gpu/run.sh).
 *
 *     gpu_bench check MODEL.gguf [N]   greedy N tokens (default 200) from BOS on the CPU and
 *                                      on the GPU; PASS when the GPU's tokens equal the CPU's
 *     gpu_bench graphs MODEL.gguf [N]  greedy N tokens (default 64) on the GPU with decode
 *                                      graphs off, then on; PASS when the tokens are the same
 *                                      and the last logits within 1e-3 of their range
 *     gpu_bench perf MODEL.gguf [LABEL] [BATCHES]
 *                                      decode at each batch of BATCHES (default 1,8,64) and
 *                                      prefill 512 on the GPU, the device copy bandwidth and
 *                                      each decode's share of it; one line per batch starts
 *                                      with "RESULT" (for run.sh's table)
 *     gpu_bench decode MODEL.gguf [LABEL] [BATCHES]
 *                                      greedy decode at each batch with the token taken on the
 *                                      host each step, as a server does, in three batches of
 *                                      one process: pageable copies and whole logits rows (as
 *                                      before pinned memory), pinned copies and whole rows,
 *                                      pinned copies and candidates (topk on the device, k = 1);
 *                                      RESULT lines labelled LABEL-pageable-rows, -pinned-rows,
 *                                      -pinned-cand; PASS when the three give the same tokens
 *
 * $SAMPAN_CUDA_WEIGHTS (f16, native, both) and $SAMPAN_CUDA_GRAPHS (0, 1) choose what is
 * measured (docs/cuda.md); `decode` sets $SAMPAN_CUDA_PINNED and $SAMPAN_CUDA_CANDIDATES
 * itself for each of its batches. The library is sp_loader_api()'s ($SAMPAN_CUDA_LIB or
 * libsampan_cuda.so next to this program), so the same program runs on the host emulation
 * in CI (tests/py/test_cuda.py runs every subcommand there).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gpu.h"
#include "engine/batch.h"
#include "engine/model.h"
#include "text/tokenizer.h"
#include "sampan/log.h"

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int32_t
argmax(const float *x, int64_t n)
{
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[b]) {
            b = (int32_t)i;
        }
    }
    return b;
}

static sp_model_t *
load(const char *path, bool gpu)
{
    char err[512];
    sp_model_t *m;
    if (sp_model_load(path, &m, err, sizeof err) != SP_OK) {
        printf("FAIL load %s: %s\n", path, err);
        return NULL;
    }
    if (gpu && sp_gpu_attach(m, NULL, 0, -1, err, sizeof err) != SP_OK) {
        printf("FAIL gpu attach: %s\n", err);
        sp_model_free(m);
        return NULL;
    }
    return m;
}

static int greedy_last(sp_model_t *m, int n, int32_t *out, float *last);

static int
greedy(sp_model_t *m, int n, int32_t *out)
{
    return greedy_last(m, n, out, NULL);
}

/* Greedy n tokens from BOS; the logits of the last step into last when given. */
static int
greedy_last(sp_model_t *m, int n, int32_t *out, float *last)
{
    sp_ctx_params_t p = sp_ctx_default_params();
    p.n_ctx = n + 8;
    sp_ctx_t *c;
    char err[256];
    if (sp_ctx_create(m, &p, &c, err, sizeof err) != SP_OK) {
        printf("FAIL ctx: %s\n", err);
        return -1;
    }
    int32_t tok = sp_tokenizer_bos(sp_model_tokenizer(m));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    int k = 0;
    for (; k < n; k++) {
        if (sp_ctx_eval(c, &tok, 1, k) != SP_OK) {
            printf("FAIL eval at %d\n", k);
            break;
        }
        tok = out[k] = argmax(sp_ctx_logits(c), V);
        if (last != NULL && k == n - 1) {
            memcpy(last, sp_ctx_logits(c), (size_t)V * sizeof(float));
        }
    }
    sp_ctx_destroy(c);
    return k;
}

static int
cmd_check(const char *path, int n)
{
    int32_t *a = calloc((size_t)n, 4), *b = calloc((size_t)n, 4);
    sp_model_t *cpu = load(path, false), *gpu = load(path, true);
    if (!cpu || !gpu) {
        return 1;
    }
    const double t0 = now_s();
    const int na = greedy(cpu, n, a);
    const double t1 = now_s();
    const int nb = greedy(gpu, n, b);
    const double t2 = now_s();
    int same = 0;
    while (same < n && same < na && same < nb && a[same] == b[same]) {
        same++;
    }
    char text[8192];
    size_t len = 0;
    for (int i = 0; i < nb && len + 64 < sizeof text; i++) {
        int32_t k = sp_tokenizer_piece(sp_model_tokenizer(gpu), b[i], false, text + len,
                                       sizeof text - len - 1);
        len += k > 0 ? (size_t)k : 0;
    }
    text[len] = '\0';
    printf("gpu greedy text: %.300s%s\n", text, len > 300 ? "..." : "");
    printf("cpu %.1f tok/s, gpu %.1f tok/s (single sequence, one token per step)\n",
           na / (t1 - t0), nb / (t2 - t1));
    printf("%s greedy %s: GPU tokens equal the CPU's for %d of %d\n",
           same == n ? "PASS" : "FAIL", path, same, n);
    sp_model_free(cpu);
    sp_model_free(gpu);
    free(a);
    free(b);
    return same == n ? 0 : 1;
}

static int
cmd_graphs(const char *path, int n)
{
    sp_model_t *gpu = load(path, true);
    if (gpu == NULL) {
        return 1;
    }
    const int64_t V = sp_model_hparams(gpu)->n_vocab;
    int32_t *a = calloc((size_t)n, 4), *b = calloc((size_t)n, 4);
    float *la = calloc((size_t)V, 4), *lb = calloc((size_t)V, 4);
    double t[2];
    int got[2];
    for (int on = 0; on <= 1; on++) {
        setenv("SAMPAN_CUDA_GRAPHS", on ? "1" : "0", 1);
        const double t0 = now_s();
        got[on] = greedy_last(gpu, n, on ? b : a, on ? lb : la);
        t[on] = now_s() - t0;
    }
    int same = 0;
    while (same < n && same < got[0] && same < got[1] && a[same] == b[same]) {
        same++;
    }
    double md = 0, mx = 1e-30;
    for (int64_t i = 0; i < V; i++) {
        md = fmax(md, fabs((double)la[i] - lb[i]));
        mx = fmax(mx, fabs((double)la[i]));
    }
    printf("graphs off %.1f tok/s, on %.1f tok/s (one sequence, including the first steps)\n",
           got[0] / t[0], got[1] / t[1]);
    const bool ok = same == n && md / mx <= 1e-3;
    printf("%s graphs %s: tokens equal with graphs on and off for %d of %d, last logits differ "
           "by %.2e of their range\n", ok ? "PASS" : "FAIL", path, same, n, md / mx);
    sp_model_free(gpu);
    free(a);
    free(b);
    free(la);
    free(lb);
    return ok ? 0 : 1;
}

/* ------------------------------------------------------------- perf */

typedef struct bench {
    sp_model_t *m;
    sp_kv_pool_t *kv;
    sp_batch_t *b;
    int32_t *blocks; /* per sequence, per_seq blocks */
    int64_t per_seq;
    int64_t V;
} bench_t;

static int
step(bench_t *B, int n_seqs, int64_t n_tok, int64_t pos, const int32_t *tokens)
{
    sp_batch_seq_t s[64];
    for (int i = 0; i < n_seqs; i++) {
        s[i] = (sp_batch_seq_t){tokens + i * n_tok, n_tok, pos, B->blocks + i * B->per_seq,
                                B->per_seq, true, 0, NULL};
    }
    return sp_batch_eval(B->b, B->kv, s, n_seqs);
}

/* Device copy bandwidth (read + write bytes per second) of 1 GiB D2D copies. */
static double
copy_bandwidth(void)
{
    const sp_cuda_api_t *api = sp_loader_api();
    sp_cuda_ctx_t *c;
    char err[256];
    double bw = 0;
    if (api->ctx_create(0, &c, err, sizeof err) != SP_OK) {
        return 0;
    }
    size_t bytes = (size_t)1 << 30;
    if (strcmp(api->name, "fake") == 0) {
        bytes = (size_t)1 << 24; /* the host emulation: a token size */
    }
    void *a = NULL, *b2 = NULL;
    if (api->alloc(c, bytes, &a) == SP_OK && api->alloc(c, bytes, &b2) == SP_OK &&
        api->d2d(c, b2, a, bytes) == SP_OK && api->sync(c) == SP_OK) {
        const double t0 = now_s();
        int ok = 1;
        for (int i = 0; i < 10; i++) {
            ok &= api->d2d(c, i % 2 ? a : b2, i % 2 ? b2 : a, bytes) == SP_OK;
        }
        ok &= api->sync(c) == SP_OK;
        bw = ok ? 2.0 * 10 * (double)bytes / (now_s() - t0) : 0;
    }
    api->ctx_destroy(c);
    return bw;
}

/* "1,8,64" into b[] (at most 8 values in 1..64); the count, or -1 after saying so for cmd. */
static int
parse_batches(const char *cmd, const char *list, int *b)
{
    int n = 0;
    const char *s = list;
    while (*s) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 64 || n == 8 || (*end != ',' && *end != '\0')) {
            n = 0;
            break;
        }
        b[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "gpu_bench %s: batches '%s' is not a list like 1,8,64 (each 1..64)\n",
                cmd, list);
        return -1;
    }
    return n;
}

static int
cmd_perf(const char *path, const char *label, const char *batch_list)
{
    int batches[8];
    const int n_batches = parse_batches("perf", batch_list, batches);
    if (n_batches < 0) {
        return 2;
    }
    sp_model_t *m = load(path, true);
    if (m == NULL) {
        return 1;
    }
    const char *graphs = getenv("SAMPAN_CUDA_GRAPHS");
    graphs = graphs && (!strcmp(graphs, "0") || !strcmp(graphs, "off") ||
                        !strcmp(graphs, "false")) ? "off" : "on";
    const char *weights = sp_gpu_model_weights(m);
    printf("perf %s: weights %s, graphs %s, device %.0f MiB\n", label, weights, graphs,
           (double)sp_gpu_model_device_bytes(m) / 1048576.0);
    const sp_hparams_t *hp = sp_model_hparams(m);
    const int64_t ctx = 1024, per_seq = ctx / SP_KV_BLOCK;
    bench_t B = {m, NULL, NULL, NULL, per_seq, hp->n_vocab};
    char err[256];
    sp_kv_pool_params_t kp = {64 * per_seq, SP_KV_TYPE_F16};
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_tokens = 512;
    bp.max_seqs = 64;
    bp.max_ctx = ctx;
    if (sp_kv_pool_create(m, &kp, &B.kv, err, sizeof err) != SP_OK ||
        sp_batch_create(m, &bp, &B.b, err, sizeof err) != SP_OK) {
        printf("FAIL perf setup: %s\n", err);
        return 1;
    }
    B.blocks = malloc((size_t)(64 * per_seq) * 4);
    for (int64_t i = 0; i < 64 * per_seq; i++) {
        B.blocks[i] = (int32_t)i;
    }
    int32_t *tok = malloc(64 * 512 * 4);
    for (int i = 0; i < 64 * 512; i++) {
        tok[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    }
    const bool fake = strcmp(sp_loader_api()->name, "fake") == 0;
    const int64_t n_pre = fake ? 16 : 512; /* the emulation: sizes that only check the code */
    int rc = 0;
    /* Prefill one sequence (warm-up first). */
    if (step(&B, 1, n_pre, 0, tok) != SP_OK) {
        printf("FAIL prefill\n");
        return 1;
    }
    double t0 = now_s();
    const int reps = 3;
    for (int r = 0; r < reps; r++) {
        rc |= step(&B, 1, n_pre, 0, tok) != SP_OK;
    }
    const double pre = (now_s() - t0) / reps;
    printf("prefill %lld: %.2f ms, %.0f tok/s\n", (long long)n_pre, pre * 1e3,
           (double)n_pre / pre);

    /* Every sequence (its own range of blocks) gets 128 positions of context,
     * then timed decode. */
    const int64_t fill = fake ? 8 : 128;
    int max_b = 1;
    for (int k = 0; k < n_batches; k++) {
        max_b = batches[k] > max_b ? batches[k] : max_b;
    }
    for (int i = 0; i < max_b && rc == 0; i++) {
        sp_batch_seq_t s = {tok + i * fill, fill, 0, B.blocks + i * per_seq, per_seq, false, 0,
                            NULL};
        rc |= sp_batch_eval(B.b, B.kv, &s, 1) != SP_OK;
    }
    const double bw = copy_bandwidth();
    printf("device copy bandwidth (D2D, read+write): %.0f GB/s\n", bw / 1e9);
    double tps1 = 0, tps_max = 0, share1 = 0;
    int b_max = 0;
    int64_t pos = fill;
    for (int k = 0; k < n_batches && rc == 0; k++) {
        const int nb = batches[k], steps = fake ? 4 : 48;
        for (int w = 0; w < 4; w++) { /* warm-up: the graph of the bucket is captured here */
            rc |= step(&B, nb, 1, pos++, tok) != SP_OK;
        }
        t0 = now_s();
        for (int sidx = 0; sidx < steps; sidx++) {
            rc |= step(&B, nb, 1, pos++, tok) != SP_OK;
        }
        const double dt = (now_s() - t0) / steps;
        const double tps = nb / dt;
        /* Weight bytes the step reads (quantised where gemv_q runs), per second. */
        const double wb = (double)sp_gpu_model_step_bytes(m, nb);
        const double share = bw > 0 ? wb / dt / bw : 0;
        if (nb == 1) {
            tps1 = tps;
            share1 = share;
        }
        if (nb > b_max) {
            b_max = nb;
            tps_max = tps;
        }
        printf("decode batch %2d: %.3f ms/step, %.0f tok/s, weights %.2f GB/step read at %.0f "
               "GB/s = %.0f%% of the copy bandwidth\n", nb, dt * 1e3, tps, wb / 1e9,
               wb / dt / 1e9, 100 * share);
        printf("RESULT label=%s weights=%s graphs=%s batch=%d ms_step=%.3f tok_s=%.0f share=%.0f\n",
               label, weights, graphs, nb, dt * 1e3, tps, 100 * share);
    }
    if (rc != 0) {
        printf("FAIL perf: a step failed\n");
        return 1;
    }
    if (fake) {
        printf("(targets are not judged on the host emulation)\n");
    } else if (tps1 > 0) {
        printf("%s decode batch 1 within 70%% of the bandwidth limit (target): %.0f%%\n",
               bw > 0 && share1 >= 0.7 ? "PASS" : "FAIL", 100 * share1);
    }
    if (!fake && tps1 > 0 && b_max >= 64) {
        printf("%s batched decode scaling: batch %d gives %.1fx batch 1 (near-linear target >= "
               "32x)\n", tps_max / tps1 >= 32 ? "PASS" : "FAIL", b_max, tps_max / tps1);
    }
    sp_batch_destroy(B.b);
    sp_kv_pool_destroy(B.kv);
    sp_model_free(m);
    free(B.blocks);
    free(tok);
    return 0;
}

/* ----------------------------------------------------------- decode */

/* One configuration of cmd_decode: a pool and a batch created under the
 * current environment, every sequence filled with `fill` positions, then
 * greedy decode at each batch size; the tokens of each batch size's last
 * step into last_tok (64 per size). */
static int
decode_cfg(sp_model_t *m, const char *label, const int *batches, int n_batches, int32_t *last_tok,
           double bw)
{
    const sp_hparams_t *hp = sp_model_hparams(m);
    const bool fake = strcmp(sp_loader_api()->name, "fake") == 0;
    const int64_t ctx = fake ? 128 : 1024, per_seq = ctx / SP_KV_BLOCK;
    const int64_t fill = fake ? 8 : 128;
    bench_t B = {m, NULL, NULL, NULL, per_seq, hp->n_vocab};
    char err[256];
    sp_kv_pool_params_t kp = {64 * per_seq, SP_KV_TYPE_F16};
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_tokens = 512;
    bp.max_seqs = 64;
    bp.max_ctx = ctx;
    if (sp_kv_pool_create(m, &kp, &B.kv, err, sizeof err) != SP_OK ||
        sp_batch_create(m, &bp, &B.b, err, sizeof err) != SP_OK) {
        printf("FAIL decode setup (%s): %s\n", label, err);
        sp_kv_pool_destroy(B.kv);
        return 1;
    }
    printf("decode %s: %.1f MiB of host memory pinned\n", label,
           (double)sp_gpu_model_pinned_bytes(m) / 1048576.0);
    B.blocks = malloc((size_t)(64 * per_seq) * 4);
    int32_t *tok = malloc(64 * 512 * 4), next[64], cand_k[64];
    int rc = B.blocks == NULL || tok == NULL;
    for (int64_t i = 0; rc == 0 && i < 64 * per_seq; i++) {
        B.blocks[i] = (int32_t)i;
    }
    for (int i = 0; rc == 0 && i < 64 * 512; i++) {
        tok[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    }
    for (int i = 0; i < 64; i++) {
        cand_k[i] = 1; /* greedy */
        next[i] = 0;   /* compared for all 64, set for the first nb */
    }
    const char *graphs = getenv("SAMPAN_CUDA_GRAPHS");
    graphs = graphs && !strcmp(graphs, "0") ? "off" : "on";
    for (int k = 0; k < n_batches && rc == 0; k++) {
        const int nb = batches[k], steps = fake ? 4 : 48;
        /* Fresh context for every size: fill, then decode from the same state. */
        for (int i = 0; i < nb && rc == 0; i++) {
            sp_batch_seq_t s = {tok + i * fill, fill, 0, B.blocks + i * per_seq, per_seq, true, 0,
                                NULL};
            rc |= sp_batch_eval(B.b, B.kv, &s, 1) != SP_OK;
            next[i] = argmax(sp_batch_logits(B.b, 0), B.V);
        }
        int64_t pos = fill;
        double t0 = 0;
        for (int st = 0; st < 4 + steps && rc == 0; st++, pos++) {
            if (st == 4) { /* after the warm-up (the bucket's graph is captured there) */
                t0 = now_s();
            }
            sp_batch_seq_t s[64];
            for (int i = 0; i < nb; i++) {
                s[i] = (sp_batch_seq_t){&next[i], 1, pos, B.blocks + i * per_seq, per_seq, true, 0,
                                        NULL};
            }
            rc |= sp_batch_eval_cand(B.b, B.kv, s, nb, cand_k) != SP_OK;
            for (int i = 0; i < nb && rc == 0; i++) {
                const int32_t *ids;
                const float *vals;
                /* The host's part of greedy sampling: the first candidate, or a
                 * scan of the whole row. */
                next[i] = sp_batch_candidates(B.b, i, &ids, &vals) > 0
                              ? ids[0]
                              : argmax(sp_batch_logits(B.b, i), B.V);
            }
        }
        const double dt = (now_s() - t0) / steps;
        const double wb = (double)sp_gpu_model_step_bytes(m, nb);
        const double share = bw > 0 ? wb / dt / bw : 0;
        memcpy(last_tok + k * 64, next, sizeof next);
        if (rc == 0) {
            printf("decode %s batch %2d: %.3f ms/step, %.0f tok/s (greedy, token on the host)\n",
                   label, nb, dt * 1e3, nb / dt);
            printf("RESULT label=%s weights=%s graphs=%s batch=%d ms_step=%.3f tok_s=%.0f "
                   "share=%.0f\n", label, sp_gpu_model_weights(m), graphs, nb, dt * 1e3, nb / dt,
                   100 * share);
        }
    }
    sp_batch_destroy(B.b);
    sp_kv_pool_destroy(B.kv);
    free(B.blocks);
    free(tok);
    if (rc != 0) {
        printf("FAIL decode %s: a step failed\n", label);
    }
    return rc;
}

static int
cmd_decode(const char *path, const char *label, const char *batch_list)
{
    int batches[8];
    const int n_batches = parse_batches("decode", batch_list, batches);
    if (n_batches < 0) {
        return 2;
    }
    sp_model_t *m = load(path, true);
    if (m == NULL) {
        return 1;
    }
    const double bw = copy_bandwidth();
    static const struct { const char *name, *pinned, *cand; } cfgs[] = {
        {"pageable-rows", "0", "0"}, {"pinned-rows", "1", "0"}, {"pinned-cand", "1", "1"}};
    static int32_t toks[3][8 * 64];
    int rc = 0;
    for (int c = 0; c < 3; c++) {
        char name[160];
        snprintf(name, sizeof name, "%s-%s", label, cfgs[c].name);
        setenv("SAMPAN_CUDA_PINNED", cfgs[c].pinned, 1);
        setenv("SAMPAN_CUDA_CANDIDATES", cfgs[c].cand, 1);
        rc |= decode_cfg(m, name, batches, n_batches, toks[c], bw);
    }
    unsetenv("SAMPAN_CUDA_PINNED");
    unsetenv("SAMPAN_CUDA_CANDIDATES");
    const bool same = rc == 0 && memcmp(toks[0], toks[1], sizeof toks[0]) == 0 &&
                      memcmp(toks[0], toks[2], sizeof toks[0]) == 0;
    printf("%s decode %s: the same greedy tokens with pageable rows, pinned rows and "
           "candidates\n", same ? "PASS" : "FAIL", path);
    sp_model_free(m);
    return same ? 0 : 1;
}

int
main(int argc, char **argv)
{
    sp_log_set_level(SP_LOG_LEVEL_WARN);
    if (argc < 3) {
        fprintf(stderr, "usage: gpu_bench check MODEL.gguf [N] | graphs MODEL.gguf [N] | "
                        "perf MODEL.gguf [LABEL] [BATCHES] | decode MODEL.gguf [LABEL] "
                        "[BATCHES]\n");
        return 2;
    }
    if (sp_loader_api() == NULL) {
        printf("SKIP gpu_bench: %s\n", sp_loader_note());
        return 0;
    }
    if (strcmp(argv[1], "check") == 0) {
        return cmd_check(argv[2], argc > 3 ? atoi(argv[3]) : 200);
    }
    if (strcmp(argv[1], "graphs") == 0) {
        return cmd_graphs(argv[2], argc > 3 ? atoi(argv[3]) : 64);
    }
    if (strcmp(argv[1], "perf") == 0) {
        return cmd_perf(argv[2], argc > 3 ? argv[3] : "default", argc > 4 ? argv[4] : "1,8,64");
    }
    if (strcmp(argv[1], "decode") == 0) {
        return cmd_decode(argv[2], argc > 3 ? argv[3] : "decode", argc > 4 ? argv[4] : "1,8,64");
    }
    fprintf(stderr, "gpu_bench: unknown command %s\n", argv[1]);
    return 2;
}
