/*
 * schedreq.h - a request's scheduling fields, shared by the front ends:
 * `priority` (the tier) and `timeout` (the deadline), read from a JSON object
 * the same way by openai.c and kserve.c.
 *
 * The two protocols give integers different meanings, so the caller names the
 * convention:
 *   SP_SCHEDREQ_OPENAI  priority: a tier name, or an integer > 0 premium,
 *                       0 standard, < 0 batch; timeout in milliseconds.
 *   SP_SCHEDREQ_TRITON  priority: a tier name, or Triton's schedule-policy
 *                       integer (0 = the default level, 1 = the highest,
 *                       larger = lower): 0 standard, 1 premium, 2 standard,
 *                       3 and above batch; negative is an error. timeout in
 *                       microseconds, as Triton's `timeout` parameter.
 * Tier names are "premium", "standard" and "batch" in both.
 */
#ifndef SP_SCHED_SCHEDREQ_H
#define SP_SCHED_SCHEDREQ_H

#include <stdint.h>

#include "core/json.h"

typedef enum sp_schedreq_style {
    SP_SCHEDREQ_OPENAI = 0,
    SP_SCHEDREQ_TRITON = 1,
} sp_schedreq_style_t;

typedef struct sp_schedreq {
    int32_t priority;   /* SP_SCHED_PRIO_* (sched.h); standard when absent */
    int64_t timeout_us; /* the request's own timeout; 0 = none given */
} sp_schedreq_t;

/* Longest timeout a request may ask for: 7 days. */
#define SP_SCHEDREQ_MAX_TIMEOUT_MS ((int64_t)7 * 86400 * 1000)

/* Read `priority` and `timeout` from obj (absent or null leave *out as it
 * is, so a caller can read two objects, the later one winning). Returns 0, or
 * -1 with e filled (e->param is the key). */
int sp_schedreq_parse(const json_t *obj, sp_schedreq_style_t style, sp_schedreq_t *out,
                      sp_json_err_t *e);

/* The deadline on the sp_time_ns() clock for a request arriving at now_ns:
 * its own timeout, never later than the server's (server_timeout_s, 0 =
 * none); 0 when neither limits it. */
int64_t sp_schedreq_deadline_ns(const sp_schedreq_t *r, double server_timeout_s, int64_t now_ns);

#endif /* SP_SCHED_SCHEDREQ_H */
