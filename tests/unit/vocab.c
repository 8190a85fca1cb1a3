/* vocab.c - see vocab.h. */
#include "vocab.h"

#include <stdio.h>

#include "test.h"

sp_test_vocab_t
sp_test_vocab_open(const char *path)
{
    sp_test_vocab_t v;
    char err[256];
    ASSERT_OK(sp_gguf_open(path, &v.g, err, sizeof err));
    ASSERT_OK(sp_tokenizer_from_gguf(v.g, &v.t, err, sizeof err));
    return v;
}

void
sp_test_vocab_close(sp_test_vocab_t *v)
{
    sp_tokenizer_destroy(v->t);
    sp_gguf_close(v->g);
}

int32_t
sp_test_byte_token(const sp_tokenizer_t *t, unsigned b)
{
    char want[8];
    snprintf(want, sizeof want, "<0x%02X>", b);
    for (int32_t id = 0; id < sp_tokenizer_n_vocab(t); id++) {
        if (sp_str_eq_c(sp_tokenizer_token_text(t, id), want)) {
            return id;
        }
    }
    SP_TEST_FAIL("no token %s", want);
    return -1;
}
