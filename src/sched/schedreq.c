/* schedreq.c - `priority` and `timeout` of a request (schedreq.h). */
#include "sched/schedreq.h"

#include <string.h>

#include "sched/sched.h"
#include "sched/tierq.h"

static int32_t
prio_of_tier(int tier)
{
    return tier == SP_TIER_PREMIUM ? SP_SCHED_PRIO_PREMIUM
           : tier == SP_TIER_BATCH ? SP_SCHED_PRIO_BATCH
                                   : SP_SCHED_PRIO_STANDARD;
}

int
sp_schedreq_parse(const json_t *obj, sp_schedreq_style_t style, sp_schedreq_t *out,
                  sp_json_err_t *e)
{
    bool triton = style == SP_SCHEDREQ_TRITON;
    const json_t *pr = json_object_get(obj, "priority");
    int64_t v;
    int rc;
    if (json_is_string(pr)) {
        int tier = sp_tierq_tier_from_name(json_string_value(pr));
        if (tier < 0) {
            return sp_json_fail(e, "priority",
                                triton ? "'priority' must be \"premium\", \"standard\", \"batch\" "
                                         "or an integer >= 0 (1 = highest, as Triton's)"
                                       : "'priority' must be \"premium\", \"standard\", \"batch\" "
                                         "or an integer");
        }
        out->priority = prio_of_tier(tier);
    } else if (pr && !json_is_null(pr)) {
        /* Triton's levels are uint; a negative one is a client bug, not a tier. */
        if ((rc = sp_json_get_int(obj, "priority", triton ? 0 : -1000000, 1000000, &v, e)) < 0) {
            return -1;
        }
        if (!triton) {
            out->priority = (int32_t)v;
        } else {
            out->priority = v == 1 ? SP_SCHED_PRIO_PREMIUM
                            : v >= 3 ? SP_SCHED_PRIO_BATCH
                                     : SP_SCHED_PRIO_STANDARD; /* 0 = default, 2 */
        }
    }
    /* OpenAI's service_tier, when no priority is given: "priority" and "scale"
     * are the premium tier, "auto" and "default" standard, "flex" batch. */
    const json_t *stier = triton ? NULL : json_object_get(obj, "service_tier");
    if (stier && !json_is_null(stier) && (pr == NULL || json_is_null(pr))) {
        const char *n = json_is_string(stier) ? json_string_value(stier) : "";
        if (strcmp(n, "priority") == 0 || strcmp(n, "scale") == 0) {
            out->priority = SP_SCHED_PRIO_PREMIUM;
        } else if (strcmp(n, "auto") == 0 || strcmp(n, "default") == 0) {
            out->priority = SP_SCHED_PRIO_STANDARD;
        } else if (strcmp(n, "flex") == 0) {
            out->priority = SP_SCHED_PRIO_BATCH;
        } else {
            return sp_json_fail(e, "service_tier", "'service_tier' must be \"auto\", "
                                "\"default\", \"flex\", \"priority\" or \"scale\"");
        }
    }
    int64_t unit = triton ? 1 : 1000; /* microseconds per given unit */
    if ((rc = sp_json_get_int(obj, "timeout", 1, SP_SCHEDREQ_MAX_TIMEOUT_MS * 1000 / unit, &v, e)) <
        0) {
        return -1;
    }
    if (rc > 0) {
        out->timeout_us = v * unit;
    }
    return 0;
}

int64_t
sp_schedreq_deadline_ns(const sp_schedreq_t *r, double server_timeout_s, int64_t now_ns)
{
    double to = server_timeout_s;
    double own = (double)r->timeout_us / 1e6;
    if (r->timeout_us > 0 && (to <= 0 || own < to)) {
        to = own; /* the request's own, never longer than the server's */
    }
    return to > 0 ? now_ns + (int64_t)(to * 1e9) : 0;
}
