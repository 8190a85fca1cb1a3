/*
 * serve.c - `sampan serve`: wiring, health routes, signals and drain.
 *
 * Start-up: parse the configuration, bind and start the event loops first
 * (so /live answers at once and /health says 503 while loading), then load
 * the models on a loader thread and turn ready.
 *
 * Shutdown (SIGTERM or SIGINT): stop accepting (the listening sockets close,
 * idle keep-alive connections close), report not ready, let requests in
 * flight finish until --drain-timeout, then stop the engines (what is still
 * running ends with an error event), stop the loops and exit 0. A second
 * signal exits at once with status 1. Signals are taken synchronously with
 * sigtimedwait on the main thread (blocked everywhere else), so no handler
 * runs in signal context.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "repo/repo.h"
#include "server/kserve.h"
#include "server/server.h"

/* ---------------------------------------------------------------- helpers */

/* A name may have several slots (repository versions): the ready one with the
 * highest version wins, then one still loading; UNAVAILABLE slots (failed or
 * unloaded) are not routed, so they answer 404 like an unknown name. */
sp_served_model_t *
sp_server_find_model(sp_server_t *s, const char *name, size_t len)
{
    sp_served_model_t *best = NULL;
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
        sp_served_model_t *m = &s->models[i];
        if (strlen(m->name) != len || memcmp(m->name, name, len) != 0 ||
            atomic_load(&m->state) == SP_REPO_UNAVAILABLE) {
            continue;
        }
        bool r = atomic_load(&m->ready);
        if (best == NULL || (r && !atomic_load(&best->ready)) ||
            (r == atomic_load(&best->ready) && m->version > best->version)) {
            best = m;
        }
    }
    return best;
}

sp_served_model_t *
sp_server_find_version(sp_server_t *s, const char *name, size_t len, sp_str_t version)
{
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
        sp_served_model_t *m = &s->models[i];
        if (strlen(m->name) == len && memcmp(m->name, name, len) == 0 &&
            atomic_load(&m->state) != SP_REPO_UNAVAILABLE && sp_str_eq_c(version, m->version_str)) {
            return m;
        }
    }
    return NULL;
}

sp_mailbox_t *
sp_server_mailbox(sp_http_req_t *r)
{
    sp_loop_ctx_t *lc = sp_http_loop_user(sp_http_req_loop(r));
    return lc->mb;
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
sp_server_error(sp_http_req_t *r, int status, const char *type, const char *param,
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
sp_server_reply_json(sp_http_req_t *r, int status, const sp_jbuf_t *b)
{
    if (b->oom || b->p == NULL) {
        sp_server_error(r, 500, NULL, NULL, NULL, "out of memory while writing the response");
        return;
    }
    sp_http_respond(r, status, "application/json", b->p, b->len);
}

static size_t
error_fmt(int status, const char *message, char *buf, size_t cap)
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

/* ----------------------------------------------------------------- health */

static bool
is_ready(const sp_server_t *s)
{
    return atomic_load(&((sp_server_t *)s)->ready) && !atomic_load(&((sp_server_t *)s)->draining);
}

static void
h_live(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_http_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

static void
h_health(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_server_t *s = ud;
    if (is_ready(s)) {
        sp_http_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15);
        return;
    }
    const char *why = atomic_load(&s->draining) ? "draining" : "loading";
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
    sp_http_respond(r, is_ready(ud) ? 200 : 503, NULL, "", 0);
}

/* GET /stats: the schedulers' counters, one object per loaded model (docs/api.md). */
static void
h_stats(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_server_t *s = ud;
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"models\":{");
    bool first = true;
    for (int i = 0; i < s->n_models; i++) {
        sp_served_model_t *m = &s->models[i];
        if (!atomic_load(&m->ready) || m->sched == NULL) {
            continue;
        }
        sp_sched_stats_t st;
        sp_sched_get_stats(m->sched, &st);
        if (!first) {
            sp_jbuf_lit(&b, ",");
        }
        first = false;
        sp_jbuf_str(&b, m->name, strlen(m->name));
        char buf[1536];
        int n = snprintf(
            buf, sizeof buf,
            ":{\"running\":%lld,\"waiting\":%lld,"
            "\"running_by_tier\":{\"premium\":%lld,\"standard\":%lld,\"batch\":%lld},"
            "\"waiting_by_tier\":{\"premium\":%lld,\"standard\":%lld,\"batch\":%lld},"
            "\"jobs_done\":%lld,\"jobs_cancelled\":%lld,\"tokens_generated\":%lld,"
            "\"prompt_tokens\":%lld,\"prompt_tokens_cached\":%lld,\"preemptions\":%lld,"
            "\"prefix_lookups\":%lld,\"prefix_hits\":%lld,\"prefix_hit_rate\":%.4f,"
            "\"kv_blocks_total\":%lld,\"kv_blocks_used\":%lld,\"kv_blocks_cached\":%lld,"
            "\"kv_blocks_free\":%lld,\"kv_evictions\":%lld,\"steps\":%lld,"
            "\"last_step_seqs\":%lld,\"last_step_tokens\":%lld,\"mean_step_seqs\":%.3f,"
            "\"mean_step_tokens\":%.3f,\"step_budget\":%lld,\"step_p99_ms\":%.4f,"
            "\"tpot_target_ms\":%.4f,\"budget_decreases\":%lld,\"budget_increases\":%lld}",
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
            (long long)st.kv_evictions, (long long)st.steps, (long long)st.last_step_seqs,
            (long long)st.last_step_rows, st.mean_step_seqs, st.mean_step_rows,
            (long long)st.step_budget, st.step_p99_ms, st.tpot_target_ms,
            (long long)st.budget_decreases, (long long)st.budget_increases);
        sp_jbuf_raw(&b, buf, n > 0 && (size_t)n < sizeof buf ? (size_t)n : 0);
    }
    sp_jbuf_lit(&b, "}}");
    sp_server_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

/* Routes that answer without a key and while draining. */
static bool
is_public(sp_str_t path)
{
    return sp_str_eq_c(path, "/live") || sp_str_eq_c(path, "/health") ||
           sp_str_eq_c(path, "/v2/health/live") || sp_str_eq_c(path, "/v2/health/ready");
}

/* Constant-time comparison over the longer length (no early exit). */
static bool
key_matches(sp_str_t got, const char *want)
{
    size_t wl = strlen(want), n = got.len > wl ? got.len : wl;
    unsigned diff = (unsigned)(got.len ^ wl);
    for (size_t i = 0; i < n; i++) {
        unsigned char a = i < got.len ? (unsigned char)got.ptr[i] : 0;
        unsigned char b = i < wl ? (unsigned char)want[i] : 0;
        diff |= (unsigned)(a ^ b);
    }
    return diff == 0;
}

static void
handle(sp_http_req_t *r, void *ud)
{
    sp_server_t *s = ud;
    sp_str_t path = sp_http_req_path(r);
    int64_t t0 = s->cfg.verbose ? sp_time_ns() : 0;
    if (!is_public(path)) {
        if (s->cfg.api_key[0]) {
            sp_str_t auth = sp_http_req_header(r, "authorization");
            sp_str_t key = sp_http_req_header(r, "x-api-key");
            if (auth.ptr && auth.len > 7 && strncasecmp(auth.ptr, "Bearer ", 7) == 0) {
                key.ptr = auth.ptr + 7;
                key.len = auth.len - 7;
            }
            if (key.ptr == NULL || !key_matches(key, s->cfg.api_key)) {
                sp_http_add_header(r, "WWW-Authenticate", "Bearer");
                sp_server_error(r, 401, NULL, NULL, "invalid_api_key", "invalid or missing API key");
                return;
            }
        }
        if (atomic_load(&s->draining)) {
            sp_http_add_header(r, "Retry-After", "1");
            sp_server_error(r, 503, NULL, NULL, "shutting_down", "the server is shutting down");
            return;
        }
    }
    int rc = sp_router_dispatch(s->router, r);
    if (rc == 404) {
        sp_server_error(r, 404, NULL, NULL, "not_found", "no route for %s %.*s",
                        sp_http_req_method_str(r), (int)(path.len > 200 ? 200 : path.len), path.ptr);
    } else if (rc == 405) {
        sp_server_error(r, 405, NULL, NULL, "method_not_allowed", "%s is not allowed on this route",
                        sp_http_req_method_str(r));
    }
    if (s->cfg.verbose) {
        /* The path is client data: print it escaped (no log injection). */
        sp_jbuf_t p;
        sp_jbuf_init(&p);
        sp_jbuf_str(&p, path.ptr, path.len > 200 ? 200 : path.len);
        SP_LOG_INFO("event=request req=%llu peer=%s method=%s path=%s handler_ms=%.3f",
                    (unsigned long long)sp_http_req_id(r), sp_http_req_peer(r),
                    sp_http_req_method_str(r), p.p ? p.p : "\"\"", (double)(sp_time_ns() - t0) / 1e6);
        sp_jbuf_free(&p);
    }
}

/* ------------------------------------------------------------- loops */

static void *
loop_init(sp_http_loop_t *loop, void *ud)
{
    sp_loop_ctx_t *lc = sp_calloc(1, sizeof *lc);
    if (lc == NULL) {
        return NULL;
    }
    lc->srv = ud;
    lc->mb = sp_mailbox_create(loop);
    if (lc->mb == NULL) {
        sp_free(lc);
        return NULL;
    }
    return lc;
}

static void
loop_fini(sp_http_loop_t *loop, void *user, void *ud)
{
    sp_loop_ctx_t *lc = user;
    if (lc) {
        sp_mailbox_destroy(lc->mb);
        sp_free(lc);
    }
}

/* ------------------------------------------------------------- models */

sp_status_t
sp_server_load_slot(sp_server_t *s, sp_served_model_t *m, char *err, size_t err_len)
{
    int64_t t0 = sp_time_ns();
    if (sp_model_load(m->path, &m->model, err, err_len) != SP_OK) {
        return SP_ERR_INVALID;
    }
    m->tok = sp_model_tokenizer(m->model);
    const char *tname = s->cfg.chat_template[0] ? s->cfg.chat_template : NULL;
    if (sp_chat_template_from_gguf(sp_model_gguf(m->model), tname, &m->tmpl, m->tmpl_error,
                                   sizeof m->tmpl_error) != SP_OK) {
        if (tname) {
            snprintf(err, err_len, "%s", m->tmpl_error);
            goto fail;
        }
        SP_LOG_WARN("event=chat_template_unusable model=%s error=\"%s\"", m->name, m->tmpl_error);
        m->tmpl = NULL;
    }
    sp_sched_params_t sp = sp_sched_default_params();
    sp.n_slots = s->cfg.parallel;
    sp.n_ctx = s->cfg.ctx_size;
    sp.n_threads = s->cfg.threads;
    sp.max_queue = s->cfg.queue;
    sp.prefill_chunk = s->cfg.step_tokens;
    sp.kv_blocks = s->cfg.kv_blocks;
    sp.kv_f16 = s->cfg.kv_f16;
    sp.tpot_target_ms = s->cfg.tpot_target_ms;
    sp.tier_queue[0] = s->cfg.queue_batch;
    sp.tier_queue[1] = s->cfg.queue_standard;
    sp.tier_queue[2] = s->cfg.queue_premium;
    if (sp_sched_create(m->model, &sp, &m->sched, err, err_len) != SP_OK) {
        goto fail;
    }
    m->n_ctx = sp_sched_n_ctx(m->sched);
    m->created = (int64_t)time(NULL);
    m->reason[0] = '\0';
    atomic_store(&m->state, SP_REPO_READY);
    atomic_store(&m->ready, true);
    SP_LOG_INFO("event=model_ready model=%s version=%lld file=%s ctx=%lld parallel=%d template=%s "
                "load_ms=%.1f",
                m->name, (long long)m->version, m->path, (long long)m->n_ctx, s->cfg.parallel,
                m->tmpl ? sp_chat_template_name(m->tmpl) : "none",
                (double)(sp_time_ns() - t0) / 1e6);
    return SP_OK;
fail:
    sp_chat_template_destroy(m->tmpl);
    m->tmpl = NULL;
    sp_model_free(m->model);
    m->model = NULL;
    m->tok = NULL;
    return SP_ERR_INVALID;
}

static void *
loader_main(void *arg)
{
    sp_server_t *s = arg;
    char err[512];
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
        sp_served_model_t *m = &s->models[i];
        if (sp_server_load_slot(s, m, err, sizeof err) != SP_OK) {
            SP_LOG_ERROR("event=model_load_failed model=%s error=\"%s\"", m->name, err);
            atomic_store(&s->load_failed, true);
            return NULL;
        }
    }
    /* Repository models: one that fails is reported in the index, the rest serve. */
    sp_repository_load_startup(s);
    if (atomic_load(&s->load_failed)) {
        return NULL;
    }
    atomic_store(&s->ready, true);
    SP_LOG_INFO("event=ready models=%d", atomic_load(&s->n_models));
    return NULL;
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
    if (sp_serve_config_parse(argc, argv, &s->cfg, &help, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n%s", err, sp_serve_usage);
        sp_free(s);
        return 2;
    }
    if (help) {
        fputs(sp_serve_usage, stdout);
        sp_free(s);
        return 0;
    }
    sp_json_init();
    pthread_mutex_init(&s->repo_mu, NULL);
    s->n_models = s->cfg.n_models;
    for (int i = 0; i < s->n_models; i++) {
        atomic_init(&s->models[i].state, SP_REPO_LOADING);
        snprintf(s->models[i].version_str, sizeof s->models[i].version_str, "%s",
                 SP_KSERVE_MODEL_VERSION);
        /* Same-sized NUL-terminated arrays (config.h). */
        memcpy(s->models[i].name, s->cfg.models[i].name, sizeof s->models[i].name);
        memcpy(s->models[i].path, s->cfg.models[i].path, sizeof s->models[i].path);
    }
    s->started_unix = (int64_t)time(NULL);

    /* Signals: SIGPIPE ignored (writes to closed sockets return EPIPE);
     * SIGTERM and SIGINT blocked in every thread and taken by sigtimedwait. */
    signal(SIGPIPE, SIG_IGN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    int rc = 1;
    pthread_t loader;
    bool loader_started = false;
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
    sp_openai_register(s->router, s);
    sp_kserve_register(s->router, s);
    sp_repository_register(s->router, s);

    sp_http_server_params_t hp = sp_http_default_server_params();
    hp.limits = s->cfg.limits;
    hp.n_loops = s->cfg.http_threads;
    hp.handler = handle;
    hp.handler_ud = s;
    hp.loop_init = loop_init;
    hp.loop_fini = loop_fini;
    hp.error_fmt = error_fmt;
    if (sp_http_server_create(&hp, s->cfg.host, s->cfg.port, &s->http, err, sizeof err) != SP_OK ||
        sp_http_server_start(s->http, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan serve: %s\n", err);
        goto done;
    }
    SP_LOG_INFO("event=listening url=http://%s:%d http_threads=%d models=%d", s->cfg.host,
                sp_http_server_port(s->http), s->cfg.http_threads, s->n_models);
    if (pthread_create(&loader, NULL, loader_main, s) != 0) {
        fprintf(stderr, "sampan serve: cannot start the loader thread\n");
        goto done;
    }
    loader_started = true;

    /* Wait for a signal (or a failed load); then drain. */
    struct timespec tick = {0, 50 * 1000 * 1000};
    int64_t drain_deadline = 0;
    rc = 0;
    for (;;) {
        int sig = sigtimedwait(&sigs, NULL, &tick);
        if (sig == SIGTERM || sig == SIGINT) {
            if (drain_deadline) {
                SP_LOG_WARN("event=forced_exit signal=%d", sig);
                _exit(1);
            }
            SP_LOG_INFO("event=draining signal=%d inflight=%lld timeout_s=%g", sig,
                        (long long)sp_http_server_inflight(s->http), s->cfg.drain_timeout_s);
            atomic_store(&s->draining, true);
            sp_http_server_stop_accepting(s->http);
            drain_deadline = sp_time_ns() + (int64_t)(s->cfg.drain_timeout_s * 1e9) + 1;
        }
        if (atomic_load(&s->load_failed)) {
            rc = 1;
            break;
        }
        if (drain_deadline) {
            if (sp_http_server_inflight(s->http) == 0) {
                break;
            }
            if (sp_time_ns() > drain_deadline) {
                SP_LOG_WARN("event=drain_timeout inflight=%lld",
                            (long long)sp_http_server_inflight(s->http));
                break;
            }
        }
    }

done:
    if (loader_started) {
        pthread_join(loader, NULL);
    }
    /* Engines first (their jobs end with errors delivered to the loops), then the loops. */
    for (int i = 0; i < s->n_models; i++) {
        sp_sched_stop(s->models[i].sched);
    }
    sp_http_server_destroy(s->http);
    for (int i = 0; i < s->n_models; i++) {
        sp_sched_destroy(s->models[i].sched);
        sp_chat_template_destroy(s->models[i].tmpl);
        sp_model_free(s->models[i].model);
    }
    sp_router_destroy(s->router);
    SP_LOG_INFO("event=stopped status=%d", rc);
    pthread_mutex_destroy(&s->repo_mu);
    sp_free(s);
    return rc;
}
