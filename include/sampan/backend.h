/*
 * sampan/backend.h - the backend interface, ABI version 1.
 *
 * A backend serves one kind of model (config.json's "backend": "xgboost",
 * "identity", ...). The server finds it among the built-in ones or loads
 * `<backends dir>/libsampan_<name>.so` with dlopen and calls its one exported
 * symbol:
 *
 *     const sp_backend_api_t *sp_backend_init(uint32_t abi_version);
 *
 * which returns the backend's table (NULL when it cannot serve that ABI
 * version). The server then, per model version:
 *   load     - read the model from its version directory and config, say
 *              what its inputs and outputs are and how much memory it holds;
 *   execute  - run one batch: inputs are whole tensors whose first dimension
 *              is the batch (the rows of every request the dynamic batcher
 *              merged), outputs are filled with the same number of rows;
 *   unload   - free everything.
 * execute may be called from several threads at once for different model
 * instances, never concurrently for the same instance (one `void *model` per
 * instance). Backends never see HTTP, JSON requests or other models.
 *
 * This header is C11 and self-contained (no other Sampan header), so a
 * backend can be built outside the tree. docs/backends.md describes it with
 * the identity and XGBoost backends as examples.
 */
#ifndef SAMPAN_BACKEND_H
#define SAMPAN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SP_BACKEND_ABI_VERSION 1u
#define SP_BACKEND_MAX_DIMS 8
#define SP_BACKEND_MAX_TENSORS 16

/* KServe v2 data types. */
typedef enum sp_btype {
    SP_BT_BOOL = 0,
    SP_BT_UINT8,
    SP_BT_UINT16,
    SP_BT_UINT32,
    SP_BT_UINT64,
    SP_BT_INT8,
    SP_BT_INT16,
    SP_BT_INT32,
    SP_BT_INT64,
    SP_BT_FP16,
    SP_BT_FP32,
    SP_BT_FP64,
    SP_BT_BYTES, /* data: for each element a uint32 little-endian length, then the bytes */
    SP_BT_BF16,
    SP_BT_COUNT_,
} sp_btype_t;

/* A declared input or output: dims exclude the batch dimension (as in
 * Triton with max_batch_size > 0); -1 is a variable size. */
typedef struct sp_backend_tensor_desc {
    char name[64];
    sp_btype_t dtype;
    int32_t n_dims;
    int64_t dims[SP_BACKEND_MAX_DIMS];
} sp_backend_tensor_desc_t;

/* A tensor in a call: dims include the batch dimension first. */
typedef struct sp_backend_tensor {
    const char *name;
    sp_btype_t dtype;
    int32_t n_dims;
    int64_t dims[SP_BACKEND_MAX_DIMS];
    void *data;   /* row-major; inputs are read-only for the backend */
    size_t bytes; /* of data */
} sp_backend_tensor_t;

/* What the server gives a backend. */
typedef struct sp_backend_host {
    uint32_t abi_version;
    /* Memory for outputs: the server frees it with free_fn. */
    void *(*alloc_fn)(size_t bytes);
    void (*free_fn)(void *p);
    /* One log line (level 0 debug .. 3 error), key=value style, no newline. */
    void (*log_fn)(int level, const char *line);
} sp_backend_host_t;

typedef struct sp_backend_load_args {
    const char *model_name;
    int64_t version;
    const char *version_dir;  /* resolved directory of the version */
    const char *model_file;   /* resolved model file, or NULL when the backend finds its own */
    const char *config_json;  /* the model's config.json (override merged), as text */
    int32_t max_batch_size;   /* from the config: rows a batch may have (0 = no batching) */
    int32_t n_threads;        /* threads the backend may use per call (>= 1) */
} sp_backend_load_args_t;

/* What load reports. Inputs and outputs the config declares must match
 * (names, types, dims); a backend fills them from its model when the config
 * declares none. */
typedef struct sp_backend_model_info {
    int32_t n_inputs, n_outputs;
    sp_backend_tensor_desc_t inputs[SP_BACKEND_MAX_TENSORS];
    sp_backend_tensor_desc_t outputs[SP_BACKEND_MAX_TENSORS];
    uint64_t memory_bytes;    /* held by one loaded instance */
    /* GPU bytes one instance holds when the backend placed it on the GPU that config.json's
     * instance_group (KIND_GPU) names; 0 for a backend that runs on the CPU, and the server then
     * refuses KIND_GPU for it. Appended: the server zeroes info before load, so a backend built
     * before this member reports 0. */
    uint64_t device_bytes;
} sp_backend_model_info_t;

typedef struct sp_backend_api {
    uint32_t abi_version;     /* SP_BACKEND_ABI_VERSION */
    const char *name;         /* "xgboost": what config.json's "backend" names */
    /* 0 on success; else an error message in err (naming the file and what is wrong). */
    int (*load)(const sp_backend_host_t *host, const sp_backend_load_args_t *args, void **model,
                sp_backend_model_info_t *info, char *err, size_t err_len);
    /* Run a batch. inputs: every declared input, in declaration order, each with the same
     * first dimension (rows). outputs: n_outputs entries whose name is set (the ones the
     * batch's requests asked for); the backend sets dtype, n_dims, dims (first = rows), and
     * data/bytes allocated with host->alloc_fn. 0 on success; else err, and every output
     * already allocated is freed by the server. */
    int (*execute)(void *model, const sp_backend_tensor_t *inputs, int32_t n_inputs,
                   sp_backend_tensor_t *outputs, int32_t n_outputs, char *err, size_t err_len);
    void (*unload)(void *model);
} sp_backend_api_t;

typedef const sp_backend_api_t *(*sp_backend_init_fn)(uint32_t abi_version);
#define SP_BACKEND_INIT_SYMBOL "sp_backend_init"

/* Bytes of one element (0 for BYTES, whose elements vary). */
static inline size_t
sp_btype_size(sp_btype_t t)
{
    switch (t) {
    case SP_BT_BOOL: case SP_BT_UINT8: case SP_BT_INT8: return 1;
    case SP_BT_UINT16: case SP_BT_INT16: case SP_BT_FP16: case SP_BT_BF16: return 2;
    case SP_BT_UINT32: case SP_BT_INT32: case SP_BT_FP32: return 4;
    case SP_BT_UINT64: case SP_BT_INT64: case SP_BT_FP64: return 8;
    default: return 0;
    }
}

#ifdef __cplusplus
}
#endif

#endif /* SAMPAN_BACKEND_H */
