/*
 * amx_kquants.c - AMX-INT8 gemm of Q4_K and Q5_K weights in the 8-row packed forms
 * (repack_impl.h) x Q8_K activations: the prefill kernels of the AMX level. Calls with few
 * tokens stay on the kernels the AVX-512 level uses (avx512_repack.c's Q4_K, avx2_kpack.c's
 * Q5_K), which read the same packed forms, so packing and decode are unchanged.
 *
 * Tiles: C (int32) = A (tokens x 64 signed activation bytes) . B (64 x 16 weight rows), the
 * tokens down C's rows and the 16 rows of a panel (two packed groups) across its columns, so
 * a C row is one token's 16 results (one ZMM) and an A tile is read straight from the Q8_K
 * blocks (stride = the token stride): no activation repack.
 *
 * Scales inside B: a sub-block sum needs its 6-bit scale s (0..63) before the 32-element
 * sub-blocks of a super-block are added, and q times s does not fit a byte. With
 * s = 2^b s_hi + s_lo (Q4_K: b = 4, q <= 15; Q5_K: b = 3, q <= 31) both q s_lo and q s_hi are
 * at most 225 / 217, unsigned bytes, so two B operands (TDPBSUD: signed A, unsigned B) give
 *   sumi = 2^b C_hi + C_lo = sum_j s_j sum_{k in j} q_k a_k
 * exactly, with K = 64 (two sub-blocks) per instruction and the C tiles accumulating over the
 * whole super-block: two tile stores per super-block instead of a store and an int32 multiply
 * per sub-block. |C_lo| <= 256 * 225 * 128, far inside int32. The mins term
 * summs = sum_j m_j (bsums[2j] + bsums[2j + 1]) is a third product, B = the min of the
 * element's sub-block: sum_k a_k m_j(k), the same integer because a Q8_K block's bsums are
 * the 16-element sums of its qs (every from_float writes them so).
 *
 * The B operands of a (panel, super-block) are built once (the quant bytes regrouped by
 * VPERMT2D into the tiles' 4-byte row groups, Q5_K's qh bit moved to bit 4, times s_lo / s_hi
 * by one VPMULLW each: a byte product below 256 never carries into the next byte) and serve
 * every token of the chunk. The float finish is kquants_impl.h's sequence lane-wise
 * (d = y.d * x.d, dm = y.d * x.dmin, a = d * sumi, c = dm * summs, blk = a - c,
 * sumf = sumf + blk, super-blocks in order): the scalar reference's bits, for any batch and
 * any kernel that ran it.
 *
 * The tile configuration (seven 16 x 64-byte tiles) is loaded once on entry and the tiles are
 * released before returning. No heap; about 40 KiB of stack.
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/repack_impl.h"

#define AK_ROWS 16 /* weight rows per panel (two packed groups), C's columns */
#define AK_TM 16   /* tokens per A / C tile */
#define AK_TC 256  /* tokens per chunk at most (the float accumulators' rows) */
/* activations a token chunk keeps in L2 while the panels sweep it */
#define AK_X_CHUNK_BYTES (512 * 1024)

/* Tile numbers (GCC's tile intrinsics paste their argument into the instruction text, so the
 * calls below spell them as literals): 0, 1, 2 = C_hi, C_lo, C_min; 3 = A; 4, 5, 6 = the B
 * operands of the same three. */
enum { AK_NTILES = 7 };

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ak_tilecfg_t;
_Static_assert(sizeof(ak_tilecfg_t) == 64, "LDTILECFG's 64-byte operand");

/* One (panel, super-block): the B operands of the four K = 64 steps (q * s_hi, q * s_lo and
 * the min m of the element's sub-block; 16 rows of 16 dwords, dword n = weight row n) and
 * the rows' F16 d / dmin as float. */
typedef struct {
    uint8_t b[4][3][16][64];
    float d[AK_ROWS], dmin[AK_ROWS];
} ak_panel_t;

/* VPERMT2D: dword n of a B row from the two groups' 64-byte octet loads. Row r's 8 bytes
 * are qword 4 ((r >> 1) & 1) + ((r & 1) | (r >> 2) << 1) of its group's load
 * (sp__repack_chunk_off); half e is its dword 2 qword + e. */
static const int32_t ak_perm[2][16] __attribute__((aligned(64))) = {
    {0, 2, 8, 10, 4, 6, 12, 14, 16, 18, 24, 26, 20, 22, 28, 30},
    {1, 3, 9, 11, 5, 7, 13, 15, 17, 19, 25, 27, 21, 23, 29, 31}};

/* VPSHUFB: each dword's low byte to both words (the VPMULLW factor) or to all four bytes */
#define Z 0x80
static const uint8_t ak_words[16] = {0, Z, 0, Z, 4, Z, 4, Z, 8, Z, 8, Z, 12, Z, 12, Z};
static const uint8_t ak_bytes[16] = {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12};
#undef Z

/* dword n = byte j of row n's 8 bytes at g0 (rows 0..7) / g1 (rows 8..15), given as the
 * group's 64 bytes m[r][j] (row major) */
static inline __m512i
ak_column(__m512i g0, __m512i g1, int j)
{
    const __m512i ff = _mm512_set1_epi64(0xff);
    const __m256i lo = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srli_epi64(g0, 8 * j), ff));
    const __m256i hi = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srli_epi64(g1, 8 * j), ff));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* q5: Q5_K (qh's bit j of byte l is bit 4 of element l of sub-block j; scales split 8 s_hi +
 * s_lo so that a 5-bit q times a 3-bit part stays a byte), else Q4_K (16 s_hi + s_lo). Always
 * inlined with a constant q5. */
static inline __attribute__((always_inline)) void
ak_prep(const uint8_t *p0, const uint8_t *p1, ak_panel_t *P, bool q5)
{
    const __m256i d16 = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + SP_REPACK_Q4K_D))),
        _mm_loadu_si128((const __m128i *)(p1 + SP_REPACK_Q4K_D)), 1);
    const __m256i m16 = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + SP_REPACK_Q4K_DMIN))),
        _mm_loadu_si128((const __m128i *)(p1 + SP_REPACK_Q4K_DMIN)), 1);
    _mm512_storeu_ps(P->d, _mm512_cvtph_ps(d16));
    _mm512_storeu_ps(P->dmin, _mm512_cvtph_ps(m16));

    const __m512i words = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ak_words));
    const __m512i bytes = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ak_bytes));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i ix0 = _mm512_load_si512((const void *)ak_perm[0]);
    const __m512i ix1 = _mm512_load_si512((const void *)ak_perm[1]);
    const __m512i mins0 = _mm512_loadu_si512((const void *)(p0 + SP_REPACK_Q4K_M));
    const __m512i mins1 = _mm512_loadu_si512((const void *)(p1 + SP_REPACK_Q4K_M));
    for (int c = 0; c < 4; c++) {
        /* B rows 0..7: sub-block 2c (low nibbles), rows 8..15: sub-block 2c + 1 (high) */
        __m512i sh[2], sl[2], mb[2];
        for (int u = 0; u < 2; u++) {
            const int j = 2 * c + u;
            /* sc[j][r]: row n's scale of sub-block j is byte 8 j + (n & 7) of its group */
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(
                _mm_loadl_epi64((const __m128i *)(p0 + SP_REPACK_Q4K_SC + 8 * j)),
                _mm_loadl_epi64((const __m128i *)(p1 + SP_REPACK_Q4K_SC + 8 * j))));
            const int bits = q5 ? 3 : 4;
            sh[u] = _mm512_shuffle_epi8(_mm512_srli_epi32(sc, bits), words);
            sl[u] = _mm512_shuffle_epi8(
                _mm512_and_si512(sc, _mm512_set1_epi32((1 << bits) - 1)), words);
            mb[u] = _mm512_shuffle_epi8(ak_column(mins0, mins1, j), bytes);
        }
        for (int k = 0; k < 8; k++) {
            _mm512_store_si512((void *)P->b[c][2][k], mb[0]);
            _mm512_store_si512((void *)P->b[c][2][8 + k], mb[1]);
        }
        for (int q = 0; q < 4; q++) {
            const size_t off = (q5 ? SP_REPACK_Q5K_QS : SP_REPACK_Q4K_QS) + 64 * (size_t)(4 * c + q);
            const __m512i raw0 = _mm512_loadu_si512((const void *)(p0 + off));
            const __m512i raw1 = _mm512_loadu_si512((const void *)(p1 + off));
            /* Q5_K: qh bytes 8q .. 8q + 7 of each row, in the same lanes as the quant octet */
            __m512i h0 = _mm512_setzero_si512(), h1 = h0;
            if (q5) {
                h0 = _mm512_loadu_si512((const void *)(p0 + SP_REPACK_Q5K_QH + 64 * q));
                h1 = _mm512_loadu_si512((const void *)(p1 + SP_REPACK_Q5K_QH + 64 * q));
            }
            for (int e = 0; e < 2; e++) {
                const __m512i v = _mm512_permutex2var_epi32(raw0, e ? ix1 : ix0, raw1);
                __m512i lo = _mm512_and_si512(v, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) { /* bit 2c (2c + 1) of each byte to bit 4: 16-bit shifts, the AND
                           * keeps the byte's own bit */
                    const __m512i h = _mm512_permutex2var_epi32(h0, e ? ix1 : ix0, h1);
                    const __m512i b1 = _mm512_set1_epi8(0x10);
                    lo = _mm512_or_si512(
                        lo, _mm512_and_si512(_mm512_slli_epi16(_mm512_srli_epi16(h, 2 * c), 4), b1));
                    hi = _mm512_or_si512(
                        hi, _mm512_and_si512(_mm512_slli_epi16(_mm512_srli_epi16(h, 2 * c + 1), 4), b1));
                }
                const int k = 2 * q + e;
                _mm512_store_si512((void *)P->b[c][0][k], _mm512_mullo_epi16(lo, sh[0]));
                _mm512_store_si512((void *)P->b[c][1][k], _mm512_mullo_epi16(lo, sl[0]));
                _mm512_store_si512((void *)P->b[c][0][8 + k], _mm512_mullo_epi16(hi, sh[1]));
                _mm512_store_si512((void *)P->b[c][1][8 + k], _mm512_mullo_epi16(hi, sl[1]));
            }
        }
    }
}

/* Every tile 16 rows of 64 bytes; loaded once a call (a short token tile reads a padded copy
 * instead of a shorter shape: LDTILECFG is far from free). */
static void
ak_config(ak_tilecfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int i = 0; i < AK_NTILES; i++) {
        cfg->colsb[i] = 64;
        cfg->rows[i] = 16;
    }
    _tile_loadconfig(cfg);
}

/* The float finish of one super-block for m tokens: acc[t] += d * sumi - dm * summs,
 * kquants_impl.h's order. xb: the first token's Q8_K block. */
static inline void
ak_finish(int m, int hshift, const int32_t (*cb)[AK_TM][AK_ROWS], const ak_panel_t *P, const uint8_t *xb,
          size_t xs, float (*acc)[AK_ROWS])
{
    const __m512 xd = _mm512_loadu_ps(P->d), xdm = _mm512_loadu_ps(P->dmin);
    for (int t = 0; t < m; t++) {
        const __m512i sumi = _mm512_add_epi32(
            _mm512_slli_epi32(_mm512_load_si512((const void *)cb[0][t]), hshift),
            _mm512_load_si512((const void *)cb[1][t]));
        const __m512i summs = _mm512_load_si512((const void *)cb[2][t]);
        float yd;
        memcpy(&yd, xb + (size_t)t * xs + offsetof(sp_block_q8_k, d), sizeof yd);
        const __m512 vyd = _mm512_set1_ps(yd);
        const __m512 d = _mm512_mul_ps(vyd, xd), dm = _mm512_mul_ps(vyd, xdm);
        const __m512 a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi));
        const __m512 c = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(summs));
        const __m512 blk = _mm512_sub_ps(a, c);
        _mm512_store_ps(acc[t], _mm512_add_ps(_mm512_load_ps(acc[t]), blk));
    }
}

/* Tokens [0, T) of a chunk (x: the first one) against the panel of groups p0, p1 (p1 = p0
 * when the panel has one group), all super-blocks; acc[t] = the 16 rows' results. pad: a
 * 16 x 256-byte buffer for a short last token tile. */
static inline __attribute__((always_inline)) void
ak_panel(int64_t nb, const uint8_t *p0, const uint8_t *p1, const uint8_t *x, size_t xs, int T,
         float (*acc)[AK_ROWS], int8_t (*pad)[SP_QK_K], bool q5)
{
    const size_t bb = q5 ? SP_REPACK_Q5K_BLOCK_BYTES : SP_REPACK_Q4K_BLOCK_BYTES;
    const int hshift = q5 ? 3 : 4;
    ak_panel_t P __attribute__((aligned(64)));
    /* ping-pong: the float finish of one token tile reads its stored C while the tile unit
     * computes the next one (the next store waits for it, the finish does not) */
    int32_t cbuf[2][3][AK_TM][AK_ROWS] __attribute__((aligned(64)));
    memset(acc, 0, sizeof(float) * AK_ROWS * (size_t)T);
    for (int64_t b = 0; b < nb; b++) {
        const size_t bo = (size_t)b * bb;
        ak_prep(p0 + bo, p1 + bo, &P, q5);
        const uint8_t *xb = x + (size_t)b * sizeof(sp_block_q8_k);
        const uint8_t *xq = xb + offsetof(sp_block_q8_k, qs);
        int prev = -1; /* the token tile whose C waits in cbuf[(prev / AK_TM) & 1] */
        for (int t = 0; t < T; t += AK_TM) {
            const int m = T - t < AK_TM ? T - t : AK_TM;
            const uint8_t *a = xq + (size_t)t * xs;
            long as = (long)xs;
            if (m < AK_TM) { /* rows past m stay whatever they were: their C rows are unread */
                for (int i = 0; i < m; i++) {
                    memcpy(pad[i], a + (size_t)i * xs, SP_QK_K);
                }
                a = (const uint8_t *)pad;
                as = SP_QK_K;
            }
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            for (int c = 0; c < 4; c++) {
                _tile_loadd(3, a + 64 * c, as);
                _tile_loadd(4, P.b[c][0], 64);
                _tile_dpbsud(0, 3, 4);
                _tile_loadd(5, P.b[c][1], 64);
                _tile_dpbsud(1, 3, 5);
                _tile_loadd(6, P.b[c][2], 64);
                _tile_dpbsud(2, 3, 6);
            }
            if (t + AK_TM < T) { /* the next token tile's activations, rows xs apart, to L1 */
                const uint8_t *nx = xq + (size_t)(t + AK_TM) * xs;
                const int nm = T - t - AK_TM < AK_TM ? T - t - AK_TM : AK_TM;
                for (int i = 0; i < nm; i++) {
                    for (int c = 0; c < 4; c++) {
                        _mm_prefetch((const char *)(nx + (size_t)i * xs + 64 * c), _MM_HINT_T0);
                    }
                }
            }
            if (prev >= 0) {
                ak_finish(AK_TM, hshift, cbuf[(prev / AK_TM) & 1], &P, xb + (size_t)prev * xs, xs,
                          acc + prev);
            }
            int32_t(*cb)[AK_TM][AK_ROWS] = cbuf[(t / AK_TM) & 1];
            _tile_stored(0, cb[0], 64);
            _tile_stored(1, cb[1], 64);
            _tile_stored(2, cb[2], 64);
            prev = t;
        }
        const int m = T - prev < AK_TM ? T - prev : AK_TM;
        ak_finish(m, hshift, cbuf[(prev / AK_TM) & 1], &P, xb + (size_t)prev * xs, xs, acc + prev);
    }
}

static inline __attribute__((always_inline)) void
ak_gemm(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
        int64_t n_tok, float *y, int64_t ldy, bool q5)
{
    const int64_t nb = n / SP_QK_K;
    int64_t tc = (int64_t)(AK_X_CHUNK_BYTES / xs);
    tc = tc < AK_TM ? AK_TM : tc > AK_TC ? AK_TC : tc - tc % AK_TM;
    float acc[AK_TC][AK_ROWS] __attribute__((aligned(64)));
    int8_t pad[AK_TM][SP_QK_K] __attribute__((aligned(64)));
    memset(pad, 0, sizeof pad);
    ak_tilecfg_t cfg __attribute__((aligned(64)));
    ak_config(&cfg);
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int T = (int)(n_tok - t0 < tc ? n_tok - t0 : tc);
        const uint8_t *xc = (const uint8_t *)x + (size_t)t0 * xs;
        for (int64_t g = g0; g < g1; g += 2) {
            const uint8_t *p0 = (const uint8_t *)w + (size_t)g * ws;
            /* a lone last group is paired with itself; its copy's rows are not stored */
            const uint8_t *p1 = g + 1 < g1 ? p0 + ws : p0;
            ak_panel(nb, p0, p1, xc, xs, T, acc, pad, q5);
            const int64_t row0 = g * SP_REPACK_ROWS;
            const int64_t lo = r0 > row0 ? r0 - row0 : 0;
            const int64_t hi = r1 - row0 < AK_ROWS ? r1 - row0 : AK_ROWS;
            const __mmask16 keep = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
            for (int t = 0; t < T; t++) {
                _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row0, keep,
                                      _mm512_load_ps(acc[t]));
            }
        }
    }
    _tile_release();
}

static void
amx_q4_k_gemm(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
              size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    if (n_tok < SP_AMX_Q4K_MIN_TOK) {
        sp__repack_q4_k_gemm_avx512(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
        return;
    }
    ak_gemm(n, w, ws, r0, r1, x, xs, n_tok, y, ldy, false);
}

static void
amx_q5_k_gemm(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x,
              size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    if (n_tok < SP_AMX_Q5K_MIN_TOK) {
        sp__kpack_q5_k_gemm_avx2(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);
        return;
    }
    ak_gemm(n, w, ws, r0, r1, x, xs, n_tok, y, ldy, true);
}

void
sp__amx_kquants_register(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_Q4_K] = amx_q4_k_gemm;
    k->repack_gemm[SP_TYPE_Q5_K] = amx_q5_k_gemm;
}
