/*
 * xgb_floor.c - the floor under the fraud-scoring benchmark: the XGBoost C API called directly in a
 * loop, with no server, no HTTP and no JSON.
 *
 *   xgb_floor --model MODEL.json --csv ROWS.csv [--first-col 1] [--n-cols 30]
 *             [--batches 1,64] [--seconds 2] [--expect PRED.csv] [--json FILE]
 *
 * The booster is loaded once with nthread 1 (what the xgboost backend uses for batches under 256
 * rows) and called through XGBoosterPredictFromDense ("inplace predict", the backend's call) on
 * batches of each size in --batches, rows cycling through the CSV, for --seconds each (after a
 * short warm-up). For each size: calls/s, rows/s and the per-call latency distribution. The
 * array-interface string is formatted on every call, as the backend does.
 *
 * Also measured, as a reference for the server's per-request work that is not XGBoost: jansson
 * (the server's JSON parser) loading one KServe v2 request body for one row and reading its 30
 * numbers out ("json_parse"). It is a lower bound for the JSON part of the server's work (the
 * server also validates, and writes a JSON answer).
 *
 * With --expect (last column = expected prediction, same row order) the single-row predictions
 * are checked first (relative 1e-5); a mismatch exits 1.
 *
 *   xgb_floor --jitter S
 *
 * measures the machine instead: it reads the clock in a tight loop for S seconds and reports the
 * gaps (time the thread did not run: other processes, interrupts, the hypervisor pausing the VM).
 * Run on an otherwise idle CPU, it is the floor under any tail latency on that CPU.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <xgboost/c_api.h>

static const char *const lg_prog = "xgb_floor";
#include "loadgen.h"

#define MAX_BATCHES 16

static void
xgb_check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "xgb_floor: %s: %s\n", what, XGBGetLastError());
        exit(2);
    }
}

static double
pct_us(const int64_t *v, size_t n, double q)
{
    if (n == 0) {
        return 0;
    }
    size_t k = (size_t)ceil(q * (double)n);
    return (double)v[k == 0 ? 0 : k - 1] / 1e3;
}

/* The rows of the CSV (lg_load_rows), n_cols floats each, and their expected predictions. */
typedef struct rows {
    float *x;
    double *expect;
    int n_cols, n, cap;
} rows_t;

static void
add_row(void *ud, int i, const float *x, double expect)
{
    rows_t *r = ud;
    if (i == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 1024;
        r->x = realloc(r->x, (size_t)r->cap * (size_t)r->n_cols * sizeof *r->x);
        r->expect = realloc(r->expect, (size_t)r->cap * sizeof *r->expect);
        if (r->x == NULL || r->expect == NULL) {
            die("out of memory");
        }
    }
    memcpy(r->x + (size_t)i * (size_t)r->n_cols, x, (size_t)r->n_cols * sizeof *x);
    r->expect[i] = expect;
    r->n = i + 1;
}

static const float *
predict(BoosterHandle b, const float *x, int rows, int n_cols, bst_ulong *n_out)
{
    static const char cfg[] = "{\"type\": 0, \"training\": false, \"cache_id\": 0, "
                              "\"iteration_begin\": 0, \"iteration_end\": 0, "
                              "\"strict_shape\": false, \"missing\": NaN}";
    char arr[160];
    snprintf(arr, sizeof arr, "{\"data\": [%" PRIuPTR ", true], \"shape\": [%d, %d], "
             "\"typestr\": \"<f4\", \"version\": 3}", (uintptr_t)x, rows, n_cols);
    const bst_ulong *shape = NULL;
    bst_ulong dim = 0;
    const float *res = NULL;
    xgb_check(XGBoosterPredictFromDense(b, arr, cfg, NULL, &shape, &dim, &res), "predict");
    bst_ulong total = 1;
    for (bst_ulong d = 0; d < dim; d++) {
        total *= shape[d];
    }
    *n_out = total;
    return res;
}

/* One KServe v2 JSON body for row x (as bench/kserve_load.c sends it). */
static size_t
json_body(char *buf, size_t cap, const float *x, int n_cols)
{
    size_t n = (size_t)snprintf(buf, cap,
                                "{\"inputs\":[{\"name\":\"input__0\",\"datatype\":\"FP32\","
                                "\"shape\":[1,%d],\"data\":[", n_cols);
    for (int i = 0; i < n_cols && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%.9g", i ? "," : "", (double)x[i]);
    }
    n += (size_t)snprintf(buf + n, cap > n ? cap - n : 0, "]}]}");
    if (n >= cap) {
        die("JSON body too long");
    }
    return n;
}

/* Gaps in a tight clock-reading loop: the time this CPU was taken away from the thread. */
static int
jitter(double seconds)
{
    int64_t t0 = now_ns(), end = t0 + (int64_t)(seconds * NS), prev = t0, max = 0, lost = 0;
    long n100us = 0, n1ms = 0, n5ms = 0;
    for (int64_t t = t0; t < end;) {
        t = now_ns();
        int64_t g = t - prev;
        prev = t;
        if (g > 100000) {
            n100us++;
            lost += g;
        }
        n1ms += g > 1000000;
        n5ms += g > 5000000;
        max = g > max ? g : max;
    }
    printf("{\"seconds\":%.1f,\"gaps_over_100us\":%ld,\"gaps_over_1ms\":%ld,\"gaps_over_5ms\":%ld,"
           "\"max_gap_ms\":%.3f,\"lost_ms\":%.3f}\n", seconds, n100us, n1ms, n5ms,
           (double)max / 1e6, (double)lost / 1e6);
    fprintf(stderr, "xgb_floor: jitter over %.1f s: %ld gaps over 100 us (%.1f ms lost), %ld over "
            "1 ms, %ld over 5 ms, longest %.2f ms\n", seconds, n100us, (double)lost / 1e6, n1ms,
            n5ms, (double)max / 1e6);
    return 0;
}

int
main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--jitter") == 0) {
        double s = atof(argv[2]);
        return s > 0 && s <= 600 ? jitter(s) : 2;
    }
    const char *model = NULL, *csv = NULL, *expect = NULL, *json_path = NULL;
    const char *batches_s = "1,64";
    int first = 1, n_cols = 30;
    double seconds = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--csv") == 0) {
            csv = v;
        } else if (strcmp(a, "--expect") == 0) {
            expect = v;
        } else if (strcmp(a, "--json") == 0) {
            json_path = v;
        } else if (strcmp(a, "--batches") == 0) {
            batches_s = v;
        } else if (strcmp(a, "--first-col") == 0) {
            first = atoi(v);
        } else if (strcmp(a, "--n-cols") == 0) {
            n_cols = atoi(v);
        } else if (strcmp(a, "--seconds") == 0) {
            seconds = atof(v);
        } else {
            fprintf(stderr, "xgb_floor: unknown option %s\n", a);
            return 2;
        }
    }
    if (model == NULL || csv == NULL || n_cols < 1 || n_cols >= MAX_COLS || first < 0 ||
        !(seconds > 0 && seconds <= 600)) {
        fprintf(stderr, "usage: xgb_floor --model MODEL.json --csv ROWS.csv [--first-col 1] "
                "[--n-cols 30] [--batches 1,64] [--seconds 2] [--expect PRED.csv] [--json FILE]\n");
        return 2;
    }
    int batches[MAX_BATCHES], n_batches = 0, max_batch = 1;
    for (const char *p = batches_s; *p && n_batches < MAX_BATCHES;) {
        int b = atoi(p);
        if (b < 1 || b > 65536) {
            die("--batches: sizes in [1, 65536]");
        }
        batches[n_batches++] = b;
        max_batch = b > max_batch ? b : max_batch;
        p += strcspn(p, ",");
        p += *p == ',';
    }

    rows_t rows = {.n_cols = n_cols};
    int n_rows = lg_load_rows(csv, expect, first, n_cols, add_row, &rows);
    const float *x = rows.x;
    /* Rows repeated so that any window of max_batch rows starting at a row index is contiguous. */
    size_t row_bytes = (size_t)n_cols * sizeof(float);
    float *xx = malloc((size_t)(n_rows + max_batch) * row_bytes);
    if (xx == NULL) {
        die("out of memory");
    }
    for (int i = 0; i < n_rows + max_batch; i++) {
        memcpy(xx + (size_t)i * (size_t)n_cols, x + (size_t)(i % n_rows) * (size_t)n_cols,
               row_bytes);
    }

    BoosterHandle b;
    xgb_check(XGBoosterCreate(NULL, 0, &b), "create");
    xgb_check(XGBoosterLoadModel(b, model), model);
    xgb_check(XGBoosterSetParam(b, "nthread", "1"), "nthread");

    int rc = 0;
    if (expect) {
        /* The expected file's last column, one line per row in the same order. */
        int bad = 0;
        for (int k = 0; k < n_rows; k++) {
            double want = rows.expect[k];
            bst_ulong n = 0;
            const float *got = predict(b, x + (size_t)k * (size_t)n_cols, 1, n_cols, &n);
            if (n < 1 || !(fabs(got[0] - want) <= 1e-5 * fmax(1.0, fabs(want)))) {
                if (bad++ < 3) {
                    fprintf(stderr, "xgb_floor: row %d: %.9g, expected %.9g\n", k,
                            n ? got[0] : NAN, want);
                }
            }
        }
        fprintf(stderr, "xgb_floor: %d rows checked against %s: %d mismatches\n", n_rows, expect,
                bad);
        rc = bad ? 1 : 0;
    }

    FILE *out = stdout;
    if (json_path && (out = fopen(json_path, "w")) == NULL) {
        die("cannot write --json");
    }
    int maj, min, pat;
    XGBoostVersion(&maj, &min, &pat);
    fprintf(out, "{\"model\":\"%s\",\"rows\":%d,\"nthread\":1,\"xgboost\":\"%d.%d.%d\",\"runs\":[",
            model, n_rows, maj, min, pat);
    size_t cap = 1 << 20;
    int64_t *lat = malloc(cap * sizeof *lat);
    if (lat == NULL) {
        die("out of memory");
    }
    for (int bi = 0; bi < n_batches; bi++) {
        int bs = batches[bi];
        int row = 0;
        bst_ulong n = 0;
        volatile float sink = 0;
        /* 0.2 s warm-up: caches, the library's first-call setup. */
        int64_t warm = now_ns() + NS / 5;
        while (now_ns() < warm) {
            sink += predict(b, xx + (size_t)row * (size_t)n_cols, bs, n_cols, &n)[0];
            row = (row + bs) % n_rows;
        }
        size_t calls = 0;
        int64_t t0 = now_ns(), stop = t0 + (int64_t)(seconds * NS), t = t0;
        while (t < stop) {
            int64_t a = t;
            sink += predict(b, xx + (size_t)row * (size_t)n_cols, bs, n_cols, &n)[0];
            t = now_ns();
            if (calls < cap) {
                lat[calls] = t - a;
            }
            calls++;
            row = (row + bs) % n_rows;
        }
        double wall = (double)(t - t0) / 1e9;
        size_t kept = calls < cap ? calls : cap;
        qsort(lat, kept, sizeof *lat, cmp_i64);
        double mean_us = wall * 1e6 / (double)calls;
        fprintf(stderr, "xgb_floor: batch %d: %.0f calls/s, %.0f rows/s; per call us: mean %.2f "
                "p50 %.2f p99 %.2f max %.2f (%.2f us/row)\n", bs, (double)calls / wall,
                (double)calls * bs / wall, mean_us, pct_us(lat, kept, 0.5),
                pct_us(lat, kept, 0.99), pct_us(lat, kept, 1.0), mean_us / bs);
        fprintf(out, "%s{\"batch\":%d,\"calls_per_s\":%.1f,\"rows_per_s\":%.1f,"
                "\"call_us\":{\"mean\":%.3f,\"p50\":%.3f,\"p99\":%.3f,\"max\":%.3f},"
                "\"us_per_row\":%.3f}", bi ? "," : "", bs,
                (double)calls / wall, (double)calls * bs / wall, mean_us, pct_us(lat, kept, 0.5),
                pct_us(lat, kept, 0.99), pct_us(lat, kept, 1.0), mean_us / bs);
        (void)sink;
    }

    /* jansson on one request body, as a reference for the server's JSON work. */
    {
        char body[4096];
        size_t blen = json_body(body, sizeof body, x, n_cols);
        size_t calls = 0;
        volatile double sink = 0;
        int64_t t0 = now_ns(), stop = t0 + (int64_t)(seconds / 2 * NS), t = t0;
        while (t < stop) {
            int64_t a = t;
            json_error_t je;
            json_t *root = json_loadb(body, blen, 0, &je);
            json_t *in0 = json_array_get(json_object_get(root, "inputs"), 0);
            json_t *data = json_object_get(in0, "data");
            for (size_t i = 0; i < json_array_size(data); i++) {
                sink += json_number_value(json_array_get(data, i));
            }
            json_decref(root);
            t = now_ns();
            if (calls < cap) {
                lat[calls] = t - a;
            }
            calls++;
        }
        size_t kept = calls < cap ? calls : cap;
        qsort(lat, kept, sizeof *lat, cmp_i64);
        double mean_us = (double)(t - t0) / 1e3 / (double)calls;
        fprintf(stderr, "xgb_floor: jansson parse of one %zu-byte request body: mean %.2f us, "
                "p50 %.2f p99 %.2f\n", blen, mean_us, pct_us(lat, kept, 0.5),
                pct_us(lat, kept, 0.99));
        fprintf(out, "],\"json_parse\":{\"body_bytes\":%zu,\"mean_us\":%.3f,\"p50_us\":%.3f,"
                "\"p99_us\":%.3f}}\n", blen, mean_us, pct_us(lat, kept, 0.5),
                pct_us(lat, kept, 0.99));
        (void)sink;
    }
    if (out != stdout) {
        fclose(out);
    }
    free(lat);
    free(xx);
    free(rows.x);
    free(rows.expect);
    XGBoosterFree(b);
    return rc;
}
