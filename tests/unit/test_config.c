/*
 * test_config.c - the layers of `sampan serve`'s configuration: a file (JSON or
 * YAML), the environment (SAMPAN_<FLAG>), the flags, in that order of
 * precedence; YAML read as the JSON it stands for (src/core/yaml.c) and its
 * refusals with line numbers. Each test runs in its own process (the runner
 * forks), so setenv here touches no other test.
 */
#include "test.h"

#include <stdbool.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/yaml.h"
#include "serving/config.h"

extern char **environ;

/* No SAMPAN_* variable from the caller's environment leaks into a test. */
static void
clear_sampan_env(void)
{
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++) {
            const char *eq = strchr(*e, '=');
            if (strncmp(*e, "SAMPAN_", 7) == 0 && eq && (size_t)(eq - *e) < sizeof name) {
                memcpy(name, *e, (size_t)(eq - *e));
                name[eq - *e] = '\0';
                break;
            }
        }
        if (name[0] == '\0') {
            return;
        }
        unsetenv(name);
    }
}

static const char *
write_file(const char *name, const char *text)
{
    static char path[4][600];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", sp_test_tmpdir(), name);
    FILE *f = fopen(p, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    return p;
}

TEST(config_env_between_file_and_flags)
{
    clear_sampan_env();
    sp_serve_config_t c;
    bool help;
    char err[512];
    const char *path = write_file("c.json", "{\"port\": 8100, \"max-tokens\": 77, \"parallel\": 3, "
                                            "\"models\": {\"f\": \"f.gguf\"}}");
    char arg[700];
    snprintf(arg, sizeof arg, "--config=%s", path);
    setenv("SAMPAN_PORT", "8200", 1);
    setenv("SAMPAN_MAX_TOKENS", "88", 1);
    setenv("SAMPAN_KV_SWA_FULL", "true", 1);
    setenv("SAMPAN_DRAIN_TIMEOUT", "2.5", 1);
    char *argv[] = {"serve", arg, "--port", "8300"};
    ASSERT_OK(sp_config_parse(4, argv, &c, &help, err, sizeof err));
    ASSERT_EQ(c.port, 8300);      /* flag over environment */
    ASSERT_EQ(c.max_tokens, 88);  /* environment over file */
    ASSERT_EQ(c.parallel, 3);     /* file over default */
    ASSERT(c.kv_swa_full);
    ASSERT_NEAR(c.drain_timeout_s, 2.5, 0);
    ASSERT_EQ(c.n_models, 1);
    ASSERT_STR_EQ(c.models[0].name, "f");
    ASSERT_STR_EQ(c.env_unknown, "");

    /* SAMPAN_MODEL replaces the file's list; --model replaces both */
    setenv("SAMPAN_MODEL", "a=x.gguf,dir/b.gguf", 1);
    ASSERT_OK(sp_config_parse(2, argv, &c, &help, err, sizeof err));
    ASSERT_EQ(c.n_models, 2);
    ASSERT_STR_EQ(c.models[0].name, "a");
    ASSERT_STR_EQ(c.models[1].name, "b");
    char *argv2[] = {"serve", arg, "--model", "z=z.gguf"};
    ASSERT_OK(sp_config_parse(4, argv2, &c, &help, err, sizeof err));
    ASSERT_EQ(c.n_models, 1);
    ASSERT_STR_EQ(c.models[0].name, "z");

    /* a boolean can be turned off from the environment over a file that set it */
    path = write_file("b.json", "{\"kv-swa-full\": true}");
    snprintf(arg, sizeof arg, "--config=%s", path);
    unsetenv("SAMPAN_MODEL");
    setenv("SAMPAN_KV_SWA_FULL", "off", 1);
    ASSERT_OK(sp_config_parse(2, argv, &c, &help, err, sizeof err));
    ASSERT(!c.kv_swa_full);

    /* SAMPAN_CONFIG names the file when no --config is given */
    clear_sampan_env();
    setenv("SAMPAN_CONFIG", write_file("e.json", "{\"port\": 8111}"), 1);
    char *argv3[] = {"serve"};
    ASSERT_OK(sp_config_parse(1, argv3, &c, &help, err, sizeof err));
    ASSERT_EQ(c.port, 8111);
}

TEST(config_env_errors_and_unknown_names)
{
    clear_sampan_env();
    sp_serve_config_t c;
    bool help;
    char err[512];
    char *argv[] = {"serve"};
    static const char *const bad[][2] = {
        {"SAMPAN_PORT", "70000"}, {"SAMPAN_PORT", "80x"}, {"SAMPAN_KV_SWA_FULL", "maybe"},
        {"SAMPAN_PARALLEL", "0"}, {"SAMPAN_MODEL", "=x.gguf"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        clear_sampan_env();
        setenv(bad[i][0], bad[i][1], 1);
        ASSERT_EQ(sp_config_parse(1, argv, &c, &help, err, sizeof err), SP_ERR_INVALID);
        if (strstr(err, bad[i][0]) == NULL) {
            SP_TEST_FAIL("error for %s=%s does not name the variable: %s", bad[i][0], bad[i][1], err);
        }
    }
    /* a misspelt option is listed for serve's warning; variables read elsewhere are not */
    clear_sampan_env();
    setenv("SAMPAN_KV_BLOKS", "9", 1);
    setenv("SAMPAN_CPU", "scalar", 1);
    setenv("SAMPAN_MODEL_KEY", "00", 1);
    ASSERT_OK(sp_config_parse(1, argv, &c, &help, err, sizeof err));
    ASSERT_STR_EQ(c.env_unknown, "SAMPAN_KV_BLOKS");
}

/* The same options in YAML and in JSON give the same configuration. */
TEST(config_yaml_equals_json)
{
    clear_sampan_env();
    const char *js = write_file("s.json",
                                "{\"port\": 8100, \"host\": \"0.0.0.0\", \"kv-swa-full\": true, "
                                "\"drain-timeout\": 2.5, \"api-key\": \"k1\", "
                                "\"models\": {\"m\": \"m.gguf\", \"n\": \"n.gguf\"}}");
    const char *ys = write_file("s.yaml",
                                "# the same options as s.json\n"
                                "port: 8100\n"
                                "host: \"0.0.0.0\"\n"
                                "kv_swa_full: yes_is_not_a_boolean_in_yaml_1_2\n");
    sp_serve_config_t a, b;
    bool help;
    char err[512], arg[700];
    snprintf(arg, sizeof arg, "--config=%s", ys);
    char *argv[] = {"serve", arg};
    /* YAML 1.2: "yes..." is a string, and a string is not a boolean option */
    ASSERT_EQ(sp_config_parse(2, argv, &b, &help, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "kv_swa_full") != NULL);
    ys = write_file("s.yml",
                    "port: 0x1f a4\n");
    snprintf(arg, sizeof arg, "--config=%s", ys);
    ASSERT_EQ(sp_config_parse(2, argv, &b, &help, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "\"port\"") != NULL); /* a string, not a number */
    ys = write_file("t.yaml",
                    "port: 8100\n"
                    "host: '0.0.0.0'\n"
                    "kv-swa-full: true\n"
                    "drain-timeout: 2.5\n"
                    "api-key: k1\n"
                    "models:\n"
                    "  m: m.gguf\n"
                    "  n: n.gguf\n");
    snprintf(arg, sizeof arg, "--config=%s", ys);
    ASSERT_OK(sp_config_parse(2, argv, &b, &help, err, sizeof err));
    snprintf(arg, sizeof arg, "--config=%s", js);
    ASSERT_OK(sp_config_parse(2, argv, &a, &help, err, sizeof err));
    /* field by field: a struct's padding (sp_http_limits_t is assigned by value) is not data */
    ASSERT_EQ(a.port, b.port);
    ASSERT_STR_EQ(a.host, b.host);
    ASSERT_EQ(a.kv_swa_full, b.kv_swa_full);
    ASSERT_NEAR(a.drain_timeout_s, b.drain_timeout_s, 0);
    ASSERT_STR_EQ(a.api_key, b.api_key);
    ASSERT_EQ(a.n_models, b.n_models);
    for (int i = 0; i < a.n_models; i++) {
        ASSERT_STR_EQ(a.models[i].name, b.models[i].name);
        ASSERT_STR_EQ(a.models[i].path, b.models[i].path);
    }
    ASSERT_EQ(b.port, 8100);
    ASSERT_EQ(b.n_models, 2);
    ASSERT_STR_EQ(b.api_key, "k1");
}

static void
yaml_refused(const char *text, const char *want)
{
    json_t *v = NULL;
    char err[256] = "";
    sp_status_t st = sp_yaml_parse(text, strlen(text), 8, &v, err, sizeof err);
    if (st == SP_OK || v != NULL || strstr(err, want) == NULL) {
        SP_TEST_FAIL("yaml %s: status %d, error '%s' (wanted '%s')", text, (int)st, err, want);
    }
}

TEST(yaml_values_and_refusals)
{
    const char *text = "a: 12\nb: -0x10\nc: 0o17\nd: 1.5e3\ne: ~\nf: FALSE\ng: '12'\nh: !!str 13\n"
                       "i: [1, two, {k: v}]\nj: .5\nk: 1e5x\n";
    json_t *v = NULL;
    char err[256];
    ASSERT_OK(sp_yaml_parse(text, strlen(text), 8, &v, err, sizeof err));
    char *dump = json_dumps(v, JSON_SORT_KEYS | JSON_COMPACT);
    /* -0x10 is not a core-schema integer (the sign only goes with decimals): a string */
    ASSERT_STR_EQ(dump, "{\"a\":12,\"b\":\"-0x10\",\"c\":15,\"d\":1500.0,\"e\":null,\"f\":false,"
                        "\"g\":\"12\",\"h\":\"13\",\"i\":[1,\"two\",{\"k\":\"v\"}],\"j\":0.5,"
                        "\"k\":\"1e5x\"}");
    sp_free(dump); /* jansson allocates through sp_malloc (sp_json_init) */
    json_decref(v);
    yaml_refused("a: &x 1\nb: *x\n", "line 2, column 4: aliases");
    yaml_refused("a: 1\n---\nb: 2\n", "line 2, column 1: more than one YAML document");
    yaml_refused("a: 1\na: 2\n", "line 2, column 1: key 'a' given twice");
    yaml_refused("? [1]\n: x\n", "mapping key must be a string");
    yaml_refused("a: .inf\n", "infinity and NaN");
    yaml_refused("a: [[[[[[[[[1]]]]]]]]]\n", "nested deeper than 8");
    yaml_refused("a: 1\n b: 2\n", "line 2");
    yaml_refused("a: \"unterminated\n", "line");
}
