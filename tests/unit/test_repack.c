/*
 * test_repack.c - the packed (8-row interleaved) form of Q4_0, IQ4_NL, Q8_0 and Q4_K weights:
 * the byte layout against kernels.h's description, pack / unpack round trips of arbitrary
 * bytes with row counts that are not a multiple of 8 (zero padding rows), and every level's
 * packed gemm against the scalar reference vec_dot on the original rows, bit for bit (the
 * packed kernels keep the reference's order of operations), for row ranges that start and
 * end inside a group, 1..33 tokens (decode and prefill tiles, token-chunk tails) and the
 * extreme integer ranges.
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"
#include "kernels/kernels.h"

static uint64_t rp_rng;

static double
rp_uniform(void) /* (0, 1) */
{
    rp_rng ^= rp_rng << 13;
    rp_rng ^= rp_rng >> 7;
    rp_rng ^= rp_rng << 17;
    return ((double)(rp_rng >> 11) + 0.5) / 9007199254740992.0;
}

static float
rp_gauss(void)
{
    return (float)(sqrt(-2.0 * log(rp_uniform())) * cos(6.283185307179586 * rp_uniform()));
}

#define ASSERT_BITS(a, b, ...)                                                                \
    do {                                                                                      \
        float a_ = (a), b_ = (b);                                                             \
        if (memcmp(&a_, &b_, sizeof(float)) != 0)                                             \
            SP_TEST_FAIL(__VA_ARGS__);                                                        \
    } while (0)

#define RP_NTYPES 8
static const sp_type_t rp_types[RP_NTYPES] = {SP_TYPE_Q4_0,   SP_TYPE_IQ4_NL, SP_TYPE_Q8_0,
                                              SP_TYPE_Q4_K,   SP_TYPE_IQ4_XS, SP_TYPE_MXFP4,
                                              SP_TYPE_Q6_K,   SP_TYPE_Q5_K};

/* the 256-element super-block types */
static bool
rp_super(sp_type_t type)
{
    return type == SP_TYPE_Q4_K || type == SP_TYPE_IQ4_XS || type == SP_TYPE_Q6_K ||
           type == SP_TYPE_Q5_K;
}

/* The layout as kernels.h states it, spelled out independently of sp__repack_qs_off. */
TEST(repack_layout)
{
    const int64_t n = 64, rows = 13;
    const size_t rb = 18 * 2;
    uint8_t src[13 * 36];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    ASSERT_EQ(sp_repack_group_bytes(SP_TYPE_Q4_0, n), 2 * 144);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_IQ4_NL, n, rows), 2 * 2 * 144);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q8_0, n, rows), 2 * 2 * 272);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q4_K, 512, rows), 2 * 2 * 1184);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q4_K, 288, rows), 0);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_IQ4_XS, 256, rows), 2 * 1104);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_MXFP4, n, rows), 2 * 2 * 136);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q6_K, 512, rows), 2 * 2 * 1680);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q5_K, 256, rows), 2 * 1440);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q6_K, 288, rows), 0);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q2_K, 256, rows), 0);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q4_0, 48, rows), 0);
    ASSERT_EQ(sp_repack_bytes(SP_TYPE_Q4_0, SP_REPACK_MAX_N + 32, rows), 0);
    uint8_t dst[4 * 144];
    memset(dst, 0xEE, sizeof dst);
    sp_repack_pack(SP_TYPE_Q4_0, n, src, rb, rows, 0, 2, dst);
    static const int set[2][4] = {{0, 1, 4, 5}, {2, 3, 6, 7}};
    for (int g = 0; g < 2; g++) {
        for (int b = 0; b < 2; b++) {
            const uint8_t *pb = dst + g * 288 + b * 144;
            for (int r = 0; r < 8; r++) {
                const int row = g * 8 + r;
                const uint8_t *blk = row < rows ? src + row * rb + b * 18 : NULL;
                for (int i = 0; i < 2; i++)
                    ASSERT_EQ(pb[2 * r + i], blk ? blk[i] : 0);
            }
            for (int c = 0; c < 4; c++) {
                for (int l = 0; l < 4; l++) {
                    const int row = g * 8 + set[c % 2][l];
                    for (int j = 0; j < 8; j++) {
                        const int byte = 8 * (c / 2) + j;
                        const int want = row < rows ? src[row * rb + b * 18 + 2 + byte] : 0;
                        ASSERT_EQ(pb[16 + 32 * c + 8 * l + j], want);
                    }
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        uint8_t back[36];
        sp_repack_unpack_row(SP_TYPE_Q4_0, n, dst, r, back);
        ASSERT(memcmp(back, src + r * rb, rb) == 0);
    }
}

/* Random quantised rows of one type, their packed form, Q8_0 activations (some blocks all
 * zero, one with an outlier), and the reference results. */
typedef struct {
    int64_t n, rows, toks;
    uint8_t *w, *packed, *x;
    size_t rb, gb, xs;
    float *want;
} rp_case_t;

static void
rp_case_make(rp_case_t *c, sp_type_t type, int64_t n, int64_t rows, int64_t toks, uint64_t seed,
             sp_repack_layout_t lay)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    c->n = n;
    c->rows = rows;
    c->toks = toks;
    c->rb = sp_row_size(type, n);
    c->gb = sp_repack_group_bytes_in(lay, type, n);
    const sp_type_t at = ref->vec_dot_type[type];
    c->xs = sp_row_size(at, n);
    c->w = malloc(c->rb * (size_t)rows);
    c->packed = malloc(sp_repack_bytes_in(lay, type, n, rows));
    c->x = malloc(c->xs * (size_t)toks);
    c->want = malloc(sizeof(float) * (size_t)(rows * toks));
    float *f = malloc(sizeof(float) * (size_t)n);
    ASSERT(c->w && c->packed && c->x && c->want && f);
    rp_rng = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = (0.02f + 0.03f * (float)((i / 32 + r) % 5)) * rp_gauss();
        ASSERT(sp_quantize_row(type, f, c->w + (size_t)r * c->rb, n));
    }
    for (int64_t t = 0; t < toks; t++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = ((i / 32 + t) % 11 == 4) ? 0.0f : rp_gauss();
        if (t == 1)
            f[n / 2] = 50.0f;
        ref->from_float[at](f, c->x + (size_t)t * c->xs, n);
    }
    free(f);
    const int gr = sp_repack_layout_rows(lay);
    sp_repack_pack_in(lay, type, n, c->w, c->rb, rows, 0, (rows + gr - 1) / gr, c->packed);
    for (int64_t t = 0; t < toks; t++)
        for (int64_t r = 0; r < rows; r++)
            ref->vec_dot[type](n, &c->want[t * rows + r], c->w + (size_t)r * c->rb,
                               c->x + (size_t)t * c->xs);
}

static void
rp_case_free(rp_case_t *c)
{
    free(c->w);
    free(c->packed);
    free(c->x);
    free(c->want);
}

/* gemm over rows [r0, r1) and tokens [0, nt) (nt <= toks): the reference's bits there, and
 * the rest of y untouched. */
static void
rp_check_gemm(const char *what, sp_type_t type, sp_gemm_fn gemm, const rp_case_t *c, int64_t r0,
              int64_t r1, int64_t nt)
{
    const int64_t ldy = c->rows + 3;
    float *y = malloc(sizeof(float) * (size_t)(ldy * nt));
    ASSERT(y != NULL);
    const gemm_case_t gc = {gemm, c->n, c->packed, c->gb, c->x, c->xs, c->want, c->rows, 1, false};
    GEMM_CHECK_ASSERT(gemm_check_range(&gc, r0, r1, nt, y, ldy, nt),
                      "%s %s n=%lld rows [%lld,%lld) of %lld, %lld tokens", what,
                      sp_type_name(type), (long long)c->n, (long long)r0, (long long)r1,
                      (long long)c->rows, (long long)nt);
    free(y);
}

static void
rp_check_kernel(const char *what, sp_type_t type, sp_gemm_fn gemm, sp_repack_layout_t lay)
{
    static const int64_t ns32[] = {32, 96, 288, 2048}, nsk[] = {256, 768, 2048};
    const bool k = rp_super(type);
    const int64_t *ns = k ? nsk : ns32;
    const size_t n_ns = k ? sizeof nsk / sizeof nsk[0] : sizeof ns32 / sizeof ns32[0];
    /* 70 rows: 5 panels of 16 or 9 groups of 8, so the one-token calls pair groups over two
     * streams (g with g + h) and leave an odd one alone */
    static const int64_t rowss[] = {1, 7, 8, 13, 37, 70};
    static const int64_t nts[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 33, 64};
    for (size_t in = 0; in < n_ns; in++) {
        for (size_t ir = 0; ir < sizeof rowss / sizeof rowss[0]; ir++) {
            rp_case_t c;
            const int64_t rows = rowss[ir];
            rp_case_make(&c, type, ns[in], rows, 64, 17 * in + ir, lay);
            for (size_t it = 0; it < sizeof nts / sizeof nts[0]; it++)
                rp_check_gemm(what, type, gemm, &c, 0, rows, nts[it]);
            if (rows > 3) { /* ranges that start and end inside a group */
                rp_check_gemm(what, type, gemm, &c, 3, rows - 1, 1);
                rp_check_gemm(what, type, gemm, &c, 3, rows - 1, 5);
                rp_check_gemm(what, type, gemm, &c, rows / 2, rows / 2 + 1, 2);
            }
            rp_case_free(&c);
        }
    }
}

TEST(repack_gemm_scalar)
{
    for (int i = 0; i < RP_NTYPES; i++)
        rp_check_kernel("scalar packed", rp_types[i], sp__repack_gemm_ref(rp_types[i]),
                        SP_REPACK_ROW8);
    rp_check_kernel("scalar panel16", SP_TYPE_Q8_0, sp__repack_q8_0_p16_gemm_ref,
                    SP_REPACK_PANEL16);
    rp_check_kernel("scalar panel16", SP_TYPE_Q4_0, sp__repack_q4_0_p16_gemm_ref,
                    SP_REPACK_PANEL16);
}

/* Every packed gemm of table k through rp_check_kernel; how many it has. */
static int
rp_check_table(const sp_cpu_kernels_t *k)
{
    int n = 0;
    for (int i = 0; i < RP_NTYPES; i++) {
        if (k->repack_gemm[rp_types[i]] != NULL) {
            rp_check_kernel(k->name, rp_types[i], k->repack_gemm[rp_types[i]],
                            k->repack_layout[rp_types[i]]);
            n++;
        }
    }
    return n;
}

static void
rp_check_level(sp_cpu_level_t level)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(level);
    const int n = rp_check_table(k);
    if (level == SP_CPU_AVX2) /* the AVX2 table packs all but MXFP4 (AVX-512 VNNI only) */
        ASSERT_EQ(n, RP_NTYPES - 1);
    if (level == SP_CPU_AVX512 && __builtin_cpu_supports("avx512vnni"))
        ASSERT(k->repack_gemm[SP_TYPE_MXFP4] != NULL && k->repack_gemm[SP_TYPE_IQ4_NL] != NULL);
}

TEST(repack_gemm_avx2)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX2) == NULL)
        SKIP("this CPU has no AVX2/FMA/F16C: AVX2 packed kernels not tested");
    rp_check_level(SP_CPU_AVX2);
}

/* The AVX2 level's AVX-VNNI table: every packed gemm it has (the AVX2 table's, its Q8_0 and
 * Q4_0 ones on VPDPBUSD for 8 tokens and up), the same checks. */
TEST(repack_gemm_avx2_vnni)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_avx2_vnni();
    if (k == NULL)
        SKIP("this CPU has no AVX-VNNI: the avx2-vnni table not tested");
    ASSERT_EQ(rp_check_table(k), RP_NTYPES - 1); /* as the AVX2 table: all but MXFP4 */
}

TEST(repack_gemm_avx512)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX512) == NULL)
        SKIP("this CPU has no AVX-512: nothing packed at that level to test");
    rp_check_level(SP_CPU_AVX512);
}

/* The widest integer sums: every quant at the grid's end (Q4_0 nibble 0 = -8, IQ4_NL
 * nibble 0 = -127) against activations of +-127, which is where int16 or saturating
 * arithmetic would show (a pair sum 2 * 127 * 127 = 32258, a block sum 32 * 8 * 127). Nine
 * tokens (the three patterns thrice), so the gemms for 8 tokens and up run too: the AVX2
 * table's Q4_0 one adds a block's nibble pair sums in int16 (15 x 127 products: at most 30480,
 * reached by the nibble-15 rows against +127), and the avx2-vnni table's VPDPBUSD ones, checked
 * after the levels where the CPU has AVX-VNNI. */
TEST(repack_extreme_values)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const int64_t n = 256, rows = 11;
    for (int ti = 0; ti < 2; ti++) {
        const sp_type_t type = rp_types[ti];
        uint8_t w[11 * 8 * 18], packed[2 * 8 * 144]; /* either form: 16 rows x 8 x 18 */
        sp_block_q8_0 x[9][8];
        for (int r = 0; r < rows; r++) {
            for (int b = 0; b < 8; b++) {
                uint8_t *blk = w + (r * 8 + b) * 18;
                const uint16_t d = (uint16_t)(0x3C00 + 64 * r + b); /* 1.0 and up */
                memcpy(blk, &d, 2);
                memset(blk + 2, r % 3 == 0 ? 0x00 : r % 3 == 1 ? 0xFF : 0x0F, 16);
            }
        }
        for (int t = 0; t < 9; t++) {
            for (int b = 0; b < 8; b++) {
                x[t][b].d = (uint16_t)(0x3800 + b);
                for (int j = 0; j < 32; j++)
                    x[t][b].qs[j] =
                        (int8_t)(t % 3 == 0 ? 127 : t % 3 == 1 ? -127 : (j % 2 ? 127 : -127));
            }
        }
        float want[9][11];
        for (int t = 0; t < 9; t++)
            for (int r = 0; r < rows; r++)
                ref->vec_dot[type](n, &want[t][r], w + r * 8 * 18, x[t]);
        for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP + 1; l++) { /* TOP + 1: avx2-vnni */
            const sp_cpu_kernels_t *k = l <= SP_CPU_TOP ? sp_cpu_kernels_for((sp_cpu_level_t)l)
                                                        : sp_cpu_kernels_avx2_vnni();
            sp_gemm_fn gemm = k == NULL ? NULL : k->repack_gemm[type];
            if (l == SP_CPU_SCALAR)
                gemm = sp__repack_gemm_ref(type);
            if (gemm == NULL)
                continue;
            /* each level's own packed form (Q4_0: 16-row panels at AVX-512 VNNI) */
            const sp_repack_layout_t lay = l == SP_CPU_SCALAR ? SP_REPACK_ROW8 : k->repack_layout[type];
            const int gr = sp_repack_layout_rows(lay);
            ASSERT(sp_repack_bytes_in(lay, type, n, rows) <= sizeof packed);
            sp_repack_pack_in(lay, type, n, w, 8 * 18, rows, 0, (rows + gr - 1) / gr, packed);
            float y[9][11];
            gemm(n, packed, sp_repack_group_bytes_in(lay, type, n), 0, rows, x, sizeof x[0], 9,
                 &y[0][0], rows);
            for (int t = 0; t < 9; t++)
                for (int r = 0; r < rows; r++)
                    ASSERT_BITS(y[t][r], want[t][r], "%s level %d t%d r%d: %.9g vs %.9g",
                                sp_type_name(type), l, t, r, (double)y[t][r], (double)want[t][r]);
        }
    }
}

/* Pack then unpack arbitrary bytes (not only what a quantiser writes: every bit of a block,
 * Q4_K's packed 6-bit scales included, must survive) for each type, rows not a multiple of 8;
 * the padding rows of the last group are zero. */
TEST(repack_roundtrip_bytes)
{
    for (int ti = 0; ti < RP_NTYPES; ti++) {
        const sp_type_t type = rp_types[ti];
        const bool super = rp_super(type);
        const int64_t n = super ? 512 : 96, rows = 19;
        const size_t rb = sp_row_size(type, n), pb = sp_repack_bytes(type, n, rows);
        ASSERT(pb > 0 && pb >= rb * (size_t)rows);
        uint8_t *src = malloc(rb * (size_t)rows), *packed = malloc(pb), *back = malloc(rb);
        ASSERT(src && packed && back);
        rp_rng = 0xABCDEFull + (uint64_t)ti;
        for (size_t i = 0; i < rb * (size_t)rows; i++)
            src[i] = (uint8_t)(rp_uniform() * 256.0);
        memset(packed, 0x5A, pb);
        sp_repack_pack(type, n, src, rb, rows, 0, (rows + 7) / 8, packed);
        for (int64_t r = 0; r < rows; r++) {
            sp_repack_unpack_row(type, n, packed, r, back);
            if (memcmp(back, src + (size_t)r * rb, rb) != 0)
                SP_TEST_FAIL("%s: row %lld does not survive pack / unpack", sp_type_name(type),
                             (long long)r);
        }
        uint8_t *zero = calloc(1, rb);
        ASSERT(zero != NULL);
        for (int64_t r = rows; r < 24; r++) {
            sp_repack_unpack_row(type, n, packed, r, back);
            ASSERT(memcmp(back, zero, rb) == 0);
        }
        free(zero);
        free(src);
        free(packed);
        free(back);
    }
}

/* Q8_0 weights at -128 and 127 against activations of +-127 (the sign trick's widest pair
 * sum, 2 * 128 * 127), Q4_K with every nibble 15 and the 6-bit scales and mins at 63
 * against Q8_K quants of -128 (the all-ones token) and +-127 (int16 sums of 8 * 2 * 15 * 128
 * in the wide gemm, scaled sums of 63 times that), IQ4_XS at the grid's ends with scales -32
 * and 31: every level and the avx2-vnni table, the reference's bits. Nine tokens (the three
 * patterns thrice), so the gemms for 8 tokens and up run too. */
TEST(repack_extreme_q8_0_q4_k)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    for (int ti = 0; ti < 3; ti++) {
        const sp_type_t type = ti == 0 ? SP_TYPE_Q8_0 : ti == 1 ? SP_TYPE_Q4_K : SP_TYPE_IQ4_XS;
        const sp_type_t at = ref->vec_dot_type[type];
        const int64_t n = 512, rows = 11;
        const size_t rb = sp_row_size(type, n), xs = sp_row_size(at, n);
        uint8_t *w = malloc(rb * (size_t)rows);
        uint8_t *packed = malloc(sp_repack_bytes_in(SP_REPACK_PANEL16, SP_TYPE_Q8_0, n, 16) +
                                 sp_repack_bytes(type, n, rows)); /* room for either form */
        uint8_t *x = malloc(xs * 9);
        float *f = malloc(sizeof(float) * (size_t)n);
        ASSERT(w && packed && x && f);
        for (int r = 0; r < rows; r++) {
            uint8_t *row = w + (size_t)r * rb;
            if (type == SP_TYPE_Q8_0) {
                for (int64_t b = 0; b < n / 32; b++) {
                    const uint16_t d = (uint16_t)(0x3C00 + 64 * r + b);
                    memcpy(row + b * 34, &d, 2);
                    memset(row + b * 34 + 2, r % 3 == 0 ? 0x80 : r % 3 == 1 ? 0x7F : 0x81, 32);
                }
            } else if (type == SP_TYPE_IQ4_XS) { /* grid ends -127 / 113, scales -32 / 31 */
                for (int64_t b = 0; b < n / 256; b++) {
                    uint8_t *blk = row + b * 136;
                    const uint16_t d = (uint16_t)(0x3C00 + 64 * r + b);
                    memcpy(blk, &d, 2);
                    memset(blk + 2, r % 2 ? 0xFF : 0x00, 6);
                    memset(blk + 8, r % 3 == 0 ? 0x00 : r % 3 == 1 ? 0xFF : 0x0F, 128);
                }
            } else {
                for (int64_t b = 0; b < n / 256; b++) {
                    uint8_t *blk = row + b * 144;
                    const uint16_t d = (uint16_t)(0x3C00 + 64 * r + b), dm = (uint16_t)(0x3800 + r);
                    memcpy(blk, &d, 2);
                    memcpy(blk + 2, &dm, 2);
                    memset(blk + 4, r % 2 ? 0xFF : 0x3F, 12); /* all 6-bit fields 63 or mixed */
                    memset(blk + 16, r % 3 == 0 ? 0xFF : r % 3 == 1 ? 0x0F : 0xF0, 128);
                }
            }
        }
        for (int t = 0; t < 9; t++) {
            for (int64_t i = 0; i < n; i++)
                f[i] = t % 3 == 0 ? 1.0f : t % 3 == 1 ? -1.0f : (i % 2 ? 1.0f : -1.0f);
            ref->from_float[at](f, x + (size_t)t * xs, n);
        }
        float want[9][11];
        for (int t = 0; t < 9; t++)
            for (int r = 0; r < rows; r++)
                ref->vec_dot[type](n, &want[t][r], w + (size_t)r * rb, x + (size_t)t * xs);
        for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP + 1; l++) { /* TOP + 1: avx2-vnni */
            const sp_cpu_kernels_t *k = l <= SP_CPU_TOP ? sp_cpu_kernels_for((sp_cpu_level_t)l)
                                                        : sp_cpu_kernels_avx2_vnni();
            sp_gemm_fn gemm = k == NULL ? NULL : k->repack_gemm[type];
            if (l == SP_CPU_SCALAR)
                gemm = sp__repack_gemm_ref(type);
            if (gemm == NULL)
                continue;
            /* each level's own packed form (Q8_0: 16-row panels at AVX-512 VNNI) */
            const sp_repack_layout_t lay = l == SP_CPU_SCALAR ? SP_REPACK_ROW8 : k->repack_layout[type];
            const int gr = sp_repack_layout_rows(lay);
            sp_repack_pack_in(lay, type, n, w, rb, rows, 0, (rows + gr - 1) / gr, packed);
            /* 1-5 and 9 tokens: the tiles and the wide gemms on both sides of each table's
             * count (RPX_BY_TOKENS) */
            for (int nt = 1; nt <= 9; nt += nt < 5 ? 1 : 4) {
                float y[9][11];
                gemm(n, packed, sp_repack_group_bytes_in(lay, type, n), 0, rows, x, xs, nt,
                     &y[0][0], rows);
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < rows; r++)
                        ASSERT_BITS(y[t][r], want[t][r],
                                    "%s level %d, %d tokens, t%d r%d: %.9g vs %.9g",
                                    sp_type_name(type), l, nt, t, r, (double)y[t][r],
                                    (double)want[t][r]);
            }
        }
        free(w);
        free(packed);
        free(x);
        free(f);
    }
}

/*
 * IQ4_XS's packed gemm of every level where the AVX-512 VNNI panels (avx512_q4panel.c) have
 * edges: 6 super-blocks (packed K chunks of 4 and 2, partial sums through y), 37 rows (two
 * 16-row panels of two groups and a lone group), ranges starting and ending inside a group,
 * 1..140 tokens (the small-batch fallback, 8-token tiles and tails, and two token chunks of
 * 128 and 12). Raw random blocks (any code, any 6-bit scale, 0 and 63 included, random finite
 * d) and a row of extremes (every code the grid's -127, scale 0 = -32, against activations of
 * +-127: the largest block sums) against random Q8_K activations: the reference's bits.
 */
TEST(repack_iq4_xs_panels)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const int64_t n = 6 * 256, rows = 37, toks = 140;
    const size_t rb = sp_row_size(SP_TYPE_IQ4_XS, n), gb = sp_repack_group_bytes(SP_TYPE_IQ4_XS, n);
    const size_t xs = sp_row_size(SP_TYPE_Q8_K, n);
    uint8_t *w = malloc(rb * (size_t)rows), *packed = malloc(sp_repack_bytes(SP_TYPE_IQ4_XS, n, rows));
    uint8_t *x = malloc(xs * (size_t)toks);
    float *want = malloc(sizeof(float) * (size_t)(rows * toks));
    float *y = malloc(sizeof(float) * (size_t)((rows + 3) * toks));
    ASSERT(w && packed && x && want && y);
    rp_rng = 0x1234567ull;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < n / 256; b++) {
            sp_block_iq4_xs *blk = (sp_block_iq4_xs *)(w + (size_t)r * rb) + b;
            uint8_t *p = (uint8_t *)blk;
            for (size_t i = 0; i < sizeof *blk; i++)
                p[i] = (uint8_t)(rp_uniform() * 256.0);
            blk->d = (sp_fp16_t)((int)(rp_uniform() * 0x7800) | (rp_uniform() < 0.5 ? 0x8000 : 0));
            if (r == 9) { /* extremes: code 0 (-127), scale 0 (-32) */
                memset(blk->qs, 0, sizeof blk->qs);
                memset(blk->scales_l, 0, sizeof blk->scales_l);
                blk->scales_h = 0;
                blk->d = 0x3C00;
            }
        }
    for (int64_t t = 0; t < toks; t++)
        for (int64_t b = 0; b < n / 256; b++) {
            sp_block_q8_k *xb = (sp_block_q8_k *)(x + (size_t)t * xs) + b;
            xb->d = (float)(0.001 + rp_uniform());
            for (int j = 0; j < 256; j++)
                xb->qs[j] = (int8_t)(t == 0 ? 127 : t == 1 ? -127 : -127 + (int)(rp_uniform() * 255));
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int i = 0; i < 16; i++)
                    s += xb->qs[16 * j + i];
                xb->bsums[j] = (int16_t)s;
            }
        }
    sp_repack_pack(SP_TYPE_IQ4_XS, n, w, rb, rows, 0, (rows + 7) / 8, packed);
    for (int64_t t = 0; t < toks; t++)
        for (int64_t r = 0; r < rows; r++)
            ref->vec_dot[SP_TYPE_IQ4_XS](n, &want[t * rows + r], w + (size_t)r * rb,
                                         x + (size_t)t * xs);
    static const int64_t ranges[3][2] = {{0, 37}, {3, 30}, {17, 35}};
    static const int64_t nts[] = {1, 2, 3, 8, 9, 17, 140};
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        sp_gemm_fn gemm = k == NULL ? NULL : k->repack_gemm[SP_TYPE_IQ4_XS];
        if (l == SP_CPU_SCALAR)
            gemm = sp__repack_gemm_ref(SP_TYPE_IQ4_XS);
        if (gemm == NULL)
            continue;
        for (int ri = 0; ri < 3; ri++)
            for (size_t ni = 0; ni < sizeof nts / sizeof nts[0]; ni++) {
                const int64_t r0 = ranges[ri][0], r1 = ranges[ri][1], nt = nts[ni], ldy = rows + 3;
                for (int64_t i = 0; i < ldy * nt; i++)
                    y[i] = -1234.5f;
                gemm(n, packed, gb, r0, r1, x, xs, nt, y, ldy);
                for (int64_t t = 0; t < nt; t++)
                    for (int64_t r = 0; r < ldy; r++) {
                        const float got = y[t * ldy + r];
                        const float wnt = r >= r0 && r < r1 ? want[t * rows + r] : -1234.5f;
                        ASSERT_BITS(got, wnt, "level %d rows [%lld,%lld) %lld tokens: t%lld r%lld "
                                    "%.9g != %.9g", l, (long long)r0, (long long)r1, (long long)nt,
                                    (long long)t, (long long)r, (double)got, (double)wnt);
                    }
            }
    }
    free(w);
    free(packed);
    free(x);
    free(want);
    free(y);
}

/*
 * The AVX-512 VNNI 16-row panels of packed MXFP4 and IQ4_NL (avx512_q4panel.c) at their edges,
 * against the reference vec_dot on the rows (and the scalar packed gemm): K = 200 blocks (packed
 * K chunks of 32 and a tail of 8, a lane round cut short), 37 rows (two panels of two groups and
 * a lone group), ranges starting and ending inside a group, 1..140 tokens (one tile, tails, and
 * token chunks: the records of 48 tokens fill the buffer at this K). Raw random blocks (any
 * code, any E8M0 byte 0..255 or finite F16 d of either sign) and rows of extremes: row 9 every
 * code the grid's most negative value at the largest scale (E8M0 254, F16 65504), row 10 the
 * smallest (E8M0 0 and 1: the denormal halves; the smallest F16 denormal), against activations
 * of +-127 (the largest block sums). One more shape has rows too long for the records (the
 * scalar packed gemm takes them): K = 1300 blocks, a few tokens.
 */
static void
rp_check_q32_panels(sp_type_t type, int64_t n, int64_t rows, int64_t toks, const int64_t *nts,
                    size_t n_nts)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const bool mx = type == SP_TYPE_MXFP4;
    const size_t bs = mx ? 17 : 18;
    const size_t rb = sp_row_size(type, n), gb = sp_repack_group_bytes(type, n);
    const size_t xs = sp_row_size(SP_TYPE_Q8_0, n);
    ASSERT(rb == bs * (size_t)(n / 32) && gb > 0);
    uint8_t *w = malloc(rb * (size_t)rows), *packed = malloc(sp_repack_bytes(type, n, rows));
    uint8_t *x = malloc(xs * (size_t)toks);
    float *want = malloc(sizeof(float) * (size_t)(rows * toks));
    float *y = malloc(sizeof(float) * (size_t)((rows + 3) * toks));
    ASSERT(w && packed && x && want && y);
    rp_rng = 0x7654321ull + (uint64_t)type;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < n / 32; b++) {
            uint8_t *blk = w + (size_t)r * rb + (size_t)b * bs;
            for (size_t i = 0; i < bs; i++)
                blk[i] = (uint8_t)(rp_uniform() * 256.0);
            const uint16_t d = (uint16_t)((int)(rp_uniform() * 0x7800) | (rp_uniform() < 0.5 ? 0x8000 : 0));
            if (!mx)
                memcpy(blk, &d, 2);
            if (r == 9 || r == 10) { /* code 0 or 8: the grid's -127 / MXFP4's 0 and 8 (-0) */
                memset(blk + (mx ? 1 : 2), mx ? 0xFF : 0x00, 16); /* MXFP4 code 15: -12 */
                const uint16_t dd = r == 9 ? 0x7BFF : 0x0001;
                if (mx)
                    blk[0] = r == 9 ? 254 : (uint8_t)(b % 2);
                else
                    memcpy(blk, &dd, 2);
            }
        }
    for (int64_t t = 0; t < toks; t++)
        for (int64_t b = 0; b < n / 32; b++) {
            sp_block_q8_0 *xb = (sp_block_q8_0 *)(x + (size_t)t * xs) + b;
            /* F16 d in [2^-14, 1): small enough that the row-9 sums stay finite */
            xb->d = (uint16_t)(0x0400 + (int)(rp_uniform() * (0x3C00 - 0x0400)));
            for (int j = 0; j < 32; j++)
                xb->qs[j] = (int8_t)(t == 0 ? 127 : t == 1 ? -127 : -127 + (int)(rp_uniform() * 255));
        }
    sp_repack_pack(type, n, w, rb, rows, 0, (rows + 7) / 8, packed);
    for (int64_t t = 0; t < toks; t++)
        for (int64_t r = 0; r < rows; r++)
            ref->vec_dot[type](n, &want[t * rows + r], w + (size_t)r * rb, x + (size_t)t * xs);
    static const int64_t ranges[3][2] = {{0, 37}, {3, 30}, {17, 35}};
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        sp_gemm_fn gemm = k == NULL ? NULL : k->repack_gemm[type];
        if (l == SP_CPU_SCALAR)
            gemm = sp__repack_gemm_ref(type);
        if (gemm == NULL)
            continue;
        for (int ri = 0; ri < 3; ri++)
            for (size_t ni = 0; ni < n_nts; ni++) {
                const int64_t r0 = ranges[ri][0] < rows ? ranges[ri][0] : 0;
                const int64_t r1 = ranges[ri][1] < rows ? ranges[ri][1] : rows;
                const int64_t nt = nts[ni], ldy = rows + 3;
                for (int64_t i = 0; i < ldy * nt; i++)
                    y[i] = -1234.5f;
                gemm(n, packed, gb, r0, r1, x, xs, nt, y, ldy);
                for (int64_t t = 0; t < nt; t++)
                    for (int64_t r = 0; r < ldy; r++) {
                        const float got = y[t * ldy + r];
                        const float wnt = r >= r0 && r < r1 ? want[t * rows + r] : -1234.5f;
                        ASSERT_BITS(got, wnt, "%s level %d K=%lld rows [%lld,%lld) %lld tokens: "
                                    "t%lld r%lld %.9g != %.9g", sp_type_name(type), l,
                                    (long long)n, (long long)r0, (long long)r1, (long long)nt,
                                    (long long)t, (long long)r, (double)got, (double)wnt);
                    }
            }
    }
    /* the extremes are what they should be: row 9 huge (MXFP4's 2^126 scale overflows to inf,
     * in every level alike), row 10 finite */
    for (int64_t t = 0; t < 2; t++) {
        ASSERT(isfinite(want[t * rows + 10]));
        ASSERT(fabsf(want[t * rows + 9]) > 1e6f);
        ASSERT(!mx || isinf(want[t * rows + 9]));
    }
    free(w);
    free(packed);
    free(x);
    free(want);
    free(y);
}

TEST(repack_q32_panels)
{
    static const int64_t nts[] = {1, 2, 3, 8, 9, 17, 49, 140};
    static const int64_t nts_long[] = {1, 3, 9};
    const sp_type_t types[2] = {SP_TYPE_MXFP4, SP_TYPE_IQ4_NL};
    for (int i = 0; i < 2; i++) {
        rp_check_q32_panels(types[i], 200 * 32, 37, 140, nts, sizeof nts / sizeof nts[0]);
        rp_check_q32_panels(types[i], 1300 * 32, 11, 9, nts_long,
                            sizeof nts_long / sizeof nts_long[0]);
    }
}
