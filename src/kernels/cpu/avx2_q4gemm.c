/*
 * avx2_q4gemm.c - the AVX2 prefill gemm of packed Q4_0 weights in q8gemm_x86.h's loop order
 * (a block's nibbles laid out once as 8 rows x 4 elements a register, every token of the chunk
 * against them): per 32 multiply-adds one VPMADDUBSW and one VPADDW, a block's eight pair sums
 * in int16 widened by one VPMADDWD, the -8 offset taken off the exact block sum. The same bits
 * as avx2_repack.c's Q4_0 tiles and the reference; avx2_repack.c hands it calls of 5 tokens
 * and up.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

#define QW_FN sp__repack_q4_0_gemm_wide_avx2
#define QW_VNNI 0
#define QW_Q4 1
#include "kernels/cpu/q8gemm_x86.h"
