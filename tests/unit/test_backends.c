/*
 * test_backends.c - the bundled backend plugins (backends/) through their
 * one exported symbol, as the server loads them: dlopen of
 * $(BUILD)/backends/libsampan_<name>.so beside the running test_unit.
 *
 * identity: round trips of FP32, INT64 and BYTES, config errors.
 * xgboost: the expected predictions of tests/data/xgboost (agaricus and
 * credit-card models, JSON and UBJ) to float tolerance, margins, feature
 * names, and the errors a user sees for a bad file, config or input. Skipped
 * (visibly) when libxgboost-dev was missing at build time.
 */
#include "test.h"

#include <dlfcn.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sampan/backend.h"

#define XGB_DATA "tests/data/xgboost/"

/* ---- helpers ---------------------------------------------------------------- */

static char last_log[512];

static void
test_log(int level, const char *line)
{
    (void)level;
    snprintf(last_log, sizeof last_log, "%s", line);
}

static const sp_backend_host_t host = {
    .abi_version = SP_BACKEND_ABI_VERSION,
    .alloc_fn = malloc,
    .free_fn = free,
    .log_fn = test_log,
};

/* The backend's table, from $(BUILD)/backends/libsampan_<name>.so. A backend
 * that was not built is skipped, saying so. */
static const sp_backend_api_t *
open_backend(const char *name)
{
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 128);
    ASSERT(n > 0);
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    ASSERT(slash != NULL);
    snprintf(slash + 1, 128, "backends/libsampan_%s.so", name);
    if (access(path, R_OK) != 0) {
        if (strcmp(name, "xgboost") == 0) {
            SKIP("%s not built (it needs libxgboost-dev: scripts/deps.sh installs it)", path);
        }
        SKIP("%s not built (make unit builds it)", path);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        SP_TEST_FAIL("dlopen %s: %s", path, dlerror());
    }
    sp_backend_init_fn init = (sp_backend_init_fn)dlsym(h, SP_BACKEND_INIT_SYMBOL);
    ASSERT(init != NULL);
    ASSERT(init(SP_BACKEND_ABI_VERSION + 1) == NULL);
    const sp_backend_api_t *api = init(SP_BACKEND_ABI_VERSION);
    ASSERT(api != NULL);
    ASSERT_EQ(api->abi_version, SP_BACKEND_ABI_VERSION);
    ASSERT_STR_EQ(api->name, name);
    /* Never dlclose: libxgboost keeps OpenMP threads that must not outlive their code. */
    return api;
}

static sp_backend_load_args_t
load_args(const char *model_file, const char *config_json)
{
    return (sp_backend_load_args_t){
        .model_name = "m",
        .version = 1,
        .version_dir = NULL,
        .model_file = model_file,
        .config_json = config_json,
        .max_batch_size = 64,
        .n_threads = 1,
    };
}

/* load expected to fail with a message containing each of the strings. */
static void
load_fails(const sp_backend_api_t *api, const sp_backend_load_args_t *a, const char *want1,
           const char *want2)
{
    void *model = (void *)1;
    sp_backend_model_info_t info;
    char err[512] = "";
    if (api->load(&host, a, &model, &info, err, sizeof err) == 0) {
        SP_TEST_FAIL("load succeeded, expected an error with \"%s\"", want1);
    }
    ASSERT(model == NULL);
    if (strstr(err, want1) == NULL || (want2 && strstr(err, want2) == NULL)) {
        SP_TEST_FAIL("error \"%s\" lacks \"%s\"%s%s", err, want1, want2 ? " / " : "",
                     want2 ? want2 : "");
    }
}

static void *
must_load(const sp_backend_api_t *api, const sp_backend_load_args_t *a,
          sp_backend_model_info_t *info)
{
    void *model = NULL;
    char err[512] = "";
    if (api->load(&host, a, &model, info, err, sizeof err) != 0) {
        SP_TEST_FAIL("load %s: %s", a->model_file ? a->model_file : "(dir)", err);
    }
    ASSERT(model != NULL);
    return model;
}

static void
free_outputs(sp_backend_tensor_t *out, int n)
{
    for (int i = 0; i < n; i++) {
        host.free_fn(out[i].data);
        out[i].data = NULL;
    }
}

static char *
read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) SP_TEST_FAIL("cannot open %s (tests run from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ASSERT(s != NULL);
    ASSERT_EQ(fread(s, 1, (size_t)n, f), n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* ---- identity --------------------------------------------------------------- */

static const char *identity_config =
    "{\"backend\": \"identity\", \"max_batch_size\": 8,"
    " \"input\": [{\"name\": \"IN_F\", \"data_type\": \"TYPE_FP32\", \"dims\": [3]},"
    "             {\"name\": \"IN_I\", \"data_type\": \"TYPE_INT64\", \"dims\": [-1]},"
    "             {\"name\": \"IN_S\", \"data_type\": \"TYPE_STRING\", \"dims\": [1]}],"
    " \"output\": [{\"name\": \"OUT_F\", \"data_type\": \"TYPE_FP32\", \"dims\": [3]},"
    "              {\"name\": \"OUT_I\", \"data_type\": \"TYPE_INT64\", \"dims\": [-1]},"
    "              {\"name\": \"OUT_S\", \"data_type\": \"TYPE_STRING\", \"dims\": [1]}]}";

TEST(backend_identity_round_trip)
{
    const sp_backend_api_t *api = open_backend("identity");
    sp_backend_load_args_t a = load_args(NULL, identity_config);
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    ASSERT(strstr(last_log, "backend=identity") != NULL);
    ASSERT_EQ(info.n_inputs, 3);
    ASSERT_EQ(info.n_outputs, 3);
    ASSERT_STR_EQ(info.outputs[2].name, "OUT_S");
    ASSERT_EQ(info.outputs[2].dtype, SP_BT_BYTES);
    ASSERT_EQ(info.inputs[1].dims[0], -1);
    ASSERT(info.memory_bytes > 0 && info.memory_bytes < 64 * 1024);

    /* Two rows each. BYTES: a little-endian uint32 length, then the bytes. */
    float f[6] = {1.5f, -2, 3, 4, 5e-30f, -0.0f};
    int64_t i64[4] = {INT64_MIN, 7, -1, INT64_MAX};
    unsigned char s[4 + 5 + 4] = {5, 0, 0, 0, 'h', 'e', '\0', 'l', 'o', 0, 0, 0, 0};
    sp_backend_tensor_t in[3] = {
        {.name = "IN_F", .dtype = SP_BT_FP32, .n_dims = 2, .dims = {2, 3}, .data = f,
         .bytes = sizeof f},
        {.name = "IN_I", .dtype = SP_BT_INT64, .n_dims = 2, .dims = {2, 2}, .data = i64,
         .bytes = sizeof i64},
        {.name = "IN_S", .dtype = SP_BT_BYTES, .n_dims = 2, .dims = {2, 1}, .data = s,
         .bytes = sizeof s},
    };
    /* Asked in another order than declared, as a request may. */
    sp_backend_tensor_t out[3] = {{.name = "OUT_S"}, {.name = "OUT_F"}, {.name = "OUT_I"}};
    char err[256] = "";
    if (api->execute(m, in, 3, out, 3, err, sizeof err) != 0) SP_TEST_FAIL("execute: %s", err);
    const sp_backend_tensor_t *src[3] = {&in[2], &in[0], &in[1]};
    for (int o = 0; o < 3; o++) {
        ASSERT_EQ(out[o].dtype, src[o]->dtype);
        ASSERT_EQ(out[o].n_dims, 2);
        ASSERT_EQ(out[o].dims[0], 2);
        ASSERT_EQ(out[o].dims[1], src[o]->dims[1]);
        ASSERT_EQ(out[o].bytes, src[o]->bytes);
        ASSERT(out[o].data != src[o]->data);
        ASSERT(memcmp(out[o].data, src[o]->data, src[o]->bytes) == 0);
    }
    free_outputs(out, 3);

    /* Only one output asked for: only it is filled. */
    sp_backend_tensor_t one = {.name = "OUT_I"};
    ASSERT_OK(api->execute(m, in, 3, &one, 1, err, sizeof err));
    ASSERT(memcmp(one.data, i64, sizeof i64) == 0);
    free_outputs(&one, 1);

    /* An empty batch still returns well-formed outputs. */
    sp_backend_tensor_t empty_in[3] = {in[0], in[1], in[2]};
    for (int k = 0; k < 3; k++) {
        empty_in[k].dims[0] = 0;
        empty_in[k].bytes = 0;
    }
    sp_backend_tensor_t e = {.name = "OUT_F"};
    ASSERT_OK(api->execute(m, empty_in, 3, &e, 1, err, sizeof err));
    ASSERT_EQ(e.bytes, 0);
    ASSERT_EQ(e.dims[0], 0);
    ASSERT(e.data != NULL);
    free_outputs(&e, 1);

    /* Execute errors: an output it does not have, a missing input. */
    sp_backend_tensor_t bad = {.name = "NOPE"};
    ASSERT(api->execute(m, in, 3, &bad, 1, err, sizeof err) != 0);
    ASSERT(strstr(err, "no output named \"NOPE\"") != NULL);
    ASSERT(api->execute(m, in, 2, out, 1, err, sizeof err) != 0);
    ASSERT(strstr(err, "2 inputs given, 3 declared") != NULL);
    in[0].dtype = SP_BT_FP64;
    sp_backend_tensor_t o0 = {.name = "OUT_F"};
    ASSERT(api->execute(m, in, 3, &o0, 1, err, sizeof err) != 0);
    ASSERT(strstr(err, "TYPE_FP64") != NULL);
    api->unload(m);
}

TEST(backend_identity_config)
{
    const sp_backend_api_t *api = open_backend("identity");
    /* No outputs declared: OUTPUT<i>, same type and dims as input i. */
    sp_backend_load_args_t a = load_args(
        NULL, "{\"input\": [{\"name\": \"x\", \"data_type\": \"TYPE_UINT8\", \"dims\": [4, 4]},"
              " {\"name\": \"y\", \"data_type\": \"TYPE_BF16\", \"dims\": [2]}]}");
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    ASSERT_EQ(info.n_outputs, 2);
    ASSERT_STR_EQ(info.outputs[0].name, "OUTPUT0");
    ASSERT_STR_EQ(info.outputs[1].name, "OUTPUT1");
    ASSERT_EQ(info.outputs[0].dtype, SP_BT_UINT8);
    ASSERT_EQ(info.outputs[0].n_dims, 2);
    ASSERT_EQ(info.outputs[1].dtype, SP_BT_BF16);
    api->unload(m);

    a.config_json = "{\"backend\": \"identity\"}";
    load_fails(api, &a, "config.json input", "at least one");
    a.config_json = "{\"input\": [{\"name\": \"x\", \"data_type\": \"TYPE_FP32\", \"dims\": [2]}], "
                    "\"output\": [{\"name\": \"y\", \"data_type\": \"TYPE_INT32\", "
                    "\"dims\": [2]}]}";
    load_fails(api, &a, "output[0].data_type: TYPE_INT32", "TYPE_FP32");
    a.config_json = "{\"input\": [{\"name\": \"x\", \"data_type\": \"TYPE_FP32\", \"dims\": [2]}], "
                    "\"output\": [{\"name\": \"y\", \"data_type\": \"TYPE_FP32\", \"dims\": [3]}]}";
    load_fails(api, &a, "output[0].dims: [3]", "[2]");
    a.config_json = "{\"input\": [{\"name\": \"x\", \"data_type\": \"TYPE_FP9\", \"dims\": [2]}]}";
    load_fails(api, &a, "input[0].data_type", "TYPE_FP9");
    a.config_json = "{\"input\": [";
    load_fails(api, &a, "config.json: not a JSON object", NULL);
}

/* ---- xgboost ---------------------------------------------------------------- */

/* agaricus.txt.test as a dense [rows, 127] matrix, NaN where LibSVM has no entry. */
static float *
read_libsvm(const char *path, int64_t n_features, int64_t *n_rows)
{
    char *text = read_text(path);
    int64_t rows = 0;
    for (const char *p = text; *p; p++) rows += *p == '\n';
    float *x = malloc(sizeof *x * (size_t)(rows * n_features));
    ASSERT(x != NULL);
    for (int64_t i = 0; i < rows * n_features; i++) x[i] = NAN;
    char *line = text;
    for (int64_t r = 0; r < rows; r++) {
        char *end = strchr(line, '\n');
        *end = '\0';
        char *p = line;
        strtol(p, &p, 10); /* the label */
        while (*p == ' ') {
            long idx = strtol(p + 1, &p, 10);
            ASSERT(*p == ':' && idx >= 0 && idx < n_features);
            x[r * n_features + idx] = strtof(p + 1, &p);
        }
        line = end + 1;
    }
    free(text);
    *n_rows = rows;
    return x;
}

static double *
read_preds(const char *path, int64_t n)
{
    char *text = read_text(path), *p = text;
    double *y = malloc(sizeof *y * (size_t)n);
    ASSERT(y != NULL);
    for (int64_t i = 0; i < n; i++) {
        char *end;
        y[i] = strtod(p, &end);
        ASSERT(end != p);
        p = end;
    }
    free(text);
    return y;
}

/* The preds files print %.9g of the float XGBoost computed: equal to 1e-6
 * relative leaves room only for summing the trees in another order. */
static void
expect_close(const float *got, const double *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        if (!(fabs(got[i] - want[i]) <= 1e-6 * fabs(want[i]) + 1e-9)) {
            SP_TEST_FAIL("%s row %lld: %.9g, expected %.9g", what, (long long)i, got[i], want[i]);
        }
    }
}

/* Rows [first, first + rows) through execute; returns the output (malloc). */
static float *
predict(const sp_backend_api_t *api, void *m, const float *x, int64_t first, int64_t rows,
        int64_t n_features, const char *in_name, const char *out_name, int32_t *out_dims)
{
    sp_backend_tensor_t in = {.name = in_name, .dtype = SP_BT_FP32, .n_dims = 2,
                              .dims = {rows, n_features}, .data = (void *)(x + first * n_features),
                              .bytes = sizeof(float) * (size_t)(rows * n_features)};
    sp_backend_tensor_t out = {.name = out_name};
    char err[512] = "";
    if (api->execute(m, &in, 1, &out, 1, err, sizeof err) != 0) SP_TEST_FAIL("execute: %s", err);
    ASSERT_EQ(out.dtype, SP_BT_FP32);
    ASSERT_EQ(out.dims[0], rows);
    if (out_dims) *out_dims = out.n_dims;
    return out.data;
}

TEST(backend_xgboost_agaricus)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    int64_t rows;
    float *x = read_libsvm(XGB_DATA "agaricus.txt.test", 127, &rows);
    ASSERT_EQ(rows, 1611);
    static const char *const models[][2] = {
        {XGB_DATA "agaricus-depth2-2trees.json", XGB_DATA "agaricus-depth2-2trees.test-pred.txt"},
        {XGB_DATA "agaricus-depth2-2trees.ubj", XGB_DATA "agaricus-depth2-2trees.test-pred.txt"},
        {XGB_DATA "agaricus-depth4-20trees.json", XGB_DATA "agaricus-depth4-20trees.test-pred.txt"},
    };
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        double *want = read_preds(models[k][1], rows);
        sp_backend_load_args_t a = load_args(models[k][0], NULL);
        sp_backend_model_info_t info;
        void *m = must_load(api, &a, &info);
        ASSERT(strstr(last_log, "objective=binary:logistic") != NULL);
        ASSERT(strstr(last_log, "features=127") != NULL);
        /* No input or output in the config: the defaults, one probability per row. */
        ASSERT_EQ(info.n_inputs, 1);
        ASSERT_STR_EQ(info.inputs[0].name, "input__0");
        ASSERT_EQ(info.inputs[0].dtype, SP_BT_FP32);
        ASSERT_EQ(info.inputs[0].n_dims, 1);
        ASSERT_EQ(info.inputs[0].dims[0], 127);
        ASSERT_STR_EQ(info.outputs[0].name, "output__0");
        ASSERT_EQ(info.outputs[0].n_dims, 0);
        ASSERT(info.memory_bytes > 64 * 1024);

        /* The whole file as one batch. */
        int32_t nd = 0;
        float *y = predict(api, m, x, 0, rows, 127, "input__0", "output__0", &nd);
        ASSERT_EQ(nd, 1);
        expect_close(y, want, rows, models[k][0]);
        free(y);
        /* Uneven batches give the same rows: 1, 2, 3, ... rows at a time. */
        for (int64_t r = 0, b = 1; r < rows; r += b, b++) {
            int64_t n = r + b <= rows ? b : rows - r;
            y = predict(api, m, x, r, n, 127, "input__0", "output__0", NULL);
            expect_close(y, want + r, n, models[k][0]);
            free(y);
        }
        api->unload(m);
        free(want);
    }
    free(x);
}

/* creditcard-test.csv: row_index, Time, V1..V28, Amount, Class -> x [344, 30]. */
static float *
read_creditcard(int64_t *n_rows, int *labels)
{
    char *text = read_text(XGB_DATA "creditcard-test.csv");
    char *p = strchr(text, '\n') + 1;
    float *x = malloc(sizeof *x * 344 * 30);
    ASSERT(x != NULL);
    int64_t r = 0;
    while (*p && r < 344) {
        strtol(p, &p, 10);
        for (int c = 0; c < 30; c++) {
            ASSERT(*p == ',');
            /* As numpy's astype(float32): the double, rounded once. */
            x[r * 30 + c] = (float)strtod(p + 1, &p);
        }
        ASSERT(*p == ',');
        labels[r] = (int)strtod(p + 1, &p);
        ASSERT(*p == '\n');
        p++;
        r++;
    }
    free(text);
    *n_rows = r;
    return x;
}

static double *
read_creditcard_preds(int64_t n, const int *labels)
{
    char *text = read_text(XGB_DATA "creditcard-depth3-50trees.test-pred.csv");
    char *p = strchr(text, '\n') + 1;
    double *y = malloc(sizeof *y * (size_t)n);
    ASSERT(y != NULL);
    for (int64_t i = 0; i < n; i++) {
        strtol(p, &p, 10);
        long cls = strtol(p + 1, &p, 10);
        ASSERT_EQ(cls, labels[i]);
        y[i] = strtod(p + 1, &p);
        ASSERT(*p == '\n');
        p++;
    }
    free(text);
    return y;
}

static const char *creditcard_names =
    "Time,V1,V2,V3,V4,V5,V6,V7,V8,V9,V10,V11,V12,V13,V14,V15,V16,V17,V18,V19,V20,V21,V22,V23,"
    "V24,V25,V26,V27,V28,Amount";

TEST(backend_xgboost_creditcard)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    int labels[344];
    int64_t rows;
    float *x = read_creditcard(&rows, labels);
    ASSERT_EQ(rows, 344);
    double *want = read_creditcard_preds(rows, labels);
    char config[1024];
    snprintf(config, sizeof config,
             "{\"backend\": \"xgboost\", \"max_batch_size\": 256,"
             " \"input\": [{\"name\": \"transaction\", \"data_type\": \"TYPE_FP32\","
             " \"dims\": [30]}],"
             " \"output\": [{\"name\": \"fraud\", \"data_type\": \"TYPE_FP32\", \"dims\": [1]}],"
             " \"parameters\": {\"feature_names\": {\"string_value\": \"%s\"}}}", creditcard_names);
    const char *files[] = {XGB_DATA "creditcard-depth3-50trees.json",
                           XGB_DATA "creditcard-depth3-50trees.ubj"};
    for (int k = 0; k < 2; k++) {
        sp_backend_load_args_t a = load_args(files[k], config);
        a.n_threads = 2;
        sp_backend_model_info_t info;
        void *m = must_load(api, &a, &info);
        ASSERT(strstr(last_log, "features=30") != NULL);
        ASSERT(strstr(last_log, "rounds=50") != NULL);
        ASSERT_STR_EQ(info.inputs[0].name, "transaction");
        ASSERT_STR_EQ(info.outputs[0].name, "fraud");
        ASSERT_EQ(info.outputs[0].n_dims, 1);
        ASSERT_EQ(info.outputs[0].dims[0], 1);
        int32_t nd = 0;
        float *y = predict(api, m, x, 0, rows, 30, "transaction", "fraud", &nd);
        ASSERT_EQ(nd, 2); /* [rows, 1], as declared */
        expect_close(y, want, rows, files[k]);
        free(y);
        /* One row at a time, the fraud-scoring case. */
        for (int64_t r = 0; r < rows; r += 37) {
            y = predict(api, m, x, r, 1, 30, "transaction", "fraud", NULL);
            expect_close(y, want + r, 1, files[k]);
            free(y);
        }
        api->unload(m);
    }
    free(want);
    free(x);
}

TEST(backend_xgboost_margin)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    int labels[344];
    int64_t rows;
    float *x = read_creditcard(&rows, labels);
    double *want = read_creditcard_preds(rows, labels);
    sp_backend_load_args_t a =
        load_args(XGB_DATA "creditcard-depth3-50trees.json",
                  "{\"max_batch_size\": 8, \"parameters\": {\"output_margin\": "
                  "{\"string_value\": \"true\"}}}");
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    ASSERT(strstr(last_log, "margin=1") != NULL);
    float *y = predict(api, m, x, 0, rows, 30, "input__0", "output__0", NULL);
    /* A margin is the logit: the sigmoid gives back the probability. */
    for (int64_t i = 0; i < rows; i++) {
        double p = 1 / (1 + exp(-(double)y[i]));
        if (!(fabs(p - want[i]) <= 2e-6 * want[i] + 1e-9)) {
            SP_TEST_FAIL("row %lld: margin %.9g -> %.9g, expected %.9g", (long long)i, y[i], p,
                         want[i]);
        }
    }
    free(y);
    api->unload(m);
    free(want);
    free(x);
}

/* Without batching (max_batch_size 0) dims are whole shapes: [-1, 127] in,
 * [-1] out. Also: input not 4-byte aligned, and an empty batch. */
TEST(backend_xgboost_shapes)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    int64_t rows;
    float *x = read_libsvm(XGB_DATA "agaricus.txt.test", 127, &rows);
    double *want = read_preds(XGB_DATA "agaricus-depth2-2trees.test-pred.txt", rows);
    sp_backend_load_args_t a = load_args(XGB_DATA "agaricus-depth2-2trees.json",
                                         "{\"max_batch_size\": 0}");
    a.max_batch_size = 0;
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    ASSERT_EQ(info.inputs[0].n_dims, 2);
    ASSERT_EQ(info.inputs[0].dims[0], -1);
    ASSERT_EQ(info.inputs[0].dims[1], 127);
    ASSERT_EQ(info.outputs[0].n_dims, 1);
    ASSERT_EQ(info.outputs[0].dims[0], -1);

    /* Misaligned: the same 10 rows one byte into a buffer. */
    size_t bytes = sizeof(float) * 10 * 127;
    char *buf = malloc(bytes + 1);
    ASSERT(buf != NULL);
    memcpy(buf + 1, x, bytes);
    sp_backend_tensor_t in = {.name = "input__0", .dtype = SP_BT_FP32, .n_dims = 2,
                              .dims = {10, 127}, .data = buf + 1, .bytes = bytes};
    sp_backend_tensor_t out = {.name = "output__0"};
    char err[512];
    ASSERT_OK(api->execute(m, &in, 1, &out, 1, err, sizeof err));
    ASSERT_EQ(out.n_dims, 1);
    expect_close(out.data, want, 10, "misaligned");
    free_outputs(&out, 1);
    free(buf);

    /* No rows: no call into XGBoost, an empty output. */
    in.dims[0] = 0;
    in.bytes = 0;
    in.data = x;
    ASSERT_OK(api->execute(m, &in, 1, &out, 1, err, sizeof err));
    ASSERT_EQ(out.bytes, 0);
    ASSERT_EQ(out.dims[0], 0);
    free_outputs(&out, 1);
    api->unload(m);
    free(want);
    free(x);
}

/* The repository passes no model_file when parameters name none and it did
 * not resolve one: the backend takes the only *.json / *.ubj of the version. */
TEST(backend_xgboost_version_dir)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    char dir[512], dst[600];
    snprintf(dir, sizeof dir, "%s/1", sp_test_tmpdir());
    ASSERT_OK(mkdir(dir, 0755));
    char *model = read_text(XGB_DATA "agaricus-depth2-2trees.ubj");
    snprintf(dst, sizeof dst, "%s/model.ubj", dir);
    FILE *f = fopen(dst, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(model, 1, 2499, f), 2499);
    fclose(f);
    free(model);
    sp_backend_load_args_t a = load_args(NULL, NULL);
    a.version_dir = dir;
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    ASSERT(strstr(last_log, "model.ubj") != NULL);
    api->unload(m);

    snprintf(dst, sizeof dst, "%s/other.json", dir);
    f = fopen(dst, "w");
    ASSERT(f != NULL);
    fputs("{}", f);
    fclose(f);
    load_fails(api, &a, "more than one *.json or *.ubj", "parameters.model_file");
}

TEST(backend_xgboost_errors)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    const char *cc = XGB_DATA "creditcard-depth3-50trees.json";
    sp_backend_load_args_t a = load_args(XGB_DATA "no-such-model.json", NULL);
    load_fails(api, &a, XGB_DATA "no-such-model.json", "No such file or directory");
    /* Not a model: XGBoost's own message, after the file name. */
    a.model_file = XGB_DATA "README.md";
    load_fails(api, &a, XGB_DATA "README.md: ", NULL);

    a.model_file = cc;
    a.config_json = "{\"max_batch_size\": 4, \"input\": [{\"name\": \"x\", \"data_type\": "
                    "\"TYPE_FP32\", \"dims\": [31]}]}";
    load_fails(api, &a, "config.json input[0].dims: [31]", "the model has 30 features");
    a.config_json = "{\"max_batch_size\": 4, \"input\": [{\"name\": \"x\", \"data_type\": "
                    "\"TYPE_FP32\", \"dims\": [1, 30]}]}";
    load_fails(api, &a, "input[0].dims: [1, 30], expected [30]", "batch dimension is implicit");
    a.config_json = "{\"max_batch_size\": 4, \"input\": [{\"name\": \"x\", \"data_type\": "
                    "\"TYPE_FP64\", \"dims\": [30]}]}";
    load_fails(api, &a, "input[0].data_type: TYPE_FP64", "TYPE_FP32");
    a.config_json = "{\"max_batch_size\": 4, \"output\": [{\"name\": \"y\", \"data_type\": "
                    "\"TYPE_FP32\", \"dims\": [2]}]}";
    load_fails(api, &a, "output[0].dims: [2]", "1 value per row");
    a.config_json = "{\"parameters\": {\"output_margin\": {\"string_value\": \"yes\"}}}";
    load_fails(api, &a, "parameters.output_margin: \"yes\"", NULL);
    a.config_json = "{\"parameters\": {\"feature_names\": {\"string_value\": \"Time,V2\"}}}";
    load_fails(api, &a, "feature_names: feature 1 is \"V2\"", "model's is \"V1\"");
    a.config_json = "{\"parameters\": {\"feature_names\": {\"string_value\": \"Time,V1\"}}}";
    load_fails(api, &a, "feature_names: 2 names", "30 features");
    a.model_file = XGB_DATA "agaricus-depth2-2trees.json";
    load_fails(api, &a, "feature_names", "stores no feature names");

    /* Execute: wrong width, wrong type, wrong byte count, unknown output. */
    a.model_file = cc;
    a.config_json = "{\"max_batch_size\": 4}";
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    float x[2 * 31] = {0};
    sp_backend_tensor_t in = {.name = "input__0", .dtype = SP_BT_FP32, .n_dims = 2,
                              .dims = {2, 31}, .data = x, .bytes = sizeof x};
    sp_backend_tensor_t out = {.name = "output__0"};
    char err[512];
    ASSERT(api->execute(m, &in, 1, &out, 1, err, sizeof err) != 0);
    ASSERT(strstr(err, "TYPE_FP32 [2, 31], expected TYPE_FP32 [rows, 30]") != NULL);
    ASSERT(out.data == NULL);
    in.dims[1] = 30;
    in.dtype = SP_BT_FP64;
    ASSERT(api->execute(m, &in, 1, &out, 1, err, sizeof err) != 0);
    ASSERT(strstr(err, "TYPE_FP64 [2, 30]") != NULL);
    in.dtype = SP_BT_FP32;
    ASSERT(api->execute(m, &in, 1, &out, 1, err, sizeof err) != 0);
    ASSERT(strstr(err, "248 bytes for 2 rows of 30 floats") != NULL);
    in.bytes = sizeof(float) * 60;
    sp_backend_tensor_t bad = {.name = "probability"};
    ASSERT(api->execute(m, &in, 1, &bad, 1, err, sizeof err) != 0);
    ASSERT(strstr(err, "no output named \"probability\"") != NULL);
    ASSERT(api->execute(m, &in, 0, &out, 1, err, sizeof err) != 0);
    ASSERT_OK(api->execute(m, &in, 1, &out, 1, err, sizeof err));
    ASSERT_EQ(out.bytes, 8);
    free_outputs(&out, 1);
    api->unload(m);
}

/* multiclass-depth2-4rounds (make_multiclass.py): multi:softprob, 3 classes,
 * 4 features; its test CSV holds x0..x3 (some "nan"), p0..p2, m0..m2. */
TEST(backend_xgboost_multiclass)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    enum { ROWS = 40 };
    float x[ROWS * 4];
    double prob[ROWS * 3], margin[ROWS * 3];
    char *text = read_text(XGB_DATA "multiclass-depth2-4rounds.test.csv");
    char *p = strchr(text, '\n') + 1;
    for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < 10; c++) {
            char *end;
            double v = strtod(p, &end); /* strtod reads "nan" */
            ASSERT(end != p && *end == (c == 9 ? '\n' : ','));
            if (c < 4) x[r * 4 + c] = (float)v;
            else if (c < 7) prob[r * 3 + c - 4] = v;
            else margin[r * 3 + c - 7] = v;
            p = end + 1;
        }
    }
    free(text);
    ASSERT(isnan(x[1]));

    sp_backend_load_args_t a = load_args(XGB_DATA "multiclass-depth2-4rounds.json", NULL);
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    ASSERT(strstr(last_log, "objective=multi:softprob") != NULL);
    ASSERT(strstr(last_log, "outputs_per_row=3") != NULL);
    ASSERT_EQ(info.outputs[0].n_dims, 1);
    ASSERT_EQ(info.outputs[0].dims[0], 3);
    int32_t nd = 0;
    float *y = predict(api, m, x, 0, ROWS, 4, "input__0", "output__0", &nd);
    ASSERT_EQ(nd, 2); /* [rows, 3] */
    expect_close(y, prob, ROWS * 3, "multiclass probabilities");
    free(y);
    api->unload(m);

    /* Margins: one per class, and a declared [3] output; [-1] would do too. */
    a.config_json = "{\"max_batch_size\": 64, \"output\": [{\"name\": \"scores\", \"data_type\": "
                    "\"TYPE_FP32\", \"dims\": [3]}], \"parameters\": {\"output_margin\": "
                    "{\"string_value\": \"true\"}}}";
    m = must_load(api, &a, &info);
    y = predict(api, m, x, 0, ROWS, 4, "input__0", "scores", &nd);
    ASSERT_EQ(nd, 2);
    expect_close(y, margin, ROWS * 3, "multiclass margins");
    free(y);
    api->unload(m);

    a.config_json = "{\"max_batch_size\": 64, \"output\": [{\"name\": \"scores\", \"data_type\": "
                    "\"TYPE_FP32\", \"dims\": [1]}]}";
    load_fails(api, &a, "output[0].dims: [1]", "3 values per row ([n_classes])");
}

/* parameters.missing: a value that stands for "absent" besides NaN. The
 * agaricus rows with 0 where LibSVM has no entry predict as with NaN. */
TEST(backend_xgboost_missing_value)
{
    const sp_backend_api_t *api = open_backend("xgboost");
    int64_t rows;
    float *x = read_libsvm(XGB_DATA "agaricus.txt.test", 127, &rows);
    for (int64_t i = 0; i < rows * 127; i++) {
        if (isnan(x[i])) x[i] = 0;
    }
    double *want = read_preds(XGB_DATA "agaricus-depth4-20trees.test-pred.txt", rows);
    sp_backend_load_args_t a =
        load_args(XGB_DATA "agaricus-depth4-20trees.json",
                  "{\"parameters\": {\"missing\": {\"string_value\": \"0\"}}}");
    sp_backend_model_info_t info;
    void *m = must_load(api, &a, &info);
    float *y = predict(api, m, x, 0, rows, 127, "input__0", "output__0", NULL);
    expect_close(y, want, rows, "missing=0");
    free(y);
    api->unload(m);
    a.config_json = "{\"parameters\": {\"missing\": {\"string_value\": \"inf\"}}}";
    load_fails(api, &a, "parameters.missing: \"inf\" is not a finite number", NULL);
    free(want);
    free(x);
}
