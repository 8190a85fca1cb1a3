/*
 * bench.c - `sampan bench`: a serving benchmark client for OpenAI-compatible
 * servers (Sampan, llama.cpp's llama-server, vLLM, ...).
 *
 *   sampan bench --url http://127.0.0.1:8000 --concurrency 8 --num-prompts 64
 *                --prompt-tokens 64 --shared-prefix 32 --output-tokens 128
 *                [--endpoint completions|chat] [--save-result FILE.json]
 *
 * N connections (--concurrency) on one libevent loop, each running streamed
 * requests one after another over keep-alive until --num-prompts have been
 * started (optionally paced by --request-rate, Poisson arrivals). Times are
 * taken when bytes arrive: time to first token (TTFT) is from the request's
 * start to the first event with text, inter-token latencies (ITL) are the gaps
 * between text events, time per output token (TPOT) is (end - first) /
 * (tokens - 1), end-to-end latency (E2EL) is start to the end of the answer.
 * Token counts come from the usage chunk (`stream_options.include_usage`),
 * else from the count of text events.
 *
 * Prompts: for completions, token ids (exact lengths without a tokenizer;
 * ids drawn from [3, --vocab)); for chat, words (the server's usage gives the
 * real count). The first --shared-prefix ids or words are the same in every
 * prompt, so a prefix cache has something to share. Every request sets
 * ignore_eos and max_tokens = --output-tokens, so each produces exactly that
 * many tokens on servers that honour ignore_eos.
 *
 * Bounded: --max-seconds stops the run (requests in flight are cut off and
 * counted as such), --timeout fails a request whose server sends nothing for
 * that long, SSE lines and error bodies are capped. A server that is not
 * there is found by the first request (GET /v1/models, which also names the
 * model when --model is not given): a clear message and exit 1. Errors during
 * the run (non-200 answers, error events, dropped connections) are counted,
 * the most common ones printed, and the exit status is 1.
 *
 * Why our own client on libevent + http-parser and not libcurl's multi
 * interface: docs/design.md ("Benchmark client").
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
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <http_parser.h>
#include <jansson.h>

#include "tools/sse.h"
#include "tools/stats.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "tools/cli.h"

static const char bench_usage[] =
    "usage: sampan bench [options]\n"
    "Serving benchmark: streamed requests from N concurrent clients to an OpenAI-compatible\n"
    "server; TTFT, TPOT, ITL and end-to-end latency percentiles and throughput.\n"
    "  --url URL             server base URL (default http://127.0.0.1:8000)\n"
    "  --model NAME          model name (default: the first one GET /v1/models lists)\n"
    "  --endpoint KIND       completions (token-id prompts) or chat (word prompts) (default completions)\n"
    "  --concurrency N       requests in flight at once, one connection each (default 1)\n"
    "  --num-prompts N       requests to send (default 16)\n"
    "  --prompt-tokens N     prompt length in tokens (chat: words) (default 64)\n"
    "  --shared-prefix N     leading prompt tokens common to every request (default 0)\n"
    "  --output-tokens N     max_tokens of every request, with ignore_eos (default 128)\n"
    "  --request-rate R      requests/s, Poisson arrivals (default inf: as fast as slots free up)\n"
    "  --max-seconds S       stop the run after S seconds; requests in flight are cut off (default 600)\n"
    "  --timeout S           fail a request when the server sends nothing for S seconds (default 60)\n"
    "  --vocab N             token ids of completions prompts are drawn from [3, N) (default 500)\n"
    "  --temperature T       sampling temperature to send (default: the server's)\n"
    "  --seed N              prompts and per-request seeds (default 0)\n"
    "  --api-key KEY         send 'Authorization: Bearer KEY'\n"
    "  --label NAME          a name for this run in the result (e.g. sampan, llama.cpp)\n"
    "  --goodput SLOS        e.g. ttft:500,tpot:50,e2el:5000 (ms): count requests meeting all\n"
    "  --save-result FILE    write the result as JSON (vLLM benchmark_serving's keys)\n"
    "  --progress            a progress line on stderr (default when stderr is a terminal)\n"
    "Exit 0 when no request failed (requests cut off by --max-seconds are counted, not failed),\n"
    "1 on errors (counted and printed), an unreachable server or SIGINT, 2 on bad usage.\n";

#define BENCH_MAX_CONC 1024
#define BENCH_MAX_PROMPTS 1000000
#define BENCH_MAX_PROMPT_TOKENS 131072
#define BENCH_MAX_OUTPUT_TOKENS 1000000
#define BENCH_MAX_SAMPLES (1L << 25)     /* num_prompts * output_tokens: ITLs kept in memory */
#define BENCH_MAX_EVENT (1 << 20)        /* one SSE line or event */
#define BENCH_MAX_ERR_BODY 2048          /* kept of a non-200 body */
#define BENCH_MAX_PROBE_BODY (1 << 20)   /* GET /v1/models */
#define BENCH_MAX_WORD 8                 /* longest word in bench_words, for sizing */

/* Chat prompts: common one-token words in most vocabularies. */
static const char *const bench_words[] = {
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make",
    "like", "him",
};
#define BENCH_N_WORDS (sizeof bench_words / sizeof bench_words[0])

typedef enum { EP_COMPLETIONS, EP_CHAT } endpoint_t;

typedef struct opts {
    const char *url;
    char host[256], port[8], prefix[256], host_header[280];
    const char *model;
    endpoint_t endpoint;
    int concurrency, num_prompts, prompt_tokens, shared_prefix, output_tokens, vocab;
    double request_rate; /* INFINITY = no pacing */
    double max_seconds, timeout_s, temperature; /* temperature NAN = not sent */
    uint64_t seed;
    const char *api_key, *label, *save_result;
    double slo_ttft_ms, slo_tpot_ms, slo_e2el_ms; /* <= 0: not part of goodput */
    bool progress;
} opts_t;

typedef enum { RQ_IDLE, RQ_RUNNING, RQ_OK, RQ_FAILED, RQ_CUT } rq_state_t;

typedef struct req {
    int64_t t_start, t_first, t_last, t_end; /* ns, monotonic */
    double *itl;                             /* seconds, n_itl of cap_itl */
    uint32_t n_itl, cap_itl;
    int64_t n_text;                          /* events with text */
    int64_t n_events;                        /* all events */
    int64_t prompt_tokens, completion_tokens; /* from usage; -1 when not reported */
    char *error;                             /* NULL when it succeeded */
    rq_state_t state;
} req_t;

struct bench;

typedef struct conn {
    struct bench *b;
    struct bufferevent *bev; /* NULL when closed */
    struct event *wake;      /* request-rate waits and deferred restarts */
    http_parser parser;
    sp_sse_reader_t sse;
    bool connected, msg_done, probe;
    int req;                 /* index into b->reqs, -1 when none */
    char err_body[BENCH_MAX_ERR_BODY];
    size_t err_len;
    struct evbuffer *probe_body;
    char *body;              /* request body scratch, sized once */
    size_t body_cap;
} conn_t;

typedef struct bench {
    opts_t o;
    struct event_base *base;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    http_parser_settings ps;
    conn_t *conns;
    req_t *reqs;
    double *arrival;         /* seconds after t0, NULL without --request-rate */
    int next, running, n_ok, n_failed, n_cut;
    bool stopping, any_ok, interrupted;
    char fatal[1024];        /* non-empty: stop with this message */
    int64_t t0, t_end, now;
    char model[512];
    struct event *deadline, *ticker, *sigint;
} bench_t;

/* ------------------------------------------------------------ helpers */

static uint64_t
splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double
ns_to_s(int64_t ns)
{
    return (double)ns / 1e9;
}

/* JSON string contents of s (no quotes) appended at out[*n..cap). */
static void
json_escape(char *out, size_t cap, size_t *n, const char *s)
{
    for (; *s != '\0' && *n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[(*n)++] = '\\';
            out[(*n)++] = (char)c;
        } else if (c < 0x20) {
            *n += (size_t)snprintf(out + *n, cap - *n, "\\u%04x", c);
        } else {
            out[(*n)++] = (char)c;
        }
    }
}

/* ------------------------------------------------------------ requests */

static void conn_next(conn_t *c);
static void conn_fail(conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
check_done(bench_t *b)
{
    if (b->running == 0 && (b->stopping || b->next >= b->o.num_prompts)) {
        event_base_loopbreak(b->base);
    }
}

static void
conn_close(conn_t *c)
{
    if (c->bev != NULL) {
        bufferevent_free(c->bev);
        c->bev = NULL;
    }
    c->connected = false;
}

/* The current request ends in `state` (error: a message, or NULL). */
static void
req_end(conn_t *c, rq_state_t state, const char *error)
{
    bench_t *b = c->b;
    if (c->req < 0) {
        return;
    }
    req_t *r = &b->reqs[c->req];
    c->req = -1;
    r->t_end = sp_time_ns();
    r->state = state;
    if (state != RQ_OK && r->error == NULL) {
        r->error = sp_strndup(error ? error : "failed", strlen(error ? error : "failed"));
    }
    b->running--;
    if (state == RQ_OK) {
        b->n_ok++;
        b->any_ok = true;
    } else if (state == RQ_CUT) {
        b->n_cut++;
    } else {
        b->n_failed++;
    }
}

/* The body of request i into c->body; its length. */
static size_t
build_body(conn_t *c, int i)
{
    const opts_t *o = &c->b->o;
    char *p = c->body;
    size_t cap = c->body_cap, n = 0;
    n += (size_t)snprintf(p + n, cap - n, "{\"model\":\"");
    json_escape(p, cap, &n, c->b->model);
    uint64_t shared = o->seed * 0x100000001b3ULL + 1;
    uint64_t own = (o->seed ^ 0xa5a5a5a5a5a5a5a5ULL) + (uint64_t)i * 0x9e3779b97f4a7c15ULL + 7;
    if (o->endpoint == EP_COMPLETIONS) {
        n += (size_t)snprintf(p + n, cap - n, "\",\"prompt\":[");
        uint32_t span = (uint32_t)(o->vocab - 3);
        for (int k = 0; k < o->prompt_tokens; k++) {
            uint64_t r = splitmix64(k < o->shared_prefix ? &shared : &own);
            n += (size_t)snprintf(p + n, cap - n, k ? ",%u" : "%u", 3 + (uint32_t)(r % span));
        }
        n += (size_t)snprintf(p + n, cap - n, "]");
    } else {
        n += (size_t)snprintf(p + n, cap - n, "\",\"messages\":[{\"role\":\"user\",\"content\":\"");
        for (int k = 0; k < o->prompt_tokens; k++) {
            uint64_t r = splitmix64(k < o->shared_prefix ? &shared : &own);
            n += (size_t)snprintf(p + n, cap - n, k ? " %s" : "%s", bench_words[r % BENCH_N_WORDS]);
        }
        n += (size_t)snprintf(p + n, cap - n, "\"}]");
    }
    n += (size_t)snprintf(p + n, cap - n,
                          ",\"max_tokens\":%d,\"ignore_eos\":true,\"stream\":true,"
                          "\"stream_options\":{\"include_usage\":true},\"seed\":%llu",
                          o->output_tokens, (unsigned long long)(o->seed + (uint64_t)i));
    if (!isnan(o->temperature)) {
        n += (size_t)snprintf(p + n, cap - n, ",\"temperature\":%g", o->temperature);
    }
    n += (size_t)snprintf(p + n, cap - n, "}");
    return n < cap ? n : cap - 1;
}

static void conn_read(struct bufferevent *bev, void *arg);
static void conn_event(struct bufferevent *bev, short what, void *arg);

/* A connection (new if needed) with the parser reset for the next answer. */
static int
conn_prepare(conn_t *c)
{
    bench_t *b = c->b;
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    c->msg_done = false;
    c->err_len = 0;
    sp_sse_reader_reset(&c->sse);
    if (c->bev != NULL) {
        return 0;
    }
    c->bev = bufferevent_socket_new(b->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (c->bev == NULL) {
        return -1;
    }
    bufferevent_setcb(c->bev, conn_read, NULL, conn_event, c);
    struct timeval tv = {(time_t)b->o.timeout_s,
                         (suseconds_t)((b->o.timeout_s - floor(b->o.timeout_s)) * 1e6)};
    bufferevent_set_timeouts(c->bev, &tv, &tv); /* the write timeout also bounds connect */
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&b->addr, (int)b->addr_len) != 0) {
        return -1;
    }
    return 0;
}

static void
write_head(conn_t *c, const char *method, const char *path, size_t body_len)
{
    const opts_t *o = &c->b->o;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out, "%s %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: sampan-bench\r\n", method,
                        o->prefix, path, o->host_header);
    if (o->api_key != NULL) {
        evbuffer_add_printf(out, "Authorization: Bearer %s\r\n", o->api_key);
    }
    if (strcmp(method, "POST") == 0) {
        evbuffer_add_printf(out,
                            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                            "Content-Length: %zu\r\n",
                            body_len);
    }
    evbuffer_add(out, "\r\n", 2);
}

static void
start_request(conn_t *c, int i)
{
    bench_t *b = c->b;
    req_t *r = &b->reqs[i];
    r->state = RQ_RUNNING;
    r->t_start = sp_time_ns();
    r->prompt_tokens = r->completion_tokens = -1;
    c->req = i;
    b->running++;
    r->cap_itl = (uint32_t)b->o.output_tokens + 1;
    r->itl = sp_calloc(r->cap_itl, sizeof(double));
    if (r->itl == NULL) {
        r->cap_itl = 0;
        conn_fail(c, "out of memory");
        return;
    }
    if (conn_prepare(c) != 0) {
        conn_fail(c, "cannot open a connection to %s:%s: %s", b->o.host, b->o.port,
                  strerror(errno));
        return;
    }
    size_t n = build_body(c, i);
    write_head(c, "POST", b->o.endpoint == EP_CHAT ? "/v1/chat/completions" : "/v1/completions", n);
    evbuffer_add(bufferevent_get_output(c->bev), c->body, n);
}

/* Start the next request on c, wait for its arrival time, or finish. */
static void
conn_next(conn_t *c)
{
    bench_t *b = c->b;
    if (b->stopping || b->next >= b->o.num_prompts) {
        conn_close(c);
        check_done(b);
        return;
    }
    if (b->arrival != NULL) {
        int64_t due = b->t0 + (int64_t)(b->arrival[b->next] * 1e9);
        int64_t now = sp_time_ns();
        if (now < due) {
            int64_t us = (due - now) / 1000 + 1;
            struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
            evtimer_add(c->wake, &tv);
            return;
        }
    }
    start_request(c, b->next++);
}

static void
conn_wake(evutil_socket_t fd, short what, void *arg)
{
    conn_next(arg);
}

/* The connection failed: end its request with the message, close it, and go
 * on with the next request from the loop (never recursively: a server that
 * refuses every connection would otherwise recurse once per prompt). */
static void
conn_fail(conn_t *c, const char *fmt, ...)
{
    bench_t *b = c->b;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    bool was_connected = c->connected;
    conn_close(c);
    if (c->probe) {
        snprintf(b->fatal, sizeof b->fatal, "%s", msg);
        event_base_loopbreak(b->base);
        return;
    }
    req_end(c, RQ_FAILED, msg);
    if (!was_connected && !b->any_ok && !b->stopping) {
        /* Not even one request got through and we cannot connect: the server is
         * not there; stop instead of failing every remaining prompt. */
        snprintf(b->fatal, sizeof b->fatal, "%s", msg);
        b->stopping = true;
    }
    struct timeval zero = {0, 0};
    evtimer_add(c->wake, &zero);
}

/* "HTTP 400: message" from an error answer's body (OpenAI's {"error":
 * {"message"}}, or {"error": "..."}, or the first bytes of anything else). */
static void
error_of_body(const conn_t *c, int status, char *out, size_t cap)
{
    json_error_t je;
    json_t *j = json_loadb(c->err_body, c->err_len, 0, &je);
    const char *m = NULL;
    if (j != NULL) {
        json_t *e = json_object_get(j, "error");
        m = json_is_string(e) ? json_string_value(e) : json_string_value(json_object_get(e, "message"));
        if (m == NULL) {
            m = json_string_value(json_object_get(j, "message"));
        }
    }
    if (m != NULL) {
        snprintf(out, cap, "HTTP %d: %.300s", status, m);
    } else {
        size_t n = (size_t)snprintf(out, cap, "HTTP %d: ", status);
        for (size_t i = 0; i < c->err_len && i < 200 && n + 1 < cap; i++) {
            unsigned char ch = (unsigned char)c->err_body[i];
            out[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : ' ';
        }
        out[n] = '\0';
    }
    json_decref(j);
}

static void probe_done(conn_t *c);
static int on_event(const char *data, size_t len, void *ud);

/* The answer on c is complete (the parser is paused at its end). */
static void
answer_done(conn_t *c)
{
    bench_t *b = c->b;
    bool keep = http_should_keep_alive(&c->parser) &&
                evbuffer_get_length(bufferevent_get_input(c->bev)) == 0;
    int status = c->parser.status_code;
    if (c->probe) {
        probe_done(c);
        return;
    }
    if (status == 200 && c->req >= 0) {
        sp_sse_finish(&c->sse, on_event, c); /* an event whose blank line never came */
    }
    if (!keep) {
        conn_close(c);
    }
    if (c->req >= 0) {
        req_t *r = &b->reqs[c->req];
        if (status != 200) {
            char msg[512];
            error_of_body(c, status, msg, sizeof msg);
            req_end(c, RQ_FAILED, msg);
        } else if (r->error != NULL) {
            req_end(c, RQ_FAILED, NULL);
        } else if (r->n_events == 0) {
            req_end(c, RQ_FAILED, "HTTP 200 without server-sent events (does the server stream?)");
        } else {
            req_end(c, RQ_OK, NULL);
        }
    }
    conn_next(c);
}

/* One SSE event of the current request. */
static int
on_event(const char *data, size_t len, void *ud)
{
    conn_t *c = ud;
    bench_t *b = c->b;
    if (c->req < 0) {
        return 1;
    }
    req_t *r = &b->reqs[c->req];
    sp_sse_event_t ev;
    sp_sse_scan(data, len, &ev);
    r->n_events++;
    if (ev.error) {
        if (r->error == NULL) {
            char msg[360];
            snprintf(msg, sizeof msg, "error event: %.*s", len > 300 ? 300 : (int)len, data);
            r->error = sp_strndup(msg, strlen(msg));
        }
        return 0;
    }
    if (ev.has_text) {
        int64_t t = b->now;
        if (r->n_text == 0) {
            r->t_first = t;
        } else {
            if (r->n_itl == r->cap_itl && r->cap_itl < 4u * (uint32_t)b->o.output_tokens + 1024u) {
                /* More events than tokens asked for (a server that splits tokens): grow, bounded. */
                double *g = sp_realloc(r->itl, 2 * (size_t)r->cap_itl * sizeof(double));
                if (g != NULL) {
                    r->itl = g;
                    r->cap_itl *= 2;
                }
            }
            if (r->n_itl < r->cap_itl) {
                r->itl[r->n_itl++] = ns_to_s(t - r->t_last);
            }
        }
        r->t_last = t;
        r->n_text++;
    }
    if (ev.prompt_tokens >= 0) {
        r->prompt_tokens = ev.prompt_tokens;
    }
    if (ev.completion_tokens >= 0) {
        r->completion_tokens = ev.completion_tokens;
    }
    return 0;
}

static int
on_body(http_parser *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (c->probe) {
        if (evbuffer_get_length(c->probe_body) + len > BENCH_MAX_PROBE_BODY) {
            return 1;
        }
        evbuffer_add(c->probe_body, at, len);
        return 0;
    }
    if (p->status_code != 200) {
        size_t room = sizeof c->err_body - c->err_len;
        size_t n = len < room ? len : room;
        memcpy(c->err_body + c->err_len, at, n);
        c->err_len += n;
        return 0;
    }
    int rc = sp_sse_feed(&c->sse, at, len, on_event, c);
    return rc < 0 ? 1 : 0;
}

static int
on_message_complete(http_parser *p)
{
    conn_t *c = p->data;
    c->msg_done = true;
    http_parser_pause(p, 1); /* stop here: what follows belongs to no request of ours */
    return 0;
}

static void
conn_read(struct bufferevent *bev, void *arg)
{
    conn_t *c = arg;
    bench_t *b = c->b;
    b->now = sp_time_ns(); /* one timestamp for everything that arrived together */
    struct evbuffer *in = bufferevent_get_input(bev);
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1) {
            break;
        }
        size_t used = http_parser_execute(&c->parser, &b->ps, v.iov_base, v.iov_len);
        evbuffer_drain(in, used);
        if (c->msg_done) {
            answer_done(c);
            return;
        }
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (e != HPE_OK) {
            if (e == HPE_CB_body && !c->probe) {
                conn_fail(c, "a server-sent event line over %d bytes", BENCH_MAX_EVENT);
            } else if (e == HPE_CB_body) {
                conn_fail(c, "GET /v1/models: answer over %d bytes", BENCH_MAX_PROBE_BODY);
            } else {
                conn_fail(c, "bad HTTP answer: %s", http_errno_description(e));
            }
            return;
        }
        if (c->req < 0 && !c->probe) {
            conn_fail(c, "the server sent bytes with no request pending");
            return;
        }
    }
}

static void
conn_event(struct bufferevent *bev, short what, void *arg)
{
    conn_t *c = arg;
    bench_t *b = c->b;
    if (what & BEV_EVENT_CONNECTED) {
        c->connected = true;
        int one = 1;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return;
    }
    if (what & BEV_EVENT_EOF) {
        b->now = sp_time_ns();
        http_parser_execute(&c->parser, &b->ps, NULL, 0); /* ends a close-delimited body */
        if (c->msg_done) {
            answer_done(c);
        } else if (c->req >= 0 || c->probe) {
            conn_fail(c, "the server closed the connection before the answer was complete");
        } else {
            conn_close(c); /* an idle keep-alive connection: reopened when needed */
        }
        return;
    }
    if (what & BEV_EVENT_TIMEOUT) {
        conn_fail(c, "no data from the server for %g s (--timeout)", b->o.timeout_s);
        return;
    }
    int e = EVUTIL_SOCKET_ERROR();
    if (!c->connected) {
        conn_fail(c, "cannot connect to %s:%s: %s", b->o.host, b->o.port, strerror(e));
    } else {
        conn_fail(c, "connection error: %s", strerror(e));
    }
}

/* ------------------------------------------------------------ probe: GET /v1/models */

static void
probe_done(conn_t *c)
{
    bench_t *b = c->b;
    int status = c->parser.status_code;
    size_t n = evbuffer_get_length(c->probe_body);
    const char *body = (const char *)evbuffer_pullup(c->probe_body, -1);
    json_error_t je;
    json_t *j = n > 0 ? json_loadb(body, n, 0, &je) : NULL;
    if (status != 200) {
        c->err_len = n < sizeof c->err_body ? n : sizeof c->err_body;
        memcpy(c->err_body, body, c->err_len);
        char msg[512];
        error_of_body(c, status, msg, sizeof msg);
        snprintf(b->fatal, sizeof b->fatal, "GET %s/v1/models: %s", b->o.prefix, msg);
    } else {
        json_t *data = json_object_get(j, "data");
        bool listed = false;
        const char *first = NULL;
        for (size_t i = 0; i < json_array_size(data); i++) {
            const char *id = json_string_value(json_object_get(json_array_get(data, i), "id"));
            if (id != NULL && first == NULL) {
                first = id;
            }
            if (id != NULL && b->o.model != NULL && strcmp(id, b->o.model) == 0) {
                listed = true;
            }
        }
        if (b->o.model != NULL) {
            snprintf(b->model, sizeof b->model, "%s", b->o.model);
            if (!listed) {
                fprintf(stderr, "sampan bench: note: model '%s' is not in GET /v1/models; sending it anyway\n",
                        b->o.model);
            }
        } else if (first != NULL) {
            snprintf(b->model, sizeof b->model, "%s", first);
        } else {
            snprintf(b->fatal, sizeof b->fatal,
                     "GET %s/v1/models lists no model; name one with --model", b->o.prefix);
        }
    }
    json_decref(j);
    conn_close(c);
    c->probe = false;
    event_base_loopbreak(b->base);
}

/* ------------------------------------------------------------ timers and signals */

static void
stop_run(bench_t *b, const char *why)
{
    b->stopping = true;
    for (int i = 0; i < b->o.concurrency; i++) {
        conn_t *c = &b->conns[i];
        evtimer_del(c->wake);
        if (c->req >= 0) {
            req_end(c, RQ_CUT, why);
        }
        conn_close(c);
    }
    event_base_loopbreak(b->base);
}

static void
on_deadline(evutil_socket_t fd, short what, void *arg)
{
    stop_run(arg, "cut off at --max-seconds");
}

static void
on_sigint(evutil_socket_t fd, short what, void *arg)
{
    bench_t *b = arg;
    b->interrupted = true;
    stop_run(b, "cut off by SIGINT");
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    bench_t *b = arg;
    fprintf(stderr, "\rbench: %d/%d done, %d failed, %d running, %.1f s   ", b->n_ok, b->o.num_prompts,
            b->n_failed, b->running, ns_to_s(sp_time_ns() - b->t0));
}

/* ------------------------------------------------------------ report */

typedef struct metric {
    const char *key, *title, *name;
    double *v; /* seconds */
    size_t n;
    sp_stats_t s;
} metric_t;

static void
set_stats(json_t *o, const metric_t *m)
{
    char k[64];
    snprintf(k, sizeof k, "mean_%s_ms", m->key);
    json_object_set_new(o, k, json_real(m->s.mean * 1e3));
    snprintf(k, sizeof k, "median_%s_ms", m->key);
    json_object_set_new(o, k, json_real(m->s.median * 1e3));
    snprintf(k, sizeof k, "std_%s_ms", m->key);
    json_object_set_new(o, k, json_real(m->s.std * 1e3));
    for (int i = 0; i < SP_STATS_N_PCT; i++) {
        snprintf(k, sizeof k, "p%d_%s_ms", (int)sp_stats_pcts[i], m->key);
        json_object_set_new(o, k, json_real(m->s.pct[i] * 1e3));
    }
}

static int64_t
output_len(const req_t *r)
{
    if (r->state != RQ_OK) {
        return 0;
    }
    return r->completion_tokens >= 0 ? r->completion_tokens : r->n_text;
}

static int64_t
input_len(const bench_t *b, const req_t *r)
{
    return r->prompt_tokens >= 0 ? r->prompt_tokens : b->o.prompt_tokens;
}

/* Print the summary, write the JSON; returns 0 or -1 when the file failed. */
static int
report(bench_t *b)
{
    const opts_t *o = &b->o;
    int started = b->next;
    double dur = ns_to_s(b->t_end - b->t0);
    if (dur <= 0) {
        dur = 1e-9;
    }
    size_t n_itl = 0;
    int64_t tot_in = 0, tot_out = 0;
    for (int i = 0; i < started; i++) {
        const req_t *r = &b->reqs[i];
        if (r->state == RQ_OK) {
            n_itl += r->n_itl;
            tot_in += input_len(b, r);
            tot_out += output_len(r);
        }
    }
    metric_t m[4] = {
        {"ttft", "Time to First Token", "TTFT", NULL, 0, {0}},
        {"tpot", "Time per Output Token (excl. 1st token)", "TPOT", NULL, 0, {0}},
        {"itl", "Inter-token Latency", "ITL", NULL, 0, {0}},
        {"e2el", "End-to-end Latency", "E2EL", NULL, 0, {0}},
    };
    m[0].v = sp_calloc((size_t)started + 1, sizeof(double));
    m[1].v = sp_calloc((size_t)started + 1, sizeof(double));
    m[2].v = sp_calloc(n_itl + 1, sizeof(double));
    m[3].v = sp_calloc((size_t)started + 1, sizeof(double));
    if (!m[0].v || !m[1].v || !m[2].v || !m[3].v) {
        fprintf(stderr, "sampan bench: out of memory for the report\n");
        for (int k = 0; k < 4; k++) {
            sp_free(m[k].v);
        }
        return -1;
    }
    int good = 0;
    for (int i = 0; i < started; i++) {
        const req_t *r = &b->reqs[i];
        if (r->state != RQ_OK) {
            continue;
        }
        double ttft = r->n_text > 0 ? ns_to_s(r->t_first - r->t_start) : ns_to_s(r->t_end - r->t_start);
        double e2el = ns_to_s(r->t_end - r->t_start);
        int64_t out = output_len(r);
        double tpot = out > 1 ? (e2el - ttft) / (double)(out - 1) : 0;
        m[0].v[m[0].n++] = ttft;
        if (out > 1) {
            m[1].v[m[1].n++] = tpot;
        }
        memcpy(m[2].v + m[2].n, r->itl, r->n_itl * sizeof(double));
        m[2].n += r->n_itl;
        m[3].v[m[3].n++] = e2el;
        if ((o->slo_ttft_ms <= 0 || ttft * 1e3 <= o->slo_ttft_ms) &&
            (o->slo_tpot_ms <= 0 || tpot * 1e3 <= o->slo_tpot_ms) &&
            (o->slo_e2el_ms <= 0 || e2el * 1e3 <= o->slo_e2el_ms)) {
            good++;
        }
    }
    for (int k = 0; k < 4; k++) {
        sp_stats_compute(m[k].v, m[k].n, &m[k].s);
    }
    bool has_slo = o->slo_ttft_ms > 0 || o->slo_tpot_ms > 0 || o->slo_e2el_ms > 0;

    fprintf(stderr, "============ Serving Benchmark Result ============\n");
    fprintf(stderr, "%-40s %s\n", "Model:", b->model);
    fprintf(stderr, "%-40s %s\n", "Endpoint:", o->endpoint == EP_CHAT ? "chat" : "completions");
    fprintf(stderr, "%-40s %d\n", "Maximum request concurrency:", o->concurrency);
    fprintf(stderr, "%-40s %d\n", "Successful requests:", b->n_ok);
    fprintf(stderr, "%-40s %d\n", "Failed requests:", b->n_failed);
    if (b->n_cut > 0 || started < o->num_prompts) {
        fprintf(stderr, "%-40s %d\n", "Cut off (--max-seconds, SIGINT):", b->n_cut);
        fprintf(stderr, "%-40s %d\n", "Not started:", o->num_prompts - started);
    }
    fprintf(stderr, "%-40s %.2f\n", "Benchmark duration (s):", dur);
    fprintf(stderr, "%-40s %lld\n", "Total input tokens:", (long long)tot_in);
    fprintf(stderr, "%-40s %lld\n", "Total generated tokens:", (long long)tot_out);
    fprintf(stderr, "%-40s %.2f\n", "Request throughput (req/s):", b->n_ok / dur);
    if (has_slo) {
        fprintf(stderr, "%-40s %.2f\n", "Request goodput (req/s):", good / dur);
    }
    fprintf(stderr, "%-40s %.2f\n", "Output token throughput (tok/s):", (double)tot_out / dur);
    fprintf(stderr, "%-40s %.2f\n", "Total token throughput (tok/s):", (double)(tot_in + tot_out) / dur);
    for (int k = 0; k < 4; k++) {
        char line[51];
        size_t tl = strlen(m[k].title);
        size_t pad = tl < 48 ? (50 - tl) / 2 : 0;
        memset(line, '-', 50);
        line[50] = '\0';
        memcpy(line + pad, m[k].title, tl < 50 ? tl : 50);
        fprintf(stderr, "%s\n", line);
        char lbl[64];
        snprintf(lbl, sizeof lbl, "Mean %s (ms):", m[k].name);
        fprintf(stderr, "%-40s %.2f\n", lbl, m[k].s.mean * 1e3);
        snprintf(lbl, sizeof lbl, "Median %s (ms):", m[k].name);
        fprintf(stderr, "%-40s %.2f\n", lbl, m[k].s.median * 1e3);
        snprintf(lbl, sizeof lbl, "P99 %s (ms):", m[k].name);
        fprintf(stderr, "%-40s %.2f\n", lbl, m[k].s.pct[SP_STATS_N_PCT - 1] * 1e3);
    }
    fprintf(stderr, "==================================================\n");
    /* The most frequent errors, so a misconfiguration is visible at once. */
    if (b->n_failed > 0) {
        int shown = 0;
        for (int i = 0; i < started && shown < 5; i++) {
            const req_t *r = &b->reqs[i];
            if (r->state != RQ_FAILED) {
                continue;
            }
            bool seen = false;
            for (int k = 0; k < i && !seen; k++) {
                seen = b->reqs[k].state == RQ_FAILED && strcmp(b->reqs[k].error, r->error) == 0;
            }
            if (seen) {
                continue;
            }
            int count = 0;
            for (int k = i; k < started; k++) {
                count += b->reqs[k].state == RQ_FAILED && strcmp(b->reqs[k].error, r->error) == 0;
            }
            fprintf(stderr, "error (%d request%s): %s\n", count, count == 1 ? "" : "s", r->error);
            shown++;
        }
    }

    int rc = 0;
    if (o->save_result != NULL) {
        json_t *j = json_object();
        char date[32];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm);
        json_object_set_new(j, "date", json_string(date));
        json_object_set_new(j, "backend", json_string(o->endpoint == EP_CHAT ? "openai-chat" : "openai"));
        json_object_set_new(j, "label", json_string(o->label ? o->label : ""));
        json_object_set_new(j, "base_url", json_string(o->url));
        json_object_set_new(j, "endpoint", json_string(o->endpoint == EP_CHAT ? "/v1/chat/completions"
                                                                             : "/v1/completions"));
        json_object_set_new(j, "model_id", json_string(b->model));
        json_object_set_new(j, "tokenizer_id", json_null());
        json_object_set_new(j, "num_prompts", json_integer(o->num_prompts));
        json_object_set_new(j, "prompt_tokens", json_integer(o->prompt_tokens));
        json_object_set_new(j, "shared_prefix", json_integer(o->shared_prefix));
        json_object_set_new(j, "output_tokens", json_integer(o->output_tokens));
        json_object_set_new(j, "seed", json_integer((json_int_t)o->seed));
        json_object_set_new(j, "request_rate",
                            isinf(o->request_rate) ? json_string("inf") : json_real(o->request_rate));
        json_object_set_new(j, "burstiness", json_real(1.0));
        json_object_set_new(j, "max_concurrency", json_integer(o->concurrency));
        json_object_set_new(j, "duration", json_real(dur));
        json_object_set_new(j, "completed", json_integer(b->n_ok));
        json_object_set_new(j, "failed", json_integer(b->n_failed));
        json_object_set_new(j, "cut_off", json_integer(b->n_cut));
        json_object_set_new(j, "not_started", json_integer(o->num_prompts - started));
        json_object_set_new(j, "total_input_tokens", json_integer(tot_in));
        json_object_set_new(j, "total_output_tokens", json_integer(tot_out));
        json_object_set_new(j, "request_throughput", json_real(b->n_ok / dur));
        json_object_set_new(j, "request_goodput", has_slo ? json_real(good / dur) : json_null());
        json_object_set_new(j, "output_throughput", json_real((double)tot_out / dur));
        json_object_set_new(j, "total_token_throughput", json_real((double)(tot_in + tot_out) / dur));
        for (int k = 0; k < 4; k++) {
            set_stats(j, &m[k]);
        }
        json_t *in_lens = json_array(), *out_lens = json_array(), *ttfts = json_array();
        json_t *itls = json_array(), *e2els = json_array(), *errors = json_array();
        for (int i = 0; i < started; i++) {
            const req_t *r = &b->reqs[i];
            bool ok = r->state == RQ_OK;
            json_array_append_new(in_lens, json_integer(input_len(b, r)));
            json_array_append_new(out_lens, json_integer(output_len(r)));
            json_array_append_new(
                ttfts, json_real(ok && r->n_text > 0 ? ns_to_s(r->t_first - r->t_start) : 0.0));
            json_t *l = json_array();
            for (uint32_t k = 0; ok && k < r->n_itl; k++) {
                json_array_append_new(l, json_real(r->itl[k]));
            }
            json_array_append_new(itls, l);
            json_array_append_new(e2els, json_real(ok ? ns_to_s(r->t_end - r->t_start) : 0.0));
            json_array_append_new(errors, json_string(ok ? "" : r->error));
        }
        json_object_set_new(j, "input_lens", in_lens);
        json_object_set_new(j, "output_lens", out_lens);
        json_object_set_new(j, "ttfts", ttfts);
        json_object_set_new(j, "itls", itls);
        json_object_set_new(j, "e2els", e2els);
        json_object_set_new(j, "errors", errors);
        if (json_dump_file(j, o->save_result, JSON_INDENT(1) | JSON_REAL_PRECISION(9)) != 0) {
            fprintf(stderr, "sampan bench: --save-result %s: cannot write: %s\n", o->save_result,
                    strerror(errno));
            rc = -1;
        } else {
            fprintf(stderr, "result: %s\n", o->save_result);
        }
        json_decref(j);
    }
    for (int k = 0; k < 4; k++) {
        sp_free(m[k].v);
    }
    return rc;
}

/* ------------------------------------------------------------ options */

/* Value of "--name V" or "--name=V"; advances *i. NULL when it is another flag. */
static const char *
opt_val(int argc, char **argv, int *i, const char *name, bool *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) {
        return NULL;
    }
    if (a[n] == '=') {
        return a + n + 1;
    }
    if (a[n] != '\0') {
        return NULL;
    }
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

static int
parse_int(const char *flag, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
        fprintf(stderr, "sampan bench: %s: expected an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int
parse_num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(x >= lo && x <= hi)) {
        fprintf(stderr, "sampan bench: %s: expected a number in [%g, %g], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* "ttft:500,tpot:50,e2el:5000" */
static int
parse_goodput(opts_t *o, const char *v)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(t, ':');
        double ms;
        if (colon == NULL) {
            goto bad;
        }
        *colon = '\0';
        if (parse_num("--goodput", colon + 1, 1e-3, 1e9, &ms) != 0) {
            return -1;
        }
        if (strcmp(t, "ttft") == 0) {
            o->slo_ttft_ms = ms;
        } else if (strcmp(t, "tpot") == 0) {
            o->slo_tpot_ms = ms;
        } else if (strcmp(t, "e2el") == 0) {
            o->slo_e2el_ms = ms;
        } else {
            goto bad;
        }
    }
    return 0;
bad:
    fprintf(stderr, "sampan bench: --goodput: expected ttft:MS,tpot:MS,e2el:MS (any of them), got '%s'\n", v);
    return -1;
}

/* http://host[:port][/prefix] into o->host, port, prefix. */
static int
parse_url(opts_t *o)
{
    const char *u = o->url;
    if (strncmp(u, "http://", 7) != 0) {
        fprintf(stderr, "sampan bench: --url: only http://HOST[:PORT][/PREFIX] is supported, got '%s'\n", u);
        return -1;
    }
    u += 7;
    const char *slash = strchr(u, '/');
    size_t hp_len = slash ? (size_t)(slash - u) : strlen(u);
    const char *host = u, *port = NULL;
    size_t host_len = hp_len;
    if (hp_len > 0 && u[0] == '[') {
        const char *rb = memchr(u, ']', hp_len);
        if (rb == NULL) {
            goto bad;
        }
        host = u + 1;
        host_len = (size_t)(rb - host);
        if (rb + 1 < u + hp_len) {
            if (rb[1] != ':') {
                goto bad;
            }
            port = rb + 2;
        }
    } else {
        const char *colon = memchr(u, ':', hp_len);
        if (colon != NULL) {
            host_len = (size_t)(colon - u);
            port = colon + 1;
        }
    }
    size_t port_len = port ? (size_t)(u + hp_len - port) : 0;
    if (host_len == 0 || host_len >= sizeof o->host || (port && (port_len == 0 || port_len > 5))) {
        goto bad;
    }
    memcpy(o->host, host, host_len);
    o->host[host_len] = '\0';
    if (port) {
        memcpy(o->port, port, port_len);
        o->port[port_len] = '\0';
        int p;
        if (strspn(o->port, "0123456789") != port_len || parse_int("--url port", o->port, 1, 65535, &p) != 0) {
            goto bad;
        }
    } else {
        snprintf(o->port, sizeof o->port, "80");
    }
    const char *prefix = slash ? slash : "";
    size_t pl = strlen(prefix);
    while (pl > 0 && prefix[pl - 1] == '/') {
        pl--; /* "http://h:p/" and "http://h:p" are the same */
    }
    if (pl >= 3 && memcmp(prefix + pl - 3, "/v1", 3) == 0) {
        pl -= 3; /* an OpenAI base URL ".../v1": the routes add /v1 themselves */
    }
    if (pl >= sizeof o->prefix || strpbrk(prefix, " \r\n?#") != NULL) {
        goto bad;
    }
    memcpy(o->prefix, prefix, pl);
    o->prefix[pl] = '\0';
    snprintf(o->host_header, sizeof o->host_header, "%s%.*s%s:%s", u[0] == '[' ? "[" : "", (int)host_len, host,
             u[0] == '[' ? "]" : "", o->port);
    return 0;
bad:
    fprintf(stderr, "sampan bench: --url: cannot parse '%s' (expected http://HOST[:PORT][/PREFIX])\n", o->url);
    return -1;
}

static int
parse_opts(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->url = "http://127.0.0.1:8000";
    o->concurrency = 1;
    o->num_prompts = 16;
    o->prompt_tokens = 64;
    o->output_tokens = 128;
    o->vocab = 500;
    o->request_rate = INFINITY;
    o->max_seconds = 600;
    o->timeout_s = 60;
    o->temperature = NAN;
    o->progress = isatty(2);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        bool miss = false;
        int x;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(bench_usage, stdout);
            return 1;
        } else if ((v = opt_val(argc, argv, &i, "--url", &miss))) {
            o->url = v;
        } else if ((v = opt_val(argc, argv, &i, "--model", &miss))) {
            if (*v == '\0' || strlen(v) >= 256) {
                fprintf(stderr, "sampan bench: --model: expected a name of 1..255 bytes\n");
                return -1;
            }
            o->model = v;
        } else if ((v = opt_val(argc, argv, &i, "--endpoint", &miss))) {
            if (strcmp(v, "completions") == 0) {
                o->endpoint = EP_COMPLETIONS;
            } else if (strcmp(v, "chat") == 0) {
                o->endpoint = EP_CHAT;
            } else {
                fprintf(stderr, "sampan bench: --endpoint: expected completions or chat, got '%s'\n", v);
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--concurrency", &miss))) {
            if (parse_int(a, v, 1, BENCH_MAX_CONC, &o->concurrency) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--num-prompts", &miss))) {
            if (parse_int(a, v, 1, BENCH_MAX_PROMPTS, &o->num_prompts) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--prompt-tokens", &miss))) {
            if (parse_int(a, v, 1, BENCH_MAX_PROMPT_TOKENS, &o->prompt_tokens) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--shared-prefix", &miss))) {
            if (parse_int(a, v, 0, BENCH_MAX_PROMPT_TOKENS, &o->shared_prefix) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--output-tokens", &miss))) {
            if (parse_int(a, v, 1, BENCH_MAX_OUTPUT_TOKENS, &o->output_tokens) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--vocab", &miss))) {
            if (parse_int(a, v, 4, 1 << 24, &o->vocab) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--request-rate", &miss))) {
            if (strcmp(v, "inf") == 0) {
                o->request_rate = INFINITY;
            } else if (parse_num(a, v, 1e-3, 1e6, &o->request_rate) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--max-seconds", &miss))) {
            if (parse_num(a, v, 0.001, 7 * 86400, &o->max_seconds) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--timeout", &miss))) {
            if (parse_num(a, v, 0.001, 86400, &o->timeout_s) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--temperature", &miss))) {
            if (parse_num(a, v, 0, 2, &o->temperature) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--seed", &miss))) {
            if (parse_int(a, v, 0, 2147483647, &x) != 0) {
                return -1;
            }
            o->seed = (uint64_t)x;
        } else if ((v = opt_val(argc, argv, &i, "--api-key", &miss))) {
            if (strpbrk(v, "\r\n") != NULL) {
                fprintf(stderr, "sampan bench: --api-key: must not contain CR or LF\n");
                return -1;
            }
            o->api_key = v;
        } else if ((v = opt_val(argc, argv, &i, "--label", &miss))) {
            o->label = v;
        } else if ((v = opt_val(argc, argv, &i, "--goodput", &miss))) {
            if (parse_goodput(o, v) != 0) {
                return -1;
            }
        } else if ((v = opt_val(argc, argv, &i, "--save-result", &miss))) {
            o->save_result = v;
        } else if (strcmp(a, "--progress") == 0) {
            o->progress = true;
        } else if (strcmp(a, "--no-progress") == 0) {
            o->progress = false;
        } else {
            if (miss) {
                fprintf(stderr, "sampan bench: %s needs a value\n", a);
            } else {
                fprintf(stderr, "sampan bench: unknown option '%s'\n%s", a, bench_usage);
            }
            return -1;
        }
        if (miss) {
            fprintf(stderr, "sampan bench: %s needs a value\n", a);
            return -1;
        }
    }
    if (o->shared_prefix > o->prompt_tokens) {
        fprintf(stderr, "sampan bench: --shared-prefix (%d) is longer than --prompt-tokens (%d)\n",
                o->shared_prefix, o->prompt_tokens);
        return -1;
    }
    if ((int64_t)o->num_prompts * o->output_tokens > BENCH_MAX_SAMPLES) {
        fprintf(stderr,
                "sampan bench: --num-prompts x --output-tokens = %lld is over %ld (the inter-token "
                "latencies are kept in memory); run fewer prompts or tokens\n",
                (long long)o->num_prompts * o->output_tokens, (long)BENCH_MAX_SAMPLES);
        return -1;
    }
    return parse_url(o);
}

/* ------------------------------------------------------------ the command */

static void
bench_free(bench_t *b)
{
    if (b->conns != NULL) {
        for (int i = 0; i < b->o.concurrency; i++) {
            conn_t *c = &b->conns[i];
            conn_close(c);
            if (c->wake) {
                event_free(c->wake);
            }
            if (c->probe_body) {
                evbuffer_free(c->probe_body);
            }
            sp_sse_reader_free(&c->sse);
            sp_free(c->body);
        }
    }
    if (b->reqs != NULL) {
        for (int i = 0; i < b->o.num_prompts; i++) {
            sp_free(b->reqs[i].itl);
            sp_free(b->reqs[i].error);
        }
    }
    if (b->deadline) {
        event_free(b->deadline);
    }
    if (b->ticker) {
        event_free(b->ticker);
    }
    if (b->sigint) {
        event_free(b->sigint);
    }
    sp_free(b->conns);
    sp_free(b->reqs);
    sp_free(b->arrival);
    if (b->base) {
        event_base_free(b->base);
    }
}

static int
bench_setup(bench_t *b)
{
    const opts_t *o = &b->o;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(o->host, o->port, &hints, &ai);
    if (gai != 0 || ai == NULL) {
        fprintf(stderr, "sampan bench: --url: cannot resolve '%s': %s\n", o->host, gai_strerror(gai));
        return -1;
    }
    memcpy(&b->addr, ai->ai_addr, ai->ai_addrlen);
    b->addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    b->base = event_base_new();
    b->conns = sp_calloc((size_t)o->concurrency, sizeof(conn_t));
    b->reqs = sp_calloc((size_t)o->num_prompts, sizeof(req_t));
    if (b->base == NULL || b->conns == NULL || b->reqs == NULL) {
        return -1;
    }
    http_parser_settings_init(&b->ps);
    b->ps.on_body = on_body;
    b->ps.on_message_complete = on_message_complete;
    /* Body scratch: every prompt element at its longest, plus the fixed fields
     * and the model name escaped at worst 6 bytes per byte. */
    size_t per = o->endpoint == EP_CHAT ? BENCH_MAX_WORD + 1 : 12;
    size_t cap = (size_t)o->prompt_tokens * per + 6 * 512 + 1024;
    for (int i = 0; i < o->concurrency; i++) {
        conn_t *c = &b->conns[i];
        c->b = b;
        c->req = -1;
        c->wake = evtimer_new(b->base, conn_wake, c);
        c->body = sp_malloc(cap);
        c->body_cap = cap;
        if (c->wake == NULL || c->body == NULL || sp_sse_reader_init(&c->sse, BENCH_MAX_EVENT) != SP_OK) {
            return -1;
        }
    }
    if (!isinf(o->request_rate)) {
        b->arrival = sp_calloc((size_t)o->num_prompts, sizeof(double));
        if (b->arrival == NULL) {
            return -1;
        }
        uint64_t s = o->seed ^ 0x5851f42d4c957f2dULL;
        double t = 0;
        for (int i = 0; i < o->num_prompts; i++) {
            b->arrival[i] = t;
            double u = ((double)(splitmix64(&s) >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
            t += -log(u) / o->request_rate;
        }
    }
    return 0;
}

/* GET /v1/models: the server is there, and which model to ask for. */
static int
bench_probe(bench_t *b)
{
    conn_t *c = &b->conns[0];
    c->probe = true;
    c->probe_body = evbuffer_new();
    if (c->probe_body == NULL || conn_prepare(c) != 0) {
        snprintf(b->fatal, sizeof b->fatal, "cannot open a connection: %s", strerror(errno));
        return -1;
    }
    write_head(c, "GET", "/v1/models", 0);
    event_base_dispatch(b->base);
    c->probe = false;
    conn_close(c);
    if (b->fatal[0] == '\0' && b->model[0] == '\0') {
        snprintf(b->fatal, sizeof b->fatal, "GET /v1/models: no answer");
    }
    return b->fatal[0] != '\0' ? -1 : 0;
}

int
sp_cmd_bench(int argc, char **argv)
{
    bench_t b;
    memset(&b, 0, sizeof b);
    int prc = parse_opts(argc, argv, &b.o);
    if (prc != 0) {
        return prc > 0 ? 0 : 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int rc = 1;
    if (bench_setup(&b) != 0) {
        if (b.base != NULL) {
            fprintf(stderr, "sampan bench: out of memory\n");
        }
        goto out;
    }
    if (bench_probe(&b) != 0) {
        fprintf(stderr, "sampan bench: %s: %s\n", b.o.url, b.fatal);
        goto out;
    }
    const opts_t *o = &b.o;
    fprintf(stderr,
            "sampan bench: %s model %s, %s, %d prompts of %d tokens (%d shared), %d output tokens, "
            "concurrency %d\n",
            o->url, b.model, o->endpoint == EP_CHAT ? "chat" : "completions", o->num_prompts,
            o->prompt_tokens, o->shared_prefix, o->output_tokens, o->concurrency);
    b.deadline = evtimer_new(b.base, on_deadline, &b);
    b.sigint = evsignal_new(b.base, SIGINT, on_sigint, &b);
    if (b.deadline == NULL || b.sigint == NULL) {
        fprintf(stderr, "sampan bench: out of memory\n");
        goto out;
    }
    struct timeval dl = {(time_t)o->max_seconds, (suseconds_t)((o->max_seconds - floor(o->max_seconds)) * 1e6)};
    evtimer_add(b.deadline, &dl);
    evsignal_add(b.sigint, NULL);
    if (o->progress) {
        b.ticker = event_new(b.base, -1, EV_PERSIST, on_tick, &b);
        struct timeval half = {0, 500000};
        if (b.ticker != NULL) {
            evtimer_add(b.ticker, &half);
        }
    }
    b.t0 = sp_time_ns();
    for (int i = 0; i < o->concurrency; i++) {
        conn_next(&b.conns[i]);
    }
    if (b.running > 0 || b.next < o->num_prompts) {
        event_base_dispatch(b.base);
    }
    b.t_end = sp_time_ns();
    if (o->progress) {
        fprintf(stderr, "\r%70s\r", "");
    }
    if (b.fatal[0] != '\0') {
        fprintf(stderr, "sampan bench: %s: %s\n", o->url, b.fatal);
        rc = 1;
        goto out;
    }
    int wr = report(&b);
    rc = (wr != 0 || b.n_failed > 0 || b.n_ok == 0 || b.interrupted) ? 1 : 0;
out:
    bench_free(&b);
    return rc;
}
