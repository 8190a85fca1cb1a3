/*
 * responses.c - OpenAI's Responses API: POST /v1/responses, GET and DELETE
 * /v1/responses/{id}, GET /v1/responses/{id}/input_items, so the `openai`
 * SDK's client.responses works unchanged.
 *
 * A request is translated on the loop thread into the chat parameters (an
 * OpenAI chat body): `instructions` become the system message, `input` (a
 * string, or a list of message, function_call and function_call_output
 * items) the messages, after the stored conversation of previous_response_id
 * (its input items, then its output items); function tools, tool_choice,
 * text.format (json_schema / json_object: the grammar machinery),
 * reasoning.effort (the template's reasoning_effort), max_output_tokens,
 * temperature, top_p, user, metadata and parallel_tool_calls map to their
 * chat fields. The one chat pipeline (openai.c: scheduler, tenants, quotas,
 * metrics, tracing, logs) runs it with this file's output dialect
 * (dialect.h), which writes the response object, or the stream's events
 * (response.created, response.in_progress, then per output item
 * response.output_item.added, its parts' and deltas' events, and
 * response.output_item.done, then response.completed or
 * response.incomplete; response.failed on an error), each with its
 * sequence_number. Errors are OpenAI's shape (the default one).
 *
 * An answer with `store` (the default) is kept in resp_store.h under its id
 * and its tenant: the response object (GET) and the conversation's input
 * items (previous_response_id). Stored answers are never replayed from the
 * response cache: each request is a new response with its own id.
 *
 * What is refused with a 400 rather than dropped: tool types other than
 * function, image, file and audio input parts, item references, `include`,
 * `background`, `conversation`, `prompt`, truncation "auto",
 * max_tool_calls and top_logprobs, reasoning efforts other than low,
 * medium and high, and a text verbosity other than "medium".
 *
 * Threads: the request's loop thread (handlers and writers); the store has
 * its own lock. Memory: the translation is a new JSON object (it shares the
 * request's strings and schemas by reference); the per-request state
 * (resp_state_t) is owned by the pipeline from sp_api_chat_run_ud on and
 * freed by the dialect's release.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/jfree.h"
#include "core/json.h"
#include "serving/auth.h"
#include "api/api.h"
#include "api/dialect.h"
#include "api/json_body.h"
#include "api/resp_store.h"

/* Ids of stored responses are "resp_" and 16 hex digits; longer ones are
 * not ours (404 without a lookup). */
#define RESP_ID_MAX 64

/* What the dialect keeps for one request. */
typedef struct resp_state {
    int32_t tenant;       /* the tenant's slot (auth.h), -1 without keys */
    bool store;
    bool summary;         /* reasoning.summary asked: the reasoning is also its summary */
    json_t *echo;         /* the request's settings as the response object repeats them */
    json_t *items;        /* the conversation's input items: what a later request continues */
    /* the stream */
    int64_t seq;          /* the next event's sequence_number */
    json_t *output;       /* the output items finished so far */
    sp_jbuf_t acc;        /* the open item's text so far */
    char item_id[48];     /* the open item's id */
    sp_finish_t finish;
    bool has_calls;
} resp_state_t;

static void
state_free(void *ud)
{
    resp_state_t *st = ud;
    if (st == NULL) {
        return;
    }
    json_decref(st->echo);
    json_decref(st->items);
    json_decref(st->output);
    sp_jbuf_free(&st->acc);
    sp_free(st);
}

static int32_t
tenant_of(sp_http_req_t *r)
{
    const sp_tenant_state_t *t = sp_http_req_user(r);
    return t != NULL ? t->id : -1;
}

/* ------------------------------------------------------------ translation */

/* The translation record is the shared one (dialect.h); its ud is the
 * request's resp_state_t. */
static resp_state_t *
tx_state(const sp_dialect_tx_t *tx)
{
    return tx->ud;
}

static bool
given(const json_t *x)
{
    return x != NULL && !json_is_null(x);
}

static bool
str_is(const json_t *x, const char *s)
{
    return json_is_string(x) && strcmp(json_string_value(x), s) == 0;
}

/* What a message's content (or a function_call_output's output) may hold. */
static const char *const resp_text_types[] = {"input_text", "output_text", "text", NULL};
static const char *const resp_media_types[] = {"input_image", "input_file", "input_audio", NULL};
static const sp_dialect_parts_t resp_parts = {
    .param = "input",
    .noun = "content parts",
    .text = resp_text_types,
    .refusal = "refusal",
    .media = resp_media_types,
    .media_kinds = "images, files or audio",
    .accepted = "input_text, output_text, refusal",
};

/* The last chat message when it is the assistant's and may take more tool
 * calls (consecutive function_call items are one assistant turn). */
static json_t *
open_assistant(sp_dialect_tx_t *tx)
{
    size_t n = json_array_size(tx->msgs);
    json_t *last = n > 0 ? json_array_get(tx->msgs, n - 1) : NULL;
    return last != NULL && str_is(json_object_get(last, "role"), "assistant") ? last : NULL;
}

static int
tx_message(sp_dialect_tx_t *tx, const json_t *item, const char *where)
{
    const char *role = json_string_value(json_object_get(item, "role"));
    if (role == NULL || (strcmp(role, "user") != 0 && strcmp(role, "system") != 0 &&
                         strcmp(role, "developer") != 0 && strcmp(role, "assistant") != 0)) {
        return sp_dialect_fail(tx, 400, "input", "%s: 'role' must be \"user\", \"system\", \"developer\" or "
                       "\"assistant\"", where);
    }
    json_t *parts = NULL;
    char w[112];
    snprintf(w, sizeof w, "%s.content", where);
    if (sp_dialect_text_parts(tx, json_object_get(item, "content"), w, &resp_parts, &parts) != 0) {
        json_decref(parts);
        return -1;
    }
    json_t *m = json_pack("{s:s,s:o}", "role", role, "content", parts);
    if (m == NULL || json_array_append_new(tx->msgs, m) != 0) {
        return sp_dialect_nomem(tx);
    }
    return 0;
}

static int
tx_call(sp_dialect_tx_t *tx, const json_t *item, const char *where)
{
    const json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
    const json_t *args = json_object_get(item, "arguments");
    if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args)) {
        return sp_dialect_fail(tx, 400, "input", "%s: a function_call item needs string 'call_id', 'name' "
                       "and 'arguments'", where);
    }
    json_t *call = json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function",
                             "name", name, "arguments", args);
    json_t *m = open_assistant(tx);
    if (m != NULL && json_object_get(m, "tool_calls") == NULL) {
        if (json_object_set_new(m, "tool_calls", json_array()) != 0) {
            json_decref(call);
            return sp_dialect_nomem(tx);
        }
    } else if (m == NULL) {
        m = json_pack("{s:s,s:[]}", "role", "assistant", "tool_calls");
        if (m == NULL || json_array_append_new(tx->msgs, m) != 0) {
            json_decref(call);
            return sp_dialect_nomem(tx);
        }
    }
    if (call == NULL || json_array_append_new(json_object_get(m, "tool_calls"), call) != 0) {
        return sp_dialect_nomem(tx);
    }
    return 0;
}

static int
tx_call_output(sp_dialect_tx_t *tx, const json_t *item, const char *where)
{
    const json_t *id = json_object_get(item, "call_id"), *out = json_object_get(item, "output");
    if (!json_is_string(id) || (!json_is_string(out) && !json_is_array(out))) {
        return sp_dialect_fail(tx, 400, "input", "%s: a function_call_output item needs a string 'call_id' "
                       "and an 'output' (a string or a list of input_text parts)", where);
    }
    json_t *parts = NULL;
    char w[112];
    snprintf(w, sizeof w, "%s.output", where);
    if (sp_dialect_text_parts(tx, out, w, &resp_parts, &parts) != 0) {
        json_decref(parts);
        return -1;
    }
    json_t *m = json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", parts);
    if (m == NULL || json_array_append_new(tx->msgs, m) != 0) {
        return sp_dialect_nomem(tx);
    }
    return 0;
}

/* Input items (the request's, or a stored conversation's) as chat messages. */
static int
tx_items(sp_dialect_tx_t *tx, const json_t *items, const char *what)
{
    size_t i;
    const json_t *item;
    char where[96];
    json_array_foreach(items, i, item) {
        snprintf(where, sizeof where, "%s[%zu]", what, i);
        if (!json_is_object(item)) {
            return sp_dialect_fail(tx, 400, "input", "%s must be an object", where);
        }
        const json_t *t = json_object_get(item, "type");
        const char *type = json_string_value(t);
        int rc;
        if (given(t) && type == NULL) {
            return sp_dialect_fail(tx, 400, "input", "%s: 'type' must be a string", where);
        }
        if (type == NULL || strcmp(type, "message") == 0) {
            rc = tx_message(tx, item, where);
        } else if (strcmp(type, "function_call") == 0) {
            rc = tx_call(tx, item, where);
        } else if (strcmp(type, "function_call_output") == 0) {
            rc = tx_call_output(tx, item, where);
        } else if (strcmp(type, "reasoning") == 0) {
            rc = 0; /* earlier turns' reasoning is not part of the prompt */
        } else {
            return sp_dialect_fail(tx, 400, "input", "%s: items of type '%s' are not supported here "
                           "(message, function_call, function_call_output, reasoning)", where, type);
        }
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* An input item as it is stored (and listed by GET .../input_items): a
 * copy with an id when it has none ("msg_", "fc_", "fco_" and 16 hex
 * digits, kept through later responses that continue it), a message's
 * string content as one text part. NULL: out of memory. */
static json_t *
stored_item(const json_t *item, uint64_t seed)
{
    json_t *c = json_copy((json_t *)item);
    if (c == NULL) {
        return NULL;
    }
    const char *type = json_string_value(json_object_get(c, "type"));
    bool ok = true;
    if (type == NULL) {
        type = "message";
        ok = json_object_set_new(c, "type", json_string(type)) == 0;
    }
    bool message = strcmp(type, "message") == 0;
    const json_t *ct = json_object_get(c, "content");
    if (ok && message && json_is_string(ct)) {
        bool out = str_is(json_object_get(c, "role"), "assistant");
        json_t *parts = out ? json_pack("[{s:s,s:O,s:[]}]", "type", "output_text", "text", ct,
                                        "annotations")
                            : json_pack("[{s:s,s:O}]", "type", "input_text", "text", ct);
        ok = json_object_set_new(c, "content", parts) == 0;
    }
    if (ok && !json_is_string(json_object_get(c, "id"))) {
        char id[48];
        sp_dialect_id(id, sizeof id,
                      message                                        ? "msg"
                      : strcmp(type, "function_call") == 0        ? "fc"
                      : strcmp(type, "function_call_output") == 0 ? "fco"
                                                                  : "item",
                      '_', seed);
        ok = json_object_set_new(c, "id", json_string(id)) == 0;
    }
    if (ok && message && json_object_get(c, "status") == NULL) {
        ok = json_object_set_new(c, "status", json_string("completed")) == 0;
    }
    if (!ok) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* The stored conversation of previous_response_id, then the request's own
 * input: the messages, and st->items (what this response stores). */
static int
tx_input(sp_dialect_tx_t *tx, const json_t *b)
{
    const json_t *ins = json_object_get(b, "instructions");
    if (given(ins)) {
        if (!json_is_string(ins)) {
            return sp_dialect_fail(tx, 400, "instructions", "'instructions' must be a string");
        }
        json_t *m = json_pack("{s:s,s:O}", "role", "system", "content", ins);
        if (m == NULL || json_array_append_new(tx->msgs, m) != 0) {
            return sp_dialect_nomem(tx);
        }
    }
    tx_state(tx)->items = json_array();
    if (tx_state(tx)->items == NULL) {
        return sp_dialect_nomem(tx);
    }
    const json_t *prev = json_object_get(b, "previous_response_id");
    if (given(prev)) {
        if (!json_is_string(prev)) {
            return sp_dialect_fail(tx, 400, "previous_response_id", "'previous_response_id' must be a string");
        }
        const char *pid = json_string_value(prev);
        char *resp = NULL, *items = NULL;
        if (strlen(pid) > RESP_ID_MAX || !sp_resp_store_get(tx_state(tx)->tenant, pid, &resp, &items)) {
            return sp_dialect_fail(tx, 404, "previous_response_id", "Previous response with id '%.*s' not found.",
                           RESP_ID_MAX, pid);
        }
        json_t *pr = json_loads(resp, 0, NULL), *pi = json_loads(items, 0, NULL);
        sp_free(resp);
        sp_free(items);
        const json_t *pout = json_object_get(pr, "output");
        int rc = json_is_array(pi) && json_is_array(pout) &&
                         json_array_extend(tx_state(tx)->items, pi) == 0 &&
                         json_array_extend(tx_state(tx)->items, (json_t *)pout) == 0
                     ? 0
                     : sp_dialect_nomem(tx);
        json_decref(pr);
        json_decref(pi);
        if (rc != 0 || tx_items(tx, tx_state(tx)->items, "previous_response") != 0) {
            return -1;
        }
    }
    const json_t *in = json_object_get(b, "input");
    if (json_is_string(in)) {
        json_t *given_item = json_pack("{s:s,s:s,s:O}", "type", "message", "role", "user", "content", in);
        json_t *item = given_item ? stored_item(given_item, 0) : NULL;
        json_decref(given_item);
        if (item == NULL || json_array_append_new(tx_state(tx)->items, item) != 0) {
            return sp_dialect_nomem(tx);
        }
        json_t *m = json_pack("{s:s,s:O}", "role", "user", "content", in);
        if (m == NULL || json_array_append_new(tx->msgs, m) != 0) {
            return sp_dialect_nomem(tx);
        }
        return 0;
    }
    if (!json_is_array(in)) {
        return sp_dialect_fail(tx, 400, "input", "'input' must be a string or a list of input items");
    }
    if (tx_items(tx, in, "input") != 0) {
        return -1;
    }
    size_t i;
    const json_t *item;
    json_array_foreach(in, i, item) {
        json_t *c = stored_item(item, i);
        if (c == NULL || json_array_append_new(tx_state(tx)->items, c) != 0) {
            return sp_dialect_nomem(tx);
        }
    }
    return 0;
}

static int
tx_tools(sp_dialect_tx_t *tx, const json_t *b)
{
    const json_t *tools = json_object_get(b, "tools");
    if (given(tools)) {
        if (!json_is_array(tools)) {
            return sp_dialect_fail(tx, 400, "tools", "'tools' must be a list");
        }
        json_t *out = json_array();
        if (out == NULL || json_object_set_new(tx->out, "tools", out) != 0) {
            return sp_dialect_nomem(tx);
        }
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const char *type = json_is_object(t) ? json_string_value(json_object_get(t, "type")) : NULL;
            if (type != NULL && strcmp(type, "function") != 0) {
                return sp_dialect_fail(tx, 400, "tools", "tools[%zu]: tools of type '%s' are not supported "
                               "here: only function tools ({\"type\": \"function\", \"name\", "
                               "\"parameters\"}) run on this server", i, type);
            }
            const json_t *name = json_object_get(t, "name"), *params = json_object_get(t, "parameters");
            const json_t *desc = json_object_get(t, "description"), *strict = json_object_get(t, "strict");
            if (type == NULL || !json_is_string(name) || (given(params) && !json_is_object(params)) ||
                (given(desc) && !json_is_string(desc)) || (given(strict) && !json_is_boolean(strict))) {
                return sp_dialect_fail(tx, 400, "tools", "tools[%zu] must be {\"type\": \"function\", \"name\": "
                               "\"...\", \"description\": \"...\", \"parameters\": {JSON Schema}, "
                               "\"strict\": bool}", i);
            }
            json_t *fn = json_pack("{s:O}", "name", name);
            if (fn == NULL ||
                json_object_set_new(fn, "parameters", given(params) ? json_incref((json_t *)params)
                                                                    : json_pack("{s:s,s:{}}", "type",
                                                                                "object", "properties")) != 0 ||
                (json_is_string(desc) && json_object_set(fn, "description", (json_t *)desc) != 0) ||
                (json_is_boolean(strict) && json_object_set(fn, "strict", (json_t *)strict) != 0) ||
                json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn)) != 0) {
                return sp_dialect_nomem(tx);
            }
        }
    }
    const json_t *tch = json_object_get(b, "tool_choice");
    if (!given(tch)) {
        return 0;
    }
    json_t *v = NULL;
    if (str_is(tch, "auto") || str_is(tch, "none") || str_is(tch, "required")) {
        v = json_incref((json_t *)tch);
    } else if (json_is_object(tch) && str_is(json_object_get(tch, "type"), "function") &&
               json_is_string(json_object_get(tch, "name"))) {
        v = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", json_object_get(tch, "name"));
    } else {
        return sp_dialect_fail(tx, 400, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" "
                       "or {\"type\": \"function\", \"name\": \"...\"}");
    }
    return v != NULL && json_object_set_new(tx->out, "tool_choice", v) == 0 ? 0 : sp_dialect_nomem(tx);
}

/* text.format -> response_format; text.verbosity. */
static int
tx_text(sp_dialect_tx_t *tx, const json_t *b)
{
    const json_t *text = json_object_get(b, "text");
    if (!given(text)) {
        return 0;
    }
    const json_t *fmt = json_is_object(text) ? json_object_get(text, "format") : NULL;
    const json_t *verb = json_is_object(text) ? json_object_get(text, "verbosity") : NULL;
    if (!json_is_object(text) || (given(verb) && !str_is(verb, "medium"))) {
        return sp_dialect_fail(tx, 400, "text", "'text' must be {\"format\": {...}} (a verbosity, if given, "
                       "\"medium\": the models here have no verbosity setting)");
    }
    if (!given(fmt)) {
        return 0;
    }
    const json_t *type = json_is_object(fmt) ? json_object_get(fmt, "type") : NULL;
    json_t *rf = NULL;
    if (str_is(type, "text")) {
        return 0;
    } else if (str_is(type, "json_object")) {
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (str_is(type, "json_schema")) {
        const json_t *name = json_object_get(fmt, "name"), *schema = json_object_get(fmt, "schema");
        const json_t *strict = json_object_get(fmt, "strict"), *desc = json_object_get(fmt, "description");
        if (!json_is_string(name) || !json_is_object(schema) || (given(strict) && !json_is_boolean(strict)) ||
            (given(desc) && !json_is_string(desc))) {
            return sp_dialect_fail(tx, 400, "text.format", "text.format {\"type\": \"json_schema\"} needs a string "
                           "'name' and an object 'schema' ('strict' a boolean)");
        }
        json_t *js = json_pack("{s:O,s:O}", "name", name, "schema", schema);
        if (js != NULL && json_is_boolean(strict)) {
            json_object_set(js, "strict", (json_t *)strict);
        }
        rf = js ? json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js) : NULL;
    } else {
        return sp_dialect_fail(tx, 400, "text.format", "text.format 'type' must be \"text\", \"json_object\" or "
                       "\"json_schema\"");
    }
    return rf != NULL && json_object_set_new(tx->out, "response_format", rf) == 0 ? 0 : sp_dialect_nomem(tx);
}

static int
tx_params(sp_dialect_tx_t *tx, const json_t *b, int64_t max_cap)
{
    sp_json_err_t e = {{0}, NULL};
    static const char *const refused[] = {"background", "conversation", "prompt", "max_tool_calls", NULL};
    for (int i = 0; refused[i]; i++) {
        const json_t *x = json_object_get(b, refused[i]);
        if (given(x) && !json_is_false(x)) {
            return sp_dialect_fail(tx, 400, refused[i], "'%s' is not supported by this server", refused[i]);
        }
    }
    const json_t *inc = json_object_get(b, "include");
    if (given(inc) && (!json_is_array(inc) || json_array_size(inc) > 0)) {
        return sp_dialect_fail(tx, 400, "include", "'include' is not supported by this server (the output "
                       "items carry everything this server returns)");
    }
    const json_t *tr = json_object_get(b, "truncation");
    if (given(tr) && !str_is(tr, "disabled")) {
        return sp_dialect_fail(tx, 400, "truncation", "'truncation' must be \"disabled\": a conversation longer "
                       "than the context is refused, never cut");
    }
    int64_t v;
    int rc = sp_json_get_int(b, "top_logprobs", 0, 0, &v, &e);
    if (rc < 0) {
        return sp_dialect_fail(tx, 400, "top_logprobs", "'top_logprobs' is not supported by this server (0 only)");
    }
    bool flag = false;
    if (sp_json_get_bool(b, "stream", &flag, &e) < 0) {
        return sp_dialect_fail(tx, 400, e.param, "%s", e.msg);
    }
    if (json_object_set_new(tx->out, "stream", json_boolean(flag)) != 0) {
        return sp_dialect_nomem(tx);
    }
    flag = true;
    if (sp_json_get_bool(b, "store", &flag, &e) < 0) {
        return sp_dialect_fail(tx, 400, e.param, "%s", e.msg);
    }
    tx_state(tx)->store = flag;
    if ((rc = sp_json_get_int(b, "max_output_tokens", 1, INT32_MAX, &v, &e)) < 0) {
        return sp_dialect_fail(tx, 400, e.param, "%s", e.msg);
    }
    /* a ceiling (max_is_ceiling): cut to the server's --max-tokens and the context's room */
    if (rc > 0 && json_object_set_new(tx->out, "max_tokens", json_integer(v < max_cap ? v : max_cap)) != 0) {
        return sp_dialect_nomem(tx);
    }
    /* the chat pipeline checks these (OpenAI's ranges and limits) */
    static const char *const pass[] = {"model", "temperature", "top_p", "user", "metadata",
                                       "parallel_tool_calls", "service_tier", "seed", "grammar",
                                       "priority", "timeout", NULL};
    for (int i = 0; pass[i]; i++) {
        json_t *x = json_object_get(b, pass[i]);
        if (given(x) && json_object_set(tx->out, pass[i], x) != 0) {
            return sp_dialect_nomem(tx);
        }
    }
    const json_t *rs = json_object_get(b, "reasoning");
    if (given(rs)) {
        const json_t *eff = json_is_object(rs) ? json_object_get(rs, "effort") : NULL;
        const json_t *sum = json_is_object(rs) ? json_object_get(rs, "summary") : NULL;
        if (!json_is_object(rs) ||
            (given(eff) && !str_is(eff, "low") && !str_is(eff, "medium") && !str_is(eff, "high")) ||
            (given(sum) && !str_is(sum, "auto") && !str_is(sum, "concise") && !str_is(sum, "detailed"))) {
            return sp_dialect_fail(tx, 400, "reasoning", "'reasoning' must be {\"effort\": \"low\" | \"medium\" | "
                           "\"high\", \"summary\": \"auto\" | \"concise\" | \"detailed\"}");
        }
        if (given(eff) && json_object_set(tx->out, "reasoning_effort", (json_t *)eff) != 0) {
            return sp_dialect_nomem(tx);
        }
        tx_state(tx)->summary = given(sum);
    }
    return 0;
}

/* The request's settings as the response object repeats them. */
static int
tx_echo(sp_dialect_tx_t *tx, const json_t *b)
{
    json_t *e = json_object();
    tx_state(tx)->echo = e;
    if (e == NULL) {
        return sp_dialect_nomem(tx);
    }
    static const char *const keys[] = {"instructions", "max_output_tokens", "previous_response_id",
                                       "temperature", "top_p", "user", NULL};
    for (int i = 0; keys[i]; i++) {
        const json_t *x = json_object_get(b, keys[i]);
        if (json_object_set_new(e, keys[i], x ? json_incref((json_t *)x) : json_null()) != 0) {
            return sp_dialect_nomem(tx);
        }
    }
    const json_t *md = json_object_get(b, "metadata"), *tools = json_object_get(b, "tools");
    const json_t *tch = json_object_get(b, "tool_choice"), *ptc = json_object_get(b, "parallel_tool_calls");
    const json_t *text = json_object_get(b, "text"), *rs = json_object_get(b, "reasoning");
    const json_t *fmt = json_is_object(text) ? json_object_get(text, "format") : NULL;
    json_t *r = json_pack("{s:O?,s:O?}", "effort", json_is_object(rs) ? json_object_get(rs, "effort") : NULL,
                          "summary", json_is_object(rs) ? json_object_get(rs, "summary") : NULL);
    if (json_object_set_new(e, "metadata", given(md) ? json_incref((json_t *)md) : json_object()) != 0 ||
        json_object_set_new(e, "tools", given(tools) ? json_incref((json_t *)tools) : json_array()) != 0 ||
        json_object_set_new(e, "tool_choice", given(tch) ? json_incref((json_t *)tch) : json_string("auto")) != 0 ||
        json_object_set_new(e, "parallel_tool_calls", json_boolean(!json_is_false(ptc))) != 0 ||
        json_object_set_new(e, "text", json_pack("{s:o}", "format", given(fmt) ? json_incref((json_t *)fmt)
                                                     : json_pack("{s:s}", "type", "text"))) != 0 ||
        json_object_set_new(e, "reasoning", r) != 0 ||
        json_object_set_new(e, "store", json_boolean(tx_state(tx)->store)) != 0 ||
        json_object_set_new(e, "truncation", json_string("disabled")) != 0) {
        return sp_dialect_nomem(tx);
    }
    return 0;
}

static json_t *
translate(sp_dialect_tx_t *tx, const json_t *b, int64_t max_cap)
{
    tx->out = json_object();
    tx->msgs = json_array();
    if (tx->out == NULL || tx->msgs == NULL || json_object_set(tx->out, "messages", tx->msgs) != 0) {
        sp_dialect_nomem(tx);
    } else if (tx_params(tx, b, max_cap) == 0 && tx_text(tx, b) == 0 && tx_tools(tx, b) == 0 &&
               tx_input(tx, b) == 0 && tx_echo(tx, b) == 0) {
        json_decref(tx->msgs);
        return tx->out;
    }
    json_decref(tx->msgs);
    json_decref(tx->out);
    return NULL;
}

/* -------------------------------------------------------------- handlers */

static void
h_create(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = sp_api_json_body(s, r, h_create, p);
    if (b == NULL) {
        return;
    }
    sp_dialect_tx_t tx = {0};
    resp_state_t *st = sp_calloc(1, sizeof *st);
    tx.ud = st;
    json_t *chat = NULL;
    if (st == NULL) {
        sp_dialect_nomem(&tx);
    } else {
        sp_jbuf_init(&st->acc);
        st->tenant = tenant_of(r);
        chat = translate(&tx, b, s->cfg.max_tokens);
    }
    if (chat == NULL) {
        sp_api_error(r, tx.status, "invalid_request_error", tx.param, NULL, "%s", tx.msg);
        state_free(st);
    } else {
        sp_api_chat_run_ud(s, r, p, h_create, chat, &sp_responses_dialect, false, 0, st);
        json_decref(chat);
    }
    json_decref(b);
}

/* The {id} of the route, NUL-terminated in buf; false when it cannot be ours. */
static bool
route_id(sp_http_req_t *r, const sp_route_params_t *p, char *buf, size_t cap)
{
    sp_str_t id = sp_router_param(p, "id");
    if (id.ptr == NULL || id.len == 0 || id.len >= cap) {
        sp_api_error(r, 404, "invalid_request_error", NULL, NULL, "Response with id '%.*s' not found.",
                     (int)(id.len < RESP_ID_MAX ? id.len : RESP_ID_MAX), id.ptr ? id.ptr : "");
        return false;
    }
    memcpy(buf, id.ptr, id.len);
    buf[id.len] = '\0';
    return true;
}

static void
h_get(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)ud;
    char id[RESP_ID_MAX + 1];
    char *resp = NULL, *items = NULL;
    if (!route_id(r, p, id, sizeof id)) {
        return;
    }
    if (!sp_resp_store_get(tenant_of(r), id, &resp, &items)) {
        sp_api_error(r, 404, "invalid_request_error", NULL, NULL, "Response with id '%s' not found.", id);
        return;
    }
    sp_http_respond(r, 200, "application/json", resp, strlen(resp));
    sp_free(resp);
    sp_free(items);
}

/* One query parameter's value, percent-decoded into buf (NUL-terminated):
 * 1 found, 0 absent, -1 longer than cap allows. */
static int
query_param(sp_str_t q, const char *key, char *buf, size_t cap)
{
    size_t klen = strlen(key);
    const char *p = q.ptr, *end = q.ptr + q.len;
    while (p != NULL && p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *stop = amp ? amp : end;
        if ((size_t)(stop - p) > klen && memcmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t n = 0;
            for (const char *v = p + klen + 1; v < stop; v++) {
                char ch = *v;
                if (ch == '+') {
                    ch = ' ';
                } else if (ch == '%' && stop - v >= 3) {
                    char hex[3] = {v[1], v[2], 0};
                    char *e;
                    long x = strtol(hex, &e, 16);
                    if (*e == '\0') {
                        ch = (char)x;
                        v += 2;
                    }
                }
                if (n + 1 >= cap) {
                    return -1;
                }
                buf[n++] = ch;
            }
            buf[n] = '\0';
            return 1;
        }
        p = amp ? amp + 1 : NULL;
    }
    return 0;
}

/*
 * GET /v1/responses/{id}/input_items: the stored conversation's input items
 * (those of the responses it continues, then its own), OpenAI's list shape
 * {"object": "list", "data", "first_id", "last_id", "has_more"}; query
 * limit (1..100, default 20), order ("desc", the default, newest first, or
 * "asc") and after (an item id: the items past it in that order).
 */
static void
h_input_items(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)ud;
    char id[RESP_ID_MAX + 1];
    if (!route_id(r, p, id, sizeof id)) {
        return;
    }
    sp_str_t q = sp_http_req_query(r);
    char v[256], after[256] = "";
    long limit = 20;
    bool asc = false;
    int rc = query_param(q, "limit", v, sizeof v);
    if (rc != 0) {
        char *e;
        limit = rc > 0 ? strtol(v, &e, 10) : 0;
        if (rc < 0 || *v == '\0' || *e != '\0' || limit < 1 || limit > 100) {
            sp_api_error(r, 400, "invalid_request_error", "limit", NULL,
                         "'limit' must be an integer from 1 to 100");
            return;
        }
    }
    rc = query_param(q, "order", v, sizeof v);
    if (rc != 0) {
        if (rc < 0 || (strcmp(v, "asc") != 0 && strcmp(v, "desc") != 0)) {
            sp_api_error(r, 400, "invalid_request_error", "order", NULL,
                         "'order' must be \"asc\" or \"desc\"");
            return;
        }
        asc = strcmp(v, "asc") == 0;
    }
    if (query_param(q, "after", after, sizeof after) < 0) {
        sp_api_error(r, 400, "invalid_request_error", "after", NULL, "'after' is not an item id");
        return;
    }
    if (query_param(q, "include", v, sizeof v) != 0 || query_param(q, "include[]", v, sizeof v) != 0) {
        sp_api_error(r, 400, "invalid_request_error", "include", NULL,
                     "'include' is not supported: the stored items carry no image, file or search "
                     "data to add");
        return;
    }
    char *resp = NULL, *items = NULL;
    if (!sp_resp_store_get(tenant_of(r), id, &resp, &items)) {
        sp_api_error(r, 404, "invalid_request_error", NULL, NULL, "Response with id '%s' not found.", id);
        return;
    }
    sp_free(resp);
    json_t *all = json_loads(items, 0, NULL);
    sp_free(items);
    size_t n = json_array_size(all);
    /* pos: the next item in the order asked for (k-th of n) */
    size_t k = 0;
    if (after[0] != '\0') {
        for (k = 0; k < n; k++) {
            const json_t *it = json_array_get(all, asc ? k : n - 1 - k);
            if (str_is(json_object_get(it, "id"), after)) {
                break;
            }
        }
        if (k == n) {
            json_decref(all);
            sp_api_error(r, 400, "invalid_request_error", "after", NULL,
                         "'after': no input item with id '%s' in response '%s'", after, id);
            return;
        }
        k++;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"object\":\"list\",\"data\":[");
    const char *first = NULL, *last = NULL;
    size_t taken = 0;
    for (; k < n && taken < (size_t)limit; k++, taken++) {
        const json_t *it = json_array_get(all, asc ? k : n - 1 - k);
        if (taken > 0) {
            sp_jbuf_lit(&b, ",");
        }
        sp_jbuf_json(&b, it);
        last = json_string_value(json_object_get(it, "id"));
        first = first ? first : last;
    }
    sp_jbuf_lit(&b, "],\"first_id\":");
    sp_jbuf_cstr(&b, first);
    sp_jbuf_lit(&b, ",\"last_id\":");
    sp_jbuf_cstr(&b, last);
    sp_jbuf_printf(&b, ",\"has_more\":%s}", k < n ? "true" : "false");
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
    json_decref(all);
}

static void
h_delete(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)ud;
    char id[RESP_ID_MAX + 1];
    if (!route_id(r, p, id, sizeof id)) {
        return;
    }
    if (!sp_resp_store_delete(tenant_of(r), id)) {
        sp_api_error(r, 404, "invalid_request_error", NULL, NULL, "Response with id '%s' not found.", id);
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"id\":");
    sp_jbuf_cstr(&b, id);
    sp_jbuf_lit(&b, ",\"object\":\"response.deleted\",\"deleted\":true}");
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

void
sp_responses_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_resp_store_config(s->cfg.responses_store, s->cfg.responses_store_bytes);
    sp_router_add(rt, SP_HTTP_POST, "/v1/responses", h_create, s);
    sp_router_add(rt, SP_HTTP_GET, "/v1/responses/{id}", h_get, s);
    sp_router_add(rt, SP_HTTP_GET, "/v1/responses/{id}/input_items", h_input_items, s);
    sp_router_add(rt, SP_HTTP_DELETE, "/v1/responses/{id}", h_delete, s);
}

/* ------------------------------------------------------- output dialect */

static size_t
calls_n(const sp_dialect_req_t *d, const json_t *calls)
{
    size_t n = calls ? json_array_size(calls) : 0;
    return d->one_call && n > 1 ? 1 : n;
}

static json_t *
text_str(const char *s, size_t n)
{
    return json_stringn(s ? s : "", s ? n : 0);
}

static json_t *
message_item(const char *id, const char *status, json_t *text /* stolen, NULL: no content */)
{
    json_t *content = text ? json_pack("[{s:s,s:o,s:[],s:[]}]", "type", "output_text", "text", text,
                                       "annotations", "logprobs")
                           : json_array();
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", id, "type", "message", "status", status, "role",
                     "assistant", "content", content);
}

static json_t *
reasoning_item(const resp_state_t *st, const char *id, json_t *text /* stolen, NULL: none yet */)
{
    json_t *content = json_array(), *summary = json_array();
    if (text != NULL) {
        if (st->summary) { /* the reasoning itself: the model writes no separate summary */
            json_array_append_new(summary, json_pack("{s:s,s:O}", "type", "summary_text", "text", text));
        }
        json_array_append_new(content, json_pack("{s:s,s:o}", "type", "reasoning_text", "text", text));
    }
    return json_pack("{s:s,s:s,s:o,s:o}", "id", id, "type", "reasoning", "summary", summary, "content",
                     content);
}

static json_t *
call_item(const sp_dialect_req_t *d, const json_t *call, size_t k, const char *status, bool with_args)
{
    char id[48], cid[48];
    sp_dialect_id(id, sizeof id, "fc", '_', d->req_id * 31u + (uint64_t)k);
    sp_dialect_id(cid, sizeof cid, "call", '_', d->req_id * 37u + (uint64_t)k);
    const json_t *a = json_object_get(call, "arguments");
    char *args = with_args && a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_t *it = json_pack("{s:s,s:s,s:s,s:s,s:O,s:s}", "id", id, "type", "function_call", "status", status,
                           "call_id", cid, "name", json_object_get(call, "name"), "arguments",
                           args ? args : with_args ? "{}" : "");
    sp_jfree(args);
    return it;
}

/* The response object; output is stolen. */
static json_t *
response_obj(const sp_dialect_req_t *d, const resp_state_t *st, const char *status, json_t *output,
             bool usage, int64_t completion)
{
    json_t *model = json_loads(d->model, JSON_DECODE_ANY, NULL);
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:n,s:n,s:o,s:o}", "id", d->id, "object", "response",
                          "created_at", (json_int_t)d->created, "status", status, "error",
                          "incomplete_details", "model", model ? model : json_null(), "output", output);
    if (o == NULL) {
        return NULL;
    }
    if (st->echo != NULL) {
        json_object_update(o, st->echo);
    }
    json_object_set_new(o, "usage", usage ? json_pack("{s:I,s:I,s:I}", "input_tokens", (json_int_t)d->n_prompt,
                                                      "output_tokens", (json_int_t)completion, "total_tokens",
                                                      (json_int_t)(d->n_prompt + completion))
                                          : json_null());
    if (strcmp(status, "incomplete") == 0) {
        json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    }
    return o;
}

/* Keep the finished response (store true), under the request's tenant. */
static void
keep(const sp_dialect_req_t *d, const resp_state_t *st, const json_t *obj)
{
    if (!st->store || obj == NULL) {
        return;
    }
    char *resp = json_dumps(obj, JSON_COMPACT), *items = json_dumps(st->items, JSON_COMPACT);
    if (resp != NULL && items != NULL) {
        sp_resp_store_put(st->tenant, d->id, resp, strlen(resp), items, strlen(items));
    }
    sp_jfree(resp);
    sp_jfree(items);
}

static void
write_obj(sp_jbuf_t *b, json_t *obj)
{
    if (obj == NULL) {
        b->oom = true;
        return;
    }
    sp_jbuf_json(b, obj);
}

static void
resp_answer(sp_dialect_req_t *d, const sp_dialect_choice_t *c, int n, int64_t completion, sp_jbuf_t *b)
{
    (void)n; /* one choice: the translation never asks for more */
    resp_state_t *st = d->ud;
    json_t *out = json_array();
    char id[48];
    if (c->reasoning_len > 0) {
        sp_dialect_id(id, sizeof id, "rs", '_', d->req_id);
        json_array_append_new(out, reasoning_item(st, id, text_str(c->reasoning, c->reasoning_len)));
    }
    size_t nc = calls_n(d, c->calls);
    if (c->content_len > 0 || nc == 0) {
        sp_dialect_id(id, sizeof id, "msg", '_', d->req_id);
        json_array_append_new(out, message_item(id, "completed", text_str(c->content, c->content_len)));
    }
    for (size_t k = 0; k < nc; k++) {
        json_array_append_new(out, call_item(d, json_array_get(c->calls, k), k, "completed", true));
    }
    const bool cut = c->finish == SP_FINISH_LENGTH && nc == 0;
    json_t *obj = out ? response_obj(d, st, cut ? "incomplete" : "completed", out, true, completion) : NULL;
    write_obj(b, obj);
    keep(d, st, obj);
    json_decref(obj);
}

/* An event's head: the SSE lines and {"type", "sequence_number"; the
 * caller writes the rest and ev_end closes it. */
static void
ev(resp_state_t *st, sp_jbuf_t *b, const char *type)
{
    sp_dialect_sse_begin(b, type);
    sp_jbuf_printf(b, "{\"type\":\"%s\",\"sequence_number\":%lld", type, (long long)st->seq++);
}

static void
ev_end(sp_jbuf_t *b)
{
    sp_jbuf_lit(b, "}");
    sp_dialect_sse_end(b);
}

/* An event whose payload is one JSON value under key (stolen). */
static void
ev_obj(resp_state_t *st, sp_jbuf_t *b, const char *type, const char *key, json_t *v)
{
    ev(st, b, type);
    sp_jbuf_printf(b, ",\"%s\":", key);
    write_obj(b, v);
    json_decref(v);
    ev_end(b);
}

static int
out_index(const resp_state_t *st)
{
    return (int)json_array_size(st->output);
}

static void
ev_item(resp_state_t *st, sp_jbuf_t *b, const char *type)
{
    ev(st, b, type);
    sp_jbuf_lit(b, ",\"item_id\":");
    sp_jbuf_cstr(b, st->item_id);
    sp_jbuf_printf(b, ",\"output_index\":%d", out_index(st));
}

static void
item_added(resp_state_t *st, sp_jbuf_t *b, json_t *item)
{
    ev(st, b, "response.output_item.added");
    sp_jbuf_printf(b, ",\"output_index\":%d,\"item\":", out_index(st));
    write_obj(b, item);
    json_decref(item);
    ev_end(b);
}

/* The item is done: its event, and it joins the output (stolen). */
static void
item_done(resp_state_t *st, sp_jbuf_t *b, json_t *item)
{
    ev(st, b, "response.output_item.done");
    sp_jbuf_printf(b, ",\"output_index\":%d,\"item\":", out_index(st));
    write_obj(b, item);
    ev_end(b);
    if (item == NULL || json_array_append_new(st->output, item) != 0) {
        b->oom = true;
    }
}

/* The part's type for content_part events. */
static json_t *
part_obj(int part, const char *text, size_t len)
{
    return part == SP_DIALECT_REASONING
               ? json_pack("{s:s,s:o}", "type", "reasoning_text", "text", text_str(text, len))
               : json_pack("{s:s,s:o,s:[],s:[]}", "type", "output_text", "text", text_str(text, len),
                           "annotations", "logprobs");
}

static void
open_part(sp_dialect_req_t *d, resp_state_t *st, int part, sp_jbuf_t *b)
{
    const bool think = part == SP_DIALECT_REASONING;
    sp_dialect_id(st->item_id, sizeof st->item_id, think ? "rs" : "msg", '_',
                  d->req_id * 41u + (uint64_t)out_index(st));
    item_added(st, b, think ? reasoning_item(st, st->item_id, NULL)
                            : message_item(st->item_id, "in_progress", NULL));
    ev_item(st, b, "response.content_part.added");
    sp_jbuf_lit(b, ",\"content_index\":0,\"part\":");
    json_t *po = part_obj(part, "", 0);
    write_obj(b, po);
    json_decref(po);
    ev_end(b);
    sp_jbuf_reset(&st->acc);
    d->part = part;
}

static void
close_part(sp_dialect_req_t *d, resp_state_t *st, sp_jbuf_t *b)
{
    if (d->part == 0) {
        return;
    }
    const bool think = d->part == SP_DIALECT_REASONING;
    const char *text = st->acc.p ? st->acc.p : "";
    ev_item(st, b, think ? "response.reasoning_text.done" : "response.output_text.done");
    sp_jbuf_lit(b, ",\"content_index\":0,\"text\":");
    sp_jbuf_str(b, text, st->acc.len);
    sp_jbuf_lit(b, think ? "" : ",\"logprobs\":[]");
    ev_end(b);
    ev_item(st, b, "response.content_part.done");
    sp_jbuf_lit(b, ",\"content_index\":0,\"part\":");
    json_t *po = part_obj(d->part, text, st->acc.len);
    write_obj(b, po);
    json_decref(po);
    ev_end(b);
    item_done(st, b, think ? reasoning_item(st, st->item_id, text_str(text, st->acc.len))
                           : message_item(st->item_id, "completed", text_str(text, st->acc.len)));
    b->oom |= st->acc.oom;
    d->part = 0;
}

static void
resp_stream_start(sp_dialect_req_t *d, sp_jbuf_t *b)
{
    resp_state_t *st = d->ud;
    st->output = json_array();
    b->oom |= st->output == NULL;
    ev_obj(st, b, "response.created", "response", response_obj(d, st, "in_progress", json_array(), false, 0));
    ev_obj(st, b, "response.in_progress", "response", response_obj(d, st, "in_progress", json_array(), false, 0));
}

static void
resp_stream_delta(sp_dialect_req_t *d, int index, sp_dialect_part_t part, const char *text, size_t len,
                  const sp_sched_event_t *e, sp_jbuf_t *b)
{
    (void)index;
    (void)e; /* no log-probabilities here (top_logprobs is refused) */
    resp_state_t *st = d->ud;
    if (len == 0) {
        return;
    }
    if (d->part != (int)part) {
        close_part(d, st, b);
        open_part(d, st, (int)part, b);
    }
    const bool think = part == SP_DIALECT_REASONING;
    ev_item(st, b, think ? "response.reasoning_text.delta" : "response.output_text.delta");
    sp_jbuf_lit(b, ",\"content_index\":0,\"delta\":");
    sp_jbuf_str(b, text, len);
    sp_jbuf_lit(b, think ? "" : ",\"logprobs\":[]");
    ev_end(b);
    sp_jbuf_raw(&st->acc, text, len);
}

/* The open item closes; an answer of nothing is an empty message; each tool
 * call is a function_call item whose arguments come as one delta. */
static void
resp_stream_finish(sp_dialect_req_t *d, const sp_dialect_choice_t *c, sp_jbuf_t *b)
{
    resp_state_t *st = d->ud;
    size_t nc = calls_n(d, c->calls);
    bool had_text = false;
    for (size_t i = 0; i < json_array_size(st->output); i++) {
        had_text |= str_is(json_object_get(json_array_get(st->output, i), "type"), "message");
    }
    if (d->part != SP_DIALECT_TEXT && !had_text && nc == 0) {
        close_part(d, st, b);
        open_part(d, st, SP_DIALECT_TEXT, b);
    }
    close_part(d, st, b);
    for (size_t k = 0; k < nc; k++) {
        const json_t *call = json_array_get(c->calls, k);
        json_t *done = call_item(d, call, k, "completed", true);
        json_t *added = json_deep_copy(done);
        const char *args = json_string_value(json_object_get(done, "arguments"));
        snprintf(st->item_id, sizeof st->item_id, "%s", json_string_value(json_object_get(done, "id")));
        if (added == NULL || args == NULL) {
            b->oom = true;
            json_decref(added);
            json_decref(done);
            return;
        }
        json_object_set_new(added, "status", json_string("in_progress"));
        json_object_set_new(added, "arguments", json_string(""));
        item_added(st, b, added);
        ev_item(st, b, "response.function_call_arguments.delta");
        sp_jbuf_lit(b, ",\"delta\":");
        sp_jbuf_cstr(b, args);
        ev_end(b);
        ev_item(st, b, "response.function_call_arguments.done");
        sp_jbuf_lit(b, ",\"name\":");
        sp_jbuf_cstr(b, json_string_value(json_object_get(done, "name")));
        sp_jbuf_lit(b, ",\"arguments\":");
        sp_jbuf_cstr(b, args);
        ev_end(b);
        item_done(st, b, done);
    }
    st->finish = c->finish;
    st->has_calls = nc > 0;
}

static void
resp_stream_end(sp_dialect_req_t *d, int64_t completion, sp_jbuf_t *b)
{
    resp_state_t *st = d->ud;
    const bool cut = st->finish == SP_FINISH_LENGTH && !st->has_calls;
    json_t *obj = response_obj(d, st, cut ? "incomplete" : "completed", json_incref(st->output), true,
                               completion);
    ev(st, b, cut ? "response.incomplete" : "response.completed");
    sp_jbuf_lit(b, ",\"response\":");
    write_obj(b, obj);
    ev_end(b);
    keep(d, st, obj);
    json_decref(obj);
}

static const char *
error_code(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 429:
        return "rate_limit_exceeded";
    case 503:
        return "server_is_overloaded";
    default:
        return "server_error";
    }
}

static void
resp_stream_error(sp_dialect_req_t *d, int status, const char *message, sp_jbuf_t *b)
{
    resp_state_t *st = d->ud;
    json_t *obj = response_obj(d, st, "failed", st->output ? json_incref(st->output) : json_array(), false, 0);
    if (obj != NULL) {
        json_object_set_new(obj, "error", json_pack("{s:s,s:s}", "code", error_code(status), "message",
                                                    message ? message : "error"));
    }
    ev_obj(st, b, "response.failed", "response", obj);
}

const sp_api_dialect_t sp_responses_dialect = {
    .name = "openai/responses",
    .stream_type = "text/event-stream",
    .id_prefix = "resp",
    .id_sep = '_',
    .max_is_ceiling = true, /* max_output_tokens is a ceiling, cut to the context's room */
    .no_cache = true,
    .answer = resp_answer,
    .stream_start = resp_stream_start,
    .stream_delta = resp_stream_delta,
    .stream_finish = resp_stream_finish,
    .stream_end = resp_stream_end,
    .stream_error = resp_stream_error,
    .count = NULL,
    .error = NULL, /* OpenAI's shape: api.h's sp_api_error */
    .release = state_free,
};
