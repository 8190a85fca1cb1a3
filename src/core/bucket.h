/*
 * bucket.h - a token bucket: tokens come back at a rate per second, up to a
 * burst, and each admitted event takes one. The tenants' requests per second
 * and the HTTP server's new connections per client use it. Not thread-safe:
 * callers hold their own lock.
 */
#ifndef SP_CORE_BUCKET_H
#define SP_CORE_BUCKET_H

#include <stdint.h>

typedef struct sp_bucket {
    double tokens; /* events that may happen now */
    int64_t at_ns; /* when tokens was last brought up to date */
} sp_bucket_t;

/* A full bucket at now_ns. */
static inline void
sp_bucket_fill(sp_bucket_t *b, double burst, int64_t now_ns)
{
    b->tokens = burst;
    b->at_ns = now_ns;
}

/* Add what rate (per second) gave back since the last update, up to burst. */
static inline void
sp_bucket_refill(sp_bucket_t *b, double rate, double burst, int64_t now_ns)
{
    b->tokens += (double)(now_ns - b->at_ns) * 1e-9 * rate;
    if (b->tokens > burst) {
        b->tokens = burst;
    }
    b->at_ns = now_ns;
}

#endif /* SP_CORE_BUCKET_H */
