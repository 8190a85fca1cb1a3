/*
 * avx2_f16gemm.c - the AVX2 prefill gemm of float weights (F16, BF16, and F32, which came
 * after the file's name) against F32 activations, for calls with many tokens.
 *
 * avx2.c's float tile (2 rows x 4 tokens) converts each weight vector (F16C, or BF16's widen and
 * shift; F32 is loaded as it is) for every 4 tokens and keeps 8 accumulators: 8 FMAs per 6 loads
 * and 2 conversions, and 8 chains of a 4-cycle FMA only just fill the two FMA pipes. Here the
 * conversion is taken out of the inner loop, as sgemm libraries pack their panels: for a chunk of
 * FP_TC tokens, a block of FP_RB rows and a panel of FP_KC elements, each 4-row slice of the panel
 * is converted once to F32 in a 2 KiB scratch (L1), and a 4 rows x 3 tokens register tile (12
 * accumulators, 3 activation vectors, one weight vector: all 16 ymm) runs over the chunk's tokens:
 * 12 FMAs per 7 loads, no conversion. A weight is converted once per FP_TC tokens instead of once
 * per 4. The panel's activations (FP_TC x FP_KC floats, 32 KiB) stay in L1/L2 while the row block's
 * slices sweep them; the accumulators of the row block's pairs live in a stack array between
 * panels.
 *
 * Numerics: every (row, token) pair owns one 8-lane accumulator that starts at zero, takes
 * one FMA per 8 elements in order along the row, and is reduced by avx2.c's hsum256 at the
 * end (8 rows of a token at a time, fp_hsum8: the same adds, one store of 8 outputs):
 * exactly avx2.c's float_tile sequence (vec_dot is its 1x1 tile). Splitting the row
 * into panels only stores and reloads the accumulator between FMAs, so the results are the
 * bits of every other tile and token count (batch invariance). Rows whose length is not a
 * multiple of 8 stay on avx2.c's tiles (its zero-padded tail step).
 *
 * Pure function, any thread, no heap; about 37 KiB of stack.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

#define FP_INLINE static inline __attribute__((always_inline))

#define FP_R 4    /* rows of the register tile */
#define FP_T 3    /* tokens of the register tile */
#define FP_KC 128 /* elements of a panel: FP_TC x FP_KC activation floats = 32 KiB */
#define FP_TC 64  /* tokens of a chunk */
#define FP_RB 16  /* rows of a block: FP_RB x FP_TC accumulators = 32 KiB */

_Static_assert(FP_RB % FP_R == 0, "a row block is whole register tiles");

FP_INLINE float
fp_hsum(__m256 v) /* avx2.c's hsum256: the same adds in the same order */
{
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/*
 * fp_hsum of a[0], a[FP_TC], ..., a[7 * FP_TC] (8 rows' accumulators for one token) into
 * the lanes of one vector, for one store of 8 outputs. fp_hsum adds lane j to lane j + 4,
 * then j to j + 2, then lane 0 to lane 1: the same pairs are added here, 8 accumulators
 * at a time, so the results are its bits (a float add is commutative, the tree is kept).
 * Reduced one at a time, row by row, a row block's outputs were 64 single stores ldy floats
 * apart for each row; where ldy is a multiple of 1024 (2048 outputs: 8 KiB) those fell in
 * one L1 set, and the stores with their reductions took a fifth to a third of the gemm's
 * time (a TinyLlama F16 prefill at the AVX2 level 1.13-1.17x faster with this).
 */
FP_INLINE __m256
fp_hsum8(const __m256 *a)
{
    __m256 p[4]; /* p[j]: accumulators 2j and 2j + 1, lane j + 4 added to lane j */
    for (int j = 0; j < 4; j++) {
        const __m256 u = a[(2 * j) * FP_TC], v = a[(2 * j + 1) * FP_TC];
        p[j] = _mm256_add_ps(_mm256_permute2f128_ps(u, v, 0x20),
                             _mm256_permute2f128_ps(u, v, 0x31));
    }
    /* q: (0, 2) and (1, 3) added for accumulators 0, 2 | 1, 3; r the same for 4, 6 | 5, 7 */
    const __m256 q = _mm256_add_ps(_mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 0 + lane 1: the sums of accumulators 0, 2, 4, 6 | 1, 3, 5, 7, then in order */
    const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(q, r, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(q, r, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/*
 * R rows x T tokens over kc elements (a multiple of 8): wp = the R rows' F32 panel (FP_KC
 * floats a row), x = the first token's panel start (tokens xs bytes apart), acc[r * FP_TC + t]
 * the pairs' accumulators, loaded and stored back.
 */
FP_INLINE void
fp_tile(const int R, const int T, int kc, const float *wp, const uint8_t *x, size_t xs,
        __m256 *acc)
{
    __m256 a[FP_R][FP_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) {
            a[r][t] = acc[r * FP_TC + t];
        }
    }
    for (int i = 0; i < kc; i += 8) {
        __m256 xv[FP_T];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) {
            xv[t] = _mm256_loadu_ps((const float *)(x + (size_t)t * xs) + i);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 wv = _mm256_load_ps(wp + r * FP_KC + i);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) {
                a[r][t] = _mm256_fmadd_ps(wv, xv[t], a[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) {
            acc[r * FP_TC + t] = a[r][t];
        }
    }
}

typedef void (*fp_tile_fn)(int kc, const float *wp, const uint8_t *x, size_t xs, __m256 *acc);

#define FP_TILE(R, T)                                                                          \
    static void fp_tile_##R##x##T(int kc, const float *wp, const uint8_t *x, size_t xs,        \
                                  __m256 *acc)                                                 \
    {                                                                                          \
        fp_tile(R, T, kc, wp, x, xs, acc);                                                     \
    }
FP_TILE(1, 1) FP_TILE(1, 2) FP_TILE(1, 3)
FP_TILE(2, 1) FP_TILE(2, 2) FP_TILE(2, 3)
FP_TILE(3, 1) FP_TILE(3, 2) FP_TILE(3, 3)
FP_TILE(4, 1) FP_TILE(4, 2) FP_TILE(4, 3)

static const fp_tile_fn fp_tiles[FP_R + 1][FP_T + 1] = {
    {NULL, NULL, NULL, NULL},
    {NULL, fp_tile_1x1, fp_tile_1x2, fp_tile_1x3},
    {NULL, fp_tile_2x1, fp_tile_2x2, fp_tile_2x3},
    {NULL, fp_tile_3x1, fp_tile_3x2, fp_tile_3x3},
    {NULL, fp_tile_4x1, fp_tile_4x2, fp_tile_4x3},
};

enum { FP_F16, FP_BF16, FP_F32 }; /* the weights' type */

/* rows [r0, r0 + R) of w, elements [k0, k0 + kc): F16, BF16 or F32 -> F32 into wp (FP_KC
 * floats a row), exactly as avx2.c's load_w8 converts them (F32: a copy, for the 4-row panel
 * the register tile reads) */
FP_INLINE void
fp_convert(int wt, int R, int kc, const uint8_t *w, size_t ws, int64_t r0, int64_t k0,
           float *wp)
{
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + (size_t)(r0 + r) * ws;
        for (int i = 0; i < kc; i += 8) {
            __m256 v;
            if (wt == FP_F32) {
                v = _mm256_loadu_ps((const float *)row + k0 + i);
            } else {
                const __m128i h =
                    _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k0 + i));
                v = wt == FP_BF16
                        ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                        : _mm256_cvtph_ps(h);
            }
            _mm256_store_ps(wp + r * FP_KC + i, v);
        }
    }
}

/*
 * The row slice's weights are read panel by panel, a row block apart in time: as many
 * streams as the block has rows, each 256 bytes a step (F32: 512), which the hardware
 * prefetcher does not follow (in the engine, with the weights in memory, the conversion then
 * took a third of the gemm's samples; with this, about a fifth). So while converting rows
 * [ra, ra + R) at k0, fetch (into L2) what those rows need next: the next panel, or at the row
 * block's end the next block's first panel (after the last block, the first block's, for the
 * next token chunk). A prefetch never faults.
 * Inlined: as a function of prefetches only, GCC finds it free of side effects and drops
 * the call.
 */
FP_INLINE void
fp_prefetch(int wt, int R, int64_t n, const uint8_t *w, size_t ws, int64_t r0, int64_t r1,
            int64_t ra, int64_t k0)
{
    const size_t esz = wt == FP_F32 ? 4 : 2; /* bytes of a weight */
    int64_t rn = ra, kn = k0 + FP_KC;
    if (kn >= n) {
        kn = 0;
        rn = ra + FP_RB < r1 ? ra + FP_RB : r0 + (ra - r0) % FP_RB;
    }
    for (int r = 0; r < R && rn + r < r1; r++) {
        const char *p = (const char *)(w + (size_t)(rn + r) * ws) + (size_t)kn * esz;
        for (size_t l = 0; l < FP_KC * esz; l += 64) {
            _mm_prefetch(p + l, _MM_HINT_T1);
        }
    }
}

FP_INLINE void
fp_gemm(int wt, int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
        size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    _Alignas(32) __m256 acc[FP_RB * FP_TC];
    _Alignas(32) float wp[FP_R * FP_KC];
    for (int64_t t0 = 0; t0 < n_tok; t0 += FP_TC) {
        const int tn = (int)(n_tok - t0 < FP_TC ? n_tok - t0 : FP_TC);
        const uint8_t *xc = (const uint8_t *)x + (size_t)t0 * xs;
        for (int64_t rb = r0; rb < r1; rb += FP_RB) {
            const int rn = (int)(r1 - rb < FP_RB ? r1 - rb : FP_RB);
            for (int i = 0; i < rn; i++) {
                for (int t = 0; t < tn; t++) {
                    acc[i * FP_TC + t] = _mm256_setzero_ps();
                }
            }
            for (int64_t k0 = 0; k0 < n; k0 += FP_KC) {
                const int kc = (int)(n - k0 < FP_KC ? n - k0 : FP_KC);
                for (int i = 0; i < rn; i += FP_R) {
                    const int R = rn - i < FP_R ? rn - i : FP_R;
                    fp_convert(wt, R, kc, (const uint8_t *)w, ws, rb + i, k0, wp);
                    fp_prefetch(wt, R, n, (const uint8_t *)w, ws, r0, r1, rb + i, k0);
                    for (int t = 0; t < tn; t += FP_T) {
                        const int T = tn - t < FP_T ? tn - t : FP_T;
                        fp_tiles[R][T](kc, wp, xc + (size_t)t * xs + (size_t)k0 * sizeof(float),
                                       xs, acc + i * FP_TC + t);
                    }
                }
            }
            for (int t = 0; t < tn; t++) {
                float *yt = y + (t0 + t) * ldy + rb;
                int i = 0;
                for (; i + 8 <= rn; i += 8) {
                    _mm256_storeu_ps(yt + i, fp_hsum8(acc + i * FP_TC + t));
                }
                for (; i < rn; i++) {
                    yt[i] = fp_hsum(acc[i * FP_TC + t]);
                }
            }
        }
    }
}

void
sp__f16_gemm_panel_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                        const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    fp_gemm(FP_F16, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

void
sp__bf16_gemm_panel_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                         const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    fp_gemm(FP_BF16, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}

void
sp__f32_gemm_panel_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                        const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    fp_gemm(FP_F32, n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
}
