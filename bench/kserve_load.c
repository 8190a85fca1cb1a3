/*
 * kserve_load.c - a load generator for KServe v2 infer (POST /v2/models/{m}/infer), one row per
 * request, open loop at a fixed arrival rate or closed loop at saturation.
 *
 *   kserve_load --url http://127.0.0.1:8000 --model fraud --csv ROWS.csv
 *               (--rate R [--schedule poisson|uniform] [--connections N] | --closed C)
 *               [--duration S] [--warmup S] [--drain S] [--first-col 1] [--n-cols 30]
 *               [--input input__0] [--binary] [--expect PRED.csv] [--label NAME] [--json FILE]
 *
 * Open loop (--rate): requests are scheduled at fixed times (Poisson or evenly spaced arrivals),
 * whatever the server does. Each is sent on a free keep-alive connection with nothing in flight
 * (one request per connection at a time, as a client without pipelining does). Its latency runs
 * from the SCHEDULED time to the last byte of the answer, so a server that falls behind is charged
 * for the whole wait (no coordinated omission). When every connection is busy at a scheduled time
 * the request waits in the generator's backlog until one frees up; that is counted and reported
 * ("backlogged"): it means the server held N requests at once, i.e. it fell behind, and the
 * latency still counts from the scheduled time. The send lag (actual send - scheduled time) is
 * reported too: it is the generator's own error (timer wake-up, its CPU, the VM pausing it), and
 * it is included in the latencies; "latency_from_send_ms" leaves it out (it is what the server and
 * the loopback took, but it hides a server that falls behind: read it beside "backlogged").
 *
 * Closed loop (--closed C): C connections each send the next request as soon as the previous
 * answer arrived; throughput is the answers completed inside the measured window per second,
 * latency runs from the actual send.
 *
 * Both: the first --warmup seconds are not measured (open loop: requests scheduled then; closed
 * loop: answers completed then); --duration seconds are; then at most --drain seconds wait for the
 * answers in flight (open loop: requests still unanswered then count as errors, "unfinished").
 * The whole run is bounded by warmup + duration + drain.
 *
 * Requests: row i of --csv (header skipped; --n-cols numbers from column --first-col) becomes
 * one request body, built once before the run and cycled: JSON
 *   {"inputs":[{"name":"input__0","datatype":"FP32","shape":[1,30],"data":[...]}]}
 * or, with --binary, Triton's binary tensor extension (a JSON header with
 * parameters.binary_data_size, then the 120 raw bytes; Inference-Header-Content-Length). Values
 * are parsed as float and printed with 9 significant digits, so both forms carry the same floats.
 * With --expect (a CSV whose last column is the expected prediction, one line per row in the same
 * order), every 200 answer's first output value is compared (relative 1e-5) and mismatches are
 * errors.
 *
 * The server's own timings: the xgboost/tensor route answers "parameters": {"queue_time_us",
 * "compute_time_us"}; their means and p99 are reported next to the end-to-end latency, so the
 * rest (HTTP, JSON, thread hand-offs, loopback, this client) can be told apart.
 *
 * One thread, epoll, non-blocking sockets; a timerfd (with 1 ns timer slack) wakes it at the
 * next scheduled time. Results: a summary on stderr, JSON on stdout (or --json FILE). Exit 0 when
 * no request failed, 1 on errors, 2 on bad usage or when the server cannot be reached.
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

static const char *const lg_prog = "kserve_load";
#include "loadgen.h"

#define MAX_CONNS 4096
#define RBUF_MAX (1 << 20)       /* one answer; more is a protocol error */
#define BACKLOG_CAP (1 << 20)    /* scheduled requests waiting for a connection */
#define MAX_RECONNECTS 1000      /* a server that keeps dropping us ends the run */

/* ------------------------------------------------------------------ options, data */

typedef struct opts {
    char host[256], port[16];
    const char *model, *csv, *expect, *input, *label, *json_path, *schedule;
    int first_col, n_cols, connections, closed;
    double rate, duration_s, warmup_s, drain_s;
    bool binary;
    uint64_t seed;
} opts_t;

typedef struct req {
    char *buf; /* the whole HTTP request: head and body */
    size_t len;
    double expect; /* NAN when not checked */
} req_t;

typedef enum { C_CONNECTING, C_IDLE, C_BUSY, C_DEAD } conn_state_t;

typedef struct conn {
    int fd;
    conn_state_t state;
    bool listed;               /* in the idle ring (open loop) */
    bool reused;               /* it has answered before: the server may close it when idle */
    bool retry;                /* reopening to resend the request of retry_sched */
    int64_t retry_sched;
    const req_t *req;
    size_t sent;               /* bytes of req written so far */
    int64_t sched_ns, send_ns; /* scheduled and actual send time of the request in flight */
    char *rbuf;
    size_t rlen;
} conn_t;


typedef struct run {
    opts_t o;
    req_t *reqs;
    int n_reqs;
    conn_t *conns;
    int ep, tfd;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    /* Idle connections, FIFO: every connection is used in turn, so none sits unused long
     * enough for the server's header timeout (10 s by default) to close it. */
    int *idle;
    int idle_head, n_idle, n_conns;
    uint64_t n_retries;
    int n_retry_pending; /* connections reopening to resend a request */
    int64_t *bl_sched; /* backlog ring: scheduled times, FIFO */
    size_t bl_head, bl_n, bl_max;
    uint64_t n_backlogged, n_dropped;
    int64_t t0, warm_end, end, drain_end;
    bool scheduling;
    int next_row;
    int n_busy, max_busy;
    uint64_t rng;
    /* counters: only requests inside the measured window */
    uint64_t n_sent, n_ok, n_http_err, n_conn_err, n_mismatch, n_unfinished, n_reconnects;
    int last_status;
    char last_err[160];
    samples_t lat, lat_send, lag, q_us, c_us;
} run_t;

/* Appends printf output to a growing buffer. */
static void
bprintf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            die("formatting failed");
        }
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return;
        }
        *cap = 2 * *cap + (size_t)n;
        char *p = realloc(*buf, *cap);
        if (p == NULL) {
            die("out of memory");
        }
        *buf = p;
    }
}

static void
build_request(run_t *r, req_t *q, const float *x)
{
    const opts_t *o = &r->o;
    size_t cap = 1024, len = 0, blen = 0, bcap = 1024;
    char *body = malloc(bcap), *head = malloc(cap);
    if (body == NULL || head == NULL) {
        die("out of memory");
    }
    bprintf(&body, &blen, &bcap,
            "{\"inputs\":[{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[1,%d],", o->input,
            o->n_cols);
    size_t json_len = 0;
    if (o->binary) {
        bprintf(&body, &blen, &bcap, "\"parameters\":{\"binary_data_size\":%zu}}]}",
                (size_t)o->n_cols * sizeof(float));
        json_len = blen;
        for (int i = 0; i < o->n_cols; i++) {
            /* Little-endian raw floats (x86, aarch64): the extension's byte order. */
            char raw[sizeof(float)];
            memcpy(raw, &x[i], sizeof raw);
            while (bcap < blen + sizeof raw + 1) {
                bcap *= 2;
                body = realloc(body, bcap);
                if (body == NULL) {
                    die("out of memory");
                }
            }
            memcpy(body + blen, raw, sizeof raw);
            blen += sizeof raw;
        }
    } else {
        bprintf(&body, &blen, &bcap, "\"data\":[");
        for (int i = 0; i < o->n_cols; i++) {
            bprintf(&body, &blen, &bcap, "%s%.9g", i ? "," : "", (double)x[i]);
        }
        bprintf(&body, &blen, &bcap, "]}]}");
    }
    bprintf(&head, &len, &cap, "POST /v2/models/%s/infer HTTP/1.1\r\nHost: %s:%s\r\n"
            "Content-Type: %s\r\nContent-Length: %zu\r\n", o->model, o->host, o->port,
            o->binary ? "application/octet-stream" : "application/json", blen);
    if (o->binary) {
        bprintf(&head, &len, &cap, "Inference-Header-Content-Length: %zu\r\n", json_len);
    }
    bprintf(&head, &len, &cap, "\r\n");
    while (cap < len + blen) {
        cap *= 2;
    }
    head = realloc(head, cap);
    if (head == NULL) {
        die("out of memory");
    }
    memcpy(head + len, body, blen);
    q->buf = head;
    q->len = len + blen;
    free(body);
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

/* ------------------------------------------------------------------ connections */

static void send_more(run_t *r, conn_t *c);
static void conn_fail(run_t *r, conn_t *c, const char *why, bool retryable);
static void conn_open(run_t *r, conn_t *c);

static void
conn_close(run_t *r, conn_t *c)
{
    if (c->fd >= 0) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
    c->rlen = 0;
    c->state = C_DEAD;
}

static bool
in_window(const run_t *r, const conn_t *c, int64_t done)
{
    /* Open loop: by scheduled time (what was offered in the window); closed loop: by
     * completion time (what was served in the window). */
    int64_t t = r->o.closed ? done : c->sched_ns;
    return t >= r->warm_end && t < r->end;
}

/* A request failed on c (connection error or protocol error): count it, reconnect. A request
 * sent on a reused keep-alive connection that the server closed before answering a byte
 * (retryable: EOF, reset, broken pipe) is sent once more on the new connection, as HTTP clients
 * do: the server may close an idle connection just as the request leaves. Its latency still
 * counts from the scheduled time. */
static void
conn_fail(run_t *r, conn_t *c, const char *why, bool retryable)
{
    if (c->state == C_BUSY) {
        r->n_busy--;
        if (retryable && c->reused && c->rlen == 0 && r->o.closed == 0) {
            c->retry = true;
            c->retry_sched = c->sched_ns;
            r->n_retries++;
            r->n_retry_pending++;
        } else if (in_window(r, c, now_ns())) {
            r->n_conn_err++;
            snprintf(r->last_err, sizeof r->last_err, "%s", why);
        }
    }
    conn_close(r, c);
    if (++r->n_reconnects > MAX_RECONNECTS) {
        fprintf(stderr, "kserve_load: more than %d reconnects (last: %s); stopping\n",
                MAX_RECONNECTS, why);
        r->scheduling = false;
        r->drain_end = now_ns();
        return;
    }
    conn_open(r, c);
}

static void
conn_open(run_t *r, conn_t *c)
{
    c->fd = socket(r->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        die("socket: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = C_CONNECTING;
    c->reused = false;
    c->rlen = 0;
    if (connect(c->fd, (struct sockaddr *)&r->addr, r->addr_len) != 0 && errno != EINPROGRESS) {
        die("connect %s:%s: %s", r->o.host, r->o.port, strerror(errno));
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(r->ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        die("epoll_ctl: %s", strerror(errno));
    }
}

static void
want_write(run_t *r, conn_t *c, bool on)
{
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(r->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void
conn_send(run_t *r, conn_t *c, int64_t sched)
{
    c->req = &r->reqs[r->next_row];
    r->next_row = (r->next_row + 1) % r->n_reqs;
    c->sent = 0;
    c->sched_ns = sched;
    c->send_ns = now_ns();
    c->state = C_BUSY;
    if (++r->n_busy > r->max_busy) {
        r->max_busy = r->n_busy;
    }
    if (sched >= r->warm_end && sched < r->end && !c->retry) {
        r->n_sent++;
    }
    if (c->retry) {
        c->retry = false;
        r->n_retry_pending--;
    }
    send_more(r, c);
}

static void
send_more(run_t *r, conn_t *c)
{
    while (c->sent < c->req->len) {
        ssize_t n = send(c->fd, c->req->buf + c->sent, c->req->len - c->sent, MSG_NOSIGNAL);
        if (n > 0) {
            c->sent += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            want_write(r, c, true);
            return;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            bool peer = n < 0 && (errno == EPIPE || errno == ECONNRESET);
            conn_fail(r, c, n < 0 ? strerror(errno) : "send returned 0", peer);
            return;
        }
    }
}

/* A connection is free: the oldest backlogged request goes on it, else it waits. */
static void
conn_free(run_t *r, conn_t *c)
{
    c->state = C_IDLE;
    if (c->retry) {
        conn_send(r, c, c->retry_sched);
        return;
    }
    if (r->o.closed) {
        if (r->scheduling) {
            int64_t t = now_ns();
            conn_send(r, c, t);
        }
        return;
    }
    if (r->bl_n > 0) {
        int64_t s = r->bl_sched[r->bl_head];
        r->bl_head = (r->bl_head + 1) % BACKLOG_CAP;
        r->bl_n--;
        conn_send(r, c, s);
        return;
    }
    if (!c->listed) {
        c->listed = true;
        r->idle[(r->idle_head + r->n_idle++) % r->n_conns] = (int)(c - r->conns);
    }
}

/* Scheduled time t: send now on an idle connection, or backlog it. */
static void
issue(run_t *r, int64_t t)
{
    while (r->n_idle > 0) {
        conn_t *c = &r->conns[r->idle[r->idle_head]];
        r->idle_head = (r->idle_head + 1) % r->n_conns;
        r->n_idle--;
        c->listed = false;
        if (c->state == C_IDLE) {
            conn_send(r, c, t);
            return;
        }
    }
    if (t >= r->warm_end && t < r->end) {
        r->n_backlogged++;
    }
    if (r->bl_n == BACKLOG_CAP) {
        r->n_dropped++;
        return;
    }
    r->bl_sched[(r->bl_head + r->bl_n) % BACKLOG_CAP] = t;
    if (++r->bl_n > r->bl_max) {
        r->bl_max = r->bl_n;
    }
}

/* The integer after "key": in body, or -1. */
static long long
json_int_after(const char *body, size_t len, const char *key)
{
    const char *p = memmem(body, len, key, strlen(key));
    if (p == NULL) {
        return -1;
    }
    p += strlen(key);
    while (p < body + len && (*p == '"' || *p == ':' || *p == ' ')) {
        p++;
    }
    return p < body + len ? strtoll(p, NULL, 10) : -1;
}

/* One whole answer is in c->rbuf[0, total): record it. */
static void
answer(run_t *r, conn_t *c, int status, const char *body, size_t blen, bool close_after)
{
    int64_t done = now_ns();
    r->n_busy--;
    bool counted = in_window(r, c, done);
    if (counted) {
        if (status != 200) {
            r->n_http_err++;
            r->last_status = status;
            snprintf(r->last_err, sizeof r->last_err, "HTTP %d: %.*s", status,
                     (int)(blen < 120 ? blen : 120), body);
        } else {
            bool bad = false;
            if (!isnan(c->req->expect)) {
                const char *d = memmem(body, blen, "\"data\":[", 8);
                double got = d ? strtod(d + 8, NULL) : NAN;
                bad = !(fabs(got - c->req->expect) <= 1e-5 * fmax(1.0, fabs(c->req->expect)));
                if (bad) {
                    r->n_mismatch++;
                    snprintf(r->last_err, sizeof r->last_err, "prediction %.9g, expected %.9g",
                             got, c->req->expect);
                }
            }
            if (!bad) {
                r->n_ok++;
                /* Open loop: from the scheduled time; closed loop: sched == send. */
                samples_add(&r->lat, done - c->sched_ns);
                samples_add(&r->lat_send, done - c->send_ns);
                samples_add(&r->lag, c->send_ns - c->sched_ns);
                long long q = json_int_after(body, blen, "\"queue_time_us\"");
                long long k = json_int_after(body, blen, "\"compute_time_us\"");
                if (q >= 0 && k >= 0) {
                    samples_add(&r->q_us, q);
                    samples_add(&r->c_us, k);
                }
            }
        }
    }
    c->reused = true;
    if (close_after) {
        conn_close(r, c);
        conn_open(r, c);
        return;
    }
    conn_free(r, c);
}

/* Parses what has arrived on c; handles complete answers. */
static void
parse_answers(run_t *r, conn_t *c)
{
    while (c->rlen > 0 && c->state == C_BUSY) {
        char *eoh = memmem(c->rbuf, c->rlen, "\r\n\r\n", 4);
        if (eoh == NULL) {
            return;
        }
        size_t hlen = (size_t)(eoh - c->rbuf) + 4;
        int status = 0;
        if (c->rlen < 12 || memcmp(c->rbuf, "HTTP/1.", 7) != 0 ||
            sscanf(c->rbuf + 9, "%3d", &status) != 1) {
            conn_fail(r, c, "malformed status line", false);
            return;
        }
        long long clen = -1;
        bool close_after = false;
        for (char *l = memchr(c->rbuf, '\n', hlen); l && l < eoh;
             l = memchr(l, '\n', (size_t)(eoh - l))) {
            l++;
            if (strncasecmp(l, "content-length:", 15) == 0) {
                clen = strtoll(l + 15, NULL, 10);
            } else if (strncasecmp(l, "connection:", 11) == 0) {
                const char *v = l + 11;
                while (*v == ' ') {
                    v++;
                }
                close_after = strncasecmp(v, "close", 5) == 0;
            } else if (strncasecmp(l, "transfer-encoding:", 18) == 0) {
                conn_fail(r, c, "chunked answers are not supported by this client", false);
                return;
            }
        }
        if (clen < 0) {
            conn_fail(r, c, "answer without Content-Length", false);
            return;
        }
        size_t total = hlen + (size_t)clen;
        if (total > RBUF_MAX) {
            conn_fail(r, c, "answer too large", false);
            return;
        }
        if (c->rlen < total) {
            return;
        }
        answer(r, c, status, c->rbuf + hlen, (size_t)clen, close_after);
        if (c->fd < 0 || c->state == C_CONNECTING) {
            return;
        }
        memmove(c->rbuf, c->rbuf + total, c->rlen - total);
        c->rlen -= total;
    }
}

static void
on_conn_event(run_t *r, conn_t *c, uint32_t ev)
{
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err != 0) {
            die("connect %s:%s: %s", r->o.host, r->o.port, strerror(err));
        }
        if (!(ev & EPOLLOUT)) {
            return;
        }
        want_write(r, c, false);
        conn_free(r, c);
        return;
    }
    if ((ev & EPOLLOUT) && c->state == C_BUSY) {
        want_write(r, c, false);
        send_more(r, c);
        if (c->state != C_BUSY) {
            return;
        }
    }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        for (;;) {
            if (c->rbuf == NULL && (c->rbuf = malloc(RBUF_MAX)) == NULL) {
                die("out of memory");
            }
            if (c->rlen == RBUF_MAX) {
                conn_fail(r, c, "answer too large", false);
                return;
            }
            ssize_t n = recv(c->fd, c->rbuf + c->rlen, RBUF_MAX - c->rlen, 0);
            if (n > 0) {
                c->rlen += (size_t)n;
                parse_answers(r, c);
                if (c->fd < 0 || c->state == C_CONNECTING) {
                    return;
                }
                continue;
            }
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                return;
            }
            /* EOF or error. An idle keep-alive connection the server closed is reopened
             * without counting an error. */
            if (c->state == C_BUSY) {
                bool peer = n == 0 || errno == ECONNRESET;
                conn_fail(r, c, n == 0 ? "server closed the connection" : strerror(errno), peer);
            } else {
                conn_close(r, c);
                conn_open(r, c);
            }
            return;
        }
    }
}

/* ------------------------------------------------------------------ the run */


static void
run_load(run_t *r)
{
    const opts_t *o = &r->o;
    int n_conns = o->closed ? o->closed : o->connections;
    r->conns = calloc((size_t)n_conns, sizeof *r->conns);
    r->idle = calloc((size_t)n_conns, sizeof *r->idle);
    r->n_conns = n_conns;
    r->bl_sched = o->closed ? NULL : malloc(BACKLOG_CAP * sizeof *r->bl_sched);
    if (r->conns == NULL || r->idle == NULL || (!o->closed && r->bl_sched == NULL)) {
        die("out of memory");
    }
    r->ep = epoll_create1(EPOLL_CLOEXEC);
    r->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (r->ep < 0 || r->tfd < 0) {
        die("epoll/timerfd: %s", strerror(errno));
    }
    struct epoll_event tev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(r->ep, EPOLL_CTL_ADD, r->tfd, &tev);

    /* Connect everything first (up to 5 s), outside the measured time. The closed loop must not
     * start sending while connecting, so scheduling is off until then. */
    r->scheduling = false;
    for (int i = 0; i < n_conns; i++) {
        r->conns[i].fd = -1;
        conn_open(r, &r->conns[i]);
    }
    struct epoll_event evs[256];
    int64_t cdead = now_ns() + 5 * NS;
    while (r->n_idle < n_conns && !o->closed && now_ns() < cdead) {
        int n = epoll_wait(r->ep, evs, 256, 100);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr) {
                on_conn_event(r, evs[i].data.ptr, evs[i].events);
            }
        }
    }
    if (o->closed) {
        int ready = 0;
        while (ready < n_conns && now_ns() < cdead) {
            int n = epoll_wait(r->ep, evs, 256, 100);
            for (int i = 0; i < n; i++) {
                if (evs[i].data.ptr) {
                    on_conn_event(r, evs[i].data.ptr, evs[i].events);
                }
            }
            ready = 0;
            for (int i = 0; i < n_conns; i++) {
                ready += r->conns[i].state == C_IDLE;
            }
        }
        if (ready < n_conns) {
            die("only %d of %d connections opened in 5 s", ready, n_conns);
        }
    } else if (r->n_idle < n_conns) {
        die("only %d of %d connections opened in 5 s", r->n_idle, n_conns);
    }

    r->t0 = now_ns() + NS / 100;
    r->warm_end = r->t0 + (int64_t)(o->warmup_s * NS);
    r->end = r->warm_end + (int64_t)(o->duration_s * NS);
    r->drain_end = r->end + (int64_t)(o->drain_s * NS);
    r->scheduling = true;
    int64_t next = r->t0, armed = -1;
    if (o->closed) {
        for (int i = 0; i < n_conns; i++) {
            conn_send(r, &r->conns[i], r->t0);
        }
    }
    while (!lg_interrupted) {
        int64_t t = now_ns();
        if (r->scheduling && !o->closed) {
            while (next <= t && next < r->end) {
                issue(r, next);
                next += lg_next_gap_ns(&r->rng, r->o.rate, r->o.schedule);
            }
            if (next >= r->end) {
                r->scheduling = false;
            }
        }
        if (r->scheduling && o->closed && t >= r->end) {
            r->scheduling = false;
        }
        if (!r->scheduling && r->n_busy == 0 && r->bl_n == 0 && r->n_retry_pending == 0) {
            break;
        }
        if (t >= r->drain_end) {
            break;
        }
        int64_t wake = r->drain_end;
        if (r->scheduling) {
            wake = o->closed ? r->end : next;
        }
        if (wake != armed) {
            lg_arm_timer(r->tfd, wake);
            armed = wake;
        }
        int n = epoll_wait(r->ep, evs, 256, 1000);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                uint64_t x;
                if (read(r->tfd, &x, sizeof x) < 0) {
                    /* EAGAIN: another wake-up already consumed it */
                }
                armed = -1;
                continue;
            }
            conn_t *c = evs[i].data.ptr;
            if (c->fd >= 0) {
                on_conn_event(r, c, evs[i].events);
            }
        }
    }
    /* Requests of the window still unanswered (or never sent) are failures (open loop). */
    if (!o->closed) {
        for (int i = 0; i < n_conns; i++) {
            conn_t *c = &r->conns[i];
            if (c->state == C_BUSY && c->sched_ns >= r->warm_end && c->sched_ns < r->end) {
                r->n_unfinished++;
            }
            if (c->retry && c->retry_sched >= r->warm_end && c->retry_sched < r->end) {
                r->n_unfinished++;
            }
        }
        for (size_t k = 0; k < r->bl_n; k++) {
            int64_t s = r->bl_sched[(r->bl_head + k) % BACKLOG_CAP];
            r->n_unfinished += s >= r->warm_end && s < r->end;
        }
    }
    for (int i = 0; i < n_conns; i++) {
        conn_close(r, &r->conns[i]);
        free(r->conns[i].rbuf);
    }
}

/* ------------------------------------------------------------------ report */

static void
report(run_t *r, double cpu_s)
{
    const opts_t *o = &r->o;
    FILE *f = stdout;
    if (o->json_path && (f = fopen(o->json_path, "w")) == NULL) {
        die("%s: %s", o->json_path, strerror(errno));
    }
    uint64_t errors = r->n_http_err + r->n_conn_err + r->n_mismatch + r->n_unfinished +
                      r->n_dropped;
    double achieved = (double)r->n_ok / o->duration_s;
    fprintf(f, "{\"label\":\"%s\",\"mode\":\"%s\",\"model\":\"%s\",\"binary\":%s,",
            o->label ? o->label : "", o->closed ? "closed" : "open", o->model,
            o->binary ? "true" : "false");
    if (o->closed) {
        fprintf(f, "\"concurrency\":%d,", o->closed);
    } else {
        fprintf(f, "\"offered_rps\":%.1f,\"schedule\":\"%s\",\"connections\":%d,", o->rate,
                o->schedule, o->connections);
    }
    fprintf(f, "\"duration_s\":%.3f,\"warmup_s\":%.3f,\"sent\":%llu,\"ok\":%llu,"
            "\"achieved_rps\":%.1f,\"errors\":%llu,\"http_errors\":%llu,\"conn_errors\":%llu,"
            "\"mismatches\":%llu,\"unfinished\":%llu,\"dropped\":%llu,\"backlogged\":%llu,"
            "\"backlog_max\":%zu,\"max_in_flight\":%d,\"retries\":%llu,\"generator_cpu_s\":%.3f,"
            "\"generator_cpu_pct\":%.1f,", o->duration_s, o->warmup_s,
            (unsigned long long)r->n_sent, (unsigned long long)r->n_ok, achieved,
            (unsigned long long)errors, (unsigned long long)r->n_http_err,
            (unsigned long long)r->n_conn_err, (unsigned long long)r->n_mismatch,
            (unsigned long long)r->n_unfinished, (unsigned long long)r->n_dropped,
            (unsigned long long)r->n_backlogged, r->bl_max, r->max_busy,
            (unsigned long long)r->n_retries, cpu_s, 100.0 * cpu_s / (o->warmup_s + o->duration_s));
    lg_put_tail(f, &r->lat, &r->lat_send, &r->lag, &r->q_us, &r->c_us, r->last_err);

    fprintf(stderr, "%s%s%s%s", o->label ? "[" : "", o->label ? o->label : "",
            o->label ? "] " : "", o->closed ? "closed loop" : "open loop");
    if (o->closed) {
        fprintf(stderr, " c=%d", o->closed);
    } else {
        fprintf(stderr, " %.0f req/s (%s, %d conns)", o->rate, o->schedule, o->connections);
    }
    fprintf(stderr, " %.1fs: %.1f ok/s, %llu errors; latency ms p50 %.3f p90 %.3f p99 %.3f "
            "p99.9 %.3f max %.3f (p99 from the actual send %.3f); send lag p50 %.3f p99 %.3f ms; "
            "server queue p99 %.3f compute p99 %.3f ms; "
            "backlogged %llu (max %zu), max in flight %d, retries %llu; generator cpu %.0f%%\n",
            o->duration_s, achieved, (unsigned long long)errors,
            (double)pct(&r->lat, 0.5) * 1e-6, (double)pct(&r->lat, 0.9) * 1e-6,
            (double)pct(&r->lat, 0.99) * 1e-6, (double)pct(&r->lat, 0.999) * 1e-6,
            (double)pct(&r->lat, 1.0) * 1e-6, (double)pct(&r->lat_send, 0.99) * 1e-6,
            (double)pct(&r->lag, 0.5) * 1e-6, (double)pct(&r->lag, 0.99) * 1e-6,
            (double)pct(&r->q_us, 0.99) * 1e-3, (double)pct(&r->c_us, 0.99) * 1e-3,
            (unsigned long long)r->n_backlogged, r->bl_max, r->max_busy,
            (unsigned long long)r->n_retries, 100.0 * cpu_s / (o->warmup_s + o->duration_s));
    if (errors) {
        fprintf(stderr, "  errors: http %llu, connection %llu, mismatch %llu, unfinished %llu, "
                "dropped %llu; last: %s\n", (unsigned long long)r->n_http_err,
                (unsigned long long)r->n_conn_err, (unsigned long long)r->n_mismatch,
                (unsigned long long)r->n_unfinished, (unsigned long long)r->n_dropped, r->last_err);
    }
}

/* ------------------------------------------------------------------ main */

static const char usage[] =
    "usage: kserve_load --model NAME --csv ROWS.csv (--rate R | --closed C) [options]\n"
    "  --url URL          http://HOST:PORT (default http://127.0.0.1:8000)\n"
    "  --model NAME       model to call: POST /v2/models/NAME/infer\n"
    "  --csv FILE         one request per row (header skipped), cycled\n"
    "  --first-col N      first feature column, 0-based (default 1)\n"
    "  --n-cols N         features per row (default 30)\n"
    "  --input NAME       input tensor name (default input__0)\n"
    "  --binary           binary tensor extension instead of JSON data\n"
    "  --expect FILE      CSV, last column = expected first output value per row\n"
    "  --rate R           open loop: R requests/s\n"
    "  --schedule S       poisson (default) or uniform arrivals\n"
    "  --connections N    open loop: keep-alive connections (default 64)\n"
    "  --closed C         closed loop: C connections, back to back\n"
    "  --duration S       measured seconds (default 10)\n"
    "  --warmup S         unmeasured seconds first (default 2)\n"
    "  --drain S          wait at most S s for answers after the end (default 2)\n"
    "  --seed N           arrival schedule seed (default 1)\n"
    "  --label NAME       name of the run in the output\n"
    "  --json FILE        write the JSON result there (default stdout)\n";

static void
parse_url(opts_t *o, const char *url)
{
    if (strncmp(url, "http://", 7) != 0) {
        die("--url: only http://HOST:PORT is supported");
    }
    const char *h = url + 7, *colon = strrchr(h, ':');
    const char *slash = strchr(h, '/');
    size_t hl = colon ? (size_t)(colon - h) : strcspn(h, "/");
    if (hl == 0 || hl >= sizeof o->host) {
        die("--url: bad host in %s", url);
    }
    memcpy(o->host, h, hl);
    o->host[hl] = '\0';
    if (colon) {
        size_t pl = slash && slash > colon ? (size_t)(slash - colon - 1) : strlen(colon + 1);
        if (pl == 0 || pl >= sizeof o->port) {
            die("--url: bad port in %s", url);
        }
        memcpy(o->port, colon + 1, pl);
        o->port[pl] = '\0';
    } else {
        snprintf(o->port, sizeof o->port, "80");
    }
}

int
main(int argc, char **argv)
{
    run_t r;
    memset(&r, 0, sizeof r);
    opts_t *o = &r.o;
    parse_url(o, "http://127.0.0.1:8000");
    o->input = "input__0";
    o->schedule = "poisson";
    o->first_col = 1;
    o->n_cols = 30;
    o->connections = 64;
    o->duration_s = 10;
    o->warmup_s = 2;
    o->drain_s = 2;
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--binary") == 0) {
            o->binary = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kserve_load: %s needs a value\n%s", a, usage);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--url") == 0) {
            parse_url(o, v);
        } else if (strcmp(a, "--model") == 0) {
            o->model = v;
        } else if (strcmp(a, "--csv") == 0) {
            o->csv = v;
        } else if (strcmp(a, "--expect") == 0) {
            o->expect = v;
        } else if (strcmp(a, "--input") == 0) {
            o->input = v;
        } else if (strcmp(a, "--label") == 0) {
            o->label = v;
        } else if (strcmp(a, "--json") == 0) {
            o->json_path = v;
        } else if (strcmp(a, "--schedule") == 0) {
            if (strcmp(v, "poisson") != 0 && strcmp(v, "uniform") != 0) {
                die("--schedule: poisson or uniform");
            }
            o->schedule = v;
        } else if (strcmp(a, "--first-col") == 0) {
            o->first_col = (int)lg_num_arg(a, v, 0, MAX_COLS - 1);
        } else if (strcmp(a, "--n-cols") == 0) {
            o->n_cols = (int)lg_num_arg(a, v, 1, MAX_COLS - 1);
        } else if (strcmp(a, "--connections") == 0) {
            o->connections = (int)lg_num_arg(a, v, 1, MAX_CONNS);
        } else if (strcmp(a, "--closed") == 0) {
            o->closed = (int)lg_num_arg(a, v, 1, MAX_CONNS);
        } else if (strcmp(a, "--rate") == 0) {
            o->rate = lg_num_arg(a, v, 0.1, 1e7);
        } else if (strcmp(a, "--duration") == 0) {
            o->duration_s = lg_num_arg(a, v, 0.1, 3600);
        } else if (strcmp(a, "--warmup") == 0) {
            o->warmup_s = lg_num_arg(a, v, 0, 3600);
        } else if (strcmp(a, "--drain") == 0) {
            o->drain_s = lg_num_arg(a, v, 0, 600);
        } else if (strcmp(a, "--seed") == 0) {
            o->seed = (uint64_t)lg_num_arg(a, v, 0, 1e15);
        } else {
            fprintf(stderr, "kserve_load: unknown option %s\n%s", a, usage);
            return 2;
        }
    }
    if (o->model == NULL || o->csv == NULL || (o->rate > 0) == (o->closed > 0)) {
        fprintf(stderr, "kserve_load: --model, --csv and one of --rate / --closed are needed\n%s",
                usage);
        return 2;
    }
    r.rng = o->seed * 0x9E3779B97F4A7C15ULL + 1;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    int gai = getaddrinfo(o->host, o->port, &hints, &ai);
    if (gai != 0) {
        die("%s:%s: %s", o->host, o->port, gai_strerror(gai));
    }
    memcpy(&r.addr, ai->ai_addr, ai->ai_addrlen);
    r.addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);

    load_rows(&r);
    /* The default 50 us timer slack would add up to 50 us to every scheduled send. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    signal(SIGINT, lg_on_sigint);
    signal(SIGPIPE, SIG_IGN);

    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    run_load(&r);
    getrusage(RUSAGE_SELF, &u1);
    double cpu = (double)(u1.ru_utime.tv_sec - u0.ru_utime.tv_sec) +
                 (double)(u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) +
                 1e-6 * (double)(u1.ru_utime.tv_usec - u0.ru_utime.tv_usec +
                                 u1.ru_stime.tv_usec - u0.ru_stime.tv_usec);
    report(&r, cpu);
    uint64_t errors = r.n_http_err + r.n_conn_err + r.n_mismatch + r.n_unfinished + r.n_dropped;
    return lg_interrupted ? 1 : errors ? 1 : 0;
}
