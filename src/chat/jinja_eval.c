/*
 * jinja_eval.c - the chat-template interpreter: scopes, Python-like value
 * semantics, filters, tests, string/dict methods and the global functions.
 *
 * The sandbox is the value model itself: a template sees only the JSON
 * context, the values it builds and the built-ins below; an attribute is a
 * dict key or one of a fixed list of methods, never a host object. Limits:
 * every statement, expression node, loop iteration and O(n) piece of work
 * costs steps (opts.max_steps), recursion is counted (opts.max_depth), every
 * value lives on an arena capped at opts.max_memory_bytes, and the output and
 * every captured block are capped at opts.max_output_bytes.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "chat/jinja_impl.h"

typedef struct frame frame_t;
struct frame {
    frame_t *parent;
    sp__jdict_t *vars;
};

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

typedef struct jr {
    sp__jarena_t arena;
    sp_jinja_opts_t o;
    uint64_t steps;
    int depth;
    sp__jbuf_t *out;
    frame_t *scope; /* innermost */
    frame_t *root;  /* the template's top level */
    const sp__jdict_t *ctx;
    char *err;
    size_t err_len;
    sp_status_t st;
    int ctl;
} jr_t;

#define TRY(x)                                                                  \
    do {                                                                        \
        sp_status_t st_ = (x);                                                  \
        if (st_ != SP_OK) {                                                     \
            return st_;                                                         \
        }                                                                       \
    } while (0)

static sp_status_t rfail(jr_t *r, uint32_t line, sp_status_t st, const char *fmt, ...)
    SP_PRINTF(4, 5);

static sp_status_t
rfail(jr_t *r, uint32_t line, sp_status_t st, const char *fmt, ...)
{
    if (r->st != SP_OK) {
        return r->st;
    }
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = st;
    sp_errf(r->err, r->err_len, st, "line %u: %s", (unsigned)line, msg);
    return st;
}

/* An allocation failed: the memory cap, or the system. */
static sp_status_t
oom(jr_t *r, uint32_t line)
{
    if (sp__jinja_value_arena_over(&r->arena, 1)) {
        return rfail(r, line, SP_ERR_TOO_LARGE, "render memory limit of %zu bytes exceeded",
                     r->o.max_memory_bytes);
    }
    return rfail(r, line, SP_ERR_NOMEM, "out of memory");
}

/* A value that would not fit in the memory budget at all. */
static sp_status_t
too_big(jr_t *r, uint32_t line)
{
    return rfail(r, line, SP_ERR_TOO_LARGE, "render memory limit of %zu bytes exceeded",
                 r->o.max_memory_bytes);
}

/* A status from a buffer or value writer. */
static sp_status_t
wfail(jr_t *r, uint32_t line, sp_status_t st)
{
    if (st == SP_ERR_NOMEM) {
        return oom(r, line);
    }
    if (st == SP_ERR_TOO_LARGE && sp__jinja_value_arena_over(&r->arena, 1)) {
        return oom(r, line);
    }
    if (st == SP_ERR_TOO_LARGE) {
        return rfail(r, line, st, "output over %zu bytes, or a value nested too deep",
                     r->o.max_output_bytes);
    }
    return rfail(r, line, st, "cannot write this value");
}

static sp_status_t
charge(jr_t *r, uint32_t line, uint64_t units)
{
    r->steps += units;
    if (r->steps > r->o.max_steps) {
        return rfail(r, line, SP_ERR_TOO_LARGE,
                     "step limit of %llu exceeded (runaway loop or recursion)",
                     (unsigned long long)r->o.max_steps);
    }
    return SP_OK;
}

static const char *
type_name(const sp__jv_t *v)
{
    static const char *const names[] = {"undefined", "NoneType", "bool",     "int",
                                        "float",     "str",      "list",     "dict",
                                        "Namespace", "function", "macro",    "LoopContext"};
    return v->k < sizeof names / sizeof names[0] ? names[v->k] : "?";
}

static sp_status_t
undefined_error(jr_t *r, uint32_t line, const sp__jv_t *v)
{
    if (v->u.s.p != NULL && v->u.s.n > 0) {
        return rfail(r, line, SP_ERR_INVALID, "'%.*s' is undefined",
                     (int)(v->u.s.n > 60 ? 60 : v->u.s.n), v->u.s.p);
    }
    return rfail(r, line, SP_ERR_INVALID, "a value is undefined");
}

static char *
str_alloc(jr_t *r, uint32_t line, size_t n)
{
    char *p = sp__jinja_value_arena_alloc(&r->arena, n == 0 ? 1 : n);
    if (p == NULL) {
        oom(r, line);
    }
    return p;
}

/* A capture buffer with the render's limits. */
static void
buf_init(jr_t *r, sp__jbuf_t *b)
{
    b->a = &r->arena;
    b->p = NULL;
    b->n = 0;
    b->cap_alloc = 0;
    b->limit = r->o.max_output_bytes;
}

static sp__jv_t
buf_value(sp__jbuf_t *b)
{
    return sp__jv_str(b->p != NULL ? b->p : "", b->n);
}

/* str(v) as a string value (strings are returned as they are). */
static sp_status_t
to_str(jr_t *r, uint32_t line, const sp__jv_t *v, sp__jv_t *out)
{
    if (v->k == JV_STR) {
        *out = *v;
        return SP_OK;
    }
    if (v->k == JV_UNDEF) {
        *out = sp__jv_str("", 0);
        return SP_OK;
    }
    sp__jbuf_t b;
    buf_init(r, &b);
    sp_status_t st = sp__jinja_value_write(&b, v, false, r->o.max_depth);
    if (st != SP_OK) {
        return wfail(r, line, st);
    }
    *out = buf_value(&b);
    return charge(r, line, b.n / 256);
}

/* ---- truth, equality, order ------------------------------------------ */
static bool
truthy(const sp__jv_t *v)
{
    switch (v->k) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n > 0;
    case JV_LIST: return v->lazy || v->u.l->n > 0; /* a generator is always true */
    case JV_DICT: return v->u.d->n > 0;
    default: return true;
    }
}

static bool
is_num(const sp__jv_t *v)
{
    return v->k == JV_BOOL || v->k == JV_INT || v->k == JV_FLOAT;
}

static int64_t
as_int(const sp__jv_t *v)
{
    return v->k == JV_BOOL ? (int64_t)v->u.b : v->u.i;
}

static double
as_float(const sp__jv_t *v)
{
    return v->k == JV_FLOAT ? v->u.f : (double)as_int(v);
}

static bool
str_eq(const sp__jv_t *a, const char *s, size_t n)
{
    return a->k == JV_STR && a->u.s.n == n && (n == 0 || memcmp(a->u.s.p, s, n) == 0);
}

/* Python ==, with nesting bounded by depth (error when exceeded: *bad set). */
static bool
equal(const sp__jv_t *a, const sp__jv_t *b, int depth, bool *bad)
{
    if (depth <= 0) {
        *bad = true;
        return false;
    }
    if (is_num(a) && is_num(b)) {
        if (a->k == JV_FLOAT || b->k == JV_FLOAT) {
            return as_float(a) == as_float(b);
        }
        return as_int(a) == as_int(b);
    }
    if (a->k != b->k) {
        return false;
    }
    switch (a->k) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return str_eq(a, b->u.s.p, b->u.s.n);
    case JV_LIST:
        if (a->u.l->n != b->u.l->n) {
            return false;
        }
        for (size_t i = 0; i < a->u.l->n; i++) {
            if (!equal(&a->u.l->v[i], &b->u.l->v[i], depth - 1, bad)) {
                return false;
            }
        }
        return true;
    case JV_DICT: {
        const sp__jdict_t *x = a->u.d, *y = b->u.d;
        /* Same keys (repeated keys of JSON input collapse to their last value). */
        size_t nx = 0, ny = 0;
        for (size_t i = 0; i < x->n; i++) {
            const sp__jv_t *vy = sp__jinja_value_dict_get(y, x->e[i].k, x->e[i].kn);
            if (sp__jinja_value_dict_get(x, x->e[i].k, x->e[i].kn) != &x->e[i].v) {
                continue; /* an earlier copy of a repeated key */
            }
            nx++;
            if (vy == NULL || !equal(&x->e[i].v, vy, depth - 1, bad)) {
                return false;
            }
        }
        for (size_t i = 0; i < y->n; i++) {
            ny += sp__jinja_value_dict_get(y, y->e[i].k, y->e[i].kn) == &y->e[i].v;
        }
        return nx == ny;
    }
    case JV_NS: return a->u.d == b->u.d;
    case JV_FUNC: return a->u.fn == b->u.fn;
    case JV_MACRO: return a->u.m == b->u.m;
    case JV_LOOP: return a->u.lp == b->u.lp;
    default: return false;
    }
}

static sp_status_t
eq_checked(jr_t *r, uint32_t line, const sp__jv_t *a, const sp__jv_t *b, bool *out)
{
    bool bad = false;
    *out = equal(a, b, r->o.max_depth, &bad);
    if (bad) {
        return rfail(r, line, SP_ERR_TOO_LARGE, "values nested too deep to compare");
    }
    return SP_OK;
}

/* Python <: numbers, strings (code point order is UTF-8 byte order), lists. */
static sp_status_t
less(jr_t *r, uint32_t line, const sp__jv_t *a, const sp__jv_t *b, int depth, bool *out)
{
    if (depth <= 0) {
        return rfail(r, line, SP_ERR_TOO_LARGE, "values nested too deep to compare");
    }
    if (is_num(a) && is_num(b)) {
        *out = (a->k == JV_FLOAT || b->k == JV_FLOAT) ? as_float(a) < as_float(b)
                                                      : as_int(a) < as_int(b);
        return SP_OK;
    }
    if (a->k == JV_STR && b->k == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = n > 0 ? memcmp(a->u.s.p, b->u.s.p, n) : 0;
        *out = c < 0 || (c == 0 && a->u.s.n < b->u.s.n);
        return SP_OK;
    }
    if (a->k == JV_LIST && b->k == JV_LIST) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            bool e;
            TRY(eq_checked(r, line, &a->u.l->v[i], &b->u.l->v[i], &e));
            if (!e) {
                return less(r, line, &a->u.l->v[i], &b->u.l->v[i], depth - 1, out);
            }
        }
        *out = a->u.l->n < b->u.l->n;
        return SP_OK;
    }
    if (a->k == JV_UNDEF) {
        return undefined_error(r, line, a);
    }
    if (b->k == JV_UNDEF) {
        return undefined_error(r, line, b);
    }
    return rfail(r, line, SP_ERR_INVALID, "'<' not supported between '%s' and '%s'", type_name(a),
                 type_name(b));
}

static sp_status_t
contains(jr_t *r, uint32_t line, const sp__jv_t *item, const sp__jv_t *in, bool *out)
{
    switch (in->k) {
    case JV_STR:
        if (item->k != JV_STR) {
            return rfail(r, line, SP_ERR_INVALID, "'in <string>' needs a string, not '%s'",
                         type_name(item));
        }
        TRY(charge(r, line, in->u.s.n / 256));
        *out = item->u.s.n == 0 ||
               memmem(in->u.s.p, in->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        return SP_OK;
    case JV_LIST:
        TRY(charge(r, line, in->u.l->n / 16));
        for (size_t i = 0; i < in->u.l->n; i++) {
            TRY(eq_checked(r, line, item, &in->u.l->v[i], out));
            if (*out) {
                return SP_OK;
            }
        }
        *out = false;
        return SP_OK;
    case JV_DICT:
    case JV_NS:
        TRY(charge(r, line, in->u.d->n / 16));
        if (item->k == JV_INT) {
            char k[SP__JKEY_INT_BYTES];
            sp__jkey_put_int(k, item->u.i);
            *out = sp__jinja_value_dict_get(in->u.d, k, sizeof k) != NULL;
            return SP_OK;
        }
        *out = item->k == JV_STR &&
               sp__jinja_value_dict_get(in->u.d, item->u.s.p, item->u.s.n) != NULL;
        return SP_OK;
    case JV_UNDEF: /* Jinja2's Undefined iterates as empty */
        *out = false;
        return SP_OK;
    default:
        return rfail(r, line, SP_ERR_INVALID, "argument of type '%s' is not iterable",
                     type_name(in));
    }
}

/* ---- arithmetic ------------------------------------------------------- */
static sp_status_t
concat_str(jr_t *r, uint32_t line, const char *a, size_t an, const char *b, size_t bn,
           sp__jv_t *out)
{
    size_t n;
    if (sp_add_size(an, bn, &n) != 0 || n > r->o.max_memory_bytes) {
        return too_big(r, line);
    }
    TRY(charge(r, line, n / 256));
    char *p = str_alloc(r, line, n);
    if (p == NULL) {
        return r->st;
    }
    if (an > 0) {
        memcpy(p, a, an);
    }
    if (bn > 0) {
        memcpy(p + an, b, bn);
    }
    *out = sp__jv_str(p, n);
    return SP_OK;
}

static sp_status_t
list_concat(jr_t *r, uint32_t line, const sp__jlist_t *a, const sp__jlist_t *b, sp__jv_t *out)
{
    TRY(charge(r, line, (a->n + b->n) / 16));
    sp__jlist_t *l = sp__jinja_value_list_new(&r->arena, a->n + b->n);
    if (l == NULL) {
        return oom(r, line);
    }
    for (size_t i = 0; i < a->n; i++) {
        l->v[l->n++] = a->v[i];
    }
    for (size_t i = 0; i < b->n; i++) {
        l->v[l->n++] = b->v[i];
    }
    out->k = JV_LIST;
    out->markup = out->lazy = 0;
    out->u.l = l;
    return SP_OK;
}

static sp_status_t
repeat(jr_t *r, uint32_t line, const sp__jv_t *seq, int64_t times, sp__jv_t *out)
{
    if (times < 0) {
        times = 0;
    }
    size_t unit = seq->k == JV_STR ? seq->u.s.n : seq->u.l->n * sizeof(sp__jv_t), total;
    if (sp_mul_size(unit, (size_t)times, &total) != 0 || total > r->o.max_memory_bytes) {
        return too_big(r, line);
    }
    TRY(charge(r, line, total / 256 + (uint64_t)times / 16));
    if (seq->k == JV_STR) {
        char *p = str_alloc(r, line, total);
        if (p == NULL) {
            return r->st;
        }
        for (int64_t i = 0; i < times; i++) {
            memcpy(p + (size_t)i * unit, seq->u.s.p, unit);
        }
        *out = sp__jv_str(p, total);
        return SP_OK;
    }
    sp__jlist_t *l = sp__jinja_value_list_new(&r->arena, seq->u.l->n * (size_t)times);
    if (l == NULL) {
        return oom(r, line);
    }
    for (int64_t i = 0; i < times; i++) {
        for (size_t j = 0; j < seq->u.l->n; j++) {
            l->v[l->n++] = seq->u.l->v[j];
        }
    }
    out->k = JV_LIST;
    out->markup = out->lazy = 0;
    out->u.l = l;
    return SP_OK;
}

static sp_status_t html_escape(jr_t *r, uint32_t line, const sp__jv_t *v, sp__jv_t *out);

static sp_status_t
arith(jr_t *r, uint32_t line, int op, const sp__jv_t *a, const sp__jv_t *b, sp__jv_t *out)
{
    if (op == JOP_CONCAT) {
        sp__jv_t sa, sb;
        TRY(to_str(r, line, a, &sa));
        TRY(to_str(r, line, b, &sb));
        return concat_str(r, line, sa.u.s.p, sa.u.s.n, sb.u.s.p, sb.u.s.n, out);
    }
    if (a->k == JV_UNDEF) {
        return undefined_error(r, line, a);
    }
    if (b->k == JV_UNDEF) {
        return undefined_error(r, line, b);
    }
    if (op == JOP_ADD && a->k == JV_STR && b->k == JV_STR) {
        if (a->markup == b->markup) {
            TRY(concat_str(r, line, a->u.s.p, a->u.s.n, b->u.s.p, b->u.s.n, out));
            out->markup = a->markup;
            return SP_OK;
        }
        /* Markup + str (or str + Markup): the plain side is escaped, the sum is Markup */
        sp__jv_t ea = *a, eb = *b;
        TRY(a->markup ? html_escape(r, line, b, &eb) : html_escape(r, line, a, &ea));
        TRY(concat_str(r, line, ea.u.s.p, ea.u.s.n, eb.u.s.p, eb.u.s.n, out));
        out->markup = 1;
        return SP_OK;
    }
    if (op == JOP_ADD && a->k == JV_LIST && b->k == JV_LIST) {
        return list_concat(r, line, a->u.l, b->u.l, out);
    }
    if (op == JOP_MUL && (a->k == JV_STR || a->k == JV_LIST) && (b->k == JV_INT || b->k == JV_BOOL)) {
        return repeat(r, line, a, as_int(b), out);
    }
    if (op == JOP_MUL && (b->k == JV_STR || b->k == JV_LIST) && (a->k == JV_INT || a->k == JV_BOOL)) {
        return repeat(r, line, b, as_int(a), out);
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *const sym[] = {"", "+", "-", "*", "/", "//", "%", "**"};
        return rfail(r, line, SP_ERR_INVALID, "unsupported operand types for %s: '%s' and '%s'",
                     op >= JOP_ADD && op <= JOP_POW ? sym[op] : "?", type_name(a), type_name(b));
    }
    bool fl = a->k == JV_FLOAT || b->k == JV_FLOAT || op == JOP_DIV;
    if (!fl) {
        int64_t x = as_int(a), y = as_int(b), z = 0;
        bool ovf = false;
        switch (op) {
        case JOP_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
        case JOP_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
        case JOP_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (y == 0) {
                return rfail(r, line, SP_ERR_INVALID, "integer division or modulo by zero");
            }
            if (x == INT64_MIN && y == -1) {
                ovf = op == JOP_FLOORDIV;
                z = 0;
                break;
            }
            z = op == JOP_FLOORDIV ? x / y : x % y;
            /* Python rounds toward -inf and gives the remainder the divisor's sign. */
            if ((x % y != 0) && ((x < 0) != (y < 0))) {
                z = op == JOP_FLOORDIV ? z - 1 : z + y;
            }
            break;
        case JOP_POW:
            if (y < 0) {
                fl = true;
                break;
            }
            z = 1;
            for (int64_t i = 0; i < y && !ovf; i++) {
                ovf = __builtin_mul_overflow(z, x, &z);
                if (z == 0 || z == 1) {
                    break; /* 0**n, 1**n */
                }
            }
            if (x == -1) {
                z = (y % 2) ? -1 : 1;
            }
            break;
        default: break;
        }
        if (ovf) {
            return rfail(r, line, SP_ERR_INVALID, "integer overflow");
        }
        if (!fl) {
            *out = sp__jv_int(z);
            return SP_OK;
        }
    }
    double x = as_float(a), y = as_float(b), z = 0;
    switch (op) {
    case JOP_ADD: z = x + y; break;
    case JOP_SUB: z = x - y; break;
    case JOP_MUL: z = x * y; break;
    case JOP_DIV:
    case JOP_FLOORDIV:
    case JOP_MOD:
        if (y == 0) {
            return rfail(r, line, SP_ERR_INVALID, "division by zero");
        }
        if (op == JOP_DIV) {
            z = x / y;
        } else if (op == JOP_FLOORDIV) {
            z = floor(x / y);
        } else {
            z = fmod(x, y);
            if (z != 0 && ((z < 0) != (y < 0))) {
                z += y;
            }
        }
        break;
    case JOP_POW: z = pow(x, y); break;
    default: break;
    }
    *out = sp__jv_float(z);
    return SP_OK;
}

/* ---- attributes, items, slices --------------------------------------- */
static sp__jv_t
loop_attr(const sp__jloop_t *lp, const char *name, size_t n)
{
    size_t len = lp->items->n, i = lp->index0;
#define IS(w) (n == sizeof(w) - 1 && memcmp(name, w, n) == 0)
    if (IS("index0")) return sp__jv_int((int64_t)i);
    if (IS("index")) return sp__jv_int((int64_t)i + 1);
    if (IS("first")) return sp__jv_bool(i == 0);
    if (IS("last")) return sp__jv_bool(i + 1 == len);
    if (IS("length")) return sp__jv_int((int64_t)len);
    if (IS("revindex")) return sp__jv_int((int64_t)(len - i));
    if (IS("revindex0")) return sp__jv_int((int64_t)(len - i - 1));
    if (IS("depth")) return sp__jv_int(1);
    if (IS("depth0")) return sp__jv_int(0);
    if (IS("previtem")) return i > 0 ? lp->items->v[i - 1] : sp__jv_undef("previtem", 8);
    if (IS("nextitem")) return i + 1 < len ? lp->items->v[i + 1] : sp__jv_undef("nextitem", 8);
#undef IS
    return sp__jv_undef(name, n);
}

static sp_status_t
get_attr(jr_t *r, uint32_t line, const sp__jv_t *obj, const char *name, size_t n, sp__jv_t *out)
{
    switch (obj->k) {
    case JV_UNDEF:
        return undefined_error(r, line, obj);
    case JV_DICT:
    case JV_NS: {
        TRY(charge(r, line, obj->u.d->n / 16));
        const sp__jv_t *v = sp__jinja_value_dict_get(obj->u.d, name, n);
        *out = v != NULL ? *v : sp__jv_undef(name, n);
        return SP_OK;
    }
    case JV_LOOP:
        *out = loop_attr(obj->u.lp, name, n);
        return SP_OK;
    default:
        *out = sp__jv_undef(name, n);
        return SP_OK;
    }
}

static sp_status_t
get_item(jr_t *r, uint32_t line, const sp__jv_t *obj, const sp__jv_t *key, sp__jv_t *out)
{
    if (obj->k == JV_UNDEF) {
        return undefined_error(r, line, obj);
    }
    if (key->k == JV_STR) {
        return get_attr(r, line, obj, key->u.s.p, key->u.s.n, out);
    }
    if (obj->k == JV_LIST && obj->lazy) { /* Jinja2: a generator has no items: undefined */
        *out = sp__jv_undef("item", 4);
        return SP_OK;
    }
    if ((obj->k == JV_LIST || obj->k == JV_STR) && (key->k == JV_INT || key->k == JV_BOOL)) {
        int64_t i = as_int(key);
        if (obj->k == JV_LIST) {
            int64_t n = (int64_t)obj->u.l->n;
            if (i < 0) {
                i += n;
            }
            *out = i >= 0 && i < n ? obj->u.l->v[i] : sp__jv_undef("item", 4);
            return SP_OK;
        }
        TRY(charge(r, line, obj->u.s.n / 256));
        int64_t n = (int64_t)sp__jinja_value_utf8_count(obj->u.s.p, obj->u.s.n);
        if (i < 0) {
            i += n;
        }
        if (i < 0 || i >= n) {
            *out = sp__jv_undef("item", 4);
            return SP_OK;
        }
        size_t b = sp__jinja_value_utf8_offset(obj->u.s.p, obj->u.s.n, (size_t)i);
        size_t e = sp__jinja_value_utf8_offset(obj->u.s.p, obj->u.s.n, (size_t)i + 1);
        *out = sp__jv_str(obj->u.s.p + b, e - b);
        return SP_OK;
    }
    if ((obj->k == JV_DICT || obj->k == JV_NS) && key->k == JV_INT) {
        char k[SP__JKEY_INT_BYTES];
        sp__jkey_put_int(k, key->u.i);
        const sp__jv_t *v = sp__jinja_value_dict_get(obj->u.d, k, sizeof k);
        *out = v != NULL ? *v : sp__jv_undef("item", 4);
        return SP_OK;
    }
    if (key->k == JV_UNDEF) {
        return undefined_error(r, line, key);
    }
    *out = sp__jv_undef("item", 4);
    return SP_OK;
}

/* Python's slice index adjustment for a sequence of n elements. */
static sp_status_t
slice_bounds(jr_t *r, uint32_t line, const sp__jv_t part[3], int64_t n, int64_t *start,
             int64_t *stop, int64_t *step)
{
    for (int k = 0; k < 3; k++) {
        if (part[k].k != JV_UNDEF && part[k].k != JV_NONE && part[k].k != JV_INT &&
            part[k].k != JV_BOOL) {
            return rfail(r, line, SP_ERR_INVALID, "slice indices must be integers, not '%s'",
                         type_name(&part[k]));
        }
    }
    bool has[3];
    for (int k = 0; k < 3; k++) {
        has[k] = part[k].k == JV_INT || part[k].k == JV_BOOL;
    }
    *step = has[2] ? as_int(&part[2]) : 1;
    if (*step == 0) {
        return rfail(r, line, SP_ERR_INVALID, "slice step cannot be zero");
    }
    if (*step == INT64_MIN) {
        *step = -INT64_MAX;
    }
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    int64_t v[2];
    for (int k = 0; k < 2; k++) {
        if (!has[k]) {
            if (k == 0) {
                v[k] = *step > 0 ? 0 : n - 1;
            } else {
                v[k] = *step > 0 ? n : -1;
            }
            continue;
        }
        int64_t x = as_int(&part[k]);
        if (x < 0) {
            x = x < -n ? lo : x + n;
            if (x < lo) {
                x = lo;
            }
        } else if (x > hi) {
            x = hi;
        }
        v[k] = x;
    }
    *start = v[0];
    *stop = v[1];
    return SP_OK;
}

static sp_status_t
do_slice(jr_t *r, uint32_t line, const sp__jv_t *obj, const sp__jv_t part[3], sp__jv_t *out)
{
    if (obj->k == JV_UNDEF) {
        return undefined_error(r, line, obj);
    }
    if (obj->k != JV_LIST && obj->k != JV_STR) {
        return rfail(r, line, SP_ERR_INVALID, "'%s' object cannot be sliced", type_name(obj));
    }
    bool ascii = true;
    int64_t n;
    if (obj->k == JV_LIST) {
        n = (int64_t)obj->u.l->n;
    } else {
        TRY(charge(r, line, obj->u.s.n / 256));
        for (size_t i = 0; i < obj->u.s.n && ascii; i++) {
            ascii = (unsigned char)obj->u.s.p[i] < 0x80;
        }
        n = ascii ? (int64_t)obj->u.s.n
                  : (int64_t)sp__jinja_value_utf8_count(obj->u.s.p, obj->u.s.n);
    }
    int64_t start = 0, stop = 0, step = 1;
    TRY(slice_bounds(r, line, part, n, &start, &stop, &step));
    size_t count = 0;
    if (step > 0 && start < stop) {
        count = (size_t)((stop - start - 1) / step + 1);
    } else if (step < 0 && start > stop) {
        count = (size_t)((start - stop - 1) / (-step) + 1);
    }
    TRY(charge(r, line, count / 16));
    if (obj->k == JV_LIST) {
        sp__jlist_t *l = sp__jinja_value_list_new(&r->arena, count);
        if (l == NULL) {
            return oom(r, line);
        }
        for (size_t i = 0; i < count; i++) {
            l->v[l->n++] = obj->u.l->v[start + (int64_t)i * step];
        }
        out->k = JV_LIST;
        out->markup = out->lazy = 0;
        out->u.l = l;
        return SP_OK;
    }
    if (step == 1) {
        size_t b = ascii ? (size_t)start
                         : sp__jinja_value_utf8_offset(obj->u.s.p, obj->u.s.n, (size_t)start);
        size_t e = ascii ? (size_t)start + count
                         : sp__jinja_value_utf8_offset(obj->u.s.p, obj->u.s.n,
                                                       (size_t)start + count);
        *out = sp__jv_str(obj->u.s.p + b, count == 0 ? 0 : e - b);
        return SP_OK;
    }
    /* Other steps: copy code point by code point. */
    char *p = str_alloc(r, line, obj->u.s.n);
    if (p == NULL) {
        return r->st;
    }
    size_t o = 0;
    for (size_t i = 0; i < count; i++) {
        size_t cp = (size_t)(start + (int64_t)i * step);
        size_t b = ascii ? cp : sp__jinja_value_utf8_offset(obj->u.s.p, obj->u.s.n, cp);
        size_t e = ascii ? cp + 1 : sp__jinja_value_utf8_offset(obj->u.s.p, obj->u.s.n, cp + 1);
        memcpy(p + o, obj->u.s.p + b, e - b);
        o += e - b;
    }
    TRY(charge(r, line, count * (ascii ? 1 : n) / 256));
    *out = sp__jv_str(p, o);
    return SP_OK;
}

/* ---- argument binding ------------------------------------------------- */
typedef struct args {
    const sp__jv_t *v;
    const sp__jname_t *names; /* names[i].p == NULL: positional */
    uint32_t n;
} args_t;

#define MAX_PARAMS 6

/* A parameter nobody passed. */
static sp__jv_t
missing(void)
{
    return sp__jv_undef(NULL, 0);
}

static bool
given(const sp__jv_t *v)
{
    return !(v->k == JV_UNDEF && v->u.s.p == NULL);
}

/* Bind args to params (positional first, then by name). */
static sp_status_t
bind(jr_t *r, uint32_t line, const char *fname, const char *const *params, int np,
     const args_t *a, sp__jv_t *out)
{
    int pos = 0;
    for (int i = 0; i < np; i++) {
        out[i] = missing();
    }
    for (uint32_t i = 0; i < a->n; i++) {
        if (a->names == NULL || a->names[i].p == NULL) {
            if (pos >= np) {
                return rfail(r, line, SP_ERR_INVALID, "%s: too many arguments", fname);
            }
            out[pos++] = a->v[i];
            continue;
        }
        int k = -1;
        for (int j = 0; j < np && k < 0; j++) {
            if (strlen(params[j]) == a->names[i].n &&
                memcmp(params[j], a->names[i].p, a->names[i].n) == 0) {
                k = j;
            }
        }
        if (k < 0) {
            return rfail(r, line, SP_ERR_INVALID, "%s: unexpected argument '%.*s'", fname,
                         (int)(a->names[i].n > 40 ? 40 : a->names[i].n), a->names[i].p);
        }
        out[k] = a->v[i];
    }
    return SP_OK;
}

static sp_status_t
need_str(jr_t *r, uint32_t line, const char *what, const sp__jv_t *v)
{
    if (v->k == JV_STR) {
        return SP_OK;
    }
    if (v->k == JV_UNDEF && given(v)) {
        return undefined_error(r, line, v);
    }
    return rfail(r, line, SP_ERR_INVALID, "%s: expected a string, got '%s'", what, type_name(v));
}

static sp_status_t
need_int(jr_t *r, uint32_t line, const char *what, const sp__jv_t *v, int64_t *out)
{
    if (v->k == JV_INT || v->k == JV_BOOL) {
        *out = as_int(v);
        return SP_OK;
    }
    return rfail(r, line, SP_ERR_INVALID, "%s: expected an integer, got '%s'", what, type_name(v));
}

static sp_status_t
mk_list(jr_t *r, uint32_t line, size_t cap, sp__jlist_t **out)
{
    TRY(charge(r, line, cap / 16));
    if ((*out = sp__jinja_value_list_new(&r->arena, cap)) == NULL) {
        return oom(r, line);
    }
    return SP_OK;
}

static sp__jv_t
list_value(sp__jlist_t *l)
{
    sp__jv_t v = {0};
    v.k = JV_LIST;
    v.u.l = l;
    return v;
}

static sp_status_t
push(jr_t *r, uint32_t line, sp__jlist_t *l, sp__jv_t v)
{
    return sp__jinja_value_list_push(&r->arena, l, v) ? SP_OK : oom(r, line);
}

/* The elements a for loop or a filter walks: list items, dict keys, string
 * characters; undefined is empty. */
static sp_status_t
iter_list(jr_t *r, uint32_t line, const sp__jv_t *v, const sp__jlist_t **out)
{
    sp__jlist_t *l;
    switch (v->k) {
    case JV_LIST:
        *out = v->u.l;
        return SP_OK;
    case JV_UNDEF:
        TRY(mk_list(r, line, 0, &l));
        *out = l;
        return SP_OK;
    case JV_DICT:
    case JV_NS:
        TRY(mk_list(r, line, v->u.d->n, &l));
        for (size_t i = 0; i < v->u.d->n; i++) {
            const sp__jentry_t *e = &v->u.d->e[i];
            if (sp__jinja_value_dict_get(v->u.d, e->k, e->kn) == &e->v) {
                l->v[l->n++] = sp__jkey_value(e->k, e->kn);
            }
        }
        *out = l;
        return SP_OK;
    case JV_STR: {
        size_t n = sp__jinja_value_utf8_count(v->u.s.p, v->u.s.n);
        TRY(mk_list(r, line, n, &l));
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            size_t next = sp__jinja_value_utf8_offset(v->u.s.p + off, v->u.s.n - off, 1) + off;
            l->v[l->n++] = sp__jv_str(v->u.s.p + off, next - off);
            off = next;
        }
        *out = l;
        return SP_OK;
    }
    default:
        return rfail(r, line, SP_ERR_INVALID, "'%s' object is not iterable", type_name(v));
    }
}

/* dict.items() as a list of [key, value] lists. */
static sp_status_t
dict_items(jr_t *r, uint32_t line, const sp__jv_t *v, int which, sp__jv_t *out)
{
    /* which: 0 items, 1 keys, 2 values */
    sp__jlist_t *l;
    if (v->k == JV_UNDEF) {
        TRY(mk_list(r, line, 0, &l));
        *out = list_value(l);
        return SP_OK;
    }
    if (v->k != JV_DICT && v->k != JV_NS) {
        return rfail(r, line, SP_ERR_INVALID, "items: expected a mapping, got '%s'", type_name(v));
    }
    const sp__jdict_t *d = v->u.d;
    TRY(mk_list(r, line, d->n, &l));
    for (size_t i = 0; i < d->n; i++) {
        const sp__jentry_t *e = &d->e[i];
        if (sp__jinja_value_dict_get(d, e->k, e->kn) != &e->v) {
            continue; /* a repeated JSON key: the last one counts */
        }
        sp__jv_t item = sp__jkey_value(e->k, e->kn);
        if (which == 0) {
            sp__jlist_t *pair;
            TRY(mk_list(r, line, 2, &pair));
            pair->v[0] = item;
            pair->v[1] = e->v;
            pair->n = 2;
            item = list_value(pair);
        } else if (which == 2) {
            item = e->v;
        }
        l->v[l->n++] = item;
    }
    *out = list_value(l);
    return SP_OK;
}

/* ---- strings ---------------------------------------------------------- */
static bool
is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Is the code point starting at s[i] (length *l) one of the characters of set? */
static bool
in_charset(const char *s, size_t n, size_t i, size_t *l, const sp__jv_t *set)
{
    *l = sp__jinja_value_utf8_offset(s + i, n - i, 1);
    if (set == NULL) {
        return is_ws(s[i]);
    }
    return memmem(set->u.s.p, set->u.s.n, s + i, *l) != NULL;
}

/* strip / lstrip / rstrip with Python's optional set of characters. */
static sp_status_t
str_strip(jr_t *r, uint32_t line, const sp__jv_t *v, const sp__jv_t *chars, bool left, bool right,
          sp__jv_t *out)
{
    const sp__jv_t *set = NULL;
    if (chars != NULL && given(chars) && chars->k != JV_NONE) {
        TRY(need_str(r, line, "strip", chars));
        set = chars;
    }
    const char *s = v->u.s.p;
    size_t b = 0, e = v->u.s.n, l;
    TRY(charge(r, line, e / 256));
    if (left) {
        while (b < e && in_charset(s, e, b, &l, set)) {
            b += l;
        }
    }
    if (right) {
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s[k] & 0xC0) == 0x80) {
                k--; /* back to the start of the last code point */
            }
            if (!in_charset(s, e, k, &l, set) || k + l != e) {
                break;
            }
            e = k;
        }
    }
    *out = sp__jv_str(s + b, e - b);
    return SP_OK;
}

/* ASCII case mapping; mode: 0 lower, 1 upper, 2 capitalize, 3 title (str.title), 4 filter title */
static sp_status_t
str_case(jr_t *r, uint32_t line, const sp__jv_t *v, int mode, sp__jv_t *out)
{
    TRY(charge(r, line, v->u.s.n / 256));
    char *p = str_alloc(r, line, v->u.s.n);
    if (p == NULL) {
        return r->st;
    }
    bool prev_letter = false;
    for (size_t i = 0; i < v->u.s.n; i++) {
        char c = v->u.s.p[i];
        bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (unsigned char)c >= 0x80;
        bool up;
        switch (mode) {
        case 0: up = false; break;
        case 1: up = true; break;
        case 2: up = i == 0; break;
        case 3: up = !prev_letter; break;
        default: up = i == 0 || strchr(" \t\n\r\f\v-({[<", v->u.s.p[i - 1]) != NULL; break;
        }
        if (up && c >= 'a' && c <= 'z') {
            c = (char)(c - 'a' + 'A');
        } else if (!up && c >= 'A' && c <= 'Z') {
            c = (char)(c - 'A' + 'a');
        }
        p[i] = c;
        prev_letter = letter;
    }
    *out = sp__jv_str(p, v->u.s.n);
    return SP_OK;
}

static sp_status_t
str_replace(jr_t *r, uint32_t line, const sp__jv_t *v, const sp__jv_t *old, const sp__jv_t *new_,
            int64_t count, sp__jv_t *out)
{
    TRY(need_str(r, line, "replace", old));
    TRY(need_str(r, line, "replace", new_));
    sp__jbuf_t b;
    buf_init(r, &b);
    b.limit = r->o.max_memory_bytes;
    const char *s = v->u.s.p;
    size_t n = v->u.s.n, i = 0;
    int64_t done = 0;
    sp_status_t st = SP_OK;
    while (i <= n && st == SP_OK && (count < 0 || done < count)) {
        const char *hit;
        if (old->u.s.n == 0) {
            /* Python inserts `new` between every character and at both ends. */
            st = sp__jinja_value_buf_put(&b, new_->u.s.p, new_->u.s.n);
            if (i == n) {
                i = n + 1;
                done++;
                break;
            }
            size_t l = sp__jinja_value_utf8_offset(s + i, n - i, 1);
            if (st == SP_OK) {
                st = sp__jinja_value_buf_put(&b, s + i, l);
            }
            i += l;
            done++;
            continue;
        }
        hit = memmem(s + i, n - i, old->u.s.p, old->u.s.n);
        if (hit == NULL) {
            break;
        }
        st = sp__jinja_value_buf_put(&b, s + i, (size_t)(hit - (s + i)));
        if (st == SP_OK) {
            st = sp__jinja_value_buf_put(&b, new_->u.s.p, new_->u.s.n);
        }
        i = (size_t)(hit - s) + old->u.s.n;
        done++;
        if (st == SP_OK) {
            st = charge(r, line, 1);
        }
    }
    if (st == SP_OK && i < n) {
        st = sp__jinja_value_buf_put(&b, s + i, n - i);
    }
    if (st != SP_OK) {
        return r->st != SP_OK ? r->st : wfail(r, line, st);
    }
    TRY(charge(r, line, b.n / 256));
    *out = buf_value(&b);
    return SP_OK;
}

static sp_status_t
str_split(jr_t *r, uint32_t line, const sp__jv_t *v, const sp__jv_t *sep, const sp__jv_t *maxv,
          sp__jv_t *out)
{
    int64_t max = -1;
    if (given(maxv)) {
        TRY(need_int(r, line, "split", maxv, &max));
    }
    sp__jlist_t *l;
    TRY(mk_list(r, line, 0, &l));
    const char *s = v->u.s.p;
    size_t n = v->u.s.n, i = 0;
    TRY(charge(r, line, n / 256));
    if (!given(sep) || sep->k == JV_NONE) {
        /* Runs of whitespace; no empty strings. */
        for (;;) {
            while (i < n && is_ws(s[i])) {
                i++;
            }
            if (i >= n) {
                break;
            }
            size_t b = i;
            if (max >= 0 && (int64_t)l->n >= max) {
                size_t e = n;
                while (e > b && is_ws(s[e - 1])) {
                    e--;
                }
                TRY(push(r, line, l, sp__jv_str(s + b, e - b)));
                break;
            }
            while (i < n && !is_ws(s[i])) {
                i++;
            }
            TRY(push(r, line, l, sp__jv_str(s + b, i - b)));
        }
        *out = list_value(l);
        return SP_OK;
    }
    TRY(need_str(r, line, "split", sep));
    if (sep->u.s.n == 0) {
        return rfail(r, line, SP_ERR_INVALID, "split: empty separator");
    }
    for (;;) {
        const char *hit = (max >= 0 && (int64_t)l->n >= max)
                              ? NULL
                              : memmem(s + i, n - i, sep->u.s.p, sep->u.s.n);
        if (hit == NULL) {
            TRY(push(r, line, l, sp__jv_str(s + i, n - i)));
            break;
        }
        TRY(push(r, line, l, sp__jv_str(s + i, (size_t)(hit - (s + i)))));
        i = (size_t)(hit - s) + sep->u.s.n;
    }
    TRY(charge(r, line, l->n / 16));
    *out = list_value(l);
    return SP_OK;
}

static bool
has_affix(const sp__jv_t *s, const sp__jv_t *a, bool prefix)
{
    if (a->u.s.n > s->u.s.n) {
        return false;
    }
    const char *p = prefix ? s->u.s.p : s->u.s.p + s->u.s.n - a->u.s.n;
    return a->u.s.n == 0 || memcmp(p, a->u.s.p, a->u.s.n) == 0;
}

static sp_status_t
str_affix(jr_t *r, uint32_t line, const sp__jv_t *v, const sp__jv_t *a, bool prefix, sp__jv_t *out)
{
    bool hit = false;
    if (a->k == JV_LIST) {
        for (size_t i = 0; i < a->u.l->n && !hit; i++) {
            TRY(need_str(r, line, prefix ? "startswith" : "endswith", &a->u.l->v[i]));
            hit = has_affix(v, &a->u.l->v[i], prefix);
        }
    } else {
        TRY(need_str(r, line, prefix ? "startswith" : "endswith", a));
        hit = has_affix(v, a, prefix);
    }
    *out = sp__jv_bool(hit);
    return SP_OK;
}

/* str(item) of every element joined by sep; attribute picks a field first. */
static sp_status_t
join_list(jr_t *r, uint32_t line, const sp__jlist_t *l, const char *sep, size_t sep_n,
          const sp__jv_t *attr, sp__jv_t *out)
{
    sp__jbuf_t b;
    buf_init(r, &b);
    b.limit = r->o.max_memory_bytes;
    TRY(charge(r, line, l->n / 16));
    for (size_t i = 0; i < l->n; i++) {
        sp__jv_t item = l->v[i], s;
        if (attr != NULL) {
            TRY(get_item(r, line, &l->v[i], attr, &item));
        }
        TRY(to_str(r, line, &item, &s));
        sp_status_t st = i > 0 ? sp__jinja_value_buf_put(&b, sep, sep_n) : SP_OK;
        if (st == SP_OK) {
            st = sp__jinja_value_buf_put(&b, s.u.s.p, s.u.s.n);
        }
        if (st != SP_OK) {
            return wfail(r, line, st);
        }
    }
    TRY(charge(r, line, b.n / 256));
    *out = buf_value(&b);
    return SP_OK;
}

/* ---- tests ------------------------------------------------------------ */
enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_STRING, T_NUMBER, T_INTEGER, T_FLOAT, T_BOOLEAN,
    T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_TRUE, T_FALSE, T_ODD, T_EVEN,
    T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_NE, T_LT, T_LESSTHAN, T_LE, T_GT, T_GREATERTHAN, T_GE,
    T_IN, T_SAMEAS, T_LOWER, T_UPPER, T_COUNT
};

static const char *const test_names[T_COUNT] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
    "mapping", "iterable", "sequence", "callable", "true", "false", "odd", "even",
    "divisibleby", "eq", "equalto", "ne", "lt", "lessthan", "le", "gt", "greaterthan", "ge",
    "in", "sameas", "lower", "upper",
};

int
sp__jinja_eval_test_id(const char *name, size_t n)
{
    for (int i = 0; i < T_COUNT; i++) {
        if (strlen(test_names[i]) == n && memcmp(test_names[i], name, n) == 0) {
            return i;
        }
    }
    return -1;
}

static sp_status_t
apply_test(jr_t *r, uint32_t line, int id, const sp__jv_t *v, const args_t *a, bool *out)
{
    static const char *const p1[] = {"other"};
    sp__jv_t arg[1];
    const char *name = test_names[id];
    bool needs_arg = id >= T_DIVISIBLEBY && id <= T_SAMEAS;
    TRY(bind(r, line, name, p1, needs_arg ? 1 : 0, a, arg));
    if (needs_arg && !given(&arg[0])) {
        return rfail(r, line, SP_ERR_INVALID, "test '%s' needs an argument", name);
    }
    switch (id) {
    case T_DEFINED: *out = v->k != JV_UNDEF; break;
    case T_UNDEFINED: *out = v->k == JV_UNDEF; break;
    case T_NONE: *out = v->k == JV_NONE; break;
    case T_STRING: *out = v->k == JV_STR; break;
    case T_NUMBER: *out = is_num(v); break;
    case T_INTEGER: *out = v->k == JV_INT; break;
    case T_FLOAT: *out = v->k == JV_FLOAT; break;
    case T_BOOLEAN: *out = v->k == JV_BOOL; break;
    case T_MAPPING: *out = v->k == JV_DICT; break;
    case T_ITERABLE: *out = v->k == JV_LIST || v->k == JV_DICT || v->k == JV_STR; break;
    case T_SEQUENCE: *out = v->k == JV_LIST || v->k == JV_DICT || v->k == JV_STR; break;
    case T_CALLABLE: *out = v->k == JV_FUNC || v->k == JV_MACRO; break;
    case T_TRUE: *out = v->k == JV_BOOL && v->u.b; break;
    case T_FALSE: *out = v->k == JV_BOOL && !v->u.b; break;
    case T_ODD:
    case T_EVEN:
        if (v->k != JV_INT && v->k != JV_BOOL) {
            return rfail(r, line, SP_ERR_INVALID, "test '%s' needs an integer", name);
        }
        *out = (as_int(v) % 2 != 0) == (id == T_ODD);
        break;
    case T_DIVISIBLEBY: {
        int64_t x = 0, y = 1;
        TRY(need_int(r, line, name, v, &x));
        TRY(need_int(r, line, name, &arg[0], &y));
        if (y == 0) {
            return rfail(r, line, SP_ERR_INVALID, "divisibleby 0");
        }
        *out = y == -1 || x % y == 0;
        break;
    }
    case T_EQ:
    case T_EQUALTO:
    case T_NE:
        TRY(eq_checked(r, line, v, &arg[0], out));
        *out = id == T_NE ? !*out : *out;
        break;
    case T_LT:
    case T_LESSTHAN: return less(r, line, v, &arg[0], r->o.max_depth, out);
    case T_GT:
    case T_GREATERTHAN: return less(r, line, &arg[0], v, r->o.max_depth, out);
    case T_LE:
        TRY(less(r, line, &arg[0], v, r->o.max_depth, out));
        *out = !*out;
        break;
    case T_GE:
        TRY(less(r, line, v, &arg[0], r->o.max_depth, out));
        *out = !*out;
        break;
    case T_IN: return contains(r, line, v, &arg[0], out);
    case T_SAMEAS:
        /* Identity: exact for none/bools and the mutable namespace, else equality of scalars. */
        if (v->k != arg[0].k) {
            *out = false;
        } else if (v->k == JV_LIST) {
            *out = v->u.l == arg[0].u.l;
        } else if (v->k == JV_DICT || v->k == JV_NS) {
            *out = v->u.d == arg[0].u.d;
        } else {
            TRY(eq_checked(r, line, v, &arg[0], out));
        }
        break;
    case T_LOWER:
    case T_UPPER: {
        TRY(need_str(r, line, name, v));
        bool ok = true;
        for (size_t i = 0; i < v->u.s.n && ok; i++) {
            char c = v->u.s.p[i];
            ok = id == T_LOWER ? !(c >= 'A' && c <= 'Z') : !(c >= 'a' && c <= 'z');
        }
        *out = ok;
        break;
    }
    default: *out = false; break;
    }
    return SP_OK;
}

/* ---- filters ---------------------------------------------------------- */
enum {
    F_ABS, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E, F_ESCAPE, F_FIRST, F_FLOAT,
    F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN,
    F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR,
    F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_COUNT_
};

static const char *const filter_names[F_COUNT_] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
    "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr",
    "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount",
};

int
sp__jinja_eval_filter_id(const char *name, size_t n)
{
    for (int i = 0; i < F_COUNT_; i++) {
        if (strlen(filter_names[i]) == n && memcmp(filter_names[i], name, n) == 0) {
            return i;
        }
    }
    return -1;
}

static sp_status_t apply_filter(jr_t *r, uint32_t line, int id, const sp__jv_t *v,
                                const args_t *a, sp__jv_t *out);

/* select / reject / selectattr / rejectattr */
static sp_status_t
filter_select(jr_t *r, uint32_t line, int id, const sp__jv_t *v, const args_t *a, sp__jv_t *out)
{
    bool attr = id == F_SELECTATTR || id == F_REJECTATTR;
    bool keep_if = id == F_SELECT || id == F_SELECTATTR;
    const sp__jlist_t *items;
    TRY(iter_list(r, line, v, &items));
    uint32_t skip = attr ? 2 : 1; /* [attribute,] test name, then the test's arguments */
    if (a->n > 0 && a->names != NULL) {
        for (uint32_t i = 0; i < a->n; i++) {
            if (a->names[i].p != NULL) {
                return rfail(r, line, SP_ERR_INVALID, "%s takes no keyword arguments",
                             filter_names[id]);
            }
        }
    }
    if (attr && a->n < 1) {
        return rfail(r, line, SP_ERR_INVALID, "%s needs an attribute name", filter_names[id]);
    }
    int test = -1;
    if (a->n >= skip) {
        const sp__jv_t *tn = &a->v[skip - 1];
        TRY(need_str(r, line, filter_names[id], tn));
        test = sp__jinja_eval_test_id(tn->u.s.p, tn->u.s.n);
        if (test < 0) {
            return rfail(r, line, SP_ERR_INVALID, "%s: unknown test '%.*s'", filter_names[id],
                         (int)(tn->u.s.n > 40 ? 40 : tn->u.s.n), tn->u.s.p);
        }
    }
    args_t targs = {a->n > skip ? a->v + skip : NULL, NULL, a->n > skip ? a->n - skip : 0};
    sp__jlist_t *l;
    TRY(mk_list(r, line, 0, &l));
    TRY(charge(r, line, items->n));
    for (size_t i = 0; i < items->n; i++) {
        sp__jv_t x = items->v[i];
        if (attr) {
            TRY(need_str(r, line, filter_names[id], &a->v[0]));
            if (x.k == JV_UNDEF) {
                return undefined_error(r, line, &x);
            }
            TRY(get_attr(r, line, &items->v[i], a->v[0].u.s.p, a->v[0].u.s.n, &x));
        }
        bool ok;
        if (test < 0) {
            ok = truthy(&x);
        } else {
            TRY(apply_test(r, line, test, &x, &targs, &ok));
        }
        if (ok == keep_if) {
            TRY(push(r, line, l, items->v[i]));
        }
    }
    *out = list_value(l);
    return SP_OK;
}

static int
cmp_for_sort(jr_t *r, uint32_t line, const sp__jv_t *x, const sp__jv_t *y, bool *err)
{
    bool lt = false, gt = false;
    if (less(r, line, x, y, r->o.max_depth, &lt) != SP_OK ||
        less(r, line, y, x, r->o.max_depth, &gt) != SP_OK) {
        *err = true;
        return 0;
    }
    return lt ? -1 : gt ? 1 : 0;
}

/* A stable insertion-merge sort (n log n comparisons), keyed by attribute if given. */
static sp_status_t
sort_list(jr_t *r, uint32_t line, const sp__jlist_t *in, bool reverse, const sp__jv_t *attr,
          bool fold_case, sp__jv_t *out)
{
    size_t n = in->n;
    sp__jlist_t *l, *keys, *tmp, *tmpk;
    TRY(mk_list(r, line, n, &l));
    TRY(mk_list(r, line, n, &keys));
    TRY(mk_list(r, line, n, &tmp));
    TRY(mk_list(r, line, n, &tmpk));
    for (size_t i = 0; i < n; i++) {
        sp__jv_t k = in->v[i];
        if (attr != NULL) {
            TRY(get_item(r, line, &in->v[i], attr, &k));
        }
        if (fold_case && k.k == JV_STR) {
            TRY(str_case(r, line, &k, 0, &k));
        }
        l->v[i] = in->v[i];
        keys->v[i] = k;
    }
    l->n = keys->n = n;
    bool err = false;
    for (size_t width = 1; width < n && !err; width *= 2) {
        TRY(charge(r, line, n));
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                int c = cmp_for_sort(r, line, &keys->v[j], &keys->v[i], &err);
                if (err) {
                    return r->st;
                }
                bool take_right = reverse ? c > 0 : c < 0;
                size_t s = take_right ? j++ : i++;
                tmp->v[o] = l->v[s];
                tmpk->v[o++] = keys->v[s];
            }
            while (i < mid) {
                tmp->v[o] = l->v[i];
                tmpk->v[o++] = keys->v[i++];
            }
            while (j < hi) {
                tmp->v[o] = l->v[j];
                tmpk->v[o++] = keys->v[j++];
            }
        }
        sp__jlist_t *x = l;
        l = tmp;
        tmp = x;
        x = keys;
        keys = tmpk;
        tmpk = x;
        l->n = keys->n = n;
    }
    *out = list_value(l);
    return SP_OK;
}

static sp_status_t
filter_indent(jr_t *r, uint32_t line, const sp__jv_t *v, const sp__jv_t *p, sp__jv_t *out)
{
    sp__jv_t s;
    TRY(to_str(r, line, v, &s));
    sp__jv_t pad;
    if (given(&p[0]) && p[0].k == JV_STR) {
        pad = p[0];
    } else {
        int64_t w = 4;
        if (given(&p[0])) {
            TRY(need_int(r, line, "indent", &p[0], &w));
        }
        if (w < 0 || w > 256) {
            return rfail(r, line, SP_ERR_INVALID, "indent: width out of range");
        }
        char *sp = str_alloc(r, line, (size_t)w);
        if (sp == NULL) {
            return r->st;
        }
        memset(sp, ' ', (size_t)w);
        pad = sp__jv_str(sp, (size_t)w);
    }
    bool first = given(&p[1]) && truthy(&p[1]), blank = given(&p[2]) && truthy(&p[2]);
    sp__jbuf_t b;
    buf_init(r, &b);
    b.limit = r->o.max_memory_bytes;
    size_t i = 0, n = s.u.s.n;
    bool line0 = true;
    sp_status_t st = SP_OK;
    while (st == SP_OK) {
        const char *nl = memchr(s.u.s.p + i, '\n', n - i);
        size_t e = nl != NULL ? (size_t)(nl - s.u.s.p) : n;
        bool empty = e == i;
        if ((!line0 || first) && (!empty || blank)) {
            st = sp__jinja_value_buf_put(&b, pad.u.s.p, pad.u.s.n);
        }
        if (st == SP_OK) {
            st = sp__jinja_value_buf_put(&b, s.u.s.p + i, e - i + (nl != NULL));
        }
        if (nl == NULL) {
            break;
        }
        i = e + 1;
        line0 = false;
        if (st == SP_OK) {
            st = charge(r, line, 1);
        }
    }
    if (st != SP_OK) {
        return r->st != SP_OK ? r->st : wfail(r, line, st);
    }
    *out = buf_value(&b);
    return SP_OK;
}

static sp_status_t
html_escape(jr_t *r, uint32_t line, const sp__jv_t *v, sp__jv_t *out)
{
    sp__jv_t s;
    TRY(to_str(r, line, v, &s));
    sp__jbuf_t b;
    buf_init(r, &b);
    b.limit = r->o.max_memory_bytes;
    sp_status_t st = SP_OK;
    for (size_t i = 0; i < s.u.s.n && st == SP_OK; i++) {
        const char *rep = NULL;
        switch (s.u.s.p[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        default: break;
        }
        st = rep != NULL ? sp__jinja_value_buf_put(&b, rep, strlen(rep))
                         : sp__jinja_value_buf_put(&b, s.u.s.p + i, 1);
    }
    if (st != SP_OK) {
        return wfail(r, line, st);
    }
    TRY(charge(r, line, b.n / 64));
    *out = buf_value(&b);
    return SP_OK;
}

static sp_status_t
to_number(jr_t *r, uint32_t line, const sp__jv_t *v, bool want_float, const sp__jv_t *dflt,
          sp__jv_t *out)
{
    if (is_num(v)) {
        *out = want_float ? sp__jv_float(as_float(v))
                          : sp__jv_int(v->k == JV_FLOAT ? (int64_t)(isfinite(v->u.f) &&
                                                                    fabs(v->u.f) < 9.2e18
                                                                ? v->u.f : 0)
                                                        : as_int(v));
        return SP_OK;
    }
    if (v->k == JV_STR && v->u.s.n > 0 && v->u.s.n < 64) {
        char tmp[64];
        memcpy(tmp, v->u.s.p, v->u.s.n);
        tmp[v->u.s.n] = '\0';
        char *end;
        if (!want_float) {
            long long x = strtoll(tmp, &end, 10);
            while (*end != '\0' && is_ws(*end)) {
                end++;
            }
            if (*end == '\0') {
                *out = sp__jv_int(x);
                return SP_OK;
            }
        }
        double f = strtod(tmp, &end);
        while (*end != '\0' && is_ws(*end)) {
            end++;
        }
        if (*end == '\0' && end != tmp) {
            *out = want_float ? sp__jv_float(f)
                              : sp__jv_int(isfinite(f) && fabs(f) < 9.2e18 ? (int64_t)f : 0);
            return SP_OK;
        }
    }
    (void)r;
    (void)line;
    *out = given(dflt) ? *dflt : want_float ? sp__jv_float(0) : sp__jv_int(0);
    return SP_OK;
}

static sp_status_t
apply_filter(jr_t *r, uint32_t line, int id, const sp__jv_t *v, const args_t *a, sp__jv_t *out)
{
    static const char *const none[] = {NULL};
    static const char *const p_default[] = {"default_value", "boolean"};
    static const char *const p_join[] = {"d", "attribute"};
    static const char *const p_tojson[] = {"indent", "ensure_ascii", "separators", "sort_keys"};
    static const char *const p_replace[] = {"old", "new", "count"};
    static const char *const p_indent[] = {"width", "first", "blank"};
    static const char *const p_sort[] = {"reverse", "case_sensitive", "attribute"};
    static const char *const p_round[] = {"precision", "method"};
    static const char *const p_attr[] = {"attribute"};
    static const char *const p_sum[] = {"attribute", "start"};
    static const char *const p_num[] = {"default"};
    static const char *const p_trim[] = {"chars"};
    static const char *const p_dictsort[] = {"case_sensitive", "by", "reverse"};
    const char *name = filter_names[id];
    sp__jv_t p[MAX_PARAMS];

    if ((id == F_SELECT || id == F_REJECT || id == F_SELECTATTR || id == F_REJECTATTR ||
         id == F_MAP) && !truthy(v)) {
        /* Jinja2 iterates these only `if value`: none or undefined gives nothing */
        sp__jlist_t *l;
        TRY(mk_list(r, line, 0, &l));
        *out = list_value(l);
        out->lazy = 1;
        return SP_OK;
    }
    if (id == F_SELECT || id == F_REJECT || id == F_SELECTATTR || id == F_REJECTATTR) {
        TRY(filter_select(r, line, id, v, a, out));
        out->lazy = 1;
        return SP_OK;
    }
    if (id == F_MAP) {
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        sp__jlist_t *l;
        TRY(mk_list(r, line, items->n, &l));
        bool by_attr = a->n == 1 && a->names != NULL && a->names[0].p != NULL &&
                       a->names[0].n == 9 && memcmp(a->names[0].p, "attribute", 9) == 0;
        int f = -1;
        args_t rest = {NULL, NULL, 0};
        if (!by_attr) {
            if (a->n < 1) {
                return rfail(r, line, SP_ERR_INVALID, "map needs a filter name or attribute=");
            }
            TRY(need_str(r, line, "map", &a->v[0]));
            f = sp__jinja_eval_filter_id(a->v[0].u.s.p, a->v[0].u.s.n);
            if (f < 0 || f == F_MAP) {
                return rfail(r, line, SP_ERR_INVALID, "map: unknown filter '%.*s'",
                             (int)(a->v[0].u.s.n > 40 ? 40 : a->v[0].u.s.n), a->v[0].u.s.p);
            }
            rest.v = a->v + 1;
            rest.names = a->names != NULL ? a->names + 1 : NULL;
            rest.n = a->n - 1;
        }
        for (size_t i = 0; i < items->n; i++) {
            sp__jv_t x;
            if (by_attr) {
                TRY(get_item(r, line, &items->v[i], &a->v[0], &x));
            } else {
                TRY(apply_filter(r, line, f, &items->v[i], &rest, &x));
            }
            l->v[l->n++] = x;
        }
        *out = list_value(l);
        out->lazy = 1;
        return SP_OK;
    }
    if (v->k == JV_LIST && v->lazy &&
        (id == F_TOJSON || id == F_LENGTH || id == F_COUNT || id == F_LAST)) {
        return rfail(r, line, SP_ERR_INVALID, id == F_TOJSON
                     ? "Object of type generator is not JSON serializable"
                     : id == F_LAST ? "'generator' object is not reversible"
                                    : "object of type 'generator' has no len()");
    }

    switch (id) {
    case F_DEFAULT:
    case F_D:
        TRY(bind(r, line, name, p_default, 2, a, p));
        if (v->k == JV_UNDEF || (given(&p[1]) && truthy(&p[1]) && !truthy(v))) {
            *out = given(&p[0]) ? p[0] : sp__jv_str("", 0);
        } else {
            *out = *v;
        }
        return SP_OK;
    case F_JOIN: {
        TRY(bind(r, line, name, p_join, 2, a, p));
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        sp__jv_t sep = sp__jv_str("", 0);
        if (given(&p[0])) {
            TRY(to_str(r, line, &p[0], &sep));
        }
        return join_list(r, line, items, sep.u.s.p, sep.u.s.n, given(&p[1]) ? &p[1] : NULL, out);
    }
    case F_TOJSON: {
        TRY(bind(r, line, name, p_tojson, 4, a, p));
        int64_t indent = -1;
        if (given(&p[0]) && p[0].k != JV_NONE) {
            TRY(need_int(r, line, name, &p[0], &indent));
            if (indent < 0 || indent > 64) {
                return rfail(r, line, SP_ERR_INVALID, "tojson: indent out of range");
            }
        }
        if (given(&p[2]) && p[2].k != JV_NONE) {
            return rfail(r, line, SP_ERR_UNSUPPORTED, "tojson: separators are not supported");
        }
        sp__jbuf_t b;
        buf_init(r, &b);
        b.limit = r->o.max_memory_bytes;
        sp_status_t st = sp__jinja_value_tojson(&b, v, (int)indent, given(&p[3]) && truthy(&p[3]),
                                       r->o.max_depth);
        if (st == SP_ERR_INVALID) {
            if (v->k == JV_UNDEF) {
                return undefined_error(r, line, v);
            }
            return rfail(r, line, SP_ERR_INVALID, "tojson: a value is not JSON serializable");
        }
        if (st != SP_OK) {
            return wfail(r, line, st);
        }
        TRY(charge(r, line, b.n / 64));
        *out = buf_value(&b);
        return SP_OK;
    }
    case F_REPLACE: {
        TRY(bind(r, line, name, p_replace, 3, a, p));
        sp__jv_t s;
        TRY(to_str(r, line, v, &s));
        int64_t count = -1;
        if (given(&p[2]) && p[2].k != JV_NONE) {
            TRY(need_int(r, line, name, &p[2], &count));
        }
        if (!given(&p[0]) || !given(&p[1])) {
            return rfail(r, line, SP_ERR_INVALID, "replace needs two arguments");
        }
        return str_replace(r, line, &s, &p[0], &p[1], count, out);
    }
    case F_INDENT:
        TRY(bind(r, line, name, p_indent, 3, a, p));
        return filter_indent(r, line, v, p, out);
    case F_SORT: {
        TRY(bind(r, line, name, p_sort, 3, a, p));
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        bool fold = !(given(&p[1]) && truthy(&p[1]));
        return sort_list(r, line, items, given(&p[0]) && truthy(&p[0]),
                         given(&p[2]) ? &p[2] : NULL, fold, out);
    }
    case F_DICTSORT: {
        TRY(bind(r, line, name, p_dictsort, 3, a, p));
        sp__jv_t items;
        TRY(dict_items(r, line, v, 0, &items));
        sp__jv_t key = sp__jv_int(given(&p[1]) && str_eq(&p[1], "value", 5) ? 1 : 0);
        bool fold = !(given(&p[0]) && truthy(&p[0]));
        return sort_list(r, line, items.u.l, given(&p[2]) && truthy(&p[2]), &key, fold, out);
    }
    case F_ROUND: {
        TRY(bind(r, line, name, p_round, 2, a, p));
        if (!is_num(v)) {
            return rfail(r, line, SP_ERR_INVALID, "round: expected a number");
        }
        int64_t prec = 0;
        if (given(&p[0])) {
            TRY(need_int(r, line, name, &p[0], &prec));
        }
        if (prec < -20 || prec > 20) {
            return rfail(r, line, SP_ERR_INVALID, "round: precision out of range");
        }
        double m = pow(10.0, (double)prec), x = as_float(v) * m;
        if (given(&p[1]) && str_eq(&p[1], "floor", 5)) {
            x = floor(x);
        } else if (given(&p[1]) && str_eq(&p[1], "ceil", 4)) {
            x = ceil(x);
        } else {
            x = round(x);
        }
        *out = sp__jv_float(x / m);
        return SP_OK;
    }
    case F_SUM: {
        TRY(bind(r, line, name, p_sum, 2, a, p));
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        sp__jv_t acc = given(&p[1]) ? p[1] : sp__jv_int(0);
        for (size_t i = 0; i < items->n; i++) {
            sp__jv_t x = items->v[i];
            if (given(&p[0])) {
                TRY(get_item(r, line, &items->v[i], &p[0], &x));
            }
            TRY(arith(r, line, JOP_ADD, &acc, &x, &acc));
        }
        *out = acc;
        return SP_OK;
    }
    case F_INT:
    case F_FLOAT:
        TRY(bind(r, line, name, p_num, 1, a, p));
        return to_number(r, line, v, id == F_FLOAT, &p[0], out);
    case F_TRIM:
        TRY(bind(r, line, name, p_trim, 1, a, p));
        {
            sp__jv_t s;
            TRY(to_str(r, line, v, &s));
            return str_strip(r, line, &s, &p[0], true, true, out);
        }
    case F_FIRST:
    case F_LAST:
    case F_MAX:
    case F_MIN:
    case F_UNIQUE:
        TRY(bind(r, line, name, p_attr, id == F_MAX || id == F_MIN || id == F_UNIQUE ? 1 : 0, a,
                 p));
        break;
    default:
        TRY(bind(r, line, name, none, 0, a, p));
        break;
    }

    switch (id) {
    case F_ABS:
        if (v->k == JV_FLOAT) {
            *out = sp__jv_float(fabs(v->u.f));
        } else if (v->k == JV_INT || v->k == JV_BOOL) {
            int64_t x = as_int(v);
            if (x == INT64_MIN) {
                return rfail(r, line, SP_ERR_INVALID, "integer overflow");
            }
            *out = sp__jv_int(x < 0 ? -x : x);
        } else {
            return rfail(r, line, SP_ERR_INVALID, "abs: expected a number, got '%s'", type_name(v));
        }
        return SP_OK;
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
    case F_TITLE: {
        sp__jv_t s;
        TRY(to_str(r, line, v, &s));
        return str_case(r, line, &s, id == F_LOWER ? 0 : id == F_UPPER ? 1 : id == F_CAPITALIZE ? 2 : 4,
                        out);
    }
    case F_COUNT:
    case F_LENGTH:
        switch (v->k) {
        case JV_STR:
            TRY(charge(r, line, v->u.s.n / 256));
            *out = sp__jv_int((int64_t)sp__jinja_value_utf8_count(v->u.s.p, v->u.s.n));
            return SP_OK;
        case JV_LIST: *out = sp__jv_int((int64_t)v->u.l->n); return SP_OK;
        case JV_DICT:
        case JV_NS: {
            const sp__jlist_t *keys;
            TRY(iter_list(r, line, v, &keys));
            *out = sp__jv_int((int64_t)keys->n);
            return SP_OK;
        }
        case JV_UNDEF: *out = sp__jv_int(0); return SP_OK;
        default:
            return rfail(r, line, SP_ERR_INVALID, "object of type '%s' has no length",
                         type_name(v));
        }
    case F_E:
    case F_ESCAPE:
        if (v->k == JV_STR && v->markup) { /* Markup is escaped already */
            *out = *v;
            return SP_OK;
        }
        TRY(html_escape(r, line, v, out));
        out->markup = 1;
        return SP_OK;
    case F_FIRST:
    case F_LAST: {
        const sp__jlist_t *items;
        if (v->k == JV_STR) {
            sp__jv_t idx = sp__jv_int(id == F_FIRST ? 0 : -1);
            return get_item(r, line, v, &idx, out);
        }
        TRY(iter_list(r, line, v, &items));
        *out = items->n == 0 ? sp__jv_undef("item", 4)
                             : items->v[id == F_FIRST ? 0 : items->n - 1];
        return SP_OK;
    }
    case F_ITEMS:
        return dict_items(r, line, v, 0, out);
    case F_LIST: {
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        *out = list_value((sp__jlist_t *)items);
        return SP_OK;
    }
    case F_MAX:
    case F_MIN: {
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        if (items->n == 0) {
            *out = sp__jv_undef("item", 4);
            return SP_OK;
        }
        sp__jv_t sorted;
        TRY(sort_list(r, line, items, id == F_MAX, given(&p[0]) ? &p[0] : NULL, true, &sorted));
        *out = sorted.u.l->v[0];
        return SP_OK;
    }
    case F_REVERSE: {
        if (v->k == JV_STR) {
            sp__jv_t parts[3] = {missing(), missing(), sp__jv_int(-1)};
            return do_slice(r, line, v, parts, out);
        }
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        sp__jlist_t *l;
        TRY(mk_list(r, line, items->n, &l));
        for (size_t i = items->n; i-- > 0;) {
            l->v[l->n++] = items->v[i];
        }
        *out = list_value(l);
        return SP_OK;
    }
    case F_SAFE:
        TRY(to_str(r, line, v, out));
        out->markup = 1;
        return SP_OK;
    case F_STRING:
        return to_str(r, line, v, out);
    case F_UNIQUE: {
        const sp__jlist_t *items;
        TRY(iter_list(r, line, v, &items));
        sp__jlist_t *l;
        TRY(mk_list(r, line, 0, &l));
        TRY(charge(r, line, items->n * (items->n / 16 + 1)));
        for (size_t i = 0; i < items->n; i++) {
            bool seen = false;
            for (size_t j = 0; j < l->n && !seen; j++) {
                TRY(eq_checked(r, line, &items->v[i], &l->v[j], &seen));
            }
            if (!seen) {
                TRY(push(r, line, l, items->v[i]));
            }
        }
        *out = list_value(l);
        return SP_OK;
    }
    case F_WORDCOUNT: {
        sp__jv_t s;
        TRY(to_str(r, line, v, &s));
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            bool w = !is_ws(s.u.s.p[i]);
            words += w && !in;
            in = w;
        }
        *out = sp__jv_int(words);
        return SP_OK;
    }
    default:
        return rfail(r, line, SP_ERR_INVALID, "filter '%s' is not implemented", name);
    }
}

/* ---- methods ---------------------------------------------------------- */
/* Python's str.format with positional fields only: "{}" (the next argument),
 * "{N}", and "{{" / "}}" for braces; each argument as str() writes it.
 * Names, attributes and format specs inside a field are refused. */
static sp_status_t
str_format(jr_t *r, uint32_t line, const sp__jv_t *fmt, const args_t *a, sp__jv_t *out)
{
    for (uint32_t i = 0; i < a->n; i++) {
        if (a->names != NULL && a->names[i].p != NULL) {
            return rfail(r, line, SP_ERR_UNSUPPORTED, "format(): keyword fields are not supported");
        }
    }
    const char *f = fmt->u.s.p;
    size_t n = fmt->u.s.n, next = 0;
    sp__jbuf_t b;
    buf_init(r, &b);
    sp_status_t st = SP_OK;
    for (size_t i = 0; i < n && st == SP_OK;) {
        if ((f[i] == '{' || f[i] == '}') && i + 1 < n && f[i + 1] == f[i]) {
            st = sp__jinja_value_buf_put(&b, f + i, 1);
            i += 2;
            continue;
        }
        if (f[i] == '}') {
            return rfail(r, line, SP_ERR_INVALID, "format(): single '}' in the format string");
        }
        if (f[i] != '{') {
            size_t j = i;
            while (j < n && f[j] != '{' && f[j] != '}') {
                j++;
            }
            st = sp__jinja_value_buf_put(&b, f + i, j - i);
            i = j;
            continue;
        }
        size_t j = i + 1, idx = 0;
        bool digits = false;
        while (j < n && f[j] >= '0' && f[j] <= '9' && idx < 1000) {
            idx = idx * 10 + (size_t)(f[j++] - '0');
            digits = true;
        }
        if (j >= n || f[j] != '}') {
            return rfail(r, line, SP_ERR_UNSUPPORTED,
                         "format(): only {} and {N} fields are supported");
        }
        if (!digits) {
            idx = next++;
        }
        if (idx >= a->n) {
            return rfail(r, line, SP_ERR_INVALID, "format(): replacement index %zu out of range",
                         idx);
        }
        sp__jv_t v;
        TRY(to_str(r, line, &a->v[idx], &v));
        st = sp__jinja_value_buf_put(&b, v.u.s.p, v.u.s.n);
        i = j + 1;
    }
    if (st != SP_OK) {
        return wfail(r, line, st);
    }
    *out = buf_value(&b);
    return charge(r, line, b.n / 256);
}

/* obj.name(args) for a string, dict or loop. *found is false when obj has no such method. */
static sp_status_t
call_method(jr_t *r, uint32_t line, const sp__jv_t *obj, const char *name, size_t n,
            const args_t *a, sp__jv_t *out, bool *found)
{
    static const char *const p_chars[] = {"chars"};
    static const char *const p_split[] = {"sep", "maxsplit"};
    static const char *const p_affix[] = {"prefix"};
    static const char *const p_replace[] = {"old", "new", "count"};
    static const char *const p_sub[] = {"sub"};
    static const char *const p_join[] = {"iterable"};
    static const char *const p_get[] = {"key", "default"};
    sp__jv_t p[MAX_PARAMS];
    char mname[32];
    snprintf(mname, sizeof mname, "%.*s()", (int)(n > 20 ? 20 : n), name);
#define IS(w) (n == sizeof(w) - 1 && memcmp(name, w, n) == 0)
    *found = true;
    if (obj->k == JV_STR) {
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            TRY(bind(r, line, mname, p_chars, 1, a, p));
            return str_strip(r, line, obj, &p[0], !IS("rstrip"), !IS("lstrip"), out);
        }
        if (IS("format")) {
            return str_format(r, line, obj, a, out);
        }
        if (IS("split")) {
            TRY(bind(r, line, mname, p_split, 2, a, p));
            return str_split(r, line, obj, &p[0], &p[1], out);
        }
        if (IS("startswith") || IS("endswith")) {
            TRY(bind(r, line, mname, p_affix, 1, a, p));
            if (!given(&p[0])) {
                return rfail(r, line, SP_ERR_INVALID, "%s needs an argument", mname);
            }
            return str_affix(r, line, obj, &p[0], IS("startswith"), out);
        }
        if (IS("upper") || IS("lower") || IS("title") || IS("capitalize")) {
            TRY(bind(r, line, mname, p_chars, 0, a, p));
            return str_case(r, line, obj, IS("lower") ? 0 : IS("upper") ? 1 : IS("capitalize") ? 2 : 3,
                            out);
        }
        if (IS("replace")) {
            TRY(bind(r, line, mname, p_replace, 3, a, p));
            int64_t count = -1;
            if (given(&p[2])) {
                TRY(need_int(r, line, mname, &p[2], &count));
            }
            if (!given(&p[0]) || !given(&p[1])) {
                return rfail(r, line, SP_ERR_INVALID, "replace() needs two arguments");
            }
            return str_replace(r, line, obj, &p[0], &p[1], count, out);
        }
        if (IS("find") || IS("count")) {
            TRY(bind(r, line, mname, p_sub, 1, a, p));
            TRY(need_str(r, line, mname, &p[0]));
            TRY(charge(r, line, obj->u.s.n / 256));
            const char *s = obj->u.s.p;
            size_t len = obj->u.s.n;
            if (IS("find")) {
                const char *hit = memmem(s, len, p[0].u.s.p, p[0].u.s.n);
                *out = sp__jv_int(hit == NULL
                                      ? -1
                                      : (int64_t)sp__jinja_value_utf8_count(s, (size_t)(hit - s)));
                return SP_OK;
            }
            int64_t count = 0;
            if (p[0].u.s.n == 0) {
                count = (int64_t)sp__jinja_value_utf8_count(s, len) + 1;
            } else {
                for (size_t i = 0; i + p[0].u.s.n <= len;) {
                    const char *hit = memmem(s + i, len - i, p[0].u.s.p, p[0].u.s.n);
                    if (hit == NULL) {
                        break;
                    }
                    count++;
                    i = (size_t)(hit - s) + p[0].u.s.n;
                }
            }
            *out = sp__jv_int(count);
            return SP_OK;
        }
        if (IS("join")) {
            TRY(bind(r, line, mname, p_join, 1, a, p));
            const sp__jlist_t *items;
            TRY(iter_list(r, line, &p[0], &items));
            for (size_t i = 0; i < items->n; i++) {
                TRY(need_str(r, line, mname, &items->v[i]));
            }
            return join_list(r, line, items, obj->u.s.p, obj->u.s.n, NULL, out);
        }
        if (IS("splitlines")) {
            TRY(bind(r, line, mname, p_join, 0, a, p));
            sp__jlist_t *l;
            TRY(mk_list(r, line, 0, &l));
            const char *s = obj->u.s.p;
            size_t len = obj->u.s.n, i = 0;
            TRY(charge(r, line, len / 256));
            while (i < len) {
                size_t e = i;
                while (e < len && s[e] != '\n' && s[e] != '\r') {
                    e++;
                }
                TRY(push(r, line, l, sp__jv_str(s + i, e - i)));
                i = e < len && s[e] == '\r' && e + 1 < len && s[e + 1] == '\n' ? e + 2 : e + 1;
            }
            *out = list_value(l);
            return SP_OK;
        }
    } else if (obj->k == JV_DICT) {
        if (IS("items") || IS("keys") || IS("values")) {
            TRY(bind(r, line, mname, p_get, 0, a, p));
            return dict_items(r, line, obj, IS("items") ? 0 : IS("keys") ? 1 : 2, out);
        }
        if (IS("get")) {
            TRY(bind(r, line, mname, p_get, 2, a, p));
            TRY(need_str(r, line, mname, &p[0]));
            TRY(charge(r, line, obj->u.d->n / 16));
            const sp__jv_t *v = sp__jinja_value_dict_get(obj->u.d, p[0].u.s.p, p[0].u.s.n);
            *out = v != NULL ? *v : given(&p[1]) ? p[1] : sp__jv_none();
            return SP_OK;
        }
    } else if (obj->k == JV_LOOP) {
        if (IS("cycle")) {
            for (uint32_t i = 0; i < a->n; i++) {
                if (a->names != NULL && a->names[i].p != NULL) {
                    return rfail(r, line, SP_ERR_INVALID, "loop.cycle takes no keywords");
                }
            }
            if (a->n == 0) {
                return rfail(r, line, SP_ERR_INVALID, "loop.cycle needs arguments");
            }
            *out = a->v[obj->u.lp->index0 % a->n];
            return SP_OK;
        }
    }
#undef IS
    *found = false;
    return SP_OK;
}

/* ---- global functions ------------------------------------------------- */
static const char *const func_names[JF_COUNT] = {"range", "namespace", "raise_exception",
                                                 "strftime_now", "dict"};

static sp_status_t
call_func(jr_t *r, uint32_t line, int fn, const args_t *a, sp__jv_t *out)
{
    switch (fn) {
    case JF_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (a->n < 1 || a->n > 3) {
            return rfail(r, line, SP_ERR_INVALID, "range expects 1 to 3 arguments");
        }
        for (uint32_t i = 0; i < a->n; i++) {
            if (a->names != NULL && a->names[i].p != NULL) {
                return rfail(r, line, SP_ERR_INVALID, "range takes no keyword arguments");
            }
            TRY(need_int(r, line, "range", &a->v[i], &v[a->n == 1 ? 1 : i]));
        }
        if (v[2] == 0) {
            return rfail(r, line, SP_ERR_INVALID, "range step must not be zero");
        }
        /* Count first, and charge it, so range(10**12) fails fast instead of filling memory. */
        double count = 0;
        if ((v[2] > 0 && v[0] < v[1]) || (v[2] < 0 && v[0] > v[1])) {
            count = floor(((double)v[1] - (double)v[0] - (v[2] > 0 ? 1 : -1)) / (double)v[2]) + 1;
        }
        if (count > (double)(r->o.max_steps - (r->steps < r->o.max_steps ? r->steps : r->o.max_steps))) {
            return rfail(r, line, SP_ERR_TOO_LARGE,
                         "range of %.0f items is over the step limit of %llu", count,
                         (unsigned long long)r->o.max_steps);
        }
        TRY(charge(r, line, (uint64_t)count / 4));
        sp__jlist_t *l;
        TRY(mk_list(r, line, (size_t)count, &l));
        for (size_t i = 0; i < (size_t)count; i++) {
            l->v[l->n++] = sp__jv_int(v[0] + (int64_t)i * v[2]);
        }
        *out = list_value(l);
        return SP_OK;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        sp__jdict_t *d = sp__jinja_value_dict_new(&r->arena, a->n);
        if (d == NULL) {
            return oom(r, line);
        }
        for (uint32_t i = 0; i < a->n; i++) {
            if (a->names != NULL && a->names[i].p != NULL) {
                if (!sp__jinja_value_dict_set(&r->arena, d, a->names[i].p, a->names[i].n,
                                              a->v[i])) {
                    return oom(r, line);
                }
                continue;
            }
            if (a->v[i].k != JV_DICT && a->v[i].k != JV_NS) {
                return rfail(r, line, SP_ERR_INVALID, "%s: positional arguments must be mappings",
                             func_names[fn]);
            }
            for (size_t j = 0; j < a->v[i].u.d->n; j++) {
                const sp__jentry_t *e = &a->v[i].u.d->e[j];
                if (!sp__jinja_value_dict_set(&r->arena, d, e->k, e->kn, e->v)) {
                    return oom(r, line);
                }
            }
        }
        out->k = fn == JF_NAMESPACE ? JV_NS : JV_DICT;
        out->markup = out->lazy = 0;
        out->u.d = d;
        return SP_OK;
    }
    case JF_RAISE: {
        sp__jv_t msg = a->n > 0 ? a->v[0] : sp__jv_str("raise_exception", 15), s;
        TRY(to_str(r, line, &msg, &s));
        return rfail(r, line, SP_ERR_INVALID, "%.*s", (int)(s.u.s.n > 250 ? 250 : s.u.s.n),
                     s.u.s.p);
    }
    case JF_STRFTIME: {
        if (a->n != 1 || a->v[0].k != JV_STR || a->v[0].u.s.n > 64) {
            return rfail(r, line, SP_ERR_INVALID, "strftime_now expects one format string");
        }
        char fmt[80], buf[256];
        memcpy(fmt, a->v[0].u.s.p, a->v[0].u.s.n);
        fmt[a->v[0].u.s.n] = '\0';
        /* The format comes from the model file: only plain date conversions
         * (no locale- or implementation-defined ones, no flags or widths)
         * reach strftime, so template text never steers a format parser. */
        for (size_t i = 0; fmt[i]; i++) {
            if (fmt[i] == '%' && (fmt[i + 1] == '\0' || !strchr("aAbBdeHIjmMpSyYZ%", fmt[i + 1]))) {
                return rfail(r, line, SP_ERR_INVALID,
                             "strftime_now: only %%a %%A %%b %%B %%d %%e %%H %%I %%j %%m %%M %%p "
                             "%%S %%y %%Y %%Z %%%% are allowed");
            }
            i += fmt[i] == '%';
        }
        time_t now = r->o.now != 0 ? (time_t)r->o.now : time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        char *p = str_alloc(r, line, n);
        if (p == NULL) {
            return r->st;
        }
        memcpy(p, buf, n);
        *out = sp__jv_str(p, n);
        return SP_OK;
    }
    default:
        return rfail(r, line, SP_ERR_INVALID, "unknown function");
    }
}

/* ---- expressions ------------------------------------------------------ */
static sp_status_t eval(jr_t *r, const sp__jnode_t *n, sp__jv_t *out);
static sp_status_t exec_body(jr_t *r, const sp__jnode_t *n);

static sp_status_t
lookup(jr_t *r, const char *name, size_t n, sp__jv_t *out)
{
    for (frame_t *f = r->scope; f != NULL; f = f->parent) {
        const sp__jv_t *v = sp__jinja_value_dict_get(f->vars, name, n);
        if (v != NULL) {
            *out = *v;
            return SP_OK;
        }
    }
    const sp__jv_t *v = sp__jinja_value_dict_get(r->ctx, name, n);
    if (v != NULL) {
        *out = *v;
        return SP_OK;
    }
    for (int i = 0; i < JF_COUNT; i++) {
        if (strlen(func_names[i]) == n && memcmp(func_names[i], name, n) == 0) {
            out->k = JV_FUNC;
            out->markup = out->lazy = 0;
            out->u.fn = i;
            return SP_OK;
        }
    }
    *out = sp__jv_undef(name, n);
    return SP_OK;
}

static sp_status_t
assign(jr_t *r, uint32_t line, const char *name, size_t n, sp__jv_t v)
{
    return sp__jinja_value_dict_set(&r->arena, r->scope->vars, name, n, v) ? SP_OK : oom(r, line);
}

/* Evaluate call arguments into an arena array. */
static sp_status_t
eval_args(jr_t *r, const sp__jnode_t *n, args_t *a)
{
    a->n = n->n;
    a->names = n->names;
    a->v = NULL;
    if (n->n == 0) {
        return SP_OK;
    }
    sp__jv_t *v = sp__jinja_value_arena_alloc(&r->arena, n->n * sizeof *v);
    if (v == NULL) {
        return oom(r, n->line);
    }
    for (uint32_t i = 0; i < n->n; i++) {
        TRY(eval(r, n->args[i], &v[i]));
    }
    a->v = v;
    return SP_OK;
}

static sp_status_t
frame_push(jr_t *r, uint32_t line, frame_t *parent, frame_t **out)
{
    frame_t *f = sp__jinja_value_arena_alloc(&r->arena, sizeof *f);
    if (f == NULL || (f->vars = sp__jinja_value_dict_new(&r->arena, 0)) == NULL) {
        return oom(r, line);
    }
    f->parent = parent;
    *out = f;
    return SP_OK;
}

static sp_status_t
call_macro(jr_t *r, uint32_t line, const sp__jnode_t *m, const args_t *a, sp__jv_t *out)
{
    frame_t *f = NULL, *saved_scope = r->scope;
    TRY(frame_push(r, line, r->root, &f));
    uint32_t pos = 0;
    bool *set = sp__jinja_value_arena_alloc(&r->arena, m->n + 1);
    if (set == NULL) {
        return oom(r, line);
    }
    memset(set, 0, m->n + 1);
    for (uint32_t i = 0; i < a->n; i++) {
        uint32_t k;
        if (a->names == NULL || a->names[i].p == NULL) {
            k = pos++;
            if (k >= m->n) {
                return rfail(r, line, SP_ERR_INVALID, "macro '%.*s' takes %u arguments",
                             (int)m->lit.u.s.n, m->lit.u.s.p, (unsigned)m->n);
            }
        } else {
            for (k = 0; k < m->n; k++) {
                if (m->names[k].n == a->names[i].n &&
                    memcmp(m->names[k].p, a->names[i].p, a->names[i].n) == 0) {
                    break;
                }
            }
            if (k == m->n) {
                return rfail(r, line, SP_ERR_INVALID, "macro '%.*s' has no argument '%.*s'",
                             (int)m->lit.u.s.n, m->lit.u.s.p, (int)a->names[i].n, a->names[i].p);
            }
        }
        if (!sp__jinja_value_dict_set(&r->arena, f->vars, m->names[k].p, m->names[k].n, a->v[i])) {
            return oom(r, line);
        }
        set[k] = true;
    }
    r->scope = f;
    for (uint32_t k = 0; k < m->n; k++) {
        if (set[k]) {
            continue;
        }
        sp__jv_t v = sp__jv_undef(m->names[k].p, m->names[k].n);
        if (m->args[k] != NULL) {
            sp_status_t st = eval(r, m->args[k], &v);
            if (st != SP_OK) {
                r->scope = saved_scope;
                return st;
            }
        }
        if (!sp__jinja_value_dict_set(&r->arena, f->vars, m->names[k].p, m->names[k].n, v)) {
            r->scope = saved_scope;
            return oom(r, line);
        }
    }
    sp__jbuf_t buf, *saved_out = r->out;
    buf_init(r, &buf);
    r->out = &buf;
    sp_status_t st = exec_body(r, m->body);
    r->out = saved_out;
    r->scope = saved_scope;
    r->ctl = CTL_NONE;
    if (st != SP_OK) {
        return st;
    }
    *out = buf_value(&buf);
    return SP_OK;
}

static sp_status_t
eval_call(jr_t *r, const sp__jnode_t *n, sp__jv_t *out)
{
    sp__jv_t callee;
    args_t a;
    if (n->a->kind == JN_ATTR) {
        sp__jv_t obj;
        TRY(eval(r, n->a->a, &obj));
        if (obj.k == JV_STR || obj.k == JV_DICT || obj.k == JV_LOOP) {
            bool found;
            TRY(eval_args(r, n, &a));
            TRY(call_method(r, n->line, &obj, n->a->lit.u.s.p, n->a->lit.u.s.n, &a, out, &found));
            if (found) {
                return SP_OK;
            }
        }
        TRY(get_attr(r, n->line, &obj, n->a->lit.u.s.p, n->a->lit.u.s.n, &callee));
        if (callee.k == JV_UNDEF) {
            return rfail(r, n->line, SP_ERR_INVALID, "'%s' object has no method '%.*s'",
                         type_name(&obj), (int)(n->a->lit.u.s.n > 40 ? 40 : n->a->lit.u.s.n),
                         n->a->lit.u.s.p);
        }
    } else {
        TRY(eval(r, n->a, &callee));
    }
    if (callee.k == JV_FUNC) {
        TRY(eval_args(r, n, &a));
        return call_func(r, n->line, callee.u.fn, &a, out);
    }
    if (callee.k == JV_MACRO) {
        TRY(eval_args(r, n, &a));
        return call_macro(r, n->line, callee.u.m, &a, out);
    }
    if (callee.k == JV_UNDEF) {
        return undefined_error(r, n->line, &callee);
    }
    return rfail(r, n->line, SP_ERR_INVALID, "'%s' object is not callable", type_name(&callee));
}

static sp_status_t
eval_inner(jr_t *r, const sp__jnode_t *n, sp__jv_t *out)
{
    sp__jv_t a, b;
    bool t;
    switch (n->kind) {
    case JN_LIT:
        *out = n->lit;
        return SP_OK;
    case JN_NAME:
        return lookup(r, n->lit.u.s.p, n->lit.u.s.n, out);
    case JN_ATTR:
        TRY(eval(r, n->a, &a));
        return get_attr(r, n->line, &a, n->lit.u.s.p, n->lit.u.s.n, out);
    case JN_ITEM:
        TRY(eval(r, n->a, &a));
        TRY(eval(r, n->b, &b));
        return get_item(r, n->line, &a, &b, out);
    case JN_SLICE: {
        sp__jv_t parts[3];
        TRY(eval(r, n->a, &a));
        for (int k = 0; k < 3; k++) {
            parts[k] = missing();
            if (n->args[k] != NULL) {
                TRY(eval(r, n->args[k], &parts[k]));
            }
        }
        return do_slice(r, n->line, &a, parts, out);
    }
    case JN_CALL:
        return eval_call(r, n, out);
    case JN_FILTER: {
        args_t args;
        if (n->op == SP__JINJA_FILTER_UNKNOWN) {
            return rfail(r, n->line, SP_ERR_INVALID, "no filter named '%.*s'",
                         (int)(n->lit.u.s.n > 40 ? 40 : n->lit.u.s.n), n->lit.u.s.p);
        }
        TRY(eval(r, n->a, &a));
        TRY(eval_args(r, n, &args));
        return apply_filter(r, n->line, n->op, &a, &args, out);
    }
    case JN_TEST: {
        args_t args;
        TRY(eval(r, n->a, &a));
        TRY(eval_args(r, n, &args));
        TRY(apply_test(r, n->line, n->op, &a, &args, &t));
        *out = sp__jv_bool(t != (n->flag != 0));
        return SP_OK;
    }
    case JN_UNARY:
        TRY(eval(r, n->a, &a));
        if (a.k == JV_UNDEF) {
            return undefined_error(r, n->line, &a);
        }
        if (!is_num(&a)) {
            return rfail(r, n->line, SP_ERR_INVALID, "bad operand type for unary %c: '%s'", n->op,
                         type_name(&a));
        }
        if (n->op == '+') {
            *out = a.k == JV_BOOL ? sp__jv_int(as_int(&a)) : a;
        } else if (a.k == JV_FLOAT) {
            *out = sp__jv_float(-a.u.f);
        } else if (as_int(&a) == INT64_MIN) {
            return rfail(r, n->line, SP_ERR_INVALID, "integer overflow");
        } else {
            *out = sp__jv_int(-as_int(&a));
        }
        return SP_OK;
    case JN_NOT:
        TRY(eval(r, n->a, &a));
        *out = sp__jv_bool(!truthy(&a));
        return SP_OK;
    case JN_AND:
    case JN_OR:
        /* Python returns the deciding operand, not a bool. */
        TRY(eval(r, n->a, &a));
        if (truthy(&a) == (n->kind == JN_OR)) {
            *out = a;
            return SP_OK;
        }
        return eval(r, n->b, out);
    case JN_COND:
        TRY(eval(r, n->a, &a));
        if (truthy(&a)) {
            return eval(r, n->b, out);
        }
        if (n->c != NULL) {
            return eval(r, n->c, out);
        }
        *out = sp__jv_undef("", 0);
        return SP_OK;
    case JN_BIN:
        TRY(eval(r, n->a, &a));
        TRY(eval(r, n->b, &b));
        switch (n->op) {
        case JOP_EQ:
        case JOP_NE:
            TRY(eq_checked(r, n->line, &a, &b, &t));
            *out = sp__jv_bool(t == (n->op == JOP_EQ));
            return SP_OK;
        case JOP_LT:
            TRY(less(r, n->line, &a, &b, r->o.max_depth, &t));
            *out = sp__jv_bool(t);
            return SP_OK;
        case JOP_GT:
            TRY(less(r, n->line, &b, &a, r->o.max_depth, &t));
            *out = sp__jv_bool(t);
            return SP_OK;
        case JOP_LE:
            TRY(less(r, n->line, &b, &a, r->o.max_depth, &t));
            *out = sp__jv_bool(!t);
            return SP_OK;
        case JOP_GE:
            TRY(less(r, n->line, &a, &b, r->o.max_depth, &t));
            *out = sp__jv_bool(!t);
            return SP_OK;
        case JOP_IN:
        case JOP_NOTIN:
            TRY(contains(r, n->line, &a, &b, &t));
            *out = sp__jv_bool(t == (n->op == JOP_IN));
            return SP_OK;
        default:
            return arith(r, n->line, n->op, &a, &b, out);
        }
    case JN_LIST: {
        sp__jlist_t *l;
        TRY(mk_list(r, n->line, n->n, &l));
        for (uint32_t i = 0; i < n->n; i++) {
            TRY(eval(r, n->args[i], &l->v[i]));
            l->n++;
        }
        *out = list_value(l);
        return SP_OK;
    }
    case JN_DICT: {
        sp__jdict_t *d = sp__jinja_value_dict_new(&r->arena, n->n / 2);
        if (d == NULL) {
            return oom(r, n->line);
        }
        for (uint32_t i = 0; i + 1 < n->n; i += 2) {
            TRY(eval(r, n->args[i], &a));
            TRY(eval(r, n->args[i + 1], &b));
            if (a.k == JV_INT) { /* kept as an int: see SP__JKEY_INT_BYTES */
                char *k = sp__jinja_value_arena_alloc(&r->arena, SP__JKEY_INT_BYTES);
                if (k == NULL) {
                    return oom(r, n->line);
                }
                sp__jkey_put_int(k, a.u.i);
                a = sp__jv_str(k, SP__JKEY_INT_BYTES);
            } else if (a.k != JV_STR) {
                return rfail(r, n->line, SP_ERR_UNSUPPORTED,
                             "dict keys must be strings or integers here");
            }
            if (!sp__jinja_value_dict_set(&r->arena, d, a.u.s.p, a.u.s.n, b)) {
                return oom(r, n->line);
            }
        }
        out->k = JV_DICT;
        out->markup = out->lazy = 0;
        out->u.d = d;
        return SP_OK;
    }
    default:
        return rfail(r, n->line, SP_ERR_INVALID, "not an expression");
    }
}

static sp_status_t
eval(jr_t *r, const sp__jnode_t *n, sp__jv_t *out)
{
    if (++r->depth > r->o.max_depth) {
        return rfail(r, n->line, SP_ERR_TOO_LARGE, "recursion deeper than %d", r->o.max_depth);
    }
    sp_status_t st = charge(r, n->line, 1);
    if (st == SP_OK) {
        st = eval_inner(r, n, out);
    }
    r->depth--;
    return st;
}

/* ---- statements ------------------------------------------------------- */
static sp_status_t
write_value(jr_t *r, uint32_t line, const sp__jv_t *v)
{
    size_t before = r->out->n;
    sp_status_t st = sp__jinja_value_write(r->out, v, false, r->o.max_depth);
    if (st != SP_OK) {
        return wfail(r, line, st);
    }
    return charge(r, line, (r->out->n - before) / 256);
}

static sp_status_t
bind_targets(jr_t *r, uint32_t line, const sp__jname_t *names, uint32_t n, const sp__jv_t *v)
{
    if (n == 1) {
        return assign(r, line, names[0].p, names[0].n, *v);
    }
    if (v->k != JV_LIST || v->u.l->n != n) {
        return rfail(r, line, SP_ERR_INVALID, "cannot unpack '%s' into %u names", type_name(v),
                     (unsigned)n);
    }
    for (uint32_t i = 0; i < n; i++) {
        TRY(assign(r, line, names[i].p, names[i].n, v->u.l->v[i]));
    }
    return SP_OK;
}

static sp_status_t
exec_for(jr_t *r, const sp__jnode_t *n)
{
    sp__jv_t seq;
    const sp__jlist_t *items;
    TRY(eval(r, n->a, &seq));
    TRY(iter_list(r, n->line, &seq, &items));
    frame_t *f = NULL, *saved = r->scope;
    TRY(frame_push(r, n->line, saved, &f));
    r->scope = f;
    sp_status_t st = SP_OK;
    if (n->b != NULL) {
        /* `for x in xs if cond`: filter first, so loop.index and loop.last count kept items. */
        sp__jlist_t *kept;
        st = mk_list(r, n->line, 0, &kept);
        for (size_t i = 0; st == SP_OK && i < items->n; i++) {
            sp__jv_t c;
            st = bind_targets(r, n->line, n->names, n->n, &items->v[i]);
            if (st == SP_OK) {
                st = eval(r, n->b, &c);
            }
            if (st == SP_OK && truthy(&c)) {
                st = push(r, n->line, kept, items->v[i]);
            }
        }
        items = kept;
    }
    sp__jloop_t *lp = sp__jinja_value_arena_alloc(&r->arena, sizeof *lp);
    if (st == SP_OK && lp == NULL) {
        st = oom(r, n->line);
    }
    if (st == SP_OK) {
        lp->items = items;
        lp->index0 = 0;
        sp__jv_t lv = {0};
        lv.k = JV_LOOP;
        lv.u.lp = lp;
        st = assign(r, n->line, "loop", 4, lv);
    }
    for (size_t i = 0; st == SP_OK && i < items->n; i++) {
        lp->index0 = i;
        st = charge(r, n->line, 1);
        if (st == SP_OK) {
            st = bind_targets(r, n->line, n->names, n->n, &items->v[i]);
        }
        if (st == SP_OK) {
            st = exec_body(r, n->body);
        }
        if (r->ctl == CTL_BREAK) {
            r->ctl = CTL_NONE;
            break;
        }
        r->ctl = CTL_NONE;
    }
    r->scope = saved;
    if (st == SP_OK && items->n == 0 && n->alt != NULL) {
        st = exec_body(r, n->alt);
    }
    return st;
}

static sp_status_t
exec_stmt(jr_t *r, const sp__jnode_t *n)
{
    sp__jv_t v = {0};
    switch (n->kind) {
    case JN_TEXT: {
        sp_status_t st = sp__jinja_value_buf_put(r->out, n->lit.u.s.p, n->lit.u.s.n);
        if (st != SP_OK) {
            return wfail(r, n->line, st);
        }
        return charge(r, n->line, n->lit.u.s.n / 256);
    }
    case JN_OUTPUT:
        TRY(eval(r, n->a, &v));
        return write_value(r, n->line, &v);
    case JN_IF:
        TRY(eval(r, n->a, &v));
        if (truthy(&v)) {
            return exec_body(r, n->body);
        }
        return n->alt != NULL ? exec_body(r, n->alt) : SP_OK;
    case JN_FOR:
        return exec_for(r, n);
    case JN_SET:
        TRY(eval(r, n->a, &v));
        if (n->lit.k == JV_STR) {
            sp__jv_t ns;
            TRY(lookup(r, n->names[0].p, n->names[0].n, &ns));
            if (ns.k != JV_NS) {
                return rfail(r, n->line, SP_ERR_INVALID,
                             "cannot assign attribute on non-namespace object '%.*s'",
                             (int)n->names[0].n, n->names[0].p);
            }
            return sp__jinja_value_dict_set(&r->arena, ns.u.d, n->lit.u.s.p, n->lit.u.s.n, v)
                       ? SP_OK
                       : oom(r, n->line);
        }
        return bind_targets(r, n->line, n->names, n->n, &v);
    case JN_SETBLOCK: {
        sp__jbuf_t buf, *saved = r->out;
        buf_init(r, &buf);
        r->out = &buf;
        sp_status_t st = exec_body(r, n->body);
        r->out = saved;
        TRY(st);
        return assign(r, n->line, n->names[0].p, n->names[0].n, buf_value(&buf));
    }
    case JN_MACRO:
        v.k = JV_MACRO;
        v.u.m = n;
        return assign(r, n->line, n->lit.u.s.p, n->lit.u.s.n, v);
    case JN_BREAK:
        r->ctl = CTL_BREAK;
        return SP_OK;
    case JN_CONTINUE:
        r->ctl = CTL_CONTINUE;
        return SP_OK;
    case JN_BLOCK:
        return exec_body(r, n->body);
    default:
        return rfail(r, n->line, SP_ERR_INVALID, "not a statement");
    }
}

static sp_status_t
exec_body(jr_t *r, const sp__jnode_t *n)
{
    if (n == NULL) {
        return SP_OK;
    }
    if (++r->depth > r->o.max_depth) {
        return rfail(r, n->line, SP_ERR_TOO_LARGE, "recursion deeper than %d", r->o.max_depth);
    }
    sp_status_t st = SP_OK;
    for (; n != NULL && st == SP_OK && r->ctl == CTL_NONE; n = n->next) {
        st = charge(r, n->line, 1);
        if (st == SP_OK) {
            st = exec_stmt(r, n);
        }
    }
    r->depth--;
    return st;
}

/* ---- entry (sp_jinja_render_json in jinja.c resolves the options) ------ */
sp_status_t
sp__jinja_eval_render(const sp_jinja_t *t, const char *ctx_json, size_t ctx_len,
                      const sp_jinja_opts_t *opts, char **out, size_t *out_len, char *err,
                      size_t err_len)
{
    *out = NULL;
    if (out_len != NULL) {
        *out_len = 0;
    }
    if (t == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "render: no template");
    }
    jr_t r;
    memset(&r, 0, sizeof r);
    r.o = *opts;
    if (r.o.max_depth <= 0 || r.o.max_depth > 100000 || r.o.max_memory_bytes == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "render: bad options");
    }
    r.err = err;
    r.err_len = err_len;
    sp__jinja_value_arena_init(&r.arena, r.o.max_memory_bytes);
    sp_status_t st;
    sp__jv_t ctx = {0};
    if (ctx_json == NULL || ctx_len == 0) {
        ctx.k = JV_DICT;
        ctx.u.d = sp__jinja_value_dict_new(&r.arena, 0);
        st = ctx.u.d != NULL ? SP_OK : sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    } else {
        st = sp__jinja_value_json_parse(&r.arena, ctx_json, ctx_len, &ctx, err, err_len);
        if (st == SP_OK && ctx.k != JV_DICT) {
            st = sp_errf(err, err_len, SP_ERR_INVALID, "render: the context must be a JSON object");
        }
    }
    sp__jbuf_t buf;
    frame_t root;
    if (st == SP_OK) {
        r.ctx = ctx.u.d;
        buf_init(&r, &buf);
        r.out = &buf;
        root.parent = NULL;
        root.vars = sp__jinja_value_dict_new(&r.arena, 0);
        r.root = r.scope = &root;
        st = root.vars != NULL ? exec_body(&r, t->body) : oom(&r, 1);
    }
    if (st == SP_OK) {
        char *s = sp_malloc(buf.n + 1);
        if (s == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        } else {
            if (buf.n > 0) {
                memcpy(s, buf.p, buf.n);
            }
            s[buf.n] = '\0';
            *out = s;
            if (out_len != NULL) {
                *out_len = buf.n;
            }
        }
    }
    sp__jinja_value_arena_free(&r.arena);
    return st;
}
