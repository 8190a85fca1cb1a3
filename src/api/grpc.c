/*
 * grpc.c - the gRPC front end: HTTP/2 connections (nghttp2) on the HTTP
 * server's libevent loops, gRPC message framing, and calls run as virtual
 * requests through the server's own handler (grpc.h says why).
 *
 * A connection is a bufferevent (plain, or OpenSSL with ALPN h2) and an
 * nghttp2 server session: read_cb feeds the bytes to the session, whose
 * callbacks build streams; flush() writes what the session wants to send.
 * Work that completes later (a model's answer, delivered on the loop by the
 * scheduler's mailbox) only appends to a stream and activates the
 * connection's flush event, so nothing is freed under a caller's feet:
 * streams are freed by nghttp2's stream-close callback, connections only at
 * the top of a libevent callback.
 *
 * A stream is one call. Its request bytes are framed as gRPC messages (a
 * 1-byte compressed flag, a 4-byte big-endian length, the protobuf); a
 * unary call runs when the client half-closes, each ModelStreamInfer
 * message runs as it completes. A call is a virtual request whose sink
 * (the sp_http_sink_t below) turns the REST answer into messages and the
 * final grpc-status trailer (grpc_msg.c; grpc_ext.c for the statistics,
 * repository and health methods). A grpc.health.v1.Health/Watch stream keeps
 * its request and runs it again from the loop's tick every WATCH_POLL_MS,
 * sending a status only when it changed. Cancelling (RST_STREAM, a closed
 * connection) cancels the virtual requests, which cancels their jobs.
 *
 * Untrusted input, bounded: SETTINGS_MAX_CONCURRENT_STREAMS, a header list
 * of at most --max-header-bytes and --max-headers, a message of at most
 * --max-body-bytes (RESOURCE_EXHAUSTED from its length prefix, before its
 * bytes are buffered), buffered request bytes per connection, calls in
 * flight per stream, nghttp2's own flood and rapid-reset limits, unsent
 * output (--max-output-bytes), and timers: a TLS handshake and a unary
 * request message must arrive within --header-timeout + --body-timeout, an
 * idle connection closes after --idle-timeout.
 */
#include "api/grpc.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "api/grpc_msg.h"
#include "serving/registry.h"
#include "api/api.h"
#include "http/tls.h"

#define TICK_MS 250
#define WATCH_POLL_MS 1000         /* Health.Watch: how often the readiness is read again */
#define CONN_MAX_BUFFERED_FACTOR 2 /* request bytes buffered per connection: 2 x a message */
#define STREAM_WINDOW (1 << 20)    /* per-stream receive window */
#define CONN_WINDOW (16 << 20)     /* connection receive window */

/* Request headers a call passes on to the handler (the rest stay here). */
static const char *const pass_headers[] = {"authorization", "x-api-key", "x-request-id",
                                           "traceparent", "tracestate", "user-agent"};
#define N_PASS (int)(sizeof pass_headers / sizeof pass_headers[0])

struct sp_grpc {
    sp_grpc_params_t p;
    int fd;                 /* the listening socket; each loop watches a dup */
    int port;
    SSL_CTX *tls;           /* NULL: plain HTTP/2 (prior knowledge) */
    atomic_bool draining;
    atomic_int n_conns;
};

typedef struct gconn gconn_t;
typedef struct gstream gstream_t;
typedef struct gcall gcall_t;

struct sp_grpc_loop {
    sp_grpc_t *g;
    sp_http_loop_t *loop;
    struct evconnlistener *lst;
    struct event *tick;
    gconn_t *conns;
};

struct gconn {
    sp_grpc_loop_t *gl;
    sp_http_server_t *http;  /* holds the per-client count of this connection's address */
    void *client;            /* that count (sp_http_client_admit), or NULL */
    struct bufferevent *bev;
    nghttp2_session *h2;
    struct event *flush_ev;
    gconn_t *prev, *next;
    gstream_t *streams;
    size_t buffered;        /* request bytes held by its streams */
    int64_t start_ns, active_ns;
    bool tls, tls_ok, goaway, dead;
    int nest;
    char peer[64];
    char client_cn[SP_HTTP_CN_MAX + 1];
};

struct gstream {
    gconn_t *c;
    gstream_t *prev, *next;
    int32_t id;
    int method;             /* sp_grpc_method_t, -1 unknown */
    bool is_post, ctype_ok, hdr_over;
    size_t hdr_bytes;
    int n_hdrs;
    sp_str_t hname[N_PASS], hval[N_PASS]; /* kept metadata (values owned) */
    struct evbuffer *in;    /* request bytes not yet framed */
    uint8_t *msg;           /* unary: the request message */
    size_t msg_len;
    bool have_msg, eof_in, dispatched;
    int64_t start_ns;
    /* The answer. */
    struct evbuffer *out;   /* framed messages not yet given to nghttp2 */
    bool headers_sent, finished, trailers_sent;
    int status;
    char message[512];
    char rid[SP_HTTP_RID_MAX + 1];
    char traceparent[64]; /* the server span's W3C traceparent, "" when not traced */
    gcall_t *calls;
    int n_calls;
    /* Health.Watch: the request, run again every WATCH_POLL_MS, and the
     * last status sent (a new one only goes out when it differs). */
    uint8_t *watch_msg;
    size_t watch_len;
    int64_t watch_next_ns;
    uint8_t *watch_last;
    size_t watch_last_len;
};

struct gcall {
    gstream_t *st;
    gcall_t *prev, *next;
    sp_http_req_t *r;
    sp_grpc_kind_t kind;
    char id[128];
    struct evbuffer *sse;   /* generate_stream: event bytes not yet parsed */
};

static void flush(gconn_t *c);
static void stream_finish(gstream_t *st, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The methods: grpc_msg.c's (inference and metadata) and grpc_ext.c's
 * (statistics, repository, health) behind one set of calls. */
static int
method_find(const char *path, size_t len)
{
    int m = sp__grpc_msg_method_find(path, len);
    return m >= 0 ? m : sp__grpc_ext_method_find(path, len);
}

static const char *
method_name(int m)
{
    return m >= SP_GRPC_EXT_FIRST ? sp__grpc_ext_method_name(m) : sp__grpc_msg_method_name(m);
}

/* ------------------------------------------------------------- helpers */

static size_t
max_message(const gconn_t *c)
{
    return c->gl->g->p.limits.max_body_bytes;
}

static void
schedule_flush(gconn_t *c)
{
    event_active(c->flush_ev, EV_WRITE, 0);
}

/* grpc-message is percent-encoded: printable ASCII except '%' as is. */
static void
pct_encode(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s && o + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch >= 0x20 && ch <= 0x7e && ch != '%') {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o] = '\0';
}

/* A header field: the name is a literal, the value is copied by nghttp2. */
#define NV(n, v, vl)                                                                     \
    (nghttp2_nv)                                                                         \
    {                                                                                    \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NO_COPY_NAME \
    }

/* -------------------------------------------------------------- output */

static ssize_t
data_read(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
          nghttp2_data_source *src, void *ud)
{
    gstream_t *st = src->ptr;
    size_t n = evbuffer_remove(st->out, buf, length);
    if (evbuffer_get_length(st->out) > 0) {
        return (ssize_t)n;
    }
    if (!st->finished) {
        return n > 0 ? (ssize_t)n : NGHTTP2_ERR_DEFERRED;
    }
    /* All sent: end with the trailers. */
    char code[8], msg[1600];
    snprintf(code, sizeof code, "%d", st->status);
    pct_encode(st->message, msg, sizeof msg);
    nghttp2_nv tr[2];
    tr[0] = NV("grpc-status", code, strlen(code));
    tr[1] = NV("grpc-message", msg, strlen(msg));
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    nghttp2_submit_trailer(h2, id, tr, msg[0] ? 2 : 1);
    st->trailers_sent = true;
    return (ssize_t)n;
}

static int
send_headers(gstream_t *st)
{
    nghttp2_data_provider dp;
    dp.source.ptr = st;
    dp.read_callback = data_read;
    nghttp2_nv h[4];
    size_t n = 0;
    h[n++] = NV(":status", "200", 3);
    h[n++] = NV("content-type", "application/grpc", 16);
    if (st->rid[0]) {
        h[n++] = NV("x-request-id", st->rid, strlen(st->rid));
    }
    if (st->traceparent[0]) {
        h[n++] = NV("traceparent", st->traceparent, strlen(st->traceparent));
    }
    st->headers_sent = true;
    return nghttp2_submit_response(st->c->h2, st->id, h, n, &dp);
}

/* Append one framed message to the stream's answer. */
static void
stream_send(gstream_t *st, const uint8_t *msg, size_t len)
{
    if (st->finished) {
        return;
    }
    evbuffer_add(st->out, msg, len);
    if (!st->headers_sent) {
        send_headers(st);
    } else {
        nghttp2_session_resume_data(st->c->h2, st->id);
    }
    schedule_flush(st->c);
}

static void
call_cancel(gcall_t *k)
{
    gstream_t *st = k->st;
    if (k->prev) {
        k->prev->next = k->next;
    } else {
        st->calls = k->next;
    }
    if (k->next) {
        k->next->prev = k->prev;
    }
    st->n_calls--;
    if (k->r) {
        sp_http_req_t *r = k->r;
        k->r = NULL;
        sp_http_vreq_cancel(r); /* no sink call follows */
    }
    if (k->sse) {
        evbuffer_free(k->sse);
    }
    sp_free(k);
}

/* The call's answer is complete (or dropped): forget it. */
static void
call_done(gcall_t *k)
{
    k->r = NULL;
    call_cancel(k);
}

/* End the stream with a status (the trailers, or a trailers-only answer
 * when nothing was sent). Calls still running on it are cancelled. */
static void
stream_finish(gstream_t *st, int status, const char *fmt, ...)
{
    if (st->finished) {
        return;
    }
    while (st->calls) {
        call_cancel(st->calls);
    }
    st->finished = true;
    st->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
    gconn_t *c = st->c;
    if (!st->headers_sent) {
        char code[8], msg[1600];
        snprintf(code, sizeof code, "%d", status);
        pct_encode(st->message, msg, sizeof msg);
        /* Trailers-Only: one HEADERS frame that ends the stream. */
        nghttp2_nv h[6];
        size_t n = 0;
        h[n++] = NV(":status", "200", 3);
        h[n++] = NV("content-type", "application/grpc", 16);
        h[n++] = NV("grpc-status", code, strlen(code));
        if (msg[0]) {
            h[n++] = NV("grpc-message", msg, strlen(msg));
        }
        if (st->rid[0]) {
            h[n++] = NV("x-request-id", st->rid, strlen(st->rid));
        }
        if (st->traceparent[0]) {
            h[n++] = NV("traceparent", st->traceparent, strlen(st->traceparent));
        }
        st->headers_sent = true;
        st->trailers_sent = true;
        nghttp2_submit_response(c->h2, st->id, h, n, NULL);
    } else {
        nghttp2_session_resume_data(c->h2, st->id);
    }
    /* The rest of the request is not wanted any more. */
    if (evbuffer_get_length(st->in) > 0) {
        c->buffered -= evbuffer_get_length(st->in);
        evbuffer_drain(st->in, evbuffer_get_length(st->in));
    }
    schedule_flush(c);
}

/* A ModelStreamInfer stream ends when the client is done sending and every
 * request on it has been answered. */
static void
stream_maybe_end(gstream_t *st)
{
    if (st->method == SP_GRPC_MODEL_STREAM_INFER && st->eof_in && st->calls == NULL) {
        stream_finish(st, SP_GRPC_OK, "%s", "");
    }
}

/* ---------------------------------------------------------------- sink */

static void
take_header(const char *key, const char *hdrs, size_t len, char *out, size_t cap)
{
    const size_t kl = strlen(key);
    for (size_t i = 0; i + kl <= len; i++) {
        if ((i == 0 || hdrs[i - 1] == '\n') && strncasecmp(hdrs + i, key, kl) == 0) {
            const char *v = hdrs + i + kl;
            const char *e = memchr(v, '\r', len - (size_t)(v - hdrs));
            size_t vl = e ? (size_t)(e - v) : 0;
            if (vl && vl < cap) {
                memcpy(out, v, vl);
                out[vl] = '\0';
            }
            return;
        }
    }
}

/* The HTTP answer's request id and traceparent become the call's response
 * metadata, as they are headers of the REST answer (docs/tracing.md). */
static void
take_rid(gstream_t *st, const char *hdrs, size_t len)
{
    if (st->rid[0] || st->headers_sent) {
        return;
    }
    take_header("x-request-id: ", hdrs, len, st->rid, sizeof st->rid);
    take_header("traceparent: ", hdrs, len, st->traceparent, sizeof st->traceparent);
}

static void
sink_respond(void *ud, int status, const char *ctype, const char *hdrs, size_t hdrs_len,
             const char *body, size_t len)
{
    gcall_t *k = ud;
    gstream_t *st = k->st;
    bool stream = st->method == SP_GRPC_MODEL_STREAM_INFER;
    take_rid(st, hdrs, hdrs_len);
    uint8_t *msg = NULL;
    size_t ml = 0;
    char err[1024];
    int code = k->kind >= SP_GRPC_K_STATS && (status == 200 || k->kind >= SP_GRPC_K_HEALTH)
                   ? sp__grpc_ext_from_rest(k->kind, status, body, len, &msg, &ml, err, sizeof err)
                   : sp__grpc_msg_from_rest(k->kind, stream, status, hdrs, hdrs_len, body, len,
                                            k->id, &msg, &ml, err, sizeof err);
    call_done(k);
    if (code == SP_GRPC_OK && st->method == SP_GRPC_HEALTH_WATCH) {
        /* A status, sent when it changed; the stream stays open. */
        st->watch_next_ns = sp_time_ns() + (int64_t)WATCH_POLL_MS * 1000000;
        if (st->watch_last == NULL || st->watch_last_len != ml ||
            memcmp(st->watch_last, msg, ml) != 0) {
            stream_send(st, msg, ml);
            sp_free(st->watch_last);
            st->watch_last = msg;
            st->watch_last_len = ml;
            msg = NULL;
        }
        sp_free(msg);
        return;
    }
    if (code != SP_GRPC_OK) {
        stream_finish(st, code, "%s", err);
    } else {
        stream_send(st, msg, ml);
        if (stream) {
            stream_maybe_end(st);
        } else {
            stream_finish(st, SP_GRPC_OK, "%s", "");
        }
    }
    sp_free(msg);
}

static void
sink_stream_start(void *ud, int status, const char *ctype, const char *hdrs, size_t hdrs_len)
{
    gcall_t *k = ud;
    take_rid(k->st, hdrs, hdrs_len);
}

static size_t
sink_pending(void *ud)
{
    gcall_t *k = ud;
    gconn_t *c = k->st->c;
    return evbuffer_get_length(k->st->out) + evbuffer_get_length(bufferevent_get_output(c->bev));
}

/* generate_stream's SSE bytes: each "data: {...}\n\n" event is a response. */
static int
sink_stream_write(void *ud, const char *data, size_t len)
{
    gcall_t *k = ud;
    gstream_t *st = k->st;
    if (sink_pending(ud) > st->c->gl->g->p.limits.max_output_bytes) {
        return -1;
    }
    evbuffer_add(k->sse, data, len);
    for (;;) {
        struct evbuffer_ptr e = evbuffer_search(k->sse, "\n\n", 2, NULL);
        if (e.pos < 0) {
            break;
        }
        size_t n = (size_t)e.pos;
        char *ev = sp_malloc(n + 1);
        if (ev == NULL) {
            return -1;
        }
        evbuffer_remove(k->sse, ev, n);
        evbuffer_drain(k->sse, 2);
        ev[n] = '\0';
        if (n >= 6 && memcmp(ev, "data: ", 6) == 0) {
            uint8_t *msg = NULL;
            size_t ml = 0;
            bool final = false;
            if (sp__grpc_msg_from_event(ev + 6, n - 6, k->id, &msg, &ml, &final)) {
                stream_send(st, msg, ml);
            }
            sp_free(msg);
        }
        sp_free(ev);
    }
    return 0;
}

static void
sink_stream_end(void *ud)
{
    gcall_t *k = ud;
    gstream_t *st = k->st;
    call_done(k);
    stream_maybe_end(st);
}

static void
sink_aborted(void *ud)
{
    gcall_t *k = ud;
    gstream_t *st = k->st;
    call_done(k);
    stream_finish(st, SP_GRPC_RESOURCE_EXHAUSTED,
                  "the answer was dropped: the client reads it too slowly (--max-output-bytes)");
}

static const sp_http_sink_t grpc_sink = {
    sink_respond, sink_stream_start, sink_stream_write, sink_stream_end, sink_aborted, sink_pending,
};

/* --------------------------------------------------------------- calls */

static bool
is_llm(void *ud, const char *name, size_t len, const char *version, size_t vlen)
{
    sp_serving_t *s = ud;
    sp_served_model_t *m = NULL;
    char reason[64];
    sp_acq_t a = sp_registry_acquire(s, name, len, version, vlen, false, &m, reason, sizeof reason);
    bool llm = a == SP_ACQ_OK && m && m->be == NULL;
    sp_served_release(m);
    return llm;
}

/* Run one request message of the stream as a virtual request. */
static void
call_start(gstream_t *st, const uint8_t *msg, size_t len)
{
    gconn_t *c = st->c;
    sp_grpc_t *g = c->gl->g;
    sp_grpc_rest_t rest;
    char err[1024];
    bool stream = st->method == SP_GRPC_MODEL_STREAM_INFER;
    int code = st->method >= SP_GRPC_EXT_FIRST
                   ? sp__grpc_ext_to_rest(st->method, msg, len, &rest, err, sizeof err)
                   : sp__grpc_msg_to_rest(st->method, msg, len, is_llm, g->p.srv, &rest, err,
                                          sizeof err);
    if (code != SP_GRPC_OK) {
        if (stream && code != SP_GRPC_RESOURCE_EXHAUSTED) {
            /* One bad request on a stream is that request's error (Triton). */
            uint8_t *out = NULL;
            size_t ol = 0;
            if (sp__grpc_msg_stream_error(err, "", &out, &ol)) {
                stream_send(st, out, ol);
            }
            sp_free(out);
            stream_maybe_end(st);
            return;
        }
        stream_finish(st, code, "%s", err);
        return;
    }
    if (stream && st->n_calls >= SP_GRPC_STREAM_MAX_CALLS) {
        sp__grpc_msg_rest_free(&rest);
        stream_finish(st, SP_GRPC_RESOURCE_EXHAUSTED,
                      "more than %d requests in flight on one ModelStreamInfer stream",
                      SP_GRPC_STREAM_MAX_CALLS);
        return;
    }
    gcall_t *k = sp_calloc(1, sizeof *k);
    sp_str_t names[N_PASS + 1], vals[N_PASS + 1];
    int nh = 0;
    for (int i = 0; i < st->n_hdrs; i++) {
        names[nh] = st->hname[i];
        vals[nh++] = st->hval[i];
    }
    if (rest.hl[0]) {
        names[nh] = sp_str_c("inference-header-content-length");
        vals[nh++] = sp_str_c(rest.hl);
    }
    sp_http_vreq_params_t vp = {
        .method = rest.method,
        .path = rest.path,
        .path_len = rest.path_len,
        .hdr_names = names,
        .hdr_values = vals,
        .n_hdrs = nh,
        .body = rest.body,
        .body_len = rest.body_len,
        .peer = c->peer,
        .tls = c->tls,
        .client_cn = c->client_cn,
    };
    sp_http_req_t *r = k ? sp_http_vreq_create(c->gl->loop, &vp, &grpc_sink, k) : NULL;
    if (k) {
        k->sse = rest.kind == SP_GRPC_K_GENERATE ? evbuffer_new() : NULL;
    }
    if (r == NULL || (rest.kind == SP_GRPC_K_GENERATE && k->sse == NULL)) {
        if (r) {
            sp_http_vreq_cancel(r);
        }
        if (k && k->sse) {
            evbuffer_free(k->sse);
        }
        sp_free(k);
        sp__grpc_msg_rest_free(&rest);
        stream_finish(st, SP_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    sp__grpc_msg_rest_free(&rest); /* the request copied it */
    k->st = st;
    k->r = r;
    k->kind = rest.kind;
    snprintf(k->id, sizeof k->id, "%s", rest.id);
    k->next = st->calls;
    if (st->calls) {
        st->calls->prev = k;
    }
    st->calls = k;
    st->n_calls++;
    st->dispatched = true;
    sp_http_req_annotate(r, "proto=grpc grpc_method=%s", method_name(st->method));
    sp_http_vreq_run(r); /* may answer at once: k is not used after this */
}

/* ------------------------------------------------------------- framing */

/* Frame the buffered request bytes into messages. */
static void
stream_frame(gstream_t *st)
{
    gconn_t *c = st->c;
    while (!st->finished) {
        size_t have = evbuffer_get_length(st->in);
        if (have < 5) {
            return;
        }
        uint8_t pre[5];
        evbuffer_copyout(st->in, pre, 5);
        size_t len = (size_t)pre[1] << 24 | (size_t)pre[2] << 16 | (size_t)pre[3] << 8 | pre[4];
        if (pre[0] != 0) {
            stream_finish(st, SP_GRPC_UNIMPLEMENTED,
                          "compressed messages are not supported (send grpc-encoding identity)");
            return;
        }
        if (len > max_message(c)) {
            stream_finish(st, SP_GRPC_RESOURCE_EXHAUSTED,
                          "the request message has %zu bytes, more than the limit of %zu "
                          "(--max-body-bytes)", len, max_message(c));
            return;
        }
        if (have < 5 + len) {
            return;
        }
        uint8_t *msg = sp_malloc(len ? len : 1);
        if (msg == NULL) {
            stream_finish(st, SP_GRPC_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        evbuffer_drain(st->in, 5);
        evbuffer_remove(st->in, msg, len);
        c->buffered -= 5 + len;
        if (st->method == SP_GRPC_MODEL_STREAM_INFER) {
            call_start(st, msg, len);
            sp_free(msg);
            continue;
        }
        if (st->have_msg) {
            sp_free(msg);
            stream_finish(st, SP_GRPC_UNIMPLEMENTED, "%s takes one request message, got more",
                          method_name(st->method));
            return;
        }
        st->msg = msg;
        st->msg_len = len;
        st->have_msg = true;
    }
}

/* The client is done sending. */
static void
stream_eof(gstream_t *st)
{
    st->eof_in = true;
    if (st->finished) {
        return;
    }
    if (evbuffer_get_length(st->in) > 0) {
        stream_finish(st, SP_GRPC_INVALID_ARGUMENT,
                      "the request ends inside a message (%zu bytes of a truncated frame)",
                      evbuffer_get_length(st->in));
        return;
    }
    if (st->method == SP_GRPC_MODEL_STREAM_INFER) {
        stream_maybe_end(st);
        return;
    }
    if (!st->have_msg) {
        stream_finish(st, SP_GRPC_INVALID_ARGUMENT, "%s: the request has no message",
                      method_name(st->method));
        return;
    }
    uint8_t *msg = st->msg;
    st->msg = NULL;
    call_start(st, msg, st->msg_len);
    if (st->method == SP_GRPC_HEALTH_WATCH && !st->finished) {
        st->watch_msg = msg; /* asked again by tick_cb */
        st->watch_len = st->msg_len;
        return;
    }
    sp_free(msg);
}

/* --------------------------------------------------- nghttp2 callbacks */

static void
stream_free(gstream_t *st)
{
    gconn_t *c = st->c;
    while (st->calls) {
        call_cancel(st->calls);
    }
    if (st->prev) {
        st->prev->next = st->next;
    } else {
        c->streams = st->next;
    }
    if (st->next) {
        st->next->prev = st->prev;
    }
    c->buffered -= evbuffer_get_length(st->in);
    evbuffer_free(st->in);
    evbuffer_free(st->out);
    for (int i = 0; i < st->n_hdrs; i++) {
        sp_free((void *)st->hval[i].ptr);
    }
    sp_free(st->msg);
    sp_free(st->watch_msg);
    sp_free(st->watch_last);
    sp_free(st);
}

static int
on_begin_headers(nghttp2_session *h2, const nghttp2_frame *f, void *ud)
{
    gconn_t *c = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) {
        return 0;
    }
    gstream_t *st = sp_calloc(1, sizeof *st);
    if (st) {
        st->in = evbuffer_new();
        st->out = evbuffer_new();
    }
    if (st == NULL || st->in == NULL || st->out == NULL) {
        if (st) {
            if (st->in) evbuffer_free(st->in);
            if (st->out) evbuffer_free(st->out);
            sp_free(st);
        }
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* resets this stream */
    }
    st->c = c;
    st->id = f->hd.stream_id;
    st->method = -1;
    st->start_ns = sp_time_ns();
    st->next = c->streams;
    if (c->streams) {
        c->streams->prev = st;
    }
    c->streams = st;
    nghttp2_session_set_stream_user_data(h2, st->id, st);
    return 0;
}

static bool
name_is(const uint8_t *n, size_t nl, const char *s)
{
    return strlen(s) == nl && memcmp(n, s, nl) == 0;
}

static int
on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name, size_t nl,
          const uint8_t *value, size_t vl, uint8_t flags, void *ud)
{
    gconn_t *c = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) {
        return 0; /* trailers from the client carry nothing we use */
    }
    gstream_t *st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
    if (st == NULL || st->hdr_over) {
        return 0;
    }
    const sp_http_limits_t *lim = &c->gl->g->p.limits;
    st->hdr_bytes += nl + vl + 32; /* RFC 9113's header list size */
    if (st->hdr_bytes > lim->max_header_bytes) {
        st->hdr_over = true;
        return 0;
    }
    if (name_is(name, nl, ":method")) {
        st->is_post = vl == 4 && memcmp(value, "POST", 4) == 0;
    } else if (name_is(name, nl, ":path")) {
        st->method = method_find((const char *)value, vl);
    } else if (name_is(name, nl, "content-type")) {
        st->ctype_ok = vl >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                       (vl == 16 || value[16] == '+' || value[16] == ';');
    } else {
        for (int i = 0; i < N_PASS; i++) {
            if (name_is(name, nl, pass_headers[i])) {
                if (st->n_hdrs >= N_PASS || st->n_hdrs >= lim->max_headers) {
                    break;
                }
                char *v = sp_malloc(vl + 1);
                if (v == NULL) {
                    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
                }
                memcpy(v, value, vl);
                v[vl] = '\0';
                st->hname[st->n_hdrs] = sp_str_c(pass_headers[i]);
                st->hval[st->n_hdrs].ptr = v;
                st->hval[st->n_hdrs].len = vl;
                st->n_hdrs++;
                break;
            }
        }
    }
    return 0;
}

/* The request head is complete: check it before any message. */
static void
stream_head(gstream_t *st)
{
    const sp_http_limits_t *lim = &st->c->gl->g->p.limits;
    if (st->hdr_over) {
        stream_finish(st, SP_GRPC_RESOURCE_EXHAUSTED,
                      "the request headers are larger than %zu bytes (--max-header-bytes)",
                      lim->max_header_bytes);
    } else if (!st->is_post) {
        stream_finish(st, SP_GRPC_UNIMPLEMENTED, "gRPC calls are POST requests");
    } else if (st->method < 0) {
        stream_finish(st, SP_GRPC_UNIMPLEMENTED,
                      "unknown method: this server implements inference.GRPCInferenceService's "
                      "ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, "
                      "ModelInfer, ModelStreamInfer, ModelStatistics, RepositoryIndex, "
                      "RepositoryModelLoad and RepositoryModelUnload, and "
                      "grpc.health.v1.Health's Check and Watch");
    } else if (!st->ctype_ok) {
        stream_finish(st, SP_GRPC_INVALID_ARGUMENT, "content-type must be application/grpc");
    }
}

static int
on_frame_recv(nghttp2_session *h2, const nghttp2_frame *f, void *ud)
{
    gconn_t *c = ud;
    c->active_ns = sp_time_ns();
    if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) {
        return 0;
    }
    gstream_t *st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
    if (st == NULL) {
        return 0;
    }
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        stream_head(st);
    }
    if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        stream_eof(st);
    }
    return 0;
}

static int
on_data_chunk(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
              void *ud)
{
    gconn_t *c = ud;
    gstream_t *st = nghttp2_session_get_stream_user_data(h2, id);
    if (st == NULL || st->finished) {
        return 0; /* dropped; nghttp2 still credits the window */
    }
    size_t cap = max_message(c) * CONN_MAX_BUFFERED_FACTOR + 5;
    if (c->buffered + len > cap) {
        stream_finish(st, SP_GRPC_RESOURCE_EXHAUSTED,
                      "more than %zu request bytes buffered on this connection", cap);
        return 0;
    }
    evbuffer_add(st->in, data, len);
    c->buffered += len;
    stream_frame(st);
    return 0;
}

static int
on_frame_send(nghttp2_session *h2, const nghttp2_frame *f, void *ud)
{
    /* Our answer ended before the client finished sending (an error on a
     * large message): tell it to stop. */
    if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
        (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        gstream_t *st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
        if (st && !st->eof_in) {
            nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_NO_ERROR);
        }
    }
    return 0;
}

static int
on_stream_close(nghttp2_session *h2, int32_t id, uint32_t code, void *ud)
{
    gstream_t *st = nghttp2_session_get_stream_user_data(h2, id);
    if (st) {
        nghttp2_session_set_stream_user_data(h2, id, NULL);
        stream_free(st); /* cancels what still runs: the client went away */
    }
    return 0;
}

/* --------------------------------------------------------- connections */

static void
conn_free(gconn_t *c)
{
    sp_grpc_loop_t *gl = c->gl;
    while (c->streams) {
        if (c->h2) {
            nghttp2_session_set_stream_user_data(c->h2, c->streams->id, NULL);
        }
        stream_free(c->streams);
    }
    if (c->h2) {
        nghttp2_session_del(c->h2);
    }
    if (c->prev) {
        c->prev->next = c->next;
    } else {
        gl->conns = c->next;
    }
    if (c->next) {
        c->next->prev = c->prev;
    }
    if (c->flush_ev) {
        event_free(c->flush_ev);
    }
    if (c->bev) {
        bufferevent_free(c->bev);
    }
    atomic_fetch_sub(&gl->g->n_conns, 1);
    if (c->http) {
        sp_http_client_release(c->http, c->client);
    }
    sp_free(c);
}

#define ENTER(c) ((c)->nest++)
#define LEAVE(c)                                                                          \
    do {                                                                                  \
        if (--(c)->nest == 0 && (c)->dead) {                                              \
            conn_free(c);                                                                 \
        }                                                                                 \
    } while (0)

static void
conn_kill(gconn_t *c)
{
    c->dead = true;
    if (c->bev) {
        bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    }
}

/* Give nghttp2's output to the socket; close when neither side wants more. */
static void
flush(gconn_t *c)
{
    if (c->dead) {
        return;
    }
    for (;;) {
        const uint8_t *d;
        ssize_t n = nghttp2_session_mem_send(c->h2, &d);
        if (n < 0) {
            conn_kill(c);
            return;
        }
        if (n == 0) {
            break;
        }
        bufferevent_write(c->bev, d, (size_t)n);
    }
    if (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2) &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
        conn_kill(c);
    }
}

static void
flush_cb(evutil_socket_t fd, short what, void *arg)
{
    gconn_t *c = arg;
    ENTER(c);
    flush(c);
    LEAVE(c);
}

static void
read_cb(struct bufferevent *bev, void *arg)
{
    gconn_t *c = arg;
    ENTER(c);
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!c->dead && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1) {
            break;
        }
        ssize_t n = nghttp2_session_mem_recv(c->h2, v.iov_base, v.iov_len);
        if (n < 0) {
            /* A protocol error: nghttp2 queued a GOAWAY; send it, then close. */
            flush(c);
            conn_kill(c);
            break;
        }
        evbuffer_drain(in, (size_t)n);
    }
    flush(c);
    LEAVE(c);
}

static void
write_cb(struct bufferevent *bev, void *arg)
{
    gconn_t *c = arg;
    ENTER(c);
    flush(c);
    LEAVE(c);
}

static void
event_cb(struct bufferevent *bev, short what, void *arg)
{
    gconn_t *c = arg;
    ENTER(c);
    if (what & BEV_EVENT_CONNECTED) {
        c->tls_ok = true;
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        if (ssl) {
            sp_tls_peer_cn(ssl, c->client_cn, sizeof c->client_cn);
        }
    } else if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
        conn_kill(c);
    }
    LEAVE(c);
}

static int
alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
            unsigned int inlen, void *arg)
{
    /* gRPC is HTTP/2 only. */
    for (unsigned int i = 0; i + 3 <= inlen; i += 1u + in[i]) {
        if (in[i] == 2 && memcmp(in + i + 1, "h2", 2) == 0) {
            *out = in + i + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

static nghttp2_session *
session_new(gconn_t *c)
{
    nghttp2_session_callbacks *cb = NULL;
    nghttp2_option *opt = NULL;
    nghttp2_session *h2 = NULL;
    if (nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0) {
        goto done;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    const sp_http_limits_t *lim = &c->gl->g->p.limits;
    /* Our HPACK encoder's table stays small whatever the client offers;
     * SETTINGS floods and rapid resets (CVE-2023-44487) end the connection. */
    nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_stream_reset_rate_limit(opt, 1000, 100);
    if (nghttp2_session_server_new2(&h2, cb, c, opt) != 0) {
        h2 = NULL;
        goto done;
    }
    nghttp2_settings_entry s[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, SP_GRPC_MAX_STREAMS},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)lim->max_header_bytes},
    };
    if (nghttp2_submit_settings(h2, NGHTTP2_FLAG_NONE, s, sizeof s / sizeof s[0]) != 0 ||
        nghttp2_session_set_local_window_size(h2, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW) != 0) {
        nghttp2_session_del(h2);
        h2 = NULL;
    }
done:
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    return h2;
}

static void
accept_cb(struct evconnlistener *lst, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    sp_grpc_loop_t *gl = arg;
    sp_grpc_t *g = gl->g;
    if (atomic_load(&g->draining)) {
        close(fd);
        return;
    }
    /* One address's gRPC and HTTP connections share its per-client limits. */
    void *client = NULL;
    const char *why = NULL;
    sp_http_server_t *http = g->p.srv ? g->p.srv->http : NULL;
    if (http && sp_http_client_admit(http, sa, &client, &why) != 0) {
        SP_LOG_WARN("event=connection_refused port=grpc reason=%s", sp_log_str(why));
        close(fd);
        return;
    }
    if (atomic_fetch_add(&g->n_conns, 1) >= g->p.limits.max_connections) {
        atomic_fetch_sub(&g->n_conns, 1);
        sp_http_client_release(http, client);
        close(fd); /* over --max-connections (gRPC connections counted on their own) */
        return;
    }
    gconn_t *c = sp_calloc(1, sizeof *c);
    struct bufferevent *bev = NULL;
    if (c && g->tls) {
        SSL *ssl = sp_tls_ssl_new(g->tls);
        bev = ssl ? bufferevent_openssl_socket_new(sp_http_loop_base(gl->loop), fd, ssl,
                                                   BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE)
                  : NULL;
        if (bev) {
            bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
        }
    } else if (c) {
        bev = bufferevent_socket_new(sp_http_loop_base(gl->loop), fd, BEV_OPT_CLOSE_ON_FREE);
    }
    if (c == NULL || bev == NULL) {
        if (bev) {
            bufferevent_free(bev);
        } else {
            close(fd);
        }
        sp_free(c);
        atomic_fetch_sub(&g->n_conns, 1);
        sp_http_client_release(http, client);
        return;
    }
    c->http = http;
    c->client = client;
    c->gl = gl;
    c->bev = bev;
    c->tls = g->tls != NULL;
    c->start_ns = c->active_ns = sp_time_ns();
    c->next = gl->conns;
    if (gl->conns) {
        gl->conns->prev = c;
    }
    gl->conns = c;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, ntohs(in6->sin6_port));
    }
    c->flush_ev = event_new(sp_http_loop_base(gl->loop), -1, 0, flush_cb, c);
    c->h2 = c->flush_ev ? session_new(c) : NULL;
    if (c->h2 == NULL) {
        conn_free(c);
        return;
    }
    bufferevent_setcb(bev, read_cb, write_cb, event_cb, c);
    if (g->p.limits.write_timeout_ms > 0) {
        struct timeval wt = {g->p.limits.write_timeout_ms / 1000,
                             (g->p.limits.write_timeout_ms % 1000) * 1000};
        bufferevent_set_timeouts(bev, NULL, &wt);
    }
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    ENTER(c);
    flush(c); /* our SETTINGS */
    LEAVE(c);
}

/* Every TICK_MS on each loop: drain, deadlines, idle connections. */
static void
tick_cb(evutil_socket_t fd, short what, void *arg)
{
    sp_grpc_loop_t *gl = arg;
    sp_grpc_t *g = gl->g;
    const sp_http_limits_t *lim = &g->p.limits;
    int64_t now = sp_time_ns();
    bool draining = atomic_load(&g->draining);
    if (draining && gl->lst) {
        evconnlistener_free(gl->lst);
        gl->lst = NULL;
    }
    int64_t head_ns = (int64_t)lim->header_timeout_ms * 1000000;
    int64_t msg_ns = head_ns + (int64_t)lim->body_timeout_ms * 1000000;
    int64_t idle_ns = (int64_t)lim->idle_timeout_ms * 1000000;
    gconn_t *c = gl->conns;
    while (c) {
        gconn_t *next = c->next;
        ENTER(c);
        if (c->tls && !c->tls_ok && now - c->start_ns > head_ns) {
            conn_kill(c); /* the TLS handshake did not finish in time */
        }
        for (gstream_t *st = c->streams; st && !c->dead; st = st->next) {
            if (!st->finished && !st->dispatched && st->method != SP_GRPC_MODEL_STREAM_INFER &&
                now - st->start_ns > msg_ns) {
                stream_finish(st, SP_GRPC_DEADLINE_EXCEEDED,
                              "the request message did not arrive within %g s "
                              "(--header-timeout + --body-timeout)", (double)msg_ns / 1e9);
            }
            if (!st->finished && st->method == SP_GRPC_HEALTH_WATCH && st->watch_msg &&
                st->calls == NULL) {
                if (draining) {
                    stream_finish(st, SP_GRPC_UNAVAILABLE, "the server is shutting down");
                } else if (now >= st->watch_next_ns) {
                    st->watch_next_ns = now + (int64_t)WATCH_POLL_MS * 1000000;
                    call_start(st, st->watch_msg, st->watch_len);
                }
            }
        }
        if (!c->dead && (draining || (c->streams == NULL && now - c->active_ns > idle_ns)) &&
            !c->goaway) {
            /* Streams already open finish; no new ones. */
            c->goaway = true;
            nghttp2_submit_goaway(c->h2, NGHTTP2_FLAG_NONE,
                                  nghttp2_session_get_last_proc_stream_id(c->h2), NGHTTP2_NO_ERROR,
                                  NULL, 0);
        }
        if (!c->dead && c->goaway && c->streams == NULL) {
            flush(c);
            conn_kill(c);
        }
        flush(c);
        LEAVE(c);
        c = next;
    }
}

/* ---------------------------------------------------------------- API */

sp_status_t
sp_grpc_create(const sp_grpc_params_t *p, sp_grpc_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_grpc_t *g = sp_calloc(1, sizeof *g);
    if (g == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    g->p = *p;
    g->fd = -1;
    if (p->tls_cert && p->tls_cert[0]) {
        if (sp_tls_ctx_create(p->tls_cert, p->tls_key, p->tls_client_ca, &g->tls, err, err_len) !=
            SP_OK) {
            sp_grpc_destroy(g);
            return SP_ERR_INVALID;
        }
        SSL_CTX_set_alpn_select_cb(g->tls, alpn_select, NULL);
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", p->port);
    int gai = getaddrinfo(p->host, ps, &hints, &res);
    if (gai != 0) {
        sp_grpc_destroy(g);
        return sp_errf(err, err_len, SP_ERR_INVALID, "--host %s: %s", p->host, gai_strerror(gai));
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    }
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
        }
        freeaddrinfo(res);
        sp_grpc_destroy(g);
        return sp_errf(err, err_len, SP_ERR_IO, "gRPC: cannot listen on %s:%d: %s", p->host,
                       p->port, strerror(e));
    }
    freeaddrinfo(res);
    g->fd = fd;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    g->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *out = g;
    return SP_OK;
}

int
sp_grpc_port(const sp_grpc_t *g)
{
    return g ? g->port : 0;
}

bool
sp_grpc_tls(const sp_grpc_t *g)
{
    return g && g->tls;
}

sp_grpc_loop_t *
sp_grpc_loop_start(sp_grpc_t *g, sp_http_loop_t *loop)
{
    sp_grpc_loop_t *gl = sp_calloc(1, sizeof *gl);
    if (gl == NULL) {
        return NULL;
    }
    gl->g = g;
    gl->loop = loop;
    struct event_base *base = sp_http_loop_base(loop);
    int fd = dup(g->fd);
    gl->lst = fd >= 0 ? evconnlistener_new(base, accept_cb, gl,
                                           LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd)
                      : NULL;
    gl->tick = event_new(base, -1, EV_PERSIST, tick_cb, gl);
    if (gl->lst == NULL || gl->tick == NULL) {
        if (gl->lst == NULL && fd >= 0) {
            close(fd);
        }
        sp_grpc_loop_stop(gl);
        return NULL;
    }
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(gl->tick, &tv);
    return gl;
}

void
sp_grpc_loop_stop(sp_grpc_loop_t *gl)
{
    if (gl == NULL) {
        return;
    }
    while (gl->conns) {
        gl->conns->nest = 0;
        conn_free(gl->conns);
    }
    if (gl->lst) {
        evconnlistener_free(gl->lst);
    }
    if (gl->tick) {
        event_free(gl->tick);
    }
    sp_free(gl);
}

void
sp_grpc_stop_accepting(sp_grpc_t *g)
{
    if (g) {
        atomic_store(&g->draining, true);
    }
}

void
sp_grpc_destroy(sp_grpc_t *g)
{
    if (g == NULL) {
        return;
    }
    if (g->fd >= 0) {
        close(g->fd);
    }
    if (g->tls) {
        sp_tls_ctx_free(g->tls);
    }
    sp_free(g);
}
