/*
 * sse.c - server-sent events: splitting a body into events, and scanning an
 * OpenAI streaming chunk for text, errors and usage (see sse.h).
 */
#include <string.h>

#include "tools/sse.h"
#include "core/alloc.h"

/* ------------------------------------------------------------ scanning */

static bool
is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t
skip_ws(const char *d, size_t len, size_t i)
{
    while (i < len && is_ws(d[i])) {
        i++;
    }
    return i;
}

/* Position just after `"name"` ws `:` ws, searching from `from`; len when absent. */
static size_t
find_key(const char *d, size_t len, size_t from, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = from; i + n + 2 < len; i++) {
        if (d[i] != '"' || memcmp(d + i + 1, name, n) != 0 || d[i + 1 + n] != '"') {
            continue;
        }
        size_t j = skip_ws(d, len, i + n + 2);
        if (j < len && d[j] == ':') {
            return skip_ws(d, len, j + 1);
        }
    }
    return len;
}

/* Does some `"name": "x..."` (a non-empty string value) occur? */
static bool
has_nonempty_string(const char *d, size_t len, const char *name)
{
    size_t i = 0;
    while ((i = find_key(d, len, i, name)) < len) {
        if (d[i] == '"' && i + 1 < len && d[i + 1] != '"') {
            return true;
        }
    }
    return false;
}

/* A non-negative integer value at d[i..); -1 when it is not one. */
static int64_t
int_at(const char *d, size_t len, size_t i)
{
    int64_t v = 0;
    size_t start = i;
    while (i < len && d[i] >= '0' && d[i] <= '9' && i - start < 18) {
        v = v * 10 + (d[i] - '0');
        i++;
    }
    return i > start ? v : -1;
}

void
sp_sse_scan(const char *d, size_t len, sp_sse_event_t *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->prompt_tokens = ev->completion_tokens = -1;
    size_t i = skip_ws(d, len, 0);
    size_t end = len;
    while (end > i && is_ws(d[end - 1])) {
        end--;
    }
    if (end - i == 6 && memcmp(d + i, "[DONE]", 6) == 0) {
        ev->done = true;
        return;
    }
    if (i < len && d[i] == '{') {
        /* An error object is the first key of the chunk in the servers we talk to
         * (OpenAI, vLLM, llama.cpp, Sampan): {"error": {...}}. */
        size_t j = skip_ws(d, len, i + 1);
        if (j < len && find_key(d, len, j, "error") < len && j + 7 <= len &&
            memcmp(d + j, "\"error\"", 7) == 0) {
            ev->error = true;
            return;
        }
    }
    ev->has_text = has_nonempty_string(d, len, "text") || has_nonempty_string(d, len, "content");
    size_t u = find_key(d, len, 0, "usage");
    if (u < len && d[u] == '{') {
        size_t p = find_key(d, len, u, "prompt_tokens");
        if (p < len) {
            ev->prompt_tokens = int_at(d, len, p);
        }
        size_t c = find_key(d, len, u, "completion_tokens");
        if (c < len) {
            ev->completion_tokens = int_at(d, len, c);
        }
    }
}

/* ------------------------------------------------------------ event splitting */

#define SSE_START_CAP 4096

sp_status_t
sp_sse_reader_init(sp_sse_reader_t *r, size_t max_bytes)
{
    memset(r, 0, sizeof *r);
    r->max = max_bytes < SSE_START_CAP ? SSE_START_CAP : max_bytes;
    r->line = sp_malloc(SSE_START_CAP);
    r->data = sp_malloc(SSE_START_CAP);
    if (r->line == NULL || r->data == NULL) {
        sp_sse_reader_free(r);
        return SP_ERR_NOMEM;
    }
    r->line_cap = r->data_cap = SSE_START_CAP;
    return SP_OK;
}

void
sp_sse_reader_free(sp_sse_reader_t *r)
{
    sp_free(r->line);
    sp_free(r->data);
    memset(r, 0, sizeof *r);
}

void
sp_sse_reader_reset(sp_sse_reader_t *r)
{
    r->line_len = r->data_len = 0;
    r->has_data = false;
}

/* Room for `more` bytes in *buf (doubling, at most max); -1 when over max. */
static int
reserve(char **buf, size_t *cap, size_t used, size_t more, size_t max)
{
    if (more > max || used > max - more) {
        return -1;
    }
    if (used + more <= *cap) {
        return 0;
    }
    size_t c = *cap;
    while (c < used + more) {
        c = c > max / 2 ? max : c * 2;
    }
    char *b = sp_realloc(*buf, c);
    if (b == NULL) {
        return -1;
    }
    *buf = b;
    *cap = c;
    return 0;
}

static int
dispatch(sp_sse_reader_t *r, sp_sse_event_fn fn, void *ud)
{
    if (!r->has_data) {
        return 0;
    }
    r->has_data = false;
    size_t n = r->data_len;
    r->data_len = 0;
    return fn(r->data, n, ud) != 0 ? 1 : 0;
}

/* One complete line without its LF. */
static int
line(sp_sse_reader_t *r, const char *p, size_t n, sp_sse_event_fn fn, void *ud)
{
    if (n > 0 && p[n - 1] == '\r') {
        n--;
    }
    if (n == 0) {
        return dispatch(r, fn, ud);
    }
    if (p[0] == ':') {
        return 0; /* a comment (keep-alive pings) */
    }
    const char *colon = memchr(p, ':', n);
    size_t name_len = colon ? (size_t)(colon - p) : n;
    if (name_len != 4 || memcmp(p, "data", 4) != 0) {
        return 0; /* event:, id:, retry: and unknown fields do not matter here */
    }
    const char *v = colon ? colon + 1 : p + n;
    size_t vn = (size_t)(p + n - v);
    if (vn > 0 && v[0] == ' ') {
        v++;
        vn--;
    }
    size_t sep = r->has_data ? 1 : 0;
    if (reserve(&r->data, &r->data_cap, r->data_len, vn + sep, r->max) != 0) {
        return -1;
    }
    if (sep) {
        r->data[r->data_len++] = '\n';
    }
    memcpy(r->data + r->data_len, v, vn);
    r->data_len += vn;
    r->has_data = true;
    return 0;
}

int
sp_sse_feed(sp_sse_reader_t *r, const char *buf, size_t len, sp_sse_event_fn fn, void *ud)
{
    while (len > 0) {
        const char *nl = memchr(buf, '\n', len);
        if (nl == NULL) {
            if (reserve(&r->line, &r->line_cap, r->line_len, len, r->max) != 0) {
                return -1;
            }
            memcpy(r->line + r->line_len, buf, len);
            r->line_len += len;
            return 0;
        }
        size_t n = (size_t)(nl - buf);
        int rc;
        if (r->line_len == 0) {
            rc = line(r, buf, n, fn, ud); /* the usual case: no copy */
        } else {
            if (reserve(&r->line, &r->line_cap, r->line_len, n, r->max) != 0) {
                return -1;
            }
            memcpy(r->line + r->line_len, buf, n);
            size_t total = r->line_len + n;
            r->line_len = 0;
            rc = line(r, r->line, total, fn, ud);
        }
        if (rc != 0) {
            return rc;
        }
        buf += n + 1;
        len -= n + 1;
    }
    return 0;
}

int
sp_sse_finish(sp_sse_reader_t *r, sp_sse_event_fn fn, void *ud)
{
    if (r->line_len > 0) {
        size_t n = r->line_len;
        r->line_len = 0;
        int rc = line(r, r->line, n, fn, ud);
        if (rc != 0) {
            return rc;
        }
    }
    return dispatch(r, fn, ud);
}
