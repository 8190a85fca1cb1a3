/*
 * manager.c - the manager thread (manager.h).
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
 * Commands that wait for the manager (load, unload, adapters) hold a small
 * shared record that the manager fills (sp_manager_wait_t); the route that
 * queued one looks at it from a timer on its loop, so no loop blocks for a
 * load. On-demand loads are marks on registry entries, taken in the loop.
 *
 * Which kind a model is (llm_model.h, tensor_model.h) is decided here from
 * its config; the registry only sees the kind's table.
 */
#include "serving/manager.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/adapters.h"
#include "serving/llm_model.h"
#include "serving/repo.h"
#include "serving/s3repo.h"
#include "serving/serving.h"
#include "serving/tensor_model.h"

#define DEVICE_REFRESH_NS 1000000000LL /* device figures and the tenants file, every second */

/* What a command's caller waits for: shared by the manager and the caller. */
struct sp_manager_wait {
    atomic_int refs;
    atomic_bool done;
    sp_status_t st;        /* SP_OK, or why the command failed */
    char err[1024];        /* "" on success */
};
typedef sp_manager_wait_t mgr_wait_t;

struct sp_manager_cmd {
    sp_manager_op_t op;
    char name[SP_REPO_NAME_MAX + 1];
    char *override;        /* SP_MANAGER_LOAD: config override (JSON text) or NULL */
    mgr_wait_t *wait;
    sp_manager_cmd_t *next;
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
wait_finish(mgr_wait_t *w, sp_status_t st, const char *err)
{
    if (w == NULL) {
        return;
    }
    w->st = st;
    snprintf(w->err, sizeof w->err, "%s", err ? err : "");
    atomic_store(&w->done, true);
    wait_release(w);
}

static void
cmd_free(sp_manager_cmd_t *c)
{
    sp_free(c->override);
    sp_free(c);
}

/* Queue a command (reg.mu held). */
static void
push_locked(sp_serving_t *s, sp_manager_cmd_t *c)
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

sp_status_t
sp_manager_submit(sp_serving_t *s, sp_manager_op_t op, const char *name, size_t len,
                  const char *override, size_t override_len, sp_manager_wait_t **out)
{
    *out = NULL;
    sp_manager_cmd_t *c = sp_calloc(1, sizeof *c);
    mgr_wait_t *w = sp_calloc(1, sizeof *w);
    if (c == NULL || w == NULL || len >= sizeof c->name ||
        (override && (c->override = sp_strndup(override, override_len)) == NULL)) {
        sp_free(w);
        if (c) {
            cmd_free(c);
        }
        return SP_ERR_NOMEM;
    }
    c->op = op;
    memcpy(c->name, name, len);
    atomic_init(&w->refs, 2); /* the caller's and the manager's */
    c->wait = w;
    pthread_mutex_lock(&s->reg.mu);
    if (s->mgr_stop) {
        pthread_mutex_unlock(&s->reg.mu);
        wait_finish(w, SP_ERR_SHUTDOWN, "the server is shutting down");
        cmd_free(c);
    } else {
        push_locked(s, c);
        pthread_mutex_unlock(&s->reg.mu);
    }
    *out = w;
    return SP_OK;
}

bool
sp_manager_wait_done(const sp_manager_wait_t *w, sp_status_t *st, const char **err)
{
    if (!atomic_load(&w->done)) {
        return false;
    }
    *st = w->st;
    *err = w->err;
    return true;
}

void
sp_manager_wait_release(sp_manager_wait_t *w)
{
    wait_release(w);
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
    sp_served_model_t *old = sp_registry_unpublish_locked(r, e, why);
    pthread_mutex_unlock(&r->mu);
    if (old) {
        SP_LOG_INFO("event=model_unloaded model=%s version=%lld reason=%s in_flight=%d",
                    sp_log_str(old->name), (long long)old->version, sp_log_str(why),
                    atomic_load(&old->refs) - 1);
        sp_served_release(old);
    }
}

/* The kind a repository config describes: the engine, or a backend plugin. */
static const sp_model_kind_t *
kind_of(const sp_repo_config_t *cfg)
{
    return cfg->backend != SP_REPO_BACKEND_LLM ? &sp_tensor_model_kind : &sp_llm_model_kind;
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
    sp_status_t st = sp_registry_build(s, kind_of(&rm->cfg), rm->name, v->version, true,
                                       v->model_path, &rm->cfg, sig, &m, err, err_len);
    if (st == SP_OK) {
        /* <model>/adapters/, before requests see it */
        sp_adapters_load_dir(&m->adapters, m->model, &r->mu, s->repo_real, rm->name, m->version);
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

/* An object-store repository: bring the mirror to the store's state before the
 * scanner reads it. A failed sync leaves the mirror as it was (what is loaded keeps
 * serving); false then. */
static bool
s3_sync(sp_serving_t *s)
{
    if (s->s3 == NULL) {
        return true;
    }
    char err[1024];
    int changed = 0;
    int64_t t0 = sp_time_ns();
    if (sp_s3repo_sync(s->s3, &changed, err, sizeof err) != SP_OK) {
        SP_LOG_ERROR("event=repository_sync_failed repository=%s error=%s", sp_log_str(s->repo_url),
                     sp_log_str(err));
        return false;
    }
    if (changed > 0) {
        SP_LOG_INFO("event=repository_synced repository=%s files_changed=%d ms=%.1f",
                    sp_log_str(s->repo_url), changed, (double)(sp_time_ns() - t0) / 1e6);
    }
    return true;
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
    int bad = 0;
    for (int32_t i = 0; i < scan->n_models; i++) {
        const sp_repo_model_t *rm = &scan->models[i];
        bad += !rm->ok || rm->n_versions == 0 || is_pinned_name(s, rm->name);
        if (reconcile(s, &scan->models[i], NULL, flags, err, sizeof err) != SP_OK) {
            SP_LOG_WARN("event=repository_model_unavailable model=%s error=%s",
                        sp_log_str(scan->models[i].name), sp_log_str(err));
        }
    }
    atomic_store(&s->repo_bad_models, bad);
    /* Models gone from the repository. */
    sp_registry_t *r = &s->reg;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (e->used && e->from_repo && sp_repo_find(scan, e->name) == NULL) {
            retire(s, e, "removed from the repository");
            pthread_mutex_lock(&r->mu);
            sp_registry_drop_locked(r, e);
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
        sp_status_t st = sp_registry_build(s, &sp_llm_model_kind, e->name, 0, false, path, NULL,
                                           0, &m, err, err_len);
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
run_load(sp_serving_t *s, sp_manager_cmd_t *c)
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
        wait_finish(c->wait, st == SP_OK ? SP_OK : SP_ERR_INVALID, st == SP_OK ? NULL : err);
        return;
    }
    wait_finish(c->wait, st == SP_ERR_NOT_FOUND ? SP_ERR_NOT_FOUND : SP_ERR_INVALID, err);
}

/* A --model model unloaded for idleness (keep_alive) and asked for again:
 * built from its file as at start-up. */
static void
reload_pinned(sp_serving_t *s, const char *name)
{
    sp_registry_t *r = &s->reg;
    const sp_serve_model_cfg_t *mc = NULL;
    for (int i = 0; i < s->cfg.n_models; i++) {
        if (strcmp(s->cfg.models[i].name, name) == 0) {
            mc = &s->cfg.models[i];
        }
    }
    char err[1024] = "no such --model";
    sp_served_model_t *m = NULL;
    sp_status_t st = mc == NULL ? SP_ERR_NOT_FOUND
                                : sp_registry_build(s, &sp_llm_model_kind, mc->name, 0, false,
                                                    mc->path, NULL, 0, &m, err, sizeof err);
    pthread_mutex_lock(&r->mu);
    sp_model_entry_t *e = sp_registry_entry(r, name, 0, false);
    sp_served_model_t *old = NULL;
    if (e != NULL && st == SP_OK) {
        old = sp_registry_publish_locked(r, e, m);
        e->on_demand = false;
        m = NULL;
    } else if (e != NULL && e->live == NULL) {
        e->state = SP_REPO_UNAVAILABLE;
        e->demand_failed = true;
        snprintf(e->reason, sizeof e->reason, "%s", err);
    }
    pthread_mutex_unlock(&r->mu);
    if (st == SP_OK) {
        SP_LOG_INFO("event=model_loaded_on_demand model=%s version=0", sp_log_str(name));
    } else {
        SP_LOG_ERROR("event=model_load_failed model=%s error=%s", sp_log_str(name), sp_log_str(err));
    }
    sp_served_release(old);
    sp_served_release(m); /* built but its entry is gone (not expected) */
}

/* Load the version a request demanded (name, version), from the files as
 * they are now. */
static void
run_demand(sp_serving_t *s, const char *name, int64_t version)
{
    sp_registry_t *r = &s->reg;
    char err[1024] = "";
    pthread_mutex_lock(&r->mu);
    sp_model_entry_t *e = sp_registry_entry(r, name, version, false);
    char *ov = e && e->override_json ? sp_strndup(e->override_json, strlen(e->override_json)) : NULL;
    bool wanted = e && e->state == SP_REPO_LOADING && e->live == NULL;
    bool pinned = e && e->pinned;
    pthread_mutex_unlock(&r->mu);
    if (!wanted) {
        sp_free(ov);
        return;
    }
    if (pinned) {
        sp_free(ov);
        reload_pinned(s, name);
        return;
    }
    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    sp_repo_model_t rm;
    memset(&rm, 0, sizeof rm);
    sp_status_t st = sp_repo_scan_model(s->cfg.model_repository, name, strlen(name), &lim, ov,
                                        ov ? strlen(ov) : 0, &rm, err, sizeof err);
    const sp_repo_version_t *v = NULL;
    if (st == SP_OK && !rm.ok) {
        snprintf(err, sizeof err, "%s", rm.reason);
        st = SP_ERR_INVALID;
    }
    for (int32_t k = 0; st == SP_OK && k < rm.n_versions; k++) {
        if (rm.versions[k].version == version) {
            v = &rm.versions[k];
        }
    }
    if (st == SP_OK && v == NULL) {
        snprintf(err, sizeof err, "version %lld is no longer in the repository",
                 (long long)version);
        st = SP_ERR_NOT_FOUND;
    }
    if (st == SP_OK) {
        st = load_version(s, &rm, v, ov, LOAD_RETRY_FAILED, err, sizeof err);
    } else {
        pthread_mutex_lock(&r->mu);
        e = sp_registry_entry(r, name, version, false);
        if (e && e->live == NULL) {
            e->state = SP_REPO_UNAVAILABLE;
            e->demand_failed = true;
            snprintf(e->reason, sizeof e->reason, "%s", err);
        }
        pthread_mutex_unlock(&r->mu);
    }
    if (st == SP_OK) {
        SP_LOG_INFO("event=model_loaded_on_demand model=%s version=%lld", sp_log_str(name),
                    (long long)version);
    }
    sp_repo_model_free(&rm);
    sp_free(ov);
}

/* Load (or reload) adapter into every READY LLM version of base: SP_OK,
 * SP_ERR_INVALID (a bad file), SP_ERR_NOT_FOUND (no such model or file) or
 * SP_ERR_NOMEM. */
static sp_status_t
adapter_load(sp_serving_t *s, const char *base, const char *adapter, char *err, size_t err_len)
{
    sp_registry_t *r = &s->reg;
    char path[4096];
    sp_status_t st = sp_adapters_path(s->repo_real, base, adapter, path, sizeof path, err, err_len);
    if (st != SP_OK) {
        return st == SP_ERR_NOT_FOUND ? SP_ERR_NOT_FOUND : SP_ERR_INVALID;
    }
    int loaded = 0;
    /* Only the manager changes which models entries hold: reading e->live
     * without the lock is safe here, and it stays alive while we use it. */
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (!e->used || strcmp(e->name, base) != 0 || e->live == NULL || e->live->model == NULL) {
            continue;
        }
        sp_served_model_t *m = e->live;
        bool replaced;
        st = sp_adapters_put(&m->adapters, m->model, &r->mu, base, path, adapter, &replaced, err,
                             err_len);
        if (st != SP_OK) {
            return st;
        }
        SP_LOG_INFO("event=adapter_loaded model=%s version=%lld adapter=%s replaced=%d",
                    sp_log_str(base), (long long)m->version, sp_log_str(adapter), replaced);
        loaded++;
    }
    if (loaded == 0) {
        snprintf(err, err_len, "model '%s' is not loaded", base);
        return SP_ERR_NOT_FOUND;
    }
    return SP_OK;
}

/* Unload adapter from every version of base: SP_OK, or SP_ERR_NOT_FOUND. */
static sp_status_t
adapter_unload(sp_serving_t *s, const char *base, const char *adapter, char *err, size_t err_len)
{
    sp_registry_t *r = &s->reg;
    int dropped = 0;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (!e->used || strcmp(e->name, base) != 0 || e->live == NULL) {
            continue;
        }
        sp_served_model_t *m = e->live;
        if (sp_adapters_remove(m->adapters, &r->mu, adapter)) {
            SP_LOG_INFO("event=adapter_unloaded model=%s version=%lld adapter=%s",
                        sp_log_str(base), (long long)m->version, sp_log_str(adapter));
            dropped++;
        }
    }
    if (dropped == 0) {
        snprintf(err, err_len, "model '%s' has no loaded adapter '%s'", base, adapter);
        return SP_ERR_NOT_FOUND;
    }
    return SP_OK;
}

static void
run_cmd(sp_serving_t *s, sp_manager_cmd_t *c)
{
    switch (c->op) {
    case SP_MANAGER_LOAD:
        s3_sync(s); /* a load reads the store's current files (a failed sync: the mirror's) */
        run_load(s, c);
        break;
    case SP_MANAGER_UNLOAD:
        if (unload_name(s, c->name, "unloaded")) {
            wait_finish(c->wait, SP_OK, NULL);
        } else {
            char err[256];
            snprintf(err, sizeof err, "model '%s' is not loaded from the repository", c->name);
            wait_finish(c->wait, SP_ERR_NOT_FOUND, err);
        }
        break;
    case SP_MANAGER_ADAPTER_LOAD:
    case SP_MANAGER_ADAPTER_UNLOAD: {
        /* c->name is "<model>:<adapter>" (checked by the route). */
        char err[1024] = "";
        char *colon = strrchr(c->name, ':');
        *colon = '\0';
        sp_status_t st = c->op == SP_MANAGER_ADAPTER_LOAD
                             ? adapter_load(s, c->name, colon + 1, err, sizeof err)
                             : adapter_unload(s, c->name, colon + 1, err, sizeof err);
        wait_finish(c->wait, st, st == SP_OK ? NULL : err);
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
            sp_registry_build(s, &sp_llm_model_kind, mc->name, 0, false, mc->path, NULL, 0, &m,
                              err, sizeof err) != SP_OK) {
            SP_LOG_ERROR("event=model_load_failed model=%s error=%s", sp_log_str(mc->name),
                         sp_log_str(e ? err : "model table full"));
            return false;
        }
        pthread_mutex_lock(&r->mu);
        sp_registry_publish_locked(r, e, m);
        pthread_mutex_unlock(&r->mu);
    }
    if (s->s3 && !s3_sync(s)) {
        return false; /* an object store that cannot be read at start is fatal, as a root is */
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
            sp_manager_cmd_t *c = s->cmd_head;
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
        char dname[sizeof r->entry[0].name];
        int64_t dver;
        if (sp_registry_take_demand_locked(r, dname, sizeof dname, &dver)) {
            pthread_mutex_unlock(&r->mu);
            run_demand(s, dname, dver);
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
            if (s3_sync(s)) {
                scan_all(s, LOAD_LAZY_OK);
            }
            next_poll = sp_time_ns() + period;
            pthread_mutex_lock(&r->mu);
            continue;
        }
        /* Idle unloads (keep_alive): one at a time, released outside the lock. */
        int64_t next_expiry = INT64_MAX;
        sp_served_model_t *idle = sp_registry_expire_locked(r, now, &next_expiry);
        if (idle != NULL) {
            pthread_mutex_unlock(&r->mu);
            SP_LOG_INFO("event=model_unloaded model=%s version=%lld reason=keep_alive "
                        "idle_ms=%.0f", sp_log_str(idle->name), (long long)idle->version,
                        (double)(now - atomic_load(&idle->idle_ns)) / 1e6);
            sp_served_release(idle);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        int64_t wake = poll && next_poll < next_refresh ? next_poll : next_refresh;
        wake = next_files < wake ? next_files : wake;
        wake = next_expiry < wake ? next_expiry : wake;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t abs_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + (wake - now);
        ts.tv_sec = abs_ns / 1000000000LL;
        ts.tv_nsec = abs_ns % 1000000000LL;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    /* Shutting down: what is still queued is answered, not run. */
    while (s->cmd_head) {
        sp_manager_cmd_t *c = s->cmd_head;
        s->cmd_head = c->next;
        wait_finish(c->wait, SP_ERR_SHUTDOWN, "the server is shutting down");
        cmd_free(c);
    }
    s->cmd_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

sp_status_t
sp_manager_start(sp_serving_t *s, char *err, size_t err_len)
{
    /* Model files up to this size are served from a private copy (gguf/gguf.h). */
    sp_gguf_set_copy_max(s->cfg.model_copy_max);
    sp_gguf_set_guard(true);
    snprintf(s->repo_url, sizeof s->repo_url, "%s", s->cfg.model_repository);
    if (sp_s3repo_is_url(s->cfg.model_repository)) {
        /* the scanner and every other reader see the local mirror */
        sp_status_t st = sp_s3repo_open(s->cfg.model_repository, s->cfg.repository_cache, &s->s3,
                                        s->cfg.model_repository, sizeof s->cfg.model_repository, err,
                                        err_len);
        if (st != SP_OK) {
            return st;
        }
        SP_LOG_INFO("event=repository_mirror repository=%s mirror=%s", sp_log_str(s->repo_url),
                    sp_log_str(s->cfg.model_repository));
    }
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
sp_manager_stop(sp_serving_t *s)
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
    sp_s3repo_close(s->s3);
    s->s3 = NULL;
}

