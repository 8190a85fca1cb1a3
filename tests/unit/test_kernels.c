/*
 * test_kernels.c - CPU kernels (F32, F16, BF16, Q8_0, Q4_0) at every level
 * this CPU has, against the scalar reference, and the gemm tiles against
 * vec_dot bit for bit (batch invariance).
 *
 * Tolerances, with u = 2^-24 (float unit roundoff):
 *   Float weights: products are exact (inside the FMA, or in the reference's
 *   double), so a SIMD level with L >= 8 lanes makes at most n/L rounded adds
 *   per lane plus log2(L) <= 4 in the final horizontal sum; the reference
 *   sums in double and rounds once. |simd - ref| <= (n/8 + 6) u sum|w x|.
 *   Quantized weights: each block's integer dot is exact at every level and
 *   d_w * d_x is exact (two halves); the reference rounds twice per block
 *   (product, add), a SIMD lane once per block (the FMA) plus the horizontal
 *   sum, so |simd - ref| <= (2 nb + 8) u sum|w' x'| over the dequantized
 *   values w', x' (nb = blocks). The AVX-512 VNNI Q8_0 / Q4_0 kernels keep the
 *   reference's order (product, then add, per block) and must match it with ==.
 * Gemm tiles and vec_dot of the same level are compared with ==.
 */
#include "test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/kernels.h"

#define U 0x1p-24

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state;

static void
rng_seed(uint64_t s)
{
    rng_state = s ? s : 1;
}

static uint32_t
rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Uniform in [-1, 1), scaled per 32-element stretch so blocks see different magnitudes. */
static void
fill_random(float *x, int64_t n)
{
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) {
            scale = ldexpf(1.0f, (int)(rng_u32() % 9) - 4);
        }
        x[i] = scale * ((float)(rng_u32() & 0xffffff) * 0x1p-23f - 1.0f);
    }
}

static const sp_type_t wtypes[] = {SP_TYPE_F32, SP_TYPE_F16, SP_TYPE_BF16, SP_TYPE_Q8_0,
                                   SP_TYPE_Q4_0};
#define N_WTYPES (int)(sizeof(wtypes) / sizeof(wtypes[0]))

static bool
is_quant(sp_type_t t)
{
    return t == SP_TYPE_Q8_0 || t == SP_TYPE_Q4_0;
}

/* Every table to test: the levels this CPU has, plus AVX-512 without VNNI. */
typedef struct {
    const sp_cpu_kernels_t *k;
    char label[40];
} level_entry;

static sp_cpu_kernels_t novnni_table;

static int
levels(level_entry out[SP_CPU_TOP + 2])
{
    int n = 0;
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL) {
            fprintf(stderr, "  skipped level %d: this CPU lacks it\n", l);
            continue;
        }
        out[n].k = k;
        snprintf(out[n].label, sizeof out[n].label, "%s", k->name);
        n++;
    }
    const sp_cpu_features_t *f = sp__cpu_features();
    if (f->avx512 && f->avx512_vnni) {
        sp__cpu_build_table(&novnni_table, SP_CPU_AVX512, false, false);
        out[n].k = &novnni_table;
        snprintf(out[n].label, sizeof out[n].label, "%s (forced)", novnni_table.name);
        n++;
    }
    return n;
}

/* One weight matrix and activation set, in the types a table wants. */
typedef struct {
    int64_t n, rows, toks;
    size_t w_stride, x_stride;
    uint8_t *w, *x;      /* quantized weights, converted activations */
    float *wf, *xf;      /* the float inputs */
    float *wd, *xd;      /* dequantized w and x as the kernels see them */
} problem;

static void
problem_free(problem *p)
{
    sp_free(p->w);
    sp_free(p->x);
    sp_free(p->wf);
    sp_free(p->xf);
    sp_free(p->wd);
    sp_free(p->xd);
}

static void
problem_make(problem *p, const sp_cpu_kernels_t *k, sp_type_t wt, int64_t n, int64_t rows,
             int64_t toks, uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    sp_type_t xt = k->vec_dot_type[wt];
    p->n = n;
    p->rows = rows;
    p->toks = toks;
    p->w_stride = sp_row_size(wt, n);
    p->x_stride = sp_row_size(xt, n);
    p->w = sp_malloc(p->w_stride * (size_t)rows);
    p->x = sp_malloc(p->x_stride * (size_t)toks);
    p->wf = sp_malloc(sizeof(float) * (size_t)(n * rows));
    p->xf = sp_malloc(sizeof(float) * (size_t)(n * toks));
    p->wd = sp_malloc(sizeof(float) * (size_t)(n * rows));
    p->xd = sp_malloc(sizeof(float) * (size_t)(n * toks));
    ASSERT(p->w && p->x && p->wf && p->xf && p->wd && p->xd);
    rng_seed(seed);
    fill_random(p->wf, n * rows);
    fill_random(p->xf, n * toks);
    for (int64_t r = 0; r < rows; r++) {
        ASSERT(sp_quantize_row(wt, p->wf + r * n, p->w + (size_t)r * p->w_stride, n));
        ASSERT(sp_dequantize_row(wt, p->w + (size_t)r * p->w_stride, p->wd + r * n, n));
    }
    for (int64_t t = 0; t < toks; t++) {
        k->from_float[xt](p->xf + t * n, p->x + (size_t)t * p->x_stride, n);
        ASSERT(sp_dequantize_row(xt, p->x + (size_t)t * p->x_stride, p->xd + t * n, n));
    }
}

/* sum |w' x'| over the values the kernel multiplies; the error bounds scale with it */
static double
abs_dot(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s += fabs((double)a[i] * (double)b[i]);
    }
    return s;
}

static double
exact_dot(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * (double)b[i];
    }
    return s;
}

static double
tolerance(sp_type_t wt, int64_t n, double absdot)
{
    if (is_quant(wt)) {
        return (2.0 * (double)(n / 32) + 8.0) * U * absdot;
    }
    return ((double)n / 8.0 + 6.0) * U * absdot;
}

/* ---- half and bfloat ------------------------------------------------------ */

TEST(kernels_fp16_conversions)
{
    ASSERT_EQ(sp_fp32_to_fp16(1.0f), 0x3c00);
    ASSERT_EQ(sp_fp32_to_fp16(-2.0f), 0xc000);
    ASSERT_EQ(sp_fp32_to_fp16(65504.0f), 0x7bff);
    ASSERT_EQ(sp_fp32_to_fp16(65520.0f), 0x7c00);      /* rounds up to inf */
    ASSERT_EQ(sp_fp32_to_fp16(0x1p-24f), 0x0001);      /* smallest subnormal */
    ASSERT_EQ(sp_fp32_to_fp16(0x1p-25f), 0x0000);      /* tie -> even (zero) */
    ASSERT_EQ(sp_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00); /* tie -> even */
    ASSERT_EQ(sp_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
    ASSERT(isnan(sp_fp16_to_fp32(sp_fp32_to_fp16(NAN))));
    /* every half survives half -> float -> half, and the SIMD converters agree */
    static uint16_t all[65536];
    static float ref[65536], got[65536];
    for (int i = 0; i < 65536; i++) {
        all[i] = (uint16_t)i;
        ref[i] = sp_fp16_to_fp32((sp_fp16_t)i);
        if (!isnan(ref[i])) {
            ASSERT_EQ(sp_fp32_to_fp16(ref[i]), i);
        }
    }
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        for (int64_t n = 65536; n >= 65536 - 15; n -= 5) { /* odd tails too */
            memset(got, 0, sizeof got);
            lv[l].k->to_float[SP_TYPE_F16](all, got, n);
            for (int64_t i = 0; i < n; i++) {
                /* NaNs stay NaN; hardware quiets signalling ones, so no bit compare */
                bool same = isnan(ref[i]) ? isnan(got[i]) : memcmp(&ref[i], &got[i], 4) == 0;
                if (!same) {
                    SP_TEST_FAIL("%s f16 to_float %04x: %g vs %g", lv[l].label, (unsigned)i,
                                 ref[i], got[i]);
                }
            }
        }
    }
}

TEST(kernels_bf16_conversions)
{
    ASSERT_EQ(sp_fp32_to_bf16(1.0f), 0x3f80);
    ASSERT_EQ(sp_fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);  /* tie -> even */
    ASSERT_EQ(sp_fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    ASSERT(isnan(sp_bf16_to_fp32(sp_fp32_to_bf16(NAN))));
    static uint16_t all[65536];
    static float ref[65536], got[65536];
    for (int i = 0; i < 65536; i++) {
        all[i] = (uint16_t)i;
        ref[i] = sp_bf16_to_fp32((sp_bf16_t)i);
    }
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        lv[l].k->to_float[SP_TYPE_BF16](all, got, 65536 - 3);
        ASSERT(memcmp(ref, got, sizeof(float) * (65536 - 3)) == 0);
    }
}

/* ---- quantizers ----------------------------------------------------------- */

TEST(kernels_q4_0_layout)
{
    /* low nibble = element j, high nibble = element j + 16, value (q - 8) * d */
    sp_block_q4_0 b;
    b.d = sp_fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; j++) {
        b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    }
    float y[32];
    ASSERT(sp_dequantize_row(SP_TYPE_Q4_0, &b, y, 32));
    for (int j = 0; j < 16; j++) {
        ASSERT_NEAR(y[j], (j - 8) * 0.5, 0);
        ASSERT_NEAR(y[j + 16], (7 - j) * 0.5, 0);
    }
    /* the largest-magnitude element maps to q = 0 (GGUF's d = max / -8) */
    float x[32] = {0};
    x[5] = -3.0f;
    x[20] = 1.0f;
    ASSERT(sp_quantize_row(SP_TYPE_Q4_0, x, &b, 32));
    ASSERT_NEAR(sp_fp16_to_fp32(b.d), 3.0 / 8.0, 0);
    ASSERT_EQ(b.qs[5] & 0x0f, 0);
    ASSERT_EQ(b.qs[4] >> 4, 8 + 3); /* element 20: 1 / 0.375 + 8.5 = 11.17 -> 11 */
}

TEST(kernels_quantize_round_trip)
{
    const int64_t n = 4096;
    float *x = sp_malloc(sizeof(float) * n), *y = sp_malloc(sizeof(float) * n);
    uint8_t *q = sp_malloc(sp_row_size(SP_TYPE_F32, n));
    ASSERT(x && y && q);
    rng_seed(7);
    fill_random(x, n);
    x[0] = 0.0f; /* an all-zero block, and a tiny one */
    for (int i = 0; i < 32; i++) {
        x[i] = 0.0f;
        x[32 + i] = 1e-30f * (float)i;
    }
    /* Q8_0: |x - q d| <= d / 2 per element (d the stored half) */
    ASSERT(sp_quantize_row(SP_TYPE_Q8_0, x, q, n));
    ASSERT(sp_dequantize_row(SP_TYPE_Q8_0, q, y, n));
    const sp_block_q8_0 *b8 = (const sp_block_q8_0 *)q;
    for (int64_t i = 0; i < n; i++) {
        double d = sp_fp16_to_fp32(b8[i / 32].d);
        double amax = 0;
        for (int j = 0; j < 32; j++) {
            amax = fmax(amax, fabs(x[i / 32 * 32 + j]));
        }
        /* d == 0 when amax / 127 underflows a half: then every x is that small */
        double bound = d > 0 ? d / 2 * (1 + 1e-6) : amax;
        if (fabs((double)x[i] - y[i]) > bound) {
            SP_TEST_FAIL("q8_0 elem %" PRId64 ": %g -> %g (d %g)", i, x[i], y[i], d);
        }
    }
    /* Q4_0: |err| <= d / 2, except x / d in [7.5, 8] (the side opposite the
     * max), clamped to q = 15: there |err| <= d (plus the half rounding of d) */
    ASSERT(sp_quantize_row(SP_TYPE_Q4_0, x, q, n));
    ASSERT(sp_dequantize_row(SP_TYPE_Q4_0, q, y, n));
    const sp_block_q4_0 *b4 = (const sp_block_q4_0 *)q;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(sp_fp16_to_fp32(b4[i / 32].d));
        double e = fabs((double)x[i] - y[i]);
        double bound = d / 2 * (1 + 1e-6);
        if (d > 0 && fabs(x[i] / sp_fp16_to_fp32(b4[i / 32].d)) >= 7.5) {
            bound = d * (1 + 1e-3);
        }
        if (d == 0) {
            bound = 1e-7; /* only the tiny blocks */
        }
        if (e > bound) {
            SP_TEST_FAIL("q4_0 elem %" PRId64 ": %g -> %g (d %g)", i, x[i], y[i], d);
        }
    }
    /* F16 / BF16 round to nearest: half an ulp */
    ASSERT(sp_quantize_row(SP_TYPE_F16, x, q, n));
    ASSERT(sp_dequantize_row(SP_TYPE_F16, q, y, n));
    for (int64_t i = 64; i < n; i++) {
        ASSERT(fabs((double)x[i] - y[i]) <= fabs((double)x[i]) * 0x1p-11 + 0x1p-25);
    }
    ASSERT(sp_quantize_row(SP_TYPE_BF16, x, q, n));
    ASSERT(sp_dequantize_row(SP_TYPE_BF16, q, y, n));
    for (int64_t i = 0; i < n; i++) {
        ASSERT(fabs((double)x[i] - y[i]) <= fabs((double)x[i]) * 0x1p-8);
    }
    ASSERT(!sp_quantize_row(SP_TYPE_I32, x, q, 32));
    ASSERT(!sp_dequantize_row(SP_TYPE_I32, q, y, 32));
    sp_free(x);
    sp_free(y);
    sp_free(q);
}

/*
 * The activations of Q8_0 / Q4_0 products are quantized by llama.cpp's rule
 * (its x86 activation quantizer), written here from its definition and apart
 * from ref.c: d = amax / 127 in float, stored as half; q = x * (127 / amax)
 * in float, rounded half to even. Where the stored half is 0 the engine
 * writes q = 0 (the block adds exactly 0 to a product either way), so the
 * bytes are compared where d != 0.
 */
static int
round_half_even(float v)
{
    double r = floor((double)v), f = (double)v - r; /* exact: |v| <= 2^23 here */
    if (f > 0.5 || (f == 0.5 && fmod(r, 2.0) != 0.0)) {
        r += 1.0;
    }
    return (int)r;
}

static void
llama_q8_0(const float *x, sp_block_q8_0 *b, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (fabsf(x[i * 32 + j]) > amax) {
                amax = fabsf(x[i * 32 + j]);
            }
        }
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        b[i].d = sp_fp32_to_fp16(d);
        for (int j = 0; j < 32; j++) {
            const float v = x[i * 32 + j] * id;
            b[i].qs[j] = (int8_t)(isfinite(v) ? round_half_even(fmaxf(-127.0f, fminf(127.0f, v)))
                                              : 0);
        }
    }
}

/* Activation rows that hit every branch: random blocks of many magnitudes,
 * exact ties of x * 127 / amax (amax = 127, so x * id = x), a block whose
 * scale rounds in half (amax = 100: x / half(d) and x * 127 / amax differ),
 * a zero block, a block below half's range, and one NaN and one inf block. */
#define ACT_BLOCKS 67
static void
act_rows(float *x)
{
    rng_seed(11);
    fill_random(x, 32 * ACT_BLOCKS);
    for (int j = 0; j < 32; j++) {
        x[32 + j] = (float)(j - 16) + 0.5f; /* .5 ties: to even */
        x[64 + j] = 0.0f;
        x[96 + j] = 1e-30f * (float)j;
        x[128 + j] = 100.0f * ((float)j / 31.0f) - 50.0f;
    }
    x[32] = 127.0f;
    x[128] = 100.0f;
    x[160 + 5] = NAN;
    x[192 + 7] = INFINITY;
}

TEST(kernels_q8_0_activations_every_level_equal_reference)
{
    const int64_t n = 32 * ACT_BLOCKS;
    float *x = sp_malloc(sizeof(float) * n);
    sp_block_q8_0 *want = sp_malloc(sizeof(sp_block_q8_0) * ACT_BLOCKS);
    sp_block_q8_0 *got = sp_malloc(sizeof(sp_block_q8_0) * ACT_BLOCKS);
    ASSERT(x && want && got);
    act_rows(x);
    sp_cpu_kernels_ref()->from_float[SP_TYPE_Q8_0](x, want, n);
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        memset(got, 0x55, sizeof(sp_block_q8_0) * ACT_BLOCKS);
        lv[l].k->from_float[SP_TYPE_Q8_0](x, got, n);
        for (int b = 0; b < ACT_BLOCKS; b++) {
            if (memcmp(&want[b], &got[b], sizeof(sp_block_q8_0)) != 0) {
                SP_TEST_FAIL("%s: q8_0 activation block %d differs from the scalar reference",
                             lv[l].label, b);
            }
        }
    }
    sp_free(x);
    sp_free(want);
    sp_free(got);
}

TEST(kernels_q8_0_activations_follow_llama_rule)
{
    const int64_t n = 32 * ACT_BLOCKS;
    float *x = sp_malloc(sizeof(float) * n);
    sp_block_q8_0 *want = sp_malloc(sizeof(sp_block_q8_0) * ACT_BLOCKS);
    sp_block_q8_0 *got = sp_malloc(sizeof(sp_block_q8_0) * ACT_BLOCKS);
    ASSERT(x && want && got);
    act_rows(x);
    llama_q8_0(x, want, n);
    /* the ties land on even: 0.5 -> 0, 1.5 -> 2, -0.5 -> 0, -1.5 -> -2 */
    ASSERT_EQ(want[1].qs[16], 0);
    ASSERT_EQ(want[1].qs[17], 2);
    ASSERT_EQ(want[1].qs[15], 0);
    ASSERT_EQ(want[1].qs[14], -2);
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        lv[l].k->from_float[SP_TYPE_Q8_0](x, got, n);
        for (int b = 0; b < ACT_BLOCKS; b++) {
            if (b == 5 || b == 6) {
                continue; /* NaN / inf: the engine's own clamp, not llama.cpp's */
            }
            if (want[b].d != got[b].d ||
                (sp_fp16_to_fp32(want[b].d) != 0.0f &&
                 memcmp(want[b].qs, got[b].qs, sizeof want[b].qs) != 0)) {
                SP_TEST_FAIL("%s: q8_0 activation block %d is not llama.cpp's", lv[l].label, b);
            }
        }
    }
    sp_free(x);
    sp_free(want);
    sp_free(got);
}

/* Q8_0 and Q4_0 weights times an activation row, at every level, against the
 * exact (double) product of the stored weights and the activation as
 * llama.cpp quantizes it: the integer block dots are exact, so only the
 * float sums differ, within tolerance() (the header's (2 nb + 8) u sum|w' x'|). */
TEST(kernels_q_products_match_llama_activations)
{
    const int64_t n = 32 * ACT_BLOCKS;
    float *x = sp_malloc(sizeof(float) * n), *xd = sp_malloc(sizeof(float) * n);
    float *wf = sp_malloc(sizeof(float) * n), *wd = sp_malloc(sizeof(float) * n);
    sp_block_q8_0 *xl = sp_malloc(sizeof(sp_block_q8_0) * ACT_BLOCKS);
    sp_block_q8_0 *xq = sp_malloc(sizeof(sp_block_q8_0) * ACT_BLOCKS);
    uint8_t *w = sp_malloc(sp_row_size(SP_TYPE_Q8_0, n));
    ASSERT(x && xd && wf && wd && xl && xq && w);
    act_rows(x);
    for (int j = 0; j < 64; j++) {
        x[160 + j] = 0.25f * (float)(j % 7) - 0.75f; /* finite here: a product needs it */
    }
    llama_q8_0(x, xl, n);
    ASSERT(sp_dequantize_row(SP_TYPE_Q8_0, xl, xd, n));
    rng_seed(12);
    fill_random(wf, n);
    static const sp_type_t qt[] = {SP_TYPE_Q8_0, SP_TYPE_Q4_0};
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int t = 0; t < 2; t++) {
        ASSERT(sp_quantize_row(qt[t], wf, w, n));
        ASSERT(sp_dequantize_row(qt[t], w, wd, n));
        const double want = exact_dot(wd, xd, n);
        const double tol = tolerance(qt[t], n, abs_dot(wd, xd, n));
        for (int l = 0; l < nl; l++) {
            lv[l].k->from_float[SP_TYPE_Q8_0](x, xq, n);
            float got;
            lv[l].k->vec_dot[qt[t]](n, &got, w, xq);
            if (!(fabs((double)got - want) <= tol)) {
                SP_TEST_FAIL("%s %s: %.9g vs llama.cpp's activations %.9g (tol %.3g)",
                             lv[l].label, sp_type_name(qt[t]), got, want, tol);
            }
        }
    }
    sp_free(x);
    sp_free(xd);
    sp_free(wf);
    sp_free(wd);
    sp_free(xl);
    sp_free(xq);
    sp_free(w);
}

/* ---- dot products ----------------------------------------------------------- */

TEST(kernels_vec_dot_vs_reference)
{
    static const int64_t qlens[] = {32, 64, 96, 160, 4096, 4128};
    static const int64_t flens[] = {1, 7, 16, 17, 33, 100, 1000, 4096, 4103};
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int ti = 0; ti < N_WTYPES; ti++) {
        sp_type_t wt = wtypes[ti];
        const int64_t *lens = is_quant(wt) ? qlens : flens;
        int nlen = is_quant(wt) ? 6 : 9;
        for (int li = 0; li < nlen; li++) {
            int64_t n = lens[li];
            /* reference: against the exact dot of what it multiplies */
            problem p;
            problem_make(&p, ref, wt, n, 3, 2, 1000 + (uint64_t)(ti * 31 + li));
            for (int r = 0; r < 3; r++) {
                for (int t = 0; t < 2; t++) {
                    float s;
                    ref->vec_dot[wt](n, &s, p.w + r * p.w_stride, p.x + t * p.x_stride);
                    double ad = abs_dot(p.wd + r * n, p.xd + t * n, n);
                    ASSERT_NEAR(s, exact_dot(p.wd + r * n, p.xd + t * n, n),
                                tolerance(wt, n, ad) / 2 + 1e-30);
                }
            }
            problem_free(&p);
            for (int l = 0; l < nl; l++) {
                const sp_cpu_kernels_t *k = lv[l].k;
                ASSERT(k->vec_dot[wt] != NULL);
                problem_make(&p, k, wt, n, 3, 2, 2000 + (uint64_t)(ti * 31 + li));
                for (int r = 0; r < 3; r++) {
                    for (int t = 0; t < 2; t++) {
                        float got, want;
                        k->vec_dot[wt](n, &got, p.w + r * p.w_stride, p.x + t * p.x_stride);
                        ref->vec_dot[wt](n, &want, p.w + r * p.w_stride, p.x + t * p.x_stride);
                        double tol = tolerance(wt, n, abs_dot(p.wd + r * n, p.xd + t * n, n));
                        if (!(fabs((double)got - want) <= tol + 1e-30)) {
                            SP_TEST_FAIL("%s %s n=%" PRId64 ": %.9g vs ref %.9g (tol %g)",
                                         lv[l].label, sp_type_name(wt), n, got, want, tol);
                        }
                    }
                }
                problem_free(&p);
            }
        }
    }
}

/* Extreme bytes: weights of -128 (legal in a file, never produced by our
 * quantizer) and activations of +-127, with unit scales, so every level must
 * give the exact integer answer. */
TEST(kernels_q8_0_extreme_bytes)
{
    sp_block_q8_0 w[4], x[4];
    int64_t want = 0;
    for (int b = 0; b < 4; b++) {
        w[b].d = x[b].d = sp_fp32_to_fp16(1.0f);
        for (int j = 0; j < 32; j++) {
            w[b].qs[j] = (int8_t)(j % 3 == 0 ? -128 : 127);
            x[b].qs[j] = (int8_t)(j % 2 == 0 ? -127 : 127);
            want += (int64_t)w[b].qs[j] * x[b].qs[j];
        }
    }
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        for (int nb = 1; nb <= 4; nb++) {
            int64_t wnb = 0;
            for (int b = 0; b < nb; b++) {
                for (int j = 0; j < 32; j++) {
                    wnb += (int64_t)w[b].qs[j] * x[b].qs[j];
                }
            }
            float s;
            lv[l].k->vec_dot[SP_TYPE_Q8_0](32 * nb, &s, w, x);
            if ((double)s != (double)wnb) {
                SP_TEST_FAIL("%s nb=%d: %.9g vs %" PRId64, lv[l].label, nb, s, wnb);
            }
        }
    }
    (void)want;
}

static void
check_gemm(const level_entry *le, sp_type_t wt, int64_t n, uint64_t seed)
{
    static const int64_t toks[] = {1, 2, 3, 5, 8, 17};
    static const int64_t ranges[][2] = {{0, 13}, {3, 10}, {5, 6}, {1, 12}, {0, 4}};
    const sp_cpu_kernels_t *k = le->k;
    const int64_t rows = 13, ldy = 16;
    problem p;
    problem_make(&p, k, wt, n, rows, 17, seed);
    float *dots = sp_malloc(sizeof(float) * (size_t)(rows * 17));
    float *y = sp_malloc(sizeof(float) * (size_t)(ldy * 17));
    ASSERT(dots && y);
    for (int64_t t = 0; t < 17; t++) {
        for (int64_t r = 0; r < rows; r++) {
            k->vec_dot[wt](n, &dots[t * rows + r], p.w + r * p.w_stride, p.x + t * p.x_stride);
        }
    }
    for (int ti = 0; ti < 6; ti++) {
        for (int ri = 0; ri < 5; ri++) {
            int64_t r0 = ranges[ri][0], r1 = ranges[ri][1], nt = toks[ti];
            for (int64_t i = 0; i < ldy * 17; i++) {
                y[i] = -12345.0f; /* sentinel: nothing outside the range is written */
            }
            sp_cpu_gemm(k, wt, n, p.w, p.w_stride, r0, r1, p.x, p.x_stride, nt, y, ldy);
            for (int64_t t = 0; t < 17; t++) {
                for (int64_t r = 0; r < ldy; r++) {
                    float got = y[t * ldy + r];
                    bool inside = t < nt && r >= r0 && r < r1;
                    float want = inside ? dots[t * rows + r] : -12345.0f;
                    if (memcmp(&got, &want, sizeof(float)) != 0) {
                        SP_TEST_FAIL("%s %s n=%" PRId64 " rows [%" PRId64 ",%" PRId64
                                     ") n_tok=%" PRId64 ": y[t=%" PRId64 ", r=%" PRId64
                                     "] = %.9g, vec_dot %.9g",
                                     le->label, sp_type_name(wt), n, r0, r1, nt, t, r, got,
                                     want);
                    }
                }
            }
        }
    }
    sp_free(dots);
    sp_free(y);
    problem_free(&p);
}

TEST(kernels_gemm_is_batch_invariant)
{
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        for (int ti = 0; ti < N_WTYPES; ti++) {
            sp_type_t wt = wtypes[ti];
            if (is_quant(wt)) {
                check_gemm(&lv[l], wt, 96, 3);   /* odd block count */
                check_gemm(&lv[l], wt, 1056, 4); /* 33 blocks */
            } else {
                check_gemm(&lv[l], wt, 1000, 5);
                check_gemm(&lv[l], wt, 37, 6);
            }
        }
    }
}

/*
 * Shapes that reach every path of the tiled products: more rows than one
 * 16-row panel plus a ragged one, more tokens than a token chunk (128) with a
 * ragged tile, few-token calls (the decode path), and more blocks than one K
 * chunk (64). Each call's results are compared with == against `want`
 * (vec_dot of the same table, or of the reference where a level promises its
 * bits), and nothing outside the rows and tokens asked for may be written.
 */
static void
check_gemm_shapes(const char *label, const sp_cpu_kernels_t *k, const sp_cpu_kernels_t *want_k,
                  sp_type_t wt, int64_t n, int64_t rows, int64_t toks, uint64_t seed)
{
    static const int64_t calls[][3] = {{0, 1, 133}, {5, 30, 133}, {0, 1, 1},  {3, 20, 4},
                                       {16, 1, 7},  {1, 36, 129}, {0, 1, 2},  {7, 8, 3}};
    const int64_t ldy = rows + 3;
    problem p;
    problem_make(&p, k, wt, n, rows, toks, seed);
    float *dots = sp_malloc(sizeof(float) * (size_t)(rows * toks));
    float *y = sp_malloc(sizeof(float) * (size_t)(ldy * toks));
    ASSERT(dots && y);
    for (int64_t t = 0; t < toks; t++) {
        for (int64_t r = 0; r < rows; r++) {
            want_k->vec_dot[wt](n, &dots[t * rows + r], p.w + r * p.w_stride,
                                p.x + t * p.x_stride);
        }
    }
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        /* r1 == 1 stands for all rows; clip the rest to the problem */
        int64_t r0 = calls[c][0] < rows ? calls[c][0] : 0;
        int64_t r1 = calls[c][1] == 1 ? rows : (calls[c][1] < rows ? calls[c][1] : rows);
        int64_t nt = calls[c][2] < toks ? calls[c][2] : toks;
        for (int64_t i = 0; i < ldy * toks; i++) {
            y[i] = -12345.0f;
        }
        sp_cpu_gemm(k, wt, n, p.w, p.w_stride, r0, r1, p.x, p.x_stride, nt, y, ldy);
        for (int64_t t = 0; t < toks; t++) {
            for (int64_t r = 0; r < ldy; r++) {
                float got = y[t * ldy + r];
                bool inside = t < nt && r >= r0 && r < r1;
                float want = inside ? dots[t * rows + r] : -12345.0f;
                if (memcmp(&got, &want, sizeof(float)) != 0) {
                    SP_TEST_FAIL("%s %s n=%" PRId64 " rows [%" PRId64 ",%" PRId64
                                 ") n_tok=%" PRId64 ": y[t=%" PRId64 ", r=%" PRId64
                                 "] = %.9g, want %.9g",
                                 label, sp_type_name(wt), n, r0, r1, nt, t, r, got, want);
                }
            }
        }
    }
    sp_free(dots);
    sp_free(y);
    problem_free(&p);
}

TEST(kernels_gemm_large_shapes)
{
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        for (int ti = 0; ti < N_WTYPES; ti++) {
            /* 65 blocks: two K chunks, the second of one block */
            check_gemm_shapes(lv[l].label, lv[l].k, lv[l].k, wtypes[ti], 2080, 21, 133,
                              40 + (uint64_t)ti);
        }
    }
}

/*
 * Few tokens (the decode path: wide one-token tiles such as AVX2's 4-row float tiles of one and
 * two tokens and the AVX-512 one-token Q4_0 / Q8_0 kernels) over row counts around the tile
 * sizes and row ranges that start and end inside a tile, 1 row included: 1, 2, 3 and 11
 * tokens (odd counts leave a one-token tile after the pairs; 11 is the last below AVX2's F16
 * panels). Each result must be vec_dot's bits, and nothing outside the rows and tokens asked
 * for may be written. The float lengths leave an 8- and a 16-lane tail.
 */
TEST(kernels_one_token_row_ranges)
{
    enum { ROWS = 67, LDY = 70, TOKS = 11 };
    static const int64_t row_counts[] = {1, 2, 7, 8, 9, 15, 17, 33, 67};
    static const int64_t tok_counts[] = {1, 2, 3, 11};
    level_entry lv[SP_CPU_TOP + 2];
    int nl = levels(lv);
    for (int l = 0; l < nl; l++) {
        const sp_cpu_kernels_t *k = lv[l].k;
        for (int ti = 0; ti < N_WTYPES; ti++) {
            const sp_type_t wt = wtypes[ti];
            const int64_t n = is_quant(wt) ? 160 : 203;
            problem p;
            problem_make(&p, k, wt, n, ROWS, TOKS, 70 + (uint64_t)ti);
            float dots[TOKS][ROWS], y[TOKS * LDY];
            for (int64_t t = 0; t < TOKS; t++) {
                for (int64_t r = 0; r < ROWS; r++) {
                    k->vec_dot[wt](n, &dots[t][r], p.w + r * p.w_stride, p.x + t * p.x_stride);
                }
            }
            for (size_t ci = 0; ci < sizeof row_counts / sizeof row_counts[0]; ci++) {
                const int64_t rows = row_counts[ci];
                const int64_t rg[][2] = {{0, rows},
                                         {rows / 2, rows},
                                         {rows - 1, rows},
                                         {rows > 2 ? 1 : 0, rows > 2 ? rows - 1 : rows}};
                for (int ri = 0; ri < 4; ri++) {
                    for (size_t tc = 0; tc < sizeof tok_counts / sizeof tok_counts[0]; tc++) {
                        const int64_t r0 = rg[ri][0], r1 = rg[ri][1], nt = tok_counts[tc];
                        for (int i = 0; i < TOKS * LDY; i++) {
                            y[i] = -12345.0f;
                        }
                        sp_cpu_gemm(k, wt, n, p.w, p.w_stride, r0, r1, p.x, p.x_stride, nt, y,
                                    LDY);
                        for (int64_t t = 0; t < TOKS; t++) {
                            for (int64_t r = 0; r < LDY; r++) {
                                const bool inside = t < nt && r >= r0 && r < r1;
                                const float want = inside ? dots[t][r] : -12345.0f;
                                if (memcmp(&y[t * LDY + r], &want, sizeof(float)) != 0) {
                                    SP_TEST_FAIL("%s %s rows [%" PRId64 ",%" PRId64
                                                 ") of %" PRId64 ", %" PRId64
                                                 " tokens: y[t=%" PRId64 ", r=%" PRId64
                                                 "] = %.9g, want %.9g",
                                                 lv[l].label, sp_type_name(wt), r0, r1, rows,
                                                 nt, t, r, y[t * LDY + r], want);
                                }
                            }
                        }
                    }
                }
            }
            problem_free(&p);
        }
    }
}

/* The AVX-512 VNNI Q8_0 / Q4_0 products keep the reference's operation order
 * (exact block sums, then sum + isum * (d_w * d_x) block by block), so they
 * must give its bits, not just come within the tolerance. */
TEST(kernels_q_gemm_avx512_vnni_is_the_reference)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX512);
    if (k == NULL || !sp__cpu_features()->avx512_vnni) {
        SKIP("no AVX-512 VNNI on this CPU");
    }
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    static const sp_type_t qt[] = {SP_TYPE_Q8_0, SP_TYPE_Q4_0};
    for (int i = 0; i < 2; i++) {
        check_gemm_shapes(k->name, k, ref, qt[i], 2080, 37, 133, 60 + (uint64_t)i);
        check_gemm_shapes(k->name, k, ref, qt[i], 96, 17, 9, 62 + (uint64_t)i);
        /* few tokens over more than one K chunk of the decode path */
        check_gemm_shapes(k->name, k, ref, qt[i], 32 * 2049, 17, 4, 64 + (uint64_t)i);
        /* the one-token kernel (avx512_gemv.c): steps of 4 blocks with 2 left over, rows
         * in 8s with 3 left over; a K chunk (1024 blocks) and a last one of 2 blocks */
        check_gemm_shapes(k->name, k, ref, qt[i], 32 * 6, 19, 2, 68 + (uint64_t)i);
        check_gemm_shapes(k->name, k, ref, qt[i], 32 * 1026, 11, 1, 70 + (uint64_t)i);
        problem p;
        problem_make(&p, k, qt[i], 4160, 2, 2, 66 + (uint64_t)i);
        for (int r = 0; r < 2; r++) {
            float got, want;
            k->vec_dot[qt[i]](4160, &got, p.w + r * p.w_stride, p.x + r * p.x_stride);
            ref->vec_dot[qt[i]](4160, &want, p.w + r * p.w_stride, p.x + r * p.x_stride);
            ASSERT(memcmp(&got, &want, sizeof got) == 0);
        }
        problem_free(&p);
    }
}

/* The arm64 quantised products (neon.c, neon_dotprod.c) keep the reference's operation order
 * (exact integer sums, then the reference's float statements block by block), so Q8_0, Q4_0,
 * Q4_K and Q6_K must give its bits at both levels, in vec_dot and in every gemm shape. */
TEST(kernels_q_neon_is_the_reference)
{
#if defined(__aarch64__)
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    static const sp_type_t qt[] = {SP_TYPE_Q8_0, SP_TYPE_Q4_0, SP_TYPE_Q4_K, SP_TYPE_Q6_K,
                                   SP_TYPE_Q2_K, SP_TYPE_Q3_K, SP_TYPE_Q5_K, SP_TYPE_IQ4_XS};
    const int nqt = (int)(sizeof qt / sizeof qt[0]);
    int tested = 0;
    for (int l = SP_CPU_NEON; l <= SP_CPU_DOTPROD; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL) {
            fprintf(stderr, "  skipped level %d: this CPU lacks it\n", l);
            continue;
        }
        tested++;
        for (int i = 0; i < nqt; i++) {
            ASSERT(k->gemm[qt[i]] != NULL && k->vec_dot[qt[i]] != ref->vec_dot[qt[i]]);
            check_gemm_shapes(k->name, k, ref, qt[i], 2560, 13, 11, 80 + (uint64_t)i);
            problem p;
            problem_make(&p, k, qt[i], 4352, 2, 2, 90 + (uint64_t)i);
            for (int r = 0; r < 2; r++) {
                float got, want;
                k->vec_dot[qt[i]](4352, &got, p.w + r * p.w_stride, p.x + r * p.x_stride);
                ref->vec_dot[qt[i]](4352, &want, p.w + r * p.w_stride, p.x + r * p.x_stride);
                ASSERT(memcmp(&got, &want, sizeof got) == 0);
            }
            problem_free(&p);
        }
    }
    ASSERT(tested > 0);
#else
    SKIP("not an arm64 build");
#endif
}

/* Every product the reference table computes has its own NEON (and SDOT) kernel, as have
 * attention for each cache type, the element-wise ops and the Q8_0 / Q8_1 / Q8_K activation
 * quantizers; what stays the reference's on arm64 is listed in docs/design.md: the
 * dequantizers other than F16 and the packed-weight gemms (no repacked layout on arm64). */
TEST(kernels_neon_covers_every_type)
{
#if defined(__aarch64__)
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    for (int l = SP_CPU_NEON; l <= SP_CPU_DOTPROD; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL) {
            fprintf(stderr, "  skipped level %d: this CPU lacks it\n", l);
            continue;
        }
        for (int t = 0; t < SP_TYPE_COUNT; t++) {
            if (ref->vec_dot[t] == NULL) {
                continue;
            }
            if (k->vec_dot[t] == ref->vec_dot[t] || k->gemm[t] == NULL ||
                k->gemm[t] == ref->gemm[t]) {
                SP_TEST_FAIL("%s: %s has no NEON product", k->name, sp_type_name(t));
            }
        }
        static const sp_type_t kv[] = {SP_TYPE_F32, SP_TYPE_F16, SP_TYPE_Q8_0};
        for (int i = 0; i < 3; i++) {
            ASSERT(k->attn[kv[i]] != NULL && k->attn[kv[i]] != ref->attn[kv[i]]);
        }
        ASSERT(k->exp_f32 != ref->exp_f32 && k->rmsnorm != ref->rmsnorm &&
               k->swiglu != ref->swiglu);
        static const sp_type_t act[] = {SP_TYPE_Q8_0, SP_TYPE_Q8_1, SP_TYPE_Q8_K};
        for (int i = 0; i < 3; i++) {
            ASSERT(k->from_float[act[i]] != ref->from_float[act[i]]);
        }
    }
#else
    SKIP("not an arm64 build");
#endif
}

/* ---- dispatcher ----------------------------------------------------------- */

TEST(kernels_dispatch)
{
    const sp_cpu_kernels_t *best = sp_cpu_kernels();
    ASSERT(best != NULL);
    ASSERT(sp_cpu_kernels_ref() == sp_cpu_kernels_for(SP_CPU_SCALAR));
    ASSERT_STR_EQ(sp_cpu_kernels_ref()->name, "scalar");
    ASSERT(sp_cpu_kernels_for(best->level) == best || getenv("SAMPAN_CPU") != NULL);
    const sp_cpu_features_t *f = sp__cpu_features();
#if defined(__aarch64__)
    ASSERT(f->neon && !f->avx2 && !f->avx512);
    ASSERT(sp_cpu_kernels_for(SP_CPU_NEON) != NULL);
    ASSERT((sp_cpu_kernels_for(SP_CPU_DOTPROD) != NULL) == f->dotprod);
#else
    ASSERT((sp_cpu_kernels_for(SP_CPU_AVX2) != NULL) == f->avx2);
    ASSERT((sp_cpu_kernels_for(SP_CPU_AVX512) != NULL) == f->avx512);
    ASSERT((sp_cpu_kernels_for(SP_CPU_AMX) != NULL) == f->amx_int8);
    ASSERT(!f->amx_int8 || f->avx512_vnni);
    ASSERT(!f->neon && !f->dotprod);
#endif
    ASSERT(sp_cpu_kernels_for((sp_cpu_level_t)7) == NULL);
    fprintf(stderr, "  best table: %s\n", best->name);
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL) {
            continue;
        }
        ASSERT_EQ(k->level, l);
        for (int ti = 0; ti < N_WTYPES; ti++) {
            sp_type_t wt = wtypes[ti];
            ASSERT(k->vec_dot[wt] != NULL && k->to_float[wt] != NULL);
            ASSERT(k->from_float[k->vec_dot_type[wt]] != NULL);
        }
    }
}

TEST(kernels_env_level)
{
#if defined(__aarch64__)
    ASSERT_EQ(sp__cpu_level_from_env(NULL, SP_CPU_DOTPROD), SP_CPU_DOTPROD);
    ASSERT_EQ(sp__cpu_level_from_env("scalar", SP_CPU_DOTPROD), SP_CPU_SCALAR);
    ASSERT_EQ(sp__cpu_level_from_env("neon", SP_CPU_DOTPROD), SP_CPU_NEON);
    ASSERT_EQ(sp__cpu_level_from_env("dotprod", SP_CPU_DOTPROD), SP_CPU_DOTPROD);
    ASSERT_EQ(sp__cpu_level_from_env("dotprod", SP_CPU_NEON), SP_CPU_NEON);
    /* the x86 names mean nothing here: the best level */
    ASSERT_EQ(sp__cpu_level_from_env("avx2", SP_CPU_DOTPROD), SP_CPU_DOTPROD);
    return;
#endif
    ASSERT_EQ(sp__cpu_level_from_env(NULL, SP_CPU_AVX512), SP_CPU_AVX512);
    ASSERT_EQ(sp__cpu_level_from_env("", SP_CPU_AVX2), SP_CPU_AVX2);
    ASSERT_EQ(sp__cpu_level_from_env("scalar", SP_CPU_AVX512), SP_CPU_SCALAR);
    ASSERT_EQ(sp__cpu_level_from_env("avx2", SP_CPU_AVX512), SP_CPU_AVX2);
    ASSERT_EQ(sp__cpu_level_from_env("avx512", SP_CPU_AVX512), SP_CPU_AVX512);
    ASSERT_EQ(sp__cpu_level_from_env("avx512", SP_CPU_AMX), SP_CPU_AVX512);
    ASSERT_EQ(sp__cpu_level_from_env("amx", SP_CPU_AMX), SP_CPU_AMX);
    ASSERT_EQ(sp__cpu_level_from_env("amx", SP_CPU_AVX512), SP_CPU_AVX512);
    ASSERT(strcmp(sp_cpu_level_name(SP_CPU_AMX), "amx") == 0);
    ASSERT(strcmp(sp_cpu_level_name((sp_cpu_level_t)9), "?") == 0);
    /* never above what the CPU has */
    ASSERT_EQ(sp__cpu_level_from_env("avx512", SP_CPU_AVX2), SP_CPU_AVX2);
    ASSERT_EQ(sp__cpu_level_from_env("avx2", SP_CPU_SCALAR), SP_CPU_SCALAR);
    ASSERT_EQ(sp__cpu_level_from_env("neon", SP_CPU_AVX2), SP_CPU_AVX2);
#if defined(__x86_64__)
    /* the AVX-VNNI table is the AVX2 level's */
    ASSERT_EQ(sp__cpu_level_from_env("avx2-vnni", SP_CPU_AMX), SP_CPU_AVX2);
    ASSERT_EQ(sp__cpu_level_from_env("avx2-vnni", SP_CPU_SCALAR), SP_CPU_SCALAR);
#endif
}

/* The kernel levels this CPU has, on one line that tests/run.sh and
 * tests/py/test_cuda.py read to rerun the engine's tests at each level below
 * the best ("cpu levels: scalar avx2", with "avx2-vnni" after avx2 where the AVX2
 * level has its AVX-VNNI table); and, when SAMPAN_CPU names a level,
 * that the engine's table is that level capped at the best (so a rerun at a
 * level really runs there). */
TEST(kernels_cpu_levels)
{
    char line[64] = "";
    sp_cpu_level_t best = SP_CPU_SCALAR;
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        if (sp_cpu_kernels_for((sp_cpu_level_t)l) != NULL) {
            best = (sp_cpu_level_t)l;
            strcat(line, " ");
            strcat(line, sp_cpu_level_name((sp_cpu_level_t)l));
        }
        if (l == SP_CPU_AVX2 && sp_cpu_kernels_avx2_vnni() != NULL) {
            strcat(line, " avx2-vnni"); /* the AVX2 level's AVX-VNNI table */
        }
    }
    fprintf(stderr, "  cpu levels:%s\n", line);
    const char *env = getenv("SAMPAN_CPU");
    const sp_cpu_level_t want = sp__cpu_level_from_env(env, best);
    ASSERT_EQ(sp_cpu_kernels()->level, want);
    /* which AVX2 table: the AVX-VNNI one when asked for by name, or by default without
     * AVX-512; the plain one for SAMPAN_CPU=avx2 */
    const sp_cpu_kernels_t *vnni = sp_cpu_kernels_avx2_vnni();
    if (want == SP_CPU_AVX2) {
        const bool plain = env != NULL && strcmp(env, "avx2") == 0;
        const bool named = env != NULL && strcmp(env, "avx2-vnni") == 0;
        const bool want_vnni = vnni != NULL && (named || (!plain && best == SP_CPU_AVX2));
        ASSERT(sp_cpu_kernels() == (want_vnni ? vnni : sp_cpu_kernels_for(SP_CPU_AVX2)));
    }
    if (vnni != NULL) {
        ASSERT(strcmp(vnni->name, "avx2-vnni") == 0 && vnni->level == SP_CPU_AVX2);
    }
    if (env != NULL && env[0] != '\0') {
        fprintf(stderr, "  SAMPAN_CPU=%s: the engine runs at %s\n", env, sp_cpu_kernels()->name);
    }
}
