/* jbuf.c - the append-only JSON writer of responses and stream chunks (jbuf.h). */
#include "core/jbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"

void
sp_jbuf_init(sp_jbuf_t *b)
{
    memset(b, 0, sizeof *b);
}

void
sp_jbuf_free(sp_jbuf_t *b)
{
    sp_free(b->p);
    memset(b, 0, sizeof *b);
}

void
sp_jbuf_reset(sp_jbuf_t *b)
{
    b->len = 0;
    b->oom = false;
}

static bool
reserve(sp_jbuf_t *b, size_t extra)
{
    if (b->oom) {
        return false;
    }
    if (extra <= b->cap - b->len) {
        return true;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = sp_realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void
sp_jbuf_raw(sp_jbuf_t *b, const char *s, size_t n)
{
    if (reserve(b, n + 1)) {
        memcpy(b->p + b->len, s, n);
        b->len += n;
        b->p[b->len] = '\0';
    }
}

void
sp_jbuf_lit(sp_jbuf_t *b, const char *s)
{
    sp_jbuf_raw(b, s, strlen(s));
}

void
sp_jbuf_str(sp_jbuf_t *b, const char *s, size_t n)
{
    /* Worst case: every byte becomes \u00XX (6) or U+FFFD (3). */
    if (!reserve(b, n * 6 + 3)) {
        return;
    }
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    char *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            i++;
            continue;
        }
        if (c < 0x80) {
            *o++ = '\\';
            switch (c) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            default:
                *o++ = 'u', *o++ = '0', *o++ = '0';
                *o++ = hex[c >> 4], *o++ = hex[c & 15];
            }
            i++;
            continue;
        }
        size_t k = sp_utf8_seq(u + i, n - i);
        if (k == 0) {
            *o++ = (char)0xEF, *o++ = (char)0xBF, *o++ = (char)0xBD; /* U+FFFD */
            i++;
        } else {
            memcpy(o, u + i, k);
            o += k;
            i += k;
        }
    }
    *o++ = '"';
    *o = '\0';
    b->len = (size_t)(o - b->p);
}

void
sp_jbuf_cstr(sp_jbuf_t *b, const char *s)
{
    if (s == NULL) {
        sp_jbuf_raw(b, "null", 4);
    } else {
        sp_jbuf_str(b, s, strlen(s));
    }
}

void
sp_jbuf_int(sp_jbuf_t *b, int64_t v)
{
    char t[32];
    int n = snprintf(t, sizeof t, "%lld", (long long)v);
    sp_jbuf_raw(b, t, (size_t)n);
}

void
sp_jbuf_num(sp_jbuf_t *b, double v)
{
    if (!isfinite(v)) {
        sp_jbuf_raw(b, "null", 4);
        return;
    }
    char t[40];
    int n = snprintf(t, sizeof t, "%.9g", v);
    sp_jbuf_raw(b, t, (size_t)n);
}

void
sp_jbuf_printf(sp_jbuf_t *b, const char *fmt, ...)
{
    char t[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    if ((size_t)n < sizeof t) {
        sp_jbuf_raw(b, t, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n + 1)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static int
dump_cb(const char *buffer, size_t size, void *data)
{
    sp_jbuf_raw(data, buffer, size);
    return ((sp_jbuf_t *)data)->oom ? -1 : 0;
}

void
sp_jbuf_json(sp_jbuf_t *b, const json_t *v)
{
    if (json_dump_callback(v, dump_cb, b, JSON_COMPACT | JSON_ENCODE_ANY) != 0) {
        b->oom = true;
    }
}
