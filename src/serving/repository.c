/*
 * repository.c - the manager thread and the /v2/repository routes.
 *
 * One thread (the manager) changes what is served: the start-up loads (the
 * --model files, then the repository in modes none and poll), the rescans of
 * poll mode, explicit load and unload requests, on-demand loads started by a
 * request for a model that is not loaded (load_on_demand, or evicted), and
 * freeing models whose last reference went away. Doing all of it on one
 * thread makes every decision sequential (no two loads race for the same
 * memory or the same entry) and keeps slow work off the event loops.
 *
 * Reconciling a model: for each version the version policy selects, the
 * model is built when the entry has nothing loaded from the same files
 * and config (a signature of their stamps and of the load request's
 * override); the new model is published beside the old one, then versions
 * the policy no longer selects are unloaded, but only once a selected
 * version is READY, so a corrupt or too big new version leaves the old one
 * serving while the index reports the error. A version that failed is not
 * retried until its files or config change (or an explicit load asks).
 *
 * HTTP requests that wait for the manager (load, unload) hold a small
 * shared record that the manager fills; a timer on the request's loop looks
 * at it every few milliseconds, so no loop blocks for a load.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <event2/event.h>
#include <jansson.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "serving/repo.h"
#include "sampan/log.h"
#include "serving/adapters.h"
#include "api/kserve.h"
#include "api/api.h"

#define DEVICE_REFRESH_NS 1000000000LL /* device figures and the tenants file, every second */

typedef enum cmd_kind { CMD_LOAD, CMD_UNLOAD, CMD_DEMAND, CMD_LORA_LOAD, CMD_LORA_UNLOAD } cmd_kind_t;

/* What an HTTP request waits for: shared by the manager and the request. */
typedef struct mgr_wait {
    atomic_int refs;
    atomic_bool done;
    int status;            /* HTTP status of the answer */
    char err[1024];        /* "" on success */
} mgr_wait_t;

struct sp_mgr_cmd {
    cmd_kind_t kind;
    char name[SP_REPO_NAME_MAX + 1];
    int64_t version;       /* CMD_DEMAND */
    char *override;        /* CMD_LOAD: config override (JSON text) or NULL */
    mgr_wait_t *wait;      /* CMD_LOAD, CMD_UNLOAD */
    sp_mgr_cmd_t *next;
};

static bool
mode_is(const sp_serving_t *s, const char *mode)
{
    return strcmp(s->cfg.model_control_mode, mode) == 0;
}

static void
wait_release(mgr_wait_t *w)
{
    if (w && atomic_fetch_sub(&w->refs, 1) == 1) {
        sp_free(w);
    }
}

static void
wait_finish(mgr_wait_t *w, int status, const char *err)
{
    if (w == NULL) {
        return;
    }
    w->status = status;
    snprintf(w->err, sizeof w->err, "%s", err ? err : "");
    atomic_store(&w->done, true);
    wait_release(w);
}

static void
cmd_free(sp_mgr_cmd_t *c)
{
    sp_free(c->override);
    sp_free(c);
}

/* Queue a command (reg.mu held). */
static void
push_locked(sp_serving_t *s, sp_mgr_cmd_t *c)
{
    c->next = NULL;
    if (s->cmd_tail) {
        s->cmd_tail->next = c;
    } else {
        s->cmd_head = c;
    }
    s->cmd_tail = c;
    pthread_cond_broadcast(&s->reg.cv);
}

void
sp_repository_demand_locked(sp_serving_t *s, sp_model_entry_t *e)
{
    sp_mgr_cmd_t *c = sp_calloc(1, sizeof *c);
    if (c == NULL) {
        e->state = SP_REPO_UNAVAILABLE;
        snprintf(e->reason, sizeof e->reason, "out of memory queueing the load");
        return;
    }
    c->kind = CMD_DEMAND;
    snprintf(c->name, sizeof c->name, "%s", e->name);
    c->version = e->version;
    push_locked(s, c);
}

/* ------------------------------------------------------------ reconcile */

static uint64_t
mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xBF58476D1CE4E5B9ull;
}

static uint64_t
signature(const sp_repo_model_t *rm, const sp_repo_version_t *v, const char *override)
{
    uint64_t h = mix(mix(0x5A4D5041ull, v->stamp), rm->config_stamp);
    for (const char *p = override; p && *p; p++) {
        h = mix(h, (unsigned char)*p);
    }
    return h;
}

/* Drop the model of e (unload, eviction by policy, removal): it stops being
 * routed now and is freed when its last request ends. */
static void
retire(sp_serving_t *s, sp_model_entry_t *e, const char *why)
{
    sp_registry_t *r = &s->reg;
    pthread_mutex_lock(&r->mu);
    sp_served_model_t *old = e->live;
    e->live = NULL;
    e->state = SP_REPO_UNAVAILABLE;
    e->on_demand = false;
    e->demand_failed = false;
    e->stale_failed = false;
    snprintf(e->reason, sizeof e->reason, "%s", why);
    pthread_mutex_unlock(&r->mu);
    if (old) {
        SP_LOG_INFO("event=model_unloaded model=%s version=%lld reason=%s in_flight=%d",
                    sp_log_str(old->name), (long long)old->version, sp_log_str(why),
                    atomic_load(&old->refs) - 1);
        sp_served_release(old);
    }
}

enum { LOAD_LAZY_OK = 1, LOAD_RETRY_FAILED = 2, LOAD_FORCE = 4 };

/* Serve one selected version (see the file comment). SP_OK when it is READY
 * (or registered to load on demand). */
static sp_status_t
load_version(sp_serving_t *s, const sp_repo_model_t *rm, const sp_repo_version_t *v,
             const char *override, int flags, char *err, size_t err_len)
{
    sp_registry_t *r = &s->reg;
    uint64_t sig = signature(rm, v, override);
    pthread_mutex_lock(&r->mu);
    sp_model_entry_t *e = sp_registry_entry(r, rm->name, v->version, true);
    if (e == NULL) {
        pthread_mutex_unlock(&r->mu);
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "model '%s' version %lld: the server tracks at most %d model versions",
                       rm->name, (long long)v->version, SP_SERVE_MAX_ENTRIES);
    }
    e->from_repo = true;
    if (e->live && e->live->sig == sig && !(flags & LOAD_FORCE)) {
        /* Unchanged (or back to what is loaded): left alone. */
        e->sig = sig;
        e->demand_failed = false;
        if (e->state == SP_REPO_READY) {
            e->reason[0] = '\0';
        }
        pthread_mutex_unlock(&r->mu);
        return SP_OK;
    }
    if (e->sig == sig && e->demand_failed && !(flags & LOAD_RETRY_FAILED)) {
        snprintf(err, err_len, "%s", e->reason[0] ? e->reason : "its last load failed");
        pthread_mutex_unlock(&r->mu);
        return SP_ERR_INVALID; /* the same files failed before */
    }
    if (e->live == NULL && e->on_demand && !e->demand_failed && !(flags & LOAD_RETRY_FAILED)) {
        /* Not loaded and waiting for its first request (evicted under the
         * memory budget, or load_on_demand): a rescan must not load it, or
         * it would evict another model, which the next rescan loads again.
         * Its first request loads the files as they are then. */
        e->sig = sig;
        pthread_mutex_unlock(&r->mu);
        return SP_OK;
    }
    if (v->model_path == NULL && e->live) {
        /* The version directory no longer names one model file (a second
         * *.gguf beside it, the file removed): what is loaded keeps serving,
         * and the index says why the directory cannot be loaded again. */
        e->sig = sig;
        e->demand_failed = true;
        snprintf(e->reason, sizeof e->reason, "serving the files loaded before; the directory "
                 "cannot be loaded now: %s", v->reason);
        snprintf(err, err_len, "%s", v->reason);
        pthread_mutex_unlock(&r->mu);
        SP_LOG_WARN("event=model_version_kept model=%s version=%lld reason=%s",
                    sp_log_str(rm->name), (long long)v->version, sp_log_str(v->reason));
        return SP_ERR_INVALID;
    }
    sp_free(e->override_json);
    e->override_json = override ? sp_strndup(override, strlen(override)) : NULL;
    if (v->model_path == NULL || (flags & LOAD_LAZY_OK && rm->cfg.load_on_demand && !e->live)) {
        bool lazy = v->model_path != NULL;
        e->sig = sig;
        e->state = SP_REPO_UNAVAILABLE;
        e->on_demand = lazy;
        e->demand_failed = !lazy;
        snprintf(e->reason, sizeof e->reason, "%s",
                 lazy ? "not loaded yet: loads on its first request (load_on_demand)" : v->reason);
        pthread_mutex_unlock(&r->mu);
        if (!lazy) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "%s", v->reason);
        }
        return SP_OK;
    }
    if (e->live == NULL) {
        e->state = SP_REPO_LOADING;
        snprintf(e->reason, sizeof e->reason, "loading");
    }
    pthread_mutex_unlock(&r->mu);

    sp_served_model_t *m = NULL;
    sp_status_t st = sp_served_build(s, rm->name, v->version, true, v->model_path, &rm->cfg, sig, &m,
                                     err, err_len);
    if (st == SP_OK) {
        sp_adapters_load_dir(s, rm->name, m); /* <model>/adapters/, before requests see it */
    }
    pthread_mutex_lock(&r->mu);
    sp_served_model_t *old = NULL;
    if (st == SP_OK) {
        old = sp_registry_publish_locked(r, e, m);
        e->on_demand = rm->cfg.load_on_demand;
    } else {
        e->sig = sig;
        e->demand_failed = true;
        if (e->live == NULL) {
            e->state = SP_REPO_UNAVAILABLE;
            snprintf(e->reason, sizeof e->reason, "%s", err);
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (st != SP_OK) {
        SP_LOG_ERROR("event=model_load_failed model=%s version=%lld error=%s%s",
                     sp_log_str(rm->name), (long long)v->version, sp_log_str(err),
                     e->live ? " kept=loaded" : "");
    }
    if (old) {
        SP_LOG_INFO("event=model_replaced model=%s version=%lld in_flight=%d", sp_log_str(old->name),
                    (long long)old->version, atomic_load(&old->refs) - 1);
        sp_served_release(old);
    }
    return st;
}

static bool
is_pinned_name(sp_serving_t *s, const char *name)
{
    for (int i = 0; i < s->cfg.n_models; i++) {
        if (strcmp(s->cfg.models[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}

/* Serve rm's selected versions, then unload the versions it no longer
 * selects once one selected version is READY. The first error lands in err. */
static sp_status_t
reconcile(sp_serving_t *s, const sp_repo_model_t *rm, const char *override, int flags, char *err,
          size_t err_len)
{
    if (!rm->ok) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s", rm->reason);
    }
    if (is_pinned_name(s, rm->name)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "model '%s': the name is taken by a --model flag", rm->name);
    }
    if (rm->n_versions == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "model '%s' has no version to serve", rm->name);
    }
    sp_status_t st = SP_OK;
    for (int32_t k = 0; k < rm->n_versions; k++) {
        char e[1024];
        sp_status_t vs = load_version(s, rm, &rm->versions[k], override, flags, e, sizeof e);
        if (vs != SP_OK && st == SP_OK) {
            st = vs;
            snprintf(err, err_len, "%s", e);
        }
    }
    /* Versions the policy dropped go once a selected one serves. */
    sp_registry_t *r = &s->reg;
    bool serving = false;
    pthread_mutex_lock(&r->mu);
    for (int32_t k = 0; k < rm->n_versions; k++) {
        sp_model_entry_t *e = sp_registry_entry(r, rm->name, rm->versions[k].version, false);
        serving |= e && (e->live != NULL || e->on_demand);
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        /* Only the manager changes which entries exist: reading them here is safe. */
        if (!e->used || !e->from_repo || strcmp(e->name, rm->name) != 0) {
            continue;
        }
        bool selected = false;
        for (int32_t k = 0; k < rm->n_versions; k++) {
            selected |= rm->versions[k].version == e->version;
        }
        if (selected || (e->live == NULL && !e->on_demand)) {
            continue;
        }
        if (serving) {
            retire(s, e, "unloaded: the version policy no longer selects this version");
        } else {
            SP_LOG_WARN("event=model_version_kept model=%s version=%lld reason=\"no newer version "
                        "could load\"",
                        sp_log_str(e->name), (long long)e->version);
        }
    }
    return st;
}

/* Unload every version of name. false when nothing of it is loaded or known. */
static bool
unload_name(sp_serving_t *s, const char *name, const char *why)
{
    sp_registry_t *r = &s->reg;
    bool known = false;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (e->used && e->from_repo && strcmp(e->name, name) == 0) {
            known = true;
            retire(s, e, why);
        }
    }
    return known;
}

/* Rescan the whole repository and reconcile every model; false when the
 * root itself cannot be read. */
static bool
scan_all(sp_serving_t *s, int flags)
{
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_scan_t *scan = NULL;
    char err[1024];
    if (sp_repo_scan(s->cfg.model_repository, &lim, &scan, err, sizeof err) != SP_OK) {
        SP_LOG_ERROR("event=repository_unusable error=%s", sp_log_str(err));
        return false;
    }
    for (int32_t i = 0; i < scan->n_models; i++) {
        if (reconcile(s, &scan->models[i], NULL, flags, err, sizeof err) != SP_OK) {
            SP_LOG_WARN("event=repository_model_unavailable model=%s error=%s",
                        sp_log_str(scan->models[i].name), sp_log_str(err));
        }
    }
    /* Models gone from the repository. */
    sp_registry_t *r = &s->reg;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (e->used && e->from_repo && sp_repo_find(scan, e->name) == NULL) {
            retire(s, e, "removed from the repository");
            pthread_mutex_lock(&r->mu);
            sp_free(e->override_json);
            memset(e, 0, sizeof *e);
            pthread_mutex_unlock(&r->mu);
        }
    }
    sp_repo_scan_free(scan);
    return true;
}

/* ------------------------------------------------------------ files changed on disk */

#define FILES_CHECK_NS 1000000000LL /* served models' files, every second */

/* A stat stamp of path (1 when it cannot be read, so "gone" is a stamp too). */
static uint64_t
file_stamp(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return 1;
    }
    uint64_t h = mix(mix(0x46494C45ull, (uint64_t)sb.st_size), (uint64_t)sb.st_ino);
    h = mix(mix(h, (uint64_t)sb.st_mtim.tv_sec), (uint64_t)sb.st_mtim.tv_nsec);
    return h ? h : 2;
}

/* Load e's model again from its files as they are now, beside the one
 * serving (a new version load: the old one serves until the new one is
 * published, and keeps serving when the load fails). */
static sp_status_t
reload_entry(sp_serving_t *s, sp_model_entry_t *e, const char *path, char *err, size_t err_len)
{
    sp_registry_t *r = &s->reg;
    if (!e->from_repo) {
        /* A --model model: the same file and settings. */
        sp_served_model_t *m = NULL;
        sp_status_t st = sp_served_build(s, e->name, 0, false, path, NULL, 0, &m, err, err_len);
        if (st != SP_OK) {
            return st;
        }
        pthread_mutex_lock(&r->mu);
        sp_served_model_t *old = sp_registry_publish_locked(r, e, m);
        pthread_mutex_unlock(&r->mu);
        sp_served_release(old);
        return SP_OK;
    }
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_model_t rm;
    memset(&rm, 0, sizeof rm);
    pthread_mutex_lock(&r->mu);
    char *ov = e->override_json ? sp_strndup(e->override_json, strlen(e->override_json)) : NULL;
    pthread_mutex_unlock(&r->mu);
    sp_status_t st = sp_repo_scan_model(s->cfg.model_repository, e->name, strlen(e->name), &lim, ov,
                                        ov ? strlen(ov) : 0, &rm, err, err_len);
    const sp_repo_version_t *v = NULL;
    for (int32_t k = 0; st == SP_OK && rm.ok && k < rm.n_versions; k++) {
        if (rm.versions[k].version == e->version) {
            v = &rm.versions[k];
        }
    }
    if (st == SP_OK && !rm.ok) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "%s", rm.reason);
    } else if (st == SP_OK && v == NULL) {
        st = sp_errf(err, err_len, SP_ERR_NOT_FOUND, "version %lld is no longer in the repository",
                     (long long)e->version);
    } else if (st == SP_OK) {
        st = load_version(s, &rm, v, ov, LOAD_FORCE | LOAD_RETRY_FAILED, err, err_len);
    }
    sp_repo_model_free(&rm);
    sp_free(ov);
    return st;
}

/*
 * Served models whose file changed on disk (copied over, truncated, replaced
 * by a rename) load again from the file as it is now. A model holding a
 * private copy of its file (gguf/gguf.h) kept its weights and serves on
 * when that load fails (a cut-off file); a mapped model whose weights changed
 * under it cannot: every request on it fails with a clear 5xx (the
 * scheduler's check) and the index says why. A failed reload is not retried
 * until the file changes again.
 */
static void
check_files(sp_serving_t *s)
{
    sp_registry_t *r = &s->reg;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        pthread_mutex_lock(&r->mu);
        sp_served_model_t *m = e->used ? e->live : NULL;
        if (m) {
            sp_served_ref(m);
        }
        pthread_mutex_unlock(&r->mu);
        if (m == NULL) {
            continue;
        }
        bool changed = sp_served_file_changed(m);
        bool stale = changed && sp_served_weights_changed(m);
        char path[sizeof m->path];
        snprintf(path, sizeof path, "%s", m->path);
        sp_served_release(m);
        uint64_t fs = changed ? file_stamp(path) : 0;
        if (!changed || fs == e->file_fail_stamp) {
            continue;
        }
        SP_LOG_WARN("event=model_file_changed model=%s version=%lld weights=%s action=reload",
                    sp_log_str(e->name), (long long)e->version,
                    stale ? "changed" : "private_copy_kept");
        char err[1024];
        if (reload_entry(s, e, path, err, sizeof err) == SP_OK) {
            e->file_fail_stamp = 0;
            SP_LOG_INFO("event=model_reloaded model=%s version=%lld reason=file_changed",
                        sp_log_str(e->name), (long long)e->version);
            continue;
        }
        e->file_fail_stamp = fs;
        SP_LOG_ERROR("event=model_reload_failed model=%s version=%lld error=%s kept=%s",
                     sp_log_str(e->name), (long long)e->version, sp_log_str(err),
                     stale ? "none" : "private_copy");
        pthread_mutex_lock(&r->mu);
        if (e->live && sp_served_weights_changed(e->live)) {
            e->stale_failed = true;
            e->state = SP_REPO_UNAVAILABLE;
            snprintf(e->reason, sizeof e->reason,
                     "the model file changed on disk while it was served and could not be loaded "
                     "again (requests fail until it can): %.800s", err);
        } else if (e->live && e->state == SP_REPO_LOADING) {
            e->state = SP_REPO_READY; /* a lookup's mark; the copy it saw serves on */
            e->reason[0] = '\0';
        }
        pthread_mutex_unlock(&r->mu);
    }
}

/* ------------------------------------------------------------ commands */

static void
run_load(sp_serving_t *s, sp_mgr_cmd_t *c)
{
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_model_t rm;
    memset(&rm, 0, sizeof rm);
    char err[1024];
    size_t olen = c->override ? strlen(c->override) : 0;
    sp_status_t st = sp_repo_scan_model(s->cfg.model_repository, c->name, strlen(c->name), &lim,
                                        c->override, olen, &rm, err, sizeof err);
    if (st == SP_OK) {
        st = reconcile(s, &rm, c->override, LOAD_RETRY_FAILED, err, sizeof err);
        sp_repo_model_free(&rm);
        wait_finish(c->wait, st == SP_OK ? 200 : 400, st == SP_OK ? NULL : err);
        return;
    }
    wait_finish(c->wait, st == SP_ERR_NOT_FOUND ? 404 : 400, err);
}

static void
run_demand(sp_serving_t *s, sp_mgr_cmd_t *c)
{
    sp_registry_t *r = &s->reg;
    char err[1024] = "";
    pthread_mutex_lock(&r->mu);
    sp_model_entry_t *e = sp_registry_entry(r, c->name, c->version, false);
    char *ov = e && e->override_json ? sp_strndup(e->override_json, strlen(e->override_json)) : NULL;
    bool wanted = e && e->state == SP_REPO_LOADING && e->live == NULL;
    pthread_mutex_unlock(&r->mu);
    if (!wanted) {
        sp_free(ov);
        return;
    }
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_model_t rm;
    memset(&rm, 0, sizeof rm);
    sp_status_t st = sp_repo_scan_model(s->cfg.model_repository, c->name, strlen(c->name), &lim, ov,
                                        ov ? strlen(ov) : 0, &rm, err, sizeof err);
    const sp_repo_version_t *v = NULL;
    if (st == SP_OK && !rm.ok) {
        snprintf(err, sizeof err, "%s", rm.reason);
        st = SP_ERR_INVALID;
    }
    for (int32_t k = 0; st == SP_OK && k < rm.n_versions; k++) {
        if (rm.versions[k].version == c->version) {
            v = &rm.versions[k];
        }
    }
    if (st == SP_OK && v == NULL) {
        snprintf(err, sizeof err, "version %lld is no longer in the repository",
                 (long long)c->version);
        st = SP_ERR_NOT_FOUND;
    }
    if (st == SP_OK) {
        st = load_version(s, &rm, v, ov, LOAD_RETRY_FAILED, err, sizeof err);
    } else {
        pthread_mutex_lock(&r->mu);
        e = sp_registry_entry(r, c->name, c->version, false);
        if (e && e->live == NULL) {
            e->state = SP_REPO_UNAVAILABLE;
            e->demand_failed = true;
            snprintf(e->reason, sizeof e->reason, "%s", err);
        }
        pthread_mutex_unlock(&r->mu);
    }
    if (st == SP_OK) {
        SP_LOG_INFO("event=model_loaded_on_demand model=%s version=%lld", sp_log_str(c->name),
                    (long long)c->version);
    }
    sp_repo_model_free(&rm);
    sp_free(ov);
}

static void
run_cmd(sp_serving_t *s, sp_mgr_cmd_t *c)
{
    switch (c->kind) {
    case CMD_LOAD:
        run_load(s, c);
        break;
    case CMD_UNLOAD:
        if (unload_name(s, c->name, "unloaded")) {
            wait_finish(c->wait, 200, NULL);
        } else {
            char err[256];
            snprintf(err, sizeof err, "model '%s' is not loaded from the repository", c->name);
            wait_finish(c->wait, 404, err);
        }
        break;
    case CMD_DEMAND:
        run_demand(s, c);
        break;
    case CMD_LORA_LOAD:
    case CMD_LORA_UNLOAD: {
        /* c->name is "<model>:<adapter>" (checked by the route). */
        char err[1024] = "";
        char *colon = strrchr(c->name, ':');
        *colon = '\0';
        int status = c->kind == CMD_LORA_LOAD ? sp_adapters_load(s, c->name, colon + 1, err, sizeof err)
                                              : sp_adapters_unload(s, c->name, colon + 1, err, sizeof err);
        wait_finish(c->wait, status, status == 200 ? NULL : err);
        break;
    }
    }
}

/* ------------------------------------------------------------ thread */

static bool
startup(sp_serving_t *s)
{
    sp_registry_t *r = &s->reg;
    char err[1024];
    for (int i = 0; i < s->cfg.n_models; i++) {
        const sp_serve_model_cfg_t *mc = &s->cfg.models[i];
        pthread_mutex_lock(&r->mu);
        sp_model_entry_t *e = sp_registry_entry(r, mc->name, 0, true);
        if (e) {
            e->pinned = true;
            e->state = SP_REPO_LOADING;
        }
        pthread_mutex_unlock(&r->mu);
        sp_served_model_t *m = NULL;
        if (e == NULL ||
            sp_served_build(s, mc->name, 0, false, mc->path, NULL, 0, &m, err, sizeof err) != SP_OK) {
            SP_LOG_ERROR("event=model_load_failed model=%s error=%s", sp_log_str(mc->name),
                         sp_log_str(e ? err : "model table full"));
            return false;
        }
        pthread_mutex_lock(&r->mu);
        sp_registry_publish_locked(r, e, m);
        pthread_mutex_unlock(&r->mu);
    }
    if (s->cfg.model_repository[0] && !mode_is(s, "explicit")) {
        return scan_all(s, LOAD_LAZY_OK); /* an unreadable root at start is fatal */
    }
    return true;
}

static void *
mgr_main(void *arg)
{
    sp_serving_t *s = arg;
    sp_registry_t *r = &s->reg;
    if (!startup(s)) {
        atomic_store(&s->load_failed, true);
    } else {
        atomic_store(&s->ready, true);
        SP_LOG_INFO("event=ready mode=%s", s->cfg.model_control_mode);
    }
    bool poll = s->cfg.model_repository[0] && mode_is(s, "poll");
    int64_t period = (int64_t)(s->cfg.repository_poll_s * 1e9);
    int64_t next_poll = sp_time_ns() + period;
    int64_t next_refresh = 0;
    int64_t next_files = sp_time_ns() + FILES_CHECK_NS;
    pthread_mutex_lock(&r->mu);
    while (!s->mgr_stop) {
        if (r->reap) {
            pthread_mutex_unlock(&r->mu);
            sp_registry_reap(r);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (s->cmd_head) {
            sp_mgr_cmd_t *c = s->cmd_head;
            s->cmd_head = c->next;
            if (s->cmd_head == NULL) {
                s->cmd_tail = NULL;
            }
            pthread_mutex_unlock(&r->mu);
            run_cmd(s, c);
            cmd_free(c);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        int64_t now = sp_time_ns();
        if (now >= next_files || r->recheck) {
            r->recheck = false;
            pthread_mutex_unlock(&r->mu);
            check_files(s);
            next_files = sp_time_ns() + FILES_CHECK_NS;
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (now >= next_refresh) {
            /* Devices' used/free figures for /metrics and /stats (NVML is
             * read here, never on a loop thread). */
            char err[256];
            if (sp_devices_refresh(r->devs, err, sizeof err) != SP_OK) {
                SP_LOG_DEBUG("event=devices_refresh_failed error=%s", sp_log_str(err));
            }
            next_refresh = now + DEVICE_REFRESH_NS;
            /* The tenants file: reloaded when it changes or on SIGHUP. */
            if (atomic_exchange(&s->reload_tenants, false) || sp_auth_file_changed(&s->auth)) {
                pthread_mutex_unlock(&r->mu);
                if (sp_auth_reload(&s->auth, err, sizeof err) == SP_OK) {
                    SP_LOG_INFO("event=tenants_reloaded file=%s", sp_log_str(s->cfg.tenants_file));
                } else {
                    SP_LOG_ERROR("event=tenants_reload_failed error=%s kept=previous",
                                 sp_log_str(err));
                }
                pthread_mutex_lock(&r->mu);
            }
        }
        if (poll && now >= next_poll) {
            pthread_mutex_unlock(&r->mu);
            scan_all(s, LOAD_LAZY_OK);
            next_poll = sp_time_ns() + period;
            pthread_mutex_lock(&r->mu);
            continue;
        }
        int64_t wake = poll && next_poll < next_refresh ? next_poll : next_refresh;
        wake = next_files < wake ? next_files : wake;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t abs_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + (wake - now);
        ts.tv_sec = abs_ns / 1000000000LL;
        ts.tv_nsec = abs_ns % 1000000000LL;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    /* Shutting down: what is still queued is answered, not run. */
    while (s->cmd_head) {
        sp_mgr_cmd_t *c = s->cmd_head;
        s->cmd_head = c->next;
        wait_finish(c->wait, 503, "the server is shutting down");
        cmd_free(c);
    }
    s->cmd_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

sp_status_t
sp_repository_start(sp_serving_t *s, char *err, size_t err_len)
{
    /* Model files up to this size are served from a private copy (gguf/gguf.h). */
    sp_gguf_set_copy_max(s->cfg.model_copy_max);
    sp_gguf_set_guard(true);
    if (s->cfg.model_repository[0] && realpath(s->cfg.model_repository, s->repo_real) == NULL) {
        s->repo_real[0] = '\0';
    }
    if (pthread_create(&s->mgr, NULL, mgr_main, s) != 0) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot start the model manager thread");
    }
    s->mgr_started = true;
    return SP_OK;
}

void
sp_repository_stop(sp_serving_t *s)
{
    if (!s->mgr_started) {
        return;
    }
    pthread_mutex_lock(&s->reg.mu);
    s->mgr_stop = true;
    pthread_cond_broadcast(&s->reg.cv);
    pthread_mutex_unlock(&s->reg.mu);
    pthread_join(s->mgr, NULL);
    s->mgr_started = false;
}

/* ------------------------------------------------------------- routes */

/* A reason as clients see it: the repository's own location (as given and
 * resolved) removed, so answers name files relative to the repository and
 * never the server's file system (RELIABILITY.md R6; the log keeps it all).
 * Any other absolute path left (a key file, the key directory) is cut to
 * its last component after ".../". */
void
sp_repository_redact(const sp_serving_t *s, const char *in, char *out, size_t cap)
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
have_repo(sp_serving_t *s, sp_http_req_t *r)
{
    if (s->cfg.model_repository[0] == '\0') {
        sp_kserve_error(r, 400, "no model repository: start the server with --model-repository DIR");
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
            sp_repository_redact(s, reason, red, sizeof red);
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
    if (!mode_is(s, "explicit")) {
        sp_kserve_error(r, 400, "explicit model load / unload needs --model-control-mode explicit");
        return false;
    }
    return true;
}

/* A load or unload request waiting for the manager. */
typedef struct ctl_wait {
    sp_serving_t *s;
    sp_http_req_t *r;
    mgr_wait_t *w;
    struct event *tick;
} ctl_wait_t;

#define CTL_TICK_US 2000

static void
ctl_free(ctl_wait_t *c)
{
    if (c->tick) {
        event_free(c->tick);
    }
    wait_release(c->w);
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
    if (!atomic_load(&c->w->done)) {
        struct timeval tv = {0, CTL_TICK_US};
        evtimer_add(c->tick, &tv);
        return;
    }
    sp_http_req_t *r = c->r;
    sp_http_req_on_abort(r, NULL, NULL);
    if (c->w->status == 200) {
        sp_http_respond(r, 200, "application/json", "{}", 2);
    } else {
        char red[1024];
        sp_repository_redact(c->s, c->w->err, red, sizeof red);
        sp_kserve_error(r, c->w->status, "%s%s", c->w->status == 400 ? "failed to load model: " : "",
                        red);
    }
    ctl_free(c);
}

/* Hand a command to the manager and answer when it is done. */
static void
submit_cmd(sp_serving_t *s, sp_http_req_t *r, sp_mgr_cmd_t *cmd)
{
    ctl_wait_t *c = sp_calloc(1, sizeof *c);
    mgr_wait_t *w = sp_calloc(1, sizeof *w);
    struct event_base *base = sp_http_loop_base(sp_http_req_loop(r));
    if (c == NULL || w == NULL || (c->tick = evtimer_new(base, ctl_tick, c)) == NULL) {
        sp_free(w);
        sp_free(c);
        cmd_free(cmd);
        sp_kserve_error(r, 503, "out of memory");
        return;
    }
    atomic_init(&w->refs, 2); /* the request's and the manager's */
    c->s = s;
    c->r = r;
    c->w = w;
    cmd->wait = w;
    sp_http_req_on_abort(r, ctl_abort, c);
    pthread_mutex_lock(&s->reg.mu);
    if (s->mgr_stop) {
        pthread_mutex_unlock(&s->reg.mu);
        wait_finish(w, 503, "the server is shutting down");
        cmd_free(cmd);
    } else {
        push_locked(s, cmd);
        pthread_mutex_unlock(&s->reg.mu);
    }
    struct timeval tv = {0, CTL_TICK_US};
    evtimer_add(c->tick, &tv);
}

static sp_mgr_cmd_t *
new_cmd(sp_http_req_t *r, cmd_kind_t kind, sp_str_t name)
{
    char err[256];
    if (sp_repo_check_name_n(name.ptr, name.len, err, sizeof err) != SP_OK) {
        sp_kserve_error(r, 400, "model name: %s", err);
        return NULL;
    }
    sp_mgr_cmd_t *c = sp_calloc(1, sizeof *c);
    if (c == NULL) {
        sp_kserve_error(r, 503, "out of memory");
        return NULL;
    }
    c->kind = kind;
    memcpy(c->name, name.ptr, name.len);
    return c;
}

/*
 * "<model>:<adapter>" on the load and unload routes means a LoRA adapter
 * (adapters.h) unless the repository has a model of that whole name. Adapters
 * load and unload in every control mode: they are not versions, and the
 * modes only say who decides which versions serve. Answers itself for a
 * malformed name and returns true when the route is an adapter's.
 */
static bool
adapter_route(sp_serving_t *s, sp_http_req_t *r, sp_str_t name, cmd_kind_t kind)
{
    const char *colon = name.len ? memrchr(name.ptr, ':', name.len) : NULL;
    if (colon == NULL || s->cfg.model_repository[0] == '\0' || name.len > SP_REPO_NAME_MAX) {
        return false;
    }
    char rel[SP_REPO_NAME_MAX + 16], path[4096], err[256];
    snprintf(rel, sizeof rel, "%.*s/config.json", (int)name.len, name.ptr);
    if (sp_repo_check_name_n(name.ptr, name.len, err, sizeof err) == SP_OK &&
        sp_repo_resolve(s->repo_real, rel, path, sizeof path, err, sizeof err) == SP_OK) {
        return false; /* a model with a ':' in its name */
    }
    const size_t blen = (size_t)(colon - name.ptr), alen = name.len - blen - 1;
    if (blen == 0 || sp_repo_check_name_n(name.ptr, blen, err, sizeof err) != SP_OK ||
        !sp_adapter_name_ok(colon + 1, alen)) {
        sp_kserve_error(r, 400, "adapter name: expected <model>:<adapter> with an adapter name of "
                        "1 to %d characters from [A-Za-z0-9._-], not starting with '.'",
                        SP_ADAPTER_NAME_MAX);
        return true;
    }
    sp_mgr_cmd_t *c = sp_calloc(1, sizeof *c);
    if (c == NULL) {
        sp_kserve_error(r, 503, "out of memory");
        return true;
    }
    c->kind = kind;
    memcpy(c->name, name.ptr, name.len);
    submit_cmd(s, r, c);
    return true;
}

/* POST /v2/repository/models/{model}/load [{"parameters":{"config":"<json>"}}] */
static void
h_load(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *body;
    if (adapter_route(s, r, sp_route_param(p, "model"), CMD_LORA_LOAD)) {
        return;
    }
    if (!control_allowed(s, r) || !body_json(s, r, &body)) {
        return;
    }
    json_t *params = body ? json_object_get(body, "parameters") : NULL;
    json_t *cfg = json_is_object(params) ? json_object_get(params, "config") : NULL;
    if (cfg && !json_is_string(cfg)) {
        json_decref(body);
        sp_kserve_error(r, 400, "parameters.config must be a string holding JSON");
        return;
    }
    sp_mgr_cmd_t *c = new_cmd(r, CMD_LOAD, sp_route_param(p, "model"));
    if (c && cfg) {
        c->override = sp_strndup(json_string_value(cfg), json_string_length(cfg));
        if (c->override == NULL) {
            cmd_free(c);
            c = NULL;
            sp_kserve_error(r, 503, "out of memory");
        }
    }
    json_decref(body);
    if (c) {
        submit_cmd(s, r, c);
    }
}

/* POST /v2/repository/models/{model}/unload */
static void
h_unload(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    if (adapter_route(s, r, sp_route_param(p, "model"), CMD_LORA_UNLOAD) || !control_allowed(s, r)) {
        return;
    }
    sp_mgr_cmd_t *c = new_cmd(r, CMD_UNLOAD, sp_route_param(p, "model"));
    if (c) {
        submit_cmd(s, r, c);
    }
}

void
sp_repository_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/index", h_index, s);
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/models/{model}/load", h_load, s);
    sp_router_add(rt, SP_HTTP_POST, "/v2/repository/models/{model}/unload", h_unload, s);
}
