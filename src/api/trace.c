/*
 * trace.c - W3C Trace Context, span records and the OTLP/HTTP JSON exporter
 * (trace.h; the design and its reasons are in docs/tracing.md).
 *
 * The exporter is process-wide state (like the log sink, and for the same
 * reason): the hooks are called from metrics.c, the front ends and the HTTP
 * server's access-log hook, none of which should carry a tracer pointer
 * through every call for a feature that is usually off. It is configured
 * once before the loops start and read-only afterwards except for its
 * queue, which a mutex guards, and its counters, which are atomics.
 *
 * The POST is libcurl's (an easy handle owned by the exporter's own
 * thread, blocking there with one deadline per try): HTTP and HTTPS, the
 * proxy variables, keep-alive and its threaded resolver come with it, and
 * nothing on a loop thread ever waits for it (a loop only appends a finished
 * record to the queue under the mutex).
 */
#include "api/trace.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "sampan/version.h"
#include "core/json.h"
#include "http/router.h"

bool sp__trace_on;

/* ------------------------------------------------------------- records */

#define SPAN_MAX 8      /* server + queue, prefill, decode, response (+ spare) */
#define ATTR_MAX 48
#define STR_CAP 2048    /* attribute string bytes per record */
#define ATTR_STR_MAX 256
#define NAME_MAX_ 127

enum { KIND_INTERNAL = 1, KIND_SERVER = 2 };
enum { A_STR, A_INT };

typedef struct attr {
    const char *key; /* a literal */
    uint8_t span;    /* index of its span in the record */
    uint8_t type;
    uint16_t off, len; /* A_STR: in the record's str */
    int64_t i;         /* A_INT */
} attr_t;

typedef struct span {
    uint8_t id[8];
    int8_t parent;    /* index of the parent in the record; -1: the remote parent or none */
    uint8_t kind;
    bool error;
    const char *name; /* children: a literal; the server span: the record's name */
    int64_t start_ns, end_ns; /* sp_time_ns() clock */
} span_t;

struct sp_trace {
    sp_trace_t *next;  /* the export queue */
    uint8_t trace_id[16];
    uint8_t parent_id[8];
    bool has_parent;   /* the incoming traceparent named a span */
    uint8_t flags;     /* W3C trace flags (sampled = 1) */
    bool model_done;
    bool named;        /* sp_trace_set_name was called: the HTTP end keeps the name */
    int n_spans, n_attrs;
    int64_t submit_ns;    /* sp_trace_mark_submit; 0 = none */
    int64_t model_end_ns; /* the end of the model's work; 0 = none */
    span_t spans[SPAN_MAX];
    attr_t attrs[ATTR_MAX];
    char name[NAME_MAX_ + 1];
    char state[SP_TRACE_STATE_MAX + 1];
    size_t str_len;
    char str[STR_CAP];
};

/* ------------------------------------------------------------ exporter state */

static struct {
    sp_trace_params_t p;
    char url[2048];          /* the traces URL, credentials included */
    char url_log[2048];      /* the same without credentials */
    char ca_file[1024], client_cert[1024], client_key[1024]; /* from OTEL_EXPORTER_OTLP_* */
    char header_names[512];  /* of OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, for the start-up line */
    int n_user_headers;
    struct curl_slist *headers;
    CURL *curl;              /* the exporter thread's, between init and shutdown */
    bool curl_ready;         /* curl_global_init done (once per process) */
    char curl_err[CURL_ERROR_SIZE];
    char service[128], hostname[256];
    int64_t unix_offset_ns;  /* CLOCK_REALTIME - CLOCK_MONOTONIC at init */
    uint64_t threshold;      /* a new trace is sampled when its low 56 bits are below */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sp_trace_t *head, *tail; /* finished records waiting for export */
    int64_t queued_spans;
    bool stopping;
    int64_t stop_deadline_ns;
    _Atomic uint64_t exported, dropped_queue, dropped_export, exports_failed, retries;
} E = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ------------------------------------------------------------------- ids */

/* splitmix64 per thread, seeded from the kernel: trace and span ids must be
 * unpredictable enough not to collide across processes (W3C asks for
 * randomness), and a syscall per id would be wasted on every request. */
static _Thread_local uint64_t rng_state;
static _Thread_local bool rng_seeded;

static uint64_t
rng_next(void)
{
    if (!rng_seeded) {
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
            seed = (uint64_t)sp_time_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&seed;
        }
        rng_state = seed;
        rng_seeded = true;
    }
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void
rand_bytes(uint8_t *out, size_t n)
{
    do {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = rng_next();
            for (size_t k = 0; k < 8 && i + k < n; k++) {
                out[i + k] = (uint8_t)(v >> (8 * k));
            }
        }
        bool zero = true;
        for (size_t i = 0; i < n; i++) {
            zero = zero && out[i] == 0;
        }
        if (!zero) {
            return; /* all-zero ids are invalid (W3C) */
        }
    } while (1);
}

static const char hexd[] = "0123456789abcdef";

static void
to_hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hexd[b[i] >> 4];
        out[2 * i + 1] = hexd[b[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Lowercase hex only (W3C: uppercase is invalid). -1 for anything else. */
static int
hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static bool
from_hex(const char *s, size_t n_bytes, uint8_t *out)
{
    bool zero = true;
    for (size_t i = 0; i < n_bytes; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return false;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
        zero = zero && out[i] == 0;
    }
    return !zero;
}

/* W3C Trace Context, traceparent: version "-" trace-id "-" parent-id "-"
 * flags. Version ff is invalid; version 00 is exactly 55 characters; a later
 * version may append "-..." fields, which we ignore (the spec's forward
 * compatibility rule). */
static bool
parse_traceparent(sp_str_t v, uint8_t tid[16], uint8_t pid[8], uint8_t *flags)
{
    const char *s = v.ptr;
    if (s == NULL || v.len < SP_TRACE_TP_LEN) {
        return false;
    }
    int v1 = hexval(s[0]), v2 = hexval(s[1]);
    if (v1 < 0 || v2 < 0 || (v1 == 15 && v2 == 15)) {
        return false;
    }
    if (v1 == 0 && v2 == 0 && v.len != SP_TRACE_TP_LEN) {
        return false;
    }
    if (v.len > SP_TRACE_TP_LEN && s[SP_TRACE_TP_LEN] != '-') {
        return false;
    }
    if (s[2] != '-' || s[35] != '-' || s[52] != '-') {
        return false;
    }
    int f1 = hexval(s[53]), f2 = hexval(s[54]);
    if (!from_hex(s + 3, 16, tid) || !from_hex(s + 36, 8, pid) || f1 < 0 || f2 < 0) {
        return false;
    }
    *flags = (uint8_t)(f1 << 4 | f2);
    return true;
}

/* tracestate is passed on untouched when it is printable ASCII and not too
 * long; its list syntax is the vendors' business, not ours. */
static bool
tracestate_ok(sp_str_t v)
{
    if (v.ptr == NULL || v.len == 0 || v.len > SP_TRACE_STATE_MAX) {
        return false;
    }
    for (size_t i = 0; i < v.len; i++) {
        if ((unsigned char)v.ptr[i] < 0x20 || (unsigned char)v.ptr[i] > 0x7e) {
            return false;
        }
    }
    return true;
}

static void
format_tp(const uint8_t tid[16], const uint8_t sid[8], uint8_t flags, char out[SP_TRACE_TP_BUF])
{
    memcpy(out, "00-", 3);
    to_hex(tid, 16, out + 3);
    out[35] = '-';
    to_hex(sid, 8, out + 36);
    out[52] = '-';
    out[53] = hexd[flags >> 4];
    out[54] = hexd[flags & 15];
    out[55] = '\0';
}

/* ------------------------------------------------------------ record API */

sp_trace_t *
sp_trace_start(sp_str_t traceparent, sp_str_t tracestate, int64_t start_ns,
               char tp_out[SP_TRACE_TP_BUF])
{
    uint8_t tid[16], pid[8], flags = 0, sid[8];
    bool parent = parse_traceparent(traceparent, tid, pid, &flags);
    bool sampled;
    if (parent) {
        sampled = flags & 1; /* parent-based: the caller decided */
    } else {
        rand_bytes(tid, 16);
        uint64_t low = 0;
        for (int i = 9; i < 16; i++) {
            low = low << 8 | tid[i];
        }
        sampled = low < E.threshold;
    }
    rand_bytes(sid, 8);
    format_tp(tid, sid, sampled ? 1 : 0, tp_out);
    if (!sampled) {
        return NULL;
    }
    sp_trace_t *t = sp_malloc(sizeof *t);
    if (t == NULL) {
        atomic_fetch_add_explicit(&E.dropped_queue, 1, memory_order_relaxed);
        return NULL;
    }
    t->next = NULL;
    memcpy(t->trace_id, tid, 16);
    memcpy(t->parent_id, pid, 8);
    t->has_parent = parent;
    t->flags = 1;
    t->model_done = false;
    t->named = false;
    t->n_spans = 1;
    t->n_attrs = 0;
    t->submit_ns = t->model_end_ns = 0;
    t->str_len = 0;
    snprintf(t->name, sizeof t->name, "request");
    t->state[0] = '\0';
    if (parent && tracestate_ok(tracestate)) {
        memcpy(t->state, tracestate.ptr, tracestate.len);
        t->state[tracestate.len] = '\0';
    }
    span_t *s = &t->spans[0];
    memcpy(s->id, sid, 8);
    s->parent = -1;
    s->kind = KIND_SERVER;
    s->error = false;
    s->name = t->name;
    s->start_ns = start_ns ? start_ns : sp_time_ns();
    s->end_ns = 0;
    return t;
}

void
sp_trace_set_name(sp_trace_t *t, const char *name)
{
    if (t) {
        snprintf(t->name, sizeof t->name, "%s", name);
        t->named = true;
    }
}

static void
attr_str_at(sp_trace_t *t, int span, const char *key, const char *v, size_t n)
{
    if (t == NULL || v == NULL || t->n_attrs >= ATTR_MAX) {
        return;
    }
    if (n > ATTR_STR_MAX) {
        n = ATTR_STR_MAX;
    }
    if (n > STR_CAP - t->str_len) {
        return;
    }
    attr_t *a = &t->attrs[t->n_attrs++];
    a->key = key;
    a->span = (uint8_t)span;
    a->type = A_STR;
    a->off = (uint16_t)t->str_len;
    a->len = (uint16_t)n;
    memcpy(t->str + t->str_len, v, n);
    t->str_len += n;
}

static void
attr_int_at(sp_trace_t *t, int span, const char *key, int64_t v)
{
    if (t == NULL || t->n_attrs >= ATTR_MAX) {
        return;
    }
    attr_t *a = &t->attrs[t->n_attrs++];
    a->key = key;
    a->span = (uint8_t)span;
    a->type = A_INT;
    a->i = v;
}

void
sp_trace_attr_str(sp_trace_t *t, const char *key, const char *v, size_t n)
{
    attr_str_at(t, 0, key, v, n);
}

void
sp_trace_attr_int(sp_trace_t *t, const char *key, int64_t v)
{
    attr_int_at(t, 0, key, v);
}

const char *
sp_trace_state(const sp_trace_t *t)
{
    return t ? t->state : "";
}

void
sp_trace_ids(const sp_trace_t *t, char trace_id[33], char span_id[17])
{
    to_hex(t->trace_id, 16, trace_id);
    to_hex(t->spans[0].id, 8, span_id);
}

void
sp__trace_mark_submit(sp_trace_t *t)
{
    t->submit_ns = sp_time_ns();
}

/* A child of the server span; its index, or -1 when the record is full. */
static int
child(sp_trace_t *t, const char *name, int64_t start_ns, int64_t end_ns)
{
    if (t->n_spans >= SPAN_MAX) {
        return -1;
    }
    int i = t->n_spans++;
    span_t *s = &t->spans[i];
    rand_bytes(s->id, 8);
    s->parent = 0;
    s->kind = KIND_INTERNAL;
    s->error = false;
    s->name = name;
    s->start_ns = start_ns;
    s->end_ns = end_ns < start_ns ? start_ns : end_ns;
    return i;
}

static int64_t
clamp64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

void
sp_trace_model(sp_trace_t *t, const char *model, const char *version, const sp_req_clock_t *c,
               const char *outcome)
{
    if (t == NULL || t->model_done) {
        return;
    }
    t->model_done = true;
    int64_t now = sp_time_ns();
    sp_trace_attr_str(t, "sampan.model", model, strlen(model));
    sp_trace_attr_str(t, "sampan.model.version", version, strlen(version));
    sp_trace_attr_str(t, "gen_ai.request.model", model, strlen(model));
    if (outcome) {
        sp_trace_attr_str(t, "sampan.outcome", outcome, strlen(outcome));
    }
    if (c->prompt_tokens > 0 || c->completion_tokens > 0) {
        sp_trace_attr_int(t, "gen_ai.usage.input_tokens", c->prompt_tokens);
        sp_trace_attr_int(t, "gen_ai.usage.output_tokens", c->completion_tokens);
    }
    if (c->queue_ns < 0) {
        t->model_end_ns = now; /* answered before any queue (validation, cache) */
        return;
    }
    /* The engine's times count from the submit call: place them from there
     * when it was marked, else back from now (the DONE's delivery). */
    int64_t q = c->queue_ns, e = c->compute_ns > 0 ? c->compute_ns : 0;
    int64_t start = t->submit_ns ? t->submit_ns : now - q - e;
    int64_t admit = start + q, end = admit + e;
    if (end > now) { /* clock skew between the engine's and our readings */
        end = now;
        admit = clamp64(admit, start, end);
    }
    t->model_end_ns = end;
    child(t, "queue", start, admit);
    if (e == 0) {
        return; /* never admitted (a timeout or a cancel in the queue) */
    }
    if (c->first_ns > 0) {
        int64_t first = clamp64(c->first_ns, admit, end);
        int i = child(t, "prefill", admit, first);
        attr_int_at(t, i, "gen_ai.usage.input_tokens", c->prompt_tokens);
        i = child(t, "decode", first, end);
        attr_int_at(t, i, "gen_ai.usage.output_tokens", c->completion_tokens);
    } else if (c->prompt_tokens > 0) {
        int i = child(t, "prefill", admit, end); /* embeddings: the prompt only */
        attr_int_at(t, i, "gen_ai.usage.input_tokens", c->prompt_tokens);
    } else {
        child(t, "compute", admit, end); /* a tensor model's batch */
    }
}

static void enqueue(sp_trace_t *t);

void
sp_trace_finish(sp_trace_t *t, bool error, const char *error_type)
{
    if (t == NULL) {
        return;
    }
    int64_t now = sp_time_ns();
    if (t->model_end_ns > 0) {
        child(t, "response", t->model_end_ns, now);
    }
    t->spans[0].end_ns = now;
    t->spans[0].error = error;
    if (error_type) {
        sp_trace_attr_str(t, "error.type", error_type, strlen(error_type));
    }
    enqueue(t);
}

/* ------------------------------------------------------------------ HTTP */

/* http.route needs the matched pattern; the router does not expose it, so
 * the routes of the public API are listed here (docs/api.md). A path that
 * matches none gets no http.route and a span named after its method only,
 * as the semantic conventions ask. */
static const char *const routes[] = {
    "/v1/models", "/v1/models/{model}", "/v1/completions", "/v1/chat/completions", "/infill",
    "/v1/embeddings", "/v1/rerank", "/v1/reranking", "/rerank", "/v2", "/v2/models/{model}", "/v2/models/{model}/ready",
    "/v2/models/{model}/infer", "/v2/models/{model}/generate",
    "/v2/models/{model}/generate_stream", "/v2/models/{model}/versions/{version}",
    "/v2/models/{model}/versions/{version}/ready", "/v2/models/{model}/versions/{version}/infer",
    "/v2/models/{model}/versions/{version}/generate",
    "/v2/models/{model}/versions/{version}/generate_stream", "/v2/repository/index",
    "/v2/repository/models/{model}/load", "/v2/repository/models/{model}/unload", "/metrics",
    "/stats", "/live", "/health", "/v2/health/live", "/v2/health/ready", "/",
    "/v2/models/{model}/config", "/v2/models/{model}/versions/{version}/config",
};

static const char *
route_of(sp_str_t path)
{
    sp_route_params_t p;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (sp_router_match(routes[i], path, &p)) {
            return routes[i];
        }
    }
    return NULL;
}

/* "ip:port" or "[ip6]:port" into the client.* attributes. */
static void
peer_attrs(sp_trace_t *t, const char *peer)
{
    const char *colon = strrchr(peer, ':');
    if (colon == NULL || colon == peer) {
        return;
    }
    const char *a = peer;
    size_t n = (size_t)(colon - peer);
    if (a[0] == '[' && n >= 2 && a[n - 1] == ']') {
        a++;
        n -= 2;
    }
    sp_trace_attr_str(t, "client.address", a, n);
    sp_trace_attr_int(t, "client.port", atoi(colon + 1));
}

/* The Host header into server.address and server.port. */
static void
host_attrs(sp_trace_t *t, sp_str_t h, bool tls)
{
    if (h.ptr == NULL || h.len == 0) {
        return;
    }
    size_t n = h.len, host_end = h.len;
    const char *port = NULL;
    if (h.ptr[0] == '[') {
        const char *rb = memchr(h.ptr, ']', n);
        if (rb == NULL) {
            return;
        }
        host_end = (size_t)(rb - h.ptr) + 1;
        port = host_end < n && h.ptr[host_end] == ':' ? h.ptr + host_end + 1 : NULL;
    } else {
        const char *c = memchr(h.ptr, ':', n);
        if (c) {
            host_end = (size_t)(c - h.ptr);
            port = c + 1;
        }
    }
    sp_trace_attr_str(t, "server.address", h.ptr, host_end);
    int64_t pn = 0;
    if (port) {
        for (const char *p = port; p < h.ptr + n && *p >= '0' && *p <= '9' && pn < 65536; p++) {
            pn = pn * 10 + (*p - '0');
        }
    }
    sp_trace_attr_int(t, "server.port", pn > 0 && pn < 65536 ? pn : tls ? 443 : 80);
}

void
sp_trace_http_begin(sp_http_req_t *r)
{
    if (sp_http_req_trace(r)) {
        return; /* begun by its protocol already (a gRPC call, before it ran) */
    }
    char tp[SP_TRACE_TP_BUF];
    sp_str_t state = sp_http_req_header(r, "tracestate");
    sp_trace_t *t = sp_trace_start(sp_http_req_header(r, "traceparent"), state,
                                   sp_http_req_start_ns(r), tp);
    sp_http_add_header(r, "traceparent", tp);
    if (t == NULL) {
        return;
    }
    /* The tracestate goes back with the traceparent when it is short: the
     * response's extra headers share one bounded buffer with the others. */
    if (t->state[0] && strlen(t->state) <= 256) {
        sp_http_add_header(r, "tracestate", t->state);
    }
    const char *m = sp_http_req_method_str(r);
    sp_http_method_t mk = sp_http_req_method(r);
    bool known = mk != SP_HTTP_OTHER;
    sp_trace_attr_str(t, "http.request.method", known ? m : "_OTHER", strlen(known ? m : "_OTHER"));
    if (!known) {
        sp_trace_attr_str(t, "http.request.method_original", m, strlen(m));
    }
    sp_str_t path = sp_http_req_path(r);
    sp_trace_attr_str(t, "url.path", path.ptr, path.len);
    bool tls = sp_http_req_tls(r);
    sp_trace_attr_str(t, "url.scheme", tls ? "https" : "http", tls ? 5 : 4);
    host_attrs(t, sp_http_req_header(r, "host"), tls);
    peer_attrs(t, sp_http_req_peer(r));
    sp_str_t ua = sp_http_req_header(r, "user-agent");
    if (ua.ptr) {
        sp_trace_attr_str(t, "user_agent.original", ua.ptr, ua.len);
    }
    sp_http_req_set_trace(r, t);
}

void
sp_trace_http_end(sp_http_req_t *r, bool aborted, const char *tenant, char *log_out,
                  size_t log_cap)
{
    sp_trace_t *t = sp_http_req_trace(r);
    if (log_out && log_cap) {
        log_out[0] = '\0';
    }
    if (t == NULL) {
        return;
    }
    sp_http_req_set_trace(r, NULL);
    const char *rid = sp_http_req_rid(r);
    sp_trace_attr_str(t, "sampan.request_id", rid, strlen(rid));
    const char *route = route_of(sp_http_req_path(r));
    sp_http_method_t mk = sp_http_req_method(r);
    const char *m = mk == SP_HTTP_OTHER ? "HTTP" : sp_http_req_method_str(r);
    if (route) {
        sp_trace_attr_str(t, "http.route", route, strlen(route));
    }
    if (!t->named) { /* "{method} {route}", or the method alone (semantic conventions) */
        if (route) {
            snprintf(t->name, sizeof t->name, "%s %s", m, route);
        } else {
            snprintf(t->name, sizeof t->name, "%s", m);
        }
    }
    int status = sp_http_req_status(r);
    if (status > 0) {
        sp_trace_attr_int(t, "http.response.status_code", status);
    }
    if (tenant) {
        sp_trace_attr_str(t, "sampan.tenant", tenant, strlen(tenant));
    }
    if (log_out && log_cap) {
        char tid[33], sid[17];
        sp_trace_ids(t, tid, sid);
        snprintf(log_out, log_cap, " trace_id=%s span_id=%s", tid, sid);
    }
    /* Server spans: 5xx is an error, 4xx is the client's (semantic
     * conventions); a connection that died before its answer is one too. */
    char code[16];
    const char *etype = NULL;
    if (aborted && status == 0) {
        etype = "aborted";
    } else if (status >= 500) {
        snprintf(code, sizeof code, "%d", status);
        etype = code;
    }
    sp_trace_finish(t, etype != NULL, etype);
}

/* ------------------------------------------------------------- the queue */

static void
enqueue(sp_trace_t *t)
{
    if (!sp__trace_on) { /* a record begun before a shutdown that already ran */
        sp_free(t);
        return;
    }
    pthread_mutex_lock(&E.mu);
    if (E.queued_spans + t->n_spans > E.p.max_queue_spans) {
        pthread_mutex_unlock(&E.mu);
        atomic_fetch_add_explicit(&E.dropped_queue, (uint64_t)t->n_spans, memory_order_relaxed);
        sp_free(t);
        return;
    }
    t->next = NULL;
    if (E.tail) {
        E.tail->next = t;
    } else {
        E.head = t;
    }
    E.tail = t;
    E.queued_spans += t->n_spans;
    bool wake = E.queued_spans >= E.p.max_batch_spans;
    pthread_mutex_unlock(&E.mu);
    if (wake) {
        pthread_cond_signal(&E.cv);
    }
}

void
sp_trace_get_stats(sp_trace_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->spans_exported = atomic_load(&E.exported);
    out->spans_dropped_queue = atomic_load(&E.dropped_queue);
    out->spans_dropped_export = atomic_load(&E.dropped_export);
    out->exports_failed = atomic_load(&E.exports_failed);
    pthread_mutex_lock(&E.mu);
    out->queued = (uint64_t)E.queued_spans;
    pthread_mutex_unlock(&E.mu);
}

/* --------------------------------------------------------- serialisation */

/* One OTLP AnyValue attribute: {"key":K,"value":{"stringValue":V}} or
 * {"intValue":"N"} (64-bit integers are strings in proto3's JSON). */
static void
put_attr_str(sp_jbuf_t *b, bool *first, const char *key, const char *v, size_t n)
{
    sp_jbuf_lit(b, *first ? "{\"key\":" : ",{\"key\":");
    *first = false;
    sp_jbuf_cstr(b, key);
    sp_jbuf_lit(b, ",\"value\":{\"stringValue\":");
    sp_jbuf_str(b, v, n);
    sp_jbuf_lit(b, "}}");
}

static void
put_attr_int(sp_jbuf_t *b, bool *first, const char *key, int64_t v)
{
    sp_jbuf_lit(b, *first ? "{\"key\":" : ",{\"key\":");
    *first = false;
    sp_jbuf_cstr(b, key);
    sp_jbuf_printf(b, ",\"value\":{\"intValue\":\"%lld\"}}", (long long)v);
}

static void
put_unix_ns(sp_jbuf_t *b, const char *key, int64_t mono_ns)
{
    sp_jbuf_printf(b, ",\"%s\":\"%llu\"", key,
                   (unsigned long long)(mono_ns + E.unix_offset_ns));
}

static void
put_span(sp_jbuf_t *b, const sp_trace_t *t, int i)
{
    const span_t *s = &t->spans[i];
    char hex[33];
    to_hex(t->trace_id, 16, hex);
    sp_jbuf_printf(b, "{\"traceId\":\"%s\"", hex);
    to_hex(s->id, 8, hex);
    sp_jbuf_printf(b, ",\"spanId\":\"%s\"", hex);
    bool remote = s->parent < 0;
    if (!remote || t->has_parent) {
        to_hex(remote ? t->parent_id : t->spans[s->parent].id, 8, hex);
        sp_jbuf_printf(b, ",\"parentSpanId\":\"%s\"", hex);
    }
    if (t->state[0]) {
        sp_jbuf_lit(b, ",\"traceState\":");
        sp_jbuf_cstr(b, t->state);
    }
    sp_jbuf_lit(b, ",\"name\":");
    sp_jbuf_cstr(b, s->name);
    sp_jbuf_printf(b, ",\"kind\":%d", s->kind);
    put_unix_ns(b, "startTimeUnixNano", s->start_ns);
    put_unix_ns(b, "endTimeUnixNano", s->end_ns > s->start_ns ? s->end_ns : s->start_ns);
    sp_jbuf_lit(b, ",\"attributes\":[");
    bool first = true;
    for (int k = 0; k < t->n_attrs; k++) {
        const attr_t *a = &t->attrs[k];
        if (a->span != i) {
            continue;
        }
        if (a->type == A_STR) {
            put_attr_str(b, &first, a->key, t->str + a->off, a->len);
        } else {
            put_attr_int(b, &first, a->key, a->i);
        }
    }
    sp_jbuf_lit(b, "]");
    if (s->error) {
        sp_jbuf_lit(b, ",\"status\":{\"code\":2}"); /* STATUS_CODE_ERROR */
    }
    /* SpanFlags: the W3C flags in the low byte, and whether the parent is
     * remote (bit 9) known (bit 8). */
    unsigned flags = t->flags | 0x100u | (remote && t->has_parent ? 0x200u : 0u);
    sp_jbuf_printf(b, ",\"flags\":%u}", flags);
}

static void
serialize(sp_jbuf_t *b, const sp_trace_t *list)
{
    sp_jbuf_lit(b, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    bool first = true;
    put_attr_str(b, &first, "service.name", E.service, strlen(E.service));
    put_attr_str(b, &first, "service.version", SAMPAN_VERSION, strlen(SAMPAN_VERSION));
    put_attr_str(b, &first, "telemetry.sdk.name", "sampan", 6);
    put_attr_str(b, &first, "telemetry.sdk.language", "c", 1);
    put_attr_str(b, &first, "telemetry.sdk.version", SAMPAN_VERSION, strlen(SAMPAN_VERSION));
    put_attr_int(b, &first, "process.pid", (int64_t)getpid());
    if (E.hostname[0]) {
        put_attr_str(b, &first, "host.name", E.hostname, strlen(E.hostname));
    }
    sp_jbuf_lit(b, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"sampan\",\"version\":\"" SAMPAN_VERSION
                   "\"},\"spans\":[");
    bool any = false;
    for (const sp_trace_t *t = list; t; t = t->next) {
        for (int i = 0; i < t->n_spans; i++) {
            if (any) {
                sp_jbuf_lit(b, ",");
            }
            any = true;
            put_span(b, t, i);
        }
    }
    sp_jbuf_lit(b, "]}]}]}");
}

/* ---------------------------------------------------------------- POST */

/* The collector's answer body is not needed (OTLP's partial-success message
 * is advisory); it is read and thrown away, and bounded so that a collector
 * streaming garbage cannot keep the exporter busy. */
static size_t
discard_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    size_t *seen = ud, n = size * nmemb;
    (void)ptr;
    *seen += n;
    return *seen > 1u << 20 ? 0 : n; /* 0 makes libcurl fail the transfer */
}

/* Create the exporter's easy handle: everything that does not change
 * between POSTs. libcurl keeps the connection open between them (keep-alive)
 * and reads the proxy variables (http_proxy, https_proxy, no_proxy) itself. */
static CURL *
curl_handle(char *err, size_t err_len)
{
    CURL *h = curl_easy_init();
    if (h == NULL) {
        sp_errf(err, err_len, SP_ERR_NOMEM, "tracing: cannot create the HTTP client");
        return NULL;
    }
    bool ok = curl_easy_setopt(h, CURLOPT_URL, E.url) == CURLE_OK &&
              curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK &&
              curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L) == CURLE_OK && /* a thread: no SIGALRM */
              curl_easy_setopt(h, CURLOPT_POST, 1L) == CURLE_OK &&
              curl_easy_setopt(h, CURLOPT_HTTPHEADER, E.headers) == CURLE_OK &&
              curl_easy_setopt(h, CURLOPT_USERAGENT, "sampan/" SAMPAN_VERSION) == CURLE_OK &&
              curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard_body) == CURLE_OK &&
              curl_easy_setopt(h, CURLOPT_ERRORBUFFER, E.curl_err) == CURLE_OK &&
              curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L) == CURLE_OK;
    if (ok && E.ca_file[0]) {
        ok = curl_easy_setopt(h, CURLOPT_CAINFO, E.ca_file) == CURLE_OK;
    }
    if (ok && E.client_cert[0]) {
        ok = curl_easy_setopt(h, CURLOPT_SSLCERT, E.client_cert) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_SSLKEY, E.client_key[0] ? E.client_key : E.client_cert) ==
                 CURLE_OK;
    }
    if (!ok) {
        curl_easy_cleanup(h);
        sp_errf(err, err_len, SP_ERR_INVALID, "tracing: the HTTP client refused its settings");
        return NULL;
    }
    return h;
}

/* One POST of body; the response's status code, or -1 (why says it) when
 * the collector could not be reached or did not answer by the deadline.
 * *retry_after_s: the answer's Retry-After in seconds (0: none). */
static int
post(CURL *h, const char *body, size_t len, int64_t deadline_ns, long *retry_after_s, char *why,
     size_t why_len)
{
    int64_t left_ms = (deadline_ns - sp_time_ns()) / 1000000;
    if (left_ms < 1) {
        left_ms = 1;
    }
    size_t seen = 0;
    E.curl_err[0] = '\0';
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &seen);
    /* One deadline for the exchange: resolving (libcurl's threaded resolver),
     * connecting, TLS, sending and the answer. */
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)left_ms);
    CURLcode rc = curl_easy_perform(h);
    *retry_after_s = 0;
    if (rc != CURLE_OK) {
        snprintf(why, why_len, "%s", E.curl_err[0] ? E.curl_err : curl_easy_strerror(rc));
        return -1;
    }
    long code = 0;
    curl_off_t ra = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK && ra > 0) {
        *retry_after_s = ra > 3600 ? 3600 : (long)ra;
    }
    if (code < 100 || code > 599) {
        snprintf(why, why_len, "a malformed answer");
        return -1;
    }
    return (int)code;
}

/* ------------------------------------------------------------- exporter */

static void
abs_deadline(struct timespec *ts, int64_t deadline_ns)
{
    ts->tv_sec = (time_t)(deadline_ns / 1000000000LL);
    ts->tv_nsec = (long)(deadline_ns % 1000000000LL);
}

/* The wait before try attempt+1: exponential (100 ms doubling, at most
 * 6.4 s) with jitter in its upper half, so that servers restarted together
 * do not retry in step; a collector's Retry-After is obeyed when longer, up
 * to RETRY_AFTER_MAX_S. */
#define RETRY_AFTER_MAX_S 30

static int64_t
backoff_ns(int attempt, long retry_after_s)
{
    int64_t base = (100LL << (attempt - 1 < 6 ? attempt - 1 : 6)) * 1000000;
    int64_t d = base / 2 + (int64_t)(rng_next() % (uint64_t)(base / 2 + 1));
    int64_t ra = (int64_t)(retry_after_s < RETRY_AFTER_MAX_S ? retry_after_s : RETRY_AFTER_MAX_S) *
                 1000000000LL;
    return ra > d ? ra : d;
}

/* Serialise and POST one batch, retrying what can be retried. Called
 * without the lock, on the exporter thread. */
static void
export_batch(CURL *h, const sp_trace_t *list, int64_t n_spans)
{
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    serialize(&b, list);
    char why[CURL_ERROR_SIZE + 64] = "out of memory";
    int code = -1;
    bool ok = false;
    int attempt = 1;
    for (; !b.oom; attempt++) {
        int64_t now = sp_time_ns();
        int64_t deadline = now + (int64_t)E.p.timeout_ms * 1000000;
        pthread_mutex_lock(&E.mu);
        bool stopping = E.stopping;
        if (stopping && E.stop_deadline_ns < deadline) {
            deadline = E.stop_deadline_ns;
        }
        pthread_mutex_unlock(&E.mu);
        if (deadline <= now) {
            snprintf(why, sizeof why, "no time left at shutdown");
            break;
        }
        long retry_after = 0;
        code = h ? post(h, b.p, b.len, deadline, &retry_after, why, sizeof why) : -1;
        if (code >= 200 && code < 300) {
            ok = true;
            break;
        }
        if (code > 0) {
            snprintf(why, sizeof why, "the collector answered %d", code);
        }
        /* OTLP/HTTP: retry on 429, 502, 503, 504 and on a network error. */
        bool retry = code < 0 || code == 429 || code == 502 || code == 503 || code == 504;
        if (!retry || attempt >= E.p.max_attempts) {
            break;
        }
        atomic_fetch_add_explicit(&E.retries, 1, memory_order_relaxed);
        /* The wait is cut short at shutdown: time is short then. */
        int64_t until = sp_time_ns() + backoff_ns(attempt, retry_after);
        pthread_mutex_lock(&E.mu);
        while (!E.stopping && sp_time_ns() < until) {
            struct timespec ts;
            abs_deadline(&ts, until);
            pthread_cond_timedwait(&E.cv, &E.mu, &ts);
        }
        pthread_mutex_unlock(&E.mu);
    }
    sp_jbuf_free(&b);
    if (ok) {
        atomic_fetch_add_explicit(&E.exported, (uint64_t)n_spans, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&E.dropped_export, (uint64_t)n_spans, memory_order_relaxed);
    atomic_fetch_add_explicit(&E.exports_failed, 1, memory_order_relaxed);
    SP_LOG_WARN("event=trace_export_failed spans=%lld endpoint=%s attempts=%d error=%s",
                (long long)n_spans, sp_log_str(E.url_log), attempt, sp_log_str(why));
}

static void *
exporter_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&E.mu);
    for (;;) {
        int64_t wake = sp_time_ns() + (int64_t)E.p.flush_interval_ms * 1000000;
        while (!E.stopping && E.queued_spans < E.p.max_batch_spans) {
            struct timespec ts;
            abs_deadline(&ts, wake);
            if (pthread_cond_timedwait(&E.cv, &E.mu, &ts) == ETIMEDOUT) {
                break;
            }
        }
        if (E.head == NULL) {
            if (E.stopping) {
                break;
            }
            continue;
        }
        /* Whole records, up to a batch (a record larger than a batch goes alone). */
        sp_trace_t *list = E.head, *last = NULL;
        int64_t n = 0;
        for (sp_trace_t *t = E.head; t && (n == 0 || n + t->n_spans <= E.p.max_batch_spans);
             t = t->next) {
            n += t->n_spans;
            last = t;
        }
        E.head = last->next;
        if (E.head == NULL) {
            E.tail = NULL;
        }
        last->next = NULL;
        E.queued_spans -= n;
        pthread_mutex_unlock(&E.mu);
        export_batch(E.curl, list, n);
        while (list) {
            sp_trace_t *nx = list->next;
            sp_free(list);
            list = nx;
        }
        pthread_mutex_lock(&E.mu);
    }
    pthread_mutex_unlock(&E.mu);
    return NULL;
}

/* ---------------------------------------------------------- init, stop */

sp_trace_params_t
sp_trace_default_params(void)
{
    sp_trace_params_t p;
    memset(&p, 0, sizeof p);
    p.service_name = "sampan";
    p.sample_ratio = 1.0;
    p.max_queue_spans = 2048;
    p.max_batch_spans = 512;
    p.flush_interval_ms = 1000;
    p.timeout_ms = 5000;
    p.max_attempts = 3;
    p.shutdown_ms = 3000;
    return p;
}

/* "http[s]://[user:password@]host[:port][/prefix]", parsed by libcurl's URL
 * parser, into E.url (the prefix plus /v1/traces) and E.url_log (the same
 * without credentials, for logs). */
static sp_status_t
parse_endpoint(const char *ep, char *err, size_t err_len)
{
    CURLU *u = curl_url();
    if (u == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "tracing: out of memory");
    }
    sp_status_t st = SP_OK;
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *full = NULL, *shown = NULL;
    CURLUcode rc = curl_url_set(u, CURLUPART_URL, ep, 0);
    if (rc == CURLUE_BAD_PORT_NUMBER) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "--otlp-endpoint %s: bad port", ep);
        goto out;
    }
    if (rc == CURLUE_NO_HOST) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "--otlp-endpoint %s: no host", ep);
        goto out;
    }
    if (rc != CURLUE_OK) {
        st = sp_errf(err, err_len, SP_ERR_INVALID,
                     "--otlp-endpoint %s: not an http:// or https:// URL (%s)", ep,
                     curl_url_strerror(rc));
        goto out;
    }
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
        st = sp_errf(err, err_len, SP_ERR_INVALID,
                     "--otlp-endpoint %s: must start with http:// or https://", ep);
        goto out;
    }
    if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || host[0] == '\0') {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "--otlp-endpoint %s: no host", ep);
        goto out;
    }
    if (curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        atol(port) < 1 || atol(port) > 65535) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "--otlp-endpoint %s: bad port", ep);
        goto out;
    }
    char *q = NULL;
    if (curl_url_get(u, CURLUPART_QUERY, &q, 0) == CURLUE_OK ||
        curl_url_get(u, CURLUPART_FRAGMENT, &q, 0) == CURLUE_OK) {
        curl_free(q);
        st = sp_errf(err, err_len, SP_ERR_INVALID,
                     "--otlp-endpoint %s: a query or fragment has no place in it", ep);
        goto out;
    }
    /* The signal's path is appended to the prefix; an endpoint that already
     * names it is taken as it is. */
    if (curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "--otlp-endpoint %s: bad path", ep);
        goto out;
    }
    size_t pl = strlen(path);
    while (pl > 0 && path[pl - 1] == '/') {
        pl--;
    }
    bool named = pl >= 10 && memcmp(path + pl - 10, "/v1/traces", 10) == 0;
    char np[1024];
    if (pl + 11 >= sizeof np) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "--otlp-endpoint %s: path too long", ep);
        goto out;
    }
    snprintf(np, sizeof np, "%.*s%s", (int)pl, path, named ? "" : "/v1/traces");
    if (curl_url_set(u, CURLUPART_PATH, np, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_URL, &full, 0) != CURLUE_OK || strlen(full) >= sizeof E.url) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "--otlp-endpoint %s: too long", ep);
        goto out;
    }
    snprintf(E.url, sizeof E.url, "%s", full);
    curl_url_set(u, CURLUPART_USER, NULL, 0);
    curl_url_set(u, CURLUPART_PASSWORD, NULL, 0);
    if (curl_url_get(u, CURLUPART_URL, &shown, 0) == CURLUE_OK) {
        snprintf(E.url_log, sizeof E.url_log, "%s", shown);
    }
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(full);
    curl_free(shown);
    curl_url_cleanup(u);
    return st;
}

/* An environment variable of the OTLP exporter: the traces-specific name
 * (OTEL_EXPORTER_OTLP_TRACES_<what>) wins over the general one
 * (OTEL_EXPORTER_OTLP_<what>), as the OpenTelemetry specification says.
 * which receives the name read, for messages. NULL when neither is set. */
static const char *
otlp_env(const char *what, char *which, size_t which_len)
{
    char name[96];
    snprintf(name, sizeof name, "OTEL_EXPORTER_OTLP_TRACES_%s", what);
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0') {
        snprintf(name, sizeof name, "OTEL_EXPORTER_OTLP_%s", what);
        v = getenv(name);
    }
    snprintf(which, which_len, "%s", name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

static bool
tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* The request headers: Content-Type, no "Expect: 100-continue" (a second
 * round trip per batch), then those of OTEL_EXPORTER_OTLP_[TRACES_]HEADERS:
 * "key=value,key2=value2" with percent-encoded values (the W3C baggage
 * form the specification names). A malformed list is a start-up error,
 * never half applied; the values (tokens, usually) never reach a log. */
static sp_status_t
build_headers(char *err, size_t err_len)
{
    struct curl_slist *l = NULL, *n;
    n = curl_slist_append(l, "Content-Type: application/json");
    l = n ? n : l;
    n = n ? curl_slist_append(l, "Expect:") : NULL;
    l = n ? n : l;
    if (n == NULL) {
        curl_slist_free_all(l);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "tracing: out of memory");
    }
    char which[96];
    const char *env = otlp_env("HEADERS", which, sizeof which);
    E.n_user_headers = 0;
    E.header_names[0] = '\0';
    for (const char *p = env; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        const char *k = p, *ke = eq ? eq : p + len;
        while (k < ke && (*k == ' ' || *k == '\t')) k++;
        while (ke > k && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
        bool key_ok = eq != NULL && ke > k;
        for (const char *c = k; key_ok && c < ke; c++) {
            key_ok = tchar((unsigned char)*c);
        }
        if (!key_ok) {
            curl_slist_free_all(l);
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s: entry %d is not key=value with a header name as key", which,
                           E.n_user_headers + 1);
        }
        const char *v = eq + 1, *ve = p + len;
        while (v < ve && (*v == ' ' || *v == '\t')) v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        int dl = 0;
        char *val = curl_easy_unescape(NULL, v, (int)(ve - v), &dl);
        bool val_ok = val != NULL;
        for (int i = 0; val_ok && i < dl; i++) {
            unsigned char c = (unsigned char)val[i];
            val_ok = c >= 0x20 && c != 0x7f; /* no CR, LF, NUL: no header injection */
        }
        char line[4096];
        /* "Name;" is libcurl's spelling of a header with an empty value ("Name:"
         * would remove the header instead). */
        int ln = !val_ok ? -1
                 : dl == 0 ? snprintf(line, sizeof line, "%.*s;", (int)(ke - k), k)
                           : snprintf(line, sizeof line, "%.*s: %.*s", (int)(ke - k), k, dl, val);
        if (val) {
            OPENSSL_cleanse(val, (size_t)dl);
        }
        curl_free(val);
        if (ln < 0 || (size_t)ln >= sizeof line) {
            curl_slist_free_all(l);
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s: the value of %.*s has control characters or is too long", which,
                           (int)(ke - k), k);
        }
        n = curl_slist_append(l, line);
        OPENSSL_cleanse(line, sizeof line);
        if (n == NULL) {
            curl_slist_free_all(l);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "tracing: out of memory");
        }
        l = n;
        size_t hl = strlen(E.header_names);
        snprintf(E.header_names + hl, sizeof E.header_names - hl, "%s%.*s", hl ? "," : "",
                 (int)(ke - k), k);
        E.n_user_headers++;
        p = end ? end + 1 : p + len;
    }
    E.headers = l;
    return SP_OK;
}

/* A file named by an OTEL_EXPORTER_OTLP_[TRACES_]<what> variable, checked
 * now so that a typo is a start-up error rather than failed exports. */
static sp_status_t
env_file(const char *what, char *out, size_t cap, char *err, size_t err_len)
{
    char which[96];
    const char *v = otlp_env(what, which, sizeof which);
    out[0] = '\0';
    if (v == NULL) {
        return SP_OK;
    }
    if (strlen(v) >= cap || access(v, R_OK) != 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: cannot read %s", which, v);
    }
    snprintf(out, cap, "%s", v);
    return SP_OK;
}

sp_status_t
sp_trace_init(const sp_trace_params_t *p, char *err, size_t err_len)
{
    if (p->endpoint == NULL || p->endpoint[0] == '\0') {
        return SP_OK;
    }
    if (!(p->sample_ratio >= 0.0 && p->sample_ratio <= 1.0)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "--trace-sample-ratio must be in 0..1");
    }
    if (p->max_queue_spans < 1 || p->max_batch_spans < 1 || p->flush_interval_ms < 1 ||
        p->timeout_ms < 1 || p->max_attempts < 1 || p->shutdown_ms < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "tracing: bad exporter limits");
    }
    const char *svc = p->service_name && p->service_name[0] ? p->service_name : "sampan";
    if (strlen(svc) >= sizeof E.service) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "--otel-service-name is too long");
    }
    /* Before any thread: curl_global_init is not safe to race with. */
    if (!E.curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            return sp_errf(err, err_len, SP_ERR_IO, "tracing: libcurl failed to initialise");
        }
        E.curl_ready = true;
    }
    sp_status_t st = parse_endpoint(p->endpoint, err, err_len);
    if (st == SP_OK) {
        st = env_file("CERTIFICATE", E.ca_file, sizeof E.ca_file, err, err_len);
    }
    if (st == SP_OK) {
        st = env_file("CLIENT_CERTIFICATE", E.client_cert, sizeof E.client_cert, err, err_len);
    }
    if (st == SP_OK) {
        st = env_file("CLIENT_KEY", E.client_key, sizeof E.client_key, err, err_len);
    }
    if (st == SP_OK) {
        st = build_headers(err, err_len);
    }
    if (st != SP_OK) {
        return st;
    }
    E.curl = curl_handle(err, err_len);
    if (E.curl == NULL) {
        curl_slist_free_all(E.headers);
        E.headers = NULL;
        return SP_ERR_INVALID;
    }
    E.p = *p;
    E.p.endpoint = p->endpoint; /* borrowed: the server's configuration outlives the exporter */
    snprintf(E.service, sizeof E.service, "%s", svc);
    if (gethostname(E.hostname, sizeof E.hostname) != 0) {
        E.hostname[0] = '\0';
    }
    E.hostname[sizeof E.hostname - 1] = '\0';
    /* ratio 1 must sample every id: 2^56 is above every 56-bit value. */
    E.threshold = (uint64_t)(p->sample_ratio * 72057594037927936.0);
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    E.unix_offset_ns = (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec - sp_time_ns();
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the deadlines are sp_time_ns() */
    pthread_cond_init(&E.cv, &ca);
    pthread_condattr_destroy(&ca);
    E.head = E.tail = NULL;
    E.queued_spans = 0;
    E.stopping = false;
    if (pthread_create(&E.thread, NULL, exporter_main, NULL) != 0) {
        pthread_cond_destroy(&E.cv);
        curl_easy_cleanup(E.curl);
        E.curl = NULL;
        curl_slist_free_all(E.headers);
        E.headers = NULL;
        return sp_errf(err, err_len, SP_ERR_NOMEM, "tracing: cannot start the exporter thread");
    }
    E.started = true;
    sp__trace_on = true;
    /* The header names only: their values are credentials as a rule. */
    SP_LOG_INFO("event=tracing url=%s service=%s sample_ratio=%g headers=%s ca_file=%s",
                sp_log_str(E.url_log), sp_log_str(E.service), p->sample_ratio,
                sp_log_str(E.header_names), sp_log_str(E.ca_file));
    return SP_OK;
}

void
sp_trace_shutdown(void)
{
    if (!E.started) {
        return;
    }
    pthread_mutex_lock(&E.mu);
    E.stopping = true;
    E.stop_deadline_ns = sp_time_ns() + (int64_t)E.p.shutdown_ms * 1000000;
    pthread_cond_broadcast(&E.cv);
    pthread_mutex_unlock(&E.mu);
    pthread_join(E.thread, NULL);
    E.started = false;
    sp__trace_on = false;
    pthread_cond_destroy(&E.cv);
    curl_easy_cleanup(E.curl);
    E.curl = NULL;
    curl_slist_free_all(E.headers);
    E.headers = NULL;
    sp_trace_stats_t st;
    sp_trace_get_stats(&st);
    SP_LOG_INFO("event=tracing_stopped spans_exported=%llu spans_dropped=%llu retries=%llu",
                (unsigned long long)st.spans_exported,
                (unsigned long long)(st.spans_dropped_queue + st.spans_dropped_export),
                (unsigned long long)atomic_load(&E.retries));
}
