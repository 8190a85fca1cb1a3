/*
 * sched.h - the seam between the protocol front ends (OpenAI, KServe v2) and
 * the engine: the front ends submit generation and embedding jobs here and
 * only use this header; the scheduler behind it (sched.c) decides what runs
 * when.
 *
 * A front end submits a job (prompt tokens, generation parameters, n
 * sequences, priority, deadline, or an embedding request) on its event-loop
 * thread and gets a handle. The engine runs on its own threads and never
 * waits for the network: it appends events (text and log-probability deltas,
 * one finish per sequence, embeddings, and one final DONE) to the job's
 * outbox and sends the job to the submitting loop's mailbox (sched/mailbox.h;
 * the composition root wires its wake to the loop's eventfd). The loop drains
 * the mailbox, which delivers the outboxes through the job's event callback,
 * always on that loop's thread, so front-end code needs no locks.
 *
 * Cancel (client disconnect) marks the job; the engine stops it at its next
 * step and frees its slot. After sp_sched_cancel returns no callback runs for
 * the job again. A job whose outbox grows past a bound (its loop is not
 * draining) is cancelled by the engine with an error: a stalled reader cannot
 * stall the engine or grow memory without bound.
 *
 * The implementation (sched.c): one engine thread per model running
 * continuous batching over a paged KV cache (engine/batch.h) with prefix
 * reuse, priority tiers and preemption by recompute; see sched.c. The queue
 * of waiting sequences is bounded per tier: a full queue is SP_ERR_BUSY (HTTP
 * 429 with Retry-After). A request whose prompt plus max_tokens can never fit
 * the KV pool is SP_ERR_INVALID at submit; otherwise running out of blocks
 * only delays it.
 */
#ifndef SP_SCHED_SCHED_H
#define SP_SCHED_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/gen.h"
#include "engine/model.h"
#include "sampan/status.h"
#include "sched/mailbox.h"

typedef struct sp_sched sp_sched_t;         /* one per served model */
typedef struct sp_sched_job sp_sched_job_t; /* one submitted request (n sequences) */

#define SP_SCHED_MAX_N 128 /* sequences per job (hard cap; front ends apply a lower one) */

typedef enum sp_sched_ev_kind {
    SP_SCHED_EV_TOKEN = 1, /* a sequence produced a token (text may be empty while held back) */
    SP_SCHED_EV_FINISH,    /* a sequence ended (finish, n_generated) */
    SP_SCHED_EV_EMBEDDING, /* an embedding sequence's vector */
    SP_SCHED_EV_DONE,      /* the job ended (status, message; usage) - always the last event */
} sp_sched_ev_kind_t;

typedef struct sp_sched_logprob {
    int32_t token;
    float logprob;
    const char *text; /* the token's bytes (may be part of a UTF-8 character) */
    int32_t text_len;
} sp_sched_logprob_t;

/* Pointers stay valid for the duration of the callback only. */
typedef struct sp_sched_event {
    sp_sched_ev_kind_t kind;
    int32_t index;              /* sequence index (0..n-1); -1 for DONE */
    /* TOKEN */
    const char *text;
    size_t text_len;
    int32_t token;
    bool has_logprobs;
    sp_sched_logprob_t chosen;
    const sp_sched_logprob_t *top;
    int32_t n_top;
    /* FINISH */
    sp_finish_t finish;
    int32_t n_generated;
    int32_t stop_index;         /* the stop string that ended it (gen.stop index), or -1 */
    /* EMBEDDING */
    const float *embedding;
    int32_t n_embd;
    /* DONE */
    sp_status_t status;         /* SP_OK, or why the job failed */
    const char *message;        /* with an error */
    int64_t prompt_tokens;      /* all sequences' prompts evaluated */
    int64_t completion_tokens;  /* all sequences' generated tokens */
    int64_t queue_ns;           /* submit to the first admission (the whole wait if never) */
    int64_t compute_ns;         /* first admission to DONE (0 if never admitted) */
} sp_sched_event_t;

typedef void (*sp_sched_event_fn)(const sp_sched_event_t *ev, void *ud);

typedef struct sp_sched_request {
    /* Prompts: n entries; generation jobs usually pass the same pointer n
     * times. Copied at submit. */
    const int32_t *const *prompts;
    const int64_t *n_prompts;
    int32_t n;
    sp_gen_params_t gen;        /* per sequence; seed + index for sequence index */
    bool embed;                 /* embeddings instead of generation */
    int32_t priority;           /* tier: > 0 premium, 0 standard, < 0 batch (SP_SCHED_PRIO_*);
                                   higher tiers are admitted first, FIFO within a tier */
    int64_t deadline_ns;        /* sp_time_ns() clock; 0 = none */
    struct sp_lora *lora;       /* a LoRA adapter of this model (engine/lora.h) for every
                                   sequence, or NULL; the job takes its own reference. Its
                                   sequences share prefix-cache blocks only with sequences of
                                   the same adapter. Not with embed. */
    uint32_t prefix_scope;      /* prefix-cache scope (0..65535): sequences share prefix-cache
                                   blocks only with sequences of the same scope (the front ends
                                   pass the tenant's, or 0 for all with --prefix-cache-scope
                                   global) */
    sp_mailbox_t *mailbox;      /* where events are delivered (the submitting loop's; it
                                   must outlive the job, and its owner drains it) */
    sp_sched_event_fn on_event;
    void *ud;
} sp_sched_request_t;

/* Request priorities as the front ends pass them (tier names map to these). */
#define SP_SCHED_PRIO_PREMIUM 1
#define SP_SCHED_PRIO_STANDARD 0
#define SP_SCHED_PRIO_BATCH (-1)

typedef struct sp_sched_params {
    int n_slots;           /* most sequences running at once (--parallel, default 4) */
    int64_t n_ctx;         /* longest sequence; 0 = the model's, capped at 4096 */
    int n_threads;         /* engine threads; 0 = one per core */
    int max_queue;         /* waiting sequences per tier; more: SP_ERR_BUSY (default 64) */
    int prefill_chunk;     /* tokens per step (decode rows + prefill chunks; --step-tokens, 256) */
    size_t max_outbox_bytes; /* undelivered event bytes per job before it is cancelled (8 MiB) */
    int64_t kv_blocks;     /* KV pool size in blocks of SP_KV_BLOCK positions; 0 = every
                              running sequence's full context, within 2 GiB */
    sp_kv_type_t kv_type;  /* KV cache type (f32 default, f16, q8_0: engine/model.h);
                              q8_0 needs a model with no GPU layers */
    bool kv_swa_full;      /* keep every position of the sliding-window layers (one-part
                              pool, as before docs/design.md, "KV cache with sliding windows"); false: they keep
                              their window only where that fits more in the same memory */
    int64_t tier_queue[3]; /* per-tier bound (batch, standard, premium); < 0 = max_queue */
    double tpot_target_ms; /* > 0: adapt the prefill budget to keep the p99 step time (the
                              time per output token) under this (sched/stepctl.h) */
    /* Speculative decoding: a small model with the same vocabulary proposes spec_k
     * tokens, the model verifies them in one pass (sched.c, "Speculative decoding").
     * NULL: off. The draft must outlive the scheduler; CPU layers only. */
    const sp_model_t *draft;
    int spec_k;            /* tokens proposed per step, 1..SP_SCHED_MAX_SPEC (default 4) */
} sp_sched_params_t;

#define SP_SCHED_MAX_SPEC 16

/* Steps by batch size: bucket b counts steps with at most 2^b sequences (and
 * more than 2^(b-1)); the last one, more than 2^(SP_SCHED_BATCH_BUCKETS-1). */
#define SP_SCHED_BATCH_BUCKETS 9 /* 1, 2, 4, ..., 256 */
#define SP_SCHED_STATS_LORAS 64  /* adapters listed per stats snapshot (a model's most) */

typedef struct sp_sched_stats {
    int64_t active;        /* sequences running */
    int64_t queued;        /* sequences waiting */
    int64_t jobs_done, jobs_cancelled, tokens_generated, prompt_tokens;
    /* per tier, indexed batch, standard, premium */
    int64_t running_tier[3], waiting_tier[3];
    int64_t preemptions;
    int64_t prefix_lookups, prefix_hits; /* full blocks looked up / found in the prefix cache */
    int64_t prompt_tokens_cached;        /* positions not recomputed thanks to prefix hits */
    int64_t kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_blocks_free, kv_evictions;
    /* the sliding part of a two-part pool (0 without one): its blocks in all, held
       and cached (kv_blocks_* above are then the global part's) */
    int64_t kv_swa_blocks_total, kv_swa_blocks_used, kv_swa_blocks_cached;
    int64_t prefix_swa_cut_blocks; /* cached prefix blocks not reused: the sliding part no
                                      longer held the window after them */
    int64_t steps, last_step_seqs, last_step_rows;
    double mean_step_seqs, mean_step_rows;
    int64_t step_seqs_total;                             /* sum of sequences over steps */
    int64_t batch_hist[SP_SCHED_BATCH_BUCKETS + 1];      /* see SP_SCHED_BATCH_BUCKETS */
    /* adaptive step budget: prefill tokens per step now (= step tokens when off), the p99
       of the last steps with decode rows, the target (0 = off) and the adjustments */
    int64_t step_budget, budget_decreases, budget_increases;
    double step_p99_ms, tpot_target_ms;
    /* speculative decoding: verification rows, draft tokens proposed and accepted
       (tokens per verification = (accepted + rows) / rows, the speed-up's upper bound) */
    int64_t spec_rows, spec_drafted, spec_accepted;
    /* LoRA adapters (sp_lora_id) of the running and of the waiting sequences,
       each once, at most SP_SCHED_STATS_LORAS of each (vllm:lora_requests_info) */
    uint64_t lora_running[SP_SCHED_STATS_LORAS], lora_waiting[SP_SCHED_STATS_LORAS];
    int n_lora_running, n_lora_waiting;
} sp_sched_stats_t;

sp_sched_params_t sp_sched_default_params(void);
/* The model must outlive the scheduler. Starts the engine thread. */
sp_status_t sp_sched_create(const sp_model_t *m, const sp_sched_params_t *p, sp_sched_t **out,
                            char *err, size_t err_len);
/* Stop the engine thread: jobs still queued or running end with
 * DONE(SP_ERR_CANCELLED) and later submits get SP_ERR_BUSY. The object stays
 * valid (loops may still call submit or cancel) until sp_sched_destroy, which
 * must come after the loops stopped. */
void sp_sched_stop(sp_sched_t *s);
void sp_sched_destroy(sp_sched_t *s); /* stops first if needed; NULL is a no-op */
int64_t sp_sched_n_ctx(const sp_sched_t *s);
void sp_sched_get_stats(sp_sched_t *s, sp_sched_stats_t *out);

/* The memory a scheduler takes, in the heap bytes sp_alloc_bytes_in_use counts
 * (thread stacks and the model's mapped weights are not in it). */
typedef struct sp_sched_mem {
    int64_t n_ctx;          /* the context the scheduler would use */
    int64_t kv_blocks;      /* KV pool size it would use (the same rule as sp_sched_create) */
    int64_t kv_swa_blocks;  /* the sliding part's blocks (0: one part) */
    uint64_t kv_bytes;      /* the KV pool (shared cache of all running sequences): host
                               memory, the CPU layers' (every layer without a GPU binding) */
    uint64_t kv_gpu_bytes;  /* device memory of the GPU layers' pool, both parts of a
                               two-part pool each at its own size (0 without GPU layers) */
    uint64_t scratch_bytes; /* batch buffers, the embedding context, logits, per-slot arrays,
                               vocab tables */
} sp_sched_mem_t;

/* What sp_sched_create(m, p) would allocate, without allocating it: the model
 * repository checks it against a device's memory budget before it loads. Both
 * take n_ctx and kv_blocks from one rule and check p the same way, so this
 * fails (same status, same err) exactly where create would for the
 * parameters. The bytes are what create holds when it returns, within a few
 * KiB (the few parts whose size other modules keep private are bounded from
 * above, see sched.c); an overflowing size saturates at UINT64_MAX. Not
 * included: what each request allocates at submit (its token arrays, samplers,
 * event buffers) and thread stacks. */
sp_status_t sp_sched_estimate(const sp_model_t *m, const sp_sched_params_t *p, sp_sched_mem_t *out,
                              char *err, size_t err_len);

/* Sequences submitted and not yet ended (queued plus running): raised by r->n
 * at a successful sp_sched_submit, lowered as each sequence ends (finished,
 * failed, cancelled, or dropped at stop) on the engine thread. One atomic
 * load, no lock: any thread may call it on every request, e.g. to send the
 * next one to the instance with the least outstanding work. The value is a
 * snapshot; it is 0 on a new scheduler and again once everything ended. */
int64_t sp_sched_outstanding(const sp_sched_t *s);

/* Loop thread. SP_ERR_BUSY when the queue is full, SP_ERR_INVALID (err) for
 * a bad request (a prompt longer than the context, n out of range). */
sp_status_t sp_sched_submit(sp_sched_t *s, const sp_sched_request_t *r, sp_sched_job_t **out,
                            char *err, size_t err_len);
/* The Retry-After (seconds, 1..60) of a submit of n sequences at priority
 * refused with SP_ERR_BUSY: the sequences waiting ahead of it over the rate at
 * which sequences have been ending lately (drain.h). Any thread. */
int sp_sched_retry_after_s(sp_sched_t *s, int32_t priority, int32_t n);
/* Loop thread (the job's). No callbacks for the job after this. */
void sp_sched_cancel(sp_sched_job_t *job);

/* A job's mailbox (one per loop) is destroyed on its loop thread after the
 * schedulers stopped: a job still listed there is freed if the engine is done
 * with it; its events are not delivered any more. */

#endif /* SP_SCHED_SCHED_H */
