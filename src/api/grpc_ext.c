/*
 * grpc_ext.c - the gRPC methods beyond inference and metadata, served like
 * the others by the REST route that means the same (grpc_msg.h says why):
 *
 *   inference.GRPCInferenceService/ModelStatistics  GET /v2/models[/{m}[/versions/{v}]]/stats
 *   .../RepositoryIndex                             POST /v2/repository/index
 *   .../RepositoryModelLoad                         POST /v2/repository/models/{m}/load
 *   .../RepositoryModelUnload                       POST /v2/repository/models/{m}/unload
 *   grpc.health.v1.Health/Check and Watch           GET /v2/health/ready (service "" or
 *                                                   "inference.GRPCInferenceService"),
 *                                                   GET /v2/models/{service}/ready
 *
 * so the keys, scopes and tenants of the REST routes apply unchanged (the
 * repository methods need the admin scope, readiness of the server none).
 * Watch is run again by grpc.c every second; this file only says what one
 * answer is. Pure: no I/O; messages are untrusted and decoded under
 * grpc_msg.c's budget; replies are built from the REST answer's JSON.
 */
#include "api/grpc_msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "core/alloc.h"
#include "core/jfree.h"
#include "grpc_service.pb-c.h"
#include "health.pb-c.h"

static const struct {
    const char *path;
    const char *name;
    int method;
} ext_methods[] = {
    {"/inference.GRPCInferenceService/ModelStatistics", "ModelStatistics", SP_GRPC_MODEL_STATISTICS},
    {"/inference.GRPCInferenceService/RepositoryIndex", "RepositoryIndex", SP_GRPC_REPOSITORY_INDEX},
    {"/inference.GRPCInferenceService/RepositoryModelLoad", "RepositoryModelLoad",
     SP_GRPC_REPOSITORY_MODEL_LOAD},
    {"/inference.GRPCInferenceService/RepositoryModelUnload", "RepositoryModelUnload",
     SP_GRPC_REPOSITORY_MODEL_UNLOAD},
    {"/grpc.health.v1.Health/Check", "Health.Check", SP_GRPC_HEALTH_CHECK},
    {"/grpc.health.v1.Health/Watch", "Health.Watch", SP_GRPC_HEALTH_WATCH},
};
#define N_EXT (int)(sizeof ext_methods / sizeof ext_methods[0])

int
sp__grpc_ext_method_find(const char *path, size_t len)
{
    for (int i = 0; i < N_EXT; i++) {
        if (strlen(ext_methods[i].path) == len && memcmp(ext_methods[i].path, path, len) == 0) {
            return ext_methods[i].method;
        }
    }
    return -1;
}

const char *
sp__grpc_ext_method_name(int m)
{
    for (int i = 0; i < N_EXT; i++) {
        if (ext_methods[i].method == m) {
            return ext_methods[i].name;
        }
    }
    return "?";
}

/* ------------------------------------------------------------ requests */

static int
set_path(sp_grpc_rest_t *r, char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
set_path(sp_grpc_rest_t *r, char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->path, sizeof r->path, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof r->path) {
        snprintf(err, err_len, "the name is too long");
        return SP_GRPC_INVALID_ARGUMENT;
    }
    r->path_len = (size_t)n;
    return SP_GRPC_OK;
}

static int
name_arg(const char *field, const char *v, size_t max, char *err, size_t err_len)
{
    if (!sp__grpc_msg_segment_ok(v, max)) {
        snprintf(err, err_len, "%s: %s (1 to %zu bytes, no spaces, slashes, '?', '#' or '%%')",
                 field, v[0] ? "not a valid name" : "required", max);
        return SP_GRPC_INVALID_ARGUMENT;
    }
    return SP_GRPC_OK;
}

/* One server, one repository: Triton's "" means it; no other name exists. */
static int
repository_arg(const char *name, char *err, size_t err_len)
{
    if (name[0] != '\0') {
        snprintf(err, err_len, "repository_name: this server has one model repository; leave "
                 "repository_name empty");
        return SP_GRPC_NOT_FOUND;
    }
    return SP_GRPC_OK;
}

static bool
body_json(sp_grpc_rest_t *r, json_t *root)
{
    r->body = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (r->body == NULL) {
        return false;
    }
    /* jansson allocated it; the REST request owns an sp_malloc'ed copy. */
    size_t n = strlen(r->body);
    char *p = sp_malloc(n + 1);
    if (p != NULL) {
        memcpy(p, r->body, n + 1);
    }
    sp_jfree(r->body);
    r->body = p;
    r->body_len = p ? n : 0;
    return p != NULL;
}

static int
stats_req(const ProtobufCMessage *pm, void *ud, char *err, size_t err_len)
{
    const Inference__ModelStatisticsRequest *q = (const void *)pm;
    sp_grpc_rest_t *r = ud;
    r->kind = SP_GRPC_K_STATS;
    if (q->name[0] == '\0') {
        if (q->version[0] != '\0') {
            snprintf(err, err_len, "version: needs a model name");
            return SP_GRPC_INVALID_ARGUMENT;
        }
        return set_path(r, err, err_len, "/v2/models/stats");
    }
    int rc = name_arg("name", q->name, 255, err, err_len);
    if (rc == SP_GRPC_OK && q->version[0]) {
        rc = name_arg("version", q->version, 32, err, err_len);
    }
    if (rc != SP_GRPC_OK) {
        return rc;
    }
    return q->version[0] ? set_path(r, err, err_len, "/v2/models/%s/versions/%s/stats", q->name,
                                    q->version)
                         : set_path(r, err, err_len, "/v2/models/%s/stats", q->name);
}

static int
index_req(const ProtobufCMessage *pm, void *ud, char *err, size_t err_len)
{
    const Inference__RepositoryIndexRequest *q = (const void *)pm;
    sp_grpc_rest_t *r = ud;
    r->kind = SP_GRPC_K_REPO_INDEX;
    r->method = SP_HTTP_POST;
    int rc = repository_arg(q->repository_name, err, err_len);
    if (rc != SP_GRPC_OK) {
        return rc;
    }
    json_t *root = json_pack("{s:b}", "ready", q->ready ? 1 : 0);
    if (!body_json(r, root)) {
        snprintf(err, err_len, "out of memory");
        return SP_GRPC_RESOURCE_EXHAUSTED;
    }
    return set_path(r, err, err_len, "/v2/repository/index");
}

/* The common part of a repository load or unload: a POST, the repository
 * name checked, the model name one that can stand in the REST path. */
static int
repo_model_req(sp_grpc_rest_t *r, sp_grpc_kind_t kind, const char *repository, const char *model,
               char *err, size_t err_len)
{
    r->kind = kind;
    r->method = SP_HTTP_POST;
    int rc = repository_arg(repository, err, err_len);
    return rc == SP_GRPC_OK ? name_arg("model_name", model, 255, err, err_len) : rc;
}

/* The parameters of a load: "config" (a JSON configuration, as REST's
 * parameters.config) only; anything else is refused, not ignored. */
static int
load_req(const ProtobufCMessage *pm, void *ud, char *err, size_t err_len)
{
    const Inference__RepositoryModelLoadRequest *q = (const void *)pm;
    sp_grpc_rest_t *r = ud;
    int rc = repo_model_req(r, SP_GRPC_K_REPO_LOAD, q->repository_name, q->model_name, err,
                            err_len);
    if (rc != SP_GRPC_OK) {
        return rc;
    }
    json_t *params = json_object();
    for (size_t i = 0; params && i < q->n_parameters; i++) {
        const Inference__RepositoryModelLoadRequest__ParametersEntry *e = q->parameters[i];
        if (strcmp(e->key, "config") != 0) {
            snprintf(err, err_len, "parameters: '%.64s' is not supported (only \"config\", a JSON "
                     "model configuration)", e->key);
            json_decref(params);
            return SP_GRPC_INVALID_ARGUMENT;
        }
        if (e->value == NULL ||
            e->value->parameter_choice_case !=
                INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM) {
            snprintf(err, err_len, "parameters[config]: must be a string_param holding JSON");
            json_decref(params);
            return SP_GRPC_INVALID_ARGUMENT;
        }
        json_t *v = json_string(e->value->string_param);
        if (v == NULL) {
            snprintf(err, err_len, "parameters[config]: must be UTF-8");
            json_decref(params);
            return SP_GRPC_INVALID_ARGUMENT;
        }
        json_object_set_new(params, "config", v);
    }
    json_t *root = params ? json_pack("{s:o}", "parameters", params) : NULL;
    if (!body_json(r, root)) {
        snprintf(err, err_len, "out of memory");
        return SP_GRPC_RESOURCE_EXHAUSTED;
    }
    return set_path(r, err, err_len, "/v2/repository/models/%s/load", q->model_name);
}

/* An unload takes no parameters but Triton's unload_dependents: Sampan has
 * no ensembles, so no model ever has dependents and either value is met. */
static int
unload_req(const ProtobufCMessage *pm, void *ud, char *err, size_t err_len)
{
    const Inference__RepositoryModelUnloadRequest *q = (const void *)pm;
    sp_grpc_rest_t *r = ud;
    int rc = repo_model_req(r, SP_GRPC_K_REPO_UNLOAD, q->repository_name, q->model_name, err,
                            err_len);
    if (rc != SP_GRPC_OK) {
        return rc;
    }
    for (size_t i = 0; i < q->n_parameters; i++) {
        const Inference__RepositoryModelUnloadRequest__ParametersEntry *e = q->parameters[i];
        bool dep = strcmp(e->key, "unload_dependents") == 0;
        if (!dep || e->value == NULL ||
            e->value->parameter_choice_case !=
                INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM) {
            snprintf(err, err_len, dep ? "parameters[unload_dependents]: must be a bool_param"
                                       : "parameters: '%.64s' is not supported",
                     e->key);
            return SP_GRPC_INVALID_ARGUMENT;
        }
    }
    return set_path(r, err, err_len, "/v2/repository/models/%s/unload", q->model_name);
}

static int
health_req(const ProtobufCMessage *pm, void *ud, char *err, size_t err_len)
{
    const Grpc__Health__V1__HealthCheckRequest *q = (const void *)pm;
    sp_grpc_rest_t *r = ud;
    if (q->service[0] == '\0' || strcmp(q->service, "inference.GRPCInferenceService") == 0) {
        return set_path(r, err, err_len, "/v2/health/ready");
    }
    int rc = name_arg("service", q->service, 255, err, err_len);
    return rc != SP_GRPC_OK ? rc : set_path(r, err, err_len, "/v2/models/%s/ready", q->service);
}

int
sp__grpc_ext_to_rest(int m, const uint8_t *msg, size_t len, sp_grpc_rest_t *out, char *err,
                     size_t err_len)
{
    static const char *const model_names[] = {NULL, "name", "version"};
    static const char *const repo_names[] = {NULL, "repository_name", "model_name"};
    static const char *const health_names[] = {NULL, "service"};
    memset(out, 0, sizeof *out);
    out->method = SP_HTTP_GET;
    err[0] = '\0';
    int rc;
    switch (m) {
    case SP_GRPC_MODEL_STATISTICS:
        rc = sp__grpc_msg_decoded(&inference__model_statistics_request__descriptor, msg, len, 0x6u,
                                  model_names, stats_req, out, err, err_len);
        break;
    case SP_GRPC_REPOSITORY_INDEX:
        rc = sp__grpc_msg_decoded(&inference__repository_index_request__descriptor, msg, len, 0x2u,
                                  repo_names, index_req, out, err, err_len);
        break;
    case SP_GRPC_REPOSITORY_MODEL_LOAD:
        rc = sp__grpc_msg_decoded(&inference__repository_model_load_request__descriptor, msg, len,
                                  0x6u, repo_names, load_req, out, err, err_len);
        break;
    case SP_GRPC_REPOSITORY_MODEL_UNLOAD:
        rc = sp__grpc_msg_decoded(&inference__repository_model_unload_request__descriptor, msg, len,
                                  0x6u, repo_names, unload_req, out, err, err_len);
        break;
    case SP_GRPC_HEALTH_CHECK:
    case SP_GRPC_HEALTH_WATCH:
        out->kind = m == SP_GRPC_HEALTH_CHECK ? SP_GRPC_K_HEALTH : SP_GRPC_K_HEALTH_WATCH;
        rc = sp__grpc_msg_decoded(&grpc__health__v1__health_check_request__descriptor, msg, len,
                                  0x2u, health_names, health_req, out, err, err_len);
        break;
    default:
        snprintf(err, err_len, "unknown method");
        rc = SP_GRPC_UNIMPLEMENTED;
    }
    if (rc != SP_GRPC_OK) {
        sp__grpc_msg_rest_free(out);
    }
    return rc;
}

/* ------------------------------------------------------------- replies */

static uint64_t
u64_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

/* The replies' pieces, each a zeroed block, freed together after packing. */
typedef struct blocks {
    void **p;
    size_t n, cap;
    bool oom;
} blocks_t;

static void *
blk(blocks_t *b, size_t n)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        void **np = sp_realloc(b->p, cap * sizeof *np);
        if (np == NULL) {
            b->oom = true;
            return NULL;
        }
        b->p = np;
        b->cap = cap;
    }
    void *p = sp_calloc(1, n ? n : 1);
    if (p == NULL) {
        b->oom = true;
        return NULL;
    }
    b->p[b->n++] = p;
    return p;
}

static Inference__StatisticDuration *
duration(blocks_t *b, const json_t *o, const char *key)
{
    Inference__StatisticDuration *d = blk(b, sizeof *d);
    if (d == NULL) {
        return NULL;
    }
    inference__statistic_duration__init(d);
    const json_t *v = json_object_get(o, key);
    d->count = u64_of(v, "count");
    d->ns = u64_of(v, "ns");
    return d;
}

static const char *
str_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : "";
}

static bool
stats_reply(blocks_t *b, const json_t *root, uint8_t **out, size_t *out_len)
{
    const json_t *arr = json_object_get(root, "model_stats");
    size_t n = json_array_size(arr);
    Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    r.model_stats = blk(b, n * sizeof *r.model_stats);
    r.n_model_stats = n;
    for (size_t i = 0; r.model_stats && i < n; i++) {
        const json_t *j = json_array_get(arr, i);
        Inference__ModelStatistics *m = blk(b, sizeof *m);
        Inference__InferStatistics *is = blk(b, sizeof *is);
        if (m == NULL || is == NULL) {
            return false;
        }
        inference__model_statistics__init(m);
        inference__infer_statistics__init(is);
        m->name = (char *)str_of(j, "name");
        m->version = (char *)str_of(j, "version");
        m->last_inference = u64_of(j, "last_inference");
        m->inference_count = u64_of(j, "inference_count");
        m->execution_count = u64_of(j, "execution_count");
        const json_t *s = json_object_get(j, "inference_stats");
        is->success = duration(b, s, "success");
        is->fail = duration(b, s, "fail");
        is->queue = duration(b, s, "queue");
        is->compute_input = duration(b, s, "compute_input");
        is->compute_infer = duration(b, s, "compute_infer");
        is->compute_output = duration(b, s, "compute_output");
        is->cache_hit = duration(b, s, "cache_hit");
        is->cache_miss = duration(b, s, "cache_miss");
        m->inference_stats = is;
        const json_t *bs = json_object_get(j, "batch_stats");
        size_t nb = json_array_size(bs);
        m->batch_stats = blk(b, nb * sizeof *m->batch_stats);
        m->n_batch_stats = m->batch_stats ? nb : 0;
        for (size_t k = 0; k < m->n_batch_stats; k++) {
            const json_t *e = json_array_get(bs, k);
            Inference__InferBatchStatistics *x = blk(b, sizeof *x);
            if (x == NULL) {
                return false;
            }
            inference__infer_batch_statistics__init(x);
            x->batch_size = u64_of(e, "batch_size");
            x->compute_input = duration(b, e, "compute_input");
            x->compute_infer = duration(b, e, "compute_infer");
            x->compute_output = duration(b, e, "compute_output");
            m->batch_stats[k] = x;
        }
        r.model_stats[i] = m;
    }
    return !b->oom && sp__grpc_msg_pack(&r.base, out, out_len);
}

static bool
index_reply(blocks_t *b, const json_t *root, uint8_t **out, size_t *out_len)
{
    size_t n = json_array_size(root);
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    r.models = blk(b, n * sizeof *r.models);
    r.n_models = r.models ? n : 0;
    for (size_t i = 0; i < r.n_models; i++) {
        const json_t *j = json_array_get(root, i);
        Inference__RepositoryIndexResponse__ModelIndex *m = blk(b, sizeof *m);
        if (m == NULL) {
            return false;
        }
        inference__repository_index_response__model_index__init(m);
        m->name = (char *)str_of(j, "name");
        m->version = (char *)str_of(j, "version");
        m->state = (char *)str_of(j, "state");
        m->reason = (char *)str_of(j, "reason");
        r.models[i] = m;
    }
    return !b->oom && sp__grpc_msg_pack(&r.base, out, out_len);
}

int
sp__grpc_ext_from_rest(sp_grpc_kind_t kind, int status, const char *body, size_t len,
                       uint8_t **out, size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    *out_len = 0;
    if (kind == SP_GRPC_K_HEALTH || kind == SP_GRPC_K_HEALTH_WATCH) {
        Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        /* Readiness routes: 200 ready; 503 (the server) or 400 (a model)
         * not ready; 404 no such model. Anything else (a key refused) is
         * the call's error. */
        if (status == 200) {
            r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        } else if (status == 503 || status == 400) {
            r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
        } else if (status == 404) {
            if (kind == SP_GRPC_K_HEALTH) {
                snprintf(err, err_len, "unknown service: no model of that name is served");
                return SP_GRPC_NOT_FOUND;
            }
            r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
        } else {
            sp__grpc_msg_error_of(body, len, status, err, err_len);
            return sp__grpc_msg_code_of_http(status);
        }
        if (!sp__grpc_msg_pack(&r.base, out, out_len)) {
            snprintf(err, err_len, "out of memory");
            return SP_GRPC_RESOURCE_EXHAUSTED;
        }
        return SP_GRPC_OK;
    }
    bool ok;
    if (kind == SP_GRPC_K_REPO_LOAD) {
        Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
        ok = sp__grpc_msg_pack(&r.base, out, out_len);
    } else if (kind == SP_GRPC_K_REPO_UNLOAD) {
        Inference__RepositoryModelUnloadResponse r = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
        ok = sp__grpc_msg_pack(&r.base, out, out_len);
    } else {
        json_t *root = json_loadb(body, len, 0, NULL);
        blocks_t *b = sp_calloc(1, sizeof *b);
        ok = root != NULL && b != NULL &&
             (kind == SP_GRPC_K_STATS ? stats_reply(b, root, out, out_len)
                                      : index_reply(b, root, out, out_len));
        for (size_t i = 0; b && i < b->n; i++) {
            sp_free(b->p[i]);
        }
        if (b) {
            sp_free(b->p);
        }
        sp_free(b);
        json_decref(root);
        if (!ok && root == NULL) {
            snprintf(err, err_len, "the REST answer could not be translated");
            return SP_GRPC_INTERNAL;
        }
    }
    if (!ok) {
        snprintf(err, err_len, "out of memory while writing the response");
        return SP_GRPC_RESOURCE_EXHAUSTED;
    }
    return SP_GRPC_OK;
}
