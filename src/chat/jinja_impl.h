/*
 * jinja_impl.h - internals shared by jinja.c (lexer, parser), jinja_value.c
 * (arena, values, JSON, printing) and jinja_eval.c (the interpreter).
 *
 * Everything lives on arenas: the compiled template's AST on the template's
 * arena (freed at once by sp_jinja_destroy, so no recursive free of a deep
 * tree), every value of a render on the render's arena, which is capped by
 * opts.max_memory_bytes.
 */
#ifndef SP_CHAT_JINJA_IMPL_H
#define SP_CHAT_JINJA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "chat/jinja.h"

/* ---- arena ------------------------------------------------------------ */
typedef struct sp__jarena_chunk sp__jarena_chunk_t;
typedef struct sp__jarena {
    sp__jarena_chunk_t *head;
    size_t used;  /* bytes handed out (plus chunk headers) */
    size_t limit; /* 0 = none */
} sp__jarena_t;

void sp__jinja_value_arena_init(sp__jarena_t *a, size_t limit);
void sp__jinja_value_arena_free(sp__jarena_t *a);
/* 16-byte aligned, uninitialised; NULL when over the limit or out of memory
 * (sp__jinja_value_arena_over tells which). */
void *sp__jinja_value_arena_alloc(sp__jarena_t *a, size_t n);
bool sp__jinja_value_arena_over(const sp__jarena_t *a, size_t n);

/* ---- values ----------------------------------------------------------- */
typedef enum sp__jv_kind {
    JV_UNDEF,  /* u.s: the name that was not found (for messages) */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,    /* u.s: UTF-8 bytes, not NUL-terminated, immutable */
    JV_LIST,   /* u.l: immutable once built */
    JV_DICT,   /* u.d: immutable once built, insertion order */
    JV_NS,     /* u.d: namespace(), the one mutable object */
    JV_FUNC,   /* u.fn: a global built-in (range, namespace, ...) */
    JV_MACRO,  /* u.m: a {% macro %} node */
    JV_LOOP,   /* u.lp: the `loop` variable of a for */
} sp__jv_kind_t;

typedef struct sp__jlist sp__jlist_t;
typedef struct sp__jdict sp__jdict_t;
typedef struct sp__jloop sp__jloop_t;
typedef struct sp__jnode sp__jnode_t;

typedef struct sp__jv {
    uint8_t k; /* sp__jv_kind_t */
    uint8_t markup; /* JV_STR made by |safe or |escape: Jinja2's Markup, which
                       HTML-escapes a plain string added to it with + */
    uint8_t lazy;   /* JV_LIST made by map/select/reject/selectattr/rejectattr:
                       a generator in Jinja2 (always true, no len(), not JSON) */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        sp__jlist_t *l;
        sp__jdict_t *d;
        int fn;
        const sp__jnode_t *m;
        sp__jloop_t *lp;
    } u;
} sp__jv_t;

struct sp__jlist {
    size_t n, cap;
    sp__jv_t *v;
};

typedef struct sp__jentry {
    const char *k;
    size_t kn;
    sp__jv_t v;
} sp__jentry_t;

struct sp__jdict {
    size_t n, cap;
    sp__jentry_t *e;
};

/* Integer keys (a dict literal such as {0: 0, 512: 128}) are stored as a
 * 9-byte key: the byte 0xFF, which no UTF-8 text holds, then the int64's
 * bytes. One spelling per integer, so lookups stay byte comparisons. */
#define SP__JKEY_INT_BYTES 9
static inline bool
sp__jkey_is_int(const char *k, size_t kn)
{
    return kn == SP__JKEY_INT_BYTES && (unsigned char)k[0] == 0xFF;
}
static inline int64_t
sp__jkey_int(const char *k)
{
    int64_t i;
    memcpy(&i, k + 1, sizeof i);
    return i;
}
static inline void
sp__jkey_put_int(char buf[SP__JKEY_INT_BYTES], int64_t i)
{
    buf[0] = (char)0xFF;
    memcpy(buf + 1, &i, sizeof i);
}

struct sp__jloop {
    const sp__jlist_t *items; /* what is iterated, after the `if` filter */
    size_t index0;
};

/* Global functions (JV_FUNC). */
enum { JF_RANGE, JF_NAMESPACE, JF_RAISE, JF_STRFTIME, JF_DICT, JF_COUNT };

static inline sp__jv_t
sp__jv_undef(const char *name, size_t n)
{
    sp__jv_t v = {0};
    v.k = JV_UNDEF;
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}
static inline sp__jv_t
sp__jv_none(void)
{
    sp__jv_t v = {0};
    v.k = JV_NONE;
    v.u.i = 0;
    return v;
}
static inline sp__jv_t
sp__jv_bool(bool b)
{
    sp__jv_t v = {0};
    v.k = JV_BOOL;
    v.u.i = 0;
    v.u.b = b;
    return v;
}
static inline sp__jv_t
sp__jv_int(int64_t i)
{
    sp__jv_t v = {0};
    v.k = JV_INT;
    v.u.i = i;
    return v;
}
static inline sp__jv_t
sp__jv_float(double f)
{
    sp__jv_t v = {0};
    v.k = JV_FLOAT;
    v.u.f = f;
    return v;
}
static inline sp__jv_t
sp__jv_str(const char *p, size_t n)
{
    sp__jv_t v = {0};
    v.k = JV_STR;
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

/* The key of a dict entry as a value: an int for an integer key, else the string. */
static inline sp__jv_t
sp__jkey_value(const char *k, size_t kn)
{
    return sp__jkey_is_int(k, kn) ? sp__jv_int(sp__jkey_int(k)) : sp__jv_str(k, kn);
}

/* A growable byte buffer on an arena, capped at `cap` bytes (output limit). */
typedef struct sp__jbuf {
    sp__jarena_t *a;
    char *p;
    size_t n, cap_alloc, limit;
} sp__jbuf_t;

/* SP_OK, SP_ERR_TOO_LARGE (over limit or arena cap) or SP_ERR_NOMEM. */
sp_status_t sp__jinja_value_buf_put(sp__jbuf_t *b, const char *s, size_t n);

/* Lists and dicts on an arena. Pushes can fail like sp__jinja_value_arena_alloc. */
sp__jlist_t *sp__jinja_value_list_new(sp__jarena_t *a, size_t cap);
bool sp__jinja_value_list_push(sp__jarena_t *a, sp__jlist_t *l, sp__jv_t v);
sp__jdict_t *sp__jinja_value_dict_new(sp__jarena_t *a, size_t cap);
/* Replaces the value of an existing key. */
bool sp__jinja_value_dict_set(sp__jarena_t *a, sp__jdict_t *d, const char *k, size_t kn,
                              sp__jv_t v);
const sp__jv_t *sp__jinja_value_dict_get(const sp__jdict_t *d, const char *k, size_t kn);

/* JSON text -> values on the arena (depth <= 64). SP_ERR_INVALID with "json offset N: ..." */
sp_status_t sp__jinja_value_json_parse(sp__jarena_t *a, const char *s, size_t n, sp__jv_t *out,
                                       char *err, size_t err_len);
/* sp_jinja_json_check (jinja.h) for a non-NULL json. */
sp_status_t sp__jinja_value_json_check(const char *json, size_t len, char *err, size_t err_len);

/* Python-style text of a value into b: str() when repr is false, repr() when
 * true (strings quoted, as inside lists). max_depth bounds nested lists. */
sp_status_t sp__jinja_value_write(sp__jbuf_t *b, const sp__jv_t *v, bool repr, int max_depth);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys). */
sp_status_t sp__jinja_value_tojson(sp__jbuf_t *b, const sp__jv_t *v, int indent, bool sort_keys,
                                   int max_depth);
/* Number of code points of UTF-8 text (an invalid byte counts as one). */
size_t sp__jinja_value_utf8_count(const char *s, size_t n);
/* Byte offset of code point index `cp` (clamped to n). */
size_t sp__jinja_value_utf8_offset(const char *s, size_t n, size_t cp);

/* ---- AST -------------------------------------------------------------- */
typedef enum sp__jnode_kind {
    /* statements */
    JN_TEXT,     /* lit: the text */
    JN_OUTPUT,   /* a: expression */
    JN_IF,       /* a: condition, body, alt (else / elif chain) */
    JN_FOR,      /* names[n]: targets, a: iterable, b: filter or NULL, body, alt: else */
    JN_SET,      /* names[n]: targets (one for "ns.attr": lit = attr), a: value */
    JN_SETBLOCK, /* names[0]: target, body */
    JN_MACRO,    /* lit: name, names[n]: params, args[n]: defaults (NULL = none), body */
    JN_BREAK,
    JN_CONTINUE,
    JN_BLOCK,    /* body (a transparent block: generation) */
    /* expressions */
    JN_LIT,      /* lit */
    JN_NAME,     /* lit.u.s: the name */
    JN_ATTR,     /* a.lit */
    JN_ITEM,     /* a[b] */
    JN_SLICE,    /* a[args[0]:args[1]:args[2]] (NULL parts) */
    JN_CALL,     /* a(args, names: keyword names, empty = positional) */
    JN_FILTER,   /* op: filter id, a | f(args, names) */
    JN_TEST,     /* op: test id, flag: negated, a is t(args) */
    JN_UNARY,    /* op: '-', '+' */
    JN_NOT,
    JN_BIN,      /* op: JOP_* */
    JN_AND,
    JN_OR,
    JN_COND,     /* b if a else c */
    JN_LIST,     /* args */
    JN_DICT,     /* args: k0, v0, k1, v1, ... */
} sp__jnode_kind_t;

enum {
    JOP_ADD = 1, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
};

typedef struct sp__jname {
    const char *p;
    size_t n;
} sp__jname_t;

struct sp__jnode {
    uint8_t kind;
    uint8_t op;
    uint8_t flag;
    uint32_t line;
    uint32_t n;          /* entries of args / names */
    uint32_t depth;      /* height of this expression tree */
    sp__jv_t lit;
    sp__jnode_t *a, *b, *c;
    sp__jnode_t **args;
    sp__jname_t *names;
    sp__jnode_t *body, *alt; /* statement lists */
    sp__jnode_t *next;       /* next statement */
};

/* Filters and tests, resolved by name at compile time. */
int sp__jinja_eval_filter_id(const char *name, size_t n); /* -1 if unknown */
/* A JN_FILTER's op for a filter we do not have: rendering it fails (at run time). */
#define SP__JINJA_FILTER_UNKNOWN 255
int sp__jinja_eval_test_id(const char *name, size_t n);   /* -1 if unknown */
/* sp_jinja_render_json with the options resolved (opts is never NULL). */
sp_status_t sp__jinja_eval_render(const sp_jinja_t *t, const char *ctx_json, size_t ctx_len,
                                  const sp_jinja_opts_t *opts, char **out, size_t *out_len,
                                  char *err, size_t err_len);

struct sp_jinja {
    sp__jarena_t arena;
    sp__jnode_t *body;
};

#endif /* SP_CHAT_JINJA_IMPL_H */
