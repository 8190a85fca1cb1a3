/*
 * avxvnni_q8gemm.c - the same gemm (q8gemm_x86.h) on CPUs with AVX-VNNI but no AVX-512
 * (Intel Alder Lake and later clients, the E-core Xeons): VPDPBUSD on 256-bit registers, the
 * activation quants made unsigned once per chunk against the signed weights (no VPSIGNB), with
 * the same integer result as the AVX2 form, so the same bits. dispatch.c's "avx2-vnni" table:
 * the AVX2 table with this kernel for Q8_0 calls of 3 tokens and up, avxvnni_q4gemm.c's for
 * Q4_0's and avxvnni_kwide.c's for Q4_K's, Q5_K's and Q6_K's (RPX_BY_TOKENS below).
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

#define QW_FN sp__repack_q8_0_gemm_wide_avxvnni
#define QW_VNNI 1
#include "kernels/cpu/q8gemm_x86.h"

/* the wide gemms on VPDPBUSD from 4 (Q5_K) and 3 (Q8_0, Q4_0, Q4_K, Q6_K) tokens, the AVX2
 * table's tiles below (how the counts were chosen: avx2_repack.c's Q8_0 entry; Q8_0's went from
 * 4 to 3 with the unsigned quants: decode steps of 3 sequences 1.03-1.09x, of 2 a tie) */
RPX_BY_TOKENS(q8_0_gemm, sp__repack_q8_0_gemm_wide_avxvnni, sp__repack_q8_0_gemm_few_avx2, 3)
RPX_BY_TOKENS(q4_0_gemm, sp__repack_q4_0_gemm_wide_avxvnni, sp__repack_q4_0_gemm_avx2, 3)
RPX_BY_TOKENS(q4_k_gemm, sp__repack_q4_k_gemm_wide_avxvnni, sp__repack_q4_k_gemm_few_avx2, 3)
RPX_BY_TOKENS(q5_k_gemm, sp__repack_q5_k_gemm_wide_avxvnni, sp__kpack_q5_k_gemm_avx2, 4)
RPX_BY_TOKENS(q6_k_gemm, sp__repack_q6_k_gemm_wide_avxvnni, sp__kpack_q6_k_gemm_few_avx2, 3)

void
sp__avxvnni_register(sp_cpu_kernels_t *k)
{
    k->repack_gemm[SP_TYPE_Q8_0] = q8_0_gemm;
    k->repack_gemm[SP_TYPE_Q4_0] = q4_0_gemm;
    k->repack_gemm[SP_TYPE_Q4_K] = q4_k_gemm;
    k->repack_gemm[SP_TYPE_Q5_K] = q5_k_gemm;
    k->repack_gemm[SP_TYPE_Q6_K] = q6_k_gemm;
}
