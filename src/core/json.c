/* json.c - request parsing (jansson behind a depth scan) and the response writer. */
#include "core/json.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

static void
json_set_hooks(void)
{
    json_set_alloc_funcs(sp_malloc, sp_free);
}

void
sp_json_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, json_set_hooks);
}

int
sp_json_depth(const char *buf, size_t len, int limit)
{
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char ch = buf[i];
        if (in_str) {
            if (ch == '\\') {
                i++; /* the escaped byte cannot end the string */
            } else if (ch == '"') {
                in_str = false;
            }
            continue;
        }
        if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max) {
                max = depth;
                if (max > limit) {
                    return limit + 1;
                }
            }
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return max;
}

sp_status_t
sp_json_parse(const char *buf, size_t len, int max_depth, json_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_json_init();
    if (sp_json_depth(buf, len, max_depth) > max_depth) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "JSON nested deeper than %d levels", max_depth);
    }
    json_error_t je;
    json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (v == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "invalid JSON at line %d, column %d: %s",
                       je.line, je.column, je.text);
    }
    *out = v;
    return SP_OK;
}

int
sp_json_fail(sp_json_err_t *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->param = param;
    return -1;
}

static const char *
type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

int
sp_json_get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v); /* 5.0 is an integer to most clients */
    } else {
        return sp_json_fail(e, key, "'%s' must be an integer, got %s", key, type_name(v));
    }
    if (x < lo || x > hi) {
        return sp_json_fail(e, key, "'%s' must be between %lld and %lld, got %lld", key,
                            (long long)lo, (long long)hi, (long long)x);
    }
    *out = x;
    return 1;
}

int
sp_json_get_num(const json_t *obj, const char *key, double lo, double hi, double *out,
                sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    if (!json_is_number(v)) {
        return sp_json_fail(e, key, "'%s' must be a number, got %s", key, type_name(v));
    }
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) {
        return sp_json_fail(e, key, "'%s' must be between %g and %g, got %g", key, lo, hi, x);
    }
    *out = x;
    return 1;
}

int
sp_json_get_bool(const json_t *obj, const char *key, bool *out, sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    if (!json_is_boolean(v)) {
        return sp_json_fail(e, key, "'%s' must be a boolean, got %s", key, type_name(v));
    }
    *out = json_is_true(v);
    return 1;
}

int
sp_json_get_str(const json_t *obj, const char *key, const char **out, size_t *len,
                sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    if (!json_is_string(v)) {
        return sp_json_fail(e, key, "'%s' must be a string, got %s", key, type_name(v));
    }
    *out = json_string_value(v);
    if (len) {
        *len = json_string_length(v);
    }
    return 1;
}

/* ------------------------------------------------------------------ writer */

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

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static size_t
utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) {
        return 1;
    }
    size_t need;
    unsigned min;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4, min = 0x10000;
    } else {
        return 0;
    }
    if (n < need) {
        return 0;
    }
    unsigned cp = c & (0x3F >> (need - 1));
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        return 0;
    }
    return need;
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
        size_t k = utf8_seq(u + i, n - i);
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
