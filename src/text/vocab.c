/*
 * vocab.c - the vocabulary's text -> id hash map, shared by every encoder.
 *
 * tokenizer.c builds the map once at load (sp__vocab_build_map); the SPM
 * encoder there, byte-level BPE (tok_bpe.c) and WordPiece (tok_wpm.c) look
 * token texts up in it (sp__vocab_lookup). Keeping it in its own file lets the
 * encoders depend on the vocabulary without depending on tokenizer.c, which is
 * the only file that calls down into them. The special token ids of the GGUF keys are read
 * here too (sp__tok_special_id), for tokenizer.c and fim.c alike.
 *
 * Threads: the map is written only while the tokenizer is being built; after
 * that lookups are read-only and may run on any number of threads at once.
 * Memory: the map array is owned by the tokenizer (freed by sp_tokenizer_destroy).
 */
#include <string.h>

#include "core/alloc.h"
#include "text/tokenizer_impl.h"

static uint64_t
hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix for the low bits */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

sp_status_t
sp__vocab_build_map(sp_tokenizer_t *t)
{
    size_t slots = 16;
    while (slots < (size_t)t->n_vocab * 2) {
        slots <<= 1;
    }
    t->map = sp_malloc(slots * sizeof(int32_t));
    if (t->map == NULL) {
        return SP_ERR_NOMEM;
    }
    memset(t->map, 0xff, slots * sizeof(int32_t)); /* -1 everywhere */
    t->map_mask = slots - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        sp_str_t s = sp__vocab_text(t, id);
        size_t i = (size_t)hash_bytes(s.ptr, s.len) & t->map_mask;
        for (;;) {
            int32_t o = t->map[i];
            if (o < 0) {
                t->map[i] = id;
                break;
            }
            sp_str_t os = sp__vocab_text(t, o);
            if (os.len == s.len && (s.len == 0 || memcmp(os.ptr, s.ptr, s.len) == 0)) {
                t->map[i] = id; /* duplicate text: the later id wins, as in llama.cpp */
                break;
            }
            i = (i + 1) & t->map_mask;
        }
    }
    return SP_OK;
}

int32_t
sp__vocab_lookup(const sp_tokenizer_t *t, const char *p, size_t n)
{
    size_t i = (size_t)hash_bytes(p, n) & t->map_mask;
    for (;;) {
        int32_t id = t->map[i];
        if (id < 0) {
            return -1;
        }
        sp_str_t s = sp__vocab_text(t, id);
        if (s.len == n && (n == 0 || memcmp(s.ptr, p, n) == 0)) {
            return id;
        }
        i = (i + 1) & t->map_mask;
    }
}

/* Special token ids from the GGUF (tokenizer.c, fim.c): see tokenizer_impl.h. */
sp_status_t
sp__tok_special_id(const sp_gguf_t *g, const char *key, int32_t n_vocab, int32_t *id, char *err,
                   size_t err_len)
{
    int64_t v;
    sp_status_t st = sp_gguf_get_int(g, key, &v, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        return SP_OK;
    }
    if (st != SP_OK) {
        return st;
    }
    if (v == -1 || v == (int64_t)UINT32_MAX) { /* -1 written as INT32 or as UINT32 */
        *id = -1;
        return SP_OK;
    }
    if (v < 0 || v >= n_vocab) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: %s: token id %lld out of range [0, %d)",
                       sp_gguf_path(g), key, (long long)v, (int)n_vocab);
    }
    *id = (int32_t)v;
    return SP_OK;
}
