/*
 * pool.h - a fixed thread pool for data-parallel kernels.
 *
 * sp_pool_run(p, fn, ctx) calls fn(ctx, ith, nth) once on each of the nth
 * threads (the caller is thread 0) and returns when all have finished. Workers
 * spin briefly between jobs, because a decode step issues a few hundred short
 * jobs per token and a futex wake costs more than a small matmul, then sleep
 * on a condition variable so an idle server uses no CPU.
 *
 * One caller at a time: a pool belongs to one engine context.
 */
#ifndef SP_CORE_POOL_H
#define SP_CORE_POOL_H

#include "sampan/status.h"

typedef struct sp_pool sp_pool_t;
typedef void (*sp_pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 means one per online core. */
sp_status_t sp_pool_create(int n_threads, sp_pool_t **out);
void sp_pool_destroy(sp_pool_t *p); /* NULL is a no-op */
int sp_pool_n_threads(const sp_pool_t *p);
void sp_pool_run(sp_pool_t *p, sp_pool_fn fn, void *ctx);

#endif /* SP_CORE_POOL_H */
