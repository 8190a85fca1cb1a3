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

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/chat.h"
#include "engine/model.h"
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
} sp_served_model_t;

typedef struct sp_server {
    sp_serve_config_t cfg;
    sp_served_model_t models[SP_SERVE_MAX_MODELS];
    int n_models;
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
sp_mailbox_t *sp_server_mailbox(sp_http_req_t *r);

/* OpenAI-shaped error: {"error":{"message","type","param","code"}}. type NULL
 * picks one from the status. */
void sp_server_error(sp_http_req_t *r, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* 200-style JSON answer from a writer (500 if it ran out of memory). */
void sp_server_reply_json(sp_http_req_t *r, int status, const sp_jbuf_t *b);

/* Route registration of each protocol module. */
void sp_openai_register(sp_router_t *rt, sp_server_t *s);

#endif /* SP_SERVER_SERVER_H */
