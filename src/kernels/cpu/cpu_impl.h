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
/* ref_kquants2.c: Q2_K, Q3_K, Q5_K, IQ4_XS x Q8_K, and their reference quantizers. */
void sp__kquants2_register_ref(sp_cpu_kernels_t *k);
bool sp__kquants2_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n);
bool sp__kquants2_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n);

/* ref_q32.c / avx2_q32.c / avx512_q32.c: Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (and Q8_1
 * activations); the reference quantizers of these types. */
void sp__q32_register_ref(sp_cpu_kernels_t *k);
void sp__q32_register_avx2(sp_cpu_kernels_t *k);
void sp__q32_register_avx512(sp_cpu_kernels_t *k, bool has_vnni);
/* avx2_q32panel.c: the row-panel gemms of MXFP4, Q4_1, Q5_0 over the AVX2 row tiles (after
 * sp__q32_register_avx2). */
void sp__q32_panels_register_avx2(sp_cpu_kernels_t *k);
bool sp__q32_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n);
bool sp__q32_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n);

/* avx2.c / avx2_kquants.c: built with -mavx2 -mfma -mf16c. */
void sp__avx2_register(sp_cpu_kernels_t *k);
void sp__kquants_register_avx2(sp_cpu_kernels_t *k);
void sp__kquants2_register_avx2(sp_cpu_kernels_t *k);
/* avx2_f16gemm.c: F16, BF16 or F32 x F32 for many tokens (panels converted once per token
 * chunk); avx2.c's gemm[F16], gemm[BF16] and gemm[F32] hand it calls of SP_F16_PANEL_MIN_TOK
 * tokens and up whose rows are whole 8-element steps. The same bits as avx2.c's float tiles. */
#define SP_F16_PANEL_MIN_TOK 12
void sp__f16_gemm_panel_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                             const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy);
void sp__bf16_gemm_panel_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                              const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy);
void sp__f32_gemm_panel_avx2(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                             const void *x, size_t xs, int64_t n_tok, float *y, int64_t ldy);

/* avx512.c / avx512_kquants.c: built with AVX-512 F/BW/VL/DQ/VNNI/BF16.
 * has_vnni / has_bf16 say which optional extensions this CPU has. */
void sp__avx512_register(sp_cpu_kernels_t *k, bool has_vnni, bool has_bf16);
void sp__kquants_register_avx512(sp_cpu_kernels_t *k, bool has_vnni, bool has_bf16);
void sp__kquants2_register_avx512(sp_cpu_kernels_t *k);
/* avx512_kpanel.c: the VNNI row-panel gemm of Q2_K (decoded panels swept by the tokens);
 * registers nothing without VNNI. */
void sp__kpanels_register_avx512(sp_cpu_kernels_t *k, bool has_vnni);
/* amx.c: the AMX level's overrides of the AVX-512 (VNNI) table. */
void sp__amx_register(sp_cpu_kernels_t *k);
/* avx512_qgemm.c: Q8_0 / Q4_0 x Q8_0 row-panel gemm; only on CPUs with VNNI. */
void sp__avx512_qgemm_register(sp_cpu_kernels_t *k);
/* avx512_gemv.c: one-token (decode) Q4_0 / Q8_0 x Q8_0 products from the row layout, VNNI
 * only: y[r] = dot(row r, x) for r in [r0, r1). avx512_qgemm.c's gemm entries call them when
 * n_tok == 1. */
void sp__avx512_gemv_q4_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                          const void *x, float *y);
void sp__avx512_gemv_q8_0(int64_t n, const void *w, size_t ws, int64_t r0, int64_t r1,
                          const void *x, float *y);
/* The panels alone (avx512_qgemm.c), one token included, NULL for other types: the gemm
 * before the one-token kernel, for A/B runs of bench/decode_bench.c in one process. */
sp_gemm_fn sp__avx512_qgemm_panels(sp_type_t type);

/* neon.c (F32/F16/BF16, every quantised weight type with widening multiplies, the Q8_0 /
 * Q8_1 / Q8_K activation quantizers) and neon_dotprod.c (the integer products again with
 * SDOT, built with -march=armv8.2-a+dotprod): arm64 only, the level-1 and level-2 tables. */
void sp__neon_register(sp_cpu_kernels_t *k);
void sp__neon_dotprod_register(sp_cpu_kernels_t *k);
/* neon_attn.c: attention (F32/F16/Q8_0 caches), exp, RMSNorm, SwiGLU; base ARMv8-A. */
void sp__attn_register_neon(sp_cpu_kernels_t *k);

/* ref_attn.c, avx2_attn.c, avx512_attn.c: attention and element-wise ops. */
void sp__attn_register_ref(sp_cpu_kernels_t *k);
void sp__attn_register_avx2(sp_cpu_kernels_t *k);
void sp__attn_register_avx512(sp_cpu_kernels_t *k);

/*
 * The vector exp of avx2_attn.c and avx512_attn.c: e^x = 2^n e^r with
 * n = round(x log2 e), r = x - n ln2 (two-step, |r| <= ln2/2), and
 * e^r = 1 + r + r^2 P(r), P of degree 5 fitted (weighted least squares,
 * reweighted toward minimax: tools/exp_poly_fit.py) to
 * (e^r - 1 - r) / r^2. Model error 5e-11; with float rounding the whole exp
 * is within 1e-7 relative of expf for normal results. x is clamped to
 * [EXP_LO, EXP_HI]: below, e^x rounds to 0 (a denormal scale keeps the
 * results in between right); above, to +inf.
 */
#define SP_EXP_LO (-104.0f)
#define SP_EXP_HI 88.8f
#define SP_EXP_LOG2E 0x1.715476p+0f
#define SP_EXP_LN2_HI 0x1.62e4p-1f        /* few bits: n * LN2_HI is exact */
#define SP_EXP_LN2_LO 0x1.7f7d1cp-20f     /* ln 2 - LN2_HI */
#define SP_EXP_P0 0.5f
#define SP_EXP_P1 0x1.555554p-3f
#define SP_EXP_P2 0x1.55548ep-5f
#define SP_EXP_P3 0x1.11127p-7f
#define SP_EXP_P4 0x1.6d8cf8p-10f
#define SP_EXP_P5 0x1.9f08cp-13f

/* dispatch.c: what cpuid and XGETBV report (OS support for YMM/ZMM state included), or
 * on arm64 what getauxval(AT_HWCAP) reports. */
typedef struct sp_cpu_features {
    bool avx2;       /* AVX2 + FMA + F16C, YMM state enabled */
    bool avx_vnni;   /* AVX2 + AVX-VNNI (VEX VPDPBUSD on 256-bit registers) */
    bool avx512;     /* AVX-512 F/BW/VL/DQ, ZMM state enabled */
    bool avx512_vnni;
    bool avx512_bf16;
    bool amx_int8;   /* AMX tiles + INT8 (TDPBSSD...), XTILECFG/XTILEDATA enabled and the
                      * process granted the tile state (arch_prctl ARCH_REQ_XCOMP_PERM) */
    bool neon;       /* arm64: Advanced SIMD (always there) */
    bool dotprod;    /* arm64: SDOT/UDOT (HWCAP_ASIMDDP) */
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
