/* test_tensor.c - the KServe v2 tensor codec (src/api/tensor.c): every datatype from JSON
 * (flat and nested) and from the binary tail, the response writer, and hostile bodies: every
 * truncation of a binary request, lengths past the body, and an allocation failure at every
 * step, each an error without a leak. The routes run as a black box in tests/py/test_kserve.py. */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/kernels.h"
#include "api/tensor.h"
#include "test.h"

static sp_str_t
hdr(const char *s)
{
    return sp_str_c(s);
}

static const sp_str_t no_hdr = {NULL, 0};

TEST(tensor_dtype_names)
{
    for (int i = 0; i < SP_DT_COUNT; i++) {
        const char *n = sp_tensor_dtype_name((sp_dtype_t)i);
        ASSERT_EQ(sp_tensor_dtype_parse(n, strlen(n)), i);
    }
    ASSERT_EQ(sp_tensor_dtype_parse("FP8", 3), -1);
    ASSERT_EQ(sp_tensor_dtype_parse("fp32", 4), -1);
    ASSERT_EQ(sp_tensor_dtype_parse("FP3", 3), -1);
    ASSERT_EQ(sp_tensor_dtype_size(SP_DT_FP16), 2);
    ASSERT_EQ(sp_tensor_dtype_size(SP_DT_UINT64), 8);
    ASSERT_EQ(sp_tensor_dtype_size(SP_DT_BYTES), 0);
}

TEST(tensor_json_every_dtype)
{
    sp_json_init();
    const char *body =
        "{\"id\":\"a\",\"inputs\":["
        "{\"name\":\"b\",\"datatype\":\"BOOL\",\"shape\":[2],\"data\":[true,false]},"
        "{\"name\":\"u8\",\"datatype\":\"UINT8\",\"shape\":[1,2],\"data\":[[0,255]]},"
        "{\"name\":\"u64\",\"datatype\":\"UINT64\",\"shape\":[1],\"data\":[9223372036854775807]},"
        "{\"name\":\"i8\",\"datatype\":\"INT8\",\"shape\":[2],\"data\":[-128,127]},"
        "{\"name\":\"i16\",\"datatype\":\"INT16\",\"shape\":[1],\"data\":[-32768]},"
        "{\"name\":\"i64\",\"datatype\":\"INT64\",\"shape\":[1],\"data\":[-9223372036854775808]},"
        "{\"name\":\"h\",\"datatype\":\"FP16\",\"shape\":[2],\"data\":[1.5,-65504]},"
        "{\"name\":\"f\",\"datatype\":\"FP32\",\"shape\":[2,2],\"data\":[[1,2],[3,0.25]]},"
        "{\"name\":\"d\",\"datatype\":\"FP64\",\"shape\":[],\"data\":0.1},"
        "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[3],\"data\":[\"x\",\"\",\"\\u00e9t\\u00e9\"]},"
        "{\"name\":\"z\",\"datatype\":\"FP32\",\"shape\":[0,3],\"data\":[]}"
        "]}";
    sp_tensor_req_t r;
    char err[512];
    ASSERT_OK(sp_tensor_req_parse(body, strlen(body), no_hdr, 64, &r, err, sizeof err));
    ASSERT_EQ(r.n_inputs, 11);
    ASSERT_STR_EQ(r.id, "a");
    const sp_tensor_t *t = sp_tensor_req_input(&r, "b");
    ASSERT(t && t->n == 2 && ((uint8_t *)t->data)[0] == 1 && ((uint8_t *)t->data)[1] == 0);
    t = sp_tensor_req_input(&r, "u8");
    ASSERT(t && t->ndim == 2 && ((uint8_t *)t->data)[1] == 255);
    ASSERT_EQ(sp_tensor_i64(sp_tensor_req_input(&r, "u64"), 0), INT64_MAX);
    ASSERT_EQ(sp_tensor_i64(sp_tensor_req_input(&r, "i8"), 0), -128);
    ASSERT_EQ(sp_tensor_i64(sp_tensor_req_input(&r, "i16"), 0), -32768);
    ASSERT_EQ(sp_tensor_i64(sp_tensor_req_input(&r, "i64"), 0), INT64_MIN);
    t = sp_tensor_req_input(&r, "h");
    ASSERT_EQ(sp_tensor_f64(t, 0), 1.5);
    ASSERT_EQ(sp_tensor_f64(t, 1), -65504);
    t = sp_tensor_req_input(&r, "f");
    ASSERT(t->n == 4 && ((float *)t->data)[3] == 0.25f);
    t = sp_tensor_req_input(&r, "d");
    ASSERT(t->ndim == 0 && t->n == 1 && ((double *)t->data)[0] == 0.1);
    t = sp_tensor_req_input(&r, "s");
    ASSERT_EQ(sp_tensor_str(t, 0).len, 1);
    ASSERT_EQ(sp_tensor_str(t, 1).len, 0);
    ASSERT_STR_EQ(sp_tensor_str(t, 2).ptr, "\xc3\xa9t\xc3\xa9"); /* NUL-terminated in the store */
    ASSERT_EQ(sp_tensor_req_input(&r, "z")->n, 0);
    ASSERT(sp_tensor_req_input(&r, "nope") == NULL);

    /* echo every input back as an output: the JSON round-trips */
    sp_jbuf_t js, bin;
    sp_jbuf_init(&js);
    sp_jbuf_init(&bin);
    sp_tensor_resp_write(&js, &bin, "m", "1", &r, NULL, r.inputs, r.n_inputs);
    ASSERT_EQ(bin.len, 0);
    ASSERT(strstr(js.p, "{\"name\":\"b\",\"datatype\":\"BOOL\",\"shape\":[2],\"data\":[true,false]}"));
    ASSERT(strstr(js.p, "\"data\":[9223372036854775807]"));
    ASSERT(strstr(js.p, "\"data\":[1.5,-65504]"));
    ASSERT(strstr(js.p, "\"shape\":[2,2],\"data\":[1,2,3,0.25]"));
    ASSERT(strstr(js.p, "\"data\":[0.10000000000000001]"));
    ASSERT(strstr(js.p, "\"data\":[\"x\",\"\",\"\xc3\xa9t\xc3\xa9\"]"));
    ASSERT(strstr(js.p, "\"id\":\"a\""));
    json_t *back = NULL;
    ASSERT_OK(sp_json_parse(js.p, js.len, 64, &back, err, sizeof err));
    json_decref(back);
    sp_jbuf_free(&js);
    sp_jbuf_free(&bin);
    sp_tensor_req_free(&r);
}

/* A body: JSON part + binary tail; header = the JSON part's length. */
typedef struct body {
    char b[1024];
    size_t len, json_len;
    char hl[24];
} body_t;

static void
make_body(body_t *m, const char *json, const void *tail, size_t tail_len)
{
    m->json_len = strlen(json);
    memcpy(m->b, json, m->json_len);
    memcpy(m->b + m->json_len, tail, tail_len);
    m->len = m->json_len + tail_len;
    snprintf(m->hl, sizeof m->hl, "%zu", m->json_len);
}

TEST(tensor_binary_inputs_and_outputs)
{
    sp_json_init();
    unsigned char tail[64];
    size_t o = 0;
    const unsigned char bytes[] = {3, 0, 0, 0, 'a', 'b', 'c', 0, 0, 0, 0, 2, 0, 0, 0, 0xff, 0};
    memcpy(tail + o, bytes, sizeof bytes);
    o += sizeof bytes;
    int32_t iv[2] = {-7, 123456};
    memcpy(tail + o, iv, 8);
    o += 8;
    sp_fp16_t hv = sp_fp32_to_fp16(0.5f);
    memcpy(tail + o, &hv, 2);
    o += 2;
    const char *json =
        "{\"inputs\":["
        "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[3],\"parameters\":{\"binary_data_size\":17}},"
        "{\"name\":\"i\",\"datatype\":\"INT32\",\"shape\":[2],\"parameters\":{\"binary_data_size\":8}},"
        "{\"name\":\"h\",\"datatype\":\"FP16\",\"shape\":[1],\"parameters\":{\"binary_data_size\":2}},"
        "{\"name\":\"j\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[5]}],"
        "\"outputs\":[{\"name\":\"s\",\"parameters\":{\"binary_data\":true}},{\"name\":\"i\"},"
        "{\"name\":\"h\",\"parameters\":{\"binary_data\":false}}],"
        "\"parameters\":{\"binary_data_output\":true}}";
    body_t m;
    make_body(&m, json, tail, o);
    sp_tensor_req_t r;
    char err[512];
    ASSERT_OK(sp_tensor_req_parse(m.b, m.len, hdr(m.hl), 64, &r, err, sizeof err));
    const sp_tensor_t *s = sp_tensor_req_input(&r, "s");
    ASSERT_EQ(s->n, 3);
    ASSERT(sp_tensor_str(s, 0).len == 3 && memcmp(sp_tensor_str(s, 0).ptr, "abc", 3) == 0);
    ASSERT_EQ(sp_tensor_str(s, 1).len, 0);
    ASSERT(sp_tensor_str(s, 2).len == 2 && (unsigned char)sp_tensor_str(s, 2).ptr[0] == 0xff);
    ASSERT_EQ(sp_tensor_i64(sp_tensor_req_input(&r, "i"), 0), -7);
    ASSERT_EQ(sp_tensor_i64(sp_tensor_req_input(&r, "i"), 1), 123456);
    ASSERT_EQ(sp_tensor_f64(sp_tensor_req_input(&r, "h"), 0), 0.5);
    ASSERT_EQ(sp_tensor_i64(sp_tensor_req_input(&r, "j"), 0), 5);
    /* binary: s (own flag), i (request default), j (not requested: default); h: own false */
    ASSERT(sp_tensor_req_output_binary(&r, "s") && sp_tensor_req_output_binary(&r, "i"));
    ASSERT(!sp_tensor_req_output_binary(&r, "h") && sp_tensor_req_output_binary(&r, "j"));
    const char *names[] = {"s", "i", "h", "j"};
    bool want[4];
    ASSERT_OK(sp_tensor_req_select_outputs(&r, names, 4, want, err, sizeof err));
    ASSERT(want[0] && want[1] && want[2] && !want[3]);
    const char *bad[] = {"s", "i"};
    ASSERT_EQ(sp_tensor_req_select_outputs(&r, bad, 2, want, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "'h'") != NULL);

    sp_jbuf_t js, bin;
    sp_jbuf_init(&js);
    sp_jbuf_init(&bin);
    sp_tensor_resp_write(&js, &bin, "m", NULL, &r, "{\"k\":1}", r.inputs, 3);
    ASSERT_EQ(bin.len, 17 + 8); /* s's BYTES exactly as they came, then i */
    ASSERT(memcmp(bin.p, bytes, 17) == 0 && memcmp(bin.p + 17, iv, 8) == 0);
    ASSERT(strstr(js.p, "\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[3],\"parameters\":{\"binary_data_size\":17}"));
    ASSERT(strstr(js.p, "\"name\":\"h\",\"datatype\":\"FP16\",\"shape\":[1],\"data\":[0.5]"));
    ASSERT(strstr(js.p, "\"parameters\":{\"k\":1}") && !strstr(js.p, "model_version"));
    sp_jbuf_free(&js);
    sp_jbuf_free(&bin);
    sp_tensor_req_free(&r);

    /* every truncation of the tail, and every shorter header value, is an error */
    for (size_t cut = 0; cut < o; cut++) {
        ASSERT_EQ(sp_tensor_req_parse(m.b, m.json_len + cut, hdr(m.hl), 64, &r, err, sizeof err),
                  SP_ERR_INVALID);
    }
    for (size_t hl = 0; hl < m.json_len; hl++) {
        char h[24];
        snprintf(h, sizeof h, "%zu", hl);
        ASSERT(sp_tensor_req_parse(m.b, m.len, hdr(h), 64, &r, err, sizeof err) != SP_OK);
    }
    char past[24];
    snprintf(past, sizeof past, "%zu", m.len + 1);
    ASSERT_EQ(sp_tensor_req_parse(m.b, m.len, hdr(past), 64, &r, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "past the end") != NULL);
    ASSERT_EQ(sp_tensor_req_parse(m.b, m.len, hdr("18446744073709551616"), 64, &r, err, sizeof err),
              SP_ERR_INVALID);
    ASSERT_EQ(sp_tensor_req_parse(m.b, m.len, hdr("-1"), 64, &r, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_tensor_req_parse(m.b, m.len, hdr(""), 64, &r, err, sizeof err), SP_ERR_INVALID);
}

/* Two requests decoded the same way, field by field. */
static void
assert_same_req(const sp_tensor_req_t *a, const sp_tensor_req_t *b)
{
    ASSERT_EQ(a->n_inputs, b->n_inputs);
    ASSERT_EQ(a->n_outputs, b->n_outputs);
    ASSERT_EQ(a->binary_output, b->binary_output);
    ASSERT_EQ(a->id_len, b->id_len);
    ASSERT((a->id == NULL) == (b->id == NULL));
    ASSERT(a->id == NULL || memcmp(a->id, b->id, a->id_len) == 0);
    ASSERT((a->params == NULL) == (b->params == NULL));
    for (int i = 0; i < a->n_inputs; i++) {
        const sp_tensor_t *x = &a->inputs[i], *y = &b->inputs[i];
        ASSERT(strcmp(x->name, y->name) == 0);
        ASSERT(x->dtype == y->dtype && x->ndim == y->ndim && x->n == y->n);
        ASSERT(memcmp(x->shape, y->shape, sizeof x->shape) == 0);
        if (x->dtype == SP_DT_BYTES) {
            for (int64_t e = 0; e < x->n; e++) {
                sp_str_t u = sp_tensor_str(x, e), v = sp_tensor_str(y, e);
                ASSERT(u.len == v.len && memcmp(u.ptr, v.ptr, u.len) == 0);
            }
        } else {
            ASSERT(memcmp(x->data, y->data, (size_t)x->n * sp_tensor_dtype_size(x->dtype)) == 0);
        }
    }
    for (int i = 0; i < a->n_outputs; i++) {
        ASSERT(strcmp(a->outputs[i].name, b->outputs[i].name) == 0);
        ASSERT_EQ(a->outputs[i].binary, b->outputs[i].binary);
    }
}

TEST(tensor_header_cache)
{
    sp_json_init();
    size_t base = sp_alloc_bytes_in_use();
    sp_tensor_hcache_t *hc = sp_tensor_hcache_new();
    ASSERT(hc != NULL);
    const char *json =
        "{\"id\":\"q\",\"inputs\":["
        "{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1,2],\"parameters\":{\"binary_data_size\":8}},"
        "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[1],\"parameters\":{\"binary_data_size\":6}},"
        "{\"name\":\"b\",\"datatype\":\"BOOL\",\"shape\":[2],\"parameters\":{\"binary_data_size\":2}}],"
        "\"outputs\":[{\"name\":\"y\",\"parameters\":{\"binary_data\":true}}],"
        "\"parameters\":{\"priority\":2}}";
    char err[512], err2[512];
    uint64_t hits, misses;
    /* Three requests with the same JSON part and different values: the
     * first is decoded in full and kept, the others reuse it, and each gives
     * exactly what the uncached parse gives. */
    for (int k = 0; k < 3; k++) {
        unsigned char tail[16];
        float xv[2] = {1.5f + (float)k, -2.0f * (float)k};
        memcpy(tail, xv, 8);
        const unsigned char sv[6] = {2, 0, 0, 0, (unsigned char)('a' + k), 'z'};
        memcpy(tail + 8, sv, 6);
        tail[14] = (unsigned char)(k & 1);
        tail[15] = 1;
        body_t m;
        make_body(&m, json, tail, sizeof tail);
        sp_tensor_req_t a, b;
        ASSERT_OK(sp_tensor_req_parse_cached(hc, m.b, m.len, hdr(m.hl), 64, &a, err, sizeof err));
        ASSERT_OK(sp_tensor_req_parse(m.b, m.len, hdr(m.hl), 64, &b, err, sizeof err));
        assert_same_req(&a, &b);
        ASSERT_EQ(sp_tensor_f64(sp_tensor_req_input(&a, "x"), 0), 1.5 + k);
        ASSERT_EQ(sp_tensor_str(sp_tensor_req_input(&a, "s"), 0).ptr[0], 'a' + k);
        sp_tensor_req_free(&a);
        sp_tensor_req_free(&b);
    }
    sp_tensor_hcache_counts(hc, &hits, &misses);
    ASSERT_EQ(hits, 2);
    ASSERT_EQ(misses, 1);

    /* A bad tail on a cached header: the same error as the full path. */
    {
        unsigned char tail[16] = {0};
        tail[10] = 9; /* BYTES element length 9 > the 2 bytes left */
        tail[8] = 9;
        tail[14] = 2; /* and a BOOL of 2 */
        body_t m;
        make_body(&m, json, tail, sizeof tail);
        sp_tensor_req_t r;
        ASSERT_EQ(sp_tensor_req_parse_cached(hc, m.b, m.len, hdr(m.hl), 64, &r, err, sizeof err),
                  SP_ERR_INVALID);
        ASSERT_EQ(sp_tensor_req_parse(m.b, m.len, hdr(m.hl), 64, &r, err2, sizeof err2),
                  SP_ERR_INVALID);
        ASSERT(strcmp(err, err2) == 0);
        ASSERT(strstr(err, "inputs[1] ('s')") != NULL);
        /* a tail of the wrong length falls back to the full path's message */
        ASSERT_EQ(sp_tensor_req_parse_cached(hc, m.b, m.len - 1, hdr(m.hl), 64, &r, err, sizeof err),
                  SP_ERR_INVALID);
        ASSERT_EQ(sp_tensor_req_parse(m.b, m.len - 1, hdr(m.hl), 64, &r, err2, sizeof err2),
                  SP_ERR_INVALID);
        ASSERT(strcmp(err, err2) == 0);
    }

    /* Inline JSON data is not kept; a different id is another entry; more
     * distinct headers than slots evict the least recently used. */
    {
        const char *inl = "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT32\",\"shape\":[1],"
                          "\"data\":[4]}]}";
        body_t m;
        make_body(&m, inl, "", 0);
        sp_tensor_req_t r;
        sp_tensor_hcache_counts(hc, &hits, &misses);
        uint64_t h0 = hits;
        for (int k = 0; k < 2; k++) {
            ASSERT_OK(sp_tensor_req_parse_cached(hc, m.b, m.len, hdr(m.hl), 64, &r, err, sizeof err));
            ASSERT_EQ(sp_tensor_i64(&r.inputs[0], 0), 4);
            sp_tensor_req_free(&r);
        }
        sp_tensor_hcache_counts(hc, &hits, &misses);
        ASSERT_EQ(hits, h0);
    }
    for (int k = 0; k < 20; k++) {
        char j[256];
        snprintf(j, sizeof j,
                 "{\"id\":\"%d\",\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT32\",\"shape\":[1],"
                 "\"parameters\":{\"binary_data_size\":4}}]}", k % 10);
        int32_t v = k;
        body_t m;
        make_body(&m, j, &v, 4);
        sp_tensor_req_t r;
        ASSERT_OK(sp_tensor_req_parse_cached(hc, m.b, m.len, hdr(m.hl), 64, &r, err, sizeof err));
        ASSERT_EQ(sp_tensor_i64(&r.inputs[0], 0), k);
        ASSERT(r.id_len == 1 && r.id[0] == (char)('0' + k % 10));
        sp_tensor_req_free(&r);
    }
    /* allocation failures on the way in and out of the cache: errors or
     * plain misses, never a leak */
    for (int64_t f = 0; f < 40; f++) {
        unsigned char tail[16] = {0};
        tail[8] = 2;
        body_t m;
        make_body(&m, json, tail, sizeof tail);
        sp_tensor_req_t r;
        sp_alloc_fail_after(f);
        sp_status_t st = sp_tensor_req_parse_cached(hc, m.b, m.len, hdr(m.hl), 64, &r, err, sizeof err);
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            sp_tensor_req_free(&r);
        }
    }
    sp_tensor_hcache_free(hc);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base);
}

TEST(tensor_rejects_bad_requests)
{
    sp_json_init();
    static const struct {
        const char *json, *needle;
    } cases[] = {
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[4611686018427387904,4],\"data\":[1]}]}", "too large"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[3],\"data\":[1,2]}]}", "2 elements"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2,2],\"data\":[[1,2,3],[4]]}]}", "nesting"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2,2],\"data\":[[1,2],3,4]}]}", "nesting"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[[[1]]]}]}", "nesting"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":1}]}", "must be a list"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT16\",\"shape\":[1],\"data\":[40000]}]}", "data[0]"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"UINT32\",\"shape\":[2],\"data\":[1,1.5]}]}", "data[1]"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BOOL\",\"shape\":[1],\"data\":[null]}]}", "null"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP16\",\"shape\":[1],\"data\":[70000]}]}", "FP16"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"F32\",\"shape\":[1],\"data\":[1]}]}", "datatype"},
        {"{\"inputs\":[{\"name\":\"\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}", "name"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]},"
         "{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}", "duplicate"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"parameters\":{\"binary_data_size\":4}}]}",
         "Inference-Header-Content-Length"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"parameters\":[]}]}", "parameters"},
        {"{\"inputs\":{}}", "inputs"},
        {"{\"inputs\":[1]}", "object"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}],\"outputs\":[{}]}", "outputs[0]"},
        {"[]", "object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sp_tensor_req_t r;
        char err[512] = "";
        size_t base = sp_alloc_bytes_in_use();
        sp_status_t st = sp_tensor_req_parse(cases[i].json, strlen(cases[i].json), no_hdr, 64, &r, err, sizeof err);
        if (st != SP_ERR_INVALID || strstr(err, cases[i].needle) == NULL) {
            SP_TEST_FAIL("case %zu: status %d, error '%s' (want '%s')", i, (int)st, err, cases[i].needle);
        }
        ASSERT_EQ(sp_alloc_bytes_in_use(), base);
    }
}

/* Found by fuzz_tensor: a BYTES element that claims the bytes meant for the
 * lengths of later elements must not overrun the element store. */
TEST(tensor_bytes_element_eats_later_lengths)
{
    sp_json_init();
    const char *json = "{\"inputs\":[{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[2],"
                       "\"parameters\":{\"binary_data_size\":11}}]}";
    const unsigned char tail[11] = {7, 0, 0, 0, 'a', 'b', 'c', 'd', 'e', 'f', 'g'};
    body_t m;
    make_body(&m, json, tail, sizeof tail);
    sp_tensor_req_t r;
    char err[512];
    size_t base = sp_alloc_bytes_in_use();
    ASSERT_EQ(sp_tensor_req_parse(m.b, m.len, hdr(m.hl), 64, &r, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "element 1") != NULL);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base);
}

TEST(tensor_alloc_failure_at_every_step)
{
    sp_json_init();
    const char *json =
        "{\"id\":\"q\",\"inputs\":["
        "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[2],\"data\":[\"hello\",\"world\"]},"
        "{\"name\":\"b\",\"datatype\":\"BYTES\",\"shape\":[1],\"parameters\":{\"binary_data_size\":7}},"
        "{\"name\":\"f\",\"datatype\":\"FP32\",\"shape\":[2,1],\"data\":[[1],[2]]}],"
        "\"outputs\":[{\"name\":\"s\"}]}";
    const unsigned char tail[] = {3, 0, 0, 0, 'x', 'y', 'z'};
    body_t m;
    make_body(&m, json, tail, sizeof tail);
    size_t base = sp_alloc_bytes_in_use();
    bool ok = false;
    for (int64_t k = 0; k < 400 && !ok; k++) {
        sp_tensor_req_t r;
        char err[256];
        sp_alloc_fail_after(k);
        sp_status_t st = sp_tensor_req_parse(m.b, m.len, hdr(m.hl), 64, &r, err, sizeof err);
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            ok = true;
            ASSERT_EQ(r.n_inputs, 3);
            sp_tensor_req_free(&r);
        }
        ASSERT_EQ(sp_alloc_bytes_in_use(), base);
    }
    ASSERT(ok);
}

TEST(tensor_build_and_free)
{
    sp_tensor_t t;
    char err[128];
    int64_t shape[2] = {2, 3};
    size_t base = sp_alloc_bytes_in_use();
    ASSERT_OK(sp_tensor_alloc(&t, "z", SP_DT_INT64, 2, shape, err, sizeof err));
    ASSERT(t.n == 6 && sp_tensor_i64(&t, 5) == 0);
    sp_tensor_free(&t);
    sp_str_t e[2] = {sp_str_c("ab"), sp_str_c("")};
    ASSERT_OK(sp_tensor_from_strs(&t, "s", 1, shape, e, err, sizeof err));
    ASSERT(t.n == 2 && strcmp(sp_tensor_str(&t, 0).ptr, "ab") == 0 && sp_tensor_str(&t, 1).len == 0);
    sp_tensor_free(&t);
    int64_t huge[3] = {1LL << 40, 1LL << 40, 4};
    ASSERT_EQ(sp_tensor_alloc(&t, "h", SP_DT_FP32, 3, huge, err, sizeof err), SP_ERR_INVALID);
    int64_t neg[1] = {-1};
    ASSERT_EQ(sp_tensor_alloc(&t, "n", SP_DT_FP32, 1, neg, err, sizeof err), SP_ERR_INVALID);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base);
}
