/*
 * tokenize_routes.c - llama-server's routes for seeing what a model is fed:
 *
 *   POST /apply-template  {"messages": [...], "tools"?, "add_generation_prompt"?,
 *                          "chat_template_kwargs"?, "reasoning_effort"?} -> {"prompt": "..."}
 *   POST /tokenize        {"content": "...", "add_special"?, "parse_special"?,
 *                          "with_pieces"?} -> {"tokens": [...]}
 *   POST /detokenize      {"tokens": [...]} -> {"content": "..."}
 *
 * Each takes an optional "model" (the served model's name); without it the
 * one language model served is used, and several make it a 400. The prompt
 * of /apply-template is the one /v1/chat/completions renders for the same
 * messages, tools and template variables (same template, bos/eos texts,
 * generation prompt; chat_input.h gathers both).
 *
 * Threads: the event loop that owns the request checks the fields' types,
 * picks the model and sends the answer; the costly steps run on a
 * preparation worker (offload.h): a body over SP_API_INLINE_BODY is parsed
 * there (json_body.h), and the work itself (gathering and rendering the messages, tokenizing,
 * detokenizing, writing the answer) always is. Memory: the job (tk_job_t)
 * holds the parsed body and the model by reference, and the answer in its
 * buffer, until the result is back on the loop; it frees them all there,
 * whether the client is still there or not.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/jfree.h"
#include "core/json.h"
#include "core/utf8.h"
#include "chat/chat.h"
#include "text/tokenizer.h"
#include "api/api.h"
#include "api/chat_input.h"
#include "api/json_body.h"
#include "api/offload.h"

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

/* ---- the work, on a preparation worker ---------------------------------- */

typedef enum { TK_APPLY, TK_TOKENIZE, TK_DETOKENIZE } tk_kind_t;

/*
 * A request's work: the loop fills the inputs (references to the body and
 * the model, the options it checked) and hands the job to a worker, which
 * reads only those and writes the outcome; the loop reads the outcome once
 * the result is posted back (the mailbox's lock orders them).
 */
typedef struct tk_job {
    sp_offload_t off;
    sp_http_req_t *http;        /* NULL once the client left */
    tk_kind_t kind;
    sp_served_model_t *m;       /* a reference */
    json_t *body;               /* a reference; the fields below point into it */
    const json_t *arg;          /* apply: messages; tokenize: content; detokenize: tokens */
    const json_t *tools;        /* apply: NULL or the list */
    const json_t *kwargs;       /* apply: chat_template_kwargs, or NULL */
    const char *effort;         /* apply: reasoning_effort, or NULL */
    bool gen;                   /* apply: add_generation_prompt */
    bool add_special, parse_special, with_pieces; /* tokenize */
    /* the outcome: status 0 = out holds the answer */
    int status;
    const char *param;
    const char *code;           /* OpenAI's error code, NULL for none */
    char err[512];
    sp_jbuf_t out;
} tk_job_t;

/* Worker: record why the work failed (the loop answers it). */
static void SP_PRINTF(4, 5)
job_fail(tk_job_t *j, int status, const char *param, const char *fmt, ...)
{
    j->status = status;
    j->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err, sizeof j->err, fmt, ap);
    va_end(ap);
}

/* Worker: {"tokens": [...]} for the content. */
static void
work_tokenize(tk_job_t *j)
{
    const sp_tokenizer_t *tok = j->m->tok;
    const char *text = json_string_value(j->arg);
    size_t len = json_string_length(j->arg);
    int32_t *ids = NULL;
    int64_t n = sp_tokenizer_encode(tok, text, len, j->add_special, j->parse_special, NULL, 0);
    if (n >= 0) {
        ids = sp_malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
        n = ids == NULL ? SP_ERR_NOMEM
                        : sp_tokenizer_encode(tok, text, len, j->add_special, j->parse_special, ids, n);
    }
    if (n < 0) {
        job_fail(j, n == SP_ERR_NOMEM ? 503 : 400, "content", "cannot tokenize the content: %s",
                 sp_status_str((sp_status_t)n));
        sp_free(ids);
        return;
    }
    sp_jbuf_t *out = &j->out;
    sp_jbuf_lit(out, "{\"tokens\":[");
    for (int64_t i = 0; i < n; i++) {
        if (i > 0) {
            sp_jbuf_lit(out, ",");
        }
        if (!j->with_pieces) {
            sp_jbuf_int(out, ids[i]);
            continue;
        }
        /* llama-server's shape: the piece as a string when it is valid UTF-8,
         * else its bytes as a list of numbers */
        char piece[SP_TOKEN_MAX_BYTES];
        int32_t k = sp_tokenizer_piece(tok, ids[i], true, piece, (int32_t)sizeof piece);
        if (k < 0 || k > (int32_t)sizeof piece) {
            k = 0;
        }
        sp_jbuf_printf(out, "{\"id\":%d,\"piece\":", (int)ids[i]);
        if (sp_utf8_invalid_at(piece, (size_t)k) == (size_t)k) {
            sp_jbuf_str(out, piece, (size_t)k);
        } else {
            sp_jbuf_lit(out, "[");
            for (int32_t b = 0; b < k; b++) {
                sp_jbuf_printf(out, "%s%u", b ? "," : "", (unsigned)(unsigned char)piece[b]);
            }
            sp_jbuf_lit(out, "]");
        }
        sp_jbuf_lit(out, "}");
    }
    sp_jbuf_lit(out, "]}");
    sp_free(ids);
}

/* Worker: {"content": "..."} for the token ids. */
static void
work_detokenize(tk_job_t *j)
{
    const sp_tokenizer_t *tok = j->m->tok;
    int32_t n_vocab = sp_tokenizer_n_vocab(tok);
    sp_jbuf_t text;
    sp_jbuf_init(&text);
    for (size_t i = 0; i < json_array_size(j->arg); i++) {
        const json_t *v = json_array_get(j->arg, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= n_vocab) {
            job_fail(j, 400, "tokens", "tokens[%zu] is not a token id of the model %s (0..%d)", i,
                     j->m->name, (int)n_vocab - 1);
            sp_jbuf_free(&text);
            return;
        }
        char piece[SP_TOKEN_MAX_BYTES];
        /* control tokens are written as their text, as llama-server does */
        int32_t k = sp_tokenizer_piece(tok, (int32_t)json_integer_value(v), true, piece,
                                       (int32_t)sizeof piece);
        if (k > 0 && k <= (int32_t)sizeof piece) {
            sp_jbuf_raw(&text, piece, (size_t)k);
        }
    }
    if (text.oom) {
        job_fail(j, 503, NULL, "out of memory");
    } else {
        sp_jbuf_lit(&j->out, "{\"content\":");
        /* pieces may split a character: invalid bytes are sent as U+FFFD */
        sp_jbuf_str(&j->out, text.p != NULL ? text.p : "", text.len);
        sp_jbuf_lit(&j->out, "}");
    }
    sp_jbuf_free(&text);
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

/* Worker: {"prompt": "..."}, the messages gathered and rendered. */
static void
work_apply(tk_job_t *j)
{
    sp_served_model_t *m = j->m;
    sp_chat_input_t ci;
    sp_chat_input_init(&ci);
    char *tools_json = NULL, *extra_json = NULL, *prompt = NULL;
    char bos[SP_TOKEN_MAX_BYTES + 1], eos[SP_TOKEN_MAX_BYTES + 1];
    const char *param = NULL;
    sp_status_t st = sp_chat_input_gather(&ci, j->arg, &param, j->err, sizeof j->err);
    if (st != SP_OK) {
        job_fail(j, st == SP_ERR_NOMEM ? 503 : 400, param, "%s", j->err);
        j->code = st == SP_ERR_TOO_LARGE ? "limit_exceeded" : NULL;
        goto done;
    }
    if (j->tools != NULL && (tools_json = json_dumps(j->tools, JSON_COMPACT)) == NULL) {
        job_fail(j, 503, NULL, "out of memory");
        goto done;
    }
    if (sp_chat_input_extra_json(j->kwargs, j->effort, &extra_json) != SP_OK) {
        job_fail(j, 503, NULL, "out of memory");
        goto done;
    }
    sp_chat_params_t cp = {
        .add_generation_prompt = j->gen,
        .bos_text = token_text(m->tok, sp_tokenizer_bos(m->tok), bos, sizeof bos),
        .eos_text = token_text(m->tok, sp_tokenizer_eos(m->tok), eos, sizeof eos),
        .tools_json = tools_json,
        .extra_json = extra_json,
    };
    size_t plen = 0;
    char err[512];
    st = sp_chat_apply_ex(m->tmpl, ci.msgs, ci.n, &cp, &prompt, &plen, err, sizeof err);
    if (st != SP_OK) {
        job_fail(j, st == SP_ERR_NOMEM ? 503 : 400, "messages", "%s", err);
        j->code = st == SP_ERR_TOO_LARGE ? "limit_exceeded" : NULL;
        goto done;
    }
    sp_jbuf_lit(&j->out, "{\"prompt\":");
    sp_jbuf_str(&j->out, prompt, plen);
    sp_jbuf_lit(&j->out, "}");
done:
    sp_free(prompt);
    sp_jfree(tools_json);
    sp_jfree(extra_json);
    sp_chat_input_free(&ci);
}

static void
job_work(sp_offload_t *off)
{
    tk_job_t *j = SP_OFFLOAD_HOLDER(off, tk_job_t, off);
    switch (j->kind) {
    case TK_APPLY:
        work_apply(j);
        break;
    case TK_TOKENIZE:
        work_tokenize(j);
        break;
    case TK_DETOKENIZE:
        work_detokenize(j);
        break;
    }
    if (j->status == 0 && j->out.oom) {
        job_fail(j, 503, NULL, "out of memory");
    }
}

/* Loop thread: free the job and what it holds. */
static void
job_free(sp_offload_t *off)
{
    tk_job_t *j = SP_OFFLOAD_HOLDER(off, tk_job_t, off);
    sp_jbuf_free(&j->out);
    json_decref(j->body);
    sp_served_release(j->m);
    sp_free(j);
}

/* Loop thread: send the answer. */
static void
job_done(sp_offload_t *off, sp_http_req_t *r)
{
    tk_job_t *j = SP_OFFLOAD_HOLDER(off, tk_job_t, off);
    if (j->status == 0) {
        sp_api_reply_json(r, 200, &j->out);
    } else {
        sp_api_error(r, j->status, NULL, j->param, j->code, "%s", j->err);
    }
    job_free(off);
}

static const sp_offload_ops_t job_ops = {
    .stage = "prepare", .work = job_work, .done = job_done, .drop = job_free, .refuse = sp_api_refuse,
};

/* Loop thread: a job of kind for r, taking the references to m and b (it
 * releases them, also on failure). NULL after answering 503. */
static tk_job_t *
job_new(sp_http_req_t *r, tk_kind_t kind, sp_served_model_t *m, json_t *b)
{
    tk_job_t *j = sp_calloc(1, sizeof *j);
    if (j == NULL) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        sp_served_release(m);
        json_decref(b);
        return NULL;
    }
    j->http = r;
    j->kind = kind;
    j->m = m;
    j->body = b;
    sp_jbuf_init(&j->out);
    return j;
}

/* Loop thread: run j on a preparation worker; its result answers r. */
static void
job_start(sp_serving_t *s, tk_job_t *j)
{
    if (!sp_offload_start(&j->off, &job_ops, s->prep, &j->http, NULL, NULL)) {
        job_free(&j->off);
    }
}

/* ---- the routes: checks and the model, on the loop ---------------------- */

static void
h_tokenize(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = sp_api_json_body(s, r, h_tokenize, p);
    if (b == NULL) {
        return;
    }
    const json_t *c = json_object_get(b, "content");
    bool add_special = false, parse_special = true, with_pieces = false;
    sp_served_model_t *m;
    tk_job_t *j;
    if (!json_is_string(c)) {
        sp_api_error(r, 400, NULL, "content", NULL, "'content' must be a string");
    } else if (opt_bool(r, b, "add_special", &add_special) &&
               opt_bool(r, b, "parse_special", &parse_special) &&
               opt_bool(r, b, "with_pieces", &with_pieces) &&
               (m = pick_model(s, r, b, h_tokenize, p)) != NULL &&
               (j = job_new(r, TK_TOKENIZE, m, json_incref(b))) != NULL) {
        j->arg = c;
        j->add_special = add_special;
        j->parse_special = parse_special;
        j->with_pieces = with_pieces;
        job_start(s, j);
    }
    json_decref(b);
}

static void
h_detokenize(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = sp_api_json_body(s, r, h_detokenize, p);
    if (b == NULL) {
        return;
    }
    const json_t *toks = json_object_get(b, "tokens");
    sp_served_model_t *m;
    tk_job_t *j;
    if (!json_is_array(toks)) {
        sp_api_error(r, 400, NULL, "tokens", NULL, "'tokens' must be a list of token ids");
    } else if ((m = pick_model(s, r, b, h_detokenize, p)) != NULL &&
               (j = job_new(r, TK_DETOKENIZE, m, json_incref(b))) != NULL) {
        j->arg = toks;
        job_start(s, j);
    }
    json_decref(b);
}

static void
h_apply_template(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = sp_api_json_body(s, r, h_apply_template, p);
    if (b == NULL) {
        return;
    }
    sp_served_model_t *m = NULL;
    const json_t *ms = json_object_get(b, "messages");
    const json_t *tools = json_object_get(b, "tools");
    const json_t *kw = NULL;
    const char *effort = NULL, *param = NULL;
    char err[256];
    bool gen = true;
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        sp_api_error(r, 400, NULL, "messages", NULL, "'messages' must be a non-empty list");
        goto done;
    }
    if (tools != NULL && !json_is_null(tools) && !json_is_array(tools)) {
        sp_api_error(r, 400, NULL, "tools", NULL, "'tools' must be a list");
        goto done;
    }
    if (sp_chat_input_options(b, &kw, &effort, &param, err, sizeof err) != SP_OK) {
        sp_api_error(r, 400, NULL, param, NULL, "%s", err);
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
        sp_served_release(m);
        goto done;
    }
    tk_job_t *j = job_new(r, TK_APPLY, m, json_incref(b));
    if (j != NULL) {
        j->arg = ms;
        j->tools = tools != NULL && !json_is_null(tools) ? tools : NULL;
        j->kwargs = kw;
        j->effort = effort;
        j->gen = gen;
        job_start(s, j);
    }
done:
    json_decref(b);
}

void
sp_tokenize_routes_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_POST, "/apply-template", h_apply_template, s);
    sp_router_add(rt, SP_HTTP_POST, "/tokenize", h_tokenize, s);
    sp_router_add(rt, SP_HTTP_POST, "/detokenize", h_detokenize, s);
}
