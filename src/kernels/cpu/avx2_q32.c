/*
 * avx2_q32.c - AVX2 vec_dot and gemm of Q4_1, Q5_1 (x Q8_1) and Q5_0, IQ4_NL, MXFP4 (x Q8_0).
 *
 * Built with -mavx2 -mfma -mf16c and called only where the dispatcher found AVX2. The body is
 * q32_x86.h's (VPMADDUBSW + VPMADDWD per block); the results are the scalar reference's bits
 * (q32_impl.h's contract). The gemm entries of MXFP4, Q4_1 and Q5_0 are replaced by the row
 * panels of avx2_q32panel.c (dispatch.c); their row tiles here stay as the panels' fallback.
 * Pure functions, any thread, no heap, a few hundred bytes of stack.
 */
#include "kernels/cpu/q32_x86.h"

Q32_DEFINE(q4_1, Q32_Q4_1, Q32_AVX2)
Q32_DEFINE(q5_0, Q32_Q5_0, Q32_AVX2)
Q32_DEFINE(q5_1, Q32_Q5_1, Q32_AVX2)
Q32_DEFINE(iq4_nl, Q32_IQ4_NL, Q32_AVX2)
Q32_DEFINE(mxfp4, Q32_MXFP4, Q32_AVX2)

/* The row-tile gemms of MXFP4, Q4_1 and Q5_0, exported: the panel gemms' fallback (decode,
 * rows past the last panel) and the A/B bench's baseline. The table's gemm entries of these
 * types are the panels, which avx2_q32panel.c registers over the row tiles (dispatch.c). */
#define Q32_PREV(name, gemm)                                                                   \
    void name(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1, const void *x, \
              size_t x_stride, int64_t n_tok, float *y, int64_t ldy)                            \
    {                                                                                           \
        gemm(n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);                               \
    }
Q32_PREV(sp__q32_mxfp4_gemm_avx2_prev, mxfp4_gemm)
Q32_PREV(sp__q32_q4_1_gemm_avx2_prev, q4_1_gemm)
Q32_PREV(sp__q32_q5_0_gemm_avx2_prev, q5_0_gemm)

void
sp__q32_level_avx2(sp_q32_level_t *l)
{
    l->vec_dot[SP_TYPE_Q4_1] = q4_1_vec_dot;
    l->vec_dot[SP_TYPE_Q5_0] = q5_0_vec_dot;
    l->vec_dot[SP_TYPE_Q5_1] = q5_1_vec_dot;
    l->vec_dot[SP_TYPE_IQ4_NL] = iq4_nl_vec_dot;
    l->vec_dot[SP_TYPE_MXFP4] = mxfp4_vec_dot;
    l->gemm[SP_TYPE_Q4_1] = q4_1_gemm;
    l->gemm[SP_TYPE_Q5_0] = q5_0_gemm;
    l->gemm[SP_TYPE_Q5_1] = q5_1_gemm;
    l->gemm[SP_TYPE_IQ4_NL] = iq4_nl_gemm;
    l->gemm[SP_TYPE_MXFP4] = mxfp4_gemm;
}

void
sp__q32_register_avx2(sp_cpu_kernels_t *k)
{
    sp_q32_level_t l = {0};
    sp__q32_level_avx2(&l);
    sp__q32_apply(k, &l);
}
