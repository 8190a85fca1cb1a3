/* test_request.c - the request lifecycle shared by the protocols
 * (api/request.c): the status -> HTTP map, admission (the tenant's token
 * reservation, the tier cap), and the accounting at the end of each path
 * (done, error, client gone, refused), which must settle a request's token
 * reservation exactly once. The requests are virtual ones never run, so no
 * socket or loop is involved; the server-level answers are checked by
 * tests/py (test_tenants.py, test_server.py, test_kserve.py). */
#include "test.h"

#include <stdatomic.h>

#include "api/request.h"
#include "core/alloc.h"
#include "serving/auth.h"

/* An auth table with one tenant (key "key-0") whose JSON body is `body`. */
static sp_tenant_state_t *
tenant_with(sp_auth_t *a, const char *body)
{
    char path[512], text[2048], hs[72];
    uint8_t h[32];
    sp_tenants_key_hash("key-0", 5, h);
    sp_tenants_key_hash_str(h, hs);
    snprintf(path, sizeof path, "%s/tenants.json", sp_test_tmpdir());
    snprintf(text, sizeof text, "{\"tenants\":[{\"name\":\"t0\",\"keys\":[\"%s\"]%s%s}]}", hs,
             body[0] ? "," : "", body);
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    char err[256];
    ASSERT_OK(sp_auth_init(a, path, NULL, err, sizeof err));
    sp_auth_result_t ar;
    sp_auth_check(a, (sp_str_t){"key-0", 5}, SP_SCOPE_INFER, &ar);
    ASSERT(ar.state != NULL);
    return ar.state;
}

static void
sink_respond(void *ud, int status, const char *ct, const char *hdrs, size_t hl, const char *b, size_t n)
{
    SP_TEST_FAIL("a virtual request that never ran was answered (%d)", status);
}

static const sp_http_sink_t sink = {.respond = sink_respond};

/* A request that is never run: its accessors work without a loop. */
static sp_http_req_t *
vreq(sp_tenant_state_t *t)
{
    sp_http_vreq_params_t p = {.method = SP_HTTP_POST, .path = "/v1/completions", .path_len = 15};
    sp_http_req_t *r = sp_http_vreq_create(NULL, &p, &sink, NULL);
    ASSERT(r != NULL);
    sp_http_req_set_user(r, t);
    return r;
}

/* A protocol that records what the lifecycle asks of it. */
typedef struct probe {
    sp_api_req_t a;
    int n_refused, n_events, n_done, n_freed;
    sp_api_refusal_t why;
    sp_status_t refused_st, done_st;
    char message[256];
} probe_t;

static void
p_refuse(sp_api_req_t *a, sp_api_refusal_t why, sp_status_t st, const char *message)
{
    probe_t *p = (probe_t *)a;
    p->n_refused++;
    p->why = why;
    p->refused_st = st;
    snprintf(p->message, sizeof p->message, "%s", message);
}

static int
p_event(sp_api_req_t *a, const sp_sched_event_t *ev)
{
    ((probe_t *)a)->n_events++;
    return 0;
}

static void
p_done(sp_api_req_t *a, const sp_sched_event_t *ev, sp_status_t st, const char *message)
{
    probe_t *p = (probe_t *)a;
    p->n_done++;
    p->done_st = st;
    snprintf(p->message, sizeof p->message, "%s", message);
}

static void
p_free(sp_api_req_t *a)
{
    ((probe_t *)a)->n_freed++; /* the probe lives on the test's stack */
}

static const sp_api_ops_t probe_ops = {
    .refuse = p_refuse, .event = p_event, .done = p_done, .free = p_free,
};

/* A served model the test holds a second reference on, so the lifecycle's
 * release only drops its own. */
static sp_served_model_t *
fake_model(void)
{
    sp_served_model_t *m = sp_calloc(1, sizeof *m);
    ASSERT(m != NULL);
    snprintf(m->name, sizeof m->name, "m");
    snprintf(m->version_str, sizeof m->version_str, "1");
    sp_metrics_model_init(&m->metrics);
    atomic_store(&m->refs, 2);
    return m;
}

static sp_serving_t srv; /* only its configuration is read (log_prompts off) */

static void
begin(probe_t *p, sp_http_req_t *r, sp_served_model_t *m)
{
    memset(p, 0, sizeof *p);
    sp_api_begin(&p->a, &probe_ops, &srv, r, m, NULL);
}

static int64_t
tokens_of(sp_tenant_state_t *t)
{
    return (int64_t)atomic_load(&t->tokens);
}

TEST(request_status_map)
{
    /* One table: each status's HTTP answer, the shutdown status among them. */
    ASSERT_EQ(sp_status_http(SP_OK), 200);
    ASSERT_EQ(sp_status_http(SP_ERR_INVALID), 400);
    ASSERT_EQ(sp_status_http(SP_ERR_FORMAT), 400);
    ASSERT_EQ(sp_status_http(SP_ERR_NOT_FOUND), 404);
    ASSERT_EQ(sp_status_http(SP_ERR_TOO_LARGE), 413);
    ASSERT_EQ(sp_status_http(SP_ERR_BUSY), 429);
    ASSERT_EQ(sp_status_http(SP_ERR_CANCELLED), 499);
    ASSERT_EQ(sp_status_http(SP_ERR_NOMEM), 503);
    ASSERT_EQ(sp_status_http(SP_ERR_SHUTDOWN), 503);
    ASSERT_EQ(sp_status_http(SP_ERR_MODEL_FAULT), 500);
    ASSERT_EQ(sp_status_http(SP_ERR_UNSUPPORTED), 501);
    ASSERT_EQ(sp_status_http((sp_status_t)-999), 500);
    ASSERT_STR_EQ(sp_status_name(SP_ERR_SHUTDOWN), "ERR_SHUTDOWN");
    ASSERT_STR_EQ(sp_status_str(SP_ERR_SHUTDOWN), "shutting down");
    /* The server's queues say "cancelled" when they end a request whose
     * client still waits: that is the server's doing, 503, never 499. */
    ASSERT_EQ(sp_api_server_status(SP_ERR_CANCELLED), SP_ERR_SHUTDOWN);
    ASSERT_EQ(sp_status_http(sp_api_server_status(SP_ERR_CANCELLED)), 503);
    ASSERT_EQ(sp_api_server_status(SP_ERR_BUSY), SP_ERR_BUSY);
    ASSERT_EQ(sp_api_server_status(SP_ERR_INVALID), SP_ERR_INVALID);
    ASSERT_EQ(sp_api_server_status(SP_OK), SP_OK);
}

TEST(request_tokens_refused_is_429_with_retry_after)
{
    sp_auth_t auth;
    sp_tenant_state_t *t = tenant_with(&auth, "\"limits\":{\"tokens_per_minute\":100}");
    sp_http_req_t *r = vreq(t);
    sp_served_model_t *m = fake_model();
    probe_t p;
    begin(&p, r, m);
    sp_sched_request_t sr;
    memset(&sr, 0, sizeof sr);
    sr.n = 1;
    /* More than the tenant's whole minute: refused before any scheduler is asked. */
    ASSERT(!sp_api_admit(&p.a, &sr, 10, 1000));
    ASSERT_EQ(p.n_refused, 1);
    ASSERT_EQ(p.why, SP_API_REFUSED_TOKENS);
    ASSERT_EQ(sp_status_http(p.refused_st), 429);
    ASSERT(p.message[0] != '\0');
    ASSERT(p.a.job == NULL);
    ASSERT(p.a.clk.charge.st == NULL); /* nothing left reserved */
    ASSERT_EQ(t->tpm_reserved, 0);
    sp_str_t h = sp_http_req_added_headers(r);
    const char *ra = memmem(h.ptr, h.len, "Retry-After: ", 13);
    ASSERT(ra != NULL);
    ASSERT(atoi(ra + 13) >= 1);
    sp_api_finish(&p.a);
    ASSERT_EQ(p.n_freed, 1);
    ASSERT_EQ(tokens_of(t), 0); /* a refused request is charged nothing */
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_INVALID]), 1);
    ASSERT_EQ(atomic_load(&m->refs), 1); /* the request's reference was released */
    sp_http_vreq_cancel(r);
    sp_auth_fini(&auth);
    sp_free(m);
}

TEST(request_reserve_within_the_minute)
{
    sp_auth_t auth;
    sp_tenant_state_t *t = tenant_with(&auth, "\"limits\":{\"tokens_per_minute\":100}");
    sp_tenant_charge_t c;
    int ra = 0;
    char msg[256];
    ASSERT(sp_api_reserve(t, 60, &c, &ra, msg, sizeof msg));
    ASSERT(c.st == t);
    ASSERT_EQ(t->tpm_reserved, 60);
    /* 60 held: 50 more would pass the minute. */
    sp_tenant_charge_t c2;
    ASSERT(!sp_api_reserve(t, 50, &c2, &ra, msg, sizeof msg));
    ASSERT(ra >= 1);
    ASSERT(msg[0] != '\0');
    sp_auth_settle(&c, t, 0);
    ASSERT_EQ(t->tpm_reserved, 0);
    sp_auth_fini(&auth);
}

TEST(request_tier_caps_priority)
{
    sp_auth_t auth;
    sp_tenant_state_t *t = tenant_with(&auth, "\"tier\":\"batch\"");
    sp_http_req_t *r = vreq(t);
    ASSERT_EQ(sp_api_tier(r), SP_SCHED_PRIO_BATCH);
    /* A batch key never buys a higher tier; it may ask for its own. */
    ASSERT_EQ(sp_api_priority(r, SP_SCHED_PRIO_PREMIUM), SP_SCHED_PRIO_BATCH);
    ASSERT_EQ(sp_api_priority(r, SP_SCHED_PRIO_STANDARD), SP_SCHED_PRIO_BATCH);
    ASSERT_EQ(sp_api_priority(r, SP_SCHED_PRIO_BATCH), SP_SCHED_PRIO_BATCH);
    /* The lifecycle starts a request at its tier. */
    probe_t p;
    begin(&p, r, NULL);
    ASSERT_EQ(p.a.sched.priority, SP_SCHED_PRIO_BATCH);
    sp_api_finish(&p.a);
    sp_http_vreq_cancel(r);
    sp_auth_fini(&auth);

    sp_tenant_state_t *pt = tenant_with(&auth, "\"tier\":\"premium\"");
    r = vreq(pt);
    ASSERT_EQ(sp_api_priority(r, SP_SCHED_PRIO_PREMIUM), SP_SCHED_PRIO_PREMIUM);
    ASSERT_EQ(sp_api_priority(r, SP_SCHED_PRIO_BATCH), SP_SCHED_PRIO_BATCH); /* asking lower is fine */
    sp_http_vreq_cancel(r);
    sp_auth_fini(&auth);
}

/* A request with `reserved` tokens of its tenant's minute held, as after admission. */
static void
admitted(probe_t *p, sp_http_req_t *r, sp_served_model_t *m, sp_tenant_state_t *t, int64_t reserved,
         int64_t prompt)
{
    begin(p, r, m);
    int ra;
    char msg[256];
    ASSERT(sp_api_reserve(t, reserved, &p->a.clk.charge, &ra, msg, sizeof msg));
    p->a.clk.prompt_tokens = prompt;
    ASSERT_EQ(t->tpm_reserved, reserved);
}

static void
token(sp_api_req_t *a, int32_t index)
{
    sp_sched_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SP_SCHED_EV_TOKEN;
    ev.index = index;
    ev.token = 7;
    ev.text = "x";
    ev.text_len = 1;
    sp_api_event(&ev, a);
}

static void
done(sp_api_req_t *a, sp_status_t st, const char *message, int64_t prompt, int64_t completion)
{
    sp_sched_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = SP_SCHED_EV_DONE;
    ev.index = -1;
    ev.status = st;
    ev.message = message;
    ev.prompt_tokens = prompt;
    ev.completion_tokens = completion;
    ev.queue_ns = 1000;
    ev.compute_ns = 2000;
    sp_api_event(&ev, a);
}

TEST(request_done_settles_once)
{
    sp_auth_t auth;
    sp_tenant_state_t *t = tenant_with(&auth, "\"limits\":{\"tokens_per_minute\":1000}");
    sp_http_req_t *r = vreq(t);
    sp_served_model_t *m = fake_model();
    probe_t p;
    admitted(&p, r, m, t, 100, 5);
    token(&p.a, 0);
    token(&p.a, 0);
    sp_sched_event_t fin;
    memset(&fin, 0, sizeof fin);
    fin.kind = SP_SCHED_EV_FINISH;
    fin.finish = SP_FINISH_LENGTH;
    sp_api_event(&fin, &p.a);
    ASSERT_EQ(p.n_events, 3);
    ASSERT_EQ(p.a.clk.completion_tokens, 2);
    ASSERT(p.a.clk.first_ns != 0);
    done(&p.a, SP_OK, NULL, 5, 3); /* the scheduler's own count wins */
    ASSERT_EQ(p.n_done, 1);
    ASSERT_EQ(p.done_st, SP_OK);
    ASSERT_EQ(p.n_freed, 1);
    ASSERT_EQ(t->tpm_reserved, 0);
    ASSERT_EQ(tokens_of(t), 8);
    ASSERT_EQ(atomic_load(&m->metrics.success[1]), 1); /* finished by length */
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_INVALID]), 0);
    ASSERT(strstr(sp_http_req_note(r), "outcome=length prompt_tokens=5 completion_tokens=3") != NULL);
    ASSERT(strstr(sp_http_req_note(r), "queue_ms=") != NULL);
    /* Ending it again charges nothing more. */
    sp_api_account(r, m, &p.a.clk, false, SP_FINISH_STOP, SP_FAIL_INTERNAL);
    ASSERT_EQ(tokens_of(t), 8);
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_INTERNAL]), 0);
    ASSERT_EQ(atomic_load(&m->refs), 1);
    sp_http_vreq_cancel(r);
    sp_auth_fini(&auth);
    sp_free(m);
}

TEST(request_error_settles_once)
{
    sp_auth_t auth;
    sp_tenant_state_t *t = tenant_with(&auth, "\"limits\":{\"tokens_per_minute\":1000}");
    sp_http_req_t *r = vreq(t);
    sp_served_model_t *m = fake_model();
    probe_t p;
    admitted(&p, r, m, t, 100, 4);
    token(&p.a, 0);
    done(&p.a, SP_ERR_CANCELLED, "request deadline exceeded", 4, 1);
    ASSERT_EQ(p.n_done, 1);
    ASSERT_EQ(p.done_st, SP_ERR_CANCELLED);
    ASSERT_STR_EQ(p.message, "request deadline exceeded");
    ASSERT_EQ(sp_status_http(sp_api_server_status(p.done_st)), 503);
    ASSERT_EQ(p.n_freed, 1);
    ASSERT_EQ(t->tpm_reserved, 0);
    ASSERT_EQ(tokens_of(t), 5);
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_TIMEOUT]), 1);
    ASSERT(strstr(sp_http_req_note(r), "outcome=timeout") != NULL);
    sp_http_vreq_cancel(r);

    /* An error without a message gets the status's own words. */
    r = vreq(t);
    atomic_fetch_add(&m->refs, 1); /* the second request's reference */
    admitted(&p, r, m, t, 100, 4);
    done(&p.a, SP_ERR_KV_FULL, NULL, 4, 0);
    ASSERT_STR_EQ(p.message, sp_status_str(SP_ERR_KV_FULL));
    ASSERT_EQ(p.n_freed, 1);
    ASSERT_EQ(t->tpm_reserved, 0);
    ASSERT_EQ(tokens_of(t), 9);
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_INTERNAL]), 1);
    sp_http_vreq_cancel(r);
    sp_auth_fini(&auth);
    sp_free(m);
}

TEST(request_client_gone_settles_once)
{
    sp_auth_t auth;
    sp_tenant_state_t *t = tenant_with(&auth, "\"limits\":{\"tokens_per_minute\":1000}");
    sp_http_req_t *r = vreq(t);
    sp_served_model_t *m = fake_model();
    probe_t p;
    admitted(&p, r, m, t, 100, 7);
    token(&p.a, 0);
    token(&p.a, 0);
    /* What the transport calls when the connection dies (the job is NULL here). */
    sp_api_abort(r, &p.a);
    ASSERT_EQ(p.n_done, 0);  /* nobody to answer */
    ASSERT_EQ(p.n_freed, 1);
    ASSERT(p.a.http == NULL);
    ASSERT_EQ(t->tpm_reserved, 0);
    ASSERT_EQ(tokens_of(t), 9); /* the prompt, and what was generated until then */
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_CANCELLED]), 1);
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_INVALID]), 0);
    ASSERT(strstr(sp_http_req_note(r), "outcome=cancelled") != NULL);
    /* A late end of the same request (the tensor path's delivery) changes nothing. */
    sp_api_end(&p.a, false, SP_FAIL_INTERNAL);
    ASSERT_EQ(tokens_of(t), 9);
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_INTERNAL]), 0);
    ASSERT_EQ(atomic_load(&m->refs), 1);
    sp_http_vreq_cancel(r);
    sp_auth_fini(&auth);
    sp_free(m);
}

TEST(request_gone_during_preparation_is_not_counted_twice)
{
    sp_auth_t auth;
    sp_tenant_state_t *t = tenant_with(&auth, "");
    sp_http_req_t *r = vreq(t);
    sp_served_model_t *m = fake_model();
    probe_t p;
    begin(&p, r, m);
    /* offload.c accounts a client that leaves during preparation and marks the job gone. */
    sp_api_account(r, m, &p.a.clk, false, SP_FINISH_STOP, SP_FAIL_CANCELLED);
    p.a.off.gone = true;
    p.a.http = NULL;
    sp_api_finish(&p.a);
    ASSERT_EQ(p.n_freed, 1);
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_CANCELLED]), 1);
    ASSERT_EQ(atomic_load(&m->metrics.failure[SP_FAIL_INVALID]), 0);
    ASSERT_EQ(atomic_load(&m->refs), 1);
    sp_http_vreq_cancel(r);
    sp_auth_fini(&auth);
    sp_free(m);
}
