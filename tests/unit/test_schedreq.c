/* test_schedreq.c - `priority` and `timeout` of a request in both conventions
 * (sched/schedreq.h): tier names, OpenAI's signed integers, Triton's levels
 * (1 highest), milliseconds vs microseconds, errors, and the deadline cap. */
#include <string.h>

#include "sched/sched.h"
#include "sched/schedreq.h"
#include "test.h"

static int
parse(const char *text, sp_schedreq_style_t style, sp_schedreq_t *out, sp_json_err_t *e)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (o == NULL) {
        return -2;
    }
    int rc = sp_schedreq_parse(o, style, out, e);
    json_decref(o);
    return rc;
}

TEST(schedreq_priority_both_conventions)
{
    sp_schedreq_t r;
    sp_json_err_t e;
    static const struct {
        const char *json;
        int32_t openai, triton;
    } cases[] = {
        {"{\"priority\": \"premium\"}", SP_SCHED_PRIO_PREMIUM, SP_SCHED_PRIO_PREMIUM},
        {"{\"priority\": \"standard\"}", SP_SCHED_PRIO_STANDARD, SP_SCHED_PRIO_STANDARD},
        {"{\"priority\": \"batch\"}", SP_SCHED_PRIO_BATCH, SP_SCHED_PRIO_BATCH},
        {"{\"priority\": 0}", 0, SP_SCHED_PRIO_STANDARD},
        {"{\"priority\": 1}", 1, SP_SCHED_PRIO_PREMIUM},
        {"{\"priority\": 2}", 2, SP_SCHED_PRIO_STANDARD},
        {"{\"priority\": 3}", 3, SP_SCHED_PRIO_BATCH},
        {"{\"priority\": 1000}", 1000, SP_SCHED_PRIO_BATCH},
        {"{\"priority\": null}", 0, 0},
        {"{}", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&r, 0, sizeof r);
        ASSERT_EQ(parse(cases[i].json, SP_SCHEDREQ_OPENAI, &r, &e), 0);
        ASSERT_EQ(r.priority, cases[i].openai);
        memset(&r, 0, sizeof r);
        ASSERT_EQ(parse(cases[i].json, SP_SCHEDREQ_TRITON, &r, &e), 0);
        ASSERT_EQ(r.priority, cases[i].triton);
    }
    memset(&r, 0, sizeof r);
    ASSERT_EQ(parse("{\"priority\": -3}", SP_SCHEDREQ_OPENAI, &r, &e), 0);
    ASSERT_EQ(r.priority, -3);
    ASSERT_EQ(parse("{\"priority\": -3}", SP_SCHEDREQ_TRITON, &r, &e), -1);
    ASSERT(strcmp(e.param, "priority") == 0);
    ASSERT_EQ(parse("{\"priority\": \"gold\"}", SP_SCHEDREQ_OPENAI, &r, &e), -1);
    ASSERT(strstr(e.msg, "priority") != NULL);
    ASSERT_EQ(parse("{\"priority\": true}", SP_SCHEDREQ_TRITON, &r, &e), -1);
    ASSERT_EQ(parse("{\"priority\": 1.5}", SP_SCHEDREQ_OPENAI, &r, &e), -1);
}

TEST(schedreq_timeout_units_and_deadline)
{
    sp_schedreq_t r;
    sp_json_err_t e;
    memset(&r, 0, sizeof r);
    ASSERT_EQ(parse("{\"timeout\": 250}", SP_SCHEDREQ_OPENAI, &r, &e), 0);
    ASSERT_EQ(r.timeout_us, 250000); /* ms */
    memset(&r, 0, sizeof r);
    ASSERT_EQ(parse("{\"timeout\": 250}", SP_SCHEDREQ_TRITON, &r, &e), 0);
    ASSERT_EQ(r.timeout_us, 250); /* us */
    ASSERT_EQ(parse("{\"timeout\": 0}", SP_SCHEDREQ_OPENAI, &r, &e), -1);
    ASSERT(strcmp(e.param, "timeout") == 0);
    ASSERT_EQ(parse("{\"timeout\": -1}", SP_SCHEDREQ_TRITON, &r, &e), -1);
    ASSERT_EQ(parse("{\"timeout\": \"1s\"}", SP_SCHEDREQ_TRITON, &r, &e), -1);
    ASSERT_EQ(parse("{\"timeout\": 604800001}", SP_SCHEDREQ_OPENAI, &r, &e), -1);
    ASSERT_EQ(parse("{\"timeout\": 604800000000}", SP_SCHEDREQ_TRITON, &r, &e), 0);

    /* The request's own deadline, never later than the server's. */
    sp_schedreq_t own = {.priority = 0, .timeout_us = 2000000}; /* 2 s */
    sp_schedreq_t none = {0};
    ASSERT_EQ(sp_schedreq_deadline_ns(&own, 600, 1000), 1000 + 2000000000LL);
    ASSERT_EQ(sp_schedreq_deadline_ns(&own, 1, 1000), 1000 + 1000000000LL);
    ASSERT_EQ(sp_schedreq_deadline_ns(&own, 0, 1000), 1000 + 2000000000LL);
    ASSERT_EQ(sp_schedreq_deadline_ns(&none, 0, 1000), 0);
    ASSERT_EQ(sp_schedreq_deadline_ns(&none, 3, 0), 3000000000LL);
}

TEST(schedreq_openai_service_tier)
{
    sp_schedreq_t r;
    sp_json_err_t e;
    static const struct {
        const char *json;
        int32_t prio;
    } cases[] = {
        {"{\"service_tier\": \"priority\"}", SP_SCHED_PRIO_PREMIUM},
        {"{\"service_tier\": \"scale\"}", SP_SCHED_PRIO_PREMIUM},
        {"{\"service_tier\": \"default\"}", SP_SCHED_PRIO_STANDARD},
        {"{\"service_tier\": \"auto\"}", SP_SCHED_PRIO_STANDARD},
        {"{\"service_tier\": \"flex\"}", SP_SCHED_PRIO_BATCH},
        {"{\"service_tier\": \"flex\", \"priority\": \"premium\"}", SP_SCHED_PRIO_PREMIUM},
        {"{\"service_tier\": null}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&r, 0, sizeof r);
        ASSERT_EQ(parse(cases[i].json, SP_SCHEDREQ_OPENAI, &r, &e), 0);
        ASSERT_EQ(r.priority, cases[i].prio);
    }
    ASSERT_EQ(parse("{\"service_tier\": \"gold\"}", SP_SCHEDREQ_OPENAI, &r, &e), -1);
    ASSERT(strcmp(e.param, "service_tier") == 0);
    /* Triton's requests have no service_tier: not read there */
    memset(&r, 0, sizeof r);
    ASSERT_EQ(parse("{\"service_tier\": \"flex\"}", SP_SCHEDREQ_TRITON, &r, &e), 0);
    ASSERT_EQ(r.priority, 0);
}
