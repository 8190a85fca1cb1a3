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
#include <string.h>

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
    "pattern", "format", "if", "then", "else", "not", "prefixItems", "uniqueItems", "contains",
    "minContains", "maxContains", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems",
    "minProperties", "maxProperties", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "contentEncoding", "contentMediaType", "contentSchema", "$dynamicRef",
    "$recursiveRef", "additionalItems", NULL};

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
    NULL};

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

static void
compile_string(sp_schema_gbnf_t *b, const json_t *s, str_t *body)
{
    uint64_t lo = 0, hi = UINT64_MAX;
    bool has_lo = get_uint(b, s, "minLength", &lo, SP_GRAMMAR_MAX_REPEAT);
    bool has_hi = get_uint(b, s, "maxLength", &hi, SP_GRAMMAR_MAX_REPEAT);
    if (has_lo && has_hi && hi < lo) {
        fail(b, "%s", "maxLength is below minLength");
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

static void
compile_array(sp_schema_gbnf_t *b, const json_t *s, str_t *body)
{
    const json_t *items = json_object_get(s, "items");
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
        if (v != NULL && !(strcmp(unsupported[i], "uniqueItems") == 0 && json_is_false(v))) {
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
        if (strcmp(alt_key, "allOf") == 0 && json_array_size(v) != 1) {
            fail(b, "%s", "'allOf' with more than one schema is not supported");
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
        } else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) {
            types[nt++] = "string";
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
    const json_t *mn = json_object_get(s, "minimum");
    bool non_negative = mn != NULL && json_is_number(mn) && json_number_value(mn) == 0.0;
    if (mn != NULL && !non_negative) {
        fail(b, "%s", "'minimum' other than 0 is not supported");
        goto done;
    }
    for (size_t i = 0; i < nt && b->st == SP_OK; i++) {
        if (i) {
            str_cat(&body, " | ");
        }
        const char *ty = types[i];
        if (strcmp(ty, "string") == 0) {
            compile_string(b, s, &body);
        } else if (strcmp(ty, "number") == 0) {
            need(b, P_NUMBER);
            str_cat(&body, non_negative ? "json-unumber" : "json-number");
        } else if (strcmp(ty, "integer") == 0) {
            need(b, P_INTEGER);
            str_cat(&body, non_negative ? "json-uinteger" : "json-integer");
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
