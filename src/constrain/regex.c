/*
 * regex.c - a regular expression to one GBNF expression (regex.h has the
 * subset).
 *
 * A recursive-descent parser writes GBNF as it reads: a literal character
 * becomes a GBNF literal of its bytes (JSON-escaped in SP_REGEX_JSON mode), a
 * class or `.` a set of code-point ranges written as a GBNF class (plus, in
 * JSON mode, the escaped forms of '"', '\' and the allowed control
 * characters as alternatives), a group a parenthesised GBNF group, and a
 * quantifier the same GBNF suffix. Every atom is one GBNF primary, so a
 * suffix always applies to exactly the atom before it. Threads: none shared;
 * memory: one growing output buffer and one range buffer per class; the
 * recursion depth is the group nesting (at most SP_REGEX_MAX_NEST).
 */
#include "constrain/regex.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

#define MAX_RANGES 512
#define MAX_CP 0x10FFFFu

typedef struct { uint32_t lo, hi; } rng_t;

typedef struct {
    int64_t lo, hi; /* characters; hi RX_INF: unbounded */
} rlen_t;

#define RX_INF ((int64_t)1 << 40)

static int64_t
sat(int64_t v)
{
    return v > RX_INF ? RX_INF : v;
}

typedef struct {
    const char *re, *p, *end;
    unsigned flags;
    long rcap;  /* > 0: unbounded repetitions repeat at most this often */
    int depth;
    char *out;
    size_t n, cap;
    sp_status_t st;
    char *err;
    size_t err_len;
} rx_t;

__attribute__((format(printf, 3, 4))) static void
rx_fail(rx_t *x, sp_status_t st, const char *fmt, ...)
{
    if (x->st != SP_OK) {
        return;
    }
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    x->st = sp_errf(x->err, x->err_len, st, "%s (at offset %zu of the pattern)", msg,
                    (size_t)(x->p - x->re));
}

static void
put(rx_t *x, const char *s, size_t n)
{
    if (x->st != SP_OK) {
        return;
    }
    if (x->n + n + 1 > x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 256;
        while (cap < x->n + n + 1) {
            cap *= 2;
        }
        char *np = sp_realloc(x->out, cap);
        if (np == NULL) {
            x->st = sp_errf(x->err, x->err_len, SP_ERR_NOMEM, "pattern: out of memory");
            return;
        }
        x->out = np, x->cap = cap;
    }
    memcpy(x->out + x->n, s, n);
    x->n += n;
    x->out[x->n] = '\0';
}

static void
puts_(rx_t *x, const char *s)
{
    put(x, s, strlen(s));
}

/* ---- output: literals and classes ----------------------------------------- */

static size_t
utf8_enc(uint32_t c, char *o)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* A GBNF literal matching the bytes s[0..n). */
static void
put_lit_bytes(rx_t *x, const char *s, size_t n)
{
    put(x, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\', e[1] = (char)c;
            put(x, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(e, sizeof e, "\\x%02X", c);
            put(x, e, 4);
        } else {
            put(x, (const char *)&c, 1);
        }
    }
    put(x, "\"", 1);
}

/* The bytes that stand for code point c in the output text. */
static size_t
char_bytes(const rx_t *x, uint32_t c, char *o)
{
    if (!(x->flags & SP_REGEX_JSON)) {
        return utf8_enc(c, o);
    }
    switch (c) {
    case '"': memcpy(o, "\\\"", 2); return 2;
    case '\\': memcpy(o, "\\\\", 2); return 2;
    case '\n': memcpy(o, "\\n", 2); return 2;
    case '\r': memcpy(o, "\\r", 2); return 2;
    case '\t': memcpy(o, "\\t", 2); return 2;
    case '\b': memcpy(o, "\\b", 2); return 2;
    case '\f': memcpy(o, "\\f", 2); return 2;
    default: break;
    }
    if (c < 0x20) {
        snprintf(o, 8, "\\u%04X", (unsigned)c);
        return 6;
    }
    return utf8_enc(c, o);
}

static void
put_char(rx_t *x, uint32_t c)
{
    char b[8];
    put_lit_bytes(x, b, char_bytes(x, c, b));
}

/* One code point inside a GBNF class. */
static void
put_class_cp(rx_t *x, uint32_t c)
{
    char b[16];
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        b[0] = (char)c;
        put(x, b, 1);
    } else if (c < 0x80) {
        snprintf(b, sizeof b, "\\x%02X", (unsigned)c);
        puts_(x, b);
    } else if (c < 0x10000) {
        snprintf(b, sizeof b, "\\u%04X", (unsigned)c);
        puts_(x, b);
    } else {
        snprintf(b, sizeof b, "\\U%08X", (unsigned)c);
        puts_(x, b);
    }
}

/* Sort and merge ranges in place; returns the new count. */
static int
norm(rng_t *r, int n)
{
    for (int i = 1; i < n; i++) { /* insertion sort: classes are small */
        rng_t t = r[i];
        int j = i;
        while (j > 0 && r[j - 1].lo > t.lo) {
            r[j] = r[j - 1];
            j--;
        }
        r[j] = t;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k > 0 && r[i].lo <= r[k - 1].hi + 1) {
            if (r[i].hi > r[k - 1].hi) {
                r[k - 1].hi = r[i].hi;
            }
        } else {
            r[k++] = r[i];
        }
    }
    return k;
}

static bool
in_set(const rng_t *r, int n, uint32_t c)
{
    for (int i = 0; i < n; i++) {
        if (c >= r[i].lo && c <= r[i].hi) {
            return true;
        }
    }
    return false;
}

/* Write the set r[0..n) (normalised) as one GBNF primary. */
static void
put_set(rx_t *x, const rng_t *r, int n)
{
    /* the code points written as themselves: no surrogates, no NUL; in JSON
     * mode no control characters, '"' or '\' (those go as escapes) */
    rng_t *plain = sp_malloc(sizeof *plain * (size_t)(4 * n + 4)); /* each range splits in <= 4 */
    int np = 0;
    if (plain == NULL) {
        x->st = sp_errf(x->err, x->err_len, SP_ERR_NOMEM, "pattern: out of memory");
        return;
    }
    for (int i = 0; i < n; i++) {
        uint32_t lo = r[i].lo, hi = r[i].hi;
        uint32_t cut_lo = x->flags & SP_REGEX_JSON ? 0x20 : 1;
        if (lo < cut_lo) {
            lo = cut_lo;
        }
        if (lo > hi) {
            continue;
        }
        /* split around the surrogates and, in JSON mode, '"' and '\' */
        uint32_t holes[4][2] = {{0xD800, 0xDFFF}, {'"', '"'}, {'\\', '\\'}, {0, 0}};
        int nh = x->flags & SP_REGEX_JSON ? 3 : 1;
        rng_t parts[8];
        int nparts = 1;
        parts[0] = (rng_t){lo, hi};
        for (int h = 0; h < nh; h++) {
            rng_t next[8];
            int nn = 0;
            for (int q = 0; q < nparts; q++) {
                rng_t p = parts[q];
                if (p.hi < holes[h][0] || p.lo > holes[h][1]) {
                    next[nn++] = p;
                    continue;
                }
                if (p.lo < holes[h][0]) {
                    next[nn++] = (rng_t){p.lo, holes[h][0] - 1};
                }
                if (p.hi > holes[h][1]) {
                    next[nn++] = (rng_t){holes[h][1] + 1, p.hi};
                }
            }
            memcpy(parts, next, sizeof next[0] * (size_t)nn);
            nparts = nn;
        }
        for (int q = 0; q < nparts; q++) {
            plain[np++] = parts[q];
        }
    }
    static const uint32_t escaped[] = {'"', '\\', '\n', '\r', '\t'};
    int n_esc = 0;
    bool esc[5] = {false};
    if (x->flags & SP_REGEX_JSON) {
        for (int i = 0; i < 5; i++) {
            esc[i] = in_set(r, n, escaped[i]);
            n_esc += esc[i];
        }
    }
    if (np == 0 && n_esc == 0) {
        sp_free(plain);
        rx_fail(x, SP_ERR_INVALID, "pattern: a character class that matches no character the "
                "output may hold");
        return;
    }
    bool group = n_esc > 0;
    if (group) {
        puts_(x, "(");
    }
    if (np > 0) {
        puts_(x, "[");
        for (int i = 0; i < np; i++) {
            put_class_cp(x, plain[i].lo);
            if (plain[i].hi != plain[i].lo) {
                puts_(x, "-");
                put_class_cp(x, plain[i].hi);
            }
        }
        puts_(x, "]");
    }
    bool sep = np > 0;
    for (int i = 0; i < 5; i++) {
        if (esc[i]) {
            if (sep) {
                puts_(x, " | ");
            }
            sep = true;
            put_char(x, escaped[i]);
        }
    }
    if (group) {
        puts_(x, ")");
    }
    sp_free(plain);
}

/* ---- parsing ---------------------------------------------------------------- */

static bool
at_end(const rx_t *x)
{
    return x->p >= x->end;
}

/* One UTF-8 code point at x->p. */
static int64_t
next_cp(rx_t *x)
{
    const unsigned char *s = (const unsigned char *)x->p;
    size_t left = (size_t)(x->end - x->p);
    uint32_t c = s[0];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (k == 0 || k > left) {
        rx_fail(x, SP_ERR_INVALID, "pattern: invalid UTF-8");
        return -1;
    }
    if (k > 1) {
        c &= 0x3F >> (k - 1);
        for (size_t i = 1; i < k; i++) {
            if ((s[i] & 0xC0) != 0x80) {
                rx_fail(x, SP_ERR_INVALID, "pattern: invalid UTF-8");
                return -1;
            }
            c = c << 6 | (s[i] & 0x3F);
        }
    }
    x->p += k;
    return c;
}

static int
hexval(char h)
{
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
           : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

/* Add the ranges of a class escape (\d \w \s and their negations). */
static int
class_escape(char e, rng_t *r, int n)
{
    rng_t base[12];
    int nb = 0;
    char lower = (char)(e | 0x20);
    if (lower == 'd') {
        base[nb++] = (rng_t){'0', '9'};
    } else if (lower == 'w') {
        base[nb++] = (rng_t){'0', '9'}, base[nb++] = (rng_t){'A', 'Z'};
        base[nb++] = (rng_t){'_', '_'}, base[nb++] = (rng_t){'a', 'z'};
    } else { /* s: JavaScript's white space and line terminators */
        base[nb++] = (rng_t){'\t', '\r'}, base[nb++] = (rng_t){' ', ' '};
        base[nb++] = (rng_t){0xA0, 0xA0}, base[nb++] = (rng_t){0x1680, 0x1680};
        base[nb++] = (rng_t){0x2000, 0x200A}, base[nb++] = (rng_t){0x2028, 0x2029};
        base[nb++] = (rng_t){0x202F, 0x202F}, base[nb++] = (rng_t){0x205F, 0x205F};
        base[nb++] = (rng_t){0x3000, 0x3000}, base[nb++] = (rng_t){0xFEFF, 0xFEFF};
    }
    if (e == lower) {
        for (int i = 0; i < nb; i++) {
            r[n++] = base[i];
        }
        return n;
    }
    uint32_t at = 0; /* the complement of base (sorted, disjoint) */
    for (int i = 0; i < nb; i++) {
        if (base[i].lo > at) {
            r[n++] = (rng_t){at, base[i].lo - 1};
        }
        at = base[i].hi + 1;
    }
    r[n++] = (rng_t){at, MAX_CP};
    return n;
}

/* After a '\': a single code point (returns it), or -2 for a class escape
 * (*cls set), -1 on error. */
static int64_t
escape(rx_t *x, char *cls)
{
    if (at_end(x)) {
        rx_fail(x, SP_ERR_INVALID, "pattern: '\\' at the end");
        return -1;
    }
    char c = *x->p++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        *cls = c;
        return -2;
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': case 'u': {
        int k = c == 'x' ? 2 : 4;
        if (x->end - x->p < k) {
            rx_fail(x, SP_ERR_INVALID, "pattern: unfinished \\%c escape", c);
            return -1;
        }
        uint32_t v = 0;
        for (int i = 0; i < k; i++) {
            int d = hexval(x->p[i]);
            if (d < 0) {
                rx_fail(x, SP_ERR_INVALID, "pattern: bad hex digit in a \\%c escape", c);
                return -1;
            }
            v = v << 4 | (uint32_t)d;
        }
        x->p += k;
        if (v >= 0xD800 && v <= 0xDFFF) {
            rx_fail(x, SP_ERR_INVALID, "%s", "pattern: a surrogate code point is not supported");
            return -1;
        }
        return v;
    }
    case 'b': case 'B':
        x->p--;
        rx_fail(x, SP_ERR_INVALID, "pattern: the word boundary '\\%c' is not supported", c);
        return -1;
    case 'p': case 'P':
        x->p--;
        rx_fail(x, SP_ERR_INVALID, "pattern: the Unicode property escape '\\%c{...}' is not "
                "supported", c);
        return -1;
    case 'k':
        x->p--;
        rx_fail(x, SP_ERR_INVALID, "%s", "pattern: the backreference '\\k<...>' is not supported");
        return -1;
    case 'c':
        x->p--;
        rx_fail(x, SP_ERR_INVALID, "%s", "pattern: the control escape '\\c' is not supported");
        return -1;
    default:
        if (c >= '1' && c <= '9') {
            x->p--;
            rx_fail(x, SP_ERR_INVALID, "pattern: the backreference '\\%c' is not supported", c);
            return -1;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            x->p--;
            rx_fail(x, SP_ERR_INVALID, "pattern: the escape '\\%c' is not supported", c);
            return -1;
        }
        x->p--;
        return next_cp(x); /* escaped punctuation or any other character: itself */
    }
}

/* A class after its '['. */
static void
parse_class(rx_t *x)
{
    bool neg = false;
    if (!at_end(x) && *x->p == '^') {
        neg = true;
        x->p++;
    }
    rng_t *r = sp_malloc(sizeof *r * (MAX_RANGES + 16));
    if (r == NULL) {
        x->st = sp_errf(x->err, x->err_len, SP_ERR_NOMEM, "pattern: out of memory");
        return;
    }
    int n = 0;
    while (x->st == SP_OK) {
        if (at_end(x)) {
            rx_fail(x, SP_ERR_INVALID, "%s", "pattern: unterminated character class");
            break;
        }
        if (*x->p == ']') { /* as JavaScript: "[]" matches nothing, "[^]" anything */
            x->p++;
            break;
        }
        if (n >= MAX_RANGES) {
            rx_fail(x, SP_ERR_TOO_LARGE, "pattern: a character class with more than %d ranges",
                    MAX_RANGES);
            break;
        }
        if (x->end - x->p >= 2 && x->p[0] == '[' && (x->p[1] == ':' || x->p[1] == '=' ||
                                                     x->p[1] == '.')) {
            rx_fail(x, SP_ERR_INVALID, "%s", "pattern: POSIX classes like '[:alpha:]' are not "
                    "supported");
            break;
        }
        int64_t lo;
        char cls = 0;
        if (*x->p == '\\') {
            x->p++;
            if (!at_end(x) && *x->p == 'b') { /* [\b] is a backspace */
                x->p++;
                lo = '\b';
            } else {
                lo = escape(x, &cls);
            }
        } else {
            lo = next_cp(x);
        }
        if (lo == -2) {
            n = class_escape(cls, r, n);
            continue;
        }
        if (lo < 0) {
            break;
        }
        int64_t hi = lo;
        if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                hi = escape(x, &cls);
                if (hi == -2) {
                    rx_fail(x, SP_ERR_INVALID, "%s", "pattern: a range ending in a class escape");
                    break;
                }
            } else {
                hi = next_cp(x);
            }
            if (hi < 0) {
                break;
            }
            if (hi < lo) {
                rx_fail(x, SP_ERR_INVALID, "%s", "pattern: a character range is backwards");
                break;
            }
        }
        r[n++] = (rng_t){(uint32_t)lo, (uint32_t)hi};
    }
    if (x->st == SP_OK) {
        n = norm(r, n);
        if (neg) {
            rng_t *c = sp_malloc(sizeof *c * (size_t)(n + 1));
            if (c == NULL) {
                x->st = sp_errf(x->err, x->err_len, SP_ERR_NOMEM, "pattern: out of memory");
            } else {
                int k = 0;
                uint32_t at = 0;
                for (int i = 0; i < n; i++) {
                    if (r[i].lo > at) {
                        c[k++] = (rng_t){at, r[i].lo - 1};
                    }
                    at = r[i].hi + 1;
                }
                if (at <= MAX_CP) {
                    c[k++] = (rng_t){at, MAX_CP};
                }
                put_set(x, c, k);
                sp_free(c);
            }
        } else {
            put_set(x, r, n);
        }
    }
    sp_free(r);
}

static rlen_t parse_alt(rx_t *x, bool top);

/* Parse "{m}", "{m,}", "{m,n}" at x->p; false (x->p unchanged) when it is not one. */
static bool
parse_braces(rx_t *x, long *m, long *n)
{
    const char *p = x->p + 1;
    long a = -1, b = -1;
    if (p < x->end && *p >= '0' && *p <= '9') {
        a = 0;
        while (p < x->end && *p >= '0' && *p <= '9' && a <= 100000) {
            a = a * 10 + (*p++ - '0');
        }
    }
    if (a < 0) {
        return false;
    }
    if (p < x->end && *p == '}') {
        b = a;
    } else if (p < x->end && *p == ',') {
        p++;
        if (p < x->end && *p >= '0' && *p <= '9') {
            b = 0;
            while (p < x->end && *p >= '0' && *p <= '9' && b <= 100000) {
                b = b * 10 + (*p++ - '0');
            }
        } else {
            b = -1; /* unbounded */
        }
        if (p >= x->end || *p != '}') {
            return false;
        }
    } else {
        return false;
    }
    x->p = p + 1;
    *m = a;
    *n = b;
    return true;
}

/* A sequence of atoms with quantifiers, up to '|' or ')' or the end. */
static rlen_t
parse_seq(rx_t *x, bool top)
{
    rlen_t total = {0, 0}, fail_len = {0, 0};
    bool any = false;
    bool anchored_start = false;
    if (top && !at_end(x) && *x->p == '^') {
        anchored_start = true;
        x->p++;
    }
    bool search = (x->flags & SP_REGEX_SEARCH) != 0;
    char around[48]; /* any text before or after an unanchored match (no escapes: a subset) */
    snprintf(around, sizeof around, "%s", x->flags & SP_REGEX_JSON ? "[^\"\\\\\\x00-\\x1F]"
                                                                   : "[^\\x00]");
    if (x->rcap > 0) {
        snprintf(around + strlen(around), sizeof around - strlen(around), "{0,%ld}", x->rcap);
    } else {
        strcat(around, "*");
    }
    if (top && search && !anchored_start) {
        puts_(x, around);
        puts_(x, " ");
        total.hi = x->rcap > 0 ? x->rcap : RX_INF;
    }
    bool anchored_end = false;
    while (x->st == SP_OK && !at_end(x) && *x->p != '|' && *x->p != ')') {
        char c = *x->p;
        if (c == '$') {
            x->p++;
            if (top && (at_end(x) || *x->p == '|')) {
                anchored_end = true;
                break;
            }
            x->p--;
            rx_fail(x, SP_ERR_INVALID, "%s", "pattern: '$' is supported only at the end");
            return fail_len;
        }
        if (c == '^') {
            rx_fail(x, SP_ERR_INVALID, "%s", "pattern: '^' is supported only at the start");
            return fail_len;
        }
        if (c == '*' || c == '+' || c == '?') {
            rx_fail(x, SP_ERR_INVALID, "pattern: nothing to repeat before '%c'", c);
            return fail_len;
        }
        if (any) {
            puts_(x, " ");
        }
        any = true;
        rlen_t a = {1, 1}; /* a character or a class */
        if (c == '(') {
            x->p++;
            if (!at_end(x) && *x->p == '?') {
                const char *q = x->p + 1;
                if (q < x->end && *q == ':') {
                    x->p += 2;
                } else if (q < x->end && (*q == '<' || *q == 'P') &&
                           !(q + 1 < x->end && (q[1] == '=' || q[1] == '!'))) {
                    const char *gt = memchr(q, '>', (size_t)(x->end - q));
                    if (gt == NULL) {
                        rx_fail(x, SP_ERR_INVALID, "%s", "pattern: unterminated group name");
                        return fail_len;
                    }
                    x->p = gt + 1;
                } else {
                    const char *what = q < x->end && (*q == '=' || *q == '!') ? "lookahead"
                                       : q < x->end && *q == '<'           ? "lookbehind"
                                                                           : "inline flags or "
                                                                             "this group kind";
                    rx_fail(x, SP_ERR_INVALID, "pattern: %s '(?%c' is not supported", what,
                            q < x->end ? *q : ' ');
                    return fail_len;
                }
            }
            if (++x->depth > SP_REGEX_MAX_NEST) {
                rx_fail(x, SP_ERR_TOO_LARGE, "pattern: groups nested deeper than %d",
                        SP_REGEX_MAX_NEST);
                return fail_len;
            }
            puts_(x, "(");
            a = parse_alt(x, false);
            x->depth--;
            if (x->st != SP_OK) {
                return fail_len;
            }
            if (at_end(x) || *x->p != ')') {
                rx_fail(x, SP_ERR_INVALID, "%s", "pattern: missing ')'");
                return fail_len;
            }
            x->p++;
            puts_(x, ")");
        } else if (c == '[') {
            x->p++;
            parse_class(x);
        } else if (c == '.') {
            x->p++;
            /* JavaScript's '.': anything but the line terminators */
            rng_t r[4] = {{0, '\n' - 1}, {'\n' + 1, '\r' - 1}, {'\r' + 1, 0x2027},
                          {0x202A, MAX_CP}};
            put_set(x, r, 4);
        } else if (c == '\\') {
            x->p++;
            char cls = 0;
            int64_t cp = escape(x, &cls);
            if (cp == -2) {
                rng_t r[16];
                int n = norm(r, class_escape(cls, r, 0));
                put_set(x, r, n);
            } else if (cp >= 0) {
                rng_t r = {(uint32_t)cp, (uint32_t)cp};
                if (cp == 0 || (x->flags & SP_REGEX_JSON && cp < 0x20 && cp != '\n' &&
                                cp != '\r' && cp != '\t')) {
                    put_set(x, &r, 1); /* refused with the class message */
                } else {
                    put_char(x, (uint32_t)cp);
                }
            }
        } else if (c == ')') {
            break;
        } else {
            int64_t cp = next_cp(x);
            if (cp >= 0) { /* a brace that is not a quantifier is itself, as in JavaScript */
                put_char(x, (uint32_t)cp);
            }
        }
        if (x->st != SP_OK) {
            return fail_len;
        }
        /* quantifier */
        if (!at_end(x)) {
            char q = *x->p;
            long m = 0, n = 0;
            if (q == '*' || q == '+' || q == '?') {
                x->p++;
                m = q == '+' ? 1 : 0;
                n = q == '?' ? 1 : -1;
                if (n < 0 && x->rcap > 0) {
                    char s[48];
                    snprintf(s, sizeof s, "{%ld,%ld}", m, x->rcap > m ? x->rcap : m);
                    puts_(x, s);
                } else {
                    char s[2] = {q, 0};
                    puts_(x, s);
                }
            } else if (q == '{' && parse_braces(x, &m, &n)) {
                if (m > 4096 || n > 4096 || (n >= 0 && n < m)) {
                    rx_fail(x, n >= 0 && n < m ? SP_ERR_INVALID : SP_ERR_TOO_LARGE,
                            "pattern: a repetition {%ld,%ld} (counts up to 4096, min <= max)", m,
                            n);
                    return fail_len;
                }
                char s[48];
                if (n == m) {
                    snprintf(s, sizeof s, "{%ld}", m);
                } else if (n < 0 && x->rcap > 0) {
                    snprintf(s, sizeof s, "{%ld,%ld}", m, x->rcap > m ? x->rcap : m);
                } else if (n < 0) {
                    snprintf(s, sizeof s, "{%ld,}", m);
                } else {
                    snprintf(s, sizeof s, "{%ld,%ld}", m, n);
                }
                puts_(x, s);
            } else {
                total.lo = sat(total.lo + a.lo), total.hi = sat(total.hi + a.hi);
                continue;
            }
            long reps = n >= 0 ? n : x->rcap > 0 ? (x->rcap > m ? x->rcap : m) : -1;
            a.lo = sat(a.lo * m);
            a.hi = reps < 0 ? (a.hi ? RX_INF : 0) : sat(a.hi * reps);
            if (!at_end(x) && *x->p == '?') {
                x->p++; /* lazy: the same set of strings */
            }
            if (!at_end(x) && (*x->p == '*' || *x->p == '+' || *x->p == '?' ||
                               (*x->p == '{' && parse_braces(&(rx_t){.p = x->p, .end = x->end},
                                                             &m, &n)))) {
                rx_fail(x, SP_ERR_INVALID, "pattern: a quantifier after a quantifier ('%c')",
                        *x->p);
                return fail_len;
            }
            total.lo = sat(total.lo + a.lo), total.hi = sat(total.hi + a.hi);
        } else {
            total.lo = sat(total.lo + a.lo), total.hi = sat(total.hi + a.hi);
        }
    }
    if (!any && !(top && search)) {
        puts_(x, "\"\"");
    }
    if (top && search && !anchored_end) {
        puts_(x, " ");
        puts_(x, around);
        total.hi = sat(total.hi + (x->rcap > 0 ? x->rcap : RX_INF));
    }
    return total;
}

static rlen_t
parse_alt(rx_t *x, bool top)
{
    rlen_t r = {RX_INF, 0};
    for (;;) {
        rlen_t a = parse_seq(x, top);
        r.lo = a.lo < r.lo ? a.lo : r.lo;
        r.hi = a.hi > r.hi ? a.hi : r.hi;
        if (x->st != SP_OK || at_end(x) || *x->p != '|') {
            return r;
        }
        x->p++;
        puts_(x, " | ");
    }
}

char *
sp_regex_gbnf(const char *re, size_t len, unsigned flags, sp_status_t *st, char *err,
              size_t err_len)
{
    return sp_regex_gbnf_capped(re, len, flags, 0, NULL, NULL, st, err, err_len);
}

char *
sp_regex_gbnf_capped(const char *re, size_t len, unsigned flags, long cap, int64_t *min_len,
                     int64_t *max_len, sp_status_t *st, char *err, size_t err_len)
{
    rx_t x = {.re = re, .p = re, .end = re + len, .flags = flags, .rcap = cap, .st = SP_OK,
              .err = err, .err_len = err_len};
    if (len > SP_REGEX_MAX_LEN) {
        *st = sp_errf(err, err_len, SP_ERR_TOO_LARGE, "pattern: more than %d bytes",
                      SP_REGEX_MAX_LEN);
        return NULL;
    }
    if (memchr(re, '\0', len) != NULL) {
        *st = sp_errf(err, err_len, SP_ERR_INVALID, "pattern: contains a NUL byte");
        return NULL;
    }
    puts_(&x, "(");
    rlen_t l = parse_alt(&x, true);
    if (min_len) {
        *min_len = l.lo;
    }
    if (max_len) {
        *max_len = l.hi >= RX_INF ? -1 : l.hi;
    }
    if (x.st == SP_OK && !at_end(&x)) {
        rx_fail(&x, SP_ERR_INVALID, "%s", "pattern: unmatched ')'");
    }
    puts_(&x, ")");
    *st = x.st;
    if (x.st != SP_OK) {
        sp_free(x.out);
        return NULL;
    }
    return x.out;
}
