/*
 * backends/onnx/backend.c - the ONNX backend plugin (libsampan_onnx.so):
 * config.json's "backend": "onnx" (the server also maps Triton's
 * "onnxruntime"), the graph in `model.onnx` of the version folder (or
 * parameters.model_file), run by the graph runtime of this folder on CPU.
 *
 * load reads and prepares the graph (load.c, graph.c) and reports its inputs
 * and outputs: the graph's own when config.json declares none (Triton's
 * auto-complete), else the declared ones after checking them against the
 * graph. With max_batch_size > 0 the first dimension of every input and
 * output is the batch, and must be a free (symbolic) dimension in the graph.
 * execute copies each input into the instance's buffer pool (so binary HTTP
 * tensors need not be aligned), runs the graph and copies the requested
 * outputs into host memory.
 *
 * Threads: one instance runs one batch at a time; each instance has its own
 * graph and pool, so nothing is shared and nothing locks. The graph runs
 * on the calling thread; large GEMMs (Conv, Gemm, MatMul) split over the
 * instance's n_threads (gemm.c).
 * Memory: per instance, the graph's constants plus the pool of activation
 * buffers (the peak of live activations of the largest batch seen).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common.h"
#include "dnnl.h"
#include "gpu.h"
#include "ox.h"

typedef struct onnx_model {
    sp_backend_host_t host;
    sp_ox_graph_t *g;
    sp_ox_run_t run;
    sp_ox_gpu_t *gpu;         /* KIND_GPU: the GPU executor runs the graph (gpu.c) */
    int32_t max_batch;
    int32_t n_in;
    int32_t in_value[SP_BACKEND_MAX_TENSORS]; /* declared input i -> graph value */
    sp_backend_tensor_desc_t in_desc[SP_BACKEND_MAX_TENSORS];
    int64_t in_model_dims[SP_BACKEND_MAX_TENSORS][SP_BACKEND_MAX_DIMS]; /* -1 free */
    int32_t in_model_nd[SP_BACKEND_MAX_TENSORS];
    /* The shape planned at load for an input's free non-batch dimensions (a sequence length):
     * parameters.plan_dims.NAME, or config.json's fixed dims; -1 where none was given. */
    int64_t in_plan_dims[SP_BACKEND_MAX_TENSORS][SP_BACKEND_MAX_DIMS];
    uint64_t plans_at_load;   /* arena plans made by plan_declared */
    uint64_t dnnl_created;    /* primitives created when last logged */
    uint64_t plans_logged;    /* arena plans made when last logged */
    bool loading;             /* plan_declared's runs: the load line reports their plans */
    char name[128];           /* for log lines */
} onnx_model_t;

/* The engine: parameters.engine ("onednn" or "own"), else SAMPAN_ONNX_ENGINE, else oneDNN
 * when this build has it. The precision: parameters.precision, "fp32" (default) or "bf16"
 * (oneDNN computing FP32 models in BF16, on CPUs with AVX512-BF16 or AMX only). */
static int
pick_engine(const sp__bk_config_t *cfg, bool *use_dnnl, bool *bf16, char *err, size_t err_len)
{
    const char *eng = sp__bk_config_param(cfg, "engine");
    const char *from = "parameters.engine";
    if (eng == NULL) {
        eng = getenv("SAMPAN_ONNX_ENGINE");
        from = "SAMPAN_ONNX_ENGINE";
    }
    if (eng == NULL || *eng == 0) {
        *use_dnnl = sp_ox_dnnl_built();
    } else if (strcmp(eng, "onednn") == 0) {
        if (!sp_ox_dnnl_built()) {
            return sp__bk_errf(err, err_len, "%s \"onednn\": this build has no oneDNN "
                               "(libdnnl-dev was missing when it was built)", from);
        }
        *use_dnnl = true;
    } else if (strcmp(eng, "own") == 0) {
        *use_dnnl = false;
    } else {
        return sp__bk_errf(err, err_len, "%s \"%.40s\": expected \"onednn\" or \"own\"", from, eng);
    }
    /* precision: bf16 is the engine's arithmetic; fp32, fp16 and int8 pick the file
     * (onnx_load), and the GPU checks its own (gpu.c). */
    const char *prec = sp__bk_config_param(cfg, "precision");
    *bf16 = false;
    if (prec == NULL || strcmp(prec, "bf16") != 0) return 0;
    if (!*use_dnnl) {
        return sp__bk_errf(err, err_len, "parameters.precision \"bf16\" needs the oneDNN engine, "
                           "not \"own\"");
    }
    if (!sp_ox_dnnl_has_bf16()) {
        return sp__bk_errf(err, err_len, "parameters.precision \"bf16\": this CPU has no BF16 "
                           "arithmetic (AVX512-BF16 or AMX); use \"fp32\"");
    }
    *bf16 = true;
    return 0;
}

static int
to_btype(int32_t ox, sp_btype_t *bt)
{
    switch (ox) {
    case OX_FLOAT: *bt = SP_BT_FP32; return 0;
    case OX_UINT8: *bt = SP_BT_UINT8; return 0;
    case OX_INT8: *bt = SP_BT_INT8; return 0;
    case OX_INT32: *bt = SP_BT_INT32; return 0;
    case OX_INT64: *bt = SP_BT_INT64; return 0;
    case OX_BOOL: *bt = SP_BT_BOOL; return 0;
    case OX_FLOAT16: *bt = SP_BT_FP16; return 0;
    case OX_DOUBLE: *bt = SP_BT_FP64; return 0;
    default: return -1;
    }
}

/* A graph input or output as the server sees it: dims without the batch
 * when max_batch > 0. */
static int
describe(const Onnx__ValueInfoProto *vi, int32_t max_batch, const char *file, const char *kind,
         sp_backend_tensor_desc_t *d, int64_t *model_dims, int32_t *model_nd, char *err,
         size_t err_len)
{
    memset(d, 0, sizeof *d);
    if (strlen(vi->name) >= sizeof d->name) {
        return sp__bk_errf(err, err_len, "%s: %s '%.80s': name longer than %zu bytes", file, kind,
                           vi->name, sizeof d->name - 1);
    }
    snprintf(d->name, sizeof d->name, "%s", vi->name);
    const Onnx__TypeProto *ty = vi->type;
    if (ty == NULL || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || ty->tensor_type == NULL ||
        to_btype(ty->tensor_type->elem_type, &d->dtype)) {
        return sp__bk_errf(err, err_len, "%s: %s '%s': not a tensor of a supported type", file,
                           kind, vi->name);
    }
    const Onnx__TensorShapeProto *sh = ty->tensor_type->shape;
    if (sh == NULL) {
        return sp__bk_errf(err, err_len, "%s: %s '%s' has no shape in the graph: declare it in "
                           "config.json", file, kind, vi->name);
    }
    if (sh->n_dim > SP_BACKEND_MAX_DIMS) {
        return sp__bk_errf(err, err_len, "%s: %s '%s': %zu dimensions", file, kind, vi->name, sh->n_dim);
    }
    int32_t nd = (int32_t)sh->n_dim;
    for (int32_t i = 0; i < nd; i++) {
        const Onnx__TensorShapeProto__Dimension *dm = sh->dim[i];
        model_dims[i] = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
                        dm->dim_value >= 0 ? dm->dim_value : -1;
    }
    *model_nd = nd;
    if (max_batch > 0) {
        if (nd == 0 || model_dims[0] != -1) {
            return sp__bk_errf(err, err_len, "%s: %s '%s': max_batch_size %d needs a free first "
                               "(batch) dimension, the graph has %s", file, kind, vi->name,
                               (int)max_batch, nd ? "a fixed one" : "a scalar");
        }
        d->n_dims = nd - 1;
        for (int32_t i = 1; i < nd; i++) d->dims[i - 1] = model_dims[i];
    } else {
        d->n_dims = nd;
        for (int32_t i = 0; i < nd; i++) d->dims[i] = model_dims[i];
    }
    return 0;
}

/* A declared input/output against the graph's: same type and rank, and
 * every fixed dimension the graph has is the declared one. */
static int
check_declared(const sp_backend_tensor_desc_t *decl, const sp_backend_tensor_desc_t *mine,
               const char *kind, int idx, char *err, size_t err_len)
{
    bool ok = decl->dtype == mine->dtype && decl->n_dims == mine->n_dims;
    for (int32_t i = 0; ok && i < decl->n_dims; i++) {
        ok = mine->dims[i] < 0 || decl->dims[i] == mine->dims[i];
    }
    if (!ok) {
        char a[128], b[128];
        sp__bk_dims_str(decl->dims, decl->n_dims, a, sizeof a);
        sp__bk_dims_str(mine->dims, mine->n_dims, b, sizeof b);
        return sp__bk_errf(err, err_len, "config.json %s[%d] \"%s\": %s %s, but the model has %s %s",
                           kind, idx, decl->name, sp__bk_dtype_name(decl->dtype), a,
                           sp__bk_dtype_name(mine->dtype), b);
    }
    return 0;
}

static void
onnx_unload(void *model)
{
    onnx_model_t *m = model;
    if (m == NULL) return;
    sp_ox_gpu_free(m->gpu);
    sp_ox_run_free(&m->run);
    sp_ox_graph_free(m->g);
    free(m);
}

/* parameters.plan_dims.NAME: "d1,d2,...", the dims of input NAME past the batch dimension (all
 * of them without a batch), each a positive size; where the graph or config.json fixes a
 * dimension it must be that size. It gives plan_declared the shape to plan at load for an input
 * with a free dimension besides the batch (a sequence length); requests of other sizes still run
 * (their plans are made on their first batch). Without it, a free dimension that config.json
 * fixes is planned at that size (in_model_dims already holds it). */
static int
read_plan_dims(onnx_model_t *m, const sp__bk_config_t *cfg, char *err, size_t err_len)
{
    int32_t off = m->max_batch > 0 ? 1 : 0;
    for (int32_t i = 0; i < m->n_in; i++) {
        int32_t nd = m->in_model_nd[i];
        for (int32_t k = 0; k < nd; k++) m->in_plan_dims[i][k] = m->in_model_dims[i][k];
        char key[96];
        snprintf(key, sizeof key, "plan_dims.%s", m->in_desc[i].name);
        const char *v = sp__bk_config_param(cfg, key);
        if (v == NULL) continue;
        int64_t want[SP_BACKEND_MAX_DIMS + 1];
        int32_t n = 0;
        for (const char *p = v;;) {
            char *end;
            long long d = strtoll(p, &end, 10);
            if (end == p || d <= 0 || d > ((long long)1 << 31) || (*end != ',' && *end != 0) ||
                n > SP_BACKEND_MAX_DIMS) {
                return sp__bk_errf(err, err_len, "onnx: parameters.%s \"%.60s\": positive sizes "
                                   "separated by commas, e.g. \"128\"", key, v);
            }
            want[n++] = d;
            if (*end == 0) break;
            p = end + 1;
        }
        if (n != nd - off) {
            return sp__bk_errf(err, err_len, "onnx: parameters.%s \"%.60s\": input \"%s\" has %d "
                               "dimensions%s, the value gives %d", key, v, m->in_desc[i].name,
                               (int)(nd - off), off ? " past the batch" : "", (int)n);
        }
        for (int32_t k = off; k < nd; k++) {
            if (m->in_model_dims[i][k] >= 0 && m->in_model_dims[i][k] != want[k - off]) {
                return sp__bk_errf(err, err_len, "onnx: parameters.%s \"%.60s\": dimension %d of "
                                   "input \"%s\" is %lld, not %lld", key, v, (int)k,
                                   m->in_desc[i].name, (long long)m->in_model_dims[i][k],
                                   (long long)want[k - off]);
            }
            m->in_plan_dims[i][k] = want[k - off];
        }
    }
    return 0;
}

/* Every key of parameters is one this backend reads, plan_dims.NAME of an input, or one the
 * server reads for tensor models (model_file, target_p99_ms, image_preprocess.NAME); any other
 * (a typo, an onnxruntime option) is a load error rather than a setting silently ignored. */
static int
check_params(const onnx_model_t *m, const sp__bk_config_t *cfg, char *err, size_t err_len)
{
    static const char *const base[] = {"engine", "precision", "plan_at_load", "model_file",
                                       "target_p99_ms"};
    static const char *const prefixes[] = {"image_preprocess.", NULL};
    char names[SP_BACKEND_MAX_TENSORS][96];
    const char *known[sizeof base / sizeof base[0] + SP_BACKEND_MAX_TENSORS + 1];
    size_t n = 0;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) known[n++] = base[i];
    for (int32_t i = 0; i < m->n_in; i++) {
        snprintf(names[i], sizeof names[i], "plan_dims.%s", m->in_desc[i].name);
        known[n++] = names[i];
    }
    known[n] = NULL;
    const char *bad = sp__bk_config_unknown_param(cfg, known, prefixes);
    if (bad == NULL) return 0;
    if (strncmp(bad, "plan_dims.", 10) == 0) {
        return sp__bk_errf(err, err_len, "onnx: parameters.%.100s: the model has no input \"%.80s\"",
                           bad, bad + 10);
    }
    return sp__bk_errf(err, err_len, "onnx: parameters.%.100s is not a setting of the onnx backend "
                       "(engine, precision, plan_at_load, plan_dims.INPUT, model_file, "
                       "target_p99_ms, image_preprocess.INPUT)", bad);
}

static int onnx_execute(void *model, const sp_backend_tensor_t *inputs, int32_t n_inputs,
                        sp_backend_tensor_t *outputs, int32_t n_outputs, char *err, size_t err_len);

/* The arena plans of the declared input shapes, made at load: one run of zeros at each (batch 1
 * and max_batch_size for a free batch dimension, the fixed shape otherwise), which records the
 * sizes and makes the plan (plan.c), and on the oneDNN engine creates the primitives and packs
 * the weights those shapes use, so the first requests find both. An input with another free
 * dimension (a sequence length) has no declared shape to plan: its plans come with the first
 * batches, as for any other shape. A run that fails on zeros (a model whose shapes depend on
 * the data) is logged and leaves planning to the first batches; it is not a load error.
 * Returns the largest plan's arena bytes; `note` gets " planned_at_load=[shapes] bytes=N". */
static size_t
plan_declared(onnx_model_t *m, char *note, size_t note_len)
{
    int32_t batches[2] = {1, m->max_batch};
    int32_t n_batches = m->max_batch > 1 ? 2 : 1;
    if (m->max_batch <= 0) batches[0] = 0;
    sp_backend_tensor_t in[SP_BACKEND_MAX_TENSORS];
    memset(in, 0, sizeof in);
    size_t peak = 0;
    int made = 0;
    m->loading = true;
    for (int32_t b = 0; b < n_batches; b++) {
        bool ok = true;
        for (int32_t i = 0; i < m->n_in && ok; i++) {
            sp_backend_tensor_t *t = &in[i];
            t->dtype = m->in_desc[i].dtype;
            t->n_dims = m->in_model_nd[i];
            int64_t numel = 1;
            for (int32_t k = 0; k < t->n_dims; k++) {
                t->dims[k] = k == 0 && m->max_batch > 0 ? batches[b] : m->in_plan_dims[i][k];
                if (t->dims[k] < 0 && ok) {
                    sp__bk_log(&m->host, 1, "backend=onnx model=%s plan_at_load=skipped reason=\"input "
                               "'%s' dimension %d is free: give parameters.plan_dims.%s (or fixed "
                               "dims in config.json) to plan it at load\"", m->name, m->in_desc[i].name,
                               (int)k, m->in_desc[i].name);
                }
                ok = ok && t->dims[k] >= 0;
                numel *= t->dims[k] > 0 ? t->dims[k] : 1;
            }
            t->name = m->in_desc[i].name;
            t->bytes = (size_t)numel * sp_ox_dtype_size(m->g->values[m->in_value[i]].t.dtype);
            free(t->data);
            t->data = ok ? calloc(1, t->bytes ? t->bytes : 1) : NULL;
            ok = ok && t->data != NULL;
        }
        if (!ok) break; /* a free dimension past the batch with no planning size (logged) */
        char err[512] = "";
        uint64_t before = m->run.plans_made;
        if (onnx_execute(m, in, m->n_in, NULL, 0, err, sizeof err)) {
            sp__bk_log(&m->host, 1, "backend=onnx model=%s plan_at_load=skipped reason=\"%s\"", m->name, err);
            break;
        }
        if (m->run.plans_made != before && m->run.last_made) {
            if (m->run.last_made->peak > peak) peak = m->run.last_made->peak;
            made++;
        }
    }
    m->loading = false;
    for (int32_t i = 0; i < m->n_in; i++) free(in[i].data);
    m->plans_logged = m->run.plans_made;
    m->plans_at_load = m->run.plans_made;
    if (made) snprintf(note, note_len, " planned_at_load=%d activation_arena_bytes=%zu", made, peak);
    return peak;
}

static int
onnx_load(const sp_backend_host_t *host, const sp_backend_load_args_t *args, void **model,
          sp_backend_model_info_t *info, char *err, size_t err_len)
{
    *model = NULL;
    sp__bk_config_t cfg;
    if (sp__bk_config_parse(args->config_json, &cfg, err, err_len)) return -1;
    int rc = -1;
    onnx_model_t *m = calloc(1, sizeof *m);
    char path[4096];
    if (m == NULL) {
        sp__bk_errf(err, err_len, "onnx: out of memory");
        goto done;
    }
    m->host = *host;
    m->max_batch = args->max_batch_size;
    if (args->model_file) snprintf(path, sizeof path, "%s", args->model_file);
    else snprintf(path, sizeof path, "%s/model.onnx", args->version_dir);
    /* parameters.precision. On the GPU it is the executor's arithmetic (fp16: the FP32 file's
     * weights converted at upload; gpu.c checks the value). On the CPU it picks the file: fp32
     * the file itself, fp16 / int8 `sampan optimize`'s MODEL_fp16.onnx / MODEL_int8.onnx beside
     * it. A missing file is a load error, never a silent fall back to FP32. */
    sp_ox_gpu_cfg_t gc;
    if (sp_ox_gpu_config(&cfg, &gc, err, err_len)) goto done;
    const char *prec = sp__bk_config_param(&cfg, "precision");
    if (!gc.on && prec && strcmp(prec, "fp32") != 0 && strcmp(prec, "bf16") != 0) {
        if (strcmp(prec, "fp16") != 0 && strcmp(prec, "int8") != 0) {
            sp__bk_errf(err, err_len, "onnx: parameters.precision \"%.40s\": fp32, fp16, int8 or bf16",
                        prec);
            goto done;
        }
        size_t pl = strlen(path);
        if (pl > 5 && strcmp(path + pl - 5, ".onnx") == 0) path[pl - 5] = 0;
        char base[4096];
        snprintf(base, sizeof base, "%s", path);
        snprintf(path, sizeof path, "%.4080s_%s.onnx", base, prec);
        if (access(path, R_OK) != 0) {
            sp__bk_errf(err, err_len, "onnx: parameters.precision \"%s\": %s is missing (write it with "
                        "`sampan optimize %s.onnx%s`)", prec, path, base,
                        strcmp(prec, "int8") == 0 ? " --calib CALIB.npy" : "");
            goto done;
        }
    }
    if (sp_ox_graph_load(path, args->version_dir, &m->g, err, err_len)) goto done;
    m->g->keep_residual_add = gc.on; /* the GPU executor has no fused residual Add */
    if (sp_ox_graph_prepare(m->g, err, err_len)) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", err);
        sp__bk_errf(err, err_len, "%s: %s", path, tmp);
        goto done;
    }
    if (gc.on && sp_ox_gpu_load(m->g, &gc, &m->gpu, err, err_len)) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", err);
        sp__bk_errf(err, err_len, "%s: %s", path, tmp);
        goto done;
    }
    m->run.g = m->g;
    snprintf(m->name, sizeof m->name, "%s", args->model_name ? args->model_name : "");
    m->run.n_threads = args->n_threads > 0 ? args->n_threads : 1;
    bool use_dnnl = false, bf16 = false;
    if (m->gpu && sp__bk_config_param(&cfg, "engine") != NULL) {
        /* the CPU engines' choice: refused rather than ignored on the GPU executor */
        sp__bk_errf(err, err_len, "%s: parameters.engine chooses a CPU engine; a KIND_GPU model runs "
                    "on the GPU executor", path);
        goto done;
    }
    if (!m->gpu && pick_engine(&cfg, &use_dnnl, &bf16, err, err_len)) goto done;
    /* SAMPAN_ONNX_ARENA=0: activations from the buffer pool only, no arena plan (plan.c), for
     * comparing the two; the oneDNN engine never plans. */
    const char *arena = getenv("SAMPAN_ONNX_ARENA");
    if (arena && strcmp(arena, "0") != 0 && strcmp(arena, "1") != 0) {
        sp__bk_errf(err, err_len, "onnx: SAMPAN_ONNX_ARENA=\"%.20s\": 0 or 1", arena);
        goto done;
    }
    m->run.no_arena = arena && strcmp(arena, "0") == 0;
    /* parameters.plan_at_load: "true" (default) runs the declared shapes once at load to make
     * their arena plans (and oneDNN primitives); "false" leaves that to the first batches. */
    const char *pal = sp__bk_config_param(&cfg, "plan_at_load");
    if (pal && strcmp(pal, "true") != 0 && strcmp(pal, "false") != 0) {
        sp__bk_errf(err, err_len, "onnx: parameters.plan_at_load \"%.20s\": true or false", pal);
        goto done;
    }
    bool plan_at_load = pal == NULL || strcmp(pal, "true") == 0;
    /* One primitive per batch size the batcher may form (1..max_batch_size) per node. */
    if (use_dnnl && sp_ox_dnnl_attach(&m->run, bf16, m->max_batch, err, err_len)) goto done;
    const Onnx__GraphProto *gp = m->g->proto->graph;
    /* The graph's own inputs (fed ones only) and outputs. */
    sp_backend_tensor_desc_t gin[SP_BACKEND_MAX_TENSORS], gout[SP_BACKEND_MAX_TENSORS];
    int64_t gdims[SP_BACKEND_MAX_TENSORS][SP_BACKEND_MAX_DIMS];
    int32_t gnd[SP_BACKEND_MAX_TENSORS];
    int32_t n_gin = 0;
    for (size_t i = 0; i < gp->n_input; i++) {
        bool fed = false;
        for (int32_t k = 0; k < m->g->n_inputs; k++) {
            fed |= strcmp(m->g->values[m->g->inputs[k]].name, gp->input[i]->name) == 0;
        }
        if (!fed) continue;
        if (describe(gp->input[i], m->max_batch, path, "input", &gin[n_gin], gdims[n_gin],
                     &gnd[n_gin], err, err_len)) goto done;
        n_gin++;
    }
    for (int32_t i = 0; i < m->g->n_outputs; i++) {
        int64_t dd[SP_BACKEND_MAX_DIMS];
        int32_t nd;
        const Onnx__ValueInfoProto *vi = gp->output[i];
        bool declared = false;
        for (int32_t k = 0; k < cfg.n_outputs; k++) declared |= strcmp(cfg.outputs[k].name, vi->name) == 0;
        /* An output without a shape in the graph is fine when config.json declares it. */
        if (declared && (vi->type == NULL || vi->type->tensor_type == NULL ||
                         vi->type->tensor_type->shape == NULL)) {
            memset(&gout[i], 0, sizeof gout[i]);
            snprintf(gout[i].name, sizeof gout[i].name, "%s", vi->name);
            gout[i].n_dims = -1;
            continue;
        }
        if (describe(vi, m->max_batch, path, "output", &gout[i], dd, &nd, err, err_len)) goto done;
    }
    memset(info, 0, sizeof *info);
    if (cfg.n_inputs == 0) {
        for (int32_t i = 0; i < n_gin; i++) {
            m->in_value[i] = m->g->inputs[i];
            m->in_desc[i] = gin[i];
            memcpy(m->in_model_dims[i], gdims[i], sizeof gdims[i]);
            m->in_model_nd[i] = gnd[i];
        }
        m->n_in = n_gin;
    } else {
        for (int32_t i = 0; i < cfg.n_inputs; i++) {
            int32_t k = 0;
            while (k < n_gin && strcmp(gin[k].name, cfg.inputs[i].name) != 0) k++;
            if (k == n_gin) {
                sp__bk_errf(err, err_len, "config.json input[%d] \"%s\": the model has no such "
                            "input", i, cfg.inputs[i].name);
                goto done;
            }
            if (check_declared(&cfg.inputs[i], &gin[k], "input", i, err, err_len)) goto done;
            m->in_value[i] = m->g->inputs[k];
            m->in_desc[i] = cfg.inputs[i];
            memcpy(m->in_model_dims[i], gdims[k], sizeof gdims[k]);
            m->in_model_nd[i] = gnd[k];
            /* A dimension free in the graph that config.json fixes (a sequence length of 128):
             * the server admits only that size, so it is this model's size (planned at load). */
            int32_t off = m->max_batch > 0 ? 1 : 0;
            for (int32_t d = off; d < gnd[k]; d++) {
                if (m->in_model_dims[i][d] < 0 && cfg.inputs[i].dims[d - off] > 0) {
                    m->in_model_dims[i][d] = cfg.inputs[i].dims[d - off];
                }
            }
        }
        m->n_in = cfg.n_inputs;
        for (int32_t k = 0; k < n_gin; k++) {
            bool found = false;
            for (int32_t i = 0; i < cfg.n_inputs; i++) found |= strcmp(gin[k].name, cfg.inputs[i].name) == 0;
            if (!found) {
                sp__bk_errf(err, err_len, "config.json declares no input \"%s\", which the model "
                            "needs", gin[k].name);
                goto done;
            }
        }
    }
    if (check_params(m, &cfg, err, err_len) || read_plan_dims(m, &cfg, err, err_len)) goto done;
    info->n_inputs = m->n_in;
    memcpy(info->inputs, m->in_desc, sizeof m->in_desc);
    if (cfg.n_outputs == 0) {
        info->n_outputs = m->g->n_outputs;
        memcpy(info->outputs, gout, sizeof gout[0] * (size_t)m->g->n_outputs);
    } else {
        for (int32_t i = 0; i < cfg.n_outputs; i++) {
            int32_t k = 0;
            while (k < m->g->n_outputs && strcmp(gout[k].name, cfg.outputs[i].name) != 0) k++;
            if (k == m->g->n_outputs) {
                sp__bk_errf(err, err_len, "config.json output[%d] \"%s\": the model has no such "
                            "output", i, cfg.outputs[i].name);
                goto done;
            }
            if (gout[k].n_dims >= 0 && check_declared(&cfg.outputs[i], &gout[k], "output", i, err, err_len)) goto done;
        }
        info->n_outputs = cfg.n_outputs;
        memcpy(info->outputs, cfg.outputs, sizeof cfg.outputs[0] * (size_t)cfg.n_outputs);
    }
    info->memory_bytes = m->g->const_bytes + sizeof *m + (1u << 20);
    if (m->gpu) {
        /* the constants on the device plus the workspace bound; the activation pool grows with
         * the batch and is not known before the first one */
        info->device_bytes = sp_ox_gpu_device_bytes(m->gpu) + SP_OX_GPU_WORKSPACE;
        sp__bk_log(host, 1, "backend=onnx model=%s placement=gpu device=cuda:%d precision=%s "
                   "device_bytes=%llu lib=%s", args->model_name ? args->model_name : "", (int)gc.device,
                   gc.fp16 ? "fp16" : "fp32", (unsigned long long)sp_ox_gpu_device_bytes(m->gpu),
                   sp_ox_gpu_lib_path(m->gpu));
    }
    /* oneDNN keeps its own copy of the weights, reordered into its layouts (once per node and
     * layout: one copy in the usual case). */
    if (use_dnnl) info->memory_bytes += m->g->const_bytes;
    char planned[160] = "";
    if (!m->gpu && !m->run.no_arena && plan_at_load) {
        size_t peak = plan_declared(m, planned, sizeof planned);
        info->memory_bytes += peak;
    }
    sp__bk_log(host, 1, "backend=onnx model=%s version=%lld file=%s opset=%lld nodes=%d run=%d "
               "folded=%d fused=%d constant_bytes=%llu threads=%d engine=%s precision=%s "
               "activation_arena=%s%s%s",
               args->model_name ? args->model_name : "", (long long)args->version, path,
               (long long)m->g->opset, (int)m->g->n_nodes, (int)m->g->n_order, m->g->n_folded,
               m->g->n_fused, (unsigned long long)m->g->const_bytes, m->run.n_threads,
               m->gpu ? "cuda" : use_dnnl ? "onednn" : "own", prec ? prec : "fp32",
               m->gpu || m->run.no_arena ? "off" : "per_input_shape", planned,
               /* INT8 on oneDNN: exact for every node (VNNI), or only for u8 sources with 7-bit
                * weights (the rest on the own kernels: dnnl.c isa_vnni) */
               !use_dnnl ? "" : sp_ox_dnnl_int8_vnni() ? " onednn_int8=vnni" : " onednn_int8=u8_w7");
    *model = m;
    m = NULL;
    rc = 0;
done:
    onnx_unload(m);
    sp__bk_config_free(&cfg);
    return rc;
}

static int
onnx_execute(void *model, const sp_backend_tensor_t *inputs, int32_t n_inputs,
             sp_backend_tensor_t *outputs, int32_t n_outputs, char *err, size_t err_len)
{
    onnx_model_t *m = model;
    sp_ox_run_t *r = &m->run;
    r->err = err;
    r->err_len = err_len;
    if (n_inputs != m->n_in) {
        return sp__bk_errf(err, err_len, "onnx: %d inputs given, the model takes %d", (int)n_inputs,
                           (int)m->n_in);
    }
    int64_t rows = -1;
    int rc = -1;
    for (int32_t i = 0; i < n_inputs; i++) {
        const sp_backend_tensor_t *x = &inputs[i];
        const sp_backend_tensor_desc_t *d = &m->in_desc[i];
        sp_ox_value_t *v = &m->g->values[m->in_value[i]];
        bool ok = x->dtype == d->dtype && x->n_dims == m->in_model_nd[i] && x->n_dims >= 0 &&
                  x->n_dims <= SP_BACKEND_MAX_DIMS;
        int64_t numel = 1;
        for (int32_t k = 0; ok && k < x->n_dims; k++) {
            ok = x->dims[k] >= 0 && (m->in_model_dims[i][k] < 0 || m->in_model_dims[i][k] == x->dims[k]);
            numel *= ok ? x->dims[k] : 1;
            ok = ok && numel <= ((int64_t)1 << 34);
        }
        if (!ok) {
            char a[128], b[128];
            sp__bk_dims_str(x->dims, x->n_dims >= 0 && x->n_dims <= SP_BACKEND_MAX_DIMS ? x->n_dims : 0, a, sizeof a);
            sp__bk_dims_str(m->in_model_dims[i], m->in_model_nd[i], b, sizeof b);
            sp__bk_errf(err, err_len, "input \"%s\": %s %s, expected %s %s", d->name,
                        sp__bk_dtype_name(x->dtype), a, sp__bk_dtype_name(d->dtype), b);
            goto done;
        }
        size_t bytes = (size_t)numel * sp_ox_dtype_size(v->t.dtype);
        if (x->bytes != bytes) {
            sp__bk_errf(err, err_len, "input \"%s\": %zu bytes for %lld elements of %zu bytes",
                        d->name, x->bytes, (long long)numel, sp_ox_dtype_size(v->t.dtype));
            goto done;
        }
        if (m->max_batch > 0) {
            if (rows >= 0 && x->dims[0] != rows) {
                sp__bk_errf(err, err_len, "input \"%s\": %lld rows, input \"%s\" %lld", d->name,
                            (long long)x->dims[0], m->in_desc[0].name, (long long)rows);
                goto done;
            }
            rows = x->dims[0];
        }
        if (m->gpu) continue; /* the executor uploads the caller's data itself */
        if (sp_ox_out(r, &v->t, v->t.dtype, x->n_dims, x->dims)) goto done;
        if (bytes) memcpy(v->t.data, x->data, bytes);
        if (v->t.dtype == OX_BOOL) {
            /* BOOL bytes other than 0 and 1 would break Where's tests: normalize. */
            for (size_t k = 0; k < bytes; k++) ((uint8_t *)v->t.data)[k] = ((uint8_t *)v->t.data)[k] != 0;
        }
    }
    if (m->gpu) {
        if (sp_ox_gpu_execute(m->gpu, m->g, m->in_value, inputs, n_inputs, outputs, n_outputs,
                              m->host.alloc_fn, err, err_len)) goto done;
        for (int32_t o = 0; o < n_outputs && m->max_batch > 0; o++) {
            if (outputs[o].n_dims == 0 || outputs[o].dims[0] != rows) {
                sp__bk_errf(err, err_len, "output \"%s\": first dimension %lld for a batch of %lld rows",
                            outputs[o].name, outputs[o].n_dims ? (long long)outputs[o].dims[0] : -1LL,
                            (long long)rows);
                goto done;
            }
        }
    } else if (sp_ox_graph_run(r)) {
        goto done;
    }
    for (int32_t o = 0; o < n_outputs; o++) {
        if (m->gpu) break; /* filled by the executor; the batch check follows */
        sp_backend_tensor_t *out = &outputs[o];
        int32_t k = 0;
        while (k < m->g->n_outputs && strcmp(m->g->values[m->g->outputs[k]].name, out->name) != 0) k++;
        if (k == m->g->n_outputs) {
            sp__bk_errf(err, err_len, "onnx: no output named \"%s\"", out->name);
            goto done;
        }
        const sp_ox_tensor_t *t = &m->g->values[m->g->outputs[k]].t;
        if (to_btype(t->dtype, &out->dtype)) {
            sp__bk_errf(err, err_len, "output \"%s\": type %s", out->name, sp_ox_dtype_name(t->dtype));
            goto done;
        }
        if (m->max_batch > 0 && (t->nd == 0 || t->dims[0] != rows)) {
            sp__bk_errf(err, err_len, "output \"%s\": first dimension %lld for a batch of %lld rows",
                        out->name, t->nd ? (long long)t->dims[0] : -1LL, (long long)rows);
            goto done;
        }
        size_t bytes = (size_t)sp_ox_numel(t) * sp_ox_dtype_size(t->dtype);
        out->data = m->host.alloc_fn(bytes ? bytes : 1);
        if (out->data == NULL) {
            sp__bk_errf(err, err_len, "onnx: out of memory for %zu bytes", bytes);
            goto done;
        }
        if (bytes) memcpy(out->data, t->data, bytes);
        out->bytes = bytes;
        out->n_dims = t->nd;
        for (int32_t i = 0; i < t->nd; i++) out->dims[i] = t->dims[i];
    }
    rc = 0;
done:
    if (r->plans_made != m->plans_logged && r->last_made && !m->loading) {
        /* A new arena plan (a new batch size): its peak against all activations side by side. */
        const sp_ox_plan_t *p = r->last_made;
        char shp[160] = "";
        size_t o = 0;
        for (int32_t i = 0; i < m->g->n_inputs && o < sizeof shp - 40; i++) {
            char d[96];
            sp_ox_shape_str(p->dims[i], p->nd[i], d, sizeof d);
            o += (size_t)snprintf(shp + o, sizeof shp - o, "%s%s", i ? "," : "", d);
        }
        m->plans_logged = r->plans_made;
        sp__bk_log(&m->host, 1, "backend=onnx model=%s activation_plan inputs=%s activation_arena_bytes=%zu "
                   "activation_sum_bytes=%zu pool_bytes=%zu shared_buffers=%d plans=%d made_after_load=%llu", m->name,
                   shp, p->peak, p->sum, p->pool, p->n_shared, (int)r->n_plans,
                   (unsigned long long)(r->plans_made - m->plans_at_load));
    }
    sp_ox_run_release_all(r);
    if (r->dnnl) {
        /* New primitives (a new batch size) are worth a debug line; steady state is quiet. */
        sp_ox_dnnl_stats_t st;
        sp_ox_dnnl_get_stats(r, &st);
        if (st.created != m->dnnl_created) {
            m->dnnl_created = st.created;
            sp__bk_log(&m->host, 0, "backend=onnx onednn_primitives created=%llu cached=%llu "
                       "evicted=%llu fallbacks=%llu groups=%llu chained=%llu scratchpad_bytes=%llu",
                       (unsigned long long)st.created,
                       (unsigned long long)st.cached, (unsigned long long)st.evicted,
                       (unsigned long long)st.fallbacks, (unsigned long long)st.groups,
                       (unsigned long long)st.chained, (unsigned long long)st.scratchpad_bytes);
        }
    }
    return rc;
}

static const sp_backend_api_t onnx_api = {
    .abi_version = SP_BACKEND_ABI_VERSION,
    .name = "onnx",
    .load = onnx_load,
    .execute = onnx_execute,
    .unload = onnx_unload,
};

__attribute__((visibility("default"))) const sp_backend_api_t *
sp_backend_init(uint32_t abi_version)
{
    return abi_version == SP_BACKEND_ABI_VERSION ? &onnx_api : NULL;
}
