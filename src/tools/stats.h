/*
 * stats.h - summary statistics of latency samples for `sampan bench`, computed
 * the way NumPy (and so vLLM's benchmark_serving) computes them: population
 * standard deviation, median and percentiles by linear interpolation between
 * the closest ranks. An empty sample gives 0 everywhere (as vLLM's
 * `np.mean(x or 0)`).
 */
#ifndef SP_TOOLS_STATS_H
#define SP_TOOLS_STATS_H

#include <stddef.h>

#define SP_STATS_N_PCT 4
/* The percentiles reported besides the median: p50, p90, p95, p99. */
extern const double sp_stats_pcts[SP_STATS_N_PCT];

typedef struct sp_stats {
    size_t n;
    double mean, median, std, min, max;
    double pct[SP_STATS_N_PCT]; /* at sp_stats_pcts */
} sp_stats_t;

/* Sorts x in place (ascending) and summarises it. */
void sp_stats_compute(double *x, size_t n, sp_stats_t *out);
/* The p-th percentile (0..100) of an ascending sample (NumPy's "linear"). */
double sp_stats_percentile(const double *sorted, size_t n, double p);

#endif /* SP_TOOLS_STATS_H */
