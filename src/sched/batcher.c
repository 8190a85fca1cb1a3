/*
 * batcher.c - the dynamic batcher for tensor models (batcher.h).
 *
 * Locking. One mutex, b->mu, guards everything that changes after create:
 * the level queues, the deadline heap, the requests while they are queued,
 * the stats, the adaptive controller, the stopping flags and n_idle. What is
 * set in create and never changes (params, info, api, host, instances, the
 * levels' policies, the preferred sizes, var_dims, batching) is read without
 * it. A request belongs to the queue (under mu) from submit until a worker
 * unlinks it under mu; from then on it belongs to that worker alone (merge,
 * execute, split, callback, free), so no other thread can reach it. Each
 * worker's scratch buffers and instance are its own, so execute() is never
 * entered twice for one instance. execute() and every callback run without
 * mu (a callback may submit). One condition variable, b->cv (on
 * CLOCK_MONOTONIC), wakes idle workers: submit signals one when a worker is
 * idle, a worker that takes a batch and leaves requests behind signals
 * another, stop broadcasts. A waiting worker sleeps until the next moment
 * something is due (its head batch's delay, the earliest queue deadline).
 * Queue deadlines must fire even while every worker is inside execute(), so
 * when any level has timeouts a timer thread sleeps on b->timer_cv (same
 * mutex) until the earliest deadline; submit signals it when a new request
 * becomes the earliest. Workers expire deadlines too; whoever takes a request
 * off the queue under mu owns it, so each is completed once. There is no other
 * lock, so there is no lock order to keep; the backend's and the callbacks'
 * own locks are never taken under mu.
 *
 * Memory. A request is one sp_malloc block: the req_t, then its inputs' bytes
 * (copied at submit). Merged batch inputs live in per-worker scratch buffers
 * that only grow. Outputs come from host->alloc_fn: a batch of one request
 * hands execute()'s buffers to it as they are, a larger batch copies each
 * request's rows into buffers of its own.
 */
#include "sched/batcher.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/pool.h"
#include "core/timer.h"

#define MAX_T SP_BACKEND_MAX_TENSORS
#define SKIP_MAX 1024                 /* shape-mismatched requests passed over per batch */
#define MAX_DELAY_US 1000000000ULL    /* 1000 s: keeps every ns sum far from overflow */
#define MAX_TIMEOUT_US 1000000000000ULL

typedef struct req req_t;
struct req {
    req_t *prev, *next; /* in its level's main or delayed list */
    req_t *bnext;       /* in a batch (being formed, running, or failing) */
    int32_t level;      /* 0-based */
    bool delayed;       /* in the delayed list */
    int32_t heap_i;     /* in the deadline heap, or -1 */
    int64_t enq_ns;
    int64_t deadline_ns; /* 0 = none */
    int64_t rows;
    sp_batch_done_cb done;
    void *ud;
    uint32_t out_mask;                 /* bit o: info.outputs[o] wanted */
    int32_t n_out;
    int8_t out_idx[MAX_T];             /* wanted outputs, in the order asked */
    size_t out_off[MAX_T], out_len[MAX_T]; /* per batch output slot: this request's bytes */
    void *res_data[MAX_T];             /* its outputs, in out_idx order, once split */
    bool res_nomem;                    /* copying its outputs failed */
    sp_backend_tensor_t in[MAX_T];     /* declared order; data points into this block */
};

typedef struct req_list {
    req_t *head, *tail;
    int64_t n;
} req_list_t;

typedef struct level {
    req_list_t main, delayed;
    sp_batcher_queue_policy_t pol;
} level_t;

typedef struct worker {
    sp_batcher_t *b;
    void *instance;
    pthread_t thread;
    bool started;
    void *scratch[MAX_T]; /* merged inputs */
    size_t scratch_cap[MAX_T];
} worker_t;

/* A batch chosen by form(): first..(bnext) n requests, rows in all. */
typedef struct plan {
    req_t *first;
    int32_t n;
    int64_t rows;
    sp_batch_why_t why;
    bool backlog; /* cut by size with requests left queued: the instances are short */
} plan_t;

struct sp_batcher {
    /* Immutable after create. */
    sp_batcher_params_t p;
    const sp_backend_api_t *api;
    const sp_backend_host_t *host;
    sp_backend_model_info_t info;
    int32_t n_levels, default_level; /* default_level 0-based */
    bool batching;                   /* enabled and max_batch_size > 0 */
    bool var_dims;                   /* some input has a -1 dim */
    int32_t pref[SP_BATCHER_MAX_PREFERRED]; /* ascending, unique */
    int32_t n_pref;
    int n_workers;
    worker_t *workers;
    bool has_timeouts;               /* some level has a default timeout or allows one */
    pthread_t timer;                 /* fires queue deadlines while every worker is busy */
    bool timer_started;

    /* Guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t timer_cv;         /* the timer thread waits here */
    bool timer_quit;
    level_t levels[SP_BATCHER_MAX_LEVELS];
    req_t **heap; /* min-heap on deadline_ns of the queued requests that have one */
    int64_t heap_n, heap_cap;
    int64_t queued;
    int64_t queued_rows;
    int n_idle;
    int n_idle_delay; /* of n_idle: waiting out a batch's delay (the queue is not empty) */
    bool stopping, drain, joined;
    sp_batcher_ctl_t ctl;
    sp_batcher_stats_t st;
};

static const char *const btype_names[SP_BT_COUNT_] = {
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
    "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16",
};

const char *
sp_batcher_btype_name(sp_btype_t t)
{
    return (unsigned)t < SP_BT_COUNT_ ? btype_names[t] : "?";
}

static int64_t
min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* ---- lists and the deadline heap (all under mu) */

static void
list_append(req_list_t *l, req_t *r)
{
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail != NULL) {
        l->tail->next = r;
    } else {
        l->head = r;
    }
    l->tail = r;
    l->n++;
}

static void
list_remove(req_list_t *l, req_t *r)
{
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        l->head = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    } else {
        l->tail = r->prev;
    }
    r->prev = r->next = NULL;
    l->n--;
}

static void
heap_set(sp_batcher_t *b, int64_t i, req_t *r)
{
    b->heap[i] = r;
    r->heap_i = (int32_t)i;
}

static void
heap_up(sp_batcher_t *b, int64_t i)
{
    req_t *r = b->heap[i];
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (b->heap[parent]->deadline_ns <= r->deadline_ns) {
            break;
        }
        heap_set(b, i, b->heap[parent]);
        i = parent;
    }
    heap_set(b, i, r);
}

static void
heap_down(sp_batcher_t *b, int64_t i)
{
    req_t *r = b->heap[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= b->heap_n) {
            break;
        }
        if (c + 1 < b->heap_n && b->heap[c + 1]->deadline_ns < b->heap[c]->deadline_ns) {
            c++;
        }
        if (b->heap[c]->deadline_ns >= r->deadline_ns) {
            break;
        }
        heap_set(b, i, b->heap[c]);
        i = c;
    }
    heap_set(b, i, r);
}

/* 0, or -1 when growing the heap fails (nothing changed). */
static int
heap_push(sp_batcher_t *b, req_t *r)
{
    if (b->heap_n == b->heap_cap) {
        int64_t cap = b->heap_cap ? b->heap_cap * 2 : 64;
        size_t bytes;
        if (sp_mul_size((size_t)cap, sizeof *b->heap, &bytes) != 0) {
            return -1;
        }
        req_t **h = sp_realloc(b->heap, bytes);
        if (h == NULL) {
            return -1;
        }
        b->heap = h;
        b->heap_cap = cap;
    }
    b->heap[b->heap_n] = r;
    r->heap_i = (int32_t)b->heap_n;
    b->heap_n++;
    heap_up(b, b->heap_n - 1);
    return 0;
}

static void
heap_remove(sp_batcher_t *b, req_t *r)
{
    int64_t i = r->heap_i;
    if (i < 0) {
        return;
    }
    r->heap_i = -1;
    b->heap_n--;
    if (i == b->heap_n) {
        return;
    }
    req_t *last = b->heap[b->heap_n];
    heap_set(b, i, last);
    if (i > 0 && b->heap[(i - 1) / 2]->deadline_ns > last->deadline_ns) {
        heap_up(b, i);
    } else {
        heap_down(b, i);
    }
}

/* Take r out of the queue (whichever list, and the heap). */
static void
unqueue(sp_batcher_t *b, req_t *r)
{
    level_t *lv = &b->levels[r->level];
    list_remove(r->delayed ? &lv->delayed : &lv->main, r);
    heap_remove(b, r);
    b->queued--;
    b->queued_rows -= r->rows;
}

/* Queue order: level 1 main, level 1 delayed, level 2 main, ... */
static req_t *
first_from(const sp_batcher_t *b, int32_t level, bool delayed)
{
    for (int32_t l = level; l < b->n_levels; l++) {
        const level_t *lv = &b->levels[l];
        if (!delayed && lv->main.head != NULL) {
            return lv->main.head;
        }
        if (lv->delayed.head != NULL) {
            return lv->delayed.head;
        }
        delayed = false;
    }
    return NULL;
}

static req_t *
next_in_order(const sp_batcher_t *b, const req_t *r)
{
    if (r->next != NULL) {
        return r->next;
    }
    if (!r->delayed) {
        return first_from(b, r->level, true);
    }
    return first_from(b, r->level + 1, false);
}

/* ---- params */

sp_batcher_params_t
sp_batcher_default_params(void)
{
    sp_batcher_params_t p;
    memset(&p, 0, sizeof p);
    p.enabled = true;
    return p;
}

static bool
same_shape(const sp_batcher_t *b, const req_t *x, const req_t *y)
{
    for (int32_t i = 0; i < b->info.n_inputs; i++) {
        const sp_backend_tensor_t *a = &x->in[i], *c = &y->in[i];
        for (int32_t d = 1; d < a->n_dims; d++) {
            if (a->dims[d] != c->dims[d]) {
                return false;
            }
        }
    }
    return true;
}

static bool
is_preferred(const sp_batcher_t *b, int64_t rows)
{
    for (int32_t i = 0; i < b->n_pref; i++) {
        if (b->pref[i] == rows) {
            return true;
        }
    }
    return false;
}

/* ---- batch formation (under mu) */

/* The rows a batch is sent at without waiting: the largest preferred size
 * within the cap, else the cap (the adaptive one in adaptive mode). */
static int64_t
batch_target(const sp_batcher_t *b)
{
    int32_t cap = b->p.adaptive ? b->ctl.cap : b->p.max_batch_size;
    for (int32_t i = b->n_pref - 1; i >= 0; i--) {
        if (b->pref[i] <= cap) {
            return b->pref[i];
        }
    }
    return cap;
}

/*
 * The batch the head of the queue would run in now. Returns true when it
 * should run now (plan filled, the requests chained by bnext, still queued);
 * false when it should wait until *wake_ns for more requests.
 */
static bool
form(sp_batcher_t *b, int64_t now, plan_t *pl, int64_t *wake_ns)
{
    req_t *head = first_from(b, 0, false);
    if (head == NULL) {
        return false;
    }
    head->bnext = NULL;
    *pl = (plan_t){head, 1, head->rows, SP_BATCH_WHY_ALONE, false};
    if (!b->batching) {
        return true;
    }
    int64_t delay_ns = b->p.adaptive ? b->ctl.delay_ns : (int64_t)b->p.max_queue_delay_us * 1000;
    int64_t target = batch_target(b);

    req_t *tail = head, *best_tail = NULL;
    int32_t n = 1, best_n = 0, skipped = 0;
    int64_t rows = head->rows, best_rows = 0, oldest = head->enq_ns;
    bool saturated = rows >= target;
    if (is_preferred(b, rows)) {
        best_tail = head, best_n = 1, best_rows = rows;
    }
    for (req_t *r = next_in_order(b, head); r != NULL && !saturated; r = next_in_order(b, r)) {
        if (b->var_dims && !same_shape(b, head, r)) {
            if (++skipped > SKIP_MAX) {
                break;
            }
            continue; /* a later batch takes it */
        }
        if (rows + r->rows > target) {
            saturated = true; /* no overtaking by size: stop at the first that does not fit */
            break;
        }
        r->bnext = NULL;
        tail->bnext = r;
        tail = r;
        n++;
        rows += r->rows;
        oldest = min64(oldest, r->enq_ns);
        if (is_preferred(b, rows)) {
            best_tail = r, best_n = n, best_rows = rows;
        }
        saturated = rows >= target;
    }
    pl->n = n;
    pl->rows = rows;
    if (best_n > 0) {
        best_tail->bnext = NULL; /* the rest stays queued */
        pl->n = best_n;
        pl->rows = best_rows;
        pl->why = SP_BATCH_WHY_PREFERRED;
        return true;
    }
    if (saturated) {
        pl->why = SP_BATCH_WHY_FULL;
        return true;
    }
    if (b->stopping) {
        pl->why = SP_BATCH_WHY_ALONE; /* draining: no waiting */
        return true;
    }
    if (delay_ns == 0 || now - oldest >= delay_ns) {
        pl->why = SP_BATCH_WHY_DELAY;
        return true;
    }
    *wake_ns = oldest + delay_ns;
    return false;
}

/* Move what passed its deadline: DELAY to its level's delayed list, REJECT out
 * of the queue (returned chained by bnext, stats counted). */
static req_t *
expire(sp_batcher_t *b, int64_t now)
{
    req_t *rejected = NULL, **tail = &rejected;
    while (b->heap_n > 0 && b->heap[0]->deadline_ns <= now) {
        req_t *r = b->heap[0];
        heap_remove(b, r);
        level_t *lv = &b->levels[r->level];
        list_remove(&lv->main, r);
        if (lv->pol.timeout_action == SP_BATCHER_TIMEOUT_DELAY) {
            r->delayed = true;
            list_append(&lv->delayed, r);
            b->st.delayed++;
        } else {
            b->queued--;
            b->queued_rows -= r->rows;
            b->st.timed_out++;
            r->bnext = NULL;
            *tail = r;
            tail = &r->bnext;
        }
    }
    return rejected;
}

/* ---- completing requests (without mu) */

typedef struct result_priv {
    sp_batch_result_t pub; /* first: callbacks get &pub */
    bool taken[MAX_T];
} result_priv_t;

void *
sp_batcher_result_take(const sp_batch_result_t *res, int32_t i)
{
    if (res == NULL || i < 0 || i >= res->n_outputs) {
        return NULL;
    }
    /* res is the pub member of a non-const result_priv_t (complete() below). */
    result_priv_t *rp = (result_priv_t *)(void *)(uintptr_t)res;
    rp->taken[i] = true;
    return res->outputs[i].data;
}

/* Call r's callback with an error and free r. */
static void
complete_error(req_t *r, sp_status_t st, sp_batch_reason_t reason, const char *msg, int64_t now)
{
    result_priv_t rp;
    memset(&rp, 0, sizeof rp);
    rp.pub.status = st;
    rp.pub.reason = reason;
    rp.pub.message = msg;
    rp.pub.queue_us = (now - r->enq_ns) / 1000;
    r->done(r->ud, &rp.pub);
    sp_free(r);
}

static void
complete_chain_error(req_t *chain, sp_status_t st, sp_batch_reason_t reason, const char *msg)
{
    int64_t now = sp_time_ns();
    while (chain != NULL) {
        req_t *next = chain->bnext;
        complete_error(chain, st, reason, msg, now);
        chain = next;
    }
}

/* ---- validation */

static void
fmt_dims(char *buf, size_t cap, int32_t n, const int64_t *dims)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int32_t i = 0; i < n && k < cap; i++) {
        k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)dims[i]);
    }
    if (k < cap) {
        snprintf(buf + k, cap - k, "]");
    }
}

/* The end of n BYTES elements starting at data[0..len): 0 and *end set, or -1
 * when a length prefix or an element runs past len. */
static int
walk_bytes(const uint8_t *data, size_t len, int64_t n, size_t *end)
{
    size_t pos = 0;
    for (int64_t e = 0; e < n; e++) {
        if (len - pos < 4) {
            return -1;
        }
        uint32_t el = (uint32_t)data[pos] | (uint32_t)data[pos + 1] << 8 |
                      (uint32_t)data[pos + 2] << 16 | (uint32_t)data[pos + 3] << 24;
        pos += 4;
        if (len - pos < el) {
            return -1;
        }
        pos += el;
    }
    *end = pos;
    return 0;
}

/* Product of dims[from..n), overflow-checked: 0 and *out, or -1. */
static int
dims_product(const int64_t *dims, int32_t from, int32_t n, int64_t *out)
{
    int64_t p = 1;
    for (int32_t i = from; i < n; i++) {
        if (dims[i] < 0 || __builtin_mul_overflow(p, dims[i], &p)) {
            return -1;
        }
    }
    *out = p;
    return 0;
}

/* Whether t's data has exactly the bytes its dims say. */
static sp_status_t
check_data(const sp_backend_tensor_t *t, const char *what, const char *name, char *err,
           size_t err_len)
{
    int64_t elems;
    if (dims_product(t->dims, 0, t->n_dims, &elems) != 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s '%s': the shape's element count overflows",
                       what, name);
    }
    if (t->bytes > 0 && t->data == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s '%s': %zu bytes but no data", what, name,
                       t->bytes);
    }
    if (t->dtype == SP_BT_BYTES) {
        size_t end;
        if (walk_bytes(t->data, t->bytes, elems, &end) != 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s '%s': BYTES data holds fewer than the shape's %lld elements (a "
                           "length prefix runs past the %zu bytes)",
                           what, name, (long long)elems, t->bytes);
        }
        if (end != t->bytes) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s '%s': BYTES data has %zu bytes after the shape's %lld elements",
                           what, name, t->bytes - end, (long long)elems);
        }
        return SP_OK;
    }
    size_t want;
    if (sp_mul_size((size_t)elems, sp_btype_size(t->dtype), &want) != 0 ||
        (uint64_t)elems > SIZE_MAX) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s '%s': the shape's byte size overflows",
                       what, name);
    }
    if (want != t->bytes) {
        char shape[160];
        fmt_dims(shape, sizeof shape, t->n_dims, t->dims);
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s '%s': %zu bytes of data, the shape %s of %s needs %zu", what, name,
                       t->bytes, shape, sp_batcher_btype_name(t->dtype), want);
    }
    return SP_OK;
}

/* Check an item against the model. map[i]: the item's input for declared
 * input i. *rows: the request's rows (1 without a batch dimension). */
static sp_status_t
check_item(const sp_batcher_t *b, const sp_batch_item_t *it, int32_t map[MAX_T], int64_t *rows,
           uint32_t *out_mask, int8_t out_idx[MAX_T], int32_t *n_out, char *err, size_t err_len)
{
    const sp_backend_model_info_t *info = &b->info;
    bool batched = b->p.max_batch_size > 0;
    if (it->done == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "the request has no completion callback");
    }
    if (it->n_inputs < 0 || it->n_inputs > MAX_T || (it->n_inputs > 0 && it->inputs == NULL)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "bad input count %d", (int)it->n_inputs);
    }
    for (int32_t i = 0; i < info->n_inputs; i++) {
        map[i] = -1;
    }
    for (int32_t k = 0; k < it->n_inputs; k++) {
        const char *name = it->inputs[k].name;
        if (name == NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "inputs[%d] has no name", (int)k);
        }
        int32_t i = 0;
        while (i < info->n_inputs && strcmp(info->inputs[i].name, name) != 0) {
            i++;
        }
        if (i == info->n_inputs) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "unknown input '%s' (the model has %d inputs, the first is '%s')", name,
                           (int)info->n_inputs, info->inputs[0].name);
        }
        if (map[i] >= 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "input '%s' is given twice", name);
        }
        map[i] = k;
    }
    *rows = 1;
    for (int32_t i = 0; i < info->n_inputs; i++) {
        const sp_backend_tensor_desc_t *d = &info->inputs[i];
        if (map[i] < 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "missing input '%s'", d->name);
        }
        const sp_backend_tensor_t *t = &it->inputs[map[i]];
        if (t->dtype != d->dtype) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "input '%s': datatype %s, the model expects %s", d->name,
                           sp_batcher_btype_name(t->dtype), sp_batcher_btype_name(d->dtype));
        }
        int32_t off = batched ? 1 : 0;
        bool ok = t->n_dims == d->n_dims + off && t->n_dims <= SP_BACKEND_MAX_DIMS;
        for (int32_t k = 0; ok && k < d->n_dims; k++) {
            int64_t v = t->dims[k + off];
            ok = d->dims[k] < 0 ? v >= 0 : v == d->dims[k];
        }
        if (!ok) {
            char got[160], want[160];
            fmt_dims(got, sizeof got, t->n_dims < 0 ? 0 : t->n_dims > SP_BACKEND_MAX_DIMS
                     ? SP_BACKEND_MAX_DIMS : t->n_dims, t->dims);
            if (batched) {
                int64_t wd[SP_BACKEND_MAX_DIMS + 1];
                wd[0] = -1;
                memcpy(wd + 1, d->dims, sizeof(int64_t) * (size_t)d->n_dims);
                fmt_dims(want, sizeof want, d->n_dims + 1, wd);
            } else {
                fmt_dims(want, sizeof want, d->n_dims, d->dims);
            }
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "input '%s': shape %s does not match the model's %s%s", d->name, got,
                           want, batched ? " (the batch dimension first)" : "");
        }
        if (batched) {
            int64_t r = t->dims[0];
            if (r < 1 || r > b->p.max_batch_size) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "input '%s': %lld rows, the model takes 1 to %d per request",
                               d->name, (long long)r, (int)b->p.max_batch_size);
            }
            if (i > 0 && r != *rows) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "input '%s': %lld rows, but input '%s' has %lld", d->name,
                               (long long)r, info->inputs[0].name, (long long)*rows);
            }
            *rows = r;
        }
        sp_status_t st = check_data(t, "input", d->name, err, err_len);
        if (st != SP_OK) {
            return st;
        }
    }
    *out_mask = 0;
    *n_out = 0;
    if (it->n_outputs < 0 || it->n_outputs > MAX_T || (it->n_outputs > 0 && it->outputs == NULL)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "bad output count %d", (int)it->n_outputs);
    }
    if (it->n_outputs == 0) {
        for (int32_t o = 0; o < info->n_outputs; o++) {
            *out_mask |= 1u << o;
            out_idx[(*n_out)++] = (int8_t)o;
        }
        return SP_OK;
    }
    for (int32_t k = 0; k < it->n_outputs; k++) {
        const char *name = it->outputs[k];
        int32_t o = 0;
        while (name != NULL && o < info->n_outputs && strcmp(info->outputs[o].name, name) != 0) {
            o++;
        }
        if (name == NULL || o == info->n_outputs) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "the model has no output '%s'",
                           name ? name : "(null)");
        }
        if (*out_mask & (1u << o)) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "output '%s' is asked for twice", name);
        }
        *out_mask |= 1u << o;
        out_idx[(*n_out)++] = (int8_t)o;
    }
    return SP_OK;
}

/* ---- submit */

static int32_t
level_of(const sp_batcher_t *b, uint32_t priority)
{
    if (priority == 0 || priority > (uint32_t)b->n_levels) {
        return b->default_level; /* Triton: 0 or out of range is the default */
    }
    return (int32_t)priority - 1;
}

sp_status_t
sp_batcher_submit(sp_batcher_t *b, const sp_batch_item_t *item, char *err, size_t err_len)
{
    if (err != NULL && err_len > 0) {
        err[0] = '\0';
    }
    int32_t map[MAX_T];
    int64_t rows = 1;
    uint32_t out_mask = 0;
    int8_t out_idx[MAX_T];
    int32_t n_out = 0;
    sp_status_t st;
    if (item == NULL) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "no request");
    } else {
        st = check_item(b, item, map, &rows, &out_mask, out_idx, &n_out, err, err_len);
    }
    if (st != SP_OK) {
        pthread_mutex_lock(&b->mu);
        b->st.rejected_invalid++;
        pthread_mutex_unlock(&b->mu);
        return st;
    }

    /* One block: the request, then each input's bytes at a 16-byte boundary. */
    size_t total = (sizeof(req_t) + 15) & ~(size_t)15;
    for (int32_t i = 0; i < b->info.n_inputs; i++) {
        size_t n = item->inputs[map[i]].bytes;
        if (sp_add_size(total, n, &total) != 0 || sp_add_size(total, 15, &total) != 0) {
            return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "the request's inputs are too large");
        }
        total &= ~(size_t)15;
    }
    req_t *r = sp_malloc(total);
    if (r == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory queueing the request (%zu bytes)",
                       total);
    }
    memset(r, 0, sizeof *r);
    uint8_t *data = (uint8_t *)r + ((sizeof(req_t) + 15) & ~(size_t)15);
    for (int32_t i = 0; i < b->info.n_inputs; i++) {
        const sp_backend_tensor_t *src = &item->inputs[map[i]];
        sp_backend_tensor_t *t = &r->in[i];
        *t = *src;
        t->name = b->info.inputs[i].name;
        t->data = src->bytes ? data : NULL;
        if (src->bytes) {
            memcpy(data, src->data, src->bytes);
        }
        data += (src->bytes + 15) & ~(size_t)15;
    }
    r->rows = rows;
    r->done = item->done;
    r->ud = item->ud;
    r->out_mask = out_mask;
    r->n_out = n_out;
    memcpy(r->out_idx, out_idx, sizeof out_idx);
    r->level = level_of(b, item->priority);
    r->heap_i = -1;

    const sp_batcher_queue_policy_t *pol = &b->levels[r->level].pol;
    uint64_t timeout_us = pol->default_timeout_us;
    if (pol->allow_timeout_override && item->timeout_us > 0 &&
        (timeout_us == 0 || item->timeout_us < timeout_us)) {
        timeout_us = item->timeout_us;
    }
    if (timeout_us > MAX_TIMEOUT_US) {
        timeout_us = MAX_TIMEOUT_US;
    }

    int32_t level = r->level;
    pthread_mutex_lock(&b->mu);
    level_t *lv = &b->levels[level];
    if (b->stopping) {
        b->st.rejected_stopping++;
        pthread_mutex_unlock(&b->mu);
        sp_free(r);
        return sp_errf(err, err_len, SP_ERR_CANCELLED,
                       "the model is being unloaded (its batcher is stopping)");
    }
    if (pol->max_queue_size > 0 && lv->main.n + lv->delayed.n >= (int64_t)pol->max_queue_size) {
        b->st.rejected_queue_full++;
        pthread_mutex_unlock(&b->mu);
        sp_free(r);
        return sp_errf(err, err_len, SP_ERR_BUSY,
                       "the queue of priority level %d is full (max_queue_size %u): retry later",
                       (int)level + 1, (unsigned)pol->max_queue_size);
    }
    r->enq_ns = sp_time_ns();
    if (timeout_us > 0) {
        r->deadline_ns = r->enq_ns + (int64_t)timeout_us * 1000;
        if (heap_push(b, r) != 0) {
            pthread_mutex_unlock(&b->mu);
            sp_free(r);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory queueing the request");
        }
        if (r->heap_i == 0) {
            pthread_cond_signal(&b->timer_cv); /* the new earliest deadline */
        }
    }
    list_append(&lv->main, r);
    b->queued++;
    b->queued_rows += r->rows;
    b->st.requests++;
    /* Wake a worker that has nothing to do. One that is waiting out a batch's
     * delay is woken only when the queue now holds a full or preferred batch
     * (or this request's deadline comes first): its timed wait covers the
     * rest, and waking it for every arrival only to form the same partial
     * batch again costs two context switches per request (measured: a third
     * of the server's CPU with the loop and a worker sharing one core). */
    bool wake = b->n_idle > b->n_idle_delay ||
                (b->n_idle_delay > 0 && (b->queued_rows >= batch_target(b) ||
                                         is_preferred(b, b->queued_rows) ||
                                         (timeout_us > 0 && r->heap_i == 0)));
    pthread_mutex_unlock(&b->mu);
    /* Signal after unlocking: a worker woken while the mutex is still held
     * would only block on it again (measured: a quarter of the server's CPU
     * went to that ping-pong with the loop and a worker sharing one core). */
    if (wake) {
        pthread_cond_signal(&b->cv);
    }
    return SP_OK;
}

/* ---- running a batch (worker thread, without mu unless said) */

/* Grow worker scratch i to n bytes: 0, or -1. */
static int
scratch_reserve(worker_t *w, int32_t i, size_t n)
{
    if (w->scratch_cap[i] >= n) {
        return 0;
    }
    size_t cap = w->scratch_cap[i] * 2 > n ? w->scratch_cap[i] * 2 : n;
    void *p = sp_realloc(w->scratch[i], cap);
    if (p == NULL) {
        return -1;
    }
    w->scratch[i] = p;
    w->scratch_cap[i] = cap;
    return 0;
}

/*
 * Check execute()'s output t (slot j of a batch of rows) and record each
 * request's bytes of it in r->out_off[j]/out_len[j]. SP_OK, or SP_ERR_IO with
 * msg saying what the backend got wrong.
 */
static sp_status_t
split_output(const sp_batcher_t *b, const sp_backend_tensor_t *t, int32_t j, req_t *chain,
             int64_t rows, char *msg, size_t msg_len)
{
    bool batched = b->p.max_batch_size > 0;
    const char *name = t->name;
    if (t->n_dims < (batched ? 1 : 0) || t->n_dims > SP_BACKEND_MAX_DIMS) {
        return sp_errf(msg, msg_len, SP_ERR_IO, "backend output '%s': %d dims", name,
                       (int)t->n_dims);
    }
    if ((unsigned)t->dtype >= SP_BT_COUNT_) {
        return sp_errf(msg, msg_len, SP_ERR_IO, "backend output '%s': unknown datatype %d", name,
                       (int)t->dtype);
    }
    if (batched && t->dims[0] != rows) {
        return sp_errf(msg, msg_len, SP_ERR_IO,
                       "backend output '%s': %lld rows for a batch of %lld", name,
                       (long long)t->dims[0], (long long)rows);
    }
    char tmp[256];
    if (check_data(t, "backend output", name, tmp, sizeof tmp) != SP_OK) {
        return sp_errf(msg, msg_len, SP_ERR_IO, "%s", tmp);
    }
    if (!batched) {
        chain->out_off[j] = 0;
        chain->out_len[j] = t->bytes;
        return SP_OK;
    }
    int64_t per_row = 0;
    dims_product(t->dims, 1, t->n_dims, &per_row); /* cannot fail: check_data passed */
    size_t off = 0;
    for (req_t *r = chain; r != NULL; r = r->bnext) {
        size_t len;
        if (t->dtype == SP_BT_BYTES) {
            /* Element counts cannot overflow: they are at most the whole's, checked above. */
            len = 0;
            walk_bytes((const uint8_t *)t->data + off, t->bytes - off, r->rows * per_row, &len);
        } else {
            len = (size_t)(r->rows * per_row) * sp_btype_size(t->dtype);
        }
        r->out_off[j] = off;
        r->out_len[j] = len;
        off += len;
    }
    return SP_OK;
}

static void
bucket_add(sp_batcher_stats_t *st, int64_t rows)
{
    int32_t i = 0;
    while (i < st->n_hist - 1 && st->hist_le[i] < rows) {
        i++;
    }
    st->hist[i]++;
}

/* Fail every request of a batch with one status (stats under mu, callbacks without). */
static void
fail_batch(sp_batcher_t *b, const plan_t *pl, sp_status_t st, sp_batch_reason_t reason,
           const char *msg)
{
    pthread_mutex_lock(&b->mu);
    b->st.executing--;
    if (reason == SP_BATCH_REASON_NOMEM) {
        b->st.failed_nomem += (uint64_t)pl->n;
    } else {
        b->st.failed_execute += (uint64_t)pl->n;
    }
    pthread_mutex_unlock(&b->mu);
    complete_chain_error(pl->first, st, reason, msg);
}

static void
run_batch(worker_t *w, const plan_t *pl)
{
    sp_batcher_t *b = w->b;
    const sp_backend_model_info_t *info = &b->info;
    const sp_backend_host_t *host = b->host;
    req_t *first = pl->first;
    char msg[512];

    /* Inputs: a lone request's own copy, else every request's rows concatenated. */
    int64_t t_in = sp_time_ns();
    sp_backend_tensor_t in[MAX_T];
    memcpy(in, first->in, sizeof(sp_backend_tensor_t) * (size_t)info->n_inputs);
    if (pl->n > 1) {
        for (int32_t i = 0; i < info->n_inputs; i++) {
            size_t total = 0;
            for (req_t *r = first; r != NULL; r = r->bnext) {
                total += r->in[i].bytes; /* cannot overflow: every part is in memory */
            }
            if (scratch_reserve(w, i, total) != 0) {
                snprintf(msg, sizeof msg, "out of memory merging a batch of %lld rows (%zu bytes)",
                         (long long)pl->rows, total);
                fail_batch(b, pl, SP_ERR_NOMEM, SP_BATCH_REASON_NOMEM, msg);
                return;
            }
            uint8_t *dst = w->scratch[i];
            for (req_t *r = first; r != NULL; r = r->bnext) {
                if (r->in[i].bytes) {
                    memcpy(dst, r->in[i].data, r->in[i].bytes);
                    dst += r->in[i].bytes;
                }
            }
            in[i].dims[0] = pl->rows;
            in[i].data = total ? w->scratch[i] : NULL;
            in[i].bytes = total;
        }
    }

    /* Outputs: the union of what the requests want, in declared order. */
    uint32_t mask = 0;
    for (req_t *r = first; r != NULL; r = r->bnext) {
        mask |= r->out_mask;
    }
    sp_backend_tensor_t out[MAX_T];
    const char *names[MAX_T];
    int32_t slot_of[MAX_T], n_bo = 0;
    memset(out, 0, sizeof out);
    for (int32_t o = 0; o < info->n_outputs; o++) {
        slot_of[o] = -1;
        if (mask & (1u << o)) {
            names[n_bo] = out[n_bo].name = info->outputs[o].name;
            slot_of[o] = n_bo++;
        }
    }

    char berr[384];
    berr[0] = '\0';
    int64_t t0 = sp_time_ns();
    int rc = b->api->execute(w->instance, in, info->n_inputs, out, n_bo, berr, sizeof berr);
    int64_t t1 = sp_time_ns();
    berr[sizeof berr - 1] = '\0';

    sp_status_t st = SP_OK;
    for (int32_t j = 0; j < n_bo; j++) {
        out[j].name = names[j]; /* ours, whatever the backend did with them */
    }
    if (rc != 0) {
        snprintf(msg, sizeof msg, "execute failed: %s",
                 berr[0] ? berr : "(the backend gave no message)");
        st = SP_ERR_IO;
    }
    for (int32_t j = 0; j < n_bo && st == SP_OK; j++) {
        st = split_output(b, &out[j], j, first, pl->rows, msg, sizeof msg);
    }

    /* Each request's outputs: a lone request takes execute()'s buffers, else
     * its rows are copied out. A failed copy fails that request only. */
    bool single = pl->n == 1;
    int64_t n_nomem = 0;
    for (req_t *r = first; r != NULL && st == SP_OK; r = r->bnext) {
        r->res_nomem = false;
        for (int32_t k = 0; k < r->n_out; k++) {
            int32_t j = slot_of[r->out_idx[k]];
            void *p = NULL;
            if (single) {
                p = out[j].data;
                out[j].data = NULL; /* now the request's */
            } else if (r->out_len[j] > 0 && !r->res_nomem) {
                p = host->alloc_fn(r->out_len[j]);
                if (p == NULL) {
                    r->res_nomem = true;
                } else {
                    memcpy(p, (const uint8_t *)out[j].data + r->out_off[j], r->out_len[j]);
                }
            }
            r->res_data[k] = p;
        }
        if (r->res_nomem) {
            for (int32_t k = 0; k < r->n_out; k++) {
                if (r->res_data[k] != NULL) {
                    host->free_fn(r->res_data[k]);
                    r->res_data[k] = NULL;
                }
            }
            n_nomem++;
        }
    }
    int64_t t_done = sp_time_ns();

    /* Stats and the controller, before any callback: whoever a callback wakes
     * sees its batch counted. */
    pthread_mutex_lock(&b->mu);
    sp_batcher_stats_t *s = &b->st;
    s->executing--;
    s->batches++;
    s->rows += (uint64_t)pl->rows;
    bucket_add(s, pl->rows);
    s->execute_us_sum += (uint64_t)((t1 - t0) / 1000);
    s->execute_count++;
    for (req_t *r = first; r != NULL; r = r->bnext) {
        s->queue_us_sum += (uint64_t)((t0 - r->enq_ns) / 1000);
        s->queue_count++;
    }
    if (st != SP_OK) {
        s->failed_execute += (uint64_t)pl->n;
    } else {
        s->failed_nomem += (uint64_t)n_nomem;
        s->completed += (uint64_t)(pl->n - n_nomem);
        for (req_t *r = first; r != NULL; r = r->bnext) {
            if (r->res_nomem) {
                continue;
            }
            s->latency_us_sum += (uint64_t)((t_done - r->enq_ns) / 1000);
            s->latency_count++;
            if (b->p.adaptive && !b->p.external_latency) {
                sp_batcher_ctl_latency(&b->ctl, t_done - r->enq_ns);
            }
        }
        if (b->p.adaptive) {
            int64_t cpu_ns = -1;
            struct timespec ts;
            if (sp_batcher_ctl_due(&b->ctl, t_done) &&
                clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0) {
                cpu_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
            }
            sp_batcher_ctl_batch(&b->ctl, pl->rows, t1 - t0, pl->why, pl->backlog, t_done,
                                 b->n_workers, cpu_ns);
        }
    }
    pthread_mutex_unlock(&b->mu);

    if (st != SP_OK) {
        for (int32_t j = 0; j < n_bo; j++) {
            if (out[j].data != NULL) {
                host->free_fn(out[j].data);
            }
        }
        for (req_t *r = first; r != NULL;) {
            req_t *next = r->bnext;
            result_priv_t rp;
            memset(&rp, 0, sizeof rp);
            rp.pub.status = st;
            rp.pub.reason = SP_BATCH_REASON_EXECUTE;
            rp.pub.message = msg;
            rp.pub.queue_us = (t0 - r->enq_ns) / 1000;
            rp.pub.compute_us = (t1 - t0) / 1000;
            rp.pub.batch_rows = (int32_t)pl->rows;
            rp.pub.batch_requests = pl->n;
            r->done(r->ud, &rp.pub);
            sp_free(r);
            r = next;
        }
        return;
    }

    bool batched = b->p.max_batch_size > 0;
    for (req_t *r = first; r != NULL;) {
        req_t *next = r->bnext;
        result_priv_t rp;
        sp_backend_tensor_t ro[MAX_T];
        memset(&rp, 0, sizeof rp);
        rp.pub.queue_us = (t0 - r->enq_ns) / 1000;
        rp.pub.compute_us = (t1 - t0) / 1000;
        rp.pub.batch_rows = (int32_t)pl->rows;
        rp.pub.batch_requests = pl->n;
        rp.pub.input_us = (t0 - t_in) / 1000;
        rp.pub.output_us = (t_done - t1) / 1000;
        rp.pub.batch_first = r == first;
        if (r->res_nomem) {
            snprintf(msg, sizeof msg, "out of memory copying the request's outputs");
            rp.pub.status = SP_ERR_NOMEM;
            rp.pub.reason = SP_BATCH_REASON_NOMEM;
            rp.pub.message = msg;
            r->done(r->ud, &rp.pub);
        } else {
            for (int32_t k = 0; k < r->n_out; k++) {
                int32_t j = slot_of[r->out_idx[k]];
                ro[k] = out[j];
                ro[k].data = r->res_data[k];
                ro[k].bytes = r->out_len[j];
                if (batched) {
                    ro[k].dims[0] = r->rows;
                }
            }
            rp.pub.status = SP_OK;
            rp.pub.reason = SP_BATCH_REASON_OK;
            rp.pub.message = "";
            rp.pub.outputs = ro;
            rp.pub.n_outputs = r->n_out;
            r->done(r->ud, &rp.pub);
            for (int32_t k = 0; k < r->n_out; k++) {
                if (!rp.taken[k] && r->res_data[k] != NULL) {
                    host->free_fn(r->res_data[k]);
                }
            }
        }
        sp_free(r);
        r = next;
    }
    for (int32_t j = 0; j < n_bo; j++) {
        if (out[j].data != NULL) {
            host->free_fn(out[j].data); /* a batch's whole outputs (a lone request took its own) */
        }
    }
}

/* ---- workers */

/* Everything queued, chained by bnext (stop without drain). */
static req_t *
take_all(sp_batcher_t *b)
{
    req_t *all = NULL, **tail = &all;
    for (req_t *r = first_from(b, 0, false); r != NULL; r = first_from(b, 0, false)) {
        unqueue(b, r);
        b->st.cancelled++;
        r->bnext = NULL;
        *tail = r;
        tail = &r->bnext;
    }
    return all;
}

/* Complete what expire() rejected (without mu). */
static void
complete_timeouts(req_t *rejected, int64_t now)
{
    char msg[256];
    while (rejected != NULL) {
        req_t *next = rejected->bnext;
        snprintf(msg, sizeof msg,
                 "the request timed out after %.3f ms in the queue (timeout %.3f ms, "
                 "timeout_action REJECT): the model is overloaded, retry later",
                 (double)(now - rejected->enq_ns) / 1e6,
                 (double)(rejected->deadline_ns - rejected->enq_ns) / 1e6);
        complete_error(rejected, SP_ERR_BUSY, SP_BATCH_REASON_TIMEOUT, msg, now);
        rejected = next;
    }
}

static struct timespec
abs_ts(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
    return ts;
}

static void *
timer_main(void *arg)
{
    sp_batcher_t *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->timer_quit) {
        int64_t now = sp_time_ns();
        req_t *rejected = expire(b, now);
        if (rejected != NULL) {
            pthread_mutex_unlock(&b->mu);
            complete_timeouts(rejected, now);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (b->heap_n > 0) {
            struct timespec ts = abs_ts(b->heap[0]->deadline_ns);
            pthread_cond_timedwait(&b->timer_cv, &b->mu, &ts);
        } else {
            pthread_cond_wait(&b->timer_cv, &b->mu);
        }
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static void *
worker_main(void *arg)
{
    worker_t *w = arg;
    sp_batcher_t *b = w->b;

    pthread_mutex_lock(&b->mu);
    for (;;) {
        int64_t now = sp_time_ns();
        req_t *rejected = expire(b, now);
        if (rejected != NULL) {
            pthread_mutex_unlock(&b->mu);
            complete_timeouts(rejected, now);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (b->stopping && !b->drain) {
            req_t *all = take_all(b);
            if (all == NULL) {
                break;
            }
            pthread_mutex_unlock(&b->mu);
            complete_chain_error(all, SP_ERR_CANCELLED, SP_BATCH_REASON_STOPPED,
                                 "the model was unloaded before the request ran");
            pthread_mutex_lock(&b->mu);
            continue;
        }
        plan_t pl;
        int64_t wake = 0;
        if (form(b, now, &pl, &wake)) {
            for (req_t *r = pl.first; r != NULL; r = r->bnext) {
                unqueue(b, r);
            }
            pl.backlog = b->queued > 0 &&
                         (pl.why == SP_BATCH_WHY_FULL || pl.why == SP_BATCH_WHY_PREFERRED);
            b->st.executing++;
            if (b->queued > 0 && b->n_idle > 0) {
                pthread_cond_signal(&b->cv); /* the rest may be ready for another instance */
            }
            pthread_mutex_unlock(&b->mu);
            run_batch(w, &pl);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (b->stopping && b->queued == 0) {
            break; /* drained */
        }
        int64_t due = wake;
        if (b->heap_n > 0 && (due == 0 || b->heap[0]->deadline_ns < due)) {
            due = b->heap[0]->deadline_ns;
        }
        b->n_idle++;
        b->n_idle_delay += wake > 0;
        if (due > 0) {
            struct timespec ts = abs_ts(due);
            pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        } else {
            pthread_cond_wait(&b->cv, &b->mu);
        }
        b->n_idle--;
        b->n_idle_delay -= wake > 0;
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ---- create, stop, destroy, stats */

static sp_status_t
check_policy(const sp_batcher_queue_policy_t *q, const char *what, char *err, size_t err_len)
{
    if (q->timeout_action != SP_BATCHER_TIMEOUT_REJECT &&
        q->timeout_action != SP_BATCHER_TIMEOUT_DELAY) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s.timeout_action: unknown value %d", what,
                       (int)q->timeout_action);
    }
    return SP_OK;
}

static sp_status_t
check_params(const sp_batcher_params_t *p, const sp_backend_api_t *api, void *const *instances,
             int n_instances, const sp_backend_model_info_t *info, const sp_backend_host_t *host,
             char *err, size_t err_len)
{
    if (p == NULL || api == NULL || api->execute == NULL || info == NULL || host == NULL ||
        host->alloc_fn == NULL || host->free_fn == NULL || instances == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "batcher: params, api->execute, instances, info and host->alloc_fn/free_fn "
                       "are required");
    }
    if (n_instances < 1 || n_instances > 1024) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "batcher: %d instances (1 to 1024)",
                       n_instances);
    }
    if (info->n_inputs < 1 || info->n_inputs > MAX_T || info->n_outputs < 0 ||
        info->n_outputs > MAX_T) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "batcher: the model has %d inputs and %d outputs (1..%d and 0..%d)",
                       (int)info->n_inputs, (int)info->n_outputs, MAX_T, MAX_T);
    }
    for (int32_t i = 0; i < info->n_inputs + info->n_outputs; i++) {
        const sp_backend_tensor_desc_t *d =
            i < info->n_inputs ? &info->inputs[i] : &info->outputs[i - info->n_inputs];
        if (d->n_dims < 0 || d->n_dims > SP_BACKEND_MAX_DIMS - 1 ||
            (unsigned)d->dtype >= SP_BT_COUNT_ || memchr(d->name, '\0', sizeof d->name) == NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "batcher: the model's tensor %d has a bad name, datatype or rank",
                           (int)i);
        }
    }
    if (p->max_batch_size < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "max_batch_size: %d (>= 0)",
                       (int)p->max_batch_size);
    }
    if (p->max_queue_delay_us > MAX_DELAY_US) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "dynamic_batching.max_queue_delay_microseconds: %llu is more than %llu",
                       (unsigned long long)p->max_queue_delay_us, MAX_DELAY_US);
    }
    if (p->n_preferred < 0 || p->n_preferred > SP_BATCHER_MAX_PREFERRED) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "dynamic_batching.preferred_batch_size: %d entries (at most %d)",
                       (int)p->n_preferred, SP_BATCHER_MAX_PREFERRED);
    }
    for (int32_t i = 0; i < p->n_preferred; i++) {
        if (p->preferred_batch_size[i] < 1 || p->preferred_batch_size[i] > p->max_batch_size) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "dynamic_batching.preferred_batch_size[%d]: %d is not in 1..%d "
                           "(max_batch_size)",
                           (int)i, (int)p->preferred_batch_size[i], (int)p->max_batch_size);
        }
    }
    if (p->priority_levels > SP_BATCHER_MAX_LEVELS) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "dynamic_batching.priority_levels: %u (at most %d)",
                       (unsigned)p->priority_levels, SP_BATCHER_MAX_LEVELS);
    }
    if (p->priority_levels > 0 &&
        (p->default_priority_level < 1 || p->default_priority_level > p->priority_levels)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "dynamic_batching.default_priority_level: %u is not in 1..%u",
                       (unsigned)p->default_priority_level, (unsigned)p->priority_levels);
    }
    sp_status_t st = check_policy(&p->default_queue_policy, "dynamic_batching.default_queue_policy",
                                  err, err_len);
    for (uint32_t l = 0; st == SP_OK && l < SP_BATCHER_MAX_LEVELS; l++) {
        if (p->has_level_policy[l]) {
            if (l >= p->priority_levels) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "dynamic_batching.priority_queue_policy: level %u is beyond "
                               "priority_levels %u",
                               (unsigned)l + 1, (unsigned)p->priority_levels);
            }
            st = check_policy(&p->level_policy[l], "dynamic_batching.priority_queue_policy", err,
                              err_len);
        }
    }
    if (st != SP_OK) {
        return st;
    }
    if (p->adaptive && !(p->target_p99_ms > 0 && isfinite(p->target_p99_ms))) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "adaptive batching needs a p99 latency target > 0 ms (got %g)",
                       p->target_p99_ms);
    }
    return SP_OK;
}

sp_status_t
sp_batcher_create(const sp_batcher_params_t *params, const sp_backend_api_t *api,
                  void *const *instances, int n_instances, const sp_backend_model_info_t *info,
                  const sp_backend_host_t *host, sp_batcher_t **out, char *err, size_t err_len)
{
    if (out == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "batcher: no out pointer");
    }
    *out = NULL;
    sp_status_t st = check_params(params, api, instances, n_instances, info, host, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    sp_batcher_t *b = sp_calloc(1, sizeof *b);
    if (b == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "batcher: out of memory");
    }
    b->p = *params;
    b->api = api;
    b->host = host;
    b->info = *info;
    b->n_levels = params->priority_levels > 0 ? (int32_t)params->priority_levels : 1;
    b->default_level =
        params->priority_levels > 0 ? (int32_t)params->default_priority_level - 1 : 0;
    b->batching = params->enabled && params->max_batch_size > 0;
    if (!b->batching) {
        b->p.adaptive = false; /* nothing to tune */
    }
    for (int32_t i = 0; i < info->n_inputs; i++) {
        for (int32_t d = 0; d < info->inputs[i].n_dims; d++) {
            b->var_dims = b->var_dims || info->inputs[i].dims[d] < 0;
        }
    }
    for (int32_t i = 0; i < params->n_preferred; i++) { /* sorted, duplicates dropped */
        int32_t v = params->preferred_batch_size[i], k = b->n_pref;
        if (is_preferred(b, v)) {
            continue;
        }
        while (k > 0 && b->pref[k - 1] > v) {
            b->pref[k] = b->pref[k - 1];
            k--;
        }
        b->pref[k] = v;
        b->n_pref++;
    }
    for (int32_t l = 0; l < b->n_levels; l++) {
        level_t *lv = &b->levels[l];
        lv->pol = params->has_level_policy[l] && params->priority_levels > 0
                      ? params->level_policy[l]
                      : params->default_queue_policy;
        b->has_timeouts = b->has_timeouts || lv->pol.default_timeout_us > 0 ||
                          lv->pol.allow_timeout_override;
    }
    /* Rows-per-batch buckets 1, 2, 4, ... up to max_batch_size. */
    sp_batcher_stats_t *s = &b->st;
    int64_t maxb = params->max_batch_size > 1 ? params->max_batch_size : 1;
    s->n_hist = 0;
    for (int64_t le = 1;; le *= 2) {
        if (le >= maxb || s->n_hist == SP_BATCHER_HIST_MAX - 1) {
            s->hist_le[s->n_hist++] = maxb;
            break;
        }
        s->hist_le[s->n_hist++] = le;
    }
    if (b->p.adaptive) {
        sp_batcher_ctl_init(&b->ctl, params->target_p99_ms, params->max_queue_delay_us,
                            params->max_batch_size);
        b->ctl.cpus = sp_pool_cpu_count(); /* affinity and cgroup quota, as the pools size themselves */
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, &ca);
    pthread_cond_init(&b->timer_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (b->has_timeouts) {
        int rc = pthread_create(&b->timer, NULL, timer_main, b);
        if (rc != 0) {
            sp_batcher_destroy(b);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "batcher: cannot start the timer thread: %s",
                           strerror(rc));
        }
        b->timer_started = true;
    }

    b->workers = sp_calloc((size_t)n_instances, sizeof *b->workers);
    if (b->workers == NULL) {
        sp_batcher_destroy(b);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "batcher: out of memory");
    }
    b->n_workers = n_instances;
    for (int i = 0; i < n_instances; i++) {
        worker_t *w = &b->workers[i];
        w->b = b;
        w->instance = instances[i];
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            sp_batcher_destroy(b);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "batcher: cannot start a worker thread: %s",
                           strerror(rc));
        }
        w->started = true;
    }
    *out = b;
    return SP_OK;
}

void
sp_batcher_stop(sp_batcher_t *b, bool drain)
{
    if (b == NULL) {
        return;
    }
    pthread_mutex_lock(&b->mu);
    if (b->stopping) {
        pthread_mutex_unlock(&b->mu); /* another stop joins (or joined) the workers */
        return;
    }
    b->stopping = true;
    b->drain = drain;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n_workers; i++) {
        if (b->workers[i].started) {
            pthread_join(b->workers[i].thread, NULL);
        }
    }
    /* The queue is empty now (the workers leave only then, and submit refuses);
     * the timer ran until here so that deadlines fired during a drain. */
    pthread_mutex_lock(&b->mu);
    b->timer_quit = true;
    pthread_cond_signal(&b->timer_cv);
    pthread_mutex_unlock(&b->mu);
    if (b->timer_started) {
        pthread_join(b->timer, NULL);
    }
    pthread_mutex_lock(&b->mu);
    b->joined = true;
    pthread_mutex_unlock(&b->mu);
}

void
sp_batcher_destroy(sp_batcher_t *b)
{
    if (b == NULL) {
        return;
    }
    sp_batcher_stop(b, false);
    if (b->workers != NULL) {
        for (int i = 0; i < b->n_workers; i++) {
            for (int32_t j = 0; j < MAX_T; j++) {
                sp_free(b->workers[i].scratch[j]);
            }
        }
    }
    sp_free(b->workers);
    sp_free(b->heap);
    pthread_cond_destroy(&b->cv);
    pthread_cond_destroy(&b->timer_cv);
    pthread_mutex_destroy(&b->mu);
    sp_free(b);
}

void
sp_batcher_get_stats(sp_batcher_t *b, sp_batcher_stats_t *out)
{
    pthread_mutex_lock(&b->mu);
    *out = b->st;
    out->queued = b->queued;
    out->adaptive = b->p.adaptive;
    if (b->p.adaptive) {
        out->delay_us = (uint64_t)(b->ctl.delay_ns / 1000);
        out->max_batch = b->ctl.cap;
        out->p99_ms = (double)b->ctl.p99_ns / 1e6;
        out->load = b->ctl.load;
        out->adapt_increases = (uint64_t)b->ctl.increases;
        out->adapt_decreases = (uint64_t)b->ctl.decreases;
    } else {
        out->delay_us = b->batching ? b->p.max_queue_delay_us : 0;
        out->max_batch = b->batching ? b->p.max_batch_size : 1;
    }
    pthread_mutex_unlock(&b->mu);
}

/* ---- the adaptive controller */

#define CTL_FORGET 0.98 /* weight of the previous batches in the cost fit, per batch */
#define CTL_GROW_LOAD 0.75 /* the load from which a delay may grow while under the target */

void
sp_batcher_observe_latency(sp_batcher_t *b, int64_t latency_ns)
{
    if (b == NULL || !b->p.adaptive || !b->p.external_latency) {
        return;
    }
    pthread_mutex_lock(&b->mu);
    sp_batcher_ctl_latency(&b->ctl, latency_ns);
    pthread_mutex_unlock(&b->mu);
}

void
sp_batcher_ctl_init(sp_batcher_ctl_t *c, double target_ms, uint64_t max_delay_us, int32_t max_cap)
{
    memset(c, 0, sizeof *c);
    c->target_ns = target_ms > 0 ? (int64_t)(target_ms * 1e6) : 0;
    if (c->target_ns == 0 && target_ms > 0) {
        c->target_ns = 1;
    }
    c->max_delay_ns = (int64_t)(max_delay_us > MAX_DELAY_US ? MAX_DELAY_US : max_delay_us) * 1000;
    c->max_cap = max_cap < 1 ? 1 : max_cap;
    c->cap = c->max_cap;
    c->delay_ns = 0;
    c->period_start_ns = -1;
    c->period_cpu_ns = -1;
}

bool
sp_batcher_ctl_due(const sp_batcher_ctl_t *c, int64_t now_ns)
{
    return c->target_ns > 0 && c->since >= SP_BATCHER_CTL_PERIOD &&
           c->n >= SP_BATCHER_CTL_MIN_SAMPLES && c->period_start_ns >= 0 &&
           now_ns - c->period_start_ns >= SP_BATCHER_CTL_MIN_PERIOD_NS;
}

/* Fitted execute time of a batch of rows, in ns: false without data. When the
 * slope is unknown the fit says the whole cost is fixed (a smaller batch saves
 * nothing), the pessimistic reading for a cap cut. */
static bool
ctl_exec_ns(const sp_batcher_ctl_t *c, double rows, double *ns)
{
    if (c->sw < 1e-9) {
        return false;
    }
    double mx = c->sx / c->sw, my = c->sy / c->sw;
    double vx = c->sxx / c->sw - mx * mx, cxy = c->sxy / c->sw - mx * my;
    double a = my, slope = 0;
    /* A slope needs batch sizes that really differ (a spread of at least 10% of
     * the mean); a fit that says the fixed cost is negative is noise. Both fall
     * back to "all fixed", never to "all per row", which would make every cut
     * look free. */
    if (vx > 0.25 && vx > 0.01 * mx * mx) {
        double s = cxy / vx, a_fit = my - s * mx;
        if (s >= 0 && a_fit >= 0) {
            slope = s;
            a = a_fit;
        }
    }
    *ns = a + slope * rows;
    return *ns > 0;
}

/* Nearest-rank p99 of the window: the k-th largest, k = n - ceil(0.99 n) + 1
 * (at most 3 for 256 samples). */
static int64_t
ctl_p99(const sp_batcher_ctl_t *c)
{
    int32_t n = c->n;
    if (n == 0) {
        return 0;
    }
    int32_t k = n - (int32_t)((99 * (int64_t)n + 99) / 100) + 1;
    int64_t top[SP_BATCHER_CTL_WINDOW / 100 + 2]; /* descending */
    int32_t have = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t v = c->win[i];
        int32_t at;
        if (have < k) {
            at = have++;
        } else if (v > top[k - 1]) {
            at = k - 1;
        } else {
            continue;
        }
        while (at > 0 && top[at - 1] < v) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = v;
    }
    return top[k - 1];
}

void
sp_batcher_ctl_latency(sp_batcher_ctl_t *c, int64_t latency_ns)
{
    c->win[c->head] = latency_ns < 0 ? 0 : latency_ns;
    c->head = (c->head + 1) % SP_BATCHER_CTL_WINDOW;
    if (c->n < SP_BATCHER_CTL_WINDOW) {
        c->n++;
    }
    c->since++;
}

void
sp_batcher_ctl_batch(sp_batcher_ctl_t *c, int64_t rows, int64_t exec_ns, sp_batch_why_t why,
                     bool backlog, int64_t now_ns, int n_instances, int64_t cpu_ns)
{
    double x = (double)rows, y = (double)(exec_ns < 0 ? 0 : exec_ns);
    c->sw = c->sw * CTL_FORGET + 1;
    c->sx = c->sx * CTL_FORGET + x;
    c->sy = c->sy * CTL_FORGET + y;
    c->sxx = c->sxx * CTL_FORGET + x * x;
    c->sxy = c->sxy * CTL_FORGET + x * y;
    if (c->period_start_ns < 0) {
        c->period_start_ns = now_ns - (exec_ns > 0 ? exec_ns : 0);
    }
    c->period_rows += rows;
    c->period_exec_ns += exec_ns > 0 ? exec_ns : 0;
    if (why == SP_BATCH_WHY_FULL || why == SP_BATCH_WHY_PREFERRED) {
        c->hit_cap = true;
    } else if (why == SP_BATCH_WHY_DELAY) {
        c->left_on_delay = true;
    }
    c->backlog = c->backlog || backlog;
    if (!sp_batcher_ctl_due(c, now_ns)) {
        return;
    }
    c->p99_ns = ctl_p99(c);
    double elapsed = (double)(now_ns - c->period_start_ns);
    double rate = elapsed > 0 ? (double)c->period_rows / elapsed : 0; /* rows per ns */
    bool over = c->p99_ns > c->target_ns, under = c->p99_ns * 10 < c->target_ns * 7;
    /* How busy the instances were: waiting for more rows only pays when they are
     * a bottleneck; an idle instance gains nothing from a delay but latency. */
    double util = elapsed > 0 ? (double)c->period_exec_ns / (elapsed * (n_instances > 0 ? n_instances : 1)) : 0;
    /* How busy the server was: for a small model the HTTP loop and the hand-offs
     * cost more than execute(), and it is their cost per batch that a delay
     * amortises. Unknown on the first period (no CPU reading at its start). */
    double server = -1;
    if (cpu_ns >= 0 && c->period_cpu_ns >= 0 && c->cpus > 0 && elapsed > 0) {
        server = (double)(cpu_ns - c->period_cpu_ns) / (elapsed * c->cpus);
    }
    double load = server > util ? server : util;
    c->load = load;
    int32_t cap_step = c->max_cap / 16 > 1 ? c->max_cap / 16 : 1;
    bool cut = false;
    const int64_t moves0 = c->increases + c->decreases;
    if (over && server >= 0.85) {
        /* Saturated: the p99 is queueing behind work the server cannot keep up
         * with. A shorter wait would only add per-batch work (wake-ups,
         * hand-offs, per-call overhead) and lengthen the queue; larger batches
         * are the one way to more throughput. */
        if (c->cap < c->max_cap) {
            c->cap = c->cap + cap_step > c->max_cap ? c->max_cap : c->cap + cap_step;
            c->increases++;
        } else if (c->delay_ns < c->max_delay_ns) {
            int64_t d = c->delay_ns * 2 > c->max_delay_ns / 8 ? c->delay_ns * 2 : c->max_delay_ns / 8;
            c->delay_ns = min64(c->max_delay_ns, d > 1000 ? d : 1000);
            c->increases++;
        }
    } else if (over && c->delay_ns > 0) {
        /* Waiting is pure added latency: it goes first. But not while the server
         * is busy (0.7 .. 0.85): a shorter wait could tip it into saturation, so
         * D holds there (the band between this rule and the one above). */
        if (load < 0.7) {
            c->delay_ns /= 2;
            if (c->delay_ns < c->max_delay_ns / 100) {
                c->delay_ns = 0;
            }
            cut = true;
        }
    } else if (c->backlog) {
        /* Requests were left behind by full batches: the instances are short of
         * throughput, and a smaller cap would only make the queue (and the
         * latency) grow. Give back cap if it was cut, never cut it here. */
        if (c->cap < c->max_cap) {
            c->cap = c->cap + cap_step > c->max_cap ? c->max_cap : c->cap + cap_step;
            c->increases++;
        }
    } else if (over && c->cap > 1) {
        int32_t cap = c->cap * 3 / 4;
        cap = cap >= c->cap ? c->cap - 1 : cap < 1 ? 1 : cap;
        double e, e_now;
        /* Only when a full batch is a real part of the latency (a request waits for at
         * most about two batches: the one running and its own; below a quarter of the
         * target the p99 comes from elsewhere, queueing bursts or a noisy machine, and
         * a smaller cap cannot help), and when the fitted cost says the instances
         * still keep up with the arrivals at the smaller cap. */
        if (ctl_exec_ns(c, c->cap, &e_now) && e_now * 4 > (double)c->target_ns &&
            ctl_exec_ns(c, cap, &e) && (double)n_instances * cap / e >= 1.25 * rate) {
            c->cap = cap;
            cut = true;
        }
    } else if (load < 0.25 && c->delay_ns > 0) {
        /* Mostly idle: batching buys no throughput, so the delay is pure latency. */
        c->delay_ns /= 2;
        if (c->delay_ns < c->max_delay_ns / 100) {
            c->delay_ns = 0;
        }
        c->decreases++;
    } else if (under) {
        if (c->hit_cap && c->cap < c->max_cap) {
            c->cap = c->cap + cap_step > c->max_cap ? c->max_cap : c->cap + cap_step;
            c->increases++;
        } else if (c->left_on_delay && c->delay_ns < c->max_delay_ns && load >= CTL_GROW_LOAD &&
                   rate * (double)c->max_delay_ns >= 1.0) {
            /* The server is busy enough that it will need the throughput (below
             * CTL_GROW_LOAD it keeps up one request at a time, and a delay there
             * only spends the target's headroom: measured at 5,000 req/s with the
             * rule at half load, the p99 went from 0.45 ms to 2.5-3.6), and
             * waiting can gather at least one more row within the allowed delay. The
             * step is half the headroom to 0.7 * target: latency grows about one for
             * one with the delay (a little more as batches grow), so the p99 closes
             * in on the bottom of the band from below and never jumps past it, and
             * the band's 30% is left for noise. */
            int64_t step = (c->target_ns * 7 / 10 - c->p99_ns) / 2;
            int64_t min_step = c->max_delay_ns / 256 > 1000 ? c->max_delay_ns / 256 : 1000;
            c->delay_ns = min64(c->max_delay_ns, c->delay_ns + (step > min_step ? step : min_step));
            c->increases++;
        }
    }
    if (cut) {
        c->decreases++;
    }
    if (c->increases + c->decreases != moves0) {
        /* The window's samples ran with the old knobs: judge the new ones on
         * their own. Keeping them after an increase made the controller see
         * the queue it had just relieved and cut again (measured at 15,000
         * req/s: the delay swung between 0 and 0.5 ms every 17 ms period, and
         * the p99 of those seconds was 4-9 ms). */
        c->n = c->head = 0;
    }
    c->since = 0;
    c->period_start_ns = now_ns;
    c->period_cpu_ns = cpu_ns;
    c->period_rows = 0;
    c->period_exec_ns = 0;
    c->hit_cap = c->left_on_delay = c->backlog = false;
}
