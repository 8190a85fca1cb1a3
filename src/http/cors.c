/*
 * cors.c - the CORS answer of every request (the contract is in cors.h).
 *
 * The list is the configuration string itself, scanned per request that
 * carries an Origin: a few dozen bytes compared, cheaper than any lookup
 * structure worth building for a handful of origins.
 */
#include "http/cors.h"

#include <string.h>

#include "sampan/log.h"

/* What a browser may send on a cross-origin request: the OpenAI clients'
 * headers and ours. A preflight may ask for more (the OpenAI JavaScript
 * client adds x-stainless-*), see allow_headers. */
#define BASE_ALLOW_HEADERS "authorization, content-type, x-api-key, x-request-id"
/* The longest Access-Control-Request-Headers echoed back. */
#define MAX_REQUEST_HEADERS 320

/* One pass over the list: whether an entry equals origin (origin.ptr NULL:
 * none can) and whether one is "*". */
static void
scan(const char *origins, sp_str_t origin, bool *exact, bool *any)
{
    *exact = *any = false;
    const char *p = origins ? origins : "";
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') {
            p++;
        }
        const char *e = p;
        while (*e && *e != ',') {
            e++;
        }
        const char *t = e;
        while (t > p && (t[-1] == ' ' || t[-1] == '\t')) {
            t--;
        }
        size_t n = (size_t)(t - p);
        if (n == 1 && p[0] == '*') {
            *any = true;
        } else if (origin.ptr && n > 0 && n == origin.len && memcmp(p, origin.ptr, n) == 0) {
            *exact = true;
        }
        p = e;
    }
}

bool
sp_cors_origin_allowed(const char *origins, sp_str_t origin, bool *wildcard)
{
    bool exact, any;
    scan(origins, origin, &exact, &any);
    /* An exact entry wins over "*": the origin is then echoed. */
    *wildcard = !exact && any && origin.ptr != NULL;
    return origin.ptr != NULL && (exact || any);
}

bool
sp_cors_has_wildcard(const char *origins)
{
    sp_str_t none = {NULL, 0};
    bool exact, any;
    scan(origins, none, &exact, &any);
    return any;
}

/* Whether the comma-separated list holds the token t[0..n) (lowercase). */
static bool
list_has(const char *list, const char *t, size_t n)
{
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == ',') {
            p++;
        }
        size_t k = strcspn(p, ",");
        while (k > 0 && p[k - 1] == ' ') {
            k--;
        }
        if (k == n && memcmp(p, t, n) == 0) {
            return true;
        }
        p += strcspn(p, ",");
    }
    return false;
}

/* The header names of a preflight's Access-Control-Request-Headers, when
 * they are plain tokens: the origin is trusted to send any header, and
 * unknown ones are ignored, so echoing them keeps browser clients working
 * without a list to maintain. Anything odd gets the base list only. */
static void
allow_headers(sp_str_t req, char *out, size_t cap)
{
    static const char base[] = BASE_ALLOW_HEADERS;
    memcpy(out, base, sizeof base);
    if (req.ptr == NULL || req.len == 0 || req.len > MAX_REQUEST_HEADERS ||
        sizeof base + 2 * req.len + 2 > cap) {
        return;
    }
    char lower[MAX_REQUEST_HEADERS];
    for (size_t i = 0; i < req.len; i++) {
        char c = req.ptr[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.' || c == ',' || c == ' ';
        if (!ok) {
            return;
        }
        lower[i] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    size_t len = sizeof base - 1;
    size_t i = 0;
    while (i < req.len) {
        while (i < req.len && (lower[i] == ' ' || lower[i] == ',')) {
            i++;
        }
        size_t j = i;
        while (j < req.len && lower[j] != ',' && lower[j] != ' ') {
            j++;
        }
        /* Each name once (out stays NUL-terminated for list_has). */
        if (j > i && !list_has(out, lower + i, j - i)) {
            memcpy(out + len, ", ", 2);
            memcpy(out + len + 2, lower + i, j - i);
            len += 2 + (j - i);
            out[len] = '\0';
        }
        i = j;
    }
}

sp_cors_decision_t
sp_cors_handle(sp_http_req_t *r, const char *origins)
{
    if (origins == NULL || origins[0] == '\0') {
        return SP_CORS_CONTINUE; /* CORS off: not a single header */
    }
    /* The answer depends on Origin whether or not this request has one. */
    sp_http_add_header(r, "Vary", "Origin");
    sp_str_t origin = sp_http_req_header(r, "origin");
    if (origin.ptr == NULL) {
        return SP_CORS_CONTINUE;
    }
    bool preflight = sp_http_req_method(r) == SP_HTTP_OPTIONS &&
                     sp_http_req_header(r, "access-control-request-method").ptr != NULL;
    bool wildcard = false;
    if (!sp_cors_origin_allowed(origins, origin, &wildcard)) {
        if (preflight) {
            /* A 405 from the router would say the same to the browser; a
             * 403 naming the reason is clearer in its developer tools. */
            sp_http_req_annotate(r, "cors=denied origin=%s",
                                 sp_log_str_n(origin.ptr, origin.len > 128 ? 128 : origin.len));
            return SP_CORS_REFUSED;
        }
        return SP_CORS_CONTINUE;
    }
    char value[1024];
    if (wildcard) {
        memcpy(value, "*", 2);
    } else {
        /* Equal to a configured entry, so at most as long as the list. */
        size_t n = origin.len < sizeof value ? origin.len : sizeof value - 1;
        memcpy(value, origin.ptr, n);
        value[n] = '\0';
    }
    sp_http_add_header(r, "Access-Control-Allow-Origin", value);
    if (!preflight) {
        sp_http_add_header(r, "Access-Control-Expose-Headers", "x-request-id, retry-after");
        return SP_CORS_CONTINUE;
    }
    char hdrs[sizeof BASE_ALLOW_HEADERS + 2 * MAX_REQUEST_HEADERS + 2];
    allow_headers(sp_http_req_header(r, "access-control-request-headers"), hdrs, sizeof hdrs);
    sp_http_add_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    sp_http_add_header(r, "Access-Control-Allow-Headers", hdrs);
    sp_http_add_header(r, "Access-Control-Max-Age", "600");
    sp_http_req_annotate(r, "cors=preflight");
    sp_http_respond(r, 204, NULL, "", 0);
    return SP_CORS_ANSWERED;
}
