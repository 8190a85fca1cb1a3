/*
 * dialect.c - what the output dialects (dialect.h) share: which dialect a
 * path belongs to (for the error shape), ids, and stream framing.
 *
 * Threads: any; no state but an id counter (atomic). Memory: writes only
 * into the caller's buffers.
 */
#include <stdio.h>
#include <string.h>

#include "core/timer.h"
#include "api/dialect.h"

/* The path prefixes of the dialects' routes: the prefix itself or anything
 * under it ("/v1/messages", "/v1/messages/count_tokens"). */
static const struct {
    const char *prefix;
    const sp_api_dialect_t *d;
} owners[] = {
    {"/v1/messages", &sp_anthropic_dialect},
};

const sp_api_dialect_t *
sp_api_dialect_for_path(sp_str_t path)
{
    for (size_t i = 0; i < sizeof owners / sizeof owners[0]; i++) {
        size_t n = strlen(owners[i].prefix);
        if (path.len >= n && memcmp(path.ptr, owners[i].prefix, n) == 0 &&
            (path.len == n || path.ptr[n] == '/' || path.ptr[n] == '?')) {
            return owners[i].d;
        }
    }
    return NULL;
}

void
sp_dialect_id(char *buf, size_t cap, const char *prefix, char sep, uint64_t seed)
{
    static _Atomic uint64_t ctr;
    uint64_t x = (uint64_t)sp_time_ns() ^ (seed * 0x9E3779B97F4A7C15ull) ^ (ctr++ << 40);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    snprintf(buf, cap, "%s%c%016llx", prefix, sep, (unsigned long long)x);
}

void
sp_dialect_sse_begin(sp_jbuf_t *out, const char *event)
{
    if (event != NULL) {
        sp_jbuf_lit(out, "event: ");
        sp_jbuf_lit(out, event);
        sp_jbuf_lit(out, "\n");
    }
    sp_jbuf_lit(out, "data: ");
}

void
sp_dialect_sse_end(sp_jbuf_t *out)
{
    sp_jbuf_lit(out, "\n\n");
}

void
sp_dialect_ndjson_end(sp_jbuf_t *out)
{
    sp_jbuf_lit(out, "\n");
}
