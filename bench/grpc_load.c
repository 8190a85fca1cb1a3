/*
 * grpc_load.c - a load generator for KServe v2 gRPC ModelInfer
 * (/inference.GRPCInferenceService/ModelInfer over cleartext HTTP/2), one row per call, open loop
 * at a fixed arrival rate or closed loop at saturation. It measures the gRPC port the way
 * bench/kserve_load.c measures the REST one, so that the two protocols can be compared on the
 * same rows, schedules and windows.
 *
 *   grpc_load --addr 127.0.0.1:8001 --model fraud --csv ROWS.csv
 *             (--rate R [--schedule poisson|uniform] | --closed C) [--connections N]
 *             [--max-streams S] [--duration S] [--warmup S] [--drain S] [--first-col 1]
 *             [--n-cols 30] [--input input__0] [--typed] [--api-key KEY]
 *             [--expect PRED.csv] [--label NAME] [--json FILE]
 *
 * Transport: --connections HTTP/2 connections (prior knowledge, no TLS), each an nghttp2 client
 * session; every call is one stream (HEADERS, one DATA frame with the gRPC message, END_STREAM),
 * and a connection carries many streams at once, at most the smaller of --max-streams and the
 * server's SETTINGS_MAX_CONCURRENT_STREAMS. Everything the sessions want to write in one pass of
 * the event loop is gathered and written with one send() per connection, which keeps the
 * generator's cost per call far below the server's (so the server is what saturates).
 *
 * Open loop (--rate): calls are scheduled at fixed times (Poisson or evenly spaced arrivals),
 * whatever the server does, and each goes out at once on the next connection (in turn) with a
 * free stream slot. Its latency runs from the SCHEDULED time to the end of the stream (the
 * grpc-status trailer), so a server that falls behind is charged for the whole wait (no
 * coordinated omission). Only when every connection has all its slots busy does a call wait in
 * the generator's backlog ("backlogged": the server then holds connections x slots calls, i.e.
 * it has fallen far behind); its latency still counts from the scheduled time. The send lag
 * (actual submit - scheduled time: timer wake-up, this process's CPU, the VM pausing it) is
 * reported and is included in the latencies; "latency_from_send_ms" leaves it out.
 *
 * Closed loop (--closed C): C streams in flight at all times, spread evenly over the connections
 * (C/N each); a stream that ends is replaced at once by a new call on the same connection.
 * Throughput is the calls completed inside the measured window per second; latency runs from
 * the actual send.
 *
 * Both: the first --warmup seconds are not measured (open loop: calls scheduled then; closed
 * loop: calls completed then); --duration seconds are; then at most --drain seconds wait for
 * the calls in flight (open loop: calls still unanswered then count as errors, "unfinished").
 *
 * Calls: row i of --csv (header skipped; --n-cols numbers from column --first-col) becomes one
 * ModelInferRequest with one FP32 input of shape [1, n-cols], packed once before the run with
 * protobuf-c (the code protoc-c generates from proto/grpc_service.proto, as the server uses) and
 * cycled: the floats in raw_input_contents (little endian, as Triton's clients send them), or
 * with --typed in contents.fp32_contents. Every answer is unpacked: grpc-status 0, one message,
 * a ModelInferResponse with an output. With --expect (a CSV whose last column is the expected
 * prediction, one line per row in the same order), the first output value (raw FP32 or FP64, or
 * typed contents) is compared (relative 1e-5) and mismatches are errors. The response
 * parameters queue_time_us and compute_time_us (the server's own timings, passed through from
 * the REST answer) are reported beside the end-to-end latency.
 *
 * One thread, epoll, non-blocking sockets, a timerfd (1 ns timer slack) for the schedule.
 * Results: a summary on stderr, JSON on stdout (or --json FILE). Exit 0 when no call failed, 1
 * on errors, 2 on bad usage or when the server cannot be reached.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

static const char *const lg_prog = "grpc_load";
#include "loadgen.h"

#include "grpc_service.pb-c.h"

#define MAX_CONNS 1024
#define MAX_ANSWER (1 << 20)      /* one answer's message bytes; more is an error */
#define MAX_RECONNECTS 1000       /* a server that keeps dropping us ends the run */
#define OUT_GATHER (64 << 10)     /* bytes gathered from a session before one send() */
#define RECV_BUF (256 << 10)
#define INLINE_BODY 512           /* answers up to this size need no allocation */
#define METHOD_PATH "/inference.GRPCInferenceService/ModelInfer"

/* ------------------------------------------------------------------ options, data */

/* The options of gRPC alone (lg_opts_t holds the shared ones). */
typedef struct grpc_opts {
    char authority[280];
    const char *version, *api_key;
    int max_streams;
    bool typed;
} grpc_opts_t;

typedef struct req {
    uint8_t *msg;  /* the framed gRPC message: flag, 4-byte big-endian length, protobuf */
    size_t len;
    double expect; /* NAN when not checked */
} req_t;

typedef enum { C_CONNECTING, C_HANDSHAKE, C_READY, C_DEAD } conn_state_t;

typedef struct conn conn_t;

/* One call in flight: a stream of a connection. */
typedef struct stream {
    conn_t *c;
    struct stream *prev, *next; /* the connection's streams; next is the free list too */
    int32_t id;
    const req_t *req;
    size_t sent;                /* message bytes handed to nghttp2 */
    int64_t sched_ns, send_ns;
    int http_status, grpc_status; /* -1: not seen */
    char grpc_message[96];
    uint8_t *body;              /* the answer's bytes: inline, or heap when larger */
    size_t blen, bcap;
    uint8_t inline_body[INLINE_BODY];
} stream_t;

struct conn {
    int fd, idx;
    conn_state_t state;
    nghttp2_session *h2;
    stream_t *streams;
    int n_streams, max_streams, quota; /* quota: closed loop, streams kept in flight */
    bool goaway, broken, dirty, want_out;
    char broken_why[120];
    uint8_t *out;
    size_t out_len, out_off, out_cap;
};


typedef struct run {
    lg_opts_t o;
    grpc_opts_t g;
    req_t *reqs;
    int n_reqs, next_row;
    conn_t *conns;
    int n_conns, rr;
    int *dirty;
    int n_dirty;
    stream_t *free_streams;
    nghttp2_session_callbacks *cbs;
    nghttp2_option *h2opt;
    nghttp2_nv nv[8];
    size_t n_nv;
    int ep, tfd;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    lg_backlog_t bl;
    lg_window_t w;
    bool scheduling, capped_warned;
    int n_busy, max_busy;
    uint64_t rng;
    uint8_t *rbuf;
    /* counters: only calls inside the measured window */
    uint64_t n_sent, n_ok, n_grpc_err, n_http_err, n_conn_err, n_reset, n_proto_err, n_mismatch,
        n_unfinished, n_reconnects;
    char last_err[200];
    samples_t lat, lat_send, lag, q_us, c_us;
} run_t;

/* One row as a framed ModelInferRequest. */
static void
build_request(const run_t *r, req_t *q, const float *x)
{
    const lg_opts_t *o = &r->o;
    Inference__ModelInferRequest m = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in =
        INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
    Inference__ModelInferRequest__InferInputTensor *ins[1] = {&in};
    Inference__InferTensorContents tc = INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    int64_t shape[2] = {1, o->n_cols};
    ProtobufCBinaryData raw = {.len = (size_t)o->n_cols * sizeof(float), .data = (uint8_t *)(uintptr_t)x}; /* only read: packed below */
    /* protobuf-c's fields are char *; packing only reads them. */
    m.model_name = (char *)o->model;
    if (r->g.version) {
        m.model_version = (char *)r->g.version;
    }
    m.n_inputs = 1;
    m.inputs = ins;
    in.name = (char *)o->input;
    in.datatype = (char *)"FP32";
    in.n_shape = 2;
    in.shape = shape;
    if (r->g.typed) {
        tc.n_fp32_contents = (size_t)o->n_cols;
        tc.fp32_contents = (float *)(uintptr_t)x; /* protobuf-c reads it to pack */
        in.contents = &tc;
    } else {
        /* Little-endian raw floats (x86, aarch64): the protocol's byte order. */
        m.n_raw_input_contents = 1;
        m.raw_input_contents = &raw;
    }
    size_t len = inference__model_infer_request__get_packed_size(&m);
    q->msg = malloc(5 + len);
    if (q->msg == NULL) {
        die("out of memory");
    }
    q->msg[0] = 0; /* not compressed */
    q->msg[1] = (uint8_t)(len >> 24);
    q->msg[2] = (uint8_t)(len >> 16);
    q->msg[3] = (uint8_t)(len >> 8);
    q->msg[4] = (uint8_t)len;
    if (inference__model_infer_request__pack(&m, q->msg + 5) != len) {
        die("protobuf-c packed a different size than it announced");
    }
    q->len = 5 + len;
}

static void
add_row(void *ud, int i, const float *x, double expect)
{
    run_t *r = ud;
    build_request(r, &r->reqs[i], x);
    r->reqs[i].expect = expect;
}

static void
load_rows(run_t *r)
{
    r->reqs = calloc(MAX_ROWS, sizeof *r->reqs);
    if (r->reqs == NULL) {
        die("out of memory");
    }
    r->n_reqs = lg_load_rows(r->o.csv, r->o.expect, r->o.first_col, r->o.n_cols, add_row, r);
}

/* ------------------------------------------------------------------ answers */

static bool
in_window(const run_t *r, const stream_t *st, int64_t done)
{
    return lg_counts(&r->w, &r->o, st->sched_ns, done);
}

static void
set_err(run_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->last_err, sizeof r->last_err, fmt, ap);
    va_end(ap);
}

/* A response parameter as an integer, or -1. */
static long long
param_int(const Inference__InferParameter *v)
{
    if (v == NULL) {
        return -1;
    }
    switch (v->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        return v->int64_param;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        return (long long)v->uint64_param;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        return (long long)v->double_param;
    default:
        return -1;
    }
}

/* The first value of the answer's first output, or NAN (why in *why). */
static double
first_output(const Inference__ModelInferResponse *m, const char **why)
{
    if (m->n_outputs == 0) {
        *why = "no output";
        return NAN;
    }
    const Inference__ModelInferResponse__InferOutputTensor *t = m->outputs[0];
    bool fp64 = strcmp(t->datatype, "FP64") == 0;
    if (!fp64 && strcmp(t->datatype, "FP32") != 0) {
        *why = "the first output is neither FP32 nor FP64";
        return NAN;
    }
    if (m->n_raw_output_contents > 0) {
        const ProtobufCBinaryData *b = &m->raw_output_contents[0];
        if (fp64 && b->len >= sizeof(double)) {
            double d;
            memcpy(&d, b->data, sizeof d);
            return d;
        }
        if (!fp64 && b->len >= sizeof(float)) {
            float f;
            memcpy(&f, b->data, sizeof f);
            return f;
        }
    } else if (t->contents) {
        if (fp64 && t->contents->n_fp64_contents > 0) {
            return t->contents->fp64_contents[0];
        }
        if (!fp64 && t->contents->n_fp32_contents > 0) {
            return t->contents->fp32_contents[0];
        }
    }
    *why = "the first output has no data";
    return NAN;
}

/* An OK answer's message: unpack it, check it, record the server's timings. false: an error
 * was counted. */
static bool
check_answer(run_t *r, const stream_t *st)
{
    const uint8_t *b = st->body;
    if (st->blen < 5 || b[0] != 0) {
        r->n_proto_err++;
        set_err(r, st->blen < 5 ? "no message in an OK answer" : "a compressed answer");
        return false;
    }
    size_t len = (size_t)b[1] << 24 | (size_t)b[2] << 16 | (size_t)b[3] << 8 | b[4];
    if (5 + len != st->blen) {
        r->n_proto_err++;
        set_err(r, "answer framing: %zu bytes announced, %zu received", len, st->blen - 5);
        return false;
    }
    Inference__ModelInferResponse *m = inference__model_infer_response__unpack(NULL, len, b + 5);
    if (m == NULL) {
        r->n_proto_err++;
        set_err(r, "the answer is not a ModelInferResponse");
        return false;
    }
    bool ok = true;
    const char *why = NULL;
    double got = first_output(m, &why);
    if (why) {
        r->n_proto_err++;
        set_err(r, "answer: %s", why);
        ok = false;
    } else if (!isnan(st->req->expect) &&
               !(fabs(got - st->req->expect) <= 1e-5 * fmax(1.0, fabs(st->req->expect)))) {
        r->n_mismatch++;
        set_err(r, "prediction %.9g, expected %.9g", got, st->req->expect);
        ok = false;
    }
    if (ok) {
        long long q = -1, k = -1;
        for (size_t i = 0; i < m->n_parameters; i++) {
            const Inference__ModelInferResponse__ParametersEntry *e = m->parameters[i];
            if (strcmp(e->key, "queue_time_us") == 0) {
                q = param_int(e->value);
            } else if (strcmp(e->key, "compute_time_us") == 0) {
                k = param_int(e->value);
            }
        }
        if (q >= 0 && k >= 0) {
            samples_add(&r->q_us, q);
            samples_add(&r->c_us, k);
        }
    }
    inference__model_infer_response__free_unpacked(m, NULL);
    return ok;
}

static void
mark_dirty(run_t *r, conn_t *c)
{
    if (!c->dirty) {
        c->dirty = true;
        r->dirty[r->n_dirty++] = c->idx;
    }
}

static void
stream_unlink(run_t *r, stream_t *st)
{
    conn_t *c = st->c;
    if (st->prev) {
        st->prev->next = st->next;
    } else {
        c->streams = st->next;
    }
    if (st->next) {
        st->next->prev = st->prev;
    }
    c->n_streams--;
    r->n_busy--;
    if (st->body != st->inline_body) {
        free(st->body);
    }
    st->next = r->free_streams;
    r->free_streams = st;
}

/* The stream ended (h2err: its RST_STREAM code, 0 when it closed normally): judge the call. */
static void
stream_done(run_t *r, stream_t *st, uint32_t h2err)
{
    int64_t done = now_ns();
    if (in_window(r, st, done)) {
        bool ok = false;
        if (h2err != NGHTTP2_NO_ERROR) {
            r->n_reset++;
            set_err(r, "stream reset: %s", nghttp2_http2_strerror(h2err));
        } else if (st->http_status != 200) {
            r->n_http_err++;
            set_err(r, "HTTP status %d", st->http_status);
        } else if (st->grpc_status < 0) {
            r->n_proto_err++;
            set_err(r, "no grpc-status");
        } else if (st->grpc_status != 0) {
            r->n_grpc_err++;
            set_err(r, "grpc-status %d: %s", st->grpc_status, st->grpc_message);
        } else {
            ok = check_answer(r, st);
        }
        if (ok) {
            r->n_ok++;
            /* Open loop: from the scheduled time; closed loop: sched == send. */
            samples_add(&r->lat, done - st->sched_ns);
            samples_add(&r->lat_send, done - st->send_ns);
            samples_add(&r->lag, st->send_ns - st->sched_ns);
        }
    }
    mark_dirty(r, st->c);
    stream_unlink(r, st);
}

/* ------------------------------------------------------------------ nghttp2 callbacks */

static int
on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name, size_t nl,
          const uint8_t *value, size_t vl, uint8_t flags, void *ud)
{
    (void)flags;
    conn_t *c = ud;
    stream_t *st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id);
    if (c->state == C_DEAD || st == NULL || f->hd.type != NGHTTP2_HEADERS) {
        return 0;
    }
    /* Headers, or trailers (grpc-status arrives in either: a trailers-only error). */
    if (nl == 7 && memcmp(name, ":status", 7) == 0) {
        st->http_status = vl < 8 ? atoi((const char *)value) : -1;
    } else if (nl == 11 && memcmp(name, "grpc-status", 11) == 0) {
        char v[12];
        size_t n = vl < sizeof v - 1 ? vl : sizeof v - 1;
        memcpy(v, value, n);
        v[n] = '\0';
        st->grpc_status = atoi(v);
    } else if (nl == 12 && memcmp(name, "grpc-message", 12) == 0) {
        size_t n = vl < sizeof st->grpc_message - 1 ? vl : sizeof st->grpc_message - 1;
        memcpy(st->grpc_message, value, n);
        st->grpc_message[n] = '\0';
    }
    return 0;
}

static int
on_data_chunk(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
              void *ud)
{
    (void)flags;
    conn_t *c = ud;
    stream_t *st = nghttp2_session_get_stream_user_data(h2, id);
    if (c->state == C_DEAD || st == NULL) {
        return 0;
    }
    if (st->blen + len > MAX_ANSWER) {
        /* Cancels the stream: it ends with an error code, counted as a reset. */
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    if (st->blen + len > st->bcap) {
        size_t cap = st->bcap;
        while (cap < st->blen + len) {
            cap *= 2;
        }
        uint8_t *p = st->body == st->inline_body ? malloc(cap) : realloc(st->body, cap);
        if (p == NULL) {
            die("out of memory");
        }
        if (st->body == st->inline_body) {
            memcpy(p, st->inline_body, st->blen);
        }
        st->body = p;
        st->bcap = cap;
    }
    memcpy(st->body + st->blen, data, len);
    st->blen += len;
    return 0;
}

static run_t *the_run; /* the callbacks' way back to the run (one run per process) */

static int
on_stream_close_cb(nghttp2_session *h2, int32_t id, uint32_t err, void *ud)
{
    conn_t *c = ud;
    stream_t *st = nghttp2_session_get_stream_user_data(h2, id);
    if (c->state == C_DEAD || st == NULL) {
        return 0;
    }
    stream_done(the_run, st, err);
    return 0;
}

static int
on_frame_recv(nghttp2_session *h2, const nghttp2_frame *f, void *ud)
{
    conn_t *c = ud;
    if (c->state == C_DEAD) {
        return 0;
    }
    if (f->hd.type == NGHTTP2_SETTINGS && !(f->hd.flags & NGHTTP2_FLAG_ACK)) {
        uint32_t m = nghttp2_session_get_remote_settings(h2,
                                                         NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
        int lim = the_run->g.max_streams;
        c->max_streams = m < (uint32_t)lim ? (int)m : lim;
        if (c->state == C_HANDSHAKE) {
            c->state = C_READY;
        }
        mark_dirty(the_run, c);
    } else if (f->hd.type == NGHTTP2_GOAWAY) {
        /* No new streams here; the connection is reopened once its streams are done. */
        c->goaway = true;
        mark_dirty(the_run, c);
    }
    return 0;
}

/* The data provider of a call's message: copied into nghttp2's frame buffer (one frame for
 * the small messages of this benchmark). */
static ssize_t
read_msg(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
         nghttp2_data_source *src, void *ud)
{
    (void)h2;
    (void)id;
    (void)ud;
    stream_t *st = src->ptr;
    size_t n = st->req->len - st->sent;
    if (n > len) {
        n = len;
    }
    memcpy(buf, st->req->msg + st->sent, n);
    st->sent += n;
    if (st->sent == st->req->len) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return (ssize_t)n;
}

/* ------------------------------------------------------------------ connections */

static void conn_open(run_t *r, conn_t *c);

static void
conn_close(run_t *r, conn_t *c)
{
    c->state = C_DEAD; /* callbacks that nghttp2_session_del may still make see it */
    if (c->h2) {
        nghttp2_session_del(c->h2);
        c->h2 = NULL;
    }
    if (c->fd >= 0) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
    c->out_len = c->out_off = 0;
    c->want_out = false;
}

/* The connection broke (or the server sent GOAWAY and it drained): its calls in flight fail;
 * reopen it. */
static void
conn_fail(run_t *r, conn_t *c, const char *why)
{
    int64_t t = now_ns();
    while (c->streams) {
        stream_t *st = c->streams;
        if (in_window(r, st, t)) {
            r->n_conn_err++;
            set_err(r, "%s", why);
        }
        stream_unlink(r, st);
    }
    conn_close(r, c);
    if (++r->n_reconnects > MAX_RECONNECTS) {
        fprintf(stderr, "grpc_load: more than %d reconnects (last: %s); stopping\n",
                MAX_RECONNECTS, why);
        r->scheduling = false;
        r->w.drain_end = now_ns();
        return;
    }
    conn_open(r, c);
}

static void
want_write(run_t *r, conn_t *c, bool on)
{
    if (c->want_out == on) {
        return;
    }
    c->want_out = on;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(r->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void
conn_open(run_t *r, conn_t *c)
{
    c->fd = lg_connect(&r->o, &r->addr, r->addr_len, r->ep, c);
    c->want_out = true; /* lg_connect asked for EPOLLOUT */
    c->state = C_CONNECTING;
    c->goaway = c->broken = false;
    c->max_streams = 0;
    c->out_len = c->out_off = 0;
    if (nghttp2_session_client_new2(&c->h2, r->cbs, c, r->h2opt) != 0) {
        die("nghttp2_session_client_new2 failed");
    }
    /* Large receive windows: the server never waits for our WINDOW_UPDATE. */
    nghttp2_settings_entry s[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20},
    };
    if (nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, s, 2) != 0 ||
        nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, 16 << 20) != 0) {
        die("nghttp2 settings failed");
    }
}

/* Writes what the session has to send: gathered into one buffer, one send() per pass. */
static void
conn_flush(run_t *r, conn_t *c)
{
    while (c->state == C_HANDSHAKE || c->state == C_READY) {
        if (c->out_off < c->out_len) {
            ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
            if (n > 0) {
                c->out_off += (size_t)n;
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                want_write(r, c, true);
                return;
            }
            if (n < 0 && errno == EINTR) {
                continue;
            }
            conn_fail(r, c, n < 0 ? strerror(errno) : "send returned 0");
            return;
        }
        c->out_off = c->out_len = 0;
        while (c->out_len < OUT_GATHER) {
            const uint8_t *d;
            ssize_t n = nghttp2_session_mem_send(c->h2, &d);
            if (n < 0) {
                conn_fail(r, c, nghttp2_strerror((int)n));
                return;
            }
            if (n == 0) {
                break;
            }
            if (c->out_len + (size_t)n > c->out_cap) {
                size_t cap = c->out_cap ? c->out_cap : OUT_GATHER;
                while (cap < c->out_len + (size_t)n) {
                    cap *= 2;
                }
                uint8_t *p = realloc(c->out, cap);
                if (p == NULL) {
                    die("out of memory");
                }
                c->out = p;
                c->out_cap = cap;
            }
            memcpy(c->out + c->out_len, d, (size_t)n);
            c->out_len += (size_t)n;
        }
        if (c->out_len == 0) {
            want_write(r, c, false);
            return;
        }
    }
}

static bool
conn_has_room(const conn_t *c)
{
    return c->state == C_READY && !c->goaway && c->n_streams < c->max_streams;
}

/* Starts one call on c, scheduled at sched. */
static void
call_start(run_t *r, conn_t *c, int64_t sched)
{
    stream_t *st = r->free_streams;
    if (st) {
        r->free_streams = st->next;
    } else if ((st = malloc(sizeof *st)) == NULL) {
        die("out of memory");
    }
    st->c = c;
    st->req = &r->reqs[r->next_row];
    r->next_row = (r->next_row + 1) % r->n_reqs;
    st->sent = 0;
    st->sched_ns = sched;
    st->send_ns = now_ns();
    st->http_status = st->grpc_status = -1;
    st->grpc_message[0] = '\0';
    st->body = st->inline_body;
    st->blen = 0;
    st->bcap = INLINE_BODY;
    nghttp2_data_provider dp = {.source.ptr = st, .read_callback = read_msg};
    int32_t id = nghttp2_submit_request(c->h2, NULL, r->nv, r->n_nv, &dp, st);
    if (id < 0) {
        /* Stream ids used up (2^31 calls) or the session is closing: reopen once idle. */
        c->goaway = true;
        st->next = r->free_streams;
        r->free_streams = st;
        mark_dirty(r, c);
        return;
    }
    st->id = id;
    st->prev = NULL;
    st->next = c->streams;
    if (c->streams) {
        c->streams->prev = st;
    }
    c->streams = st;
    c->n_streams++;
    if (++r->n_busy > r->max_busy) {
        r->max_busy = r->n_busy;
    }
    if (lg_in_window(&r->w, sched)) {
        r->n_sent++;
    }
    mark_dirty(r, c);
}

/* Scheduled time t (open loop): start the call on the next connection with a free slot, or
 * backlog it. */
static void
issue(run_t *r, int64_t t)
{
    for (int k = 0; k < r->n_conns; k++) {
        conn_t *c = &r->conns[r->rr];
        r->rr = (r->rr + 1) % r->n_conns;
        if (conn_has_room(c)) {
            call_start(r, c, t);
            return;
        }
    }
    lg_backlog_push(&r->bl, t, lg_in_window(&r->w, t));
}

/* After events on c: reopen it when it is done with, refill its slots (closed loop: up to its
 * quota; open loop: from the backlog), then write. */
static void
conn_service(run_t *r, conn_t *c)
{
    if (c->state == C_DEAD) {
        return;
    }
    if (c->broken) {
        if (c->state == C_HANDSHAKE) {
            /* It never spoke HTTP/2: reconnecting would only repeat that. */
            die("%s:%s: %s before the server's HTTP/2 SETTINGS (is it a gRPC port?)", r->o.host,
                r->o.port, c->broken_why);
        }
        conn_fail(r, c, c->broken_why);
        return;
    }
    if (c->goaway && c->n_streams == 0 && c->state == C_READY) {
        conn_close(r, c);
        r->n_reconnects++;
        conn_open(r, c);
        return;
    }
    if (r->scheduling && r->o.closed) {
        while (conn_has_room(c) && c->n_streams < c->quota) {
            call_start(r, c, now_ns());
        }
    } else if (!r->o.closed) {
        while (r->bl.n > 0 && conn_has_room(c)) {
            call_start(r, c, lg_backlog_pop(&r->bl));
        }
    }
    conn_flush(r, c);
}

static void
on_conn_event(run_t *r, conn_t *c, uint32_t ev)
{
    if (c->state == C_DEAD) {
        return;
    }
    if (c->state == C_CONNECTING) {
        lg_check_connected(&r->o, c->fd);
        if (!(ev & EPOLLOUT)) {
            return;
        }
        c->state = C_HANDSHAKE; /* the preface and SETTINGS go out; READY on the server's */
        mark_dirty(r, c);
        return;
    }
    if (ev & EPOLLOUT) {
        mark_dirty(r, c);
    }
    if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
        return;
    }
    for (;;) {
        ssize_t n = recv(c->fd, r->rbuf, RECV_BUF, 0);
        if (n > 0) {
            ssize_t used = nghttp2_session_mem_recv(c->h2, r->rbuf, (size_t)n);
            if (used < 0) {
                c->broken = true;
                snprintf(c->broken_why, sizeof c->broken_why, "HTTP/2: %s",
                         nghttp2_strerror((int)used));
                mark_dirty(r, c);
                return;
            }
            mark_dirty(r, c);
            if (n < RECV_BUF) {
                return; /* drained (level-triggered epoll calls again otherwise) */
            }
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        }
        c->broken = true;
        snprintf(c->broken_why, sizeof c->broken_why, "%s",
                 n == 0 ? "server closed the connection" : strerror(errno));
        mark_dirty(r, c);
        return;
    }
}

/* ------------------------------------------------------------------ the run */


static void
service_dirty(run_t *r)
{
    /* The flag is cleared after the service: what conn_service starts on c marks c again,
     * and its own flush writes that, so each connection is listed at most once. */
    for (int i = 0; i < r->n_dirty; i++) {
        conn_t *c = &r->conns[r->dirty[i]];
        conn_service(r, c);
        c->dirty = false;
    }
    r->n_dirty = 0;
}

/* One epoll_wait and its events; true when the timer fired. */
static bool
poll_events(run_t *r, int timeout_ms)
{
    bool fired = false;
    struct epoll_event evs[256];
    int n = epoll_wait(r->ep, evs, 256, timeout_ms);
    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == NULL) {
            uint64_t x;
            if (read(r->tfd, &x, sizeof x) < 0) {
                /* EAGAIN: another wake-up already consumed it */
            }
            fired = true;
            continue;
        }
        on_conn_event(r, evs[i].data.ptr, evs[i].events);
    }
    return fired;
}

static void
run_load(run_t *r)
{
    const lg_opts_t *o = &r->o;
    int n_conns = o->connections;
    r->conns = calloc((size_t)n_conns, sizeof *r->conns);
    r->dirty = calloc((size_t)n_conns, sizeof *r->dirty);
    r->rbuf = malloc(RECV_BUF);
    r->n_conns = n_conns;
    if (r->conns == NULL || r->dirty == NULL || r->rbuf == NULL) {
        die("out of memory");
    }
    if (!o->closed) {
        lg_backlog_alloc(&r->bl);
    }
    lg_open_epoll(&r->ep, &r->tfd);
    for (int i = 0; i < n_conns; i++) {
        conn_t *c = &r->conns[i];
        c->idx = i;
        c->fd = -1;
        if (o->closed) {
            c->quota = o->closed / n_conns + (i < o->closed % n_conns);
        }
        conn_open(r, c);
    }
    /* Every connection connected and the server's SETTINGS received (5 s at most). */
    int64_t cdead = now_ns() + 5 * NS;
    for (;;) {
        int ready = 0;
        for (int i = 0; i < n_conns; i++) {
            ready += r->conns[i].state == C_READY;
        }
        if (ready == n_conns) {
            break;
        }
        if (now_ns() >= cdead) {
            die("only %d of %d HTTP/2 connections ready in 5 s (is %s:%s a gRPC port?)", ready,
                n_conns, o->host, o->port);
        }
        service_dirty(r);
        poll_events(r, 100);
        service_dirty(r);
    }
    if (o->closed) {
        for (int i = 0; i < n_conns; i++) {
            if (r->conns[i].quota > r->conns[i].max_streams) {
                fprintf(stderr, "grpc_load: %d streams per connection asked, the server allows "
                        "%d: use more --connections\n", r->conns[i].quota,
                        r->conns[i].max_streams);
                exit(2);
            }
        }
    }

    lg_window_start(&r->w, o);
    r->scheduling = true;
    int64_t next = r->w.t0, armed = -1;
    if (o->closed) {
        for (int i = 0; i < n_conns; i++) {
            mark_dirty(r, &r->conns[i]); /* conn_service fills each to its quota */
        }
    }
    while (!lg_interrupted) {
        int64_t t = now_ns();
        if (r->scheduling && !o->closed) {
            while (next <= t && next < r->w.end) {
                issue(r, next);
                next += lg_next_gap_ns(&r->rng, r->o.rate, r->o.schedule);
            }
            if (next >= r->w.end) {
                r->scheduling = false;
            }
        }
        if (r->scheduling && o->closed && t >= r->w.end) {
            r->scheduling = false;
        }
        service_dirty(r);
        if (!r->scheduling && r->n_busy == 0 && r->bl.n == 0) {
            break;
        }
        if (t >= r->w.drain_end) {
            break;
        }
        int64_t wake = r->w.drain_end;
        if (r->scheduling) {
            wake = o->closed ? r->w.end : next;
        }
        if (wake != armed) {
            lg_arm_timer(r->tfd, wake);
            armed = wake;
        }
        if (poll_events(r, 1000)) {
            armed = -1; /* it fired: set it again on the next pass */
        }
    }
    /* Calls of the window still unanswered (or never sent) are failures (open loop). */
    if (!o->closed) {
        for (int i = 0; i < n_conns; i++) {
            for (stream_t *st = r->conns[i].streams; st; st = st->next) {
                r->n_unfinished += lg_in_window(&r->w, st->sched_ns);
            }
        }
        r->n_unfinished += lg_backlog_in_window(&r->bl, &r->w);
    }
    for (int i = 0; i < n_conns; i++) {
        conn_t *c = &r->conns[i];
        while (c->streams) {
            stream_unlink(r, c->streams);
        }
        conn_close(r, c);
        free(c->out);
    }
}

/* ------------------------------------------------------------------ report */

static uint64_t
n_errors(const run_t *r)
{
    return r->n_grpc_err + r->n_http_err + r->n_conn_err + r->n_reset + r->n_proto_err +
           r->n_mismatch + r->n_unfinished + r->bl.n_dropped;
}

static void
report(run_t *r, double cpu_s)
{
    const lg_opts_t *o = &r->o;
    FILE *f = lg_open_json(o->json_path);
    uint64_t errors = n_errors(r);
    double achieved = (double)r->n_ok / o->duration_s;
    fprintf(f, "{\"label\":\"%s\",\"protocol\":\"grpc\",\"mode\":\"%s\",\"model\":\"%s\","
            "\"encoding\":\"%s\",\"connections\":%d,", o->label ? o->label : "",
            o->closed ? "closed" : "open", o->model, r->g.typed ? "typed" : "raw",
            o->connections);
    if (o->closed) {
        fprintf(f, "\"concurrency\":%d,", o->closed);
    } else {
        fprintf(f, "\"offered_rps\":%.1f,\"schedule\":\"%s\",", o->rate, o->schedule);
    }
    fprintf(f, "\"max_streams_per_connection\":%d,\"duration_s\":%.3f,\"warmup_s\":%.3f,"
            "\"sent\":%llu,\"ok\":%llu,\"achieved_rps\":%.1f,\"errors\":%llu,"
            "\"grpc_errors\":%llu,\"http_errors\":%llu,\"conn_errors\":%llu,\"resets\":%llu,"
            "\"protocol_errors\":%llu,\"mismatches\":%llu,\"unfinished\":%llu,\"dropped\":%llu,"
            "\"backlogged\":%llu,\"backlog_max\":%zu,\"max_in_flight\":%d,\"reconnects\":%llu,"
            "\"generator_cpu_s\":%.3f,\"generator_cpu_pct\":%.1f,",
            r->conns ? r->conns[0].max_streams : 0, o->duration_s, o->warmup_s,
            (unsigned long long)r->n_sent, (unsigned long long)r->n_ok, achieved,
            (unsigned long long)errors, (unsigned long long)r->n_grpc_err,
            (unsigned long long)r->n_http_err, (unsigned long long)r->n_conn_err,
            (unsigned long long)r->n_reset, (unsigned long long)r->n_proto_err,
            (unsigned long long)r->n_mismatch, (unsigned long long)r->n_unfinished,
            (unsigned long long)r->bl.n_dropped, (unsigned long long)r->bl.n_backlogged,
            r->bl.max, r->max_busy, (unsigned long long)r->n_reconnects, cpu_s,
            100.0 * cpu_s / (o->warmup_s + o->duration_s));
    lg_put_tail(f, &r->lat, &r->lat_send, &r->lag, &r->q_us, &r->c_us, r->last_err);

    lg_summary_head(o, o->closed ? "gRPC closed loop" : "gRPC open loop");
    if (o->closed) {
        fprintf(stderr, " c=%d over %d conns", o->closed, o->connections);
    } else {
        fprintf(stderr, " %.0f req/s (%s, %d conns)", o->rate, o->schedule, o->connections);
    }
    fprintf(stderr, " %.1fs: %.1f ok/s, %llu errors; ", o->duration_s, achieved,
            (unsigned long long)errors);
    lg_summary_latency(&r->lat, &r->lat_send, &r->lag, &r->q_us, &r->c_us);
    fprintf(stderr, "backlogged %llu (max %zu), max in flight %d; generator cpu %.0f%%\n",
            (unsigned long long)r->bl.n_backlogged, r->bl.max, r->max_busy,
            100.0 * cpu_s / (o->warmup_s + o->duration_s));
    if (errors) {
        fprintf(stderr, "  errors: grpc %llu, http %llu, connection %llu, reset %llu, "
                "protocol %llu, mismatch %llu, unfinished %llu, dropped %llu; last: %s\n",
                (unsigned long long)r->n_grpc_err, (unsigned long long)r->n_http_err,
                (unsigned long long)r->n_conn_err, (unsigned long long)r->n_reset,
                (unsigned long long)r->n_proto_err, (unsigned long long)r->n_mismatch,
                (unsigned long long)r->n_unfinished, (unsigned long long)r->bl.n_dropped,
                r->last_err);
    }
}

/* ------------------------------------------------------------------ main */

static const char usage[] =
    "usage: grpc_load --model NAME --csv ROWS.csv (--rate R | --closed C) [options]\n"
    "  --addr HOST:PORT   the gRPC port (default 127.0.0.1:8001; grpc://HOST:PORT works too)\n"
    "  --model NAME       model to call (ModelInferRequest.model_name)\n"
    "  --version V        model_version (default: the server's choice)\n"
    "  --csv FILE         one call per row (header skipped), cycled\n"
    LG_USAGE_COLUMNS
    "  --typed            contents.fp32_contents instead of raw_input_contents\n"
    "  --api-key KEY      send authorization: Bearer KEY\n"
    "  --expect FILE      CSV, last column = expected first output value per row\n"
    "  --rate R           open loop: R calls/s\n"
    "  --schedule S       poisson (default) or uniform arrivals\n"
    "  --closed C         closed loop: C streams in flight, spread over the connections\n"
    "  --connections N    HTTP/2 connections (default 4; closed loop: at most C)\n"
    "  --max-streams S    streams in flight per connection at most (default 100; the server's\n"
    "                     SETTINGS_MAX_CONCURRENT_STREAMS caps it too)\n"
    LG_USAGE_RUN;

static void
parse_addr(lg_opts_t *o, grpc_opts_t *g, const char *a)
{
    if (strncmp(a, "grpc://", 7) == 0) {
        a += 7;
    } else if (strncmp(a, "http://", 7) == 0) {
        a += 7;
    } else if (strstr(a, "://")) {
        die("--addr: only HOST:PORT, grpc://HOST:PORT or http://HOST:PORT (no TLS)");
    }
    const char *colon = strrchr(a, ':');
    size_t al = strcspn(a, "/");
    if (colon == NULL || (size_t)(colon - a) >= al) {
        die("--addr: HOST:PORT expected, got %s", a);
    }
    size_t hl = (size_t)(colon - a), pl = al - hl - 1;
    if (hl == 0 || hl >= sizeof o->host || pl == 0 || pl >= sizeof o->port) {
        die("--addr: bad host or port in %s", a);
    }
    memcpy(o->host, a, hl);
    o->host[hl] = '\0';
    memcpy(o->port, colon + 1, pl);
    o->port[pl] = '\0';
    snprintf(g->authority, sizeof g->authority, "%s:%s", o->host, o->port);
}

static void
add_nv(run_t *r, const char *name, const char *value)
{
    nghttp2_nv *nv = &r->nv[r->n_nv++];
    nv->name = (uint8_t *)name;
    nv->namelen = strlen(name);
    nv->value = (uint8_t *)value;
    nv->valuelen = strlen(value);
    /* The strings live as long as the run: nghttp2 need not copy them. */
    nv->flags = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE;
}

int
main(int argc, char **argv)
{
    static run_t r;
    the_run = &r;
    lg_opts_t *o = &r.o;
    grpc_opts_t *g = &r.g;
    parse_addr(o, g, "127.0.0.1:8001");
    lg_opts_defaults(o, 4);
    g->max_streams = 100;
    bool conns_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--typed") == 0) {
            g->typed = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "grpc_load: %s needs a value\n%s", a, usage);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--addr") == 0 || strcmp(a, "--url") == 0) {
            parse_addr(o, g, v);
        } else if (strcmp(a, "--version") == 0) {
            g->version = v;
        } else if (strcmp(a, "--api-key") == 0) {
            g->api_key = v;
        } else if (strcmp(a, "--max-streams") == 0) {
            g->max_streams = (int)lg_num_arg(a, v, 1, 1 << 20);
        } else if (lg_parse_opt(o, a, v, MAX_CONNS, 1 << 20)) {
            conns_set |= strcmp(a, "--connections") == 0;
        } else {
            fprintf(stderr, "grpc_load: unknown option %s\n%s", a, usage);
            return 2;
        }
    }
    lg_check_opts(o, usage);
    if (o->closed && o->connections > o->closed) {
        if (conns_set) {
            fprintf(stderr, "grpc_load: %d connections for %d streams: using %d\n",
                    o->connections, o->closed, o->closed);
        }
        o->connections = o->closed;
    }
    r.rng = o->seed * 0x9E3779B97F4A7C15ULL + 1;

    lg_resolve(o, &r.addr, &r.addr_len);

    /* Request headers, the same for every call (grpc-js and Triton's clients send these). */
    static char bearer[1024];
    add_nv(&r, ":method", "POST");
    add_nv(&r, ":scheme", "http");
    add_nv(&r, ":path", METHOD_PATH);
    add_nv(&r, ":authority", g->authority);
    add_nv(&r, "content-type", "application/grpc");
    add_nv(&r, "te", "trailers");
    add_nv(&r, "user-agent", "sampan-grpc-load");
    if (g->api_key) {
        snprintf(bearer, sizeof bearer, "Bearer %s", g->api_key);
        add_nv(&r, "authorization", bearer);
    }
    if (nghttp2_session_callbacks_new(&r.cbs) != 0 || nghttp2_option_new(&r.h2opt) != 0) {
        die("out of memory");
    }
    nghttp2_session_callbacks_set_on_header_callback(r.cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(r.cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(r.cbs, on_stream_close_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(r.cbs, on_frame_recv);

    load_rows(&r);
    lg_prepare_run();
    double cpu0 = lg_cpu_s();
    run_load(&r);
    report(&r, lg_cpu_s() - cpu0);
    nghttp2_option_del(r.h2opt);
    nghttp2_session_callbacks_del(r.cbs);
    return lg_interrupted ? 1 : n_errors(&r) ? 1 : 0;
}
