/*
 * avx2_kquants2.c - AVX2 (+FMA, F16C) kernels for Q2_K / Q3_K / Q5_K / IQ4_XS weights x Q8_K
 * activations. Built with -mavx2 -mfma -mf16c; dispatch.c only registers them on CPUs that have
 * them. Pure functions, callable from any thread; a few hundred bytes of stack.
 *
 * One microkernel per weight type does 1 weight row x NT tokens (NT <= 4). Each super-block is
 * unpacked a chunk at a time (32 to 128 elements) right before its dot products, so the NT = 4
 * tile keeps its quants, scales and four accumulators in the 16 YMM registers. Each 32-element
 * quant vector against each token is maddubs (products fit int16: at most 127 * 127 * 2 with
 * IQ4_XS's |w| x sign-adjusted q8) and madd by the scale of its groups, exact in int32. The
 * types whose scale covers 32 elements (Q5_K, IQ4_XS) keep each sub-block's scale as an int32
 * (the int16 scale in both halves) on the stack and broadcast it from memory, which costs a load
 * instead of a shuffle; IQ4_XS reads each 16-byte sub-block into both 128-bit lanes and shifts
 * the high lane by a nibble (VPSRLVD), so its quants come out in element order with no lane
 * permute. vec_dot is the NT = 1 instance and the gemm tiles use NT = 4, so every (row, token)
 * pair takes the same instructions; the float finish is kquants2_impl.h's fixed sequence (in
 * SSE lanes, each lane one IEEE operation of the scalar sequence), which makes the result
 * bit-identical to the scalar reference.
 *
 * The gemm entries (prefill, batched decode) use 8-token panels of the same integer work
 * (q2k_panel8 ... iq4xs_panel8, DEFINE_PANEL_GEMM): token chunks that stay in L2, the float
 * finish of 4 tokens per SSE register, and for Q2_K the quants premultiplied by their scales;
 * the row tiles above do vec_dot, calls under 8 tokens and the tails (docs/design.md). The
 * previous row-tile gemms stay exported as sp__*_gemm_avx2_prev for the A/B bench.
 */
#include <immintrin.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants2_impl.h"
#include "kernels/cpu/kquants_impl.h"

#define KQ2_INLINE static inline __attribute__((always_inline))
#define TILE_TOK 4
/* IQ4_XS's decode (four vector ops per 32 quants) is shared by more tokens: its tile has eight
 * accumulators, which with the table, masks, quants and scale still fit the 16 YMM registers */
#define IQ4_TILE_TOK 8

/* vpshufb masks: int16 word 2g of each 128-bit lane over the low lane, word 2g+1 over the high
 * lane (the scales of the two 16-element groups of one 32-byte quant vector). */
#define W(j) 2 * (j), 2 * (j) + 1
#define W8(j) W(j), W(j), W(j), W(j), W(j), W(j), W(j), W(j)
static const uint8_t word_pair[4][32] __attribute__((aligned(32))) = {
    {W8(0), W8(1)}, {W8(2), W8(3)}, {W8(4), W8(5)}, {W8(6), W8(7)},
};
#undef W8
#undef W

KQ2_INLINE __m256i
pair_scale(__m256i sch, int j)
{
    return _mm256_shuffle_epi8(sch, _mm256_load_si256((const __m256i *)word_pair[j]));
}

KQ2_INLINE __m256i
load_y(const sp_block_q8_k *yb, int off)
{
    return _mm256_loadu_si256((const __m256i *)(yb->qs + off));
}

/* int32 lanes of sc * (q . y) for one 32-element quant vector; q unsigned (0..63). */
KQ2_INLINE __m256i
dot_u(__m256i q, __m256i y, __m256i sc)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), sc);
}

/* The same for signed q: |q| x (y with q's sign), exact since |y| <= 127. */
KQ2_INLINE __m256i
dot_s(__m256i aq, __m256i q, __m256i y, __m256i sc)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(y, q)), sc);
}

/* 8 uint8 sub-block scales -> 8 int32, each the int16 scale in both halves (what madd needs
 * broadcast over a 32-element vector), stored for broadcast loads. */
KQ2_INLINE void
store_scale_pairs(__m256i s32, int32_t out[8])
{
    const __m256i lo = _mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF));
    _mm256_store_si256((__m256i *)out, _mm256_or_si256(lo, _mm256_slli_epi32(s32, 16)));
    /* the compiler must read them back from memory: otherwise it turns each broadcast into an
     * extract and a register broadcast, two shuffles instead of one load */
    __asm__("" : "+m"(*(int32_t(*)[8])out));
}

KQ2_INLINE __m256i
bcast_scale(const int32_t *p)
{
    return _mm256_set1_epi32(*p);
}

/* kquants2_impl.h's finish of a scale-and-min block in SSE lanes: a4 holds int32 partial sums
 * of sumi, mm of summs (exact), xdd = (fp16 x.d, fp16 x.dmin) as floats; lane-wise IEEE
 * operations, so exactly d = y.d * x.d, dm = y.d * x.dmin, a = d * sumi, c = dm * summs, a - c. */
KQ2_INLINE float
finish_min(__m128i a4, __m128i mm, __m128 xdd, float yd)
{
    const __m128i ii = _mm_hadd_epi32(_mm_hadd_epi32(a4, mm), _mm_setzero_si128());
    const __m128 ac = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(yd), xdd), _mm_cvtepi32_ps(ii));
    return _mm_cvtss_f32(_mm_sub_ss(ac, _mm_movehdup_ps(ac)));
}

KQ2_INLINE __m128
load_d_dmin(const sp_fp16_t *d)
{
    uint32_t dd;
    memcpy(&dd, d, sizeof(dd)); /* d and dmin are adjacent fp16 */
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
}

KQ2_INLINE __m128i
fold_i32x8(__m256i v)
{
    return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

KQ2_INLINE int32_t
hsum_i32x8(__m256i v)
{
    __m128i s = fold_i32x8(v);
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* kquants2_impl.h's finish of a scale-only block. */
KQ2_INLINE float
finish_scale(float yd, sp_fp16_t xd, int32_t sumi)
{
    const float d = yd * _cvtsh_ss(xd);
    return d * (float)sumi;
}

/* ---- Q2_K: 2-bit quants, 4-bit scale and min per 16 elements ------------------------------ */

KQ2_INLINE void
q2k_tile(int64_t nb, const sp_block_q2_k *x, const sp_block_q8_k *const *y, int nt, float *out)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
        __m256i acc[TILE_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            /* element 128h + 32j + l is bits 2j of byte 32h + l; groups 8h + 2j, 8h + 2j + 1 */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                  : _mm256_permute2x128_si256(sc16, sc16, 0x00);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256i q = _mm256_and_si256(j ? _mm256_srli_epi16(v, 2 * j) : v, m3);
                const __m256i s = pair_scale(sch, j);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++)
                    acc[t] = _mm256_add_epi32(acc[t],
                                              dot_u(q, load_y(&y[t][b], 128 * h + 32 * j), s));
            }
        }
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
        const __m128 xdd = load_d_dmin(&x[b].d);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            /* summs = sum_g m[g] * bsums[g] (exact: 15 * 16 * 16 * 127) */
            const __m256i bs = _mm256_loadu_si256((const __m256i *)y[t][b].bsums);
            const __m256i mm = _mm256_madd_epi16(mn16, bs);
            const float blk = finish_min(fold_i32x8(acc[t]), fold_i32x8(mm), xdd, y[t][b].d);
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

/* ---- gemm token tiles: the float finish of 4 tokens in the 4 lanes of an SSE register ------ */

/* Lane t of the result = the sum of the 8 int32 lanes of a[t] (exact). */
KQ2_INLINE __m128i
hsum4_i32x8(__m256i a0, __m256i a1, __m256i a2, __m256i a3)
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return fold_i32x8(h);
}

/* The Q8_K scales of 4 tokens' super-block b, lane t = token t. */
KQ2_INLINE __m128
yd4(const sp_block_q8_k *const *y, int64_t b)
{
    return _mm_setr_ps(y[0][b].d, y[1][b].d, y[2][b].d, y[3][b].d);
}

/* Tokens of one gemm tile (the panel kernels below), and the activation bytes a token chunk
 * may take so that it stays in L2 while every row of a work item sweeps it. */
#define PANEL_TOK 8
#define PANEL_X_CHUNK_BYTES (192 * 1024)

/* ---- Q2_K panel gemm ---------------------------------------------------------------------- */

/*
 * One Q2_K row x 8 tokens. A super-block's quants are unpacked once for the 8 tokens and
 * multiplied by their 4-bit scale right away: q * sc <= 3 * 15 = 45 fits a byte, and one
 * VPMULLW does it, the scale being the same for both bytes of a word (elements 2i, 2i+1 of one
 * 16-element group) and neither byte product carrying into the other. Per token, two such
 * 32-element vectors meet the activations in VPMADDUBSW (pair sums <= 2 * 45 * 127 = 11430),
 * add in int16 (<= 22860 < 2^15) and widen with one VPMADDWD by 1: three multiplies per 64
 * products where the row kernel spends four. The integer sums are the reference's (exact), and
 * the float finish is kquants2_impl.h's sequence with four tokens in the four lanes of an SSE
 * register (d = y.d * x.d, dm = y.d * x.dmin, a = d * sumi, c = dm * summs, blk = a - c,
 * sumf = sumf + blk, each lane one IEEE operation): the reference's bits, whatever the batch.
 */
KQ2_INLINE void
q2k_panel8(int64_t nb, const sp_block_q2_k *x, const sp_block_q8_k *const *y, float *out)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i ones = _mm256_set1_epi16(1);
    __m128 sumf[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
        __m256i acc[PANEL_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < PANEL_TOK; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                  : _mm256_permute2x128_si256(sc16, sc16, 0x00);
#pragma GCC unroll 2
            for (int j = 0; j < 4; j += 2) {
                const __m256i q0 = _mm256_mullo_epi16(
                    _mm256_and_si256(j ? _mm256_srli_epi16(v, 2 * j) : v, m3), pair_scale(sch, j));
                const __m256i q1 = _mm256_mullo_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(v, 2 * j + 2), m3), pair_scale(sch, j + 1));
#pragma GCC unroll 8
                for (int t = 0; t < PANEL_TOK; t++) {
                    const __m256i p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(q0, load_y(&y[t][b], 128 * h + 32 * j)),
                        _mm256_maddubs_epi16(q1, load_y(&y[t][b], 128 * h + 32 * j + 32)));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, ones));
                }
            }
        }
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
        const __m128 xdd = load_d_dmin(&x[b].d);
        const __m128 xd = _mm_shuffle_ps(xdd, xdd, 0x00), xm = _mm_shuffle_ps(xdd, xdd, 0x55);
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++) {
            const sp_block_q8_k *const *yg = y + 4 * g;
            __m256i mm[4];
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) /* summs = sum_g m[g] * bsums[g] */
                mm[t] = _mm256_madd_epi16(
                    mn16, _mm256_loadu_si256((const __m256i *)yg[t][b].bsums));
            const __m128i sumi = hsum4_i32x8(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2],
                                             acc[4 * g + 3]);
            const __m128i summs = hsum4_i32x8(mm[0], mm[1], mm[2], mm[3]);
            const __m128 ydv = yd4(yg, b);
            const __m128 d = _mm_mul_ps(ydv, xd), dm = _mm_mul_ps(ydv, xm);
            const __m128 a = _mm_mul_ps(d, _mm_cvtepi32_ps(sumi));
            const __m128 c = _mm_mul_ps(dm, _mm_cvtepi32_ps(summs));
            sumf[g] = _mm_add_ps(sumf[g], _mm_sub_ps(a, c));
        }
    }
    _mm_storeu_ps(out, sumf[0]);
    _mm_storeu_ps(out + 4, sumf[1]);
}

/* ---- Q3_K: 2-bit quants + a high bit, 6-bit signed scale per 16 elements ----------------- */

/* The 16 six-bit scales (sp__q3k_unpack_scales' arithmetic) built in general-purpose registers
 * and moved into a vector: going through a byte array on the stack made the vector load wait
 * for four narrower stores (a failed store-to-load forward), the largest cost of vec_dot. */
KQ2_INLINE __m128i
q3k_scales(const uint8_t packed[SP_K_SCALE_SIZE])
{
    uint32_t a[3];
    memcpy(a, packed, sizeof(a));
    const uint32_t o0 = (a[0] & 0x0f0f0f0fu) | ((a[2] & 0x03030303u) << 4);
    const uint32_t o1 = (a[1] & 0x0f0f0f0fu) | (((a[2] >> 2) & 0x03030303u) << 4);
    const uint32_t o2 = ((a[0] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 4) & 0x03030303u) << 4);
    const uint32_t o3 = ((a[1] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 6) & 0x03030303u) << 4);
    return _mm_setr_epi32((int)o0, (int)o1, (int)o2, (int)o3);
}

/* Sub-block 4h + j of a Q3_K super-block's half h as quant + 4 (0..7): 2 bits of v (qs[32h..])
 * shifted by 2j, bit k = 4h + j of hmask moved to bit 2. */
KQ2_INLINE __m256i
q3k_quant(__m256i v, __m256i hm, int h, int j)
{
    const int k = 4 * h + j;
    const __m256i hb = k <= 2 ? _mm256_slli_epi16(hm, 2 - k) : _mm256_srli_epi16(hm, k - 2);
    return _mm256_or_si256(_mm256_and_si256(j ? _mm256_srli_epi16(v, 2 * j) : v, _mm256_set1_epi8(3)),
                           _mm256_and_si256(hb, _mm256_set1_epi8(4)));
}

KQ2_INLINE void
q3k_tile(int64_t nb, const sp_block_q3_k *x, const sp_block_q8_k *const *y, int nt, float *out)
{
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3k_scales(x[b].scales)),
                                              _mm256_set1_epi16(32));
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[b].hmask);
        __m256i acc[TILE_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                  : _mm256_permute2x128_si256(sc16, sc16, 0x00);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256i q = q3k_quant(v, hm, h, j);
                const __m256i s = pair_scale(sch, j);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++)
                    acc[t] = _mm256_add_epi32(acc[t],
                                              dot_u(q, load_y(&y[t][b], 128 * h + 32 * j), s));
            }
        }
        const float xd = _cvtsh_ss(x[b].d);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            /* the +4 offset: subtract 4 * sum_g sc[g] * bsums[g] (exact: 32 * 16 * 127 * 16) */
            const __m256i corr = _mm256_madd_epi16(
                sc16, _mm256_loadu_si256((const __m256i *)y[t][b].bsums));
            const int32_t sumi = hsum_i32x8(_mm256_sub_epi32(acc[t], _mm256_slli_epi32(corr, 2)));
            const float d = y[t][b].d * xd;
            const float blk = d * (float)sumi;
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

/* ---- Q5_K: 4-bit quants + a high bit, 6-bit scale and min per 32 elements ---------------- */

/* Sub-blocks 2h and 2h+1 of a Q5_K super-block (64 elements) as bytes 0..31: the low and high
 * nibbles of qs[32h..32h+31], bit 4 from qh bit j. */
KQ2_INLINE void
q5k_quants(const uint8_t *qs, __m256i qh, int h, __m256i *q0, __m256i *q1)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
    const int j0 = 2 * h, j1 = 2 * h + 1;
    const __m256i h0 = j0 <= 4 ? _mm256_slli_epi16(qh, 4 - j0) : _mm256_srli_epi16(qh, j0 - 4);
    const __m256i h1 = j1 <= 4 ? _mm256_slli_epi16(qh, 4 - j1) : _mm256_srli_epi16(qh, j1 - 4);
    *q0 = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(h0, b4));
    *q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(h1, b4));
}

KQ2_INLINE void
q5k_tile(int64_t nb, const sp_block_q5_k *x, const sp_block_q8_k *const *y, int nt, float *out)
{
    float sumf[TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        uint64_t sc64, m64;
        sp__q4k_unpack_scales_u64(x[b].scales, &sc64, &m64);
        int32_t sc2[8] __attribute__((aligned(32)));
        store_scale_pairs(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc64)), sc2);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[b].qh);
        __m256i acc[TILE_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const int j0 = 2 * h, j1 = 2 * h + 1;
            __m256i q0, q1;
            q5k_quants(x[b].qs, qh, h, &q0, &q1);
            const __m256i s0 = bcast_scale(&sc2[j0]), s1 = bcast_scale(&sc2[j1]);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                acc[t] = _mm256_add_epi32(
                    acc[t], _mm256_add_epi32(dot_u(q0, load_y(&y[t][b], 64 * h), s0),
                                             dot_u(q1, load_y(&y[t][b], 64 * h + 32), s1)));
        }
        /* summs = sum_j m[j] * (bsums[2j] + bsums[2j+1]) (pair sums fit int16: 32 * 127) */
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m64));
        const __m128 xdd = load_d_dmin(&x[b].d);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const sp_block_q8_k *yb = &y[t][b];
            const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)yb->bsums),
                                                 _mm_loadu_si128((const __m128i *)(yb->bsums + 8)));
            const float blk = finish_min(fold_i32x8(acc[t]), _mm_madd_epi16(mins, pairs), xdd,
                                         yb->d);
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

/* ---- IQ4_XS: 4-bit indices into a signed 16-level grid, 6-bit scale per 32 elements ------ */

/* The eight 6-bit scales of an IQ4_XS super-block as int16 (scale - 32) in both halves of int32
 * lane ib of sc2. Scale ib (stored + 32) is nibble ib of scales_l | bits 2ib..2ib+1 of scales_h
 * << 4, spread to byte ib of a uint64 in GPRs (scalar ALUs, while the vector pipes do the dot
 * products). */
KQ2_INLINE void
iq4xs_scale_pairs(const sp_block_iq4_xs *xb, int32_t sc2[8])
{
    uint32_t l4;
    memcpy(&l4, xb->scales_l, sizeof(l4));
    uint64_t lo = l4, hi = xb->scales_h;
    lo = (lo | lo << 16) & 0x0000FFFF0000FFFFull;
    lo = (lo | lo << 8) & 0x00FF00FF00FF00FFull;
    lo = (lo | lo << 4) & 0x0F0F0F0F0F0F0F0Full;
    hi = (hi | hi << 24) & 0x000000FF000000FFull;
    hi = (hi | hi << 12) & 0x000F000F000F000Full;
    hi = (hi | hi << 6) & 0x0303030303030303ull;
    const __m256i u = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)(lo | hi << 4)));
    _mm256_store_si256((__m256i *)sc2, _mm256_sub_epi16(_mm256_or_si256(u, _mm256_slli_epi32(u, 16)),
                                                        _mm256_set1_epi16(32)));
}

KQ2_INLINE void
iq4xs_tile(int64_t nb, const sp_block_iq4_xs *x, const sp_block_q8_k *const *y, int nt,
           float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    /* dword shifts: low lane keeps the low nibbles (elements 0-15 of a sub-block), the high
     * lane gets the high nibbles (elements 16-31); bits shifted in from the next byte are
     * masked off with m4 */
    const __m256i nib_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)sp_iq4nl_values));
    float sumf[IQ4_TILE_TOK] = {0};
    for (int64_t b = 0; b < nb; b++) {
        int32_t sc2[8] __attribute__((aligned(32)));
        iq4xs_scale_pairs(&x[b], sc2);
        __asm__("" : "+m"(sc2));
        __m256i acc[IQ4_TILE_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i v =
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(x[b].qs + 16 * k)));
            const __m256i q =
                _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srlv_epi32(v, nib_shift), m4));
            const __m256i aq = _mm256_abs_epi8(q);
            const __m256i s = bcast_scale(&sc2[k]);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                acc[t] = _mm256_add_epi32(acc[t], dot_s(aq, q, load_y(&y[t][b], 32 * k), s));
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const float blk = finish_scale(y[t][b].d, x[b].d, hsum_i32x8(acc[t]));
            sumf[t] = sumf[t] + blk;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = sumf[t];
}

/*
 * Q3_K panel: q3k_tile at 8 tokens (each super-block's quants and scales unpacked once for all
 * of them), the +4 correction and the float finish of 4 tokens at a time in SSE lanes (lane t:
 * d = y.d * x.d, blk = d * sumi, sumf = sumf + blk): the reference's bits.
 */
KQ2_INLINE void
q3k_panel8(int64_t nb, const sp_block_q3_k *x, const sp_block_q8_k *const *y, float *out)
{
    __m128 sumf[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3k_scales(x[b].scales)),
                                              _mm256_set1_epi16(32));
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[b].hmask);
        __m256i acc[PANEL_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < PANEL_TOK; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            const __m256i sch = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                  : _mm256_permute2x128_si256(sc16, sc16, 0x00);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256i q = q3k_quant(v, hm, h, j);
                const __m256i sc = pair_scale(sch, j);
#pragma GCC unroll 8
                for (int t = 0; t < PANEL_TOK; t++)
                    acc[t] = _mm256_add_epi32(acc[t],
                                              dot_u(q, load_y(&y[t][b], 128 * h + 32 * j), sc));
            }
        }
        const __m128 xd = _mm_set1_ps(_cvtsh_ss(x[b].d));
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++) {
            const sp_block_q8_k *const *yg = y + 4 * g;
            __m256i v[4];
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) /* minus 4 * sum_g sc[g] * bsums[g] (the +4 offset) */
                v[t] = _mm256_sub_epi32(
                    acc[4 * g + t],
                    _mm256_slli_epi32(
                        _mm256_madd_epi16(sc16,
                                          _mm256_loadu_si256((const __m256i *)yg[t][b].bsums)),
                        2));
            const __m128i sumi = hsum4_i32x8(v[0], v[1], v[2], v[3]);
            const __m128 d = _mm_mul_ps(yd4(yg, b), xd);
            sumf[g] = _mm_add_ps(sumf[g], _mm_mul_ps(d, _mm_cvtepi32_ps(sumi)));
        }
    }
    _mm_storeu_ps(out, sumf[0]);
    _mm_storeu_ps(out + 4, sumf[1]);
}

/*
 * Q5_K panel: q5k_tile at 8 tokens, with the float finish of 4 tokens at a time in SSE lanes
 * (kquants2_impl.h's scale-and-min sequence lane-wise, as q2k_panel8): the reference's bits.
 */
KQ2_INLINE void
q5k_panel8(int64_t nb, const sp_block_q5_k *x, const sp_block_q8_k *const *y, float *out)
{
    __m128 sumf[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        uint64_t sc64, m64;
        sp__q4k_unpack_scales_u64(x[b].scales, &sc64, &m64);
        int32_t sc2[8] __attribute__((aligned(32)));
        store_scale_pairs(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc64)), sc2);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[b].qh);
        __m256i acc[PANEL_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < PANEL_TOK; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const int j0 = 2 * h, j1 = 2 * h + 1;
            __m256i q0, q1;
            q5k_quants(x[b].qs, qh, h, &q0, &q1);
            const __m256i s0 = bcast_scale(&sc2[j0]), s1 = bcast_scale(&sc2[j1]);
#pragma GCC unroll 8
            for (int t = 0; t < PANEL_TOK; t++)
                acc[t] = _mm256_add_epi32(
                    acc[t], _mm256_add_epi32(dot_u(q0, load_y(&y[t][b], 64 * h), s0),
                                             dot_u(q1, load_y(&y[t][b], 64 * h + 32), s1)));
        }
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m64));
        const __m128 xdd = load_d_dmin(&x[b].d);
        const __m128 xd = _mm_shuffle_ps(xdd, xdd, 0x00), xm = _mm_shuffle_ps(xdd, xdd, 0x55);
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++) {
            const sp_block_q8_k *const *yg = y + 4 * g;
            __m128i mm[4];
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) { /* summs = sum_j m[j] * (bsums[2j] + bsums[2j+1]) */
                const __m128i pairs =
                    _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)yg[t][b].bsums),
                                   _mm_loadu_si128((const __m128i *)(yg[t][b].bsums + 8)));
                mm[t] = _mm_madd_epi16(mins, pairs);
            }
            const __m128i summs =
                _mm_hadd_epi32(_mm_hadd_epi32(mm[0], mm[1]), _mm_hadd_epi32(mm[2], mm[3]));
            const __m128i sumi = hsum4_i32x8(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2],
                                             acc[4 * g + 3]);
            const __m128 ydv = yd4(yg, b);
            const __m128 d = _mm_mul_ps(ydv, xd), dm = _mm_mul_ps(ydv, xm);
            const __m128 a = _mm_mul_ps(d, _mm_cvtepi32_ps(sumi));
            const __m128 c = _mm_mul_ps(dm, _mm_cvtepi32_ps(summs));
            sumf[g] = _mm_add_ps(sumf[g], _mm_sub_ps(a, c));
        }
    }
    _mm_storeu_ps(out, sumf[0]);
    _mm_storeu_ps(out + 4, sumf[1]);
}

/*
 * IQ4_XS panel: the row tile above at 8 tokens (its quants decoded once for all of them), with
 * the float finish of 4 tokens at a time in SSE lanes (lane t: d = y.d * x.d, blk = d * sumi,
 * sumf = sumf + blk): the reference's bits, and a quarter of the per-token horizontal sums.
 */
KQ2_INLINE void
iq4xs_panel8(int64_t nb, const sp_block_iq4_xs *x, const sp_block_q8_k *const *y, float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i nib_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)sp_iq4nl_values));
    __m128 sumf[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        int32_t sc2[8] __attribute__((aligned(32)));
        iq4xs_scale_pairs(&x[b], sc2);
        __asm__("" : "+m"(sc2));
        __m256i acc[PANEL_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < PANEL_TOK; t++)
            acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i v =
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(x[b].qs + 16 * k)));
            const __m256i q =
                _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srlv_epi32(v, nib_shift), m4));
            const __m256i aq = _mm256_abs_epi8(q);
            const __m256i s = bcast_scale(&sc2[k]);
#pragma GCC unroll 8
            for (int t = 0; t < PANEL_TOK; t++)
                acc[t] = _mm256_add_epi32(acc[t], dot_s(aq, q, load_y(&y[t][b], 32 * k), s));
        }
        const __m128 xd = _mm_set1_ps(_cvtsh_ss(x[b].d));
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++) {
            const __m128i sumi = hsum4_i32x8(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2],
                                             acc[4 * g + 3]);
            const __m128 d = _mm_mul_ps(yd4(y + 4 * g, b), xd);
            sumf[g] = _mm_add_ps(sumf[g], _mm_mul_ps(d, _mm_cvtepi32_ps(sumi)));
        }
    }
    _mm_storeu_ps(out, sumf[0]);
    _mm_storeu_ps(out + 4, sumf[1]);
}

/* Rows outer (one weight row stays in L1 while the tokens sweep it), tokens in tiles of TT
 * (TILE_TOK, IQ4_TILE_TOK for IQ4_XS); the tail tile uses a smaller NT of the same microkernel
 * (the `TT > n ? n : 1` cases only keep the 4-wide types from instantiating wider tiles). */
#define DEFINE_ENTRIES(vec_dot, gemm, tile, wblock, TT)                                         \
    void vec_dot(int64_t n, float *s, const void *w, const void *x)                             \
    {                                                                                           \
        const sp_block_q8_k *y = x;                                                             \
        tile(n / SP_QK_K, w, &y, 1, s);                                                         \
    }                                                                                           \
    void gemm(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1, const void *x, \
              size_t x_stride, int64_t n_tok, float *y, int64_t ldy)                            \
    {                                                                                           \
        const int64_t nb = n / SP_QK_K;                                                         \
        for (int64_t r = r0; r < r1; r++) {                                                     \
            const wblock *wr = (const wblock *)((const char *)w + (size_t)r * w_stride);        \
            for (int64_t t0 = 0; t0 < n_tok; t0 += TT) {                                  \
                const sp_block_q8_k *yr[TT];                                              \
                float out[TT];                                                            \
                const int nt = n_tok - t0 < TT ? (int)(n_tok - t0) : TT;            \
                for (int t = 0; t < nt; t++)                                                    \
                    yr[t] = (const sp_block_q8_k *)((const char *)x +                           \
                                                    (size_t)(t0 + t) * x_stride);               \
                switch (nt) {                                                                   \
                case 8: tile(nb, wr, yr, TT > 7 ? 8 : 1, out); break;                           \
                case 7: tile(nb, wr, yr, TT > 6 ? 7 : 1, out); break;                           \
                case 6: tile(nb, wr, yr, TT > 5 ? 6 : 1, out); break;                           \
                case 5: tile(nb, wr, yr, TT > 4 ? 5 : 1, out); break;                           \
                case 4: tile(nb, wr, yr, 4, out); break;                                        \
                case 3: tile(nb, wr, yr, 3, out); break;                                        \
                case 2: tile(nb, wr, yr, 2, out); break;                                        \
                default: tile(nb, wr, yr, 1, out); break;                                       \
                }                                                                               \
                for (int t = 0; t < nt; t++)                                                    \
                    y[(t0 + t) * ldy + r] = out[t];                                             \
            }                                                                                   \
        }                                                                                       \
    }

/*
 * The panel gemms: tokens in chunks whose activations stay in L2 (PANEL_X_CHUNK_BYTES), every
 * row of [r0, r1) swept over a chunk before the next (so the activations are read from L2, not
 * from memory, once per row), full tiles of PANEL_TOK tokens through the panel kernel and the
 * chunk's last few tokens through the row tile (same bits: both are the reference's).
 */
#define DEFINE_PANEL_GEMM(gemm, panel, tile, wblock, TT)                                        \
    void gemm(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1, const void *x, \
              size_t x_stride, int64_t n_tok, float *y, int64_t ldy)                            \
    {                                                                                           \
        const int64_t nb = n / SP_QK_K;                                                         \
        int64_t tc = (int64_t)(PANEL_X_CHUNK_BYTES / (x_stride ? x_stride : 1));                \
        tc = tc < PANEL_TOK ? PANEL_TOK : tc / PANEL_TOK * PANEL_TOK;                           \
        for (int64_t c0 = 0; c0 < n_tok; c0 += tc) {                                            \
            const int64_t c1 = c0 + tc < n_tok ? c0 + tc : n_tok;                               \
            for (int64_t r = r0; r < r1; r++) {                                                 \
                const wblock *wr = (const wblock *)((const char *)w + (size_t)r * w_stride);    \
                for (int64_t t0 = c0; t0 < c1;) {                                               \
                    const sp_block_q8_k *yr[PANEL_TOK];                                         \
                    float out[PANEL_TOK];                                                       \
                    const int nt = c1 - t0 < PANEL_TOK ? (int)(c1 - t0) : PANEL_TOK;            \
                    for (int t = 0; t < nt; t++)                                                \
                        yr[t] = (const sp_block_q8_k *)((const char *)x +                       \
                                                        (size_t)(t0 + t) * x_stride);           \
                    if (nt == PANEL_TOK) {                                                      \
                        panel(nb, wr, yr, out);                                                 \
                        for (int t = 0; t < nt; t++)                                            \
                            y[(t0 + t) * ldy + r] = out[t];                                     \
                        t0 += PANEL_TOK;                                                        \
                        continue;                                                               \
                    }                                                                           \
                    const int nr = nt < TT ? nt : TT;                                           \
                    switch (nr) {                                                               \
                    case 7: tile(nb, wr, yr, TT > 6 ? 7 : 1, out); break;                       \
                    case 6: tile(nb, wr, yr, TT > 5 ? 6 : 1, out); break;                       \
                    case 5: tile(nb, wr, yr, TT > 4 ? 5 : 1, out); break;                       \
                    case 4: tile(nb, wr, yr, 4, out); break;                                    \
                    case 3: tile(nb, wr, yr, 3, out); break;                                    \
                    case 2: tile(nb, wr, yr, 2, out); break;                                    \
                    default: tile(nb, wr, yr, 1, out); break;                                   \
                    }                                                                           \
                    for (int t = 0; t < nr; t++)                                                \
                        y[(t0 + t) * ldy + r] = out[t];                                         \
                    t0 += nr;                                                                   \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    }

DEFINE_ENTRIES(sp__q2k_vec_dot_avx2, sp__q2k_gemm_avx2_prev, q2k_tile, sp_block_q2_k, TILE_TOK)
DEFINE_ENTRIES(sp__q3k_vec_dot_avx2, sp__q3k_gemm_avx2_prev, q3k_tile, sp_block_q3_k, TILE_TOK)
DEFINE_ENTRIES(sp__q5k_vec_dot_avx2, sp__q5k_gemm_avx2_prev, q5k_tile, sp_block_q5_k, TILE_TOK)
DEFINE_ENTRIES(sp__iq4xs_vec_dot_avx2, sp__iq4xs_gemm_avx2_prev, iq4xs_tile, sp_block_iq4_xs,\
               IQ4_TILE_TOK)
DEFINE_PANEL_GEMM(sp__q2k_gemm_avx2, q2k_panel8, q2k_tile, sp_block_q2_k, TILE_TOK)
DEFINE_PANEL_GEMM(sp__iq4xs_gemm_avx2, iq4xs_panel8, iq4xs_tile, sp_block_iq4_xs, IQ4_TILE_TOK)
DEFINE_PANEL_GEMM(sp__q3k_gemm_avx2, q3k_panel8, q3k_tile, sp_block_q3_k, TILE_TOK)
DEFINE_PANEL_GEMM(sp__q5k_gemm_avx2, q5k_panel8, q5k_tile, sp_block_q5_k, TILE_TOK)

void
sp__kquants2_register_avx2(sp_cpu_kernels_t *k)
{
    k->vec_dot[SP_TYPE_Q2_K] = sp__q2k_vec_dot_avx2;
    k->vec_dot[SP_TYPE_Q3_K] = sp__q3k_vec_dot_avx2;
    k->vec_dot[SP_TYPE_Q5_K] = sp__q5k_vec_dot_avx2;
    k->vec_dot[SP_TYPE_IQ4_XS] = sp__iq4xs_vec_dot_avx2;
    k->gemm[SP_TYPE_Q2_K] = sp__q2k_gemm_avx2;
    k->gemm[SP_TYPE_Q3_K] = sp__q3k_gemm_avx2;
    k->gemm[SP_TYPE_Q5_K] = sp__q5k_gemm_avx2;
    k->gemm[SP_TYPE_IQ4_XS] = sp__iq4xs_gemm_avx2;
}
