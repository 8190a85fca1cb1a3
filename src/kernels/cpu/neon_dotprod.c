/*
 * neon_dotprod.c - the integer products of neon_impl.h (Q8_0, Q4_0, Q4_K, Q6_K) with the
 * ARMv8.2-A dot-product instruction SDOT (vdotq_s32: four int8 products summed into each int32
 * lane). Built with -march=armv8.2-a+dotprod, so dispatch.c calls it only where getauxval
 * reports HWCAP_ASIMDDP ("dotprod" level, on top of the "neon" table). Same exact integer sums
 * and the same float sequence as neon.c: the bits of the scalar reference. Pure functions: any
 * thread, no heap.
 */
#define SP_NEON_DOT(acc, a, b) vdotq_s32((acc), (a), (b))
#define SP_NEON_NAME(x) neon_dotprod_##x

#include "kernels/cpu/neon_impl.h"

void
sp__neon_dotprod_register(sp_cpu_kernels_t *k)
{
    neon_dotprod_register_int(k);
}
