/*
 * schema.c - JSON Schema to GBNF (schema.h has the supported subset).
 *
 * Each schema object becomes one rule, written after the rules of its parts
 * (a part's rule name is known once it is written). The C recursion follows
 * the schema's own nesting only, capped at SP_SCHEMA_MAX_DEPTH; a $ref never
 * recurses: it names a rule "ref-N" and queues the target, which is compiled
 * once after the current schema, so a recursive schema is a recursive
 * grammar. Objects list their properties in the schema's order; optional
 * ones may be skipped, which needs one helper rule per position so that
 * commas stay right ("first present property" vs "later ones").
 */
#include "constrain/schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/regex.h"
#include "core/jfree.h"
#include "core/alloc.h"

#define MAX_REFS 1024

typedef struct str {
    char *p;
    size_t n, cap;
    bool oom;
} str_t;

static void
str_add(str_t *s, const char *t, size_t n)
{
    if (s->oom) {
        return;
    }
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->n + n + 1) {
            cap *= 2;
        }
        char *np = sp_realloc(s->p, cap);
        if (np == NULL) {
            s->oom = true;
            return;
        }
        s->p = np, s->cap = cap;
    }
    memcpy(s->p + s->n, t, n);
    s->n += n;
    s->p[s->n] = '\0';
}

static void
str_cat(str_t *s, const char *t)
{
    str_add(s, t, strlen(t));
}

__attribute__((format(printf, 2, 3))) static void
str_fmt(str_t *s, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    str_add(s, buf, k < 0 ? 0 : (size_t)k < sizeof buf ? (size_t)k : sizeof buf - 1);
}

/* A GBNF string literal of s[0..n). */
static void
str_literal(str_t *s, const char *t, size_t n)
{
    str_add(s, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            str_add(s, e, 2);
        } else if (c == '\n') {
            str_add(s, "\\n", 2);
        } else if (c < 0x20 || c == 0x7F) {
            str_fmt(s, "\\x%02X", c);
        } else {
            str_add(s, (const char *)&c, 1);
        }
    }
    str_add(s, "\"", 1);
}

enum {
    P_WS = 1, P_STRING = 2, P_NUMBER = 4, P_INTEGER = 8, P_BOOL = 16, P_NULL = 32, P_VALUE = 64,
    P_UNUMBER = 128, P_UINTEGER = 256,
};

typedef struct ref {
    char *path;   /* the JSON pointer, "#/$defs/x" */
    int id;
    bool done;
} ref_t;

struct sp_schema_gbnf {
    str_t out;
    unsigned prims;    /* P_* rules that must be appended */
    unsigned appended; /* P_* rules already in out */
    int n_rules;
    int n_nodes;
    uint64_t work;     /* property and 'required' entries visited (sp_schema_gbnf_work) */
    /* per sp_schema_gbnf_add */
    const json_t *root;
    ref_t refs[MAX_REFS];
    int n_refs;
    char *err;
    size_t err_len;
    sp_status_t st;
    int depth;
    char ptr[512];   /* the JSON pointer of the node being compiled, for messages */
};

static void
fail(sp_schema_gbnf_t *b, const char *fmt, const char *what)
{
    if (b->st == SP_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, fmt, what);
        b->st = sp_errf(b->err, b->err_len, SP_ERR_INVALID, "json_schema: %s (at %s)", msg,
                        b->ptr[0] ? b->ptr : "/");
    }
}

/* Fail with a message that already says what (and a status of its own). */
static void
fail_st(sp_schema_gbnf_t *b, sp_status_t st, const char *msg)
{
    if (b->st == SP_OK) {
        b->st = sp_errf(b->err, b->err_len, st, "json_schema: %s (at %s)", msg,
                        b->ptr[0] ? b->ptr : "/");
    }
}

/* ---- shared primitives ---------------------------------------------------- */

static const char *const prim_text[] = {
    /* P_WS */
    "ws ::= | \" \" | \"\\n\" [ ]{0,20}\n", /* a space, or a line break and indentation */
    /* P_STRING: no raw control characters, escapes of RFC 8259, no lone \\u surrogates */
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" json-u4)\n"
    "json-u4 ::= [0-9a-cA-CeEfF] json-hex{3} | [dD] [0-7] json-hex{2}\n"
    "json-hex ::= [0-9a-fA-F]\n",
    /* P_NUMBER */
    "json-number ::= \"-\"? json-unumber\n",
    /* P_INTEGER */
    "json-integer ::= \"-\"? json-uinteger\n",
    /* P_BOOL */
    "json-boolean ::= \"true\" | \"false\"\n",
    /* P_NULL */
    "json-null ::= \"null\"\n",
    /* P_VALUE: any JSON value (nesting ends because empty containers are short) */
    "json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null\n"
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value ws (\",\" ws json-string ws \":\" ws json-value ws)*)? \"}\"\n"
    "json-array ::= \"[\" ws (json-value ws (\",\" ws json-value ws)*)? \"]\"\n",
    /* P_UNUMBER: bounded digits, so a model cannot loop on them */
    "json-unumber ::= json-uinteger (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n",
    /* P_UINTEGER */
    "json-uinteger ::= \"0\" | [1-9] [0-9]{0,15}\n",
};

static void
need(sp_schema_gbnf_t *b, unsigned p)
{
    if (p & P_VALUE) {
        p |= P_WS | P_STRING | P_NUMBER | P_BOOL | P_NULL;
    }
    if (p & P_NUMBER) {
        p |= P_UNUMBER;
    }
    if (p & (P_INTEGER | P_UNUMBER)) {
        p |= P_UINTEGER;
    }
    b->prims |= p;
}

/* ---- nodes ----------------------------------------------------------------- */

static const char *const unsupported[] = {
    "if", "then", "else", "not", "prefixItems", "contains", "minContains", "maxContains",
    "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties", "unevaluatedItems", "minProperties", "maxProperties",
    "contentEncoding", "contentMediaType", "contentSchema", "$dynamicRef", "$recursiveRef",
    "additionalItems", NULL};

static int compile_node(sp_schema_gbnf_t *b, const json_t *s);

/* $ref, const, enum and anyOf/oneOf/allOf each become the whole rule of their
 * schema object, so any other keyword that constrains values beside them would
 * be dropped and the output might not validate: such a keyword is refused.
 * `type` beside const or enum is kept when every value already has that type
 * (the common {"type": "string", "enum": [...]}). */
static const char *const whole_rule[] = {"$ref", "const", "enum", "anyOf", "oneOf", "allOf", NULL};
static const char *const constraining[] = {
    "$ref", "const", "enum", "anyOf", "oneOf", "allOf", "type", "properties", "required",
    "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern", "format",
    "uniqueItems", NULL};

static bool
value_has_type(const json_t *v, const char *t)
{
    return strcmp(t, "string") == 0    ? json_is_string(v)
           : strcmp(t, "integer") == 0 ? json_is_integer(v)
           : strcmp(t, "number") == 0  ? json_is_number(v)
           : strcmp(t, "boolean") == 0 ? json_is_boolean(v)
           : strcmp(t, "null") == 0    ? json_is_null(v)
           : strcmp(t, "object") == 0  ? json_is_object(v)
           : strcmp(t, "array") == 0   ? json_is_array(v)
                                       : false;
}

/* Every const/enum value of s has one of the types its `type` names. */
static bool
values_typed(const json_t *s, const char *key)
{
    const json_t *t = json_object_get(s, "type"), *vals = json_object_get(s, key);
    size_t n = json_is_array(vals) && strcmp(key, "enum") == 0 ? json_array_size(vals) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = strcmp(key, "enum") == 0 ? json_array_get(vals, i) : vals;
        bool ok = json_is_string(t) && value_has_type(v, json_string_value(t));
        for (size_t j = 0; json_is_array(t) && j < json_array_size(t) && !ok; j++) {
            const json_t *tj = json_array_get(t, j);
            ok = json_is_string(tj) && value_has_type(v, json_string_value(tj));
        }
        if (!ok) {
            return false;
        }
    }
    return true;
}

/* Fail when s has a constraining keyword that its whole-rule keyword would drop. */
static bool
refuse_dropped(sp_schema_gbnf_t *b, const json_t *s)
{
    const char *key = NULL;
    for (int i = 0; whole_rule[i] && key == NULL; i++) {
        key = json_object_get(s, whole_rule[i]) ? whole_rule[i] : NULL;
    }
    for (int i = 0; key && constraining[i]; i++) {
        const char *k = constraining[i];
        if (strcmp(k, key) == 0 || json_object_get(s, k) == NULL ||
            (strcmp(k, "type") == 0 && (strcmp(key, "const") == 0 || strcmp(key, "enum") == 0) &&
             values_typed(s, key))) {
            continue;
        }
        char msg[96];
        snprintf(msg, sizeof msg, "'%s' beside '%s' is not supported", k, key);
        fail(b, "%s", msg);
        return true;
    }
    return false;
}

/* Compile sub-schema s found under key (for messages); returns its rule id. */
static int
compile_child(sp_schema_gbnf_t *b, const json_t *s, const char *key)
{
    size_t keep = strlen(b->ptr);
    snprintf(b->ptr + keep, sizeof b->ptr - keep, "/%s", key);
    int r = compile_node(b, s);
    b->ptr[keep] = '\0';
    return r;
}

static int
new_rule(sp_schema_gbnf_t *b)
{
    return b->n_rules++;
}

/* Emit "sN ::= body\n". */
static void
emit(sp_schema_gbnf_t *b, int id, const str_t *body)
{
    str_fmt(&b->out, "s%d ::= ", id);
    str_add(&b->out, body->p ? body->p : "", body->n);
    str_add(&b->out, "\n", 1);
}

/* The literal of a JSON value, compact, as one GBNF string literal. */
static void
value_literal(sp_schema_gbnf_t *b, str_t *body, const json_t *v)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (t == NULL) {
        fail(b, "%s", "cannot serialise an enum or const value");
        return;
    }
    str_literal(body, t, strlen(t));
    sp_jfree(t);
}

static bool
get_uint(sp_schema_gbnf_t *b, const json_t *s, const char *key, uint64_t *out, uint64_t cap)
{
    const json_t *v = json_object_get(s, key);
    if (v == NULL) {
        return false;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        fail(b, "'%s' must be a non-negative integer", key);
        return false;
    }
    if ((uint64_t)json_integer_value(v) > cap) {
        char msg[64];
        snprintf(msg, sizeof msg, "'%s' above %llu is not supported", key, (unsigned long long)cap);
        fail(b, "%s", msg);
        return false;
    }
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* "{m,n}" or "*" for the repetition of an item; n UINT64_MAX: unbounded. */
static void
repeat_suffix(str_t *body, uint64_t m, uint64_t n)
{
    if (m == 0 && n == UINT64_MAX) {
        str_cat(body, "*");
    } else if (n == UINT64_MAX) {
        str_fmt(body, "{%llu,}", (unsigned long long)m);
    } else {
        str_fmt(body, "{%llu,%llu}", (unsigned long long)m, (unsigned long long)n);
    }
}

/*
 * uniqueItems: true, enforced when the items come from a finite list (enum,
 * const, boolean, null): the array holds distinct values in the list's
 * order, each present or not (the same first/later chain as optional
 * properties). Other items are refused: distinctness of free values is not
 * a context-free property.
 */
static void
compile_unique(sp_schema_gbnf_t *b, const json_t *s, const json_t *items, str_t *body)
{
    json_t *vals = NULL;
    const json_t *t = json_object_get(items, "type");
    if (json_is_array(json_object_get(items, "enum"))) {
        vals = json_incref(json_object_get(items, "enum"));
    } else if (json_object_get(items, "const") != NULL) {
        vals = json_pack("[O]", json_object_get(items, "const"));
    } else if (json_is_string(t) && strcmp(json_string_value(t), "boolean") == 0 &&
               json_object_size(items) == 1) {
        vals = json_pack("[bb]", 0, 1);
    } else if (json_is_string(t) && strcmp(json_string_value(t), "null") == 0 &&
               json_object_size(items) == 1) {
        vals = json_pack("[n]");
    }
    size_t n = json_array_size(vals);
    if (vals == NULL || n == 0 || n > 64) {
        json_decref(vals);
        fail(b, "%s", "'uniqueItems' is enforced only for items from an enum, const, boolean or "
             "null (of at most 64 values)");
        return;
    }
    uint64_t lo = 0, hi = UINT64_MAX;
    get_uint(b, s, "minItems", &lo, SP_GRAMMAR_MAX_REPEAT);
    get_uint(b, s, "maxItems", &hi, SP_GRAMMAR_MAX_REPEAT);
    if (lo > 1 || (hi != UINT64_MAX && hi < n)) {
        json_decref(vals);
        fail(b, "%s", "'uniqueItems' with minItems above 1 or maxItems below the number of "
             "values is not supported");
        return;
    }
    /* later[i]: values i.. each after a comma or absent; first[i]: the first
     * present value among i.. (or none, unless one is needed) */
    int later = -1, first = -1;
    need(b, P_WS);
    for (size_t k = n; k-- > 0 && b->st == SP_OK;) {
        str_t x = {0};
        int nl = new_rule(b);
        str_cat(&x, "(\",\" ws ");
        value_literal(b, &x, json_array_get(vals, k));
        str_cat(&x, " ws)?");
        if (later >= 0) {
            str_fmt(&x, " s%d", later);
        }
        emit(b, nl, &x);
        x.n = 0;
        int nf = new_rule(b);
        value_literal(b, &x, json_array_get(vals, k));
        str_cat(&x, " ws");
        if (later >= 0) {
            str_fmt(&x, " s%d", later);
        }
        if (first >= 0) {
            str_fmt(&x, " | s%d", first);
        } else if (lo == 0) {
            str_cat(&x, " | \"\"");
        }
        emit(b, nf, &x);
        sp_free(x.p);
        later = nl, first = nf;
    }
    json_decref(vals);
    str_fmt(body, "\"[\" ws s%d \"]\"", first);
}

static void
compile_array(sp_schema_gbnf_t *b, const json_t *s, str_t *body)
{
    const json_t *items = json_object_get(s, "items");
    const json_t *uniq = json_object_get(s, "uniqueItems");
    if (uniq != NULL && !json_is_boolean(uniq)) {
        fail(b, "%s", "'uniqueItems' must be a boolean");
        return;
    }
    if (json_is_true(uniq)) {
        compile_unique(b, s, json_is_object(items) ? items : NULL, body);
        return;
    }
    char item[32];
    if (items == NULL || json_is_true(items)) {
        need(b, P_VALUE);
        snprintf(item, sizeof item, "json-value");
    } else if (json_is_false(items)) {
        snprintf(item, sizeof item, "%s", ""); /* only [] */
    } else {
        int r = compile_child(b, items, "items");
        snprintf(item, sizeof item, "s%d", r);
    }
    uint64_t lo = 0, hi = UINT64_MAX;
    get_uint(b, s, "minItems", &lo, SP_GRAMMAR_MAX_REPEAT);
    get_uint(b, s, "maxItems", &hi, SP_GRAMMAR_MAX_REPEAT);
    if (hi < lo) {
        fail(b, "%s", "maxItems is below minItems");
        return;
    }
    need(b, P_WS);
    if (item[0] == '\0' || hi == 0) {
        if (lo > 0) {
            fail(b, "%s", "minItems > 0 with no items allowed");
        }
        str_cat(body, "\"[\" ws \"]\"");
        return;
    }
    str_cat(body, "\"[\" ws ");
    if (lo == 0) {
        str_cat(body, "(");
    }
    str_fmt(body, "%s ws (\",\" ws %s ws)", item, item);
    repeat_suffix(body, lo > 0 ? lo - 1 : 0, hi == UINT64_MAX ? hi : hi - 1);
    if (lo == 0) {
        str_cat(body, ")?");
    }
    str_cat(body, " \"]\"");
}

static void
compile_object(sp_schema_gbnf_t *b, const json_t *s, str_t *body)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    need(b, P_WS);
    if (props != NULL && !json_is_object(props)) {
        fail(b, "%s", "'properties' must be an object");
        return;
    }
    if (req != NULL && !json_is_array(req)) {
        fail(b, "%s", "'required' must be a list of names");
        return;
    }
    /* The required names as a set (a hash table), so marking the required
     * properties is linear in the schema, not properties x required. */
    json_t *reqset = NULL;
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        b->work++;
        if (!json_is_string(r)) {
            fail(b, "%s", "'required' must be a list of names");
            json_decref(reqset);
            return;
        }
        if (json_object_get(props, json_string_value(r)) == NULL) {
            fail(b, "required property '%s' is not in 'properties'", json_string_value(r));
            json_decref(reqset);
            return;
        }
        if ((reqset == NULL && (reqset = json_object()) == NULL) ||
            json_object_set_new(reqset, json_string_value(r), json_true()) != 0) {
            b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
            json_decref(reqset);
            return;
        }
    }
    size_t n = props ? json_object_size(props) : 0;
    if (n == 0) {
        if (add == NULL || json_is_true(add)) {
            need(b, P_VALUE);
            str_cat(body, "json-object");
        } else if (json_is_false(add)) {
            str_cat(body, "\"{\" ws \"}\"");
        } else {
            int r = compile_child(b, add, "additionalProperties");
            need(b, P_STRING);
            str_fmt(body, "\"{\" ws (json-string ws \":\" ws s%d ws (\",\" ws json-string ws \":\" ws "
                    "s%d ws)*)? \"}\"", r, r);
        }
        goto out;
    }
    if (add != NULL && !json_is_boolean(add) && !json_is_object(add)) {
        fail(b, "%s", "'additionalProperties' must be a boolean or a schema");
        goto out;
    }
    /* kv[i]: "\"name\"" ws ":" ws value; then, from the last property back,
     * first[i] (properties i.. with no comma before the first present) and
     * later[i] (properties i.., each with a comma). */
    int *kv = sp_malloc(n * sizeof(int) + 1);
    bool *opt = sp_malloc(n * sizeof(bool) + 1);
    if (kv == NULL || opt == NULL) {
        sp_free(kv);
        sp_free(opt);
        b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
        goto out;
    }
    size_t i = 0;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)props, key, v) {
        if (b->st != SP_OK) {
            break;
        }
        char k[300];
        snprintf(k, sizeof k, "properties/%.200s", key);
        int vr = compile_child(b, v, k);
        kv[i] = new_rule(b);
        str_t t = {0};
        json_t *name = json_string(key);
        value_literal(b, &t, name);
        json_decref(name);
        str_fmt(&t, " ws \":\" ws s%d", vr);
        emit(b, kv[i], &t);
        sp_free(t.p);
        b->work++;
        opt[i] = reqset == NULL || json_object_get(reqset, key) == NULL;
        i++;
    }
    int later = -1, first = -1; /* rules for the suffix i+1.. */
    for (size_t k = n; k-- > 0 && b->st == SP_OK;) {
        str_t t = {0};
        /* later[k] */
        int nl = new_rule(b);
        if (opt[k]) {
            str_fmt(&t, "(\",\" ws s%d ws)?", kv[k]);
        } else {
            str_fmt(&t, "\",\" ws s%d ws", kv[k]);
        }
        if (later >= 0) {
            str_fmt(&t, " s%d", later);
        }
        emit(b, nl, &t);
        t.n = 0;
        /* first[k] */
        int nf = new_rule(b);
        str_fmt(&t, "s%d ws", kv[k]);
        if (later >= 0) {
            str_fmt(&t, " s%d", later);
        }
        if (opt[k]) {
            str_cat(&t, " | ");
            if (first >= 0) {
                str_fmt(&t, "s%d", first);
            } else {
                str_cat(&t, "\"\"");
            }
        }
        emit(b, nf, &t);
        sp_free(t.p);
        later = nl;
        first = nf;
    }
    str_fmt(body, "\"{\" ws s%d \"}\"", first);
    sp_free(kv);
    sp_free(opt);
out:
    json_decref(reqset);
}

/* ---- numbers: ranges compiled into digit patterns -------------------------- */

static bool string_format(const char *name);

/* One alternative of a decimal range: n digit positions, each a class lo..hi. */
typedef struct dalt {
    int n;
    char lo[20], hi[20];
} dalt_t;

typedef struct dset {
    dalt_t a[512];
    int n;
    bool over;
} dset_t;

static void
dset_push(dset_t *d, const dalt_t *a)
{
    if (d->n == (int)(sizeof d->a / sizeof d->a[0])) {
        d->over = true;
        return;
    }
    d->a[d->n++] = *a;
}

/* The digit strings from a to b (same length n, a <= b) as alternatives
 * after the prefix in cur: equal first digits recurse, otherwise the low
 * edge (a0 then a's tail..99), a middle block and the high edge (b0 then
 * 00..b's tail), edges merged into the block when their tails are full. */
static void
drange(dset_t *d, const char *a, const char *b, int n, dalt_t cur)
{
    if (n == 0) {
        dset_push(d, &cur);
        return;
    }
    int at = cur.n++;
    if (a[0] == b[0]) {
        cur.lo[at] = cur.hi[at] = a[0];
        drange(d, a + 1, b + 1, n - 1, cur);
        return;
    }
    bool a0 = true, b9 = true;
    for (int i = 1; i < n; i++) {
        a0 = a0 && a[i] == '0';
        b9 = b9 && b[i] == '9';
    }
    char nines[20], zeros[20];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    char mid_lo = a[0], mid_hi = b[0];
    if (!a0) {
        cur.lo[at] = cur.hi[at] = a[0];
        drange(d, a + 1, nines, n - 1, cur);
        mid_lo++;
    }
    if (!b9) {
        mid_hi--;
    }
    if (mid_lo <= mid_hi) {
        dalt_t m = cur;
        m.lo[at] = mid_lo, m.hi[at] = mid_hi;
        for (int i = 1; i < n; i++) {
            m.lo[m.n] = '0', m.hi[m.n] = '9', m.n++;
        }
        dset_push(d, &m);
    }
    if (!b9) {
        cur.lo[at] = cur.hi[at] = b[0];
        drange(d, zeros, b + 1, n - 1, cur);
    }
}

static uint64_t
pow10u(int e)
{
    uint64_t p = 1;
    while (e-- > 0) {
        p *= 10;
    }
    return p;
}

static int
ndigits(uint64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10, n++;
    }
    return n;
}

/* The integers A..B (A <= B) as digit-string alternatives, no leading zeros. */
static void
drange_all(dset_t *d, uint64_t A, uint64_t B)
{
    for (int L = ndigits(A); L <= ndigits(B); L++) {
        uint64_t lo = L == 1 ? 0 : pow10u(L - 1), hi = pow10u(L) - 1;
        lo = lo < A ? A : lo;
        hi = hi > B ? B : hi;
        if (lo > hi) {
            continue;
        }
        char a[24], bb[24];
        snprintf(a, sizeof a, "%0*llu", L, (unsigned long long)lo);
        snprintf(bb, sizeof bb, "%0*llu", L, (unsigned long long)hi);
        dalt_t cur = {0};
        drange(d, a, bb, L, cur);
    }
}

/* One digit position (or a run of free ones) of an alternative. */
static void
put_digits(str_t *body, const dalt_t *a, int from, int to)
{
    for (int i = from; i < to;) {
        if (a->lo[i] == '0' && a->hi[i] == '9') {
            int j = i;
            while (j < to && a->lo[j] == '0' && a->hi[j] == '9') {
                j++;
            }
            str_fmt(body, j - i > 1 ? " [0-9]{%d}" : " [0-9]", j - i);
            i = j;
        } else if (a->lo[i] == a->hi[i]) {
            str_fmt(body, " \"%c\"", a->lo[i]);
            i++;
        } else {
            str_fmt(body, " [%c-%c]", a->lo[i], a->hi[i]);
            i++;
        }
    }
}

/* The alternatives of d as "N" with the last k digits after a decimal
 * point ("0.0ddd" when N has no more than k digits). */
static void
put_dset(str_t *body, const dset_t *d, int k)
{
    for (int i = 0; i < d->n; i++) {
        const dalt_t *a = &d->a[i];
        str_cat(body, i ? " | (" : "(");
        if (k > 0 && a->n <= k) {
            str_cat(body, " \"0.\"");
            for (int z = a->n; z < k; z++) {
                str_cat(body, " \"0\"");
            }
            put_digits(body, a, 0, a->n);
        } else {
            put_digits(body, a, 0, a->n - k);
            if (k > 0) {
                str_cat(body, " \".\"");
                put_digits(body, a, a->n - k, a->n);
            }
        }
        str_cat(body, " )");
    }
}

enum { END_CAP, END_EXACT, END_EXCL }; /* the far end of a side: digit cap, <=, < */

/*
 * One side of zero: magnitudes from `near` to `far` (scaled by 10^k). With
 * `trail` (numbers) a magnitude may go on with fraction digits wherever that
 * stays inside: below `far` (or at it when it is only the digit cap), and at
 * `near` when that end is exclusive, with a digit that is not 0 (just past
 * the bound). Without, exactly near..far. False when the side is empty.
 */
static bool
put_side(sp_schema_gbnf_t *b, str_t *body, uint64_t near, bool near_excl, uint64_t far, int far_end,
         int k, bool trail)
{
    const char *tail = k > 0 ? " [0-9]{0,8}" : " (\".\" [0-9]{1,16})?";
    const char *past = k > 0 ? " [0-9]{0,7} [1-9]" : " \".\" [0-9]{0,15} [1-9]";
    dset_t *d = sp_calloc(1, sizeof *d);
    if (d == NULL) {
        b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
        return false;
    }
    bool any = false;
    if (!trail) {
        if (near <= far) {
            drange_all(d, near, far);
            str_cat(body, "(");
            put_dset(body, d, k);
            str_cat(body, ")");
            any = true;
        }
    } else {
        uint64_t start = near;
        if (near_excl) {
            if (near < far) {
                drange_all(d, near, near);
                str_cat(body, "((");
                put_dset(body, d, k);
                str_cat(body, ")");
                str_cat(body, past);
                str_cat(body, ")");
                any = true;
            }
            start = near + 1;
        }
        uint64_t free_hi = far_end == END_CAP ? far : far - 1; /* far >= 1 when not the cap */
        if (start <= free_hi && !(far_end != END_CAP && far == 0)) {
            d->n = 0;
            drange_all(d, start, free_hi);
            str_cat(body, any ? " | ((" : "((");
            put_dset(body, d, k);
            str_cat(body, ")");
            str_cat(body, tail);
            str_cat(body, ")");
            any = true;
        }
        if (far_end == END_EXACT && far >= start) {
            d->n = 0;
            drange_all(d, far, far);
            str_cat(body, any ? " | (" : "(");
            put_dset(body, d, k);
            str_cat(body, ")");
            any = true;
        }
    }
    bool over = d->over;
    sp_free(d);
    if (over) {
        fail(b, "%s", "a numeric range needs more than 512 digit patterns");
        return false;
    }
    return any;
}

/* Decimal places (0..6) that write v exactly; 7 when none does. */
static int
decimals_of(const json_t *v)
{
    if (json_is_integer(v)) {
        return 0;
    }
    double x = json_number_value(v);
    for (int k = 0; k <= 6; k++) {
        char t[64];
        snprintf(t, sizeof t, "%.*f", k, x);
        if (strtod(t, NULL) == x) {
            return k;
        }
    }
    return 7;
}

/* v * 10^k as an integer, rounded up (dir > 0) or down (dir < 0); clamped
 * to +-(cap + 1) so that an out-of-reach bound stays out of reach. */
static int64_t
scaled(const json_t *v, int k, int dir, int64_t cap)
{
    double x = json_number_value(v);
    double lim = (double)cap / (double)pow10u(k);
    if (x > lim) {
        return cap + 1;
    }
    if (x < -lim) {
        return -cap - 1;
    }
    if (json_is_integer(v)) {
        return json_integer_value(v) * (int64_t)pow10u(k);
    }
    char t[64];
    snprintf(t, sizeof t, "%.*f", k, x);
    int64_t s = 0;
    bool neg = t[0] == '-';
    for (const char *p = t + neg; *p; p++) {
        if (*p >= '0' && *p <= '9') {
            s = s * 10 + (*p - '0');
        }
    }
    s = neg ? -s : s;
    double back = strtod(t, NULL);
    if (dir > 0 && back < x) {
        s++;
    } else if (dir < 0 && back > x) {
        s--;
    }
    return s;
}

/* A bound of s: key's value, or NULL; draft-4 boolean exclusive* are read
 * by the caller. */
static const json_t *
num_kw(sp_schema_gbnf_t *b, const json_t *s, const char *key)
{
    const json_t *v = json_object_get(s, key);
    if (v != NULL && !json_is_number(v) && !json_is_boolean(v)) {
        fail(b, "'%s' must be a number", key);
        return NULL;
    }
    return json_is_number(v) ? v : NULL;
}

/* Multiples of m (1..100) with up to D digits after a first digit 1-9: a
 * residue automaton, one rule per (residue, digits left) that can still end
 * on residue 0. Returns the start rule. */
static int
multiple_dfa(sp_schema_gbnf_t *b, int64_t m, int D)
{
    int W = D + 1;
    bool *ok = sp_calloc((size_t)(m * W), sizeof *ok);
    int *id = sp_malloc(sizeof *id * (size_t)(m * W));
    if (ok == NULL || id == NULL) {
        sp_free(ok);
        sp_free(id);
        b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
        return 0;
    }
    for (int j = 0; j < W; j++) {
        for (int64_t r = 0; r < m; r++) {
            bool o = r == 0;
            for (int dg = 0; dg < 10 && !o && j > 0; dg++) {
                o = ok[((r * 10 + dg) % m) * W + j - 1];
            }
            ok[r * W + j] = o;
            id[r * W + j] = o ? new_rule(b) : -1;
        }
    }
    str_t t = {0};
    for (int j = 0; j < W; j++) {
        for (int64_t r = 0; r < m; r++) {
            if (!ok[r * W + j]) {
                continue;
            }
            t.n = 0;
            bool any = false;
            if (r == 0) {
                str_cat(&t, "\"\"");
                any = true;
            }
            for (int dg = 0; dg < 10 && j > 0; dg++) {
                int64_t to = (r * 10 + dg) % m;
                if (ok[to * W + j - 1]) {
                    str_fmt(&t, any ? " | \"%d\" s%d" : "\"%d\" s%d", dg, id[to * W + j - 1]);
                    any = true;
                }
            }
            emit(b, id[r * W + j], &t);
        }
    }
    int start = new_rule(b);
    t.n = 0;
    bool any = false;
    for (int dg = 1; dg < 10; dg++) {
        int64_t to = dg % m;
        if (ok[to * W + D - 1]) {
            str_fmt(&t, any ? " | \"%d\" s%d" : "\"%d\" s%d", dg, id[to * W + D - 1]);
            any = true;
        }
    }
    emit(b, start, &t);
    if (t.oom) {
        b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
    }
    sp_free(t.p);
    sp_free(ok);
    sp_free(id);
    return start;
}

/* The value v (scaled by 10^k) written with k decimals. */
static void
put_scaled(str_t *body, int64_t v, int k)
{
    char t[48];
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    uint64_t p = pow10u(k);
    if (k > 0) {
        snprintf(t, sizeof t, "%s%llu.%0*llu", v < 0 ? "-" : "", (unsigned long long)(mag / p), k,
                 (unsigned long long)(mag % p));
    } else {
        snprintf(t, sizeof t, "%s%llu", v < 0 ? "-" : "", (unsigned long long)mag);
    }
    str_literal(body, t, strlen(t));
}

/*
 * integer / number with minimum, maximum, exclusiveMinimum, exclusiveMaximum
 * and multipleOf. Values are scaled to integers at k decimals (k = the
 * decimals that write the bounds exactly, at most 6; one more for an
 * exclusive bound of a number) and the range is compiled exactly into digit
 * patterns; a number may add fraction digits where that cannot leave the
 * range. multipleOf: powers of ten below 1 fix the decimals; integer
 * multiples become a residue automaton, or the list of values when the range
 * holds at most 256 of them.
 */
static void
compile_numeric(sp_schema_gbnf_t *b, const json_t *s, bool is_int, str_t *body)
{
    const json_t *mn = num_kw(b, s, "minimum"), *mx = num_kw(b, s, "maximum");
    const json_t *emn = num_kw(b, s, "exclusiveMinimum"), *emx = num_kw(b, s, "exclusiveMaximum");
    const json_t *mo = num_kw(b, s, "multipleOf");
    if (b->st != SP_OK) {
        return;
    }
    /* draft 4: exclusiveMinimum/Maximum true make minimum/maximum exclusive */
    if (json_is_true(json_object_get(s, "exclusiveMinimum"))) {
        emn = mn, mn = NULL;
    }
    if (json_is_true(json_object_get(s, "exclusiveMaximum"))) {
        emx = mx, mx = NULL;
    }
    /* the numeric formats ajv-formats knows: int32 is a range, int64 an
     * integer (within the digit cap), float and double any number */
    const json_t *fmt = json_object_get(s, "format");
    bool int32 = false;
    if (fmt != NULL) {
        const char *f = json_is_string(fmt) ? json_string_value(fmt) : "";
        if (strcmp(f, "int32") == 0 || strcmp(f, "int64") == 0) {
            int32 = f[3] == '3';
            is_int = true;
        } else if (strcmp(f, "float") != 0 && strcmp(f, "double") != 0 &&
                   !(json_is_array(json_object_get(s, "type")) && string_format(f))) {
            /* (a string format in a type list says nothing about its numbers) */
            fail(b, "format '%s' on a number is not supported (int32, int64, float, double)", f);
            return;
        }
    }
    if (mn == NULL && mx == NULL && emn == NULL && emx == NULL && mo == NULL && !int32) {
        need(b, is_int ? P_INTEGER : P_NUMBER);
        str_cat(body, is_int ? "json-integer" : "json-number");
        return;
    }
    int k = 0;
    bool int_mult = false;
    int64_t m = 0;
    if (mo != NULL) {
        double x = json_number_value(mo);
        if (!(x > 0)) {
            fail(b, "%s", "'multipleOf' must be greater than 0");
            return;
        }
        int dm = decimals_of(mo);
        if (dm == 0 || (x >= 1 && x == (double)(int64_t)x)) {
            int_mult = true, is_int = true; /* multiples of an integer are integers */
            if (x > 1e15) {
                fail(b, "%s", "'multipleOf' above 10^15 is not supported");
                return;
            }
            m = (int64_t)x;
        } else if (dm <= 6 && x == 1.0 / (double)pow10u(dm) && !is_int) {
            k = dm; /* 10^-k: any number with k decimals */
        } else if (is_int) {
            fail(b, "%s", "a fractional 'multipleOf' on an integer is not supported");
            return;
        } else {
            fail(b, "%s", "'multipleOf' other than an integer or 0.1, 0.01, ... 0.000001 is not "
                 "supported");
            return;
        }
    } else if (!is_int) {
        const json_t *bs[4] = {mn, mx, emn, emx};
        for (int i = 0; i < 4; i++) {
            if (bs[i] != NULL) {
                int d = decimals_of(bs[i]);
                k = d > 6 ? 6 : d > k ? d : k;
            }
        }
    }
    bool trail = !is_int && mo == NULL;
    int idig = is_int ? 16 : (18 - k < 16 ? 18 - k : 16);
    int64_t cap = (int64_t)pow10u(idig + k) - 1;
    /* [lo, hi] scaled; with `trail` an exclusive bound stays the bound and
     * is flagged (values just past it are written with a tail); otherwise
     * it moves one step in. Bounds beyond the digit cap leave that end open. */
    int64_t lo = -cap, hi = cap, v;
    bool lo_excl = false, hi_excl = false, lo_open = true, hi_open = true;
    if (mn && (v = scaled(mn, k, +1, cap)) > lo) {
        lo = v, lo_open = false;
    }
    if (emn) {
        int64_t f = scaled(emn, k, -1, cap), c = scaled(emn, k, +1, cap);
        bool exact = f == c;
        int64_t nv = !trail || !exact ? (exact ? f + 1 : c) : f;
        bool ex = trail && exact;
        if (nv > lo || (nv == lo && ex)) {
            lo = nv, lo_excl = ex, lo_open = false;
        }
    }
    if (mx && (v = scaled(mx, k, -1, cap)) < hi) {
        hi = v, hi_open = false;
    }
    if (emx) {
        int64_t f = scaled(emx, k, -1, cap), c = scaled(emx, k, +1, cap);
        bool exact = f == c;
        int64_t nv = !trail || !exact ? (exact ? c - 1 : f) : c;
        bool ex = trail && exact;
        if (nv < hi || (nv == hi && ex)) {
            hi = nv, hi_excl = ex, hi_open = false;
        }
    }
    if (int32 && lo < -2147483648LL) {
        lo = -2147483648LL, lo_open = false, lo_excl = false;
    }
    if (int32 && hi > 2147483647LL) {
        hi = 2147483647LL, hi_open = false, hi_excl = false;
    }
    if (lo > hi || (lo == hi && (lo_excl || hi_excl))) {
        fail(b, "%s", "minimum/maximum leave no value (or lie beyond 16 digits)");
        return;
    }
    str_cat(body, "(");
    if (int_mult) {
        int64_t first = lo >= 0 ? (lo + m - 1) / m : -((-lo) / m);
        int64_t last = hi >= 0 ? hi / m : -((-hi + m - 1) / m);
        if (first > last) {
            fail(b, "%s", "no multiple of 'multipleOf' lies between minimum and maximum");
            return;
        }
        if (last - first < 256) {
            for (int64_t j = first; j <= last; j++) {
                if (j != first) {
                    str_cat(body, " | ");
                }
                put_scaled(body, j * m, 0);
            }
            str_cat(body, ")");
            return;
        }
        if (m > 100) {
            fail(b, "%s", "'multipleOf' above 100 over more than 256 multiples is not supported");
            return;
        }
        /* positives m.. up to D digits (all within hi), negatives likewise */
        int pd = 0, nd = 0;
        while (pd < 16 && lo <= m && (int64_t)pow10u(pd + 1) - 1 <= hi) {
            pd++;
        }
        while (nd < 16 && hi >= -m && (int64_t)pow10u(nd + 1) - 1 <= -lo) {
            nd++;
        }
        bool any = false;
        if (lo <= 0 && hi >= 0) {
            str_cat(body, "\"0\"");
            any = true;
        }
        if (pd > 0) {
            str_fmt(body, any ? " | s%d" : "s%d", multiple_dfa(b, m, pd));
            any = true;
        }
        if (nd > 0) {
            str_fmt(body, any ? " | \"-\" s%d" : "\"-\" s%d", multiple_dfa(b, m, nd));
            any = true;
        }
        if (!any) {
            fail(b, "%s", "'multipleOf' with this minimum/maximum is not supported (more than 256 "
                 "multiples, not starting near 0)");
            return;
        }
        str_cat(body, ")");
        return;
    }
    bool any = false;
    if (hi >= 0 && !(hi == 0 && hi_excl)) {
        /* the non-negative part: near end max(lo, 0), far end hi */
        uint64_t a = lo > 0 ? (uint64_t)lo : 0;
        any = put_side(b, body, a, lo >= 0 && lo_excl, (uint64_t)hi, hi_open ? END_CAP
                       : hi_excl ? END_EXCL : END_EXACT, k, trail);
    }
    if (lo < 0 && b->st == SP_OK) {
        /* the negative part: magnitudes from -hi (or from 0 with a tail, 1
         * without, when the other part has 0) to -lo */
        uint64_t a = hi < 0 ? (uint64_t)(-hi) : trail ? 0 : 1;
        bool a_excl = hi < 0 ? hi_excl : trail && hi == 0 && hi_excl;
        size_t mark = body->n;
        str_cat(body, any ? " | \"-\" (" : "\"-\" (");
        if (put_side(b, body, a, a_excl, (uint64_t)(-lo), lo_open ? END_CAP
                     : lo_excl ? END_EXCL : END_EXACT, k, trail)) {
            str_cat(body, ")");
            any = true;
        } else {
            body->n = mark;
            if (body->p != NULL) {
                body->p[mark] = '\0';
            }
        }
    }
    if (!any && b->st == SP_OK) {
        fail(b, "%s", "minimum/maximum leave no value");
        return;
    }
    str_cat(body, ")");
}

/* ---- strings: format and pattern ------------------------------------------- */

/* The inside of the string for each supported format (GBNF), chosen so that
 * every output is valid for the common validators (ajv-formats, RFC 3339 /
 * 5321 / 3986 / 4122): dates never use February 29, times carry a zone,
 * e-mail local parts are dot-atoms of [A-Za-z0-9_+-], URIs are
 * scheme://host[:port][/path][?query] with percent-escapes. */
#define F_DATE                                                                                    \
    "[0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) " \
    "| (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") "                          \
    "| \"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))"
#define F_TIME                                                                                    \
    "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "         \
    "(\"Z\" | [+\\-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"
#define F_LABEL "[a-z0-9] ([a-z0-9\\-]{0,20} [a-z0-9])?"
#define F_PCHAR "([A-Za-z0-9._~!$&'()*+,;=:@\\-] | \"%\" [0-9A-F] [0-9A-F])"

static const struct {
    const char *name, *gbnf;
    int min_len, max_len; /* characters of the shortest and longest output */
} formats[] = {
    {"date", F_DATE, 10, 10},
    {"time", F_TIME, 9, 21},
    {"date-time", F_DATE " \"T\" " F_TIME, 20, 32},
    {"email", "[A-Za-z0-9_+\\-]{1,32} (\".\" [A-Za-z0-9_+\\-]{1,32}){0,3} \"@\" (" F_LABEL
              " \".\"){1,3} [a-z]{2,12}", 6, 213},
    {"uuid", "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [1-8] [0-9a-f]{3} \"-\" [89ab] [0-9a-f]{3} \"-\" "
             "[0-9a-f]{12}", 36, 36},
    {"uri", "[a-z] [a-z0-9+.\\-]{0,15} \"://\" " F_LABEL " (\".\" " F_LABEL "){0,4} "
            "(\":\" [1-9] [0-9]{0,3})? (\"/\" " F_PCHAR "{0,32}){0,8} (\"?\" " F_PCHAR "{0,64})?",
            5, 1124},
    {"ipv4", "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]) "
             "(\".\" (\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])){3}",
             7, 15},
};

static void
compile_string(sp_schema_gbnf_t *b, const json_t *s, str_t *body)
{
    uint64_t lo = 0, hi = UINT64_MAX;
    bool has_lo = get_uint(b, s, "minLength", &lo, SP_GRAMMAR_MAX_REPEAT);
    bool has_hi = get_uint(b, s, "maxLength", &hi, SP_GRAMMAR_MAX_REPEAT);
    if (has_lo && has_hi && hi < lo) {
        fail(b, "%s", "maxLength is below minLength");
    }
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (pat != NULL || fmt != NULL) {
        if (pat != NULL) {
            /* the pattern is the exact language; a format beside it (zod writes
             * both) names what the pattern describes. With minLength/maxLength:
             * the pattern's shortest match must reach minLength, and its
             * unbounded repetitions are capped at the largest count that keeps
             * every match within maxLength (a subset of its matches). */
            if (!json_is_string(pat)) {
                fail(b, "%s", "'pattern' must be a string");
                return;
            }
            const char *re = json_string_value(pat);
            size_t rlen = json_string_length(pat);
            unsigned fl = SP_REGEX_JSON | SP_REGEX_SEARCH;
            sp_status_t st;
            char rerr[256];
            int64_t mnl = 0, mxl = 0;
            char *g = sp_regex_gbnf_capped(re, rlen, fl, 0, &mnl, &mxl, &st, rerr, sizeof rerr);
            if (g != NULL && has_hi && (mxl < 0 || (uint64_t)mxl > hi)) {
                long good = 0;
                for (long c_lo = 1, c_hi = (long)hi; c_lo <= c_hi;) { /* the largest cap that fits */
                    long c = c_lo + (c_hi - c_lo) / 2;
                    int64_t cmax = 0;
                    char *t = sp_regex_gbnf_capped(re, rlen, fl, c, NULL, &cmax, &st, rerr,
                                                   sizeof rerr);
                    sp_free(t);
                    if (t != NULL && cmax >= 0 && (uint64_t)cmax <= hi) {
                        good = c, c_lo = c + 1;
                    } else {
                        c_hi = c - 1;
                    }
                }
                sp_free(g);
                g = good > 0 ? sp_regex_gbnf_capped(re, rlen, fl, good, NULL, NULL, &st, rerr,
                                                    sizeof rerr)
                             : NULL;
                if (good == 0) {
                    fail(b, "%s", "'maxLength' is below every match of 'pattern'");
                    return;
                }
            }
            if (g == NULL) {
                fail_st(b, st, rerr);
                return;
            }
            if (has_lo && (uint64_t)mnl < lo) {
                sp_free(g);
                fail(b, "%s", "'minLength' beside a 'pattern' that has shorter matches is not "
                     "supported");
                return;
            }
            str_cat(body, "\"\\\"\" ");
            str_cat(body, g);
            str_cat(body, " \"\\\"\"");
            sp_free(g);
            return;
        }
        const char *name = json_is_string(fmt) ? json_string_value(fmt) : "";
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
            if (strcmp(formats[i].name, name) == 0) {
                /* lengths are kept when the format's own lengths satisfy them */
                if ((has_lo && (uint64_t)formats[i].min_len < lo) ||
                    (has_hi && (uint64_t)formats[i].max_len > hi)) {
                    char msg[160];
                    snprintf(msg, sizeof msg, "minLength/maxLength beside format '%s' must allow "
                             "%d to %d characters", name, formats[i].min_len, formats[i].max_len);
                    fail(b, "%s", msg);
                    return;
                }
                str_cat(body, "\"\\\"\" (");
                str_cat(body, formats[i].gbnf);
                str_cat(body, ") \"\\\"\"");
                return;
            }
        }
        fail(b, "format '%s' is not supported (date-time, date, time, email, uuid, uri, ipv4)",
             name);
        return;
    }
    need(b, P_STRING);
    if (!has_lo && !has_hi) {
        str_cat(body, "json-string");
        return;
    }
    str_cat(body, "\"\\\"\" json-char");
    repeat_suffix(body, lo, hi);
    str_cat(body, " \"\\\"\"");
}

static bool
string_format(const char *name)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        if (strcmp(formats[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}

/* The rule of a $ref (queued for compiling once). */
static int
ref_rule(sp_schema_gbnf_t *b, const char *path)
{
    for (int i = 0; i < b->n_refs; i++) {
        if (strcmp(b->refs[i].path, path) == 0) {
            return b->refs[i].id;
        }
    }
    if (b->n_refs == MAX_REFS) {
        fail(b, "%s", "more than 1024 distinct $ref targets");
        return 0;
    }
    ref_t *r = &b->refs[b->n_refs];
    r->path = sp_strndup(path, strlen(path));
    if (r->path == NULL) {
        b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
        return 0;
    }
    r->id = new_rule(b);
    r->done = false;
    b->n_refs++;
    return r->id;
}

/* The schema a local $ref points at, or NULL (error recorded). */
static const json_t *
resolve(sp_schema_gbnf_t *b, const char *path)
{
    if (strcmp(path, "#") == 0) {
        return b->root;
    }
    const char *name = NULL;
    const json_t *defs = NULL;
    if (strncmp(path, "#/$defs/", 8) == 0) {
        defs = json_object_get(b->root, "$defs");
        name = path + 8;
    } else if (strncmp(path, "#/definitions/", 14) == 0) {
        defs = json_object_get(b->root, "definitions");
        name = path + 14;
    } else {
        fail(b, "$ref '%s' is not supported (only '#', '#/$defs/NAME' and '#/definitions/NAME')",
             path);
        return NULL;
    }
    /* JSON pointer unescaping of one segment: ~1 is '/', ~0 is '~' */
    char key[256];
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof key; p++) {
        if (*p == '/') {
            fail(b, "$ref '%s' goes deeper than one level", path);
            return NULL;
        }
        if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
            key[k++] = p[1] == '0' ? '~' : '/';
            p++;
        } else {
            key[k++] = *p;
        }
    }
    key[k] = '\0';
    const json_t *t = json_is_object(defs) ? json_object_get(defs, key) : NULL;
    if (t == NULL) {
        fail(b, "$ref '%s' points at nothing", path);
    }
    return t;
}

/* ---- oneOf: exclusivity the grammar guarantees ---------------------------
 * oneOf compiles to the same alternation as anyOf, which is exact when no
 * value can match two branches. That is proved here for the forms clients
 * emit: branches of different JSON types, branches that list their values
 * (const / enum) with none in common with the other branch, and objects that
 * require one property with different const / enum values (a discriminator,
 * as pydantic's and zod's tagged unions have). Any other pair is refused. */

#define OK_NULL 1u
#define OK_BOOL 2u
#define OK_NUM 4u /* integer and number: 1 is both */
#define OK_STR 8u
#define OK_ARR 16u
#define OK_OBJ 32u
#define OK_ANY 63u
#define ONEOF_MAX_BRANCHES 128  /* pairwise checks stay small */
#define ONEOF_MAX_WORK 1000000  /* value comparisons per schema */

/* s with its local $refs followed (a few hops); NULL when one cannot be. */
static const json_t *
oneof_follow(sp_schema_gbnf_t *b, const json_t *s)
{
    for (int hop = 0; hop < 8 && json_is_object(s); hop++) {
        const json_t *ref = json_object_get(s, "$ref");
        if (!json_is_string(ref)) {
            return s;
        }
        s = resolve(b, json_string_value(ref));
    }
    return json_is_object(s) || json_is_boolean(s) ? s : NULL;
}

static unsigned
kind_of_value(const json_t *v)
{
    return json_is_null(v)      ? OK_NULL
           : json_is_boolean(v) ? OK_BOOL
           : json_is_number(v)  ? OK_NUM
           : json_is_string(v)  ? OK_STR
           : json_is_array(v)   ? OK_ARR
                                : OK_OBJ;
}

static unsigned
kind_of_type(const char *t)
{
    return strcmp(t, "null") == 0                                 ? OK_NULL
           : strcmp(t, "boolean") == 0                            ? OK_BOOL
           : strcmp(t, "integer") == 0 || strcmp(t, "number") == 0 ? OK_NUM
           : strcmp(t, "string") == 0                             ? OK_STR
           : strcmp(t, "array") == 0                              ? OK_ARR
           : strcmp(t, "object") == 0                             ? OK_OBJ
                                                                  : OK_ANY;
}

/* The JSON types a schema admits (a superset: OK_ANY when unsure). */
static unsigned
oneof_kinds(sp_schema_gbnf_t *b, const json_t *s, int depth)
{
    s = oneof_follow(b, s);
    if (s == NULL || depth > 16) {
        return OK_ANY;
    }
    if (json_is_boolean(s)) {
        return json_is_true(s) ? OK_ANY : 0;
    }
    const json_t *v;
    size_t i;
    const json_t *e;
    unsigned k = 0;
    if ((v = json_object_get(s, "const")) != NULL) {
        return kind_of_value(v);
    }
    if (json_is_array(v = json_object_get(s, "enum"))) {
        json_array_foreach(v, i, e) {
            k |= kind_of_value(e);
        }
        return k;
    }
    if (json_is_array(v = json_object_get(s, "anyOf")) ||
        json_is_array(v = json_object_get(s, "oneOf"))) {
        json_array_foreach(v, i, e) {
            k |= oneof_kinds(b, e, depth + 1);
        }
        return k;
    }
    if (json_is_array(v = json_object_get(s, "allOf"))) {
        k = OK_ANY;
        json_array_foreach(v, i, e) {
            k &= oneof_kinds(b, e, depth + 1);
        }
        return k;
    }
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) {
        return kind_of_type(json_string_value(t));
    }
    if (json_is_array(t)) {
        json_array_foreach(t, i, e) {
            k |= json_is_string(e) ? kind_of_type(json_string_value(e)) : OK_ANY;
        }
        return k;
    }
    /* no type: what compile_node infers from the keywords */
    if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
        json_object_get(s, "required")) {
        return OK_OBJ;
    }
    if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems")) {
        return OK_ARR;
    }
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
        json_object_get(s, "pattern") || json_object_get(s, "format")) {
        return OK_STR;
    }
    if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
        json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum") ||
        json_object_get(s, "multipleOf")) {
        return OK_NUM;
    }
    return OK_ANY;
}

/* The values a schema lists (its const as a one-value list is not built:
 * *one gets it), or NULL when it does not list them. */
static const json_t *
oneof_values(const json_t *s, const json_t **one)
{
    *one = NULL;
    if (!json_is_object(s)) {
        return NULL;
    }
    const json_t *c = json_object_get(s, "const");
    if (c != NULL) {
        *one = c;
        return c;
    }
    const json_t *e = json_object_get(s, "enum");
    return json_is_array(e) ? e : NULL;
}

/* JSON Schema equality: numbers by value (1 and 1.0 are equal). */
static bool
oneof_equal(const json_t *a, const json_t *c)
{
    if (json_is_number(a) && json_is_number(c)) {
        return json_number_value(a) == json_number_value(c);
    }
    return json_equal((json_t *)a, (json_t *)c);
}

/* No value in both lists (each a const, *one, or an enum). */
static bool
oneof_values_apart(sp_schema_gbnf_t *b, const json_t *va, const json_t *oa, const json_t *vb,
                   const json_t *ob, long *work)
{
    size_t na = oa ? 1 : json_array_size(va), nb = ob ? 1 : json_array_size(vb);
    for (size_t i = 0; i < na; i++) {
        const json_t *x = oa ? oa : json_array_get(va, i);
        for (size_t j = 0; j < nb; j++) {
            if (++*work > ONEOF_MAX_WORK) {
                fail(b, "%s", "'oneOf' is too large to check that its branches exclude each other");
                return false;
            }
            if (oneof_equal(x, ob ? ob : json_array_get(vb, j))) {
                return false;
            }
        }
    }
    return true;
}

/* Every value a lists is outside b's kinds. */
static bool
oneof_values_outside(const json_t *va, const json_t *oa, unsigned kinds)
{
    size_t na = oa ? 1 : json_array_size(va);
    for (size_t i = 0; i < na; i++) {
        if (kind_of_value(oa ? oa : json_array_get(va, i)) & kinds) {
            return false;
        }
    }
    return true;
}

/* A property that x and y both require, with const / enum values apart. */
static bool
oneof_discriminated(sp_schema_gbnf_t *b, const json_t *x, const json_t *y, long *work)
{
    const json_t *rx = json_object_get(x, "required"), *ry = json_object_get(y, "required");
    const json_t *px = json_object_get(x, "properties"), *py = json_object_get(y, "properties");
    size_t i, j;
    const json_t *n, *m;
    json_array_foreach(rx, i, n) {
        if (!json_is_string(n)) {
            continue;
        }
        bool in_y = false;
        json_array_foreach(ry, j, m) {
            in_y = in_y || (json_is_string(m) && strcmp(json_string_value(m), json_string_value(n)) == 0);
        }
        if (!in_y) {
            continue;
        }
        const json_t *sx = oneof_follow(b, json_object_get(px, json_string_value(n)));
        const json_t *sy = oneof_follow(b, json_object_get(py, json_string_value(n)));
        const json_t *ox, *oy;
        const json_t *vx = oneof_values(sx, &ox), *vy = oneof_values(sy, &oy);
        if (vx != NULL && vy != NULL && oneof_values_apart(b, vx, ox, vy, oy, work)) {
            return true;
        }
    }
    return false;
}

/* Can no value match both x and y (as far as the forms above prove)? */
static bool
oneof_apart(sp_schema_gbnf_t *b, const json_t *x, const json_t *y, long *work)
{
    unsigned kx = oneof_kinds(b, x, 0), ky = oneof_kinds(b, y, 0);
    if ((kx & ky) == 0) {
        return true;
    }
    x = oneof_follow(b, x);
    y = oneof_follow(b, y);
    const json_t *ox, *oy;
    const json_t *vx = oneof_values(x, &ox), *vy = oneof_values(y, &oy);
    if (vx != NULL && vy != NULL) {
        return oneof_values_apart(b, vx, ox, vy, oy, work);
    }
    if ((vx != NULL && oneof_values_outside(vx, ox, ky)) ||
        (vy != NULL && oneof_values_outside(vy, oy, kx))) {
        return true;
    }
    /* the only values both could take are objects: a discriminator tells them apart */
    return (kx & ky) == OK_OBJ && json_is_object(x) && json_is_object(y) &&
           oneof_discriminated(b, x, y, work);
}

/* Refuse a oneOf whose exclusivity the alternation would not keep. */
static void
oneof_check(sp_schema_gbnf_t *b, const json_t *alts)
{
    size_t n = json_array_size(alts);
    if (n > ONEOF_MAX_BRANCHES) {
        fail(b, "'oneOf' has more than %s branches: too many to check that they exclude each "
             "other (use anyOf)", "128");
        return;
    }
    long work = 0;
    for (size_t i = 0; i < n && b->st == SP_OK; i++) {
        for (size_t j = i + 1; j < n && b->st == SP_OK; j++) {
            if (!oneof_apart(b, json_array_get(alts, i), json_array_get(alts, j), &work) &&
                b->st == SP_OK) {
                char msg[224];
                snprintf(msg, sizeof msg,
                         "'oneOf' branches %zu and %zu may both match one value (the grammar cannot "
                         "enforce exclusivity): give them different types, const/enum values or a "
                         "required const discriminator, or use anyOf", i, j);
                fail(b, "%s", msg);
            }
        }
    }
}

/*
 * allOf with several schemas: their keywords merged into one schema (local
 * $refs followed one level). Properties are united (a property defined in
 * two parts must be defined the same), `required` lists joined; any other
 * keyword must not appear with different values in two parts, since the
 * intersection of two different constraints is not compiled. Returns a new
 * schema, or NULL after failing.
 */
static const json_t *resolve(sp_schema_gbnf_t *b, const char *path);

static json_t *
merge_all_of(sp_schema_gbnf_t *b, const json_t *parts)
{
    json_t *m = json_object();
    if (m == NULL) {
        b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(parts) && b->st == SP_OK; i++) {
        const json_t *p = json_array_get(parts, i);
        const json_t *ref = json_object_get(p, "$ref");
        if (json_is_string(ref)) {
            if (json_object_size(p) != 1) {
                fail(b, "%s", "an 'allOf' part with '$ref' and other keywords is not supported");
                break;
            }
            p = resolve(b, json_string_value(ref));
            if (p == NULL) {
                break;
            }
        }
        if (!json_is_object(p)) {
            fail(b, "%s", "'allOf' parts must be schema objects");
            break;
        }
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)p, key, val) {
            json_t *have = json_object_get(m, key);
            int rc = 0;
            if (strcmp(key, "properties") == 0 && json_is_object(val) && json_is_object(have)) {
                const char *pk;
                json_t *pv;
                json_object_foreach(val, pk, pv) {
                    const json_t *h = json_object_get(have, pk);
                    if (h != NULL && !json_equal(h, pv)) {
                        fail(b, "'allOf' parts define property '%s' differently", pk);
                        break;
                    }
                    rc |= json_object_set(have, pk, pv);
                }
            } else if (strcmp(key, "required") == 0 && json_is_array(val) && json_is_array(have)) {
                rc = json_array_extend(have, val);
            } else if (strcmp(key, "properties") == 0 || strcmp(key, "required") == 0) {
                json_t *c = json_copy(val); /* shallow: the merge adds to the copy */
                rc = c == NULL || json_object_set_new(m, key, c);
            } else if (have != NULL && !json_equal(have, val)) {
                fail(b, "'allOf' parts disagree on '%s' (an intersection is not supported)", key);
                break;
            } else {
                rc = json_object_set(m, key, val);
            }
            if (rc != 0) {
                b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
                break;
            }
            if (b->st != SP_OK) {
                break;
            }
        }
    }
    /* a part that closes its object (additionalProperties) must list every
     * property the merge allows, or those would break that part */
    const json_t *props = json_object_get(m, "properties");
    for (size_t i = 0; i < json_array_size(parts) && b->st == SP_OK; i++) {
        const json_t *p = json_array_get(parts, i);
        if (json_is_string(json_object_get(p, "$ref"))) {
            p = resolve(b, json_string_value(json_object_get(p, "$ref")));
        }
        const json_t *add = json_object_get(p, "additionalProperties");
        if (add == NULL || json_is_true(add)) {
            continue;
        }
        const json_t *own = json_object_get(p, "properties");
        const char *pk;
        const json_t *pv;
        json_object_foreach((json_t *)props, pk, pv) {
            if (json_object_get(own, pk) == NULL) {
                fail(b, "an 'allOf' part's additionalProperties forbids property '%s' of another "
                     "part", pk);
                break;
            }
        }
    }
    if (b->st != SP_OK) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static int
compile_node(sp_schema_gbnf_t *b, const json_t *s)
{
    int id = new_rule(b);
    if (b->st != SP_OK) {
        return id;
    }
    if (++b->n_nodes > SP_SCHEMA_MAX_NODES) {
        fail(b, "%s", "the schema has more than 10000 parts");
        return id;
    }
    if (b->depth >= SP_SCHEMA_MAX_DEPTH) {
        fail(b, "%s", "the schema nests deeper than 64 levels");
        return id;
    }
    b->depth++;
    str_t body = {0};
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        need(b, P_VALUE);
        str_cat(&body, "json-value");
        goto done;
    }
    if (!json_is_object(s)) {
        fail(b, "%s", "a schema must be an object or a boolean true");
        goto done;
    }
    for (int i = 0; unsupported[i]; i++) {
        const json_t *v = json_object_get(s, unsupported[i]);
        if (v != NULL) {
            fail(b, "'%s' is not supported", unsupported[i]);
            goto done;
        }
    }
    if (refuse_dropped(b, s)) {
        goto done;
    }
    const json_t *v;
    if ((v = json_object_get(s, "$ref")) != NULL) {
        if (!json_is_string(v)) {
            fail(b, "%s", "'$ref' must be a string");
            goto done;
        }
        str_fmt(&body, "s%d", ref_rule(b, json_string_value(v)));
        goto done;
    }
    if ((v = json_object_get(s, "const")) != NULL) {
        value_literal(b, &body, v);
        goto done;
    }
    if ((v = json_object_get(s, "enum")) != NULL) {
        if (!json_is_array(v) || json_array_size(v) == 0) {
            fail(b, "%s", "'enum' must be a non-empty list");
            goto done;
        }
        for (size_t i = 0; i < json_array_size(v) && b->st == SP_OK; i++) {
            if (++b->n_nodes > SP_SCHEMA_MAX_NODES) {
                fail(b, "%s", "the schema has more than 10000 parts");
                break;
            }
            if (i) {
                str_cat(&body, " | ");
            }
            value_literal(b, &body, json_array_get(v, i));
        }
        goto done;
    }
    const char *alt_key = json_object_get(s, "anyOf") ? "anyOf"
                          : json_object_get(s, "oneOf") ? "oneOf"
                          : json_object_get(s, "allOf") ? "allOf"
                                                        : NULL;
    if (alt_key != NULL) {
        v = json_object_get(s, alt_key);
        if (!json_is_array(v) || json_array_size(v) == 0) {
            fail(b, "'%s' must be a non-empty list", alt_key);
            goto done;
        }
        if (strcmp(alt_key, "oneOf") == 0 && json_array_size(v) > 1) {
            oneof_check(b, v);
            if (b->st != SP_OK) {
                goto done;
            }
        }
        if (strcmp(alt_key, "allOf") == 0 && json_array_size(v) != 1) {
            json_t *merged = merge_all_of(b, v);
            if (merged != NULL) {
                int r = compile_child(b, merged, "allOf");
                str_fmt(&body, "s%d", r);
                json_decref(merged);
            }
            goto done;
        }
        for (size_t i = 0; i < json_array_size(v) && b->st == SP_OK; i++) {
            char k[32];
            snprintf(k, sizeof k, "%s/%zu", alt_key, i);
            int r = compile_child(b, json_array_get(v, i), k);
            str_fmt(&body, i ? " | s%d" : "s%d", r);
        }
        goto done;
    }
    /* type: a name, a list of names, or inferred from the keywords */
    const json_t *t = json_object_get(s, "type");
    const char *types[8];
    size_t nt = 0;
    if (t == NULL) {
        if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
            json_object_get(s, "required")) {
            types[nt++] = "object";
        } else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
                   json_object_get(s, "maxItems")) {
            types[nt++] = "array";
        } else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
                   json_object_get(s, "pattern") || json_object_get(s, "format")) {
            types[nt++] = "string";
        } else if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                   json_object_get(s, "exclusiveMinimum") ||
                   json_object_get(s, "exclusiveMaximum") || json_object_get(s, "multipleOf")) {
            types[nt++] = "number";
        } else {
            need(b, P_VALUE);
            str_cat(&body, "json-value");
            goto done;
        }
    } else if (json_is_string(t)) {
        types[nt++] = json_string_value(t);
    } else if (json_is_array(t) && json_array_size(t) > 0 && json_array_size(t) <= 7) {
        for (size_t i = 0; i < json_array_size(t); i++) {
            if (!json_is_string(json_array_get(t, i))) {
                fail(b, "%s", "'type' must be a name or a list of names");
                goto done;
            }
            types[nt++] = json_string_value(json_array_get(t, i));
        }
    } else {
        fail(b, "%s", "'type' must be a name or a list of 1 to 7 names");
        goto done;
    }
    for (size_t i = 0; i < nt && b->st == SP_OK; i++) {
        if (i) {
            str_cat(&body, " | ");
        }
        const char *ty = types[i];
        if (strcmp(ty, "string") == 0) {
            compile_string(b, s, &body);
        } else if (strcmp(ty, "number") == 0 || strcmp(ty, "integer") == 0) {
            compile_numeric(b, s, strcmp(ty, "integer") == 0, &body);
        } else if (strcmp(ty, "boolean") == 0) {
            need(b, P_BOOL);
            str_cat(&body, "json-boolean");
        } else if (strcmp(ty, "null") == 0) {
            need(b, P_NULL);
            str_cat(&body, "json-null");
        } else if (strcmp(ty, "object") == 0) {
            str_cat(&body, "(");
            compile_object(b, s, &body);
            str_cat(&body, ")");
        } else if (strcmp(ty, "array") == 0) {
            str_cat(&body, "(");
            compile_array(b, s, &body);
            str_cat(&body, ")");
        } else {
            fail(b, "type '%s' is not a JSON Schema type", ty);
        }
    }
done:
    b->depth--;
    if (body.oom) {
        b->st = sp_errf(b->err, b->err_len, SP_ERR_NOMEM, "json_schema: out of memory");
    }
    if (b->st == SP_OK) {
        emit(b, id, &body);
    }
    if (b->st == SP_OK && b->out.n > SP_GRAMMAR_MAX_SOURCE) {
        fail_st(b, SP_ERR_TOO_LARGE, "the schema's grammar passes 1 MiB");
    }
    sp_free(body.p);
    return id;
}

/* ---- the builder ----------------------------------------------------------- */

sp_status_t
sp_schema_gbnf_create(sp_schema_gbnf_t **out)
{
    *out = sp_calloc(1, sizeof **out);
    return *out ? SP_OK : SP_ERR_NOMEM;
}

static void
refs_clear(sp_schema_gbnf_t *b)
{
    for (int i = 0; i < b->n_refs; i++) {
        sp_free(b->refs[i].path);
    }
    b->n_refs = 0;
}

void
sp_schema_gbnf_destroy(sp_schema_gbnf_t *b)
{
    if (b == NULL) {
        return;
    }
    refs_clear(b);
    sp_free(b->out.p);
    sp_free(b);
}

sp_status_t
sp_schema_gbnf_add(sp_schema_gbnf_t *b, const json_t *schema, char *rule, size_t rule_cap,
                   char *err, size_t err_len)
{
    b->root = schema;
    b->err = err;
    b->err_len = err_len;
    b->st = SP_OK;
    b->depth = 0;
    b->ptr[0] = '\0';
    refs_clear(b);
    int top = compile_node(b, schema);
    /* The $ref targets, each once; compiling one may queue more. */
    for (int i = 0; i < b->n_refs && b->st == SP_OK; i++) {
        const json_t *t = resolve(b, b->refs[i].path);
        if (t == NULL) {
            break;
        }
        snprintf(b->ptr, sizeof b->ptr, "%.500s", b->refs[i].path + 1);
        int r = compile_node(b, t);
        str_fmt(&b->out, "s%d ::= s%d\n", b->refs[i].id, r);
    }
    refs_clear(b);
    if (b->st == SP_OK && b->out.oom) {
        b->st = sp_errf(err, err_len, SP_ERR_NOMEM, "json_schema: out of memory");
    }
    if (b->st == SP_OK) {
        snprintf(rule, rule_cap, "s%d", top);
    }
    return b->st;
}

uint64_t
sp_schema_gbnf_work(const sp_schema_gbnf_t *b)
{
    return b->work;
}

void
sp_schema_gbnf_raw(sp_schema_gbnf_t *b, const char *text)
{
    str_cat(&b->out, text);
}

void
sp_schema_gbnf_use_ws(sp_schema_gbnf_t *b)
{
    need(b, P_WS);
}

void
sp_schema_gbnf_literal(sp_schema_gbnf_t *b, const char *s, size_t n)
{
    str_literal(&b->out, s, n);
}

const char *
sp_schema_gbnf_text(sp_schema_gbnf_t *b, size_t *len)
{
    for (size_t i = 0; i < sizeof prim_text / sizeof prim_text[0]; i++) {
        if ((b->prims & (1u << i)) && !(b->appended & (1u << i))) {
            str_cat(&b->out, prim_text[i]);
        }
    }
    b->appended |= b->prims; /* each helper rule once */
    if (b->out.oom) {
        return NULL;
    }
    if (len) {
        *len = b->out.n;
    }
    return b->out.p ? b->out.p : "";
}

sp_status_t
sp_schema_to_gbnf(const json_t *schema, char **out, size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    sp_schema_gbnf_t *b;
    if (sp_schema_gbnf_create(&b) != SP_OK) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "json_schema: out of memory");
    }
    char top[32];
    sp_status_t st = sp_schema_gbnf_add(b, schema, top, sizeof top, err, err_len);
    if (st == SP_OK) {
        str_fmt(&b->out, "root ::= %s\n", top);
        size_t n = 0;
        const char *t = sp_schema_gbnf_text(b, &n);
        *out = t ? sp_strndup(t, n) : NULL;
        if (*out == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "json_schema: out of memory");
        } else if (out_len) {
            *out_len = n;
        }
    }
    sp_schema_gbnf_destroy(b);
    return st;
}

sp_status_t
sp_schema_grammar(const json_t *schema, sp_grammar_t **out, char *err, size_t err_len)
{
    *out = NULL;
    char *text = NULL;
    size_t n = 0;
    sp_status_t st = sp_schema_to_gbnf(schema, &text, &n, err, err_len);
    if (st == SP_OK) {
        char gerr[256];
        st = sp_grammar_compile(text, n, out, gerr, sizeof gerr);
        if (st != SP_OK) {
            sp_errf(err, err_len, st, "json_schema: %s", gerr);
        }
    }
    sp_free(text);
    return st;
}
