/*
 * avx2_kwide.c - the AVX2 prefill gemms of packed Q4_K, Q5_K and Q6_K for calls of many tokens
 * (kwide_x86.h): VPMADDUBSW pair sums added in int16, widened by a VPMADDWD with the scales.
 * avx2_repack.c (Q4_K) and avx2_kpack.c (Q5_K, Q6_K) hand them calls from a token count per
 * type (RPX_BY_TOKENS: 6, 5 and 3).
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

#define KW_VNNI 0
#define KW_Q4K_FN sp__repack_q4_k_gemm_wide_avx2
#define KW_Q5K_FN sp__repack_q5_k_gemm_wide_avx2
#define KW_Q6K_FN sp__repack_q6_k_gemm_wide_avx2
#include "kernels/cpu/kwide_x86.h"
