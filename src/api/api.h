/*
 * api.h - what the protocol modules (openai.c, kserve.c, grpc.c, the
 * repository, metrics and status routes) share: the per-loop context, the
 * model a request names, its tier, error and JSON answers, and a request's
 * accounting. The lifecycle that uses them is request.h; both are request.c.
 *
 * Threads: everything here is called on a loop thread with a request of
 * that loop.
 */
#ifndef SP_API_API_H
#define SP_API_API_H

#include <stdbool.h>
#include <stdint.h>

#include "core/json.h"
#include "http/http.h"
#include "http/router.h"
#include "sched/sched.h"
#include "serving/metrics.h"
#include "serving/serving.h"

/* Per loop thread (sp_http_loop_user), made by the composition root. */
typedef struct sp_loop_ctx {
    sp_serving_t *srv;
    sp_mailbox_t *mb;
    struct sp_grpc_loop *grpc; /* this loop's gRPC connections (grpc.h); NULL = none */
    struct sp_tensor_hcache *hcache; /* decoded binary-request headers (tensor.h); NULL = none */
} sp_loop_ctx_t;

/* The model a request names (version: a KServe version string, or ptr
 * NULL for the newest). true: *out holds a reference the request must
 * release (sp_served_release) when it ends. false: the request has been
 * answered (404 unknown or unavailable, with the reason) or parked while
 * its model loads on demand: `retry` then runs again with the same
 * arguments once the load ends, or the request gets 503 after
 * --load-timeout. */
bool sp_api_model_for(sp_serving_t *s, sp_http_req_t *r, const char *name, size_t len,
                      sp_str_t version, sp_route_fn retry, const sp_route_params_t *p,
                      sp_served_model_t **out);
sp_mailbox_t *sp_api_mailbox(sp_http_req_t *r);
struct sp_tensor_hcache *sp_api_hcache(sp_http_req_t *r); /* the request's loop's */
/* The request's tenant's tier (its default priority), and a priority the
 * request asked for capped at that tier: a key never buys a higher tier. */
int32_t sp_api_tier(sp_http_req_t *r);
int32_t sp_api_priority(sp_http_req_t *r, int32_t asked);

/* End a request's accounting (once; later calls only make sure the token
 * reservation is settled): the model's metrics, the tenant's tokens (the
 * reservation settled with the prompt and completion tokens used), the
 * trace's model spans and the access-log note. Call before the last answer
 * bytes are queued. m NULL: only the reservation is released. The lifecycle
 * (request.h) calls it; so do answers that never reach one (a cached answer). */
void sp_api_account(sp_http_req_t *r, sp_served_model_t *m, sp_req_clock_t *c, bool ok,
                    sp_finish_t finish, sp_fail_reason_t reason);

/* OpenAI-shaped error: {"error":{"message","type","param","code"}}. type NULL
 * picks one from the status. */
void sp_api_error(sp_http_req_t *r, int status, const char *type, const char *param,
                  const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Is this a KServe v2 path ("/v2" or under "/v2/")? */
bool sp_api_kserve_path(sp_str_t path);
/* KServe v2's error shape, {"error": "..."}: what sp_api_error writes on a
 * /v2 path, and what the KServe routes write directly. */
void sp_api_error_kserve(sp_http_req_t *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A reason as clients see it: the repository's own location (as given and
 * resolved) removed, so answers name files relative to the repository and
 * never the server's file system (the log keeps it all). Any other absolute
 * path left (a key file, the key directory) is cut to its last component
 * after ".../". */
void sp_api_redact(const sp_serving_t *s, const char *in, char *out, size_t cap);
/* 200-style JSON answer from a writer (500 if it ran out of memory). */
void sp_api_reply_json(sp_http_req_t *r, int status, const sp_jbuf_t *b);

/*
 * The LoRA adapter a request's model name selects on m (which the registry
 * found for that name): none when name is m's own name; else name must be
 * "<m->name>:<adapter>" with the adapter loaded, or this answers 404 itself
 * (model_not_found) and returns false. out->lora holds a reference: release
 * it with sp_req_adapter_release (adapter.c).
 */
struct sp_req_adapter;
bool sp_adapter_for(sp_serving_t *s, sp_http_req_t *r, sp_served_model_t *m, const char *name,
                    size_t len, struct sp_req_adapter *out);

/* Route registration of each protocol module. */
void sp_openai_register(sp_router_t *rt, sp_serving_t *s);
/* POST /v1/responses, GET and DELETE /v1/responses/{id} (responses.c). */
void sp_responses_register(sp_router_t *rt, sp_serving_t *s);
/* POST /v1/messages and /v1/messages/count_tokens (anthropic.c). */
void sp_anthropic_register(sp_router_t *rt, sp_serving_t *s);
/* POST /apply-template, /tokenize and /detokenize (tokenize_routes.c). */
void sp_tokenize_routes_register(sp_router_t *rt, sp_serving_t *s);
void sp_prometheus_register(sp_router_t *rt, sp_serving_t *s); /* GET /metrics (prometheus.c) */
/* The body of an error answered by the HTTP transport itself (400, 413,
 * 431, 503, ...): OpenAI's shape, the type picked from the status. */
size_t sp_api_error_body(int status, const char *message, char *buf, size_t cap);
void sp_repository_register(sp_router_t *rt, sp_serving_t *s); /* /v2/repository */
/* GET /v2/models[/{m}[/versions/{v}]]/stats (tstats.c): before the KServe
 * routes, whose /v2/models/{model} would take /v2/models/stats. */
void sp_tstats_register(sp_router_t *rt, sp_serving_t *s);

#endif /* SP_API_API_H */
