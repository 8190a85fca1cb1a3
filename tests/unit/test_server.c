/* test_server.c - the server's pure parts: JSON depth scan, parsing and getters, the JSON
 * writer (escaping, invalid UTF-8), the router, the configuration parser. The HTTP layer
 * and the routes run as a black box in tests/py/test_server.py and tests/node/. */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "serving/config.h"
#include "core/json.h"
#include "http/router.h"
#include "test.h"

TEST(json_depth_scan)
{
    ASSERT_EQ(sp_json_depth("{}", 2, 10), 1);
    ASSERT_EQ(sp_json_depth("{\"a\":[[1]]}", 11, 10), 3);
    /* brackets inside strings (and escaped quotes) do not count */
    const char *s = "{\"a\":\"[[[[\\\"[[[\"}";
    ASSERT_EQ(sp_json_depth(s, strlen(s), 10), 1);
    char deep[2001];
    memset(deep, '[', 1000);
    memset(deep + 1000, ']', 1000);
    deep[2000] = '\0';
    ASSERT_EQ(sp_json_depth(deep, 2000, 64), 65); /* stops counting past the limit */
}

TEST(json_parse_errors)
{
    json_t *v = NULL;
    char err[256];
    ASSERT_EQ(sp_json_parse("{\"a\":", 5, 64, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT(v == NULL);
    ASSERT(strstr(err, "line 1") != NULL);
    ASSERT_EQ(sp_json_parse("{\"a\":1,\"a\":2}", 13, 64, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_json_parse("\"\xff\"", 3, 64, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_json_parse("\"\\ud800\"", 8, 64, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_json_parse("[[[1]]]", 7, 2, &v, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "deeper than 2") != NULL);
    ASSERT_OK(sp_json_parse("[[1]]", 5, 2, &v, err, sizeof err));
    json_decref(v);
}

TEST(json_getters)
{
    json_t *v = NULL;
    char err[256];
    const char *src = "{\"i\":5,\"f\":5.0,\"h\":1e300,\"s\":\"x\",\"b\":true,\"n\":null,\"neg\":-3}";
    ASSERT_OK(sp_json_parse(src, strlen(src), 8, &v, err, sizeof err));
    sp_json_err_t e;
    int64_t i;
    double d;
    bool b;
    const char *str;
    ASSERT_EQ(sp_json_get_int(v, "i", 1, 10, &i, &e), 1);
    ASSERT_EQ(i, 5);
    ASSERT_EQ(sp_json_get_int(v, "f", 1, 10, &i, &e), 1); /* 5.0 counts as an integer */
    ASSERT_EQ(sp_json_get_int(v, "h", 1, 10, &i, &e), -1);
    ASSERT_EQ(sp_json_get_int(v, "neg", 0, 10, &i, &e), -1);
    ASSERT_STR_EQ(e.param, "neg");
    ASSERT(strstr(e.msg, "between 0 and 10") != NULL);
    ASSERT_EQ(sp_json_get_int(v, "s", 0, 10, &i, &e), -1);
    ASSERT(strstr(e.msg, "must be an integer, got a string") != NULL);
    ASSERT_EQ(sp_json_get_int(v, "n", 0, 10, &i, &e), 0);       /* null = absent */
    ASSERT_EQ(sp_json_get_int(v, "missing", 0, 10, &i, &e), 0);
    ASSERT_EQ(sp_json_get_num(v, "h", 0, 2, &d, &e), -1);
    ASSERT_EQ(sp_json_get_num(v, "i", 0, 10, &d, &e), 1);
    ASSERT_EQ(sp_json_get_bool(v, "b", &b, &e), 1);
    ASSERT(b);
    ASSERT_EQ(sp_json_get_bool(v, "i", &b, &e), -1);
    ASSERT_EQ(sp_json_get_str(v, "s", &str, NULL, &e), 1);
    ASSERT_STR_EQ(str, "x");
    json_decref(v);
}

TEST(jbuf_escapes_and_repairs_utf8)
{
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_str(&b, "a\"b\\c\n\x01", 7);
    ASSERT_STR_EQ(b.p, "\"a\\\"b\\\\c\\n\\u0001\"");
    sp_jbuf_reset(&b);
    /* é is kept; a lone continuation byte, a cut sequence and a surrogate become U+FFFD */
    sp_jbuf_str(&b, "\xc3\xa9\x80\xe2\x82\xed\xa0\x80", 8);
    ASSERT_STR_EQ(b.p, "\"\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");
    sp_jbuf_reset(&b);
    sp_jbuf_num(&b, 1.0 / 0.0);
    sp_jbuf_lit(&b, ",");
    sp_jbuf_int(&b, -42);
    sp_jbuf_lit(&b, ",");
    sp_jbuf_cstr(&b, NULL);
    ASSERT_STR_EQ(b.p, "null,-42,null");
    /* the output always parses */
    sp_jbuf_reset(&b);
    char junk[256];
    for (int k = 0; k < 256; k++) {
        junk[k] = (char)k;
    }
    sp_jbuf_str(&b, junk, sizeof junk);
    json_error_t je;
    json_t *v = json_loadb(b.p, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    ASSERT(v != NULL);
    ASSERT(json_is_string(v));
    ASSERT_EQ(json_string_length(v), 128 + 128 * 3); /* ASCII kept, each high byte U+FFFD */
    json_decref(v);
    sp_jbuf_free(&b);
}

static void
route_a(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
}

TEST(router_patterns)
{
    sp_router_t *rt = sp_router_create();
    ASSERT(rt != NULL);
    ASSERT_OK(sp_router_add(rt, SP_HTTP_GET, "/v2/models/{model}/ready", route_a, NULL));
    ASSERT_EQ(sp_router_add(rt, SP_HTTP_GET, "no-slash", route_a, NULL), SP_ERR_INVALID);
    ASSERT_EQ(sp_router_add(rt, SP_HTTP_GET, "/{a}/{b}/{c}/{d}/{e}", route_a, NULL), SP_ERR_INVALID);
    sp_router_destroy(rt);
    sp_route_params_t p;
    const char *pat = "/v2/models/{model}/versions/{version}/infer";
    ASSERT(sp_router_match(pat, sp_str_c("/v2/models/m1/versions/3/infer"), &p));
    ASSERT_EQ(p.n, 2);
    ASSERT(sp_str_eq_c(sp_router_param(&p, "model"), "m1"));
    ASSERT(sp_str_eq_c(sp_router_param(&p, "version"), "3"));
    ASSERT(sp_router_param(&p, "nope").ptr == NULL);
    ASSERT(sp_router_match("/v1/models", sp_str_c("/v1/models/"), &p)); /* trailing slash */
    ASSERT(!sp_router_match(pat, sp_str_c("/v2/models/m1/infer"), &p));
    ASSERT(!sp_router_match("/v1/models", sp_str_c("/v1/modelsx"), &p));
    ASSERT(!sp_router_match("/v1/models/{m}", sp_str_c("/v1/models//"), &p));
}

/* The access class comes from the route matched, whatever the spelling of the path. */
TEST(router_access_of_matched_route)
{
    sp_router_t *rt = sp_router_create();
    ASSERT(rt != NULL);
    ASSERT_OK(sp_router_add(rt, SP_HTTP_POST, "/v2/repository/index", route_a, NULL));
    ASSERT_OK(sp_router_add(rt, SP_HTTP_POST, "/v2/repository/models/{model}/unload", route_a, NULL));
    ASSERT_OK(sp_router_add(rt, SP_HTTP_GET, "/metrics", route_a, NULL));
    ASSERT_OK(sp_router_add(rt, SP_HTTP_GET, "/v2/models/{model}/ready", route_a, NULL));
    ASSERT_EQ(sp_router_set_access(rt, "/v2/repository", true, 2), 2);
    ASSERT_EQ(sp_router_set_access(rt, "/metrics", false, 4), 1);
    ASSERT_EQ(sp_router_set_access(rt, "/v2/models", false, 9), 0); /* exact: no such route */
    sp_route_match_t m;
    const char *admin[] = {"/v2/repository/index", "//v2/repository/index", "/v2//repository/index/",
                           "/v2/repository/models/a:b/unload", "//v2/repository/models/a:b/unload//"};
    for (size_t i = 0; i < sizeof admin / sizeof admin[0]; i++) {
        ASSERT_EQ(sp_router_find(rt, SP_HTTP_POST, sp_str_c(admin[i]), &m), 0);
        ASSERT_EQ(m.access, 2u);
    }
    ASSERT_EQ(sp_router_find(rt, SP_HTTP_GET, sp_str_c("/metrics/"), &m), 0);
    ASSERT_EQ(m.access, 4u);
    ASSERT_EQ(sp_router_find(rt, SP_HTTP_HEAD, sp_str_c("//metrics"), &m), 0);
    ASSERT_EQ(m.access, 4u);
    ASSERT_EQ(sp_router_find(rt, SP_HTTP_GET, sp_str_c("/v2/models/x/ready"), &m), 0);
    ASSERT_EQ(m.access, 0u);
    /* 405 carries the class of the route the path belongs to. */
    ASSERT_EQ(sp_router_find(rt, SP_HTTP_GET, sp_str_c("/v2/repository/index"), &m), 405);
    ASSERT_EQ(m.access, 2u);
    /* Dot segments, plain or percent-encoded, are refused; "%2F" is not a separator. */
    const char *dots[] = {"/v2/./repository/index", "/v2/x/../repository/index", "/metrics/..",
                          "/v2/%2e%2E/metrics", "/./metrics", "/v2/.%2e/repository/index",
                          "/v2/models/%2e/ready"};
    for (size_t i = 0; i < sizeof dots / sizeof dots[0]; i++) {
        ASSERT_EQ(sp_router_find(rt, SP_HTTP_POST, sp_str_c(dots[i]), &m), 400);
    }
    ASSERT_EQ(sp_router_find(rt, SP_HTTP_POST, sp_str_c("/v2%2Frepository/index"), &m), 404);
    ASSERT_EQ(sp_router_find(rt, SP_HTTP_GET, sp_str_c("/v2/models/.../ready"), &m), 0);
    ASSERT_EQ(sp_router_find(rt, SP_HTTP_GET, sp_str_c("/v2/models/a.b/ready"), &m), 0);
    sp_router_destroy(rt);
}

TEST(config_flags_and_file)
{
    sp_serve_config_t c;
    bool help;
    char err[512];
    char *argv1[] = {"serve", "--port", "9000", "--model", "a=x.gguf", "-m", "dir/b.gguf",
                     "--header-timeout", "0.5", "--max-body-bytes=1024", "--verbose"};
    ASSERT_OK(sp_config_parse(11, argv1, &c, &help, err, sizeof err));
    ASSERT_EQ(c.port, 9000);
    ASSERT_EQ(c.n_models, 2);
    ASSERT_STR_EQ(c.models[0].name, "a");
    ASSERT_STR_EQ(c.models[1].name, "b");
    ASSERT_STR_EQ(c.models[1].path, "dir/b.gguf");
    ASSERT_EQ(c.limits.header_timeout_ms, 500);
    ASSERT_EQ((int64_t)c.limits.max_body_bytes, 1024);
    ASSERT(c.verbose);

    char *bad[][3] = {{"serve", "--port", "70000"}, {"serve", "--parallel", "0"},
                      {"serve", "--max-n", "1.5"}, {"serve", "--nope", "1"},
                      {"serve", "--model", "=x"}, {"serve", "--port", "abc"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(sp_config_parse(3, bad[i], &c, &help, err, sizeof err), SP_ERR_INVALID);
    }
    char *argv2[] = {"serve"};
    ASSERT_OK(sp_config_parse(1, argv2, &c, &help, err, sizeof err));
    ASSERT_EQ(c.n_models, 1);
    ASSERT_STR_EQ(c.models[0].name, SP_SERVE_DEMO_NAME);
    ASSERT_STR_EQ(c.host, "127.0.0.1");
    ASSERT_EQ(c.port, 8000);

    char path[600];
    snprintf(path, sizeof path, "%s/serve.json", sp_test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs("{\"port\": 8100, \"max_tokens\": 77, \"models\": {\"m\": \"m.gguf\"}, \"drain-timeout\": 2.5}", f);
    fclose(f);
    char cfg_arg[700];
    snprintf(cfg_arg, sizeof cfg_arg, "--config=%s", path);
    char *argv3[] = {"serve", cfg_arg, "--port", "8200"};
    ASSERT_OK(sp_config_parse(4, argv3, &c, &help, err, sizeof err));
    ASSERT_EQ(c.port, 8200); /* the flag wins */
    ASSERT_EQ(c.max_tokens, 77);
    ASSERT_NEAR(c.drain_timeout_s, 2.5, 1e-9);
    ASSERT_EQ(c.n_models, 1);
    ASSERT_STR_EQ(c.models[0].name, "m");
    f = fopen(path, "w");
    fputs("{\"port\": \"x\"}", f);
    fclose(f);
    ASSERT_EQ(sp_config_parse(2, argv3, &c, &help, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "\"port\"") != NULL);
}

/* gRPC: a NUL inside a model name (or version, or id) is refused, never cut:
 * protobuf-c gives strings to C as NUL-terminated, so "m\0x" would name "m". */
#include "api/grpc_msg.h"

static bool
never_llm(void *ud, const char *name, size_t len, const char *version, size_t vlen)
{
    return false;
}

TEST(grpc_name_with_nul_is_refused)
{
    /* ModelReadyRequest {name = 1, version = 2}; ModelInferRequest {model_name = 1, id = 3} */
    static const uint8_t ready_ok[] = {0x0A, 0x03, 'a', 'b', 'c'};
    static const uint8_t ready_nul[] = {0x0A, 0x05, 'a', 'b', 'c', 0x00, 'x'};
    static const uint8_t ready_ver_nul[] = {0x0A, 0x01, 'a', 0x12, 0x02, '1', 0x00};
    static const uint8_t meta_nul[] = {0x0A, 0x02, 0x00, 'a'};
    static const uint8_t infer_nul[] = {0x0A, 0x03, 'm', 0x00, 'x', 0x1A, 0x01, 'i'};
    static const uint8_t infer_id_nul[] = {0x0A, 0x01, 'm', 0x1A, 0x02, 'i', 0x00};
    sp_grpc_rest_t out;
    char err[256];
    ASSERT_EQ(sp__grpc_msg_to_rest(SP_GRPC_MODEL_READY, ready_ok, sizeof ready_ok, never_llm, NULL, &out,
                               err, sizeof err), SP_GRPC_OK);
    ASSERT(strcmp(out.path, "/v2/models/abc/ready") == 0);
    sp__grpc_msg_rest_free(&out);
    ASSERT_EQ(sp__grpc_msg_to_rest(SP_GRPC_MODEL_READY, ready_nul, sizeof ready_nul, never_llm, NULL, &out,
                               err, sizeof err), SP_GRPC_INVALID_ARGUMENT);
    ASSERT(strstr(err, "name") && strstr(err, "NUL"));
    sp__grpc_msg_rest_free(&out);
    ASSERT_EQ(sp__grpc_msg_to_rest(SP_GRPC_MODEL_READY, ready_ver_nul, sizeof ready_ver_nul, never_llm,
                               NULL, &out, err, sizeof err), SP_GRPC_INVALID_ARGUMENT);
    ASSERT(strstr(err, "version") && strstr(err, "NUL"));
    sp__grpc_msg_rest_free(&out);
    ASSERT_EQ(sp__grpc_msg_to_rest(SP_GRPC_MODEL_METADATA, meta_nul, sizeof meta_nul, never_llm, NULL,
                               &out, err, sizeof err), SP_GRPC_INVALID_ARGUMENT);
    sp__grpc_msg_rest_free(&out);
    for (int m = SP_GRPC_MODEL_INFER; m <= SP_GRPC_MODEL_STREAM_INFER; m++) {
        ASSERT_EQ(sp__grpc_msg_to_rest(m, infer_nul, sizeof infer_nul, never_llm, NULL, &out, err,
                                   sizeof err), SP_GRPC_INVALID_ARGUMENT);
        ASSERT(strstr(err, "model_name") && strstr(err, "NUL"));
        sp__grpc_msg_rest_free(&out);
        ASSERT_EQ(sp__grpc_msg_to_rest(m, infer_id_nul, sizeof infer_id_nul, never_llm, NULL, &out, err,
                                   sizeof err), SP_GRPC_INVALID_ARGUMENT);
        ASSERT(strstr(err, "id") && strstr(err, "NUL"));
        sp__grpc_msg_rest_free(&out);
    }
}
