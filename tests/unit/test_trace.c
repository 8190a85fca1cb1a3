/* test_trace.c - W3C traceparent handling and sampling decisions (api/trace.h).
 * Exporting and the span tree are tested end to end in tests/py/test_tracing.py. */
#include "test.h"

#include "sampan/log.h"
#include "api/trace.h"

static sp_str_t
S(const char *s)
{
    return sp_str_c(s);
}

/* The trace id and flags of an answer traceparent. */
static void
split_tp(const char *tp, char tid[33], char sid[17], char flags[3])
{
    ASSERT_EQ(strlen(tp), (size_t)SP_TRACE_TP_LEN);
    ASSERT(strncmp(tp, "00-", 3) == 0 && tp[35] == '-' && tp[52] == '-');
    memcpy(tid, tp + 3, 32);
    tid[32] = '\0';
    memcpy(sid, tp + 36, 16);
    sid[16] = '\0';
    memcpy(flags, tp + 53, 2);
    flags[2] = '\0';
}

TEST(trace_parent_sampled_is_kept)
{
    const char *in = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    char tp[SP_TRACE_TP_BUF], tid[33], sid[17], fl[3];
    sp_trace_t *t = sp_trace_start(S(in), S("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"), 0, tp);
    ASSERT(t != NULL); /* parent-based: sampled although no ratio was configured */
    split_tp(tp, tid, sid, fl);
    ASSERT_STR_EQ(tid, "4bf92f3577b34da6a3ce929d0e0e4736");
    ASSERT(strcmp(sid, "00f067aa0ba902b7") != 0); /* our own span */
    ASSERT(strcmp(sid, "0000000000000000") != 0);
    ASSERT_STR_EQ(fl, "01");
    ASSERT_STR_EQ(sp_trace_state(t), "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
    char tid2[33], sid2[17];
    sp_trace_ids(t, tid2, sid2);
    ASSERT_STR_EQ(tid2, tid);
    ASSERT_STR_EQ(sid2, sid);
    sp_trace_finish(t, false, NULL); /* tracing is off: freed, not queued */
}

TEST(trace_parent_unsampled_propagates)
{
    const char *in = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    char tp[SP_TRACE_TP_BUF], tid[33], sid[17], fl[3];
    ASSERT(sp_trace_start(S(in), S("a=b"), 0, tp) == NULL);
    split_tp(tp, tid, sid, fl);
    ASSERT_STR_EQ(tid, "4bf92f3577b34da6a3ce929d0e0e4736");
    ASSERT_STR_EQ(fl, "00");
}

TEST(trace_parent_malformed_starts_new_trace)
{
    static const char *const bad[] = {
        "",
        "00",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",    /* short */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  /* 00 is exact */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   /* uppercase */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   /* zero parent */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* version ff */
        "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* bad version */
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",   /* separators */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   /* not hex */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",   /* flags */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  /* later version, no '-' */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char tp[SP_TRACE_TP_BUF], tid[33], sid[17], fl[3];
        /* ratio 0 (not initialised): a new root is never sampled */
        ASSERT(sp_trace_start(S(bad[i]), S("a=b"), 0, tp) == NULL);
        split_tp(tp, tid, sid, fl);
        ASSERT(strcmp(tid, "4bf92f3577b34da6a3ce929d0e0e4736") != 0);
        ASSERT(strcmp(tid, "00000000000000000000000000000000") != 0);
        ASSERT_STR_EQ(fl, "00");
    }
    /* Absent: the same as malformed. */
    char tp[SP_TRACE_TP_BUF];
    sp_str_t none = {NULL, 0};
    ASSERT(sp_trace_start(none, none, 0, tp) == NULL);
    ASSERT_EQ(strlen(tp), (size_t)SP_TRACE_TP_LEN);
}

TEST(trace_parent_later_version_fields_ignored)
{
    char tp[SP_TRACE_TP_BUF], tid[33], sid[17], fl[3];
    sp_trace_t *t = sp_trace_start(
        S("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future-stuff"), S(""), 0, tp);
    ASSERT(t != NULL);
    split_tp(tp, tid, sid, fl);
    ASSERT_STR_EQ(tid, "4bf92f3577b34da6a3ce929d0e0e4736");
    ASSERT_STR_EQ(fl, "01");
    sp_trace_finish(t, false, NULL);
}

TEST(trace_state_rules)
{
    const char *in = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    char tp[SP_TRACE_TP_BUF];
    char big[SP_TRACE_STATE_MAX + 2];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    const char *cases[][2] = {
        {"k=v", "k=v"},
        {"k=v\x01", ""},   /* control byte: dropped */
        {"k=\xc3\xa9", ""}, /* not ASCII: dropped */
        {big, ""},         /* over 512: dropped */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sp_trace_t *t = sp_trace_start(S(in), S(cases[i][0]), 0, tp);
        ASSERT(t != NULL);
        ASSERT_STR_EQ(sp_trace_state(t), cases[i][1]);
        sp_trace_finish(t, false, NULL);
    }
    big[SP_TRACE_STATE_MAX] = '\0'; /* exactly 512: kept */
    sp_trace_t *t = sp_trace_start(S(in), S(big), 0, tp);
    ASSERT_EQ(strlen(sp_trace_state(t)), (size_t)SP_TRACE_STATE_MAX);
    sp_trace_finish(t, false, NULL);
}

TEST(trace_null_record_is_a_no_op)
{
    sp_trace_set_name(NULL, "x");
    sp_trace_attr_str(NULL, "k", "v", 1);
    sp_trace_attr_int(NULL, "k", 1);
    sp_trace_mark_submit(NULL);
    sp_req_clock_t c;
    sp_metrics_clock_start(&c, 0, false);
    sp_trace_model(NULL, "m", "1", &c, "stop");
    sp_trace_finish(NULL, true, "500");
    ASSERT_STR_EQ(sp_trace_state(NULL), "");
    sp_trace_stats_t st;
    sp_trace_get_stats(&st);
    ASSERT_EQ(st.spans_exported, 0u);
}

TEST(trace_init_checks_endpoint)
{
    char err[256];
    sp_trace_params_t p = sp_trace_default_params();
    ASSERT_OK(sp_trace_init(&p, err, sizeof err)); /* no endpoint: off */
    ASSERT(!sp_trace_enabled());
    static const char *const bad[] = {"ftp://x:4318", "x:4318", "http://", "http://h:0",
                                      "http://h:70000", "http://h:12a", "http://[::1",
                                      "http://h:4318/a b", "http://h:4318/?q=1", "file:///tmp/x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.endpoint = bad[i];
        ASSERT(sp_trace_init(&p, err, sizeof err) == SP_ERR_INVALID);
        ASSERT(strstr(err, "--otlp-endpoint") != NULL);
    }
    p.endpoint = "http://127.0.0.1:4318";
    p.sample_ratio = 1.5;
    ASSERT(sp_trace_init(&p, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(!sp_trace_enabled());
}

/* HTTPS endpoints are taken (libcurl does the TLS), and the headers of
 * OTEL_EXPORTER_OTLP_[TRACES_]HEADERS are checked at start-up: a malformed
 * list or a value with CR/LF is refused whole, naming the variable. */
TEST(trace_init_https_and_header_env)
{
    char err[256];
    sp_trace_params_t p = sp_trace_default_params();
    p.endpoint = "https://collector.example:4318/prefix/";
    unsetenv("OTEL_EXPORTER_OTLP_HEADERS");
    unsetenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS");
    ASSERT_OK(sp_trace_init(&p, err, sizeof err));
    ASSERT(sp_trace_enabled());
    sp_trace_shutdown();
    ASSERT(!sp_trace_enabled());
    static const char *const bad[] = {"novalue", "=v", "a b=c", "k=v%0Ainjected: 1", "k=%00",
                                      "ok=1,,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", bad[i], 1);
        ASSERT(sp_trace_init(&p, err, sizeof err) == SP_ERR_INVALID);
        ASSERT(strstr(err, "OTEL_EXPORTER_OTLP_TRACES_HEADERS") != NULL);
        ASSERT(!sp_trace_enabled());
    }
    /* The general variable is read when the traces one is unset. */
    unsetenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS");
    setenv("OTEL_EXPORTER_OTLP_HEADERS", "bad key=1", 1);
    ASSERT(sp_trace_init(&p, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "OTEL_EXPORTER_OTLP_HEADERS") != NULL);
    setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s%20ecret, x-b = 2 ,x-empty=", 1);
    ASSERT_OK(sp_trace_init(&p, err, sizeof err));
    sp_trace_shutdown();
    unsetenv("OTEL_EXPORTER_OTLP_HEADERS");
    setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem", 1);
    ASSERT(sp_trace_init(&p, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "OTEL_EXPORTER_OTLP_CERTIFICATE") != NULL);
    unsetenv("OTEL_EXPORTER_OTLP_CERTIFICATE");
}

/* The access line's ids stay strings in --log-format json even when every
 * hex digit happens to be a decimal one (a double would round them). */
TEST(trace_ids_stay_strings_in_json_logs)
{
    char out[512];
    sp_log_to_json("T", "info",
                   "event=request trace_id=12345678901234567890123456789012 "
                   "span_id=1234567890123456 status=200 big=123456789012345",
                   out, sizeof out);
    ASSERT(strstr(out, "\"trace_id\":\"12345678901234567890123456789012\"") != NULL);
    ASSERT(strstr(out, "\"span_id\":\"1234567890123456\"") != NULL);
    ASSERT(strstr(out, "\"status\":200") != NULL);
    ASSERT(strstr(out, "\"big\":123456789012345") != NULL); /* 15 digits: still a number */
}
