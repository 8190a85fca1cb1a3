/*
 * trace.h - OpenTelemetry traces of served requests: W3C Trace Context in and
 * out, a span tree per sampled request, and a background OTLP/HTTP JSON
 * exporter (docs/tracing.md).
 *
 * Tracing is on only when `--otlp-endpoint` is given (sp_trace_init with an
 * endpoint). Off, every hook below is one branch on sp__trace_on, read-only
 * after start-up, so the hot path pays nothing else.
 *
 * On, every request gets a trace context: the incoming `traceparent` is kept
 * when it is valid (its trace id, its span as our parent, its sampled flag
 * decides: parent-based sampling), else a new trace starts and is sampled
 * with probability `--trace-sample-ratio` (decided from the trace id's low 56
 * bits, so the same id always gets the same answer). The response carries a
 * `traceparent` naming our server span in both cases. Only a sampled request
 * allocates a record (sp_trace_t, one allocation, bounded): the server span
 * plus its children, which the front ends mark from the timings the metrics
 * already keep (sp_req_clock_t): queue, prefill and decode for the LLM
 * scheduler, queue and compute for the tensor batcher, and response (the end
 * of the model's work to the last byte queued).
 *
 * Threads: a record belongs to the request's loop thread until it is
 * finished; finishing hands it to the exporter thread through a bounded
 * queue (a mutex held for a pointer swap; full: the record is dropped and
 * counted). The exporter batches, serialises and POSTs on its own thread
 * with timeouts and bounded retries, so a slow or dead collector never
 * delays a request.
 *
 * Using it from another protocol (the gRPC service):
 *
 *     char tp[SP_TRACE_TP_BUF];
 *     sp_trace_t *t = NULL;
 *     if (sp_trace_enabled()) {
 *         t = sp_trace_start(traceparent, tracestate, start_ns, tp); // header values or {NULL,0}
 *         // send tp back as the `traceparent` response metadata
 *         sp_trace_set_name(t, "inference.GRPCInferenceService/ModelInfer");
 *         sp_trace_attr_str(t, "rpc.system", "grpc", 4);
 *     }
 *     ... sp_trace_mark_submit(t) just before sp_sched_submit / sp_batcher_submit ...
 *     ... sp_trace_model(t, m->name, m->version_str, &clk, "stop") when the model is done ...
 *     sp_trace_attr_int(t, "rpc.grpc.status_code", code);
 *     sp_trace_finish(t, code != 0, code != 0 ? "INTERNAL" : NULL); // t is gone
 *
 * Every function taking a sp_trace_t accepts NULL (an unsampled request) and
 * does nothing then.
 */
#ifndef SP_API_TRACE_H
#define SP_API_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/str.h"
#include "sampan/status.h"
#include "http/http.h"
#include "serving/metrics.h"

typedef struct sp_trace sp_trace_t;

/* "00-" 32 hex "-" 16 hex "-" 2 hex, and the NUL. */
#define SP_TRACE_TP_LEN 55
#define SP_TRACE_TP_BUF (SP_TRACE_TP_LEN + 1)
/* Longest tracestate kept (W3C: propagate at least 512 characters). */
#define SP_TRACE_STATE_MAX 512

typedef struct sp_trace_params {
    const char *endpoint;     /* "http://host:port[/prefix]": spans go to {endpoint}/v1/traces */
    const char *service_name; /* resource attribute service.name (default "sampan") */
    double sample_ratio;      /* new traces (no incoming traceparent): 0..1 */
    int max_queue_spans;      /* spans waiting for export; more are dropped (default 2048) */
    int max_batch_spans;      /* spans per POST (default 512) */
    int flush_interval_ms;    /* the longest a span waits before a POST (default 1000) */
    int timeout_ms;           /* one POST: connect, send, read the status (default 5000) */
    int max_attempts;         /* tries per batch on a network error, 429, 502, 503, 504 (3) */
    int shutdown_ms;          /* sp_trace_shutdown: the longest the final flush may take (3000) */
} sp_trace_params_t;

sp_trace_params_t sp_trace_default_params(void);

/* Check p (the endpoint's form) and start the exporter thread; tracing is on
 * afterwards. An empty or NULL endpoint leaves tracing off and returns SP_OK.
 * Call before any loop thread starts; SP_ERR_INVALID with err naming the
 * problem for a bad endpoint. */
sp_status_t sp_trace_init(const sp_trace_params_t *p, char *err, size_t err_len);
/* Flush what is queued (bounded by shutdown_ms), stop the exporter, turn
 * tracing off. Call after the loop threads stopped (their aborted requests
 * finish their spans first). No-op when tracing is off. */
void sp_trace_shutdown(void);

extern bool sp__trace_on; /* set by sp_trace_init, before the loops start */
static inline bool sp_trace_enabled(void) { return sp__trace_on; }

typedef struct sp_trace_stats {
    uint64_t spans_exported;      /* accepted by the collector (2xx) */
    uint64_t spans_dropped_queue; /* the export queue was full */
    uint64_t spans_dropped_export;/* the collector refused them or could not be reached */
    uint64_t exports_failed;      /* POSTs that failed after their retries */
    uint64_t queued;              /* spans waiting now */
} sp_trace_stats_t;

/* Any thread; zeros when tracing is off. */
void sp_trace_get_stats(sp_trace_stats_t *out);

/* ---- any protocol (the request's thread) */

/* Begin the server span of an incoming request. traceparent and tracestate
 * are the received values ({NULL, 0} when absent); a malformed traceparent
 * is ignored (a new trace starts) and so is a tracestate without a valid
 * traceparent or with bytes outside printable ASCII or over
 * SP_TRACE_STATE_MAX. tp_out receives the traceparent to answer with (ours:
 * the trace id, the server span's id, the sampled flag), always. start_ns
 * is on the sp_time_ns() clock. Returns the record when sampled, else NULL.
 * The record has kind SERVER and the name "request" until sp_trace_set_name. */
sp_trace_t *sp_trace_start(sp_str_t traceparent, sp_str_t tracestate, int64_t start_ns,
                           char tp_out[SP_TRACE_TP_BUF]);
/* The server span's name (copied; cut at 127 bytes). */
void sp_trace_set_name(sp_trace_t *t, const char *name);
/* Attributes of the server span. key must be a string literal (kept by
 * pointer); values are copied (a string is cut at 256 bytes; when the
 * record's space is used up, later attributes are dropped). */
void sp_trace_attr_str(sp_trace_t *t, const char *key, const char *v, size_t n);
void sp_trace_attr_int(sp_trace_t *t, const char *key, int64_t v);
/* The request's tracestate kept for the response, or "" (valid while t is). */
const char *sp_trace_state(const sp_trace_t *t);
/* The trace id (32 hex) and server span id (16 hex) as text. */
void sp_trace_ids(const sp_trace_t *t, char trace_id[33], char span_id[17]);

void sp__trace_mark_submit(sp_trace_t *t);
/* Just before the request is handed to the scheduler or the batcher: their
 * queue_ns and compute_ns count from that moment, so the children are placed
 * exactly. Without it they are placed back from sp_trace_model's call. */
static inline void sp_trace_mark_submit(sp_trace_t *t)
{
    if (t) {
        sp__trace_mark_submit(t);
    }
}

/* The model's part is over (sp_api_account, request.c): add model, version,
 * outcome and token counts, and the children from the clock: queue (when
 * the request reached a queue), then prefill and decode (tokens were
 * generated), or prefill alone (embeddings), or compute (tensor models).
 * Once per record; later calls do nothing. */
void sp_trace_model(sp_trace_t *t, const char *model, const char *version,
                    const sp_req_clock_t *c, const char *outcome);

/* End the server span now (a "response" child covers the time from the
 * model's end, when there was one), set its status to ERROR when error is
 * true (error_type: the error.type attribute, NULL for none), and queue the
 * record for export. t must not be used afterwards. */
void sp_trace_finish(sp_trace_t *t, bool error, const char *error_type);

/* ---- HTTP (serve.c, metrics.c and the front ends; the loop thread) */

/* Read traceparent/tracestate, add the response headers, and when sampled
 * keep the record on the request with the HTTP attributes. The server's
 * handler calls it for every request; a request that already has a record
 * keeps it. So another protocol that hands its calls to the handler as
 * virtual requests (http.h, sp_http_vreq_*) gets traced with no code, or
 * calls this itself between sp_http_vreq_create and sp_http_vreq_run to
 * name the span and add its own attributes first:
 *
 *     sp_http_req_t *r = sp_http_vreq_create(loop, &vp, &sink, ud); // headers incl. traceparent
 *     if (sp_trace_enabled()) {
 *         sp_trace_http_begin(r);
 *         sp_trace_t *t = sp_http_req_trace(r);   // NULL unless sampled
 *         sp_trace_set_name(t, "inference.GRPCInferenceService/ModelInfer");
 *         sp_trace_attr_str(t, "rpc.system", "grpc", 4);
 *     }
 *     sp_http_vreq_run(r);
 *
 * The answer's traceparent (and tracestate) come to the sink among the extra
 * headers, like x-request-id. The record is finished by the access-log hook
 * (sp_trace_http_end) when the request ends, so a sink may still add
 * attributes (sp_trace_attr_int(sp_http_req_trace(r), "rpc.grpc.status_code",
 * ...)) in its respond or stream_end callback. A virtual request begun here
 * and then cancelled before it ran never reaches that hook: finish its
 * record first (sp_trace_finish(sp_http_req_trace(r), true, "cancelled")). */
void sp_trace_http_begin(sp_http_req_t *r);
/* From the access-log hook: the route, status, tenant; finish and export.
 * log_out (may be NULL) receives " trace_id=... span_id=..." for the access
 * line, or "" when the request was not sampled. */
void sp_trace_http_end(sp_http_req_t *r, bool aborted, const char *tenant, char *log_out,
                       size_t log_cap);
/* sp_trace_mark_submit / sp_trace_model for an HTTP request's record. */
static inline void sp_trace_http_submit(sp_http_req_t *r)
{
    if (sp__trace_on) {
        sp_trace_mark_submit(sp_http_req_trace(r));
    }
}

#endif /* SP_API_TRACE_H */
