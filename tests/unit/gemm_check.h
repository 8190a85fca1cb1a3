/*
 * gemm_check.h - the kernel tests' check of one gemm call over a row range: y is filled with
 * a sentinel, the gemm computes rows [r0, r1) of nt tokens, and then every cell of y must be
 * the wanted bits (inside the range) or still the sentinel (outside: a kernel writes only
 * the cells it owns, whatever its tiles and masks do). The verdict names the first wrong
 * cell, so each test reports it with its own context (GEMM_CHECK_ASSERT).
 *
 * Header only, no state; plain C (the arm64 unit build includes it too).
 */
#ifndef SP_TEST_GEMM_CHECK_H
#define SP_TEST_GEMM_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#define GEMM_SENTINEL (-999.0f)

typedef struct {
    bool ok;
    bool outside;      /* the wrong cell lies outside the range: it was overwritten */
    int64_t t, r;      /* the first wrong cell (token, row) */
    float got, want;
} gemm_verdict_t;

/* What a call computes and what it must give: want(t, r) = want[t * want_ts + r * want_rs]
 * for t < nt and r in [r0, r1). y holds y_toks rows of ldy floats, all of which are checked.
 * nan_any: any NaN matches a wanted NaN (kernels that may differ in the payload only). */
typedef struct {
    sp_gemm_fn gemm;
    int64_t n;
    const void *w;
    size_t ws;
    const void *x;
    size_t xs;
    const float *want;
    int64_t want_ts, want_rs;
    bool nan_any;
} gemm_case_t;

static inline gemm_verdict_t
gemm_check_range(const gemm_case_t *c, int64_t r0, int64_t r1, int64_t nt, float *y, int64_t ldy,
                 int64_t y_toks)
{
    gemm_verdict_t v = {.ok = true};
    const float sentinel = GEMM_SENTINEL;
    for (int64_t i = 0; i < ldy * y_toks; i++) {
        y[i] = sentinel;
    }
    c->gemm(c->n, c->w, c->ws, r0, r1, c->x, c->xs, nt, y, ldy);
    for (int64_t t = 0; t < y_toks; t++) {
        for (int64_t r = 0; r < ldy; r++) {
            const float got = y[t * ldy + r];
            const bool inside = t < nt && r >= r0 && r < r1;
            const float want = inside ? c->want[t * c->want_ts + r * c->want_rs] : sentinel;
            const bool same = memcmp(&got, &want, sizeof got) == 0 ||
                              (inside && c->nan_any && isnan(got) && isnan(want));
            if (!same) {
                v = (gemm_verdict_t){false, !inside, t, r, got, want};
                return v;
            }
        }
    }
    return v;
}

/* Fail the test with the verdict's cell after the caller's own words (printf arguments). */
#define GEMM_CHECK_ASSERT(verdict, ...)                                                    \
    do {                                                                                   \
        const gemm_verdict_t v_ = (verdict);                                               \
        if (!v_.ok) {                                                                      \
            fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                              \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, ": y[t%lld][r%lld] = %.9g, want %.9g%s\n", (long long)v_.t,    \
                    (long long)v_.r, (double)v_.got, (double)v_.want,                      \
                    v_.outside ? " (outside the range: the sentinel was overwritten)" : ""); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#endif /* SP_TEST_GEMM_CHECK_H */
