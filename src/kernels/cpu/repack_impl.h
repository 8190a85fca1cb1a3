/*
 * repack_impl.h - private to the packed-weight kernels (cpu/repack.c, avx2_repack.c) and
 * their unit test: where a quant byte of a packed group lives, and the per-level gemms over
 * the packed form. Header only, no state.
 */
#ifndef SP_KERNELS_CPU_REPACK_IMPL_H
#define SP_KERNELS_CPU_REPACK_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_impl.h"

/* Bytes of one block of a packed group: 8 F16 scales, then 8 x 16 quant bytes. */
#define SP_REPACK_BLOCK_BYTES (SP_REPACK_ROWS * 2 + SP_REPACK_ROWS * 16)

/* Offset, within a packed block, of quant byte j (0..15) of row r (0..7) of the group:
 * chunk (r >> 1 & 1) + 2 (j >> 3), 64-bit lane (r & 1) | (r >> 2) << 1 within it. Rows
 * {0,1,4,5} and {2,3,6,7} share chunks so that one VPHADDD of the two chunks' sums puts
 * rows 0..7 in lane order (avx2_repack.c). */
static inline size_t
sp__repack_qs_off(int r, int j)
{
    const int chunk = ((r >> 1) & 1) + 2 * (j >> 3);
    const int lane = (r & 1) | ((r >> 2) << 1);
    return (size_t)(SP_REPACK_ROWS * 2 + 32 * chunk + 8 * lane + (j & 7));
}

/* The scalar gemms over the packed form: the reference's order of operations, so their
 * results equal the reference vec_dot's bits (the unit test's oracle for the SIMD ones). */
void sp__repack_q4_0_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
void sp__repack_iq4_nl_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                float *y, int64_t ldy);

/* AVX2 (avx2_repack.c): fills repack_gemm of Q4_0 and IQ4_NL. */
void sp__repack_register_avx2(sp_cpu_kernels_t *k);

#endif /* SP_KERNELS_CPU_REPACK_IMPL_H */
