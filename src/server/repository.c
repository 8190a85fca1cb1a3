/*
 * repository.c - `sampan serve --model-repository DIR`: the models of a
 * Triton-style repository (src/repo) served beside the --model ones, and the
 * /v2/repository routes (index, load, unload).
 *
 * Every selected version of a model gets a slot in the server's model table,
 * so the OpenAI `model` field, /v1/models and the KServe routes resolve it
 * like a --model one (the highest ready version answers a bare name).
 *
 * Unload parks a slot rather than freeing it: the protocol handlers hold a
 * slot's scheduler by plain pointer between the readiness check and the
 * submit, with no reference count, so freeing the scheduler or the weights
 * while the server runs could pull them from under a request. A parked slot
 * is not routed (404), its in-flight requests finish on its scheduler, its
 * memory is reused when the same file is loaded again and freed at shutdown.
 * Freeing at unload needs reference counts (next step of issue 6).
 *
 * Load runs on the HTTP loop thread that received the request, under
 * repo_mu, so it blocks that loop for the load time (fine for the small
 * models of this first slice; a loader thread comes with lazy loading).
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "core/alloc.h"
#include "repo/repo.h"
#include "sampan/log.h"
#include "server/kserve.h"
#include "server/server.h"

static bool
explicit_mode(const sp_server_t *s)
{
    return strcmp(s->cfg.model_control_mode, "explicit") == 0;
}

/* The last slot of a repository (name, version): a new slot for the same
 * version is appended when a parked one holds a different file. */
static sp_served_model_t *
find_slot(sp_server_t *s, const char *name, int64_t version)
{
    sp_served_model_t *found = NULL;
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
        sp_served_model_t *m = &s->models[i];
        if (m->from_repo && m->version == version && strcmp(m->name, name) == 0) {
            found = m;
        }
    }
    return found;
}

/* Make one version servable: already READY, re-enable a parked slot of the
 * same file, reload a failed slot, or take a new slot. Caller holds repo_mu. */
static sp_status_t
activate(sp_server_t *s, const char *name, const sp_repo_version_t *v, char *err, size_t err_len)
{
    size_t plen = strlen(v->model_path);
    size_t nlen = strlen(name);
    if (nlen >= sizeof s->models[0].name) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "model name '%s' is too long to serve", name);
    }
    if (plen >= sizeof s->models[0].path) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: path too long", v->model_path);
    }
    sp_served_model_t *m = find_slot(s, name, v->version);
    if (m && m->model && strcmp(m->path, v->model_path) == 0) {
        if (atomic_load(&m->state) != SP_REPO_READY) {
            m->reason[0] = '\0';
            atomic_store(&m->state, SP_REPO_READY);
            atomic_store(&m->ready, true);
            SP_LOG_INFO("event=model_ready model=%s version=%lld parked=1", name,
                        (long long)v->version);
        }
        return SP_OK;
    }
    if (m == NULL || m->model != NULL) {
        int n = atomic_load(&s->n_models);
        if (n >= SP_SERVE_MAX_MODELS) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "model '%s' version %lld: the server holds at most %d model versions",
                           name, (long long)v->version, SP_SERVE_MAX_MODELS);
        }
        m = &s->models[n];
        memset(m, 0, sizeof *m);
        memcpy(m->name, name, nlen + 1);
        m->from_repo = true;
        m->version = v->version;
        snprintf(m->version_str, sizeof m->version_str, "%lld", (long long)v->version);
        atomic_init(&m->ready, false);
        atomic_init(&m->state, SP_REPO_LOADING);
        memcpy(m->path, v->model_path, plen + 1);
        atomic_store(&s->n_models, n + 1); /* publish the filled slot */
    } else {
        memcpy(m->path, v->model_path, plen + 1);
        atomic_store(&m->state, SP_REPO_LOADING);
    }
    if (sp_server_load_slot(s, m, err, err_len) == SP_OK) {
        return SP_OK;
    }
    snprintf(m->reason, sizeof m->reason, "%s", err);
    atomic_store(&m->state, SP_REPO_UNAVAILABLE);
    SP_LOG_ERROR("event=model_load_failed model=%s version=%lld error=\"%s\"", name,
                 (long long)v->version, err);
    return SP_ERR_INVALID;
}

/* Stop routing every version of a name not in keep (NULL: all). */
static void
park(sp_server_t *s, const char *name, const sp_repo_model_t *keep)
{
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
        sp_served_model_t *m = &s->models[i];
        if (!m->from_repo || strcmp(m->name, name) != 0 ||
            atomic_load(&m->state) == SP_REPO_UNAVAILABLE) {
            continue;
        }
        bool kept = false;
        for (int32_t k = 0; keep && k < keep->n_versions; k++) {
            kept |= keep->versions[k].version == m->version;
        }
        if (kept) {
            continue;
        }
        atomic_store(&m->ready, false);
        atomic_store(&m->state, SP_REPO_UNAVAILABLE);
        snprintf(m->reason, sizeof m->reason, "unloaded");
        SP_LOG_INFO("event=model_unloaded model=%s version=%lld", name, (long long)m->version);
    }
}

/* Load the selected versions of one scanned model; the first error lands in err. */
static sp_status_t
load_model(sp_server_t *s, const sp_repo_model_t *rm, char *err, size_t err_len)
{
    if (!rm->ok) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s", rm->reason);
    }
    if (rm->cfg.backend != SP_REPO_BACKEND_LLM) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "model '%s': only the llm backend is served so far", rm->name);
    }
    sp_status_t st = SP_OK;
    int ok = 0;
    for (int32_t k = 0; k < rm->n_versions; k++) {
        const sp_repo_version_t *v = &rm->versions[k];
        char e[512];
        sp_status_t vs = v->model_path ? activate(s, rm->name, v, e, sizeof e)
                                       : sp_errf(e, sizeof e, SP_ERR_INVALID, "%s", v->reason);
        if (vs == SP_OK) {
            ok++;
        } else if (st == SP_OK) {
            st = vs;
            snprintf(err, err_len, "%s", e);
        }
    }
    if (rm->n_versions == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "model '%s' has no version to serve", rm->name);
    }
    park(s, rm->name, rm); /* versions the policy no longer selects */
    (void)ok;
    return st;
}

void
sp_repository_load_startup(sp_server_t *s)
{
    if (s->cfg.model_repository[0] == '\0') {
        return;
    }
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_scan_t *scan = NULL;
    char err[1024];
    if (sp_repo_scan(s->cfg.model_repository, &lim, &scan, err, sizeof err) != SP_OK) {
        SP_LOG_ERROR("event=repository_unusable error=\"%s\"", err);
        atomic_store(&s->load_failed, true);
        return;
    }
    SP_LOG_INFO("event=repository_scanned root=%s models=%d mode=%s", scan->root,
                (int)scan->n_models, s->cfg.model_control_mode);
    if (!explicit_mode(s)) {
        pthread_mutex_lock(&s->repo_mu);
        for (int32_t i = 0; i < scan->n_models; i++) {
            if (load_model(s, &scan->models[i], err, sizeof err) != SP_OK) {
                SP_LOG_WARN("event=repository_model_unavailable model=%s error=\"%s\"",
                            scan->models[i].name, err);
            }
        }
        pthread_mutex_unlock(&s->repo_mu);
    }
    sp_repo_scan_free(scan);
}

/* ------------------------------------------------------------- routes */

/* The request body as JSON, NULL when empty; answers 400 itself on bad JSON. */
static bool
body_json(sp_server_t *s, sp_http_req_t *r, json_t **out)
{
    *out = NULL;
    sp_str_t b = sp_http_req_body(r);
    if (b.len == 0) {
        return true;
    }
    char err[256];
    if (sp_json_parse(b.ptr, b.len, s->cfg.json_depth, out, err, sizeof err) != SP_OK) {
        sp_kserve_error(r, 400, "invalid JSON body: %s", err);
        return false;
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        sp_kserve_error(r, 400, "the body must be a JSON object");
        return false;
    }
    return true;
}

static bool
have_repo(sp_server_t *s, sp_http_req_t *r)
{
    if (s->cfg.model_repository[0] == '\0') {
        sp_kserve_error(r, 400, "no model repository: start the server with --model-repository DIR");
        return false;
    }
    return true;
}

/* POST /v2/repository/index [{"ready": bool}] -> [{"name","version","state","reason"}] */
static void
h_index(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_server_t *s = ud;
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
        sp_kserve_error(r, 500, "cannot read the model repository: %s", err);
        return;
    }
    sp_repo_index_entry_t *e = NULL;
    int32_t n = 0;
    if (sp_repo_index(scan, &e, &n) != SP_OK) {
        sp_repo_scan_free(scan);
        sp_kserve_error(r, 500, "out of memory");
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "[");
    int written = 0;
    pthread_mutex_lock(&s->repo_mu);
    for (int32_t i = 0; i < n; i++) {
        sp_repo_state_t state = e[i].state;
        const char *reason = e[i].reason;
        const sp_served_model_t *m = e[i].version > 0 ? find_slot(s, e[i].name, e[i].version) : NULL;
        if (m) {
            state = (sp_repo_state_t)atomic_load(&m->state);
            reason = m->reason;
        } else if (e[i].version > 0 && reason[0] == '\0') {
            reason = "not loaded";
        }
        if (ready_only && state != SP_REPO_READY) {
            continue;
        }
        sp_jbuf_lit(&b, written++ ? ",{\"name\":" : "{\"name\":");
        sp_jbuf_cstr(&b, e[i].name);
        if (e[i].version > 0) {
            sp_jbuf_printf(&b, ",\"version\":\"%lld\"", (long long)e[i].version);
        }
        sp_jbuf_printf(&b, ",\"state\":\"%s\",\"reason\":", sp_repo_state_name(state));
        sp_jbuf_cstr(&b, reason);
        sp_jbuf_lit(&b, "}");
    }
    pthread_mutex_unlock(&s->repo_mu);
    sp_jbuf_lit(&b, "]");
    sp_free(e);
    sp_repo_scan_free(scan);
    sp_server_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

static bool
control_allowed(sp_server_t *s, sp_http_req_t *r)
{
    if (!have_repo(s, r)) {
        return false;
    }
    if (!explicit_mode(s)) {
        sp_kserve_error(r, 400, "explicit model load / unload needs --model-control-mode explicit");
        return false;
    }
    return true;
}

/* POST /v2/repository/models/{model}/load [{"parameters":{"config":"<json>"}}] */
static void
h_load(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_server_t *s = ud;
    json_t *body;
    if (!control_allowed(s, r) || !body_json(s, r, &body)) {
        return;
    }
    const char *ov = NULL;
    size_t ov_len = 0;
    json_t *params = body ? json_object_get(body, "parameters") : NULL;
    json_t *cfg = json_is_object(params) ? json_object_get(params, "config") : NULL;
    if (cfg) {
        if (!json_is_string(cfg)) {
            json_decref(body);
            sp_kserve_error(r, 400, "parameters.config must be a string holding JSON");
            return;
        }
        ov = json_string_value(cfg);
        ov_len = json_string_length(cfg);
    }
    sp_str_t name = sp_route_param(p, "model");
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_model_t rm;
    memset(&rm, 0, sizeof rm);
    char err[1024];
    pthread_mutex_lock(&s->repo_mu);
    sp_status_t st = sp_repo_scan_model(s->cfg.model_repository, name.ptr, name.len, &lim, ov,
                                        ov_len, &rm, err, sizeof err);
    json_decref(body);
    if (st == SP_OK) {
        st = load_model(s, &rm, err, sizeof err);
        sp_repo_model_free(&rm);
        pthread_mutex_unlock(&s->repo_mu);
        if (st == SP_OK) {
            sp_http_respond(r, 200, "application/json", "{}", 2);
        } else {
            sp_kserve_error(r, 400, "failed to load model: %s", err);
        }
        return;
    }
    pthread_mutex_unlock(&s->repo_mu);
    sp_kserve_error(r, st == SP_ERR_NOT_FOUND ? 404 : 400, "%s", err);
}

/* POST /v2/repository/models/{model}/unload */
static void
h_unload(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_server_t *s = ud;
    if (!control_allowed(s, r)) {
        return;
    }
    sp_str_t name = sp_route_param(p, "model");
    char err[256];
    if (sp_repo_check_name_n(name.ptr, name.len, err, sizeof err) != SP_OK) {
        sp_kserve_error(r, 400, "model name: %s", err);
        return;
    }
    char nm[SP_REPO_NAME_MAX + 1];
    memcpy(nm, name.ptr, name.len);
    nm[name.len] = '\0';
    pthread_mutex_lock(&s->repo_mu);
    bool known = false;
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
        known |= s->models[i].from_repo && strcmp(s->models[i].name, nm) == 0;
    }
    if (known) {
        park(s, nm, NULL);
    }
    pthread_mutex_unlock(&s->repo_mu);
    if (!known) {
        sp_kserve_error(r, 404, "model '%s' is not loaded from the repository", nm);
        return;
    }
    sp_http_respond(r, 200, "application/json", "{}", 2);
}

void
sp_repository_register(sp_router_t *rt, sp_server_t *s)
{
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/index", h_index, s);
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/models/{model}/load", h_load, s);
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/models/{model}/unload", h_unload, s);
}
