/*
 * avxvnni_q8gemm.c - the same gemm (q8gemm_x86.h) on CPUs with AVX-VNNI but no AVX-512
 * (Intel Alder Lake and later clients, the E-core Xeons): VPDPBUSD on 256-bit registers does
 * the VPMADDUBSW + VPMADDWD + VPADDD of the AVX2 form in one instruction, with the same
 * integer result, so the same bits. dispatch.c's "avx2-vnni" table: the AVX2 table with this
 * kernel for Q8_0 calls of SP_REPACK_Q8_WIDE_MIN_TOK tokens and up, and avxvnni_q4gemm.c's
 * for Q4_0's.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

#define QW_FN sp__repack_q8_0_gemm_wide_avxvnni
#define QW_VNNI 1
#include "kernels/cpu/q8gemm_x86.h"

/* A table entry: calls of SP_REPACK_Q8_WIDE_MIN_TOK tokens and up to the wide VPDPBUSD gemm,
 * fewer to the AVX2 table's tiles (the same bits either way). */
#define BY_TOKENS(name, wide, few)                                                              \
    static void name(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1, const void *x, \
                     size_t xs, int64_t n_tok, float *y, int64_t ldy)                           \
    {                                                                                           \
        if (n_tok >= SP_REPACK_Q8_WIDE_MIN_TOK) {                                               \
            wide(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);                                       \
        } else {                                                                                \
            few(n, w, ws, r0, r1, x, xs, n_tok, y, ldy);                                        \
        }                                                                                       \
    }

BY_TOKENS(q8_0_gemm, sp__repack_q8_0_gemm_wide_avxvnni, sp__repack_q8_0_gemm_few_avx2)
BY_TOKENS(q4_0_gemm, sp__repack_q4_0_gemm_wide_avxvnni, sp__repack_q4_0_gemm_avx2)

void
sp__avxvnni_register(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_Q8_0] = q8_0_gemm;
    k->repack_gemm[SP_TYPE_Q4_0] = q4_0_gemm;
}
