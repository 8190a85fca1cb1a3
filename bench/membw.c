/*
 * membw.c - memory read and copy bandwidth, 1 and 2 threads, best of N runs.
 *
 * The decode speed of a language model on a CPU is bounded by how fast the
 * weights can be streamed from DRAM once per token, so the engine benchmark
 * (bench/run.sh) divides this read bandwidth by the bytes read per token to get
 * the decode limit. A bench tool, not part of the engine: built on its own with
 * -O3 -march=native.
 *
 *   cc -std=c11 -O3 -march=native -pthread -o build/membw bench/membw.c
 *   build/membw [--size MiB] [--runs N] [--threads-max T] [--json]
 *
 * read:  each thread sums its slice of one SIZE buffer (read_sum.h: the
 *        target's widest native vector, 8 independent accumulators, so the adds
 *        are never the limit);
 *        GB/s = SIZE / time.
 * read, 2 streams: the same sum with each thread reading the two halves of its
 *        slice in step (sp_read_sum_two): the AVX2 one-token products read two
 *        weight streams per thread, and on an AMD Zen 3 they ran faster that way
 *        than over one; bench/report.py takes the best of both reads as the limit.
 * copy:  each thread memcpy()s its slice of a SIZE/2 buffer into another;
 *        GB/s counts bytes read + bytes written (STREAM's convention), i.e.
 *        2 * SIZE/2 / time.
 * Both are measured on ordinary 4 KiB pages and on transparent huge pages
 * (madvise), since the engine's mmap'ed weights can land on either.
 * GB = 1e9 bytes.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "read_sum.h"

enum { MAX_THREADS = 64 };

struct job {
    const unsigned char *src; /* slice start */
    unsigned char *dst;       /* copy target, NULL for read */
    size_t bytes;             /* slice length, a multiple of 256 */
    uint64_t sum;             /* read result, kept so the loads are not dropped */
};

struct team {
    pthread_barrier_t start;
    pthread_barrier_t done;
    struct job jobs[MAX_THREADS];
    int n;
    int quit;
    int op; /* 0 read, 1 copy, 2 read over two streams (read_sum.h) */
};

struct worker_arg {
    struct team *team;
    int index;
};

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
run_job(struct team *t, int i)
{
    struct job *j = &t->jobs[i];
    if (t->op == 0)
        j->sum = sp_read_sum(j->src, j->bytes);
    else if (t->op == 2)
        j->sum = sp_read_sum_two(j->src, j->bytes);
    else
        memcpy(j->dst, j->src, j->bytes);
}

static void *
worker(void *p)
{
    struct worker_arg *a = p;
    struct team *t = a->team;
    for (;;) {
        pthread_barrier_wait(&t->start);
        if (t->quit)
            return NULL;
        run_job(t, a->index);
        pthread_barrier_wait(&t->done);
    }
}

static unsigned char *
alloc_buf(size_t bytes, int huge)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* Ask explicitly either way, so the result does not depend on the THP default. */
    madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    /* Fault every page in (and make the data non-zero) before timing. */
    for (size_t i = 0; i < bytes; i += 8)
        *(uint64_t *)((unsigned char *)p + i) = i * 0x9E3779B97F4A7C15ull;
    return p;
}

/* Best time over `runs` of one operation split over `nthreads` (the caller's
 * thread takes slice 0; helpers take the rest). */
static double
measure(int op, int nthreads, unsigned char *src, unsigned char *dst, size_t bytes, int runs,
        uint64_t *sink)
{
    struct team t;
    memset(&t, 0, sizeof(t));
    t.n = nthreads;
    t.op = op;
    pthread_barrier_init(&t.start, NULL, (unsigned)nthreads);
    pthread_barrier_init(&t.done, NULL, (unsigned)nthreads);
    size_t slice = (bytes / (size_t)nthreads) & ~(size_t)255;
    for (int i = 0; i < nthreads; i++) {
        t.jobs[i].src = src + (size_t)i * slice;
        t.jobs[i].dst = dst ? dst + (size_t)i * slice : NULL;
        t.jobs[i].bytes = slice;
    }
    pthread_t tid[MAX_THREADS];
    struct worker_arg args[MAX_THREADS];
    for (int i = 1; i < nthreads; i++) {
        args[i].team = &t;
        args[i].index = i;
        if (pthread_create(&tid[i], NULL, worker, &args[i]) != 0) {
            fprintf(stderr, "membw: pthread_create failed\n");
            exit(1);
        }
    }
    double best = 1e30;
    for (int r = 0; r < runs; r++) {
        double t0 = now_s();
        pthread_barrier_wait(&t.start);
        run_job(&t, 0);
        pthread_barrier_wait(&t.done);
        double dt = now_s() - t0;
        if (dt < best)
            best = dt;
        for (int i = 0; i < nthreads; i++)
            *sink += t.jobs[i].sum;
    }
    t.quit = 1;
    pthread_barrier_wait(&t.start);
    for (int i = 1; i < nthreads; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&t.start);
    pthread_barrier_destroy(&t.done);
    return (double)(slice * (size_t)nthreads) / best / 1e9 * (op == 1 ? 2.0 : 1.0);
}

int
main(int argc, char **argv)
{
    size_t mib = 1024;
    int runs = 5, tmax = 2, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc)
            mib = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads-max") && i + 1 < argc)
            tmax = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: membw [--size MiB] [--runs N] [--threads-max T] [--json]\n");
            return 2;
        }
    }
    if (mib < 16 || runs < 1 || tmax < 1 || tmax > MAX_THREADS) {
        fprintf(stderr, "membw: --size >= 16, --runs >= 1, 1 <= --threads-max <= %d\n",
                MAX_THREADS);
        return 2;
    }
    size_t bytes = mib << 20;
    uint64_t sink = 0;
    /* result[huge][op][threads-1] */
    static double res[2][3][MAX_THREADS];
    for (int huge = 0; huge < 2; huge++) {
        unsigned char *a = alloc_buf(bytes, huge);
        unsigned char *b = alloc_buf(bytes / 2, huge);
        if (!a || !b) {
            fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib + mib / 2);
            return 1;
        }
        for (int nt = 1; nt <= tmax; nt++) {
            res[huge][0][nt - 1] = measure(0, nt, a, NULL, bytes, runs, &sink);
            res[huge][1][nt - 1] = measure(1, nt, a, b, bytes / 2, runs, &sink);
            res[huge][2][nt - 1] = measure(2, nt, a, NULL, bytes, runs, &sink);
        }
        munmap(a, bytes);
        munmap(b, bytes / 2);
    }
    if (json) {
        printf("{\"size_mib\": %zu, \"runs\": %d, \"unit\": \"GB/s (1e9 B/s)\"", mib, runs);
        static const char *page[2] = {"4k", "thp"};
        static const char *op[3] = {"read", "copy", "read_two_streams"};
        for (int h = 0; h < 2; h++)
            for (int o = 0; o < 3; o++) {
                printf(", \"%s_%s\": [", op[o], page[h]);
                for (int nt = 1; nt <= tmax; nt++)
                    printf("%s%.2f", nt > 1 ? ", " : "", res[h][o][nt - 1]);
                printf("]");
            }
        printf(", \"sink\": %llu}\n", (unsigned long long)(sink & 1));
    } else {
        printf("membw: %zu MiB buffer, best of %d runs, GB = 1e9 B\n", mib, runs);
        printf("%-8s %-6s %10s %10s %14s\n", "threads", "pages", "read GB/s", "copy GB/s",
               "read, 2 streams");
        for (int h = 0; h < 2; h++)
            for (int nt = 1; nt <= tmax; nt++)
                printf("%-8d %-6s %10.2f %10.2f %14.2f\n", nt, h ? "thp" : "4k", res[h][0][nt - 1],
                       res[h][1][nt - 1], res[h][2][nt - 1]);
        if (sink == 42)
            printf("\n");
    }
    return 0;
}
