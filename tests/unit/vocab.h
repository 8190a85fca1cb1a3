/*
 * vocab.h - a tokenizer from a GGUF file for the tests that drive the
 * generation module with synthetic logits (test_gen.c, test_gen_budget.c).
 */
#ifndef SP_TEST_VOCAB_H
#define SP_TEST_VOCAB_H

#include <stdint.h>

#include "gguf/gguf.h"
#include "text/tokenizer.h"

typedef struct sp_test_vocab {
    sp_gguf_t *g;
    sp_tokenizer_t *t;
} sp_test_vocab_t;

/* The tokenizer of the GGUF file at path; fails the test when it cannot be read. */
sp_test_vocab_t sp_test_vocab_open(const char *path);
void sp_test_vocab_close(sp_test_vocab_t *v);

/* The byte-fallback token <0xNN> of byte b; fails the test when t has none. */
int32_t sp_test_byte_token(const sp_tokenizer_t *t, unsigned b);

#endif /* SP_TEST_VOCAB_H */
