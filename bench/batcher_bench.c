/*
 * batcher_bench.c - throughput and p99 latency of the dynamic batcher
 * (src/sched/batcher.h) in front of a fake backend whose execute costs
 * a + b * rows, batched against unbatched and fixed against adaptive.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc -D_GNU_SOURCE -pthread bench/batcher_bench.c build/libsampan.a \
 *      -lm -o build/batcher_bench
 *   ./build/batcher_bench [seconds per run (1)] [a_us (200)] [b_us (2)] [instances (1)]
 *
 * The backend sleeps instead of computing: it stands for a library or device
 * call with a fixed per-call cost (XGBoost's predict setup, a kernel launch)
 * and a per-row cost, and leaves the CPUs to the batcher and the load
 * generator, so the numbers show the batcher's effect, not contention on a
 * small machine. Two kinds of runs, each `seconds` long:
 *   - saturation: a closed loop keeps 512 requests outstanding; prints
 *     requests/s, p99 and rows per batch for unbatched, fixed delay 0
 *     (Triton's default: batches form only while the instance is busy),
 *     fixed 2 ms, fixed 20 ms, and adaptive with a 5 ms p99 target (its
 *     delay bounded by 20 ms);
 *   - open loop at 1,000, 5,000 and 20,000 requests/s (sent in 1 ms ticks):
 *     p99 and rows per batch for unbatched, fixed 2 ms, fixed 20 ms and
 *     adaptive.
 * Every request is one row of 30 FP32 features (the credit-card model's
 * shape). Not a test: nothing here asserts.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/batcher.h"

#define FEATURES 30
#define OUTSTANDING 512

static int64_t cost_a_ns = 200000, cost_b_ns = 2000;

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void
sleep_until(int64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000), (long)(t % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static void *
host_alloc(size_t n)
{
    return malloc(n ? n : 1);
}

static const sp_backend_host_t host = {SP_BACKEND_ABI_VERSION, host_alloc, free, NULL};

/* One probability per row: the mean of its features. */
static int
fake_execute(void *model, const sp_backend_tensor_t *in, int32_t n_in, sp_backend_tensor_t *out,
             int32_t n_out, char *err, size_t err_len)
{
    (void)model, (void)n_in, (void)err, (void)err_len;
    int64_t rows = in[0].dims[0];
    sleep_until(now_ns() + cost_a_ns + cost_b_ns * rows);
    for (int32_t j = 0; j < n_out; j++) {
        out[j].dtype = SP_BT_FP32;
        out[j].n_dims = 2;
        out[j].dims[0] = rows;
        out[j].dims[1] = 1;
        out[j].bytes = (size_t)rows * sizeof(float);
        out[j].data = malloc(out[j].bytes);
        const float *x = in[0].data;
        for (int64_t r = 0; r < rows; r++) {
            float s = 0;
            for (int k = 0; k < FEATURES; k++) {
                s += x[r * FEATURES + k];
            }
            ((float *)out[j].data)[r] = s / FEATURES;
        }
    }
    return 0;
}

static const sp_backend_api_t api = {SP_BACKEND_ABI_VERSION, "fake", NULL, fake_execute, NULL};

/* ---- completions */

typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t outstanding, completed, failed;
    int64_t *lat; /* ns, one per completed request (up to cap) */
    int64_t n_lat, cap;
} run_t;

typedef struct req {
    run_t *run;
    int64_t t0;
} req_t;

static void
on_done(void *ud, const sp_batch_result_t *res)
{
    req_t *q = ud;
    run_t *r = q->run;
    int64_t lat = now_ns() - q->t0;
    pthread_mutex_lock(&r->mu);
    if (res->status == SP_OK) {
        r->completed++;
        if (r->n_lat < r->cap) {
            r->lat[r->n_lat++] = lat;
        }
    } else {
        r->failed++;
    }
    r->outstanding--;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    free(q);
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void
submit_one(sp_batcher_t *b, run_t *r, const float *x)
{
    sp_backend_tensor_t t = {.name = "x", .dtype = SP_BT_FP32, .n_dims = 2,
                             .dims = {1, FEATURES}, .data = (void *)x,
                             .bytes = FEATURES * sizeof(float)};
    req_t *q = malloc(sizeof *q);
    q->run = r;
    q->t0 = now_ns();
    sp_batch_item_t it = {.inputs = &t, .n_inputs = 1, .done = on_done, .ud = q};
    pthread_mutex_lock(&r->mu);
    r->outstanding++;
    pthread_mutex_unlock(&r->mu);
    char err[256];
    if (sp_batcher_submit(b, &it, err, sizeof err) != SP_OK) {
        pthread_mutex_lock(&r->mu);
        r->outstanding--;
        r->failed++;
        pthread_mutex_unlock(&r->mu);
        free(q);
    }
}

typedef struct mode {
    const char *name;
    bool enabled, adaptive;
    uint64_t delay_us;
    double target_ms;
} mode_t_;

/* rate 0: closed loop (saturation). */
static void
bench(const mode_t_ *m, double rate, double secs, int n_inst)
{
    sp_backend_model_info_t info;
    memset(&info, 0, sizeof info);
    info.n_inputs = 1;
    snprintf(info.inputs[0].name, sizeof info.inputs[0].name, "x");
    info.inputs[0].dtype = SP_BT_FP32;
    info.inputs[0].n_dims = 1;
    info.inputs[0].dims[0] = FEATURES;
    info.n_outputs = 1;
    snprintf(info.outputs[0].name, sizeof info.outputs[0].name, "p");
    info.outputs[0].dtype = SP_BT_FP32;
    info.outputs[0].n_dims = 1;
    info.outputs[0].dims[0] = 1;

    sp_batcher_params_t p = sp_batcher_default_params();
    p.enabled = m->enabled;
    p.max_batch_size = 64;
    p.max_queue_delay_us = m->delay_us;
    p.adaptive = m->adaptive;
    p.target_p99_ms = m->target_ms;
    void *inst[16] = {0};
    sp_batcher_t *b;
    char err[256];
    if (sp_batcher_create(&p, &api, inst, n_inst, &info, &host, &b, err, sizeof err) != SP_OK) {
        fprintf(stderr, "create: %s\n", err);
        exit(1);
    }
    run_t r;
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    r.cap = 4000000;
    r.lat = malloc(sizeof(int64_t) * (size_t)r.cap);
    float x[FEATURES];
    for (int k = 0; k < FEATURES; k++) {
        x[k] = (float)k / FEATURES;
    }

    int64_t t0 = now_ns(), end = t0 + (int64_t)(secs * 1e9);
    if (rate <= 0) {
        while (now_ns() < end) {
            pthread_mutex_lock(&r.mu);
            while (r.outstanding >= OUTSTANDING) {
                pthread_cond_wait(&r.cv, &r.mu);
            }
            pthread_mutex_unlock(&r.mu);
            submit_one(b, &r, x);
        }
    } else {
        double owed = 0;
        for (int64_t tick = t0; tick < end; tick += 1000000) {
            sleep_until(tick);
            owed += rate / 1000.0;
            for (; owed >= 1; owed -= 1) {
                submit_one(b, &r, x);
            }
        }
    }
    pthread_mutex_lock(&r.mu);
    while (r.outstanding > 0) {
        pthread_cond_wait(&r.cv, &r.mu);
    }
    pthread_mutex_unlock(&r.mu);
    double wall = (double)(now_ns() - t0) / 1e9;
    sp_batcher_stats_t s;
    sp_batcher_get_stats(b, &s);
    sp_batcher_destroy(b);

    qsort(r.lat, (size_t)r.n_lat, sizeof *r.lat, cmp_i64);
    double p50 = r.n_lat ? (double)r.lat[r.n_lat / 2] / 1e6 : 0;
    double p99 = r.n_lat ? (double)r.lat[r.n_lat * 99 / 100] / 1e6 : 0;
    char load[32];
    if (rate <= 0) {
        snprintf(load, sizeof load, "saturation");
    } else {
        snprintf(load, sizeof load, "%.0f/s", rate);
    }
    printf("| %-10s | %-22s | %9.0f | %7.2f | %7.2f | %6.2f | %8llu | %5d |\n", load, m->name,
           (double)r.completed / wall, p50, p99,
           s.batches ? (double)s.rows / (double)s.batches : 0,
           (unsigned long long)s.delay_us, s.max_batch);
    fflush(stdout);
    free(r.lat);
}

int
main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    cost_a_ns = (int64_t)((argc > 2 ? atof(argv[2]) : 200) * 1000);
    cost_b_ns = (int64_t)((argc > 3 ? atof(argv[3]) : 2) * 1000);
    int n_inst = argc > 4 ? atoi(argv[4]) : 1;
    if (n_inst < 1 || n_inst > 16) {
        n_inst = 1;
    }
    printf("backend cost %.0f us + %.1f us/row, %d instance(s), max_batch_size 64, %.1f s per "
           "run\n\n",
           (double)cost_a_ns / 1e3, (double)cost_b_ns / 1e3, n_inst, secs);
    printf("| load       | batcher                | req/s     | p50 ms  | p99 ms  | rows/b | "
           "delay us | cap   |\n");
    printf("|------------|------------------------|-----------|---------|---------|--------|"
           "----------|-------|\n");
    const mode_t_ sat[] = {
        {"unbatched", false, false, 0, 0},
        {"fixed, delay 0", true, false, 0, 0},
        {"fixed, delay 2 ms", true, false, 2000, 0},
        {"fixed, delay 20 ms", true, false, 20000, 0},
        {"adaptive, p99 5 ms", true, true, 20000, 5},
    };
    for (size_t i = 0; i < sizeof sat / sizeof sat[0]; i++) {
        bench(&sat[i], 0, secs, n_inst);
    }
    const double rates[] = {1000, 5000, 20000};
    const mode_t_ open[] = {
        {"unbatched", false, false, 0, 0},
        {"fixed, delay 2 ms", true, false, 2000, 0},
        {"fixed, delay 20 ms", true, false, 20000, 0},
        {"adaptive, p99 5 ms", true, true, 20000, 5},
    };
    for (size_t k = 0; k < sizeof rates / sizeof rates[0]; k++) {
        for (size_t i = 0; i < sizeof open / sizeof open[0]; i++) {
            bench(&open[i], rates[k], secs, n_inst);
        }
    }
    return 0;
}
