/*
 * test_f16panel.c - avx2_f16gemm.c, the AVX2 F16 (BF16, F32) x F32 gemm for many tokens: for
 * every pair the bits of the AVX2 vec_dot (avx2.c's 1x1 float tile, which test_kernels.c
 * holds to the float bound against the scalar reference), so the gemm is batch invariant:
 * token counts 1, 2, 3, 7, 8, 9, 33, 64, 130 (register-tile tails, chunks of 32 tokens with
 * tails), row counts and ranges that are not whole 4-row tiles or 32-row blocks (the 8-row
 * reductions of a 16-row block and the single ones after them), rows that end inside a
 * 128-element panel, and through the AVX2 table (which hands it calls of SP_F16_PANEL_MIN_TOK
 * tokens and up, and keeps rows of a length not a multiple of 8 on avx2.c's tiles). Weights
 * and activations carry zeros, large values and sign mixes.
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/kernels.h"

static uint64_t fp_rng;

static float
fp_rand(void) /* [-1, 1) */
{
    fp_rng ^= fp_rng << 13;
    fp_rng ^= fp_rng >> 7;
    fp_rng ^= fp_rng << 17;
    return (float)((double)(fp_rng >> 11) / 4503599627370496.0 - 1.0);
}

#define FP_MAX_TOKS 130

static void
fp_check_shape(const sp_cpu_kernels_t *k, sp_type_t type, int64_t n, int64_t rows,
               uint64_t seed)
{
    const size_t ws = sp_row_size(type, n), xs = sizeof(float) * (size_t)n;
    const sp_gemm_fn panel_fn = type == SP_TYPE_BF16  ? sp__bf16_gemm_panel_avx2
                                : type == SP_TYPE_F32 ? sp__f32_gemm_panel_avx2
                                                      : sp__f16_gemm_panel_avx2;
    const char *tn = sp_type_name(type);
    uint8_t *w = malloc(ws * (size_t)rows);
    float *x = malloc(xs * FP_MAX_TOKS), *f = malloc(sizeof(float) * (size_t)n);
    float *want = malloc(sizeof(float) * (size_t)(rows * FP_MAX_TOKS));
    ASSERT(w && x && f && want);
    fp_rng = seed * 0x9E3779B97F4A7C15ull + 7;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = (i + r) % 13 == 5 ? 0.0f : (i % 97 == 3 ? 300.0f : 0.1f) * fp_rand();
        ASSERT(sp_quantize_row(type, f, w + (size_t)r * ws, n));
    }
    for (int64_t i = 0; i < n * FP_MAX_TOKS; i++)
        x[i] = i % 17 == 2 ? 0.0f : (i % 211 == 9 ? -1e4f : 1.0f) * fp_rand();
    for (int64_t t = 0; t < FP_MAX_TOKS; t++)
        for (int64_t r = 0; r < rows; r++)
            k->vec_dot[type](n, &want[t * rows + r], w + (size_t)r * ws,
                                    (const uint8_t *)x + (size_t)t * xs);
    static const int64_t nts[] = {1, 2, 3, 7, 8, 9, 33, 64, 130};
    const int64_t ldy = rows + 3;
    float *y = malloc(sizeof(float) * (size_t)(ldy * FP_MAX_TOKS));
    ASSERT(y != NULL);
    for (size_t it = 0; it < sizeof nts / sizeof nts[0]; it++) {
        const int64_t nt = nts[it];
        const gemm_case_t table = {k->gemm[type], n, w, ws, x, xs, want, rows, 1, false};
        GEMM_CHECK_ASSERT(gemm_check_range(&table, 0, rows, nt, y, ldy, nt),
                          "%s avx2 table n=%lld rows %lld, %lld tokens", tn, (long long)n,
                          (long long)rows, (long long)nt);
        if (n % 8 != 0)
            continue; /* the panels take whole 8-element steps only */
        const gemm_case_t panel = {panel_fn, n, w, ws, x, xs, want, rows, 1, false};
        GEMM_CHECK_ASSERT(gemm_check_range(&panel, 0, rows, nt, y, ldy, nt),
                          "%s panel n=%lld rows %lld, %lld tokens", tn, (long long)n,
                          (long long)rows, (long long)nt);
        if (rows > 3) /* a range that starts and ends inside a tile */
            GEMM_CHECK_ASSERT(gemm_check_range(&panel, 1, rows - 2, nt, y, ldy, nt),
                              "%s panel n=%lld rows [1,%lld) of %lld, %lld tokens", tn,
                              (long long)n, (long long)(rows - 2), (long long)rows,
                              (long long)nt);
    }
    free(y);
    free(w);
    free(x);
    free(f);
    free(want);
}

TEST(f16panel_vec_dot_bits)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: the AVX2 F16 panels not tested");
    /* 8: one step; 136: a panel and a one-step tail; 2048: whole panels; 100: not whole
     * steps (the table's row tiles) */
    static const int64_t ns[] = {8, 136, 2048, 100};
    static const int64_t rowss[] = {1, 7, 8, 13, 37};
    static const sp_type_t types[] = {SP_TYPE_F16, SP_TYPE_BF16, SP_TYPE_F32};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
        for (size_t ir = 0; ir < sizeof rowss / sizeof rowss[0]; ir++)
            for (int ti = 0; ti < 3; ti++)
                fp_check_shape(k, types[ti], ns[in], rowss[ir], 13 * in + ir + 100 * (uint64_t)ti);
}
