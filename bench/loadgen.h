/*
 * loadgen.h - what the KServe load generators share (bench/kserve_load.c for REST,
 * bench/grpc_load.c for gRPC): fatal errors, the clock, latency samples and their
 * percentiles and their JSON, the arrival-gap generator and its timer, Ctrl-C, numeric
 * options and the request rows from the CSV (also for bench/xgb_floor.c); for the two load
 * generators also their shared options, the measured window, the open loop's backlog,
 * connecting and the summary line. Static inline
 * functions in a header: each program is one translation unit, and this keeps them so.
 * Each program defines lg_prog (its name, for messages) before including this.
 */
#ifndef SP_BENCH_LOADGEN_H
#define SP_BENCH_LOADGEN_H

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>

#define NS 1000000000LL

/* Samples of one run: latency (ns), send lag (ns), server queue and compute (us). */
typedef struct samples {
    int64_t *v;
    size_t n, cap;
} samples_t;

static inline void
die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(lg_prog, stderr);
    fputs(": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static inline int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS + ts.tv_nsec;
}

static inline void
samples_add(samples_t *s, int64_t v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 65536;
        int64_t *p = realloc(s->v, cap * sizeof *p);
        if (p == NULL) {
            die("out of memory for %zu samples", cap);
        }
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

static inline int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples (q in [0, 1]). */
static inline int64_t
pct(const samples_t *s, double q)
{
    if (s->n == 0) {
        return 0;
    }
    size_t k = (size_t)ceil(q * (double)s->n);
    return s->v[k == 0 ? 0 : k - 1];
}

static inline double
mean(const samples_t *s)
{
    double t = 0;
    for (size_t i = 0; i < s->n; i++) {
        t += (double)s->v[i];
    }
    return s->n ? t / (double)s->n : 0;
}

/* xorshift64*: arrival gaps and nothing else. */
static inline double
uniform01(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

/* The gap to the next arrival of an open loop at `rate` requests/s: exponential
 * (Poisson arrivals), or constant for the "uniform" schedule. */
static inline int64_t
lg_next_gap_ns(uint64_t *rng, double rate, const char *schedule)
{
    double mean_ns = 1e9 / rate;
    if (strcmp(schedule, "uniform") == 0) {
        return (int64_t)mean_ns;
    }
    double u = uniform01(rng);
    return (int64_t)(-log(1.0 - u) * mean_ns);
}

/* The timerfd tfd fires at the monotonic time `at` (ns; 0 means at once). */
static inline void
lg_arm_timer(int tfd, int64_t at)
{
    struct itimerspec its = {0};
    its.it_value.tv_sec = at / NS;
    its.it_value.tv_nsec = at % NS;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) {
        its.it_value.tv_nsec = 1;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* Ctrl-C ends the run early; the results so far are still reported. */
static volatile sig_atomic_t lg_interrupted;
static inline void
lg_on_sigint(int sig)
{
    (void)sig;
    lg_interrupted = 1;
}

/* "name":{n, mean, p50, p90, p99, p999, max} of s (sorted here), scaled to ms. */
static inline void
lg_put_dist_ms(FILE *f, const char *name, samples_t *s, double scale)
{
    if (s->n > 0) {
        qsort(s->v, s->n, sizeof *s->v, cmp_i64);
    }
    fprintf(f, "\"%s\":{\"n\":%zu,\"mean\":%.4f,\"p50\":%.4f,\"p90\":%.4f,\"p99\":%.4f,"
            "\"p999\":%.4f,\"max\":%.4f}", name, s->n, mean(s) * scale,
            (double)pct(s, 0.50) * scale, (double)pct(s, 0.90) * scale,
            (double)pct(s, 0.99) * scale, (double)pct(s, 0.999) * scale,
            (double)pct(s, 1.0) * scale);
}

/* The end of a result line, shared by the load generators: the latency
 * distributions (client ns, server us, each printed in ms), the last error
 * as a JSON string, the closing brace; closes f unless it is stdout. */
static inline void
lg_put_tail(FILE *f, samples_t *lat, samples_t *lat_send, samples_t *lag, samples_t *q_us,
            samples_t *c_us, const char *last_err)
{
    lg_put_dist_ms(f, "latency_ms", lat, 1e-6);
    fputc(',', f);
    lg_put_dist_ms(f, "latency_from_send_ms", lat_send, 1e-6);
    fputc(',', f);
    lg_put_dist_ms(f, "send_lag_ms", lag, 1e-6);
    fputc(',', f);
    lg_put_dist_ms(f, "server_queue_ms", q_us, 1e-3);
    fputc(',', f);
    lg_put_dist_ms(f, "server_compute_ms", c_us, 1e-3);
    fprintf(f, ",\"last_error\":\"");
    for (const char *p = last_err; *p; p++) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
        }
        fputc((unsigned char)*p < 0x20 ? ' ' : *p, f);
    }
    fprintf(f, "\"}\n");
    if (f != stdout) {
        fclose(f);
    }
}

/* The number v given to flag, within [lo, hi], or exit 2 saying why. */
static inline double
lg_num_arg(const char *flag, const char *v, double lo, double hi)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !(x >= lo && x <= hi)) {
        fprintf(stderr, "%s: %s: '%s' is not a number in [%g, %g]\n", lg_prog, flag, v, lo, hi);
        exit(2);
    }
    return x;
}

/* Splits one CSV line in place; returns the field count. */
static inline int
split_csv(char *line, char **f, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        f[n++] = p;
        char *c = strchr(p, ',');
        if (c == NULL) {
            break;
        }
        *c = '\0';
        p = c + 1;
    }
    p = f[n - 1];
    p[strcspn(p, "\r\n")] = '\0';
    return n;
}

#define MAX_ROWS 1000000 /* request rows read from the CSV at most */
#define MAX_COLS 4096    /* fields per CSV line at most */

/* One data row of the CSV: its index, n_cols numbers, and the expected
 * prediction (NAN without an --expect file). */
typedef void (*lg_row_fn)(void *ud, int i, const float *x, double expect);

/* Reads csv (header skipped; n_cols numbers from column first_col) and, when
 * expect_path is given, the last column of the same line of that file; calls
 * row() per data row, at most MAX_ROWS. Returns the row count; any malformed
 * line or a missing file ends the program with a message naming it. */
static inline int
lg_load_rows(const char *csv, const char *expect_path, int first_col, int n_cols, lg_row_fn row,
             void *ud)
{
    FILE *f = fopen(csv, "r");
    if (f == NULL) {
        die("%s: %s", csv, strerror(errno));
    }
    FILE *fe = NULL;
    if (expect_path && (fe = fopen(expect_path, "r")) == NULL) {
        die("%s: %s", expect_path, strerror(errno));
    }
    char *line = NULL, *eline = NULL;
    size_t lcap = 0, ecap = 0;
    char **fields = malloc(MAX_COLS * sizeof *fields);
    float *x = malloc(sizeof *x * (size_t)n_cols);
    if (x == NULL || fields == NULL) {
        die("out of memory");
    }
    int n = 0;
    bool header = true;
    while (getline(&line, &lcap, f) > 0 && n < MAX_ROWS) {
        double expect = NAN;
        if (fe) {
            if (getline(&eline, &ecap, fe) <= 0) {
                die("%s: fewer lines than %s", expect_path, csv);
            }
            int ne = split_csv(eline, fields, MAX_COLS);
            if (!header) {
                char *end;
                expect = strtod(fields[ne - 1], &end);
                if (end == fields[ne - 1]) {
                    die("%s: line %d: '%s' is not a number", expect_path, n + 2, fields[ne - 1]);
                }
            }
        }
        int nf = split_csv(line, fields, MAX_COLS);
        if (header) {
            header = false;
            continue;
        }
        if (nf < first_col + n_cols) {
            die("%s: line %d has %d fields, need %d", csv, n + 2, nf, first_col + n_cols);
        }
        for (int i = 0; i < n_cols; i++) {
            char *end;
            x[i] = strtof(fields[first_col + i], &end);
            if (end == fields[first_col + i] || *end != '\0') {
                die("%s: line %d field %d: '%s' is not a number", csv, n + 2, first_col + i + 1,
                    fields[first_col + i]);
            }
        }
        row(ud, n++, x, expect);
    }
    if (n == 0) {
        die("%s: no rows", csv);
    }
    free(fields);
    free(x);
    free(line);
    free(eline);
    fclose(f);
    if (fe) {
        fclose(fe);
    }
    return n;
}

/* ------------------------------------------------- what kserve_load and grpc_load share */

/* The options both load generators take; each adds its own beside these. */
typedef struct lg_opts {
    char host[256], port[16];
    const char *model, *csv, *expect, *input, *label, *json_path, *schedule;
    int first_col, n_cols, connections, closed;
    double rate, duration_s, warmup_s, drain_s;
    uint64_t seed;
} lg_opts_t;

/* The defaults of the shared options, but for the address (each program parses its own). */
static inline void
lg_opts_defaults(lg_opts_t *o, int connections)
{
    o->input = "input__0";
    o->schedule = "poisson";
    o->first_col = 1;
    o->n_cols = 30;
    o->connections = connections;
    o->duration_s = 10;
    o->warmup_s = 2;
    o->drain_s = 2;
    o->seed = 1;
}

/* Takes flag a with its value v when it is one of the shared options (true), exiting 2 on a
 * bad value; --connections is bounded by max_conns, --closed by max_closed. */
static inline bool
lg_parse_opt(lg_opts_t *o, const char *a, const char *v, int max_conns, int max_closed)
{
    const struct {
        const char *flag, **to;
    } strs[] = {
        {"--model", &o->model}, {"--csv", &o->csv},     {"--expect", &o->expect},
        {"--input", &o->input}, {"--label", &o->label}, {"--json", &o->json_path},
    };
    /* Numbers within [lo, hi], into an int (i) or a double (d). */
    const struct {
        const char *flag;
        double lo, hi;
        int *i;
        double *d;
    } nums[] = {
        {"--first-col", 0, MAX_COLS - 1, &o->first_col, NULL},
        {"--n-cols", 1, MAX_COLS - 1, &o->n_cols, NULL},
        {"--connections", 1, max_conns, &o->connections, NULL},
        {"--closed", 1, max_closed, &o->closed, NULL},
        {"--rate", 0.1, 1e7, NULL, &o->rate},
        {"--duration", 0.1, 3600, NULL, &o->duration_s},
        {"--warmup", 0, 3600, NULL, &o->warmup_s},
        {"--drain", 0, 600, NULL, &o->drain_s},
    };
    for (size_t k = 0; k < sizeof strs / sizeof *strs; k++) {
        if (strcmp(a, strs[k].flag) == 0) {
            *strs[k].to = v;
            return true;
        }
    }
    for (size_t k = 0; k < sizeof nums / sizeof *nums; k++) {
        if (strcmp(a, nums[k].flag) == 0) {
            double x = lg_num_arg(a, v, nums[k].lo, nums[k].hi);
            if (nums[k].i) {
                *nums[k].i = (int)x;
            } else {
                *nums[k].d = x;
            }
            return true;
        }
    }
    if (strcmp(a, "--schedule") == 0) {
        if (strcmp(v, "poisson") != 0 && strcmp(v, "uniform") != 0) {
            die("--schedule: poisson or uniform");
        }
        o->schedule = v;
    } else if (strcmp(a, "--seed") == 0) {
        o->seed = (uint64_t)lg_num_arg(a, v, 0, 1e15);
    } else {
        return false;
    }
    return true;
}

/* The usage lines of the shared options, in the order both programs print them. */
#define LG_USAGE_COLUMNS                                                                       \
    "  --first-col N      first feature column, 0-based (default 1)\n"                        \
    "  --n-cols N         features per row (default 30)\n"                                    \
    "  --input NAME       input tensor name (default input__0)\n"
#define LG_USAGE_RUN                                                                           \
    "  --duration S       measured seconds (default 10)\n"                                    \
    "  --warmup S         unmeasured seconds first (default 2)\n"                             \
    "  --drain S          wait at most S s for answers after the end (default 2)\n"           \
    "  --seed N           arrival schedule seed (default 1)\n"                                \
    "  --label NAME       name of the run in the output\n"                                    \
    "  --json FILE        write the JSON result there (default stdout)\n"

/* Exits 2 with the usage unless the options name a model, a CSV and exactly one loop. */
static inline void
lg_check_opts(const lg_opts_t *o, const char *usage)
{
    if (o->model == NULL || o->csv == NULL || (o->rate > 0) == (o->closed > 0)) {
        fprintf(stderr, "%s: --model, --csv and one of --rate / --closed are needed\n%s", lg_prog,
                usage);
        exit(2);
    }
}

/* The server's address from host and port, or exit 2 saying why. */
static inline void
lg_resolve(const lg_opts_t *o, struct sockaddr_storage *addr, socklen_t *addr_len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    int gai = getaddrinfo(o->host, o->port, &hints, &ai);
    if (gai != 0) {
        die("%s:%s: %s", o->host, o->port, gai_strerror(gai));
    }
    memcpy(addr, ai->ai_addr, ai->ai_addrlen);
    *addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);
}

/* Before the run: exact timer wake-ups, Ctrl-C ends it early, a closed socket is an error
 * return rather than a signal. */
static inline void
lg_prepare_run(void)
{
    /* The default 50 us timer slack would add up to 50 us to every scheduled send. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    signal(SIGINT, lg_on_sigint);
    signal(SIGPIPE, SIG_IGN);
}

/* The CPU time (user and system, s) this process has used so far. */
static inline double
lg_cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/* The epoll set and the schedule's timerfd, registered there with a NULL pointer (connections
 * register themselves). */
static inline void
lg_open_epoll(int *ep, int *tfd)
{
    *ep = epoll_create1(EPOLL_CLOEXEC);
    *tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (*ep < 0 || *tfd < 0) {
        die("epoll/timerfd: %s", strerror(errno));
    }
    struct epoll_event tev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(*ep, EPOLL_CTL_ADD, *tfd, &tev);
}

/* A non-blocking TCP_NODELAY socket connecting to addr, in ep (in and out) with ptr. */
static inline int
lg_connect(const lg_opts_t *o, const struct sockaddr_storage *addr, socklen_t addr_len, int ep,
           void *ptr)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        die("socket: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)addr, addr_len) != 0 && errno != EINPROGRESS) {
        die("connect %s:%s: %s", o->host, o->port, strerror(errno));
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = ptr};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        die("epoll_ctl: %s", strerror(errno));
    }
    return fd;
}

/* After the first event of a connecting socket: exit 2 when the connection failed. */
static inline void
lg_check_connected(const lg_opts_t *o, int fd)
{
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
        die("connect %s:%s: %s", o->host, o->port, strerror(err));
    }
}

/* The run's times (ns, monotonic): warm-up from t0, the measured window [warm_end, end), then
 * answers are awaited until drain_end. */
typedef struct lg_window {
    int64_t t0, warm_end, end, drain_end;
} lg_window_t;

/* The window of a run that starts in 10 ms (time to arm the timer). */
static inline void
lg_window_start(lg_window_t *w, const lg_opts_t *o)
{
    w->t0 = now_ns() + NS / 100;
    w->warm_end = w->t0 + (int64_t)(o->warmup_s * NS);
    w->end = w->warm_end + (int64_t)(o->duration_s * NS);
    w->drain_end = w->end + (int64_t)(o->drain_s * NS);
}

static inline bool
lg_in_window(const lg_window_t *w, int64_t t)
{
    return t >= w->warm_end && t < w->end;
}

/* Whether a request scheduled at sched and done (or failed) at done counts: open loop, by
 * scheduled time (what was offered in the window); closed loop, by completion time (what was
 * served in the window). */
static inline bool
lg_counts(const lg_window_t *w, const lg_opts_t *o, int64_t sched, int64_t done)
{
    return lg_in_window(w, o->closed ? done : sched);
}

#define LG_BACKLOG_CAP (1 << 20) /* scheduled requests waiting for a connection or stream */

/* The open loop's backlog: scheduled times waiting for a free connection (or stream), FIFO. */
typedef struct lg_backlog {
    int64_t *sched; /* a ring of LG_BACKLOG_CAP */
    size_t head, n, max;
    uint64_t n_backlogged, n_dropped; /* in the measured window; dropped: the ring was full */
} lg_backlog_t;

static inline void
lg_backlog_alloc(lg_backlog_t *b)
{
    b->sched = malloc(LG_BACKLOG_CAP * sizeof *b->sched);
    if (b->sched == NULL) {
        die("out of memory");
    }
}

/* Queues the request scheduled at t; counted: it is in the measured window. */
static inline void
lg_backlog_push(lg_backlog_t *b, int64_t t, bool counted)
{
    if (counted) {
        b->n_backlogged++;
    }
    if (b->n == LG_BACKLOG_CAP) {
        b->n_dropped++;
        return;
    }
    b->sched[(b->head + b->n) % LG_BACKLOG_CAP] = t;
    if (++b->n > b->max) {
        b->max = b->n;
    }
}

/* The oldest scheduled time, taken off (the backlog is not empty). */
static inline int64_t
lg_backlog_pop(lg_backlog_t *b)
{
    int64_t s = b->sched[b->head];
    b->head = (b->head + 1) % LG_BACKLOG_CAP;
    b->n--;
    return s;
}

/* How many of the requests still waiting were scheduled in the measured window. */
static inline uint64_t
lg_backlog_in_window(const lg_backlog_t *b, const lg_window_t *w)
{
    uint64_t n = 0;
    for (size_t k = 0; k < b->n; k++) {
        n += lg_in_window(w, b->sched[(b->head + k) % LG_BACKLOG_CAP]);
    }
    return n;
}

/* The JSON result's file: json_path, or stdout without one. */
static inline FILE *
lg_open_json(const char *json_path)
{
    FILE *f = stdout;
    if (json_path && (f = fopen(json_path, "w")) == NULL) {
        die("%s: %s", json_path, strerror(errno));
    }
    return f;
}

/* The start of the summary line on stderr: "[label] what", then the loop's parameters. */
static inline void
lg_summary_head(const lg_opts_t *o, const char *what)
{
    fprintf(stderr, "%s%s%s%s", o->label ? "[" : "", o->label ? o->label : "",
            o->label ? "] " : "", what);
}

/* The middle of the summary line: client latencies (ns samples) and the server's (us
 * samples), in ms; the samples are sorted (lg_put_tail). */
static inline void
lg_summary_latency(const samples_t *lat, const samples_t *lat_send, const samples_t *lag,
                   const samples_t *q_us, const samples_t *c_us)
{
    fprintf(stderr, "latency ms p50 %.3f p90 %.3f p99 %.3f p99.9 %.3f max %.3f (p99 from the "
            "actual send %.3f); send lag p50 %.3f p99 %.3f ms; server queue p99 %.3f compute "
            "p99 %.3f ms; ",
            (double)pct(lat, 0.5) * 1e-6, (double)pct(lat, 0.9) * 1e-6,
            (double)pct(lat, 0.99) * 1e-6, (double)pct(lat, 0.999) * 1e-6,
            (double)pct(lat, 1.0) * 1e-6, (double)pct(lat_send, 0.99) * 1e-6,
            (double)pct(lag, 0.5) * 1e-6, (double)pct(lag, 0.99) * 1e-6,
            (double)pct(q_us, 0.99) * 1e-3, (double)pct(c_us, 0.99) * 1e-3);
}

#endif /* SP_BENCH_LOADGEN_H */
