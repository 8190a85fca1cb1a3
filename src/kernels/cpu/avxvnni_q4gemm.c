/*
 * avxvnni_q4gemm.c - the packed Q4_0 prefill gemm of the "avx2-vnni" table: q8gemm_x86.h's
 * loop order (a block's weights laid out once as 8 rows x 4 elements a register, every token of
 * the chunk against them) with the nibbles as VPDPBUSD's unsigned side, the reference's -8
 * offset taken off the exact block sum; the same bits as avx2_repack.c's Q4_0 tiles and the
 * reference. avxvnni_q8gemm.c registers it for calls of 3 tokens and up.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

#define QW_FN sp__repack_q4_0_gemm_wide_avxvnni
#define QW_VNNI 1
#define QW_Q4 1
#include "kernels/cpu/q8gemm_x86.h"
