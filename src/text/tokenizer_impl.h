/*
 * tokenizer_impl.h - internals shared by the tokenizer's files (not a public API).
 *
 * tokenizer.c owns loading, the special-token split and dispatch, and is the
 * only file that calls down into the per-model encoders: SPM in tokenizer.c,
 * byte-level BPE in tok_bpe.c, WordPiece in tok_wpm.c, Unigram in tok_ugm.c. The vocabulary's hash
 * map (vocab.c) sits below all of them, so the calls form no circle. The tokenizer is immutable once
 * built, so one instance may be used by any number of threads at once: every
 * encoder keeps its per-call state in locals and per-call heap buffers.
 */
#ifndef SP_TEXT_TOKENIZER_IMPL_H
#define SP_TEXT_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

typedef enum sp_tok_model {
    SP_TOK_MODEL_SPM = 0, /* tokenizer.ggml.model = "llama" */
    SP_TOK_MODEL_BPE = 1, /* "gpt2": byte-level BPE with a regex pre-tokenizer; "gemma4":
                             BPE over raw UTF-8 (see raw_bpe) */
    SP_TOK_MODEL_WPM = 2, /* "bert": WordPiece */
    SP_TOK_MODEL_UGM = 3, /* "t5": Unigram (SentencePiece), precompiled charsmap */
} sp_tok_model_t;

typedef struct sp__tok_bpe sp__tok_bpe_t; /* tok_bpe.c */
typedef struct sp__tok_ugm sp__tok_ugm_t; /* tok_ugm.c */

struct sp_tokenizer {
    sp_tok_model_t model;
    int32_t n_vocab;
    char *blob;         /* all token texts back to back */
    size_t *text_off;   /* (n_vocab + 1) offsets into blob */
    float *scores;      /* (n_vocab) merge priority, higher first (SPM) */
    uint32_t *rank;     /* (n_vocab) dense rank of the score: 0 = highest (SPM) */
    size_t max_token_len; /* bytes of the longest token text */
    bool cut_at_space;  /* no token has U+2581 after another character: words merge alone */
    uint8_t *attr;      /* (n_vocab) sp_token_attr_t */
    uint8_t *byte_val;  /* (n_vocab) the byte a BYTE token stands for */
    int32_t *map;       /* (map_mask + 1) slots: token id or -1; open addressing */
    size_t map_mask;
    int32_t byte_id[256]; /* token for each raw byte (byte fallback), -1 if none */
    int32_t *special;   /* (n_special) ids split out of the text, longest text first */
    int32_t n_special;
    int32_t bos, eos, unk, pad, sep; /* -1 when none; bert: bos is [CLS], sep [SEP] */
    sp_fim_ids_t fim;   /* fill-in-the-middle tokens (fim.c), -1 when none */
    int32_t eog[SP_TOKENIZER_MAX_EOG];
    int n_eog;
    bool add_bos, add_eos, add_sep, add_space_prefix;
    sp__tok_bpe_t *bpe; /* BPE only */
    bool raw_bpe;       /* "gemma4": merges run on raw UTF-8 characters (no GPT-2 byte
                           characters), a space is U+2581 in the vocabulary, a character
                           without a token falls back to its <0xNN> byte tokens */
    sp__tok_ugm_t *ugm; /* UGM only */
};

/* Counts every token but stores only the first cap (the sp_tokenizer_encode contract). */
typedef struct sp__tok_out {
    int32_t *ids;
    int64_t cap;
    int64_t n;
} sp__tok_out_t;

static inline void
sp__tok_emit(sp__tok_out_t *o, int32_t id)
{
    if (o->n < o->cap) {
        o->ids[o->n] = id;
    }
    o->n++;
}

/* The stored text of token id (no bounds check: callers pass ids below n_vocab). */
static inline sp_str_t
sp__vocab_text(const sp_tokenizer_t *t, int32_t id)
{
    sp_str_t s = {t->blob + t->text_off[id], t->text_off[id + 1] - t->text_off[id]};
    return s;
}

/* vocab.c: build the text -> id map over blob/text_off (at load), and look up the
 * id of the token whose text is exactly p[0..n), or -1. */
sp_status_t sp__vocab_build_map(sp_tokenizer_t *t);
int32_t sp__vocab_lookup(const sp_tokenizer_t *t, const char *p, size_t n);
/* fim.c: t->fim from the GGUF's keys, else from the token texts code models
 * use (after the vocabulary map is built). SP_ERR_FORMAT for an id out of range. */
/* An optional special token id from key: absent keeps *id, -1 stored (as INT32 or UINT32)
 * means "none", anything else must be in [0, n_vocab) (a format error naming the key). */
sp_status_t sp__tok_special_id(const sp_gguf_t *g, const char *key, int32_t n_vocab, int32_t *id,
                               char *err, size_t err_len);
sp_status_t sp__tok_read_fim(sp_tokenizer_t *t, const sp_gguf_t *g, char *err, size_t err_len);

/* BPE (tok_bpe.c). init reads tokenizer.ggml.pre and .merges; text has no specials. */
sp_status_t sp__tok_bpe_init(sp_tokenizer_t *t, const sp_gguf_t *g, char *err, size_t err_len);
void sp__tok_bpe_free(sp__tok_bpe_t *b);
sp_status_t sp__tok_bpe_encode(const sp_tokenizer_t *t, const char *text, size_t len,
                               sp__tok_out_t *o);
/* A normal token's text: byte characters back to bytes (sp_tokenizer_piece's contract). */
int32_t sp__tok_bpe_text(const sp_tokenizer_t *t, sp_str_t s, char *buf, int32_t cap);

/* Unigram (tok_ugm.c). init (after the map, scores and attributes) reads
 * the charsmap and the whitespace flags; text has no specials. */
sp_status_t sp__tok_ugm_init(sp_tokenizer_t *t, const sp_gguf_t *g, char *err, size_t err_len);
void sp__tok_ugm_free(sp__tok_ugm_t *u);
sp_status_t sp__tok_ugm_encode(const sp_tokenizer_t *t, const char *text, size_t len,
                               sp__tok_out_t *o);

/* WordPiece (tok_wpm.c). */
sp_status_t sp__tok_wpm_encode(const sp_tokenizer_t *t, const char *text, size_t len,
                               sp__tok_out_t *o);

#endif /* SP_TEXT_TOKENIZER_IMPL_H */
