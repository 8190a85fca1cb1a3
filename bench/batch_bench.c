/*
 * batch_bench.c - decode throughput of many sequences stepping together
 * through sp_batch_eval (one weight read per step for all of them).
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc -D_GNU_SOURCE -pthread bench/batch_bench.c build/libsampan.a \
 *      -lpcre2-8 -lm -o build/batch_bench
 *   ./build/batch_bench MODEL.gguf [threads [prompt [steps [n_seqs...]]]]
 *       (default 2 threads, 64-token prompt, 16 decode steps, 1 8 32 sequences)
 *
 * For each sequence count N: one 64-token prompt is prefilled once and its
 * blocks are copied to the other N - 1 sequences (a shared prefix, as the
 * scheduler's prefix reuse would leave them), then every step decodes one
 * greedy token of each of the N sequences in one sp_batch_eval. Prints wall
 * time per step and aggregate tokens/s, best of 3 runs of `steps` steps.
 * Not a test: nothing here asserts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "engine/batch.h"
#include "engine/model.h"

#define MAX_SEQS 256

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
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    return (int32_t)best;
}

int
main(int argc, char **argv)
{
    char err[512];
    if (argc < 2) {
        fprintf(stderr, "usage: batch_bench MODEL.gguf [threads [prompt [steps [n_seqs...]]]]\n");
        return 2;
    }
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    const int64_t prompt = argc > 3 ? atoll(argv[3]) : 64;
    const int64_t steps = argc > 4 ? atoll(argv[4]) : 16;
    int n_list[16] = {1, 8, 32}, n_n = 3;
    if (argc > 5) {
        n_n = 0;
        for (int i = 5; i < argc && n_n < 16; i++) n_list[n_n++] = atoi(argv[i]);
    }
    if (threads < 1 || prompt < 1 || prompt > 2048 || steps < 1 || steps > 1024) {
        fprintf(stderr, "batch_bench: bad arguments\n");
        return 2;
    }
    sp_model_t *m;
    if (sp_model_load(argv[1], &m, err, sizeof err) != SP_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const int64_t V = sp_model_hparams(m)->n_vocab;
    const int64_t len = prompt + 3 * steps + 1;
    const int64_t per_seq = (len + SP_KV_BLOCK - 1) / SP_KV_BLOCK;
    printf("model %s, %d threads, %lld-token shared prompt, %lld decode steps (best of 3)\n",
           argv[1], threads, (long long)prompt, (long long)steps);
    for (int ni = 0; ni < n_n; ni++) {
        const int N = n_list[ni];
        if (N < 1 || N > MAX_SEQS) continue;
        sp_kv_pool_params_t kp = {(int64_t)N * per_seq, SP_KV_TYPE_F32};
        sp_kv_pool_t *kv;
        sp_batch_params_t bp = sp_batch_default_params();
        bp.max_tokens = prompt > N ? prompt : N;
        bp.max_seqs = N;
        bp.max_ctx = len;
        bp.n_threads = threads;
        sp_batch_t *b;
        if (sp_kv_pool_create(m, &kp, &kv, err, sizeof err) != SP_OK ||
            sp_batch_create(m, &bp, &b, err, sizeof err) != SP_OK) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        int32_t *blocks = sp_malloc((size_t)(N * per_seq) * sizeof(int32_t));
        int32_t *toks = sp_malloc((size_t)prompt * sizeof(int32_t));
        for (int64_t i = 0; i < N * per_seq; i++) blocks[i] = (int32_t)i;
        srand(7);
        for (int64_t i = 0; i < prompt; i++) toks[i] = (int32_t)(1 + rand() % (V - 1));
        sp_batch_seq_t s0 = {toks, prompt, 0, blocks, per_seq, true, 0, NULL};
        double t0 = now_s();
        if (sp_batch_eval(b, kv, &s0, 1) != SP_OK) return 1;
        const double t_prefill = now_s() - t0;
        const int32_t first = argmax(sp_batch_logits(b, 0), V);
        /* The prompt's blocks to every other sequence (whole blocks: the
         * partial last one too, each sequence writes its own copy). */
        for (int s = 1; s < N; s++) {
            for (int64_t k = 0; k * SP_KV_BLOCK < prompt; k++) {
                sp_kv_pool_copy_block(kv, blocks[s * per_seq + k], blocks[k]);
            }
        }
        sp_batch_seq_t seqs[MAX_SEQS];
        int32_t next[MAX_SEQS];
        for (int s = 0; s < N; s++) next[s] = first;
        int64_t pos = prompt;
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            t0 = now_s();
            for (int64_t st = 0; st < steps; st++, pos++) {
                for (int s = 0; s < N; s++) {
                    seqs[s] = (sp_batch_seq_t){&next[s], 1, pos, blocks + s * per_seq, per_seq,
                                               true, 0, NULL};
                }
                if (sp_batch_eval(b, kv, seqs, N) != SP_OK) {
                    fprintf(stderr, "step failed\n");
                    return 1;
                }
                for (int s = 0; s < N; s++) next[s] = argmax(sp_batch_logits(b, s), V);
            }
            const double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        printf("  %3d seqs: prefill %lld tok %.1f ms; decode %.1f ms/step, %.1f tokens/s "
               "aggregate, %.1f tokens/s per sequence\n",
               N, (long long)prompt, t_prefill * 1e3, best / (double)steps * 1e3,
               (double)(N * steps) / best, (double)steps / best);
        fflush(stdout);
        sp_free(blocks);
        sp_free(toks);
        sp_batch_destroy(b);
        sp_kv_pool_destroy(kv);
    }
    sp_model_free(m);
    return 0;
}
