/* test_repo.c - the model repository (serving/repo_config.h, serving/repo.h) on temporary trees: every
 * config.json field and every config error (each naming file and field), version policies,
 * config overrides, a scan with broken models beside good ones, diffs for poll mode, path
 * traversal (names, versions, symlinks) and the limits. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "serving/repo_config.h"
#include "serving/repo.h"
#include "test.h"

/* ---- helpers: build trees under the test's private directory */

/* snprintf through va_list: paths here are short, and gcc's truncation warning would
 * otherwise fire on every PATH_MAX-sized join. */
static int __attribute__((format(printf, 3, 4)))
spf(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return r;
}

static void
mkdirs(const char *path)
{
    char buf[PATH_MAX];
    spf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    mkdir(buf, 0755);
}

static void
put(const char *root, const char *rel, const char *text)
{
    char path[PATH_MAX], dir[PATH_MAX];
    spf(path, sizeof path, "%s/%s", root, rel);
    spf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    *slash = '\0';
    mkdirs(dir);
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

static const char *
new_repo(const char *tag)
{
    static char path[PATH_MAX];
    spf(path, sizeof path, "%s/%s", sp_test_tmpdir(), tag);
    mkdirs(path);
    return path;
}

#define ASSERT_HAS(hay, needle)                                                                  \
    do {                                                                                         \
        if (!strstr((hay), (needle)))                                                            \
            SP_TEST_FAIL("\"%s\" does not contain \"%s\"", (hay), (needle));                     \
    } while (0)

static sp_status_t
parse_cfg(const char *json, sp_repo_config_t *c, char *err, size_t err_len)
{
    json_t *j = NULL;
    sp_status_t st = sp_repo_config_parse_text(json, strlen(json), "models/m/config.json", &j, err,
                                               err_len);
    if (st) {
        memset(c, 0, sizeof *c);
        return st;
    }
    st = sp_repo_config_from_json(j, "models/m/config.json", c, err, err_len);
    json_decref(j);
    return st;
}

/* ---- config.json */

TEST(repo_config_every_field)
{
    const char *json =
        "{\"name\": \"m\", \"backend\": \"llm\", \"max_batch_size\": 8,"
        " \"input\": [{\"name\": \"text_input\", \"data_type\": \"TYPE_STRING\", \"dims\": [1]},"
        "             {\"name\": \"max_tokens\", \"data_type\": \"TYPE_INT32\", \"dims\": [-1, 4],"
        "              \"optional\": true}],"
        " \"output\": [{\"name\": \"text_output\", \"data_type\": \"TYPE_BF16\", \"dims\": [-1]}],"
        " \"instance_group\": [{\"count\": 2, \"kind\": \"KIND_GPU\", \"gpus\": [0, 3]},"
        "                      {\"name\": \"cpu\", \"kind\": \"KIND_CPU\"}],"
        " \"version_policy\": {\"specific\": {\"versions\": [4, 1]}},"
        " \"dynamic_batching\": {\"max_queue_delay_microseconds\": 500,"
        "                        \"preferred_batch_size\": [4, 8], \"priority_levels\": 3,"
        "                        \"default_priority_level\": 2,"
        "                        \"default_queue_policy\": {\"timeout_action\": \"DELAY\","
        "                          \"default_timeout_microseconds\": 7000,"
        "                          \"allow_timeout_override\": true, \"max_queue_size\": 9},"
        "                        \"priority_queue_policy\": {\"1\": {\"max_queue_size\": 5}}},"
        " \"parameters\": {\"context_length\": {\"string_value\": \"4096\"},"
        "   \"kv_blocks\": {\"string_value\": \"512\"},"
        "   \"chat_template\": {\"string_value\": \"{{ messages }}\"},"
        "   \"model_file\": {\"string_value\": \"w.gguf\"},"
        "   \"max_tokens\": {\"string_value\": \"64\"}, \"top_k\": {\"string_value\": \"40\"},"
        "   \"temperature\": {\"string_value\": \"0.7\"}, \"top_p\": {\"string_value\": \"0.9\"},"
        "   \"min_p\": {\"string_value\": \"0.05\"}, \"repeat_penalty\": {\"string_value\": \"1.1\"},"
        "   \"frequency_penalty\": {\"string_value\": \"-0.5\"},"
        "   \"presence_penalty\": {\"string_value\": \"0.5\"}, \"seed\": {\"string_value\": \"42\"}},"
        " \"load_on_demand\": true}";
    sp_repo_config_t c;
    char err[512] = "";
    sp_status_t st = parse_cfg(json, &c, err, sizeof err);
    if (st) SP_TEST_FAIL("%s", err);
    ASSERT_STR_EQ(c.name, "m");
    ASSERT_EQ(c.backend, SP_REPO_BACKEND_LLM);
    ASSERT_EQ(c.max_batch_size, 8);
    ASSERT_EQ(c.n_inputs, 2);
    ASSERT_STR_EQ(c.input[0].name, "text_input");
    ASSERT_EQ(c.input[0].data_type, SP_REPO_TYPE_STRING);
    ASSERT_EQ(c.input[0].n_dims, 1);
    ASSERT_EQ(c.input[1].dims[0], -1);
    ASSERT_EQ(c.input[1].dims[1], 4);
    ASSERT(c.input[1].optional && !c.input[0].optional);
    ASSERT_EQ(c.n_outputs, 1);
    ASSERT_STR_EQ(sp_repo_config_dtype_name(c.output[0].data_type), "TYPE_BF16");
    ASSERT_EQ(c.n_groups, 2);
    ASSERT_EQ(c.group[0].count, 2);
    ASSERT_EQ(c.group[0].kind, SP_REPO_KIND_GPU);
    ASSERT_EQ(c.group[0].n_gpus, 2);
    ASSERT_EQ(c.group[0].gpus[1], 3);
    ASSERT_EQ(c.group[1].count, 1);
    ASSERT_EQ(c.group[1].kind, SP_REPO_KIND_CPU);
    ASSERT_STR_EQ(c.group[1].name, "cpu");
    ASSERT_EQ(c.version_policy.kind, SP_REPO_POLICY_SPECIFIC);
    ASSERT_EQ(c.version_policy.n_versions, 2);
    ASSERT_EQ(c.version_policy.versions[0], 1); /* sorted */
    ASSERT_EQ(c.version_policy.versions[1], 4);
    ASSERT(c.dynamic_batching.enabled);
    ASSERT_EQ(c.dynamic_batching.max_queue_delay_us, 500);
    ASSERT_EQ(c.dynamic_batching.n_preferred, 2);
    ASSERT_EQ(c.dynamic_batching.preferred[1], 8);
    ASSERT_EQ(c.dynamic_batching.priority_levels, 3);
    ASSERT_EQ(c.dynamic_batching.default_priority_level, 2);
    ASSERT(c.dynamic_batching.default_queue_policy.delay_on_timeout);
    ASSERT_EQ(c.dynamic_batching.default_queue_policy.default_timeout_us, 7000);
    ASSERT(c.dynamic_batching.default_queue_policy.allow_timeout_override);
    ASSERT_EQ(c.dynamic_batching.default_queue_policy.max_queue_size, 9);
    ASSERT(c.dynamic_batching.has_level_policy[0] && !c.dynamic_batching.has_level_policy[1]);
    ASSERT_EQ(c.dynamic_batching.level_policy[0].max_queue_size, 5);
    ASSERT_EQ(c.n_params, 13);
    ASSERT_EQ(c.llm.context_length, 4096);
    ASSERT_EQ(c.llm.kv_blocks, 512);
    ASSERT_STR_EQ(c.llm.chat_template, "{{ messages }}");
    ASSERT_STR_EQ(c.llm.model_file, "w.gguf");
    ASSERT_EQ(c.llm.max_tokens, 64);
    ASSERT_EQ(c.llm.top_k, 40);
    ASSERT_NEAR(c.llm.temperature, 0.7, 1e-12);
    ASSERT_NEAR(c.llm.top_p, 0.9, 1e-12);
    ASSERT_NEAR(c.llm.min_p, 0.05, 1e-12);
    ASSERT_NEAR(c.llm.repeat_penalty, 1.1, 1e-12);
    ASSERT_NEAR(c.llm.frequency_penalty, -0.5, 1e-12);
    ASSERT_NEAR(c.llm.presence_penalty, 0.5, 1e-12);
    ASSERT_EQ(c.llm.seed, 42);
    ASSERT(c.load_on_demand);
    ASSERT_STR_EQ(sp_repo_config_param(&c, "kv_blocks"), "512");
    ASSERT(sp_repo_config_param(&c, "nope") == NULL);
    sp_repo_config_free(&c);

    /* Defaults: an empty object is a valid llm config, latest 1, nothing set. */
    st = parse_cfg("{}", &c, err, sizeof err);
    ASSERT_OK(st);
    ASSERT_EQ(c.backend, SP_REPO_BACKEND_LLM);
    ASSERT_EQ(c.version_policy.kind, SP_REPO_POLICY_LATEST);
    ASSERT_EQ(c.version_policy.num_versions, 1);
    ASSERT_EQ(c.llm.context_length, -1);
    ASSERT(isnan(c.llm.temperature));
    ASSERT(c.llm.chat_template == NULL);
    ASSERT(!c.dynamic_batching.enabled && !c.load_on_demand);
    sp_repo_config_free(&c);

    /* xgboost is known; its parameters are free-form (its backend validates them). */
    st = parse_cfg("{\"backend\": \"xgboost\", \"version_policy\": {\"all\": {}},"
                   " \"parameters\": {\"objective\": {\"string_value\": \"binary\"}}}",
                   &c, err, sizeof err);
    ASSERT_OK(st);
    ASSERT_EQ(c.backend, SP_REPO_BACKEND_XGBOOST);
    ASSERT_EQ(c.version_policy.kind, SP_REPO_POLICY_ALL);
    sp_repo_config_free(&c);

    /* Triton's ONNX Runtime names are the onnx plugin. */
    static const char *const onnx_cfgs[] = {
        "{\"backend\": \"onnx\"}", "{\"backend\": \"onnxruntime\"}",
        "{\"platform\": \"onnxruntime_onnx\"}",
        "{\"platform\": \"onnxruntime_onnx\", \"backend\": \"onnxruntime\"}",
    };
    for (size_t i = 0; i < sizeof onnx_cfgs / sizeof onnx_cfgs[0]; i++) {
        st = parse_cfg(onnx_cfgs[i], &c, err, sizeof err);
        ASSERT_OK(st);
        ASSERT_EQ(c.backend, SP_REPO_BACKEND_PLUGIN);
        ASSERT_STR_EQ(c.backend_name, "onnx");
        sp_repo_config_free(&c);
    }
}

TEST(repo_config_errors_name_file_and_field)
{
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"[1]", "models/m/config.json: must be a JSON object"},
        {"{\"name\": 1", "models/m/config.json: invalid JSON at line 1"},
        {"{\"a\": 1, \"a\": 2}", "models/m/config.json: invalid JSON"},
        {"{\"platform\": \"x\"}", "models/m/config.json: platform: \"x\": unknown platform"},
        {"{\"platform\": \"onnxruntime_onnx\", \"backend\": \"xgboost\"}",
         "backend: \"xgboost\" does not match platform \"onnxruntime_onnx\""},
        {"{\"name\": 7}", "models/m/config.json: name: must be a string"},
        {"{\"name\": \"../x\"}", "models/m/config.json: name: "},
        {"{\"backend\": \"Onnx Runtime\"}", "models/m/config.json: backend: \"Onnx Runtime\" is not a backend name"},
        {"{\"max_batch_size\": -1}", "models/m/config.json: max_batch_size: must be in [0, 65536]"},
        {"{\"max_batch_size\": 1.5}", "max_batch_size: must be an integer"},
        {"{\"input\": {}}", "models/m/config.json: input: must be an array"},
        {"{\"input\": [3]}", "input[0]: must be an object"},
        {"{\"input\": [{\"data_type\": \"TYPE_FP32\", \"dims\": [1]}]}", "input[0].name: is required"},
        {"{\"input\": [{\"name\": \"a\", \"dims\": [1]}]}", "input[0].data_type: is required"},
        {"{\"input\": [{\"name\": \"a\", \"data_type\": \"FP32\", \"dims\": [1]}]}",
         "input[0].data_type: unknown data type \"FP32\""},
        {"{\"input\": [{\"name\": \"a\", \"data_type\": \"TYPE_FP32\"}]}", "input[0].dims: is required"},
        {"{\"input\": [{\"name\": \"a\", \"data_type\": \"TYPE_FP32\", \"dims\": [2, 0]}]}",
         "input[0].dims[1]: must be -1 (variable) or a positive size"},
        {"{\"input\": [{\"name\": \"a\", \"data_type\": \"TYPE_FP32\", \"dims\": [1,1,1,1,1,1,1,1,1]}]}",
         "input[0].dims: more than 8 dimensions"},
        {"{\"input\": [{\"name\": \"a\", \"data_type\": \"TYPE_FP32\", \"dims\": [1], \"formats\": 1}]}",
         "input[0].formats: unknown field"},
        {"{\"input\": [{\"name\": \"a\", \"data_type\": \"TYPE_FP32\", \"dims\": [1], \"optional\": 1}]}",
         "input[0].optional: must be true or false"},
        {"{\"input\": [{\"name\": \"a\", \"data_type\": \"TYPE_FP32\", \"dims\": [1]},"
         " {\"name\": \"a\", \"data_type\": \"TYPE_FP32\", \"dims\": [1]}]}",
         "input[1].name: duplicate tensor name"},
        {"{\"output\": [{\"name\": \"o\", \"data_type\": \"TYPE_FP32\", \"dims\": [1], \"optional\": true}]}",
         "output[0].optional: unknown field"},
        {"{\"instance_group\": [{\"kind\": \"KIND_TPU\"}]}",
         "models/m/config.json: instance_group[0].kind: must be KIND_CPU, KIND_GPU or KIND_AUTO"},
        {"{\"instance_group\": [{}, {\"count\": 0}]}", "instance_group[1].count: must be in [1, 64]"},
        {"{\"instance_group\": [{\"gpus\": [0]}]}", "instance_group[0].gpus: needs kind KIND_GPU"},
        {"{\"instance_group\": [{\"kind\": \"KIND_GPU\", \"gpus\": [0, -1]}]}",
         "instance_group[0].gpus[1]: must be a GPU index"},
        {"{\"instance_group\": [{\"kind\": \"KIND_GPU\", \"gpus\": [1, 1]}]}",
         "instance_group[0].gpus[1]: duplicate GPU 1"},
        {"{\"instance_group\": [{\"host_policy\": \"x\"}]}", "instance_group[0].host_policy: unknown field"},
        {"{\"version_policy\": {}}", "version_policy: must have exactly one of latest, all, specific"},
        {"{\"version_policy\": {\"all\": {}, \"latest\": {\"num_versions\": 1}}}",
         "version_policy: must have exactly one"},
        {"{\"version_policy\": {\"newest\": {}}}", "version_policy.newest: unknown field"},
        {"{\"version_policy\": {\"latest\": {}}}", "version_policy.latest.num_versions: is required"},
        {"{\"version_policy\": {\"latest\": {\"num_versions\": 0}}}",
         "version_policy.latest.num_versions: must be in [1, 1024]"},
        {"{\"version_policy\": {\"all\": {\"x\": 1}}}", "version_policy.all.x: unknown field"},
        {"{\"version_policy\": {\"specific\": {\"versions\": []}}}",
         "version_policy.specific.versions: must be a non-empty array"},
        {"{\"version_policy\": {\"specific\": {\"versions\": [1, 0]}}}",
         "version_policy.specific.versions[1]: must be a version number"},
        {"{\"version_policy\": {\"specific\": {\"versions\": [2, 2]}}}",
         "version_policy.specific.versions: duplicate version 2"},
        {"{\"dynamic_batching\": {\"max_queue_delay_microseconds\": -5}}",
         "dynamic_batching.max_queue_delay_microseconds: must be in [0, 60000000]"},
        {"{\"max_batch_size\": 4, \"dynamic_batching\": {\"preferred_batch_size\": [2, 8]}}",
         "dynamic_batching.preferred_batch_size[1]: must be an integer in [1, 4] (max_batch_size)"},
        {"{\"dynamic_batching\": {\"priority_levels\": 2, \"default_priority_level\": 3}}",
         "dynamic_batching.default_priority_level: must be in [1, 2]"},
        {"{\"dynamic_batching\": {\"default_priority_level\": 1}}",
         "dynamic_batching.default_priority_level: needs priority_levels"},
        {"{\"dynamic_batching\": {\"default_queue_policy\": {\"timeout_action\": \"DROP\"}}}",
         "dynamic_batching.default_queue_policy.timeout_action: must be REJECT or DELAY"},
        {"{\"dynamic_batching\": {\"default_queue_policy\": {\"max_queue_size\": -1}}}",
         "dynamic_batching.default_queue_policy.max_queue_size"},
        {"{\"dynamic_batching\": {\"priority_levels\": 2, \"priority_queue_policy\": {\"3\": {}}}}",
         "dynamic_batching.priority_queue_policy.3: the level must be 1 to priority_levels (2)"},
        {"{\"dynamic_batching\": {\"priority_levels\": 2, \"priority_queue_policy\": {\"1\": {\"x\": 1}}}}",
         "dynamic_batching.priority_queue_policy.1.x: unknown field"},
        {"{\"parameters\": []}", "models/m/config.json: parameters: must be an object"},
        {"{\"parameters\": {\"kv_blocks\": \"9\"}}", "parameters.kv_blocks: must be an object"},
        {"{\"parameters\": {\"kv_blocks\": {\"int_value\": 9}}}",
         "parameters.kv_blocks.int_value: unknown field"},
        {"{\"parameters\": {\"kv_blocks\": {}}}", "parameters.kv_blocks.string_value: is required"},
        {"{\"parameters\": {\"kv_blocks\": {\"string_value\": \"0\"}}}",
         "parameters.kv_blocks.string_value: must be an integer in [1, 16777216]"},
        {"{\"parameters\": {\"context_length\": {\"string_value\": \"4k\"}}}",
         "parameters.context_length.string_value: must be an integer"},
        {"{\"parameters\": {\"top_p\": {\"string_value\": \"1.5\"}}}",
         "parameters.top_p.string_value: must be a number in [0, 1]"},
        {"{\"parameters\": {\"temperature\": {\"string_value\": \"nan\"}}}",
         "parameters.temperature.string_value: must be a number"},
        {"{\"parameters\": {\"model_file\": {\"string_value\": \"../w.gguf\"}}}",
         "parameters.model_file.string_value: name \"../w.gguf\" contains a path separator"},
        {"{\"parameters\": {\"contex_length\": {\"string_value\": \"1\"}}}",
         "parameters.contex_length.string_value: unknown parameter for backend llm"},
        {"{\"parameters\": {\"x\": {\"string_value\": \"a\\u0000b\"}}}",
         "invalid JSON"}, /* jansson refuses \u0000 in strings */
        {"{\"load_on_demand\": \"yes\"}", "models/m/config.json: load_on_demand: must be true or false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sp_repo_config_t c;
        char err[512] = "";
        sp_status_t st = parse_cfg(cases[i].json, &c, err, sizeof err);
        if (st == SP_OK) SP_TEST_FAIL("case %zu accepted: %s", i, cases[i].json);
        ASSERT_EQ(st, SP_ERR_INVALID);
        if (!strstr(err, cases[i].want)) {
            SP_TEST_FAIL("case %zu: \"%s\" does not contain \"%s\"", i, err, cases[i].want);
        }
        sp_repo_config_free(&c);
    }
}

TEST(repo_config_load_file_and_override)
{
    const char *root = new_repo("ov");
    put(root, "m/config.json",
        "{\"name\": \"m\", \"max_batch_size\": 4, \"version_policy\": {\"all\": {}},"
        " \"parameters\": {\"context_length\": {\"string_value\": \"256\"},"
        "                  \"kv_blocks\": {\"string_value\": \"32\"}}}");
    char path[PATH_MAX], err[512] = "";
    spf(path, sizeof path, "%s/m/config.json", root);
    sp_repo_config_t c;
    /* Top-level keys replace the file's; parameters merge key by key; null removes a key. */
    const char *ov = "{\"max_batch_size\": 2, \"version_policy\": {\"latest\": {\"num_versions\": 3}},"
                     " \"parameters\": {\"kv_blocks\": {\"string_value\": \"64\"},"
                     "                  \"context_length\": null,"
                     "                  \"temperature\": {\"string_value\": \"0\"}}}";
    sp_status_t st = sp_repo_config_load(path, "models/m/config.json", ov, strlen(ov), &c, err,
                                         sizeof err);
    if (st) SP_TEST_FAIL("%s", err);
    ASSERT_EQ(c.max_batch_size, 2);
    ASSERT_EQ(c.version_policy.kind, SP_REPO_POLICY_LATEST);
    ASSERT_EQ(c.version_policy.num_versions, 3);
    ASSERT_EQ(c.llm.kv_blocks, 64);
    ASSERT_EQ(c.llm.context_length, -1);
    ASSERT_NEAR(c.llm.temperature, 0, 0);
    ASSERT_EQ(c.n_params, 2);
    sp_repo_config_free(&c);

    /* Parameters into a file that has none: null entries are dropped, not kept. */
    put(root, "np/config.json", "{}");
    spf(path, sizeof path, "%s/np/config.json", root);
    ov = "{\"parameters\": {\"top_k\": {\"string_value\": \"5\"}, \"seed\": null}}";
    st = sp_repo_config_load(path, "models/np/config.json", ov, strlen(ov), &c, err, sizeof err);
    if (st) SP_TEST_FAIL("%s", err);
    ASSERT_EQ(c.n_params, 1);
    ASSERT_EQ(c.llm.top_k, 5);
    sp_repo_config_free(&c);
    spf(path, sizeof path, "%s/m/config.json", root);

    /* The override is validated like the file and named in errors. */
    ov = "{\"instance_group\": [{\"kind\": \"GPU\"}]}";
    st = sp_repo_config_load(path, "models/m/config.json", ov, strlen(ov), &c, err, sizeof err);
    ASSERT_EQ(st, SP_ERR_INVALID);
    ASSERT_HAS(err, "models/m/config.json: instance_group[0].kind: must be KIND_CPU, KIND_GPU or KIND_AUTO");
    sp_repo_config_free(&c);
    ov = "{\"name\": \"other\"}";
    st = sp_repo_config_load(path, "models/m/config.json", ov, strlen(ov), &c, err, sizeof err);
    ASSERT_EQ(st, SP_ERR_INVALID);
    ASSERT_HAS(err, "name: the config override names another model");
    ov = "{\"max_batch_size\": ";
    st = sp_repo_config_load(path, "models/m/config.json", ov, strlen(ov), &c, err, sizeof err);
    ASSERT_EQ(st, SP_ERR_INVALID);
    ASSERT_HAS(err, "models/m/config.json (config override): invalid JSON");
    ov = "[]";
    st = sp_repo_config_load(path, "models/m/config.json", ov, strlen(ov), &c, err, sizeof err);
    ASSERT_EQ(st, SP_ERR_INVALID);
    ASSERT_HAS(err, "config override: must be a JSON object");

    /* Missing file, a directory, too large. */
    st = sp_repo_config_load("/nonexistent/config.json", "x/config.json", NULL, 0, &c, err, sizeof err);
    ASSERT_EQ(st, SP_ERR_NOT_FOUND);
    ASSERT_HAS(err, "x/config.json: ");
    st = sp_repo_config_load(root, "dir", NULL, 0, &c, err, sizeof err);
    ASSERT_EQ(st, SP_ERR_INVALID);
    ASSERT_HAS(err, "dir: not a regular file");
    size_t big = SP_REPO_CONFIG_MAX + 2;
    char *text = sp_malloc(big + 1);
    ASSERT(text != NULL);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 1] = '}';
    text[big] = '\0';
    put(root, "big/config.json", text);
    sp_free(text);
    spf(path, sizeof path, "%s/big/config.json", root);
    st = sp_repo_config_load(path, "models/big/config.json", NULL, 0, &c, err, sizeof err);
    ASSERT_EQ(st, SP_ERR_TOO_LARGE);
    ASSERT_HAS(err, "models/big/config.json: larger than");
}

TEST(repo_config_override_keys_come_from_the_key_dir)
{
    const char *root = new_repo("keys");
    put(root, "m/config.json", "{\"name\": \"m\"}");
    put(root, "kd/good.key", "00");
    char path[PATH_MAX], kd[PATH_MAX], err[512] = "";
    spf(path, sizeof path, "%s/m/config.json", root);
    spf(kd, sizeof kd, "%s/kd", root);
    sp_repo_config_t c;
    sp_enc_key_src_t src;
    /* A load request may not name a path, nor an environment variable. */
    static const char *const refused[] = {
        "{\"parameters\": {\"encryption_key_file\": {\"string_value\": \"/etc/shadow\"}}}",
        "{\"parameters\": {\"encryption_key_file\": {\"string_value\": \"../kd/good.key\"}}}",
        "{\"parameters\": {\"encryption_key_file\": {\"string_value\": \"..\"}}}",
        "{\"parameters\": {\"encryption_key_file\": \"good.key\"}}",
        "{\"parameters\": {\"encryption_key_env\": {\"string_value\": \"HOME\"}}}",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        sp_status_t st = sp_repo_config_load(path, "m/config.json", refused[i], strlen(refused[i]),
                                             &c, err, sizeof err);
        if (st != SP_ERR_INVALID) SP_TEST_FAIL("case %zu accepted: %s", i, refused[i]);
        ASSERT_HAS(err, "m/config.json (config override): parameters.encryption_key_");
        sp_repo_config_free(&c);
    }
    /* A plain name: from the key directory only, and only when there is one. */
    const char *ov =
        "{\"parameters\": {\"encryption_key_file\": {\"string_value\": \"good.key\"}}}";
    ASSERT_OK(sp_repo_config_load(path, "m/config.json", ov, strlen(ov), &c, err, sizeof err));
    ASSERT(c.llm.key_from_request);
    ASSERT_EQ(sp_repo_config_llm_keys_ex(&c, root, "m", NULL, &src, err, sizeof err),
              SP_ERR_INVALID);
    ASSERT_HAS(err, "only when the server has a key directory (--key-dir)");
    ASSERT_OK(sp_repo_config_llm_keys_ex(&c, root, "m", kd, &src, err, sizeof err));
    ASSERT_HAS(src.file, "/kd/good.key");
    sp_repo_config_free(&c);
    ov = "{\"parameters\": {\"encryption_key_file\": {\"string_value\": \"none.key\"}}}";
    ASSERT_OK(sp_repo_config_load(path, "m/config.json", ov, strlen(ov), &c, err, sizeof err));
    ASSERT_EQ(sp_repo_config_llm_keys_ex(&c, root, "m", kd, &src, err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "no such key in the server's key directory");
    ASSERT(strstr(err, kd) == NULL); /* the directory is never named */
    sp_repo_config_free(&c);
    /* config.json itself (the operator's) still names any key file. */
    put(root, "n/config.json",
        "{\"name\": \"n\", \"parameters\": {\"encryption_key_file\": {\"string_value\": "
        "\"/etc/sampan/n.key\"}}}");
    spf(path, sizeof path, "%s/n/config.json", root);
    ASSERT_OK(sp_repo_config_load(path, "n/config.json", NULL, 0, &c, err, sizeof err));
    ASSERT(!c.llm.key_from_request);
    ASSERT_OK(sp_repo_config_llm_keys_ex(&c, root, "n", kd, &src, err, sizeof err));
    ASSERT_STR_EQ(src.file, "/etc/sampan/n.key");
    sp_repo_config_free(&c);
}

/* ---- names, versions, policies */

TEST(repo_names_and_versions)
{
    char err[256];
    ASSERT_OK(sp_repo_path_check_name("llama-3.1_8B", err, sizeof err));
    ASSERT_OK(sp_repo_path_check_name("..a", err, sizeof err));
    ASSERT_EQ(sp_repo_path_check_name("", err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_path_check_name(".", err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_path_check_name("..", err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_path_check_name("../etc", err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "path separator");
    ASSERT_EQ(sp_repo_path_check_name("/etc/passwd", err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_path_check_name("a\\b", err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_path_check_name("a\nb", err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_path_check_name_n("ab\0c", 4, err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "NUL");
    char longname[SP_REPO_NAME_MAX + 2];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    ASSERT_EQ(sp_repo_path_check_name(longname, err, sizeof err), SP_ERR_INVALID);
    longname[SP_REPO_NAME_MAX] = '\0';
    ASSERT_OK(sp_repo_path_check_name(longname, err, sizeof err));

    int64_t v = 0;
    ASSERT_OK(sp_repo_parse_version("17", 2, &v, err, sizeof err));
    ASSERT_EQ(v, 17);
    ASSERT_OK(sp_repo_parse_version("999999999999999", 15, &v, err, sizeof err));
    ASSERT_EQ(v, SP_REPO_VERSION_MAX);
    ASSERT_EQ(sp_repo_parse_version("0", 1, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_parse_version("01", 2, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_parse_version("-1", 2, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_parse_version("1/..", 4, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_parse_version("1000000000000000", 16, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_repo_parse_version("", 0, &v, err, sizeof err), SP_ERR_INVALID);
}

TEST(repo_version_policies)
{
    const int64_t avail[] = {1, 2, 5, 9};
    int32_t idx[8], nm = -1;
    int64_t missing[8];
    sp_repo_version_policy_t vp = {.kind = SP_REPO_POLICY_LATEST, .num_versions = 2};
    ASSERT_EQ(sp_repo_select_versions(&vp, avail, 4, idx, missing, &nm), 2);
    ASSERT_EQ(avail[idx[0]], 5);
    ASSERT_EQ(avail[idx[1]], 9);
    ASSERT_EQ(nm, 0);
    vp.num_versions = 10; /* more than there are: all of them */
    ASSERT_EQ(sp_repo_select_versions(&vp, avail, 4, idx, missing, &nm), 4);
    vp = (sp_repo_version_policy_t){.kind = SP_REPO_POLICY_ALL};
    ASSERT_EQ(sp_repo_select_versions(&vp, avail, 4, idx, missing, &nm), 4);
    ASSERT_EQ(sp_repo_select_versions(&vp, avail, 0, idx, missing, &nm), 0);
    vp = (sp_repo_version_policy_t){.kind = SP_REPO_POLICY_SPECIFIC, .n_versions = 3,
                                    .versions = {2, 3, 9}};
    ASSERT_EQ(sp_repo_select_versions(&vp, avail, 4, idx, missing, &nm), 2);
    ASSERT_EQ(avail[idx[0]], 2);
    ASSERT_EQ(avail[idx[1]], 9);
    ASSERT_EQ(nm, 1);
    ASSERT_EQ(missing[0], 3);

    /* The same policies on disk: 4 versions, each with one gguf. */
    const char *root = new_repo("pol");
    const char *vs[] = {"1", "2", "10", "3"};
    const char *models[] = {"latest2", "all", "specific", "dflt"};
    const char *cfgs[] = {
        "{\"version_policy\": {\"latest\": {\"num_versions\": 2}}}",
        "{\"version_policy\": {\"all\": {}}}",
        "{\"version_policy\": {\"specific\": {\"versions\": [2, 7]}}}",
        "{}",
    };
    char rel[256];
    for (int m = 0; m < 4; m++) {
        spf(rel, sizeof rel, "%s/config.json", models[m]);
        put(root, rel, cfgs[m]);
        for (int k = 0; k < 4; k++) {
            spf(rel, sizeof rel, "%s/%s/model.gguf", models[m], vs[k]);
            put(root, rel, "GGUF");
        }
        spf(rel, sizeof rel, "%s/notaversion/x.gguf", models[m]);
        put(root, rel, "ignored");
        spf(rel, sizeof rel, "%s/007/x.gguf", models[m]); /* leading zero: not a version */
        put(root, rel, "ignored");
        spf(rel, sizeof rel, "%s/99", models[m]); /* a file, not a directory */
        put(root, rel, "ignored");
    }
    sp_repo_scan_t *s = NULL;
    char err[512] = "";
    ASSERT_OK(sp_repo_scan(root, NULL, &s, err, sizeof err));
    ASSERT_EQ(s->n_models, 4);
    const sp_repo_model_t *m = sp_repo_find(s, "latest2");
    ASSERT(m && m->ok);
    ASSERT_EQ(m->n_versions, 2);
    ASSERT_EQ(m->versions[0].version, 3); /* numeric order: 10 is the latest */
    ASSERT_EQ(m->versions[1].version, 10);
    ASSERT(m->versions[1].model_path && strstr(m->versions[1].model_path, "/latest2/10/model.gguf"));
    m = sp_repo_find(s, "all");
    ASSERT_EQ(m->n_versions, 4);
    m = sp_repo_find(s, "dflt");
    ASSERT_EQ(m->n_versions, 1);
    ASSERT_EQ(m->versions[0].version, 10);
    m = sp_repo_find(s, "specific");
    ASSERT_EQ(m->n_versions, 2);
    ASSERT_EQ(m->versions[0].version, 2);
    ASSERT(m->versions[0].model_path != NULL && m->versions[0].reason[0] == '\0');
    ASSERT_EQ(m->versions[1].version, 7);
    ASSERT(m->versions[1].model_path == NULL);
    ASSERT_HAS(m->versions[1].reason, "/specific: version 7 not found");
    sp_repo_scan_free(s);
}

/* ---- scan, index */

TEST(repo_scan_broken_models_beside_good_ones)
{
    const char *root = new_repo("scan");
    put(root, "good/config.json", "{\"name\": \"good\", \"backend\": \"llm\"}");
    put(root, "good/1/m.gguf", "GGUF");
    put(root, "good/1/README", "not a model file");
    put(root, "badkind/config.json", "{\"instance_group\": [{\"kind\": \"KIND_TPU\"}]}");
    put(root, "badkind/1/m.gguf", "GGUF");
    put(root, "badjson/config.json", "{\"name\": ");
    put(root, "wrongname/config.json", "{\"name\": \"other\"}");
    put(root, "noversions/config.json", "{}");
    put(root, "nofile/config.json", "{}");
    put(root, "nofile/1/weights.bin", "x");
    put(root, "twofiles/config.json", "{}");
    put(root, "twofiles/1/a.gguf", "x");
    put(root, "twofiles/1/b.gguf", "x");
    put(root, "named/config.json", "{\"parameters\": {\"model_file\": {\"string_value\": \"b.gguf\"}}}");
    put(root, "named/1/a.gguf", "x");
    put(root, "named/1/b.gguf", "x");
    put(root, "missingnamed/config.json",
        "{\"parameters\": {\"model_file\": {\"string_value\": \"c.gguf\"}}}");
    put(root, "missingnamed/1/a.gguf", "x");
    put(root, "notamodel/1/a.gguf", "no config: listed with the reason, as Triton does");
    put(root, ".hidden/config.json", "{}");
    put(root, "README.md", "a file at the top level");

    sp_repo_scan_t *s = NULL;
    char err[512] = "", label[PATH_MAX + 64];
    ASSERT_OK(sp_repo_scan(root, NULL, &s, err, sizeof err));
    ASSERT_EQ(s->n_models, 10);
    ASSERT_STR_EQ(s->models[0].name, "badjson"); /* sorted */

    const sp_repo_model_t *m = sp_repo_find(s, "good");
    ASSERT(m->ok && m->n_versions == 1 && m->versions[0].model_path);
    ASSERT(sp_repo_find(s, ".hidden") == NULL);
    m = sp_repo_find(s, "notamodel");
    ASSERT(m && !m->ok);
    ASSERT_HAS(m->reason, "/notamodel: no config.pbtxt or config.json");

    m = sp_repo_find(s, "badkind");
    ASSERT(!m->ok);
    spf(label, sizeof label, "%s/badkind/config.json: instance_group[0].kind: must be KIND_CPU, KIND_GPU or KIND_AUTO", root);
    ASSERT_STR_EQ(m->reason, label);
    m = sp_repo_find(s, "badjson");
    ASSERT(!m->ok);
    ASSERT_HAS(m->reason, "/badjson/config.json: invalid JSON at line 1");
    m = sp_repo_find(s, "wrongname");
    ASSERT(!m->ok);
    ASSERT_HAS(m->reason, "/wrongname/config.json: name: \"other\" does not match the directory \"wrongname\"");
    m = sp_repo_find(s, "noversions");
    ASSERT(m->ok && m->n_versions == 0);
    ASSERT_HAS(m->reason, "/noversions: no version directories");
    m = sp_repo_find(s, "nofile");
    ASSERT(m->ok && m->n_versions == 1 && !m->versions[0].model_path);
    ASSERT_HAS(m->versions[0].reason, "/nofile/1: no *.gguf model file");
    m = sp_repo_find(s, "twofiles");
    ASSERT_HAS(m->versions[0].reason, "/twofiles/1: more than one *.gguf file");
    m = sp_repo_find(s, "named");
    ASSERT(m->versions[0].model_path && strstr(m->versions[0].model_path, "/named/1/b.gguf"));
    m = sp_repo_find(s, "missingnamed");
    ASSERT_HAS(m->versions[0].reason, "/missingnamed/1: model_file \"c.gguf\" not found");

    /* The index: one entry per version, or one per model that has none servable. */
    sp_repo_index_entry_t *ix = NULL;
    int32_t n = 0;
    ASSERT_OK(sp_repo_index(s, &ix, &n));
    ASSERT_EQ(n, 10);
    int seen_good = 0;
    for (int32_t i = 0; i < n; i++) {
        ASSERT_EQ(ix[i].state, SP_REPO_UNAVAILABLE); /* nothing loads in a scan */
        if (strcmp(ix[i].name, "good") == 0) {
            seen_good = 1;
            ASSERT_EQ(ix[i].version, 1);
            ASSERT_STR_EQ(ix[i].reason, "");
        }
        if (strcmp(ix[i].name, "badkind") == 0) {
            ASSERT_EQ(ix[i].version, 0);
            ASSERT_HAS(ix[i].reason, "instance_group[0].kind");
        }
    }
    ASSERT(seen_good);
    ASSERT_STR_EQ(sp_repo_state_name(SP_REPO_READY), "READY");
    ASSERT_STR_EQ(sp_repo_state_name(SP_REPO_LOADING), "LOADING");
    ASSERT_STR_EQ(sp_repo_state_name(ix[0].state), "UNAVAILABLE");
    sp_free(ix);
    sp_repo_scan_free(s);

    /* An unusable root fails the scan itself. */
    ASSERT_EQ(sp_repo_scan("/nonexistent/repo", NULL, &s, err, sizeof err), SP_ERR_NOT_FOUND);
    ASSERT_HAS(err, "model repository /nonexistent/repo: ");
    char file[PATH_MAX];
    spf(file, sizeof file, "%s/README.md", root);
    ASSERT_EQ(sp_repo_scan(file, NULL, &s, err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "not a directory");
}

/* ---- diff */

static void
touch_later(const char *root, const char *rel, const char *text)
{
    /* mtime alone may not move within a coarse clock tick; the size changes too. */
    put(root, rel, text);
    char path[PATH_MAX];
    spf(path, sizeof path, "%s/%s", root, rel);
    struct timespec ts[2] = {{.tv_sec = time(NULL) + 100}, {.tv_sec = time(NULL) + 100}};
    ASSERT_OK(utimensat(AT_FDCWD, path, ts, 0));
}

static int
find_change(const sp_repo_change_t *c, int32_t n, sp_repo_change_kind_t k, const char *name,
            int64_t v)
{
    for (int32_t i = 0; i < n; i++) {
        if (c[i].kind == k && strcmp(c[i].name, name) == 0 && c[i].version == v) return 1;
    }
    return 0;
}

TEST(repo_diff_added_changed_removed)
{
    const char *root = new_repo("diff");
    put(root, "a/config.json", "{\"version_policy\": {\"all\": {}}}");
    put(root, "a/1/m.gguf", "v1");
    put(root, "a/2/m.gguf", "v2");
    put(root, "b/config.json", "{}");
    put(root, "b/1/m.gguf", "b1");
    put(root, "c/config.json", "{}");
    put(root, "c/1/m.gguf", "c1");
    sp_repo_scan_t *s1 = NULL, *s2 = NULL, *s3 = NULL;
    char err[512];
    ASSERT_OK(sp_repo_scan(root, NULL, &s1, err, sizeof err));

    sp_repo_change_t *ch = NULL;
    int32_t n = -1;
    ASSERT_OK(sp_repo_diff(NULL, s1, &ch, &n)); /* first scan: everything added */
    ASSERT_EQ(n, 7);
    ASSERT(find_change(ch, n, SP_REPO_ADDED, "a", 0) && find_change(ch, n, SP_REPO_ADDED, "a", 2));
    sp_free(ch);
    ASSERT_OK(sp_repo_scan(root, NULL, &s2, err, sizeof err));
    ASSERT_OK(sp_repo_diff(s1, s2, &ch, &n)); /* nothing moved */
    ASSERT_EQ(n, 0);
    sp_free(ch);

    /* a: version 3 added, version 1 removed, version 2's file replaced; b: config changed;
     * c: removed; d: added. */
    put(root, "a/3/m.gguf", "v3");
    char path[PATH_MAX];
    spf(path, sizeof path, "%s/a/1/m.gguf", root);
    ASSERT_OK(unlink(path));
    spf(path, sizeof path, "%s/a/1", root);
    ASSERT_OK(rmdir(path));
    touch_later(root, "a/2/m.gguf", "v2, retrained");
    touch_later(root, "b/config.json", "{\"max_batch_size\": 2}");
    spf(path, sizeof path, "%s/c/1/m.gguf", root);
    ASSERT_OK(unlink(path));
    spf(path, sizeof path, "%s/c/1", root);
    ASSERT_OK(rmdir(path));
    spf(path, sizeof path, "%s/c/config.json", root);
    ASSERT_OK(unlink(path));
    spf(path, sizeof path, "%s/c", root);
    ASSERT_OK(rmdir(path)); /* a directory left without a config would be a broken model */
    put(root, "d/config.json", "{}");
    put(root, "d/4/m.gguf", "d4");

    ASSERT_OK(sp_repo_scan(root, NULL, &s3, err, sizeof err));
    ASSERT_OK(sp_repo_diff(s2, s3, &ch, &n));
    ASSERT(find_change(ch, n, SP_REPO_REMOVED, "a", 1));
    ASSERT(find_change(ch, n, SP_REPO_CHANGED, "a", 2));
    ASSERT(find_change(ch, n, SP_REPO_ADDED, "a", 3));
    ASSERT(!find_change(ch, n, SP_REPO_CHANGED, "a", 0)); /* a's config did not change */
    ASSERT(find_change(ch, n, SP_REPO_CHANGED, "b", 0));
    ASSERT(!find_change(ch, n, SP_REPO_CHANGED, "b", 1)); /* b's version did not */
    ASSERT(find_change(ch, n, SP_REPO_REMOVED, "c", 0));
    ASSERT(find_change(ch, n, SP_REPO_REMOVED, "c", 1));
    ASSERT(find_change(ch, n, SP_REPO_ADDED, "d", 0));
    ASSERT(find_change(ch, n, SP_REPO_ADDED, "d", 4));
    ASSERT_EQ(n, 8);
    sp_free(ch);

    /* Version policy moves: latest 1 with a new version 5 drops 4 and adds 5. */
    put(root, "d/5/m.gguf", "d5");
    sp_repo_scan_t *s4 = NULL;
    ASSERT_OK(sp_repo_scan(root, NULL, &s4, err, sizeof err));
    ASSERT_OK(sp_repo_diff(s3, s4, &ch, &n));
    ASSERT_EQ(n, 2);
    ASSERT(find_change(ch, n, SP_REPO_REMOVED, "d", 4) && find_change(ch, n, SP_REPO_ADDED, "d", 5));
    sp_free(ch);
    sp_repo_scan_free(s1);
    sp_repo_scan_free(s2);
    sp_repo_scan_free(s3);
    sp_repo_scan_free(s4);
}

/* ---- path safety */

TEST(repo_path_traversal_refused)
{
    const char *base = sp_test_tmpdir();
    char outside[PATH_MAX], target[PATH_MAX], link[PATH_MAX], err[512];
    const char *root = new_repo("trav/repo");
    spf(outside, sizeof outside, "%s/trav/outside", base);
    put(outside, "evil/config.json", "{}");
    put(outside, "evil/1/m.gguf", "secret");
    put(outside, "w.gguf", "secret weights");

    put(root, "ok/config.json", "{}");
    put(root, "ok/1/m.gguf", "x");
    put(root, "shared/blob.gguf", "shared weights");
    /* Symlinks that resolve outside: a model, a version directory, a model file. */
    spf(target, sizeof target, "%s/evil", outside);
    spf(link, sizeof link, "%s/evil", root);
    ASSERT_OK(symlink(target, link));
    put(root, "vlink/config.json", "{}");
    spf(target, sizeof target, "%s/evil/1", outside);
    spf(link, sizeof link, "%s/vlink/1", root);
    ASSERT_OK(symlink(target, link));
    put(root, "flink/config.json", "{}");
    mkdirs(strcat(strcpy(target, root), "/flink/1"));
    spf(target, sizeof target, "%s/w.gguf", outside);
    spf(link, sizeof link, "%s/flink/1/m.gguf", root);
    ASSERT_OK(symlink(target, link));
    /* Symlinks that stay inside the repository are fine. */
    spf(link, sizeof link, "%s/alias", root);
    ASSERT_OK(symlink("ok", link));
    put(root, "inlink/config.json", "{}");
    mkdirs(strcat(strcpy(target, root), "/inlink/1"));
    spf(link, sizeof link, "%s/inlink/1/m.gguf", root);
    ASSERT_OK(symlink("../../shared/blob.gguf", link));

    sp_repo_scan_t *s = NULL;
    ASSERT_OK(sp_repo_scan(root, NULL, &s, err, sizeof err));
    const sp_repo_model_t *m = sp_repo_find(s, "evil");
    ASSERT(m && !m->ok);
    ASSERT_HAS(m->reason, "evil/config.json: resolves outside the repository");
    m = sp_repo_find(s, "vlink");
    ASSERT(m->ok && m->n_versions == 1 && !m->versions[0].model_path);
    ASSERT_HAS(m->versions[0].reason, "vlink/1: resolves outside the repository");
    m = sp_repo_find(s, "flink");
    ASSERT(m->ok && !m->versions[0].model_path);
    ASSERT_HAS(m->versions[0].reason, "flink/1/m.gguf: resolves outside the repository");
    m = sp_repo_find(s, "alias");
    ASSERT(m && m->ok && m->versions[0].model_path);
    ASSERT(strstr(m->versions[0].model_path, "/ok/1/m.gguf"));
    m = sp_repo_find(s, "inlink");
    ASSERT(m->ok && m->versions[0].model_path);
    ASSERT(strstr(m->versions[0].model_path, "/shared/blob.gguf"));
    sp_repo_scan_free(s);

    /* Names from requests. */
    sp_repo_model_t one;
    static const char *const bad[] = {"../outside/evil", "..", "/etc", "ok/1", "a\\b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sp_status_t st = sp_repo_scan_model(root, bad[i], strlen(bad[i]), NULL, NULL, 0, &one, err,
                                            sizeof err);
        if (st != SP_ERR_INVALID) SP_TEST_FAIL("\"%s\" gave %d", bad[i], (int)st);
        ASSERT_HAS(err, "model name: ");
    }
    ASSERT_EQ(sp_repo_scan_model(root, "ok\0../x", 7, NULL, NULL, 0, &one, err, sizeof err),
              SP_ERR_INVALID);
    ASSERT_HAS(err, "NUL");
    ASSERT_EQ(sp_repo_scan_model(root, "evil", 4, NULL, NULL, 0, &one, err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "evil: resolves outside the repository");
    ASSERT_EQ(sp_repo_scan_model(root, "nothere", 7, NULL, NULL, 0, &one, err, sizeof err),
              SP_ERR_NOT_FOUND);
    ASSERT_HAS(err, "model \"nothere\" not found");

    /* A load request with an override re-reads one model. */
    const char *ov = "{\"parameters\": {\"kv_blocks\": {\"string_value\": \"8\"}}}";
    ASSERT_OK(sp_repo_scan_model(root, "ok", 2, NULL, ov, strlen(ov), &one, err, sizeof err));
    ASSERT(one.ok && one.cfg.llm.kv_blocks == 8 && one.n_versions == 1);
    sp_repo_model_free(&one);
    ov = "{\"max_batch_size\": \"x\"}";
    ASSERT_OK(sp_repo_scan_model(root, "ok", 2, NULL, ov, strlen(ov), &one, err, sizeof err));
    ASSERT(!one.ok);
    ASSERT_HAS(one.reason, "ok/config.json: max_batch_size: must be an integer");
    sp_repo_model_free(&one);

    /* resolve() directly: an absolute component cannot escape either. */
    char rr[PATH_MAX], out[PATH_MAX];
    ASSERT(realpath(root, rr) != NULL);
    ASSERT_EQ(sp_repo_path_resolve(rr, "../outside/w.gguf", out, sizeof out, err, sizeof err),
              SP_ERR_INVALID);
    ASSERT_OK(sp_repo_path_resolve(rr, "alias/1/m.gguf", out, sizeof out, err, sizeof err));
}

/* ---- limits */

TEST(repo_limits)
{
    const char *root = new_repo("lim");
    char rel[128], err[512];
    for (int i = 0; i < 5; i++) {
        spf(rel, sizeof rel, "m%d/config.json", i);
        put(root, rel, "{\"version_policy\": {\"all\": {}}}");
    }
    for (int v = 1; v <= 6; v++) {
        spf(rel, sizeof rel, "m0/%d/x.gguf", v);
        put(root, rel, "x");
    }
    for (int f = 0; f < 6; f++) {
        spf(rel, sizeof rel, "m1/1/f%d.bin", f);
        put(root, rel, "x");
    }
    put(root, "m2/config.json", "{\"parameters\": {\"chat_template\": {\"string_value\": \"" 
        "0123456789012345678901234567890123456789\"}}}");
    put(root, "m2/1/x.gguf", "x");

    sp_repo_limits_t lim;
    sp_repo_limits_default(&lim);
    ASSERT_EQ(lim.max_models, 1024);
    lim.max_models = 4;
    sp_repo_scan_t *s = NULL;
    ASSERT_EQ(sp_repo_scan(root, &lim, &s, err, sizeof err), SP_ERR_TOO_LARGE);
    ASSERT_HAS(err, "more than 4 models");
    ASSERT(s == NULL);

    lim.max_models = 5;
    lim.max_versions = 5;
    lim.max_files = 5;
    lim.max_config_bytes = 64;
    ASSERT_OK(sp_repo_scan(root, &lim, &s, err, sizeof err));
    const sp_repo_model_t *m = sp_repo_find(s, "m0");
    ASSERT(!m->ok);
    ASSERT_HAS(m->reason, "/m0: more than 5 version directories");
    m = sp_repo_find(s, "m1");
    ASSERT_HAS(m->versions[0].reason, "/m1/1: more than 5 files");
    m = sp_repo_find(s, "m2");
    ASSERT(!m->ok);
    ASSERT_HAS(m->reason, "/m2/config.json: larger than 64 bytes");
    sp_repo_scan_free(s);

    /* Fixed caps inside a config. */
    sp_repo_config_t c;
    char json[4096];
    int o = spf(json, sizeof json, "{\"input\": [");
    for (int i = 0; i <= SP_REPO_MAX_TENSORS; i++) {
        o += spf(json + o, sizeof json - (size_t)o,
                      "%s{\"name\": \"t%d\", \"data_type\": \"TYPE_FP32\", \"dims\": [1]}",
                      i ? "," : "", i);
    }
    spf(json + o, sizeof json - (size_t)o, "]}");
    ASSERT_EQ(parse_cfg(json, &c, err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "input: more than 16 entries");
    sp_repo_config_free(&c);
    o = spf(json, sizeof json, "{\"parameters\": {");
    for (int i = 0; i <= SP_REPO_MAX_PARAMS; i++) {
        o += spf(json + o, sizeof json - (size_t)o, "%s\"p%d\": {\"string_value\": \"1\"}",
                      i ? "," : "", i);
    }
    spf(json + o, sizeof json - (size_t)o, "}, \"backend\": \"xgboost\"}");
    ASSERT_EQ(parse_cfg(json, &c, err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "parameters: more than 64 entries");
    sp_repo_config_free(&c);
    char longname[SP_REPO_NAME_MAX + 40];
    memset(longname, 'n', sizeof longname);
    longname[SP_REPO_NAME_MAX + 1] = '\0';
    spf(json, sizeof json, "{\"name\": \"%s\"}", longname);
    ASSERT_EQ(parse_cfg(json, &c, err, sizeof err), SP_ERR_INVALID);
    ASSERT_HAS(err, "name: longer than 128 bytes");
    sp_repo_config_free(&c);
}

/* ---- allocation failures: every step of a scan cleans up (ASan reports leaks) */

TEST(repo_scan_survives_allocation_failures)
{
    const char *root = new_repo("oom");
    put(root, "a/config.json", "{\"version_policy\": {\"all\": {}},"
                               " \"parameters\": {\"kv_blocks\": {\"string_value\": \"8\"}}}");
    put(root, "a/1/m.gguf", "x");
    put(root, "a/2/m.gguf", "x");
    put(root, "b/config.json", "{\"version_policy\": {\"specific\": {\"versions\": [1, 3]}}}");
    put(root, "b/1/m.gguf", "x");
    char err[512];
    int ok = 0;
    for (int64_t n = 0; n < 400 && !ok; n++) {
        sp_repo_scan_t *s = NULL;
        sp_alloc_fail_after(n);
        sp_status_t st = sp_repo_scan(root, NULL, &s, err, sizeof err);
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            ASSERT_EQ(s->n_models, 2);
            sp_repo_change_t *ch = NULL;
            int32_t nc = 0;
            ASSERT_OK(sp_repo_diff(NULL, s, &ch, &nc));
            sp_free(ch);
            sp_repo_scan_free(s);
            ok = 1;
        } else {
            ASSERT_EQ(st, SP_ERR_NOMEM);
            ASSERT(s == NULL);
        }
    }
    ASSERT(ok);
}
