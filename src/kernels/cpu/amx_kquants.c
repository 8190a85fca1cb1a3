/*
 * amx_kquants.c - AMX-INT8 gemm of Q4_K weights in the 8-row packed form (repack_impl.h) x
 * Q8_K activations: the prefill kernel of the AMX level. Few tokens stay on the AVX-512 VNNI
 * kernel (avx512_repack.c), which reads the same packed form, so decode is unchanged.
 *
 * Tiles: C (int32) = A (tokens x 64 signed activation bytes) . B (64 x 16 weight rows), the
 * tokens down C's rows and the 16 rows of a panel (two packed groups) across its columns, so
 * a C row is one token's 16 results (one ZMM) and an A tile is read straight from the Q8_K
 * blocks (stride = the token stride): no activation repack.
 *
 * Scales inside B: Q4_K's sub-block sum needs its 6-bit scale s (0..63) before the 32-element
 * sub-blocks of a super-block are added, and a nibble times s (up to 945) does not fit a
 * byte. With s = 16 s_hi + s_lo (s_lo 0..15, s_hi 0..3) the bytes q * s_lo <= 225 and
 * q * s_hi <= 45 are unsigned bytes, so two B operands (TDPBSUD: signed A, unsigned B) give
 *   sumi = 16 * C_hi + C_lo = sum_j s_j sum_{k in j} q_k a_k
 * exactly, with K = 64 (two sub-blocks) per instruction and the C tiles accumulating over the
 * whole super-block: two tile stores per super-block instead of a store and an int32 multiply
 * per sub-block. |C_lo| <= 256 * 225 * 128, far inside int32.
 *
 * The B operands of a (panel, super-block) are built once (the nibbles regrouped by VPERMT2D
 * into the tiles' 4-byte row groups, times s_lo / s_hi by one VPMULLW each: a nibble times a
 * 4-bit value never carries into the next byte) and serve every token of the chunk. The
 * mins term summs = sum_j m_j (bsums[2j] + bsums[2j + 1]) is VPDPWSSD as in avx512_repack.c,
 * and the float finish is kquants_impl.h's sequence lane-wise (d = y.d * x.d, dm = y.d *
 * x.dmin, a = d * sumi, c = dm * summs, blk = a - c, sumf = sumf + blk, super-blocks in
 * order): the scalar reference's bits, for any batch and any kernel that ran it.
 *
 * The tile configuration is loaded on entry (and for a short token tail) and the tiles are
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
#define AK_X_CHUNK_BYTES (1024 * 1024)

/* Tile numbers (GCC's tile intrinsics paste their argument into the instruction text, so the
 * calls below spell them as literals): C_hi / C_lo of token tiles 0 and 1, A of each, B hi / lo. */
enum { AK_CH0 = 0, AK_CL0 = 1, AK_CH1 = 2, AK_CL1 = 3, AK_A0 = 4, AK_A1 = 5, AK_BH = 6, AK_BL = 7 };

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ak_tilecfg_t;
_Static_assert(sizeof(ak_tilecfg_t) == 64, "LDTILECFG's 64-byte operand");

/* One (panel, super-block): the B operands of the four K = 64 steps (hi part, lo part; 16
 * rows of 16 dwords, dword n = weight row n), the mins as (m, m) int16 pairs per sub-block,
 * and the rows' F16 d / dmin as float. */
typedef struct {
    uint8_t b[4][2][16][64];
    int32_t m[8][AK_ROWS];
    float d[AK_ROWS], dmin[AK_ROWS];
} ak_panel_t;

/* VPERMT2D: dword n of a B row from the two groups' 64-byte octet loads. Row r's 8 bytes
 * are qword 4 ((r >> 1) & 1) + ((r & 1) | (r >> 2) << 1) of its group's load
 * (sp__repack_chunk_off); half e is its dword 2 qword + e. */
static const int32_t ak_perm[2][16] __attribute__((aligned(64))) = {
    {0, 2, 8, 10, 4, 6, 12, 14, 16, 18, 24, 26, 20, 22, 28, 30},
    {1, 3, 9, 11, 5, 7, 13, 15, 17, 19, 25, 27, 21, 23, 29, 31}};

static void
ak_prep(const uint8_t *p0, const uint8_t *p1, ak_panel_t *P)
{
    int32_t slo[8][AK_ROWS] __attribute__((aligned(64)));
    int32_t shi[8][AK_ROWS] __attribute__((aligned(64)));
    for (int n = 0; n < AK_ROWS; n++) {
        const uint8_t *pb = n < 8 ? p0 : p1;
        const int r = n & 7;
        for (int j = 0; j < 8; j++) {
            const int32_t s = pb[SP_REPACK_Q4K_SC + 8 * j + r];
            slo[j][n] = (s & 15) * 0x10001;
            shi[j][n] = (s >> 4) * 0x10001;
            P->m[j][n] = pb[SP_REPACK_Q4K_M + 8 * r + j] * 0x10001;
        }
    }
    const __m256i d16 = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + SP_REPACK_Q4K_D))),
        _mm_loadu_si128((const __m128i *)(p1 + SP_REPACK_Q4K_D)), 1);
    const __m256i m16 = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + SP_REPACK_Q4K_DMIN))),
        _mm_loadu_si128((const __m128i *)(p1 + SP_REPACK_Q4K_DMIN)), 1);
    _mm512_storeu_ps(P->d, _mm512_cvtph_ps(d16));
    _mm512_storeu_ps(P->dmin, _mm512_cvtph_ps(m16));

    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i ix0 = _mm512_load_si512((const void *)ak_perm[0]);
    const __m512i ix1 = _mm512_load_si512((const void *)ak_perm[1]);
    for (int c = 0; c < 4; c++) {
        /* B rows 0..7: sub-block 2c (low nibbles), rows 8..15: sub-block 2c + 1 (high) */
        const __m512i sl0 = _mm512_load_si512((const void *)slo[2 * c]);
        const __m512i sh0 = _mm512_load_si512((const void *)shi[2 * c]);
        const __m512i sl1 = _mm512_load_si512((const void *)slo[2 * c + 1]);
        const __m512i sh1 = _mm512_load_si512((const void *)shi[2 * c + 1]);
        for (int q = 0; q < 4; q++) {
            const size_t off = SP_REPACK_Q4K_QS + 64 * (size_t)(4 * c + q);
            const __m512i raw0 = _mm512_loadu_si512((const void *)(p0 + off));
            const __m512i raw1 = _mm512_loadu_si512((const void *)(p1 + off));
            for (int e = 0; e < 2; e++) {
                const __m512i v = _mm512_permutex2var_epi32(raw0, e ? ix1 : ix0, raw1);
                const __m512i lo = _mm512_and_si512(v, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                const int k = 2 * q + e;
                _mm512_store_si512((void *)P->b[c][0][k], _mm512_mullo_epi16(lo, sh0));
                _mm512_store_si512((void *)P->b[c][1][k], _mm512_mullo_epi16(lo, sl0));
                _mm512_store_si512((void *)P->b[c][0][8 + k], _mm512_mullo_epi16(hi, sh1));
                _mm512_store_si512((void *)P->b[c][1][8 + k], _mm512_mullo_epi16(hi, sl1));
            }
        }
    }
}

static void
ak_config(ak_tilecfg_t *cfg, int m0, int m1)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg->colsb[i] = 64;
    }
    cfg->rows[AK_CH0] = cfg->rows[AK_CL0] = cfg->rows[AK_A0] = (uint8_t)m0;
    /* an unused tile keeps one row: a configured shape, never touched */
    const uint8_t r1 = (uint8_t)(m1 > 0 ? m1 : 1);
    cfg->rows[AK_CH1] = cfg->rows[AK_CL1] = cfg->rows[AK_A1] = r1;
    cfg->rows[AK_BH] = cfg->rows[AK_BL] = 16;
    _tile_loadconfig(cfg);
}

/* The float finish of one super-block for m tokens whose C rows are at ch / cl: acc[t] +=
 * d * sumi - dm * summs, kquants_impl.h's order. xb: the first token's Q8_K block. */
static inline void
ak_finish(int m, const int32_t (*ch)[AK_ROWS], const int32_t (*cl)[AK_ROWS],
          const ak_panel_t *P, const uint8_t *xb, size_t xs, float (*acc)[AK_ROWS])
{
    const __m512 xd = _mm512_loadu_ps(P->d), xdm = _mm512_loadu_ps(P->dmin);
    __m512i M[8];
    for (int j = 0; j < 8; j++) {
        M[j] = _mm512_loadu_si512((const void *)P->m[j]);
    }
    for (int t = 0; t < m; t++) {
        const uint8_t *xt = xb + (size_t)t * xs;
        const __m512i sumi = _mm512_add_epi32(
            _mm512_slli_epi32(_mm512_load_si512((const void *)ch[t]), 4),
            _mm512_load_si512((const void *)cl[t]));
        const uint8_t *bs = xt + offsetof(sp_block_q8_k, bsums);
        __m512i mm = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            int32_t pair;
            memcpy(&pair, bs + 4 * j, sizeof pair);
            mm = _mm512_dpwssd_epi32(mm, M[j], _mm512_set1_epi32(pair));
        }
        float yd;
        memcpy(&yd, xt + offsetof(sp_block_q8_k, d), sizeof yd);
        const __m512 vyd = _mm512_set1_ps(yd);
        const __m512 d = _mm512_mul_ps(vyd, xd), dm = _mm512_mul_ps(vyd, xdm);
        const __m512 a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi));
        const __m512 c = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(mm));
        const __m512 blk = _mm512_sub_ps(a, c);
        _mm512_store_ps(acc[t], _mm512_add_ps(_mm512_load_ps(acc[t]), blk));
    }
}

/* Tokens [0, T) of a chunk (x: the first one) against the panel of groups p0, p1 (p1 = p0
 * when the panel has one group), all super-blocks; acc[t] = the 16 rows' results. */
static void
ak_panel(int64_t nb, const uint8_t *p0, const uint8_t *p1, const uint8_t *x,
         size_t xs, int T, float (*acc)[AK_ROWS], ak_tilecfg_t *cfg, int *cfg_rows)
{
    ak_panel_t P __attribute__((aligned(64)));
    int32_t cbuf[4][AK_TM][AK_ROWS] __attribute__((aligned(64)));
    memset(acc, 0, sizeof(float) * AK_ROWS * (size_t)T);
    for (int64_t b = 0; b < nb; b++) {
        const size_t bo = (size_t)b * SP_REPACK_Q4K_BLOCK_BYTES;
        ak_prep(p0 + bo, p1 + bo, &P);
        const uint8_t *xb = x + (size_t)b * sizeof(sp_block_q8_k);
        const uint8_t *xq = xb + offsetof(sp_block_q8_k, qs);
        for (int t = 0; t < T; t += 2 * AK_TM) {
            const int m0 = T - t < AK_TM ? T - t : AK_TM;
            const int rest = T - t - m0;
            const int m1 = rest < AK_TM ? rest : AK_TM;
            const int want = m0 << 8 | m1;
            if (*cfg_rows != want) { /* only a chunk's last pair of tiles is short */
                ak_config(cfg, m0, m1);
                *cfg_rows = want;
            }
            const uint8_t *a0 = xq + (size_t)t * xs, *a1 = a0 + (size_t)AK_TM * xs;
            _tile_zero(0);
            _tile_zero(1);
            if (m1 > 0) {
                _tile_zero(2);
                _tile_zero(3);
                for (int c = 0; c < 4; c++) {
                    _tile_loadd(6, P.b[c][0], 64);
                    _tile_loadd(7, P.b[c][1], 64);
                    _tile_loadd(4, a0 + 64 * c, (long)xs);
                    _tile_loadd(5, a1 + 64 * c, (long)xs);
                    _tile_dpbsud(0, 4, 6);
                    _tile_dpbsud(1, 4, 7);
                    _tile_dpbsud(2, 5, 6);
                    _tile_dpbsud(3, 5, 7);
                }
                _tile_stored(2, cbuf[2], 64);
                _tile_stored(3, cbuf[3], 64);
            } else {
                for (int c = 0; c < 4; c++) {
                    _tile_loadd(6, P.b[c][0], 64);
                    _tile_loadd(7, P.b[c][1], 64);
                    _tile_loadd(4, a0 + 64 * c, (long)xs);
                    _tile_dpbsud(0, 4, 6);
                    _tile_dpbsud(1, 4, 7);
                }
            }
            _tile_stored(0, cbuf[0], 64);
            _tile_stored(1, cbuf[1], 64);
            ak_finish(m0, cbuf[0], cbuf[1], &P, xb + (size_t)t * xs, xs, acc + t);
            if (m1 > 0) {
                ak_finish(m1, cbuf[2], cbuf[3], &P, xb + (size_t)(t + AK_TM) * xs, xs,
                          acc + t + AK_TM);
            }
        }
    }
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
    const int64_t nb = n / SP_QK_K;
    int64_t tc = (int64_t)(AK_X_CHUNK_BYTES / xs);
    tc = tc < 2 * AK_TM ? 2 * AK_TM : tc > AK_TC ? AK_TC : tc - tc % (2 * AK_TM);
    float acc[AK_TC][AK_ROWS] __attribute__((aligned(64)));
    ak_tilecfg_t cfg __attribute__((aligned(64)));
    int cfg_rows = -1;
    const int64_t g0 = r0 / SP_REPACK_ROWS, g1 = (r1 + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int T = (int)(n_tok - t0 < tc ? n_tok - t0 : tc);
        const uint8_t *xc = (const uint8_t *)x + (size_t)t0 * xs;
        for (int64_t g = g0; g < g1; g += 2) {
            const uint8_t *p0 = (const uint8_t *)w + (size_t)g * ws;
            /* a lone last group is paired with itself; its copy's rows are not stored */
            const uint8_t *p1 = g + 1 < g1 ? p0 + ws : p0;
            ak_panel(nb, p0, p1, xc, xs, T, acc, &cfg, &cfg_rows);
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

void
sp__amx_kquants_register(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_Q4_K] = amx_q4_k_gemm;
}
