/*
 * http.c - HTTP/1.1 connections on libevent loops, parsed by http-parser.
 *
 * One connection = one bufferevent, one http_parser, one timer and one
 * request slot (requests on a connection are answered in order, so pipelined
 * requests simply wait in the input buffer). States:
 *
 *   IDLE    waiting for a request's first byte (timer: header deadline for a
 *           fresh connection, idle timeout between keep-alive requests)
 *   HEAD    reading the request line and headers (timer: header deadline)
 *   BODY    reading the body (timer: body deadline)
 *   HANDLER a handler owns the request (no timer; reading goes on so that an
 *           EOF is seen at once, pipelined bytes pile up to a watermark)
 *   STREAM  the handler streams the answer
 *   FLUSH   the answer is queued; when the output drains the request is done
 *
 * Freeing a connection from inside one of its own callbacks (a handler that
 * aborts, an error while parsing) is deferred with a nesting counter: the
 * outermost entry point frees it on the way out.
 *
 * TLS connections use libevent's bufferevent_openssl over the socket, so
 * everything above sees decrypted bytes. They start in IDLE with the
 * handshake running underneath and the header deadline armed: the
 * handshake ends either with BEV_EVENT_CONNECTED (tls_ok; the client's CN
 * is read then) or with an error or that deadline, and the connection is
 * closed with one warning line. The OpenSSL side (contexts, error texts)
 * is in tls.c.
 */
#include "http/http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <http_parser.h>

#include "core/alloc.h"
#include "core/bucket.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "http/tls.h"

/* Extra response headers a handler may add (Retry-After, Content-Type of errors...). */
#define EXTRA_HDR_CAP 1024
/* Pipelined input kept while a request is being answered: reading pauses above it. */
#define PIPELINE_HIWAT (64u * 1024u)
#define READ_CHUNK (16u * 1024u) /* the most one recvmsg() of a plain connection takes */

/* Per-client (peer address) accounting: buckets of a hash table under one
 * mutex (accepts on all loops share it; an accept and a close each take it
 * once). An entry lives while its client holds sockets, and afterwards until
 * its rate bucket is full again (so closing everything does not reset the
 * rate); a sweep at most once a second frees the rest. */
#define CLIENT_BUCKETS 1024

typedef struct client {
    struct client *next;
    unsigned char addr[16];
    uint8_t alen;
    int conns;
    sp_bucket_t rate;    /* new connections it may still open now (burst = the rate) */
} client_t;

typedef enum cstate { C_IDLE, C_HEAD, C_BODY, C_HANDLER, C_STREAM, C_FLUSH } cstate_t;

typedef struct hdr {
    uint32_t name_off, name_len, val_off, val_len;
} hdr_t;

typedef struct conn conn_t;

struct sp_http_req {
    conn_t *conn;
    sp_http_method_t method;
    sp_str_t path, query, body;
    uint64_t id;
    void (*abort_fn)(sp_http_req_t *r, void *ud);
    void *abort_ud;
    char extra[EXTRA_HDR_CAP];
    size_t extra_len;
    int64_t start_ns;    /* dispatch time */
    void *user;          /* the server's per-request pointer (its tenant) */
    struct sp_trace *trace; /* its sampled trace record (api/trace.h), or NULL */
    int status;          /* of the response head written; 0 = none yet */
    bool dispatched;     /* handed to the handler and not yet reported done */
    char rid[SP_HTTP_RID_MAX + 1];
    char note[SP_HTTP_NOTE_MAX];
    size_t note_len;
};

struct conn {
    sp_http_loop_t *loop;
    struct bufferevent *bev;
    struct event *rev;   /* plain connections: our own read event (see plain_read_cb) */
    size_t read_hiwat;   /* plain: stop reading while this much input is buffered */
    bool read_on;        /* plain: reading wanted (before the watermark) */
    bool rev_added;      /* plain: rev is in the loop */
    int64_t rx_ns;       /* when the last read's bytes arrived (plain: the kernel's receive
                            time, SO_TIMESTAMPNS; TLS: when they were read) */
    int64_t arrival_ns;  /* rx_ns of the read that brought the current request's first bytes */
    struct event *timer;
    http_parser parser;
    cstate_t state;
    bool fresh;          /* no request seen yet on this connection */
    bool keep_alive;     /* the current request allows another after it */
    bool close_after;    /* close once the answer is written */
    bool http10;
    bool chunked_out;    /* streaming with chunked encoding */
    bool msg_complete;
    bool inflight;       /* counted in the server's in-flight requests */
    bool dead;           /* close requested while nested */
    bool tls;            /* accepted on a TLS listener */
    bool tls_ok;         /* its handshake completed */
    bool tls_err;        /* a TLS or socket error: no close_notify on close */
    int nest;
    int hdr_state;       /* 0 none, 1 in a field name, 2 in a value */
    int err_status;      /* set by a parser callback that rejected the request */
    const char *err_msg;
    char *head;          /* request line pieces and headers, cap = max_header_bytes */
    size_t head_len;
    size_t url_off, url_len;
    hdr_t *hdrs;
    int n_hdrs;
    char *body;
    size_t body_len, body_cap;
    int n_chunks;
    uint64_t chunk_left;     /* data bytes of the current chunk not yet seen */
    int crlf_seen;           /* 0..2: bytes of the CRLF after a chunk's data checked so far */
    bool crlf_pending;       /* that CRLF is (partly) still to come in the next read */
    const char *exec_end;    /* end of the bytes http_parser_execute is running over */
    /* The request head, scanned before the parser (head_scan): where the
     * scan is, and the request line's spaces and last bytes. */
    bool rl_done, head_done, prev_cr;
    int rl_spaces;
    size_t rl_len, line_len;
    char rl_tail[16];
    bool peer_eof;           /* the client shut its side: answer what it sent, then close */
    int64_t idle_since_ns;   /* when it last became idle (closing the oldest idle first) */
    struct client *client;   /* its peer address's entry (per-client limits), or NULL */
    sp_http_req_t req;
    conn_t *prev, *next;
    char peer[64];
    char client_cn[SP_HTTP_CN_MAX + 1]; /* verified client certificate's CN, or "" */
    /* A virtual request's connection (sp_http_vreq_*): no socket, no parser
     * input; the answer goes to the sink. NULL for real connections. */
    const sp_http_sink_t *sink;
    void *sink_ud;
};

struct sp_http_loop {
    sp_http_server_t *srv;
    int index;
    struct event_base *base;
    struct evconnlistener *listener;
    struct evconnlistener *tls_listener; /* the second (TLS) port, when there is one */
    int wake_fd;
    struct event *wake_ev;
    void (*wake_fn)(void *arg);
    void *wake_arg;
    void *user;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    atomic_bool stop_accepting;
    bool accepting_closed;
    conn_t *conns; /* all open connections of this loop */
    conn_t *vdead;           /* ended virtual requests, freed by vreap on the next turn */
    struct event *vreap;
};

struct sp_http_server {
    sp_http_server_params_t p;
    int port;
    int n_loops;
    sp_http_loop_t *loops;
    atomic_int_fast64_t inflight;
    atomic_int_fast64_t n_conns;
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t status_count[600]; /* responses written, by status code */
    atomic_bool draining;
    http_parser_settings settings;
    /* TLS: the context new connections get. Swapped by a reload on another
     * thread, so accept reads it (and takes its SSL from it) under tls_mu. */
    pthread_mutex_t tls_mu;
    struct ssl_ctx_st *tls_ctx;           /* NULL: no TLS */
    char *tls_cert, *tls_key, *tls_ca;    /* copies of the paths, for reloads */
    bool tls_main;                        /* the main listener speaks TLS */
    int tls_port;                         /* the port speaking TLS; 0 = none */
    pthread_mutex_t cl_mu;                /* the per-client table */
    client_t *cl_tab[CLIENT_BUCKETS];
    int64_t cl_sweep_ns;
};

sp_http_limits_t
sp_http_default_limits(void)
{
    sp_http_limits_t l = {
        .max_url_bytes = 8 * 1024,
        .max_header_bytes = 16 * 1024,
        .max_headers = 100,
        .max_body_bytes = 8u << 20,
        .max_chunks = 65536,
        .max_connections = 1024,
        .max_conns_per_client = 256,
        .conn_rate_per_client = 1000,
        .header_timeout_ms = 10000,
        .body_timeout_ms = 30000,
        .idle_timeout_ms = 60000,
        .write_timeout_ms = 30000,
        .max_output_bytes = 4u << 20,
    };
    return l;
}

sp_http_server_params_t
sp_http_default_server_params(void)
{
    sp_http_server_params_t p;
    memset(&p, 0, sizeof p);
    p.limits = sp_http_default_limits();
    p.n_loops = 1;
    return p;
}

const char *
sp_http_status_text(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return status < 300 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

static size_t
default_error_fmt(int status, const char *message, char *buf, size_t cap)
{
    /* message comes from this file or http-parser: no quotes or control bytes. */
    int n = snprintf(buf, cap, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                     "\"code\":null}}", message,
                     status >= 500 ? "server_error" : "invalid_request_error");
    return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

/* ------------------------------------------------------------------ timers */

static void
timer_arm(conn_t *c, int ms)
{
    if (ms <= 0) {
        evtimer_del(c->timer);
        return;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

/* ------------------------------------------------------ per-client limits */

/* Free the entries of clients with no socket and a full bucket (cl_mu held). */
static void
client_sweep(sp_http_server_t *s, int64_t now)
{
    const sp_http_limits_t *l = &s->p.limits;
    for (int b = 0; b < CLIENT_BUCKETS; b++) {
        client_t **pp = &s->cl_tab[b];
        while (*pp) {
            client_t *e = *pp;
            sp_bucket_refill(&e->rate, l->conn_rate_per_client, l->conn_rate_per_client, now);
            if (e->conns == 0 && (l->conn_rate_per_client <= 0 ||
                                  e->rate.tokens >= (double)l->conn_rate_per_client)) {
                *pp = e->next;
                sp_free(e);
            } else {
                pp = &e->next;
            }
        }
    }
}

/* Count a new connection from sa against its client's limits: 0 and *out
 * set (NULL when no limit is on), or 429 with *why saying which limit. */
static int
client_admit(sp_http_server_t *s, const struct sockaddr *sa, client_t **out, const char **why)
{
    const sp_http_limits_t *l = &s->p.limits;
    *out = NULL;
    if (l->max_conns_per_client <= 0 && l->conn_rate_per_client <= 0) {
        return 0;
    }
    unsigned char addr[16];
    uint8_t alen;
    if (sa->sa_family == AF_INET) {
        alen = 4;
        memcpy(addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        alen = 16;
        memcpy(addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    } else {
        return 0;
    }
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < alen; i++) {
        h = (h ^ addr[i]) * 16777619u;
    }
    int64_t now = sp_time_ns();
    int rc = 0;
    pthread_mutex_lock(&s->cl_mu);
    if (now - s->cl_sweep_ns > 1000000000LL) {
        client_sweep(s, now);
        s->cl_sweep_ns = now;
    }
    client_t **head = &s->cl_tab[h % CLIENT_BUCKETS];
    client_t *e = *head;
    while (e && !(e->alen == alen && memcmp(e->addr, addr, alen) == 0)) {
        e = e->next;
    }
    if (e == NULL) {
        e = sp_calloc(1, sizeof *e);
        if (e == NULL) {
            pthread_mutex_unlock(&s->cl_mu);
            return 0; /* no memory for the entry: not limited, rather than refused */
        }
        memcpy(e->addr, addr, alen);
        e->alen = alen;
        sp_bucket_fill(&e->rate, l->conn_rate_per_client, now);
        e->next = *head;
        *head = e;
    }
    if (l->max_conns_per_client > 0 && e->conns >= l->max_conns_per_client) {
        rc = 429;
        *why = "too many connections from this client (--max-conns-per-client)";
    } else if (l->conn_rate_per_client > 0) {
        sp_bucket_refill(&e->rate, l->conn_rate_per_client, l->conn_rate_per_client, now);
        if (e->rate.tokens < 1.0) {
            rc = 429;
            *why = "too many new connections from this client (--conn-rate-per-client)";
        } else {
            e->rate.tokens -= 1.0;
        }
    }
    if (rc == 0) {
        e->conns++;
        *out = e;
    }
    pthread_mutex_unlock(&s->cl_mu);
    return rc;
}

static void
client_release(sp_http_server_t *s, client_t *e)
{
    if (e != NULL) {
        pthread_mutex_lock(&s->cl_mu);
        e->conns--;
        pthread_mutex_unlock(&s->cl_mu);
    }
}

int
sp_http_client_admit(sp_http_server_t *s, const struct sockaddr *sa, void **token,
                     const char **why)
{
    client_t *e = NULL;
    int rc = client_admit(s, sa, &e, why);
    *token = e;
    return rc;
}

void
sp_http_client_release(sp_http_server_t *s, void *token)
{
    client_release(s, token);
}

/* --------------------------------------------------------- connection life */

static void conn_free(conn_t *c);

/* Reading. A TLS connection reads through its bufferevent. A plain one reads
 * through its own event and recvmsg() (plain_read_cb), because libevent's socket
 * bufferevent asks the kernel how much is readable (ioctl FIONREAD) before
 * every read: one more system call per request, which on a VM whose system
 * calls cost microseconds was about 6% of a small request's CPU. The
 * bufferevent still holds both buffers and does all the writing. */
static void
conn_read_update(conn_t *c)
{
    bool want = c->read_on && evbuffer_get_length(bufferevent_get_input(c->bev)) < c->read_hiwat;
    if (want != c->rev_added) {
        if (want) {
            event_add(c->rev, NULL);
        } else {
            event_del(c->rev);
        }
        c->rev_added = want;
    }
}

static void
conn_read(conn_t *c, bool on)
{
    if (c->rev == NULL) {
        if (on) {
            bufferevent_enable(c->bev, EV_READ);
        } else {
            bufferevent_disable(c->bev, EV_READ);
        }
        return;
    }
    c->read_on = on;
    conn_read_update(c);
}

/* Pause reading while at least hiwat bytes of input wait (pipelining). */
static void
conn_read_limit(conn_t *c, size_t hiwat)
{
    if (c->rev == NULL) {
        bufferevent_setwatermark(c->bev, EV_READ, 0, hiwat);
        return;
    }
    c->read_hiwat = hiwat;
    conn_read_update(c);
}

static void
conn_close(conn_t *c)
{
    if (c->nest > 0) {
        c->dead = true;
        if (c->bev) {
            conn_read(c, false);
            bufferevent_disable(c->bev, EV_WRITE);
        }
        return;
    }
    conn_free(c);
}

/* The handler's request dies with the connection: tell its owner first. */
static void report_done(conn_t *c, bool aborted);

static void
conn_abort_owner(conn_t *c)
{
    if ((c->state == C_HANDLER || c->state == C_STREAM) && c->req.abort_fn) {
        void (*fn)(sp_http_req_t *, void *) = c->req.abort_fn;
        c->req.abort_fn = NULL;
        fn(&c->req, c->req.abort_ud);
    }
    if (c->state == C_HANDLER || c->state == C_STREAM) {
        report_done(c, true);
    }
}

static void
conn_free(conn_t *c)
{
    sp_http_loop_t *L = c->loop;
    sp_http_server_t *s = L->srv;
    c->nest++; /* the abort callback may call back into this connection */
    conn_abort_owner(c);
    if (c->inflight) {
        atomic_fetch_sub(&s->inflight, 1);
        c->inflight = false;
    }
    if (c->prev) {
        c->prev->next = c->next;
    } else {
        L->conns = c->next;
    }
    if (c->next) {
        c->next->prev = c->prev;
    }
    if (c->bev) {
        /* A clean end of a TLS connection says so (close_notify), so that a
         * client reading to EOF knows nothing was cut; not after an error or
         * with output still queued (an abort). */
        if (c->tls && c->tls_ok && !c->tls_err &&
            evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
            sp_tls_close_notify(bufferevent_openssl_get_ssl(c->bev));
        }
        if (c->rev) {
            event_free(c->rev); /* before the bufferevent closes the socket */
        }
        bufferevent_free(c->bev);
    }
    if (c->timer) {
        event_free(c->timer);
    }
    atomic_fetch_sub(&s->n_conns, 1);
    client_release(s, c->client);
    sp_free(c->head);
    sp_free(c->hdrs);
    sp_free(c->body);
    sp_free(c);
}

#define ENTER(c) ((c)->nest++)
#define LEAVE(c)                                                                \
    do {                                                                        \
        if (--(c)->nest == 0 && (c)->dead) {                                    \
            conn_free(c);                                                       \
        }                                                                       \
    } while (0)

/* ------------------------------------------------------------- responses */

static void
write_head(conn_t *c, int status, const char *ctype, bool has_len, size_t len)
{
    sp_http_server_t *s = c->loop->srv;
    if (atomic_load(&s->draining)) {
        c->close_after = true;
    }
    bool close = c->close_after || !c->keep_alive;
    if (close) {
        c->close_after = true;
    }
    if (status >= 100 && status < 600) {
        atomic_fetch_add_explicit(&s->status_count[status], 1, memory_order_relaxed);
    }
    c->req.status = status;
    /* One formatted block and one evbuffer_add: this is on every response's path. */
    char head[512];
    int n = snprintf(head, sizeof head, "HTTP/1.%d %d %s\r\nServer: sampan\r\n%s%s%s",
                     c->http10 ? 0 : 1, status, sp_http_status_text(status),
                     ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof head) {
        n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nServer: sampan\r\n", status,
                     sp_http_status_text(status));
    }
    /* 1xx, 204 and 304 have no body by definition and must not send a
     * length (RFC 9110 8.6); a CORS preflight is answered 204. */
    if (has_len && status >= 200 && status != 204 && status != 304) {
        n += snprintf(head + n, sizeof head - (size_t)n, "Content-Length: %zu\r\n", len);
    }
    if (close) {
        n += snprintf(head + n, sizeof head - (size_t)n, "Connection: close\r\n");
    } else if (c->http10) {
        n += snprintf(head + n, sizeof head - (size_t)n, "Connection: keep-alive\r\n");
    }
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (c->req.extra_len == 0) {
        n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
        evbuffer_add(out, head, (size_t)n);
        return;
    }
    evbuffer_add(out, head, (size_t)n);
    evbuffer_add(out, c->req.extra, c->req.extra_len);
    evbuffer_add(out, "\r\n", 2);
}

/* The answer is queued: wait for the output to drain (write_cb finishes it). */
static void
report_done(conn_t *c, bool aborted)
{
    if (!c->req.dispatched) {
        return;
    }
    c->req.dispatched = false;
    sp_http_server_t *s = c->loop->srv;
    if (s->p.on_done) {
        s->p.on_done(&c->req, aborted, s->p.handler_ud);
    }
}

/* Send what the output holds. A plain socket is written at once: an answer of
 * a few KB almost always fits its empty send buffer, and writing now saves,
 * per answer, the two epoll_ctl calls that enabling and disabling the write
 * event cost and a turn of the loop. What does not fit (or any error, which
 * the bufferevent's own write then meets and reports) goes by EV_WRITE. TLS
 * has to go through OpenSSL's bufferevent. EV_WRITE is disabled again once an
 * answer is out (write_cb), so queued bytes wait for this call. */
static void
conn_push(conn_t *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (!c->tls && evbuffer_get_length(out) > 0) {
        /* A socket bufferevent freezes the front of its output so that only its
         * write callback drains it (an evbuffer_write here would fail, and the
         * answer would go the slow way: measured, 2 epoll_ctl per request).
         * This is that callback's own write, done now: unfreeze, write,
         * freeze again. */
        evbuffer_unfreeze(out, 1);
        (void)evbuffer_write(out, bufferevent_getfd(c->bev));
        evbuffer_freeze(out, 1);
    }
    if (evbuffer_get_length(out) > 0) {
        bufferevent_enable(c->bev, EV_WRITE);
    }
}

static void
conn_flush(conn_t *c)
{
    report_done(c, false);
    c->state = C_FLUSH;
    c->req.abort_fn = NULL;
    timer_arm(c, 0);
    conn_push(c);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
        /* All written: finish in write_cb, deferred, so that a pipelined request
         * answered at once cannot recurse through here. */
        bufferevent_trigger(c->bev, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    }
}

/* An error the HTTP layer answers itself; the connection closes afterwards. */
static void
conn_error(conn_t *c, int status, const char *message)
{
    char body[512];
    sp_http_server_t *s = c->loop->srv;
    size_t n = s->p.error_fmt ? s->p.error_fmt(status, message, body, sizeof body)
                              : default_error_fmt(status, message, body, sizeof body);
    c->close_after = true;
    c->req.extra_len = 0;
    write_head(c, status, "application/json", true, n);
    evbuffer_add(bufferevent_get_output(c->bev), body, n);
    conn_read(c, false);
    conn_flush(c);
}

/* ------------------------------------------------------- virtual requests */

static void
vreq_free(conn_t *c)
{
    sp_free(c->head);
    sp_free(c->hdrs);
    sp_free(c);
}

static void
vreap_cb(evutil_socket_t fd, short what, void *arg)
{
    sp_http_loop_t *L = arg;
    while (L->vdead) {
        conn_t *c = L->vdead;
        L->vdead = c->next;
        vreq_free(c);
    }
}

/* Done with a virtual request: the access log and the in-flight count now;
 * the memory on the loop's next turn, because handlers (as with a real
 * connection, whose request outlives its answer) may still read the request
 * after answering it, until they return to the loop. */
static void
vreq_finish(conn_t *c, bool aborted)
{
    sp_http_loop_t *L = c->loop;
    sp_http_server_t *s = L->srv;
    report_done(c, aborted);
    atomic_fetch_sub(&s->inflight, 1);
    c->state = C_FLUSH;
    c->req.abort_fn = NULL;
    if (L->vreap == NULL) {
        L->vreap = evtimer_new(L->base, vreap_cb, L);
    }
    c->next = L->vdead;
    L->vdead = c;
    if (L->vreap) {
        event_active(L->vreap, EV_TIMEOUT, 0);
    } /* else: freed when the loop ends */
}

static void
vreq_status(conn_t *c, int status)
{
    if (status >= 100 && status < 600) {
        atomic_fetch_add_explicit(&c->loop->srv->status_count[status], 1, memory_order_relaxed);
    }
    c->req.status = status;
}

static void
vreq_respond(conn_t *c, int status, const char *ctype, const char *body, size_t len)
{
    vreq_status(c, status);
    c->state = C_FLUSH;
    c->sink->respond(c->sink_ud, status, ctype, c->req.extra, c->req.extra_len, body, len);
    vreq_finish(c, false);
}

static void
vreq_stream_start(conn_t *c, int status, const char *ctype)
{
    vreq_status(c, status);
    c->state = C_STREAM;
    c->sink->stream_start(c->sink_ud, status, ctype, c->req.extra, c->req.extra_len);
}

sp_http_req_t *
sp_http_vreq_create(sp_http_loop_t *loop, const sp_http_vreq_params_t *p,
                    const sp_http_sink_t *sink, void *sink_ud)
{
    /* One block holds the path, then "name\0value\0" per header, then the
     * body and its NUL: the accessors read them as they read a parsed head. */
    size_t cap = p->path_len + 1 + p->body_len + 1;
    for (int i = 0; i < p->n_hdrs; i++) {
        cap += p->hdr_names[i].len + p->hdr_values[i].len + 2;
    }
    conn_t *c = sp_calloc(1, sizeof *c);
    char *head = sp_malloc(cap);
    hdr_t *hdrs = p->n_hdrs ? sp_calloc((size_t)p->n_hdrs, sizeof *hdrs) : NULL;
    if (c == NULL || head == NULL || (p->n_hdrs && hdrs == NULL)) {
        sp_free(c);
        sp_free(head);
        sp_free(hdrs);
        return NULL;
    }
    size_t o = 0;
    memcpy(head, p->path, p->path_len);
    head[p->path_len] = '\0';
    o = p->path_len + 1;
    for (int i = 0; i < p->n_hdrs; i++) {
        hdrs[i].name_off = (uint32_t)o;
        hdrs[i].name_len = (uint32_t)p->hdr_names[i].len;
        memcpy(head + o, p->hdr_names[i].ptr, p->hdr_names[i].len);
        o += p->hdr_names[i].len;
        head[o++] = '\0';
        hdrs[i].val_off = (uint32_t)o;
        hdrs[i].val_len = (uint32_t)p->hdr_values[i].len;
        memcpy(head + o, p->hdr_values[i].ptr, p->hdr_values[i].len);
        o += p->hdr_values[i].len;
        head[o++] = '\0';
    }
    char *body = head + o;
    if (p->body_len) {
        memcpy(body, p->body, p->body_len);
    }
    body[p->body_len] = '\0';
    c->loop = loop;
    c->head = head;
    c->hdrs = hdrs;
    c->n_hdrs = p->n_hdrs;
    c->tls = p->tls;
    c->sink = sink;
    c->sink_ud = sink_ud;
    c->parser.method = p->method == SP_HTTP_GET ? HTTP_GET : HTTP_POST;
    snprintf(c->peer, sizeof c->peer, "%s", p->peer ? p->peer : "");
    snprintf(c->client_cn, sizeof c->client_cn, "%s", p->client_cn ? p->client_cn : "");
    sp_http_req_t *r = &c->req;
    r->conn = c;
    r->method = p->method == SP_HTTP_GET ? SP_HTTP_GET : SP_HTTP_POST;
    r->path.ptr = head;
    r->path.len = p->path_len;
    r->query.ptr = head + p->path_len;
    r->query.len = 0;
    r->body.ptr = body;
    r->body.len = p->body_len;
    c->state = C_IDLE;
    return r;
}

void
sp_http_vreq_run(sp_http_req_t *r)
{
    conn_t *c = r->conn;
    sp_http_server_t *s = c->loop->srv;
    r->id = atomic_fetch_add(&s->next_id, 1) + 1;
    r->start_ns = sp_time_ns();
    r->dispatched = true;
    c->state = C_HANDLER;
    atomic_fetch_add(&s->inflight, 1);
    s->p.handler(r, s->p.handler_ud);
}

void
sp_http_vreq_cancel(sp_http_req_t *r)
{
    conn_t *c = r->conn;
    if (c->state == C_IDLE) { /* created, never run */
        vreq_free(c);
        return;
    }
    if (c->state == C_FLUSH) {
        return; /* already ended (its answer was given) */
    }
    if (c->req.abort_fn) {
        void (*fn)(sp_http_req_t *, void *) = c->req.abort_fn;
        c->req.abort_fn = NULL;
        fn(r, c->req.abort_ud);
    }
    vreq_finish(c, true);
}

void
sp_http_add_header(sp_http_req_t *r, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value);
    if (strpbrk(name, "\r\n:") || strpbrk(value, "\r\n")) {
        return;
    }
    if (r->extra_len + nl + vl + 4 > sizeof r->extra) {
        return;
    }
    char *p = r->extra + r->extra_len;
    memcpy(p, name, nl);
    p[nl] = ':';
    p[nl + 1] = ' ';
    memcpy(p + nl + 2, value, vl);
    p[nl + 2 + vl] = '\r';
    p[nl + 3 + vl] = '\n';
    r->extra_len += nl + vl + 4;
}

void
sp_http_respond(sp_http_req_t *r, int status, const char *content_type, const char *body,
                size_t len)
{
    conn_t *c = r->conn;
    if (c->state != C_HANDLER) {
        return;
    }
    if (c->sink) {
        vreq_respond(c, status, content_type, body, len);
        return;
    }
    write_head(c, status, content_type, true, len);
    if (r->method != SP_HTTP_HEAD && len > 0 && status >= 200 && status != 204 && status != 304) {
        evbuffer_add(bufferevent_get_output(c->bev), body, len);
    }
    conn_flush(c);
}

void
sp_http_stream_start(sp_http_req_t *r, int status, const char *content_type)
{
    conn_t *c = r->conn;
    if (c->state != C_HANDLER) {
        return;
    }
    if (c->sink) {
        vreq_stream_start(c, status, content_type);
        return;
    }
    c->chunked_out = !c->http10;
    if (c->http10) {
        c->close_after = true; /* the end of the body is the end of the connection */
    } else {
        sp_http_add_header(r, "Transfer-Encoding", "chunked");
    }
    write_head(c, status, content_type, false, 0);
    c->state = C_STREAM;
    bufferevent_enable(c->bev, EV_WRITE);
}

int
sp_http_stream_write(sp_http_req_t *r, const char *data, size_t len)
{
    conn_t *c = r->conn;
    if (c->state != C_STREAM) {
        return -1;
    }
    if (c->sink) {
        return len == 0 ? 0 : c->sink->stream_write(c->sink_ud, data, len);
    }
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(out) > c->loop->srv->p.limits.max_output_bytes) {
        return -1;
    }
    if (len == 0 || r->method == SP_HTTP_HEAD) {
        return 0;
    }
    if (c->chunked_out) {
        evbuffer_add_printf(out, "%zx\r\n", len);
        evbuffer_add(out, data, len);
        evbuffer_add(out, "\r\n", 2);
    } else {
        evbuffer_add(out, data, len);
    }
    return 0;
}

void
sp_http_stream_end(sp_http_req_t *r)
{
    conn_t *c = r->conn;
    if (c->state != C_STREAM) {
        return;
    }
    if (c->sink) {
        c->sink->stream_end(c->sink_ud);
        vreq_finish(c, false);
        return;
    }
    if (c->chunked_out && r->method != SP_HTTP_HEAD) {
        evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
    }
    conn_flush(c);
}

void
sp_http_abort(sp_http_req_t *r)
{
    conn_t *c = r->conn;
    c->req.abort_fn = NULL; /* the owner is the one aborting */
    if (c->sink) {
        c->sink->aborted(c->sink_ud);
        vreq_finish(c, true);
        return;
    }
    conn_close(c);
}

size_t
sp_http_req_output_pending(const sp_http_req_t *r)
{
    if (r->conn->sink) {
        return r->conn->sink->pending(r->conn->sink_ud);
    }
    return r->conn->bev ? evbuffer_get_length(bufferevent_get_output(r->conn->bev)) : 0;
}

void
sp_http_req_on_abort(sp_http_req_t *r, void (*fn)(sp_http_req_t *r, void *ud), void *ud)
{
    r->abort_fn = fn;
    r->abort_ud = ud;
}

/* -------------------------------------------------------------- accessors */

void
sp_http_req_set_rid(sp_http_req_t *r, const char *rid, size_t len)
{
    if (len > SP_HTTP_RID_MAX) {
        len = SP_HTTP_RID_MAX;
    }
    memcpy(r->rid, rid, len);
    r->rid[len] = '\0';
}

const char *sp_http_req_rid(const sp_http_req_t *r) { return r->rid; }
void sp_http_req_set_user(sp_http_req_t *r, void *p) { r->user = p; }
void *sp_http_req_user(const sp_http_req_t *r) { return r->user; }
void sp_http_req_set_trace(sp_http_req_t *r, struct sp_trace *t) { r->trace = t; }
struct sp_trace *sp_http_req_trace(const sp_http_req_t *r) { return r->trace; }
int64_t sp_http_req_start_ns(const sp_http_req_t *r) { return r->start_ns; }
int sp_http_req_status(const sp_http_req_t *r) { return r->status; }
const char *sp_http_req_note(const sp_http_req_t *r) { return r->note; }

sp_str_t
sp_http_req_added_headers(const sp_http_req_t *r)
{
    sp_str_t s = {r->extra, r->extra_len};
    return s;
}

void
sp_http_req_annotate(sp_http_req_t *r, const char *fmt, ...)
{
    if (r->note_len + 2 >= sizeof r->note) {
        return;
    }
    if (r->note_len > 0) {
        r->note[r->note_len++] = ' ';
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->note + r->note_len, sizeof r->note - r->note_len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        r->note[--r->note_len] = '\0';
        return;
    }
    r->note_len += (size_t)n < sizeof r->note - r->note_len ? (size_t)n
                                                            : sizeof r->note - r->note_len - 1;
}

uint64_t
sp_http_server_status_count(const sp_http_server_t *s, int status)
{
    return status >= 100 && status < 600
               ? atomic_load_explicit(&((sp_http_server_t *)s)->status_count[status],
                                      memory_order_relaxed)
               : 0;
}

sp_http_method_t sp_http_req_method(const sp_http_req_t *r) { return r->method; }
sp_str_t sp_http_req_path(const sp_http_req_t *r) { return r->path; }
sp_str_t sp_http_req_query(const sp_http_req_t *r) { return r->query; }
sp_str_t sp_http_req_body(const sp_http_req_t *r) { return r->body; }
sp_http_loop_t *sp_http_req_loop(const sp_http_req_t *r) { return r->conn->loop; }
uint64_t sp_http_req_id(const sp_http_req_t *r) { return r->id; }
const char *sp_http_req_peer(const sp_http_req_t *r) { return r->conn->peer; }
bool sp_http_req_tls(const sp_http_req_t *r) { return r->conn->tls; }
const char *sp_http_req_client_cn(const sp_http_req_t *r) { return r->conn->client_cn; }

const char *
sp_http_req_method_str(const sp_http_req_t *r)
{
    return http_method_str((enum http_method)r->conn->parser.method);
}

sp_str_t
sp_http_req_header(const sp_http_req_t *r, const char *name)
{
    const conn_t *c = r->conn;
    size_t n = strlen(name);
    for (int i = 0; i < c->n_hdrs; i++) {
        const hdr_t *h = &c->hdrs[i];
        if (h->name_len == n && strncasecmp(c->head + h->name_off, name, n) == 0) {
            sp_str_t v = {c->head + h->val_off, h->val_len};
            /* trim the optional whitespace around a field value */
            while (v.len && (v.ptr[v.len - 1] == ' ' || v.ptr[v.len - 1] == '\t')) {
                v.len--;
            }
            return v;
        }
    }
    sp_str_t none = {NULL, 0};
    return none;
}

/* --------------------------------------------------------- parser callbacks */

static int
reject(conn_t *c, int status, const char *msg)
{
    c->err_status = status;
    c->err_msg = msg;
    return -1;
}

static int
head_append(conn_t *c, const char *at, size_t len)
{
    if (len > c->loop->srv->p.limits.max_header_bytes - c->head_len) {
        return -1;
    }
    memcpy(c->head + c->head_len, at, len);
    c->head_len += len;
    return 0;
}

static int
on_message_begin(http_parser *p)
{
    conn_t *c = p->data;
    c->head_len = 0;
    c->url_off = c->url_len = 0;
    c->n_hdrs = 0;
    c->hdr_state = 0;
    c->body_len = 0;
    c->n_chunks = 0;
    c->chunk_left = 0;
    c->crlf_seen = 0;
    c->crlf_pending = false;
    return 0;
}

static int
on_url(http_parser *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (c->url_len == 0) {
        c->url_off = c->head_len;
    }
    if (c->url_len + len > c->loop->srv->p.limits.max_url_bytes) {
        return reject(c, 414, "request target too long");
    }
    if (head_append(c, at, len) != 0) {
        return reject(c, 431, "request header section too large");
    }
    c->url_len += len;
    return 0;
}

/* A byte of a token (RFC 9110 5.6.2): what a field name is made of. */
static bool
tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch != 0 && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static int
on_header_field(http_parser *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    /* http-parser takes "Name : v" with the space as part of the name; RFC
     * 9112 5.1 says no whitespace between the name and the colon (400). */
    for (size_t i = 0; i < len; i++) {
        if (!tchar((unsigned char)at[i])) {
            return reject(c, 400, "invalid byte in a header field name");
        }
    }
    if (c->hdr_state != 1) {
        if (c->n_hdrs >= c->loop->srv->p.limits.max_headers) {
            return reject(c, 431, "too many header fields");
        }
        hdr_t *h = &c->hdrs[c->n_hdrs++];
        h->name_off = (uint32_t)c->head_len;
        h->name_len = 0;
        h->val_off = (uint32_t)c->head_len;
        h->val_len = 0;
        c->hdr_state = 1;
    }
    if (head_append(c, at, len) != 0) {
        return reject(c, 431, "request header section too large");
    }
    c->hdrs[c->n_hdrs - 1].name_len += (uint32_t)len;
    return 0;
}

static int
on_header_value(http_parser *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (c->n_hdrs == 0) {
        return reject(c, 400, "header value without a name");
    }
    hdr_t *h = &c->hdrs[c->n_hdrs - 1];
    if (c->hdr_state != 2) {
        h->val_off = (uint32_t)c->head_len;
        c->hdr_state = 2;
    }
    if (head_append(c, at, len) != 0) {
        return reject(c, 431, "request header section too large");
    }
    h->val_len += (uint32_t)len;
    return 0;
}

static int
on_headers_complete(http_parser *p)
{
    conn_t *c = p->data;
    const sp_http_limits_t *lim = &c->loop->srv->p.limits;
    c->keep_alive = http_should_keep_alive(p) != 0;
    c->http10 = p->http_major == 1 && p->http_minor == 0;
    if (p->http_major != 1) {
        return reject(c, 505, "only HTTP/1.0 and HTTP/1.1 are supported");
    }
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > lim->max_body_bytes) {
        return reject(c, 413, "request body too large");
    }
    /* A client that waits for 100 Continue gets it only when the body fits. */
    sp_str_t expect = sp_http_req_header(&c->req, "expect");
    if (expect.ptr && expect.len == 12 && strncasecmp(expect.ptr, "100-continue", 12) == 0 &&
        !c->http10) {
        evbuffer_add(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        conn_push(c);
    }
    c->state = C_BODY;
    timer_arm(c, lim->body_timeout_ms);
    return 0;
}

static int
on_body(http_parser *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    size_t max = c->loop->srv->p.limits.max_body_bytes;
    if (len > max - c->body_len) {
        return reject(c, 413, "request body too large");
    }
    if ((p->flags & F_CHUNKED) && len > 0) {
        c->chunk_left = len < c->chunk_left ? c->chunk_left - len : 0;
        if (c->chunk_left == 0) {
            /* The chunk's data ends here: CRLF must follow (RFC 9112 7.1),
             * which http-parser skips unchecked. Check what this read holds;
             * process_input checks the rest at the start of the next. */
            const char *e = at + len;
            c->crlf_seen = 0;
            while (c->crlf_seen < 2 && e < c->exec_end) {
                if (*e++ != "\r\n"[c->crlf_seen]) {
                    return reject(c, 400, "chunk data not followed by CRLF");
                }
                c->crlf_seen++;
            }
            c->crlf_pending = c->crlf_seen < 2;
        }
    }
    if (c->body_len + len > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + len) {
            cap *= 2;
        }
        if (cap > max) {
            cap = max;
        }
        char *nb = sp_realloc(c->body, cap + 1);
        if (nb == NULL) {
            return reject(c, 503, "out of memory");
        }
        c->body = nb;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, at, len);
    c->body_len += len;
    return 0;
}

static int
on_chunk_header(http_parser *p)
{
    conn_t *c = p->data;
    if (++c->n_chunks > c->loop->srv->p.limits.max_chunks) {
        return reject(c, 400, "too many chunks in the request body");
    }
    /* A chunk that cannot fit is refused now, not after waiting for it. */
    if (p->content_length > c->loop->srv->p.limits.max_body_bytes - c->body_len) {
        return reject(c, 413, "request body too large");
    }
    c->chunk_left = p->content_length;
    return 0;
}

static int
on_message_complete(http_parser *p)
{
    conn_t *c = p->data;
    c->msg_complete = true;
    http_parser_pause(p, 1); /* one request at a time: the next waits in the buffer */
    return 0;
}

/* ---------------------------------------------------------------- dispatch */

static sp_http_method_t
map_method(unsigned m)
{
    switch (m) {
    case HTTP_GET: return SP_HTTP_GET;
    case HTTP_HEAD: return SP_HTTP_HEAD;
    case HTTP_POST: return SP_HTTP_POST;
    case HTTP_PUT: return SP_HTTP_PUT;
    case HTTP_DELETE: return SP_HTTP_DELETE;
    case HTTP_OPTIONS: return SP_HTTP_OPTIONS;
    case HTTP_PATCH: return SP_HTTP_PATCH;
    default: return SP_HTTP_OTHER;
    }
}

static void
dispatch(conn_t *c)
{
    sp_http_server_t *s = c->loop->srv;
    sp_http_req_t *r = &c->req;
    timer_arm(c, 0);
    c->fresh = false;
    r->method = map_method(c->parser.method);
    r->id = atomic_fetch_add(&s->next_id, 1) + 1;
    r->abort_fn = NULL;
    r->abort_ud = NULL;
    r->extra_len = 0;
    r->start_ns = c->arrival_ns; /* set when its first bytes were parsed (process_input) */
    r->user = NULL;
    r->trace = NULL;
    r->status = 0;
    r->rid[0] = '\0';
    r->note_len = 0;
    r->note[0] = '\0';
    const char *url = c->head + c->url_off;
    size_t url_len = c->url_len;
    /* The absolute form "http://host[:port]/path?q" (RFC 9112 3.2.2, which
     * a server must accept) is routed by its path; its authority replaces
     * Host, which no route reads. */
    size_t skip = url_len >= 7 && strncasecmp(url, "http://", 7) == 0    ? 7
                  : url_len >= 8 && strncasecmp(url, "https://", 8) == 0 ? 8
                                                                          : 0;
    bool no_path = false;
    if (skip > 0) {
        size_t k = skip;
        while (k < url_len && url[k] != '/' && url[k] != '?') {
            k++;
        }
        if (k == skip) {
            conn_error(c, 400, "absolute request target without a host");
            return;
        }
        no_path = k == url_len || url[k] == '?'; /* "http://h" and "http://h?q": path "/" */
        url += k;
        url_len -= k;
    }
    const char *q = memchr(url, '?', url_len);
    size_t plen = q ? (size_t)(q - url) : url_len;
    r->path.ptr = no_path ? "/" : url;
    r->path.len = no_path ? 1 : plen;
    r->query.ptr = q ? q + 1 : url + plen;
    r->query.len = q ? url_len - plen - 1 : 0;
    if (c->body) {
        c->body[c->body_len] = '\0'; /* handy for parsers that want a C string */
    }
    r->body.ptr = c->body ? c->body : "";
    r->body.len = c->body_len;
    if (!no_path && (url_len == 0 || url[0] != '/') && !(url_len == 1 && url[0] == '*')) {
        conn_error(c, 400, "request target must be an absolute path");
        return;
    }
    c->state = C_HANDLER;
    r->dispatched = true;
    c->inflight = true;
    atomic_fetch_add(&s->inflight, 1);
    /* Pipelined bytes may arrive while the handler works; cap what is kept. */
    conn_read_limit(c, PIPELINE_HIWAT);
    s->p.handler(r, s->p.handler_ud);
}

/* The request line's protocol (RFC 9112 3): "HTTP/" DIGIT "." DIGIT, which
 * http-parser checks only in its strict build (it takes "HXYZ/1.1"). A line
 * with fewer than two spaces has no protocol part: the parser's answer
 * (HTTP/0.9: 505) stands. */
static bool
rl_version_ok(const conn_t *c)
{
    size_t n = c->rl_len < sizeof c->rl_tail ? c->rl_len : sizeof c->rl_tail;
    const char *t = c->rl_tail + sizeof c->rl_tail - n;
    if (c->rl_spaces < 2) {
        return true;
    }
    if (n < 9) {
        return false;
    }
    t += n - 9;
    return t[0] == ' ' && memcmp(t + 1, "HTTP/", 5) == 0 && t[6] >= '0' && t[6] <= '9' &&
           t[7] == '.' && t[8] >= '0' && t[8] <= '9';
}

/* Scan the bytes of the request head before the parser sees them, for what
 * http-parser (non-strict build) lets through: the request line's protocol
 * (rl_version_ok), and a bare CR (RFC 9112 2.2) where it takes any byte for
 * the LF after a CR (it accepts "...\r\n\rX" as the end of the head). NULL
 * when fine so far, else 400's message. */
static const char *
head_scan(conn_t *c, const char *p, size_t n)
{
    for (size_t i = 0; i < n && !c->head_done; i++) {
        char ch = p[i];
        if (c->prev_cr && ch != '\n') {
            return "bare CR in the request head";
        }
        if (ch == '\r') {
            c->prev_cr = true;
            continue;
        }
        c->prev_cr = false;
        if (ch == '\n') {
            if (!c->rl_done) {
                if (c->rl_len > 0) { /* an empty line before the request is skipped */
                    c->rl_done = true;
                    if (!rl_version_ok(c)) {
                        return "the request line must end with the protocol HTTP/x.y";
                    }
                }
            } else if (c->line_len == 0) {
                c->head_done = true;
            }
            c->line_len = 0;
            continue;
        }
        c->line_len++;
        if (!c->rl_done) {
            if (ch == ' ') {
                c->rl_spaces++;
            }
            memmove(c->rl_tail, c->rl_tail + 1, sizeof c->rl_tail - 1);
            c->rl_tail[sizeof c->rl_tail - 1] = ch;
            c->rl_len++;
        }
    }
    return NULL;
}

/* Parse whatever is buffered while the connection is between requests. */
static void
process_input(conn_t *c)
{
    sp_http_server_t *s = c->loop->srv;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (!c->dead && (c->state == C_IDLE || c->state == C_HEAD || c->state == C_BODY)) {
        if (evbuffer_get_length(in) == 0) {
            return;
        }
        if (c->state == C_IDLE) {
            c->state = C_HEAD;
            c->arrival_ns = c->rx_ns > 0 ? c->rx_ns : sp_time_ns();
            c->err_status = 0;
            c->rl_done = false;
            c->head_done = false;
            c->prev_cr = false;
            c->rl_spaces = 0;
            c->rl_len = 0;
            c->line_len = 0;
            timer_arm(c, s->p.limits.header_timeout_ms);
        }
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1) {
            return;
        }
        const char *bad = c->state == C_HEAD && !c->head_done
                              ? head_scan(c, v.iov_base, v.iov_len)
                              : NULL;
        if (bad != NULL) {
            conn_error(c, 400, bad);
            return;
        }
        if (c->state == C_BODY && c->crlf_pending) {
            /* The rest of the CRLF after a chunk's data (see on_body). */
            const char *b = v.iov_base;
            for (size_t k = 0; c->crlf_seen < 2 && k < v.iov_len; k++, c->crlf_seen++) {
                if (b[k] != "\r\n"[c->crlf_seen]) {
                    conn_error(c, 400, "chunk data not followed by CRLF");
                    return;
                }
            }
            c->crlf_pending = c->crlf_seen < 2;
        }
        c->exec_end = (const char *)v.iov_base + v.iov_len;
        size_t used = http_parser_execute(&c->parser, &s->settings, v.iov_base, v.iov_len);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        char last = used > 0 ? ((const char *)v.iov_base)[used - 1] : '\0'; /* before the drain */
        evbuffer_drain(in, used);
        if (c->msg_complete && (c->parser.flags & F_CHUNKED) && last != '\n') {
            /* The CRLF ending a chunked body's trailer section: http-parser
             * takes any byte after its CR for the LF. */
            c->msg_complete = false;
            conn_error(c, 400, "chunked body not ended by CRLF");
            return;
        }
        if (c->msg_complete) {
            c->msg_complete = false;
            http_parser_pause(&c->parser, 0);
            dispatch(c);
            continue;
        }
        if (e != HPE_OK || used < v.iov_len) {
            int st = c->err_status ? c->err_status : e == HPE_HEADER_OVERFLOW ? 431 : 400;
            const char *msg = c->err_msg ? c->err_msg : http_errno_description(e);
            conn_error(c, st, msg);
            return;
        }
    }
}

/* ------------------------------------------------------ libevent callbacks */

static void
read_cb(struct bufferevent *bev, void *arg)
{
    conn_t *c = arg;
    ENTER(c);
    c->rx_ns = sp_time_ns(); /* TLS: no kernel timestamp of the plaintext */
    process_input(c);
    LEAVE(c);
}

/* Pipelined bytes that reached OpenSSL while reading was paused at the
 * watermark (see sp_tls_read_buffered): libevent would not look at them
 * until the client sends more, so move them to the input now. */
static void
tls_take_buffered(conn_t *c)
{
    struct ssl_st *ssl = bufferevent_openssl_get_ssl(c->bev);
    struct evbuffer *in = bufferevent_get_input(c->bev);
    char buf[16384];
    size_t n;
    while ((n = sp_tls_read_buffered(ssl, buf, sizeof buf)) > 0) {
        evbuffer_add(in, buf, n);
    }
}

static void
write_cb(struct bufferevent *bev, void *arg)
{
    conn_t *c = arg;
    if (c->state != C_FLUSH || evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
        return;
    }
    ENTER(c);
    sp_http_server_t *s = c->loop->srv;
    if (c->inflight) {
        atomic_fetch_sub(&s->inflight, 1);
        c->inflight = false;
    }
    if (c->close_after || atomic_load(&s->draining)) {
        conn_close(c);
    } else if (c->peer_eof) {
        /* Half-closed: serve what is buffered; nothing more will come. */
        c->state = C_IDLE;
        c->chunked_out = false;
        process_input(c);
        if (!c->dead && (c->state == C_IDLE || c->state == C_HEAD || c->state == C_BODY)) {
            conn_close(c);
        }
    } else {
        c->state = C_IDLE;
        c->idle_since_ns = sp_time_ns();
        c->chunked_out = false;
        if (!c->tls) {
            bufferevent_disable(c->bev, EV_WRITE); /* the next answer goes by conn_push */
        }
        conn_read_limit(c, s->p.limits.max_header_bytes + 65536);
        conn_read(c, true);
        timer_arm(c, s->p.limits.idle_timeout_ms);
        if (c->tls) {
            tls_take_buffered(c);
        }
        process_input(c); /* a pipelined request may already be here */
    }
    LEAVE(c);
}

/* Plain HTTP on the TLS port: OpenSSL found "GET " where a ClientHello
 * belongs. Answer 400 in plain HTTP, which is what `curl http://` to this
 * port then shows, instead of a bare reset. */
static void
tls_plain_reply(conn_t *c)
{
    sp_http_server_t *s = c->loop->srv;
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd < 0) {
        return;
    }
    /* Read what the client sent first: closing a socket with unread input
     * sends a reset, which can destroy the answer before it is read. */
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
    }
    static const char msg[] = "plain HTTP request sent to the HTTPS port";
    char body[512], out[768];
    size_t n = s->p.error_fmt ? s->p.error_fmt(400, msg, body, sizeof body)
                              : default_error_fmt(400, msg, body, sizeof body);
    int hn = snprintf(out, sizeof out,
                      "HTTP/1.1 400 Bad Request\r\nServer: sampan\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n%.*s", n, (int)n, body);
    if (hn > 0 && (size_t)hn < sizeof out) {
        ssize_t wr = send(fd, out, (size_t)hn, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)wr;
        atomic_fetch_add_explicit(&s->status_count[400], 1, memory_order_relaxed);
    }
}

/* The handshake failed: say why once (rate-limited by event name). */
static void
tls_handshake_failed(conn_t *c, short what)
{
    c->tls_err = true;
    /* libevent keeps up to three errors of the failed call; some carry no
     * reason text (libevent 2.1.12 with OpenSSL 3 adds a bare 1), so take
     * the first that has one. */
    unsigned long e, first = 0;
    while ((e = bufferevent_get_openssl_error(c->bev)) != 0) {
        if (first == 0 || (!sp_tls_error_known(first) && sp_tls_error_known(e))) {
            first = e;
        }
    }
    char why[256];
    if (first != 0) {
        sp_tls_error_text(first, bufferevent_openssl_get_ssl(c->bev), why, sizeof why);
        if (sp_tls_error_is_http(first)) {
            tls_plain_reply(c);
        }
    } else if (what & BEV_EVENT_TIMEOUT) {
        snprintf(why, sizeof why, "write timeout");
    } else if (what & BEV_EVENT_EOF) {
        /* Closed during the handshake without a TLS error: a TCP probe
         * (load balancer, port scan), not worth a warning. */
        SP_LOG_DEBUG("event=tls_closed_before_handshake peer=%s", sp_log_str(c->peer));
        return;
    } else {
        int err = EVUTIL_SOCKET_ERROR();
        snprintf(why, sizeof why, "%s", err ? strerror(err) : "connection error");
    }
    SP_LOG_WARN("event=tls_handshake_failed peer=%s error=%s", sp_log_str(c->peer),
                sp_log_str(why));
}

static void
event_cb(struct bufferevent *bev, short what, void *arg)
{
    conn_t *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        /* TLS handshake done: from here on an ordinary connection (its
         * header deadline, armed at accept, still runs). */
        c->tls_ok = true;
        sp_tls_peer_cn(bufferevent_openssl_get_ssl(bev), c->client_cn, sizeof c->client_cn);
        return;
    }
    ENTER(c);
    if (c->tls && !c->tls_ok) {
        tls_handshake_failed(c, what);
        conn_close(c);
    } else if (!c->tls && (what & BEV_EVENT_EOF) &&
               (c->state == C_HANDLER || c->state == C_STREAM || c->state == C_FLUSH)) {
        /* The client shut its write side (shutdown(SHUT_WR)) after sending a
         * request: answer it, and any complete request pipelined behind it,
         * then close (write_cb, which a flushing connection always has
         * coming). A FIN cannot tell a half-close from a full
         * close; a client that is really gone is seen when writing to it
         * fails (a stream's next write), so an unstreamed answer runs to its
         * end. (Not over TLS: libevent stops a TLS connection's I/O at its
         * EOF.) */
        c->peer_eof = true;
    } else {
        if (what & (BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
            c->tls_err = true;
        }
        conn_close(c);
    }
    LEAVE(c);
}

/* When the bytes of a read reached the kernel, in sp_time_ns() time: the
 * socket's receive timestamp (SO_TIMESTAMPNS, realtime, moved onto the
 * monotonic clock), else now. A request's latency thus includes the time it
 * waited in the socket while the loop was busy, which the server's clock
 * cannot see otherwise (measured: a closed loop's clients saw a 2.8 ms p99
 * where the server's own timing said 1.0-1.7 ms). A clock step can move
 * realtime; a timestamp from the future or over a second old is not used. */
static int64_t
kernel_rx_ns(struct msghdr *mh)
{
    int64_t now = sp_time_ns();
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm != NULL; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_TIMESTAMPNS ||
            cm->cmsg_len < CMSG_LEN(sizeof(struct timespec))) {
            continue;
        }
        struct timespec ts, rt;
        memcpy(&ts, CMSG_DATA(cm), sizeof ts);
        clock_gettime(CLOCK_REALTIME, &rt);
        int64_t age = ((int64_t)rt.tv_sec - (int64_t)ts.tv_sec) * 1000000000LL +
                      ((int64_t)rt.tv_nsec - (int64_t)ts.tv_nsec);
        return age >= 0 && age < 1000000000LL ? now - age : now;
    }
    return now;
}

/* A plain connection's socket is readable: one recvmsg() into the input buffer
 * (what the watermark leaves room for, at most READ_CHUNK), then parse. An
 * end of file or an error ends reading and goes to event_cb, as a socket
 * bufferevent's would. */
static void
plain_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    conn_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t have = evbuffer_get_length(in);
    size_t room = have < c->read_hiwat ? c->read_hiwat - have : 0;
    if (room == 0) {
        conn_read_update(c);
        return;
    }
    if (room > READ_CHUNK) {
        room = READ_CHUNK;
    }
    /* A socket bufferevent freezes its input's end for its own reads only;
     * it never reads this one, so open the end for the length of ours. */
    struct evbuffer_iovec v;
    ssize_t n;
    evbuffer_unfreeze(in, 0);
    if (evbuffer_reserve_space(in, (ev_ssize_t)room, &v, 1) < 1) {
        n = -1;
        errno = ENOMEM;
    } else {
        struct iovec iov = {v.iov_base, v.iov_len < room ? v.iov_len : room};
        union {
            char buf[CMSG_SPACE(sizeof(struct timespec))];
            struct cmsghdr align;
        } ctl;
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                            .msg_controllen = sizeof ctl.buf};
        n = recvmsg(fd, &mh, 0);
        if (n > 0) {
            v.iov_len = (size_t)n;
            evbuffer_commit_space(in, &v, 1);
            c->rx_ns = kernel_rx_ns(&mh);
        }
    }
    evbuffer_freeze(in, 0);
    if (n > 0) {
        ENTER(c);
        process_input(c);
        if (!c->dead) {
            conn_read_update(c);
        }
        LEAVE(c);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return;
    }
    c->read_on = false;
    conn_read_update(c);
    event_cb(c->bev, (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)), c);
}

static void
timer_cb(evutil_socket_t fd, short what, void *arg)
{
    conn_t *c = arg;
    ENTER(c);
    switch (c->state) {
    case C_HEAD:
        conn_error(c, 408, "request head not received in time");
        break;
    case C_BODY:
        conn_error(c, 408, "request body not received in time");
        break;
    case C_IDLE:
        if (c->tls && !c->tls_ok) {
            c->tls_err = true;
            SP_LOG_WARN("event=tls_handshake_failed peer=%s error=timeout",
                        sp_log_str(c->peer));
        }
        conn_close(c);
        break;
    default:
        break;
    }
    LEAVE(c);
}

/* Refuse a connection at accept: a short answer (plain HTTP only: a TLS
 * client cannot read one before its handshake), then close. */
static void
refuse_conn(sp_http_server_t *s, evutil_socket_t fd, bool tls, int status, const char *message)
{
    if (!tls) {
        char body[256], out[512];
        size_t n = s->p.error_fmt ? s->p.error_fmt(status, message, body, sizeof body)
                                  : default_error_fmt(status, message, body, sizeof body);
        int hn = snprintf(out, sizeof out,
                          "HTTP/1.1 %d %s\r\nServer: sampan\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%.*s",
                          status, sp_http_status_text(status), n, (int)n, body);
        if (hn > 0 && (size_t)hn < sizeof out) {
            ssize_t wr = send(fd, out, (size_t)hn, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)wr;
        }
    }
    close(fd);
}

/* At the connection cap: close this loop's connection that has waited
 * longest with no request in progress (an idle keep-alive connection, or
 * one that has sent nothing yet), so that a new client is served rather than
 * refused. Other loops' connections belong to their threads. */
static bool
close_oldest_idle(sp_http_loop_t *L)
{
    conn_t *old = NULL;
    for (conn_t *c = L->conns; c != NULL; c = c->next) {
        if (c->state == C_IDLE && c->nest == 0 && !c->dead &&
            evbuffer_get_length(bufferevent_get_input(c->bev)) == 0 &&
            (old == NULL || c->idle_since_ns < old->idle_since_ns)) {
            old = c;
        }
    }
    if (old == NULL) {
        return false;
    }
    SP_LOG_DEBUG("event=idle_connection_closed peer=%s reason=connection_cap",
                 sp_log_str(old->peer));
    conn_close(old);
    return true;
}

static void
accept_conn(sp_http_loop_t *L, evutil_socket_t fd, struct sockaddr *sa, bool tls)
{
    sp_http_server_t *s = L->srv;
    if (atomic_load(&s->draining)) {
        refuse_conn(s, fd, tls, 503, "the server is shutting down");
        return;
    }
    client_t *cl = NULL;
    const char *why = NULL;
    if (client_admit(s, sa, &cl, &why) != 0) {
        char ip[INET6_ADDRSTRLEN] = "?";
        inet_ntop(sa->sa_family,
                  sa->sa_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)sa)->sin6_addr
                                            : (const void *)&((struct sockaddr_in *)sa)->sin_addr,
                  ip, sizeof ip);
        SP_LOG_WARN("event=connection_refused peer=%s reason=%s", sp_log_str(ip), sp_log_str(why));
        refuse_conn(s, fd, tls, 429, why);
        return;
    }
    if (atomic_load(&s->n_conns) >= s->p.limits.max_connections && !close_oldest_idle(L)) {
        client_release(s, cl);
        refuse_conn(s, fd, tls, 503, "too many connections");
        return;
    }
    conn_t *c = sp_calloc(1, sizeof *c);
    char *head = sp_malloc(s->p.limits.max_header_bytes);
    hdr_t *hdrs = sp_calloc((size_t)s->p.limits.max_headers, sizeof(hdr_t));
    struct bufferevent *bev = NULL;
    if (tls) {
        pthread_mutex_lock(&s->tls_mu);
        struct ssl_st *ssl = sp_tls_ssl_new(s->tls_ctx);
        pthread_mutex_unlock(&s->tls_mu);
        /* With CLOSE_ON_FREE the bufferevent owns the SSL and the socket;
         * when it cannot be made, libevent (2.1.9 and later) has freed the
         * SSL but not the socket. */
        bev = ssl ? bufferevent_openssl_socket_new(L->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                   BEV_OPT_CLOSE_ON_FREE)
                  : NULL;
        if (bev) {
            /* A client closing without close_notify is an EOF, not an error. */
            bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
        }
    } else {
        bev = bufferevent_socket_new(L->base, fd, BEV_OPT_CLOSE_ON_FREE);
    }
    struct event *tm = c ? evtimer_new(L->base, timer_cb, c) : NULL;
    struct event *rev = c && !tls ? event_new(L->base, fd, EV_READ | EV_PERSIST, plain_read_cb, c)
                                  : NULL;
    if (!c || !head || !hdrs || !bev || !tm || (!tls && !rev)) {
        if (rev) {
            event_free(rev);
        }
        if (bev) {
            bufferevent_free(bev);
        } else {
            close(fd);
        }
        if (tm) {
            event_free(tm);
        }
        sp_free(c);
        sp_free(head);
        sp_free(hdrs);
        client_release(s, cl);
        return;
    }
    atomic_fetch_add(&s->n_conns, 1);
    c->client = cl;
    c->idle_since_ns = sp_time_ns();
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!tls) {
        /* Receive timestamps: a request's latency starts when it reached the
         * kernel (kernel_rx_ns). Without them, when it was read. */
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    }
    c->loop = L;
    c->bev = bev;
    c->rev = rev;
    c->timer = tm;
    c->head = head;
    c->hdrs = hdrs;
    c->fresh = true;
    c->tls = tls;
    c->req.conn = c;
    c->state = C_IDLE;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        char ip[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, ntohs(in6->sin6_port));
    }
    c->next = L->conns;
    if (L->conns) {
        L->conns->prev = c;
    }
    L->conns = c;
    bufferevent_setcb(bev, tls ? read_cb : NULL, write_cb, event_cb, c);
    if (s->p.limits.write_timeout_ms > 0) {
        struct timeval wt = {s->p.limits.write_timeout_ms / 1000,
                             (s->p.limits.write_timeout_ms % 1000) * 1000};
        bufferevent_set_timeouts(bev, NULL, &wt);
    }
    conn_read_limit(c, s->p.limits.max_header_bytes + 65536);
    conn_read(c, true);
    /* A fresh connection must start its request (and a TLS one finish its
     * handshake) within the header deadline. */
    timer_arm(c, s->p.limits.header_timeout_ms);
}

static void
accept_plain_cb(struct evconnlistener *lst, evutil_socket_t fd, struct sockaddr *sa, int salen,
                void *arg)
{
    accept_conn(arg, fd, sa, false);
}

static void
accept_tls_cb(struct evconnlistener *lst, evutil_socket_t fd, struct sockaddr *sa, int salen,
              void *arg)
{
    accept_conn(arg, fd, sa, true);
}

static void
reenable_cb(evutil_socket_t fd, short what, void *arg)
{
    sp_http_loop_t *L = arg;
    /* Either listener may have backed off; enabling a live one is harmless. */
    if (L->listener) { /* closed meanwhile by a drain */
        evconnlistener_enable(L->listener);
    }
    if (L->tls_listener) {
        evconnlistener_enable(L->tls_listener);
    }
}

static void
accept_error_cb(struct evconnlistener *lst, void *arg)
{
    int e = EVUTIL_SOCKET_ERROR();
    SP_LOG_WARN("event=accept_error error=%s", sp_log_str(evutil_socket_error_to_string(e)));
    /* EMFILE and friends: back off instead of spinning on the ready socket. */
    if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        evconnlistener_disable(lst);
        sp_http_loop_t *L = arg;
        struct timeval tv = {0, 100000};
        event_base_once(L->base, -1, EV_TIMEOUT, reenable_cb, L, &tv);
    }
}

/* --------------------------------------------------------------- the loops */

static void
close_listener(sp_http_loop_t *L)
{
    if (L->listener) {
        evconnlistener_free(L->listener);
        L->listener = NULL;
    }
    if (L->tls_listener) {
        evconnlistener_free(L->tls_listener);
        L->tls_listener = NULL;
    }
}

static void
wake_cb(evutil_socket_t fd, short what, void *arg)
{
    sp_http_loop_t *L = arg;
    uint64_t v;
    ssize_t rd = read(L->wake_fd, &v, sizeof v);
    (void)rd;
    if (atomic_load(&L->stop)) {
        event_base_loopbreak(L->base);
        return;
    }
    if (atomic_load(&L->stop_accepting) && !L->accepting_closed) {
        L->accepting_closed = true;
        close_listener(L);
        /* Idle keep-alive connections would only receive 503s from now on. */
        conn_t *c = L->conns;
        while (c) {
            conn_t *next = c->next;
            if (c->state == C_IDLE) {
                conn_close(c);
            }
            c = next;
        }
    }
    if (L->wake_fn) {
        L->wake_fn(L->wake_arg);
    }
}

void
sp_http_loop_wake(sp_http_loop_t *L)
{
    uint64_t one = 1;
    ssize_t wr = write(L->wake_fd, &one, sizeof one);
    (void)wr; /* a full counter still wakes the loop */
}

struct event_base *sp_http_loop_base(sp_http_loop_t *L) { return L->base; }
void *sp_http_loop_user(sp_http_loop_t *L) { return L->user; }

void
sp_http_loop_set_wake_cb(sp_http_loop_t *L, void (*fn)(void *arg), void *arg)
{
    L->wake_arg = arg;
    L->wake_fn = fn;
}

static void *
loop_main(void *arg)
{
    sp_http_loop_t *L = arg;
    sp_http_server_t *s = L->srv;
    event_base_dispatch(L->base);
    /* Shutdown: abort what is still open on this loop, on its own thread. */
    close_listener(L);
    while (L->conns) {
        conn_t *c = L->conns;
        c->nest = 0;
        conn_free(c);
    }
    if (s->p.loop_fini) {
        s->p.loop_fini(L, L->user, s->p.handler_ud);
    }
    vreap_cb(-1, 0, L); /* virtual requests ended on the last turn or by loop_fini */
    if (L->vreap) {
        event_free(L->vreap);
        L->vreap = NULL;
    }
    return NULL;
}

static int
bind_listener(sp_http_server_t *s, sp_http_loop_t *L, const char *host, int port, bool tls,
              struct evconnlistener **out, char *err, size_t err_len)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &res);
    if (gai != 0) {
        sp_errf(err, err_len, SP_ERR_INVALID, "--host %s: %s", host, gai_strerror(gai));
        return -1;
    }
    unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC | LEV_OPT_REUSEABLE;
    if (s->n_loops > 1) {
        flags |= LEV_OPT_REUSEABLE_PORT;
    }
    *out = evconnlistener_new_bind(L->base, tls ? accept_tls_cb : accept_plain_cb, L, flags, 1024,
                                   res->ai_addr, (int)res->ai_addrlen);
    int e = errno;
    freeaddrinfo(res);
    if (*out == NULL) {
        sp_errf(err, err_len, SP_ERR_IO, "cannot listen on %s:%d: %s", host, port, strerror(e));
        return -1;
    }
    evconnlistener_set_error_cb(*out, accept_error_cb);
    return 0;
}

static int
listener_port(struct evconnlistener *lst)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(evconnlistener_get_fd(lst), (struct sockaddr *)&ss, &sl);
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static bool
set_str(const char *v)
{
    return v != NULL && v[0] != '\0';
}

sp_status_t
sp_http_tls_check(const char *cert, const char *key, const char *client_ca, char *err,
                  size_t err_len)
{
    struct ssl_ctx_st *ctx = NULL;
    sp_status_t st = sp_tls_ctx_create(cert, key, client_ca, &ctx, err, err_len);
    sp_tls_ctx_free(ctx);
    return st;
}

sp_status_t
sp_http_server_create(const sp_http_server_params_t *p, const char *host, int port,
                      sp_http_server_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (p->handler == NULL || p->n_loops < 1 || p->n_loops > 64) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "http: a handler and 1..64 loops are required");
    }
    const sp_http_limits_t *l = &p->limits;
    if (l->max_header_bytes < 256 || l->max_header_bytes > (64u << 20) || l->max_headers < 1 ||
        l->max_url_bytes < 16 || l->max_connections < 1 || l->max_chunks < 1 ||
        l->max_conns_per_client < 0 || l->conn_rate_per_client < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "http: limits out of range");
    }
    bool tls = set_str(p->tls_cert);
    if (!tls && (set_str(p->tls_key) || set_str(p->tls_client_ca) || p->tls_port != 0)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "--tls-key, --tls-client-ca and --tls-port need --tls-cert");
    }
    if (p->tls_port < 0 || p->tls_port > 65535 || (p->tls_port != 0 && p->tls_port == port)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "--tls-port %d: must be another port than --port", p->tls_port);
    }
    sp_http_server_t *s = sp_calloc(1, sizeof *s);
    if (s == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "http: out of memory");
    }
    pthread_mutex_init(&s->tls_mu, NULL);
    pthread_mutex_init(&s->cl_mu, NULL);
    s->p = *p;
    /* The caller's strings are borrowed: keep our own copies (or none). */
    s->p.tls_cert = s->p.tls_key = s->p.tls_client_ca = NULL;
    s->n_loops = p->n_loops;
    sp_status_t st = SP_ERR_IO;
    http_parser_settings_init(&s->settings);
    s->settings.on_message_begin = on_message_begin;
    s->settings.on_url = on_url;
    s->settings.on_header_field = on_header_field;
    s->settings.on_header_value = on_header_value;
    s->settings.on_headers_complete = on_headers_complete;
    s->settings.on_body = on_body;
    s->settings.on_chunk_header = on_chunk_header;
    s->settings.on_message_complete = on_message_complete;
    /* http-parser's own cap (process-wide) sits just above ours, so ours speaks first. */
    http_parser_set_max_header_size((uint32_t)(l->max_header_bytes + 1024));
    s->loops = sp_calloc((size_t)s->n_loops, sizeof *s->loops);
    if (s->loops == NULL) {
        pthread_mutex_destroy(&s->tls_mu);
        pthread_mutex_destroy(&s->cl_mu);
        sp_free(s);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "http: out of memory");
    }
    for (int i = 0; i < s->n_loops; i++) {
        s->loops[i].wake_fd = -1;
    }
    if (tls) {
        const char *ca = set_str(p->tls_client_ca) ? p->tls_client_ca : "";
        s->tls_cert = sp_strndup(p->tls_cert, strlen(p->tls_cert));
        s->tls_key = sp_strndup(p->tls_key ? p->tls_key : "", p->tls_key ? strlen(p->tls_key) : 0);
        s->tls_ca = sp_strndup(ca, strlen(ca));
        if (s->tls_cert == NULL || s->tls_key == NULL || s->tls_ca == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "http: out of memory");
            goto fail;
        }
        st = sp_tls_ctx_create(s->tls_cert, s->tls_key, s->tls_ca, &s->tls_ctx, err, err_len);
        if (st != SP_OK) {
            goto fail;
        }
        st = SP_ERR_IO;
        s->tls_main = p->tls_port == 0;
        s->tls_port = p->tls_port;
    }
    for (int i = 0; i < s->n_loops; i++) {
        sp_http_loop_t *L = &s->loops[i];
        L->srv = s;
        L->index = i;
        L->base = event_base_new();
        L->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (L->base == NULL || L->wake_fd < 0) {
            sp_errf(err, err_len, SP_ERR_IO, "http: cannot create event loop: %s", strerror(errno));
            goto fail;
        }
        L->wake_ev = event_new(L->base, L->wake_fd, EV_READ | EV_PERSIST, wake_cb, L);
        if (L->wake_ev == NULL || event_add(L->wake_ev, NULL) != 0) {
            sp_errf(err, err_len, SP_ERR_IO, "http: cannot create event loop");
            goto fail;
        }
        if (bind_listener(s, L, host, i == 0 ? port : s->port, s->tls_main, &L->listener, err,
                          err_len) != 0) {
            goto fail;
        }
        if (i == 0) {
            s->port = listener_port(L->listener);
            if (s->tls_main) {
                s->tls_port = s->port;
            } else if (s->tls_port == s->port) {
                /* --port 0 drew the TLS port: with SO_REUSEPORT both binds
                 * would succeed and share connections. */
                sp_errf(err, err_len, SP_ERR_IO, "--tls-port %d: the same port as --port",
                        s->tls_port);
                goto fail;
            }
        }
        if (tls && !s->tls_main &&
            bind_listener(s, L, host, s->tls_port, true, &L->tls_listener, err, err_len) != 0) {
            goto fail;
        }
        if (p->loop_init) {
            L->user = p->loop_init(L, p->handler_ud);
        }
    }
    *out = s;
    return SP_OK;
fail:
    sp_http_server_destroy(s);
    return st;
}

int
sp_http_server_port(const sp_http_server_t *s)
{
    return s->port;
}

int
sp_http_server_tls_port(const sp_http_server_t *s)
{
    return s->tls_cert ? s->tls_port : 0;
}

sp_status_t
sp_http_server_reload_tls(sp_http_server_t *s, char *err, size_t err_len)
{
    if (s->tls_cert == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "TLS is off (no --tls-cert)");
    }
    /* Built outside the lock: reading the files must not hold up accepts. */
    struct ssl_ctx_st *ctx = NULL;
    sp_status_t st = sp_tls_ctx_create(s->tls_cert, s->tls_key, s->tls_ca, &ctx, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    pthread_mutex_lock(&s->tls_mu);
    struct ssl_ctx_st *old = s->tls_ctx;
    s->tls_ctx = ctx;
    pthread_mutex_unlock(&s->tls_mu);
    sp_tls_ctx_free(old); /* open connections hold their own references */
    return SP_OK;
}

sp_status_t
sp_http_server_start(sp_http_server_t *s, char *err, size_t err_len)
{
    for (int i = 0; i < s->n_loops; i++) {
        sp_http_loop_t *L = &s->loops[i];
        if (pthread_create(&L->thread, NULL, loop_main, L) != 0) {
            return sp_errf(err, err_len, SP_ERR_IO, "http: cannot start loop thread");
        }
        L->started = true;
    }
    return SP_OK;
}

void
sp_http_server_stop_accepting(sp_http_server_t *s)
{
    atomic_store(&s->draining, true);
    for (int i = 0; i < s->n_loops; i++) {
        atomic_store(&s->loops[i].stop_accepting, true);
        sp_http_loop_wake(&s->loops[i]);
    }
}

int64_t
sp_http_server_inflight(const sp_http_server_t *s)
{
    return atomic_load(&((sp_http_server_t *)s)->inflight);
}

int64_t
sp_http_server_connections(const sp_http_server_t *s)
{
    return atomic_load(&((sp_http_server_t *)s)->n_conns);
}

void
sp_http_server_destroy(sp_http_server_t *s)
{
    if (s == NULL) {
        return;
    }
    for (int i = 0; i < s->n_loops; i++) {
        sp_http_loop_t *L = &s->loops[i];
        if (L->started) {
            atomic_store(&L->stop, true);
            sp_http_loop_wake(L);
            pthread_join(L->thread, NULL);
        } else {
            close_listener(L);
            if (L->base && s->p.loop_fini && L->user) {
                s->p.loop_fini(L, L->user, s->p.handler_ud);
            }
        }
        if (L->wake_ev) {
            event_free(L->wake_ev);
        }
        if (L->base) {
            event_base_free(L->base);
        }
        if (L->wake_fd >= 0) {
            close(L->wake_fd);
        }
    }
    sp_free(s->loops);
    sp_tls_ctx_free(s->tls_ctx);
    sp_free(s->tls_cert);
    sp_free(s->tls_key);
    sp_free(s->tls_ca);
    pthread_mutex_destroy(&s->tls_mu);
    for (int b = 0; b < CLIENT_BUCKETS; b++) {
        while (s->cl_tab[b]) {
            client_t *e = s->cl_tab[b];
            s->cl_tab[b] = e->next;
            sp_free(e);
        }
    }
    pthread_mutex_destroy(&s->cl_mu);
    sp_free(s);
}
