/*
 * dialect.c - what the output dialects (dialect.h) share: which dialect a
 * path belongs to (for the error shape), ids, stream framing, and the
 * translation record and text-parts helper of the request translators.
 *
 * Threads: the path table is filled while the routes are registered (one
 * thread, before the loops start) and only read after; the rest is any
 * thread (an atomic id counter). Memory: static tables; writes only into
 * the caller's buffers.
 */
#include <stdarg.h>
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

/* ------------------------------------------------------------ translation */

int
sp_dialect_fail(sp_dialect_tx_t *tx, int status, const char *param, const char *fmt, ...)
{
    tx->status = status;
    tx->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tx->msg, sizeof tx->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int
sp_dialect_nomem(sp_dialect_tx_t *tx)
{
    return sp_dialect_fail(tx, 503, NULL, "out of memory");
}

int
sp_dialect_set(sp_dialect_tx_t *tx, json_t *obj, const char *key, json_t *v)
{
    if (v == NULL || json_object_set_new(obj, key, v) != 0) {
        return sp_dialect_nomem(tx);
    }
    return 0;
}

static bool
listed(const char *const *list, const char *s)
{
    for (size_t i = 0; list != NULL && list[i] != NULL; i++) {
        if (strcmp(list[i], s) == 0) {
            return true;
        }
    }
    return false;
}

/* Append {"type": "text", "text": t} to parts. */
static int
push_text(sp_dialect_tx_t *tx, json_t *parts, const json_t *t)
{
    json_t *p = json_pack("{s:s,s:O}", "type", "text", "text", t);
    return p != NULL && json_array_append_new(parts, p) == 0 ? 0 : sp_dialect_nomem(tx);
}

int
sp_dialect_text_parts(sp_dialect_tx_t *tx, const json_t *c, const char *where,
                      const sp_dialect_parts_t *pt, json_t **out)
{
    *out = json_array();
    if (*out == NULL) {
        return sp_dialect_nomem(tx);
    }
    if (json_is_string(c)) {
        return push_text(tx, *out, c);
    }
    if (!json_is_array(c)) {
        return sp_dialect_fail(tx, 400, pt->param, "%s must be a string or a list of %s", where,
                               pt->noun);
    }
    size_t k;
    const json_t *part;
    json_array_foreach(c, k, part) {
        const char *type = json_is_object(part) ? json_string_value(json_object_get(part, "type")) : NULL;
        const char *key = "text";
        if (type != NULL && listed(pt->media, type)) {
            return sp_dialect_fail(tx, 400, pt->param,
                                   "%s[%zu]: '%s' parts are not supported: no model served here "
                                   "reads %s (send the text as a '%s' part)",
                                   where, k, type, pt->media_kinds, pt->text[0]);
        }
        if (type != NULL && pt->refusal != NULL && strcmp(type, pt->refusal) == 0) {
            key = pt->refusal;
        } else if (type == NULL || !listed(pt->text, type)) {
            return sp_dialect_fail(tx, 400, pt->param,
                                   "%s[%zu]: parts of type '%s' are not supported here (%s)", where,
                                   k, type ? type : "(none)", pt->accepted);
        }
        const json_t *t = json_object_get(part, key);
        if (!json_is_string(t)) {
            return sp_dialect_fail(tx, 400, pt->param, "%s[%zu]: a '%s' part needs a string '%s'",
                                   where, k, type, key);
        }
        if (push_text(tx, *out, t) != 0) {
            return -1;
        }
    }
    return 0;
}
