/*
 * api.h - what the protocol modules (openai.c, kserve.c, grpc.c, the
 * repository, metrics and status routes) share: the per-loop context, the
 * model a request names, its tier, and error and JSON answers.
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
#include "serving/serving.h"

/* Per loop thread (sp_http_loop_user), made by the composition root. */
typedef struct sp_loop_ctx {
    sp_serving_t *srv;
    sp_mailbox_t *mb;
    struct sp_grpc_loop *grpc; /* this loop's gRPC connections (grpc.h); NULL = none */
    struct sp_infer_hcache *hcache; /* decoded binary-request headers (tensor.h); NULL = none */
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
struct sp_infer_hcache *sp_api_hcache(sp_http_req_t *r); /* the request's loop's */
/* The request's tenant's tier (its default priority), and a priority the
 * request asked for capped at that tier: a key never buys a higher tier. */
int32_t sp_api_tier(sp_http_req_t *r);
int32_t sp_api_priority(sp_http_req_t *r, int32_t asked);

/* OpenAI-shaped error: {"error":{"message","type","param","code"}}. type NULL
 * picks one from the status. */
void sp_api_error(sp_http_req_t *r, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
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
void sp_prometheus_register(sp_router_t *rt, sp_serving_t *s); /* GET /metrics (prometheus.c) */
/* The body of an error answered by the HTTP transport itself (400, 413,
 * 431, 503, ...): OpenAI's shape, the type picked from the status. */
size_t sp_api_error_body(int status, const char *message, char *buf, size_t cap);
void sp_repository_register(sp_router_t *rt, sp_serving_t *s); /* /v2/repository */
/* A reason with the repository's location removed, for answers to clients
 * (repository.c). */
void sp_repository_redact(const sp_serving_t *s, const char *in, char *out, size_t cap);

#endif /* SP_API_API_H */
