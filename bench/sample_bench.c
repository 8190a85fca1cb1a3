/*
 * sample_bench.c - the scheduler's sampling phase of one step: sp_gen_step
 * (penalties, max, softmax over the vocabulary, the draw, detokenising, stop
 * strings) for N rows of logits, one after the other on one thread (as
 * sched.c did before presample) and spread over a pool of T threads (as
 * presample does). Prints ms per step both ways, alternated round by round
 * so a loaded host disturbs both alike. Not a test: nothing here asserts
 * beyond both ways picking the same tokens.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc -D_GNU_SOURCE -pthread bench/sample_bench.c build/libsampan.a \
 *      -lpcre2-8 -lcrypto -lm -o build/sample_bench
 *   SAMPAN_REPACK=0 ./build/sample_bench MODEL.gguf [rows [threads [steps [top_k]]]]
 *       (default 32 rows, 2 threads, 64 steps, top_k 0; temperature 1 and top_p 1: what
 *       /v1/completions samples with when a request names none of them)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/pool.h"
#include "engine/gen.h"
#include "engine/model.h"

#define MAX_ROWS 256

typedef struct job {
    sp_gen_t **gens;
    const float *logits; /* (rows, n_vocab) */
    float *scratch;      /* (threads, n_vocab) */
    int64_t n_vocab;
    int32_t *tok;
} job_t;

static void
sample_row(void *arg, int64_t i, int ith)
{
    job_t *j = arg;
    float *x = j->scratch + ith * j->n_vocab;
    memcpy(x, j->logits + i * j->n_vocab, (size_t)j->n_vocab * sizeof(float));
    sp_gen_token_t t;
    if (sp_gen_step(j->gens[i], x, &t) != SP_OK) {
        fprintf(stderr, "sample_bench: step failed\n");
        exit(1);
    }
    j->tok[i] = t.token;
}

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
make_gens(const sp_tokenizer_t *tok, int rows, int top_k, sp_gen_t **g)
{
    char err[256];
    for (int i = 0; i < rows; i++) {
        sp_gen_params_t p = sp_gen_default_params();
        p.max_tokens = 1 << 20;
        p.ignore_eos = true;
        p.sampling.temperature = 1.0f;
        p.sampling.top_p = 1.0f;
        p.sampling.top_k = top_k;
        p.sampling.seed = 7 + (uint64_t)i;
        if (sp_gen_create(tok, &p, &g[i], err, sizeof err) != SP_OK) {
            fprintf(stderr, "sample_bench: %s\n", err);
            exit(1);
        }
    }
}

int
main(int argc, char **argv)
{
    char err[512];
    if (argc < 2) {
        fprintf(stderr, "usage: sample_bench MODEL.gguf [rows [threads [steps [top_k]]]]\n");
        return 2;
    }
    const int rows = argc > 2 ? atoi(argv[2]) : 32;
    const int threads = argc > 3 ? atoi(argv[3]) : 2;
    const int steps = argc > 4 ? atoi(argv[4]) : 64;
    const int top_k = argc > 5 ? atoi(argv[5]) : 0;
    if (rows < 1 || rows > MAX_ROWS || threads < 1 || steps < 1) {
        fprintf(stderr, "sample_bench: rows 1..%d, threads >= 1, steps >= 1\n", MAX_ROWS);
        return 2;
    }
    sp_model_t *m;
    if (sp_model_load(argv[1], &m, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sample_bench: %s\n", err);
        return 1;
    }
    const sp_tokenizer_t *tok = sp_model_tokenizer(m);
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *logits = sp_malloc((size_t)rows * (size_t)V * sizeof(float));
    float *scratch = sp_malloc((size_t)threads * (size_t)V * sizeof(float));
    int32_t *tok_a = sp_malloc((size_t)rows * sizeof(int32_t));
    int32_t *tok_b = sp_malloc((size_t)rows * sizeof(int32_t));
    sp_pool_t *pool;
    if (!logits || !scratch || !tok_a || !tok_b || sp_pool_create(threads, &pool) != SP_OK) {
        fprintf(stderr, "sample_bench: out of memory\n");
        return 1;
    }
    /* Logits spread like a random-weight model's: a few units wide. */
    uint64_t r = 88172645463325252ull;
    for (int64_t i = 0; i < (int64_t)rows * V; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        logits[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 6.0 - 3.0);
    }
    sp_gen_t *ga[MAX_ROWS], *gb[MAX_ROWS];
    make_gens(tok, rows, top_k, ga);
    make_gens(tok, rows, top_k, gb);
    double t_serial = 0, t_pool = 0;
    for (int s = 0; s < steps; s++) {
        job_t a = {ga, logits, scratch, V, tok_a};
        double t0 = now_s();
        for (int i = 0; i < rows; i++) {
            sample_row(&a, i, 0);
        }
        double t1 = now_s();
        job_t b = {gb, logits, scratch, V, tok_b};
        sp_pool_run(pool, sample_row, &b, rows);
        double t2 = now_s();
        t_serial += t1 - t0;
        t_pool += t2 - t1;
        if (memcmp(tok_a, tok_b, (size_t)rows * sizeof(int32_t)) != 0) {
            fprintf(stderr, "sample_bench: the two ways picked different tokens\n");
            return 1;
        }
    }
    printf("%d rows, vocabulary %lld, top_k %d, %d steps: one thread %.3f ms/step, "
           "pool of %d %.3f ms/step (%.2fx)\n",
           rows, (long long)V, top_k, steps, 1e3 * t_serial / steps, threads,
           1e3 * t_pool / steps, t_serial / t_pool);
    sp_pool_destroy(pool);
    for (int i = 0; i < rows; i++) {
        sp_gen_destroy(ga[i]);
        sp_gen_destroy(gb[i]);
    }
    sp_free(logits);
    sp_free(scratch);
    sp_free(tok_a);
    sp_free(tok_b);
    sp_model_free(m);
    return 0;
}
