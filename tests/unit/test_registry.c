/* test_registry.c - the registry's state machine (serving/registry.c), driven
 * through registry.h with a fake model kind: the memory reserved between a
 * kind's probe and its start (and returned when the start fails), references
 * that keep a model alive after it is unpublished, LRU eviction under a
 * device budget, the idle unload (keep_alive) that waits for requests, the
 * on-demand mark a lookup sets and the manager takes, and the entry states a
 * lookup sees. Loading real files is covered by
 * tests/py/test_repository.py and test_tensor_models.py. */
#include "test.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/registry.h"
#include "serving/serving.h"

/* ------------------------------------------------------------ a fake kind */

static uint64_t g_need;        /* bytes the next probe asks for on the CPU */
static bool g_fail_probe, g_fail_start;
static int g_probed, g_started, g_stopped, g_freed;
static uint64_t g_used_at_start; /* the CPU's reservation when start ran */

static sp_status_t
fake_probe(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
           size_t err_len)
{
    (void)s;
    (void)cfg;
    g_probed++;
    m->n_inst = 1;
    m->inst_dev[0] = 0;
    m->charge[0] = g_need;
    if (g_fail_probe) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "probe failed");
    }
    return SP_OK;
}

static sp_status_t
fake_start(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
           size_t err_len)
{
    (void)cfg;
    g_used_at_start = s->reg.used[0];
    m->kind_data = sp_malloc(16); /* freed by fake_free: the sanitizer build checks */
    if (g_fail_start) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "start failed");
    }
    g_started++;
    return SP_OK;
}

static void
fake_stop(sp_served_model_t *m)
{
    (void)m;
    g_stopped++;
}

static void
fake_free(sp_served_model_t *m)
{
    g_freed++;
    sp_free(m->kind_data);
    m->kind_data = NULL;
}

static void
fake_stats(const sp_served_model_t *m, sp_sched_stats_t *o)
{
    (void)m;
    memset(o, 0, sizeof *o);
}

static const sp_model_kind_t fake_kind = {
    .name = "fake",
    .probe = fake_probe,
    .start = fake_start,
    .stop = fake_stop,
    .free = fake_free,
    .stats = fake_stats,
};

/* ------------------------------------------------------------ helpers */

/* A serving struct with only its registry set up: budget bytes on every device. */
static sp_serving_t *
make(const char *budget)
{
    sp_log_set_level(SP_LOG_LEVEL_WARN);
    sp_serving_t *s = sp_calloc(1, sizeof *s);
    ASSERT(s != NULL);
    char err[256];
    s->cfg.keep_alive_s = -1; /* no idle unload unless a test sets one */
    ASSERT_OK(sp_registry_init(&s->reg, budget, err, sizeof err));
    ASSERT(s->reg.n_dev >= 1);
    g_need = 0;
    g_fail_probe = g_fail_start = false;
    g_probed = g_started = g_stopped = g_freed = 0;
    return s;
}

static void
done(sp_serving_t *s)
{
    sp_registry_fini(&s->reg);
    sp_free(s);
}

/* Build a fake model of need bytes and publish it in the entry (name, version). */
static sp_served_model_t *
serve(sp_serving_t *s, const char *name, int64_t version, uint64_t need)
{
    sp_registry_t *r = &s->reg;
    g_need = need;
    sp_served_model_t *m = NULL;
    char err[1024];
    sp_status_t st = sp_registry_build(s, &fake_kind, name, version, true, "/nonexistent", NULL,
                                       0, &m, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("build %s: %s", name, err);
    }
    pthread_mutex_lock(&r->mu);
    sp_model_entry_t *e = sp_registry_entry(r, name, version, true);
    ASSERT(e != NULL);
    sp_served_model_t *old = sp_registry_publish_locked(r, e, m);
    pthread_mutex_unlock(&r->mu);
    ASSERT(old == NULL);
    return m;
}

static sp_acq_t
acquire(sp_serving_t *s, const char *name, bool allow_load, sp_served_model_t **out)
{
    char reason[1024];
    return sp_registry_acquire(s, name, strlen(name), NULL, 0, allow_load, out, reason,
                               sizeof reason);
}

static sp_model_entry_t *
entry(sp_serving_t *s, const char *name, int64_t version)
{
    pthread_mutex_lock(&s->reg.mu);
    sp_model_entry_t *e = sp_registry_entry(&s->reg, name, version, false);
    pthread_mutex_unlock(&s->reg.mu);
    return e;
}

/* ------------------------------------------------------------ reservation */

TEST(registry_reserves_between_probe_and_start)
{
    sp_serving_t *s = make("1000000");
    sp_served_model_t *m = serve(s, "a", 1, 400000);
    ASSERT_EQ(g_probed, 1);
    ASSERT_EQ(g_started, 1);
    ASSERT_EQ(g_used_at_start, 400000); /* reserved before start ran */
    ASSERT_EQ(s->reg.used[0], 400000);
    ASSERT_EQ(m->mem_bytes, 400000);
    ASSERT(m->reserved);
    ASSERT(s->reg.all == m);
    done(s);
    ASSERT_EQ(g_freed, 1);
}

TEST(registry_returns_reservation_on_failed_start)
{
    sp_serving_t *s = make("1000000");
    g_need = 300000;
    g_fail_start = true;
    sp_served_model_t *m = NULL;
    char err[1024];
    ASSERT(sp_registry_build(s, &fake_kind, "a", 1, true, "/x", NULL, 0, &m, err, sizeof err) !=
           SP_OK);
    ASSERT(m == NULL);
    ASSERT_STR_EQ(err, "start failed");
    ASSERT_EQ(g_used_at_start, 300000);
    ASSERT_EQ(s->reg.used[0], 0);  /* given back */
    ASSERT_EQ(g_freed, 1);         /* what start made is freed */
    ASSERT(s->reg.all == NULL);
    /* A failed probe reserves nothing and starts nothing. */
    g_fail_start = false;
    g_fail_probe = true;
    ASSERT(sp_registry_build(s, &fake_kind, "a", 1, true, "/x", NULL, 0, &m, err, sizeof err) !=
           SP_OK);
    ASSERT_EQ(g_started, 0);
    ASSERT_EQ(s->reg.used[0], 0);
    ASSERT_EQ(g_freed, 2);
    /* The budget is whole again: a model of all of it fits. */
    g_fail_probe = false;
    serve(s, "b", 1, 1000000);
    ASSERT_EQ(s->reg.used[0], 1000000);
    done(s);
}

TEST(registry_refuses_what_cannot_fit)
{
    sp_serving_t *s = make("1000000");
    sp_served_model_t *a = serve(s, "a", 1, 600000);
    sp_served_model_t *held = NULL;
    ASSERT_EQ(acquire(s, "a", false, &held), SP_ACQ_OK); /* a request on it: not idle */
    ASSERT(held == a);
    g_need = 600000;
    sp_served_model_t *m = NULL;
    char err[1024];
    ASSERT_EQ(sp_registry_build(s, &fake_kind, "b", 1, true, "/x", NULL, 0, &m, err, sizeof err),
              SP_ERR_TOO_LARGE);
    ASSERT(strstr(err, "memory budget") != NULL);
    ASSERT_EQ(g_started, 1);           /* b never started */
    ASSERT_EQ(s->reg.used[0], 600000); /* a kept, nothing evicted */
    ASSERT_EQ(s->reg.evictions, 0);
    ASSERT(entry(s, "a", 1)->live == a);
    /* Bigger than the whole budget: refused even with nothing else loaded. */
    sp_served_release(held);
    g_need = 2000000;
    ASSERT_EQ(sp_registry_build(s, &fake_kind, "c", 1, true, "/x", NULL, 0, &m, err, sizeof err),
              SP_ERR_TOO_LARGE);
    ASSERT(entry(s, "a", 1)->live == a);
    done(s);
}

/* ------------------------------------------------------------ eviction */

TEST(registry_evicts_least_recently_used)
{
    sp_serving_t *s = make("1000000");
    sp_served_model_t *a = serve(s, "a", 1, 400000);
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    serve(s, "b", 1, 400000);
    nanosleep(&ts, NULL);
    /* a is used after b was built: b is now the least recently used. */
    sp_served_model_t *m = NULL;
    ASSERT_EQ(acquire(s, "a", false, &m), SP_ACQ_OK);
    sp_served_release(m);
    serve(s, "c", 1, 400000);
    ASSERT_EQ(s->reg.evictions, 1);
    sp_model_entry_t *eb = entry(s, "b", 1);
    ASSERT(eb->live == NULL);
    ASSERT_EQ(eb->state, SP_REPO_UNAVAILABLE);
    ASSERT(eb->on_demand); /* loads again on its next request */
    ASSERT(strstr(eb->reason, "least recently used") != NULL);
    ASSERT(entry(s, "a", 1)->live == a);
    ASSERT_EQ(g_freed, 1);             /* b, at once: no request held it */
    ASSERT_EQ(s->reg.used[0], 800000); /* a and c */
    done(s);
}

TEST(registry_never_evicts_a_model_in_use_or_pinned)
{
    sp_serving_t *s = make("1000000");
    serve(s, "a", 1, 300000);
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    sp_served_model_t *b = serve(s, "b", 1, 300000);
    nanosleep(&ts, NULL);
    sp_served_model_t *c = serve(s, "c", 1, 300000);
    entry(s, "a", 1)->pinned = true; /* oldest, but a --model model */
    sp_served_model_t *held = NULL;
    ASSERT_EQ(acquire(s, "b", false, &held), SP_ACQ_OK); /* b: a request holds it */
    ASSERT(held == b);
    nanosleep(&ts, NULL);
    sp_served_model_t *m = NULL;
    ASSERT_EQ(acquire(s, "c", false, &m), SP_ACQ_OK); /* c: newest use, but idle */
    sp_served_release(m);
    serve(s, "d", 1, 300000);
    ASSERT(entry(s, "a", 1)->live != NULL);
    ASSERT(entry(s, "b", 1)->live == b);
    ASSERT(entry(s, "c", 1)->live == NULL); /* the only idle, unpinned one */
    ASSERT(c != NULL);
    ASSERT_EQ(s->reg.evictions, 1);
    sp_served_release(held);
    done(s);
}

/* ------------------------------------------------------------ idle unload */

TEST(registry_idle_unload_waits_for_requests)
{
    sp_serving_t *s = make("1000000");
    sp_served_model_t *a = serve(s, "a", 1, 100000);
    int64_t next = INT64_MAX;
    pthread_mutex_lock(&s->reg.mu);
    ASSERT(sp_registry_expire_locked(&s->reg, INT64_MAX - 1, &next) == NULL); /* none set: never */
    pthread_mutex_unlock(&s->reg.mu);
    ASSERT_EQ(next, INT64_MAX);

    sp_served_keep_alive(a, 0); /* unloaded once no request holds it */
    sp_served_model_t *req = NULL;
    ASSERT_EQ(acquire(s, "a", false, &req), SP_ACQ_OK);
    int64_t later = sp_time_ns() + 1000000000LL;
    pthread_mutex_lock(&s->reg.mu);
    ASSERT(sp_registry_expire_locked(&s->reg, later, &next) == NULL); /* a request holds it */
    pthread_mutex_unlock(&s->reg.mu);
    sp_served_release(req);
    int64_t idle = atomic_load(&a->idle_ns);
    ASSERT(idle >= atomic_load(&a->last_used_ns)); /* idle from the request's end */

    /* 5 s: due 5 s after that end; a listing's reference is not use. */
    sp_served_keep_alive(a, 5000000000LL);
    sp_served_model_t **all = NULL;
    int n = sp_registry_snapshot(s, &all);
    ASSERT_EQ(n, 1);
    sp_served_release(all[0]);
    sp_free(all);
    ASSERT_EQ(atomic_load(&a->idle_ns), idle);
    next = INT64_MAX;
    pthread_mutex_lock(&s->reg.mu);
    ASSERT(sp_registry_expire_locked(&s->reg, idle + 4999999999LL, &next) == NULL);
    ASSERT_EQ(next, idle + 5000000000LL);
    sp_served_model_t *gone = sp_registry_expire_locked(&s->reg, idle + 5000000000LL, &next);
    pthread_mutex_unlock(&s->reg.mu);
    ASSERT(gone == a);
    sp_model_entry_t *e = entry(s, "a", 1);
    ASSERT(e->live == NULL && e->on_demand && e->state == SP_REPO_UNAVAILABLE);
    ASSERT(strstr(e->reason, "keep_alive") != NULL);
    sp_served_release(gone);
    sp_registry_reap(&s->reg);
    ASSERT_EQ(g_freed, 1);
    ASSERT_EQ(s->reg.used[0], 0);
    /* The next request asks for it again (the manager loads it on demand). */
    sp_served_model_t *m = NULL;
    ASSERT_EQ(acquire(s, "a", true, &m), SP_ACQ_LOADING);
    ASSERT(entry(s, "a", 1)->demanded);
    done(s);
}

/* ------------------------------------------------------------ references */

TEST(registry_reference_keeps_unpublished_model_alive)
{
    sp_serving_t *s = make("1000000");
    sp_served_model_t *a = serve(s, "a", 1, 100000);
    sp_served_model_t *req = NULL;
    ASSERT_EQ(acquire(s, "a", false, &req), SP_ACQ_OK);
    ASSERT(req == a);
    ASSERT_EQ(atomic_load(&a->refs), 2);
    /* Unload: the entry stops routing and drops its reference. */
    pthread_mutex_lock(&s->reg.mu);
    sp_model_entry_t *e = sp_registry_entry(&s->reg, "a", 1, false);
    sp_served_model_t *old = sp_registry_unpublish_locked(&s->reg, e, "unloaded");
    pthread_mutex_unlock(&s->reg.mu);
    ASSERT(old == a);
    ASSERT_EQ(e->state, SP_REPO_UNAVAILABLE);
    sp_served_release(old);
    sp_served_model_t *m = NULL;
    ASSERT_EQ(acquire(s, "a", false, &m), SP_ACQ_UNAVAILABLE);
    ASSERT(s->reg.reap == NULL); /* the request still holds it */
    sp_registry_reap(&s->reg);
    ASSERT_EQ(g_freed, 0);
    ASSERT_EQ(s->reg.used[0], 100000); /* still counted while it drains */
    /* The request ends: the manager frees it on its next pass. */
    sp_served_release(req);
    ASSERT(s->reg.reap == a);
    ASSERT_EQ(g_freed, 0); /* never on the releasing thread */
    sp_registry_reap(&s->reg);
    ASSERT_EQ(g_freed, 1);
    ASSERT_EQ(s->reg.used[0], 0);
    ASSERT(s->reg.all == NULL);
    done(s);
}

TEST(registry_publish_swaps_versions)
{
    sp_serving_t *s = make("1000000");
    sp_served_model_t *v1 = serve(s, "a", 1, 100000);
    g_need = 100000;
    sp_served_model_t *n1 = NULL;
    char err[256];
    ASSERT_OK(sp_registry_build(s, &fake_kind, "a", 1, true, "/x", NULL, 0, &n1, err, sizeof err));
    sp_served_model_t *req = NULL;
    ASSERT_EQ(acquire(s, "a", false, &req), SP_ACQ_OK);
    ASSERT(req == v1);
    sp_model_entry_t *e = entry(s, "a", 1);
    pthread_mutex_lock(&s->reg.mu);
    sp_served_model_t *old = sp_registry_publish_locked(&s->reg, e, n1);
    pthread_mutex_unlock(&s->reg.mu);
    ASSERT(old == v1);
    sp_served_release(old);
    sp_served_model_t *m = NULL;
    ASSERT_EQ(acquire(s, "a", false, &m), SP_ACQ_OK);
    ASSERT(m == n1); /* new lookups get the new model */
    sp_served_release(m);
    /* The highest READY version answers a bare name. */
    sp_served_model_t *v2 = serve(s, "a", 2, 100000);
    ASSERT_EQ(acquire(s, "a", false, &m), SP_ACQ_OK);
    ASSERT(m == v2);
    sp_served_release(m);
    ASSERT_EQ(sp_registry_acquire(s, "a", 1, "1", 1, false, &m, err, sizeof err), SP_ACQ_OK);
    ASSERT(m == n1);
    sp_served_release(m);
    ASSERT_EQ(acquire(s, "nope", false, &m), SP_ACQ_UNKNOWN);
    /* "<model>:<adapter>" with no such model falls back to the base's entry. */
    ASSERT_EQ(acquire(s, "a:lora", false, &m), SP_ACQ_OK);
    ASSERT(m == v2);
    sp_served_release(m);
    sp_served_release(req);
    sp_registry_reap(&s->reg);
    ASSERT_EQ(g_freed, 1); /* v1 */
    done(s);
}

/* ------------------------------------------------------------ on demand */

/* An entry that loads on its first request (load_on_demand, or evicted). */
static sp_model_entry_t *
lazy_entry(sp_serving_t *s, const char *name, int64_t version)
{
    pthread_mutex_lock(&s->reg.mu);
    sp_model_entry_t *e = sp_registry_entry(&s->reg, name, version, true);
    e->from_repo = true;
    e->on_demand = true;
    e->state = SP_REPO_UNAVAILABLE;
    snprintf(e->reason, sizeof e->reason, "not loaded yet");
    pthread_mutex_unlock(&s->reg.mu);
    return e;
}

TEST(registry_demand_marks_entry_for_the_manager)
{
    sp_serving_t *s = make("1000000");
    sp_model_entry_t *e = lazy_entry(s, "lazy", 3);
    sp_served_model_t *m = NULL;
    /* A lookup that may not load (gRPC metadata, KServe ready) only reports. */
    ASSERT_EQ(acquire(s, "lazy", false, &m), SP_ACQ_UNAVAILABLE);
    ASSERT(!e->demanded);
    ASSERT_EQ(s->reg.n_demanded, 0);
    ASSERT_EQ(acquire(s, "lazy", true, &m), SP_ACQ_LOADING);
    ASSERT(m == NULL);
    ASSERT(e->demanded);
    ASSERT_EQ(e->state, SP_REPO_LOADING);
    ASSERT_EQ(s->reg.n_demanded, 1);
    ASSERT_EQ(acquire(s, "lazy", true, &m), SP_ACQ_LOADING); /* marked once */
    ASSERT_EQ(s->reg.n_demanded, 1);
    char name[128];
    int64_t version = 0;
    pthread_mutex_lock(&s->reg.mu);
    ASSERT(sp_registry_take_demand_locked(&s->reg, name, sizeof name, &version));
    ASSERT(!sp_registry_take_demand_locked(&s->reg, name, sizeof name, &version));
    pthread_mutex_unlock(&s->reg.mu);
    ASSERT_STR_EQ(name, "lazy");
    ASSERT_EQ(version, 3);
    ASSERT(!e->demanded);
    ASSERT_EQ(s->reg.n_demanded, 0);
    /* Unpublishing a demanded entry withdraws its mark. */
    ASSERT_EQ(acquire(s, "lazy", true, &m), SP_ACQ_LOADING); /* still LOADING: no new mark */
    ASSERT_EQ(s->reg.n_demanded, 0);
    pthread_mutex_lock(&s->reg.mu);
    e->state = SP_REPO_UNAVAILABLE;
    pthread_mutex_unlock(&s->reg.mu);
    ASSERT_EQ(acquire(s, "lazy", true, &m), SP_ACQ_LOADING);
    ASSERT_EQ(s->reg.n_demanded, 1);
    pthread_mutex_lock(&s->reg.mu);
    sp_registry_unpublish_locked(&s->reg, e, "unloaded");
    ASSERT(!sp_registry_take_demand_locked(&s->reg, name, sizeof name, &version));
    pthread_mutex_unlock(&s->reg.mu);
    ASSERT_EQ(s->reg.n_demanded, 0);
    done(s);
}

/* A manager in miniature: waits on the registry's condition variable for a
 * demanded entry, builds it and publishes it. */
typedef struct mini_mgr {
    sp_serving_t *s;
    bool stop;
    int loads;
} mini_mgr_t;

static void *
mini_mgr_main(void *arg)
{
    mini_mgr_t *mm = arg;
    sp_registry_t *r = &mm->s->reg;
    pthread_mutex_lock(&r->mu);
    while (!mm->stop) {
        char name[128];
        int64_t version;
        if (!sp_registry_take_demand_locked(r, name, sizeof name, &version)) {
            pthread_cond_wait(&r->cv, &r->mu); /* woken by the lookup, not by a timer */
            continue;
        }
        pthread_mutex_unlock(&r->mu);
        sp_served_model_t *m = NULL;
        char err[256];
        sp_status_t st = sp_registry_build(mm->s, &fake_kind, name, version, true, "/x", NULL, 0,
                                           &m, err, sizeof err);
        pthread_mutex_lock(&r->mu);
        if (st == SP_OK) {
            sp_registry_publish_locked(r, sp_registry_entry(r, name, version, false), m);
            mm->loads++;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

TEST(registry_demand_wakes_manager_which_loads)
{
    sp_serving_t *s = make("1000000");
    g_need = 1000;
    lazy_entry(s, "lazy", 1);
    mini_mgr_t mm = {s, false, 0};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, mini_mgr_main, &mm), 0);
    sp_served_model_t *m = NULL;
    ASSERT_EQ(acquire(s, "lazy", true, &m), SP_ACQ_LOADING);
    int64_t deadline = sp_time_ns() + 5000000000LL;
    sp_acq_t a;
    while ((a = acquire(s, "lazy", true, &m)) == SP_ACQ_LOADING && sp_time_ns() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ASSERT_EQ(a, SP_ACQ_OK);
    ASSERT(m != NULL);
    ASSERT_STR_EQ(m->name, "lazy");
    sp_served_release(m);
    pthread_mutex_lock(&s->reg.mu);
    mm.stop = true;
    pthread_cond_broadcast(&s->reg.cv);
    pthread_mutex_unlock(&s->reg.mu);
    pthread_join(t, NULL);
    ASSERT_EQ(mm.loads, 1); /* once, though the request asked many times */
    done(s);
}

TEST(registry_stop_all_goes_through_the_kind)
{
    sp_serving_t *s = make("1000000");
    serve(s, "a", 1, 1000);
    serve(s, "b", 1, 1000);
    sp_registry_stop_all(&s->reg);
    ASSERT_EQ(g_stopped, 2);
    sp_served_model_t **ms = NULL;
    ASSERT_EQ(sp_registry_snapshot(s, &ms), 2);
    ASSERT_STR_EQ(ms[0]->name, "a"); /* by name */
    sp_sched_stats_t st;
    sp_served_stats(ms[1], &st);
    ASSERT_EQ(st.queued, 0);
    sp_served_release(ms[0]);
    sp_served_release(ms[1]);
    sp_free(ms);
    done(s);
    ASSERT_EQ(g_freed, 2);
}
