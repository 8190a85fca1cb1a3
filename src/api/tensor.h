/*
 * tensor.h - typed tensors and the KServe v2 / Open Inference Protocol
 * request and response codec (JSON tensors and Triton's binary tensor data
 * extension).
 *
 * Kept apart from the routes (kserve.c) so that every backend that takes
 * tensors (the LLM's text_input today, the XGBoost backend next) gets the
 * same strict decoding: typed tensors in, typed tensors out, and no backend
 * ever sees JSON or the binary tail.
 *
 * Decoding trusts nothing: every name, datatype and shape is checked, shape
 * products are overflow-checked, the element count must match the data (a
 * flat list in row-major order, or lists nested exactly as the shape), every
 * element must fit its datatype, and every binary length is checked against
 * the body before a byte is read. A tensor's memory is bounded by the body:
 * counts are compared with the data before anything is allocated. Errors are
 * one line naming the input and the field: "inputs[1] ('x').shape: ...".
 *
 * Layout: fixed-size datatypes hold n elements in the host's (little-endian)
 * layout, BOOL as one byte 0/1, FP16 as IEEE half bits. BYTES hold an
 * sp_str_t per element pointing into the tensor's own store; each element is
 * followed by a NUL there (not counted in its length), so text elements can be
 * used as C strings when they contain no NUL.
 */
#ifndef SP_API_TENSOR_H
#define SP_API_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/str.h"
#include "sampan/status.h"
#include "core/json.h"

#define SP_TENSOR_MAX_DIMS 16
#define SP_TENSOR_MAX_NAME 256 /* bytes of a tensor name, with the NUL */
#define SP_INFER_MAX_TENSORS 64 /* inputs, or requested outputs, per request */

typedef enum sp_dtype {
    SP_DT_BOOL,
    SP_DT_UINT8,
    SP_DT_UINT16,
    SP_DT_UINT32,
    SP_DT_UINT64,
    SP_DT_INT8,
    SP_DT_INT16,
    SP_DT_INT32,
    SP_DT_INT64,
    SP_DT_FP16,
    SP_DT_FP32,
    SP_DT_FP64,
    SP_DT_BYTES,
    SP_DT_COUNT
} sp_dtype_t;

typedef struct sp_tensor {
    char name[SP_TENSOR_MAX_NAME];
    sp_dtype_t dtype;
    int ndim;
    int64_t shape[SP_TENSOR_MAX_DIMS];
    int64_t n;        /* elements: the product of the shape (1 for ndim 0) */
    void *data;       /* fixed-size: n elements; BYTES: sp_str_t[n] (owned) */
    char *store;      /* BYTES: the elements' bytes, each followed by a NUL (owned) */
    size_t store_len;
} sp_tensor_t;

/* "FP32" etc. */
const char *sp_tensor_dtype_name(sp_dtype_t t);
/* The datatype named s (exact, upper case), or -1. */
int sp_tensor_dtype_parse(const char *s, size_t len);
/* Bytes per element; 0 for BYTES. */
size_t sp_tensor_dtype_size(sp_dtype_t t);

/* A tensor of zeros (fixed-size) or empty strings (BYTES). SP_ERR_INVALID for
 * a bad shape, SP_ERR_TOO_LARGE when it would not fit in memory. */
sp_status_t sp_tensor_alloc(sp_tensor_t *t, const char *name, sp_dtype_t dt, int ndim,
                            const int64_t *shape, char *err, size_t err_len);
/* A BYTES tensor holding copies of elems (n = product of shape elements). */
sp_status_t sp_tensor_from_strs(sp_tensor_t *t, const char *name, int ndim, const int64_t *shape,
                                const sp_str_t *elems, char *err, size_t err_len);
void sp_tensor_free(sp_tensor_t *t); /* frees what it owns; the struct is zeroed */
/* Element i of a numeric or BOOL tensor as a double / an int64 (as an int64,
 * values beyond the int64 range saturate, fractions truncate, NaN is 0). */
double sp_tensor_f64(const sp_tensor_t *t, int64_t i);
int64_t sp_tensor_i64(const sp_tensor_t *t, int64_t i);
/* Element i of a BYTES tensor. */
sp_str_t sp_tensor_str(const sp_tensor_t *t, int64_t i);

/* ---- inference requests */

#define SP_INFER_MAX_CLASSES 65536 /* parameters.classification */

typedef struct sp_infer_output {
    char name[SP_TENSOR_MAX_NAME];
    int binary; /* parameters.binary_data: -1 not given, 0, 1 */
    int32_t classification; /* parameters.classification: top K as BYTES; 0 = not asked */
} sp_infer_output_t;

typedef struct sp_tensor_req {
    json_t *root;               /* the JSON part (owned) */
    const char *id;             /* "id", NUL-terminated (in root), or NULL */
    size_t id_len;
    const json_t *params;       /* "parameters" object (in root), or NULL */
    sp_tensor_t *inputs;        /* decoded, in request order (owned) */
    int n_inputs;
    sp_infer_output_t *outputs; /* requested outputs; none: all, with default settings */
    int n_outputs;
    bool binary_output;         /* parameters.binary_data_output */
} sp_tensor_req_t;

/*
 * Decode an inference request body. header_len is the value of the
 * Inference-Header-Content-Length header (ptr NULL when absent): the JSON part
 * is that many bytes, the rest is the binary tail that inputs with
 * parameters.binary_data_size take their data from, in order; all of it must
 * be claimed. SP_ERR_INVALID with err naming the field for anything wrong.
 */
sp_status_t sp_tensor_req_parse(const char *body, size_t len, sp_str_t header_len, int max_depth,
                                sp_tensor_req_t *out, char *err, size_t err_len);
void sp_tensor_req_free(sp_tensor_req_t *r);

/* A cache of decoded JSON parts of binary-tensor requests, keyed by their
 * exact bytes (tensor.c says why). Not thread-safe: one per event loop. */
typedef struct sp_tensor_hcache sp_tensor_hcache_t;
sp_tensor_hcache_t *sp_tensor_hcache_new(void);
void sp_tensor_hcache_free(sp_tensor_hcache_t *hc);
void sp_tensor_hcache_counts(const sp_tensor_hcache_t *hc, uint64_t *hits, uint64_t *misses);
/* sp_tensor_req_parse through the cache hc (NULL: none): the same result and
 * the same errors. */
sp_status_t sp_tensor_req_parse_cached(sp_tensor_hcache_t *hc, const char *body, size_t len,
                                       sp_str_t header_len, int max_depth, sp_tensor_req_t *out,
                                       char *err, size_t err_len);
/* Input by name, or NULL. */
const sp_tensor_t *sp_tensor_req_input(const sp_tensor_req_t *r, const char *name);
/*
 * Which of a model's outputs to return: want[i] for names[i]. Without
 * requested outputs every output is wanted; a requested name that is not in
 * names is SP_ERR_INVALID ("outputs[0]: the model has no output 'x' ...").
 */
sp_status_t sp_tensor_req_select_outputs(const sp_tensor_req_t *r, const char *const *names,
                                         int n_names, bool *want, char *err, size_t err_len);
/* SP_ERR_INVALID naming the first output that asks for parameters.classification
 * (for models whose outputs are text, not scores). */
sp_status_t sp_tensor_req_no_classification(const sp_tensor_req_t *r, char *err, size_t err_len);
/* Whether output `name` goes to the binary tail (its binary_data, else the
 * request's binary_data_output). */
bool sp_tensor_req_output_binary(const sp_tensor_req_t *r, const char *name);

/*
 * Write an inference response: the JSON part to json and the binary tail (the
 * outputs sp_tensor_req_output_binary selects, in order) to bin. id and
 * params_json (a JSON object's text for "parameters") may be NULL. The
 * caller answers json + bin with Inference-Header-Content-Length = json->len
 * when bin is not empty.
 */
void sp_tensor_resp_write(sp_jbuf_t *json, sp_jbuf_t *bin, const char *model, const char *version,
                          const sp_tensor_req_t *req, const char *params_json,
                          const sp_tensor_t *outs, int n_outs);

#endif /* SP_API_TENSOR_H */
