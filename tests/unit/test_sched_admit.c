/*
 * test_sched_admit.c - the scheduler's admission and preemption (sched/sched.c)
 * driven through its seam (sched/sched.h) with the demo model: tier order and
 * FIFO within a tier, a request that waits for KV blocks (and one refused
 * because it can never fit), preemption of a lower tier by a higher one (at
 * admission and when the pool fills while decoding) with output identical to
 * an unpreempted greedy run, the per-tier queue bound (SP_ERR_BUSY), and
 * deadlines that expire while waiting and while running.
 *
 * The test thread owns the job mailbox (sched/mailbox.h) and drains it, so no
 * event loop is involved. Its wake callback is a gate: armed, it holds the
 * engine thread inside the wake of the next event (the first token of a
 * request) until the test opens it, so the requests submitted meanwhile all
 * find that request running and each other waiting, whatever the machine's
 * speed. Events are numbered in delivery order; the mailbox delivers jobs in
 * the order their events were posted, so "job B's first token came after job
 * A's DONE" means B was admitted after A ended.
 */
#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/model.h"
#include "sampan/log.h"
#include "sched/mailbox.h"
#include "sched/sched.h"

#define DEMO "models/stories260K.gguf"
#define MAX_TOK 512

/* ---- the gate (the mailbox's wake callback, called on the engine thread) --- */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_armed, gate_holding;

static void
gate_wake(void *ud)
{
    (void)ud;
    pthread_mutex_lock(&gate_mu);
    if (gate_armed) {
        gate_holding = true;
        pthread_cond_broadcast(&gate_cv);
        while (gate_armed) {
            pthread_cond_wait(&gate_cv, &gate_mu);
        }
        gate_holding = false;
    }
    pthread_mutex_unlock(&gate_mu);
}

static void
gate_arm(void)
{
    pthread_mutex_lock(&gate_mu);
    gate_armed = true;
    pthread_mutex_unlock(&gate_mu);
}

/* Wait (10 s at most) until the engine is held in the gate. */
static void
gate_wait_held(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&gate_mu);
    int rc = 0;
    while (!gate_holding && rc != ETIMEDOUT) {
        rc = pthread_cond_timedwait(&gate_cv, &gate_mu, &until);
    }
    bool held = gate_holding;
    pthread_mutex_unlock(&gate_mu);
    if (!held) SP_TEST_FAIL("the engine never reached the gate");
}

static void
gate_open(void)
{
    pthread_mutex_lock(&gate_mu);
    gate_armed = false;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* ---- jobs and their events --------------------------------------------------- */

typedef struct tjob {
    sp_sched_job_t *job;
    int32_t tokens[MAX_TOK];
    int n_tokens;
    int first_event; /* delivery number of its first token (0: none) */
    int done_event;  /* of its DONE (0: not yet) */
    int64_t submit_ns;  /* sp_time_ns() at submit */
    int64_t queue_ns;   /* from its DONE */
    sp_status_t status;
    char message[256];
    int64_t completion_tokens, compute_ns;
    int n_finish;
} tjob_t;

static int delivered; /* events delivered so far (the test thread's) */

static void
on_event(const sp_sched_event_t *ev, void *ud)
{
    tjob_t *t = ud;
    delivered++;
    switch (ev->kind) {
    case SP_SCHED_EV_TOKEN:
        if (ev->token >= 0) {
            ASSERT(t->n_tokens < MAX_TOK);
            t->tokens[t->n_tokens++] = ev->token;
            if (t->first_event == 0) {
                t->first_event = delivered;
            }
        }
        break;
    case SP_SCHED_EV_FINISH:
        t->n_finish++;
        break;
    case SP_SCHED_EV_DONE:
        ASSERT_EQ(t->done_event, 0);
        t->done_event = delivered;
        t->status = ev->status;
        snprintf(t->message, sizeof t->message, "%s", ev->message ? ev->message : "");
        t->completion_tokens = ev->completion_tokens;
        t->compute_ns = ev->compute_ns;
        t->queue_ns = ev->queue_ns;
        break;
    default:
        break;
    }
}

/* One greedy sequence of exactly max_tokens tokens (end of text ignored). */
static sp_status_t
submit(sp_sched_t *s, sp_mailbox_t *mb, tjob_t *t, const int32_t *prompt, int64_t n_prompt,
       int32_t max_tokens, int32_t priority, int64_t deadline_ns, int32_t n, char *err,
       size_t err_len)
{
    memset(t, 0, sizeof *t);
    t->submit_ns = sp_time_ns();
    const int32_t *prompts[4];
    int64_t lens[4];
    ASSERT(n >= 1 && n <= 4);
    for (int i = 0; i < n; i++) {
        prompts[i] = prompt;
        lens[i] = n_prompt;
    }
    sp_sched_request_t r = {0};
    r.prompts = prompts;
    r.n_prompts = lens;
    r.n = n;
    r.gen = sp_gen_default_params();
    r.gen.max_tokens = max_tokens;
    r.gen.sampling.temperature = 0;
    r.gen.ignore_eos = true;
    r.priority = priority;
    r.deadline_ns = deadline_ns;
    r.mailbox = mb;
    r.on_event = on_event;
    r.ud = t;
    return sp_sched_submit(s, &r, &t->job, err, err_len);
}

static void
submit_ok(sp_sched_t *s, sp_mailbox_t *mb, tjob_t *t, const int32_t *prompt, int64_t n_prompt,
          int32_t max_tokens, int32_t priority)
{
    char err[256];
    if (submit(s, mb, t, prompt, n_prompt, max_tokens, priority, 0, 1, err, sizeof err) != SP_OK) {
        SP_TEST_FAIL("submit: %s", err);
    }
}

/* When the scheduler ended a job, on its clock: the order of the DONE deliveries is not the
 * order of the ends (a job's events ride one mailbox message until the test thread drains it,
 * and a loaded host may not drain for a whole run). */
static int64_t
done_at(const tjob_t *t)
{
    return t->submit_ns + t->queue_ns + t->compute_ns;
}

/* Drain the mailbox until every job's DONE was delivered (60 s at most). */
static void
wait_done(sp_mailbox_t *mb, tjob_t *const *jobs, int n)
{
    for (int spins = 0; spins < 300000; spins++) {
        sp_mailbox_drain(mb);
        int left = 0;
        for (int i = 0; i < n; i++) {
            left += jobs[i]->done_event == 0;
        }
        if (left == 0) {
            return;
        }
        usleep(200);
    }
    SP_TEST_FAIL("jobs did not end in time");
}

/* The engine updates its block statistics at the end of a step, just after
 * the last DONE was posted: wait for every block to be back. */
static void
wait_blocks_free(sp_sched_t *s)
{
    sp_sched_stats_t st;
    for (int i = 0; i < 5000; i++) {
        sp_sched_get_stats(s, &st);
        if (st.kv_blocks_used == 0 && st.active == 0 && st.queued == 0) {
            return;
        }
        usleep(1000);
    }
    SP_TEST_FAIL("blocks still used: %lld, active %lld, queued %lld", (long long)st.kv_blocks_used,
                 (long long)st.active, (long long)st.queued);
}

static sp_model_t *
load_demo(void)
{
    char err[512];
    sp_model_t *m;
    sp_log_set_level(SP_LOG_LEVEL_WARN);
    if (sp_model_load(DEMO, &m, err, sizeof err) != SP_OK) SP_TEST_FAIL("demo: %s", err);
    return m;
}

static sp_sched_t *
make_sched(const sp_model_t *m, int n_slots, int64_t kv_blocks, int max_queue)
{
    char err[512];
    sp_sched_params_t p = sp_sched_default_params();
    p.n_slots = n_slots;
    p.n_threads = 1;
    p.kv_blocks = kv_blocks;
    p.max_queue = max_queue;
    sp_sched_t *s;
    if (sp_sched_create(m, &p, &s, err, sizeof err) != SP_OK) SP_TEST_FAIL("create: %s", err);
    return s;
}

/* A prompt of n tokens (inside the demo's 512-token vocabulary), distinct per seed. */
static void
make_prompt(int32_t *out, int64_t n, int seed)
{
    out[0] = 1; /* BOS */
    for (int64_t i = 1; i < n; i++) {
        out[i] = (int32_t)(3 + (i * 37 + seed * 101) % 500);
    }
}

/* The tokens of a request run alone on a fresh scheduler with a roomy pool. */
static void
run_alone(const sp_model_t *m, const int32_t *prompt, int64_t n_prompt, int32_t max_tokens,
          tjob_t *out)
{
    sp_sched_t *s = make_sched(m, 1, 0, 64);
    sp_mailbox_t *mb = sp_mailbox_create(NULL, NULL);
    ASSERT(mb != NULL);
    submit_ok(s, mb, out, prompt, n_prompt, max_tokens, SP_SCHED_PRIO_STANDARD);
    tjob_t *jobs[1] = {out};
    wait_done(mb, jobs, 1);
    ASSERT_OK(out->status);
    ASSERT_EQ(out->n_tokens, max_tokens);
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    ASSERT_EQ(st.preemptions, 0);
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);
}

static void
assert_same_tokens(const char *what, const tjob_t *a, const tjob_t *b)
{
    if (a->n_tokens != b->n_tokens) {
        SP_TEST_FAIL("%s: %d tokens, alone %d", what, a->n_tokens, b->n_tokens);
    }
    for (int i = 0; i < a->n_tokens; i++) {
        if (a->tokens[i] != b->tokens[i]) {
            SP_TEST_FAIL("%s: token %d is %d, alone %d", what, i, a->tokens[i], b->tokens[i]);
        }
    }
}

/* ---- tests -------------------------------------------------------------------- */

/*
 * One slot; a premium request runs (held at its first token) while six more
 * arrive: batch A, standard B, premium C, standard D, batch E, premium F.
 * They run one at a time, highest tier first and in arrival order within a
 * tier: C F B D A E, each admitted only after the one before ended.
 */
TEST(sched_admit_tier_order_fifo_within_tier)
{
    sp_model_t *m = load_demo();
    sp_sched_t *s = make_sched(m, 1, 0, 64);
    sp_mailbox_t *mb = sp_mailbox_create(gate_wake, NULL);
    ASSERT(mb != NULL);
    int32_t prompts[7][3];
    for (int i = 0; i < 7; i++) {
        make_prompt(prompts[i], 3, i);
    }
    static tjob_t blocker, a, b, c, d, e, f;
    gate_arm();
    submit_ok(s, mb, &blocker, prompts[0], 3, 16, SP_SCHED_PRIO_PREMIUM);
    gate_wait_held();
    submit_ok(s, mb, &a, prompts[1], 3, 6, SP_SCHED_PRIO_BATCH);
    submit_ok(s, mb, &b, prompts[2], 3, 6, SP_SCHED_PRIO_STANDARD);
    submit_ok(s, mb, &c, prompts[3], 3, 6, SP_SCHED_PRIO_PREMIUM);
    submit_ok(s, mb, &d, prompts[4], 3, 6, SP_SCHED_PRIO_STANDARD);
    submit_ok(s, mb, &e, prompts[5], 3, 6, SP_SCHED_PRIO_BATCH);
    submit_ok(s, mb, &f, prompts[6], 3, 6, 7 /* any positive priority is premium */);
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    ASSERT_EQ(st.active, 1);
    ASSERT_EQ(st.queued, 6);
    ASSERT_EQ(st.waiting_tier[0], 2);
    ASSERT_EQ(st.waiting_tier[1], 2);
    ASSERT_EQ(st.waiting_tier[2], 2);
    ASSERT_EQ(st.running_tier[2], 1);
    ASSERT_EQ(sp_sched_outstanding(s), 7);
    gate_open();

    tjob_t *order[7] = {&blocker, &c, &f, &b, &d, &a, &e};
    wait_done(mb, order, 7);
    for (int i = 0; i < 7; i++) {
        ASSERT_OK(order[i]->status);
        ASSERT_EQ(order[i]->n_finish, 1);
        ASSERT_EQ(order[i]->completion_tokens, i == 0 ? 16 : 6);
        ASSERT(order[i]->first_event > 0 && order[i]->first_event < order[i]->done_event);
        if (i > 0 && order[i]->first_event < order[i - 1]->done_event) {
            SP_TEST_FAIL("job %d of the expected order started (event %d) before job %d ended "
                         "(event %d)", i, order[i]->first_event, i - 1, order[i - 1]->done_event);
        }
    }
    sp_sched_get_stats(s, &st);
    ASSERT_EQ(st.preemptions, 0);
    ASSERT_EQ(st.jobs_done, 7);
    wait_blocks_free(s);
    ASSERT_EQ(sp_sched_outstanding(s), 0);
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);
    sp_model_free(m);
}

/*
 * A pool of 8 blocks (16 positions each), two slots. Standard L runs (held at
 * its first token, 4 positions: one block); standard W's 120-token prompt
 * needs all 8 blocks. W waits (same tier: no preemption) and runs once L
 * ended and gave its blocks back. A request that could never fit the pool
 * (prompt + max_tokens over 8 blocks) is refused at submit.
 */
TEST(sched_admit_waits_for_blocks)
{
    sp_model_t *m = load_demo();
    sp_sched_t *s = make_sched(m, 2, 8, 64);
    sp_mailbox_t *mb = sp_mailbox_create(gate_wake, NULL);
    ASSERT(mb != NULL);
    int32_t pl[3], pw[120];
    make_prompt(pl, 3, 1);
    make_prompt(pw, 120, 2);
    static tjob_t l, w, never;
    char err[256];
    /* 3 + 126 positions need 9 blocks: never admissible, refused now. */
    ASSERT_EQ(submit(s, mb, &never, pl, 3, 126, 0, 0, 1, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "KV blocks") != NULL);
    ASSERT(never.job == NULL);
    /* 3 + 125 = 128 positions: exactly the pool, accepted (run below). */
    ASSERT_EQ(sp_sched_outstanding(s), 0);

    gate_arm();
    submit_ok(s, mb, &l, pl, 3, 100, SP_SCHED_PRIO_STANDARD);
    gate_wait_held();
    submit_ok(s, mb, &w, pw, 120, 4, SP_SCHED_PRIO_STANDARD);
    gate_open();
    tjob_t *jobs[2] = {&l, &w};
    wait_done(mb, jobs, 2);
    ASSERT_OK(l.status);
    ASSERT_OK(w.status);
    ASSERT_EQ(l.n_tokens, 100);
    ASSERT_EQ(w.n_tokens, 4);
    if (w.first_event < l.done_event) {
        SP_TEST_FAIL("W ran (event %d) before L gave its blocks back (event %d)", w.first_event,
                     l.done_event);
    }
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    ASSERT_EQ(st.preemptions, 0);
    wait_blocks_free(s);

    /* The largest admissible request: the whole pool. */
    static tjob_t full;
    submit_ok(s, mb, &full, pl, 3, 125, SP_SCHED_PRIO_STANDARD);
    tjob_t *one[1] = {&full};
    wait_done(mb, one, 1);
    ASSERT_OK(full.status);
    ASSERT_EQ(full.n_tokens, 125);
    wait_blocks_free(s);
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);
    sp_model_free(m);
}

/*
 * Admission preempts: batch L runs (held at its first token, one block of
 * the 8); premium P's 120-token prompt needs all 8. P is admitted at once by
 * preempting L, which goes back to the head of its tier, waits until P ended,
 * recomputes its tokens and continues. Both answers are token for token the
 * ones each gets alone, and L's stream has no repeated or missing token.
 */
TEST(sched_preempt_lower_tier_at_admission)
{
    sp_model_t *m = load_demo();
    int32_t pl[3], pp[120];
    make_prompt(pl, 3, 3);
    make_prompt(pp, 120, 4);
    static tjob_t l_alone, p_alone, l, p;
    run_alone(m, pl, 3, 40, &l_alone);
    run_alone(m, pp, 120, 4, &p_alone);

    sp_sched_t *s = make_sched(m, 2, 8, 64);
    sp_mailbox_t *mb = sp_mailbox_create(gate_wake, NULL);
    ASSERT(mb != NULL);
    gate_arm();
    submit_ok(s, mb, &l, pl, 3, 40, SP_SCHED_PRIO_BATCH);
    gate_wait_held();
    /* Deliver L's first token now: a job's events ride one mailbox message until it is drained,
     * so a test thread that slept through the whole run (a loaded host) would otherwise get L's
     * DONE with that early message, ahead of P's. Drained, L's later events queue after P's. */
    sp_mailbox_drain(mb);
    ASSERT(l.first_event > 0);
    submit_ok(s, mb, &p, pp, 120, 4, SP_SCHED_PRIO_PREMIUM);
    gate_open();
    tjob_t *jobs[2] = {&l, &p};
    wait_done(mb, jobs, 2);
    ASSERT_OK(l.status);
    ASSERT_OK(p.status);
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    ASSERT_EQ(st.preemptions, 1);
    /* L started first, P ran and ended while L waited, then L ended. */
    ASSERT(l.first_event < p.first_event);
    ASSERT(done_at(&p) < done_at(&l));
    assert_same_tokens("preempted L", &l, &l_alone);
    assert_same_tokens("premium P", &p, &p_alone);
    ASSERT_EQ(l.completion_tokens, 40);
    wait_blocks_free(s);
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);
    sp_model_free(m);
}

/*
 * Decoding preempts: batch L and premium H both run in a pool of 8 blocks,
 * each growing toward 7 (3 + 100 positions). When a new block is needed and
 * none is left, the lowest tier (L) is preempted, never H; H ends first, then
 * L resumes (recomputing what the prefix cache lost) and ends with the tokens
 * it gets alone.
 */
TEST(sched_preempt_lower_tier_when_pool_fills)
{
    sp_model_t *m = load_demo();
    int32_t pl[3], ph[3];
    make_prompt(pl, 3, 5);
    make_prompt(ph, 3, 6);
    static tjob_t l_alone, h_alone, l, h;
    run_alone(m, pl, 3, 100, &l_alone);
    run_alone(m, ph, 3, 100, &h_alone);

    sp_sched_t *s = make_sched(m, 2, 8, 64);
    sp_mailbox_t *mb = sp_mailbox_create(gate_wake, NULL);
    ASSERT(mb != NULL);
    gate_arm();
    submit_ok(s, mb, &l, pl, 3, 100, SP_SCHED_PRIO_BATCH);
    gate_wait_held();
    submit_ok(s, mb, &h, ph, 3, 100, SP_SCHED_PRIO_PREMIUM);
    gate_open();
    tjob_t *jobs[2] = {&l, &h};
    wait_done(mb, jobs, 2);
    ASSERT_OK(l.status);
    ASSERT_OK(h.status);
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    /* Once: L cannot come back while H runs (H's blocks plus L's leave none
     * over), and H is never the victim. */
    ASSERT_EQ(st.preemptions, 1);
    ASSERT(done_at(&h) < done_at(&l));
    /* L's first full block outlived it in the prefix cache (released last
     * first, so H reclaimed L's tail): its recompute started from there. */
    ASSERT(st.prompt_tokens_cached >= 16);
    assert_same_tokens("preempted L", &l, &l_alone);
    assert_same_tokens("premium H", &h, &h_alone);
    wait_blocks_free(s);
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);
    sp_model_free(m);
}

/*
 * Queue bounds: one slot, one waiting place per tier. While a premium request
 * runs, each tier takes one more request and refuses the next with
 * SP_ERR_BUSY (naming the tier) and a Retry-After in 1..60 s; a request of
 * more sequences than the server runs and queues is SP_ERR_INVALID. Refused
 * requests are not counted; accepted ones all complete.
 */
TEST(sched_admit_queue_bound_is_busy)
{
    sp_model_t *m = load_demo();
    sp_sched_t *s = make_sched(m, 1, 0, 1);
    sp_mailbox_t *mb = sp_mailbox_create(gate_wake, NULL);
    ASSERT(mb != NULL);
    int32_t pr[3];
    make_prompt(pr, 3, 7);
    static tjob_t run, ok[3], busy[3], two, three;
    char err[256];
    gate_arm();
    submit_ok(s, mb, &run, pr, 3, 8, SP_SCHED_PRIO_PREMIUM);
    gate_wait_held();
    const int32_t prio[3] = {SP_SCHED_PRIO_BATCH, SP_SCHED_PRIO_STANDARD, SP_SCHED_PRIO_PREMIUM};
    const char *names[3] = {"batch", "standard", "premium"};
    for (int t = 0; t < 3; t++) {
        submit_ok(s, mb, &ok[t], pr, 3, 4, prio[t]);
        ASSERT_EQ(submit(s, mb, &busy[t], pr, 3, 4, prio[t], 0, 1, err, sizeof err), SP_ERR_BUSY);
        ASSERT(strstr(err, names[t]) != NULL);
        ASSERT(busy[t].job == NULL);
        int ra = sp_sched_retry_after_s(s, prio[t], 1);
        ASSERT(ra >= 1 && ra <= 60);
    }
    /* Two sequences fit one slot plus one place, but the place is taken. */
    ASSERT_EQ(submit(s, mb, &two, pr, 3, 4, SP_SCHED_PRIO_STANDARD, 0, 2, err, sizeof err),
              SP_ERR_BUSY);
    /* Three never fit. */
    ASSERT_EQ(submit(s, mb, &three, pr, 3, 4, SP_SCHED_PRIO_STANDARD, 0, 3, err, sizeof err),
              SP_ERR_INVALID);
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    ASSERT_EQ(st.queued, 3);
    ASSERT_EQ(sp_sched_outstanding(s), 4);
    gate_open();
    tjob_t *jobs[4] = {&run, &ok[0], &ok[1], &ok[2]};
    wait_done(mb, jobs, 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(jobs[i]->status);
    }
    /* Premium first, batch last. */
    ASSERT(ok[2].first_event < ok[1].first_event && ok[1].first_event < ok[0].first_event);
    wait_blocks_free(s);
    /* Idle again: free running places count as room, so two sequences fit. */
    static tjob_t again;
    ASSERT_OK(submit(s, mb, &again, pr, 3, 4, SP_SCHED_PRIO_STANDARD, 0, 2, err, sizeof err));
    tjob_t *one[1] = {&again};
    wait_done(mb, one, 1);
    ASSERT_OK(again.status);
    ASSERT_EQ(again.n_finish, 2);
    ASSERT_EQ(again.completion_tokens, 8);
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);
    sp_model_free(m);
}

/*
 * Deadlines: a request whose deadline passes while it waits ends with
 * SP_ERR_CANCELLED ("deadline") without running; one whose deadline passes
 * while it runs is stopped at the next step with the same status, after the
 * tokens it already produced. The request that ran meanwhile is unaffected.
 */
TEST(sched_deadline_expires_waiting_and_running)
{
    sp_model_t *m = load_demo();
    sp_sched_t *s = make_sched(m, 1, 0, 64);
    sp_mailbox_t *mb = sp_mailbox_create(gate_wake, NULL);
    ASSERT(mb != NULL);
    int32_t pr[3];
    make_prompt(pr, 3, 8);
    static tjob_t run, waiting, running;
    char err[256];

    gate_arm();
    submit_ok(s, mb, &run, pr, 3, 8, SP_SCHED_PRIO_PREMIUM);
    gate_wait_held();
    ASSERT_OK(submit(s, mb, &waiting, pr, 3, 8, SP_SCHED_PRIO_STANDARD, sp_time_ns() + 1000000, 1,
                     err, sizeof err));
    usleep(20000); /* past its deadline, still waiting behind `run` */
    gate_open();
    tjob_t *jobs[2] = {&run, &waiting};
    wait_done(mb, jobs, 2);
    ASSERT_OK(run.status);
    ASSERT_EQ(run.n_tokens, 8);
    ASSERT_EQ(waiting.status, SP_ERR_CANCELLED);
    ASSERT(strstr(waiting.message, "deadline") != NULL);
    ASSERT_EQ(waiting.n_tokens, 0);
    ASSERT_EQ(waiting.compute_ns, 0); /* never admitted */

    /* Running: held at its first token until its deadline passed. */
    gate_arm();
    int64_t deadline = sp_time_ns() + 1000000000;
    ASSERT_OK(submit(s, mb, &running, pr, 3, 400, SP_SCHED_PRIO_STANDARD, deadline, 1, err,
                     sizeof err));
    gate_wait_held();
    if (sp_time_ns() >= deadline) {
        gate_open();
        SKIP("the first token took over a second");
    }
    while (sp_time_ns() <= deadline + 5000000) {
        usleep(10000);
    }
    gate_open();
    tjob_t *one[1] = {&running};
    wait_done(mb, one, 1);
    ASSERT_EQ(running.status, SP_ERR_CANCELLED);
    ASSERT(strstr(running.message, "deadline") != NULL);
    ASSERT(running.n_tokens >= 1 && running.n_tokens < 400);
    ASSERT(running.compute_ns > 0);
    wait_blocks_free(s);
    ASSERT_EQ(sp_sched_outstanding(s), 0);
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);
    sp_model_free(m);
}
