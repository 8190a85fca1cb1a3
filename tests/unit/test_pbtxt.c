/* test_pbtxt.c - config.pbtxt (serving/pbtxt.h, serving/repo_pbtxt.h): Triton's documented
 * configs parsed into the same config as config.json, every construct of the text format, a
 * table of bad files whose errors name file, line, column and field, the bounds, and the
 * ModelConfig printed back as Triton's JSON. */
#include <limits.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "serving/pbtxt.h"
#include "serving/repo.h"
#include "serving/repo_config.h"
#include "serving/repo_pbtxt.h"
#include "test.h"

#define ASSERT_HAS(hay, needle)                                                                  \
    do {                                                                                         \
        if (!strstr((hay), (needle)))                                                            \
            SP_TEST_FAIL("\"%s\" does not contain \"%s\"", (hay), (needle));                     \
    } while (0)

/* Write text as <tmp>/<tag>/config.pbtxt and load it as the repository would. */
static sp_status_t
load_text(const char *tag, const char *text, sp_repo_config_t *c, char *err, size_t err_len)
{
    char dir[PATH_MAX], path[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%s", sp_test_tmpdir(), tag);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.pbtxt", dir);
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return sp_repo_config_load(path, "models/m/config.pbtxt", NULL, 0, c, err, err_len);
}

/* Triton FIL's documented example (its README's config, with the comments
 * and list forms it uses), for an XGBoost JSON model. */
static const char fil_example[] =
    "# the FIL backend's README example\n"
    "backend: \"fil\"\n"
    "max_batch_size: 32768\n"
    "input [\n"
    " {\n"
    "    name: \"input__0\"\n"
    "    data_type: TYPE_FP32\n"
    "    dims: [ 4 ]\n"
    "  }\n"
    "]\n"
    "output [\n"
    " {\n"
    "    name: \"output__0\"\n"
    "    data_type: TYPE_FP32\n"
    "    dims: [ 1 ]\n"
    "  }\n"
    "]\n"
    "instance_group [{ kind: KIND_AUTO }]\n"
    "parameters [\n"
    "  {\n"
    "    key: \"model_type\"\n"
    "    value: { string_value: \"xgboost_json\" }\n"
    "  },\n"
    "  {\n"
    "    key: \"output_class\"\n"
    "    value: { string_value: \"false\" }\n"
    "  },\n"
    "  {\n"
    "    key: \"storage_type\"\n"
    "    value: { string_value: \"AUTO\" }\n"
    "  }\n"
    "]\n"
    "\n"
    "dynamic_batching {\n"
    "  max_queue_delay_microseconds: 100\n"
    "  preferred_batch_size: [ 4, 8 ]\n"
    "}\n";

TEST(pbtxt_triton_fil_example)
{
    sp_repo_config_t c;
    char err[512] = "";
    ASSERT_OK(load_text("fil", fil_example, &c, err, sizeof err));
    ASSERT_EQ(c.backend, SP_REPO_BACKEND_XGBOOST);
    ASSERT_STR_EQ(c.backend_name, "xgboost");
    ASSERT_EQ(c.max_batch_size, 32768);
    ASSERT_EQ(c.n_inputs, 1);
    ASSERT_STR_EQ(c.input[0].name, "input__0");
    ASSERT_EQ(c.input[0].data_type, SP_REPO_TYPE_FP32);
    ASSERT_EQ(c.input[0].n_dims, 1);
    ASSERT_EQ(c.input[0].dims[0], 4);
    ASSERT_EQ(c.n_outputs, 1);
    ASSERT_EQ(c.n_groups, 1);
    ASSERT_EQ(c.group[0].kind, SP_REPO_KIND_CPU);
    ASSERT(c.dynamic_batching.enabled);
    ASSERT_EQ(c.dynamic_batching.max_queue_delay_us, 100);
    ASSERT_EQ(c.dynamic_batching.n_preferred, 2);
    ASSERT_EQ(c.dynamic_batching.preferred[1], 8);
    /* FIL's model_type names the file FIL would read; the mapped keys are gone. */
    ASSERT_STR_EQ(sp_repo_config_param(&c, "model_file"), "xgboost.json");
    ASSERT(sp_repo_config_param(&c, "model_type") == NULL);
    ASSERT(sp_repo_config_param(&c, "output_class") == NULL);
    ASSERT(sp_repo_config_param(&c, "storage_type") == NULL);
    sp_repo_config_free(&c);
}

/* An LLM as a Triton user writes one for Sampan's llm backend. */
static const char llm_example[] =
    "name: \"stories\"\n"
    "backend: \"llm\"\n"
    "max_batch_size: 0\n"
    "model_transaction_policy { decoupled: true }\n"
    "version_policy: { latest: { num_versions: 1 } }\n"
    "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
    "parameters: { key: \"context_length\" value: { string_value: \"256\" } }\n"
    "parameters < key: 'temperature' value < string_value: '0.5' > >\n"
    "parameters { key: \"chat_template\" value: { string_value: \"{{ messages[0]['content'] }}\\n\" \"tail\" } }\n"
    "response_cache { enable: true }\n";

TEST(pbtxt_llm_example_and_text_forms)
{
    sp_repo_config_t c;
    char err[512] = "";
    ASSERT_OK(load_text("llm", llm_example, &c, err, sizeof err));
    ASSERT_EQ(c.backend, SP_REPO_BACKEND_LLM);
    ASSERT_STR_EQ(c.name, "stories");
    ASSERT_EQ(c.llm.context_length, 256);
    ASSERT(c.llm.temperature == 0.5);
    /* escapes and adjacent strings joined */
    ASSERT_STR_EQ(c.llm.chat_template, "{{ messages[0]['content'] }}\ntail");
    ASSERT(c.response_cache);
    ASSERT_EQ(c.version_policy.kind, SP_REPO_POLICY_LATEST);
    sp_repo_config_free(&c);

    /* repeated `field: v` and `field: [a, b]` mix; hex and octal integers; `;` separators */
    ASSERT_OK(load_text("forms",
                        "backend: \"xgboost\";\n"
                        "input { name: \"x\" data_type: TYPE_FP32 dims: 0x2 dims: [010, -1] }\n"
                        "version_policy { specific { versions: [3, 1] } }\n",
                        &c, err, sizeof err));
    ASSERT_EQ(c.input[0].n_dims, 3);
    ASSERT_EQ(c.input[0].dims[0], 2);
    ASSERT_EQ(c.input[0].dims[1], 8);
    ASSERT_EQ(c.input[0].dims[2], -1);
    ASSERT_EQ(c.version_policy.kind, SP_REPO_POLICY_SPECIFIC);
    ASSERT_EQ(c.version_policy.n_versions, 2);
    sp_repo_config_free(&c);
}

TEST(pbtxt_bad_files_name_line_and_field)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        /* the text itself */
        {"max_batch_size: 8\nbogus: 1\n", "models/m/config.pbtxt:2:1: bogus: unknown field (ModelConfig has:"},
        {"max_batch_size 8\n", "config.pbtxt:1:16: max_batch_size: expected ':' after the field name"},
        {"max_batch_size: eight\n", "config.pbtxt:1:17: max_batch_size: \"eight\" is not an integer"},
        {"max_batch_size: 3000000000\n", "config.pbtxt:1:17: max_batch_size: 3000000000 is out of the 32-bit range"},
        {"max_batch_size: 1\nmax_batch_size: 2\n", "config.pbtxt:2:1: max_batch_size: given twice"},
        {"name: \"a\nb\"\n", "config.pbtxt:1:7: name: string not closed on its line"},
        {"name: \"a\\qb\"\n", "config.pbtxt:1:9: name: unknown escape \\q"},
        {"name: abc\n", "config.pbtxt:1:7: name: expected a quoted string"},
        {"input [ { name: \"x\" data_type: TYPE_FLOAT32 } ]\n",
         "config.pbtxt:1:32: input[0].data_type: \"TYPE_FLOAT32\" is not one of TYPE_INVALID, TYPE_BOOL"},
        {"input { name: \"x\"\n", "config.pbtxt:2:1: input[0]: unexpected end of the file: '}' missing"},
        {"input { name: \"x\" >\n", "config.pbtxt:1:19: input[0]: expected a field name, got '>'"},
        {"max_batch_size: [1, 2]\n", "config.pbtxt:1:17: max_batch_size: a list [...] for a field that is not repeated"},
        {"version_policy { latest {} all {} }\n", "config.pbtxt:1:28: version_policy.all: only one of latest and all may be given"},
        {"parameters { value { string_value: \"1\" } }\n", "config.pbtxt:1:12: parameters: map entry without a key"},
        {"parameters { key: \"a\" } parameters { key: \"a\" }\n", "config.pbtxt:1:36: parameters: key \"a\" given twice"},
        {"response_cache { enable: maybe }\n", "config.pbtxt:1:26: response_cache.enable: \"maybe\" is not true or false"},
        {"dynamic_batching { max_queue_delay_microseconds: -5 }\n",
         "config.pbtxt:1:50: dynamic_batching.max_queue_delay_microseconds: must not be negative"},
        /* refused by name, with the reason */
        {"\n\nsequence_batching { }\n", "config.pbtxt:3:1: sequence_batching: stateful models"},
        {"ensemble_scheduling { step [] }\n", "config.pbtxt:1:1: ensemble_scheduling: ensembles are not supported"},
        /* the checks config.json has, located in the file */
        {"backend: \"llm\"\ninstance_group [\n  { kind: KIND_MODEL }\n]\n",
         "models/m/config.pbtxt:3:5: instance_group[0].kind: must be KIND_CPU, KIND_GPU or KIND_AUTO"},
        {"platform: \"onnxruntime_onnx\"\nbackend: \"llm\"\n", "config.pbtxt:2:1: backend: \"llm\" does not match platform"},
        {"backend: \"python\"\n", "config.pbtxt:1:1: backend: \"python\": Python models (model.py) are not run by Sampan"},
        {"platform: \"tensorrt_plan\"\n", "config.pbtxt:1:1: platform: \"tensorrt_plan\": TensorRT engines are not supported"},
        {"backend: \"fil\"\nparameters { key: \"model_type\" value { string_value: \"lightgbm\" } }\n",
         "config.pbtxt:2:14: parameters.model_type: \"lightgbm\": the fil backend maps"},
        {"backend: \"fil\"\nparameters { key: \"output_class\" value { string_value: \"true\" } }\n",
         "config.pbtxt:2:14: parameters.output_class: FIL's class-index output"},
        {"backend: \"llm\"\n\nparameters { key: \"top_k\" value { string_value: \"-3\" } }\n",
         "config.pbtxt:3:"},
        {"backend: \"llm\"\nmodel_transaction_policy { decoupled: false }\n",
         "config.pbtxt:2:28: model_transaction_policy.decoupled: an llm model is decoupled"},
        {"backend: \"xgboost\"\ninput { name: \"x\" data_type: TYPE_FP32 dims: [2] format: FORMAT_NHWC }\n",
         "config.pbtxt:2:"},
        {"backend: \"xgboost\"\noutput { name: \"y\" data_type: TYPE_FP32 dims: [1] label_filename: \"../l.txt\" }\n",
         "output[0].label_filename: must be a file name in the model directory"},
        {"backend: \"onnx\"\ninput { name: \"x\" data_type: TYPE_FP32 dims: [3, 8, 8] format: FORMAT_NCHW }\n"
         "parameters { key: \"image_preprocess.y\" value { string_value: \"{}\" } }\n",
         "parameters.image_preprocess.y: no input named \"y\""},
        {"backend: \"onnx\"\ninput { name: \"x\" data_type: TYPE_FP32 dims: [3, 8, 8] format: FORMAT_NCHW }\n"
         "parameters { key: \"image_preprocess.x\" value { string_value: \"{\\\"colour\\\": 1}\" } }\n",
         "parameters.image_preprocess.x.string_value.colour: unknown field"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sp_repo_config_t c;
        char err[512] = "", tag[32];
        snprintf(tag, sizeof tag, "bad%zu", i);
        sp_status_t st = load_text(tag, cases[i].text, &c, err, sizeof err);
        sp_repo_config_free(&c);
        if (st == SP_OK) SP_TEST_FAIL("case %zu parsed: %s", i, cases[i].text);
        ASSERT_HAS(err, cases[i].want);
    }
}

TEST(pbtxt_bounds)
{
    /* more values than SP_PBTXT_MAX_NODES, in well under the size cap */
    size_t n = SP_PBTXT_MAX_NODES + 10, cap = n * 8 + 64;
    char *t = sp_malloc(cap);
    ASSERT(t != NULL);
    size_t k = (size_t)snprintf(t, cap, "input { dims: [");
    for (size_t i = 0; i < n; i++) k += (size_t)snprintf(t + k, cap - k, "%s1", i ? "," : "");
    snprintf(t + k, cap - k, "] }\n");
    json_t *j = NULL;
    char err[512] = "";
    sp_pbtxt_posmap_t pos = {0};
    ASSERT(sp_repo_pbtxt_parse(t, strlen(t), "c.pbtxt", &j, &pos, err, sizeof err) != SP_OK);
    ASSERT_HAS(err, "c.pbtxt:1:");
    ASSERT_HAS(err, "input[0].dims: more than 65536 values");
    sp_pbtxt_posmap_free(&pos);
    sp_free(t);

    /* a NUL byte, and the size cap */
    ASSERT(sp_repo_pbtxt_parse("name: \"a\"\n\0x", 12, "c.pbtxt", &j, NULL, err, sizeof err) != SP_OK);
    ASSERT_HAS(err, "c.pbtxt:2:1: a NUL byte in the file");
    ASSERT(sp_repo_pbtxt_parse("", SP_REPO_CONFIG_MAX + 1, "c.pbtxt", &j, NULL, err, sizeof err) ==
           SP_ERR_TOO_LARGE);
}

TEST(pbtxt_triton_json_round_trip)
{
    sp_repo_config_t c;
    char err[512] = "";
    ASSERT_OK(load_text("rt", fil_example, &c, err, sizeof err));
    json_t *j = sp_repo_config_triton_json(c.json, "fraud", err, sizeof err);
    ASSERT(j != NULL);
    /* the name filled in, the mapped backend, every scalar printed, enums by name */
    ASSERT_STR_EQ(json_string_value(json_object_get(j, "name")), "fraud");
    ASSERT_STR_EQ(json_string_value(json_object_get(j, "backend")), "xgboost");
    ASSERT_STR_EQ(json_string_value(json_object_get(j, "platform")), "");
    ASSERT_EQ(json_integer_value(json_object_get(j, "max_batch_size")), 32768);
    const json_t *in = json_array_get(json_object_get(j, "input"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(in, "format")), "FORMAT_NONE");
    ASSERT_STR_EQ(json_string_value(json_object_get(in, "data_type")), "TYPE_FP32");
    ASSERT_EQ(json_integer_value(json_array_get(json_object_get(in, "dims"), 0)), 4);
    const json_t *g = json_array_get(json_object_get(j, "instance_group"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(g, "kind")), "KIND_AUTO");
    const json_t *db = json_object_get(j, "dynamic_batching");
    ASSERT_EQ(json_integer_value(json_object_get(db, "max_queue_delay_microseconds")), 100);
    const json_t *pf = json_object_get(json_object_get(json_object_get(j, "parameters"), "model_file"),
                                       "string_value");
    ASSERT_STR_EQ(json_string_value(pf), "xgboost.json");
    /* the default version policy printed as served; unset messages are left out */
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(json_object_get(j, "version_policy"),
                                                                 "latest"), "num_versions")), 1);
    ASSERT(json_object_get(j, "model_transaction_policy") == NULL);
    ASSERT(json_object_get(in, "reshape") == NULL);

    /* and back: Triton's JSON is a valid config.json for the same model */
    sp_repo_config_t c2;
    ASSERT_OK(sp_repo_config_from_json(j, "back.json", &c2, err, sizeof err));
    ASSERT_EQ(c2.backend, SP_REPO_BACKEND_XGBOOST);
    ASSERT_EQ(c2.max_batch_size, 32768);
    ASSERT_STR_EQ(sp_repo_config_param(&c2, "model_file"), "xgboost.json");
    sp_repo_config_free(&c2);
    json_decref(j);
    sp_repo_config_free(&c);

    /* a --model model: an llm under its name */
    j = sp_repo_config_triton_json(NULL, "stories260K", err, sizeof err);
    ASSERT(j != NULL);
    ASSERT_STR_EQ(json_string_value(json_object_get(j, "backend")), "llm");
    ASSERT_STR_EQ(json_string_value(json_object_get(j, "name")), "stories260K");
    json_decref(j);
}

static void
put_file(const char *root, const char *rel, const char *text)
{
    char path[PATH_MAX + 64], dir[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    }
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

TEST(pbtxt_repository_scan)
{
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/repo", sp_test_tmpdir());
    mkdir(root, 0755);
    put_file(root, "tp/config.pbtxt", "backend: \"llm\"\nparameters { key: \"model_file\" value { string_value: \"m.gguf\" } }\n");
    put_file(root, "tp/1/m.gguf", "x");
    put_file(root, "both/config.pbtxt", "");
    put_file(root, "both/config.json", "{}");
    put_file(root, "none/1/m.gguf", "x");
    put_file(root, "badline/config.pbtxt", "\n\nmax_batch_size: -1\n");
    sp_repo_scan_t *s = NULL;
    char err[512] = "";
    ASSERT_OK(sp_repo_scan(root, NULL, &s, err, sizeof err));
    ASSERT_EQ(s->n_models, 4);
    const sp_repo_model_t *m = sp_repo_find(s, "tp");
    ASSERT(m && m->ok && m->n_versions == 1 && m->versions[0].model_path);
    ASSERT_HAS(m->versions[0].model_path, "/tp/1/m.gguf");
    m = sp_repo_find(s, "both");
    ASSERT(m && !m->ok);
    ASSERT_HAS(m->reason, "/both: both config.json and config.pbtxt: keep one");
    m = sp_repo_find(s, "none");
    ASSERT(m && !m->ok);
    ASSERT_HAS(m->reason, "/none: no config.pbtxt or config.json");
    m = sp_repo_find(s, "badline");
    ASSERT(m && !m->ok);
    ASSERT_HAS(m->reason, "/badline/config.pbtxt:3:1: max_batch_size: must be in [0, 65536], got -1");
    sp_repo_scan_free(s);
}

TEST(pbtxt_image_preprocess_parameter)
{
    /* config.pbtxt cannot extend ModelInput: the preprocess object rides in a parameter. */
    sp_repo_config_t c;
    char err[512] = "";
    ASSERT_OK(load_text("img", "backend: \"onnx\"\nmax_batch_size: 8\n"
                        "input { name: \"x\" data_type: TYPE_FP32 dims: [224, 224, 3] format: FORMAT_NHWC }\n"
                        "output { name: \"p\" data_type: TYPE_FP32 dims: [10] label_filename: \"labels.txt\" }\n"
                        "parameters { key: \"image_preprocess.x\" value { string_value: "
                        "\"{\\\"color\\\": \\\"BGR\\\", \\\"resize\\\": \\\"shorter_crop\\\", "
                        "\\\"shorter_side\\\": 256, \\\"mean\\\": [1, 2, 3], \\\"std\\\": [4, 5, 6]}\" } }\n",
                        &c, err, sizeof err));
    ASSERT(c.input[0].has_image);
    ASSERT_EQ(c.input[0].format, 1);
    ASSERT_EQ(c.input[0].image.layout, SP_IMG_NHWC);
    ASSERT_EQ(c.input[0].image.color, SP_IMG_BGR);
    ASSERT_EQ(c.input[0].image.resize, SP_IMG_SHORTER_CROP);
    ASSERT_EQ(c.input[0].image.height, 224);
    ASSERT_EQ(c.input[0].image.shorter_side, 256);
    ASSERT(c.input[0].image.mean[2] == 3.0f && c.input[0].image.std[0] == 4.0f);
    ASSERT(fabsf(c.input[0].image.scale - 1.0f / 255.0f) < 1e-9f);
    ASSERT_STR_EQ(c.output[0].label_filename, "labels.txt");
    sp_repo_config_free(&c);
}
