/*
 * served.c - one served model as the protocols use it (registry.h): its
 * references, the choice of an instance, its sampling defaults, its figures
 * through its kind, and the checks that its files changed or it faulted.
 *
 * Threads: any thread holding a reference. The last release queues the
 * model on the registry's reap list (under the registry lock) and wakes the
 * manager, which frees it: never the releasing thread, which may be a loop.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/assert.h"
#include "core/file.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/registry.h"
#include "serving/serving.h"

bool
sp_served_weights_changed(const sp_served_model_t *m)
{
    return m != NULL && m->model != NULL && sp_gguf_weights_changed(sp_model_gguf(m->model));
}

bool
sp_served_file_changed(const sp_served_model_t *m)
{
    if (m == NULL || m->model == NULL) {
        return false; /* a backend plugin reads its own files */
    }
    if (sp_gguf_file_changed(sp_model_gguf(m->model))) {
        return true;
    }
    struct stat now;
    if (!m->has_file_id) {
        return false;
    }
    if (stat(m->path, &now) != 0) {
        return true;
    }
    return !sp_file_same(&m->file_id, &now);
}

void
sp_served_ref(sp_served_model_t *m)
{
    int was = atomic_fetch_add(&m->refs, 1);
    SP_ASSERT(was > 0); /* a reference is taken only from one already held */
}

void
sp_served_keep_alive(sp_served_model_t *m, int64_t keep_ns)
{
    if (keep_ns < 0) {
        atomic_store(&m->idle_unload, false);
        return;
    }
    atomic_store(&m->keep_alive_ns, keep_ns);
    atomic_store(&m->idle_unload, true);
    /* A nearer deadline than the one the manager waits for, maybe. */
    sp_registry_t *r = &m->srv->reg;
    pthread_mutex_lock(&r->mu);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int64_t
sp_served_expiry_locked(const sp_served_model_t *m, int64_t now)
{
    if (!atomic_load(&m->idle_unload)) {
        return INT64_MAX;
    }
    int64_t keep = atomic_load(&m->keep_alive_ns);
    int64_t from = atomic_load(&m->refs) > 1 ? now : atomic_load(&m->idle_ns);
    return from > INT64_MAX - keep ? INT64_MAX : from + keep;
}

void
sp_served_fault(sp_served_model_t *m, const char *rid, const char *what)
{
    if (m != NULL && !atomic_exchange(&m->faulty, true)) {
        SP_LOG_ERROR("event=model_fault model=%s version=%lld rid=%s detail=%s", sp_log_str(m->name),
                     (long long)m->version, rid ? rid : "-", sp_log_str(what));
    }
}

void
sp_served_release(sp_served_model_t *m)
{
    if (m == NULL) {
        return;
    }
    if (atomic_load(&m->in_use)) {
        /* A request's reference (in_use: one was taken since the model was
         * last idle): idle from now. The count drops under the registry
         * lock, which lookups and the manager's idle check also hold, so a
         * model the entry alone holds is seen with this time, and in_use is
         * cleared only when no lookup took it again. Other references (a
         * listing's snapshot, the manager's file check) do not count as use.
         * Nothing of m is touched after the lock: without a reference it may
         * be freed at once. */
        sp_registry_t *r = &m->srv->reg;
        atomic_store(&m->idle_ns, sp_time_ns());
        pthread_mutex_lock(&r->mu);
        int was = atomic_fetch_sub(&m->refs, 1);
        SP_ASSERT(was > 0); /* released more often than referenced */
        if (was == 2) {
            atomic_store(&m->in_use, false);
            if (atomic_load(&m->idle_unload)) {
                pthread_cond_broadcast(&r->cv); /* the manager times its idle unload */
            }
        } else if (was == 1) {
            m->reap_next = r->reap;
            r->reap = m;
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&r->mu);
        return;
    }
    int was = atomic_fetch_sub(&m->refs, 1);
    SP_ASSERT(was > 0); /* released more often than referenced */
    if (was != 1) {
        return;
    }
    /* Nothing points at it any more: the manager frees it (it joins the
     * engine threads and unmaps the weights, too slow for a loop thread). */
    sp_registry_t *r = &m->srv->reg;
    pthread_mutex_lock(&r->mu);
    m->reap_next = r->reap;
    r->reap = m;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

sp_sched_t *
sp_served_pick(sp_served_model_t *m)
{
    if (m->n_inst == 1) {
        return m->inst[0];
    }
    uint32_t start = atomic_fetch_add(&m->rr, 1);
    int best = -1;
    int64_t best_w = 0;
    for (int k = 0; k < m->n_inst; k++) {
        int i = (int)((start + (uint32_t)k) % (uint32_t)m->n_inst);
        int64_t w = sp_sched_outstanding(m->inst[i]);
        if (best < 0 || w < best_w) {
            best = i;
            best_w = w;
        }
    }
    return m->inst[best];
}

void
sp_served_apply_defaults(const sp_served_model_t *m, sp_sampler_params_t *sp)
{
    const sp_served_defaults_t *d = &m->def;
    if (!isnan(d->temperature)) sp->temperature = (float)d->temperature;
    if (!isnan(d->top_p)) sp->top_p = (float)d->top_p;
    if (!isnan(d->min_p)) sp->min_p = (float)d->min_p;
    if (!isnan(d->repeat_penalty)) sp->repeat_penalty = (float)d->repeat_penalty;
    if (!isnan(d->frequency_penalty)) sp->frequency_penalty = (float)d->frequency_penalty;
    if (!isnan(d->presence_penalty)) sp->presence_penalty = (float)d->presence_penalty;
    if (d->top_k >= 0) sp->top_k = d->top_k;
    if (d->seed_set) sp->seed = (uint64_t)d->seed;
}

void
sp_served_stats(const sp_served_model_t *m, sp_sched_stats_t *o)
{
    m->kind->stats(m, o);
}

