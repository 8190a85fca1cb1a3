/*
 * fuzz_tokenizer.c - libFuzzer target for the tokenizers (SPM, byte-level BPE
 * with several pre-tokenizers, WordPiece) and the streaming detokenizer.
 *
 * Build with `make fuzz`; run from the repository root (the vocabularies are
 * read from tests/data/tokenizer/, or $SP_FUZZ_TOKDIR):
 *   mkdir -p tests/fuzz/corpus-work/tokenizer
 *   ./build-fuzz/fuzz_tokenizer -max_total_time=60 -max_len=4096 \
 *       tests/fuzz/corpus-work/tokenizer tests/fuzz/corpus/tokenizer
 *
 * Input: byte 0 picks the vocabulary (low 3 bits) and the flags (bit 3
 * parse_special, bit 4 add_bos); the rest is the text, copied into an exact-size
 * heap buffer so ASan sees any overread. Checks: the count-only call and the
 * filling call agree; every id is in the vocabulary; SPM and BPE text without
 * special parsing decodes back to the input (SPM: but for the dummy-prefix
 * space); the streaming detokenizer emits exactly the concatenated pieces and
 * never holds more than 3 bytes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "text/tokenizer.h"

static const char *const vocab_names[] = {"llama-spm", "gpt-2", "deepseek-llm", "deepseek-coder",
                                          "falcon", "starcoder", "mpt", "bert-bge"};
#define N_VOCAB 8

static sp_gguf_t *files[N_VOCAB];
static sp_tokenizer_t *toks[N_VOCAB];
static bool lone_byte_ok[N_VOCAB][256]; /* the byte alone encodes and decodes back */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("SP_FUZZ_TOKDIR");
    if (dir == NULL) {
        dir = "tests/data/tokenizer";
    }
    for (int i = 0; i < N_VOCAB; i++) {
        char path[512], err[512];
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir, vocab_names[i]);
        if (sp_gguf_open(path, &files[i], err, sizeof err) != SP_OK ||
            sp_tokenizer_from_gguf(files[i], &toks[i], err, sizeof err) != SP_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err);
            abort();
        }
        for (int b = 0; b < 256; b++) {
            char c = (char)b, out[8];
            int32_t ids[8];
            int64_t n = sp_tokenizer_encode(toks[i], &c, 1, false, false, ids, 8);
            size_t k = 0;
            for (int64_t j = 0; j < n && j < 8; j++) {
                int32_t m = sp_tokenizer_piece(toks[i], ids[j], false, out + k, 8 - (int32_t)k);
                k += m > 0 ? (size_t)m : 0;
            }
            /* SPM puts its dummy-prefix space first */
            lone_byte_ok[i][b] = (k == 1 && out[0] == c) || (k == 2 && out[0] == ' ' && out[1] == c);
        }
    }
    return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    int which = data[0] & 7;
    bool special = (data[0] >> 3) & 1, bos = (data[0] >> 4) & 1;
    const sp_tokenizer_t *t = toks[which];
    size_t len = size - 1;
    char *text = malloc(len ? len : 1);
    memcpy(text, data + 1, len);

    int64_t n = sp_tokenizer_encode(t, text, len, bos, special, NULL, 0);
    if (n < 0) {
        abort(); /* nothing a fuzzer can send is an error below MAX_INPUT_BYTES */
    }
    int32_t *ids = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (sp_tokenizer_encode(t, text, len, bos, special, ids, n) != n) {
        abort();
    }
    int32_t n_vocab = sp_tokenizer_n_vocab(t);
    size_t cap = 64, used = 0, streamed = 0;
    char *dec = malloc(cap), *str = malloc(cap);
    sp_detok_t d = {0};
    char piece[SP_TOKEN_MAX_BYTES + 8];
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            abort();
        }
        int32_t k = sp_tokenizer_piece(t, ids[i], false, NULL, 0);
        if (k < 0 || k > SP_TOKEN_MAX_BYTES) {
            abort();
        }
        while (used + (size_t)k + 8 > cap) {
            cap *= 2;
            dec = realloc(dec, cap);
            str = realloc(str, cap);
        }
        sp_tokenizer_piece(t, ids[i], false, dec + used, k);
        used += (size_t)k;
        int32_t s = sp_detok_push(t, &d, ids[i], false, piece, (int32_t)sizeof piece);
        if (s < 0 || d.n_held > 3) {
            abort();
        }
        memcpy(str + streamed, piece, (size_t)s);
        streamed += (size_t)s;
    }
    streamed += (size_t)sp_detok_flush(&d, str + streamed, 4);
    if (streamed != used || memcmp(str, dec, used) != 0) {
        abort();
    }
    /* SPM and BPE are lossless (WordPiece normalizes) when the vocabulary has a
     * token for every byte of the text: falcon, for one, lacks a few */
    bool lossless = !special && which != 7;
    for (size_t i = 0; i < len && lossless; i++) {
        lossless = lone_byte_ok[which][(unsigned char)text[i]];
    }
    if (which == 0 && len >= 3 && memmem(text, len, "\xE2\x96\x81", 3) != NULL) {
        lossless = false; /* SPM: a literal U+2581 in the text decodes as a space */
    }
    if (lossless) {
        const char *p = dec;
        size_t m = used;
        if (which == 0 && m == len + 1 && p[0] == ' ') {
            p++, m--;
        }
        if (m != len || memcmp(p, text, len) != 0) {
            abort();
        }
    }
    free(dec);
    free(str);
    free(ids);
    free(text);
    return 0;
}
