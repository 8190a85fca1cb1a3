/*
 * avx2_q8gemm.c - the AVX2 prefill gemm of packed Q8_0 weights (q8gemm_x86.h): per 32
 * multiply-adds a VPSIGNB, a VPMADDUBSW, a VPMADDWD and a VPADDD.
 */
#define QW_FN sp__repack_q8_0_gemm_wide_avx2
#define QW_VNNI 0
#include "kernels/cpu/q8gemm_x86.h"
