/* drain.c - a queue's recent drain rate and the Retry-After it implies (drain.h). */
#include "sched/drain.h"

#include <math.h>

#define NS_PER_S 1000000000LL
#define N_BINS (SP_DRAIN_WINDOW_S + 1) /* the window's full seconds and the current one */

int
sp_drain_retry_after_rate_s(int64_t ahead, int64_t done, double span_s)
{
    if (ahead < 1) {
        ahead = 1;
    }
    if (done < 1) {
        done = 1; /* nothing drained lately: no rate to go by, assume one per second */
        span_s = 1.0;
    }
    if (!(span_s >= 1.0)) {
        span_s = 1.0;
    }
    double s = ceil((double)ahead * span_s / (double)done);
    if (s < SP_RETRY_AFTER_MIN_S) {
        return SP_RETRY_AFTER_MIN_S;
    }
    if (s > SP_RETRY_AFTER_MAX_S) {
        return SP_RETRY_AFTER_MAX_S;
    }
    return (int)s;
}

void
sp_drain_note(sp_drain_t *d, int64_t k, int64_t now_ns)
{
    if (k <= 0) {
        return;
    }
    int64_t sec = now_ns / NS_PER_S;
    int i = (int)(sec % N_BINS);
    int64_t was = atomic_load(&d->sec[i]);
    if (was != sec && atomic_compare_exchange_strong(&d->sec[i], &was, sec)) {
        atomic_store(&d->n[i], 0); /* this thread rolled the bin over to the new second */
    }
    atomic_fetch_add(&d->n[i], k);
}

int
sp_drain_retry_after_s(sp_drain_t *d, int64_t ahead, int64_t now_ns)
{
    int64_t sec = now_ns / NS_PER_S, done = 0, oldest = sec;
    for (int i = 0; i < N_BINS; i++) {
        int64_t s = atomic_load(&d->sec[i]);
        int64_t n = atomic_load(&d->n[i]);
        if (s > sec - N_BINS && s <= sec && n > 0) {
            done += n;
            oldest = s < oldest ? s : oldest;
        }
    }
    /* The span: from the start of the oldest second that saw a completion to now. */
    return sp_drain_retry_after_rate_s(ahead, done, (double)(now_ns - oldest * NS_PER_S) / 1e9);
}
