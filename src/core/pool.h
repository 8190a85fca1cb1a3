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
/* The same, counted under label (a string that outlives the profile; NULL: "other") when
 * profiling. */
void sp_pool_run_as(sp_pool_t *p, const char *label, sp_pool_fn fn, void *ctx,
                    int64_t n_chunks);

/*
 * Where the caller's time goes, job by job. While a profile is set (sp_pool_profile), every
 * run adds to the entry of its label (sp_pool_run counts under "other"): one call, its
 * chunks, its wall time from the call until its last chunk is done, and the part of that the
 * caller spent waiting for chunks other threads were still running after none was left to
 * claim (the job's tail: threads idle while one finishes). Two clock reads a run; nothing
 * when no profile is set. Labels are told apart by their text; runs under labels beyond the
 * table's SP_POOL_PROF_MAX are counted in overflow_calls only.
 */
#define SP_POOL_PROF_MAX 32

typedef struct sp_pool_prof_entry {
    const char *label;
    int64_t calls;
    int64_t chunks;
    int64_t ns;      /* wall time of the runs */
    int64_t wait_ns; /* of which the caller waited for other threads' last chunks */
} sp_pool_prof_entry_t;

typedef struct sp_pool_prof {
    int n; /* entries used, in the order their labels first ran */
    sp_pool_prof_entry_t e[SP_POOL_PROF_MAX];
    int64_t overflow_calls;
} sp_pool_prof_t;

/* Adds the runs from now on to prof (the caller's; NULL stops). The pool's one caller only. */
void sp_pool_profile(sp_pool_t *p, sp_pool_prof_t *prof);
/* Empties prof. */
void sp_pool_prof_reset(sp_pool_prof_t *prof);

#endif /* SP_CORE_POOL_H */
