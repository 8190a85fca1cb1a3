/*
 * tokenizer.c - text <-> token ids for the vocabularies a GGUF file carries.
 *
 * Layout: the load step (shared by every model type) copies the vocabulary out
 * of the GGUF mapping into one owned blob, checks it as untrusted input
 * (RELIABILITY.md G14-G16) and builds a text -> id hash map. Tokenizing first
 * splits special-token texts out of the input (shared), then hands each run of
 * plain text to the encoder of the vocabulary's model: SentencePiece (here),
 * byte-level BPE (tok_bpe.c) or WordPiece (tok_wpm.c); the text -> id map they
 * all look tokens up in is vocab.c's, and the streaming detokenizer over
 * sp_tokenizer_piece is detok.c. A built tokenizer is
 * read-only: sp_tokenizer_encode may run on any number of threads at once, each call
 * keeping its scratch state in its own heap buffers.
 *
 * The SPM encoder is the score-driven BPE llama.cpp's "llama" vocab runs:
 * spaces become U+2581, a dummy-prefix space goes in front of text that starts
 * the input or follows a special token, the text is cut into UTF-8 characters,
 * and the adjacent pair whose concatenation is a vocabulary token with the
 * highest score merges first (ties: leftmost). A max-heap of candidate pairs
 * keeps this O(n log n); entries made stale by an earlier merge are detected
 * by their length and skipped. Final symbols that are not tokens fall back to
 * their bytes as <0xNN> tokens (or unk).
 */
#include "text/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "core/heap.h"
#include "text/tokenizer_impl.h"

#define MAX_VOCAB (1 << 24) /* G15: larger vocabularies are refused */
#define MAX_EOG SP_TOKENIZER_MAX_EOG
/* Longest input sp_tokenizer_encode accepts: symbol indices are int32 and the escaped
 * text (3 bytes per space) must stay below 2^31. */
#define MAX_INPUT_BYTES ((size_t)1 << 29)

/* ---- small helpers ----------------------------------------------------- */

static int
hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Strict <0xNN>: exactly six bytes, two hex digits. Returns the byte or -1. */
static int
parse_byte_token(sp_str_t s)
{
    if (s.len != 6 || memcmp(s.ptr, "<0x", 3) != 0 || s.ptr[5] != '>') {
        return -1;
    }
    int hi = hexval(s.ptr[3]), lo = hexval(s.ptr[4]);
    if (hi < 0 || lo < 0) {
        return -1;
    }
    return hi * 16 + lo;
}

/* ---- loading ----------------------------------------------------------- */

static sp_status_t
get_opt_bool(const sp_gguf_t *g, const char *key, bool *out, char *err, size_t err_len)
{
    sp_status_t st = sp_gguf_get_bool(g, key, out, err, err_len);
    return st == SP_ERR_NOT_FOUND ? SP_OK : st;
}

static void
add_eog(sp_tokenizer_t *t, int32_t id)
{
    if (id < 0) {
        return;
    }
    for (int i = 0; i < t->n_eog; i++) {
        if (t->eog[i] == id) {
            return;
        }
    }
    if (t->n_eog < MAX_EOG) {
        t->eog[t->n_eog++] = id;
    }
}

/*
 * gpt-oss's harmony vocabulary: <|end|> closes one message of the answer (the
 * thinking, then the final message follow each other), <|return|> and
 * <|call|> end the answer (as llama.cpp decides from the same tokens).
 */
static void
harmony_eog(sp_tokenizer_t *t)
{
    int32_t ret = sp__vocab_lookup(t, "<|return|>", 10);
    int32_t call = sp__vocab_lookup(t, "<|call|>", 8);
    int32_t end = sp__vocab_lookup(t, "<|end|>", 7);
    if (ret < 0 || call < 0 || end < 0 || t->attr[ret] != SP_TOKEN_TYPE_CONTROL ||
        t->attr[call] != SP_TOKEN_TYPE_CONTROL) {
        return;
    }
    add_eog(t, ret);
    add_eog(t, call);
    for (int i = 0; i < t->n_eog; i++) {
        if (t->eog[i] == end) {
            t->eog[i] = t->eog[--t->n_eog];
            break;
        }
    }
}

/* Specials are split out of the text longest first, then by id (llama.cpp's
 * order); sorted as (length, id) pairs so qsort needs no context. */
typedef struct special_key {
    size_t len;
    int32_t id;
} special_key_t;

static int
cmp_special(const void *a, const void *b)
{
    const special_key_t *x = a, *y = b;
    if (x->len != y->len) {
        return x->len > y->len ? -1 : 1;
    }
    return (x->id > y->id) - (x->id < y->id);
}

typedef struct score_key {
    float score;
    int32_t id;
} score_key_t;

static int
cmp_score_desc(const void *a, const void *b)
{
    const score_key_t *x = a, *y = b;
    if (x->score != y->score) {
        return x->score > y->score ? -1 : 1;
    }
    return (x->id > y->id) - (x->id < y->id);
}

/* Ranks replace scores in the merge queue (equal scores share a rank, so ties
 * still go to the leftmost pair); also the facts the encoder's shortcuts need. */
static sp_status_t
build_ranks(sp_tokenizer_t *t)
{
    score_key_t *k = sp_calloc((size_t)t->n_vocab, sizeof(score_key_t));
    t->rank = sp_calloc((size_t)t->n_vocab, sizeof(uint32_t));
    if (k == NULL || t->rank == NULL) {
        sp_free(k);
        return SP_ERR_NOMEM;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        k[i] = (score_key_t){t->scores[i], i};
    }
    qsort(k, (size_t)t->n_vocab, sizeof(score_key_t), cmp_score_desc);
    uint32_t r = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (i > 0 && k[i].score != k[i - 1].score) {
            r++;
        }
        t->rank[k[i].id] = r;
    }
    sp_free(k);

    t->max_token_len = 0;
    t->cut_at_space = true;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        sp_str_t s = sp__vocab_text(t, i);
        if (s.len > t->max_token_len) {
            t->max_token_len = s.len;
        }
        /* every U+2581 past the start must follow another U+2581 */
        for (size_t j = 1; j + 3 <= s.len; j++) {
            if (memcmp(s.ptr + j, "\xE2\x96\x81", 3) == 0 &&
                (j < 3 || memcmp(s.ptr + j - 3, "\xE2\x96\x81", 3) != 0)) {
                t->cut_at_space = false;
            }
        }
    }
    return SP_OK;
}

sp_status_t
sp_tokenizer_from_gguf(const sp_gguf_t *g, sp_tokenizer_t **out, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    sp_tokenizer_t *t = NULL;
    sp_status_t st;
    sp_str_t model;
    sp_gguf_arr_t toks, scores, types;
    bool have_scores = false, have_types = false;

    *out = NULL;
    st = sp_gguf_get_str(g, "tokenizer.ggml.model", &model, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "%s: tokenizer.ggml.model: key missing",
                       path);
    }
    if (st != SP_OK) {
        return st;
    }
    sp_tok_model_t kind;
    if (sp_str_eq_c(model, "llama")) {
        kind = SP_TOK_MODEL_SPM;
    } else if (sp_str_eq_c(model, "gpt2") || sp_str_eq_c(model, "gemma4")) {
        kind = SP_TOK_MODEL_BPE;
    } else if (sp_str_eq_c(model, "bert")) {
        kind = SP_TOK_MODEL_WPM;
    } else if (sp_str_eq_c(model, "t5")) {
        kind = SP_TOK_MODEL_UGM;
    } else {
        int n = model.len > 64 ? 64 : (int)model.len;
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.model: model \"%.*s\" is not supported "
                       "(\"llama\", \"gpt2\", \"gemma4\", \"bert\" and \"t5\" are)",
                       path, n, model.ptr);
    }

    st = sp_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tokenizer.ggml.tokens: key missing", path);
    }
    if (st != SP_OK) {
        return st;
    }
    if (toks.elem_type != SP_GGUF_TYPE_STRING || toks.strs == NULL) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tokenizer.ggml.tokens: elements are %s, want string", path,
                       sp_gguf_type_name(toks.elem_type));
    }
    if (toks.n == 0 || toks.n > MAX_VOCAB) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tokenizer.ggml.tokens: %llu tokens, want 1..%d", path,
                       (unsigned long long)toks.n, MAX_VOCAB);
    }
    int32_t n = (int32_t)toks.n;

    st = sp_gguf_get_arr(g, "tokenizer.ggml.scores", &scores, err, err_len);
    if (st == SP_OK) {
        if (scores.elem_type != SP_GGUF_TYPE_FLOAT32) { /* G14: UINT8 with the right count */
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tokenizer.ggml.scores: elements are %s, want float32", path,
                           sp_gguf_type_name(scores.elem_type));
        }
        if (scores.n != toks.n) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tokenizer.ggml.scores: %llu entries for %d tokens", path,
                           (unsigned long long)scores.n, (int)n);
        }
        have_scores = true;
    } else if (st != SP_ERR_NOT_FOUND) {
        return st;
    }
    st = sp_gguf_get_arr(g, "tokenizer.ggml.token_type", &types, err, err_len);
    if (st == SP_OK) {
        if (types.elem_type != SP_GGUF_TYPE_INT32) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tokenizer.ggml.token_type: elements are %s, want int32", path,
                           sp_gguf_type_name(types.elem_type));
        }
        if (types.n != toks.n) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tokenizer.ggml.token_type: %llu entries for %d tokens", path,
                           (unsigned long long)types.n, (int)n);
        }
        have_types = true;
    } else if (st != SP_ERR_NOT_FOUND) {
        return st;
    }

    t = sp_calloc(1, sizeof(*t));
    if (t == NULL) {
        goto nomem;
    }
    t->model = kind;
    t->raw_bpe = sp_str_eq_c(model, "gemma4");
    t->n_vocab = n;
    t->text_off = sp_calloc((size_t)n + 1, sizeof(size_t));
    t->scores = sp_calloc((size_t)n, sizeof(float));
    t->attr = sp_calloc((size_t)n, 1);
    t->byte_val = sp_calloc((size_t)n, 1);
    if (t->text_off == NULL || t->scores == NULL || t->attr == NULL || t->byte_val == NULL) {
        goto nomem;
    }

    /* Texts: bound each (G16), then copy them into one blob we own, so the
     * tokenizer does not depend on the mapping staying open. */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t len = toks.strs[i].len;
        if (len > SP_TOKEN_MAX_BYTES) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT,
                         "%s: tokenizer.ggml.tokens: token %d is %zu bytes long (max %d)", path,
                         (int)i, len, SP_TOKEN_MAX_BYTES);
            goto fail;
        }
        t->text_off[i] = total;
        total += len; /* cannot wrap: at most 2^24 * 1024 */
    }
    t->text_off[n] = total;
    t->blob = sp_malloc(total ? total : 1);
    if (t->blob == NULL) {
        goto nomem;
    }
    for (int32_t i = 0; i < n; i++) {
        if (toks.strs[i].len > 0) {
            memcpy(t->blob + t->text_off[i], toks.strs[i].ptr, toks.strs[i].len);
        }
    }

    for (int32_t i = 0; i < n; i++) {
        if (have_scores) {
            double s = sp_gguf_arr_float(&scores, (uint64_t)i);
            if (isnan(s)) { /* a NaN would break the heap order */
                st = sp_errf(err, err_len, SP_ERR_FORMAT,
                             "%s: tokenizer.ggml.scores: score of token %d is NaN", path, (int)i);
                goto fail;
            }
            t->scores[i] = (float)s;
        }
        sp_str_t text = sp__vocab_text(t, i);
        int byte = parse_byte_token(text);
        if (have_types) {
            int64_t ty = sp_gguf_arr_int(&types, (uint64_t)i);
            if (ty < SP_TOKEN_TYPE_UNDEFINED || ty > SP_TOKEN_TYPE_BYTE) {
                st = sp_errf(err, err_len, SP_ERR_FORMAT,
                             "%s: tokenizer.ggml.token_type: token %d has type %lld (want 0..6)",
                             path, (int)i, (long long)ty);
                goto fail;
            }
            /* G16: a BYTE token must spell <0xNN> exactly; other tokens that merely
             * look like one (<0xZZ>, <0x-1>) are ordinary text. */
            if (ty == SP_TOKEN_TYPE_BYTE && byte < 0) {
                int shown = text.len > 32 ? 32 : (int)text.len;
                st = sp_errf(err, err_len, SP_ERR_FORMAT,
                             "%s: tokenizer.ggml.token_type: token %d is a byte token but its "
                             "text \"%.*s\" is not <0xNN>",
                             path, (int)i, shown, text.ptr);
                goto fail;
            }
            t->attr[i] = (uint8_t)ty;
        } else {
            /* No types stored: exact <0xNN> spellings are the byte tokens. */
            t->attr[i] = byte >= 0 ? SP_TOKEN_TYPE_BYTE : SP_TOKEN_TYPE_NORMAL;
        }
        if (t->attr[i] == SP_TOKEN_TYPE_BYTE) {
            t->byte_val[i] = (uint8_t)byte;
        }
    }

    /* Specials. llama.cpp's defaults are unk 0, bos 1, eos 2 for the llama
     * model, bos = eos = 11 for gpt2, and [UNK] 100, [CLS] 101, [SEP] 102,
     * [PAD] 0 for bert; defaults that do not fit a small vocabulary become "none". */
    int32_t eot = -1, eom = -1;
    t->pad = -1;
    t->sep = -1;
    t->add_eos = false;
    t->add_sep = false;
    switch (kind) {
    case SP_TOK_MODEL_SPM:
        t->unk = n > 0 ? 0 : -1;
        t->bos = n > 1 ? 1 : -1;
        t->eos = n > 2 ? 2 : -1;
        t->add_bos = true;
        t->add_space_prefix = true;
        break;
    case SP_TOK_MODEL_BPE:
        t->unk = -1;
        t->bos = t->eos = n > 11 ? 11 : -1;
        t->add_bos = false;
        t->add_space_prefix = false;
        break;
    case SP_TOK_MODEL_WPM:
        t->unk = n > 100 ? 100 : -1;
        t->bos = n > 101 ? 101 : -1; /* [CLS] */
        t->eos = -1;
        t->sep = n > 102 ? 102 : -1;
        t->pad = n > 0 ? 0 : -1;
        t->add_bos = true;
        t->add_sep = true;
        t->add_space_prefix = false;
        break;
    case SP_TOK_MODEL_UGM: /* llama.cpp's t5 defaults: pad 0, eos 1, unk 2 */
        t->pad = n > 0 ? 0 : -1;
        t->eos = n > 1 ? 1 : -1;
        t->unk = n > 2 ? 2 : -1;
        t->bos = -1;
        t->add_bos = false;
        t->add_eos = true;
        t->add_space_prefix = false; /* tokenizer.ggml.add_space_prefix, read by tok_ugm.c */
        break;
    }
    if ((st = sp__tok_special_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.padding_token_id", n, &t->pad, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.eot_token_id", n, &eot, err, err_len)) ||
        (st = sp__tok_special_id(g, "tokenizer.ggml.eom_token_id", n, &eom, err, err_len)) ||
        ((kind == SP_TOK_MODEL_WPM || kind == SP_TOK_MODEL_UGM) &&
         ((kind == SP_TOK_MODEL_WPM &&
           (st = sp__tok_special_id(g, "tokenizer.ggml.cls_token_id", n, &t->bos, err, err_len))) ||
          /* the GGUF key is spelled "seperator"; accept the right spelling too */
          (st = sp__tok_special_id(g, "tokenizer.ggml.seperator_token_id", n, &t->sep, err,
                               err_len)) ||
          (st = sp__tok_special_id(g, "tokenizer.ggml.separator_token_id", n, &t->sep, err,
                               err_len)))) ||
        (st = get_opt_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err, err_len)) ||
        (st = get_opt_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err, err_len)) ||
        (st = get_opt_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err,
                           err_len))) {
        goto fail;
    }
    if (t->raw_bpe) {
        /* Gemma 4's files say add_bos_token = false, yet its tokenizer (and
         * llama.cpp) puts <bos> in front of every prompt */
        t->add_bos = true;
    }
    if (t->add_bos && t->bos < 0) {
        t->add_bos = false;
    }
    if (t->add_eos && t->eos < 0) {
        t->add_eos = false;
    }
    if (t->add_sep && t->sep < 0) {
        t->add_sep = false;
    }
    if (!have_types) { /* give the special ids their roles */
        int32_t ctl[] = {t->bos, t->eos, t->pad, eot, eom};
        for (size_t k = 0; k < sizeof(ctl) / sizeof(ctl[0]); k++) {
            if (ctl[k] >= 0) {
                t->attr[ctl[k]] = SP_TOKEN_TYPE_CONTROL;
            }
        }
        if (t->unk >= 0) {
            t->attr[t->unk] = SP_TOKEN_TYPE_UNKNOWN;
        }
    }

    /* End of generation: eos, eot, eom, and the end-of-turn control tokens chat
     * models use (llama.cpp marks the same texts). */
    add_eog(t, t->eos);
    add_eog(t, eot);
    add_eog(t, eom);
    static const char *const eog_texts[] = {"<|eot_id|>",    "<|im_end|>", "<|end|>",
                                            "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                                            "<EOT>"};
    if ((st = sp__vocab_build_map(t)) != SP_OK || (st = build_ranks(t)) != SP_OK) {
        goto nomem;
    }
    if (kind == SP_TOK_MODEL_BPE && (st = sp__tok_bpe_init(t, g, err, err_len)) != SP_OK) {
        goto fail;
    }
    if (kind == SP_TOK_MODEL_UGM) {
        if (t->unk < 0) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT,
                         "%s: a t5 (Unigram) vocabulary needs an unknown token", path);
            goto fail;
        }
        if ((st = sp__tok_ugm_init(t, g, err, err_len)) != SP_OK) {
            goto fail;
        }
    }
    for (size_t k = 0; k < sizeof(eog_texts) / sizeof(eog_texts[0]); k++) {
        int32_t id = sp__vocab_lookup(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && t->attr[id] == SP_TOKEN_TYPE_CONTROL) {
            add_eog(t, id);
        }
    }
    harmony_eog(t);
    if ((st = sp__tok_read_fim(t, g, err, err_len)) != SP_OK) {
        goto fail;
    }

    /* Byte fallback table: BYTE tokens (first one wins), else a token whose text
     * is that single byte (llama.cpp's second choice), else none (unk). */
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = -1;
    }
    for (int32_t i = 0; i < n; i++) {
        if (t->attr[i] == SP_TOKEN_TYPE_BYTE && t->byte_id[t->byte_val[i]] < 0) {
            t->byte_id[t->byte_val[i]] = i;
        }
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_id[b] < 0) {
            char c = (char)b;
            t->byte_id[b] = sp__vocab_lookup(t, &c, 1);
        }
    }

    /* Specials split out of the text: control, user-defined and unknown tokens
     * with a non-empty text (an empty one would match everywhere). */
    int32_t n_special = 0;
    for (int32_t i = 0; i < n; i++) {
        uint8_t a = t->attr[i];
        if ((a == SP_TOKEN_TYPE_CONTROL || a == SP_TOKEN_TYPE_USER_DEFINED ||
             a == SP_TOKEN_TYPE_UNKNOWN) && t->text_off[i + 1] > t->text_off[i]) {
            n_special++;
        }
    }
    special_key_t *keys = sp_calloc(n_special ? (size_t)n_special : 1, sizeof(special_key_t));
    t->special = sp_calloc(n_special ? (size_t)n_special : 1, sizeof(int32_t));
    if (keys == NULL || t->special == NULL) {
        sp_free(keys);
        goto nomem;
    }
    for (int32_t i = 0; i < n; i++) {
        uint8_t a = t->attr[i];
        if ((a == SP_TOKEN_TYPE_CONTROL || a == SP_TOKEN_TYPE_USER_DEFINED ||
             a == SP_TOKEN_TYPE_UNKNOWN) && t->text_off[i + 1] > t->text_off[i]) {
            keys[t->n_special++] = (special_key_t){t->text_off[i + 1] - t->text_off[i], i};
        }
    }
    qsort(keys, (size_t)t->n_special, sizeof(special_key_t), cmp_special);
    for (int32_t k = 0; k < t->n_special; k++) {
        t->special[k] = keys[k].id;
    }
    sp_free(keys);

    *out = t;
    return SP_OK;

nomem:
    st = sp_errf(err, err_len, SP_ERR_NOMEM, "%s: tokenizer: out of memory", path);
fail:
    sp_tokenizer_destroy(t);
    return st;
}

void
sp_tokenizer_destroy(sp_tokenizer_t *t)
{
    if (t == NULL) {
        return;
    }
    sp_free(t->blob);
    sp_free(t->text_off);
    sp_free(t->scores);
    sp_free(t->rank);
    sp_free(t->attr);
    sp_free(t->byte_val);
    sp_free(t->map);
    sp_free(t->special);
    sp__tok_bpe_free(t->bpe);
    sp__tok_ugm_free(t->ugm);
    sp_free(t);
}

int32_t
sp_tokenizer_n_vocab(const sp_tokenizer_t *t)
{
    return t->n_vocab;
}

int32_t
sp_tokenizer_bos(const sp_tokenizer_t *t)
{
    return t->bos;
}

int32_t
sp_tokenizer_sep(const sp_tokenizer_t *t)
{
    return t->sep;
}

int32_t
sp_tokenizer_eos(const sp_tokenizer_t *t)
{
    return t->eos;
}

bool
sp_tokenizer_add_bos(const sp_tokenizer_t *t)
{
    return t->add_bos;
}

bool
sp_tokenizer_is_eog(const sp_tokenizer_t *t, int32_t id)
{
    for (int i = 0; i < t->n_eog; i++) {
        if (t->eog[i] == id) {
            return true;
        }
    }
    return false;
}

const int32_t *
sp_tokenizer_eog(const sp_tokenizer_t *t, int *n)
{
    *n = t->n_eog;
    return t->eog;
}

bool
sp_tokenizer_strips_space(const sp_tokenizer_t *t)
{
    return (t->model == SP_TOK_MODEL_SPM || t->model == SP_TOK_MODEL_UGM) && t->add_space_prefix;
}

sp_str_t
sp_tokenizer_token_text(const sp_tokenizer_t *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) {
        sp_str_t none = {"", 0};
        return none;
    }
    return sp__vocab_text(t, id);
}

/* ---- output sink ------------------------------------------------------- */

/* ---- special-token split ----------------------------------------------- */

/* A piece of the input: plain text [off, off+len) or one special token. */
typedef struct fragment {
    int32_t token; /* -1 for text */
    size_t off, len;
} fragment_t;

typedef struct frag_list {
    fragment_t *v;
    size_t n, cap;
} frag_list_t;

static int
frag_push(frag_list_t *l, int32_t token, size_t off, size_t len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16, bytes;
        if (sp_mul_size(cap, sizeof(fragment_t), &bytes)) {
            return -1;
        }
        fragment_t *v = sp_realloc(l->v, bytes);
        if (v == NULL) {
            return -1;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (fragment_t){token, off, len};
    return 0;
}

/*
 * Split the input on special-token texts, longest first (llama.cpp's
 * tokenizer_st_partition): every occurrence of a longer special is cut out
 * before shorter ones are looked for in what remains. With parse_special
 * false only user-defined tokens are split (as Hugging Face does with added
 * tokens); control and unknown texts stay ordinary text.
 */
static sp_status_t
split_special(const sp_tokenizer_t *t, const char *text, size_t len, bool parse_special,
              frag_list_t *out)
{
    frag_list_t a = {0}, b = {0};
    if (len > 0 && frag_push(&a, -1, 0, len)) {
        goto nomem;
    }
    for (int32_t k = 0; k < t->n_special && len > 0; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->attr[id] != SP_TOKEN_TYPE_USER_DEFINED) {
            continue;
        }
        sp_str_t s = sp__vocab_text(t, id);
        if (s.len > len || memmem(text, len, s.ptr, s.len) == NULL) {
            continue; /* cheap pre-check: most specials never occur */
        }
        b.n = 0;
        for (size_t f = 0; f < a.n; f++) {
            fragment_t fr = a.v[f];
            if (fr.token >= 0) {
                if (frag_push(&b, fr.token, 0, 0)) {
                    goto nomem;
                }
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            while (pos < end) {
                const char *hit = memmem(text + pos, end - pos, s.ptr, s.len);
                if (hit == NULL) {
                    break;
                }
                size_t at = (size_t)(hit - text);
                if ((at > pos && frag_push(&b, -1, pos, at - pos)) || frag_push(&b, id, 0, 0)) {
                    goto nomem;
                }
                pos = at + s.len;
            }
            if (pos < end && frag_push(&b, -1, pos, end - pos)) {
                goto nomem;
            }
        }
        frag_list_t tmp = a;
        a = b;
        b = tmp;
    }
    sp_free(b.v);
    *out = a;
    return SP_OK;
nomem:
    sp_free(a.v);
    sp_free(b.v);
    return SP_ERR_NOMEM;
}

/* ---- SPM (llama) encoder ----------------------------------------------- */

typedef struct spm_symbol {
    int32_t prev, next; /* neighbours in the chunk's linked list, -1 at the ends */
    uint32_t off, n;    /* bytes [off, off+n) of the escaped text; n = 0 once merged away */
} spm_symbol_t;

/*
 * A queued pair is one uint64 key, smallest first:
 *   bits 40..63  rank of the merged token's score (0 = highest score)
 *   bits 10..39  index of the left symbol (ties go to the leftmost)
 *   bits  0..9   merged length - 1 (a token is 1..1024 bytes)
 * so the order is llama.cpp's (score, then leftmost) with one integer compare.
 * The right symbol is the left one's current neighbour; an entry is stale when
 * the left symbol was merged away or the two lengths no longer add up (either
 * side grew since it was queued).
 */
#define KEY_LEFT_BITS 30
#define KEY_SIZE_BITS 10

typedef struct spm_work {
    char *esc;          /* escaped text of the current fragment */
    spm_symbol_t *sym;  /* symbols of the current chunk */
    sp_heap_u64_t heap; /* pair keys */
} spm_work_t;

/* Queue the pair (left, left's next) when their concatenation is a token. */
static int
spm_try_bigram(const sp_tokenizer_t *t, spm_work_t *w, int32_t left)
{
    if (left < 0 || w->sym[left].next < 0) {
        return 0;
    }
    const spm_symbol_t *l = &w->sym[left], *r = &w->sym[l->next];
    size_t size = (size_t)l->n + r->n; /* r starts where l ends: symbols stay contiguous */
    if (size > t->max_token_len) {
        return 0; /* no token is that long: skip the hash */
    }
    int32_t id = sp__vocab_lookup(t, w->esc + l->off, size);
    if (id < 0) {
        return 0;
    }
    uint64_t key = ((uint64_t)t->rank[id] << (KEY_LEFT_BITS + KEY_SIZE_BITS)) |
                   ((uint64_t)left << KEY_SIZE_BITS) | (uint64_t)(size - 1);
    return sp_heap_u64_push(&w->heap, key);
}

static bool
is_space_mark(const char *p, size_t n)
{
    return n == 3 && memcmp(p, "\xE2\x96\x81", 3) == 0;
}

/* Merge the n_sym symbols of one chunk and emit its tokens. */
static sp_status_t
spm_merge_chunk(const sp_tokenizer_t *t, spm_work_t *w, int32_t n_sym, sp__tok_out_t *o)
{
    spm_symbol_t *sym = w->sym;
    sym[n_sym - 1].next = -1;
    w->heap.n = 0;
    for (int32_t i = 0; i + 1 < n_sym; i++) {
        if (spm_try_bigram(t, w, i)) {
            return SP_ERR_NOMEM;
        }
    }
    while (w->heap.n > 0) {
        uint64_t key = sp_heap_u64_pop(&w->heap);
        int32_t left = (int32_t)((key >> KEY_SIZE_BITS) & ((1u << KEY_LEFT_BITS) - 1));
        uint32_t size = (uint32_t)(key & ((1u << KEY_SIZE_BITS) - 1)) + 1;
        spm_symbol_t *l = &sym[left];
        if (l->n == 0 || l->next < 0 || l->n + sym[l->next].n != size) {
            continue; /* stale: one side merged since this pair was queued */
        }
        spm_symbol_t *r = &sym[l->next];
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) {
            sym[r->next].prev = left;
        }
        if (spm_try_bigram(t, w, l->prev) || spm_try_bigram(t, w, left)) {
            return SP_ERR_NOMEM;
        }
    }

    /* Every merged symbol is a token by construction; a single character that
     * is not one falls back to its bytes. */
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        const spm_symbol_t *s = &sym[i];
        int32_t id = sp__vocab_lookup(t, w->esc + s->off, s->n);
        if (id >= 0) {
            sp__tok_emit(o, id);
            continue;
        }
        for (uint32_t k = 0; k < s->n; k++) {
            int32_t b = t->byte_id[(unsigned char)w->esc[s->off + k]];
            if (b < 0) {
                b = t->unk; /* no byte token; with no unk either the byte is dropped */
            }
            if (b >= 0) {
                sp__tok_emit(o, b);
            }
        }
    }
    return SP_OK;
}

/*
 * Tokenize one run of plain text. When no token of the vocabulary has a U+2581
 * after another character (t->cut_at_space), no merge can cross the start of a
 * word, so the text is merged word by word: the result is the same and the
 * heap stays small and in cache.
 */
static sp_status_t
spm_encode_text(const sp_tokenizer_t *t, spm_work_t *w, const char *text, size_t len, bool prefix,
                sp__tok_out_t *o)
{
    /* Escape: optional dummy-prefix space, every ' ' as U+2581 (E2 96 81). */
    size_t m = 0;
    if (prefix) {
        memcpy(w->esc, "\xE2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->esc + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            w->esc[m++] = text[i];
        }
    }

    int32_t n_sym = 0;
    bool prev_mark = false;
    for (size_t off = 0; off < m;) {
        size_t n = sp_utf8_char_len((const unsigned char *)w->esc + off, m - off);
        bool mark = is_space_mark(w->esc + off, n);
        if (t->cut_at_space && mark && !prev_mark && n_sym > 0) {
            sp_status_t st = spm_merge_chunk(t, w, n_sym, o);
            if (st != SP_OK) {
                return st;
            }
            n_sym = 0;
        }
        w->sym[n_sym] = (spm_symbol_t){n_sym - 1, n_sym + 1, (uint32_t)off, (uint32_t)n};
        n_sym++;
        off += n;
        prev_mark = mark;
    }
    return n_sym > 0 ? spm_merge_chunk(t, w, n_sym, o) : SP_OK;
}

static sp_status_t
spm_tokenize(const sp_tokenizer_t *t, const char *text, const frag_list_t *fr, sp__tok_out_t *o)
{
    sp_status_t st = SP_OK;
    spm_work_t w = {0};
    size_t max_len = 0, bytes;
    for (size_t f = 0; f < fr->n; f++) {
        if (fr->v[f].token < 0 && fr->v[f].len > max_len) {
            max_len = fr->v[f].len;
        }
    }
    if (max_len > 0) {
        size_t esc_bytes = 3 * (max_len + 1); /* max_len < 2^29: no overflow */
        w.esc = sp_malloc(esc_bytes);
        if (w.esc == NULL || sp_mul_size(max_len + 1, sizeof(spm_symbol_t), &bytes) ||
            (w.sym = sp_malloc(bytes)) == NULL) {
            st = SP_ERR_NOMEM;
            goto done;
        }
    }
    /* The dummy prefix goes before text that starts the input or follows a special token. */
    bool prev_special = true;
    for (size_t f = 0; f < fr->n; f++) {
        if (fr->v[f].token >= 0) {
            sp__tok_emit(o, fr->v[f].token);
            prev_special = true;
            continue;
        }
        st = spm_encode_text(t, &w, text + fr->v[f].off, fr->v[f].len,
                             t->add_space_prefix && prev_special, o);
        if (st != SP_OK) {
            goto done;
        }
        prev_special = false;
    }
done:
    sp_free(w.esc);
    sp_free(w.sym);
    sp_heap_u64_free(&w.heap);
    return st;
}

/* ---- public encode / decode -------------------------------------------- */

int64_t
sp_tokenizer_encode(const sp_tokenizer_t *t, const char *text, size_t len, bool add_bos,
                    bool parse_special, int32_t *out, int64_t cap)
{
    if (t == NULL || (text == NULL && len > 0) || cap < 0 || (out == NULL && cap > 0)) {
        return SP_ERR_INVALID;
    }
    if (len > MAX_INPUT_BYTES) {
        return SP_ERR_TOO_LARGE;
    }
    sp__tok_out_t o = {out, cap, 0};
    frag_list_t fr = {0};
    sp_status_t st = split_special(t, text, len, parse_special, &fr);
    if (st != SP_OK) {
        return st;
    }
    /* add_bos is llama.cpp's add_special: BOS, and EOS, as the vocabulary asks. */
    if (add_bos && t->add_bos) {
        sp__tok_emit(&o, t->bos);
    }
    if (t->model == SP_TOK_MODEL_SPM) {
        st = spm_tokenize(t, text, &fr, &o);
    } else {
        for (size_t f = 0; f < fr.n && st == SP_OK; f++) {
            const fragment_t *fg = &fr.v[f];
            if (fg->token >= 0) {
                sp__tok_emit(&o, fg->token);
            } else if (t->model == SP_TOK_MODEL_BPE) {
                st = sp__tok_bpe_encode(t, text + fg->off, fg->len, &o);
            } else if (t->model == SP_TOK_MODEL_UGM) {
                st = sp__tok_ugm_encode(t, text + fg->off, fg->len, &o);
            } else {
                st = sp__tok_wpm_encode(t, text + fg->off, fg->len, &o);
            }
        }
    }
    sp_free(fr.v);
    if (st != SP_OK) {
        return st;
    }
    if (add_bos && t->add_eos) {
        sp__tok_emit(&o, t->eos);
    }
    if (add_bos && t->add_sep) {
        sp__tok_emit(&o, t->sep);
    }
    return o.n;
}

static int32_t
put_piece(const char *p, size_t n, char *buf, int32_t cap)
{
    size_t c = cap > 0 ? (size_t)cap : 0;
    if (buf != NULL && c > 0) {
        memcpy(buf, p, n < c ? n : c);
    }
    return (int32_t)n;
}

static int32_t
put_spaced(sp_str_t s, char *buf, int32_t cap)
{
    int32_t n = 0;
    for (size_t i = 0; i < s.len;) {
        char c;
        if (i + 3 <= s.len && memcmp(s.ptr + i, "\xE2\x96\x81", 3) == 0) {
            c = ' ';
            i += 3;
        } else {
            c = s.ptr[i++];
        }
        if (buf != NULL && n < cap) {
            buf[n] = c;
        }
        n++;
    }
    return n;
}

int32_t
sp_tokenizer_piece(const sp_tokenizer_t *t, int32_t id, bool special, char *buf, int32_t cap)
{
    if (t == NULL || id < 0 || id >= t->n_vocab) {
        return SP_ERR_INVALID;
    }
    sp_str_t s = sp__vocab_text(t, id);
    sp_token_attr_t attr = (sp_token_attr_t)t->attr[id];
    /* What every model type writes the same way. */
    switch (attr) {
    case SP_TOKEN_TYPE_BYTE: {
        char c = (char)t->byte_val[id];
        return put_piece(&c, 1, buf, cap);
    }
    case SP_TOKEN_TYPE_CONTROL:
    case SP_TOKEN_TYPE_UNKNOWN:
        return special ? put_piece(s.ptr, s.len, buf, cap) : 0;
    case SP_TOKEN_TYPE_UNDEFINED:
    case SP_TOKEN_TYPE_UNUSED:
        return 0;
    case SP_TOKEN_TYPE_NORMAL:
    case SP_TOKEN_TYPE_USER_DEFINED:
        break;
    }
    /* Text tokens: each model type has its own spelling of spaces and bytes.
     * User-defined tokens are stored as written, except in WordPiece, whose
     * word-initial U+2581 is the space before the word for them too. */
    switch (t->model) {
    case SP_TOK_MODEL_SPM:
    case SP_TOK_MODEL_UGM:
        return attr == SP_TOKEN_TYPE_USER_DEFINED ? put_piece(s.ptr, s.len, buf, cap)
                                                  : put_spaced(s, buf, cap);
    case SP_TOK_MODEL_BPE:
        if (attr == SP_TOKEN_TYPE_USER_DEFINED) {
            return put_piece(s.ptr, s.len, buf, cap);
        }
        return t->raw_bpe ? put_spaced(s, buf, cap) : sp__tok_bpe_text(t, s, buf, cap);
    case SP_TOK_MODEL_WPM:
        return put_spaced(s, buf, cap);
    }
    return SP_ERR_UNSUPPORTED;
}
