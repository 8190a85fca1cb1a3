/*
 * toolcall.c - tool calls in model output, and the grammar that forces one
 * (toolcall.h has the contract).
 */
#include "constrain/toolcall.h"

#include <string.h>

#include "core/jfree.h"
#include "core/alloc.h"
#include "constrain/schema.h"

static bool
is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* A cursor over the model's text: p moves, end stays. */
typedef struct cur {
    const char *p, *end;
} cur_t;

static void
skip_ws(cur_t *c)
{
    while (c->p < c->end && is_space(*c->p)) {
        c->p++;
    }
}

/* Consume literal m at the cursor; false (cursor unmoved) when it is not there. */
static bool
eat(cur_t *c, const char *m)
{
    size_t n = strlen(m);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, m, n) != 0) {
        return false;
    }
    c->p += n;
    return true;
}

/* The next occurrence of m at or after the cursor, or NULL. */
static const char *
find(const cur_t *c, const char *m)
{
    return memmem(c->p, (size_t)(c->end - c->p), m, strlen(m));
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

/* One JSON value at the cursor (after blanks), cursor moved past it. */
static json_t *
take_json(cur_t *c)
{
    skip_ws(c);
    size_t used;
    json_t *v = load_one(c->p, (size_t)(c->end - c->p), &used);
    c->p += used;
    return v;
}

/* Append {"name", "arguments": object} to arr (steals args); false when args
 * is not an object (a string holding one is read) or the list is full. */
static bool
push_call(json_t *arr, const char *name, size_t name_len, json_t *args)
{
    if (json_is_string(args)) { /* some models write the arguments as a string */
        json_t *a = json_loads(json_string_value(args), JSON_REJECT_DUPLICATES, NULL);
        json_decref(args);
        args = a;
    }
    if (!json_is_object(args) || name_len == 0 || json_array_size(arr) >= SP_TOOLCALL_MAX_CALLS) {
        json_decref(args);
        return false;
    }
    json_t *n = json_stringn(name, name_len);
    json_t *call = n ? json_pack("{s:o,s:o}", "name", n, "arguments", args) : NULL;
    if (n == NULL) {
        json_decref(args);
    }
    return call != NULL && json_array_append_new(arr, call) == 0;
}

/* One call object ({"name" or "tool_name", "arguments" or "parameters"}) into arr. */
static bool
add_call(json_t *arr, const json_t *v)
{
    if (!json_is_object(v)) {
        return false;
    }
    const json_t *name = json_object_get(v, "name");
    if (name == NULL) {
        name = json_object_get(v, "tool_name");
    }
    const json_t *args = json_object_get(v, "arguments");
    if (args == NULL) {
        args = json_object_get(v, "parameters");
    }
    if (!json_is_string(name)) {
        return false;
    }
    json_t *a = args == NULL ? json_object() : json_incref((json_t *)args);
    return push_call(arr, json_string_value(name), json_string_length(name), a);
}

/* A JSON list of call objects, or one call object, at the cursor. */
static bool
add_list(json_t *arr, cur_t *c)
{
    json_t *v = take_json(c);
    bool ok = v != NULL;
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            ok = ok && add_call(arr, e);
        }
        ok = ok && json_array_size(v) > 0;
    } else if (v != NULL) {
        ok = add_call(arr, v);
    }
    json_decref(v);
    return ok;
}

/* The JSON Schema type a function's parameter declares ("string", ...), or NULL. */
static const char *
param_type(const json_t *tools, const char *fn, size_t fn_len, const char *key, size_t key_len)
{
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *n = json_object_get(f, "name");
        if (json_is_string(n) && json_string_length(n) == fn_len &&
            memcmp(json_string_value(n), fn, fn_len) == 0) {
            const json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
            char k[256];
            if (key_len >= sizeof k) {
                return NULL;
            }
            memcpy(k, key, key_len);
            k[key_len] = '\0';
            return json_string_value(json_object_get(json_object_get(props, k), "type"));
        }
    }
    return NULL;
}

/*
 * An argument written as raw text (the XML families): a string when the
 * function declares the parameter a string, else the JSON value the text
 * spells when it spells one completely, else the text as a string.
 */
static json_t *
arg_value(const char *v, size_t n, const char *type)
{
    if (type == NULL || strcmp(type, "string") != 0) {
        const char *a = v, *b = v + n;
        while (a < b && is_space(*a)) {
            a++;
        }
        while (b > a && is_space(b[-1])) {
            b--;
        }
        json_error_t e;
        json_t *j = json_loadb(a, (size_t)(b - a), JSON_DECODE_ANY, &e);
        if (j != NULL) {
            return j;
        }
    }
    return json_stringn(v, n);
}

/* The shapes ------------------------------------------------------------- */

/* <tool_call>{json}</tool_call>, repeated. */
static void
calls_hermes(cur_t *c, const char *open, const char *close, json_t *arr)
{
    while (eat(c, open)) {
        json_t *v = take_json(c);
        bool ok = v != NULL && add_call(arr, v);
        json_decref(v);
        skip_ws(c);
        if (!ok || !eat(c, close)) {
            return;
        }
        skip_ws(c);
    }
}

/* <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>..</function>\n</tool_call>. */
static void
calls_xml(cur_t *c, const char *open, const char *close, const json_t *tools, json_t *arr)
{
    while (eat(c, open)) {
        skip_ws(c);
        if (!eat(c, "<function=")) {
            return;
        }
        const char *name = c->p, *gt = find(c, ">");
        if (gt == NULL) {
            return;
        }
        size_t name_len = (size_t)(gt - name);
        c->p = gt + 1;
        json_t *args = json_object();
        for (;;) {
            skip_ws(c);
            if (!eat(c, "<parameter=")) {
                break;
            }
            const char *key = c->p, *kgt = find(c, ">");
            if (kgt == NULL) {
                break;
            }
            c->p = kgt + 1;
            const char *ve = find(c, "</parameter>");
            if (ve == NULL) {
                json_decref(args);
                return;
            }
            /* the template writes one newline around the value: not part of it */
            const char *vb = c->p;
            if (vb < ve && *vb == '\n') {
                vb++;
            }
            const char *vend = ve;
            if (vend > vb && vend[-1] == '\n') {
                vend--;
            }
            json_t *v = arg_value(vb, (size_t)(vend - vb),
                                  param_type(tools, name, name_len, key, (size_t)(kgt - key)));
            if (json_object_setn_new(args, key, (size_t)(kgt - key), v) != 0) {
                json_decref(args); /* not UTF-8: no call */
                return;
            }
            c->p = ve + strlen("</parameter>");
        }
        skip_ws(c);
        if (!eat(c, "</function>") || !push_call(arr, name, name_len, args)) {
            return;
        }
        skip_ws(c);
        if (!eat(c, close)) {
            return;
        }
        skip_ws(c);
    }
}

/* <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>..</tool_call> (GLM). */
static void
calls_glm(cur_t *c, const json_t *tools, json_t *arr)
{
    while (eat(c, "<tool_call>")) {
        const char *end = find(c, "</tool_call>");
        if (end == NULL) {
            return;
        }
        cur_t in = {c->p, end};
        const char *name = in.p, *k = find(&in, "<arg_key>");
        const char *name_end = k ? k : end;
        while (name < name_end && is_space(*name)) {
            name++;
        }
        while (name_end > name && is_space(name_end[-1])) {
            name_end--;
        }
        size_t name_len = (size_t)(name_end - name);
        json_t *args = json_object();
        in.p = k ? k : end;
        while (eat(&in, "<arg_key>")) {
            const char *key = in.p, *ke = find(&in, "</arg_key>");
            if (ke == NULL) {
                break;
            }
            in.p = ke + strlen("</arg_key>");
            skip_ws(&in);
            if (!eat(&in, "<arg_value>")) {
                break;
            }
            const char *vb = in.p, *ve = find(&in, "</arg_value>");
            if (ve == NULL) {
                break;
            }
            if (json_object_setn_new(args, key, (size_t)(ke - key),
                                     arg_value(vb, (size_t)(ve - vb),
                                               param_type(tools, name, name_len, key,
                                                          (size_t)(ke - key)))) != 0) {
                json_decref(args); /* not UTF-8: no call */
                return;
            }
            in.p = ve + strlen("</arg_value>");
            skip_ws(&in);
        }
        if (in.p != end || !push_call(arr, name, name_len, args)) {
            return;
        }
        c->p = end + strlen("</tool_call>");
        skip_ws(c);
    }
}

/* [TOOL_CALLS][{..}, ..] (v0.3) or [TOOL_CALLS]NAME[ARGS]{..}, repeated (newer). */
static void
calls_mistral(cur_t *c, json_t *arr)
{
    while (eat(c, "[TOOL_CALLS]")) {
        skip_ws(c);
        if (c->p < c->end && (*c->p == '[' || *c->p == '{')) {
            if (!add_list(arr, c)) {
                return;
            }
        } else {
            const char *name = c->p, *a = find(c, "[ARGS]");
            if (a == NULL) {
                return;
            }
            c->p = a + strlen("[ARGS]");
            if (!push_call(arr, name, (size_t)(a - name), take_json(c))) {
                return;
            }
        }
        skip_ws(c);
    }
}

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

/* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{..}\n```<｜tool▁call▁end｜>..<｜tool▁calls▁end｜>
 * (R1, V3), or <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜> (V3.1). */
static void
calls_deepseek(cur_t *c, json_t *arr)
{
    eat(c, DS_CALLS_BEGIN);
    for (;;) {
        skip_ws(c);
        if (!eat(c, DS_CALL_BEGIN)) {
            return;
        }
        const char *sep = find(c, DS_SEP);
        if (sep == NULL) {
            return;
        }
        const char *name = c->p, *name_end = sep;
        c->p = sep + strlen(DS_SEP);
        bool typed = name_end - name == 8 && memcmp(name, "function", 8) == 0;
        if (typed) { /* the type before the separator, the name after it */
            const char *nl = find(c, "\n");
            if (nl == NULL) {
                return;
            }
            name = c->p;
            name_end = nl;
            c->p = nl + 1;
        }
        bool fenced = eat(c, "```json");
        json_t *args = take_json(c);
        if (!push_call(arr, name, (size_t)(name_end - name), args)) {
            return;
        }
        skip_ws(c);
        if ((fenced && !eat(c, "```")) || !eat(c, DS_CALL_END)) {
            return;
        }
    }
}

/* <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{..}<|tool_call_end|>..<|tool_calls_section_end|> */
static void
calls_kimi(cur_t *c, json_t *arr)
{
    eat(c, "<|tool_calls_section_begin|>");
    for (;;) {
        skip_ws(c);
        if (!eat(c, "<|tool_call_begin|>")) {
            return;
        }
        const char *id = c->p, *ab = find(c, "<|tool_call_argument_begin|>");
        if (ab == NULL) {
            return;
        }
        const char *name = id, *name_end = ab;
        for (const char *q = ab; q > id; q--) { /* drop the ":N" index */
            if (q[-1] == ':') {
                name_end = q - 1;
                break;
            }
        }
        const char *dot = memchr(name, '.', (size_t)(name_end - name));
        if (dot != NULL && (size_t)(dot - name) == 9 && memcmp(name, "functions", 9) == 0) {
            name = dot + 1;
        }
        c->p = ab + strlen("<|tool_call_argument_begin|>");
        if (!push_call(arr, name, (size_t)(name_end - name), take_json(c))) {
            return;
        }
        skip_ws(c);
        if (!eat(c, "<|tool_call_end|>")) {
            return;
        }
    }
}

/* <function=NAME>{..}</function>, repeated; <|python_tag|>CODE is a call of "python". */
static void
calls_functionary31(cur_t *c, json_t *arr)
{
    for (;;) {
        skip_ws(c);
        if (eat(c, "<|python_tag|>")) {
            json_t *code = json_stringn(c->p, (size_t)(c->end - c->p));
            push_call(arr, "python", 6, code ? json_pack("{s:o}", "code", code) : NULL);
            c->p = c->end;
            return;
        }
        if (!eat(c, "<function=")) {
            return;
        }
        const char *name = c->p, *gt = find(c, ">");
        if (gt == NULL) {
            return;
        }
        c->p = gt + 1;
        if (!push_call(arr, name, (size_t)(gt - name), take_json(c))) {
            return;
        }
        skip_ws(c);
        if (!eat(c, "</function>")) {
            return;
        }
    }
}

/* NAME\n{..}, then >>>NAME\n{..} for more (the prompt ends with ">>>"). */
static void
calls_functionary32(cur_t *c, json_t *arr)
{
    do {
        const char *name = c->p, *nl = find(c, "\n");
        if (nl == NULL) {
            return;
        }
        c->p = nl + 1;
        if (!push_call(arr, name, (size_t)(nl - name), take_json(c))) {
            return;
        }
        skip_ws(c);
    } while (eat(c, ">>>"));
}

/* A start marker, then a JSON list of calls or call objects one after the
 * other (MiniMax-M1 writes one a line). */
static void
calls_list(cur_t *c, const char *open, json_t *arr)
{
    if (!eat(c, open)) {
        return;
    }
    do {
        if (!add_list(arr, c)) {
            return;
        }
        skip_ws(c);
    } while (c->p < c->end && (*c->p == '{' || *c->p == '['));
}

/* A Llama 3 call: {"name": .., "parameters": {..}} objects, ';'-separated,
 * maybe after <|python_tag|>, as the whole answer. */
static void
calls_llama3(cur_t *c, json_t *arr)
{
    eat(c, "<|python_tag|>");
    while (c->p < c->end && *c->p == '{') {
        json_t *v = take_json(c);
        bool ok = v != NULL && add_call(arr, v);
        json_decref(v);
        if (!ok) {
            return;
        }
        while (c->p < c->end && (is_space(*c->p) || *c->p == ';')) {
            c->p++;
        }
    }
}

/* The texts that start calls in family f (NULL-terminated). */
static const char *const *
starts(sp_chat_tools_t f)
{
    static const char *const hermes[] = {"<tool_call>", NULL};
    static const char *const seed[] = {"<seed:tool_call>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", NULL};
    static const char *const deepseek[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, NULL};
    static const char *const kimi[] = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>", NULL};
    static const char *const f31[] = {"<function=", "<|python_tag|>", NULL};
    static const char *const f32[] = {">>>", NULL};
    static const char *const command[] = {"<|START_ACTION|>", NULL};
    static const char *const granite[] = {"<|tool_call|>", NULL};
    static const char *const apriel[] = {"<tool_calls>", NULL};
    static const char *const firefunction[] = {"functools[", NULL};
    static const char *const none[] = {NULL};
    switch (f) {
    case SP_CHAT_TOOLS_HERMES:
    case SP_CHAT_TOOLS_QWEN3_CODER:
    case SP_CHAT_TOOLS_GLM: return hermes;
    case SP_CHAT_TOOLS_SEED: return seed;
    case SP_CHAT_TOOLS_MISTRAL: return mistral;
    case SP_CHAT_TOOLS_DEEPSEEK: return deepseek;
    case SP_CHAT_TOOLS_KIMI: return kimi;
    case SP_CHAT_TOOLS_FUNCTIONARY_V31: return f31;
    case SP_CHAT_TOOLS_FUNCTIONARY_V32: return f32;
    case SP_CHAT_TOOLS_COMMAND_R7B: return command;
    case SP_CHAT_TOOLS_GRANITE: return granite;
    case SP_CHAT_TOOLS_APRIEL: return apriel;
    case SP_CHAT_TOOLS_FIREFUNCTION: return firefunction;
    case SP_CHAT_TOOLS_LLAMA3:
    case SP_CHAT_TOOLS_HARMONY: break;
    }
    return none;
}

/* Functionary v3.2 answers in text after "all\n" (its prompt ends with ">>>");
 * the bytes of that header, or 0. */
static size_t
f32_header(const char *text, size_t len)
{
    return len >= 4 && memcmp(text, "all\n", 4) == 0 ? 4 : 0;
}

/* Where calls start (the first start marker after from), or NULL. */
static const char *
first_start(sp_chat_tools_t f, const char *text, size_t len, size_t from)
{
    const char *best = NULL;
    for (const char *const *m = starts(f); *m != NULL; m++) {
        const char *p = memmem(text + from, len - from, *m, strlen(*m));
        if (p != NULL && (best == NULL || p < best)) {
            best = p;
        }
    }
    return best;
}

void
sp_toolcall_parse(sp_chat_tools_t f, const json_t *tools, const char *text, size_t len,
                  json_t **calls, size_t *content_start, size_t *content_end)
{
    *calls = NULL;
    *content_start = 0;
    *content_end = len;
    json_t *arr = json_array();
    if (arr == NULL) {
        return;
    }
    size_t cs = 0;
    const char *at = NULL;
    if (f == SP_CHAT_TOOLS_LLAMA3) {
        size_t i = 0;
        while (i < len && is_space(text[i])) {
            i++;
        }
        at = text + i;
    } else if (f == SP_CHAT_TOOLS_FUNCTIONARY_V32) {
        cs = f32_header(text, len);
        at = cs ? first_start(f, text, len, cs) : text;
        if (cs && at != NULL) {
            at += 3; /* the calls follow ">>>" */
        }
    } else {
        at = first_start(f, text, len, 0);
    }
    *content_start = cs;
    if (at == NULL || at >= text + len) {
        json_decref(arr);
        return;
    }
    cur_t c = {at, text + len};
    switch (f) {
    case SP_CHAT_TOOLS_HERMES: calls_hermes(&c, "<tool_call>", "</tool_call>", arr); break;
    case SP_CHAT_TOOLS_QWEN3_CODER: calls_xml(&c, "<tool_call>", "</tool_call>", tools, arr); break;
    case SP_CHAT_TOOLS_SEED:
        calls_xml(&c, "<seed:tool_call>", "</seed:tool_call>", tools, arr);
        break;
    case SP_CHAT_TOOLS_GLM: calls_glm(&c, tools, arr); break;
    case SP_CHAT_TOOLS_MISTRAL: calls_mistral(&c, arr); break;
    case SP_CHAT_TOOLS_DEEPSEEK: calls_deepseek(&c, arr); break;
    case SP_CHAT_TOOLS_KIMI: calls_kimi(&c, arr); break;
    case SP_CHAT_TOOLS_FUNCTIONARY_V31: calls_functionary31(&c, arr); break;
    case SP_CHAT_TOOLS_FUNCTIONARY_V32: calls_functionary32(&c, arr); break;
    case SP_CHAT_TOOLS_COMMAND_R7B: calls_list(&c, "<|START_ACTION|>", arr); break;
    case SP_CHAT_TOOLS_GRANITE: calls_list(&c, "<|tool_call|>", arr); break;
    case SP_CHAT_TOOLS_APRIEL: calls_list(&c, "<tool_calls>", arr); break;
    case SP_CHAT_TOOLS_FIREFUNCTION: calls_list(&c, "functools", arr); break;
    case SP_CHAT_TOOLS_LLAMA3: calls_llama3(&c, arr); break;
    case SP_CHAT_TOOLS_HARMONY: break; /* channels: answer.c */
    }
    if (json_array_size(arr) == 0) {
        json_decref(arr);
        return;
    }
    *calls = arr;
    /* content is what the model wrote before its first call */
    size_t ce = (size_t)(at - text);
    if (f == SP_CHAT_TOOLS_FUNCTIONARY_V32 && cs) {
        ce -= 3;
    } else if (f == SP_CHAT_TOOLS_LLAMA3) {
        ce = 0; /* only blanks before the call */
    }
    *content_end = ce < cs ? cs : ce;
}

/* Length of the longest suffix of text that is a proper prefix of m. */
static size_t
partial_marker(const char *text, size_t len, const char *m)
{
    size_t mlen = strlen(m);
    for (size_t k = mlen - 1; k > 0; k--) {
        if (k <= len && memcmp(text + len - k, m, k) == 0) {
            return k;
        }
    }
    return 0;
}

size_t
sp_toolcall_safe_prefix(sp_chat_tools_t f, const char *text, size_t len, size_t *content_start,
                        bool *in_call)
{
    *in_call = false;
    *content_start = 0;
    if (f == SP_CHAT_TOOLS_LLAMA3) {
        size_t i = 0;
        while (i < len && is_space(text[i])) {
            i++;
        }
        if (i == len) {
            return 0; /* only blanks so far: a call may still start */
        }
        size_t n = len - i < 14 ? len - i : 14;
        if (text[i] == '{' || memcmp(text + i, "<|python_tag|>", n) == 0) {
            *in_call = true;
            return 0;
        }
        return len;
    }
    size_t from = 0;
    if (f == SP_CHAT_TOOLS_FUNCTIONARY_V32) {
        if (len < 4 && memcmp(text, "all\n", len) == 0) {
            return 0; /* maybe the text header */
        }
        from = f32_header(text, len);
        if (from == 0) {
            *in_call = true; /* a function's name */
            return 0;
        }
        *content_start = from;
    }
    const char *p = first_start(f, text, len, from);
    if (p != NULL) {
        *in_call = true;
        return (size_t)(p - text);
    }
    size_t hold = 0;
    for (const char *const *m = starts(f); *m != NULL; m++) {
        size_t k = partial_marker(text + from, len - from, *m);
        hold = k > hold ? k : hold;
    }
    return len - hold;
}

sp_chat_tools_t
sp_toolcall_grammar_format(sp_chat_tools_t f)
{
    return f == SP_CHAT_TOOLS_LLAMA3 || f == SP_CHAT_TOOLS_MISTRAL ? f : SP_CHAT_TOOLS_HERMES;
}

sp_status_t
sp_toolcall_grammar(sp_chat_tools_t f, const json_t *tools, const char *only, char **out,
                    size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    f = sp_toolcall_grammar_format(f);
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
