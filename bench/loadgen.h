/*
 * loadgen.h - what the KServe load generators share (bench/kserve_load.c for REST,
 * bench/grpc_load.c for gRPC): fatal errors, the clock, latency samples and their
 * percentiles and their JSON, the arrival-gap generator and its timer, Ctrl-C, numeric
 * options and the request rows from the CSV (also for bench/xgb_floor.c). Static inline
 * functions in a header: each program is one translation unit, and this keeps them so.
 * Each program defines lg_prog (its name, for messages) before including this.
 */
#ifndef SP_BENCH_LOADGEN_H
#define SP_BENCH_LOADGEN_H

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
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

/* The number v given to flag, within [lo, hi], or exit 2 saying why. */
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

#endif /* SP_BENCH_LOADGEN_H */
