/*
 * backends/onnx/gpu.c - the ONNX plugin's GPU path (gpu.h): placement from
 * config.json, the executor library opened at run time, the prepared graph
 * lowered to the flat description of gpu_api.h, batches run through it.
 *
 * Placement follows Triton: a model whose instance groups are all KIND_GPU
 * runs on the GPU; KIND_CPU and KIND_AUTO run on the CPU (AUTO stays on the
 * CPU so that adding a GPU to a host never changes a model silently). One
 * GPU per model: the backend ABI does not say which instance a load is for.
 * Library: $SAMPAN_ONNX_CUDA_LIB when set (empty: the GPU path is off), else
 * libsampan_onnx_cuda.so next to this plugin or one folder up (where `make
 * cuda` puts it), else the dynamic linker's search.
 * Lowering reads every attribute here, so the library needs neither
 * protobuf nor ox.h; an operator it lacks is a load error naming the node.
 */
#include <dlfcn.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "gpu_api.h"

struct sp_ox_gpu {
    void *dl;
    const sp_oxg_api_t *api;
    void *exec;
    char lib[1024];
};

int
sp_ox_gpu_config(const sp__bk_config_t *cfg, sp_ox_gpu_cfg_t *gc, char *err, size_t err_len)
{
    memset(gc, 0, sizeof *gc);
    const json_t *groups = json_object_get((const json_t *)cfg->root, "instance_group");
    size_t n_gpu = 0, n_other = 0, i;
    const json_t *grp;
    json_array_foreach(groups, i, grp) {
        const char *kind = json_string_value(json_object_get(grp, "kind"));
        if (kind && strcmp(kind, "KIND_GPU") == 0) {
            n_gpu++;
            const json_t *gpus = json_object_get(grp, "gpus");
            size_t k;
            const json_t *ord;
            json_array_foreach(gpus, k, ord) {
                int32_t d = (int32_t)json_integer_value(ord);
                if (gc->on && d != gc->device) {
                    return sp__bk_errf(err, err_len, "instance_group: an ONNX model on several GPUs "
                                       "(%d and %d) is not supported; give it one", (int)gc->device, (int)d);
                }
                gc->device = d;
                gc->on = true;
            }
            gc->on = true;
        } else {
            n_other++;
        }
    }
    if (n_gpu && n_other) {
        return sp__bk_errf(err, err_len, "instance_group: an ONNX model on both KIND_GPU and "
                           "KIND_CPU/KIND_AUTO is not supported; place it on one");
    }
    const char *prec = sp__bk_config_param(cfg, "precision");
    if (gc->on && prec) {
        if (strcmp(prec, "fp16") == 0) gc->fp16 = true;
        else if (strcmp(prec, "fp32") != 0) {
            return sp__bk_errf(err, err_len, "parameters.precision \"%s\": the GPU runs \"fp32\" or "
                               "\"fp16\"", prec);
        }
    }
    return 0;
}

static int
open_lib(sp_ox_gpu_t *gpu, int32_t device, char *err, size_t err_len)
{
    const char *env = getenv("SAMPAN_ONNX_CUDA_LIB");
    char cand[3][1024];
    int n = 0;
    if (env) {
        if (env[0] == 0) return sp__bk_errf(err, err_len, "GPU backend off (SAMPAN_ONNX_CUDA_LIB is empty)");
        snprintf(cand[n++], sizeof cand[0], "%s", env);
    } else {
        Dl_info info;
        if (dladdr((void *)sp_ox_gpu_config, &info) && info.dli_fname) {
            const char *slash = strrchr(info.dli_fname, '/');
            int len = slash ? (int)(slash - info.dli_fname) : 1;
            const char *dir = slash ? info.dli_fname : ".";
            snprintf(cand[n++], sizeof cand[0], "%.*s/libsampan_onnx_cuda.so", len, dir);
            snprintf(cand[n++], sizeof cand[0], "%.*s/../libsampan_onnx_cuda.so", len, dir);
        }
        snprintf(cand[n++], sizeof cand[0], "libsampan_onnx_cuda.so");
    }
    char why[512] = "";
    for (int i = 0; i < n && gpu->dl == NULL; i++) {
        gpu->dl = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (gpu->dl) snprintf(gpu->lib, sizeof gpu->lib, "%s", cand[i]);
        else if (i == 0 || env == NULL) snprintf(why, sizeof why, "%s", dlerror());
    }
    if (gpu->dl == NULL) {
        return sp__bk_errf(err, err_len, "GPU backend unavailable: cannot load libsampan_onnx_cuda.so "
                           "(build it with `make cuda`, or set SAMPAN_ONNX_CUDA_LIB): %s", why);
    }
    sp_oxg_get_api_fn get = (sp_oxg_get_api_fn)(uintptr_t)dlsym(gpu->dl, "sp_oxg_get_api");
    gpu->api = get ? get(SP_OXG_ABI_VERSION) : NULL;
    if (gpu->api == NULL || gpu->api->struct_size < sizeof(sp_oxg_api_t)) {
        return sp__bk_errf(err, err_len, "GPU backend unavailable: %s: %s", gpu->lib,
                           get ? "another ABI version than this plugin's" : "no sp_oxg_get_api symbol");
    }
    char perr[512] = "";
    if (gpu->api->probe(device, perr, sizeof perr)) {
        return sp__bk_errf(err, err_len, "GPU backend unavailable: %s", perr);
    }
    return 0;
}

/* ---- lowering ---- */

static int
lower_fail(const sp_ox_node_t *n, char *err, size_t err_len, const char *what)
{
    return sp__bk_errf(err, err_len, "%s: %s on the GPU (KIND_GPU); place the model KIND_CPU", n->label, what);
}

/* An integer list attribute into i[at..] (count checked). */
static int
ints_into(const sp_ox_node_t *n, const char *name, int64_t *dst, size_t want, int64_t def, char *err, size_t err_len)
{
    size_t c;
    const int64_t *a = sp_ox_attr_ints(n, name, &c);
    if (a && c != want) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s of %zu values (2-D windows only)", name, c);
        return lower_fail(n, err, err_len, msg);
    }
    for (size_t k = 0; k < want; k++) dst[k] = a ? a[k] : def;
    return 0;
}

static int
auto_pad_code(const sp_ox_node_t *n, int64_t *code, char *err, size_t err_len)
{
    const char *ap = sp_ox_attr_s(n, "auto_pad", "NOTSET");
    *code = strcmp(ap, "NOTSET") == 0 ? 0 : strcmp(ap, "VALID") == 0 ? 1 : strcmp(ap, "SAME_UPPER") == 0 ? 2
          : strcmp(ap, "SAME_LOWER") == 0 ? 3 : -1;
    return *code < 0 ? lower_fail(n, err, err_len, "this auto_pad is not supported") : 0;
}

/* A list of axes: an attribute before from_opset, else the constant input idx (or none). */
static int
axes_into(const sp_ox_graph_t *g, const sp_ox_node_t *n, int64_t from_opset, int idx, sp_oxg_node_t *d,
          char *err, size_t err_len)
{
    const int64_t *a = NULL;
    int64_t c = 0;
    int64_t tmp[SP_OXG_MAX_DIMS];
    if (n->opset < from_opset) {
        size_t cc;
        a = sp_ox_attr_ints(n, "axes", &cc);
        c = (int64_t)cc;
    } else if (n->n_in > idx && n->in[idx] >= 0) {
        const sp_ox_value_t *v = &g->values[n->in[idx]];
        if (!v->is_const) return lower_fail(n, err, err_len, "axes computed at run time are not supported");
        c = sp_ox_numel(&v->t);
        if (c > SP_OXG_MAX_DIMS) return lower_fail(n, err, err_len, "too many axes");
        for (int64_t k = 0; k < c; k++) {
            tmp[k] = v->t.dtype == OX_INT64 ? ((const int64_t *)v->t.data)[k]
                   : v->t.dtype == OX_INT32 ? ((const int32_t *)v->t.data)[k] : 0;
        }
        if (v->t.dtype != OX_INT64 && v->t.dtype != OX_INT32) return lower_fail(n, err, err_len, "axes not integer");
        a = tmp;
    }
    if (c > SP_OXG_MAX_DIMS) return lower_fail(n, err, err_len, "too many axes");
    d->i[0] = c;
    for (int64_t k = 0; k < c; k++) d->i[1 + k] = a[k];
    d->n_in = 1;
    return 0;
}

static const struct {
    const char *name;
    int sub;
} UNARY[] = {
    {"Relu", SP_OXG_RELU}, {"Sigmoid", SP_OXG_SIGMOID}, {"Tanh", SP_OXG_TANH}, {"Gelu", SP_OXG_GELU},
    {"Erf", SP_OXG_ERF}, {"Clip", SP_OXG_CLIP}, {"HardSwish", SP_OXG_HARDSWISH},
    {"LeakyRelu", SP_OXG_LEAKYRELU}, {"HardSigmoid", SP_OXG_HARDSIGMOID}, {"Sqrt", SP_OXG_SQRT},
    {"Exp", SP_OXG_EXP}, {"Log", SP_OXG_LOG}, {"Neg", SP_OXG_NEG}, {"Abs", SP_OXG_ABS},
    {"Reciprocal", SP_OXG_RECIP}, {"Identity", SP_OXG_IDENTITY},
}, BINARY[] = {
    {"Add", SP_OXG_ADD}, {"Sub", SP_OXG_SUB}, {"Mul", SP_OXG_MUL}, {"Div", SP_OXG_DIV}, {"Pow", SP_OXG_POW},
}, REDUCE[] = {
    {"ReduceSum", SP_OXG_RSUM}, {"ReduceMean", SP_OXG_RMEAN}, {"ReduceMax", SP_OXG_RMAX},
};

static int
lower_node(const sp_ox_graph_t *g, const sp_ox_node_t *n, sp_oxg_node_t *d, char *err, size_t err_len)
{
    const char *t = n->op->name;
    memset(d, 0, sizeof *d);
    d->n_in = n->n_in;
    d->n_out = n->n_out;
    memcpy(d->in, n->in, sizeof d->in);
    memcpy(d->out, n->out, sizeof d->out);
    d->relu = n->fused_relu;
    d->bias = n->fused_bias;
    d->label = n->label;
    if ((n->fused_relu || n->fused_bias >= 0) && strcmp(t, "Conv") && strcmp(t, "Gemm") && strcmp(t, "MatMul")) {
        return lower_fail(n, err, err_len, "a fusion the executor does not know");
    }
    for (size_t k = 0; k < sizeof UNARY / sizeof UNARY[0]; k++) {
        if (strcmp(t, UNARY[k].name)) continue;
        d->op = SP_OXG_UNARY;
        d->sub = UNARY[k].sub;
        d->n_in = 1;
        if (d->sub == SP_OXG_GELU) d->f[0] = strcmp(sp_ox_attr_s(n, "approximate", "none"), "tanh") == 0;
        if (d->sub == SP_OXG_LEAKYRELU) d->f[0] = sp_ox_attr_f(n, "alpha", 0.01f);
        if (d->sub == SP_OXG_HARDSIGMOID) {
            d->f[0] = sp_ox_attr_f(n, "alpha", 0.2f);
            d->f[1] = sp_ox_attr_f(n, "beta", 0.5f);
        }
        if (d->sub == SP_OXG_CLIP) {
            d->f[0] = -INFINITY;
            d->f[1] = INFINITY;
            if (n->opset < 11) {
                d->f[0] = sp_ox_attr_f(n, "min", -INFINITY);
                d->f[1] = sp_ox_attr_f(n, "max", INFINITY);
            }
            for (int k2 = 1; n->opset >= 11 && k2 < n->n_in && k2 < 3; k2++) {
                if (n->in[k2] < 0) continue;
                const sp_ox_value_t *v = &g->values[n->in[k2]];
                if (!v->is_const || v->t.dtype != OX_FLOAT || sp_ox_numel(&v->t) != 1) {
                    return lower_fail(n, err, err_len, "Clip bounds that are not constant FLOAT scalars");
                }
                d->f[k2 - 1] = ((const float *)v->t.data)[0];
            }
        }
        return 0;
    }
    for (size_t k = 0; k < sizeof BINARY / sizeof BINARY[0]; k++) {
        if (strcmp(t, BINARY[k].name) == 0) {
            d->op = SP_OXG_BINARY;
            d->sub = BINARY[k].sub;
            return 0;
        }
    }
    for (size_t k = 0; k < sizeof REDUCE / sizeof REDUCE[0]; k++) {
        if (strcmp(t, REDUCE[k].name)) continue;
        d->op = SP_OXG_REDUCE;
        d->sub = REDUCE[k].sub;
        if (axes_into(g, n, d->sub == SP_OXG_RSUM ? 13 : 18, 1, d, err, err_len)) return -1;
        if (d->i[0] == 0 && sp_ox_attr_i(n, "noop_with_empty_axes", 0)) {
            return lower_fail(n, err, err_len, "noop_with_empty_axes is not supported");
        }
        d->i[9] = sp_ox_attr_i(n, "keepdims", 1) != 0;
        return 0;
    }
    if (strcmp(t, "Conv") == 0) {
        d->op = SP_OXG_CONV;
        if (ints_into(n, "pads", &d->i[0], 4, 0, err, err_len) || ints_into(n, "strides", &d->i[4], 2, 1, err, err_len) ||
            ints_into(n, "dilations", &d->i[6], 2, 1, err, err_len) || auto_pad_code(n, &d->i[9], err, err_len)) return -1;
        d->i[8] = sp_ox_attr_i(n, "group", 1);
        return 0;
    }
    if (strcmp(t, "MaxPool") == 0 || strcmp(t, "AveragePool") == 0) {
        d->op = SP_OXG_POOL;
        d->sub = t[0] == 'A';
        size_t c;
        sp_ox_attr_ints(n, "kernel_shape", &c);
        if (c != 2) return lower_fail(n, err, err_len, "pooling windows other than 2-D are not supported");
        if (ints_into(n, "kernel_shape", &d->i[0], 2, 1, err, err_len) || ints_into(n, "pads", &d->i[2], 4, 0, err, err_len) ||
            ints_into(n, "strides", &d->i[6], 2, 1, err, err_len) || ints_into(n, "dilations", &d->i[10], 2, 1, err, err_len) ||
            auto_pad_code(n, &d->i[12], err, err_len)) return -1;
        d->i[8] = sp_ox_attr_i(n, "ceil_mode", 0) != 0;
        d->i[9] = sp_ox_attr_i(n, "count_include_pad", 0) != 0;
        return 0;
    }
    if (strcmp(t, "GlobalAveragePool") == 0 || strcmp(t, "GlobalMaxPool") == 0) {
        d->op = SP_OXG_GLOBAL_POOL;
        d->sub = t[6] == 'A';
        return 0;
    }
    if (strcmp(t, "BatchNormalization") == 0) {
        d->op = SP_OXG_BATCHNORM;
        d->f[0] = sp_ox_attr_f(n, "epsilon", 1e-5f);
        if (sp_ox_attr_i(n, "training_mode", 0)) return lower_fail(n, err, err_len, "training_mode is not supported");
        return 0;
    }
    if (strcmp(t, "Gemm") == 0) {
        d->op = SP_OXG_GEMM;
        d->i[0] = sp_ox_attr_i(n, "transA", 0) != 0;
        d->i[1] = sp_ox_attr_i(n, "transB", 0) != 0;
        d->f[0] = sp_ox_attr_f(n, "alpha", 1.0f);
        d->f[1] = sp_ox_attr_f(n, "beta", 1.0f);
        return 0;
    }
    if (strcmp(t, "MatMul") == 0) {
        d->op = SP_OXG_MATMUL;
        return 0;
    }
    if (strcmp(t, "Reshape") == 0) {
        d->op = SP_OXG_VIEW;
        d->sub = SP_OXG_RESHAPE;
        d->n_in = 1;
        const sp_ox_value_t *v = n->n_in > 1 && n->in[1] >= 0 ? &g->values[n->in[1]] : NULL;
        if (v == NULL || !v->is_const || v->t.dtype != OX_INT64) return lower_fail(n, err, err_len, "a shape computed at run time is not supported");
        int64_t c = sp_ox_numel(&v->t);
        if (c > SP_OXG_MAX_DIMS) return lower_fail(n, err, err_len, "a target shape of more than 8 dimensions");
        d->i[0] = c;
        for (int64_t k = 0; k < c; k++) d->i[1 + k] = ((const int64_t *)v->t.data)[k];
        d->i[9] = sp_ox_attr_i(n, "allowzero", 0) != 0;
        return 0;
    }
    if (strcmp(t, "Flatten") == 0) {
        d->op = SP_OXG_VIEW;
        d->sub = SP_OXG_FLATTEN;
        d->i[0] = sp_ox_attr_i(n, "axis", 1);
        return 0;
    }
    if (strcmp(t, "Squeeze") == 0 || strcmp(t, "Unsqueeze") == 0) {
        d->op = SP_OXG_VIEW;
        d->sub = t[0] == 'S' ? SP_OXG_SQUEEZE : SP_OXG_UNSQUEEZE;
        return axes_into(g, n, 13, 1, d, err, err_len);
    }
    if (strcmp(t, "Transpose") == 0) {
        d->op = SP_OXG_TRANSPOSE;
        size_t c;
        const int64_t *p = sp_ox_attr_ints(n, "perm", &c);
        if (c > SP_OXG_MAX_DIMS) return lower_fail(n, err, err_len, "perm of more than 8 values");
        d->i[0] = (int64_t)c;
        for (size_t k = 0; k < c; k++) d->i[1 + k] = p[k];
        return 0;
    }
    if (strcmp(t, "Concat") == 0) {
        d->op = SP_OXG_CONCAT;
        d->i[0] = sp_ox_attr_i(n, "axis", 0);
        return 0;
    }
    if (strcmp(t, "Softmax") == 0 || strcmp(t, "LogSoftmax") == 0) {
        d->op = SP_OXG_SOFTMAX;
        d->sub = t[0] == 'L';
        d->i[0] = sp_ox_attr_i(n, "axis", n->opset < 13 ? 1 : -1);
        d->i[1] = n->opset >= 13;
        return 0;
    }
    if (strcmp(t, "LayerNormalization") == 0) {
        d->op = SP_OXG_LAYERNORM;
        d->i[0] = sp_ox_attr_i(n, "axis", -1);
        d->f[0] = sp_ox_attr_f(n, "epsilon", 1e-5f);
        return 0;
    }
    if (strcmp(t, "Gather") == 0) {
        d->op = SP_OXG_GATHER;
        d->i[0] = sp_ox_attr_i(n, "axis", 0);
        return 0;
    }
    return lower_fail(n, err, err_len, "this operator is not supported by the GPU executor");
}

int
sp_ox_gpu_load(const sp_ox_graph_t *g, const sp_ox_gpu_cfg_t *gc, sp_ox_gpu_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_ox_gpu_t *gpu = calloc(1, sizeof *gpu);
    sp_oxg_value_t *vals = calloc((size_t)g->n_values + 1, sizeof *vals);
    sp_oxg_node_t *nodes = calloc((size_t)g->n_order + 1, sizeof *nodes);
    int rc = -1;
    if (gpu == NULL || vals == NULL || nodes == NULL) {
        sp__bk_errf(err, err_len, "onnx: out of memory");
        goto done;
    }
    if (open_lib(gpu, gc->device, err, err_len)) goto done;
    for (int32_t v = 0; v < g->n_values; v++) {
        const sp_ox_value_t *x = &g->values[v];
        sp_oxg_value_t *d = &vals[v];
        d->kind = x->is_const ? SP_OXG_CONST : x->is_input ? SP_OXG_INPUT : SP_OXG_ACT;
        d->is_output = x->is_output;
        d->last_use = x->last_use;
        d->dtype = x->is_const || x->is_input ? x->t.dtype : SP_OXG_FLOAT;
        if (x->is_input && d->dtype != OX_FLOAT && d->dtype != OX_INT64) {
            sp__bk_errf(err, err_len, "input '%.100s': %s inputs are not supported on the GPU (FLOAT, "
                        "INT64)", x->name, sp_ox_dtype_name(x->t.dtype));
            goto done;
        }
        if (x->is_const) {
            d->nd = x->t.nd;
            memcpy(d->dims, x->t.dims, sizeof d->dims);
            d->data = x->t.data;
        }
    }
    for (int32_t o = 0; o < g->n_order; o++) {
        if (lower_node(g, &g->nodes[g->order[o]], &nodes[o], err, err_len)) goto done;
    }
    sp_oxg_graph_t desc = {.n_values = g->n_values, .n_nodes = g->n_order, .values = vals, .nodes = nodes};
    sp_oxg_options_t opt = {.device = gc->device, .fp16 = gc->fp16, .workspace_limit = SP_OX_GPU_WORKSPACE};
    if (gpu->api->load(&desc, &opt, &gpu->exec, err, err_len)) goto done;
    *out = gpu;
    gpu = NULL;
    rc = 0;
done:
    free(vals);
    free(nodes);
    sp_ox_gpu_free(gpu);
    return rc;
}

int
sp_ox_gpu_execute(sp_ox_gpu_t *gpu, const sp_ox_graph_t *g, const int32_t *in_value,
                  const sp_backend_tensor_t *inputs, int32_t n_inputs, sp_backend_tensor_t *outputs,
                  int32_t n_outputs, void *(*alloc)(size_t), char *err, size_t err_len)
{
    sp_oxg_io_t in[SP_BACKEND_MAX_TENSORS], out[SP_BACKEND_MAX_TENSORS];
    if (n_inputs > SP_BACKEND_MAX_TENSORS || n_outputs > SP_BACKEND_MAX_TENSORS) {
        return sp__bk_errf(err, err_len, "onnx: too many tensors");
    }
    for (int32_t i = 0; i < n_inputs; i++) {
        const sp_backend_tensor_t *x = &inputs[i];
        in[i] = (sp_oxg_io_t){.value = in_value[i], .dtype = x->dtype == SP_BT_INT64 ? SP_OXG_INT64 : SP_OXG_FLOAT,
                              .nd = x->n_dims, .data = x->data, .bytes = x->bytes};
        memcpy(in[i].dims, x->dims, sizeof(int64_t) * (size_t)x->n_dims);
    }
    for (int32_t o = 0; o < n_outputs; o++) {
        int32_t k = 0;
        while (k < g->n_outputs && strcmp(g->values[g->outputs[k]].name, outputs[o].name) != 0) k++;
        if (k == g->n_outputs) return sp__bk_errf(err, err_len, "onnx: no output named \"%s\"", outputs[o].name);
        memset(&out[o], 0, sizeof out[o]);
        out[o].value = g->outputs[k];
    }
    int rc = gpu->api->run(gpu->exec, in, n_inputs, out, n_outputs, alloc, err, err_len);
    for (int32_t o = 0; o < n_outputs; o++) {
        sp_backend_tensor_t *t = &outputs[o];
        t->data = out[o].data;
        t->bytes = out[o].bytes;
        t->dtype = out[o].dtype == SP_OXG_INT64 ? SP_BT_INT64 : SP_BT_FP32;
        t->n_dims = out[o].nd;
        memcpy(t->dims, out[o].dims, sizeof(int64_t) * (size_t)(out[o].nd > 0 ? out[o].nd : 0));
    }
    return rc;
}

uint64_t
sp_ox_gpu_device_bytes(const sp_ox_gpu_t *gpu)
{
    return gpu->api->device_bytes(gpu->exec);
}

const char *
sp_ox_gpu_lib_path(const sp_ox_gpu_t *gpu)
{
    return gpu->lib;
}

void
sp_ox_gpu_free(sp_ox_gpu_t *gpu)
{
    if (gpu == NULL) return;
    if (gpu->exec) gpu->api->unload(gpu->exec);
    /* the library stays mapped: unloading CUDA libraries at run time is not safe in general */
    free(gpu);
}
