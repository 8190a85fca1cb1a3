/*
 * ollama.h - Ollama's API (/api/...): the routes, and the parts of its
 * request parsing the generation routes share.
 *
 * Threads: a loop thread.
 */
#ifndef SP_API_OLLAMA_H
#define SP_API_OLLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "core/json.h"
#include "http/http.h"
#include "http/router.h"
#include "serving/serving.h"

/* The Ollama dialect's bits in sp_dialect_req_t.flags (dialect.h); from
 * SP_OLLAMA_LOAD_SHIFT up: the request's wait for its model, in ms. */
#define SP_OLLAMA_GENERATE 1   /* /api/generate: "response", not "message" */
#define SP_OLLAMA_NO_THINK 2   /* think false: the thinking is not returned */
#define SP_OLLAMA_LOAD_SHIFT 4

/* keep_alive of an Ollama request, in *keep_ns: how long its model stays
 * loaded after its last request (0: unloaded when the requests on it end;
 * -1: for good); absent or null: def_ns (the server's --keep-alive). -1
 * with err set (a 400) for a value that is not a number of seconds or a Go
 * duration ("5m", "1h30m", "-1s"). */
int sp_ollama_keep_alive(const json_t *body, int64_t def_ns, int64_t *keep_ns, char *err,
                         size_t cap);
/* The server's --keep-alive in ns (-1: never). */
int64_t sp_ollama_keep_default(const sp_serving_t *s);

/* The model a request names in `model` (or the older `name`), Ollama's
 * ":latest" tag dropped (*name_len: the name's length without it), its
 * adapter checked; with a reference. NULL: answered (404, 400) or parked
 * until an on-demand load ends (then retry runs again). */
sp_served_model_t *sp_ollama_model(sp_serving_t *s, sp_http_req_t *r, const json_t *body,
                                   sp_route_fn retry, const sp_route_params_t *p, size_t *name_len);

/* GET /api/version, /api/tags, /api/ps; POST /api/show, /api/embed,
 * /api/embeddings (ollama.c), /api/chat, /api/generate (ollama_chat.c). */
void sp_ollama_register(sp_router_t *rt, sp_serving_t *s);
void sp_ollama_chat_register(sp_router_t *rt, sp_serving_t *s);

#endif /* SP_API_OLLAMA_H */
