/*
 * test_sched_mem.c - sp_sched_estimate against what sp_sched_create really
 * allocates (the sp_alloc_bytes_in_use growth across create), the sizes it
 * decides (n_ctx, KV blocks) against what the created scheduler reports, its
 * errors against create's, the batch and context estimates under it, and the
 * outstanding-sequence counter through a real submit (a mailbox on an HTTP
 * event loop that serves nothing).
 *
 * Two models: the demo (stories260K: context 512, 5 layers, 8 heads over 4 KV
 * heads) and a zero-weight llama built here in memory with a 8192 context (so
 * the 4096 default cap applies), 6 heads over 2 KV heads and a wider FFN.
 */
#include "test.h"

#include <stdatomic.h>
#include <unistd.h>

#include "core/alloc.h"
#include "engine/batch.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "sampan/log.h"
#include "http/http.h"
#include "sched/sched.h"

#define DEMO "models/stories260K.gguf"

typedef struct test_model {
    sp_model_t *m;
    void *buf; /* the in-memory GGUF, freed after the model */
} test_model_t;

static void
load_demo(test_model_t *tm)
{
    char err[512];
    tm->buf = NULL;
    if (sp_model_load(DEMO, &tm->m, err, sizeof err) != SP_OK) SP_TEST_FAIL("demo: %s", err);
}

/* llama, n_embd 192, 6 heads of 32 over 2 KV heads, 3 layers, n_ff 512, F32
 * zeros (the loader checks shapes, not values), the demo's tokenizer. */
static void
load_wide(test_model_t *tm)
{
    char err[512];
    sp_gguf_t *demo, *g;
    sp_gguf_writer_t *w;
    size_t len;
    const int64_t E = 192, H = 6, HKV = 2, HD = 32, FF = 512, NL = 3;
    ASSERT_OK(sp_gguf_open(DEMO, &demo, err, sizeof err));
    const int64_t V = 512; /* the demo's vocabulary */
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", "llama"));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.context_length", 8192));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)E));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)FF));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)NL));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)H));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)HKV));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)HD));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
    /* The biggest tensor is the embedding (E x V floats); one zero buffer serves all. */
    float *zeros = sp_calloc((size_t)(E * V > FF * E ? E * V : FF * E), sizeof(float));
    ASSERT(zeros != NULL);
#define T(name, n_in, n_out)                                                              \
    do {                                                                                  \
        const int64_t ne_[2] = {(n_in), (n_out)};                                         \
        ASSERT_OK(sp_gguf_writer_add_tensor(w, (name), SP_TYPE_F32, (n_out) == 1 ? 1 : 2, \
                                            ne_, zeros));                                 \
    } while (0)
    T("token_embd.weight", E, V);
    T("output.weight", E, V);
    T("output_norm.weight", E, 1);
    for (int64_t l = 0; l < NL; l++) {
        char name[96];
#define L(suffix, n_in, n_out)                                                    \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);             \
    T(name, n_in, n_out)
        L("attn_norm.weight", E, 1);
        L("attn_q.weight", E, H * HD);
        L("attn_k.weight", E, HKV * HD);
        L("attn_v.weight", E, HKV * HD);
        L("attn_output.weight", H * HD, E);
        L("ffn_norm.weight", E, 1);
        L("ffn_gate.weight", E, FF);
        L("ffn_up.weight", E, FF);
        L("ffn_down.weight", FF, E);
#undef L
    }
#undef T
    ASSERT_OK(sp_gguf_writer_write_mem(w, &tm->buf, &len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    sp_free(zeros);
    ASSERT_OK(sp_gguf_open_mem(tm->buf, len, "wide.gguf", &g, err, sizeof err));
    if (sp_model_load_gguf(g, &tm->m, err, sizeof err) != SP_OK) SP_TEST_FAIL("wide: %s", err);
    const sp_hparams_t *hp = sp_model_hparams(tm->m);
    ASSERT(hp->n_ctx_train == 8192 && hp->n_head_kv == 2 && hp->n_ff == FF);
}

static void
free_model(test_model_t *tm)
{
    sp_model_free(tm->m);
    sp_free(tm->buf);
}

/* |estimate - actual| within 5% of actual plus 64 KiB. */
static void
check_close(const char *what, uint64_t est, uint64_t actual)
{
    double diff = (double)est - (double)actual;
    double tol = 0.05 * (double)actual + 65536.0;
    if (diff > tol || -diff > tol) {
        SP_TEST_FAIL("%s: estimate %llu, allocated %llu", what, (unsigned long long)est,
                     (unsigned long long)actual);
    }
}

/* ---- the batch and the context -------------------------------------------- */

/* sp_batch_bytes is exact but for the thread pool's private object (bounded by
 * 256 bytes) and the workers' start arguments (16 bytes each, freed as they
 * start): the estimate is never below and at most that above. */
TEST(sched_mem_batch_and_ctx_bytes)
{
    char err[512];
    test_model_t models[2];
    load_demo(&models[0]);
    load_wide(&models[1]);
    for (int mi = 0; mi < 2; mi++) {
        const sp_model_t *m = models[mi].m;
        const sp_batch_params_t bps[] = {
            {0, 0, 0, 1, 0}, {256, 4, 256, 2, 0}, {7, 64, 0, 3, 0}, {512, 1, 4096, 0, 0},
            {64, 4, 256, 1, 20}, /* logit rows for speculative verification */
        };
        for (size_t i = 0; i < sizeof bps / sizeof bps[0]; i++) {
            sp_batch_params_t r;
            ASSERT_OK(sp_batch_resolve(m, &bps[i], &r, err, sizeof err));
            ASSERT(r.max_seqs <= r.max_tokens && r.n_threads >= 1);
            size_t est = sp_batch_bytes(m, &bps[i]);
            size_t before = sp_alloc_bytes_in_use();
            sp_batch_t *b;
            ASSERT_OK(sp_batch_create(m, &bps[i], &b, err, sizeof err));
            size_t got = sp_alloc_bytes_in_use() - before;
            sp_batch_destroy(b);
            ASSERT_EQ(sp_alloc_bytes_in_use(), before);
            if (est < got || est - got > 256 + 16 * (size_t)r.n_threads) {
                SP_TEST_FAIL("batch %zu: estimate %zu, allocated %zu", i, est, got);
            }
        }
        /* Refused parameters: 0, and the same error as create. */
        sp_batch_params_t bad = {70000, 1, 0, 1, 0};
        char e1[256], e2[256];
        sp_batch_t *b;
        ASSERT_EQ(sp_batch_bytes(m, &bad), 0);
        ASSERT_EQ(sp_batch_create(m, &bad, &b, e1, sizeof e1), SP_ERR_INVALID);
        sp_batch_params_t rb;
        ASSERT_EQ(sp_batch_resolve(m, &bad, &rb, e2, sizeof e2), SP_ERR_INVALID);
        ASSERT_STR_EQ(e1, e2);

        sp_ctx_params_t cps[3] = {sp_ctx_default_params(), sp_ctx_default_params(),
                                  sp_ctx_default_params()};
        cps[0].n_threads = 1;
        cps[1].n_ctx = 256;
        cps[1].n_batch = 32;
        cps[1].kv_type = SP_KV_TYPE_F16;
        cps[1].n_threads = 2;
        cps[2].n_ctx = 100;
        cps[2].logits_all = true;
        cps[2].kv_type = SP_KV_TYPE_Q8_0;
        cps[2].n_threads = 1;
        for (int i = 0; i < 3; i++) {
            sp_ctx_params_t rc;
            ASSERT_OK(sp_ctx_resolve(m, &cps[i], &rc, err, sizeof err));
            size_t est = sp_ctx_bytes(m, &cps[i]);
            size_t before = sp_alloc_bytes_in_use();
            sp_ctx_t *c;
            ASSERT_OK(sp_ctx_create(m, &cps[i], &c, err, sizeof err));
            size_t got = sp_alloc_bytes_in_use() - before;
            ASSERT_EQ(sp_ctx_n_ctx(c), rc.n_ctx);
            sp_ctx_destroy(c);
            if (est < got || est - got > 256 + 16 * 16) {
                SP_TEST_FAIL("ctx %d: estimate %zu, allocated %zu", i, est, got);
            }
        }
        sp_ctx_params_t badc = sp_ctx_default_params();
        badc.n_ctx = (int64_t)1 << 30;
        sp_ctx_t *c;
        ASSERT_EQ(sp_ctx_bytes(m, &badc), 0);
        ASSERT_EQ(sp_ctx_create(m, &badc, &c, e1, sizeof e1), SP_ERR_INVALID);
        sp_ctx_params_t rbc;
        ASSERT_EQ(sp_ctx_resolve(m, &badc, &rbc, e2, sizeof e2), SP_ERR_INVALID);
        ASSERT_STR_EQ(e1, e2);
    }
    free_model(&models[1]);
    free_model(&models[0]);
}

/* ---- the scheduler --------------------------------------------------------- */

static void
check_sched(const char *model_name, const sp_model_t *m, const sp_sched_params_t *p)
{
    char err[512];
    sp_sched_mem_t est;
    ASSERT_OK(sp_sched_estimate(m, p, &est, err, sizeof err));
    size_t before = sp_alloc_bytes_in_use();
    sp_sched_t *s;
    if (sp_sched_create(m, p, &s, err, sizeof err) != SP_OK) SP_TEST_FAIL("create: %s", err);
    size_t got = sp_alloc_bytes_in_use() - before;
    sp_sched_stats_t st;
    sp_sched_get_stats(s, &st);
    const int64_t n_ctx = sp_sched_n_ctx(s);
    ASSERT_EQ(sp_sched_outstanding(s), 0);
    sp_sched_destroy(s);
    ASSERT_EQ(sp_alloc_bytes_in_use(), before);

    char what[160];
    snprintf(what, sizeof what, "%s slots %d kv_blocks %lld kv %s n_ctx %lld threads %d",
             model_name, p->n_slots, (long long)p->kv_blocks, sp_kv_type_name(p->kv_type),
             (long long)p->n_ctx, p->n_threads);
    if (est.n_ctx != n_ctx || est.kv_blocks != st.kv_blocks_total) {
        SP_TEST_FAIL("%s: n_ctx %lld kv_blocks %lld, created %lld and %lld", what,
                     (long long)est.n_ctx, (long long)est.kv_blocks, (long long)n_ctx,
                     (long long)st.kv_blocks_total);
    }
    check_close(what, est.kv_bytes + est.scratch_bytes, got);
    /* The estimate bounds from above where it cannot be exact. */
    ASSERT(est.kv_bytes + est.scratch_bytes >= got);
    if (getenv("SP_TEST_VERBOSE") != NULL) { /* the numbers, for a report */
        printf("  %-58s est %9llu (kv %9llu) actual %9zu  +%lld B\n", what,
               (unsigned long long)(est.kv_bytes + est.scratch_bytes),
               (unsigned long long)est.kv_bytes, got,
               (long long)(est.kv_bytes + est.scratch_bytes) - (long long)got);
    }
}

TEST(sched_mem_estimate_matches_create)
{
    sp_log_set_level(SP_LOG_LEVEL_WARN); /* one ready line per scheduler otherwise */
    test_model_t models[2];
    load_demo(&models[0]);
    load_wide(&models[1]);
    const char *names[2] = {"demo", "wide"};
    for (int mi = 0; mi < 2; mi++) {
        const sp_model_t *m = models[mi].m;
        for (int k = 0; k < 16; k++) {
            sp_sched_params_t p = sp_sched_default_params();
            p.n_slots = k & 1 ? 4 : 1;
            p.kv_blocks = k & 2 ? 37 : 0;
            /* F32; F16 and Q8_0 (half of the k & 4 cases each) */
            p.kv_type = k & 4 ? (k & 1 ? SP_KV_TYPE_Q8_0 : SP_KV_TYPE_F16) : SP_KV_TYPE_F32;
            p.n_ctx = k & 8 ? 256 : 0;
            p.n_threads = 1 + k % 3;
            check_sched(names[mi], m, &p);
        }
        /* One per core, and a step budget below the slots (raised to them). */
        sp_sched_params_t p = sp_sched_default_params();
        p.n_threads = 0;
        p.n_slots = 8;
        p.prefill_chunk = 3;
        check_sched(names[mi], m, &p);
    }
    /* The caps: the demo trains on 512 positions, the wide model's 8192 are cut to 4096. */
    sp_sched_params_t p = sp_sched_default_params();
    sp_sched_mem_t est;
    char err[512];
    ASSERT_OK(sp_sched_estimate(models[0].m, &p, &est, err, sizeof err));
    ASSERT_EQ(est.n_ctx, 512);
    ASSERT_EQ(est.kv_blocks, 4 * 512 / 16);
    ASSERT_OK(sp_sched_estimate(models[1].m, &p, &est, err, sizeof err));
    ASSERT_EQ(est.n_ctx, 4096);
    ASSERT_EQ(est.kv_blocks, 4 * 4096 / 16);
    /* The pool: its blocks (on huge pages: whole ones from 2 MiB on), a 4-byte mark per
     * block and its object. */
    const uint64_t kv_data =
        sp_huge_size((size_t)est.kv_blocks * sp_kv_block_bytes(models[1].m, SP_KV_TYPE_F32)) +
        (uint64_t)est.kv_blocks * 4;
    ASSERT(est.kv_bytes > kv_data && est.kv_bytes - kv_data < 256);
    /* Q8_0: 16 rows of head_dim int8 and one F16 scale per 32 per tile, K and V,
     * every layer and KV head: about 27% of F32 for head_dim 64 (the demo's 8: 31%). */
    for (int mi = 0; mi < 2; mi++) {
        const sp_hparams_t *hp = sp_model_hparams(models[mi].m);
        const uint64_t row = (uint64_t)hp->head_dim + 2 * (uint64_t)((hp->head_dim + 31) / 32);
        const uint64_t q8_block = (uint64_t)hp->n_layer * hp->n_head_kv * 2 * 16 * row;
        ASSERT_EQ(sp_kv_block_bytes(models[mi].m, SP_KV_TYPE_Q8_0), q8_block);
        sp_sched_params_t q = sp_sched_default_params();
        q.kv_type = SP_KV_TYPE_Q8_0;
        ASSERT_OK(sp_sched_estimate(models[mi].m, &q, &est, err, sizeof err));
        const uint64_t q8_data =
            sp_huge_size((size_t)(est.kv_blocks * q8_block)) + (uint64_t)est.kv_blocks * 4;
        ASSERT(est.kv_bytes > q8_data && est.kv_bytes - q8_data < 256);
        if (getenv("SP_TEST_VERBOSE") != NULL) {
            printf("  %s: bytes per position f32 %zu f16 %zu q8_0 %zu\n", names[mi],
                   sp_kv_block_bytes(models[mi].m, SP_KV_TYPE_F32) / 16,
                   sp_kv_block_bytes(models[mi].m, SP_KV_TYPE_F16) / 16,
                   sp_kv_block_bytes(models[mi].m, SP_KV_TYPE_Q8_0) / 16);
        }
    }
    /* The default pool stays within 2 GiB (estimate only: create would take it). */
    p.n_ctx = (int64_t)1 << 20;
    ASSERT_OK(sp_sched_estimate(models[1].m, &p, &est, err, sizeof err));
    ASSERT_EQ(est.n_ctx, (int64_t)1 << 20);
    ASSERT_EQ(est.kv_blocks,
              (int64_t)(((uint64_t)2 << 30) / sp_kv_block_bytes(models[1].m, SP_KV_TYPE_F32)));
    ASSERT(est.kv_bytes <= ((uint64_t)2 << 30) + (uint64_t)est.kv_blocks * 4 + 256);
    /* ... but holds at least one whole context. */
    p.n_ctx = (int64_t)1 << 24;
    ASSERT_OK(sp_sched_estimate(models[1].m, &p, &est, err, sizeof err));
    ASSERT_EQ(est.kv_blocks, ((int64_t)1 << 24) / 16);
    free_model(&models[1]);
    free_model(&models[0]);
}

TEST(sched_mem_estimate_errors_match_create)
{
    test_model_t tm;
    load_demo(&tm);
    sp_sched_params_t bad[5];
    for (int i = 0; i < 5; i++) {
        bad[i] = sp_sched_default_params();
        bad[i].n_threads = 1;
    }
    bad[0].n_slots = 0;                  /* the scheduler's own check */
    bad[1].n_ctx = (int64_t)1 << 30;     /* the context's */
    bad[2].kv_blocks = (int64_t)1 << 31; /* too many blocks */
    bad[3].prefill_chunk = 70000;        /* the batch's */
    bad[4].tpot_target_ms = -1;
    for (int i = 0; i < 5; i++) {
        char e1[256] = "", e2[256] = "";
        sp_sched_mem_t est;
        sp_sched_t *s;
        size_t before = sp_alloc_bytes_in_use();
        sp_status_t st1 = sp_sched_estimate(tm.m, &bad[i], &est, e1, sizeof e1);
        ASSERT_EQ(sp_alloc_bytes_in_use(), before);
        sp_status_t st2 = sp_sched_create(tm.m, &bad[i], &s, e2, sizeof e2);
        ASSERT_EQ(sp_alloc_bytes_in_use(), before);
        ASSERT(st1 != SP_OK);
        ASSERT_EQ(st1, st2);
        ASSERT_STR_EQ(e1, e2);
        ASSERT(s == NULL);
        ASSERT_EQ(est.kv_bytes + est.scratch_bytes, 0);
    }
    free_model(&tm);
}

/* ---- the outstanding counter ----------------------------------------------- */

static sp_mailbox_t *test_mb;
static atomic_int jobs_done;

/* The mailbox wired to the loop as the server wires it (serve.c). */
static void
mb_wake(void *loop)
{
    sp_http_loop_wake(loop);
}

static void
mb_drain(void *mb)
{
    sp_mailbox_drain(mb);
}

static void *
mb_loop_init(sp_http_loop_t *loop, void *ud)
{
    (void)ud;
    test_mb = sp_mailbox_create(mb_wake, loop);
    if (test_mb != NULL) {
        sp_http_loop_set_wake_cb(loop, mb_drain, test_mb);
    }
    return test_mb;
}

static void
mb_loop_fini(sp_http_loop_t *loop, void *user, void *ud)
{
    (void)ud;
    sp_mailbox_destroy(user);
    sp_http_loop_set_wake_cb(loop, NULL, NULL);
}

static void
no_handler(sp_http_req_t *req, void *ud)
{
    (void)req;
    (void)ud;
}

static sp_sched_t *test_sched;
static atomic_int_fast64_t outstanding_at_done = -1;

static void
on_event(const sp_sched_event_t *ev, void *ud)
{
    (void)ud;
    if (ev->kind == SP_SCHED_EV_DONE) {
        /* Its sequences were counted down before DONE was posted. */
        atomic_store(&outstanding_at_done, sp_sched_outstanding(test_sched));
        atomic_fetch_add(&jobs_done, 1);
    }
}

/* n sequences of the same prompt, greedy, exactly max_tokens each (no end of text). */
static void
submit(sp_sched_t *s, const int32_t *prompt, int64_t n_prompt, int32_t n, int32_t max_tokens)
{
    const int32_t *prompts[8];
    int64_t lens[8];
    ASSERT(n <= 8);
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
    r.mailbox = test_mb;
    r.on_event = on_event;
    char err[256];
    sp_sched_job_t *job;
    if (sp_sched_submit(s, &r, &job, err, sizeof err) != SP_OK) SP_TEST_FAIL("submit: %s", err);
}

/*
 * Down to 0 once a job ended (by the time its DONE is delivered), up by r->n
 * at submit, and down to 0 when stop ends what is still queued or running.
 * The loop only delivers events (no client connects); the jobs are submitted
 * from this thread, which created the mailbox.
 */
TEST(sched_mem_outstanding_counts_submitted_sequences)
{
    char err[512];
    test_model_t tm;
    sp_log_set_level(SP_LOG_LEVEL_WARN);
    load_demo(&tm);
    sp_sched_params_t p = sp_sched_default_params();
    p.n_slots = 1; /* the sequences of a job run one after the other */
    p.n_threads = 1;
    ASSERT_OK(sp_sched_create(tm.m, &p, &test_sched, err, sizeof err));
    ASSERT_EQ(sp_sched_outstanding(test_sched), 0);

    sp_http_server_params_t hp = sp_http_default_server_params();
    hp.handler = no_handler;
    hp.loop_init = mb_loop_init;
    hp.loop_fini = mb_loop_fini;
    sp_http_server_t *srv;
    if (sp_http_server_create(&hp, "127.0.0.1", 0, &srv, err, sizeof err) != SP_OK) {
        SKIP("no local socket: %s", err);
    }
    ASSERT(test_mb != NULL);
    ASSERT_OK(sp_http_server_start(srv, err, sizeof err));

    const int32_t prompt[3] = {1, 403, 407};
    submit(test_sched, prompt, 3, 2, 8);
    ASSERT(sp_sched_outstanding(test_sched) <= 2);
    for (int i = 0; i < 3000 && atomic_load(&jobs_done) < 1; i++) {
        usleep(10000);
    }
    ASSERT_EQ(atomic_load(&jobs_done), 1);
    ASSERT_EQ(atomic_load(&outstanding_at_done), 0);
    ASSERT_EQ(sp_sched_outstanding(test_sched), 0);

    /* Eight sequences of 500 tokens, one at a time: the engine needs about
     * 4000 steps (a good fraction of a second) to end them all, so the count
     * seen just after the submit has certainly not reached 0. */
    submit(test_sched, prompt, 3, 8, 500);
    int64_t after = sp_sched_outstanding(test_sched);
    ASSERT(after >= 1 && after <= 8);
    /* Stop ends the queued and running sequences (cancelled): back to 0. */
    sp_sched_stop(test_sched);
    ASSERT_EQ(sp_sched_outstanding(test_sched), 0);
    /* Refused submits never count. */
    sp_sched_request_t r = {0};
    sp_sched_job_t *job;
    ASSERT_EQ(sp_sched_submit(test_sched, &r, &job, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_sched_outstanding(test_sched), 0);

    sp_http_server_destroy(srv); /* the loop delivers the rest, then frees the mailbox */
    sp_sched_destroy(test_sched);
    free_model(&tm);
}
