/*
 * test_kquants2.c - Q2_K / Q3_K / Q5_K / IQ4_XS kernels: block layouts against blocks packed here
 * from the GGUF format description, the reference quantizers' nearest-level property and error
 * bounds, dot products against float math, every SIMD level against the scalar reference (bit
 * for bit, by the numerics contract of kquants2_impl.h) on quantized and on random-byte blocks,
 * gemm against vec_dot (bit for bit: batch invariance), extreme integer ranges, garbage input,
 * and known answers from ggml's reference quantizers (byte-identical output).
 *
 * Expected values in the layout tests come from packing code written for the test, never from
 * the kernels' own unpack helpers.
 */
#include <stddef.h>

#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants2_impl.h"
#include "kernels/cpu/kquants_impl.h"
#include "kernels/kernels.h"

#define FP16_ONE 0x3C00  /* 1.0 */
#define FP16_HALF 0x3800 /* 0.5 */

static const int kv_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

/* ---- deterministic test data ---------------------------------------------------------------- */

static uint64_t rng_state;

static void
rng_seed(uint64_t s)
{
    rng_state = s * 0x9E3779B97F4A7C15ull + 1;
}

static uint64_t
rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double
rng_uniform(void) /* (0, 1) */
{
    return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
}

static float
rng_gauss(void)
{
    return (float)(sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform()));
}

/* Gaussian values whose spread changes from sub-block to sub-block, an occasional outlier, and
 * one all-positive and one all-zero 16-element group per 1024 (the min and zero paths). */
static void
fill_weights(float *x, int64_t n, uint64_t seed)
{
    rng_seed(seed);
    for (int64_t i = 0; i < n; i++) {
        const float spread = 0.02f + 0.05f * (float)((i / 32) % 7);
        x[i] = spread * rng_gauss() + ((i % 97) == 13 ? 0.5f : 0.0f);
        if (i % 1024 >= 512 && i % 1024 < 528)
            x[i] = fabsf(x[i]) + 0.01f;
        if (i % 1024 >= 768 && i % 1024 < 784)
            x[i] = 0.0f;
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

#define ASSERT_FEQ(a, b) ASSERT_NEAR(a, b, 0.0)

/* ---- the types under test ------------------------------------------------------------------- */

#if !defined(__x86_64__)
/* An arm64 build has no AVX kernels (the Makefile never compiles them there): the table's
 * direct x86 entries are NULL and the direct x86 tests below are compiled out; the NEON and
 * dot-product levels are tested through their dispatch tables (kquants2_level_neon/dotprod). */
#define sp__q5k_vec_dot_avx2 NULL
#define sp__q5k_vec_dot_avx512 NULL
#define sp__q5k_gemm_avx2 NULL
#define sp__q5k_gemm_avx512 NULL
#define sp__q3k_vec_dot_avx2 NULL
#define sp__q3k_vec_dot_avx512 NULL
#define sp__q3k_gemm_avx2 NULL
#define sp__q3k_gemm_avx512 NULL
#define sp__iq4xs_vec_dot_avx2 NULL
#define sp__iq4xs_vec_dot_avx512 NULL
#define sp__iq4xs_gemm_avx2 NULL
#define sp__iq4xs_gemm_avx512 NULL
#define sp__q2k_vec_dot_avx2 NULL
#define sp__q2k_vec_dot_avx512 NULL
#define sp__q2k_gemm_avx2 NULL
#define sp__q2k_gemm_avx512 NULL
#define sp__q2k_gemm_avx512_vnni NULL
#endif

typedef struct {
    sp_type_t type;
    size_t bsize;
    size_t d_off, dmin_off; /* byte offsets of the fp16 scales; dmin_off 0 = none */
    sp_vec_dot_fn ref;
    sp_vec_dot_fn avx2, avx512;
    sp_gemm_fn gemm_avx2, gemm_avx512;
    double rms_bound; /* relative RMS error bound of the round trip, see test_roundtrip */
} tdesc_t;

static const tdesc_t types[] = {
    {SP_TYPE_Q5_K, sizeof(sp_block_q5_k), offsetof(sp_block_q5_k, d),
     offsetof(sp_block_q5_k, dmin), sp__q5k_vec_dot_ref, sp__q5k_vec_dot_avx2,
     sp__q5k_vec_dot_avx512, sp__q5k_gemm_avx2, sp__q5k_gemm_avx512, 0.06},
    {SP_TYPE_Q3_K, sizeof(sp_block_q3_k), offsetof(sp_block_q3_k, d), 0, sp__q3k_vec_dot_ref,
     sp__q3k_vec_dot_avx2, sp__q3k_vec_dot_avx512, sp__q3k_gemm_avx2, sp__q3k_gemm_avx512, 0.25},
    {SP_TYPE_IQ4_XS, sizeof(sp_block_iq4_xs), offsetof(sp_block_iq4_xs, d), 0,
     sp__iq4xs_vec_dot_ref, sp__iq4xs_vec_dot_avx2, sp__iq4xs_vec_dot_avx512,
     sp__iq4xs_gemm_avx2, sp__iq4xs_gemm_avx512, 0.12},
    {SP_TYPE_Q2_K, sizeof(sp_block_q2_k), offsetof(sp_block_q2_k, d),
     offsetof(sp_block_q2_k, dmin), sp__q2k_vec_dot_ref, sp__q2k_vec_dot_avx2,
     sp__q2k_vec_dot_avx512, sp__q2k_gemm_avx2, sp__q2k_gemm_avx512, 0.5},
};
#define NTYPES ((int)(sizeof(types) / sizeof(types[0])))

/* ---- packing written from the format description -------------------------------------------- */

/* Q2_K / Q3_K 2-bit planes: element e = 128 h + 32 j + l lives in qs[32 h + l], bits 2j. */
static void
pack_2bit(uint8_t qs[64], const int u[256])
{
    memset(qs, 0, 64);
    for (int e = 0; e < 256; e++)
        qs[32 * (e / 128) + e % 32] |= (uint8_t)((u[e] & 3) << (2 * ((e % 128) / 32)));
}

static void
pack_q2k(sp_block_q2_k *b, const int q[256], const int sc[16], const int m[16])
{
    for (int g = 0; g < 16; g++)
        b->scales[g] = (uint8_t)(sc[g] | (m[g] << 4));
    pack_2bit(b->qs, q);
}

/* q in -4..3 stored as q + 4: bit 2 to hmask[e % 32] bit e / 32; scales s in -32..31 stored as
 * s + 32: low nibble of scale j in byte j % 8 (high nibble of the byte for j >= 8), top 2 bits
 * in byte 8 + j % 4 at bit 2 (j / 4). */
static void
pack_q3k(sp_block_q3_k *b, const int q[256], const int s[16])
{
    int u[256];
    memset(b->hmask, 0, 32);
    for (int e = 0; e < 256; e++) {
        u[e] = q[e] + 4;
        if (u[e] & 4)
            b->hmask[e % 32] |= (uint8_t)(1 << (e / 32));
    }
    pack_2bit(b->qs, u);
    memset(b->scales, 0, 12);
    for (int j = 0; j < 16; j++) {
        const int v = s[j] + 32;
        b->scales[j % 8] |= (uint8_t)((v & 0xF) << (j >= 8 ? 4 : 0));
        b->scales[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
    }
}

/* Q4_K's scale packing (sc, m 6 bits each) and nibble layout, plus qh[l] bit j = bit 4 of
 * element 32 j + l. */
static void
pack_q5k(sp_block_q5_k *b, const int q[256], const int sc[8], const int m[8])
{
    memset(b->scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            b->scales[j] |= (uint8_t)(sc[j] & 63);
            b->scales[j + 4] |= (uint8_t)(m[j] & 63);
        } else {
            b->scales[j + 4] |= (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            b->scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            b->scales[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
    memset(b->qh, 0, 32);
    memset(b->qs, 0, 128);
    for (int e = 0; e < 256; e++) {
        const int j = e / 32, l = e % 32;
        b->qs[32 * (j / 2) + l] |= (uint8_t)((q[e] & 0xF) << (4 * (j & 1)));
        b->qh[l] |= (uint8_t)((q[e] >> 4) << j);
    }
}

/* idx in 0..15; ls in 0..63 (stored, the scale is ls - 32). */
static void
pack_iq4xs(sp_block_iq4_xs *b, const int idx[256], const int ls[8])
{
    b->scales_h = 0;
    memset(b->scales_l, 0, 4);
    for (int ib = 0; ib < 8; ib++) {
        b->scales_l[ib / 2] |= (uint8_t)((ls[ib] & 0xF) << (4 * (ib % 2)));
        b->scales_h |= (uint16_t)((ls[ib] >> 4) << (2 * ib));
        for (int j = 0; j < 16; j++)
            b->qs[16 * ib + j] = (uint8_t)(idx[32 * ib + j] | (idx[32 * ib + 16 + j] << 4));
    }
}

/* Every level's to_float (all share the reference) equals `want`, exactly. */
static void
check_deq(sp_type_t type, const void *blk, const float *want)
{
    float out[256];
    ASSERT(sp_dequantize_row(type, blk, out, 256));
    for (int e = 0; e < 256; e++)
        if (out[e] != want[e])
            SP_TEST_FAIL("%s element %d: %g, want %g", sp_type_name(type), e, (double)out[e],
                         (double)want[e]);
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL)
            continue;
        ASSERT(k->to_float[type] != NULL);
        k->to_float[type](blk, out, 256);
        for (int e = 0; e < 256; e++) /* by value: a zero scale may give -0 */
            ASSERT_FEQ(out[e], want[e]);
    }
}

/* ---- layout tests --------------------------------------------------------------------------- */

TEST(kquants2_q2k_layout)
{
    int q[256], sc[16], m[16];
    for (int e = 0; e < 256; e++)
        q[e] = (e * 7 + e / 16) % 4;
    for (int g = 0; g < 16; g++) {
        sc[g] = (g * 5 + 3) % 16;
        m[g] = (g * 11 + 1) % 16;
    }
    sp_block_q2_k b;
    pack_q2k(&b, q, sc, m);
    b.d = FP16_ONE;
    b.dmin = FP16_HALF;
    float want[256];
    for (int e = 0; e < 256; e++)
        want[e] = (float)(sc[e / 16] * q[e]) - 0.5f * (float)m[e / 16];
    check_deq(SP_TYPE_Q2_K, &b, want);
}

TEST(kquants2_q3k_layout)
{
    int q[256], s[16];
    for (int e = 0; e < 256; e++)
        q[e] = (e * 5 + e / 32) % 8 - 4;
    for (int j = 0; j < 16; j++)
        s[j] = (j * 13 + 7) % 64 - 32; /* covers -32 and 31 */
    sp_block_q3_k b;
    pack_q3k(&b, q, s);
    b.d = FP16_HALF;
    float want[256];
    for (int e = 0; e < 256; e++)
        want[e] = 0.5f * (float)(s[e / 16] * q[e]);
    check_deq(SP_TYPE_Q3_K, &b, want);
}

TEST(kquants2_q5k_layout)
{
    int q[256];
    const int sc[8] = {1, 2, 3, 63, 17, 33, 48, 62};
    const int m[8] = {0, 5, 10, 63, 16, 31, 47, 60};
    for (int e = 0; e < 256; e++)
        q[e] = (e * 11 + e / 32) % 32;
    sp_block_q5_k b;
    pack_q5k(&b, q, sc, m);
    b.d = FP16_ONE;
    b.dmin = FP16_HALF;
    float want[256];
    for (int e = 0; e < 256; e++)
        want[e] = (float)(sc[e / 32] * q[e]) - 0.5f * (float)m[e / 32];
    check_deq(SP_TYPE_Q5_K, &b, want);
}

TEST(kquants2_iq4xs_layout)
{
    int idx[256];
    const int ls[8] = {0, 63, 32, 1, 47, 16, 33, 31};
    for (int e = 0; e < 256; e++)
        idx[e] = (e * 3 + e / 32) % 16;
    sp_block_iq4_xs b;
    pack_iq4xs(&b, idx, ls);
    b.d = FP16_HALF;
    float want[256];
    for (int e = 0; e < 256; e++)
        want[e] = 0.5f * (float)((ls[e / 32] - 32) * kv_iq4[idx[e]]);
    check_deq(SP_TYPE_IQ4_XS, &b, want);
}

TEST(kquants2_traits)
{
    for (int i = 0; i < NTYPES; i++) {
        const sp_type_traits_t *t = sp_type_traits(types[i].type);
        ASSERT(t != NULL && t->supported && t->is_quantized);
        ASSERT_EQ(t->blck_size, 256);
        ASSERT_EQ(t->type_size, types[i].bsize);
        for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
            const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
            if (k == NULL)
                continue;
            ASSERT_EQ(k->vec_dot_type[types[i].type], SP_TYPE_Q8_K);
            ASSERT(k->vec_dot[types[i].type] != NULL);
        }
    }
}

/* ---- quantizers ----------------------------------------------------------------------------- */

/* The dequantized -dm per element (0 for scale-only types): the block with all quants zeroed. */
static void
mins_of(const tdesc_t *td, const void *blk, float *m)
{
    uint8_t tmp[256];
    memcpy(tmp, blk, td->bsize);
    switch (td->type) {
    case SP_TYPE_Q2_K: memset(((sp_block_q2_k *)tmp)->qs, 0, 64); break;
    case SP_TYPE_Q5_K:
        memset(((sp_block_q5_k *)tmp)->qs, 0, 128);
        memset(((sp_block_q5_k *)tmp)->qh, 0, 32);
        break;
    default:
        for (int i = 0; i < 256; i++)
            m[i] = 0.0f;
        return;
    }
    ASSERT(sp_dequantize_row(td->type, tmp, m, 256));
}

/*
 * Round trip of every type on weight-like data:
 *  - nearest level: every element sits on the level of its (stored, rounded) sub-block scale
 *    nearest to it, unless it lies beyond the end levels (the scale search may clip outliers):
 *    |x - y| <= step / 2, with slack for the float arithmetic of (x + dm) / d and of the
 *    dequantization (a few ulps of the magnitudes involved: 1e-5 relative); for IQ4_XS the
 *    levels are d * kv[i] and the quantizer places them with the unrounded d (fp16 rounding
 *    moves a level by at most 2^-11 of itself), so y must be within that of the nearest level;
 *  - relative RMS error below a per-type bound: uniform rounding over a sub-block's spread of
 *    about 6 sigma in 2^b - 1 steps has RMS error 6 / (2^b - 1) / sqrt(12) sigma (0.056 for
 *    5 bits, 0.25 for 3, 0.58 for 2 bits, the symmetric 3-bit grid and the min both help), the
 *    non-linear 16-level grid about 0.1; a wrong packing gives errors around 1.
 */
TEST(kquants2_roundtrip)
{
    enum { N = 8 * 256 };
    static float x[N], y[N], mins[256];
    static uint8_t q[N / 256 * 256];
    fill_weights(x, N, 7);
    for (int ti = 0; ti < NTYPES; ti++) {
        const tdesc_t *td = &types[ti];
        ASSERT(sp_quantize_row(td->type, x, q, N));
        ASSERT(sp_dequantize_row(td->type, q, y, N));
        double err2 = 0, x2 = 0;
        for (int b = 0; b < N / 256; b++) {
            const uint8_t *blk = q + b * td->bsize;
            mins_of(td, blk, mins);
            for (int i = 0; i < 256; i++) {
                const int e = 256 * b + i;
                err2 += ((double)x[e] - y[e]) * ((double)x[e] - y[e]);
                x2 += (double)x[e] * x[e];
            }
            /* levels of each 16-element group: y values differ by multiples of the step */
            for (int g = 0; g < 16; g++) {
                const float *xs = x + 256 * b + 16 * g, *ys = y + 256 * b + 16 * g;
                const float dm = -mins[16 * g];
                float step = 0.0f, lo = 1e30f, hi = -1e30f;
                if (td->type == SP_TYPE_IQ4_XS) {
                    /* d * (ls - 32): from the block header */
                    const sp_block_iq4_xs *bb = (const sp_block_iq4_xs *)blk;
                    const int ib = g / 2;
                    const int ls = ((bb->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
                                   (((bb->scales_h >> (2 * ib)) & 3) << 4);
                    const float dl = sp_fp16_to_fp32(bb->d) * (float)(ls - 32);
                    for (int i = 0; i < 16; i++) {
                        float best = 1e30f;
                        for (int k = 0; k < 16; k++)
                            best = fminf(best, fabsf(xs[i] - dl * (float)kv_iq4[k]));
                        const float err = fabsf(xs[i] - ys[i]);
                        if (!(err <= best + fabsf(dl) * 127.0f * 0x1p-10f + 1e-7f))
                            SP_TEST_FAIL("iq4_xs b%d g%d i%d: x %g y %g, nearest level %g away",
                                         b, g, i, (double)xs[i], (double)ys[i], (double)best);
                    }
                    continue;
                }
                /* step = d * sc: one level up from the dequantized quant-0 value */
                uint8_t tmp[256];
                float lv[256];
                memcpy(tmp, blk, td->bsize);
                if (td->type == SP_TYPE_Q5_K) {
                    memset(((sp_block_q5_k *)tmp)->qs, 0x11, 128);
                    memset(((sp_block_q5_k *)tmp)->qh, 0, 32);
                } else if (td->type == SP_TYPE_Q2_K) {
                    memset(((sp_block_q2_k *)tmp)->qs, 0x55, 64);
                } else { /* Q3_K: all quants 1 (stored 5: low bits 01, hmask set) */
                    memset(((sp_block_q3_k *)tmp)->qs, 0x55, 64);
                    memset(((sp_block_q3_k *)tmp)->hmask, 0xFF, 32);
                }
                ASSERT(sp_dequantize_row(td->type, tmp, lv, 256));
                step = fabsf(lv[16 * g] + dm);
                const int nlev = td->type == SP_TYPE_Q5_K ? 31 : (td->type == SP_TYPE_Q2_K ? 3 : 7);
                lo = td->type == SP_TYPE_Q3_K ? -4.0f * step : -dm;
                hi = lo + (float)nlev * step;
                if (td->type == SP_TYPE_Q3_K && lv[16 * g] < 0) { /* negative scale: mirrored */
                    hi = 4.0f * step;
                    lo = hi - (float)nlev * step;
                }
                for (int i = 0; i < 16; i++) {
                    const float slack = 1e-5f * (fabsf(xs[i]) + dm + hi - lo) + 1e-7f;
                    if (xs[i] > hi || xs[i] < lo)
                        continue; /* beyond the end levels: clipped */
                    if (!(fabsf(xs[i] - ys[i]) <= step / 2 + slack))
                        SP_TEST_FAIL("%s b%d g%d i%d: x %g y %g step %g", sp_type_name(td->type),
                                     b, g, i, (double)xs[i], (double)ys[i], (double)step);
                }
            }
        }
        const double rel = sqrt(err2 / x2);
        if (!(rel <= td->rms_bound))
            SP_TEST_FAIL("%s: relative RMS error %.4f > %.4f", sp_type_name(td->type), rel,
                         td->rms_bound);
    }
}

/* Deterministic, no state between blocks, every byte written; garbage input never crashes. */
TEST(kquants2_quantize_determinism_and_garbage)
{
    enum { N = 4 * 256 };
    static float x[N];
    static uint8_t a[N / 256 * 256], b[N / 256 * 256], one[256];
    fill_weights(x, N, 5);
    for (int ti = 0; ti < NTYPES; ti++) {
        const tdesc_t *td = &types[ti];
        memset(a, 0x5A, sizeof(a));
        memset(b, 0xA5, sizeof(b));
        ASSERT(sp_quantize_row(td->type, x, a, N));
        ASSERT(sp_quantize_row(td->type, x, b, N));
        ASSERT(memcmp(a, b, (N / 256) * td->bsize) == 0);
        for (int r = 0; r < N / 256; r++) {
            ASSERT(sp_quantize_row(td->type, x + 256 * r, one, 256));
            ASSERT(memcmp(one, a + r * td->bsize, td->bsize) == 0);
        }
        ASSERT(!sp_quantize_row(td->type, x, a, 100)); /* not a whole super-block */
    }
    /* NaN, infinities and huge values: a defined (if meaningless) result, no UB (UBSan) */
    static float g[N];
    fill_gauss(g, N, 9);
    g[3] = NAN;
    g[300] = INFINITY;
    g[301] = -INFINITY;
    g[600] = 3e38f;
    for (int i = 768; i < 1024; i++)
        g[i] = i % 2 ? NAN : 1e-30f;
    for (int ti = 0; ti < NTYPES; ti++) {
        float back[N];
        ASSERT(sp_quantize_row(types[ti].type, g, a, N));
        ASSERT(sp_dequantize_row(types[ti].type, a, back, N));
    }
}

/* ---- dot products, per level ---------------------------------------------------------------- */

enum { DN = 8 * 256, ROWS = 6, TOKS = 11, MAXB = 176 };

typedef struct {
    float w[ROWS][DN], x[TOKS][DN];
    uint8_t wq[ROWS][DN / 256 * MAXB];
    sp_block_q8_k xq[TOKS][DN / 256];
} dot_fixture_t;

/* random_bytes: every weight byte random (then sane fp16 scales), so the SIMD unpacking meets
 * every bit pattern; otherwise the reference quantizer's output of weight-like data. */
static dot_fixture_t *
make_fixture(const tdesc_t *td, int random_bytes)
{
    dot_fixture_t *f = malloc(sizeof(*f));
    ASSERT(f != NULL);
    memset(f, 0xA5, sizeof(*f));
    for (int r = 0; r < ROWS; r++) {
        fill_weights(f->w[r], DN, 100 + r);
        if (random_bytes) {
            rng_seed(300 + r + 17 * td->type);
            for (size_t i = 0; i < sizeof(f->wq[r]); i++)
                f->wq[r][i] = (uint8_t)(rng_next() >> 56);
            for (int b = 0; b < DN / 256; b++) {
                uint8_t *blk = f->wq[r] + b * td->bsize;
                const sp_fp16_t d = sp_fp32_to_fp16((float)(0.001 + 0.01 * rng_uniform()));
                memcpy(blk + td->d_off, &d, 2);
                if (td->dmin_off)
                    memcpy(blk + td->dmin_off, &d, 2);
            }
        } else {
            ASSERT(sp_quantize_row(td->type, f->w[r], f->wq[r], DN));
        }
    }
    for (int t = 0; t < TOKS; t++) {
        fill_gauss(f->x[t], DN, 200 + t);
        if (t == 3)
            f->x[t][17] = 40.0f; /* an outlier activation: most quants near zero */
        ASSERT(sp_quantize_row(SP_TYPE_Q8_K, f->x[t], f->xq[t], DN));
    }
    return f;
}

/*
 * vec_dot against the double-precision dot of the dequantized values. The int32 part is exact;
 * the float finish rounds 4 times per super-block and the running sum once per super-block, each
 * by at most 2^-24 of a partial sum bounded by mag = sum (|w| + 2 |m|) |x| (m: the per-element
 * min term, which the finish subtracts separately); the float dequantization rounds d * sc * q
 * and the subtraction of d * m (2^-24 relative each). So |got - want| <= (nb + 8) 2^-23 mag.
 */
static void
check_dot_vs_float(const tdesc_t *td, sp_vec_dot_fn dot, const dot_fixture_t *f, int r, int t)
{
    static float wd[DN], xd[DN], m[256];
    const int nb = DN / 256;
    ASSERT(sp_dequantize_row(td->type, f->wq[r], wd, DN));
    ASSERT(sp_dequantize_row(SP_TYPE_Q8_K, f->xq[t], xd, DN));
    double want = 0, mag = 0;
    for (int b = 0; b < nb; b++) {
        mins_of(td, f->wq[r] + b * td->bsize, m);
        for (int i = 0; i < 256; i++) {
            const int e = 256 * b + i;
            want += (double)wd[e] * xd[e];
            mag += (fabs(wd[e]) + 2 * fabs(m[i])) * fabs(xd[e]);
        }
    }
    float got;
    dot(DN, &got, f->wq[r], f->xq[t]);
    if (!(fabs(got - want) <= (nb + 8) * 0x1p-23 * mag + 1e-30))
        SP_TEST_FAIL("%s r%d t%d: %.9g vs float %.9g (mag %g)", sp_type_name(td->type), r, t,
                     (double)got, want, mag);
}

/* One level's vec_dot and gemm for one type: the reference's exact bits, the gemm the vec_dot's
 * bits for every (row, token) in any batch shape, other outputs untouched. */
static void
check_level(const char *what, const tdesc_t *td, sp_vec_dot_fn dot, sp_gemm_fn gemm,
            int random_bytes)
{
    dot_fixture_t *f = make_fixture(td, random_bytes);
    const size_t ws = sizeof(f->wq[0]);
    float s[ROWS][TOKS];
    for (int r = 0; r < ROWS; r++)
        for (int t = 0; t < TOKS; t++) {
            float got, again, ref;
            dot(DN, &got, f->wq[r], f->xq[t]);
            dot(DN, &again, f->wq[r], f->xq[t]);
            td->ref(DN, &ref, f->wq[r], f->xq[t]);
            if (memcmp(&got, &ref, 4) != 0)
                SP_TEST_FAIL("%s %s r%d t%d: %.9g != reference %.9g", what,
                             sp_type_name(td->type), r, t, (double)got, (double)ref);
            ASSERT_BITS_EQ(got, again);
            if (!random_bytes && (r + t) % 3 == 0)
                check_dot_vs_float(td, dot, f, r, t);
            s[r][t] = got;
        }
    if (gemm != NULL) {
        enum { LDY = ROWS + 3 };
        float y[TOKS * LDY];
        /* rows [1, ROWS), all tokens (full tiles of 4 or 8 and a tail of 3), into a wider output */
        const gemm_case_t gc = {gemm, DN, f->wq[0], ws, f->xq, sizeof(f->xq[0]), &s[0][0], 1, TOKS,
                                false};
        GEMM_CHECK_ASSERT(gemm_check_range(&gc, 1, ROWS, TOKS, y, LDY, TOKS), "%s %s rows [1,%d)",
                          what, sp_type_name(td->type), ROWS);
        /* every batch size 1..TOKS from every start gives the same bits (batch invariance) */
        for (int t0 = 0; t0 < TOKS; t0++)
            for (int nt = 1; t0 + nt <= TOKS; nt++) {
                float part[TOKS * ROWS];
                gemm(DN, f->wq[0], ws, 0, ROWS, f->xq[t0], sizeof(f->xq[0]), nt, part, ROWS);
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < ROWS; r++)
                        ASSERT_BITS_EQ(part[t * ROWS + r], s[r][t0 + t]);
            }
    }
    free(f);
}

/* The dispatched table of a level, through sp_cpu_gemm too. */
static void
check_table(sp_cpu_level_t level)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(level);
    ASSERT(k != NULL);
    for (int ti = 0; ti < NTYPES; ti++) {
        const tdesc_t *td = &types[ti];
        for (int rb = 0; rb < 2; rb++)
            check_level(k->name, td, k->vec_dot[td->type], k->gemm[td->type], rb);
        dot_fixture_t *f = make_fixture(td, 0);
        float y[TOKS * ROWS];
        sp_cpu_gemm(k, td->type, DN, f->wq, sizeof(f->wq[0]), 0, ROWS, f->xq, sizeof(f->xq[0]),
                    TOKS, y, ROWS);
        for (int t = 0; t < TOKS; t++)
            for (int r = 0; r < ROWS; r++) {
                float s;
                td->ref(DN, &s, f->wq[r], f->xq[t]);
                ASSERT_BITS_EQ(y[t * ROWS + r], s);
            }
        free(f);
    }
}

TEST(kquants2_level_scalar)
{
    check_table(SP_CPU_SCALAR);
}

#if defined(__x86_64__)
TEST(kquants2_level_avx2)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX2) == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 kernels not tested");
    check_table(SP_CPU_AVX2);
    for (int ti = 0; ti < NTYPES; ti++)
        for (int rb = 0; rb < 2; rb++)
            check_level("avx2 (direct)", &types[ti], types[ti].avx2, types[ti].gemm_avx2, rb);
}

TEST(kquants2_level_avx512)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX512) == NULL)
        SKIP("this CPU has no AVX-512 F/BW/VL: AVX-512 kernels not tested");
    check_table(SP_CPU_AVX512);
    for (int ti = 0; ti < NTYPES; ti++)
        for (int rb = 0; rb < 2; rb++)
            check_level("avx512 (direct)", &types[ti], types[ti].avx512, types[ti].gemm_avx512,
                        rb);
}
#elif defined(__aarch64__)
TEST(kquants2_level_neon)
{
    check_table(SP_CPU_NEON);
}

TEST(kquants2_level_dotprod)
{
    if (sp_cpu_kernels_for(SP_CPU_DOTPROD) == NULL)
        SKIP("this CPU has no dot-product extension: SDOT K-quant kernels not tested");
    check_table(SP_CPU_DOTPROD);
}
#endif

/* Extreme integer ranges: the largest quants and scales of each type against Q8_K quants of
 * +-127: the int16 pair sums and int32 block sums of every level must equal the reference's
 * bits, and the reference the exact value (computed in double; the finish's roundings bound the
 * difference by 4 2^-24 relative). */
TEST(kquants2_extreme_values)
{
    uint8_t blk[NTYPES][MAXB];
    int q[256], sc16[16], m16[16], sc8[8], m8[8], s16[16];
    for (int e = 0; e < 256; e++)
        q[e] = 31;
    for (int g = 0; g < 16; g++) {
        sc16[g] = 15;
        m16[g] = g & 1 ? 15 : 0;
        s16[g] = g & 1 ? 31 : -32;
    }
    for (int j = 0; j < 8; j++) {
        sc8[j] = 63;
        m8[j] = j & 1 ? 63 : 0;
    }
    for (int ti = 0; ti < NTYPES; ti++) {
        void *b = blk[ti];
        switch (types[ti].type) {
        case SP_TYPE_Q5_K:
            pack_q5k(b, q, sc8, m8);
            break;
        case SP_TYPE_Q2_K: {
            int q3[256];
            for (int e = 0; e < 256; e++)
                q3[e] = 3;
            pack_q2k(b, q3, sc16, m16);
            break;
        }
        case SP_TYPE_Q3_K: {
            int q4[256];
            for (int e = 0; e < 256; e++)
                q4[e] = e & 1 ? 3 : -4;
            pack_q3k(b, q4, s16);
            break;
        }
        default: {
            int idx[256], ls[8];
            for (int e = 0; e < 256; e++)
                idx[e] = e & 1 ? 15 : 0; /* 113 and -127 */
            for (int j = 0; j < 8; j++)
                ls[j] = j & 1 ? 63 : 0;
            pack_iq4xs(b, idx, ls);
            break;
        }
        }
        const sp_fp16_t one = FP16_ONE;
        memcpy((uint8_t *)b + types[ti].d_off, &one, 2);
        if (types[ti].dmin_off)
            memcpy((uint8_t *)b + types[ti].dmin_off, &one, 2);
    }
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
        for (int ti = 0; ti < NTYPES; ti++) {
            float wd[256], ref;
            double want = 0;
            ASSERT(sp_dequantize_row(types[ti].type, blk[ti], wd, 256));
            for (int i = 0; i < 256; i++)
                want += (double)wd[i] * x.qs[i];
            types[ti].ref(256, &ref, blk[ti], &x);
            ASSERT(fabs(ref - want) <= 4 * 0x1p-24 * fabs(want));
            for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
                const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
                if (k == NULL)
                    continue;
                float s;
                k->vec_dot[types[ti].type](256, &s, blk[ti], &x);
                ASSERT_BITS_EQ(s, ref);
            }
        }
    }
}

/* Known answers: the FNV-1a 64 hash of the bytes ggml's reference quantizers
 * (quantize_row_{q5_K,q3_K,iq4_xs,q2_K}_ref of llama.cpp's ggml-quants.c, built out of tree)
 * write for fill_kat's 16 super-blocks. Equal hashes mean byte-identical output to ggml's
 * reference path; a change to a quantizer's search, rounding or packing changes the hash. The
 * quantizers use only IEEE basic operations, sqrtf and nearbyintf (all exactly specified), so
 * the hashes hold on any machine. */
static uint64_t
fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Weight-like data from IEEE basic operations only (no libm), so every machine computes the
 * same floats: a sum of 4 uniforms (roughly Gaussian), a spread per 32 elements, outliers, an
 * all-positive and an all-zero group per 1024. */
static void
fill_kat(float *x, int64_t n)
{
    rng_seed(4242);
    for (int64_t i = 0; i < n; i++) {
        double g = 0;
        for (int k = 0; k < 4; k++)
            g += (double)(rng_next() >> 40) * 0x1p-24;
        const float spread = 0.02f + 0.05f * (float)((i / 32) % 7);
        x[i] = spread * (float)(g - 2.0) + ((i % 97) == 13 ? 0.5f : 0.0f);
        if (i % 1024 >= 512 && i % 1024 < 528)
            x[i] = fabsf(x[i]) + 0.01f;
        if (i % 1024 >= 768 && i % 1024 < 784)
            x[i] = 0.0f;
    }
}

TEST(kquants2_quantize_matches_ggml)
{
    enum { N = 16 * 256 };
    static const struct {
        sp_type_t type;
        uint64_t hash;
    } want[] = {
        {SP_TYPE_Q5_K, 0x953f041f3c256814ull},
        {SP_TYPE_Q3_K, 0x94063e0363192b59ull},
        {SP_TYPE_IQ4_XS, 0x592355bba619980eull},
        {SP_TYPE_Q2_K, 0x79a342b45df3ecc8ull},
    };
    static float x[N];
    static uint8_t q[N];
    fill_kat(x, N);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        ASSERT(sp_quantize_row(want[i].type, x, q, N));
        const uint64_t h = fnv1a(q, sp_row_size(want[i].type, N));
        if (h != want[i].hash)
            SP_TEST_FAIL("%s: bytes hash to 0x%016" PRIx64 ", ggml's to 0x%016" PRIx64,
                         sp_type_name(want[i].type), h, want[i].hash);
    }
}

/*
 * Every element position on its own: one random-byte super-block (distinct d and dmin) against
 * an activation block whose only non-zero quant is 100 at element e, for every e and every
 * level, through vec_dot and a 9-token gemm. The SIMD kernels regroup the quants (chunks of
 * 32 to 128 elements, IQ4_XS's nibble halves moved into the 128-bit lanes, scales broadcast
 * per sub-block), so an element or scale taken from the wrong place shows here with its
 * position named. Each level must give the
 * reference's bits, and the reference d * sc * q * 100 - dmin * m * 100 = 100 w[e] (w the
 * dequantized weight): both sides are a few float roundings of the same products, each within
 * 2^-24 of (|w[e]| + 2 |m[e]|) * 100, so 8 2^-24 of that bounds the difference.
 */
TEST(kquants2_element_positions)
{
    for (int ti = 0; ti < NTYPES; ti++) {
        const tdesc_t *td = &types[ti];
        uint8_t blk[MAXB];
        rng_seed(77 + (uint64_t)td->type);
        for (size_t i = 0; i < td->bsize; i++)
            blk[i] = (uint8_t)(rng_next() >> 56);
        const sp_fp16_t d = sp_fp32_to_fp16(0.0123f), dmin = sp_fp32_to_fp16(0.0071f);
        memcpy(blk + td->d_off, &d, 2);
        if (td->dmin_off)
            memcpy(blk + td->dmin_off, &dmin, 2);
        float w[256], m[256];
        ASSERT(sp_dequantize_row(td->type, blk, w, 256));
        mins_of(td, blk, m);
        for (int e = 0; e < 256; e++) {
            sp_block_q8_k y;
            memset(&y, 0, sizeof(y));
            y.d = 1.0f;
            y.qs[e] = 100;
            y.bsums[e / 16] = 100;
            float ref;
            td->ref(256, &ref, blk, &y);
            const double want = 100.0 * w[e];
            if (!(fabs(ref - want) <= 8 * 0x1p-24 * 100.0 * (fabs(w[e]) + 2 * fabs(m[e])) + 1e-30))
                SP_TEST_FAIL("%s element %d: reference %.9g vs 100 w = %.9g",
                             sp_type_name(td->type), e, (double)ref, want);
            for (int lv = SP_CPU_AVX2; lv <= SP_CPU_TOP; lv++) {
                const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
                if (k == NULL)
                    continue;
                float got, g[9];
                k->vec_dot[td->type](256, &got, blk, &y);
                if (memcmp(&got, &ref, 4) != 0)
                    SP_TEST_FAIL("%s %s element %d: %.9g != reference %.9g", k->name,
                                 sp_type_name(td->type), e, (double)got, (double)ref);
                /* the same activation as token 6 of 9 (inside a full token tile of every
                 * kernel: 4 or 8 wide), the others all zero */
                sp_block_q8_k ys[9];
                memset(ys, 0, sizeof(ys));
                ys[6] = y;
                k->gemm[td->type](256, blk, td->bsize, 0, 1, ys, sizeof(y), 9, g, 1);
                for (int t = 0; t < 9; t++) {
                    if (t == 6)
                        ASSERT_BITS_EQ(g[t], ref);
                    else
                        ASSERT(g[t] == 0.0f);
                }
            }
        }
    }
}

/* ---- the AVX2 panel gemms (Q2_K, Q3_K, Q5_K, IQ4_XS): 8-token tiles, chunks that stay in L2 -- */

/*
 * Every batch size 1..nt_max and several row ranges: the gemm gives the reference's bits for
 * every (row, token) and writes nothing else. The activations are laid out 40 KiB apart, so an
 * AVX2 token chunk holds only 8 tokens and 33 tokens cross four chunk boundaries (the chunk
 * loop, the 8-token panel and the 1..7-token tails all run). Random weight bytes (every quant
 * pattern), nb super-blocks: 3, and 37 for the AVX-512 panels (which decode 8 super-blocks
 * at a time: four panel boundaries and a short last panel) with 70 tokens, and 11 with 260
 * tokens (past their 256-token chunk).
 */
/* Token counts to try: 1..34, then steps of 12, and t_max itself. */
static int
next_nt(int nt, int t_max)
{
    const int next = nt < 34 ? nt + 1 : nt + 12;
    return next > t_max && nt < t_max ? t_max : next;
}

static void
check_panels(const sp_cpu_kernels_t *k, int nb, int t_max, const sp_type_t *pts, size_t n_pts)
{
    enum { R = 5, LDY = R + 2, XS = 40 * 1024 };
    ASSERT(nb * 292 <= XS);
    uint8_t *x = malloc((size_t)t_max * XS);
    float *f = malloc(sizeof(float) * (size_t)nb * 256);
    uint8_t *wp = malloc((size_t)R * (size_t)nb * MAXB);
    float *want = malloc(sizeof(float) * (size_t)(t_max * R));
    float *y = malloc(sizeof(float) * (size_t)(t_max * LDY));
    ASSERT(x != NULL && f != NULL && wp != NULL && want != NULL && y != NULL);
    rng_seed(991);
    for (int t = 0; t < t_max; t++) {
        for (int i = 0; i < nb * 256; i++)
            f[i] = rng_gauss() * (t == 5 && i == 77 ? 30.0f : 1.0f);
        ASSERT(sp_quantize_row(SP_TYPE_Q8_K, f, x + (size_t)t * XS, nb * 256));
    }
    for (size_t pi = 0; pi < n_pts; pi++) {
        const tdesc_t *td = NULL;
        for (int ti = 0; ti < NTYPES; ti++)
            if (types[ti].type == pts[pi])
                td = &types[ti];
        ASSERT(td != NULL);
        /* the panel rows nb blocks apart: w_stride = nb * bsize */
        const size_t ws = (size_t)nb * td->bsize;
        for (int r = 0; r < R; r++)
            for (int b = 0; b < nb; b++) {
                uint8_t *blk = wp + r * ws + b * td->bsize;
                for (size_t i = 0; i < td->bsize; i++)
                    blk[i] = (uint8_t)(rng_next() >> 56);
                const sp_fp16_t d = sp_fp32_to_fp16((float)(0.001 + 0.01 * rng_uniform()));
                memcpy(blk + td->d_off, &d, 2);
                if (td->dmin_off)
                    memcpy(blk + td->dmin_off, &d, 2);
            }
        for (int t = 0; t < t_max; t++)
            for (int r = 0; r < R; r++)
                td->ref(nb * 256, &want[t * R + r], wp + r * ws, x + (size_t)t * XS);
        for (int r0 = 0; r0 <= 1; r0++)
            for (int r1 = r0 + 1; r1 <= R; r1 += 2)
                for (int nt = 1; nt <= t_max; nt = next_nt(nt, t_max)) {
                    const gemm_case_t gc = {k->gemm[td->type], nb * 256, wp, ws, x, XS, want, R, 1,
                                            false};
                    GEMM_CHECK_ASSERT(gemm_check_range(&gc, r0, r1, nt, y, LDY, t_max),
                                      "%s %s rows [%d,%d) %d tokens", k->name,
                                      sp_type_name(td->type), r0, r1, nt);
                }
    }
    free(x);
    free(f);
    free(wp);
    free(want);
    free(y);
}

TEST(kquants2_gemm_panels)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 panel gemms not tested");
    static const sp_type_t pts[] = {SP_TYPE_Q2_K, SP_TYPE_IQ4_XS, SP_TYPE_Q3_K, SP_TYPE_Q5_K};
    check_panels(k, 3, 33, pts, sizeof pts / sizeof pts[0]);
}

/* The AVX-512 VNNI panels (avx512_kpanel.c: Q2_K): long rows, many tokens. */
TEST(kquants2_gemm_panels_avx512)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX512);
    if (k == NULL || !sp__cpu_features()->avx512_vnni)
        SKIP("this CPU has no AVX-512 VNNI: the VNNI panel gemms not tested");
    ASSERT(k->gemm[SP_TYPE_Q2_K] == sp__q2k_gemm_avx512_vnni);
    static const sp_type_t pts[] = {SP_TYPE_Q2_K};
    check_panels(k, 3, 33, pts, 1);
    check_panels(k, 37, 70, pts, 1);
    check_panels(k, 11, 260, pts, 1);
}

/*
 * The panels' int16 sums at their limits: Q2_K with every quant 3 and every scale 15 (q * sc =
 * 45, two pair sums of 2 * 45 * 127 added in int16: 22860), IQ4_XS at -127 and 113 with the
 * largest scales, against activations of +-127 in 9 tokens (one panel and one token of tail):
 * the reference's bits, which kquants2_extreme_values ties to the exact value.
 */
static void
check_panel_extremes(const sp_cpu_kernels_t *k)
{
    enum { T = 9 };
    sp_block_q2_k q2;
    sp_block_iq4_xs iq;
    int q[256], sc[16], m[16], idx[256], ls[8];
    for (int e = 0; e < 256; e++) {
        q[e] = 3;
        idx[e] = e & 1 ? 15 : 0;
    }
    for (int g = 0; g < 16; g++) {
        sc[g] = 15;
        m[g] = g & 1 ? 15 : 0;
    }
    for (int j = 0; j < 8; j++)
        ls[j] = j & 1 ? 63 : 0;
    pack_q2k(&q2, q, sc, m);
    pack_iq4xs(&iq, idx, ls);
    q2.d = q2.dmin = iq.d = FP16_ONE;
    sp_block_q8_k x[T];
    for (int t = 0; t < T; t++) {
        x[t].d = 1.0f;
        for (int i = 0; i < 256; i++) {
            const int sign = t % 3 == 0 ? 1 : t % 3 == 1 ? -1 : (i & 1 ? 1 : -1);
            x[t].qs[i] = (int8_t)(127 * sign * ((i % 5 == 4 && t >= 6) ? -1 : 1));
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += x[t].qs[16 * g + i];
            x[t].bsums[g] = (int16_t)s;
        }
    }
    const void *ws[2] = {&q2, &iq};
    const sp_type_t wt[2] = {SP_TYPE_Q2_K, SP_TYPE_IQ4_XS};
    for (int i = 0; i < 2; i++) {
        float y[T];
        k->gemm[wt[i]](256, ws[i], 0, 0, 1, x, sizeof(x[0]), T, y, 1);
        for (int t = 0; t < T; t++) {
            float ref;
            sp_cpu_kernels_ref()->vec_dot[wt[i]](256, &ref, ws[i], &x[t]);
            ASSERT_BITS_EQ(y[t], ref);
        }
    }
}

TEST(kquants2_gemm_panel_extremes)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    if (k == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 panel gemms not tested");
    check_panel_extremes(k);
}

TEST(kquants2_gemm_panel_extremes_avx512)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX512);
    if (k == NULL || !sp__cpu_features()->avx512_vnni)
        SKIP("this CPU has no AVX-512 VNNI: the VNNI panel gemms not tested");
    check_panel_extremes(k);
}
