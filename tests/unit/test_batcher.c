/* test_batcher.c - the dynamic batcher (sched/batcher.h) against a fake backend.
 *
 * The fake's execute sums each row of its FP32 input "x" (outputs "sum" and "n", the row's
 * element count), or measures and upper-cases the strings of its BYTES input "s" (outputs
 * "len" and "upper"); it records every call (rows, first value, width, instance), sleeps a
 * given time per call and per row, fails when it sees the value 666, and can be held inside
 * execute until the test releases it. Holding the only instance is how the tests queue
 * requests deterministically: while it is held nothing is taken from the queue, so the next
 * batch is formed from exactly what the test submitted. Values encode the request: row r of
 * request id holds id * 10 + r in every element. The host's allocator counts live blocks, so
 * every test also proves that no output buffer leaks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "sched/batcher.h"
#include "test.h"

/* ---- host allocator with a live count */

static atomic_long live_blocks;

static void *
host_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p != NULL) {
        atomic_fetch_add(&live_blocks, 1);
    }
    return p;
}

static void
host_free(void *p)
{
    if (p != NULL) {
        atomic_fetch_sub(&live_blocks, 1);
        free(p);
    }
}

static const sp_backend_host_t host = {SP_BACKEND_ABI_VERSION, host_alloc, host_free, NULL};

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void
sleep_us(int64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* ---- the fake backend */

#define MAX_CALLS 4096

typedef struct inst {
    struct fake *f;
    int id;
    atomic_int busy;
} inst_t;

typedef struct fake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t call_us, row_us; /* sleep per call and per row */
    bool hold, in_hold;      /* hold: the next execute waits inside until released */
    bool bad_rows;           /* return one row too many */
    bool nobatch;            /* the model has no batch dimension */
    int n_calls;
    int64_t rows[MAX_CALLS], width[MAX_CALLS];
    float first[MAX_CALLS];
    int inst[MAX_CALLS];
    int running, max_running;
    bool overlap;            /* an instance was entered twice at once */
    inst_t one;              /* the instance of make_one */
} fake_t;

static void
fake_init(fake_t *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
}

static void
fake_hold(fake_t *f)
{
    pthread_mutex_lock(&f->mu);
    f->hold = true;
    f->in_hold = false;
    pthread_mutex_unlock(&f->mu);
}

/* Wait until an execute is held inside (at most 5 s). */
static void
fake_wait_held(fake_t *f)
{
    int64_t end = now_ns() + 5000000000LL;
    pthread_mutex_lock(&f->mu);
    while (!f->in_hold && now_ns() < end) {
        pthread_mutex_unlock(&f->mu);
        sleep_us(200);
        pthread_mutex_lock(&f->mu);
    }
    bool ok = f->in_hold;
    pthread_mutex_unlock(&f->mu);
    ASSERT(ok);
}

static void
fake_release(fake_t *f)
{
    pthread_mutex_lock(&f->mu);
    f->hold = false;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static int
fake_ncalls(fake_t *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->n_calls;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static uint32_t
get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static int
fake_execute(void *model, const sp_backend_tensor_t *in, int32_t n_in, sp_backend_tensor_t *out,
             int32_t n_out, char *err, size_t err_len)
{
    inst_t *I = model;
    fake_t *f = I->f;
    const sp_backend_tensor_t *x = &in[0];
    int64_t rows = f->nobatch ? 1 : x->dims[0];
    int64_t per = 1;
    for (int32_t d = f->nobatch ? 0 : 1; d < x->n_dims; d++) {
        per *= x->dims[d];
    }
    bool twice = atomic_fetch_add(&I->busy, 1) != 0;

    pthread_mutex_lock(&f->mu);
    f->overlap = f->overlap || twice;
    if (f->n_calls < MAX_CALLS) {
        int c = f->n_calls;
        f->rows[c] = rows;
        f->width[c] = per;
        f->first[c] = x->dtype == SP_BT_FP32 && x->bytes ? ((const float *)x->data)[0] : 0;
        f->inst[c] = I->id;
    }
    f->n_calls++;
    f->running++;
    if (f->running > f->max_running) {
        f->max_running = f->running;
    }
    if (f->hold) {
        f->in_hold = true;
        while (f->hold) {
            pthread_cond_wait(&f->cv, &f->mu);
        }
    }
    int64_t sleep = f->call_us + f->row_us * rows;
    pthread_mutex_unlock(&f->mu);
    if (sleep > 0) {
        sleep_us(sleep);
    }

    int rc = 0;
    if (x->dtype == SP_BT_FP32) {
        const float *v = x->data;
        for (int64_t i = 0; i < rows * per; i++) {
            if (v[i] == 666.0f) {
                snprintf(err, err_len, "poisoned row %lld", (long long)(i / per));
                rc = 1;
                break;
            }
        }
    }
    for (int32_t j = 0; j < n_out && rc == 0; j++) {
        sp_backend_tensor_t *o = &out[j];
        int64_t orows = f->bad_rows ? rows + 1 : rows;
        o->n_dims = f->nobatch ? 1 : 2;
        o->dims[0] = f->nobatch ? 1 : orows;
        o->dims[1] = 1;
        if (strcmp(o->name, "sum") == 0 || strcmp(o->name, "n") == 0) {
            bool sum = o->name[0] == 's';
            o->dtype = sum ? SP_BT_FP32 : SP_BT_INT32;
            o->bytes = (size_t)orows * 4;
            o->data = host_alloc(o->bytes);
            for (int64_t r = 0; r < orows; r++) {
                float s = 0;
                for (int64_t k = 0; k < per && r < rows; k++) {
                    s += ((const float *)x->data)[r * per + k];
                }
                if (sum) {
                    ((float *)o->data)[r] = s;
                } else {
                    ((int32_t *)o->data)[r] = (int32_t)per;
                }
            }
        } else if (strcmp(o->name, "len") == 0 || strcmp(o->name, "upper") == 0) {
            const uint8_t *p = x->data;
            bool len = o->name[0] == 'l';
            o->dtype = len ? SP_BT_INT32 : SP_BT_BYTES;
            o->bytes = len ? (size_t)rows * 4 : x->bytes;
            o->data = host_alloc(o->bytes);
            uint8_t *q = o->data;
            for (int64_t r = 0; r < rows; r++) {
                uint32_t n = get_u32(p);
                if (len) {
                    ((int32_t *)o->data)[r] = (int32_t)n;
                } else {
                    put_u32(q, n);
                    for (uint32_t k = 0; k < n; k++) {
                        uint8_t c = p[4 + k];
                        q[4 + k] = c >= 'a' && c <= 'z' ? (uint8_t)(c - 32) : c;
                    }
                    q += 4 + n;
                }
                p += 4 + n;
            }
        } else {
            snprintf(err, err_len, "no output '%s'", o->name);
            rc = 1;
        }
    }

    pthread_mutex_lock(&f->mu);
    f->running--;
    pthread_mutex_unlock(&f->mu);
    atomic_fetch_sub(&I->busy, 1);
    return rc;
}

static const sp_backend_api_t fake_api = {SP_BACKEND_ABI_VERSION, "fake", NULL, fake_execute,
                                          NULL};

/* x FP32 [width] (-1: variable) -> sum FP32 [1], n INT32 [1]. */
static sp_backend_model_info_t
info_x(int64_t width)
{
    sp_backend_model_info_t m;
    memset(&m, 0, sizeof m);
    m.n_inputs = 1;
    snprintf(m.inputs[0].name, sizeof m.inputs[0].name, "x");
    m.inputs[0].dtype = SP_BT_FP32;
    m.inputs[0].n_dims = 1;
    m.inputs[0].dims[0] = width;
    m.n_outputs = 2;
    snprintf(m.outputs[0].name, sizeof m.outputs[0].name, "sum");
    m.outputs[0].dtype = SP_BT_FP32;
    m.outputs[0].n_dims = 1;
    m.outputs[0].dims[0] = 1;
    snprintf(m.outputs[1].name, sizeof m.outputs[1].name, "n");
    m.outputs[1].dtype = SP_BT_INT32;
    m.outputs[1].n_dims = 1;
    m.outputs[1].dims[0] = 1;
    return m;
}

/* s BYTES [1] -> len INT32 [1], upper BYTES [1]. */
static sp_backend_model_info_t
info_s(void)
{
    sp_backend_model_info_t m;
    memset(&m, 0, sizeof m);
    m.n_inputs = 1;
    snprintf(m.inputs[0].name, sizeof m.inputs[0].name, "s");
    m.inputs[0].dtype = SP_BT_BYTES;
    m.inputs[0].n_dims = 1;
    m.inputs[0].dims[0] = 1;
    m.n_outputs = 2;
    snprintf(m.outputs[0].name, sizeof m.outputs[0].name, "len");
    m.outputs[0].dtype = SP_BT_INT32;
    m.outputs[0].n_dims = 1;
    m.outputs[0].dims[0] = 1;
    snprintf(m.outputs[1].name, sizeof m.outputs[1].name, "upper");
    m.outputs[1].dtype = SP_BT_BYTES;
    m.outputs[1].n_dims = 1;
    m.outputs[1].dims[0] = 1;
    return m;
}

/* ---- completions */

typedef struct got {
    int calls;
    sp_status_t status;
    sp_batch_reason_t reason;
    char msg[512];
    int n_out;
    char out_name[4][16];
    int64_t dims0[4];
    float sums[64];
    int32_t ns[64];
    char strs[8][32];
    int batch_rows, batch_requests;
    int64_t submit_ns, done_ns;
    int order; /* completion order, from 1 */
} got_t;

static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static int n_done;

static void
on_done(void *ud, const sp_batch_result_t *res)
{
    got_t *g = ud;
    int64_t t = now_ns();
    pthread_mutex_lock(&done_mu);
    g->calls++;
    g->done_ns = t;
    g->order = ++n_done;
    g->status = res->status;
    g->reason = res->reason;
    snprintf(g->msg, sizeof g->msg, "%s", res->message ? res->message : "(null)");
    g->n_out = res->n_outputs;
    g->batch_rows = res->batch_rows;
    g->batch_requests = res->batch_requests;
    for (int32_t i = 0; i < res->n_outputs && i < 4; i++) {
        const sp_backend_tensor_t *o = &res->outputs[i];
        snprintf(g->out_name[i], sizeof g->out_name[i], "%s", o->name);
        g->dims0[i] = o->dims[0];
        if (strcmp(o->name, "sum") == 0) {
            for (int64_t r = 0; r < o->dims[0] && r < 64; r++) {
                g->sums[r] = ((const float *)o->data)[r];
            }
        } else if (strcmp(o->name, "n") == 0 || strcmp(o->name, "len") == 0) {
            for (int64_t r = 0; r < o->dims[0] && r < 64; r++) {
                g->ns[r] = ((const int32_t *)o->data)[r];
            }
        } else if (strcmp(o->name, "upper") == 0) {
            const uint8_t *p = o->data;
            size_t pos = 0;
            for (int64_t r = 0; r < o->dims[0] && r < 8; r++) {
                uint32_t n = get_u32(p + pos);
                ASSERT(pos + 4 + n <= o->bytes);
                snprintf(g->strs[r], sizeof g->strs[r], "%.*s", (int)n, (const char *)p + pos + 4);
                pos += 4 + n;
            }
            ASSERT_EQ(pos, o->bytes);
        }
    }
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&done_mu);
}

/* Wait until n callbacks ran in all (at most 10 s). */
static void
wait_done(int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&done_mu);
    while (n_done < n) {
        if (pthread_cond_timedwait(&done_cv, &done_mu, &ts) != 0) {
            break;
        }
    }
    int have = n_done;
    pthread_mutex_unlock(&done_mu);
    if (have < n) {
        SP_TEST_FAIL("only %d of %d callbacks ran", have, n);
    }
}

static int
done_count(void)
{
    pthread_mutex_lock(&done_mu);
    int n = n_done;
    pthread_mutex_unlock(&done_mu);
    return n;
}

/* Submit rows x width of values id * 10 + r (the caller's buffer is freed at once). */
static sp_status_t
submit_x(sp_batcher_t *b, int id, int64_t rows, int64_t width, uint32_t prio, uint64_t timeout_us,
         got_t *g, char *err)
{
    size_t n = (size_t)(rows * width);
    float *x = malloc(n * sizeof(float) + 1);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < width; k++) {
            x[r * width + k] = (float)(id * 10 + r);
        }
    }
    sp_backend_tensor_t t = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2,
                             .dims = {rows, width}, .data = x, .bytes = n * sizeof(float)};
    sp_batch_item_t it = {.inputs = &t, .n_inputs = 1, .priority = prio,
                          .timeout_us = timeout_us, .done = on_done, .ud = g};
    if (g != NULL) {
        g->submit_ns = now_ns();
    }
    char e[512];
    sp_status_t st = sp_batcher_submit(b, &it, err ? err : e, 512);
    memset(x, 0xff, n * sizeof(float)); /* the batcher must have copied it */
    free(x);
    return st;
}

static void
check_sums(const got_t *g, int id, int64_t rows, int64_t width)
{
    ASSERT_EQ(g->calls, 1);
    if (g->status != SP_OK) {
        SP_TEST_FAIL("request %d: status %d: %s", id, (int)g->status, g->msg);
    }
    ASSERT_EQ(g->n_out, 2);
    ASSERT_STR_EQ(g->out_name[0], "sum");
    ASSERT_EQ(g->dims0[0], rows);
    for (int64_t r = 0; r < rows; r++) {
        ASSERT_NEAR(g->sums[r], (double)((id * 10 + r) * width), 1e-3);
        ASSERT_EQ(g->ns[r], width);
    }
}

static sp_batcher_t *
make(const sp_batcher_params_t *p, fake_t *f, inst_t *insts, int n,
     const sp_backend_model_info_t *m)
{
    void *ptrs[16];
    for (int i = 0; i < n; i++) {
        insts[i].f = f;
        insts[i].id = i;
        atomic_init(&insts[i].busy, 0);
        ptrs[i] = &insts[i];
    }
    sp_batcher_t *b = NULL;
    char err[256];
    sp_status_t st = sp_batcher_create(p, &fake_api, ptrs, n, m, &host, &b, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("create: %s", err);
    }
    return b;
}

/* The set-up most tests share: f (initialised here: set its fields after this, before the
 * first submit) with one instance, serving a model with input x[width]. */
static sp_batcher_t *
make_one(const sp_batcher_params_t *p, fake_t *f, int64_t width)
{
    fake_init(f);
    sp_backend_model_info_t m = info_x(width);
    return make(p, f, &f->one, 1, &m);
}

static sp_batcher_params_t
params(int32_t max_batch, uint64_t delay_us)
{
    sp_batcher_params_t p = sp_batcher_default_params();
    p.max_batch_size = max_batch;
    p.max_queue_delay_us = delay_us;
    return p;
}

/* Hold the only instance with a blocker request (id 99, one row) so that what is submitted
 * next queues up. */
static void
block(sp_batcher_t *b, fake_t *f, got_t *g)
{
    fake_hold(f);
    ASSERT_OK(submit_x(b, 99, 1, 4, 1, 0, g, NULL));
    fake_wait_held(f);
}

static void
finish(sp_batcher_t *b)
{
    sp_batcher_destroy(b);
    ASSERT_EQ(atomic_load(&live_blocks), 0);
}

/* ---- tests */

TEST(batcher_merges_and_splits_rows_in_order)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 300000);
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t g[4] = {0};
    ASSERT_OK(submit_x(b, 1, 1, 4, 0, 0, &g[0], NULL));
    ASSERT_OK(submit_x(b, 2, 2, 4, 0, 0, &g[1], NULL));
    ASSERT_OK(submit_x(b, 3, 3, 4, 0, 0, &g[2], NULL));
    ASSERT_OK(submit_x(b, 4, 2, 4, 0, 0, &g[3], NULL)); /* 8 rows: the cap, runs at once */
    wait_done(4);
    ASSERT_EQ(fake_ncalls(&f), 1);
    ASSERT_EQ(f.rows[0], 8);
    ASSERT_NEAR(f.first[0], 10, 0);
    check_sums(&g[0], 1, 1, 4);
    check_sums(&g[1], 2, 2, 4);
    check_sums(&g[2], 3, 3, 4);
    check_sums(&g[3], 4, 2, 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(g[i].batch_rows, 8);
        ASSERT_EQ(g[i].batch_requests, 4);
        /* Reached the cap: nobody waited for the 300 ms delay. */
        ASSERT((g[i].done_ns - g[i].submit_ns) < 250 * 1000000LL);
    }
    ASSERT(g[0].order < g[1].order && g[1].order < g[2].order && g[2].order < g[3].order);
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    ASSERT_EQ(s.requests, 4);
    ASSERT_EQ(s.completed, 4);
    ASSERT_EQ(s.batches, 1);
    ASSERT_EQ(s.rows, 8);
    ASSERT_EQ(s.n_hist, 4); /* 1 2 4 8 */
    ASSERT_EQ(s.hist_le[3], 8);
    ASSERT_EQ(s.hist[3], 1);
    ASSERT_EQ(s.queue_count, 4);
    ASSERT_EQ(s.execute_count, 1);
    finish(b);
}

TEST(batcher_outputs_subset_order_and_take)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 0);
    sp_batcher_t *b = make_one(&p, &f, 2);
    got_t g = {0};
    float x[2] = {1, 2};
    sp_backend_tensor_t t = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2, .dims = {1, 2},
                             .data = x, .bytes = sizeof x};
    const char *want[] = {"n", "sum"};
    sp_batch_item_t it = {.inputs = &t, .n_inputs = 1, .outputs = want, .n_outputs = 2,
                          .done = on_done, .ud = &g};
    char err[256];
    ASSERT_OK(sp_batcher_submit(b, &it, err, sizeof err));
    wait_done(1);
    ASSERT_EQ(g.n_out, 2);
    ASSERT_STR_EQ(g.out_name[0], "n"); /* the order asked for */
    ASSERT_STR_EQ(g.out_name[1], "sum");
    ASSERT_NEAR(g.sums[0], 3, 0);
    it.n_outputs = 1; /* only "n": execute is asked for "n" alone */
    ASSERT_OK(sp_batcher_submit(b, &it, err, sizeof err));
    wait_done(2);
    ASSERT_EQ(g.n_out, 1);
    ASSERT_STR_EQ(g.out_name[0], "n");
    finish(b);
}

static void *taken_ptr;

static void
on_done_take(void *ud, const sp_batch_result_t *res)
{
    (void)ud;
    ASSERT_EQ(res->status, SP_OK);
    taken_ptr = sp_batcher_result_take(res, 0);
    ASSERT(taken_ptr == res->outputs[0].data);
    pthread_mutex_lock(&done_mu);
    n_done++;
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&done_mu);
}

TEST(batcher_take_keeps_an_output_alive)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 0);
    sp_batcher_t *b = make_one(&p, &f, 2);
    float x[2] = {1, 2};
    sp_backend_tensor_t t = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2, .dims = {1, 2},
                             .data = x, .bytes = sizeof x};
    sp_batch_item_t it = {.inputs = &t, .n_inputs = 1, .done = on_done_take};
    ASSERT_OK(sp_batcher_submit(b, &it, NULL, 0));
    wait_done(1);
    sp_batcher_destroy(b);
    ASSERT_EQ(atomic_load(&live_blocks), 1); /* ours now */
    ASSERT_NEAR(((float *)taken_ptr)[0], 3, 0);
    host_free(taken_ptr);
    ASSERT_EQ(atomic_load(&live_blocks), 0);
}

TEST(batcher_preferred_sizes_send_the_largest_at_once)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 200000);
    p.preferred_batch_size[0] = 2;
    p.preferred_batch_size[1] = 4;
    p.n_preferred = 2;
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[5] = {0};
    fake_hold(&f);
    ASSERT_OK(submit_x(b, 99, 2, 4, 0, 0, &blocker, NULL)); /* preferred 2: runs at once */
    fake_wait_held(&f);
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(submit_x(b, i + 1, 1, 4, 0, 0, &g[i], NULL));
    }
    int64_t t0 = now_ns();
    fake_release(&f);
    wait_done(5); /* the blocker and the batch of 4 (preferred) without waiting */
    ASSERT((now_ns() - t0) < 150 * 1000000LL);
    ASSERT_EQ(fake_ncalls(&f), 2);
    ASSERT_EQ(f.rows[0], 2);
    ASSERT_EQ(f.rows[1], 4);
    ASSERT_EQ(g[4].calls, 0); /* the fifth waits for the delay */
    wait_done(6);
    ASSERT_EQ(f.rows[2], 1);
    ASSERT((g[4].done_ns - g[4].submit_ns) >= 199 * 1000000LL);
    for (int i = 0; i < 5; i++) {
        check_sums(&g[i], i + 1, 1, 4);
    }
    finish(b);
}

TEST(batcher_lone_request_waits_at_most_the_delay)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 30000);
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t g = {0};
    ASSERT_OK(submit_x(b, 1, 1, 4, 0, 0, &g, NULL));
    wait_done(1);
    int64_t ms = (g.done_ns - g.submit_ns) / 1000000;
    ASSERT(ms >= 29);  /* it did wait for company ... */
    ASSERT(ms < 230);  /* ... and not much longer (generous slack for a busy machine) */
    check_sums(&g, 1, 1, 4);
    /* The delay runs from the oldest request: a second one arriving 20 ms later leaves with
     * the first, about 30 ms after the first arrived. */
    got_t a = {0}, c = {0};
    ASSERT_OK(submit_x(b, 2, 1, 4, 0, 0, &a, NULL));
    sleep_us(20000);
    ASSERT_OK(submit_x(b, 3, 1, 4, 0, 0, &c, NULL));
    wait_done(3);
    ASSERT_EQ(fake_ncalls(&f), 2);
    ASSERT_EQ(f.rows[1], 2);
    ASSERT((c.done_ns - c.submit_ns) < (a.done_ns - a.submit_ns));
    finish(b);
}

TEST(batcher_max_batch_size_caps_batches)
{
    fake_t f;
    sp_batcher_params_t p = params(4, 50000);
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[12] = {0};
    block(b, &f, &blocker);
    for (int i = 0; i < 10; i++) {
        ASSERT_OK(submit_x(b, i + 1, 1, 4, 0, 0, &g[i], NULL));
    }
    ASSERT_OK(submit_x(b, 11, 3, 4, 0, 0, &g[10], NULL));
    ASSERT_OK(submit_x(b, 12, 3, 4, 0, 0, &g[11], NULL));
    fake_release(&f);
    wait_done(13);
    /* blocker, 4, 4, then 2 + (3 does not fit) -> 2, 3, 3. */
    ASSERT_EQ(fake_ncalls(&f), 6);
    int64_t want[] = {1, 4, 4, 2, 3, 3};
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ(f.rows[i], want[i]);
    }
    for (int i = 0; i < 10; i++) {
        check_sums(&g[i], i + 1, 1, 4);
    }
    check_sums(&g[10], 11, 3, 4);
    check_sums(&g[11], 12, 3, 4);
    char err[256];
    ASSERT_EQ(submit_x(b, 13, 5, 4, 0, 0, NULL, err), SP_ERR_INVALID); /* rows > max_batch_size */
    ASSERT(strstr(err, "1 to 4") != NULL);
    finish(b);
}

TEST(batcher_priority_levels_order)
{
    fake_t f;
    sp_batcher_params_t p = params(1, 0);
    p.priority_levels = 3;
    p.default_priority_level = 2;
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[6] = {0};
    block(b, &f, &blocker);
    ASSERT_OK(submit_x(b, 1, 1, 4, 3, 0, &g[0], NULL));  /* level 3 */
    ASSERT_OK(submit_x(b, 2, 1, 4, 0, 0, &g[1], NULL));  /* default: 2 */
    ASSERT_OK(submit_x(b, 3, 1, 4, 1, 0, &g[2], NULL));  /* level 1 */
    ASSERT_OK(submit_x(b, 4, 1, 4, 9, 0, &g[3], NULL));  /* out of range: default 2 */
    ASSERT_OK(submit_x(b, 5, 1, 4, 1, 0, &g[4], NULL));  /* level 1 */
    ASSERT_OK(submit_x(b, 6, 1, 4, 3, 0, &g[5], NULL));  /* level 3 */
    fake_release(&f);
    wait_done(7);
    int want[] = {99, 3, 5, 2, 4, 1, 6};
    for (int i = 0; i < 7; i++) {
        ASSERT_EQ((int)f.first[i] / 10, want[i]);
    }
    finish(b);
}

TEST(batcher_lower_levels_fill_a_batch)
{
    /* A batch starts with the highest level and fills up from lower ones (Triton's cursor). */
    fake_t f;
    sp_batcher_params_t p = params(4, 0);
    p.priority_levels = 2;
    p.default_priority_level = 2;
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[3] = {0};
    block(b, &f, &blocker);
    ASSERT_OK(submit_x(b, 1, 1, 4, 2, 0, &g[0], NULL));
    ASSERT_OK(submit_x(b, 2, 1, 4, 2, 0, &g[1], NULL));
    ASSERT_OK(submit_x(b, 3, 1, 4, 1, 0, &g[2], NULL));
    fake_release(&f);
    wait_done(4);
    ASSERT_EQ(fake_ncalls(&f), 2);
    ASSERT_EQ(f.rows[1], 3);
    ASSERT_EQ((int)f.first[1] / 10, 3); /* the level-1 request heads it */
    ASSERT(g[2].order < g[0].order && g[0].order < g[1].order);
    finish(b);
}

TEST(batcher_queue_full_is_busy_per_level)
{
    fake_t f;
    sp_batcher_params_t p = params(1, 0);
    p.priority_levels = 2;
    p.default_priority_level = 2;
    p.default_queue_policy.max_queue_size = 2;
    p.has_level_policy[0] = true; /* level 1: unbounded */
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[4] = {0};
    block(b, &f, &blocker); /* running, so no longer queued */
    ASSERT_OK(submit_x(b, 1, 1, 4, 2, 0, &g[0], NULL));
    ASSERT_OK(submit_x(b, 2, 1, 4, 2, 0, &g[1], NULL));
    char err[256];
    ASSERT_EQ(submit_x(b, 3, 1, 4, 2, 0, NULL, err), SP_ERR_BUSY);
    ASSERT(strstr(err, "full") != NULL);
    ASSERT_OK(submit_x(b, 4, 1, 4, 1, 0, &g[2], NULL)); /* another level has room */
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    ASSERT_EQ(s.rejected_queue_full, 1);
    ASSERT_EQ(s.queued, 3);
    fake_release(&f);
    wait_done(4);
    ASSERT_OK(submit_x(b, 5, 1, 4, 2, 0, &g[3], NULL)); /* room again */
    wait_done(5);
    finish(b);
}

TEST(batcher_timeout_reject_fires_while_the_instance_is_busy)
{
    fake_t f;
    sp_batcher_params_t p = params(4, 0);
    p.default_queue_policy.default_timeout_us = 20000;
    p.default_queue_policy.timeout_action = SP_BATCHER_TIMEOUT_REJECT;
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[2] = {0};
    block(b, &f, &blocker);
    ASSERT_OK(submit_x(b, 1, 1, 4, 0, 0, &g[0], NULL));
    ASSERT_OK(submit_x(b, 2, 1, 4, 0, 500000, &g[1], NULL)); /* override not allowed: 20 ms */
    wait_done(2); /* with the instance still held */
    ASSERT_EQ(blocker.calls, 0);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(g[i].calls, 1);
        ASSERT_EQ(g[i].status, SP_ERR_BUSY);
        ASSERT_EQ(g[i].reason, SP_BATCH_REASON_TIMEOUT);
        ASSERT(strstr(g[i].msg, "timed out") != NULL);
        int64_t ms = (g[i].done_ns - g[i].submit_ns) / 1000000;
        ASSERT(ms >= 19 && ms < 220);
    }
    fake_release(&f);
    wait_done(3);
    ASSERT_EQ(blocker.status, SP_OK);
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    ASSERT_EQ(s.timed_out, 2);
    ASSERT_EQ(fake_ncalls(&f), 1);
    finish(b);
}

TEST(batcher_timeout_override_only_shortens)
{
    fake_t f;
    sp_batcher_params_t p = params(4, 0);
    p.default_queue_policy.default_timeout_us = 10000000; /* 10 s */
    p.default_queue_policy.allow_timeout_override = true;
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[2] = {0};
    block(b, &f, &blocker);
    ASSERT_OK(submit_x(b, 1, 1, 4, 0, 20000, &g[0], NULL));    /* 20 ms: applies */
    ASSERT_OK(submit_x(b, 2, 1, 4, 0, 60000000, &g[1], NULL)); /* 60 s: capped at 10 s */
    wait_done(1);
    ASSERT_EQ(g[0].status, SP_ERR_BUSY);
    ASSERT_EQ(g[1].calls, 0);
    fake_release(&f);
    wait_done(3);
    ASSERT_EQ(g[1].status, SP_OK);
    finish(b);
}

TEST(batcher_timeout_delay_runs_behind)
{
    fake_t f;
    sp_batcher_params_t p = params(1, 0);
    p.priority_levels = 2;
    p.default_priority_level = 1;
    p.default_queue_policy.timeout_action = SP_BATCHER_TIMEOUT_DELAY;
    p.default_queue_policy.allow_timeout_override = true;
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[3] = {0};
    block(b, &f, &blocker);
    ASSERT_OK(submit_x(b, 1, 1, 4, 1, 10000, &g[0], NULL)); /* expires in 10 ms */
    ASSERT_OK(submit_x(b, 2, 1, 4, 1, 0, &g[1], NULL));     /* no timeout */
    ASSERT_OK(submit_x(b, 3, 1, 4, 2, 0, &g[2], NULL));     /* level 2 */
    sleep_us(40000);
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    ASSERT_EQ(s.delayed, 1);
    ASSERT_EQ(s.timed_out, 0);
    ASSERT_EQ(done_count(), 0);
    fake_release(&f);
    wait_done(4);
    /* 2 (unexpired, level 1), then 1 (expired, still level 1), then 3 (level 2). */
    int want[] = {99, 2, 1, 3};
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ((int)f.first[i] / 10, want[i]);
    }
    for (int i = 0; i < 3; i++) {
        check_sums(&g[i], i + 1, 1, 4);
    }
    finish(b);
}

TEST(batcher_different_variable_shapes_are_not_merged)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 0);
    sp_batcher_t *b = make_one(&p, &f, -1);
    got_t blocker = {0}, g[4] = {0};
    block(b, &f, &blocker);
    ASSERT_OK(submit_x(b, 1, 1, 2, 0, 0, &g[0], NULL));
    ASSERT_OK(submit_x(b, 2, 2, 3, 0, 0, &g[1], NULL));
    ASSERT_OK(submit_x(b, 3, 1, 2, 0, 0, &g[2], NULL));
    ASSERT_OK(submit_x(b, 4, 1, 3, 0, 0, &g[3], NULL));
    fake_release(&f);
    wait_done(5);
    ASSERT_EQ(fake_ncalls(&f), 3);
    ASSERT_EQ(f.rows[1], 2);
    ASSERT_EQ(f.width[1], 2); /* 1 and 3, passing over 2 */
    ASSERT_EQ(f.rows[2], 3);
    ASSERT_EQ(f.width[2], 3); /* 2 and 4 */
    check_sums(&g[0], 1, 1, 2);
    check_sums(&g[1], 2, 2, 3);
    check_sums(&g[2], 3, 1, 2);
    check_sums(&g[3], 4, 1, 3);
    finish(b);
}

static sp_status_t
submit_t(sp_batcher_t *b, sp_backend_tensor_t *t, int n, char *err)
{
    sp_batch_item_t it = {.inputs = t, .n_inputs = n, .done = on_done, .ud = NULL};
    return sp_batcher_submit(b, &it, err, 256);
}

TEST(batcher_validation_is_per_request)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 0);
    sp_batcher_t *b = make_one(&p, &f, 4);
    char err[256];
    float x[64] = {0};
    sp_backend_tensor_t ok = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2, .dims = {2, 4},
                              .data = x, .bytes = 32};
    sp_backend_tensor_t t;

    t = ok, t.dtype = SP_BT_FP64, t.bytes = 64;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "FP64") && strstr(err, "FP32"));
    t = ok, t.dims[1] = 5, t.bytes = 40;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "[2,5]") && strstr(err, "[-1,4]"));
    t = ok, t.n_dims = 1, t.dims[0] = 4, t.bytes = 16;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "shape") != NULL);
    t = ok, t.dims[0] = 0, t.bytes = 0;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "0 rows") != NULL);
    t = ok, t.dims[0] = 9, t.bytes = 9 * 16;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    t = ok, t.bytes = 31;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "31 bytes") != NULL);
    t = ok, t.data = NULL;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    t = ok, t.dims[0] = 4, t.dims[1] = INT64_MAX / 2, t.bytes = 32;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID); /* shape mismatch first */
    t = ok, t.name = "y";
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "unknown input 'y'") != NULL);
    ASSERT_EQ(submit_t(b, &t, 0, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "missing input 'x'") != NULL);
    sp_backend_tensor_t two[2] = {ok, ok};
    ASSERT_EQ(submit_t(b, two, 2, err), SP_ERR_INVALID);
    ASSERT(strstr(err, "twice") != NULL);
    t = ok, t.n_dims = 99;
    ASSERT_EQ(submit_t(b, &t, 1, err), SP_ERR_INVALID);
    const char *bad_out[] = {"nope"};
    sp_batch_item_t it = {.inputs = &ok, .n_inputs = 1, .outputs = bad_out, .n_outputs = 1,
                          .done = on_done};
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "no output 'nope'") != NULL);
    const char *dup_out[] = {"sum", "sum"};
    it.outputs = dup_out, it.n_outputs = 2;
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    it.outputs = NULL, it.n_outputs = 0, it.done = NULL;
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_batcher_submit(b, NULL, err, sizeof err), SP_ERR_INVALID);

    /* A good request is unaffected by all of that. */
    got_t g = {0};
    ASSERT_OK(submit_x(b, 1, 2, 4, 0, 0, &g, NULL));
    wait_done(1);
    check_sums(&g, 1, 2, 4);
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    ASSERT_EQ(s.rejected_invalid, 16);
    ASSERT_EQ(s.requests, 1);
    finish(b);
}

TEST(batcher_validation_two_inputs_and_bytes)
{
    fake_t f;
    fake_init(&f);
    inst_t in[1];
    sp_backend_model_info_t m = info_x(2);
    m.n_inputs = 2;
    snprintf(m.inputs[1].name, sizeof m.inputs[1].name, "s");
    m.inputs[1].dtype = SP_BT_BYTES;
    m.inputs[1].n_dims = 1;
    m.inputs[1].dims[0] = 1;
    sp_batcher_params_t p = params(8, 0);
    sp_batcher_t *b = make(&p, &f, in, 1, &m);
    char err[256];
    float x[4] = {1, 2, 3, 4};
    uint8_t s[16];
    put_u32(s, 2), memcpy(s + 4, "ab", 2);
    put_u32(s + 6, 1), memcpy(s + 10, "c", 1);
    sp_backend_tensor_t t[2] = {
        {.name = "s", .dtype = SP_BT_BYTES, .n_dims = 2, .dims = {2, 1}, .data = s, .bytes = 11},
        {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2, .dims = {2, 2}, .data = x, .bytes = 16},
    };
    got_t g = {0};
    sp_batch_item_t it = {.inputs = t, .n_inputs = 2, .done = on_done, .ud = &g};
    ASSERT_OK(sp_batcher_submit(b, &it, err, sizeof err)); /* any order, matched by name */
    wait_done(1);
    ASSERT_EQ(g.status, SP_OK);
    ASSERT_NEAR(g.sums[0], 3, 0);
    ASSERT_NEAR(g.sums[1], 7, 0);
    t[1].dims[0] = 1, t[1].bytes = 8;
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "rows, but") != NULL);
    t[1].dims[0] = 2, t[1].bytes = 16;
    t[0].bytes = 12; /* one byte left over */
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "after the shape") != NULL);
    t[0].bytes = 10; /* the last element runs past the end */
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "BYTES") != NULL);
    put_u32(s + 6, 0xffffffffu), t[0].bytes = 11; /* a length prefix far past the end */
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    finish(b);
}

TEST(batcher_execute_failure_fails_only_that_batch)
{
    fake_t f;
    sp_batcher_params_t p = params(3, 0);
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0};
    float x[4] = {1, 666, 1, 1};
    sp_backend_tensor_t t = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2, .dims = {1, 4},
                             .data = x, .bytes = sizeof x};
    got_t h[3] = {0};
    block(b, &f, &blocker);
    ASSERT_OK(submit_x(b, 5, 1, 4, 0, 0, &h[0], NULL));
    sp_batch_item_t it = {.inputs = &t, .n_inputs = 1, .done = on_done, .ud = &h[1]};
    ASSERT_OK(sp_batcher_submit(b, &it, NULL, 0));
    ASSERT_OK(submit_x(b, 7, 1, 4, 0, 0, &h[2], NULL));
    got_t after = {0};
    ASSERT_OK(submit_x(b, 8, 2, 4, 0, 0, &after, NULL)); /* 2 rows: does not fit, next batch */
    fake_release(&f);
    wait_done(5);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(h[i].calls, 1);
        ASSERT_EQ(h[i].status, SP_ERR_IO);
        ASSERT_EQ(h[i].reason, SP_BATCH_REASON_EXECUTE);
        ASSERT(strstr(h[i].msg, "poisoned row 1") != NULL);
        ASSERT_EQ(h[i].n_out, 0);
    }
    check_sums(&after, 8, 2, 4);
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    ASSERT_EQ(s.failed_execute, 3);
    finish(b);
}

TEST(batcher_bad_backend_outputs_are_an_error)
{
    fake_t f;
    sp_batcher_params_t p = params(4, 0);
    sp_batcher_t *b = make_one(&p, &f, 4);
    f.bad_rows = true; /* read at the first execute */
    got_t g = {0};
    ASSERT_OK(submit_x(b, 1, 2, 4, 0, 0, &g, NULL));
    wait_done(1);
    ASSERT_EQ(g.status, SP_ERR_IO);
    ASSERT(strstr(g.msg, "3 rows for a batch of 2") != NULL);
    finish(b); /* and the backend's buffers were freed */
}

static sp_status_t
submit_s(sp_batcher_t *b, const char *const *strs, int n, got_t *g)
{
    uint8_t buf[256];
    size_t pos = 0;
    for (int i = 0; i < n; i++) {
        uint32_t l = (uint32_t)strlen(strs[i]);
        put_u32(buf + pos, l);
        memcpy(buf + pos + 4, strs[i], l);
        pos += 4 + l;
    }
    sp_backend_tensor_t t = {.name = "s", .dtype = SP_BT_BYTES, .n_dims = 2, .dims = {n, 1},
                             .data = buf, .bytes = pos};
    sp_batch_item_t it = {.inputs = &t, .n_inputs = 1, .done = on_done, .ud = g};
    return sp_batcher_submit(b, &it, NULL, 0);
}

TEST(batcher_bytes_inputs_and_outputs_split)
{
    fake_t f;
    fake_init(&f);
    inst_t in[1];
    sp_backend_model_info_t m = info_s();
    sp_batcher_params_t p = params(8, 0);
    sp_batcher_t *b = make(&p, &f, in, 1, &m);
    got_t blocker = {0}, g[3] = {0};
    fake_hold(&f);
    const char *s0[] = {"z"};
    ASSERT_OK(submit_s(b, s0, 1, &blocker));
    fake_wait_held(&f);
    const char *s1[] = {"hello"};
    const char *s2[] = {"", "ab c"};
    const char *s3[] = {"xyz!"};
    ASSERT_OK(submit_s(b, s1, 1, &g[0]));
    ASSERT_OK(submit_s(b, s2, 2, &g[1]));
    ASSERT_OK(submit_s(b, s3, 1, &g[2]));
    fake_release(&f);
    wait_done(4);
    ASSERT_EQ(fake_ncalls(&f), 2);
    ASSERT_EQ(f.rows[1], 4);
    ASSERT_EQ(g[0].status, SP_OK);
    ASSERT_EQ(g[0].ns[0], 5);
    ASSERT_STR_EQ(g[0].strs[0], "HELLO");
    ASSERT_EQ(g[1].dims0[1], 2);
    ASSERT_EQ(g[1].ns[0], 0);
    ASSERT_EQ(g[1].ns[1], 4);
    ASSERT_STR_EQ(g[1].strs[0], "");
    ASSERT_STR_EQ(g[1].strs[1], "AB C");
    ASSERT_STR_EQ(g[2].strs[0], "XYZ!");
    finish(b);
}

typedef struct stopper {
    fake_t *f;
    int64_t after_us;
} stopper_t;

static void *
release_later(void *arg)
{
    stopper_t *s = arg;
    sleep_us(s->after_us);
    fake_release(s->f);
    return NULL;
}

static void
stop_with_queue(bool drain, bool destroy)
{
    fake_t f;
    fake_init(&f);
    inst_t in[2];
    sp_backend_model_info_t m = info_x(4);
    sp_batcher_params_t p = params(2, 1000000); /* 1 s delay: draining must not wait for it */
    sp_batcher_t *b = make(&p, &f, in, 1, &m);
    got_t blocker = {0}, g[5] = {0};
    fake_hold(&f);
    ASSERT_OK(submit_x(b, 99, 2, 4, 0, 0, &blocker, NULL)); /* full: runs at once */
    fake_wait_held(&f);
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(submit_x(b, i + 1, 1, 4, 0, 0, &g[i], NULL));
    }
    pthread_t th;
    stopper_t st = {&f, 30000};
    pthread_create(&th, NULL, release_later, &st);
    int64_t t0 = now_ns();
    if (destroy) {
        sp_batcher_destroy(b);
    } else {
        sp_batcher_stop(b, drain);
    }
    ASSERT((now_ns() - t0) < 600 * 1000000LL);
    pthread_join(th, NULL);
    ASSERT_EQ(done_count(), 6); /* all called by the time stop returns */
    ASSERT_EQ(blocker.status, SP_OK);
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(g[i].calls, 1);
        if (drain) {
            check_sums(&g[i], i + 1, 1, 4);
        } else {
            ASSERT_EQ(g[i].status, SP_ERR_CANCELLED);
            ASSERT_EQ(g[i].reason, SP_BATCH_REASON_STOPPED);
        }
    }
    if (!destroy) {
        char err[256];
        ASSERT_EQ(submit_x(b, 7, 1, 4, 0, 0, NULL, err), SP_ERR_CANCELLED);
        sp_batcher_stats_t s;
        sp_batcher_get_stats(b, &s);
        ASSERT_EQ(s.cancelled, drain ? 0 : 5);
        ASSERT_EQ(s.rejected_stopping, 1);
        sp_batcher_stop(b, true); /* idempotent */
        finish(b);
    }
    sleep_us(1000);
    ASSERT_EQ(done_count(), 6); /* exactly once */
    ASSERT_EQ(atomic_load(&live_blocks), 0);
}

TEST(batcher_stop_fails_queued_requests_once)
{
    stop_with_queue(false, false);
}

TEST(batcher_stop_drain_runs_queued_requests)
{
    stop_with_queue(true, false);
}

TEST(batcher_destroy_with_queued_requests)
{
    stop_with_queue(false, true);
}

TEST(batcher_instances_run_in_parallel)
{
    fake_t f;
    fake_init(&f);
    f.call_us = 60000;
    inst_t in[4];
    sp_backend_model_info_t m = info_x(4);
    sp_batcher_params_t p = params(1, 0);
    sp_batcher_t *b = make(&p, &f, in, 4, &m);
    got_t g[8] = {0};
    int64_t t0 = now_ns();
    for (int i = 0; i < 8; i++) {
        ASSERT_OK(submit_x(b, i + 1, 1, 4, 0, 0, &g[i], NULL));
    }
    wait_done(8);
    int64_t ms = (now_ns() - t0) / 1000000;
    ASSERT(ms < 400); /* 8 calls of 60 ms on 4 instances: about 120 ms, 480 in series */
    ASSERT(f.max_running >= 3);
    ASSERT(!f.overlap);
    for (int i = 0; i < 8; i++) {
        check_sums(&g[i], i + 1, 1, 4);
    }
    bool seen[4] = {0};
    for (int i = 0; i < 8; i++) {
        seen[f.inst[i]] = true;
    }
    ASSERT(seen[0] + seen[1] + seen[2] + seen[3] >= 3);
    finish(b);
}

TEST(batcher_disabled_runs_every_request_alone_at_once)
{
    fake_t f;
    sp_batcher_params_t p = params(8, 500000);
    p.enabled = false;
    sp_batcher_t *b = make_one(&p, &f, 4);
    got_t blocker = {0}, g[4] = {0};
    block(b, &f, &blocker);
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(submit_x(b, i + 1, 2, 4, 0, 0, &g[i], NULL));
    }
    fake_release(&f);
    wait_done(5);
    ASSERT_EQ(fake_ncalls(&f), 5);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(f.rows[i + 1], 2);
        check_sums(&g[i], i + 1, 2, 4);
        ASSERT((g[i].done_ns - g[i].submit_ns) < 400 * 1000000LL); /* no 500 ms delay */
    }
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    ASSERT_EQ(s.max_batch, 1);
    ASSERT_EQ(s.delay_us, 0);
    finish(b);
}

TEST(batcher_max_batch_size_zero_has_no_batch_dimension)
{
    fake_t f;
    sp_batcher_params_t p = params(0, 100000);
    sp_batcher_t *b = make_one(&p, &f, 4);
    f.nobatch = true; /* read at the first execute */
    char err[256];
    float x[4] = {1, 2, 3, 4};
    sp_backend_tensor_t t = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 1, .dims = {4},
                             .data = x, .bytes = sizeof x};
    got_t g[2] = {0};
    sp_batch_item_t it = {.inputs = &t, .n_inputs = 1, .done = on_done, .ud = &g[0]};
    g[0].submit_ns = now_ns();
    ASSERT_OK(sp_batcher_submit(b, &it, err, sizeof err));
    it.ud = &g[1];
    g[1].submit_ns = now_ns();
    ASSERT_OK(sp_batcher_submit(b, &it, err, sizeof err));
    wait_done(2);
    ASSERT_EQ(fake_ncalls(&f), 2);
    ASSERT_EQ(g[0].status, SP_OK);
    ASSERT_NEAR(g[0].sums[0], 10, 0);
    ASSERT_EQ(g[0].dims0[0], 1); /* the whole output */
    ASSERT((g[1].done_ns - g[1].submit_ns) < 90 * 1000000LL);
    sp_backend_tensor_t t2 = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2, .dims = {1, 4},
                              .data = x, .bytes = sizeof x};
    it.inputs = &t2;
    ASSERT_EQ(sp_batcher_submit(b, &it, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "[1,4]") && strstr(err, "[4]"));
    finish(b);
}

TEST(batcher_create_rejects_bad_params)
{
    fake_t f;
    fake_init(&f);
    inst_t I = {.f = &f};
    void *ptr = &I;
    sp_backend_model_info_t m = info_x(4);
    sp_batcher_t *b = (sp_batcher_t *)&I;
    char err[256];
    sp_batcher_params_t p = params(4, 0);
    p.preferred_batch_size[0] = 5, p.n_preferred = 1;
    ASSERT_EQ(sp_batcher_create(&p, &fake_api, &ptr, 1, &m, &host, &b, err, sizeof err),
              SP_ERR_INVALID);
    ASSERT(b == NULL);
    ASSERT(strstr(err, "preferred_batch_size[0]") != NULL);
    p = params(4, 0), p.priority_levels = 2, p.default_priority_level = 3;
    ASSERT_EQ(sp_batcher_create(&p, &fake_api, &ptr, 1, &m, &host, &b, err, sizeof err),
              SP_ERR_INVALID);
    p = params(4, 0), p.adaptive = true;
    ASSERT_EQ(sp_batcher_create(&p, &fake_api, &ptr, 1, &m, &host, &b, err, sizeof err),
              SP_ERR_INVALID);
    ASSERT(strstr(err, "target") != NULL);
    p = params(4, 0), p.has_level_policy[3] = true;
    p.priority_levels = 2, p.default_priority_level = 1;
    ASSERT_EQ(sp_batcher_create(&p, &fake_api, &ptr, 1, &m, &host, &b, err, sizeof err),
              SP_ERR_INVALID);
    p = params(-1, 0);
    ASSERT_EQ(sp_batcher_create(&p, &fake_api, &ptr, 1, &m, &host, &b, err, sizeof err),
              SP_ERR_INVALID);
    p = params(4, 0);
    ASSERT_EQ(sp_batcher_create(&p, &fake_api, &ptr, 0, &m, &host, &b, err, sizeof err),
              SP_ERR_INVALID);
    sp_batcher_destroy(NULL);
}

/* ---- adaptive mode */

#define MS 1000000LL

TEST(batcher_ctl_cuts_delay_first_then_grows_it_back)
{
    sp_batcher_ctl_t c;
    sp_batcher_ctl_init(&c, 10.0, 20000, 64);
    ASSERT_EQ(c.delay_ns, 0);
    ASSERT_EQ(c.cap, 64);
    /* A simulated queue at 1000 rows/s: a batch waits D, gathers 1 + D/1 ms rows and costs
     * 1 ms + 0.05 ms per row; its requests see D + cost. */
    int64_t t = 0;
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < 3000; i++) {
        int64_t rows = 1 + c.delay_ns / MS;
        if (rows > c.cap) {
            rows = c.cap;
        }
        int64_t cost = MS + rows * MS / 20;
        t += c.delay_ns + cost;
        for (int64_t r = 0; r < rows; r++) {
            sp_batcher_ctl_latency(&c, c.delay_ns + cost);
        }
        sp_batcher_ctl_batch(&c, rows, cost, rows >= c.cap ? SP_BATCH_WHY_FULL : SP_BATCH_WHY_DELAY,
                             false, t, 1, -1);
        ASSERT(c.delay_ns >= 0 && c.delay_ns <= 20 * MS);
        ASSERT(c.cap >= 1 && c.cap <= 64);
        if (i > 1500) {
            lo = c.delay_ns < lo ? c.delay_ns : lo;
            hi = c.delay_ns > hi ? c.delay_ns : hi;
        }
    }
    /* Settles batching (without a delay this queue keeps the instance 105% busy) but
     * waits no longer than keeps the instance from being mostly idle: an idle
     * instance gains nothing from waiting (utilisation guard), and within the target. */
    if (getenv("SP_TEST_VERBOSE")) {
        fprintf(stderr, "  delay settles in %.2f .. %.2f ms\n", (double)lo / MS, (double)hi / MS);
    }
    ASSERT(lo >= MS / 2);
    ASSERT(hi + MS + (1 + hi / MS) * MS / 20 <= 10 * MS);
    ASSERT(c.increases > 0);
    ASSERT_EQ(c.cap, 64); /* the cap never needed cutting */
}

TEST(batcher_ctl_cuts_the_cap_only_when_capacity_allows)
{
    /* No delay to cut; batches are full and cost 0.2 ms + 0.5 ms per row, so 64 rows take
     * 32 ms against a 10 ms target. At a low arrival rate the cap comes down until a batch fits. */
    sp_batcher_ctl_t c;
    sp_batcher_ctl_init(&c, 10.0, 0, 64);
    int64_t t = 0;
    for (int i = 0; i < 2000; i++) {
        int64_t rows = c.cap;
        int64_t cost = MS / 5 + rows * MS / 2;
        t += 200 * MS; /* a batch every 200 ms: far below capacity */
        for (int64_t r = 0; r < rows; r++) {
            sp_batcher_ctl_latency(&c, cost);
        }
        sp_batcher_ctl_batch(&c, rows, cost, SP_BATCH_WHY_FULL, false, t, 1, -1);
    }
    ASSERT(c.cap < 64);
    ASSERT(MS / 5 + c.cap * MS / 2 <= 10 * MS);
    ASSERT(c.cap >= 10); /* it grows back to what fits */
    /* Overloaded: arrivals at 3 rows/ms, more than the 2 rows/ms a full batch of 64 can serve.
     * Cutting the cap would only lose throughput: it stays, whether the batcher reports the
     * backlog or the fitted capacity has to tell. */
    for (int with_backlog = 0; with_backlog < 2; with_backlog++) {
        sp_batcher_ctl_init(&c, 10.0, 0, 64);
        t = 0;
        for (int i = 0; i < 500; i++) {
            int64_t rows = 60 + i % 5; /* a little spread, noisy cost: no usable slope */
            int64_t cost = MS / 5 + 64 * MS / 2 + (i % 3) * MS / 10;
            t += rows * MS / 3;
            for (int r = 0; r < rows; r++) {
                sp_batcher_ctl_latency(&c, 5 * cost);
            }
            sp_batcher_ctl_batch(&c, rows, cost, SP_BATCH_WHY_FULL, with_backlog, t, 1, -1);
        }
        ASSERT_EQ(c.cap, 64);
        ASSERT_EQ(c.decreases, 0);
    }
    /* A cap cut earlier grows back under backlog, whatever the p99. */
    sp_batcher_ctl_init(&c, 10.0, 0, 64);
    c.cap = 8;
    t = 0;
    for (int i = 0; i < 200; i++) {
        t += 10 * MS;
        for (int r = 0; r < c.cap; r++) {
            sp_batcher_ctl_latency(&c, 50 * MS);
        }
        sp_batcher_ctl_batch(&c, c.cap, 10 * MS, SP_BATCH_WHY_FULL, true, t, 1, -1);
    }
    ASSERT_EQ(c.cap, 64);
}

/* A simulated server on one CPU whose cost is mostly outside execute(): 40 us of
 * front end per request, 30 us of hand-offs and 20 us of execute() per batch plus
 * 1 us per row. Rows per batch: 1 + arrivals within the delay. Latency: the delay,
 * the batch, and the front end slowed by queueing (M/M/1-like, 10 ms once the CPU
 * is over 100%). Returns the CPU load it ran at in the last batch. */
static double
ctl_sim_server(sp_batcher_ctl_t *c, double per_ms, int batches, int64_t *t, int64_t *cpu)
{
    const double front = 40e3, handoff = 30e3, fixed = 20e3, per_row = 1e3; /* ns */
    double rho = 0;
    for (int i = 0; i < batches; i++) {
        double rows = 1 + per_ms * (double)c->delay_ns / MS;
        if (rows > c->cap) {
            rows = c->cap;
        }
        int64_t r = (int64_t)rows;
        double gap = rows / per_ms * MS; /* wall time this batch's arrivals span */
        double busy = rows * (front + per_row) + handoff + fixed;
        rho = busy / gap;
        double lat = rho >= 1 ? 10.0 * MS : (double)c->delay_ns + fixed + r * per_row + front / (1 - rho);
        *t += (int64_t)gap;
        *cpu += (int64_t)(rho >= 1 ? gap : busy);
        for (int64_t k = 0; k < r; k++) {
            sp_batcher_ctl_latency(c, (int64_t)lat);
        }
        sp_batcher_ctl_batch(c, r, (int64_t)(fixed + r * per_row), SP_BATCH_WHY_DELAY, false, *t, 1,
                             sp_batcher_ctl_due(c, *t) ? *cpu : -1);
    }
    return rho;
}

TEST(batcher_ctl_batches_when_the_server_saturates)
{
    /* 18 requests/ms: one at a time the server needs 164% of its CPU (front end plus
     * hand-offs per request), so its p99 is far over the 2 ms target while execute()
     * is only 38% busy: the instance looks idle, the server is not. The delay must grow
     * until batches amortise the hand-offs (about 3.4 rows), and the p99 come under the
     * target. */
    sp_batcher_ctl_t c;
    sp_batcher_ctl_init(&c, 2.0, 2000, 64);
    c.cpus = 1;
    int64_t t = 0, cpu = 0;
    double rho = ctl_sim_server(&c, 18.0, 4000, &t, &cpu);
    if (getenv("SP_TEST_VERBOSE")) {
        fprintf(stderr, "  saturated: delay %.3f ms, load %.2f, p99 %.3f ms\n",
                (double)c.delay_ns / MS, rho, (double)c.p99_ns / MS);
    }
    ASSERT(c.delay_ns > 0);
    ASSERT(rho < 1.0);
    ASSERT(c.p99_ns <= 2 * MS);
    /* The same server at 2 requests/ms is 18% busy unbatched: the delay stays at 0
     * (waiting would buy nothing), or comes back down to 0 from where it was. */
    int64_t was = c.delay_ns;
    rho = ctl_sim_server(&c, 2.0, 4000, &t, &cpu);
    ASSERT(was > 0);
    ASSERT_EQ(c.delay_ns, 0);
    ASSERT(rho < 0.25);
    /* Half busy (5 and 7 requests/ms: 46% and 64% of the CPU one at a time), the
     * server keeps up without batching and its p99 is a fraction of the target:
     * the delay stays at 0, since waiting would spend the target's headroom for
     * throughput nobody needs. */
    for (int k = 0; k < 2; k++) {
        sp_batcher_ctl_init(&c, 2.0, 2000, 64);
        c.cpus = 1;
        t = cpu = 0;
        rho = ctl_sim_server(&c, k == 0 ? 5.0 : 7.0, 4000, &t, &cpu);
        ASSERT(rho > 0.4 && rho < 0.7);
        ASSERT_EQ(c.delay_ns, 0);
    }
    /* Without a CPU reading (cpus unknown) the controller cannot see the server, and
     * keeps to the instances' load: no delay at 18/ms. */
    sp_batcher_ctl_init(&c, 2.0, 2000, 64);
    t = cpu = 0;
    ctl_sim_server(&c, 18.0, 2000, &t, &cpu);
    ASSERT_EQ(c.delay_ns, 0);
}

/* Latencies of requests completing, per load run. */
typedef struct load {
    sp_batcher_t *b;
    got_t *g;
    int n;
} load_t;

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int64_t
p99_of(const got_t *g, int from, int to)
{
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(to - from));
    for (int i = from; i < to; i++) {
        v[i - from] = g[i].done_ns - g[i].submit_ns;
    }
    qsort(v, (size_t)(to - from), sizeof *v, cmp_i64);
    int64_t p = v[(size_t)((to - from) * 99 / 100)];
    free(v);
    return p;
}

TEST(batcher_adaptive_meets_a_p99_target_a_fixed_delay_misses)
{
    /* Backend cost 1.7 ms + 20 us per row, 500 requests/s for 1.5 s, target p99 20 ms: one
     * request at a time the instance is 86% busy, so batching pays. A fixed 60 ms delay never
     * fills a 32-row batch at this rate, so every request waits the whole delay; the adaptive
     * batcher, with the same settings as its bounds, waits only as long as the target allows,
     * and batches. A third, unbatched batcher with a cheap backend (0.1 ms) on the same load
     * measures the machine's own latency noise: on a quiet machine (its p99 well under a
     * millisecond, 0.3 ms typically) the claim is checked as is; on a loaded one (the suite's
     * other tests beside it, a scheduler that delays threads by milliseconds) the adaptive
     * p99 must stay within the target plus that noise. A few ms of noise already decides
     * whether batching pays at 86% load, so only a quiet machine judges the batching itself. */
    fake_t ff, fa, fn;
    fake_init(&ff);
    fake_init(&fa);
    fake_init(&fn);
    ff.call_us = fa.call_us = 1700;
    fn.call_us = 100;
    ff.row_us = fa.row_us = fn.row_us = 20;
    inst_t inf[1], ina[1], inn[1];
    sp_backend_model_info_t m = info_x(4);
    sp_batcher_params_t p = params(32, 60000);
    sp_batcher_t *fixed = make(&p, &ff, inf, 1, &m);
    p.enabled = false;
    sp_batcher_t *plain = make(&p, &fn, inn, 1, &m);
    p.enabled = true;
    p.adaptive = true;
    p.target_p99_ms = 20;
    sp_batcher_t *adapt = make(&p, &fa, ina, 1, &m);

    enum { N = 750 };
    got_t *gf = calloc(N, sizeof *gf), *ga = calloc(N, sizeof *ga), *gn = calloc(N, sizeof *gn);
    int64_t t0 = now_ns();
    for (int i = 0; i < N; i++) {
        int64_t due = t0 + (int64_t)i * 2 * MS;
        struct timespec ts = {(time_t)(due / 1000000000), (long)(due % 1000000000)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        ASSERT_OK(submit_x(fixed, i % 100, 1, 4, 0, 0, &gf[i], NULL));
        ASSERT_OK(submit_x(adapt, i % 100, 1, 4, 0, 0, &ga[i], NULL));
        ASSERT_OK(submit_x(plain, i % 100, 1, 4, 0, 0, &gn[i], NULL));
    }
    wait_done(3 * N);
    /* The adaptive and baseline p99 after 0.5 s of tuning. */
    int64_t pf = p99_of(gf, 0, N), pa = p99_of(ga, N / 3, N), pn = p99_of(gn, N / 3, N);
    sp_batcher_stats_t sf, sa;
    sp_batcher_get_stats(fixed, &sf);
    sp_batcher_get_stats(adapt, &sa);
    bool quiet = pn < 1 * MS;
    fprintf(stderr, "  fixed: p99 %.2f ms, %.2f rows/batch; adaptive: p99 %.2f ms, "
            "%.2f rows/batch, delay now %llu us, cap %d (+%llu -%llu); unbatched: p99 %.2f ms%s\n",
            (double)pf / MS, (double)sf.rows / (double)sf.batches, (double)pa / MS,
            (double)sa.rows / (double)sa.batches, (unsigned long long)sa.delay_us, sa.max_batch,
            (unsigned long long)sa.adapt_increases, (unsigned long long)sa.adapt_decreases,
            (double)pn / MS, quiet ? "" : " (a noisy machine: checked against target + noise)");
    ASSERT(pf > 40 * MS); /* the fixed delay misses the target by far */
    if (quiet) {
        ASSERT(pa <= 20 * MS); /* the adaptive one meets it ... */
        ASSERT(sa.delay_us > 0 && sa.delay_us < 20000);
        ASSERT((double)sa.rows / (double)sa.batches > 1.5); /* ... and batches */
    } else {
        ASSERT(pa <= 20 * MS + pn);
        ASSERT(pa < pf);
    }
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(ga[i].status, SP_OK);
        ASSERT_EQ(gf[i].status, SP_OK);
    }
    sp_batcher_destroy(fixed);
    sp_batcher_destroy(plain);
    finish(adapt);
    free(gf);
    free(ga);
    free(gn);
}
