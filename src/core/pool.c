/*
 * pool.c - chunk-claiming worker pool; see pool.h for the contract.
 *
 * The job state is one 64-bit ticket: job generation (28 bits), chunk count
 * (18 bits) and next unclaimed chunk (18 bits). A thread claims chunk i of
 * job g by a compare-and-swap from (g, n, i) to (g, n, i + 1) with i < n. The
 * count travels inside the ticket, so a late worker can never claim a chunk of
 * a job it has not seen published, and a successful claim proves the job is
 * still current: the caller publishes the next job only after every chunk of
 * this one has completed, and this chunk has not. So fn and ctx, read after
 * the claim, are the right ones.
 *
 * Sleeping (no lost wake-ups): the caller bumps the ticket (seq_cst) and then,
 * only if some worker announced it is going to sleep, takes the mutex and
 * broadcasts. A worker announces itself (n_sleeping++) under the mutex before
 * it re-reads the ticket and waits, so either it sees the new job or the
 * caller sees it sleeping.
 */
#include "core/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/timer.h"

/* A waiting thread polls with `pause` for SPIN_PAUSE rounds, then yields the
 * core between polls (a pure spinner on an oversubscribed machine burns the
 * time slice another thread needs), and a worker sleeps once SPIN_NS has
 * passed without a job. */
#define SPIN_PAUSE 2000
#define SPIN_NS 2000000 /* 2 ms */

#define GEN_BITS 28
#define CNT_BITS 18
#define CNT_MASK ((UINT64_C(1) << CNT_BITS) - 1)
#define T_GEN(t) ((t) >> (2 * CNT_BITS))
#define T_N(t) (((t) >> CNT_BITS) & CNT_MASK)
#define T_NEXT(t) ((t) & CNT_MASK)

struct sp_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t ticket;   /* (gen, n_chunks, next) of the current job */
    atomic_int_fast64_t n_done; /* chunks of the current job completed */
    atomic_int n_sleeping;
    atomic_bool stop;
    sp_pool_fn fn;             /* written before the ticket is published */
    void *ctx;
    sp_pool_prof_t *prof;      /* the caller's profile, or NULL (pool.h) */
};

typedef struct {
    sp_pool_t *p;
    int ith;
} worker_arg;

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run chunks of job `gen` until none is left. */
static void
drain(sp_pool_t *p, uint64_t gen, int ith)
{
    uint64_t t = atomic_load(&p->ticket);
    while (T_GEN(t) == gen && T_NEXT(t) < T_N(t)) {
        if (!atomic_compare_exchange_weak(&p->ticket, &t, t + 1)) {
            continue; /* t was reloaded */
        }
        p->fn(p->ctx, (int64_t)T_NEXT(t), ith);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
        t = atomic_load(&p->ticket);
    }
}

static void *
worker(void *arg)
{
    worker_arg *wa = arg;
    sp_pool_t *p = wa->p;
    int ith = wa->ith;
    /* The generation at create (no job has run yet when the pool starts its workers): a
     * worker that starts after the first job was published still joins it. */
    uint64_t seen = 0;
    sp_free(wa);

    for (;;) {
        uint64_t g;
        int spins = 0;
        int64_t t_sleep = 0;
        while ((g = T_GEN(atomic_load(&p->ticket))) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_PAUSE) {
                cpu_relax();
                continue;
            }
            if (t_sleep == 0) {
                t_sleep = sp_time_ns() + SPIN_NS;
            }
            if (sp_time_ns() < t_sleep) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (T_GEN(atomic_load(&p->ticket)) == seen && !atomic_load(&p->stop)) {
                pthread_cond_wait(&p->cv, &p->mu);
            }
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
            t_sleep = 0;
        }
        if (atomic_load(&p->stop)) {
            return NULL;
        }
        seen = g;
        drain(p, g, ith);
    }
}

/* cgroup v2 cpu.max of this process ("max 100000" or "150000 100000"):
 * the CPUs' worth of time the container may use; 0 when unlimited or absent. */
static int
cgroup_cpus(void)
{
    char path[512] = "/sys/fs/cgroup/cpu.max", line[256];
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "0::", 3) == 0) {
                line[strcspn(line, "\n")] = '\0';
                snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max",
                         strcmp(line + 3, "/") == 0 ? "" : line + 3);
            }
        }
        fclose(f);
    }
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    char quota[32] = "";
    long long period = 0;
    int n = fscanf(f, "%31s %lld", quota, &period);
    fclose(f);
    if (n != 2 || strcmp(quota, "max") == 0 || period <= 0) {
        return 0;
    }
    long long q = atoll(quota);
    return q > 0 ? (int)((q + period - 1) / period) : 0;
}

int
sp_pool_cpu_count(void)
{
    static _Atomic int cached;
    int n = atomic_load(&cached);
    if (n > 0) {
        return n;
    }
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    int q = cgroup_cpus();
    if (q > 0 && q < n) {
        n = q;
    }
    atomic_store(&cached, n);
    return n;
}

sp_status_t
sp_pool_create(int n_threads, sp_pool_t **out)
{
    *out = NULL;
    if (n_threads <= 0) {
        n_threads = sp_pool_cpu_count();
    }
    if (n_threads > 512) {
        n_threads = 512;
    }
    sp_pool_t *p = sp_calloc(1, sizeof *p);
    if (p == NULL) {
        return SP_ERR_NOMEM;
    }
    p->n_threads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = sp_calloc((size_t)n_threads, sizeof(pthread_t));
    if (p->threads == NULL) {
        goto fail;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = sp_malloc(sizeof *wa);
        if (wa == NULL) {
            goto fail;
        }
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa) != 0) {
            sp_free(wa);
            goto fail;
        }
        p->n_threads = i + 1;
    }
    *out = p;
    return SP_OK;
fail:
    sp_pool_destroy(p);
    return SP_ERR_NOMEM;
}

void
sp_pool_destroy(sp_pool_t *p)
{
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) {
        pthread_join(p->threads[i], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    sp_free(p->threads);
    sp_free(p);
}

int
sp_pool_n_threads(const sp_pool_t *p)
{
    return p->n_threads;
}

void
sp_pool_profile(sp_pool_t *p, sp_pool_prof_t *prof)
{
    p->prof = prof;
}

void
sp_pool_prof_reset(sp_pool_prof_t *prof)
{
    memset(prof, 0, sizeof *prof);
}

/* One run of n_chunks under label: t0 its start, t_wait when the caller found nothing left to
 * claim, t1 its end. */
static void
prof_add(sp_pool_prof_t *prof, const char *label, int64_t n_chunks, int64_t t0, int64_t t_wait,
         int64_t t1)
{
    int i = 0;
    while (i < prof->n && prof->e[i].label != label && strcmp(prof->e[i].label, label) != 0) {
        i++;
    }
    if (i == prof->n) {
        if (prof->n == SP_POOL_PROF_MAX) {
            prof->overflow_calls++;
            return;
        }
        prof->e[prof->n++].label = label;
    }
    sp_pool_prof_entry_t *e = &prof->e[i];
    e->calls++;
    e->chunks += n_chunks;
    e->ns += t1 - t0;
    e->wait_ns += t1 - t_wait;
}

/* sp_pool_run's work; t_wait (when not NULL) gets the time the caller ran out of chunks to
 * claim while other threads still ran some (left 0 when it never waited). */
static void
run(sp_pool_t *p, sp_pool_fn fn, void *ctx, int64_t n_chunks, int64_t *t_wait)
{
    if (p->n_threads == 1 || n_chunks == 1 || n_chunks > SP_POOL_MAX_CHUNKS) {
        /* (the last case is a caller bug: still correct, only serial) */
        for (int64_t i = 0; i < n_chunks; i++) {
            fn(ctx, i, 0);
        }
        return;
    }
    /* All chunks of the previous job are complete, so no thread can still
     * claim from it: fn, ctx and n_done are free to change. */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->n_done, 0);
    uint64_t gen = (T_GEN(atomic_load(&p->ticket)) + 1) & ((UINT64_C(1) << GEN_BITS) - 1);
    atomic_store(&p->ticket, gen << (2 * CNT_BITS) | (uint64_t)n_chunks << CNT_BITS);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    drain(p, gen, 0);
    /* Only chunks that other threads claimed and are still running remain. */
    if (t_wait != NULL && atomic_load_explicit(&p->n_done, memory_order_acquire) < n_chunks) {
        *t_wait = sp_time_ns();
    }
    for (int spins = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) < n_chunks;) {
        if (++spins < SPIN_PAUSE) {
            cpu_relax();
        } else {
            sched_yield();
        }
    }
}

void
sp_pool_run(sp_pool_t *p, sp_pool_fn fn, void *ctx, int64_t n_chunks)
{
    sp_pool_run_as(p, "other", fn, ctx, n_chunks);
}

void
sp_pool_run_as(sp_pool_t *p, const char *label, sp_pool_fn fn, void *ctx, int64_t n_chunks)
{
    if (n_chunks <= 0) {
        return;
    }
    if (p->prof == NULL) {
        run(p, fn, ctx, n_chunks, NULL);
        return;
    }
    const int64_t t0 = sp_time_ns();
    int64_t t_wait = 0;
    run(p, fn, ctx, n_chunks, &t_wait);
    const int64_t t1 = sp_time_ns();
    prof_add(p->prof, label != NULL ? label : "other", n_chunks, t0, t_wait != 0 ? t_wait : t1,
             t1);
}
