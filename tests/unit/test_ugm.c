/*
 * test_ugm.c - the Unigram (t5) tokenizer beyond the llama.cpp vectors of
 * test_tokenizer.c: BOS/EOS as the vocabulary asks, bytes that are not UTF-8,
 * a character map that points outside itself (an untrusted file: an error,
 * never a read out of bounds), and a vocabulary without an unknown token.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "text/tokenizer.h"
#include "test.h"

#define MINI "tests/data/tokenizer/ggml-vocab-xlmr-ugm-mini.gguf"

static unsigned char *
slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n);
    ASSERT(b != NULL && fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void
spit(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL && fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* Offset of the value that follows key's record header (type, ...) in a GGUF file. */
static size_t
key_value_at(const unsigned char *b, size_t n, const char *key)
{
    size_t k = strlen(key);
    for (size_t i = 8; i + k < n; i++) {
        if (memcmp(b + i, key, k) == 0) {
            uint64_t len;
            memcpy(&len, b + i - 8, 8);
            if (len == k) {
                return i + k;
            }
        }
    }
    SP_TEST_FAIL("key %s not found", key);
    return 0;
}

TEST(ugm_specials_and_bad_utf8)
{
    char err[256];
    sp_gguf_t *g;
    sp_tokenizer_t *t;
    ASSERT_OK(sp_gguf_open(MINI, &g, err, sizeof err));
    ASSERT_OK(sp_tokenizer_from_gguf(g, &t, err, sizeof err));
    int32_t ids[64];
    /* The file asks for BOS <s> (0) and EOS </s> (2) around the text. */
    int64_t n = sp_tokenizer_encode(t, "Hello world", 11, true, false, ids, 64);
    ASSERT(n >= 3);
    ASSERT_EQ(ids[0], 0);
    ASSERT_EQ(ids[n - 1], 2);
    int64_t m = sp_tokenizer_encode(t, "Hello world", 11, false, false, ids, 64);
    ASSERT_EQ(m, n - 2);
    /* Bytes that start no character (or a cut one) become U+FFFD, then the
     * unknown token (3): ids stay in the vocabulary, runs of unknowns merge. */
    const char bad[] = "a\xff\xfe b\xc3";
    n = sp_tokenizer_encode(t, bad, sizeof bad - 1, false, false, ids, 64);
    ASSERT(n >= 3);
    int unk = 0;
    for (int64_t i = 0; i < n; i++) {
        ASSERT(ids[i] >= 0 && ids[i] < sp_tokenizer_n_vocab(t));
        unk += ids[i] == 3;
        if (i > 0) {
            ASSERT(!(ids[i] == 3 && ids[i - 1] == 3));
        }
    }
    ASSERT(unk >= 1);
    /* Empty and space-only texts give nothing (spaces collapse away). */
    ASSERT_EQ(sp_tokenizer_encode(t, "", 0, false, false, ids, 64), 0);
    ASSERT_EQ(sp_tokenizer_encode(t, "   ", 3, false, false, ids, 64), 0);
    sp_tokenizer_destroy(t);
    sp_gguf_close(g);
}

TEST(ugm_charsmap_out_of_bounds_is_an_error)
{
    size_t n;
    unsigned char *b = slurp(MINI, &n);
    /* value: u32 type (array), u32 element type, u64 count, then the map:
     * u32 size of the double array, its entries. Entry 0's BASE (bits
     * 10-30) sends the walk past the array's end. */
    size_t v = key_value_at(b, n, "tokenizer.ggml.precompiled_charsmap");
    size_t entry0 = v + 4 + 4 + 8 + 4;
    uint32_t e = 0x7ffffc00u;
    memcpy(b + entry0, &e, 4);
    const char *path = "build/test_ugm_badmap.gguf";
    spit(path, b, n);
    char err[256];
    sp_gguf_t *g;
    sp_tokenizer_t *t;
    ASSERT_OK(sp_gguf_open(path, &g, err, sizeof err));
    ASSERT_OK(sp_tokenizer_from_gguf(g, &t, err, sizeof err));
    int32_t ids[16];
    ASSERT_EQ(sp_tokenizer_encode(t, "Hello", 5, false, false, ids, 16), SP_ERR_FORMAT);
    sp_tokenizer_destroy(t);
    sp_gguf_close(g);

    /* A map whose declared array is longer than the map itself: refused at load. */
    uint32_t big = 0x7ffffff0u;
    memcpy(b + v + 4 + 4 + 8, &big, 4);
    spit(path, b, n);
    ASSERT_OK(sp_gguf_open(path, &g, err, sizeof err));
    ASSERT_EQ(sp_tokenizer_from_gguf(g, &t, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(strstr(err, "precompiled_charsmap") != NULL);
    sp_gguf_close(g);
    remove(path);
    free(b);
}

TEST(ugm_needs_an_unknown_token)
{
    size_t n;
    unsigned char *b = slurp(MINI, &n);
    /* unknown_token_id (u32) past the vocabulary: the loader says which id. */
    size_t v = key_value_at(b, n, "tokenizer.ggml.unknown_token_id");
    uint32_t id = 0x00ffffffu;
    memcpy(b + v + 4, &id, 4);
    const char *path = "build/test_ugm_nounk.gguf";
    spit(path, b, n);
    char err[256];
    sp_gguf_t *g;
    sp_tokenizer_t *t = NULL;
    ASSERT_OK(sp_gguf_open(path, &g, err, sizeof err));
    ASSERT(sp_tokenizer_from_gguf(g, &t, err, sizeof err) != SP_OK);
    ASSERT(t == NULL);
    sp_gguf_close(g);
    remove(path);
    free(b);
}
