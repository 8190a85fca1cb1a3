/* test_stepctl.c - the adaptive step budget controller (sched/stepctl.h) fed synthetic step
 * times: it halves down to the floor while the p99 is over the target, climbs back to the
 * ceiling when the steps are fast and the budget is used, never leaves [floor, ceil], ignores
 * a single slow step in a window of fast ones (p99, not max), and stays put when off. */
#include <stdint.h>

#include "sched/stepctl.h"
#include "test.h"

#define MS 1000000LL

TEST(stepctl_off_keeps_the_ceiling_and_measures)
{
    sp_stepctl_t c;
    sp_stepctl_init(&c, 0, 16, 256);
    ASSERT_EQ(c.budget, 256);
    for (int i = 0; i < 500; i++) {
        ASSERT_EQ(sp_stepctl_observe(&c, 100 * MS, true), 256);
    }
    ASSERT_EQ(c.p99_ns, 100 * MS);
    ASSERT_EQ(c.decreases, 0);
}

TEST(stepctl_converges_down_then_up_within_bounds)
{
    sp_stepctl_t c;
    sp_stepctl_init(&c, 20.0, 16, 256);
    /* Steps cost 5 ms + 0.1 ms per prefill token: the target of 20 ms holds up to 150
     * tokens. Run the loop long enough to settle. */
    int32_t b = c.budget;
    int32_t lo = 1 << 30, hi = 0;
    for (int i = 0; i < 4000; i++) {
        int64_t t = 5 * MS + (int64_t)b * MS / 10;
        b = sp_stepctl_observe(&c, t, true);
        ASSERT(b >= 16 && b <= 256);
        if (i > 2000) {
            lo = b < lo ? b : lo;
            hi = b > hi ? b : hi;
        }
    }
    ASSERT(c.decreases >= 1);
    /* Settled at a budget that meets the target (halving never lands below half of the
     * largest good budget, 150) and keeps it. */
    ASSERT(hi <= 150);
    ASSERT(lo >= 150 / 2 - 16);
    ASSERT(c.p99_ns <= 20 * MS);

    /* Everything gets slow: down to the floor, and no lower. */
    for (int i = 0; i < 400; i++) {
        b = sp_stepctl_observe(&c, 50 * MS, true);
    }
    ASSERT_EQ(b, 16);
    ASSERT(c.p99_ns == 50 * MS);

    /* Fast again but the budget is not used (no prefill waiting): no probing upwards. */
    for (int i = 0; i < 400; i++) {
        b = sp_stepctl_observe(&c, 1 * MS, false);
    }
    ASSERT_EQ(b, 16);
    /* Fast and used: back to the ceiling, and no higher. */
    for (int i = 0; i < 1000; i++) {
        b = sp_stepctl_observe(&c, 1 * MS, true);
    }
    ASSERT_EQ(b, 256);
}

TEST(stepctl_p99_ignores_one_outlier)
{
    sp_stepctl_t c;
    sp_stepctl_init(&c, 10.0, 16, 256);
    /* A full window of fast steps, then one very slow one: with 128 samples the
     * nearest-rank p99 is the second largest, so one outlier does not cut the budget.
     * (With at most 100 samples the p99 is the largest.) */
    for (int i = 0; i < 2 * SP_STEPCTL_WINDOW; i++) {
        sp_stepctl_observe(&c, i == SP_STEPCTL_WINDOW + 40 ? 500 * MS : 2 * MS, true);
    }
    ASSERT_EQ(c.p99_ns, 2 * MS);
    ASSERT_EQ(c.decreases, 0);
    ASSERT_EQ(c.budget, 256);
    /* Two slow steps in the window make the p99 slow. */
    sp_stepctl_observe(&c, 400 * MS, true);
    ASSERT_EQ(c.p99_ns, 400 * MS);
}

TEST(stepctl_bounds_and_tiny_target)
{
    sp_stepctl_t c;
    sp_stepctl_init(&c, 0.0001, 0, 8); /* floor raised to 1 */
    ASSERT_EQ(c.floor, 1);
    ASSERT_EQ(c.budget, 8);
    int32_t b = 0;
    for (int i = 0; i < 200; i++) {
        b = sp_stepctl_observe(&c, 1000, true); /* 1 us: over a 0.1 us target */
    }
    ASSERT_EQ(b, 1);
    sp_stepctl_init(&c, 5.0, 64, 16); /* ceiling below the floor: both the floor */
    ASSERT_EQ(c.ceil, 64);
    ASSERT_EQ(c.budget, 64);
    ASSERT_EQ(sp_stepctl_observe(&c, -5, true), 64); /* a clock going backwards is 0 */
    ASSERT_EQ(c.p99_ns, 0);
}
