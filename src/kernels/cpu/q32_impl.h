/*
 * q32_impl.h - private to the kernels of the 32-element block types Q4_1, Q5_0, Q5_1, IQ4_NL
 * and MXFP4 (cpu/ref_q32.c, avx2_q32.c, avx512_q32.c) and their unit test: the grids, the
 * small helpers every level must share bit for bit, and the per-level entry points (so tests
 * and benches can call a level directly, without the dispatcher). Header only, no state.
 *
 * Activation formats are llama.cpp's CPU pairing, so that the products (and logits) agree with
 * it: Q4_1 and Q5_1 take Q8_1 activations (the weight's offset m meets the activation block's
 * s = d * sum(q)), Q5_0, IQ4_NL and MXFP4 take the engine's Q8_0 activations.
 *
 * Numerics contract (all levels): per 32-element block i an exact int32 sum isum of weight
 * quant (as the integer the format defines: q, q - 16, or the grid value) times activation
 * quant, then, in float, in this order of separate statements (no FMA contraction):
 *
 *   Q5_0, IQ4_NL:  d = fp16(w.d) * fp16(x.d);  blk = d * (float)isum
 *   MXFP4:         d = fp16(x.d) * e8m0_half(w.e);  blk = d * (float)isum
 *   Q4_1, Q5_1:    d = fp16(w.d) * fp16(x.d);  a = d * (float)isum;
 *                  b = fp16(w.m) * fp16(x.s);  blk = a + b
 *   acc[i % 8] = acc[i % 8] + blk, blocks in ascending order from acc[0..7] = 0,
 *   then sumf = sp__q32_sum_lanes(acc) (a fixed tree, below).
 *
 * The products of two halves (or a half and a power of two) are exact in float. The eight
 * partial sums are the eight float lanes of a 256-bit register: the SIMD levels compute the
 * terms of 8 consecutive blocks lane-wise with the same operations and add them to their lanes
 * in one vector add (no serial chain through the blocks), and finish with the same tree as the
 * reference, so every level gives the reference's bits, and the gemm tiles give vec_dot's bits
 * (batch invariance: a (row, token) result never depends on its neighbours in the tile). A
 * partial last group adds +0 to the lanes past the row's end, which leaves them unchanged
 * (a lane that starts at +0 never becomes -0).
 */
#ifndef SP_KERNELS_CPU_Q32_IMPL_H
#define SP_KERNELS_CPU_Q32_IMPL_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

/* IQ4_NL's grid (ggml's kvalues_iq4nl) and MXFP4's E2M1 values doubled (0, 0.5, 1, 1.5, 2,
 * 3, 4, 6 and their negatives, times 2 so they are integers; the scale is halved instead). */
static const int8_t sp__kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t sp__kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Half of the E8M0 scale 2^(e - 127), as a float (exact: e = 0 and 1 give the denormals
 * 2^-128 and 2^-127, e = 255 gives 2^127; E8M0's NaN encoding is not special-cased, like
 * ggml). The grid above is doubled, so x = sp__e8m0_half(e) * grid[q]. */
static inline float
sp__e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* The partial sums of a dot product (the float lanes of one AVX register). */
#define SP_Q32_LANES 8

/* sumf of the contract: lanes j and j + 4 first, then (0 + 2) and (1 + 3), then the two;
 * the order of a 256-bit horizontal add (high half onto low half, then within 128 bits). */
static inline float
sp__q32_sum_lanes(const float a[SP_Q32_LANES])
{
    const float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7];
    const float c0 = b0 + b2, c1 = b1 + b3;
    return c0 + c1;
}

/* The 32 fifth bits of a Q5_0 / Q5_1 block (bit j = element j). */
static inline uint32_t
sp__q5_high_bits(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
           ((uint32_t)qh[3] << 24);
}

/* ---- per-level entry points -------------------------------------------------------------- */

/* Q8_1 activations (llama.cpp's x86 rule, see ref_q32.c); every level uses this one. */
void sp__q8_1_from_float_ref(const float *src, void *dst, int64_t n);

void sp__q4_1_vec_dot_ref(int64_t n, float *s, const void *w, const void *x);
void sp__q5_0_vec_dot_ref(int64_t n, float *s, const void *w, const void *x);
void sp__q5_1_vec_dot_ref(int64_t n, float *s, const void *w, const void *x);
void sp__iq4_nl_vec_dot_ref(int64_t n, float *s, const void *w, const void *x);
void sp__mxfp4_vec_dot_ref(int64_t n, float *s, const void *w, const void *x);

/* AVX2 (and AVX-512 below): vec_dot and gemm per weight type, indexed like the kernel table;
 * the functions fill only the entries of Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4. */
typedef struct sp_q32_level {
    sp_vec_dot_fn vec_dot[SP_TYPE_COUNT];
    sp_gemm_fn gemm[SP_TYPE_COUNT];
} sp_q32_level_t;

void sp__q32_level_ref(sp_q32_level_t *l);
/* Copy a level's non-NULL entries into the kernel table. */
void sp__q32_apply(sp_cpu_kernels_t *k, const sp_q32_level_t *l);
void sp__q32_level_avx2(sp_q32_level_t *l);
/* has_vnni: use VPDPBUSD (only where cpuid reports AVX-512 VNNI). */
void sp__q32_level_avx512(sp_q32_level_t *l, bool has_vnni);

/* AVX2 gemms of MXFP4, Q4_1 and Q5_0: the row tiles of q32_x86.h ("prev": decode, rows past
 * the last panel, and the A/B bench's baseline) and the 8-row panels of avx2_q32panel.c (the
 * table's entries). */
#define SP__Q32_GEMM_DECL(name)                                                                 \
    void name(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1, const void *x, \
              size_t x_stride, int64_t n_tok, float *y, int64_t ldy);
/* The panel gemm of MXFP4, Q4_1 or Q5_0 with `rows` (a row-tile gemm of the same type, any
 * level) for what the panels leave: decode-sized calls and the rows past the last panel. The
 * AVX-512 table uses it too (the panels outrun its row tiles; AVX-512 CPUs have AVX2). */
void sp__q32_panel_gemm_avx2(sp_type_t type, sp_gemm_fn rows, int64_t n, const void *w,
                             size_t w_stride, int64_t r0, int64_t r1, const void *x,
                             size_t x_stride, int64_t n_tok, float *y, int64_t ldy);
SP__Q32_GEMM_DECL(sp__q32_mxfp4_gemm_avx2_panel)
SP__Q32_GEMM_DECL(sp__q32_mxfp4_gemm_avx2_prev)
SP__Q32_GEMM_DECL(sp__q32_q4_1_gemm_avx2_panel)
SP__Q32_GEMM_DECL(sp__q32_q4_1_gemm_avx2_prev)
SP__Q32_GEMM_DECL(sp__q32_q5_0_gemm_avx2_panel)
SP__Q32_GEMM_DECL(sp__q32_q5_0_gemm_avx2_prev)

/* AVX-512 VNNI 16-row panels (avx512_q4panel.c) of MXFP4 and IQ4_NL (row-major, x Q8_0) and
 * IQ4_XS (the packed form, x Q8_K): the reference's bits; calls with few tokens (or rows too
 * long for its scratch) go to `small`, a gemm of the same type and form. */
void sp__q4panel_gemm_avx512(sp_type_t type, sp_gemm_fn small, int64_t n, const void *w,
                             size_t ws, int64_t r0, int64_t r1, const void *x, size_t xs,
                             int64_t n_tok, float *y, int64_t ldy);

/* The AVX-512 VNNI table's MXFP4 / IQ4_NL gemm before those panels (their fallback; the A/B
 * bench's baseline); NULL for other types. */
sp_gemm_fn sp__q32_avx512_vnni_prev_gemm(sp_type_t type);

#endif /* SP_KERNELS_CPU_Q32_IMPL_H */
