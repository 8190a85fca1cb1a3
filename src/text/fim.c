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
    const int32_t n = t->n_vocab;
    sp_status_t st;
    if ((st = sp__tok_special_id(g, "tokenizer.ggml.prefix_token_id", n, &f->pre, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.suffix_token_id", n, &f->suf, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.middle_token_id", n, &f->mid, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.fim_pre_token_id", n, &f->pre, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.fim_suf_token_id", n, &f->suf, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.fim_mid_token_id", n, &f->mid, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.fim_rep_token_id", n, &f->rep, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.fim_sep_token_id", n, &f->sep, err, err_len))) {
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
