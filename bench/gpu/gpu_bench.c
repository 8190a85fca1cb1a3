/*
 * gpu_bench.c - end-to-end checks and timings of the GPU path (bench/gpu/run.sh).
 *
 *     gpu_bench check MODEL.gguf [N]   greedy N tokens (default 200) from BOS on the CPU and
 *                                      on the GPU; PASS when the GPU's tokens equal the CPU's
 *     gpu_bench perf MODEL.gguf        decode at batch 1, 8, 64 and prefill 512 on the GPU,
 *                                      device copy bandwidth, and decode's share of it
 *
 * The library is sp_gpu_api()'s ($SAMPAN_CUDA_LIB or libsampan_cuda.so next to this
 * program), so the same program runs on the host emulation in CI.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/gpu.h"
#include "engine/batch.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
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

static int
greedy(sp_model_t *m, int n, int32_t *out)
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
        int32_t k = sp_token_to_piece(sp_model_tokenizer(gpu), b[i], false, text + len,
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

static int
cmd_perf(const char *path)
{
    sp_model_t *m = load(path, true);
    if (m == NULL) {
        return 1;
    }
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
    int rc = 0;
    /* Prefill 512 tokens of one sequence (warm-up first). */
    if (step(&B, 1, 512, 0, tok) != SP_OK) {
        printf("FAIL prefill\n");
        return 1;
    }
    double t0 = now_s();
    const int reps = 3;
    for (int r = 0; r < reps; r++) {
        rc |= step(&B, 1, 512, 0, tok) != SP_OK;
    }
    const double pre = (now_s() - t0) / reps;
    printf("prefill 512: %.2f ms, %.0f tok/s\n", pre * 1e3, 512 / pre);

    /* Every sequence (its own range of blocks) gets 128 positions of context,
     * then timed decode. */
    for (int i = 0; i < 64 && rc == 0; i++) {
        sp_batch_seq_t s = {tok + i * 128, 128, 0, B.blocks + i * per_seq, per_seq, false, 0, NULL};
        rc |= sp_batch_eval(B.b, B.kv, &s, 1) != SP_OK;
    }
    const int batches[] = {1, 8, 64};
    double tps1 = 0, tps[3] = {0};
    for (int k = 0; k < 3 && rc == 0; k++) {
        const int nb = batches[k], steps = 48;
        int64_t pos = 128;
        for (int w = 0; w < 4; w++) {
            rc |= step(&B, nb, 1, pos++, tok) != SP_OK;
        }
        t0 = now_s();
        for (int sidx = 0; sidx < steps; sidx++) {
            rc |= step(&B, nb, 1, pos++, tok) != SP_OK;
        }
        const double dt = (now_s() - t0) / steps;
        tps[k] = nb / dt;
        if (nb == 1) {
            tps1 = tps[k];
        }
        printf("decode batch %2d: %.3f ms/step, %.0f tok/s (%.1fx batch 1)\n", nb, dt * 1e3,
               tps[k], tps[k] / (tps1 > 0 ? tps1 : 1));
    }
    if (rc != 0) {
        printf("FAIL perf: a step failed\n");
        return 1;
    }

    /* Copy bandwidth of the device (read + write bytes per second). */
    const sp_cuda_api_t *api = sp_gpu_api();
    sp_cuda_ctx_t *c;
    double bw = 0;
    if (api->ctx_create(0, &c, err, sizeof err) == SP_OK) {
        const size_t bytes = (size_t)1 << 30;
        void *a = NULL, *b2 = NULL;
        if (api->alloc(c, bytes, &a) == SP_OK && api->alloc(c, bytes, &b2) == SP_OK) {
            api->d2d(c, b2, a, bytes);
            api->sync(c);
            t0 = now_s();
            for (int i = 0; i < 10; i++) {
                api->d2d(c, i % 2 ? a : b2, i % 2 ? b2 : a, bytes);
            }
            api->sync(c);
            bw = 2.0 * 10 * (double)bytes / (now_s() - t0);
        }
        api->ctx_destroy(c);
    }
    const double wbytes = (double)sp_gpu_weight_bytes(m, -1);
    const double need = wbytes * tps1; /* weight bytes read per second at batch 1 */
    printf("device copy bandwidth (D2D, read+write): %.0f GB/s\n", bw / 1e9);
    printf("weights read per token: %.2f GB (F16); batch-1 decode streams %.0f GB/s = %.0f%% of "
           "the copy bandwidth; limit %.0f tok/s\n", wbytes / 1e9, need / 1e9,
           bw > 0 ? 100 * need / bw : 0, bw > 0 ? bw / wbytes : 0);
    printf("%s decode batch 1 within 70%% of the bandwidth limit (target)\n",
           bw > 0 && need / bw >= 0.7 ? "PASS" : "FAIL");
    printf("%s batched decode scaling: batch 64 gives %.1fx batch 1 (near-linear target >= 32x)\n",
           tps[2] / tps1 >= 32 ? "PASS" : "FAIL", tps[2] / tps1);
    sp_batch_destroy(B.b);
    sp_kv_pool_destroy(B.kv);
    sp_model_free(m);
    free(B.blocks);
    free(tok);
    return 0;
}

int
main(int argc, char **argv)
{
    sp_log_set_level(SP_LOG_LEVEL_WARN);
    if (argc < 3) {
        fprintf(stderr, "usage: gpu_bench check|perf MODEL.gguf [N]\n");
        return 2;
    }
    if (sp_gpu_api() == NULL) {
        printf("SKIP gpu_bench: %s\n", sp_gpu_api_note());
        return 0;
    }
    if (strcmp(argv[1], "check") == 0) {
        return cmd_check(argv[2], argc > 3 ? atoi(argv[3]) : 200);
    }
    if (strcmp(argv[1], "perf") == 0) {
        return cmd_perf(argv[2]);
    }
    fprintf(stderr, "gpu_bench: unknown command %s\n", argv[1]);
    return 2;
}
