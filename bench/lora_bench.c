/*
 * lora_bench.c - the decode cost of LoRA adapters (engine/lora.h) in
 * sp_batch_eval: the same decode steps without an adapter, with one adapter
 * on every sequence, and with half the sequences on it (a mixed batch).
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc -D_GNU_SOURCE -pthread bench/lora_bench.c build/libsampan.a \
 *      -lpcre2-8 -lm -o build/lora_bench
 *   ./build/lora_bench MODEL.gguf ADAPTER.gguf [threads [steps [n_seqs...]]]
 *       (default 2 threads, 32 decode steps, 1 and 8 sequences)
 *
 * Each sequence count: a 32-token prompt prefilled per sequence, then
 * `steps` greedy decode steps of all sequences together, for each mode in
 * turn, best of 9 rounds of process CPU time (run it with 1 thread: with
 * more, spinning pool workers count too) (the modes alternate inside a round so that a noisy
 * neighbour hits them alike). Not a test: nothing here asserts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "engine/batch.h"
#include "engine/lora.h"
#include "engine/model.h"

#define MAX_SEQS 64
#define PROMPT 32
#define ROUNDS 9

/* Process CPU time: on a shared machine a preempted step costs wall time but
 * not CPU time; with 1 thread (no spinning workers) it is the step's work. */
static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int
main(int argc, char **argv)
{
    char err[512];
    if (argc < 3) {
        fprintf(stderr, "usage: lora_bench MODEL.gguf ADAPTER.gguf [threads [steps [n_seqs...]]]\n");
        return 2;
    }
    const int threads = argc > 3 ? atoi(argv[3]) : 2;
    const int64_t steps = argc > 4 ? atoll(argv[4]) : 32;
    int n_list[8] = {1, 8}, n_n = 2;
    if (argc > 5) {
        n_n = 0;
        for (int i = 5; i < argc && n_n < 8; i++) n_list[n_n++] = atoi(argv[i]);
    }
    if (threads < 1 || steps < 1 || steps > 512) {
        fprintf(stderr, "lora_bench: bad arguments\n");
        return 2;
    }
    sp_model_t *m;
    sp_lora_t *l;
    if (sp_model_load(argv[1], &m, err, sizeof err) != SP_OK ||
        sp_lora_load(m, argv[2], &l, err, sizeof err) != SP_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    sp_lora_info_t info;
    sp_lora_get_info(l, &info);
    const int64_t V = sp_model_hparams(m)->n_vocab;
    const int64_t len = PROMPT + 5 * 3 * steps + 1;
    const int64_t per_seq = (len + SP_KV_BLOCK - 1) / SP_KV_BLOCK;
    printf("model %s, adapter %s (rank %lld, %lld projections), %d threads, %lld decode steps, "
           "best of 9\n", argv[1], argv[2], (long long)info.rank_max, (long long)info.n_pairs,
           threads, (long long)steps);
    for (int ni = 0; ni < n_n; ni++) {
        const int N = n_list[ni];
        if (N < 1 || N > MAX_SEQS) continue;
        sp_kv_pool_params_t kp;
        memset(&kp, 0, sizeof kp);
        kp.n_blocks = (int64_t)N * per_seq;
        sp_kv_pool_t *kv;
        sp_batch_params_t bp = sp_batch_default_params();
        bp.max_tokens = PROMPT * N;
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
        int32_t toks[PROMPT];
        for (int64_t i = 0; i < N * per_seq; i++) blocks[i] = (int32_t)i;
        srand(7);
        for (int i = 0; i < PROMPT; i++) toks[i] = (int32_t)(1 + rand() % (V - 1));
        sp_batch_seq_t seqs[MAX_SEQS];
        for (int s = 0; s < N; s++) {
            seqs[s] = (sp_batch_seq_t){toks, PROMPT, 0, blocks + s * per_seq, per_seq, true, 0, NULL};
        }
        if (sp_batch_eval(b, kv, seqs, N) != SP_OK) return 1;
        int32_t next = 3;
        int64_t pos = PROMPT;
        double best[3] = {1e30, 1e30, 1e30}; /* none, all, half */
        for (int round = 0; round < ROUNDS; round++) {
            for (int mode = 0; mode < 3; mode++) {
                const double t0 = now_s();
                for (int64_t st = 0; st < steps; st++, pos++) {
                    for (int s = 0; s < N; s++) {
                        const sp_lora_t *use = mode == 1 || (mode == 2 && s % 2 == 0) ? l : NULL;
                        seqs[s] = (sp_batch_seq_t){&next, 1, pos, blocks + s * per_seq, per_seq,
                                                   true, 0, use};
                    }
                    if (sp_batch_eval(b, kv, seqs, N) != SP_OK) {
                        fprintf(stderr, "step failed\n");
                        return 1;
                    }
                }
                const double dt = now_s() - t0;
                best[mode] = dt < best[mode] ? dt : best[mode];
            }
            pos = PROMPT; /* positions are reused: the timing does not depend on the tokens */
        }
        const double base = best[0] / (double)steps * 1e3;
        printf("  %2d seqs: no adapter %.3f ms CPU/step; adapter on all %.3f ms CPU/step (%+.1f%%); "
               "on half %.3f ms CPU/step (%+.1f%%)\n", N, base, best[1] / (double)steps * 1e3,
               (best[1] / best[0] - 1) * 100, best[2] / (double)steps * 1e3,
               (best[2] / best[0] - 1) * 100);
        fflush(stdout);
        sp_free(blocks);
        sp_batch_destroy(b);
        sp_kv_pool_destroy(kv);
    }
    sp_lora_release(l);
    sp_model_free(m);
    return 0;
}
