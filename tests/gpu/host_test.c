/*
 * host_test.c - the GPU path of sampan, checked on the CPU: the shared index
 * and conversion math of cuda_common.h against the engine's own (kernels.h),
 * the loader's refusals, and the whole forward pass of src/engine/gpu.c run
 * against libfake_cuda.so (the host emulation of the CUDA op table) and
 * compared with the CPU engine: full and partial offload, F32 and F16 KV
 * cache, several sequences in one step with copy-on-write, embeddings, an
 * injected CUDA error, and device out-of-memory. Then CUDA graphs (the
 * emulation records captured ops and replays them, so a per-step host value
 * baked into a graph shows as wrong tokens): decode with graphs on and off
 * against the CPU, sequences joining, forking and leaving (buckets with pad
 * rows), a second KV pool, a failed capture, a fault inside a replay; and
 * Q8_0/Q4_0 weights kept quantised (SAMPAN_CUDA_WEIGHTS native and both).
 * Against the CPU, greedy runs are compared step by step with the GPU fed
 * the CPU's tokens (teacher forcing): logits within a tolerance derived from
 * the two engines' roundings (logit_tol), and a parted argmax accepted only
 * at a near tie, never a demand that the tokens stay equal.
 *
 *     build/test_cuda_host [build/libfake_cuda.so]
 *     build/test_cuda_host build/libsampan_cuda.so --arch-only   (on a GPU: the
 *         forward passes of every architecture against the CPU engine)
 *
 * Ends with "test_cuda_host: N passed, N failed, N skipped". What it cannot
 * check: the CUDA kernels themselves (tests/gpu/kernel_test.c does, on a GPU).
 */
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "cuda/cuda_common.h"
#include "engine/gpu.h"
#include "engine/batch.h"
#include "engine/gen.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "sampan/log.h"
#include "tools/tools.h"

#include "testmodel.h"

static int n_pass, n_fail, n_skip;
static const char *cur;
static int cur_failed;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            printf("  %s:%d: %s: ", __FILE__, __LINE__, #cond);                               \
            printf(__VA_ARGS__);                                                               \
            printf("\n");                                                                      \
            cur_failed = 1;                                                                    \
        }                                                                                      \
    } while (0)

static void
begin(const char *name)
{
    cur = name;
    cur_failed = 0;
}

static void
end(void)
{
    printf("%s: %s\n", cur, cur_failed ? "FAIL" : "ok");
    cur_failed ? n_fail++ : n_pass++;
}

static void
skip(const char *name, const char *why)
{
    printf("%s: skipped (%s)\n", name, why);
    n_skip++;
}

static const char *fake_path;
static const sp_cuda_api_t *fake;
static void *fake_handle; /* the same loaded library, for the fault-injection knobs */

static void (*fake_fail_at)(long);
static void (*fake_set_mem)(uint64_t);
static void (*fake_set_devices)(int);
static void (*fake_set_abi)(uint32_t);

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t
rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

static float
rndf(void)
{
    return (float)(rnd() % 2000001) / 1000000.0f - 1.0f;
}

/* ---------------------------------------------------------- shared math */

static void
test_common(void)
{
    begin("common_layouts");
    CHECK((int)SP_CU_F32 == (int)SP_TYPE_F32 && (int)SP_CU_F16 == (int)SP_TYPE_F16 &&
              (int)SP_CU_Q4_0 == (int)SP_TYPE_Q4_0 && (int)SP_CU_Q8_0 == (int)SP_TYPE_Q8_0 &&
              (int)SP_CU_BF16 == (int)SP_TYPE_BF16,
          "type numbers differ from kernels.h");
    CHECK(sizeof(sp_cu_block_q8_0) == sizeof(sp_block_q8_0), "q8_0 block size");
    CHECK(sizeof(sp_cu_block_q4_0) == sizeof(sp_block_q4_0), "q4_0 block size");
    CHECK(SP_CU_KV_BLOCK == SP_KV_BLOCK && SP_CU_KV_BLOCK == SP_ATTN_BLOCK, "block of 16");
    end();

    begin("common_fp16");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = sp_cu_f16_to_f32((uint16_t)h), b = sp_fp16_to_fp32((sp_fp16_t)h);
        if (memcmp(&a, &b, 4) != 0 && !(a != a && b != b)) {
            bad++;
        }
        const float c = sp_cu_bf16_to_f32((uint16_t)h), d = sp_bf16_to_fp32((sp_bf16_t)h);
        if (memcmp(&c, &d, 4) != 0 && !(c != c && d != d)) {
            bad++;
        }
    }
    CHECK(bad == 0, "%d half/bfloat values decode differently", bad);
    bad = 0;
    const float special[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 5.9604645e-8f,
                             2.9802322e-8f, 2.9802326e-8f, 6.1035156e-5f, INFINITY, -INFINITY};
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = i < 12 ? 0 : rnd();
        float f;
        if (i < 12) {
            f = special[i];
        } else {
            memcpy(&f, &u, 4);
        }
        if (f != f) {
            continue; /* NaN payloads may differ; both stay NaN (checked below) */
        }
        if (sp_cu_f32_to_f16(f) != sp_fp32_to_fp16(f)) {
            if (bad++ < 3) {
                printf("  f32->f16 %a: %04x vs %04x\n", (double)f, sp_cu_f32_to_f16(f),
                       sp_fp32_to_fp16(f));
            }
        }
    }
    const uint16_t hn = sp_cu_f32_to_f16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0, "NaN stays NaN");
    CHECK(bad == 0, "%d of 2M floats round differently", bad);
    end();

    begin("common_dequant");
    float src[256], a[256], b[256];
    for (int i = 0; i < 256; i++) {
        src[i] = rndf() * 3.0f;
    }
    sp_block_q8_0 q8[8];
    sp_block_q4_0 q4[8];
    sp_quantize_row(SP_TYPE_Q8_0, src, q8, 256);
    sp_quantize_row(SP_TYPE_Q4_0, src, q4, 256);
    sp_dequantize_row(SP_TYPE_Q8_0, q8, a, 256);
    bad = 0;
    for (int i = 0; i < 256; i++) {
        b[i] = sp_cu_q8_0_elem((const sp_cu_block_q8_0 *)q8 + i / 32, i % 32);
        bad += a[i] != b[i];
    }
    sp_dequantize_row(SP_TYPE_Q4_0, q4, a, 256);
    for (int i = 0; i < 256; i++) {
        b[i] = sp_cu_q4_0_elem((const sp_cu_block_q4_0 *)q4 + i / 32, i % 32);
        bad += a[i] != b[i];
    }
    CHECK(bad == 0, "%d elements dequantise differently", bad);
    end();

    begin("common_kv_index");
    /* Within one (layer, head) tile the layout is the attention kernels'
     * (kernels.h sp_attn_k_index for a contiguous cache of one block). */
    bad = 0;
    for (int64_t hd = 2; hd <= 256; hd *= 2) {
        for (int64_t p = 0; p < 16; p++) {
            for (int64_t d = 0; d < hd; d++) {
                bad += sp_cu_key_in_tile(p, d) != sp_attn_k_index(p, d, hd);
                bad += sp_cu_val_in_tile(p, d, hd, 16 * hd) != 16 * hd + p * hd + d;
            }
        }
    }
    /* Tiles: block-major, (layer, head) in order, key then value. */
    bad += sp_cu_kv_tile(3, 2, 1, 4, 128, 5 * 4 * 2 * 128) != 3 * 5 * 4 * 2 * 128 + (2 * 4 + 1) * 256;
    CHECK(bad == 0, "%d offsets differ", bad);
    end();
}

/* ---------------------------------------------------------- loader */

static void
test_loader(void)
{
    begin("loader_refusals");
    char why[512];
    CHECK(sp_loader_load("/nonexistent/libsampan_cuda.so", why, sizeof why) == NULL, "loaded");
    CHECK(strstr(why, "cannot load") != NULL, "why: %s", why);
    CHECK(sp_loader_load("libm.so.6", why, sizeof why) == NULL, "libm loaded as CUDA");
    CHECK(strstr(why, "sp_cuda_get_api") != NULL, "why: %s", why);
    fake_set_devices(0);
    CHECK(sp_loader_load(fake_path, why, sizeof why) == NULL, "no device, but loaded");
    CHECK(strstr(why, "no CUDA device") != NULL, "why: %s", why);
    fake_set_devices(1);
    fake_set_abi(SP_CUDA_ABI_VERSION + 1);
    CHECK(sp_loader_load(fake_path, why, sizeof why) == NULL, "other ABI, but loaded");
    CHECK(strstr(why, "ABI version") != NULL, "why: %s", why);
    fake_set_abi(SP_CUDA_ABI_VERSION);
    /* A library from before the graph and gemv_q members: refused, not half used. */
    void (*set_size)(uint32_t);
    *(void **)&set_size = dlsym(fake_handle, "fake_cuda_set_struct_size");
    CHECK(set_size != NULL, "no fake_cuda_set_struct_size");
    if (set_size != NULL) {
        set_size((uint32_t)offsetof(sp_cuda_api_t, graph_begin));
        CHECK(sp_loader_load(fake_path, why, sizeof why) == NULL, "short table, but loaded");
        CHECK(strstr(why, "rebuild it") != NULL, "why: %s", why);
        set_size(0);
    }
    CHECK(sp_loader_load(fake_path, why, sizeof why) == fake, "fake: %s", why);
    end();
}

/* ---------------------------------------------------------- forward */

#define MODEL "models/stories260K.gguf"

static const int32_t prompt[] = {1, 403, 407, 9, 50, 100, 200, 300, 17, 42, 77, 5, 6, 7, 8,
                                 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20};
#define N_PROMPT ((int64_t)(sizeof prompt / sizeof prompt[0]))

/* max |a - b| / max |a| over n. */
static double
rel_diff(const float *a, const float *b, int64_t n)
{
    double md = 0, ma = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        ma = fmax(ma, fabs((double)a[i]));
    }
    return md / ma;
}

static int32_t
argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            best = (int32_t)i;
        }
    }
    return best;
}

static double
max_abs(const float *x, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        m = fmax(m, fabs((double)x[i]));
    }
    return m;
}

/*
 * Tolerances of the GPU's logits against the CPU engine's, in rel_diff's
 * measure (max |a - b| / max |a|), derived as tests/py/test_reference.py
 * derives its own: one rounding of a product's operands adds relative rms
 * noise eps; a token's path crosses about 4L + 1 rounded products (q/k/v,
 * attention output, gate/up, down in each of L layers, and the output
 * matrix), whose independent noises add to eps sqrt(4L + 1); 3x that covers
 * the max over the vocabulary.
 *   F16: the GPU rounds weights and activations to half where the CPU keeps
 *   float (F32 model) or its own rounding (quantised weights): relative
 *   error <= 2^-11, uniform, rms 2^-11 / sqrt(3), two operands:
 *   eps = 2^-11 sqrt(2/3) (tolerance 5.5e-3 for stories260K's 5 layers).
 *   Q8_0 activations: the CPU multiplies Q8_0 / Q4_0 weights with
 *   activations rounded to Q8_0 (error <= d / 2 = amax / 254, uniform: rms
 *   amax / (127 sqrt(12))), the GPU with half ones; a block's amax is about
 *   2.5 times its rms: eps = 2.5 / (127 sqrt(12)), with the F16 term added
 *   in quadrature (tolerance 7.8e-2 for 5 layers).
 * A weight decoded wrongly (nibble, scale, sign) moves logits by the order of
 * their range, far above either.
 */
#define EPS_F16 (0x1p-11 * 0.81649658092772603) /* 2^-11 sqrt(2/3) */
#define EPS_Q8 (2.5 / (127.0 * 3.4641016151377544)) /* 2.5 / (127 sqrt(12)) */

static double
logit_tol(const sp_model_t *m, bool q8_activations)
{
    const double eps = q8_activations ? sqrt(EPS_Q8 * EPS_Q8 + EPS_F16 * EPS_F16) : EPS_F16;
    return 3.0 * eps * sqrt(4.0 * (double)sp_model_hparams(m)->n_layer + 1.0);
}

/* out's argmax is ref's, or the two are a near tie in ref: when every logit
 * may move by tol of the range (rel_diff < tol), two whose gap in ref is
 * within 2 tol of the range can swap, and greedy paths part there. */
static bool
same_or_near_tie(const float *ref, const float *out, int64_t n, double tol, double *gap)
{
    const int32_t a = argmax(ref, n), b = argmax(out, n);
    *gap = (double)ref[a] - ref[b];
    return a == b || *gap <= 2.0 * tol * max_abs(ref, n);
}

static sp_model_t *
load(int64_t n_gpu, char *err, size_t err_len)
{
    sp_model_t *m;
    if (sp_model_load(MODEL, &m, err, err_len) != SP_OK) {
        return NULL;
    }
    if (n_gpu != 0 && sp_gpu_attach(m, fake, 0, n_gpu, err, err_len) != SP_OK) {
        sp_model_free(m);
        return NULL;
    }
    return m;
}

/* Prefill the prompt in chunks of 8, then greedy decode n_gen tokens, keeping
 * the logits of every step (row 0 after the prompt, row i + 1 after
 * generated token i; n_gen + 1 rows of V) and, when force is not
 * NULL, feeding force[i] as token i whatever the argmax (teacher forcing on a
 * reference's tokens: gen[i] still gets this model's own argmax). */
static sp_status_t
run_steps(sp_model_t *m, bool kv_f16, int n_gen, const int32_t *force, float *steps,
          int32_t *gen)
{
    sp_ctx_params_t p = sp_ctx_default_params();
    p.n_ctx = 128;
    p.n_batch = 8;
    p.n_threads = 1;
    p.kv_type = kv_f16 ? SP_KV_TYPE_F16 : SP_KV_TYPE_F32;
    sp_ctx_t *c;
    char err[256];
    sp_status_t st = sp_ctx_create(m, &p, &c, err, sizeof err);
    if (st != SP_OK) {
        printf("  ctx: %s\n", err);
        return st;
    }
    const int64_t V = sp_model_hparams(m)->n_vocab;
    st = sp_ctx_eval(c, prompt, N_PROMPT, 0);
    int64_t pos = N_PROMPT;
    for (int i = 0; st == SP_OK && i < n_gen; i++) {
        memcpy(steps + (size_t)i * V, sp_ctx_logits(c), (size_t)V * sizeof(float));
        gen[i] = argmax(sp_ctx_logits(c), V);
        const int32_t tok = force != NULL ? force[i] : gen[i];
        st = sp_ctx_eval(c, &tok, 1, pos++);
    }
    if (st == SP_OK) {
        memcpy(steps + (size_t)n_gen * V, sp_ctx_logits(c), (size_t)V * sizeof(float));
    }
    sp_ctx_destroy(c);
    return st;
}

/* As run_steps without forcing, keeping only the last logits (V floats). */
static sp_status_t
run(sp_model_t *m, bool kv_f16, int n_gen, float *logits, int32_t *gen)
{
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *steps = malloc((size_t)(n_gen + 1) * (size_t)V * sizeof(float));
    if (steps == NULL) {
        return SP_ERR_NOMEM;
    }
    sp_status_t st = run_steps(m, kv_f16, n_gen, NULL, steps, gen);
    if (st == SP_OK) {
        memcpy(logits, steps + (size_t)n_gen * V, (size_t)V * sizeof(float));
    }
    free(steps);
    return st;
}

/*
 * A GPU run teacher-forced on the CPU's greedy tokens (steps from run_steps
 * with force = the CPU's tokens) against the CPU's free run (ref): at every
 * step the logits within tol (logit_tol), and where the argmax parts, a near
 * tie (same_or_near_tie). Never a demand that tokens stay equal: the two
 * engines round differently, and on another CPU (or kernel level) a near tie
 * may fall either way; forcing keeps comparing the same contexts after a
 * parting instead of skipping the rest.
 */
/* One row of check_steps: ref's logits a (whose argmax was fed), the other
 * engine's b; returns whether the argmax parted there. */
static bool
check_row(const float *a, const float *b, int64_t V, double tol, const char *what,
          double *worst)
{
    const double d = rel_diff(a, b, V);
    *worst = fmax(*worst, d);
    CHECK(d < tol, "%s: logits differ by %.3e of their range (tolerance %.3e)", what, d, tol);
    double gap;
    const bool tie = same_or_near_tie(a, b, V, tol, &gap);
    if (argmax(a, V) == argmax(b, V)) {
        return false;
    }
    printf("  %s: argmax %d, the CPU's %d: a gap of %.3g in the CPU's logits (a near tie is "
           "<= %.3g)\n", what, argmax(b, V), argmax(a, V), gap, 2.0 * tol * max_abs(a, V));
    CHECK(tie, "%s: the argmax parted with no near tie", what);
    return true;
}

static void
check_steps(const float *ref, const float *steps, int n_gen, int64_t V, double tol)
{
    int parted = 0;
    double worst = 0;
    for (int i = 0; i <= n_gen; i++) {
        char what[32];
        snprintf(what, sizeof what, "step %d", i);
        parted += check_row(ref + (size_t)i * V, steps + (size_t)i * V, V, tol, what, &worst);
    }
    printf("  forced on the CPU's tokens: argmax equal at %d/%d steps, logits rel diff <= "
           "%.2e (tolerance %.2e)\n", n_gen + 1 - parted, n_gen + 1, worst, tol);
}

/* Where offload_cases gets its models: layers 0..n_gpu-1 on the fake device
 * (0: CPU only), NULL with err on a failure. */
typedef sp_model_t *(*model_fn)(const void *src, int64_t n_gpu, char *err, size_t err_len);

static void set_graphs(bool on);

/*
 * The offload cases of one model against the CPU engine (cpu, loaded from
 * the same source): full offload and gpu_layers 2 and 1, with F32 and F16
 * caches, n_gen greedy steps teacher-forced on the CPU's tokens with the
 * cache of the same type (check_steps, logit_tol); with full offload, the
 * same steps with graphs off, whose logits the replayed graphs must give bit
 * for bit on the emulation (a real GPU's cuBLAS may pick other kernels in a
 * capture: there the CPU's tolerance). Test names PREFIX_full_kv_f32, ...
 */
static void
offload_cases(const char *prefix, model_fn load_fn, const void *src, sp_model_t *cpu, int n_gen)
{
    char err[512], name[128];
    const int64_t V = sp_model_hparams(cpu)->n_vocab, L = sp_model_hparams(cpu)->n_layer;
    const double tol = logit_tol(cpu, false); /* F32 weights: the GPU's F16 */
    const size_t bytes = sizeof(float) * (size_t)((n_gen + 1) * V);
    float *ref = malloc(bytes), *out = malloc(bytes), *eager = malloc(bytes);
    int32_t *gref = malloc(sizeof(int32_t) * (size_t)n_gen);
    int32_t *gout = malloc(sizeof(int32_t) * (size_t)n_gen);
    for (int f16 = 0; f16 <= 1; f16++) {
        if (!ref || !out || !eager || !gref || !gout ||
            run_steps(cpu, f16, n_gen, NULL, ref, gref) != SP_OK) {
            skip(prefix, "cpu run failed");
            break;
        }
        const int64_t splits[] = {-1, 2, 1};
        for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
            snprintf(name, sizeof name, "%s_%s_kv_%s", prefix,
                     splits[k] < 0 ? "full" : splits[k] == 2 ? "partial2" : "partial1",
                     f16 ? "f16" : "f32");
            begin(name);
            sp_model_t *g = load_fn(src, splits[k], err, sizeof err);
            CHECK(g != NULL, "attach: %s", err);
            if (g != NULL) {
                CHECK(sp_gpu_model_layers(g) == (splits[k] < 0 ? L : splits[k]), "layers %lld",
                      (long long)sp_gpu_model_layers(g));
                set_graphs(true);
                sp_status_t st = run_steps(g, f16, n_gen, gref, out, gout);
                CHECK(st == SP_OK, "status %d", st);
                if (st == SP_OK) {
                    check_steps(ref, out, n_gen, V, tol);
                }
                if (splits[k] < 0) {
                    set_graphs(false);
                    st = run_steps(g, f16, n_gen, gref, eager, gout);
                    set_graphs(true);
                    CHECK(st == SP_OK, "eager status %d", st);
                    if (st == SP_OK && strcmp(fake->name, "fake") == 0) {
                        CHECK(memcmp(eager, out, bytes) == 0, "graphs and eager steps differ");
                    } else if (st == SP_OK) {
                        check_steps(ref, eager, n_gen, V, tol);
                    }
                }
                CHECK(sp_gpu_model_device_bytes(g) > 0, "no device bytes");
                sp_model_free(g);
            }
            end();
        }
    }
    free(ref);
    free(out);
    free(eager);
    free(gref);
    free(gout);
}

static sp_model_t *
demo_load(const void *src, int64_t n_gpu, char *err, size_t err_len)
{
    (void)src;
    return load(n_gpu, err, err_len);
}

static void
test_forward(void)
{
    char err[512];
    sp_model_t *cpu = load(0, err, sizeof err);
    if (cpu == NULL) {
        skip("forward", err);
        return;
    }
    offload_cases("forward", demo_load, NULL, cpu, 32);
    sp_model_free(cpu);
}

/* Three sequences in one step, one sharing a copied block, against the CPU. */
/* A KV pool of `blocks` blocks and a batch (max_tokens rows, max_seqs
 * sequences, max_ctx positions, one thread) of m: what every run below needs. */
static sp_status_t
open_batch(sp_model_t *m, int64_t blocks, int64_t max_tokens, int64_t max_seqs, int64_t max_ctx,
           sp_kv_pool_t **kv, sp_batch_t **b, char *err, size_t err_len)
{
    sp_kv_pool_params_t kp = {blocks, false};
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_tokens = max_tokens;
    bp.max_seqs = max_seqs;
    bp.max_ctx = max_ctx;
    bp.n_threads = 1;
    sp_status_t st = sp_kv_pool_create(m, &kp, kv, err, err_len);
    if (st == SP_OK) {
        st = sp_batch_create(m, &bp, b, err, err_len);
    }
    return st;
}

static sp_status_t
batch_run(sp_model_t *m, float *out3)
{
    const int64_t V = sp_model_hparams(m)->n_vocab;
    sp_kv_pool_t *kv = NULL;
    sp_batch_t *b = NULL;
    char err[256] = "";
    sp_status_t st = open_batch(m, 32, 64, 4, 128, &kv, &b, err, sizeof err);
    /* Step 1: seq A prefills 20 tokens (blocks 5, 9); seq B 3 tokens (block 2). */
    const int32_t bA[] = {5, 9, 11}, bB[] = {2}, bC[] = {5, 12};
    if (st == SP_OK) {
        sp_batch_seq_t s[2] = {{prompt, 20, 0, bA, 2, true, 0, NULL},
                                {prompt + 4, 3, 0, bB, 1, true, 0, NULL}};
        st = sp_batch_eval(b, kv, s, 2);
    }
    /* C shares A's first full block and copies its partial second one. */
    if (st == SP_OK) {
        sp_kv_pool_copy_block(kv, 12, 9);
        const int32_t ta = 33, tb = 44, tc[2] = {55, 66};
        sp_batch_seq_t s[3] = {{&ta, 1, 20, bA, 2, true, 0, NULL}, {&tb, 1, 3, bB, 1, true, 0, NULL},
                               {tc, 2, 20, bC, 2, true, 0, NULL}};
        st = sp_batch_eval(b, kv, s, 3);
        for (int i = 0; st == SP_OK && i < 3; i++) {
            memcpy(out3 + i * V, sp_batch_logits(b, i), (size_t)V * sizeof(float));
        }
    }
    if (st != SP_OK && err[0]) {
        printf("  batch: %s\n", err);
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    return st;
}

static void
test_batch(void)
{
    char err[512];
    begin("batch_three_sequences_cow");
    sp_model_t *cpu = load(0, err, sizeof err), *g = load(-1, err, sizeof err),
               *p = load(3, err, sizeof err);
    CHECK(cpu && g && p, "load: %s", err);
    if (cpu && g && p) {
        static float a[3 * 512], b[3 * 512], c[3 * 512];
        const double tol = logit_tol(cpu, false);
        CHECK(batch_run(cpu, a) == SP_OK, "cpu");
        CHECK(batch_run(g, b) == SP_OK, "gpu");
        CHECK(batch_run(p, c) == SP_OK, "partial");
        for (int i = 0; i < 3; i++) {
            const double d1 = rel_diff(a + i * 512, b + i * 512, 512);
            const double d2 = rel_diff(a + i * 512, c + i * 512, 512);
            double gap1, gap2;
            printf("  seq %d: full %.2e partial %.2e (tolerance %.2e)\n", i, d1, d2, tol);
            CHECK(d1 < tol && d2 < tol, "seq %d differs", i);
            CHECK(same_or_near_tie(a + i * 512, b + i * 512, 512, tol, &gap1) &&
                      same_or_near_tie(a + i * 512, c + i * 512, 512, tol, &gap2),
                  "seq %d argmax parts with no near tie", i);
        }
    }
    sp_model_free(cpu);
    sp_model_free(g);
    sp_model_free(p);
    end();
}

static void
test_embed(void)
{
    char err[512];
    begin("embed_hidden_states");
    sp_model_t *cpu = load(0, err, sizeof err), *g = load(-1, err, sizeof err);
    CHECK(cpu && g, "load: %s", err);
    if (cpu && g) {
        float e1[64], e2[64];
        sp_ctx_params_t p = sp_ctx_default_params();
        p.n_ctx = 64;
        p.n_batch = 16;
        p.n_threads = 1;
        sp_ctx_t *c1 = NULL, *c2 = NULL;
        CHECK(sp_ctx_create(cpu, &p, &c1, err, sizeof err) == SP_OK, "%s", err);
        CHECK(sp_ctx_create(g, &p, &c2, err, sizeof err) == SP_OK, "%s", err);
        if (c1 && c2) {
            CHECK(sp_ctx_embed(c1, prompt, 20, e1) == SP_OK, "cpu embed");
            CHECK(sp_ctx_embed(c2, prompt, 20, e2) == SP_OK, "gpu embed");
            double dot = 0;
            for (int i = 0; i < 64; i++) {
                dot += (double)e1[i] * e2[i];
            }
            printf("  cosine %.6f\n", dot);
            CHECK(dot > 0.999, "cosine %.6f", dot);
            CHECK(strcmp(sp_ctx_kernels_name(c2), "cuda") == 0, "name %s", sp_ctx_kernels_name(c2));
        }
        sp_ctx_destroy(c1);
        sp_ctx_destroy(c2);
    }
    sp_model_free(cpu);
    sp_model_free(g);
    end();
}

/* ---------------------------------------------------------- architectures */

/*
 * Random models of the architectures past the llama family, built in memory
 * by the shared writer (tests/unit/testmodel.h says what each one has on):
 * qwen3, gemma2, gemma3, smollm3, phi3 (LongRoPE: the contexts here, 128,
 * are past its original 64, so the long factors and the attention factor
 * 1.2 are used), granite (embedding, attention, residual and logit scales),
 * olmo2 (post-norms only, whole-projection q/k norms) and llama-yarn (YaRN,
 * factor 4 over 64). F32 weights, the demo's tokenizer of 512 tokens.
 * Amplitudes: the output (or tied embedding) rows uniform in [-0.5, 0.5]
 * give logits of std about sqrt(64) 0.5 / sqrt(3) = 2.3 over the vocabulary
 * before the final norm's weights and the caps (granite's logits are divided
 * by 4: its rows span [-2, 2]); norms' weights in [0.5, 1.5]. Every step's std is checked >= 1.75 below: flat
 * logits could not tell a wrong engine from a right one. gemma: window 8,
 * scores capped at 5 (gemma2), final logits at 10.
 */

typedef struct arch_model {
    const char *arch;
    void *buf;
    size_t len;
} arch_model_t;

static void
arch_build(arch_model_t *am, const char *name)
{
    const bool yarn = strcmp(name, "llama-yarn") == 0;
    const bool gemma = strncmp(name, "gemma", 5) == 0;
    const sp_test_arch_t spec = {
        .arch = yarn ? "llama" : name, .type = SP_TYPE_F32, .seed = 0x9e3779b97f4a7c15ull,
        .amp_embd = gemma ? 0.5f : 1.0f,
        .amp_output = strcmp(name, "granite") == 0 ? 2.0f : 0.5f,
        .amp_in = 0.2f, .amp_out = 0.1f, .norm_base = 1.0f, .norm_amp = 0.5f,
        .final_softcap = 10.0f, .attn_softcap = 5.0f, .yarn = yarn,
    };
    am->arch = name;
    sp_test_arch_gguf(&spec, &am->buf, &am->len); /* exits on a writer failure */
}

/* The model of am (an arch_model_t), layers 0..n_gpu-1 on the fake device (0:
 * CPU only). */
static sp_model_t *
arch_load(const void *src, int64_t n_gpu, char *err, size_t err_len)
{
    const arch_model_t *am = src;
    sp_gguf_t *g;
    sp_model_t *m;
    if (sp_gguf_open_mem(am->buf, am->len, "arch.gguf", &g, err, err_len) != SP_OK ||
        sp_model_load_gguf(g, &m, err, err_len) != SP_OK) {
        return NULL;
    }
    if (n_gpu != 0 && sp_gpu_attach(m, fake, 0, n_gpu, err, err_len) != SP_OK) {
        sp_model_free(m);
        return NULL;
    }
    return m;
}

static double
stddev(const float *x, int64_t n)
{
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    const double mean = s / (double)n;
    return sqrt(fmax(s2 / (double)n - mean * mean, 0.0));
}

#define ARCH_GEN 32
#define ARCH_MIN_STD 1.75

/* One architecture against the CPU engine: its logits' spread, then
 * offload_cases (full and partial offload, F32 and F16 caches, graphs on and
 * off), then three sequences in one step with a copied block (batch_run),
 * full and partial. */
static void
test_arch(const char *arch)
{
    char err[512], name[96];
    arch_model_t am;
    arch_build(&am, arch);
    sp_model_t *cpu = arch_load(&am, 0, err, sizeof err);
    snprintf(name, sizeof name, "arch_%s_model", arch);
    begin(name);
    CHECK(cpu != NULL, "load: %s", err);
    if (cpu == NULL) {
        end();
        sp_free(am.buf);
        return;
    }
    const sp_hparams_t *hp = sp_model_hparams(cpu);
    const int64_t V = hp->n_vocab;
    CHECK(V == 512, "vocabulary %lld", (long long)V);
    const size_t bytes = sizeof(float) * (size_t)((ARCH_GEN + 1) * V);
    float *ref = malloc(bytes);
    int32_t gref[ARCH_GEN];
    const bool have = ref && run_steps(cpu, false, ARCH_GEN, NULL, ref, gref) == SP_OK;
    CHECK(have, "cpu run");
    double sd = 1e30;
    for (int i = 0; have && i <= ARCH_GEN; i++) {
        sd = fmin(sd, stddev(ref + (size_t)i * V, V));
    }
    printf("  %s: logits std over the vocabulary >= %.2f at every step\n", arch, sd);
    CHECK(sd >= ARCH_MIN_STD, "flat logits (std %.3f < %.2f): the comparison could not tell "
          "engines apart", sd, ARCH_MIN_STD);
    end();
    free(ref);
    snprintf(name, sizeof name, "arch_%s", arch);
    if (have) {
        offload_cases(name, arch_load, &am, cpu, ARCH_GEN);
    }
    snprintf(name, sizeof name, "arch_%s_three_sequences_cow", arch);
    begin(name);
    const double tol = logit_tol(cpu, false); /* F32 weights: the GPU's F16 */
    sp_model_t *g = arch_load(&am, -1, err, sizeof err), *p = arch_load(&am, 2, err, sizeof err);
    CHECK(g && p, "attach: %s", err);
    if (g && p && V == 512) {
        static float a[3 * 512], b[3 * 512], c[3 * 512];
        CHECK(batch_run(cpu, a) == SP_OK, "cpu");
        CHECK(batch_run(g, b) == SP_OK, "gpu");
        CHECK(batch_run(p, c) == SP_OK, "partial");
        for (int i = 0; i < 3; i++) {
            const double d1 = rel_diff(a + i * 512, b + i * 512, 512);
            const double d2 = rel_diff(a + i * 512, c + i * 512, 512);
            double gap1, gap2;
            printf("  seq %d: full %.2e partial %.2e (tolerance %.2e)\n", i, d1, d2, tol);
            CHECK(d1 < tol && d2 < tol, "seq %d differs", i);
            CHECK(same_or_near_tie(a + i * 512, b + i * 512, 512, tol, &gap1) &&
                      same_or_near_tie(a + i * 512, c + i * 512, 512, tol, &gap2),
                  "seq %d argmax parts with no near tie", i);
        }
    }
    sp_model_free(g);
    sp_model_free(p);
    end();
    sp_model_free(cpu);
    sp_free(am.buf);
}

/* ---------------------------------------------------------- graphs */

static void (*fake_fail_capture)(int);
static void (*fake_stats)(long *, long *, long *, long *);

/* The emulation's counters: graph captures and launches, gemv_q and qsplit_to_f16 calls. */
typedef struct fstats {
    long captures, launches, gemv, qsplit;
} fstats_t;

static fstats_t
fstats(void)
{
    fstats_t f;
    fake_stats(&f.captures, &f.launches, &f.gemv, &f.qsplit);
    return f;
}

static void
set_graphs(bool on)
{
    setenv("SAMPAN_CUDA_GRAPHS", on ? "1" : "0", 1);
}

#define N_GEN 40

/* Single-sequence decode, graphs on and off, against the CPU engine: both
 * runs forced on the CPU's greedy tokens, each step's logits within the F16
 * tolerance of the CPU's (check_steps), and the replayed graph gives the
 * eager run's logits and argmax bit for bit at every step (the emulation's
 * ops are deterministic per row). */
static void
test_graph_single(void)
{
    char err[512];
    sp_model_t *cpu = load(0, err, sizeof err);
    if (cpu == NULL) {
        skip("graph_single", err);
        return;
    }
    const int64_t V = sp_model_hparams(cpu)->n_vocab;
    const size_t bytes = sizeof(float) * (size_t)((N_GEN + 1) * V);
    float *ref = malloc(bytes), *eager = malloc(bytes), *graph = malloc(bytes);
    int32_t gref[N_GEN], geager[N_GEN], ggraph[N_GEN];
    const bool have_ref = ref && eager && graph &&
                          run_steps(cpu, false, N_GEN, NULL, ref, gref) == SP_OK;
    const int64_t splits[] = {-1, 2};
    for (size_t k = 0; k < 2; k++) {
        begin(k == 0 ? "graph_decode_batch1_full" : "graph_decode_batch1_partial2");
        sp_model_t *g = load(splits[k], err, sizeof err);
        CHECK(g != NULL && have_ref, "attach: %s", err);
        if (g != NULL && have_ref) {
            set_graphs(false);
            long l0 = fstats().launches;
            CHECK(run_steps(g, false, N_GEN, gref, eager, geager) == SP_OK, "eager run");
            CHECK(fstats().launches == l0, "graphs launched with SAMPAN_CUDA_GRAPHS=0");
            set_graphs(true);
            l0 = fstats().launches;
            CHECK(run_steps(g, false, N_GEN, gref, graph, ggraph) == SP_OK, "graph run");
            const long n = fstats().launches - l0;
            /* 40 decode steps: the first warms the bucket up, the second captures. */
            CHECK(n == N_GEN - 1, "%ld graph launches for %d decode steps", n, N_GEN);
            printf("  %ld launches; graph vs eager logits %s\n", n,
                   memcmp(eager, graph, bytes) ? "differ" : "identical");
            check_steps(ref, eager, N_GEN, V, logit_tol(cpu, false));
            CHECK(memcmp(eager, graph, bytes) == 0, "replayed logits differ from eager");
            CHECK(memcmp(geager, ggraph, sizeof ggraph) == 0, "graph tokens differ from eager");
        }
        sp_model_free(g);
        end();
    }
    free(ref);
    free(eager);
    free(graph);
    sp_model_free(cpu);
}

/*
 * Several sequences through sp_batch_eval: three prefill together (rows of
 * mixed lengths: no graph), then decode steps in which sequences join (a
 * one-token sequence at position 0), fork (copy-on-write of the partial
 * block) and leave, so the bucket of rows changes (3 -> 4 padded, 4, 5 -> 8
 * padded, 4, 3, 4) and positions differ from row to row.
 */
#define MS_SEQS 6
#define MS_STEPS 40

typedef struct mseq {
    int32_t blocks[8];
    int64_t pos;
    int32_t tok;
    bool live;
} mseq_t;

/* toks gets each sequence's argmax at every step (-1 where it is not live);
 * the token fed is that argmax, or force's (teacher forcing on a reference
 * run's tokens) when force is not NULL. steps (MS_SEQS x (MS_STEPS + 1) rows
 * of V, row i * (MS_STEPS + 1) + step) gets the logits behind each token. */
static sp_status_t
multi_run(sp_model_t *m, int32_t toks[MS_SEQS][MS_STEPS + 1],
          int32_t (*force)[MS_STEPS + 1], float *steps, long *launches)
{
    const int64_t V = sp_model_hparams(m)->n_vocab;
    sp_kv_pool_t *kv = NULL;
    sp_batch_t *b = NULL;
    char err[256] = "";
    sp_status_t st = open_batch(m, 64, 64, 8, 128, &kv, &b, err, sizeof err);
    mseq_t q[MS_SEQS];
    memset(q, 0, sizeof q);
    memset(toks, 0xff, sizeof(int32_t) * MS_SEQS * (MS_STEPS + 1));
    for (int i = 0; i < MS_SEQS; i++) {
        for (int k = 0; k < 8; k++) {
            q[i].blocks[k] = (int32_t)(i * 8 + k + 8); /* blocks 0..7 stay unused */
        }
    }
    const long l0 = fake_stats ? fstats().launches : 0;
    /* Step 0: prefill three sequences of 20, 5 and 11 tokens. */
    if (st == SP_OK) {
        sp_batch_seq_t s[3] = {{prompt, 20, 0, q[0].blocks, 8, true, 0, NULL},
                               {prompt + 3, 5, 0, q[1].blocks, 8, true, 0, NULL},
                               {prompt + 5, 11, 0, q[2].blocks, 8, true, 0, NULL}};
        st = sp_batch_eval(b, kv, s, 3);
        const int64_t n[3] = {20, 5, 11};
        for (int i = 0; st == SP_OK && i < 3; i++) {
            q[i].live = true;
            q[i].pos = n[i];
            toks[i][0] = argmax(sp_batch_logits(b, i), V);
            q[i].tok = force != NULL ? force[i][0] : toks[i][0];
            memcpy(steps + (size_t)i * (MS_STEPS + 1) * V, sp_batch_logits(b, i),
                   (size_t)V * sizeof(float));
        }
    }
    for (int step = 1; st == SP_OK && step <= MS_STEPS; step++) {
        if (step == 8 || step == 30) { /* a new one-token sequence joins */
            mseq_t *n = &q[step == 8 ? 3 : 5];
            n->live = true;
            n->pos = 0;
            n->tok = 1;
        }
        if (step == 12) { /* seq 4 forks seq 0: shares its full blocks, copies the partial one */
            mseq_t *f = &q[4], *o = &q[0];
            const int64_t full = o->pos / SP_KV_BLOCK;
            for (int64_t k = 0; k < full; k++) {
                f->blocks[k] = o->blocks[k];
            }
            sp_kv_pool_copy_block(kv, f->blocks[full], o->blocks[full]);
            f->live = true;
            f->pos = o->pos;
            f->tok = (int32_t)((o->tok + 7) % V);
        }
        if (step == 20) {
            q[1].live = false;
        }
        if (step == 26) {
            q[2].live = false;
        }
        sp_batch_seq_t s[MS_SEQS];
        int idx[MS_SEQS], n = 0;
        for (int i = 0; i < MS_SEQS; i++) {
            if (q[i].live) {
                s[n] = (sp_batch_seq_t){&q[i].tok, 1, q[i].pos, q[i].blocks, 8, true, 0, NULL};
                idx[n++] = i;
            }
        }
        st = sp_batch_eval(b, kv, s, n);
        for (int k = 0; st == SP_OK && k < n; k++) {
            mseq_t *e = &q[idx[k]];
            e->pos++;
            toks[idx[k]][step] = argmax(sp_batch_logits(b, k), V);
            e->tok = force != NULL ? force[idx[k]][step] : toks[idx[k]][step];
            memcpy(steps + ((size_t)idx[k] * (MS_STEPS + 1) + (size_t)step) * V,
                   sp_batch_logits(b, k), (size_t)V * sizeof(float));
        }
    }
    if (launches) {
        *launches = (fake_stats ? fstats().launches : 0) - l0;
    }
    if (st != SP_OK) {
        printf("  multi_run: status %d %s\n", st, err);
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    return st;
}

static void
test_graph_multi(void)
{
    char err[512];
    begin("graph_decode_join_fork_leave");
    sp_model_t *cpu = load(0, err, sizeof err), *g = load(-1, err, sizeof err);
    CHECK(cpu && g, "load: %s", err);
    if (cpu && g) {
        static int32_t tc[MS_SEQS][MS_STEPS + 1], te[MS_SEQS][MS_STEPS + 1],
            tg[MS_SEQS][MS_STEPS + 1];
        static float lc[MS_SEQS * (MS_STEPS + 1) * 512], le[MS_SEQS * (MS_STEPS + 1) * 512],
            lg[MS_SEQS * (MS_STEPS + 1) * 512];
        long ne = 0, ng = 0;
        CHECK(sp_model_hparams(cpu)->n_vocab == 512, "vocab");
        CHECK(multi_run(cpu, tc, NULL, lc, NULL) == SP_OK, "cpu");
        /* the GPU runs fed the CPU's tokens: a near tie cannot make them part */
        set_graphs(false);
        CHECK(multi_run(g, te, tc, le, &ne) == SP_OK, "gpu eager");
        set_graphs(true);
        const long c0 = fstats().captures;
        CHECK(multi_run(g, tg, tc, lg, &ng) == SP_OK, "gpu graphs");
        const long nc = fstats().captures - c0;
        printf("  eager launches %ld; graphs: %ld captures, %ld launches\n", ne, nc, ng);
        CHECK(ne == 0, "launches with graphs off");
        /* Buckets 4 and 8 (2 captures); 40 decode steps less the two warm-ups. */
        CHECK(nc == 2 && ng == MS_STEPS - 2, "captures %ld launches %ld", nc, ng);
        CHECK(memcmp(te, tg, sizeof te) == 0, "graph tokens differ from eager");
        CHECK(memcmp(le, lg, sizeof le) == 0, "graph logits differ from eager");
        const double tol = logit_tol(cpu, false);
        int rows = 0, parted = 0;
        double worst = 0;
        for (int i = 0; i < MS_SEQS; i++) {
            for (int k = 0; k <= MS_STEPS; k++) {
                if (tc[i][k] < 0) {
                    continue; /* not live at this step */
                }
                char what[48];
                snprintf(what, sizeof what, "seq %d step %d", i, k);
                const size_t r = ((size_t)i * (MS_STEPS + 1) + (size_t)k) * 512;
                parted += check_row(lc + r, lg + r, 512, tol, what, &worst);
                rows++;
            }
        }
        printf("  forced on the CPU's tokens: argmax equal in %d/%d rows, logits rel diff <= "
               "%.2e (tolerance %.2e)\n", rows - parted, rows, worst, tol);
        CHECK(rows >= MS_STEPS, "only %d rows compared", rows);
    }
    sp_model_free(cpu);
    sp_model_free(g);
    end();
}

/* One batch used with two pools: each switch drops the graphs and captures
 * new ones (a graph holds the pool's address), and both pools compute alike. */
static void
test_graph_rebuild(void)
{
    char err[512];
    begin("graph_rebuilt_for_another_pool");
    set_graphs(true);
    sp_model_t *g = load(-1, err, sizeof err);
    CHECK(g != NULL, "load: %s", err);
    sp_kv_pool_t *kv[2] = {NULL, NULL};
    sp_batch_t *b = NULL;
    if (g != NULL) {
        const int64_t V = sp_model_hparams(g)->n_vocab;
        sp_kv_pool_params_t kp = {16, false};
        sp_batch_params_t bp = sp_batch_default_params();
        bp.max_tokens = 32;
        bp.max_seqs = 2;
        bp.max_ctx = 64;
        bp.n_threads = 1;
        sp_status_t st = sp_kv_pool_create(g, &kp, &kv[0], err, sizeof err);
        if (st == SP_OK) {
            st = sp_kv_pool_create(g, &kp, &kv[1], err, sizeof err);
        }
        if (st == SP_OK) {
            st = sp_batch_create(g, &bp, &b, err, sizeof err);
        }
        CHECK(st == SP_OK, "setup: %s", err);
        const int32_t blocks[4] = {3, 1, 2, 0};
        int32_t tok[2] = {0, 0};
        float la[512];
        for (int p = 0; st == SP_OK && p < 2; p++) {
            sp_batch_seq_t s = {prompt, 10, 0, blocks, 4, true, 0, NULL};
            st = sp_batch_eval(b, kv[p], &s, 1);
            tok[p] = st == SP_OK ? argmax(sp_batch_logits(b, 0), V) : 0;
        }
        const long c0 = fstats().captures;
        int differ = 0;
        for (int step = 0; st == SP_OK && step < 12; step++) {
            for (int p = 0; st == SP_OK && p < 2; p++) {
                sp_batch_seq_t s = {&tok[p], 1, 10 + step, blocks, 4, true, 0, NULL};
                st = sp_batch_eval(b, kv[p], &s, 1);
                if (st == SP_OK) {
                    const float *l = sp_batch_logits(b, 0);
                    if (p == 0) {
                        memcpy(la, l, sizeof la);
                    } else {
                        differ += memcmp(la, l, sizeof la) != 0;
                    }
                    tok[p] = argmax(l, V);
                }
            }
        }
        const long nc = fstats().captures - c0;
        printf("  %ld captures over 24 alternating steps, %d steps differ\n", nc, differ);
        CHECK(st == SP_OK, "status %d", st);
        CHECK(differ == 0 && tok[0] == tok[1], "the two pools parted");
        CHECK(nc >= 22, "only %ld captures: graphs not rebuilt for the other pool", nc);
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv[0]);
    sp_kv_pool_destroy(kv[1]);
    sp_model_free(g);
    end();
}

/* A capture the library cannot make: the batch falls back to eager steps
 * (with the right tokens), the device stays healthy. */
static void
test_graph_capture_failure(void)
{
    char err[512];
    begin("graph_capture_failure_falls_back");
    set_graphs(true);
    sp_model_t *cpu = load(0, err, sizeof err), *g = load(-1, err, sizeof err);
    CHECK(cpu && g, "load: %s", err);
    if (cpu && g) {
        static float a[(N_GEN + 1) * 512], b[(N_GEN + 1) * 512];
        int32_t ta[N_GEN], tb[N_GEN];
        CHECK(sp_model_hparams(cpu)->n_vocab == 512, "vocab");
        CHECK(run_steps(cpu, false, N_GEN, NULL, a, ta) == SP_OK, "cpu");
        const long l0 = fstats().launches;
        fake_fail_capture(1);
        CHECK(run_steps(g, false, N_GEN, ta, b, tb) == SP_OK, "gpu with a failing capture");
        fake_fail_capture(0);
        CHECK(fstats().launches == l0, "graphs launched after a failed capture");
        check_steps(a, b, N_GEN, 512, logit_tol(cpu, false));
        CHECK(sp_loader_device_healthy(0), "a failed capture made the device unhealthy");
    }
    sp_model_free(cpu);
    sp_model_free(g);
    end();
}

/* A CUDA fault inside a replayed graph: SP_ERR_DEVICE, the device (ordinal
 * 1, so the other tests keep a healthy device 0) unhealthy, later steps
 * refused, clean teardown. */
static void
test_graph_fault(void)
{
    char err[512];
    begin("graph_fault_during_replay");
    set_graphs(true);
    fake_set_devices(2);
    sp_model_t *g = NULL;
    CHECK(sp_model_load(MODEL, &g, err, sizeof err) == SP_OK, "%s", err);
    if (g != NULL && sp_gpu_attach(g, fake, 1, -1, err, sizeof err) != SP_OK) {
        CHECK(0, "attach: %s", err);
        sp_model_free(g);
        g = NULL;
    }
    if (g != NULL) {
        sp_ctx_params_t p = sp_ctx_default_params();
        p.n_ctx = 64;
        p.n_threads = 1;
        sp_ctx_t *c = NULL;
        CHECK(sp_ctx_create(g, &p, &c, err, sizeof err) == SP_OK, "%s", err);
        if (c != NULL) {
            const int64_t V = sp_model_hparams(g)->n_vocab;
            sp_status_t st = sp_ctx_eval(c, prompt, 4, 0);
            int64_t pos = 4;
            const long l0 = fstats().launches;
            for (int i = 0; st == SP_OK && i < 3; i++) { /* warm-up, capture, replay */
                const int32_t t = argmax(sp_ctx_logits(c), V);
                st = sp_ctx_eval(c, &t, 1, pos++);
            }
            CHECK(st == SP_OK && fstats().launches - l0 == 2, "no graph replayed before the fault");
            CHECK(sp_loader_device_healthy(1), "healthy before");
            /* Ops of the next step: upload rows, upload x, launch, then the
             * replayed ones: the 6th op is the third replayed (gemm q). */
            fake_fail_at(5);
            const long l1 = fstats().launches;
            const int32_t t = argmax(sp_ctx_logits(c), V);
            st = sp_ctx_eval(c, &t, 1, pos);
            CHECK(st == SP_ERR_DEVICE, "fault in a replay gave status %d", st);
            CHECK(fstats().launches == l1 + 1, "the fault was not inside a launch");
            CHECK(!sp_loader_device_healthy(1), "device still healthy");
            CHECK(sp_loader_device_healthy(0), "the other device caught it");
            CHECK(sp_ctx_eval(c, &t, 1, pos) == SP_ERR_DEVICE, "poisoned context ran");
            sp_ctx_destroy(c);
        }
        fake_fail_at(-1);
        sp_model_free(g);
    }
    fake_set_devices(1);
    end();
}

/* ---------------------------------------------------------- native weights */

/* stories260K quantised by `sampan quantize` (n_ff = 172 is no multiple of
 * 32, so w_down stays F32: a mixed model, as real ones are). */
static bool
quantised_copy(const char *type, char *path, size_t len)
{
    snprintf(path, len, "/tmp/sampan-cuda-host-%d-%s.gguf", (int)getpid(), type);
    char *argv[] = {"quantize", MODEL, path, (char *)type, "--threads", "1", "--no-progress"};
    return sp_cmd_quantize(7, argv) == 0;
}

static sp_model_t *
load_file(const char *path, int64_t n_gpu, const char *weights, char *err, size_t err_len)
{
    sp_model_t *m;
    if (sp_model_load(path, &m, err, err_len) != SP_OK) {
        return NULL;
    }
    if (weights) {
        setenv("SAMPAN_CUDA_WEIGHTS", weights, 1);
    }
    sp_status_t st = n_gpu != 0 ? sp_gpu_attach(m, fake, 0, n_gpu, err, err_len) : SP_OK;
    unsetenv("SAMPAN_CUDA_WEIGHTS");
    if (st != SP_OK) {
        sp_model_free(m);
        return NULL;
    }
    return m;
}

static void
test_native(void)
{
    const char *types[] = {"q8_0", "q4_0"};
    for (int t = 0; t < 2; t++) {
        char path[256], err[512], name[64];
        if (!quantised_copy(types[t], path, sizeof path)) {
            skip("native", "sampan quantize failed");
            continue;
        }
        sp_model_t *cpu = load_file(path, 0, NULL, err, sizeof err);
        static float ref[(N_GEN + 1) * 512], out[(N_GEN + 1) * 512];
        int32_t gref[N_GEN], gout[N_GEN];
        const bool have_ref = cpu != NULL && sp_model_hparams(cpu)->n_vocab == 512 &&
                              run_steps(cpu, false, N_GEN, NULL, ref, gref) == SP_OK;
        /* the CPU's products use Q8_0 activations, the GPU's half ones */
        const double tol = have_ref ? logit_tol(cpu, true) : 0;
        uint64_t bytes_f16 = 0;
        const char *modes[] = {"f16", "native", "both"};
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "weights_%s_%s_greedy", modes[k], types[t]);
            begin(name);
            set_graphs(true);
            sp_model_t *g = load_file(path, -1, modes[k], err, sizeof err);
            CHECK(have_ref && g != NULL, "load: %s", err);
            if (have_ref && g != NULL) {
                CHECK(strcmp(sp_gpu_model_weights(g), modes[k]) == 0, "mode %s",
                      sp_gpu_model_weights(g));
                const long g0 = fstats().gemv;
                const sp_status_t st = run_steps(g, false, N_GEN, gref, out, gout);
                CHECK(st == SP_OK, "run");
                const long ng = fstats().gemv - g0;
                const uint64_t bytes = sp_gpu_model_device_bytes(g);
                if (k == 0) {
                    bytes_f16 = bytes;
                }
                printf("  gemv_q calls %ld, device %.0f KiB (f16 %.0f), step bytes at 1 row "
                       "%llu\n", ng, bytes / 1024.0, bytes_f16 / 1024.0,
                       (unsigned long long)sp_gpu_model_step_bytes(g, 1));
                if (st == SP_OK) {
                    check_steps(ref, out, N_GEN, 512, tol);
                }
                CHECK(k == 0 ? ng == 0 : ng > 0, "gemv_q used %ld times", ng);
                if (k == 1) {
                    CHECK(bytes < bytes_f16, "native holds no fewer bytes than f16");
                    CHECK(sp_gpu_model_step_bytes(g, 1) < sp_gpu_model_step_bytes(g, 64),
                          "step bytes");
                }
                if (k == 2) {
                    CHECK(bytes > bytes_f16, "both holds no more bytes than f16");
                }
            }
            sp_model_free(g);
            end();
        }
        /* More rows than gemv_q takes: native dequantises into the batch's
         * scratch and uses the GEMM. Against the f16 mode on the same file
         * (the same F16 products but for the output's gemv_q: the argmax
         * must agree) and the CPU (whose Q8_0 activations part from F16 ones
         * by ~1e-2 of the range: near ties may differ, so only the logits). Both
         * argmax checks accept a near tie (same_or_near_tie) at their tolerance. */
        snprintf(name, sizeof name, "weights_native_%s_many_rows", types[t]);
        begin(name);
        sp_model_t *g = load_file(path, -1, "native", err, sizeof err);
        sp_model_t *g16 = load_file(path, -1, "f16", err, sizeof err);
        CHECK(cpu && g && g16, "load: %s", err);
        if (cpu && g && g16) {
            static float a[3 * 512], b[3 * 512], h[3 * 512];
            CHECK(batch_run(g16, h) == SP_OK, "gpu f16");
            const long q0 = fstats().qsplit, g0 = fstats().gemv;
            CHECK(batch_run(cpu, a) == SP_OK, "cpu");
            CHECK(batch_run(g, b) == SP_OK, "gpu");
            printf("  qsplit_to_f16 calls %ld, gemv_q calls %ld\n", fstats().qsplit - q0,
                   fstats().gemv - g0);
            CHECK(fstats().qsplit > q0 && fstats().gemv > g0, "both paths used");
            for (int i = 0; i < 3; i++) {
                const float *x = a + i * 512;
                const int32_t top = argmax(x, 512);
                float second = -INFINITY;
                for (int k = 0; k < 512; k++) {
                    second = k != top && x[k] > second ? x[k] : second;
                }
                printf("  seq %d: rel diff vs cpu %.2e, vs f16 mode %.2e; argmax cpu %d, "
                       "native %d, f16 %d (cpu top-2 gap %.3g)\n", i,
                       rel_diff(x, b + i * 512, 512), rel_diff(h + i * 512, b + i * 512, 512),
                       top, argmax(b + i * 512, 512), argmax(h + i * 512, 512), x[top] - second);
                double gap;
                CHECK(same_or_near_tie(h + i * 512, b + i * 512, 512, 1e-3, &gap),
                      "seq %d argmax parts from the f16 mode's with a gap of %.3g", i, gap);
                CHECK(rel_diff(h + i * 512, b + i * 512, 512) < 1e-3, "seq %d vs f16", i);
                CHECK(rel_diff(a + i * 512, b + i * 512, 512) < tol, "seq %d logits", i);
            }
        }
        sp_model_free(g16);
        sp_model_free(g);
        sp_model_free(cpu);
        end();
        unlink(path);
    }

    begin("weights_and_graphs_bad_values");
    char err[512] = "";
    sp_model_t *m = NULL;
    CHECK(sp_model_load(MODEL, &m, err, sizeof err) == SP_OK, "%s", err);
    if (m != NULL) {
        setenv("SAMPAN_CUDA_WEIGHTS", "int3", 1);
        sp_status_t st = sp_gpu_attach(m, fake, 0, -1, err, sizeof err);
        unsetenv("SAMPAN_CUDA_WEIGHTS");
        CHECK(st == SP_ERR_INVALID && strstr(err, "SAMPAN_CUDA_WEIGHTS") != NULL, "%d %s", st,
              err);
        setenv("SAMPAN_CUDA_GRAPHS", "maybe", 1);
        st = sp_gpu_attach(m, fake, 0, -1, err, sizeof err);
        CHECK(st == SP_ERR_INVALID && strstr(err, "SAMPAN_CUDA_GRAPHS") != NULL, "%d %s", st,
              err);
        set_graphs(true);
        CHECK(sp_gpu_attach(m, fake, 0, -1, err, sizeof err) == SP_OK, "%s", err);
        setenv("SAMPAN_CUDA_GRAPHS", "maybe", 1);
        sp_batch_params_t bp = sp_batch_default_params();
        bp.max_tokens = 8;
        bp.max_seqs = 2;
        bp.max_ctx = 32;
        bp.n_threads = 1;
        sp_batch_t *b = NULL;
        err[0] = '\0';
        st = sp_batch_create(m, &bp, &b, err, sizeof err);
        CHECK(st == SP_ERR_INVALID && strstr(err, "SAMPAN_CUDA_GRAPHS") != NULL, "%d %s", st,
              err);
        sp_batch_destroy(b);
        set_graphs(true);
        sp_model_free(m);
    }
    end();
}

/* ---------------------------------------------------------- failures */

static void
test_errors(void)
{
    char err[512];
    begin("error_injected_cuda_fault");
    sp_model_t *g = load(-1, err, sizeof err);
    CHECK(g != NULL, "load: %s", err);
    if (g != NULL) {
        sp_ctx_params_t p = sp_ctx_default_params();
        p.n_ctx = 64;
        p.n_threads = 1;
        sp_ctx_t *c = NULL;
        CHECK(sp_ctx_create(g, &p, &c, err, sizeof err) == SP_OK, "%s", err);
        if (c != NULL) {
            CHECK(sp_ctx_eval(c, prompt, 4, 0) == SP_OK, "first eval");
            CHECK(sp_loader_device_healthy(0), "healthy before");
            fake_fail_at(7); /* somewhere inside the next step's first layer */
            CHECK(sp_ctx_eval(c, prompt + 4, 4, 4) == SP_ERR_DEVICE, "fault not reported");
            CHECK(!sp_loader_device_healthy(0), "device still healthy");
            CHECK(sp_ctx_eval(c, prompt + 4, 1, 4) == SP_ERR_DEVICE, "poisoned ctx ran");
            sp_ctx_destroy(c);
        }
        fake_fail_at(-1);
        sp_model_free(g);
    }
    end();

    begin("error_device_oom");
    fake_set_mem(64 * 1024); /* the 260K model's weights alone are ~0.6 MB in F16 */
    sp_model_t *m = NULL;
    CHECK(sp_model_load(MODEL, &m, err, sizeof err) == SP_OK, "%s", err);
    if (m != NULL) {
        err[0] = '\0';
        sp_status_t st = sp_gpu_attach(m, fake, 0, -1, err, sizeof err);
        CHECK(st == SP_ERR_NOMEM, "status %d (%s)", st, err);
        CHECK(strstr(err, "cudaMalloc") != NULL, "message: %s", err);
        CHECK(sp_gpu_model_layers(m) == 0, "binding left behind");
        /* The model still runs on the CPU. */
        float lg[512];
        int32_t gen[4];
        CHECK(run(m, false, 4, lg, gen) == SP_OK, "cpu after failed attach");
        /* The split: weights of k layers fit, more do not. */
        const uint64_t w1 = sp_gpu_weight_bytes(m, 1), w2 = sp_gpu_weight_bytes(m, 2);
        const uint64_t all = sp_gpu_weight_bytes(m, -1);
        CHECK(w1 < w2 && w2 < all, "weights %llu %llu %llu", (unsigned long long)w1,
              (unsigned long long)w2, (unsigned long long)all);
        CHECK(sp_gpu_fit_layers(m, all, 0, 0) == 5, "all fit");
        CHECK(sp_gpu_fit_layers(m, w2 + 1000, 0, 0) == 2, "two fit: %lld",
              (long long)sp_gpu_fit_layers(m, w2 + 1000, 0, 0));
        CHECK(sp_gpu_fit_layers(m, 10, 0, 0) == 0, "none fit");
        sp_model_free(m);
    }
    fake_set_mem(UINT64_MAX);
    end();
}

/* A Q8_0 KV cache is CPU-only (the device pool keeps F32/F16): a model with GPU
 * layers refuses it with the reason, and the same model on the CPU takes it. */
static void
test_kv_q8_refused(void)
{
    char err[512];
    begin("kv_q8_0_refused_with_gpu_layers");
    sp_model_t *g = load(2, err, sizeof err);
    CHECK(g != NULL, "attach: %s", err);
    if (g != NULL) {
        sp_ctx_params_t p = sp_ctx_default_params();
        p.n_ctx = 64;
        p.n_threads = 1;
        p.kv_type = SP_KV_TYPE_Q8_0;
        sp_ctx_t *c = NULL;
        err[0] = '\0';
        sp_status_t st = sp_ctx_create(g, &p, &c, err, sizeof err);
        CHECK(st == SP_ERR_UNSUPPORTED && c == NULL, "status %d", st);
        CHECK(strstr(err, "q8_0") != NULL && strstr(err, "CPU only") != NULL, "error: %s", err);
        CHECK(sp_kv_pool_bytes(g, &(sp_kv_pool_params_t){4, SP_KV_TYPE_Q8_0}) == 0,
              "pool bytes for a refused pool");
        sp_ctx_destroy(c);
        sp_model_free(g);
    }
    end();
}

/* ------------------------------------------------------ pinned host memory */

static void (*fake_fail_pin)(long);
static void (*fake_pinned)(uint64_t *, int *);
static void (*fake_copy_stats)(long *, long *, uint64_t *, uint64_t *);

static uint64_t
pinned_now(void)
{
    uint64_t b;
    int n;
    fake_pinned(&b, &n);
    return b;
}

typedef struct copies {
    long pinned, pageable;
    uint64_t h2d, d2h;
} copies_t;

static copies_t
copies_now(void)
{
    copies_t c;
    fake_copy_stats(&c.pinned, &c.pageable, &c.h2d, &c.d2h);
    return c;
}

/* A prefill of 10 tokens and 12 greedy decode steps of 3 sequences through a
 * batch of m; every logits row of the last step into last (3 x V). */
static sp_status_t
pin_run(sp_model_t *m, float *last, uint64_t *pinned_in_use)
{
    const int64_t V = sp_model_hparams(m)->n_vocab;
    sp_kv_pool_t *kv = NULL;
    sp_batch_t *b = NULL;
    char err[256] = "";
    sp_status_t st = open_batch(m, 32, 64, 4, 128, &kv, &b, err, sizeof err);
    *pinned_in_use = st == SP_OK ? sp_gpu_model_pinned_bytes(m) : 0;
    int32_t blocks[3][8], tok[3];
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 8; k++) {
            blocks[i][k] = (int32_t)(i * 8 + k);
        }
    }
    if (st == SP_OK) {
        sp_batch_seq_t s[3];
        for (int i = 0; i < 3; i++) {
            s[i] = (sp_batch_seq_t){prompt + i, 10, 0, blocks[i], 8, true, 0, NULL};
        }
        st = sp_batch_eval(b, kv, s, 3);
        for (int i = 0; st == SP_OK && i < 3; i++) {
            tok[i] = argmax(sp_batch_logits(b, i), V);
        }
    }
    for (int step = 0; st == SP_OK && step < 12; step++) {
        sp_batch_seq_t s[3];
        for (int i = 0; i < 3; i++) {
            s[i] = (sp_batch_seq_t){&tok[i], 1, 10 + step, blocks[i], 8, true, 0, NULL};
        }
        st = sp_batch_eval(b, kv, s, 3);
        for (int i = 0; st == SP_OK && i < 3; i++) {
            const float *l = sp_batch_logits(b, i);
            tok[i] = argmax(l, V);
            if (step == 11) {
                memcpy(last + i * V, l, (size_t)V * sizeof(float));
            }
        }
    }
    if (st != SP_OK) {
        printf("  pin_run: status %d %s\n", st, err);
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    return st;
}

/*
 * Every copy of a step (the integer block, x up, logits or the residual
 * down) from pinned memory, full and partial offload, graphs on and off;
 * the pinned bytes are counted and return to 0 when the batch goes; a
 * failed registration falls back to pageable copies with the same results;
 * SAMPAN_CUDA_PINNED=0 pins nothing.
 */
static void
test_pinned(void)
{
    char err[512];
    if (fake_pinned == NULL || fake_copy_stats == NULL || fake_fail_pin == NULL) {
        skip("pinned", "the fake library has no pinned-memory knobs");
        return;
    }
    const int64_t splits[] = {-1, 2};
    for (size_t k = 0; k < 2; k++) {
        for (int graphs = 0; graphs <= 1; graphs++) {
            char name[64];
            snprintf(name, sizeof name, "pinned_copies_%s_graphs_%s", k ? "partial2" : "full",
                     graphs ? "on" : "off");
            begin(name);
            set_graphs(graphs);
            sp_model_t *g = load(splits[k], err, sizeof err);
            CHECK(g != NULL, "attach: %s", err);
            if (g != NULL) {
                const int64_t V = sp_model_hparams(g)->n_vocab;
                static float pinned_logits[3 * 512], pageable_logits[3 * 512];
                const uint64_t p0 = pinned_now();
                const copies_t c0 = copies_now();
                uint64_t in_use = 0;
                CHECK(pin_run(g, pinned_logits, &in_use) == SP_OK, "pinned run");
                const copies_t c1 = copies_now();
                printf("  pinned while the batch lived: %llu bytes; copies pinned %ld, pageable "
                       "%ld\n", (unsigned long long)in_use, c1.pinned - c0.pinned,
                       c1.pageable - c0.pageable);
                CHECK(in_use >= (uint64_t)(3 * 64 * 64 * 4), "only %llu bytes pinned",
                      (unsigned long long)in_use);
                CHECK(c1.pageable == c0.pageable, "%ld pageable copies",
                      c1.pageable - c0.pageable);
                CHECK(c1.pinned - c0.pinned >= 2 * 13, "%ld pinned copies", c1.pinned - c0.pinned);
                CHECK(pinned_now() == p0 && sp_gpu_model_pinned_bytes(g) == 0,
                      "%llu bytes still pinned after the batch", (unsigned long long)pinned_now());
                /* Pinning refused: pageable copies, the same logits, a log line. */
                fake_fail_pin(1000);
                const copies_t c2 = copies_now();
                CHECK(pin_run(g, pageable_logits, &in_use) == SP_OK, "pageable run");
                fake_fail_pin(0);
                const copies_t c3 = copies_now();
                CHECK(in_use == 0, "%llu bytes pinned although registration failed",
                      (unsigned long long)in_use);
                CHECK(c3.pageable - c2.pageable >= 2 * 13 && c3.pinned == c2.pinned,
                      "pageable %ld pinned %ld", c3.pageable - c2.pageable,
                      c3.pinned - c2.pinned);
                CHECK(memcmp(pinned_logits, pageable_logits, (size_t)(3 * V) * 4) == 0,
                      "pageable copies gave other logits");
                /* Off by the switch. */
                setenv("SAMPAN_CUDA_PINNED", "0", 1);
                CHECK(pin_run(g, pageable_logits, &in_use) == SP_OK && in_use == 0,
                      "SAMPAN_CUDA_PINNED=0: %llu bytes pinned", (unsigned long long)in_use);
                unsetenv("SAMPAN_CUDA_PINNED");
                sp_model_free(g);
            }
            CHECK(pinned_now() == 0, "%llu bytes pinned after the model went",
                  (unsigned long long)pinned_now());
            end();
        }
    }
    set_graphs(true);
}

/* ---------------------------------------------------- sampling candidates */

/* The k best of x (value descending, ties to the lower index, NaN as -inf),
 * as the topk op gives them. */
static void
ref_topk(const float *x, int32_t n, int32_t k, int32_t *ids, float *vals)
{
    for (int32_t j = 0; j < k; j++) {
        int32_t bi = -1;
        float bv = -INFINITY;
        for (int32_t e = 0; e < n; e++) {
            float v = x[e] != x[e] ? -INFINITY : x[e];
            bool taken = false;
            for (int32_t q = 0; q < j && !taken; q++) {
                taken = ids[q] == e;
            }
            if (!taken && (bi < 0 || v > bv)) {
                bi = e;
                bv = v;
            }
        }
        ids[j] = bi;
        vals[j] = bv;
    }
}

/* The sampler on candidates against the sampler on the whole row: same
 * parameters, same seed, 300 draws each, with ties, -inf and NaN logits. */
static void
test_sampler_candidates(void)
{
    begin("sampler_candidates_equal_full_row");
    const int32_t V = 700;
    static const struct { float t; int32_t k; float top_p, min_p; } ps[] = {
        {0.0f, 40, 0.95f, 0.05f}, {0.8f, 1, 1.0f, 0.0f},  {0.8f, 40, 0.95f, 0.05f},
        {1.5f, 8, 1.0f, 0.0f},    {0.3f, 64, 0.9f, 0.1f}, {1.0f, 2, 0.5f, 0.0f},
        {2.0f, 17, 1.0f, 0.3f},   {0.7f, 64, 0.99f, 0.0f},
    };
    float *row = malloc((size_t)V * sizeof(float)), *scratch = malloc((size_t)V * sizeof(float));
    int bad = 0, draws = 0, distinct = 0;
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
        sp_sampler_params_t sp = sp_sampler_default_params();
        sp.temperature = ps[pi].t;
        sp.top_k = ps[pi].k;
        sp.top_p = ps[pi].top_p;
        sp.min_p = ps[pi].min_p;
        sp.seed = 1000 + pi;
        sp_sampler_t *a = NULL, *c = NULL;
        char err[128];
        if (sp_sampler_create(&sp, V, &a, err, sizeof err) != SP_OK ||
            sp_sampler_create(&sp, V, &c, err, sizeof err) != SP_OK) {
            CHECK(0, "sampler: %s", err);
            break;
        }
        const int32_t need = sp_sampler_candidates(c);
        CHECK(need == (sp.temperature == 0.0f || sp.top_k == 1 ? 1 : sp.top_k),
              "params %zu: candidates %d", pi, need);
        int32_t ids[64], prev = -1;
        float vals[64];
        for (int t = 0; t < 300; t++) {
            for (int32_t i = 0; i < V; i++) {
                /* quantised to 1/4: many ties; a few -inf and a NaN */
                row[i] = (float)((int)(rndf() * 24.0f)) * 0.25f;
                if (rnd() % 50 == 0) {
                    row[i] = -INFINITY;
                }
            }
            row[rnd() % (uint32_t)V] = NAN;
            if (t % 37 == 5) { /* fewer finite logits than k */
                for (int32_t i = 0; i < V; i++) {
                    row[i] = i % 97 == 3 ? row[i] : -INFINITY;
                }
            }
            memcpy(scratch, row, (size_t)V * sizeof(float));
            const int32_t want = sp_sampler_sample(a, scratch);
            ref_topk(row, V, need, ids, vals);
            const int32_t got = sp_sampler_sample_candidates(c, ids, vals, need);
            bad += want != got;
            distinct += want != prev;
            prev = want;
            draws++;
        }
        CHECK(sp_sampler_sample_candidates(c, ids, vals, need - 1) == -1,
              "too few candidates accepted");
        sp_sampler_destroy(a);
        sp_sampler_destroy(c);
    }
    /* Parameters that need the whole row. */
    sp_sampler_params_t sp = sp_sampler_default_params();
    sp_sampler_t *s = NULL;
    char err[128];
    sp.top_k = 0;
    CHECK(sp_sampler_create(&sp, V, &s, err, sizeof err) == SP_OK && sp_sampler_candidates(s) == 0,
          "no top_k: candidates");
    sp_sampler_destroy(s);
    sp = sp_sampler_default_params();
    sp.top_k = 65;
    CHECK(sp_sampler_create(&sp, V, &s, err, sizeof err) == SP_OK && sp_sampler_candidates(s) == 0,
          "top_k 65: candidates");
    sp_sampler_destroy(s);
    sp = sp_sampler_default_params();
    sp.repeat_penalty = 1.1f;
    CHECK(sp_sampler_create(&sp, V, &s, err, sizeof err) == SP_OK && sp_sampler_candidates(s) == 0,
          "penalty: candidates");
    sp_sampler_destroy(s);
    printf("  %d draws, %d differ (%d changes of token)\n", draws, bad, distinct);
    CHECK(bad == 0, "%d of %d draws differ", bad, draws);
    free(row);
    free(scratch);
    end();
}

/* Sequences with their own sampling parameters, through sp_gen. */
#define CS_MAX 8
#define CS_STEPS 24

typedef struct cand_cfg {
    float temperature;
    int32_t top_k;
    float top_p, min_p, repeat_penalty;
    int32_t top_logprobs;
} cand_cfg_t;

static const cand_cfg_t cand_cfgs[] = {
    {0.0f, 40, 0.95f, 0.05f, 1.0f, -1}, /* greedy: 1 candidate */
    {0.8f, 40, 0.95f, 0.05f, 1.0f, -1}, /* the defaults: 40 */
    {1.5f, 8, 1.0f, 0.0f, 1.0f, -1},    /* 8, no top-p/min-p */
    {0.5f, 64, 0.9f, 0.1f, 1.0f, -1},   /* 64 */
    {1.0f, 0, 0.95f, 0.05f, 1.0f, -1},  /* no top-k: the row */
    {0.8f, 40, 0.95f, 0.05f, 1.1f, -1}, /* a penalty: the row */
    {0.0f, 40, 1.0f, 0.0f, 1.0f, 2},    /* log-probabilities: the row */
};
#define N_CFG ((int)(sizeof cand_cfgs / sizeof cand_cfgs[0]))

typedef struct cand_stats {
    long cand_rows, full_rows;
    uint64_t d2h;
} cand_stats_t;

/* Sequences cfg[0..n) (indexes into cand_cfgs) prefill prompts of 6..12
 * tokens together, then decode CS_STEPS steps together, each sampled by its
 * own sp_gen (seed 77 + config): the tokens into toks. */
static sp_status_t
cand_run(sp_model_t *m, const int *cfg, int n, int32_t toks[CS_MAX][CS_STEPS + 1],
         cand_stats_t *cs)
{
    sp_kv_pool_t *kv = NULL;
    sp_batch_t *b = NULL;
    sp_gen_t *gen[CS_MAX] = {NULL};
    char err[256] = "";
    memset(cs, 0, sizeof *cs);
    sp_status_t st = open_batch(m, 64, 128, CS_MAX, 128, &kv, &b, err, sizeof err);
    const int64_t V = sp_model_hparams(m)->n_vocab;
    int32_t blocks[CS_MAX][8], tok[CS_MAX], cand_k[CS_MAX];
    for (int i = 0; st == SP_OK && i < n; i++) {
        const cand_cfg_t *c = &cand_cfgs[cfg[i]];
        sp_gen_params_t gp = sp_gen_default_params();
        gp.sampling.temperature = c->temperature;
        gp.sampling.top_k = c->top_k;
        gp.sampling.top_p = c->top_p;
        gp.sampling.min_p = c->min_p;
        gp.sampling.repeat_penalty = c->repeat_penalty;
        gp.sampling.seed = 77 + (uint64_t)cfg[i];
        gp.top_logprobs = c->top_logprobs;
        gp.max_tokens = CS_STEPS + 1;
        gp.ignore_eos = true;
        st = sp_gen_create(sp_model_tokenizer(m), &gp, &gen[i], err, sizeof err);
        sp_gen_accept_prompt(gen[i], prompt + i, 6 + i);
        for (int k = 0; k < 8; k++) {
            blocks[i][k] = (int32_t)(i * 8 + k);
        }
    }
    const copies_t c0 = fake_copy_stats ? copies_now() : (copies_t){0, 0, 0, 0};
    static float row[4096];
    for (int step = 0; st == SP_OK && step <= CS_STEPS; step++) {
        sp_batch_seq_t s[CS_MAX];
        for (int i = 0; i < n; i++) {
            s[i] = step == 0 ? (sp_batch_seq_t){prompt + i, 6 + i, 0, blocks[i], 8, true, 0, NULL}
                             : (sp_batch_seq_t){&tok[i], 1, 6 + i + step - 1, blocks[i], 8, true,
                                                0, NULL};
            cand_k[i] = sp_gen_candidates(gen[i]);
        }
        st = sp_batch_eval_cand(b, kv, s, n, cand_k);
        for (int i = 0; st == SP_OK && i < n; i++) {
            const int32_t *ids;
            const float *vals;
            const int32_t k = sp_batch_candidates(b, i, &ids, &vals);
            sp_gen_token_t t;
            if (k > 0) {
                cs->cand_rows++;
                st = k == cand_k[i] ? sp_gen_step_candidates(gen[i], ids, vals, k, &t)
                                    : SP_ERR_INVALID;
            } else {
                cs->full_rows++;
                memcpy(row, sp_batch_logits(b, i), (size_t)V * sizeof(float));
                st = sp_gen_step(gen[i], row, &t);
            }
            tok[i] = toks[i][step] = t.token;
        }
    }
    if (fake_copy_stats) {
        cs->d2h = copies_now().d2h - c0.d2h;
    }
    if (st != SP_OK) {
        printf("  cand_run: status %d %s\n", st, err);
    }
    for (int i = 0; i < n; i++) {
        sp_gen_destroy(gen[i]);
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    return st;
}

static int
toks_differ(int32_t a[CS_MAX][CS_STEPS + 1], int32_t b[CS_MAX][CS_STEPS + 1], int n)
{
    int d = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k <= CS_STEPS; k++) {
            d += a[i][k] != b[i][k];
        }
    }
    return d;
}

/*
 * Through the engine: tokens sampled from candidates == tokens from the whole
 * rows on the GPU path (SAMPAN_CUDA_CANDIDATES=0) == the CPU engine's, for each
 * qualifying configuration alone (batch 1) and for all of them mixed with
 * rows that need the whole row, graphs on and off; a partial offload gives
 * no candidates (its logits are the CPU's).
 */
static void
test_candidates(void)
{
    char err[512];
    sp_model_t *cpu = load(0, err, sizeof err), *g = load(-1, err, sizeof err),
               *p = load(2, err, sizeof err);
    if (!cpu || !g || !p) {
        skip("candidates", err);
        sp_model_free(cpu);
        sp_model_free(g);
        sp_model_free(p);
        return;
    }
    static int32_t tc[CS_MAX][CS_STEPS + 1], ton[CS_MAX][CS_STEPS + 1],
        toff[CS_MAX][CS_STEPS + 1], teager[CS_MAX][CS_STEPS + 1], tpart[CS_MAX][CS_STEPS + 1];
    for (int one = 0; one <= 4; one++) {
        int cfg[CS_MAX], n;
        char name[64];
        if (one < 4) {
            cfg[0] = one;
            n = 1;
            snprintf(name, sizeof name, "candidates_batch1_cfg%d_k%d", one,
                     one == 0 ? 1 : cand_cfgs[one].top_k);
        } else {
            n = N_CFG;
            for (int i = 0; i < n; i++) {
                cfg[i] = i;
            }
            snprintf(name, sizeof name, "candidates_mixed_%d_sequences", n);
        }
        begin(name);
        cand_stats_t scpu, son, soff, seager, spart;
        CHECK(cand_run(cpu, cfg, n, tc, &scpu) == SP_OK, "cpu");
        set_graphs(true);
        CHECK(cand_run(g, cfg, n, ton, &son) == SP_OK, "gpu, candidates");
        setenv("SAMPAN_CUDA_CANDIDATES", "0", 1);
        CHECK(cand_run(g, cfg, n, toff, &soff) == SP_OK, "gpu, whole rows");
        unsetenv("SAMPAN_CUDA_CANDIDATES");
        set_graphs(false);
        CHECK(cand_run(g, cfg, n, teager, &seager) == SP_OK, "gpu eager, candidates");
        set_graphs(true);
        CHECK(cand_run(p, cfg, n, tpart, &spart) == SP_OK, "partial offload");
        const int d_off = toks_differ(ton, toff, n), d_eager = toks_differ(ton, teager, n);
        const int d_cpu = toks_differ(ton, tc, n), d_part = toks_differ(tpart, tc, n);
        printf("  rows from candidates %ld (whole %ld), d2h %llu bytes vs %llu without; tokens "
               "differing: vs whole rows %d, vs eager %d, vs CPU %d, partial vs CPU %d\n",
               son.cand_rows, son.full_rows, (unsigned long long)son.d2h,
               (unsigned long long)soff.d2h, d_off, d_eager, d_cpu, d_part);
        const long want_cand = (long)(CS_STEPS + 1) * (one < 4 ? 1 : 4);
        CHECK(son.cand_rows == want_cand && seager.cand_rows == want_cand,
              "rows from candidates: %ld (eager %ld), want %ld", son.cand_rows,
              seager.cand_rows, want_cand);
        CHECK(soff.cand_rows == 0 && scpu.cand_rows == 0 && spart.cand_rows == 0,
              "candidates with them off / on the CPU / partial: %ld %ld %ld", soff.cand_rows,
              scpu.cand_rows, spart.cand_rows);
        CHECK(son.d2h < soff.d2h, "candidates did not shrink the download");
        CHECK(d_off == 0, "%d tokens differ between candidates and whole rows", d_off);
        CHECK(d_eager == 0, "%d tokens differ between graphs and eager", d_eager);
        CHECK(d_cpu == 0, "%d tokens differ from the CPU engine's", d_cpu);
        CHECK(d_part == 0, "%d partial-offload tokens differ from the CPU's", d_part);
        end();
    }
    sp_model_free(cpu);
    sp_model_free(g);
    sp_model_free(p);
}

/* ---------------------------------------------------- two-part pool on the device */

/*
 * The sliding layers' own part of the KV pool on the device (kv.c, gpu.c):
 * gemma2/gemma3-shaped models (window 8) run five sequences to position 70,
 * far past the window, with a sliding part of GP_SWA blocks where every
 * position would need about 25. The test plays the scheduler: per step it
 * releases the sliding blocks before each row's window (-1 in the table) and
 * assigns the ones the rows write, from a LIFO free list with reference
 * counts, so freed blocks are reused at once by other sequences. Along the
 * way: a copy-on-write fork (sequence 3 from 1 mid-block: global and sliding
 * partial blocks copied), prefix reuse while the window's block is still held
 * (sequence 4 takes sequence 0's first 32 positions), and the same reuse once
 * the window moved on (refused: its sliding block was freed). Every row's
 * logits must equal the one-part pool's bit for bit (same ops, other block
 * ids) and the CPU's within logit_tol.
 */
#define GP_SEQS 5
#define GP_MAXB 8 /* blocks per sequence table: 128 positions */
#define GP_SWA 12
#define GP_STEPS 48
#define GP_ROWS (GP_STEPS * GP_SEQS + 8)

typedef struct gp_counts {
    int64_t freed;    /* sliding blocks released as windows moved */
    int64_t assigned; /* sliding blocks taken from the free list */
    int64_t max_held; /* most sliding entries one sequence held at once */
    int refused;      /* the reuse after the window moved was refused */
    int64_t rows;     /* logits rows written */
} gp_counts_t;

typedef struct gp_state {
    int64_t W, nswa; /* window; sliding blocks (0: one-part pool) */
    int bug;         /* release the window's first block too early (planted bug) */
    int32_t tab[GP_SEQS][2 * GP_MAXB]; /* global | sliding */
    bool gone[GP_SEQS][GP_MAXB];       /* (bug) released but left in the table */
    int64_t pos[GP_SEQS];
    bool live[GP_SEQS];
    int32_t ref[GP_SWA], freel[GP_SWA];
    int n_free;
    gp_counts_t c;
} gp_state_t;

static int64_t
gp_lo(const gp_state_t *s, int64_t pos)
{
    return (pos + 1 - s->W > 0 ? pos + 1 - s->W : 0) / SP_KV_BLOCK;
}

static void
gp_release(gp_state_t *s, int32_t id)
{
    if (--s->ref[id] == 0) {
        s->freel[s->n_free++] = id;
        s->c.freed++;
    }
}

/* The sliding entries of sequence q for a row of n tokens at its position:
 * those before the window released, the window's and the new ones held. */
static bool
gp_cover(gp_state_t *s, sp_kv_pool_t *kv, int q, int64_t n)
{
    if (s->nswa == 0) {
        return true;
    }
    int32_t *sw = s->tab[q] + GP_MAXB;
    const int64_t lo = gp_lo(s, s->pos[q]), hi = (s->pos[q] + n - 1) / SP_KV_BLOCK;
    for (int64_t k = 0; k < lo; k++) {
        if (sw[k] >= 0 && !s->gone[q][k]) {
            gp_release(s, sw[k]);
            sw[k] = -1;
        }
    }
    for (int64_t k = lo; k <= hi; k++) {
        if (sw[k] < 0) {
            if (s->n_free == 0) {
                return false;
            }
            sw[k] = s->freel[--s->n_free];
            s->ref[sw[k]] = 1;
            s->c.assigned++;
        }
    }
    if (s->bug && lo < s->pos[q] / SP_KV_BLOCK && sw[lo] >= 0 && !s->gone[q][lo]) {
        /* The planted bug: the window's first block released while the
         * window still reads it, left in the table. Its contents are then
         * anyone's: the copy stands for another sequence's writes (which at
         * one token a step would only reach the lanes the window no longer
         * reads). Not written by this sequence, so the step's checks cannot
         * see it; only what is read can. */
        gp_release(s, sw[lo]);
        s->gone[q][lo] = true;
        sp_kv_pool_copy_swa_block(kv, sw[lo], sw[hi]);
    }
    int64_t held = 0;
    for (int64_t k = 0; k < GP_MAXB; k++) {
        held += sw[k] >= 0 && !s->gone[q][k];
    }
    s->c.max_held = held > s->c.max_held ? held : s->c.max_held;
    return true;
}

static int32_t gp_toks[GP_SEQS][GP_MAXB * SP_KV_BLOCK];

/* One step of the sequences with n[q] > 0 tokens; their logits appended to out. */
static sp_status_t
gp_step(gp_state_t *s, sp_batch_t *b, sp_kv_pool_t *kv, const int64_t n[GP_SEQS], float *out,
        int64_t V)
{
    sp_batch_seq_t seq[GP_SEQS];
    int ns = 0;
    for (int q = 0; q < GP_SEQS; q++) {
        if (n[q] == 0) {
            continue;
        }
        if (!gp_cover(s, kv, q, n[q])) {
            return SP_ERR_NOMEM;
        }
        seq[ns++] = (sp_batch_seq_t){gp_toks[q] + s->pos[q], n[q], s->pos[q], s->tab[q],
                                     GP_MAXB, true, 0, NULL};
    }
    sp_status_t st = sp_batch_eval(b, kv, seq, ns);
    for (int i = 0; st == SP_OK && i < ns && s->c.rows < GP_ROWS; i++) {
        memcpy(out + s->c.rows++ * V, sp_batch_logits(b, i), (size_t)V * sizeof(float));
    }
    for (int q = 0; st == SP_OK && q < GP_SEQS; q++) {
        s->pos[q] += n[q];
    }
    return st;
}

/* The whole script on m with a pool of nswa sliding blocks (0: one part). */
static sp_status_t
gp_run(sp_model_t *m, int64_t nswa, int bug, float *out, gp_counts_t *cnt)
{
    const int64_t V = sp_model_hparams(m)->n_vocab;
    static gp_state_t s;
    memset(&s, 0, sizeof s);
    s.W = sp_model_hparams(m)->n_swa;
    s.nswa = nswa;
    s.bug = bug;
    for (int q = 0; q < GP_SEQS; q++) {
        for (int k = 0; k < GP_MAXB; k++) {
            s.tab[q][k] = q * GP_MAXB + k;
            s.tab[q][GP_MAXB + k] = -1;
        }
        for (int i = 0; i < GP_MAXB * SP_KV_BLOCK; i++) {
            gp_toks[q][i] = (int32_t)((q * 131 + i * 17 + 7) % V);
        }
    }
    for (int i = 0; i < nswa; i++) {
        s.freel[s.n_free++] = (int32_t)(nswa - 1 - i);
    }
    sp_kv_pool_params_t kp = {GP_SEQS * GP_MAXB + 1, SP_KV_TYPE_F32};
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_tokens = 40; /* the first step's 37 rows */
    bp.max_seqs = GP_SEQS;
    bp.max_ctx = GP_MAXB * SP_KV_BLOCK;
    bp.n_threads = 1;
    sp_kv_pool_t *kv = NULL;
    sp_batch_t *b = NULL;
    char err[256] = "";
    sp_status_t st = sp_kv_pool_create_split(m, &kp, nswa, &kv, err, sizeof err);
    if (st == SP_OK) {
        st = sp_batch_create(m, &bp, &b, err, sizeof err);
    }
    int64_t n[GP_SEQS] = {12, 20, 5, 0, 0};
    s.live[0] = s.live[1] = s.live[2] = true;
    if (st == SP_OK) {
        st = gp_step(&s, b, kv, n, out, V);
    }
    int32_t extra_g = GP_SEQS * GP_MAXB; /* the pool's last global block: the fork's copy */
    for (int t = 1; st == SP_OK && t <= GP_STEPS; t++) {
        if (t == 10) {
            /* Fork 3 from 1 (position 29: block 1 is partial). Full blocks
             * shared, the partial one copied, in both parts. */
            const int64_t p = s.pos[1], kb = p / SP_KV_BLOCK;
            s.pos[3] = p;
            memcpy(gp_toks[3], gp_toks[1], (size_t)p * sizeof(int32_t));
            for (int64_t k = 0; k < kb; k++) {
                s.tab[3][k] = s.tab[1][k];
            }
            s.tab[3][kb] = extra_g;
            sp_kv_pool_copy_block(kv, extra_g, s.tab[1][kb]);
            for (int64_t k = gp_lo(&s, p); nswa > 0 && k <= kb; k++) {
                const int32_t src = s.tab[1][GP_MAXB + k];
                if (k < kb) {
                    s.tab[3][GP_MAXB + k] = src; /* full: shared, read only */
                    s.ref[src]++;
                } else if (s.n_free > 0) {
                    const int32_t id = s.freel[--s.n_free];
                    s.ref[id] = 1;
                    s.c.assigned++;
                    sp_kv_pool_copy_swa_block(kv, id, src);
                    s.tab[3][GP_MAXB + k] = id;
                }
            }
            s.live[3] = true;
        }
        if (!s.live[4] && s.pos[0] >= 32) {
            /* Prefix reuse of 0's first 32 positions while the window of
             * position 32 (25..31, sliding block 1) is still held. */
            s.pos[4] = 32;
            memcpy(gp_toks[4], gp_toks[0], 32 * sizeof(int32_t));
            s.tab[4][0] = s.tab[0][0];
            s.tab[4][1] = s.tab[0][1];
            const int32_t sid = s.tab[0][GP_MAXB + 1];
            if (nswa > 0 && sid >= 0) {
                s.tab[4][GP_MAXB + 1] = sid;
                s.ref[sid]++;
            }
            s.live[4] = true;
        }
        if (nswa > 0 && s.pos[0] >= 48 && !s.c.refused) {
            /* The same reuse now: 0's sliding block 1 was released (-1), so a
             * step reading it must be refused before anything runs. */
            int32_t tab[2 * GP_MAXB];
            memcpy(tab, s.tab[0], sizeof tab);
            const sp_batch_seq_t e = {gp_toks[0] + 32, 1, 32, tab, GP_MAXB, true, 0, NULL};
            s.c.refused = tab[GP_MAXB + 1] < 0 && sp_batch_eval(b, kv, &e, 1) == SP_ERR_INVALID;
        }
        for (int q = 0; q < GP_SEQS; q++) {
            /* Decode steps (graphs), with a 3-token chunk of 0 every 10th (eager). */
            n[q] = !s.live[q] || s.pos[q] + 3 > GP_MAXB * SP_KV_BLOCK ? 0
                   : (q == 0 && t % 10 == 5)                           ? 3
                                                                       : 1;
        }
        st = gp_step(&s, b, kv, n, out, V);
    }
    if (st != SP_OK && !bug) {
        printf("  gpupool: status %d %s\n", st, err);
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    *cnt = s.c;
    return st;
}

static void
test_gpupool(const char *arch)
{
    char err[512], name[96];
    arch_model_t am;
    arch_build(&am, arch);
    const size_t bytes = (size_t)GP_ROWS * 512 * sizeof(float);
    float *ref = calloc(1, bytes), *one = calloc(1, bytes), *two = calloc(1, bytes);
    sp_model_t *cpu = arch_load(&am, 0, err, sizeof err);
    gp_counts_t cr, c1, c2;
    snprintf(name, sizeof name, "gpupool_%s_cpu", arch);
    begin(name);
    const bool have = ref && one && two && cpu != NULL && gp_run(cpu, 0, 0, ref, &cr) == SP_OK;
    CHECK(have, "cpu run: %s", err);
    /* The CPU's own two-part pool (done before this work) as a sanity check of the script. */
    CHECK(have && gp_run(cpu, GP_SWA, 0, two, &c2) == SP_OK &&
              memcmp(ref, two, (size_t)cr.rows * 512 * sizeof(float)) == 0,
          "the CPU's two-part pool differs from its one-part pool");
    end();
    const double tol = have ? logit_tol(cpu, false) : 0;
    const int64_t splits[] = {-1, 2, 1};
    for (size_t k = 0; have && k < sizeof splits / sizeof splits[0]; k++) {
        for (int graphs = 1; graphs >= 0; graphs--) {
            snprintf(name, sizeof name, "gpupool_%s_%s_graphs_%s", arch,
                     splits[k] < 0 ? "full" : splits[k] == 2 ? "partial2" : "partial1",
                     graphs ? "on" : "off");
            begin(name);
            set_graphs(graphs != 0);
            sp_model_t *g = arch_load(&am, splits[k], err, sizeof err);
            CHECK(g != NULL, "attach: %s", err);
            if (g != NULL && graphs) {
                /* Device bytes: each part at its own size, as the estimate counts them. */
                const sp_kv_pool_params_t kp = {GP_SEQS * GP_MAXB + 1, SP_KV_TYPE_F16};
                const int64_t L = sp_gpu_model_layers(g);
                for (int split = 0; split <= 1; split++) {
                    sp_kv_pool_t *kv = NULL;
                    const uint64_t before = sp_gpu_model_device_bytes(g);
                    CHECK(sp_kv_pool_create_split(g, &kp, split ? GP_SWA : 0, &kv, err,
                                                  sizeof err) == SP_OK, "pool: %s", err);
                    const uint64_t got = sp_gpu_model_device_bytes(g) - before;
                    const uint64_t want = sp_gpu_kv_bytes_split(g, L, kp.n_blocks,
                                                                split ? GP_SWA : 0, true);
                    CHECK(got == want, "device bytes %llu, estimate %llu",
                          (unsigned long long)got, (unsigned long long)want);
                    CHECK(!split || want < sp_gpu_kv_bytes(g, L, kp.n_blocks, true),
                          "the sliding part saves no device memory");
                    sp_kv_pool_destroy(kv);
                }
            }
            const fstats_t f0 = fstats();
            sp_status_t s1 = g ? gp_run(g, 0, 0, one, &c1) : SP_ERR_INVALID;
            sp_status_t s2 = g ? gp_run(g, GP_SWA, 0, two, &c2) : SP_ERR_INVALID;
            const fstats_t f1 = fstats();
            CHECK(s1 == SP_OK && s2 == SP_OK, "status one-part %d two-part %d", s1, s2);
            CHECK(c1.rows == cr.rows && c2.rows == cr.rows, "rows %lld %lld of %lld",
                  (long long)c1.rows, (long long)c2.rows, (long long)cr.rows);
            CHECK(s2 != SP_OK || memcmp(one, two, (size_t)cr.rows * 512 * sizeof(float)) == 0,
                  "two-part logits differ from the one-part pool's");
            double worst = 0;
            for (int64_t r = 0; s2 == SP_OK && r < cr.rows; r++) {
                worst = fmax(worst, rel_diff(ref + r * 512, two + r * 512, 512));
            }
            CHECK(worst < tol, "vs the CPU: %.3e (tolerance %.3e)", worst, tol);
            /* Every position of the run would need about 25 sliding blocks. */
            CHECK(c2.freed >= 10 && c2.assigned > GP_SWA && c2.max_held <= 3 && c2.refused,
                  "sliding blocks: freed %lld assigned %lld max held %lld refused %d",
                  (long long)c2.freed, (long long)c2.assigned, (long long)c2.max_held,
                  c2.refused);
            if (graphs) {
                CHECK(f1.launches > f0.launches, "no graph launched");
            }
            if (k == 0 && graphs) {
                printf("  %s: %lld rows, vs CPU %.2e (tolerance %.2e); sliding blocks freed %lld, "
                       "assigned %lld from %d, at most %lld held by a sequence\n",
                       arch, (long long)cr.rows, worst, tol, (long long)c2.freed,
                       (long long)c2.assigned, GP_SWA, (long long)c2.max_held);
                /* The planted bug: a block released one step early and reused by
                 * another sequence while still read. */
                gp_counts_t cb;
                float *bug = calloc(1, bytes);
                const sp_status_t sb = bug ? gp_run(g, GP_SWA, 1, bug, &cb) : SP_ERR_NOMEM;
                int64_t first = -1; /* the first row that differs */
                for (int64_t r = 0; sb == SP_OK && r < cr.rows && first < 0; r++) {
                    first = memcmp(one + r * 512, bug + r * 512, 512 * sizeof(float)) ? r : -1;
                }
                printf("  planted bug (a sliding block freed while its window reads it): "
                       "status %d, first differing row %lld of %lld\n", sb, (long long)first,
                       (long long)cr.rows);
                CHECK(bug != NULL && sb == SP_OK && first >= 0,
                      "a read of a freed sliding block went unnoticed");
                free(bug);
            }
            sp_model_free(g);
            set_graphs(true);
            end();
        }
    }
    free(ref);
    free(one);
    free(two);
    sp_model_free(cpu);
    sp_free(am.buf);
}

/* testmodel.c's temporary folder, for its inspect check (the unit runner's
 * own; never called here, where no test writes files). */
const char *
sp_test_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    return t != NULL && t[0] != '\0' ? t : "/tmp";
}

int
main(int argc, char **argv)
{
    static const char *const arch_names[] = {"qwen3",   "gemma2",  "gemma3", "smollm3",
                                             "phi3",    "granite", "olmo2",  "llama-yarn"};
    sp_log_set_level(SP_LOG_LEVEL_NONE);
    fake_path = argc > 1 ? argv[1] : NULL;
    char def[4096];
    if (fake_path == NULL) {
        /* libfake_cuda.so next to this program */
        snprintf(def, sizeof def, "%s", argv[0]);
        char *slash = strrchr(def, '/');
        snprintf(slash ? slash + 1 : def, sizeof def - (size_t)(slash ? slash + 1 - def : 0),
                 "libfake_cuda.so");
        fake_path = def;
    }
    /* The CPU engine's kernel level (SAMPAN_CPU lowers it) and the levels this
     * CPU has, by their SAMPAN_CPU names: test_cuda.py reruns at the others. */
    printf("cpu kernels: %s; levels:", sp_cpu_level_name(sp_cpu_kernels()->level));
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        if (sp_cpu_kernels_for((sp_cpu_level_t)l) != NULL) {
            printf(" %s", sp_cpu_level_name((sp_cpu_level_t)l));
        }
    }
    printf("\n");
    test_common();
    fake_handle = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
    char why[512];
    fake = fake_handle ? sp_loader_load(fake_path, why, sizeof why) : NULL;
    if (fake != NULL && argc > 2 && strcmp(argv[2], "--arch-only") == 0) {
        /* The architectures' forward pass only, against any library: on a GPU,
         * bench/gpu/run.sh gives it the real one (the other tests need the
         * emulation's fault knobs). */
        for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++) {
            test_arch(arch_names[i]);
        }
    } else if (fake == NULL) {
        skip("fake_cuda", fake_handle ? why : dlerror());
    } else {
        *(void **)&fake_fail_at = dlsym(fake_handle, "fake_cuda_fail_at");
        *(void **)&fake_set_mem = dlsym(fake_handle, "fake_cuda_set_mem");
        *(void **)&fake_set_devices = dlsym(fake_handle, "fake_cuda_set_devices");
        *(void **)&fake_set_abi = dlsym(fake_handle, "fake_cuda_set_abi");
        *(void **)&fake_fail_capture = dlsym(fake_handle, "fake_cuda_fail_capture");
        *(void **)&fake_stats = dlsym(fake_handle, "fake_cuda_stats");
        *(void **)&fake_fail_pin = dlsym(fake_handle, "fake_cuda_fail_pin");
        *(void **)&fake_pinned = dlsym(fake_handle, "fake_cuda_pinned");
        *(void **)&fake_copy_stats = dlsym(fake_handle, "fake_cuda_copy_stats");
        test_loader();
        test_forward();
        test_batch();
        test_embed();
        test_graph_single();
        test_graph_multi();
        test_graph_rebuild();
        test_graph_capture_failure();
        test_graph_fault();
        test_native();
        test_errors();
        test_kv_q8_refused();
        test_pinned();
        test_candidates();
        for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++) {
            test_arch(arch_names[i]);
        }
        test_gpupool("gemma2");
        test_gpupool("gemma3");
    }
    test_sampler_candidates();
    printf("test_cuda_host: %d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
