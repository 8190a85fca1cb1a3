/*
 * repo_pbtxt.c - config.pbtxt read as inference.ModelConfig into config.json's
 * JSON, error positions, and a config back as Triton's ModelConfig
 * (repo_pbtxt.h). Threads: none. Memory: the caller owns every result.
 */
#include "serving/repo_pbtxt.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "model_config.pb-c.h"

/* Known to Triton's schema, refused with the reason (the proto leaves them out). */
static const sp_pbtxt_refusal_t refused[] = {
    {"sequence_batching", "stateful models (the sequence batcher) are not supported: Sampan's "
                          "LLM backend keeps its own per-request state"},
    {"ensemble_scheduling", "ensembles are not supported (chain the models in the client)"},
    {"optimization", "Triton's optimization settings (TensorRT, ONNX Runtime accelerators) "
                     "have no meaning in Sampan: remove the field"},
    {"model_warmup", "warm-up requests are not supported: a model is ready once loaded"},
    {"batch_input", "batch inputs are not supported"},
    {"batch_output", "batch outputs are not supported"},
    {NULL, NULL},
};

const ProtobufCMessageDescriptor *
sp_repo_model_config_descriptor(void)
{
    return &inference__model_config__descriptor;
}

sp_status_t
sp_repo_pbtxt_parse(const char *text, size_t len, const char *label, json_t **out,
                    sp_pbtxt_posmap_t *pos, char *err, size_t err_len)
{
    *out = NULL;
    if (len > SP_REPO_CONFIG_MAX) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: larger than %d bytes", label,
                       SP_REPO_CONFIG_MAX);
    }
    return sp_pbtxt_parse(text, len, &inference__model_config__descriptor, refused, label, out,
                          pos, err, err_len);
}

void
sp_repo_pbtxt_locate(const sp_pbtxt_posmap_t *pos, const char *label, char *err, size_t err_len)
{
    size_t ll = strlen(label);
    if (err == NULL || err_len == 0 || strncmp(err, label, ll) != 0 || strncmp(err + ll, ": ", 2)) {
        return;
    }
    const char *path = err + ll + 2;
    const char *end = strstr(path, ": ");
    if (end == NULL || (size_t)(end - path) >= 512) return;
    char p[512];
    memcpy(p, path, (size_t)(end - path));
    p[end - path] = '\0';
    const sp_pbtxt_pos_t *at = sp_pbtxt_posmap_find(pos, p);
    if (at == NULL) return;
    char *copy = sp_strndup(path, strlen(path));
    if (copy == NULL) return;
    snprintf(err, err_len, "%s:%d:%d: %s", label, at->line, at->col, copy);
    sp_free(copy);
}

sp_status_t
sp_repo_config_to_msg(const char *config_json, const char *name, ProtobufCMessage **out, char *err,
                      size_t err_len)
{
    *out = NULL;
    json_error_t je;
    /* A --model model has no config: it is an llm model under its name. */
    json_t *j = json_loads(config_json ? config_json : "{\"backend\": \"llm\"}", 0, &je);
    if (!j) return sp_errf(err, err_len, SP_ERR_INVALID, "config: %s", je.text);
    /* The model's name as served, when the file left it out (Triton fills it in too). */
    if (!json_object_get(j, "name") && name && name[0] &&
        json_object_set_new(j, "name", json_string(name))) {
        json_decref(j);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    /* Printed as served: the default version policy (the latest one), and an
     * instance group's count defaulting to 1 (proto3 would say 0). */
    if (!json_object_get(j, "version_policy") &&
        json_object_set_new(j, "version_policy", json_pack("{s:{s:i}}", "latest", "num_versions", 1))) {
        json_decref(j);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(j, "instance_group"), i, g) {
        if (json_is_object(g) && !json_object_get(g, "count")) {
            json_object_set_new(g, "count", json_integer(1));
        }
    }
    /* An input's preprocess object is Sampan's: ModelInput has no such field,
     * so Triton's view carries it as the parameter config.pbtxt would use
     * (image_preprocess.NAME, the image object as JSON text). */
    json_array_foreach(json_object_get(j, "input"), i, g) {
        json_t *pre = json_object_get(g, "preprocess");
        json_t *img = json_object_get(pre, "image");
        const char *in = json_string_value(json_object_get(g, "name"));
        if (img == NULL || in == NULL) {
            continue;
        }
        json_t *params = json_object_get(j, "parameters");
        if (params == NULL) {
            params = json_object();
            json_object_set_new(j, "parameters", params);
        }
        char key[300], *txt = json_dumps(img, JSON_COMPACT | JSON_SORT_KEYS);
        snprintf(key, sizeof key, "image_preprocess.%s", in);
        if (txt == NULL || params == NULL ||
            json_object_set_new(params, key, json_pack("{s:s}", "string_value", txt))) {
            if (txt) {
                json_free_t jfree = NULL;
                json_get_alloc_funcs(NULL, &jfree);
                jfree(txt);
            }
            json_decref(j);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
        json_free_t jfree = NULL;
        json_get_alloc_funcs(NULL, &jfree);
        jfree(txt);
        json_object_del(g, "preprocess");
    }
    sp_status_t st = sp_pbtxt_json_to_msg(j, &inference__model_config__descriptor, out, err, err_len);
    json_decref(j);
    return st;
}

json_t *
sp_repo_config_triton_json(const char *config_json, const char *name, char *err, size_t err_len)
{
    ProtobufCMessage *m = NULL;
    if (sp_repo_config_to_msg(config_json, name, &m, err, err_len) != SP_OK) return NULL;
    json_t *j = sp_pbtxt_msg_to_json(m);
    sp_pbtxt_msg_free(m);
    if (!j) sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    return j;
}
