/*
 * tensor_infer.c - the KServe v2 infer and metadata routes of a tensor model
 * (a backend plugin behind the dynamic batcher, serving/tensor_model.h).
 *
 * A request is decoded (tensor.c), its inputs put in the model's declared
 * order and checked, then handed to the batcher, which merges it with others
 * into one backend call on an instance's worker thread and splits the outputs
 * back. The result comes back to the request's event loop through its
 * mailbox (sp_mailbox_post), so the loop never waits for a backend; a client
 * that goes away meanwhile is simply not answered.
 *
 * A model with image inputs (serving/tensor_model.h's sp_tensor_io_t) takes
 * encoded JPEG/PNG files there: the request is checked on the loop, then a
 * preparation worker (the server's workq) decodes them into the FP32 tensor
 * the backend takes (serving/image.h) and submits to the batcher itself; a
 * picture it cannot decode comes back through the mailbox as a 400. Outputs
 * asked with parameters.classification become Triton's "value:index:label"
 * BYTES (classify()).
 *
 * Threads: sp_tensor_infer and the answer run on the request's loop thread;
 * prep_images on a preparation worker; on_done runs on a batcher worker and
 * only copies the result and posts it.
 * Memory: one tq_t per request, owned by the request until it is submitted,
 * then by the batcher's callback, freed on the loop after the answer (or
 * after the client left).
 */
#include "api/tensor_infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/workq.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/backends.h"
#include "serving/metrics.h"
#include "serving/respcache.h"
#include "serving/tensor_model.h"
#include "serving/auth.h"
#include "sched/batcher.h"
#include "api/kserve.h"
#include "api/api.h"
#include "api/rcache.h"
#include "api/request.h"
#include "api/tensor.h"
#include "api/trace.h"

/* ------------------------------------------------------------------ infer */

typedef struct tq {
    sp_api_req_t a;            /* the lifecycle (request.h): model, clock, cache key; a.http
                                * NULL once the client went away (loop thread only) */
    sp_mailbox_t *mb;
    sp_tensor_req_t ir;
    /* filled by the batcher's callback */
    sp_status_t status;
    sp_batch_reason_t reason;
    char message[512];
    int32_t n_out;
    sp_backend_tensor_t out[SP_BACKEND_MAX_TENSORS];
    char out_names[SP_BACKEND_MAX_TENSORS][64];
    int64_t rows;              /* the request's rows (1 without a batch dimension) */
    /* The batcher item, built on the loop; with image inputs it is completed
     * (the images decoded) and submitted by a preparation worker. */
    sp_batch_item_t it;
    sp_backend_tensor_t in[SP_BACKEND_MAX_TENSORS];
    void *bufs[SP_BACKEND_MAX_TENSORS]; /* BYTES inputs re-encoded (gather_inputs) */
    const char *wanted[SP_BACKEND_MAX_TENSORS];
    bool refused;              /* the worker refused it before the batcher (status, message) */
} tq_t;

/* The lifecycle's last call (ops->free): the outputs, the request, q. */
static void
tq_free(sp_api_req_t *a)
{
    tq_t *q = (tq_t *)a;
    for (int32_t i = 0; i < q->n_out; i++) {
        sp_backends_host()->free_fn(q->out[i].data);
    }
    for (int i = 0; i < SP_BACKEND_MAX_TENSORS; i++) {
        sp_free(q->bufs[i]);
    }
    sp_tensor_req_free(&q->ir);
    sp_free(q);
}

/* Only the accounting half of the lifecycle: the batcher, not a scheduler,
 * runs the request, so there is no admission or event encoding. */
static const sp_api_ops_t tq_ops = {.free = tq_free};

static void
on_abort(sp_http_req_t *r, void *ud)
{
    tq_t *q = ud;
    sp_api_end(&q->a, false, SP_FAIL_CANCELLED);
    q->a.http = NULL; /* the callback's delivery frees it */
}

/* A backend output as a response tensor. */
static sp_status_t
to_tensor(const sp_backend_tensor_t *b, sp_tensor_t *t, char *err, size_t err_len)
{
    int64_t shape[SP_TENSOR_MAX_DIMS];
    for (int32_t d = 0; d < b->n_dims; d++) {
        shape[d] = b->dims[d];
    }
    if (b->dtype == SP_BT_BYTES) {
        int64_t n = 1;
        for (int32_t d = 0; d < b->n_dims; d++) {
            n *= b->dims[d];
        }
        sp_str_t *el = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *el);
        if (el == NULL) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
        const unsigned char *p = b->data;
        size_t off = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t len = 0;
            if (off + 4 <= b->bytes) {
                len = (uint32_t)p[off] | (uint32_t)p[off + 1] << 8 | (uint32_t)p[off + 2] << 16 |
                      (uint32_t)p[off + 3] << 24;
            }
            off += 4;
            if (off + len > b->bytes) {
                sp_free(el);
                return sp_errf(err, err_len, SP_ERR_INVALID, "backend output '%s' is malformed",
                               b->name);
            }
            el[i].ptr = (const char *)p + off;
            el[i].len = len;
            off += len;
        }
        sp_status_t st = sp_tensor_from_strs(t, b->name, b->n_dims, shape, el, err, err_len);
        sp_free(el);
        return st;
    }
    if (b->dtype >= SP_BT_BYTES) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "backend output '%s': %s is not a KServe type",
                       b->name, sp_batcher_btype_name(b->dtype));
    }
    sp_status_t st = sp_tensor_alloc(t, b->name, (sp_dtype_t)b->dtype, b->n_dims, shape, err, err_len);
    if (st == SP_OK) {
        size_t want = (size_t)t->n * sp_tensor_dtype_size(t->dtype);
        memcpy(t->data, b->data, want < b->bytes ? want : b->bytes);
    }
    return st;
}

/* ------------------------------------------------------------------ classification */

static int
by_value_desc(const void *a, const void *b, void *vals)
{
    const double *v = vals;
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    double x = v[i], y = v[j];
    bool xn = x != x, yn = y != y; /* NaN ranks last */
    if (xn != yn) {
        return xn ? 1 : -1;
    }
    if (!xn && x != y) {
        return x > y ? -1 : 1;
    }
    return i < j ? -1 : i > j; /* ties: the lower index first */
}

/*
 * Triton's classification extension: *t (a numeric output) replaced by a
 * BYTES tensor of its K highest entries per batch row, "value:index" or
 * "value:index:label" (label when the labels file has line `index`), shape
 * [rows, K] (K: at most the row's entries) or [K] without a batch dimension.
 * Values as Triton prints them: floats with six decimals, integers whole.
 */
static sp_status_t
classify(sp_tensor_t *t, int32_t k, bool batched, const char *const *labels, int32_t n_labels,
         char *err, size_t err_len)
{
    if (t->dtype == SP_DT_BYTES) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "outputs '%.64s'.parameters.classification: the output is BYTES, not scores",
                       t->name);
    }
    int64_t rows = batched && t->ndim > 0 ? t->shape[0] : 1;
    int64_t per = rows > 0 ? t->n / rows : 0;
    int64_t K = k < per ? k : per;
    bool fp = t->dtype == SP_DT_FP16 || t->dtype == SP_DT_FP32 || t->dtype == SP_DT_FP64;
    double *vals = sp_malloc(sizeof *vals * (size_t)(per > 0 ? per : 1));
    int64_t *idx = sp_malloc(sizeof *idx * (size_t)(per > 0 ? per : 1));
    size_t *off = sp_malloc(sizeof *off * (size_t)(rows * K + 1));
    sp_str_t *el = sp_calloc((size_t)(rows * K > 0 ? rows * K : 1), sizeof *el);
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_status_t st = SP_OK;
    if (vals == NULL || idx == NULL || off == NULL || el == NULL) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    for (int64_t r = 0; st == SP_OK && r < rows; r++) {
        for (int64_t i = 0; i < per; i++) {
            vals[i] = sp_tensor_f64(t, r * per + i);
            idx[i] = i;
        }
        qsort_r(idx, (size_t)per, sizeof *idx, by_value_desc, vals);
        for (int64_t j = 0; j < K; j++) {
            int64_t c = idx[j];
            off[r * K + j] = b.len;
            if (fp) {
                sp_jbuf_printf(&b, "%f:%lld", vals[c], (long long)c);
            } else {
                sp_jbuf_printf(&b, "%lld:%lld", (long long)sp_tensor_i64(t, r * per + c), (long long)c);
            }
            if (labels != NULL && c < n_labels) {
                sp_jbuf_lit(&b, ":");
                sp_jbuf_raw(&b, labels[c], strlen(labels[c]));
            }
        }
    }
    if (st == SP_OK && b.oom) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    if (st == SP_OK) {
        off[rows * K] = b.len;
        for (int64_t e = 0; e < rows * K; e++) {
            el[e].ptr = b.p + off[e];
            el[e].len = off[e + 1] - off[e];
        }
        int64_t shape[2] = {rows, K};
        sp_tensor_t ct;
        char name[SP_TENSOR_MAX_NAME];
        snprintf(name, sizeof name, "%s", t->name);
        st = batched ? sp_tensor_from_strs(&ct, name, 2, shape, el, err, err_len)
                     : sp_tensor_from_strs(&ct, name, 1, shape + 1, el, err, err_len);
        if (st == SP_OK) {
            sp_tensor_free(t);
            *t = ct;
        }
    }
    sp_jbuf_free(&b);
    sp_free(vals);
    sp_free(idx);
    sp_free(off);
    sp_free(el);
    return st;
}

/* The classification count the request asks of output `name` (0: none). */
static int32_t
class_count(const sp_tensor_req_t *r, const char *name)
{
    for (int i = 0; i < r->n_outputs; i++) {
        if (strcmp(r->outputs[i].name, name) == 0) {
            return r->outputs[i].classification;
        }
    }
    return 0;
}

/* Labels of the model's output `name`, or NULL. */
static const char *const *
labels_of(const sp_served_model_t *m, const char *name, int32_t *n)
{
    *n = 0;
    for (int32_t k = 0; m->io != NULL && k < m->be_info.n_outputs; k++) {
        if (strcmp(m->be_info.outputs[k].name, name) == 0) {
            *n = m->io->n_labels[k];
            return m->io->labels[k];
        }
    }
    return NULL;
}

static void
respond(tq_t *q)
{
    sp_http_req_t *r = q->a.http;
    char err[256];
    sp_tensor_t outs[SP_BACKEND_MAX_TENSORS];
    int n = 0;
    sp_status_t st = SP_OK;
    for (int32_t i = 0; i < q->n_out && st == SP_OK; i++) {
        q->out[i].name = q->out_names[i];
        st = to_tensor(&q->out[i], &outs[n], err, sizeof err);
        n += st == SP_OK;
        int32_t k = st == SP_OK ? class_count(&q->ir, q->out_names[i]) : 0;
        if (k > 0) {
            int32_t nl;
            const char *const *lab = labels_of(q->a.m, q->out_names[i], &nl);
            st = classify(&outs[n - 1], k, q->a.m->max_batch_size > 0, lab, nl, err, sizeof err);
        }
    }
    sp_jbuf_t json, bin;
    sp_jbuf_init(&json);
    sp_jbuf_init(&bin);
    if (st == SP_OK) {
        char params[128];
        snprintf(params, sizeof params, "{\"queue_time_us\":%lld,\"compute_time_us\":%lld}",
                 (long long)(q->a.clk.queue_ns / 1000), (long long)(q->a.clk.compute_ns / 1000));
        sp_tensor_resp_write(&json, &bin, q->a.m->name, q->a.m->version_str, &q->ir, params, outs, n);
    }
    for (int i = 0; i < n; i++) {
        sp_tensor_free(&outs[i]);
    }
    if (st != SP_OK || json.oom || bin.oom) {
        sp_api_end(&q->a, false, SP_FAIL_INTERNAL);
        sp_api_error_kserve(r, 500, "%s", st != SP_OK ? err : "out of memory writing the response");
    } else {
        sp_api_end(&q->a, true, SP_FAIL_INTERNAL);
        /* The adaptive batcher steers by the latency the client sees. */
        sp_batcher_observe_latency(q->a.m->batcher, sp_time_ns() - q->a.clk.t0_ns);
        char hl[32];
        if (!sp_tensor_infer_body(&json, &bin, hl)) {
            sp_api_error_kserve(r, 500, "out of memory writing the response");
        } else {
            const char *ctype = hl[0] ? "application/octet-stream" : "application/json";
            sp_rcache_store(q->a.m, q->a.ck, ctype, hl[0] ? "Inference-Header-Content-Length" : NULL,
                            hl[0] ? hl : NULL, json.p, json.len, SP_FINISH_STOP);
            if (hl[0]) {
                sp_http_add_header(r, "Inference-Header-Content-Length", hl);
            }
            sp_http_respond(r, 200, ctype, json.p, json.len);
        }
    }
    sp_jbuf_free(&json);
    sp_jbuf_free(&bin);
}

/* The Retry-After of a 429 (a full queue, a queue timeout): the requests
 * waiting over the rate at which the batcher has been completing them. */
static int
retry_after_s(sp_served_model_t *m)
{
    sp_batcher_stats_t bs;
    sp_batcher_get_stats(m->batcher, &bs);
    return sp_drain_retry_after_s(&m->drain, bs.queued + 1, sp_time_ns());
}

/* What the client is told of a failed batch: a queue timeout is the queue
 * being full (429), a stop the server's (503), anything else the backend's
 * (500). */
static sp_status_t
result_status(sp_batch_reason_t reason)
{
    return reason == SP_BATCH_REASON_TIMEOUT   ? SP_ERR_BUSY
           : reason == SP_BATCH_REASON_STOPPED ? SP_ERR_SHUTDOWN
                                               : SP_ERR_IO;
}

static void refuse(tq_t *q, sp_status_t st, const char *msg);

/* On the request's loop: answer (unless the client left) and free. */
static void
deliver(void *arg)
{
    tq_t *q = arg;
    sp_http_req_t *r = q->a.http;
    if (r != NULL) {
        sp_http_req_on_abort(r, NULL, NULL);
        if (q->refused) {
            refuse(q, q->status, q->message);
        } else if (q->status == SP_OK) {
            respond(q);
        } else {
            sp_fail_reason_t why = q->reason == SP_BATCH_REASON_TIMEOUT   ? SP_FAIL_TIMEOUT
                                   : q->reason == SP_BATCH_REASON_STOPPED ? SP_FAIL_CANCELLED
                                                                          : SP_FAIL_INTERNAL;
            sp_api_end(&q->a, false, why);
            sp_status_t st = result_status(q->reason);
            if (st != SP_ERR_IO) {
                char ra[16];
                snprintf(ra, sizeof ra, "%d", st == SP_ERR_BUSY ? retry_after_s(q->a.m) : 1);
                sp_http_add_header(r, "Retry-After", ra);
            }
            sp_api_error_kserve(r, sp_status_http(st), "%s", q->message);
        }
    }
    sp_api_finish(&q->a);
}

/* On a batcher worker: keep the result and hand it to the loop. */
static void
on_done(void *ud, const sp_batch_result_t *res)
{
    tq_t *q = ud;
    if (res->status == SP_OK) {
        sp_drain_note(&q->a.m->drain, 1, sp_time_ns());
    }
    q->status = res->status;
    q->reason = res->reason;
    snprintf(q->message, sizeof q->message, "%s", res->message ? res->message : "");
    q->a.clk.queue_ns = res->queue_us * 1000;
    q->a.clk.compute_ns = res->compute_us * 1000;
    q->a.clk.input_ns = res->input_us * 1000;
    q->a.clk.output_ns = res->output_us * 1000;
    q->a.clk.rows = res->batch_rows > 0 ? q->rows : 0;
    if (res->status == SP_OK && res->batch_first) { /* Triton's per-batch statistics, once a batch */
        sp_tstats_batch(&q->a.m->metrics.tstats, res->batch_rows, res->input_us * 1000,
                        res->compute_us * 1000, res->output_us * 1000);
    }
    q->n_out = 0;
    for (int32_t i = 0; res->status == SP_OK && i < res->n_outputs && i < SP_BACKEND_MAX_TENSORS; i++) {
        q->out[i] = res->outputs[i];
        snprintf(q->out_names[i], sizeof q->out_names[i], "%s", res->outputs[i].name);
        q->out[i].data = sp_batcher_result_take(res, i);
        q->n_out++;
    }
    if (sp_mailbox_post(q->mb, deliver, q) != SP_OK) {
        SP_LOG_ERROR("event=tensor_result_lost model=%s reason=out_of_memory", sp_log_str(q->a.m->name));
    }
}

/* The request's inputs in the model's declared order, as backend tensors.
 * BYTES inputs are re-encoded with length prefixes into bufs[i] (freed by the
 * caller). */
static sp_status_t
gather_inputs(const tq_t *q, sp_backend_tensor_t *in, void **bufs, char *err, size_t err_len)
{
    const sp_backend_model_info_t *info = &q->a.m->be_info;
    for (int32_t k = 0; k < q->ir.n_inputs; k++) {
        bool known = false;
        for (int32_t i = 0; i < info->n_inputs; i++) {
            known |= strcmp(info->inputs[i].name, q->ir.inputs[k].name) == 0;
        }
        if (!known) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "inputs[%d]: the model has no input '%.64s'", (int)k, q->ir.inputs[k].name);
        }
    }
    for (int32_t i = 0; i < info->n_inputs; i++) {
        const sp_tensor_t *t = sp_tensor_req_input(&q->ir, info->inputs[i].name);
        if (t == NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "inputs: '%s' is required (%s)",
                           info->inputs[i].name, sp_batcher_btype_name(info->inputs[i].dtype));
        }
        const sp_tensor_io_t *io = q->a.m->io;
        bool image = io != NULL && io->has_image[i];
        if (image) {
            /* One encoded image per batch row: [N] or [N, 1] BYTES, decoded later. */
            if (t->dtype != SP_DT_BYTES) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "inputs '%s'.datatype: the model takes images as BYTES (one encoded "
                               "JPEG or PNG per batch row), got %s", t->name,
                               sp_tensor_dtype_name(t->dtype));
            }
            if (t->ndim < 1 || t->ndim > 2 || (t->ndim == 2 && t->shape[1] != 1)) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "inputs '%s'.shape: images are [batch] or [batch, 1] BYTES", t->name);
            }
            if (t->shape[0] < 1 || t->shape[0] > q->a.m->max_batch_size) {
                /* before decoding any of them */
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "inputs '%s'.shape: %lld images, the model takes 1 to %d per request",
                               t->name, (long long)t->shape[0], (int)q->a.m->max_batch_size);
            }
        } else if ((int)t->dtype != (int)info->inputs[i].dtype) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "inputs '%s'.datatype: the model takes %s, got %s",
                           t->name, sp_batcher_btype_name(info->inputs[i].dtype), sp_tensor_dtype_name(t->dtype));
        }
        if (t->ndim > SP_BACKEND_MAX_DIMS) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "inputs '%s'.shape: more than %d dims",
                           t->name, SP_BACKEND_MAX_DIMS);
        }
        sp_backend_tensor_t *b = &in[i];
        b->name = info->inputs[i].name;
        b->dtype = image ? SP_BT_BYTES : info->inputs[i].dtype;
        b->n_dims = image ? 1 : t->ndim;
        for (int d = 0; d < b->n_dims; d++) {
            b->dims[d] = t->shape[d];
        }
        if (t->dtype != SP_DT_BYTES) {
            b->data = t->data;
            b->bytes = (size_t)t->n * sp_tensor_dtype_size(t->dtype);
            continue;
        }
        size_t total = 0;
        for (int64_t e = 0; e < t->n; e++) {
            total += 4 + sp_tensor_str(t, e).len;
        }
        unsigned char *buf = sp_malloc(total ? total : 1);
        if (buf == NULL) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
        bufs[i] = buf;
        size_t off = 0;
        for (int64_t e = 0; e < t->n; e++) {
            sp_str_t el = sp_tensor_str(t, e);
            uint32_t l = (uint32_t)el.len;
            buf[off] = (unsigned char)l;
            buf[off + 1] = (unsigned char)(l >> 8);
            buf[off + 2] = (unsigned char)(l >> 16);
            buf[off + 3] = (unsigned char)(l >> 24);
            memcpy(buf + off + 4, el.ptr, el.len);
            off += 4 + el.len;
        }
        b->data = buf;
        b->bytes = total;
    }
    return SP_OK;
}

/* The response cache key of a validated request (respcache.h): its inputs in
 * the model's order (name, type, shape and bytes, however they were sent),
 * the outputs it asks for with their binary flags (the answer's layout), and
 * its id, which the answer echoes. Request parameters (priority, timeout)
 * do not change the outputs and are left out. NULL: not cached. */
static sp_rckey_t *
cache_key(const tq_t *q, const sp_backend_tensor_t *in)
{
    sp_rckey_t *k = sp_rckey_new(q->a.m, "kserve/infer");
    if (k == NULL) {
        return NULL;
    }
    const sp_tensor_req_t *ir = &q->ir;
    sp_rckey_add_u64(k, ir->id != NULL);
    sp_rckey_add(k, ir->id ? ir->id : "", ir->id ? ir->id_len : 0);
    for (int32_t i = 0; i < q->a.m->be_info.n_inputs; i++) {
        sp_rckey_add(k, in[i].name, strlen(in[i].name));
        sp_rckey_add_u64(k, (uint64_t)in[i].dtype);
        sp_rckey_add_u64(k, (uint64_t)in[i].n_dims);
        for (int32_t d = 0; d < in[i].n_dims; d++) {
            sp_rckey_add_u64(k, (uint64_t)in[i].dims[d]);
        }
        sp_rckey_add(k, in[i].data, in[i].bytes);
    }
    sp_rckey_add_u64(k, (uint64_t)ir->n_outputs);
    for (int i = 0; i < ir->n_outputs; i++) {
        sp_rckey_add(k, ir->outputs[i].name, strlen(ir->outputs[i].name));
        sp_rckey_add_u64(k, (uint64_t)(ir->outputs[i].binary + 1));
    }
    sp_rckey_add_u64(k, ir->binary_output);
    return k;
}

/* A request refused before it reached the batcher: the server's own refusals
 * (a full queue, a stopping batcher, no memory) keep their status; anything
 * else the decoder, the checks or the batcher refused is the request's to
 * fix: 400. */
static void
refuse(tq_t *q, sp_status_t st, const char *msg)
{
    sp_http_req_t *r = q->a.http;
    sp_api_end(&q->a, false, st == SP_ERR_BUSY ? SP_FAIL_QUEUE_FULL : SP_FAIL_INVALID);
    st = sp_api_server_status(st);
    if (st == SP_ERR_BUSY || st == SP_ERR_SHUTDOWN) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", st == SP_ERR_BUSY ? retry_after_s(q->a.m) : 1);
        sp_http_add_header(r, "Retry-After", ra);
    }
    bool server = st == SP_ERR_BUSY || st == SP_ERR_SHUTDOWN || st == SP_ERR_NOMEM;
    sp_api_error_kserve(r, server ? sp_status_http(st) : 400, "%s", msg);
}

/* Floats of one decoded image input: its rows times C * H * W, bounded so
 * that a batch of large images cannot ask for unbounded memory (one image
 * is always allowed: its size is the model's, bounded by the config). */
#define IMAGE_MAX_FLOATS ((int64_t)1 << 28) /* 1 GiB of FP32 per input per request */

/*
 * On a preparation worker (never a loop): decode the request's image inputs
 * into the FP32 tensors the backend takes and submit the item to the
 * batcher. On any failure the refusal is posted to the loop. Once submit
 * succeeded q belongs to the batcher's callback and is not touched here.
 */
static void
prep_images(void *arg)
{
    tq_t *q = arg;
    const sp_served_model_t *m = q->a.m;
    const sp_tensor_io_t *io = m->io;
    char err[512] = "";
    uint8_t *imgs[SP_BACKEND_MAX_TENSORS] = {0}; /* floats, or bytes for a UINT8 input */
    sp_status_t st = SP_OK;
    for (int32_t i = 0; st == SP_OK && i < m->be_info.n_inputs; i++) {
        if (!io->has_image[i]) {
            continue;
        }
        const sp_img_spec_t *spec = &io->image[i];
        const sp_tensor_t *t = sp_tensor_req_input(&q->ir, m->be_info.inputs[i].name);
        int64_t C = sp_img_channels(spec), per = C * spec->height * spec->width;
        if (t->n < 1 || (t->n > 1 && t->n > IMAGE_MAX_FLOATS / per)) { /* one always fits */
            st = sp_errf(err, sizeof err, SP_ERR_INVALID,
                         "inputs '%s': %lld images of %dx%d are more than one request may decode",
                         t->name, (long long)t->n, (int)spec->width, (int)spec->height);
            break;
        }
        const size_t es = sp_img_elem_size(spec);
        imgs[i] = sp_malloc(es * (size_t)(per * t->n));
        if (imgs[i] == NULL) {
            st = sp_errf(err, sizeof err, SP_ERR_NOMEM, "out of memory for the decoded images");
            break;
        }
        for (int64_t e = 0; st == SP_OK && e < t->n; e++) {
            sp_str_t el = sp_tensor_str(t, e);
            char why[400];
            st = sp_img_preprocess(el.ptr, el.len, spec, imgs[i] + es * (size_t)(per * e), why, sizeof why);
            if (st != SP_OK) {
                sp_errf(err, sizeof err, st, "inputs '%s'[%lld]: %s", t->name, (long long)e, why);
            }
        }
        sp_backend_tensor_t *b = &q->in[i];
        b->dtype = spec->u8 ? SP_BT_UINT8 : SP_BT_FP32;
        b->n_dims = 4;
        b->dims[0] = t->n;
        bool nchw = spec->layout == SP_IMG_NCHW;
        b->dims[1] = nchw ? C : spec->height;
        b->dims[2] = nchw ? spec->height : spec->width;
        b->dims[3] = nchw ? spec->width : C;
        b->data = imgs[i];
        b->bytes = es * (size_t)(per * t->n);
    }
    /* After a successful submit q may be gone: what is freed below is held here. */
    void *bufs[SP_BACKEND_MAX_TENSORS];
    memcpy(bufs, q->bufs, sizeof bufs);
    if (st == SP_OK) {
        memset(q->bufs, 0, sizeof q->bufs);
        st = sp_batcher_submit(m->batcher, &q->it, err, sizeof err);
        if (st != SP_OK) {
            memcpy(q->bufs, bufs, sizeof bufs); /* still q's to free */
        }
    }
    for (int i = 0; i < SP_BACKEND_MAX_TENSORS; i++) {
        sp_free(imgs[i]);
        if (st == SP_OK) {
            sp_free(bufs[i]); /* the batcher copied the inputs */
        }
    }
    if (st != SP_OK) {
        q->refused = true;
        q->status = st;
        snprintf(q->message, sizeof q->message, "%s", err);
        if (sp_mailbox_post(q->mb, deliver, q) != SP_OK) {
            SP_LOG_ERROR("event=tensor_result_lost model=%s reason=out_of_memory", sp_log_str(m->name));
        }
    }
}

void
sp_tensor_infer(sp_serving_t *s, sp_http_req_t *r, sp_served_model_t *m)
{
    tq_t *q = sp_calloc(1, sizeof *q);
    if (q == NULL) {
        sp_served_release(m);
        sp_api_error_kserve(r, 503, "out of memory");
        return;
    }
    sp_api_begin(&q->a, &tq_ops, s, r, m, NULL);
    q->a.clk.keep_text = false; /* tensors have no text for the access log */
    q->mb = sp_api_mailbox(r);
    char err[768];
    sp_str_t body = sp_http_req_body(r);
    sp_str_t hl = sp_http_req_header(r, "inference-header-content-length");
    sp_backend_tensor_t *in = q->in;
    const sp_backend_model_info_t *info = &m->be_info;
    const char *names[SP_BACKEND_MAX_TENSORS];
    bool want[SP_BACKEND_MAX_TENSORS];
    int32_t n_want = 0;
    sp_status_t st = sp_tensor_req_parse_cached(sp_api_hcache(r), body.ptr, body.len, hl,
                                                s->cfg.json_depth, &q->ir, err, sizeof err);
    if (st == SP_OK) {
        for (int32_t i = 0; i < info->n_outputs; i++) {
            names[i] = info->outputs[i].name;
        }
        st = sp_tensor_req_select_outputs(&q->ir, names, info->n_outputs, want, err, sizeof err);
    }
    for (int32_t i = 0; st == SP_OK && i < info->n_outputs; i++) {
        if (want[i] && info->outputs[i].dtype == SP_BT_BYTES &&
            class_count(&q->ir, names[i]) > 0) {
            st = sp_errf(err, sizeof err, SP_ERR_INVALID,
                         "outputs '%s'.parameters.classification: the output is BYTES, not scores",
                         names[i]);
        }
    }
    if (st == SP_OK) {
        st = gather_inputs(q, in, q->bufs, err, sizeof err);
    }
    if (st == SP_OK && sp_rckey_enabled(m)) {
        /* A stored answer to the same request skips the batcher and the backend. */
        q->a.ck = cache_key(q, in);
        if (sp_rcache_lookup(r, m, q->a.ck, &q->a.clk)) {
            sp_api_finish(&q->a);
            return;
        }
    }
    sp_batch_item_t *it = &q->it;
    bool images = m->io != NULL && m->io->any_image;
    if (st == SP_OK) {
        for (int32_t i = 0; i < info->n_outputs; i++) {
            if (want[i]) {
                q->wanted[n_want++] = names[i];
            }
        }
        it->inputs = in;
        it->n_inputs = info->n_inputs;
        q->rows = m->max_batch_size > 0 && info->n_inputs > 0 ? in[0].dims[0] : 1;
        it->outputs = q->wanted;
        it->n_outputs = n_want;
        int64_t v;
        if (q->ir.params) {
            const json_t *pr = json_object_get(q->ir.params, "priority");
            const json_t *to = json_object_get(q->ir.params, "timeout");
            if (json_is_integer(pr) && (v = json_integer_value(pr)) >= 0 && v <= 1000) {
                it->priority = (uint32_t)v;
            }
            if (json_is_integer(to) && (v = json_integer_value(to)) >= 0) {
                it->timeout_us = (uint64_t)v;
            }
        }
        /* The tenant's tier caps the level: a batch-tier key cannot buy the top queue. */
        it->priority = sp_auth_tensor_priority(sp_http_req_user(r), it->priority, m->prio_levels,
                                               m->prio_default);
        it->done = on_done;
        it->ud = q;
        sp_trace_http_submit(r); /* the queue span starts here (decoding included) */
        if (images) {
            /* Decoding is CPU work of milliseconds: a preparation worker does it
             * and submits; the answer comes back through the mailbox. */
            st = s->prep ? sp_workq_submit(s->prep, prep_images, q) : SP_OK;
            if (st == SP_OK) {
                if (s->prep == NULL) { /* a server without preparation workers: here */
                    prep_images(q);
                }
                sp_http_req_on_abort(r, on_abort, q);
                return;
            }
            if (st == SP_ERR_BUSY) {
                snprintf(err, sizeof err, "too many images are being decoded; retry later");
            } else {
                st = SP_ERR_SHUTDOWN;
                snprintf(err, sizeof err, "the server is stopping");
            }
        } else {
            st = sp_batcher_submit(m->batcher, it, err, sizeof err);
        }
    }
    if (st != SP_OK) {
        refuse(q, st, err);
        sp_api_finish(&q->a);
        return;
    }
    for (int i = 0; i < SP_BACKEND_MAX_TENSORS; i++) {
        sp_free(q->bufs[i]); /* the batcher copied the inputs */
        q->bufs[i] = NULL;
    }
    sp_http_req_on_abort(r, on_abort, q);
}

/* ------------------------------------------------------------------ metadata */

/* image: which tensors are image inputs (BYTES [-1, 1] to the client), or NULL. */
static void
tensor_list(sp_jbuf_t *b, const sp_backend_tensor_desc_t *d, int32_t n, int32_t max_batch,
            const bool *image)
{
    for (int32_t i = 0; i < n; i++) {
        sp_jbuf_lit(b, i ? ",{\"name\":" : "{\"name\":");
        sp_jbuf_cstr(b, d[i].name);
        if (image != NULL && image[i]) {
            sp_jbuf_lit(b, ",\"datatype\":\"BYTES\",\"shape\":[-1,1]}");
            continue;
        }
        sp_jbuf_printf(b, ",\"datatype\":\"%s\",\"shape\":[", sp_batcher_btype_name(d[i].dtype));
        int w = 0;
        if (max_batch > 0) {
            sp_jbuf_lit(b, "-1");
            w++;
        }
        for (int32_t k = 0; k < d[i].n_dims; k++) {
            sp_jbuf_printf(b, w++ ? ",%lld" : "%lld", (long long)d[i].dims[k]);
        }
        sp_jbuf_lit(b, "]}");
    }
}

void
sp_tensor_infer_metadata(sp_http_req_t *r, const sp_served_model_t *m)
{
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"name\":");
    sp_jbuf_cstr(&b, m->name);
    sp_jbuf_lit(&b, ",\"versions\":[");
    sp_jbuf_cstr(&b, m->version_str);
    sp_jbuf_lit(&b, "],\"platform\":");
    sp_jbuf_cstr(&b, m->be->name);
    sp_jbuf_lit(&b, ",\"inputs\":[");
    tensor_list(&b, m->be_info.inputs, m->be_info.n_inputs, m->max_batch_size,
                m->io ? m->io->has_image : NULL);
    sp_jbuf_lit(&b, "],\"outputs\":[");
    tensor_list(&b, m->be_info.outputs, m->be_info.n_outputs, m->max_batch_size, NULL);
    sp_jbuf_lit(&b, "]}");
    if (b.oom) {
        sp_api_error_kserve(r, 500, "out of memory while writing the response");
    } else {
        sp_http_respond(r, 200, "application/json", b.p, b.len);
    }
    sp_jbuf_free(&b);
}

bool
sp_tensor_infer_body(sp_jbuf_t *json, const sp_jbuf_t *bin, char hl[32])
{
    hl[0] = '\0';
    if (json->oom) {
        return false;
    }
    if (bin->len == 0) {
        return true;
    }
    snprintf(hl, 32, "%zu", json->len);
    sp_jbuf_raw(json, bin->p, bin->len);
    return !json->oom;
}
