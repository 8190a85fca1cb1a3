/*
 * grpc_msg.c - protobuf messages of the KServe v2 gRPC service to and from
 * the REST routes (grpc_msg.h says why the REST routes serve gRPC).
 *
 * Requests: ModelInferRequest becomes an infer request whose JSON part names
 * the tensors and whose binary tail holds their bytes (Triton's binary tensor
 * extension, which tensor.c decodes strictly), because raw_input_contents
 * already is that layout; typed contents (fp32_contents, ...) are encoded to
 * the same layout here, after checking that the field matches the datatype
 * and the element count matches the shape. Every output is asked for in the
 * binary tail, so the answer's bytes become raw_output_contents unchanged.
 * ModelStreamInfer on an LLM becomes a generate_stream body (text_input plus
 * the one-element settings), whose events become one response each.
 */
#include "api/grpc_msg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "core/jfree.h"
#include "core/alloc.h"
#include "grpc_service.pb-c.h"
#include "serving/repo_pbtxt.h"
#include "api/tensor.h"

/* ------------------------------------------------------------- methods */

static const char *const method_names[SP_GRPC_EXT_FIRST] = {
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata",
    "ModelMetadata", "ModelInfer", "ModelStreamInfer", "ModelConfig",
};

#define SERVICE_PREFIX "/inference.GRPCInferenceService/"

int
sp__grpc_msg_method_find(const char *path, size_t len)
{
    size_t pl = sizeof SERVICE_PREFIX - 1;
    if (len <= pl || memcmp(path, SERVICE_PREFIX, pl) != 0) {
        return -1;
    }
    for (int m = 0; m < SP_GRPC_EXT_FIRST; m++) {
        if (strlen(method_names[m]) == len - pl && memcmp(path + pl, method_names[m], len - pl) == 0) {
            return m;
        }
    }
    return -1;
}

const char *
sp__grpc_msg_method_name(int m)
{
    return m >= 0 && m < SP_GRPC_EXT_FIRST ? method_names[m] : "?";
}

int
sp__grpc_msg_code_of_http(int status)
{
    switch (status) {
    case 200: return SP_GRPC_OK;
    case 400: return SP_GRPC_INVALID_ARGUMENT;
    case 401: return SP_GRPC_UNAUTHENTICATED;
    case 403: return SP_GRPC_PERMISSION_DENIED;
    case 404: return SP_GRPC_NOT_FOUND;
    case 405:
    case 501: return SP_GRPC_UNIMPLEMENTED;
    case 408:
    case 504: return SP_GRPC_DEADLINE_EXCEEDED;
    case 409: return SP_GRPC_ABORTED;
    case 413:
    case 429: return SP_GRPC_RESOURCE_EXHAUSTED;
    case 499: return SP_GRPC_CANCELLED;
    case 503: return SP_GRPC_UNAVAILABLE;
    default: return status < 500 ? SP_GRPC_INVALID_ARGUMENT : SP_GRPC_INTERNAL;
    }
}

/* ------------------------------------------------------ bounded decoding */

/* protobuf-c's allocator with a budget: a message expands when decoded
 * (a 2-byte empty submessage becomes a struct of ~50 bytes, a packed bool
 * an int), so decoding may use at most DECODE_FACTOR times the message plus
 * DECODE_SLACK bytes; legitimate messages need at most about 4 times. */
#define DECODE_FACTOR 16
#define DECODE_SLACK (1u << 20)
#define ALLOC_HDR 16 /* size kept before each block; keeps malloc's alignment */

typedef struct budget {
    size_t used, cap;
    bool over;
} budget_t;

static void *
budget_alloc(void *ud, size_t n)
{
    budget_t *b = ud;
    if (n > b->cap - b->used || b->cap - b->used - n < ALLOC_HDR) {
        b->over = true;
        return NULL;
    }
    char *p = sp_malloc(n + ALLOC_HDR);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    b->used += n + ALLOC_HDR;
    return p + ALLOC_HDR;
}

static void
budget_free(void *ud, void *ptr)
{
    budget_t *b = ud;
    if (ptr == NULL) {
        return;
    }
    char *p = (char *)ptr - ALLOC_HDR;
    size_t n;
    memcpy(&n, p, sizeof n);
    b->used -= n + ALLOC_HDR;
    sp_free(p);
}

typedef struct decoder {
    budget_t b;
    ProtobufCAllocator a;
} decoder_t;

static ProtobufCMessage *
decode(decoder_t *d, const ProtobufCMessageDescriptor *desc, const uint8_t *msg, size_t len,
       int *code, char *err, size_t err_len)
{
    d->b.used = 0;
    d->b.over = false;
    d->b.cap = len > (SIZE_MAX - DECODE_SLACK) / DECODE_FACTOR ? SIZE_MAX
                                                                : len * DECODE_FACTOR + DECODE_SLACK;
    d->a.alloc = budget_alloc;
    d->a.free = budget_free;
    d->a.allocator_data = &d->b;
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, &d->a, len, msg);
    if (m == NULL) {
        if (d->b.over) {
            *code = SP_GRPC_RESOURCE_EXHAUSTED;
            snprintf(err, err_len, "the %s message (%zu bytes) needs more than %zu bytes to decode",
                     desc->short_name, len, d->b.cap);
        } else {
            *code = SP_GRPC_INVALID_ARGUMENT;
            snprintf(err, err_len, "the %s message cannot be decoded (malformed protobuf)",
                     desc->short_name);
        }
    }
    return m;
}

/* ------------------------------------------------------------- helpers */

/* A client string quoted for a message: at most 64 bytes, control bytes and
 * quotes replaced (messages travel in grpc-message and logs). */
static const char *
quote(const char *s, char buf[80])
{
    size_t n = strlen(s), k = 0;
    buf[k++] = '\'';
    for (size_t i = 0; i < n && i < 64; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[k++] = c < 0x20 || c == 0x7f || c == '\'' ? '?' : (char)c;
    }
    if (n > 64) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k++] = '\'';
    buf[k] = '\0';
    return buf;
}

bool
sp__grpc_msg_segment_ok(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f || c == '/' || c == '?' || c == '#' || c == '%' || c == '\\') {
            return false;
        }
    }
    return true;
}

static int
model_path(sp_grpc_rest_t *r, const char *name, const char *version, const char *suffix,
           char *err, size_t err_len)
{
    char q[80];
    if (name[0] == '\0') {
        snprintf(err, err_len, "name: the model name is required");
        return SP_GRPC_INVALID_ARGUMENT;
    }
    if (!sp__grpc_msg_segment_ok(name, 255)) {
        snprintf(err, err_len, "name: %s is not a model name (1 to 255 bytes, no spaces, "
                 "slashes, '?', '#' or '%%')", quote(name, q));
        return SP_GRPC_INVALID_ARGUMENT;
    }
    if (version[0] && !sp__grpc_msg_segment_ok(version, 32)) {
        snprintf(err, err_len, "version: %s is not a version", quote(version, q));
        return SP_GRPC_INVALID_ARGUMENT;
    }
    int n = version[0] ? snprintf(r->path, sizeof r->path, "/v2/models/%s/versions/%s%s", name,
                                  version, suffix)
                       : snprintf(r->path, sizeof r->path, "/v2/models/%s%s", name, suffix);
    r->path_len = n > 0 && (size_t)n < sizeof r->path ? (size_t)n : 0;
    return SP_GRPC_OK;
}

/* InferParameter as a JSON value (NULL with err set when it has none). */
static json_t *
param_json(const Inference__InferParameter *p, const char *where, char *err, size_t err_len)
{
    json_t *v = NULL;
    switch (p->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        v = json_boolean(p->bool_param);
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        v = json_integer(p->int64_param);
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        v = json_string(p->string_param);
        if (v == NULL) {
            snprintf(err, err_len, "%s: string_param must be UTF-8", where);
            return NULL;
        }
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        v = json_real(p->double_param);
        if (v == NULL) {
            snprintf(err, err_len, "%s: double_param must be finite", where);
            return NULL;
        }
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        if (p->uint64_param > (uint64_t)INT64_MAX) {
            snprintf(err, err_len, "%s: uint64_param above 2^63-1 is not supported", where);
            return NULL;
        }
        v = json_integer((json_int_t)p->uint64_param);
        break;
    default:
        snprintf(err, err_len, "%s: the parameter has no value", where);
        return NULL;
    }
    if (v == NULL) {
        snprintf(err, err_len, "out of memory");
    }
    return v;
}

typedef struct pentry {
    const char *key;
    const Inference__InferParameter *value;
} pentry_t;

/* Parameters (a protobuf map: key/value entries) into obj. The binary
 * extension's own keys are dropped: the translation sets them. */
static int
params_into(json_t *obj, size_t n, const pentry_t *e, const char *where, char *err, size_t err_len)
{
    for (size_t i = 0; i < n; i++) {
        char w[400], q[80];
        if (e[i].value == NULL || strcmp(e[i].key, "binary_data_size") == 0 ||
            strcmp(e[i].key, "binary_data_output") == 0 || strcmp(e[i].key, "binary_data") == 0) {
            continue;
        }
        snprintf(w, sizeof w, "%s[%s]", where, quote(e[i].key, q));
        json_t *v = param_json(e[i].value, w, err, err_len);
        if (v == NULL) {
            return SP_GRPC_INVALID_ARGUMENT;
        }
        if (json_object_set_new(obj, e[i].key, v) != 0) {
            snprintf(err, err_len, "%s: the key must be UTF-8", w);
            return SP_GRPC_INVALID_ARGUMENT;
        }
    }
    return SP_GRPC_OK;
}

#define PARAMS(arr, n, tmp)                                                       \
    do {                                                                          \
        for (size_t i_ = 0; i_ < (n); i_++) {                                     \
            (tmp)[i_].key = (arr)[i_]->key;                                       \
            (tmp)[i_].value = (arr)[i_]->value;                                   \
        }                                                                         \
    } while (0)

static int
params_obj(json_t *obj, size_t n, void *const *entries, int which, const char *where, char *err,
           size_t err_len)
{
    if (n == 0) {
        return SP_GRPC_OK;
    }
    pentry_t *tmp = sp_calloc(n, sizeof *tmp);
    if (tmp == NULL) {
        snprintf(err, err_len, "out of memory");
        return SP_GRPC_RESOURCE_EXHAUSTED;
    }
    /* The generated entry types differ only by name: same layout. */
    switch (which) {
    case 0: PARAMS((Inference__ModelInferRequest__ParametersEntry *const *)entries, n, tmp); break;
    case 1:
        PARAMS((Inference__ModelInferRequest__InferInputTensor__ParametersEntry *const *)entries,
               n, tmp);
        break;
    default:
        PARAMS((Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry *const *)
                   entries,
               n, tmp);
        break;
    }
    int rc = params_into(obj, n, tmp, where, err, err_len);
    sp_free(tmp);
    return rc;
}

/* Elements of a shape, or -1 (a negative dimension or an overflow). */
static int64_t
shape_count(const int64_t *shape, size_t nd)
{
    int64_t n = 1;
    for (size_t i = 0; i < nd; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && n > INT64_MAX / shape[i])) {
            return -1;
        }
        n *= shape[i];
    }
    return n;
}

static void
shape_str(const int64_t *shape, size_t nd, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < nd && i < 8 && o < cap; i++) {
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    }
    if (o < cap) {
        snprintf(buf + o, cap - o, nd > 8 ? ",...]" : "]");
    }
}

/* ------------------------------------------------------- typed contents */

/* Which InferTensorContents field holds each datatype (tensor.h's order). */
static const char *const field_of[SP_DT_COUNT] = {
    "bool_contents", "uint_contents", "uint_contents", "uint_contents", "uint64_contents",
    "int_contents", "int_contents", "int_contents", "int64_contents", NULL,
    "fp32_contents", "fp64_contents", "bytes_contents",
};

static size_t
contents_count(const Inference__InferTensorContents *c, const char *field)
{
    if (strcmp(field, "bool_contents") == 0) return c->n_bool_contents;
    if (strcmp(field, "int_contents") == 0) return c->n_int_contents;
    if (strcmp(field, "int64_contents") == 0) return c->n_int64_contents;
    if (strcmp(field, "uint_contents") == 0) return c->n_uint_contents;
    if (strcmp(field, "uint64_contents") == 0) return c->n_uint64_contents;
    if (strcmp(field, "fp32_contents") == 0) return c->n_fp32_contents;
    if (strcmp(field, "fp64_contents") == 0) return c->n_fp64_contents;
    return c->n_bytes_contents;
}

static const char *const all_fields[] = {"bool_contents", "int_contents", "int64_contents",
                                         "uint_contents", "uint64_contents", "fp32_contents",
                                         "fp64_contents", "bytes_contents"};

/* Typed contents as the raw layout (sp_malloc'ed into *out). */
static int
encode_contents(const Inference__ModelInferRequest__InferInputTensor *t, int dt, const char *where,
                uint8_t **out, size_t *out_len, char *err, size_t err_len)
{
    const Inference__InferTensorContents *c = t->contents;
    char q[80], shp[160];
    if (dt < 0) {
        snprintf(err, err_len, "%s.datatype: unknown datatype %s", where, quote(t->datatype, q));
        return SP_GRPC_INVALID_ARGUMENT;
    }
    const char *field = field_of[dt];
    if (field == NULL) {
        snprintf(err, err_len, "%s: %s data must be sent in raw_input_contents (it has no typed "
                 "contents field)", where, sp_tensor_dtype_name((sp_dtype_t)dt));
        return SP_GRPC_INVALID_ARGUMENT;
    }
    for (size_t f = 0; f < sizeof all_fields / sizeof all_fields[0]; f++) {
        if (strcmp(all_fields[f], field) != 0 && contents_count(c, all_fields[f]) > 0) {
            snprintf(err, err_len, "%s.contents: a %s tensor takes its data in %s, got %s", where,
                     sp_tensor_dtype_name((sp_dtype_t)dt), field, all_fields[f]);
            return SP_GRPC_INVALID_ARGUMENT;
        }
    }
    int64_t n = shape_count(t->shape, t->n_shape);
    shape_str(t->shape, t->n_shape, shp, sizeof shp);
    if (n < 0) {
        snprintf(err, err_len, "%s.shape: %s is not a valid shape", where, shp);
        return SP_GRPC_INVALID_ARGUMENT;
    }
    size_t have = contents_count(c, field);
    if ((uint64_t)n != have) {
        snprintf(err, err_len, "%s: the shape %s holds %lld elements, %s has %zu", where, shp,
                 (long long)n, field, have);
        return SP_GRPC_INVALID_ARGUMENT;
    }
    size_t es = sp_tensor_dtype_size((sp_dtype_t)dt);
    size_t len = 0;
    if (dt == SP_DT_BYTES) {
        for (size_t i = 0; i < have; i++) {
            if (c->bytes_contents[i].len > UINT32_MAX) {
                snprintf(err, err_len, "%s.contents.bytes_contents[%zu]: too long", where, i);
                return SP_GRPC_INVALID_ARGUMENT;
            }
            len += 4 + c->bytes_contents[i].len;
        }
    } else {
        len = have * es;
    }
    uint8_t *p = sp_malloc(len ? len : 1);
    if (p == NULL) {
        snprintf(err, err_len, "out of memory");
        return SP_GRPC_RESOURCE_EXHAUSTED;
    }
    size_t o = 0;
    for (size_t i = 0; i < have; i++) {
        int64_t iv = 0, lo = 0, hi = 0;
        bool ranged = false;
        switch (dt) {
        case SP_DT_BOOL: p[o++] = c->bool_contents[i] ? 1 : 0; break;
        case SP_DT_INT8: iv = c->int_contents[i]; lo = INT8_MIN; hi = INT8_MAX; ranged = true; break;
        case SP_DT_INT16: iv = c->int_contents[i]; lo = INT16_MIN; hi = INT16_MAX; ranged = true; break;
        case SP_DT_INT32: memcpy(p + o, &c->int_contents[i], 4); o += 4; break;
        case SP_DT_INT64: memcpy(p + o, &c->int64_contents[i], 8); o += 8; break;
        case SP_DT_UINT8: iv = c->uint_contents[i]; lo = 0; hi = UINT8_MAX; ranged = true; break;
        case SP_DT_UINT16: iv = c->uint_contents[i]; lo = 0; hi = UINT16_MAX; ranged = true; break;
        case SP_DT_UINT32: memcpy(p + o, &c->uint_contents[i], 4); o += 4; break;
        case SP_DT_UINT64: memcpy(p + o, &c->uint64_contents[i], 8); o += 8; break;
        case SP_DT_FP32: memcpy(p + o, &c->fp32_contents[i], 4); o += 4; break;
        case SP_DT_FP64: memcpy(p + o, &c->fp64_contents[i], 8); o += 8; break;
        default: { /* BYTES: 4-byte little-endian length, then the bytes */
            uint32_t l = (uint32_t)c->bytes_contents[i].len;
            uint8_t le[4] = {(uint8_t)l, (uint8_t)(l >> 8), (uint8_t)(l >> 16), (uint8_t)(l >> 24)};
            memcpy(p + o, le, 4);
            if (l) {
                memcpy(p + o + 4, c->bytes_contents[i].data, l);
            }
            o += 4 + l;
            break;
        }
        }
        if (ranged) {
            if (iv < lo || iv > hi) {
                snprintf(err, err_len, "%s.contents.%s[%zu]: %lld is out of range for %s", where,
                         field, i, (long long)iv, sp_tensor_dtype_name((sp_dtype_t)dt));
                sp_free(p);
                return SP_GRPC_INVALID_ARGUMENT;
            }
            if (es == 1) {
                p[o] = (uint8_t)iv;
            } else {
                uint16_t v16 = (uint16_t)iv;
                memcpy(p + o, &v16, 2);
            }
            o += es;
        }
    }
    *out = p;
    *out_len = len;
    return SP_GRPC_OK;
}

/* The bytes of input i, in the raw layout: borrowed from raw_input_contents,
 * or encoded from its typed contents (*owned). */
static int
input_bytes(const Inference__ModelInferRequest *q, size_t i, const char *where, const uint8_t **p,
            size_t *len, uint8_t **owned, char *err, size_t err_len)
{
    const Inference__ModelInferRequest__InferInputTensor *t = q->inputs[i];
    *owned = NULL;
    if (q->n_raw_input_contents) {
        if (t->contents) {
            snprintf(err, err_len, "%s.contents: not allowed with raw_input_contents (the data "
                     "comes either raw or typed, for all inputs)", where);
            return SP_GRPC_INVALID_ARGUMENT;
        }
        *p = q->raw_input_contents[i].data;
        *len = q->raw_input_contents[i].len;
        return SP_GRPC_OK;
    }
    if (t->contents == NULL) {
        int64_t n = shape_count(t->shape, t->n_shape);
        if (n != 0) {
            snprintf(err, err_len, "%s: no data (neither contents nor raw_input_contents)", where);
            return SP_GRPC_INVALID_ARGUMENT;
        }
        *p = (const uint8_t *)"";
        *len = 0;
        return SP_GRPC_OK;
    }
    int rc = encode_contents(t, sp_tensor_dtype_parse(t->datatype, strlen(t->datatype)), where, owned,
                             len, err, err_len);
    *p = *owned;
    return rc;
}

/* ------------------------------------------------------------ requests */

static int
check_inputs(const Inference__ModelInferRequest *q, char *err, size_t err_len)
{
    if (q->n_inputs == 0) {
        snprintf(err, err_len, "inputs: at least one input tensor is required");
        return SP_GRPC_INVALID_ARGUMENT;
    }
    if (q->n_raw_input_contents && q->n_raw_input_contents != q->n_inputs) {
        snprintf(err, err_len, "raw_input_contents: %zu entries for %zu inputs (one per input, "
                 "in order)", q->n_raw_input_contents, q->n_inputs);
        return SP_GRPC_INVALID_ARGUMENT;
    }
    return SP_GRPC_OK;
}

static void
where_of(const Inference__ModelInferRequest *q, size_t i, char *buf, size_t cap)
{
    char qn[80];
    snprintf(buf, cap, "inputs[%zu] (%s)", i, quote(q->inputs[i]->name, qn));
}

/* ModelInferRequest as an infer request: JSON part + binary tail. */
/* What every REST body made from a ModelInferRequest starts with: its id and
 * its request parameters (into params, already in root). */
static int
request_head(const Inference__ModelInferRequest *q, json_t *root, json_t *params, char *err,
             size_t err_len)
{
    if (q->id[0]) {
        json_t *id = json_string(q->id);
        if (id == NULL) {
            snprintf(err, err_len, "id: must be UTF-8");
            return SP_GRPC_INVALID_ARGUMENT;
        }
        json_object_set_new(root, "id", id);
    }
    return params_obj(params, q->n_parameters, (void *const *)q->parameters, 0, "parameters", err,
                      err_len);
}

static int
infer_body(const Inference__ModelInferRequest *q, sp_grpc_rest_t *r, char *err, size_t err_len)
{
    int rc = check_inputs(q, err, err_len);
    if (rc != SP_GRPC_OK) {
        return rc;
    }
    json_t *root = json_object(), *ins = json_array(), *params = json_object();
    const uint8_t **data = sp_calloc(q->n_inputs, sizeof *data);
    size_t *lens = sp_calloc(q->n_inputs, sizeof *lens);
    uint8_t **owned = sp_calloc(q->n_inputs, sizeof *owned);
    char *head = NULL;
    rc = SP_GRPC_RESOURCE_EXHAUSTED;
    snprintf(err, err_len, "out of memory");
    if (!root || !ins || !params || !data || !lens || !owned) {
        goto done;
    }
    json_object_set(root, "inputs", ins);
    json_object_set(root, "parameters", params);
    if ((rc = request_head(q, root, params, err, err_len)) != SP_GRPC_OK) {
        goto done;
    }
    json_object_set_new(params, "binary_data_output", json_true());
    size_t tail = 0;
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *t = q->inputs[i];
        char where[128];
        where_of(q, i, where, sizeof where);
        rc = input_bytes(q, i, where, &data[i], &lens[i], &owned[i], err, err_len);
        if (rc != SP_GRPC_OK) {
            goto done;
        }
        tail += lens[i];
        json_t *in = json_object(), *shape = json_array(), *ip = json_object();
        json_t *nm = json_string(t->name), *dt = json_string(t->datatype);
        if (!in || !shape || !ip) {
            json_decref(in), json_decref(shape), json_decref(ip), json_decref(nm), json_decref(dt);
            rc = SP_GRPC_RESOURCE_EXHAUSTED;
            snprintf(err, err_len, "out of memory");
            goto done;
        }
        json_array_append_new(ins, in);
        json_object_set_new(in, "shape", shape);
        json_object_set_new(in, "parameters", ip);
        if (nm == NULL || dt == NULL) {
            json_decref(nm), json_decref(dt);
            snprintf(err, err_len, "%s: name and datatype must be UTF-8", where);
            rc = SP_GRPC_INVALID_ARGUMENT;
            goto done;
        }
        json_object_set_new(in, "name", nm);
        json_object_set_new(in, "datatype", dt);
        for (size_t d = 0; d < t->n_shape; d++) {
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        char pw[160];
        snprintf(pw, sizeof pw, "%s.parameters", where);
        if ((rc = params_obj(ip, t->n_parameters, (void *const *)t->parameters, 1, pw, err,
                             err_len)) != SP_GRPC_OK) {
            goto done;
        }
        json_object_set_new(ip, "binary_data_size", json_integer((json_int_t)lens[i]));
    }
    if (q->n_outputs) {
        json_t *outs = json_array();
        json_object_set_new(root, "outputs", outs);
        for (size_t i = 0; i < q->n_outputs && outs; i++) {
            const Inference__ModelInferRequest__InferRequestedOutputTensor *o = q->outputs[i];
            json_t *oj = json_object(), *op = json_object(), *nm = json_string(o->name);
            if (!oj || !op || !nm) {
                json_decref(oj), json_decref(op), json_decref(nm);
                snprintf(err, err_len, "outputs[%zu].name: must be UTF-8", i);
                rc = SP_GRPC_INVALID_ARGUMENT;
                goto done;
            }
            json_array_append_new(outs, oj);
            json_object_set_new(oj, "name", nm);
            json_object_set_new(oj, "parameters", op);
            char pw[64];
            snprintf(pw, sizeof pw, "outputs[%zu].parameters", i);
            if ((rc = params_obj(op, o->n_parameters, (void *const *)o->parameters, 2, pw, err,
                                 err_len)) != SP_GRPC_OK) {
                goto done;
            }
            json_object_set_new(op, "binary_data", json_true());
        }
    }
    rc = SP_GRPC_RESOURCE_EXHAUSTED;
    snprintf(err, err_len, "out of memory");
    head = json_dumps(root, JSON_COMPACT);
    if (head == NULL) {
        goto done;
    }
    size_t hl = strlen(head);
    r->body = sp_malloc(hl + tail + 1);
    if (r->body == NULL) {
        goto done;
    }
    memcpy(r->body, head, hl);
    size_t o = hl;
    for (size_t i = 0; i < q->n_inputs; i++) {
        if (lens[i]) {
            memcpy(r->body + o, data[i], lens[i]);
        }
        o += lens[i];
    }
    r->body_len = o;
    snprintf(r->hl, sizeof r->hl, "%zu", hl);
    rc = SP_GRPC_OK;
    err[0] = '\0';
done:
    for (size_t i = 0; owned && i < q->n_inputs; i++) {
        sp_free(owned[i]);
    }
    sp_free(owned);
    sp_free(data);
    sp_free(lens);
    sp_jfree(head);
    json_decref(ins);
    json_decref(params);
    json_decref(root);
    return rc;
}

static uint32_t
le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Element e of raw data as a JSON value; NULL with err for malformed data. */
static json_t *
raw_elem(int dt, const uint8_t *p, size_t len, size_t *off, const char *where, char *err,
         size_t err_len)
{
    size_t es = dt == SP_DT_BYTES ? 4 : sp_tensor_dtype_size((sp_dtype_t)dt);
    if (len - *off < es) {
        snprintf(err, err_len, "%s: the data is shorter than its shape says", where);
        return NULL;
    }
    const uint8_t *e = p + *off;
    *off += es;
    union {
        int8_t i8; int16_t i16; int32_t i32; int64_t i64;
        uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64;
        float f; double d;
    } u;
    memcpy(&u, e, es > sizeof u ? sizeof u : es);
    switch (dt) {
    case SP_DT_BOOL: return json_boolean(e[0] != 0);
    case SP_DT_INT8: return json_integer(u.i8);
    case SP_DT_INT16: return json_integer(u.i16);
    case SP_DT_INT32: return json_integer(u.i32);
    case SP_DT_INT64: return json_integer(u.i64);
    case SP_DT_UINT8: return json_integer(u.u8);
    case SP_DT_UINT16: return json_integer(u.u16);
    case SP_DT_UINT32: return json_integer(u.u32);
    case SP_DT_UINT64: return json_integer((json_int_t)u.u64); /* seed: any 64 bits */
    case SP_DT_FP32: return isfinite(u.f) ? json_real(u.f) : json_string("nan");
    case SP_DT_FP64: return isfinite(u.d) ? json_real(u.d) : json_string("nan");
    case SP_DT_BYTES: {
        uint32_t l = le32(e);
        if (len - *off < l) {
            snprintf(err, err_len, "%s: a BYTES element's length runs past its data", where);
            return NULL;
        }
        json_t *s = json_stringn((const char *)p + *off, l);
        *off += l;
        if (s == NULL) {
            snprintf(err, err_len, "%s: text must be UTF-8", where);
        }
        return s;
    }
    default:
        snprintf(err, err_len, "%s: %s is not accepted here", where, sp_tensor_dtype_name((sp_dtype_t)dt));
        return NULL;
    }
}

/* ModelInferRequest (one prompt) as a generate_stream body for an LLM. */
static int
generate_body(const Inference__ModelInferRequest *q, sp_grpc_rest_t *r, char *err, size_t err_len)
{
    int rc = check_inputs(q, err, err_len);
    if (rc != SP_GRPC_OK) {
        return rc;
    }
    json_t *root = json_object(), *params = json_object();
    char *body = NULL;
    if (!root || !params) {
        json_decref(root);
        json_decref(params);
        snprintf(err, err_len, "out of memory");
        return SP_GRPC_RESOURCE_EXHAUSTED;
    }
    json_object_set(root, "parameters", params);
    if ((rc = request_head(q, root, params, err, err_len)) != SP_GRPC_OK) {
        goto done;
    }
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *t = q->inputs[i];
        char where[128], shp[160];
        where_of(q, i, where, sizeof where);
        int dt = sp_tensor_dtype_parse(t->datatype, strlen(t->datatype));
        if (dt < 0) {
            char qd[80];
            snprintf(err, err_len, "%s.datatype: unknown datatype %s", where, quote(t->datatype, qd));
            rc = SP_GRPC_INVALID_ARGUMENT;
            goto done;
        }
        bool text = strcmp(t->name, "text_input") == 0;
        if (text && dt != SP_DT_BYTES) {
            snprintf(err, err_len, "%s.datatype: must be BYTES, got %s", where, t->datatype);
            rc = SP_GRPC_INVALID_ARGUMENT;
            goto done;
        }
        int64_t n = shape_count(t->shape, t->n_shape);
        shape_str(t->shape, t->n_shape, shp, sizeof shp);
        if (n < 0 || (n != 1 && dt != SP_DT_BYTES) || (text && n != 1) || n > 64) {
            snprintf(err, err_len, "%s.shape: must hold exactly one element%s, the shape is %s",
                     where, text ? " (one prompt per request on ModelStreamInfer)" : "", shp);
            rc = SP_GRPC_INVALID_ARGUMENT;
            goto done;
        }
        const uint8_t *p;
        size_t len;
        uint8_t *owned;
        if ((rc = input_bytes(q, i, where, &p, &len, &owned, err, err_len)) != SP_GRPC_OK) {
            goto done;
        }
        json_t *v = n == 1 ? NULL : json_array();
        size_t off = 0;
        for (int64_t e = 0; e < n; e++) {
            json_t *x = raw_elem(dt, p, len, &off, where, err, err_len);
            if (x == NULL) {
                json_decref(v);
                v = NULL;
                break;
            }
            if (n == 1) {
                v = x;
            } else {
                json_array_append_new(v, x);
            }
        }
        if (v && off != len) {
            snprintf(err, err_len, "%s: the data holds more than the shape %s says", where, shp);
            json_decref(v);
            v = NULL;
        }
        sp_free(owned);
        if (v == NULL) {
            rc = SP_GRPC_INVALID_ARGUMENT;
            goto done;
        }
        if (json_object_set_new(root, t->name, v) != 0) {
            snprintf(err, err_len, "%s.name: must be UTF-8", where);
            rc = SP_GRPC_INVALID_ARGUMENT;
            goto done;
        }
    }
    if (json_object_get(root, "text_input") == NULL) {
        snprintf(err, err_len, "inputs: the input 'text_input' (BYTES) is required");
        rc = SP_GRPC_INVALID_ARGUMENT;
        goto done;
    }
    body = json_dumps(root, JSON_COMPACT);
    if (body == NULL || (r->body = sp_malloc(strlen(body) + 1)) == NULL) {
        snprintf(err, err_len, "out of memory");
        rc = SP_GRPC_RESOURCE_EXHAUSTED;
        goto done;
    }
    r->body_len = strlen(body);
    memcpy(r->body, body, r->body_len + 1);
    rc = SP_GRPC_OK;
done:
    sp_jfree(body);
    json_decref(params);
    json_decref(root);
    return rc;
}

/* A varint at p[*i..n); false when it is cut or longer than 10 bytes. */
static bool
wire_varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v)
{
    *v = 0;
    for (int k = 0; k < 10 && *i < n; k++) {
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7F) << (7 * k);
        if (!(b & 0x80)) {
            return true;
        }
    }
    return false;
}

/* The first top-level length-delimited field whose number is in mask (bit
 * f for field f) and whose bytes hold a NUL, or 0. Stops quietly at anything
 * malformed: decoding reports that. */
static int
string_with_nul(const uint8_t *p, size_t n, unsigned mask)
{
    size_t i = 0;
    while (mask && i < n) {
        uint64_t tag, v;
        if (!wire_varint(p, n, &i, &tag)) {
            return 0;
        }
        uint64_t field = tag >> 3;
        switch (tag & 7) {
        case 0:
            if (!wire_varint(p, n, &i, &v)) {
                return 0;
            }
            break;
        case 1:
            i += 8;
            break;
        case 5:
            i += 4;
            break;
        case 2:
            if (!wire_varint(p, n, &i, &v) || v > n - i) {
                return 0;
            }
            if (field < 32 && (mask >> field & 1u) && memchr(p + i, '\0', (size_t)v) != NULL) {
                return (int)field;
            }
            i += (size_t)v;
            break;
        default:
            return 0;
        }
    }
    return 0;
}

int
sp__grpc_msg_to_rest(int m, const uint8_t *msg, size_t len, sp_grpc_is_llm_fn is_llm, void *ud,
                 sp_grpc_rest_t *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    out->method = SP_HTTP_GET;
    err[0] = '\0';
    decoder_t d;
    int code = SP_GRPC_OK;
    const ProtobufCMessageDescriptor *desc = NULL;
    switch (m) {
    case SP_GRPC_SERVER_LIVE: desc = &inference__server_live_request__descriptor; break;
    case SP_GRPC_SERVER_READY: desc = &inference__server_ready_request__descriptor; break;
    case SP_GRPC_MODEL_READY: desc = &inference__model_ready_request__descriptor; break;
    case SP_GRPC_SERVER_METADATA: desc = &inference__server_metadata_request__descriptor; break;
    case SP_GRPC_MODEL_METADATA: desc = &inference__model_metadata_request__descriptor; break;
    case SP_GRPC_MODEL_CONFIG: desc = &inference__model_config_request__descriptor; break;
    default: desc = &inference__model_infer_request__descriptor; break;
    }
    /* protobuf-c hands strings over as C strings: a NUL inside a name would
     * silently cut it ("a\0b" naming model "a"). Refuse it instead. Fields 1
     * and 2 are the name and version of every request here with fields, 3
     * is ModelInferRequest's id. */
    static const char *const model_fields[] = {NULL, "name", "version"};
    static const char *const infer_fields[] = {NULL, "model_name", "model_version", "id"};
    bool model_q = m == SP_GRPC_MODEL_READY || m == SP_GRPC_MODEL_METADATA ||
                   m == SP_GRPC_MODEL_CONFIG;
    bool server_q = m == SP_GRPC_SERVER_LIVE || m == SP_GRPC_SERVER_READY ||
                    m == SP_GRPC_SERVER_METADATA;
    int nul_field = string_with_nul(msg, len, server_q ? 0u : model_q ? 0x6u : 0xEu);
    if (nul_field > 0) {
        snprintf(err, err_len, "%s: must not contain NUL",
                 (model_q ? model_fields : infer_fields)[nul_field]);
        return SP_GRPC_INVALID_ARGUMENT;
    }
    ProtobufCMessage *pm = decode(&d, desc, msg, len, &code, err, err_len);
    if (pm == NULL) {
        return code;
    }
    switch (m) {
    case SP_GRPC_SERVER_LIVE:
        out->kind = SP_GRPC_K_LIVE;
        out->path_len = (size_t)snprintf(out->path, sizeof out->path, "/v2/health/live");
        break;
    case SP_GRPC_SERVER_READY:
        out->kind = SP_GRPC_K_READY;
        out->path_len = (size_t)snprintf(out->path, sizeof out->path, "/v2/health/ready");
        break;
    case SP_GRPC_SERVER_METADATA:
        out->kind = SP_GRPC_K_SERVER_META;
        out->path_len = (size_t)snprintf(out->path, sizeof out->path, "/v2");
        break;
    case SP_GRPC_MODEL_READY: {
        const Inference__ModelReadyRequest *q = (const void *)pm;
        out->kind = SP_GRPC_K_MODEL_READY;
        code = model_path(out, q->name, q->version, "/ready", err, err_len);
        break;
    }
    case SP_GRPC_MODEL_METADATA: {
        const Inference__ModelMetadataRequest *q = (const void *)pm;
        out->kind = SP_GRPC_K_MODEL_META;
        code = model_path(out, q->name, q->version, "", err, err_len);
        break;
    }
    case SP_GRPC_MODEL_CONFIG: {
        const Inference__ModelConfigRequest *q = (const void *)pm;
        out->kind = SP_GRPC_K_MODEL_CONFIG;
        code = model_path(out, q->name, q->version, "/config", err, err_len);
        break;
    }
    default: {
        const Inference__ModelInferRequest *q = (const void *)pm;
        snprintf(out->id, sizeof out->id, "%s", q->id);
        bool llm = m == SP_GRPC_MODEL_STREAM_INFER && q->model_name[0] &&
                   is_llm(ud, q->model_name, strlen(q->model_name),
                          q->model_version[0] ? q->model_version : NULL, strlen(q->model_version));
        out->kind = llm ? SP_GRPC_K_GENERATE : SP_GRPC_K_INFER;
        out->method = SP_HTTP_POST;
        code = model_path(out, q->model_name, q->model_version, llm ? "/generate_stream" : "/infer",
                          err, err_len);
        if (code == SP_GRPC_OK) {
            code = llm ? generate_body(q, out, err, err_len) : infer_body(q, out, err, err_len);
        }
        break;
    }
    }
    protobuf_c_message_free_unpacked(pm, &d.a);
    if (code == SP_GRPC_OK && out->path_len == 0) {
        snprintf(err, err_len, "the model name is too long");
        code = SP_GRPC_INVALID_ARGUMENT;
    }
    if (code != SP_GRPC_OK) {
        sp__grpc_msg_rest_free(out);
    }
    return code;
}

void
sp__grpc_msg_rest_free(sp_grpc_rest_t *r)
{
    sp_free(r->body);
    r->body = NULL;
    r->body_len = 0;
}

/* ------------------------------------------------------------- replies */

/* The message packed after the 5-byte gRPC prefix (uncompressed). */
static bool
pack(const ProtobufCMessage *m, uint8_t **out, size_t *out_len)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > UINT32_MAX) {
        return false;
    }
    uint8_t *p = sp_malloc(n + 5);
    if (p == NULL) {
        return false;
    }
    p[0] = 0;
    p[1] = (uint8_t)(n >> 24);
    p[2] = (uint8_t)(n >> 16);
    p[3] = (uint8_t)(n >> 8);
    p[4] = (uint8_t)n;
    protobuf_c_message_pack(m, p + 5);
    *out = p;
    *out_len = n + 5;
    return true;
}

/* The message of a REST error body: {"error": "..."} or {"error": {"message": ...}}. */
static void
error_message(const char *body, size_t len, int status, char *err, size_t err_len)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    const json_t *e = root ? json_object_get(root, "error") : NULL;
    if (json_is_object(e)) {
        e = json_object_get(e, "message");
    }
    if (json_is_string(e)) {
        snprintf(err, err_len, "%s", json_string_value(e));
    } else {
        snprintf(err, err_len, "HTTP status %d", status);
    }
    json_decref(root);
}

/* Header `name` of a "Name: value\r\n..." block. */
static bool
header_value(const char *hdrs, size_t len, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = hdrs, *end = hdrs + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL) {
            eol = end;
        }
        if ((size_t)(eol - p) > nl + 1 && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (v < eol && *v == ' ') {
                v++;
            }
            size_t vl = (size_t)(eol - v);
            if (vl && v[vl - 1] == '\r') {
                vl--;
            }
            if (vl >= cap) {
                return false;
            }
            memcpy(out, v, vl);
            out[vl] = '\0';
            return true;
        }
        p = eol + 1;
    }
    return false;
}

/* Everything a built response owns, freed at once. */
typedef struct arena {
    void *p[1024];
    int n;
    bool oom;
} arena_t;

static void *
arena_alloc(arena_t *a, size_t n)
{
    if (a->n == (int)(sizeof a->p / sizeof a->p[0])) {
        a->oom = true;
        return NULL;
    }
    void *p = sp_calloc(1, n ? n : 1);
    if (p == NULL) {
        a->oom = true;
        return NULL;
    }
    a->p[a->n++] = p;
    return p;
}

static void
arena_free(arena_t *a)
{
    for (int i = 0; i < a->n; i++) {
        sp_free(a->p[i]);
    }
    a->n = 0;
}

static char *
arena_str(arena_t *a, const char *s)
{
    size_t n = strlen(s);
    char *p = arena_alloc(a, n + 1);
    if (p) {
        memcpy(p, s, n + 1);
    }
    return p;
}

/* A JSON value as an InferParameter (arrays and objects as their JSON text). */
static Inference__InferParameter *
param_of_json(arena_t *a, const json_t *v)
{
    Inference__InferParameter *p = arena_alloc(a, sizeof *p);
    if (p == NULL) {
        return NULL;
    }
    inference__infer_parameter__init(p);
    if (json_is_boolean(v)) {
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
        p->bool_param = json_is_true(v);
    } else if (json_is_integer(v)) {
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
        p->int64_param = json_integer_value(v);
    } else if (json_is_real(v)) {
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
        p->double_param = json_real_value(v);
    } else if (json_is_string(v)) {
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
        p->string_param = arena_str(a, json_string_value(v));
    } else {
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
        p->string_param = arena_str(a, s ? s : "null");
        sp_jfree(s);
    }
    return p->parameter_choice_case ==
                   INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM && !p->string_param
               ? NULL
               : p;
}

/* Response parameters (an object) as map entries, less `skip`. */
static Inference__ModelInferResponse__ParametersEntry **
resp_params(arena_t *a, const json_t *obj, const char *skip, size_t extra, size_t *n)
{
    size_t cap = (json_is_object(obj) ? json_object_size(obj) : 0) + extra;
    *n = 0;
    Inference__ModelInferResponse__ParametersEntry **e = arena_alloc(a, cap * sizeof *e);
    if (e == NULL || !json_is_object(obj)) {
        return e;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        if (skip && strcmp(k, skip) == 0) {
            continue;
        }
        Inference__ModelInferResponse__ParametersEntry *x = arena_alloc(a, sizeof *x);
        if (x == NULL) {
            return NULL;
        }
        inference__model_infer_response__parameters_entry__init(x);
        x->key = arena_str(a, k);
        x->value = param_of_json(a, v);
        if (x->key == NULL || x->value == NULL) {
            return NULL;
        }
        e[(*n)++] = x;
    }
    return e;
}

/* A JSON "data" array (flat or nested) in the raw layout. */
static bool
json_data_raw(arena_t *a, int dt, const json_t *data, ProtobufCBinaryData *out)
{
    /* Flatten: a small explicit stack of array iterators. */
    size_t cap = 4096, len = 0;
    uint8_t *buf = sp_malloc(cap);
    if (buf == NULL) {
        return false;
    }
    const json_t *st[SP_TENSOR_MAX_DIMS + 1];
    size_t ix[SP_TENSOR_MAX_DIMS + 1];
    int top = 0;
    st[0] = data;
    ix[0] = 0;
    bool ok = json_is_array(data);
    while (ok && top >= 0) {
        if (ix[top] >= json_array_size(st[top])) {
            top--;
            continue;
        }
        const json_t *v = json_array_get(st[top], ix[top]++);
        if (json_is_array(v)) {
            if (top + 1 > SP_TENSOR_MAX_DIMS) {
                ok = false;
                break;
            }
            st[++top] = v;
            ix[top] = 0;
            continue;
        }
        uint8_t el[8];
        size_t es = sp_tensor_dtype_size((sp_dtype_t)dt);
        const char *s = NULL;
        size_t sl = 0;
        double d = json_is_number(v) ? json_number_value(v) : 0;
        int64_t i = json_is_integer(v) ? json_integer_value(v) : (int64_t)d;
        switch (dt) {
        case SP_DT_BOOL: el[0] = json_is_true(v); break;
        case SP_DT_FP32: { float f = (float)d; memcpy(el, &f, 4); break; }
        case SP_DT_FP64: memcpy(el, &d, 8); break;
        case SP_DT_BYTES:
            s = json_is_string(v) ? json_string_value(v) : "";
            sl = json_is_string(v) ? json_string_length(v) : 0;
            es = 4;
            el[0] = (uint8_t)sl, el[1] = (uint8_t)(sl >> 8), el[2] = (uint8_t)(sl >> 16),
            el[3] = (uint8_t)(sl >> 24);
            break;
        default: memcpy(el, &i, es); break; /* little-endian: the low bytes */
        }
        while (len + es + sl > cap) {
            uint8_t *nb = sp_realloc(buf, cap * 2);
            if (nb == NULL) {
                ok = false;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        if (!ok) {
            break;
        }
        memcpy(buf + len, el, es);
        if (sl) {
            memcpy(buf + len + es, s, sl);
        }
        len += es + sl;
    }
    uint8_t *keep = ok ? arena_alloc(a, len) : NULL;
    if (keep) {
        memcpy(keep, buf, len);
        out->data = keep;
        out->len = len;
    }
    sp_free(buf);
    return keep != NULL;
}

/* An infer answer (JSON part + binary tail) as a ModelInferResponse. */
static int
infer_reply(arena_t *a, const char *hdrs, size_t hdrs_len, const char *body, size_t len,
            Inference__ModelInferResponse *resp, char *err, size_t err_len)
{
    char hv[32];
    size_t jl = len;
    if (header_value(hdrs, hdrs_len, "Inference-Header-Content-Length", hv, sizeof hv)) {
        char *end;
        unsigned long long v = strtoull(hv, &end, 10);
        if (*end || v > len) {
            snprintf(err, err_len, "the infer answer is malformed");
            return SP_GRPC_INTERNAL;
        }
        jl = (size_t)v;
    }
    json_t *root = json_loadb(body, jl, 0, NULL);
    int rc = SP_GRPC_INTERNAL;
    snprintf(err, err_len, "the infer answer is malformed");
    const json_t *outs = root ? json_object_get(root, "outputs") : NULL;
    if (!json_is_object(root) || !json_is_array(outs)) {
        goto done;
    }
    inference__model_infer_response__init(resp);
    const json_t *mn = json_object_get(root, "model_name"), *mv = json_object_get(root, "model_version"),
                 *id = json_object_get(root, "id");
    if (json_is_string(mn)) resp->model_name = arena_str(a, json_string_value(mn));
    if (json_is_string(mv)) resp->model_version = arena_str(a, json_string_value(mv));
    if (json_is_string(id)) resp->id = arena_str(a, json_string_value(id));
    resp->parameters = resp_params(a, json_object_get(root, "parameters"), NULL, 0,
                                   &resp->n_parameters);
    size_t n = json_array_size(outs);
    resp->outputs = arena_alloc(a, n * sizeof *resp->outputs);
    resp->raw_output_contents = arena_alloc(a, n * sizeof *resp->raw_output_contents);
    if (!resp->model_name || !resp->model_version || !resp->id || !resp->parameters ||
        !resp->outputs || !resp->raw_output_contents) {
        goto oom;
    }
    size_t off = jl;
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(outs, i);
        const json_t *nm = json_object_get(o, "name"), *dt = json_object_get(o, "datatype"),
                     *shape = json_object_get(o, "shape"), *op = json_object_get(o, "parameters");
        if (!json_is_string(nm) || !json_is_string(dt) || !json_is_array(shape)) {
            goto done;
        }
        Inference__ModelInferResponse__InferOutputTensor *t = arena_alloc(a, sizeof *t);
        if (t == NULL) {
            goto oom;
        }
        inference__model_infer_response__infer_output_tensor__init(t);
        resp->outputs[i] = t;
        t->name = arena_str(a, json_string_value(nm));
        t->datatype = arena_str(a, json_string_value(dt));
        t->n_shape = json_array_size(shape);
        t->shape = arena_alloc(a, t->n_shape * sizeof *t->shape);
        if (!t->name || !t->datatype || !t->shape) {
            goto oom;
        }
        for (size_t d = 0; d < t->n_shape; d++) {
            t->shape[d] = json_integer_value(json_array_get(shape, d));
        }
        /* Output parameters less binary_data_size (meaningless in gRPC). */
        size_t np;
        Inference__ModelInferResponse__ParametersEntry **pe =
            resp_params(a, op, "binary_data_size", 0, &np);
        if (pe == NULL) {
            goto oom;
        }
        t->parameters = (Inference__ModelInferResponse__InferOutputTensor__ParametersEntry **)pe;
        t->n_parameters = np;
        const json_t *bs = json_is_object(op) ? json_object_get(op, "binary_data_size") : NULL;
        if (json_is_integer(bs)) {
            json_int_t b = json_integer_value(bs);
            if (b < 0 || (size_t)b > len - off) {
                goto done;
            }
            resp->raw_output_contents[i].data = (uint8_t *)body + off; /* borrowed */
            resp->raw_output_contents[i].len = (size_t)b;
            off += (size_t)b;
        } else {
            int dti = sp_tensor_dtype_parse(json_string_value(dt), json_string_length(dt));
            if (dti < 0 || !json_data_raw(a, dti, json_object_get(o, "data"),
                                          &resp->raw_output_contents[i])) {
                goto done;
            }
        }
    }
    resp->n_outputs = n;
    resp->n_raw_output_contents = n;
    rc = SP_GRPC_OK;
    err[0] = '\0';
    goto done;
oom:
    rc = SP_GRPC_RESOURCE_EXHAUSTED;
    snprintf(err, err_len, "out of memory while writing the response");
done:
    json_decref(root);
    return rc;
}

static int
meta_reply(arena_t *a, const char *body, size_t len, Inference__ModelMetadataResponse *r)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    int rc = SP_GRPC_INTERNAL;
    inference__model_metadata_response__init(r);
    if (!json_is_object(root)) {
        goto done;
    }
    const json_t *nm = json_object_get(root, "name"), *pl = json_object_get(root, "platform"),
                 *vs = json_object_get(root, "versions");
    r->name = arena_str(a, json_is_string(nm) ? json_string_value(nm) : "");
    r->platform = arena_str(a, json_is_string(pl) ? json_string_value(pl) : "");
    r->n_versions = json_is_array(vs) ? json_array_size(vs) : 0;
    r->versions = arena_alloc(a, r->n_versions * sizeof *r->versions);
    for (size_t i = 0; r->versions && i < r->n_versions; i++) {
        const json_t *v = json_array_get(vs, i);
        r->versions[i] = arena_str(a, json_is_string(v) ? json_string_value(v) : "");
    }
    for (int io = 0; io < 2; io++) {
        const json_t *arr = json_object_get(root, io ? "outputs" : "inputs");
        size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
        Inference__ModelMetadataResponse__TensorMetadata **ts = arena_alloc(a, n * sizeof *ts);
        for (size_t i = 0; ts && i < n; i++) {
            const json_t *t = json_array_get(arr, i);
            const json_t *tn = json_object_get(t, "name"), *td = json_object_get(t, "datatype"),
                         *sh = json_object_get(t, "shape");
            Inference__ModelMetadataResponse__TensorMetadata *m = arena_alloc(a, sizeof *m);
            if (m == NULL) {
                break;
            }
            inference__model_metadata_response__tensor_metadata__init(m);
            m->name = arena_str(a, json_is_string(tn) ? json_string_value(tn) : "");
            m->datatype = arena_str(a, json_is_string(td) ? json_string_value(td) : "");
            m->n_shape = json_is_array(sh) ? json_array_size(sh) : 0;
            m->shape = arena_alloc(a, m->n_shape * sizeof *m->shape);
            for (size_t d = 0; m->shape && d < m->n_shape; d++) {
                m->shape[d] = json_integer_value(json_array_get(sh, d));
            }
            ts[i] = m;
        }
        if (io) {
            r->outputs = ts;
            r->n_outputs = n;
        } else {
            r->inputs = ts;
            r->n_inputs = n;
        }
    }
    rc = a->oom ? SP_GRPC_RESOURCE_EXHAUSTED : SP_GRPC_OK;
done:
    json_decref(root);
    return rc;
}

static int
server_meta_reply(arena_t *a, const char *body, size_t len, Inference__ServerMetadataResponse *r)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    inference__server_metadata_response__init(r);
    if (!json_is_object(root)) {
        json_decref(root);
        return SP_GRPC_INTERNAL;
    }
    const json_t *nm = json_object_get(root, "name"), *vs = json_object_get(root, "version"),
                 *ex = json_object_get(root, "extensions");
    r->name = arena_str(a, json_is_string(nm) ? json_string_value(nm) : "");
    r->version = arena_str(a, json_is_string(vs) ? json_string_value(vs) : "");
    r->n_extensions = json_is_array(ex) ? json_array_size(ex) : 0;
    r->extensions = arena_alloc(a, r->n_extensions * sizeof *r->extensions);
    for (size_t i = 0; r->extensions && i < r->n_extensions; i++) {
        const json_t *e = json_array_get(ex, i);
        r->extensions[i] = arena_str(a, json_is_string(e) ? json_string_value(e) : "");
    }
    json_decref(root);
    return a->oom ? SP_GRPC_RESOURCE_EXHAUSTED : SP_GRPC_OK;
}

/* An in-stream error: a ModelStreamInferResponse with error_message. The
 * request's id goes along (in an otherwise empty infer_response) so that a
 * client with several requests in flight knows which one failed. */
bool
sp__grpc_msg_stream_error(const char *msg, const char *id, uint8_t **out, size_t *out_len)
{
    Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    s.error_message = (char *)msg;
    if (id && id[0]) {
        r.id = (char *)id;
        s.infer_response = &r;
    }
    return pack(&s.base, out, out_len);
}

int
sp__grpc_msg_from_rest(sp_grpc_kind_t kind, bool stream, int status, const char *hdrs, size_t hdrs_len,
                   const char *body, size_t len, const char *id, uint8_t **out, size_t *out_len,
                   char *err, size_t err_len)
{
    *out = NULL;
    *out_len = 0;
    err[0] = '\0';
    /* Readiness is an answer, not an error: 503 (server) and 400 (model) say "not ready". */
    bool ready = status == 200;
    bool is_answer = status == 200 || (kind == SP_GRPC_K_READY && status == 503) ||
                     (kind == SP_GRPC_K_MODEL_READY && status == 400);
    if (!is_answer) {
        int code = sp__grpc_msg_code_of_http(status);
        error_message(body, len, status, err, err_len);
        if (stream && code != SP_GRPC_UNAUTHENTICATED) {
            return sp__grpc_msg_stream_error(err, id, out, out_len) ? SP_GRPC_OK : SP_GRPC_RESOURCE_EXHAUSTED;
        }
        return code;
    }
    arena_t *a = sp_calloc(1, sizeof *a);
    if (a == NULL) {
        snprintf(err, err_len, "out of memory");
        return SP_GRPC_RESOURCE_EXHAUSTED;
    }
    int rc = SP_GRPC_OK;
    bool ok = false;
    switch (kind) {
    case SP_GRPC_K_LIVE: {
        Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
        r.live = ready;
        ok = pack(&r.base, out, out_len);
        break;
    }
    case SP_GRPC_K_READY: {
        Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
        r.ready = ready;
        ok = pack(&r.base, out, out_len);
        break;
    }
    case SP_GRPC_K_MODEL_READY: {
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        r.ready = ready;
        ok = pack(&r.base, out, out_len);
        break;
    }
    case SP_GRPC_K_SERVER_META: {
        Inference__ServerMetadataResponse r;
        rc = server_meta_reply(a, body, len, &r);
        ok = rc == SP_GRPC_OK && pack(&r.base, out, out_len);
        break;
    }
    case SP_GRPC_K_MODEL_META: {
        Inference__ModelMetadataResponse r;
        rc = meta_reply(a, body, len, &r);
        ok = rc == SP_GRPC_OK && pack(&r.base, out, out_len);
        break;
    }
    case SP_GRPC_K_MODEL_CONFIG: {
        /* The REST answer is the ModelConfig in JSON: read back over its descriptor. */
        Inference__ModelConfigResponse r = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
        json_t *j = json_loadb(body, len, 0, NULL);
        ProtobufCMessage *cfg = NULL;
        rc = j && sp_pbtxt_json_to_msg(j, sp_repo_model_config_descriptor(), &cfg, err,
                                       err_len) == SP_OK ? SP_GRPC_OK : SP_GRPC_INTERNAL;
        json_decref(j);
        r.config = (Inference__ModelConfig *)cfg;
        ok = rc == SP_GRPC_OK && pack(&r.base, out, out_len);
        sp_pbtxt_msg_free(cfg);
        break;
    }
    default: {
        Inference__ModelInferResponse r;
        rc = infer_reply(a, hdrs, hdrs_len, body, len, &r, err, err_len);
        if (rc == SP_GRPC_OK && stream) {
            Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
            s.infer_response = &r;
            ok = pack(&s.base, out, out_len);
        } else {
            ok = rc == SP_GRPC_OK && pack(&r.base, out, out_len);
        }
        break;
    }
    }
    arena_free(a);
    sp_free(a);
    if (rc == SP_GRPC_OK && !ok) {
        rc = SP_GRPC_RESOURCE_EXHAUSTED;
    }
    if (rc != SP_GRPC_OK && err[0] == '\0') {
        snprintf(err, err_len, rc == SP_GRPC_RESOURCE_EXHAUSTED
                                   ? "out of memory while writing the response"
                                   : "the REST answer could not be translated");
    }
    return rc;
}

/* A BYTES tensor of one element as an output and its raw bytes. */
static bool
text_output(arena_t *a, Inference__ModelInferResponse__InferOutputTensor *t, ProtobufCBinaryData *raw,
            const char *name, const char *s, size_t n)
{
    inference__model_infer_response__infer_output_tensor__init(t);
    t->name = (char *)name;
    t->datatype = (char *)"BYTES";
    t->shape = arena_alloc(a, sizeof *t->shape);
    uint8_t *p = arena_alloc(a, n + 4);
    if (t->shape == NULL || p == NULL) {
        return false;
    }
    t->shape[0] = 1;
    t->n_shape = 1;
    p[0] = (uint8_t)n, p[1] = (uint8_t)(n >> 8), p[2] = (uint8_t)(n >> 16), p[3] = (uint8_t)(n >> 24);
    memcpy(p + 4, s, n);
    raw->data = p;
    raw->len = n + 4;
    return true;
}

bool
sp__grpc_msg_from_event(const char *json, size_t len, const char *id, uint8_t **out, size_t *out_len,
                    bool *final)
{
    json_t *root = json_loadb(json, len, 0, NULL);
    *final = true;
    if (!json_is_object(root)) {
        json_decref(root);
        return sp__grpc_msg_stream_error("the generate stream sent a malformed event", id, out, out_len);
    }
    const json_t *e = json_object_get(root, "error");
    if (e) {
        bool ok = sp__grpc_msg_stream_error(json_is_string(e) ? json_string_value(e) : "generation failed", id,
                               out, out_len);
        json_decref(root);
        return ok;
    }
    arena_t *a = sp_calloc(1, sizeof *a);
    if (a == NULL) {
        json_decref(root);
        return false;
    }
    const json_t *mn = json_object_get(root, "model_name"), *mv = json_object_get(root, "model_version"),
                 *rid = json_object_get(root, "id"), *text = json_object_get(root, "text_output"),
                 *fr = json_object_get(root, "finish_reason"), *usage = json_object_get(root, "usage");
    *final = json_is_string(fr);
    Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    if (json_is_string(mn)) r.model_name = arena_str(a, json_string_value(mn));
    if (json_is_string(mv)) r.model_version = arena_str(a, json_string_value(mv));
    if (json_is_string(rid)) r.id = arena_str(a, json_string_value(rid));
    r.outputs = arena_alloc(a, 2 * sizeof *r.outputs);
    r.raw_output_contents = arena_alloc(a, 2 * sizeof *r.raw_output_contents);
    Inference__ModelInferResponse__InferOutputTensor *ts = arena_alloc(a, 2 * sizeof *ts);
    bool ok = r.model_name && r.model_version && r.id && r.outputs && r.raw_output_contents && ts;
    if (ok) {
        ok = text_output(a, &ts[0], &r.raw_output_contents[0], "text_output",
                         json_is_string(text) ? json_string_value(text) : "",
                         json_is_string(text) ? json_string_length(text) : 0);
        r.outputs[0] = &ts[0];
        r.n_outputs = r.n_raw_output_contents = 1;
    }
    if (ok && *final) {
        ok = text_output(a, &ts[1], &r.raw_output_contents[1], "finish_reason",
                         json_string_value(fr), json_string_length(fr));
        r.outputs[1] = &ts[1];
        r.n_outputs = r.n_raw_output_contents = 2;
    }
    /* Triton's flag for the last response of a request, and the token counts. */
    json_t *params = json_object();
    if (params) {
        json_object_set_new(params, "triton_final_response", json_boolean(*final));
        const json_t *pt = json_object_get(usage, "prompt_tokens"),
                     *ct = json_object_get(usage, "completion_tokens");
        if (pt) json_object_set(params, "prompt_tokens", (json_t *)pt);
        if (ct) json_object_set(params, "completion_tokens", (json_t *)ct);
    }
    r.parameters = ok && params ? resp_params(a, params, NULL, 0, &r.n_parameters) : NULL;
    json_decref(params);
    ok = ok && r.parameters;
    if (ok) {
        Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
        s.infer_response = &r;
        ok = pack(&s.base, out, out_len);
    }
    arena_free(a);
    sp_free(a);
    json_decref(root);
    return ok;
}

/* ------------------------------------------------ shared with grpc_ext.c */

int
sp__grpc_msg_decoded(const ProtobufCMessageDescriptor *desc, const uint8_t *msg, size_t len,
                     unsigned nul_mask, const char *const *names, sp_grpc_decoded_fn fn, void *ud,
                     char *err, size_t err_len)
{
    int nul_field = string_with_nul(msg, len, nul_mask);
    if (nul_field > 0) {
        snprintf(err, err_len, "%s: must not contain NUL", names[nul_field]);
        return SP_GRPC_INVALID_ARGUMENT;
    }
    decoder_t d;
    int code = SP_GRPC_OK;
    ProtobufCMessage *pm = decode(&d, desc, msg, len, &code, err, err_len);
    if (pm == NULL) {
        return code;
    }
    code = fn(pm, ud, err, err_len);
    protobuf_c_message_free_unpacked(pm, &d.a);
    return code;
}

bool
sp__grpc_msg_pack(const ProtobufCMessage *m, uint8_t **out, size_t *out_len)
{
    return pack(m, out, out_len);
}

void
sp__grpc_msg_error_of(const char *body, size_t len, int status, char *err, size_t err_len)
{
    error_message(body, len, status, err, err_len);
}
