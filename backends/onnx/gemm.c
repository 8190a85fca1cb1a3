/*
 * backends/onnx/gemm.c - single-precision GEMM for Conv (after im2col),
 * Gemm and MatMul: C[M,N] (+)= op(A)[M,K] * op(B)[K,N], row-major.
 *
 * Blocked: K in blocks of KC; B packed into panels of 16 columns and A into
 * panels of 4 rows (zero-padded at the edges), then a 4x16 micro-kernel
 * keeps its accumulators in registers. The micro-kernel has an AVX2+FMA
 * version chosen at run time (__builtin_cpu_supports) and a portable one.
 * A oneDNN or other library GEMM can replace sp_ox_sgemm behind the same call.
 *
 * Threads: sp_ox_sgemm is reentrant and single-threaded; sp_ox_sgemm_par splits a
 * large product into row (or column) blocks over up to n_threads threads
 * (pthreads started per call and joined before it returns: each block packs
 * its own panels, so the threads share nothing they write).
 * Memory: packing buffers malloc'd per call.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"

#define MR 4
#define NR 16
#define KC 256

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define OX_HAVE_AVX2 1

__attribute__((target("avx2,fma"))) static void
micro_avx2(int64_t kc, const float *ap, const float *bp, float *acc)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    for (int64_t p = 0; p < kc; p++) {
        __m256 b0 = _mm256_load_ps(bp + p * NR), b1 = _mm256_load_ps(bp + p * NR + 8);
        __m256 a = _mm256_broadcast_ss(ap + p * MR);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(ap + p * MR + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(ap + p * MR + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(ap + p * MR + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
    }
    _mm256_storeu_ps(acc + 0, c00);
    _mm256_storeu_ps(acc + 8, c01);
    _mm256_storeu_ps(acc + 16, c10);
    _mm256_storeu_ps(acc + 24, c11);
    _mm256_storeu_ps(acc + 32, c20);
    _mm256_storeu_ps(acc + 40, c21);
    _mm256_storeu_ps(acc + 48, c30);
    _mm256_storeu_ps(acc + 56, c31);
}
#endif

static void
micro_c(int64_t kc, const float *ap, const float *bp, float *acc)
{
    memset(acc, 0, MR * NR * sizeof *acc);
    for (int64_t p = 0; p < kc; p++) {
        for (int i = 0; i < MR; i++) {
            float a = ap[p * MR + i];
            for (int j = 0; j < NR; j++) acc[i * NR + j] += a * bp[p * NR + j];
        }
    }
}

void
sp_ox_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
         int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate) {
            for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, (size_t)n * sizeof *c);
        }
        return;
    }
    void (*micro)(int64_t, const float *, const float *, float *) = micro_c;
#ifdef OX_HAVE_AVX2
    /* Asked each call (a read of libgcc's CPU table): no shared cache to race on. */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) micro = micro_avx2;
#endif
    int64_t np = (n + NR - 1) / NR, mp = (m + MR - 1) / MR;
    int64_t kc_max = k < KC ? k : KC;
    float *bpk = sp_ox_aligned_alloc((size_t)(np * NR * kc_max) * sizeof(float));
    float *apk = sp_ox_aligned_alloc((size_t)(mp * MR * kc_max) * sizeof(float));
    if (bpk == NULL || apk == NULL) {
        /* No memory for packing: the plain triple loop needs none. */
        free(bpk);
        free(apk);
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                float s = accumulate ? c[i * ldc + j] : 0.0f;
                for (int64_t p = 0; p < k; p++) {
                    s += (trans_a ? a[p * lda + i] : a[i * lda + p]) *
                         (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
                }
                c[i * ldc + j] = s;
            }
        }
        return;
    }
    float acc[MR * NR] __attribute__((aligned(64)));
    for (int64_t pc = 0; pc < k; pc += KC) {
        int64_t kc = k - pc < KC ? k - pc : KC;
        for (int64_t jp = 0; jp < np; jp++) {
            float *dst = bpk + jp * NR * kc;
            int64_t j0 = jp * NR, cols = n - j0 < NR ? n - j0 : NR;
            for (int64_t p = 0; p < kc; p++) {
                float *d = dst + p * NR;
                if (!trans_b) {
                    /* A row of B: its 16 columns are contiguous. */
                    memcpy(d, b + (pc + p) * ldb + j0, (size_t)cols * sizeof *d);
                } else {
                    for (int64_t j = 0; j < cols; j++) d[j] = b[(j0 + j) * ldb + pc + p];
                }
                for (int64_t j = cols; j < NR; j++) d[j] = 0.0f;
            }
        }
        for (int64_t ip = 0; ip < mp; ip++) {
            float *dst = apk + ip * MR * kc;
            int64_t i0 = ip * MR, rows = m - i0 < MR ? m - i0 : MR;
            for (int64_t i = 0; i < MR; i++) {
                if (i >= rows) {
                    for (int64_t p = 0; p < kc; p++) dst[p * MR + i] = 0.0f;
                } else if (!trans_a) {
                    /* A row of A read contiguously, written every MR floats. */
                    const float *src = a + (i0 + i) * lda + pc;
                    for (int64_t p = 0; p < kc; p++) dst[p * MR + i] = src[p];
                } else {
                    for (int64_t p = 0; p < kc; p++) dst[p * MR + i] = a[(pc + p) * lda + i0 + i];
                }
            }
        }
        int add = accumulate || pc > 0;
        for (int64_t jp = 0; jp < np; jp++) {
            for (int64_t ip = 0; ip < mp; ip++) {
                micro(kc, apk + ip * MR * kc, bpk + jp * NR * kc, acc);
                int64_t rows = m - ip * MR < MR ? m - ip * MR : MR;
                int64_t cols = n - jp * NR < NR ? n - jp * NR : NR;
                for (int64_t i = 0; i < rows; i++) {
                    float *cr = c + (ip * MR + i) * ldc + jp * NR;
                    if (add) {
                        for (int64_t j = 0; j < cols; j++) cr[j] += acc[i * NR + j];
                    } else {
                        for (int64_t j = 0; j < cols; j++) cr[j] = acc[i * NR + j];
                    }
                }
            }
        }
    }
    free(bpk);
    free(apk);
}

/* Products under this many multiply-adds run on the calling thread: starting a thread costs
 * tens of microseconds, about what 2^20 multiply-adds take. */
#define PAR_MIN_MACS ((int64_t)1 << 20)
#define PAR_MAX_THREADS 64

typedef struct gemm_job {
    int trans_a, trans_b, accumulate;
    int64_t m, n, k, lda, ldb, ldc;
    const float *a, *b;
    float *c;
} gemm_job_t;

static void *
gemm_thread(void *arg)
{
    const gemm_job_t *j = arg;
    sp_ox_sgemm(j->trans_a, j->trans_b, j->m, j->n, j->k, j->a, j->lda, j->b, j->ldb, j->c, j->ldc,
             j->accumulate);
    return NULL;
}

void
sp_ox_sgemm_par(int n_threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
             const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
             int accumulate)
{
    if (n_threads > PAR_MAX_THREADS) n_threads = PAR_MAX_THREADS;
    if (n_threads <= 1 || m * n * k < PAR_MIN_MACS) {
        sp_ox_sgemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
        return;
    }
    /* Split the larger of M and N, in whole micro-kernel panels. */
    bool by_rows = m >= n;
    int64_t len = by_rows ? m : n, unit = by_rows ? MR : NR;
    int64_t units = (len + unit - 1) / unit;
    int t_count = units < n_threads ? (int)units : n_threads;
    gemm_job_t jobs[PAR_MAX_THREADS];
    pthread_t tids[PAR_MAX_THREADS];
    bool started[PAR_MAX_THREADS] = {0};
    int64_t start = 0;
    for (int t = 0; t < t_count; t++) {
        int64_t u = units / t_count + (t < units % t_count ? 1 : 0);
        int64_t end = start + u * unit < len ? start + u * unit : len;
        gemm_job_t *j = &jobs[t];
        *j = (gemm_job_t){trans_a, trans_b, accumulate, m, n, k, lda, ldb, ldc, a, b, c};
        if (by_rows) {
            j->m = end - start;
            j->a = trans_a ? a + start : a + start * lda;
            j->c = c + start * ldc;
        } else {
            j->n = end - start;
            j->b = trans_b ? b + start * ldb : b + start;
            j->c = c + start;
        }
        start = end;
    }
    /* Block 0 runs here; a thread that cannot start runs its block here too. */
    for (int t = 1; t < t_count; t++) {
        started[t] = pthread_create(&tids[t], NULL, gemm_thread, &jobs[t]) == 0;
    }
    gemm_thread(&jobs[0]);
    for (int t = 1; t < t_count; t++) {
        if (started[t]) pthread_join(tids[t], NULL);
        else gemm_thread(&jobs[t]);
    }
}
