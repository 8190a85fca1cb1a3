/*
 * ollama.h - Ollama's API (/api/...): the routes, and the parts of its
 * request parsing the generation routes share.
 *
 * Threads: a loop thread.
 */
#ifndef SP_API_OLLAMA_H
#define SP_API_OLLAMA_H

#include <stddef.h>

#include "core/json.h"
#include "http/router.h"
#include "serving/serving.h"

/* keep_alive of an Ollama request: 0 when absent or negative (keep the model
 * loaded, which this server does until its memory is needed); -1 with err
 * set (a 400) for a bad value or a timed unload, which it does not do. */
int sp_ollama_keep_alive(const json_t *body, char *err, size_t cap);

void sp_ollama_register(sp_router_t *rt, sp_serving_t *s);

#endif /* SP_API_OLLAMA_H */
