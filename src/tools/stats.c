/*
 * stats.c - mean, population std, median and percentiles (see stats.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/stats.h"

const double sp_stats_pcts[SP_STATS_N_PCT] = {50, 90, 95, 99};

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double
sp_stats_percentile(const double *s, size_t n, double p)
{
    if (n == 0) {
        return 0;
    }
    if (p <= 0) {
        return s[0];
    }
    if (p >= 100) {
        return s[n - 1];
    }
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)rank;
    double frac = rank - (double)lo;
    if (lo + 1 >= n) {
        return s[n - 1];
    }
    return s[lo] + (s[lo + 1] - s[lo]) * frac;
}

void
sp_stats_compute(double *x, size_t n, sp_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    if (n == 0) {
        return;
    }
    qsort(x, n, sizeof *x, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += x[i];
    }
    out->mean = sum / (double)n;
    double ss = 0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - out->mean;
        ss += d * d;
    }
    out->std = sqrt(ss / (double)n);
    out->min = x[0];
    out->max = x[n - 1];
    out->median = sp_stats_percentile(x, n, 50);
    for (int k = 0; k < SP_STATS_N_PCT; k++) {
        out->pct[k] = sp_stats_percentile(x, n, sp_stats_pcts[k]);
    }
}
