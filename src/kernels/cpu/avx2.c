/*
 * avx2.c - AVX2 + FMA + F16C kernels: F32/F16/BF16 x F32, Q8_0/Q4_0 x Q8_0,
 * and the F32 -> Q8_0 activation quantizer.
 *
 * Same scheme as avx512.c: each dot product is a tile of R weight rows x T
 * tokens in which every (row, token) pair owns one accumulator and sees the
 * same operations whatever R and T are; vec_dot is the 1x1 tile, so the gemm
 * gives vec_dot's bits for every pair (batch invariance).
 *
 * Q8_0 x Q8_0 widens both sides to int16 and uses vpmaddwd, which is exact
 * for every byte value (the vpmaddubsw sign trick saturates on -128).
 * Q4_0 keeps the nibble unsigned (0..15, no saturation in vpmaddubsw) and
 * subtracts 8 * sum(x), computed once per token, in int32.
 */
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define SP_INLINE static inline __attribute__((always_inline))

#define X_CHUNK_BYTES (128 * 1024)

SP_INLINE float
hsum256(__m256 v)
{
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

SP_INLINE float
fp16_to_f32(sp_fp16_t h)
{
    return _cvtsh_ss(h);
}

/* ---- F32 / F16 / BF16 weights, F32 activations ----------------------------- */

/* F16, BF16 and F32 calls of SP_F16_PANEL_MIN_TOK tokens and up go to avx2_f16gemm.c (same
 * bits), fewer to the FL_R1-row tiles below; the FL_RM x FL_TM tiles take what the panels
 * cannot (rows whose length is not whole 8-element steps). */
#define FL_RM 2 /* 8 accumulators + 2 weights + 1 token of 16 ymm */
#define FL_TM 4
/* Rows of the few-token tiles (FL_R1 rows x 1 or 2 tokens, every call of up to FL_FEW
 * tokens). One token gives each row a single accumulator chain, one FMA (4-cycle latency)
 * per 8 weights, so 2 rows run at 2 x 16 bytes of F16 per 4 cycles: about 30 GB/s on a Zen 5
 * core, under the memory's read rate (decode_bench). 4 rows compute at about 58 GB/s a core
 * with the weights in L2 and 8 at the F16C conversion's 85-90, but a decode streams them from
 * memory, where each row is a stream of its own: 4 streams read at 113-122% of decode_bench's
 * plain read on 2 threads, 8 at 82-89%; and 4 rows x 2 tokens beat the 2 x 4 tiles at 2 to 11
 * tokens, 1.03-1.6x (design.md, "The AVX2 one-token float tile: 4 streams"). Each (row, token)
 * pair still sees the same operations in the same order, so the bits are those of every other
 * tile (batch invariance). */
#define FL_R1 4
/* below the panels (avx2_f16gemm.c), which from 12 tokens are faster per multiply-add */
#define FL_FEW (SP_F16_PANEL_MIN_TOK - 1)
#define FL_PF 2048 /* prefetch distance of the few-token tiles along each row, bytes */

enum { W_F32, W_F16, W_BF16 };

SP_INLINE __m256
load_w8(int wt, const uint8_t *row, int64_t i)
{
    switch (wt) {
    case W_F32:
        return _mm256_loadu_ps((const float *)row + i);
    case W_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    default:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))),
            16));
    }
}

/* The last n - i < 8 elements, zero-padded through a small buffer. */
SP_INLINE __m256
load_w8_tail(int wt, const uint8_t *row, int64_t i, int64_t left)
{
    if (wt == W_F32) {
        float buf[8] = {0};
        memcpy(buf, (const float *)row + i, (size_t)left * sizeof(float));
        return _mm256_loadu_ps(buf);
    }
    uint16_t buf[8] = {0};
    memcpy(buf, (const uint16_t *)row + i, (size_t)left * sizeof(uint16_t));
    return load_w8(wt, (const uint8_t *)buf, 0);
}

SP_INLINE __m256
load_x8_tail(const uint8_t *row, int64_t i, int64_t left)
{
    float buf[8] = {0};
    memcpy(buf, (const float *)row + i, (size_t)left * sizeof(float));
    return _mm256_loadu_ps(buf);
}

/* y[t * ldy + r * ys] = dot(row r of w, token t of x), r < R, t < T; rows are
 * ws bytes apart, tokens xs bytes apart. */
SP_INLINE void
float_tile(const int wt, const int R, const int T, int64_t n, const uint8_t *w, size_t ws,
           const uint8_t *x, size_t xs, float *y, int64_t ldy, int64_t ys)
{
    __m256 acc[FL_R1][FL_TM];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            acc[r][t] = _mm256_setzero_ps();
        }
    }
    int64_t i = 0;
    if (R == FL_R1 && T <= 2) {
        /* The few-token tiles stream FL_R1 rows from memory: 64 bytes of each at a time, with a
         * prefetch FL_PF bytes ahead on each row (as avx512.c's tiles do), so the loads of all
         * streams are in flight before they are needed. Same FMAs in the same order. */
        const int64_t esz = wt == W_F32 ? 4 : 2, step = 64 / esz;
        for (; i + step <= n; i += step) {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)(w + (size_t)r * ws) + i * esz + FL_PF, _MM_HINT_T0);
            }
#pragma GCC unroll 8
            for (int64_t j = i; j < i + step; j += 8) {
                __m256 wv[FL_R1];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    wv[r] = load_w8(wt, w + (size_t)r * ws, j);
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const __m256 xv = _mm256_loadu_ps((const float *)(x + (size_t)t * xs) + j);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
                    }
                }
            }
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 wv[FL_R1];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wv[r] = load_w8(wt, w + (size_t)r * ws, i);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps((const float *)(x + (size_t)t * xs) + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
    if (i < n) {
        __m256 wv[FL_R1];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wv[r] = load_w8_tail(wt, w + (size_t)r * ws, i, n - i);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256 xv = load_x8_tail(x + (size_t)t * xs, i, n - i);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            y[t * ldy + r * ys] = hsum256(acc[r][t]);
        }
    }
}

/* ---- Q8_0 / Q4_0 weights, Q8_0 activations --------------------------------- */

#define Q_RM 2
#define Q_TM 2

enum { W_Q8_0, W_Q4_0 };

/* Per-row state of one block: Q8_0 as two int16 halves, Q4_0 as 32 nibbles. */
typedef struct {
    __m256i a, b;
    __m256 d;
} wblk;

SP_INLINE wblk
load_wblk(int wt, const uint8_t *row, int64_t bi)
{
    wblk o;
    if (wt == W_Q8_0) {
        const sp_block_q8_0 *p = (const sp_block_q8_0 *)row + bi;
        __m256i q = _mm256_loadu_si256((const __m256i *)p->qs);
        o.a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
        o.b = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
        o.d = _mm256_set1_ps(fp16_to_f32(p->d));
    } else {
        const sp_block_q4_0 *p = (const sp_block_q4_0 *)row + bi;
        const __m128i m4 = _mm_set1_epi8(0x0f);
        __m128i raw = _mm_loadu_si128((const __m128i *)p->qs);
        __m128i lo = _mm_and_si128(raw, m4);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
        o.a = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
        o.b = _mm256_setzero_si256();
        o.d = _mm256_set1_ps(fp16_to_f32(p->d));
    }
    return o;
}

SP_INLINE void
quant_tile(const int wt, const int R, const int T, int64_t n, const uint8_t *w, size_t ws,
           const uint8_t *x, size_t xs, float *y, int64_t ldy, int64_t ys)
{
    const int64_t nb = n / 32;
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i eights = _mm256_set1_epi8(8);
    __m256 acc[Q_RM][Q_TM];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            acc[r][t] = _mm256_setzero_ps();
        }
    }
    for (int64_t b = 0; b < nb; b++) {
        wblk wb[Q_RM];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wb[r] = load_wblk(wt, w + (size_t)r * ws, b);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const sp_block_q8_0 *xb = (const sp_block_q8_0 *)(x + (size_t)t * xs) + b;
            __m256i xq = _mm256_loadu_si256((const __m256i *)xb->qs);
            __m256 xd = _mm256_set1_ps(fp16_to_f32(xb->d));
            if (wt == W_Q8_0) {
                __m256i xa = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(xq));
                __m256i xb16 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(xq, 1));
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(wb[r].a, xa),
                                                    _mm256_madd_epi16(wb[r].b, xb16));
                    __m256 s = _mm256_mul_ps(wb[r].d, xd);
                    acc[r][t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(isum), acc[r][t]);
                }
            } else {
                /* 8 * sum(x) per int32 lane, the same lanes as the product below */
                __m256i corr = _mm256_madd_epi16(_mm256_maddubs_epi16(eights, xq), ones16);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wb[r].a, xq), ones16);
                    __m256i isum = _mm256_sub_epi32(p, corr);
                    __m256 s = _mm256_mul_ps(wb[r].d, xd);
                    acc[r][t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(isum), acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            y[t * ldy + r * ys] = hsum256(acc[r][t]);
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
    TILE(name, float_tile, wt, 2, 1) TILE(name, float_tile, wt, 2, 2)                           \
    TILE(name, float_tile, wt, 2, 3) TILE(name, float_tile, wt, 2, 4)                           \
    TILE(name, float_tile, wt, 4, 1) TILE(name, float_tile, wt, 4, 2)                           \
    static const tile_fn name##_tiles[2][FL_TM + 1] = {                                         \
        {NULL, name##_1x1, name##_1x2, name##_1x3, name##_1x4},                                 \
        {NULL, name##_2x1, name##_2x2, name##_2x3, name##_2x4},                                 \
    };                                                                                          \
    static const tile_fn name##_tiles_few[FL_TM + 1] = {NULL, name##_4x1, name##_4x2, NULL, NULL};

#define QUANT_TILES(name, wt)                                                                  \
    TILE(name, quant_tile, wt, 1, 1) TILE(name, quant_tile, wt, 1, 2)                           \
    TILE(name, quant_tile, wt, 2, 1) TILE(name, quant_tile, wt, 2, 2)                           \
    static const tile_fn name##_tiles[2][Q_TM + 1] = {                                          \
        {NULL, name##_1x1, name##_1x2},                                                         \
        {NULL, name##_2x1, name##_2x2},                                                         \
    };

FLOAT_TILES(f32, W_F32)
FLOAT_TILES(f16, W_F16)
FLOAT_TILES(bf16, W_BF16)
QUANT_TILES(q8_0, W_Q8_0)
QUANT_TILES(q4_0, W_Q4_0)

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

/* The float types: up to FL_FEW tokens take the FL_R1-row tiles (see FL_R1), more the
 * FL_RM x FL_TM tiles; all give every pair the same bits. */
#define FLOAT_GEMM_AND_DOT(name)                                                               \
    static void gemm_##name(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,         \
                            const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)     \
    {                                                                                           \
        if (n_tok <= FL_FEW) {                                                                  \
            gemm_driver(name##_tiles_few, name##_tiles[0], FL_R1, 2, n, w, ws, r0, r1, x, xs,     \
                        n_tok, y, ldy);                                                         \
            return;                                                                             \
        }                                                                                       \
        gemm_driver(name##_tiles[1], name##_tiles[0], FL_RM, FL_TM, n, w, ws, r0, r1, x, xs,    \
                    n_tok, y, ldy);                                                             \
    }                                                                                           \
    static void vec_dot_##name(int64_t n, float *s, const void *w, const void *x)               \
    {                                                                                           \
        name##_1x1(n, w, 0, x, 0, s, 1, 1);                                                     \
    }

FLOAT_GEMM_AND_DOT(f32)
FLOAT_GEMM_AND_DOT(f16)
FLOAT_GEMM_AND_DOT(bf16)
GEMM_AND_DOT(q8_0, Q_RM, Q_TM)
GEMM_AND_DOT(q4_0, Q_RM, Q_TM)

/* F16, BF16 and F32 prefill: many tokens go to avx2_f16gemm.c's panels (the same bits, fewer
 * conversions and loads), rows whose length is not whole 8-element steps stay on the tiles */
#define FLOAT_PANEL_GEMM(name)                                                                 \
    static void gemm_##name##_wide(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, \
                                   const void *x, size_t xs, int64_t n_tok, float *y,          \
                                   int64_t ldy)                                                \
    {                                                                                           \
        if (n_tok >= SP_F16_PANEL_MIN_TOK && n % 8 == 0) {                                      \
            sp__##name##_gemm_panel_avx2(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);               \
        } else {                                                                                \
            gemm_##name(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);                                \
        }                                                                                       \
    }

FLOAT_PANEL_GEMM(f16)
FLOAT_PANEL_GEMM(bf16)
FLOAT_PANEL_GEMM(f32)

/* ---- conversions ---------------------------------------------------------- */

/* F32 -> Q8_0 activations, bit-identical to the reference's activation
 * quantizer (ref.c, q8_0_act_from_float: llama.cpp's rule): d = amax / 127
 * stored as half, q = x * (127 / amax) rounded half to even (vroundps to
 * nearest), q = 0 where the half scale is 0. AVX-512 uses this one too. */
static void
q8_0_from_float(const float *src, void *dst, int64_t n)
{
    sp_block_q8_0 *out = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int64_t i = 0; i < n / SP_QK8_0; i++) {
        const float *x = src + i * SP_QK8_0;
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), amax); /* NaN lanes dropped */
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float am = _mm_cvtss_f32(m);
        /* F16C's conversion rounds to nearest even as sp_fp32_to_fp16 does (am is never NaN),
         * inline: a call here made GCC spill the block's four vectors around it */
        const sp_fp16_t dh = (sp_fp16_t)_cvtss_sh(am / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        out[i].d = dh;
        if (_cvtsh_ss(dh) == 0.0f) {
            memset(out[i].qs, 0, sizeof(out[i].qs));
            continue;
        }
        const __m256 id = _mm256_set1_ps(127.0f / am);
        __m256i q[4];
        for (int j = 0; j < 4; j++) {
            __m256 t = _mm256_mul_ps(v[j], id);
            t = _mm256_min_ps(_mm256_max_ps(t, lo), hi); /* NaN -> -127, as fmaxf() */
            t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[j] = _mm256_cvttps_epi32(t); /* already integral */
        }
        __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
        __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i b = _mm256_packs_epi16(p01, p23);
        b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)out[i].qs, b);
    }
}

static void
f16_to_float(const void *src, float *dst, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    }
    for (; i < n; i++) {
        dst[i] = fp16_to_f32(s[i]);
    }
}

void
sp__avx2_register(sp_cpu_kernels_t *k)
{
    k->vec_dot[SP_TYPE_F32] = vec_dot_f32;
    k->gemm[SP_TYPE_F32] = gemm_f32_wide;
    k->vec_dot[SP_TYPE_F16] = vec_dot_f16;
    k->gemm[SP_TYPE_F16] = gemm_f16_wide;
    k->vec_dot[SP_TYPE_BF16] = vec_dot_bf16;
    k->gemm[SP_TYPE_BF16] = gemm_bf16_wide;
    k->vec_dot[SP_TYPE_Q8_0] = vec_dot_q8_0;
    k->gemm[SP_TYPE_Q8_0] = gemm_q8_0;
    k->vec_dot[SP_TYPE_Q4_0] = vec_dot_q4_0;
    k->gemm[SP_TYPE_Q4_0] = gemm_q4_0;
    k->from_float[SP_TYPE_Q8_0] = q8_0_from_float;
    k->to_float[SP_TYPE_F16] = f16_to_float;
}
