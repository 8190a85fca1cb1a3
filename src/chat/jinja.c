/*
 * jinja.c - the chat-template compiler: source normalisation, the lexer (with
 * Jinja's whitespace control as transformers configures it) and a recursive
 * descent parser into an AST on the template's arena; and the public entry
 * points of jinja.h (render resolves the default limits, then hands over to
 * the interpreter in jinja_eval.c, which never calls back here).
 *
 * Recursion is bounded by construction: every nested block, bracket and unary
 * operator goes through a counter capped at SP_JINJA_MAX_NESTING, and every
 * expression node records its height, capped at SP_JINJA_MAX_AST_DEPTH (so a
 * left-deep `a+b+c+...` chain cannot make the evaluator recurse without end).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "chat/jinja_impl.h"

/* ---- tokens ----------------------------------------------------------- */
enum {
    TK_EOF,
    TK_TEXT,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STR,
    TK_INT,
    TK_FLOAT,
    TK_OP,
};

/* Two-character operators get letters; one-character ones are themselves. */
#define OP_FLOORDIV 'F'
#define OP_POW      'P'
#define OP_EQ       'E'
#define OP_NE       'N'
#define OP_LE       'L'
#define OP_GE       'G'

typedef struct tok {
    uint8_t t;
    char op;
    uint32_t line;
    const char *p; /* text, name or decoded string */
    size_t n;
    int64_t i;
    double f;
} tok_t;

typedef struct jc {
    sp__jarena_t *a;
    const char *s; /* normalised source */
    size_t n;
    tok_t *toks;
    size_t nt, cap, pos;
    int nest;       /* blocks and brackets open now */
    int loops;      /* for loops open now (break/continue) */
    char *err;
    size_t err_len;
    sp_status_t st;
} jc_t;

static sp_status_t
jc_fail(jc_t *c, sp_status_t st, uint32_t line, const char *fmt, ...) SP_PRINTF(4, 5);

static sp_status_t
jc_fail(jc_t *c, sp_status_t st, uint32_t line, const char *fmt, ...)
{
    if (c->st != SP_OK) {
        return c->st; /* keep the first error */
    }
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = st;
    return sp_errf(c->err, c->err_len, st, "line %u: %s", (unsigned)line, msg);
}

static sp_status_t
jc_nomem(jc_t *c)
{
    if (c->st == SP_OK) {
        c->st = SP_ERR_NOMEM;
        sp_errf(c->err, c->err_len, SP_ERR_NOMEM, "out of memory compiling a template");
    }
    return c->st;
}

static tok_t *
push_tok(jc_t *c, int type, uint32_t line)
{
    if (c->nt == c->cap) {
        size_t cap = c->cap < 64 ? 64 : c->cap * 2;
        tok_t *nt = sp_realloc(c->toks, cap * sizeof *nt);
        if (nt == NULL) {
            jc_nomem(c);
            return NULL;
        }
        c->toks = nt;
        c->cap = cap;
    }
    tok_t *t = &c->toks[c->nt++];
    memset(t, 0, sizeof *t);
    t->t = (uint8_t)type;
    t->line = line;
    return t;
}

/* ---- lexer ------------------------------------------------------------ */
static bool
is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static bool
is_name_start(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}

static bool
is_digit(char ch)
{
    return ch >= '0' && ch <= '9';
}

static uint32_t
count_lines(const char *s, size_t from, size_t to)
{
    uint32_t n = 0;
    for (size_t i = from; i < to; i++) {
        n += s[i] == '\n';
    }
    return n;
}

/* Emit text [b, e) of the source, if not empty. */
static void
emit_text(jc_t *c, size_t b, size_t e, uint32_t line)
{
    if (e > b) {
        tok_t *t = push_tok(c, TK_TEXT, line);
        if (t != NULL) {
            t->p = c->s + b;
            t->n = e - b;
        }
    }
}

/* Whitespace control for the text [b, e) in front of a tag opening at e.
 * sign: '-', '+' or 0; lstrip: whether lstrip_blocks applies (block and
 * comment tags, not {{ }}). Returns the new end. */
static size_t
strip_before_tag(const jc_t *c, size_t b, size_t e, char sign, bool lstrip)
{
    if (sign == '-') {
        while (e > b && is_space(c->s[e - 1])) {
            e--;
        }
        return e;
    }
    if (sign == '+' || !lstrip) {
        return e;
    }
    /* lstrip_blocks: only blanks between the start of the line and the tag. */
    size_t l = e;
    while (l > b && c->s[l - 1] != '\n') {
        l--;
    }
    bool line_start = l > b || b == 0 || c->s[b - 1] == '\n';
    if (!line_start || l == e) {
        return e;
    }
    for (size_t i = l; i < e; i++) {
        if (!is_space(c->s[i])) {
            return e;
        }
    }
    return l;
}

/* Decode a string literal body [b, e) with Python's unicode-escape rules. */
static bool
decode_string(jc_t *c, tok_t *t, size_t b, size_t e)
{
    if (memchr(c->s + b, '\\', e - b) == NULL) {
        t->p = c->s + b;
        t->n = e - b;
        return true;
    }
    char *dst = sp__jinja_value_arena_alloc(c->a, e - b + 1);
    if (dst == NULL) {
        jc_nomem(c);
        return false;
    }
    size_t o = 0;
    for (size_t i = b; i < e;) {
        char ch = c->s[i];
        if (ch != '\\' || i + 1 >= e) {
            dst[o++] = ch;
            i++;
            continue;
        }
        char x = c->s[i + 1];
        char one = 0;
        switch (x) {
        case 'n': one = '\n'; break;
        case 't': one = '\t'; break;
        case 'r': one = '\r'; break;
        case '\\': one = '\\'; break;
        case '\'': one = '\''; break;
        case '"': one = '"'; break;
        case 'a': one = '\a'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'v': one = '\v'; break;
        case '\n': i += 2; continue; /* a backslash-newline joins lines */
        default: break;
        }
        if (one != 0) {
            dst[o++] = one;
            i += 2;
            continue;
        }
        if (x >= '0' && x <= '7') {
            unsigned v = 0;
            size_t k = i + 1;
            while (k < e && k < i + 4 && c->s[k] >= '0' && c->s[k] <= '7') {
                v = v * 8 + (unsigned)(c->s[k] - '0');
                k++;
            }
            if (v < 0x80) {
                dst[o++] = (char)v;
            } else {
                dst[o++] = (char)(0xC0 | (v >> 6));
                dst[o++] = (char)(0x80 | (v & 0x3F));
            }
            i = k;
            continue;
        }
        int digits = x == 'x' ? 2 : x == 'u' ? 4 : x == 'U' ? 8 : 0;
        if (digits > 0 && i + 2 + (size_t)digits <= e) {
            unsigned long cp = 0;
            bool ok = true;
            for (int k = 0; k < digits; k++) {
                char h = c->s[i + 2 + (size_t)k];
                int v = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                                                : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                ok = ok && v >= 0;
                cp = cp * 16 + (unsigned long)(v < 0 ? 0 : v);
            }
            if (ok && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF)) {
                /* Encode as UTF-8; never longer than the escape itself (>= 4 bytes). */
                if (cp < 0x80) {
                    dst[o++] = (char)cp;
                } else if (cp < 0x800) {
                    dst[o++] = (char)(0xC0 | (cp >> 6));
                    dst[o++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    dst[o++] = (char)(0xE0 | (cp >> 12));
                    dst[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    dst[o++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    dst[o++] = (char)(0xF0 | (cp >> 18));
                    dst[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    dst[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    dst[o++] = (char)(0x80 | (cp & 0x3F));
                }
                i += 2 + (size_t)digits;
                continue;
            }
        }
        /* Unknown escape: Python keeps the backslash. */
        dst[o++] = '\\';
        i++;
    }
    t->p = dst;
    t->n = o;
    return true;
}

/* Lex the inside of a tag from *pos up to its end marker. Returns false on error. */
static bool
lex_tag(jc_t *c, size_t *pos, uint32_t *line, bool block, char *end_sign)
{
    size_t i = *pos;
    int depth = 0;
    for (;;) {
        while (i < c->n && is_space(c->s[i])) {
            *line += c->s[i] == '\n';
            i++;
        }
        if (i >= c->n) {
            jc_fail(c, SP_ERR_INVALID, *line, "unclosed %s", block ? "'{%'" : "'{{'");
            return false;
        }
        const char *p = c->s + i;
        size_t left = c->n - i;
        if (depth == 0) {
            char close = block ? '%' : '}';
            char sign = 0;
            size_t k = 0;
            if ((p[0] == '-' || (block && p[0] == '+')) && left >= 3 && p[1] == close &&
                p[2] == '}') {
                sign = p[0];
                k = 1;
            }
            if (left >= k + 2 && p[k] == close && p[k + 1] == '}') {
                if (push_tok(c, block ? TK_BLOCK_END : TK_VAR_END, *line) == NULL) {
                    return false;
                }
                *pos = i + k + 2;
                *end_sign = sign;
                return true;
            }
        }
        char ch = p[0];
        if (is_name_start(ch)) {
            size_t k = 1;
            while (k < left && (is_name_start(p[k]) || is_digit(p[k]))) {
                k++;
            }
            tok_t *t = push_tok(c, TK_NAME, *line);
            if (t == NULL) {
                return false;
            }
            t->p = p;
            t->n = k;
            i += k;
            continue;
        }
        if (is_digit(ch)) {
            size_t k = 0;
            char num[64];
            size_t nn = 0;
            bool is_float = false;
            while (k < left && (is_digit(p[k]) || p[k] == '_')) {
                if (p[k] != '_' && nn < sizeof num - 1) {
                    num[nn++] = p[k];
                }
                k++;
            }
            if (k + 1 < left && p[k] == '.' && is_digit(p[k + 1])) {
                is_float = true;
                num[nn < sizeof num - 1 ? nn++ : nn] = '.';
                k++;
                while (k < left && (is_digit(p[k]) || p[k] == '_')) {
                    if (p[k] != '_' && nn < sizeof num - 1) {
                        num[nn++] = p[k];
                    }
                    k++;
                }
            }
            if (k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t k2 = k + 1;
                if (k2 < left && (p[k2] == '+' || p[k2] == '-')) {
                    k2++;
                }
                if (k2 < left && is_digit(p[k2])) {
                    is_float = true;
                    while (k < k2 && nn < sizeof num - 1) {
                        num[nn++] = p[k++];
                    }
                    while (k < left && is_digit(p[k])) {
                        if (nn < sizeof num - 1) {
                            num[nn++] = p[k];
                        }
                        k++;
                    }
                }
            }
            num[nn] = '\0';
            tok_t *t = push_tok(c, is_float ? TK_FLOAT : TK_INT, *line);
            if (t == NULL) {
                return false;
            }
            if (is_float) {
                t->f = strtod(num, NULL);
            } else {
                errno = 0;
                long long v = strtoll(num, NULL, 10);
                if (errno == ERANGE || nn >= sizeof num - 1) {
                    jc_fail(c, SP_ERR_INVALID, *line, "integer literal too large");
                    return false;
                }
                t->i = v;
            }
            i += k;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t k = 1;
            uint32_t l0 = *line;
            while (k < left && p[k] != ch) {
                if (p[k] == '\\' && k + 1 < left) {
                    k++;
                }
                *line += p[k] == '\n';
                k++;
            }
            if (k >= left) {
                jc_fail(c, SP_ERR_INVALID, l0, "unterminated string");
                return false;
            }
            tok_t *t = push_tok(c, TK_STR, l0);
            if (t == NULL || !decode_string(c, t, i + 1, i + k)) {
                return false;
            }
            i += k + 1;
            continue;
        }
        char op = 0;
        size_t k = 1;
        if (left >= 2) {
            char two[3] = {p[0], p[1], 0};
            static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
            static const char codes[] = {OP_FLOORDIV, OP_POW, OP_EQ, OP_NE, OP_LE, OP_GE};
            for (size_t j = 0; j < 6; j++) {
                if (strcmp(two, ops2[j]) == 0) {
                    op = codes[j];
                    k = 2;
                }
            }
        }
        if (op == 0 && strchr("+-*/%~()[]{},.:|=<>", ch) != NULL) {
            op = ch;
        }
        if (op == 0) {
            jc_fail(c, SP_ERR_INVALID, *line, "unexpected character '%c' in a tag",
                    (ch >= 0x20 && ch < 0x7f) ? ch : '?');
            return false;
        }
        if (op == '(' || op == '[' || op == '{') {
            depth++;
        } else if ((op == ')' || op == ']' || op == '}') && depth > 0) {
            depth--;
        }
        tok_t *t = push_tok(c, TK_OP, *line);
        if (t == NULL) {
            return false;
        }
        t->op = op;
        i += k;
    }
}

/* Skip whitespace after a tag as its end sign says ('-': all, '+': none,
 * 0: one newline when trim applies, i.e. after block and comment tags). */
static size_t
strip_after_tag(const jc_t *c, size_t i, char sign, bool trim)
{
    if (sign == '-') {
        while (i < c->n && is_space(c->s[i])) {
            i++;
        }
    } else if (sign == 0 && trim && i < c->n && c->s[i] == '\n') {
        i++;
    }
    return i;
}

/* {% raw %} ... {% endraw %}: the tokens "raw" and the end are already pushed. */
static bool
lex_raw(jc_t *c, size_t *pos, uint32_t *line, char raw_sign)
{
    c->nt -= 3; /* BLOCK_BEGIN raw BLOCK_END */
    size_t start = raw_sign == '-' ? strip_after_tag(c, *pos, '-', false) : *pos;
    for (size_t i = start; i + 1 < c->n; i++) {
        if (c->s[i] != '{' || c->s[i + 1] != '%') {
            continue;
        }
        size_t k = i + 2;
        char sign = 0;
        if (k < c->n && (c->s[k] == '-' || c->s[k] == '+')) {
            sign = c->s[k++];
        }
        while (k < c->n && is_space(c->s[k])) {
            k++;
        }
        if (c->n - k < 6 || memcmp(c->s + k, "endraw", 6) != 0) {
            continue;
        }
        k += 6;
        while (k < c->n && is_space(c->s[k])) {
            k++;
        }
        char esign = 0;
        if (k < c->n && (c->s[k] == '-' || c->s[k] == '+')) {
            esign = c->s[k++];
        }
        if (c->n - k < 2 || c->s[k] != '%' || c->s[k + 1] != '}') {
            continue;
        }
        size_t e = sign == '-' ? strip_before_tag(c, start, i, '-', false) : i;
        emit_text(c, start, e, *line);
        *line += count_lines(c->s, *pos, k + 2);
        *pos = strip_after_tag(c, k + 2, esign, true);
        *line += count_lines(c->s, k + 2, *pos);
        return c->st == SP_OK;
    }
    jc_fail(c, SP_ERR_INVALID, *line, "unclosed {%% raw %%}");
    return false;
}

static bool
lex(jc_t *c)
{
    size_t pos = 0;
    uint32_t line = 1;
    while (pos < c->n && c->st == SP_OK) {
        size_t q = pos;
        while (q + 1 < c->n && !(c->s[q] == '{' && (c->s[q + 1] == '{' || c->s[q + 1] == '%' ||
                                                     c->s[q + 1] == '#'))) {
            q++;
        }
        if (q + 1 >= c->n) {
            emit_text(c, pos, c->n, line);
            break;
        }
        char kind = c->s[q + 1];
        char sign = 0;
        if (q + 2 < c->n && (c->s[q + 2] == '-' || c->s[q + 2] == '+')) {
            sign = c->s[q + 2];
        }
        size_t e = strip_before_tag(c, pos, q, sign, kind != '{');
        emit_text(c, pos, e, line);
        line += count_lines(c->s, pos, q);
        size_t i = q + 2 + (sign != 0);
        if (kind == '#') {
            size_t k = i;
            while (k + 1 < c->n && !(c->s[k] == '#' && c->s[k + 1] == '}')) {
                k++;
            }
            if (k + 1 >= c->n) {
                jc_fail(c, SP_ERR_INVALID, line, "unclosed comment");
                return false;
            }
            char esign = k > i && (c->s[k - 1] == '-' || c->s[k - 1] == '+') ? c->s[k - 1] : 0;
            line += count_lines(c->s, q, k + 2);
            pos = strip_after_tag(c, k + 2, esign, true);
            line += count_lines(c->s, k + 2, pos);
            continue;
        }
        bool block = kind == '%';
        if (push_tok(c, block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, line) == NULL) {
            return false;
        }
        size_t first = c->nt;
        char esign = 0;
        if (!lex_tag(c, &i, &line, block, &esign)) {
            return false;
        }
        size_t after = strip_after_tag(c, i, esign, block);
        if (block && c->nt == first + 2 && c->toks[first].t == TK_NAME &&
            c->toks[first].n == 3 && memcmp(c->toks[first].p, "raw", 3) == 0) {
            pos = i;
            if (!lex_raw(c, &pos, &line, esign)) {
                return false;
            }
            continue;
        }
        line += count_lines(c->s, i, after);
        pos = after;
    }
    return push_tok(c, TK_EOF, line) != NULL && c->st == SP_OK;
}

/* ---- parser helpers --------------------------------------------------- */
static tok_t *
cur(jc_t *c)
{
    return &c->toks[c->pos];
}

static tok_t *
peek(jc_t *c, size_t k)
{
    size_t i = c->pos + k;
    return &c->toks[i < c->nt ? i : c->nt - 1];
}

static void
advance(jc_t *c)
{
    if (c->toks[c->pos].t != TK_EOF) {
        c->pos++;
    }
}

static bool
is_op(const tok_t *t, char op)
{
    return t->t == TK_OP && t->op == op;
}

static bool
is_word(const tok_t *t, const char *w)
{
    size_t n = strlen(w);
    return t->t == TK_NAME && t->n == n && memcmp(t->p, w, n) == 0;
}

static const char *
tok_desc(const tok_t *t, char *buf, size_t n)
{
    switch (t->t) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_STR: return "a string";
    case TK_INT:
    case TK_FLOAT: return "a number";
    case TK_NAME:
        snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p);
        return buf;
    default:
        snprintf(buf, n, "'%c'", t->op >= 'A' && t->op <= 'Z' ? '?' : t->op);
        return buf;
    }
}

static sp_status_t
unexpected(jc_t *c, const char *expected)
{
    char buf[64];
    return jc_fail(c, SP_ERR_INVALID, cur(c)->line, "expected %s, got %s", expected,
                   tok_desc(cur(c), buf, sizeof buf));
}

static bool
expect_op(jc_t *c, char op, const char *what)
{
    if (!is_op(cur(c), op)) {
        unexpected(c, what);
        return false;
    }
    advance(c);
    return true;
}

static bool
expect_type(jc_t *c, int type, const char *what)
{
    if (cur(c)->t != type) {
        unexpected(c, what);
        return false;
    }
    advance(c);
    return true;
}

static sp__jnode_t *
mk(jc_t *c, int kind, uint32_t line)
{
    sp__jnode_t *n = sp__jinja_value_arena_alloc(c->a, sizeof *n);
    if (n == NULL) {
        jc_nomem(c);
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    n->lit.k = JV_UNDEF;
    return n;
}

/* Record the height of an expression node; refuse trees too deep to walk. */
static sp__jnode_t *
fin(jc_t *c, sp__jnode_t *n)
{
    if (n == NULL) {
        return NULL;
    }
    uint32_t d = 0;
    const sp__jnode_t *kids[3] = {n->a, n->b, n->c};
    for (int i = 0; i < 3; i++) {
        if (kids[i] != NULL && kids[i]->depth > d) {
            d = kids[i]->depth;
        }
    }
    for (uint32_t i = 0; i < n->n; i++) {
        if (n->args != NULL && n->args[i] != NULL && n->args[i]->depth > d) {
            d = n->args[i]->depth;
        }
    }
    n->depth = d + 1;
    if (n->depth > SP_JINJA_MAX_AST_DEPTH) {
        jc_fail(c, SP_ERR_TOO_LARGE, n->line, "expression nested deeper than %d",
                SP_JINJA_MAX_AST_DEPTH);
        return NULL;
    }
    return n;
}

static bool
enter(jc_t *c)
{
    if (++c->nest > SP_JINJA_MAX_NESTING) {
        jc_fail(c, SP_ERR_TOO_LARGE, cur(c)->line, "nested deeper than %d", SP_JINJA_MAX_NESTING);
        return false;
    }
    return true;
}

/* A growable array of node pointers (and names) on the arena. */
typedef struct nvec {
    sp__jnode_t **v;
    sp__jname_t *names;
    uint32_t n, cap;
} nvec_t;

static bool
nvec_push(jc_t *c, nvec_t *vec, sp__jnode_t *node, const char *name, size_t name_n)
{
    if (vec->n == vec->cap) {
        uint32_t cap = vec->cap < 4 ? 4 : vec->cap * 2;
        sp__jnode_t **nv = sp__jinja_value_arena_alloc(c->a, cap * sizeof *nv);
        sp__jname_t *nn = sp__jinja_value_arena_alloc(c->a, cap * sizeof *nn);
        if (nv == NULL || nn == NULL) {
            jc_nomem(c);
            return false;
        }
        if (vec->n > 0) {
            memcpy(nv, vec->v, vec->n * sizeof *nv);
            memcpy(nn, vec->names, vec->n * sizeof *nn);
        }
        vec->v = nv;
        vec->names = nn;
        vec->cap = cap;
    }
    vec->v[vec->n] = node;
    vec->names[vec->n].p = name;
    vec->names[vec->n].n = name_n;
    vec->n++;
    return true;
}

static void
take_args(sp__jnode_t *n, const nvec_t *vec)
{
    n->args = vec->v;
    n->names = vec->names;
    n->n = vec->n;
}

/* ---- expressions ------------------------------------------------------ */
static sp__jnode_t *parse_expr(jc_t *c);
static sp__jnode_t *parse_or(jc_t *c);
static sp__jnode_t *parse_unary(jc_t *c, bool with_filter);
static sp__jnode_t *parse_primary(jc_t *c);
static sp__jnode_t *parse_postfix(jc_t *c, sp__jnode_t *node);

static sp__jnode_t *
mk_lit(jc_t *c, uint32_t line, sp__jv_t v)
{
    sp__jnode_t *n = mk(c, JN_LIT, line);
    if (n != NULL) {
        n->lit = v;
    }
    return fin(c, n);
}

/* '(' args ')' with keyword arguments; the '(' is current. */
static bool
parse_call_args(jc_t *c, nvec_t *vec)
{
    advance(c); /* ( */
    if (!enter(c)) {
        return false;
    }
    while (!is_op(cur(c), ')')) {
        const char *name = NULL;
        size_t name_n = 0;
        if (cur(c)->t == TK_NAME && is_op(peek(c, 1), '=')) {
            name = cur(c)->p;
            name_n = cur(c)->n;
            advance(c);
            advance(c);
        } else if (vec->n > 0 && vec->names[vec->n - 1].p != NULL) {
            jc_fail(c, SP_ERR_INVALID, cur(c)->line, "positional argument after a keyword one");
            return false;
        }
        sp__jnode_t *arg = parse_expr(c);
        if (arg == NULL || !nvec_push(c, vec, arg, name, name_n)) {
            return false;
        }
        if (is_op(cur(c), ',')) {
            advance(c);
        } else if (!is_op(cur(c), ')')) {
            unexpected(c, "',' or ')'");
            return false;
        }
    }
    advance(c);
    c->nest--;
    return true;
}

static sp__jnode_t *
parse_subscript(jc_t *c, sp__jnode_t *target)
{
    uint32_t line = cur(c)->line;
    advance(c); /* [ */
    if (!enter(c)) {
        return NULL;
    }
    sp__jnode_t *parts[3] = {NULL, NULL, NULL};
    bool slice = false;
    if (!is_op(cur(c), ':')) {
        if ((parts[0] = parse_expr(c)) == NULL) {
            return NULL;
        }
    }
    for (int k = 1; k < 3 && is_op(cur(c), ':'); k++) {
        slice = true;
        advance(c);
        if (!is_op(cur(c), ':') && !is_op(cur(c), ']')) {
            if ((parts[k] = parse_expr(c)) == NULL) {
                return NULL;
            }
        }
    }
    if (!expect_op(c, ']', "']'")) {
        return NULL;
    }
    c->nest--;
    sp__jnode_t *n = mk(c, slice ? JN_SLICE : JN_ITEM, line);
    if (n == NULL) {
        return NULL;
    }
    n->a = target;
    if (slice) {
        n->args = sp__jinja_value_arena_alloc(c->a, 3 * sizeof *n->args);
        if (n->args == NULL) {
            jc_nomem(c);
            return NULL;
        }
        memcpy(n->args, parts, sizeof parts);
        n->n = 3;
    } else {
        n->b = parts[0];
    }
    return fin(c, n);
}

static sp__jnode_t *
parse_postfix(jc_t *c, sp__jnode_t *node)
{
    while (node != NULL) {
        tok_t *t = cur(c);
        if (is_op(t, '.')) {
            advance(c);
            tok_t *name = cur(c);
            sp__jnode_t *n;
            if (name->t == TK_NAME) {
                n = mk(c, JN_ATTR, t->line);
                if (n == NULL) {
                    return NULL;
                }
                n->lit = sp__jv_str(name->p, name->n);
            } else if (name->t == TK_INT) {
                /* foo.0 is foo[0] */
                n = mk(c, JN_ITEM, t->line);
                if (n == NULL || (n->b = mk_lit(c, t->line, sp__jv_int(name->i))) == NULL) {
                    return NULL;
                }
            } else {
                unexpected(c, "an attribute name");
                return NULL;
            }
            advance(c);
            n->a = node;
            node = fin(c, n);
        } else if (is_op(t, '[')) {
            node = parse_subscript(c, node);
        } else if (is_op(t, '(')) {
            sp__jnode_t *n = mk(c, JN_CALL, t->line);
            nvec_t vec = {0};
            if (n == NULL || !parse_call_args(c, &vec)) {
                return NULL;
            }
            n->a = node;
            take_args(n, &vec);
            node = fin(c, n);
        } else {
            break;
        }
    }
    return node;
}

static sp__jnode_t *
parse_filter_expr(jc_t *c, sp__jnode_t *node)
{
    while (node != NULL) {
        tok_t *t = cur(c);
        if (is_op(t, '|')) {
            advance(c);
            tok_t *name = cur(c);
            if (name->t != TK_NAME) {
                unexpected(c, "a filter name");
                return NULL;
            }
            /* An unknown filter is an error only where it runs, as in Jinja2
             * since 3.0: templates name filters of other engines (from_json)
             * in branches that Hugging Face's renderer never takes. */
            int id = sp__jinja_eval_filter_id(name->p, name->n);
            if (id < 0) {
                id = SP__JINJA_FILTER_UNKNOWN;
            }
            advance(c);
            sp__jnode_t *n = mk(c, JN_FILTER, t->line);
            if (n == NULL) {
                return NULL;
            }
            n->op = (uint8_t)id;
            n->a = node;
            n->lit = sp__jv_str(name->p, name->n);
            if (is_op(cur(c), '(')) {
                nvec_t vec = {0};
                if (!parse_call_args(c, &vec)) {
                    return NULL;
                }
                take_args(n, &vec);
            }
            node = fin(c, n);
        } else if (is_word(t, "is")) {
            advance(c);
            bool neg = false;
            if (is_word(cur(c), "not")) {
                neg = true;
                advance(c);
            }
            tok_t *name = cur(c);
            if (name->t != TK_NAME) {
                unexpected(c, "a test name");
                return NULL;
            }
            int id = sp__jinja_eval_test_id(name->p, name->n);
            if (id < 0) {
                jc_fail(c, SP_ERR_INVALID, name->line, "unknown test '%.*s'",
                        (int)(name->n > 40 ? 40 : name->n), name->p);
                return NULL;
            }
            advance(c);
            sp__jnode_t *n = mk(c, JN_TEST, t->line);
            if (n == NULL) {
                return NULL;
            }
            n->op = (uint8_t)id;
            n->flag = neg;
            n->a = node;
            n->lit = sp__jv_str(name->p, name->n);
            tok_t *nx = cur(c);
            if (is_op(nx, '(')) {
                nvec_t vec = {0};
                if (!parse_call_args(c, &vec)) {
                    return NULL;
                }
                take_args(n, &vec);
            } else if ((nx->t == TK_NAME || nx->t == TK_STR || nx->t == TK_INT ||
                        nx->t == TK_FLOAT || is_op(nx, '[') || is_op(nx, '{')) &&
                       !is_word(nx, "else") && !is_word(nx, "or") && !is_word(nx, "and") &&
                       !is_word(nx, "if") && !is_word(nx, "in") && !is_word(nx, "is") &&
                       !is_word(nx, "not")) {
                /* `x is divisibleby 3`, `x is sameas none`: one argument without parentheses. */
                nvec_t vec = {0};
                sp__jnode_t *arg = parse_postfix(c, parse_primary(c));
                if (arg == NULL || !nvec_push(c, &vec, arg, NULL, 0)) {
                    return NULL;
                }
                take_args(n, &vec);
            }
            node = fin(c, n);
        } else if (is_op(t, '(')) {
            node = parse_postfix(c, node);
        } else {
            break;
        }
    }
    return node;
}

static sp__jnode_t *
parse_list_like(jc_t *c, char close, bool dict, uint32_t line)
{
    advance(c); /* [ { ( */
    if (!enter(c)) {
        return NULL;
    }
    nvec_t vec = {0};
    while (!is_op(cur(c), close)) {
        sp__jnode_t *e = parse_expr(c);
        if (e == NULL || !nvec_push(c, &vec, e, NULL, 0)) {
            return NULL;
        }
        if (dict) {
            if (!expect_op(c, ':', "':'")) {
                return NULL;
            }
            if ((e = parse_expr(c)) == NULL || !nvec_push(c, &vec, e, NULL, 0)) {
                return NULL;
            }
        }
        if (is_op(cur(c), ',')) {
            advance(c);
        } else if (!is_op(cur(c), close)) {
            char want[16];
            snprintf(want, sizeof want, "',' or '%c'", close);
            unexpected(c, want);
            return NULL;
        }
    }
    advance(c);
    c->nest--;
    sp__jnode_t *n = mk(c, dict ? JN_DICT : JN_LIST, line);
    if (n == NULL) {
        return NULL;
    }
    take_args(n, &vec);
    return fin(c, n);
}

static sp__jnode_t *
parse_primary(jc_t *c)
{
    tok_t *t = cur(c);
    uint32_t line = t->line;
    switch (t->t) {
    case TK_NAME: {
        static const struct {
            const char *w;
            int v;
        } consts[] = {{"true", 1}, {"True", 1}, {"false", 0}, {"False", 0}, {"none", -1},
                      {"None", -1}};
        for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
            if (is_word(t, consts[i].w)) {
                advance(c);
                return mk_lit(c, line, consts[i].v < 0 ? sp__jv_none() : sp__jv_bool(consts[i].v));
            }
        }
        sp__jnode_t *n = mk(c, JN_NAME, line);
        if (n == NULL) {
            return NULL;
        }
        n->lit = sp__jv_str(t->p, t->n);
        advance(c);
        return fin(c, n);
    }
    case TK_STR: {
        /* Adjacent literals concatenate: 'a' 'b' is 'ab'. */
        const char *p = t->p;
        size_t n = t->n;
        advance(c);
        while (cur(c)->t == TK_STR) {
            tok_t *s2 = cur(c);
            char *joined = sp__jinja_value_arena_alloc(c->a, n + s2->n + 1);
            if (joined == NULL) {
                jc_nomem(c);
                return NULL;
            }
            memcpy(joined, p, n);
            memcpy(joined + n, s2->p, s2->n);
            p = joined;
            n += s2->n;
            advance(c);
        }
        return mk_lit(c, line, sp__jv_str(p, n));
    }
    case TK_INT:
        advance(c);
        return mk_lit(c, line, sp__jv_int(t->i));
    case TK_FLOAT:
        advance(c);
        return mk_lit(c, line, sp__jv_float(t->f));
    case TK_OP:
        if (t->op == '[') {
            return parse_list_like(c, ']', false, line);
        }
        if (t->op == '{') {
            return parse_list_like(c, '}', true, line);
        }
        if (t->op == '(') {
            /* (e), or a tuple (e, ...) / () which we make a list */
            if (is_op(peek(c, 1), ')')) {
                return parse_list_like(c, ')', false, line);
            }
            advance(c);
            if (!enter(c)) {
                return NULL;
            }
            sp__jnode_t *e = parse_expr(c);
            if (e == NULL) {
                return NULL;
            }
            if (is_op(cur(c), ',')) {
                nvec_t vec = {0};
                if (!nvec_push(c, &vec, e, NULL, 0)) {
                    return NULL;
                }
                while (is_op(cur(c), ',')) {
                    advance(c);
                    if (is_op(cur(c), ')')) {
                        break;
                    }
                    if ((e = parse_expr(c)) == NULL || !nvec_push(c, &vec, e, NULL, 0)) {
                        return NULL;
                    }
                }
                sp__jnode_t *n = mk(c, JN_LIST, line);
                if (n == NULL) {
                    return NULL;
                }
                take_args(n, &vec);
                e = fin(c, n);
            }
            if (!expect_op(c, ')', "')'")) {
                return NULL;
            }
            c->nest--;
            return e;
        }
        break;
    default:
        break;
    }
    unexpected(c, "an expression");
    return NULL;
}

static sp__jnode_t *
parse_unary(jc_t *c, bool with_filter)
{
    tok_t *t = cur(c);
    sp__jnode_t *node;
    if (is_op(t, '-') || is_op(t, '+')) {
        advance(c);
        if (!enter(c)) {
            return NULL;
        }
        sp__jnode_t *x = parse_unary(c, false);
        c->nest--;
        if (x == NULL) {
            return NULL;
        }
        if (x->kind == JN_LIT && (x->lit.k == JV_INT || x->lit.k == JV_FLOAT) && t->op == '-' &&
            !(x->lit.k == JV_INT && x->lit.u.i == INT64_MIN)) {
            /* Fold -1 so that range(3, -1, -1) costs nothing. */
            if (x->lit.k == JV_INT) {
                x->lit.u.i = -x->lit.u.i;
            } else {
                x->lit.u.f = -x->lit.u.f;
            }
            node = x;
        } else {
            node = mk(c, JN_UNARY, t->line);
            if (node == NULL) {
                return NULL;
            }
            node->op = (uint8_t)t->op;
            node->a = x;
            node = fin(c, node);
        }
    } else {
        node = parse_postfix(c, parse_primary(c));
    }
    return with_filter ? parse_filter_expr(c, node) : node;
}

static sp__jnode_t *
mk_bin(jc_t *c, int kind, int op, uint32_t line, sp__jnode_t *l, sp__jnode_t *r)
{
    if (l == NULL || r == NULL) {
        return NULL;
    }
    sp__jnode_t *n = mk(c, kind, line);
    if (n == NULL) {
        return NULL;
    }
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return fin(c, n);
}

static sp__jnode_t *
parse_pow(jc_t *c)
{
    sp__jnode_t *l = parse_unary(c, true);
    while (l != NULL && is_op(cur(c), OP_POW)) {
        uint32_t line = cur(c)->line;
        advance(c);
        l = mk_bin(c, JN_BIN, JOP_POW, line, l, parse_unary(c, true));
    }
    return l;
}

static sp__jnode_t *
parse_math2(jc_t *c)
{
    sp__jnode_t *l = parse_pow(c);
    for (;;) {
        tok_t *t = cur(c);
        int op = is_op(t, '*') ? JOP_MUL : is_op(t, '/') ? JOP_DIV
               : is_op(t, OP_FLOORDIV) ? JOP_FLOORDIV : is_op(t, '%') ? JOP_MOD : 0;
        if (l == NULL || op == 0) {
            return l;
        }
        advance(c);
        l = mk_bin(c, JN_BIN, op, t->line, l, parse_pow(c));
    }
}

static sp__jnode_t *
parse_concat(jc_t *c)
{
    sp__jnode_t *l = parse_math2(c);
    while (l != NULL && is_op(cur(c), '~')) {
        uint32_t line = cur(c)->line;
        advance(c);
        l = mk_bin(c, JN_BIN, JOP_CONCAT, line, l, parse_math2(c));
    }
    return l;
}

static sp__jnode_t *
parse_math1(jc_t *c)
{
    sp__jnode_t *l = parse_concat(c);
    for (;;) {
        tok_t *t = cur(c);
        int op = is_op(t, '+') ? JOP_ADD : is_op(t, '-') ? JOP_SUB : 0;
        if (l == NULL || op == 0) {
            return l;
        }
        advance(c);
        l = mk_bin(c, JN_BIN, op, t->line, l, parse_concat(c));
    }
}

static sp__jnode_t *
parse_compare(jc_t *c)
{
    sp__jnode_t *l = parse_math1(c);
    sp__jnode_t *result = l;
    for (;;) {
        tok_t *t = cur(c);
        int op = 0;
        if (t->t == TK_OP) {
            op = t->op == OP_EQ ? JOP_EQ : t->op == OP_NE ? JOP_NE : t->op == '<' ? JOP_LT
               : t->op == OP_LE ? JOP_LE : t->op == '>' ? JOP_GT : t->op == OP_GE ? JOP_GE : 0;
            if (op != 0) {
                advance(c);
            }
        } else if (is_word(t, "in")) {
            op = JOP_IN;
            advance(c);
        } else if (is_word(t, "not") && is_word(peek(c, 1), "in")) {
            op = JOP_NOTIN;
            advance(c);
            advance(c);
        }
        if (result == NULL || op == 0) {
            return result;
        }
        sp__jnode_t *r = parse_math1(c);
        sp__jnode_t *cmp = mk_bin(c, JN_BIN, op, t->line, l, r);
        /* a < b < c is (a < b) and (b < c), as in Python. */
        result = result == l ? cmp : mk_bin(c, JN_AND, 0, t->line, result, cmp);
        l = r;
    }
}

static sp__jnode_t *
parse_not(jc_t *c)
{
    if (is_word(cur(c), "not")) {
        uint32_t line = cur(c)->line;
        advance(c);
        if (!enter(c)) {
            return NULL;
        }
        sp__jnode_t *x = parse_not(c);
        c->nest--;
        if (x == NULL) {
            return NULL;
        }
        sp__jnode_t *n = mk(c, JN_NOT, line);
        if (n == NULL) {
            return NULL;
        }
        n->a = x;
        return fin(c, n);
    }
    return parse_compare(c);
}

static sp__jnode_t *
parse_and(jc_t *c)
{
    sp__jnode_t *l = parse_not(c);
    while (l != NULL && is_word(cur(c), "and")) {
        uint32_t line = cur(c)->line;
        advance(c);
        l = mk_bin(c, JN_AND, 0, line, l, parse_not(c));
    }
    return l;
}

static sp__jnode_t *
parse_or(jc_t *c)
{
    sp__jnode_t *l = parse_and(c);
    while (l != NULL && is_word(cur(c), "or")) {
        uint32_t line = cur(c)->line;
        advance(c);
        l = mk_bin(c, JN_OR, 0, line, l, parse_and(c));
    }
    return l;
}

/* expr: or ['if' or ['else' expr]] */
static sp__jnode_t *
parse_expr(jc_t *c)
{
    if (!enter(c)) {
        return NULL;
    }
    sp__jnode_t *e = parse_or(c);
    while (e != NULL && is_word(cur(c), "if")) {
        uint32_t line = cur(c)->line;
        advance(c);
        sp__jnode_t *n = mk(c, JN_COND, line);
        if (n == NULL) {
            return NULL;
        }
        n->b = e;
        if ((n->a = parse_or(c)) == NULL) {
            return NULL;
        }
        if (is_word(cur(c), "else")) {
            advance(c);
            if ((n->c = parse_expr(c)) == NULL) {
                return NULL;
            }
        }
        e = fin(c, n);
    }
    c->nest--;
    return e;
}

/* expr [',' expr ...] as a list when there is a comma (set a, b = 1, 2). */
static sp__jnode_t *
parse_tuple(jc_t *c)
{
    uint32_t line = cur(c)->line;
    sp__jnode_t *e = parse_expr(c);
    if (e == NULL || !is_op(cur(c), ',')) {
        return e;
    }
    nvec_t vec = {0};
    if (!nvec_push(c, &vec, e, NULL, 0)) {
        return NULL;
    }
    while (is_op(cur(c), ',')) {
        advance(c);
        if (cur(c)->t == TK_BLOCK_END || cur(c)->t == TK_VAR_END) {
            break;
        }
        if ((e = parse_expr(c)) == NULL || !nvec_push(c, &vec, e, NULL, 0)) {
            return NULL;
        }
    }
    sp__jnode_t *n = mk(c, JN_LIST, line);
    if (n == NULL) {
        return NULL;
    }
    take_args(n, &vec);
    return fin(c, n);
}

/* ---- statements ------------------------------------------------------- */
static sp__jnode_t *parse_body(jc_t *c, const char *const *ends, size_t n_ends);

static bool
end_block(jc_t *c)
{
    return expect_type(c, TK_BLOCK_END, "'%}'");
}

/* Consume `{% word %}` that closes a block (the '{%' and word are current). */
static bool
close_tag(jc_t *c, const char *word)
{
    (void)word;
    advance(c); /* {% */
    advance(c); /* word */
    return end_block(c);
}

/* Names separated by commas: for targets, set targets. */
static bool
parse_targets(jc_t *c, nvec_t *vec)
{
    bool paren = is_op(cur(c), '(');
    if (paren) {
        advance(c);
    }
    for (;;) {
        if (cur(c)->t != TK_NAME) {
            unexpected(c, "a variable name");
            return false;
        }
        if (!nvec_push(c, vec, NULL, cur(c)->p, cur(c)->n)) {
            return false;
        }
        advance(c);
        if (!is_op(cur(c), ',')) {
            break;
        }
        advance(c);
    }
    return !paren || expect_op(c, ')', "')'");
}

static sp__jnode_t *
parse_if(jc_t *c, uint32_t line)
{
    static const char *const ends[] = {"elif", "else", "endif"};
    sp__jnode_t *n = mk(c, JN_IF, line);
    if (n == NULL || (n->a = parse_expr(c)) == NULL || !end_block(c)) {
        return NULL;
    }
    n->body = parse_body(c, ends, 3);
    if (c->st != SP_OK) {
        return NULL;
    }
    tok_t *w = peek(c, 1);
    if (is_word(w, "elif")) {
        advance(c);
        advance(c);
        /* The elif chain is an if in the else branch; it consumes the endif. */
        if (!enter(c)) {
            return NULL;
        }
        n->alt = parse_if(c, w->line);
        c->nest--;
        return c->st == SP_OK ? n : NULL;
    }
    if (is_word(w, "else")) {
        advance(c);
        advance(c);
        if (!end_block(c)) {
            return NULL;
        }
        n->alt = parse_body(c, ends + 2, 1);
        if (c->st != SP_OK) {
            return NULL;
        }
    }
    return close_tag(c, "endif") ? n : NULL;
}

static sp__jnode_t *
parse_for(jc_t *c, uint32_t line)
{
    static const char *const ends[] = {"else", "endfor"};
    sp__jnode_t *n = mk(c, JN_FOR, line);
    nvec_t targets = {0};
    if (n == NULL || !parse_targets(c, &targets)) {
        return NULL;
    }
    n->names = targets.names;
    n->n = targets.n;
    if (!is_word(cur(c), "in")) {
        unexpected(c, "'in'");
        return NULL;
    }
    advance(c);
    if (!enter(c) || (n->a = parse_or(c)) == NULL) {
        return NULL;
    }
    c->nest--;
    if (is_word(cur(c), "if")) {
        advance(c);
        if ((n->b = parse_expr(c)) == NULL) {
            return NULL;
        }
    }
    if (is_word(cur(c), "recursive")) {
        jc_fail(c, SP_ERR_INVALID, cur(c)->line, "recursive loops are not supported");
        return NULL;
    }
    if (!end_block(c)) {
        return NULL;
    }
    c->loops++;
    n->body = parse_body(c, ends, 2);
    c->loops--;
    if (c->st != SP_OK) {
        return NULL;
    }
    if (is_word(peek(c, 1), "else")) {
        advance(c);
        advance(c);
        if (!end_block(c)) {
            return NULL;
        }
        n->alt = parse_body(c, ends + 1, 1);
        if (c->st != SP_OK) {
            return NULL;
        }
    }
    return close_tag(c, "endfor") ? n : NULL;
}

static sp__jnode_t *
parse_set(jc_t *c, uint32_t line)
{
    static const char *const ends[] = {"endset"};
    nvec_t targets = {0};
    sp__jnode_t *n = mk(c, JN_SET, line);
    if (n == NULL) {
        return NULL;
    }
    if (cur(c)->t == TK_NAME && is_op(peek(c, 1), '.') && peek(c, 2)->t == TK_NAME) {
        /* set ns.attr = value */
        if (!nvec_push(c, &targets, NULL, cur(c)->p, cur(c)->n)) {
            return NULL;
        }
        n->lit = sp__jv_str(peek(c, 2)->p, peek(c, 2)->n);
        advance(c);
        advance(c);
        advance(c);
    } else if (!parse_targets(c, &targets)) {
        return NULL;
    }
    n->names = targets.names;
    n->n = targets.n;
    if (is_op(cur(c), '=')) {
        advance(c);
        if ((n->a = parse_tuple(c)) == NULL || !end_block(c)) {
            return NULL;
        }
        return n;
    }
    if (targets.n != 1 || n->lit.k == JV_STR) {
        unexpected(c, "'='");
        return NULL;
    }
    if (!end_block(c)) {
        return NULL;
    }
    n->kind = JN_SETBLOCK;
    n->body = parse_body(c, ends, 1);
    if (c->st != SP_OK) {
        return NULL;
    }
    return close_tag(c, "endset") ? n : NULL;
}

static sp__jnode_t *
parse_macro(jc_t *c, uint32_t line)
{
    static const char *const ends[] = {"endmacro"};
    sp__jnode_t *n = mk(c, JN_MACRO, line);
    if (n == NULL) {
        return NULL;
    }
    if (cur(c)->t != TK_NAME) {
        unexpected(c, "a macro name");
        return NULL;
    }
    n->lit = sp__jv_str(cur(c)->p, cur(c)->n);
    advance(c);
    if (!expect_op(c, '(', "'('")) {
        return NULL;
    }
    nvec_t params = {0};
    while (!is_op(cur(c), ')')) {
        if (cur(c)->t != TK_NAME) {
            unexpected(c, "a parameter name");
            return NULL;
        }
        const char *p = cur(c)->p;
        size_t pn = cur(c)->n;
        advance(c);
        sp__jnode_t *dflt = NULL;
        if (is_op(cur(c), '=')) {
            advance(c);
            if ((dflt = parse_expr(c)) == NULL) {
                return NULL;
            }
        }
        if (!nvec_push(c, &params, dflt, p, pn)) {
            return NULL;
        }
        if (is_op(cur(c), ',')) {
            advance(c);
        } else if (!is_op(cur(c), ')')) {
            unexpected(c, "',' or ')'");
            return NULL;
        }
    }
    advance(c);
    if (!end_block(c)) {
        return NULL;
    }
    take_args(n, &params);
    int loops = c->loops;
    c->loops = 0; /* break inside a macro does not reach the caller's loop */
    n->body = parse_body(c, ends, 1);
    c->loops = loops;
    if (c->st != SP_OK) {
        return NULL;
    }
    return close_tag(c, "endmacro") ? n : NULL;
}

static sp__jnode_t *
parse_statement(jc_t *c)
{
    uint32_t line = cur(c)->line;
    advance(c); /* {% */
    tok_t *w = cur(c);
    if (w->t != TK_NAME) {
        unexpected(c, "a tag name");
        return NULL;
    }
    advance(c);
    if (is_word(w, "if")) {
        return parse_if(c, line);
    }
    if (is_word(w, "for")) {
        return parse_for(c, line);
    }
    if (is_word(w, "set")) {
        return parse_set(c, line);
    }
    if (is_word(w, "macro")) {
        return parse_macro(c, line);
    }
    if (is_word(w, "break") || is_word(w, "continue")) {
        if (c->loops == 0) {
            jc_fail(c, SP_ERR_INVALID, line, "'%.*s' outside a loop", (int)w->n, w->p);
            return NULL;
        }
        sp__jnode_t *n = mk(c, is_word(w, "break") ? JN_BREAK : JN_CONTINUE, line);
        return n != NULL && end_block(c) ? n : NULL;
    }
    if (is_word(w, "generation")) {
        /* transformers' marker of assistant text: renders its body. */
        static const char *const ends[] = {"endgeneration"};
        sp__jnode_t *n = mk(c, JN_BLOCK, line);
        if (n == NULL || !end_block(c)) {
            return NULL;
        }
        n->body = parse_body(c, ends, 1);
        if (c->st != SP_OK) {
            return NULL;
        }
        return close_tag(c, "endgeneration") ? n : NULL;
    }
    static const char *const no_files[] = {"include", "import", "from", "extends", "block"};
    for (size_t i = 0; i < sizeof no_files / sizeof no_files[0]; i++) {
        if (is_word(w, no_files[i])) {
            jc_fail(c, SP_ERR_INVALID, line, "'%s' is not supported (templates cannot load files)",
                    no_files[i]);
            return NULL;
        }
    }
    jc_fail(c, SP_ERR_INVALID, line, "unknown or misplaced tag '%.*s'",
            (int)(w->n > 40 ? 40 : w->n), w->p);
    return NULL;
}

/* Statements up to `{% end... %}` (one of ends, left unconsumed) or the end. */
static sp__jnode_t *
parse_body(jc_t *c, const char *const *ends, size_t n_ends)
{
    sp__jnode_t *head = NULL, **tail = &head;
    uint32_t line0 = cur(c)->line;
    if (!enter(c)) {
        return NULL;
    }
    for (;;) {
        tok_t *t = cur(c);
        sp__jnode_t *n = NULL;
        if (t->t == TK_EOF) {
            if (n_ends > 0) {
                jc_fail(c, SP_ERR_INVALID, t->line,
                        "unexpected end of template: the block from line %u needs '%s'",
                        (unsigned)line0, ends[n_ends - 1]);
                return NULL;
            }
            break;
        }
        if (t->t == TK_TEXT) {
            n = mk(c, JN_TEXT, t->line);
            if (n == NULL) {
                return NULL;
            }
            n->lit = sp__jv_str(t->p, t->n);
            advance(c);
        } else if (t->t == TK_VAR_BEGIN) {
            advance(c);
            n = mk(c, JN_OUTPUT, t->line);
            if (n == NULL || (n->a = parse_tuple(c)) == NULL ||
                !expect_type(c, TK_VAR_END, "'}}'")) {
                return NULL;
            }
        } else if (t->t == TK_BLOCK_BEGIN) {
            tok_t *w = peek(c, 1);
            for (size_t i = 0; i < n_ends; i++) {
                if (is_word(w, ends[i])) {
                    c->nest--;
                    return head;
                }
            }
            if ((n = parse_statement(c)) == NULL) {
                return NULL;
            }
        } else {
            unexpected(c, "text or a tag");
            return NULL;
        }
        *tail = n;
        tail = &n->next;
    }
    c->nest--;
    return head;
}

/* ---- public ----------------------------------------------------------- */
sp_jinja_opts_t
sp_jinja_default_opts(void)
{
    sp_jinja_opts_t o;
    o.max_steps = 1000000;
    o.max_output_bytes = 1u << 20;
    o.max_memory_bytes = 64u << 20;
    o.max_depth = 400;
    o.now = 0;
    return o;
}

sp_status_t
sp_jinja_render_json(const sp_jinja_t *t, const char *ctx_json, size_t ctx_len,
                     const sp_jinja_opts_t *opts, char **out, size_t *out_len, char *err,
                     size_t err_len)
{
    sp_jinja_opts_t o = opts != NULL ? *opts : sp_jinja_default_opts();
    return sp__jinja_eval_render(t, ctx_json, ctx_len, &o, out, out_len, err, err_len);
}

sp_status_t
sp_jinja_json_check(const char *json, size_t len, char *err, size_t err_len)
{
    if (json == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "json: NULL");
    }
    return sp__jinja_value_json_check(json, len, err, err_len);
}

sp_status_t
sp_jinja_compile(const char *src, size_t len, sp_jinja_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (src == NULL && len > 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "template: NULL source");
    }
    if (len > SP_JINJA_MAX_SOURCE_BYTES) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "template: %zu bytes, the limit is %u",
                       len, SP_JINJA_MAX_SOURCE_BYTES);
    }
    sp_jinja_t *t = sp_calloc(1, sizeof *t);
    if (t == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "template: out of memory");
    }
    sp__jinja_value_arena_init(&t->arena, 0);
    jc_t c;
    memset(&c, 0, sizeof c);
    c.a = &t->arena;
    c.err = err;
    c.err_len = err_len;
    /* Newlines become \n and one trailing newline goes (keep_trailing_newline off). */
    char *s = sp__jinja_value_arena_alloc(c.a, len + 1);
    if (s == NULL) {
        jc_nomem(&c);
        goto fail;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') {
                i++;
            }
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') {
        n--;
    }
    s[n] = '\0';
    c.s = s;
    c.n = n;
    if (!lex(&c)) {
        goto fail;
    }
    t->body = parse_body(&c, NULL, 0);
    if (c.st != SP_OK) {
        goto fail;
    }
    sp_free(c.toks);
    *out = t;
    return SP_OK;
fail:
    sp_free(c.toks);
    sp_jinja_destroy(t);
    return c.st != SP_OK ? c.st : SP_ERR_INVALID;
}

void
sp_jinja_destroy(sp_jinja_t *t)
{
    if (t == NULL) {
        return;
    }
    sp__jinja_value_arena_free(&t->arena);
    sp_free(t);
}
