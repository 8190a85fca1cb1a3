/*
 * batcher.h - the dynamic batcher for tensor models (Triton's dynamic_batching).
 *
 * A tensor model (XGBoost, identity, ...) runs behind include/sampan/backend.h,
 * whose execute() takes whole tensors whose first dimension is the batch. The
 * batcher sits between the KServe infer route and execute(): requests are
 * submitted one by one, queued, merged along dim 0 into one execute() call per
 * batch, and each request gets its own rows of the outputs back through its
 * completion callback, with its own status.
 *
 * Usage (the integrator's side):
 *
 *     sp_batcher_params_t p = sp_batcher_default_params();
 *     p.max_batch_size = 64;                  // the model's max_batch_size
 *     p.max_queue_delay_us = 500;             // dynamic_batching fields ...
 *     sp_batcher_t *b;
 *     if (sp_batcher_create(&p, api, instances, n_instances, &info, host, &b, err, sizeof err))
 *         ...;                                // err says which field is wrong
 *     sp_batch_item_t it = {.inputs = ins, .n_inputs = n, .done = on_done, .ud = req};
 *     sp_status_t st = sp_batcher_submit(b, &it, err, sizeof err);
 *     // st != SP_OK: answer now (400 invalid, 429 busy, ...); on_done is never called.
 *     // st == SP_OK: on_done(req, res) is called exactly once, later, on a batcher thread.
 *     ...
 *     sp_batcher_destroy(b);                  // fails what is queued, joins the threads
 *
 * Threads. One worker thread per model instance (instances[i] is the `void
 * *model` that instance's execute() gets; an instance runs one batch at a
 * time, so execute() is never called concurrently for one instance). All
 * workers take from one shared queue. submit() and get_stats() may be called
 * from any thread; they take the batcher's mutex for a short critical section
 * and never wait for a batch. Completion callbacks run on a batcher thread (a
 * worker, or the timer thread for queue timeouts) without any batcher lock
 * held: a callback may call submit() or get_stats(), but must not call stop()
 * or destroy(), and should not block for long (it holds up that instance;
 * post the result to the right event loop instead). The owner calls stop()
 * and destroy() once, when no other thread can still call submit().
 *
 * Batch formation (Triton's semantics, with the differences noted):
 *   - Order. Priority levels 1 (highest) .. priority_levels; FIFO within a
 *     level; requests whose timeout passed with timeout_action DELAY go behind
 *     every unexpired request of their level (and before lower levels).
 *   - A batch starts with the first request in that order (the head) and takes
 *     the following ones in order while the rows fit under the target: the
 *     largest preferred_batch_size <= the cap, or the cap when no preferred size
 *     is given (the cap is max_batch_size, or the adaptive cap). It stops at the
 *     first request that does not fit (no overtaking by row count); a head with
 *     more rows than the target runs alone (it is <= max_batch_size).
 *   - Shapes. Requests are merged only when every input has the same shape
 *     apart from dim 0 (models with -1 dims). A request whose shape differs from
 *     the head's is passed over (it does not end the batch, unlike Triton); it
 *     waits for a later batch, where it is the head at the latest when everything
 *     before it has left the queue, so it is never starved.
 *   - When it runs: at once when the rows reached a preferred size (the largest
 *     preferred-size prefix is taken, the rest waits), or the target (the next
 *     request would pass it), or max_queue_delay_us has passed since the oldest
 *     request of the batch arrived (then whatever was gathered runs); otherwise
 *     the worker waits until that moment or until new requests arrive. With
 *     max_queue_delay_us 0 (Triton's default) it runs whatever is there at once,
 *     so batches only form while every instance is busy.
 *   - enabled = false (the unbatched baseline, or a model without
 *     dynamic_batching) and max_batch_size = 0 (no batch dimension): every
 *     request runs alone and at once; priorities and queue policies still apply.
 *
 * Queue policy (per priority level; Triton's ModelQueuePolicy):
 *   - max_queue_size: requests (not rows) waiting at that level, 0 = unbounded;
 *     a submit beyond it fails at once with SP_ERR_BUSY (HTTP 429).
 *   - default_timeout_us: time a request may wait in the queue (0 = forever).
 *     With allow_timeout_override a request's own timeout_us replaces it when it
 *     is shorter (a request cannot extend the operator's bound; Triton treats a
 *     default of 0 as "no override possible", here 0 is infinite, so any request
 *     timeout applies).
 *   - timeout_action REJECT: at the deadline the request leaves the queue and
 *     completes with SP_ERR_BUSY, reason SP_BATCH_REASON_TIMEOUT, on time even
 *     while every instance is busy (a timer thread, started only when some
 *     level has timeouts, fires deadlines). DELAY: it stays queued, moved
 *     behind the unexpired requests of its level. Timeouts apply in the queue
 *     only: once a request is in a batch it runs to the end.
 *
 * Adaptive mode (adaptive = true, target_p99_ms > 0): "dynamic batch size
 * adjustment". The batcher tunes two knobs, the effective queue delay D in
 * [0, max_queue_delay_us] and the cap C (rows per batch) in [1, max_batch_size],
 * so that the p99 of end-to-end latency (submit to callback) stays under the
 * target while batches are as large as the target allows. Inputs: every
 * completed request's latency (a window of the last SP_BATCHER_CTL_WINDOW), and
 * per batch its rows, execute time and why it was sent. Every
 * SP_BATCHER_CTL_PERIOD completed requests, but no sooner than
 * SP_BATCHER_CTL_MIN_PERIOD_NS and SP_BATCHER_CTL_MIN_SAMPLES latencies after
 * the last adjustment (checked once per batch), the controller
 * (sp_batcher_ctl_t, below) looks at the window's p99, in this order:
 *   - Load: the busier of the instances (execute time over wall time, per
 *     instance) and the server (the process's CPU time over wall time, per CPU
 *     it may use). The instances alone miss the usual bottleneck of a small
 *     model: the HTTP loop and the hand-offs, whose cost per batch a delay
 *     amortises.
 *   - p99 > target and the server saturated (load >= 0.85): the p99 is
 *     queueing behind work the server cannot keep up with, and only larger
 *     batches buy throughput: C grows back to max_batch_size first, then D
 *     doubles (at least max_queue_delay_us/8) up to max_queue_delay_us.
 *   - p99 > target, D > 0 and load < 0.7: multiplicative decrease of D (halved,
 *     to 0 below 1% of its maximum): waiting is pure added latency, so it goes
 *     first. Between 0.7 and 0.85 D holds (hysteresis between the two rules).
 *   - Backlog (a batch cut by size left requests queued: the instances are short
 *     of throughput): the cap is never cut, and grows back by max_batch_size/16
 *     if it was cut before. Under overload a smaller cap only lowers throughput
 *     and grows the queue (in a closed loop latency = backlog / throughput);
 *     overload is for max_queue_size and queue timeouts to handle.
 *   - p99 > target, D = 0, no backlog: the cap shrinks by a quarter, but only
 *     when the fitted cost of a batch, exec(r) = a + b*r (least squares over
 *     recent batches, old ones forgotten; "all fixed cost" when the batch sizes
 *     do not spread enough to tell), says that a full batch takes more than a
 *     quarter of the target (else the batch size is not what makes the p99:
 *     bursts or a noisy machine are, and a smaller cap cannot help) and that
 *     the instances still serve 1.25x the measured arrival rate at the smaller
 *     cap. After any cut the window starts afresh, so the slow samples taken
 *     with the old settings cannot cause a second cut.
 *   - p99 < 0.7 * target: increase (hysteresis: between 0.7 and 1.0 nothing
 *     moves). If batches were cut by size and C < max_batch_size, C grows by
 *     max_batch_size/16 (at least 1); else if batches left on the delay before
 *     reaching their target and D < max_queue_delay_us, D grows by half the
 *     headroom, (0.7 * target - p99) / 2 (at least max_queue_delay_us/256):
 *     latency grows about one for one with D, so the p99 approaches the bottom
 *     of the band from below instead of overshooting it, leaving the band's 30%
 *     for noise. D only grows when the measured arrival rate brings at least
 *     one row within max_queue_delay_us (waiting gains nothing at a trickle)
 *     and the load is at least 0.5.
 *   - Load < 0.25 and D > 0: D is halved; a mostly idle server gains no
 *     throughput from waiting.
 * D starts at 0 and C at max_batch_size: a new model never starts by missing
 * its target, and it batches as much as the latency budget proves to allow.
 * The current D and C, the p99 and the adjustment counts are in the stats.
 *
 * Ownership. submit() copies the inputs (the caller may free its request as
 * soon as submit returns). Outputs given to a callback are the request's own
 * rows, in buffers allocated with host->alloc_fn; the batcher frees each with
 * host->free_fn after the callback returns unless the callback took it with
 * sp_batcher_result_take() (then the callback owns it and frees it with
 * host->free_fn). All other pointers in a result are valid only during the
 * callback.
 *
 * Locking is documented at the top of batcher.c.
 */
#ifndef SP_SCHED_BATCHER_H
#define SP_SCHED_BATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/backend.h"
#include "sampan/status.h"

#define SP_BATCHER_MAX_PREFERRED 16 /* preferred_batch_size entries */
#define SP_BATCHER_MAX_LEVELS 32    /* priority_levels */
#define SP_BATCHER_HIST_MAX 32      /* rows-per-batch histogram buckets */

typedef struct sp_batcher sp_batcher_t;

typedef enum sp_batcher_timeout_action {
    SP_BATCHER_TIMEOUT_REJECT = 0, /* complete with SP_ERR_BUSY at the deadline */
    SP_BATCHER_TIMEOUT_DELAY = 1,  /* keep it, behind the unexpired requests of its level */
} sp_batcher_timeout_action_t;

/* Triton's ModelQueuePolicy. All zero: unbounded, no timeout, REJECT. */
typedef struct sp_batcher_queue_policy {
    sp_batcher_timeout_action_t timeout_action;
    uint64_t default_timeout_us; /* 0 = none */
    bool allow_timeout_override; /* a request's timeout_us may shorten the default */
    uint32_t max_queue_size;     /* requests queued at the level, 0 = unbounded */
} sp_batcher_queue_policy_t;

typedef struct sp_batcher_params {
    bool enabled;                /* false: every request runs alone, without delay */
    int32_t max_batch_size;      /* the model's; 0 = no batch dimension, no batching */
    uint64_t max_queue_delay_us; /* wait for more requests, from the oldest one's arrival */
    int32_t preferred_batch_size[SP_BATCHER_MAX_PREFERRED]; /* each in [1, max_batch_size] */
    int32_t n_preferred;
    uint32_t priority_levels;        /* 0 or 1: one level; at most SP_BATCHER_MAX_LEVELS */
    uint32_t default_priority_level; /* 1..priority_levels (0 with priority_levels 0) */
    sp_batcher_queue_policy_t default_queue_policy;
    /* priority_queue_policy: has_level_policy[l-1] replaces the default for level l. */
    bool has_level_policy[SP_BATCHER_MAX_LEVELS];
    sp_batcher_queue_policy_t level_policy[SP_BATCHER_MAX_LEVELS];
    bool adaptive;        /* tune the delay and the cap for target_p99_ms (see above) */
    double target_p99_ms; /* end to end, submit to callback; > 0 when adaptive */
    bool external_latency; /* the caller reports each request's true end-to-end latency
                              (sp_batcher_observe_latency) instead of submit-to-callback */
} sp_batcher_params_t;

/* enabled, max_batch_size 0 (set it), no delay, no preferred sizes, one level,
 * unbounded queue without timeouts, not adaptive. */
sp_batcher_params_t sp_batcher_default_params(void);

/* Why a request ended as it did (the status says how to answer; this says
 * what happened, for metrics and for an integrator that maps it differently). */
typedef enum sp_batch_reason {
    SP_BATCH_REASON_OK = 0,
    SP_BATCH_REASON_TIMEOUT,  /* SP_ERR_BUSY: its queue timeout passed (REJECT) */
    SP_BATCH_REASON_STOPPED,  /* SP_ERR_CANCELLED: the batcher stopped before it ran */
    SP_BATCH_REASON_EXECUTE,  /* SP_ERR_IO: execute() failed or returned bad outputs */
    SP_BATCH_REASON_NOMEM,    /* SP_ERR_NOMEM: merging inputs or copying outputs failed */
} sp_batch_reason_t;

typedef struct sp_batch_result {
    sp_status_t status;       /* SP_OK, or the error (see sp_batch_reason_t) */
    sp_batch_reason_t reason;
    const char *message;      /* "" on success, else one line; valid during the callback */
    /* The wanted outputs in the order the item asked for them (every declared
     * output in declared order when it asked for none); NULL/0 on error.
     * name: the model's (valid during the callback); dims[0] = this request's
     * rows (with max_batch_size 0: the whole output); data/bytes: see
     * sp_batcher_result_take. */
    sp_backend_tensor_t *outputs;
    int32_t n_outputs;
    int64_t queue_us;         /* submit to the start of execute() (or to the error) */
    int64_t compute_us;       /* execute() of its batch, 0 when it did not run */
    int32_t batch_rows;       /* rows of the batch it ran in, 0 when it did not run */
    int32_t batch_requests;   /* requests in that batch */
    /* Inside queue_us: merging the batch's inputs (0 for a lone request);
     * after compute_us: splitting and copying its outputs. */
    int64_t input_us, output_us;
    bool batch_first;         /* the first request of its batch (count a batch once) */
} sp_batch_result_t;

/* Take ownership of outputs[i].data (free it with host->free_fn); the batcher
 * will not free it. Returns the pointer (NULL for an empty output). Only from
 * inside the callback. */
void *sp_batcher_result_take(const sp_batch_result_t *res, int32_t i);

/* KServe's name of a backend data type ("FP32", "BYTES", ...); "?" out of range. */
const char *sp_batcher_btype_name(sp_btype_t t);

/* The completion callback: exactly once per accepted submit, on a batcher
 * thread, without batcher locks held. res is valid only during the call. */
typedef void (*sp_batch_done_cb)(void *ud, const sp_batch_result_t *res);

typedef struct sp_batch_item {
    /* Every input the model declares, each once, in any order (matched by
     * name). With max_batch_size > 0, dims[0] is the request's rows (the same
     * for every input, 1..max_batch_size) and dims[1..] match the model's dims
     * (-1 in the model = any size); with max_batch_size 0 the dims match the
     * model's dims exactly. bytes must fit the dims (BYTES: each element a
     * uint32 little-endian length and that many bytes, nothing left over).
     * Copied by submit. */
    const sp_backend_tensor_t *inputs;
    int32_t n_inputs;
    /* Outputs wanted, by name, each once; n_outputs 0 = every declared output. */
    const char *const *outputs;
    int32_t n_outputs;
    uint32_t priority;   /* 1 = highest .. priority_levels; 0 or out of range = default */
    uint64_t timeout_us; /* queue timeout; 0 = the level's default (see allow_timeout_override) */
    sp_batch_done_cb done; /* required */
    void *ud;
} sp_batch_item_t;

/*
 * Start the workers. params, instances[] and *info are copied; api and host
 * are borrowed and must outlive the batcher (host->alloc_fn and free_fn are
 * required: outputs are allocated and freed with them). info is what the
 * backend's load reported (inputs are validated against it). n_instances >= 1.
 * SP_ERR_INVALID with err naming the field for bad parameters, SP_ERR_NOMEM;
 * *out is NULL on failure.
 */
sp_status_t sp_batcher_create(const sp_batcher_params_t *params, const sp_backend_api_t *api,
                              void *const *instances, int n_instances,
                              const sp_backend_model_info_t *info, const sp_backend_host_t *host,
                              sp_batcher_t **out, char *err, size_t err_len);

/*
 * Queue one request. Validation is synchronous and per request:
 * SP_ERR_INVALID (HTTP 400) with err naming the input and what is wrong,
 * SP_ERR_BUSY (429) when its priority level's queue is full, SP_ERR_CANCELLED
 * once the batcher is stopping, SP_ERR_NOMEM. On any error item->done is never
 * called; on SP_OK it is called exactly once. Thread-safe.
 */
sp_status_t sp_batcher_submit(sp_batcher_t *b, const sp_batch_item_t *item, char *err,
                              size_t err_len);

/*
 * Stop accepting requests (submit fails with SP_ERR_CANCELLED) and join the
 * workers. drain = true: everything queued still runs (without waiting for
 * the delay; queue timeouts still apply), as when a model version is swapped
 * under load. drain = false: queued requests complete with SP_ERR_CANCELLED
 * (reason STOPPED); batches already executing finish normally. Either way
 * every accepted request's callback has been called once when this returns.
 * Idempotent; never from a callback.
 */
void sp_batcher_stop(sp_batcher_t *b, bool drain);

/* sp_batcher_stop(b, false) if still running, then free everything. NULL is a no-op. */
void sp_batcher_destroy(sp_batcher_t *b);

typedef struct sp_batcher_stats {
    uint64_t requests;         /* accepted by submit */
    uint64_t completed;        /* callbacks with SP_OK */
    uint64_t batches;          /* execute() calls */
    uint64_t rows;             /* rows over all batches */
    /* Rows per batch: hist[i] counts batches with rows in (hist_le[i-1], hist_le[i]];
     * hist_le = 1, 2, 4, ... up to max_batch_size (the last bound is max_batch_size). */
    int32_t n_hist;
    int64_t hist_le[SP_BATCHER_HIST_MAX];
    uint64_t hist[SP_BATCHER_HIST_MAX];
    uint64_t queue_us_sum, queue_count;     /* per request that ran: submit to execute */
    uint64_t execute_us_sum, execute_count; /* per batch */
    uint64_t latency_us_sum, latency_count; /* per request that ran: submit to callback */
    /* Rejections and failures by reason. */
    uint64_t rejected_invalid;    /* submit: SP_ERR_INVALID */
    uint64_t rejected_queue_full; /* submit: SP_ERR_BUSY */
    uint64_t rejected_stopping;   /* submit after stop */
    uint64_t timed_out;           /* REJECT at the deadline */
    uint64_t delayed;             /* DELAY: moved behind at the deadline (they still run) */
    uint64_t cancelled;           /* STOPPED */
    uint64_t failed_execute;      /* requests in failed batches */
    uint64_t failed_nomem;
    int64_t queued;               /* requests waiting now */
    int32_t executing;            /* batches in execute() now */
    /* The knobs in effect (adaptive: the controller's, else the configured ones). */
    uint64_t delay_us;
    int32_t max_batch;
    bool adaptive;
    double p99_ms;                /* adaptive: of the latency window (0 before samples) */
    double load;                  /* adaptive: the last period's load (instances or server) */
    uint64_t adapt_increases, adapt_decreases;
} sp_batcher_stats_t;

/* Adaptive mode with external_latency: one request's end-to-end latency as
 * the client saw it (arrival to last byte queued). Thread-safe. */
void sp_batcher_observe_latency(sp_batcher_t *b, int64_t latency_ns);

/* A consistent snapshot. Thread-safe. */
void sp_batcher_get_stats(sp_batcher_t *b, sp_batcher_stats_t *out);

/* ---- the adaptive controller (used by the batcher; public for its unit test)
 *
 * A pure struct without clock, lock or allocation: the batcher feeds it under
 * its mutex, the test feeds it synthetic times. */

#define SP_BATCHER_CTL_WINDOW 1024 /* latencies in the p99 window */
#define SP_BATCHER_CTL_PERIOD 32   /* completed requests between adjustments, at least */
/* And at least this long and this many latencies in the window: a load read
 * over a few milliseconds is one pause of the machine, and the p99 of a few
 * dozen latencies is their maximum (measured at 15,000 req/s with 32-request
 * periods, 2 ms apart: the delay swung between 0 and 0.5 ms all the time). */
#define SP_BATCHER_CTL_MIN_PERIOD_NS 50000000
#define SP_BATCHER_CTL_MIN_SAMPLES 100

typedef enum sp_batch_why {
    SP_BATCH_WHY_PREFERRED = 0, /* reached a preferred size */
    SP_BATCH_WHY_FULL,          /* reached the target (the cap, or the largest preferred size) */
    SP_BATCH_WHY_DELAY,         /* the delay ran out (or was 0) before the target */
    SP_BATCH_WHY_ALONE,         /* unbatched, or draining */
} sp_batch_why_t;

typedef struct sp_batcher_ctl {
    int64_t target_ns;
    int64_t max_delay_ns;
    int32_t max_cap;
    int64_t delay_ns;    /* current D */
    int32_t cap;         /* current C */
    int64_t win[SP_BATCHER_CTL_WINDOW];
    int32_t n, head, since;
    int64_t p99_ns;
    /* Since the last adjustment: */
    int64_t period_start_ns;
    int64_t period_rows;
    int64_t period_exec_ns; /* execute() time summed over the period's batches */
    int64_t period_cpu_ns;  /* the process's CPU time at the period's start, or -1 */
    double cpus;            /* CPUs the process may use (0: unknown, no server load) */
    double load;            /* the last period's busier of instances and server, 0..1 */
    bool hit_cap;        /* a batch was cut by size (target or preferred size) */
    bool left_on_delay;  /* a batch left on the delay before reaching its target */
    bool backlog;        /* a batch cut by size left requests queued */
    /* exec(r) = a + b*r fit, exponentially weighted least squares. */
    double sw, sx, sy, sxx, sxy;
    int64_t increases, decreases;
} sp_batcher_ctl_t;

/* target_ms > 0; max_delay_us the configured delay; max_cap >= 1. D = 0, C = max_cap. */
void sp_batcher_ctl_init(sp_batcher_ctl_t *c, double target_ms, uint64_t max_delay_us,
                         int32_t max_cap);
/* A request of the batch about to be reported completed with latency_ns (submit to callback). */
void sp_batcher_ctl_latency(sp_batcher_ctl_t *c, int64_t latency_ns);
/* A batch of rows ran in exec_ns, sent for why, finished at now_ns (its requests'
 * latencies were given first); backlog: it was cut by size and left requests
 * queued. Once at least SP_BATCHER_CTL_PERIOD latencies arrived since the last
 * adjustment (sp_batcher_ctl_due), the knobs are adjusted: at most once per
 * batch, so one large batch cannot cut twice on the same samples. n_instances:
 * the workers serving the queue. cpu_ns: the process's CPU time now
 * (CLOCK_PROCESS_CPUTIME_ID), read only when the controller is due, else -1. */
void sp_batcher_ctl_batch(sp_batcher_ctl_t *c, int64_t rows, int64_t exec_ns, sp_batch_why_t why,
                          bool backlog, int64_t now_ns, int n_instances, int64_t cpu_ns);
/* True when the next sp_batcher_ctl_batch (at now_ns) adjusts the knobs (and wants cpu_ns). */
bool sp_batcher_ctl_due(const sp_batcher_ctl_t *c, int64_t now_ns);

#endif /* SP_SCHED_BATCHER_H */
