/*
 * tokenize_routes.c - llama-server's routes for seeing what a model is fed:
 *
 *   POST /apply-template  {"messages": [...], "tools"?, "add_generation_prompt"?,
 *                          "chat_template_kwargs"?} -> {"prompt": "..."}
 *   POST /tokenize        {"content": "...", "add_special"?, "parse_special"?,
 *                          "with_pieces"?} -> {"tokens": [...]}
 *   POST /detokenize      {"tokens": [...]} -> {"content": "..."}
 *
 * Each takes an optional "model" (the served model's name); without it the
 * one language model served is used, and several make it a 400. The prompt
 * of /apply-template is the one /v1/chat/completions renders for the same
 * messages and tools (same template, bos/eos texts, generation prompt).
 *
 * Threads: handlers run on the event loop that owns the request; the work is
 * bounded (the body limit bounds the text, the template engine its steps and
 * output), so it is done there, like the other short answers. Memory: the
 * parsed body (jansson), the rendered prompt (sp_malloc) and the token arrays
 * live for the handler call only; the model reference is released before it
 * returns.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/jfree.h"
#include "core/json.h"
#include "core/utf8.h"
#include "chat/chat.h"
#include "text/tokenizer.h"
#include "api/api.h"

/* The body as a JSON object, or NULL after answering 400. */
static json_t *
parse_body(sp_serving_t *s, sp_http_req_t *r)
{
    sp_str_t body = sp_http_req_body(r);
    if (body.len == 0) {
        sp_api_error(r, 400, NULL, NULL, NULL,
                     "the request body is empty (a JSON object is expected)");
        return NULL;
    }
    json_t *root;
    char err[512];
    if (sp_json_parse(body.ptr, body.len, s->cfg.json_depth, &root, err, sizeof err) != SP_OK) {
        sp_api_error(r, 400, NULL, NULL, NULL, "%s", err);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        sp_api_error(r, 400, NULL, NULL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* The language model the body names, or the only one served. NULL after
 * answering (or parking the request while the named model loads). */
static sp_served_model_t *
pick_model(sp_serving_t *s, sp_http_req_t *r, const json_t *b, sp_route_fn retry,
           const sp_route_params_t *p)
{
    const json_t *mv = json_object_get(b, "model");
    sp_served_model_t *m = NULL;
    if (mv != NULL && !json_is_null(mv)) {
        if (!json_is_string(mv)) {
            sp_api_error(r, 400, NULL, "model", NULL, "'model' must be a string");
            return NULL;
        }
        sp_str_t none = {NULL, 0};
        if (!sp_api_model_for(s, r, json_string_value(mv), json_string_length(mv), none, retry,
                              p, &m)) {
            return NULL;
        }
    } else {
        sp_served_model_t **all = NULL;
        int n = sp_registry_snapshot(s, &all);
        int n_llm = 0;
        char names[256] = "";
        for (int i = 0; i < n; i++) {
            if (all[i]->be == NULL && all[i]->tok != NULL) {
                size_t k = strlen(names);
                snprintf(names + k, sizeof names - k, "%s%s", n_llm ? ", " : "", all[i]->name);
                if (n_llm++ == 0) {
                    m = all[i];
                    continue; /* keep this reference */
                }
            }
            sp_served_release(all[i]);
        }
        sp_free(all);
        if (n_llm != 1) {
            if (m != NULL) {
                sp_served_release(m);
            }
            if (n_llm == 0) {
                sp_api_error(r, 404, NULL, "model", "model_not_found",
                             "no language model is served");
            } else {
                sp_api_error(r, 400, NULL, "model", NULL,
                             "'model' is required: %d language models are served (%s)", n_llm,
                             names);
            }
            return NULL;
        }
    }
    if (m->be != NULL || m->tok == NULL) {
        sp_api_error(r, 400, NULL, "model", "model_not_generative",
                     "the model %s is not a language model: it has no tokenizer", m->name);
        sp_served_release(m);
        return NULL;
    }
    return m;
}

/* An optional boolean field: *out keeps its default when absent; false after answering. */
static bool
opt_bool(sp_http_req_t *r, const json_t *b, const char *key, bool *out)
{
    const json_t *v = json_object_get(b, key);
    if (v == NULL || json_is_null(v)) {
        return true;
    }
    if (!json_is_boolean(v)) {
        sp_api_error(r, 400, NULL, key, NULL, "'%s' must be a boolean", key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

/* ---- /tokenize ---------------------------------------------------------- */

static void
h_tokenize(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = parse_body(s, r);
    if (b == NULL) {
        return;
    }
    sp_served_model_t *m = NULL;
    int32_t *ids = NULL;
    sp_jbuf_t out;
    sp_jbuf_init(&out);
    const json_t *c = json_object_get(b, "content");
    bool add_special = false, parse_special = true, with_pieces = false;
    if (!json_is_string(c)) {
        sp_api_error(r, 400, NULL, "content", NULL, "'content' must be a string");
        goto done;
    }
    if (!opt_bool(r, b, "add_special", &add_special) ||
        !opt_bool(r, b, "parse_special", &parse_special) ||
        !opt_bool(r, b, "with_pieces", &with_pieces)) {
        goto done;
    }
    if ((m = pick_model(s, r, b, h_tokenize, p)) == NULL) {
        goto done;
    }
    const char *text = json_string_value(c);
    size_t len = json_string_length(c);
    int64_t n = sp_tokenizer_encode(m->tok, text, len, add_special, parse_special, NULL, 0);
    if (n >= 0) {
        ids = sp_malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
        n = ids == NULL ? SP_ERR_NOMEM
                        : sp_tokenizer_encode(m->tok, text, len, add_special, parse_special, ids, n);
    }
    if (n < 0) {
        sp_api_error(r, n == SP_ERR_NOMEM ? 503 : 400, NULL, "content", NULL,
                     "cannot tokenize the content: %s", sp_status_str((sp_status_t)n));
        goto done;
    }
    sp_jbuf_lit(&out, "{\"tokens\":[");
    for (int64_t i = 0; i < n; i++) {
        if (i > 0) {
            sp_jbuf_lit(&out, ",");
        }
        if (!with_pieces) {
            sp_jbuf_int(&out, ids[i]);
            continue;
        }
        /* llama-server's shape: the piece as a string when it is valid UTF-8,
         * else its bytes as a list of numbers */
        char piece[SP_TOKEN_MAX_BYTES];
        int32_t k = sp_tokenizer_piece(m->tok, ids[i], true, piece, (int32_t)sizeof piece);
        if (k < 0 || k > (int32_t)sizeof piece) {
            k = 0;
        }
        sp_jbuf_printf(&out, "{\"id\":%d,\"piece\":", (int)ids[i]);
        if (sp_utf8_invalid_at(piece, (size_t)k) == (size_t)k) {
            sp_jbuf_str(&out, piece, (size_t)k);
        } else {
            sp_jbuf_lit(&out, "[");
            for (int32_t j = 0; j < k; j++) {
                sp_jbuf_printf(&out, "%s%u", j ? "," : "", (unsigned)(unsigned char)piece[j]);
            }
            sp_jbuf_lit(&out, "]");
        }
        sp_jbuf_lit(&out, "}");
    }
    sp_jbuf_lit(&out, "]}");
    sp_api_reply_json(r, 200, &out);
done:
    sp_free(ids);
    sp_jbuf_free(&out);
    if (m != NULL) {
        sp_served_release(m);
    }
    json_decref(b);
}

/* ---- /detokenize -------------------------------------------------------- */

static void
h_detokenize(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = parse_body(s, r);
    if (b == NULL) {
        return;
    }
    sp_served_model_t *m = NULL;
    sp_jbuf_t text, out;
    sp_jbuf_init(&text);
    sp_jbuf_init(&out);
    const json_t *toks = json_object_get(b, "tokens");
    if (!json_is_array(toks)) {
        sp_api_error(r, 400, NULL, "tokens", NULL, "'tokens' must be a list of token ids");
        goto done;
    }
    if ((m = pick_model(s, r, b, h_detokenize, p)) == NULL) {
        goto done;
    }
    int32_t n_vocab = sp_tokenizer_n_vocab(m->tok);
    for (size_t i = 0; i < json_array_size(toks); i++) {
        const json_t *v = json_array_get(toks, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= n_vocab) {
            sp_api_error(r, 400, NULL, "tokens", NULL,
                         "tokens[%zu] is not a token id of the model %s (0..%d)", i, m->name,
                         (int)n_vocab - 1);
            goto done;
        }
        char piece[SP_TOKEN_MAX_BYTES];
        /* control tokens are written as their text, as llama-server does */
        int32_t k = sp_tokenizer_piece(m->tok, (int32_t)json_integer_value(v), true, piece,
                                       (int32_t)sizeof piece);
        if (k > 0 && k <= (int32_t)sizeof piece) {
            sp_jbuf_raw(&text, piece, (size_t)k);
        }
    }
    if (text.oom) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        goto done;
    }
    sp_jbuf_lit(&out, "{\"content\":");
    /* pieces may split a character: invalid bytes are sent as U+FFFD */
    sp_jbuf_str(&out, text.p != NULL ? text.p : "", text.len);
    sp_jbuf_lit(&out, "}");
    sp_api_reply_json(r, 200, &out);
done:
    sp_jbuf_free(&text);
    sp_jbuf_free(&out);
    if (m != NULL) {
        sp_served_release(m);
    }
    json_decref(b);
}

/* ---- /apply-template ---------------------------------------------------- */

/* messages[i].content as a C string in store (NUL-terminated; *off its start,
 * SIZE_MAX for null): a string, or a list of {"type": "text"} parts joined,
 * as /v1/chat/completions takes it. false after answering. */
static bool
content_of(sp_http_req_t *r, const json_t *c, size_t i, sp_jbuf_t *store, size_t *off)
{
    *off = SIZE_MAX;
    if (c == NULL || json_is_null(c)) {
        return true;
    }
    size_t start = store->len;
    if (json_is_string(c)) {
        sp_jbuf_raw(store, json_string_value(c), json_string_length(c));
    } else if (json_is_array(c)) {
        for (size_t k = 0; k < json_array_size(c); k++) {
            const json_t *part = json_array_get(c, k);
            const char *type = json_string_value(json_object_get(part, "type"));
            const json_t *text = json_object_get(part, "text");
            if (type == NULL || strcmp(type, "text") != 0 || !json_is_string(text)) {
                sp_api_error(r, 400, NULL, "messages", NULL,
                             "messages[%zu].content: only parts {\"type\": \"text\", "
                             "\"text\": ...} are supported", i);
                return false;
            }
            sp_jbuf_raw(store, json_string_value(text), json_string_length(text));
        }
    } else {
        sp_api_error(r, 400, NULL, "messages", NULL,
                     "messages[%zu].content must be a string or a list of parts", i);
        return false;
    }
    if (memchr(store->p != NULL ? store->p + start : "", '\0', store->len - start) != NULL) {
        sp_api_error(r, 400, NULL, "messages", NULL, "messages[%zu].content may not contain NUL",
                     i);
        return false;
    }
    sp_jbuf_raw(store, "", 1); /* the NUL that ends it */
    *off = start;
    return true;
}

/* An optional string field of message i; false after answering. */
static bool
msg_str(sp_http_req_t *r, const json_t *mo, const char *key, size_t i, const char **out)
{
    const json_t *v = json_object_get(mo, key);
    *out = NULL;
    if (v == NULL || json_is_null(v)) {
        return true;
    }
    if (!json_is_string(v)) {
        sp_api_error(r, 400, NULL, "messages", NULL, "messages[%zu].%s must be a string", i, key);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

/* The text of token id, or "" (NUL-terminated in buf). */
static const char *
token_text(const sp_tokenizer_t *t, int32_t id, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (id >= 0) {
        sp_str_t s = sp_tokenizer_token_text(t, id);
        snprintf(buf, cap, "%.*s", (int)s.len, s.ptr);
    }
    return buf;
}

static void
h_apply_template(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = parse_body(s, r);
    if (b == NULL) {
        return;
    }
    sp_served_model_t *m = NULL;
    sp_chat_msg_t *msgs = NULL;
    size_t *offs = NULL;
    char *tools_json = NULL, *extra_json = NULL, *prompt = NULL;
    sp_jbuf_t store, calls, out;
    sp_jbuf_init(&store);
    sp_jbuf_init(&calls);
    sp_jbuf_init(&out);
    const json_t *ms = json_object_get(b, "messages");
    const json_t *tools = json_object_get(b, "tools");
    const json_t *kw = json_object_get(b, "chat_template_kwargs");
    bool gen = true;
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        sp_api_error(r, 400, NULL, "messages", NULL, "'messages' must be a non-empty list");
        goto done;
    }
    if (tools != NULL && !json_is_null(tools) && !json_is_array(tools)) {
        sp_api_error(r, 400, NULL, "tools", NULL, "'tools' must be a list");
        goto done;
    }
    if (kw != NULL && !json_is_null(kw) && !json_is_object(kw)) {
        sp_api_error(r, 400, NULL, "chat_template_kwargs", NULL,
                     "'chat_template_kwargs' must be an object");
        goto done;
    }
    if (!opt_bool(r, b, "add_generation_prompt", &gen)) {
        goto done;
    }
    if ((m = pick_model(s, r, b, h_apply_template, p)) == NULL) {
        goto done;
    }
    if (m->tmpl == NULL) {
        sp_api_error(r, 400, NULL, "messages", NULL, "the model %s has no usable chat template: %s",
                     m->name, m->tmpl_error);
        goto done;
    }
    size_t n = json_array_size(ms);
    msgs = sp_calloc(n, sizeof *msgs);
    offs = sp_calloc(2 * n, sizeof *offs);
    if (msgs == NULL || offs == NULL) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *mo = json_array_get(ms, i);
        const json_t *role = json_object_get(mo, "role");
        if (!json_is_object(mo) || !json_is_string(role)) {
            sp_api_error(r, 400, NULL, "messages", NULL,
                         "messages[%zu] must be an object with a string 'role'", i);
            goto done;
        }
        msgs[i].role = json_string_value(role);
        if (!content_of(r, json_object_get(mo, "content"), i, &store, &offs[2 * i]) ||
            !msg_str(r, mo, "name", i, &msgs[i].name) ||
            !msg_str(r, mo, "tool_call_id", i, &msgs[i].tool_call_id)) {
            goto done;
        }
        const json_t *tc = json_object_get(mo, "tool_calls");
        offs[2 * i + 1] = SIZE_MAX;
        if (tc != NULL && !json_is_null(tc)) {
            offs[2 * i + 1] = calls.len;
            sp_jbuf_json(&calls, tc);
            sp_jbuf_raw(&calls, "", 1);
        }
    }
    if (store.oom || calls.oom) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) { /* the buffers may have moved while growing */
        msgs[i].content = offs[2 * i] == SIZE_MAX ? NULL : store.p + offs[2 * i];
        msgs[i].tool_calls = offs[2 * i + 1] == SIZE_MAX ? NULL : calls.p + offs[2 * i + 1];
    }
    if (tools != NULL && !json_is_null(tools)) {
        tools_json = json_dumps(tools, JSON_COMPACT);
    }
    if (kw != NULL && json_is_object(kw)) {
        extra_json = json_dumps(kw, JSON_COMPACT);
    }
    char bos[256], eos[256], err[512];
    sp_chat_params_t cp = {
        .add_generation_prompt = gen,
        .bos_text = token_text(m->tok, sp_tokenizer_bos(m->tok), bos, sizeof bos),
        .eos_text = token_text(m->tok, sp_tokenizer_eos(m->tok), eos, sizeof eos),
        .tools_json = tools_json,
        .extra_json = extra_json,
    };
    size_t plen = 0;
    sp_status_t st = sp_chat_apply_ex(m->tmpl, msgs, n, &cp, &prompt, &plen, err, sizeof err);
    if (st != SP_OK) {
        sp_api_error(r, st == SP_ERR_NOMEM ? 503 : 400, NULL, "messages", NULL, "%s", err);
        goto done;
    }
    sp_jbuf_lit(&out, "{\"prompt\":");
    sp_jbuf_str(&out, prompt, plen);
    sp_jbuf_lit(&out, "}");
    sp_api_reply_json(r, 200, &out);
done:
    sp_free(prompt);
    sp_jfree(tools_json);
    sp_jfree(extra_json);
    sp_free(msgs);
    sp_free(offs);
    sp_jbuf_free(&store);
    sp_jbuf_free(&calls);
    sp_jbuf_free(&out);
    if (m != NULL) {
        sp_served_release(m);
    }
    json_decref(b);
}

void
sp_tokenize_routes_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_POST, "/apply-template", h_apply_template, s);
    sp_router_add(rt, SP_HTTP_POST, "/tokenize", h_tokenize, s);
    sp_router_add(rt, SP_HTTP_POST, "/detokenize", h_detokenize, s);
}
