/*
 * adapters.h - LoRA adapters served next to their base model (docs/lora.md).
 *
 * Layout: <repository>/<model>/adapters/<adapter>.gguf. Every adapter file
 * of a model is loaded (validated against that version's weights) when the
 * model loads; `POST /v2/repository/models/<model>:<adapter>/load` and
 * `.../unload` add, replace or remove one at run time. Requests select one
 * with the model name "<model>:<adapter>" (OpenAI `model`, KServe route).
 *
 * A loaded model version (sp_served_model_t) owns its set of adapters; the
 * set changes only on the manager thread and under the registry lock, and
 * loop threads read it under that lock. Each adapter (sp_lora_t) is
 * reference-counted: the set holds one, a request one from its lookup to the
 * end of its response, the scheduler's job one until the engine is done with
 * it. Unloading drops the set's reference; requests in flight finish on the
 * adapter they started with and the last release frees it.
 */
#ifndef SP_SERVING_ADAPTERS_H
#define SP_SERVING_ADAPTERS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/str.h"
#include "engine/lora.h"
#include "core/json.h"

struct sp_serving;
struct sp_served_model;
struct sp_http_req;

#define SP_ADAPTER_NAME_MAX 64 /* [A-Za-z0-9._-], not starting with '.' */
#define SP_ADAPTERS_MAX 64     /* per model version */

typedef struct sp_served_adapter {
    char name[SP_ADAPTER_NAME_MAX + 1];
    sp_lora_t *lora; /* the set's reference */
    int64_t created; /* unix seconds, for /v1/models */
} sp_served_adapter_t;

typedef struct sp_adapter_set {
    int n;
    sp_served_adapter_t a[SP_ADAPTERS_MAX];
} sp_adapter_set_t;

/* What a request selected: no adapter (lora NULL) or one with a reference. */
typedef struct sp_req_adapter {
    sp_lora_t *lora;
    char name[SP_ADAPTER_NAME_MAX + 1];
} sp_req_adapter_t;

/* Is name[0..len) a valid adapter name? */
bool sp_adapter_name_ok(const char *name, size_t len);

/* ---- manager thread */

/* Load every adapters/<name>.gguf of the repository model `model` into m
 * (built, not yet published). A bad file is logged and skipped: the model
 * serves without it. */
void sp_adapters_load_dir(struct sp_serving *s, const char *model, struct sp_served_model *m);
/* Load (or reload) adapter into every READY version of base; the HTTP status
 * of the answer (200, 400 bad file, 404 no such model or file) and err. */
int sp_adapters_load(struct sp_serving *s, const char *base, const char *adapter, char *err,
                     size_t err_len);
/* Unload adapter from every version of base: 200, or 404. */
int sp_adapters_unload(struct sp_serving *s, const char *base, const char *adapter, char *err,
                       size_t err_len);
/* Drop m's set (sp_served_free). */
void sp_adapters_free(struct sp_served_model *m);

/* ---- loop threads */

/*
 * The adapter a request's model name selects on m (which the registry found
 * for that name): none when name is m's own name; else name must be
 * "<m->name>:<adapter>" with the adapter loaded, or this answers 404 itself
 * (model_not_found) and returns false. out->lora holds a reference: release
 * it with sp_req_adapter_release.
 */
bool sp_server_adapter_for(struct sp_serving *s, struct sp_http_req *r, struct sp_served_model *m,
                           const char *name, size_t len, sp_req_adapter_t *out);
void sp_req_adapter_release(sp_req_adapter_t *a);
/* The name a response reports: "<model>" or "<model>:<adapter>". */
void sp_req_adapter_model_name(const struct sp_served_model *m, const sp_req_adapter_t *a,
                               sp_jbuf_t *b);

/* /v1/models: append m's adapters as model objects (registry lock held);
 * with want set, only the one named want ("<model>:<adapter>"). */
void sp_adapters_list_locked(const struct sp_served_model *m, sp_str_t want, sp_jbuf_t *b,
                             int *found);
/* Does want name an adapter of model `name` ("<name>:<something>")? */
bool sp_adapters_prefix(sp_str_t want, const char *name);

#endif /* SP_SERVING_ADAPTERS_H */
