/*
 * serve_harness.h - a whole `sampan serve` inside a libFuzzer process, for
 * the targets that fuzz request handling (fuzz_openai, fuzz_kserve,
 * fuzz_http).
 *
 * Why the whole server and not a parsing function: the OpenAI and KServe
 * validation (every field's type and range, prompt tokenization, the chat
 * template, the KServe generate parameters) lives in the route handlers, which
 * answer through the HTTP connection they were given. Driving them through a
 * real loopback connection tests exactly what a client reaches, including the
 * HTTP layer's limits, the router, the error writer, the scheduler hand-off and
 * the response encoders.
 *
 * The server (sp_cmd_serve, the same entry point as `sampan serve`) starts once
 * per process on a thread, on 127.0.0.1 and a free port, serving the demo model
 * models/stories260K.gguf ($SP_FUZZ_MODEL overrides) with a small context and
 * max_tokens cap so that inputs that do reach generation stay cheap. It logs
 * every request and (masked) prompts and outputs, to a sink that only checks
 * each line (one line, no raw control bytes: client text must arrive escaped,
 * RELIABILITY.md H13); SP_FUZZ_LOG=1 prints the lines too.
 *
 * Each input is one exchange on a fresh connection; sp_fuzz_exchange returns
 * the raw answer. The checks every target shares:
 *   - the server answers or closes within SP_FUZZ_ANSWER_S seconds (else the
 *     target aborts: a hang);
 *   - no answer is 500 (an internal error caused by input is a bug);
 *   - every answer head is "HTTP/1.x NNN ..." and, for the framed requests the
 *     harness writes itself, every application/json body is valid JSON, every
 *     4xx/5xx body is a JSON object with an "error", and every event of an
 *     event stream is valid JSON.
 * The server runs in this process, so ASan and UBSan see its threads too.
 */
#ifndef SP_FUZZ_SERVE_HARNESS_H
#define SP_FUZZ_SERVE_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "sampan/log.h"
#include "server/server.h"

/* Each target uses a different part of the harness. */
#define SP_FUZZ_FN static __attribute__((unused))

#define SP_FUZZ_ANSWER_S 8
#define SP_FUZZ_RESP_CAP (1u << 20)

static atomic_int sp_fuzz_port;
static atomic_int sp_fuzz_ready;
static atomic_int sp_fuzz_exited;
static int sp_fuzz_verbose;

SP_FUZZ_FN void
sp_fuzz_die(const char *what, const char *detail, size_t n)
{
    fprintf(stderr, "fuzz harness: %s\n", what);
    if (detail) {
        fprintf(stderr, "---\n%.*s\n---\n", (int)(n > 4000 ? 4000 : n), detail);
    }
    abort();
}

SP_FUZZ_FN void
sp_fuzz_log_sink(sp_log_level_t level, const char *line, void *ud)
{
    (void)level;
    (void)ud;
    for (const unsigned char *p = (const unsigned char *)line; *p; p++) {
        if (*p < 0x20 || *p == 0x7f) {
            sp_fuzz_die("a log line carries a raw control byte (H13)", line, strlen(line));
        }
    }
    if (sp_fuzz_verbose) {
        fprintf(stderr, "%s\n", line);
    }
    if (atomic_load(&sp_fuzz_port) == 0) {
        const char *u = strstr(line, "url=http://127.0.0.1:");
        if (u) {
            atomic_store(&sp_fuzz_port, atoi(u + strlen("url=http://127.0.0.1:")));
        }
    }
    if (strstr(line, "event=ready")) {
        atomic_store(&sp_fuzz_ready, 1);
    }
}

typedef struct sp_fuzz_args {
    int argc;
    char *argv[64];
} sp_fuzz_args_t;

SP_FUZZ_FN void *
sp_fuzz_serve_main(void *arg)
{
    sp_fuzz_args_t *a = arg;
    int rc = sp_cmd_serve(a->argc, a->argv);
    fprintf(stderr, "fuzz harness: the server exited with %d\n", rc);
    atomic_store(&sp_fuzz_exited, 1);
    return NULL;
}

/* Start the server once; extra flags (NULL-terminated) follow the defaults. */
SP_FUZZ_FN void
sp_fuzz_serve_start(const char *const *extra)
{
    static sp_fuzz_args_t a;
    static char model[1100];
    if (atomic_load(&sp_fuzz_port) != 0) {
        return;
    }
    sp_fuzz_verbose = getenv("SP_FUZZ_LOG") != NULL;
    const char *path = getenv("SP_FUZZ_MODEL") ? getenv("SP_FUZZ_MODEL") : "models/stories260K.gguf";
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "fuzz harness: cannot read %s: run from the repository root or set "
                        "SP_FUZZ_MODEL\n", path);
        exit(1);
    }
    snprintf(model, sizeof model, "stories260K=%s", path);
    static const char *const base[] = {
        "serve", "--model", NULL, "--port", "0", "--threads", "1", "--parallel", "2",
        "--ctx-size", "128", "--max-tokens", "8", "--max-n", "2", "--max-logprobs", "4",
        "--log-requests", "all", "--log-prompts", "--request-timeout", "5", NULL};
    a.argc = 0;
    for (int i = 0; base[i] || i == 2; i++) {
        a.argv[a.argc++] = (char *)(i == 2 ? model : base[i]);
    }
    for (int i = 0; extra && extra[i] && a.argc < 63; i++) {
        a.argv[a.argc++] = (char *)extra[i];
    }
    a.argv[a.argc] = NULL;
    sp_log_set(sp_fuzz_log_sink, NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, sp_fuzz_serve_main, &a) != 0) {
        sp_fuzz_die("cannot start the server thread", NULL, 0);
    }
    pthread_detach(t);
    for (int i = 0; i < 3000 && !(atomic_load(&sp_fuzz_port) && atomic_load(&sp_fuzz_ready)); i++) {
        if (atomic_load(&sp_fuzz_exited)) {
            exit(1);
        }
        usleep(10000);
    }
    if (!atomic_load(&sp_fuzz_port) || !atomic_load(&sp_fuzz_ready)) {
        sp_fuzz_die("the server did not get ready within 30 s", NULL, 0);
    }
}

/* One connection: send req, then (half_close) shut the write side, and read
 * until the server closes. Returns the answer's length (up to cap bytes are
 * kept; the rest is read and dropped). */
SP_FUZZ_FN size_t
sp_fuzz_exchange(const char *req, size_t len, bool half_close, char *resp, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        sp_fuzz_die("socket() failed", strerror(errno), strlen(strerror(errno)));
    }
    struct timeval tv = {SP_FUZZ_ANSWER_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    /* The server closes first, so every exchange leaves a TIME_WAIT entry for
     * (server port, client address, client port) for 60 s. At a few thousand
     * inputs a second from one source address that exhausts the 28k ephemeral
     * ports in well under a minute and connect() starts failing, which is the
     * harness's problem, not the server's. Each connection therefore comes
     * from its own address in 127.0.0.0/8 (all of it is loopback). */
    static atomic_uint src_seq;
    unsigned k = atomic_fetch_add(&src_seq, 1) % 65000u;
    struct sockaddr_in src;
    memset(&src, 0, sizeof src);
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7f010000u + 1u + k); /* 127.1.x.y */
#ifdef IP_BIND_ADDRESS_NO_PORT
    int one = 1; /* pick the port at connect(), knowing the destination */
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
#endif
    if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) {
        sp_fuzz_die("bind() to a loopback source address failed", strerror(errno),
                    strlen(strerror(errno)));
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atomic_load(&sp_fuzz_port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc != 0 && errno == EINTR) {
        /* libFuzzer's -timeout alarm fires every second; an interrupted
         * connect() goes on in the background, so wait for it to finish. */
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        while ((rc = poll(&pfd, 1, SP_FUZZ_ANSWER_S * 1000)) < 0 && errno == EINTR) {
        }
        if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) {
            rc = 0;
        } else {
            errno = rc == 0 ? ETIMEDOUT : err ? err : errno;
            rc = -1;
        }
    }
    if (rc != 0) {
        sp_fuzz_die("the server refused a connection (did it die?)", strerror(errno),
                    strlen(strerror(errno)));
    }
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break; /* the server closed early (an error answer): read it */
        }
        off += (size_t)n;
    }
    if (half_close) {
        shutdown(fd, SHUT_WR);
    }
    size_t got = 0;
    char drop[4096];
    for (;;) {
        char *dst = got < cap ? resp + got : drop;
        size_t room = got < cap ? cap - got : sizeof drop;
        ssize_t n = recv(fd, dst, room, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            sp_fuzz_die("no answer and no close within the deadline (a hang)", req, len);
        }
        if (n <= 0) {
            break; /* closed (or reset after an early error answer) */
        }
        if (got < cap) {
            got += (size_t)n;
        }
    }
    close(fd);
    return got;
}

/* ---- answer checks */

typedef struct sp_fuzz_resp {
    int status;
    const char *body; /* de-chunked when the answer was chunked (in scratch) */
    size_t body_len;
    char ctype[128];
    bool chunked;
} sp_fuzz_resp_t;

SP_FUZZ_FN const char *
sp_fuzz_memmem(const char *h, size_t hn, const char *n)
{
    return memmem(h, hn, n, strlen(n));
}

/* Header value of name in head[0..n) (case-insensitive), copied into out. */
SP_FUZZ_FN bool
sp_fuzz_header(const char *head, size_t n, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = head, *end = head + n;
    while (p < end) {
        const char *eol = sp_fuzz_memmem(p, (size_t)(end - p), "\r\n");
        if (!eol) {
            eol = end;
        }
        if ((size_t)(eol - p) > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
            const char *v = p + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t')) {
                v++;
            }
            size_t vl = (size_t)(eol - v) < cap - 1 ? (size_t)(eol - v) : cap - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return true;
        }
        p = eol + 2;
    }
    return false;
}

/* Parse the first answer in buf (skipping 100 Continue). Returns false when
 * the head is malformed; the body is left to the caller. scratch (cap
 * bytes) receives a de-chunked body. */
SP_FUZZ_FN bool
sp_fuzz_parse_resp(const char *buf, size_t n, char *scratch, size_t cap, sp_fuzz_resp_t *r)
{
    memset(r, 0, sizeof *r);
    for (;;) {
        if (n < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || (buf[7] != '0' && buf[7] != '1') ||
            buf[8] != ' ' || buf[9] < '1' || buf[9] > '5') {
            return false;
        }
        r->status = atoi(buf + 9);
        const char *eoh = sp_fuzz_memmem(buf, n, "\r\n\r\n");
        if (!eoh) {
            return false;
        }
        size_t hl = (size_t)(eoh - buf) + 4;
        if (r->status == 100) {
            buf += hl;
            n -= hl;
            continue;
        }
        char v[64];
        sp_fuzz_header(buf, hl, "Content-Type", r->ctype, sizeof r->ctype);
        r->chunked = sp_fuzz_header(buf, hl, "Transfer-Encoding", v, sizeof v) &&
                     strcasecmp(v, "chunked") == 0;
        const char *body = buf + hl;
        size_t bl = n - hl;
        if (sp_fuzz_header(buf, hl, "Content-Length", v, sizeof v)) {
            size_t cl = strtoull(v, NULL, 10);
            if (cl > bl) {
                return false; /* closed before the announced body */
            }
            bl = cl;
        } else if (r->chunked) {
            size_t o = 0, w = 0;
            for (;;) {
                const char *e = sp_fuzz_memmem(body + o, bl - o, "\r\n");
                if (!e) {
                    return false;
                }
                size_t sz = strtoull(body + o, NULL, 16);
                o = (size_t)(e - body) + 2;
                if (sz == 0) {
                    break;
                }
                if (sz > bl - o || w + sz > cap) {
                    return false;
                }
                memcpy(scratch + w, body + o, sz);
                w += sz;
                o += sz + 2;
                if (o > bl) {
                    return false;
                }
            }
            body = scratch;
            bl = w;
        }
        r->body = body;
        r->body_len = bl;
        return true;
    }
}

SP_FUZZ_FN void
sp_fuzz_need_json(const char *what, const char *s, size_t n, const char *req, size_t req_len,
                  bool error_object)
{
    json_error_t je;
    json_t *j = json_loadb(s, n, 0, &je);
    bool ok = j != NULL;
    if (ok && error_object) {
        const json_t *e = json_is_object(j) ? json_object_get(j, "error") : NULL;
        ok = e && (json_is_string(e) ||
                   (json_is_object(e) && json_is_string(json_object_get(e, "message"))));
    }
    json_decref(j);
    if (!ok) {
        fprintf(stderr, "fuzz harness: request:\n%.*s\n", (int)(req_len > 4000 ? 4000 : req_len),
                req);
        sp_fuzz_die(what, s, n);
    }
}

/* The full checks for an answer to a request the harness framed itself
 * (exactly one request, Connection: close). */
SP_FUZZ_FN void
sp_fuzz_check_answer(const char *resp, size_t n, const char *req, size_t req_len)
{
    static char *scratch;
    if (!scratch) {
        scratch = malloc(SP_FUZZ_RESP_CAP);
    }
    sp_fuzz_resp_t r;
    if (n >= SP_FUZZ_RESP_CAP) {
        return; /* kept only a prefix: nothing to judge the framing by */
    }
    if (!sp_fuzz_parse_resp(resp, n, scratch, SP_FUZZ_RESP_CAP, &r)) {
        fprintf(stderr, "fuzz harness: request:\n%.*s\n", (int)(req_len > 4000 ? 4000 : req_len),
                req);
        sp_fuzz_die("malformed or truncated answer", resp, n);
    }
    if (r.status == 500) {
        sp_fuzz_die("500 Internal Server Error for a request", req, req_len);
    }
    if (strncmp(r.ctype, "application/json", 16) == 0) {
        sp_fuzz_need_json(r.status >= 400 ? "error answer is not a JSON error object"
                                          : "JSON answer does not parse",
                          r.body, r.body_len, req, req_len, r.status >= 400);
    } else if (r.status >= 400) {
        sp_fuzz_die("error answer is not application/json", resp, n);
    } else if (strncmp(r.ctype, "text/event-stream", 17) == 0) {
        /* Every `data: ` event is JSON, except OpenAI's final [DONE]. */
        const char *p = r.body, *end = r.body + r.body_len;
        while (p < end) {
            const char *eol = memchr(p, '\n', (size_t)(end - p));
            if (!eol) {
                eol = end;
            }
            if (eol - p > 6 && memcmp(p, "data: ", 6) == 0 &&
                !(eol - p == 12 && memcmp(p + 6, "[DONE]", 6) == 0)) {
                sp_fuzz_need_json("an event-stream event does not parse", p + 6,
                                  (size_t)(eol - p - 6), req, req_len, false);
            }
            p = eol + 1;
        }
    }
}

/* POST body to path as one well-framed request; extra_headers (may be NULL) is
 * inserted verbatim (each line ending in \r\n). Checks the answer; returns its
 * status. */
SP_FUZZ_FN int
sp_fuzz_post(const char *path, const char *extra_headers, const uint8_t *body, size_t len)
{
    static char *resp;
    if (!resp) {
        resp = malloc(SP_FUZZ_RESP_CAP + 1);
    }
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "%sContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      path, extra_headers ? extra_headers : "", len);
    if (hn < 0 || (size_t)hn >= sizeof head) {
        abort();
    }
    char *req = malloc((size_t)hn + len + 1);
    if (!req) {
        return 0;
    }
    memcpy(req, head, (size_t)hn);
    if (len) {
        memcpy(req + hn, body, len);
    }
    size_t n = sp_fuzz_exchange(req, (size_t)hn + len, false, resp, SP_FUZZ_RESP_CAP);
    if (sp_fuzz_verbose) {
        fprintf(stderr, "answer: %.*s\n", (int)(n > 600 ? 600 : n), resp);
    }
    sp_fuzz_check_answer(resp, n, req, (size_t)hn + len);
    int status = n >= 12 ? atoi(resp + 9) : 0;
    free(req);
    return status;
}

#endif /* SP_FUZZ_SERVE_HARNESS_H */
