/*
 * neon_impl.h - the arm64 integer kernels (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 x Q8_0; Q4_1, Q5_1 x
 * Q8_1; Q4_K, Q6_K, Q2_K, Q3_K, Q5_K, IQ4_XS x Q8_K), written once
 * and compiled twice: neon.c defines SP_NEON_DOT with widening multiplies (vmull_s8 + vpadalq_s16,
 * base ARMv8-A) and neon_dotprod.c with SDOT (vdotq_s32, built with -march=armv8.2-a+dotprod),
 * each with its own SP_NEON_NAME suffix. Pure functions of their arguments: any thread, no heap.
 *
 * Order of operations: every integer sum is exact (int8 x int8 products fit int16; a Q8_0 block
 * sums at most 32 * 127 * 128 in int32, a K-quant super-block at most 256 * 63 * 127 * 128),
 * so where the lanes add up does not matter. The float part then repeats the scalar reference
 * statement by statement: Q8_0 / Q4_0 do sum = sum + (float)isum * (d_w * d_x) block by block
 * (cpu/ref.c), Q4_K / Q6_K the fixed sequence of kquants_impl.h, Q2_K / Q3_K / Q5_K / IQ4_XS
 * that of kquants2_impl.h (per 16-element group sc * dot, summed in int32), the 32-element
 * types that of q32_impl.h (eight partial sums, block i into i % 8, the same final tree). The
 * results therefore equal the reference bit for bit (the build uses -std=c11, so no
 * multiply-add is contracted into an FMA), and the gemm's (row, token) pairs run exactly
 * vec_dot's operations (batch invariance).
 *
 * The gemm takes one weight row against up to NE_T tokens at a time: the row's blocks are
 * loaded and unpacked once and dotted with each token.
 */
#ifndef SP_KERNELS_CPU_NEON_IMPL_H
#define SP_KERNELS_CPU_NEON_IMPL_H

#include <arm_neon.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants2_impl.h"
#include "kernels/cpu/kquants_impl.h"
#include "kernels/cpu/q32_impl.h"

#if !defined(SP_NEON_DOT) || !defined(SP_NEON_NAME)
#error "define SP_NEON_DOT(acc, a, b) and SP_NEON_NAME(x) before including neon_impl.h"
#endif

#define NE_INLINE static inline __attribute__((always_inline))
#define NE_T 4 /* tokens per gemm step */

/* Exact half -> float (every half is a float). */
NE_INLINE float
ne_h2f(sp_fp16_t h)
{
    __fp16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}

/* ---- Q8_0 / Q4_0 weights, Q8_0 activations ----------------------------------------------- */

enum { NE_Q8_0, NE_Q4_0 };

/* One weight row (nb blocks) against T token rows xs bytes apart: y[t * ys] for t < T. */
NE_INLINE void
ne_q_row(const int wt, const int T, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
         float *y, int64_t ys)
{
    float sum[NE_T] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t w0, w1;
        float dw;
        if (wt == NE_Q8_0) {
            const sp_block_q8_0 *p = (const sp_block_q8_0 *)w + b;
            w0 = vld1q_s8(p->qs);
            w1 = vld1q_s8(p->qs + 16);
            dw = ne_h2f(p->d);
        } else {
            /* low nibbles are elements 0..15, high nibbles 16..31; q - 8 fits int8 */
            const sp_block_q4_0 *p = (const sp_block_q4_0 *)w + b;
            const uint8x16_t raw = vld1q_u8(p->qs);
            w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, m4)), eight);
            w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight);
            dw = ne_h2f(p->d);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const sp_block_q8_0 *xb = (const sp_block_q8_0 *)(x + (size_t)t * xs) + b;
            int32x4_t acc = vdupq_n_s32(0);
            acc = SP_NEON_DOT(acc, w0, vld1q_s8(xb->qs));
            acc = SP_NEON_DOT(acc, w1, vld1q_s8(xb->qs + 16));
            const int32_t isum = vaddvq_s32(acc);
            const float d = dw * ne_h2f(xb->d);
            sum[t] += (float)isum * d;
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        y[t * ys] = sum[t];
    }
}

/* ---- Q4_K / Q6_K weights, Q8_K activations ----------------------------------------------- */

enum { NE_Q4_K, NE_Q6_K };

NE_INLINE void
ne_k_row(const int wt, const int T, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
         float *y, int64_t ys)
{
    float sum[NE_T] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x03);
    const int8x16_t k32 = vdupq_n_s8(32);
    for (int64_t b = 0; b < nb; b++) {
        /* the 256 weights as int8 in element order, and their per-run integer scales */
        int8x16_t q[16];
        float dw, dmw = 0.0f;
        uint8_t sc[8] = {0}, mn[8] = {0};
        const int8_t *s6 = NULL;
        if (wt == NE_Q4_K) {
            const sp_block_q4_k *p = (const sp_block_q4_k *)w + b;
            sp__q4k_unpack_scales(p->scales, sc, mn);
            for (int h = 0; h < 4; h++) {
                /* 32 bytes hold runs 2h (low nibbles) and 2h + 1 (high nibbles) */
                const uint8x16_t r0 = vld1q_u8(p->qs + 32 * h);
                const uint8x16_t r1 = vld1q_u8(p->qs + 32 * h + 16);
                q[4 * h + 0] = vreinterpretq_s8_u8(vandq_u8(r0, m4));
                q[4 * h + 1] = vreinterpretq_s8_u8(vandq_u8(r1, m4));
                q[4 * h + 2] = vreinterpretq_s8_u8(vshrq_n_u8(r0, 4));
                q[4 * h + 3] = vreinterpretq_s8_u8(vshrq_n_u8(r1, 4));
            }
            dw = ne_h2f(p->d);
            dmw = ne_h2f(p->dmin);
        } else {
            const sp_block_q6_k *p = (const sp_block_q6_k *)w + b;
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = p->ql + 64 * h, *qh = p->qh + 32 * h;
                for (int l = 0; l < 2; l++) {
                    const uint8x16_t lo = vld1q_u8(ql + 16 * l);
                    const uint8x16_t lo2 = vld1q_u8(ql + 32 + 16 * l);
                    const uint8x16_t hi = vld1q_u8(qh + 16 * l);
                    const uint8x16_t v0 = vorrq_u8(vandq_u8(lo, m4), vshlq_n_u8(vandq_u8(hi, m3), 4));
                    const uint8x16_t v1 = vorrq_u8(vandq_u8(lo2, m4),
                                                   vshlq_n_u8(vandq_u8(vshrq_n_u8(hi, 2), m3), 4));
                    const uint8x16_t v2 = vorrq_u8(vshrq_n_u8(lo, 4),
                                                   vshlq_n_u8(vandq_u8(vshrq_n_u8(hi, 4), m3), 4));
                    const uint8x16_t v3 = vorrq_u8(vshrq_n_u8(lo2, 4),
                                                   vshlq_n_u8(vshrq_n_u8(hi, 6), 4));
                    /* elements 128h + 16l + {0, 32, 64, 96} .. +15 */
                    q[8 * h + l + 0] = vsubq_s8(vreinterpretq_s8_u8(v0), k32);
                    q[8 * h + l + 2] = vsubq_s8(vreinterpretq_s8_u8(v1), k32);
                    q[8 * h + l + 4] = vsubq_s8(vreinterpretq_s8_u8(v2), k32);
                    q[8 * h + l + 6] = vsubq_s8(vreinterpretq_s8_u8(v3), k32);
                }
            }
            s6 = p->scales;
            dw = ne_h2f(p->d);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const sp_block_q8_k *xb = (const sp_block_q8_k *)(x + (size_t)t * xs) + b;
            int32x4_t acc = vdupq_n_s32(0);
            if (wt == NE_Q4_K) {
                int32_t summs = 0;
                for (int j = 0; j < 8; j++) {
                    int32x4_t dj = vdupq_n_s32(0);
                    dj = SP_NEON_DOT(dj, q[2 * j], vld1q_s8(xb->qs + 32 * j));
                    dj = SP_NEON_DOT(dj, q[2 * j + 1], vld1q_s8(xb->qs + 32 * j + 16));
                    acc = vmlaq_n_s32(acc, dj, (int32_t)sc[j]);
                    summs += mn[j] * (xb->bsums[2 * j] + xb->bsums[2 * j + 1]);
                }
                const int32_t sumi = vaddvq_s32(acc);
                /* the fixed float sequence of kquants_impl.h, one statement per rounding */
                const float d = xb->d * dw;
                const float dm = xb->d * dmw;
                const float a = d * (float)sumi;
                const float c = dm * (float)summs;
                const float blk = a - c;
                sum[t] = sum[t] + blk;
            } else {
                for (int k = 0; k < 16; k++) {
                    int32x4_t dk = SP_NEON_DOT(vdupq_n_s32(0), q[k], vld1q_s8(xb->qs + 16 * k));
                    acc = vmlaq_n_s32(acc, dk, (int32_t)s6[k]);
                }
                const int32_t sumi = vaddvq_s32(acc);
                const float d = xb->d * dw;
                const float blk = d * (float)sumi;
                sum[t] = sum[t] + blk;
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        y[t * ys] = sum[t];
    }
}

/* ---- Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (q32_impl.h's contract) ------------------------------ */

enum { NE_Q4_1, NE_Q5_0, NE_Q5_1, NE_IQ4_NL, NE_MXFP4 };

/* 16 fifth bits (bit j of the two bytes = element j) as 0x10 / 0x00 bytes. */
NE_INLINE uint8x16_t
ne_q5_bits(const uint8_t *qh2)
{
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bytes = vcombine_u8(vdup_n_u8(qh2[0]), vdup_n_u8(qh2[1]));
    return vandq_u8(vtstq_u8(bytes, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* One weight row of 32-element blocks against T tokens: per block the exact int32 sum of
 * (the format's integer) x (activation quant), then the float statements of the contract into
 * lane i % 8 of eight partial sums, and sp__q32_sum_lanes at the end. Q4_1 and Q5_1 take Q8_1
 * activations (d, s, qs), the others Q8_0 (d, qs). */
NE_INLINE void
ne_q32_row(const int wt, const int T, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
           float *y, int64_t ys)
{
    float acc[NE_T][SP_Q32_LANES];
    memset(acc, 0, sizeof acc);
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t k16 = vdupq_n_s8(16);
    const bool q81 = wt == NE_Q4_1 || wt == NE_Q5_1;
    const size_t xbsz = q81 ? sizeof(sp_block_q8_1) : sizeof(sp_block_q8_0);
    const size_t xqoff = q81 ? offsetof(sp_block_q8_1, qs) : offsetof(sp_block_q8_0, qs);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *qs;
        float dw = 0.0f, mw = 0.0f;
        switch (wt) {
        case NE_Q4_1: {
            const sp_block_q4_1 *p = (const sp_block_q4_1 *)w + i;
            qs = p->qs, dw = ne_h2f(p->d), mw = ne_h2f(p->m);
            break;
        }
        case NE_Q5_0: {
            const sp_block_q5_0 *p = (const sp_block_q5_0 *)w + i;
            qs = p->qs, dw = ne_h2f(p->d);
            break;
        }
        case NE_Q5_1: {
            const sp_block_q5_1 *p = (const sp_block_q5_1 *)w + i;
            qs = p->qs, dw = ne_h2f(p->d), mw = ne_h2f(p->m);
            break;
        }
        case NE_IQ4_NL: {
            const sp_block_iq4_nl *p = (const sp_block_iq4_nl *)w + i;
            qs = p->qs, dw = ne_h2f(p->d);
            break;
        }
        default: {
            const sp_block_mxfp4 *p = (const sp_block_mxfp4 *)w + i;
            qs = p->qs, dw = sp__e8m0_half(p->e);
            break;
        }
        }
        const uint8x16_t raw = vld1q_u8(qs);
        uint8x16_t lo = vandq_u8(raw, m4), hi = vshrq_n_u8(raw, 4);
        int8x16_t w0, w1;
        if (wt == NE_Q5_0 || wt == NE_Q5_1) {
            const uint8_t *qh = wt == NE_Q5_0 ? ((const sp_block_q5_0 *)w + i)->qh
                                              : ((const sp_block_q5_1 *)w + i)->qh;
            lo = vorrq_u8(lo, ne_q5_bits(qh));
            hi = vorrq_u8(hi, ne_q5_bits(qh + 2));
        }
        if (wt == NE_IQ4_NL || wt == NE_MXFP4) {
            const int8x16_t grid = vld1q_s8(wt == NE_IQ4_NL ? sp__kvalues_iq4nl : sp__kvalues_mxfp4);
            w0 = vqtbl1q_s8(grid, lo);
            w1 = vqtbl1q_s8(grid, hi);
        } else if (wt == NE_Q5_0) {
            w0 = vsubq_s8(vreinterpretq_s8_u8(lo), k16);
            w1 = vsubq_s8(vreinterpretq_s8_u8(hi), k16);
        } else {
            w0 = vreinterpretq_s8_u8(lo);
            w1 = vreinterpretq_s8_u8(hi);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const uint8_t *xb = x + (size_t)t * xs + (size_t)i * xbsz;
            const int8_t *xq = (const int8_t *)(xb + xqoff);
            int32x4_t a = vdupq_n_s32(0);
            a = SP_NEON_DOT(a, w0, vld1q_s8(xq));
            a = SP_NEON_DOT(a, w1, vld1q_s8(xq + 16));
            const int32_t isum = vaddvq_s32(a);
            sp_fp16_t xd;
            memcpy(&xd, xb, sizeof xd); /* d leads both activation blocks */
            float blk;
            if (q81) {
                sp_fp16_t xsum;
                memcpy(&xsum, xb + offsetof(sp_block_q8_1, s), sizeof xsum);
                const float d = dw * ne_h2f(xd);
                const float pa = d * (float)isum;
                const float pb = mw * ne_h2f(xsum);
                blk = pa + pb;
            } else if (wt == NE_MXFP4) {
                const float d = ne_h2f(xd) * dw;
                blk = d * (float)isum;
            } else {
                const float d = dw * ne_h2f(xd);
                blk = d * (float)isum;
            }
            acc[t][i % SP_Q32_LANES] = acc[t][i % SP_Q32_LANES] + blk;
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        y[t * ys] = sp__q32_sum_lanes(acc[t]);
    }
}

/* ---- Q2_K, Q3_K, Q5_K, IQ4_XS weights, Q8_K activations (kquants2_impl.h's contract) ------- */

enum { NE_Q2_K, NE_Q3_K, NE_Q5_K, NE_IQ4_XS };

/* One super-block as the contract sees it: q[g] the 16 signed quants of elements 16g..16g+15
 * (Q3_K's -4..3, IQ4_XS's grid values), sc[g] / mn[g] the group's integer scale and min (mn
 * zero for the scale-only types). */
NE_INLINE void
ne_k2_unpack(const int wt, const uint8_t *blk, int8x16_t q[16], int32_t sc[16], int32_t mn[16])
{
    const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(0x0f);
    if (wt == NE_Q2_K || wt == NE_Q3_K) {
        /* element 128h + 32j + 16l + e: bits 2j of qs[32h + 16l + e] (group 8h + 2j + l) */
        const uint8_t *qs = wt == NE_Q2_K ? ((const sp_block_q2_k *)blk)->qs
                                          : ((const sp_block_q3_k *)blk)->qs;
        uint8x16_t hm[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if (wt == NE_Q3_K) {
            hm[0] = vld1q_u8(((const sp_block_q3_k *)blk)->hmask);
            hm[1] = vld1q_u8(((const sp_block_q3_k *)blk)->hmask + 16);
        }
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 2; l++) {
                const uint8x16_t v = vld1q_u8(qs + 32 * h + 16 * l);
                const uint8x16_t lo[4] = {vandq_u8(v, m3), vandq_u8(vshrq_n_u8(v, 2), m3),
                                          vandq_u8(vshrq_n_u8(v, 4), m3), vshrq_n_u8(v, 6)};
                for (int j = 0; j < 4; j++) {
                    if (wt == NE_Q2_K) {
                        q[8 * h + 2 * j + l] = vreinterpretq_s8_u8(lo[j]);
                    } else {
                        /* hmask[16l + e] bit 4h + j set: no -4; so q = lo + 4 * bit - 4 */
                        const uint8x16_t bit =
                            vtstq_u8(hm[l], vdupq_n_u8((uint8_t)(1u << (4 * h + j))));
                        const uint8x16_t u = vorrq_u8(lo[j], vandq_u8(bit, vdupq_n_u8(4)));
                        q[8 * h + 2 * j + l] = vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(4));
                    }
                }
            }
        }
        if (wt == NE_Q2_K) {
            const uint8_t *s = ((const sp_block_q2_k *)blk)->scales;
            for (int g = 0; g < 16; g++) {
                sc[g] = s[g] & 0xF;
                mn[g] = s[g] >> 4;
            }
        } else {
            uint8_t s[16];
            sp__q3k_unpack_scales(((const sp_block_q3_k *)blk)->scales, s);
            for (int g = 0; g < 16; g++) {
                sc[g] = (int32_t)s[g] - 32;
                mn[g] = 0;
            }
        }
    } else if (wt == NE_Q5_K) {
        /* element 32j + 16l + e: nibble j & 1 of qs[32 (j / 2) + 16l + e], bit j of qh[16l + e] */
        const sp_block_q5_k *p = (const sp_block_q5_k *)blk;
        const uint8x16_t b4 = vdupq_n_u8(0x10);
        for (int l = 0; l < 2; l++) {
            const uint8x16_t qh = vld1q_u8(p->qh + 16 * l);
            for (int j = 0; j < 8; j++) {
                const uint8x16_t v = vld1q_u8(p->qs + 32 * (j / 2) + 16 * l);
                const uint8x16_t nib = (j & 1) ? vshrq_n_u8(v, 4) : vandq_u8(v, m4);
                const uint8x16_t hb = vandq_u8(vtstq_u8(qh, vdupq_n_u8((uint8_t)(1u << j))), b4);
                q[2 * j + l] = vreinterpretq_s8_u8(vorrq_u8(nib, hb));
            }
        }
        uint8_t s8[8], m8[8];
        sp__q4k_unpack_scales(p->scales, s8, m8);
        for (int g = 0; g < 16; g++) {
            sc[g] = s8[g / 2];
            mn[g] = m8[g / 2];
        }
    } else {
        /* sub-block ib: low nibbles of qs[16 ib ..] are elements 32 ib + 0..15, high 16..31 */
        const sp_block_iq4_xs *p = (const sp_block_iq4_xs *)blk;
        const int8x16_t grid = vld1q_s8(sp_iq4nl_values);
        for (int ib = 0; ib < 8; ib++) {
            const uint8x16_t v = vld1q_u8(p->qs + 16 * ib);
            q[2 * ib] = vqtbl1q_s8(grid, vandq_u8(v, m4));
            q[2 * ib + 1] = vqtbl1q_s8(grid, vshrq_n_u8(v, 4));
        }
        uint8_t s8[8];
        sp__iq4xs_unpack_scales(p, s8);
        for (int g = 0; g < 16; g++) {
            sc[g] = (int32_t)s8[g / 2] - 32;
            mn[g] = 0;
        }
    }
}

/* One weight row against T tokens: per super-block the exact sumi (and summs), then the
 * contract's float finish, super-blocks in order. */
NE_INLINE void
ne_k2_row(const int wt, const int T, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
          float *y, int64_t ys)
{
    static const size_t bsz[4] = {sizeof(sp_block_q2_k), sizeof(sp_block_q3_k),
                                  sizeof(sp_block_q5_k), sizeof(sp_block_iq4_xs)};
    static const size_t doff[4] = {offsetof(sp_block_q2_k, d), offsetof(sp_block_q3_k, d),
                                   offsetof(sp_block_q5_k, d), offsetof(sp_block_iq4_xs, d)};
    const bool has_min = wt == NE_Q2_K || wt == NE_Q5_K;
    float sum[NE_T] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bsz[wt];
        int8x16_t q[16];
        int32_t sc[16], mn[16];
        ne_k2_unpack(wt, blk, q, sc, mn);
        sp_fp16_t hd, hdm = 0;
        memcpy(&hd, blk + doff[wt], sizeof hd);
        if (wt == NE_Q2_K) {
            hdm = ((const sp_block_q2_k *)blk)->dmin;
        } else if (wt == NE_Q5_K) {
            hdm = ((const sp_block_q5_k *)blk)->dmin;
        }
        const float dw = ne_h2f(hd), dmw = ne_h2f(hdm);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const sp_block_q8_k *xb = (const sp_block_q8_k *)(x + (size_t)t * xs) + b;
            int32x4_t acc = vdupq_n_s32(0);
            int32_t summs = 0;
            for (int g = 0; g < 16; g++) {
                const int32x4_t dg = SP_NEON_DOT(vdupq_n_s32(0), q[g], vld1q_s8(xb->qs + 16 * g));
                acc = vmlaq_n_s32(acc, dg, sc[g]);
                if (has_min) {
                    summs += mn[g] * xb->bsums[g];
                }
            }
            const int32_t sumi = vaddvq_s32(acc);
            /* kquants2_impl.h's finish, one statement per rounding */
            const float d = xb->d * dw;
            float blk_sum;
            if (has_min) {
                const float dm = xb->d * dmw;
                const float a = d * (float)sumi;
                const float c = dm * (float)summs;
                blk_sum = a - c;
            } else {
                blk_sum = d * (float)sumi;
            }
            sum[t] = sum[t] + blk_sum;
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        y[t * ys] = sum[t];
    }
}

/* ---- vec_dot, gemm and the table ---------------------------------------------------------- */

typedef void (*ne_row_fn)(int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs, float *y,
                          int64_t ys);

#define NE_ROWS(name, body, wt)                                                                \
    static void name##_1(int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs, float *y,   \
                         int64_t ys)                                                            \
    {                                                                                           \
        body(wt, 1, nb, w, x, xs, y, ys);                                                       \
    }                                                                                           \
    static void name##_2(int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs, float *y,   \
                         int64_t ys)                                                            \
    {                                                                                           \
        body(wt, 2, nb, w, x, xs, y, ys);                                                       \
    }                                                                                           \
    static void name##_3(int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs, float *y,   \
                         int64_t ys)                                                            \
    {                                                                                           \
        body(wt, 3, nb, w, x, xs, y, ys);                                                       \
    }                                                                                           \
    static void name##_4(int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs, float *y,   \
                         int64_t ys)                                                            \
    {                                                                                           \
        body(wt, 4, nb, w, x, xs, y, ys);                                                       \
    }                                                                                           \
    static const ne_row_fn name##_rows[NE_T + 1] = {NULL, name##_1, name##_2, name##_3,         \
                                                    name##_4};

/* Token chunks of NE_T for every row of [r0, r1): each (row, token) is vec_dot's operations. */
static inline void
ne_gemm_driver(const ne_row_fn *rows, int64_t nb, const void *w, size_t ws, int64_t r0, int64_t r1,
               const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)
{
    for (int64_t t = 0; t < n_tok; t += NE_T) {
        const int64_t tn = n_tok - t < NE_T ? n_tok - t : NE_T;
        for (int64_t r = r0; r < r1; r++) {
            rows[tn](nb, (const uint8_t *)w + (size_t)r * ws, (const uint8_t *)x + (size_t)t * xs,
                     xs, y + t * ldy + r, ldy);
        }
    }
}

#define NE_GEMM_AND_DOT(name, QK)                                                              \
    static void gemm_##name(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,         \
                            const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy)     \
    {                                                                                           \
        ne_gemm_driver(name##_rows, n / (QK), w, ws, r0, r1, x, xs, n_tok, y, ldy);             \
    }                                                                                           \
    static void vec_dot_##name(int64_t n, float *s, const void *w, const void *x)               \
    {                                                                                           \
        name##_1(n / (QK), w, x, 0, s, 1);                                                      \
    }

NE_ROWS(q8_0, ne_q_row, NE_Q8_0)
NE_ROWS(q4_0, ne_q_row, NE_Q4_0)
NE_ROWS(q4_k, ne_k_row, NE_Q4_K)
NE_ROWS(q6_k, ne_k_row, NE_Q6_K)
NE_ROWS(q4_1, ne_q32_row, NE_Q4_1)
NE_ROWS(q5_0, ne_q32_row, NE_Q5_0)
NE_ROWS(q5_1, ne_q32_row, NE_Q5_1)
NE_ROWS(iq4_nl, ne_q32_row, NE_IQ4_NL)
NE_ROWS(mxfp4, ne_q32_row, NE_MXFP4)
NE_GEMM_AND_DOT(q4_1, SP_QK32)
NE_GEMM_AND_DOT(q5_0, SP_QK32)
NE_GEMM_AND_DOT(q5_1, SP_QK32)
NE_GEMM_AND_DOT(iq4_nl, SP_QK32)
NE_GEMM_AND_DOT(mxfp4, SP_QK32)
NE_GEMM_AND_DOT(q8_0, SP_QK8_0)
NE_GEMM_AND_DOT(q4_0, SP_QK4_0)
NE_GEMM_AND_DOT(q4_k, SP_QK_K)
NE_GEMM_AND_DOT(q6_k, SP_QK_K)
NE_ROWS(q2_k, ne_k2_row, NE_Q2_K)
NE_ROWS(q3_k, ne_k2_row, NE_Q3_K)
NE_ROWS(q5_k, ne_k2_row, NE_Q5_K)
NE_ROWS(iq4_xs, ne_k2_row, NE_IQ4_XS)
NE_GEMM_AND_DOT(q2_k, SP_QK_K)
NE_GEMM_AND_DOT(q3_k, SP_QK_K)
NE_GEMM_AND_DOT(q5_k, SP_QK_K)
NE_GEMM_AND_DOT(iq4_xs, SP_QK_K)

/* The integer products of this file; the activation formats stay the reference's. */
static void
SP_NEON_NAME(register_int)(sp_cpu_kernels_t *k)
{
    k->vec_dot[SP_TYPE_Q8_0] = vec_dot_q8_0;
    k->gemm[SP_TYPE_Q8_0] = gemm_q8_0;
    k->vec_dot[SP_TYPE_Q4_0] = vec_dot_q4_0;
    k->gemm[SP_TYPE_Q4_0] = gemm_q4_0;
    k->vec_dot[SP_TYPE_Q4_K] = vec_dot_q4_k;
    k->gemm[SP_TYPE_Q4_K] = gemm_q4_k;
    k->vec_dot[SP_TYPE_Q6_K] = vec_dot_q6_k;
    k->gemm[SP_TYPE_Q6_K] = gemm_q6_k;
    k->vec_dot[SP_TYPE_Q4_1] = vec_dot_q4_1;
    k->gemm[SP_TYPE_Q4_1] = gemm_q4_1;
    k->vec_dot[SP_TYPE_Q5_0] = vec_dot_q5_0;
    k->gemm[SP_TYPE_Q5_0] = gemm_q5_0;
    k->vec_dot[SP_TYPE_Q5_1] = vec_dot_q5_1;
    k->gemm[SP_TYPE_Q5_1] = gemm_q5_1;
    k->vec_dot[SP_TYPE_IQ4_NL] = vec_dot_iq4_nl;
    k->gemm[SP_TYPE_IQ4_NL] = gemm_iq4_nl;
    k->vec_dot[SP_TYPE_MXFP4] = vec_dot_mxfp4;
    k->gemm[SP_TYPE_MXFP4] = gemm_mxfp4;
    k->vec_dot[SP_TYPE_Q2_K] = vec_dot_q2_k;
    k->gemm[SP_TYPE_Q2_K] = gemm_q2_k;
    k->vec_dot[SP_TYPE_Q3_K] = vec_dot_q3_k;
    k->gemm[SP_TYPE_Q3_K] = gemm_q3_k;
    k->vec_dot[SP_TYPE_Q5_K] = vec_dot_q5_k;
    k->gemm[SP_TYPE_Q5_K] = gemm_q5_k;
    k->vec_dot[SP_TYPE_IQ4_XS] = vec_dot_iq4_xs;
    k->gemm[SP_TYPE_IQ4_XS] = gemm_iq4_xs;
}

#endif /* SP_KERNELS_CPU_NEON_IMPL_H */
