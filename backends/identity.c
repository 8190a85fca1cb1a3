/*
 * backends/identity.c - the identity backend: output i is a copy of input i.
 *
 * It reads nothing but config.json: the inputs it declares, and outputs
 * matched to them by position (named OUTPUT<i> when the config declares
 * none). Every data type works, BYTES included, because the copy is of the
 * bytes as the server laid them out. It exists as the front end's benchmark
 * target (the per-call work is one allocation and one memcpy per output) and
 * as the example that docs/backends.md walks through.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct identity {
    sp_backend_host_t host; /* a copy: the host's struct need not outlive load */
    int32_t n;              /* inputs = outputs */
    sp_backend_tensor_desc_t in[SP_BACKEND_MAX_TENSORS];
    sp_backend_tensor_desc_t out[SP_BACKEND_MAX_TENSORS];
} identity_t;

static int
same_dims(const sp_backend_tensor_desc_t *a, const sp_backend_tensor_desc_t *b)
{
    if (a->n_dims != b->n_dims) {
        return 0;
    }
    for (int32_t d = 0; d < a->n_dims; d++) {
        if (a->dims[d] != b->dims[d]) {
            return 0;
        }
    }
    return 1;
}

static int
identity_load(const sp_backend_host_t *host, const sp_backend_load_args_t *args, void **model,
              sp_backend_model_info_t *info, char *err, size_t err_len)
{
    *model = NULL;
    if (host == NULL || host->alloc_fn == NULL) {
        return sp__bk_errf(err, err_len, "identity: the host gave no alloc_fn");
    }
    sp__bk_config_t cfg;
    if (sp__bk_config_parse(args->config_json, &cfg, err, err_len)) {
        return -1;
    }
    int rc = -1;
    identity_t *m = NULL;
    if (cfg.n_inputs == 0) {
        sp__bk_errf(err, err_len, "config.json input: the identity backend needs at least one "
                    "declared input (its outputs copy them)");
        goto done;
    }
    if (cfg.n_outputs != 0 && cfg.n_outputs != cfg.n_inputs) {
        sp__bk_errf(err, err_len, "config.json output: %d outputs for %d inputs (the identity "
                    "backend pairs them by position)", (int)cfg.n_outputs, (int)cfg.n_inputs);
        goto done;
    }
    m = calloc(1, sizeof *m);
    if (m == NULL) {
        sp__bk_errf(err, err_len, "identity: out of memory");
        goto done;
    }
    m->host = *host;
    m->n = cfg.n_inputs;
    for (int32_t i = 0; i < m->n; i++) {
        m->in[i] = cfg.inputs[i];
        if (cfg.n_outputs == 0) {
            m->out[i] = cfg.inputs[i];
            snprintf(m->out[i].name, sizeof m->out[i].name, "OUTPUT%d", (int)i);
            continue;
        }
        m->out[i] = cfg.outputs[i];
        if (m->out[i].dtype != m->in[i].dtype) {
            sp__bk_errf(err, err_len, "config.json output[%d].data_type: %s, but input[%d] "
                        "(\"%s\") is %s and the identity backend copies it", (int)i,
                        sp__bk_dtype_name(m->out[i].dtype), (int)i, m->in[i].name,
                        sp__bk_dtype_name(m->in[i].dtype));
            goto done;
        }
        if (!same_dims(&m->out[i], &m->in[i])) {
            char a[128], b[128];
            sp__bk_dims_str(m->out[i].dims, m->out[i].n_dims, a, sizeof a);
            sp__bk_dims_str(m->in[i].dims, m->in[i].n_dims, b, sizeof b);
            sp__bk_errf(err, err_len, "config.json output[%d].dims: %s, but input[%d] (\"%s\") "
                        "has %s and the identity backend copies it", (int)i, a, (int)i,
                        m->in[i].name, b);
            goto done;
        }
    }
    memset(info, 0, sizeof *info);
    info->n_inputs = info->n_outputs = m->n;
    memcpy(info->inputs, m->in, sizeof m->in[0] * (size_t)m->n);
    memcpy(info->outputs, m->out, sizeof m->out[0] * (size_t)m->n);
    info->memory_bytes = sizeof *m;
    sp__bk_log(host, 1, "backend=identity model=%s version=%lld tensors=%d",
               args->model_name ? args->model_name : "", (long long)args->version, (int)m->n);
    *model = m;
    m = NULL;
    rc = 0;
done:
    free(m);
    sp__bk_config_free(&cfg);
    return rc;
}

static int
identity_execute(void *model, const sp_backend_tensor_t *inputs, int32_t n_inputs,
                 sp_backend_tensor_t *outputs, int32_t n_outputs, char *err, size_t err_len)
{
    const identity_t *m = model;
    if (n_inputs != m->n) {
        return sp__bk_errf(err, err_len, "identity: %d inputs given, %d declared", (int)n_inputs,
                           (int)m->n);
    }
    for (int32_t o = 0; o < n_outputs; o++) {
        sp_backend_tensor_t *out = &outputs[o];
        int32_t k = 0;
        while (k < m->n && strcmp(m->out[k].name, out->name) != 0) {
            k++;
        }
        if (k == m->n) {
            return sp__bk_errf(err, err_len, "identity: no output named \"%s\"", out->name);
        }
        const sp_backend_tensor_t *in = &inputs[k];
        if (in->dtype != m->in[k].dtype || in->n_dims < 1 || in->n_dims > SP_BACKEND_MAX_DIMS) {
            return sp__bk_errf(err, err_len, "identity: input \"%s\" is %s with %d dims, declared "
                               "%s", m->in[k].name, sp__bk_dtype_name(in->dtype), (int)in->n_dims,
                               sp__bk_dtype_name(m->in[k].dtype));
        }
        /* alloc_fn(0) may return NULL: an empty batch still gets a real pointer. */
        void *data = m->host.alloc_fn(in->bytes ? in->bytes : 1);
        if (data == NULL) {
            return sp__bk_errf(err, err_len, "identity: out of memory for %zu bytes", in->bytes);
        }
        if (in->bytes) {
            memcpy(data, in->data, in->bytes);
        }
        out->dtype = in->dtype;
        out->n_dims = in->n_dims;
        memcpy(out->dims, in->dims, sizeof in->dims[0] * (size_t)in->n_dims);
        out->data = data;
        out->bytes = in->bytes;
    }
    return 0;
}

static void
identity_unload(void *model)
{
    free(model);
}

static const sp_backend_api_t identity_api = {
    .abi_version = SP_BACKEND_ABI_VERSION,
    .name = "identity",
    .load = identity_load,
    .execute = identity_execute,
    .unload = identity_unload,
};

__attribute__((visibility("default"))) const sp_backend_api_t *
sp_backend_init(uint32_t abi_version)
{
    return abi_version == SP_BACKEND_ABI_VERSION ? &identity_api : NULL;
}
