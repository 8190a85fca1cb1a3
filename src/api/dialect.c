/*
 * dialect.c - what the output dialects (dialect.h) share: which dialect a
 * path belongs to (for the error shape), ids, and stream framing.
 *
 * Threads: the path table is filled while the routes are registered (one
 * thread, before the loops start) and only read after; the rest is any
 * thread (an atomic id counter). Memory: static tables; writes only into
 * the caller's buffers.
 */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "core/timer.h"
#include "api/dialect.h"

/* The path prefixes the dialects claimed: the prefix itself or anything
 * under it ("/v1/messages", "/v1/messages/count_tokens"). */
#define MAX_OWNERS 8

static struct {
    const char *prefix;
    const sp_api_dialect_t *d;
} owners[MAX_OWNERS];
static int n_owners;

void
sp_api_dialect_claim(const char *prefix, const sp_api_dialect_t *d)
{
    for (int i = 0; i < n_owners; i++) {
        if (strcmp(owners[i].prefix, prefix) == 0) {
            owners[i].d = d; /* a server made again in the same process (tests) */
            return;
        }
    }
    SP_ASSERT(n_owners < MAX_OWNERS);
    owners[n_owners].prefix = prefix;
    owners[n_owners++].d = d;
}

const sp_api_dialect_t *
sp_api_dialect_for_path(sp_str_t path)
{
    for (int i = 0; i < n_owners; i++) {
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
