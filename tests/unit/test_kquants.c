/*
 * test_kquants.c - Q4_K / Q6_K / Q8_K kernels: block layouts against hand-built blocks,
 * quantizer error bounds, dot products against float math, every SIMD level against the
 * scalar reference (bit for bit, by the numerics contract of kquants_impl.h), gemm against
 * vec_dot (bit for bit: batch invariance) and determinism.
 *
 * Expected values in the layout tests are computed here from the GGUF format description, with
 * packing code written for the test, never by calling the kernels' own unpack helpers.
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants_impl.h"
#include "kernels/kernels.h"

#define FP16_ONE 0x3C00  /* 1.0 */
#define FP16_HALF 0x3800 /* 0.5 */

/* ---- deterministic test data ---------------------------------------------------------------- */

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

/* Gaussian values whose spread changes from sub-block to sub-block (as real weight rows do),
 * with an occasional outlier, so the 6-bit / 8-bit scale quantization is exercised. */
static void
fill_weights(float *x, int64_t n, uint64_t seed)
{
    rng_seed(seed);
    for (int64_t i = 0; i < n; i++) {
        const float spread = 0.02f + 0.05f * (float)((i / 32) % 7);
        x[i] = spread * rng_gauss() + ((i % 97) == 13 ? 0.5f : 0.0f);
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

/* exact float comparison (ASSERT_EQ would truncate to integers) */
#define ASSERT_FEQ(a, b) ASSERT_NEAR(a, b, 0.0)

/* ---- packing written from the format description -------------------------------------------- */

static void
pack_q4k_scales(uint8_t out[12], const int sc[8], const int m[8])
{
    memset(out, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] |= (uint8_t)(sc[j] & 63);
            out[j + 4] |= (uint8_t)(m[j] & 63);
        } else {
            out[j + 4] |= (uint8_t)(sc[j] & 0xF);       /* low 4 bits of sc */
            out[j + 4] |= (uint8_t)((m[j] & 0xF) << 4); /* low 4 bits of m */
            out[j - 4] |= (uint8_t)((sc[j] >> 4) << 6); /* high 2 bits of sc */
            out[j] |= (uint8_t)((m[j] >> 4) << 6);      /* high 2 bits of m */
        }
    }
}

/* q[e] in 0..15 for element e: for each 64-element chunk i (0..3), element 64i + l is the low
 * nibble of qs[32i + l], element 64i + 32 + l the high nibble. */
static void
pack_q4k_quants(uint8_t qs[128], const int q[256])
{
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 32; l++)
            qs[32 * i + l] = (uint8_t)(q[64 * i + l] | (q[64 * i + 32 + l] << 4));
}

/* q[e] in 0..63. */
static void
pack_q6k_quants(uint8_t ql[128], uint8_t qh[64], const int q[256])
{
    memset(ql, 0, 128);
    memset(qh, 0, 64);
    for (int e = 0; e < 256; e++) {
        const int half = e / 128, r = e % 128, group = r / 32, l = r % 32;
        const int byte = 64 * half + l + (group & 1) * 32; /* groups 0,2 use ql[l]; 1,3 ql[l+32] */
        ql[byte] |= (uint8_t)((q[e] & 0xF) << (group >= 2 ? 4 : 0));
        qh[32 * half + l] |= (uint8_t)((q[e] >> 4) << (2 * group));
    }
}

/* ---- layout tests --------------------------------------------------------------------------- */

TEST(kquants_q4k_layout_literal)
{
    /* Scale bytes written out by hand: sub-block 1 has sc 3 / m 7; sub-block 5 has
     * sc = 0xB | (2 << 4) = 43 and m = 5 | (1 << 4) = 21; all others 0. */
    sp_block_q4_k b;
    memset(&b, 0, sizeof(b));
    b.d = FP16_ONE;
    b.dmin = FP16_ONE;
    b.scales[1] = 0x80 | 3; /* sc1 = 3, top bits of sc5 = 2 */
    b.scales[5] = 0x40 | 7; /* m1 = 7, top bits of m5 = 1 */
    b.scales[9] = 0x5B;     /* low nibble of sc5 = 0xB, of m5 = 5 */
    memset(b.qs, 0x11, sizeof(b.qs)); /* every quant is 1 */
    float out[256];
    ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q4_K, &b, out, 256));
    for (int e = 0; e < 256; e++) {
        const float want = e / 32 == 1 ? 3.0f - 7.0f : (e / 32 == 5 ? 43.0f - 21.0f : 0.0f);
        ASSERT_FEQ(out[e], want);
    }
}

TEST(kquants_q4k_layout_pattern)
{
    const int sc[8] = {1, 2, 3, 63, 17, 33, 48, 62};
    const int m[8] = {0, 5, 10, 63, 16, 31, 47, 60};
    int q[256];
    for (int e = 0; e < 256; e++)
        q[e] = (e * 7 + 3) % 16;
    sp_block_q4_k b[2];
    memset(b, 0, sizeof(b));
    for (int k = 0; k < 2; k++) {
        b[k].d = k ? FP16_HALF : FP16_ONE;
        b[k].dmin = k ? FP16_ONE : FP16_HALF;
        pack_q4k_scales(b[k].scales, sc, m);
        pack_q4k_quants(b[k].qs, q);
    }
    float out[512];
    ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q4_K, b, out, 512));
    for (int k = 0; k < 2; k++) {
        const double d = k ? 0.5 : 1.0, dmin = k ? 1.0 : 0.5;
        for (int e = 0; e < 256; e++) {
            const double want = d * sc[e / 32] * q[e] - dmin * m[e / 32];
            ASSERT_FEQ(out[256 * k + e], want);
        }
    }
    /* every level's to_float agrees */
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *kt = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (kt == NULL)
            continue;
        float o2[512];
        ASSERT(kt->to_float[SP_TYPE_Q4_K] != NULL);
        kt->to_float[SP_TYPE_Q4_K](b, o2, 512);
        ASSERT(memcmp(out, o2, sizeof(o2)) == 0);
    }
}

TEST(kquants_q6k_layout_literal)
{
    sp_block_q6_k b;
    memset(&b, 0, sizeof(b));
    memset(b.scales, 1, sizeof(b.scales));
    b.d = FP16_ONE;
    b.ql[0] = 0x2F;       /* element 0 low bits 0xF, element 64 low bits 0x2 */
    b.qh[0] = 0xE4;       /* 0b11100100: hi bits e0 = 0, e32 = 1, e64 = 2, e96 = 3 */
    float out[256];
    ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q6_K, &b, out, 256));
    for (int e = 0; e < 256; e++) {
        float want = -32.0f;
        if (e == 0)
            want = 15 - 32;
        else if (e == 32)
            want = 16 - 32;
        else if (e == 64)
            want = 2 + 32 - 32;
        else if (e == 96)
            want = 48 - 32;
        ASSERT_FEQ(out[e], want);
    }
}

TEST(kquants_q6k_layout_pattern)
{
    sp_block_q6_k b;
    int q[256];
    for (int e = 0; e < 256; e++)
        q[e] = (e * 5 + 1) % 64;
    pack_q6k_quants(b.ql, b.qh, q);
    for (int k = 0; k < 16; k++)
        b.scales[k] = (int8_t)(k - 8);
    b.scales[14] = 127;
    b.scales[15] = -128;
    b.d = FP16_HALF;
    float out[256];
    ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q6_K, &b, out, 256));
    for (int e = 0; e < 256; e++)
        ASSERT_FEQ(out[e], 0.5 * b.scales[e / 16] * (q[e] - 32));
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *kt = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (kt == NULL)
            continue;
        float o2[256];
        ASSERT(kt->to_float[SP_TYPE_Q6_K] != NULL);
        kt->to_float[SP_TYPE_Q6_K](&b, o2, 256);
        ASSERT(memcmp(out, o2, sizeof(o2)) == 0);
    }
}

TEST(kquants_q8k_quantize)
{
    float x[512];
    for (int i = 0; i < 256; i++)
        x[i] = (float)(i - 100) * 0.25f; /* amax 38.75 at i = 255 */
    memset(x + 256, 0, 256 * sizeof(float)); /* an all-zero block */
    sp_block_q8_k b[2];
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q8_K, x, b, 512));
    ASSERT_FEQ(b[0].d, 38.75f / 127.0f);
    ASSERT_EQ(b[0].qs[255], 127);
    ASSERT_EQ(b[0].qs[100], 0);
    for (int i = 0; i < 256; i++) {
        ASSERT(b[0].qs[i] >= -127);
        ASSERT_NEAR(b[0].d * b[0].qs[i], x[i], 0.5 * b[0].d * 1.0001);
    }
    for (int g = 0; g < 16; g++) {
        int sum = 0;
        for (int i = 0; i < 16; i++)
            sum += b[0].qs[16 * g + i];
        ASSERT_EQ(b[0].bsums[g], sum);
        ASSERT_EQ(b[1].bsums[g], 0);
    }
    ASSERT_FEQ(b[1].d, 0.0f);
    for (int i = 0; i < 256; i++)
        ASSERT_EQ(b[1].qs[i], 0);
    /* negative extreme maps to -127 (symmetric range) */
    x[7] = -100.0f;
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q8_K, x, b, 256));
    ASSERT_EQ(b[0].qs[7], -127);
    ASSERT(!sp__kquants_quantize_row(SP_TYPE_Q8_K, x, b, 100));
    ASSERT(!sp__kquants_quantize_row(SP_TYPE_Q4_0, x, b, 256));
    ASSERT(!sp__kquants_dequantize_row(SP_TYPE_F16, b, x, 256));
}

/* Every level's Q8_K activation quantizer gives the reference's bytes on the awkward blocks:
 * .5 ties after the scaling (amax 127: iscale 1), all zero, tiny, ordinary random values, and
 * a NaN among finite values and an infinity (iscale 0, inf * 0 = NaN), at every level. */
TEST(kquants_q8k_every_level_equal_reference)
{
    enum { NB = 6 };
    static float x[NB * 256];
    rng_seed(4242);
    for (int i = 0; i < NB * 256; i++)
        x[i] = (float)(rng_uniform() * 8.0 - 4.0);
    for (int i = 0; i < 256; i++) {
        x[i] = (float)(i % 254 - 127) + (i % 254 == 0 || i % 254 == 253 ? 0.0f : 0.5f);
        x[256 + i] = 0.0f;
        x[512 + i] = 1e-38f * (float)(i - 128);
    }
    x[0] = -127.0f;
    x[768 + 17] = NAN;
    x[1024 + 200] = INFINITY;
    sp_block_q8_k want[NB], got[NB];
    sp_cpu_kernels_ref()->from_float[SP_TYPE_Q8_K](x, want, NB * 256);
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL)
            continue;
        memset(got, 0x5a, sizeof got);
        k->from_float[SP_TYPE_Q8_K](x, got, NB * 256);
        for (int b = 0; b < NB; b++) {
            if (memcmp(&got[b], &want[b], sizeof got[b]) != 0)
                SP_TEST_FAIL("%s: Q8_K block %d differs from the reference", k->name, b);
        }
    }
}

/* ---- quantizer error bounds ----------------------------------------------------------------- */

/* Independent decode of one Q4_K sub-block's (d*sc, dmin*m), from the format description. */
static void
q4k_sub_params(const sp_block_q4_k *b, int j, double *ds, double *dm)
{
    int sc, m;
    if (j < 4) {
        sc = b->scales[j] & 63;
        m = b->scales[j + 4] & 63;
    } else {
        sc = (b->scales[j + 4] & 0xF) | ((b->scales[j - 4] >> 6) << 4);
        m = (b->scales[j + 4] >> 4) | ((b->scales[j] >> 6) << 4);
    }
    *ds = sp_fp16_to_fp32(b->d) * sc;
    *dm = sp_fp16_to_fp32(b->dmin) * m;
}

/*
 * Bounds. (1) Per element: the quantizer re-rounds every value with the final stored scales,
 * so |x - x^| <= step/2 for values inside the representable range of their sub-block, plus the
 * distance to that range for values outside it (clamped). (2) Overall, for Gaussian data of
 * spread s per sub-block: 32 samples span about 4.1 s, so Q4_K's step is ~4.1 s / 15 = 0.27 s
 * and a uniform rounding error has rms step/sqrt(12) ~ 0.079 s; the least-squares fit (which
 * lets extreme values clip) brings it lower. Q6_K: 16 samples reach ~1.8 s in magnitude,
 * the step is ~1.8 s / 32 = 0.056 s, rms ~0.016 s. We assert rms error / rms value below 0.08
 * (Q4_K) and 0.019 (Q6_K), on unit Gaussians and on rows whose spread varies by sub-block.
 */
TEST(kquants_q4k_roundtrip)
{
    enum { N = 16 * 256 };
    static float x[N], y[N];
    static sp_block_q4_k q[N / 256];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0)
            fill_gauss(x, N, 11);
        else
            fill_weights(x, N, 12);
        ASSERT(sp__kquants_quantize_row(SP_TYPE_Q4_K, x, q, N));
        ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q4_K, q, y, N));
        double se = 0, ss = 0;
        for (int i = 0; i < N; i++) {
            double ds, dm;
            q4k_sub_params(&q[i / 256], (i % 256) / 32, &ds, &dm);
            const double lo = -dm, hi = 15 * ds - dm;
            const double out = x[i] < lo ? lo - x[i] : (x[i] > hi ? x[i] - hi : 0.0);
            const double err = fabs((double)x[i] - y[i]);
            if (!(err <= 0.5 * ds + out + 1e-6 * (fabs(x[i]) + ds + dm)))
                SP_TEST_FAIL("element %d: x %g y %g ds %g dm %g", i, x[i], y[i], ds, dm);
            se += err * err;
            ss += (double)x[i] * x[i];
        }
        ASSERT(sqrt(se / ss) < 0.08); /* measured 0.071 on 65536 values, both data sets */
    }
}

TEST(kquants_q6k_roundtrip)
{
    enum { N = 16 * 256 };
    static float x[N], y[N];
    static sp_block_q6_k q[N / 256];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0)
            fill_gauss(x, N, 21);
        else
            fill_weights(x, N, 22);
        ASSERT(sp__kquants_quantize_row(SP_TYPE_Q6_K, x, q, N));
        ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q6_K, q, y, N));
        double se = 0, ss = 0;
        for (int i = 0; i < N; i++) {
            const sp_block_q6_k *b = &q[i / 256];
            const double ds = (double)sp_fp16_to_fp32(b->d) * b->scales[(i % 256) / 16];
            const double lo = fmin(-32 * ds, 31 * ds), hi = fmax(-32 * ds, 31 * ds);
            const double out = x[i] < lo ? lo - x[i] : (x[i] > hi ? x[i] - hi : 0.0);
            const double err = fabs((double)x[i] - y[i]);
            if (!(err <= 0.5 * fabs(ds) + out + 1e-6 * (fabs(x[i]) + fabs(ds))))
                SP_TEST_FAIL("element %d: x %g y %g ds %g", i, x[i], y[i], ds);
            se += err * err;
            ss += (double)x[i] * x[i];
        }
        ASSERT(sqrt(se / ss) < 0.019); /* measured 0.0165 on 65536 values */
    }
}

TEST(kquants_quantize_edge_cases)
{
    static float x[512], y[512];
    sp_block_q4_k q4[2];
    sp_block_q6_k q6[2];
    /* zeros, then a constant negative block */
    for (int i = 0; i < 512; i++)
        x[i] = i < 256 ? 0.0f : -0.75f;
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q4_K, x, q4, 512));
    ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q4_K, q4, y, 512));
    for (int i = 0; i < 512; i++)
        ASSERT_NEAR(y[i], x[i], 0.75 / 63);
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q6_K, x, q6, 512));
    ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q6_K, q6, y, 512));
    for (int i = 0; i < 512; i++)
        ASSERT_NEAR(y[i], x[i], 1e-3);
    /* constant positive values */
    for (int i = 0; i < 512; i++)
        x[i] = 2.0f;
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q4_K, x, q4, 512));
    ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q4_K, q4, y, 512));
    for (int i = 0; i < 512; i++)
        ASSERT_NEAR(y[i], 2.0, 2e-3);
}

TEST(kquants_quantize_deterministic)
{
    enum { N = 4 * 256 };
    static float x[N];
    static sp_block_q4_k a4[N / 256], b4[N / 256];
    static sp_block_q6_k a6[N / 256], b6[N / 256];
    fill_weights(x, N, 5);
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q4_K, x, a4, N));
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q4_K, x, b4, N));
    ASSERT(memcmp(a4, b4, sizeof(a4)) == 0);
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q6_K, x, a6, N));
    ASSERT(sp__kquants_quantize_row(SP_TYPE_Q6_K, x, b6, N));
    ASSERT(memcmp(a6, b6, sizeof(a6)) == 0);
    /* row-by-row equals one long call (no state carried between blocks) */
    for (int r = 0; r < N / 256; r++) {
        sp_block_q4_k one;
        ASSERT(sp__kquants_quantize_row(SP_TYPE_Q4_K, x + 256 * r, &one, 256));
        ASSERT(memcmp(&one, &a4[r], sizeof(one)) == 0);
    }
}

/* ---- dot products, per level ---------------------------------------------------------------- */

enum { DN = 8 * 256, ROWS = 6, TOKS = 7 };

typedef struct {
    float w[ROWS][DN], x[TOKS][DN];
    sp_block_q4_k w4[ROWS][DN / 256];
    sp_block_q6_k w6[ROWS][DN / 256];
    sp_block_q8_k xq_ref[TOKS][DN / 256], xq[TOKS][DN / 256];
} dot_fixture_t;

static dot_fixture_t *
make_fixture(void)
{
    dot_fixture_t *f = malloc(sizeof(*f));
    ASSERT(f != NULL);
    memset(f, 0xA5, sizeof(*f)); /* garbage: the quantizers must write every byte */
    for (int r = 0; r < ROWS; r++) {
        fill_weights(f->w[r], DN, 100 + r);
        ASSERT(sp__kquants_quantize_row(SP_TYPE_Q4_K, f->w[r], f->w4[r], DN));
        ASSERT(sp__kquants_quantize_row(SP_TYPE_Q6_K, f->w[r], f->w6[r], DN));
    }
    for (int t = 0; t < TOKS; t++) {
        fill_gauss(f->x[t], DN, 200 + t);
        if (t == 3)
            f->x[t][17] = 40.0f; /* an outlier activation: most quants near zero */
        ASSERT(sp__kquants_quantize_row(SP_TYPE_Q8_K, f->x[t], f->xq_ref[t], DN));
    }
    return f;
}

/* One level's kernels: its from_float must give the reference's bytes, its vec_dot the
 * dequantized float dot (to float rounding) and the reference's exact bits, its gemm the
 * vec_dot's bits for every (row, token), leaving other outputs untouched. */
static void
check_kernels(const char *what, sp_from_float_fn from_float, sp_vec_dot_fn dot4,
              sp_vec_dot_fn dot6, sp_gemm_fn gemm4, sp_gemm_fn gemm6)
{
    dot_fixture_t *f = make_fixture();
    for (int t = 0; t < TOKS; t++) {
        from_float(f->x[t], f->xq[t], DN);
        if (memcmp(f->xq[t], f->xq_ref[t], sizeof(f->xq[t])) != 0)
            SP_TEST_FAIL("%s: Q8_K bytes differ from the reference for token %d", what, t);
    }
    static float wd[DN], xd[DN];
    for (int type = 0; type < 2; type++) {
        const sp_type_t wt = type ? SP_TYPE_Q6_K : SP_TYPE_Q4_K;
        sp_vec_dot_fn dot = type ? dot6 : dot4;
        sp_vec_dot_fn ref = type ? sp__q6k_vec_dot_ref : sp__q4k_vec_dot_ref;
        sp_gemm_fn gemm = type ? gemm6 : gemm4;
        const void *wrow[ROWS];
        for (int r = 0; r < ROWS; r++)
            wrow[r] = type ? (const void *)f->w6[r] : (const void *)f->w4[r];
        float s[ROWS][TOKS];
        for (int r = 0; r < ROWS; r++) {
            ASSERT(sp__kquants_dequantize_row(wt, wrow[r], wd, DN));
            for (int t = 0; t < TOKS; t++) {
                ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q8_K, f->xq[t], xd, DN));
                double want = 0, mag = 0;
                for (int i = 0; i < DN; i++) {
                    want += (double)wd[i] * xd[i];
                    mag += fabs((double)wd[i] * xd[i]);
                }
                float got, again, r_ref;
                dot(DN, &got, wrow[r], f->xq[t]);
                dot(DN, &again, wrow[r], f->xq[t]);
                ref(DN, &r_ref, wrow[r], f->xq[t]);
                if (!(fabs(got - want) <= 1e-5 * mag + 1e-6))
                    SP_TEST_FAIL("%s %s r%d t%d: %.9g vs float %.9g", what, sp_type_name(wt), r,
                                 t, (double)got, want);
                ASSERT_BITS_EQ(got, again);
                ASSERT_BITS_EQ(got, r_ref);
                s[r][t] = got;
            }
        }
        if (gemm == NULL)
            continue;
        /* rows [1, ROWS), all tokens (4 + a tail of 3), into a wider output */
        enum { LDY = ROWS + 3 };
        float y[TOKS * LDY];
        const size_t ws = type ? sizeof(f->w6[0]) : sizeof(f->w4[0]);
        const gemm_case_t gc = {gemm, DN, wrow[0], ws, f->xq, sizeof(f->xq[0]), &s[0][0], 1, TOKS,
                                false};
        GEMM_CHECK_ASSERT(gemm_check_range(&gc, 1, ROWS, TOKS, y, LDY, TOKS), "%s %s rows [1,%d)",
                          what, sp_type_name(wt), ROWS);
        /* one token at a time gives the same bits as the batch */
        for (int t = 0; t < TOKS; t++) {
            float one[ROWS];
            gemm(DN, wrow[0], ws, 0, ROWS, f->xq[t], sizeof(f->xq[0]), 1, one, ROWS);
            for (int r = 0; r < ROWS; r++)
                ASSERT_BITS_EQ(one[r], s[r][t]);
        }
    }
    free(f);
}

static void
check_table(sp_cpu_level_t level)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(level);
    ASSERT(k != NULL);
    ASSERT_EQ(k->vec_dot_type[SP_TYPE_Q4_K], SP_TYPE_Q8_K);
    ASSERT_EQ(k->vec_dot_type[SP_TYPE_Q6_K], SP_TYPE_Q8_K);
    ASSERT(k->from_float[SP_TYPE_Q8_K] && k->vec_dot[SP_TYPE_Q4_K] && k->vec_dot[SP_TYPE_Q6_K]);
    check_kernels(k->name, k->from_float[SP_TYPE_Q8_K], k->vec_dot[SP_TYPE_Q4_K],
                  k->vec_dot[SP_TYPE_Q6_K], k->gemm[SP_TYPE_Q4_K], k->gemm[SP_TYPE_Q6_K]);

    /* through the dispatcher's gemm entry point too (falls back to vec_dot when NULL) */
    dot_fixture_t *f = make_fixture();
    for (int t = 0; t < TOKS; t++)
        k->from_float[SP_TYPE_Q8_K](f->x[t], f->xq[t], DN);
    float y[TOKS * ROWS];
    sp_cpu_gemm(k, SP_TYPE_Q4_K, DN, f->w4, sizeof(f->w4[0]), 0, ROWS, f->xq, sizeof(f->xq[0]),
                TOKS, y, ROWS);
    for (int t = 0; t < TOKS; t++)
        for (int r = 0; r < ROWS; r++) {
            float s;
            sp__q4k_vec_dot_ref(DN, &s, f->w4[r], f->xq[t]);
            ASSERT_BITS_EQ(y[t * ROWS + r], s);
        }
    free(f);
}

TEST(kquants_level_scalar)
{
    check_table(SP_CPU_SCALAR);
}

#if defined(__x86_64__)
TEST(kquants_level_avx2)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX2) == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 K-quant kernels not tested");
    check_table(SP_CPU_AVX2);
    check_kernels("avx2 (direct)", sp__q8k_from_float_avx2, sp__q4k_vec_dot_avx2,
                  sp__q6k_vec_dot_avx2, sp__q4k_gemm_avx2, sp__q6k_gemm_avx2);
}

TEST(kquants_level_avx512)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX512) == NULL)
        SKIP("this CPU has no AVX-512 F/BW/VL: AVX-512 K-quant kernels not tested");
    check_table(SP_CPU_AVX512);
    check_kernels("avx512 (no vnni)", sp__q8k_from_float_avx512, sp__q4k_vec_dot_avx512,
                  sp__q6k_vec_dot_avx512, sp__q4k_gemm_avx512, sp__q6k_gemm_avx512);
}

TEST(kquants_level_avx512_vnni)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX512) == NULL || !__builtin_cpu_supports("avx512vnni"))
        SKIP("this CPU has no AVX-512 VNNI: VPDPWSSD K-quant kernels not tested");
    check_kernels("avx512-vnni", sp__q8k_from_float_avx512, sp__q4k_vec_dot_avx512_vnni,
                  sp__q6k_vec_dot_avx512_vnni, sp__q4k_gemm_avx512_vnni,
                  sp__q6k_gemm_avx512_vnni);
}
#elif defined(__aarch64__)
TEST(kquants_level_neon)
{
    check_table(SP_CPU_NEON);
}

TEST(kquants_level_dotprod)
{
    if (sp_cpu_kernels_for(SP_CPU_DOTPROD) == NULL)
        SKIP("this CPU has no dot-product extension: SDOT K-quant kernels not tested");
    check_table(SP_CPU_DOTPROD);
}
#endif

/* Extreme integer ranges: every Q4_K quant 15 with scale 63, every Q8_K quant -127 (and +127),
 * Q6_K quants at 0 and 63 with scales -128 / 127: the int16 pair sums and int32 block sums
 * of every level must still equal the reference's. */
TEST(kquants_extreme_values)
{
    sp_block_q4_k w4;
    memset(&w4, 0, sizeof(w4));
    w4.d = FP16_ONE;
    w4.dmin = FP16_ONE;
    const int sc[8] = {63, 63, 63, 63, 63, 63, 63, 63}, m[8] = {63, 0, 63, 0, 63, 0, 63, 0};
    pack_q4k_scales(w4.scales, sc, m);
    memset(w4.qs, 0xFF, sizeof(w4.qs));
    sp_block_q6_k w6;
    int q[256];
    for (int e = 0; e < 256; e++)
        q[e] = (e & 1) ? 63 : 0;
    pack_q6k_quants(w6.ql, w6.qh, q);
    for (int k = 0; k < 16; k++)
        w6.scales[k] = (int8_t)(k & 1 ? 127 : -128);
    w6.d = FP16_ONE;
    for (int sign = -1; sign <= 1; sign += 2) {
        sp_block_q8_k x;
        x.d = 1.0f;
        for (int i = 0; i < 256; i++)
            x.qs[i] = (int8_t)(sign * ((i & 1) ? 127 : -127) * (i % 3 == 2 ? -1 : 1));
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += x.qs[16 * g + i];
            x.bsums[g] = (int16_t)s;
        }
        /* expected, in double from the dequantized values */
        float wd[256];
        double want4 = 0, want6 = 0;
        ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q4_K, &w4, wd, 256));
        for (int i = 0; i < 256; i++)
            want4 += (double)wd[i] * x.qs[i];
        ASSERT(sp__kquants_dequantize_row(SP_TYPE_Q6_K, &w6, wd, 256));
        for (int i = 0; i < 256; i++)
            want6 += (double)wd[i] * x.qs[i];
        for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
            const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
            if (k == NULL)
                continue;
            float s4, s6;
            k->vec_dot[SP_TYPE_Q4_K](256, &s4, &w4, &x);
            k->vec_dot[SP_TYPE_Q6_K](256, &s6, &w6, &x);
            ASSERT_FEQ(s4, want4); /* all integers well below 2^24 */
            ASSERT_FEQ(s6, want6);
        }
    }
}

/*
 * The gemm of every x86 level (Q6_K's AVX-512 VNNI panels, avx512_kpanel.c, run from 12 tokens;
 * Q4_K's row tiles) against the reference vec_dot, bit for bit: random weight bytes (every
 * quant and scale pattern, including -128), 3 and 37 super-blocks (the panels decode 8 at a
 * time: four boundaries and a short last panel), 1..33 and 70 tokens (tiles of 8, 4, 2, 1), at
 * AVX-512 also 11 super-blocks x 260 tokens (past the 256-token chunk), row ranges starting and
 * ending inside an 8-row panel; then the extreme
 * block of kquants_extreme_values through the gemm with 13 tokens of +-127.
 */
static void
check_gemm_long(const sp_cpu_kernels_t *k, sp_type_t type, int nb, int t_max)
{
    enum { R = 11, LDY = R + 2 };
    const size_t bs = type == SP_TYPE_Q6_K ? sizeof(sp_block_q6_k) : sizeof(sp_block_q4_k);
    const size_t ws = (size_t)nb * bs, xs = (size_t)nb * sizeof(sp_block_q8_k);
    uint8_t *w = malloc(ws * R), *x = malloc(xs * (size_t)t_max);
    float *f = malloc(sizeof(float) * (size_t)nb * 256);
    float *want = malloc(sizeof(float) * (size_t)(R * t_max));
    float *y = malloc(sizeof(float) * (size_t)(LDY * t_max));
    ASSERT(w && x && f && want && y);
    rng_seed(4242 + (uint64_t)nb);
    for (size_t i = 0; i < ws * R; i++)
        w[i] = (uint8_t)(rng_uniform() * 256.0);
    for (int r = 0; r < R; r++)
        for (int b = 0; b < nb; b++) { /* finite scales */
            const sp_fp16_t d = sp_fp32_to_fp16((float)(0.001 + 0.01 * rng_uniform()));
            uint8_t *blk = w + (size_t)r * ws + (size_t)b * bs;
            memcpy(blk + (type == SP_TYPE_Q6_K ? offsetof(sp_block_q6_k, d) : 0), &d, 2);
            if (type == SP_TYPE_Q4_K)
                memcpy(blk + 2, &d, 2);
        }
    for (int t = 0; t < t_max; t++) {
        for (int i = 0; i < nb * 256; i++)
            f[i] = (float)rng_gauss() * (t == 3 && i == 100 ? 40.0f : 1.0f);
        sp__q8k_from_float_ref(f, x + (size_t)t * xs, nb * 256);
    }
    for (int t = 0; t < t_max; t++)
        for (int r = 0; r < R; r++)
            sp_cpu_kernels_ref()->vec_dot[type](nb * 256, &want[t * R + r], w + (size_t)r * ws,
                                                x + (size_t)t * xs);
    static const int ranges[3][2] = {{0, R}, {3, 10}, {5, 6}};
    for (int ri = 0; ri < 3; ri++)
        for (int nt = 1; nt <= t_max; nt += nt < 33 ? 1 : t_max - 33) {
            const int r0 = ranges[ri][0], r1 = ranges[ri][1];
            const gemm_case_t gc = {k->gemm[type], nb * 256, w, ws, x, xs, want, R, 1, false};
            GEMM_CHECK_ASSERT(gemm_check_range(&gc, r0, r1, nt, y, LDY, t_max),
                              "%s %s rows [%d,%d) %d tokens", k->name, sp_type_name(type), r0, r1,
                              nt);
        }
    free(w);
    free(x);
    free(f);
    free(want);
    free(y);
}

TEST(kquants_gemm_long_rows_many_tokens)
{
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL) {
            printf("skipped: level %d not on this CPU\n", lv);
            continue;
        }
        for (int ti = 0; ti < 2; ti++) {
            const sp_type_t type = ti ? SP_TYPE_Q6_K : SP_TYPE_Q4_K;
            if (k->gemm[type] == NULL)
                continue;
            check_gemm_long(k, type, 3, 40);
            check_gemm_long(k, type, 37, 70);
            if (lv == SP_CPU_AVX512)
                check_gemm_long(k, type, 11, 260);
        }
    }
}

TEST(kquants_gemm_extremes_many_tokens)
{
    enum { T = 13 };
    sp_block_q6_k w6[3];
    int q[256];
    for (int e = 0; e < 256; e++)
        q[e] = (e & 1) ? 63 : 0;
    for (int r = 0; r < 3; r++) {
        pack_q6k_quants(w6[r].ql, w6[r].qh, q);
        for (int g = 0; g < 16; g++)
            w6[r].scales[g] = (int8_t)((g + r) & 1 ? 127 : -128);
        w6[r].d = FP16_ONE;
    }
    sp_block_q8_k x[T];
    for (int t = 0; t < T; t++) {
        x[t].d = 1.0f;
        for (int i = 0; i < 256; i++)
            x[t].qs[i] = (int8_t)((t & 1 ? 1 : -1) * ((i & 1) ? 127 : -127) *
                                  (i % 3 == 2 && t > 6 ? -1 : 1));
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += x[t].qs[16 * g + i];
            x[t].bsums[g] = (int16_t)s;
        }
    }
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL || k->gemm[SP_TYPE_Q6_K] == NULL)
            continue;
        float y[T * 3];
        k->gemm[SP_TYPE_Q6_K](256, w6, sizeof(w6[0]), 0, 3, x, sizeof(x[0]), T, y, 3);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < 3; r++) {
                float ref;
                sp_cpu_kernels_ref()->vec_dot[SP_TYPE_Q6_K](256, &ref, &w6[r], &x[t]);
                ASSERT_BITS_EQ(y[t * 3 + r], ref);
            }
    }
}
