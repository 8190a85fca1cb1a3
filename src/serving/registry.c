/*
 * registry.c - the served models' entries, lookup, the kinds' build and free
 * with the memory reserved between probe and start, LRU eviction and the
 * on-demand marks (registry.h). One served model's own calls are served.c.
 */
#include "serving/registry.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "core/file.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/serving.h"

#define MIB (1024.0 * 1024.0)

/* ------------------------------------------------------------ budget spec */

/* "60%", "2G", "512MiB", "1000000": a share of total or bytes. */
static sp_status_t
parse_amount(const char *s, size_t len, uint64_t total, uint64_t *out, char *err, size_t err_len)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "--memory-budget: empty or too long value");
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    double v = strtod(buf, &end);
    if (end == buf || !isfinite(v) || v <= 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "--memory-budget: '%s' is not a positive size (60%%, 2G, 512M)", buf);
    }
    if (strcmp(end, "%") == 0) {
        if (v > 100) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "--memory-budget: '%s' is over 100%%", buf);
        }
        *out = (uint64_t)((double)total * v / 100.0);
        return SP_OK;
    }
    static const struct { const char *suf; double mul; } units[] = {
        {"", 1},          {"B", 1},          {"K", 1024.0},  {"KiB", 1024.0}, {"M", MIB},
        {"MiB", MIB},     {"G", MIB * 1024}, {"GiB", MIB * 1024},
        {"T", MIB * MIB}, {"TiB", MIB * MIB},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suf) == 0) {
            double b = v * units[i].mul;
            if (b < 1 || b > 1e18) {
                break;
            }
            *out = (uint64_t)b;
            return SP_OK;
        }
    }
    return sp_errf(err, err_len, SP_ERR_INVALID,
                   "--memory-budget: '%s' is not a size (60%%, 2G, 512M, 1024K or bytes)", buf);
}

sp_status_t
sp_registry_parse_budget(const char *spec, sp_devices_t *devs, uint64_t *budget, int n, char *err,
                         size_t err_len)
{
    for (int i = 0; i < n; i++) {
        budget[i] = sp_devices_get(devs, i)->budget_bytes;
    }
    const char *p = spec;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq == NULL) { /* every device */
            for (int i = 0; i < n; i++) {
                sp_status_t st = parse_amount(p, len, sp_devices_get(devs, i)->total_bytes,
                                              &budget[i], err, err_len);
                if (st != SP_OK) {
                    return st;
                }
            }
        } else {
            char dev[112];
            size_t dl = (size_t)(eq - p);
            if (dl == 0 || dl >= sizeof dev) {
                return sp_errf(err, err_len, SP_ERR_INVALID, "--memory-budget: bad device name");
            }
            memcpy(dev, p, dl);
            dev[dl] = '\0';
            int k = sp_devices_find(devs, dev);
            if (k < 0 || k >= n) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "--memory-budget: no device '%s' (see `sampan devices`)", dev);
            }
            sp_status_t st = parse_amount(eq + 1, len - dl - 1, sp_devices_get(devs, k)->total_bytes,
                                          &budget[k], err, err_len);
            if (st != SP_OK) {
                return st;
            }
        }
        p = comma ? comma + 1 : NULL;
    }
    return SP_OK;
}

sp_status_t
sp_registry_init(sp_registry_t *r, const char *budget_spec, char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    sp_status_t st = sp_devices_open(NULL, &r->devs, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    r->n_dev = sp_devices_count(r->devs);
    if (r->n_dev > SP_REG_MAX_DEVICES) {
        SP_LOG_WARN("event=devices_truncated found=%d tracked=%d", r->n_dev, SP_REG_MAX_DEVICES);
        r->n_dev = SP_REG_MAX_DEVICES;
    }
    st = sp_registry_parse_budget(budget_spec, r->devs, r->budget, r->n_dev, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    for (int i = 0; i < r->n_dev; i++) {
        const sp_device_info_t *d = sp_devices_get(r->devs, i);
        SP_LOG_INFO("event=device index=%d id=%s kind=%s total_mib=%.0f budget_mib=%.0f", i, d->id,
                    sp_device_kind_name(d->kind), (double)d->total_bytes / MIB,
                    (double)r->budget[i] / MIB);
    }
    if (sp_devices_note(r->devs)[0]) {
        SP_LOG_INFO("event=devices_note note=%s", sp_log_str(sp_devices_note(r->devs)));
    }
    return SP_OK;
}

void
sp_registry_stop_all(sp_registry_t *r)
{
    pthread_mutex_lock(&r->mu);
    for (sp_served_model_t *m = r->all; m; m = m->next) {
        m->kind->stop(m);
    }
    pthread_mutex_unlock(&r->mu);
}

void
sp_registry_fini(sp_registry_t *r)
{
    while (r->all) {
        sp_registry_free(r, r->all);
    }
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_free(r->entry[i].override_json);
    }
    sp_devices_close(r->devs);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

/* ------------------------------------------------------------ entries */

sp_model_entry_t *
sp_registry_entry(sp_registry_t *r, const char *name, int64_t version, bool create)
{
    sp_model_entry_t *free_e = NULL, *stale = NULL;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (!e->used) {
            free_e = free_e ? free_e : e;
            continue;
        }
        if (e->version == version && strcmp(e->name, name) == 0) {
            return e;
        }
        /* An unloaded entry that nothing will bring back can be reused. */
        if (stale == NULL && e->live == NULL && e->state == SP_REPO_UNAVAILABLE && !e->on_demand) {
            stale = e;
        }
    }
    if (!create) {
        return NULL;
    }
    sp_model_entry_t *e = free_e ? free_e : stale;
    if (e == NULL || strlen(name) >= sizeof e->name) {
        return NULL;
    }
    sp_registry_drop_locked(r, e);
    e->used = true;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->version = version;
    snprintf(e->version_str, sizeof e->version_str, "%lld", (long long)(version > 0 ? version : 1));
    e->state = SP_REPO_UNAVAILABLE;
    return e;
}

void
sp_registry_drop_locked(sp_registry_t *r, sp_model_entry_t *e)
{
    SP_ASSERT(e->live == NULL); /* its model was unpublished first */
    if (e->demanded) {
        r->n_demanded--;
    }
    SP_ASSERT(r->n_demanded >= 0);
    sp_free(e->override_json);
    memset(e, 0, sizeof *e);
}

sp_served_model_t *
sp_registry_publish_locked(sp_registry_t *r, sp_model_entry_t *e, sp_served_model_t *m)
{
    (void)r;
    SP_ASSERT(m != NULL && atomic_load(&m->refs) >= 1); /* the entry's reference */
    SP_ASSERT(m->reserved); /* only a built model, its memory counted, is routed */
    SP_ASSERT(e->used);
    sp_served_model_t *old = e->live;
    SP_ASSERT(old != m);
    e->live = m;
    e->state = SP_REPO_READY;
    e->reason[0] = '\0';
    e->sig = m->sig;
    e->demand_failed = false;
    e->stale_failed = false;
    e->last_used_ns = sp_time_ns();
    if (e->demanded) { /* loaded by other means (an explicit load, a rescan) */
        e->demanded = false;
        r->n_demanded--;
    }
    SP_ASSERT(r->n_demanded >= 0);
    return old;
}

sp_served_model_t *
sp_registry_unpublish_locked(sp_registry_t *r, sp_model_entry_t *e, const char *why)
{
    sp_served_model_t *old = e->live;
    e->live = NULL;
    e->state = SP_REPO_UNAVAILABLE;
    e->on_demand = false;
    e->demand_failed = false;
    e->stale_failed = false;
    if (e->demanded) {
        e->demanded = false;
        r->n_demanded--;
    }
    SP_ASSERT(r->n_demanded >= 0);
    snprintf(e->reason, sizeof e->reason, "%s", why);
    return old;
}

sp_served_model_t *
sp_registry_expire_locked(sp_registry_t *r, int64_t now, int64_t *next)
{
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        sp_served_model_t *m = e->live;
        if (!e->used || m == NULL || e->state != SP_REPO_READY) {
            continue;
        }
        int64_t due = sp_served_expiry_locked(m, now);
        /* Idle (only the entry holds it) under the lock every lookup takes:
         * no request can pick it up between this check and the unpublish. */
        if (due <= now && atomic_load(&m->refs) == 1) {
            double keep_s = (double)atomic_load(&m->keep_alive_ns) / 1e9;
            e->live = NULL;
            e->state = SP_REPO_UNAVAILABLE;
            e->on_demand = true;
            e->demand_failed = false;
            snprintf(e->reason, sizeof e->reason,
                     "unloaded after %g s without a request (keep_alive); it loads again on its "
                     "next request", keep_s);
            return m;
        }
        if (due > now && due < *next) {
            *next = due;
        }
    }
    return NULL;
}

bool
sp_registry_take_demand_locked(sp_registry_t *r, char *name, size_t name_len, int64_t *version)
{
    SP_ASSERT(r->n_demanded >= 0);
    for (int i = 0; r->n_demanded > 0 && i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (e->used && e->demanded) {
            e->demanded = false;
            r->n_demanded--;
            snprintf(name, name_len, "%s", e->name);
            *version = e->version;
            return true;
        }
    }
    SP_ASSERT(r->n_demanded == 0); /* every mark is on a used entry */
    return false;
}

static bool
name_is(const sp_model_entry_t *e, const char *name, size_t len)
{
    return e->used && strlen(e->name) == len && memcmp(e->name, name, len) == 0;
}

sp_acq_t
sp_registry_acquire(sp_serving_t *s, const char *name, size_t len, const char *version, size_t vlen,
                    bool allow_load, sp_served_model_t **out, char *reason, size_t reason_len)
{
    sp_registry_t *r = &s->reg;
    *out = NULL;
    if (reason_len) {
        reason[0] = '\0';
    }
    pthread_mutex_lock(&r->mu);
    /* A bare name: the READY entry with the highest version, else the
     * highest version that is loading or can load on demand, else the
     * highest one (for its reason). */
    sp_model_entry_t *ready = NULL, *pending = NULL, *any = NULL;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (!name_is(e, name, len)) {
            continue;
        }
        if (version && (strlen(e->version_str) != vlen || memcmp(e->version_str, version, vlen) != 0)) {
            continue;
        }
        if (e->live && (e->state == SP_REPO_READY || e->stale_failed)) {
            if (ready == NULL || e->version > ready->version) ready = e;
        } else if (e->state == SP_REPO_LOADING || (e->on_demand && !e->demand_failed)) {
            if (pending == NULL || e->version > pending->version) pending = e;
        }
        if (any == NULL || e->version > any->version) any = e;
    }
    sp_acq_t res;
    if (ready && !ready->stale_failed && sp_served_weights_changed(ready->live)) {
        /* A mapped file changed under it: nothing is answered from it; the
         * manager reloads it now and the request waits for that. */
        ready->state = SP_REPO_LOADING;
        snprintf(ready->reason, sizeof ready->reason,
                 "reloading: the model file changed on disk while it was served");
        r->recheck = true;
        pthread_cond_broadcast(&r->cv);
        pending = ready;
        ready = NULL;
    }
    if (ready) {
        sp_served_model_t *m = ready->live;
        atomic_fetch_add(&m->refs, 1);
        atomic_store(&m->in_use, true); /* a request's: its release ends the idle time */
        int64_t now = sp_time_ns();
        atomic_store(&m->last_used_ns, now);
        ready->last_used_ns = now;
        *out = m;
        res = SP_ACQ_OK;
    } else if (pending && pending->state == SP_REPO_LOADING) {
        res = SP_ACQ_LOADING;
    } else if (pending && allow_load) {
        /* The manager picks the mark up (sp_registry_take_demand_locked). */
        SP_ASSERT(pending->state == SP_REPO_UNAVAILABLE); /* READY and LOADING answered above */
        pending->state = SP_REPO_LOADING;
        snprintf(pending->reason, sizeof pending->reason, "loading on demand");
        if (!pending->demanded) {
            pending->demanded = true;
            r->n_demanded++;
        }
        pthread_cond_broadcast(&r->cv);
        res = SP_ACQ_LOADING;
    } else if (any) {
        snprintf(reason, reason_len, "%s", any->reason[0] ? any->reason : "not loaded");
        res = SP_ACQ_UNAVAILABLE;
    } else {
        res = SP_ACQ_UNKNOWN;
    }
    pthread_mutex_unlock(&r->mu);
    /* "<model>:<adapter>" (a LoRA adapter, adapters.h) when no model has the
     * whole name: the base model; the caller checks the adapter. */
    const char *colon = res == SP_ACQ_UNKNOWN && len > 0 ? memrchr(name, ':', len) : NULL;
    if (colon != NULL && colon > name) {
        return sp_registry_acquire(s, name, (size_t)(colon - name), version, vlen, allow_load, out,
                                   reason, reason_len);
    }
    return res;
}

static int
cmp_model(const void *a, const void *b)
{
    const sp_served_model_t *x = *(sp_served_model_t *const *)a, *y = *(sp_served_model_t *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->version > y->version) - (x->version < y->version);
}

int
sp_registry_snapshot(sp_serving_t *s, sp_served_model_t ***out)
{
    sp_registry_t *r = &s->reg;
    *out = NULL;
    sp_served_model_t **v = sp_calloc(SP_SERVE_MAX_ENTRIES, sizeof *v);
    if (v == NULL) {
        return 0;
    }
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        if (e->used && e->live && e->state == SP_REPO_READY) {
            atomic_fetch_add(&e->live->refs, 1);
            v[n++] = e->live;
        }
    }
    pthread_mutex_unlock(&r->mu);
    qsort(v, (size_t)n, sizeof *v, cmp_model);
    *out = v;
    return n;
}

/* ------------------------------------------------------------ memory */

/* Can idle models on device d give back enough for need? The victims are
 * models an entry holds with no request on them, other than `name`'s own
 * versions (a swap keeps the old version serving) and pinned ones. */
static sp_model_entry_t *
lru_victim_locked(sp_registry_t *r, int d, const char *name, uint64_t *idle_total)
{
    sp_model_entry_t *victim = NULL;
    int64_t oldest = 0;
    *idle_total = 0;
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        sp_model_entry_t *e = &r->entry[i];
        sp_served_model_t *m = e->live;
        if (!e->used || m == NULL || e->pinned || m->charge[d] == 0 || strcmp(e->name, name) == 0 ||
            atomic_load(&m->refs) != 1) {
            continue;
        }
        *idle_total += m->charge[d];
        int64_t t = atomic_load(&m->last_used_ns);
        if (victim == NULL || t < oldest) {
            victim = e;
            oldest = t;
        }
    }
    return victim;
}

/* Reserve m->charge on every device, evicting idle models least recently
 * used first. Refuses (nothing evicted) when the model cannot fit. */
sp_status_t
sp_registry_reserve(sp_registry_t *r, sp_served_model_t *m, char *err, size_t err_len)
{
    pthread_mutex_lock(&r->mu);
    for (;;) {
        int d = -1;
        for (int k = 0; k < r->n_dev; k++) {
            if (m->charge[k] && r->used[k] + m->charge[k] > r->budget[k]) {
                d = k;
                break;
            }
        }
        if (d < 0) {
            for (int k = 0; k < r->n_dev; k++) {
                r->used[k] += m->charge[k];
                SP_ASSERT(r->used[k] <= r->budget[k] || m->charge[k] == 0);
            }
            pthread_mutex_unlock(&r->mu);
            return SP_OK;
        }
        uint64_t idle = 0;
        sp_model_entry_t *victim = lru_victim_locked(r, d, m->name, &idle);
        const sp_device_info_t *di = sp_devices_get(r->devs, d);
        if (m->charge[d] > r->budget[d] || r->used[d] - idle + m->charge[d] > r->budget[d]) {
            uint64_t used = r->used[d], budget = r->budget[d];
            pthread_mutex_unlock(&r->mu);
            return sp_errf(err, err_len, SP_ERR_TOO_LARGE,
                           "model '%s' version %lld needs %.1f MiB on %s (weights, KV cache and "
                           "scratch of %d instance(s)) but the memory budget is %.1f MiB with "
                           "%.1f MiB in use, of which only %.1f MiB by idle models that could be "
                           "unloaded (raise --memory-budget or unload models)",
                           m->name, (long long)m->version, (double)m->charge[d] / MIB, di->id,
                           m->n_inst, (double)budget / MIB, (double)used / MIB, (double)idle / MIB);
        }
        /* Evict the least recently used idle model and try again. */
        SP_ASSERT(victim != NULL); /* idle models hold the difference */
        sp_served_model_t *v = victim->live;
        victim->live = NULL;
        victim->state = SP_REPO_UNAVAILABLE;
        victim->on_demand = true;
        victim->demand_failed = false;
        snprintf(victim->reason, sizeof victim->reason,
                 "unloaded to make room for '%s' in the %s memory budget (least recently used); "
                 "it loads again on its next request",
                 m->name, di->id);
        r->evictions++;
        pthread_mutex_unlock(&r->mu);
        SP_LOG_INFO("event=model_evicted model=%s version=%lld device=%s freed_mib=%.1f for=%s",
                    sp_log_str(v->name), (long long)v->version, di->id, (double)v->charge[d] / MIB,
                    sp_log_str(m->name));
        /* refs was 1 (the entry's) under the lock, and lookups go through
         * the entry: nobody else can take it now. */
        if (atomic_fetch_sub(&v->refs, 1) == 1) {
            sp_registry_free(r, v);
        }
        pthread_mutex_lock(&r->mu);
    }
}

uint64_t
sp_registry_available(sp_registry_t *r, int d)
{
    pthread_mutex_lock(&r->mu);
    const uint64_t avail = r->budget[d] > r->used[d] ? r->budget[d] - r->used[d] : 0;
    pthread_mutex_unlock(&r->mu);
    return avail;
}

/* ------------------------------------------------------------ build / free */

static void
defaults_from(const sp_repo_config_t *cfg, sp_served_defaults_t *d)
{
    d->max_tokens = -1;
    d->top_k = -1;
    d->temperature = d->top_p = d->min_p = NAN;
    d->repeat_penalty = d->frequency_penalty = d->presence_penalty = NAN;
    d->seed_set = false;
    if (cfg == NULL) {
        return;
    }
    const sp_repo_llm_t *l = &cfg->llm;
    d->max_tokens = l->max_tokens;
    d->top_k = l->top_k;
    d->temperature = l->temperature;
    d->top_p = l->top_p;
    d->min_p = l->min_p;
    d->repeat_penalty = l->repeat_penalty;
    d->frequency_penalty = l->frequency_penalty;
    d->presence_penalty = l->presence_penalty;
    d->seed_set = l->seed >= 0;
    d->seed = l->seed;
}

sp_status_t
sp_registry_place(sp_registry_t *r, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
                  size_t err_len)
{
    m->n_inst = 0;
    if (cfg == NULL || cfg->n_groups == 0) {
        m->inst_dev[m->n_inst++] = 0;
        return SP_OK;
    }
    for (int32_t g = 0; g < cfg->n_groups; g++) {
        const sp_repo_group_t *gr = &cfg->group[g];
        int devs[SP_REG_MAX_DEVICES], nd = 0;
        if (gr->kind == SP_REPO_KIND_CPU) {
            devs[nd++] = 0;
        } else if (gr->n_gpus > 0) {
            for (int32_t k = 0; k < gr->n_gpus; k++) {
                char spec[32];
                snprintf(spec, sizeof spec, "cuda:%d", (int)gr->gpus[k]);
                int d = sp_devices_find(r->devs, spec);
                if (d < 0 || d >= r->n_dev) {
                    return sp_errf(err, err_len, SP_ERR_INVALID,
                                   "instance_group[%d].gpus: no GPU %d is visible (see `sampan "
                                   "devices`)",
                                   (int)g, (int)gr->gpus[k]);
                }
                devs[nd++] = d;
            }
        } else {
            for (int d = 1; d < r->n_dev; d++) {
                const sp_device_info_t *di = sp_devices_get(r->devs, d);
                if (!di->mig_enabled && di->ordinal >= 0) {
                    devs[nd++] = d;
                }
            }
            if (nd == 0) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "instance_group[%d]: KIND_GPU but no GPU is visible (%s)", (int)g,
                               sp_devices_note(r->devs)[0] ? sp_devices_note(r->devs)
                                                           : "see `sampan devices`");
            }
        }
        for (int k = 0; k < nd; k++) {
            for (int32_t c = 0; c < gr->count; c++) {
                if (m->n_inst >= SP_REPO_MAX_INSTANCES) {
                    return sp_errf(err, err_len, SP_ERR_INVALID,
                                   "instance_group: more than %d instances in all",
                                   SP_REPO_MAX_INSTANCES);
                }
                m->inst_dev[m->n_inst++] = devs[k];
            }
        }
    }
    return SP_OK;
}

/* A model is ready: time it, list it, log it. */
static void
built(sp_registry_t *r, sp_served_model_t *m, int64_t t0)
{
    m->created = (int64_t)time(NULL);
    atomic_store(&m->last_used_ns, sp_time_ns());
    atomic_store(&m->idle_ns, atomic_load(&m->last_used_ns));
    if (m->srv->cfg.keep_alive_s >= 0) {
        /* --keep-alive: every model's idle unload until a request sets its own */
        atomic_store(&m->keep_alive_ns, (int64_t)(m->srv->cfg.keep_alive_s * 1e9));
        atomic_store(&m->idle_unload, true);
    }
    m->load_ms = (double)(sp_time_ns() - t0) / 1e6;
    pthread_mutex_lock(&r->mu);
    m->next = r->all;
    r->all = m;
    pthread_mutex_unlock(&r->mu);
    SP_LOG_INFO("event=model_ready model=%s version=%lld file=%s backend=%s ctx=%lld instances=%d "
                "parallel=%d memory_mib=%.1f template=%s tool_calls=%s reasoning=%s load_ms=%.1f",
                sp_log_str(m->name), (long long)m->version, sp_log_str(m->path),
                m->be ? m->be->name : m->kind->name, (long long)m->n_ctx, m->n_inst, m->n_slots,
                (double)m->mem_bytes / MIB, m->tmpl ? sp_chat_template_name(m->tmpl) : "none",
                sp_chat_tools_name(sp_chat_tool_format(m->tmpl)),
                sp_chat_reasoning_name(sp_chat_reasoning_format(m->tmpl)), m->load_ms);
}

sp_status_t
sp_registry_build(sp_serving_t *s, const sp_model_kind_t *kind, const char *name, int64_t version,
                  bool from_repo, const char *path, const sp_repo_config_t *cfg, uint64_t sig,
                  sp_served_model_t **out, char *err, size_t err_len)
{
    sp_registry_t *r = &s->reg;
    int64_t t0 = sp_time_ns();
    *out = NULL;
    sp_served_model_t *m = sp_calloc(1, sizeof *m);
    if (m == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    m->srv = s;
    m->kind = kind;
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->version = version;
    snprintf(m->version_str, sizeof m->version_str, "%lld", (long long)(version > 0 ? version : 1));
    m->from_repo = from_repo;
    m->sig = sig;
    atomic_init(&m->refs, 1);
    sp_metrics_model_init(&m->metrics);
    defaults_from(cfg, &m->def);
    /* The response cache: a repository model opts in with config.json's
     * response_cache.enable; a --model model (no config) whenever the server
     * has a cache (--response-cache-bytes). */
    m->response_cache = s->rcache != NULL && (cfg ? cfg->response_cache : true);
    if (cfg && cfg->json) {
        m->config_json = sp_strndup(cfg->json, strlen(cfg->json));
        if (m->config_json == NULL) {
            sp_registry_free(r, m);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
    }
    sp_status_t st = kind->probe(s, m, cfg, err, err_len);
    if (st == SP_OK) {
        /* The probe placed the instances: inst[] and inst_dev[] are that long. */
        SP_ASSERT(m->n_inst > 0 && m->n_inst <= SP_REPO_MAX_INSTANCES);
        m->mem_bytes = 0;
        for (int d = 0; d < r->n_dev; d++) {
            m->mem_bytes += m->charge[d];
        }
        st = sp_registry_reserve(r, m, err, err_len);
        m->reserved = st == SP_OK;
    }
    if (st == SP_OK) {
        st = kind->start(s, m, cfg, err, err_len);
    }
    if (st != SP_OK) {
        if (!m->reserved) {
            memset(m->charge, 0, sizeof m->charge); /* nothing of it is taken */
        }
        sp_registry_free(r, m);
        return st;
    }
    built(r, m, t0);
    *out = m;
    return SP_OK;
}

void
sp_registry_free(sp_registry_t *r, sp_served_model_t *m)
{
    if (m->kind) {
        m->kind->free(m);
    }
    pthread_mutex_lock(&r->mu);
    for (int d = 0; d < r->n_dev; d++) {
        SP_ASSERT(r->used[d] >= m->charge[d]); /* a reservation is returned once */
        r->used[d] -= m->charge[d];
    }
    for (sp_served_model_t **pp = &r->all; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (m->inst[0] || m->be) {
        SP_LOG_INFO("event=model_freed model=%s version=%lld memory_mib=%.1f",
                    sp_log_str(m->name), (long long)m->version, (double)m->mem_bytes / MIB);
    }
    sp_free(m->config_json);
    sp_free(m);
}

void
sp_registry_reap(sp_registry_t *r)
{
    pthread_mutex_lock(&r->mu);
    sp_served_model_t *list = r->reap;
    r->reap = NULL;
    pthread_mutex_unlock(&r->mu);
    while (list) {
        sp_served_model_t *next = list->reap_next;
        SP_ASSERT(atomic_load(&list->refs) == 0);
        sp_registry_free(r, list);
        list = next;
    }
}
