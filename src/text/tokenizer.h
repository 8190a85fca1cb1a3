/*
 * tokenizer.h - text <-> token ids from a GGUF file's tokenizer.ggml.* metadata.
 *
 * Models (tokenizer.ggml.model): "llama", SentencePiece-style: score-driven
 * merges over UTF-8 characters, "▁" (U+2581) for spaces with the dummy prefix,
 * byte fallback to <0xNN> tokens; "gpt2", byte-level BPE with the
 * pre-tokenizer regexes that tokenizer.ggml.pre names (gpt-2, llama-bpe,
 * qwen2, deepseek-llm, deepseek-coder, falcon, starcoder, command-r, ...),
 * merges ranked by tokenizer.ggml.merges; "bert", WordPiece with BERT's
 * normalizer. Control and user-defined tokens are split out of the text
 * before any of them runs (see sp_tokenizer_encode).
 *
 * Threads: a built tokenizer is read-only; any number of threads may call
 * sp_tokenizer_encode and sp_tokenizer_piece on it at once.
 *
 * The vocabulary is untrusted (RELIABILITY.md G14-G16): element types, counts,
 * special ids, token lengths and <0xNN> spellings are checked at load.
 */
#ifndef SP_TEXT_TOKENIZER_H
#define SP_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "sampan/status.h"

#define SP_TOKEN_MAX_BYTES 1024 /* longest token text accepted from a vocabulary */
#define SP_TOKENIZER_MAX_EOG 16 /* most end-of-generation ids a vocabulary may name */

typedef struct sp_tokenizer sp_tokenizer_t;

typedef enum sp_token_attr {
    SP_TOKEN_TYPE_UNDEFINED = 0,
    SP_TOKEN_TYPE_NORMAL = 1,
    SP_TOKEN_TYPE_UNKNOWN = 2,
    SP_TOKEN_TYPE_CONTROL = 3,
    SP_TOKEN_TYPE_USER_DEFINED = 4,
    SP_TOKEN_TYPE_UNUSED = 5,
    SP_TOKEN_TYPE_BYTE = 6,
} sp_token_attr_t;

/* Build from tokenizer.ggml.* keys. On failure *out is NULL and err names file and key. */
sp_status_t sp_tokenizer_from_gguf(const sp_gguf_t *g, sp_tokenizer_t **out, char *err, size_t err_len);
void sp_tokenizer_destroy(sp_tokenizer_t *t);

int32_t sp_tokenizer_n_vocab(const sp_tokenizer_t *t);
int32_t sp_tokenizer_bos(const sp_tokenizer_t *t); /* -1 when none */
int32_t sp_tokenizer_eos(const sp_tokenizer_t *t); /* -1 when none */
int32_t sp_tokenizer_sep(const sp_tokenizer_t *t); /* [SEP] (WordPiece, Unigram); -1 when none */

/* Fill-in-the-middle tokens (code models), each -1 when the vocabulary has
 * none: prefix, suffix, middle, and the repository / file separators of the
 * repository-level layout. */
typedef struct sp_fim_ids {
    int32_t pre, suf, mid, rep, sep;
} sp_fim_ids_t;
sp_fim_ids_t sp_tokenizer_fim(const sp_tokenizer_t *t);

/* A fill-in-the-middle prompt's parts (fim.c). */
#define SP_FIM_MAX_FILENAME 1024 /* bytes of an extra chunk's file name */
typedef struct sp_fim_chunk {
    const char *filename; /* NULL: "tmp" */
    size_t filename_len;
    const char *text;
    size_t text_len;
} sp_fim_chunk_t;

typedef struct sp_fim_prompt {
    const char *prefix;         /* the text before the hole, or (prefix NULL) */
    size_t prefix_len;
    const int32_t *prefix_ids;  /* its tokens */
    int64_t n_prefix_ids;
    const char *middle;         /* text the middle starts with, after the prefix (or NULL) */
    size_t middle_len;
    const char *suffix;         /* the text after the hole */
    size_t suffix_len;
    bool repo;                  /* the repository-level layout, with extra files (/infill) */
    const sp_fim_chunk_t *extra;
    int n_extra;
} sp_fim_prompt_t;

/*
 * Tokens of a fill-in-the-middle prompt, in llama-server's /infill order:
 *   [repo: REP "myproject\n", per extra chunk SEP "<filename>\n" <text> (no
 *   SEP token: "\n\n--- snippet ---\n\n" <text>), SEP "filename\n"]
 *   [BOS where the vocabulary adds one] PRE <prefix><middle> SUF <suffix> MID
 * Texts are tokenized without special tokens. Writes at most cap ids and
 * returns the total (more than cap: call again with more room), or
 * SP_ERR_UNSUPPORTED when the vocabulary has no prefix, suffix or middle
 * token, SP_ERR_INVALID for a file name over SP_FIM_MAX_FILENAME bytes, or
 * another negative status from the tokenizer.
 */
int64_t sp_fim_encode(const sp_tokenizer_t *t, const sp_fim_prompt_t *p, int32_t *out, int64_t cap);
bool sp_tokenizer_add_bos(const sp_tokenizer_t *t);
bool sp_tokenizer_is_eog(const sp_tokenizer_t *t, int32_t id); /* end of generation (eos, eot, ...) */
/* All end-of-generation ids (at most SP_TOKENIZER_MAX_EOG, each < n_vocab): *n gets
 * their count; the array lives as long as the tokenizer. */
const int32_t *sp_tokenizer_eog(const sp_tokenizer_t *t, int *n);
/* True for a SentencePiece vocabulary that puts a dummy-prefix space in front of
 * the text: the first piece after BOS then starts with a space the text did
 * not have, and a detokenizer that wants the original text drops it. */
bool sp_tokenizer_strips_space(const sp_tokenizer_t *t);

/*
 * Tokenize len bytes of text. add_bos: prepend BOS when the vocabulary asks for
 * it. parse_special: recognise control-token texts ("<s>") in the text; when
 * false they are ordinary text. Writes at most cap ids to out and returns the
 * total number of tokens (which may exceed cap: call again with a bigger
 * buffer), or a negative sp_status_t on error.
 */
int64_t sp_tokenizer_encode(const sp_tokenizer_t *t, const char *text, size_t len, bool add_bos,
                            bool parse_special, int32_t *out, int64_t cap);

/*
 * The bytes token id stands for (spaces restored, <0xNN> as the raw byte,
 * control tokens as "" unless `special`). Returns the byte count (which may be
 * more than cap: nothing past cap is written), or a negative status for a bad id.
 * A piece may be part of a UTF-8 character; streaming callers hold partial
 * sequences back.
 */
int32_t sp_tokenizer_piece(const sp_tokenizer_t *t, int32_t id, bool special, char *buf, int32_t cap);

/*
 * Streaming detokenizer: turns ids into text that never ends inside a UTF-8
 * character. A piece that stops partway through a character (byte tokens, BPE
 * pieces of a multi-byte character) is held back and completed by the next
 * pieces; bytes that cannot start or continue a valid character pass through
 * at once, so invalid output is never held forever. Zero-initialise.
 */
typedef struct sp_detok {
    char held[4]; /* the start of an unfinished character */
    int n_held;
} sp_detok_t;

/*
 * Append id's piece: writes to buf the text that is complete so far and
 * returns its byte count. Needs cap >= d->n_held + the piece's length
 * (SP_TOKEN_MAX_BYTES + 4 always does); when cap is smaller nothing changes
 * and the size needed is returned. Negative status for a bad id.
 */
int32_t sp_detok_push(const sp_tokenizer_t *t, sp_detok_t *d, int32_t id, bool special,
                      char *buf, int32_t cap);
/* End of stream: the held bytes (at most 4, cap must allow them) as they are. */
int32_t sp_detok_flush(sp_detok_t *d, char *buf, int32_t cap);

/* Raw vocabulary text of id (as stored), for inspect and debugging. */
sp_str_t sp_tokenizer_token_text(const sp_tokenizer_t *t, int32_t id);

#endif /* SP_TEXT_TOKENIZER_H */
