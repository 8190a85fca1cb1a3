/* timer.h - monotonic time in nanoseconds. */
#ifndef SP_CORE_TIMER_H
#define SP_CORE_TIMER_H

#include <stdint.h>
#include <time.h>

static inline int64_t sp_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#endif /* SP_CORE_TIMER_H */
