/*
 * server.h - what the protocol modules (openai.c, later kserve.c) share: the
 * served models, readiness, the per-loop context, error and JSON replies.
 *
 * Threads: the model table is filled before the server turns ready and is
 * read-only afterwards; `ready` and `draining` are atomics. Everything else
 * here is called on a loop thread with a request of that loop.
 */
#ifndef SP_SERVER_SERVER_H
#define SP_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/chat.h"
#include "engine/model.h"
#include "repo/repo.h"
#include "server/config.h"
#include "server/http.h"
#include "server/json.h"
#include "server/router.h"
#include "server/sched.h"

typedef struct sp_served_model {
    char name[128];
    char path[1024];
    sp_model_t *model;
    const sp_tokenizer_t *tok;
    sp_chat_template_t *tmpl; /* NULL when the model has none that compiles */
    char tmpl_error[256];
    sp_sched_t *sched;
    int64_t n_ctx;
    int64_t created;          /* unix seconds, for /v1/models */
    atomic_bool ready;
    /* Repository models (repository.c): one slot per (name, version). A slot
     * never moves or goes away while the server runs; unload only parks it
     * (see repository.c for why its memory is kept until shutdown). */
    bool from_repo;
    int64_t version;          /* repository version; 0 for --model */
    char version_str[24];     /* KServe's model_version: the repository version, "1" for --model */
    atomic_int state;         /* sp_repo_state_t; UNAVAILABLE slots are not routed */
    char reason[512];         /* why UNAVAILABLE (guarded by sp_server_t.repo_mu) */
} sp_served_model_t;

typedef struct sp_server {
    sp_serve_config_t cfg;
    sp_served_model_t models[SP_SERVE_MAX_MODELS];
    atomic_int n_models;      /* grows when the repository loads a model; slots fill first */
    pthread_mutex_t repo_mu;  /* serialises repository load, unload and index */
    atomic_bool ready;        /* every model loaded */
    atomic_bool draining;     /* SIGTERM seen */
    atomic_bool load_failed;
    sp_http_server_t *http;
    sp_router_t *router;
    int64_t started_unix;
} sp_server_t;

/* Per loop thread (sp_http_loop_user). */
typedef struct sp_loop_ctx {
    sp_server_t *srv;
    sp_mailbox_t *mb;
} sp_loop_ctx_t;

/* `sampan serve` */
int sp_cmd_serve(int argc, char **argv);

/* Model by name (NULL if unknown). */
sp_served_model_t *sp_server_find_model(sp_server_t *s, const char *name, size_t len);
/* The routed slot of a name and KServe version string (NULL if none). */
sp_served_model_t *sp_server_find_version(sp_server_t *s, const char *name, size_t len,
                                          sp_str_t version);
sp_mailbox_t *sp_server_mailbox(sp_http_req_t *r);

/* OpenAI-shaped error: {"error":{"message","type","param","code"}}. type NULL
 * picks one from the status. */
void sp_server_error(sp_http_req_t *r, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* 200-style JSON answer from a writer (500 if it ran out of memory). */
void sp_server_reply_json(sp_http_req_t *r, int status, const sp_jbuf_t *b);

/* Load a slot's model, template and scheduler from m->path with the server's
 * settings, and publish it (ready, READY). On failure the slot is left
 * without a model and err says why. */
sp_status_t sp_server_load_slot(sp_server_t *s, sp_served_model_t *m, char *err, size_t err_len);

/* Route registration of each protocol module. */
void sp_openai_register(sp_router_t *rt, sp_server_t *s);
/* repository.c: start-up load of --model-repository (on the loader thread)
 * and the /v2/repository routes. */
void sp_repository_register(sp_router_t *rt, sp_server_t *s);
void sp_repository_load_startup(sp_server_t *s);

#endif /* SP_SERVER_SERVER_H */
