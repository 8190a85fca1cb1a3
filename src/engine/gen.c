/*
 * gen.c - one generation: constraint, sampling, log-probabilities, streaming
 * text, stop strings and limits (gen.h has the contract).
 *
 * A step, in order:
 *   1. the sampler's penalties, in place;
 *   2. json_object: tokens whose piece would make the output an invalid JSON
 *      prefix get -inf (the whole vocabulary when sampling or when
 *      log-probabilities are asked for, so the distribution is exactly the
 *      model's renormalised over valid tokens; for greedy without them, the
 *      best tokens are tested one by one, which usually ends at the first);
 *   3. log-probabilities of these logits (log-softmax, before temperature and
 *      truncation, as vLLM reports them by default);
 *   4. the sampler's draw, without its penalties a second time;
 *   5. the token's text through the UTF-8-safe detokenizer, then through the
 *      stop-string matchers; text that could still begin a stop string waits.
 *
 * Stop strings: each has a KMP automaton fed the generated text byte by
 * byte, so a stop string is found however the tokens cut it, in time linear
 * in the text. The generation ends at the first byte where a stop string is
 * complete (the longest one, when several end there); the text is cut at its
 * start. This depends only on the text, never on how it was tokenized. The
 * text held back is the longest partial match, always shorter than the
 * longest stop string, so it never grows.
 *
 * JSON: a byte-level pushdown recogniser (RFC 8259) whose whole state is a
 * small struct, so testing a token is copying the struct and feeding it the
 * piece. Strings take valid UTF-8 only (no overlongs, surrogates or code
 * points past U+10FFFF) and escapes, with \u surrogates in pairs (lone ones
 * are legal JSON but break strict parsers); nesting stops at JSON_MAX_DEPTH;
 * whitespace runs stop at JSON_MAX_WS and numbers at JSON_MAX_NUMBER bytes, so
 * a model cannot loop on spaces or digits. Tokens without text never pass
 * (they would not move the output), so end-of-generation tokens are out until
 * the object closes, and that ends the generation. json_cost gives the bytes
 * that the shortest completion needs; once that nears the tokens left before
 * max_tokens, only tokens that keep the object closable in time pass, so the
 * output is a whole object even when the model would never close it (finish
 * LENGTH then says the budget, not the model, ended it).
 *
 * The tokenizer's internals are read for two facts only: its end-of-generation
 * ids (to mask them in one loop) and whether it adds SentencePiece's dummy
 * prefix (whose space the first word after BOS drops, as `run` always did).
 */
#include "engine/gen.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "core/assert.h"

#define JSON_MAX_DEPTH 64  /* the container stack is one bit per level in a uint64_t */
#define JSON_MAX_WS 20     /* bytes in one whitespace run: a line break, then indentation */
#define JSON_MAX_NUMBER 64 /* bytes; more than any double or 64-bit integer needs */
#define LAZY_TRIES 8       /* greedy JSON: best tokens tested before the full mask */
#define TEXT_CAP (SP_GEN_MAX_STOP_LEN + SP_TOKEN_MAX_BYTES + 16)

/* ---- JSON recogniser ----------------------------------------------------- */

enum json_mode {
    J_START,      /* before the top-level '{' */
    J_OBJ_FIRST,  /* after '{': a key or '}' */
    J_OBJ_KEY,    /* after ',' in an object: a key */
    J_COLON,      /* after a key */
    J_VALUE,      /* after ':' or after ',' in an array */
    J_ARR_FIRST,  /* after '[': a value or ']' */
    J_AFTER,      /* after a value: ',' or the container's close */
    J_STRING,     /* inside a string */
    J_STR_ESC,    /* after a backslash */
    J_STR_HEX,    /* in \uXXXX: sub = digits read, aux = enum hex_kind */
    J_STR_LOW_BS, /* after a high-surrogate escape: its pair's '\' */
    J_STR_LOW_U,  /* its 'u' */
    J_STR_UTF8,   /* inside a multi-byte character: sub = bytes left, aux = range of the next */
    J_NUMBER,     /* sub = enum num_state */
    J_LITERAL,    /* true / false / null: aux = which, sub = bytes matched */
    J_DONE,       /* after the top-level '}': whitespace only */
};

enum hex_kind { HEX_ANY, HEX_ANY_D, HEX_HIGH, HEX_LOW };
enum num_state { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const json_literal[3] = {"true", "false", "null"};
static const unsigned char json_literal_len[3] = {4, 5, 4};

typedef struct json_state {
    uint64_t arrays; /* bit d-1 set: the container at depth d is an array */
    uint8_t depth;   /* open containers */
    uint8_t mode;    /* enum json_mode */
    uint8_t sub, aux;
    uint8_t ws;      /* bytes in the current whitespace run */
    uint8_t nl;      /* line break in it: bit 1 '\n', bit 2 '\r' */
    uint8_t num_len; /* bytes of the current number */
    uint8_t is_key;  /* the open string is an object key */
} json_state_t;

static bool
is_ws(unsigned c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int
hex_val(unsigned c)
{
    if (c >= '0' && c <= '9') {
        return (int)(c - '0');
    }
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10) : -1;
}

static bool
json_open(json_state_t *s, bool array)
{
    if (s->depth >= JSON_MAX_DEPTH) {
        return false;
    }
    uint64_t bit = (uint64_t)1 << s->depth;
    s->arrays = array ? s->arrays | bit : s->arrays & ~bit;
    s->depth++;
    s->mode = array ? J_ARR_FIRST : J_OBJ_FIRST;
    return true;
}

static bool
json_top_is_array(const json_state_t *s)
{
    return s->depth > 0 && ((s->arrays >> (s->depth - 1)) & 1);
}

static bool
json_close(json_state_t *s, bool array)
{
    if (s->depth == 0 || json_top_is_array(s) != array) {
        return false;
    }
    s->depth--;
    s->mode = s->depth == 0 ? J_DONE : J_AFTER;
    return true;
}

/* The first byte of a value (J_VALUE, J_ARR_FIRST). */
static bool
json_value_start(json_state_t *s, unsigned c)
{
    switch (c) {
    case '"':
        s->mode = J_STRING;
        s->is_key = 0;
        return true;
    case '{':
        return json_open(s, false);
    case '[':
        return json_open(s, true);
    case 't':
    case 'f':
    case 'n':
        s->mode = J_LITERAL;
        s->aux = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->sub = 1;
        return true;
    case '-':
        s->mode = J_NUMBER;
        s->sub = N_MINUS;
        s->num_len = 1;
        return true;
    default:
        if (c >= '0' && c <= '9') { /* numbers start and end inside a container */
            s->mode = J_NUMBER;
            s->sub = c == '0' ? N_ZERO : N_INT;
            s->num_len = 1;
            return true;
        }
        return false;
    }
}

/* One more number byte; false when c does not continue the number. */
static bool
json_number_byte(json_state_t *s, unsigned c)
{
    bool digit = c >= '0' && c <= '9';
    uint8_t next;
    switch ((enum num_state)s->sub) {
    case N_MINUS:
        if (!digit) return false;
        next = c == '0' ? N_ZERO : N_INT;
        break;
    case N_ZERO:
        if (c == '.') next = N_DOT;
        else if (c == 'e' || c == 'E') next = N_E;
        else return false;
        break;
    case N_INT:
        if (digit) next = N_INT;
        else if (c == '.') next = N_DOT;
        else if (c == 'e' || c == 'E') next = N_E;
        else return false;
        break;
    case N_DOT:
        if (!digit) return false;
        next = N_FRAC;
        break;
    case N_FRAC:
        if (digit) next = N_FRAC;
        else if (c == 'e' || c == 'E') next = N_E;
        else return false;
        break;
    case N_E:
        if (c == '+' || c == '-') next = N_ESIGN;
        else if (digit) next = N_EXP;
        else return false;
        break;
    case N_ESIGN:
    case N_EXP:
        if (!digit) return false;
        next = N_EXP;
        break;
    default:
        return false;
    }
    /* the cap never strands a number that still needs a digit */
    bool open = next == N_DOT || next == N_E || next == N_ESIGN;
    if (s->num_len + (open ? 2 : 1) > JSON_MAX_NUMBER) {
        return false;
    }
    s->num_len++;
    s->sub = next;
    return true;
}

/* Feed one byte; false (state undefined) when it makes the text an invalid prefix. */
static bool
json_feed(json_state_t *s, unsigned c)
{
    switch ((enum json_mode)s->mode) {
    case J_STRING:
        if (c == '"') {
            s->mode = s->is_key ? J_COLON : J_AFTER;
            return true;
        }
        if (c == '\\') {
            s->mode = J_STR_ESC;
            return true;
        }
        if (c < 0x20) {
            return false; /* control characters must be escaped */
        }
        if (c >= 0x80) {
            int need = sp_utf8_lead(c, &s->aux);
            if (need == 0) {
                return false;
            }
            s->sub = (uint8_t)need;
            s->mode = J_STR_UTF8;
        }
        return true;
    case J_STR_UTF8:
        if (!sp_utf8_cont_ok(s->aux, c)) {
            return false;
        }
        s->aux = 0;
        if (--s->sub == 0) {
            s->mode = J_STRING;
        }
        return true;
    case J_STR_ESC:
        if (c == 'u') {
            s->mode = J_STR_HEX;
            s->sub = 0;
            s->aux = HEX_ANY;
            return true;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
            c == 't') {
            s->mode = J_STRING;
            return true;
        }
        return false;
    case J_STR_HEX: {
        int v = hex_val(c);
        if (v < 0) {
            return false;
        }
        if (s->sub == 0) {
            if (s->aux == HEX_LOW && v != 0xD) {
                return false;
            }
            if (s->aux == HEX_ANY && v == 0xD) {
                s->aux = HEX_ANY_D;
            }
        } else if (s->sub == 1) {
            if (s->aux == HEX_LOW && v < 0xC) {
                return false; /* the pair of a high surrogate must be DC00-DFFF */
            }
            if (s->aux == HEX_ANY_D) {
                if (v >= 0xC) {
                    return false; /* a low surrogate without its high half */
                }
                s->aux = v >= 0x8 ? HEX_HIGH : HEX_ANY;
            }
        }
        if (++s->sub == 4) {
            s->mode = s->aux == HEX_HIGH ? J_STR_LOW_BS : J_STRING;
        }
        return true;
    }
    case J_STR_LOW_BS:
        if (c != '\\') {
            return false;
        }
        s->mode = J_STR_LOW_U;
        return true;
    case J_STR_LOW_U:
        if (c != 'u') {
            return false;
        }
        s->mode = J_STR_HEX;
        s->sub = 0;
        s->aux = HEX_LOW;
        return true;
    case J_LITERAL:
        if (c != (unsigned char)json_literal[s->aux][s->sub]) {
            return false;
        }
        if (++s->sub == json_literal_len[s->aux]) {
            s->mode = J_AFTER;
        }
        return true;
    case J_NUMBER:
        if (json_number_byte(s, c)) {
            return true;
        }
        if (s->sub != N_ZERO && s->sub != N_INT && s->sub != N_FRAC && s->sub != N_EXP) {
            return false; /* "-", "1.", "1e", "1e+" cannot end a number */
        }
        s->mode = J_AFTER; /* the number ended; c belongs to what follows */
        return json_feed(s, c);
    default:
        break;
    }

    /* Structural modes: whitespace, counted per run, is allowed between tokens
 * (the run counters were reset by the non-whitespace byte before it). */
    if (is_ws(c)) {
        /* A run is an optional line break ("\n" or "\r\n") and then spaces
         * and tabs: no blank lines, no trailing spaces before a break. */
        if (c == '\r' && s->ws > 0) {
            return false;
        }
        if (c == '\n' && s->ws != (s->nl == 2 ? 1 : 0)) {
            return false;
        }
        if ((c == ' ' || c == '\t') && s->nl == 2) {
            return false; /* '\r' only before '\n' */
        }
        s->nl |= c == '\n' ? 1 : c == '\r' ? 2 : 0;
        return ++s->ws <= JSON_MAX_WS;
    }
    s->ws = 0;
    s->nl = 0;
    switch ((enum json_mode)s->mode) {
    case J_START:
        return c == '{' && json_open(s, false);
    case J_OBJ_FIRST:
        if (c == '}') {
            return json_close(s, false);
        }
        /* fall through */
    case J_OBJ_KEY:
        if (c != '"') {
            return false;
        }
        s->mode = J_STRING;
        s->is_key = 1;
        return true;
    case J_COLON:
        if (c != ':') {
            return false;
        }
        s->mode = J_VALUE;
        return true;
    case J_ARR_FIRST:
        if (c == ']') {
            return json_close(s, true);
        }
        return json_value_start(s, c);
    case J_VALUE:
        return json_value_start(s, c);
    case J_AFTER:
        if (c == ',') {
            s->mode = json_top_is_array(s) ? J_VALUE : J_OBJ_KEY;
            return true;
        }
        if (c == '}' || c == ']') {
            return json_close(s, c == ']');
        }
        return false;
    default: /* J_DONE: only whitespace */
        return false;
    }
}

static bool
json_feed_all(json_state_t *s, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!json_feed(s, p[i])) {
            return false;
        }
    }
    return true;
}

/*
 * Bytes in the shortest text that completes the object from s: a missing key
 * or value as "" and 0, escapes and characters finished, then one '}' or ']'
 * per open container. Every state has a next byte that lowers this by exactly
 * one, so a generation with single-byte tokens for those bytes (CLOSE_BYTES)
 * and at least this many tokens left can always finish the object.
 */
static int
json_cost(const json_state_t *s)
{
    int d = s->depth;
    int str = 1 + (s->is_key ? 2 : 0) + d; /* '"', for a key ":0", then the closers */
    switch ((enum json_mode)s->mode) {
    case J_START: return 2;
    case J_OBJ_FIRST:
    case J_ARR_FIRST:
    case J_AFTER: return d;
    case J_OBJ_KEY: return 4 + d;
    case J_COLON: return 2 + d;
    case J_VALUE: return 1 + d;
    case J_STRING: return str;
    case J_STR_ESC: return 1 + str;
    case J_STR_HEX: return 4 - s->sub + (s->aux == HEX_HIGH ? 6 : 0) + str;
    case J_STR_LOW_BS: return 6 + str;
    case J_STR_LOW_U: return 5 + str;
    case J_STR_UTF8: return s->sub + str;
    case J_NUMBER:
        return (s->sub == N_ZERO || s->sub == N_INT || s->sub == N_FRAC || s->sub == N_EXP ? 0 : 1) + d;
    case J_LITERAL: return json_literal_len[s->aux] - s->sub + d;
    case J_DONE: return 0;
    }
    return 0;
}

/* The bytes of the shortest completions (json_cost), besides UTF-8 continuations. */
static const char CLOSE_BYTES[] = "{}]\":0\\nudcrueals";

/* ---- the vocabulary as the recogniser sees it ---------------------------- */

enum { PIECE_STR_SAFE = 1 }; /* complete valid UTF-8, no '"', '\', control: any string takes it */

/*
 * The pieces sorted byte-wise (a trie laid flat): with the length each shares
 * with the one before, a walk over the sorted list feeds every distinct
 * prefix once and skips, in O(1) each, all pieces below a prefix that failed.
 * Inside a string most pieces are string-safe and valid as they are, so a
 * second list holds only the others (quotes, backslashes, control bytes,
 * parts of characters) and the walk there is short.
 */
typedef struct sorted_piece {
    int32_t id;
    uint32_t off;   /* the piece is bytes[off .. off + len) */
    uint16_t len;
    uint16_t lcp;   /* bytes it shares with the piece before it in its list */
    uint8_t flags;  /* PIECE_* */
} sorted_piece_t;

struct sp_gen_vocab {
    const sp_tokenizer_t *tok;
    int32_t n_vocab;
    uint32_t *off;           /* (n_vocab + 1) piece of id = bytes[off[id] .. off[id+1]) */
    unsigned char *bytes;
    sorted_piece_t *all;     /* (n_vocab) every piece, byte-wise order, empty ones first */
    sorted_piece_t *unsafe;  /* (n_unsafe) the pieces that are not PIECE_STR_SAFE, same order */
    int32_t n_unsafe;
    bool can_close;          /* single-byte tokens for every byte a shortest completion uses */
    bool single[256];        /* byte b is the whole piece of some token */
};

/* True when p[0..n) is whole valid UTF-8 characters that a JSON string may hold raw. */
static bool
string_safe(const unsigned char *p, size_t n)
{
    json_state_t s = {.mode = J_STRING, .depth = 1}; /* a value string in an object */
    return json_feed_all(&s, p, n) && s.mode == J_STRING;
}

typedef struct piece_ref {
    uint64_t key; /* the first 8 bytes, big-endian, zero-padded: most comparisons end here */
    const unsigned char *p;
    uint32_t len;
    int32_t id;
} piece_ref_t;

static int
piece_cmp(const void *a, const void *b)
{
    const piece_ref_t *x = a, *y = b;
    if (x->key != y->key) {
        return x->key < y->key ? -1 : 1;
    }
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c != 0) {
        return c;
    }
    if (x->len != y->len) {
        return x->len < y->len ? -1 : 1;
    }
    return x->id < y->id ? -1 : x->id > y->id;
}

/*
 * Sort the pieces: an LSD radix sort on the 8-byte keys (eight stable passes,
 * a pass skipped when all keys share that byte), then the comparison sort
 * only inside runs of equal keys (pieces alike in their first 8 bytes). A
 * plain qsort of 150k pieces takes tens of milliseconds; this a few.
 */
static void
sort_pieces(piece_ref_t *refs, piece_ref_t *tmp, int32_t n)
{
    for (int shift = 0; shift < 64; shift += 8) {
        int32_t count[257] = {0};
        for (int32_t i = 0; i < n; i++) {
            count[((refs[i].key >> shift) & 0xff) + 1]++;
        }
        if (count[((refs[0].key >> shift) & 0xff) + 1] == n) {
            continue; /* one bucket: the order stays */
        }
        for (int b = 0; b < 256; b++) {
            count[b + 1] += count[b];
        }
        for (int32_t i = 0; i < n; i++) {
            tmp[count[(refs[i].key >> shift) & 0xff]++] = refs[i];
        }
        memcpy(refs, tmp, (size_t)n * sizeof(piece_ref_t));
    }
    for (int32_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && refs[j].key == refs[i].key; j++) {
        }
        if (j - i > 1) {
            qsort(refs + i, (size_t)(j - i), sizeof(piece_ref_t), piece_cmp);
        }
    }
}

static uint16_t
common_prefix(const unsigned char *a, uint32_t na, const unsigned char *b, uint32_t nb)
{
    uint32_t k = 0, m = na < nb ? na : nb;
    while (k < m && a[k] == b[k]) {
        k++;
    }
    return (uint16_t)k;
}

void
sp_gen_vocab_destroy(sp_gen_vocab_t *v)
{
    if (v == NULL) {
        return;
    }
    sp_free(v->off);
    sp_free(v->bytes);
    sp_free(v->all);
    sp_free(v->unsafe);
    sp_free(v);
}

sp_status_t
sp_gen_vocab_create(const sp_tokenizer_t *tok, sp_gen_vocab_t **out, char *err, size_t err_len)
{
    *out = NULL;
    int32_t n = sp_tokenizer_n_vocab(tok);
    piece_ref_t *refs = NULL, *tmp = NULL;
    sp_gen_vocab_t *v = sp_calloc(1, sizeof(*v));
    if (v == NULL) {
        goto nomem;
    }
    v->tok = tok;
    v->n_vocab = n;
    v->off = sp_calloc((size_t)n + 1, sizeof(uint32_t));
    /* n < 2^24 (the tokenizer's limit): these products cannot overflow; no
     * zeroing, every element is written before it is read */
    v->all = sp_malloc((size_t)n * sizeof(sorted_piece_t) + 1);
    refs = sp_malloc((size_t)n * sizeof(piece_ref_t) + 1);
    tmp = sp_malloc((size_t)n * sizeof(piece_ref_t) + 1);
    if (v->off == NULL || v->all == NULL || refs == NULL || tmp == NULL) {
        goto nomem;
    }
    /* Sizes first, then the bytes. Pieces are at most SP_TOKEN_MAX_BYTES each
     * (the tokenizer checks token lengths at load), so uint16 holds any length. */
    uint64_t total = 0;
    for (int32_t id = 0; id < n; id++) {
        int32_t k = sp_tokenizer_piece(tok, id, false, NULL, 0);
        if (k > SP_TOKEN_MAX_BYTES) {
            sp_free(refs);
            sp_free(tmp);
            sp_gen_vocab_destroy(v);
            return sp_errf(err, err_len, SP_ERR_FORMAT, "gen: token %d: piece of %d bytes",
                           (int)id, (int)k);
        }
        v->off[id] = (uint32_t)total;
        total += k > 0 ? (uint64_t)k : 0;
    }
    if (total > UINT32_MAX) {
        sp_free(refs);
        sp_free(tmp);
        sp_gen_vocab_destroy(v);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "gen: vocabulary pieces exceed 4 GiB");
    }
    v->off[n] = (uint32_t)total;
    v->bytes = sp_malloc(total > 0 ? (size_t)total : 1);
    if (v->bytes == NULL) {
        goto nomem;
    }
    for (int32_t id = 0; id < n; id++) {
        uint32_t len = v->off[id + 1] - v->off[id];
        unsigned char *p = v->bytes + v->off[id];
        uint64_t key = 0;
        if (len > 0) {
            sp_tokenizer_piece(tok, id, false, (char *)p, (int32_t)len);
        }
        for (uint32_t i = 0; i < 8; i++) {
            key = key << 8 | (i < len ? p[i] : 0);
        }
        refs[id] = (piece_ref_t){key, p, len, id};
    }
    if (n > 0) {
        sort_pieces(refs, tmp, n);
    }

    /* The sorted list, its unsafe sub-list, and what closing an object needs. */
    bool single[256] = {false}, partial = false;
    for (int32_t i = 0; i < n; i++) {
        const piece_ref_t *r = &refs[i];
        uint8_t flags = r->len > 0 && string_safe(r->p, r->len) ? PIECE_STR_SAFE : 0;
        uint16_t lcp = i > 0 ? common_prefix(r->p, r->len, refs[i - 1].p, refs[i - 1].len) : 0;
        v->all[i] = (sorted_piece_t){r->id, (uint32_t)(r->p - v->bytes), (uint16_t)r->len, lcp,
                                     flags};
        v->n_unsafe += !flags;
        if (r->len > 0) {
            single[r->p[0]] |= r->len == 1;
        }
        for (uint32_t k = 0; k < r->len && !flags; k++) {
            partial |= r->p[k] >= 0x80; /* maybe part of a character */
        }
    }
    v->unsafe = sp_malloc((size_t)v->n_unsafe * sizeof(sorted_piece_t) + 1);
    if (v->unsafe == NULL) {
        goto nomem;
    }
    for (int32_t i = 0, m = 0; i < n; i++) {
        if (!v->all[i].flags) {
            sorted_piece_t sp = v->all[i];
            const sorted_piece_t *prev = m > 0 ? &v->unsafe[m - 1] : NULL;
            sp.lcp = prev ? common_prefix(v->bytes + sp.off, sp.len, v->bytes + prev->off, prev->len)
                          : 0;
            v->unsafe[m++] = sp;
        }
    }
    memcpy(v->single, single, sizeof single);
    v->can_close = true;
    for (const char *c = CLOSE_BYTES; *c; c++) {
        v->can_close &= single[(unsigned char)*c];
    }
    for (int c = 0x80; partial && c <= 0xBF; c++) {
        v->can_close &= single[c];
    }
    sp_free(refs);
    sp_free(tmp);
    *out = v;
    return SP_OK;
nomem:
    sp_free(refs);
    sp_free(tmp);
    sp_gen_vocab_destroy(v);
    return sp_errf(err, err_len, SP_ERR_NOMEM, "gen: out of memory for the pieces of %d tokens",
                   (int)n);
}

/* ---- the generation ------------------------------------------------------ */

typedef struct stop_str {
    char text[SP_GEN_MAX_STOP_LEN + 1];
    int16_t fail[SP_GEN_MAX_STOP_LEN]; /* KMP: longest proper border of text[0..i] */
    int len;
    int state;                         /* bytes of text matched at the end of the output */
} stop_str_t;

struct sp_gen {
    const sp_tokenizer_t *tok;
    sp_gen_params_t p;
    int32_t n_vocab;
    sp_sampler_t *smp;
    sp_detok_t detok;
    bool strip_space;   /* SentencePiece dummy prefix: drop the space of the first piece after BOS */
    int32_t bos;
    int32_t prev;       /* the last token of the context (-1: none yet) */
    int32_t n_gen;
    bool over;          /* finished or failed: no more steps */
    char error[160];

    stop_str_t stop[SP_GEN_MAX_STOP];
    int n_stop;
    int stop_hit;       /* the stop string that ended the generation, or -1 */

    char piece[SP_TOKEN_MAX_BYTES + 8]; /* this step's complete text from the detokenizer */
    char held[TEXT_CAP];                /* text not released yet (a possible stop start) */
    size_t n_held;
    char text[TEXT_CAP];                /* text released by this step */
    size_t n_text;

    json_state_t json;
    json_state_t walk[SP_TOKEN_MAX_BYTES + 1]; /* json_mask_all's prefix states */
    bool forced;        /* the token budget removed a token the model could have chosen */
    const sp_gen_vocab_t *vocab;
    sp_gen_vocab_t *own_vocab;

    sp_gmatch_t *gm;                           /* grammar: its matcher (NULL: no grammar) */
    sp_gstate_t gwalk[SP_TOKEN_MAX_BYTES + 1]; /* grammar_mask_all's prefix states */
    uint64_t *g_bits;   /* (n_vocab bits) the valid tokens of a state, while walking */
    bool g_can_close;   /* every byte set of the grammar has a single-byte token */
    bool g_strip;       /* this step's pieces lose a leading space (the dummy prefix) */

    /* reasoning budget (th_on): where the text is, relative to thinking parts */
    bool th_on;
    int th_state;       /* enum think_state */
    int32_t th_left;    /* TH_IN: generated tokens the part may still take */
    int32_t th_pos;     /* TH_FORCE: the next think_force token */
    int32_t th_forced;  /* tokens forced in all */
    stop_str_t th_open, th_close; /* the markers' text matchers (the stop-string automaton) */
};

enum think_state {
    TH_OUT,   /* outside thinking: watching for the open marker */
    TH_IN,    /* inside, counting the budget down, watching for the close marker */
    TH_WAIT,  /* budget spent in the middle of a character or of the close
                 marker: letting the model finish it first */
    TH_FORCE, /* emitting think_force */
};

sp_gen_params_t
sp_gen_default_params(void)
{
    sp_gen_params_t p;
    memset(&p, 0, sizeof p);
    p.sampling = sp_sampler_default_params();
    p.max_tokens = 16;
    p.top_logprobs = -1;
    p.reasoning_budget = -1;
    return p;
}

static void
stop_init(stop_str_t *s, const char *text, size_t len)
{
    memcpy(s->text, text, len);
    s->text[len] = '\0';
    s->len = (int)len;
    s->state = 0;
    s->fail[0] = 0;
    for (int i = 1, k = 0; i < s->len; i++) {
        while (k > 0 && s->text[i] != s->text[k]) {
            k = s->fail[k - 1];
        }
        if (s->text[i] == s->text[k]) {
            k++;
        }
        s->fail[i] = (int16_t)k;
    }
}

sp_status_t
sp_gen_create(const sp_tokenizer_t *tok, const sp_gen_params_t *p, sp_gen_t **out, char *err,
              size_t err_len)
{
    *out = NULL;
    if (tok == NULL || p == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "gen: no tokenizer or parameters");
    }
    if (p->max_tokens <= 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "gen: max_tokens %d must be > 0",
                       (int)p->max_tokens);
    }
    if (p->top_logprobs > SP_GEN_MAX_TOP_LOGPROBS) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "gen: top_logprobs %d must be at most %d",
                       (int)p->top_logprobs, SP_GEN_MAX_TOP_LOGPROBS);
    }
    if (p->n_stop < 0 || p->n_stop > SP_GEN_MAX_STOP) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "gen: n_stop %d must be in [0, %d]",
                       p->n_stop, SP_GEN_MAX_STOP);
    }
    int n_stop = p->n_stop;
    if (n_stop == 0) {
        while (n_stop < SP_GEN_MAX_STOP && p->stop[n_stop] != NULL) {
            n_stop++;
        }
    }
    for (int i = 0; i < n_stop; i++) {
        const char *s = p->stop[i];
        size_t len = s ? strnlen(s, SP_GEN_MAX_STOP_LEN + 1) : 0;
        if (s == NULL || len == 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "gen: stop[%d] is empty", i);
        }
        if (len > SP_GEN_MAX_STOP_LEN) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "gen: stop[%d] is longer than %d bytes",
                           i, SP_GEN_MAX_STOP_LEN);
        }
        if (sp_utf8_invalid_at(s, len) != len) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "gen: stop[%d] is not valid UTF-8", i);
        }
    }
    if (p->json_object && p->grammar != NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "gen: json_object and a grammar cannot be used together");
    }
    bool th_on = p->reasoning_budget >= 0 && p->n_think_force > 0;
    if (p->n_think_force < 0 || p->n_think_force > SP_GEN_MAX_THINK_FORCE) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "gen: n_think_force %d must be in [0, %d]",
                       (int)p->n_think_force, SP_GEN_MAX_THINK_FORCE);
    }
    if (th_on) {
        int32_t nv = sp_tokenizer_n_vocab(tok);
        for (int32_t i = 0; i < p->n_think_force; i++) {
            if (p->think_force[i] < 0 || p->think_force[i] >= nv) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "gen: think_force[%d] = %d is outside the vocabulary", (int)i,
                               (int)p->think_force[i]);
            }
        }
        size_t lo = strnlen(p->think_open, sizeof p->think_open);
        size_t lc = strnlen(p->think_close, sizeof p->think_close);
        if (lo > SP_GEN_MAX_THINK_TAG || lc > SP_GEN_MAX_THINK_TAG || lc == 0 ||
            (lo == 0 && !p->think_in_prompt)) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "gen: a reasoning budget needs its close marker (and an open one unless "
                           "the prompt opens the part), each at most %d bytes",
                           SP_GEN_MAX_THINK_TAG);
        }
    }
    if (p->vocab != NULL && p->vocab->tok != tok) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "gen: vocab was built for another tokenizer");
    }

    sp_gen_t *g = sp_calloc(1, sizeof(*g));
    if (g == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "gen: out of memory");
    }
    g->tok = tok;
    g->p = *p;
    g->n_vocab = sp_tokenizer_n_vocab(tok);
    sp_status_t st = sp_sampler_create(&p->sampling, g->n_vocab, &g->smp, err, err_len);
    if (st != SP_OK) {
        sp_gen_destroy(g); /* err already names the sampling parameter */
        return st;
    }
    for (int i = 0; i < n_stop; i++) {
        stop_init(&g->stop[i], p->stop[i], strlen(p->stop[i]));
        g->p.stop[i] = g->stop[i].text; /* the caller's strings need not outlive create */
    }
    for (int i = n_stop; i < SP_GEN_MAX_STOP; i++) {
        g->p.stop[i] = NULL;
    }
    g->n_stop = g->p.n_stop = n_stop;
    g->stop_hit = -1;
    g->strip_space = sp_tokenizer_strips_space(tok);
    g->bos = sp_tokenizer_bos(tok);
    g->prev = -1;
    g->th_on = th_on;
    if (th_on) {
        stop_init(&g->th_open, p->think_open, strlen(p->think_open));
        stop_init(&g->th_close, p->think_close, strlen(p->think_close));
        g->th_state = TH_OUT;
        if (p->think_in_prompt) {
            g->th_state = p->reasoning_budget > 0 ? TH_IN : TH_FORCE;
            g->th_left = p->reasoning_budget;
        }
    }
    if (p->json_object || p->grammar != NULL) {
        g->vocab = p->vocab;
        if (g->vocab == NULL) {
            st = sp_gen_vocab_create(tok, &g->own_vocab, err, err_len);
            if (st != SP_OK) {
                sp_gen_destroy(g);
                return st;
            }
            g->vocab = g->own_vocab;
        }
        g->json.mode = J_START;
    }
    if (p->grammar != NULL) {
        st = sp_gmatch_create(p->grammar, &g->gm, err, err_len);
        g->g_bits = st == SP_OK ? sp_malloc(((size_t)g->n_vocab + 63) / 64 * 8) : NULL;
        if (st == SP_OK && g->g_bits == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "gen: out of memory");
        }
        if (st != SP_OK) {
            sp_gen_destroy(g);
            return st;
        }
        g->g_can_close = !sp_grammar_needs_byte_outside(p->grammar, g->vocab->single);
    }
    *out = g;
    return SP_OK;
}

void
sp_gen_destroy(sp_gen_t *g)
{
    if (g == NULL) {
        return;
    }
    sp_sampler_destroy(g->smp);
    sp_gen_vocab_destroy(g->own_vocab);
    sp_gmatch_destroy(g->gm);
    sp_free(g->g_bits);
    sp_free(g);
}

void
sp_gen_accept_prompt(sp_gen_t *g, const int32_t *tokens, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        sp_sampler_accept(g->smp, tokens[i]);
    }
    if (n > 0) {
        g->prev = tokens[n - 1];
    }
}

bool
sp_gen_step_is_private(const sp_gen_t *g)
{
    return !g->p.json_object && g->gm == NULL;
}

int32_t
sp_gen_n_generated(const sp_gen_t *g)
{
    return g->n_gen;
}

int32_t
sp_gen_n_forced(const sp_gen_t *g)
{
    return g->th_forced;
}

int
sp_gen_stop_index(const sp_gen_t *g)
{
    return g->stop_hit;
}

const char *
sp_gen_error(const sp_gen_t *g)
{
    return g->error;
}

static sp_status_t
fail(sp_gen_t *g, sp_status_t st, const char *msg)
{
    snprintf(g->error, sizeof g->error, "gen: %s", msg);
    g->over = true;
    return st;
}

/* ---- step: constraint ---------------------------------------------------- */

/*
 * -inf for every token whose piece the JSON state does not accept, or (budget
 * >= 0) that leaves a state needing more than `budget` further tokens to close.
 * One walk over the sorted pieces: walk[d] is the state after the first d
 * bytes of the current piece, valid up to `have`; a piece that shares a
 * failed prefix (`dead` bytes) fails without being fed. Inside a string,
 * when string-safe pieces fit the budget (they leave the cost as it is),
 * only the unsafe list is walked.
 */
static void
json_mask_all(sp_gen_t *g, float *logits, int budget)
{
    const sp_gen_vocab_t *v = g->vocab;
    json_state_t *walk = g->walk;
    walk[0] = g->json;
    bool fits_now = budget < 0 || json_cost(&walk[0]) <= budget;
    bool short_walk = walk[0].mode == J_STRING && fits_now;
    const sorted_piece_t *list = short_walk ? v->unsafe : v->all;
    int32_t n = short_walk ? v->n_unsafe : v->n_vocab;
    int have = 0, dead = 0;
    for (int32_t i = 0; i < n; i++) {
        const sorted_piece_t *sp = &list[i];
        int32_t id = sp->id;
        int lcp = sp->lcp, len = sp->len;
        have = have < lcp ? have : lcp;
        dead = dead > 0 && lcp >= dead ? dead : 0;
        if (len == 0 || dead > 0) {
            logits[id] = -INFINITY; /* no text never moves the output; or a dead prefix */
            continue;
        }
        if (logits[id] == -INFINITY) {
            continue;
        }
        bool valid = true, fits;
        if (walk[0].mode == J_STRING && (sp->flags & PIECE_STR_SAFE)) {
            fits = fits_now; /* false here: short_walk would have skipped it */
        } else {
            const unsigned char *p = v->bytes + sp->off;
            for (int d = have; d < len; d++) {
                walk[d + 1] = walk[d];
                if (!json_feed(&walk[d + 1], p[d])) {
                    dead = d + 1;
                    valid = false;
                    break;
                }
                have = d + 1;
            }
            fits = valid && (budget < 0 || json_cost(&walk[len]) <= budget);
        }
        if (!valid || !fits) {
            g->forced |= valid;
            logits[id] = -INFINITY;
        }
    }
}

/* 1: the piece of id continues the object within the budget; 0: it does not;
 * -1: it would, but the budget forbids it. */
static int
json_accepts(const sp_gen_t *g, int32_t id, int budget)
{
    const sp_gen_vocab_t *v = g->vocab;
    uint32_t len = v->off[id + 1] - v->off[id];
    json_state_t t = g->json;
    if (len == 0 || (!g->p.ignore_eos && sp_tokenizer_is_eog(g->tok, id)) ||
        !json_feed_all(&t, v->bytes + v->off[id], len)) {
        return 0;
    }
    return budget < 0 || json_cost(&t) <= budget ? 1 : -1;
}

/* ---- step: grammar constraint -------------------------------------------- */

/* The bytes the grammar sees for token id: its piece, less the dummy-prefix
 * space the text drops on the first step after BOS. */
static void
grammar_piece(const sp_gen_t *g, int32_t id, const unsigned char **p, uint32_t *len)
{
    const sp_gen_vocab_t *v = g->vocab;
    *p = v->bytes + v->off[id];
    *len = v->off[id + 1] - v->off[id];
    if (g->g_strip && *len > 0 && (*p)[0] == ' ') {
        (*p)++, (*len)--;
    }
}

/* As json_accepts, for the grammar (end-of-generation tokens: may_end). */
static int
grammar_accepts(sp_gen_t *g, int32_t id, int budget, bool may_end)
{
    if (!g->p.ignore_eos && sp_tokenizer_is_eog(g->tok, id)) {
        return may_end ? 1 : 0;
    }
    const unsigned char *p;
    uint32_t len;
    grammar_piece(g, id, &p, &len);
    sp_gstate_t s = sp_gmatch_state(g->gm);
    for (uint32_t i = 0; i < len && s != SP_GSTATE_DEAD; i++) {
        s = sp_gmatch_feed(g->gm, s, p[i]);
    }
    if (len == 0 || s == SP_GSTATE_DEAD) {
        return 0;
    }
    return budget < 0 || sp_gmatch_cost(g->gm, s) <= (uint32_t)budget ? 1 : -1;
}

/*
 * -inf for every token the grammar refuses from the current state (or, with
 * budget >= 0, that leaves more than `budget` bytes to the shortest end).
 * The same sorted walk as json_mask_all, over matcher states: a distinct
 * prefix is one cached transition. The valid set depends on the state alone,
 * so the walk records it (with the largest cost a valid token leads to) in
 * the matcher's small mask cache: a state seen again (inside a string, a run
 * of digits) costs one pass over a bit array, unless the budget could bind.
 * End-of-generation tokens are the caller's.
 */
static void
grammar_mask_all(sp_gen_t *g, float *logits, int budget)
{
    const sp_gen_vocab_t *v = g->vocab;
    sp_gmatch_t *m = g->gm;
    sp_gstate_t s0 = sp_gmatch_state(m);
    int32_t n = v->n_vocab;
    if (g->g_strip) { /* once per generation at most: token by token */
        for (int32_t id = 0; id < n; id++) {
            int ok = grammar_accepts(g, id, budget, false);
            if (ok != 1) {
                g->forced |= ok < 0;
                logits[id] = -INFINITY;
            }
        }
        return;
    }
    uint32_t max_cost = 0;
    const uint64_t *cached = sp_gmatch_mask_get(m, s0, n, &max_cost);
    if (cached != NULL && (budget < 0 || max_cost <= (uint32_t)budget)) {
        for (int32_t id = 0; id < n; id++) {
            if (!((cached[id >> 6] >> (id & 63)) & 1)) {
                logits[id] = -INFINITY;
            }
        }
        return;
    }
    bool record = cached == NULL;
    uint64_t *bits = g->g_bits;
    if (record) {
        memset(bits, 0, ((size_t)n + 63) / 64 * 8);
    }
    sp_gstate_t *walk = g->gwalk;
    walk[0] = s0;
    int have = 0, dead = 0;
    for (int32_t i = 0; i < n; i++) {
        const sorted_piece_t *sp = &v->all[i];
        int32_t id = sp->id;
        int lcp = sp->lcp, len = sp->len;
        have = have < lcp ? have : lcp;
        dead = dead > 0 && lcp >= dead ? dead : 0;
        if (len == 0 || dead > 0) {
            logits[id] = -INFINITY;
            continue;
        }
        if (!record && logits[id] == -INFINITY) {
            continue;
        }
        const unsigned char *p = v->bytes + sp->off;
        bool valid = true;
        for (int d = have; d < len; d++) {
            walk[d + 1] = sp_gmatch_feed(m, walk[d], p[d]);
            if (walk[d + 1] == SP_GSTATE_DEAD) {
                dead = d + 1;
                valid = false;
                break;
            }
            have = d + 1;
        }
        uint32_t cost = valid ? sp_gmatch_cost(m, walk[len]) : 0;
        if (valid && record) {
            bits[id >> 6] |= 1ull << (id & 63);
            max_cost = cost > max_cost ? cost : max_cost;
        }
        bool fits = valid && (budget < 0 || cost <= (uint32_t)budget);
        if (!fits) {
            g->forced |= valid;
            logits[id] = -INFINITY;
        }
    }
    if (record && !sp_gmatch_overflowed(m)) {
        uint64_t *keep = sp_gmatch_mask_put(m, s0, n, max_cost);
        if (keep != NULL) {
            memcpy(keep, bits, ((size_t)n + 63) / 64 * 8);
        }
    }
}

/* Lowest id among the largest logits (the row holds no NaN); -1 when all are -inf. */
static int32_t
argmax(const float *logits, int32_t n)
{
    const int32_t best = sp_argmax(logits, n);
    return logits[best] == -INFINITY ? -1 : best;
}

/* The largest logit, or NaN when some logit is NaN or +inf: a model fault
 * (broken weights, an overflow), never something to sample around. */
static float
logits_max(const float *logits, int32_t n)
{
    float mx = -INFINITY;
    bool bad = false;
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        bad |= l != l || l == INFINITY;
        mx = l > mx ? l : mx;
    }
    return bad ? NAN : mx;
}

/* ---- step: log-probabilities --------------------------------------------- */

/* "a ranks before b": larger logit, then lower id. */
static bool
ranks_before(const float *logits, int32_t a, int32_t b)
{
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

/* The log-softmax of the logits: log Z, or with +inf logits (which take all
 * the mass, shared) the log of their count. */
typedef struct log_norm {
    double log_z;
    bool inf;
} log_norm_t;

static float
logprob_of(log_norm_t z, float l)
{
    if (z.inf) {
        return l == INFINITY ? (float)-z.log_z : -INFINITY;
    }
    return l == -INFINITY ? -INFINITY : (float)((double)l - z.log_z);
}

/*
 * Normalise the logits (which hold no NaN and at least one value above -inf)
 * and put the k best tokens into top[], best first. Two passes: the max, then
 * the sum of exp(l - max) in double with the top k kept by insertion into a
 * sorted array of at most 20 (most tokens fail the first comparison).
 * Tokens at -inf (masked) are never listed.
 */
static log_norm_t
log_softmax_top(const float *logits, int32_t n, int32_t k, sp_gen_logprob_t *top, int32_t *n_top)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        mx = logits[i] > mx ? logits[i] : mx;
    }
    log_norm_t z = {0.0, mx == INFINITY};
    int32_t m = 0;
    int32_t ids[SP_GEN_MAX_TOP_LOGPROBS];
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        if (l == -INFINITY) {
            continue;
        }
        sum += z.inf ? (double)(l == INFINITY) : exp((double)l - (double)mx);
        if (m < k || (k > 0 && ranks_before(logits, i, ids[m - 1]))) {
            int32_t j = m < k ? m++ : m - 1; /* insert, dropping the last when full */
            while (j > 0 && ranks_before(logits, i, ids[j - 1])) {
                ids[j] = ids[j - 1];
                j--;
            }
            ids[j] = i;
        }
    }
    z.log_z = z.inf ? log(sum) : (double)mx + log(sum);
    for (int32_t j = 0; j < m; j++) {
        top[j].token = ids[j];
        top[j].logprob = logprob_of(z, logits[ids[j]]);
    }
    *n_top = m;
    return z;
}

/* ---- step: text ---------------------------------------------------------- */

static void
release(sp_gen_t *g, const char *p, size_t n)
{
    memcpy(g->text + g->n_text, p, n);
    g->n_text += n;
}

/*
 * Run the new text through the stop matchers. Returns true when a stop string
 * completed: the text before it is released and the rest dropped. Otherwise
 * releases all but the longest partial match, which waits in g->held.
 */
static bool
push_text(sp_gen_t *g, const char *p, size_t n)
{
    if (g->n_stop == 0) {
        release(g, p, n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        g->held[g->n_held++] = c;
        int done = -1;
        for (int s = 0; s < g->n_stop; s++) {
            stop_str_t *st = &g->stop[s];
            int k = st->state;
            while (k > 0 && st->text[k] != c) {
                k = st->fail[k - 1];
            }
            if (st->text[k] == c) {
                k++;
            }
            st->state = k;
            if (k == st->len && (done < 0 || st->len > g->stop[done].len)) {
                done = s;
            }
        }
        if (done >= 0) {
            /* the stop string lies in held: every byte of it before this step
             * was part of a partial match, and partial matches are held */
            release(g, g->held, g->n_held - (size_t)g->stop[done].len);
            g->n_held = 0;
            g->stop_hit = done;
            return true;
        }
    }
    int keep = 0;
    for (int s = 0; s < g->n_stop; s++) {
        keep = g->stop[s].state > keep ? g->stop[s].state : keep;
    }
    size_t out = g->n_held - (size_t)keep;
    release(g, g->held, out);
    memmove(g->held, g->held + out, (size_t)keep);
    g->n_held = (size_t)keep;
    return false;
}

/* End of the generation without a stop string: everything held comes out. */
static void
release_all(sp_gen_t *g)
{
    release(g, g->held, g->n_held);
    g->n_held = 0;
    int32_t k = sp_detok_flush(&g->detok, g->text + g->n_text, (int32_t)(TEXT_CAP - g->n_text));
    g->n_text += k > 0 ? (size_t)k : 0;
}

/* ---- step: reasoning budget ---------------------------------------------- */

/* One byte through a marker's automaton: true when the marker just completed
 * (the automaton starts over). An empty marker never completes. */
static bool
marker_feed(stop_str_t *st, char c)
{
    if (st->len == 0) {
        return false;
    }
    int k = st->state;
    while (k > 0 && st->text[k] != c) {
        k = st->fail[k - 1];
    }
    if (st->text[k] == c) {
        k++;
    }
    st->state = k == st->len ? 0 : k;
    return k == st->len;
}

/* The token the budget forces at this step, or -1. */
static int32_t
think_forcing(const sp_gen_t *g)
{
    return g->th_on && g->th_state == TH_FORCE ? g->p.think_force[g->th_pos] : -1;
}

static void
think_enter(sp_gen_t *g)
{
    g->th_close.state = 0;
    g->th_left = g->p.reasoning_budget;
    g->th_state = g->th_left > 0 ? TH_IN : TH_FORCE;
    g->th_pos = 0;
}

/*
 * After a non-final token with text p[0, n) (complete UTF-8 characters; a
 * character still open stays in the detokenizer): the open marker starts a
 * part, the close marker ends it, each generated token inside counts, and
 * the part's last allowed token (or the one that finishes its character
 * or leaves the close marker the model had begun) starts the forcing.
 */
static void
think_update(sp_gen_t *g, const char *p, size_t n)
{
    if (g->th_state == TH_FORCE) {
        g->th_forced++;
        if (++g->th_pos >= g->p.n_think_force) {
            g->th_state = TH_OUT;
            g->th_open.state = 0;
        }
        return;
    }
    if (g->th_state == TH_OUT) {
        for (size_t i = 0; i < n; i++) {
            if (marker_feed(&g->th_open, p[i])) {
                think_enter(g); /* the open marker's own token does not count */
                return;
            }
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (marker_feed(&g->th_close, p[i])) { /* the model ended the part itself */
            g->th_state = TH_OUT;
            g->th_open.state = 0;
            return;
        }
    }
    if (g->th_state == TH_IN && --g->th_left > 0) {
        return;
    }
    if (g->detok.n_held == 0 && g->th_close.state == 0) {
        g->th_state = TH_FORCE;
        g->th_pos = 0;
    } else { /* never cut a character in two, nor a close marker the model began */
        g->th_state = TH_WAIT;
    }
}

/* ---- step ---------------------------------------------------------------- */

static sp_status_t emit(sp_gen_t *g, int32_t id, sp_gen_token_t *out);

/* The start of every step: an empty result, or the error after the end. */
static sp_status_t
step_begin(sp_gen_t *g, sp_gen_token_t *out)
{
    memset(out, 0, sizeof *out);
    out->token = -1;
    out->text = g->text;
    g->n_text = 0;
    g->text[0] = '\0';
    if (g->over) {
        return fail(g, SP_ERR_INVALID, "step after the generation ended");
    }
    return SP_OK;
}

sp_status_t
sp_gen_step(sp_gen_t *g, float *logits, sp_gen_token_t *out)
{
    sp_status_t bst = step_begin(g, out);
    if (bst != SP_OK) {
        return bst;
    }
    int32_t n = g->n_vocab;

    sp_sampler_apply_penalties(g->smp, logits); /* NaN and +inf stay what they are */
    float mx = logits_max(logits, n);
    if (mx != mx) {
        return fail(g, SP_ERR_MODEL_FAULT, "the model produced NaN or infinite logits");
    }
    if (!(mx > -INFINITY)) {
        return fail(g, SP_ERR_INVALID, "no finite logit to sample from");
    }
    const sp_sampler_params_t *sp = &g->p.sampling;
    bool greedy = sp->temperature == 0.0f || sp->top_k == 1;
    if (g->p.json_object) {
        /* Near max_tokens, only tokens after which the object can still close
         * in the tokens left (when the vocabulary can always close it). */
        int left = g->p.max_tokens - g->n_gen;
        int budget = g->vocab->can_close && json_cost(&g->json) <= left ? left - 1 : -1;
        bool found = false;
        if (!g->p.ignore_eos) { /* an end token would leave the object unfinished */
            int n_eog;
            const int32_t *eog = sp_tokenizer_eog(g->tok, &n_eog);
            for (int i = 0; i < n_eog; i++) {
                logits[eog[i]] = -INFINITY;
            }
        }
        if (greedy && g->p.top_logprobs < 0) {
            /* usually the model's favourite is valid: test the best few first */
            for (int t = 0; t < LAZY_TRIES; t++) {
                int32_t best = argmax(logits, n);
                int ok = best < 0 ? 1 : json_accepts(g, best, budget);
                if (ok == 1) {
                    found = best >= 0;
                    break;
                }
                g->forced |= ok < 0;
                logits[best] = -INFINITY;
            }
        }
        if (!found) {
            json_mask_all(g, logits, budget);
        }
    } else if (g->gm != NULL) {
        sp_gmatch_maintain(g->gm); /* between steps: states may be renumbered */
        sp_gstate_t s = sp_gmatch_state(g->gm);
        int left = g->p.max_tokens - g->n_gen;
        /* As for JSON: near max_tokens only tokens after which the sentence
         * can still end in the tokens left. When it already cannot (pieces
         * are often longer than a byte, so a byte count overestimates, but
         * it may also just not fit), every token must bring the end nearer. */
        uint32_t cost = sp_gmatch_cost(g->gm, s);
        int budget = !g->g_can_close            ? -1
                     : cost <= (uint32_t)left   ? left - 1
                     : cost < (uint32_t)INT_MAX ? (int)cost - 1
                                                : -1;
        bool may_end = !g->p.ignore_eos && sp_gmatch_accepting(g->gm, s);
        g->g_strip = g->strip_space && g->bos >= 0 && g->prev == g->bos;
        float keep[SP_TOKENIZER_MAX_EOG];
        int n_eog;
        const int32_t *eog = sp_tokenizer_eog(g->tok, &n_eog);
        n_eog = g->p.ignore_eos ? 0 : n_eog;
        SP_ASSERT(n_eog <= SP_TOKENIZER_MAX_EOG);
        for (int i = 0; i < n_eog; i++) { /* they end the text: only where the grammar may */
            keep[i] = logits[eog[i]];
            logits[eog[i]] = may_end ? keep[i] : -INFINITY;
        }
        bool found = false;
        if (greedy && g->p.top_logprobs < 0) {
            for (int t = 0; t < LAZY_TRIES; t++) {
                int32_t best = argmax(logits, n);
                int ok = best < 0 ? 1 : grammar_accepts(g, best, budget, may_end);
                if (ok == 1) {
                    found = best >= 0;
                    break;
                }
                g->forced |= ok < 0;
                logits[best] = -INFINITY;
            }
        }
        if (!found) {
            grammar_mask_all(g, logits, budget);
            for (int i = 0; i < n_eog; i++) {
                logits[eog[i]] = may_end ? keep[i] : -INFINITY;
            }
        }
    }
    log_norm_t z = {0.0, false};
    if (g->p.top_logprobs >= 0) {
        z = log_softmax_top(logits, n, g->p.top_logprobs, out->top, &out->n_top);
    }
    int32_t id = think_forcing(g);
    if (id >= 0 && logits[id] == -INFINITY) {
        /* the constraint rules out the marker here: it shapes the text, the
         * budget gives way (gen.h) */
        g->th_state = TH_OUT;
        g->th_open.state = 0;
        id = -1;
    }
    if (id < 0) {
        id = sp_sampler_sample_penalized(g->smp, logits); /* reads the logits only */
    }
    SP_ASSERT(id >= 0 && id < n); /* it indexes the logits row and the vocabulary */
    if (logits[id] == -INFINITY) { /* the sampler's answer when every logit is -inf */
        return fail(g, SP_ERR_UNSUPPORTED,
                    g->gm ? "no token of the vocabulary continues the grammar"
                          : "no token of the vocabulary continues the JSON object");
    }
    out->token = id;
    if (g->p.top_logprobs >= 0) {
        out->chosen.token = id;
        out->chosen.logprob = logprob_of(z, logits[id]);
    }
    return emit(g, id, out);
}

int32_t
sp_gen_candidates(const sp_gen_t *g)
{
    /* The constraints mask tokens anywhere in the row, log-probabilities
     * need its whole normaliser: those need the row. */
    if (g->over || g->p.json_object || g->gm != NULL || g->p.top_logprobs >= 0) {
        return 0;
    }
    return sp_sampler_candidates(g->smp);
}

sp_status_t
sp_gen_step_candidates(sp_gen_t *g, const int32_t *ids, const float *vals, int32_t n,
                       sp_gen_token_t *out)
{
    sp_status_t bst = step_begin(g, out);
    if (bst != SP_OK) {
        return bst;
    }
    const int32_t need = sp_gen_candidates(g);
    if (need == 0 || n < need || ids == NULL || vals == NULL) {
        return fail(g, SP_ERR_INVALID, "these sampling parameters need the whole row of logits");
    }
    /* As sp_gen_step: no penalties (sp_gen_candidates said so), and the
     * candidates are the best logits, so the first one says whether any is
     * finite. With nothing applied to the row, none finite (NaN, +inf, or
     * all -inf: a selection may rank NaN as -inf) is the model's fault. */
    if (!(vals[0] > -INFINITY) || vals[0] == INFINITY) {
        return fail(g, SP_ERR_MODEL_FAULT, "the model produced NaN or infinite logits");
    }
    const int32_t forced = think_forcing(g);
    const int32_t id = forced >= 0 ? forced : sp_sampler_sample_candidates(g->smp, ids, vals, n);
    if (id < 0 || id >= g->n_vocab) {
        return fail(g, SP_ERR_INVALID, "a candidate id is outside the vocabulary");
    }
    out->token = id;
    return emit(g, id, out);
}

/* The rest of a step once the token is chosen: count it, its text, stop
 * strings, the constraints' state and the limits. */
static sp_status_t
emit(sp_gen_t *g, int32_t id, sp_gen_token_t *out)
{
    g->n_gen++;
    sp_sampler_accept(g->smp, id);

    bool stop = false;
    if (!g->p.ignore_eos && sp_tokenizer_is_eog(g->tok, id)) {
        stop = true;
        release_all(g);
    } else {
        int32_t k = sp_detok_push(g->tok, &g->detok, id, g->p.special_text, g->piece, (int32_t)sizeof g->piece);
        if (k < 0 || k > (int32_t)sizeof g->piece) {
            return fail(g, k < 0 ? (sp_status_t)k : SP_ERR_TOO_LARGE,
                        "the sampled token's text cannot be decoded");
        }
        const char *p = g->piece;
        if (g->strip_space && g->bos >= 0 && g->prev == g->bos && k > 0 && p[0] == ' ') {
            p++, k--; /* as llama2.c and llama.cpp print the first word after BOS */
        }
        stop = push_text(g, p, (size_t)k);
        if (g->th_on) {
            think_update(g, p, (size_t)k);
        }
        if (g->p.json_object) {
            const sp_gen_vocab_t *v = g->vocab;
            json_feed_all(&g->json, v->bytes + v->off[id], v->off[id + 1] - v->off[id]);
            if (g->json.mode == J_DONE && !stop) {
                /* the object is complete; if the budget shaped its end, say so */
                if (g->forced) {
                    out->finish = SP_FINISH_LENGTH;
                } else {
                    stop = true;
                }
                release_all(g);
            }
        }
        if (g->gm != NULL) {
            const unsigned char *gp;
            uint32_t gl;
            grammar_piece(g, id, &gp, &gl);
            if (!sp_gmatch_commit(g->gm, gp, gl)) {
                return fail(g, SP_ERR_UNSUPPORTED, "the grammar matcher ran out of room");
            }
            sp_gstate_t s = sp_gmatch_state(g->gm);
            if (sp_gmatch_accepting(g->gm, s) && !sp_gmatch_can_continue(g->gm, s) && !stop) {
                /* the sentence is complete and nothing may follow */
                if (g->forced) {
                    out->finish = SP_FINISH_LENGTH;
                } else {
                    stop = true;
                }
                release_all(g);
            }
        }
    }
    g->prev = id;
    if (stop) {
        out->finish = SP_FINISH_STOP;
    } else if (out->finish == SP_FINISH_NONE && g->n_gen >= g->p.max_tokens) {
        out->finish = SP_FINISH_LENGTH;
        release_all(g);
    }
    g->over = out->finish != SP_FINISH_NONE;
    g->text[g->n_text] = '\0';
    out->text_len = g->n_text;
    return SP_OK;
}
