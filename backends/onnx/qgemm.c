/*
 * backends/onnx/qgemm.c - the exact integer product under the quantized
 * operators (QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger and the
 * QDQ-fused Conv/MatMul/Gemm of ops_quant.c):
 *     C[i][j] = sum_k A[i][k] * B[j][k]        (int32, wrapping like ONNX's int32)
 * where A and B hold 8-bit values with their zero point already subtracted,
 * widened to int16 (range [-255, 255]); A is rows of kp elements (kp a
 * multiple of 16, zero padded), B is packed in panels of 16 columns: for
 * each pair of k, the 16 columns' two values side by side, so one 32-bit
 * broadcast of A's pair times one load of B gives 8 columns' partial sums
 * with vpmaddwd (no horizontal sums). Conv packs its im2col straight into
 * panels (A = weights); MatMul packs its constant weights once at load
 * (A = activations).
 *
 * Why int16 pairs (vpmaddwd) and not vpmaddubsw: u8*s8 pairs saturate int16
 * (2*255*127 > 32767), which breaks exactness; after widening, vpmaddwd
 * gives 16 exact multiply-adds per instruction, the same rate as
 * vpmaddubsw+vpmaddwd without VNNI. Products <= 65025, pair sums <= 130050:
 * no lane overflows before the int32 accumulation.
 *
 * AVX-512 VNNI (vpdpwssd) and AVX2 kernels chosen at run time
 * (__builtin_cpu_supports; SAMPAN_CPU=avx2 or scalar caps the level); all
 * give bit-identical results (integer sums, wrapping modulo 2^32).
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
#define QG_NR 16

size_t
sp_ox_qpanel_elems(int64_t n, int64_t kp)
{
    return (size_t)((n + QG_NR - 1) / QG_NR * QG_NR * kp);
}

void
sp_ox_qpack_rows(const int16_t *rows, int64_t n, int64_t kp, int16_t *panel)
{
    int64_t nb = (n + QG_NR - 1) / QG_NR;
    for (int64_t jb = 0; jb < nb; jb++) {
        int16_t *dst = panel + jb * QG_NR * kp;
        for (int64_t p = 0; p < kp / 2; p++) {
            for (int64_t j = 0; j < QG_NR; j++) {
                int64_t col = jb * QG_NR + j;
                dst[(p * QG_NR + j) * 2] = col < n ? rows[col * kp + 2 * p] : 0;
                dst[(p * QG_NR + j) * 2 + 1] = col < n ? rows[col * kp + 2 * p + 1] : 0;
            }
        }
    }
}

/* Rows [m0, m1) of A times column panels [jb0, jb1). */
typedef void (*block_fn)(int64_t m, int64_t jb0, int64_t jb1, int64_t n, int64_t kp, const int16_t *a,
                         const int16_t *b, int32_t *c, int64_t ldc, const int16_t *zero);

static void
block_scalar(int64_t m, int64_t jb0, int64_t jb1, int64_t n, int64_t kp, const int16_t *a, const int16_t *b,
             int32_t *c, int64_t ldc, const int16_t *zero)
{
    (void)zero;
    for (int64_t jb = jb0; jb < jb1; jb++) {
        const int16_t *bp = b + jb * QG_NR * kp;
        for (int64_t i = 0; i < m; i++) {
            const int16_t *ar = a + i * kp;
            uint32_t acc[QG_NR] = {0}; /* unsigned: wraps like the vector lanes, no UB */
            for (int64_t p = 0; p < kp / 2; p++) {
                int32_t a0 = ar[2 * p], a1 = ar[2 * p + 1];
                const int16_t *bq = bp + p * QG_NR * 2;
                for (int j = 0; j < QG_NR; j++) acc[j] += (uint32_t)(a0 * bq[2 * j]) + (uint32_t)(a1 * bq[2 * j + 1]);
            }
            for (int j = 0; j < QG_NR && jb * QG_NR + j < n; j++) c[i * ldc + jb * QG_NR + j] = (int32_t)acc[j];
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QG_HAVE_AVX2 1

/* 4 rows x 16 columns: per pair of k, 2 loads of B and 4 broadcasts of A feed 8 vpmaddwd. */
__attribute__((target("avx2"))) static void
block_avx2(int64_t m, int64_t jb0, int64_t jb1, int64_t n, int64_t kp, const int16_t *a, const int16_t *b,
           int32_t *c, int64_t ldc, const int16_t *zero)
{
    for (int64_t jb = jb0; jb < jb1; jb++) {
        const int16_t *bp = b + jb * QG_NR * kp;
        for (int64_t i = 0; i < m; i += 4) {
            const int16_t *ar[4];
            for (int r = 0; r < 4; r++) ar[r] = i + r < m ? a + (i + r) * kp : zero;
            __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00;
            __m256i c20 = c00, c21 = c00, c30 = c00, c31 = c00;
            for (int64_t p = 0; p < kp / 2; p++) {
                __m256i b0 = _mm256_loadu_si256((const __m256i *)(bp + p * 32));
                __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + p * 32 + 16));
                int32_t v;
                memcpy(&v, ar[0] + 2 * p, 4);
                __m256i x = _mm256_set1_epi32(v);
                c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(x, b0));
                c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(x, b1));
                memcpy(&v, ar[1] + 2 * p, 4);
                x = _mm256_set1_epi32(v);
                c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(x, b0));
                c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(x, b1));
                memcpy(&v, ar[2] + 2 * p, 4);
                x = _mm256_set1_epi32(v);
                c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(x, b0));
                c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(x, b1));
                memcpy(&v, ar[3] + 2 * p, 4);
                x = _mm256_set1_epi32(v);
                c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(x, b0));
                c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(x, b1));
            }
            int32_t out[4][QG_NR];
            _mm256_storeu_si256((__m256i *)out[0], c00);
            _mm256_storeu_si256((__m256i *)(out[0] + 8), c01);
            _mm256_storeu_si256((__m256i *)out[1], c10);
            _mm256_storeu_si256((__m256i *)(out[1] + 8), c11);
            _mm256_storeu_si256((__m256i *)out[2], c20);
            _mm256_storeu_si256((__m256i *)(out[2] + 8), c21);
            _mm256_storeu_si256((__m256i *)out[3], c30);
            _mm256_storeu_si256((__m256i *)(out[3] + 8), c31);
            int64_t cols = n - jb * QG_NR < QG_NR ? n - jb * QG_NR : QG_NR;
            for (int r = 0; r < 4 && i + r < m; r++) {
                memcpy(c + (i + r) * ldc + jb * QG_NR, out[r], (size_t)cols * sizeof(int32_t));
            }
        }
    }
}

/* AVX-512 VNNI: one panel row pair is exactly one zmm (16 columns x 2 int16), and vpdpwssd
 * multiplies the pairs and adds them into the int32 accumulator in one instruction (exact:
 * no saturation in the non-"s" form). 8 rows x 16 columns: 1 load of B, 8 broadcasts of A. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
block_avx512(int64_t m, int64_t jb0, int64_t jb1, int64_t n, int64_t kp, const int16_t *a, const int16_t *b,
             int32_t *c, int64_t ldc, const int16_t *zero)
{
    for (int64_t jb = jb0; jb < jb1; jb++) {
        const int16_t *bp = b + jb * QG_NR * kp;
        int64_t cols = n - jb * QG_NR < QG_NR ? n - jb * QG_NR : QG_NR;
        for (int64_t i = 0; i < m; i += 8) {
            const int16_t *ar[8];
            for (int r = 0; r < 8; r++) ar[r] = i + r < m ? a + (i + r) * kp : zero;
            const int16_t *a0 = ar[0], *a1 = ar[1], *a2 = ar[2], *a3 = ar[3], *a4 = ar[4], *a5 = ar[5],
                          *a6 = ar[6], *a7 = ar[7];
            __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
            /* spelled out: kept in registers (an indexed array of accumulators was spilled) */
#define QG_DP(cr, ap) do { int32_t v_; memcpy(&v_, (ap) + 2 * p, 4); \
                           cr = _mm512_dpwssd_epi32(cr, _mm512_set1_epi32(v_), bv); } while (0)
            for (int64_t p = 0; p < kp / 2; p++) {
                __m512i bv = _mm512_loadu_si512((const void *)(bp + p * 32));
                QG_DP(c0, a0); QG_DP(c1, a1); QG_DP(c2, a2); QG_DP(c3, a3);
                QG_DP(c4, a4); QG_DP(c5, a5); QG_DP(c6, a6); QG_DP(c7, a7);
            }
#undef QG_DP
            __m512i acc[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
            for (int r = 0; r < 8 && i + r < m; r++) {
                int32_t out[QG_NR];
                _mm512_storeu_si512((void *)out, acc[r]);
                memcpy(c + (i + r) * ldc + jb * QG_NR, out, (size_t)cols * sizeof(int32_t));
            }
        }
    }
}
#endif

/* SAMPAN_CPU=scalar or avx2 caps the level (tests compare them); otherwise the best this CPU has. */
static block_fn
pick(void)
{
#ifdef QG_HAVE_AVX2
    const char *env = getenv("SAMPAN_CPU");
    if (env && strcmp(env, "scalar") == 0) return block_scalar;
    bool cap2 = env && strcmp(env, "avx2") == 0;
    if (!cap2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni")) return block_avx512;
    if (__builtin_cpu_supports("avx2")) return block_avx2;
#endif
    return block_scalar;
}

const char *
sp_ox_qgemm_kernel(void)
{
    block_fn f = pick();
#ifdef QG_HAVE_AVX2
    if (f == block_avx512) return "avx512vnni";
    if (f == block_avx2) return "avx2";
#endif
    (void)f;
    return "scalar";
}

typedef struct qjob {
    block_fn fn;
    int64_t m, jb0, jb1, n, kp, ldc;
    const int16_t *a, *b, *zero;
    int32_t *c;
} qjob_t;

static void *
qjob_run(void *p)
{
    const qjob_t *j = p;
    j->fn(j->m, j->jb0, j->jb1, j->n, j->kp, j->a, j->b, j->c, j->ldc, j->zero);
    return NULL;
}

void
sp_ox_qgemm(int n_threads, int64_t m, int64_t n, int64_t kp, const int16_t *a, const int16_t *b,
            int32_t *c, int64_t ldc)
{
    block_fn fn = pick();
    int16_t *zero = calloc((size_t)kp + 16, sizeof *zero);
    if (zero == NULL) {
        /* no spare row: the scalar blocks need none */
        block_scalar(m, 0, (n + QG_NR - 1) / QG_NR, n, kp, a, b, c, ldc, NULL);
        return;
    }
    int64_t nb = (n + QG_NR - 1) / QG_NR;
    int t_count = n_threads < 1 ? 1 : n_threads > QG_MAX_THREADS ? QG_MAX_THREADS : n_threads;
    /* A thread costs tens of microseconds: split only products of 256K+ multiply-adds a thread. */
    int64_t work = m * n * kp;
    while (t_count > 1 && (work / t_count < ((int64_t)1 << 18) || nb < t_count)) t_count--;
    qjob_t jobs[QG_MAX_THREADS];
    pthread_t tids[QG_MAX_THREADS];
    bool started[QG_MAX_THREADS] = {0};
    int64_t per = (nb + t_count - 1) / t_count;
    for (int t = 0; t < t_count; t++) {
        int64_t j0 = t * per < nb ? t * per : nb, j1 = j0 + per < nb ? j0 + per : nb;
        jobs[t] = (qjob_t){fn, m, j0, j1, n, kp, ldc, a, b, zero, c};
        if (t > 0) started[t] = pthread_create(&tids[t], NULL, qjob_run, &jobs[t]) == 0;
    }
    qjob_run(&jobs[0]);
    for (int t = 1; t < t_count; t++) {
        if (started[t]) pthread_join(tids[t], NULL);
        else qjob_run(&jobs[t]);
    }
    free(zero);
}
