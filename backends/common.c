/*
 * backends/common.c - config.json's Triton fields for the bundled backends
 * (see common.h). Parsed with jansson, as the server does.
 */
#include "common.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* In sp_btype_t order, which is also the order of config.json's names. */
static const char *const dtype_names[SP_BT_COUNT_] = {
    "TYPE_BOOL",  "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
    "TYPE_INT8",  "TYPE_INT16", "TYPE_INT32",  "TYPE_INT64",  "TYPE_FP16",
    "TYPE_FP32",  "TYPE_FP64",  "TYPE_STRING", "TYPE_BF16",
};

const char *
sp__bk_dtype_name(sp_btype_t t)
{
    return (unsigned)t < SP_BT_COUNT_ ? dtype_names[t] : "TYPE_INVALID";
}

int
sp__bk_errf(char *err, size_t err_len, const char *fmt, ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void
sp__bk_log(const sp_backend_host_t *host, int level, const char *fmt, ...)
{
    if (host == NULL || host->log_fn == NULL) {
        return;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    host->log_fn(level, line);
}

void
sp__bk_dims_str(const int64_t *dims, int32_t n_dims, char *out, size_t out_len)
{
    size_t n = 0;
    n += (size_t)snprintf(out, out_len, "[");
    for (int32_t d = 0; d < n_dims && n < out_len; d++) {
        n += (size_t)snprintf(out + n, out_len - n, "%s%lld", d ? ", " : "", (long long)dims[d]);
    }
    if (n < out_len) {
        snprintf(out + n, out_len - n, "]");
    }
}

static int
parse_tensors(const json_t *arr, const char *key, sp_backend_tensor_desc_t *t, int32_t *n_out,
              char *err, size_t err_len)
{
    *n_out = 0;
    if (arr == NULL) {
        return 0;
    }
    if (!json_is_array(arr)) {
        return sp__bk_errf(err, err_len, "config.json %s: must be an array", key);
    }
    size_t n = json_array_size(arr);
    if (n > SP_BACKEND_MAX_TENSORS) {
        return sp__bk_errf(err, err_len, "config.json %s: more than %d entries", key,
                           SP_BACKEND_MAX_TENSORS);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(arr, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *type = json_string_value(json_object_get(e, "data_type"));
        const json_t *dims = json_object_get(e, "dims");
        if (name == NULL || !name[0] || strlen(name) >= sizeof t[i].name) {
            return sp__bk_errf(err, err_len, "config.json %s[%zu].name: a name of 1 to %zu bytes "
                               "is required", key, i, sizeof t[i].name - 1);
        }
        snprintf(t[i].name, sizeof t[i].name, "%s", name);
        int dt = -1;
        for (int k = 0; type != NULL && k < SP_BT_COUNT_; k++) {
            if (strcmp(type, dtype_names[k]) == 0) {
                dt = k;
            }
        }
        if (dt < 0) {
            return sp__bk_errf(err, err_len, "config.json %s[%zu].data_type: \"%s\" is not a "
                               "data type (TYPE_FP32, TYPE_INT64, TYPE_STRING, ...)", key, i,
                               type ? type : "(missing)");
        }
        t[i].dtype = (sp_btype_t)dt;
        if (!json_is_array(dims) || json_array_size(dims) > SP_BACKEND_MAX_DIMS) {
            return sp__bk_errf(err, err_len, "config.json %s[%zu].dims: an array of at most %d "
                               "sizes is required", key, i, SP_BACKEND_MAX_DIMS);
        }
        t[i].n_dims = (int32_t)json_array_size(dims);
        for (int32_t d = 0; d < t[i].n_dims; d++) {
            const json_t *x = json_array_get(dims, (size_t)d);
            json_int_t v = json_is_integer(x) ? json_integer_value(x) : 0;
            if (v < -1 || v == 0) {
                return sp__bk_errf(err, err_len, "config.json %s[%zu].dims[%d]: must be -1 "
                                   "(variable) or a positive size", key, i, (int)d);
            }
            t[i].dims[d] = (int64_t)v;
        }
    }
    *n_out = (int32_t)n;
    return 0;
}

int
sp__bk_config_parse(const char *config_json, sp__bk_config_t *cfg, char *err, size_t err_len)
{
    memset(cfg, 0, sizeof *cfg);
    if (config_json == NULL || config_json[0] == '\0') {
        return 0;
    }
    json_error_t je;
    json_t *root = json_loads(config_json, 0, &je);
    if (root == NULL || !json_is_object(root)) {
        json_decref(root);
        return sp__bk_errf(err, err_len, "config.json: not a JSON object (line %d: %s)",
                           je.line, je.text);
    }
    cfg->root = root;
    const json_t *mbs = json_object_get(root, "max_batch_size");
    if (mbs != NULL) {
        if (!json_is_integer(mbs) || json_integer_value(mbs) < 0 ||
            json_integer_value(mbs) > INT32_MAX) {
            sp__bk_config_free(cfg);
            return sp__bk_errf(err, err_len, "config.json max_batch_size: must be a "
                               "non-negative integer");
        }
        cfg->max_batch_size = (int32_t)json_integer_value(mbs);
    }
    if (parse_tensors(json_object_get(root, "input"), "input", cfg->inputs, &cfg->n_inputs, err,
                      err_len) ||
        parse_tensors(json_object_get(root, "output"), "output", cfg->outputs, &cfg->n_outputs,
                      err, err_len)) {
        sp__bk_config_free(cfg);
        return -1;
    }
    return 0;
}

void
sp__bk_config_free(sp__bk_config_t *cfg)
{
    json_decref((json_t *)cfg->root);
    cfg->root = NULL;
}

const char *
sp__bk_config_param(const sp__bk_config_t *cfg, const char *key)
{
    const json_t *params = json_object_get((const json_t *)cfg->root, "parameters");
    const json_t *p = json_object_get(params, key);
    return json_string_value(json_object_get(p, "string_value"));
}

const char *
sp__bk_config_unknown_param(const sp__bk_config_t *cfg, const char *const *known,
                            const char *const *prefixes)
{
    json_t *params = json_object_get((const json_t *)cfg->root, "parameters");
    const char *key;
    json_t *v;
    json_object_foreach(params, key, v) {
        bool ok = false;
        for (size_t i = 0; !ok && known[i]; i++) ok = strcmp(key, known[i]) == 0;
        for (size_t i = 0; !ok && prefixes && prefixes[i]; i++) {
            ok = strncmp(key, prefixes[i], strlen(prefixes[i])) == 0;
        }
        if (!ok) return key;
    }
    return NULL;
}
