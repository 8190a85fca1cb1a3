/*
 * metrics.c - the served models' request counters (metrics.h; their
 * histograms are hist.c), the request clock that feeds them, the end of a
 * request's accounting, and the process's resident memory. Recording is
 * lock-free; GET /metrics renders them (api/prometheus.c).
 */
#include "serving/metrics.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/mask.h"
#include "serving/registry.h"

/* ------------------------------------------------------------- requests */

static const char *const fail_names[SP_FAIL_COUNT_] = {
    "invalid_request", "queue_full", "timeout", "cancelled", "overloaded", "internal",
};

const char *
sp_metrics_fail_reason_name(sp_fail_reason_t r)
{
    return r >= 0 && r < SP_FAIL_COUNT_ ? fail_names[r] : "internal";
}

sp_fail_reason_t
sp_metrics_fail_reason_of(sp_status_t st, const char *message)
{
    switch (st) {
    case SP_ERR_BUSY:
        return SP_FAIL_QUEUE_FULL;
    case SP_ERR_CANCELLED: /* the scheduler's message tells which kind (sched.c) */
        if (message && strstr(message, "deadline")) {
            return SP_FAIL_TIMEOUT;
        }
        return message && strstr(message, "fast enough") ? SP_FAIL_OVERLOADED : SP_FAIL_CANCELLED;
    case SP_ERR_INVALID:
    case SP_ERR_TOO_LARGE:
        return SP_FAIL_INVALID;
    default:
        return SP_FAIL_INTERNAL;
    }
}

void
sp_metrics_model_init(sp_model_metrics_t *mm)
{
    memset(mm, 0, sizeof *mm);
    sp_hist_init(&mm->queue, SP_HIST_LATENCY);
    sp_hist_init(&mm->compute, SP_HIST_LATENCY);
    sp_hist_init(&mm->e2e, SP_HIST_LATENCY);
    sp_hist_init(&mm->ttft, SP_HIST_TTFT);
    sp_hist_init(&mm->tpot, SP_HIST_TPOT);
    sp_hist_init(&mm->prefill, SP_HIST_LATENCY);
    sp_hist_init(&mm->decode, SP_HIST_LATENCY);
    sp_hist_init(&mm->prompt_tokens, SP_HIST_TOKENS);
    sp_hist_init(&mm->gen_tokens, SP_HIST_TOKENS);
}

void
sp_metrics_clock_start(sp_req_clock_t *c, int64_t t0_ns, bool keep_text)
{
    memset(c, 0, sizeof *c);
    c->t0_ns = t0_ns ? t0_ns : sp_time_ns();
    c->queue_ns = c->compute_ns = -1;
    c->keep_text = keep_text;
}

void
sp_metrics_clock_text(sp_req_clock_t *c, bool output, const char *s, size_t n)
{
    if (!c->keep_text) {
        return;
    }
    char *dst = output ? c->output : c->prompt;
    size_t *len = output ? &c->output_len : &c->prompt_len;
    size_t room = SP_REQ_TEXT_MAX - *len;
    if (n > room) {
        n = room;
    }
    memcpy(dst + *len, s, n);
    *len += n;
}

void
sp_metrics_clock_token(sp_req_clock_t *c)
{
    if (c->first_ns == 0) {
        c->first_ns = sp_time_ns();
    }
}

/* Triton's statistics of an answered request: it succeeded (a cache hit
 * too); the phases and the inference count only when the model ran it. */
static void
record_tstats(const sp_req_clock_t *c, sp_tstats_t *t, int64_t now)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_store_explicit(&t->last_inference_ms,
                          (uint64_t)ts.tv_sec * 1000u + (uint64_t)(ts.tv_nsec / 1000000),
                          memory_order_relaxed);
    sp_tstat_add(&t->success, now - c->t0_ns);
    if (c->queue_ns < 0) {
        return;
    }
    bool tensor = c->rows > 0;
    sp_tstat_add(&t->queue, tensor ? c->queue_ns - c->input_ns : c->queue_ns);
    sp_tstat_add(&t->compute_infer, c->compute_ns);
    if (tensor) { /* executions are counted per batch (tensor_infer.c) */
        sp_tstat_add(&t->compute_input, c->input_ns);
        sp_tstat_add(&t->compute_output, c->output_ns);
    } else {
        atomic_fetch_add_explicit(&t->execution_count, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&t->inference_count, (uint64_t)(tensor ? c->rows : 1),
                              memory_order_relaxed);
}

static void
record_times(sp_req_clock_t *c, sp_model_metrics_t *mm)
{
    int64_t now = sp_time_ns();
    double e2e = (double)(now - c->t0_ns) / 1e9;
    sp_hist_observe(&mm->e2e, e2e);
    record_tstats(c, &mm->tstats, now);
    if (c->queue_ns >= 0) {
        sp_hist_observe(&mm->queue, (double)c->queue_ns / 1e9);
        sp_hist_observe(&mm->compute, (double)c->compute_ns / 1e9);
    }
    if (c->rows == 0 && (c->prompt_tokens > 0 || c->completion_tokens > 0)) {
        sp_hist_observe(&mm->prompt_tokens, (double)c->prompt_tokens);
        sp_hist_observe(&mm->gen_tokens, (double)c->completion_tokens);
    }
    if (c->queue_ns >= 0 && c->compute_ns > 0 && c->first_ns) {
        /* The engine's compute time ends at its DONE, delivered now: the
         * first token splits it into prefill and decode (clamped against
         * skew between the two clocks' readings). */
        int64_t admitted = now - c->compute_ns;
        int64_t prefill = c->first_ns - admitted;
        prefill = prefill < 0 ? 0 : prefill > c->compute_ns ? c->compute_ns : prefill;
        sp_hist_observe(&mm->prefill, (double)prefill / 1e9);
        sp_hist_observe(&mm->decode, (double)(c->compute_ns - prefill) / 1e9);
    }
    if (c->first_ns) {
        sp_hist_observe(&mm->ttft, (double)(c->first_ns - c->t0_ns) / 1e9);
        if (c->completion_tokens > 1) {
            sp_hist_observe(&mm->tpot,
                            (double)(now - c->first_ns) / 1e9 / (double)(c->completion_tokens - 1));
        }
    }
}

void
sp_metrics_clock_success(sp_req_clock_t *c, sp_model_metrics_t *mm, sp_finish_t finish)
{
    if (c->ended || mm == NULL) {
        return;
    }
    c->ended = true;
    atomic_fetch_add_explicit(&mm->success[finish == SP_FINISH_LENGTH ? 1 : 0], 1,
                              memory_order_relaxed);
    record_times(c, mm);
}

void
sp_metrics_clock_failure(sp_req_clock_t *c, sp_model_metrics_t *mm, sp_fail_reason_t reason)
{
    if (c->ended || mm == NULL) {
        return;
    }
    c->ended = true;
    atomic_fetch_add_explicit(&mm->failure[reason], 1, memory_order_relaxed);
    sp_tstat_add(&mm->tstats.fail, sp_time_ns() - c->t0_ns);
}

uint64_t
sp_metrics_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &res) != 2) {
            res = 0;
        }
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}
