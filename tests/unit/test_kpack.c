/*
 * test_kpack.c - the packed forms of Q6_K and Q5_K (repack_impl.h, avx2_kpack.c): every
 * level's packed gemm against the scalar reference vec_dot on the original rows, bit for bit,
 * for row counts that are not a multiple of 8, ranges that start and end inside a group, and
 * 1/2/3/7/8/9/33/64 tokens (one-token path, tile tails, whole tiles); the widest integer sums
 * (every value at its grid end, scales at their ends, activations +-127); and a planted bug
 * (one packed quant or scale changed) that the check must catch in exactly that row.
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"
#include "kernels/kernels.h"

static uint64_t kp_rng;

static double
kp_uniform(void) /* (0, 1) */
{
    kp_rng ^= kp_rng << 13;
    kp_rng ^= kp_rng >> 7;
    kp_rng ^= kp_rng << 17;
    return ((double)(kp_rng >> 11) + 0.5) / 9007199254740992.0;
}

static float
kp_gauss(void)
{
    return (float)(sqrt(-2.0 * log(kp_uniform())) * cos(6.283185307179586 * kp_uniform()));
}

typedef struct {
    sp_type_t type;
    int64_t n, rows, toks;
    uint8_t *w, *packed, *x;
    size_t rb, gb, xs;
    float *want;
} kp_case_t;

/* the reference vec_dot of every (token, row) of the original rows */
static void
kp_want(kp_case_t *c)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    for (int64_t t = 0; t < c->toks; t++)
        for (int64_t r = 0; r < c->rows; r++)
            ref->vec_dot[c->type](c->n, &c->want[t * c->rows + r], c->w + (size_t)r * c->rb,
                                  c->x + (size_t)t * c->xs);
}

static void
kp_pack(kp_case_t *c)
{
    sp_repack_pack(c->type, c->n, c->w, c->rb, c->rows, 0, (c->rows + 7) / 8, c->packed);
}

/* rows quantised from Gaussian values of varied scale (raw = false), or random bytes with a
 * finite d (every ql / qh / scale code); Q8_K activations with zero blocks and one outlier */
static void
kp_make(kp_case_t *c, sp_type_t type, int64_t n, int64_t rows, int64_t toks, uint64_t seed,
        bool raw)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    *c = (kp_case_t){.type = type, .n = n, .rows = rows, .toks = toks};
    c->rb = sp_row_size(type, n);
    c->gb = sp_repack_group_bytes(type, n);
    c->xs = sp_row_size(SP_TYPE_Q8_K, n);
    ASSERT(c->gb > 0 && ref->vec_dot_type[type] == SP_TYPE_Q8_K);
    c->w = malloc(c->rb * (size_t)rows);
    c->packed = malloc(sp_repack_bytes(type, n, rows));
    c->x = malloc(c->xs * (size_t)toks);
    c->want = malloc(sizeof(float) * (size_t)(rows * toks));
    float *f = malloc(sizeof(float) * (size_t)n);
    ASSERT(c->w && c->packed && c->x && c->want && f);
    kp_rng = seed * 0x9E3779B97F4A7C15ull + 1;
    const size_t blk = type == SP_TYPE_Q6_K ? sizeof(sp_block_q6_k) : sizeof(sp_block_q5_k);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = c->w + (size_t)r * c->rb;
        if (raw) {
            for (size_t i = 0; i < c->rb; i++)
                row[i] = (uint8_t)(kp_uniform() * 256.0);
            for (int64_t b = 0; b < n / SP_QK_K; b++) { /* d (and dmin) in [2^-10, 2) */
                uint8_t *bp = row + (size_t)b * blk;
                const uint16_t d = (uint16_t)(0x1400 + (int)(kp_uniform() * 0x2800));
                memcpy(bp + (type == SP_TYPE_Q6_K ? offsetof(sp_block_q6_k, d) : 0), &d, 2);
                if (type == SP_TYPE_Q5_K)
                    memcpy(bp + 2, &d, 2);
            }
        } else {
            for (int64_t i = 0; i < n; i++)
                f[i] = (0.02f + 0.03f * (float)((i / 32 + r) % 5)) * kp_gauss();
            ASSERT(sp_quantize_row(type, f, row, n));
        }
    }
    for (int64_t t = 0; t < toks; t++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = ((i / 256 + t) % 7 == 4) ? 0.0f : kp_gauss();
        if (t == 1)
            f[n / 2] = 50.0f;
        ref->from_float[SP_TYPE_Q8_K](f, c->x + (size_t)t * c->xs, n);
    }
    free(f);
    kp_pack(c);
    kp_want(c);
}

static void
kp_free(kp_case_t *c)
{
    free(c->w);
    free(c->packed);
    free(c->x);
    free(c->want);
}

static gemm_verdict_t
kp_run(const kp_case_t *c, sp_gemm_fn gemm, int64_t r0, int64_t r1, int64_t nt)
{
    const int64_t ldy = c->rows + 3;
    float *y = malloc(sizeof(float) * (size_t)(ldy * nt));
    ASSERT(y != NULL);
    const gemm_case_t gc = {gemm, c->n, c->packed, c->gb, c->x, c->xs, c->want, c->rows, 1, false};
    const gemm_verdict_t v = gemm_check_range(&gc, r0, r1, nt, y, ldy, nt);
    free(y);
    return v;
}

/* the scalar oracle, then every level that packs the type and the avx2-vnni table where the
 * CPU has it (the process never mixes tables, but each table's kernel reads the one 8-row
 * form); at most KP_MAX_KERNELS */
#define KP_MAX_KERNELS (SP_CPU_TOP + 2)
static int
kp_kernels(sp_type_t type, sp_gemm_fn gemm[KP_MAX_KERNELS], const char *names[KP_MAX_KERNELS])
{
    int nk = 0;
    gemm[nk] = sp__repack_gemm_ref(type);
    names[nk++] = "scalar packed";
    for (int l = SP_CPU_AVX2; l <= SP_CPU_TOP + 1; l++) { /* TOP + 1: avx2-vnni */
        const sp_cpu_kernels_t *k = l <= SP_CPU_TOP ? sp_cpu_kernels_for((sp_cpu_level_t)l)
                                                    : sp_cpu_kernels_avx2_vnni();
        if (k != NULL && k->repack_gemm[type] != NULL) {
            ASSERT_EQ(k->repack_layout[type], SP_REPACK_ROW8);
            gemm[nk] = k->repack_gemm[type];
            names[nk++] = k->name;
        }
    }
    return nk;
}

static void
kp_check_type(sp_type_t type)
{
    static const int64_t ns[] = {256, 768};
    static const int64_t rowss[] = {1, 7, 13, 37};
    static const int64_t nts[] = {1, 2, 3, 7, 8, 9, 33, 64};
    sp_gemm_fn gemm[KP_MAX_KERNELS];
    const char *names[KP_MAX_KERNELS];
    const int nk = kp_kernels(type, gemm, names);
    if (sp_cpu_kernels_for(SP_CPU_AVX2) != NULL)
        ASSERT(nk >= 2); /* the AVX2 table packs both types */
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        for (size_t ir = 0; ir < sizeof rowss / sizeof rowss[0]; ir++) {
            const int64_t rows = rowss[ir];
            kp_case_t c;
            kp_make(&c, type, ns[in], rows, 64, 31 * in + ir, ir % 2 == 1);
            for (int ki = 0; ki < nk; ki++) {
                for (size_t it = 0; it < sizeof nts / sizeof nts[0]; it++)
                    GEMM_CHECK_ASSERT(kp_run(&c, gemm[ki], 0, rows, nts[it]),
                                      "%s %s n=%lld rows=%lld, %lld tokens", names[ki],
                                      sp_type_name(type), (long long)c.n, (long long)rows,
                                      (long long)nts[it]);
                if (rows > 3) { /* ranges that start and end inside a group */
                    GEMM_CHECK_ASSERT(kp_run(&c, gemm[ki], 3, rows - 1, 9),
                                      "%s %s rows [3,%lld)", names[ki], sp_type_name(type),
                                      (long long)(rows - 1));
                    GEMM_CHECK_ASSERT(kp_run(&c, gemm[ki], rows / 2, rows / 2 + 1, 1),
                                      "%s %s row %lld", names[ki], sp_type_name(type),
                                      (long long)(rows / 2));
                }
            }
            kp_free(&c);
        }
    }
}

TEST(kpack_q6_k_gemm)
{
    kp_check_type(SP_TYPE_Q6_K);
}

TEST(kpack_q5_k_gemm)
{
    kp_check_type(SP_TYPE_Q5_K);
}

/* The widest sums: Q6_K values all 63 (ql 0xFF, qh 0xFF) or all 0 (-32), scales -128 / 127;
 * Q5_K values all 31 with 6-bit scales and mins at 63; activations all +-1 (Q8_K quants -128
 * or +-127) or alternating, nine tokens (the three patterns thrice; through the tables 1-2
 * tokens run the tiles, 3 (Q6_K) or 5 (Q5_K at AVX2, 4 at avx2-vnni) and up the wide gemms). The int16 pair sums (2 * 2 * 63 * 128, 4 * 2 * 31 * 128)
 * and the int32 super-block sums are at their largest: saturation or overflow would show. */
static void
kp_extremes(sp_type_t type)
{
    const int64_t n = 512, rows = 11;
    kp_case_t c;
    kp_make(&c, type, n, rows, 9, 7, false);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < n / SP_QK_K; b++) {
            const uint16_t d = (uint16_t)(0x3C00 + 64 * r + b), dm = (uint16_t)(0x3800 + r);
            if (type == SP_TYPE_Q6_K) {
                sp_block_q6_k *bp = (sp_block_q6_k *)(c.w + (size_t)r * c.rb) + b;
                memset(bp->ql, r % 3 == 0 ? 0x00 : r % 3 == 1 ? 0xFF : 0xF0, sizeof bp->ql);
                memset(bp->qh, r % 3 == 0 ? 0x00 : r % 3 == 1 ? 0xFF : 0xCC, sizeof bp->qh);
                for (int k = 0; k < 16; k++)
                    bp->scales[k] = (int8_t)((r + k) % 2 ? -128 : 127);
                memcpy(&bp->d, &d, 2);
            } else {
                sp_block_q5_k *bp = (sp_block_q5_k *)(c.w + (size_t)r * c.rb) + b;
                memcpy(&bp->d, &d, 2);
                memcpy(&bp->dmin, &dm, 2);
                memset(bp->scales, r % 2 ? 0xFF : 0x3F, sizeof bp->scales);
                memset(bp->qh, r % 3 == 2 ? 0x0F : 0xFF, sizeof bp->qh);
                memset(bp->qs, r % 3 == 0 ? 0xFF : r % 3 == 1 ? 0x0F : 0xF0, sizeof bp->qs);
            }
        }
    }
    float *f = malloc(sizeof(float) * (size_t)n);
    ASSERT(f != NULL);
    for (int t = 0; t < 9; t++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = t % 3 == 0 ? 1.0f : t % 3 == 1 ? -1.0f : (i % 2 ? 1.0f : -1.0f);
        sp_cpu_kernels_ref()->from_float[SP_TYPE_Q8_K](f, c.x + (size_t)t * c.xs, n);
    }
    free(f);
    kp_pack(&c);
    kp_want(&c);
    sp_gemm_fn gemm[KP_MAX_KERNELS];
    const char *names[KP_MAX_KERNELS];
    const int nk = kp_kernels(type, gemm, names);
    for (int ki = 0; ki < nk; ki++)
        for (int64_t nt = 1; nt <= 9; nt += nt < 5 ? 1 : 4) /* 1-5 and 9 */
            GEMM_CHECK_ASSERT(kp_run(&c, gemm[ki], 0, rows, nt), "%s %s extremes, %lld tokens",
                              names[ki], sp_type_name(type), (long long)nt);
    kp_free(&c);
}

TEST(kpack_extremes)
{
    kp_extremes(SP_TYPE_Q6_K);
    kp_extremes(SP_TYPE_Q5_K);
}

/* The check catches what it should: one packed high-bit byte (qh) or sub-block scale of row
 * 10 (group 1, row 2) changed moves that row's result and no other. */
static void
kp_planted(sp_type_t type)
{
    const int64_t n = 512, rows = 13;
    kp_case_t c;
    kp_make(&c, type, n, rows, 3, 99, false);
    sp_gemm_fn gemm[KP_MAX_KERNELS];
    const char *names[KP_MAX_KERNELS];
    const int nk = kp_kernels(type, gemm, names);
    const bool q6 = type == SP_TYPE_Q6_K;
    uint8_t *g1 = c.packed + c.gb, *b1 = g1 + (q6 ? SP_REPACK_Q6K_BLOCK_BYTES : SP_REPACK_Q5K_BLOCK_BYTES);
    /* super-block 1 of row 10: Q6_K's "6+2" byte 5 (bit 6: bit 0 of element 29, the value
     * group's last 8 elements' spread bits) / Q5_K's qh byte 5 (bit 0: element 5's high
     * bit), then the scale of sub-block 3 (Q5_K: sub-block 1's 6-bit scale) */
    uint8_t *qh = b1 + (q6 ? SP_REPACK_Q6K_Q : SP_REPACK_Q5K_QH) + sp__repack_chunk_off(2, 5);
    uint8_t *sc = b1 + (q6 ? SP_REPACK_Q6K_SC + 16 * 1 + 2 * 2 + 1 : SP_REPACK_Q4K_SC + 8 * 1 + 2);
    uint8_t *plant[2] = {qh, sc};
    for (int pi = 0; pi < 2; pi++) {
        for (int ki = 0; ki < nk; ki++) {
            kp_pack(&c);
            ASSERT(kp_run(&c, gemm[ki], 0, rows, 3).ok);
            *plant[pi] ^= pi == 0 ? (q6 ? 0x40 : 0x01) : 0x03;
            const gemm_verdict_t v = kp_run(&c, gemm[ki], 0, rows, 3);
            if (v.ok || v.r != 10 || v.outside)
                SP_TEST_FAIL("%s %s: a changed %s of row 10 gave verdict ok=%d r=%lld",
                             names[ki], sp_type_name(type), pi == 0 ? "quant byte" : "scale",
                             (int)v.ok, (long long)v.r);
        }
    }
    kp_free(&c);
}

TEST(kpack_planted_bug)
{
    kp_planted(SP_TYPE_Q6_K);
    kp_planted(SP_TYPE_Q5_K);
}
