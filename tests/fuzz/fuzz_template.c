/*
 * fuzz_template.c - libFuzzer target for the chat-template engine
 * (sp_jinja_compile + sp_jinja_render_json), RELIABILITY.md G19.
 *
 * Build with `make fuzz`; run (docs/chat-templates.md has longer runs):
 *   mkdir -p tests/fuzz/corpus-work/template
 *   ./build-fuzz/fuzz_template -max_total_time=60 -max_len=8192 \
 *       -dict=tests/fuzz/template.dict tests/fuzz/corpus-work/template tests/fuzz/corpus/template
 *
 * Input: template source, optionally followed by a NUL byte and a JSON
 * context; without one, a fixed conversation with a system message, tool
 * calls and tools is used. Limits are tight (steps, output, memory, depth) so
 * that one input runs in milliseconds; any crash, leak, hang or UB is a bug.
 * Whatever renders must be a NUL-terminated string of the reported length.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "chat/jinja.h"

static const char default_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
    "{\"role\": \"user\", \"content\": \" Hi \\u00e9 \"}, "
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call00001\", "
    "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": [1, 2.5]}}}]}, "
    "{\"role\": \"tool\", \"content\": \"42\", \"tool_call_id\": \"call00001\"}, "
    "{\"role\": \"user\", \"content\": \"<think>\\nx\\n</think>\\n\\nok\"}], "
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"array\"}}}}}], "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul != NULL ? (size_t)(nul - data) : size;
    /* Exact-size heap copies so ASan sees any read past the end. */
    char *src = malloc(tlen ? tlen : 1);
    if (src == NULL) {
        return 0;
    }
    memcpy(src, data, tlen);
    const char *ctx = default_ctx;
    size_t ctx_len = sizeof default_ctx - 1;
    char *ctx_copy = NULL;
    if (nul != NULL) {
        ctx_len = size - tlen - 1;
        ctx_copy = malloc(ctx_len ? ctx_len : 1);
        if (ctx_copy == NULL) {
            free(src);
            return 0;
        }
        memcpy(ctx_copy, nul + 1, ctx_len);
        ctx = ctx_copy;
        (void)sp_jinja_json_check(ctx, ctx_len, NULL, 0);
    }
    char err[256];
    sp_jinja_t *t = NULL;
    if (sp_jinja_compile(src, tlen, &t, err, sizeof err) == SP_OK) {
        sp_jinja_opts_t o = sp_jinja_default_opts();
        o.max_steps = 20000;
        o.max_output_bytes = 64 * 1024;
        o.max_memory_bytes = 8u << 20;
        o.max_depth = 200;
        o.now = 1721952000;
        char *out = NULL;
        size_t out_len = 0;
        if (sp_jinja_render_json(t, ctx, ctx_len, &o, &out, &out_len, err, sizeof err) == SP_OK) {
            if (out == NULL || out[out_len] != '\0' || out_len > o.max_output_bytes) {
                abort();
            }
        } else if (out != NULL) {
            abort(); /* failures leave *out NULL */
        }
        sp_free(out);
        sp_jinja_destroy(t);
    } else if (t != NULL) {
        abort();
    }
    free(ctx_copy);
    free(src);
    return 0;
}
