/*
 * quantize.c - `sampan quantize IN OUT TYPE`: convert a model's weights.
 *
 *   sampan quantize IN OUT TYPE [--threads N] [--progress] [--verbose] [--pure] [--dry-run]
 *   TYPE: a llama-quantize file type (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, ..., spelled in
 *         capitals as llama-quantize spells them; any case for the names with _S/_M/_L):
 *         llama.cpp's per-tensor mix (quant_mix.c), or a single type
 *         f32 f16 bf16 q8_0 q4_0 q4_k q6_k (lower case) with the rules below.
 *
 * A mix gives every tensor the type llama.cpp's quantizer gives it (so the files have the
 * same per-tensor types); --pure drops the per-tensor rules (llama-quantize --pure);
 * --dry-run prints the plan and writes nothing. A mix that needs a type this build cannot
 * write (q5_k, q3_k, ...) is refused before anything is written, naming the tensor.
 *
 * Which tensors change with a single type:
 *   - 2-D and larger float tensors (F32/F16/BF16), token_embd.weight and
 *     output.weight included, go to TYPE when ne[0] is a multiple of its block.
 *     For q4_k, output.weight goes to q6_k (as llama.cpp's Q4_K_M does: the
 *     output matrix is the most sensitive one).
 *   - A k-quant that does not fit ne[0] (a multiple of 32 but not of 256) falls
 *     back to q8_0; a row that fits no block stays in its source type.
 *   - 1-D tensors (norms, biases) are stored as F32.
 *   - Tensors already quantized are copied unchanged (no requantizing).
 * All metadata is copied; general.file_type (llama.cpp ftype numbering) and
 * general.quantization_version = 2 are set.
 *
 * The output is streamed: the writer asks for ~16 MiB of rows at a time, the
 * rows are converted on the thread pool straight from the input mapping, and
 * the file appears under its name only once complete (temp + rename).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/pool.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tools/quant_mix.h"
#include "tools/tools.h"

typedef struct target {
    const char *name;
    sp_type_t type;
    uint32_t ftype; /* llama.cpp LLAMA_FTYPE_* */
} target;

static const target targets[] = {
    {"f32", SP_TYPE_F32, 0},   {"f16", SP_TYPE_F16, 1},   {"bf16", SP_TYPE_BF16, 32},
    {"q8_0", SP_TYPE_Q8_0, 7}, {"q4_0", SP_TYPE_Q4_0, 2}, {"q4_k", SP_TYPE_Q4_K, 15},
    {"q6_k", SP_TYPE_Q6_K, 18},
};

/* Shared by every tensor's fill: the pool, per-thread scratch rows and the progress line. */
typedef struct qctx {
    sp_pool_t *pool;
    int n_threads;
    float *scratch;        /* n_threads rows of max_ne0 floats */
    int64_t max_ne0;
    bool progress;
    double total_elems, done_elems;
    int last_pct;
    double t0;
} qctx;

typedef struct job {
    qctx *q;
    const sp_gguf_tensor_t *src;
    sp_type_t dst_type;
    size_t src_row_bytes, dst_row_bytes;
    const char *why;       /* why the type differs from the request, or NULL */
} job;

/* One pool call: rows [row0, row0 + n_rows) of job into dst. */
typedef struct rows_task {
    const job *j;
    int64_t row0, n_rows;
    uint8_t *dst;
    int failed;
} rows_task;

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define ROWS_PER_CHUNK 16

static void
convert_rows(void *ctx, int64_t chunk, int ith)
{
    rows_task *t = ctx;
    const job *j = t->j;
    int64_t ne0 = j->src->ne[0];
    int64_t r0 = chunk * ROWS_PER_CHUNK;
    int64_t r1 = r0 + ROWS_PER_CHUNK < t->n_rows ? r0 + ROWS_PER_CHUNK : t->n_rows;
    float *row = j->q->scratch + (size_t)ith * (size_t)j->q->max_ne0;
    const uint8_t *src = (const uint8_t *)j->src->data;
    for (int64_t r = r0; r < r1; r++) {
        const void *s = src + (size_t)(t->row0 + r) * j->src_row_bytes;
        void *d = t->dst + (size_t)r * j->dst_row_bytes;
        if (!sp_dequantize_row(j->src->type, s, row, ne0) ||
            !sp_quantize_row(j->dst_type, row, d, ne0)) {
            __atomic_store_n(&t->failed, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

static void
show_progress(qctx *q, const sp_gguf_tensor_t *t, bool force)
{
    if (!q->progress) {
        return;
    }
    int pct = q->total_elems > 0 ? (int)(100.0 * q->done_elems / q->total_elems) : 100;
    if (pct == q->last_pct && !force) {
        return;
    }
    q->last_pct = pct;
    char bar[41];
    int fill = pct * 40 / 100;
    for (int i = 0; i < 40; i++) {
        bar[i] = i < fill ? '#' : '.';
    }
    bar[40] = '\0';
    fprintf(stderr, "\rquantize [%s] %3d%%  %-40.*s", bar, pct,
            (int)(t->name.len < 40 ? t->name.len : 40), t->name.ptr);
    fflush(stderr);
}

static sp_status_t
fill(void *user, int64_t row0, int64_t n_rows, void *dst, char *err, size_t err_len)
{
    job *j = user;
    if (j->src->type == j->dst_type) {
        memcpy(dst, (const uint8_t *)j->src->data + (size_t)row0 * j->src_row_bytes,
               (size_t)n_rows * j->src_row_bytes);
    } else {
        rows_task t = {j, row0, n_rows, dst, 0};
        /* small chunks are not worth waking the pool for */
        int64_t n_chunks = (n_rows + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
        if (j->q->pool != NULL && (double)n_rows * (double)j->src->ne[0] >= 65536.0) {
            sp_pool_run(j->q->pool, convert_rows, &t, n_chunks);
        } else {
            for (int64_t i = 0; i < n_chunks; i++) {
                convert_rows(&t, i, 0);
            }
        }
        if (t.failed) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                           "tensor '%.*s': no conversion %s -> %s", (int)j->src->name.len,
                           j->src->name.ptr, sp_type_name(j->src->type),
                           sp_type_name(j->dst_type));
        }
    }
    j->q->done_elems += (double)n_rows * (double)j->src->ne[0];
    show_progress(j->q, j->src, false);
    return SP_OK;
}

static bool
is_float(sp_type_t t)
{
    return t == SP_TYPE_F32 || t == SP_TYPE_F16 || t == SP_TYPE_BF16;
}

/* The stored type for tensor t when the user asked for `want`; *why says why it differs. */
static sp_type_t
choose(const sp_gguf_tensor_t *t, sp_type_t want, const char **why)
{
    *why = NULL;
    if (!is_float(t->type)) {
        *why = "already quantized, copied";
        return t->type;
    }
    if (t->n_dims < 2) {
        if (want != SP_TYPE_F32) {
            *why = "1-D, kept in f32";
        }
        return SP_TYPE_F32;
    }
    sp_type_t tt = want;
    if (want == SP_TYPE_Q4_K && sp_str_eq_c(t->name, "output.weight")) {
        tt = SP_TYPE_Q6_K;
        *why = "output matrix, q6_k as in Q4_K_M";
    }
    if (t->ne[0] % sp_type_traits(tt)->blck_size == 0) {
        return tt;
    }
    if ((tt == SP_TYPE_Q4_K || tt == SP_TYPE_Q6_K) && t->ne[0] % SP_QK8_0 == 0) {
        *why = "ne[0] not a multiple of 256, q8_0 instead";
        return SP_TYPE_Q8_0;
    }
    *why = "ne[0] not a multiple of the block size, kept";
    return t->type;
}

static void
human(char *buf, size_t n, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) {
        b /= 1024.0;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

static const char quantize_usage[] =
    "usage: sampan quantize IN OUT TYPE [--threads N] [--progress] [--verbose] [--pure]\n"
    "                      [--dry-run]\n"
    "  TYPE        a llama.cpp mix: Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q8_0, Q4_0, Q4_1,\n"
    "              Q5_0, Q5_1, Q3_K_S, Q3_K_M, Q3_K_L, Q2_K, IQ4_NL, IQ4_XS, F16, BF16, F32\n"
    "              (per-tensor types as llama-quantize chooses them), or one type for all\n"
    "              weights: f32, f16, bf16, q8_0, q4_0, q4_k (output q6_k) or q6_k\n"
    "  --threads N worker threads (default: one per core)\n"
    "  --progress  progress bar on stderr even when it is not a terminal\n"
    "  --verbose   one line per tensor\n"
    "  --pure      a mix without its per-tensor rules: every weight in the base type\n"
    "  --dry-run   print the per-tensor plan (as --verbose) and write nothing\n"
    "One type: 2-D float weights take TYPE; 1-D tensors stay f32; quantized inputs are copied.\n";

/* Whether this build can write type t (a float type or a quantizer it has). */
static bool
can_write(sp_type_t t)
{
    const sp_type_traits_t *tr = sp_type_traits(t);
    if (tr == NULL || tr->blck_size > 256 || tr->type_size > 512) {
        return false;
    }
    float zero[256] = {0};
    uint8_t out[512];
    return sp_quantize_row(t, zero, out, tr->blck_size);
}

/* The mix's plan into jobs[i].dst_type / why. `strict` (a real run, not a dry run): every
 * type must be writable and no quantized tensor may be requantized. */
static bool
plan_mix(const sp_quant_mix_t *mix, bool pure, bool strict, const sp_gguf_t *g, job *jobs)
{
    int64_t n = sp_gguf_n_tensors(g);
    sp_type_t *types = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *types);
    const char **whys = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *whys);
    char err[256];
    bool ok = types != NULL && whys != NULL;
    if (!ok) {
        fprintf(stderr, "sampan quantize: out of memory\n");
    } else if (sp_quant_mix_plan(mix, g, pure, types, whys, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan quantize: %s\n", err);
        ok = false;
    }
    for (int64_t i = 0; ok && i < n; i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        jobs[i].dst_type = types[i];
        jobs[i].why = whys[i];
        if (types[i] == t->type || !strict) {
            continue;
        }
        if (!is_float(t->type)) {
            fprintf(stderr, "sampan quantize: tensor '%.*s' is already %s; %s would requantize it "
                    "to %s (start from an f32/f16/bf16 model)\n", (int)t->name.len, t->name.ptr,
                    sp_type_name(t->type), mix->name, sp_type_name(types[i]));
            ok = false;
        } else if (!can_write(types[i])) {
            fprintf(stderr, "sampan quantize: %s puts tensor '%.*s' in %s, which this build "
                    "cannot write\n", mix->name, (int)t->name.len, t->name.ptr,
                    sp_type_name(types[i]));
            ok = false;
        }
    }
    sp_free(types);
    sp_free(whys);
    return ok;
}

int
sp_cmd_quantize(int argc, char **argv)
{
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0, n_threads = 0;
    bool progress = isatty(STDERR_FILENO), verbose = false, pure = false, dry_run = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 1 || v > 1024) {
                fprintf(stderr, "sampan quantize: --threads wants 1..1024\n");
                return 2;
            }
            n_threads = (int)v;
        } else if (strcmp(a, "--progress") == 0) {
            progress = true;
        } else if (strcmp(a, "--no-progress") == 0) {
            progress = false;
        } else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            verbose = true;
        } else if (strcmp(a, "--pure") == 0) {
            pure = true;
        } else if (strcmp(a, "--dry-run") == 0) {
            dry_run = verbose = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(quantize_usage, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "sampan quantize: unknown option '%s'\n%s", a, quantize_usage);
            return 2;
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            fprintf(stderr, "sampan quantize: too many arguments\n%s", quantize_usage);
            return 2;
        }
    }
    if (n_pos != 3) {
        fputs(quantize_usage, stderr);
        return 2;
    }
    /* A mix spelled exactly as llama-quantize spells it (capitals) first, then the single
     * types in any case, then the mixes in any case. */
    const target *tg = NULL;
    const sp_quant_mix_t *mix = sp_quant_mix_find(pos[2]);
    if (mix != NULL && strcmp(mix->name, pos[2]) != 0) {
        mix = NULL;
    }
    for (size_t i = 0; mix == NULL && i < sizeof targets / sizeof targets[0]; i++) {
        if (strcasecmp(pos[2], targets[i].name) == 0) {
            tg = &targets[i];
        }
    }
    if (tg == NULL && mix == NULL) {
        mix = sp_quant_mix_find(pos[2]);
    }
    if (tg == NULL && mix == NULL) {
        fprintf(stderr, "sampan quantize: unknown type '%s'\n%s", pos[2], quantize_usage);
        return 2;
    }
    if (pure && mix == NULL) {
        fprintf(stderr, "sampan quantize: --pure applies to a mix (Q4_K_M, ...), not to '%s'\n",
                pos[2]);
        return 2;
    }
    const char *out_name = mix ? mix->name : tg->name;
    sp_type_t base = mix ? mix->base : tg->type;
    uint32_t ftype = mix ? mix->ftype : tg->ftype;

    int rc = 1;
    char err[512];
    sp_gguf_t *g = NULL;
    sp_gguf_writer_t *w = NULL;
    job *jobs = NULL;
    qctx q;
    memset(&q, 0, sizeof q);
    q.last_pct = -1;
    q.t0 = now_s();
    q.progress = progress;

    sp_status_t st = sp_gguf_open(pos[0], &g, err, sizeof err);
    if (st != SP_OK) {
        fprintf(stderr, "sampan quantize: %s\n", err);
        goto done;
    }
    int64_t n = sp_gguf_n_tensors(g);
    jobs = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *jobs);
    if (jobs == NULL || sp_gguf_writer_create(&w) != SP_OK) {
        fprintf(stderr, "sampan quantize: out of memory\n");
        goto done;
    }
    if ((st = sp_gguf_writer_copy_kv(w, g)) != SP_OK ||
        (sp_gguf_alignment(g) != SP_GGUF_DEFAULT_ALIGNMENT &&
         (st = sp_gguf_writer_set_alignment(w, (uint32_t)sp_gguf_alignment(g))) != SP_OK) ||
        (st = sp_gguf_writer_set_u32(w, "general.quantization_version", 2)) != SP_OK ||
        (st = sp_gguf_writer_set_u32(w, "general.file_type", ftype)) != SP_OK) {
        fprintf(stderr, "sampan quantize: %s: copying metadata: %s\n", pos[0], sp_status_str(st));
        goto done;
    }

    if (mix != NULL && !plan_mix(mix, pure, !dry_run, g, jobs)) {
        goto done;
    }
    double in_bytes = 0, out_bytes = 0;
    int64_t n_converted = 0, n_kept = 0, n_other = 0;
    for (int64_t i = 0; i < n; i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        job *j = &jobs[i];
        j->q = &q;
        j->src = t;
        if (mix == NULL) {
            j->dst_type = choose(t, tg->type, &j->why);
        }
        j->src_row_bytes = sp_row_size(t->type, t->ne[0]);
        j->dst_row_bytes = sp_row_size(j->dst_type, t->ne[0]);
        if (t->ne[0] > q.max_ne0) {
            q.max_ne0 = t->ne[0];
        }
        char name[SP_GGUF_MAX_NAME];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        int n_dims = t->n_dims > 0 ? t->n_dims : 1;
        st = sp_gguf_writer_add_tensor_fill(w, name, j->dst_type, n_dims, t->ne, fill, j);
        if (st != SP_OK) {
            fprintf(stderr, "sampan quantize: tensor '%s': %s\n", name, sp_status_str(st));
            goto done;
        }
        double rows = (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
        q.total_elems += rows * (double)t->ne[0];
        in_bytes += (double)t->nbytes;
        out_bytes += rows * (double)j->dst_row_bytes;
        if (j->dst_type == base) {
            n_converted++;
        } else if (j->dst_type == t->type) {
            n_kept++;
        } else {
            n_other++;
        }
        if (verbose) {
            printf("  [%4" PRId64 "/%4" PRId64 "] %-36s %-5s -> %-5s %s%s%s\n", i + 1, n, name,
                   sp_type_name(t->type), sp_type_name(j->dst_type), j->why ? "(" : "",
                   j->why ? j->why : "", j->why ? ")" : "");
        }
    }

    if (dry_run) {
        char hin[32], hout[32];
        human(hin, sizeof hin, in_bytes);
        human(hout, sizeof hout, out_bytes);
        printf("%s (dry run, nothing written): %" PRId64 " tensors to %s, %" PRId64
               " to another type, %" PRId64 " unchanged; weights %s -> %s\n",
               pos[0], n_converted, out_name, n_other, n_kept, hin, hout);
        rc = 0;
        goto done;
    }
    if (sp_pool_create(n_threads, &q.pool) != SP_OK) {
        fprintf(stderr, "sampan quantize: cannot start the thread pool\n");
        goto done;
    }
    q.n_threads = sp_pool_n_threads(q.pool);
    q.scratch = sp_calloc((size_t)q.n_threads * (size_t)(q.max_ne0 > 0 ? q.max_ne0 : 1),
                          sizeof *q.scratch);
    if (q.scratch == NULL) {
        fprintf(stderr, "sampan quantize: out of memory for %d scratch rows\n", q.n_threads);
        goto done;
    }
    st = sp_gguf_writer_write(w, pos[1], err, sizeof err);
    if (q.progress && n > 0) {
        show_progress(&q, sp_gguf_tensor(g, n - 1), true);
        fputc('\n', stderr);
    }
    if (st != SP_OK) {
        fprintf(stderr, "sampan quantize: %s\n", err);
        goto done;
    }
    char hin[32], hout[32];
    human(hin, sizeof hin, in_bytes);
    human(hout, sizeof hout, out_bytes);
    printf("%s -> %s: %" PRId64 " tensors to %s, %" PRId64 " to another type, %" PRId64
           " unchanged; weights %s -> %s in %.2f s (%d threads)\n",
           pos[0], pos[1], n_converted, out_name, n_other, n_kept, hin, hout, now_s() - q.t0,
           q.n_threads);
    rc = 0;

done:
    sp_gguf_writer_destroy(w);
    sp_pool_destroy(q.pool);
    sp_free(q.scratch);
    sp_free(jobs);
    sp_gguf_close(g);
    return rc;
}
