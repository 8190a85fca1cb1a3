/*
 * detok.c - the streaming detokenizer: token ids to text that never ends
 * inside a UTF-8 character (the sp_detok_t contract in tokenizer.h).
 *
 * Threads: an sp_detok_t belongs to one stream and one thread at a time; the
 * tokenizer it reads is immutable. Memory: none; the caller owns every buffer.
 */
#include <string.h>

#include "text/tokenizer.h"
#include "core/utf8.h"

int32_t
sp_detok_push(const sp_tokenizer_t *t, sp_detok_t *d, int32_t id, bool special, char *buf,
              int32_t cap)
{
    int32_t n = sp_tokenizer_piece(t, id, special, NULL, 0);
    if (n < 0) {
        return n;
    }
    int64_t total = (int64_t)d->n_held + n;
    if (buf == NULL || cap < total) {
        return (int32_t)total;
    }
    memcpy(buf, d->held, (size_t)d->n_held);
    sp_tokenizer_piece(t, id, special, buf + d->n_held, n);
    int tail = (int)sp_utf8_unfinished_tail(buf, (size_t)total);
    memcpy(d->held, buf + total - tail, (size_t)tail);
    d->n_held = tail;
    return (int32_t)(total - tail);
}

int32_t
sp_detok_flush(sp_detok_t *d, char *buf, int32_t cap)
{
    int32_t n = d->n_held;
    if (buf == NULL || cap < n) {
        return n;
    }
    memcpy(buf, d->held, (size_t)n);
    d->n_held = 0;
    return n;
}
