/*
 * avx512_kpanel.c - AVX-512 VNNI gemms of Q2_K and Q6_K weights (the GGUF's row-major blocks)
 * x Q8_K activations, for prefill chunks and batched decode steps of 12 (Q2_K) or 20 (Q6_K)
 * tokens and more; fewer tokens go to the kernels the table had before (same bits).
 *
 * Why panels: the 1-row x 4-token AVX-512 tiles of avx512_kquants.c spend most of their time,
 * per (row, token, super-block), on the horizontal sum, the scalar float finish and its serial
 * add, and decode each row's weights again for every 4 tokens (perf annotate of a Q4_K
 * prefill: vphaddw / vcvtdq2ps / vmovshdup / vaddss on the bsums and the finish hold the top
 * samples). Here the finish is one vector op for 8 rows and the decode is paid once per 256
 * tokens.
 *
 * A panel is 8 weight rows x up to KP_KB super-blocks. It is decoded once into an L1/L2
 * scratch in the layout the VNNI tile wants, then every token of the chunk sweeps it:
 *
 *   - quants: octet o of a super-block (elements 8 o .. 8 o + 7) of the 8 rows is one
 *     64-byte vector, row r in 64-bit lane r. Q2_K's 4-bit scale is folded into the quant
 *     (sc * q <= 15 * 3 = 45 fits a byte), so one VPDPBUSD against the token's 8 signed Q8_K
 *     bytes (a 64-bit broadcast) adds sum(sc * q * x) of four elements into int32 lane
 *     (row, e), e the octet's half: sumi = sum_g sc[g] sum(q * x) exactly, with no
 *     per-group multiply (|sumi| <= 256 * 45 * 127);
 *   - mins: four vectors of int16 pairs (m[r][4s + 2e], m[r][4s + 2e + 1]) in dword (r, e),
 *     met by VPDPWSSD with the token's bsums (one 64-bit broadcast of bsums[4s .. 4s + 3]):
 *     summs = sum_g m[g] bsums[g] exactly;
 *   - d and dmin of the 8 rows as floats.
 *
 * The two dword halves of a row are added, one VPERMT2D puts [sumi, summs] in row order, and
 * the float finish is kquants2_impl.h's scale-and-min sequence lane-wise (d = y.d * x.d,
 * dm = y.d * x.dmin, a = d * sumi, c = dm * summs, blk = a - c, sumf = sumf + blk, super-blocks
 * ascending), the running sums kept in a per-chunk float buffer between panels (a float
 * store and reload is exact): the scalar reference's bits, so vec_dot's at every level.
 * Calls with few tokens go to the AVX2 8-token panels, which give the same bits without the
 * decode cost. Q6_K's numerics are at q6k_tile.
 *
 * Pure functions, any thread, no heap; about 36 KiB of stack (a Q6_K panel and the sums).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/avx512_simd.h"
#include "kernels/cpu/kquants2_impl.h"
#include "kernels/cpu/kquants_impl.h"

#define KP_INLINE static inline __attribute__((always_inline))

enum {
    KP_ROWS = 8,           /* rows per panel: one 64-bit lane each */
    KP_TM = 8,             /* tokens per tile */
    KP_TC = 256,           /* tokens per chunk: their activations (600 KiB) stay in L2 */
    KP_KB = 8,             /* super-blocks per panel: a Q6_K panel (27 KiB) stays in L1 */
    KP_MIN_TOK = 12,       /* Q2_K: fewer tokens go to the AVX2 panels (qgemm_shape_bench) */
    K6_MIN_TOK = 20,       /* Q6_K: fewer go to the 1-row x 4-token VNNI tiles */
    KP_QS = 0,             /* Q2_K panel block: 32 octet vectors */
    KP_M = 32 * 64,        /* 4 min-pair vectors */
    KP_D = KP_M + 4 * 64,  /* 8 d, then 8 dmin, as float */
    KP_BLK = KP_D + 64,    /* bytes of one decoded Q2_K super-block of the panel */
    K6_QS = 0,             /* Q6_K panel block: 32 octet vectors of q (0..63) */
    K6_SC = 32 * 64,       /* 16 scale vectors: group g's scale in the 4 words of row r */
    K6_CR = K6_SC + 16 * 64, /* 4 scale-pair vectors for the -32 correction (as KP_M) */
    K6_D = K6_CR + 4 * 64, /* 8 d as float */
    K6_BLK = K6_D + 64,
    KP_PAN = KP_KB * (K6_BLK > KP_BLK ? K6_BLK : KP_BLK), /* the panel scratch */
};

/* VPERMT2D: the row sums sit in dword 2r of both sources (after folding the halves) */
static const int32_t kp_rows_idx[16] __attribute__((aligned(64))) = {
    0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};

/* ---- Q2_K panel decode -------------------------------------------------------------------- */

/* Row r (0..7) of the panel: super-blocks [0, nb) of blocks x (NULL: a zero row). */
static void
q2k_decode_row(uint8_t *pan, int r, const sp_block_q2_k *x, int64_t nb)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = pan + (size_t)b * KP_BLK;
        if (x == NULL) {
            for (int o = 0; o < 32; o++) {
                memset(pb + KP_QS + 64 * o + 8 * r, 0, 8);
            }
            for (int s = 0; s < 4; s++) {
                memset(pb + KP_M + 64 * s + 8 * r, 0, 8);
            }
            memset(pb + KP_D + 4 * r, 0, 4);
            memset(pb + KP_D + 32 + 4 * r, 0, 4);
            continue;
        }
        const sp_block_q2_k *xb = &x[b];
        for (int half = 0; half < 2; half++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * half));
            for (int sh = 0; sh < 4; sh++) {
                /* elements 128 half + 32 sh .. + 31: groups 2k, 2k + 1 (k = 4 half + sh) */
                const int k = 4 * half + sh;
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * sh), m3);
                /* q * sc per byte with one 16-bit multiply: both bytes of a word share the
                 * scale and each product is < 256, so nothing carries across bytes */
                const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(xb->scales[2 * k + 1] & 0xF),
                                                    _mm_set1_epi16(xb->scales[2 * k] & 0xF));
                uint8_t v[32];
                _mm256_storeu_si256((__m256i *)v, _mm256_mullo_epi16(q, sc));
                for (int i = 0; i < 4; i++) {
                    memcpy(pb + KP_QS + 64 * (4 * k + i) + 8 * r, v + 8 * i, 8);
                }
            }
        }
        for (int s = 0; s < 4; s++) { /* words 4r .. 4r + 3 of vector s: m[4s .. 4s + 3] */
            int16_t m4[4];
            for (int i = 0; i < 4; i++) {
                m4[i] = (int16_t)(xb->scales[4 * s + i] >> 4);
            }
            memcpy(pb + KP_M + 64 * s + 8 * r, m4, sizeof m4);
        }
        const float dd[2] = {_cvtsh_ss(xb->d), _cvtsh_ss(xb->dmin)};
        memcpy(pb + KP_D + 4 * r, &dd[0], 4);
        memcpy(pb + KP_D + 32 + 4 * r, &dd[1], 4);
    }
}

/* ---- the VNNI tile ------------------------------------------------------------------------ */

/* T tokens x the panel's 8 rows over nb decoded super-blocks; acc[t] (8 floats, row order) is
 * read and written back. x: the tokens' Q8_K blocks of the panel's first super-block. */
KP_INLINE void
q2k_tile(int T, int64_t nb, const uint8_t *pan, const uint8_t *x, size_t xs, float *acc)
{
    const __m512i rows_idx = _mm512_load_si512((const void *)kp_rows_idx);
    __m256 a[KP_TM];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        a[t] = _mm256_loadu_ps(acc + KP_ROWS * t);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = pan + (size_t)b * KP_BLK;
        const uint8_t *xb = x + (size_t)b * sizeof(sp_block_q8_k);
        __m512i si[KP_TM];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            si[t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int o = 0; o < 32; o++) {
            const __m512i wv = _mm512_load_si512((const void *)(pb + KP_QS + 64 * o));
            const uint8_t *xq = xb + offsetof(sp_block_q8_k, qs) + 8 * o;
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                si[t] = _mm512_dpbusd_epi32(si[t], wv, sp512_bcast8(xq + (size_t)t * xs));
            }
        }
        const __m512 dw = _mm512_load_ps((const void *)(pb + KP_D));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = xb + (size_t)t * xs;
            const uint8_t *bs = xt + offsetof(sp_block_q8_k, bsums);
            __m512i mm = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                mm = _mm512_dpwssd_epi32(mm, _mm512_load_si512((const void *)(pb + KP_M + 64 * s)),
                                         sp512_bcast8(bs + 8 * s));
            }
            const __m512i s2 = _mm512_add_epi32(si[t], _mm512_shuffle_epi32(si[t], 0xB1));
            mm = _mm512_add_epi32(mm, _mm512_shuffle_epi32(mm, 0xB1));
            a[t] = _mm256_add_ps(a[t], sp512_kquant_blk(s2, mm, rows_idx, xt, dw));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        _mm256_storeu_ps(acc + KP_ROWS * t, a[t]);
    }
}

/* ---- Q6_K panel decode and tile ----------------------------------------------------------- */

/* Row r (0..7) of a Q6_K panel: q (0..63) of super-blocks [0, nb), the int8 group scales as
 * int16, d as float (x NULL: a zero row). */
static void
q6k_decode_row(uint8_t *pan, int r, const sp_block_q6_k *x, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = pan + (size_t)b * K6_BLK;
        if (x == NULL) {
            for (int o = 0; o < 32; o++) {
                memset(pb + K6_QS + 64 * o + 8 * r, 0, 8);
            }
            for (int v = 0; v < 20; v++) { /* the 16 scale and 4 pair vectors */
                memset(pb + K6_SC + 64 * v + 8 * r, 0, 8);
            }
            memset(pb + K6_D + 4 * r, 0, 4);
            continue;
        }
        const sp_block_q6_k *xb = &x[b];
        for (int h = 0; h < 2; h++) {
            /* kernels.h's Q6_K: elements 128 h + l, + 32, + 64, + 96 take the low / high
             * nibbles of ql[64 h + l], ql[64 h + 32 + l] and bit pairs 0, 2, 4, 6 of qh[32 h + l] */
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(xb->ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(xb->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(xb->qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                   _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int j = 0; j < 4; j++) {
                uint8_t v[32];
                _mm256_storeu_si256((__m256i *)v, q[j]);
                for (int i = 0; i < 4; i++) { /* octets 4 (4h + j) + i */
                    memcpy(pb + K6_QS + 64 * (16 * h + 4 * j + i) + 8 * r, v + 8 * i, 8);
                }
            }
        }
        for (int g = 0; g < 16; g++) {
            const int16_t s4[4] = {xb->scales[g], xb->scales[g], xb->scales[g], xb->scales[g]};
            memcpy(pb + K6_SC + 64 * g + 8 * r, s4, sizeof s4);
        }
        for (int s = 0; s < 4; s++) {
            const int16_t p4[4] = {xb->scales[4 * s], xb->scales[4 * s + 1],
                                   xb->scales[4 * s + 2], xb->scales[4 * s + 3]};
            memcpy(pb + K6_CR + 64 * s + 8 * r, p4, sizeof p4);
        }
        const float d = _cvtsh_ss(xb->d);
        memcpy(pb + K6_D + 4 * r, &d, 4);
    }
}

/*
 * Q6_K: VPMADDUBSW of the unsigned q (0..63) against the token's 8 signed bytes gives int16
 * pair sums (at most 2 * 63 * 128 = 16128: no saturation), and VPDPWSSD multiplies them by
 * the group's scale and adds into int32 lane (row, e): sum_g sc[g] sum(q * x), exact
 * (<= 256 * 63 * 128 * 128). The -32 is sum_g sc[g] bsums[g], four VPDPWSSD of scale pairs
 * against the bsums as Q2_K's mins, times 32 (a shift): sumi = main - 32 corr, exact. Float
 * finish kquants_impl.h's: d = y.d * x.d; blk = d * sumi; sumf = sumf + blk.
 */
KP_INLINE void
q6k_tile(int T, int64_t nb, const uint8_t *pan, const uint8_t *x, size_t xs, float *acc)
{
    __m256 a[KP_TM];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        a[t] = _mm256_loadu_ps(acc + KP_ROWS * t);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = pan + (size_t)b * K6_BLK;
        const uint8_t *xb = x + (size_t)b * sizeof(sp_block_q8_k);
        __m512i s0[KP_TM], s1[KP_TM]; /* even and odd octets: two dependency chains */
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            s0[t] = s1[t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 2
        for (int g = 0; g < 16; g++) {
            const __m512i S = _mm512_load_si512((const void *)(pb + K6_SC + 64 * g));
            const __m512i w0 = _mm512_load_si512((const void *)(pb + K6_QS + 128 * g));
            const __m512i w1 = _mm512_load_si512((const void *)(pb + K6_QS + 128 * g + 64));
            const uint8_t *xq = xb + offsetof(sp_block_q8_k, qs) + 16 * g;
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                s0[t] = _mm512_dpwssd_epi32(
                    s0[t], _mm512_maddubs_epi16(w0, sp512_bcast8(xq + (size_t)t * xs)), S);
                s1[t] = _mm512_dpwssd_epi32(
                    s1[t], _mm512_maddubs_epi16(w1, sp512_bcast8(xq + (size_t)t * xs + 8)), S);
            }
        }
        const __m256 dw = _mm256_load_ps((const float *)(const void *)(pb + K6_D));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint8_t *xt = xb + (size_t)t * xs;
            const uint8_t *bs = xt + offsetof(sp_block_q8_k, bsums);
            __m512i cr = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                cr = _mm512_dpwssd_epi32(cr, _mm512_load_si512((const void *)(pb + K6_CR + 64 * s)),
                                         sp512_bcast8(bs + 8 * s));
            }
            __m512i si = _mm512_sub_epi32(_mm512_add_epi32(s0[t], s1[t]), _mm512_slli_epi32(cr, 5));
            si = _mm512_add_epi32(si, _mm512_shuffle_epi32(si, 0xB1));
            /* dword 2r holds row r: VPMOVQD takes the low dword of each 64-bit lane */
            const __m256 f = _mm256_cvtepi32_ps(_mm512_cvtepi64_epi32(si));
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(sp512_ld_f32(xt)), dw);
            const __m256 blk = _mm256_mul_ps(d, f);
            a[t] = _mm256_add_ps(a[t], blk);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        _mm256_storeu_ps(acc + KP_ROWS * t, a[t]);
    }
}

typedef void (*kp_tile_fn)(int64_t nb, const uint8_t *pan, const uint8_t *x, size_t xs,
                           float *acc);
typedef void (*kp_decode_fn)(uint8_t *pan, int r, const void *x, int64_t nb);

#define KP_TILES(name, tile)                                                                   \
    static void name##_1(int64_t nb, const uint8_t *p, const uint8_t *x, size_t xs, float *a)  \
    {                                                                                          \
        tile(1, nb, p, x, xs, a);                                                              \
    }                                                                                          \
    static void name##_2(int64_t nb, const uint8_t *p, const uint8_t *x, size_t xs, float *a)  \
    {                                                                                          \
        tile(2, nb, p, x, xs, a);                                                              \
    }                                                                                          \
    static void name##_4(int64_t nb, const uint8_t *p, const uint8_t *x, size_t xs, float *a)  \
    {                                                                                          \
        tile(4, nb, p, x, xs, a);                                                              \
    }                                                                                          \
    static void name##_8(int64_t nb, const uint8_t *p, const uint8_t *x, size_t xs, float *a)  \
    {                                                                                          \
        tile(8, nb, p, x, xs, a);                                                              \
    }                                                                                          \
    static const kp_tile_fn name[4] = {name##_1, name##_2, name##_4, name##_8};

KP_TILES(q2k_tiles, q2k_tile)
KP_TILES(q6k_tiles, q6k_tile)

static void
q2k_decode(uint8_t *pan, int r, const void *x, int64_t nb)
{
    q2k_decode_row(pan, r, x, nb);
}

static void
q6k_decode(uint8_t *pan, int r, const void *x, int64_t nb)
{
    q6k_decode_row(pan, r, x, nb);
}

/*
 * Rows [r0, r1) x tokens [0, n_tok): token chunks of KP_TC; per chunk, each panel of 8 rows and
 * KP_KB super-blocks is decoded once and swept by the chunk's tokens (tiles of 8, then 4, 2, 1
 * for the tail), the running float sums in `acc` between panels.
 */
static void
kp_gemm(const kp_tile_fn tiles[4], kp_decode_fn decode, size_t wblk, int64_t n, const void *w,
        size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs, int64_t n_tok, float *y,
        int64_t ldy)
{
    _Alignas(64) uint8_t pan[KP_PAN];
    _Alignas(64) float acc[KP_TC * KP_ROWS];
    const int64_t nb = n / SP_QK_K;
    for (int64_t t0 = 0; t0 < n_tok; t0 += KP_TC) {
        const int64_t tn = n_tok - t0 < KP_TC ? n_tok - t0 : KP_TC;
        const uint8_t *xc = (const uint8_t *)x + (size_t)t0 * xs;
        for (int64_t g = r0; g < r1; g += KP_ROWS) {
            const int nr = r1 - g < KP_ROWS ? (int)(r1 - g) : KP_ROWS;
            memset(acc, 0, sizeof(float) * (size_t)(tn * KP_ROWS));
            for (int64_t b0 = 0; b0 < nb; b0 += KP_KB) {
                const int64_t kb = nb - b0 < KP_KB ? nb - b0 : KP_KB;
                for (int r = 0; r < KP_ROWS; r++) {
                    const uint8_t *wr = r < nr ? (const uint8_t *)w + (size_t)(g + r) * ws +
                                                     (size_t)b0 * wblk
                                               : NULL;
                    decode(pan, r, wr, kb);
                }
                const uint8_t *xk = xc + (size_t)b0 * sizeof(sp_block_q8_k);
                int64_t t = 0;
                for (int ti = 3; ti >= 0; ti--) {
                    const int T = 1 << ti;
                    for (; tn - t >= T; t += T) {
                        tiles[ti](kb, pan, xk + (size_t)t * xs, xs, acc + KP_ROWS * t);
                    }
                }
            }
            for (int64_t t = 0; t < tn; t++) {
                memcpy(y + (t0 + t) * ldy + g, acc + KP_ROWS * t, sizeof(float) * (size_t)nr);
            }
        }
    }
}

void
sp__q2k_gemm_avx512_vnni(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    if (n_tok < KP_MIN_TOK) {
        sp__q2k_gemm_avx2(n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        return;
    }
    kp_gemm(q2k_tiles, q2k_decode, sizeof(sp_block_q2_k), n, w, w_stride, r0, r1, x, x_stride,
            n_tok, y, ldy);
}

void
sp__q6k_gemm_panel_avx512_vnni(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                               const void *x, size_t x_stride, int64_t n_tok, float *y,
                               int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    if (n_tok < K6_MIN_TOK) {
        sp__q6k_gemm_avx512_vnni(n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        return;
    }
    kp_gemm(q6k_tiles, q6k_decode, sizeof(sp_block_q6_k), n, w, w_stride, r0, r1, x, x_stride,
            n_tok, y, ldy);
}

void
sp__kpanels_register_avx512(sp_cpu_kernels_t *k, bool has_vnni)
{
    if (has_vnni) { /* without VNNI the AVX2 8-token panels / the row tiles stay */
        k->gemm[SP_TYPE_Q2_K] = sp__q2k_gemm_avx512_vnni;
        k->gemm[SP_TYPE_Q6_K] = sp__q6k_gemm_panel_avx512_vnni;
    }
}
