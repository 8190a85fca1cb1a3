/*
 * kserve.h - the KServe v2 / Open Inference Protocol routes (server and model
 * metadata, model readiness, infer with the binary tensor data extension) and
 * Triton's generate extension (generate, generate_stream) for the served LLMs.
 *
 * Errors on these routes are {"error": "..."} (the protocol's shape) instead
 * of OpenAI's object; serve.c asks sp_kserve_path which shape a path gets.
 */
#ifndef SP_API_KSERVE_H
#define SP_API_KSERVE_H

#include <stdbool.h>

#include "core/str.h"
#include "api/api.h"

/* The version of a model served with --model (a repository model has its own). */
#define SP_KSERVE_MODEL_VERSION "1"

void sp_kserve_register(sp_router_t *rt, sp_serving_t *s);
/* Is this a KServe v2 path ("/v2" or under "/v2/")? */
bool sp_kserve_path(sp_str_t path);
/* Answer {"error": message} with status (headers such as Retry-After are the caller's). */
/* An infer response body: json followed by the binary tail bin when it is not
 * empty. hl gets the Inference-Header-Content-Length value ("" without a
 * tail; the content type is then application/json, else
 * application/octet-stream). false when memory ran out. */
bool sp_kserve_infer_body(sp_jbuf_t *json, const sp_jbuf_t *bin, char hl[32]);
void sp_kserve_error(sp_http_req_t *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* SP_API_KSERVE_H */
