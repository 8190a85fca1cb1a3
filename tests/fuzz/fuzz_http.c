/*
 * fuzz_http.c - libFuzzer target for HTTP request handling: arbitrary bytes
 * on a connection to the real server (serve_harness.h), so http-parser with
 * the server's own callbacks and limits, the connection state machine
 * (pipelining, keep-alive, chunked bodies, 100-continue, early errors,
 * half-close), the router (404/405, HEAD on GET routes, path captures), the
 * request-id and access-log handling, and every route behind it.
 *
 * Why the real server rather than http_parser_execute with copied callbacks:
 * the callbacks are static in src/http/http.c and work on the connection's
 * bufferevent, and a copy would drift from what ships; through loopback the
 * target runs about 2,000 inputs/s here, enough for libFuzzer.
 *
 * The server runs with small limits (URL 256 bytes, head 1 KiB, 12 headers,
 * body 2 KiB) so that inputs of a few KiB reach every 413/414/431 branch. The
 * connection's write side is shut after the input, so an incomplete request
 * ends at once (the server closes it) and complete ones are answered before
 * the close (the server treats the FIN as a half-close).
 *
 * Checks: besides ASan/UBSan, no hang (an answer or a close within 8 s), the
 * first answer (if any) has a well-formed status line and is not a 500, and no
 * log line carries a raw control byte (H13).
 *
 * Seeds: tests/fuzz/corpus/http (requests from tests/py/test_server.py and
 * the bad inputs of RELIABILITY.md 2c). Dictionary: tests/fuzz/http.dict.
 *
 *   make fuzz
 *   ./build-fuzz/fuzz_http -dict=tests/fuzz/http.dict -max_len=8192 \
 *       tests/fuzz/corpus-work/http tests/fuzz/corpus/http
 */
#include "serve_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const flags[] = {
        "--max-url-bytes", "256", "--max-header-bytes", "1024", "--max-headers", "12",
        "--max-body-bytes", "2048", "--header-timeout", "2", "--body-timeout", "2", NULL};
    static char *resp;
    sp_fuzz_serve_start(flags);
    if (!resp) {
        resp = malloc(SP_FUZZ_RESP_CAP);
    }
    if (size > (1u << 20)) {
        return 0;
    }
    size_t n = sp_fuzz_exchange((const char *)data, size, true, resp, SP_FUZZ_RESP_CAP);
    if (sp_fuzz_verbose) {
        fprintf(stderr, "answer: %.*s\n", (int)(n > 600 ? 600 : n), resp);
    }
    if (n == 0) {
        return 0; /* closed without an answer: an incomplete request, or aborted */
    }
    if (n < 13 || memcmp(resp, "HTTP/1.", 7) != 0 || (resp[7] != '0' && resp[7] != '1') ||
        resp[8] != ' ' || resp[9] < '1' || resp[9] > '5' || resp[12] != ' ') {
        sp_fuzz_die("malformed status line", resp, n);
    }
    if (memcmp(resp + 9, "500", 3) == 0) {
        sp_fuzz_die("500 Internal Server Error for a request", (const char *)data, size);
    }
    return 0;
}
