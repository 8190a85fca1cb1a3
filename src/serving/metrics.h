/*
 * metrics.h - request counters and latency histograms of the served models
 * (their Prometheus exposition, GET /metrics, is api/prometheus.c; names in
 * docs/metrics.md).
 *
 * Recording is lock-free (relaxed atomics) so the loop threads that finish
 * requests never wait on each other; a scrape reads whatever the counters
 * hold at that moment. The scheduler's own figures (tokens, queues, KV
 * blocks, batch sizes) come from sp_sched_get_stats at scrape time.
 */
#ifndef SP_SERVING_METRICS_H
#define SP_SERVING_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/gen.h"
#include "sampan/status.h"
#include "serving/auth.h"
#include "serving/tstats.h"

#define SP_HIST_MAX_BUCKETS 32

typedef struct sp_hist {
    const double *le;  /* upper bounds, ascending */
    int n;             /* bounds; counts[n] is +Inf */
    _Atomic uint64_t counts[SP_HIST_MAX_BUCKETS + 1]; /* per bucket, not cumulative */
    _Atomic uint64_t sum_bits;                        /* a double, updated by CAS */
} sp_hist_t;

typedef enum sp_hist_kind {
    SP_HIST_TTFT = 0,  /* time to first token */
    SP_HIST_TPOT,      /* time per output token */
    SP_HIST_LATENCY,   /* e2e, queue and compute times */
    SP_HIST_TOKENS,    /* prompt and generated lengths (1, 2, 5, 10, ... tokens) */
} sp_hist_kind_t;

void sp_hist_init(sp_hist_t *h, sp_hist_kind_t kind);
void sp_hist_observe(sp_hist_t *h, double v);
double sp_hist_sum(const sp_hist_t *h);
uint64_t sp_hist_count(const sp_hist_t *h);

typedef enum sp_fail_reason {
    SP_FAIL_INVALID = 0, /* the request was refused (4xx from validation) */
    SP_FAIL_QUEUE_FULL,  /* 429 */
    SP_FAIL_TIMEOUT,     /* the request deadline passed */
    SP_FAIL_CANCELLED,   /* the client went away */
    SP_FAIL_OVERLOADED,  /* the client read too slowly and was dropped */
    SP_FAIL_INTERNAL,
    SP_FAIL_COUNT_,
} sp_fail_reason_t;

const char *sp_metrics_fail_reason_name(sp_fail_reason_t r);
/* The failure reason of a scheduler status. */
sp_fail_reason_t sp_metrics_fail_reason_of(sp_status_t st, const char *message);

typedef struct sp_model_metrics {
    _Atomic uint64_t success[2];               /* finished_reason stop, length */
    _Atomic uint64_t failure[SP_FAIL_COUNT_];
    _Atomic uint64_t cache_hits, cache_misses; /* response cache lookups (respcache.h) */
    sp_hist_t queue, compute, e2e, ttft, tpot;
    sp_hist_t prefill, decode;               /* admission to first token, first token to end */
    sp_hist_t prompt_tokens, gen_tokens;     /* per successful request */
    sp_tstats_t tstats;                      /* Triton's statistics (tstats.h) */
} sp_model_metrics_t;

void sp_metrics_model_init(sp_model_metrics_t *mm);

/* One request as the protocol handlers see it. Start at handler entry (the
 * HTTP layer's dispatch time), mark the first token, then end it once. */
#define SP_REQ_TEXT_MAX 256 /* bytes of prompt and output kept for --log-prompts */

typedef struct sp_req_clock {
    int64_t t0_ns;
    int64_t first_ns;   /* 0 until the first token */
    int64_t queue_ns, compute_ns; /* from the scheduler's DONE (-1 = none) */
    /* A tensor model's batch (0 otherwise): merging inputs and splitting
     * outputs, inside compute_ns's neighbours; rows = the request's rows. */
    int64_t input_ns, output_ns, rows;
    int64_t prompt_tokens, completion_tokens;
    sp_tenant_charge_t charge; /* its tokens-per-minute reservation, settled at its end */
    bool ended;
    bool keep_text;     /* --log-prompts */
    size_t prompt_len, output_len;
    char prompt[SP_REQ_TEXT_MAX];
    char output[SP_REQ_TEXT_MAX];
} sp_req_clock_t;

void sp_metrics_clock_start(sp_req_clock_t *c, int64_t t0_ns, bool keep_text);
void sp_metrics_clock_token(sp_req_clock_t *c);
/* Keep (the start of) the prompt or output text for the access log. */
void sp_metrics_clock_text(sp_req_clock_t *c, bool output, const char *s, size_t n);
/* Record the request's outcome in mm (once; later calls do nothing). */
void sp_metrics_clock_success(sp_req_clock_t *c, sp_model_metrics_t *mm, sp_finish_t finish);
void sp_metrics_clock_failure(sp_req_clock_t *c, sp_model_metrics_t *mm, sp_fail_reason_t reason);

/* Resident memory of the process (bytes; 0 if unknown). */
uint64_t sp_metrics_rss_bytes(void);

#endif /* SP_SERVING_METRICS_H */
