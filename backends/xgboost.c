/*
 * backends/xgboost.c - XGBoost models (JSON or UBJ) through the XGBoost C API.
 *
 * One input, FP32 [rows, n_features]; one output, FP32 [rows] (probability,
 * or margin with parameters.output_margin "true") or [rows, n_classes] for
 * multi-class models. Each instance owns its boosters, and the server never
 * runs two batches on one instance at once, so no lock is needed here.
 *
 * Prediction goes through XGBoosterPredictFromDense ("inplace predict"): the
 * batch's rows are read where the server put them, with no DMatrix built per
 * call, which keeps a small batch at a few microseconds of overhead. Absent
 * values are NaN (or parameters.missing), exactly as in a LibSVM DMatrix.
 *
 * Threads: XGBoost splits a batch into blocks of 64 rows over an OpenMP team
 * of `nthread`. For a few rows the team only costs (waking it takes longer
 * than scoring them, and on a loaded machine spinning threads took a 1-row
 * call from 40 us to 3 ms), so with n_threads > 1 an instance loads the model
 * twice: one booster with nthread 1 for batches under PARALLEL_MIN_ROWS rows,
 * one with n_threads for larger ones. Changing nthread per call instead would
 * reconfigure the booster each time.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <xgboost/c_api.h>

#include "common.h"

/* Rows from which a batch goes to the multi-threaded booster: 4 blocks of 64,
 * so each of 2 to 4 threads has at least one block to score. */
#define PARALLEL_MIN_ROWS 256

typedef struct xgb {
    sp_backend_host_t host; /* a copy: the host's struct need not outlive load */
    BoosterHandle booster;  /* nthread 1 */
    BoosterHandle parallel; /* nthread n_threads, for batches of PARALLEL_MIN_ROWS or more;
                             * NULL when n_threads is 1 */
    int64_t n_features;
    int64_t width;          /* output values per row: 1, or the class count */
    sp_backend_tensor_desc_t in, out;
    int32_t out_n_dims;     /* dims of the output after the rows: 0 ([rows]) or 1 */
    char predict_cfg[192];  /* the JSON XGBoosterPredictFromDense takes, fixed at load */
    float *scratch;         /* aligned copy of a misaligned input (binary HTTP bodies) */
    size_t scratch_bytes;
} xgb_t;

/* XGBoost's messages start with "[hh:mm:ss] file:line: " and may end in a
 * stack trace: keep the first line, from the part after the source position. */
static const char *
xgb_error(char *buf, size_t len)
{
    const char *e = XGBGetLastError();
    if (e == NULL || !e[0]) {
        return "unknown XGBoost error";
    }
    const char *s = e;
    if (s[0] == '[') {
        const char *p = strstr(s, ": ");
        if (p != NULL && p - s < 160) {
            s = p + 2;
        }
    }
    size_t n = strcspn(s, "\n");
    snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), s);
    return buf;
}

static int
ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The model file: the one the repository resolved, else the only *.json or
 * *.ubj in the version directory. */
static int
find_model(const sp_backend_load_args_t *args, char *path, size_t path_len, char *err,
           size_t err_len)
{
    if (args->model_file != NULL && args->model_file[0]) {
        snprintf(path, path_len, "%s", args->model_file);
        return 0;
    }
    if (args->version_dir == NULL) {
        return sp__bk_errf(err, err_len, "xgboost: neither a model file nor a version directory");
    }
    DIR *d = opendir(args->version_dir);
    if (d == NULL) {
        return sp__bk_errf(err, err_len, "%s: %s", args->version_dir, strerror(errno));
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (ends_with(e->d_name, ".json") || ends_with(e->d_name, ".ubj")) {
            if (n++ == 0) {
                snprintf(path, path_len, "%s/%s", args->version_dir, e->d_name);
            }
        }
    }
    closedir(d);
    if (n != 1) {
        return sp__bk_errf(err, err_len, "%s: %s *.json or *.ubj model file (name one with "
                           "parameters.model_file)", args->version_dir,
                           n == 0 ? "no" : "more than one");
    }
    return 0;
}

/* parameters.feature_names, "a,b,c", against the names stored in the model:
 * a client that sends its columns in another order gets an error at load,
 * not wrong scores. */
static int
check_feature_names(BoosterHandle b, const char *want, int64_t n_features, char *err,
                    size_t err_len)
{
    bst_ulong n = 0;
    const char **names = NULL;
    char xe[256];
    if (XGBoosterGetStrFeatureInfo(b, "feature_name", &n, &names) != 0) {
        return sp__bk_errf(err, err_len, "xgboost: feature names: %s", xgb_error(xe, sizeof xe));
    }
    if (want == NULL) {
        return 0;
    }
    if (n == 0) {
        return sp__bk_errf(err, err_len, "config.json parameters.feature_names: the model "
                           "stores no feature names to check them against");
    }
    const char *p = want;
    for (bst_ulong i = 0; i < n; i++) {
        size_t len = strcspn(p, ",");
        if (strlen(names[i]) != len || strncmp(names[i], p, len) != 0) {
            return sp__bk_errf(err, err_len, "config.json parameters.feature_names: feature %llu "
                               "is \"%.*s\" but the model's is \"%s\"", (unsigned long long)i,
                               (int)(len > 64 ? 64 : len), p, names[i]);
        }
        p += len;
        if (*p == ',') {
            p++;
        } else if (i + 1 < n) {
            return sp__bk_errf(err, err_len, "config.json parameters.feature_names: %llu names "
                               "but the model has %lld features", (unsigned long long)(i + 1),
                               (long long)n_features);
        }
    }
    if (*p != '\0') {
        return sp__bk_errf(err, err_len, "config.json parameters.feature_names: more names than "
                           "the model's %lld features", (long long)n_features);
    }
    return 0;
}

/* The objective and class count, from the booster's JSON configuration: only
 * for the log line, so failures leave "?". */
static void
describe(BoosterHandle b, char *objective, size_t len, int *n_rounds)
{
    snprintf(objective, len, "?");
    *n_rounds = -1;
    XGBoosterBoostedRounds(b, n_rounds);
    bst_ulong n = 0;
    const char *s = NULL;
    if (XGBoosterSaveJsonConfig(b, &n, &s) != 0) {
        return;
    }
    json_t *root = json_loadb(s, (size_t)n, 0, NULL);
    const char *name = json_string_value(
        json_object_get(json_object_get(json_object_get(root, "learner"), "objective"), "name"));
    if (name != NULL) {
        snprintf(objective, len, "%s", name);
    }
    json_decref(root);
}

/* Checks the config's one input against the model: FP32 and n_features wide.
 * With batching, dims exclude the rows ([n_features]); without, they are the
 * whole shape ([rows or -1, n_features]). */
static int
check_input(const sp__bk_config_t *cfg, xgb_t *m, char *err, size_t err_len)
{
    sp_backend_tensor_desc_t *in = &m->in;
    int32_t want_dims = cfg->max_batch_size > 0 ? 1 : 2;
    if (cfg->n_inputs == 0) {
        snprintf(in->name, sizeof in->name, "input__0");
        in->dtype = SP_BT_FP32;
        in->n_dims = want_dims;
        in->dims[0] = want_dims == 1 ? m->n_features : -1;
        in->dims[want_dims - 1] = m->n_features;
        return 0;
    }
    if (cfg->n_inputs > 1) {
        return sp__bk_errf(err, err_len, "config.json input: %d inputs declared, the xgboost "
                           "backend takes one (FP32 [rows, features])", (int)cfg->n_inputs);
    }
    *in = cfg->inputs[0];
    if (in->dtype != SP_BT_FP32) {
        return sp__bk_errf(err, err_len, "config.json input[0].data_type: %s, the xgboost backend "
                           "takes TYPE_FP32", sp__bk_dtype_name(in->dtype));
    }
    char d[128];
    sp__bk_dims_str(in->dims, in->n_dims, d, sizeof d);
    if (in->n_dims != want_dims) {
        return sp__bk_errf(err, err_len, "config.json input[0].dims: %s, expected [%lld] (the "
                           "model's feature count%s)", d, (long long)m->n_features,
                           want_dims == 1 ? "; the batch dimension is implicit with max_batch_size "
                           "> 0" : ", after the rows: max_batch_size is 0");
    }
    int64_t last = in->dims[in->n_dims - 1];
    if (last != m->n_features && last != -1) {
        return sp__bk_errf(err, err_len, "config.json input[0].dims: %s, but the model has %lld "
                           "features", d, (long long)m->n_features);
    }
    return 0;
}

/* The output: FP32, width values per row; declared dims must hold width
 * values ([], [1] or [-1] for one value per row, [n_classes] otherwise). */
static int
check_output(const sp__bk_config_t *cfg, xgb_t *m, char *err, size_t err_len)
{
    sp_backend_tensor_desc_t *out = &m->out;
    int batching = cfg->max_batch_size > 0;
    if (cfg->n_outputs == 0) {
        snprintf(out->name, sizeof out->name, "output__0");
        out->dtype = SP_BT_FP32;
        m->out_n_dims = m->width > 1;
        out->n_dims = 0;
        if (!batching) {
            out->dims[out->n_dims++] = -1;
        }
        if (m->width > 1) {
            out->dims[out->n_dims++] = m->width;
        }
        return 0;
    }
    if (cfg->n_outputs > 1) {
        return sp__bk_errf(err, err_len, "config.json output: %d outputs declared, the xgboost "
                           "backend has one", (int)cfg->n_outputs);
    }
    *out = cfg->outputs[0];
    if (out->dtype != SP_BT_FP32) {
        return sp__bk_errf(err, err_len, "config.json output[0].data_type: %s, the xgboost "
                           "backend returns TYPE_FP32", sp__bk_dtype_name(out->dtype));
    }
    /* Past the rows (the first dim when max_batch_size is 0), at most one dim. */
    int32_t first = batching ? 0 : 1;
    int32_t rest = out->n_dims - first;
    int64_t n = rest == 1 ? out->dims[first] : 1;
    char d[128];
    sp__bk_dims_str(out->dims, out->n_dims, d, sizeof d);
    if (rest < 0 || rest > 1 || (n != -1 && n != m->width)) {
        return sp__bk_errf(err, err_len, "config.json output[0].dims: %s, but the model gives "
                           "%lld value%s per row (%s)", d, (long long)m->width,
                           m->width == 1 ? "" : "s",
                           m->width == 1 ? (batching ? "[] or [1]" : "[-1] or [-1, 1]")
                                         : (batching ? "[n_classes]" : "[-1, n_classes]"));
    }
    m->out_n_dims = rest;
    return 0;
}

/* A booster with the model of `path` (JSON or UBJ, by its extension). */
static int
open_booster(const char *path, int nthread, BoosterHandle *out, char *err, size_t err_len)
{
    char xe[256], n[16];
    BoosterHandle b = NULL;
    *out = NULL;
    if (XGBoosterCreate(NULL, 0, &b) != 0) {
        return sp__bk_errf(err, err_len, "xgboost: %s", xgb_error(xe, sizeof xe));
    }
    if (XGBoosterLoadModel(b, path) != 0) {
        sp__bk_errf(err, err_len, "%s: %s", path, xgb_error(xe, sizeof xe));
        XGBoosterFree(b);
        return -1;
    }
    snprintf(n, sizeof n, "%d", nthread);
    if (XGBoosterSetParam(b, "nthread", n) != 0) {
        sp__bk_errf(err, err_len, "xgboost: nthread %d: %s", nthread, xgb_error(xe, sizeof xe));
        XGBoosterFree(b);
        return -1;
    }
    *out = b;
    return 0;
}

static void
xgb_unload(void *model)
{
    xgb_t *m = model;
    if (m == NULL) {
        return;
    }
    if (m->booster != NULL) {
        XGBoosterFree(m->booster);
    }
    if (m->parallel != NULL) {
        XGBoosterFree(m->parallel);
    }
    free(m->scratch);
    free(m);
}

static int
xgb_load(const sp_backend_host_t *host, const sp_backend_load_args_t *args, void **model,
         sp_backend_model_info_t *info, char *err, size_t err_len)
{
    *model = NULL;
    if (host == NULL || host->alloc_fn == NULL) {
        return sp__bk_errf(err, err_len, "xgboost: the host gave no alloc_fn");
    }
    sp__bk_config_t cfg;
    if (sp__bk_config_parse(args->config_json, &cfg, err, err_len)) {
        return -1;
    }
    /* The server's value (config override merged) decides whether dims include the rows. */
    cfg.max_batch_size = args->max_batch_size;
    int rc = -1;
    char path[4096], xe[256];
    float *probe = NULL;
    xgb_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        sp__bk_errf(err, err_len, "xgboost: out of memory");
        goto done;
    }
    m->host = *host;

    /* Parameters first: a typo fails before the model is read. */
    const char *margin = sp__bk_config_param(&cfg, "output_margin");
    if (margin != NULL && strcmp(margin, "true") != 0 && strcmp(margin, "false") != 0) {
        sp__bk_errf(err, err_len, "config.json parameters.output_margin: \"%.40s\", expected "
                    "\"true\" or \"false\"", margin);
        goto done;
    }
    int type = margin != NULL && strcmp(margin, "true") == 0; /* 1 = margins */
    const char *missing = sp__bk_config_param(&cfg, "missing");
    char missing_json[48] = "NaN";
    if (missing != NULL) {
        char *end = NULL;
        double v = strtod(missing, &end);
        if (end == missing || *end != '\0' || !isfinite(v)) {
            sp__bk_errf(err, err_len, "config.json parameters.missing: \"%.40s\" is not a finite "
                        "number (leave it out for NaN)", missing);
            goto done;
        }
        snprintf(missing_json, sizeof missing_json, "%.9g", (double)(float)v);
    }
    snprintf(m->predict_cfg, sizeof m->predict_cfg,
             "{\"type\": %d, \"training\": false, \"cache_id\": 0, \"iteration_begin\": 0, "
             "\"iteration_end\": 0, \"strict_shape\": false, \"missing\": %s}", type, missing_json);

    if (find_model(args, path, sizeof path, err, err_len)) {
        goto done;
    }
    /* XGBoost's own message for a missing file is a dmlc stack trace. */
    struct stat st;
    if (stat(path, &st) != 0) {
        sp__bk_errf(err, err_len, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        sp__bk_errf(err, err_len, "%s: not a regular file", path);
        goto done;
    }
    int n_threads = args->n_threads > 1 ? (int)args->n_threads : 1;
    if (open_booster(path, 1, &m->booster, err, err_len) ||
        (n_threads > 1 && open_booster(path, n_threads, &m->parallel, err, err_len))) {
        goto done;
    }
    bst_ulong nf = 0;
    if (XGBoosterGetNumFeature(m->booster, &nf) != 0 || nf == 0) {
        sp__bk_errf(err, err_len, "%s: no feature count (%s)", path, xgb_error(xe, sizeof xe));
        goto done;
    }
    m->n_features = (int64_t)nf;
    if (check_feature_names(m->booster, sp__bk_config_param(&cfg, "feature_names"),
                            m->n_features, err, err_len)) {
        goto done;
    }

    /* The output width (1, or the class count for softprob and multi-class
     * margins) is what one row of missing values predicts to. */
    probe = malloc(sizeof *probe * (size_t)m->n_features);
    if (probe == NULL) {
        sp__bk_errf(err, err_len, "xgboost: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < m->n_features; i++) {
        probe[i] = NAN;
    }
    char arr[160];
    snprintf(arr, sizeof arr, "{\"data\": [%" PRIuPTR ", true], \"shape\": [1, %lld], "
             "\"typestr\": \"<f4\", \"version\": 3}", (uintptr_t)probe, (long long)m->n_features);
    const bst_ulong *shape = NULL;
    bst_ulong dim = 0;
    const float *res = NULL;
    if (XGBoosterPredictFromDense(m->booster, arr, m->predict_cfg, NULL, &shape, &dim, &res) != 0) {
        sp__bk_errf(err, err_len, "%s: test prediction: %s", path, xgb_error(xe, sizeof xe));
        goto done;
    }
    m->width = 1;
    for (bst_ulong d = 0; d < dim; d++) {
        m->width *= (int64_t)shape[d];
    }
    if (check_input(&cfg, m, err, err_len) || check_output(&cfg, m, err, err_len)) {
        goto done;
    }

    /* Memory: the trees as UBJ are close to their in-memory size; the rest
     * of a booster is small and fixed. */
    bst_ulong model_bytes = (bst_ulong)st.st_size;
    const char *buf = NULL;
    XGBoosterSaveModelToBuffer(m->booster, "{\"format\": \"ubj\"}", &model_bytes, &buf);
    memset(info, 0, sizeof *info);
    info->n_inputs = info->n_outputs = 1;
    info->inputs[0] = m->in;
    info->outputs[0] = m->out;
    info->memory_bytes = ((uint64_t)model_bytes + 64 * 1024) * (m->parallel ? 2 : 1) + sizeof *m;

    char objective[64];
    int rounds;
    describe(m->booster, objective, sizeof objective, &rounds);
    sp__bk_log(host, 1, "backend=xgboost model=%s version=%lld file=%s objective=%s rounds=%d "
               "features=%lld outputs_per_row=%lld margin=%d threads=%d",
               args->model_name ? args->model_name : "", (long long)args->version, path,
               objective, rounds, (long long)m->n_features, (long long)m->width, type, n_threads);
    *model = m;
    m = NULL;
    rc = 0;
done:
    free(probe);
    xgb_unload(m);
    sp__bk_config_free(&cfg);
    return rc;
}

static int
xgb_execute(void *model, const sp_backend_tensor_t *inputs, int32_t n_inputs,
            sp_backend_tensor_t *outputs, int32_t n_outputs, char *err, size_t err_len)
{
    xgb_t *m = model;
    if (n_inputs != 1) {
        return sp__bk_errf(err, err_len, "xgboost: %d inputs given, the model takes one",
                           (int)n_inputs);
    }
    const sp_backend_tensor_t *x = &inputs[0];
    if (x->dtype != SP_BT_FP32 || x->n_dims != 2 || x->dims[1] != m->n_features ||
        x->dims[0] < 0) {
        char d[128];
        sp__bk_dims_str(x->dims, x->n_dims > 0 && x->n_dims <= SP_BACKEND_MAX_DIMS ? x->n_dims : 0,
                        d, sizeof d);
        return sp__bk_errf(err, err_len, "input \"%s\": %s %s, expected TYPE_FP32 [rows, %lld]",
                           m->in.name, sp__bk_dtype_name(x->dtype), d, (long long)m->n_features);
    }
    int64_t rows = x->dims[0];
    size_t in_bytes = (size_t)rows * (size_t)m->n_features * sizeof(float);
    if (x->bytes != in_bytes) {
        return sp__bk_errf(err, err_len, "input \"%s\": %zu bytes for %lld rows of %lld floats",
                           m->in.name, x->bytes, (long long)rows, (long long)m->n_features);
    }
    for (int32_t o = 0; o < n_outputs; o++) {
        if (strcmp(outputs[o].name, m->out.name) != 0) {
            return sp__bk_errf(err, err_len, "xgboost: no output named \"%s\" (the model's is "
                               "\"%s\")", outputs[o].name, m->out.name);
        }
    }
    size_t out_bytes = (size_t)rows * (size_t)m->width * sizeof(float);
    const float *res = NULL;
    if (rows > 0 && n_outputs > 0) {
        /* Binary tensors in an HTTP body need not be 4-byte aligned; XGBoost
         * reads through float pointers, so such input is copied once. */
        const void *data = x->data;
        if ((uintptr_t)data % sizeof(float) != 0) {
            if (m->scratch_bytes < in_bytes) {
                float *s = realloc(m->scratch, in_bytes);
                if (s == NULL) {
                    return sp__bk_errf(err, err_len, "xgboost: out of memory");
                }
                m->scratch = s;
                m->scratch_bytes = in_bytes;
            }
            memcpy(m->scratch, data, in_bytes);
            data = m->scratch;
        }
        char arr[160], xe[256];
        snprintf(arr, sizeof arr, "{\"data\": [%" PRIuPTR ", true], \"shape\": [%lld, %lld], "
                 "\"typestr\": \"<f4\", \"version\": 3}", (uintptr_t)data, (long long)rows,
                 (long long)m->n_features);
        const bst_ulong *shape = NULL;
        bst_ulong dim = 0;
        BoosterHandle b = m->parallel && rows >= PARALLEL_MIN_ROWS ? m->parallel : m->booster;
        if (XGBoosterPredictFromDense(b, arr, m->predict_cfg, NULL, &shape, &dim, &res) != 0) {
            return sp__bk_errf(err, err_len, "xgboost: %s", xgb_error(xe, sizeof xe));
        }
        uint64_t total = 1;
        for (bst_ulong d = 0; d < dim; d++) {
            total *= shape[d];
        }
        if (total != (uint64_t)rows * (uint64_t)m->width) {
            return sp__bk_errf(err, err_len, "xgboost: %llu values for %lld rows (expected %lld "
                               "per row)", (unsigned long long)total, (long long)rows,
                               (long long)m->width);
        }
    }
    /* XGBoost keeps the result in the booster until its next call: copy it
     * out into host memory, once per requested output (normally one). */
    for (int32_t o = 0; o < n_outputs; o++) {
        sp_backend_tensor_t *out = &outputs[o];
        out->data = m->host.alloc_fn(out_bytes ? out_bytes : 1);
        if (out->data == NULL) {
            return sp__bk_errf(err, err_len, "xgboost: out of memory for %zu bytes", out_bytes);
        }
        if (out_bytes) {
            memcpy(out->data, res, out_bytes);
        }
        out->bytes = out_bytes;
        out->dtype = SP_BT_FP32;
        out->n_dims = 1 + m->out_n_dims;
        out->dims[0] = rows;
        if (m->out_n_dims) {
            out->dims[1] = m->width;
        }
    }
    return 0;
}

static const sp_backend_api_t xgb_api = {
    .abi_version = SP_BACKEND_ABI_VERSION,
    .name = "xgboost",
    .load = xgb_load,
    .execute = xgb_execute,
    .unload = xgb_unload,
};

__attribute__((visibility("default"))) const sp_backend_api_t *
sp_backend_init(uint32_t abi_version)
{
    return abi_version == SP_BACKEND_ABI_VERSION ? &xgb_api : NULL;
}
