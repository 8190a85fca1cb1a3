/*
 * ollama_chat.c - Ollama's POST /api/chat and /api/generate on the one chat
 * pipeline (dialect.h): the Ollama request is translated into the chat
 * parameters, sp_api_chat_run does the rest (parsing, template, grammar,
 * scheduler, tenants, quotas, metrics, tracing, logs), and the Ollama dialect
 * below writes every byte the client gets: one JSON object, or (Ollama's
 * default, stream true) NDJSON lines, each {"model", "created_at",
 * "message" | "response", "done": false}, then a last one with done true,
 * done_reason and the timings in nanoseconds.
 *
 * The mapping:
 *   options      temperature, top_p, top_k, min_p, seed, num_predict (-1 and
 *                -2: until the context is full), stop, repeat_penalty,
 *                presence_penalty, frequency_penalty become the sampler's;
 *                num_ctx up to the model's context is met by it (more is a
 *                400); repeat_last_n must be the sampler's window (64), and
 *                the documented options this server does not implement
 *                (mirostat, typical_p, tfs_z, the runner's placement knobs)
 *                are refused unless they ask for their no-op value; unknown
 *                keys are ignored, as Ollama does.
 *   format       "json" is a JSON object grammar; a JSON schema object goes
 *                through the schema compiler (constrain/schema.h).
 *   think        true/false: the template's enable_thinking; "low" |
 *                "medium" | "high": its reasoning_effort. The thinking is
 *                returned apart ("thinking") unless think is false. A model
 *                whose template has no reasoning markup refuses think true.
 *   tools        as OpenAI's; tool_calls come back as Ollama's
 *                [{"function": {"name", "arguments": {...}}}].
 *   /api/generate: system and prompt become a system and a user message
 *                (the model's chat template); raw true: the prompt as is;
 *                context: token ids before the prompt, and the final line's
 *                context (prompt and answer ids, not with raw); suffix:
 *                fill-in-the-middle with the model's FIM tokens (no template);
 *                template and images are refused with a 400 naming them.
 *   keep_alive   the model's idle deadline (ollama.c, sp_served_keep_alive).
 *   An empty prompt (generate) or message list (chat) loads the model and
 *   answers done_reason "load", as Ollama does; with keep_alive 0 it answers
 *   "unload" and the model is unloaded once no request holds it.
 *
 * Threads: a loop thread (the handlers and the dialect's writers).
 * Memory: the translated body is the handler's until sp_api_chat_run takes
 * its own reference; the writers keep nothing between calls beyond the
 * dialect's fields of sp_dialect_req_t.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/jfree.h"
#include "core/timer.h"
#include "api/api.h"
#include "api/dialect.h"
#include "api/json_body.h"
#include "api/ollama.h"

/* The dialect's bits in sp_dialect_req_t.flags (ollama.h); the bits from
 * SP_OLLAMA_LOAD_SHIFT up hold how long the request waited for its model (ms). */
#define OL_GENERATE SP_OLLAMA_GENERATE
#define OL_NO_THINK SP_OLLAMA_NO_THINK
#define OL_LOAD_SHIFT SP_OLLAMA_LOAD_SHIFT
#define OL_LOAD_MAX_MS ((1 << (31 - OL_LOAD_SHIFT)) - 1)

/* ---------------------------------------------------------- translation */

/* A translation is the shared record (dialect.h); every refusal here is a
 * 400 naming a field. Its ud is the request's ol_req_t. */
#define tx_fail(tx, ...) sp_dialect_fail((tx), 400, __VA_ARGS__)
#define tx_set(tx, obj, key, v) sp_dialect_set((tx), (obj), (key), (v))

typedef struct ol_req {
    const char *name;  /* the model (and adapter) as named, without ":latest" */
    size_t name_len;
    int64_t keep_ns;   /* keep_alive (sp_ollama_keep_alive) */
    sp_api_chat_opts_t opts; /* /api/generate: raw, context, suffix */
} ol_req_t;

/* A documented option this server does not implement: accepted only with
 * the value that leaves sampling as it is. */
typedef struct noop_opt {
    const char *name;
    double noop;       /* the value that changes nothing; NAN: any value is refused */
    const char *why;
} noop_opt_t;

static const noop_opt_t noop_opts[] = {
    {"repeat_last_n", 64, "the repetition penalties look at the last 64 tokens"},
    {"typical_p", 1, "locally typical sampling is not implemented"},
    {"tfs_z", 1, "tail-free sampling is not implemented"},
    {"mirostat", 0, "mirostat sampling is not implemented"},
    {"num_keep", -1, "the context is never shifted: a prompt that does not fit is refused"},
    {"num_batch", NAN, "the batch size is the server's (--batch)"},
    {"num_gpu", NAN, "layer placement is the model configuration's (instance_group)"},
    {"main_gpu", NAN, "device placement is the model configuration's (instance_group)"},
    {"num_thread", NAN, "threads are the server's (--threads)"},
    {"numa", NAN, "NUMA placement is not configurable per request"},
    {"low_vram", NAN, "memory use is the server's (--memory-budget)"},
    {"use_mmap", NAN, "model files are always memory-mapped"},
    {"use_mlock", NAN, "memory locking is not configurable per request"},
    {"vocab_only", NAN, "a request always runs the whole model"},
    {"penalize_newline", NAN, "newlines are penalised like any token"},
};

/* options -> the chat parameters; the model's context for num_ctx. */
static int
tx_options(sp_dialect_tx_t *tx, const json_t *opts, int64_t n_ctx)
{
    if (opts == NULL || json_is_null(opts)) {
        return 0;
    }
    if (!json_is_object(opts)) {
        return tx_fail(tx, "options", "options must be an object");
    }
    /* same name, same meaning */
    static const char *const same[] = {"temperature", "top_p", "top_k", "min_p", "seed",
                                       "presence_penalty", "frequency_penalty", "stop"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        json_t *v = json_object_get(opts, same[i]);
        if (v != NULL && !json_is_null(v) && tx_set(tx, tx->out, same[i], json_incref(v)) != 0) {
            return -1;
        }
    }
    json_t *rp = json_object_get(opts, "repeat_penalty");
    if (rp != NULL && !json_is_null(rp) &&
        tx_set(tx, tx->out, "repetition_penalty", json_incref(rp)) != 0) {
        return -1;
    }
    json_t *np = json_object_get(opts, "num_predict");
    if (np != NULL && !json_is_null(np)) {
        if (!json_is_integer(np) || json_integer_value(np) < -2) {
            return tx_fail(tx, "options", "options.num_predict must be an integer >= -2");
        }
        /* -1 (no limit) and -2 (fill the context): until the context is full */
        if (json_integer_value(np) >= 0 && tx_set(tx, tx->out, "max_tokens", json_incref(np)) != 0) {
            return -1;
        }
    }
    json_t *nc = json_object_get(opts, "num_ctx");
    if (nc != NULL && !json_is_null(nc)) {
        if (!json_is_integer(nc) || json_integer_value(nc) < 1) {
            return tx_fail(tx, "options", "options.num_ctx must be a positive integer");
        }
        if (json_integer_value(nc) > n_ctx) {
            return tx_fail(tx, "options",
                           "options.num_ctx %lld is more than this model's context of %lld tokens "
                           "(set at load: the model configuration's n_ctx)",
                           (long long)json_integer_value(nc), (long long)n_ctx);
        }
    }
    for (size_t i = 0; i < sizeof noop_opts / sizeof noop_opts[0]; i++) {
        const json_t *v = json_object_get(opts, noop_opts[i].name);
        if (v == NULL || json_is_null(v)) {
            continue;
        }
        if (!json_is_number(v) || isnan(noop_opts[i].noop) ||
            json_number_value(v) != noop_opts[i].noop) {
            return tx_fail(tx, "options", "options.%s is not supported: %s", noop_opts[i].name,
                           noop_opts[i].why);
        }
    }
    return 0;
}

/* format: "json", a JSON schema, or nothing ("" or null). */
static int
tx_format(sp_dialect_tx_t *tx, const json_t *f)
{
    if (f == NULL || json_is_null(f) || (json_is_string(f) && json_string_length(f) == 0)) {
        return 0;
    }
    json_t *rf;
    if (json_is_string(f) && strcmp(json_string_value(f), "json") == 0) {
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (json_is_object(f)) {
        rf = json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema", "name", "format",
                       "schema", f);
    } else {
        return tx_fail(tx, "format", "format must be \"json\" or a JSON schema object");
    }
    return tx_set(tx, tx->out, "response_format", rf);
}

/* think: a boolean, or a reasoning effort. */
static int
tx_think(sp_dialect_tx_t *tx, const json_t *t, const sp_served_model_t *m)
{
    if (t == NULL || json_is_null(t)) {
        return 0;
    }
    bool reasoning = m->tmpl != NULL && sp_chat_reasoning_format(m->tmpl) != SP_CHAT_REASONING_NONE;
    if (json_is_boolean(t)) {
        if (json_is_true(t) && !reasoning) {
            return tx_fail(tx, "think", "\"%s\" does not support thinking", m->name);
        }
        if (json_is_false(t)) {
            tx->flags |= OL_NO_THINK;
        }
        if (!reasoning) {
            return 0; /* think false on a model that does not think: nothing to turn off */
        }
        return tx_set(tx, tx->out, "chat_template_kwargs",
                      json_pack("{s:b}", "enable_thinking", json_is_true(t)));
    }
    const char *v = json_string_value(t);
    if (v == NULL || (strcmp(v, "low") != 0 && strcmp(v, "medium") != 0 && strcmp(v, "high") != 0)) {
        return tx_fail(tx, "think", "think must be true, false, \"low\", \"medium\" or \"high\"");
    }
    if (!reasoning) {
        return tx_fail(tx, "think", "\"%s\" does not support thinking", m->name);
    }
    return tx_set(tx, tx->out, "reasoning_effort", json_string(v));
}

/* One Ollama message as an OpenAI one: images refused, tool_calls with
 * their arguments as JSON text, a tool result's tool_name kept as name. */
static json_t *
tx_message(sp_dialect_tx_t *tx, const json_t *mo, size_t i)
{
    if (!json_is_object(mo) || !json_is_string(json_object_get(mo, "role"))) {
        tx_fail(tx, "messages", "messages[%zu] must be an object with a string role", i);
        return NULL;
    }
    const json_t *im = json_object_get(mo, "images");
    if (im != NULL && !json_is_null(im) && !(json_is_array(im) && json_array_size(im) == 0)) {
        tx_fail(tx, "messages", "messages[%zu]: images are not supported (no vision model is served)", i);
        return NULL;
    }
    const json_t *content = json_object_get(mo, "content");
    if (content != NULL && !json_is_null(content) && !json_is_string(content)) {
        tx_fail(tx, "messages", "messages[%zu].content must be a string", i);
        return NULL;
    }
    json_t *ct = content != NULL && !json_is_null(content) ? json_incref((json_t *)content) : json_string("");
    json_t *o = ct ? json_pack("{s:O,s:o}", "role", json_object_get(mo, "role"), "content", ct) : NULL;
    if (o == NULL) {
        sp_dialect_nomem(tx);
        return NULL;
    }
    const json_t *tn = json_object_get(mo, "tool_name");
    if (json_is_string(tn) && json_object_set(o, "name", (json_t *)tn) != 0) {
        json_decref(o);
        sp_dialect_nomem(tx);
        return NULL;
    }
    const json_t *calls = json_object_get(mo, "tool_calls");
    if (calls != NULL && !json_is_null(calls)) {
        json_t *oc = json_array();
        size_t k;
        const json_t *c;
        if (!json_is_array(calls)) {
            json_decref(oc);
            json_decref(o);
            tx_fail(tx, "messages", "messages[%zu].tool_calls must be a list", i);
            return NULL;
        }
        json_array_foreach(calls, k, c) {
            const json_t *fn = json_object_get(c, "function");
            const json_t *name = json_object_get(fn, "name");
            const json_t *args = json_object_get(fn, "arguments");
            if (!json_is_string(name) || (args != NULL && !json_is_object(args))) {
                json_decref(oc);
                json_decref(o);
                tx_fail(tx, "messages", "messages[%zu].tool_calls[%zu] must be {\"function\": "
                        "{\"name\": \"...\", \"arguments\": {...}}}", i, k);
                return NULL;
            }
            char *text = args ? json_dumps(args, JSON_COMPACT) : NULL;
            char id[64];
            snprintf(id, sizeof id, "call_%zu_%zu", i, k);
            json_t *oc1 = json_pack("{s:s,s:s,s:{s:O,s:s}}", "id", id, "type", "function", "function",
                                    "name", name, "arguments", text ? text : "{}");
            if (text != NULL) {
                sp_jfree(text);
            }
            if (oc1 == NULL || json_array_append_new(oc, oc1) != 0) {
                json_decref(oc);
                json_decref(o);
                sp_dialect_nomem(tx);
                return NULL;
            }
        }
        if (json_object_set_new(o, "tool_calls", oc) != 0) {
            json_decref(o);
            sp_dialect_nomem(tx);
            return NULL;
        }
    }
    return o;
}

/* The fields both routes share: model (":latest" dropped), stream (Ollama's
 * default: true), keep_alive, options, format, think. */
static int
tx_common(sp_dialect_tx_t *tx, const json_t *b, const sp_served_model_t *m)
{
    ol_req_t *q = tx->ud;
    if (tx_set(tx, tx->out, "model", json_stringn(q->name, q->name_len)) != 0) {
        return -1;
    }
    const json_t *st = json_object_get(b, "stream");
    if (st != NULL && !json_is_null(st) && !json_is_boolean(st)) {
        return tx_fail(tx, "stream", "stream must be a boolean");
    }
    if (tx_set(tx, tx->out, "stream", json_boolean(st == NULL || json_is_null(st) || json_is_true(st))) != 0) {
        return -1;
    }
    if (sp_ollama_keep_alive(b, sp_ollama_keep_default(m->srv), &q->keep_ns, tx->msg,
                             sizeof tx->msg) != 0) {
        tx->status = 400;
        tx->param = "keep_alive";
        return -1;
    }
    return tx_options(tx, json_object_get(b, "options"), m->n_ctx) != 0 ||
                   tx_format(tx, json_object_get(b, "format")) != 0 ||
                   tx_think(tx, json_object_get(b, "think"), m) != 0
               ? -1
               : 0;
}

static json_t *
tx_chat(sp_dialect_tx_t *tx, const json_t *b, const sp_served_model_t *m)
{
    const json_t *ms = json_object_get(b, "messages");
    if (ms != NULL && !json_is_null(ms) && !json_is_array(ms)) {
        tx_fail(tx, "messages", "messages must be a list");
        return NULL;
    }
    json_t *msgs = json_array();
    size_t i;
    const json_t *mo;
    json_array_foreach(ms, i, mo) {
        json_t *o = tx_message(tx, mo, i);
        if (o == NULL || json_array_append_new(msgs, o) != 0) {
            json_decref(msgs);
            return NULL;
        }
    }
    if (tx_set(tx, tx->out, "messages", msgs) != 0 || tx_common(tx, b, m) != 0) {
        return NULL;
    }
    const json_t *tools = json_object_get(b, "tools");
    if (tools != NULL && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0) &&
        tx_set(tx, tx->out, "tools", json_incref((json_t *)tools)) != 0) {
        return NULL;
    }
    return tx->out;
}

static json_t *
tx_generate(sp_dialect_tx_t *tx, const json_t *b, const sp_served_model_t *m)
{
    ol_req_t *q = tx->ud;
    static const char *const refused[][2] = {
        {"template", "template (a Go template) is not supported: the model's own chat template is used"},
        {"images", "images are not supported (no vision model is served)"},
    };
    tx->flags |= OL_GENERATE;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const json_t *v = json_object_get(b, refused[i][0]);
        if (v != NULL && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0) &&
            !(json_is_array(v) && json_array_size(v) == 0)) {
            tx_fail(tx, refused[i][0], "%s", refused[i][1]);
            return NULL;
        }
    }
    const json_t *raw = json_object_get(b, "raw");
    if (raw != NULL && !json_is_null(raw) && !json_is_boolean(raw)) {
        tx_fail(tx, "raw", "raw must be a boolean");
        return NULL;
    }
    const json_t *sys = json_object_get(b, "system");
    const json_t *prompt = json_object_get(b, "prompt");
    if ((sys != NULL && !json_is_null(sys) && !json_is_string(sys)) ||
        (prompt != NULL && !json_is_null(prompt) && !json_is_string(prompt))) {
        tx_fail(tx, sys && !json_is_string(sys) ? "system" : "prompt", "system and prompt must be strings");
        return NULL;
    }
    /* raw: the prompt as is, no template (so no system message either);
     * context: the ids an earlier answer returned, before the prompt. The
     * final answer carries the context (prompt and answer ids) unless raw,
     * as Ollama's does. Both go into the body too, for the response cache. */
    const json_t *ctx = json_object_get(b, "context");
    if (ctx != NULL && !json_is_null(ctx) && !json_is_array(ctx)) {
        tx_fail(tx, "context", "context must be the list of token ids an earlier answer returned");
        return NULL;
    }
    /* suffix: fill-in-the-middle (the prompt is the text before the hole), laid
     * out with the model's FIM tokens as /v1/completions' suffix, no template */
    const json_t *sfx = json_object_get(b, "suffix");
    if (sfx != NULL && !json_is_null(sfx) && !json_is_string(sfx)) {
        tx_fail(tx, "suffix", "suffix must be a string");
        return NULL;
    }
    bool fim = json_is_string(sfx) && json_string_length(sfx) > 0;
    if (fim) {
        q->opts.fim_suffix = json_string_value(sfx);
        q->opts.fim_suffix_len = json_string_length(sfx);
        /* for the response cache's key only ("suffix" is a completions field there) */
        if (tx_set(tx, tx->out, "ollama_suffix", json_incref((json_t *)sfx)) != 0) {
            return NULL;
        }
    }
    if (json_is_true(raw) || fim) {
        if (json_is_string(sys) && json_string_length(sys) > 0) {
            tx_fail(tx, "system", "system is part of the template, which raw and suffix leave out: "
                    "write it into the prompt");
            return NULL;
        }
        q->opts.raw_prompt = json_is_string(prompt) ? json_string_value(prompt) : "";
        q->opts.raw_len = json_is_string(prompt) ? json_string_length(prompt) : 0;
        if (json_is_true(raw) && tx_set(tx, tx->out, "raw", json_true()) != 0) {
            return NULL;
        }
    }
    q->opts.keep_tokens = !json_is_true(raw);
    if (json_array_size(ctx) > 0) {
        q->opts.context = ctx;
        if (tx_set(tx, tx->out, "context", json_incref((json_t *)ctx)) != 0) {
            return NULL;
        }
    }
    json_t *msgs = json_array();
    if (json_is_string(sys) && json_string_length(sys) > 0) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", sys));
    }
    if (json_is_string(prompt) && json_string_length(prompt) > 0) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", prompt));
    } else if (q->opts.fim_suffix != NULL) { /* a hole at the start: still something to write */
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", ""));
    }
    if (tx_set(tx, tx->out, "messages", msgs) != 0 || tx_common(tx, b, m) != 0) {
        return NULL;
    }
    return tx->out;
}

/* ------------------------------------------------------------ the dialect */

/* created_at: the wall time now, RFC 3339 with nanoseconds as Ollama writes it. */
static void
created_at(sp_jbuf_t *b)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%09ldZ", ts.tv_nsec);
    sp_jbuf_lit(b, "\"created_at\":");
    sp_jbuf_cstr(b, when);
}

static void
line_head(const sp_dialect_req_t *d, sp_jbuf_t *b)
{
    sp_jbuf_lit(b, "{\"model\":");
    sp_jbuf_lit(b, d->model);
    sp_jbuf_lit(b, ",");
    created_at(b);
}

/* Ollama's tool_calls: [{"function": {"name", "arguments": {...}}}]. */
static void
write_calls(const json_t *calls, sp_jbuf_t *b)
{
    sp_jbuf_lit(b, ",\"tool_calls\":[");
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *c = json_array_get(calls, k);
        sp_jbuf_printf(b, "%s{\"function\":{\"index\":%zu,\"name\":", k ? "," : "", k);
        sp_jbuf_json(b, json_object_get(c, "name"));
        sp_jbuf_lit(b, ",\"arguments\":");
        const json_t *args = json_object_get(c, "arguments");
        if (args != NULL) {
            sp_jbuf_json(b, args);
        } else {
            sp_jbuf_lit(b, "{}");
        }
        sp_jbuf_lit(b, "}}");
    }
    sp_jbuf_lit(b, "]");
}

/* The answer's text (and thinking): message (chat) or response (generate). */
static void
write_body(const sp_dialect_req_t *d, const char *text, size_t len, const char *thinking,
           size_t tlen, const json_t *calls, sp_jbuf_t *b)
{
    bool show_think = thinking != NULL && tlen > 0 && !(d->flags & OL_NO_THINK);
    if (d->flags & OL_GENERATE) {
        sp_jbuf_lit(b, ",\"response\":");
        sp_jbuf_str(b, text ? text : "", len);
        if (show_think) {
            sp_jbuf_lit(b, ",\"thinking\":");
            sp_jbuf_str(b, thinking, tlen);
        }
        return;
    }
    sp_jbuf_lit(b, ",\"message\":{\"role\":\"assistant\",\"content\":");
    sp_jbuf_str(b, text ? text : "", len);
    if (show_think) {
        sp_jbuf_lit(b, ",\"thinking\":");
        sp_jbuf_str(b, thinking, tlen);
    }
    if (calls != NULL && json_array_size(calls) > 0) {
        write_calls(calls, b);
    }
    sp_jbuf_lit(b, "}");
}

/*
 * done, done_reason and the timings, in nanoseconds, from the request's
 * clock (written as the job's DONE is answered, so now is its end):
 *   total_duration        the request's arrival to now
 *   load_duration         the wait for the model to load (the handler's)
 *   prompt_eval_duration  the job's admission (now - compute) to its first token
 *   eval_duration         the first token to now
 */
static void
write_done(const sp_dialect_req_t *d, const char *reason, int64_t completion, sp_jbuf_t *b)
{
    const sp_req_clock_t *c = d->clk;
    int64_t now = sp_time_ns();
    int64_t total = now - c->t0_ns;
    int64_t load = (int64_t)(d->flags >> OL_LOAD_SHIFT) * 1000000;
    int64_t compute = c->compute_ns > 0 ? c->compute_ns : 0;
    int64_t admitted = now - compute;
    int64_t pe = c->first_ns > 0 ? c->first_ns - admitted : compute;
    int64_t ev = c->first_ns > 0 ? now - c->first_ns : 0;
    sp_jbuf_lit(b, ",\"done\":true,\"done_reason\":");
    sp_jbuf_cstr(b, reason);
    sp_jbuf_printf(b, ",\"total_duration\":%lld,\"load_duration\":%lld,\"prompt_eval_count\":%lld,"
                   "\"prompt_eval_duration\":%lld,\"eval_count\":%lld,\"eval_duration\":%lld}",
                   (long long)total, (long long)(load < total ? load : total), (long long)d->n_prompt,
                   (long long)(pe > 0 ? pe : 0), (long long)completion, (long long)(ev > 0 ? ev : 0));
}

/* /api/generate's "context": the prompt's ids and the answer's, to send back. */
static void
write_context(const sp_dialect_req_t *d, sp_jbuf_t *b)
{
    if (!(d->flags & OL_GENERATE) || d->prompt_ids == NULL) {
        return;
    }
    sp_jbuf_lit(b, ",\"context\":[");
    for (int64_t i = 0; i < d->n_prompt_ids + d->n_gen_ids; i++) {
        int32_t id = i < d->n_prompt_ids ? d->prompt_ids[i] : d->gen_ids[i - d->n_prompt_ids];
        sp_jbuf_printf(b, "%s%d", i ? "," : "", (int)id);
    }
    sp_jbuf_lit(b, "]");
}

static const char *
done_reason(const sp_dialect_choice_t *c)
{
    return c->finish == SP_FINISH_LENGTH ? "length" : "stop";
}

static void
ol_answer(sp_dialect_req_t *d, const sp_dialect_choice_t *c, int n, int64_t completion, sp_jbuf_t *b)
{
    (void)n; /* Ollama has one answer per request (n is never set) */
    line_head(d, b);
    write_body(d, c->content, c->content_len, c->reasoning, c->reasoning_len, c->calls, b);
    write_context(d, b);
    write_done(d, done_reason(c), completion, b);
}

static void
ol_stream_start(sp_dialect_req_t *d, sp_jbuf_t *b)
{
    (void)d;
    (void)b; /* Ollama's stream opens with the first text */
}

static void
ol_stream_delta(sp_dialect_req_t *d, int index, sp_dialect_part_t part, const char *text,
                size_t len, const sp_sched_event_t *ev, sp_jbuf_t *b)
{
    (void)index;
    (void)ev;
    if (part == SP_DIALECT_REASONING && (d->flags & OL_NO_THINK)) {
        return;
    }
    line_head(d, b);
    if (part == SP_DIALECT_REASONING) {
        write_body(d, "", 0, text, len, NULL, b);
    } else {
        write_body(d, text, len, NULL, 0, NULL, b);
    }
    sp_jbuf_lit(b, ",\"done\":false}");
    sp_dialect_ndjson_end(b);
}

/* The calls (one line, as Ollama sends them), and the reason for the end. */
static void
ol_stream_finish(sp_dialect_req_t *d, const sp_dialect_choice_t *c, sp_jbuf_t *b)
{
    d->reason = done_reason(c);
    if (c->calls != NULL && json_array_size(c->calls) > 0 && !(d->flags & OL_GENERATE)) {
        line_head(d, b);
        write_body(d, "", 0, NULL, 0, c->calls, b);
        sp_jbuf_lit(b, ",\"done\":false}");
        sp_dialect_ndjson_end(b);
    }
}

static void
ol_stream_end(sp_dialect_req_t *d, int64_t completion, sp_jbuf_t *b)
{
    line_head(d, b);
    write_body(d, "", 0, NULL, 0, NULL, b);
    write_context(d, b);
    write_done(d, d->reason ? d->reason : "stop", completion, b);
    sp_dialect_ndjson_end(b);
}

/* A failure after the stream began: one {"error"} line, as Ollama sends it. */
static void
ol_stream_error(sp_dialect_req_t *d, int status, const char *message, sp_jbuf_t *b)
{
    (void)d;
    (void)status;
    sp_jbuf_lit(b, "{\"error\":");
    sp_jbuf_cstr(b, message);
    sp_jbuf_lit(b, "}");
    sp_dialect_ndjson_end(b);
}

static void
ol_error(sp_jbuf_t *b, int status, const char *type, const char *param, const char *code,
         const char *message)
{
    (void)status;
    (void)type;
    (void)param;
    (void)code;
    sp_jbuf_lit(b, "{\"error\":");
    sp_jbuf_cstr(b, message);
    sp_jbuf_lit(b, "}");
}

const sp_api_dialect_t sp_ollama_dialect = {
    .name = "ollama",
    .stream_type = "application/x-ndjson",
    .id_prefix = "ollama",
    .id_sep = '-',
    .answer = ol_answer,
    .stream_start = ol_stream_start,
    .stream_delta = ol_stream_delta,
    .stream_finish = ol_stream_finish,
    .stream_end = ol_stream_end,
    .stream_error = ol_stream_error,
    .count = NULL,
    .error = ol_error,
};

/* ------------------------------------------------------------- handlers */

/* Nothing to generate: the model is loaded (done_reason "load"), or is
 * unloaded (keep_alive 0: "unload"), as Ollama answers an empty prompt. */
static void
reply_load(sp_http_req_t *r, const sp_served_model_t *m, bool generate, int64_t t0, int64_t load,
           bool unload)
{
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"model\":");
    sp_jbuf_cstr(&b, m->name);
    sp_jbuf_lit(&b, ",");
    created_at(&b);
    sp_jbuf_lit(&b, generate ? ",\"response\":\"\"" : ",\"message\":{\"role\":\"assistant\",\"content\":\"\"}");
    sp_jbuf_printf(&b, ",\"done\":true,\"done_reason\":\"%s\",\"total_duration\":%lld,"
                   "\"load_duration\":%lld}", unload ? "unload" : "load",
                   (long long)(sp_time_ns() - t0), (long long)load);
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

static void
run(sp_http_req_t *r, const sp_route_params_t *p, void *ud, sp_route_fn self, bool generate)
{
    sp_serving_t *s = ud;
    json_t *b = sp_api_json_body(s, r, self, p);
    if (b == NULL) {
        return;
    }
    /* The model first (parked here while it loads on demand), so the wait
     * for it is known: load_duration. */
    size_t name_len;
    sp_served_model_t *m = sp_ollama_model(s, r, b, self, p, &name_len);
    if (m == NULL) {
        json_decref(b);
        return;
    }
    int64_t t0 = sp_http_req_start_ns(r);
    int64_t load = sp_time_ns() - t0;
    ol_req_t q = {.name_len = name_len};
    sp_dialect_tx_t tx = {.out = json_object(), .ud = &q};
    q.name = json_string_value(json_object_get(b, "model"));
    if (q.name == NULL) {
        q.name = json_string_value(json_object_get(b, "name"));
    }
    json_t *chat = tx.out == NULL ? NULL : generate ? tx_generate(&tx, b, m) : tx_chat(&tx, b, m);
    if (chat == NULL) {
        if (tx.out == NULL) {
            sp_dialect_nomem(&tx);
        }
        sp_api_error(r, tx.status, NULL, tx.param, NULL, "%s", tx.msg);
    } else if (json_array_size(json_object_get(chat, "messages")) == 0) {
        /* Nothing to generate: load (done already), or with keep_alive 0
         * unload once this request lets go (Ollama's documented way). */
        sp_served_keep_alive(m, q.keep_ns);
        reply_load(r, m, generate, t0, load, q.keep_ns == 0);
    } else {
        sp_served_keep_alive(m, q.keep_ns);
        int64_t ms = load / 1000000;
        int flags = tx.flags | (int)((ms < OL_LOAD_MAX_MS ? ms : OL_LOAD_MAX_MS) << OL_LOAD_SHIFT);
        sp_api_chat_run_opts(s, r, p, self, chat, &sp_ollama_dialect, flags, &q.opts);
    }
    json_decref(tx.out);
    sp_served_release(m);
    json_decref(b);
}

static void
h_chat(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    run(r, p, ud, h_chat, false);
}

static void
h_generate(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    run(r, p, ud, h_generate, true);
}

void
sp_ollama_chat_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_api_dialect_claim("/api", &sp_ollama_dialect); /* every /api/ route's errors */
    sp_router_add(rt, SP_HTTP_POST, "/api/chat", h_chat, s);
    sp_router_add(rt, SP_HTTP_POST, "/api/generate", h_generate, s);
}
