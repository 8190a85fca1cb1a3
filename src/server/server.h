/*
 * server.h - what the protocol modules (openai.c, later kserve.c) share: the
 * served models, readiness, the per-loop context, error and JSON replies.
 *
 * Threads: the models live in the registry (registry.h, its own lock);
 * `ready` and `draining` are atomics. Everything else here is called on a
 * loop thread with a request of that loop.
 */
#ifndef SP_SERVER_SERVER_H
#define SP_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "chat/chat.h"
#include "engine/model.h"
#include "serving/repo.h"
#include "serving/config.h"
#include "http/http.h"
#include "core/json.h"
#include "http/router.h"
#include "serving/registry.h"
#include "serving/respcache.h"
#include "sched/sched.h"
#include "serving/tenants.h"

typedef struct sp_mgr_cmd sp_mgr_cmd_t; /* repository.c */

typedef struct sp_server {
    sp_serve_config_t cfg;
    sp_registry_t reg;        /* the served models (registry.h) */
    sp_auth_t auth;           /* API keys and tenants (tenants.h) */
    atomic_bool reload_tenants; /* SIGHUP: the manager rereads the tenants file */
    /* The manager thread (repository.c): loads, unloads, polls, evicts and
     * frees models; its queue is guarded by reg.mu and woken by reg.cv. */
    pthread_t mgr;
    bool mgr_started;
    bool mgr_stop;
    sp_mgr_cmd_t *cmd_head, *cmd_tail;
    atomic_bool ready;        /* start-up loads done */
    atomic_bool draining;     /* SIGTERM seen */
    atomic_bool load_failed;
    sp_http_server_t *http;
    struct sp_grpc *grpc;     /* the gRPC port (grpc.h); NULL = none */
    sp_router_t *router;
    sp_respcache_t *rcache;   /* --response-cache-bytes; NULL = off (respcache.h) */
    /* Workers that prepare requests off the loops (grammar and schema
     * compiling, chat templates, tokenizing: openai.c); NULL = on the loop. */
    struct sp_workq *prep;
    int64_t started_unix;
    uint64_t rid_prefix;      /* per process, so request ids differ across restarts */
    char repo_real[4096];     /* the repository root resolved (for sp_repository_redact) */
} sp_server_t;

/* Per loop thread (sp_http_loop_user). */
typedef struct sp_loop_ctx {
    sp_server_t *srv;
    sp_mailbox_t *mb;
    struct sp_grpc_loop *grpc; /* this loop's gRPC connections (grpc.h); NULL = none */
    struct sp_infer_hcache *hcache; /* decoded binary-request headers (tensor.h); NULL = none */
} sp_loop_ctx_t;

/* `sampan serve` */
int sp_cmd_serve(int argc, char **argv);

/* The model a request names (version: a KServe version string, or ptr
 * NULL for the newest). true: *out holds a reference the request must
 * release (sp_served_release) when it ends. false: the request has been
 * answered (404 unknown or unavailable, with the reason) or parked while
 * its model loads on demand: `retry` then runs again with the same
 * arguments once the load ends, or the request gets 503 after
 * --load-timeout. */
bool sp_server_model_for(sp_server_t *s, sp_http_req_t *r, const char *name, size_t len,
                         sp_str_t version, sp_route_fn retry, const sp_route_params_t *p,
                         sp_served_model_t **out);
sp_mailbox_t *sp_server_mailbox(sp_http_req_t *r);
struct sp_infer_hcache *sp_server_hcache(sp_http_req_t *r); /* the request's loop's */
/* The request's tenant's tier (its default priority), and a priority the
 * request asked for capped at that tier: a key never buys a higher tier. */
int32_t sp_server_tier(sp_http_req_t *r);
int32_t sp_server_priority(sp_http_req_t *r, int32_t asked);

/* OpenAI-shaped error: {"error":{"message","type","param","code"}}. type NULL
 * picks one from the status. */
void sp_server_error(sp_http_req_t *r, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* 200-style JSON answer from a writer (500 if it ran out of memory). */
void sp_server_reply_json(sp_http_req_t *r, int status, const sp_jbuf_t *b);

/* Route registration of each protocol module. */
void sp_openai_register(sp_router_t *rt, sp_server_t *s);
void sp_metrics_register(sp_router_t *rt, sp_server_t *s); /* GET /metrics (metrics.c) */
/* repository.c: the manager thread (start-up loads of --model and the
 * repository, poll mode, load and unload, on-demand loads, freeing) and the
 * /v2/repository routes. */
void sp_repository_register(sp_router_t *rt, sp_server_t *s);
sp_status_t sp_repository_start(sp_server_t *s, char *err, size_t err_len);
void sp_repository_stop(sp_server_t *s);
/* A reason with the repository's location removed, for answers to clients. */
void sp_repository_redact(const sp_server_t *s, const char *in, char *out, size_t cap);
/* Queue the on-demand load of e (reg.mu held; e already LOADING). */
void sp_repository_demand_locked(sp_server_t *s, sp_model_entry_t *e);

#endif /* SP_SERVER_SERVER_H */
