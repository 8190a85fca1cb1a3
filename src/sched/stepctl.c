/* stepctl.c - adaptive prefill budget from the p99 step time (stepctl.h). */
#include "sched/stepctl.h"

#include <string.h>

void
sp_stepctl_init(sp_stepctl_t *c, double target_ms, int32_t floor, int32_t ceil)
{
    memset(c, 0, sizeof *c);
    c->floor = floor < 1 ? 1 : floor;
    c->ceil = ceil < c->floor ? c->floor : ceil;
    c->target_ns = target_ms > 0 ? (int64_t)(target_ms * 1e6) : 0;
    if (c->target_ns == 0 && target_ms > 0) {
        c->target_ns = 1; /* below a nanosecond: still on */
    }
    c->budget = c->ceil;
}

/* Nearest-rank p99 of the window: the k-th largest, k = n - ceil(0.99 n) + 1
 * (at most 2 for 128 samples), by one pass keeping the k largest. */
static int64_t
window_p99(const sp_stepctl_t *c)
{
    int32_t n = c->n;
    if (n == 0) {
        return 0;
    }
    int32_t rank = (int32_t)((99 * (int64_t)n + 99) / 100); /* ceil(0.99 n), 1-based */
    int32_t k = n - rank + 1;
    int64_t top[SP_STEPCTL_WINDOW / 100 + 2];
    int32_t have = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t v = c->win[i];
        if (have < k) {
            top[have++] = v;
        } else if (v > top[have - 1]) {
            top[have - 1] = v;
        } else {
            continue;
        }
        for (int32_t j = have - 1; j > 0 && top[j] > top[j - 1]; j--) { /* keep descending */
            int64_t t = top[j];
            top[j] = top[j - 1];
            top[j - 1] = t;
        }
    }
    return top[k - 1];
}

int32_t
sp_stepctl_observe(sp_stepctl_t *c, int64_t step_ns, bool budget_filled)
{
    c->win[c->head] = step_ns < 0 ? 0 : step_ns;
    c->head = (c->head + 1) % SP_STEPCTL_WINDOW;
    if (c->n < SP_STEPCTL_WINDOW) {
        c->n++;
    }
    c->since++;
    c->used = c->used || budget_filled;
    c->p99_ns = window_p99(c);
    if (c->target_ns == 0 || c->since < SP_STEPCTL_PERIOD) {
        return c->budget;
    }
    if (c->p99_ns > c->target_ns) {
        if (c->budget > c->floor) {
            int32_t b = c->budget / 2;
            c->budget = b < c->floor ? c->floor : b;
            c->decreases++;
            /* Start the window afresh: the slow steps it holds were run with
             * the old budget. */
            c->n = c->head = 0;
        }
    } else if (c->p99_ns * 5 < c->target_ns * 4 && c->used && c->budget < c->ceil) {
        int32_t b = c->budget + c->floor;
        c->budget = b > c->ceil ? c->ceil : b;
        c->increases++;
    }
    c->since = 0;
    c->used = false;
    return c->budget;
}
