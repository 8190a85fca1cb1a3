/*
 * tok_wpm.c - WordPiece (tokenizer.ggml.model = "bert"), as Hugging Face's
 * BertNormalizer + BertPreTokenizer + WordPiece run for BERT-style embedding
 * models (bge, MiniLM, ...).
 *
 * Normalizer: drop NUL, U+FFFD and control characters; every CJK ideograph is
 * a word of its own; canonical decomposition with nonspacing marks removed
 * (accents stripped), then lowercase (tables in tok_unicode.c). Pre-tokenizer:
 * white space separates words, and each punctuation character is a word of its
 * own. WordPiece: per word, greedy longest match from the left; the first
 * piece is looked up with the U+2581 prefix that the GGUF conversion gives
 * word-initial tokens, the rest ("##" in the original vocabulary) without it.
 * A word with a position no token matches, or longer than 100 characters,
 * becomes [UNK] as a whole. Invalid UTF-8 bytes are dropped like U+FFFD.
 *
 * Cost: the longest piece tried is the longest token, and a word is at most
 * 100 characters, so any input is linear in its length. State is on the stack.
 */
#include <string.h>

#include "text/tok_unicode.h"
#include "core/utf8.h"
#include "text/tokenizer_impl.h"

#define MAX_WORD_CHARS 100 /* Hugging Face's max_input_chars_per_word */
#define PREFIX "\xE2\x96\x81"
#define PREFIX_LEN 3

typedef struct wpm_word {
    char buf[PREFIX_LEN + 4 * (MAX_WORD_CHARS + 1)]; /* "▁" + the word's UTF-8 */
    size_t len;     /* bytes in buf, prefix included */
    size_t n_chars; /* characters seen, including any that no longer fit */
} wpm_word_t;

/* What the normalizer makes of cp (decomposed, marks dropped, lowercased):
 * writes up to 4 code points... or points *seq into the table. Returns the count. */
static size_t
fold(uint32_t cp, uint32_t tmp[3], const uint32_t **seq)
{
    if (cp < 0x80) {
        tmp[0] = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        *seq = tmp;
        return 1;
    }
    if (cp >= 0xAC00 && cp <= 0xD7A3) { /* Hangul syllable: L V (T) jamo */
        uint32_t s = cp - 0xAC00;
        tmp[0] = 0x1100 + s / (21 * 28);
        tmp[1] = 0x1161 + s % (21 * 28) / 28;
        tmp[2] = 0x11A7 + s % 28;
        *seq = tmp;
        return s % 28 ? 3 : 2;
    }
    size_t lo = 0, hi = sp__tok_unicode_n_fold;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sp__tok_unicode_fold[mid].cp < cp) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo < sp__tok_unicode_n_fold && sp__tok_unicode_fold[lo].cp == cp) {
        *seq = sp__tok_unicode_fold_pool + sp__tok_unicode_fold[lo].off;
        return sp__tok_unicode_fold[lo].n;
    }
    tmp[0] = cp;
    *seq = tmp;
    return 1;
}

/* WordPiece of one word; an unmatched position makes the whole word [UNK]. */
static void
wordpiece(const sp_tokenizer_t *t, wpm_word_t *w, sp__tok_out_t *o)
{
    if (w->n_chars == 0) {
        return;
    }
    int64_t mark = o->n;
    if (w->n_chars > MAX_WORD_CHARS) {
        goto unk;
    }
    for (size_t start = PREFIX_LEN; start < w->len;) {
        size_t from = start == PREFIX_LEN ? 0 : start; /* the first piece keeps the prefix */
        size_t end = w->len;
        if (end - from > t->max_token_len) {
            end = from + t->max_token_len;
            while (end > start && (w->buf[end] & 0xC0) == 0x80) {
                end--; /* a character boundary */
            }
        }
        int32_t id = -1;
        while (end > start) {
            if ((id = sp__vocab_lookup(t, w->buf + from, end - from)) >= 0) {
                break;
            }
            do {
                end--;
            } while (end > start && (w->buf[end] & 0xC0) == 0x80);
        }
        if (id < 0) {
            goto unk;
        }
        sp__tok_emit(o, id);
        start = end;
    }
    goto done;
unk:
    o->n = mark; /* drop the pieces found so far (only ids below cap were written) */
    if (t->unk >= 0) {
        sp__tok_emit(o, t->unk);
    }
done:
    w->len = PREFIX_LEN;
    w->n_chars = 0;
}

static void
word_add(wpm_word_t *w, uint32_t cp)
{
    if (w->n_chars++ < MAX_WORD_CHARS + 1) { /* one past the limit marks it too long */
        w->len += sp_utf8_encode(w->buf + w->len, cp);
    }
}

sp_status_t
sp__tok_wpm_encode(const sp_tokenizer_t *t, const char *text, size_t len, sp__tok_out_t *o)
{
    wpm_word_t w;
    memcpy(w.buf, PREFIX, PREFIX_LEN);
    w.len = PREFIX_LEN;
    w.n_chars = 0;
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += sp_utf8_decode(p + i, len - i, &cp);
        unsigned f = sp__tok_unicode_flags(cp);
        if (cp == 0 || cp == 0xFFFD || (f & SP__UNI_CONTROL)) {
            continue;
        }
        if (f & SP__UNI_SPACE) {
            wordpiece(t, &w, o);
            continue;
        }
        if (f & SP__UNI_CJK) {
            wordpiece(t, &w, o);
            word_add(&w, cp);
            wordpiece(t, &w, o);
            continue;
        }
        uint32_t tmp[3];
        const uint32_t *seq;
        size_t n = fold(cp, tmp, &seq);
        for (size_t k = 0; k < n; k++) {
            unsigned fk = sp__tok_unicode_flags(seq[k]);
            if (fk & SP__UNI_PUNCT) {
                wordpiece(t, &w, o);
                word_add(&w, seq[k]);
                wordpiece(t, &w, o);
            } else if (fk & SP__UNI_SPACE) {
                wordpiece(t, &w, o);
            } else {
                word_add(&w, seq[k]);
            }
        }
    }
    wordpiece(t, &w, o);
    return SP_OK;
}
