/*
 * decode_bench.c - batch-1 weight products against the memory read limit, through the
 * engine's own path: the thread pool, the per-product activation conversion, the row
 * split of batch.c's matmul (sp_mm_split_t, engine/model_impl.h) and the kernel table's
 * gemm (or the packed gemm of a load-time repacked type), next to a plain streaming
 * read of the same bytes split the same way, in the same process and pass order.
 *
 *   nice make -j2 build/decode_bench
 *   ./build/decode_bench [--types f16,q8_0,q4_0,q4_k] [--layers N] [--threads-max T]
 *                        [--runs N] [--4k] [--no-repack] [--tokens N]
 *   SAMPAN_CPU=avx2 ./build/decode_bench ...        (a lower level)
 *
 * The "model" is TinyLlama-1.1B's shape: per layer wq, wk, wv (2048, 256, 256 rows x 2048),
 * wo (2048 x 2048), gate and up (5632 x 2048), down (2048 x 5632), then the output matrix
 * (32000 x 2048); --layers of them (default 6, several hundred MB at 4 bits, far beyond
 * the caches) in one anonymous mapping (transparent huge pages unless --4k: the server's
 * private copy of a model file asks for them too). One pass = every product of every layer
 * in decode order (q/k/v as one job, gate/up as one, the activations converted once per
 * job as batch.c does). --tokens N (default 1) runs every product with N tokens, as a decode
 * step of N running sequences does (the weights still read once a pass: compute grows, the
 * bytes do not). Reported per (type, threads), best of --runs passes:
 *   read   GB/s of a vector sum over the same rows, chunked the same way (the limit)
 *   gemv   GB/s of weight bytes through the products (what decode streams)
 *   share  gemv / read
 *   us/job the pass time over the number of pool jobs minus the read's (dispatch and
 *          conversion overhead per job, roughly)
 *   hot-gemv  GB/s of the kernel alone, one thread, on a 256-row matrix that stays in
 *          L2 (what the kernel's instructions allow: below the read rate means the
 *          kernel, not memory, is the limit); per second of the thread's CPU time, so
 *          other processes' time slices do not count
 *   cpu-share the read's process CPU seconds over the gemv's (best pass of each): the
 *          share with the time other processes took left out, which on a host shared
 *          with other work is what says whether the products cost more than the read
 *          (pool spins count: with 2 threads, a waiting thread's CPU time is in both)
 *   old-gemv, old-hot  the same with the kernel that a one-token kernel of
 *          cpu/avx512_gemv.c replaced (the panels), in the same passes (A/B); 0 when the
 *          type and level have none
 * Weights are random quantized rows (the kernels' speed does not depend on the values).
 * Not a test: nothing here asserts; the numbers depend on the machine and its load.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/pool.h"
#include "engine/model_impl.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/kernels.h"
#include "read_sum.h"

#define E 2048
#define FF 5632
#define KV 256
#define VOCAB 32000
#define MAX_LAYERS 64
#define MAX_TOKENS 64
#define XQ_STRIDE (FF * 8) /* bytes between tokens' converted activations: any type's row */

static int g_tok = 1; /* tokens per product (--tokens) */

static double
clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double
now_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

/* CPU seconds of the whole process (all pool threads, their spins included): on a host
 * where other work takes most of the time slices, wall time measures the share of the
 * CPUs this process got; CPU time measures what the work itself costs. */
static double
cpu_s(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

typedef struct mat {
    int64_t rows, n;
    const uint8_t *data; /* rows of row_bytes, or NULL when packed */
    size_t row_bytes;
    const uint8_t *packed; /* the packed form, or NULL */
    size_t packed_stride;
    int64_t group_rows; /* rows per packed group (the table's layout) */
    size_t bytes; /* what a product reads */
} mat_t;

/* One product job: up to 3 matrices sharing an input. */
typedef struct job {
    const sp_cpu_kernels_t *k;
    sp_type_t type;
    int n_w;
    const mat_t *w[3];
    float *y[3];
    const void *x;
    size_t xs; /* bytes between tokens of x */
    sp_mm_split_t split; /* the work items, as batch.c's */
    int read_only; /* 1: sum the bytes instead of the product */
    double sink[64];
} job_t;

static void
job_run(void *arg, int64_t item, int ith)
{
    job_t *j = arg;
    int wi;
    int64_t r0, r1, t0, t1;
    sp__mm_split_item(&j->split, item, &wi, &r0, &r1, &t0, &t1);
    const mat_t *w = j->w[wi];
    if (j->read_only) {
        /* The same bytes the product reads: whole packed groups or rows. */
        const uint64_t s = w->packed != NULL
                               ? sp_read_rows(w->packed, w->packed_stride, w->group_rows, r0, r1)
                               : sp_read_rows(w->data, w->row_bytes, 1, r0, r1);
        j->sink[ith] += (double)(s & 1);
        return;
    }
    const void *x = (const char *)j->x + (size_t)t0 * j->xs; /* the item's tokens */
    float *y = j->y[wi] + t0 * w->rows;
    if (w->packed != NULL) {
        j->k->repack_gemm[j->type](w->n, w->packed, w->packed_stride, r0, r1, x, j->xs, t1 - t0,
                                   y, w->rows);
    } else {
        sp_cpu_gemm(j->k, j->type, w->n, w->data, w->row_bytes, r0, r1, x, j->xs, t1 - t0, y,
                    w->rows);
    }
}

typedef struct conv_job {
    sp_from_float_fn conv;
    const float *x;
    void *dst;
    int64_t n;
} conv_job_t;

static void
conv_run(void *arg, int64_t i, int ith)
{
    conv_job_t *c = arg;
    (void)ith;
    c->conv(c->x + i * FF, (char *)c->dst + i * XQ_STRIDE, c->n);
}

static uint8_t *
alloc_map(size_t bytes, int huge)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
    (void)madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return p;
}

typedef struct model {
    sp_type_t type;
    int layers;
    mat_t m[MAX_LAYERS * 7 + 1];
    int n_m;
    uint8_t *base;
    size_t base_bytes;
    uint8_t *pbase;
    size_t pbase_bytes;
    size_t bytes; /* read per pass */
} model_t;

static const int64_t shape_rows[7] = {E, KV, KV, E, FF, FF, E};
static const int64_t shape_n[7] = {E, E, E, E, E, E, FF};

static int
build_model(model_t *md, sp_type_t type, int layers, int huge, int repack,
            const sp_cpu_kernels_t *k)
{
    memset(md, 0, sizeof *md);
    md->type = type;
    md->layers = layers;
    size_t total = 0;
    for (int l = 0; l <= layers; l++) {
        for (int s = 0; s < (l < layers ? 7 : 1); s++) {
            mat_t *m = &md->m[md->n_m++];
            m->rows = l < layers ? shape_rows[s] : VOCAB;
            m->n = l < layers ? shape_n[s] : E;
            m->row_bytes = sp_row_size(type, m->n);
            total += (size_t)m->rows * m->row_bytes;
        }
    }
    md->base_bytes = total;
    md->base = alloc_map(total, huge);
    if (md->base == NULL) {
        return -1;
    }
    /* 64 distinct random rows of each width, copied over the matrices (the page is touched). */
    float *src = malloc(sizeof(float) * FF);
    uint8_t *rows[2][64];
    uint32_t seed = 12345;
    for (int wdt = 0; wdt < 2; wdt++) {
        int64_t n = wdt ? FF : E;
        for (int r = 0; r < 64; r++) {
            for (int64_t i = 0; i < n; i++) {
                seed = seed * 1664525u + 1013904223u;
                src[i] = ((float)(seed >> 8) * 0x1p-23f - 1.0f) * 0.05f;
            }
            rows[wdt][r] = malloc(sp_row_size(type, n));
            if (!sp_quantize_row(type, src, rows[wdt][r], n)) {
                fprintf(stderr, "decode_bench: no quantizer for %s\n", sp_type_name(type));
                return -1;
            }
        }
    }
    size_t off = 0;
    for (int i = 0; i < md->n_m; i++) {
        mat_t *m = &md->m[i];
        m->data = md->base + off;
        for (int64_t r = 0; r < m->rows; r++) {
            memcpy(md->base + off + (size_t)r * m->row_bytes, rows[m->n == FF][r % 64],
                   m->row_bytes);
        }
        off += (size_t)m->rows * m->row_bytes;
        m->bytes = (size_t)m->rows * m->row_bytes;
    }
    free(src);
    for (int wdt = 0; wdt < 2; wdt++) {
        for (int r = 0; r < 64; r++) {
            free(rows[wdt][r]);
        }
    }
    md->bytes = total;
    if (repack && k->repack_gemm[type] != NULL) {
        size_t pt = 0;
        for (int i = 0; i < md->n_m; i++) {
            pt += sp_repack_bytes_in(k->repack_layout[type], type, md->m[i].n, md->m[i].rows);
        }
        md->pbase = alloc_map(pt, huge);
        md->pbase_bytes = pt;
        if (md->pbase == NULL) {
            return -1;
        }
        size_t po = 0;
        md->bytes = 0;
        for (int i = 0; i < md->n_m; i++) {
            mat_t *m = &md->m[i];
            const sp_repack_layout_t lay = k->repack_layout[type];
            const int64_t groups =
                (m->rows + sp_repack_layout_rows(lay) - 1) / sp_repack_layout_rows(lay);
            sp_repack_pack_in(lay, type, m->n, m->data, m->row_bytes, m->rows, 0, groups,
                              md->pbase + po);
            m->packed = md->pbase + po;
            m->packed_stride = sp_repack_group_bytes_in(lay, type, m->n);
            m->group_rows = sp_repack_layout_rows(lay);
            m->bytes = sp_repack_bytes_in(lay, type, m->n, m->rows);
            po += m->bytes;
            md->bytes += m->bytes;
        }
        /* The engine gives the file's copy back; so does the bench. */
        munmap(md->base, md->base_bytes);
        md->base = NULL;
        for (int i = 0; i < md->n_m; i++) {
            md->m[i].data = NULL;
        }
    }
    return 0;
}

static void
free_model(model_t *md)
{
    if (md->base) {
        munmap(md->base, md->base_bytes);
    }
    if (md->pbase) {
        munmap(md->pbase, md->pbase_bytes);
    }
}

/* One decode pass; returns seconds. jobs counts the pool jobs. */
static double
pass(sp_pool_t *pool, const sp_cpu_kernels_t *k, const model_t *md, int read_only, float *x,
     void *xq, float *y, int *jobs, double *cpu)
{
    const sp_type_t at = k->vec_dot_type[md->type];
    double t0 = now_s(), c0 = cpu_s();
    int nj = 0;
    const int nth = sp_pool_n_threads(pool);
    for (int i = 0; i < md->n_m;) {
        const int l_s = i % 7; /* 0 q, 3 o, 4 gate, 6 down; the output is alone */
        int n_w = i == md->n_m - 1 ? 1 : l_s == 0 ? 3 : l_s == 4 ? 2 : 1;
        const void *xa = x;
        size_t xs = FF * sizeof(float);
        if (at != SP_TYPE_F32 && !read_only) {
            conv_job_t c = {k->from_float[at], x, xq, md->m[i].n};
            sp_pool_run(pool, conv_run, &c, g_tok);
            xa = xq;
            xs = XQ_STRIDE;
            nj++;
        }
        job_t j;
        memset(&j, 0, sizeof j);
        j.k = k;
        j.type = md->type;
        j.n_w = n_w;
        j.x = xa;
        j.xs = xs;
        j.read_only = read_only;
        int64_t rows[SP_MM_SPLIT_MAX_W];
        for (int w = 0; w < n_w; w++) {
            j.w[w] = &md->m[i + w];
            j.y[w] = y + (size_t)w * VOCAB * (size_t)g_tok;
            rows[w] = md->m[i + w].rows;
        }
        sp__mm_split_init(&j.split, n_w, rows, nth, g_tok);
        sp_pool_run(pool, job_run, &j, j.split.total);
        nj++;
        i += n_w;
    }
    *jobs = nj;
    *cpu = cpu_s() - c0;
    return now_s() - t0;
}

/* The kernel alone on cache-resident weights: the 256-row wk matrix of layer 0 (288 KiB at
 * 4.5 bits, 1 MiB at F16: in L2) over and over on the calling thread; GB/s of weight bytes. */
static double
hot_gbs(const sp_cpu_kernels_t *k, const model_t *md, float *x, void *xq, float *y)
{
    const mat_t *w = &md->m[1];
    const sp_type_t at = k->vec_dot_type[md->type];
    const void *xa = x;
    if (at != SP_TYPE_F32) {
        k->from_float[at](x, xq, w->n);
        xa = xq;
    }
    double best = 1e30;
    for (int r = 0; r < 20; r++) {
        double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < 50; i++) {
            if (w->packed != NULL) {
                k->repack_gemm[md->type](w->n, w->packed, w->packed_stride, 0, w->rows, xa, 0, 1,
                                         y, w->rows);
            } else {
                sp_cpu_gemm(k, md->type, w->n, w->data, w->row_bytes, 0, w->rows, xa, 0, 1, y,
                            w->rows);
            }
        }
        double dt = (clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) / 50;
        best = dt < best ? dt : best;
    }
    return (double)w->bytes / best / 1e9;
}

static int
parse_types(const char *s, sp_type_t *out, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ",")) {
        int t = sp_type_from_name(tok);
        if (t < 0) {
            fprintf(stderr, "decode_bench: unknown type %s\n", tok);
            exit(2);
        }
        out[n++] = (sp_type_t)t;
    }
    return n;
}

int
main(int argc, char **argv)
{
    sp_type_t types[8];
    int n_types = parse_types("f16,q8_0,q4_0,q4_k", types, 8);
    int layers = 6, tmax = 2, runs = 5, huge = 1, repack = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--types") && i + 1 < argc) {
            n_types = parse_types(argv[++i], types, 8);
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc) {
            layers = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads-max") && i + 1 < argc) {
            tmax = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--4k")) {
            huge = 0;
        } else if (!strcmp(argv[i], "--no-repack")) {
            repack = 0;
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            g_tok = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: decode_bench [--types LIST] [--layers N] [--threads-max T] "
                            "[--runs N] [--4k] [--no-repack] [--tokens N]\n");
            return 2;
        }
    }
    if (layers < 1 || layers > MAX_LAYERS || tmax < 1 || tmax > 64 || runs < 1 || g_tok < 1 ||
        g_tok > MAX_TOKENS) {
        fprintf(stderr, "decode_bench: 1 <= --layers <= %d, 1 <= --threads-max <= 64, --runs >= 1, "
                        "1 <= --tokens <= %d\n",
                MAX_LAYERS, MAX_TOKENS);
        return 2;
    }
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    /* g_tok tokens of activations (token t's row FF floats / XQ_STRIDE bytes after t - 1's) */
    float *x = aligned_alloc(64, sizeof(float) * FF * (size_t)g_tok);
    float *y = aligned_alloc(64, sizeof(float) * VOCAB * 3 * (size_t)g_tok);
    void *xq = aligned_alloc(64, (size_t)XQ_STRIDE * (size_t)g_tok);
    for (int64_t i = 0; i < (int64_t)FF * g_tok; i++) {
        x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    }
    printf("decode_bench: kernels=%s layers=%d pages=%s tokens=%d best of %d, GB = 1e9 B\n",
           k->name, layers, huge ? "thp" : "4k", g_tok, runs);
    printf("%-6s %-7s %3s %9s %9s %9s %7s %6s %8s %9s %9s %9s %10s\n", "type", "layout", "thr",
           "MB/pass", "read", "gemv", "share", "jobs", "us/job", "hot-gemv", "old-gemv",
           "old-hot", "cpu-share");
    for (int ti = 0; ti < n_types; ti++) {
        model_t md;
        if (build_model(&md, types[ti], layers, huge, repack, k) != 0) {
            fprintf(stderr, "decode_bench: cannot build the %s matrices\n",
                    sp_type_name(types[ti]));
            return 1;
        }
        /* The table as it was before this type's one-token kernel (avx512_gemv.c, called
         * from avx512_qgemm.c's entries), when it has one: the panels alone, measured in the
         * same passes, interleaved (A/B). */
        sp_cpu_kernels_t old = *k;
        const sp_gemm_fn prev = k->level >= SP_CPU_AVX512 ? sp__avx512_qgemm_panels(types[ti])
                                                          : NULL;
        const bool ab = prev != NULL && k->gemm[types[ti]] != prev &&
                        k->level >= SP_CPU_AVX512;
        if (ab) {
            old.gemm[types[ti]] = prev;
        }
        double hot = 0, hot_old = 0;
        for (int r = 0; r < 3; r++) {
            double h = hot_gbs(k, &md, x, xq, y);
            hot = h > hot ? h : hot;
            if (ab) {
                h = hot_gbs(&old, &md, x, xq, y);
                hot_old = h > hot_old ? h : hot_old;
            }
        }
        for (int nt = 1; nt <= tmax; nt++) {
            sp_pool_t *pool;
            if (sp_pool_create(nt, &pool) != SP_OK) {
                return 1;
            }
            double best_r = 1e30, best_g = 1e30, best_o = 1e30, cpu_r = 1e30, cpu_g = 1e30;
            int jobs_r = 0, jobs_g = 0, jobs_o = 0;
            /* read, gemv (and the old gemv) interleaved, so load changes hit all alike */
            for (int r = 0; r < runs + 1; r++) {
                double cr, cg, co;
                double tr = pass(pool, k, &md, 1, x, xq, y, &jobs_r, &cr);
                double tg = pass(pool, k, &md, 0, x, xq, y, &jobs_g, &cg);
                double to = ab ? pass(pool, &old, &md, 0, x, xq, y, &jobs_o, &co) : 1e30;
                if (r > 0) { /* the first pass warms the pool and faults nothing */
                    best_r = tr < best_r ? tr : best_r;
                    best_g = tg < best_g ? tg : best_g;
                    best_o = to < best_o ? to : best_o;
                    cpu_r = cr < cpu_r ? cr : cpu_r;
                    cpu_g = cg < cpu_g ? cg : cpu_g;
                }
            }
            double gr = (double)md.bytes / best_r / 1e9, gg = (double)md.bytes / best_g / 1e9;
            double go = ab ? (double)md.bytes / best_o / 1e9 : 0;
            printf("%-6s %-7s %3d %9.1f %9.2f %9.2f %6.0f%% %6d %8.2f %9.2f %9.2f %9.2f "
                   "%9.0f%%\n",
                   sp_type_name(types[ti]), md.pbase ? "packed" : "rows", nt,
                   (double)md.bytes / 1e6, gr, gg, 100.0 * gg / gr, jobs_g,
                   (best_g - best_r) / jobs_g * 1e6, hot, go, hot_old, 100.0 * cpu_r / cpu_g);
            fflush(stdout);
            sp_pool_destroy(pool);
        }
        free_model(&md);
    }
    free(x);
    free(y);
    free(xq);
    return 0;
}
