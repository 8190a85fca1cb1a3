/*
 * chat.c - chat templates: the built-ins, selection for a model, the
 * messages -> JSON context -> sandboxed render path, and the BOS rule for
 * tokenizing what was rendered.
 *
 * The built-in templates are our own Jinja, written to produce the prompt
 * formats the model families document (they are run by the same engine as a
 * file's template, so they exercise it too). Where a family has no system
 * role (gemma) or puts it in a user turn (llama2, mistral), the system text
 * is folded into a user turn instead of failing.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "chat/chat.h"
#include "chat/jinja_impl.h"

struct sp_chat_template {
    sp_jinja_t *j;
    const char *name; /* static */
    sp_chat_tools_t tools; /* how its models write tool calls (from the source) */
    sp_chat_reasoning_t reasoning; /* and their thinking */
    bool has_developer; /* the source names a developer role; else developer goes as system */
    char *src;        /* the source (NUL-terminated copy), for those who show it */
    size_t src_len;
};

/* ---- built-ins -------------------------------------------------------- */
/* Shared prologue: split off a leading system message. */
#define SPLIT_SYSTEM                                                                       \
    "{%- if messages and messages[0]['role'] == 'system' -%}"                              \
    "{%- set system = messages[0]['content'] | trim -%}{%- set msgs = messages[1:] -%}"    \
    "{%- else -%}{%- set system = none -%}{%- set msgs = messages -%}{%- endif -%}"

/* The `tools` (OpenAI's list) as a block of text for the system prompt, in
 * tools_text: one JSON signature a line and the call format (Hermes style). */
#define TOOLS_TEXT                                                                         \
    "{%- set tools_text = none -%}"                                                        \
    "{%- if tools is defined and tools -%}"                                                \
    "{%- set tns = namespace(t='You can call these functions:\\n') -%}"                   \
    "{%- for t in tools -%}{%- set tns.t = tns.t ~ (t | tojson) ~ '\\n' -%}{%- endfor -%}" \
    "{%- set tools_text = tns.t ~ 'To call one, answer with <tool_call>{\"name\": NAME, "  \
    "\"arguments\": {...}}</tool_call>.' -%}"                                              \
    "{%- endif -%}"

static const struct {
    const char *name;
    const char *src;
} builtins[] = {
    /* Llama 2 chat: <s>[INST] <<SYS>>\n...\n<</SYS>>\n\nuser [/INST] answer </s> */
    {"llama2",
     SPLIT_SYSTEM
     TOOLS_TEXT
     "{%- if tools_text is not none -%}"
     "{%- set system = tools_text if system is none else system ~ '\\n\\n' ~ tools_text -%}"
     "{%- endif -%}"
     "{%- set ns = namespace(system=system) -%}"
     "{%- for m in msgs -%}"
     "{%- if m['role'] == 'user' or m['role'] == 'tool' -%}"
     "{%- set text = m['content'] | trim -%}"
     "{%- if m['role'] == 'tool' -%}"
     "{%- set text = '<tool_response>' ~ text ~ '</tool_response>' -%}"
     "{%- endif -%}"
     "{%- if ns.system is not none -%}"
     "{%- set text = '<<SYS>>\\n' ~ ns.system ~ '\\n<</SYS>>\\n\\n' ~ text -%}"
     "{%- set ns.system = none -%}"
     "{%- endif -%}"
     "{{- bos_token ~ '[INST] ' ~ text ~ ' [/INST]' -}}"
     "{%- elif m['role'] == 'assistant' -%}"
     "{{- ' ' ~ ((m['content'] or '') | trim) -}}"
     "{%- if m['tool_calls'] is defined -%}"
     "{%- for c in m['tool_calls'] -%}"
     "{%- set f = c['function'] if c['function'] is defined else c -%}"
     "{{- '<tool_call>{\"name\": \"' ~ f['name'] ~ '\", \"arguments\": ' -}}"
     "{{- (f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) -}}"
     "{{- '}</tool_call>' -}}"
     "{%- endfor -%}"
     "{%- endif -%}"
     "{{- ' ' ~ eos_token -}}"
     "{%- else -%}"
     "{{- raise_exception('the llama2 template has no ' ~ m['role'] ~ ' role') -}}"
     "{%- endif -%}"
     "{%- endfor -%}"},
    /* Llama 3 / 3.1 instruct; tool results are the ipython role. */
    {"llama3",
     "{{- bos_token -}}"
     "{%- for m in messages -%}"
     "{%- set role = 'ipython' if m['role'] == 'tool' else m['role'] -%}"
     "{{- '<|start_header_id|>' ~ role ~ '<|end_header_id|>\\n\\n' -}}"
     "{%- if m['tool_calls'] is defined -%}"
     "{%- for c in m['tool_calls'] -%}"
     "{%- set f = c['function'] if c['function'] is defined else c -%}"
     "{{- '{\"name\": \"' ~ f['name'] ~ '\", \"parameters\": ' -}}"
     "{{- (f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) ~ '}' -}}"
     "{%- endfor -%}"
     "{%- else -%}"
     "{{- (m['content'] or '') | trim -}}"
     "{%- endif -%}"
     "{{- '<|eot_id|>' -}}"
     "{%- endfor -%}"
     "{%- if add_generation_prompt -%}"
     "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
     "{%- endif -%}"},
    /* ChatML (Qwen, Hermes, SmolLM, ...), with Hermes-style tool calls. */
    {"chatml",
     TOOLS_TEXT
     "{%- if tools_text is not none and not (messages and messages[0]['role'] == 'system') -%}"
     "{{- '<|im_start|>system\\n' ~ tools_text ~ '<|im_end|>\\n' -}}"
     "{%- endif -%}"
     "{%- for m in messages -%}"
     "{{- '<|im_start|>' ~ m['role'] -}}"
     "{%- if m['content'] or m['tool_calls'] is not defined -%}"
     "{{- '\\n' ~ (m['content'] or '') -}}"
     "{%- endif -%}"
     "{%- if loop.first and m['role'] == 'system' and tools_text is not none -%}"
     "{{- '\\n\\n' ~ tools_text -}}"
     "{%- endif -%}"
     "{%- if m['tool_calls'] is defined -%}"
     "{%- for c in m['tool_calls'] -%}"
     "{%- set f = c['function'] if c['function'] is defined else c -%}"
     "{{- '\\n<tool_call>\\n{\"name\": \"' ~ f['name'] ~ '\", \"arguments\": ' -}}"
     "{{- (f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) -}}"
     "{{- '}\\n</tool_call>' -}}"
     "{%- endfor -%}"
     "{%- endif -%}"
     "{{- '<|im_end|>\\n' -}}"
     "{%- endfor -%}"
     "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"},
    /* Mistral Instruct v0.3: the system text goes in front of the last user turn. */
    {"mistral",
     SPLIT_SYSTEM
     "{%- set ns = namespace(last=-1) -%}"
     "{%- for m in msgs -%}"
     "{%- if m['role'] == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}"
     "{%- endfor -%}"
     "{{- bos_token -}}"
     "{%- for m in msgs -%}"
     "{%- if m['role'] == 'user' -%}"
     "{%- if loop.index0 == ns.last and system is not none -%}"
     "{{- '[INST] ' ~ system ~ '\\n\\n' ~ m['content'] ~ '[/INST]' -}}"
     "{%- else -%}"
     "{{- '[INST] ' ~ m['content'] ~ '[/INST]' -}}"
     "{%- endif -%}"
     "{%- elif m['role'] == 'assistant' -%}"
     "{{- ' ' ~ ((m['content'] or '') | trim) ~ eos_token -}}"
     "{%- else -%}"
     "{{- raise_exception('the mistral template has no ' ~ m['role'] ~ ' role') -}}"
     "{%- endif -%}"
     "{%- endfor -%}"},
    /* Gemma: user/model turns; a system message joins the first user turn. */
    {"gemma",
     "{{- bos_token -}}"
     SPLIT_SYSTEM
     "{%- set ns = namespace(system=system) -%}"
     "{%- for m in msgs -%}"
     "{%- if m['role'] != 'user' and m['role'] != 'assistant' -%}"
     "{{- raise_exception('the gemma template has no ' ~ m['role'] ~ ' role') -}}"
     "{%- endif -%}"
     "{%- set role = 'model' if m['role'] == 'assistant' else 'user' -%}"
     "{%- set text = (m['content'] or '') | trim -%}"
     "{%- if role == 'user' and ns.system is not none -%}"
     "{%- set text = ns.system ~ '\\n\\n' ~ text -%}"
     "{%- set ns.system = none -%}"
     "{%- endif -%}"
     "{{- '<start_of_turn>' ~ role ~ '\\n' ~ text ~ '<end_of_turn>\\n' -}}"
     "{%- endfor -%}"
     "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"},
    /* Phi-3 / 3.5 instruct. */
    {"phi3",
     "{%- for m in messages -%}"
     "{%- if m['role'] not in ['system', 'user', 'assistant'] -%}"
     "{{- raise_exception('the phi3 template has no ' ~ m['role'] ~ ' role') -}}"
     "{%- endif -%}"
     "{{- '<|' ~ m['role'] ~ '|>\\n' ~ (m['content'] or '') ~ '<|end|>\\n' -}}"
     "{%- endfor -%}"
     "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}"
     "{%- else -%}{{- eos_token -}}{%- endif -%}"},
    /* Zephyr (and TinyLlama chat): <|role|>\ntext</s>\n */
    {"zephyr",
     "{%- for m in messages -%}"
     "{%- if m['role'] not in ['system', 'user', 'assistant'] -%}"
     "{{- raise_exception('the zephyr template has no ' ~ m['role'] ~ ' role') -}}"
     "{%- endif -%}"
     "{{- '<|' ~ m['role'] ~ '|>\\n' ~ (m['content'] or '') ~ eos_token ~ '\\n' -}}"
     "{%- endfor -%}"
     "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"},
};

#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

const char *const *
sp_chat_builtin_names(size_t *n)
{
    static const char *names[N_BUILTINS];
    for (size_t i = 0; i < N_BUILTINS; i++) {
        names[i] = builtins[i].name;
    }
    *n = N_BUILTINS;
    return names;
}

static sp_status_t
make(const char *src, size_t len, const char *name, sp_chat_template_t **out, char *err,
     size_t err_len)
{
    *out = NULL;
    if (len > SP_CHAT_MAX_TEMPLATE_BYTES) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE,
                       "chat template: %zu bytes, the limit is %u", len,
                       SP_CHAT_MAX_TEMPLATE_BYTES);
    }
    sp_chat_template_t *t = sp_calloc(1, sizeof *t);
    if (t == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "chat template: out of memory");
    }
    char msg[256];
    sp_status_t st = sp_jinja_compile(src, len, &t->j, msg, sizeof msg);
    if (st != SP_OK) {
        sp_free(t);
        return sp_errf(err, err_len, st, "chat template (%s): %s", name, msg);
    }
    t->name = name;
    t->src = sp_malloc(len + 1);
    if (t->src == NULL) {
        sp_jinja_destroy(t->j);
        sp_free(t);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "chat template: out of memory");
    }
    memcpy(t->src, src, len);
    t->src[len] = '\0';
    t->src_len = len;
    /* The tool-call and reasoning conventions, from what the template writes. */
    sp_chat_detect_family(src, len, &t->tools, &t->reasoning);
    t->has_developer = memmem(src, len, "developer", 9) != NULL;
    *out = t;
    return SP_OK;
}

sp_status_t
sp_chat_template_compile(const char *src, size_t len, sp_chat_template_t **out, char *err,
                         size_t err_len)
{
    return make(src, len, "custom", out, err, err_len);
}

sp_status_t
sp_chat_template_builtin(const char *name, sp_chat_template_t **out, char *err, size_t err_len)
{
    *out = NULL;
    for (size_t i = 0; name != NULL && i < N_BUILTINS; i++) {
        if (strcmp(name, builtins[i].name) == 0) {
            return make(builtins[i].src, strlen(builtins[i].src), builtins[i].name, out, err,
                        err_len);
        }
    }
    return sp_errf(err, err_len, SP_ERR_NOT_FOUND,
                   "unknown chat template '%s' (built-ins: llama2, llama3, chatml, mistral, gemma, "
                   "phi3, zephyr)", name != NULL ? name : "(null)");
}

static bool
has_token(const sp_gguf_arr_t *toks, const char *s)
{
    size_t n = strlen(s);
    for (uint64_t i = 0; i < toks->n; i++) {
        if (toks->strs[i].len == n && memcmp(toks->strs[i].ptr, s, n) == 0) {
            return true;
        }
    }
    return false;
}

static bool
str_has(sp_str_t s, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= s.len; i++) {
        size_t k = 0;
        while (k < n && (s.ptr[i + k] | 0x20) == (needle[k] | 0x20)) {
            k++;
        }
        if (k == n) {
            return true;
        }
    }
    return false;
}

const char *
sp_chat_detect_builtin(const sp_gguf_t *g)
{
    sp_gguf_arr_t toks;
    sp_str_t arch = {"", 0}, name = {"", 0};
    if (g == NULL) {
        return "chatml";
    }
    (void)sp_gguf_get_str(g, "general.architecture", &arch, NULL, 0);
    (void)sp_gguf_get_str(g, "general.name", &name, NULL, 0);
    if (sp_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL, 0) == SP_OK && toks.strs != NULL) {
        if (has_token(&toks, "<|eot_id|>")) {
            return "llama3";
        }
        if (has_token(&toks, "<|im_start|>")) {
            return "chatml";
        }
        if (has_token(&toks, "<start_of_turn>")) {
            return "gemma";
        }
        if (has_token(&toks, "<|end|>") && has_token(&toks, "<|assistant|>")) {
            return "phi3";
        }
        if (has_token(&toks, "[INST]")) {
            return "mistral";
        }
        if (has_token(&toks, "<|user|>")) {
            return "zephyr";
        }
    }
    if (str_has(name, "zephyr") || str_has(name, "tinyllama")) {
        return "zephyr";
    }
    if (str_has(name, "mistral")) {
        return "mistral";
    }
    if (str_has(arch, "gemma")) {
        return "gemma";
    }
    if (str_has(arch, "phi3")) {
        return "phi3";
    }
    if (arch.len == 5 && memcmp(arch.ptr, "llama", 5) == 0) {
        return "llama2";
    }
    return "chatml";
}

sp_status_t
sp_chat_template_from_gguf(const sp_gguf_t *g, const char *name, sp_chat_template_t **out,
                           char *err, size_t err_len)
{
    *out = NULL;
    if (name != NULL) {
        return sp_chat_template_builtin(name, out, err, err_len);
    }
    sp_str_t src;
    sp_status_t st = g != NULL ? sp_gguf_get_str(g, "tokenizer.chat_template", &src, err, err_len)
                               : SP_ERR_NOT_FOUND;
    if (st == SP_OK) {
        return make(src.ptr, src.len, "gguf", out, err, err_len);
    }
    if (st != SP_ERR_NOT_FOUND) {
        return st;
    }
    return sp_chat_template_builtin(sp_chat_detect_builtin(g), out, err, err_len);
}

sp_chat_tools_t
sp_chat_tool_format(const sp_chat_template_t *t)
{
    return t != NULL ? t->tools : SP_CHAT_TOOLS_HERMES;
}

sp_chat_reasoning_t
sp_chat_reasoning_format(const sp_chat_template_t *t)
{
    return t != NULL ? t->reasoning : SP_CHAT_REASONING_NONE;
}

const char *
sp_chat_template_name(const sp_chat_template_t *t)
{
    return t != NULL ? t->name : "";
}

void
sp_chat_template_destroy(sp_chat_template_t *t)
{
    if (t == NULL) {
        return;
    }
    sp_jinja_destroy(t->j);
    sp_free(t->src);
    sp_free(t);
}

const char *
sp_chat_template_source(const sp_chat_template_t *t, size_t *len)
{
    *len = t != NULL ? t->src_len : 0;
    return t != NULL ? t->src : "";
}

/* ---- the JSON context ------------------------------------------------- */
typedef struct cbuf {
    char *p;
    size_t n, cap;
    bool bad; /* out of memory or over SP_CHAT_MAX_CONTEXT_BYTES */
    bool big;
} cbuf_t;

static void
put(cbuf_t *b, const char *s, size_t n)
{
    if (b->bad) {
        return;
    }
    if (n > SP_CHAT_MAX_CONTEXT_BYTES || b->n + n > SP_CHAT_MAX_CONTEXT_BYTES) {
        b->bad = b->big = true;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap < 1024 ? 1024 : b->cap;
        while (cap < b->n + n + 1) {
            cap *= 2;
        }
        char *p = sp_realloc(b->p, cap);
        if (p == NULL) {
            b->bad = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void
puts_(cbuf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

/* A JSON string; the text is valid UTF-8 (checked by the caller). */
static void
put_json_str(cbuf_t *b, const char *s)
{
    puts_(b, "\"");
    size_t run = 0, i = 0;
    for (; s[i] != '\0'; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        put(b, s + i - run, run);
        run = 0;
        char esc[8];
        switch (c) {
        case '"': puts_(b, "\\\""); break;
        case '\\': puts_(b, "\\\\"); break;
        case '\n': puts_(b, "\\n"); break;
        case '\r': puts_(b, "\\r"); break;
        case '\t': puts_(b, "\\t"); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            puts_(b, esc);
        }
    }
    put(b, s + i - run, run);
    puts_(b, "\"");
}

static const char *
check_text(const char *s)
{
    size_t n = strlen(s);
    return sp_utf8_invalid_at(s, n) == n ? NULL : "is not valid UTF-8";
}

static sp_status_t
check_message(const sp_chat_msg_t *m, size_t i, char *err, size_t err_len)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    if (m->role == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "message %zu: missing role", i);
    }
    bool known = false;
    for (size_t r = 0; r < 5 && !known; r++) {
        known = strcmp(m->role, roles[r]) == 0;
    }
    if (!known) {
        char shown[40];
        snprintf(shown, sizeof shown, "%s", m->role);
        for (char *p = shown; *p != '\0'; p++) {
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) {
                *p = '?';
            }
        }
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "message %zu: unknown role '%s' (system, developer, user, assistant or tool)", i,
                       shown);
    }
    if (m->content == NULL && !(m->tool_calls != NULL && strcmp(m->role, "assistant") == 0)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "message %zu (%s): missing content", i,
                       m->role);
    }
    const char *fields[] = {m->content, m->name, m->tool_call_id};
    const char *names[] = {"content", "name", "tool_call_id"};
    for (size_t f = 0; f < 3; f++) {
        const char *why = fields[f] != NULL ? check_text(fields[f]) : NULL;
        if (why != NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "message %zu: %s %s", i, names[f], why);
        }
    }
    if (m->tool_calls != NULL) {
        char msg[160];
        size_t len = strlen(m->tool_calls);
        const char *p = m->tool_calls;
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') {
            p++;
        }
        if (*p != '[') {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "message %zu: tool_calls must be a JSON array", i);
        }
        if (sp_jinja_json_check(m->tool_calls, len, msg, sizeof msg) != SP_OK) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "message %zu: tool_calls: %s", i, msg);
        }
    }
    return SP_OK;
}

static sp_status_t
check_json_arg(const char *json, char open, const char *what, char *err, size_t err_len)
{
    const char *p = json;
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') {
        p++;
    }
    if (*p != open) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s must be a JSON %s", what,
                       open == '[' ? "array" : "object");
    }
    char msg[160];
    if (sp_jinja_json_check(json, strlen(json), msg, sizeof msg) != SP_OK) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: %s", what, msg);
    }
    return SP_OK;
}

/* {"<extra keys>", "messages": [...], "add_generation_prompt": b, "bos_token": ..., ...}
 * The extra object's keys come first, so ours win (the last copy of a key counts). */
static sp_status_t
build_context(const sp_chat_template_t *t, const sp_chat_msg_t *msgs, size_t n,
              const sp_chat_params_t *p, cbuf_t *b, char *err, size_t err_len)
{
    puts_(b, "{");
    if (p->extra_json != NULL) {
        const char *s = p->extra_json, *e = s + strlen(s);
        while (*s != '{') {
            s++; /* checked: the first non-blank is '{' */
        }
        while (e > s && *(e - 1) != '}') {
            e--;
        }
        /* Inner text of the object; skip it when empty. */
        const char *in = s + 1, *ie = e - 1;
        while (in < ie && (*in == ' ' || *in == '\n' || *in == '\r' || *in == '\t')) {
            in++;
        }
        if (in < ie) {
            put(b, in, (size_t)(ie - in));
            puts_(b, ", ");
        }
    }
    puts_(b, "\"messages\": [");
    for (size_t i = 0; i < n; i++) {
        const sp_chat_msg_t *m = &msgs[i];
        puts_(b, i > 0 ? ", {\"role\": " : "{\"role\": ");
        /* OpenAI's developer role is the system prompt of templates that have no
         * developer role of their own */
        put_json_str(b, strcmp(m->role, "developer") == 0 && !t->has_developer ? "system" : m->role);
        puts_(b, ", \"content\": ");
        if (m->content != NULL) {
            put_json_str(b, m->content);
        } else {
            puts_(b, "null");
        }
        /* Optional fields are left out when absent: templates test `'tool_calls' in message`. */
        if (m->tool_calls != NULL) {
            puts_(b, ", \"tool_calls\": ");
            puts_(b, m->tool_calls);
        }
        if (m->name != NULL) {
            puts_(b, ", \"name\": ");
            put_json_str(b, m->name);
        }
        if (m->tool_call_id != NULL) {
            puts_(b, ", \"tool_call_id\": ");
            put_json_str(b, m->tool_call_id);
        }
        puts_(b, "}");
    }
    puts_(b, "], \"add_generation_prompt\": ");
    puts_(b, p->add_generation_prompt ? "true" : "false");
    puts_(b, ", \"bos_token\": ");
    put_json_str(b, p->bos_text != NULL ? p->bos_text : "");
    puts_(b, ", \"eos_token\": ");
    put_json_str(b, p->eos_text != NULL ? p->eos_text : "");
    /* Hugging Face passes tools and documents always, None when absent:
     * templates test `tools is not none` as often as `tools is defined` */
    puts_(b, ", \"tools\": ");
    puts_(b, p->tools_json != NULL ? p->tools_json : "null");
    puts_(b, ", \"documents\": null");
    puts_(b, "}");
    if (b->bad) {
        return b->big ? sp_errf(err, err_len, SP_ERR_TOO_LARGE,
                                "chat: messages over %u bytes", SP_CHAT_MAX_CONTEXT_BYTES)
                      : sp_errf(err, err_len, SP_ERR_NOMEM, "chat: out of memory");
    }
    return SP_OK;
}

sp_status_t
sp_chat_apply_ex(const sp_chat_template_t *t, const sp_chat_msg_t *msgs, size_t n,
                 const sp_chat_params_t *p, char **out, size_t *out_len, char *err,
                 size_t err_len)
{
    *out = NULL;
    if (out_len != NULL) {
        *out_len = 0;
    }
    if (t == NULL || p == NULL || (msgs == NULL && n > 0)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "chat: missing template or messages");
    }
    sp_status_t st;
    for (size_t i = 0; i < n; i++) {
        if ((st = check_message(&msgs[i], i, err, err_len)) != SP_OK) {
            return st;
        }
    }
    const char *tokens[] = {p->bos_text, p->eos_text};
    for (size_t i = 0; i < 2; i++) {
        if (tokens[i] != NULL && check_text(tokens[i]) != NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "chat: %s_token is not valid UTF-8",
                           i == 0 ? "bos" : "eos");
        }
    }
    if (p->tools_json != NULL &&
        (st = check_json_arg(p->tools_json, '[', "tools", err, err_len)) != SP_OK) {
        return st;
    }
    if (p->extra_json != NULL &&
        (st = check_json_arg(p->extra_json, '{', "chat template variables", err, err_len)) !=
            SP_OK) {
        return st;
    }
    cbuf_t b = {0};
    st = build_context(t, msgs, n, p, &b, err, err_len);
    if (st == SP_OK) {
        char msg[320];
        st = sp_jinja_render_json(t->j, b.p, b.n, p->opts, out, out_len, msg, sizeof msg);
        if (st != SP_OK) {
            sp_errf(err, err_len, st, "chat template (%s): %s", t->name, msg);
        }
    }
    sp_free(b.p);
    return st;
}

sp_status_t
sp_chat_apply(const sp_chat_template_t *t, const sp_chat_msg_t *msgs, size_t n,
              bool add_generation_prompt, const char *bos_text, const char *eos_text, char **out,
              size_t *out_len, char *err, size_t err_len)
{
    sp_chat_params_t p = {add_generation_prompt, bos_text, eos_text, NULL, NULL, NULL};
    return sp_chat_apply_ex(t, msgs, n, &p, out, out_len, err, err_len);
}

bool
sp_chat_add_bos(const sp_tokenizer_t *tok, const char *rendered, size_t len)
{
    if (!sp_tokenizer_add_bos(tok)) {
        return false;
    }
    int32_t bos = sp_tokenizer_bos(tok);
    if (rendered == NULL || bos < 0) {
        return true;
    }
    sp_str_t text = sp_tokenizer_token_text(tok, bos);
    return text.len == 0 || len < text.len || memcmp(rendered, text.ptr, text.len) != 0;
}
