/*
 * tokenize_bench.c - tokenizer throughput of our engine on text files.
 *
 *   tokenize_bench -m VOCAB.gguf [--runs N] FILE...
 *
 * For each file: tokenizes the whole text (no BOS, specials not parsed: the
 * same call llama.cpp's side makes) N times and prints one JSON line with the
 * best time, MB/s (10^6 bytes per second), the token count and an FNV-1a hash
 * of the ids, so bench/tokenize_bench.sh can check both sides agree.
 * Built by bench/tokenize_bench.sh against $BUILD/libsampan.a.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

static char *
slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

int
main(int argc, char **argv)
{
    const char *model = NULL;
    int runs = 5, first_file = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-m") == 0 && i + 1 < argc) {
            model = argv[++i];
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else {
            first_file = i;
            break;
        }
    }
    if (model == NULL || first_file >= argc || runs < 1) {
        fprintf(stderr, "usage: tokenize_bench -m VOCAB.gguf [--runs N] FILE...\n");
        return 2;
    }
    char err[512];
    sp_gguf_t *g = NULL;
    sp_tokenizer_t *t = NULL;
    if (sp_gguf_open(model, &g, err, sizeof err) != SP_OK ||
        sp_tokenizer_from_gguf(g, &t, err, sizeof err) != SP_OK) {
        fprintf(stderr, "tokenize_bench: %s\n", err);
        return 1;
    }
    for (int f = first_file; f < argc; f++) {
        size_t len;
        char *text = slurp(argv[f], &len);
        if (text == NULL) {
            fprintf(stderr, "tokenize_bench: cannot read %s\n", argv[f]);
            return 1;
        }
        int64_t n = sp_tokenizer_encode(t, text, len, false, false, NULL, 0);
        int32_t *ids = malloc(((size_t)(n > 0 ? n : 0) + 1) * sizeof(int32_t));
        if (n < 0 || ids == NULL) {
            fprintf(stderr, "tokenize_bench: %s: tokenize failed\n", argv[f]);
            return 1;
        }
        double best = 1e30;
        for (int r = 0; r < runs; r++) {
            int64_t t0 = sp_time_ns();
            sp_tokenizer_encode(t, text, len, false, false, ids, n);
            double s = (double)(sp_time_ns() - t0) / 1e9;
            best = s < best ? s : best;
        }
        uint64_t h = 0xcbf29ce484222325ull;
        for (int64_t i = 0; i < n; i++) {
            h = (h ^ (uint32_t)ids[i]) * 0x100000001b3ull;
        }
        printf("{\"impl\":\"sampan\",\"file\":\"%s\",\"bytes\":%zu,\"tokens\":%lld,"
               "\"best_ms\":%.3f,\"mb_s\":%.2f,\"hash\":\"%016llx\"}\n",
               argv[f], len, (long long)n, best * 1e3, (double)len / best / 1e6,
               (unsigned long long)h);
        free(ids);
        free(text);
    }
    sp_tokenizer_destroy(t);
    sp_gguf_close(g);
    return 0;
}
