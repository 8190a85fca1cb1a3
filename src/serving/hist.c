/*
 * hist.c - latency histograms with fixed bounds (metrics.h): per-bucket
 * counts and a sum, recorded with relaxed atomics so the loop threads that
 * finish requests never wait on each other; a scrape reads whatever they
 * hold at that moment.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "serving/metrics.h"

/* vLLM's bounds (so dashboards compare), extended downwards where a CPU
 * serving a small model is faster than vLLM's first bucket. */
static const double le_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                 1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
                                 2560.0};
static const double le_tpot[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                 0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0,
                                 40.0,  80.0};
static const double le_latency[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,  0.3,   0.5,   0.8,
                                    1.0,   1.5,   2.0,  2.5,   5.0,  10.0, 15.0,  20.0,  30.0,
                                    40.0,  50.0,  60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
/* vLLM's 1-2-5 series for token counts, up to a million. */
static const double le_tokens[] = {1,     2,     5,     10,     20,     50,     100,
                                   200,   500,   1000,  2000,   5000,   10000,  20000,
                                   50000, 100000, 200000, 500000, 1000000};

void
sp_hist_init(sp_hist_t *h, sp_hist_kind_t kind)
{
    memset(h, 0, sizeof *h);
    switch (kind) {
    case SP_HIST_TTFT:
        h->le = le_ttft;
        h->n = (int)(sizeof le_ttft / sizeof le_ttft[0]);
        break;
    case SP_HIST_TPOT:
        h->le = le_tpot;
        h->n = (int)(sizeof le_tpot / sizeof le_tpot[0]);
        break;
    case SP_HIST_LATENCY:
        h->le = le_latency;
        h->n = (int)(sizeof le_latency / sizeof le_latency[0]);
        break;
    case SP_HIST_TOKENS:
        h->le = le_tokens;
        h->n = (int)(sizeof le_tokens / sizeof le_tokens[0]);
        break;
    }
    double zero = 0.0;
    uint64_t bits;
    memcpy(&bits, &zero, sizeof bits);
    atomic_init(&h->sum_bits, bits);
}

void
sp_hist_observe(sp_hist_t *h, double v)
{
    if (!(v >= 0)) { /* NaN or negative (a clock step) */
        v = 0;
    }
    int b = 0;
    while (b < h->n && v > h->le[b]) {
        b++;
    }
    atomic_fetch_add_explicit(&h->counts[b], 1, memory_order_relaxed);
    uint64_t old = atomic_load_explicit(&h->sum_bits, memory_order_relaxed), nw;
    do {
        double d;
        memcpy(&d, &old, sizeof d);
        d += v;
        memcpy(&nw, &d, sizeof nw);
    } while (!atomic_compare_exchange_weak_explicit(&h->sum_bits, &old, nw, memory_order_relaxed,
                                                    memory_order_relaxed));
}

double
sp_hist_sum(const sp_hist_t *h)
{
    uint64_t bits = atomic_load_explicit(&((sp_hist_t *)h)->sum_bits, memory_order_relaxed);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

uint64_t
sp_hist_count(const sp_hist_t *h)
{
    uint64_t n = 0;
    for (int b = 0; b <= h->n; b++) {
        n += atomic_load_explicit(&((sp_hist_t *)h)->counts[b], memory_order_relaxed);
    }
    return n;
}

