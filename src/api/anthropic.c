/*
 * anthropic.c - Anthropic's Messages API: POST /v1/messages and
 * POST /v1/messages/count_tokens, so Anthropic's SDKs work unchanged.
 *
 * A request is translated on the loop thread into the chat parameters (an
 * OpenAI chat body: system and messages with their content blocks, tools,
 * tool_choice, stop_sequences, sampling, thinking) and runs through the one
 * chat pipeline (openai.c: scheduler, tenants, quotas, metrics, tracing,
 * logs, response cache) with this file's output dialect (dialect.h), which
 * writes Anthropic's message object, its stream events (message_start,
 * content_block_start, ping, content_block_delta, content_block_stop,
 * message_delta, message_stop) and its error shape.
 *
 * What is refused with a 400 rather than dropped: image and document blocks
 * (no vision model), server tools, an assistant prefill as the last message,
 * MCP servers and containers. Thinking blocks of earlier assistant turns are
 * left out of the prompt, as Anthropic does.
 *
 * Threads: the loop thread of the request (handlers and writers). Memory:
 * the translated body is a new JSON object that shares the request's
 * strings and schemas by reference; the pipeline holds its own reference.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/jfree.h"
#include "sampan/log.h"
#include "api/api.h"
#include "api/dialect.h"
#include "api/json_body.h"

/* The dialect's own bits in sp_dialect_req_t.flags. */
#define ANTH_THINKING 1 /* thinking enabled: the reasoning goes out as thinking blocks */
#define ANTH_PINGED 2   /* the stream's ping was sent */

/* Anthropic allows more; the engine holds this many stop strings. */
#define ANTH_MAX_STOP SP_GEN_MAX_STOP

/* A translation is the shared record (dialect.h); every refusal here is a
 * 400 naming a top-level field. */
#define tx_fail(tx, ...) sp_dialect_fail((tx), 400, __VA_ARGS__)
#define tx_nomem(tx) sp_dialect_nomem(tx)

static int
tx_field(sp_dialect_tx_t *tx, const sp_json_err_t *e)
{
    return tx_fail(tx, e->param, "%s", e->msg);
}

/* A block's type, or NULL when it is not an object with a string "type". */
static const char *
block_type(const json_t *blk)
{
    return json_is_object(blk) ? json_string_value(json_object_get(blk, "type")) : NULL;
}

/* The refusal of a block type Sampan cannot take. */
static int
refuse_block(sp_dialect_tx_t *tx, const char *where, const char *type)
{
    if (type != NULL && (strcmp(type, "image") == 0 || strcmp(type, "document") == 0)) {
        return tx_fail(tx, "messages",
                       "%s: '%s' content blocks are not supported: no model served here reads "
                       "images or documents (send the text as a text block)", where, type);
    }
    return tx_fail(tx, "messages", "%s: content blocks of type '%s' are not supported here "
                   "(text, tool_use, tool_result, thinking)", where, type ? type : "(none)");
}

/* A text block's text, or NULL after tx_fail. */
static const json_t *
text_of(sp_dialect_tx_t *tx, const json_t *blk, const char *where)
{
    const json_t *t = json_object_get(blk, "text");
    if (!json_is_string(t)) {
        tx_fail(tx, "messages", "%s: a text block needs a string 'text'", where);
        return NULL;
    }
    return t;
}

/* Append {"role": role, "content": content} (content: a string or a list of
 * OpenAI text parts; a new reference is taken). */
static int
push_msg(sp_dialect_tx_t *tx, const char *role, json_t *content, json_t *tool_calls, const char *call_id)
{
    json_t *m = json_pack("{s:s}", "role", role);
    if (m == NULL || (content && json_object_set(m, "content", content) != 0) ||
        (tool_calls && json_object_set(m, "tool_calls", tool_calls) != 0) ||
        (call_id && json_object_set_new(m, "tool_call_id", json_string(call_id)) != 0) ||
        json_array_append_new(tx->msgs, m) != 0) {
        return tx_nomem(tx);
    }
    return 0;
}

/* Text blocks (a string or a list of {"type": "text"}): system and
 * tool_result contents. */
static const char *const anth_text_types[] = {"text", NULL};
static const char *const anth_media_types[] = {"image", "document", NULL};
static const sp_dialect_parts_t anth_parts = {
    .param = "messages",
    .noun = "text blocks",
    .text = anth_text_types,
    .refusal = NULL,
    .media = anth_media_types,
    .media_kinds = "images or documents",
    .accepted = "text",
};

/* One user turn: text blocks become a user message, each tool_result a
 * "tool" message, in their order. */
static int
user_turn(sp_dialect_tx_t *tx, const json_t *content, size_t i)
{
    char where[64];
    snprintf(where, sizeof where, "messages[%zu].content", i);
    if (json_is_string(content)) {
        return push_msg(tx, "user", (json_t *)content, NULL, NULL);
    }
    json_t *parts = json_array();
    if (parts == NULL) {
        return tx_nomem(tx);
    }
    int rc = 0;
    size_t k;
    const json_t *blk;
    json_array_foreach(content, k, blk) {
        const char *type = block_type(blk);
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, k);
        if (type != NULL && strcmp(type, "text") == 0) {
            const json_t *t = text_of(tx, blk, where);
            if (t == NULL ||
                json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", t)) != 0) {
                rc = t == NULL ? -1 : tx_nomem(tx);
                break;
            }
        } else if (type != NULL && strcmp(type, "tool_result") == 0) {
            const char *id = json_string_value(json_object_get(blk, "tool_use_id"));
            const json_t *c = json_object_get(blk, "content");
            const json_t *err = json_object_get(blk, "is_error");
            if (id == NULL || (err && !json_is_boolean(err))) {
                rc = tx_fail(tx, "messages", "%s: a tool_result block needs a string 'tool_use_id' "
                             "(and 'is_error', if given, a boolean)", where);
                break;
            }
            /* text before the result stays before it */
            if (json_array_size(parts) > 0 &&
                ((rc = push_msg(tx, "user", parts, NULL, NULL)) != 0 ||
                 (rc = json_array_clear(parts) == 0 ? 0 : tx_nomem(tx)) != 0)) {
                break;
            }
            json_t *rp = NULL;
            if (c == NULL || json_is_null(c)) {
                rp = json_array();
                rc = rp ? 0 : tx_nomem(tx);
            } else {
                rc = sp_dialect_text_parts(tx, c, where, &anth_parts, &rp);
            }
            /* OpenAI's tool message has no error flag: the model reads it in the text */
            if (rc == 0 && json_is_true(err) &&
                json_array_insert_new(rp, 0, json_pack("{s:s,s:s}", "type", "text", "text", "Error: ")) != 0) {
                rc = tx_nomem(tx);
            }
            if (rc == 0) {
                rc = push_msg(tx, "tool", rp, NULL, id);
            }
            json_decref(rp);
            if (rc != 0) {
                break;
            }
        } else {
            rc = refuse_block(tx, where, type);
            break;
        }
    }
    if (rc == 0 && json_array_size(parts) > 0) {
        rc = push_msg(tx, "user", parts, NULL, NULL);
    }
    json_decref(parts);
    return rc;
}

/* One assistant turn: text blocks are its content, tool_use blocks its
 * tool_calls; thinking blocks of earlier turns are not part of the prompt. */
static int
assistant_turn(sp_dialect_tx_t *tx, const json_t *content, size_t i)
{
    if (json_is_string(content)) {
        return push_msg(tx, "assistant", (json_t *)content, NULL, NULL);
    }
    json_t *parts = json_array(), *calls = json_array();
    int rc = parts && calls ? 0 : tx_nomem(tx);
    size_t k;
    const json_t *blk;
    char where[64];
    json_array_foreach(content, k, blk) {
        if (rc != 0) {
            break;
        }
        const char *type = block_type(blk);
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", i, k);
        if (type != NULL && strcmp(type, "text") == 0) {
            const json_t *t = text_of(tx, blk, where);
            rc = t == NULL ? -1
                 : json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", t)) == 0
                     ? 0
                     : tx_nomem(tx);
        } else if (type != NULL && strcmp(type, "tool_use") == 0) {
            const json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            const json_t *input = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                rc = tx_fail(tx, "messages", "%s: a tool_use block needs a string 'id', a string "
                             "'name' and an object 'input'", where);
                break;
            }
            char *args = json_dumps(input, JSON_COMPACT);
            json_t *call = args ? json_pack("{s:O,s:s,s:{s:O,s:s}}", "id", id, "type", "function",
                                            "function", "name", name, "arguments", args)
                                : NULL;
            sp_jfree(args);
            rc = call != NULL && json_array_append_new(calls, call) == 0 ? 0 : tx_nomem(tx);
        } else if (type != NULL && (strcmp(type, "thinking") == 0 ||
                                    strcmp(type, "redacted_thinking") == 0)) {
            continue;
        } else {
            rc = refuse_block(tx, where, type);
        }
    }
    if (rc == 0) {
        rc = push_msg(tx, "assistant", json_array_size(parts) > 0 ? parts : NULL,
                      json_array_size(calls) > 0 ? calls : NULL, NULL);
        if (rc == 0 && json_array_size(parts) == 0 && json_array_size(calls) == 0) {
            /* only thinking: an empty turn keeps the roles in their order */
            json_t *last = json_array_get(tx->msgs, json_array_size(tx->msgs) - 1);
            rc = json_object_set_new(last, "content", json_string("")) == 0 ? 0 : tx_nomem(tx);
        }
    }
    json_decref(parts);
    json_decref(calls);
    return rc;
}

static int
tx_messages(sp_dialect_tx_t *tx, const json_t *b)
{
    const json_t *sys = json_object_get(b, "system");
    if (sys != NULL && !json_is_null(sys)) {
        json_t *parts = NULL;
        int rc = sp_dialect_text_parts(tx, sys, "system", &anth_parts, &parts);
        if (rc == 0) {
            rc = push_msg(tx, "system", parts, NULL, NULL);
        }
        json_decref(parts);
        if (rc != 0) {
            if (tx->status == 400) {
                tx->param = "system";
            }
            return -1;
        }
    }
    const json_t *ms = json_object_get(b, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        return tx_fail(tx, "messages", "'messages' must be a non-empty list");
    }
    size_t i;
    const json_t *m;
    json_array_foreach(ms, i, m) {
        const char *role = json_is_object(m) ? json_string_value(json_object_get(m, "role")) : NULL;
        const json_t *c = json_object_get(m, "content");
        if (role == NULL || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0)) {
            return tx_fail(tx, "messages", "messages[%zu]: 'role' must be \"user\" or \"assistant\"", i);
        }
        if (!json_is_string(c) && !json_is_array(c)) {
            return tx_fail(tx, "messages", "messages[%zu]: 'content' must be a string or a list of "
                           "content blocks", i);
        }
        int rc = strcmp(role, "user") == 0 ? user_turn(tx, c, i) : assistant_turn(tx, c, i);
        if (rc != 0) {
            return rc;
        }
        if (strcmp(role, "assistant") == 0 && i + 1 == json_array_size(ms)) {
            return tx_fail(tx, "messages", "the last message is the assistant's: continuing an "
                           "assistant prefill is not supported (end with a user message)");
        }
    }
    return 0;
}

static int
tx_tools(sp_dialect_tx_t *tx, const json_t *b)
{
    const json_t *tools = json_object_get(b, "tools");
    const json_t *tch = json_object_get(b, "tool_choice");
    if (tools != NULL && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            return tx_fail(tx, "tools", "'tools' must be a list");
        }
        json_t *out = json_array();
        if (out == NULL || json_object_set_new(tx->out, "tools", out) != 0) {
            return tx_nomem(tx);
        }
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
            const json_t *desc = json_object_get(t, "description");
            const char *type = json_is_object(t) ? json_string_value(json_object_get(t, "type")) : NULL;
            if (json_is_object(t) && type != NULL && strcmp(type, "custom") != 0) {
                return tx_fail(tx, "tools", "tools[%zu]: server tools (type '%s') are not supported "
                               "here; give client tools {\"name\", \"description\", \"input_schema\"}",
                               i, type);
            }
            if (!json_is_object(t) || !json_is_string(name) || !json_is_object(schema) ||
                (desc && !json_is_null(desc) && !json_is_string(desc))) {
                return tx_fail(tx, "tools", "tools[%zu] must be {\"name\": \"...\", \"description\": "
                               "\"...\", \"input_schema\": {JSON Schema}}", i);
            }
            json_t *fn = json_pack("{s:O,s:O}", "name", name, "parameters", schema);
            if (fn == NULL || (json_is_string(desc) && json_object_set(fn, "description", (json_t *)desc) != 0) ||
                json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn)) != 0) {
                return tx_nomem(tx);
            }
        }
    }
    if (tch == NULL || json_is_null(tch)) {
        return 0;
    }
    const char *type = json_is_object(tch) ? json_string_value(json_object_get(tch, "type")) : NULL;
    const json_t *dp = json_is_object(tch) ? json_object_get(tch, "disable_parallel_tool_use") : NULL;
    if (type == NULL || (dp && !json_is_boolean(dp))) {
        return tx_fail(tx, "tool_choice", "'tool_choice' must be {\"type\": \"auto\" | \"any\" | "
                       "\"tool\" | \"none\"} (with 'name' for \"tool\")");
    }
    json_t *v = NULL;
    if (strcmp(type, "auto") == 0) {
        v = json_string("auto");
    } else if (strcmp(type, "any") == 0) {
        v = json_string("required");
    } else if (strcmp(type, "none") == 0) {
        v = json_string("none");
    } else if (strcmp(type, "tool") == 0) {
        const json_t *name = json_object_get(tch, "name");
        if (!json_is_string(name)) {
            return tx_fail(tx, "tool_choice", "tool_choice {\"type\": \"tool\"} needs a string 'name'");
        }
        v = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        return tx_fail(tx, "tool_choice", "tool_choice type '%s' is not one of auto, any, tool, none",
                       type);
    }
    if (v == NULL || json_object_set_new(tx->out, "tool_choice", v) != 0 ||
        (json_is_true(dp) && json_object_set_new(tx->out, "parallel_tool_calls", json_false()) != 0)) {
        return tx_nomem(tx);
    }
    return 0;
}

/* Sampling, limits, stop sequences, thinking, streaming. */
static int
tx_params(sp_dialect_tx_t *tx, const json_t *b, bool count, int64_t max_cap)
{
    sp_json_err_t e = {{0}, NULL};
    int64_t max_tokens = 0, v;
    double d;
    int rc;
    if (!count) {
        const json_t *mt = json_object_get(b, "max_tokens");
        if (mt == NULL || json_is_null(mt)) {
            return tx_fail(tx, "max_tokens", "'max_tokens' is required");
        }
        if (sp_json_get_int(b, "max_tokens", 1, INT32_MAX, &max_tokens, &e) < 0) {
            return tx_field(tx, &e);
        }
        /* a ceiling, as for Anthropic's models: cut to the server's --max-tokens
         * (and to the context's room, max_is_ceiling) */
        if (json_object_set_new(tx->out, "max_tokens",
                                json_integer(max_tokens < max_cap ? max_tokens : max_cap)) != 0) {
            return tx_nomem(tx);
        }
        bool stream = false;
        if (sp_json_get_bool(b, "stream", &stream, &e) < 0) {
            return tx_field(tx, &e);
        }
        if (json_object_set_new(tx->out, "stream", json_boolean(stream)) != 0) {
            return tx_nomem(tx);
        }
    }
    /* Anthropic's ranges: temperature 0..1, top_p 0..1, top_k >= 0 */
    static const struct { const char *key; double lo, hi; } nums[] = {
        {"temperature", 0, 1}, {"top_p", 0, 1},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if ((rc = sp_json_get_num(b, nums[i].key, nums[i].lo, nums[i].hi, &d, &e)) < 0) {
            return tx_field(tx, &e);
        }
        if (rc > 0 && json_object_set_new(tx->out, nums[i].key, json_real(d)) != 0) {
            return tx_nomem(tx);
        }
    }
    if ((rc = sp_json_get_int(b, "top_k", 0, 1 << 20, &v, &e)) < 0) {
        return tx_field(tx, &e);
    }
    if (rc > 0 && json_object_set_new(tx->out, "top_k", json_integer(v)) != 0) {
        return tx_nomem(tx);
    }
    const json_t *st = json_object_get(b, "stop_sequences");
    if (st != NULL && !json_is_null(st)) {
        if (!json_is_array(st) || json_array_size(st) > ANTH_MAX_STOP) {
            return tx_fail(tx, "stop_sequences", "'stop_sequences' must be a list of at most %d strings",
                           ANTH_MAX_STOP);
        }
        size_t i;
        const json_t *x;
        json_array_foreach(st, i, x) {
            if (!json_is_string(x) || json_string_length(x) == 0 ||
                json_string_length(x) > SP_GEN_MAX_STOP_LEN ||
                strlen(json_string_value(x)) != json_string_length(x)) {
                return tx_fail(tx, "stop_sequences", "stop_sequences[%zu] must be a string of 1 to %d "
                               "bytes (no NUL)", i, SP_GEN_MAX_STOP_LEN);
            }
        }
        if (json_array_size(st) > 0 && json_object_set(tx->out, "stop", (json_t *)st) != 0) {
            return tx_nomem(tx);
        }
    }
    /* thinking: {"type": "enabled", "budget_tokens": N} or {"type": "disabled"} */
    const json_t *th = json_object_get(b, "thinking");
    bool think = false;
    if (th != NULL && !json_is_null(th)) {
        const char *type = json_is_object(th) ? json_string_value(json_object_get(th, "type")) : NULL;
        if (type == NULL || (strcmp(type, "enabled") != 0 && strcmp(type, "disabled") != 0)) {
            return tx_fail(tx, "thinking", "'thinking' must be {\"type\": \"enabled\", "
                           "\"budget_tokens\": N} or {\"type\": \"disabled\"}");
        }
        think = strcmp(type, "enabled") == 0;
        if (think) {
            int64_t budget;
            if (sp_json_get_int(th, "budget_tokens", 1024, INT32_MAX, &budget, &e) <= 0) {
                return tx_fail(tx, "thinking.budget_tokens",
                               "'thinking.budget_tokens' must be an integer >= 1024");
            }
            if (!count && budget >= max_tokens) {
                return tx_fail(tx, "thinking.budget_tokens",
                               "'thinking.budget_tokens' must be less than max_tokens");
            }
            /* enforced by the engine (api/budget.h) */
            if (json_object_set_new(tx->out, "reasoning_budget_tokens", json_integer(budget)) != 0) {
                return tx_nomem(tx);
            }
        }
    }
    /* The template's switch (Qwen3-style enable_thinking); the reasoning is
     * taken apart from the answer either way and shown only when enabled. */
    json_t *kw = json_pack("{s:b}", "enable_thinking", think);
    if (kw == NULL || json_object_set_new(tx->out, "chat_template_kwargs", kw) != 0 ||
        json_object_set_new(tx->out, "reasoning_format", json_string("auto")) != 0) {
        return tx_nomem(tx);
    }
    tx->flags |= think ? ANTH_THINKING : 0;
    return 0;
}

/* metadata {user_id}, service_tier, and what is refused outright. */
static int
tx_misc(sp_dialect_tx_t *tx, sp_http_req_t *r, const json_t *b)
{
    static const char *const refused[] = {"mcp_servers", "container", "context_management", NULL};
    for (int i = 0; refused[i]; i++) {
        const json_t *x = json_object_get(b, refused[i]);
        if (x != NULL && !json_is_null(x)) {
            return tx_fail(tx, refused[i], "'%s' is not supported by this server", refused[i]);
        }
    }
    const json_t *md = json_object_get(b, "metadata");
    if (md != NULL && !json_is_null(md)) {
        const json_t *uid = json_is_object(md) ? json_object_get(md, "user_id") : NULL;
        if (!json_is_object(md) || (uid && !json_is_null(uid) && !json_is_string(uid)) ||
            (json_is_string(uid) && json_string_length(uid) > 256)) {
            return tx_fail(tx, "metadata", "'metadata' must be {\"user_id\": \"...\"} (at most 256 bytes)");
        }
        if (json_is_string(uid)) { /* the access log names the end user */
            sp_http_req_annotate(r, "user_id=%s", sp_log_str_n(json_string_value(uid), json_string_length(uid)));
        }
    }
    const json_t *tier = json_object_get(b, "service_tier");
    if (tier != NULL && !json_is_null(tier) &&
        (!json_is_string(tier) || (strcmp(json_string_value(tier), "auto") != 0 &&
                                   strcmp(json_string_value(tier), "standard_only") != 0))) {
        return tx_fail(tx, "service_tier", "'service_tier' must be \"auto\" or \"standard_only\" "
                       "(both are the tenant's own tier here)");
    }
    /* Sampan's own fields pass through: seed, a GBNF grammar, the scheduling tier and deadline. */
    static const char *const pass[] = {"model", "seed", "grammar", "priority", "timeout", NULL};
    for (int i = 0; pass[i]; i++) {
        json_t *x = json_object_get(b, pass[i]);
        if (x != NULL && json_object_set(tx->out, pass[i], x) != 0) {
            return tx_nomem(tx);
        }
    }
    return 0;
}

/* The chat body of an Anthropic request (count: a count_tokens request). */
static json_t *
translate(sp_dialect_tx_t *tx, sp_http_req_t *r, const json_t *b, bool count, int64_t max_cap)
{
    tx->out = json_object();
    tx->msgs = json_array();
    if (tx->out == NULL || tx->msgs == NULL || json_object_set(tx->out, "messages", tx->msgs) != 0) {
        tx_nomem(tx);
    } else if (tx_misc(tx, r, b) == 0 && tx_params(tx, b, count, max_cap) == 0 && tx_messages(tx, b) == 0 &&
               tx_tools(tx, b) == 0) {
        json_decref(tx->msgs);
        return tx->out;
    }
    json_decref(tx->msgs);
    json_decref(tx->out);
    return NULL;
}

/* -------------------------------------------------------------- handlers */

static void
run(sp_http_req_t *r, const sp_route_params_t *p, void *ud, sp_route_fn self, bool count)
{
    sp_serving_t *s = ud;
    json_t *b = sp_api_json_body(s, r, self, p);
    if (b == NULL) {
        return;
    }
    /* anthropic-version: any version is answered the same (the API as of 2023-06-01) */
    sp_dialect_tx_t tx = {0};
    json_t *chat = translate(&tx, r, b, count, s->cfg.max_tokens);
    if (chat == NULL) {
        sp_api_error(r, tx.status, "invalid_request_error", tx.param, NULL, "%s", tx.msg);
    } else {
        sp_api_chat_run(s, r, p, self, chat, &sp_anthropic_dialect, count, tx.flags);
        json_decref(chat);
    }
    json_decref(b);
}

static void
h_messages(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    run(r, p, ud, h_messages, false);
}

static void
h_count_tokens(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    run(r, p, ud, h_count_tokens, true);
}

void
sp_anthropic_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_POST, "/v1/messages", h_messages, s);
    sp_router_add(rt, SP_HTTP_POST, "/v1/messages/count_tokens", h_count_tokens, s);
    sp_api_dialect_claim("/v1/messages", &sp_anthropic_dialect);
}

/* ------------------------------------------------------- output dialect */

static const char *
stop_reason(const sp_dialect_req_t *d, const sp_dialect_choice_t *c)
{
    if (c->calls != NULL && json_array_size(c->calls) > 0) {
        return "tool_use";
    }
    (void)d;
    return c->finish == SP_FINISH_LENGTH ? "max_tokens" : c->stop_seq ? "stop_sequence" : "end_turn";
}

static size_t
calls_n(const sp_dialect_req_t *d, const json_t *calls)
{
    size_t n = calls ? json_array_size(calls) : 0;
    return d->one_call && n > 1 ? 1 : n;
}

/* A tool_use id: "toolu_" and 16 hex digits. */
static void
tool_use_head(const sp_dialect_req_t *d, const json_t *call, size_t k, sp_jbuf_t *b)
{
    char id[64];
    sp_dialect_id(id, sizeof id, "toolu", '_', d->req_id * 31u + (uint64_t)k);
    sp_jbuf_lit(b, "{\"type\":\"tool_use\",\"id\":");
    sp_jbuf_cstr(b, id);
    sp_jbuf_lit(b, ",\"name\":");
    sp_jbuf_cstr(b, json_string_value(json_object_get(call, "name")));
    sp_jbuf_lit(b, ",\"input\":");
}

static void
write_args(const json_t *call, sp_jbuf_t *b, bool quoted)
{
    const json_t *a = json_object_get(call, "arguments");
    char *args = a ? json_dumps(a, JSON_COMPACT) : NULL;
    if (quoted) {
        sp_jbuf_cstr(b, args ? args : "{}");
    } else {
        sp_jbuf_lit(b, args ? args : "{}");
    }
    sp_jfree(args);
}

static void
message_head(const sp_dialect_req_t *d, sp_jbuf_t *b)
{
    sp_jbuf_lit(b, "{\"id\":");
    sp_jbuf_cstr(b, d->id);
    sp_jbuf_lit(b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    sp_jbuf_lit(b, d->model);
}

static void
anth_answer(sp_dialect_req_t *d, const sp_dialect_choice_t *c, int n, int64_t completion,
            sp_jbuf_t *b)
{
    (void)n; /* one choice: the translation never asks for more */
    message_head(d, b);
    sp_jbuf_lit(b, ",\"content\":[");
    int blocks = 0;
    if ((d->flags & ANTH_THINKING) && c->reasoning_len > 0) {
        sp_jbuf_lit(b, "{\"type\":\"thinking\",\"thinking\":");
        sp_jbuf_str(b, c->reasoning, c->reasoning_len);
        sp_jbuf_lit(b, ",\"signature\":\"\"}");
        blocks++;
    }
    if (c->content_len > 0) {
        sp_jbuf_lit(b, blocks++ ? ",{\"type\":\"text\",\"text\":" : "{\"type\":\"text\",\"text\":");
        sp_jbuf_str(b, c->content, c->content_len);
        sp_jbuf_lit(b, "}");
    }
    for (size_t k = 0; k < calls_n(d, c->calls); k++) {
        const json_t *call = json_array_get(c->calls, k);
        sp_jbuf_lit(b, blocks++ ? "," : "");
        tool_use_head(d, call, k, b);
        write_args(call, b, false);
        sp_jbuf_lit(b, "}");
    }
    sp_jbuf_lit(b, "],\"stop_reason\":");
    sp_jbuf_cstr(b, stop_reason(d, c));
    sp_jbuf_lit(b, ",\"stop_sequence\":");
    sp_jbuf_cstr(b, c->calls && json_array_size(c->calls) > 0 ? NULL : c->stop_seq);
    sp_jbuf_printf(b, ",\"usage\":{\"input_tokens\":%lld,\"output_tokens\":%lld}}",
                   (long long)d->n_prompt, (long long)completion);
}

static void
event(sp_jbuf_t *b, const char *name)
{
    sp_dialect_sse_begin(b, name);
    sp_jbuf_printf(b, "{\"type\":\"%s\"", name);
}

static void
event_end(sp_jbuf_t *b)
{
    sp_jbuf_lit(b, "}");
    sp_dialect_sse_end(b);
}

static void
ping(sp_dialect_req_t *d, sp_jbuf_t *b)
{
    if (!(d->flags & ANTH_PINGED)) {
        d->flags |= ANTH_PINGED;
        event(b, "ping");
        event_end(b);
    }
}

static void
block_stop(sp_dialect_req_t *d, sp_jbuf_t *b)
{
    if (d->part != 0) {
        event(b, "content_block_stop");
        sp_jbuf_printf(b, ",\"index\":%d", d->n_parts - 1);
        event_end(b);
        d->part = 0;
    }
}

/* content_block_start of the next block, up to its "content_block" value,
 * which the caller writes. */
static void
block_start(sp_dialect_req_t *d, int part, sp_jbuf_t *b)
{
    block_stop(d, b);
    event(b, "content_block_start");
    sp_jbuf_printf(b, ",\"index\":%d,\"content_block\":", d->n_parts++);
    d->part = part;
}

static void
anth_stream_start(sp_dialect_req_t *d, sp_jbuf_t *b)
{
    event(b, "message_start");
    sp_jbuf_lit(b, ",\"message\":");
    message_head(d, b);
    sp_jbuf_printf(b, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
                   "\"usage\":{\"input_tokens\":%lld,\"output_tokens\":0}}", (long long)d->n_prompt);
    event_end(b);
}

static void
anth_stream_delta(sp_dialect_req_t *d, int index, sp_dialect_part_t part, const char *text,
                  size_t len, const sp_sched_event_t *ev, sp_jbuf_t *b)
{
    (void)index;
    (void)ev; /* Anthropic has no log-probabilities */
    const bool think = part == SP_DIALECT_REASONING;
    if (len == 0 || (think && !(d->flags & ANTH_THINKING))) {
        return;
    }
    if (d->part != (int)part) {
        block_start(d, (int)part, b);
        sp_jbuf_lit(b, think ? "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"
                             : "{\"type\":\"text\",\"text\":\"\"}");
        event_end(b);
        ping(d, b);
    }
    event(b, "content_block_delta");
    sp_jbuf_printf(b, ",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", d->n_parts - 1,
                   think ? "thinking_delta" : "text_delta", think ? "thinking" : "text");
    sp_jbuf_str(b, text, len);
    sp_jbuf_lit(b, "}");
    event_end(b);
}

/* The open block closes; each tool call is a tool_use block whose input
 * comes as one input_json_delta. */
static void
anth_stream_finish(sp_dialect_req_t *d, const sp_dialect_choice_t *c, sp_jbuf_t *b)
{
    block_stop(d, b);
    for (size_t k = 0; k < calls_n(d, c->calls); k++) {
        const json_t *call = json_array_get(c->calls, k);
        block_start(d, 3, b);
        tool_use_head(d, call, k, b);
        sp_jbuf_lit(b, "{}}");
        event_end(b);
        ping(d, b);
        event(b, "content_block_delta");
        sp_jbuf_printf(b, ",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":",
                       d->n_parts - 1);
        write_args(call, b, true);
        sp_jbuf_lit(b, "}");
        event_end(b);
        block_stop(d, b);
    }
    d->reason = stop_reason(d, c);
    d->stop_seq = c->calls && json_array_size(c->calls) > 0 ? NULL : c->stop_seq;
}

static void
anth_stream_end(sp_dialect_req_t *d, int64_t completion, sp_jbuf_t *b)
{
    ping(d, b);
    event(b, "message_delta");
    sp_jbuf_lit(b, ",\"delta\":{\"stop_reason\":");
    sp_jbuf_cstr(b, d->reason ? d->reason : "end_turn");
    sp_jbuf_lit(b, ",\"stop_sequence\":");
    sp_jbuf_cstr(b, d->stop_seq);
    sp_jbuf_printf(b, "},\"usage\":{\"output_tokens\":%lld}", (long long)completion);
    event_end(b);
    event(b, "message_stop");
    event_end(b);
}

static const char *
error_type(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return "overloaded_error";
    case 504:
        return "timeout_error";
    default:
        return status < 500 ? "invalid_request_error" : "api_error";
    }
}

static void
anth_error(sp_jbuf_t *b, int status, const char *type, const char *param, const char *code,
           const char *message)
{
    (void)type; /* OpenAI's words; Anthropic's type follows the status */
    (void)code;
    sp_jbuf_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", error_type(status));
    if (param != NULL && strncmp(message, param, strlen(param)) != 0 && message[0] != '\'') {
        /* name the field, as Anthropic's messages do ("max_tokens: ...") */
        sp_jbuf_t m;
        sp_jbuf_init(&m);
        sp_jbuf_printf(&m, "%s: %s", param, message);
        sp_jbuf_cstr(b, m.oom ? message : m.p);
        sp_jbuf_free(&m);
    } else {
        sp_jbuf_cstr(b, message);
    }
    sp_jbuf_lit(b, "}}");
}

static void
anth_stream_error(sp_dialect_req_t *d, int status, const char *message, sp_jbuf_t *b)
{
    (void)d;
    sp_dialect_sse_begin(b, "error");
    anth_error(b, status, NULL, NULL, NULL, message);
    sp_dialect_sse_end(b);
}

static void
anth_count(sp_dialect_req_t *d, int64_t n_prompt, sp_jbuf_t *b)
{
    (void)d;
    sp_jbuf_printf(b, "{\"input_tokens\":%lld}", (long long)n_prompt);
}

const sp_api_dialect_t sp_anthropic_dialect = {
    .name = "anthropic/messages",
    .stream_type = "text/event-stream",
    .id_prefix = "msg",
    .id_sep = '_',
    .max_is_ceiling = true, /* clients send their own models' limits (32000 and more) */
    .answer = anth_answer,
    .stream_start = anth_stream_start,
    .stream_delta = anth_stream_delta,
    .stream_finish = anth_stream_finish,
    .stream_end = anth_stream_end,
    .stream_error = anth_stream_error,
    .count = anth_count,
    .error = anth_error,
};
