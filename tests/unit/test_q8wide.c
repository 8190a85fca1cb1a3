/*
 * test_q8wide.c - avx2_q8gemm.c, the AVX2 packed Q8_0 gemm for many tokens: the scalar
 * reference's bits (ref.c's vec_dot on the original rows) for every token count of interest
 * (1, 2, 3, 7, 8, 9, 33, 64, 130: below and at the dispatch threshold, token chunks with
 * tails, several chunks), row counts and ranges that are not whole groups, rows long enough
 * that a chunk holds only a few tokens, and the extreme integer ranges (weights -128 / 127
 * against activations of +-127). The kernel is called directly (it takes any token count)
 * and through the AVX2 table, which hands it calls of 8 tokens and up (RPX_BY_TOKENS);
 * then the same for its AVX-VNNI form (avxvnni_q8gemm.c: unsigned quants, no sign step) and
 * the "avx2-vnni" table, which hands it calls of 3 tokens and up, where the CPU has AVX-VNNI
 * (a visible skip elsewhere).
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"
#include "kernels/kernels.h"

static uint64_t qw_rng;

static double
qw_uniform(void) /* (0, 1) */
{
    qw_rng ^= qw_rng << 13;
    qw_rng ^= qw_rng >> 7;
    qw_rng ^= qw_rng << 17;
    return ((double)(qw_rng >> 11) + 0.5) / 9007199254740992.0;
}

static float
qw_gauss(void)
{
    return (float)(sqrt(-2.0 * log(qw_uniform())) * cos(6.283185307179586 * qw_uniform()));
}

#define QW_MAX_TOKS 130

typedef struct {
    int64_t n, rows;
    uint8_t *w, *packed, *x;
    size_t rb, gb, xs;
    float *want; /* [t * rows + r] */
} qw_case_t;

/* extreme: every weight quant -128, 127 or -127 by row, activations +-1 (quantised to +-127),
 * alternating by token; else Gaussian rows (some activation blocks zero, one outlier). */
static void
qw_case_make(qw_case_t *c, int64_t n, int64_t rows, bool extreme, uint64_t seed)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    c->n = n;
    c->rows = rows;
    c->rb = sp_row_size(SP_TYPE_Q8_0, n);
    c->xs = sp_row_size(SP_TYPE_Q8_0, n);
    c->gb = sp_repack_group_bytes(SP_TYPE_Q8_0, n);
    c->w = malloc(c->rb * (size_t)rows);
    c->packed = malloc(sp_repack_bytes(SP_TYPE_Q8_0, n, rows));
    c->x = malloc(c->xs * QW_MAX_TOKS);
    c->want = malloc(sizeof(float) * (size_t)(rows * QW_MAX_TOKS));
    float *f = malloc(sizeof(float) * (size_t)n);
    ASSERT(c->w && c->packed && c->x && c->want && f);
    qw_rng = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = c->w + (size_t)r * c->rb;
        if (extreme) {
            for (int64_t b = 0; b < n / 32; b++) {
                const uint16_t d = (uint16_t)(0x3C00 + 64 * (r % 8) + b % 64);
                memcpy(row + b * 34, &d, 2);
                memset(row + b * 34 + 2, r % 3 == 0 ? 0x80 : r % 3 == 1 ? 0x7F : 0x81, 32);
            }
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            f[i] = (0.02f + 0.03f * (float)((i / 32 + r) % 5)) * qw_gauss();
        ASSERT(sp_quantize_row(SP_TYPE_Q8_0, f, row, n));
    }
    for (int64_t t = 0; t < QW_MAX_TOKS; t++) {
        for (int64_t i = 0; i < n; i++) {
            if (extreme)
                f[i] = t % 3 == 0 ? 1.0f : t % 3 == 1 ? -1.0f : (i % 2 ? 1.0f : -1.0f);
            else
                f[i] = ((i / 32 + t) % 11 == 4) ? 0.0f : qw_gauss();
        }
        if (t == 1 && !extreme)
            f[n / 2] = 50.0f;
        ref->from_float[SP_TYPE_Q8_0](f, c->x + (size_t)t * c->xs, n);
    }
    free(f);
    sp_repack_pack(SP_TYPE_Q8_0, n, c->w, c->rb, rows, 0, (rows + 7) / 8, c->packed);
    for (int64_t t = 0; t < QW_MAX_TOKS; t++)
        for (int64_t r = 0; r < rows; r++)
            ref->vec_dot[SP_TYPE_Q8_0](n, &c->want[t * rows + r], c->w + (size_t)r * c->rb,
                                       c->x + (size_t)t * c->xs);
}

static void
qw_case_free(qw_case_t *c)
{
    free(c->w);
    free(c->packed);
    free(c->x);
    free(c->want);
}

static void
qw_check(const char *what, sp_gemm_fn gemm, const qw_case_t *c, int64_t r0, int64_t r1,
         int64_t nt)
{
    const int64_t ldy = c->rows + 3;
    float *y = malloc(sizeof(float) * (size_t)(ldy * nt));
    ASSERT(y != NULL);
    const gemm_case_t gc = {gemm, c->n, c->packed, c->gb, c->x, c->xs, c->want, c->rows, 1, false};
    GEMM_CHECK_ASSERT(gemm_check_range(&gc, r0, r1, nt, y, ldy, nt),
                      "%s n=%lld rows [%lld,%lld) of %lld, %lld tokens", what, (long long)c->n,
                      (long long)r0, (long long)r1, (long long)c->rows, (long long)nt);
    free(y);
}

static void
qw_run(sp_gemm_fn wide, sp_gemm_fn table_gemm, bool extreme)
{
    /* n = 16384: a chunk holds 7 tokens (128 KiB of activations), so 9..130 tokens cross
     * chunks with tails; n = 288: 64 tokens a chunk, 130 tokens three chunks */
    static const int64_t ns[] = {32, 288, 2048, 16384};
    static const int64_t rowss[] = {1, 7, 8, 13, 37};
    static const int64_t nts[] = {1, 2, 3, 7, 8, 9, 33, 64, 130};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        for (size_t ir = 0; ir < sizeof rowss / sizeof rowss[0]; ir++) {
            const int64_t rows = rowss[ir];
            if (ns[in] == 16384 && rows > 13)
                continue; /* the long rows' cases stay small (scalar reference time) */
            qw_case_t c;
            qw_case_make(&c, ns[in], rows, extreme, 31 * in + ir);
            for (size_t it = 0; it < sizeof nts / sizeof nts[0]; it++) {
                qw_check("wide", wide, &c, 0, rows, nts[it]);
                qw_check("table", table_gemm, &c, 0, rows, nts[it]);
            }
            if (rows > 3) { /* ranges that start and end inside a group */
                qw_check("wide", wide, &c, 3, rows - 1, 9);
                qw_check("wide", wide, &c, rows / 2, rows / 2 + 1, 33);
            }
            qw_case_free(&c);
        }
    }
}

TEST(q8wide_reference_bits)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: the AVX2 Q8_0 gemm not tested");
    ASSERT(k->repack_gemm[SP_TYPE_Q8_0] != NULL);
    qw_run(sp__repack_q8_0_gemm_wide_avx2, k->repack_gemm[SP_TYPE_Q8_0], false);
}

TEST(q8wide_extreme_values)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: the AVX2 Q8_0 gemm not tested");
    qw_run(sp__repack_q8_0_gemm_wide_avx2, k->repack_gemm[SP_TYPE_Q8_0], true);
}

/* The same cases for the AVX-VNNI form (VPDPBUSD; avxvnni_q8gemm.c) and the "avx2-vnni"
 * table that hands it the calls of 3 tokens and up: the reference's bits as well. */
TEST(q8wide_avx_vnni_reference_bits)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_avx2_vnni();
    if (k == NULL)
        SKIP("this CPU has no AVX-VNNI: the avx2-vnni Q8_0 gemm not tested");
    ASSERT(strcmp(k->name, "avx2-vnni") == 0 && k->level == SP_CPU_AVX2);
    const sp_cpu_kernels_t *avx2 = sp_cpu_kernels_for(SP_CPU_AVX2);
    ASSERT(k->repack_layout[SP_TYPE_Q8_0] == avx2->repack_layout[SP_TYPE_Q8_0]);
    qw_run(sp__repack_q8_0_gemm_wide_avxvnni, k->repack_gemm[SP_TYPE_Q8_0], false);
}

TEST(q8wide_avx_vnni_extreme_values)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_avx2_vnni();
    if (k == NULL)
        SKIP("this CPU has no AVX-VNNI: the avx2-vnni Q8_0 gemm not tested");
    qw_run(sp__repack_q8_0_gemm_wide_avxvnni, k->repack_gemm[SP_TYPE_Q8_0], true);
}
