/*
 * sched.c - the simple implementation behind sched.h: one engine thread per
 * model, K slots, round-robin steps; per-loop mailboxes for the events.
 *
 * Memory and threads:
 * - A job is allocated by the loop thread at submit and freed only by a loop
 *   thread: when its DONE has been delivered, or when it was cancelled and the
 *   engine has finished with it (engine_done) and it is not waiting in the
 *   mailbox. job->mu guards the outbox and these flags.
 * - The engine appends events to job->out; the loop swaps job->out with its
 *   spare buffer (job->in) under the lock and parses the records without it.
 *   Buffers keep their capacity, so a steady stream allocates nothing.
 * - slot_t, the queue and the statistics belong to the engine thread; the
 *   queue is shared with submit under s->mu.
 */
#include "server/sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "server/http.h"

/* ------------------------------------------------------------------ records */

typedef struct rec {
    uint32_t size;     /* whole record, header included */
    int32_t kind, index;
    int32_t a, b, c;   /* TOKEN: token, text_len, n_top (-1 = no logprobs)
                          FINISH: finish, n_generated; EMBEDDING: n_embd; DONE: status, msg_len */
    int64_t x, y;      /* DONE: prompt_tokens, completion_tokens */
} rec_t;

typedef struct lp_rec {
    int32_t token;
    float logprob;
    int32_t len;
} lp_rec_t;

#define LP_MAX_TEXT 64 /* bytes of a token's text kept for log-probabilities */

/* -------------------------------------------------------------- structures */

struct sp_mailbox {
    sp_http_loop_t *loop;
    pthread_mutex_t mu;
    sp_sched_job_t *head; /* jobs with undelivered events */
    bool woken;
};

struct sp_sched_job {
    sp_sched_t *sched;
    sp_mailbox_t *mb;
    sp_sched_event_fn on_event;
    void *ud;
    /* immutable after submit */
    int32_t n;
    bool embed;
    int32_t priority;
    int64_t deadline_ns;
    sp_gen_params_t gen;  /* stop pointers into stop_store */
    char *stop_store;
    int32_t *tokens;      /* all prompts */
    int64_t *offs, *lens; /* per sequence */
    /* engine thread */
    int32_t next_seq;     /* next sequence to start */
    int32_t ended;        /* sequences that have ended (any way) */
    int32_t active;       /* sequences in slots */
    sp_status_t status;
    char message[256];
    int64_t prompt_tokens, completion_tokens;
    sp_sched_job_t *q_next;
    bool in_queue;
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
    sp_sched_job_t *mb_next;
};

typedef enum slot_phase { SLOT_FREE, SLOT_PREFILL, SLOT_DECODE, SLOT_EMBED } slot_phase_t;

typedef struct slot {
    sp_ctx_t *ctx;
    sp_gen_t *gen;
    sp_sched_job_t *job;
    int32_t seq;
    const int32_t *prompt;
    int64_t n_prompt, n_past;
    int32_t pending;
    slot_phase_t phase;
} slot_t;

struct sp_sched {
    const sp_model_t *m;
    const sp_tokenizer_t *tok;
    sp_sched_params_t p;
    int64_t n_ctx;
    int32_t n_vocab;
    int32_t n_embd;
    slot_t *slots;
    sp_gen_vocab_t *vocab; /* the JSON constraint's piece table, shared by all generations */
    float *logits;   /* n_vocab scratch for sampling */
    float *emb;      /* n_embd scratch for embeddings */
    char *scratch;   /* record assembly */
    size_t scratch_cap;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sp_sched_job_t *q_head;
    int queued_seqs;
    atomic_int active_seqs; /* written by the engine thread, read by submit */
    bool stop;
    bool stopped;
    atomic_int_fast64_t st_done, st_cancelled, st_tokens, st_prompt;
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
    };
    return p;
}

/* --------------------------------------------------------------- mailboxes */

static void mailbox_drain(void *arg);

sp_mailbox_t *
sp_mailbox_create(sp_http_loop_t *loop)
{
    sp_mailbox_t *mb = sp_calloc(1, sizeof *mb);
    if (mb == NULL) {
        return NULL;
    }
    mb->loop = loop;
    pthread_mutex_init(&mb->mu, NULL);
    sp_http_loop_set_wake_cb(loop, mailbox_drain, mb);
    return mb;
}

static void
job_free(sp_sched_job_t *j)
{
    pthread_mutex_destroy(&j->mu);
    sp_free(j->out);
    sp_free(j->in);
    sp_free(j->stop_store);
    sp_free(j->tokens);
    sp_free(j->offs);
    sp_free(j->lens);
    sp_free(j);
}

void
sp_mailbox_destroy(sp_mailbox_t *mb)
{
    if (mb == NULL) {
        return;
    }
    /* The schedulers have stopped: whatever is still listed is finished. */
    sp_sched_job_t *j = mb->head;
    while (j) {
        sp_sched_job_t *next = j->mb_next;
        pthread_mutex_lock(&j->mu);
        j->queued = false;
        bool free_it = j->engine_done;
        j->consumer_gone = true;
        pthread_mutex_unlock(&j->mu);
        if (free_it) {
            job_free(j);
        }
        j = next;
    }
    sp_http_loop_set_wake_cb(mb->loop, NULL, NULL);
    pthread_mutex_destroy(&mb->mu);
    sp_free(mb);
}

static void
mailbox_push(sp_mailbox_t *mb, sp_sched_job_t *j)
{
    pthread_mutex_lock(&mb->mu);
    j->mb_next = mb->head;
    mb->head = j;
    bool wake = !mb->woken;
    mb->woken = true;
    pthread_mutex_unlock(&mb->mu);
    if (wake) {
        sp_http_loop_wake(mb->loop);
    }
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

static void
mailbox_drain(void *arg)
{
    sp_mailbox_t *mb = arg;
    pthread_mutex_lock(&mb->mu);
    sp_sched_job_t *list = mb->head;
    mb->head = NULL;
    mb->woken = false;
    pthread_mutex_unlock(&mb->mu);
    while (list) {
        sp_sched_job_t *j = list;
        list = j->mb_next;
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
        mailbox_push(j->mb, j);
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
    if (j->ended < j->n || j->active > 0) {
        return;
    }
    if (j->status == SP_OK && atomic_load(&j->cancel)) {
        job_set_error(j, SP_ERR_CANCELLED,
                      j->overflowed ? "the client does not read the response fast enough"
                                    : "cancelled");
    }
    if (j->status == SP_ERR_CANCELLED) {
        atomic_fetch_add(&s->st_cancelled, 1);
        SP_LOG_INFO("event=job_cancelled reason=\"%s\" prompt_tokens=%lld completion_tokens=%lld",
                    j->message, (long long)j->prompt_tokens, (long long)j->completion_tokens);
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
    post(s, j, &h, j->message, ml);
}

static void
post_token(sp_sched_t *s, slot_t *sl, const sp_gen_token_t *t)
{
    sp_sched_job_t *j = sl->job;
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
        int32_t n = sp_token_to_piece(s->tok, g->token, true, piece, (int32_t)sizeof piece);
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
    h.index = sl->seq;
    h.a = t->token;
    h.b = (int32_t)t->text_len;
    h.c = n_top;
    post(s, j, &h, buf, off);
}

/* ------------------------------------------------------------ engine: slots */

static void
slot_release(sp_sched_t *s, slot_t *sl)
{
    sp_sched_job_t *j = sl->job;
    sp_gen_destroy(sl->gen);
    sl->gen = NULL;
    sl->job = NULL;
    sl->phase = SLOT_FREE;
    j->active--;
    atomic_fetch_sub(&s->active_seqs, 1);
    seq_end(s, j);
}

static void
slot_finish(sp_sched_t *s, slot_t *sl, sp_finish_t finish)
{
    rec_t h = {0};
    h.kind = SP_SCHED_EV_FINISH;
    h.index = sl->seq;
    h.a = finish;
    h.b = sl->gen ? sp_gen_n_generated(sl->gen) : 0;
    post(s, sl->job, &h, NULL, 0);
    slot_release(s, sl);
}

static void
slot_fail(sp_sched_t *s, slot_t *sl, sp_status_t st, const char *msg)
{
    job_set_error(sl->job, st, msg);
    atomic_store(&sl->job->cancel, true); /* the job's other sequences stop too */
    slot_release(s, sl);
}

static void
slot_start(sp_sched_t *s, slot_t *sl, sp_sched_job_t *j, int32_t seq)
{
    char err[256];
    sl->job = j;
    sl->seq = seq;
    sl->prompt = j->tokens + j->offs[seq];
    sl->n_prompt = j->lens[seq];
    sl->n_past = 0;
    sl->pending = -1;
    j->active++;
    atomic_fetch_add(&s->active_seqs, 1);
    if (j->embed) {
        sl->phase = SLOT_EMBED;
        return;
    }
    sp_gen_params_t gp = j->gen;
    gp.sampling.seed += (uint64_t)seq; /* n choices must differ */
    if (sp_gen_create(s->tok, &gp, &sl->gen, err, sizeof err) != SP_OK) {
        sl->phase = SLOT_DECODE;
        slot_fail(s, sl, SP_ERR_INVALID, err);
        return;
    }
    sp_gen_accept_prompt(sl->gen, sl->prompt, sl->n_prompt);
    sl->phase = SLOT_PREFILL;
}

/* One step of one slot: a prefill chunk or one token, then sampling. */
static void
slot_step(sp_sched_t *s, slot_t *sl)
{
    sp_sched_job_t *j = sl->job;
    if (atomic_load(&j->cancel)) {
        slot_release(s, sl);
        return;
    }
    if (j->deadline_ns && sp_time_ns() > j->deadline_ns) {
        slot_fail(s, sl, SP_ERR_CANCELLED, "request deadline exceeded");
        return;
    }
    sp_status_t st;
    if (sl->phase == SLOT_EMBED) {
        st = sp_ctx_embed(sl->ctx, sl->prompt, sl->n_prompt, s->emb);
        if (st != SP_OK) {
            slot_fail(s, sl, st, "embedding failed");
            return;
        }
        j->prompt_tokens += sl->n_prompt;
        atomic_fetch_add(&s->st_prompt, sl->n_prompt);
        rec_t h = {0};
        h.kind = SP_SCHED_EV_EMBEDDING;
        h.index = sl->seq;
        h.a = s->n_embd;
        post(s, j, &h, s->emb, (size_t)s->n_embd * sizeof(float));
        slot_release(s, sl);
        return;
    }
    if (sl->phase == SLOT_PREFILL) {
        int64_t n = sl->n_prompt - sl->n_past;
        if (n > s->p.prefill_chunk) {
            n = s->p.prefill_chunk;
        }
        st = sp_ctx_eval(sl->ctx, sl->prompt + sl->n_past, n, sl->n_past);
        if (st != SP_OK) {
            slot_fail(s, sl, st, "prompt evaluation failed");
            return;
        }
        sl->n_past += n;
        j->prompt_tokens += n;
        atomic_fetch_add(&s->st_prompt, n);
        if (sl->n_past < sl->n_prompt) {
            return;
        }
        sl->phase = SLOT_DECODE;
    } else {
        if (sl->n_past >= s->n_ctx) {
            slot_finish(s, sl, SP_FINISH_LENGTH);
            return;
        }
        st = sp_ctx_eval(sl->ctx, &sl->pending, 1, sl->n_past);
        if (st != SP_OK) {
            slot_fail(s, sl, st, "token evaluation failed");
            return;
        }
        sl->n_past++;
    }
    memcpy(s->logits, sp_ctx_logits(sl->ctx), (size_t)s->n_vocab * sizeof(float));
    sp_gen_token_t t;
    st = sp_gen_step(sl->gen, s->logits, &t);
    if (st != SP_OK) {
        slot_fail(s, sl, st, "sampling failed");
        return;
    }
    if (t.token >= 0) {
        j->completion_tokens++;
        atomic_fetch_add(&s->st_tokens, 1);
    }
    if (t.token >= 0 || t.text_len > 0) {
        post_token(s, sl, &t);
    }
    if (t.finish != SP_FINISH_NONE) {
        slot_finish(s, sl, t.finish);
    } else if (sl->n_past >= s->n_ctx) {
        slot_finish(s, sl, SP_FINISH_LENGTH);
    } else {
        sl->pending = t.token;
    }
}

/* ---------------------------------------------------------- engine: thread */

static void
queue_remove(sp_sched_t *s, sp_sched_job_t *j)
{
    sp_sched_job_t **pp = &s->q_head;
    while (*pp && *pp != j) {
        pp = &(*pp)->q_next;
    }
    if (*pp) {
        *pp = j->q_next;
    }
    j->q_next = NULL;
    j->in_queue = false;
}

/* Drop the sequences of a queued job that will never start (s->mu held). */
static void
queue_drop(sp_sched_t *s, sp_sched_job_t *j)
{
    int32_t left = j->n - j->next_seq;
    s->queued_seqs -= left;
    j->next_seq = j->n;
    queue_remove(s, j);
    for (int32_t i = 0; i < left; i++) {
        seq_end(s, j);
    }
}

static void *
engine_main(void *arg)
{
    sp_sched_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && atomic_load(&s->active_seqs) == 0 && s->q_head == NULL) {
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->stop) {
            break;
        }
        /* Cancelled jobs leave the queue at once; then fill the free slots. */
        for (sp_sched_job_t *j = s->q_head, *next; j; j = next) {
            next = j->q_next;
            if (atomic_load(&j->cancel)) {
                queue_drop(s, j);
            }
        }
        for (int i = 0; i < s->p.n_slots && s->q_head; i++) {
            slot_t *sl = &s->slots[i];
            if (sl->phase != SLOT_FREE) {
                continue;
            }
            sp_sched_job_t *j = s->q_head;
            int32_t seq = j->next_seq++;
            s->queued_seqs--;
            if (j->next_seq == j->n) {
                queue_remove(s, j);
            }
            slot_start(s, sl, j, seq);
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->p.n_slots; i++) {
            if (s->slots[i].phase != SLOT_FREE) {
                slot_step(s, &s->slots[i]);
            }
        }
        pthread_mutex_lock(&s->mu);
    }
    /* Stopping: everything still here ends as cancelled. */
    while (s->q_head) {
        job_set_error(s->q_head, SP_ERR_CANCELLED, "server shutting down");
        queue_drop(s, s->q_head);
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->p.n_slots; i++) {
        slot_t *sl = &s->slots[i];
        if (sl->phase != SLOT_FREE) {
            slot_fail(s, sl, SP_ERR_CANCELLED, "server shutting down");
        }
    }
    return NULL;
}

/* ------------------------------------------------------------- public API */

sp_status_t
sp_sched_create(const sp_model_t *m, const sp_sched_params_t *p, sp_sched_t **out, char *err,
                size_t err_len)
{
    *out = NULL;
    if (p->n_slots < 1 || p->n_slots > 256 || p->max_queue < 0 || p->prefill_chunk < 1) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "scheduler: parallel must be 1..256");
    }
    sp_sched_t *s = sp_calloc(1, sizeof *s);
    if (s == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "scheduler: out of memory");
    }
    s->m = m;
    s->tok = sp_model_tokenizer(m);
    s->p = *p;
    const sp_hparams_t *hp = sp_model_hparams(m);
    s->n_vocab = (int32_t)hp->n_vocab;
    s->n_embd = (int32_t)hp->n_embd;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (sp_gen_vocab_create(s->tok, &s->vocab, err, err_len) != SP_OK) {
        sp_sched_destroy(s);
        return SP_ERR_NOMEM;
    }
    s->slots = sp_calloc((size_t)p->n_slots, sizeof *s->slots);
    s->logits = sp_malloc((size_t)s->n_vocab * sizeof(float));
    s->emb = sp_malloc((size_t)s->n_embd * sizeof(float));
    if (!s->slots || !s->logits || !s->emb) {
        sp_sched_destroy(s);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "scheduler: out of memory");
    }
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = p->n_ctx;
    cp.n_threads = p->n_threads;
    if (cp.n_batch > p->prefill_chunk) {
        cp.n_batch = p->prefill_chunk;
    }
    for (int i = 0; i < p->n_slots; i++) {
        sp_status_t st = sp_ctx_create(m, &cp, &s->slots[i].ctx, err, err_len);
        if (st != SP_OK) {
            sp_sched_destroy(s);
            return st;
        }
    }
    s->n_ctx = sp_ctx_n_ctx(s->slots[0].ctx);
    if (s->p.prefill_chunk > cp.n_batch) {
        s->p.prefill_chunk = (int)cp.n_batch;
    }
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        sp_sched_destroy(s);
        return sp_errf(err, err_len, SP_ERR_IO, "scheduler: cannot start the engine thread");
    }
    s->started = true;
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
    for (int i = 0; s->slots && i < s->p.n_slots; i++) {
        sp_gen_destroy(s->slots[i].gen);
        sp_ctx_destroy(s->slots[i].ctx);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    sp_gen_vocab_destroy(s->vocab);
    sp_free(s->slots);
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

void
sp_sched_get_stats(sp_sched_t *s, sp_sched_stats_t *o)
{
    pthread_mutex_lock(&s->mu);
    o->active = atomic_load(&s->active_seqs);
    o->queued = s->queued_seqs;
    pthread_mutex_unlock(&s->mu);
    o->jobs_done = atomic_load(&s->st_done);
    o->jobs_cancelled = atomic_load(&s->st_cancelled);
    o->tokens_generated = atomic_load(&s->st_tokens);
    o->prompt_tokens = atomic_load(&s->st_prompt);
}

sp_status_t
sp_sched_submit(sp_sched_t *s, const sp_sched_request_t *r, sp_sched_job_t **out, char *err,
                size_t err_len)
{
    *out = NULL;
    if (r->n < 1 || r->n > SP_SCHED_MAX_N) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "n must be between 1 and %d", SP_SCHED_MAX_N);
    }
    if (r->n > s->p.n_slots + s->p.max_queue) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "n = %d is more than this server runs and queues (%d)", r->n,
                       s->p.n_slots + s->p.max_queue);
    }
    if (r->mailbox == NULL || r->on_event == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "scheduler: no mailbox or callback");
    }
    /* Prompts: identical pointers (n choices of one prompt) are stored once. */
    int64_t total = 0;
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
        if (i == 0 || r->prompts[i] != r->prompts[0] || n != r->n_prompts[0]) {
            total += n;
        }
    }
    for (int32_t i = 0; i < r->n; i++) {
        for (int64_t k = 0; k < r->n_prompts[i]; k++) {
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
    j->tokens = sp_malloc((size_t)total * sizeof(int32_t));
    j->offs = sp_malloc((size_t)r->n * sizeof(int64_t));
    j->lens = sp_malloc((size_t)r->n * sizeof(int64_t));
    size_t stop_bytes = 1;
    for (int i = 0; i < r->gen.n_stop; i++) {
        stop_bytes += strlen(r->gen.stop[i]) + 1;
    }
    j->stop_store = sp_malloc(stop_bytes);
    if (!j->tokens || !j->offs || !j->lens || !j->stop_store) {
        job_free(j);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    int64_t off = 0;
    for (int32_t i = 0; i < r->n; i++) {
        if (i > 0 && r->prompts[i] == r->prompts[0] && r->n_prompts[i] == r->n_prompts[0]) {
            j->offs[i] = 0;
        } else {
            memcpy(j->tokens + off, r->prompts[i], (size_t)r->n_prompts[i] * sizeof(int32_t));
            j->offs[i] = off;
            off += r->n_prompts[i];
        }
        j->lens[i] = r->n_prompts[i];
    }
    j->gen = gp;
    char *sp = j->stop_store;
    for (int i = 0; i < r->gen.n_stop; i++) {
        size_t l = strlen(r->gen.stop[i]);
        memcpy(sp, r->gen.stop[i], l + 1);
        j->gen.stop[i] = sp;
        sp += l + 1;
    }
    j->sched = s;
    j->mb = r->mailbox;
    j->on_event = r->on_event;
    j->ud = r->ud;
    j->n = r->n;
    j->embed = r->embed;
    j->priority = r->priority;
    j->deadline_ns = r->deadline_ns;

    pthread_mutex_lock(&s->mu);
    int free_slots = s->p.n_slots - atomic_load(&s->active_seqs);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        job_free(j);
        return sp_errf(err, err_len, SP_ERR_BUSY, "the server is shutting down");
    }
    if (s->queued_seqs + r->n > s->p.max_queue + (free_slots > 0 ? free_slots : 0)) {
        pthread_mutex_unlock(&s->mu);
        job_free(j);
        return sp_errf(err, err_len, SP_ERR_BUSY, "the queue is full, retry later");
    }
    /* Higher priority first, FIFO within a priority. */
    sp_sched_job_t **pp = &s->q_head;
    while (*pp && (*pp)->priority >= j->priority) {
        pp = &(*pp)->q_next;
    }
    j->q_next = *pp;
    *pp = j;
    j->in_queue = true;
    s->queued_seqs += r->n;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    *out = j;
    return SP_OK;
}
