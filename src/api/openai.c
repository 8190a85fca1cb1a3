/*
 * openai.c - the OpenAI API: /v1/models, /v1/completions,
 * /v1/chat/completions, /v1/embeddings.
 *
 * A request is parsed and validated on the loop thread (every field's type
 * and range, 400 naming the field). What costs time in proportion to the
 * request - compiling its grammar or JSON schema, rendering the chat
 * template, tokenizing - runs on a preparation worker (offload.h), whose
 * result comes back to the loop through its mailbox; then the request is
 * submitted through the seam (sched.h). So one large request never holds the
 * loop, and /live answers at once. Its events come back on the same loop: streamed as SSE
 * `data:` chunks the moment they arrive, or gathered into one response.
 * The lifecycle (request.h) admits, counts and accounts the request, the
 * same for every protocol; this file supplies its parsing and encoding. A
 * client that disconnects cancels the job; a client that reads too slowly
 * (its unsent output over the limit) is dropped and its job cancelled, so
 * neither holds the engine.
 *
 * Chat answers are written by an output dialect (dialect.h): OpenAI's chat
 * is the one defined here; other APIs (anthropic.c) translate their request
 * into a chat body and run this same pipeline, sp_api_chat_run, with theirs.
 *
 * Defaults follow OpenAI, not `sampan run`: temperature 1, top_p 1, top_k
 * and min_p off, a random seed; max_tokens 16 for completions and "the rest
 * of the context" (capped by --max-tokens) for chat.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#include "core/jfree.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "api/guided.h"
#include "constrain/grammar.h"
#include "constrain/schema.h"
#include "engine/encoder.h"
#include "text/tokenizer.h"
#include "constrain/toolcall.h"
#include "constrain/answer.h"
#include "sampan/log.h"
#include "serving/adapters.h"
#include "api/json_body.h"
#include "api/offload.h"
#include "api/budget.h"
#include "api/chat_input.h"
#include "api/dialect.h"
#include "api/api.h"
#include "api/rcache.h"
#include "api/request.h"
#include "sched/schedreq.h"
#include "api/trace.h"

typedef enum oai_kind { OAI_COMPLETION, OAI_CHAT, OAI_EMBED, OAI_RERANK } oai_kind_t;

typedef struct choice {
    sp_jbuf_t text;      /* non-streaming: the whole text */
    sp_jbuf_t lp;        /* non-streaming logprobs: chat content entries, or
                            completions' four arrays kept apart: */
    sp_jbuf_t lp_tokens, lp_values, lp_top, lp_offsets;
    int n_lp;
    size_t text_offset;  /* completions: bytes of token text so far */
    size_t sent;         /* answer parsing, streaming: bytes of content already sent */
    size_t sent_r;       /* and of reasoning_content */
    sp_finish_t finish;
    int stop_index;      /* the stop string that ended it, or -1 */
    bool finished;
} choice_t;

/* A prompt text to tokenize on the worker into dst (cap entries). */
typedef struct tok_in {
    const char *text; /* NULL: given as ids, already in dst */
    size_t len;
    const char *text2; /* rerank: the document after the query in `text`, or NULL */
    size_t len2;
    int32_t *dst;
    int64_t n;        /* the result */
} tok_in_t;

/*
 * The preparation of a request: what the loop hands the worker and what
 * comes back. The worker reads the inputs (strings inside `body`, which the
 * request owns until it ends) and writes the outputs; the loop touches
 * neither until the result is posted back (the mailbox's lock orders them).
 */
typedef struct oai_prep {
    json_t *body;                /* the request (a reference) */
    sp_gen_params_t g;           /* its stop strings point into body */
    int64_t max_tokens;
    bool max_given;
    /* At most one grammar source: a JSON schema, GBNF text, or a forced tool call. */
    const json_t *schema;
    json_t *own_schema;
    const char *gbnf;
    size_t gbnf_len;
    char *own_gbnf;              /* vLLM's regex/choice/grammar as GBNF (api/guided.h) */
    const char *con_param;       /* the field the constraint came from, when not the usual */
    const json_t *tools;
    const char *tool_only;
    /* chat: the messages (inside body) to check, gather and render */
    const json_t *messages;
    sp_chat_input_t chat;        /* the gathered messages (chat_input.h) */
    const json_t *kwargs;        /* chat_template_kwargs (inside body), or NULL */
    const char *effort;          /* reasoning_effort (inside body), or NULL */
    sp_budget_req_t budget;      /* the reasoning budget (api/budget.h) */
    /* fill-in-the-middle (completions' suffix, /infill): each prompt is the prefix */
    bool fim;
    sp_fim_prompt_t fimp;        /* suffix, middle, extra (strings inside body) */
    sp_fim_chunk_t *fim_extra;   /* /infill's input_extra */
    /* a dialect's raw prompt and context ids (sp_api_chat_opts_t) */
    const char *raw;
    size_t raw_len;
    int32_t *ctx_ids;
    int64_t n_ctx_ids;
    char *tools_json;            /* jansson's allocator */
    char bos[SP_TOKEN_MAX_BYTES + 1], eos[SP_TOKEN_MAX_BYTES + 1];
    char *prompt;                /* the rendered chat prompt */
    size_t plen;
    /* the prompts: tokens (cap per prompt) */
    int32_t *toks;
    int64_t cap;
    tok_in_t *in;
    int n_in;
    bool add_bos, special;
    const char *tok_param;
    /* the outcome: http 0 = ready to submit */
    int http;
    const char *param, *code;
    char err[512];
} oai_prep_t;

typedef struct oai_req {
    sp_api_req_t a;      /* the lifecycle (request.h): model, adapter, job, clock, cache key */
    oai_kind_t kind;
    bool infill;         /* completion answered in llama-server's /infill shape */
    bool keep_ids;       /* sp_api_chat_opts_t.keep_tokens: gen_ids below, for dq */
    int32_t *gen_ids;
    int64_t n_gen_ids, cap_gen_ids;
    const sp_api_dialect_t *dialect; /* chat: how its answers are written (dialect.h) */
    sp_dialect_req_t dq;   /* the dialect's view of the request */
    sp_jbuf_t model_name;  /* the model as answers name it, JSON-quoted (dq.model) */
    bool count_only;       /* chat: count the prompt's tokens, generate nothing */
    bool stream, include_usage, lp_on;
    int n;
    int top_logprobs;
    sp_grammar_t *grammar; /* response_format json_schema, `grammar` or a forced tool call */
    bool tools_on;         /* chat with tools and tool_choice != none: parse tool calls */
    sp_chat_tools_t tool_fmt;
    bool answer_on;        /* chat answers are parsed (answer.h): tools, or thinking markup */
    sp_answer_fmt_t afmt;  /* how; think_open is set by the preparation */
    sp_answer_t ans;       /* the latest parse */
    char id[64];
    int64_t created;
    int64_t n_prompt;
    choice_t *choices;
    sp_jbuf_t out;
    /* embeddings */
    float *emb;
    int n_embd;
    bool base64;
    bool emb_fault;      /* an embedding held NaN or inf */
    /* rerank: top_n results, with the documents' text or not */
    int top_n;
    bool return_documents;
    oai_prep_t prep;
} oai_req_t;

/* ------------------------------------------------------------- helpers */

static void
make_id(char *buf, size_t cap, const char *prefix, uint64_t req_id)
{
    sp_dialect_id(buf, cap, prefix, '-', req_id);
}

static uint64_t
random_seed(uint64_t req_id)
{
    uint64_t x = (uint64_t)sp_time_ns() + req_id * 0x9E3779B97F4A7C15ull;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return x;
}

static const char *
finish_str(sp_finish_t f)
{
    return f == SP_FINISH_LENGTH ? "length" : "stop";
}

/* The lifecycle's last call (ops->free): what the protocol owns, and q. */
static void
oai_free(sp_api_req_t *a)
{
    oai_req_t *q = (oai_req_t *)a;
    for (int i = 0; q->choices && i < q->n; i++) {
        choice_t *c = &q->choices[i];
        sp_jbuf_free(&c->text);
        sp_jbuf_free(&c->lp);
        sp_jbuf_free(&c->lp_tokens);
        sp_jbuf_free(&c->lp_values);
        sp_jbuf_free(&c->lp_top);
        sp_jbuf_free(&c->lp_offsets);
    }
    sp_free(q->choices);
    sp_answer_free(&q->ans);
    sp_free(q->emb);
    oai_prep_t *pp = &q->prep;
    sp_free(pp->fim_extra);
    sp_free(pp->ctx_ids);
    sp_free(q->gen_ids);
    json_decref(pp->own_schema);
    sp_free(pp->own_gbnf);
    sp_chat_input_free(&pp->chat);
    if (pp->tools_json) {
        sp_jfree(pp->tools_json);
    }
    sp_free(pp->prompt);
    sp_free(pp->toks);
    sp_free(pp->in);
    json_decref(pp->body);
    sp_grammar_release(q->grammar); /* the job holds its own reference */
    sp_jbuf_free(&q->out);
    sp_jbuf_free(&q->model_name);
    if (q->dialect != NULL && q->dialect->release != NULL && q->dq.ud != NULL) {
        q->dialect->release(q->dq.ud);
    }
    sp_free(q);
}

/* The client left while the request was prepared (offload.h). */
static void
prep_drop(sp_offload_t *job)
{
    sp_api_finish(&SP_OFFLOAD_HOLDER(job, oai_req_t, a.off)->a);
}

/* The request's model, with a reference; answers the error itself (or
 * parks the request until an on-demand load ends, then runs `retry` again)
 * and returns NULL. */
static sp_served_model_t *
get_model(sp_serving_t *s, sp_http_req_t *r, const json_t *body, sp_route_fn retry,
          const sp_route_params_t *p, sp_req_adapter_t *ad)
{
    const json_t *mv = json_object_get(body, "model");
    if (mv == NULL || json_is_null(mv)) {
        sp_api_error(r, 400, NULL, "model", NULL, "'model' is required");
        return NULL;
    }
    if (!json_is_string(mv)) {
        sp_api_error(r, 400, NULL, "model", NULL, "'model' must be a string");
        return NULL;
    }
    sp_served_model_t *m;
    sp_str_t none = {NULL, 0};
    if (!sp_api_model_for(s, r, json_string_value(mv), json_string_length(mv), none, retry, p,
                          &m)) {
        return NULL;
    }
    if (m->be) {
        sp_api_error(r, 400, NULL, "model", "model_not_generative",
                     "the model %s is a %s model, not a language model: use /v2/models/%s/infer",
                     m->name, m->be->name, m->name);
        sp_served_release(m);
        return NULL;
    }
    if (!sp_adapter_for(s, r, m, json_string_value(mv), json_string_length(mv), ad)) {
        sp_served_release(m);
        return NULL;
    }
    return m;
}

static void
field_error(sp_http_req_t *r, const sp_json_err_t *e)
{
    sp_api_error(r, 400, NULL, e->param, NULL, "%s", e->msg);
}

/* ------------------------------------------------------ parameter parsing */


/* Fill-in-the-middle needs the model's prefix, suffix and middle tokens:
 * true after answering 400 when it has none. */
static bool
fim_refused(oai_req_t *q, const char *param)
{
    sp_fim_ids_t f = sp_tokenizer_fim(q->a.m->tok);
    if (f.pre >= 0 && f.suf >= 0 && f.mid >= 0) {
        return false;
    }
    sp_api_error(q->a.http, 400, NULL, param, NULL,
                 "'%s' (fill-in-the-middle) needs a model with FIM tokens "
                 "(tokenizer.ggml.fim_pre_token_id, fim_suf_token_id, fim_mid_token_id); the "
                 "model %s has none", param, q->a.m->name);
    return true;
}

/* Sampling, limits, stop, logprobs, response_format. Returns -1 after answering. */
static int
parse_gen(oai_req_t *q, const json_t *b, sp_gen_params_t *g, int64_t *max_tokens_out,
          bool *max_given)
{
    sp_http_req_t *r = q->a.http;
    const sp_serve_config_t *cfg = &q->a.srv->cfg;
    sp_json_err_t e = {{0}, NULL};
    *g = sp_gen_default_params();
    g->sampling.temperature = 1.0f;
    g->sampling.top_k = 0;
    g->sampling.top_p = 1.0f;
    g->sampling.min_p = 0.0f;
    g->sampling.repeat_penalty = 1.0f;
    g->sampling.seed = random_seed(sp_http_req_id(r));
    sp_served_apply_defaults(q->a.m, &g->sampling); /* the model config's `parameters` */
    double d;
    int64_t v;
    int rc;
#define NUM(key, lo, hi, dst)                                                   \
    if ((rc = sp_json_get_num(b, key, lo, hi, &d, &e)) < 0) {                   \
        field_error(r, &e);                                                     \
        return -1;                                                              \
    } else if (rc > 0) {                                                        \
        dst = (float)d;                                                         \
    }
    NUM("temperature", 0, 2, g->sampling.temperature);
    NUM("top_p", 0, 1, g->sampling.top_p);
    NUM("min_p", 0, 1, g->sampling.min_p);
    NUM("presence_penalty", -2, 2, g->sampling.presence_penalty);
    NUM("frequency_penalty", -2, 2, g->sampling.frequency_penalty);
    NUM("repetition_penalty", 0.01, 10, g->sampling.repeat_penalty);
#undef NUM
    if (g->sampling.top_p <= 0.0f) {
        sp_api_error(r, 400, NULL, "top_p", NULL, "'top_p' must be greater than 0");
        return -1;
    }
    if ((rc = sp_json_get_int(b, "top_k", -1, 1 << 20, &v, &e)) < 0) {
        field_error(r, &e);
        return -1;
    } else if (rc > 0) {
        g->sampling.top_k = v < 0 ? 0 : (int32_t)v;
    }
    if ((rc = sp_json_get_int(b, "seed", INT64_MIN, INT64_MAX, &v, &e)) < 0) {
        field_error(r, &e);
        return -1;
    } else if (rc > 0) {
        g->sampling.seed = (uint64_t)v;
    }
    bool ignore_eos = false;
    if (sp_json_get_bool(b, "ignore_eos", &ignore_eos, &e) < 0) {
        field_error(r, &e);
        return -1;
    }
    g->ignore_eos = ignore_eos;
    /* max_completion_tokens (chat, newer) wins over max_tokens. */
    *max_given = false;
    const char *mk = q->kind == OAI_CHAT && json_object_get(b, "max_completion_tokens") &&
                             !json_is_null(json_object_get(b, "max_completion_tokens"))
                         ? "max_completion_tokens"
                         : "max_tokens";
    if ((rc = sp_json_get_int(b, mk, 1, cfg->max_tokens, &v, &e)) < 0) {
        field_error(r, &e);
        return -1;
    } else if (rc > 0) {
        *max_tokens_out = v;
        *max_given = true;
    }
    /* stop: a string or a list of non-empty strings */
    const json_t *st = json_object_get(b, "stop");
    if (st && !json_is_null(st)) {
        if (json_is_string(st)) {
            if (json_string_length(st) == 0 || json_string_length(st) > SP_GEN_MAX_STOP_LEN) {
                sp_api_error(r, 400, NULL, "stop", NULL,
                             "'stop' strings must have 1 to %d bytes", SP_GEN_MAX_STOP_LEN);
                return -1;
            }
            g->stop[0] = json_string_value(st);
            g->n_stop = 1;
        } else if (json_is_array(st)) {
            if (json_array_size(st) > SP_GEN_MAX_STOP) {
                sp_api_error(r, 400, NULL, "stop", NULL, "'stop' has more than %d strings",
                             SP_GEN_MAX_STOP);
                return -1;
            }
            for (size_t i = 0; i < json_array_size(st); i++) {
                const json_t *s = json_array_get(st, i);
                if (!json_is_string(s) || json_string_length(s) == 0 ||
                    json_string_length(s) > SP_GEN_MAX_STOP_LEN ||
                    strlen(json_string_value(s)) != json_string_length(s)) {
                    sp_api_error(r, 400, NULL, "stop", NULL,
                                 "'stop' must be a list of strings of 1 to %d bytes",
                                 SP_GEN_MAX_STOP_LEN);
                    return -1;
                }
                g->stop[g->n_stop++] = json_string_value(s);
            }
        } else {
            sp_api_error(r, 400, NULL, "stop", NULL, "'stop' must be a string or a list of strings");
            return -1;
        }
        if (json_is_string(st) && strlen(g->stop[0]) != json_string_length(st)) {
            sp_api_error(r, 400, NULL, "stop", NULL, "'stop' may not contain NUL");
            return -1;
        }
    }
    if ((rc = sp_json_get_int(b, "n", 1, cfg->max_n, &v, &e)) < 0) {
        field_error(r, &e);
        return -1;
    }
    q->n = rc > 0 ? (int)v : 1;
    /* Scheduling: tier (name or integer) and a deadline in milliseconds. */
    if (sp_schedreq_parse(b, SP_SCHEDREQ_OPENAI, &q->a.sched, &e) < 0) {
        field_error(r, &e);
        return -1;
    }
    if (sp_json_get_bool(b, "stream", &q->stream, &e) < 0) {
        field_error(r, &e);
        return -1;
    }
    /* user: an end-user id, on the request's log line as a hash (never the id
     * itself: it may be personal). metadata: OpenAI's limits checked; nothing
     * is stored, so it only goes to the log line as its size. */
    const json_t *user = json_object_get(b, "user");
    if (user && !json_is_null(user)) {
        if (!json_is_string(user) || json_string_length(user) > 256) {
            sp_api_error(r, 400, NULL, "user", NULL, "'user' must be a string of at most 256 bytes");
            return -1;
        }
        uint64_t h = 1469598103934665603ull; /* FNV-1a */
        for (size_t i = 0; i < json_string_length(user); i++) {
            h = (h ^ (unsigned char)json_string_value(user)[i]) * 1099511628211ull;
        }
        sp_http_req_annotate(r, "user=%016llx", (unsigned long long)h);
    }
    const json_t *md = json_object_get(b, "metadata");
    if (md && !json_is_null(md)) {
        bool ok = json_is_object(md) && json_object_size(md) <= 16;
        const char *mkey;
        const json_t *mval;
        json_object_foreach((json_t *)md, mkey, mval) {
            ok = ok && strlen(mkey) <= 64 && json_is_string(mval) && json_string_length(mval) <= 512;
        }
        if (!ok) {
            sp_api_error(r, 400, NULL, "metadata", NULL, "'metadata' must be an object of at most "
                         "16 string values (keys up to 64 bytes, values up to 512)");
            return -1;
        }
        sp_http_req_annotate(r, "metadata_pairs=%zu", json_object_size(md));
    }
    const json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            sp_api_error(r, 400, NULL, "stream_options", NULL, "'stream_options' must be an object");
            return -1;
        }
        if (sp_json_get_bool(so, "include_usage", &q->include_usage, &e) < 0) {
            e.param = "stream_options.include_usage";
            field_error(r, &e);
            return -1;
        }
    }
    /* Log-probabilities: chat has logprobs (bool) + top_logprobs (int);
     * completions has logprobs (int). */
    q->top_logprobs = -1;
    if (q->kind == OAI_CHAT) {
        bool lp = false;
        if (sp_json_get_bool(b, "logprobs", &lp, &e) < 0) {
            field_error(r, &e);
            return -1;
        }
        if ((rc = sp_json_get_int(b, "top_logprobs", 0, cfg->max_logprobs, &v, &e)) < 0) {
            field_error(r, &e);
            return -1;
        }
        if (rc > 0 && !lp) {
            sp_api_error(r, 400, NULL, "top_logprobs", NULL,
                         "'top_logprobs' requires 'logprobs': true");
            return -1;
        }
        if (lp) {
            q->top_logprobs = rc > 0 ? (int)v : 0;
        }
    } else {
        if ((rc = sp_json_get_int(b, "logprobs", 0, cfg->max_logprobs, &v, &e)) < 0) {
            field_error(r, &e);
            return -1;
        }
        if (rc > 0) {
            q->top_logprobs = (int)v;
        }
    }
    q->lp_on = q->top_logprobs >= 0;
    g->top_logprobs = q->top_logprobs;
    /* logit_bias: {"token id": bias in [-100, 100]}, added to the logits
     * before sampling (the sampler, after the penalties) */
    const json_t *lb = json_object_get(b, "logit_bias");
    if (lb && !json_is_null(lb)) {
        int32_t n_vocab = sp_tokenizer_n_vocab(q->a.m->tok);
        if (!json_is_object(lb) || json_object_size(lb) > SP_SAMPLER_MAX_BIAS) {
            sp_api_error(r, 400, NULL, "logit_bias", NULL,
                         "'logit_bias' must be an object of at most %d token ids and biases",
                         SP_SAMPLER_MAX_BIAS);
            return -1;
        }
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)lb, key, val) {
            char *end = NULL;
            long id = strtol(key, &end, 10);
            double bias = json_is_number(val) ? json_number_value(val) : NAN;
            if (end == key || *end != '\0' || id < 0 || id >= n_vocab) {
                sp_api_error(r, 400, NULL, "logit_bias", NULL,
                             "logit_bias key '%.40s' is not a token id (0..%d)", key, n_vocab - 1);
                return -1;
            }
            if (!(bias >= -100.0 && bias <= 100.0)) {
                sp_api_error(r, 400, NULL, "logit_bias", NULL,
                             "logit_bias for token %ld must be a number in [-100, 100]", id);
                return -1;
            }
            int32_t k = g->sampling.n_bias++;
            g->sampling.bias_id[k] = (int32_t)id;
            g->sampling.bias[k] = (float)bias;
        }
    }
    /* best_of (completions): the best n of best_of; only best_of == n, which
     * returns all of them, is served. suffix: fill-in-the-middle, not served. */
    const json_t *bo = json_object_get(b, "best_of");
    if (bo && !json_is_null(bo) && (!json_is_integer(bo) || json_integer_value(bo) != q->n)) {
        sp_api_error(r, 400, NULL, "best_of", NULL,
                     "'best_of' is not supported (other than equal to n, %d): ask for n "
                     "completions and rank them with logprobs", q->n);
        return -1;
    }
    const json_t *sfx = json_object_get(b, "suffix");
    if (sfx && !json_is_null(sfx) && !(json_is_string(sfx) && json_string_length(sfx) == 0)) {
        if (q->kind != OAI_COMPLETION || !json_is_string(sfx)) {
            sp_api_error(r, 400, NULL, "suffix", NULL,
                         q->kind != OAI_COMPLETION
                             ? "'suffix' (fill-in-the-middle) is served on /v1/completions"
                             : "'suffix' must be a string");
            return -1;
        }
        if (fim_refused(q, "suffix")) {
            return -1;
        }
        q->prep.fim = true;
        q->prep.fimp.suffix = json_string_value(sfx);
        q->prep.fimp.suffix_len = json_string_length(sfx);
    }
    /* Constraints: response_format (json_object, json_schema) or a GBNF `grammar`. */
    const json_t *rf = json_object_get(b, "response_format");
    const json_t *gr = json_object_get(b, "grammar");
    if (gr && json_is_null(gr)) {
        gr = NULL;
    }
    if (rf && !json_is_null(rf)) {
        const char *t = NULL;
        if (!json_is_object(rf) || sp_json_get_str(rf, "type", &t, NULL, &e) <= 0) {
            sp_api_error(r, 400, NULL, "response_format", NULL,
                         "'response_format' must be an object with a 'type'");
            return -1;
        }
        if (strcmp(t, "json_object") == 0) {
            g->json_object = true;
        } else if (strcmp(t, "json_schema") == 0) {
            const json_t *js = json_object_get(rf, "json_schema");
            const json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!json_is_object(js) || (json_object_get(js, "name") &&
                                        !json_is_string(json_object_get(js, "name")))) {
                sp_api_error(r, 400, NULL, "response_format.json_schema", NULL,
                             "'response_format.json_schema' must be an object "
                             "{\"name\": ..., \"schema\": {...}, \"strict\": ...}");
                return -1;
            }
            if (schema == NULL) { /* OpenAI allows it out: any JSON object */
                schema = q->prep.own_schema = json_pack("{s:s}", "type", "object");
                if (schema == NULL) {
                    sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
                    return -1;
                }
            }
            q->prep.schema = schema; /* compiled by the preparation (prep_run) */
        } else if (strcmp(t, "text") != 0) {
            sp_api_error(r, 400, NULL, "response_format.type", NULL,
                         "response_format type '%s' is not supported (text, json_object, "
                         "json_schema)", t);
            return -1;
        }
    }
    if (gr != NULL) {
        if (!json_is_string(gr) || json_string_length(gr) == 0) {
            sp_api_error(r, 400, NULL, "grammar", NULL, "'grammar' must be GBNF text");
            return -1;
        }
        if (g->json_object || q->prep.schema) {
            sp_api_error(r, 400, NULL, "grammar", NULL,
                         "'grammar' and 'response_format' json modes cannot be combined");
            return -1;
        }
        q->prep.gbnf = json_string_value(gr); /* compiled by the preparation */
        q->prep.gbnf_len = json_string_length(gr);
    }
    /* vLLM's structured_outputs and guided_* fields */
    sp_guided_t gd;
    char gerr[300];
    int grc = sp_guided_parse(b, &gd, gerr, sizeof gerr);
    if (grc == -2) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        return -1;
    }
    if (grc < 0) {
        sp_api_error(r, 400, NULL, gd.param, NULL, "%s", gerr);
        return -1;
    }
    if (grc > 0) {
        if (g->json_object || q->prep.schema || q->prep.gbnf) {
            sp_api_error(r, 400, NULL, gd.param, NULL,
                         "'%s' cannot be combined with 'response_format' or 'grammar'", gd.param);
            sp_guided_clear(&gd);
            return -1;
        }
        q->prep.con_param = gd.param;
        g->json_object = gd.json_object;
        q->prep.schema = q->prep.own_schema = gd.schema; /* the request owns them now */
        q->prep.gbnf = q->prep.own_gbnf = gd.gbnf;
        q->prep.gbnf_len = gd.gbnf_len;
    }
    return 0;
}

/* Token ids of a prompt given as ids. */
static int
parse_id_array(oai_req_t *q, const json_t *a, const char *param, int32_t *toks, int64_t cap,
               int64_t *n_out)
{
    size_t n = json_array_size(a);
    if ((int64_t)n > cap) {
        sp_api_error(q->a.http, 400, NULL, param, NULL,
                     "the prompt has %zu tokens, the context holds %lld", n, (long long)cap);
        return -1;
    }
    int32_t n_vocab = sp_tokenizer_n_vocab(q->a.m->tok);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab) {
            sp_api_error(q->a.http, 400, NULL, param, NULL,
                         "token ids must be integers in 0..%d (out of vocabulary)", n_vocab - 1);
            return -1;
        }
        toks[i] = (int32_t)json_integer_value(t);
    }
    *n_out = (int64_t)n;
    return 0;
}

/* The HTTP status of a failed preparation step. A limit of the request's own
 * content (grammar size, template output) is the client's to fix: 400, not
 * the 413 the status table gives (that one is for bodies over the limit). */
static int
oai_http(sp_status_t st)
{
    return st == SP_ERR_TOO_LARGE ? 400 : sp_status_http(st);
}

/* Worker: record why the preparation failed (the loop answers it). */
static void SP_PRINTF(5, 6)
prep_fail(oai_prep_t *pp, sp_status_t st, const char *param, const char *code, const char *fmt, ...)
{
    pp->http = oai_http(st);
    pp->param = param;
    pp->code = code ? code : st == SP_ERR_TOO_LARGE ? "limit_exceeded" : NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pp->err, sizeof pp->err, fmt, ap);
    va_end(ap);
}

/* Worker: tokenize one prompt into t->dst (cap entries); false after prep_fail. */
static bool
tokenize_fim(oai_req_t *q, tok_in_t *t)
{
    oai_prep_t *pp = &q->prep;
    sp_fim_prompt_t fp = pp->fimp;
    size_t bytes = t->len + fp.suffix_len + fp.middle_len;
    for (int i = 0; i < fp.n_extra; i++) {
        bytes += fp.extra[i].text_len;
    }
    if (bytes / 64 > (size_t)pp->cap) { /* as tokenize_text */
        prep_fail(pp, SP_ERR_INVALID, pp->tok_param, "context_length_exceeded",
                  "the prompt is too long for the context of %lld tokens", (long long)pp->cap);
        return false;
    }
    int32_t *ids = NULL;
    if (t->text != NULL) {
        fp.prefix = t->text;
        fp.prefix_len = t->len;
    } else { /* given as ids, in dst: the prefix's tokens */
        ids = sp_malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *ids);
        if (ids == NULL) {
            prep_fail(pp, SP_ERR_NOMEM, NULL, NULL, "out of memory");
            return false;
        }
        memcpy(ids, t->dst, (size_t)t->n * sizeof *ids);
        fp.prefix_ids = ids;
        fp.n_prefix_ids = t->n;
    }
    int64_t n = sp_fim_encode(q->a.m->tok, &fp, t->dst, pp->cap);
    sp_free(ids);
    if (n < 0) {
        prep_fail(pp, SP_ERR_INVALID, pp->tok_param, NULL,
                  "cannot tokenize the fill-in-the-middle prompt: %s", sp_status_str((sp_status_t)n));
        return false;
    }
    if (n > pp->cap) {
        prep_fail(pp, SP_ERR_INVALID, pp->tok_param, "context_length_exceeded",
                  "the prompt has %lld tokens, the context holds %lld", (long long)n,
                  (long long)pp->cap);
        return false;
    }
    t->n = n;
    return true;
}

static bool
tokenize_text(oai_req_t *q, tok_in_t *t)
{
    oai_prep_t *pp = &q->prep;
    int64_t cap = pp->cap;
    if (pp->fim) {
        return tokenize_fim(q, t);
    }
    /* No vocabulary spends 64 bytes per token on average: longer text cannot
     * fit, and is refused before the tokenizer spends time on it. */
    if (t->len / 64 > (size_t)cap) {
        prep_fail(pp, SP_ERR_INVALID, pp->tok_param, "context_length_exceeded",
                  "the prompt is too long for the context of %lld tokens", (long long)cap);
        return false;
    }
    int64_t n = sp_tokenizer_encode(q->a.m->tok, t->text, t->len, pp->add_bos, pp->special, t->dst, cap);
    if (n < 0) {
        prep_fail(pp, SP_ERR_INVALID, pp->tok_param, NULL, "cannot tokenize the prompt: %s",
                  sp_status_str((sp_status_t)n));
        return false;
    }
    if (n > cap) {
        prep_fail(pp, SP_ERR_INVALID, pp->tok_param, "context_length_exceeded",
                  "the prompt has %lld tokens, the context holds %lld", (long long)n,
                  (long long)cap);
        return false;
    }
    if (t->text2 != NULL) {
        /* A cross-encoder's pair: [CLS] query [SEP] (the query's own special
         * tokens) document [SEP]. */
        const int32_t sep = sp_tokenizer_sep(q->a.m->tok);
        int64_t room = cap - n - 1;
        int64_t n2 = room > 0 && t->len2 / 64 <= (size_t)room
                         ? sp_tokenizer_encode(q->a.m->tok, t->text2, t->len2, false, false,
                                               t->dst + n, room)
                         : room + 1;
        if (n2 < 0) {
            prep_fail(pp, SP_ERR_INVALID, "documents", NULL, "cannot tokenize a document: %s",
                      sp_status_str((sp_status_t)n2));
            return false;
        }
        if (sep < 0 || n2 > room) {
            prep_fail(pp, SP_ERR_INVALID, "documents", "context_length_exceeded",
                      sep < 0 ? "the model's vocabulary has no separator token"
                              : "query and document do not fit the context of %lld tokens",
                      (long long)cap);
            return false;
        }
        n += n2;
        t->dst[n++] = sep;
    }
    t->n = n;
    return true;
}

/* Worker: compile the grammar, render the chat template, tokenize. Reads only
 * the request's inputs in prep (and its model, which it holds), writes only
 * prep's outputs and q->grammar. */
static void
prep_run(sp_offload_t *job)
{
    oai_req_t *q = SP_OFFLOAD_HOLDER(job, oai_req_t, a.off);
    oai_prep_t *pp = &q->prep;
    char err[512];
    sp_status_t st;
    if (pp->schema) {
        st = sp_schema_grammar(pp->schema, &q->grammar, err, sizeof err);
        if (st != SP_OK) {
            prep_fail(pp, st, pp->con_param ? pp->con_param : "response_format.json_schema.schema",
                      NULL, "%s", err);
            return;
        }
    } else if (pp->gbnf) {
        st = sp_grammar_compile(pp->gbnf, pp->gbnf_len, &q->grammar, err, sizeof err);
        if (st != SP_OK) {
            prep_fail(pp, st, pp->con_param ? pp->con_param : "grammar", NULL, "%s", err);
            return;
        }
    } else if (pp->tools) {
        char *text = NULL;
        size_t len = 0;
        st = sp_toolcall_grammar(q->tool_fmt, pp->tools, pp->tool_only, &text, &len, err, sizeof err);
        if (st == SP_OK) {
            char gerr[256];
            st = sp_grammar_compile(text, len, &q->grammar, gerr, sizeof gerr);
            if (st != SP_OK) {
                snprintf(err, sizeof err, "tools: %s", gerr);
            }
        }
        sp_free(text);
        if (st != SP_OK) {
            prep_fail(pp, st, pp->tool_only ? "tool_choice" : "tools", NULL, "%s", err);
            return;
        }
    }
    if (q->grammar != NULL) {
        /* The matcher's start state has limits of its own: check them here,
         * where the answer can name the parameter, not at submission. */
        sp_gmatch_t *gm = NULL;
        st = sp_gmatch_create(q->grammar, &gm, err, sizeof err);
        sp_gmatch_destroy(gm);
        if (st != SP_OK) {
            prep_fail(pp, st, pp->con_param ? pp->con_param
                              : pp->schema ? "response_format.json_schema.schema" : pp->gbnf ? "grammar"
                              : pp->tool_only ? "tool_choice" : "tools", NULL, "%s", err);
            return;
        }
    }
    if (pp->messages) {
        const char *param = NULL;
        st = sp_chat_input_gather(&pp->chat, pp->messages, &param, err, sizeof err);
        if (st != SP_OK) {
            prep_fail(pp, st, param, NULL, "%s", err);
            return;
        }
        char *extra = NULL;
        if (sp_chat_input_extra_json(pp->kwargs, pp->effort, &extra) != SP_OK) {
            prep_fail(pp, SP_ERR_NOMEM, NULL, NULL, "out of memory");
            return;
        }
        sp_chat_params_t cpar = {.add_generation_prompt = true, .bos_text = pp->bos,
                                 .eos_text = pp->eos, .tools_json = pp->tools_json,
                                 .extra_json = extra};
        st = sp_chat_apply_ex(q->a.m->tmpl, pp->chat.msgs, pp->chat.n, &cpar, &pp->prompt,
                              &pp->plen, err, sizeof err);
        sp_jfree(extra);
        if (st != SP_OK) {
            prep_fail(pp, st, "messages", NULL, "%s", err);
            return;
        }
        pp->add_bos = sp_chat_add_bos(q->a.m->tok, pp->prompt, pp->plen);
        /* A prompt that leaves the model inside its thinking; not when our
         * grammar (a JSON schema or object, a forced call) shapes the output
         * from its first token: then that is the answer. A `grammar` of the
         * client's shapes the whole text, thinking included. */
        q->afmt.think_open = pp->schema == NULL && pp->tools == NULL && !pp->g.json_object &&
                             sp_answer_opens_thinking(q->afmt.reasoning, pp->prompt, pp->plen);
        st = sp_budget_apply(&pp->budget, q->afmt.reasoning, q->afmt.think_open, q->a.m->tok,
                             &pp->g, err, sizeof err);
        if (st != SP_OK) {
            prep_fail(pp, st, "reasoning_budget_message", NULL, "%s", err);
            return;
        }
        pp->in[0].text = pp->prompt;
        pp->in[0].len = pp->plen;
    } else if (pp->raw != NULL) {
        pp->add_bos = sp_chat_add_bos(q->a.m->tok, pp->raw, pp->raw_len);
        pp->in[0].text = pp->raw;
        pp->in[0].len = pp->raw_len;
    }
    if (pp->n_ctx_ids > 0) {
        pp->add_bos = false; /* the context began with one (and a BOS the text has is dropped) */
    }
    for (int i = 0; i < pp->n_in; i++) {
        if ((pp->in[i].text != NULL || pp->fim) && !tokenize_text(q, &pp->in[i])) {
            return;
        }
    }
    if (pp->n_ctx_ids > 0) { /* the context's ids, then the prompt's */
        tok_in_t *t = &pp->in[0];
        if (t->n + pp->n_ctx_ids > pp->cap) {
            prep_fail(pp, SP_ERR_INVALID, "context", "context_length_exceeded",
                      "the context and the prompt have %lld tokens, the context holds %lld",
                      (long long)(t->n + pp->n_ctx_ids), (long long)pp->cap);
            return;
        }
        /* a BOS the template wrote belongs to the context's start, not here */
        int64_t skip = t->n > 0 && t->dst[0] == sp_tokenizer_bos(q->a.m->tok) ? 1 : 0;
        memmove(t->dst + pp->n_ctx_ids, t->dst + skip, (size_t)(t->n - skip) * sizeof *t->dst);
        memcpy(t->dst, pp->ctx_ids, (size_t)pp->n_ctx_ids * sizeof *t->dst);
        t->n += pp->n_ctx_ids - skip;
    }
}

static void prep_done(sp_offload_t *job, sp_http_req_t *r);

static const sp_offload_ops_t prep_ops = {
    .stage = "prepare", .work = prep_run, .done = prep_done, .drop = prep_drop, .refuse = sp_api_refuse,
};

/* Hand the request to a preparation worker (offload.h); answers it on failure. */
static void
prep_start(oai_req_t *q)
{
    if (!sp_offload_start(&q->a.off, &prep_ops, q->a.srv->prep, &q->a.http, q->a.m, &q->a.clk)) {
        sp_api_finish(&q->a);
    }
}

/* ------------------------------------------------------------- responses */

static void
begin_object(oai_req_t *q, sp_jbuf_t *b, const char *object)
{
    sp_jbuf_lit(b, "{\"id\":");
    sp_jbuf_cstr(b, q->id);
    sp_jbuf_lit(b, ",\"object\":");
    sp_jbuf_cstr(b, object);
    sp_jbuf_printf(b, ",\"created\":%lld,\"model\":", (long long)q->created);
    sp_req_adapter_model_name(q->a.m, &q->a.ad, b);
    sp_jbuf_lit(b, ",\"system_fingerprint\":\"sampan\"");
}

static void
write_usage(sp_jbuf_t *b, int64_t prompt, int64_t completion)
{
    sp_jbuf_printf(b, "\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,"
                   "\"total_tokens\":%lld}",
                   (long long)prompt, (long long)completion, (long long)(prompt + completion));
}

static void
write_bytes(sp_jbuf_t *b, const char *s, int32_t n)
{
    sp_jbuf_lit(b, "[");
    for (int32_t i = 0; i < n; i++) {
        sp_jbuf_printf(b, i ? ",%u" : "%u", (unsigned)(unsigned char)s[i]);
    }
    sp_jbuf_lit(b, "]");
}

/* One chat logprobs "content" entry. */
static void
write_chat_lp(sp_jbuf_t *b, const sp_sched_event_t *ev)
{
    sp_jbuf_lit(b, "{\"token\":");
    sp_jbuf_str(b, ev->chosen.text, (size_t)ev->chosen.text_len);
    sp_jbuf_lit(b, ",\"logprob\":");
    sp_jbuf_num(b, ev->chosen.logprob);
    sp_jbuf_lit(b, ",\"bytes\":");
    write_bytes(b, ev->chosen.text, ev->chosen.text_len);
    sp_jbuf_lit(b, ",\"top_logprobs\":[");
    for (int i = 0; i < ev->n_top; i++) {
        const sp_sched_logprob_t *t = &ev->top[i];
        sp_jbuf_lit(b, i ? ",{\"token\":" : "{\"token\":");
        sp_jbuf_str(b, t->text, (size_t)t->text_len);
        sp_jbuf_lit(b, ",\"logprob\":");
        sp_jbuf_num(b, t->logprob);
        sp_jbuf_lit(b, ",\"bytes\":");
        write_bytes(b, t->text, t->text_len);
        sp_jbuf_lit(b, "}");
    }
    sp_jbuf_lit(b, "]}");
}

/* Completions' top_logprobs entry: {"tok": lp, ...} (later duplicates dropped). */
static void
write_top_map(sp_jbuf_t *b, const sp_sched_event_t *ev)
{
    sp_jbuf_lit(b, "{");
    int written = 0;
    for (int i = 0; i < ev->n_top; i++) {
        const sp_sched_logprob_t *t = &ev->top[i];
        bool dup = false;
        for (int k = 0; k < i && !dup; k++) {
            dup = ev->top[k].text_len == t->text_len &&
                  memcmp(ev->top[k].text, t->text, (size_t)t->text_len) == 0;
        }
        if (dup) {
            continue;
        }
        if (written++) {
            sp_jbuf_lit(b, ",");
        }
        sp_jbuf_str(b, t->text, (size_t)t->text_len);
        sp_jbuf_lit(b, ":");
        sp_jbuf_num(b, t->logprob);
    }
    sp_jbuf_lit(b, "}");
}

static int
stream_send(oai_req_t *q)
{
    sp_jbuf_t *b = &q->out;
    if (b->oom || sp_http_stream_write(q->a.http, b->p, b->len) != 0) {
        return -1;
    }
    return 0;
}

/* SSE: "data: " + JSON + blank line, one HTTP chunk per event. */
static void
sse_begin(oai_req_t *q)
{
    sp_jbuf_reset(&q->out);
    sp_jbuf_lit(&q->out, "data: ");
}

/* A text completion's chunk (chat chunks are the chat dialect's). */
static void
chunk_head(oai_req_t *q)
{
    sse_begin(q);
    begin_object(q, &q->out, "text_completion");
    sp_jbuf_lit(&q->out, ",\"choices\":[");
}

static int
chunk_end(oai_req_t *q)
{
    sp_jbuf_lit(&q->out, "]}\n\n");
    return stream_send(q);
}

/* llama-server's /infill answer (its /completion shape): the text as
 * "content", "stop", and at the end how and why it stopped (stop_type "eos":
 * an end-of-generation token, "word": a stop string, "limit": n_predict). */
static void
infill_object(oai_req_t *q, sp_jbuf_t *b, const char *text, size_t len, const choice_t *c,
              int64_t n_gen)
{
    sp_jbuf_lit(b, "{\"index\":0,\"content\":");
    sp_jbuf_str(b, text, len);
    if (c == NULL) {
        sp_jbuf_lit(b, ",\"stop\":false}");
        return;
    }
    bool word = c->finish == SP_FINISH_STOP && c->stop_index >= 0;
    const char *why = c->finish == SP_FINISH_LENGTH ? "limit" : word ? "word" : "eos";
    sp_jbuf_lit(b, ",\"stop\":true,\"model\":");
    sp_req_adapter_model_name(q->a.m, &q->a.ad, b);
    sp_jbuf_printf(b, ",\"tokens_predicted\":%lld,\"tokens_evaluated\":%lld,\"stop_type\":\"%s\","
                   "\"stopping_word\":", (long long)n_gen, (long long)q->n_prompt, why);
    const char *sw = word ? q->prep.g.stop[c->stop_index] : "";
    sp_jbuf_str(b, sw, strlen(sw));
    sp_jbuf_lit(b, "}");
}

/* ---- the OpenAI chat dialect (dialect.h) ---- */

static void
dq_object(const sp_dialect_req_t *d, sp_jbuf_t *b, const char *object)
{
    sp_jbuf_lit(b, "{\"id\":");
    sp_jbuf_cstr(b, d->id);
    sp_jbuf_lit(b, ",\"object\":");
    sp_jbuf_cstr(b, object);
    sp_jbuf_printf(b, ",\"created\":%lld,\"model\":", (long long)d->created);
    sp_jbuf_lit(b, d->model);
    sp_jbuf_lit(b, ",\"system_fingerprint\":\"sampan\"");
}

static void
chat_chunk_head(const sp_dialect_req_t *d, sp_jbuf_t *b)
{
    sp_dialect_sse_begin(b, NULL);
    dq_object(d, b, "chat.completion.chunk");
    sp_jbuf_lit(b, ",\"choices\":[");
}

static void
chat_chunk_end(sp_jbuf_t *b)
{
    sp_jbuf_lit(b, "]}");
    sp_dialect_sse_end(b);
}

/* One entry of tool_calls; part 0: all of it, 1: id, type, name and empty
 * arguments (a stream's first delta), 2: the arguments only (the second).
 * The id is like OpenAI's: "call_" and 16 hex digits. */
static void
write_call(const sp_dialect_req_t *d, sp_jbuf_t *b, const json_t *call, int k, int part)
{
    char id[64];
    sp_jbuf_lit(b, "{");
    if (part != 0) {
        sp_jbuf_printf(b, "\"index\":%d,", k);
    }
    if (part != 2) {
        sp_dialect_id(id, sizeof id, "call", '_', d->req_id * 31u + (uint64_t)k);
        sp_jbuf_lit(b, "\"id\":");
        sp_jbuf_cstr(b, id);
        sp_jbuf_lit(b, ",\"type\":\"function\",\"function\":{\"name\":");
        sp_jbuf_cstr(b, json_string_value(json_object_get(call, "name")));
        sp_jbuf_lit(b, ",\"arguments\":");
    } else {
        sp_jbuf_lit(b, "\"function\":{\"arguments\":");
    }
    if (part == 1) {
        sp_jbuf_lit(b, "\"\"");
    } else {
        char *args = json_dumps(json_object_get(call, "arguments"), JSON_COMPACT);
        sp_jbuf_cstr(b, args ? args : "{}");
        sp_jfree(args);
    }
    sp_jbuf_lit(b, "}}");
}

static size_t
n_calls(const sp_dialect_req_t *d, const json_t *calls)
{
    size_t n = calls ? json_array_size(calls) : 0;
    return d->one_call && n > 1 ? 1 : n;
}

static void
chat_answer(sp_dialect_req_t *d, const sp_dialect_choice_t *cs, int n, int64_t completion,
            sp_jbuf_t *b)
{
    dq_object(d, b, "chat.completion");
    sp_jbuf_lit(b, ",\"choices\":[");
    for (int i = 0; i < n; i++) {
        const sp_dialect_choice_t *c = &cs[i];
        sp_jbuf_printf(b, "%s{\"index\":%d,", i ? "," : "", c->index);
        sp_jbuf_lit(b, "\"message\":{\"role\":\"assistant\",\"content\":");
        if (c->calls && c->content_len == 0) {
            sp_jbuf_lit(b, "null");
        } else {
            sp_jbuf_str(b, c->content ? c->content : "", c->content_len);
        }
        if (c->reasoning_len > 0) {
            sp_jbuf_lit(b, ",\"reasoning_content\":");
            sp_jbuf_str(b, c->reasoning, c->reasoning_len);
        }
        if (c->calls) {
            sp_jbuf_lit(b, ",\"tool_calls\":[");
            for (size_t k = 0; k < n_calls(d, c->calls); k++) {
                if (k) {
                    sp_jbuf_lit(b, ",");
                }
                write_call(d, b, json_array_get(c->calls, k), (int)k, 0);
            }
            sp_jbuf_lit(b, "]");
        }
        sp_jbuf_lit(b, ",\"refusal\":null},\"logprobs\":");
        if (d->logprobs) {
            sp_jbuf_lit(b, "{\"content\":[");
            if (c->logprobs) {
                sp_jbuf_raw(b, c->logprobs, c->logprobs_len);
            }
            sp_jbuf_lit(b, "],\"refusal\":null}");
        } else {
            sp_jbuf_lit(b, "null");
        }
        sp_jbuf_printf(b, ",\"finish_reason\":\"%s\"}",
                       c->calls ? "tool_calls" : finish_str(c->finish));
    }
    sp_jbuf_lit(b, "],");
    write_usage(b, d->n_prompt, completion);
    sp_jbuf_lit(b, "}");
}

/* OpenAI opens every choice with the assistant role. */
static void
chat_stream_start(sp_dialect_req_t *d, sp_jbuf_t *b)
{
    for (int i = 0; i < d->n; i++) {
        chat_chunk_head(d, b);
        sp_jbuf_printf(b, "{\"index\":%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                       "\"logprobs\":null,\"finish_reason\":null}", i);
        chat_chunk_end(b);
    }
}

static void
chat_stream_delta(sp_dialect_req_t *d, int index, sp_dialect_part_t part, const char *text,
                  size_t len, const sp_sched_event_t *ev, sp_jbuf_t *b)
{
    chat_chunk_head(d, b);
    sp_jbuf_printf(b, "{\"index\":%d,\"delta\":{%s:", index,
                   part == SP_DIALECT_REASONING ? "\"reasoning_content\"" : "\"content\"");
    sp_jbuf_str(b, text, len);
    sp_jbuf_lit(b, "},\"logprobs\":");
    if (ev != NULL && ev->has_logprobs) {
        sp_jbuf_lit(b, "{\"content\":[");
        write_chat_lp(b, ev);
        sp_jbuf_lit(b, "],\"refusal\":null}");
    } else {
        sp_jbuf_lit(b, "null");
    }
    sp_jbuf_lit(b, ",\"finish_reason\":null}");
    chat_chunk_end(b);
}

/* The calls, each in two deltas (name, then arguments), then the finish. */
static void
chat_stream_finish(sp_dialect_req_t *d, const sp_dialect_choice_t *c, sp_jbuf_t *b)
{
    for (size_t k = 0; k < n_calls(d, c->calls); k++) {
        for (int part = 1; part <= 2; part++) {
            chat_chunk_head(d, b);
            sp_jbuf_printf(b, "{\"index\":%d,\"delta\":{%s\"tool_calls\":[", c->index,
                           part == 1 && k == 0 && c->content_len == 0 ? "\"content\":null," : "");
            write_call(d, b, json_array_get(c->calls, k), (int)k, part);
            sp_jbuf_lit(b, "]},\"logprobs\":null,\"finish_reason\":null}");
            chat_chunk_end(b);
        }
    }
    chat_chunk_head(d, b);
    sp_jbuf_printf(b, "{\"index\":%d,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"%s\"}",
                   c->index, c->calls ? "tool_calls" : finish_str(c->finish));
    chat_chunk_end(b);
}

static void
chat_stream_end(sp_dialect_req_t *d, int64_t completion, sp_jbuf_t *b)
{
    if (d->include_usage) {
        sp_dialect_sse_begin(b, NULL);
        dq_object(d, b, "chat.completion.chunk");
        sp_jbuf_lit(b, ",\"choices\":[],");
        write_usage(b, d->n_prompt, completion);
        sp_jbuf_lit(b, "}");
        sp_dialect_sse_end(b);
    }
    sp_jbuf_lit(b, "data: [DONE]\n\n");
}

static void
stream_error_frame(sp_jbuf_t *b, int status, const char *message)
{
    sp_dialect_sse_begin(b, NULL);
    sp_jbuf_lit(b, "{\"error\":{\"message\":");
    sp_jbuf_cstr(b, message);
    sp_jbuf_printf(b, ",\"type\":\"server_error\",\"param\":null,\"code\":%d}}", status);
    sp_dialect_sse_end(b);
}

static void
chat_stream_error(sp_dialect_req_t *d, int status, const char *message, sp_jbuf_t *b)
{
    (void)d;
    stream_error_frame(b, status, message);
}

const sp_api_dialect_t sp_openai_chat_dialect = {
    .name = "openai/chat",
    .stream_type = "text/event-stream",
    .id_prefix = "chatcmpl",
    .id_sep = '-',
    .max_is_ceiling = false,
    .answer = chat_answer,
    .stream_start = chat_stream_start,
    .stream_delta = chat_stream_delta,
    .stream_finish = chat_stream_finish,
    .stream_end = chat_stream_end,
    .stream_error = chat_stream_error,
    .count = NULL,
    .error = NULL, /* api.h's sp_api_error writes OpenAI's shape */
};

/* ---- the pipeline's side of the dialect ---- */

/* Send what the dialect wrote (nothing: nothing to send). */
static int
dialect_send(oai_req_t *q)
{
    return q->out.len == 0 && !q->out.oom ? 0 : stream_send(q);
}

static const char *
stop_string(const oai_req_t *q, const choice_t *c)
{
    return c->finish == SP_FINISH_STOP && c->stop_index >= 0 && c->stop_index < q->prep.g.n_stop
               ? q->prep.g.stop[c->stop_index]
               : NULL;
}

/* What the reasoning and the content grew by since the last chunk. A parse
 * of a prefix gives prefixes of the whole answer's parts (answer.h), so
 * these deltas add up to the one-shot answer. */
static int
stream_answer_deltas(oai_req_t *q, int index, choice_t *c)
{
    const sp_answer_t *an = &q->ans;
    if (an->reasoning.oom || an->content.oom) {
        return -1;
    }
    sp_jbuf_reset(&q->out);
    if (an->reasoning.len > c->sent_r) {
        q->dialect->stream_delta(&q->dq, index, SP_DIALECT_REASONING, an->reasoning.p + c->sent_r,
                                 an->reasoning.len - c->sent_r, NULL, &q->out);
        c->sent_r = an->reasoning.len;
    }
    if (an->content.len > c->sent) {
        q->dialect->stream_delta(&q->dq, index, SP_DIALECT_TEXT, an->content.p + c->sent,
                                 an->content.len - c->sent, NULL, &q->out);
        c->sent = an->content.len;
    }
    return dialect_send(q);
}

/* Streaming a parsed answer: thinking goes out as reasoning and the rest as
 * content while neither can be the start of markup; from a call's start on,
 * the text waits for the finish. */
static int
stream_answer_text(oai_req_t *q, const sp_sched_event_t *ev)
{
    choice_t *c = &q->choices[ev->index];
    sp_jbuf_raw(&c->text, ev->text, ev->text_len);
    if (c->text.oom || c->text.p == NULL) {
        return c->text.oom ? -1 : 0;
    }
    sp_answer_parse(&q->afmt, c->text.p, c->text.len, true, &q->ans);
    return stream_answer_deltas(q, ev->index, c);
}

/* The end of a streamed chat choice: the rest of a parsed answer's reasoning
 * and content, then the dialect's finish (its calls, its end). */
static int
stream_chat_finish(oai_req_t *q, const sp_sched_event_t *ev)
{
    choice_t *c = &q->choices[ev->index];
    sp_dialect_choice_t dc = {.index = ev->index, .finish = c->finish, .stop_seq = stop_string(q, c)};
    if (q->answer_on) {
        sp_answer_parse(&q->afmt, c->text.p ? c->text.p : "", c->text.len, false, &q->ans);
        if (stream_answer_deltas(q, ev->index, c) != 0) {
            return -1;
        }
        dc.content = q->ans.content.p;
        dc.content_len = q->ans.content.len;
        dc.reasoning = q->ans.reasoning.p;
        dc.reasoning_len = q->ans.reasoning.len;
        dc.calls = q->ans.calls;
    } else {
        dc.content_len = c->sent;
    }
    sp_jbuf_reset(&q->out);
    q->dialect->stream_finish(&q->dq, &dc, &q->out);
    return dialect_send(q);
}

static int
stream_token(oai_req_t *q, const sp_sched_event_t *ev)
{
    choice_t *c = &q->choices[ev->index];
    if (q->answer_on) {
        return stream_answer_text(q, ev);
    }
    if (ev->text_len == 0 && !ev->has_logprobs) {
        return 0;
    }
    sp_jbuf_t *b = &q->out;
    if (q->kind == OAI_CHAT) {
        sp_jbuf_reset(b);
        q->dialect->stream_delta(&q->dq, ev->index, SP_DIALECT_TEXT, ev->text, ev->text_len,
                                 q->lp_on ? ev : NULL, b);
        c->sent += ev->text_len;
        return dialect_send(q);
    }
    if (q->infill) {
        sse_begin(q);
        infill_object(q, b, ev->text, ev->text_len, NULL, 0);
        sp_jbuf_lit(b, "\n\n");
        return stream_send(q);
    }
    chunk_head(q);
    sp_jbuf_printf(b, "{\"index\":%d,", ev->index);
    sp_jbuf_lit(b, "\"text\":");
    sp_jbuf_str(b, ev->text, ev->text_len);
    sp_jbuf_lit(b, ",\"logprobs\":");
    if (ev->has_logprobs) {
        sp_jbuf_lit(b, "{\"tokens\":[");
        sp_jbuf_str(b, ev->chosen.text, (size_t)ev->chosen.text_len);
        sp_jbuf_lit(b, "],\"token_logprobs\":[");
        sp_jbuf_num(b, ev->chosen.logprob);
        sp_jbuf_lit(b, "],\"top_logprobs\":[");
        write_top_map(b, ev);
        sp_jbuf_printf(b, "],\"text_offset\":[%zu]}", c->text_offset);
        c->text_offset += (size_t)ev->chosen.text_len;
    } else {
        sp_jbuf_lit(b, "null");
    }
    sp_jbuf_lit(b, ",\"finish_reason\":null}");
    return chunk_end(q);
}

static int
stream_finish(oai_req_t *q, const sp_sched_event_t *ev)
{
    if (q->kind == OAI_CHAT) {
        return stream_chat_finish(q, ev);
    }
    if (q->infill) {
        sse_begin(q);
        infill_object(q, &q->out, "", 0, &q->choices[ev->index], ev->n_generated);
        sp_jbuf_lit(&q->out, "\n\n");
        return stream_send(q);
    }
    chunk_head(q);
    sp_jbuf_t *b = &q->out;
    sp_jbuf_printf(b, "{\"index\":%d,", ev->index);
    sp_jbuf_lit(b, "\"text\":\"\",");
    sp_jbuf_printf(b, "\"logprobs\":null,\"finish_reason\":\"%s\"}", finish_str(ev->finish));
    return chunk_end(q);
}

static void
gather_token(oai_req_t *q, const sp_sched_event_t *ev)
{
    choice_t *c = &q->choices[ev->index];
    sp_jbuf_raw(&c->text, ev->text, ev->text_len);
    if (!ev->has_logprobs) {
        return;
    }
    if (q->kind == OAI_CHAT) {
        if (c->n_lp) {
            sp_jbuf_lit(&c->lp, ",");
        }
        write_chat_lp(&c->lp, ev);
    } else {
        const char *sep = c->n_lp ? "," : "";
        sp_jbuf_lit(&c->lp_tokens, sep);
        sp_jbuf_str(&c->lp_tokens, ev->chosen.text, (size_t)ev->chosen.text_len);
        sp_jbuf_lit(&c->lp_values, sep);
        sp_jbuf_num(&c->lp_values, ev->chosen.logprob);
        sp_jbuf_lit(&c->lp_top, sep);
        write_top_map(&c->lp_top, ev);
        sp_jbuf_printf(&c->lp_offsets, "%s%zu", sep, c->text_offset);
        c->text_offset += (size_t)ev->chosen.text_len;
    }
    c->n_lp++;
}

/* A chat answer: each choice parsed (answer.h) and written by the dialect. */
static void
reply_chat(oai_req_t *q, int64_t completion_tokens)
{
    sp_jbuf_t *b = &q->out;
    sp_jbuf_reset(b);
    sp_answer_t *ans = sp_calloc((size_t)q->n, sizeof *ans);
    sp_dialect_choice_t *dc = sp_calloc((size_t)q->n, sizeof *dc);
    if (ans == NULL || dc == NULL) {
        b->oom = true;
    }
    for (int i = 0; i < q->n && !b->oom; i++) {
        choice_t *c = &q->choices[i];
        const char *text = c->text.p ? c->text.p : "";
        c->finish = c->finished ? c->finish : SP_FINISH_STOP;
        dc[i] = (sp_dialect_choice_t){.index = i, .content = text, .content_len = c->text.len,
                                      .finish = c->finish, .stop_seq = stop_string(q, c)};
        if (q->answer_on) {
            sp_answer_parse(&q->afmt, text, c->text.len, false, &ans[i]);
            b->oom |= ans[i].content.oom || ans[i].reasoning.oom;
            dc[i].content = ans[i].content.p;
            dc[i].content_len = ans[i].content.len;
            dc[i].reasoning = ans[i].reasoning.p;
            dc[i].reasoning_len = ans[i].reasoning.len;
            dc[i].calls = ans[i].calls;
        }
        if (q->lp_on) {
            dc[i].logprobs = c->lp.p ? c->lp.p : "";
            dc[i].logprobs_len = c->lp.len;
        }
    }
    if (!b->oom) {
        q->dialect->answer(&q->dq, dc, q->n, completion_tokens, b);
    }
    for (int i = 0; ans && i < q->n; i++) {
        sp_answer_free(&ans[i]);
    }
    sp_free(ans);
    sp_free(dc);
    if (!b->oom) {
        sp_rcache_store(q->a.m, q->a.ck, "application/json", NULL, NULL, b->p, b->len,
                        q->n > 0 && q->choices[0].finished ? q->choices[0].finish : SP_FINISH_STOP);
    }
    sp_api_reply_json(q->a.http, 200, b);
}

static void
reply_complete(oai_req_t *q, int64_t completion_tokens)
{
    if (q->kind == OAI_CHAT) {
        reply_chat(q, completion_tokens);
        return;
    }
    sp_jbuf_t *b = &q->out;
    sp_jbuf_reset(b);
    if (q->infill) {
        const choice_t *c = &q->choices[0];
        infill_object(q, b, c->text.p ? c->text.p : "", c->text.len, c, completion_tokens);
        if (!b->oom) {
            sp_rcache_store(q->a.m, q->a.ck, "application/json", NULL, NULL, b->p, b->len,
                            c->finished ? c->finish : SP_FINISH_STOP);
        }
        sp_api_reply_json(q->a.http, 200, b);
        return;
    }
    begin_object(q, b, "text_completion");
    sp_jbuf_lit(b, ",\"choices\":[");
    for (int i = 0; i < q->n; i++) {
        choice_t *c = &q->choices[i];
        const char *text = c->text.p ? c->text.p : "";
        sp_jbuf_printf(b, "%s{\"index\":%d,", i ? "," : "", i);
        sp_jbuf_lit(b, "\"text\":");
        sp_jbuf_str(b, text, c->text.len);
        sp_jbuf_lit(b, ",\"logprobs\":");
        if (q->lp_on) {
            sp_jbuf_lit(b, "{\"tokens\":[");
            sp_jbuf_raw(b, c->lp_tokens.p ? c->lp_tokens.p : "", c->lp_tokens.len);
            sp_jbuf_lit(b, "],\"token_logprobs\":[");
            sp_jbuf_raw(b, c->lp_values.p ? c->lp_values.p : "", c->lp_values.len);
            sp_jbuf_lit(b, "],\"top_logprobs\":[");
            sp_jbuf_raw(b, c->lp_top.p ? c->lp_top.p : "", c->lp_top.len);
            sp_jbuf_lit(b, "],\"text_offset\":[");
            sp_jbuf_raw(b, c->lp_offsets.p ? c->lp_offsets.p : "", c->lp_offsets.len);
            sp_jbuf_lit(b, "]}");
        } else {
            sp_jbuf_lit(b, "null");
        }
        sp_jbuf_printf(b, ",\"finish_reason\":\"%s\"}",
                       finish_str(c->finished ? c->finish : SP_FINISH_STOP));
    }
    sp_jbuf_lit(b, "],");
    write_usage(b, q->n_prompt, completion_tokens);
    sp_jbuf_lit(b, "}");
    if (!b->oom) {
        sp_rcache_store(q->a.m, q->a.ck, "application/json", NULL, NULL, b->p, b->len,
                        q->n > 0 && q->choices[0].finished ? q->choices[0].finish : SP_FINISH_STOP);
    }
    sp_api_reply_json(q->a.http, 200, b);
}

static void
reply_embeddings(oai_req_t *q, int64_t prompt_tokens)
{
    sp_jbuf_t *b = &q->out;
    sp_jbuf_reset(b);
    sp_jbuf_lit(b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < q->n; i++) {
        const float *e = q->emb + (size_t)i * (size_t)q->n_embd;
        sp_jbuf_printf(b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        if (q->base64) {
            /* float32 little-endian bytes, as OpenAI's base64 encoding_format */
            /* EVP_EncodeBlock in slices of whole 3-byte groups, so only the
             * last slice can carry padding. */
            const unsigned char *p = (const unsigned char *)e;
            size_t n = (size_t)q->n_embd * sizeof(float);
            sp_jbuf_lit(b, "\"");
            unsigned char enc[4 * 256 + 1];
            for (size_t k = 0; k < n; k += 3 * 256) {
                int m = (int)(n - k < 3 * 256 ? n - k : 3 * 256);
                sp_jbuf_raw(b, (const char *)enc, (size_t)EVP_EncodeBlock(enc, p + k, m));
            }
            sp_jbuf_lit(b, "\"}");
        } else {
            sp_jbuf_lit(b, "[");
            for (int k = 0; k < q->n_embd; k++) {
                if (k) {
                    sp_jbuf_lit(b, ",");
                }
                sp_jbuf_num(b, e[k]);
            }
            sp_jbuf_lit(b, "]}");
        }
    }
    sp_jbuf_lit(b, "],\"model\":");
    sp_req_adapter_model_name(q->a.m, &q->a.ad, b);
    sp_jbuf_printf(b, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
                   (long long)prompt_tokens, (long long)prompt_tokens);
    if (!b->oom) {
        sp_rcache_store(q->a.m, q->a.ck, "application/json", NULL, NULL, b->p, b->len, SP_FINISH_STOP);
    }
    sp_api_reply_json(q->a.http, 200, b);
}

/* Rerank: results by descending score (ties by index), the first top_n. */
static void
reply_rerank(oai_req_t *q, int64_t prompt_tokens)
{
    sp_jbuf_t *b = &q->out;
    int *order = sp_malloc((size_t)q->n * sizeof(int));
    if (order == NULL) {
        sp_api_error(q->a.http, 503, NULL, NULL, NULL, "out of memory");
        return;
    }
    for (int i = 0; i < q->n; i++) { /* insertion sort: at most SP_SCHED_MAX_N documents */
        const float si = q->emb[(size_t)i * (size_t)q->n_embd];
        int j = i;
        while (j > 0 && q->emb[(size_t)order[j - 1] * (size_t)q->n_embd] < si) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    const json_t *docs = json_object_get(q->prep.body, "documents");
    sp_jbuf_reset(b);
    sp_jbuf_lit(b, "{\"model\":");
    sp_req_adapter_model_name(q->a.m, &q->a.ad, b);
    sp_jbuf_lit(b, ",\"object\":\"list\",\"results\":[");
    for (int k = 0; k < q->n && k < q->top_n; k++) {
        const int i = order[k];
        sp_jbuf_printf(b, "%s{\"index\":%d,\"relevance_score\":", k ? "," : "", i);
        sp_jbuf_num(b, q->emb[(size_t)i * (size_t)q->n_embd]);
        if (q->return_documents) {
            const json_t *d = json_array_get(docs, (size_t)i);
            const json_t *tx = json_is_object(d) ? json_object_get(d, "text") : d;
            sp_jbuf_lit(b, ",\"document\":{\"text\":");
            sp_jbuf_str(b, json_string_value(tx), json_string_length(tx));
            sp_jbuf_lit(b, "}");
        }
        sp_jbuf_lit(b, "}");
    }
    sp_free(order);
    sp_jbuf_printf(b, "],\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
                   (long long)prompt_tokens, (long long)prompt_tokens);
    if (!b->oom) {
        sp_rcache_store(q->a.m, q->a.ck, "application/json", NULL, NULL, b->p, b->len, SP_FINISH_STOP);
    }
    sp_api_reply_json(q->a.http, 200, b);
}

/* Append a generated token id for the dialect (sp_api_chat_opts_t.keep_tokens). */
static int
keep_id(oai_req_t *q, int32_t id)
{
    if (q->n_gen_ids == q->cap_gen_ids) {
        int64_t cap = q->cap_gen_ids ? 2 * q->cap_gen_ids : 256;
        int32_t *p = sp_realloc(q->gen_ids, (size_t)cap * sizeof *p);
        if (p == NULL) {
            return -1;
        }
        q->gen_ids = p;
        q->cap_gen_ids = cap;
    }
    q->gen_ids[q->n_gen_ids++] = id;
    q->dq.gen_ids = q->gen_ids;
    q->dq.n_gen_ids = q->n_gen_ids;
    return 0;
}

/* Events of a job, on the loop thread. */
/* A job's TOKEN, FINISH and EMBEDDING events (the lifecycle counted them). */
static int
oai_event(sp_api_req_t *a, const sp_sched_event_t *ev)
{
    oai_req_t *q = (oai_req_t *)a;
    switch (ev->kind) {
    case SP_SCHED_EV_TOKEN:
        if (q->keep_ids && ev->index == 0 && !sp_tokenizer_is_eog(q->a.m->tok, ev->token) &&
            keep_id(q, ev->token) != 0) {
            return -1;
        }
        if (q->stream) {
            return stream_token(q, ev);
        }
        gather_token(q, ev);
        return 0;
    case SP_SCHED_EV_FINISH:
        q->choices[ev->index].finish = ev->finish;
        q->choices[ev->index].stop_index = ev->stop_index;
        q->choices[ev->index].finished = true;
        return q->stream ? stream_finish(q, ev) : 0;
    case SP_SCHED_EV_EMBEDDING:
        if (ev->n_embd == q->n_embd && ev->index >= 0 && ev->index < q->n) {
            memcpy(q->emb + (size_t)ev->index * (size_t)q->n_embd, ev->embedding,
                   (size_t)q->n_embd * sizeof(float));
            for (int k = 0; k < q->n_embd; k++) {
                /* JSON has no NaN: never write one as null, it is the model's fault */
                q->emb_fault |= !isfinite(ev->embedding[k]);
            }
        }
        return 0;
    case SP_SCHED_EV_DONE:
        break;
    }
    return 0;
}

/* An embedding that held NaN or inf is the model's fault, whatever the job said. */
static sp_status_t
oai_outcome(sp_api_req_t *a, sp_status_t st, const char **message)
{
    oai_req_t *q = (oai_req_t *)a;
    if (st == SP_OK && q->emb_fault) {
        *message = q->kind == OAI_RERANK ? "the model produced NaN or infinite scores"
                                         : "the model produced NaN or infinite embeddings";
        return SP_ERR_MODEL_FAULT;
    }
    return st;
}

/* The job ended (accounted already): the answer, or its error. */
static void
oai_done(sp_api_req_t *a, const sp_sched_event_t *ev, sp_status_t st, const char *msg)
{
    oai_req_t *q = (oai_req_t *)a;
    sp_http_req_t *r = a->http;
    if (st != SP_OK) {
        int http = oai_http(sp_api_server_status(st));
        if (q->stream) {
            sp_jbuf_reset(&q->out);
            if (q->dialect != NULL) {
                q->dialect->stream_error(&q->dq, http, msg, &q->out);
            } else {
                stream_error_frame(&q->out, http, msg);
            }
            stream_send(q);
            sp_http_stream_end(r);
        } else {
            sp_api_error(r, http, NULL, NULL, NULL, "%s", msg);
        }
    } else if (q->kind == OAI_EMBED) {
        reply_embeddings(q, ev->prompt_tokens);
    } else if (q->kind == OAI_RERANK) {
        reply_rerank(q, ev->prompt_tokens);
    } else if (q->stream && q->dialect != NULL) {
        sp_jbuf_reset(&q->out);
        q->dialect->stream_end(&q->dq, ev->completion_tokens, &q->out);
        stream_send(q);
        sp_http_stream_end(r);
    } else if (q->stream && q->infill) {
        sp_http_stream_end(r); /* llama-server's streams end without [DONE] */
    } else if (q->stream) {
        if (q->include_usage) {
            sse_begin(q);
            begin_object(q, &q->out, "text_completion");
            sp_jbuf_lit(&q->out, ",\"choices\":[],");
            write_usage(&q->out, q->n_prompt, ev->completion_tokens);
            sp_jbuf_lit(&q->out, "}\n\n");
            stream_send(q);
        }
        sp_jbuf_reset(&q->out);
        sp_jbuf_lit(&q->out, "data: [DONE]\n\n");
        stream_send(q);
        sp_http_stream_end(r);
    } else {
        reply_complete(q, ev->completion_tokens);
    }
}

/* A refusal before the job ran, in OpenAI's error shape. */
static void
oai_admit_refuse(sp_api_req_t *a, sp_api_refusal_t why, sp_status_t st, const char *msg)
{
    sp_http_req_t *r = a->http;
    if (why == SP_API_REFUSED_TOKENS) {
        sp_api_error(r, 429, "rate_limit_error", NULL, "rate_limit_exceeded", "%s", msg);
    } else if (why == SP_API_REFUSED_QUEUE) {
        sp_api_error(r, 429, "server_overloaded", NULL, "queue_full", "%s", msg);
    } else {
        sp_api_error(r, oai_http(st), NULL, NULL, st == SP_ERR_TOO_LARGE ? "limit_exceeded" : NULL,
                     "%s", msg);
    }
}

static const sp_api_ops_t oai_ops = {
    .refuse = oai_admit_refuse,
    .event = oai_event,
    .outcome = oai_outcome,
    .done = oai_done,
    .free = oai_free,
};

/* Submit and start answering (stream head now, or wait for DONE). */
static void
submit(oai_req_t *q, const int32_t *toks, int64_t n_tok, const sp_gen_params_t *g,
       const int32_t *const *prompts, const int64_t *n_prompts, int n_seq)
{
    sp_http_req_t *r = q->a.http;
    const int32_t *one[SP_SCHED_MAX_N];
    int64_t lens[SP_SCHED_MAX_N];
    if (prompts == NULL) {
        for (int i = 0; i < n_seq; i++) {
            one[i] = toks;
            lens[i] = n_tok;
        }
        prompts = one;
        n_prompts = lens;
    }
    sp_sched_request_t sr;
    memset(&sr, 0, sizeof sr);
    sr.prompts = prompts;
    sr.n_prompts = n_prompts;
    sr.n = n_seq;
    if (g) {
        sr.gen = *g;
    }
    sr.embed = q->kind == OAI_EMBED || q->kind == OAI_RERANK;
    int64_t prompt = 0;
    for (int i = 0; i < n_seq; i++) {
        prompt += n_prompts[i];
    }
    /* Its prompts, and max_tokens for each sequence. */
    int64_t most = prompt + (sr.embed ? 0 : (int64_t)n_seq * (sr.gen.max_tokens > 0 ? sr.gen.max_tokens : 1));
    if (!sp_api_admit(&q->a, &sr, prompt, most)) {
        sp_api_finish(&q->a);
        return;
    }
    if (q->stream) {
        sp_http_add_header(r, "Cache-Control", "no-cache");
        sp_http_add_header(r, "X-Accel-Buffering", "no");
        sp_http_stream_start(r, 200, q->dialect ? q->dialect->stream_type : "text/event-stream");
        if (q->dialect != NULL) {
            sp_jbuf_reset(&q->out);
            q->dialect->stream_start(&q->dq, &q->out);
            dialect_send(q);
        }
    }
}

static oai_req_t *
oai_new(sp_serving_t *s, sp_http_req_t *r, oai_kind_t kind, sp_served_model_t *m,
        sp_req_adapter_t *ad)
{
    oai_req_t *q = sp_calloc(1, sizeof *q);
    if (q == NULL) {
        sp_req_adapter_release(ad);
        sp_served_release(m);
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        return NULL;
    }
    sp_api_begin(&q->a, &oai_ops, s, r, m, ad);
    q->kind = kind;
    q->n = 1;
    q->created = (int64_t)time(NULL);
    make_id(q->id, sizeof q->id, kind == OAI_CHAT ? "chatcmpl" : kind == OAI_EMBED ? "embd" : "cmpl",
            sp_http_req_id(r));
    /* What the model can do: an encoder embeds (or, a reranker, scores pairs)
     * and never generates; only a reranker scores. */
    const sp_model_t *mm = m->model;
    const sp_pooling_t pool = sp_model_pooling(mm);
    const char *why = NULL;
    if (sp_model_is_encoder(mm) && (kind == OAI_COMPLETION || kind == OAI_CHAT)) {
        why = pool == SP_POOLING_RANK ? "is a reranker (%s): use /v1/rerank"
                                      : "is an embedding model (%s): use /v1/embeddings";
    } else if (kind == OAI_EMBED && (pool == SP_POOLING_RANK || pool == SP_POOLING_NONE)) {
        why = pool == SP_POOLING_RANK ? "is a reranker (%s): use /v1/rerank"
                                      : "has pooling type none (%s): it gives no single vector per input";
    } else if (kind == OAI_RERANK && pool != SP_POOLING_RANK) {
        why = "is not a reranker (%s; a reranker is a bert cross-encoder with pooling type rank)";
    }
    if (why != NULL) {
        char msg[256];
        snprintf(msg, sizeof msg, why, sp_model_hparams(mm)->arch);
        sp_api_error(r, 400, NULL, "model", "model_not_supported", "the model %s %s", m->name, msg);
        sp_api_finish(&q->a);
        return NULL;
    }
    return q;
}

/* The start of a handler over a JSON body and a model: the body (NULL when
 * it is still arriving or was refused), the model it names and a request of
 * `kind` on it. NULL when any step answered the request already; *body is
 * then NULL or the caller's to release. */
static oai_req_t *
oai_begin(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p, sp_route_fn self,
          oai_kind_t kind, json_t **body)
{
    *body = sp_api_json_body(s, r, self, p);
    if (*body == NULL) {
        return NULL;
    }
    sp_req_adapter_t ad;
    sp_served_model_t *m = get_model(s, r, *body, self, p, &ad);
    return m == NULL ? NULL : oai_new(s, r, kind, m, &ad);
}

static void run_generation_n(oai_req_t *q, sp_gen_params_t *g, int64_t max_tokens,
                             bool max_given, int32_t *toks, int64_t n_tok, const tok_in_t *in,
                             int n_in);

/* Shared by completions and chat after the prompt tokens are known. */
static void
run_generation(oai_req_t *q, sp_gen_params_t *g, int64_t max_tokens, bool max_given,
               int32_t *toks, int64_t n_tok)
{
    run_generation_n(q, g, max_tokens, max_given, toks, n_tok, NULL, 0);
}

/* With prompts (n_in of them, completions' list of prompts): each gets the
 * request's n choices, choice p * n + j for prompt p; toks/n_tok unused. */
static void
run_generation_n(oai_req_t *q, sp_gen_params_t *g, int64_t max_tokens, bool max_given,
                 int32_t *toks, int64_t n_tok, const tok_in_t *in, int n_in)
{
    int64_t n_ctx = q->a.m->n_ctx;
    int64_t sum_tok = n_tok;
    if (in != NULL) {
        n_tok = sum_tok = 0;
        for (int i = 0; i < n_in; i++) {
            n_tok = in[i].n > n_tok ? in[i].n : n_tok; /* the longest bounds max_tokens */
            sum_tok += in[i].n;
        }
        q->n *= n_in;
    }
    if (n_tok >= n_ctx) {
        sp_api_error(q->a.http, 400, NULL, "messages", "context_length_exceeded",
                     "the prompt has %lld tokens, the context holds %lld", (long long)n_tok,
                     (long long)n_ctx);
        sp_api_finish(&q->a);
        return;
    }
    if (!max_given) {
        max_tokens = q->a.m->def.max_tokens > 0 ? q->a.m->def.max_tokens
                     : q->kind == OAI_CHAT || q->infill ? n_ctx - n_tok
                                              : 16;
        if (max_tokens > q->a.srv->cfg.max_tokens) {
            max_tokens = q->a.srv->cfg.max_tokens;
        }
        if (max_tokens > n_ctx - n_tok) {
            max_tokens = n_ctx - n_tok;
        }
        /* A tenant's minute must hold the whole reservation (submit): a
         * default that could never fit stops within the tokens limit. */
        int64_t tpm = sp_auth_tpm(sp_http_req_user(q->a.http));
        if (tpm > 0 && max_tokens > (tpm - n_tok) / q->n) {
            max_tokens = (tpm - n_tok) / q->n > 1 ? (tpm - n_tok) / q->n : 1;
        }
    } else if (n_tok + max_tokens > n_ctx && q->dialect && q->dialect->max_is_ceiling) {
        max_tokens = n_ctx - n_tok;
    } else if (n_tok + max_tokens > n_ctx) {
        sp_api_error(q->a.http, 400, NULL, "max_tokens", "context_length_exceeded",
                     "this model's context is %lld tokens; the prompt has %lld and max_tokens "
                     "asks for %lld more",
                     (long long)n_ctx, (long long)n_tok, (long long)max_tokens);
        sp_api_finish(&q->a);
        return;
    }
    g->max_tokens = (int32_t)max_tokens;
    q->n_prompt = sum_tok;
    q->dq.n_prompt = sum_tok;
    if (q->keep_ids) { /* chat: one prompt, toks */
        q->dq.prompt_ids = in != NULL ? in[0].dst : toks;
        q->dq.n_prompt_ids = in != NULL ? in[0].n : n_tok;
    }
    q->choices = sp_calloc((size_t)q->n, sizeof *q->choices);
    if (q->choices == NULL) {
        sp_api_error(q->a.http, 503, NULL, NULL, NULL, "out of memory");
        sp_api_finish(&q->a);
        return;
    }
    for (int i = 0; i < q->n; i++) {
        q->choices[i].stop_index = -1;
    }
    if (in != NULL) {
        const int32_t *prompts[SP_SCHED_MAX_N];
        int64_t lens[SP_SCHED_MAX_N];
        int per = q->n / n_in;
        for (int i = 0; i < q->n; i++) {
            prompts[i] = in[i / per].dst;
            lens[i] = in[i / per].n;
        }
        submit(q, NULL, 0, g, prompts, lens, q->n);
        return;
    }
    submit(q, toks, n_tok, g, NULL, NULL, q->n);
}

/* Loop thread: the preparation's result. Answer its error, or submit. */
static void
prep_done(sp_offload_t *job, sp_http_req_t *r)
{
    oai_req_t *q = SP_OFFLOAD_HOLDER(job, oai_req_t, a.off);
    oai_prep_t *pp = &q->prep;
    if (pp->http != 0) {
        sp_api_error(r, pp->http, NULL, pp->param, pp->code, "%s", pp->err);
        sp_api_finish(&q->a);
        return;
    }
    pp->g.grammar = q->grammar;
    if (q->kind == OAI_EMBED || q->kind == OAI_RERANK) {
        const int32_t *prompts[SP_SCHED_MAX_N];
        int64_t lens[SP_SCHED_MAX_N];
        for (int i = 0; i < pp->n_in && i < SP_SCHED_MAX_N; i++) {
            prompts[i] = pp->in[i].dst;
            lens[i] = pp->in[i].n;
        }
        submit(q, NULL, 0, NULL, prompts, lens, q->n);
        return;
    }
    if (pp->prompt) {
        /* The access log keeps the end of the rendered prompt (the latest turn). */
        size_t keep = pp->plen > SP_REQ_TEXT_MAX ? SP_REQ_TEXT_MAX : pp->plen;
        sp_metrics_clock_text(&q->a.clk, false, pp->prompt + pp->plen - keep, keep);
    }
    if (q->count_only) {
        /* Counted, not generated: accounted as a request without tokens. */
        sp_jbuf_reset(&q->out);
        q->dialect->count(&q->dq, pp->in[0].n, &q->out);
        sp_api_end(&q->a, true, SP_FAIL_INVALID);
        sp_api_reply_json(r, 200, &q->out);
        sp_api_finish(&q->a);
        return;
    }
    if (q->kind == OAI_COMPLETION && pp->n_in > 1) {
        run_generation_n(q, &pp->g, pp->max_tokens, pp->max_given, NULL, 0, pp->in, pp->n_in);
        return;
    }
    run_generation(q, &pp->g, pp->max_tokens, pp->max_given, pp->in[0].dst, pp->in[0].n);
}

/* Loop thread: room for n prompts of the model's context (tokens and their
 * tokenize jobs); false after answering 503. */
static bool
prep_alloc(oai_req_t *q, int n)
{
    oai_prep_t *pp = &q->prep;
    pp->cap = q->a.m->n_ctx;
    pp->toks = sp_malloc((size_t)n * (size_t)pp->cap * sizeof(int32_t));
    pp->in = sp_calloc((size_t)n, sizeof *pp->in);
    if (pp->toks == NULL || pp->in == NULL) {
        sp_api_error(q->a.http, 503, NULL, NULL, NULL, "out of memory");
        return false;
    }
    pp->n_in = n;
    for (int i = 0; i < n; i++) {
        pp->in[i].dst = pp->toks + (size_t)i * (size_t)pp->cap;
    }
    return true;
}

/* The response cache (respcache.h): only answers that a second run would
 * repeat are kept: greedy requests (temperature 0), seeded ones (a `seed` in
 * the request or in the model's config: the sampler then draws the same
 * tokens, choice i with seed + i) and embeddings, never streams. The key is
 * the body with sorted keys, less the fields that do not change the answer.
 * g is NULL for embeddings. true: answered from the cache. */
static bool
cache_lookup(oai_req_t *q, const json_t *b, const sp_gen_params_t *g)
{
    static const char *const drop[] = {"stream", "stream_options", "user", "priority", "timeout",
                                       "metadata", "service_tier", NULL};
    if (!sp_rckey_enabled(q->a.m) || q->stream || (q->dialect != NULL && q->dialect->no_cache)) {
        return false;
    }
    if (g && !(g->sampling.temperature == 0.0f || json_is_integer(json_object_get(b, "seed")) ||
               q->a.m->def.seed_set)) {
        return false;
    }
    q->a.ck = sp_rckey_new(q->a.m, q->kind == OAI_CHAT    ? q->dialect->name
                               : q->kind == OAI_EMBED ? "openai/embeddings"
                               : q->kind == OAI_RERANK ? "openai/rerank"
                               : q->infill             ? "llama/infill"
                                                      : "openai/completions");
    sp_rckey_add_json(q->a.ck, b, drop);
    if (q->a.ad.lora != NULL) {
        /* The adapter as loaded: a reloaded file never replays the old one's answers. */
        sp_rckey_add_u64(q->a.ck, sp_lora_id(q->a.ad.lora));
    }
    return sp_rcache_lookup(q->a.http, q->a.m, q->a.ck, &q->a.clk);
}

/* -------------------------------------------------------------- handlers */

static bool
name_in(const char (*names)[129], int32_t n, const char *name, size_t len)
{
    for (int32_t i = 0; i < n; i++) {
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0) {
            return true;
        }
    }
    return false;
}

static void
h_models(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    sp_str_t want = sp_router_param(p, "model");
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    int found = 0;
    if (!want.ptr) {
        sp_jbuf_lit(&b, "{\"object\":\"list\",\"data\":[");
    }
    /* A tenant with a model list sees only those models (and the adapters
     * named in it): the others do not exist for it (404 below). */
    sp_tenant_state_t *tenant = sp_http_req_user(r);
    const bool restricted = sp_auth_restricted(tenant);
    if (restricted && want.ptr && !sp_auth_model_allowed(tenant, want.ptr, want.len)) {
        sp_jbuf_free(&b);
        sp_api_error(r, 404, "invalid_request_error", "model", "model_not_found",
                     "The model does not exist");
        return;
    }
    char (*names)[129] = NULL;
    int32_t n_names = 0;
    if (restricted) {
        names = sp_malloc(sizeof(char[SP_TENANT_MODELS_MAX][129]));
        if (names == NULL) {
            sp_jbuf_free(&b);
            sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
            return;
        }
        n_names = sp_auth_models(tenant, names, SP_TENANT_MODELS_MAX);
    }
    /* One entry per name: the version a request would get (the newest
     * READY one), or one that loads on demand (ready false). */
    sp_registry_t *reg = &s->reg;
    pthread_mutex_lock(&reg->mu);
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        const sp_model_entry_t *e = &reg->entry[i];
        bool routable = e->used && ((e->live && e->state == SP_REPO_READY) ||
                                    e->state == SP_REPO_LOADING || (e->on_demand && !e->demand_failed));
        /* GET /v1/models/<model>:<adapter> asks for one of its adapters. */
        const bool want_base = !want.ptr || sp_str_eq_c(want, e->name);
        if (!routable || (!want_base && !sp_adapters_prefix(want, e->name))) {
            continue;
        }
        const sp_model_entry_t *best = e;
        bool first = true;
        for (int k = 0; k < SP_SERVE_MAX_ENTRIES && first; k++) {
            const sp_model_entry_t *o = &reg->entry[k];
            if (k == i || !o->used || strcmp(o->name, e->name) != 0) {
                continue;
            }
            bool o_ready = o->live && o->state == SP_REPO_READY;
            bool o_routable = o_ready || o->state == SP_REPO_LOADING || (o->on_demand && !o->demand_failed);
            if (o_routable && k < i) {
                first = false; /* listed with the first routable entry of the name */
            }
            if (o_ready && (!(best->live && best->state == SP_REPO_READY) || o->version > best->version)) {
                best = o;
            }
        }
        if (!first) {
            continue;
        }
        bool ready = best->live && best->state == SP_REPO_READY;
        if (want_base && (!restricted || name_in(names, n_names, e->name, strlen(e->name)))) {
            sp_jbuf_lit(&b, found++ ? ",{\"id\":" : "{\"id\":");
            sp_jbuf_cstr(&b, e->name);
            sp_jbuf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"sampan\","
                           "\"max_model_len\":%lld,\"ready\":%s}",
                           (long long)(ready ? best->live->created : s->started_unix),
                           (long long)(ready ? best->live->n_ctx : 0), ready ? "true" : "false");
        }
        if (ready && !(want.ptr && want_base)) {
            /* Its adapters, "<model>:<adapter>" with "parent" (vLLM's LoRA entries). */
            if (!restricted || want.ptr) {
                sp_adapters_list_locked(best->live, want_base ? (sp_str_t){NULL, 0} : want, &b, &found);
            } else {
                for (int32_t k = 0; k < n_names; k++) { /* those of its adapters named in the list */
                    sp_str_t nk = {names[k], strlen(names[k])};
                    if (sp_adapters_prefix(nk, e->name)) {
                        sp_adapters_list_locked(best->live, nk, &b, &found);
                    }
                }
            }
        }
    }
    pthread_mutex_unlock(&reg->mu);
    sp_free(names);
    if (want.ptr && !found) {
        sp_jbuf_free(&b);
        sp_api_error(r, 404, "invalid_request_error", "model", "model_not_found",
                     "The model does not exist");
        return;
    }
    if (!want.ptr) {
        sp_jbuf_lit(&b, "]}");
    }
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

static void
h_completions(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = NULL;
    oai_req_t *q = oai_begin(s, r, p, h_completions, OAI_COMPLETION, &b);
    if (q == NULL) {
        goto done;
    }
    sp_served_model_t *m = q->a.m;
    oai_prep_t *pp = &q->prep;
    pp->body = json_incref(b);
    pp->max_tokens = 16;
    if (parse_gen(q, b, &pp->g, &pp->max_tokens, &pp->max_given) != 0 ||
        cache_lookup(q, b, &pp->g)) {
        sp_api_finish(&q->a);
        goto done;
    }
    bool echo = false;
    sp_json_err_t e = {{0}, NULL};
    if (sp_json_get_bool(b, "echo", &echo, &e) < 0 || echo) {
        if (echo) {
            sp_json_fail(&e, "echo", "'echo' is not supported");
        }
        field_error(r, &e);
        sp_api_finish(&q->a);
        goto done;
    }
    const json_t *pr = json_object_get(b, "prompt");
    /* prompt: "text", [ids], or a list of them (["a", "b"], [[ids], [ids]]):
     * each prompt gets n completions, choice p * n + j */
    size_t n_pr = 1;
    if (json_is_array(pr) && json_array_size(pr) > 0 &&
        (json_is_string(json_array_get(pr, 0)) || json_is_array(json_array_get(pr, 0)))) {
        n_pr = json_array_size(pr);
        for (size_t i = 0; i < n_pr; i++) {
            const json_t *x = json_array_get(pr, i);
            if (!(json_is_string(x) || (json_is_array(x) && json_array_size(x) > 0 &&
                                        json_is_integer(json_array_get(x, 0))))) {
                sp_api_error(r, 400, NULL, "prompt", NULL,
                             "prompt[%zu]: a list of prompts holds strings or lists of token ids",
                             i);
                sp_api_finish(&q->a);
                goto done;
            }
        }
        if (n_pr * (size_t)q->n > (size_t)q->a.srv->cfg.max_n || n_pr * (size_t)q->n > SP_SCHED_MAX_N) {
            sp_api_error(r, 400, NULL, "prompt", NULL,
                         "%zu prompts x n=%d is more than %d completions per request", n_pr, q->n,
                         q->a.srv->cfg.max_n < SP_SCHED_MAX_N ? q->a.srv->cfg.max_n : SP_SCHED_MAX_N);
            sp_api_finish(&q->a);
            goto done;
        }
    }
    if (!prep_alloc(q, (int)n_pr)) {
        sp_api_finish(&q->a);
        goto done;
    }
    pp->add_bos = sp_chat_add_bos(m->tok, NULL, 0);
    pp->special = false;
    pp->tok_param = "prompt";
    for (size_t i = 0; i < n_pr; i++) {
        const json_t *x = n_pr > 1 || (json_is_array(pr) && json_array_size(pr) == 1 &&
                                        !json_is_integer(json_array_get(pr, 0)))
                              ? json_array_get(pr, i) : pr;
        if (json_is_string(x)) {
            if (json_string_length(x) == 0) {
                sp_api_error(r, 400, NULL, "prompt", NULL, "'prompt' must not be empty");
                sp_api_finish(&q->a);
                goto done;
            }
            if (i == 0) {
                sp_metrics_clock_text(&q->a.clk, false, json_string_value(x), json_string_length(x));
            }
            pp->in[i].text = json_string_value(x); /* tokenized by the preparation */
            pp->in[i].len = json_string_length(x);
        } else if (json_is_array(x) && json_array_size(x) > 0 &&
                   json_is_integer(json_array_get(x, 0))) {
            if (parse_id_array(q, x, "prompt", pp->in[i].dst, pp->cap, &pp->in[i].n) != 0) {
                sp_api_finish(&q->a);
                goto done;
            }
        } else {
            sp_api_error(r, 400, NULL, "prompt", NULL,
                         "'prompt' must be a non-empty string or a list of token ids");
            sp_api_finish(&q->a);
            goto done;
        }
    }
    prep_start(q);
done:
    json_decref(b); /* the request keeps its own reference until it ends */
}

/*
 * llama-server's POST /infill: input_prefix and input_suffix (required
 * strings), input_extra (optional [{"text", "filename"?}], other files of the
 * project), prompt (optional: text the middle starts with), n_predict (-1 or
 * absent: until the context is full), the /v1/completions sampling fields;
 * the prompt is laid out as sp_fim_encode says and answered in llama-server's
 * shape (infill_object).
 */
static int
infill_fields(oai_req_t *q, const json_t *b)
{
    oai_prep_t *pp = &q->prep;
    sp_http_req_t *r = q->a.http;
    const json_t *pre = json_object_get(b, "input_prefix"), *suf = json_object_get(b, "input_suffix");
    const json_t *mid = json_object_get(b, "prompt"), *extra = json_object_get(b, "input_extra");
    const char *bad = !json_is_string(pre) ? "input_prefix" : !json_is_string(suf) ? "input_suffix"
                      : mid != NULL && !json_is_null(mid) && !json_is_string(mid) ? "prompt" : NULL;
    if (bad != NULL) {
        sp_api_error(r, 400, NULL, bad, NULL, strcmp(bad, "prompt") == 0 ? "'prompt' must be a string"
                     : "'%s' is required, a string", bad);
        return -1;
    }
    if (pp->fim) {
        sp_api_error(r, 400, NULL, "suffix", NULL, "/infill takes 'input_suffix', not 'suffix'");
        return -1;
    }
    if (q->lp_on || q->n != 1 || (json_is_integer(json_object_get(b, "n_probs")) &&
                                  json_integer_value(json_object_get(b, "n_probs")) != 0)) {
        const char *param = q->n != 1 ? "n" : q->lp_on ? "logprobs" : "n_probs";
        sp_api_error(r, 400, NULL, param, NULL, "'%s' is not served on /infill: use /v1/completions "
                     "with 'suffix'", param);
        return -1;
    }
    size_t n_extra = json_is_array(extra) ? json_array_size(extra) : 0;
    if (extra != NULL && !json_is_null(extra) && !json_is_array(extra)) {
        sp_api_error(r, 400, NULL, "input_extra", NULL,
                     "'input_extra' must be a list of {\"text\": string, \"filename\": string}");
        return -1;
    }
    if (n_extra > 0 && (pp->fim_extra = sp_calloc(n_extra, sizeof *pp->fim_extra)) == NULL) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n_extra; i++) {
        const json_t *c = json_array_get(extra, i);
        const json_t *t = json_object_get(c, "text"), *f = json_object_get(c, "filename");
        if (!json_is_string(t) || (f != NULL && !json_is_null(f) && !json_is_string(f)) ||
            (json_is_string(f) && json_string_length(f) > SP_FIM_MAX_FILENAME)) {
            sp_api_error(r, 400, NULL, "input_extra", NULL,
                         "input_extra[%zu] must be {\"text\": string, \"filename\": string of at "
                         "most %d bytes}", i, SP_FIM_MAX_FILENAME);
            return -1;
        }
        pp->fim_extra[i] = (sp_fim_chunk_t){.text = json_string_value(t), .text_len = json_string_length(t),
                                            .filename = json_is_string(f) ? json_string_value(f) : NULL,
                                            .filename_len = json_is_string(f) ? json_string_length(f) : 0};
    }
    sp_json_err_t e = {{0}, NULL};
    int64_t np;
    int rc = sp_json_get_int(b, "n_predict", -1, q->a.srv->cfg.max_tokens, &np, &e);
    if (rc < 0 || (rc > 0 && np == 0)) {
        sp_api_error(r, 400, NULL, "n_predict", NULL,
                     "'n_predict' must be -1 (until the context is full) or 1..%d",
                     q->a.srv->cfg.max_tokens);
        return -1;
    }
    if (rc > 0 && np > 0 && pp->max_given && np != pp->max_tokens) {
        sp_api_error(r, 400, NULL, "n_predict", NULL, "'n_predict' and 'max_tokens' disagree");
        return -1;
    }
    if (rc > 0 && np > 0) {
        pp->max_tokens = np;
        pp->max_given = true;
    }
    pp->fim = true;
    pp->fimp = (sp_fim_prompt_t){.suffix = json_string_value(suf), .suffix_len = json_string_length(suf),
                                 .middle = json_is_string(mid) ? json_string_value(mid) : NULL,
                                 .middle_len = json_is_string(mid) ? json_string_length(mid) : 0,
                                 .repo = true, .extra = pp->fim_extra, .n_extra = (int)n_extra};
    pp->in[0].text = json_string_value(pre);
    pp->in[0].len = json_string_length(pre);
    return 0;
}

static void
h_infill(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = NULL;
    oai_req_t *q = oai_begin(s, r, p, h_infill, OAI_COMPLETION, &b);
    if (q == NULL) {
        goto done;
    }
    sp_served_model_t *m = q->a.m;
    q->infill = true;
    oai_prep_t *pp = &q->prep;
    pp->body = json_incref(b);
    if (fim_refused(q, "input_prefix") ||
        parse_gen(q, b, &pp->g, &pp->max_tokens, &pp->max_given) != 0 || !prep_alloc(q, 1) ||
        infill_fields(q, b) != 0 || cache_lookup(q, b, &pp->g)) {
        sp_api_finish(&q->a);
        goto done;
    }
    pp->add_bos = sp_chat_add_bos(m->tok, NULL, 0);
    pp->special = false;
    pp->tok_param = "input_prefix";
    prep_start(q);
done:
    json_decref(b);
}

/*
 * tools and tool_choice. With tools and a choice other than "none" the
 * output is parsed for calls in the template's convention; "required" or a
 * named function also constrain decoding to one call whose arguments follow
 * the function's parameters schema. *tools_json (jansson's allocator) is the
 * list for the template. Returns -1 after answering.
 */
static int
parse_tools(oai_req_t *q, const json_t *b, sp_gen_params_t *g, char **tools_json)
{
    sp_http_req_t *r = q->a.http;
    const json_t *tools = json_object_get(b, "tools");
    const json_t *tch = json_object_get(b, "tool_choice");
    bool have = tools != NULL && !json_is_null(tools);
    *tools_json = NULL;
    q->tool_fmt = sp_chat_tool_format(q->a.m->tmpl);
    if (have) {
        if (!json_is_array(tools) || json_array_size(tools) > 128) {
            sp_api_error(r, 400, NULL, "tools", NULL, "'tools' must be a list of at most 128 tools");
            return -1;
        }
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *fn = json_object_get(t, "function");
            const json_t *name = json_object_get(fn, "name");
            const json_t *params = json_object_get(fn, "parameters");
            const json_t *desc = json_object_get(fn, "description");
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!json_is_object(t) || type == NULL || strcmp(type, "function") != 0 ||
                !json_is_object(fn) || !json_is_string(name) || json_string_length(name) == 0 ||
                json_string_length(name) > 64 || (params && !json_is_object(params)) ||
                (desc && !json_is_string(desc))) {
                sp_api_error(r, 400, NULL, "tools", NULL,
                             "tools[%zu] must be {\"type\": \"function\", \"function\": "
                             "{\"name\": \"...\" (1 to 64 bytes), \"description\": \"...\", "
                             "\"parameters\": {JSON Schema}}}", i);
                return -1;
            }
        }
    }
    const char *choice = have ? "auto" : "none", *only = NULL;
    if (tch != NULL && !json_is_null(tch)) {
        if (json_is_string(tch) && (strcmp(json_string_value(tch), "none") == 0 ||
                                    strcmp(json_string_value(tch), "auto") == 0 ||
                                    strcmp(json_string_value(tch), "required") == 0)) {
            choice = json_string_value(tch);
        } else if (json_is_object(tch) &&
                   json_is_string(json_object_get(json_object_get(tch, "function"), "name"))) {
            choice = "function";
            only = json_string_value(json_object_get(json_object_get(tch, "function"), "name"));
        } else {
            sp_api_error(r, 400, NULL, "tool_choice", NULL,
                         "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": \"...\"}}");
            return -1;
        }
        if (!have && strcmp(choice, "none") != 0) {
            sp_api_error(r, 400, NULL, "tool_choice", NULL, "'tool_choice' needs 'tools'");
            return -1;
        }
    }
    if (!have || strcmp(choice, "none") == 0) {
        return 0;
    }
    q->tools_on = true;
    *tools_json = json_dumps(tools, JSON_COMPACT);
    if (*tools_json == NULL) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        return -1;
    }
    if (strcmp(choice, "auto") == 0) {
        return 0;
    }
    if (g->json_object || q->prep.schema || q->prep.gbnf) {
        sp_api_error(r, 400, NULL, "tool_choice", NULL,
                     "a forced tool call cannot be combined with response_format or grammar");
        return -1;
    }
    q->prep.tools = tools; /* its grammar is compiled by the preparation */
    q->prep.tool_only = only;
    return 0;
}

/*
 * How the answer is taken apart (answer.h): the template's reasoning and
 * tool-call families, and `reasoning_format` ("auto" and "deepseek": the
 * thinking goes to reasoning_content; "none": it stays in content, as the
 * model wrote it), the request's or else the server's --reasoning-format.
 * Returns -1 after answering.
 */
static int
parse_answer_format(oai_req_t *q, const sp_serving_t *s, const json_t *b)
{
    const json_t *rf = json_object_get(b, "reasoning_format");
    const char *v = s->cfg.reasoning_format[0] ? s->cfg.reasoning_format : "auto";
    if (rf != NULL && !json_is_null(rf)) {
        v = json_string_value(rf);
        if (v == NULL || (strcmp(v, "none") != 0 && strcmp(v, "auto") != 0 &&
                          strcmp(v, "deepseek") != 0)) {
            sp_api_error(q->a.http, 400, NULL, "reasoning_format", NULL,
                         "'reasoning_format' must be \"none\", \"auto\" or \"deepseek\"");
            return -1;
        }
    }
    sp_answer_fmt_t *f = &q->afmt;
    f->reasoning = sp_chat_reasoning_format(q->a.m->tmpl);
    f->inline_reasoning = strcmp(v, "none") == 0;
    f->parse_tools = q->tools_on;
    /* a forced call is written in the grammar's family */
    f->tools = q->prep.tools ? sp_toolcall_grammar_format(q->tool_fmt) : q->tool_fmt;
    f->tool_list = json_object_get(b, "tools"); /* the body outlives the request */
    q->answer_on = q->tools_on || (f->reasoning != SP_CHAT_REASONING_NONE && !f->inline_reasoning);
    /* markup written in control tokens must reach the text, parsed or shown */
    q->prep.g.special_text = q->tools_on || f->reasoning != SP_CHAT_REASONING_NONE;
    return 0;
}

void
sp_api_chat_run(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p, sp_route_fn retry,
                json_t *b, const sp_api_dialect_t *d, bool count_only, int flags)
{
    sp_api_chat_run_ud(s, r, p, retry, b, d, count_only, flags, NULL);
}

static void chat_run(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p,
                     sp_route_fn retry, json_t *b, const sp_api_dialect_t *d, bool count_only,
                     int flags, void *ud, const sp_api_chat_opts_t *o);

void
sp_api_chat_run_ud(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p,
                   sp_route_fn retry, json_t *b, const sp_api_dialect_t *d, bool count_only,
                   int flags, void *ud)
{
    chat_run(s, r, p, retry, b, d, count_only, flags, ud, NULL);
}

void
sp_api_chat_run_opts(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p,
                     sp_route_fn retry, json_t *b, const sp_api_dialect_t *d, int flags,
                     const sp_api_chat_opts_t *o)
{
    chat_run(s, r, p, retry, b, d, false, flags, NULL, o);
}

/* The context ids of sp_api_chat_opts_t: integers of the vocabulary. -1 after answering. */
static int
parse_context(oai_req_t *q, const json_t *ctx)
{
    oai_prep_t *pp = &q->prep;
    size_t n = json_array_size(ctx);
    if (n == 0) {
        return 0;
    }
    if ((int64_t)n >= q->a.m->n_ctx) {
        sp_api_error(q->a.http, 400, NULL, "context", "context_length_exceeded",
                     "'context' has %zu tokens, the model's context holds %lld", n,
                     (long long)q->a.m->n_ctx);
        return -1;
    }
    if ((pp->ctx_ids = sp_malloc(n * sizeof *pp->ctx_ids)) == NULL) {
        sp_api_error(q->a.http, 503, NULL, NULL, NULL, "out of memory");
        return -1;
    }
    int32_t n_vocab = sp_tokenizer_n_vocab(q->a.m->tok);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(ctx, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab) {
            sp_api_error(q->a.http, 400, NULL, "context", NULL,
                         "'context' must be the token ids an earlier answer returned: integers "
                         "in 0..%d", n_vocab - 1);
            return -1;
        }
        pp->ctx_ids[i] = (int32_t)json_integer_value(t);
    }
    pp->n_ctx_ids = (int64_t)n;
    return 0;
}

static void
chat_run(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p, sp_route_fn retry,
         json_t *b, const sp_api_dialect_t *d, bool count_only, int flags, void *ud,
         const sp_api_chat_opts_t *o)
{
    oai_req_t *q = NULL;
    sp_req_adapter_t ad;
    sp_served_model_t *m = get_model(s, r, b, retry, p, &ad);
    if (m == NULL || (q = oai_new(s, r, OAI_CHAT, m, &ad)) == NULL) {
        if (ud != NULL && d->release != NULL) {
            d->release(ud);
        }
        return;
    }
    q->dialect = d;
    q->dq.ud = ud; /* released with q (oai_free) from here on */
    q->count_only = count_only;
    sp_dialect_id(q->id, sizeof q->id, d->id_prefix, d->id_sep, sp_http_req_id(r));
    sp_req_adapter_model_name(m, &q->a.ad, &q->model_name);
    if (q->model_name.oom) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        goto fail;
    }
    q->dq = (sp_dialect_req_t){.id = q->id, .created = q->created, .model = q->model_name.p,
                               .req_id = sp_http_req_id(r), .n = 1, .flags = flags,
                               .ud = ud, .clk = &q->a.clk};
    oai_prep_t *pp = &q->prep;
    pp->body = json_incref(b);
    if (parse_gen(q, b, &pp->g, &pp->max_tokens, &pp->max_given) != 0 ||
        (!count_only && cache_lookup(q, b, &pp->g))) {
        goto fail;
    }
    q->dq.n = q->n;
    q->dq.include_usage = q->include_usage;
    q->dq.logprobs = q->lp_on;
    const json_t *ptc = json_object_get(b, "parallel_tool_calls");
    if (ptc != NULL && !json_is_null(ptc) && !json_is_boolean(ptc)) {
        sp_api_error(r, 400, NULL, "parallel_tool_calls", NULL, "'parallel_tool_calls' must be a boolean");
        goto fail;
    }
    q->dq.one_call = json_is_false(ptc); /* only the first call is answered */
    const json_t *ms = json_object_get(b, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        sp_api_error(r, 400, NULL, "messages", NULL, "'messages' must be a non-empty list");
        goto fail;
    }
    if (o != NULL && o->raw_prompt != NULL) {
        pp->raw = o->raw_prompt; /* the prompt as is: no template */
        pp->raw_len = o->raw_len;
    } else if (m->tmpl == NULL) {
        sp_api_error(r, 400, NULL, "messages", NULL, "the model %s has no usable chat template: %s",
                     m->name, m->tmpl_error);
        goto fail;
    } else {
        pp->messages = ms; /* checked, gathered and rendered by the preparation */
    }
    if (o != NULL && ((o->context != NULL && parse_context(q, o->context) != 0) ||
                      (o->fim_suffix != NULL && fim_refused(q, "suffix")))) {
        goto fail;
    }
    if (o != NULL && o->fim_suffix != NULL) {
        pp->fim = true; /* the raw prompt is the prefix */
        pp->fimp.suffix = o->fim_suffix;
        pp->fimp.suffix_len = o->fim_suffix_len;
    }
    q->keep_ids = o != NULL && o->keep_tokens;
    const char *param = NULL;
    char err[256];
    if (sp_chat_input_options(b, &pp->kwargs, &pp->effort, &param, err, sizeof err) != SP_OK) {
        sp_api_error(r, 400, NULL, param, NULL, "%s", err);
        goto fail;
    }
    int32_t bid = sp_tokenizer_bos(m->tok), eid = sp_tokenizer_eos(m->tok);
    if (bid >= 0) {
        sp_str_t t = sp_tokenizer_token_text(m->tok, bid);
        snprintf(pp->bos, sizeof pp->bos, "%.*s", (int)t.len, t.ptr);
    }
    if (eid >= 0) {
        sp_str_t t = sp_tokenizer_token_text(m->tok, eid);
        snprintf(pp->eos, sizeof pp->eos, "%.*s", (int)t.len, t.ptr);
    }
    if (parse_tools(q, b, &pp->g, &pp->tools_json) != 0 || parse_answer_format(q, s, b) != 0) {
        goto fail;
    }
    if (sp_budget_parse(b, q->afmt.reasoning, s->cfg.reasoning_budget, &pp->budget, &param, err,
                        sizeof err) != 0) {
        sp_api_error(r, 400, NULL, param, NULL, "%s", err);
        goto fail;
    }
    if (!prep_alloc(q, 1)) {
        goto fail;
    }
    pp->special = true;
    pp->tok_param = "messages";
    prep_start(q); /* render, tokenize, then generate */
    return;
fail:
    sp_api_finish(&q->a);
}

static void
h_chat(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = sp_api_json_body(s, r, h_chat, p);
    if (b == NULL) {
        return;
    }
    sp_api_chat_run(s, r, p, h_chat, b, &sp_openai_chat_dialect, false, 0);
    json_decref(b);
}

static void
h_embeddings(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = NULL;
    oai_req_t *q = oai_begin(s, r, p, h_embeddings, OAI_EMBED, &b);
    if (q == NULL) {
        goto done;
    }
    sp_served_model_t *m = q->a.m;
    q->prep.body = json_incref(b);
    const char *fmt = "float";
    sp_json_err_t e = {{0}, NULL};
    if (sp_json_get_str(b, "encoding_format", &fmt, NULL, &e) < 0 ||
        (strcmp(fmt, "float") != 0 && strcmp(fmt, "base64") != 0)) {
        sp_api_error(r, 400, NULL, "encoding_format", NULL, "'encoding_format' must be \"float\" or \"base64\"");
        sp_api_finish(&q->a);
        goto done;
    }
    q->base64 = strcmp(fmt, "base64") == 0;
    int64_t dims;
    q->n_embd = (int)sp_model_hparams(m->model)->n_embd;
    int rc = sp_json_get_int(b, "dimensions", 1, 1 << 20, &dims, &e);
    if (rc < 0 || (rc > 0 && dims != q->n_embd)) {
        sp_api_error(r, 400, NULL, "dimensions", NULL, "this model's embeddings have %d dimensions", q->n_embd);
        sp_api_finish(&q->a);
        goto done;
    }
    if (cache_lookup(q, b, NULL)) {
        sp_api_finish(&q->a);
        goto done;
    }
    /* input: "text", ["a", "b"], [ids], [[ids], [ids]] */
    const json_t *in = json_object_get(b, "input");
    json_t *wrap = NULL;
    if (json_is_string(in) || (json_is_array(in) && json_array_size(in) > 0 &&
                               json_is_integer(json_array_get(in, 0)))) {
        wrap = json_array();
        json_array_append(wrap, (json_t *)in);
        in = wrap;
    }
    size_t n = json_is_array(in) ? json_array_size(in) : 0;
    if (n == 0 || n > (size_t)s->cfg.max_embed_inputs) {
        sp_api_error(r, 400, NULL, "input", NULL,
                     "'input' must be a non-empty string or list (at most %d inputs)",
                     s->cfg.max_embed_inputs);
        json_decref(wrap);
        sp_api_finish(&q->a);
        goto done;
    }
    if (n > SP_SCHED_MAX_N) {
        sp_api_error(r, 400, NULL, "input", NULL, "at most %d inputs per request", SP_SCHED_MAX_N);
        json_decref(wrap);
        sp_api_finish(&q->a);
        goto done;
    }
    q->emb = sp_calloc(n * (size_t)q->n_embd, sizeof(float));
    if (q->emb == NULL || !prep_alloc(q, (int)n)) {
        if (q->emb == NULL) {
            sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        }
        json_decref(wrap);
        sp_api_finish(&q->a);
        goto done;
    }
    q->n = (int)n;
    oai_prep_t *pp = &q->prep;
    pp->add_bos = sp_chat_add_bos(m->tok, NULL, 0);
    pp->special = false;
    pp->tok_param = "input";
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(in, i);
        tok_in_t *t = &pp->in[i];
        if (json_is_string(x) && json_string_length(x) > 0) {
            t->text = json_string_value(x); /* tokenized by the preparation */
            t->len = json_string_length(x);
            rc = 0;
        } else if (json_is_array(x) && json_array_size(x) > 0) {
            rc = parse_id_array(q, x, "input", t->dst, pp->cap, &t->n);
        } else {
            sp_api_error(r, 400, NULL, "input", NULL, "input %zu must be a non-empty string or list of token ids", i);
            rc = -1;
        }
        if (rc != 0) {
            json_decref(wrap);
            sp_api_finish(&q->a);
            goto done;
        }
    }
    /* The strings stay alive after wrap goes: wrap only held a reference to
     * the body's own `input`. */
    json_decref(wrap);
    prep_start(q);
done:
    json_decref(b);
}

/*
 * POST /v1/rerank (also /rerank, /v1/reranking, as llama-server): a
 * cross-encoder scores each (query, document) pair, one job sequence per
 * document. Body: {model, query, documents: [str | {text}] (TEI's `texts`
 * too), top_n, return_documents (TEI's return_text)}.
 */
static void
h_rerank(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *b = NULL;
    oai_req_t *q = oai_begin(s, r, p, h_rerank, OAI_RERANK, &b);
    if (q == NULL) {
        goto done;
    }
    sp_served_model_t *m = q->a.m;
    q->prep.body = json_incref(b);
    q->n_embd = (int)sp_model_hparams(m->model)->n_embd;
    const json_t *query = json_object_get(b, "query");
    const json_t *docs = json_object_get(b, "documents");
    if (docs == NULL) {
        docs = json_object_get(b, "texts");
    }
    size_t n = json_is_array(docs) ? json_array_size(docs) : 0;
    sp_json_err_t e = {{0}, NULL};
    int64_t top_n = (int64_t)n;
    bool ret = false;
    const char *bad = NULL, *param = NULL;
    if (!json_is_string(query) || json_string_length(query) == 0) {
        bad = "'query' must be a non-empty string";
        param = "query";
    } else if (n == 0 || n > (size_t)s->cfg.max_embed_inputs || n > SP_SCHED_MAX_N) {
        bad = "'documents' must be a non-empty list of at most %d documents";
        param = "documents";
    } else if (sp_json_get_int(b, "top_n", 0, INT32_MAX, &top_n, &e) < 0) {
        bad = "'top_n' must be an integer >= 0";
        param = "top_n";
    } else if (sp_json_get_bool(b, "return_documents", &ret, &e) < 0 ||
               (!ret && sp_json_get_bool(b, "return_text", &ret, &e) < 0)) {
        bad = "'return_documents' must be a boolean";
        param = "return_documents";
    }
    if (bad != NULL) {
        int most = s->cfg.max_embed_inputs < SP_SCHED_MAX_N ? s->cfg.max_embed_inputs : SP_SCHED_MAX_N;
        sp_api_error(r, 400, NULL, param, NULL, bad, most);
        sp_api_finish(&q->a);
        goto done;
    }
    q->top_n = top_n < (int64_t)n ? (int)top_n : (int)n;
    q->return_documents = ret;
    if (cache_lookup(q, b, NULL)) {
        sp_api_finish(&q->a);
        goto done;
    }
    q->emb = sp_calloc(n * (size_t)q->n_embd, sizeof(float));
    if (q->emb == NULL || !prep_alloc(q, (int)n)) {
        if (q->emb == NULL) {
            sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        }
        sp_api_finish(&q->a);
        goto done;
    }
    q->n = (int)n;
    oai_prep_t *pp = &q->prep;
    pp->add_bos = true; /* the query opens with the model's [CLS] and ends with [SEP] */
    pp->special = false;
    pp->tok_param = "query";
    for (size_t i = 0; i < n; i++) {
        const json_t *d = json_array_get(docs, i);
        const json_t *tx = json_is_object(d) ? json_object_get(d, "text") : d;
        if (!json_is_string(tx)) {
            sp_api_error(r, 400, NULL, "documents", NULL,
                         "document %zu must be a string or an object with a string 'text'", i);
            sp_api_finish(&q->a);
            goto done;
        }
        tok_in_t *t = &pp->in[i];
        t->text = json_string_value(query);
        t->len = json_string_length(query);
        t->text2 = json_string_value(tx);
        t->len2 = json_string_length(tx);
    }
    prep_start(q);
done:
    json_decref(b);
}

void
sp_openai_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_GET, "/v1/models", h_models, s);
    sp_router_add(rt, SP_HTTP_GET, "/v1/models/{model}", h_models, s);
    sp_router_add(rt, SP_HTTP_POST, "/v1/completions", h_completions, s);
    sp_router_add(rt, SP_HTTP_POST, "/infill", h_infill, s);
    sp_router_add(rt, SP_HTTP_POST, "/v1/chat/completions", h_chat, s);
    sp_router_add(rt, SP_HTTP_POST, "/v1/embeddings", h_embeddings, s);
    sp_router_add(rt, SP_HTTP_POST, "/v1/rerank", h_rerank, s);
    sp_router_add(rt, SP_HTTP_POST, "/v1/reranking", h_rerank, s);
    sp_router_add(rt, SP_HTTP_POST, "/rerank", h_rerank, s);
}
