/*
 * test_attn.c - attention and element-wise kernels (exp, RMSNorm, SwiGLU) at
 * every level this CPU has, against the scalar reference (cpu/ref_attn.c),
 * and attention's batch invariance bit for bit.
 *
 * Tolerances, u = 2^-24:
 *   exp: the polynomial's model error is 5e-11 and the kernel rounds about
 *   five times in [1/sqrt2, sqrt2] before an exact (or, for denormal results,
 *   once-rounded) scaling: relative error <= 4u = 2.4e-7 against expf for
 *   normal results (measured ~1.2e-7 incl. expf's own), one denormal step
 *   (2^-149) below FLT_MIN.
 *   Attention: a score is a float dot of head_dim terms summed in chains of
 *   up to hd terms (AVX2 one chain per lane, AVX-512 two), so its error is at
 *   most ~hd u * scale sum|q k| <= hd u * S (S = the largest score bound);
 *   an error e in a score changes its weight by ~e relative, and the output
 *   is a convex combination of value rows (|v| <= 1), so
 *   |o - ref| <~ 2 (hd u S + eps_sum) with eps_sum from the float sum of
 *   n_kv exps (n_kv/16 + 8 roundings) and the final scaling. The test takes
 *   tol = (hd + n_kv/8 + 64) u (1 + S); random rounding keeps the measured
 *   errors far below (worst-case chains are what the bound covers).
 *   RMSNorm: float sum of squares: <= (n/64 + 8) u relative, times |x w|.
 *   SwiGLU: exp's error plus a division and two products: 8u relative.
 */
#include "test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

#include "core/alloc.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/kernels.h"

#define U 0x1p-24

static uint64_t rng_state = 88172645463325252ull;

static uint32_t
rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Uniform in [-a, a). */
static float
rnd(float a)
{
    return a * ((float)(rng_u32() & 0xffffff) * 0x1p-23f - 1.0f);
}

/* Whether two tables have the same functions for everything this file tests. */
static bool
same_attn_ops(const sp_cpu_kernels_t *a, const sp_cpu_kernels_t *b)
{
    return a->attn[SP_TYPE_F32] == b->attn[SP_TYPE_F32] &&
           a->attn[SP_TYPE_F16] == b->attn[SP_TYPE_F16] &&
           a->attn[SP_TYPE_Q8_0] == b->attn[SP_TYPE_Q8_0] && a->exp_f32 == b->exp_f32 &&
           a->rmsnorm == b->rmsnorm && a->swiglu == b->swiglu;
}

/* The SIMD levels this CPU has (index 0 = scalar is the reference). A level whose functions
 * are the level below's (arm64's dotprod table keeps the NEON attention: no integer products
 * here) is left out: running the same code twice tests nothing more, and under qemu it costs. */
static int
simd_levels(const sp_cpu_kernels_t **out)
{
    int n = 0;
    for (int l = SP_CPU_AVX2; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k != NULL && !(n > 0 && same_attn_ops(out[n - 1], k))) out[n++] = k;
    }
    return n;
}

/* ---- exp ----------------------------------------------------------------- */

static void
check_exp_values(const sp_cpu_kernels_t *k, const float *x, int64_t n, double *worst)
{
    float *y = sp_malloc((size_t)n * sizeof(float));
    k->exp_f32(y, x, n);
    for (int64_t i = 0; i < n; i++) {
        const float r = expf(x[i]);
        if (isnan(r)) {
            if (!isnan(y[i])) SP_TEST_FAIL("%s: exp(%a) = %a, want NaN", k->name, x[i], y[i]);
            continue;
        }
        if (isinf(r) || r == 0.0f) {
            if (y[i] != r) SP_TEST_FAIL("%s: exp(%a) = %a, want %a", k->name, x[i], y[i], r);
            continue;
        }
        if (r < FLT_MIN) {
            if (fabsf(y[i] - r) > 0x1p-149f) {
                SP_TEST_FAIL("%s: exp(%a) = %a, want %a (denormal)", k->name, x[i], y[i], r);
            }
            continue;
        }
        const double e = fabs((double)y[i] - (double)r) / (double)r;
        if (e > *worst) *worst = e;
        if (e > 4 * U) {
            SP_TEST_FAIL("%s: exp(%a) = %a, expf %a, rel err %.3g", k->name, x[i], y[i], r, e);
        }
    }
    sp_free(y);
}

TEST(attn_exp_matches_expf)
{
    const sp_cpu_kernels_t *lv[2];
    const int nl = simd_levels(lv);
    if (nl == 0) SKIP("no SIMD level on this CPU");
    /* A dense sweep of [-110, 95], the edges, specials and every length tail. */
    const int64_t n = 2000003;
    float *x = sp_malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = -110.0f + 205.0f * (float)i / (float)(n - 1);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-30f, -1e-30f,
                             88.72283f, 88.72284f, 88.7229f, 88.8f, 89.0f, 1e30f, -1e30f,
                             -87.33654f, -87.3366f, -100.0f, -103.27893f, -103.972f, -103.9721f,
                             -104.0f, -104.5f, -200.0f, FLT_MAX, -FLT_MAX, 0.5f * 0.6931472f,
                             -0.5f * 0.6931472f};
    const int ns = (int)(sizeof special / sizeof special[0]);
    for (int l = 0; l < nl; l++) {
        double worst = 0.0;
        check_exp_values(lv[l], x, n, &worst);
        for (int64_t len = 1; len <= ns; len++) {
            check_exp_values(lv[l], special, len, &worst); /* tails of every length */
        }
        /* In place (y == x), as the contract allows. */
        float inpl[37];
        for (int i = 0; i < 37; i++) inpl[i] = rnd(20.0f);
        float want[37];
        for (int i = 0; i < 37; i++) want[i] = inpl[i];
        lv[l]->exp_f32(want, want, 37);
        lv[l]->exp_f32(inpl, inpl, 37);
        ASSERT(memcmp(inpl, want, sizeof want) == 0);
    }
    sp_free(x);
}

/* ---- attention ------------------------------------------------------------ */

/* The optional parts of the contract every case below runs with (kernels.h):
 * a sliding window, a soft-cap, per-head sinks (g_sinks[h], at least 8 heads).
 * Zero / NULL in the plain tests. */
static int64_t g_window;
static float g_softcap;
static const float *g_sinks;

typedef struct attn_case {
    int64_t hd, n_q, n_kv, v_stride, q_stride;
    sp_type_t kv_type;
    float *q, *o;
    float *k_log, *v_log; /* the logical cache: key (p, d) at p * hd + d, value rows of hd */
    void *k, *v;          /* the paged cache the kernel reads */
    int32_t *blocks;
    int64_t k_block_stride, v_block_stride;
    float *scratch;
    float scale;
} attn_case_t;

/* Block layouts: 0 contiguous (ids 0, 1, 2, ...), 1 reversed, 2 scattered
 * over a pool three times larger with the blocks' K and V interleaved. */
#define N_LAYOUTS 3

static void
store_kv(sp_type_t type, void *base, int64_t i, float f)
{
    if (type == SP_TYPE_F16) {
        ((sp_fp16_t *)base)[i] = sp_fp32_to_fp16(f);
    } else {
        ((float *)base)[i] = f;
    }
}

/* (Re)build the paged cache of c from its logical cache in one layout. For
 * Q8_0 every offset and stride counts bytes (kernels.h) and the positions
 * are quantised as the engine stores them. */
static void
case_layout(attn_case_t *c, int layout)
{
    const int64_t hd = c->hd, nb = sp_attn_scratch_stride(c->n_kv) / SP_ATTN_BLOCK;
    const bool q8 = c->kv_type == SP_TYPE_Q8_0;
    const size_t esz = q8 ? 1 : c->kv_type == SP_TYPE_F16 ? 2 : 4;
    const int64_t k_tile = q8 ? sp_kv_q8_tile_bytes(hd) : SP_ATTN_BLOCK * hd;
    sp_free(c->k);
    sp_free(c->blocks);
    c->blocks = sp_malloc((size_t)nb * sizeof(int32_t));
    int64_t n_phys = nb;
    const int64_t vblk = SP_ATTN_BLOCK * c->v_stride;
    if (layout == 2) {
        /* K and V of one block side by side, blocks strided by both plus a gap. */
        n_phys = 3 * nb + 1;
        n_phys += n_phys % 7 == 0; /* 7 coprime to n_phys: (7i + 2) mod n_phys is injective */
        c->k_block_stride = c->v_block_stride = k_tile + vblk + 7;
    } else {
        c->k_block_stride = k_tile;
        c->v_block_stride = vblk;
    }
    for (int64_t i = 0; i < nb; i++) {
        c->blocks[i] = (int32_t)(layout == 0 ? i : layout == 1 ? nb - 1 - i : (i * 7 + 2) % n_phys);
    }
    /* Unused memory holds NaN (for Q8_0, 0xff bytes: F16 NaN scales): a
     * kernel reading outside its blocks shows. */
    const int64_t k_elems = n_phys * c->k_block_stride;
    const int64_t v_elems = layout == 2 ? 0 : n_phys * c->v_block_stride;
    c->k = sp_malloc((size_t)(k_elems + v_elems) * esz);
    ASSERT(c->k && c->blocks);
    if (q8) {
        memset(c->k, 0xff, (size_t)(k_elems + v_elems));
    } else {
        for (int64_t i = 0; i < k_elems + v_elems; i++) store_kv(c->kv_type, c->k, i, NAN);
    }
    c->v = layout == 2 ? (char *)c->k + (size_t)k_tile * esz : (char *)c->k + (size_t)k_elems * esz;
    sp_attn_args_t a = {.head_dim = hd, .blocks = c->blocks, .k_block_stride = c->k_block_stride,
                        .v_block_stride = c->v_block_stride, .v_stride = c->v_stride};
    for (int64_t p = 0; p < nb * SP_ATTN_BLOCK; p++) {
        if (q8) {
            sp_kv_q8_store_key((char *)c->k + c->blocks[p / SP_ATTN_BLOCK] * c->k_block_stride,
                               p % SP_ATTN_BLOCK, c->k_log + p * hd, hd);
            continue;
        }
        for (int64_t d = 0; d < hd; d++) {
            store_kv(c->kv_type, c->k, sp_attn_k_offset(&a, p, d), c->k_log[p * hd + d]);
        }
    }
    for (int64_t p = 0; p < c->n_kv; p++) {
        if (q8) {
            sp_kv_q8_store_value((char *)c->v + sp_attn_v_offset(&a, p), c->v_log + p * hd, hd);
            continue;
        }
        for (int64_t d = 0; d < hd; d++) {
            store_kv(c->kv_type, c->v, sp_attn_v_offset(&a, p) + d, c->v_log[p * hd + d]);
        }
    }
}

static void
case_init(attn_case_t *c, int64_t hd, int64_t n_q, int64_t n_kv, sp_type_t kv_type, float qa)
{
    memset(c, 0, sizeof *c);
    c->hd = hd;
    c->n_q = n_q;
    c->n_kv = n_kv;
    c->kv_type = kv_type;
    /* Value rows of a wider cache, not just this head (Q8_0: bytes, odd, so
     * the F16 scales are misaligned too). */
    c->v_stride = (kv_type == SP_TYPE_Q8_0 ? sp_kv_q8_row_bytes(hd) : hd) * 3 + 5;
    c->q_stride = hd + 3;
    c->scale = 1.0f / sqrtf((float)hd);
    c->q = sp_malloc((size_t)(n_q * c->q_stride) * sizeof(float));
    c->o = sp_malloc((size_t)(n_q * c->q_stride) * sizeof(float));
    const int64_t n_pad = sp_attn_scratch_stride(n_kv); /* whole key blocks */
    c->k_log = sp_malloc((size_t)(n_pad * hd) * sizeof(float));
    c->v_log = sp_malloc((size_t)(n_kv * hd) * sizeof(float));
    c->scratch =
        sp_malloc_aligned((size_t)(n_q * sp_attn_scratch_stride(n_kv)) * sizeof(float), 64);
    ASSERT(c->q && c->o && c->k_log && c->v_log && c->scratch);
    for (int64_t i = 0; i < n_q * c->q_stride; i++) c->q[i] = rnd(qa);
    /* Lanes of the last key block past n_kv hold NaN: the kernels must
     * ignore them, as the contract says. */
    for (int64_t p = 0; p < n_pad; p++) {
        for (int64_t d = 0; d < hd; d++) c->k_log[p * hd + d] = p < n_kv ? rnd(1.0f) : NAN;
    }
    for (int64_t i = 0; i < n_kv * hd; i++) c->v_log[i] = rnd(1.0f);
    /* Positions before a sliding window hold NaN too: never read. */
    const int64_t lo = g_window > 0 && n_kv > g_window ? n_kv - g_window : 0;
    for (int64_t i = 0; i < lo * hd; i++) c->k_log[i] = c->v_log[i] = NAN;
    case_layout(c, 0);
}

static void
case_free(attn_case_t *c)
{
    sp_free(c->q);
    sp_free(c->o);
    sp_free(c->k);
    sp_free(c->k_log);
    sp_free(c->v_log);
    sp_free(c->blocks);
    sp_free(c->scratch);
}

/* Run heads h0..h0+n of the case, as the token at position n_kv - 1, into o
 * (rows q_stride apart). fresh: garbage in the scratch first (the kernel must
 * not read what it did not write); else the scratch is reused as it is. */
static void
case_call(const sp_cpu_kernels_t *k, attn_case_t *c, int64_t h0, int64_t n, int64_t n_kv,
          int fresh, float *o)
{
    if (fresh) {
        for (int64_t i = 0; i < n * sp_attn_scratch_stride(c->n_kv); i++) c->scratch[i] = NAN;
    }
    sp_attn_args_t a = {
        .head_dim = c->hd, .n_q = n, .n_kv = n_kv, .q = c->q + h0 * c->q_stride,
        .q_stride = c->q_stride, .k = c->k, .v = c->v, .blocks = c->blocks,
        .k_block_stride = c->k_block_stride, .v_block_stride = c->v_block_stride,
        .v_stride = c->v_stride,
        .scale = c->scale, .o = o + h0 * c->q_stride, .o_stride = c->q_stride,
        .scratch = c->scratch, .window = g_window, .softcap = g_softcap,
        .sinks = g_sinks != NULL ? g_sinks + h0 : NULL,
    };
    k->attn[c->kv_type](&a);
}

/* Heads h0..h0+n over the whole cache, fresh scratch. */
static void
case_run(const sp_cpu_kernels_t *k, attn_case_t *c, int64_t h0, int64_t n, float *o)
{
    case_call(k, c, h0, n, c->n_kv, 1, o);
}

static void
check_attn_case(const sp_cpu_kernels_t *const *lv, int nl, int64_t hd, int64_t n_q, int64_t n_kv,
                sp_type_t kv_type, float qa)
{
    attn_case_t c;
    case_init(&c, hd, n_q, n_kv, kv_type, qa);
    const size_t obytes = (size_t)(n_q * c.q_stride) * sizeof(float);
    float *ref = sp_malloc(obytes), *o = sp_malloc(obytes), *o2 = sp_malloc(obytes);
    memset(ref, 0, obytes);
    case_run(sp_cpu_kernels_ref(), &c, 0, n_q, ref);
    /* max score for the tolerance: |scale q.k| <= scale sum|q| (|k| <= 1) */
    double smax = 0.0;
    for (int64_t h = 0; h < n_q; h++) {
        double s = 0.0;
        for (int64_t d = 0; d < hd; d++) s += fabs(c.q[h * c.q_stride + d]);
        smax = s * c.scale > smax ? s * c.scale : smax;
    }
    /* Q8_0 values are |q d| <= amax (1 + 2^-11) (d rounded to F16): the same
     * bound with 1.001 for 1, as the reference reads the same exact values. */
    if (kv_type == SP_TYPE_Q8_0) smax *= 1.001;
    const double tol = ((double)hd + (double)n_kv / 8 + 64) * U * (1.0 + smax) *
                       (kv_type == SP_TYPE_Q8_0 ? 1.001 : 1.0);
    for (int l = 0; l < nl; l++) {
        memset(o, 0, obytes);
        case_run(lv[l], &c, 0, n_q, o);
        for (int64_t h = 0; h < n_q; h++) {
            for (int64_t d = 0; d < hd; d++) {
                const double e = fabs((double)o[h * c.q_stride + d] - ref[h * c.q_stride + d]);
                if (!(e <= tol)) {
                    SP_TEST_FAIL("%s %s hd %lld n_q %lld n_kv %lld: o[%lld][%lld] = %.9g, ref "
                                 "%.9g (tol %.3g)", lv[l]->name, sp_type_name(kv_type),
                                 (long long)hd, (long long)n_q, (long long)n_kv, (long long)h,
                                 (long long)d, o[h * c.q_stride + d], ref[h * c.q_stride + d], tol);
                }
            }
            /* Padding between output rows is never written. */
            for (int64_t d = hd; d < c.q_stride; d++) ASSERT(o[h * c.q_stride + d] == 0.0f);
        }
        /* Batch invariance: each head alone, and in uneven groups, same bits. */
        memset(o2, 0, obytes);
        for (int64_t h = 0; h < n_q; h++) case_run(lv[l], &c, h, 1, o2);
        if (memcmp(o, o2, obytes) != 0) {
            SP_TEST_FAIL("%s: heads one at a time differ from n_q %lld", lv[l]->name,
                         (long long)n_q);
        }
        memset(o2, 0, obytes);
        for (int64_t h = 0; h < n_q; h += 3) case_run(lv[l], &c, h, n_q - h < 3 ? n_q - h : 3, o2);
        if (memcmp(o, o2, obytes) != 0) {
            SP_TEST_FAIL("%s: heads in threes differ from n_q %lld", lv[l]->name, (long long)n_q);
        }
    }
    /* Paged: the same cache in reversed and scattered blocks, same bits. */
    float *o3 = sp_malloc(obytes);
    for (int l = 0; l < nl; l++) {
        case_layout(&c, 0);
        memset(o, 0, obytes);
        case_run(lv[l], &c, 0, n_q, o);
        for (int layout = 1; layout < N_LAYOUTS; layout++) {
            case_layout(&c, layout);
            memset(o3, 0, obytes);
            case_run(lv[l], &c, 0, n_q, o3);
            if (memcmp(o, o3, obytes) != 0) {
                SP_TEST_FAIL("%s %s hd %lld n_q %lld n_kv %lld: block layout %d differs from "
                             "contiguous", lv[l]->name, sp_type_name(kv_type), (long long)hd,
                             (long long)n_q, (long long)n_kv, layout);
            }
        }
    }
    sp_free(o3);
    sp_free(ref);
    sp_free(o);
    sp_free(o2);
    case_free(&c);
}

TEST(attn_matches_reference_all_shapes)
{
    const sp_cpu_kernels_t *lv[SP_CPU_TOP + 1];
    int nl = simd_levels(lv);
    lv[nl++] = sp_cpu_kernels_ref(); /* the reference's own invariance */
    const int64_t hds[] = {8, 13, 64, 72, 128, 96};
    const int64_t nqs[] = {1, 2, 3, 5, 8};
    const int64_t nkvs[] = {1, 2, 15, 16, 17, 33, 300};
    for (int t = 0; t < 3; t++) {
        const sp_type_t kt = t == 0 ? SP_TYPE_F32 : t == 1 ? SP_TYPE_F16 : SP_TYPE_Q8_0;
        for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++) {
            for (size_t j = 0; j < sizeof nqs / sizeof nqs[0]; j++) {
                for (size_t m = 0; m < sizeof nkvs / sizeof nkvs[0]; m++) {
                    check_attn_case(lv, nl, hds[i], nqs[j], nkvs[m], kt, 1.0f);
                }
            }
        }
    }
}

/* The head_dim tails (not a multiple of 16, or of 32 for the Q8_0 groups), uneven head groups
 * and a partial last block, for every cache type: a tenth of the shapes above, which the arm64
 * suite runs under qemu instead of the whole sweep (half a minute there). */
TEST(attn_matches_reference_tails)
{
    const sp_cpu_kernels_t *lv[SP_CPU_TOP + 1];
    int nl = simd_levels(lv);
    lv[nl++] = sp_cpu_kernels_ref();
    const int64_t hds[] = {8, 13, 40, 72, 96};
    const int64_t nqs[] = {1, 5};
    const int64_t nkvs[] = {1, 17, 33};
    for (int t = 0; t < 3; t++) {
        const sp_type_t kt = t == 0 ? SP_TYPE_F32 : t == 1 ? SP_TYPE_F16 : SP_TYPE_Q8_0;
        for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++) {
            for (size_t j = 0; j < sizeof nqs / sizeof nqs[0]; j++) {
                for (size_t m = 0; m < sizeof nkvs / sizeof nkvs[0]; m++) {
                    check_attn_case(lv, nl, hds[i], nqs[j], nkvs[m], kt, 1.0f);
                }
            }
        }
    }
}

/* The contract's formula in double from the logical cache (F32 only):
 * window, soft-cap and sink as kernels.h states them. */
static double
naive_attn(const attn_case_t *c, int64_t h, int64_t d)
{
    const int64_t lo = g_window > 0 && c->n_kv > g_window ? c->n_kv - g_window : 0;
    double s[512], mx = g_sinks != NULL ? g_sinks[h] : -INFINITY;
    ASSERT(c->n_kv <= 512);
    for (int64_t p = lo; p < c->n_kv; p++) {
        double dot = 0.0;
        for (int64_t i = 0; i < c->hd; i++) {
            dot += (double)c->q[h * c->q_stride + i] * c->k_log[p * c->hd + i];
        }
        s[p] = dot * c->scale;
        if (g_softcap > 0.0f) s[p] = g_softcap * tanh(s[p] / g_softcap);
        mx = s[p] > mx ? s[p] : mx;
    }
    double sum = g_sinks != NULL ? exp(g_sinks[h] - mx) : 0.0, acc = 0.0;
    for (int64_t p = lo; p < c->n_kv; p++) {
        sum += exp(s[p] - mx);
        acc += exp(s[p] - mx) * c->v_log[p * c->hd + d];
    }
    return acc / sum;
}

/* Sliding window, soft-cap and sinks, alone and together, on every level
 * against the reference (check_attn_case: tolerance, batch invariance, block
 * layouts; the positions before the window hold NaN), and the reference
 * against the formula. Reference vs formula: float scores (a few U of the
 * score) through tanh and exp: 1e-5 absolute bounds it with |v| <= 1 for
 * these magnitudes (scores below 8). */
TEST(attn_window_softcap_sinks)
{
    const sp_cpu_kernels_t *lv[SP_CPU_TOP + 1];
    int nl = simd_levels(lv);
    lv[nl++] = sp_cpu_kernels_ref();
    static const float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, 3.5f, -0.25f, 1.0f, 6.0f};
    const int64_t windows[] = {0, 1, 5, 16, 20, 300};
    const float caps[] = {0.0f, 2.5f};
    const int64_t nkvs[] = {1, 16, 17, 33, 100};
    for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
        for (int ci = 0; ci < 2; ci++) {
            for (int si = 0; si < 2; si++) {
                g_window = windows[wi];
                g_softcap = caps[ci];
                g_sinks = si ? sinks : NULL;
                for (size_t m = 0; m < sizeof nkvs / sizeof nkvs[0]; m++) {
                    for (int t = 0; t < 3; t++) {
                        const sp_type_t kt =
                            t == 0 ? SP_TYPE_F32 : t == 1 ? SP_TYPE_F16 : SP_TYPE_Q8_0;
                        check_attn_case(lv, nl, t == 1 ? 13 : 64, 5, nkvs[m], kt, 3.0f);
                    }
                    attn_case_t c;
                    case_init(&c, 24, 8, nkvs[m], SP_TYPE_F32, 3.0f);
                    float *o = sp_malloc((size_t)(8 * c.q_stride) * sizeof(float));
                    case_run(sp_cpu_kernels_ref(), &c, 0, 8, o);
                    for (int64_t h = 0; h < 8; h++) {
                        for (int64_t d = 0; d < 24; d++) {
                            const double want = naive_attn(&c, h, d);
                            if (!(fabs(o[h * c.q_stride + d] - want) <= 1e-5)) {
                                SP_TEST_FAIL("ref window %lld cap %g sinks %d n_kv %lld: o[%lld][%lld]"
                                             " = %.9g, formula %.9g", (long long)g_window,
                                             (double)g_softcap, si, (long long)nkvs[m],
                                             (long long)h, (long long)d, o[h * c.q_stride + d], want);
                            }
                        }
                    }
                    sp_free(o);
                    case_free(&c);
                }
            }
        }
    }
    g_window = 0;
    g_softcap = 0.0f;
    g_sinks = NULL;
}

/*
 * Decode against prefill, bit for bit: a token's output computed alone (fresh
 * NaN scratch, NaN in its output row) equals the same token's row when a
 * prefill runs the positions one after another through one scratch and
 * output rows left with other numbers. Positions around block boundaries and
 * the kernels' internal chunks of value rows (a few KiB of cache: 16 to 240
 * positions at these head_dims), head_dims with whole and partial 16- and
 * 24-dim tiles, every cache type, with and without window, soft-cap and sinks.
 */
TEST(attn_prefill_rows_match_decode)
{
    const sp_cpu_kernels_t *lv[SP_CPU_TOP + 1];
    int nl = simd_levels(lv);
    lv[nl++] = sp_cpu_kernels_ref();
    static const float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, 3.5f, -0.25f, 1.0f, 6.0f};
    const int64_t hds[] = {24, 40, 64, 72, 128};
    const int64_t toks[] = {1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 97, 159, 160, 161, 239,
                            240, 241, 255, 257, 300};
    const int64_t nt = (int64_t)(sizeof toks / sizeof toks[0]), n_kv = 300;
    for (int t = 0; t < 3; t++) {
        const sp_type_t kt = t == 0 ? SP_TYPE_F32 : t == 1 ? SP_TYPE_F16 : SP_TYPE_Q8_0;
        for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++) {
            for (int mode = 0; mode < 2; mode++) {
                const int64_t n_q = mode == 0 ? 8 : 5;
                g_window = 0; /* the whole cache holds numbers; the window applies per call */
                attn_case_t c;
                case_init(&c, hds[i], n_q, n_kv, kt, 2.0f);
                const int64_t row = n_q * c.q_stride;
                float *pre = sp_malloc((size_t)(nt * row) * sizeof(float));
                float *one = sp_malloc((size_t)row * sizeof(float));
                ASSERT(pre && one);
                g_window = mode == 0 ? 0 : 37;
                g_softcap = mode == 0 ? 0.0f : 4.0f;
                g_sinks = mode == 0 ? NULL : sinks;
                for (int l = 0; l < nl; l++) {
                    for (int64_t j = 0; j < nt * row; j++) pre[j] = (float)(j % 13) - 6.0f;
                    for (int64_t j = 0; j < nt; j++) {
                        case_call(lv[l], &c, 0, n_q, toks[j], 0, pre + j * row);
                    }
                    for (int64_t j = 0; j < nt; j++) {
                        for (int64_t x = 0; x < row; x++) one[x] = NAN;
                        case_call(lv[l], &c, 0, n_q, toks[j], 1, one);
                        for (int64_t h = 0; h < n_q; h++) {
                            if (memcmp(one + h * c.q_stride, pre + j * row + h * c.q_stride,
                                       (size_t)c.hd * sizeof(float)) != 0) {
                                SP_TEST_FAIL("%s %s hd %lld n_q %lld mode %d: position %lld "
                                             "head %lld alone differs from the prefill row",
                                             lv[l]->name, sp_type_name(kt), (long long)c.hd,
                                             (long long)n_q, mode, (long long)(toks[j] - 1),
                                             (long long)h);
                            }
                        }
                    }
                }
                g_window = 0;
                g_softcap = 0.0f;
                g_sinks = NULL;
                sp_free(pre);
                sp_free(one);
                case_free(&c);
            }
        }
    }
}

/* Peaked softmax (large scores: one position dominates, most exps underflow)
 * and a long context. */
TEST(attn_matches_reference_peaked_and_long)
{
    const sp_cpu_kernels_t *lv[2];
    const int nl = simd_levels(lv);
    if (nl == 0) SKIP("no SIMD level on this CPU");
    check_attn_case(lv, nl, 64, 8, 200, SP_TYPE_F32, 40.0f);
    check_attn_case(lv, nl, 128, 4, 100, SP_TYPE_F16, 60.0f);
    check_attn_case(lv, nl, 64, 8, 4097, SP_TYPE_F32, 1.0f);
    check_attn_case(lv, nl, 64, 4, 2500, SP_TYPE_F16, 2.0f);
    check_attn_case(lv, nl, 128, 8, 200, SP_TYPE_Q8_0, 40.0f);
    check_attn_case(lv, nl, 80, 4, 2500, SP_TYPE_Q8_0, 2.0f);
}

/* The Q8_0 cache's numbers: GGUF's Q8_0 (a value row with head_dim % 32 == 0
 * has sp_quantize_row's bytes; keys quantise each position's row the same
 * way, transposed), the error within half a step plus the F16 rounding of
 * the scale, and NaN or huge inputs clamped instead of undefined. */
TEST(attn_q8_0_cache_layout_and_error)
{
    const int64_t hds[] = {8, 13, 32, 64, 72, 128};
    for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++) {
        const int64_t hd = hds[i], G = sp_kv_q8_groups(hd), rb = sp_kv_q8_row_bytes(hd);
        ASSERT_EQ(rb, hd + 2 * G);
        ASSERT_EQ(sp_kv_q8_tile_bytes(hd), 16 * rb);
        float x[SP_ATTN_BLOCK][128];
        uint8_t tile[16 * (128 + 8)], row[128 + 8], ref[128 + 8];
        for (int p = 0; p < SP_ATTN_BLOCK; p++) {
            /* all zero, big, and shrinking amplitudes */
            const float amp = p == 3 ? 0.0f : p == 5 ? 3e4f : 1.0f / (float)(1 + p);
            for (int64_t d = 0; d < hd; d++) x[p][d] = rnd(amp);
            sp_kv_q8_store_key(tile, p, x[p], hd);
        }
        for (int p = 0; p < SP_ATTN_BLOCK; p++) {
            sp_kv_q8_store_value(row, x[p], hd);
            if (hd % 32 == 0) {
                ASSERT(sp_quantize_row(SP_TYPE_Q8_0, x[p], ref, hd));
                ASSERT(memcmp(row, ref, (size_t)rb) == 0);
            }
            for (int64_t d = 0; d < hd; d++) {
                float amax = 0.0f;
                for (int64_t j = d / 32 * 32; j < hd && j < d / 32 * 32 + 32; j++) {
                    amax = fmaxf(amax, fabsf(x[p][j]));
                }
                const double step = amax / 127.0;
                const double tol = step / 2 * (1 + 0x1p-10) + amax * 0x1p-10;
                const float kq = sp_kv_q8_key(tile, p, d, hd), vq = sp_kv_q8_value(row, d);
                ASSERT(kq == vq); /* one rule for keys and values */
                if (!(fabs((double)vq - x[p][d]) <= tol)) {
                    SP_TEST_FAIL("hd %lld p %d d %lld: %.9g -> %.9g (tol %.3g)", (long long)hd, p,
                                 (long long)d, x[p][d], vq, tol);
                }
            }
        }
    }
    /* NaN, infinities and values past half's range reach no undefined int
     * conversion (UBSan checks the build); NaN beside finite values gives
     * finite numbers (the clamp), so one bad element never spreads NaN. */
    float bad[64];
    for (int d = 0; d < 64; d++) {
        bad[d] = d < 32 ? (d % 3 == 0 ? NAN : 0.5f) : (d % 3 == 0 ? INFINITY : -1e30f);
    }
    uint8_t brow[68], btile[16 * 68];
    sp_kv_q8_store_value(brow, bad, 64);
    sp_kv_q8_store_key(btile, 7, bad, 64);
    for (int d = 0; d < 32; d++) {
        ASSERT(isfinite(sp_kv_q8_value(brow, d)) && isfinite(sp_kv_q8_key(btile, 7, d, 64)));
    }
}

/* ---- RMSNorm, SwiGLU ------------------------------------------------------- */

TEST(attn_rmsnorm_and_swiglu_match_reference)
{
    const sp_cpu_kernels_t *lv[2];
    const int nl = simd_levels(lv);
    if (nl == 0) SKIP("no SIMD level on this CPU");
    const sp_cpu_kernels_t *r = sp_cpu_kernels_ref();
    const int64_t ns[] = {1, 7, 8, 15, 16, 17, 64, 100, 2048, 5632};
    float *x = sp_malloc(5632 * sizeof(float)), *w = sp_malloc(5632 * sizeof(float));
    float *a = sp_malloc(5632 * sizeof(float)), *b = sp_malloc(5632 * sizeof(float));
    float *g = sp_malloc(5632 * sizeof(float));
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const int64_t n = ns[i];
        for (int64_t j = 0; j < n; j++) {
            x[j] = rnd(3.0f);
            w[j] = rnd(2.0f);
            g[j] = rnd(30.0f);
        }
        r->rmsnorm(a, x, w, n, 1e-5f);
        for (int l = 0; l < nl; l++) {
            lv[l]->rmsnorm(b, x, w, n, 1e-5f);
            double rms = 0.0;
            for (int64_t j = 0; j < n; j++) rms += (double)x[j] * x[j];
            rms = sqrt(rms / (double)n + 1e-5);
            for (int64_t j = 0; j < n; j++) {
                const double tol = ((double)n / 64 + 8) * U * fabs(x[j] * w[j]) / rms + 1e-30;
                if (!(fabs((double)a[j] - b[j]) <= tol)) {
                    SP_TEST_FAIL("%s rmsnorm n %lld [%lld]: %.9g vs ref %.9g", lv[l]->name,
                                 (long long)n, (long long)j, b[j], a[j]);
                }
            }
            /* In place. */
            memcpy(b, x, (size_t)n * sizeof(float));
            lv[l]->rmsnorm(b, b, w, n, 1e-5f);
            for (int64_t j = 0; j < n; j++) {
                ASSERT_NEAR(b[j], a[j], ((double)n / 64 + 8) * U * fabs(x[j] * w[j]) / rms + 1e-30);
            }
        }
        memcpy(a, g, (size_t)n * sizeof(float));
        r->swiglu(a, x, n);
        for (int l = 0; l < nl; l++) {
            memcpy(b, g, (size_t)n * sizeof(float));
            lv[l]->swiglu(b, x, n);
            for (int64_t j = 0; j < n; j++) {
                if (!(fabs((double)a[j] - b[j]) <= 8 * U * fabs(a[j]) + 1e-37)) {
                    SP_TEST_FAIL("%s swiglu n %lld [%lld] g %.9g: %.9g vs ref %.9g", lv[l]->name,
                                 (long long)n, (long long)j, g[j], b[j], a[j]);
                }
            }
        }
    }
    /* SwiGLU at the extremes: large negative gates give -0 or tiny values, not NaN. */
    float ge[6] = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f, -1e30f}, ue[6] = {1, 1, 1, 1, 1, 1};
    for (int l = 0; l < nl; l++) {
        float t[6];
        memcpy(t, ge, sizeof t);
        lv[l]->swiglu(t, ue, 6);
        for (int j = 0; j < 6; j++) ASSERT(!isnan(t[j]));
        ASSERT(fabsf(t[0]) < 1e-30f && t[2] == 0.0f && t[3] == 90.0f && t[4] == 200.0f);
    }
    sp_free(x);
    sp_free(w);
    sp_free(a);
    sp_free(b);
    sp_free(g);
}
