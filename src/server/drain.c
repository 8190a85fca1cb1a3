/* drain.c - a queue's recent drain rate and the Retry-After it implies (drain.h). */
#include "server/drain.h"

#include <math.h>

#define NS_PER_S 1000000000LL
#define N_BINS (SP_DRAIN_WINDOW_S + 1) /* the window's full seconds and the current one */

int
sp_retry_after_s(int64_t ahead, int64_t done, double span_s)
{
    if (ahead < 1) {
        ahead = 1;
    }
    if (!(span_s >= 1.0)) {
        span_s = 1.0;
    }
    if (done < 1) {
        done = 1; /* nothing drained: at most one per span, so wait at least that */
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

static void
first_use(sp_drain_t *d, int64_t now_ns)
{
    int64_t zero = 0;
    atomic_compare_exchange_strong(&d->first_ns, &zero, now_ns > 0 ? now_ns : 1);
}

void
sp_drain_note(sp_drain_t *d, int64_t k, int64_t now_ns)
{
    if (k <= 0) {
        return;
    }
    first_use(d, now_ns);
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
    first_use(d, now_ns);
    int64_t sec = now_ns / NS_PER_S, done = 0;
    for (int i = 0; i < N_BINS; i++) {
        int64_t s = atomic_load(&d->sec[i]);
        if (s > sec - N_BINS && s <= sec) {
            done += atomic_load(&d->n[i]);
        }
    }
    /* The window: its full seconds plus the elapsed part of the current one,
     * or the time since the first use when shorter. */
    double span = (double)SP_DRAIN_WINDOW_S + (double)(now_ns % NS_PER_S) / 1e9;
    double since = (double)(now_ns - atomic_load(&d->first_ns)) / 1e9;
    if (since < span) {
        span = since;
    }
    return sp_retry_after_s(ahead, done, span);
}
