/*
 * jinja_value.c - the template engine's arena, values, JSON reader and the
 * Python-style printing (str, repr, json.dumps) that templates rely on.
 *
 * Threads: an arena and its values belong to one compile or one render, on
 * one thread. Memory: everything lives on the arena (jinja_impl.h) and is
 * freed with it at once.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "chat/jinja_impl.h"

/* ---- arena ------------------------------------------------------------ */
#define JARENA_CHUNK (64u * 1024u)

struct sp__jarena_chunk {
    sp__jarena_chunk_t *next;
    size_t size, off;
    /* 16-byte aligned data follows */
};

#define JCHUNK_HDR ((sizeof(sp__jarena_chunk_t) + 15u) & ~(size_t)15u)

void
sp__jinja_value_arena_init(sp__jarena_t *a, size_t limit)
{
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
}

void
sp__jinja_value_arena_free(sp__jarena_t *a)
{
    sp__jarena_chunk_t *c = a->head;
    while (c != NULL) {
        sp__jarena_chunk_t *next = c->next;
        sp_free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

bool
sp__jinja_value_arena_over(const sp__jarena_t *a, size_t n)
{
    return a->limit != 0 && (n > a->limit || a->used > a->limit - n);
}

void *
sp__jinja_value_arena_alloc(sp__jarena_t *a, size_t n)
{
    size_t need = (n + 15u) & ~(size_t)15u;
    if (need < n) {
        return NULL;
    }
    sp__jarena_chunk_t *c = a->head;
    if (c == NULL || c->size - c->off < need) {
        size_t size = need > JARENA_CHUNK / 4 ? need : JARENA_CHUNK;
        size_t total;
        if (sp_add_size(size, JCHUNK_HDR, &total) != 0 || sp__jinja_value_arena_over(a, total)) {
            /* makes sp__jinja_value_arena_over sticky */
            a->used = a->limit != 0 ? a->limit : a->used;
            return NULL;
        }
        sp__jarena_chunk_t *nc = sp_malloc(total);
        if (nc == NULL) {
            return NULL;
        }
        nc->size = size;
        nc->off = 0;
        a->used += total;
        if (c != NULL && size != JARENA_CHUNK) {
            /* A big one-off block goes behind the current chunk, which keeps its free space. */
            nc->next = c->next;
            c->next = nc;
            nc->off = need;
            return (char *)nc + JCHUNK_HDR;
        }
        nc->next = c;
        a->head = nc;
        c = nc;
    }
    void *p = (char *)c + JCHUNK_HDR + c->off;
    c->off += need;
    return p;
}

/* ---- buffers ---------------------------------------------------------- */
sp_status_t
sp__jinja_value_buf_put(sp__jbuf_t *b, const char *s, size_t n)
{
    if (n == 0) {
        return SP_OK;
    }
    if (n > b->limit || b->n > b->limit - n) {
        return SP_ERR_TOO_LARGE;
    }
    if (b->n + n + 1 > b->cap_alloc) {
        size_t cap = b->cap_alloc < 256 ? 256 : b->cap_alloc;
        while (cap < b->n + n + 1) {
            cap *= 2;
        }
        if (cap > b->limit + 1) {
            cap = b->limit + 1;
        }
        char *p = sp__jinja_value_arena_alloc(b->a, cap);
        if (p == NULL) {
            return sp__jinja_value_arena_over(b->a, cap) ? SP_ERR_TOO_LARGE : SP_ERR_NOMEM;
        }
        if (b->n > 0) {
            memcpy(p, b->p, b->n);
        }
        b->p = p;
        b->cap_alloc = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return SP_OK;
}

static sp_status_t
jbuf_puts(sp__jbuf_t *b, const char *s)
{
    return sp__jinja_value_buf_put(b, s, strlen(s));
}

/* ---- lists and dicts -------------------------------------------------- */
sp__jlist_t *
sp__jinja_value_list_new(sp__jarena_t *a, size_t cap)
{
    sp__jlist_t *l = sp__jinja_value_arena_alloc(a, sizeof *l);
    if (l == NULL) {
        return NULL;
    }
    l->n = 0;
    l->cap = 0;
    l->v = NULL;
    if (cap > 0) {
        size_t bytes;
        if (sp_mul_size(cap, sizeof(sp__jv_t), &bytes) != 0 ||
            (l->v = sp__jinja_value_arena_alloc(a, bytes)) == NULL) {
            return NULL;
        }
        l->cap = cap;
    }
    return l;
}

bool
sp__jinja_value_list_push(sp__jarena_t *a, sp__jlist_t *l, sp__jv_t v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap < 4 ? 4 : l->cap * 2, bytes;
        if (sp_mul_size(cap, sizeof(sp__jv_t), &bytes) != 0) {
            return false;
        }
        sp__jv_t *nv = sp__jinja_value_arena_alloc(a, bytes);
        if (nv == NULL) {
            return false;
        }
        if (l->n > 0) {
            memcpy(nv, l->v, l->n * sizeof(sp__jv_t));
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

sp__jdict_t *
sp__jinja_value_dict_new(sp__jarena_t *a, size_t cap)
{
    sp__jdict_t *d = sp__jinja_value_arena_alloc(a, sizeof *d);
    if (d == NULL) {
        return NULL;
    }
    d->n = 0;
    d->cap = 0;
    d->e = NULL;
    if (cap > 0) {
        size_t bytes;
        if (sp_mul_size(cap, sizeof(sp__jentry_t), &bytes) != 0 ||
            (d->e = sp__jinja_value_arena_alloc(a, bytes)) == NULL) {
            return NULL;
        }
        d->cap = cap;
    }
    return d;
}

const sp__jv_t *
sp__jinja_value_dict_get(const sp__jdict_t *d, const char *k, size_t kn)
{
    /* Newest first, so a JSON object with a repeated key reads the last one, like Python. */
    for (size_t i = d->n; i-- > 0;) {
        if (d->e[i].kn == kn && memcmp(d->e[i].k, k, kn) == 0) {
            return &d->e[i].v;
        }
    }
    return NULL;
}

bool
sp__jinja_value_dict_set(sp__jarena_t *a, sp__jdict_t *d, const char *k, size_t kn, sp__jv_t v)
{
    sp__jv_t *old = (sp__jv_t *)sp__jinja_value_dict_get(d, k, kn);
    if (old != NULL) {
        *old = v;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap < 4 ? 4 : d->cap * 2, bytes;
        if (sp_mul_size(cap, sizeof(sp__jentry_t), &bytes) != 0) {
            return false;
        }
        sp__jentry_t *ne = sp__jinja_value_arena_alloc(a, bytes);
        if (ne == NULL) {
            return false;
        }
        if (d->n > 0) {
            memcpy(ne, d->e, d->n * sizeof(sp__jentry_t));
        }
        d->e = ne;
        d->cap = cap;
    }
    d->e[d->n].k = k;
    d->e[d->n].kn = kn;
    d->e[d->n].v = v;
    d->n++;
    return true;
}

/* ---- UTF-8 (core/utf8.h) --------------------------------------------- */
size_t
sp__jinja_value_utf8_count(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t count = 0;
    for (size_t i = 0; i < n; count++) {
        size_t l = sp_utf8_seq(u + i, n - i);
        i += l == 0 ? 1 : l;
    }
    return count;
}

size_t
sp__jinja_value_utf8_offset(const char *s, size_t n, size_t cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    for (size_t c = 0; c < cp && i < n; c++) {
        size_t l = sp_utf8_seq(u + i, n - i);
        i += l == 0 ? 1 : l;
    }
    return i;
}

static size_t
utf8_put(char *dst, unsigned cp)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- JSON reader ------------------------------------------------------ */
#define JSON_MAX_DEPTH 64

typedef struct json_rd {
    sp__jarena_t *a; /* NULL: check only */
    const char *s;
    size_t n, i;
    char *err;
    size_t err_len;
} json_rd_t;

static sp_status_t
json_fail(json_rd_t *r, const char *what)
{
    if (r->a != NULL && sp__jinja_value_arena_over(r->a, 0)) {
        return sp_errf(r->err, r->err_len, SP_ERR_TOO_LARGE, "json: context over the memory limit");
    }
    return sp_errf(r->err, r->err_len, SP_ERR_INVALID, "json offset %zu: %s", r->i, what);
}

static sp_status_t
json_nomem(json_rd_t *r)
{
    if (sp__jinja_value_arena_over(r->a, 1)) {
        return sp_errf(r->err, r->err_len, SP_ERR_TOO_LARGE, "json: context over the memory limit");
    }
    return sp_errf(r->err, r->err_len, SP_ERR_NOMEM, "json: out of memory");
}

static void
json_ws(json_rd_t *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' ||
                           r->s[r->i] == '\r')) {
        r->i++;
    }
}

static int
hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') {
            v |= (unsigned)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v |= (unsigned)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v |= (unsigned)(c - 'A' + 10);
        } else {
            return -1;
        }
    }
    *out = v;
    return 0;
}

static sp_status_t
json_string(json_rd_t *r, const char **out, size_t *out_n)
{
    r->i++; /* opening quote */
    size_t start = r->i;
    bool plain = true;
    while (r->i < r->n && r->s[r->i] != '"') {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c < 0x20) {
            return json_fail(r, "control character in string");
        }
        if (c == '\\') {
            plain = false;
            r->i += 2;
            continue;
        }
        size_t l = sp_utf8_seq((const unsigned char *)r->s + r->i, r->n - r->i);
        if (l == 0) {
            return json_fail(r, "invalid UTF-8 in string");
        }
        r->i += l;
    }
    if (r->i >= r->n) {
        return json_fail(r, "unterminated string");
    }
    size_t end = r->i++;
    if (plain) {
        *out = r->s + start;
        *out_n = end - start;
        return SP_OK;
    }
    /* Escapes: the decoded text is never longer than the source. */
    char *dst = NULL;
    if (r->a != NULL && (dst = sp__jinja_value_arena_alloc(r->a, end - start + 1)) == NULL) {
        return json_nomem(r);
    }
    size_t o = 0;
    for (size_t i = start; i < end;) {
        char c = r->s[i];
        if (c != '\\') {
            if (dst != NULL) {
                dst[o] = c;
            }
            o++, i++;
            continue;
        }
        r->i = i;
        char e = r->s[i + 1];
        i += 2;
        char one = 0;
        switch (e) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (i + 4 > end || hex4(r->s + i, &cp) != 0) {
                return json_fail(r, "bad \\u escape");
            }
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (i + 6 > end || r->s[i] != '\\' || r->s[i + 1] != 'u' ||
                    hex4(r->s + i + 2, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF) {
                    return json_fail(r, "unpaired surrogate");
                }
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return json_fail(r, "unpaired surrogate");
            }
            char tmp[4];
            size_t l = utf8_put(tmp, cp);
            if (dst != NULL) {
                memcpy(dst + o, tmp, l);
            }
            o += l;
            continue;
        }
        default:
            return json_fail(r, "bad escape");
        }
        if (dst != NULL) {
            dst[o] = one;
        }
        o++;
    }
    r->i = end + 1;
    *out = dst;
    *out_n = o;
    return SP_OK;
}

static sp_status_t json_value(json_rd_t *r, sp__jv_t *out, int depth);

static sp_status_t
json_number(json_rd_t *r, sp__jv_t *out)
{
    size_t start = r->i;
    bool is_float = false;
    if (r->s[r->i] == '-') {
        r->i++;
    }
    if (r->i >= r->n || !(r->s[r->i] >= '0' && r->s[r->i] <= '9')) {
        return json_fail(r, "bad number");
    }
    if (r->s[r->i] == '0') {
        r->i++;
    } else {
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
            r->i++;
        }
    }
    if (r->i < r->n && r->s[r->i] == '.') {
        is_float = true;
        r->i++;
        if (r->i >= r->n || !(r->s[r->i] >= '0' && r->s[r->i] <= '9')) {
            return json_fail(r, "bad number");
        }
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
            r->i++;
        }
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        is_float = true;
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) {
            r->i++;
        }
        if (r->i >= r->n || !(r->s[r->i] >= '0' && r->s[r->i] <= '9')) {
            return json_fail(r, "bad number");
        }
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
            r->i++;
        }
    }
    char tmp[64];
    size_t len = r->i - start;
    if (len >= sizeof tmp) {
        is_float = true; /* too many digits for int64 anyway */
        len = sizeof tmp - 1;
    }
    memcpy(tmp, r->s + start, len);
    tmp[len] = '\0';
    if (!is_float) {
        errno = 0;
        long long v = strtoll(tmp, NULL, 10);
        if (errno != ERANGE) {
            *out = sp__jv_int((int64_t)v);
            return SP_OK;
        }
    }
    /* Non-integers, and integers beyond int64 (Python keeps them exact; we approximate). */
    if (r->i - start >= sizeof tmp) {
        char *big = r->a != NULL ? sp__jinja_value_arena_alloc(r->a, r->i - start + 1) : NULL;
        if (big == NULL) {
            *out = sp__jv_float(0);
            return r->a == NULL ? SP_OK : json_nomem(r);
        }
        memcpy(big, r->s + start, r->i - start);
        big[r->i - start] = '\0';
        *out = sp__jv_float(strtod(big, NULL));
        return SP_OK;
    }
    *out = sp__jv_float(strtod(tmp, NULL));
    return SP_OK;
}

static sp_status_t
json_value(json_rd_t *r, sp__jv_t *out, int depth)
{
    sp_status_t st;
    json_ws(r);
    if (r->i >= r->n) {
        return json_fail(r, "unexpected end");
    }
    char c = r->s[r->i];
    if (c == '{' || c == '[') {
        if (depth >= JSON_MAX_DEPTH) {
            return json_fail(r, "nested too deep");
        }
        bool obj = c == '{';
        sp__jlist_t *l = NULL;
        sp__jdict_t *d = NULL;
        if (r->a != NULL) {
            if (obj ? (d = sp__jinja_value_dict_new(r->a, 0)) == NULL
                    : (l = sp__jinja_value_list_new(r->a, 0)) == NULL) {
                return json_nomem(r);
            }
        }
        r->i++;
        json_ws(r);
        char close = obj ? '}' : ']';
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
        } else {
            for (;;) {
                const char *k = NULL;
                size_t kn = 0;
                if (obj) {
                    json_ws(r);
                    if (r->i >= r->n || r->s[r->i] != '"') {
                        return json_fail(r, "expected a key");
                    }
                    if ((st = json_string(r, &k, &kn)) != SP_OK) {
                        return st;
                    }
                    json_ws(r);
                    if (r->i >= r->n || r->s[r->i] != ':') {
                        return json_fail(r, "expected ':'");
                    }
                    r->i++;
                }
                sp__jv_t v = {0};
                if ((st = json_value(r, &v, depth + 1)) != SP_OK) {
                    return st;
                }
                if (r->a != NULL &&
                    !(obj ? sp__jinja_value_dict_set(r->a, d, k, kn, v)
                          : sp__jinja_value_list_push(r->a, l, v))) {
                    return json_nomem(r);
                }
                json_ws(r);
                if (r->i < r->n && r->s[r->i] == ',') {
                    r->i++;
                    continue;
                }
                if (r->i < r->n && r->s[r->i] == close) {
                    r->i++;
                    break;
                }
                return json_fail(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            }
        }
        out->k = obj ? JV_DICT : JV_LIST;
        out->markup = out->lazy = 0;
        if (obj) {
            out->u.d = d;
        } else {
            out->u.l = l;
        }
        return SP_OK;
    }
    if (c == '"') {
        const char *p;
        size_t n;
        if ((st = json_string(r, &p, &n)) != SP_OK) {
            return st;
        }
        *out = sp__jv_str(p, n);
        return SP_OK;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        return json_number(r, out);
    }
    static const struct {
        const char *w;
        int v;
    } words[] = {{"true", 1}, {"false", 0}, {"null", -1}};
    for (size_t w = 0; w < 3; w++) {
        size_t l = strlen(words[w].w);
        if (r->n - r->i >= l && memcmp(r->s + r->i, words[w].w, l) == 0) {
            r->i += l;
            *out = words[w].v < 0 ? sp__jv_none() : sp__jv_bool(words[w].v != 0);
            return SP_OK;
        }
    }
    return json_fail(r, "unexpected character");
}

static sp_status_t
json_doc(json_rd_t *r, sp__jv_t *out)
{
    sp_status_t st = json_value(r, out, 0);
    if (st != SP_OK) {
        return st;
    }
    json_ws(r);
    if (r->i != r->n) {
        return json_fail(r, "trailing characters");
    }
    return SP_OK;
}

sp_status_t
sp__jinja_value_json_parse(sp__jarena_t *a, const char *s, size_t n, sp__jv_t *out, char *err,
                           size_t err_len)
{
    json_rd_t r = {a, s, n, 0, err, err_len};
    return json_doc(&r, out);
}

sp_status_t
sp__jinja_value_json_check(const char *json, size_t len, char *err, size_t err_len)
{
    json_rd_t r = {NULL, json, len, 0, err, err_len};
    sp__jv_t v = {0};
    return json_doc(&r, &v);
}

/* ---- printing --------------------------------------------------------- */
/* Python float repr ("1.0", "0.1", "1e+16") into buf (>= 32 bytes). */
static size_t
float_repr(double f, char *buf)
{
    if (isnan(f)) {
        return (size_t)snprintf(buf, 32, "nan");
    }
    if (isinf(f)) {
        return (size_t)snprintf(buf, 32, f < 0 ? "-inf" : "inf");
    }
    /* Shortest digits that read back to f, then Python's layout: fixed
     * notation for exponents in [-4, 16), else d.ddde+XX. */
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) {
            break;
        }
    }
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p != 'e'; p++) {
        if (*p >= '0' && *p <= '9' && nd < sizeof digits - 1) {
            digits[nd++] = *p;
        }
    }
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') {
        nd--;
    }
    digits[nd] = '\0';
    size_t o = 0;
    if (neg) {
        buf[o++] = '-';
    }
    if (exp >= 16 || exp < -4) {
        buf[o++] = digits[0];
        if (nd > 1) {
            buf[o++] = '.';
            memcpy(buf + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        o += (size_t)snprintf(buf + o, 16, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        buf[o++] = '0';
        buf[o++] = '.';
        for (int i = -1; i > exp; i--) {
            buf[o++] = '0';
        }
        memcpy(buf + o, digits, nd);
        o += nd;
    } else {
        for (int i = 0; i <= exp; i++) {
            buf[o++] = (size_t)i < nd ? digits[i] : '0';
        }
        buf[o++] = '.';
        if ((size_t)exp + 1 < nd) {
            memcpy(buf + o, digits + exp + 1, nd - (size_t)exp - 1);
            o += nd - (size_t)exp - 1;
        } else {
            buf[o++] = '0';
        }
    }
    buf[o] = '\0';
    return o;
}

/* Python repr of a str: single quotes unless the text has ' and no ". */
static sp_status_t
write_str_repr(sp__jbuf_t *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    sp_status_t st = sp__jinja_value_buf_put(b, &q, 1);
    size_t run = 0;
    for (size_t i = 0; i < n && st == SP_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *rep = NULL;
        if (c == '\\') {
            rep = "\\\\";
        } else if (c == (unsigned char)q) {
            rep = q == '\'' ? "\\'" : "\\\"";
        } else if (c == '\n') {
            rep = "\\n";
        } else if (c == '\r') {
            rep = "\\r";
        } else if (c == '\t') {
            rep = "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            rep = esc;
        }
        if (rep != NULL) {
            st = sp__jinja_value_buf_put(b, s + i - run, run);
            run = 0;
            if (st == SP_OK) {
                st = jbuf_puts(b, rep);
            }
        } else {
            run++;
        }
    }
    if (st == SP_OK) {
        st = sp__jinja_value_buf_put(b, s + n - run, run);
    }
    if (st == SP_OK) {
        st = sp__jinja_value_buf_put(b, &q, 1);
    }
    return st;
}

sp_status_t
sp__jinja_value_write(sp__jbuf_t *b, const sp__jv_t *v, bool repr, int max_depth)
{
    char num[40];
    sp_status_t st = SP_OK;
    if (max_depth <= 0) {
        return SP_ERR_TOO_LARGE;
    }
    switch (v->k) {
    case JV_UNDEF:
        return SP_OK;
    case JV_NONE:
        return jbuf_puts(b, "None");
    case JV_BOOL:
        return jbuf_puts(b, v->u.b ? "True" : "False");
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        return jbuf_puts(b, num);
    case JV_FLOAT:
        float_repr(v->u.f, num);
        return jbuf_puts(b, num);
    case JV_STR:
        return repr ? write_str_repr(b, v->u.s.p, v->u.s.n)
                    : sp__jinja_value_buf_put(b, v->u.s.p, v->u.s.n);
    case JV_LIST:
        st = jbuf_puts(b, "[");
        for (size_t i = 0; i < v->u.l->n && st == SP_OK; i++) {
            if (i > 0) {
                st = jbuf_puts(b, ", ");
            }
            if (st == SP_OK) {
                st = sp__jinja_value_write(b, &v->u.l->v[i], true, max_depth - 1);
            }
        }
        return st == SP_OK ? jbuf_puts(b, "]") : st;
    case JV_DICT:
    case JV_NS:
        st = jbuf_puts(b, v->k == JV_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v->u.d->n && st == SP_OK; i++) {
            if (i > 0) {
                st = jbuf_puts(b, ", ");
            }
            if (st == SP_OK && sp__jkey_is_int(v->u.d->e[i].k, v->u.d->e[i].kn)) {
                char ik[24];
                snprintf(ik, sizeof ik, "%lld", (long long)sp__jkey_int(v->u.d->e[i].k));
                st = jbuf_puts(b, ik);
            } else if (st == SP_OK) {
                st = write_str_repr(b, v->u.d->e[i].k, v->u.d->e[i].kn);
            }
            if (st == SP_OK) {
                st = jbuf_puts(b, ": ");
            }
            if (st == SP_OK) {
                st = sp__jinja_value_write(b, &v->u.d->e[i].v, true, max_depth - 1);
            }
        }
        return st == SP_OK ? jbuf_puts(b, v->k == JV_NS ? "}>" : "}") : st;
    case JV_FUNC:
    case JV_MACRO:
        return jbuf_puts(b, "<function>");
    case JV_LOOP:
        return jbuf_puts(b, "<LoopContext>");
    default:
        return SP_OK;
    }
}

static sp_status_t
json_write_str(sp__jbuf_t *b, const char *s, size_t n)
{
    sp_status_t st = jbuf_puts(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n && st == SP_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *rep = NULL;
        switch (c) {
        case '"': rep = "\\\""; break;
        case '\\': rep = "\\\\"; break;
        case '\n': rep = "\\n"; break;
        case '\r': rep = "\\r"; break;
        case '\t': rep = "\\t"; break;
        case '\b': rep = "\\b"; break;
        case '\f': rep = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                rep = esc;
            }
        }
        if (rep != NULL) {
            st = sp__jinja_value_buf_put(b, s + i - run, run);
            run = 0;
            if (st == SP_OK) {
                st = jbuf_puts(b, rep);
            }
        } else {
            run++;
        }
    }
    if (st == SP_OK) {
        st = sp__jinja_value_buf_put(b, s + n - run, run);
    }
    return st == SP_OK ? jbuf_puts(b, "\"") : st;
}

static sp_status_t
json_newline(sp__jbuf_t *b, int indent, int level)
{
    sp_status_t st = jbuf_puts(b, "\n");
    for (int i = 0; i < indent * level && st == SP_OK; i++) {
        st = jbuf_puts(b, " ");
    }
    return st;
}

static int
entry_cmp(const void *x, const void *y)
{
    const sp__jentry_t *a = *(const sp__jentry_t *const *)x, *b = *(const sp__jentry_t *const *)y;
    bool ia = sp__jkey_is_int(a->k, a->kn), ib = sp__jkey_is_int(b->k, b->kn);
    if (ia || ib) { /* integers in their order, before strings */
        if (ia && ib) {
            int64_t u = sp__jkey_int(a->k), v = sp__jkey_int(b->k);
            return u < v ? -1 : u > v;
        }
        return ia ? -1 : 1;
    }
    size_t n = a->kn < b->kn ? a->kn : b->kn;
    int c = n > 0 ? memcmp(a->k, b->k, n) : 0;
    return c != 0 ? c : (a->kn < b->kn ? -1 : a->kn > b->kn);
}

static sp_status_t
tojson_rec(sp__jbuf_t *b, const sp__jv_t *v, int indent, bool sort_keys, int depth, int level)
{
    char num[40];
    sp_status_t st = SP_OK;
    if (depth <= 0) {
        return SP_ERR_TOO_LARGE;
    }
    switch (v->k) {
    case JV_NONE:
        return jbuf_puts(b, "null");
    case JV_BOOL:
        return jbuf_puts(b, v->u.b ? "true" : "false");
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        return jbuf_puts(b, num);
    case JV_FLOAT:
        if (isnan(v->u.f)) {
            return jbuf_puts(b, "NaN");
        }
        if (isinf(v->u.f)) {
            return jbuf_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        }
        float_repr(v->u.f, num);
        return jbuf_puts(b, num);
    case JV_STR:
        return json_write_str(b, v->u.s.p, v->u.s.n);
    case JV_LIST:
        if (v->lazy) {
            return SP_ERR_INVALID; /* a generator (map, select, ...) is not JSON */
        }
        if (v->u.l->n == 0) {
            return jbuf_puts(b, "[]");
        }
        st = jbuf_puts(b, "[");
        for (size_t i = 0; i < v->u.l->n && st == SP_OK; i++) {
            if (i > 0) {
                st = jbuf_puts(b, indent >= 0 ? "," : ", ");
            }
            if (st == SP_OK && indent >= 0) {
                st = json_newline(b, indent, level + 1);
            }
            if (st == SP_OK) {
                st = tojson_rec(b, &v->u.l->v[i], indent, sort_keys, depth - 1, level + 1);
            }
        }
        if (st == SP_OK && indent >= 0) {
            st = json_newline(b, indent, level);
        }
        return st == SP_OK ? jbuf_puts(b, "]") : st;
    case JV_DICT:
    case JV_NS: {
        const sp__jdict_t *d = v->u.d;
        if (d->n == 0) {
            return jbuf_puts(b, "{}");
        }
        /* Sorting needs an index; it lives on the buffer's arena. */
        const sp__jentry_t **order = sp__jinja_value_arena_alloc(b->a, d->n * sizeof *order);
        if (order == NULL) {
            return sp__jinja_value_arena_over(b->a, d->n * sizeof *order) ? SP_ERR_TOO_LARGE
                                                                         : SP_ERR_NOMEM;
        }
        size_t m = 0;
        for (size_t i = 0; i < d->n; i++) {
            /* Repeated keys (JSON input): the last value wins, at the first key's place. */
            bool dup = false;
            for (size_t j = 0; j < m && !dup; j++) {
                dup = order[j]->kn == d->e[i].kn && memcmp(order[j]->k, d->e[i].k, d->e[i].kn) == 0;
            }
            if (!dup) {
                order[m++] = &d->e[i];
            }
        }
        if (sort_keys) {
            qsort(order, m, sizeof *order, entry_cmp);
        }
        st = jbuf_puts(b, "{");
        for (size_t i = 0; i < m && st == SP_OK; i++) {
            if (i > 0) {
                st = jbuf_puts(b, indent >= 0 ? "," : ", ");
            }
            if (st == SP_OK && indent >= 0) {
                st = json_newline(b, indent, level + 1);
            }
            if (st == SP_OK && sp__jkey_is_int(order[i]->k, order[i]->kn)) {
                char ik[26]; /* json.dumps writes an int key as a string */
                snprintf(ik, sizeof ik, "\"%lld\"", (long long)sp__jkey_int(order[i]->k));
                st = jbuf_puts(b, ik);
            } else if (st == SP_OK) {
                st = json_write_str(b, order[i]->k, order[i]->kn);
            }
            if (st == SP_OK) {
                st = jbuf_puts(b, ": ");
            }
            if (st == SP_OK) {
                const sp__jv_t *val = sp__jinja_value_dict_get(d, order[i]->k, order[i]->kn);
                st = tojson_rec(b, val, indent, sort_keys, depth - 1, level + 1);
            }
        }
        if (st == SP_OK && indent >= 0) {
            st = json_newline(b, indent, level);
        }
        return st == SP_OK ? jbuf_puts(b, "}") : st;
    }
    default:
        return SP_ERR_INVALID; /* undefined, functions, loop: not JSON */
    }
}

sp_status_t
sp__jinja_value_tojson(sp__jbuf_t *b, const sp__jv_t *v, int indent, bool sort_keys, int max_depth)
{
    return tojson_rec(b, v, indent, sort_keys, max_depth, 0);
}
