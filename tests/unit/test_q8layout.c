/*
 * test_q8layout.c - the 16-row panel form of Q8_0 and Q4_0 (SP_REPACK_PANEL16, kernels.h;
 * the q8layout_* and q40layout_* tests run the same checks on each type): its bytes, the
 * exact round trip to the file's rows, and the packed gemm of every level that reads it
 * (AVX-512 VNNI's, avx512_qgemm.c; the scalar oracle of cpu/repack.c at every level) giving
 * the reference vec_dot's bits for every (row, token): rows not a multiple of 16, ranges
 * inside a group, 1..140 tokens (one token, decode tiles, prefill tiles and two token
 * chunks), odd block counts (the pad block) and K chunks, extreme quants and scales. A
 * planted bug (one packed byte changed, or the wrong layout read) must be caught.
 */
#include "test.h"
#include "gemm_check.h"

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"
#include "kernels/kernels.h"

static uint64_t ql_rng;

static uint32_t
ql_next(void)
{
    ql_rng = ql_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(ql_rng >> 33);
}

static float
ql_uniform(void)
{
    return (float)(ql_next() % 20001) * 1e-4f - 1.0f;
}

/* A Q8_0 or Q4_0 matrix, its activations, the reference's products and a packed copy. */
typedef struct {
    sp_type_t type;
    int64_t n, rows, toks;
    size_t rb, xs;
    uint8_t *w, *x, *packed;
    float *want; /* want[t * rows + r] */
} ql_case_t;

static void
ql_make(ql_case_t *c, sp_type_t type, int64_t n, int64_t rows, int64_t toks, uint64_t seed,
        bool extreme)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const bool q4 = type == SP_TYPE_Q4_0;
    const int fb = q4 ? 18 : 34; /* file bytes per block */
    c->type = type;
    c->n = n;
    c->rows = rows;
    c->toks = toks;
    c->rb = sp_row_size(type, n);
    c->xs = sp_row_size(SP_TYPE_Q8_0, n);
    c->w = malloc(c->rb * (size_t)rows);
    c->x = malloc(c->xs * (size_t)toks);
    c->want = malloc(sizeof(float) * (size_t)(rows * toks));
    /* room for either form, 64-byte aligned as the loader's copy */
    const size_t pb = sp_repack_bytes_in(SP_REPACK_PANEL16, type, n, rows) +
                      sp_repack_bytes(type, n, rows);
    c->packed = aligned_alloc(64, (pb + 63) & ~(size_t)63);
    float *f = malloc(sizeof(float) * (size_t)n);
    ASSERT(c->w && c->x && c->want && c->packed && f);
    ql_rng = seed * 0x9E3779B97F4A7C15ull + 7;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = c->w + (size_t)r * c->rb;
        if (!extreme) {
            for (int64_t i = 0; i < n; i++)
                f[i] = (0.01f + 0.02f * (float)((i / 32 + r) % 7)) * ql_uniform();
            ASSERT(sp_quantize_row(type, f, row, n));
            continue;
        }
        /* raw blocks: quants at the ends of the grid (Q8_0 -128 / 127, Q4_0 nibbles 0 / 15
         * = -8 / 7) or random, scales from the largest finite half (65504) down to
         * subnormals and zero */
        static const uint16_t ds[] = {0x7BFF, 0x0001, 0x0000, 0x3C00, 0xBC00, 0x03FF};
        for (int64_t b = 0; b < n / 32; b++) {
            uint8_t *blk = row + b * fb;
            const uint16_t d = ds[(r + b) % 6];
            memcpy(blk, &d, 2);
            for (int j = 0; j < fb - 2; j++)
                blk[2 + j] = r % 3 == 0   ? (q4 ? 0x00 : 0x80)
                             : r % 3 == 1 ? (q4 ? 0xFF : 0x7F)
                                          : (uint8_t)ql_next();
        }
    }
    for (int64_t t = 0; t < toks; t++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = extreme ? (t % 2 ? -1.0f : 1.0f) * (i % 3 ? 1.0f : -1.0f) : ql_uniform();
        ref->from_float[SP_TYPE_Q8_0](f, c->x + (size_t)t * c->xs, n);
    }
    free(f);
    for (int64_t t = 0; t < toks; t++)
        for (int64_t r = 0; r < rows; r++)
            ref->vec_dot[type](n, &c->want[t * rows + r], c->w + (size_t)r * c->rb,
                                       c->x + (size_t)t * c->xs);
}

static void
ql_pack(ql_case_t *c, sp_repack_layout_t lay)
{
    const int gr = sp_repack_layout_rows(lay);
    sp_repack_pack_in(lay, c->type, c->n, c->w, c->rb, c->rows, 0, (c->rows + gr - 1) / gr,
                      c->packed);
}

static void
ql_free(ql_case_t *c)
{
    free(c->w);
    free(c->x);
    free(c->packed);
    free(c->want);
}

static gemm_verdict_t
ql_run(const ql_case_t *c, sp_gemm_fn gemm, sp_repack_layout_t lay, int64_t r0, int64_t r1,
       int64_t nt)
{
    const int64_t ldy = c->rows + 2;
    float *y = malloc(sizeof(float) * (size_t)(ldy * nt));
    ASSERT(y != NULL);
    const gemm_case_t gc = {gemm, c->n, c->packed, sp_repack_group_bytes_in(lay, c->type, c->n),
                            c->x, c->xs, c->want, c->rows, 1, false};
    const gemm_verdict_t v = gemm_check_range(&gc, r0, r1, nt, y, ldy, nt);
    free(y);
    return v;
}

/* The byte a packed group holds for element j of row i of a block (the file's quant byte
 * blk[2 + j'], j' = j for Q8_0 stored ^ 0x80, j % 16 for Q4_0 stored as it is), and that of a
 * zero row or pad block (a file block of zero bytes). */
static uint8_t
ql_want_byte(sp_type_t type, const uint8_t *blk, int j)
{
    if (type == SP_TYPE_Q4_0)
        return blk == NULL ? 0x00 : blk[2 + j % 16];
    return blk == NULL ? 0x80 : (uint8_t)(blk[2 + j] ^ 0x80);
}

static void
ql_bytes_and_roundtrip(sp_type_t type)
{
    const bool q4 = type == SP_TYPE_Q4_0;
    const size_t fb = q4 ? 18 : 34, pair = 2 * 16 * fb; /* 576 / 1088 bytes */
    /* sizes: pairs of blocks of 16 rows, the odd last block padded, the file's bytes per
     * row-block */
    ASSERT_EQ(sp_repack_layout_rows(SP_REPACK_PANEL16), 16);
    ASSERT_EQ(sp_repack_layout_rows(SP_REPACK_ROW8), 8);
    ASSERT_EQ(sp_repack_group_bytes_in(SP_REPACK_PANEL16, type, 64), pair);
    ASSERT_EQ(sp_repack_group_bytes_in(SP_REPACK_PANEL16, type, 96), 2 * pair);
    ASSERT_EQ(sp_repack_bytes_in(SP_REPACK_PANEL16, type, 2048, 17), 2 * 32 * pair);
    ASSERT_EQ(sp_repack_bytes_in(SP_REPACK_PANEL16, type, 2048, 32), 64 * fb * 32);
    ASSERT_EQ(sp_repack_bytes_in(SP_REPACK_PANEL16, SP_TYPE_IQ4_NL, 2048, 32), 0);
    ASSERT_EQ(sp_repack_bytes_in(SP_REPACK_PANEL16, type, 48, 32), 0);
    ASSERT_EQ(sp_repack_bytes_in(SP_REPACK_PANEL16, type, SP_REPACK_MAX_N + 32, 32), 0);
    ASSERT_EQ(sp_repack_bytes_in((sp_repack_layout_t)7, type, 64, 32), 0);
    ASSERT_EQ(sp_repack_bytes_in(SP_REPACK_ROW8, type, 64, 17), sp_repack_bytes(type, 64, 17));
    /* the offsets as kernels.h states them, spelled out: pair p at p * pair bytes, its two
     * blocks' 16 x (fb - 2) quant bytes, then the two blocks' 16 scales */
    ASSERT_EQ(sp__p16_qs_off_of(type, 3), pair + 16 * (fb - 2));
    ASSERT_EQ(sp__p16_d_off_of(type, 3), pair + 32 * (fb - 2) + 32);

    ql_case_t c;
    const int64_t n = 96, rows = 21; /* 3 blocks (one pad block), 2 groups (11 zero rows) */
    ql_make(&c, type, n, rows, 1, 3, true);
    ql_pack(&c, SP_REPACK_PANEL16);
    const size_t gb = sp_repack_group_bytes_in(SP_REPACK_PANEL16, type, n);
    for (int64_t r = 0; r < 32; r++)
        for (int64_t b = 0; b < 4; b++) {
            const uint8_t *g = c.packed + (size_t)(r / 16) * gb;
            const int i = (int)(r % 16);
            const bool real = r < rows && b < 3;
            const uint8_t *blk = real ? c.w + (size_t)r * c.rb + b * fb : NULL;
            uint16_t d;
            memcpy(&d, g + (size_t)b / 2 * pair + 32 * (fb - 2) + (size_t)(b % 2) * 32 + 2 * i, 2);
            ASSERT_EQ(d, real ? (uint16_t)(blk[0] | blk[1] << 8) : 0);
            /* element j of row i: byte 64 (j' / 4) + 4 i + j' % 4 of the block's quants */
            for (int j = 0; j < 32; j++) {
                const int jj = q4 ? j % 16 : j;
                const uint8_t got = g[(size_t)b / 2 * pair + (size_t)(b % 2) * 16 * (fb - 2) +
                                      (size_t)(64 * (jj / 4) + 4 * i + jj % 4)];
                ASSERT_EQ(got, ql_want_byte(type, blk, j));
            }
        }
    uint8_t back[3 * 34];
    for (int64_t r = 0; r < rows; r++) {
        sp_repack_unpack_row_in(SP_REPACK_PANEL16, type, n, c.packed, r, back);
        ASSERT(memcmp(back, c.w + (size_t)r * c.rb, c.rb) == 0);
    }
    ql_free(&c);
}

TEST(q8layout_bytes_and_roundtrip)
{
    ql_bytes_and_roundtrip(SP_TYPE_Q8_0);
}

TEST(q40layout_bytes_and_roundtrip)
{
    ql_bytes_and_roundtrip(SP_TYPE_Q4_0);
}

/* The packed gemm of each level's table that reads the panel form, and the scalar oracle. */
static int
ql_kernels(sp_type_t type, sp_gemm_fn gemm[4], const char *names[4])
{
    int nk = 0;
    gemm[nk] = type == SP_TYPE_Q4_0 ? sp__repack_q4_0_p16_gemm_ref : sp__repack_q8_0_p16_gemm_ref;
    names[nk++] = "scalar panel16";
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL) {
            printf("  skipped: level %d not on this CPU\n", l);
            continue;
        }
        if (k->repack_layout[type] != SP_REPACK_PANEL16) {
            /* avx2 and scalar (and AVX-512 without VNNI) keep the 8-row form */
            ASSERT(k->repack_gemm[type] == NULL || l < SP_CPU_AVX512 ||
                   k->repack_layout[type] == SP_REPACK_ROW8);
            continue;
        }
        ASSERT(k->repack_gemm[type] != NULL);
        gemm[nk] = k->repack_gemm[type];
        names[nk++] = k->name;
    }
    if (nk == 1)
        printf("  skipped: no AVX-512 VNNI on this CPU: only the scalar panel kernel tested\n");
    return nk;
}

static void
ql_gemm_every_level(sp_type_t type)
{
    sp_gemm_fn gemm[4];
    const char *names[4];
    const int nk = ql_kernels(type, gemm, names);
    /* n: one block (pad), three (pad), 64 (two prefill K chunks of 32), 514 (two decode K
     * chunks at 8 tokens: 512 blocks of records) */
    static const int64_t ns[] = {32, 96, 2048, 16448};
    static const int64_t rowss[] = {1, 15, 16, 17, 40};
    static const int64_t nts[] = {1, 2, 7, 8, 9, 33, 64, 140};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
        for (size_t ir = 0; ir < sizeof rowss / sizeof rowss[0]; ir++) {
            const int64_t n = ns[in], rows = rowss[ir];
            if (n > 2048 && rows != 40)
                continue; /* the long rows once: they only add K chunks */
            const int64_t toks = n > 2048 ? 9 : 140;
            ql_case_t c;
            ql_make(&c, type, n, rows, toks, 31 * in + ir, false);
            ql_pack(&c, SP_REPACK_PANEL16);
            for (int ki = 0; ki < nk; ki++) {
                for (size_t it = 0; it < sizeof nts / sizeof nts[0]; it++) {
                    if (nts[it] > toks || (ki == 0 && nts[it] > 9))
                        continue; /* the scalar oracle: its arithmetic has no tiles */
                    GEMM_CHECK_ASSERT(ql_run(&c, gemm[ki], SP_REPACK_PANEL16, 0, rows, nts[it]),
                                      "%s %s n=%lld rows %lld, %lld tokens", names[ki],
                                      sp_type_name(type), (long long)n, (long long)rows,
                                      (long long)nts[it]);
                }
                if (rows > 3) /* ranges that start and end inside a group */
                    for (int64_t nt = 1; nt <= 9; nt += 8)
                        GEMM_CHECK_ASSERT(ql_run(&c, gemm[ki], SP_REPACK_PANEL16, 3, rows - 1, nt),
                                          "%s %s n=%lld rows [3,%lld), %lld tokens", names[ki],
                                          sp_type_name(type), (long long)n, (long long)rows - 1,
                                          (long long)nt);
                if (rows == 40)
                    GEMM_CHECK_ASSERT(ql_run(&c, gemm[ki], SP_REPACK_PANEL16, 17, 33, 2),
                                      "%s %s n=%lld rows [17,33)", names[ki], sp_type_name(type),
                                      (long long)n);
            }
            ql_free(&c);
        }
}

TEST(q8layout_gemm_every_level)
{
    ql_gemm_every_level(SP_TYPE_Q8_0);
}

TEST(q40layout_gemm_every_level)
{
    ql_gemm_every_level(SP_TYPE_Q4_0);
}

/* Quants at the grid's ends (Q8_0 -128 / 127, Q4_0 -8 / 7) against activations of +-127
 * (block sums up to 32 * 128 * 127), scales from 65504 to subnormals and zero: the
 * reference's bits, infinities included. */
static void
ql_extremes(sp_type_t type)
{
    sp_gemm_fn gemm[4];
    const char *names[4];
    const int nk = ql_kernels(type, gemm, names);
    ql_case_t c;
    ql_make(&c, type, 512, 19, 9, 5, true);
    ql_pack(&c, SP_REPACK_PANEL16);
    for (int ki = 0; ki < nk; ki++)
        for (int64_t nt = 1; nt <= 9; nt++)
            GEMM_CHECK_ASSERT(ql_run(&c, gemm[ki], SP_REPACK_PANEL16, 0, 19, nt),
                              "%s %s extremes, %lld tokens", names[ki], sp_type_name(type),
                              (long long)nt);
    ql_free(&c);
}

TEST(q8layout_extremes)
{
    ql_extremes(SP_TYPE_Q8_0);
}

TEST(q40layout_extremes)
{
    ql_extremes(SP_TYPE_Q4_0);
}

/* The check catches what it should: one packed quant changed moves exactly that row's
 * result, and the 8-row form read as panels fails. */
static void
ql_planted_bug(sp_type_t type)
{
    sp_gemm_fn gemm[4];
    const char *names[4];
    const int nk = ql_kernels(type, gemm, names);
    ql_case_t c;
    ql_make(&c, type, 256, 20, 3, 9, false);
    for (int ki = 0; ki < nk; ki++) {
        ql_pack(&c, SP_REPACK_PANEL16);
        ASSERT(ql_run(&c, gemm[ki], SP_REPACK_PANEL16, 0, 20, 3).ok);
        /* row 18 (group 1, lane 2), block 5, element 9 (Q4_0: its low nibble, 9 + 16 its
         * high one): +1 */
        uint8_t *q = c.packed + sp_repack_group_bytes_in(SP_REPACK_PANEL16, type, 256) +
                     sp__p16_qs_off_of(type, 5) + sp__p16_elem_off(type, 2, 9);
        *q = (uint8_t)(*q == 0xFF ? 0xFE : *q + 1);
        const gemm_verdict_t v = ql_run(&c, gemm[ki], SP_REPACK_PANEL16, 0, 20, 3);
        if (v.ok || v.r != 18 || v.outside)
            SP_TEST_FAIL("%s %s: a changed quant of row 18 gave verdict ok=%d r=%lld",
                         names[ki], sp_type_name(type), (int)v.ok, (long long)v.r);
        ql_pack(&c, SP_REPACK_ROW8);
        ASSERT(!ql_run(&c, gemm[ki], SP_REPACK_PANEL16, 0, 20, 3).ok);
    }
    ql_free(&c);
}

TEST(q8layout_planted_bug)
{
    ql_planted_bug(SP_TYPE_Q8_0);
}

TEST(q40layout_planted_bug)
{
    ql_planted_bug(SP_TYPE_Q4_0);
}

#if defined(__x86_64__)
/*
 * The AMX-INT8 tile kernels (amx_qgemm.c) on the same panels: the tile path itself at every
 * token count from 1 to 70 and at 128 and 200 (one tile part full, several tiles, two token
 * chunks), whatever the level's threshold, and the amx table's entry on both sides of it;
 * K of 1 block, 3 (the pad block), 64 (two K chunks) and 176 (a short last chunk); row
 * ranges that start and end inside a panel; extreme quants and scales. Every cell the
 * reference's bits. On a CPU without AMX-INT8 the test says so and checks nothing.
 */
static void
ql_amx(sp_type_t type)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AMX);
    if (k == NULL) {
        printf("  skipped: no AMX-INT8 on this CPU (or the OS refused the tile state)\n");
        return;
    }
    const sp_gemm_fn tiles = sp__amx_qgemm_tiles(type);
    ASSERT(tiles != NULL && k->repack_gemm[type] != NULL);
    ASSERT(k->repack_layout[type] == SP_REPACK_PANEL16);
    static const int64_t ns[] = {32, 96, 2048, 5632};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        const int64_t n = ns[in], rows = 40;
        const int64_t toks = n > 2048 ? 40 : 200;
        ql_case_t c;
        ql_make(&c, type, n, rows, toks, 77 + in, false);
        ql_pack(&c, SP_REPACK_PANEL16);
        /* 1..70, then 128 and 200 */
        for (int64_t nt = 1; nt <= toks; nt = nt < 70 ? nt + 1 : nt < 128 ? 128 : nt + 72) {
            GEMM_CHECK_ASSERT(ql_run(&c, tiles, SP_REPACK_PANEL16, 0, rows, nt),
                              "amx tiles %s n=%lld rows 40, %lld tokens", sp_type_name(type),
                              (long long)n, (long long)nt);
            if (nt % 7 == 0 || nt >= 64) /* ranges inside a panel: first, middle, last */
                GEMM_CHECK_ASSERT(ql_run(&c, tiles, SP_REPACK_PANEL16, 3, 37, nt),
                                  "amx tiles %s n=%lld rows [3,37), %lld tokens",
                                  sp_type_name(type), (long long)n, (long long)nt);
            if (nt % 5 == 0)
                GEMM_CHECK_ASSERT(ql_run(&c, tiles, SP_REPACK_PANEL16, 18, 21, nt),
                                  "amx tiles %s n=%lld rows [18,21), %lld tokens",
                                  sp_type_name(type), (long long)n, (long long)nt);
        }
        /* the table's entry below, at and above the threshold, and with rests of a tile
         * below and at AMX_MIN_REM (the VNNI kernel takes the tokens after the tiles) */
        const int64_t around[] = {1,  2,  AMX_MIN_TOK - 1, AMX_MIN_TOK, AMX_MIN_TOK + 1,
                                  16 + AMX_MIN_REM - 1, 16 + AMX_MIN_REM, 35, 40, 200};
        for (size_t i = 0; i < sizeof around / sizeof around[0]; i++)
            if (around[i] >= 1 && around[i] <= toks)
                GEMM_CHECK_ASSERT(ql_run(&c, k->repack_gemm[type], SP_REPACK_PANEL16, 0, rows,
                                         around[i]),
                                  "%s %s n=%lld, %lld tokens", k->name, sp_type_name(type),
                                  (long long)n, (long long)around[i]);
        ql_free(&c);
    }
    /* extremes: quants at the grid's ends against +-127, scales from 65504 to zero */
    ql_case_t c;
    ql_make(&c, type, 512, 19, 40, 5, true);
    ql_pack(&c, SP_REPACK_PANEL16);
    for (int64_t nt = 1; nt <= 40; nt++)
        GEMM_CHECK_ASSERT(ql_run(&c, tiles, SP_REPACK_PANEL16, 0, 19, nt),
                          "amx tiles %s extremes, %lld tokens", sp_type_name(type),
                          (long long)nt);
    ql_free(&c);
    /* the check sees a changed weight: row 18, block 5, element 9 + 1 */
    ql_make(&c, type, 256, 20, 20, 9, false);
    ql_pack(&c, SP_REPACK_PANEL16);
    ASSERT(ql_run(&c, tiles, SP_REPACK_PANEL16, 0, 20, 20).ok);
    uint8_t *q = c.packed + sp_repack_group_bytes_in(SP_REPACK_PANEL16, type, 256) +
                 sp__p16_qs_off_of(type, 5) + sp__p16_elem_off(type, 2, 9);
    *q = (uint8_t)(*q == 0xFF ? 0xFE : *q + 1);
    const gemm_verdict_t v = ql_run(&c, tiles, SP_REPACK_PANEL16, 0, 20, 20);
    if (v.ok || v.r != 18 || v.outside)
        SP_TEST_FAIL("amx tiles %s: a changed quant of row 18 gave verdict ok=%d r=%lld",
                     sp_type_name(type), (int)v.ok, (long long)v.r);
    ql_free(&c);
}
#else
static void
ql_amx(sp_type_t type)
{
    (void)type;
    printf("  skipped: AMX is an x86-64 level\n");
}
#endif

TEST(q8layout_amx)
{
    ql_amx(SP_TYPE_Q8_0);
}

TEST(q40layout_amx)
{
    ql_amx(SP_TYPE_Q4_0);
}
