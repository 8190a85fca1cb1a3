/*
 * backends/onnx/qgemm.c - the exact integer product under the quantized
 * operators (QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger and the
 * QDQ-fused Conv/MatMul/Gemm of ops_quant.c):
 *     C[i][j] = sum_k A[i][k] * B[j][k]        (int32, wrapping like ONNX's int32)
 * where A and B hold 8-bit values with their zero point already subtracted,
 * widened to int16 (range [-255, 255]), rows of kp elements (kp a multiple
 * of 16, zero padded). Both operands are "rows along K" so one dot-product
 * kernel serves Conv (A = weights, B = im2col transposed) and MatMul
 * (A = activations, B = weights transposed once at load).
 *
 * Why int16 pairs (vpmaddwd) and not vpmaddubsw: u8*s8 pairs saturate int16
 * (2*255*127 > 32767), which breaks exactness; after widening, vpmaddwd
 * gives 16 exact multiply-adds per instruction, the same rate as
 * vpmaddubsw+vpmaddwd without VNNI. Products <= 65025, pair sums <= 130050:
 * no lane overflows before the int32 accumulation.
 *
 * AVX2 kernel chosen at run time (__builtin_cpu_supports, SAMPAN_CPU=scalar
 * forces the portable one); both give bit-identical results (integer sums,
 * wrapping modulo 2^32 in both).
 *
 * Threads: sp_ox_qgemm splits the columns j over up to n_threads pthreads
 * (started per call, joined before it returns; each writes its own columns).
 * Memory: none of its own.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"

#define QG_MAX_THREADS 64

static void
dot_scalar(int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t kp, const int16_t *a,
           const int16_t *b, int32_t *c, int64_t ldc)
{
    for (int64_t i = m0; i < m1; i++) {
        const int16_t *ar = a + i * kp;
        for (int64_t j = n0; j < n1; j++) {
            const int16_t *br = b + j * kp;
            uint32_t s = 0; /* unsigned: wraps like the vector lanes, no UB */
            for (int64_t k = 0; k < kp; k++) s += (uint32_t)((int32_t)ar[k] * (int32_t)br[k]);
            c[i * ldc + j] = (int32_t)s;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QG_HAVE_AVX2 1

__attribute__((target("avx2"))) static inline int32_t
hsum(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* 2 rows of A against 4 rows of B: 6 loads feed 8 vpmaddwd per 16 k. */
__attribute__((target("avx2"))) static void
dot_avx2(int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t kp, const int16_t *a,
         const int16_t *b, int32_t *c, int64_t ldc)
{
    int64_t i = m0;
    for (; i + 2 <= m1; i += 2) {
        const int16_t *a0 = a + i * kp, *a1 = a0 + kp;
        int64_t j = n0;
        for (; j + 4 <= n1; j += 4) {
            const int16_t *b0 = b + j * kp, *b1 = b0 + kp, *b2 = b1 + kp, *b3 = b2 + kp;
            __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s03 = s00;
            __m256i s10 = s00, s11 = s00, s12 = s00, s13 = s00;
            for (int64_t k = 0; k < kp; k += 16) {
                __m256i x0 = _mm256_loadu_si256((const __m256i *)(a0 + k));
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(a1 + k));
                __m256i y = _mm256_loadu_si256((const __m256i *)(b0 + k));
                s00 = _mm256_add_epi32(s00, _mm256_madd_epi16(x0, y));
                s10 = _mm256_add_epi32(s10, _mm256_madd_epi16(x1, y));
                y = _mm256_loadu_si256((const __m256i *)(b1 + k));
                s01 = _mm256_add_epi32(s01, _mm256_madd_epi16(x0, y));
                s11 = _mm256_add_epi32(s11, _mm256_madd_epi16(x1, y));
                y = _mm256_loadu_si256((const __m256i *)(b2 + k));
                s02 = _mm256_add_epi32(s02, _mm256_madd_epi16(x0, y));
                s12 = _mm256_add_epi32(s12, _mm256_madd_epi16(x1, y));
                y = _mm256_loadu_si256((const __m256i *)(b3 + k));
                s03 = _mm256_add_epi32(s03, _mm256_madd_epi16(x0, y));
                s13 = _mm256_add_epi32(s13, _mm256_madd_epi16(x1, y));
            }
            int32_t *c0 = c + i * ldc + j, *c1 = c0 + ldc;
            c0[0] = hsum(s00); c0[1] = hsum(s01); c0[2] = hsum(s02); c0[3] = hsum(s03);
            c1[0] = hsum(s10); c1[1] = hsum(s11); c1[2] = hsum(s12); c1[3] = hsum(s13);
        }
        for (; j < n1; j++) {
            const int16_t *b0 = b + j * kp;
            __m256i s0 = _mm256_setzero_si256(), s1 = s0;
            for (int64_t k = 0; k < kp; k += 16) {
                __m256i y = _mm256_loadu_si256((const __m256i *)(b0 + k));
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a0 + k)), y));
                s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a1 + k)), y));
            }
            c[i * ldc + j] = hsum(s0);
            c[(i + 1) * ldc + j] = hsum(s1);
        }
    }
    for (; i < m1; i++) {
        const int16_t *a0 = a + i * kp;
        for (int64_t j = n0; j < n1; j++) {
            const int16_t *b0 = b + j * kp;
            __m256i s0 = _mm256_setzero_si256();
            for (int64_t k = 0; k < kp; k += 16) {
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a0 + k)),
                                                            _mm256_loadu_si256((const __m256i *)(b0 + k))));
            }
            c[i * ldc + j] = hsum(s0);
        }
    }
}
#endif

typedef void (*dot_fn)(int64_t, int64_t, int64_t, int64_t, int64_t, const int16_t *, const int16_t *,
                       int32_t *, int64_t);

static dot_fn
pick(void)
{
#ifdef QG_HAVE_AVX2
    const char *env = getenv("SAMPAN_CPU");
    if (!(env && strcmp(env, "scalar") == 0) && __builtin_cpu_supports("avx2")) return dot_avx2;
#endif
    return dot_scalar;
}

const char *
sp_ox_qgemm_kernel(void)
{
    return pick() == dot_scalar ? "scalar" : "avx2";
}

typedef struct qjob {
    dot_fn fn;
    int64_t m, n0, n1, kp, ldc;
    const int16_t *a, *b;
    int32_t *c;
} qjob_t;

static void *
qjob_run(void *p)
{
    const qjob_t *j = p;
    j->fn(0, j->m, j->n0, j->n1, j->kp, j->a, j->b, j->c, j->ldc);
    return NULL;
}

void
sp_ox_qgemm(int n_threads, int64_t m, int64_t n, int64_t kp, const int16_t *a, const int16_t *b,
            int32_t *c, int64_t ldc)
{
    dot_fn fn = pick();
    int t_count = n_threads < 1 ? 1 : n_threads > QG_MAX_THREADS ? QG_MAX_THREADS : n_threads;
    /* A thread costs tens of microseconds: only products of ~1M multiply-adds per thread split. */
    int64_t work = m * n * kp;
    while (t_count > 1 && (work / t_count < ((int64_t)1 << 20) || n < 4 * t_count)) t_count--;
    if (t_count == 1) {
        fn(0, m, 0, n, kp, a, b, c, ldc);
        return;
    }
    qjob_t jobs[QG_MAX_THREADS];
    pthread_t tids[QG_MAX_THREADS];
    bool started[QG_MAX_THREADS] = {0};
    int64_t per = (n + t_count - 1) / t_count;
    per = (per + 3) / 4 * 4;
    for (int t = 0; t < t_count; t++) {
        int64_t n0 = t * per < n ? t * per : n, n1 = n0 + per < n ? n0 + per : n;
        jobs[t] = (qjob_t){fn, m, n0, n1, kp, ldc, a, b, c};
        if (t > 0) started[t] = pthread_create(&tids[t], NULL, qjob_run, &jobs[t]) == 0;
    }
    qjob_run(&jobs[0]);
    for (int t = 1; t < t_count; t++) {
        if (started[t]) pthread_join(tids[t], NULL);
        else qjob_run(&jobs[t]);
    }
}
