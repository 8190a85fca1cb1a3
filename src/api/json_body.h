/*
 * json_body.h - the JSON object body of an OpenAI-shaped request (the
 * OpenAI routes, llama-server's tokenize routes), parsed where it does not
 * hold the event loop, and the OpenAI-shaped refusal of offloaded work.
 *
 * Bodies up to SP_API_INLINE_BODY are parsed on the loop (well under a
 * millisecond). A larger one is copied and parsed on a preparation worker
 * (offload.h); the route handler then runs again on the loop with the
 * parsed body, handed over through sp_offload_body_redo, so handlers stay
 * one straight sequence: `b = sp_api_json_body(...); if (b == NULL) return;`.
 */
#ifndef SP_API_JSON_BODY_H
#define SP_API_JSON_BODY_H

#include "api/api.h"

#define SP_API_INLINE_BODY (64u * 1024u)

/* Loop thread. The body as a JSON object (the caller owns it), or NULL: then
 * either the request was answered (400 for an empty, malformed or non-object
 * body, 429/503 when the worker queue refuses) or `handler` runs again once
 * the body is parsed. */
json_t *sp_api_json_body(sp_serving_t *s, sp_http_req_t *r, sp_route_fn handler,
                         const sp_route_params_t *p);

/* A refusal to queue work on a preparation worker (sp_offload_ops_t.refuse),
 * in OpenAI's error shape: 429 names the full queue, 503 the server stopping
 * or out of memory. */
void sp_api_refuse(sp_http_req_t *r, int status, const char *message);

#endif /* SP_API_JSON_BODY_H */
