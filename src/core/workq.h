/*
 * workq.h - a small queue of tasks run by a few worker threads.
 *
 * For work that must not run on an event loop (template rendering,
 * tokenizing, grammar compiling of one request): the loop submits a task,
 * a worker runs it, and the task hands its result back to the loop itself
 * (the server posts it to the loop's mailbox). Tasks run in submission order
 * on whichever worker is free; at most max_pending wait, so a flood of
 * expensive requests is refused (SP_ERR_BUSY) instead of queueing without
 * bound. sp_pool_t (pool.h) is for data-parallel kernels with one caller;
 * this is its opposite: independent tasks from any thread.
 */
#ifndef SP_CORE_WORKQ_H
#define SP_CORE_WORKQ_H

#include <stddef.h>

#include "sampan/status.h"

typedef struct sp_workq sp_workq_t;
typedef void (*sp_workq_fn)(void *arg);

/* n_threads in [1, 64]; max_pending >= 1 (tasks waiting, not running). */
sp_status_t sp_workq_create(int n_threads, int max_pending, sp_workq_t **out);
/* Any thread: queue fn(arg). SP_ERR_BUSY when max_pending tasks wait,
 * SP_ERR_NOMEM, SP_ERR_CANCELLED after sp_workq_destroy began; on an error
 * fn is not called and arg stays the caller's. */
sp_status_t sp_workq_submit(sp_workq_t *q, sp_workq_fn fn, void *arg);
/* Tasks waiting now (for metrics and tests). */
int sp_workq_pending(sp_workq_t *q);
/* Refuse new tasks (SP_ERR_CANCELLED), run every task still queued and join
 * the workers; q stays valid for submit (refused) until destroyed. */
void sp_workq_shutdown(sp_workq_t *q);
/* Shutdown (when not done yet) and free. NULL: no-op. */
void sp_workq_destroy(sp_workq_t *q);

#endif /* SP_CORE_WORKQ_H */
