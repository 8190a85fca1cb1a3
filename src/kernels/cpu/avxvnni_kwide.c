/*
 * avxvnni_kwide.c - the "avx2-vnni" table's prefill gemms of packed Q4_K, Q5_K and Q6_K for
 * calls of many tokens (kwide_x86.h with VPDPBUSD and a VPMULLD by the scales; the same bits as
 * the AVX2 forms and the reference). avxvnni_q8gemm.c registers them for calls from a token
 * count per type (RPX_BY_TOKENS: 3, 4 and 3).
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

#define KW_VNNI 1
#define KW_Q4K_FN sp__repack_q4_k_gemm_wide_avxvnni
#define KW_Q5K_FN sp__repack_q5_k_gemm_wide_avxvnni
#define KW_Q6K_FN sp__repack_q6_k_gemm_wide_avxvnni
#include "kernels/cpu/kwide_x86.h"
