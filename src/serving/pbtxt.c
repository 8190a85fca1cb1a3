/*
 * pbtxt.c - the protobuf text format into JSON, JSON to and from protobuf-c
 * messages, over the protobuf-c descriptors (pbtxt.h says what is read).
 *
 * Threads: none. Memory: jansson values for JSON, sp_malloc for positions
 * and for messages (through a ProtobufCAllocator, so protobuf-c's own free
 * releases them).
 */
#include "serving/pbtxt.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

#define PATH_LEN 512

/* ---- descriptors */

static bool
is_map(const ProtobufCFieldDescriptor *f)
{
    if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->label != PROTOBUF_C_LABEL_REPEATED) return false;
    const ProtobufCMessageDescriptor *d = f->descriptor;
    size_t n = strlen(d->name);
    return d->n_fields == 2 && n > 5 && strcmp(d->name + n - 5, "Entry") == 0 &&
           strcmp(d->fields[0].name, "key") == 0 && strcmp(d->fields[1].name, "value") == 0;
}

static size_t
elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 0;
}

static bool
is_signed_int(ProtobufCType t)
{
    return t == PROTOBUF_C_TYPE_INT32 || t == PROTOBUF_C_TYPE_SINT32 ||
           t == PROTOBUF_C_TYPE_SFIXED32 || t == PROTOBUF_C_TYPE_INT64 ||
           t == PROTOBUF_C_TYPE_SINT64 || t == PROTOBUF_C_TYPE_SFIXED64;
}

static bool
is_unsigned_int(ProtobufCType t)
{
    return t == PROTOBUF_C_TYPE_UINT32 || t == PROTOBUF_C_TYPE_FIXED32 ||
           t == PROTOBUF_C_TYPE_UINT64 || t == PROTOBUF_C_TYPE_FIXED64;
}

static bool
is_32(ProtobufCType t)
{
    return elem_size(t) == 4;
}

/* ---- positions */

void
sp_pbtxt_posmap_free(sp_pbtxt_posmap_t *m)
{
    if (!m) return;
    for (int32_t i = 0; i < m->n; i++) sp_free(m->v[i].path);
    sp_free(m->v);
    memset(m, 0, sizeof *m);
}

static sp_status_t
pos_add(sp_pbtxt_posmap_t *m, const char *path, int32_t line, int32_t col)
{
    if (!m) return SP_OK;
    if (m->n == m->cap) {
        int32_t cap = m->cap ? m->cap * 2 : 32;
        sp_pbtxt_pos_t *v = sp_realloc(m->v, (size_t)cap * sizeof *v);
        if (!v) return SP_ERR_NOMEM;
        m->v = v;
        m->cap = cap;
    }
    char *p = sp_strndup(path, strlen(path));
    if (!p) return SP_ERR_NOMEM;
    m->v[m->n++] = (sp_pbtxt_pos_t){p, line, col};
    return SP_OK;
}

const sp_pbtxt_pos_t *
sp_pbtxt_posmap_find(const sp_pbtxt_posmap_t *m, const char *path)
{
    if (!m || !path) return NULL;
    char buf[PATH_LEN];
    snprintf(buf, sizeof buf, "%s", path);
    for (;;) {
        for (int32_t i = 0; i < m->n; i++) {
            if (strcmp(m->v[i].path, buf) == 0) return &m->v[i];
        }
        char *dot = strrchr(buf, '.'), *br = strrchr(buf, '[');
        char *cut = dot > br ? dot : br;
        if (cut == NULL || cut == buf) return NULL;
        *cut = '\0';
    }
}

/* ---- the text format */

typedef struct lx {
    const char *s;
    size_t n, i;
    int32_t line, col;
    const char *file;
    char *err;
    size_t err_len;
    int32_t nodes;
    sp_pbtxt_posmap_t *pos;
    const sp_pbtxt_refusal_t *refused;
} lx_t;

static sp_status_t SP_PRINTF(5, 6)
fail(lx_t *x, int32_t line, int32_t col, const char *path, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (path && path[0]) {
        return sp_errf(x->err, x->err_len, SP_ERR_INVALID, "%s:%d:%d: %s: %s", x->file, line, col,
                       path, msg);
    }
    return sp_errf(x->err, x->err_len, SP_ERR_INVALID, "%s:%d:%d: %s", x->file, line, col, msg);
}

static void
adv(lx_t *x)
{
    if (x->i >= x->n) return;
    if (x->s[x->i] == '\n') {
        x->line++;
        x->col = 1;
    } else {
        x->col++;
    }
    x->i++;
}

/* Skip blanks and # comments; the next character or -1 at the end. */
static int
peek(lx_t *x)
{
    while (x->i < x->n) {
        char c = x->s[x->i];
        if (c == '#') {
            while (x->i < x->n && x->s[x->i] != '\n') adv(x);
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
            adv(x);
        } else {
            return (unsigned char)c;
        }
    }
    return -1;
}

static const char *
show(int c, char *buf)
{
    if (c < 0) return "the end of the file";
    if (c >= 0x21 && c < 0x7f) {
        snprintf(buf, 8, "'%c'", c);
    } else {
        snprintf(buf, 8, "0x%02x", (unsigned)c & 0xffu);
    }
    return buf;
}

static bool
ident_start(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool
ident_char(int c)
{
    return ident_start(c) || (c >= '0' && c <= '9');
}

/* A bare token: an identifier or a number ([A-Za-z0-9_.+-]). 0 when empty. */
static size_t
read_word(lx_t *x, char *buf, size_t cap)
{
    size_t k = 0;
    while (x->i < x->n) {
        int c = (unsigned char)x->s[x->i];
        bool ok = ident_char(c) || c == '.' || c == '-' || c == '+';
        if (!ok) break;
        if (k + 1 < cap) buf[k] = (char)c;
        k++;
        adv(x);
    }
    buf[k < cap ? k : cap - 1] = '\0';
    return k;
}

static int
hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t
put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Room for 4 more bytes (one escape's output) and the NUL in *o. The output
 * is never longer than the input, which the caller bounds. */
static bool
grow(char **o, size_t *cap, size_t k)
{
    if (k + 5 <= *cap) return true;
    size_t nc = *cap * 2 > k + 5 ? *cap * 2 : k + 5;
    char *p = sp_realloc(*o, nc);
    if (!p) return false;
    *o = p;
    *cap = nc;
    return true;
}

/* One or more adjacent quoted strings, joined, into *out (sp_malloc, *out_len
 * bytes plus a NUL). */
static sp_status_t
read_string(lx_t *x, const char *path, char **out, size_t *out_len)
{
    size_t cap = 64;
    char *o = sp_malloc(cap);
    if (!o) return SP_ERR_NOMEM;
    size_t k = 0;
    int c = peek(x);
    while (c == '"' || c == '\'') {
        int q = c;
        int32_t line = x->line, col = x->col;
        adv(x);
        for (;;) {
            if (x->i >= x->n || x->s[x->i] == '\n') {
                sp_free(o);
                return fail(x, line, col, path, "string not closed on its line");
            }
            int ch = (unsigned char)x->s[x->i];
            if (ch == q) {
                adv(x);
                break;
            }
            if (!grow(&o, &cap, k)) {
                sp_free(o);
                return SP_ERR_NOMEM;
            }
            if (ch != '\\') {
                o[k++] = (char)ch;
                adv(x);
                continue;
            }
            int32_t eline = x->line, ecol = x->col;
            adv(x);
            if (x->i >= x->n) continue; /* reported as not closed */
            int e = (unsigned char)x->s[x->i];
            adv(x);
            switch (e) {
            case 'n': o[k++] = '\n'; break;
            case 't': o[k++] = '\t'; break;
            case 'r': o[k++] = '\r'; break;
            case 'a': o[k++] = '\a'; break;
            case 'b': o[k++] = '\b'; break;
            case 'f': o[k++] = '\f'; break;
            case 'v': o[k++] = '\v'; break;
            case '\\': case '\'': case '"': case '?': o[k++] = (char)e; break;
            case 'x': case 'X': {
                int v = 0, nd = 0;
                while (nd < 2 && x->i < x->n && hexval((unsigned char)x->s[x->i]) >= 0) {
                    v = v * 16 + hexval((unsigned char)x->s[x->i]);
                    adv(x);
                    nd++;
                }
                if (nd == 0) {
                    sp_free(o);
                    return fail(x, eline, ecol, path, "\\x needs a hex digit");
                }
                o[k++] = (char)v;
                break;
            }
            case 'u': case 'U': {
                int want = e == 'u' ? 4 : 8;
                uint32_t v = 0;
                for (int d = 0; d < want; d++) {
                    int h = x->i < x->n ? hexval((unsigned char)x->s[x->i]) : -1;
                    if (h < 0) {
                        sp_free(o);
                        return fail(x, eline, ecol, path, "\\%c needs %d hex digits", e, want);
                    }
                    v = v * 16 + (uint32_t)h;
                    adv(x);
                }
                if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
                    sp_free(o);
                    return fail(x, eline, ecol, path, "\\%c: not a Unicode scalar value", e);
                }
                /* 6 or 10 input bytes become at most 4 */
                k += put_utf8(o + k, v);
                break;
            }
            default:
                if (e >= '0' && e <= '7') {
                    int v = e - '0', nd = 1;
                    while (nd < 3 && x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '7') {
                        v = v * 8 + (x->s[x->i] - '0');
                        adv(x);
                        nd++;
                    }
                    if (v > 255) {
                        sp_free(o);
                        return fail(x, eline, ecol, path, "octal escape above \\377");
                    }
                    o[k++] = (char)v;
                    break;
                }
                sp_free(o);
                return fail(x, eline, ecol, path, "unknown escape \\%c", e);
            }
        }
        c = peek(x);
    }
    o[k] = '\0';
    *out = o;
    *out_len = k;
    return SP_OK;
}

static sp_status_t
count_node(lx_t *x, const char *path)
{
    if (++x->nodes > SP_PBTXT_MAX_NODES) {
        return fail(x, x->line, x->col, path, "more than %d values", SP_PBTXT_MAX_NODES);
    }
    return SP_OK;
}

/* A scalar value of field f into *out. */
static sp_status_t
read_scalar(lx_t *x, const ProtobufCFieldDescriptor *f, const char *path, json_t **out)
{
    int c = peek(x);
    int32_t line = x->line, col = x->col;
    sp_status_t st = count_node(x, path);
    if (st) return st;
    *out = NULL;
    if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES) {
        char sb[8];
        if (c != '"' && c != '\'') return fail(x, line, col, path, "expected a quoted string, got %s", show(c, sb));
        char *s = NULL;
        size_t n = 0;
        st = read_string(x, path, &s, &n);
        if (st) return st;
        *out = json_stringn(s, n);
        sp_free(s);
        if (!*out) return fail(x, line, col, path, "not valid UTF-8 (or contains a NUL byte)");
        return SP_OK;
    }
    char w[80], sb[8];
    size_t wl = read_word(x, w, sizeof w);
    if (wl == 0) return fail(x, line, col, path, "expected a value, got %s", show(c, sb));
    if (wl >= sizeof w) return fail(x, line, col, path, "value longer than %zu characters", sizeof w - 1);
    if (f->type == PROTOBUF_C_TYPE_BOOL) {
        if (!strcmp(w, "true") || !strcmp(w, "True") || !strcmp(w, "t") || !strcmp(w, "1")) {
            *out = json_true();
        } else if (!strcmp(w, "false") || !strcmp(w, "False") || !strcmp(w, "f") || !strcmp(w, "0")) {
            *out = json_false();
        } else {
            return fail(x, line, col, path, "\"%s\" is not true or false", w);
        }
        return SP_OK;
    }
    if (f->type == PROTOBUF_C_TYPE_ENUM) {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        const ProtobufCEnumValue *ev = NULL;
        if (ident_start((unsigned char)w[0])) {
            ev = protobuf_c_enum_descriptor_get_value_by_name(ed, w);
        } else {
            char *end = NULL;
            errno = 0;
            long long v = strtoll(w, &end, 10);
            if (errno == 0 && *end == '\0' && v >= INT_MIN && v <= INT_MAX) {
                ev = protobuf_c_enum_descriptor_get_value(ed, (int)v);
            }
        }
        if (!ev) {
            char names[256] = "";
            size_t k = 0;
            for (unsigned i = 0; i < ed->n_values && k + 2 < sizeof names; i++) {
                int m = snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", ed->values[i].name);
                if (m < 0) break;
                k += (size_t)m;
            }
            return fail(x, line, col, path, "\"%s\" is not one of %s", w, names);
        }
        *out = json_string(ev->name);
        return *out ? SP_OK : SP_ERR_NOMEM;
    }
    if (is_signed_int(f->type) || is_unsigned_int(f->type)) {
        char *end = NULL;
        errno = 0;
        bool neg = w[0] == '-';
        if (w[0] == '+') return fail(x, line, col, path, "\"%s\" is not an integer", w);
        long long v;
        if (is_unsigned_int(f->type)) {
            if (neg) return fail(x, line, col, path, "must not be negative, got %s", w);
            unsigned long long u = strtoull(w, &end, 0);
            if (errno || *end || end == w) return fail(x, line, col, path, "\"%s\" is not an integer", w);
            unsigned long long hi = is_32(f->type) ? UINT32_MAX : (unsigned long long)INT64_MAX;
            if (u > hi) return fail(x, line, col, path, "%s is larger than %llu", w, hi);
            v = (long long)u;
        } else {
            v = strtoll(w, &end, 0);
            if (errno == ERANGE) return fail(x, line, col, path, "%s is out of the 64-bit range", w);
            if (errno || *end || end == w) return fail(x, line, col, path, "\"%s\" is not an integer", w);
            if (is_32(f->type) && (v < INT32_MIN || v > INT32_MAX)) {
                return fail(x, line, col, path, "%s is out of the 32-bit range", w);
            }
        }
        *out = json_integer((json_int_t)v);
        return *out ? SP_OK : SP_ERR_NOMEM;
    }
    /* float, double */
    char *end = NULL;
    size_t n = strlen(w);
    bool hex = strchr(w, 'x') || strchr(w, 'X');
    if (!hex && n > 1 && (w[n - 1] == 'f' || w[n - 1] == 'F') && isdigit((unsigned char)w[n - 2])) {
        w[n - 1] = '\0';
    }
    errno = 0;
    double d = strtod(w, &end);
    if (hex || end == w || *end) return fail(x, line, col, path, "\"%s\" is not a number", w);
    if (!isfinite(d)) return fail(x, line, col, path, "%s is not a finite number", w);
    *out = json_real(d);
    return *out ? SP_OK : SP_ERR_NOMEM;
}

static sp_status_t parse_fields(lx_t *x, const ProtobufCMessageDescriptor *d, json_t *obj,
                                const char *path, int depth, int end);

/* The name of a map entry's key (its JSON text). */
static void
key_text(const json_t *k, char *out, size_t n)
{
    if (json_is_string(k)) {
        snprintf(out, n, "%s", json_string_value(k));
    } else if (json_is_integer(k)) {
        snprintf(out, n, "%lld", (long long)json_integer_value(k));
    } else if (json_is_boolean(k)) {
        snprintf(out, n, "%s", json_is_true(k) ? "true" : "false");
    } else {
        out[0] = '\0';
    }
}

/* Rename positions recorded under "<fp>.key" / "<fp>.value..." to "<fp>.<key>...". */
static sp_status_t
rename_entry_pos(lx_t *x, int32_t from, const char *fp, const char *key)
{
    if (!x->pos) return SP_OK;
    char kp[PATH_LEN], vp[PATH_LEN], np[PATH_LEN * 2];
    snprintf(kp, sizeof kp, "%s.key", fp);
    snprintf(vp, sizeof vp, "%s.value", fp);
    size_t vl = strlen(vp);
    for (int32_t i = from; i < x->pos->n; i++) {
        char *p = x->pos->v[i].path;
        if (strcmp(p, kp) == 0) {
            snprintf(np, sizeof np, "%s.%s", fp, key);
        } else if (strncmp(p, vp, vl) == 0 && (p[vl] == '\0' || p[vl] == '.' || p[vl] == '[')) {
            snprintf(np, sizeof np, "%s.%s%s", fp, key, p + vl);
        } else {
            continue;
        }
        char *q = sp_strndup(np, strlen(np));
        if (!q) return SP_ERR_NOMEM;
        sp_free(p);
        x->pos->v[i].path = q;
    }
    return SP_OK;
}

/* A message value ({...} or <...>) of field f, stored into obj. idx: the
 * element number for a repeated field. */
static sp_status_t
read_message(lx_t *x, const ProtobufCFieldDescriptor *f, json_t *obj, const char *fp, int depth)
{
    int c = peek(x);
    int32_t line = x->line, col = x->col;
    char sb[8];
    if (c != '{' && c != '<') return fail(x, line, col, fp, "expected '{' or '<', got %s", show(c, sb));
    if (depth >= SP_PBTXT_MAX_DEPTH) {
        return fail(x, line, col, fp, "nested deeper than %d levels", SP_PBTXT_MAX_DEPTH);
    }
    sp_status_t st = count_node(x, fp);
    if (st) return st;
    adv(x);
    int end = c == '{' ? '}' : '>';
    const ProtobufCMessageDescriptor *md = f->descriptor;
    json_t *m = json_object();
    if (!m) return SP_ERR_NOMEM;
    if (is_map(f)) {
        int32_t from = x->pos ? x->pos->n : 0;
        st = parse_fields(x, md, m, fp, depth + 1, end);
        if (st) {
            json_decref(m);
            return st;
        }
        json_t *k = json_object_get(m, "key"), *v = json_object_get(m, "value");
        char kt[PATH_LEN];
        if (!k) {
            json_decref(m);
            return fail(x, line, col, fp, "map entry without a key");
        }
        key_text(k, kt, sizeof kt);
        json_t *map = json_object_get(obj, f->name);
        if (!map) {
            map = json_object();
            if (!map || json_object_set_new(obj, f->name, map)) {
                json_decref(m);
                return SP_ERR_NOMEM;
            }
        }
        if (json_object_get(map, kt)) {
            json_decref(m);
            return fail(x, line, col, fp, "key \"%s\" given twice", kt);
        }
        const ProtobufCFieldDescriptor *vf = &md->fields[1];
        if (!v) {
            v = vf->type == PROTOBUF_C_TYPE_MESSAGE ? json_object()
                : vf->type == PROTOBUF_C_TYPE_STRING ? json_string("")
                : vf->type == PROTOBUF_C_TYPE_BOOL ? json_false()
                : json_integer(0);
        } else {
            json_incref(v);
        }
        json_decref(m);
        if (!v || json_object_set_new(map, kt, v)) return SP_ERR_NOMEM;
        st = rename_entry_pos(x, from, fp, kt);
        if (st) return st;
        return pos_add(x->pos, fp, line, col) == SP_OK ? SP_OK : SP_ERR_NOMEM;
    }
    char ep[PATH_LEN];
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        json_t *arr = json_object_get(obj, f->name);
        snprintf(ep, sizeof ep, "%s[%zu]", fp, arr ? json_array_size(arr) : (size_t)0);
    } else {
        snprintf(ep, sizeof ep, "%s", fp);
    }
    st = pos_add(x->pos, ep, line, col);
    if (!st) st = parse_fields(x, md, m, ep, depth + 1, end);
    if (st) {
        json_decref(m);
        return st;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        json_t *arr = json_object_get(obj, f->name);
        if (!arr) {
            arr = json_array();
            if (!arr || json_object_set_new(obj, f->name, arr)) {
                json_decref(m);
                return SP_ERR_NOMEM;
            }
        }
        return json_array_append_new(arr, m) ? SP_ERR_NOMEM : SP_OK;
    }
    return json_object_set_new(obj, f->name, m) ? SP_ERR_NOMEM : SP_OK;
}

static sp_status_t
store_scalar(lx_t *x, const ProtobufCFieldDescriptor *f, json_t *obj, json_t *v)
{
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        json_t *arr = json_object_get(obj, f->name);
        if (!arr) {
            arr = json_array();
            if (!arr || json_object_set_new(obj, f->name, arr)) {
                json_decref(v);
                return SP_ERR_NOMEM;
            }
        }
        return json_array_append_new(arr, v) ? SP_ERR_NOMEM : SP_OK;
    }
    return json_object_set_new(obj, f->name, v) ? SP_ERR_NOMEM : SP_OK;
}

static sp_status_t
unknown_field(lx_t *x, const ProtobufCMessageDescriptor *d, const char *name, const char *fp,
              int depth, int32_t line, int32_t col)
{
    for (const sp_pbtxt_refusal_t *r = x->refused; depth == 0 && r && r->field; r++) {
        if (strcmp(r->field, name) == 0) return fail(x, line, col, fp, "%s", r->why);
    }
    char names[300] = "";
    size_t k = 0;
    for (unsigned i = 0; i < d->n_fields && k + 2 < sizeof names; i++) {
        int m = snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "",
                         d->fields[d->fields_sorted_by_name[i]].name);
        if (m < 0) break;
        k += (size_t)m;
    }
    return fail(x, line, col, fp, "unknown field (%s has: %s)", d->short_name, names);
}

/* The fields of one message until `end` ('}', '>', or -1 for the file's end). */
static sp_status_t
parse_fields(lx_t *x, const ProtobufCMessageDescriptor *d, json_t *obj, const char *path,
             int depth, int end)
{
    for (;;) {
        int c = peek(x);
        int32_t line = x->line, col = x->col;
        char sb[8];
        if (c == end) {
            adv(x);
            return SP_OK;
        }
        if (c < 0) {
            return fail(x, line, col, path, "unexpected end of the file: '%c' missing", end);
        }
        if (!ident_start(c)) {
            return fail(x, line, col, path, "expected a field name, got %s", show(c, sb));
        }
        char name[130];
        size_t nl = 0;
        while (x->i < x->n && ident_char((unsigned char)x->s[x->i])) {
            if (nl + 1 < sizeof name) name[nl] = x->s[x->i];
            nl++;
            adv(x);
        }
        name[nl < sizeof name ? nl : sizeof name - 1] = '\0';
        char fp[PATH_LEN];
        if (path[0]) {
            snprintf(fp, sizeof fp, "%s.%s", path, name);
        } else {
            snprintf(fp, sizeof fp, "%s", name);
        }
        if (nl >= sizeof name) return fail(x, line, col, path, "field name longer than 128 characters");
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);
        if (!f) return unknown_field(x, d, name, fp, depth, line, col);
        if (f->label != PROTOBUF_C_LABEL_REPEATED && json_object_get(obj, f->name)) {
            return fail(x, line, col, fp, "given twice");
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *g = &d->fields[i];
                if (g != f && (g->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                    g->quantifier_offset == f->quantifier_offset && json_object_get(obj, g->name)) {
                    return fail(x, line, col, fp, "only one of %s and %s may be given", g->name, f->name);
                }
            }
        }
        sp_status_t st = SP_OK;
        if (f->label != PROTOBUF_C_LABEL_REPEATED || is_map(f)) {
            st = pos_add(x->pos, fp, line, col);
        } else if (!json_object_get(obj, f->name)) {
            st = pos_add(x->pos, fp, line, col);
        }
        if (st) return st;
        bool colon = false;
        c = peek(x);
        if (c == ':') {
            colon = true;
            adv(x);
            c = peek(x);
        }
        if (c == '[') {
            int32_t bl = x->line, bc = x->col;
            if (f->label != PROTOBUF_C_LABEL_REPEATED) {
                return fail(x, bl, bc, fp, "a list [...] for a field that is not repeated");
            }
            if (f->type != PROTOBUF_C_TYPE_MESSAGE && !colon) {
                return fail(x, bl, bc, fp, "expected ':' before the list");
            }
            adv(x);
            if (peek(x) == ']') {
                adv(x);
            } else {
                for (;;) {
                    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                        st = read_message(x, f, obj, fp, depth);
                    } else {
                        json_t *v = NULL;
                        st = read_scalar(x, f, fp, &v);
                        if (!st) st = store_scalar(x, f, obj, v);
                    }
                    if (st) return st;
                    c = peek(x);
                    if (c == ',') {
                        adv(x);
                        continue;
                    }
                    if (c == ']') {
                        adv(x);
                        break;
                    }
                    return fail(x, x->line, x->col, fp, "expected ',' or ']', got %s", show(c, sb));
                }
            }
            if (f->type != PROTOBUF_C_TYPE_MESSAGE && !json_object_get(obj, f->name)) {
                json_t *arr = json_array();
                if (!arr || json_object_set_new(obj, f->name, arr)) return SP_ERR_NOMEM;
            }
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            st = read_message(x, f, obj, fp, depth);
        } else {
            if (!colon) return fail(x, x->line, x->col, fp, "expected ':' after the field name, got %s", show(c, sb));
            json_t *v = NULL;
            st = read_scalar(x, f, fp, &v);
            if (!st) st = store_scalar(x, f, obj, v);
        }
        if (st) return st;
        c = peek(x);
        if (c == ',' || c == ';') adv(x);
    }
}

sp_status_t
sp_pbtxt_parse(const char *text, size_t len, const ProtobufCMessageDescriptor *desc,
               const sp_pbtxt_refusal_t *refused, const char *file, json_t **out,
               sp_pbtxt_posmap_t *pos, char *err, size_t err_len)
{
    *out = NULL;
    lx_t x = {.s = text, .n = len, .line = 1, .col = 1, .file = file, .err = err,
              .err_len = err_len, .pos = pos, .refused = refused};
    if (memchr(text, '\0', len)) {
        const char *z = memchr(text, '\0', len);
        while (x.s + x.i < z) adv(&x);
        return fail(&x, x.line, x.col, "", "a NUL byte in the file");
    }
    json_t *root = json_object();
    if (!root) return SP_ERR_NOMEM;
    sp_status_t st = parse_fields(&x, desc, root, "", 0, -1);
    if (st) {
        json_decref(root);
        if (st == SP_ERR_NOMEM) sp_errf(err, err_len, st, "%s: out of memory", file);
        return st;
    }
    *out = root;
    return SP_OK;
}

/* ---- JSON to a message */

static void *
pa_alloc(void *ud, size_t n)
{
    (void)ud;
    return sp_malloc(n ? n : 1);
}

static void
pa_free(void *ud, void *p)
{
    (void)ud;
    sp_free(p);
}

static ProtobufCAllocator pa = {pa_alloc, pa_free, NULL};

void
sp_pbtxt_msg_free(ProtobufCMessage *m)
{
    if (m) protobuf_c_message_free_unpacked(m, &pa);
}

static sp_status_t SP_PRINTF(4, 5)
jfail(char *err, size_t err_len, const char *path, const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sp_errf(err, err_len, SP_ERR_INVALID, "%s: %s", path[0] ? path : "(top)", msg);
}

static sp_status_t to_msg(const json_t *j, const ProtobufCMessageDescriptor *d, const char *path,
                          ProtobufCMessage **out, char *err, size_t err_len);

/* One value of field f from JSON (or, for a map key, from its text) into dst. */
static sp_status_t
set_value(const ProtobufCFieldDescriptor *f, const json_t *v, const char *keytext, void *dst,
          const char *path, char *err, size_t err_len)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        if (!json_is_string(v)) return jfail(err, err_len, path, "must be a string");
        char *s = sp_strndup(json_string_value(v), json_string_length(v));
        if (!s) return SP_ERR_NOMEM;
        *(char **)dst = s;
        return SP_OK;
    }
    case PROTOBUF_C_TYPE_BYTES:
        return jfail(err, err_len, path, "bytes fields are not read from JSON");
    case PROTOBUF_C_TYPE_MESSAGE:
        return to_msg(v, f->descriptor, path, (ProtobufCMessage **)dst, err, err_len);
    case PROTOBUF_C_TYPE_BOOL:
        if (keytext) {
            if (strcmp(keytext, "true") && strcmp(keytext, "false")) return jfail(err, err_len, path, "key must be true or false");
            *(protobuf_c_boolean *)dst = strcmp(keytext, "true") == 0;
            return SP_OK;
        }
        if (!json_is_boolean(v)) return jfail(err, err_len, path, "must be true or false");
        *(protobuf_c_boolean *)dst = json_is_true(v);
        return SP_OK;
    case PROTOBUF_C_TYPE_ENUM: {
        if (!json_is_string(v)) return jfail(err, err_len, path, "must be an enum name");
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, json_string_value(v));
        if (!ev) return jfail(err, err_len, path, "\"%s\" is not a value of the enum", json_string_value(v));
        *(int32_t *)dst = ev->value;
        return SP_OK;
    }
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        if (!json_is_number(v)) return jfail(err, err_len, path, "must be a number");
        double d = json_number_value(v);
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            *(float *)dst = (float)d;
        } else {
            *(double *)dst = d;
        }
        return SP_OK;
    }
    default:
        break;
    }
    long long x;
    if (keytext) {
        char *end = NULL;
        errno = 0;
        x = strtoll(keytext, &end, 10);
        if (errno || end == keytext || *end) return jfail(err, err_len, path, "key must be an integer");
    } else {
        if (!json_is_integer(v)) return jfail(err, err_len, path, "must be an integer");
        x = (long long)json_integer_value(v);
    }
    if (is_unsigned_int(f->type) && x < 0) return jfail(err, err_len, path, "must not be negative");
    if (is_32(f->type)) {
        bool ok = is_unsigned_int(f->type) ? x <= (long long)UINT32_MAX : (x >= INT32_MIN && x <= INT32_MAX);
        if (!ok) return jfail(err, err_len, path, "out of the 32-bit range");
        if (is_unsigned_int(f->type)) {
            *(uint32_t *)dst = (uint32_t)x;
        } else {
            *(int32_t *)dst = (int32_t)x;
        }
    } else if (is_unsigned_int(f->type)) {
        *(uint64_t *)dst = (uint64_t)x;
    } else {
        *(int64_t *)dst = (int64_t)x;
    }
    return SP_OK;
}

static sp_status_t
to_msg(const json_t *j, const ProtobufCMessageDescriptor *d, const char *path,
       ProtobufCMessage **out, char *err, size_t err_len)
{
    *out = NULL;
    if (!json_is_object(j)) return jfail(err, err_len, path, "must be an object");
    ProtobufCMessage *m = sp_calloc(1, d->sizeof_message);
    if (!m) return SP_ERR_NOMEM;
    protobuf_c_message_init(d, m);
    char *base = (char *)m;
    const char *key;
    json_t *v;
    sp_status_t st = SP_OK;
    json_object_foreach((json_t *)j, key, v) {
        char fp[PATH_LEN];
        snprintf(fp, sizeof fp, path[0] ? "%s.%s" : "%s%s", path, key);
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, key);
        if (!f) {
            st = jfail(err, err_len, fp, "unknown field");
            break;
        }
        void *member = base + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            bool map = is_map(f);
            if (map ? !json_is_object(v) : !json_is_array(v)) {
                st = jfail(err, err_len, fp, map ? "must be an object" : "must be an array");
                break;
            }
            size_t n = map ? json_object_size(v) : json_array_size(v);
            size_t es = elem_size(f->type);
            void *arr = sp_calloc(n ? n : 1, es);
            if (!arr) {
                st = SP_ERR_NOMEM;
                break;
            }
            /* Set before filling (zeroed: nothing to free yet), so that a
             * failure half way frees what was made. */
            *(void **)member = arr;
            *(size_t *)(base + f->quantifier_offset) = n;
            if (map) {
                const ProtobufCMessageDescriptor *ed = f->descriptor;
                const char *mk;
                json_t *mv;
                size_t k = 0;
                json_object_foreach(v, mk, mv) {
                    char ep[PATH_LEN * 2];
                    snprintf(ep, sizeof ep, "%s.%s", fp, mk);
                    ProtobufCMessage *e = sp_calloc(1, ed->sizeof_message);
                    if (!e) {
                        st = SP_ERR_NOMEM;
                        break;
                    }
                    protobuf_c_message_init(ed, e);
                    ((ProtobufCMessage **)arr)[k++] = e;
                    json_t *ks = json_string(mk);
                    if (!ks) {
                        st = SP_ERR_NOMEM;
                        break;
                    }
                    bool skey = ed->fields[0].type == PROTOBUF_C_TYPE_STRING;
                    st = set_value(&ed->fields[0], ks, skey ? NULL : mk,
                                   (char *)e + ed->fields[0].offset, ep, err, err_len);
                    json_decref(ks);
                    if (!st) {
                        st = set_value(&ed->fields[1], mv, NULL, (char *)e + ed->fields[1].offset,
                                       ep, err, err_len);
                    }
                    if (st) break;
                }
            } else {
                for (size_t i = 0; i < n && !st; i++) {
                    char ep[PATH_LEN + 24];
                    snprintf(ep, sizeof ep, "%s[%zu]", fp, i);
                    st = set_value(f, json_array_get(v, i), NULL, (char *)arr + i * es, ep, err,
                                   err_len);
                }
            }
            if (st) break;
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_STRING) *(char **)member = NULL;
        st = set_value(f, v, NULL, member, fp, err, err_len);
        if (f->type == PROTOBUF_C_TYPE_STRING && *(char **)member == NULL) {
            *(const char **)member = f->default_value ? f->default_value : protobuf_c_empty_string;
        }
        if (st) break;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            *(uint32_t *)(base + f->quantifier_offset) = f->id;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
                   f->type != PROTOBUF_C_TYPE_STRING) {
            *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
        }
    }
    if (st) {
        protobuf_c_message_free_unpacked(m, &pa);
        return st;
    }
    *out = m;
    return SP_OK;
}

sp_status_t
sp_pbtxt_json_to_msg(const json_t *j, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **out, char *err, size_t err_len)
{
    sp_status_t st = to_msg(j, desc, "", out, err, err_len);
    if (st == SP_ERR_NOMEM) sp_errf(err, err_len, st, "out of memory");
    return st;
}

/* ---- a message to JSON */

static json_t *
value_json(const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return json_integer((json_int_t)*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t u = *(const uint64_t *)p;
        return u <= (uint64_t)INT64_MAX ? json_integer((json_int_t)u) : json_real((double)u);
    }
    case PROTOBUF_C_TYPE_FLOAT:
        return isfinite(*(const float *)p) ? json_real(*(const float *)p) : json_null();
    case PROTOBUF_C_TYPE_DOUBLE:
        return isfinite(*(const double *)p) ? json_real(*(const double *)p) : json_null();
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int32_t *)p);
        return ev ? json_string(ev->name) : json_integer(*(const int32_t *)p);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return json_string(s ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES:
        return json_string("");
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
        return m ? sp_pbtxt_msg_to_json(m) : json_object();
    }
    }
    return NULL;
}

json_t *
sp_pbtxt_msg_to_json(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    json_t *o = json_object();
    if (!o) return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *member = base + f->offset;
        json_t *v = NULL;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id) continue;
        }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(char *const *)member;
            if (is_map(f)) {
                v = json_object();
                const ProtobufCMessageDescriptor *ed = f->descriptor;
                for (size_t k = 0; v && k < n; k++) {
                    const ProtobufCMessage *e = ((ProtobufCMessage *const *)arr)[k];
                    json_t *kj = value_json(&ed->fields[0], (const char *)e + ed->fields[0].offset);
                    json_t *vj = value_json(&ed->fields[1], (const char *)e + ed->fields[1].offset);
                    char kt[PATH_LEN];
                    if (kj) key_text(kj, kt, sizeof kt);
                    if (!kj || !vj || json_object_set_new(v, kt, vj)) {
                        json_decref(vj);
                        json_decref(kj);
                        json_decref(v);
                        v = NULL;
                        break;
                    }
                    json_decref(kj);
                }
            } else {
                v = json_array();
                size_t es = elem_size(f->type);
                for (size_t k = 0; v && k < n; k++) {
                    if (json_array_append_new(v, value_json(f, arr + k * es))) {
                        json_decref(v);
                        v = NULL;
                    }
                }
            }
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (*(ProtobufCMessage *const *)member == NULL) continue;
            v = value_json(f, member);
        } else {
            if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
                !*(const protobuf_c_boolean *)(base + f->quantifier_offset)) {
                continue;
            }
            v = value_json(f, member);
        }
        if (!v || json_object_set_new(o, f->name, v)) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}
