/*
 * drain.h - how fast a queue drains, for the Retry-After of a 429.
 *
 * A queue that refuses a request (it is full) tells the client when to come
 * back: the time the requests ahead of it need to leave, at the rate the
 * queue has been draining lately. The rate is counted in one-second bins
 * over the last SP_DRAIN_WINDOW_S seconds, from the oldest second that saw a
 * completion (a burst after an idle spell is measured over the burst, not
 * over the idle seconds). Lock-free (atomics): completions are noted by
 * engine and batcher threads, estimates read by the event loops. Two threads
 * rolling the same bin over at the same instant may lose a few counts: the
 * rate is an estimate. A zeroed sp_drain_t is ready to use.
 */
#ifndef SP_SCHED_DRAIN_H
#define SP_SCHED_DRAIN_H

#include <stdatomic.h>
#include <stdint.h>

#define SP_DRAIN_WINDOW_S 10
#define SP_RETRY_AFTER_MIN_S 1
#define SP_RETRY_AFTER_MAX_S 60

typedef struct sp_drain {
    _Atomic int64_t sec[SP_DRAIN_WINDOW_S + 1]; /* which second each bin counts */
    _Atomic int64_t n[SP_DRAIN_WINDOW_S + 1];
} sp_drain_t;

/* k items left the queue (completed) at now_ns (sp_time_ns clock). */
void sp_drain_note(sp_drain_t *d, int64_t k, int64_t now_ns);
/* Seconds to wait for `ahead` items (the refused one's own included) to drain
 * at the recent rate, clamped to SP_RETRY_AFTER_MIN_S..SP_RETRY_AFTER_MAX_S. */
int sp_drain_retry_after_s(sp_drain_t *d, int64_t ahead, int64_t now_ns);
/* The computation: `done` items drained in the last span_s seconds (at least
 * 1 s) give the rate; with none seen, one per second is assumed. Returns
 * ceil(ahead / rate), clamped as above. */
int sp_drain_retry_after_rate_s(int64_t ahead, int64_t done, double span_s);

#endif /* SP_SCHED_DRAIN_H */
