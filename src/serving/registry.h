/*
 * registry.h - the served models: one entry per (name, version), the loaded
 * model behind it (reference-counted), lookup, the choice of an instance, and
 * the memory budget of every device with LRU eviction.
 *
 * An entry is what the index and the routes see: a name, a version, a state
 * (READY, LOADING, UNAVAILABLE) and a reason. A READY entry points at a
 * loaded model (sp_served_model_t): the weights (one mmap), the tokenizer,
 * the chat template, the sampling defaults of its config and `count`
 * instances (one scheduler each, sharing the weights).
 *
 * References: the entry holds one; every request holds one from its lookup
 * (sp_registry_acquire) to the end of its response (sp_served_release). A
 * new version or a reload is built beside the old one and published by
 * swapping the entry's pointer under the registry lock; the old model is
 * dropped from the entry and freed when its last request lets go (on the
 * manager thread, never on a loop thread), so no request or stream ever sees
 * a model freed under it.
 *
 * Memory: before a model is built its need is estimated per device (weights
 * once per device, plus every instance's KV pool and scratch:
 * sp_sched_estimate) and reserved against the device's budget; a model that
 * does not fit evicts idle models (no request holds them), least recently
 * used first, and is refused with a clear error when it cannot fit even
 * then. Reservations last until the model is freed, so the sum never
 * exceeds the budget: a draining old version still counts.
 *
 * Kinds: what a model is (an LLM on the engine, a tensor model on a backend
 * plugin) sits behind a small table (sp_model_kind_t): probe says how much
 * memory it needs per device, start brings it up once that memory is
 * reserved, stop ends its queued work, free releases it. The registry
 * reserves between probe and start and returns the reservation when a start
 * fails or the model is freed; it never looks at which kind it holds.
 *
 * On-demand loads: a lookup that finds a model able to load on demand marks
 * its entry `demanded` (LOADING) and wakes the manager (cv); the manager
 * takes demanded entries with sp_registry_take_demand_locked. The registry
 * never calls into the manager.
 *
 * Threads: lookups run on the loop threads; everything that builds, swaps,
 * evicts or frees runs on the manager thread (manager.c), one at a time.
 * The registry lock guards the entries, the accounting and the queues and
 * is never held while a model is built or freed.
 */
#ifndef SP_SERVING_REGISTRY_H
#define SP_SERVING_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "device/device.h"
#include "chat/chat.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "sampan/backend.h"
#include "serving/repo_config.h"
#include "serving/repo.h"
#include "serving/config.h"
#include "sched/drain.h"
#include "serving/metrics.h"
#include "sched/sched.h"

struct sp_serving;
struct sp_adapter_set;
typedef struct sp_served_model sp_served_model_t;

/*
 * A kind of model. probe loads what it must to know the model's memory need
 * and fills m->charge[] (bytes per device; the instances' placement in
 * m->inst_dev[] is its to set); start brings the model up once the registry
 * reserved that charge. A probe or start that fails leaves what it made in
 * m for free. stop ends queued work with an error (shutdown); free releases
 * everything the kind made (after stop, or after a failed probe or start);
 * stats gives its scheduler figures. All on the manager thread except stop
 * (shutdown) and stats (any thread, with a reference).
 */
typedef struct sp_model_kind {
    const char *name; /* "llm", "tensor" */
    sp_status_t (*probe)(struct sp_serving *s, sp_served_model_t *m, const sp_repo_config_t *cfg,
                         char *err, size_t err_len);
    sp_status_t (*start)(struct sp_serving *s, sp_served_model_t *m, const sp_repo_config_t *cfg,
                         char *err, size_t err_len);
    void (*stop)(sp_served_model_t *m);
    void (*free)(sp_served_model_t *m);
    void (*stats)(const sp_served_model_t *m, sp_sched_stats_t *out);
} sp_model_kind_t;

#define SP_REG_MAX_DEVICES 64 /* devices the budget tracks (the CPU, GPUs, MIG instances) */

/* Sampling defaults from a config's `parameters` (NAN / -1 = not set). */
typedef struct sp_served_defaults {
    int32_t max_tokens, top_k;
    double temperature, top_p, min_p;
    double repeat_penalty, frequency_penalty, presence_penalty;
    int64_t seed;
    bool seed_set;
} sp_served_defaults_t;

struct sp_served_model {
    struct sp_serving *srv;
    const sp_model_kind_t *kind; /* what it is (llm_model.h, tensor_model.h) */
    void *kind_data;           /* the kind's own state, freed by kind->free */
    char name[128];
    char path[1024];
    int64_t version;           /* repository version; 0 for --model */
    char version_str[24];      /* KServe's model_version ("1" for --model) */
    bool from_repo;
    sp_model_t *model;
    sp_model_t *draft;         /* speculative decoding's draft model, or NULL */
    const sp_tokenizer_t *tok;
    sp_chat_template_t *tmpl;  /* NULL when the model has none that compiles */
    char tmpl_error[256];
    int n_inst;
    sp_sched_t *inst[SP_REPO_MAX_INSTANCES];
    int inst_dev[SP_REPO_MAX_INSTANCES]; /* device list index */
    int64_t n_ctx;
    int32_t n_slots;           /* sequences each instance runs at once (LLM; 0 for others) */
    int64_t created;           /* unix seconds, for /v1/models */
    sp_served_defaults_t def;
    uint64_t sig;              /* what it was built from (file + config stamps) */
    /* Reservation per device (bytes), charged at build, returned at free. */
    uint64_t charge[SP_REG_MAX_DEVICES];
    uint64_t mem_bytes;        /* all devices */
    double load_ms;
    sp_model_metrics_t metrics; /* request counters and latency histograms */
    bool response_cache;       /* its answers may be cached (respcache.h) */
    char *config_json;         /* its config as loaded (sp_repo_config_t.json); NULL: --model */
    /* LoRA adapters served as "<name>:<adapter>" (adapters.h): changed by the
     * manager under the registry lock, read under it. NULL: none. */
    struct sp_adapter_set *adapters;
    /* A tensor model's (a backend plugin, tensor_model.h): its kind fills these. */
    const sp_backend_api_t *be;
    void *be_inst[SP_REPO_MAX_INSTANCES];
    sp_backend_model_info_t be_info;
    int32_t max_batch_size;
    struct sp_batcher *batcher;
    uint32_t prio_levels, prio_default; /* its batcher's priority levels (1-based default) */
    struct sp_tensor_io *io;   /* image inputs and class labels (tensor_model.h), or NULL */
    sp_drain_t drain;          /* requests its batcher completed lately, for Retry-After */
    bool reserved;             /* its charge is taken from the budgets */
    /* It produced NaN or infinite logits or embeddings (SP_ERR_MODEL_FAULT):
     * its readiness and the server's say not ready until it is reloaded. */
    atomic_bool faulty;
    bool has_file_id;          /* file_id holds the model file's stat from before its load */
    struct stat file_id;       /* to notice the file changing on disk (sp_served_file_changed) */
    atomic_int refs;
    _Atomic int64_t last_used_ns;
    /* Idle unload (Ollama's keep_alive): the entry lets the model go once no
     * request has held it for keep_alive_ns when idle_unload is set (never
     * when not: the zero state; the server's --keep-alive until a request
     * sets it). idle_ns: when the last request let go (monotonic), or when
     * it was built. in_use: a request took it since it was last idle (set by
     * lookups under the registry lock). */
    atomic_bool idle_unload;
    atomic_bool in_use;
    _Atomic int64_t keep_alive_ns;
    _Atomic int64_t idle_ns;
    _Atomic uint32_t rr;       /* tie-break among equally loaded instances */
    sp_served_model_t *next;   /* every model not yet freed (registry lock) */
    sp_served_model_t *reap_next; /* waiting to be freed (registry lock) */
};

typedef struct sp_model_entry {
    bool used;
    char name[128];
    int64_t version;
    char version_str[24];
    bool from_repo;
    bool pinned;               /* a --model model: never evicted */
    bool on_demand;            /* loads at its first request (load_on_demand, or evicted) */
    bool demanded;             /* a request asked for it: the manager loads it (LOADING) */
    bool demand_failed;        /* its last load failed: not retried until it changes */
    sp_repo_state_t state;
    char reason[1024];
    uint64_t sig;              /* of the last load attempt */
    char *override_json;       /* a load request's config override, kept for reloads */
    sp_served_model_t *live;   /* READY: the model requests get */
    int64_t last_used_ns;
    /* The model file (its stat stamp) that a reload after a change on disk
     * last failed on: not retried until the file changes again. 0: none. */
    uint64_t file_fail_stamp;
    /* live is a mapped model whose file changed under it and could not be
     * loaded again: still routed, so that every request fails with a clear
     * 5xx from the scheduler's check instead of a 404, until a load succeeds. */
    bool stale_failed;
} sp_model_entry_t;

typedef enum sp_acq {
    SP_ACQ_OK = 0,      /* *out holds a reference */
    SP_ACQ_UNKNOWN,     /* no such model (or version) */
    SP_ACQ_UNAVAILABLE, /* known but not servable: reason says why */
    SP_ACQ_LOADING,     /* being loaded (maybe just started on demand): wait and retry */
} sp_acq_t;

typedef struct sp_registry {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* wakes the manager thread */
    sp_model_entry_t entry[SP_SERVE_MAX_ENTRIES];
    sp_served_model_t *all;    /* every model built and not yet freed */
    sp_served_model_t *reap;   /* models whose last reference is gone (to free) */
    sp_devices_t *devs;
    int n_dev;
    uint64_t budget[SP_REG_MAX_DEVICES];
    uint64_t used[SP_REG_MAX_DEVICES]; /* reserved by models not yet freed */
    int64_t evictions;
    int n_demanded;            /* entries with demanded set */
    bool recheck;              /* a lookup saw changed weights: the manager checks files now */
} sp_registry_t;

/* Open the devices and set every budget from spec ("" = 80% of each;
 * "60%", "2G", "512M", or per device "cpu=2G,cuda:0=70%"). */
sp_status_t sp_registry_init(sp_registry_t *r, const char *budget_spec, char *err, size_t err_len);
/* Shutdown: stop every instance of every model (jobs end with an error
 * event) before the loops stop. */
void sp_registry_stop_all(sp_registry_t *r);
/* After every loop and the manager stopped: frees every model left. */
void sp_registry_fini(sp_registry_t *r);

/* Loop threads. Look up name (and a KServe version string, or NULL for the
 * highest READY version). May start an on-demand load (SP_ACQ_LOADING) when
 * allow_load. reason gets why a known model is not served. */
sp_acq_t sp_registry_acquire(struct sp_serving *s, const char *name, size_t len, const char *version,
                             size_t vlen, bool allow_load, sp_served_model_t **out, char *reason,
                             size_t reason_len);
/* The weights under m are not the ones it was validated with (a mapped file
 * cut or written: gguf/gguf.h); its answers must not be served. */
bool sp_served_weights_changed(const sp_served_model_t *m);
/* m's model file on disk is no longer the one it was loaded from: reload it. */
bool sp_served_file_changed(const sp_served_model_t *m);
/* Take another reference on a model one already holds. */
void sp_served_ref(sp_served_model_t *m);
/* Drop a reference; the last one of a model no entry points at queues it to
 * be freed by the manager. NULL is a no-op. */
void sp_served_release(sp_served_model_t *m);
/* Any thread: m produced NaN or infinite values (a model fault, not the
 * request's): mark it faulty (readiness reports it) and log it once, at
 * error level, with the request id and what it produced. */
void sp_served_fault(sp_served_model_t *m, const char *rid, const char *what);
/* The scheduler figures of a model: its instances' summed (steps: the busiest one's). */
void sp_served_stats(const sp_served_model_t *m, sp_sched_stats_t *out);
/* Set m's idle deadline: unloaded keep_ns after its last request ends (0:
 * as soon as the requests on it end; < 0: never). Any thread. */
void sp_served_keep_alive(sp_served_model_t *m, int64_t keep_ns);
/* When m will be unloaded for idleness (monotonic ns; INT64_MAX: never;
 * while requests hold it, keep_alive after now). Registry lock held. */
int64_t sp_served_expiry_locked(const sp_served_model_t *m, int64_t now);
/* The instance with the least outstanding work (ties rotate). */
sp_sched_t *sp_served_pick(sp_served_model_t *m);

/* Apply the model's sampling defaults over the protocol's (a request's own
 * fields are parsed after and win). */
void sp_served_apply_defaults(const sp_served_model_t *m, sp_sampler_params_t *sp);

/* Every READY model, each with a reference (release each, free the array
 * with sp_free). Stable order: by name, then version. */
int sp_registry_snapshot(struct sp_serving *s, sp_served_model_t ***out);

/* ---- for the manager (manager.c) and the kinds */

/* The entry of (name, version), creating it when create; NULL when the table is full. */
sp_model_entry_t *sp_registry_entry(sp_registry_t *r, const char *name, int64_t version,
                                    bool create);

/* Forget entry e (its model unpublished before): the slot is free again. Lock held. */
void sp_registry_drop_locked(sp_registry_t *r, sp_model_entry_t *e);
/* Build a model of `kind` from a file with the server's settings and a
 * repository config (NULL for --model): the kind's probe, the reservation
 * of its charge (evicting idle models as needed), then its start. On any
 * failure the model is freed and its reservation returned. Manager thread,
 * registry lock not held. */
sp_status_t sp_registry_build(struct sp_serving *s, const sp_model_kind_t *kind, const char *name,
                              int64_t version, bool from_repo, const char *path,
                              const sp_repo_config_t *cfg, uint64_t sig, sp_served_model_t **out,
                              char *err, size_t err_len);
/* Publish m in its entry (READY), returning the model it replaces (its
 * entry reference, to release) or NULL. Lock held by the caller. */
sp_served_model_t *sp_registry_publish_locked(sp_registry_t *r, sp_model_entry_t *e,
                                              sp_served_model_t *m);
/* Stop routing e (UNAVAILABLE with reason why, no longer on demand) and
 * return the model it held (its entry reference, to release outside the
 * lock) or NULL. Lock held by the caller. */
sp_served_model_t *sp_registry_unpublish_locked(sp_registry_t *r, sp_model_entry_t *e,
                                                const char *why);
/* Unpublish one model whose idle deadline passed (no request holds it) and
 * return it (its entry reference, to release outside the lock); its entry
 * loads it again on its next request. NULL when none is due; *next gets
 * the earliest deadline still to come (unchanged when none). Lock held. */
sp_served_model_t *sp_registry_expire_locked(sp_registry_t *r, int64_t now, int64_t *next);
/* Take one entry a request demanded (clearing its mark): its name and
 * version in name/version. false when none is demanded. Lock held. */
bool sp_registry_take_demand_locked(sp_registry_t *r, char *name, size_t name_len,
                                    int64_t *version);
/* Reserve m->charge on every device, evicting idle models least recently
 * used first; refuses (evicting nothing) when it cannot fit. */
sp_status_t sp_registry_reserve(sp_registry_t *r, sp_served_model_t *m, char *err, size_t err_len);
/* Bytes of device d's budget not reserved now. */
uint64_t sp_registry_available(sp_registry_t *r, int d);
/* Place m's instances from cfg's instance_group (m->inst_dev, m->n_inst):
 * count instances on the CPU, or on each listed GPU (every visible one when
 * none is listed), as Triton does. For the kinds' probes. */
sp_status_t sp_registry_place(sp_registry_t *r, sp_served_model_t *m, const sp_repo_config_t *cfg,
                              char *err, size_t err_len);
/* Free the models whose last reference went away. Manager thread. */
void sp_registry_reap(sp_registry_t *r);
/* Free one model now (no references left). Manager thread or shutdown. */
void sp_registry_free(sp_registry_t *r, sp_served_model_t *m);

/* The budget spec parser, for tests: fills budget[] of n devices. */
sp_status_t sp_registry_parse_budget(const char *spec, sp_devices_t *devs, uint64_t *budget,
                                     int n, char *err, size_t err_len);

#endif /* SP_SERVING_REGISTRY_H */
