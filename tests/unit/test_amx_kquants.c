/*
 * test_amx_kquants.c - the AMX level's Q4_K and Q5_K packed gemms (amx_kquants.c) against the scalar
 * reference vec_dot on the original rows, bit for bit: 1..70, 128 and 200 tokens (both sides
 * of the AVX-512 hand-off, short tile pairs, several token chunks), row ranges that start
 * and end inside a group or leave the last panel with one group, one and many super-blocks,
 * and the extreme integer ranges (nibbles 0 / 15, Q5_K's fifth bits all set or not, 6-bit
 * scales and mins 63, activations +-127). On a CPU without AMX-INT8 (or without the OS's tile state) the tests skip.
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"
#include "kernels/kernels.h"

static uint64_t ak_rng;

static uint32_t
ak_next(void)
{
    ak_rng ^= ak_rng << 13;
    ak_rng ^= ak_rng >> 7;
    ak_rng ^= ak_rng << 17;
    return (uint32_t)(ak_rng >> 32);
}

static double
ak_uniform(void) /* (0, 1) */
{
    return ((double)ak_next() + 0.5) / 4294967296.0;
}

static float
ak_gauss(void)
{
    return (float)(sqrt(-2.0 * log(ak_uniform())) * cos(6.283185307179586 * ak_uniform()));
}

/* The AMX table's packed gemm of a type, or NULL (the caller skips). */
static sp_gemm_fn
ak_gemm(sp_type_t type)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AMX);
    if (k == NULL)
        return NULL;
    ASSERT_EQ(k->repack_layout[type], SP_REPACK_ROW8);
    ASSERT(k->repack_gemm[type] != NULL);
    return k->repack_gemm[type];
}

/* Weights, their packed form, Q8_K activations and the reference's results. */
typedef struct {
    sp_type_t type;
    int64_t n, rows, toks;
    uint8_t *w, *packed, *x;
    size_t rb, gb, xs;
    float *want;
} ak_case_t;

/* extreme: weight bytes from {00, FF, 0F, F0}, the 6-bit fields 63 or random, and Q8_K
 * activations of +-127 written directly (bsums summed here); else quantised gaussians. */
static void
ak_case_make(ak_case_t *c, sp_type_t type, int64_t n, int64_t rows, int64_t toks, uint64_t seed,
             bool extreme)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    c->type = type;
    c->n = n;
    c->rows = rows;
    c->toks = toks;
    c->rb = sp_row_size(type, n);
    c->gb = sp_repack_group_bytes(type, n);
    c->xs = sp_row_size(SP_TYPE_Q8_K, n);
    c->w = malloc(c->rb * (size_t)rows);
    c->packed = malloc(sp_repack_bytes(type, n, rows));
    c->x = malloc(c->xs * (size_t)toks);
    c->want = malloc(sizeof(float) * (size_t)(rows * toks));
    float *f = malloc(sizeof(float) * (size_t)n);
    ASSERT(c->w && c->packed && c->x && c->want && f);
    ak_rng = seed * 0x9E3779B97F4A7C15ull + 7;
    static const uint8_t ends[4] = {0x00, 0xFF, 0x0F, 0xF0};
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = c->w + (size_t)r * c->rb;
        if (!extreme) {
            for (int64_t i = 0; i < n; i++)
                f[i] = (0.02f + 0.03f * (float)((i / 32 + r) % 5)) * ak_gauss();
            ASSERT(sp_quantize_row(type, f, row, n));
            continue;
        }
        /* Q4_K and Q5_K share the header (d, dmin, 12 scale bytes); Q5_K's qh follows */
        const size_t bs = type == SP_TYPE_Q5_K ? sizeof(sp_block_q5_k) : sizeof(sp_block_q4_k);
        for (int64_t b = 0; b < n / SP_QK_K; b++) {
            uint8_t *blk = row + (size_t)b * bs;
            const uint16_t d = (uint16_t)(0x3C00 + 37 * r + b), dm = (uint16_t)(0x3400 + r + b);
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dm, 2);
            for (int i = 0; i < 12; i++)
                blk[4 + i] = (r + b) % 3 ? 0xFF : (uint8_t)ak_next();
            uint8_t *qs = blk + 16;
            if (type == SP_TYPE_Q5_K) {
                for (int i = 0; i < 32; i++)
                    blk[16 + i] = r % 3 == 0 ? 0xFF : r % 3 == 1 ? 0x00 : (uint8_t)ak_next();
                qs = blk + 48;
            }
            for (int i = 0; i < SP_QK_K / 2; i++)
                qs[i] = (r % 4 == 3) ? (uint8_t)ak_next() : ends[(ak_next() >> 7) & 3];
        }
    }
    for (int64_t t = 0; t < toks; t++) {
        uint8_t *xt = c->x + (size_t)t * c->xs;
        if (!extreme) {
            for (int64_t i = 0; i < n; i++)
                f[i] = ((i / 32 + t) % 11 == 4) ? 0.0f : ak_gauss();
            if (t == 1)
                f[n / 2] = 50.0f;
            ref->from_float[SP_TYPE_Q8_K](f, xt, n);
            continue;
        }
        for (int64_t b = 0; b < n / SP_QK_K; b++) {
            sp_block_q8_k *y = (sp_block_q8_k *)xt + b;
            y->d = 0.01f * (float)(1 + (t + b) % 7);
            for (int i = 0; i < SP_QK_K; i++) {
                const int mode = (int)((t + b) % 3);
                y->qs[i] = (int8_t)(mode == 0 ? 127 : mode == 1 ? -127
                                                                : (ak_next() & 1 ? 127 : -127));
            }
            for (int g = 0; g < SP_QK_K / 16; g++) {
                int s = 0;
                for (int i = 0; i < 16; i++)
                    s += y->qs[16 * g + i];
                y->bsums[g] = (int16_t)s;
            }
        }
    }
    free(f);
    sp_repack_pack(type, n, c->w, c->rb, rows, 0, (rows + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS,
                   c->packed);
    for (int64_t t = 0; t < toks; t++)
        for (int64_t r = 0; r < rows; r++)
            ref->vec_dot[type](n, &c->want[t * rows + r], c->w + (size_t)r * c->rb,
                                       c->x + (size_t)t * c->xs);
}

static void
ak_case_free(ak_case_t *c)
{
    free(c->w);
    free(c->packed);
    free(c->x);
    free(c->want);
}

static void
ak_check(sp_gemm_fn gemm, const ak_case_t *c, int64_t r0, int64_t r1, int64_t nt)
{
    const int64_t ldy = c->rows + 5;
    float *y = malloc(sizeof(float) * (size_t)(ldy * nt));
    ASSERT(y != NULL);
    const gemm_case_t gc = {gemm, c->n, c->packed, c->gb, c->x, c->xs, c->want, c->rows, 1, false};
    GEMM_CHECK_ASSERT(gemm_check_range(&gc, r0, r1, nt, y, ldy, nt),
                      "amx %s n=%lld rows [%lld,%lld) of %lld, %lld tokens",
                      sp_type_name(c->type), (long long)c->n,
                      (long long)r0, (long long)r1, (long long)c->rows, (long long)nt);
    free(y);
}

/* Every token count 1..70 and 128 / 200 over all rows, and sub-ranges with tile-sized counts. */
static void
ak_random(sp_type_t type)
{
    const sp_gemm_fn gemm = ak_gemm(type);
    if (gemm == NULL)
        SKIP("no AMX-INT8 level on this CPU / OS: nothing to test");
    static const int64_t ns[] = {256, 2048, 5632};
    static const int64_t rowss[] = {8, 13, 37, 40};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        for (size_t ir = 0; ir < sizeof rowss / sizeof rowss[0]; ir++) {
            const int64_t rows = rowss[ir];
            /* n = 5632: token chunks of 80 tokens, so 128 and 200 tokens take two and three */
            if (ns[in] == 5632 && rows != 37)
                continue;
            ak_case_t c;
            ak_case_make(&c, type, ns[in], rows, 200, 31 * in + ir, false);
            for (int64_t nt = 1; nt <= 70; nt++)
                ak_check(gemm, &c, 0, rows, nt);
            ak_check(gemm, &c, 0, rows, 128);
            ak_check(gemm, &c, 0, rows, 200);
            /* ranges that start and end inside a group; [9, rows - 3) leaves a lone group */
            static const int64_t nts[] = {16, 17, 33, 47, 200};
            for (size_t it = 0; it < sizeof nts / sizeof nts[0]; it++) {
                ak_check(gemm, &c, 3, rows - 1, nts[it]);
                ak_check(gemm, &c, rows / 2, rows / 2 + 1, nts[it]);
                ak_check(gemm, &c, 9, rows - 3, nts[it]);
            }
            ak_case_free(&c);
        }
    }
}

TEST(amx_q4_k_gemm_random)
{
    ak_random(SP_TYPE_Q4_K);
}

TEST(amx_q5_k_gemm_random)
{
    ak_random(SP_TYPE_Q5_K);
}

static void
ak_extreme(sp_type_t type)
{
    const sp_gemm_fn gemm = ak_gemm(type);
    if (gemm == NULL)
        SKIP("no AMX-INT8 level on this CPU / OS: nothing to test");
    static const int64_t ns[] = {256, 1024};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        ak_case_t c;
        ak_case_make(&c, type, ns[in], 21, 70, 5 + in, true);
        static const int64_t nts[] = {1, 15, 16, 17, 31, 32, 33, 48, 70};
        for (size_t it = 0; it < sizeof nts / sizeof nts[0]; it++) {
            ak_check(gemm, &c, 0, 21, nts[it]);
            ak_check(gemm, &c, 5, 19, nts[it]);
        }
        ak_case_free(&c);
    }
}

TEST(amx_q4_k_gemm_extreme)
{
    ak_extreme(SP_TYPE_Q4_K);
}

TEST(amx_q5_k_gemm_extreme)
{
    ak_extreme(SP_TYPE_Q5_K);
}

/* One token's results do not depend on the batch around it: the same token at each position
 * of a 64-token batch of other tokens gives the bits of it alone (the reference's, above),
 * here checked directly against a one-token call. */
TEST(amx_q4_k_batch_invariance)
{
    const sp_gemm_fn gemm = ak_gemm(SP_TYPE_Q4_K);
    if (gemm == NULL)
        SKIP("no AMX-INT8 level on this CPU / OS: nothing to test");
    ak_case_t c;
    const int64_t rows = 24, nt = 64;
    ak_case_make(&c, SP_TYPE_Q4_K, 512, rows, nt, 99, false);
    float *all = malloc(sizeof(float) * (size_t)(rows * nt)), one[24];
    ASSERT(all != NULL);
    gemm(c.n, c.packed, c.gb, 0, rows, c.x, c.xs, nt, all, rows);
    for (int64_t t = 0; t < nt; t++) {
        gemm(c.n, c.packed, c.gb, 0, rows, c.x + (size_t)t * c.xs, c.xs, 1, one, rows);
        ASSERT(memcmp(one, all + t * rows, sizeof one) == 0);
    }
    free(all);
    ak_case_free(&c);
}
