/*
 * tstats.h - Triton's per-model statistics (the statistics extension:
 * GET /v2/models/{m}/stats, gRPC ModelStatistics): cumulative counts and
 * nanoseconds of successful and failed requests, of their queue and
 * compute phases, of response-cache lookups, and of executions by batch
 * size. Kept in each served model's sp_model_metrics_t (metrics.h), so they
 * start at zero when a version is loaded, as Triton's do.
 *
 * Threads: recorded with relaxed atomics from the loop threads (a request's
 * end) and the batcher's workers (a batch's phases); a reader sees whatever
 * the counters hold at that moment. No allocation.
 */
#ifndef SP_SERVING_TSTATS_H
#define SP_SERVING_TSTATS_H

#include <stdatomic.h>
#include <stdint.h>

/* Distinct batch sizes kept per model (sizes seen after that many are
 * counted in the totals only: no batch_stats entry). */
#define SP_TSTATS_BATCH_SIZES 128

typedef struct sp_tstat_dur {
    _Atomic uint64_t count, ns;
} sp_tstat_dur_t;

typedef struct sp_tstat_batch {
    _Atomic int64_t size; /* 0: a free slot */
    sp_tstat_dur_t input, infer, output;
} sp_tstat_batch_t;

typedef struct sp_tstats {
    sp_tstat_dur_t success;        /* answered requests: arrival to answer */
    sp_tstat_dur_t fail;           /* failed requests: arrival to the error */
    sp_tstat_dur_t queue;          /* successful ones that ran: waiting for the model */
    sp_tstat_dur_t compute_input;  /* merging inputs into a batch (tensor models) */
    sp_tstat_dur_t compute_infer;  /* the model's execution (LLM: admission to done) */
    sp_tstat_dur_t compute_output; /* splitting and copying outputs (tensor models) */
    sp_tstat_dur_t cache_hit;      /* response-cache lookups that answered */
    sp_tstat_dur_t cache_miss;     /* lookups that did not, plus storing the answer */
    _Atomic uint64_t inference_count; /* rows inferred (a request of 8 rows: 8), no cache hits */
    _Atomic uint64_t execution_count; /* model executions (a batch; LLM: a request) */
    _Atomic uint64_t last_inference_ms; /* unix milliseconds of the last answered request */
    sp_tstat_batch_t batch[SP_TSTATS_BATCH_SIZES];
} sp_tstats_t;

void sp_tstat_add(sp_tstat_dur_t *d, int64_t ns);
/* One successful execution of `size` rows with its three phases (ns). */
void sp_tstats_batch(sp_tstats_t *t, int64_t size, int64_t input_ns, int64_t infer_ns,
                     int64_t output_ns);

#endif /* SP_SERVING_TSTATS_H */
