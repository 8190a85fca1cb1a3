/*
 * test_sched_sample.c - the scheduler samples a step's rows on the batch's
 * threads (sched.c, presample): seeded, sampled requests (temperature, a
 * repetition penalty, the whole vocabulary weighed) running together on a
 * two-thread scheduler give exactly the tokens each gives alone on a
 * one-thread scheduler (where every row is sampled serially). A JSON-object
 * request in the same steps keeps the serial path (its constraint is not
 * private to one thread) and must come out the same too.
 *
 * Driven through the seam (sched/sched.h) with the demo model; the test
 * thread drains the job mailbox, so no event loop is involved.
 */
#include "test.h"

#include <stdbool.h>
#include <unistd.h>

#include "engine/model.h"
#include "sampan/log.h"
#include "sched/mailbox.h"
#include "sched/sched.h"

#define DEMO "models/stories260K.gguf"
#define MAX_TOK 128
#define N_JOBS 5

typedef struct tjob {
    sp_sched_job_t *job;
    int32_t tokens[MAX_TOK];
    int n_tokens;
    bool done;
    sp_status_t status;
    char message[256];
} tjob_t;

static void
on_event(const sp_sched_event_t *ev, void *ud)
{
    tjob_t *t = ud;
    if (ev->kind == SP_SCHED_EV_TOKEN && ev->token >= 0) {
        ASSERT(t->n_tokens < MAX_TOK);
        t->tokens[t->n_tokens++] = ev->token;
    } else if (ev->kind == SP_SCHED_EV_DONE) {
        ASSERT(!t->done);
        t->done = true;
        t->status = ev->status;
        snprintf(t->message, sizeof t->message, "%s", ev->message ? ev->message : "");
    }
}

static sp_sched_t *
make_sched(const sp_model_t *m, int n_slots, int n_threads)
{
    char err[512];
    sp_sched_params_t p = sp_sched_default_params();
    p.n_slots = n_slots;
    p.n_threads = n_threads;
    sp_sched_t *s;
    if (sp_sched_create(m, &p, &s, err, sizeof err) != SP_OK) SP_TEST_FAIL("create: %s", err);
    return s;
}

/* Request k: its own prompt (inside the demo's 512-token vocabulary) and seed;
 * request 3 asks for a JSON object. */
static void
submit_job(sp_sched_t *s, sp_mailbox_t *mb, tjob_t *t, int k, int32_t *prompt)
{
    char err[256];
    const int64_t n_prompt = 5 + k;
    prompt[0] = 1; /* BOS */
    for (int64_t i = 1; i < n_prompt; i++) {
        prompt[i] = (int32_t)(3 + (i * 37 + k * 101) % 500);
    }
    memset(t, 0, sizeof *t);
    const int32_t *prompts[1] = {prompt};
    int64_t lens[1] = {n_prompt};
    sp_sched_request_t r = {0};
    r.prompts = prompts;
    r.n_prompts = lens;
    r.n = 1;
    r.gen = sp_gen_default_params();
    r.gen.max_tokens = 40;
    r.gen.sampling.temperature = 0.9f;
    r.gen.sampling.top_k = 0; /* every token weighed: the costly path */
    r.gen.sampling.top_p = 0.95f;
    r.gen.sampling.repeat_penalty = 1.15f;
    r.gen.sampling.penalty_last_n = 16;
    r.gen.sampling.seed = 1000 + (uint64_t)k;
    r.gen.ignore_eos = k != 3;
    r.gen.json_object = k == 3;
    r.priority = SP_SCHED_PRIO_STANDARD;
    r.mailbox = mb;
    r.on_event = on_event;
    r.ud = t;
    if (sp_sched_submit(s, &r, &t->job, err, sizeof err) != SP_OK) {
        SP_TEST_FAIL("submit %d: %s", k, err);
    }
}

/* Drain the mailbox until every job is done (60 s at most). */
static void
wait_done(sp_mailbox_t *mb, tjob_t *jobs, int n)
{
    for (int spins = 0; spins < 300000; spins++) {
        sp_mailbox_drain(mb);
        int left = 0;
        for (int i = 0; i < n; i++) {
            left += !jobs[i].done;
        }
        if (left == 0) {
            return;
        }
        usleep(200);
    }
    SP_TEST_FAIL("jobs did not end in time");
}

TEST(sched_parallel_sampling_matches_alone)
{
    char err[512];
    sp_model_t *m;
    sp_log_set_level(SP_LOG_LEVEL_WARN);
    if (sp_model_load(DEMO, &m, err, sizeof err) != SP_OK) SP_TEST_FAIL("demo: %s", err);
    static int32_t prompts[N_JOBS][16];
    static tjob_t together[N_JOBS], alone[N_JOBS];

    /* Together: all in the same steps on two threads. */
    sp_sched_t *s = make_sched(m, N_JOBS, 2);
    sp_mailbox_t *mb = sp_mailbox_create(NULL, NULL);
    ASSERT(mb != NULL);
    for (int k = 0; k < N_JOBS; k++) {
        submit_job(s, mb, &together[k], k, prompts[k]);
    }
    wait_done(mb, together, N_JOBS);
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    ASSERT(st.mean_step_seqs > 1.5); /* the rows did share steps */
    sp_sched_destroy(s);
    sp_mailbox_destroy(mb);

    /* Alone: one slot, one thread, one row per step. */
    for (int k = 0; k < N_JOBS; k++) {
        s = make_sched(m, 1, 1);
        mb = sp_mailbox_create(NULL, NULL);
        ASSERT(mb != NULL);
        submit_job(s, mb, &alone[k], k, prompts[k]);
        wait_done(mb, &alone[k], 1);
        sp_sched_destroy(s);
        sp_mailbox_destroy(mb);
    }

    for (int k = 0; k < N_JOBS; k++) {
        if (together[k].status != SP_OK || alone[k].status != SP_OK) {
            SP_TEST_FAIL("job %d: status %d (%s), alone %d (%s)", k, (int)together[k].status,
                         together[k].message, (int)alone[k].status, alone[k].message);
        }
        ASSERT(together[k].n_tokens >= 1);
        if (together[k].n_tokens != alone[k].n_tokens) {
            SP_TEST_FAIL("job %d: %d tokens, alone %d", k, together[k].n_tokens,
                         alone[k].n_tokens);
        }
        for (int i = 0; i < together[k].n_tokens; i++) {
            if (together[k].tokens[i] != alone[k].tokens[i]) {
                SP_TEST_FAIL("job %d: token %d is %d, alone %d", k, i, together[k].tokens[i],
                             alone[k].tokens[i]);
            }
        }
    }
    /* The sampled requests ran their whole length (end of text ignored). */
    ASSERT_EQ(together[0].n_tokens, 40);
    sp_model_free(m);
}
