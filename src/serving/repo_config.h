/*
 * config.h - a model's config.json (Triton's ModelConfig field names, in JSON).
 *
 * The file is parsed strictly: an unknown field, a wrong type or a value out of
 * range is an error whose one line names the file and the JSON field path,
 * e.g. "models/llama/config.json: instance_group[0].kind: must be KIND_CPU or
 * KIND_GPU", so an operator can fix the file without reading our source.
 * Everything parsed lands in fixed-size arrays (the limits below) plus a few
 * heap strings, so a hostile config cannot make us allocate without bound.
 *
 * A load request may carry a config override (JSON text). It is merged over
 * the file's config before validation: see sp_repo_config_merge and
 * docs/repository.md for how this differs from Triton.
 */
#ifndef SP_SERVING_REPO_CONFIG_H
#define SP_SERVING_REPO_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "crypto/enc.h"
#include "serving/image.h"
#include "sampan/status.h"

#define SP_REPO_NAME_MAX        128      /* model, tensor and parameter names (bytes) */
#define SP_REPO_CONFIG_MAX      (1 << 20) /* config.json size (bytes) */
#define SP_REPO_MAX_TENSORS     16       /* input and output each */
#define SP_REPO_MAX_DIMS        8
#define SP_REPO_MAX_GROUPS      8        /* instance_group entries */
#define SP_REPO_MAX_GPUS        16       /* per instance group */
#define SP_REPO_MAX_INSTANCES   64       /* instance_group[].count */
#define SP_REPO_MAX_SPECIFIC    64       /* version_policy.specific.versions */
#define SP_REPO_MAX_PREFERRED   16       /* dynamic_batching.preferred_batch_size */
#define SP_REPO_MAX_PARAMS      64
#define SP_REPO_PARAM_VALUE_MAX (64 << 10) /* a chat template fits */
#define SP_REPO_VERSION_MAX     999999999999999LL /* 15 digits: exact as a double, too */

typedef enum sp_repo_backend {
    SP_REPO_BACKEND_LLM = 0,
    SP_REPO_BACKEND_XGBOOST, /* the xgboost backend (a plugin: backends/xgboost.c) */
    SP_REPO_BACKEND_PLUGIN,  /* any other backend name: a plugin found at load time */
} sp_repo_backend_t;

typedef enum sp_repo_dtype {
    SP_REPO_TYPE_BOOL = 0,
    SP_REPO_TYPE_UINT8,
    SP_REPO_TYPE_UINT16,
    SP_REPO_TYPE_UINT32,
    SP_REPO_TYPE_UINT64,
    SP_REPO_TYPE_INT8,
    SP_REPO_TYPE_INT16,
    SP_REPO_TYPE_INT32,
    SP_REPO_TYPE_INT64,
    SP_REPO_TYPE_FP16,
    SP_REPO_TYPE_FP32,
    SP_REPO_TYPE_FP64,
    SP_REPO_TYPE_STRING,
    SP_REPO_TYPE_BF16,
    SP_REPO_TYPE_COUNT_,
} sp_repo_dtype_t;

typedef struct sp_repo_tensor {
    char name[SP_REPO_NAME_MAX + 1];
    sp_repo_dtype_t data_type;
    int32_t n_dims;
    int64_t dims[SP_REPO_MAX_DIMS]; /* -1 = variable */
    bool optional;                  /* inputs only */
    /* Inputs: Triton's format (0 FORMAT_NONE, 1 FORMAT_NHWC, 2 FORMAT_NCHW: dims
     * are then [H, W, C] or [C, H, W], C 1 or 3), and an image input's
     * preprocessing ("preprocess": {"image": {...}} or the parameter
     * image_preprocess.NAME; image.h). */
    int32_t format;
    bool has_image;
    sp_img_spec_t image;
    /* Outputs: the class labels file in the model directory ("" = none). */
    char label_filename[SP_REPO_NAME_MAX + 1];
} sp_repo_tensor_t;

typedef enum sp_repo_kind { SP_REPO_KIND_CPU = 0, SP_REPO_KIND_GPU } sp_repo_kind_t;

typedef struct sp_repo_group {
    char name[SP_REPO_NAME_MAX + 1]; /* optional; "" when absent */
    int32_t count;                   /* default 1 */
    sp_repo_kind_t kind;             /* default KIND_CPU */
    int32_t n_gpus;                  /* 0 = every visible GPU (KIND_GPU) */
    int32_t gpus[SP_REPO_MAX_GPUS];
} sp_repo_group_t;

typedef enum sp_repo_policy {
    SP_REPO_POLICY_LATEST = 0, /* the num_versions highest versions (default: latest 1) */
    SP_REPO_POLICY_ALL,
    SP_REPO_POLICY_SPECIFIC,
} sp_repo_policy_t;

typedef struct sp_repo_version_policy {
    sp_repo_policy_t kind;
    int32_t num_versions;                    /* LATEST */
    int32_t n_versions;                      /* SPECIFIC, sorted ascending, unique */
    int64_t versions[SP_REPO_MAX_SPECIFIC];
} sp_repo_version_policy_t;

typedef struct sp_repo_queue_policy {
    bool delay_on_timeout;         /* timeout_action "DELAY" (default "REJECT") */
    int64_t default_timeout_us;    /* 0 = none */
    bool allow_timeout_override;
    int32_t max_queue_size;        /* 0 = unbounded */
} sp_repo_queue_policy_t;

typedef struct sp_repo_batching {
    bool enabled; /* the dynamic_batching object is present */
    int64_t max_queue_delay_us;
    int32_t n_preferred;
    int32_t preferred[SP_REPO_MAX_PREFERRED];
    int32_t priority_levels;        /* 0 = one level */
    int32_t default_priority_level; /* 1..priority_levels (0 with priority_levels 0) */
    sp_repo_queue_policy_t default_queue_policy;
    bool has_level_policy[32];      /* priority_queue_policy: level l at [l - 1] */
    sp_repo_queue_policy_t level_policy[32];
} sp_repo_batching_t;

typedef struct sp_repo_param {
    char key[SP_REPO_NAME_MAX + 1];
    char *value; /* heap, NUL-terminated */
} sp_repo_param_t;

/* The LLM keys of `parameters`, typed and range-checked. -1 / NAN = not set
 * (the server's flag or the model file's value applies). */
typedef struct sp_repo_llm {
    int32_t context_length;
    int32_t kv_blocks;
    int32_t max_tokens;
    int32_t top_k;
    double temperature, top_p, min_p;
    double repeat_penalty, frequency_penalty, presence_penalty;
    int64_t seed;               /* -1 = not set */
    const char *chat_template;  /* borrowed from params; NULL = the model's own */
    /* A Jinja template file, relative to the model directory and inside the
     * repository (sp_repo_config_llm_template_path); borrowed; NULL = none. */
    const char *chat_template_file;
    const char *model_file;     /* borrowed from params; NULL = find it */
    /* The key of an encrypted model file (*.gguf.enc), at most one of the two;
     * see sp_repo_config_llm_keys. Borrowed from params; NULL = not set. */
    const char *encryption_key_file; /* absolute, or relative to the model directory */
    const char *encryption_key_env;  /* an environment variable holding 64 hex characters */
    /* encryption_key_file came from a load request's config override, not
     * from config.json: it is a file name in the server's --key-dir only. */
    bool key_from_request;
    /* Speculative decoding: the repository model that drafts (its latest version's
     * file), borrowed; NULL = off. num_speculative_tokens: 0 = the default (4). */
    const char *draft_model;
    int32_t num_speculative_tokens;
    /* The KV cache type, "f32", "f16" or "q8_0" (checked here), borrowed; NULL = the
     * server's --kv-type. */
    const char *kv_cache_type;
} sp_repo_llm_t;

typedef struct sp_repo_config {
    char name[SP_REPO_NAME_MAX + 1]; /* "" when the file leaves it out */
    sp_repo_backend_t backend;       /* default llm */
    char backend_name[33];           /* as written ("llm" when absent; Triton's onnxruntime
                                      * and platform onnxruntime_onnx are "onnx") */
    int32_t max_batch_size;
    int32_t n_inputs, n_outputs;
    sp_repo_tensor_t input[SP_REPO_MAX_TENSORS];
    sp_repo_tensor_t output[SP_REPO_MAX_TENSORS];
    int32_t n_groups; /* 0 = one instance on the CPU */
    sp_repo_group_t group[SP_REPO_MAX_GROUPS];
    sp_repo_version_policy_t version_policy;
    sp_repo_batching_t dynamic_batching;
    int32_t n_params;
    sp_repo_param_t param[SP_REPO_MAX_PARAMS];
    sp_repo_llm_t llm;
    bool load_on_demand;
    bool response_cache;             /* response_cache.enable (docs/repository.md) */
    char *json;                      /* the merged config as compact JSON (heap), for backends */
} sp_repo_config_t;

/* Validate a parsed config.json object into *out (zeroed first; free with
 * sp_repo_config_free even on error). `file` labels every error message. */
sp_status_t sp_repo_config_from_json(const json_t *root, const char *file, sp_repo_config_t *out,
                                     char *err, size_t err_len);

/* Parse JSON text (at most SP_REPO_CONFIG_MAX bytes, duplicate keys refused). */
sp_status_t sp_repo_config_parse_text(const char *text, size_t len, const char *file,
                                      json_t **out, char *err, size_t err_len);

/* Merge an override object over a config object, in place: each top-level key
 * of the override replaces the base's value whole, except `parameters`, which
 * is merged key by key (an override key with value null removes it). An
 * override `name` must equal the base's (when the base has one). */
sp_status_t sp_repo_config_merge(json_t *base, const json_t *override, const char *file,
                                 char *err, size_t err_len);

/* Read `path` (bounded, a regular file), merge override_json (may be NULL) and
 * validate. `label` names the file in errors (e.g. "models/llama/config.json").
 * The override is a client's (a load request): it may not set
 * encryption_key_env (a client must not probe the server's environment), and
 * its encryption_key_file must be a plain file name, looked up in the
 * server's key directory (llm.key_from_request; sp_repo_config_llm_keys_ex). */
sp_status_t sp_repo_config_load(const char *path, const char *label, const char *override_json,
                                size_t override_len, sp_repo_config_t *out, char *err,
                                size_t err_len);

void sp_repo_config_free(sp_repo_config_t *c);

/* Where the key of model `model`'s encrypted file comes from (crypto/enc.h).
 * cfg NULL (a --model model): the environment variable SAMPAN_MODEL_KEY.
 * Otherwise parameters.encryption_key_file, an absolute path used as is (keys
 * usually live outside the repository, e.g. a Kubernetes secret mount) or a
 * path relative to the model directory <root>/<model>, resolved with realpath
 * and refused when it leaves the repository (sp_repo_path_resolve); or
 * parameters.encryption_key_env; or neither (loading an encrypted file then
 * says which parameters to set). Nothing is read here: the key is read only
 * when the model file turns out to be encrypted. */
sp_status_t sp_repo_config_llm_keys(const sp_repo_config_t *cfg, const char *root,
                                    const char *model, sp_enc_key_src_t *out, char *err,
                                    size_t err_len);
/* The same with the server's key directory (--key-dir; NULL or "" = none):
 * a key file named by a load request (llm.key_from_request) is that file
 * name in key_dir, resolved with realpath and refused when it leaves it; with
 * no key_dir such a request is refused. Errors never name key_dir. */
sp_status_t sp_repo_config_llm_keys_ex(const sp_repo_config_t *cfg, const char *root,
                                       const char *model, const char *key_dir,
                                       sp_enc_key_src_t *out, char *err, size_t err_len);

/* parameters.chat_template_file resolved: <root>/<model>/FILE with realpath,
 * refused when it leaves the repository. *out "" when the parameter is unset. */
sp_status_t sp_repo_config_llm_template_path(const sp_repo_config_t *cfg, const char *root,
                                             const char *model, char *out, size_t out_len,
                                             char *err, size_t err_len);

/* Look a parameter up; NULL when absent. */
const char *sp_repo_config_param(const sp_repo_config_t *c, const char *key);

const char *sp_repo_config_dtype_name(sp_repo_dtype_t t);   /* "TYPE_FP32" */
const char *sp_repo_config_backend_name(sp_repo_backend_t b); /* "llm" */

#endif /* SP_SERVING_REPO_CONFIG_H */
