/*
 * amx.c - the AMX level: the AVX-512 (VNNI) table with its integer matrix
 * products moved onto AMX-INT8 tiles where that pays (prefill and batched
 * decode of the packed 16-row panels of Q8_0 and Q4_0, amx_qgemm.c; prefill of
 * the packed 8-row groups of Q4_K and Q5_K, amx_kquants.c).
 *
 * Built with -mamx-tile -mamx-int8 on x86 only; the dispatcher builds this
 * level only where cpuid, XCR0 and Linux's tile-state permission all say yes.
 * Each kernel loads its tile configuration on entry and releases the tiles on
 * return, so no tile state outlives a call (a thread that used AMX keeps an
 * 8 KiB larger context only while the tiles are in use).
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

void
sp__amx_register(sp_cpu_kernels_t *k)
{
    sp__amx_qgemm_register(k); /* Q8_0, Q4_0 packed: the VNNI panels on tiles */
    sp__amx_kquants_register(k); /* Q4_K, Q5_K packed: prefill on tiles (amx_kquants.c) */
}
