/*
 * repository.c - the model repository routes (KServe v2 repository
 * extension): POST /v2/repository/index, .../models/{model}/load and
 * .../unload, plus the redaction of reasons before clients see them.
 *
 * The index is read here (a fresh scan of the repository joined with the
 * registry's states); loads and unloads, of models and of LoRA adapters
 * ("<model>:<adapter>"), are commands for the manager thread
 * (serving/manager.h). A request waiting for one polls its wait record from
 * a timer on its own loop every few milliseconds, so no loop blocks for a
 * load; a client that goes away drops its reference and the manager's
 * answer is discarded.
 *
 * Threads: the routes run on the loop threads; the manager does the work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <jansson.h>

#include "api/api.h"
#include "api/kserve.h"
#include "core/alloc.h"
#include "serving/adapters.h"
#include "serving/manager.h"
#include "serving/repo.h"


/* The request body as JSON, NULL when empty; answers 400 itself on bad JSON. */
static bool
body_json(sp_serving_t *s, sp_http_req_t *r, json_t **out)
{
    *out = NULL;
    sp_str_t b = sp_http_req_body(r);
    if (b.len == 0) {
        return true;
    }
    char err[256];
    if (sp_json_parse(b.ptr, b.len, s->cfg.json_depth, out, err, sizeof err) != SP_OK) {
        sp_api_error_kserve(r, 400, "invalid JSON body: %s", err);
        return false;
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        sp_api_error_kserve(r, 400, "the body must be a JSON object");
        return false;
    }
    return true;
}

static bool
have_repo(sp_serving_t *s, sp_http_req_t *r)
{
    if (s->cfg.model_repository[0] == '\0') {
        sp_api_error_kserve(r, 400, "no model repository: start the server with --model-repository DIR");
        return false;
    }
    return true;
}

static void
index_entry(sp_jbuf_t *b, int *written, const char *name, int64_t version, sp_repo_state_t state,
            const char *reason)
{
    sp_jbuf_lit(b, (*written)++ ? ",{\"name\":" : "{\"name\":");
    sp_jbuf_cstr(b, name);
    if (version > 0) {
        sp_jbuf_printf(b, ",\"version\":\"%lld\"", (long long)version);
    }
    sp_jbuf_printf(b, ",\"state\":\"%s\",\"reason\":", sp_repo_state_name(state));
    sp_jbuf_cstr(b, reason);
    sp_jbuf_lit(b, "}");
}

/* POST /v2/repository/index [{"ready": bool}] -> [{"name","version","state","reason"}]:
 * what the repository holds now (a fresh scan) with the registry's state,
 * plus versions still served that the scan no longer selects. */
static void
h_index(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)p;
    sp_serving_t *s = ud;
    json_t *body;
    if (!have_repo(s, r) || !body_json(s, r, &body)) {
        return;
    }
    bool ready_only = body && json_is_true(json_object_get(body, "ready"));
    json_decref(body);
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_scan_t *scan = NULL;
    char err[1024];
    if (sp_repo_scan(s->cfg.model_repository, &lim, &scan, err, sizeof err) != SP_OK) {
        sp_api_error_kserve(r, 500, "cannot read the model repository: %s", err);
        return;
    }
    sp_repo_index_entry_t *e = NULL;
    int32_t n = 0;
    if (sp_repo_index(scan, &e, &n) != SP_OK) {
        sp_repo_scan_free(scan);
        sp_api_error_kserve(r, 500, "out of memory");
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "[");
    int written = 0;
    sp_registry_t *reg = &s->reg;
    bool seen[SP_SERVE_MAX_ENTRIES] = {0};
    pthread_mutex_lock(&reg->mu);
    for (int32_t i = 0; i < n; i++) {
        sp_repo_state_t state = e[i].state;
        const char *reason = e[i].reason;
        sp_model_entry_t *me = e[i].version > 0 ? sp_registry_entry(reg, e[i].name, e[i].version, false)
                                                : NULL;
        if (me && me->from_repo) {
            seen[me - reg->entry] = true;
            state = me->state;
            reason = me->reason;
        } else if (e[i].version > 0 && reason[0] == '\0') {
            reason = "not loaded";
        }
        if (!ready_only || state == SP_REPO_READY) {
            char red[1024];
            sp_api_redact(s, reason, red, sizeof red);
            index_entry(&b, &written, e[i].name, e[i].version, state, red);
        }
    }
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        const sp_model_entry_t *me = &reg->entry[i];
        if (me->used && me->from_repo && !seen[i] && me->live &&
            (!ready_only || me->state == SP_REPO_READY)) {
            index_entry(&b, &written, me->name, me->version, me->state,
                        "still served: the repository no longer selects it, and no selected "
                        "version could load");
        }
    }
    pthread_mutex_unlock(&reg->mu);
    sp_jbuf_lit(&b, "]");
    sp_free(e);
    sp_repo_scan_free(scan);
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

static bool
control_allowed(sp_serving_t *s, sp_http_req_t *r)
{
    if (!have_repo(s, r)) {
        return false;
    }
    if (strcmp(s->cfg.model_control_mode, "explicit") != 0) {
        sp_api_error_kserve(r, 400, "explicit model load / unload needs --model-control-mode explicit");
        return false;
    }
    return true;
}

/* A load or unload request waiting for the manager. */
typedef struct ctl_wait {
    sp_serving_t *s;
    sp_http_req_t *r;
    sp_manager_wait_t *w;
    struct event *tick;
} ctl_wait_t;

#define CTL_TICK_US 2000

static void
ctl_free(ctl_wait_t *c)
{
    if (c->tick) {
        event_free(c->tick);
    }
    sp_manager_wait_release(c->w);
    sp_free(c);
}

static void
ctl_abort(sp_http_req_t *r, void *ud)
{
    (void)r;
    ctl_free(ud);
}

static void
ctl_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ctl_wait_t *c = arg;
    sp_status_t st;
    const char *err;
    if (!sp_manager_wait_done(c->w, &st, &err)) {
        struct timeval tv = {0, CTL_TICK_US};
        evtimer_add(c->tick, &tv);
        return;
    }
    sp_http_req_t *r = c->r;
    sp_http_req_on_abort(r, NULL, NULL);
    if (st == SP_OK) {
        sp_http_respond(r, 200, "application/json", "{}", 2);
    } else {
        char red[1024];
        sp_api_redact(c->s, err, red, sizeof red);
        sp_api_error_kserve(r, sp_status_http(st), "%s%s",
                            st == SP_ERR_INVALID ? "failed to load model: " : "", red);
    }
    ctl_free(c);
}

/* Hand a command to the manager and answer when it is done. */
static void
submit_cmd(sp_serving_t *s, sp_http_req_t *r, sp_manager_op_t op, sp_str_t name,
           const char *override, size_t override_len)
{
    ctl_wait_t *c = sp_calloc(1, sizeof *c);
    struct event_base *base = sp_http_loop_base(sp_http_req_loop(r));
    if (c == NULL || (c->tick = evtimer_new(base, ctl_tick, c)) == NULL ||
        sp_manager_submit(s, op, name.ptr, name.len, override, override_len, &c->w) != SP_OK) {
        if (c && c->tick) {
            event_free(c->tick);
        }
        sp_free(c);
        sp_api_error_kserve(r, 503, "out of memory");
        return;
    }
    c->s = s;
    c->r = r;
    sp_http_req_on_abort(r, ctl_abort, c);
    struct timeval tv = {0, CTL_TICK_US};
    evtimer_add(c->tick, &tv);
}

/* A model name from a route; answers 400 itself when it is not one. */
static bool
name_ok(sp_http_req_t *r, sp_str_t name)
{
    char err[256];
    if (sp_repo_path_check_name_n(name.ptr, name.len, err, sizeof err) != SP_OK) {
        sp_api_error_kserve(r, 400, "model name: %s", err);
        return false;
    }
    return true;
}

/*
 * "<model>:<adapter>" on the load and unload routes means a LoRA adapter
 * (adapters.h) unless the repository has a model of that whole name. Adapters
 * load and unload in every control mode: they are not versions, and the
 * modes only say who decides which versions serve. Answers itself for a
 * malformed name and returns true when the route is an adapter's.
 */
static bool
adapter_route(sp_serving_t *s, sp_http_req_t *r, sp_str_t name, sp_manager_op_t op)
{
    const char *colon = name.len ? memrchr(name.ptr, ':', name.len) : NULL;
    if (colon == NULL || s->cfg.model_repository[0] == '\0' || name.len > SP_REPO_NAME_MAX) {
        return false;
    }
    char rel[SP_REPO_NAME_MAX + 16], path[4096], err[256];
    snprintf(rel, sizeof rel, "%.*s", (int)name.len, name.ptr); /* its model directory */
    if (sp_repo_path_check_name_n(name.ptr, name.len, err, sizeof err) == SP_OK &&
        sp_repo_path_resolve(s->repo_real, rel, path, sizeof path, err, sizeof err) == SP_OK) {
        return false; /* a model with a ':' in its name */
    }
    const size_t blen = (size_t)(colon - name.ptr), alen = name.len - blen - 1;
    if (blen == 0 || sp_repo_path_check_name_n(name.ptr, blen, err, sizeof err) != SP_OK ||
        !sp_adapters_name_ok(colon + 1, alen)) {
        sp_api_error_kserve(r, 400, "adapter name: expected <model>:<adapter> with an adapter name of "
                            "1 to %d characters from [A-Za-z0-9._-], not starting with '.'",
                            SP_ADAPTER_NAME_MAX);
        return true;
    }
    submit_cmd(s, r, op, name, NULL, 0);
    return true;
}

/* POST /v2/repository/models/{model}/load [{"parameters":{"config":"<json>"}}] */
static void
h_load(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *body;
    if (adapter_route(s, r, sp_router_param(p, "model"), SP_MANAGER_ADAPTER_LOAD)) {
        return;
    }
    if (!control_allowed(s, r) || !body_json(s, r, &body)) {
        return;
    }
    json_t *params = body ? json_object_get(body, "parameters") : NULL;
    json_t *cfg = json_is_object(params) ? json_object_get(params, "config") : NULL;
    if (cfg && !json_is_string(cfg)) {
        json_decref(body);
        sp_api_error_kserve(r, 400, "parameters.config must be a string holding JSON");
        return;
    }
    const sp_str_t name = sp_router_param(p, "model");
    if (name_ok(r, name)) {
        submit_cmd(s, r, SP_MANAGER_LOAD, name, cfg ? json_string_value(cfg) : NULL,
                   cfg ? json_string_length(cfg) : 0);
    }
    json_decref(body);
}

/* POST /v2/repository/models/{model}/unload */
static void
h_unload(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    if (adapter_route(s, r, sp_router_param(p, "model"), SP_MANAGER_ADAPTER_UNLOAD) ||
        !control_allowed(s, r)) {
        return;
    }
    const sp_str_t name = sp_router_param(p, "model");
    if (name_ok(r, name)) {
        submit_cmd(s, r, SP_MANAGER_UNLOAD, name, NULL, 0);
    }
}

void
sp_repository_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/index", h_index, s);
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/models/{model}/load", h_load, s);
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/models/{model}/unload", h_unload, s);
}
