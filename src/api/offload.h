/*
 * offload.h - a request's costly step run on a preparation worker, its
 * result delivered back on the request's event loop.
 *
 * The protocols (openai.c, kserve.c) keep what is theirs, as callbacks: the
 * work itself (parsing, gathering, tokenizing), the result's use, and the
 * shape of an error. This module owns the rest, once: the abort callback
 * while the work runs (the log line, the cancelled request's accounting),
 * the worker task that posts the result to the loop's mailbox (sched.h), the
 * answer when the queue refuses (429 with Retry-After: 1, or 503 while the
 * server stops).
 *
 * Lifetime: the worker never touches the HTTP request. A client that leaves
 * while the work runs only marks the job gone, ends the request's accounting
 * (sp_api_account, cancelled) and drops the holder's request pointer; when the
 * result comes back, on the loop, ops->drop frees what holds the job then
 * (ops->done takes it otherwise).
 *
 * A body job (sp_offload_body_t) decodes a large request body on a worker,
 * then runs the route handler again on the loop; during that call
 * sp_offload_body_redo gives the handler the job with the decoded result,
 * so the handlers stay one straight sequence.
 */
#ifndef SP_API_OFFLOAD_H
#define SP_API_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "http/http.h"
#include "serving/metrics.h"
#include "http/router.h"

struct sp_workq;
struct sp_mailbox;
struct sp_served_model;
typedef struct sp_offload sp_offload_t;

/* The struct of `type` whose `member` is the job (or body job) at p. */
#define SP_OFFLOAD_HOLDER(p, type, member) ((type *)(void *)((char *)(p) - offsetof(type, member)))

typedef struct sp_offload_ops {
    const char *stage; /* the disconnect log's stage= ("prepare", "parse") */
    /* Worker thread (or the loop without a pool): the work. Touches only
     * what the job's holder owns, never the HTTP request. */
    void (*work)(sp_offload_t *job);
    /* Loop thread: the result, for r (the client is still there; the abort
     * callback is cleared). Takes the job's holder (frees it in the end). */
    void (*done)(sp_offload_t *job, sp_http_req_t *r);
    /* Loop thread: the result, after the client left: free the job's holder. */
    void (*drop)(sp_offload_t *job);
    /* Loop thread: answer r with status (429, 503) and message, in the
     * protocol's error shape. Retry-After is set already where it belongs. */
    void (*refuse)(sp_http_req_t *r, int status, const char *message);
} sp_offload_ops_t;

struct sp_offload {
    const sp_offload_ops_t *ops;
    sp_http_req_t **http;        /* the holder's request pointer, set to NULL when the client leaves */
    struct sp_served_model *m;   /* the request's model, or NULL (no accounting yet) */
    sp_req_clock_t *clk;         /* with m: the request's clock, ended when the client leaves */
    struct sp_mailbox *mb;       /* the request's loop, for the result */
    bool gone;                   /* the client left while the work ran (loop thread) */
};

/* Loop thread: run ops->work on a worker of wq and ops->done (or drop) back
 * on *http's loop (wq NULL: both here, now). m and clk (both or neither) are
 * the request's, for its accounting and logs. true: done or drop runs (or
 * ran). false: the queue refused; the request has been answered through
 * ops->refuse and neither will run, so the caller frees the job's holder. */
bool sp_offload_start(sp_offload_t *job, const sp_offload_ops_t *ops, struct sp_workq *wq,
                      sp_http_req_t **http, struct sp_served_model *m, sp_req_clock_t *clk);

typedef struct sp_offload_body {
    sp_offload_t job;
    sp_http_req_t *r;     /* NULL once the client left */
    sp_route_fn handler;  /* run again with the result */
    sp_route_params_t p;  /* its strings point into the request, alive while it is */
    void *ud;             /* handler's */
    char *copy;           /* the body, for ops->work (which frees it: sp_offload_body_drop) */
    size_t len;
} sp_offload_body_t;

/* Loop thread: copy r's body into b and start b's job (sp_offload_start,
 * with its return). Out of memory answers 503 through ops->refuse: false.
 * After false, b->copy is freed; the caller frees b's holder. */
bool sp_offload_body_start(sp_offload_body_t *b, const sp_offload_ops_t *ops, struct sp_workq *wq,
                           sp_http_req_t *r, sp_route_fn handler, const sp_route_params_t *p, void *ud);
/* Free the body's copy: on the worker once decoded (ops->work), and again
 * with the holder (a no-op then). */
void sp_offload_body_drop(sp_offload_body_t *b);
/* Loop thread, from ops->done: run the handler again; during that
 * call sp_offload_body_redo(the request) returns b. */
void sp_offload_body_rerun(sp_offload_body_t *b);
/* The job whose handler runs again now for r, or NULL (the first run). */
sp_offload_body_t *sp_offload_body_redo(const sp_http_req_t *r);

#endif /* SP_API_OFFLOAD_H */
