/*
 * model_config.c - GET /v2/models/{m}[/versions/{v}]/config (model_config.h).
 *
 * The config is the one the model was loaded with (its config.json or
 * config.pbtxt, a load request's override merged, Triton's backend names
 * mapped), kept as JSON text by the registry and printed through the
 * ModelConfig message, so that every field appears as Triton prints it,
 * defaults included. Runs on the HTTP loop; nothing is kept.
 */
#include "api/model_config.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"
#include "core/alloc.h"
#include "core/jbuf.h"
#include "serving/auth.h"
#include "sched/batcher.h"
#include "serving/registry.h"
#include "serving/repo_pbtxt.h"

/* Triton's auto-complete: a tensor model whose config declares no inputs (or no outputs) is
 * served with the ones its backend reported at load (the ONNX graph's, XGBoost's features), and
 * its config says so as Triton's does after auto-completing; a declared list is left as it is.
 * Returns the config JSON to print: config_json itself, or a new string (freed by the caller). */
static char *
autocomplete(const sp_served_model_t *m, bool *fresh)
{
    *fresh = false;
    if (m->be == NULL || m->config_json == NULL) return m->config_json;
    json_t *root = json_loads(m->config_json, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return m->config_json;
    }
    bool changed = false;
    for (int io = 0; io < 2; io++) {
        const char *key = io ? "output" : "input";
        const json_t *have = json_object_get(root, key);
        const sp_backend_tensor_desc_t *d = io ? m->be_info.outputs : m->be_info.inputs;
        int32_t n = io ? m->be_info.n_outputs : m->be_info.n_inputs;
        if ((have && json_array_size(have) > 0) || n <= 0) continue;
        json_t *arr = json_array();
        for (int32_t i = 0; arr && i < n; i++) {
            char dt[32];
            const char *bt = sp_batcher_btype_name(d[i].dtype);
            snprintf(dt, sizeof dt, "TYPE_%s", strcmp(bt, "BYTES") == 0 ? "STRING" : bt);
            json_t *dims = json_array();
            for (int32_t k = 0; dims && k < d[i].n_dims; k++) json_array_append_new(dims, json_integer(d[i].dims[k]));
            json_array_append_new(arr, json_pack("{s:s,s:s,s:o}", "name", d[i].name, "data_type", dt,
                                                 "dims", dims ? dims : json_array()));
        }
        if (arr && json_object_set_new(root, key, arr) == 0) changed = true;
    }
    char *txt = changed ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (txt == NULL) return m->config_json;
    *fresh = true;
    return txt;
}

static void
h_config(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    sp_str_t name = sp_router_param(p, "model");
    sp_str_t v = sp_router_param(p, "version");
    int nl = name.len > 64 ? 64 : (int)name.len;
    if (!sp_auth_model_allowed(sp_http_req_user(r), name.ptr, name.len)) {
        sp_auth_reject(sp_http_req_user(r), SP_LIMIT_MODEL);
        sp_api_error_kserve(r, 404, "model '%.*s' is not served", nl, name.ptr);
        return;
    }
    sp_served_model_t *m = NULL;
    char reason[512], err[512];
    sp_acq_t a = sp_registry_acquire(s, name.ptr, name.len, v.ptr, v.len, false, &m, reason,
                                     sizeof reason);
    if (a == SP_ACQ_UNKNOWN) {
        sp_api_error_kserve(r, 404, "model '%.*s' is not served", nl, name.ptr);
        return;
    }
    if (a != SP_ACQ_OK) {
        sp_api_error_kserve(r, 400, "model '%.*s' is not ready: %s", nl, name.ptr,
                            a == SP_ACQ_LOADING ? "loading" : reason);
        return;
    }
    bool fresh;
    char *cj = autocomplete(m, &fresh);
    json_t *j = sp_repo_config_triton_json(cj, m->name, err, sizeof err);
    if (fresh) {
        json_free_t jf = NULL;
        json_get_alloc_funcs(NULL, &jf);
        jf(cj);
    }
    sp_served_release(m);
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (j && !txt) snprintf(err, sizeof err, "out of memory");
    json_decref(j);
    if (txt == NULL) {
        sp_api_error_kserve(r, 500, "the config cannot be printed: %s", err);
        return;
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_raw(&b, txt, strlen(txt));
    json_free_t jfree = NULL;
    json_get_alloc_funcs(NULL, &jfree);
    jfree(txt);
    if (b.oom) {
        sp_api_error_kserve(r, 500, "out of memory while writing the response");
    } else {
        sp_api_reply_json(r, 200, &b);
    }
    sp_jbuf_free(&b);
}

void
sp_model_config_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_GET, "/v2/models/{model}/config", h_config, s);
    sp_router_add(rt, SP_HTTP_GET, "/v2/models/{model}/versions/{version}/config", h_config, s);
}
