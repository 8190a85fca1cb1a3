/*
 * pool.c - spin-then-sleep worker pool; see pool.h for the contract.
 *
 * Wake-up protocol (no lost wake-ups): the caller publishes a job by bumping
 * `gen` (seq_cst), then, only if some worker announced it is going to sleep,
 * takes the mutex and broadcasts. A worker announces itself (n_sleeping++)
 * under the mutex before it re-reads `gen` and waits, so either it sees the new
 * generation or the caller sees it sleeping.
 */
#include "core/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/timer.h"

/* A waiting thread polls with `pause` for SPIN_PAUSE rounds, then yields the
 * core between polls (when the machine is oversubscribed a pure spinner would
 * burn the time slice the thread it waits for needs), and a worker goes to
 * sleep once SPIN_NS has passed without a job. */
#define SPIN_PAUSE 2000
#define SPIN_NS 2000000 /* 2 ms */

struct sp_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;        /* job generation; bumped once per sp_pool_run */
    atomic_int n_done;      /* workers finished with the current job */
    atomic_int n_sleeping;
    atomic_bool stop;
    sp_pool_fn fn;
    void *ctx;
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

static void *
worker(void *arg)
{
    worker_arg *wa = arg;
    sp_pool_t *p = wa->p;
    int ith = wa->ith;
    unsigned seen = 0;
    sp_free(wa);

    for (;;) {
        unsigned g;
        int spins = 0;
        int64_t t_sleep = 0;
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) {
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
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
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
        p->fn(p->ctx, ith, p->n_threads);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
}

sp_status_t
sp_pool_create(int n_threads, sp_pool_t **out)
{
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
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
    /* Workers read n_threads only inside a job, after the first gen bump. */
    p->n_threads = n_threads;
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
sp_pool_run(sp_pool_t *p, sp_pool_fn fn, void *ctx)
{
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->n_done, 0);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n_threads);
    for (int spins = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) < p->n_threads - 1;) {
        if (++spins < SPIN_PAUSE) {
            cpu_relax();
        } else {
            sched_yield();
        }
    }
}
