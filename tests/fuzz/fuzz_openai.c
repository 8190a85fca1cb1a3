/*
 * fuzz_openai.c - libFuzzer target for the OpenAI routes: request bodies of
 * /v1/completions, /v1/chat/completions and /v1/embeddings, through the real
 * server (serve_harness.h: the whole `sampan serve` in this process, the demo
 * model, one loopback connection per input).
 *
 * Seeds: tests/fuzz/corpus/openai (request bodies, most of them from
 * tests/py/test_server.py). Dictionary: tests/fuzz/openai.dict.
 *
 * Input: a JSON request body. Its route follows from its content: "messages"
 * -> chat, else "input" -> embeddings, else completions. An input whose first
 * line is a path ("/v1/chat/completions\n{...}", characters [A-Za-z0-9/_.-]
 * only) is posted to that path instead, so the mutator can also send a chat
 * body without messages or any body to any route.
 *
 * What this reaches: the body limits and JSON depth scan, jansson's strict
 * parse, every field check of openai.c (sampling ranges, max_tokens against
 * the context, n, stop, logprobs, response_format, stream options, priority and
 * timeout via schedreq.c), messages and content parts, the chat template
 * render, tokenization of the prompt, the scheduler hand-off, and the response
 * writers (JSON and SSE, logprobs, usage) for inputs that reach generation
 * (max_tokens is capped at 8, the context at 128). Checks (serve_harness.h):
 * no hang, no 500, error answers are JSON error objects, every JSON answer and
 * every SSE event parses, and no log line carries a raw control byte.
 *
 * What it does not reach: authentication (the tenants file has its own
 * target, fuzz_tenants), connection-level parsing of arbitrary bytes
 * (fuzz_http), and model files (fuzz_gguf, fuzz_model).
 *
 *   make fuzz
 *   ./build-fuzz/fuzz_openai -dict=tests/fuzz/openai.dict -max_len=8192 \
 *       tests/fuzz/corpus-work/openai tests/fuzz/corpus/openai
 */
#include "serve_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *
route_of(const uint8_t *data, size_t size, size_t *skip, char *path, size_t cap)
{
    *skip = 0;
    if (size > 1 && data[0] == '/') {
        const uint8_t *nl = memchr(data, '\n', size < cap ? size : cap - 1);
        if (nl) {
            size_t n = (size_t)(nl - data);
            bool ok = n > 0;
            for (size_t i = 0; i < n && ok; i++) {
                uint8_t c = data[i];
                ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '/' || c == '_' || c == '.' || c == '-';
            }
            if (ok) {
                memcpy(path, data, n);
                path[n] = '\0';
                *skip = n + 1;
                return path;
            }
        }
    }
    if (memmem(data, size, "\"messages\"", 10)) {
        return "/v1/chat/completions";
    }
    if (memmem(data, size, "\"input\"", 7)) {
        return "/v1/embeddings";
    }
    return "/v1/completions";
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_fuzz_serve_start(NULL);
    if (size > (1u << 20)) {
        return 0;
    }
    char path[256];
    size_t skip;
    const char *route = route_of(data, size, &skip, path, sizeof path);
    sp_fuzz_post(route, NULL, data + skip, size - skip);
    return 0;
}
