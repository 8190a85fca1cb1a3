/*
 * http.h - the HTTP/1.1 server core: event-loop threads, connections, limits.
 *
 * Built on libevent 2.1 (event loop, listener, bufferevents) and Node's
 * http-parser 2.9 (request line, headers, chunked bodies, keep-alive rules);
 * this module owns the connection state machine around them. Why not evhttp,
 * libmicrohttpd or libevhtp: docs/design.md.
 *
 * Threads: N loop threads, each with its own event_base and its own
 * SO_REUSEPORT listening socket (the kernel spreads connections). Every
 * connection and request lives on one loop for its whole life, and every
 * function below that takes a request must be called on that loop's thread.
 * Other threads reach a loop only through sp_http_loop_wake (an eventfd).
 *
 * A request is handed to the handler once its body is complete. The handler
 * answers at once (sp_http_respond) or later, from the same loop: it keeps the
 * pointer, registers sp_http_req_on_abort (required: without it a request
 * kept past the handler's return would dangle when its connection dies), and answers when its work is done,
 * or streams (sp_http_stream_*). Pipelined requests wait in the input buffer
 * until the one before them is answered. The connection keeps reading while a
 * handler works, so a client that disconnects is seen at once: the abort
 * callback runs and the request is freed right after it.
 *
 * Limits (sp_http_limits_t) are enforced here, before routing: 414 for a long
 * URL, 431 for too many or too large headers, 413 for a body over the limit
 * (from Content-Length, before reading it), 400 for malformed requests or too
 * many chunks, 408 when the head or the body does not arrive within its
 * deadline, and at most max_connections open sockets. At that cap a new
 * connection first makes room by closing this loop's connection that has been
 * idle longest (no request in progress); with none idle it is answered 503
 * and closed. One peer address may hold at most max_conns_per_client sockets
 * and open conn_rate_per_client new ones per second (more are answered 429
 * and closed), so one client cannot take every socket.
 *
 * TLS (OpenSSL 3 through libevent's bufferevent_openssl; contexts in tls.c):
 * either the main listener speaks TLS, or a second listener on tls_port
 * does (each loop binds its own, SO_REUSEPORT, like the main one). After the
 * handshake a TLS connection is an ordinary connection: same parser, limits,
 * timeouts, streaming and aborts. A failed handshake (plain HTTP on the TLS
 * port, no or a rejected client certificate, no common protocol) only closes
 * that connection, with one rate-limited event=tls_handshake_failed line; a
 * handshake must end within header_timeout_ms. sp_http_server_reload_tls
 * swaps in a context built from the same files (SIGHUP): new connections use
 * it, open ones keep theirs.
 */
#ifndef SP_HTTP_HTTP_H
#define SP_HTTP_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/str.h"
#include "sampan/status.h"

struct event_base;

typedef struct sp_http_server sp_http_server_t;
typedef struct sp_http_loop sp_http_loop_t;
typedef struct sp_http_req sp_http_req_t;

typedef struct sp_http_limits {
    size_t max_url_bytes;       /* request target; longer: 414 (default 8 KiB) */
    size_t max_header_bytes;    /* request line + all headers; more: 431 (default 16 KiB) */
    int max_headers;            /* header lines; more: 431 (default 100) */
    size_t max_body_bytes;      /* more: 413 (default 8 MiB) */
    int max_chunks;             /* chunks per chunked body; more: 400 (default 65536) */
    int max_connections;        /* open client sockets, all loops together (default 1024) */
    int max_conns_per_client;   /* open sockets from one peer address; more: 429 (256, 0 = no cap) */
    int conn_rate_per_client;   /* new connections per second from one peer address, with a
                                   burst of as many; more: 429 (default 1000, 0 = no limit) */
    int header_timeout_ms;      /* from a request's first byte to the end of its head: 408 (10 s) */
    int body_timeout_ms;        /* from the end of the head to the end of the body: 408 (30 s) */
    int idle_timeout_ms;        /* keep-alive connection with no request: closed (60 s) */
    int write_timeout_ms;       /* output pending with no progress: closed (30 s) */
    size_t max_output_bytes;    /* unsent output above which stream writes fail (4 MiB) */
} sp_http_limits_t;

sp_http_limits_t sp_http_default_limits(void);

/* Called on the loop's thread for every complete request. */
typedef void (*sp_http_handler_fn)(sp_http_req_t *req, void *ud);
/* Called once per loop thread before it runs (returns the loop's user data). */
typedef void *(*sp_http_loop_init_fn)(sp_http_loop_t *loop, void *ud);
/* Called on the loop thread after the loop stopped, with the user data. */
typedef void (*sp_http_loop_fini_fn)(sp_http_loop_t *loop, void *loop_user, void *ud);
/* Writes the body of an error the HTTP layer answers itself (400, 408, 413, ...)
 * into buf (cap bytes, NUL-terminated); returns its length. */
typedef size_t (*sp_http_error_fmt_fn)(int status, const char *message, char *buf, size_t cap);
/* Called once per request handed to the handler, on its loop thread, when its
 * answer is fully queued or (aborted) the connection died first: for access
 * logs. The request's accessors still work during the call. */
typedef void (*sp_http_done_fn)(sp_http_req_t *req, bool aborted, void *handler_ud);

typedef struct sp_http_server_params {
    sp_http_limits_t limits;
    int n_loops;                 /* event-loop threads (default 1) */
    sp_http_handler_fn handler;
    void *handler_ud;
    sp_http_loop_init_fn loop_init; /* optional */
    sp_http_loop_fini_fn loop_fini; /* optional */
    sp_http_error_fmt_fn error_fmt; /* optional: default {"error":{"message":...}} */
    sp_http_done_fn on_done;        /* optional */
    /* TLS: off while tls_cert is NULL or "". The paths are copied (a reload
     * reads the same files again). tls_client_ca requires client
     * certificates signed by one of its CAs (mutual TLS). tls_port 0: the
     * main port speaks TLS (and only TLS); > 0: plain HTTP on the main port
     * and TLS on this one. */
    const char *tls_cert;           /* PEM certificate chain, leaf first */
    const char *tls_key;            /* PEM private key of tls_cert, unencrypted */
    const char *tls_client_ca;      /* optional: PEM CA bundle */
    int tls_port;
} sp_http_server_params_t;

sp_http_server_params_t sp_http_default_server_params(void);

/* Create the server and bind host:port (port 0 picks a free one). */
sp_status_t sp_http_server_create(const sp_http_server_params_t *p, const char *host, int port,
                                  sp_http_server_t **out, char *err, size_t err_len);
/* The bound port. */
int sp_http_server_port(const sp_http_server_t *s);
/* The port that speaks TLS: the main port, the second one, or 0 (no TLS). */
int sp_http_server_tls_port(const sp_http_server_t *s);
/* Any thread (SIGHUP): rebuild the TLS context from the same files. New
 * connections use the new one; on error the old one stays and err says why
 * (the file and the problem). SP_ERR_INVALID when TLS is off. */
sp_status_t sp_http_server_reload_tls(sp_http_server_t *s, char *err, size_t err_len);
/* Check TLS files the way sp_http_server_create will load them (for a
 * clear start-up error before anything else starts); nothing is kept. */
sp_status_t sp_http_tls_check(const char *cert, const char *key, const char *client_ca, char *err,
                              size_t err_len);
/* Start the loop threads. */
sp_status_t sp_http_server_start(sp_http_server_t *s, char *err, size_t err_len);
/* Any thread: close the listening sockets (new connections are refused),
 * close idle keep-alive connections and answer later requests with
 * "Connection: close". Requests in flight go on. */
void sp_http_server_stop_accepting(sp_http_server_t *s);
/* Requests handed to a handler and not yet completely answered. */
int64_t sp_http_server_inflight(const sp_http_server_t *s);
/* Open client connections. */
int64_t sp_http_server_connections(const sp_http_server_t *s);
/* Responses written with this status code (100..599) since start, any thread. */
uint64_t sp_http_server_status_count(const sp_http_server_t *s, int status);
/* Per-client limits (max_conns_per_client, conn_rate_per_client) for a
 * listener beside this server's own (the gRPC port), so that one address's
 * HTTP and gRPC connections count together. Any thread. 0 with *token set
 * (NULL when no limit is on; give it to sp_http_client_release when the
 * connection closes), or 429 with *why naming the limit. */
struct sockaddr;
int sp_http_client_admit(sp_http_server_t *s, const struct sockaddr *sa, void **token,
                         const char **why);
void sp_http_client_release(sp_http_server_t *s, void *token);
/* Stop the loops (aborting whatever is still open), join the threads, free. */
void sp_http_server_destroy(sp_http_server_t *s);

/* ---- loops (for modules that deliver work back to a loop from other threads) */

struct event_base *sp_http_loop_base(sp_http_loop_t *loop);
void *sp_http_loop_user(sp_http_loop_t *loop);
/* Loop thread: after sp_http_loop_wake (any thread), fn(arg) runs on the
 * loop's thread. One registration per loop (the scheduler's mailbox). */
void sp_http_loop_set_wake_cb(sp_http_loop_t *loop, void (*fn)(void *arg), void *arg);
void sp_http_loop_wake(sp_http_loop_t *loop);

/* ---- requests (loop thread only) */

typedef enum sp_http_method {
    SP_HTTP_GET, SP_HTTP_HEAD, SP_HTTP_POST, SP_HTTP_PUT, SP_HTTP_DELETE, SP_HTTP_OPTIONS,
    SP_HTTP_PATCH, SP_HTTP_OTHER,
} sp_http_method_t;

sp_http_method_t sp_http_req_method(const sp_http_req_t *r);
const char *sp_http_req_method_str(const sp_http_req_t *r);
sp_str_t sp_http_req_path(const sp_http_req_t *r);   /* without the query, not decoded */
sp_str_t sp_http_req_query(const sp_http_req_t *r);  /* after '?', or empty */
/* Header value by name (case-insensitive); ptr NULL when absent. */
sp_str_t sp_http_req_header(const sp_http_req_t *r, const char *name);
sp_str_t sp_http_req_body(const sp_http_req_t *r);
sp_http_loop_t *sp_http_req_loop(const sp_http_req_t *r);
uint64_t sp_http_req_id(const sp_http_req_t *r);     /* unique per server run */
const char *sp_http_req_peer(const sp_http_req_t *r); /* "ip:port" */
/* When the request's first bytes arrived, in sp_time_ns() time: the kernel's
 * receive time on plain TCP, the time they were read over TLS. */
int64_t sp_http_req_start_ns(const sp_http_req_t *r);
int sp_http_req_status(const sp_http_req_t *r);       /* status of the head written; 0 = none */
bool sp_http_req_tls(const sp_http_req_t *r);         /* arrived over TLS */
/* The subject CN of the client certificate verified under mutual TLS; ""
 * without one (and for a certificate with no, several, or a control-byte
 * CN). Valid while the request is. */
#define SP_HTTP_CN_MAX 255
const char *sp_http_req_client_cn(const sp_http_req_t *r);
/* The request id for logs and the x-request-id header (set by the server's handler). */
#define SP_HTTP_RID_MAX 64
void sp_http_req_set_rid(sp_http_req_t *r, const char *rid, size_t len);
const char *sp_http_req_rid(const sp_http_req_t *r);
/* One pointer of the server's own per request (NULL at dispatch). */
void sp_http_req_set_user(sp_http_req_t *r, void *p);
void *sp_http_req_user(const sp_http_req_t *r);
/* The request's trace record (api/trace.h; NULL when not sampled). */
struct sp_trace;
void sp_http_req_set_trace(sp_http_req_t *r, struct sp_trace *t);
struct sp_trace *sp_http_req_trace(const sp_http_req_t *r);
/* Append " key=value ..." fields (printf) to the request's note, which the
 * access log prints; bounded (SP_HTTP_NOTE_MAX), extra text is dropped. */
#define SP_HTTP_NOTE_MAX 1280
void sp_http_req_annotate(sp_http_req_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *sp_http_req_note(const sp_http_req_t *r);

/* Add a response header (before sp_http_respond / sp_http_stream_start). Names
 * and values must not contain CR or LF (they are dropped if they do). */
void sp_http_add_header(sp_http_req_t *r, const char *name, const char *value);
/* The headers added so far, "Name: value\r\n" each (not NUL-terminated). */
sp_str_t sp_http_req_added_headers(const sp_http_req_t *r);
/* Complete answer; the request must not be used afterwards. */
void sp_http_respond(sp_http_req_t *r, int status, const char *content_type, const char *body,
                     size_t len);

/* Streaming answer with chunked transfer encoding (close-delimited for HTTP/1.0).
 * Each write is sent at once (TCP_NODELAY). sp_http_stream_write returns -1
 * when more than max_output_bytes are waiting to be sent (a reader too slow
 * for us): the caller should stop producing and sp_http_abort. */
void sp_http_stream_start(sp_http_req_t *r, int status, const char *content_type);
int sp_http_stream_write(sp_http_req_t *r, const char *data, size_t len);
void sp_http_stream_end(sp_http_req_t *r);
/* Drop the connection without (finishing) an answer; frees the request. */
void sp_http_abort(sp_http_req_t *r);
/* Bytes queued on the connection and not yet written to the socket. */
size_t sp_http_req_output_pending(const sp_http_req_t *r);

/* fn runs if the connection dies while the handler still owns the request
 * (client disconnect, write timeout, server shutdown). The request is freed
 * right after fn returns: do not touch it again. */
void sp_http_req_on_abort(sp_http_req_t *r, void (*fn)(sp_http_req_t *r, void *ud), void *ud);

/* ---- virtual requests (loop thread only)
 *
 * Another protocol on the same loop (the gRPC front end, grpc.c) hands its
 * calls to the same handler as requests without a connection, so that they
 * take the same path as HTTP ones: keys, tenants, limits, routes, metrics
 * and the access log. The answer goes to the sink instead of a socket; the
 * request counts as in flight (drain waits for it) until it ends. Exactly
 * one of respond, stream_end or aborted ends a request; it is freed right
 * after that call, or by sp_http_vreq_cancel (the caller's side went away:
 * the handler's abort callback runs, no sink call follows). */
typedef struct sp_http_sink {
    /* The complete answer. hdrs: the handler's extra headers, "Name: value\r\n" each. */
    void (*respond)(void *ud, int status, const char *content_type, const char *hdrs,
                    size_t hdrs_len, const char *body, size_t len);
    void (*stream_start)(void *ud, int status, const char *content_type, const char *hdrs,
                         size_t hdrs_len);
    int (*stream_write)(void *ud, const char *data, size_t len); /* -1: too much unsent */
    void (*stream_end)(void *ud);
    void (*aborted)(void *ud); /* the handler dropped the request (sp_http_abort) */
    size_t (*pending)(void *ud); /* bytes not yet sent (sp_http_req_output_pending) */
} sp_http_sink_t;

typedef struct sp_http_vreq_params {
    sp_http_method_t method;          /* SP_HTTP_GET or SP_HTTP_POST */
    const char *path;                 /* copied */
    size_t path_len;
    const sp_str_t *hdr_names, *hdr_values; /* copied */
    int n_hdrs;
    const char *body;                 /* copied */
    size_t body_len;
    const char *peer;                 /* "ip:port" */
    bool tls;
    const char *client_cn;            /* "" or the verified client certificate's CN */
} sp_http_vreq_params_t;

/* A request ready to run (NULL when memory ran out). Annotate it, keep the
 * pointer, then sp_http_vreq_run hands it to the handler (which may answer
 * before returning). sp_http_vreq_cancel also frees one never run. */
sp_http_req_t *sp_http_vreq_create(sp_http_loop_t *loop, const sp_http_vreq_params_t *p,
                                   const sp_http_sink_t *sink, void *sink_ud);
void sp_http_vreq_run(sp_http_req_t *r);
void sp_http_vreq_cancel(sp_http_req_t *r);

/* Reason phrase for a status code ("OK", "Not Found", ...). */
const char *sp_http_status_text(int status);

#endif /* SP_HTTP_HTTP_H */
