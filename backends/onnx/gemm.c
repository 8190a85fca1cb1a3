/*
 * backends/onnx/gemm.c - single-precision GEMM for Conv (after im2col),
 * Gemm and MatMul: C[M,N] (+)= op(A)[M,K] * op(B)[K,N], row-major.
 *
 * Blocked: K in blocks of KC; B packed into panels of 16 columns and A into
 * panels of 4 rows (zero-padded at the edges), then a 4x16 micro-kernel
 * keeps its accumulators in registers. The micro-kernel has an AVX2+FMA
 * version chosen at run time (__builtin_cpu_supports) and a portable one.
 * A oneDNN or other library GEMM can replace ox_sgemm behind the same call.
 *
 * Threads: none; reentrant. Memory: packing buffers malloc'd per call.
 */
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
ox_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
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
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (have) micro = micro_avx2;
#endif
    int64_t np = (n + NR - 1) / NR, mp = (m + MR - 1) / MR;
    int64_t kc_max = k < KC ? k : KC;
    float *bpk = ox_aligned_alloc((size_t)(np * NR * kc_max) * sizeof(float));
    float *apk = ox_aligned_alloc((size_t)(mp * MR * kc_max) * sizeof(float));
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
            for (int64_t p = 0; p < kc; p++) {
                for (int64_t j = 0; j < NR; j++) {
                    int64_t col = jp * NR + j;
                    dst[p * NR + j] = col >= n ? 0.0f
                                    : trans_b ? b[col * ldb + pc + p] : b[(pc + p) * ldb + col];
                }
            }
        }
        for (int64_t ip = 0; ip < mp; ip++) {
            float *dst = apk + ip * MR * kc;
            for (int64_t p = 0; p < kc; p++) {
                for (int64_t i = 0; i < MR; i++) {
                    int64_t row = ip * MR + i;
                    dst[p * MR + i] = row >= m ? 0.0f
                                    : trans_a ? a[(pc + p) * lda + row] : a[row * lda + pc + p];
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
