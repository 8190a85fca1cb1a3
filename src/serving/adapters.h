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
 * set changes only on the manager thread and under the lock it is given
 * (the registry's), and loop threads read it under that lock. Each adapter (sp_lora_t) is
 * reference-counted: the set holds one, a request one from its lookup to the
 * end of its response, the scheduler's job one until the engine is done with
 * it. Unloading drops the set's reference; requests in flight finish on the
 * adapter they started with and the last release frees it.
 */
#ifndef SP_SERVING_ADAPTERS_H
#define SP_SERVING_ADAPTERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/str.h"
#include "engine/model.h"
#include "sampan/status.h"
#include "engine/lora.h"
#include "core/json.h"

struct sp_served_model;

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
bool sp_adapters_name_ok(const char *name, size_t len);
/* The file of model's adapter under the resolved repository root
 * (<model>/adapters/<adapter>.gguf, realpath-checked); SP_ERR_NOT_FOUND with
 * a message naming it when there is none. */
sp_status_t sp_adapters_path(const char *repo_real, const char *model, const char *adapter,
                             char *out, size_t out_len, char *err, size_t err_len);

/* ---- manager thread: each takes the set (allocated by the first load),
 * the base model its adapters are checked against, and the lock that
 * guards the set (readers hold it too). */

/* Load every <repository>/<model>/adapters/<name>.gguf into *set (a model
 * version built, not yet published). A bad file is logged and skipped: the
 * model serves without it. */
void sp_adapters_load_dir(sp_adapter_set_t **set, const sp_model_t *base, pthread_mutex_t *lock,
                          const char *repo_real, const char *model, int64_t version);
/* Load adapter from path into *set (replacing one of that name: *replaced).
 * SP_OK, SP_ERR_INVALID (a bad file, or the set is full) or SP_ERR_NOMEM,
 * with err; model names the base in messages. */
sp_status_t sp_adapters_put(sp_adapter_set_t **set, const sp_model_t *base, pthread_mutex_t *lock,
                    const char *model, const char *path, const char *adapter, bool *replaced,
                    char *err, size_t err_len);
/* Drop adapter from set; false when it holds none of that name. */
bool sp_adapters_remove(sp_adapter_set_t *set, pthread_mutex_t *lock, const char *adapter);
/* Drop a whole set (its model is freed). NULL is a no-op. */
void sp_adapters_free(sp_adapter_set_t *set);

/* ---- loop threads */

/*
 * The adapter a request's model name selects on the model base_name (which
 * the registry found for that name): none when name is base_name itself;
 * else name must be "<base_name>:<adapter>" with the adapter in *set. false
 * when it is not (the caller answers). out->lora holds a reference:
 * release it with sp_req_adapter_release.
 */
bool sp_adapters_find(sp_adapter_set_t *const *set, pthread_mutex_t *lock, const char *base_name,
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
