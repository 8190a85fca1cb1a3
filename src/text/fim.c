/*
 * fim.c - a vocabulary's fill-in-the-middle tokens: the GGUF keys
 * tokenizer.ggml.fim_{pre,suf,mid,rep,sep}_token_id (and the older
 * prefix/suffix/middle_token_id, which the newer keys override), else the
 * token texts code-model families use for them (Qwen's <|fim_prefix|>,
 * StarCoder's <fim_prefix>, DeepSeek's <｜fim▁begin｜>, CodeLlama's <PRE>...).
 *
 * Threads: read runs once, inside sp_tokenizer_from_gguf; the accessor any
 * time after. Memory: none of its own. The prompt layout is fim_prompt.c.
 */
#include <string.h>

#include "text/tokenizer_impl.h"

/* key -> *id when present; -1 (as INT32 or UINT32) means none. */
static sp_status_t
read_id(sp_tokenizer_t *t, const sp_gguf_t *g, const char *key, int32_t *id, char *err,
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
    if (v == -1 || v == (int64_t)UINT32_MAX) {
        *id = -1;
        return SP_OK;
    }
    if (v < 0 || v >= t->n_vocab) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: %s: token id %lld out of range [0, %d)",
                       sp_gguf_path(g), key, (long long)v, (int)t->n_vocab);
    }
    *id = (int32_t)v;
    return SP_OK;
}

/* The first of texts (NULL-terminated) the vocabulary has, or -1. */
static int32_t
by_text(const sp_tokenizer_t *t, const char *const *texts)
{
    for (int i = 0; texts[i]; i++) {
        int32_t id = sp__vocab_lookup(t, texts[i], strlen(texts[i]));
        if (id >= 0) {
            return id;
        }
    }
    return -1;
}

sp_status_t
sp__tok_read_fim(sp_tokenizer_t *t, const sp_gguf_t *g, char *err, size_t err_len)
{
    static const char *const pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
                                      "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", NULL};
    static const char *const suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
                                      "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", NULL};
    static const char *const mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
                                      "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", NULL};
    static const char *const rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                      "<reponame>", NULL};
    static const char *const sep[] = {"<|file_sep|>", NULL};
    sp_fim_ids_t *f = &t->fim;
    f->pre = f->suf = f->mid = f->rep = f->sep = -1;
    sp_status_t st;
    if ((st = read_id(t, g, "tokenizer.ggml.prefix_token_id", &f->pre, err, err_len)) ||
        (st = read_id(t, g, "tokenizer.ggml.suffix_token_id", &f->suf, err, err_len)) ||
        (st = read_id(t, g, "tokenizer.ggml.middle_token_id", &f->mid, err, err_len)) ||
        (st = read_id(t, g, "tokenizer.ggml.fim_pre_token_id", &f->pre, err, err_len)) ||
        (st = read_id(t, g, "tokenizer.ggml.fim_suf_token_id", &f->suf, err, err_len)) ||
        (st = read_id(t, g, "tokenizer.ggml.fim_mid_token_id", &f->mid, err, err_len)) ||
        (st = read_id(t, g, "tokenizer.ggml.fim_rep_token_id", &f->rep, err, err_len)) ||
        (st = read_id(t, g, "tokenizer.ggml.fim_sep_token_id", &f->sep, err, err_len))) {
        return st;
    }
    f->pre = f->pre >= 0 ? f->pre : by_text(t, pre);
    f->suf = f->suf >= 0 ? f->suf : by_text(t, suf);
    f->mid = f->mid >= 0 ? f->mid : by_text(t, mid);
    f->rep = f->rep >= 0 ? f->rep : by_text(t, rep);
    f->sep = f->sep >= 0 ? f->sep : by_text(t, sep);
    return SP_OK;
}

sp_fim_ids_t
sp_tokenizer_fim(const sp_tokenizer_t *t)
{
    return t->fim;
}
