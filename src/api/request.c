/*
 * request.c - what every protocol does with a request the same way: find
 * the model it names (parking it while the model loads on demand), cap its
 * priority at its tenant's tier, and answer errors and JSON (api.h).
 *
 * Threads: a loop thread, with a request of that loop; the wait for an
 * on-demand load is a timer on the request's loop.
 */
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "api/kserve.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"

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
        sp_repository_redact(s, reason, red, sizeof red);
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

struct sp_infer_hcache *
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

void
sp_api_error(sp_http_req_t *r, int status, const char *type, const char *param,
                const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (sp_kserve_path(sp_http_req_path(r))) { /* KServe v2's shape: {"error": "..."} */
        sp_kserve_error(r, status, "%s", msg);
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"error\":{\"message\":");
    sp_jbuf_cstr(&b, msg);
    sp_jbuf_lit(&b, ",\"type\":");
    sp_jbuf_cstr(&b, type ? type : default_type(status));
    sp_jbuf_lit(&b, ",\"param\":");
    sp_jbuf_cstr(&b, param);
    sp_jbuf_lit(&b, ",\"code\":");
    sp_jbuf_cstr(&b, code);
    sp_jbuf_lit(&b, "}}");
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
    sp_jbuf_lit(&b, "{\"error\":{\"message\":");
    sp_jbuf_cstr(&b, message);
    sp_jbuf_printf(&b, ",\"type\":\"%s\",\"param\":null,\"code\":null}}", default_type(status));
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

