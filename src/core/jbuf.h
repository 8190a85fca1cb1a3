/*
 * jbuf.h - the JSON writer of responses and stream chunks: a small
 * append-only buffer instead of building jansson trees, because they are
 * written once, in order, many times per second. Strings are escaped and
 * invalid UTF-8 is replaced by U+FFFD, so the output is always valid JSON.
 *
 * Memory: the buffer grows with sp_realloc; an append that cannot grow it sets
 * `oom` and is dropped, so a writer checks once at the end, not per call.
 */
#ifndef SP_CORE_JBUF_H
#define SP_CORE_JBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct sp_jbuf {
    char *p;
    size_t len, cap;
    bool oom; /* an append failed: the content is incomplete */
} sp_jbuf_t;

void sp_jbuf_init(sp_jbuf_t *b);
void sp_jbuf_free(sp_jbuf_t *b);
void sp_jbuf_reset(sp_jbuf_t *b);
void sp_jbuf_raw(sp_jbuf_t *b, const char *s, size_t n);
void sp_jbuf_lit(sp_jbuf_t *b, const char *s);               /* raw C string */
void sp_jbuf_str(sp_jbuf_t *b, const char *s, size_t n);     /* quoted, escaped */
void sp_jbuf_cstr(sp_jbuf_t *b, const char *s);              /* quoted; NULL -> null */
void sp_jbuf_int(sp_jbuf_t *b, int64_t v);
void sp_jbuf_num(sp_jbuf_t *b, double v);                    /* non-finite -> null */
void sp_jbuf_printf(sp_jbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append a jansson value as compact JSON. */
void sp_jbuf_json(sp_jbuf_t *b, const json_t *v);

#endif /* SP_CORE_JBUF_H */
