/*
 * fuzz_model.c - libFuzzer target for the whole model load path: GGUF
 * reader, hyper-parameter and tensor checks, tokenizer construction, and
 * (for inputs that load) one tiny forward pass and a tokenize/detokenize.
 *
 *   make fuzz                       # builds every build-fuzz/fuzz_* target
 *   ./build-fuzz/fuzz_model -max_total_time=60 -rss_limit_mb=2048 -max_len=65536 \
 *       tests/fuzz/corpus-work/model tests/fuzz/corpus/gguf
 *
 * The seeds include whole models under 4096 bytes (tests/fuzz/model_seeds.py
 * writes them), so mutations start from files that load and reach the forward
 * pass and the tokenizer. libFuzzer cuts seeds to -max_len: a larger model
 * seed needs a larger -max_len, or it arrives as a prefix that does not load.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "engine/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    sp_gguf_t *g;
    sp_model_t *m;
    sp_ctx_t *c;
    void *buf = malloc(size ? size : 1); /* exact size: ASan sees any overread */
    if (buf == NULL) {
        return 0;
    }
    memcpy(buf, data, size);
    if (sp_gguf_open_mem(buf, size, "fuzz.gguf", &g, err, sizeof err) == SP_OK &&
        sp_model_load_gguf(g, &m, err, sizeof err) == SP_OK) {
        sp_ctx_params_t cp = sp_ctx_default_params();
        cp.n_ctx = 4;
        cp.n_threads = 1;
        if (sp_ctx_create(m, &cp, &c, err, sizeof err) == SP_OK) {
            int32_t toks[2] = {0, (int32_t)(sp_model_hparams(m)->n_vocab - 1)};
            (void)sp_ctx_eval(c, toks, 2, 0);
            sp_ctx_destroy(c);
        }
        int32_t ids[64];
        int64_t n = sp_tokenizer_encode(sp_model_tokenizer(m), "Hello <s> w\xc3\xb6rld", 15, true, true,
                                        ids, 64);
        for (int64_t i = 0; i < n && i < 64; i++) {
            char piece[64];
            (void)sp_tokenizer_piece(sp_model_tokenizer(m), ids[i], true, piece, sizeof piece);
        }
        sp_model_free(m);
    }
    free(buf);
    return 0;
}
