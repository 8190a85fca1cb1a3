/*
 * fuzz_kserve.c - libFuzzer target for the KServe v2 / Open Inference
 * Protocol routes of the real server (serve_harness.h): infer with JSON
 * tensors and with the binary tensor data extension, Triton's generate and
 * generate_stream, and model metadata and readiness.
 *
 * fuzz_tensor already drives the tensor codec (sp_tensor_req_parse and the
 * response encoder) directly and fast; this target adds what lies behind it
 * in kserve.c: the generate parameters (top-level and `parameters`, strict
 * and open sets), one-element setting tensors (max_tokens, temperature, stop
 * ...), the prompt batch, priority and timeout with Triton's conventions, the
 * scheduler hand-off and the infer/generate/stream answers (binary tails
 * included) - all through HTTP, so the Inference-Header-Content-Length header
 * arrives as a client sends it (any text, not only numbers).
 *
 * Seeds: tests/fuzz/corpus/kserve. Dictionary: tests/fuzz/kserve.dict.
 *
 * Input: an optional first line "<route> [<Inference-Header-Content-Length>]"
 * followed by the body. Routes: infer, vinfer (/versions/1/infer), generate,
 * stream (generate_stream), meta (POST to the metadata route: 405). The header
 * value is taken as written (printable bytes only, so the request stays one
 * request). Without a first line that names a route, the whole input is an
 * infer body with no header.
 *
 *   make fuzz
 *   ./build-fuzz/fuzz_kserve -dict=tests/fuzz/kserve.dict -max_len=8192 \
 *       tests/fuzz/corpus-work/kserve tests/fuzz/corpus/kserve
 */
#include "serve_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct {
    const char *word;
    const char *path;
} routes[] = {
    {"infer", "/v2/models/stories260K/infer"},
    {"vinfer", "/v2/models/stories260K/versions/1/infer"},
    {"generate", "/v2/models/stories260K/generate"},
    {"stream", "/v2/models/stories260K/generate_stream"},
    {"meta", "/v2/models/stories260K"},
};

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_fuzz_serve_start(NULL);
    if (size > (1u << 20)) {
        return 0;
    }
    const char *path = routes[0].path;
    char hdr[160] = "";
    size_t skip = 0;
    const uint8_t *nl = memchr(data, '\n', size < 128 ? size : 128);
    if (nl) {
        size_t line = (size_t)(nl - data);
        for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++) {
            size_t wl = strlen(routes[r].word);
            if (line >= wl && memcmp(data, routes[r].word, wl) == 0 &&
                (line == wl || data[wl] == ' ')) {
                path = routes[r].path;
                skip = line + 1;
                if (line > wl + 1) {
                    size_t o = (size_t)snprintf(hdr, sizeof hdr, "Inference-Header-Content-Length: ");
                    for (size_t i = wl + 1; i < line && o < sizeof hdr - 3; i++) {
                        if (data[i] >= 0x20 && data[i] < 0x7f) {
                            hdr[o++] = (char)data[i];
                        }
                    }
                    memcpy(hdr + o, "\r\n", 3);
                }
                break;
            }
        }
    }
    sp_fuzz_post(path, hdr[0] ? hdr : NULL, data + skip, size - skip);
    return 0;
}
