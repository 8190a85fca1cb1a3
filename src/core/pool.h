/*
 * pool.h - a fixed thread pool for data-parallel kernels.
 *
 * sp_pool_run(p, fn, ctx, n_chunks) calls fn(ctx, chunk, ith) once for every
 * chunk in [0, n_chunks) and returns when all have run. Threads claim chunks
 * one at a time from a shared ticket; the caller is thread 0 and claims too.
 * ith (0 .. n_threads-1) is unique among the threads running at the same
 * time, so it can index per-thread scratch.
 *
 * Why chunks, not "part ith of nth": on a machine shared with other busy
 * processes (HTTP threads, other models) a worker can be descheduled for a
 * whole time slice. With a static split the step then waits for it; with
 * claimed chunks the running threads take its share and the step only waits
 * for chunks actually in progress. A worker that wakes up late finds the job
 * finished and goes back to waiting.
 *
 * Workers spin briefly between jobs (a decode step issues a few hundred short
 * jobs per token and a futex wake costs more than a small product), then
 * yield, then sleep on a condition variable so an idle server uses no CPU.
 * One caller at a time: a pool belongs to one engine context.
 */
#ifndef SP_CORE_POOL_H
#define SP_CORE_POOL_H

#include <stdint.h>

#include "sampan/status.h"

#define SP_POOL_MAX_CHUNKS ((int64_t)1 << 18) /* per job */

typedef struct sp_pool sp_pool_t;
typedef void (*sp_pool_fn)(void *ctx, int64_t chunk, int ith);

/* n_threads <= 0 means one per online core. */
/* n_threads <= 0: sp_pool_cpu_count(). */
sp_status_t sp_pool_create(int n_threads, sp_pool_t **out);
/* CPUs this process may use: the affinity mask, capped by the cgroup's
 * cpu.max quota (a container limited to 2 CPUs on a 64-core node gets 2). */
int sp_pool_cpu_count(void);
void sp_pool_destroy(sp_pool_t *p); /* NULL is a no-op */
int sp_pool_n_threads(const sp_pool_t *p);
/* n_chunks in [0, SP_POOL_MAX_CHUNKS]; with 0 it returns at once. */
void sp_pool_run(sp_pool_t *p, sp_pool_fn fn, void *ctx, int64_t n_chunks);

#endif /* SP_CORE_POOL_H */
