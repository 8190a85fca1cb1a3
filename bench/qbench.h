/*
 * qbench.h - the shared preamble of the quantized-kernel micro benchmarks (kquants2_bench.c,
 * q32_bench.c, ...): the thread-CPU-time clock, best-of-N timing of one measured call, the
 * command-line filter on type and level names, and the random values the benches quantize.
 * Header-only (static functions), one thread, no allocation.
 */
#ifndef SP_BENCH_QBENCH_H
#define SP_BENCH_QBENCH_H

#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

/* This thread's CPU time in seconds: the machine is shared, so other processes' time slices do
 * not count (their cache pressure still does). */
static inline double
qbench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of fn(ctx): the best of `tries` runs of `reps` calls each. */
static inline double
qbench_best(void (*fn)(void *), void *ctx, int reps, int tries)
{
    double best = 1e30;
    for (int t = 0; t < tries; t++) {
        const double t0 = qbench_now();
        for (int i = 0; i < reps; i++)
            fn(ctx);
        const double dt = (qbench_now() - t0) / reps;
        best = dt < best ? dt : best;
    }
    return best;
}

/* A pseudo-random value in [-1, 1] in steps of 0.001 (a 64-bit LCG on *state): the weights
 * and activations the benches quantize; speed does not depend on them, only on their spread. */
static inline float
qbench_rnd(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(*state >> 33) % 2001 - 1000) * 1e-3f;
}

/* Whether a level / type pair is selected by the arguments: none selects everything; each
 * argument is a type name (q4_k, iq4_xs, ...) or else a level name (scalar, avx2, ...), and a
 * pair runs when its type is named (or no type is) and its level is named (or no level is). */
static inline int
qbench_selected(int argc, char **argv, const char *level, const char *type)
{
    int any_level = 0, any_type = 0, level_ok = 0, type_ok = 0;
    for (int i = 1; i < argc; i++) {
        if (sp_type_from_name(argv[i]) >= 0) {
            any_type = 1;
            type_ok |= strcmp(argv[i], type) == 0;
        } else {
            any_level = 1;
            level_ok |= strcmp(argv[i], level) == 0;
        }
    }
    return (!any_level || level_ok) && (!any_type || type_ok);
}

#endif /* SP_BENCH_QBENCH_H */
