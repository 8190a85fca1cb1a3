/*
 * fuzz_tensor.c - libFuzzer target for the KServe v2 request decoder and the
 * response encoder (src/api/tensor.c).
 *
 * Seeds: tests/fuzz/corpus/tensor. Input: byte 0 picks the
 * Inference-Header-Content-Length: bit 7 set means no header; otherwise bytes
 * 0-1 (big-endian, 15 bits) modulo (body length + 2) is its value, so values
 * just past the body are tried too. The rest is the body, copied into an
 * exact-size heap buffer so ASan catches any read past its end.
 *
 * Whatever decodes is checked and re-encoded: every element of every tensor
 * is read, BYTES elements must be NUL-terminated in their store, and the
 * response written from the inputs (outputs requested in binary or JSON as
 * the request says) must be valid JSON whose binary_data_size values add up
 * to the binary tail.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/tensor.h"

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    sp_json_init();
    size_t len = size - 2;
    char *body = malloc(len ? len : 1);
    if (body == NULL) {
        return 0;
    }
    memcpy(body, data + 2, len);
    char hl[32];
    sp_str_t header = {NULL, 0};
    if (!(data[0] & 0x80)) {
        unsigned v = ((unsigned)data[0] << 8 | data[1]) % (unsigned)(len + 2);
        snprintf(hl, sizeof hl, "%u", v);
        header = sp_str_c(hl);
    }
    sp_tensor_req_t r;
    char err[512];
    if (sp_tensor_req_parse(body, len, header, 64, &r, err, sizeof err) != SP_OK) {
        if (err[0] == '\0') {
            abort(); /* every failure says why */
        }
        free(body);
        return 0;
    }
    for (int i = 0; i < r.n_inputs; i++) {
        const sp_tensor_t *t = &r.inputs[i];
        if (t->n < 0 || t->name[0] == '\0') {
            abort();
        }
        for (int64_t k = 0; k < t->n; k++) {
            if (t->dtype == SP_DT_BYTES) {
                sp_str_t s = sp_tensor_str(t, k);
                if (s.ptr[s.len] != '\0') {
                    abort();
                }
                sink ^= (uint8_t)(s.len ? s.ptr[0] ^ s.ptr[s.len - 1] : 0);
            } else {
                sink ^= (uint8_t)sp_tensor_i64(t, k);
            }
        }
    }
    const char *names[2] = {r.n_inputs ? r.inputs[0].name : "x", "y"};
    bool want[2];
    sp_tensor_req_select_outputs(&r, names, 2, want, err, sizeof err);
    sp_jbuf_t js, bin;
    sp_jbuf_init(&js);
    sp_jbuf_init(&bin);
    sp_tensor_resp_write(&js, &bin, "m", "1", &r, NULL, r.inputs, r.n_inputs);
    json_t *back = NULL;
    if (!js.oom && !bin.oom) {
        /* BYTES may hold NUL, written as \u0000: valid JSON, which jansson
         * accepts only when asked. */
        json_error_t je;
        back = json_loadb(js.p, js.len, JSON_ALLOW_NUL, &je);
        if (back == NULL) {
            fprintf(stderr, "response is not JSON: %s\n%.*s\n", je.text, (int)js.len, js.p);
            abort();
        }
        size_t total = 0;
        json_t *outs = json_object_get(back, "outputs");
        for (size_t i = 0; i < json_array_size(outs); i++) {
            json_t *p = json_object_get(json_array_get(outs, i), "parameters");
            total += (size_t)json_integer_value(json_object_get(p, "binary_data_size"));
        }
        if (total != bin.len) {
            abort();
        }
        json_decref(back);
    }
    sp_jbuf_free(&js);
    sp_jbuf_free(&bin);
    sp_tensor_req_free(&r);
    free(body);
    return 0;
}
