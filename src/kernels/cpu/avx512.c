/*
 * avx512.c - AVX-512 kernels: F32/F16/BF16 weights x F32 activations.
 *
 * Batch invariance by construction: each dot product is written once, as a
 * tile of R weight rows x T tokens whose every (row, token) pair owns one
 * vector accumulator and sees the same sequence of vector operations whatever
 * R and T are. vec_dot is the 1x1 tile; the gemm walks bigger tiles (weights
 * loaded once per tile, reused across its tokens) and smaller ones at the
 * edges, so every result has vec_dot's bits. Decode through sp_cpu_gemm with
 * one token still gets R independent FMA chains from the R-row tile.
 *
 * Q8_0 and Q4_0 weights (with VNNI) live in avx512_qgemm.c; without VNNI the
 * AVX2 versions registered before stay in place.
 */
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>
#include <string.h>

#define SP_INLINE static inline __attribute__((always_inline))

/* Token chunk of the gemm: about this many activation bytes stay hot in L2
 * while a row tile sweeps them. */
#define X_CHUNK_BYTES (192 * 1024)

/* Software prefetch distance along each weight row (a row tile reads R
 * streams at once; this helps the hardware prefetcher keep up). */
#define PF_BYTES 1024

SP_INLINE float
hsum512(__m512 v)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* ---- F32 / F16 / BF16 weights, F32 activations ----------------------------- */

#define FL_RM 4 /* rows per tile */
#define FL_TM 6 /* tokens per tile: 24 accumulators + 4 weights + 1 token of 32 zmm */

enum { W_F32, W_F16, W_BF16 };

SP_INLINE __m512
load_w16(int wt, const uint8_t *row, int64_t i)
{
    switch (wt) {
    case W_F32:
        return _mm512_loadu_ps((const float *)row + i);
    case W_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    default:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i))),
            16));
    }
}

SP_INLINE __m512
load_w16_mask(int wt, const uint8_t *row, int64_t i, __mmask16 m)
{
    switch (wt) {
    case W_F32:
        return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    case W_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    default:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i)), 16));
    }
}

/* y[t * ldy + r * ys] = dot(row r of w, token t of x), r < R, t < T; rows are
 * ws bytes apart, tokens xs bytes apart. */
SP_INLINE void
float_tile(const int wt, const int R, const int T, int64_t n, const uint8_t *w, size_t ws,
           const uint8_t *x, size_t xs, float *y, int64_t ldy, int64_t ys)
{
    __m512 acc[FL_RM][FL_TM];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            acc[r][t] = _mm512_setzero_ps();
        }
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 wv[FL_RM];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const uint8_t *row = w + (size_t)r * ws;
            _mm_prefetch((const char *)row + i * (wt == W_F32 ? 4 : 2) + PF_BYTES, _MM_HINT_T0);
            wv[r] = load_w16(wt, row, i);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_loadu_ps((const float *)(x + (size_t)t * xs) + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 wv[FL_RM];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wv[r] = load_w16_mask(wt, w + (size_t)r * ws, i, m);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, (const float *)(x + (size_t)t * xs) + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            y[t * ldy + r * ys] = hsum512(acc[r][t]);
        }
    }
}

/* ---- tile instances, vec_dot and the gemm drivers ------------------------ */

typedef void (*tile_fn)(int64_t n, const uint8_t *w, size_t ws, const uint8_t *x, size_t xs,
                        float *y, int64_t ldy, int64_t ys);

#define TILE(name, body, wt, R, T)                                                             \
    static void name##_##R##x##T(int64_t n, const uint8_t *w, size_t ws, const uint8_t *x,      \
                                 size_t xs, float *y, int64_t ldy, int64_t ys)                  \
    {                                                                                           \
        body(wt, R, T, n, w, ws, x, xs, y, ldy, ys);                                            \
    }

#define FLOAT_TILES(name, wt)                                                                  \
    TILE(name, float_tile, wt, 1, 1) TILE(name, float_tile, wt, 1, 2)                           \
    TILE(name, float_tile, wt, 1, 3) TILE(name, float_tile, wt, 1, 4)                           \
    TILE(name, float_tile, wt, 1, 5) TILE(name, float_tile, wt, 1, 6)                           \
    TILE(name, float_tile, wt, 4, 1) TILE(name, float_tile, wt, 4, 2)                           \
    TILE(name, float_tile, wt, 4, 3) TILE(name, float_tile, wt, 4, 4)                           \
    TILE(name, float_tile, wt, 4, 5) TILE(name, float_tile, wt, 4, 6)                           \
    static const tile_fn name##_tiles[2][FL_TM + 1] = {                                         \
        {NULL, name##_1x1, name##_1x2, name##_1x3, name##_1x4, name##_1x5, name##_1x6},         \
        {NULL, name##_4x1, name##_4x2, name##_4x3, name##_4x4, name##_4x5, name##_4x6},         \
    };

FLOAT_TILES(f32, W_F32)
FLOAT_TILES(f16, W_F16)
FLOAT_TILES(bf16, W_BF16)

/*
 * Rows in tiles of RM, tokens in tiles of TM, over token chunks small enough
 * to stay in cache while the row tiles sweep them. A row tile takes rows that
 * are Q = (r1 - r0) / RM apart, not adjacent ones: its RM weight streams are
 * then long runs that the hardware prefetcher follows (adjacent short rows,
 * e.g. 36 lines of Q4_0, end before it has ramped up). The RM * Q rows cover
 * [r0, r0 + RM * Q); the few left over go one by one.
 */
SP_INLINE void
gemm_driver(const tile_fn *full, const tile_fn *single, int RM, int TM, int64_t n,
            const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
            int64_t n_tok, float *y, int64_t ldy)
{
    int64_t tc = (int64_t)(X_CHUNK_BYTES / (xs ? xs : 1)) / TM * TM;
    if (tc < TM) {
        tc = TM;
    }
    const int64_t q = (r1 - r0) / RM, rest = r0 + q * RM;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        int64_t t1 = t0 + tc < n_tok ? t0 + tc : n_tok;
        for (int64_t r = r0; r < r1;) {
            bool tiled = r < r0 + q;
            const tile_fn *tiles = tiled ? full : single;
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * ws;
            for (int64_t t = t0; t < t1; t += TM) {
                int64_t tn = t1 - t < TM ? t1 - t : TM;
                tiles[tn](n, wr, ws * (size_t)q, (const uint8_t *)x + (size_t)t * xs, xs,
                          y + t * ldy + r, ldy, q);
            }
            r = r + 1 == r0 + q ? rest : r + 1;
        }
    }
}

#define GEMM_AND_DOT(name, RM, TM)                                                             \
    static void gemm_##name(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,         \
                            const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)     \
    {                                                                                           \
        gemm_driver(name##_tiles[1], name##_tiles[0], RM, TM, n, w, ws, r0, r1, x, xs, n_tok,   \
                    y, ldy);                                                                    \
    }                                                                                           \
    static void vec_dot_##name(int64_t n, float *s, const void *w, const void *x)               \
    {                                                                                           \
        name##_1x1(n, w, 0, x, 0, s, 1, 1);                                                     \
    }

GEMM_AND_DOT(f32, FL_RM, FL_TM)
GEMM_AND_DOT(f16, FL_RM, FL_TM)
GEMM_AND_DOT(bf16, FL_RM, FL_TM)

/* ---- conversions ---------------------------------------------------------- */

static void
f16_to_float(const void *src, float *dst, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
    }
}

static void
bf16_to_float(const void *src, float *dst, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(v, 16));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

void
sp__avx512_register(sp_cpu_kernels_t *k, bool has_vnni, bool has_bf16)
{
    (void)has_bf16; /* BF16 weights stay on the exact F32 path, see kernels.h */
    k->vec_dot[SP_TYPE_F32] = vec_dot_f32;
    k->gemm[SP_TYPE_F32] = gemm_f32;
    k->vec_dot[SP_TYPE_F16] = vec_dot_f16;
    k->gemm[SP_TYPE_F16] = gemm_f16;
    k->vec_dot[SP_TYPE_BF16] = vec_dot_bf16;
    k->gemm[SP_TYPE_BF16] = gemm_bf16;
    k->to_float[SP_TYPE_F16] = f16_to_float;
    k->to_float[SP_TYPE_BF16] = bf16_to_float;
    if (has_vnni) {
        sp__avx512_qgemm_register(k); /* Q8_0, Q4_0: avx512_qgemm.c */
    }
}
