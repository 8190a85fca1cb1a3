/*
 * toolcall.c - tool calls in model output, and the grammar that forces one
 * (toolcall.h has the contract).
 */
#include "constrain/toolcall.h"

#include <string.h>

#include "core/jfree.h"
#include "core/alloc.h"
#include "constrain/schema.h"

static const char HERMES_OPEN[] = "<tool_call>";
static const char HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_OPEN[] = "[TOOL_CALLS]";

static bool
is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* One call object to {"name", "arguments"}, appended to arr; false when it is not one. */
static bool
add_call(json_t *arr, const json_t *v)
{
    if (!json_is_object(v) || json_array_size(arr) >= SP_TOOLCALL_MAX_CALLS) {
        return false;
    }
    const json_t *name = json_object_get(v, "name");
    const json_t *args = json_object_get(v, "arguments");
    if (args == NULL) {
        args = json_object_get(v, "parameters");
    }
    if (!json_is_string(name) || json_string_length(name) == 0) {
        return false;
    }
    json_t *a = NULL;
    if (args == NULL) {
        a = json_object();
    } else if (json_is_string(args)) { /* some models write the arguments as a string */
        a = json_loads(json_string_value(args), JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(a)) {
            json_decref(a);
            return false;
        }
    } else if (json_is_object(args)) {
        a = json_incref((json_t *)args);
    } else {
        return false;
    }
    json_t *call = json_pack("{s:O,s:o}", "name", name, "arguments", a);
    return call != NULL && json_array_append_new(arr, call) == 0;
}

/* Parse one JSON value at p (len bytes); *used gets the bytes it took. */
static json_t *
load_one(const char *p, size_t len, size_t *used)
{
    json_error_t e;
    json_t *v = json_loadb(p, len, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &e);
    *used = v ? (size_t)e.position : 0;
    return v;
}

static void
parse_hermes(const char *text, size_t len, json_t *arr, size_t *content_len)
{
    const char *p = memmem(text, len, HERMES_OPEN, sizeof HERMES_OPEN - 1);
    if (p == NULL) {
        return;
    }
    *content_len = (size_t)(p - text);
    const char *end = text + len;
    while (p != NULL) {
        const char *body = p + sizeof HERMES_OPEN - 1;
        const char *close = memmem(body, (size_t)(end - body), HERMES_CLOSE, sizeof HERMES_CLOSE - 1);
        const char *stop = close ? close : end;
        while (body < stop && is_space(*body)) {
            body++;
        }
        size_t used;
        json_t *v = load_one(body, (size_t)(stop - body), &used);
        bool ok = v != NULL && add_call(arr, v);
        json_decref(v);
        if (!ok || close == NULL) {
            break;
        }
        const char *next = close + sizeof HERMES_CLOSE - 1;
        p = memmem(next, (size_t)(end - next), HERMES_OPEN, sizeof HERMES_OPEN - 1);
    }
}

static void
parse_llama3(const char *text, size_t len, json_t *arr, size_t *content_len)
{
    const char *p = text, *end = text + len;
    while (p < end && is_space(*p)) {
        p++;
    }
    if ((size_t)(end - p) >= 14 && memcmp(p, "<|python_tag|>", 14) == 0) {
        p += 14;
    }
    if (p >= end || *p != '{') {
        return;
    }
    *content_len = 0;
    /* one or more objects, separated by ';' or whitespace */
    while (p < end && *p == '{') {
        size_t used;
        json_t *v = load_one(p, (size_t)(end - p), &used);
        bool ok = v != NULL && add_call(arr, v);
        json_decref(v);
        if (!ok) {
            break;
        }
        p += used;
        while (p < end && (is_space(*p) || *p == ';')) {
            p++;
        }
    }
}

static void
parse_mistral(const char *text, size_t len, json_t *arr, size_t *content_len)
{
    const char *p = memmem(text, len, MISTRAL_OPEN, sizeof MISTRAL_OPEN - 1);
    if (p == NULL) {
        return;
    }
    *content_len = (size_t)(p - text);
    const char *body = p + sizeof MISTRAL_OPEN - 1, *end = text + len;
    while (body < end && is_space(*body)) {
        body++;
    }
    size_t used;
    json_t *v = load_one(body, (size_t)(end - body), &used);
    if (json_is_array(v)) {
        size_t i;
        json_t *c;
        json_array_foreach(v, i, c) {
            if (!add_call(arr, c)) {
                break;
            }
        }
    } else if (v != NULL) {
        add_call(arr, v);
    }
    json_decref(v);
}

void
sp_toolcall_parse(sp_chat_tools_t f, const char *text, size_t len, json_t **calls,
                  size_t *content_len)
{
    *calls = NULL;
    *content_len = len;
    json_t *arr = json_array();
    if (arr == NULL) {
        return;
    }
    size_t cl = len;
    switch (f) {
    case SP_CHAT_TOOLS_LLAMA3: parse_llama3(text, len, arr, &cl); break;
    case SP_CHAT_TOOLS_MISTRAL: parse_mistral(text, len, arr, &cl); break;
    default: parse_hermes(text, len, arr, &cl); break;
    }
    if (json_array_size(arr) == 0) {
        json_decref(arr);
        return;
    }
    *calls = arr;
    *content_len = cl;
}

/* Length of the longest suffix of text that is a proper prefix of m. */
static size_t
partial_marker(const char *text, size_t len, const char *m, size_t mlen)
{
    for (size_t k = mlen - 1; k > 0; k--) {
        if (k <= len && memcmp(text + len - k, m, k) == 0) {
            return k;
        }
    }
    return 0;
}

size_t
sp_toolcall_safe_prefix(sp_chat_tools_t f, const char *text, size_t len, bool *in_call)
{
    *in_call = false;
    if (f == SP_CHAT_TOOLS_LLAMA3) {
        size_t i = 0;
        while (i < len && is_space(text[i])) {
            i++;
        }
        if (i == len) {
            return 0; /* only blanks so far: a call may still start */
        }
        if (text[i] == '{' || text[i] == '<') { /* a call, or maybe <|python_tag|> */
            if (text[i] == '{' || (len - i >= 14 && memcmp(text + i, "<|python_tag|>", 14) == 0) ||
                memcmp(text + i, "<|python_tag|>", len - i < 14 ? len - i : 14) == 0) {
                *in_call = true;
                return 0;
            }
        }
        return len;
    }
    const char *m = f == SP_CHAT_TOOLS_MISTRAL ? MISTRAL_OPEN : HERMES_OPEN;
    size_t mlen = strlen(m);
    const char *p = memmem(text, len, m, mlen);
    if (p != NULL) {
        *in_call = true;
        return (size_t)(p - text);
    }
    return len - partial_marker(text, len, m, mlen);
}

sp_status_t
sp_toolcall_grammar(sp_chat_tools_t f, const json_t *tools, const char *only, char **out,
                    size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    sp_schema_gbnf_t *b;
    if (sp_schema_gbnf_create(&b) != SP_OK) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "tools: out of memory");
    }
    sp_status_t st = SP_OK;
    int n = 0;
    const char *args_key = f == SP_CHAT_TOOLS_LLAMA3 ? "parameters" : "arguments";
    size_t i;
    const json_t *t;
    json_t *generic = json_pack("{s:s}", "type", "object");
    sp_schema_gbnf_raw(b, "call ::= ");
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (name == NULL || (only != NULL && strcmp(only, name) != 0)) {
            continue;
        }
        if (n++) {
            sp_schema_gbnf_raw(b, " | ");
        }
        char ref[48];
        snprintf(ref, sizeof ref, "call-%zu", i);
        sp_schema_gbnf_raw(b, ref);
    }
    sp_schema_gbnf_raw(b, "\n");
    if (n == 0) {
        st = only ? sp_errf(err, err_len, SP_ERR_INVALID,
                            "tool_choice names the function '%s', which is not in 'tools'", only)
                  : sp_errf(err, err_len, SP_ERR_INVALID, "'tools' lists no function");
    }
    json_array_foreach(tools, i, t) {
        if (st != SP_OK) {
            break;
        }
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (name == NULL || (only != NULL && strcmp(only, name) != 0)) {
            continue;
        }
        const json_t *params = json_object_get(fn, "parameters");
        char rule[32], e2[300];
        st = sp_schema_gbnf_add(b, params ? params : generic, rule, sizeof rule, e2, sizeof e2);
        if (st != SP_OK) {
            sp_errf(err, err_len, st, "tools: function '%s' parameters: %s", name, e2);
            break;
        }
        char head[64];
        snprintf(head, sizeof head, "call-%zu ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws ", i);
        sp_schema_gbnf_raw(b, head);
        json_t *js = json_string(name);
        char *lit = json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT);
        json_decref(js);
        if (lit == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "tools: out of memory");
            break;
        }
        sp_schema_gbnf_literal(b, lit, strlen(lit));
        sp_jfree(lit);
        char tail[128];
        snprintf(tail, sizeof tail, " ws \",\" ws \"\\\"%s\\\"\" ws \":\" ws %s ws \"}\"\n", args_key,
                 rule);
        sp_schema_gbnf_raw(b, tail);
    }
    if (st == SP_OK) {
        switch (f) {
        case SP_CHAT_TOOLS_LLAMA3: sp_schema_gbnf_raw(b, "root ::= call\n"); break;
        case SP_CHAT_TOOLS_MISTRAL:
            sp_schema_gbnf_raw(b, "root ::= \"[TOOL_CALLS]\" ws \"[\" ws call ws \"]\"\n");
            break;
        default:
            sp_schema_gbnf_raw(b, "root ::= \"<tool_call>\" [\\n]? call [\\n]? \"</tool_call>\"\n");
            break;
        }
        sp_schema_gbnf_use_ws(b); /* the calls use the builder's ws rule */
        size_t n_text = 0;
        const char *text = sp_schema_gbnf_text(b, &n_text);
        if (text == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "tools: out of memory");
        } else {
            *out = sp_strndup(text, n_text);
            if (*out == NULL) {
                st = sp_errf(err, err_len, SP_ERR_NOMEM, "tools: out of memory");
            } else if (out_len) {
                *out_len = n_text;
            }
        }
    }
    json_decref(generic);
    sp_schema_gbnf_destroy(b);
    return st;
}
