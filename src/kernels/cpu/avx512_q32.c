/*
 * avx512_q32.c - AVX-512 vec_dot and gemm of Q4_1, Q5_1 (x Q8_1) and Q5_0, IQ4_NL, MXFP4
 * (x Q8_0).
 *
 * Built with the AVX-512 flags and called only where the dispatcher found AVX-512 F/BW/VL/DQ.
 * The body is q32_x86.h's, with the integer products of two blocks per 512-bit register
 * (VPMADDUBSW + VPMADDWD, or VPDPBUSD where cpuid reports VNNI); the results are the scalar
 * reference's bits (q32_impl.h's contract). Pure functions, any thread, no heap.
 */
#include "kernels/cpu/q32_x86.h"

Q32_DEFINE(q4_1, Q32_Q4_1, Q32_AVX512)
Q32_DEFINE(q5_0, Q32_Q5_0, Q32_AVX512)
Q32_DEFINE(q5_1, Q32_Q5_1, Q32_AVX512)
Q32_DEFINE(iq4_nl, Q32_IQ4_NL, Q32_AVX512)
Q32_DEFINE(mxfp4, Q32_MXFP4, Q32_AVX512)
Q32_DEFINE(q4_1_vnni, Q32_Q4_1, Q32_AVX512_VNNI)
Q32_DEFINE(q5_0_vnni, Q32_Q5_0, Q32_AVX512_VNNI)
Q32_DEFINE(q5_1_vnni, Q32_Q5_1, Q32_AVX512_VNNI)
Q32_DEFINE(iq4_nl_vnni, Q32_IQ4_NL, Q32_AVX512_VNNI)
Q32_DEFINE(mxfp4_vnni, Q32_MXFP4, Q32_AVX512_VNNI)

/* Prefill and batched decode of MXFP4, Q4_1 and Q5_0 go through the AVX2 row panels
 * (avx2_q32panel.c: 8 rows in the lanes, no horizontal sums; 2-2.6x these row tiles on an
 * AVX-512 Zen host, docs/design.md), with these tiles for decode and leftover rows. With VNNI,
 * MXFP4 and IQ4_NL take the 16-row VPDPBUSD panels of avx512_q4panel.c instead (2.1x and 5x
 * the kernels before on that host, docs/design.md), these for one token. */
#define Q32_PANEL(name, type, rows)                                                            \
    static void name(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,       \
                     const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)    \
    {                                                                                         \
        sp__q32_panel_gemm_avx2(type, rows, n, w, w_stride, r0, r1, x, x_stride, n_tok, y,    \
                                ldy);                                                         \
    }
Q32_PANEL(mxfp4_panel, SP_TYPE_MXFP4, mxfp4_gemm)
Q32_PANEL(mxfp4_vnni_panel, SP_TYPE_MXFP4, mxfp4_vnni_gemm)
Q32_PANEL(q4_1_panel, SP_TYPE_Q4_1, q4_1_gemm)
Q32_PANEL(q4_1_vnni_panel, SP_TYPE_Q4_1, q4_1_vnni_gemm)
Q32_PANEL(q5_0_panel, SP_TYPE_Q5_0, q5_0_gemm)
Q32_PANEL(q5_0_vnni_panel, SP_TYPE_Q5_0, q5_0_vnni_gemm)

/* With VNNI, prefill and batched decode of MXFP4 and IQ4_NL take the 16-row VPDPBUSD panels
 * (avx512_q4panel.c); few tokens go to the kernels above (the same bits). */
#define Q4_PANEL(name, type, small)                                                            \
    static void name(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,       \
                     const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)    \
    {                                                                                         \
        sp__q4panel_gemm_avx512(type, small, n, w, w_stride, r0, r1, x, x_stride, n_tok, y,   \
                                ldy);                                                         \
    }
Q4_PANEL(mxfp4_vnni_q4panel, SP_TYPE_MXFP4, mxfp4_vnni_panel)
Q4_PANEL(iq4_nl_vnni_q4panel, SP_TYPE_IQ4_NL, iq4_nl_vnni_gemm)

sp_gemm_fn
sp__q32_avx512_vnni_prev_gemm(sp_type_t type)
{
    return type == SP_TYPE_MXFP4 ? mxfp4_vnni_panel : type == SP_TYPE_IQ4_NL ? iq4_nl_vnni_gemm : NULL;
}

void
sp__q32_level_avx512(sp_q32_level_t *l, bool has_vnni)
{
    l->vec_dot[SP_TYPE_Q4_1] = has_vnni ? q4_1_vnni_vec_dot : q4_1_vec_dot;
    l->vec_dot[SP_TYPE_Q5_0] = has_vnni ? q5_0_vnni_vec_dot : q5_0_vec_dot;
    l->vec_dot[SP_TYPE_Q5_1] = has_vnni ? q5_1_vnni_vec_dot : q5_1_vec_dot;
    l->vec_dot[SP_TYPE_IQ4_NL] = has_vnni ? iq4_nl_vnni_vec_dot : iq4_nl_vec_dot;
    l->vec_dot[SP_TYPE_MXFP4] = has_vnni ? mxfp4_vnni_vec_dot : mxfp4_vec_dot;
    l->gemm[SP_TYPE_Q4_1] = has_vnni ? q4_1_vnni_panel : q4_1_panel;
    l->gemm[SP_TYPE_Q5_0] = has_vnni ? q5_0_vnni_panel : q5_0_panel;
    l->gemm[SP_TYPE_Q5_1] = has_vnni ? q5_1_vnni_gemm : q5_1_gemm;
    l->gemm[SP_TYPE_IQ4_NL] = has_vnni ? iq4_nl_vnni_q4panel : iq4_nl_gemm;
    l->gemm[SP_TYPE_MXFP4] = has_vnni ? mxfp4_vnni_q4panel : mxfp4_panel;
}

void
sp__q32_register_avx512(sp_cpu_kernels_t *k, bool has_vnni)
{
    sp_q32_level_t l = {0};
    sp__q32_level_avx512(&l, has_vnni);
    sp__q32_apply(k, &l);
}
