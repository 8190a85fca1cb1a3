/*
 * fuzz_grpc.c - libFuzzer target for the gRPC front end's message translation
 * (src/api/grpc_msg.c): protobuf request messages decoded under the
 * allocation budget and turned into REST requests, and REST answers turned
 * back into reply messages.
 *
 * Seeds: tests/fuzz/corpus/grpc. Input: byte 0 picks what is fuzzed: values
 * 0-6 decode the rest as the request message of that method (6, the
 * ModelStreamInfer, in turn as an LLM and as a tensor model, from bit 7);
 * 7-13 read the rest as a REST answer body (JSON and binary tail; the first
 * 2 bytes are its Inference-Header-Content-Length modulo the length) for
 * each answer kind; 14 as a generate_stream event; 15-20 as the request of
 * grpc_ext.c's methods (statistics, repository, health); 21-26 as a REST
 * answer of grpc_ext.c's kinds (bit 0 of byte 1: status 200, else 400, 404
 * or 503 from bits 1-2). Everything is copied into
 * an exact-size heap buffer so ASan sees any read past its end; every
 * failure must come with a message, and every built message must parse back
 * as a gRPC frame of the right length.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "api/grpc_msg.h"
#include "core/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool llm_answer;

static bool
is_llm(void *ud, const char *name, size_t len, const char *version, size_t vlen)
{
    return llm_answer;
}

static void
check_frame(const uint8_t *m, size_t n)
{
    if (n < 5 || m[0] != 0 ||
        ((size_t)m[1] << 24 | (size_t)m[2] << 16 | (size_t)m[3] << 8 | m[4]) != n - 5) {
        abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    sp_json_init();
    int mode = data[0] & 0x7f;
    llm_answer = data[0] & 0x80;
    size_t len = size - 1;
    uint8_t *buf = malloc(len ? len : 1);
    if (buf == NULL) {
        return 0;
    }
    memcpy(buf, data + 1, len);
    char err[1024];
    if (mode >= 15 && mode < 15 + (SP_GRPC_METHOD_COUNT - SP_GRPC_EXT_FIRST)) {
        sp_grpc_rest_t r;
        int code = sp__grpc_ext_to_rest(SP_GRPC_EXT_FIRST + (mode - 15), buf, len, &r, err,
                                        sizeof err);
        if (code != SP_GRPC_OK) {
            if (err[0] == '\0') {
                abort();
            }
        } else {
            if (r.path_len == 0 || r.path[0] != '/' || (r.method == SP_HTTP_POST && r.body == NULL &&
                                                        r.kind != SP_GRPC_K_REPO_UNLOAD)) {
                abort();
            }
            sp__grpc_msg_rest_free(&r);
        }
    } else if (mode >= 21 && mode <= 21 + (SP_GRPC_K_HEALTH_WATCH - SP_GRPC_K_STATS) && len >= 2) {
        static const int statuses[] = {400, 404, 503, 401};
        int status = (buf[1] & 1) ? 200 : statuses[(buf[1] >> 1) & 3];
        sp_grpc_kind_t kind = (sp_grpc_kind_t)(SP_GRPC_K_STATS + (mode - 21));
        uint8_t *out = NULL;
        size_t out_len = 0;
        char *body = malloc(len - 2 ? len - 2 : 1);
        if (body && (status == 200 || kind >= SP_GRPC_K_HEALTH)) {
            memcpy(body, buf + 2, len - 2);
            int code = sp__grpc_ext_from_rest(kind, status, body, len - 2, &out, &out_len, err,
                                              sizeof err);
            if ((code == SP_GRPC_OK) != (out != NULL) || (code != SP_GRPC_OK && err[0] == '\0')) {
                abort();
            }
            if (out) {
                check_frame(out, out_len);
            }
            sp_free(out);
        }
        free(body);
    } else if (mode < SP_GRPC_EXT_FIRST) {
        sp_grpc_rest_t r;
        int code = sp__grpc_msg_to_rest(mode, buf, len, is_llm, NULL, &r, err, sizeof err);
        if (code != SP_GRPC_OK) {
            if (err[0] == '\0') {
                abort();
            }
        } else {
            if (r.path_len == 0 || r.path[0] != '/' || (r.method == SP_HTTP_POST && r.body == NULL)) {
                abort();
            }
            sp__grpc_msg_rest_free(&r);
        }
    } else if (mode < 7 + SP_GRPC_K_GENERATE + 1 && len >= 2) {
        char hdrs[64] = "";
        size_t body_len = len - 2;
        unsigned hl = ((unsigned)buf[0] << 8 | buf[1]) % (unsigned)(body_len + 2);
        if (!(buf[0] & 0x80)) {
            snprintf(hdrs, sizeof hdrs, "Inference-Header-Content-Length: %u\r\n", hl);
        }
        char *body = malloc(body_len ? body_len : 1);
        if (body) {
            memcpy(body, buf + 2, body_len);
            uint8_t *out = NULL;
            size_t out_len = 0;
            int status = (buf[1] & 1) ? 200 : 400;
            int code = sp__grpc_msg_from_rest((sp_grpc_kind_t)(mode - 7), (buf[1] & 2) != 0, status, hdrs,
                                          strlen(hdrs), body, body_len, "id", &out, &out_len, err,
                                          sizeof err);
            if (code == SP_GRPC_OK && out == NULL) {
                abort();
            }
            if (out) {
                check_frame(out, out_len);
            }
            sp_free(out);
            free(body);
        }
    } else if (mode == 14) {
        uint8_t *out = NULL;
        size_t out_len = 0;
        bool final = false;
        if (sp__grpc_msg_from_event((const char *)buf, len, "id", &out, &out_len, &final)) {
            check_frame(out, out_len);
        }
        sp_free(out);
    }
    free(buf);
    return 0;
}
