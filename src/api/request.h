/*
 * request.h - one request's lifecycle, the same for every protocol that
 * runs a model (OpenAI, KServe REST, and gRPC, whose calls replay the REST
 * routes as virtual requests; tensor models use its accounting half):
 *
 *   sp_api_begin    the request holds its model (and adapter), its tier is
 *                   its default priority, its clock starts
 *   (protocol)      parse, validate, prepare (offload.h)
 *   sp_api_admit    deadline, priority capped at the tier, prefix scope,
 *                   the tenant's token reservation, submit to a scheduler;
 *                   every refusal answered through ops->refuse
 *   (events)        tokens counted and timed here, encoded by ops->event;
 *                   the end (DONE) accounted here, answered by ops->done;
 *                   a client that left or reads too slowly is handled here
 *   sp_api_finish   account what has not been (a refusal), settle the
 *                   reservation, release model and adapter, free the holder
 *
 * A protocol embeds sp_api_req_t in its own request struct and supplies an
 * ops table: the shape of its errors and the encoding of its answers.
 * Everything else (accounting, logs, token settlement, status codes) is here
 * once, so every protocol answers and counts alike.
 *
 * Threads: the request's loop thread, always.
 * Memory: the holder is the protocol's allocation; sp_api_finish frees it
 * through ops->free, exactly once, on every ending path.
 */
#ifndef SP_API_REQUEST_H
#define SP_API_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "api/api.h"
#include "api/offload.h"
#include "sched/sched.h"
#include "sched/schedreq.h"
#include "serving/adapters.h"
#include "serving/metrics.h"
#include "serving/respcache.h"

typedef struct sp_api_req sp_api_req_t;

/* Why a request was refused before it ran; the protocol picks the words. */
typedef enum sp_api_refusal {
    SP_API_REFUSED_STATUS = 0, /* st says why (the scheduler refused it) */
    SP_API_REFUSED_TOKENS,     /* the tenant's tokens per minute: 429, Retry-After set */
    SP_API_REFUSED_QUEUE,      /* the model's queue is full: 429, Retry-After set */
} sp_api_refusal_t;

typedef struct sp_api_ops {
    /* Answer a refusal (the status line is not sent yet) in the protocol's
     * error shape. st: SP_ERR_BUSY for the two 429s. */
    void (*refuse)(sp_api_req_t *a, sp_api_refusal_t why, sp_status_t st, const char *message);
    /* A TOKEN, FINISH or EMBEDDING event, after the lifecycle counted it.
     * Non-zero: the client cannot keep up (the request is then dropped). */
    int (*event)(sp_api_req_t *a, const sp_sched_event_t *ev);
    /* (optional) The job's outcome as the protocol sees it (an embedding
     * that holds NaN is the model's fault); returns st or another status,
     * and may replace *message. */
    sp_status_t (*outcome)(sp_api_req_t *a, sp_status_t st, const char **message);
    /* The job ended (DONE), already accounted: answer. st SP_OK: the
     * result; else the error (message never NULL; the stream may be open). */
    void (*done)(sp_api_req_t *a, const sp_sched_event_t *ev, sp_status_t st, const char *message);
    /* Free the holder and what the protocol owns in it (last call). */
    void (*free)(sp_api_req_t *a);
} sp_api_ops_t;

struct sp_api_req {
    const sp_api_ops_t *ops;
    sp_http_req_t *http;     /* NULL once the client left (no answer, no accounting) */
    sp_serving_t *srv;
    sp_served_model_t *m;    /* the request's reference, released by sp_api_finish */
    sp_req_adapter_t ad;     /* "<model>:<adapter>" (adapters.h), or none; released likewise */
    sp_sched_job_t *job;     /* after sp_api_admit */
    sp_schedreq_t sched;     /* 'priority' (the tier until the request asks lower) and 'timeout' */
    sp_req_clock_t clk;      /* metrics, the access log and the token reservation (metrics.h) */
    sp_rckey_t *ck;          /* its response cache key, or NULL (respcache.h); freed by finish */
    sp_finish_t finish;      /* the first sequence's finish reason, for metrics */
    sp_offload_t off;        /* a preparation on a worker (offload.h); off.gone: the client left */
};

/* Start a's lifecycle for r: a takes over m's reference and ad's (ad may be
 * NULL: none). */
void sp_api_begin(sp_api_req_t *a, const sp_api_ops_t *ops, sp_serving_t *s, sp_http_req_t *r,
                  sp_served_model_t *m, const sp_req_adapter_t *ad);

/* Admit and submit: sr has the prompts and generation settings; this adds
 * the deadline, the priority (capped at the tier), the prefix scope, the
 * mailbox and the event callback, reserves `most` tokens of the tenant's
 * minute (prompt_tokens of them are charged if the request ends before its
 * job reports), and submits to one of the model's schedulers. true: the job
 * runs, the events follow. false: refused and answered (ops->refuse); the
 * caller ends with sp_api_finish. */
bool sp_api_admit(sp_api_req_t *a, sp_sched_request_t *sr, int64_t prompt_tokens, int64_t most);

/* The tenant's token reservation of `most` (0 or less: nothing to reserve)
 * into c. true: reserved. false: *retry_after_s and message (cap bytes) say
 * why (a 429). */
bool sp_api_reserve(sp_tenant_state_t *tenant, int64_t most, sp_tenant_charge_t *c,
                    int *retry_after_s, char *message, size_t cap);

/* End a's accounting (sp_api_account, api.h; nothing after its client left). */
void sp_api_end(sp_api_req_t *a, bool ok, sp_fail_reason_t reason);

/* The end of every path: a request not yet accounted was refused (counted
 * as invalid, unless its client left); its cache key, adapter and model are
 * released; ops->free frees the holder. */
void sp_api_finish(sp_api_req_t *a);

/* The scheduler's callback that sp_api_admit installs (ud: the lifecycle):
 * counts and times tokens, hands events to ops->event, and on DONE accounts,
 * answers through ops->done and finishes. */
void sp_api_event(const sp_sched_event_t *ev, void *ud);

/* The client left while a ran: accounted as cancelled, its job cancelled,
 * a finished. The lifecycle installs this as the abort callback itself. */
void sp_api_abort(sp_http_req_t *r, void *ud);

/* A status from the server's own queues (scheduler, batcher, preparation
 * workers) about a request whose client still waits: their SP_ERR_CANCELLED
 * means the server ended it (stopping, a deadline), which is answered as
 * SP_ERR_SHUTDOWN (503), not as a client that left (499). */
sp_status_t sp_api_server_status(sp_status_t st);

#endif /* SP_API_REQUEST_H */
