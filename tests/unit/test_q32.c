/*
 * test_q32.c - Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 weights and Q8_1 activations: block layouts
 * against blocks packed here from the GGUF format description, quantizer error bounds derived
 * from each rule, dot products against float math, every SIMD level against the scalar
 * reference (bit for bit, by q32_impl.h's numerics contract), gemm against vec_dot (bit for
 * bit: batch invariance), and extreme integer ranges.
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/q32_impl.h"
#include "kernels/kernels.h"

/* ---- deterministic data ---------------------------------------------------------------- */

static uint64_t rng_state;

static void
rng_seed(uint64_t s)
{
    rng_state = s * 0x9E3779B97F4A7C15ull + 1;
}

static double
rng_uniform(void) /* (0, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static float
rng_gauss(void)
{
    return (float)(sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform()));
}

/* Gaussian weights whose spread and offset change from block to block, with outliers. */
static void
fill_weights(float *x, int64_t n, uint64_t seed)
{
    rng_seed(seed);
    for (int64_t i = 0; i < n; i++) {
        const float spread = 0.02f + 0.05f * (float)((i / 32) % 7);
        const float offset = 0.01f * (float)((i / 32) % 5) - 0.02f;
        x[i] = spread * rng_gauss() + offset + ((i % 97) == 13 ? 0.5f : 0.0f);
    }
}

static void
fill_gauss(float *x, int64_t n, uint64_t seed)
{
    rng_seed(seed);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_gauss();
}

#define ASSERT_BITS_EQ(a, b)                                                                  \
    do {                                                                                      \
        float a_ = (a), b_ = (b);                                                             \
        if (memcmp(&a_, &b_, sizeof(float)) != 0)                                             \
            SP_TEST_FAIL("%s == %s bitwise: %.9g != %.9g", #a, #b, (double)a_, (double)b_);   \
    } while (0)

#define FP16_ONE 0x3C00
#define FP16_HALF 0x3800
#define FP16_MINUS_TWO 0xC000

static const sp_type_t wtypes[5] = {SP_TYPE_Q4_1, SP_TYPE_Q5_0, SP_TYPE_Q5_1, SP_TYPE_IQ4_NL,
                                    SP_TYPE_MXFP4};

/* ---- layouts: blocks packed here from the format description ---------------------------- */

static void
pack_nibbles(uint8_t qs[16], const int q[32])
{
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

static void
pack_high(uint8_t qh[4], const int q[32])
{
    memset(qh, 0, 4);
    for (int j = 0; j < 32; j++)
        if (q[j] & 16)
            qh[j / 8] |= (uint8_t)(1u << (j % 8));
}

TEST(q32_layouts)
{
    int q[32];
    for (int j = 0; j < 32; j++)
        q[j] = (j * 7 + 3) % 32;
    float y[32];

    sp_block_q4_1 b41;
    b41.d = FP16_HALF;
    b41.m = FP16_MINUS_TWO;
    int q4[32];
    for (int j = 0; j < 32; j++)
        q4[j] = q[j] & 15;
    pack_nibbles(b41.qs, q4);
    ASSERT(sp_dequantize_row(SP_TYPE_Q4_1, &b41, y, 32));
    for (int j = 0; j < 32; j++)
        ASSERT_NEAR(y[j], 0.5 * q4[j] - 2.0, 0.0);

    sp_block_q5_0 b50;
    b50.d = FP16_HALF;
    pack_nibbles(b50.qs, q);
    pack_high(b50.qh, q);
    ASSERT(sp_dequantize_row(SP_TYPE_Q5_0, &b50, y, 32));
    for (int j = 0; j < 32; j++)
        ASSERT_NEAR(y[j], 0.5 * (q[j] - 16), 0.0);

    sp_block_q5_1 b51;
    b51.d = FP16_HALF;
    b51.m = FP16_MINUS_TWO;
    pack_nibbles(b51.qs, q);
    pack_high(b51.qh, q);
    ASSERT(sp_dequantize_row(SP_TYPE_Q5_1, &b51, y, 32));
    for (int j = 0; j < 32; j++)
        ASSERT_NEAR(y[j], 0.5 * q[j] - 2.0, 0.0);

    /* IQ4_NL's grid and MXFP4's E2M1 values, written out from the format definitions */
    static const double iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
    static const double e2m1[16] = {0,  0.5,  1,  1.5,  2,  3,  4,  6,
                                    -0, -0.5, -1, -1.5, -2, -3, -4, -6};
    sp_block_iq4_nl bnl;
    bnl.d = FP16_HALF;
    pack_nibbles(bnl.qs, q4);
    ASSERT(sp_dequantize_row(SP_TYPE_IQ4_NL, &bnl, y, 32));
    for (int j = 0; j < 32; j++)
        ASSERT_NEAR(y[j], 0.5 * iq4[q4[j]], 0.0);

    static const struct {
        uint8_t e;
        double scale;
    } es[] = {{127, 1.0}, {130, 8.0}, {120, 1.0 / 128}, {1, 0x1p-126}, {0, 0x1p-127},
              {250, 0x1p123}};
    for (size_t k = 0; k < sizeof(es) / sizeof(es[0]); k++) {
        sp_block_mxfp4 bmx;
        bmx.e = es[k].e;
        pack_nibbles(bmx.qs, q4);
        ASSERT(sp_dequantize_row(SP_TYPE_MXFP4, &bmx, y, 32));
        for (int j = 0; j < 32; j++)
            ASSERT_NEAR(y[j], es[k].scale * e2m1[q4[j]], 0.0);
    }

    sp_block_q8_1 b81;
    b81.d = FP16_HALF;
    b81.s = 0;
    for (int j = 0; j < 32; j++)
        b81.qs[j] = (int8_t)(j * 8 - 127);
    ASSERT(sp_dequantize_row(SP_TYPE_Q8_1, &b81, y, 32));
    for (int j = 0; j < 32; j++)
        ASSERT_NEAR(y[j], 0.5 * (j * 8 - 127), 0.0);

    /* the table knows them, with GGUF's sizes, as computable weights (Q8_1 only as activation) */
    ASSERT_EQ(sp_type_traits(SP_TYPE_MXFP4)->type_size, 17);
    ASSERT_EQ(sp_row_size(SP_TYPE_MXFP4, 64), 34);
    ASSERT_EQ(sp_type_from_name("MXFP4"), SP_TYPE_MXFP4);
    for (int i = 0; i < 5; i++)
        ASSERT(sp_type_traits(wtypes[i])->supported);
    ASSERT(!sp_type_traits(SP_TYPE_Q8_1)->supported);
}

/* ---- quantizer bounds ------------------------------------------------------------------- */

enum { QN = 32 * 64 };

/* Q4_1 / Q5_1: q = round((x - min) / d) with the unrounded d = (max - min) / nq, so
 * |x - (q d + min)| <= d / 2 (plus a few float roundings of (x - min) * (1 / d) + 0.5 near
 * 32: 1e-5 d); storing d and min as halves adds nq * |d| 2^-11 and |min| 2^-11. */
static void
check_asym(sp_type_t type, int nq)
{
    static float x[QN], y[QN];
    static uint8_t buf[QN / 32 * 24];
    fill_weights(x, QN, 7 + (uint64_t)nq);
    ASSERT(sp_quantize_row(type, x, buf, QN));
    ASSERT(sp_dequantize_row(type, buf, y, QN));
    for (int b = 0; b < QN / 32; b++) {
        float min = x[b * 32], max = x[b * 32];
        for (int j = 0; j < 32; j++) {
            min = fminf(min, x[b * 32 + j]);
            max = fmaxf(max, x[b * 32 + j]);
        }
        const double d = ((double)max - min) / nq;
        const double tol = d * (0.5 + 1e-5) + nq * d * 0x1p-11 + fabs(min) * 0x1p-11;
        for (int j = 0; j < 32; j++) {
            const int i = b * 32 + j;
            if (!(fabs((double)x[i] - y[i]) <= tol))
                SP_TEST_FAIL("%s elem %d: %g -> %g (tol %g)", sp_type_name(type), i, x[i], y[i],
                             tol);
        }
    }
}

TEST(q32_quantize_q4_1_q5_1)
{
    check_asym(SP_TYPE_Q4_1, 15);
    check_asym(SP_TYPE_Q5_1, 31);
}

/* Q5_0: d = max / -16 (the largest-magnitude element maps to q = 0 exactly), q - 16 =
 * round(x / d) capped at 15: within d / 2 where x / d <= 15.5, within |d| above (the cap),
 * plus 16 |d| 2^-11 for the half-rounded d and 1e-5 |d| of float rounding. */
TEST(q32_quantize_q5_0)
{
    static float x[QN], y[QN];
    static sp_block_q5_0 b[QN / 32];
    fill_weights(x, QN, 11);
    ASSERT(sp_quantize_row(SP_TYPE_Q5_0, x, b, QN));
    ASSERT(sp_dequantize_row(SP_TYPE_Q5_0, b, y, QN));
    for (int k = 0; k < QN / 32; k++) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[k * 32 + j]) > amax) {
                amax = fabsf(x[k * 32 + j]);
                max = x[k * 32 + j];
            }
        const double d = max / -16.0;
        for (int j = 0; j < 32; j++) {
            const int i = k * 32 + j;
            const double r = x[i] / d;
            const double tol = fabs(d) * ((r > 15.5 ? 1.0 : 0.5) + 16 * 0x1p-11 + 1e-5);
            if (!(fabs((double)x[i] - y[i]) <= tol))
                SP_TEST_FAIL("q5_0 elem %d: %g -> %g (tol %g)", i, x[i], y[i], tol);
        }
        /* the element of largest magnitude is exact up to d's half rounding */
        ASSERT(sp_fp16_to_fp32(b[k].d) != 0.0f);
    }
}

/* IQ4_NL: each quant is the grid point nearest x / s for the block's unrounded scale s, and
 * the stored half dh = s (1 + e), |e| <= 2^-11, so |x - dh g[q]| exceeds the best grid point's
 * error under dh by at most 2 * 127 |s| 2^-11 (the scale error at both grid points, |g| <= 127),
 * plus float rounding of x / s (1e-6 |x|). And the fit is no worse (in squared error weighted by
 * x^2, the rule's weights) than putting the largest element on the grid's end with the same
 * nearest-point rounding: the first candidate of the search, up to the same half rounding. */
TEST(q32_quantize_iq4_nl)
{
    static const int g[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                              1,    13,   25,  38,  53,  69,  89,  113};
    static float x[QN], y[QN];
    static sp_block_iq4_nl b[QN / 32];
    fill_weights(x, QN, 13);
    ASSERT(sp_quantize_row(SP_TYPE_IQ4_NL, x, b, QN));
    ASSERT(sp_dequantize_row(SP_TYPE_IQ4_NL, b, y, QN));
    for (int k = 0; k < QN / 32; k++) {
        const double dh = sp_fp16_to_fp32(b[k].d);
        ASSERT(dh != 0.0);
        double err_q = 0, err_simple = 0, err_scale = 0, amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabs(x[k * 32 + j]) > amax) {
                amax = fabs(x[k * 32 + j]);
                max = x[k * 32 + j];
            }
        const double ds = max / 127.0;
        for (int j = 0; j < 32; j++) {
            const int i = k * 32 + j;
            double best = INFINITY, best_s = INFINITY;
            for (int l = 0; l < 16; l++) {
                best = fmin(best, fabs(x[i] - dh * g[l]));
                best_s = fmin(best_s, fabs(x[i] - ds * g[l]));
            }
            const double e = fabs((double)x[i] - y[i]);
            const double slack = 254.0 * fabs(dh) * 0x1p-11 * (1 + 0x1p-10) + 1e-6 * fabs(x[i]);
            if (!(e <= best + slack))
                SP_TEST_FAIL("iq4_nl elem %d: %g -> %g, best %g", i, x[i], y[i], best);
            const double w = (double)x[i] * x[i];
            err_q += w * e * e;
            err_simple += w * best_s * best_s;
            const double ds_err = 127.0 * fabs(dh) * 0x1p-11 * (1 + 0x1p-10) + 1e-6 * fabs(x[i]);
            err_scale += w * ds_err * ds_err;
        }
        /* the unrounded scale's error is <= err_simple; the half rounding moves each element
         * by at most 127 |s| 2^-11: triangle inequality on the weighted 2-norms */
        const double bound = sqrt(err_simple) + sqrt(err_scale);
        if (!(err_q <= bound * bound * (1 + 1e-9) + 1e-30))
            SP_TEST_FAIL("iq4_nl block %d: weighted error %g > simple scale's %g", k, err_q,
                         err_simple);
    }
}

/* MXFP4: e = floor(log2 amax) - 2 + 127 (amax = m 2^E, m in [0.5, 1): e = E + 124), and each
 * element on the grid point nearest to it (exact: the grid values times a power of two). */
TEST(q32_quantize_mxfp4)
{
    static const double e2m1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    static float x[QN], y[QN];
    static sp_block_mxfp4 b[QN / 32];
    fill_weights(x, QN, 17);
    for (int i = 0; i < 64; i++)
        x[i] *= 1e-20f; /* two blocks of tiny values */
    ASSERT(sp_quantize_row(SP_TYPE_MXFP4, x, b, QN));
    ASSERT(sp_dequantize_row(SP_TYPE_MXFP4, b, y, QN));
    for (int k = 0; k < QN / 32; k++) {
        double amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmax(amax, fabs(x[k * 32 + j]));
        int E;
        frexp(amax, &E);
        ASSERT_EQ(b[k].e, E + 124);
        const double d = ldexp(1.0, b[k].e - 128);
        for (int j = 0; j < 32; j++) {
            const int i = k * 32 + j;
            double best = INFINITY;
            for (int l = 0; l < 16; l++)
                best = fmin(best, fabs(x[i] - d * e2m1x2[l]));
            /* the float error computation may round: one ulp of x */
            if (!(fabs((double)x[i] - y[i]) <= best + fabs(x[i]) * 0x1p-23))
                SP_TEST_FAIL("mxfp4 elem %d: %g -> %g, best %g", i, x[i], y[i], best);
        }
    }
}

/* Q8_1 activations: d = half(amax / 127), q = round-half-even(x * 127 / amax), s = half(d * sum q)
 * with the unrounded d; a block whose half d is 0 is all zero. */
TEST(q32_q8_1_activations)
{
    static float x[QN];
    static sp_block_q8_1 b[QN / 32], b2[QN / 32];
    fill_gauss(x, QN, 19);
    for (int j = 0; j < 32; j++)
        x[32 + j] = 1e-7f * (float)(j - 16); /* half(amax / 127) underflows to 0 */
    memset(b, 0xA5, sizeof(b));
    sp__q8_1_from_float_ref(x, b, QN);
    for (int k = 0; k < QN / 32; k++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[k * 32 + j]));
        const float d = amax / 127.0f;
        ASSERT_EQ(b[k].d, sp_fp32_to_fp16(d));
        if (sp_fp16_to_fp32(b[k].d) == 0.0f) {
            ASSERT_EQ(k, 1);
            ASSERT_EQ(b[k].s, 0);
            for (int j = 0; j < 32; j++)
                ASSERT_EQ(b[k].qs[j], 0);
            continue;
        }
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            const float v = x[k * 32 + j] * (127.0f / amax);
            ASSERT_EQ(b[k].qs[j], (int)nearbyintf(v));
            sum += b[k].qs[j];
        }
        ASSERT_EQ(b[k].s, sp_fp32_to_fp16(d * (float)sum));
    }
    /* the public quantizer and every level's table give the same bytes */
    ASSERT(sp_quantize_row(SP_TYPE_Q8_1, x, b2, QN));
    ASSERT(memcmp(b, b2, sizeof(b)) == 0);
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL)
            continue;
        memset(b2, 0, sizeof(b2));
        k->from_float[SP_TYPE_Q8_1](x, b2, QN);
        ASSERT(memcmp(b, b2, sizeof(b)) == 0);
    }
}

/* Every level's Q8_1 activations on awkward blocks give the reference's bytes: .5 ties after
 * the scaling (amax 127), all zero, below half's range, a NaN among finite values, an
 * infinity (127 / inf = 0, inf * 0 = NaN), and negative-heavy sums. */
TEST(q32_q8_1_every_level_edge_blocks)
{
    enum { NB = 6 };
    float x[NB * 32];
    for (int j = 0; j < 32; j++) {
        x[j] = (float)(j * 8 - 127) + (j == 0 ? 0.0f : 0.5f);
        x[32 + j] = 0.0f;
        x[64 + j] = 1e-9f * (float)(j - 16);
        x[96 + j] = (float)j * 0.25f - 3.0f;
        x[128 + j] = (float)(31 - j) * 0.5f;
        x[160 + j] = -(float)j;
    }
    x[0] = -127.0f;
    x[96 + 9] = NAN;
    x[128 + 4] = INFINITY;
    sp_block_q8_1 want[NB], got[NB];
    sp_cpu_kernels_ref()->from_float[SP_TYPE_Q8_1](x, want, NB * 32);
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL)
            continue;
        memset(got, 0x5a, sizeof(got));
        k->from_float[SP_TYPE_Q8_1](x, got, NB * 32);
        for (int b = 0; b < NB; b++)
            if (memcmp(&got[b], &want[b], sizeof(got[b])) != 0)
                SP_TEST_FAIL("%s: Q8_1 block %d differs from the reference", k->name, b);
    }
}

/* Odd and hostile inputs: zeros, constants, NaN and infinities must give some block without
 * undefined behaviour (UBSan checks the conversions) and a zero block must stay zero. */
TEST(q32_quantize_edge_cases)
{
    float x[64], y[64];
    uint8_t buf[64];
    for (int t = 0; t < 5; t++) {
        memset(x, 0, sizeof(x));
        ASSERT(sp_quantize_row(wtypes[t], x, buf, 32));
        ASSERT(sp_dequantize_row(wtypes[t], buf, y, 32));
        for (int j = 0; j < 32; j++)
            ASSERT_NEAR(y[j], 0.0, 0.0);
        for (int j = 0; j < 32; j++)
            x[j] = 0.25f;
        ASSERT(sp_quantize_row(wtypes[t], x, buf, 32));
        ASSERT(sp_dequantize_row(wtypes[t], buf, y, 32));
        for (int j = 0; j < 32; j++) /* a constant block is exact in every format here */
            ASSERT_NEAR(y[j], 0.25, 0.25 * 0x1p-10);
        for (int j = 0; j < 64; j++)
            x[j] = (float)(j - 20);
        x[3] = NAN;
        x[40] = INFINITY;
        x[41] = -INFINITY;
        x[42] = 3e38f;
        ASSERT(sp_quantize_row(wtypes[t], x, buf, 64));
        ASSERT(sp_dequantize_row(wtypes[t], buf, y, 64));
        memset(x, 0, sizeof(x));
        for (int j = 0; j < 32; j++)
            x[j] = NAN;
        ASSERT(sp_quantize_row(wtypes[t], x, buf, 32));
    }
    for (int j = 0; j < 32; j++)
        x[j] = j == 5 ? INFINITY : 1.0f;
    sp_block_q8_1 b;
    sp__q8_1_from_float_ref(x, &b, 32);
}

/* ---- dot products, every level ---------------------------------------------------------- */

enum { DN = 32 * 37, ROWS = 6, TOKS = 7 }; /* 4 groups of 8 blocks and a tail of 5 */

typedef struct {
    float w[ROWS][DN], x[TOKS][DN];
    uint8_t wq[5][ROWS][DN / 32 * 24];
    sp_block_q8_0 x0[TOKS][DN / 32];
    sp_block_q8_1 x1[TOKS][DN / 32];
} fixture_t;

static size_t
wrow_bytes(sp_type_t t)
{
    return sp_row_size(t, DN);
}

static fixture_t *
make_fixture(void)
{
    fixture_t *f = malloc(sizeof(*f));
    ASSERT(f != NULL);
    memset(f, 0xA5, sizeof(*f));
    for (int r = 0; r < ROWS; r++) {
        fill_weights(f->w[r], DN, 100 + r);
        for (int t = 0; t < 5; t++)
            ASSERT(sp_quantize_row(wtypes[t], f->w[r], f->wq[t][r], DN));
    }
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    for (int t = 0; t < TOKS; t++) {
        fill_gauss(f->x[t], DN, 200 + t);
        if (t == 3)
            f->x[t][17] = 40.0f; /* an outlier: most quants of its block near zero */
        ref->from_float[SP_TYPE_Q8_0](f->x[t], f->x0[t], DN);
        ref->from_float[SP_TYPE_Q8_1](f->x[t], f->x1[t], DN);
    }
    return f;
}

static const void *
act_row(const fixture_t *f, sp_type_t wt, int t, size_t *stride)
{
    const bool q81 = wt == SP_TYPE_Q4_1 || wt == SP_TYPE_Q5_1;
    *stride = q81 ? sizeof(f->x1[0]) : sizeof(f->x0[0]);
    return q81 ? (const void *)f->x1[t] : (const void *)f->x0[t];
}

/* Float oracle of one product: the dequantized weights times the dequantized activations in
 * double. The engine's sum differs by float rounding: each block term and each of the n / 32
 * additions round once (2^-24 relative to partial sums bounded by sum |w x|): tolerance
 * 40 * 2^-24 * sum |w x| < 3e-6 sum |w x|. For Q4_1 / Q5_1 the offset term uses s = half(d *
 * sum q) with the unrounded d, not the half d times sum q: up to 2^-10 |s| per block more. */
static double
oracle(const fixture_t *f, sp_type_t wt, int r, int t, double *tol)
{
    static float wd[DN], xd[DN];
    size_t xs;
    const void *xr = act_row(f, wt, t, &xs);
    const bool q81 = wt == SP_TYPE_Q4_1 || wt == SP_TYPE_Q5_1;
    ASSERT(sp_dequantize_row(wt, f->wq[wt == SP_TYPE_Q4_1   ? 0
                                       : wt == SP_TYPE_Q5_0 ? 1
                                       : wt == SP_TYPE_Q5_1 ? 2
                                       : wt == SP_TYPE_IQ4_NL ? 3
                                                              : 4][r],
                             wd, DN));
    ASSERT(sp_dequantize_row(q81 ? SP_TYPE_Q8_1 : SP_TYPE_Q8_0, xr, xd, DN));
    double want = 0, mag = 0, extra = 0;
    for (int i = 0; i < DN; i++) {
        want += (double)wd[i] * xd[i];
        mag += fabs((double)wd[i] * xd[i]);
    }
    if (q81) {
        const uint8_t *wb = f->wq[wt == SP_TYPE_Q4_1 ? 0 : 2][r];
        for (int b = 0; b < DN / 32; b++) {
            sp_fp16_t m;
            memcpy(&m, wb + b * wrow_bytes(wt) / (DN / 32) + 2, 2);
            extra += fabs(sp_fp16_to_fp32(m) * sp_fp16_to_fp32(f->x1[t][b].s)) * 0x1p-10 * 1.01;
        }
    }
    *tol = 3e-6 * mag + extra + 1e-30;
    return want;
}

static void
check_level(const char *what, const sp_q32_level_t *lv)
{
    fixture_t *f = make_fixture();
    sp_q32_level_t ref = {0};
    sp__q32_level_ref(&ref);
    for (int ti = 0; ti < 5; ti++) {
        const sp_type_t wt = wtypes[ti];
        const size_t ws = wrow_bytes(wt);
        float s[ROWS][TOKS];
        for (int r = 0; r < ROWS; r++)
            for (int t = 0; t < TOKS; t++) {
                size_t xs;
                const void *xr = act_row(f, wt, t, &xs);
                float got, again, want_ref;
                lv->vec_dot[wt](DN, &got, f->wq[ti][r], xr);
                lv->vec_dot[wt](DN, &again, f->wq[ti][r], xr);
                ref.vec_dot[wt](DN, &want_ref, f->wq[ti][r], xr);
                double tol;
                const double want = oracle(f, wt, r, t, &tol);
                if (!(fabs(got - want) <= tol))
                    SP_TEST_FAIL("%s %s r%d t%d: %.9g vs float %.9g (tol %g)", what,
                                 sp_type_name(wt), r, t, (double)got, want, tol);
                ASSERT_BITS_EQ(got, again);
                ASSERT_BITS_EQ(got, want_ref);
                s[r][t] = got;
            }
        /* gemm: rows [1, ROWS), all tokens (4 + a tail of 3), into a wider output */
        enum { LDY = ROWS + 3 };
        float y[TOKS * LDY];
        size_t xs;
        const void *x0 = act_row(f, wt, 0, &xs);
        const gemm_case_t gc = {lv->gemm[wt], DN, f->wq[ti][0], sizeof(f->wq[ti][0]), x0, xs,
                                &s[0][0], 1, TOKS, false};
        GEMM_CHECK_ASSERT(gemm_check_range(&gc, 1, ROWS, TOKS, y, LDY, TOKS), "%s %s rows [1,%d)",
                          what, sp_type_name(wt), ROWS);
        /* one token at a time (and tokens 2..6 as a batch) give the same bits */
        for (int t = 0; t < TOKS; t++) {
            float one[ROWS];
            lv->gemm[wt](DN, f->wq[ti][0], sizeof(f->wq[ti][0]), 0, ROWS, act_row(f, wt, t, &xs),
                         xs, 1, one, ROWS);
            for (int r = 0; r < ROWS; r++)
                ASSERT_BITS_EQ(one[r], s[r][t]);
        }
        float five[5 * ROWS];
        lv->gemm[wt](DN, f->wq[ti][0], sizeof(f->wq[ti][0]), 0, ROWS, act_row(f, wt, 2, &xs),
                     xs, 5, five, ROWS);
        for (int t = 0; t < 5; t++)
            for (int r = 0; r < ROWS; r++)
                ASSERT_BITS_EQ(five[t * ROWS + r], s[r][t + 2]);
        (void)ws;
        /* short rows: a single block and the 8-block group boundary */
        for (int nbk = 1; nbk <= 9; nbk += 8) {
            float a, b;
            lv->vec_dot[wt](32 * nbk, &a, f->wq[ti][1], act_row(f, wt, 1, &xs));
            ref.vec_dot[wt](32 * nbk, &b, f->wq[ti][1], act_row(f, wt, 1, &xs));
            ASSERT_BITS_EQ(a, b);
        }
    }
    free(f);
}

/* The dispatcher's table at a level has these entries and the right activation types. */
static void
check_table(sp_cpu_level_t level)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(level);
    ASSERT(k != NULL);
    ASSERT_EQ(k->vec_dot_type[SP_TYPE_Q4_1], SP_TYPE_Q8_1);
    ASSERT_EQ(k->vec_dot_type[SP_TYPE_Q5_1], SP_TYPE_Q8_1);
    ASSERT_EQ(k->vec_dot_type[SP_TYPE_Q5_0], SP_TYPE_Q8_0);
    ASSERT_EQ(k->vec_dot_type[SP_TYPE_IQ4_NL], SP_TYPE_Q8_0);
    ASSERT_EQ(k->vec_dot_type[SP_TYPE_MXFP4], SP_TYPE_Q8_0);
    sp_q32_level_t lv = {0};
    for (int t = 0; t < 5; t++) {
        ASSERT(k->vec_dot[wtypes[t]] != NULL && k->gemm[wtypes[t]] != NULL);
        ASSERT(k->to_float[wtypes[t]] != NULL);
        lv.vec_dot[wtypes[t]] = k->vec_dot[wtypes[t]];
        lv.gemm[wtypes[t]] = k->gemm[wtypes[t]];
    }
    check_level(k->name, &lv);
}

TEST(q32_level_scalar)
{
    check_table(SP_CPU_SCALAR);
}

#if defined(__x86_64__)
TEST(q32_level_avx2)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX2) == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 Q4_1..MXFP4 kernels not tested");
    check_table(SP_CPU_AVX2);
    sp_q32_level_t lv = {0};
    sp__q32_level_avx2(&lv);
    check_level("avx2 (direct)", &lv);
}

TEST(q32_level_avx512)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX512) == NULL)
        SKIP("this CPU has no AVX-512 F/BW/VL: AVX-512 Q4_1..MXFP4 kernels not tested");
    check_table(SP_CPU_AVX512);
    sp_q32_level_t lv = {0};
    sp__q32_level_avx512(&lv, false);
    check_level("avx512 (no vnni)", &lv);
}

TEST(q32_level_avx512_vnni)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX512) == NULL || !__builtin_cpu_supports("avx512vnni"))
        SKIP("this CPU has no AVX-512 VNNI: VPDPBUSD Q4_1..MXFP4 kernels not tested");
    sp_q32_level_t lv = {0};
    sp__q32_level_avx512(&lv, true);
    check_level("avx512-vnni", &lv);
}
#elif defined(__aarch64__)
TEST(q32_level_neon)
{
    check_table(SP_CPU_NEON);
}

TEST(q32_level_dotprod)
{
    if (sp_cpu_kernels_for(SP_CPU_DOTPROD) == NULL)
        SKIP("this CPU has no dot-product extension");
    check_table(SP_CPU_DOTPROD);
}
#endif

/* Extreme integer ranges: every weight quant at its largest magnitude (Q4_1 15, Q5_1 31, Q5_0
 * -16, IQ4_NL -127, MXFP4 -12) against activations of all -127 and all +127, 9 blocks: every
 * level must give exactly the integer result times the scales (all powers of two: exact). */
TEST(q32_extreme_values)
{
    enum { NB = 9 };
    static uint8_t w[5][NB * 24];
    for (int t = 0; t < 5; t++) {
        for (int b = 0; b < NB; b++) {
            uint8_t *p = w[t] + (size_t)b * sp_type_traits(wtypes[t])->type_size;
            switch (wtypes[t]) {
            case SP_TYPE_Q4_1: {
                sp_block_q4_1 k = {.d = FP16_ONE, .m = FP16_HALF};
                memset(k.qs, 0xff, sizeof(k.qs));
                memcpy(p, &k, sizeof(k));
                break;
            }
            case SP_TYPE_Q5_1: {
                sp_block_q5_1 k = {.d = FP16_ONE, .m = FP16_HALF};
                memset(k.qs, 0xff, sizeof(k.qs));
                memset(k.qh, 0xff, sizeof(k.qh));
                memcpy(p, &k, sizeof(k));
                break;
            }
            case SP_TYPE_Q5_0: {
                sp_block_q5_0 k = {.d = FP16_ONE};
                memset(k.qs, 0x00, sizeof(k.qs));
                memset(k.qh, 0x00, sizeof(k.qh));
                memcpy(p, &k, sizeof(k));
                break;
            }
            case SP_TYPE_IQ4_NL: {
                sp_block_iq4_nl k = {.d = FP16_ONE};
                memset(k.qs, 0x00, sizeof(k.qs));
                memcpy(p, &k, sizeof(k));
                break;
            }
            default: {
                sp_block_mxfp4 k = {.e = 128};
                memset(k.qs, 0xff, sizeof(k.qs));
                memcpy(p, &k, sizeof(k));
                break;
            }
            }
        }
    }
    static const double wv[5] = {15, -16, 31, -127, -12};
    static const double wm[5] = {0.5, 0, 0.5, 0, 0};
    for (int sign = -1; sign <= 1; sign += 2) {
        sp_block_q8_0 x0[NB];
        sp_block_q8_1 x1[NB];
        for (int b = 0; b < NB; b++) {
            x0[b].d = FP16_ONE;
            x1[b].d = FP16_ONE;
            memset(x0[b].qs, sign * 127, sizeof(x0[b].qs));
            memset(x1[b].qs, sign * 127, sizeof(x1[b].qs));
            x1[b].s = sp_fp32_to_fp16((float)(sign * 127 * 32));
        }
        for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
            const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
            if (k == NULL)
                continue;
            for (int t = 0; t < 5; t++) {
                const bool q81 = wtypes[t] == SP_TYPE_Q4_1 || wtypes[t] == SP_TYPE_Q5_1;
                const void *x = q81 ? (const void *)x1 : (const void *)x0;
                float s;
                k->vec_dot[wtypes[t]](32 * NB, &s, w[t], x);
                /* MXFP4 e = 128: half scale 1 */
                const double want =
                    NB * (32.0 * wv[t] * 127 * sign + wm[t] * (sign * 127.0 * 32));
                ASSERT_NEAR(s, want, 0.0);
            }
        }
    }
}

/* Random block bytes (any quants, any fifth bits, scales across the half range and E8M0
 * exponents including the denormal 0 and 1), random activations in [-127, 127]: every level's
 * vec_dot and gemm give the reference's bits. */
TEST(q32_random_blocks)
{
    enum { NB = 21, R = 3, T = 5 };
    static uint8_t w[R][NB * 24];
    static sp_block_q8_0 x0[T][NB];
    static sp_block_q8_1 x1[T][NB];
    rng_seed(77);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < NB; b++) {
            x0[t][b].d = x1[t][b].d = (sp_fp16_t)(0x1000 + (int)(rng_uniform() * 0x2800));
            x1[t][b].s = (sp_fp16_t)(0x1000 + (int)(rng_uniform() * 0x2800)) |
                         (rng_uniform() < 0.5 ? 0x8000 : 0);
            for (int j = 0; j < 32; j++)
                x0[t][b].qs[j] = x1[t][b].qs[j] = (int8_t)(-127 + (int)(rng_uniform() * 255));
        }
    for (int ti = 0; ti < 5; ti++) {
        const sp_type_t wt = wtypes[ti];
        const size_t bs = sp_type_traits(wt)->type_size;
        for (int r = 0; r < R; r++)
            for (int b = 0; b < NB; b++) {
                uint8_t *p = w[r] + (size_t)b * bs;
                for (size_t i = 0; i < bs; i++)
                    p[i] = (uint8_t)(rng_uniform() * 256);
                if (wt == SP_TYPE_MXFP4) {
                    /* row 0: only the denormal scales (else the larger blocks hide them) */
                    static const uint8_t es[] = {0, 1, 2, 3, 100, 127, 140};
                    p[0] = r == 0 ? (uint8_t)(b % 2) : es[(b + r) % 7];
                } else {
                    /* finite halves for d (and m), sign included */
                    const sp_fp16_t d = (sp_fp16_t)((int)(rng_uniform() * 0x5000) |
                                                    (rng_uniform() < 0.5 ? 0x8000 : 0));
                    memcpy(p, &d, 2);
                    if (wt == SP_TYPE_Q4_1 || wt == SP_TYPE_Q5_1) {
                        const sp_fp16_t m = (sp_fp16_t)((int)(rng_uniform() * 0x5000) |
                                                        (rng_uniform() < 0.5 ? 0x8000 : 0));
                        memcpy(p + 2, &m, 2);
                    }
                }
            }
        const bool q81 = wt == SP_TYPE_Q4_1 || wt == SP_TYPE_Q5_1;
        const void *x = q81 ? (const void *)x1 : (const void *)x0;
        const size_t xs = q81 ? sizeof(x1[0]) : sizeof(x0[0]);
        float want[T][R];
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++)
                sp_cpu_kernels_ref()->vec_dot[wt](32 * NB, &want[t][r], w[r],
                                                  (const char *)x + (size_t)t * xs);
        for (int l = SP_CPU_AVX2; l <= SP_CPU_TOP; l++) {
            const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
            if (k == NULL)
                continue;
            float y[T][R];
            k->gemm[wt](32 * NB, w, sizeof(w[0]), 0, R, x, xs, T, &y[0][0], R);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < R; r++) {
                    float s;
                    k->vec_dot[wt](32 * NB, &s, w[r], (const char *)x + (size_t)t * xs);
                    ASSERT_BITS_EQ(s, want[t][r]);
                    ASSERT_BITS_EQ(y[t][r], want[t][r]);
                }
        }
    }
}

/* The gemm tiles (4 rows q apart, tokens in fours, single rows and short token tiles at the
 * edges, a last group of fewer than 8 blocks padded with zeros): every row count and first row,
 * every batch size 1..33, give vec_dot's bits (batch invariance) and write only their own
 * outputs. Random block bytes as above; 19 blocks = two groups of 8 and a tail of 3. */
TEST(q32_gemm_tiles)
{
    enum { NB = 19, R = 11, T = 33, LDY = R + 2 };
    static uint8_t w[R][NB * 24];
    static sp_block_q8_0 x0[T][NB];
    static sp_block_q8_1 x1[T][NB];
    static float want[T][R], y[T * LDY];
    rng_seed(4242);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < NB; b++) {
            x0[t][b].d = x1[t][b].d = (sp_fp16_t)(0x1000 + (int)(rng_uniform() * 0x2800));
            x1[t][b].s = (sp_fp16_t)(0x1000 + (int)(rng_uniform() * 0x2800)) |
                         (rng_uniform() < 0.5 ? 0x8000 : 0);
            for (int j = 0; j < 32; j++)
                x0[t][b].qs[j] = x1[t][b].qs[j] = (int8_t)(-127 + (int)(rng_uniform() * 255));
        }
    for (int ti = 0; ti < 5; ti++) {
        const sp_type_t wt = wtypes[ti];
        const size_t bs = sp_type_traits(wt)->type_size;
        for (int r = 0; r < R; r++)
            for (int b = 0; b < NB; b++) {
                uint8_t *p = w[r] + (size_t)b * bs;
                for (size_t i = 0; i < bs; i++)
                    p[i] = (uint8_t)(rng_uniform() * 256);
                if (wt == SP_TYPE_MXFP4) {
                    p[0] = (uint8_t)(100 + (int)(rng_uniform() * 40));
                } else {
                    for (int h = 0; h < (wt == SP_TYPE_Q4_1 || wt == SP_TYPE_Q5_1 ? 2 : 1); h++) {
                        const sp_fp16_t v = (sp_fp16_t)((int)(rng_uniform() * 0x5000) |
                                                        (rng_uniform() < 0.5 ? 0x8000 : 0));
                        memcpy(p + 2 * h, &v, 2); /* finite d (and m) */
                    }
                }
            }
        const bool q81 = wt == SP_TYPE_Q4_1 || wt == SP_TYPE_Q5_1;
        const char *x = q81 ? (const char *)x1 : (const char *)x0;
        const size_t xs = q81 ? sizeof(x1[0]) : sizeof(x0[0]);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++)
                sp_cpu_kernels_ref()->vec_dot[wt](32 * NB, &want[t][r], w[r], x + (size_t)t * xs);
        for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
            const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
            if (k == NULL)
                continue;
            /* rows [r0, r1): 1..11 rows from several first rows (full tiles and leftovers) */
            for (int r0 = 0; r0 <= 3; r0++)
                for (int r1 = r0 + 1; r1 <= R; r1++)
                    for (int nt = 1; nt <= T; nt += (r0 == 0 && r1 == R) ? 1 : 8) {
                        const gemm_case_t gc = {k->gemm[wt], 32 * NB, w, sizeof(w[0]), x, xs,
                                                &want[0][0], R, 1, false};
                        GEMM_CHECK_ASSERT(gemm_check_range(&gc, r0, r1, nt, y, LDY, T),
                                          "%s %s rows [%d,%d) %d tokens", k->name,
                                          sp_type_name(wt), r0, r1, nt);
                    }
        }
    }
}

/*
 * The AVX2 MXFP4 row panels (avx2_q32panel.c) at their integer limits: 8 + 1 rows of every
 * quant at +-12 (the unsigned offset form 24 and 0) or a mix, against 6 tokens of activations
 * +-127, mixed signs, and -128 (outside the quantizer's range, inside the panel's int16 bound:
 * four pair sums of 2 * 24 * 128): the gemm gives the reference's bits, and the reference the
 * exact value (powers-of-two scales).
 */
TEST(q32_mxfp4_panel_extremes)
{
    enum { NB = 10, R = 9, T = 6 };
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 MXFP4 panels not tested");
    static sp_block_mxfp4 w[R][NB];
    static const uint8_t pat[4] = {0x77, 0xff, 0x7f, 0x08}; /* +12 +12, -12 -12, -12 +12, -0 0 */
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) {
            w[r][b].e = (uint8_t)(126 + (r + b) % 3); /* half scales 1/4, 1/2, 1 */
            memset(w[r][b].qs, pat[(r + b) % 4], sizeof(w[r][b].qs));
        }
    static sp_block_q8_0 x[T][NB];
    for (int t = 0; t < T; t++)
        for (int b = 0; b < NB; b++) {
            x[t][b].d = FP16_ONE;
            for (int j = 0; j < 32; j++) {
                const int v = t == 0 ? 127 : t == 1 ? -127 : t == 2 ? -128
                              : t == 3 ? (j & 1 ? 127 : -127) : (j % 3 ? -127 : 127);
                x[t][b].qs[j] = (int8_t)v;
            }
        }
    float y[T][R];
    k->gemm[SP_TYPE_MXFP4](32 * NB, w, sizeof(w[0]), 0, R, x, sizeof(x[0]), T, &y[0][0], R);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) {
            if (t == 2 && r == 8)
                continue; /* the leftover row goes to the row tiles, whose sign trick needs
                           * |x| <= 127 (what the quantizer writes) */
            float ref;
            sp_cpu_kernels_ref()->vec_dot[SP_TYPE_MXFP4](32 * NB, &ref, w[r], x[t]);
            if (memcmp(&y[t][r], &ref, sizeof ref) != 0)
                SP_TEST_FAIL("token %d row %d: %.9g != reference %.9g", t, r, (double)y[t][r],
                             (double)ref);
            double want = 0;
            for (int b = 0; b < NB; b++) {
                const double half = (double)(1 << ((r + b) % 3)) / 4.0;
                for (int j = 0; j < 32; j++) {
                    const uint8_t byte = w[r][b].qs[j % 16];
                    const int nib = j < 16 ? byte & 0xf : byte >> 4;
                    want += half * sp__kvalues_mxfp4[nib] * x[t][b].qs[j];
                }
            }
            ASSERT_NEAR(ref, want, 0.0);
        }
}

/*
 * The Q5_0 and Q4_1 row panels at their int16 limits: Q5_0 quants of 31 (fifth bit set, the
 * panel's unsigned value 31) and 0, Q4_1 quants of 15, against activations of +-127 and -128
 * (four pair sums of 2 * 31 * 128 = 31744 < 2^15): the reference's bits. 9 rows (one panel
 * and a leftover row, which the -128 token skips: the row tiles need |x| <= 127).
 */
TEST(q32_panel_extremes_q5_0_q4_1)
{
    enum { NB = 10, R = 9, T = 6 };
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 Q5_0 / Q4_1 panels not tested");
    static sp_block_q5_0 w5[R][NB];
    static sp_block_q4_1 w4[R][NB];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) {
            const int hi = (r + b) % 3 != 0; /* all 31 (or 15), else all 0 */
            w5[r][b].d = FP16_ONE;
            memset(w5[r][b].qs, hi ? 0xff : 0x00, sizeof(w5[r][b].qs));
            memset(w5[r][b].qh, hi ? 0xff : 0x00, sizeof(w5[r][b].qh));
            w4[r][b].d = FP16_ONE;
            w4[r][b].m = FP16_HALF;
            memset(w4[r][b].qs, (r + b) % 2 ? 0xff : 0xf0, sizeof(w4[r][b].qs));
        }
    static sp_block_q8_0 x0[T][NB];
    static sp_block_q8_1 x1[T][NB];
    for (int t = 0; t < T; t++)
        for (int b = 0; b < NB; b++) {
            x0[t][b].d = x1[t][b].d = FP16_ONE;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                const int v = t == 0 ? 127 : t == 1 ? -127 : t == 2 ? -128
                              : t == 3 ? (j & 1 ? 127 : -127) : (j % 3 ? -127 : 127);
                x0[t][b].qs[j] = x1[t][b].qs[j] = (int8_t)v;
                sum += v;
            }
            x1[t][b].s = sp_fp32_to_fp16((float)sum);
        }
    const sp_type_t wt[2] = {SP_TYPE_Q5_0, SP_TYPE_Q4_1};
    const void *ws[2] = {w5, w4};
    const size_t wrow[2] = {sizeof(w5[0]), sizeof(w4[0])};
    const void *xs[2] = {x0, x1};
    const size_t xrow[2] = {sizeof(x0[0]), sizeof(x1[0])};
    for (int i = 0; i < 2; i++) {
        float y[T][R];
        k->gemm[wt[i]](32 * NB, ws[i], wrow[i], 0, R, xs[i], xrow[i], T, &y[0][0], R);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) {
                if (t == 2 && r == 8)
                    continue;
                float ref;
                sp_cpu_kernels_ref()->vec_dot[wt[i]](
                    32 * NB, &ref, (const char *)ws[i] + (size_t)r * wrow[i],
                    (const char *)xs[i] + (size_t)t * xrow[i]);
                if (memcmp(&y[t][r], &ref, sizeof ref) != 0)
                    SP_TEST_FAIL("%s token %d row %d: %.9g != reference %.9g",
                                 sp_type_name(wt[i]), t, r, (double)y[t][r], (double)ref);
            }
    }
}

/*
 * The AVX-512 VNNI 16-row panels of MXFP4 and IQ4_NL (avx512_q4panel.c) where their structure
 * has edges. Random block bytes, E8M0 exponents over the whole range (denormal 0 and 1, and
 * 254 / 255 whose products overflow to inf and, against a zero sum, NaN), activations in
 * [-127, 127], a zero block: every level's gemm over rows [r0, r1) and nt tokens gives the
 * reference vec_dot's bits (NaN: both NaN) and writes nothing else.
 */
static void
check_q4panels(int nb, int rows, int toks, const int (*ranges)[2], int n_ranges,
               const int *nts, int n_nts, uint64_t seed)
{
    const int ldy = rows + 3;
    uint8_t *w = malloc((size_t)rows * (size_t)nb * 18);
    sp_block_q8_0 *x = malloc(sizeof(sp_block_q8_0) * (size_t)toks * (size_t)nb);
    float *want = malloc(sizeof(float) * (size_t)toks * (size_t)rows);
    float *y = malloc(sizeof(float) * (size_t)toks * (size_t)ldy);
    ASSERT(w && x && want && y);
    rng_seed(seed);
    for (int t = 0; t < toks; t++)
        for (int b = 0; b < nb; b++) {
            sp_block_q8_0 *xb = &x[(size_t)t * nb + b];
            xb->d = (sp_fp16_t)(0x0400 + (int)(rng_uniform() * 0x3000));
            for (int j = 0; j < 32; j++)
                xb->qs[j] = (int8_t)(t == 5 && b % 7 == 0 ? 0 : -127 + (int)(rng_uniform() * 255));
        }
    static const sp_type_t types[2] = {SP_TYPE_MXFP4, SP_TYPE_IQ4_NL};
    for (int ti = 0; ti < 2; ti++) {
        const sp_type_t wt = types[ti];
        const size_t bs = sp_type_traits(wt)->type_size, ws = bs * (size_t)nb;
        for (int r = 0; r < rows; r++)
            for (int b = 0; b < nb; b++) {
                uint8_t *p = w + (size_t)r * ws + (size_t)b * bs;
                for (size_t i = 0; i < bs; i++)
                    p[i] = (uint8_t)(rng_uniform() * 256);
                if (wt == SP_TYPE_MXFP4) {
                    static const uint8_t es[] = {0, 1, 2, 100, 127, 130, 254, 255};
                    p[0] = r == 3 ? es[b % 8] : (uint8_t)(110 + (b + r) % 30);
                } else {
                    const sp_fp16_t d = (sp_fp16_t)((int)(rng_uniform() * 0x7800) |
                                                    (rng_uniform() < 0.5 ? 0x8000 : 0));
                    memcpy(p, &d, 2);
                }
            }
        for (int t = 0; t < toks; t++)
            for (int r = 0; r < rows; r++)
                sp_cpu_kernels_ref()->vec_dot[wt](32 * nb, &want[t * rows + r], w + (size_t)r * ws,
                                                  &x[(size_t)t * nb]);
        sp_q32_level_t direct = {0};
#if defined(__x86_64__)
        if (sp_cpu_kernels_for(SP_CPU_AVX512) != NULL && __builtin_cpu_supports("avx512vnni"))
            sp__q32_level_avx512(&direct, true);
#endif
        for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP + 1; l++) {
            const sp_cpu_kernels_t *k =
                l <= SP_CPU_TOP ? sp_cpu_kernels_for((sp_cpu_level_t)l) : NULL;
            const sp_gemm_fn gemm = k != NULL ? k->gemm[wt] : direct.gemm[wt];
            if (gemm == NULL || (l <= SP_CPU_TOP && k == NULL))
                continue;
            for (int ri = 0; ri < n_ranges; ri++)
                for (int ni = 0; ni < n_nts; ni++) {
                    const int r0 = ranges[ri][0], r1 = ranges[ri][1], nt = nts[ni];
                    const gemm_case_t gc = {gemm, 32 * nb, w, ws, x,
                                            sizeof(sp_block_q8_0) * (size_t)nb, want, rows, 1,
                                            true};
                    GEMM_CHECK_ASSERT(gemm_check_range(&gc, r0, r1, nt, y, ldy, toks),
                                      "%s level %d K=%d rows [%d,%d) %d tokens", sp_type_name(wt),
                                      l, 32 * nb, r0, r1, nt);
                }
        }
    }
    free(w);
    free(x);
    free(want);
    free(y);
}

/* 200 blocks: three packed K chunks of 64 and a tail of 8 (the lane sums carried across
 * chunks); 37 rows: two panels and a masked one of 5, and ranges starting and ending inside a
 * panel; 1..33 tokens: the small-batch fallback, full 8-token tiles and tails. */
TEST(q32_vnni_panels)
{
    static const int ranges[3][2] = {{0, 37}, {5, 20}, {17, 35}};
    static const int nts[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 25, 33};
    check_q4panels(200, 37, 33, ranges, 3, nts, (int)(sizeof nts / sizeof nts[0]), 9191);
}

/* Rows so long that a token chunk is one tile (1200 blocks: 8 tokens' records of the whole K
 * fill the 384 KiB scratch), so 9 and 17 tokens are two and three chunks; and rows longer than
 * the scratch takes at all (1300 and 2600 blocks), which go to the fallback. */
TEST(q32_vnni_panels_long_rows)
{
    static const int ranges[2][2] = {{0, 17}, {3, 16}};
    static const int nts[] = {9, 17};
    check_q4panels(1200, 17, 17, ranges, 2, nts, 2, 77);
    check_q4panels(1300, 17, 9, ranges, 1, nts, 1, 79);
    check_q4panels(2600, 17, 9, ranges, 1, nts, 1, 78);
}
