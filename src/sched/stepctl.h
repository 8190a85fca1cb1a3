/*
 * stepctl.h - the adaptive step budget (`--tpot-target-ms`): keeps the p99
 * of step times under a target by shrinking or growing the prefill tokens a
 * step may carry.
 *
 * A continuous-batching step's wall time is the inter-token time of every
 * stream running in it, so the p99 step time over a sliding window is the
 * p99 time per output token the clients see. Decode rows are one token per
 * running sequence and are never cut; what the controller moves is the
 * prefill budget, between a floor that still makes progress (one KV block)
 * and --step-tokens:
 *   - multiplicative decrease (halve) when the window's p99 is over the
 *     target; the window then starts afresh, so the old slow steps do not
 *     cause a second cut before the first one could show its effect;
 *   - additive increase (one floor's worth) when a full adjustment period
 *     of steps kept the p99 under 80% of the target and the budget was
 *     actually used (a prefill chunk filled it): an idle budget is not
 *     probed upwards.
 * Only steps with decode rows are observed (a step that only prefills has no
 * stream waiting on it). A pure struct with no clock and no allocation, so
 * the unit test feeds it synthetic step times.
 */
#ifndef SP_SCHED_STEPCTL_H
#define SP_SCHED_STEPCTL_H

#include <stdbool.h>
#include <stdint.h>

#define SP_STEPCTL_WINDOW 128 /* steps in the p99 window */
#define SP_STEPCTL_PERIOD 16  /* steps between adjustments */

typedef struct sp_stepctl {
    int64_t target_ns; /* 0 = off: the budget stays at ceil, the p99 is still measured */
    int32_t floor, ceil;
    int32_t budget;    /* prefill tokens per step */
    int64_t win[SP_STEPCTL_WINDOW];
    int32_t n, head;   /* samples in the window, next slot */
    int32_t since;     /* samples since the last adjustment (or reset) */
    bool used;         /* the budget was filled since the last adjustment */
    int64_t p99_ns;    /* p99 of the window (0 = no samples) */
    int64_t decreases, increases;
} sp_stepctl_t;

/* target_ms <= 0 turns adjusting off. floor is raised to 1 and ceil to floor. */
void sp_stepctl_init(sp_stepctl_t *c, double target_ms, int32_t floor, int32_t ceil);
/* One step with decode rows took step_ns; budget_filled says its prefill used
 * the whole budget. Returns the budget for the next step. */
int32_t sp_stepctl_observe(sp_stepctl_t *c, int64_t step_ns, bool budget_filled);

#endif /* SP_SCHED_STEPCTL_H */
