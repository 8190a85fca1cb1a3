/*
 * cpu_impl.h - internal contract between the CPU kernel files.
 *
 * dispatch.c builds one sp_cpu_kernels_t per level: it starts from the
 * reference table, then each level's register function overwrites the entries
 * it has a faster version of. The K-quant family (Q4_K, Q6_K, Q8_K) lives in
 * its own files and registers itself the same way.
 */
#ifndef SP_KERNELS_CPU_IMPL_H
#define SP_KERNELS_CPU_IMPL_H

#include "kernels/kernels.h"

/* ref.c: F32, F16, BF16, Q8_0, Q4_0 (always built, no SIMD). */
void sp__ref_register(sp_cpu_kernels_t *k);
/* ref_kquants.c: Q4_K, Q6_K x Q8_K; reference quantizers for Q8_K, Q4_K, Q6_K. */
void sp__kquants_register_ref(sp_cpu_kernels_t *k);
bool sp__kquants_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n);
bool sp__kquants_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n);

/* avx2.c / avx2_kquants.c: built with -mavx2 -mfma -mf16c. */
void sp__avx2_register(sp_cpu_kernels_t *k);
void sp__kquants_register_avx2(sp_cpu_kernels_t *k);

/* avx512.c / avx512_kquants.c: built with AVX-512 F/BW/VL/DQ/VNNI/BF16.
 * has_vnni / has_bf16 say which optional extensions this CPU has. */
void sp__avx512_register(sp_cpu_kernels_t *k, bool has_vnni, bool has_bf16);
void sp__kquants_register_avx512(sp_cpu_kernels_t *k, bool has_vnni, bool has_bf16);

/* dispatch.c: what cpuid and XGETBV report (OS support for YMM/ZMM state included). */
typedef struct sp_cpu_features {
    bool avx2;       /* AVX2 + FMA + F16C, YMM state enabled */
    bool avx512;     /* AVX-512 F/BW/VL/DQ, ZMM state enabled */
    bool avx512_vnni;
    bool avx512_bf16;
} sp_cpu_features_t;

const sp_cpu_features_t *sp__cpu_features(void);
/* The level SAMPAN_CPU=value asks for, capped at `best` (never above what the
 * CPU has); NULL, "" or an unknown value give `best`. */
sp_cpu_level_t sp__cpu_level_from_env(const char *value, sp_cpu_level_t best);
/* Fill *k for one level with the optional AVX-512 extensions switched on or
 * off (tests build the VNNI-less AVX-512 table this way). The caller makes
 * sure the CPU has what it asks for. */
void sp__cpu_build_table(sp_cpu_kernels_t *k, sp_cpu_level_t level, bool has_vnni,
                         bool has_bf16);

#endif /* SP_KERNELS_CPU_IMPL_H */
