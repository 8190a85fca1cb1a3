/*
 * serving.h - what everything between the engines and the protocols shares:
 * the served models (registry), the serve configuration, tenants, the
 * response cache, the preparation workers, readiness and drain, and the
 * state of the manager thread that loads, unloads and frees models
 * (manager.h).
 *
 * One sp_serving_t per process, made by the composition root (server/serve.c)
 * and handed to every protocol module at registration. Code below api/ takes
 * this, never the composition root's own struct.
 *
 * Threads: the models live in the registry (registry.h, its own lock);
 * `ready`, `draining` and `load_failed` are atomics; the rest is set before
 * the loops start and read-only after.
 */
#ifndef SP_SERVING_SERVING_H
#define SP_SERVING_SERVING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "http/http.h"
#include "serving/config.h"
#include "serving/registry.h"
#include "serving/respcache.h"
#include "serving/auth.h"

typedef struct sp_manager_cmd sp_manager_cmd_t; /* manager.c */

typedef struct sp_serving {
    sp_serve_config_t cfg;
    sp_registry_t reg;        /* the served models (registry.h) */
    sp_auth_t auth;           /* API keys and tenants (tenants.h) */
    atomic_bool reload_tenants; /* SIGHUP: the manager rereads the tenants file */
    /* The manager thread (manager.h): loads, unloads, polls, evicts and
     * frees models; its queue is guarded by reg.mu and woken by reg.cv. */
    pthread_t mgr;
    bool mgr_started;
    bool mgr_stop;
    sp_manager_cmd_t *cmd_head, *cmd_tail;
    atomic_bool ready;        /* start-up loads done */
    atomic_bool draining;     /* the drain began: no new connections or requests */
    atomic_bool leaving;      /* SIGTERM seen, --drain-delay running: not ready, still serving */
    atomic_bool load_failed;
    /* Repository models whose config or directory could not be read at the
     * last full scan (strict readiness counts them as not ready). */
    atomic_int repo_bad_models;
    sp_http_server_t *http;   /* the transport: its counters, and drain state */
    sp_respcache_t *rcache;   /* --response-cache-bytes; NULL = off (respcache.h) */
    /* Workers that prepare requests off the loops (grammar and schema
     * compiling, chat templates, tokenizing: openai.c); NULL = on the loop. */
    struct sp_workq *prep;
    int64_t started_unix;
    uint64_t rid_prefix;      /* per process, so request ids differ across restarts */
    char repo_real[4096];     /* the repository root resolved (adapters, redaction) */
    /* --model-repository s3://...: the object store mirrored into cfg.model_repository
     * (s3repo.h), synced by the manager before each scan; NULL for a local repository. */
    struct sp_s3repo *s3;
    char repo_url[1024];      /* the repository as given (s3://...), for logs */
} sp_serving_t;

#endif /* SP_SERVING_SERVING_H */
