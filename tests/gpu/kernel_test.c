/*
 * kernel_test.c - every op of the CUDA library against the CPU reference
 * kernels (src/kernels/cpu/ref*.c, linked in), through the op table exactly
 * as sampan calls it.
 *
 *     build/gpu_kernel_test [LIB.so]     (default: sp_loader_api(), i.e.
 *                                         $SAMPAN_CUDA_LIB or libsampan_cuda.so
 *                                         next to the program)
 *
 * Without a usable library or GPU it prints why and "skipped". Run against
 * tests/gpu/fake_cuda.c in CI, on a GPU by bench/gpu/run.sh. Last line:
 * "gpu_kernel_test: N passed, N failed, N skipped".
 *
 * Tolerances, from the precision each op computes in (cuda_api.h):
 *   to_f16, embed                exact (both sides round the same float once)
 *   rmsnorm F32 out              1e-5 relative to the row's max |out|
 *   rmsnorm F16 out, swiglu      1e-3 relative (F16 has 11 bits: 4.9e-4 half ulp)
 *   gemm                         1e-3 of sum |w||x| per element (F32 accumulation
 *                                over F16 products, any summation order)
 *   rope_cs, rope                2e-6 absolute / 1e-5 (double angle, float rotation;
 *                                the attention factor 1 and 1.2 times the table)
 *   kv_write                     exact (F32 cache) / F16 rounding (F16 cache)
 *   attention                    2e-3 relative to max |v| (F16 output, expf vs
 *                                the reference's double sums)
 *   attention, window / softcap  the same (positions before the window never read)
 *   attention, sinks             the same (a per-head logit in the denominator)
 *   scale                        exact (one float product per element)
 *   head_rmsnorm                 1e-5 relative to the head's max |out| (F32)
 *   gelu_mul                     1e-3 relative (F16 out)
 *   softcap                      4e-6 of the cap absolute (float tanh)
 *   softmax                      1e-6 absolute + 1e-5 relative
 *   topk                         exact indices and values
 *   qsplit_to_f16                exact
 *   gemv_q                       5e-4 of sum |w x| against double sums of the
 *                                dequantised weights (F32 accumulation); 1e-2
 *                                against the engine's Q8_0/Q4_0 matvec, which
 *                                rounds x to Q8_0 first
 *   graph replay                 as rope (the inputs change between launches)
 *   pinned host memory           exact copies through a registered buffer; a second
 *                                registration refused, the context still healthy
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_common.h"
#include "engine/gpu.h"
#include "kernels/kernels.h"
#include "sampan/log.h"

static const sp_cuda_api_t *A;
static sp_cuda_ctx_t *C;
static int n_pass, n_fail;

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float
rndf(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) % 2000001) / 1000000.0f - 1.0f;
}

static void
report(const char *name, bool ok, double err, double tol)
{
    printf("%-34s %s  (max err %.3g, tolerance %.3g)\n", name, ok ? "PASS" : "FAIL", err, tol);
    ok ? n_pass++ : n_fail++;
}

/* Device buffer with bytes from host (or uninitialised when src is NULL). */
static void *
dev(const void *src, size_t bytes)
{
    void *d = NULL;
    if (A->alloc(C, bytes, &d) != SP_OK) {
        printf("alloc %zu: %s\n", bytes, A->last_error(C));
        exit(2);
    }
    if (src != NULL && A->h2d(C, d, src, bytes) != SP_OK) {
        printf("h2d: %s\n", A->last_error(C));
        exit(2);
    }
    return d;
}

static void
get(void *dst, const void *d, size_t bytes)
{
    if (A->d2h(C, dst, d, bytes) != SP_OK) {
        printf("d2h: %s\n", A->last_error(C));
        exit(2);
    }
}

static void
ok_or_die(int st, const char *what)
{
    if (st != SP_OK) {
        printf("%s: status %d: %s\n", what, st, A->last_error(C));
        exit(2);
    }
}

static float
h2f(uint16_t h)
{
    return sp_fp16_to_fp32(h);
}

/* ---------------------------------------------------------------- ops */

static void
test_to_f16(void)
{
    const int64_t n = 4096;
    float src[4096], ref[4096];
    for (int64_t i = 0; i < n; i++) {
        src[i] = rndf() * 40.0f;
    }
    const sp_type_t types[] = {SP_TYPE_F32, SP_TYPE_F16, SP_TYPE_BF16, SP_TYPE_Q8_0, SP_TYPE_Q4_0};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const sp_type_t t = types[k];
        static unsigned char raw[4096 * 4];
        if (t == SP_TYPE_F32) {
            memcpy(raw, src, sizeof src);
        } else {
            sp_quantize_row(t, src, raw, n);
        }
        if (t == SP_TYPE_F32) {
            memcpy(ref, src, sizeof src);
        } else {
            sp_dequantize_row(t, raw, ref, n);
        }
        void *d_src = dev(raw, sp_row_size(t, n)), *d_dst = dev(NULL, (size_t)n * 2);
        ok_or_die(A->to_f16(C, (int)t, d_src, d_dst, n), "to_f16");
        uint16_t out[4096];
        get(out, d_dst, sizeof out);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            bad += out[i] != sp_fp32_to_fp16(ref[i]);
        }
        char name[64];
        snprintf(name, sizeof name, "to_f16 %s", sp_type_name(t));
        report(name, bad == 0, bad, 0);
        A->free(C, d_src);
        A->free(C, d_dst);
    }
}

static void
test_embed(void)
{
    const int64_t V = 300, E = 96, R = 7;
    uint16_t *table = malloc((size_t)(V * E) * 2);
    for (int64_t i = 0; i < V * E; i++) {
        table[i] = sp_fp32_to_fp16(rndf());
    }
    const int32_t tok[7] = {0, 299, 5, 5, 100, 17, 250};
    void *d_t = dev(table, (size_t)(V * E) * 2), *d_tok = dev(tok, sizeof tok);
    float *d_x = dev(NULL, (size_t)(R * E) * 4), x[7 * 96];
    ok_or_die(A->embed(C, d_t, E, d_tok, R, d_x), "embed");
    get(x, d_x, sizeof x);
    int bad = 0;
    for (int64_t t = 0; t < R; t++) {
        for (int64_t i = 0; i < E; i++) {
            bad += x[t * E + i] != h2f(table[tok[t] * E + i]);
        }
    }
    report("embed", bad == 0, bad, 0);
    A->free(C, d_t);
    A->free(C, d_tok);
    A->free(C, d_x);
    free(table);
}

static void
test_rmsnorm(void)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const int64_t R = 5, n = 2048 + 64;
    float *x = malloc((size_t)(R * n) * 4), *add = malloc((size_t)(R * n) * 4);
    float *w = malloc((size_t)n * 4), *want = malloc((size_t)(R * n) * 4);
    float *got = malloc((size_t)(R * n) * 4);
    uint16_t *got16 = malloc((size_t)(R * n) * 2);
    for (int64_t i = 0; i < R * n; i++) {
        x[i] = rndf() * 3;
        add[i] = rndf();
    }
    for (int64_t i = 0; i < n; i++) {
        w[i] = 0.8f + 0.4f * (rndf() + 1) / 2;
    }
    float *d_x = dev(x, (size_t)(R * n) * 4), *d_add = dev(add, (size_t)(R * n) * 4);
    float *d_w = dev(w, (size_t)n * 4), *d_o = dev(NULL, (size_t)(R * n) * 4);
    /* x += add; out = norm(x) * w, F32 */
    ok_or_die(A->add_rmsnorm(C, d_x, d_add, d_w, NULL, R, n, 1e-5f, d_o, 0), "add_rmsnorm");
    get(got, d_o, (size_t)(R * n) * 4);
    double err = 0;
    for (int64_t t = 0; t < R; t++) {
        float *xr = x + t * n;
        for (int64_t i = 0; i < n; i++) {
            xr[i] += add[t * n + i];
        }
        ref->rmsnorm(want + t * n, xr, w, n, 1e-5f);
        double mx = 0, e = 0;
        for (int64_t i = 0; i < n; i++) {
            mx = fmax(mx, fabs(want[t * n + i]));
            e = fmax(e, fabs(want[t * n + i] - got[t * n + i]));
        }
        err = fmax(err, e / mx);
    }
    report("add_rmsnorm f32", err <= 1e-5, err, 1e-5);
    /* Gathered rows, F16 out: rows 4, 0, 2 of the updated x. */
    const int32_t rows[3] = {4, 0, 2};
    int32_t *d_rows = dev(rows, sizeof rows);
    ok_or_die(A->add_rmsnorm(C, d_x, NULL, d_w, d_rows, 3, n, 1e-5f, d_o, 1), "rmsnorm rows");
    get(got16, d_o, (size_t)(3 * n) * 2);
    err = 0;
    for (int k = 0; k < 3; k++) {
        const float *wr = want + rows[k] * n;
        double mx = 0, e = 0;
        for (int64_t i = 0; i < n; i++) {
            mx = fmax(mx, fabs(wr[i]));
            e = fmax(e, fabs(wr[i] - h2f(got16[k * n + i])));
        }
        err = fmax(err, e / mx);
    }
    report("rmsnorm rows f16", err <= 1e-3, err, 1e-3);
    A->free(C, d_x);
    A->free(C, d_add);
    A->free(C, d_w);
    A->free(C, d_o);
    A->free(C, d_rows);
    free(x);
    free(add);
    free(w);
    free(want);
    free(got);
    free(got16);
}

static void
test_gemm(void)
{
    const int64_t shapes[][3] = {{1, 256, 512}, {8, 1000, 384}, {64, 512, 1024}, {37, 96, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t R = shapes[s][0], O = shapes[s][1], I = shapes[s][2];
        uint16_t *w = malloc((size_t)(O * I) * 2), *x = malloc((size_t)(R * I) * 2);
        float *bias = malloc((size_t)O * 4), *y = malloc((size_t)(R * O) * 4);
        for (int64_t i = 0; i < O * I; i++) w[i] = sp_fp32_to_fp16(rndf());
        for (int64_t i = 0; i < R * I; i++) x[i] = sp_fp32_to_fp16(rndf());
        for (int64_t i = 0; i < O; i++) bias[i] = rndf();
        void *d_w = dev(w, (size_t)(O * I) * 2), *d_x = dev(x, (size_t)(R * I) * 2);
        float *d_b = dev(bias, (size_t)O * 4), *d_y = dev(NULL, (size_t)(R * O) * 4);
        ok_or_die(A->gemm(C, d_w, O, I, d_x, R, d_y, s % 2 ? d_b : NULL), "gemm");
        get(y, d_y, (size_t)(R * O) * 4);
        double err = 0;
        for (int64_t t = 0; t < R; t++) {
            for (int64_t r = 0; r < O; r++) {
                double acc = s % 2 ? bias[r] : 0, mag = 1e-30;
                for (int64_t k = 0; k < I; k++) {
                    const double p = (double)h2f(w[r * I + k]) * h2f(x[t * I + k]);
                    acc += p;
                    mag += fabs(p);
                }
                err = fmax(err, fabs(acc - y[t * O + r]) / mag);
            }
        }
        char name[64];
        snprintf(name, sizeof name, "gemm %lldx%lldx%lld%s", (long long)R, (long long)O,
                 (long long)I, s % 2 ? " +bias" : "");
        report(name, err <= 1e-3, err, 1e-3);
        A->free(C, d_w);
        A->free(C, d_x);
        A->free(C, d_b);
        A->free(C, d_y);
        free(w);
        free(x);
        free(bias);
        free(y);
    }
}

static void
test_rope(void)
{
    const int64_t R = 6, H = 4, hd = 64, n_rot = 48;
    const int32_t pos[6] = {0, 1, 17, 500, 4095, 100000};
    float inv[24], v[6 * 4 * 64], want[6 * 4 * 64], cs[6 * 48], got_cs[6 * 48];
    for (int i = 0; i < n_rot / 2; i++) {
        inv[i] = (float)pow(10000.0, -2.0 * i / n_rot);
    }
    for (int64_t i = 0; i < R * H * hd; i++) {
        v[i] = want[i] = rndf();
    }
    for (int neox = 0; neox <= 1; neox++) {
        /* LongRoPE's and YaRN's attention factor scales the table (batch.c): on with NeoX */
        const double mscale = neox ? 1.2 : 1.0;
        memcpy(want, v, sizeof v);
        for (int64_t t = 0; t < R; t++) {
            for (int64_t i = 0; i < n_rot / 2; i++) {
                const double th = (double)pos[t] * (double)inv[i];
                cs[t * n_rot + 2 * i] = (float)(cos(th) * mscale);
                cs[t * n_rot + 2 * i + 1] = (float)(sin(th) * mscale);
            }
            for (int64_t h = 0; h < H; h++) {
                float *x = want + (t * H + h) * hd;
                for (int64_t i = 0; i < n_rot / 2; i++) {
                    const int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                    const float c = cs[t * n_rot + 2 * i], s = cs[t * n_rot + 2 * i + 1];
                    const float x0 = x[a], x1 = x[b];
                    x[a] = x0 * c - x1 * s;
                    x[b] = x0 * s + x1 * c;
                }
            }
        }
        int32_t *d_pos = dev(pos, sizeof pos);
        float *d_inv = dev(inv, sizeof inv), *d_cs = dev(NULL, sizeof cs), *d_v = dev(v, sizeof v);
        ok_or_die(A->rope_cs(C, d_pos, R, d_inv, n_rot, mscale, d_cs), "rope_cs");
        ok_or_die(A->rope(C, d_v, R, H, hd, n_rot, d_cs, neox), "rope");
        float got[6 * 4 * 64];
        get(got_cs, d_cs, sizeof got_cs);
        get(got, d_v, sizeof got);
        double e1 = 0, e2 = 0;
        for (int64_t i = 0; i < R * n_rot; i++) {
            e1 = fmax(e1, fabs(cs[i] - got_cs[i]));
        }
        for (int64_t i = 0; i < R * H * hd; i++) {
            e2 = fmax(e2, fabs(want[i] - got[i]));
        }
        report(neox ? "rope_cs + rope neox, attention factor 1.2" : "rope_cs + rope normal",
               e1 <= 2e-6 && e2 <= 1e-5,
               fmax(e1, e2), 1e-5);
        A->free(C, d_pos);
        A->free(C, d_inv);
        A->free(C, d_cs);
        A->free(C, d_v);
    }
}

/* Paged attention: fill a device pool through kv_write (random block table,
 * several layers), download it, and run the CPU reference attention over the
 * downloaded pool through the same block tables. */
/* window > 0: a sliding window (gemma, phi3); softcap > 0: soft-capped scores (gemma2);
 * sinks: a per-head sink logit (gpt-oss), drawn in [-2, 6] so that some heads' sinks
 * outweigh every score and others hardly count. */
static void
test_attn(int f16, int64_t hd, int64_t n_head, int64_t n_head_kv, int64_t window, float softcap,
          bool sinks)
{
    const int64_t n_layer = 2, il = 1, n_blocks = 48, max_pos = 400;
    const int64_t tile = SP_CU_KV_BLOCK * hd, block_elems = n_layer * n_head_kv * 2 * tile;
    const size_t elt = f16 ? 2 : 4;
    void *d_pool = dev(NULL, (size_t)(n_blocks * block_elems) * elt);
    sp_cuda_kv_t kv = {d_pool, f16, n_blocks, n_layer, n_head_kv, hd, tile, block_elems};
    /* One sequence of max_pos positions over a shuffled block table. */
    int32_t table[48];
    for (int i = 0; i < 48; i++) {
        table[i] = (int32_t)((i * 29 + 7) % 48);
    }
    const int64_t kvd = n_head_kv * hd, qd = n_head * hd;
    float *k = malloc((size_t)(max_pos * kvd) * 4), *v = malloc((size_t)(max_pos * kvd) * 4);
    for (int64_t i = 0; i < max_pos * kvd; i++) {
        k[i] = rndf() * 2;
        v[i] = rndf();
    }
    int32_t *pos = malloc((size_t)max_pos * 4), *bt = calloc((size_t)max_pos, 4);
    for (int64_t p = 0; p < max_pos; p++) {
        pos[p] = (int32_t)p;
    }
    int32_t *d_pos = dev(pos, (size_t)max_pos * 4), *d_bt = dev(bt, (size_t)max_pos * 4);
    int32_t *d_tab = dev(table, sizeof table);
    float *d_k = dev(k, (size_t)(max_pos * kvd) * 4), *d_v = dev(v, (size_t)(max_pos * kvd) * 4);
    sp_cuda_rows_t all = {max_pos, d_pos, d_bt, d_tab};
    ok_or_die(A->kv_write(C, &kv, il, d_k, d_v, &all), "kv_write");
    /* Query rows: decode-like single positions and a prefill-like run. */
    const int32_t qpos[] = {0, 1, 15, 16, 17, 63, 64, 100, 255, 256, 399, 200, 201, 202};
    const int64_t R = (int64_t)(sizeof qpos / sizeof qpos[0]);
    float *q = malloc((size_t)(R * qd) * 4);
    for (int64_t i = 0; i < R * qd; i++) {
        q[i] = rndf();
    }
    int32_t *zero = calloc((size_t)R, 4);
    int32_t *d_qpos = dev(qpos, sizeof qpos), *d_qbt = dev(zero, (size_t)R * 4);
    float *d_q = dev(q, (size_t)(R * qd) * 4);
    void *d_o = dev(NULL, (size_t)(R * qd) * 2);
    sp_cuda_rows_t rows = {R, d_qpos, d_qbt, d_tab};
    const float scale = 1.0f / sqrtf((float)hd);
    float *sink = malloc((size_t)n_head * 4);
    for (int64_t h = 0; h < n_head; h++) {
        sink[h] = 2.0f + 4.0f * rndf();
    }
    float *d_sink = sinks ? dev(sink, (size_t)n_head * 4) : NULL;
    ok_or_die(A->attn(C, &kv, il, d_q, n_head, scale, window, softcap, d_sink, &rows, d_o),
              "attn");
    uint16_t *o = malloc((size_t)(R * qd) * 2);
    get(o, d_o, (size_t)(R * qd) * 2);
    char *pool = malloc((size_t)(n_blocks * block_elems) * elt);
    get(pool, d_pool, (size_t)(n_blocks * block_elems) * elt);

    /* kv_write: every written element where the layout says. */
    int bad = 0;
    for (int64_t p = 0; p < max_pos; p++) {
        for (int64_t g = 0; g < n_head_kv; g++) {
            const int64_t t0 = sp_cu_kv_tile(table[p / 16], il, g, n_head_kv, tile, block_elems);
            for (int64_t d = 0; d < hd; d++) {
                const int64_t ko = t0 + sp_cu_key_in_tile(p % 16, d);
                const int64_t vo = t0 + sp_cu_val_in_tile(p % 16, d, hd, tile);
                const float kw = k[p * kvd + g * hd + d], vw = v[p * kvd + g * hd + d];
                const float kg = f16 ? h2f(((uint16_t *)pool)[ko]) : ((float *)pool)[ko];
                const float vg = f16 ? h2f(((uint16_t *)pool)[vo]) : ((float *)pool)[vo];
                bad += f16 ? (kg != h2f(sp_fp32_to_fp16(kw)) || vg != h2f(sp_fp32_to_fp16(vw)))
                           : (kg != kw || vg != vw);
            }
        }
    }
    char name[96];
    snprintf(name, sizeof name, "kv_write %s hd%lld", f16 ? "f16" : "f32", (long long)hd);
    report(name, bad == 0, bad, 0);

    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    float *scratch = malloc((size_t)sp_attn_scratch_stride(max_pos) * 4 * 64);
    float want[256];
    double err = 0;
    const int64_t group = n_head / n_head_kv;
    for (int64_t t = 0; t < R; t++) {
        for (int64_t h = 0; h < n_head; h++) {
            const int64_t g = h / group;
            const int64_t t0 = sp_cu_kv_tile(0, il, g, n_head_kv, tile, block_elems);
            sp_attn_args_t a = {
                .head_dim = hd, .n_q = 1, .n_kv = qpos[t] + 1, .q = q + t * qd + h * hd,
                .q_stride = hd, .k = pool + (size_t)t0 * elt,
                .v = pool + (size_t)(t0 + tile) * elt, .blocks = table,
                .k_block_stride = block_elems, .v_block_stride = block_elems, .v_stride = hd,
                .scale = scale, .o = want, .o_stride = hd, .scratch = scratch,
                .window = window, .softcap = softcap, .sinks = sinks ? sink + h : NULL,
            };
            ref->attn[f16 ? SP_TYPE_F16 : SP_TYPE_F32](&a);
            for (int64_t d = 0; d < hd; d++) {
                err = fmax(err, fabs(want[d] - h2f(o[(t * n_head + h) * hd + d])));
            }
        }
    }
    snprintf(name, sizeof name, "attn %s hd%lld heads %lld/%lld%s%s%s", f16 ? "f16" : "f32",
             (long long)hd, (long long)n_head, (long long)n_head_kv, window > 0 ? " window" : "",
             softcap > 0.0f ? " softcap" : "", sinks ? " sinks" : "");
    report(name, err <= 2e-3, err, 2e-3); /* |v| <= 1 */
    void *bufs[] = {d_pool, d_pos, d_bt, d_tab, d_k, d_v, d_qpos, d_qbt, d_q, d_o, d_sink};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        A->free(C, bufs[i]);
    }
    free(sink);
    free(k);
    free(v);
    free(pos);
    free(bt);
    free(q);
    free(zero);
    free(o);
    free(pool);
    free(scratch);
}

static void
test_swiglu_softmax_topk(void)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const int64_t n = 5632 * 3;
    float *g = malloc((size_t)n * 4), *u = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        g[i] = rndf() * 6;
        u[i] = rndf() * 2;
    }
    float *d_g = dev(g, (size_t)n * 4), *d_u = dev(u, (size_t)n * 4);
    void *d_o = dev(NULL, (size_t)n * 2);
    ok_or_die(A->swiglu(C, d_g, d_u, n, d_o), "swiglu");
    uint16_t *o = malloc((size_t)n * 2);
    get(o, d_o, (size_t)n * 2);
    ref->swiglu(g, u, n);
    double err = 0;
    for (int64_t i = 0; i < n; i++) {
        err = fmax(err, fabs(g[i] - h2f(o[i])) / fmax(fabs(g[i]), 1e-2));
    }
    report("swiglu", err <= 1e-3, err, 1e-3);
    A->free(C, d_g);
    A->free(C, d_u);
    A->free(C, d_o);
    free(g);
    free(u);
    free(o);

    /* softmax and top-k over vocabulary-sized rows */
    const int64_t R = 3, V = 32000 + 17;
    float *x = malloc((size_t)(R * V) * 4), *y = malloc((size_t)(R * V) * 4);
    for (int64_t i = 0; i < R * V; i++) {
        x[i] = rndf() * 10 + (float)(i % 97) * 1e-3f; /* distinct values */
    }
    x[V + 5] = x[V + 9] = 50.0f; /* a tie in row 1: the lower index first */
    float *d_x = dev(x, (size_t)(R * V) * 4);
    const int K = 40;
    int32_t *d_idx = dev(NULL, (size_t)(R * K) * 4), idx[3 * 40];
    float *d_val = dev(NULL, (size_t)(R * K) * 4), val[3 * 40];
    ok_or_die(A->topk(C, d_x, R, V, K, d_idx, d_val), "topk");
    get(idx, d_idx, sizeof idx);
    get(val, d_val, sizeof val);
    int bad = 0;
    for (int64_t t = 0; t < R; t++) {
        const float *row = x + t * V;
        float pv = INFINITY;
        int64_t pi = -1;
        for (int j = 0; j < K; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < V; e++) {
                const bool after = row[e] < pv || (row[e] == pv && e > pi);
                if (after && (best < 0 || row[e] > row[best])) {
                    best = e;
                }
            }
            bad += idx[t * K + j] != best || val[t * K + j] != row[best];
            pv = row[best];
            pi = best;
        }
    }
    bad += idx[K] != V + 5 - V || idx[K + 1] != 9; /* row 1: 5 before 9 */
    report("topk k=40 (argmax at k=1)", bad == 0, bad, 0);

    ok_or_die(A->softmax(C, d_x, R, V), "softmax");
    get(y, d_x, (size_t)(R * V) * 4);
    err = 0;
    for (int64_t t = 0; t < R; t++) {
        const float *row = x + t * V;
        double mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < V; e++) mx = fmax(mx, row[e]);
        for (int64_t e = 0; e < V; e++) sum += exp((double)row[e] - mx);
        for (int64_t e = 0; e < V; e++) {
            const double w = exp((double)row[e] - mx) / sum;
            err = fmax(err, fabs(w - y[t * V + e]) / (1e-6 + 1e-5 * w) * 1e-6);
        }
    }
    report("softmax", err <= 1e-6, err, 1e-6);
    A->free(C, d_x);
    A->free(C, d_idx);
    A->free(C, d_val);
    free(x);
    free(y);
}

/* Per-head q/k norms (qwen3, gemma3), GELU (gemma) and the final soft-cap. */
static void
test_arch_ops(void)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    /* head_rmsnorm: 7 rows of 16 heads of 128, and one row of 3 heads of 256 */
    const int64_t shapes[][3] = {{7, 16, 128}, {1, 3, 256}, {5, 2, 64}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t R = shapes[k][0], H = shapes[k][1], hd = shapes[k][2], n = R * H * hd;
        float *x = malloc((size_t)n * 4), *w = malloc((size_t)hd * 4);
        float *got = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            x[i] = rndf() * 4 * (float)(1 + i / hd % 3); /* heads of different scales */
        }
        for (int64_t i = 0; i < hd; i++) {
            w[i] = 0.5f + (rndf() + 1) / 2;
        }
        float *d_x = dev(x, (size_t)n * 4), *d_w = dev(w, (size_t)hd * 4);
        ok_or_die(A->head_rmsnorm(C, d_x, R, H, hd, d_w, 1e-6f), "head_rmsnorm");
        get(got, d_x, (size_t)n * 4);
        double err = 0;
        for (int64_t h = 0; h < R * H; h++) {
            ref->rmsnorm(want + h * hd, x + h * hd, w, hd, 1e-6f);
            double mx = 0, e = 0;
            for (int64_t i = 0; i < hd; i++) {
                mx = fmax(mx, fabs(want[h * hd + i]));
                e = fmax(e, fabs(want[h * hd + i] - got[h * hd + i]));
            }
            err = fmax(err, e / mx);
        }
        char name[64];
        snprintf(name, sizeof name, "head_rmsnorm %lldx%lld of %lld", (long long)R, (long long)H,
                 (long long)hd);
        report(name, err <= 1e-5, err, 1e-5);
        A->free(C, d_x);
        A->free(C, d_w);
        free(x);
        free(w);
        free(got);
        free(want);
    }

    /* gelu_mul against double tanh, F16 out */
    const int64_t n = 9216 * 2 + 5;
    float *g = malloc((size_t)n * 4), *u = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        g[i] = rndf() * 6;
        u[i] = rndf() * 2;
    }
    float *d_g = dev(g, (size_t)n * 4), *d_u = dev(u, (size_t)n * 4);
    void *d_o = dev(NULL, (size_t)n * 2);
    ok_or_die(A->gelu_mul(C, d_g, d_u, n, d_o), "gelu_mul");
    uint16_t *o = malloc((size_t)n * 2);
    get(o, d_o, (size_t)n * 2);
    double err = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i];
        const double want =
            0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[i];
        err = fmax(err, fabs(want - h2f(o[i])) / fmax(fabs(want), 1e-2));
    }
    report("gelu_mul", err <= 1e-3, err, 1e-3);

    /* softcap in place over logits-sized rows */
    const float cap = 30.0f;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        x[i] = rndf() * 100;
    }
    float *d_x = dev(x, (size_t)n * 4);
    ok_or_die(A->softcap(C, d_x, n, cap), "softcap");
    get(y, d_x, (size_t)n * 4);
    err = 0;
    for (int64_t i = 0; i < n; i++) {
        err = fmax(err, fabs(cap * tanh((double)x[i] / cap) - y[i]));
    }
    report("softcap", err <= 4e-6 * cap, err, 4e-6 * cap); /* float tanh: a few ulp of cap */

    /* scale in place (granite's residual and logit scales): one float product, exact */
    A->h2d(C, d_x, x, (size_t)n * 4);
    ok_or_die(A->scale(C, d_x, n, 0.22f), "scale");
    get(y, d_x, (size_t)n * 4);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        bad += y[i] != x[i] * 0.22f;
    }
    report("scale", bad == 0, bad, 0);
    A->free(C, d_g);
    A->free(C, d_u);
    A->free(C, d_o);
    A->free(C, d_x);
    free(g);
    free(u);
    free(o);
    free(x);
    free(y);
}

/* ------------------------------------------------- quantised weights */

/* The split layout of cuda_api.h, packed here independently of gpu.c: the
 * quants of every row, then the F16 scales at sp_cu_qsplit_scales_off. */
static unsigned char *
pack_split(sp_type_t t, const unsigned char *blocks, int64_t n_out, int64_t n_in, size_t *bytes)
{
    const int64_t n = n_out * n_in, nb = n / 32;
    *bytes = (size_t)sp_cu_qsplit_bytes((int)t, n);
    unsigned char *buf = calloc(1, *bytes);
    uint16_t *sc = (uint16_t *)(buf + sp_cu_qsplit_scales_off((int)t, n));
    const size_t bsz = t == SP_TYPE_Q4_0 ? sizeof(sp_block_q4_0) : sizeof(sp_block_q8_0);
    const size_t qb = t == SP_TYPE_Q4_0 ? 16 : 32;
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *blk = blocks + (size_t)b * bsz;
        memcpy(&sc[b], blk, 2);
        memcpy(buf + (size_t)b * qb, blk + 2, qb);
    }
    return buf;
}

static void
test_qsplit_gemv(void)
{
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const int64_t shapes[][3] = {{1, 256, 512}, {3, 1000, 2080}, {8, 96, 64}, {5, 37, 5632}};
    const sp_type_t types[] = {SP_TYPE_Q8_0, SP_TYPE_Q4_0};
    for (size_t ti = 0; ti < 2; ti++) {
        const sp_type_t t = types[ti];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t R = shapes[si][0], O = shapes[si][1], I = shapes[si][2];
            const size_t row_bytes = sp_row_size(t, I);
            float *wf = malloc((size_t)I * 4), *wd = malloc((size_t)(O * I) * 4);
            unsigned char *blocks = malloc(row_bytes * (size_t)O);
            for (int64_t o = 0; o < O; o++) {
                for (int64_t k = 0; k < I; k++) {
                    wf[k] = rndf() * (1.0f + (float)(o % 7));
                }
                sp_quantize_row(t, wf, blocks + (size_t)o * row_bytes, I);
                sp_dequantize_row(t, blocks + (size_t)o * row_bytes, wd + o * I, I);
            }
            size_t sbytes;
            unsigned char *split = pack_split(t, blocks, O, I, &sbytes);
            uint16_t *x = malloc((size_t)(R * I) * 2);
            float *bias = malloc((size_t)O * 4), *y = malloc((size_t)(R * O) * 4);
            for (int64_t i = 0; i < R * I; i++) x[i] = sp_fp32_to_fp16(rndf());
            for (int64_t i = 0; i < O; i++) bias[i] = rndf();
            const bool with_bias = si % 2 == 1;
            void *d_w = dev(split, sbytes), *d_x = dev(x, (size_t)(R * I) * 2);
            float *d_b = dev(bias, (size_t)O * 4), *d_y = dev(NULL, (size_t)(R * O) * 4);
            char name[64];
            if (si == 0) {
                /* qsplit_to_f16: exact against the reference dequantisation. */
                uint16_t *h = malloc((size_t)(O * I) * 2);
                void *d_h = dev(NULL, (size_t)(O * I) * 2);
                ok_or_die(A->qsplit_to_f16(C, (int)t, d_w, d_h, O * I), "qsplit_to_f16");
                get(h, d_h, (size_t)(O * I) * 2);
                int bad = 0;
                for (int64_t i = 0; i < O * I; i++) {
                    bad += h[i] != sp_fp32_to_fp16(wd[i]);
                }
                snprintf(name, sizeof name, "qsplit_to_f16 %s", sp_type_name(t));
                report(name, bad == 0, bad, 0);
                A->free(C, d_h);
                free(h);
            }
            ok_or_die(A->gemv_q(C, (int)t, d_w, O, I, d_x, R, d_y, with_bias ? d_b : NULL),
                      "gemv_q");
            get(y, d_y, (size_t)(R * O) * 4);
            /* Against double sums of the dequantised weights (the kernel's
             * own inputs: only F32 accumulation error), and against the
             * engine's matvec (vec_dot on x converted to its activation
             * type, Q8_0: that rounding is ~1/254 of a block's max |x|). */
            const sp_type_t xt = ref->vec_dot_type[t];
            unsigned char *xq = malloc(sp_row_size(xt, I));
            float *xf = malloc((size_t)I * 4);
            double e1 = 0, e2 = 0;
            for (int64_t r = 0; r < R; r++) {
                for (int64_t k = 0; k < I; k++) {
                    xf[k] = h2f(x[r * I + k]);
                }
                ref->from_float[xt](xf, xq, I);
                for (int64_t o = 0; o < O; o++) {
                    double acc = with_bias ? bias[o] : 0, mag = 1e-30;
                    for (int64_t k = 0; k < I; k++) {
                        const double p = (double)wd[o * I + k] * xf[k];
                        acc += p;
                        mag += fabs(p);
                    }
                    float s = 0;
                    ref->vec_dot[t](I, &s, blocks + (size_t)o * row_bytes, xq);
                    s += with_bias ? bias[o] : 0;
                    const double got = y[r * O + o];
                    e1 = fmax(e1, fabs(acc - got) / mag);
                    e2 = fmax(e2, fabs((double)s - got) / mag);
                }
            }
            snprintf(name, sizeof name, "gemv_q %s %lldx%lldx%lld%s", sp_type_name(t),
                     (long long)R, (long long)O, (long long)I, with_bias ? " +bias" : "");
            report(name, e1 <= 5e-4, e1, 5e-4);
            snprintf(name, sizeof name, "  ... vs the engine's %s matvec", sp_type_name(t));
            report(name, e2 <= 1e-2, e2, 1e-2);
            A->free(C, d_w);
            A->free(C, d_x);
            A->free(C, d_b);
            A->free(C, d_y);
            free(wf);
            free(wd);
            free(blocks);
            free(split);
            free(x);
            free(bias);
            free(y);
            free(xq);
            free(xf);
        }
    }
}

/* ---------------------------------------------------------------- graphs */

/* A captured rope_cs + rope replayed three times with new positions and
 * values uploaded in between: each replay must read the device buffers as
 * they are at launch. And a synchronous copy inside a capture is refused
 * without harming the context. */
static void
test_graph(void)
{
    const int64_t R = 4, H = 2, hd = 32, n_rot = 32;
    float inv[16];
    for (int i = 0; i < n_rot / 2; i++) {
        inv[i] = (float)pow(10000.0, -2.0 * i / n_rot);
    }
    int32_t *d_pos = dev(NULL, (size_t)R * 4);
    float *d_inv = dev(inv, sizeof inv), *d_cs = dev(NULL, (size_t)(R * n_rot) * 4);
    float *d_v = dev(NULL, (size_t)(R * H * hd) * 4);
    sp_cuda_graph_t *gr = NULL;
    ok_or_die(A->graph_begin(C), "graph_begin");
    int st = A->rope_cs(C, d_pos, R, d_inv, n_rot, 1.0, d_cs);
    if (st == SP_OK) {
        st = A->rope(C, d_v, R, H, hd, n_rot, d_cs, 0);
    }
    const int st_end = A->graph_end(C, &gr);
    ok_or_die(st != SP_OK ? st : st_end, "capture");
    double err = 0;
    for (int trial = 0; trial < 3; trial++) {
        int32_t pos[4];
        float v[4 * 2 * 32], want[4 * 2 * 32], got[4 * 2 * 32];
        for (int64_t t = 0; t < R; t++) {
            pos[t] = (int32_t)(trial * 1000 + t * 37);
        }
        for (int64_t i = 0; i < R * H * hd; i++) {
            v[i] = want[i] = rndf();
        }
        for (int64_t t = 0; t < R; t++) {
            for (int64_t h = 0; h < H; h++) {
                float *xv = want + (t * H + h) * hd;
                for (int64_t i = 0; i < n_rot / 2; i++) {
                    const double th = (double)pos[t] * (double)inv[i];
                    const float c = (float)cos(th), s = (float)sin(th);
                    const float x0 = xv[2 * i], x1 = xv[2 * i + 1];
                    xv[2 * i] = x0 * c - x1 * s;
                    xv[2 * i + 1] = x0 * s + x1 * c;
                }
            }
        }
        ok_or_die(A->h2d(C, d_pos, pos, sizeof pos), "h2d pos");
        ok_or_die(A->h2d(C, d_v, v, sizeof v), "h2d v");
        ok_or_die(A->graph_launch(C, gr), "graph_launch");
        get(got, d_v, sizeof got);
        for (int64_t i = 0; i < R * H * hd; i++) {
            err = fmax(err, fabs(want[i] - got[i]));
        }
    }
    report("graph replay reads inputs at launch", err <= 1e-5, err, 1e-5);
    A->graph_destroy(C, gr);

    /* A synchronising copy cannot be captured: refused, capture refused,
     * the context still healthy and usable. */
    int32_t pos0[4] = {0, 1, 2, 3};
    ok_or_die(A->graph_begin(C), "graph_begin");
    const int st_copy = A->h2d(C, d_pos, pos0, sizeof pos0);
    gr = NULL;
    const int st_end2 = A->graph_end(C, &gr);
    const bool ok = st_copy != SP_OK && st_end2 != SP_OK && st_end2 != SP_ERR_DEVICE &&
                    gr == NULL && A->healthy(C) && A->h2d(C, d_pos, pos0, sizeof pos0) == SP_OK;
    report("capture refuses a sync copy, stays healthy", ok, ok ? 0 : 1, 0);
    A->free(C, d_pos);
    A->free(C, d_inv);
    A->free(C, d_cs);
    A->free(C, d_v);
}

/* Pinned host memory: a registered page-aligned buffer counts, copies both
 * ways through it are exact, a second registration of it is refused without
 * harming the context, and unregistering returns the count to 0. */
static void
test_pinned(void)
{
    const size_t bytes = (size_t)1 << 20;
    float *h = aligned_alloc(4096, bytes);
    void *d = NULL;
    if (h == NULL || A->alloc(C, bytes, &d) != SP_OK) {
        report("host_register", false, 1, 0);
        free(h);
        return;
    }
    const size_t n = bytes / sizeof(float);
    for (size_t i = 0; i < n; i++) {
        h[i] = (float)i * 0.5f;
    }
    const int st = A->host_register(C, h, bytes);
    const bool counted = st == SP_OK && A->pinned_bytes(C) == bytes;
    bool exact = st == SP_OK && A->h2d(C, d, h, bytes) == SP_OK;
    memset(h, 0, bytes);
    exact = exact && A->d2h(C, h, d, bytes) == SP_OK;
    for (size_t i = 0; exact && i < n; i++) {
        exact = h[i] == (float)i * 0.5f;
    }
    const int again = A->host_register(C, h, bytes);
    const bool refused = again != SP_OK && again != SP_ERR_DEVICE && A->healthy(C);
    A->host_unregister(C, h);
    const bool back = A->pinned_bytes(C) == 0 && A->healthy(C);
    printf("  host_register: %s, counted %d, copies exact %d, second registration %s, after "
           "unregister %llu bytes\n", st == SP_OK ? "ok" : A->last_error(C), counted, exact,
           refused ? "refused" : "accepted?", (unsigned long long)A->pinned_bytes(C));
    report("pinned host memory: register, copy, refuse twice, unregister",
           counted && exact && refused && back, 0, 0);
    A->free(C, d);
    free(h);
}

int
main(int argc, char **argv)
{
    sp_log_set_level(SP_LOG_LEVEL_NONE);
    char why[512] = "";
    A = argc > 1 ? sp_loader_load(argv[1], why, sizeof why) : sp_loader_api();
    if (A == NULL) {
        printf("gpu kernels: skipped (%s)\n", argc > 1 ? why : sp_loader_note());
        printf("gpu_kernel_test: 0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    char name[128] = "?";
    int ma = 0, mi = 0;
    uint64_t total = 0, fr = 0;
    A->device_info(0, name, sizeof name, &ma, &mi, &total, &fr, why, sizeof why);
    printf("library %s, device 0: %s (sm_%d%d, %.1f GiB)\n", A->name, name, ma, mi,
           (double)total / (1 << 30));
    if (A->ctx_create(0, &C, why, sizeof why) != SP_OK) {
        printf("context: %s\ngpu_kernel_test: 0 passed, 1 failed, 0 skipped\n", why);
        return 1;
    }
    test_to_f16();
    test_embed();
    test_rmsnorm();
    test_gemm();
    test_rope();
    for (int f16 = 0; f16 <= 1; f16++) {
        test_attn(f16, 64, 32, 4, 0, 0.0f, false);  /* TinyLlama: GQA 8 */
        test_attn(f16, 128, 8, 8, 0, 0.0f, false);  /* MHA, wide heads */
        /* gemma2-like: windows that start inside a block, on a block edge,
         * and wider than most positions; scores soft-capped */
        test_attn(f16, 256, 8, 4, 37, 50.0f, false);
        test_attn(f16, 128, 8, 2, 64, 0.0f, false);
        test_attn(f16, 64, 4, 4, 300, 2.0f, false);
        /* gpt-oss-like: sinks, with and without a window */
        test_attn(f16, 64, 8, 2, 0, 0.0f, true);
        test_attn(f16, 64, 8, 2, 37, 0.0f, true);
    }
    test_attn(1, 8, 8, 4, 0, 0.0f, false);          /* stories260K */
    test_attn(0, 256, 4, 1, 0, 0.0f, false);        /* the widest head, MQA */
    test_swiglu_softmax_topk();
    test_arch_ops();
    test_qsplit_gemv();
    test_graph();
    test_pinned();
    const bool healthy = A->healthy(C);
    printf("context healthy after the run: %s, bytes still allocated: %llu\n",
           healthy ? "yes" : "no", (unsigned long long)A->bytes_in_use(C));
    A->ctx_destroy(C);
    printf("gpu_kernel_test: %d passed, %d failed, 0 skipped\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
