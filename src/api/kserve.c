/*
 * kserve.c - KServe v2 / Open Inference Protocol routes and Triton's generate
 * extension for the served LLMs.
 *
 *   GET  /v2                                   server metadata
 *   GET  /v2/models/{m}[/versions/{v}]         model metadata
 *   GET  /v2/models/{m}[/versions/{v}]/ready   model readiness (200 / 400)
 *   POST /v2/models/{m}[/versions/{v}]/infer   tensors in, tensors out (tensor.h)
 *   POST .../generate, .../generate_stream     {"text_input": ...} -> text, or SSE
 *
 * (/v2/health/live and /v2/health/ready live in serve.c with the other health
 * routes, because they answer without a key and while draining.)
 *
 * An LLM is described as Triton's LLM backends describe theirs: the input
 * text_input (BYTES, one prompt per element, so a [B] tensor is a batch of B
 * sequences), optional one-element inputs for the sampling settings
 * (max_tokens INT32, temperature FP32, ...) and the outputs text_output and
 * finish_reason (BYTES, one per prompt). The same settings may come as
 * request parameters; an input wins over a parameter of the same name.
 * Requests are validated here and in tensor.c on the loop thread. What costs
 * time in proportion to the request - decoding a body over 64 KiB, checking
 * and tokenizing the prompts - runs on a preparation worker through
 * offload.h as in openai.c, whose result comes back to the loop; then the
 * request lifecycle (request.h) admits and submits it, counts its events and
 * accounts it, as for every protocol; a disconnect (while preparing, or
 * after) cancels the job. A tensor model's infer is tensor_infer.c.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "core/utf8.h"
#include "chat/chat.h"
#include "engine/encoder.h"
#include "text/tokenizer.h"
#include "sampan/log.h"
#include "sampan/version.h"
#include "serving/adapters.h"
#include "api/kserve.h"
#include "api/model_config.h"
#include "api/offload.h"
#include "api/rcache.h"
#include "api/request.h"
#include "sched/schedreq.h"
#include "api/tensor.h"
#include "api/tensor_infer.h"
#include "api/trace.h"


/* ------------------------------------------------------------ errors */

/* A refusal to queue work on a preparation worker (offload.h). */
static void
ks_refuse(sp_http_req_t *r, int status, const char *message)
{
    sp_api_error_kserve(r, status, "%s", message);
}

/* A client-supplied string, quoted and escaped for a message (at most 64 bytes). */
typedef struct quoted {
    char s[160];
} quoted_t;

static quoted_t
quote(sp_str_t v)
{
    quoted_t q;
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_str(&b, v.ptr ? v.ptr : "", v.len > 64 ? 64 : v.len);
    snprintf(q.s, sizeof q.s, "%s%s", b.p && !b.oom ? b.p : "\"\"", v.len > 64 ? "..." : "");
    sp_jbuf_free(&b);
    return q;
}

/* ------------------------------------------------------------ the LLM's tensors */

typedef enum pkind { PK_INT, PK_NUM, PK_BOOL, PK_STRS } pkind_t;

/* Settings an LLM takes as one-element inputs or as parameters. */
static const struct gparam {
    const char *name;
    sp_dtype_t dtype;
    pkind_t kind;
    double lo, hi; /* PK_INT and PK_NUM; max_tokens' hi is --max-tokens */
} gparams[] = {
    {"max_tokens", SP_DT_INT32, PK_INT, 1, 0},
    {"temperature", SP_DT_FP32, PK_NUM, 0, 2},
    {"top_p", SP_DT_FP32, PK_NUM, 0, 1},
    {"top_k", SP_DT_INT32, PK_INT, -1, 1 << 20},
    {"min_p", SP_DT_FP32, PK_NUM, 0, 1},
    {"repetition_penalty", SP_DT_FP32, PK_NUM, 0.01, 10},
    {"presence_penalty", SP_DT_FP32, PK_NUM, -2, 2},
    {"frequency_penalty", SP_DT_FP32, PK_NUM, -2, 2},
    {"seed", SP_DT_UINT64, PK_INT, 0, 0}, /* any 64-bit value */
    {"stop", SP_DT_BYTES, PK_STRS, 0, 0},
    {"ignore_eos", SP_DT_BOOL, PK_BOOL, 0, 0},
};
enum { N_GPARAMS = sizeof gparams / sizeof gparams[0], P_MAX_TOKENS = 0, P_SEED = 8, P_STOP = 9 };

static const char *const out_names[] = {"text_output", "finish_reason"};
enum { OUT_TEXT, OUT_FINISH, N_OUTS };

typedef struct gvals {
    bool set[N_GPARAMS];
    int64_t i[N_GPARAMS];
    double d[N_GPARAMS];
    bool b[N_GPARAMS];
    const char *stop[SP_GEN_MAX_STOP]; /* NUL-terminated, borrowed from the request */
    int n_stop;
} gvals_t;

static int
gparam_find(const char *name, size_t len)
{
    for (int k = 0; k < N_GPARAMS; k++) {
        if (strlen(gparams[k].name) == len && memcmp(gparams[k].name, name, len) == 0) {
            return k;
        }
    }
    return -1;
}

static void
input_list(char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "text_input");
    for (int k = 0; k < N_GPARAMS && o < cap; k++) {
        o += (size_t)snprintf(buf + o, cap - o, ", %s", gparams[k].name);
    }
}

/* One setting from JSON (`where` names it in errors). 0 ok, -1 err filled. */
static int
gval_json(const struct gparam *p, int k, const json_t *v, const char *where, int64_t max_tokens,
          gvals_t *g, char *err, size_t err_len)
{
    switch (p->kind) {
    case PK_INT: {
        int64_t lo = (int64_t)p->lo, hi = k == P_MAX_TOKENS ? max_tokens : (int64_t)p->hi;
        bool any = k == P_SEED;
        if (!json_is_integer(v) || (!any && (json_integer_value(v) < lo || json_integer_value(v) > hi))) {
            if (any) {
                sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be an integer", where);
            } else {
                sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be an integer in %lld..%lld", where,
                        (long long)lo, (long long)hi);
            }
            return -1;
        }
        g->i[k] = json_integer_value(v);
        break;
    }
    case PK_NUM:
        if (!json_is_number(v) || json_number_value(v) < p->lo || json_number_value(v) > p->hi) {
            sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be a number in %g..%g", where, p->lo, p->hi);
            return -1;
        }
        g->d[k] = json_number_value(v);
        break;
    case PK_BOOL:
        if (!json_is_boolean(v)) {
            sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be true or false", where);
            return -1;
        }
        g->b[k] = json_is_true(v);
        break;
    case PK_STRS: {
        g->n_stop = 0;
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        if ((!json_is_string(v) && !json_is_array(v)) || n > SP_GEN_MAX_STOP) {
            sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be a string or a list of at most %d strings",
                    where, SP_GEN_MAX_STOP);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_string(s) || json_string_length(s) == 0 ||
                json_string_length(s) > SP_GEN_MAX_STOP_LEN) {
                sp_errf(err, err_len, SP_ERR_INVALID, "%s: stop strings must have 1 to %d bytes",
                        where, SP_GEN_MAX_STOP_LEN);
                return -1;
            }
            g->stop[g->n_stop++] = json_string_value(s);
        }
        break;
    }
    }
    g->set[k] = true;
    return 0;
}

/* Settings from an object's keys: the request's "parameters" (unknown keys
 * are ignored there: parameters are an open set) or generate's top level
 * (unknown keys are refused: they are inputs the model does not have). */
static int
gvals_from_object(const json_t *obj, const char *prefix, bool strict, int64_t max_tokens, gvals_t *g,
                  char *err, size_t err_len)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int k = gparam_find(key, strlen(key));
        if (k < 0) {
            if (strict && strcmp(key, "text_input") != 0 && strcmp(key, "parameters") != 0 &&
                strcmp(key, "id") != 0 && strcmp(key, "priority") != 0 &&
                strcmp(key, "timeout") != 0) {
                char list[512];
                input_list(list, sizeof list);
                sp_errf(err, err_len, SP_ERR_INVALID, "%s: the model has no such input (inputs: %s)",
                        quote(sp_str_c(key)).s, list);
                return -1;
            }
            continue;
        }
        if (json_is_null(v)) {
            continue;
        }
        char where[96];
        snprintf(where, sizeof where, "%s%s", prefix, key);
        if (gval_json(&gparams[k], k, v, where, max_tokens, g, err, err_len) != 0) {
            return -1;
        }
    }
    return 0;
}

/* Settings from one-element input tensors (infer). */
static int
gvals_from_inputs(const sp_tensor_req_t *ir, int64_t max_tokens, gvals_t *g, char *err, size_t err_len)
{
    for (int i = 0; i < ir->n_inputs; i++) {
        const sp_tensor_t *t = &ir->inputs[i];
        char where[320];
        snprintf(where, sizeof where, "inputs[%d] ('%.64s')", i, t->name);
        if (strcmp(t->name, "text_input") == 0) {
            continue;
        }
        int k = gparam_find(t->name, strlen(t->name));
        if (k < 0) {
            char list[512];
            input_list(list, sizeof list);
            sp_errf(err, err_len, SP_ERR_INVALID, "%s.name: the model has no input %s (inputs: %s)",
                    where, quote(sp_str_c(t->name)).s, list);
            return -1;
        }
        const struct gparam *p = &gparams[k];
        if (t->dtype != p->dtype) {
            sp_errf(err, err_len, SP_ERR_INVALID, "%s.datatype: must be %s, got %s", where,
                    sp_tensor_dtype_name(p->dtype), sp_tensor_dtype_name(t->dtype));
            return -1;
        }
        if (p->kind == PK_STRS) {
            if (t->n > SP_GEN_MAX_STOP) {
                sp_errf(err, err_len, SP_ERR_INVALID, "%s.shape: at most %d stop strings", where,
                        SP_GEN_MAX_STOP);
                return -1;
            }
            g->n_stop = 0;
            for (int64_t e = 0; e < t->n; e++) {
                sp_str_t s = sp_tensor_str(t, e);
                if (s.len == 0 || s.len > SP_GEN_MAX_STOP_LEN || memchr(s.ptr, '\0', s.len)) {
                    sp_errf(err, err_len, SP_ERR_INVALID,
                            "%s.data[%lld]: stop strings must have 1 to %d bytes and no NUL", where,
                            (long long)e, SP_GEN_MAX_STOP_LEN);
                    return -1;
                }
                g->stop[g->n_stop++] = s.ptr; /* NUL-terminated in the tensor's store */
            }
            g->set[k] = true;
            continue;
        }
        if (t->n != 1) {
            sp_errf(err, err_len, SP_ERR_INVALID, "%s.shape: must hold exactly one element, has %lld",
                    where, (long long)t->n);
            return -1;
        }
        if (p->kind == PK_BOOL) {
            g->b[k] = sp_tensor_i64(t, 0) != 0;
        } else if (p->kind == PK_NUM) {
            double d = sp_tensor_f64(t, 0);
            if (!(d >= p->lo && d <= p->hi)) { /* NaN from binary data fails too */
                sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be a number in %g..%g", where, p->lo, p->hi);
                return -1;
            }
            g->d[k] = d;
        } else if (k == P_SEED) {
            g->i[k] = (int64_t)*(const uint64_t *)t->data;
        } else {
            int64_t v = sp_tensor_i64(t, 0);
            int64_t hi = k == P_MAX_TOKENS ? max_tokens : (int64_t)p->hi;
            if (v < (int64_t)p->lo || v > hi) {
                sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be an integer in %lld..%lld", where,
                        (long long)p->lo, (long long)hi);
                return -1;
            }
            g->i[k] = v;
        }
        g->set[k] = true;
    }
    return 0;
}

/* ------------------------------------------------------------ requests */

typedef enum ks_kind { KS_INFER, KS_GENERATE, KS_STREAM } ks_kind_t;

typedef struct ks_req {
    sp_api_req_t a;         /* the lifecycle (request.h): model, adapter, job, clock, cache key */
    ks_kind_t kind;
    int n;                  /* sequences */
    sp_jbuf_t *texts;       /* non-streaming: each sequence's text */
    sp_finish_t *finish;
    int64_t n_prompt;       /* all prompts' tokens */
    sp_tensor_req_t ir;      /* infer: the decoded request (id, outputs, text_input's shape) */
    char *id;               /* generate: the request's id, or NULL */
    sp_jbuf_t out, bin;
    /* Preparation (prep_run, on a worker): tokenizing the prompts. */
    json_t *root;           /* generate: the body, which holds the prompt and the stop strings */
    sp_str_t one;           /* generate: the prompt (in root) */
    const sp_str_t *prompts; /* n texts, in root or ir (both owned by the request) */
    char where[80];         /* the prompts' field, for messages */
    gvals_t gv;             /* the settings, applied on the loop after */
    int32_t *toks;          /* n x n_ctx token ids */
    int64_t lens[SP_SCHED_MAX_N], longest;
    int tried;              /* prompts that reached the tokenizer */
    char err[640];          /* the worker's 400 message, or "" */
    /* infer on an encoder: one vector per prompt, the output "embedding" */
    bool embed;
    bool emb_fault;         /* a vector held NaN or inf */
    int n_embd;
    float *emb;             /* n x n_embd */
} ks_req_t;

/* An encoder's infer output: FP32 [prompts..., n_embd]. */
static const char *const emb_names[] = {"embedding"};

/* The lifecycle's last call (ops->free): what the protocol owns, and q. */
static void
ks_free(sp_api_req_t *a)
{
    ks_req_t *q = (ks_req_t *)a;
    for (int i = 0; q->texts && i < q->n; i++) {
        sp_jbuf_free(&q->texts[i]);
    }
    sp_free(q->texts);
    sp_free(q->finish);
    sp_free(q->id);
    sp_tensor_req_free(&q->ir);
    sp_jbuf_free(&q->out);
    sp_jbuf_free(&q->bin);
    sp_free(q->toks);
    sp_free(q->emb);
    json_decref(q->root);
    sp_free(q);
}

/* The client left while its prompts were tokenized (offload.h). */
static void
prep_drop(sp_offload_t *job)
{
    sp_api_finish(&SP_OFFLOAD_HOLDER(job, ks_req_t, a.off)->a);
}

static const char *
finish_str(sp_finish_t f)
{
    return f == SP_FINISH_LENGTH ? "length" : "stop";
}

/* The model of the route ({model} and the optional {version}), with a
 * reference. Answers itself and returns NULL when there is none; with a
 * retry, a model that loads on demand parks the request until it is
 * loaded (sp_api_model_for, api.h). */
static sp_served_model_t *
route_model_base(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p, sp_route_fn retry)
{
    sp_str_t name = sp_router_param(p, "model");
    sp_str_t v = sp_router_param(p, "version");
    sp_served_model_t *m = NULL;
    if (retry) {
        return sp_api_model_for(s, r, name.ptr, name.len, v, retry, p, &m) ? m : NULL;
    }
    if (!sp_auth_model_allowed(sp_http_req_user(r), name.ptr, name.len)) {
        /* A model outside the tenant's list does not exist for it: the same
         * 404 as an unknown name, so its metadata does not reveal it either. */
        sp_auth_reject(sp_http_req_user(r), SP_LIMIT_MODEL);
        sp_api_error_kserve(r, 404, "model %s is not served", quote(name).s);
        return NULL;
    }
    char reason[512];
    sp_acq_t a = sp_registry_acquire(s, name.ptr, name.len, v.ptr, v.len, false, &m, reason,
                                     sizeof reason);
    if (a == SP_ACQ_OK) {
        return m;
    }
    if (a == SP_ACQ_UNKNOWN) {
        if (v.ptr) {
            sp_api_error_kserve(r, 404, "model %s has no version %s", quote(name).s, quote(v).s);
        } else {
            sp_api_error_kserve(r, 404, "model %s is not served", quote(name).s);
        }
    } else if (a == SP_ACQ_LOADING) {
        sp_http_add_header(r, "Retry-After", "1");
        sp_api_error_kserve(r, 400, "model %s is loading", quote(name).s);
    } else {
        char red[512];
        sp_api_redact(s, reason, red, sizeof red);
        sp_api_error_kserve(r, 400, "model %s is not available: %s", quote(name).s, red);
    }
    return NULL;
}

/* The same, and the LoRA adapter a "<model>:<adapter>" name selects (ad,
 * released with sp_req_adapter_release; 404 answered here when unknown). */
static sp_served_model_t *
route_model(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p, sp_route_fn retry,
            sp_req_adapter_t *ad)
{
    sp_served_model_t *m = route_model_base(s, r, p, retry);
    sp_str_t name = sp_router_param(p, "model");
    memset(ad, 0, sizeof *ad);
    if (m != NULL && !sp_adapter_for(s, r, m, name.ptr, name.len, ad)) {
        sp_served_release(m);
        return NULL;
    }
    return m;
}

static const sp_api_ops_t ks_ops;

static ks_req_t *
ks_new(sp_serving_t *s, sp_http_req_t *r, sp_served_model_t *m, ks_kind_t kind)
{
    ks_req_t *q = sp_calloc(1, sizeof *q);
    if (q == NULL) {
        sp_served_release(m);
        sp_api_error_kserve(r, 503, "out of memory");
        return NULL;
    }
    sp_api_begin(&q->a, &ks_ops, s, r, m, NULL); /* the caller hands over the adapter */
    q->kind = kind;
    return q;
}

static void
begin_event(ks_req_t *q, sp_jbuf_t *b)
{
    sp_jbuf_lit(b, "{\"model_name\":");
    sp_req_adapter_model_name(q->a.m, &q->a.ad, b);
    sp_jbuf_lit(b, ",\"model_version\":");
    sp_jbuf_cstr(b, q->a.m->version_str);
    if (q->id) {
        sp_jbuf_lit(b, ",\"id\":");
        sp_jbuf_cstr(b, q->id);
    }
}

static int
stream_send(ks_req_t *q)
{
    if (q->out.oom || sp_http_stream_write(q->a.http, q->out.p, q->out.len) != 0) {
        return -1;
    }
    return 0;
}

/* The written infer response (q->out, with q->bin's binary tensors when
 * asked): 200, or 500 when writing it ran out of memory. */
static void
send_infer_body(ks_req_t *q)
{
    char hl[32];
    if (q->out.oom || q->bin.oom || !sp_tensor_infer_body(&q->out, &q->bin, hl)) {
        sp_api_error_kserve(q->a.http, 500, "out of memory while writing the response");
        return;
    }
    if (hl[0]) {
        sp_http_add_header(q->a.http, "Inference-Header-Content-Length", hl);
    }
    sp_http_respond(q->a.http, 200, hl[0] ? "application/octet-stream" : "application/json",
                    q->out.p, q->out.len);
}

/* An encoder's answer: the tensor "embedding", FP32 of text_input's shape
 * plus a last dimension of n_embd. */
static void
reply_embed(ks_req_t *q)
{
    const sp_tensor_t *in = sp_tensor_req_input(&q->ir, "text_input");
    int64_t shape[SP_TENSOR_MAX_DIMS];
    char err[256];
    sp_tensor_t out;
    int nd = in->ndim < SP_TENSOR_MAX_DIMS ? in->ndim : SP_TENSOR_MAX_DIMS - 1; /* checked at infer */
    memcpy(shape, in->shape, (size_t)nd * sizeof shape[0]);
    shape[nd] = q->n_embd;
    if (sp_tensor_alloc(&out, emb_names[0], SP_DT_FP32, nd + 1, shape, err, sizeof err) != SP_OK) {
        sp_api_error_kserve(q->a.http, 500, "out of memory while writing the response");
        return;
    }
    memcpy(out.data, q->emb, (size_t)q->n * (size_t)q->n_embd * sizeof(float));
    char params[64];
    snprintf(params, sizeof params, "{\"prompt_tokens\":%lld}", (long long)q->n_prompt);
    sp_jbuf_reset(&q->out);
    sp_jbuf_reset(&q->bin);
    sp_tensor_resp_write(&q->out, &q->bin, q->a.m->name, q->a.m->version_str, &q->ir, params, &out, 1);
    sp_tensor_free(&out);
    send_infer_body(q);
}

static void
reply_infer(ks_req_t *q, int64_t completion_tokens)
{
    bool want[N_OUTS];
    char err[256];
    sp_tensor_req_select_outputs(&q->ir, out_names, N_OUTS, want, err, sizeof err); /* checked at submit */
    const sp_tensor_t *in = sp_tensor_req_input(&q->ir, "text_input");
    sp_tensor_t outs[N_OUTS];
    int n_outs = 0;
    sp_str_t *el = sp_calloc((size_t)q->n, sizeof *el);
    sp_status_t st = el ? SP_OK : SP_ERR_NOMEM;
    for (int k = 0; k < N_OUTS && st == SP_OK; k++) {
        if (!want[k]) {
            continue;
        }
        for (int i = 0; i < q->n; i++) {
            if (k == OUT_TEXT) {
                el[i].ptr = q->texts[i].p ? q->texts[i].p : "";
                el[i].len = q->texts[i].len;
            } else {
                el[i] = sp_str_c(finish_str(q->finish[i]));
            }
        }
        st = sp_tensor_from_strs(&outs[n_outs], out_names[k], in->ndim, in->shape, el, err, sizeof err);
        if (st == SP_OK) {
            n_outs++;
        }
    }
    sp_free(el);
    if (st != SP_OK || q->texts == NULL) {
        for (int k = 0; k < n_outs; k++) {
            sp_tensor_free(&outs[k]);
        }
        sp_api_error_kserve(q->a.http, 500, "out of memory while writing the response");
        return;
    }
    char params[96];
    snprintf(params, sizeof params, "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld}",
             (long long)q->n_prompt, (long long)completion_tokens);
    sp_jbuf_reset(&q->out);
    sp_jbuf_reset(&q->bin);
    char mname[sizeof q->a.m->name + SP_ADAPTER_NAME_MAX + 2];
    snprintf(mname, sizeof mname, "%s%s%s", q->a.m->name, q->a.ad.lora ? ":" : "", q->a.ad.name);
    sp_tensor_resp_write(&q->out, &q->bin, mname, q->a.m->version_str, &q->ir, params, outs,
                         n_outs);
    for (int k = 0; k < n_outs; k++) {
        sp_tensor_free(&outs[k]);
    }
    send_infer_body(q);
}

static void
reply_generate(ks_req_t *q, int64_t completion_tokens)
{
    sp_jbuf_t *b = &q->out;
    sp_jbuf_reset(b);
    begin_event(q, b);
    sp_jbuf_lit(b, ",\"text_output\":");
    sp_jbuf_str(b, q->texts[0].p ? q->texts[0].p : "", q->texts[0].len);
    sp_jbuf_printf(b, ",\"finish_reason\":\"%s\",\"usage\":{\"prompt_tokens\":%lld,"
                   "\"completion_tokens\":%lld}}",
                   finish_str(q->finish[0]), (long long)q->n_prompt, (long long)completion_tokens);
    if (b->oom) {
        sp_api_error_kserve(q->a.http, 500, "out of memory while writing the response");
        return;
    }
    sp_rcache_store(q->a.m, q->a.ck, "application/json", NULL, NULL, b->p, b->len, q->finish[0]);
    sp_http_respond(q->a.http, 200, "application/json", b->p, b->len);
}

/* A job's TOKEN and FINISH events (the lifecycle counted them). */
static int
ks_event(sp_api_req_t *a, const sp_sched_event_t *ev)
{
    ks_req_t *q = (ks_req_t *)a;
    if (ev->kind == SP_SCHED_EV_EMBEDDING) {
        if (q->emb != NULL && ev->n_embd == q->n_embd && ev->index >= 0 && ev->index < q->n) {
            memcpy(q->emb + (size_t)ev->index * (size_t)q->n_embd, ev->embedding,
                   (size_t)q->n_embd * sizeof(float));
            for (int k = 0; k < q->n_embd; k++) {
                q->emb_fault |= !isfinite(ev->embedding[k]);
            }
        }
        return 0;
    }
    if (ev->kind == SP_SCHED_EV_FINISH) {
        if (ev->index >= 0 && ev->index < q->n) {
            q->finish[ev->index] = ev->finish;
        }
        return 0;
    }
    if (ev->kind != SP_SCHED_EV_TOKEN || ev->index < 0 || ev->index >= q->n || ev->text_len == 0) {
        return 0;
    }
    if (q->kind != KS_STREAM) {
        sp_jbuf_raw(&q->texts[ev->index], ev->text, ev->text_len);
        return 0;
    }
    sp_jbuf_reset(&q->out);
    sp_jbuf_lit(&q->out, "data: ");
    begin_event(q, &q->out);
    sp_jbuf_lit(&q->out, ",\"text_output\":");
    sp_jbuf_str(&q->out, ev->text, ev->text_len);
    sp_jbuf_lit(&q->out, "}\n\n");
    return stream_send(q);
}

/* A vector that held NaN or inf is the model's fault, whatever the job said. */
static sp_status_t
ks_outcome(sp_api_req_t *a, sp_status_t st, const char **message)
{
    ks_req_t *q = (ks_req_t *)a;
    if (st == SP_OK && q->emb_fault) {
        *message = "the model produced NaN or infinite embeddings";
        return SP_ERR_MODEL_FAULT;
    }
    return st;
}

/* The job ended (accounted already): the answer, or its error. */
static void
ks_done(sp_api_req_t *a, const sp_sched_event_t *ev, sp_status_t st, const char *msg)
{
    ks_req_t *q = (ks_req_t *)a;
    sp_http_req_t *r = a->http;
    if (st != SP_OK) {
        if (q->kind == KS_STREAM) {
            /* The status line is gone: the error is the stream's last event. */
            sp_jbuf_reset(&q->out);
            sp_jbuf_lit(&q->out, "data: {\"error\":");
            sp_jbuf_cstr(&q->out, msg);
            sp_jbuf_lit(&q->out, "}\n\n");
            stream_send(q);
            sp_http_stream_end(r);
        } else {
            sp_api_error_kserve(r, sp_status_http(sp_api_server_status(st)), "%s", msg);
        }
    } else if (q->kind == KS_STREAM) {
        sp_jbuf_reset(&q->out);
        sp_jbuf_lit(&q->out, "data: ");
        begin_event(q, &q->out);
        sp_jbuf_printf(&q->out, ",\"text_output\":\"\",\"finish_reason\":\"%s\",\"usage\":"
                       "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld}}\n\n",
                       finish_str(q->finish[0]), (long long)q->n_prompt,
                       (long long)ev->completion_tokens);
        stream_send(q);
        sp_http_stream_end(r);
    } else if (q->kind == KS_GENERATE) {
        reply_generate(q, ev->completion_tokens);
    } else if (q->embed) {
        reply_embed(q);
    } else {
        reply_infer(q, ev->completion_tokens);
    }
}

/* A refusal before the job ran, in KServe's error shape (Retry-After is set). */
static void
ks_admit_refuse(sp_api_req_t *a, sp_api_refusal_t why, sp_status_t st, const char *msg)
{
    sp_api_error_kserve(a->http, sp_status_http(st), "%s", msg);
}

static const sp_api_ops_t ks_ops = {
    .refuse = ks_admit_refuse,
    .event = ks_event,
    .outcome = ks_outcome,
    .done = ks_done,
    .free = ks_free,
};

/* Worker: check and tokenize the prompts. Reads only the request's prompts
 * and its model (which it holds); writes only toks, lens, longest,
 * n_prompt, tried and err. */
static void
prep_run(sp_offload_t *job)
{
    ks_req_t *q = SP_OFFLOAD_HOLDER(job, ks_req_t, a.off);
    int64_t cap = q->a.m->n_ctx;
    for (int i = 0; i < q->n; i++) {
        sp_str_t t = q->prompts[i];
        char where[300];
        if (q->kind == KS_INFER) {
            snprintf(where, sizeof where, "%s.data[%d]", q->where, i);
        } else {
            snprintf(where, sizeof where, "%s", q->where);
        }
        if (t.len == 0) {
            snprintf(q->err, sizeof q->err, "%s: the prompt is empty", where);
            return;
        }
        /* A BYTES prompt is text: the tokenizer and the streamed answers assume UTF-8. */
        size_t bad = sp_utf8_invalid_at(t.ptr, t.len);
        if (bad < t.len) {
            snprintf(q->err, sizeof q->err, "%s: the prompt is not valid UTF-8 (at byte %zu)", where, bad);
            return;
        }
        /* No vocabulary spends 64 bytes per token on average: longer text
         * cannot fit and is refused before the tokenizer spends time on it. */
        if (t.len / 64 > (size_t)cap) {
            snprintf(q->err, sizeof q->err, "%s: the prompt is too long for the context of %lld tokens",
                     where, (long long)cap);
            return;
        }
        q->tried = i + 1;
        int32_t *tk = q->toks + (size_t)i * (size_t)cap;
        bool bos = sp_chat_add_bos(q->a.m->tok, NULL, 0);
        int64_t nt = sp_tokenizer_encode(q->a.m->tok, t.ptr, t.len, bos, false, tk, cap);
        if (nt < 0) {
            snprintf(q->err, sizeof q->err, "%s: cannot tokenize the prompt: %s", where,
                     sp_status_str((sp_status_t)nt));
            return;
        }
        if (nt == 0 || nt >= cap) {
            snprintf(q->err, sizeof q->err, "%s: the prompt has %lld tokens, the context holds %lld",
                     where, (long long)nt, (long long)cap);
            return;
        }
        q->lens[i] = nt;
        q->longest = nt > q->longest ? nt : q->longest;
        q->n_prompt += nt;
    }
}

static void prep_done(sp_offload_t *job, sp_http_req_t *r);

static const sp_offload_ops_t prep_ops = {
    .stage = "prepare", .work = prep_run, .done = prep_done, .drop = prep_drop, .refuse = ks_refuse,
};

/* Check the number of prompts, then tokenize them on a preparation worker
 * (offload.h) and submit when the result is back (prep_done). texts stay
 * valid while q lives (in q->root or q->ir); gv's strings too. Answers every
 * error itself and frees q on failure. */
static void
submit(ks_req_t *q, const sp_str_t *texts, int n, const gvals_t *gv, const char *text_where)
{
    sp_http_req_t *r = q->a.http;
    const sp_serve_config_t *cfg = &q->a.srv->cfg;
    int64_t cap = q->a.m->n_ctx;
    if (n < 1 || n > cfg->max_n || n > SP_SCHED_MAX_N) {
        sp_api_error_kserve(r, 400, "%s: 1 to %d prompts per request, got %d", text_where,
                            cfg->max_n < SP_SCHED_MAX_N ? cfg->max_n : SP_SCHED_MAX_N, n);
        sp_api_finish(&q->a);
        return;
    }
    q->n = n;
    q->texts = sp_calloc((size_t)n, sizeof *q->texts);
    q->finish = sp_calloc((size_t)n, sizeof *q->finish);
    q->toks = sp_malloc((size_t)n * (size_t)cap * sizeof(int32_t));
    if (q->texts == NULL || q->finish == NULL || q->toks == NULL) {
        sp_api_error_kserve(r, 503, "out of memory");
        sp_api_finish(&q->a);
        return;
    }
    for (int i = 0; i < n; i++) {
        q->finish[i] = SP_FINISH_STOP;
    }
    if (q->embed) {
        q->n_embd = (int)sp_model_hparams(q->a.m->model)->n_embd;
        q->emb = sp_calloc((size_t)n * (size_t)q->n_embd, sizeof(float));
        if (q->emb == NULL) {
            sp_api_error_kserve(r, 503, "out of memory");
            sp_api_finish(&q->a);
            return;
        }
    }
    q->prompts = texts;
    q->gv = *gv;
    snprintf(q->where, sizeof q->where, "%s", text_where);
    if (!sp_offload_start(&q->a.off, &prep_ops, q->a.srv->prep, &q->a.http, q->a.m, &q->a.clk)) {
        sp_api_finish(&q->a);
    }
}

/* Loop thread: the prompts' tokens (or why not). Apply the settings,
 * reserve the tenant's tokens and submit; answers every error itself and
 * frees q on failure. */
static void
prep_done(sp_offload_t *job, sp_http_req_t *r)
{
    ks_req_t *q = SP_OFFLOAD_HOLDER(job, ks_req_t, a.off);
    const gvals_t *gv = &q->gv;
    int64_t cap = q->a.m->n_ctx, longest = q->longest;
    int n = q->n;
    if (q->tried > 0) {
        sp_metrics_clock_text(&q->a.clk, false, q->prompts[0].ptr, q->prompts[0].len);
    }
    if (q->err[0]) {
        sp_api_error_kserve(r, 400, "%s", q->err);
        goto fail;
    }
    const int32_t *prompts[SP_SCHED_MAX_N];
    for (int i = 0; i < n; i++) {
        prompts[i] = q->toks + (size_t)i * (size_t)cap;
    }
    if (q->embed) {
        sp_sched_request_t er;
        memset(&er, 0, sizeof er);
        er.prompts = prompts;
        er.n_prompts = q->lens;
        er.n = n;
        er.embed = true;
        bool ok = sp_api_admit(&q->a, &er, q->n_prompt, q->n_prompt);
        sp_free(q->toks);
        q->toks = NULL;
        if (!ok) {
            goto fail;
        }
        return;
    }
    sp_gen_params_t g = sp_gen_default_params();
    g.sampling.temperature = 1.0f;
    g.sampling.top_k = 0;
    g.sampling.top_p = 1.0f;
    g.sampling.min_p = 0.0f;
    g.sampling.repeat_penalty = 1.0f;
    uint64_t seed = (uint64_t)sp_time_ns() + sp_http_req_id(r) * 0x9E3779B97F4A7C15ull;
    seed ^= seed >> 33;
    seed *= 0xFF51AFD7ED558CCDull;
    g.sampling.seed = seed ^ (seed >> 33);
    sp_served_apply_defaults(q->a.m, &g.sampling); /* the model config's `parameters` */
    int64_t max_tokens = q->a.m->def.max_tokens > 0 ? q->a.m->def.max_tokens : 16;
    for (int k = 0; k < N_GPARAMS; k++) {
        if (!gv->set[k]) {
            continue;
        }
        const char *nm = gparams[k].name;
        float f = (float)gv->d[k];
        if (k == P_MAX_TOKENS) {
            max_tokens = gv->i[k];
            if (longest + max_tokens > cap) {
                sp_api_error_kserve(r, 400, "max_tokens: this model's context is %lld tokens; the prompt "
                                    "has %lld and max_tokens asks for %lld more", (long long)cap,
                                    (long long)longest, (long long)max_tokens);
                goto fail;
            }
        } else if (strcmp(nm, "temperature") == 0) {
            g.sampling.temperature = f;
        } else if (strcmp(nm, "top_p") == 0) {
            if (f <= 0.0f) {
                sp_api_error_kserve(r, 400, "top_p: must be greater than 0");
                goto fail;
            }
            g.sampling.top_p = f;
        } else if (strcmp(nm, "top_k") == 0) {
            g.sampling.top_k = gv->i[k] < 0 ? 0 : (int32_t)gv->i[k];
        } else if (strcmp(nm, "min_p") == 0) {
            g.sampling.min_p = f;
        } else if (strcmp(nm, "repetition_penalty") == 0) {
            g.sampling.repeat_penalty = f;
        } else if (strcmp(nm, "presence_penalty") == 0) {
            g.sampling.presence_penalty = f;
        } else if (strcmp(nm, "frequency_penalty") == 0) {
            g.sampling.frequency_penalty = f;
        } else if (k == P_SEED) {
            g.sampling.seed = (uint64_t)gv->i[k];
        } else if (k == P_STOP) {
            for (int i = 0; i < gv->n_stop; i++) {
                g.stop[i] = gv->stop[i];
            }
            g.n_stop = gv->n_stop;
        } else if (strcmp(nm, "ignore_eos") == 0) {
            g.ignore_eos = gv->b[k];
        }
    }
    if (!gv->set[P_MAX_TOKENS] && max_tokens > cap - longest) {
        max_tokens = cap - longest;
    }
    /* A tenant's minute must hold the whole reservation (below): a default
     * that could never fit stops within the tokens limit. */
    int64_t tpm = sp_auth_tpm(sp_http_req_user(r));
    if (!gv->set[P_MAX_TOKENS] && tpm > 0 && max_tokens > (tpm - q->n_prompt) / n) {
        max_tokens = (tpm - q->n_prompt) / n > 1 ? (tpm - q->n_prompt) / n : 1;
    }
    g.max_tokens = (int32_t)max_tokens;
    sp_sched_request_t sr;
    memset(&sr, 0, sizeof sr);
    sr.prompts = prompts;
    sr.n_prompts = q->lens;
    sr.n = n;
    sr.gen = g;
    /* Its prompts and max_tokens for each sequence. */
    bool admitted = sp_api_admit(&q->a, &sr, q->n_prompt,
                                 q->n_prompt + (int64_t)n * (max_tokens > 0 ? max_tokens : 1));
    sp_free(q->toks); /* the scheduler copied the prompts */
    q->toks = NULL;
    if (!admitted) {
        goto fail;
    }
    if (q->kind == KS_STREAM) {
        sp_http_add_header(r, "Cache-Control", "no-cache");
        sp_http_add_header(r, "X-Accel-Buffering", "no");
        sp_http_stream_start(r, 200, "text/event-stream; charset=utf-8");
    }
    return;
fail:
    sp_api_finish(&q->a);
}

/* The response cache (respcache.h) for generate (not streamed): only
 * deterministic requests, as in openai.c: temperature 0, or a seed (the
 * request's or the model config's). The key is the body with sorted keys,
 * less the scheduling fields; the id stays (the answer echoes it). true:
 * answered from the cache. */
static bool
cache_lookup(ks_req_t *q, const json_t *root, const gvals_t *gv)
{
    static const char *const drop[] = {"priority", "timeout", "parameters.priority",
                                       "parameters.timeout", NULL};
    if (q->kind != KS_GENERATE || !sp_rckey_enabled(q->a.m)) {
        return false;
    }
    int kt = gparam_find("temperature", strlen("temperature"));
    double t = gv->set[kt] ? gv->d[kt] : !isnan(q->a.m->def.temperature) ? q->a.m->def.temperature : 1.0;
    if (!((float)t == 0.0f || gv->set[P_SEED] || q->a.m->def.seed_set)) {
        return false;
    }
    q->a.ck = sp_rckey_new(q->a.m, "kserve/generate");
    sp_rckey_add_json(q->a.ck, root, drop);
    if (q->a.ad.lora != NULL) {
        /* The route's adapter (not in the body), as loaded: see openai.c. */
        sp_rckey_add_u64(q->a.ck, sp_lora_id(q->a.ad.lora));
    }
    return sp_rcache_lookup(q->a.http, q->a.m, q->a.ck, &q->a.clk);
}

/* ------------------------------------------------------------ handlers */

static void
h_server_meta(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    static const char body[] = "{\"name\":\"sampan\",\"version\":\"" SAMPAN_VERSION "\","
                               "\"extensions\":[\"binary_tensor_data\",\"classification\",\"parameters\",\"generate\",\"schedule_policy\",\"statistics\"]}";
    sp_http_respond(r, 200, "application/json", body, sizeof body - 1);
}

static void
tensor_meta(sp_jbuf_t *b, const char *name, sp_dtype_t dt, int dim, bool first)
{
    sp_jbuf_lit(b, first ? "{\"name\":" : ",{\"name\":");
    sp_jbuf_cstr(b, name);
    sp_jbuf_printf(b, ",\"datatype\":\"%s\",\"shape\":[%d]}", sp_tensor_dtype_name(dt), dim);
}

static void
h_model_meta(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_req_adapter_t ad;
    sp_served_model_t *m = route_model(ud, r, p, NULL, &ad);
    if (m == NULL) {
        return;
    }
    if (m->be) {
        sp_req_adapter_release(&ad); /* none: tensor models have no adapters */
        sp_tensor_infer_metadata(r, m);
        sp_served_release(m);
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"name\":");
    sp_req_adapter_model_name(m, &ad, &b);
    sp_req_adapter_release(&ad);
    sp_jbuf_lit(&b, ",\"versions\":[");
    sp_jbuf_cstr(&b, m->version_str);
    sp_jbuf_lit(&b, "],\"platform\":\"sampan_gguf\",\"inputs\":[");
    tensor_meta(&b, "text_input", SP_DT_BYTES, -1, true);
    if (sp_model_is_encoder(m->model)) {
        sp_jbuf_printf(&b, "],\"outputs\":[{\"name\":\"embedding\",\"datatype\":\"FP32\","
                       "\"shape\":[-1,%lld]}]}", (long long)sp_model_hparams(m->model)->n_embd);
        goto write;
    }
    for (int k = 0; k < N_GPARAMS; k++) {
        tensor_meta(&b, gparams[k].name, gparams[k].dtype, gparams[k].kind == PK_STRS ? -1 : 1, false);
    }
    sp_jbuf_lit(&b, "],\"outputs\":[");
    for (int k = 0; k < N_OUTS; k++) {
        tensor_meta(&b, out_names[k], SP_DT_BYTES, -1, k == 0);
    }
    sp_jbuf_lit(&b, "]}");
write:
    if (b.oom) {
        sp_api_error_kserve(r, 500, "out of memory while writing the response");
    } else {
        sp_http_respond(r, 200, "application/json", b.p, b.len);
    }
    sp_jbuf_free(&b);
    sp_served_release(m);
}

static void
h_model_ready(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    /* The protocol: 200 is ready, a 4xx is not ready (404: not known). */
    sp_serving_t *s = ud;
    sp_str_t name = sp_router_param(p, "model");
    sp_str_t v = sp_router_param(p, "version");
    sp_served_model_t *m = NULL;
    char reason[512];
    if (!sp_auth_model_allowed(sp_http_req_user(r), name.ptr, name.len)) {
        sp_auth_reject(sp_http_req_user(r), SP_LIMIT_MODEL);
        sp_api_error_kserve(r, 404, "model %s is not served", quote(name).s); /* as unknown: see route_model_base */
        return;
    }
    sp_acq_t a = sp_registry_acquire(s, name.ptr, name.len, v.ptr, v.len, false, &m, reason,
                                     sizeof reason);
    if (a == SP_ACQ_OK && atomic_load(&m->faulty)) {
        a = SP_ACQ_UNAVAILABLE; /* it produced NaN: not ready until reloaded */
    }
    sp_served_release(m);
    if (a == SP_ACQ_UNKNOWN) {
        sp_api_error_kserve(r, 404, "model %s is not served", quote(name).s);
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"name\":");
    sp_jbuf_str(&b, name.ptr, name.len);
    sp_jbuf_lit(&b, a == SP_ACQ_OK ? ",\"ready\":true}" : ",\"ready\":false}");
    if (b.oom) {
        sp_api_error_kserve(r, 500, "out of memory while writing the response");
    } else {
        sp_http_respond(r, a == SP_ACQ_OK ? 200 : 400, "application/json", b.p, b.len);
    }
    sp_jbuf_free(&b);
}

/*
 * Bodies up to KS_INLINE_BODY are decoded on the loop (well under a
 * millisecond). A larger one is copied and decoded on a preparation worker
 * (JSON, or an infer request with its binary tensors); the handler then runs
 * again on the loop with the result, handed over through sp_offload_body_redo
 * (offload.h).
 */
#define KS_INLINE_BODY (64u * 1024u)

typedef struct ks_body {
    sp_offload_body_t b;
    int json_depth;
    bool infer;          /* sp_tensor_req_parse, else sp_json_parse */
    char *hl;            /* infer: Inference-Header-Content-Length, or NULL */
    size_t hl_len;
    sp_status_t st;
    json_t *root;
    sp_tensor_req_t ir;
    char err[768];
} ks_body_t;

/* The request's body decoded on a worker, when this is the handler's second
 * run; NULL otherwise. */
static ks_body_t *
body_decoded(sp_http_req_t *r)
{
    sp_offload_body_t *b = sp_offload_body_redo(r);
    return b != NULL ? SP_OFFLOAD_HOLDER(b, ks_body_t, b) : NULL;
}

static void
body_free(sp_offload_t *job)
{
    ks_body_t *j = SP_OFFLOAD_HOLDER(job, ks_body_t, b.job);
    json_decref(j->root); /* NULL when the handler took it */
    sp_tensor_req_free(&j->ir);
    sp_offload_body_drop(&j->b);
    sp_free(j->hl);
    sp_free(j);
}

/* Loop thread: run the handler again with the decoded body (or its error). */
static void
body_done(sp_offload_t *job, sp_http_req_t *r)
{
    sp_offload_body_rerun(SP_OFFLOAD_HOLDER(job, sp_offload_body_t, job));
    body_free(job);
}

static void
body_work(sp_offload_t *job)
{
    ks_body_t *j = SP_OFFLOAD_HOLDER(job, ks_body_t, b.job);
    if (j->infer) {
        sp_str_t hl = {j->hl, j->hl_len};
        j->st = sp_tensor_req_parse(j->b.copy, j->b.len, hl, j->json_depth, &j->ir, j->err, sizeof j->err);
    } else {
        j->st = sp_json_parse(j->b.copy, j->b.len, j->json_depth, &j->root, j->err, sizeof j->err);
        if (j->st != SP_OK) {
            j->root = NULL;
        }
    }
    sp_offload_body_drop(&j->b);
}

static const sp_offload_ops_t body_ops = {
    .stage = "parse", .work = body_work, .done = body_done, .drop = body_free, .refuse = ks_refuse,
};

/* A body over KS_INLINE_BODY (and not decoded yet): hand it to a worker,
 * after which `handler` runs again; true then, or when it answered an
 * error. false: decode it here (or take body_decoded). */
static bool
body_defer(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p, sp_route_fn handler, bool infer)
{
    sp_str_t body = sp_http_req_body(r);
    if (body.len <= KS_INLINE_BODY || s->prep == NULL || body_decoded(r) != NULL) {
        return false;
    }
    sp_str_t hl = infer ? sp_http_req_header(r, "inference-header-content-length") : (sp_str_t){NULL, 0};
    ks_body_t *j = sp_calloc(1, sizeof *j);
    char *hcopy = hl.ptr ? sp_strndup(hl.ptr, hl.len) : NULL;
    if (j == NULL || (hl.ptr && hcopy == NULL)) {
        sp_free(j);
        sp_free(hcopy);
        sp_api_error_kserve(r, 503, "out of memory");
        return true;
    }
    j->json_depth = s->cfg.json_depth;
    j->infer = infer;
    j->hl = hcopy;
    j->hl_len = hl.len;
    if (!sp_offload_body_start(&j->b, &body_ops, s->prep, r, handler, p, s)) {
        sp_free(hcopy);
        sp_free(j);
    }
    return true;
}

static void
h_infer(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    sp_req_adapter_t ad;
    sp_served_model_t *m = route_model(s, r, p, h_infer, &ad);
    if (m == NULL) {
        return;
    }
    if (m->be) {
        sp_tensor_infer(s, r, m); /* a tensor model: its backend behind the batcher */
        return;
    }
    if (body_defer(s, r, p, h_infer, true)) {
        sp_req_adapter_release(&ad);
        sp_served_release(m);
        return;
    }
    ks_req_t *q = ks_new(s, r, m, KS_INFER);
    if (q == NULL) {
        sp_req_adapter_release(&ad);
        return;
    }
    q->a.ad = ad;
    char err[768];
    sp_status_t pst;
    ks_body_t *dec = body_decoded(r);
    if (dec != NULL) { /* decoded on a worker: take it */
        pst = dec->st;
        q->ir = dec->ir;
        memset(&dec->ir, 0, sizeof dec->ir);
        snprintf(err, sizeof err, "%s", dec->err);
    } else {
        sp_str_t body = sp_http_req_body(r);
        sp_str_t hl = sp_http_req_header(r, "inference-header-content-length");
        pst = sp_tensor_req_parse(body.ptr, body.len, hl, s->cfg.json_depth, &q->ir, err, sizeof err);
    }
    if (pst != SP_OK) {
        sp_api_error_kserve(r, 400, "%s", err);
        sp_api_finish(&q->a);
        return;
    }
    bool want[N_OUTS];
    gvals_t gv;
    memset(&gv, 0, sizeof gv);
    const sp_model_t *mm = m->model;
    if (sp_tensor_req_no_classification(&q->ir, err, sizeof err) != SP_OK) {
        sp_api_error_kserve(r, 400, "%s", err);
        sp_api_finish(&q->a);
        return;
    }
    if (sp_model_is_encoder(mm)) {
        /* An encoder: text_input in, the output "embedding"; nothing to generate. */
        const sp_pooling_t pool = sp_model_pooling(mm);
        bool ewant[1];
        if (pool == SP_POOLING_RANK || pool == SP_POOLING_NONE) {
            sp_api_error_kserve(r, 400, "model '%s' is %s: infer serves embedding models (use "
                                "/v1/rerank for a reranker)", m->name,
                                pool == SP_POOLING_RANK ? "a reranker" : "an encoder with pooling type none");
            sp_api_finish(&q->a);
            return;
        }
        if (sp_tensor_req_select_outputs(&q->ir, emb_names, 1, ewant, err, sizeof err) != SP_OK) {
            sp_api_error_kserve(r, 400, "%s", err);
            sp_api_finish(&q->a);
            return;
        }
        for (int i = 0; i < q->ir.n_inputs; i++) {
            if (strcmp(q->ir.inputs[i].name, "text_input") != 0) {
                sp_api_error_kserve(r, 400, "inputs[%d] ('%s'): an embedding model takes only "
                                    "'text_input'", i, q->ir.inputs[i].name);
                sp_api_finish(&q->a);
                return;
            }
        }
        if (q->ir.params && gvals_from_object(q->ir.params, "parameters.", false, s->cfg.max_tokens, &gv,
                                              err, sizeof err) != 0) {
            sp_api_error_kserve(r, 400, "%s", err);
            sp_api_finish(&q->a);
            return;
        }
        for (int k = 0; k < N_GPARAMS; k++) {
            if (gv.set[k]) {
                sp_api_error_kserve(r, 400, "parameters.%s: an embedding model does not generate",
                                    gparams[k].name);
                sp_api_finish(&q->a);
                return;
            }
        }
        q->embed = true;
    } else if (sp_tensor_req_select_outputs(&q->ir, out_names, N_OUTS, want, err, sizeof err) != SP_OK ||
        (q->ir.params && gvals_from_object(q->ir.params, "parameters.", false, s->cfg.max_tokens, &gv,
                                           err, sizeof err) != 0) ||
        gvals_from_inputs(&q->ir, s->cfg.max_tokens, &gv, err, sizeof err) != 0) {
        sp_api_error_kserve(r, 400, "%s", err);
        sp_api_finish(&q->a);
        return;
    }
    sp_json_err_t je = {{0}, NULL};
    if (q->ir.params && sp_schedreq_parse(q->ir.params, SP_SCHEDREQ_TRITON, &q->a.sched, &je) < 0) {
        sp_api_error_kserve(r, 400, "parameters: %s", je.msg);
        sp_api_finish(&q->a);
        return;
    }
    const sp_tensor_t *in = NULL;
    int idx = 0;
    for (; idx < q->ir.n_inputs; idx++) {
        if (strcmp(q->ir.inputs[idx].name, "text_input") == 0) {
            in = &q->ir.inputs[idx];
            break;
        }
    }
    if (in == NULL) {
        sp_api_error_kserve(r, 400, "inputs: the input 'text_input' (BYTES) is required");
        sp_api_finish(&q->a);
        return;
    }
    char where[64];
    snprintf(where, sizeof where, "inputs[%d] ('text_input')", idx);
    if (in->dtype != SP_DT_BYTES) {
        sp_api_error_kserve(r, 400, "%s.datatype: must be BYTES, got %s", where, sp_tensor_dtype_name(in->dtype));
        sp_api_finish(&q->a);
        return;
    }
    if (in->n > SP_SCHED_MAX_N) {
        sp_api_error_kserve(r, 400, "%s.shape: %lld prompts, at most %d per request", where,
                            (long long)in->n, s->cfg.max_n);
        sp_api_finish(&q->a);
        return;
    }
    if (q->embed && in->ndim >= SP_TENSOR_MAX_DIMS) {
        sp_api_error_kserve(r, 400, "%s.shape: at most %d dimensions (the embedding adds one)", where,
                            SP_TENSOR_MAX_DIMS - 1);
        sp_api_finish(&q->a);
        return;
    }
    submit(q, (const sp_str_t *)in->data, (int)in->n, &gv, where);
}

static void h_gen(sp_http_req_t *r, const sp_route_params_t *p, void *ud);
static void h_gen_stream(sp_http_req_t *r, const sp_route_params_t *p, void *ud);

static void
h_generate(sp_http_req_t *r, const sp_route_params_t *p, void *ud, ks_kind_t kind)
{
    sp_serving_t *s = ud;
    sp_req_adapter_t ad;
    sp_served_model_t *m = route_model(s, r, p, kind == KS_STREAM ? h_gen_stream : h_gen, &ad);
    if (m == NULL) {
        return;
    }
    if (m->be || sp_model_is_encoder(m->model)) {
        sp_api_error_kserve(r, 400, "model '%s' is a %s model: use /v2/models/%s/infer", m->name,
                            m->be ? m->be->name : sp_model_hparams(m->model)->arch, m->name);
        sp_req_adapter_release(&ad);
        sp_served_release(m);
        return;
    }
    sp_str_t body = sp_http_req_body(r);
    if (body.len == 0) {
        sp_api_error_kserve(r, 400, "the request body is empty (a JSON object with 'text_input' is expected)");
        sp_req_adapter_release(&ad);
        sp_served_release(m);
        return;
    }
    json_t *root = NULL;
    char err[768];
    ks_body_t *dec = body_decoded(r);
    sp_status_t pst;
    if (dec != NULL) { /* decoded on a worker: take it */
        pst = dec->st;
        root = dec->root;
        dec->root = NULL;
        snprintf(err, sizeof err, "%s", dec->err);
    } else if (body_defer(s, r, p, kind == KS_STREAM ? h_gen_stream : h_gen, false)) {
        sp_req_adapter_release(&ad);
        sp_served_release(m);
        return;
    } else {
        pst = sp_json_parse(body.ptr, body.len, s->cfg.json_depth, &root, err, sizeof err);
    }
    if (pst != SP_OK) {
        sp_api_error_kserve(r, 400, "%s", err);
        sp_req_adapter_release(&ad);
        sp_served_release(m);
        return;
    }
    ks_req_t *q = NULL;
    gvals_t gv;
    memset(&gv, 0, sizeof gv);
    if (!json_is_object(root)) {
        sp_api_error_kserve(r, 400, "the request body must be a JSON object");
        goto done;
    }
    const json_t *ti = json_object_get(root, "text_input");
    if (!json_is_string(ti)) {
        sp_api_error_kserve(r, 400, "text_input: required, a string");
        goto done;
    }
    const json_t *id = json_object_get(root, "id");
    if (id && !json_is_null(id) && (!json_is_string(id) || strlen(json_string_value(id)) != json_string_length(id))) {
        sp_api_error_kserve(r, 400, "id: must be a string (without NUL)");
        goto done;
    }
    const json_t *params = json_object_get(root, "parameters");
    if (params && !json_is_null(params) && !json_is_object(params)) {
        sp_api_error_kserve(r, 400, "parameters: must be an object");
        goto done;
    }
    /* Parameters first, then the top-level inputs, which win. */
    if ((json_is_object(params) &&
         gvals_from_object(params, "parameters.", false, s->cfg.max_tokens, &gv, err, sizeof err) != 0) ||
        gvals_from_object(root, "", true, s->cfg.max_tokens, &gv, err, sizeof err) != 0) {
        sp_api_error_kserve(r, 400, "%s", err);
        goto done;
    }
    q = ks_new(s, r, m, kind);
    m = NULL; /* the request holds the reference now (or it was released) */
    if (q != NULL) {
        q->a.ad = ad; /* and the adapter's */
        ad.lora = NULL;
    }
    if (q == NULL) {
        goto done;
    }
    /* Scheduling: parameters first, then the top level, which wins. */
    sp_json_err_t je = {{0}, NULL};
    const char *where = "parameters: ";
    if ((json_is_object(params) && sp_schedreq_parse(params, SP_SCHEDREQ_TRITON, &q->a.sched, &je) < 0) ||
        (where = "", sp_schedreq_parse(root, SP_SCHEDREQ_TRITON, &q->a.sched, &je) < 0)) {
        sp_api_error_kserve(r, 400, "%s%s", where, je.msg);
        sp_api_finish(&q->a);
        goto done;
    }
    if (id && json_is_string(id) && (q->id = sp_strndup(json_string_value(id), json_string_length(id))) == NULL) {
        sp_api_error_kserve(r, 503, "out of memory");
        sp_api_finish(&q->a);
        goto done;
    }
    if (cache_lookup(q, root, &gv)) {
        sp_api_finish(&q->a);
        goto done;
    }
    q->root = json_incref(root); /* the prompt and the stop strings stay in it */
    q->one = (sp_str_t){json_string_value(ti), json_string_length(ti)};
    submit(q, &q->one, 1, &gv, "text_input");
done:
    sp_req_adapter_release(&ad);
    sp_served_release(m);
    json_decref(root);
}

static void
h_gen(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    h_generate(r, p, ud, KS_GENERATE);
}

static void
h_gen_stream(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    h_generate(r, p, ud, KS_STREAM);
}

void
sp_kserve_register(sp_router_t *rt, sp_serving_t *s)
{
    static const char *const bases[] = {"/v2/models/{model}", "/v2/models/{model}/versions/{version}"};
    sp_router_add(rt, SP_HTTP_GET, "/v2", h_server_meta, s);
    sp_model_config_register(rt, s); /* .../config (model_config.c) */
    for (int i = 0; i < 2; i++) {
        char pat[128];
        sp_router_add(rt, SP_HTTP_GET, bases[i], h_model_meta, s);
        snprintf(pat, sizeof pat, "%s/ready", bases[i]);
        sp_router_add(rt, SP_HTTP_GET, pat, h_model_ready, s);
        snprintf(pat, sizeof pat, "%s/infer", bases[i]);
        sp_router_add(rt, SP_HTTP_POST, pat, h_infer, s);
        snprintf(pat, sizeof pat, "%s/generate", bases[i]);
        sp_router_add(rt, SP_HTTP_POST, pat, h_gen, s);
        snprintf(pat, sizeof pat, "%s/generate_stream", bases[i]);
        sp_router_add(rt, SP_HTTP_POST, pat, h_gen_stream, s);
    }
}
