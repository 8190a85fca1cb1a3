/*
 * serve.c - `sampan serve`: wiring, health routes, signals and drain.
 *
 * Start-up: parse the configuration, bind and start the event loops first
 * (so /live answers at once and /health says 503 while loading), then load
 * the models on a loader thread and turn ready.
 *
 * Shutdown (SIGTERM or SIGINT): with --drain-delay S, a SIGTERM first turns
 * not ready for S seconds while still accepting and serving (the endpoint
 * leaves the load balancers before anything is refused; SIGINT or a second
 * SIGTERM cuts the delay short). Then stop accepting (the listening sockets
 * close, idle keep-alive connections close), let requests in flight finish
 * until --drain-timeout, then stop the engines (what is still running ends
 * with an error event), stop the loops and exit 0. A signal during the drain
 * exits at once with status 1. Signals are taken synchronously with
 * sigtimedwait on the main thread (blocked everywhere else), so no handler
 * runs in signal context.
 */
#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/pool.h"
#include "core/workq.h"
#include "core/timer.h"
#include "cuda/loader.h"
#include "sampan/log.h"
#include "sampan/version.h"
#include "serving/hub.h"
#include "serving/repo.h"
#include "http/cors.h"
#include "api/grpc.h"
#include "sched/batcher.h"
#include "sched/mailbox.h"
#include "api/kserve.h"
#include "api/ollama.h"
#include "serving/manager.h"
#include "serving/registry.h"
#include "api/api.h"
#include "server/server.h"
#include "api/status_page.h"
#include "api/tensor.h"
#include "api/trace.h"

/* The composition root: the serving state every floor shares, plus what only
 * wiring needs (the route table and the gRPC port). */
typedef struct sp_server {
    sp_serving_t sv;
    sp_router_t *router;
    struct sp_grpc *grpc;     /* the gRPC port (grpc.h); NULL = none */
} sp_server_t;

/* ----------------------------------------------------------------- health */

/* A GPU that holds a model and was marked unhealthy by a CUDA error: its
 * models cannot answer, so the server is not ready (readiness takes it out of
 * the load balancer; docs/cuda.md). */
static bool
gpu_unhealthy(sp_server_t *s)
{
    sp_registry_t *reg = &s->sv.reg;
    bool bad = false;
    pthread_mutex_lock(&reg->mu);
    for (int d = 0; d < reg->n_dev && !bad; d++) {
        const sp_device_info_t *di = sp_devices_get(reg->devs, d);
        bad = di->ordinal >= 0 && reg->used[d] > 0 && !sp_loader_device_healthy(di->ordinal);
    }
    pthread_mutex_unlock(&reg->mu);
    return bad;
}

static void
h_live(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_http_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

/* Repository models that should serve and do not: a selected version that is
 * loading or whose last load failed (on-demand and unloaded ones do not
 * count), plus the models whose config or directory cannot be read. */
static int
models_not_ready(sp_server_t *s)
{
    sp_registry_t *reg = &s->sv.reg;
    int n = atomic_load(&s->sv.repo_bad_models);
    pthread_mutex_lock(&reg->mu);
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        const sp_model_entry_t *e = &reg->entry[i];
        if (!e->used || !e->from_repo || e->on_demand || e->state == SP_REPO_READY) continue;
        n += e->state == SP_REPO_LOADING || e->demand_failed;
    }
    pthread_mutex_unlock(&reg->mu);
    return n;
}

/* Why the server is not ready, or NULL: /health, /v2/health/ready and gRPC
 * ServerReady all answer from this, so they agree. */
static const char *
not_ready_why(sp_server_t *s)
{
    if (atomic_load(&s->sv.draining) || atomic_load(&s->sv.leaving)) return "draining";
    if (!atomic_load(&s->sv.ready)) return "loading";
    if (gpu_unhealthy(s)) return "device_unhealthy";
    if (s->sv.cfg.strict_readiness && models_not_ready(s) > 0) return "models_not_ready";
    return NULL;
}

static void
h_health(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_server_t *s = ud;
    const char *why = not_ready_why(s);
    if (why == NULL) {
        sp_http_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15);
        return;
    }
    char body[96];
    int n = snprintf(body, sizeof body, "{\"status\":\"%s\"}", why);
    sp_http_add_header(r, "Retry-After", "1");
    sp_http_respond(r, 503, "application/json", body, (size_t)n);
}

static void
h_v2_live(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_http_respond(r, 200, NULL, "", 0);
}

static void
h_v2_ready(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_http_respond(r, not_ready_why(ud) == NULL ? 200 : 503, NULL, "", 0);
}

/* GET /stats: per loaded model (the newest version under its name, older
 * ones as name@version) and the devices' memory (docs/api.md). */
static void
h_stats(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_server_t *s = ud;
    sp_served_model_t **ms = NULL;
    int n = sp_registry_snapshot(&s->sv, &ms);
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"models\":{");
    for (int i = 0; i < n; i++) {
        sp_served_model_t *m = ms[i];
        sp_sched_stats_t st;
        sp_served_stats(m, &st);
        if (i > 0) {
            sp_jbuf_lit(&b, ",");
        }
        /* snapshot order: by name, then version: the last of a name is the newest */
        bool newest = i + 1 == n || strcmp(ms[i + 1]->name, m->name) != 0;
        char key[160];
        int kl = newest ? snprintf(key, sizeof key, "%s", m->name)
                        : snprintf(key, sizeof key, "%s@%s", m->name, m->version_str);
        sp_jbuf_str(&b, key, kl > 0 && (size_t)kl < sizeof key ? (size_t)kl : strlen(key));
        char buf[2048];
        int w = snprintf(
            buf, sizeof buf,
            ":{\"version\":\"%s\",\"instances\":%d,\"memory_bytes\":%llu,\"load_ms\":%.3f,"
            "\"running\":%lld,\"waiting\":%lld,"
            "\"running_by_tier\":{\"premium\":%lld,\"standard\":%lld,\"batch\":%lld},"
            "\"waiting_by_tier\":{\"premium\":%lld,\"standard\":%lld,\"batch\":%lld},"
            "\"jobs_done\":%lld,\"jobs_cancelled\":%lld,\"tokens_generated\":%lld,"
            "\"prompt_tokens\":%lld,\"prompt_tokens_cached\":%lld,\"preemptions\":%lld,"
            "\"prefix_lookups\":%lld,\"prefix_hits\":%lld,\"prefix_hit_rate\":%.4f,"
            "\"kv_blocks_total\":%lld,\"kv_blocks_used\":%lld,\"kv_blocks_cached\":%lld,"
            "\"kv_blocks_free\":%lld,\"kv_evictions\":%lld,\"kv_swa_blocks_total\":%lld,"
            "\"kv_swa_blocks_used\":%lld,\"kv_swa_blocks_cached\":%lld,"
            "\"prefix_swa_cut_blocks\":%lld,\"steps\":%lld,"
            "\"last_step_seqs\":%lld,\"last_step_tokens\":%lld,\"mean_step_seqs\":%.3f,"
            "\"mean_step_tokens\":%.3f,\"step_budget\":%lld,\"step_p99_ms\":%.4f,"
            "\"tpot_target_ms\":%.4f,\"budget_decreases\":%lld,\"budget_increases\":%lld,"
            "\"spec_verifications\":%lld,\"spec_draft_tokens\":%lld,\"spec_accepted_tokens\":%lld",
            m->version_str, m->n_inst, (unsigned long long)m->mem_bytes, m->load_ms,
            (long long)st.active, (long long)st.queued, (long long)st.running_tier[2],
            (long long)st.running_tier[1], (long long)st.running_tier[0],
            (long long)st.waiting_tier[2], (long long)st.waiting_tier[1],
            (long long)st.waiting_tier[0], (long long)st.jobs_done, (long long)st.jobs_cancelled,
            (long long)st.tokens_generated, (long long)st.prompt_tokens,
            (long long)st.prompt_tokens_cached, (long long)st.preemptions,
            (long long)st.prefix_lookups, (long long)st.prefix_hits,
            st.prefix_lookups ? (double)st.prefix_hits / (double)st.prefix_lookups : 0.0,
            (long long)st.kv_blocks_total, (long long)st.kv_blocks_used,
            (long long)st.kv_blocks_cached, (long long)st.kv_blocks_free,
            (long long)st.kv_evictions, (long long)st.kv_swa_blocks_total,
            (long long)st.kv_swa_blocks_used, (long long)st.kv_swa_blocks_cached,
            (long long)st.prefix_swa_cut_blocks,
            (long long)st.steps, (long long)st.last_step_seqs,
            (long long)st.last_step_rows, st.mean_step_seqs, st.mean_step_rows,
            (long long)st.step_budget, st.step_p99_ms, st.tpot_target_ms,
            (long long)st.budget_decreases, (long long)st.budget_increases,
            (long long)st.spec_rows, (long long)st.spec_drafted, (long long)st.spec_accepted);
        sp_jbuf_raw(&b, buf, w > 0 && (size_t)w < sizeof buf ? (size_t)w : 0);
        /* Per instance: jobs done, for checking how work spreads. */
        const sp_model_metrics_t *mm = &m->metrics;
        uint64_t fails = 0;
        for (int k = 0; k < SP_FAIL_COUNT_; k++) {
            fails += atomic_load(&mm->failure[k]);
        }
        sp_jbuf_printf(&b,
                       ",\"requests_success\":%llu,\"requests_failure\":%llu,"
                       "\"e2e_seconds_sum\":%.6f,\"e2e_count\":%llu,"
                       "\"ttft_seconds_sum\":%.6f,\"ttft_count\":%llu",
                       (unsigned long long)(atomic_load(&mm->success[0]) + atomic_load(&mm->success[1])),
                       (unsigned long long)fails, sp_hist_sum(&mm->e2e),
                       (unsigned long long)sp_hist_count(&mm->e2e), sp_hist_sum(&mm->ttft),
                       (unsigned long long)sp_hist_count(&mm->ttft));
        if (m->batcher) {
            sp_batcher_stats_t bs;
            sp_batcher_get_stats(m->batcher, &bs);
            sp_jbuf_printf(&b,
                           ",\"batcher\":{\"requests\":%llu,\"batches\":%llu,\"rows\":%llu,"
                           "\"queued\":%lld,\"delay_us\":%llu,\"max_batch\":%d,\"adaptive\":%s,"
                           "\"p99_ms\":%.3f,\"load\":%.3f,\"adapt_increases\":%llu,\"adapt_decreases\":%llu,"
                           "\"timed_out\":%llu,\"rejected_queue_full\":%llu}",
                           (unsigned long long)bs.requests, (unsigned long long)bs.batches,
                           (unsigned long long)bs.rows, (long long)bs.queued,
                           (unsigned long long)bs.delay_us, (int)bs.max_batch,
                           bs.adaptive ? "true" : "false", bs.p99_ms, bs.load,
                           (unsigned long long)bs.adapt_increases,
                           (unsigned long long)bs.adapt_decreases,
                           (unsigned long long)bs.timed_out,
                           (unsigned long long)bs.rejected_queue_full);
        }
        sp_jbuf_lit(&b, ",\"instance_jobs_done\":[");
        for (int k = 0; k < m->n_inst && m->inst[k]; k++) {
            sp_sched_stats_t t;
            sp_sched_get_stats(m->inst[k], &t);
            sp_jbuf_printf(&b, k ? ",%lld" : "%lld", (long long)t.jobs_done);
        }
        sp_jbuf_lit(&b, "]}");
        sp_served_release(m);
    }
    sp_free(ms);
    sp_jbuf_lit(&b, "},\"devices\":[");
    sp_registry_t *reg = &s->sv.reg;
    pthread_mutex_lock(&reg->mu);
    for (int d = 0; d < reg->n_dev; d++) {
        const sp_device_info_t *di = sp_devices_get(reg->devs, d);
        sp_jbuf_lit(&b, d ? ",{\"id\":" : "{\"id\":");
        sp_jbuf_cstr(&b, di->id);
        sp_jbuf_printf(&b,
                       ",\"kind\":\"%s\",\"total_bytes\":%llu,\"budget_bytes\":%llu,"
                       "\"reserved_bytes\":%llu}",
                       sp_device_kind_name(di->kind), (unsigned long long)di->total_bytes,
                       (unsigned long long)reg->budget[d], (unsigned long long)reg->used[d]);
    }
    sp_jbuf_printf(&b, "],\"evictions\":%lld,\"registry\":[", (long long)reg->evictions);
    int written = 0;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        const sp_model_entry_t *e = &reg->entry[i];
        if (!e->used) {
            continue;
        }
        sp_jbuf_lit(&b, written++ ? ",{\"name\":" : "{\"name\":");
        sp_jbuf_cstr(&b, e->name);
        sp_jbuf_printf(&b, ",\"version\":\"%s\",\"state\":\"%s\",\"reason\":", e->version_str,
                       sp_repo_state_name(e->live && e->state == SP_REPO_READY ? SP_REPO_READY
                                          : e->state == SP_REPO_READY ? SP_REPO_UNAVAILABLE
                                                                      : e->state));
        char red[1024];
        sp_api_redact(&s->sv, e->reason, red, sizeof red);
        sp_jbuf_cstr(&b, red);
        sp_jbuf_lit(&b, "}");
    }
    sp_jbuf_lit(&b, "]");
    pthread_mutex_unlock(&reg->mu);
    sp_jbuf_printf(&b,
                   ",\"server\":{\"version\":\"%s\",\"uptime_s\":%lld,\"connections\":%lld,"
                   "\"inflight\":%lld,\"rss_bytes\":%llu,\"ready\":%s,\"draining\":%s}}",
                   SAMPAN_VERSION, (long long)(time(NULL) - s->sv.started_unix),
                   (long long)sp_http_server_connections(s->sv.http),
                   (long long)sp_http_server_inflight(s->sv.http), (unsigned long long)sp_metrics_rss_bytes(),
                   atomic_load(&s->sv.ready) ? "true" : "false",
                   atomic_load(&s->sv.draining) ? "true" : "false");
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

/* Access classes of routes (sp_router_set_access; docs/security.md). A
 * route's class is its required scope bits, or one of these; routes left
 * unclassified (0) need the infer scope, so a new route is never open by
 * accident. The check runs on the route the router matched, so every
 * spelling of a path ("//", a trailing "/") meets the same check. */
#define ACCESS_PUBLIC (1u << 30) /* no key, and answered while draining */
#define ACCESS_OPEN (1u << 29)   /* no key (--metrics-open /metrics) */

static void
set_route_access(sp_server_t *s)
{
    /* "/" is the status page: it holds no data (it reads /stats, which needs the key). */
    static const char *const public_routes[] = {"/", "/live", "/health", "/v2/health/live",
                                                "/v2/health/ready"};
    for (size_t i = 0; i < sizeof public_routes / sizeof public_routes[0]; i++) {
        sp_router_set_access(s->router, public_routes[i], false, ACCESS_PUBLIC);
    }
    sp_router_set_access(s->router, "/v2/repository", true, SP_SCOPE_ADMIN);
    sp_router_set_access(s->router, "/stats", false, SP_SCOPE_METRICS);
    /* Triton's statistics: monitoring (metrics keys) and the clients that
     * infer (perf_analyzer reads them); a tenant sees its own models only. */
    sp_router_set_access(s->router, "/v2/models/stats", false, SP_SCOPE_METRICS | SP_SCOPE_INFER);
    sp_router_set_access(s->router, "/v2/models/{model}/stats", false,
                         SP_SCOPE_METRICS | SP_SCOPE_INFER);
    sp_router_set_access(s->router, "/v2/models/{model}/versions/{version}/stats", false,
                         SP_SCOPE_METRICS | SP_SCOPE_INFER);
    sp_router_set_access(s->router, "/metrics", false,
                         s->sv.cfg.metrics_open ? ACCESS_OPEN : SP_SCOPE_METRICS);
}

static bool
is_loopback(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcmp(host, "localhost") == 0;
}

/* A client's x-request-id is kept when it is a plain token of at most 64
 * bytes (it ends up in logs and headers); otherwise the server makes one. */
static bool
rid_ok(sp_str_t v)
{
    if (v.ptr == NULL || v.len == 0 || v.len > SP_HTTP_RID_MAX) {
        return false;
    }
    for (size_t i = 0; i < v.len; i++) {
        char c = v.ptr[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':')) {
            return false;
        }
    }
    return true;
}

static void
handle(sp_http_req_t *r, void *ud)
{
    sp_server_t *s = ud;
    sp_str_t path = sp_http_req_path(r);
    sp_str_t rid = sp_http_req_header(r, "x-request-id");
    if (rid_ok(rid)) {
        sp_http_req_set_rid(r, rid.ptr, rid.len);
    } else {
        char buf[40];
        int n = snprintf(buf, sizeof buf, "%08llx-%llx", (unsigned long long)s->sv.rid_prefix,
                         (unsigned long long)sp_http_req_id(r));
        sp_http_req_set_rid(r, buf, (size_t)n);
    }
    sp_http_add_header(r, "x-request-id", sp_http_req_rid(r));
    if (sp_trace_enabled()) {
        sp_trace_http_begin(r); /* traceparent in and out (docs/tracing.md) */
    }
    /* A CORS preflight is answered before any key is asked for; a refused
     * one gets its 403 in the path's error shape. */
    sp_cors_decision_t cors = sp_cors_handle(r, s->sv.cfg.cors_origins);
    if (cors == SP_CORS_REFUSED) {
        sp_api_error(r, 403, "invalid_request_error", NULL, "cors_origin_not_allowed",
                     "this origin is not allowed (--cors-origins)");
    }
    if (cors != SP_CORS_CONTINUE) {
        return;
    }
    sp_route_match_t route;
    int rc = sp_router_find(s->router, sp_http_req_method(r), path, &route);
    /* No route (or a path refused): a key (of any scope) is still asked
     * for, so that paths cannot be probed without one. */
    uint32_t access = rc == 404 || rc == 400 ? SP_SCOPE_INFER | SP_SCOPE_ADMIN | SP_SCOPE_METRICS
                      : route.access == 0 ? SP_SCOPE_INFER
                                          : route.access;
    if (!(access & ACCESS_PUBLIC)) {
        uint32_t scope = access & ~ACCESS_OPEN;
        if (scope && sp_auth_enabled(&s->sv.auth)) {
            sp_str_t auth = sp_http_req_header(r, "authorization");
            sp_str_t key = sp_http_req_header(r, "x-api-key");
            if (auth.ptr && auth.len > 7 && strncasecmp(auth.ptr, "Bearer ", 7) == 0) {
                key.ptr = auth.ptr + 7;
                key.len = auth.len - 7;
            }
            sp_auth_result_t ar;
            sp_auth_check(&s->sv.auth, key, scope, &ar);
            if (ar.status != 0) {
                if (ar.status == 401) {
                    sp_http_add_header(r, "WWW-Authenticate", "Bearer");
                } else if (ar.status == 429) {
                    char ra[16];
                    snprintf(ra, sizeof ra, "%d", ar.retry_after_s > 0 ? ar.retry_after_s : 1);
                    sp_http_add_header(r, "Retry-After", ra);
                }
                sp_api_error(r, ar.status, NULL, NULL,
                             ar.status == 401   ? "invalid_api_key"
                             : ar.status == 403 ? "insufficient_scope"
                                                : "rate_limit_exceeded",
                             "%s", ar.message);
                return;
            }
            sp_http_req_set_user(r, ar.state); /* counted in flight until on_done */
        }
        if (atomic_load(&s->sv.draining)) {
            sp_http_add_header(r, "Retry-After", "1");
            sp_api_error(r, sp_status_http(SP_ERR_SHUTDOWN), NULL, NULL, "shutting_down",
                         "the server is shutting down");
            return;
        }
    }
    if (rc == 0) {
        sp_router_run(&route, r);
    } else if (rc == 400) {
        sp_api_error(r, 400, NULL, NULL, "invalid_path", "the path has a '.' or '..' segment");
    } else if (rc == 404) {
        sp_api_error(r, 404, NULL, NULL, "not_found", "no route for %s %.*s",
                     sp_http_req_method_str(r), (int)(path.len > 200 ? 200 : path.len), path.ptr);
    } else {
        sp_api_error(r, 405, NULL, NULL, "method_not_allowed", "%s is not allowed on this route",
                     sp_http_req_method_str(r));
    }
}

/* The access log: one line per request, when --log-requests wants it. The
 * protocol handlers add the model's fields to the request's note. */
static void
on_done(sp_http_req_t *r, bool aborted, void *ud)
{
    sp_server_t *s = ud;
    sp_tenant_state_t *tenant = sp_http_req_user(r);
    sp_auth_done(tenant); /* no longer in flight, logged or not */
    char trace[80]; /* " trace_id=... span_id=..." of a sampled request, else "" */
    trace[0] = '\0';
    if (sp_trace_enabled()) {
        sp_trace_http_end(r, aborted, tenant ? tenant->name : NULL, trace, sizeof trace);
    }
    const char *mode = s->sv.cfg.log_requests;
    int status = sp_http_req_status(r);
    const char *note = sp_http_req_note(r);
    bool error = aborted || status >= 400;
    bool want = strcmp(mode, "all") == 0 || (strcmp(mode, "models") == 0 && (note[0] || error)) ||
                (strcmp(mode, "errors") == 0 && error);
    if (!want) {
        return;
    }
    sp_str_t path = sp_http_req_path(r);
    double ms = (double)(sp_time_ns() - sp_http_req_start_ns(r)) / 1e6;
    sp_log_level_t level = status >= 500 ? SP_LOG_LEVEL_WARN : SP_LOG_LEVEL_INFO;
    SP_LOG(level, "event=request rid=%s method=%s path=%s status=%d duration_ms=%.3f peer=%s tenant=%s%s%s%s%s",
           sp_http_req_rid(r), sp_http_req_method_str(r),
           sp_log_str_n(path.ptr, path.len > 200 ? 200 : path.len), status, ms,
           sp_http_req_peer(r), tenant ? tenant->name : "-", trace, note[0] ? " " : "", note,
           aborted ? " aborted=true" : "");
}

/* ------------------------------------------------------------- loops */

/* Each loop's mailbox (sched/mailbox.h): a post from another thread (a
 * scheduler's events, a worker's result) writes the loop's eventfd, and the
 * loop drains the mailbox on its own thread when it wakes. */
static void
loop_mailbox_wake(void *loop)
{
    sp_http_loop_wake(loop);
}

static void
loop_mailbox_drain(void *mb)
{
    sp_mailbox_drain(mb);
}

static void *
loop_init(sp_http_loop_t *loop, void *ud)
{
    sp_loop_ctx_t *lc = sp_calloc(1, sizeof *lc);
    if (lc == NULL) {
        return NULL;
    }
    sp_server_t *s = ud;
    lc->srv = &s->sv;
    lc->mb = sp_mailbox_create(loop_mailbox_wake, loop);
    if (lc->mb == NULL) {
        sp_free(lc);
        return NULL;
    }
    sp_http_loop_set_wake_cb(loop, loop_mailbox_drain, lc->mb);
    lc->hcache = sp_tensor_hcache_new(); /* NULL (no memory) only turns the cache off */
    /* The gRPC port is served by the same loops (grpc.h). */
    if (s->grpc && (lc->grpc = sp_grpc_loop_start(s->grpc, loop)) == NULL) {
        SP_LOG_WARN("event=grpc_loop_failed detail=%s", sp_log_str("out of memory"));
    }
    return lc;
}

static void
loop_fini(sp_http_loop_t *loop, void *user, void *ud)
{
    sp_loop_ctx_t *lc = user;
    if (lc) {
        sp_grpc_loop_stop(lc->grpc); /* cancels its calls while the mailbox still exists */
        sp_mailbox_destroy(lc->mb);
        sp_http_loop_set_wake_cb(loop, NULL, NULL);
        sp_tensor_hcache_free(lc->hcache);
        sp_free(lc);
    }
}

/* The gRPC port (docs/grpc.md): --grpc-port N, 0 or off; by default 8001,
 * and when that port is taken the server runs without gRPC (a warning),
 * so that several servers on one machine (tests, a second instance) start.
 * An explicit port that cannot be bound is an error, as --port is. */
static sp_status_t
start_grpc(sp_server_t *s, int *rc, char *err, size_t err_len)
{
    const char *v = s->sv.cfg.grpc_port;
    bool dflt = v[0] == '\0';
    if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0) {
        return SP_OK;
    }
    char *end = NULL;
    long port = dflt ? SP_GRPC_DEFAULT_PORT : strtol(v, &end, 10);
    if (!dflt && (*end != '\0' || port < 1 || port > 65535)) {
        *rc = 2;
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "--grpc-port must be a port (1..65535), 0 or off, got '%s'", v);
    }
    if (port == s->sv.cfg.port || port == s->sv.cfg.tls_port) {
        if (dflt) {
            SP_LOG_WARN("event=grpc_disabled port=%ld reason=%s", port,
                        sp_log_str("the HTTP server uses this port; give --grpc-port"));
            return SP_OK;
        }
        *rc = 2;
        return sp_errf(err, err_len, SP_ERR_INVALID, "--grpc-port %ld: the HTTP server uses it",
                       port);
    }
    sp_grpc_params_t gp = {
        .host = s->sv.cfg.host,
        .port = (int)port,
        .limits = s->sv.cfg.limits,
        .srv = &s->sv,
        .tls_cert = s->sv.cfg.tls_cert,
        .tls_key = s->sv.cfg.tls_key,
        .tls_client_ca = s->sv.cfg.tls_client_ca,
    };
    if (sp_grpc_create(&gp, &s->grpc, err, err_len) != SP_OK) {
        if (dflt) {
            SP_LOG_WARN("event=grpc_disabled port=%ld reason=%s", port, sp_log_str(err));
            return SP_OK;
        }
        return SP_ERR_IO;
    }
    SP_LOG_INFO("event=grpc_listening url=%s://%s:%d service=inference.GRPCInferenceService",
                sp_grpc_tls(s->grpc) ? "grpcs" : "grpc", s->sv.cfg.host, sp_grpc_port(s->grpc));
    return SP_OK;
}

/* ------------------------------------------------------------- entry */

int
sp_cmd_serve(int argc, char **argv)
{
    char err[1024];
    bool help = false;
    sp_server_t *s = sp_calloc(1, sizeof *s);
    if (s == NULL) {
        fprintf(stderr, "sampan: out of memory\n");
        return 1;
    }
    if (sp_config_parse(argc, argv, &s->sv.cfg, &help, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n%s", err, sp_config_usage);
        sp_free(s);
        return 2;
    }
    if (help) {
        fputs(sp_config_usage, stdout);
        sp_free(s);
        return 0;
    }
    sp_json_init();
    sp_log_set_format(strcmp(s->sv.cfg.log_format, "json") == 0 ? SP_LOG_FORMAT_JSON : SP_LOG_FORMAT_KV);
    if (s->sv.cfg.env_unknown[0] != '\0') {
        /* a misspelt variable would otherwise change nothing without a word */
        SP_LOG_WARN("event=config_env_unknown names=%s detail=%s", sp_log_str(s->sv.cfg.env_unknown),
                    sp_log_str("these SAMPAN_ variables name no option of sampan serve"));
    }
    if (sp_hub_resolve_models(&s->sv.cfg, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        sp_free(s);
        return 1;
    }
    s->sv.rid_prefix = ((uint64_t)sp_time_ns() ^ ((uint64_t)getpid() << 32)) & 0xffffffffu;
    if (sp_auth_init(&s->sv.auth, s->sv.cfg.tenants_file, s->sv.cfg.api_key, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        sp_auth_fini(&s->sv.auth);
        sp_free(s);
        return 2;
    }
    if (!sp_auth_enabled(&s->sv.auth) && !is_loopback(s->sv.cfg.host) && !s->sv.cfg.insecure_open) {
        fprintf(stderr,
                "sampan serve: refusing to listen on %s without API keys: give --tenants FILE "
                "(or --api-key KEY), bind 127.0.0.1, or accept an open server with "
                "--insecure-open\n",
                s->sv.cfg.host);
        sp_auth_fini(&s->sv.auth);
        sp_free(s);
        return 2;
    }
    if (!sp_auth_enabled(&s->sv.auth)) {
        SP_LOG_WARN("event=auth mode=none host=%s note=%s", sp_log_str(s->sv.cfg.host),
                    is_loopback(s->sv.cfg.host)
                        ? "no API keys: only this machine can connect"
                        : "\"no API keys and --insecure-open: anyone who can reach the port can use it\"");
    } else {
        SP_LOG_INFO("event=auth mode=%s", s->sv.cfg.tenants_file[0] ? "tenants" : "api-key");
    }
    if (sp_registry_init(&s->sv.reg, s->sv.cfg.memory_budget, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        sp_registry_fini(&s->sv.reg);
        sp_free(s);
        return 2;
    }
    s->sv.started_unix = (int64_t)time(NULL);

    /* Signals: SIGPIPE ignored (writes to closed sockets return EPIPE);
     * SIGTERM and SIGINT blocked in every thread and taken by sigtimedwait. */
    signal(SIGPIPE, SIG_IGN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP); /* reload the TLS certificate and the tenants file */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    int rc = 1;
    s->router = sp_router_create();
    if (s->router == NULL) {
        fprintf(stderr, "sampan: out of memory\n");
        goto done;
    }
    sp_router_add(s->router, SP_HTTP_GET, "/live", h_live, s);
    sp_router_add(s->router, SP_HTTP_GET, "/health", h_health, s);
    sp_router_add(s->router, SP_HTTP_GET, "/stats", h_stats, s);
    sp_router_add(s->router, SP_HTTP_GET, "/v2/health/live", h_v2_live, s);
    sp_router_add(s->router, SP_HTTP_GET, "/v2/health/ready", h_v2_ready, s);
    sp_openai_register(s->router, &s->sv);
    sp_anthropic_register(s->router, &s->sv);
    sp_responses_register(s->router, &s->sv);
    sp_tokenize_routes_register(s->router, &s->sv);
    sp_ollama_register(s->router, &s->sv);
    sp_ollama_chat_register(s->router, &s->sv);
    sp_prometheus_register(s->router, &s->sv);
    sp_tstats_register(s->router, &s->sv);
    sp_kserve_register(s->router, &s->sv);
    sp_repository_register(s->router, &s->sv);
    sp_status_page_register(s->router, &s->sv);
    set_route_access(s);
    /* Before any model is built: a model's response_cache flag needs it. */
    if (s->sv.cfg.response_cache_bytes > 0) {
        if (sp_respcache_create(s->sv.cfg.response_cache_bytes, &s->sv.rcache, err, sizeof err) != SP_OK) {
            fprintf(stderr, "sampan serve: %s\n", err);
            goto done;
        }
        SP_LOG_INFO("event=response_cache bytes=%zu", s->sv.cfg.response_cache_bytes);
    }

    sp_http_server_params_t hp = sp_http_default_server_params();
    hp.limits = s->sv.cfg.limits;
    hp.n_loops = s->sv.cfg.http_threads;
    hp.handler = handle;
    hp.handler_ud = s;
    hp.loop_init = loop_init;
    hp.loop_fini = loop_fini;
    hp.error_fmt = sp_api_error_body;
    hp.on_done = on_done;
    /* TLS (docs/security.md, "Transport"): a key needs its certificate and
     * the reverse, mutual TLS and a TLS port need both; the files are read
     * once here so that a bad one is a usage error (exit 2), not a failure
     * of the running server. */
    hp.tls_cert = s->sv.cfg.tls_cert;
    hp.tls_key = s->sv.cfg.tls_key;
    hp.tls_client_ca = s->sv.cfg.tls_client_ca;
    hp.tls_port = s->sv.cfg.tls_port;
    if (!s->sv.cfg.tls_cert[0] && (s->sv.cfg.tls_key[0] || s->sv.cfg.tls_client_ca[0] || s->sv.cfg.tls_port)) {
        fprintf(stderr, "sampan serve: --tls-key, --tls-client-ca and --tls-port need --tls-cert\n");
        rc = 2;
        goto done;
    }
    if (s->sv.cfg.tls_cert[0] && !s->sv.cfg.tls_key[0]) {
        fprintf(stderr, "sampan serve: --tls-cert needs --tls-key\n");
        rc = 2;
        goto done;
    }
    if (s->sv.cfg.tls_port && s->sv.cfg.tls_port == s->sv.cfg.port) {
        fprintf(stderr, "sampan serve: --tls-port %d: must be another port than --port\n",
                s->sv.cfg.tls_port);
        rc = 2;
        goto done;
    }
    if (s->sv.cfg.tls_cert[0] && sp_http_tls_check(s->sv.cfg.tls_cert, s->sv.cfg.tls_key,
                                                s->sv.cfg.tls_client_ca, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        rc = 2;
        goto done;
    }
    if (sp_cors_has_wildcard(s->sv.cfg.cors_origins)) {
        SP_LOG_WARN("event=cors_wildcard detail=%s",
                    sp_log_str("--cors-origins '*' lets every web page read this server's "
                               "answers from its visitors' browsers"));
    }
    {
        /* Tracing (docs/tracing.md) before the loops: they read its flag. */
        sp_trace_params_t tp = sp_trace_default_params();
        tp.endpoint = s->sv.cfg.otlp_endpoint;
        tp.service_name = s->sv.cfg.otel_service_name;
        tp.sample_ratio = s->sv.cfg.trace_sample_ratio;
        tp.max_queue_spans = s->sv.cfg.otlp_max_queue;
        tp.timeout_ms = (int)(s->sv.cfg.otlp_timeout_s * 1000 + 0.5);
        if (sp_trace_init(&tp, err, sizeof err) != SP_OK) {
            fprintf(stderr, "sampan serve: %s\n", err);
            rc = 2;
            goto done;
        }
    }
    if (start_grpc(s, &rc, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        goto done;
    }
    {
        /* Request preparation (openai.c, kserve.c) runs here, never on a loop: a few
         * workers (they mostly wait), and a bounded queue (beyond it: 429). */
        int n = sp_pool_cpu_count();
        n = n < 2 ? 2 : n > 8 ? 8 : n;
        if (sp_workq_create(n, 256, &s->sv.prep) != SP_OK) {
            fprintf(stderr, "sampan serve: cannot start the request preparation workers\n");
            goto done;
        }
    }
    if (sp_http_server_create(&hp, s->sv.cfg.host, s->sv.cfg.port, &s->sv.http, err, sizeof err) != SP_OK ||
        sp_http_server_start(s->sv.http, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        goto done;
    }
    {
        /* https:// when the main port speaks TLS; with --tls-port the main
         * port stays plain and tls_url names the other. */
        int tls_port = sp_http_server_tls_port(s->sv.http);
        bool tls_main = tls_port != 0 && tls_port == sp_http_server_port(s->sv.http);
        char tls_url[320] = "";
        if (tls_port && !tls_main) {
            snprintf(tls_url, sizeof tls_url, " tls_url=https://%s:%d", s->sv.cfg.host, tls_port);
        }
        SP_LOG_INFO("event=listening url=%s://%s:%d%s%s http_threads=%d models=%d",
                    tls_main ? "https" : "http", s->sv.cfg.host, sp_http_server_port(s->sv.http),
                    tls_url, s->sv.cfg.tls_client_ca[0] ? " client_certs=required" : "",
                    s->sv.cfg.http_threads, s->sv.cfg.n_models);
    }
    if (sp_manager_start(&s->sv, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        goto done;
    }

    /* Wait for a signal (or a failed load); then drain. */
    struct timespec tick = {0, 50 * 1000 * 1000};
    int64_t drain_deadline = 0, delay_until = 0;
    int drain_sig = 0;
    rc = 0;
    for (;;) {
        int sig = sigtimedwait(&sigs, NULL, &tick);
        if (sig == SIGTERM && !delay_until && !drain_deadline && s->sv.cfg.drain_delay_s > 0) {
            SP_LOG_INFO("event=drain_delay signal=%d delay_s=%g detail=%s", sig, s->sv.cfg.drain_delay_s,
                        sp_log_str("not ready, still serving"));
            atomic_store(&s->sv.leaving, true);
            delay_until = sp_time_ns() + (int64_t)(s->sv.cfg.drain_delay_s * 1e9);
            sig = 0;
        } else if ((sig == SIGTERM || sig == SIGINT) && drain_deadline) {
            SP_LOG_WARN("event=forced_exit signal=%d", sig);
            _exit(1);
        }
        if (sig == SIGTERM || sig == SIGINT) {
            drain_sig = sig; /* a signal, or a second one during the delay: drain now */
        } else if (delay_until && !drain_deadline && sp_time_ns() >= delay_until) {
            drain_sig = SIGTERM;
        }
        if (drain_sig && !drain_deadline) {
            sig = drain_sig;
            SP_LOG_INFO("event=draining signal=%d inflight=%lld timeout_s=%g", sig,
                        (long long)sp_http_server_inflight(s->sv.http), s->sv.cfg.drain_timeout_s);
            atomic_store(&s->sv.draining, true);
            sp_http_server_stop_accepting(s->sv.http);
            sp_grpc_stop_accepting(s->grpc);
            drain_deadline = sp_time_ns() + (int64_t)(s->sv.cfg.drain_timeout_s * 1e9) + 1;
        }
        if (sig == SIGHUP) {
            /* Reread what lives in files: the tenants file (on the manager
             * thread) and the certificate (new connections get it; on an
             * error the old one stays). */
            atomic_store(&s->sv.reload_tenants, true);
            if (s->sv.cfg.tls_cert[0]) {
                if (sp_http_server_reload_tls(s->sv.http, err, sizeof err) == SP_OK) {
                    SP_LOG_INFO("event=tls_reloaded cert=%s", sp_log_str(s->sv.cfg.tls_cert));
                } else {
                    SP_LOG_ERROR("event=tls_reload_failed error=%s kept=previous",
                                 sp_log_str(err));
                }
            }
        }
        if (atomic_load(&s->sv.load_failed)) {
            rc = 1;
            break;
        }
        if (drain_deadline) {
            if (sp_http_server_inflight(s->sv.http) == 0) {
                break;
            }
            if (sp_time_ns() > drain_deadline) {
                SP_LOG_WARN("event=drain_timeout inflight=%lld",
                            (long long)sp_http_server_inflight(s->sv.http));
                break;
            }
        }
    }

done:
    /* The manager first (no more loads), then the engines (their jobs end
     * with errors delivered to the loops), then the loops (aborted requests
     * drop their references), then the models. */
    sp_manager_stop(&s->sv);
    sp_registry_stop_all(&s->sv.reg);
    /* Preparations still queued finish and post to their loops, which still
     * run; later requests are refused (503) until the loops stop. */
    sp_workq_shutdown(s->sv.prep);
    sp_http_server_destroy(s->sv.http);
    sp_workq_destroy(s->sv.prep);
    sp_grpc_destroy(s->grpc); /* after the loops: they held its connections */
    sp_trace_shutdown(); /* after the loops: their last spans are queued; a bounded flush */
    sp_registry_fini(&s->sv.reg);
    sp_respcache_destroy(s->sv.rcache); /* after the loops: no hit is outstanding */
    sp_auth_fini(&s->sv.auth);
    sp_router_destroy(s->router);
    SP_LOG_INFO("event=stopped status=%d", rc);
    sp_free(s);
    return rc;
}
