/*
 * tok_ugm.c - the Unigram tokenizer of T5 / SentencePiece "unigram" models
 * (tokenizer.ggml.model = "t5"; XLM-R and the multilingual encoders built on
 * it), as llama.cpp and SentencePiece run it.
 *
 * Two steps per text fragment (special tokens are split out before, by
 * tokenizer.c):
 *   1. Normalisation. At each input position the longest user-defined token
 *      is copied as is; else the longest prefix found in the precompiled
 *      character map (tokenizer.ggml.precompiled_charsmap: SentencePiece's
 *      NFKC-style rules as an XOR-compressed compact double array of bytes,
 *      followed by NUL-terminated replacement strings) is replaced; else one
 *      UTF-8 character is copied (an invalid byte becomes U+FFFD). Spaces
 *      become U+2581; with add_space_prefix a U+2581 opens the text, and with
 *      remove_extra_whitespaces runs of spaces collapse to the one before the
 *      next word (and trailing ones go).
 *   2. Viterbi. best[i] is the highest sum of token scores (log
 *      probabilities, in double as SentencePiece) of a tokenization of the
 *      first i bytes. From every character boundary each vocabulary entry
 *      (normal, user-defined with score 0, unused) that matches the text
 *      there extends it; a character no single token covers costs the unknown
 *      token's score (the lowest normal score minus 10). The best path is read
 *      back from the end, runs of unknown tokens merged into one.
 *
 * Threads: the tables are read-only after load; encode keeps its state in
 * per-call heap buffers. Memory: the character map is copied at load (the
 * GGUF mapping may go away before the tokenizer); encode allocates O(text).
 */
#include <float.h>
#include <string.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "text/tokenizer_impl.h"

struct sp__tok_ugm {
    uint32_t *xcda;         /* the double array's entries */
    size_t n_xcda;
    char *repl;             /* replacement strings, each NUL-terminated */
    size_t n_repl;
    double unk_score;
    bool remove_extra_ws;
    bool escape_ws;         /* spaces as U+2581 (always, for this model type) */
};

void
sp__tok_ugm_free(sp__tok_ugm_t *u)
{
    if (u != NULL) {
        sp_free(u->xcda);
        sp_free(u->repl);
        sp_free(u);
    }
}

static sp_status_t
get_bool(const sp_gguf_t *g, const char *key, bool *out, char *err, size_t err_len)
{
    sp_status_t st = sp_gguf_get_bool(g, key, out, err, err_len);
    return st == SP_ERR_NOT_FOUND ? SP_OK : st;
}

sp_status_t
sp__tok_ugm_init(sp_tokenizer_t *t, const sp_gguf_t *g, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    sp__tok_ugm_t *u = sp_calloc(1, sizeof *u);
    if (u == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    t->ugm = u;
    u->escape_ws = true;
    t->add_space_prefix = false;
    sp_status_t st;
    if ((st = get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err,
                       err_len)) != SP_OK ||
        (st = get_bool(g, "tokenizer.ggml.remove_extra_whitespaces", &u->remove_extra_ws, err,
                       err_len)) != SP_OK) {
        return st;
    }
    sp_gguf_arr_t cm;
    st = sp_gguf_get_arr(g, "tokenizer.ggml.precompiled_charsmap", &cm, err, err_len);
    if (st == SP_OK && cm.n > 0) {
        if ((cm.elem_type != SP_GGUF_TYPE_UINT8 && cm.elem_type != SP_GGUF_TYPE_INT8) ||
            cm.data == NULL || cm.n < 4) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tokenizer.ggml.precompiled_charsmap: want a byte array of at "
                           "least 4 bytes", path);
        }
        const unsigned char *p = cm.data;
        const uint32_t blob = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24;
        if (blob % 4 != 0 || blob > cm.n - 4) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tokenizer.ggml.precompiled_charsmap: array of %u bytes does not "
                           "fit the map's %llu", path, blob, (unsigned long long)cm.n);
        }
        u->n_xcda = blob / 4;
        u->n_repl = (size_t)cm.n - 4 - blob;
        u->xcda = sp_malloc(blob > 0 ? blob : 1);
        u->repl = sp_malloc(u->n_repl > 0 ? u->n_repl : 1);
        if (u->xcda == NULL || u->repl == NULL) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
        }
        for (size_t i = 0; i < u->n_xcda; i++) { /* little-endian, maybe unaligned */
            const unsigned char *e = p + 4 + 4 * i;
            u->xcda[i] = (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 |
                         (uint32_t)e[3] << 24;
        }
        memcpy(u->repl, p + 4 + blob, u->n_repl);
    } else if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
        return st;
    }
    float lo = FLT_MAX;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] == SP_TOKEN_TYPE_NORMAL && t->scores[i] < lo) {
            lo = t->scores[i];
        }
    }
    u->unk_score = (double)lo - 10.0;
    return SP_OK;
}

/* ---- normalisation ------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t n, cap;
    bool oom;
} buf_t;

static void
put(buf_t *b, const char *s, size_t n)
{
    if (b->oom) {
        return;
    }
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) {
            cap *= 2;
        }
        char *q = sp_realloc(b->p, cap);
        if (q == NULL) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* The token types the Viterbi step (and the user-defined match) may use. */
static bool
matchable(const sp_tokenizer_t *t, int32_t id)
{
    const uint8_t a = t->attr[id];
    return a == SP_TOKEN_TYPE_NORMAL || a == SP_TOKEN_TYPE_USER_DEFINED ||
           a == SP_TOKEN_TYPE_UNUSED;
}

/* Bytes of the longest user-defined token at s[0..n), or 0. */
static size_t
user_defined_prefix(const sp_tokenizer_t *t, const char *s, size_t n)
{
    size_t most = n < t->max_token_len ? n : t->max_token_len;
    for (size_t k = most; k > 0; k--) {
        int32_t id = sp__vocab_lookup(t, s, k);
        if (id >= 0 && t->attr[id] == SP_TOKEN_TYPE_USER_DEFINED) {
            return k;
        }
    }
    return 0;
}

/* The character map's longest match at s[0..n): its length (0: none) and the
 * replacement's offset. SP_ERR_FORMAT for a map that points outside itself. */
static sp_status_t
charsmap_prefix(const sp__tok_ugm_t *u, const char *s, size_t n, size_t *len, size_t *off)
{
    *len = 0;
    if (u->n_xcda == 0) {
        return SP_OK;
    }
    /* An entry: BASE in bits 10-30 (shifted left by 8 when bit 9 is set),
     * LCHECK in bits 0-7 and 31, LEAF in bit 8; a leaf's child holds the
     * replacement's offset in bits 0-30. */
#define NODE(i) u->xcda[i]
#define BASE(v) (((v) >> 10) << (((v) & (1u << 9)) >> 6))
    uint32_t node = BASE(NODE(0));
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == 0) {
            break;
        }
        node ^= c;
        if (node >= u->n_xcda) {
            return SP_ERR_FORMAT;
        }
        const uint32_t v = NODE(node);
        if ((v & ((1u << 31) | 0xffu)) != c) {
            break;
        }
        const bool leaf = (v >> 8) & 1;
        node ^= BASE(v);
        if (leaf) {
            if (node >= u->n_xcda) {
                return SP_ERR_FORMAT;
            }
            *len = i + 1;
            *off = NODE(node) & ((1u << 31) - 1);
        }
    }
#undef NODE
#undef BASE
    if (*len > 0 && (*off >= u->n_repl || memchr(u->repl + *off, 0, u->n_repl - *off) == NULL)) {
        return SP_ERR_FORMAT;
    }
    return SP_OK;
}

/* Bytes of one well-formed UTF-8 character at s[0..n) (llama.cpp's check:
 * lead byte and continuation bytes), or 0 when it is not one. */
static size_t
utf8_char(const unsigned char *s, size_t n)
{
    size_t k = s[0] < 0x80 ? 1 : s[0] < 0xC0 ? 0 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : s[0] < 0xF8 ? 4 : 0;
    if (k == 0 || k > n) {
        return 0;
    }
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return 0;
        }
    }
    return k;
}

static sp_status_t
normalize(const sp_tokenizer_t *t, const char *in, size_t len, buf_t *out)
{
    const sp__tok_ugm_t *u = t->ugm;
    static const char esc[] = "\xE2\x96\x81";
    const char *space = u->escape_ws ? esc : " ";
    const size_t space_len = u->escape_ws ? 3 : 1;
    const bool prepend = t->add_space_prefix, merge = u->remove_extra_ws;
    bool prepended = false, in_word = false;
    for (size_t off = 0; off < len;) {
        const char *r;
        size_t rn, used;
        size_t ud = user_defined_prefix(t, in + off, len - off);
        if (ud > 0) {
            r = in + off;
            rn = used = ud;
        } else {
            size_t ml, mo = 0;
            if (charsmap_prefix(u, in + off, len - off, &ml, &mo) != SP_OK) {
                return SP_ERR_FORMAT;
            }
            if (ml > 0) {
                r = u->repl + mo;
                rn = strlen(r);
                used = ml;
            } else if ((used = utf8_char((const unsigned char *)in + off, len - off)) > 0) {
                r = in + off;
                rn = used;
            } else {
                r = "\xEF\xBF\xBD"; /* U+FFFD for a byte that starts no character */
                rn = 3;
                used = 1;
            }
        }
        for (size_t i = 0; i < rn; i++) {
            if (r[i] != ' ') {
                if (!in_word) {
                    in_word = true;
                    if ((prepend && !prepended) || merge) {
                        put(out, space, space_len);
                        prepended = true;
                    }
                }
                put(out, r + i, 1);
            } else {
                in_word = false;
                if (!merge) {
                    put(out, space, space_len);
                }
            }
        }
        off += used;
    }
    return out->oom ? SP_ERR_NOMEM : SP_OK;
}

/* ---- Viterbi ------------------------------------------------------------- */

typedef struct best {
    int32_t id;
    size_t from;   /* where the last token starts */
    double score;
} best_t;

static size_t
lead_len(unsigned char c)
{
    static const uint8_t k[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return k[c >> 4];
}

sp_status_t
sp__tok_ugm_encode(const sp_tokenizer_t *t, const char *text, size_t len, sp__tok_out_t *o)
{
    buf_t nb = {0};
    sp_status_t st = normalize(t, text, len, &nb);
    const size_t n = nb.n;
    if (st != SP_OK || n == 0) {
        sp_free(nb.p);
        return st;
    }
    best_t *b = sp_calloc(n + 1, sizeof *b);
    int32_t *rev = sp_malloc((n + 1) * sizeof *rev);
    if (b == NULL || rev == NULL) {
        sp_free(b);
        sp_free(rev);
        sp_free(nb.p);
        return SP_ERR_NOMEM;
    }
    for (size_t i = 0; i <= n; i++) {
        b[i] = (best_t){t->unk, 0, -DBL_MAX};
    }
    b[0].score = 0.0;
    const char *s = nb.p;
    for (size_t off = 0; off < n;) {
        size_t cl = lead_len((unsigned char)s[off]);
        if (cl > n - off) {
            cl = n - off;
        }
        const double base = b[off].score;
        bool whole = false;
        size_t most = n - off < t->max_token_len ? n - off : t->max_token_len;
        for (size_t k = 1; k <= most; k++) {
            int32_t id = sp__vocab_lookup(t, s + off, k);
            if (id < 0 || !matchable(t, id)) {
                continue;
            }
            whole |= k == cl;
            /* User-defined tokens score 0: above every log probability. */
            const double sc = base + (t->attr[id] == SP_TOKEN_TYPE_USER_DEFINED ? 0.0 : t->scores[id]);
            if (sc > b[off + k].score) {
                b[off + k] = (best_t){id, off, sc};
            }
        }
        if (!whole) {
            const double sc = base + t->ugm->unk_score;
            if (sc > b[off + cl].score) {
                b[off + cl] = (best_t){t->unk, off, sc};
            }
        }
        off += cl;
    }
    /* Back from the end; consecutive unknowns become one. */
    size_t m = 0;
    bool prev_unk = false;
    for (size_t at = n;;) {
        const best_t *e = &b[at];
        const bool unk = e->id == t->unk;
        if (!(prev_unk && unk)) {
            rev[m++] = e->id;
        }
        if (e->from == 0) {
            break;
        }
        prev_unk = unk;
        at = e->from;
    }
    for (size_t i = m; i > 0; i--) {
        sp__tok_emit(o, rev[i - 1]);
    }
    sp_free(rev);
    sp_free(b);
    sp_free(nb.p);
    return SP_OK;
}
