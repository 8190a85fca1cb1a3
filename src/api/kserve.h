/*
 * kserve.h - the KServe v2 / Open Inference Protocol routes (server and model
 * metadata, model readiness, infer with the binary tensor data extension) and
 * Triton's generate extension (generate, generate_stream) for the served LLMs.
 *
 * Errors on these routes are {"error": "..."} (the protocol's shape) instead
 * of OpenAI's object; sp_api_error picks the shape from the path (sp_api_kserve_path).
 */
#ifndef SP_API_KSERVE_H
#define SP_API_KSERVE_H

#include <stdbool.h>

#include "core/str.h"
#include "api/api.h"

/* The version of a model served with --model (a repository model has its own). */
#define SP_KSERVE_MODEL_VERSION "1"

void sp_kserve_register(sp_router_t *rt, sp_serving_t *s);
/* Answer {"error": message} with status (headers such as Retry-After are the caller's). */

#endif /* SP_API_KSERVE_H */
