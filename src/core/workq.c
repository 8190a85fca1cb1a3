/*
 * workq.c - task queue with worker threads; see workq.h for the contract.
 *
 * One mutex guards a FIFO list of tasks; workers sleep on a condition
 * variable while it is empty. Destroy sets `stop` and wakes everyone: workers
 * keep taking tasks until the list is empty, then exit, so every task that
 * was accepted runs exactly once.
 */
#include "core/workq.h"

#include <pthread.h>
#include <stdbool.h>

#include "core/alloc.h"

typedef struct task {
    sp_workq_fn fn;
    void *arg;
    struct task *next;
} task_t;

struct sp_workq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task_t *head, *tail;
    int n_pending, max_pending;
    bool stop;
    bool joined;
    int n_threads;
    pthread_t *threads;
};

static void *
worker(void *arg)
{
    sp_workq_t *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->head == NULL && !q->stop) {
            pthread_cond_wait(&q->cv, &q->mu);
        }
        task_t *t = q->head;
        if (t == NULL) { /* stopping and nothing left */
            break;
        }
        q->head = t->next;
        if (q->head == NULL) {
            q->tail = NULL;
        }
        q->n_pending--;
        pthread_mutex_unlock(&q->mu);
        t->fn(t->arg);
        sp_free(t);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

sp_status_t
sp_workq_create(int n_threads, int max_pending, sp_workq_t **out)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 64 || max_pending < 1) {
        return SP_ERR_INVALID;
    }
    sp_workq_t *q = sp_calloc(1, sizeof *q);
    if (q == NULL) {
        return SP_ERR_NOMEM;
    }
    q->threads = sp_calloc((size_t)n_threads, sizeof *q->threads);
    if (q->threads == NULL) {
        sp_free(q);
        return SP_ERR_NOMEM;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->max_pending = max_pending;
    /* Tasks may recurse deeply (a chat template render needs about 256 KiB
     * of stack at -O2, a few MiB under ASan): 8 MiB whatever the default. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, (size_t)8 << 20);
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&q->threads[i], &attr, worker, q) != 0) {
            break;
        }
        q->n_threads++;
    }
    pthread_attr_destroy(&attr);
    if (q->n_threads == 0) {
        sp_workq_destroy(q);
        return SP_ERR_NOMEM;
    }
    *out = q;
    return SP_OK;
}

sp_status_t
sp_workq_submit(sp_workq_t *q, sp_workq_fn fn, void *arg)
{
    task_t *t = sp_malloc(sizeof *t);
    if (t == NULL) {
        return SP_ERR_NOMEM;
    }
    t->fn = fn;
    t->arg = arg;
    t->next = NULL;
    pthread_mutex_lock(&q->mu);
    sp_status_t st = q->stop ? SP_ERR_CANCELLED : q->n_pending >= q->max_pending ? SP_ERR_BUSY : SP_OK;
    if (st == SP_OK) {
        if (q->tail) {
            q->tail->next = t;
        } else {
            q->head = t;
        }
        q->tail = t;
        q->n_pending++;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    if (st != SP_OK) {
        sp_free(t);
    }
    return st;
}

int
sp_workq_pending(sp_workq_t *q)
{
    pthread_mutex_lock(&q->mu);
    int n = q->n_pending;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void
sp_workq_shutdown(sp_workq_t *q)
{
    if (q == NULL || q->joined) {
        return;
    }
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n_threads; i++) {
        pthread_join(q->threads[i], NULL);
    }
    q->joined = true;
}

void
sp_workq_destroy(sp_workq_t *q)
{
    if (q == NULL) {
        return;
    }
    sp_workq_shutdown(q);
    /* No task is left: the workers took all of them before they exited, and
     * none can be queued after stop. */
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    sp_free(q->threads);
    sp_free(q);
}
