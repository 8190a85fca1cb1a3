/* offload.c - a request's costly step on a preparation worker, its result back on the loop (offload.h). */
#include "api/offload.h"

#include <string.h>

#include "core/alloc.h"
#include "core/workq.h"
#include "sampan/log.h"
#include "serving/registry.h"
#include "sched/sched.h"
#include "api/api.h"

/* Loop thread: the result is back. */
static void
job_done(void *arg)
{
    sp_offload_t *job = arg;
    if (job->gone) {
        job->ops->drop(job);
        return;
    }
    sp_http_req_on_abort(*job->http, NULL, NULL);
    job->ops->done(job, *job->http);
}

/* Worker thread: the work, then hand the job back to its loop. */
static void
job_task(void *arg)
{
    sp_offload_t *job = arg;
    job->ops->work(job);
    if (sp_mailbox_post(job->mb, job_done, job) != SP_OK) {
        /* Without its loop the request can be neither answered nor freed safely. */
        if (job->m != NULL) {
            SP_LOG_ERROR("event=prepare_result_lost model=%s reason=out_of_memory", sp_log_str(job->m->name));
        } else {
            SP_LOG_ERROR("event=prepare_result_lost reason=out_of_memory");
        }
    }
}

/* The client left while the work ran: account for it now; the job's holder
 * is freed when the result comes back (job_done), never under the worker. */
static void
job_abort(sp_http_req_t *r, void *ud)
{
    sp_offload_t *job = ud;
    SP_LOG_INFO("event=client_disconnect rid=%s stage=%s", sp_http_req_rid(r), job->ops->stage);
    if (job->clk != NULL) {
        sp_api_account(r, job->m, job->clk, false, SP_FINISH_STOP, SP_FAIL_CANCELLED);
    }
    job->gone = true;
    *job->http = NULL;
}

bool
sp_offload_start(sp_offload_t *job, const sp_offload_ops_t *ops, struct sp_workq *wq, sp_http_req_t **http,
                 struct sp_served_model *m, sp_req_clock_t *clk)
{
    sp_http_req_t *r = *http;
    job->ops = ops;
    job->http = http;
    job->m = m;
    job->clk = clk;
    job->gone = false;
    if (wq == NULL) { /* no worker pool (a server without one): work here */
        ops->work(job);
        job_done(job);
        return true;
    }
    job->mb = sp_api_mailbox(r);
    sp_http_req_on_abort(r, job_abort, job);
    sp_status_t st = sp_workq_submit(wq, job_task, job);
    if (st == SP_OK) {
        return true;
    }
    sp_http_req_on_abort(r, NULL, NULL);
    if (st == SP_ERR_BUSY) {
        sp_http_add_header(r, "Retry-After", "1");
        ops->refuse(r, sp_status_http(st), "too many requests are being prepared; retry later");
    } else { /* the pool stopping (or no memory for the task) */
        ops->refuse(r, sp_status_http(SP_ERR_SHUTDOWN), "the server is stopping");
    }
    return false;
}

/* ------------------------------------------------------------- bodies */

/* The job whose handler runs again now (set only for the length of that call). */
static _Thread_local sp_offload_body_t *redo;

bool
sp_offload_body_start(sp_offload_body_t *b, const sp_offload_ops_t *ops, struct sp_workq *wq,
                      sp_http_req_t *r, sp_route_fn handler, const sp_route_params_t *p, void *ud)
{
    sp_str_t body = sp_http_req_body(r);
    b->copy = sp_malloc(body.len ? body.len : 1);
    if (b->copy == NULL) {
        ops->refuse(r, 503, "out of memory");
        return false;
    }
    memcpy(b->copy, body.ptr, body.len);
    b->len = body.len;
    b->handler = handler;
    if (p != NULL) {
        b->p = *p;
    }
    b->ud = ud;
    b->r = r;
    if (!sp_offload_start(&b->job, ops, wq, &b->r, NULL, NULL)) {
        sp_offload_body_drop(b);
        return false;
    }
    return true;
}

void
sp_offload_body_drop(sp_offload_body_t *b)
{
    sp_free(b->copy);
    b->copy = NULL;
}

void
sp_offload_body_rerun(sp_offload_body_t *b)
{
    sp_offload_body_t *outer = redo;
    redo = b;
    b->handler(b->r, &b->p, b->ud);
    redo = outer;
}

sp_offload_body_t *
sp_offload_body_redo(const sp_http_req_t *r)
{
    return redo != NULL && redo->r == r ? redo : NULL;
}
