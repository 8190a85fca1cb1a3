/*
 * request.c - what every protocol does with a request the same way: find
 * the model it names (parking it while the model loads on demand), cap its
 * priority at its tenant's tier, answer errors and JSON (api.h), and the
 * request's lifecycle from admission to its accounting (request.h).
 *
 * Threads: a loop thread, with a request of that loop; the wait for an
 * on-demand load is a timer on the request's loop; scheduler events arrive
 * on the same loop through its mailbox.
 * Memory: a lifecycle lives in its protocol's request struct and is freed
 * by sp_api_finish through the protocol's ops->free.
 */
#include "api/request.h"

#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "api/dialect.h"
#include "api/kserve.h"
#include "api/trace.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/mask.h"

/* ---------------------------------------------------------------- helpers */

/* A request parked while its model loads on demand: a timer on its loop
 * looks at the registry every few milliseconds (a load takes from
 * milliseconds to seconds; polling keeps the manager thread free of any
 * knowledge of loops and requests). */
typedef struct model_wait {
    sp_serving_t *s;
    sp_http_req_t *r;
    struct event *tick;
    sp_route_fn retry;
    sp_route_params_t p;
    char name[SP_REPO_NAME_MAX + 1];
    char version[24];
    bool has_version;
    int64_t deadline_ns;
} model_wait_t;

#define MODEL_WAIT_TICK_US 5000

static void
model_wait_free(model_wait_t *w)
{
    if (w->tick) {
        event_free(w->tick);
    }
    sp_free(w);
}

static void
model_wait_abort(sp_http_req_t *r, void *ud)
{
    (void)r;
    model_wait_free(ud);
}

static void
model_wait_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    model_wait_t *w = arg;
    sp_served_model_t *m = NULL;
    char reason[8];
    sp_acq_t a = sp_registry_acquire(w->s, w->name, strlen(w->name),
                                     w->has_version ? w->version : NULL, strlen(w->version), false,
                                     &m, reason, sizeof reason);
    sp_served_release(m); /* the retry looks it up again */
    if (a == SP_ACQ_LOADING && sp_time_ns() < w->deadline_ns) {
        struct timeval tv = {0, MODEL_WAIT_TICK_US};
        evtimer_add(w->tick, &tv);
        return;
    }
    sp_http_req_t *r = w->r;
    sp_http_req_on_abort(r, NULL, NULL);
    if (a == SP_ACQ_LOADING) {
        sp_http_add_header(r, "Retry-After", "5");
        sp_api_error(r, 503, "service_unavailable", "model", "model_loading",
                     "the model '%s' is still loading after %g s (--load-timeout)", w->name,
                     w->s->cfg.load_timeout_s);
        model_wait_free(w);
        return;
    }
    /* Loaded (or failed: the handler reports why). The route parameters
     * point into the request, which is still alive. */
    sp_route_params_t p = w->p;
    sp_route_fn retry = w->retry;
    sp_serving_t *s = w->s;
    model_wait_free(w);
    retry(r, &p, s);
}

bool
sp_api_model_for(sp_serving_t *s, sp_http_req_t *r, const char *name, size_t len,
                 sp_str_t version, sp_route_fn retry, const sp_route_params_t *p,
                 sp_served_model_t **out)
{
    char reason[512];
    sp_jbuf_t nm;
    *out = NULL;
    sp_tenant_state_t *tenant = sp_http_req_user(r);
    if (!sp_auth_model_allowed(tenant, name, len)) {
        sp_auth_reject(tenant, SP_LIMIT_MODEL);
        sp_jbuf_init(&nm);
        sp_jbuf_str(&nm, name, len > 128 ? 128 : len);
        sp_api_error(r, 403, "permission_error", "model", "model_not_allowed",
                     "tenant '%s' may not use the model %s", tenant->name, nm.p ? nm.p : "\"\"");
        sp_jbuf_free(&nm);
        return false;
    }
    sp_acq_t a = sp_registry_acquire(s, name, len, version.ptr, version.len, true, out, reason,
                                     sizeof reason);
    switch (a) {
    case SP_ACQ_OK:
        return true;
    case SP_ACQ_LOADING: {
        model_wait_t *w = sp_calloc(1, sizeof *w);
        struct event_base *base = sp_http_loop_base(sp_http_req_loop(r));
        if (w == NULL || len > SP_REPO_NAME_MAX || version.len >= sizeof w->version ||
            (w->tick = evtimer_new(base, model_wait_tick, w)) == NULL) {
            if (w) {
                model_wait_free(w);
            }
            sp_http_add_header(r, "Retry-After", "1");
            sp_api_error(r, 503, "service_unavailable", "model", "model_loading",
                         "the model is loading");
            return false;
        }
        w->s = s;
        w->r = r;
        w->retry = retry;
        if (p) {
            w->p = *p;
        }
        memcpy(w->name, name, len);
        w->has_version = version.ptr != NULL;
        if (version.ptr) {
            memcpy(w->version, version.ptr, version.len);
        }
        w->deadline_ns = sp_time_ns() + (int64_t)(s->cfg.load_timeout_s * 1e9);
        sp_http_req_on_abort(r, model_wait_abort, w);
        struct timeval tv = {0, MODEL_WAIT_TICK_US};
        evtimer_add(w->tick, &tv);
        return false;
    }
    case SP_ACQ_UNAVAILABLE:
    case SP_ACQ_UNKNOWN:
        break;
    }
    /* Client data in the message: escaped and cut. */
    sp_jbuf_init(&nm);
    sp_jbuf_str(&nm, name, len > 128 ? 128 : len);
    if (a == SP_ACQ_UNKNOWN && version.ptr) {
        sp_jbuf_t v;
        sp_jbuf_init(&v);
        sp_jbuf_str(&v, version.ptr, version.len > 32 ? 32 : version.len);
        sp_api_error(r, 404, "invalid_request_error", "model", "model_not_found",
                     "The model %s has no version %s", nm.p ? nm.p : "\"\"", v.p ? v.p : "\"\"");
        sp_jbuf_free(&v);
    } else if (a == SP_ACQ_UNKNOWN) {
        sp_api_error(r, 404, "invalid_request_error", "model", "model_not_found",
                     "The model %s does not exist", nm.p ? nm.p : "\"\"");
    } else {
        char red[512];
        sp_api_redact(s, reason, red, sizeof red);
        sp_api_error(r, 404, "invalid_request_error", "model", "model_not_available",
                     "The model %s is not available: %s", nm.p ? nm.p : "\"\"", red);
    }
    sp_jbuf_free(&nm);
    return false;
}

int32_t
sp_api_tier(sp_http_req_t *r)
{
    return sp_auth_tier(sp_http_req_user(r));
}

int32_t
sp_api_priority(sp_http_req_t *r, int32_t asked)
{
    int32_t t = sp_api_tier(r);
    return asked > t ? t : asked;
}

sp_mailbox_t *
sp_api_mailbox(sp_http_req_t *r)
{
    sp_loop_ctx_t *lc = sp_http_loop_user(sp_http_req_loop(r));
    return lc->mb;
}

struct sp_tensor_hcache *
sp_api_hcache(sp_http_req_t *r)
{
    sp_loop_ctx_t *lc = sp_http_loop_user(sp_http_req_loop(r));
    return lc->hcache;
}

static const char *
default_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "invalid_request_error";
    case 429: return "server_overloaded";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* OpenAI's error object; type NULL picks one from the status, param and code
 * NULL are JSON nulls. */
static void
openai_error(sp_jbuf_t *b, int status, const char *type, const char *param, const char *code,
             const char *message)
{
    sp_jbuf_lit(b, "{\"error\":{\"message\":");
    sp_jbuf_cstr(b, message);
    sp_jbuf_lit(b, ",\"type\":");
    sp_jbuf_cstr(b, type ? type : default_type(status));
    sp_jbuf_lit(b, ",\"param\":");
    sp_jbuf_cstr(b, param);
    sp_jbuf_lit(b, ",\"code\":");
    sp_jbuf_cstr(b, code);
    sp_jbuf_lit(b, "}}");
}

void
sp_api_error(sp_http_req_t *r, int status, const char *type, const char *param,
             const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (sp_api_kserve_path(sp_http_req_path(r))) { /* KServe v2's shape: {"error": "..."} */
        sp_api_error_kserve(r, status, "%s", msg);
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    const sp_api_dialect_t *d = sp_api_dialect_for_path(sp_http_req_path(r));
    if (d != NULL && d->error != NULL) { /* a route of another API: its shape (dialect.h) */
        d->error(&b, status, type, param, code, msg);
    } else {
        openai_error(&b, status, type, param, code, msg);
    }
    if (b.oom) {
        sp_http_respond(r, status, "application/json", "{}", 2);
    } else {
        sp_http_respond(r, status, "application/json", b.p, b.len);
    }
    sp_jbuf_free(&b);
}

void
sp_api_reply_json(sp_http_req_t *r, int status, const sp_jbuf_t *b)
{
    if (b->oom || b->p == NULL) {
        sp_api_error(r, 500, NULL, NULL, NULL, "out of memory while writing the response");
        return;
    }
    sp_http_respond(r, status, "application/json", b->p, b->len);
}

size_t
sp_api_error_body(int status, const char *message, char *buf, size_t cap)
{
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    openai_error(&b, status, NULL, NULL, NULL, message);
    size_t n = 0;
    if (!b.oom && b.len < cap) {
        memcpy(buf, b.p, b.len + 1);
        n = b.len;
    } else if (cap > 2) {
        memcpy(buf, "{}", 3);
        n = 2;
    }
    sp_jbuf_free(&b);
    return n;
}

/* ---------------------------------------------------------------- lifecycle */

sp_status_t
sp_api_server_status(sp_status_t st)
{
    return st == SP_ERR_CANCELLED ? SP_ERR_SHUTDOWN : st;
}

void
sp_api_begin(sp_api_req_t *a, const sp_api_ops_t *ops, sp_serving_t *s, sp_http_req_t *r,
             sp_served_model_t *m, const sp_req_adapter_t *ad)
{
    a->ops = ops;
    a->http = r;
    a->srv = s;
    a->m = m; /* the reference passes to the request, and the adapter's */
    if (ad != NULL) {
        a->ad = *ad;
    }
    a->sched.priority = sp_api_tier(r); /* the tenant's tier unless the request asks lower */
    a->finish = SP_FINISH_STOP;
    sp_metrics_clock_start(&a->clk, sp_http_req_start_ns(r), s->cfg.log_prompts);
}

void
sp_api_account(sp_http_req_t *r, sp_served_model_t *m, sp_req_clock_t *c, bool ok,
               sp_finish_t finish, sp_fail_reason_t reason)
{
    if (c->ended || m == NULL) {
        sp_auth_settle(&c->charge, NULL, 0); /* a reservation never outlives its request */
        return;
    }
    const char *outcome = ok ? (finish == SP_FINISH_LENGTH ? "length" : "stop")
                             : sp_metrics_fail_reason_name(reason);
    if (ok) {
        sp_metrics_clock_success(c, &m->metrics, finish);
    } else {
        sp_metrics_clock_failure(c, &m->metrics, reason);
    }
    if (sp_trace_enabled()) { /* the model's spans, from the same clock */
        sp_trace_model(sp_http_req_trace(r), m->name, m->version_str, c, outcome);
    }
    /* The tenant's tokens-per-minute budget counts what was evaluated and
     * generated; the reservation taken at submit is released. */
    sp_auth_settle(&c->charge, sp_http_req_user(r), c->prompt_tokens + c->completion_tokens);
    sp_http_req_annotate(r, "model=%s version=%s outcome=%s prompt_tokens=%lld completion_tokens=%lld",
                         sp_log_str(m->name), m->version_str, outcome, (long long)c->prompt_tokens,
                         (long long)c->completion_tokens);
    if (c->first_ns) {
        sp_http_req_annotate(r, "ttft_ms=%.3f", (double)(c->first_ns - c->t0_ns) / 1e6);
    }
    if (c->queue_ns >= 0) {
        sp_http_req_annotate(r, "queue_ms=%.3f compute_ms=%.3f", (double)c->queue_ns / 1e6,
                             (double)c->compute_ns / 1e6);
    }
    if (c->keep_text) {
        char masked[SP_REQ_TEXT_MAX * 2];
        size_t n = sp_mask_text(c->prompt, c->prompt_len, masked, sizeof masked);
        sp_http_req_annotate(r, "prompt=%s", sp_log_str_n(masked, n));
        n = sp_mask_text(c->output, c->output_len, masked, sizeof masked);
        sp_http_req_annotate(r, "output=%s", sp_log_str_n(masked, n));
    }
}

void
sp_api_end(sp_api_req_t *a, bool ok, sp_fail_reason_t reason)
{
    if (a->http == NULL) { /* the client left: accounted for then */
        sp_auth_settle(&a->clk.charge, NULL, 0);
        return;
    }
    sp_api_account(a->http, a->m, &a->clk, ok, a->finish, reason);
}

void
sp_api_finish(sp_api_req_t *a)
{
    if (a == NULL) {
        return;
    }
    /* Ended without an outcome: refused while validating (it answered 4xx).
     * A client that left has been accounted for then (offload.h). */
    if (!a->off.gone) {
        sp_api_end(a, false, SP_FAIL_INVALID);
    }
    SP_ASSERT(a->clk.charge.st == NULL); /* every path settles the reservation */
    sp_rckey_free(a->ck);
    a->ck = NULL;
    sp_req_adapter_release(&a->ad); /* the job holds its own reference */
    sp_served_release(a->m); /* the request held its model until now */
    a->m = NULL;
    a->ops->free(a);
}

void
sp_api_abort(sp_http_req_t *r, void *ud)
{
    sp_api_req_t *a = ud;
    SP_LOG_INFO("event=client_disconnect rid=%s", sp_http_req_rid(r));
    sp_api_end(a, false, SP_FAIL_CANCELLED);
    a->http = NULL; /* freed when this returns */
    sp_sched_cancel(a->job);
    sp_api_finish(a);
}

/* The client cannot keep up (or is gone): stop the work, drop the connection. */
static void
drop_slow(sp_api_req_t *a)
{
    sp_http_req_t *r = a->http;
    SP_LOG_INFO("event=stream_dropped rid=%s reason=slow_reader", sp_http_req_rid(r));
    sp_api_end(a, false, SP_FAIL_OVERLOADED);
    sp_sched_cancel(a->job);
    a->http = NULL;
    sp_http_abort(r);
    sp_api_finish(a);
}

/* A job's events, on the request's loop (sched.h). */
void
sp_api_event(const sp_sched_event_t *ev, void *ud)
{
    sp_api_req_t *a = ud;
    if (ev->kind == SP_SCHED_EV_DONE) {
        a->clk.queue_ns = ev->queue_ns;
        a->clk.compute_ns = ev->compute_ns;
        a->clk.prompt_tokens = ev->prompt_tokens;
        a->clk.completion_tokens = ev->completion_tokens;
        sp_status_t st = ev->status;
        const char *message = ev->message;
        if (a->ops->outcome) {
            st = a->ops->outcome(a, st, &message);
        }
        if (st == SP_ERR_MODEL_FAULT) {
            sp_served_fault(a->m, sp_http_req_rid(a->http), message ? message : "model fault");
        }
        sp_api_end(a, st == SP_OK, sp_metrics_fail_reason_of(st, message));
        a->ops->done(a, ev, st, message ? message : sp_status_str(st));
        sp_api_finish(a);
        return;
    }
    if (ev->kind == SP_SCHED_EV_TOKEN) {
        sp_metrics_clock_token(&a->clk);
        /* Counted as they come: a request that ends before DONE (the client
         * left, a slow reader) is charged what was generated until then. */
        a->clk.completion_tokens += ev->token >= 0;
        if (ev->index == 0) {
            sp_metrics_clock_text(&a->clk, true, ev->text, ev->text_len);
        }
    } else if (ev->kind == SP_SCHED_EV_FINISH && ev->index == 0) {
        a->finish = ev->finish;
    }
    if (a->ops->event(a, ev) != 0) {
        drop_slow(a);
    }
}

bool
sp_api_reserve(sp_tenant_state_t *tenant, int64_t most, sp_tenant_charge_t *c, int *retry_after_s,
               char *message, size_t cap)
{
    sp_auth_result_t ar;
    if (sp_auth_reserve(tenant, most, c, &ar)) {
        return true;
    }
    *retry_after_s = ar.retry_after_s > 0 ? ar.retry_after_s : 1;
    snprintf(message, cap, "%s", ar.message);
    return false;
}

bool
sp_api_admit(sp_api_req_t *a, sp_sched_request_t *sr, int64_t prompt_tokens, int64_t most)
{
    sp_http_req_t *r = a->http;
    const sp_serve_config_t *cfg = &a->srv->cfg;
    char err[512];
    /* The tenant's tokens per minute: reserve the most this request may use
     * (its prompts, and max_tokens for each sequence); settled at its end
     * (sp_api_account) with what it used, however it ends. */
    int ra = 1;
    if (!sp_api_reserve(sp_http_req_user(r), most, &a->clk.charge, &ra, err, sizeof err)) {
        char v[16];
        snprintf(v, sizeof v, "%d", ra);
        sp_http_add_header(r, "Retry-After", v);
        a->ops->refuse(a, SP_API_REFUSED_TOKENS, SP_ERR_BUSY, err);
        return false;
    }
    sr->lora = a->ad.lora;
    sr->deadline_ns = sp_schedreq_deadline_ns(&a->sched, cfg->request_timeout_s, sp_time_ns());
    sr->priority = sp_api_priority(r, a->sched.priority);
    sr->prefix_scope = sp_auth_prefix_scope(sp_http_req_user(r), cfg->prefix_cache_scope);
    sr->mailbox = sp_api_mailbox(r);
    sr->on_event = sp_api_event;
    sr->ud = a;
    a->clk.prompt_tokens = prompt_tokens; /* what an end before DONE is charged for the prompts */
    sp_trace_http_submit(r); /* the queue span starts here */
    sp_sched_t *sch = sp_served_pick(a->m);
    sp_status_t st = sp_sched_submit(sch, sr, &a->job, err, sizeof err);
    if (st != SP_OK) {
        a->clk.prompt_tokens = 0; /* nothing ran: the reservation is released, nothing charged */
        sp_api_end(a, false, sp_metrics_fail_reason_of(st, err));
        if (st == SP_ERR_BUSY) {
            char v[16];
            snprintf(v, sizeof v, "%d", sp_sched_retry_after_s(sch, sr->priority, sr->n));
            sp_http_add_header(r, "Retry-After", v);
            a->ops->refuse(a, SP_API_REFUSED_QUEUE, st, err);
        } else {
            a->ops->refuse(a, SP_API_REFUSED_STATUS, st, err);
        }
        return false;
    }
    sp_http_req_on_abort(r, sp_api_abort, a);
    return true;
}

void
sp_api_error_kserve(sp_http_req_t *r, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"error\":");
    sp_jbuf_cstr(&b, msg);
    sp_jbuf_lit(&b, "}");
    if (b.oom) {
        sp_http_respond(r, status, "application/json", "{\"error\":\"out of memory\"}", 25);
    } else {
        sp_http_respond(r, status, "application/json", b.p, b.len);
    }
    sp_jbuf_free(&b);
}

/* A reason as clients see it: the repository's own location (as given and
 * resolved) removed, so answers name files relative to the repository and
 * never the server's file system (RELIABILITY.md R6; the log keeps it all).
 * Any other absolute path left (a key file, the key directory) is cut to
 * its last component after ".../". */
void
sp_api_redact(const sp_serving_t *s, const char *in, char *out, size_t cap)
{
    char key_real[4096] = "";
    if (s->cfg.key_dir[0] && realpath(s->cfg.key_dir, key_real) == NULL) {
        key_real[0] = '\0';
    }
    const char *roots[4] = {s->cfg.model_repository, s->repo_real, s->cfg.key_dir, key_real};
    size_t j = 0;
    for (const char *p = in; *p && j + 1 < cap;) {
        size_t skip = 0;
        for (int k = 0; k < 4 && !skip; k++) {
            size_t n = strlen(roots[k]);
            if (n > 1 && strncmp(p, roots[k], n) == 0 && p[n] == '/') {
                skip = n + 1;
            }
        }
        if (skip) {
            p += skip;
            continue;
        }
        /* An absolute path starting a word: only its last component (an API
         * route such as /v2/repository/... is not a file and stays whole). */
        char prev = p == in ? ' ' : p[-1];
        if (*p == '/' && strchr(" \"'(=:", prev) != NULL && strncmp(p, "/v1/", 4) != 0 &&
            strncmp(p, "/v2/", 4) != 0) {
            const char *end = p, *last = p;
            while (*end && strchr(" \"'),;", *end) == NULL) {
                if (*end == '/' && end[1] && strchr(" \"'),;", end[1]) == NULL) {
                    last = end + 1;
                }
                end++;
            }
            if (last > p + 1) {
                int n = snprintf(out + j, cap - j, ".../");
                j = n > 0 && (size_t)n < cap - j ? j + (size_t)n : j;
            }
            for (const char *q = last > p + 1 ? last : p; q < end && j + 1 < cap; q++) {
                out[j++] = *q;
            }
            p = end;
            continue;
        }
        out[j++] = *p++;
    }
    out[j] = '\0';
}

bool
sp_api_kserve_path(sp_str_t path)
{
    return path.len >= 3 && memcmp(path.ptr, "/v2", 3) == 0 && (path.len == 3 || path.ptr[3] == '/');
}
