/*
 * sched.c - continuous batching over a paged KV cache, with prefix reuse,
 * priority tiers and preemption by recompute, behind the seam sched.h.
 *
 * One engine thread per model. Each step it
 *   1. drops cancelled and expired sequences (running or waiting),
 *   2. admits waiting sequences, highest tier first and FIFO within a tier,
 *      while there is room (max_seqs, step budget, KV blocks); a waiting
 *      sequence of a higher tier may preempt running ones of lower tiers,
 *   3. gives every running sequence that decodes a block for its next
 *      position, preempting the lowest-tier, latest-admitted sequence when
 *      none is left (that may be the sequence itself),
 *   4. runs one sp_batch_eval over every decode row plus prefill chunks under
 *      the per-step token budget (step_tokens), oldest admission first,
 *   5. publishes blocks that became full in the prefix cache, samples each
 *      sequence that reached the end of its tokens (sp_gen_step on its own
 *      logits with its own sampler) and posts the events.
 * Embedding sequences go through the same queue and run on a private
 * sp_ctx (sp_ctx_embed), at most one per step.
 *
 * A model with sliding-window layers gets a two-part pool (docs/design.md, "KV cache with sliding windows"):
 * step 3 is then the global part's, and each row also takes the sliding
 * blocks of its positions and releases those its window left behind
 * (plan_row, sched/swa.h); a prefix match is cut to what leaves the next
 * token's window cached in the sliding part.
 *
 * A sequence keeps all its tokens (prompt + generated) and its sp_gen_t for
 * its whole life. Preemption drops only its KV blocks: it goes back to the
 * head of its tier and, readmitted, recomputes its tokens (mostly from the
 * prefix cache, where its full blocks stayed) and continues sampling from
 * the same sampler state, so the client sees a pause, never a changed token.
 *
 * Memory and threads:
 * - A job is allocated by the loop thread at submit, with its sequences'
 *   token and block arrays sized for the longest they can get, so the engine
 *   allocates nothing per token; it is freed only by a loop thread: when its
 *   DONE has been delivered, or when it was cancelled and the engine has
 *   finished with it (engine_done) and it is not waiting in the mailbox.
 *   job->mu guards the outbox and these flags.
 * - The engine appends events to job->out; the loop swaps job->out with its
 *   spare buffer (job->in) under the lock and parses the records without it.
 * - A job with undelivered events waits in its loop's mailbox as an intrusive
 *   message (job->msg, sched/mailbox.h), so telling the loop never allocates
 *   and never fails: the mailbox runs job_deliver on the loop thread, or
 *   job_drop when the loop destroys it at shutdown.
 * - The waiting queue (sp_tierq) is shared with submit under s->mu; the
 *   running set, the block manager, the KV pool and the batch buffers belong
 *   to the engine thread.
 */
#include "sched/sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "core/timer.h"
#include "engine/gpu.h"
#include "engine/batch.h"
#include "engine/lora.h"
#include "engine/encoder.h"
#include "sampan/log.h"
#include "sched/blocks.h"
#include "sched/drain.h"
#include "sched/stepctl.h"
#include "sched/swa.h"
#include "sched/tierq.h"

/* ------------------------------------------------------------------ records */

typedef struct rec {
    uint32_t size;     /* whole record, header included */
    int32_t kind, index;
    int32_t a, b, c;   /* TOKEN: token, text_len, n_top (-1 = no logprobs)
                          FINISH: finish, n_generated, stop_index; EMBEDDING: n_embd; DONE: status, msg_len */
    int64_t x, y;      /* DONE: prompt_tokens, completion_tokens */
    int64_t q, e;      /* DONE: queue and compute time (ns) */
} rec_t;

typedef struct lp_rec {
    int32_t token;
    float logprob;
    int32_t len;
} lp_rec_t;

#define LP_MAX_TEXT 64 /* bytes of a token's text kept for log-probabilities */
#define STATS_LOG_EVERY 256 /* steps between debug statistics lines */

/* -------------------------------------------------------------- structures */

typedef struct seq {
    sp_tierq_node_t node;  /* first: queue nodes convert back to sequences */
    sp_sched_job_t *job;
    int32_t index;
    sp_gen_t *gen;         /* created at the first admission, kept across preemption */
    int32_t *tokens;       /* prompt + generated */
    int64_t n_prompt, n_tokens, cap;
    int64_t n_computed;    /* positions whose keys/values are in the blocks */
    int32_t *blocks;       /* block table; with a two-part pool the sliding table's ids
                              follow at blocks + blocks_cap (the batch's layout) */
    int64_t n_blocks, blocks_cap;
    sp_swa_table_t swa;    /* the sliding part's table (two-part pool only) */
    int64_t n_published;   /* leading full blocks published (or found) in the prefix cache */
    uint64_t chain_hash, chain_serial;
    uint64_t admit_serial; /* admission order, for choosing preemption victims */
    int64_t step_n;        /* rows in the step being planned */
    /* speculative decoding (engine thread) */
    int32_t d_slot;        /* its block slot in the draft cache while running, else -1 */
    int64_t d_computed;    /* positions the draft cache holds for its tokens */
    int32_t spec_k;        /* draft tokens verified in the step being planned (0: none) */
    bool running, ended, counted;
} seq_t;

struct sp_sched_job {
    sp_sched_t *sched;
    sp_mailbox_t *mb;
    sp_sched_event_fn on_event;
    void *ud;
    /* immutable after submit */
    int32_t n;
    bool embed;
    int tier;
    int64_t deadline_ns;
    int64_t submit_ns;    /* sp_time_ns() at submit */
    sp_gen_params_t gen;  /* stop pointers into stop_store */
    sp_lora_t *lora;      /* the adapter of its rows (a reference), or NULL */
    char *stop_store;
    seq_t *seqs;
    int32_t *token_store; /* all sequences' token arrays */
    int32_t *block_store; /* all sequences' block tables */
    /* engine thread */
    int64_t admit_ns;     /* first admission of one of its sequences; 0 = never */
    int32_t ended;        /* sequences that have ended (any way) */
    sp_status_t status;
    char message[256];
    int64_t prompt_tokens, completion_tokens;
    uint32_t prefix_scope; /* sp_sched_request_t's */
    /* shared */
    atomic_bool cancel;
    pthread_mutex_t mu;
    char *out;
    size_t out_len, out_cap;
    char *in;
    size_t in_cap;
    bool queued;          /* in the mailbox list */
    bool engine_done;     /* DONE posted: the engine never touches the job again */
    bool consumer_gone;   /* cancelled by the loop */
    bool delivering;      /* the loop is calling on_event for it */
    bool overflowed;
    sp_mailbox_msg_t msg; /* in j->mb while queued: runs job_deliver there */
};

struct sp_sched {
    const sp_model_t *m;
    const sp_tokenizer_t *tok;
    sp_sched_params_t p;
    int64_t n_ctx;
    int32_t n_vocab;
    int32_t n_embd;
    sp_kv_pool_t *kv;
    sp_batch_t *batch;
    sp_blocks_t *blocks;
    /* A two-part pool (sliding-window layers keep their window only,
     * docs/design.md, "KV cache with sliding windows"): the sliding part's block manager, the window, and
     * per block index a scratch flag for prefix matching. NULL / 0: one part. */
    sp_blocks_t *swa_blocks;
    int64_t n_swa;
    uint8_t *swa_have;
    bool swa_short;        /* a row of the step being planned was cut for sliding blocks */
    sp_ctx_t *embed_ctx;   /* embeddings (mean pooling over a private cache) */
    sp_gen_vocab_t *vocab; /* the JSON constraint's piece table, shared by all generations */
    seq_t **running;       /* admission order; max_seqs entries */
    int n_running;
    seq_t **step_seqs;     /* sequences of the step being planned, parallel to rows */
    sp_batch_seq_t *rows;
    int32_t *cand_k;       /* per row: the best logits its sampler needs (0: the whole row) */
    /* Sampling the step's rows on the batch's threads (presample): the rows
     * taken, and per row its token and status; logits holds one row of
     * scratch per thread (n_threads rows: sp_gen_step changes its input). */
    int32_t *pre_rows;
    int32_t n_pre;
    sp_gen_token_t *pre_tok;
    sp_status_t *pre_st;
    bool *pre_done;
    int n_threads;
    int n_rows;
    uint64_t admit_counter;
    sp_stepctl_t ctl;      /* adaptive prefill budget (engine thread) */
    int64_t step_decode;   /* decode rows of the step being planned */
    bool step_filled;      /* its prefill used the whole budget */
    /* Speculative decoding (p.draft): the draft's own cache, one slot of
     * d_per_slot blocks per running sequence (no prefix sharing: the draft is
     * small and cheap to catch up), its batch and rows. A draft with
     * sliding-window layers has a two-part cache: its sliding layers keep a
     * ring of d_ring blocks per slot (sp_kv_ring_step), not d_per_slot. */
    sp_kv_pool_t *d_kv;
    sp_batch_t *d_batch;
    sp_batch_seq_t *d_rows;
    seq_t **d_seqs;
    int32_t *d_block_ids; /* slot i's table at i * d_tab: global ids i * d_per_slot ..,
                             then (with a ring) d_per_slot sliding entries */
    int64_t d_per_slot;
    int64_t d_tab;        /* d_per_slot, or 2 d_per_slot with a ring */
    int64_t d_ring;       /* sliding ring blocks per slot; 0: a one-part cache */
    int64_t d_swa;        /* the draft's window (with a ring) */
    int64_t *d_ring_entry; /* (n_slots x d_ring) the entry each ring block holds */
    bool *d_slot_used;
    float *logits;   /* n_vocab scratch for sampling */
    float *emb;      /* n_embd scratch for embeddings */
    char *scratch;   /* record assembly */
    size_t scratch_cap;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sp_tierq_t queue;      /* waiting sequences, under mu */
    bool stop;
    bool stopped;
    /* statistics: written by the engine (running counts under mu), read by anyone */
    int64_t run_tier[SP_TIER_COUNT];
    sp_blocks_stats_t bstats, swa_bstats;
    int64_t steps, step_rows_total, step_seqs_total, last_step_seqs, last_step_rows;
    int64_t batch_hist[SP_SCHED_BATCH_BUCKETS + 1]; /* steps by sequences (mu) */
    int64_t st_budget, st_p99_ns, st_decreases, st_increases; /* copies of ctl, under mu */
    atomic_int active_seqs;
    atomic_int_fast64_t outstanding; /* sequences submitted and not yet ended */
    atomic_int_fast64_t st_done, st_cancelled, st_tokens, st_prompt, st_preempt, st_prompt_cached;
    atomic_int_fast64_t st_spec_rows, st_spec_drafted, st_spec_accepted;
    atomic_int_fast64_t st_swa_cut; /* prefix blocks not reused: their window was not cached */
    sp_drain_t drain;      /* sequences ended lately, for Retry-After */
};

sp_sched_params_t
sp_sched_default_params(void)
{
    sp_sched_params_t p = {
        .n_slots = 4,
        .n_ctx = 0,
        .n_threads = 0,
        .max_queue = 64,
        .prefill_chunk = 256,
        .max_outbox_bytes = 8u << 20,
        .kv_blocks = 0,
        .kv_type = SP_KV_TYPE_F32,
        .tier_queue = {-1, -1, -1},
        .draft = NULL,
        .spec_k = 4,
    };
    return p;
}

/* ---------------------------------------------------- delivery to the loop */

static void
job_free(sp_sched_job_t *j)
{
    pthread_mutex_destroy(&j->mu);
    sp_grammar_release(j->gen.grammar);
    sp_lora_release(j->lora);
    sp_free(j->out);
    sp_free(j->in);
    sp_free(j->stop_store);
    for (int32_t i = 0; j->seqs && i < j->n; i++) {
        sp_gen_destroy(j->seqs[i].gen);
    }
    sp_free(j->seqs);
    sp_free(j->token_store);
    sp_free(j->block_store);
    sp_free(j);
}

/* Parse and deliver the records in buf; returns true when DONE was delivered. */
static bool
deliver(sp_sched_job_t *j, const char *buf, size_t len)
{
    bool done = false;
    size_t off = 0;
    while (off + sizeof(rec_t) <= len) {
        rec_t h;
        memcpy(&h, buf + off, sizeof h);
        /* Records are written whole by post(): a size that leaves the buffer
         * would read past it. */
        SP_ASSERT(h.size >= sizeof h && h.size <= len - off);
        const char *pl = buf + off + sizeof h;
        sp_sched_event_t ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = (sp_sched_ev_kind_t)h.kind;
        ev.index = h.index;
        sp_sched_logprob_t top[SP_GEN_MAX_TOP_LOGPROBS];
        switch (ev.kind) {
        case SP_SCHED_EV_TOKEN: {
            ev.token = h.a;
            ev.text = pl;
            ev.text_len = (size_t)h.b;
            const char *p = pl + h.b;
            if (h.c >= 0) {
                ev.has_logprobs = true;
                for (int i = -1; i < h.c; i++) {
                    lp_rec_t lr;
                    memcpy(&lr, p, sizeof lr);
                    sp_sched_logprob_t *dst = i < 0 ? &ev.chosen : &top[i];
                    dst->token = lr.token;
                    dst->logprob = lr.logprob;
                    dst->text = p + sizeof lr;
                    dst->text_len = lr.len;
                    p += sizeof lr + (size_t)lr.len;
                }
                ev.top = top;
                ev.n_top = h.c;
            }
            break;
        }
        case SP_SCHED_EV_FINISH:
            ev.finish = (sp_finish_t)h.a;
            ev.n_generated = h.b;
            ev.stop_index = h.c;
            break;
        case SP_SCHED_EV_EMBEDDING:
            ev.n_embd = h.a;
            ev.embedding = (const float *)(const void *)pl; /* records are 8-byte aligned */
            break;
        case SP_SCHED_EV_DONE:
            ev.status = (sp_status_t)h.a;
            ev.message = h.b > 0 ? pl : NULL;
            ev.prompt_tokens = h.x;
            ev.completion_tokens = h.y;
            ev.queue_ns = h.q;
            ev.compute_ns = h.e;
            done = true;
            break;
        }
        j->on_event(&ev, j->ud);
        off += h.size;
        /* The consumer may have cancelled from the callback. */
        pthread_mutex_lock(&j->mu);
        bool gone = j->consumer_gone;
        pthread_mutex_unlock(&j->mu);
        if (gone || done) {
            break;
        }
    }
    return done;
}

/* The mailbox runs this on the job's loop thread: swap the outbox for the
 * spare buffer under the lock, deliver the records without it, and free the
 * job when its DONE was delivered (or its consumer left) and the engine is
 * done with it. */
static void
job_deliver(sp_mailbox_msg_t *msg)
{
    sp_sched_job_t *j = (sp_sched_job_t *)((char *)msg - offsetof(sp_sched_job_t, msg));
    pthread_mutex_lock(&j->mu);
    char *buf = j->out;
    size_t len = j->out_len, cap = j->out_cap;
    j->out = j->in;
    j->out_cap = j->in_cap;
    j->out_len = 0;
    j->in = buf;
    j->in_cap = cap;
    j->queued = false;
    bool gone = j->consumer_gone;
    j->delivering = !gone;
    pthread_mutex_unlock(&j->mu);
    bool done = false;
    if (!gone) {
        done = deliver(j, buf, len);
    }
    pthread_mutex_lock(&j->mu);
    j->delivering = false;
    bool free_it = j->engine_done && !j->queued && (done || j->consumer_gone);
    pthread_mutex_unlock(&j->mu);
    if (free_it) {
        job_free(j);
    }
}

/* The mailbox is destroyed with the job still listed (at shutdown, after the
 * schedulers stopped): nobody reads its events any more; free it if the
 * engine is done with it, else the engine's DONE finds consumer_gone. */
static void
job_drop(sp_mailbox_msg_t *msg)
{
    sp_sched_job_t *j = (sp_sched_job_t *)((char *)msg - offsetof(sp_sched_job_t, msg));
    pthread_mutex_lock(&j->mu);
    j->queued = false;
    bool free_it = j->engine_done;
    j->consumer_gone = true;
    pthread_mutex_unlock(&j->mu);
    if (free_it) {
        job_free(j);
    }
}

void
sp_sched_cancel(sp_sched_job_t *j)
{
    if (j == NULL) {
        return;
    }
    atomic_store(&j->cancel, true);
    pthread_mutex_lock(&j->mu);
    j->consumer_gone = true;
    bool free_it = j->engine_done && !j->queued && !j->delivering;
    pthread_mutex_unlock(&j->mu);
    if (free_it) {
        job_free(j);
    }
}

/* ---------------------------------------------------------- engine: posting */

static bool
outbox_reserve(sp_sched_job_t *j, size_t need)
{
    if (need <= j->out_cap - j->out_len) {
        return true;
    }
    size_t cap = j->out_cap ? j->out_cap : 4096;
    while (cap - j->out_len < need) {
        cap *= 2;
    }
    char *p = sp_realloc(j->out, cap);
    if (p == NULL) {
        return false;
    }
    j->out = p;
    j->out_cap = cap;
    return true;
}

/* Append one record (header + payload) and make sure the loop will look. */
static void
post(sp_sched_t *s, sp_sched_job_t *j, rec_t *h, const void *payload, size_t payload_len)
{
    size_t size = (sizeof *h + payload_len + 7) & ~(size_t)7;
    h->size = (uint32_t)size;
    bool is_done = h->kind == SP_SCHED_EV_DONE;
    pthread_mutex_lock(&j->mu);
    if (!j->consumer_gone) {
        bool over = !is_done && j->out_len + size > s->p.max_outbox_bytes;
        if (over) {
            /* The loop does not drain this job: stop it rather than grow. */
            if (!j->overflowed) {
                j->overflowed = true;
                atomic_store(&j->cancel, true);
            }
        } else if (outbox_reserve(j, size)) {
            memcpy(j->out + j->out_len, h, sizeof *h);
            if (payload_len) {
                memcpy(j->out + j->out_len + sizeof *h, payload, payload_len);
            }
            j->out_len += size;
        }
    }
    if (is_done) {
        j->engine_done = true;
    }
    bool push = !j->queued && (j->out_len > 0 || is_done);
    if (push) {
        j->queued = true;
    }
    pthread_mutex_unlock(&j->mu);
    if (push) {
        sp_mailbox_send(j->mb, &j->msg);
    }
}

static char *
scratch(sp_sched_t *s, size_t n)
{
    if (n > s->scratch_cap) {
        char *p = sp_realloc(s->scratch, n);
        if (p == NULL) {
            return NULL;
        }
        s->scratch = p;
        s->scratch_cap = n;
    }
    return s->scratch;
}

static void
job_set_error(sp_sched_job_t *j, sp_status_t st, const char *msg)
{
    if (j->status == SP_OK) {
        j->status = st;
        snprintf(j->message, sizeof j->message, "%s", msg);
    }
}

/* A sequence ended (finished, failed, cancelled or never started). */
static void
seq_end(sp_sched_t *s, sp_sched_job_t *j)
{
    j->ended++;
    sp_drain_note(&s->drain, 1, sp_time_ns());
    if (j->ended < j->n) {
        return;
    }
    if (j->status == SP_OK && atomic_load(&j->cancel)) {
        job_set_error(j, SP_ERR_CANCELLED,
                      j->overflowed ? "the client does not read the response fast enough"
                                    : "cancelled");
    }
    if (j->status == SP_ERR_CANCELLED) {
        atomic_fetch_add(&s->st_cancelled, 1);
        SP_LOG_INFO("event=job_cancelled reason=%s prompt_tokens=%lld completion_tokens=%lld",
                    sp_log_str(j->message), (long long)j->prompt_tokens, (long long)j->completion_tokens);
    } else {
        atomic_fetch_add(&s->st_done, 1);
    }
    rec_t h = {0};
    h.kind = SP_SCHED_EV_DONE;
    h.index = -1;
    h.a = j->status;
    size_t ml = j->status != SP_OK ? strlen(j->message) + 1 : 0;
    h.b = (int32_t)ml;
    h.x = j->prompt_tokens;
    h.y = j->completion_tokens;
    int64_t now = sp_time_ns();
    h.q = (j->admit_ns ? j->admit_ns : now) - j->submit_ns;
    h.e = j->admit_ns ? now - j->admit_ns : 0;
    post(s, j, &h, j->message, ml);
}

static void
post_token(sp_sched_t *s, seq_t *sq, const sp_gen_token_t *t)
{
    sp_sched_job_t *j = sq->job;
    bool lp = j->gen.top_logprobs >= 0 && t->token >= 0;
    int n_top = lp ? t->n_top : -1;
    size_t need = t->text_len + (lp ? (size_t)(n_top + 1) * (sizeof(lp_rec_t) + LP_MAX_TEXT) : 0);
    char *buf = scratch(s, need + 1);
    if (buf == NULL) {
        return;
    }
    memcpy(buf, t->text, t->text_len);
    size_t off = t->text_len;
    for (int i = -1; lp && i < n_top; i++) {
        const sp_gen_logprob_t *g = i < 0 ? &t->chosen : &t->top[i];
        char piece[SP_TOKEN_MAX_BYTES];
        int32_t n = sp_tokenizer_piece(s->tok, g->token, true, piece, (int32_t)sizeof piece);
        if (n < 0) {
            n = 0;
        }
        if (n > LP_MAX_TEXT) {
            n = LP_MAX_TEXT;
        }
        lp_rec_t lr = {g->token, g->logprob, n};
        memcpy(buf + off, &lr, sizeof lr);
        memcpy(buf + off + sizeof lr, piece, (size_t)n);
        off += sizeof lr + (size_t)n;
    }
    rec_t h = {0};
    h.kind = SP_SCHED_EV_TOKEN;
    h.index = sq->index;
    h.a = t->token;
    h.b = (int32_t)t->text_len;
    h.c = n_top;
    post(s, j, &h, buf, off);
}

/* ------------------------------------------------------- engine: sequences */

static int64_t
blocks_for(int64_t n_tokens)
{
    return (n_tokens + SP_KV_BLOCK - 1) / SP_KV_BLOCK;
}

/* Where a sequence's prefix chain starts in the prefix cache: the root for
 * the base model and the shared scope, else a root of the adapter's own (its
 * process-wide id) and the request's prefix scope (its tenant, with
 * --prefix-cache-scope tenant) - block serials count up from 1 and never reach
 * bit 63 - so KV blocks computed with different adapters, or for different
 * tenants, are never shared: a tenant cannot time another's prompts. The
 * chained hash starts from both too, but the exact parent-serial match is
 * what guarantees it. */
static void
chain_root(const seq_t *sq, uint64_t *hash, uint64_t *serial)
{
    const sp_lora_t *l = sq->job->lora;
    uint64_t lid = l ? sp_lora_id(l) : 0, scope = sq->job->prefix_scope;
    *hash = lid * 0x9E3779B97F4A7C15ull ^ scope * 0xC2B2AE3D27D4EB4Full;
    *serial = lid || scope ? (1ull << 63) | lid << 16 | (scope & 0xFFFF) : SP_BLOCKS_ROOT;
}

/* Append a block to a sequence's table. The table was sized at submit for
 * the longest the sequence can get; past it the id would land in the next
 * sequence's table. */
static void
seq_push_block(seq_t *sq, int32_t id)
{
    SP_ASSERT(sq->n_blocks < sq->blocks_cap);
    sq->blocks[sq->n_blocks++] = id;
}

/* Release a sequence's blocks, last first: a chain's tail then becomes older
 * in the LRU than its head and is reclaimed first (a tail without its head can
 * never be matched again). */
static void
seq_drop_blocks(sp_sched_t *s, seq_t *sq)
{
    for (int64_t i = sq->n_blocks - 1; i >= 0; i--) {
        /* A block in a sequence's table is held: one at zero here would be
         * free (or another sequence's) while this one still wrote to it. */
        SP_ASSERT(sp_blocks_refcount(s->blocks, sq->blocks[i]) > 0);
        sp_blocks_unref(s->blocks, sq->blocks[i]);
    }
    if (s->swa_blocks != NULL) {
        sp_swa_release(s->swa_blocks, &sq->swa);
    }
    sq->n_blocks = 0;
    sq->n_computed = 0;
    sq->n_published = 0;
    chain_root(sq, &sq->chain_hash, &sq->chain_serial);
}

static void
running_add(sp_sched_t *s, seq_t *sq)
{
    /* The running set, the step's rows and run_tier are sized for these. */
    SP_ASSERT(s->n_running < s->p.n_slots);
    SP_ASSERT(sq->node.tier >= 0 && sq->node.tier < SP_TIER_COUNT);
    sq->d_slot = -1;
    sq->d_computed = 0;
    for (int i = 0; s->d_slot_used != NULL && i < s->p.n_slots; i++) {
        if (!s->d_slot_used[i]) {
            s->d_slot_used[i] = true;
            sq->d_slot = i;
            for (int64_t r = 0; r < s->d_ring; r++) {
                s->d_ring_entry[i * s->d_ring + r] = -1; /* nothing of this sequence yet */
            }
            break;
        }
    }
    s->running[s->n_running++] = sq;
    sq->running = true;
    sq->admit_serial = ++s->admit_counter;
    s->run_tier[sq->node.tier]++;
    atomic_fetch_add(&s->active_seqs, 1);
}

static void
running_remove(sp_sched_t *s, seq_t *sq)
{
    int i = 0;
    while (i < s->n_running && s->running[i] != sq) {
        i++;
    }
    if (i == s->n_running) {
        return;
    }
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
    sq->running = false;
    if (sq->d_slot >= 0) {
        s->d_slot_used[sq->d_slot] = false;
        sq->d_slot = -1;
        sq->d_computed = 0;
    }
    s->run_tier[sq->node.tier]--;
    atomic_fetch_sub(&s->active_seqs, 1);
}

/* A sequence ends (finished, failed, cancelled): its blocks go back at once. */
static void
seq_close(sp_sched_t *s, seq_t *sq)
{
    if (sq->ended) {
        return;
    }
    if (sq->running) {
        running_remove(s, sq);
    }
    seq_drop_blocks(s, sq);
    sq->ended = true;
    /* The one place a sequence ends: sp_sched_outstanding counts down here. */
    atomic_fetch_sub_explicit(&s->outstanding, 1, memory_order_relaxed);
    seq_end(s, sq->job);
}

static void
seq_finish(sp_sched_t *s, seq_t *sq, sp_finish_t finish)
{
    rec_t h = {0};
    h.kind = SP_SCHED_EV_FINISH;
    h.index = sq->index;
    h.a = finish;
    h.b = sq->gen ? sp_gen_n_generated(sq->gen) : 0;
    h.c = sq->gen && finish == SP_FINISH_STOP ? sp_gen_stop_index(sq->gen) : -1;
    post(s, sq->job, &h, NULL, 0);
    seq_close(s, sq);
}

static void
seq_fail(sp_sched_t *s, seq_t *sq, sp_status_t st, const char *msg)
{
    job_set_error(sq->job, st, msg);
    atomic_store(&sq->job->cancel, true); /* the job's other sequences stop too */
    seq_close(s, sq);
}

/* The running sequence to preempt: lowest tier (at most max_tier), latest
 * admitted. NULL when none qualifies. */
static seq_t *
pick_victim(sp_sched_t *s, int max_tier)
{
    seq_t *v = NULL;
    for (int i = 0; i < s->n_running; i++) {
        seq_t *c = s->running[i];
        if (c->node.tier > max_tier) {
            continue;
        }
        if (v == NULL || c->node.tier < v->node.tier ||
            (c->node.tier == v->node.tier && c->admit_serial > v->admit_serial)) {
            v = c;
        }
    }
    return v;
}

/* Preempt by recompute (s->mu held): blocks freed (full ones stay in the
 * prefix cache), tokens and sampler kept, back to the head of its tier. */
static void
preempt_locked(sp_sched_t *s, seq_t *sq)
{
    running_remove(s, sq);
    seq_drop_blocks(s, sq);
    sp_tierq_push_front(&s->queue, &sq->node, sq->node.tier);
    atomic_fetch_add(&s->st_preempt, 1);
    SP_LOG_DEBUG("event=preempt tier=%s tokens=%lld", sp_tierq_tier_name(sq->node.tier),
                 (long long)sq->n_tokens);
}

/* Full blocks of sq's tokens in the prefix cache, without taking them; the
 * last token is always left to compute (its logits are needed). With a
 * two-part pool, only as many as leave the window of the next token cached in
 * the sliding part too (sp_swa_usable_prefix); *n_global: the match in the
 * global part alone. *n_cached: how many of the global blocks taken are
 * unheld (their reuse takes them from the available). */
static int64_t
prefix_match(sp_sched_t *s, const seq_t *sq, int64_t *n_cached, int64_t *n_global)
{
    int64_t max = (sq->n_tokens - 1) / SP_KV_BLOCK, k = 0;
    uint64_t h, ser;
    chain_root(sq, &h, &ser);
    *n_cached = 0;
    for (; k < max; k++) {
        const int32_t *t = sq->tokens + k * SP_KV_BLOCK;
        uint64_t hh = sp_blocks_hash(h, t), ns = 0, sser = 0;
        int32_t id = sp_blocks_probe(s->blocks, hh, ser, t, &ns);
        if (id < 0) {
            break;
        }
        *n_cached += sp_blocks_refcount(s->blocks, id) == 0;
        if (s->swa_blocks != NULL) {
            s->swa_have[k] = sp_blocks_probe(s->swa_blocks, hh, ser, t, &sser) >= 0;
        }
        h = hh;
        ser = ns;
    }
    *n_global = k;
    if (s->swa_blocks == NULL) {
        return k;
    }
    const int64_t usable = sp_swa_usable_prefix(s->n_swa, k, s->swa_have);
    if (usable < k) {
        /* Count the unheld ones again over the shorter prefix. */
        *n_cached = 0;
        chain_root(sq, &h, &ser);
        for (int64_t i = 0; i < usable; i++) {
            const int32_t *t = sq->tokens + i * SP_KV_BLOCK;
            uint64_t hh = sp_blocks_hash(h, t), ns = 0;
            int32_t id = sp_blocks_probe(s->blocks, hh, ser, t, &ns);
            *n_cached += sp_blocks_refcount(s->blocks, id) == 0;
            h = hh;
            ser = ns;
        }
    }
    return usable;
}

/* Take sq's blocks (the caller checked there are enough): the prefix cache's
 * first, then new ones for all of its tokens (the sliding part's come per
 * step, plan_row). */
static void
seq_take_blocks(sp_sched_t *s, seq_t *sq)
{
    int64_t unheld, global;
    const int64_t max = prefix_match(s, sq, &unheld, &global);
    atomic_fetch_add(&s->st_swa_cut, global - max);
    const int64_t first = s->swa_blocks != NULL ? sp_swa_first(s->n_swa, max * SP_KV_BLOCK) : 0;
    int64_t k = 0;
    uint64_t h, ser;
    chain_root(sq, &h, &ser);
    if (s->swa_blocks != NULL) {
        sp_swa_trim(s->swa_blocks, &sq->swa, first); /* entries 0..first-1: -1 */
    }
    for (; k < max; k++) {
        const int32_t *t = sq->tokens + k * SP_KV_BLOCK;
        uint64_t hh = sp_blocks_hash(h, t), ns = 0, sser = 0;
        int32_t id = sp_blocks_lookup(s->blocks, hh, ser, t, &ns);
        SP_ASSERT(id >= 0); /* prefix_match just found it, and nothing ran since */
        sq->blocks[k] = id;
        if (s->swa_blocks != NULL && k >= first) {
            int32_t sid = sp_blocks_lookup(s->swa_blocks, hh, ser, t, &sser);
            SP_ASSERT(sid >= 0 && sq->swa.n == k);
            sq->swa.ids[sq->swa.n++] = sid;
        }
        h = hh;
        ser = ns;
    }
    sq->n_blocks = k;
    sq->n_published = k;
    sq->chain_hash = h;
    sq->chain_serial = ser;
    sq->n_computed = k * SP_KV_BLOCK;
    atomic_fetch_add(&s->st_prompt_cached, sq->n_computed);
    int64_t need = blocks_for(sq->n_tokens);
    while (sq->n_blocks < need) {
        int32_t id = sp_blocks_alloc(s->blocks);
        if (id < 0) {
            break; /* cannot happen after the check; the decode pass retries */
        }
        seq_push_block(sq, id);
    }
}

/* Tokens the running sequences still have to compute. */
static int64_t
pending_tokens(const sp_sched_t *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->n_running; i++) {
        n += s->running[i]->n_tokens - s->running[i]->n_computed;
    }
    return n;
}

/* Drop waiting sequences of cancelled or expired jobs (s->mu held). */
static void
sweep_queue(sp_sched_t *s, int64_t now)
{
    for (int t = 0; t < SP_TIER_COUNT; t++) {
        for (sp_tierq_node_t *n = s->queue.head[t], *next; n; n = next) {
            next = n->next;
            seq_t *sq = (seq_t *)n;
            sp_sched_job_t *j = sq->job;
            bool expired = j->deadline_ns && now > j->deadline_ns;
            if (atomic_load(&j->cancel) || expired) {
                sp_tierq_remove(&s->queue, n);
                if (expired) {
                    job_set_error(j, SP_ERR_CANCELLED, "request deadline exceeded");
                    atomic_store(&j->cancel, true);
                }
                seq_close(s, sq);
            }
        }
    }
}

static void
sweep_running(sp_sched_t *s, int64_t now)
{
    for (int i = 0; i < s->n_running;) {
        seq_t *sq = s->running[i];
        sp_sched_job_t *j = sq->job;
        if (atomic_load(&j->cancel)) {
            seq_close(s, sq);
        } else if (j->deadline_ns && now > j->deadline_ns) {
            seq_fail(s, sq, SP_ERR_CANCELLED, "request deadline exceeded");
        } else {
            i++;
        }
    }
}

/* Admit waiting sequences while there is room (s->mu held). */
static void
admit_locked(sp_sched_t *s, int64_t budget, seq_t **embed)
{
    char err[256];
    while (budget > 0) {
        sp_tierq_node_t *node = sp_tierq_peek(&s->queue);
        if (node == NULL) {
            break;
        }
        seq_t *sq = (seq_t *)node;
        if (sq->job->embed) {
            if (*embed) {
                break; /* one embedding per step */
            }
            sp_tierq_remove(&s->queue, node);
            *embed = sq;
            if (sq->job->admit_ns == 0) {
                sq->job->admit_ns = sp_time_ns();
            }
            continue;
        }
        int64_t cached_hits = 0, global = 0;
        /* The sliding part is sized for every slot's window (sched_plan), so
         * the slot count bounds it: only the global part is checked here. */
        int64_t hits = prefix_match(s, sq, &cached_hits, &global);
        int64_t need = blocks_for(sq->n_tokens) - hits;
        int64_t avail = sp_blocks_available(s->blocks) - cached_hits;
        if (s->n_running >= s->p.n_slots || avail < need) {
            /* Make room by preempting a lower tier, or wait. */
            seq_t *v = pick_victim(s, sq->node.tier - 1);
            if (v == NULL) {
                break;
            }
            preempt_locked(s, v);
            continue;
        }
        sp_tierq_remove(&s->queue, node);
        if (sq->gen == NULL) {
            sp_gen_params_t gp = sq->job->gen;
            gp.sampling.seed += (uint64_t)sq->index; /* n choices must differ */
            if (sp_gen_create(s->tok, &gp, &sq->gen, err, sizeof err) != SP_OK) {
                seq_fail(s, sq, SP_ERR_INVALID, err);
                continue;
            }
            sp_gen_accept_prompt(sq->gen, sq->tokens, sq->n_prompt);
        }
        if (!sq->counted) {
            sq->counted = true;
            sq->job->prompt_tokens += sq->n_prompt;
            atomic_fetch_add(&s->st_prompt, sq->n_prompt);
        }
        seq_take_blocks(s, sq);
        running_add(s, sq);
        if (sq->job->admit_ns == 0) {
            sq->job->admit_ns = sp_time_ns();
        }
        budget -= sq->n_tokens - sq->n_computed;
    }
}

/* Every running sequence gets the blocks for all of its tokens; when none is
 * left the lowest-tier, latest sequence is preempted (perhaps this one). A
 * sequence alone always fits (checked at submit), so this ends. */
static void
ensure_blocks(sp_sched_t *s)
{
restart:
    for (int i = 0; i < s->n_running; i++) {
        seq_t *sq = s->running[i];
        int64_t need = blocks_for(sq->n_tokens);
        while (sq->n_blocks < need) {
            int32_t id = sp_blocks_alloc(s->blocks);
            if (id >= 0) {
                seq_push_block(sq, id);
                continue;
            }
            seq_t *v = pick_victim(s, SP_TIER_COUNT);
            SP_ASSERT(v != NULL); /* every block is held by a running sequence */
            pthread_mutex_lock(&s->mu);
            preempt_locked(s, v);
            pthread_mutex_unlock(&s->mu);
            goto restart;
        }
    }
}

/* Plan a row of n tokens for sq (fewer when the sliding part is short of
 * blocks, which its size rules out: then as many as its blocks cover, or no
 * row). Returns the tokens planned. */
static int64_t
plan_row(sp_sched_t *s, seq_t *sq, int64_t n)
{
    /* At most one row per running sequence; the row's keys and values go to
     * positions n_computed .. n_computed + n - 1, which its block table must
     * cover, or the batch would write past its blocks. */
    SP_ASSERT(s->n_rows < s->p.n_slots);
    SP_ASSERT(n >= 1 && sq->n_computed + n <= sq->n_blocks * SP_KV_BLOCK);
    if (s->swa_blocks != NULL) {
        /* Release what the window left behind, take what the row writes. */
        sp_swa_trim(s->swa_blocks, &sq->swa, sp_swa_first(s->n_swa, sq->n_computed));
        if (!sp_swa_cover(s->swa_blocks, &sq->swa, blocks_for(sq->n_computed + n))) {
            n = sq->swa.n * SP_KV_BLOCK - sq->n_computed;
            s->swa_short = true;
            SP_LOG_WARN("event=kv_swa_short seq_tokens=%lld row=%lld", (long long)sq->n_tokens,
                        (long long)n);
            if (n < 1) {
                return 0;
            }
        }
    }
    sp_batch_seq_t *r = &s->rows[s->n_rows];
    r->tokens = sq->tokens + sq->n_computed;
    r->n_tokens = n;
    r->pos = sq->n_computed;
    r->blocks = sq->blocks;
    /* Two parts: the table's whole length, the sliding table after it. */
    r->n_blocks = s->swa_blocks != NULL ? sq->blocks_cap : sq->n_blocks;
    r->logits = sq->n_computed + n == sq->n_tokens;
    r->n_logits = 0;
    r->lora = sq->job->lora;
    s->step_seqs[s->n_rows++] = sq;
    return n;
}

/* ------------------------------------------------------ speculative decoding */

/*
 * Speculative decoding (p.draft): each step, every decoding sequence first has
 * the draft propose spec_k tokens greedily (the draft catches up on the tokens
 * it has not seen, then runs spec_k - 1 single-token steps, all sequences in
 * one draft batch per step), and the model then evaluates the sequence's last
 * token and the k proposals as one row of k + 1 tokens, keeping the logits of
 * every position.
 *
 * Verification runs the sequence's own sampler (sp_gen_step: penalties,
 * constraints, stop strings, logprobs, its random stream) on those logits in
 * order. Proposal j is accepted when the sampler picked exactly it, and the
 * first token it did not propose (or the token after the last proposal) ends
 * the row. The engine is batch invariant (the logits of a position do not
 * depend on the rows around it), so every sampled token is the one the model
 * alone would have sampled, from the same logits and the same random draws:
 * the output is identical to plain decoding, greedy or sampled, seed for
 * seed. With a greedy (one-hot) draft this is the standard acceptance rule:
 * accept x with probability p(x), else draw from p without x, renormalised.
 *
 * The model's cache positions after the first rejected proposal hold keys of
 * tokens that were not taken; n_computed stops before them, so they are
 * recomputed (overwritten) later. The draft keeps its own cache per running
 * sequence (a slot of blocks), valid up to the first token it got wrong.
 */

/* The draft's block table of a running sequence. */
static const int32_t *
draft_blocks(const sp_sched_t *s, const seq_t *sq)
{
    return s->d_block_ids + (int64_t)sq->d_slot * s->d_tab;
}

/* Before a draft step writing positions pos..pos+n-1 of sq: its ring's
 * sliding entries for that step (nothing to do without a ring). false when
 * the ring no longer holds the window of pos (a rewind further back than it
 * reaches; its size makes that impossible for the rewinds speculative
 * decoding does, this is the guard). */
static bool
draft_ring_step(sp_sched_t *s, const seq_t *sq, int64_t pos, int64_t n)
{
    if (s->d_ring == 0) {
        return true;
    }
    const int64_t slot = sq->d_slot;
    return sp_kv_ring_step(s->d_swa, s->d_ring, (int32_t)(slot * s->d_ring),
                           s->d_ring_entry + slot * s->d_ring,
                           s->d_block_ids + slot * s->d_tab + s->d_per_slot, s->d_per_slot, pos,
                           n);
}

/* Proposals per decoding sequence for this step: at most spec_k, within its
 * token and context capacity (the token after the last proposal must fit
 * too), within the step's rows, and within the blocks that are free (a
 * proposal never preempts anyone). */
static void
spec_plan(sp_sched_t *s)
{
    int64_t rows = 0;
    for (int i = 0; i < s->n_running; i++) {
        seq_t *sq = s->running[i];
        sq->spec_k = 0;
        rows += sq->n_tokens - sq->n_computed;
    }
    if (s->p.draft == NULL) {
        return;
    }
    for (int i = 0; i < s->n_running; i++) {
        seq_t *sq = s->running[i];
        if (sq->n_tokens - sq->n_computed != 1 || sq->d_slot < 0 || sq->gen == NULL) {
            continue;
        }
        int64_t k = s->p.spec_k;
        int64_t left = (int64_t)sq->job->gen.max_tokens - sp_gen_n_generated(sq->gen) - 1;
        k = k < left ? k : left;
        k = k < sq->cap - sq->n_tokens - 1 ? k : sq->cap - sq->n_tokens - 1;
        k = k < s->p.prefill_chunk - rows ? k : s->p.prefill_chunk - rows;
        while (k > 0 && sq->n_blocks < blocks_for(sq->n_tokens + k)) {
            int32_t id = sp_blocks_alloc(s->blocks);
            if (id < 0) {
                k = sq->n_blocks * SP_KV_BLOCK - sq->n_tokens; /* what the blocks hold */
                break;
            }
            seq_push_block(sq, id);
        }
        /* The proposals are written at tokens[n_tokens .. n_tokens + k). */
        SP_ASSERT(k <= 0 || sq->n_tokens + k < sq->cap);
        if (k > 0) {
            sq->spec_k = (int32_t)k;
            rows += k;
        }
    }
}

/* Give up proposing this step (a draft evaluation failed): plain decoding. */
static void
spec_cancel(sp_sched_t *s, sp_status_t st)
{
    for (int i = 0; i < s->n_running; i++) {
        s->running[i]->spec_k = 0;
        s->running[i]->d_computed = 0;
    }
    SP_LOG_WARN("event=draft_failed status=%d note=decoding without proposals this step", (int)st);
}

/* The draft's proposals for every sequence with spec_k > 0, written to
 * tokens[n_tokens .. n_tokens + spec_k). */
static void
draft_propose(sp_sched_t *s)
{
    const int64_t max_rows = s->p.prefill_chunk;
    int max_k = 0;
    for (int i = 0; i < s->n_running; i++) {
        max_k = s->running[i]->spec_k > max_k ? s->running[i]->spec_k : max_k;
    }
    if (max_k == 0) {
        return;
    }
    const int64_t n_vocab = s->n_vocab;
    /* Catch up: the tokens the draft has not seen, through the last one, whose
     * logits give the first proposal; in as many draft steps as the rows need. */
    for (;;) {
        int64_t rows = 0, n = 0;
        for (int i = 0; i < s->n_running && rows < max_rows; i++) {
            seq_t *sq = s->running[i];
            int64_t rem = sq->n_tokens - sq->d_computed;
            if (sq->spec_k == 0 || rem <= 0) {
                continue;
            }
            int64_t take = rem < max_rows - rows ? rem : max_rows - rows;
            if (!draft_ring_step(s, sq, sq->d_computed, take)) {
                /* the ring lost the window: the draft starts this sequence over */
                sq->d_computed = 0;
                rem = sq->n_tokens;
                take = rem < max_rows - rows ? rem : max_rows - rows;
                if (!draft_ring_step(s, sq, 0, take)) {
                    sq->spec_k = 0; /* not reached (the ring holds max_rows rows) */
                    continue;
                }
            }
            s->d_rows[n] = (sp_batch_seq_t){sq->tokens + sq->d_computed, take, sq->d_computed,
                                            draft_blocks(s, sq), s->d_per_slot,
                                            take == rem, 0, NULL};
            s->d_seqs[n++] = sq;
            rows += take;
        }
        if (n == 0) {
            break;
        }
        sp_status_t st = sp_batch_eval(s->d_batch, s->d_kv, s->d_rows, n);
        if (st != SP_OK) {
            spec_cancel(s, st);
            return;
        }
        for (int64_t r = 0; r < n; r++) {
            seq_t *sq = s->d_seqs[r];
            sq->d_computed += s->d_rows[r].n_tokens;
            if (s->d_rows[r].logits) {
                sq->tokens[sq->n_tokens] = sp_argmax(sp_batch_logits(s->d_batch, r), n_vocab);
            }
        }
    }
    /* Then one proposal per draft step. */
    for (int j = 1; j < max_k; j++) {
        int64_t n = 0;
        for (int i = 0; i < s->n_running; i++) {
            seq_t *sq = s->running[i];
            if (sq->spec_k <= j) {
                continue;
            }
            int64_t at = sq->n_tokens + j - 1; /* proposal j - 1's index and position */
            if (!draft_ring_step(s, sq, at, 1)) {
                sq->spec_k = j; /* not reached: the proposals so far stand */
                continue;
            }
            s->d_rows[n] = (sp_batch_seq_t){sq->tokens + at, 1, at, draft_blocks(s, sq),
                                            s->d_per_slot, true, 0, NULL};
            s->d_seqs[n++] = sq;
        }
        sp_status_t st = sp_batch_eval(s->d_batch, s->d_kv, s->d_rows, n);
        if (st != SP_OK) {
            spec_cancel(s, st);
            return;
        }
        for (int64_t r = 0; r < n; r++) {
            seq_t *sq = s->d_seqs[r];
            sq->d_computed = sq->n_tokens + j;
            sq->tokens[sq->n_tokens + j] = sp_argmax(sp_batch_logits(s->d_batch, r), n_vocab);
        }
    }
}

/* Decode rows first (one token each), then prefill chunks in admission
 * order under the step's token budget: --step-tokens less the decode rows,
 * and no more than the adaptive prefill budget (stepctl.h; the whole step
 * budget when it is off). Decode rows are never cut. */
static int64_t
plan_step(sp_sched_t *s)
{
    int64_t budget = s->p.prefill_chunk;
    s->n_rows = 0;
    for (int i = 0; i < s->n_running; i++) {
        seq_t *sq = s->running[i];
        if (sq->n_tokens - sq->n_computed == 1 && sq->spec_k > 0) {
            /* The last token and the draft's proposals after it (already in
             * tokens[n_tokens..]), with the logits of every one. */
            int64_t n = plan_row(s, sq, 1 + sq->spec_k);
            if (n < 1 + sq->spec_k) {
                /* Fewer proposals fit the sliding part: the draft's cache
                 * keeps the real tokens only. */
                sq->spec_k = (int32_t)(n > 0 ? n - 1 : 0);
                sq->d_computed = sq->d_computed < sq->n_tokens ? sq->d_computed : sq->n_tokens;
            }
            if (n > 0) {
                s->rows[s->n_rows - 1].logits = true;
                s->rows[s->n_rows - 1].n_logits = (int32_t)n;
                budget -= n;
            }
        } else if (sq->n_tokens - sq->n_computed == 1) {
            budget -= plan_row(s, sq, 1);
        }
    }
    s->step_decode = s->n_rows;
    int64_t prefill = budget < s->ctl.budget ? budget : s->ctl.budget;
    int64_t left = prefill;
    for (int i = 0; i < s->n_running && left > 0; i++) {
        seq_t *sq = s->running[i];
        int64_t rem = sq->n_tokens - sq->n_computed;
        if (rem > 1) {
            int64_t n = rem < left ? rem : left;
            left -= plan_row(s, sq, n);
        }
    }
    s->step_filled = prefill > 0 && left == 0;
    return s->step_decode + prefill - left;
}

/* Publish the sequence's newly full blocks in the prefix cache. */
static void
publish_blocks(sp_sched_t *s, seq_t *sq)
{
    while ((sq->n_published + 1) * SP_KV_BLOCK <= sq->n_computed) {
        int64_t k = sq->n_published;
        const int32_t *t = sq->tokens + k * SP_KV_BLOCK;
        uint64_t hh = sp_blocks_hash(sq->chain_hash, t);
        if (s->swa_blocks != NULL && k >= sq->swa.lo && k < sq->swa.n && sq->swa.ids[k] >= 0) {
            /* Under the same key as its global block: the global chain's
             * serials prove the prefix for both. */
            (void)sp_blocks_publish(s->swa_blocks, sq->swa.ids[k], hh, sq->chain_serial, t);
        }
        sq->chain_serial = sp_blocks_publish(s->blocks, sq->blocks[k], hh, sq->chain_serial, t);
        sq->chain_hash = hh;
        sq->n_published++;
    }
}

/* One sampled token: count it and send it. */
static void
emit_token(sp_sched_t *s, seq_t *sq, const sp_gen_token_t *t)
{
    if (t->token >= 0) {
        sq->job->completion_tokens++;
        atomic_fetch_add(&s->st_tokens, 1);
    }
    if (t->token >= 0 || t->text_len > 0) {
        post_token(s, sq, t);
    }
}

/* A verification row (see "Speculative decoding"): sample position by
 * position while the sampler picks the draft's proposals. */
static void
finish_spec_row(sp_sched_t *s, int64_t i)
{
    seq_t *sq = s->step_seqs[i];
    const int64_t base = sq->n_tokens; /* index of the first proposal */
    const int64_t k = s->rows[i].n_tokens - 1;
    int64_t acc = 0;
    atomic_fetch_add(&s->st_spec_rows, 1);
    atomic_fetch_add(&s->st_spec_drafted, k);
    for (int64_t at = 0; at <= k; at++) {
        memcpy(s->logits, sp_batch_logits_at(s->batch, i, at), (size_t)s->n_vocab * sizeof(float));
        sp_gen_token_t t;
        sp_status_t st = sp_gen_step(sq->gen, s->logits, &t);
        /* Positions base - 1 .. base + at - 1 hold the tokens taken so far. */
        sq->n_computed = base + at;
        if (st != SP_OK) {
            seq_fail(s, sq, st, sp_gen_error(sq->gen));
            return;
        }
        emit_token(s, sq, &t);
        if (t.finish != SP_FINISH_NONE) {
            publish_blocks(s, sq);
            atomic_fetch_add(&s->st_spec_accepted, acc);
            seq_finish(s, sq, t.finish);
            return;
        }
        if (at < k && t.token == sq->tokens[base + at]) {
            acc++; /* the proposal, already in place */
            continue;
        }
        sq->n_tokens = base + at; /* drop the proposals from here on */
        if (sq->n_tokens >= sq->cap) {
            publish_blocks(s, sq);
            atomic_fetch_add(&s->st_spec_accepted, acc);
            seq_finish(s, sq, SP_FINISH_LENGTH);
            return;
        }
        sq->tokens[sq->n_tokens++] = t.token;
        break;
    }
    atomic_fetch_add(&s->st_spec_accepted, acc);
    /* The draft saw proposals up to base + k - 2; it is right up to the first
     * token it did not propose. */
    if (sq->d_computed > base + acc) {
        sq->d_computed = base + acc;
    }
    publish_blocks(s, sq);
}

/*
 * Sampling a step's rows in parallel. Each row with logits belongs to its
 * own sequence and sp_gen_t, and sp_gen_step of a plain generation touches
 * only that (sp_gen_step_is_private), so the rows' sp_gen_step calls - the
 * penalties, the max, the softmax over the whole vocabulary, the draw, the
 * detokenising and the stop strings - run on the batch's threads instead of
 * on the engine thread alone while the others wait (at 32 rows and a 32k
 * vocabulary that serial part was several ms a step). Each generation's
 * state and random stream see exactly the calls they saw in row order, so
 * every token is the one the serial loop gave. Posting the tokens, the
 * blocks and the finishing stay serial, in row order, in finish_row.
 */
static void
presample_job(void *arg, int64_t item, int ith)
{
    sp_sched_t *s = arg;
    const int32_t i = s->pre_rows[item];
    float *scratch = s->logits + (size_t)ith * (size_t)s->n_vocab;
    memcpy(scratch, sp_batch_logits(s->batch, i), (size_t)s->n_vocab * sizeof(float));
    s->pre_st[i] = sp_gen_step(s->step_seqs[i]->gen, scratch, &s->pre_tok[i]);
    s->pre_done[i] = true;
}

/* The rows finish_row would sample from the whole row of logits with a
 * private generation, sampled now on the batch's threads (when two or more). */
static void
presample(sp_sched_t *s, int64_t n_seqs)
{
    s->n_pre = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        s->pre_done[i] = false;
        const sp_batch_seq_t *r = &s->rows[i];
        const int32_t *ids;
        const float *vals;
        /* finish_row's conditions for its sp_gen_step path: logits kept for
         * one position, the whole row (no candidates from the device) */
        if (r->logits && r->n_logits <= 1 && sp_batch_candidates(s->batch, i, &ids, &vals) == 0 &&
            sp_gen_step_is_private(s->step_seqs[i]->gen)) {
            s->pre_rows[s->n_pre++] = (int32_t)i;
        }
    }
    SP_ASSERT(sp_batch_n_threads(s->batch) <= s->n_threads); /* a scratch row each */
    if (s->n_pre >= 2 && sp_batch_n_threads(s->batch) > 1) {
        sp_batch_parallel(s->batch, "sample", presample_job, s, s->n_pre);
    }
}

/* After the step: publish newly full blocks, sample where the logits are. */
static void
finish_row(sp_sched_t *s, int64_t i)
{
    seq_t *sq = s->step_seqs[i];
    if (s->rows[i].n_logits > 1) {
        finish_spec_row(s, i);
        return;
    }
    sq->n_computed += s->rows[i].n_tokens;
    publish_blocks(s, sq);
    if (!s->rows[i].logits) {
        return;
    }
    const int32_t *ids;
    const float *vals;
    const int32_t k = sp_batch_candidates(s->batch, i, &ids, &vals);
    sp_gen_token_t t;
    sp_status_t st;
    if (s->pre_done[i]) { /* sampled on the batch's threads (presample) */
        t = s->pre_tok[i];
        st = s->pre_st[i];
    } else if (k > 0) { /* the GPU sent its best logits only (docs/cuda.md "Candidates") */
        st = sp_gen_step_candidates(sq->gen, ids, vals, k, &t);
    } else {
        memcpy(s->logits, sp_batch_logits(s->batch, i), (size_t)s->n_vocab * sizeof(float));
        st = sp_gen_step(sq->gen, s->logits, &t);
    }
    if (st != SP_OK) {
        seq_fail(s, sq, st, sp_gen_error(sq->gen));
        return;
    }
    emit_token(s, sq, &t);
    if (t.finish != SP_FINISH_NONE) {
        seq_finish(s, sq, t.finish);
    } else if (sq->n_tokens >= sq->cap) {
        seq_finish(s, sq, SP_FINISH_LENGTH);
    } else {
        sq->tokens[sq->n_tokens++] = t.token;
    }
}

static void
run_embed(sp_sched_t *s, seq_t *sq)
{
    sp_sched_job_t *j = sq->job;
    if (atomic_load(&j->cancel)) {
        seq_close(s, sq);
        return;
    }
    sp_status_t st = sp_ctx_embed(s->embed_ctx, sq->tokens, sq->n_prompt, s->emb);
    if (st == SP_OK && sp_gguf_weights_changed(sp_model_gguf(s->m))) {
        /* As after a step: weights changed under the embedding, the answer is dropped. */
        seq_fail(s, sq, SP_ERR_IO, "the model file changed on disk while it was served: the "
                 "answer is dropped and the model reloads (retry)");
        return;
    }
    if (st != SP_OK) {
        seq_fail(s, sq, st, "embedding failed");
        return;
    }
    j->prompt_tokens += sq->n_prompt;
    atomic_fetch_add(&s->st_prompt, sq->n_prompt);
    rec_t h = {0};
    h.kind = SP_SCHED_EV_EMBEDDING;
    h.index = sq->index;
    h.a = s->n_embd;
    post(s, j, &h, s->emb, (size_t)s->n_embd * sizeof(float));
    seq_close(s, sq);
}

static void
step_stats(sp_sched_t *s, int64_t rows, int64_t seqs)
{
    pthread_mutex_lock(&s->mu);
    sp_blocks_get_stats(s->blocks, &s->bstats);
    if (s->swa_blocks != NULL) {
        sp_blocks_get_stats(s->swa_blocks, &s->swa_bstats);
    }
    if (seqs > 0) {
        s->steps++;
        s->step_rows_total += rows;
        s->step_seqs_total += seqs;
        s->last_step_rows = rows;
        s->last_step_seqs = seqs;
        int b = 0;
        while (b < SP_SCHED_BATCH_BUCKETS && seqs > (int64_t)1 << b) {
            b++;
        }
        s->batch_hist[b]++;
    }
    s->st_budget = s->ctl.budget;
    s->st_p99_ns = s->ctl.p99_ns;
    s->st_decreases = s->ctl.decreases;
    s->st_increases = s->ctl.increases;
    int64_t steps = s->steps;
    pthread_mutex_unlock(&s->mu);
    if (seqs > 0 && steps % STATS_LOG_EVERY == 0) {
        SP_LOG_DEBUG("event=sched_stats steps=%lld running=%d waiting=%lld kv_used=%lld kv_cached=%lld "
                     "kv_total=%lld prefix_hits=%lld prefix_lookups=%lld preemptions=%lld rows=%lld",
                     (long long)steps, s->n_running, (long long)sp_tierq_total(&s->queue),
                     (long long)s->bstats.n_held, (long long)s->bstats.n_cached,
                     (long long)s->bstats.n_blocks, (long long)s->bstats.hits,
                     (long long)s->bstats.lookups, (long long)atomic_load(&s->st_preempt),
                     (long long)rows);
    }
}

/* ---------------------------------------------------------- engine: thread */

static void
engine_step(sp_sched_t *s)
{
    seq_t *embed = NULL;
    int64_t now = sp_time_ns();
    sweep_running(s, now);
    /* Admit for what this step can carry: the running sequences' decode rows
     * plus the prefill budget, within --step-tokens. */
    int64_t cap = (int64_t)s->n_running + s->ctl.budget;
    int64_t budget = (cap < s->p.prefill_chunk ? cap : s->p.prefill_chunk) - pending_tokens(s);
    pthread_mutex_lock(&s->mu);
    sweep_queue(s, now);
    if (budget > 0) {
        admit_locked(s, budget, &embed);
    }
    pthread_mutex_unlock(&s->mu);
    ensure_blocks(s);
    spec_plan(s);
    draft_propose(s);
    s->swa_short = false;
    int64_t rows = plan_step(s);
    int64_t n_seqs = s->n_rows;
    if (n_seqs == 0 && s->swa_short && s->n_running > 1) {
        /* No running sequence got sliding blocks (the sizing rules this out):
         * free some rather than wait for nothing. */
        pthread_mutex_lock(&s->mu);
        preempt_locked(s, pick_victim(s, SP_TIER_COUNT));
        pthread_mutex_unlock(&s->mu);
    }
    if (n_seqs > 0) {
        for (int64_t i = 0; i < n_seqs; i++) {
            s->cand_k[i] = s->rows[i].logits && s->rows[i].n_logits <= 1
                               ? sp_gen_candidates(s->step_seqs[i]->gen)
                               : 0;
        }
        sp_status_t st = sp_batch_eval_cand(s->batch, s->kv, s->rows, n_seqs, s->cand_k);
        /* A mapped model file cut or written during the step: its logits are
         * not the model's, so the step's requests fail (the manager reloads). */
        bool file_changed = st == SP_OK && sp_gguf_weights_changed(sp_model_gguf(s->m));
        if (file_changed) {
            st = SP_ERR_IO;
        }
        if (st != SP_OK) {
            for (int64_t i = 0; i < n_seqs; i++) {
                if (!s->step_seqs[i]->ended) {
                    seq_fail(s, s->step_seqs[i], st,
                             file_changed
                                 ? "the model file changed on disk while it was served: the answer "
                                   "is dropped and the model reloads (retry)"
                             : st == SP_ERR_DEVICE
                                 ? "token evaluation failed: a CUDA error on the model's GPU (the "
                                   "device is marked unhealthy; the server log has the driver's "
                                   "message)"
                                 : "token evaluation failed");
                }
            }
            SP_LOG_ERROR("event=step_failed status=%d rows=%lld seqs=%lld", (int)st,
                         (long long)rows, (long long)n_seqs);
        } else {
            presample(s, n_seqs);
            for (int64_t i = 0; i < n_seqs; i++) {
                finish_row(s, i);
            }
        }
    }
    if (embed) {
        run_embed(s, embed);
    }
    /* The step's wall time is the inter-token time of every stream in it. */
    if (n_seqs > 0 && s->step_decode > 0) {
        sp_stepctl_observe(&s->ctl, sp_time_ns() - now, s->step_filled);
    }
    step_stats(s, rows, n_seqs);
}

static void *
engine_main(void *arg)
{
    sp_sched_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->n_running == 0 && sp_tierq_total(&s->queue) == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->stop) {
            break;
        }
        pthread_mutex_unlock(&s->mu);
        engine_step(s);
        pthread_mutex_lock(&s->mu);
    }
    /* Stopping: everything still here ends as cancelled. */
    for (sp_tierq_node_t *n; (n = sp_tierq_peek(&s->queue)) != NULL;) {
        seq_t *sq = (seq_t *)n;
        sp_tierq_remove(&s->queue, n);
        job_set_error(sq->job, SP_ERR_CANCELLED, "server shutting down");
        atomic_store(&sq->job->cancel, true);
        seq_close(s, sq);
    }
    pthread_mutex_unlock(&s->mu);
    while (s->n_running > 0) {
        seq_fail(s, s->running[0], SP_ERR_CANCELLED, "server shutting down");
    }
    return NULL;
}

/* ------------------------------------------------------------- public API */

/*
 * The sizes a scheduler is built with, decided in one place for sp_sched_create
 * and sp_sched_estimate: the context length (the embedding context's rule), the
 * KV pool size, and the parameters of the three engine objects. Every check of
 * the parameters happens here, with the errors create has always given, so an
 * estimate fails exactly where a create would (short of memory).
 */
typedef struct sched_plan {
    int prefill_chunk;      /* raised to n_slots */
    int64_t n_ctx;
    int64_t nb;             /* KV pool blocks (of a two-part pool: the global part) */
    int64_t nb_swa;         /* the sliding part's blocks; 0: one part */
    sp_ctx_params_t cp;     /* the embedding context */
    sp_kv_pool_params_t kp; /* the shared KV pool */
    sp_batch_params_t bp;   /* the step batch */
    int n_threads;          /* its threads, resolved */
    /* speculative decoding: the draft's cache (a slot per sequence) and batch */
    int64_t d_per_slot;
    int64_t d_ring; /* sliding ring blocks per slot (a two-part draft cache), or 0 */
    sp_kv_pool_params_t dkp;
    sp_batch_params_t dbp;
} sched_plan_t;

static sp_status_t
sched_plan(const sp_model_t *m, const sp_sched_params_t *p, sched_plan_t *o, char *err,
           size_t err_len)
{
    if (p->n_slots < 1 || p->n_slots > 256 || p->max_queue < 0 || p->prefill_chunk < 1 ||
        p->kv_blocks < 0 || !(p->tpot_target_ms >= 0 && p->tpot_target_ms <= 1e9)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "scheduler: parallel must be 1..256, step tokens >= 1, kv blocks >= 0, "
                       "tpot target 0..1e9 ms");
    }
    /* Every running sequence decodes one row per step: the budget holds them all. */
    o->prefill_chunk = p->prefill_chunk < p->n_slots ? p->n_slots : p->prefill_chunk;
    /* The context length is the embedding context's (the model's, capped). */
    o->cp = sp_ctx_default_params();
    o->cp.n_ctx = p->n_ctx;
    o->cp.n_threads = p->n_threads;
    sp_ctx_params_t rc;
    sp_status_t st = sp_ctx_resolve(m, &o->cp, &rc, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    o->n_ctx = rc.n_ctx;
    const int64_t per_seq = blocks_for(o->n_ctx);
    if ((unsigned)p->kv_type >= SP_KV_TYPE_COUNT) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "scheduler: unknown kv cache type %d",
                       (int)p->kv_type);
    }
    if (p->kv_type == SP_KV_TYPE_Q8_0 &&
        (sp_gpu_model_layers(m) > 0 || (p->draft != NULL && sp_gpu_model_layers(p->draft) > 0))) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "kv cache type q8_0 runs on the CPU only: this model has GPU layers "
                       "(use kv cache type f16 or f32 with GPU layers)");
    }
    const size_t bb = sp_kv_block_bytes(m, p->kv_type);
    int64_t nb = p->kv_blocks;
    if (nb == 0 && sp_model_is_encoder(m)) {
        nb = 1; /* an encoder never generates: its jobs run on the embedding context */
    } else if (nb == 0) {
        /* Default: every slot's full context, within 2 GiB, at least one context. */
        nb = per_seq * p->n_slots;
        int64_t cap = bb ? (int64_t)(((size_t)2 << 30) / bb) : nb;
        if (nb > cap) {
            nb = cap > per_seq ? cap : per_seq;
        }
    }
    if (nb > INT32_MAX / 2) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "scheduler: kv blocks %lld is too many",
                       (long long)nb);
    }
    o->nb_swa = 0;
    const size_t swa_bb = sp_kv_swa_block_bytes(m, p->kv_type);
    if (!p->kv_swa_full && swa_bb > 0 && !sp_model_is_encoder(m)) {
        /* Two parts in the memory of nb whole blocks: per slot the window's
         * blocks, the block a row's first position straddles, and the most
         * positions one row can add past them (a speculative row's), plus a
         * step's rows (--step-tokens) across all slots; the global part gets
         * the rest. Only when that holds more positions than nb whole
         * blocks (a window well under the context). */
        const int64_t W = sp_model_hparams(m)->n_swa;
        const int64_t ns = (int64_t)p->n_slots * (blocks_for(W) + 2 + blocks_for(SP_SCHED_MAX_SPEC)) +
                           blocks_for(o->prefill_chunk);
        const size_t g_bb = bb - swa_bb;
        if (ns < nb) {
            /* (nb bb - ns swa_bb) / g_bb, in doubles: nb < 2^30, bb < 2^40. */
            double ng = g_bb > 0 ? ((double)nb * (double)bb - (double)ns * (double)swa_bb) /
                                       (double)g_bb
                                 : (double)(per_seq * p->n_slots);
            ng = ng < (double)(INT32_MAX / 2) ? ng : (double)(INT32_MAX / 2);
            if (ng > (double)nb) {
                nb = (int64_t)ng;
                o->nb_swa = ns;
            }
        }
    }
    o->nb = nb;
    o->kp = (sp_kv_pool_params_t){.n_blocks = nb, .type = p->kv_type};
    if (sp_kv_pool_bytes_split(m, &o->kp, o->nb_swa) == 0) {
        /* The only refusal left for 1 <= nb < 2^30: sp_kv_pool_create's words. */
        return sp_errf(err, err_len, SP_ERR_INVALID, "kv pool: %lld blocks of %zu bytes overflow",
                       (long long)nb, bb);
    }
    o->bp = sp_batch_default_params();
    o->bp.max_tokens = o->prefill_chunk;
    o->bp.max_seqs = p->n_slots;
    o->bp.max_ctx = o->n_ctx;
    o->bp.n_threads = p->n_threads;
    sp_batch_params_t rb;
    if (p->draft == NULL) {
        st = sp_batch_resolve(m, &o->bp, &rb, err, err_len);
        o->n_threads = rb.n_threads;
        return st;
    }
    /* Speculative decoding: room for every kept logit row of a step, a draft
     * that speaks the same vocabulary, CPU layers. */
    if (p->spec_k < 1 || p->spec_k > SP_SCHED_MAX_SPEC) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "speculative decoding: num_speculative_tokens must be 1..%d, got %d",
                       SP_SCHED_MAX_SPEC, p->spec_k);
    }
    const sp_tokenizer_t *ta = sp_model_tokenizer(m), *tb = sp_model_tokenizer(p->draft);
    int32_t nv = sp_tokenizer_n_vocab(ta);
    if (sp_tokenizer_n_vocab(tb) != nv || sp_model_hparams(p->draft)->n_vocab != sp_model_hparams(m)->n_vocab) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "speculative decoding: the draft model's vocabulary (%d tokens) is not "
                       "the model's (%d)", sp_tokenizer_n_vocab(tb), nv);
    }
    for (int32_t id = 0; id < nv; id++) {
        sp_str_t x = sp_tokenizer_token_text(ta, id), y = sp_tokenizer_token_text(tb, id);
        if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len) != 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "speculative decoding: token %d differs between the model and the "
                           "draft model (not the same vocabulary)", (int)id);
        }
    }
    if (sp_gpu_model_layers(m) > 0 || sp_gpu_model_layers(p->draft) > 0) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "speculative decoding runs on the CPU only for now (gpu layers)");
    }
    o->bp.max_logits = (int64_t)p->n_slots * (1 + p->spec_k);
    if ((st = sp_batch_resolve(m, &o->bp, &rb, err, err_len)) != SP_OK) {
        return st;
    }
    o->n_threads = rb.n_threads;
    o->d_per_slot = per_seq;
    o->dkp = (sp_kv_pool_params_t){.n_blocks = per_seq * p->n_slots, .type = p->kv_type};
    /* A draft with sliding-window layers keeps a ring per slot for them (as
     * sp_ctx does: the rows of one draft step and the window of its first),
     * when that is smaller than a whole slot; --kv-swa-full keeps whole slots. */
    o->d_ring = 0;
    if (!p->kv_swa_full && !sp_model_is_encoder(p->draft) &&
        sp_kv_swa_block_bytes(p->draft, p->kv_type) > 0) {
        const int64_t ring = sp_kv_ring_blocks(sp_model_hparams(p->draft)->n_swa, o->prefill_chunk);
        o->d_ring = ring < per_seq ? ring : 0;
    }
    o->dbp = sp_batch_default_params();
    o->dbp.max_tokens = o->prefill_chunk;
    o->dbp.max_seqs = p->n_slots;
    o->dbp.max_ctx = o->n_ctx;
    o->dbp.n_threads = p->n_threads;
    return sp_batch_resolve(p->draft, &o->dbp, &rb, err, err_len);
}

/* Heap bytes sp_gen_vocab_create(tok) keeps. engine/gen.c keeps its types
 * private and has no size helper, so this follows its allocations by hand:
 * the object (bounded by 128 bytes; about 56), n + 1 uint32 offsets, the bytes
 * of every piece (summed here exactly), and two arrays of 16-byte sorted
 * pieces: all n, and the pieces that are not safe inside a JSON string,
 * bounded here by n (counting them needs gen.c's JSON scanner). The two
 * sort buffers (2 x 24 bytes per token) are freed before create returns. */
static uint64_t
vocab_bytes(const sp_tokenizer_t *tok)
{
    const uint64_t n = (uint64_t)sp_tokenizer_n_vocab(tok);
    const uint64_t piece = 16; /* sizeof(sorted_piece_t) in gen.c */
    uint64_t text = 0;
    for (int32_t id = 0; id < (int32_t)n; id++) {
        int32_t k = sp_tokenizer_piece(tok, id, false, NULL, 0);
        text += k > 0 ? (uint64_t)k : 0;
    }
    return 128 + (n + 1) * sizeof(uint32_t) + (text > 0 ? text : 1) + 2 * (n * piece + 1);
}

/* Heap bytes sp_blocks_create(nb) keeps (sched/blocks.c, by hand as above):
 * per block a reference count (4), serial, hash and parent (3 x 8), the
 * SP_KV_BLOCK token ids (4 each), a hash-chain link, two LRU links and a
 * free-stack entry (4 x 4); the hash heads, a power of two >= max(16, nb) of 4
 * bytes; the object, bounded by 256 bytes (about 150). */
static uint64_t
blocks_bytes(int64_t nb)
{
    uint64_t heads = 16;
    while (heads < (uint64_t)nb) {
        heads <<= 1;
    }
    return 256 + (uint64_t)nb * (4 + 3 * 8 + SP_KV_BLOCK * 4 + 4 * 4) + heads * 4;
}

static uint64_t
add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

sp_status_t
sp_sched_estimate(const sp_model_t *m, const sp_sched_params_t *p, sp_sched_mem_t *out, char *err,
                  size_t err_len)
{
    memset(out, 0, sizeof *out);
    sched_plan_t pl;
    sp_status_t st = sched_plan(m, p, &pl, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    const sp_hparams_t *hp = sp_model_hparams(m);
    /* The same allocations as sp_sched_create, in its order. The sizes of the
     * engine objects come from their own layout code (sp_*_bytes: SIZE_MAX on
     * an overflow, which saturates the total). */
    const uint64_t parts[] = {
        sizeof(sp_sched_t),
        vocab_bytes(sp_model_tokenizer(m)),
        (uint64_t)p->n_slots * (2 * sizeof(seq_t *) + sizeof(sp_batch_seq_t) +
                                sizeof(int32_t)), /* running, step_seqs, rows, cand_k */
        (uint64_t)p->n_slots * (sizeof(int32_t) + sizeof(sp_gen_token_t) + sizeof(sp_status_t) +
                                sizeof(bool)), /* pre_rows, pre_tok, pre_st, pre_done */
        (uint64_t)pl.n_threads * (uint64_t)hp->n_vocab * sizeof(float), /* logits */
        (uint64_t)hp->n_embd * sizeof(float),  /* emb */
        sp_ctx_bytes(m, &pl.cp),
        blocks_bytes(pl.nb),
        pl.nb_swa > 0 ? blocks_bytes(pl.nb_swa) : 0,
        (uint64_t)(pl.nb_swa > 0 ? blocks_for(pl.n_ctx) : 0), /* swa_have */
        sp_batch_bytes(m, &pl.bp),
    };
    uint64_t scratch = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        scratch = add_sat(scratch, parts[i] == SIZE_MAX ? UINT64_MAX : parts[i]);
    }
    if (p->draft != NULL) {
        const uint64_t dparts[] = {
            sp_kv_pool_bytes_split(p->draft, &pl.dkp, pl.d_ring * p->n_slots),
            sp_batch_bytes(p->draft, &pl.dbp),
            (uint64_t)p->n_slots * (sizeof(sp_batch_seq_t) + sizeof(seq_t *) + sizeof(bool)),
            (uint64_t)(pl.d_per_slot * (pl.d_ring > 0 ? 2 : 1) * p->n_slots) * sizeof(int32_t),
            (uint64_t)(pl.d_ring * p->n_slots) * sizeof(int64_t),
        };
        for (size_t i = 0; i < sizeof dparts / sizeof dparts[0]; i++) {
            scratch = add_sat(scratch, dparts[i] == SIZE_MAX ? UINT64_MAX : dparts[i]);
        }
    }
    out->n_ctx = pl.n_ctx;
    out->kv_blocks = pl.nb;
    out->kv_swa_blocks = pl.nb_swa;
    out->kv_bytes = sp_kv_pool_bytes_split(m, &pl.kp, pl.nb_swa);
    out->kv_gpu_bytes = sp_gpu_kv_bytes_split(m, sp_gpu_model_layers(m), pl.nb, pl.nb_swa,
                                              p->kv_type == SP_KV_TYPE_F16);
    out->scratch_bytes = scratch;
    return SP_OK;
}

sp_status_t
sp_sched_create(const sp_model_t *m, const sp_sched_params_t *p, sp_sched_t **out, char *err,
                size_t err_len)
{
    *out = NULL;
    sched_plan_t pl;
    sp_status_t st = sched_plan(m, p, &pl, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    sp_sched_t *s = sp_calloc(1, sizeof *s);
    if (s == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "scheduler: out of memory");
    }
    s->m = m;
    s->tok = sp_model_tokenizer(m);
    s->p = *p;
    s->p.prefill_chunk = pl.prefill_chunk;
    s->n_ctx = pl.n_ctx;
    const sp_hparams_t *hp = sp_model_hparams(m);
    s->n_vocab = (int32_t)hp->n_vocab;
    s->n_embd = (int32_t)hp->n_embd;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int64_t caps[SP_TIER_COUNT];
    for (int t = 0; t < SP_TIER_COUNT; t++) {
        caps[t] = p->tier_queue[t] >= 0 ? p->tier_queue[t] : p->max_queue;
    }
    sp_tierq_init(&s->queue, caps);
    if (sp_gen_vocab_create(s->tok, &s->vocab, err, err_len) != SP_OK) {
        sp_sched_destroy(s);
        return SP_ERR_NOMEM;
    }
    s->running = sp_calloc((size_t)s->p.n_slots, sizeof *s->running);
    s->step_seqs = sp_calloc((size_t)s->p.n_slots, sizeof *s->step_seqs);
    s->rows = sp_calloc((size_t)s->p.n_slots, sizeof *s->rows);
    s->cand_k = sp_calloc((size_t)s->p.n_slots, sizeof *s->cand_k);
    s->pre_rows = sp_calloc((size_t)s->p.n_slots, sizeof *s->pre_rows);
    s->pre_tok = sp_calloc((size_t)s->p.n_slots, sizeof *s->pre_tok);
    s->pre_st = sp_calloc((size_t)s->p.n_slots, sizeof *s->pre_st);
    s->pre_done = sp_calloc((size_t)s->p.n_slots, sizeof *s->pre_done);
    s->n_threads = pl.n_threads > 0 ? pl.n_threads : 1;
    s->logits = sp_malloc((size_t)s->n_threads * (size_t)s->n_vocab * sizeof(float));
    s->emb = sp_malloc((size_t)s->n_embd * sizeof(float));
    if (!s->running || !s->step_seqs || !s->rows || !s->cand_k || !s->pre_rows || !s->pre_tok ||
        !s->pre_st || !s->pre_done || !s->logits || !s->emb) {
        sp_sched_destroy(s);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "scheduler: out of memory");
    }
    st = sp_ctx_create(m, &pl.cp, &s->embed_ctx, err, err_len);
    if (st == SP_OK) {
        st = sp_kv_pool_create_split(m, &pl.kp, pl.nb_swa, &s->kv, err, err_len);
    }
    if (st == SP_OK) {
        st = sp_blocks_create(pl.nb, &s->blocks, err, err_len);
    }
    if (st == SP_OK && pl.nb_swa > 0) {
        s->n_swa = hp->n_swa;
        st = sp_blocks_create(pl.nb_swa, &s->swa_blocks, err, err_len);
        s->swa_have = sp_calloc((size_t)blocks_for(pl.n_ctx), 1);
        if (st == SP_OK && s->swa_have == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "scheduler: out of memory");
        }
    }
    if (st == SP_OK) {
        st = sp_batch_create(m, &pl.bp, &s->batch, err, err_len);
    }
    if (st == SP_OK && p->draft != NULL) {
        st = sp_kv_pool_create_split(p->draft, &pl.dkp, pl.d_ring * p->n_slots, &s->d_kv, err,
                                     err_len);
        if (st == SP_OK) {
            st = sp_batch_create(p->draft, &pl.dbp, &s->d_batch, err, err_len);
        }
        s->d_per_slot = pl.d_per_slot;
        s->d_ring = pl.d_ring;
        s->d_swa = sp_model_hparams(p->draft)->n_swa;
        s->d_tab = pl.d_per_slot * (pl.d_ring > 0 ? 2 : 1);
        s->d_rows = sp_calloc((size_t)s->p.n_slots, sizeof *s->d_rows);
        s->d_seqs = sp_calloc((size_t)s->p.n_slots, sizeof *s->d_seqs);
        s->d_slot_used = sp_calloc((size_t)s->p.n_slots, sizeof *s->d_slot_used);
        s->d_block_ids = sp_malloc((size_t)(s->d_tab * s->p.n_slots) * sizeof(int32_t));
        s->d_ring_entry =
            pl.d_ring > 0 ? sp_malloc((size_t)(pl.d_ring * s->p.n_slots) * sizeof(int64_t)) : NULL;
        if (st == SP_OK && (!s->d_rows || !s->d_seqs || !s->d_slot_used || !s->d_block_ids ||
                            (pl.d_ring > 0 && s->d_ring_entry == NULL))) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "scheduler: out of memory");
        }
        for (int64_t i = 0; st == SP_OK && i < s->p.n_slots; i++) {
            int32_t *tab = s->d_block_ids + i * s->d_tab;
            for (int64_t b = 0; b < pl.d_per_slot; b++) {
                tab[b] = (int32_t)(i * pl.d_per_slot + b); /* the slot's global blocks */
            }
            for (int64_t b = pl.d_per_slot; b < s->d_tab; b++) {
                tab[b] = -1; /* sliding entries: set per step (draft_ring_step) */
            }
        }
    }
    if (st != SP_OK) {
        sp_sched_destroy(s);
        return st;
    }
    s->p.kv_blocks = pl.nb;
    sp_blocks_get_stats(s->blocks, &s->bstats);
    if (s->swa_blocks != NULL) {
        sp_blocks_get_stats(s->swa_blocks, &s->swa_bstats);
    }
    /* Floor: one KV block of prompt per step, so a prefill always moves. */
    sp_stepctl_init(&s->ctl, p->tpot_target_ms, SP_KV_BLOCK, s->p.prefill_chunk);
    s->st_budget = s->ctl.budget;
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        sp_sched_destroy(s);
        return sp_errf(err, err_len, SP_ERR_IO, "scheduler: cannot start the engine thread");
    }
    s->started = true;
    const size_t swa_bb = pl.nb_swa > 0 ? sp_kv_swa_block_bytes(m, p->kv_type) : 0;
    SP_LOG_INFO("event=sched_ready kv_blocks=%lld kv_block_bytes=%zu kv_swa_blocks=%lld "
                "kv_swa_block_bytes=%zu kv_type=%s step_tokens=%d "
                "max_seqs=%d ctx=%lld tpot_target_ms=%g speculative_tokens=%d "
                "draft_swa_ring_blocks=%lld",
                (long long)pl.nb, sp_kv_block_bytes(m, p->kv_type) - swa_bb,
                (long long)pl.nb_swa, swa_bb, sp_kv_type_name(p->kv_type),
                s->p.prefill_chunk,
                s->p.n_slots, (long long)s->n_ctx,
                p->tpot_target_ms > 0 ? p->tpot_target_ms : 0.0, p->draft ? p->spec_k : 0,
                (long long)(p->draft ? pl.d_ring : 0));
    *out = s;
    return SP_OK;
}

void
sp_sched_stop(sp_sched_t *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    bool join = s->started && !s->stopped;
    s->stop = true;
    s->stopped = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (join) {
        pthread_join(s->thread, NULL);
    }
}

void
sp_sched_destroy(sp_sched_t *s)
{
    if (s == NULL) {
        return;
    }
    sp_sched_stop(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    sp_batch_destroy(s->batch);
    sp_batch_destroy(s->d_batch);
    sp_kv_pool_destroy(s->d_kv);
    sp_free(s->d_rows);
    sp_free(s->d_seqs);
    sp_free(s->d_slot_used);
    sp_free(s->d_block_ids);
    sp_free(s->d_ring_entry);
    sp_blocks_destroy(s->blocks);
    sp_blocks_destroy(s->swa_blocks);
    sp_free(s->swa_have);
    sp_kv_pool_destroy(s->kv);
    sp_ctx_destroy(s->embed_ctx);
    sp_gen_vocab_destroy(s->vocab);
    sp_free(s->running);
    sp_free(s->step_seqs);
    sp_free(s->rows);
    sp_free(s->cand_k);
    sp_free(s->pre_rows);
    sp_free(s->pre_tok);
    sp_free(s->pre_st);
    sp_free(s->pre_done);
    sp_free(s->logits);
    sp_free(s->emb);
    sp_free(s->scratch);
    sp_free(s);
}

int64_t
sp_sched_n_ctx(const sp_sched_t *s)
{
    return s->n_ctx;
}

int64_t
sp_sched_outstanding(const sp_sched_t *s)
{
    return (int64_t)atomic_load_explicit(&s->outstanding, memory_order_relaxed);
}

/* Add a sequence's adapter to a set of ids (each once, bounded). */
static void
lora_note(const seq_t *sq, uint64_t *ids, int *n)
{
    const sp_lora_t *l = sq->job ? sq->job->lora : NULL;
    if (l == NULL) {
        return;
    }
    uint64_t id = sp_lora_id(l);
    for (int i = 0; i < *n; i++) {
        if (ids[i] == id) {
            return;
        }
    }
    if (*n < SP_SCHED_STATS_LORAS) {
        ids[(*n)++] = id;
    }
}

void
sp_sched_get_stats(sp_sched_t *s, sp_sched_stats_t *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&s->mu);
    o->active = atomic_load(&s->active_seqs);
    o->queued = sp_tierq_total(&s->queue);
    for (int t = 0; t < SP_TIER_COUNT; t++) {
        o->waiting_tier[t] = s->queue.count[t];
        o->running_tier[t] = s->run_tier[t];
    }
    o->kv_blocks_total = s->bstats.n_blocks;
    o->kv_blocks_used = s->bstats.n_held;
    o->kv_blocks_cached = s->bstats.n_cached;
    o->kv_blocks_free = s->bstats.n_free;
    o->prefix_lookups = s->bstats.lookups;
    o->prefix_hits = s->bstats.hits;
    o->kv_evictions = s->bstats.evictions;
    o->kv_swa_blocks_total = s->swa_blocks != NULL ? s->swa_bstats.n_blocks : 0;
    o->kv_swa_blocks_used = s->swa_blocks != NULL ? s->swa_bstats.n_held : 0;
    o->kv_swa_blocks_cached = s->swa_blocks != NULL ? s->swa_bstats.n_cached : 0;
    o->prefix_swa_cut_blocks = atomic_load(&s->st_swa_cut);
    o->steps = s->steps;
    o->last_step_seqs = s->last_step_seqs;
    o->last_step_rows = s->last_step_rows;
    o->mean_step_seqs = s->steps ? (double)s->step_seqs_total / (double)s->steps : 0;
    o->mean_step_rows = s->steps ? (double)s->step_rows_total / (double)s->steps : 0;
    memcpy(o->batch_hist, s->batch_hist, sizeof o->batch_hist);
    o->step_seqs_total = s->step_seqs_total;
    o->step_budget = s->st_budget;
    o->step_p99_ms = (double)s->st_p99_ns / 1e6;
    o->budget_decreases = s->st_decreases;
    o->budget_increases = s->st_increases;
    o->tpot_target_ms = s->ctl.target_ns > 0 ? (double)s->ctl.target_ns / 1e6 : 0;
    for (int i = 0; i < s->n_running; i++) {
        lora_note(s->running[i], o->lora_running, &o->n_lora_running);
    }
    for (int t = 0; t < SP_TIER_COUNT; t++) {
        for (const sp_tierq_node_t *n = s->queue.head[t]; n; n = n->next) {
            lora_note((const seq_t *)n, o->lora_waiting, &o->n_lora_waiting);
        }
    }
    pthread_mutex_unlock(&s->mu);
    o->jobs_done = atomic_load(&s->st_done);
    o->jobs_cancelled = atomic_load(&s->st_cancelled);
    o->tokens_generated = atomic_load(&s->st_tokens);
    o->prompt_tokens = atomic_load(&s->st_prompt);
    o->prompt_tokens_cached = atomic_load(&s->st_prompt_cached);
    o->preemptions = atomic_load(&s->st_preempt);
    o->spec_rows = atomic_load(&s->st_spec_rows);
    o->spec_drafted = atomic_load(&s->st_spec_drafted);
    o->spec_accepted = atomic_load(&s->st_spec_accepted);
}

sp_status_t
sp_sched_submit(sp_sched_t *s, const sp_sched_request_t *r, sp_sched_job_t **out, char *err,
                size_t err_len)
{
    *out = NULL;
    if (r->n < 1 || r->n > SP_SCHED_MAX_N) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "n must be between 1 and %d", SP_SCHED_MAX_N);
    }
    int tier = sp_tierq_tier_from_int(r->priority);
    int64_t tier_cap = s->queue.cap[tier];
    if (r->n > s->p.n_slots + tier_cap) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "n = %d is more than this server runs and queues (%lld)", r->n,
                       (long long)(s->p.n_slots + tier_cap));
    }
    if (r->mailbox == NULL || r->on_event == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "scheduler: no mailbox or callback");
    }
    if (r->lora != NULL && (r->embed || sp_lora_model(r->lora) != s->m)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s",
                       r->embed ? "embeddings cannot use a LoRA adapter"
                                : "scheduler: the adapter belongs to another model");
    }
    if (!r->embed && sp_model_is_encoder(s->m)) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "the model is an encoder (%s): it embeds or ranks, it does not generate",
                       sp_model_hparams(s->m)->arch);
    }
    int64_t total_tokens = 0, total_blocks = 0;
    for (int32_t i = 0; i < r->n; i++) {
        int64_t n = r->n_prompts[i];
        if (n < 1) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "the prompt is empty");
        }
        if (n >= s->n_ctx + (r->embed ? 1 : 0)) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "the prompt has %lld tokens, the context holds %lld", (long long)n,
                           (long long)s->n_ctx);
        }
        int64_t cap = r->embed ? n : n + (r->gen.max_tokens > 0 ? r->gen.max_tokens : 1);
        if (cap > s->n_ctx) {
            cap = s->n_ctx;
        }
        if (!r->embed && blocks_for(cap) > s->p.kv_blocks) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "prompt plus max_tokens needs %lld KV blocks of %d tokens, the pool "
                           "has %lld (--kv-blocks)",
                           (long long)blocks_for(cap), SP_KV_BLOCK, (long long)s->p.kv_blocks);
        }
        total_tokens += cap;
        /* Two tables with a two-part pool (the sliding one after the global). */
        total_blocks += r->embed ? 0 : blocks_for(cap) * (s->swa_blocks != NULL ? 2 : 1);
        for (int64_t k = 0; k < n; k++) {
            if (r->prompts[i][k] < 0 || r->prompts[i][k] >= s->n_vocab) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "token id %d is outside the vocabulary (0..%d)", r->prompts[i][k],
                               s->n_vocab - 1);
            }
        }
    }
    sp_gen_params_t gp = r->gen;
    gp.vocab = s->vocab;
    if (!r->embed) {
        /* Validate the generation parameters now, not on the engine thread. */
        sp_gen_t *g = NULL;
        sp_status_t st = sp_gen_create(s->tok, &gp, &g, err, err_len);
        sp_gen_destroy(g);
        if (st != SP_OK) {
            return st;
        }
    }
    sp_sched_job_t *j = sp_calloc(1, sizeof *j);
    if (j == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    j->n = r->n;
    j->lora = r->lora; /* before the sequences: their prefix chains start from it */
    j->prefix_scope = r->prefix_scope;
    if (j->lora != NULL) {
        sp_lora_ref(j->lora);
    }
    j->seqs = sp_calloc((size_t)r->n, sizeof *j->seqs);
    j->token_store = sp_malloc((size_t)total_tokens * sizeof(int32_t));
    j->block_store = sp_malloc((size_t)(total_blocks > 0 ? total_blocks : 1) * sizeof(int32_t));
    size_t stop_bytes = 1;
    for (int i = 0; i < r->gen.n_stop; i++) {
        stop_bytes += strlen(r->gen.stop[i]) + 1;
    }
    j->stop_store = sp_malloc(stop_bytes);
    if (!j->seqs || !j->token_store || !j->block_store || !j->stop_store) {
        job_free(j);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    int64_t toff = 0, boff = 0;
    for (int32_t i = 0; i < r->n; i++) {
        seq_t *sq = &j->seqs[i];
        int64_t n = r->n_prompts[i];
        int64_t cap = r->embed ? n : n + (r->gen.max_tokens > 0 ? r->gen.max_tokens : 1);
        if (cap > s->n_ctx) {
            cap = s->n_ctx;
        }
        sq->job = j;
        sq->index = i;
        sq->tokens = j->token_store + toff;
        memcpy(sq->tokens, r->prompts[i], (size_t)n * sizeof(int32_t));
        sq->n_prompt = sq->n_tokens = n;
        sq->cap = cap;
        sq->blocks = j->block_store + boff;
        sq->blocks_cap = r->embed ? 0 : blocks_for(cap);
        if (s->swa_blocks != NULL) {
            sq->swa.ids = sq->blocks + sq->blocks_cap;
            sq->swa.cap = sq->blocks_cap;
        }
        chain_root(sq, &sq->chain_hash, &sq->chain_serial);
        sq->d_slot = -1;
        toff += cap;
        boff += sq->blocks_cap * (s->swa_blocks != NULL ? 2 : 1);
    }
    j->gen = gp;
    sp_grammar_retain(j->gen.grammar); /* released in job_free: the request may end first */
    char *sp = j->stop_store;
    for (int i = 0; i < r->gen.n_stop; i++) {
        size_t l = strlen(r->gen.stop[i]);
        memcpy(sp, r->gen.stop[i], l + 1);
        j->gen.stop[i] = sp;
        sp += l + 1;
    }
    j->sched = s;
    j->mb = r->mailbox;
    j->msg.run = job_deliver;
    j->msg.drop = job_drop;
    j->on_event = r->on_event;
    j->ud = r->ud;
    j->embed = r->embed;
    j->tier = tier;
    j->deadline_ns = r->deadline_ns;
    j->submit_ns = sp_time_ns();

    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        job_free(j);
        return sp_errf(err, err_len, SP_ERR_BUSY, "the server is shutting down");
    }
    /* Free running places count as room too: an idle server with --queue 0
     * still runs requests. */
    int64_t free_run = s->p.n_slots - atomic_load(&s->active_seqs) - sp_tierq_total(&s->queue);
    if (s->queue.count[tier] + r->n > s->queue.cap[tier] + (free_run > 0 ? free_run : 0)) {
        pthread_mutex_unlock(&s->mu);
        job_free(j);
        return sp_errf(err, err_len, SP_ERR_BUSY, "the %s queue is full, retry later",
                       sp_tierq_tier_name(tier));
    }
    for (int32_t i = 0; i < r->n; i++) {
        sp_tierq_push_back(&s->queue, &j->seqs[i].node, tier);
    }
    /* Under mu, before the engine can take (and end) them: never below zero. */
    atomic_fetch_add_explicit(&s->outstanding, r->n, memory_order_relaxed);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    *out = j;
    return SP_OK;
}

int
sp_sched_retry_after_s(sp_sched_t *s, int32_t priority, int32_t n)
{
    /* Ahead of a new request: what waits in its tier and the tiers above it
     * (admitted first), then its own sequences. */
    int tier = sp_tierq_tier_from_int(priority);
    int64_t ahead = n > 0 ? n : 1;
    pthread_mutex_lock(&s->mu);
    for (int t = tier; t < SP_TIER_COUNT; t++) {
        ahead += s->queue.count[t];
    }
    pthread_mutex_unlock(&s->mu);
    return sp_drain_retry_after_s(&s->drain, ahead, sp_time_ns());
}
