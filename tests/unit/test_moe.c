/*
 * test_moe.c - the mixture-of-experts block (engine/moe.c): routing (top-k,
 * ties, the gating variants), the block on hand-made rows (each row's output
 * the same bits alone and beside rows choosing the same, overlapping or
 * disjoint experts, with 1 and 2 threads), whole MoE models in the batched
 * forward pass (a sequence alone and beside 31 others: bit-identical logits;
 * a prefill longer than one MoE pass equal to one-token decode), and the
 * loader's refusals of broken MoE files.
 */
#include "test.h"
#include "invariance.h"

#include <math.h>

#include "core/alloc.h"
#include "core/pool.h"
#include "engine/batch.h"
#include "engine/gpu.h"
#include "engine/lora.h"
#include "engine/model.h"
#include "engine/model_impl.h"
#include "engine/moe.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"

#define DEMO "models/stories260K.gguf"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t
rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float
rng_f(float amp)
{
    return amp * ((float)(rng_u32() & 0xffff) / 32768.0f - 1.0f);
}

/* ---- routing ----------------------------------------------------------------- */

static sp_moe_hparams_t
route_hp(int64_t n, int64_t k, sp_moe_gating_t g, bool norm, float scale)
{
    sp_moe_hparams_t hp;
    memset(&hp, 0, sizeof hp);
    hp.n_expert = n;
    hp.n_expert_used = k;
    hp.gating = g;
    hp.norm_w = norm;
    hp.w_scale = scale;
    return hp;
}

TEST(moe_route_topk_ties_lower_id)
{
    float probs[8], w[8];
    int32_t ids[8];
    /* 1 and 5 tie for first, 2 and 6 for third: ranks go by value, then id. */
    const float lg[8] = {0.1f, 2.0f, 1.0f, -3.0f, 0.5f, 2.0f, 1.0f, 0.0f};
    sp_moe_hparams_t hp = route_hp(8, 4, SP_MOE_GATING_SOFTMAX, false, 0.0f);
    sp__moe_route(&hp, lg, probs, ids, w);
    ASSERT(ids[0] == 1 && ids[1] == 5 && ids[2] == 2 && ids[3] == 6);
    ASSERT(w[0] == w[1] && w[2] == w[3] && w[0] > w[2]);
    /* Unnormalised softmax weights: the full softmax's probabilities. */
    double z = 0;
    for (int e = 0; e < 8; e++) z += exp((double)lg[e] - 2.0);
    ASSERT(fabs(w[0] - 1.0 / z) < 1e-6 && fabs(w[2] - exp(-1.0) / z) < 1e-6);
    /* All equal: 0, 1, 2. */
    const float flat[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    hp.n_expert_used = 3;
    sp__moe_route(&hp, flat, probs, ids, w);
    ASSERT(ids[0] == 0 && ids[1] == 1 && ids[2] == 2);
    /* A NaN logit never wins over numbers, and k distinct ids always come back. */
    const float withnan[4] = {NAN, 1.0f, NAN, 0.5f};
    sp_moe_hparams_t h4 = route_hp(4, 3, SP_MOE_GATING_SOFTMAX_WEIGHT, false, 0.0f);
    sp__moe_route(&h4, withnan, probs, ids, w);
    ASSERT(ids[0] == 1 && ids[1] == 3 && (ids[2] == 0 || ids[2] == 2));
}

TEST(moe_route_gating_variants)
{
    float probs[6], w[6];
    int32_t ids[6];
    const float lg[6] = {0.3f, -1.0f, 1.5f, 0.9f, 0.2f, -0.4f};
    /* softmax, top-2, normalised (Mixtral, qwen3moe): w = p_i / (p_2 + p_3). */
    sp_moe_hparams_t hp = route_hp(6, 2, SP_MOE_GATING_SOFTMAX, true, 0.0f);
    sp__moe_route(&hp, lg, probs, ids, w);
    ASSERT(ids[0] == 2 && ids[1] == 3);
    const double a = exp(1.5), b = exp(0.9);
    ASSERT(fabs(w[0] - a / (a + b)) < 1e-6 && fabs(w[1] - b / (a + b)) < 1e-6);
    /* top-k then softmax over the k (gpt-oss): the same numbers here, through
     * the other order; unnormalised softmax would differ. */
    hp.gating = SP_MOE_GATING_SOFTMAX_WEIGHT;
    hp.norm_w = false;
    float w2[6];
    sp__moe_route(&hp, lg, probs, ids, w2);
    ASSERT(ids[0] == 2 && ids[1] == 3);
    ASSERT(fabs(w2[0] - a / (a + b)) < 1e-6 && fabs(w2[1] - b / (a + b)) < 1e-6);
    hp.gating = SP_MOE_GATING_SOFTMAX;
    sp__moe_route(&hp, lg, probs, ids, w2);
    double z = 0;
    for (int e = 0; e < 6; e++) z += exp((double)lg[e]);
    ASSERT(fabs(w2[0] - a / z) < 1e-6 && fabs(w2[1] - b / z) < 1e-6);
    /* A scale multiplies after normalising; 0 and 1 mean none. */
    hp.norm_w = true;
    hp.w_scale = 2.5f;
    sp__moe_route(&hp, lg, probs, ids, w2);
    ASSERT(fabs(w2[0] - 2.5 * a / (a + b)) < 1e-5);
    hp.w_scale = 1.0f;
    sp__moe_route(&hp, lg, probs, ids, w2);
    ASSERT(w2[0] == w[0] && w2[1] == w[1]);
    /* k = n: every expert, weights summing to one. */
    hp = route_hp(6, 6, SP_MOE_GATING_SOFTMAX, true, 0.0f);
    sp__moe_route(&hp, lg, probs, ids, w2);
    float s = 0;
    for (int j = 0; j < 6; j++) s += w2[j];
    ASSERT(fabs(s - 1.0f) < 1e-6 && ids[0] == 2 && ids[5] == 1);
}

/* ---- models built in memory ---------------------------------------------------- */

#define MAX_BUFS 128
static void *bufs[MAX_BUFS];
static int n_bufs;

/* A tensor of n_exp x n_out rows of n_in random values (amp), in type. */
static void
add_t(sp_gguf_writer_t *w, const char *name, sp_type_t type, int n_dims, int64_t n_in,
      int64_t n_out, int64_t n_exp, float amp, float bias)
{
    const int64_t ne[3] = {n_in, n_out, n_exp};
    const int64_t rows = n_out * n_exp;
    const size_t row = sp_row_size(type, n_in);
    float *src = sp_malloc((size_t)n_in * sizeof(float));
    char *data = sp_malloc(row * (size_t)rows);
    ASSERT(src && data && n_bufs < MAX_BUFS);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n_in; i++) src[i] = bias + rng_f(amp);
        if (type == SP_TYPE_F32) {
            memcpy(data + (size_t)r * row, src, (size_t)n_in * sizeof(float));
        } else {
            ASSERT(sp_quantize_row(type, src, data + (size_t)r * row, n_in));
        }
    }
    sp_free(src);
    bufs[n_bufs++] = data;
    ASSERT_OK(sp_gguf_writer_add_tensor(w, name, type, n_dims, ne, data));
}

typedef struct moe_spec {
    const char *arch;     /* "llama" or "qwen2moe" */
    sp_type_t wtype;      /* expert and attention matrices */
    int64_t n_expert, n_used;
    int64_t ff_shexp;     /* qwen2moe */
    /* faults for the refusal tests */
    int64_t used_override;    /* > 0: write this expert_used_count */
    int64_t bad_up_ne2;       /* > 0: blk.1.ffn_up_exps has this many experts */
    bool drop_router;         /* no blk.0.ffn_gate_inp */
    bool legacy;              /* layer 0's gate experts as blk.0.ffn_gate.E.weight (pre-2024) */
} moe_spec_t;

#define ME 64
#define MH 4
#define MHKV 2
#define MFF 96
#define MNL 2

/* Build a MoE model with the demo's tokenizer; returns the GGUF buffer (the
 * caller frees it after the model) and the load status, err filled. */
static sp_status_t
build_moe(const moe_spec_t *sp, sp_model_t **out, void **buf, char *err, size_t err_len)
{
    sp_gguf_t *demo, *g;
    sp_gguf_writer_t *w;
    size_t len;
    const char *a = sp->arch;
    char key[128];
    ASSERT_OK(sp_gguf_open(DEMO, &demo, err, err_len));
    const int64_t V = 512;
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", a));
#define KV(suffix, v)                                                   \
    snprintf(key, sizeof key, "%s.%s", a, suffix);                      \
    ASSERT_OK(sp_gguf_writer_set_u32(w, key, (uint32_t)(v)))
    KV("context_length", 512);
    KV("embedding_length", ME);
    KV("feed_forward_length", MFF);
    KV("block_count", MNL);
    KV("attention.head_count", MH);
    KV("attention.head_count_kv", MHKV);
    KV("expert_count", sp->n_expert);
    KV("expert_used_count", sp->used_override > 0 ? sp->used_override : sp->n_used);
    if (sp->ff_shexp > 0) {
        KV("expert_feed_forward_length", MFF / 2);
        KV("expert_shared_feed_forward_length", sp->ff_shexp);
    }
#undef KV
    const int64_t FE = sp->ff_shexp > 0 ? MFF / 2 : MFF, HD = ME / MH;
    n_bufs = 0;
    rng_state = 0x5eed5eedull;
    add_t(w, "token_embd.weight", SP_TYPE_F32, 2, ME, V, 1, 1.0f, 0.0f);
    add_t(w, "output.weight", SP_TYPE_F32, 2, ME, V, 1, 0.3f, 0.0f);
    add_t(w, "output_norm.weight", SP_TYPE_F32, 1, ME, 1, 1, 0.2f, 1.0f);
    for (int64_t l = 0; l < MNL; l++) {
        char name[96];
#define T(suffix, type, nd, n_in, n_out, n_exp, amp, bias)                       \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);             \
    add_t(w, name, type, nd, n_in, n_out, n_exp, amp, bias)
        T("attn_norm.weight", SP_TYPE_F32, 1, ME, 1, 1, 0.2f, 1.0f);
        T("attn_q.weight", sp->wtype, 2, ME, MH * HD, 1, 0.2f, 0.0f);
        T("attn_k.weight", sp->wtype, 2, ME, MHKV * HD, 1, 0.2f, 0.0f);
        T("attn_v.weight", sp->wtype, 2, ME, MHKV * HD, 1, 0.2f, 0.0f);
        T("attn_output.weight", sp->wtype, 2, MH * HD, ME, 1, 0.1f, 0.0f);
        T("ffn_norm.weight", SP_TYPE_F32, 1, ME, 1, 1, 0.2f, 1.0f);
        if (!(sp->drop_router && l == 0)) {
            T("ffn_gate_inp.weight", SP_TYPE_F32, 2, ME, sp->n_expert, 1, 0.5f, 0.0f);
        }
        if (sp->legacy && l == 0) {
            for (int64_t e = 0; e < sp->n_expert; e++) {
                char en[64];
                snprintf(en, sizeof en, "ffn_gate.%lld.weight", (long long)e);
                T(en, sp->wtype, 2, ME, FE, 1, 0.2f, 0.0f);
            }
        } else {
            T("ffn_gate_exps.weight", sp->wtype, 3, ME, FE, sp->n_expert, 0.2f, 0.0f);
        }
        T("ffn_up_exps.weight", sp->wtype, 3, ME, FE,
          sp->bad_up_ne2 > 0 && l == 1 ? sp->bad_up_ne2 : sp->n_expert, 0.2f, 0.0f);
        T("ffn_down_exps.weight", sp->wtype, 3, FE, ME, sp->n_expert, 0.1f, 0.0f);
        if (sp->ff_shexp > 0) {
            T("ffn_gate_inp_shexp.weight", SP_TYPE_F32, 1, ME, 1, 1, 0.3f, 0.0f);
            T("ffn_gate_shexp.weight", sp->wtype, 2, ME, sp->ff_shexp, 1, 0.2f, 0.0f);
            T("ffn_up_shexp.weight", sp->wtype, 2, ME, sp->ff_shexp, 1, 0.2f, 0.0f);
            T("ffn_down_shexp.weight", sp->wtype, 2, sp->ff_shexp, ME, 1, 0.1f, 0.0f);
        }
#undef T
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, &len, err, err_len));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < n_bufs; i++) sp_free(bufs[i]);
    ASSERT_OK(sp_gguf_open_mem(*buf, len, "moe-test.gguf", &g, err, err_len));
    return sp_model_load_gguf(g, out, err, err_len);
}

/* Logits after every position of toks, the sequence alone in an sp_ctx. */
static float *
alone_logits(const sp_model_t *m, const int32_t *toks, int64_t n, int n_batch, int threads)
{
    char err[512];
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 512;
    cp.n_batch = n_batch;
    cp.n_threads = threads;
    cp.logits_all = true;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    if (n_batch == 1) {
        for (int64_t i = 0; i < n; i++) ASSERT_OK(sp_ctx_eval(c, toks + i, 1, i));
    } else {
        ASSERT_OK(sp_ctx_eval(c, toks, n, 0));
    }
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *o = sp_malloc((size_t)(n * V) * sizeof(float));
    memcpy(o, sp_ctx_logits_all(c), (size_t)(n * V) * sizeof(float));
    sp_ctx_destroy(c);
    return o;
}

/* ---- the block on hand-made rows ---------------------------------------------- */

/* Rows whose router logits we choose: a model whose router is replaced by a
 * one-hot matrix (expert e reads input column e), so row x picks the experts
 * of its largest x[0..n_expert). */
TEST(moe_block_rows_alone_equal_rows_together)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    moe_spec_t sp = {"llama", SP_TYPE_Q8_0, 8, 2, 0, 0, 0, false, false};
    if (build_moe(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    ASSERT(m->moe != NULL && m->moe->hp.n_expert == 8 && m->moe->hp.n_expert_used == 2);
    static float onehot[8 * ME];
    memset(onehot, 0, sizeof onehot);
    for (int e = 0; e < 8; e++) onehot[e * ME + e] = 1.0f;
    sp_moe_layer_t *L = &m->moe->layers[0];
    const sp_experts_t saved = L->router;
    L->router.data = onehot; /* F32 (8, ME): same type and shape as loaded */
    ASSERT(L->router.type == SP_TYPE_F32);

    enum { NR = 40 };
    static float x[NR * ME], y[NR * ME], y1[ME], ys[NR * ME];
    rng_state = 99;
    for (int r = 0; r < NR; r++) {
        for (int i = 0; i < ME; i++) x[r * ME + i] = rng_f(1.0f);
        /* experts: rows 0-9 choose {0,1}; 10-19 {1,2} (overlap); 20-29 {4,5}
         * (disjoint from the first); 30-39 spread. */
        const int a = r < 10 ? 0 : r < 20 ? 1 : r < 30 ? 4 : r % 8, b = r < 30 ? a + 1 : (r + 3) % 8;
        for (int e = 0; e < 8; e++) x[r * ME + e] = -2.0f;
        x[r * ME + a] = 3.0f + rng_f(0.5f);
        x[r * ME + b] = 2.0f + rng_f(0.5f);
    }
    const size_t sb = sp__moe_scratch_bytes(m, NR);
    ASSERT(sb > 0);
    void *scratch = sp_malloc_aligned(sb, 64);
    ASSERT(scratch != NULL);
    for (int th = 1; th <= 2; th++) {
        sp_pool_t *pool;
        ASSERT_OK(sp_pool_create(th, &pool));
        const sp_cpu_kernels_t *k = sp_cpu_kernels();
        sp__moe_ffn(m, 0, pool, k, scratch, NR, x, y, NR);
        for (int r = 0; r < NR; r++) {
            sp__moe_ffn(m, 0, pool, k, scratch, NR, x + r * ME, y1, 1);
            if (memcmp(y1, y + r * ME, sizeof y1) != 0) {
                SP_TEST_FAIL("threads %d: row %d alone differs from the row among %d", th, r, NR);
            }
        }
        /* A subset in another order: rows 25, 3, 12 (disjoint, and overlapping
         * through expert 1). */
        const int pick[3] = {25, 3, 12};
        for (int i = 0; i < 3; i++) memcpy(ys + i * ME, x + pick[i] * ME, sizeof y1);
        sp__moe_ffn(m, 0, pool, k, scratch, NR, ys, ys + 3 * ME, 3);
        for (int i = 0; i < 3; i++) {
            ASSERT(memcmp(ys + (3 + i) * ME, y + pick[i] * ME, sizeof y1) == 0);
        }
        sp_pool_destroy(pool);
    }
    /* The output is the experts' weighted sum: a row's result changes when
     * its second expert changes (the test can fail). */
    memcpy(ys, x, sizeof y1);
    ys[1] = -2.0f;
    ys[7] = 2.5f;
    sp_pool_t *pool;
    ASSERT_OK(sp_pool_create(1, &pool));
    sp__moe_ffn(m, 0, pool, sp_cpu_kernels(), scratch, NR, ys, y1, 1);
    ASSERT(memcmp(y1, y, sizeof y1) != 0);
    sp_pool_destroy(pool);
    sp_free(scratch);
    L->router = saved;
    sp_model_free(m);
    sp_free(buf);
}

/* ---- whole models: one sequence beside 31 others ------------------------------ */

static void
beside_others(const moe_spec_t *spec)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    if (build_moe(spec, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    sp_test_beside_others(m, SP_KV_TYPE_F32, 12, 7, 4242, spec->arch);
    sp_model_free(m);
    sp_free(buf);
}

TEST(moe_batch_invariance_mixtral_q8_0)
{
    moe_spec_t sp = {"llama", SP_TYPE_Q8_0, 8, 2, 0, 0, 0, false, false};
    beside_others(&sp);
}

TEST(moe_batch_invariance_qwen2moe_shared_f32)
{
    moe_spec_t sp = {"qwen2moe", SP_TYPE_F32, 8, 4, 80, 0, 0, false, false};
    beside_others(&sp);
}

/* A prefill of 300 rows (two MoE passes of at most 256 rows) equals decoding
 * the same tokens one at a time, bit for bit. */
TEST(moe_long_prefill_equals_decode)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    moe_spec_t sp = {"llama", SP_TYPE_Q8_0, 4, 2, 0, 0, 0, false, false};
    if (build_moe(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    enum { N = 300 };
    static int32_t toks[N];
    rng_state = 7;
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(1 + rng_u32() % 511);
    float *pre = alone_logits(m, toks, N, 512, 2);
    float *dec = alone_logits(m, toks, N, 1, 1);
    ASSERT(memcmp(pre, dec, (size_t)N * 512 * sizeof(float)) == 0);
    sp_free(pre);
    sp_free(dec);
    sp_model_free(m);
    sp_free(buf);
}

/* ---- refusals -------------------------------------------------------------------- */

static void
expect_refused(const moe_spec_t *sp, const char *needle)
{
    char err[512] = "";
    void *buf;
    sp_model_t *m = NULL;
    sp_status_t st = build_moe(sp, &m, &buf, err, sizeof err);
    if (st == SP_OK || m != NULL || strstr(err, needle) == NULL ||
        strstr(err, "moe-test.gguf") == NULL) {
        SP_TEST_FAIL("expected a refusal naming '%s', got status %d: %s", needle, (int)st, err);
    }
    sp_free(buf);
}

TEST(moe_load_refusals)
{
    moe_spec_t sp = {"llama", SP_TYPE_F32, 8, 2, 0, 0, 0, false, false};
    sp.used_override = 9;
    expect_refused(&sp, "expert_used_count");
    sp.used_override = 0;
    sp.bad_up_ne2 = 7;
    expect_refused(&sp, "blk.1.ffn_up_exps.weight");
    sp.bad_up_ne2 = 0;
    sp.drop_router = true;
    expect_refused(&sp, "blk.0.ffn_gate_inp.weight");
    sp.drop_router = false;
    sp.legacy = true;
    expect_refused(&sp, "pre-2024 layout");
    /* qwen2moe without experts is refused (expert_count 1). */
    moe_spec_t q = {"qwen2moe", SP_TYPE_F32, 1, 1, 80, 0, 0, false, false};
    expect_refused(&q, "expert_count");
    /* llama with expert_count 1 is dense: it then needs the dense FFN. */
    moe_spec_t d = {"llama", SP_TYPE_F32, 1, 1, 0, 0, 0, false, false};
    expect_refused(&d, "blk.0.ffn_gate.weight");
}

/* ---- gpt-oss's variant: top-k then softmax, biases, clamped SwiGLU ------------- */

/* The block against a double-precision loop written from the definition:
 * logits = R x + rb; the k largest; w = softmax over those k; per expert
 * g = G_e x + gb_e, u = U_e x + ub_e, a = min(g, 7) sigmoid(1.702 min(g, 7))
 * (clamp(u, -7, 7) + 1), y_e = D_e a + db_e; out = sum w_e y_e. F32 weights:
 * the block's float32 sums of 64-96 products differ from double by about
 * 1e-6 relative, so 1e-4 of the output's largest magnitude is a safe bound
 * (a wrong bias, clamp or gating changes the output by O(1e-1) or more). */
TEST(moe_block_oai_swiglu_biases_softmax_weight)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    moe_spec_t sp = {"llama", SP_TYPE_F32, 8, 3, 0, 0, 0, false, false};
    if (build_moe(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    struct sp_moe_model *moe = m->moe;
    moe->hp.gating = SP_MOE_GATING_SOFTMAX_WEIGHT;
    moe->hp.norm_w = false;
    moe->hp.act = SP_MOE_ACT_SWIGLU_OAI;
    const int64_t NE = 8, K = 3, F = MFF;
    static float rb[8], gb[8 * MFF], ub[8 * MFF], db[8 * ME];
    rng_state = 31337;
    for (int i = 0; i < 8; i++) rb[i] = rng_f(0.5f);
    for (int i = 0; i < 8 * MFF; i++) gb[i] = rng_f(8.0f), ub[i] = rng_f(8.0f);
    for (int i = 0; i < 8 * ME; i++) db[i] = rng_f(0.5f);
    sp_moe_layer_t *L = &moe->layers[1];
    L->router_b = rb;
    L->gate_b = gb;
    L->up_b = ub;
    L->down_b = db;
    enum { NR = 6 };
    static float x[NR * ME], y[NR * ME];
    for (int i = 0; i < NR * ME; i++) x[i] = rng_f(3.0f); /* large: the clamps bite */
    sp_pool_t *pool;
    ASSERT_OK(sp_pool_create(2, &pool));
    void *scratch = sp_malloc_aligned(sp__moe_scratch_bytes(m, NR), 64);
    sp__moe_ffn(m, 1, pool, sp_cpu_kernels(), scratch, NR, x, y, NR);
    const float *R = L->router.data, *G = L->gate.data, *U = L->up.data, *D = L->down.data;
    int clamped = 0;
    for (int r = 0; r < NR; r++) {
        const float *xr = x + r * ME;
        double lg[8], want[ME], amax = 0, dmax = 0;
        for (int e = 0; e < NE; e++) {
            lg[e] = rb[e];
            for (int i = 0; i < ME; i++) lg[e] += (double)R[e * ME + i] * xr[i];
        }
        int ids[3];
        bool used[8] = {false};
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < NE; e++) {
                if (!used[e] && (best < 0 || lg[e] > lg[best])) best = e;
            }
            used[best] = true;
            ids[j] = best;
        }
        double w[3], z = 0;
        for (int j = 0; j < K; j++) z += exp(lg[ids[j]] - lg[ids[0]]);
        for (int j = 0; j < K; j++) w[j] = exp(lg[ids[j]] - lg[ids[0]]) / z;
        memset(want, 0, sizeof want);
        for (int j = 0; j < K; j++) {
            const int e = ids[j];
            double a[MFF];
            for (int f = 0; f < F; f++) {
                double g = gb[e * F + f], u = ub[e * F + f];
                for (int i = 0; i < ME; i++) {
                    g += (double)G[((size_t)e * F + f) * ME + i] * xr[i];
                    u += (double)U[((size_t)e * F + f) * ME + i] * xr[i];
                }
                clamped += g > 7.0 || u > 7.0 || u < -7.0;
                g = g < 7.0 ? g : 7.0;
                u = u < -7.0 ? -7.0 : (u > 7.0 ? 7.0 : u);
                a[f] = g / (1.0 + exp(-1.702 * g)) * (u + 1.0);
            }
            for (int o = 0; o < ME; o++) {
                double v = db[e * ME + o];
                for (int f = 0; f < F; f++) v += (double)D[((size_t)e * ME + o) * F + f] * a[f];
                want[o] += w[j] * v;
            }
        }
        for (int o = 0; o < ME; o++) {
            amax = fabs(want[o]) > amax ? fabs(want[o]) : amax;
            const double d = fabs(want[o] - y[r * ME + o]);
            dmax = d > dmax ? d : dmax;
        }
        if (!(dmax <= 1e-4 * amax)) {
            SP_TEST_FAIL("row %d: max |block - reference| %g over 1e-4 x %g", r, dmax, amax);
        }
    }
    ASSERT(clamped > 0); /* the data exercised the clamps */
    sp_free(scratch);
    sp_pool_destroy(pool);
    sp_model_free(m);
    sp_free(buf);
}

/* ---- LoRA adapters on a MoE model ------------------------------------------------ */

/* An adapter of layer 0's proj (n_in -> n_out, rank 2) loaded against m. */
static sp_status_t
adapter_on(const sp_model_t *m, const char *proj, int64_t n_in, int64_t n_out, char *err,
           size_t err_len)
{
    sp_gguf_writer_t *w;
    static float a[2 * 256], b[2 * 256];
    char na[96], nb[96];
    for (int i = 0; i < 512; i++) a[i] = b[i] = 0.01f * (float)(i % 7);
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", "llama"));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.type", "adapter"));
    ASSERT_OK(sp_gguf_writer_set_str(w, "adapter.type", "lora"));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "adapter.lora.alpha", 2.0f));
    const int64_t ne_a[2] = {n_in, 2}, ne_b[2] = {2, n_out};
    snprintf(na, sizeof na, "blk.0.%s.weight.lora_a", proj);
    snprintf(nb, sizeof nb, "blk.0.%s.weight.lora_b", proj);
    ASSERT_OK(sp_gguf_writer_add_tensor(w, na, SP_TYPE_F32, 2, ne_a, a));
    ASSERT_OK(sp_gguf_writer_add_tensor(w, nb, SP_TYPE_F32, 2, ne_b, b));
    void *buf;
    size_t len;
    ASSERT_OK(sp_gguf_writer_write_mem(w, &buf, &len, err, err_len));
    sp_gguf_writer_destroy(w);
    sp_gguf_t *g;
    ASSERT_OK(sp_gguf_open_mem(buf, len, "adapter.gguf", &g, err, err_len));
    sp_lora_t *l = NULL;
    sp_status_t st = sp_lora_load_gguf(m, g, &l, err, err_len);
    sp_lora_release(l);
    sp_gguf_close(g);
    sp_free(buf);
    return st;
}

TEST(moe_lora_ffn_adapter_refused_attention_adapter_loads)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    moe_spec_t sp = {"llama", SP_TYPE_F32, 8, 2, 0, 0, 0, false, false};
    if (build_moe(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    ASSERT(adapter_on(m, "ffn_up", ME, MFF, err, sizeof err) != SP_OK);
    ASSERT(strstr(err, "mixture-of-experts") != NULL && strstr(err, "blk.0.ffn_up") != NULL);
    if (adapter_on(m, "attn_q", ME, ME, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    sp_model_free(m);
    sp_free(buf);
}

/* GPU offload keeps a MoE model on the CPU: attach succeeds without binding
 * a layer (the CUDA path has no MoE block), before touching the device API. */
TEST(moe_gpu_attach_keeps_model_on_cpu)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    moe_spec_t sp = {"llama", SP_TYPE_F32, 8, 2, 0, 0, 0, false, false};
    if (build_moe(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    sp_cuda_api_t never_called;
    memset(&never_called, 0, sizeof never_called); /* a NULL op would crash if used */
    ASSERT_OK(sp_gpu_attach(m, &never_called, 0, -1, err, sizeof err));
    ASSERT(m->gpu == NULL && sp_gpu_model_layers(m) == 0);
    sp_model_free(m);
    sp_free(buf);
}
