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
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

static const char *const lg_prog = "kserve_load";
#include "loadgen.h"

#define MAX_CONNS 4096
#define RBUF_MAX (1 << 20)       /* one answer; more is a protocol error */
#define MAX_RECONNECTS 1000      /* a server that keeps dropping us ends the run */

/* ------------------------------------------------------------------ options, data */

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
    lg_opts_t o;
    bool binary; /* --binary */
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
    lg_backlog_t bl;
    lg_window_t w;
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
    const lg_opts_t *o = &r->o;
    size_t cap = 1024, len = 0, blen = 0, bcap = 1024;
    char *body = malloc(bcap), *head = malloc(cap);
    if (body == NULL || head == NULL) {
        die("out of memory");
    }
    bprintf(&body, &blen, &bcap,
            "{\"inputs\":[{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[1,%d],", o->input,
            o->n_cols);
    size_t json_len = 0;
    if (r->binary) {
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
            r->binary ? "application/octet-stream" : "application/json", blen);
    if (r->binary) {
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
    return lg_counts(&r->w, &r->o, c->sched_ns, done);
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
        r->w.drain_end = now_ns();
        return;
    }
    conn_open(r, c);
}

static void
conn_open(run_t *r, conn_t *c)
{
    c->fd = lg_connect(&r->o, &r->addr, r->addr_len, r->ep, c);
    c->state = C_CONNECTING;
    c->reused = false;
    c->rlen = 0;
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
    if (lg_in_window(&r->w, sched) && !c->retry) {
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
    if (r->bl.n > 0) {
        conn_send(r, c, lg_backlog_pop(&r->bl));
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
    lg_backlog_push(&r->bl, t, lg_in_window(&r->w, t));
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
        lg_check_connected(&r->o, c->fd);
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
    const lg_opts_t *o = &r->o;
    int n_conns = o->closed ? o->closed : o->connections;
    r->conns = calloc((size_t)n_conns, sizeof *r->conns);
    r->idle = calloc((size_t)n_conns, sizeof *r->idle);
    r->n_conns = n_conns;
    if (r->conns == NULL || r->idle == NULL) {
        die("out of memory");
    }
    if (!o->closed) {
        lg_backlog_alloc(&r->bl);
    }
    lg_open_epoll(&r->ep, &r->tfd);

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

    lg_window_start(&r->w, o);
    r->scheduling = true;
    int64_t next = r->w.t0, armed = -1;
    if (o->closed) {
        for (int i = 0; i < n_conns; i++) {
            conn_send(r, &r->conns[i], r->w.t0);
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
        if (!r->scheduling && r->n_busy == 0 && r->bl.n == 0 && r->n_retry_pending == 0) {
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
            if (c->state == C_BUSY && lg_in_window(&r->w, c->sched_ns)) {
                r->n_unfinished++;
            }
            if (c->retry && lg_in_window(&r->w, c->retry_sched)) {
                r->n_unfinished++;
            }
        }
        r->n_unfinished += lg_backlog_in_window(&r->bl, &r->w);
    }
    for (int i = 0; i < n_conns; i++) {
        conn_close(r, &r->conns[i]);
        free(r->conns[i].rbuf);
    }
}

/* ------------------------------------------------------------------ report */

static uint64_t
n_errors(const run_t *r)
{
    return r->n_http_err + r->n_conn_err + r->n_mismatch + r->n_unfinished + r->bl.n_dropped;
}

static void
report(run_t *r, double cpu_s)
{
    const lg_opts_t *o = &r->o;
    FILE *f = lg_open_json(o->json_path);
    uint64_t errors = n_errors(r);
    double achieved = (double)r->n_ok / o->duration_s;
    fprintf(f, "{\"label\":\"%s\",\"mode\":\"%s\",\"model\":\"%s\",\"binary\":%s,",
            o->label ? o->label : "", o->closed ? "closed" : "open", o->model,
            r->binary ? "true" : "false");
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
            (unsigned long long)r->n_unfinished, (unsigned long long)r->bl.n_dropped,
            (unsigned long long)r->bl.n_backlogged, r->bl.max, r->max_busy,
            (unsigned long long)r->n_retries, cpu_s, 100.0 * cpu_s / (o->warmup_s + o->duration_s));
    lg_put_tail(f, &r->lat, &r->lat_send, &r->lag, &r->q_us, &r->c_us, r->last_err);

    lg_summary_head(o, o->closed ? "closed loop" : "open loop");
    if (o->closed) {
        fprintf(stderr, " c=%d", o->closed);
    } else {
        fprintf(stderr, " %.0f req/s (%s, %d conns)", o->rate, o->schedule, o->connections);
    }
    fprintf(stderr, " %.1fs: %.1f ok/s, %llu errors; ", o->duration_s, achieved,
            (unsigned long long)errors);
    lg_summary_latency(&r->lat, &r->lat_send, &r->lag, &r->q_us, &r->c_us);
    fprintf(stderr, "backlogged %llu (max %zu), max in flight %d, retries %llu; generator cpu "
            "%.0f%%\n", (unsigned long long)r->bl.n_backlogged, r->bl.max, r->max_busy,
            (unsigned long long)r->n_retries, 100.0 * cpu_s / (o->warmup_s + o->duration_s));
    if (errors) {
        fprintf(stderr, "  errors: http %llu, connection %llu, mismatch %llu, unfinished %llu, "
                "dropped %llu; last: %s\n", (unsigned long long)r->n_http_err,
                (unsigned long long)r->n_conn_err, (unsigned long long)r->n_mismatch,
                (unsigned long long)r->n_unfinished, (unsigned long long)r->bl.n_dropped,
                r->last_err);
    }
}

/* ------------------------------------------------------------------ main */

static const char usage[] =
    "usage: kserve_load --model NAME --csv ROWS.csv (--rate R | --closed C) [options]\n"
    "  --url URL          http://HOST:PORT (default http://127.0.0.1:8000)\n"
    "  --model NAME       model to call: POST /v2/models/NAME/infer\n"
    "  --csv FILE         one request per row (header skipped), cycled\n"
    LG_USAGE_COLUMNS
    "  --binary           binary tensor extension instead of JSON data\n"
    "  --expect FILE      CSV, last column = expected first output value per row\n"
    "  --rate R           open loop: R requests/s\n"
    "  --schedule S       poisson (default) or uniform arrivals\n"
    "  --connections N    open loop: keep-alive connections (default 64)\n"
    "  --closed C         closed loop: C connections, back to back\n"
    LG_USAGE_RUN;

static void
parse_url(lg_opts_t *o, const char *url)
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
    lg_opts_t *o = &r.o;
    parse_url(o, "http://127.0.0.1:8000");
    lg_opts_defaults(o, 64);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--binary") == 0) {
            r.binary = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kserve_load: %s needs a value\n%s", a, usage);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--url") == 0) {
            parse_url(o, v);
        } else if (!lg_parse_opt(o, a, v, MAX_CONNS, MAX_CONNS)) {
            fprintf(stderr, "kserve_load: unknown option %s\n%s", a, usage);
            return 2;
        }
    }
    lg_check_opts(o, usage);
    r.rng = o->seed * 0x9E3779B97F4A7C15ULL + 1;
    lg_resolve(o, &r.addr, &r.addr_len);

    load_rows(&r);
    lg_prepare_run();
    double cpu0 = lg_cpu_s();
    run_load(&r);
    report(&r, lg_cpu_s() - cpu0);
    return lg_interrupted ? 1 : n_errors(&r) ? 1 : 0;
}
