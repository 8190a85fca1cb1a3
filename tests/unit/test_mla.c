/*
 * test_mla.c - the deepseek2 architecture (multi-head latent attention) as the
 * loader reads it and the batched forward pass runs it: what loads (the latent
 * cache's head, the split and the legacy fused key/value up-projections, the
 * leading dense layer, the routing keys), batch invariance of a whole model
 * (a sequence alone and beside 31 others: bit-identical logits, with F32 and
 * Q8_0 caches), the two up-projection forms giving the same model, the GPU
 * refusal by name, and the refusals of broken files (file and tensor or key
 * named). The logits themselves are checked against the float64 reference in
 * tests/py/test_mla.py and against llama.cpp in tests/py/test_llamacpp.py.
 * Single-threaded test; models are built in memory and freed by each test.
 */
#include "test.h"
#include "invariance.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "engine/batch.h"
#include "engine/gpu.h"
#include "engine/mla.h"
#include "engine/model.h"
#include "engine/model_impl.h"
#include "engine/moe.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"

#define DEMO "models/stories260K.gguf"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

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

#define ME 64    /* embedding */
#define MH 4     /* heads */
#define MR 64    /* kv_lora_rank */
#define MROT 16  /* RoPE dims */
#define MNOPE 32 /* no-RoPE dims per head */
#define MQK (MNOPE + MROT)
#define MVD 32   /* value width per head */
#define MQL 32   /* q_lora_rank */
#define MFF 64   /* dense FFN width (layer 0) */
#define MFE 32   /* expert width */
#define MNE 8
#define MK 2
#define MNL 3
#define MV 512

#define MAX_BUFS 96
static void *bufs[MAX_BUFS];
static int n_bufs;

typedef struct mla_spec {
    const char *drop;   /* omit this tensor */
    const char *widen;  /* this tensor gets one more element per row */
    bool legacy;        /* the fused attn_kv_b instead of attn_k_b / attn_v_b */
    bool bad_key_len;   /* key_length not kv_lora_rank + rope dims */
    bool no_kv_lora;    /* no attention.kv_lora_rank */
    int gating;         /* expert_gating_func */
    bool nextn;         /* one multi-token-prediction block after the trunk (no tensors:
                           a trunk-only file) */
    uint64_t seed;
} mla_spec_t;

/* n_mat matrices of n_out rows of n_in; `vals` (n_in * n_out * n_mat floats,
 * or NULL for random ones) in the order of the file. */
static void
add_t(sp_gguf_writer_t *w, const mla_spec_t *sp, const char *name, sp_type_t type, int n_dims,
      int64_t n_in, int64_t n_out, int64_t n_mat, float amp, float bias, const float *vals)
{
    if (sp->drop != NULL && strcmp(sp->drop, name) == 0) {
        return;
    }
    if (sp->widen != NULL && strcmp(sp->widen, name) == 0) {
        n_in += type == SP_TYPE_F32 ? 1 : 32;
        vals = NULL; /* random values of the wrong width */
    }
    const int64_t ne[3] = {n_in, n_out, n_mat};
    const int64_t rows = n_out * n_mat;
    const size_t row = sp_row_size(type, n_in);
    float *src = sp_malloc((size_t)n_in * sizeof(float));
    char *data = sp_malloc(row * (size_t)rows);
    ASSERT(src && data && n_bufs < MAX_BUFS);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n_in; i++) {
            src[i] = vals != NULL ? vals[r * n_in + i] : bias + rng_f(amp);
        }
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

/* A deepseek2 model with the demo's tokenizer: q through q_lora, latent
 * attention (Q8_0 projections, F32 up-projections), layer 0 dense, then 8
 * experts (top-2, sigmoid gating by default, selection bias, 4 groups of 2
 * with 2 used, normalised and scaled weights) and one shared expert; YaRN x4
 * with a log multiplier. The key/value up-projections come from one set of
 * values in either file form. *buf is the GGUF image (freed by the caller
 * after the model). */
static sp_status_t
build_mla(const mla_spec_t *sp, sp_model_t **out, void **buf, char *err, size_t err_len)
{
    sp_gguf_t *demo, *g;
    sp_gguf_writer_t *w;
    size_t len;
    ASSERT_OK(sp_gguf_open(DEMO, &demo, err, err_len));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    const char *a = "deepseek2";
    char key[128];
#define U32(suffix, v)                                                   \
    snprintf(key, sizeof key, "%s.%s", a, suffix);                       \
    ASSERT_OK(sp_gguf_writer_set_u32(w, key, (uint32_t)(v)))
#define F32(suffix, v)                                                   \
    snprintf(key, sizeof key, "%s.%s", a, suffix);                       \
    ASSERT_OK(sp_gguf_writer_set_f32(w, key, (float)(v)))
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", a));
    U32("context_length", 512);
    U32("embedding_length", ME);
    U32("feed_forward_length", MFF);
    U32("expert_feed_forward_length", MFE);
    U32("block_count", MNL + (sp->nextn ? 1 : 0));
    if (sp->nextn) {
        U32("nextn_predict_layers", 1);
    }
    U32("attention.head_count", MH);
    U32("attention.head_count_kv", sp->legacy ? MH : 1);
    U32("attention.q_lora_rank", MQL);
    if (!sp->no_kv_lora) {
        U32("attention.kv_lora_rank", MR);
    }
    if (sp->legacy) {
        U32("attention.key_length", MQK);
        U32("attention.value_length", MVD);
    } else {
        U32("attention.key_length", MR + MROT + (sp->bad_key_len ? 2 : 0));
        U32("attention.value_length", MR);
        U32("attention.key_length_mla", MQK);
        U32("attention.value_length_mla", MVD);
    }
    U32("rope.dimension_count", MROT);
    F32("rope.freq_base", 10000.0);
    F32("attention.layer_norm_rms_epsilon", 1e-6);
    U32("leading_dense_block_count", 1);
    U32("expert_count", MNE);
    U32("expert_used_count", MK);
    U32("expert_shared_count", 1);
    U32("expert_gating_func", sp->gating ? sp->gating : 2);
    U32("expert_group_count", 4);
    U32("expert_group_used_count", 2);
    F32("expert_weights_scale", 2.5);
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    ASSERT_OK(sp_gguf_writer_set_bool(w, key, true));
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    ASSERT_OK(sp_gguf_writer_set_str(w, key, "yarn"));
    F32("rope.scaling.factor", 4.0);
    U32("rope.scaling.original_context_length", 64);
    F32("rope.scaling.yarn_log_multiplier", 0.0707);
#undef U32
#undef F32
    n_bufs = 0;
    rng_state = sp->seed ? sp->seed : 0x5eed0d5eull;
    add_t(w, sp, "token_embd.weight", SP_TYPE_F32, 2, ME, MV, 1, 1.0f, 0.0f, NULL);
    add_t(w, sp, "output.weight", SP_TYPE_F32, 2, ME, MV, 1, 0.3f, 0.0f, NULL);
    add_t(w, sp, "output_norm.weight", SP_TYPE_F32, 1, ME, 1, 1, 0.2f, 1.0f, NULL);
    float *wk = sp_malloc((size_t)MH * MR * MNOPE * sizeof(float)); /* [h][j][d] */
    float *wv = sp_malloc((size_t)MH * MVD * MR * sizeof(float));   /* [h][i][j] */
    float *kvb = sp_malloc((size_t)MH * (MNOPE + MVD) * MR * sizeof(float));
    ASSERT(wk && wv && kvb);
    for (int64_t l = 0; l < MNL; l++) {
        char name[96];
#define T(suffix, type, nd, n_in, n_out, n_mat, amp, bias, vals)                     \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);                 \
    add_t(w, sp, name, type, nd, n_in, n_out, n_mat, amp, bias, vals)
        for (size_t i = 0; i < (size_t)MH * MR * MNOPE; i++) wk[i] = rng_f(0.3f);
        for (size_t i = 0; i < (size_t)MH * MVD * MR; i++) wv[i] = rng_f(0.2f);
        /* the fused form: per head MNOPE key rows (row d = column d of wk[h]), then
         * MVD value rows */
        for (int64_t h = 0; h < MH; h++) {
            for (int64_t d = 0; d < MNOPE; d++) {
                for (int64_t j = 0; j < MR; j++) {
                    kvb[(h * (MNOPE + MVD) + d) * MR + j] = wk[(h * MR + j) * MNOPE + d];
                }
            }
            memcpy(kvb + (h * (MNOPE + MVD) + MNOPE) * MR, wv + h * MVD * MR,
                   (size_t)MVD * MR * sizeof(float));
        }
        T("attn_norm.weight", SP_TYPE_F32, 1, ME, 1, 1, 0.2f, 1.0f, NULL);
        T("attn_q_a.weight", SP_TYPE_Q8_0, 2, ME, MQL, 1, 0.3f, 0.0f, NULL);
        T("attn_q_a_norm.weight", SP_TYPE_F32, 1, MQL, 1, 1, 0.2f, 1.0f, NULL);
        T("attn_q_b.weight", SP_TYPE_Q8_0, 2, MQL, MH * MQK, 1, 0.3f, 0.0f, NULL);
        T("attn_kv_a_mqa.weight", SP_TYPE_Q8_0, 2, ME, MR + MROT, 1, 0.3f, 0.0f, NULL);
        T("attn_kv_a_norm.weight", SP_TYPE_F32, 1, MR, 1, 1, 0.2f, 1.0f, NULL);
        if (sp->legacy) {
            T("attn_kv_b.weight", SP_TYPE_F32, 2, MR, MH * (MNOPE + MVD), 1, 0, 0, kvb);
        } else {
            T("attn_k_b.weight", SP_TYPE_F32, 3, MNOPE, MR, MH, 0, 0, wk);
            T("attn_v_b.weight", SP_TYPE_F32, 3, MR, MVD, MH, 0, 0, wv);
        }
        T("attn_output.weight", SP_TYPE_Q8_0, 2, MH * MVD, ME, 1, 0.2f, 0.0f, NULL);
        T("ffn_norm.weight", SP_TYPE_F32, 1, ME, 1, 1, 0.2f, 1.0f, NULL);
        if (l == 0) {
            T("ffn_gate.weight", SP_TYPE_Q8_0, 2, ME, MFF, 1, 0.3f, 0.0f, NULL);
            T("ffn_up.weight", SP_TYPE_Q8_0, 2, ME, MFF, 1, 0.3f, 0.0f, NULL);
            T("ffn_down.weight", SP_TYPE_Q8_0, 2, MFF, ME, 1, 0.2f, 0.0f, NULL);
            continue;
        }
        T("ffn_gate_inp.weight", SP_TYPE_F32, 2, ME, MNE, 1, 0.5f, 0.0f, NULL);
        T("exp_probs_b.bias", SP_TYPE_F32, 1, MNE, 1, 1, 0.3f, 0.0f, NULL);
        T("ffn_gate_exps.weight", SP_TYPE_Q8_0, 3, ME, MFE, MNE, 0.3f, 0.0f, NULL);
        T("ffn_up_exps.weight", SP_TYPE_Q8_0, 3, ME, MFE, MNE, 0.3f, 0.0f, NULL);
        T("ffn_down_exps.weight", SP_TYPE_Q8_0, 3, MFE, ME, MNE, 0.2f, 0.0f, NULL);
        T("ffn_gate_shexp.weight", SP_TYPE_Q8_0, 2, ME, MFE, 1, 0.3f, 0.0f, NULL);
        T("ffn_up_shexp.weight", SP_TYPE_Q8_0, 2, ME, MFE, 1, 0.3f, 0.0f, NULL);
        T("ffn_down_shexp.weight", SP_TYPE_Q8_0, 2, MFE, ME, 1, 0.2f, 0.0f, NULL);
#undef T
    }
    sp_free(wk);
    sp_free(wv);
    sp_free(kvb);
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, &len, err, err_len));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < n_bufs; i++) sp_free(bufs[i]);
    ASSERT_OK(sp_gguf_open_mem(*buf, len, "mla-test.gguf", &g, err, err_len));
    return sp_model_load_gguf(g, out, err, err_len);
}

TEST(mla_loads_its_layout)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    mla_spec_t sp = {0};
    if (build_mla(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    const sp_hparams_t *hp = sp_model_hparams(m);
    ASSERT(strcmp(hp->arch, "deepseek2") == 0 && hp->rope_type == SP_ROPE_NORMAL);
    /* the cache holds one latent head of rope dims + kv_lora_rank */
    ASSERT(hp->head_dim == MROT + MR && hp->n_head_kv == 1 && hp->n_rot == MROT);
    ASSERT(hp->mla_kv_lora == MR && hp->mla_q_lora == MQL && hp->mla_nope == MNOPE &&
           hp->mla_v_dim == MVD);
    /* llama.cpp's deepseek2 scales: log multiplier 0.707, factor 4, attn_factor 1:
     * cos/sin times 1, kq_scale (1 + 0.0707 ln 4)^2 / sqrt(48) */
    const double ms = 1.0 + 0.1 * 0.707 * log(4.0);
    ASSERT(fabs(hp->attn_scale - ms * ms / sqrt((double)MQK)) < 1e-5);
    ASSERT(fabsf(hp->rope_mscale - 1.0f) < 1e-6f && hp->rope_yarn);
    ASSERT(m->mla != NULL && m->mla->wk_owned == NULL);
    ASSERT(m->mla->layers[1].wk_b.n_mat == MH && m->mla->layers[1].wk_b.n_in == MNOPE);
    ASSERT(m->moe != NULL && !sp__moe_layer(m, 0) && sp__moe_layer(m, 1));
    ASSERT(m->layers[0].w_gate.data != NULL && m->layers[1].w_gate.data == NULL);
    const sp_moe_hparams_t *mh = &m->moe->hp;
    ASSERT(mh->gating == SP_MOE_GATING_SIGMOID && mh->norm_w && mh->w_scale == 2.5f);
    ASSERT(mh->n_ff_shexp == MFE && mh->n_group == 4 && mh->n_group_used == 2);
    ASSERT(m->moe->layers[2].sel_b != NULL && m->moe->layers[2].sh_inp.data == NULL);
    /* the latent cache keeps each position once: a key tile per layer and no value
     * tile (the value is the key, engine/mla_attn.c), half of a key + value pool */
    const size_t tile_f16 = (size_t)SP_KV_BLOCK * (size_t)hp->head_dim * 2;
    ASSERT_EQ(sp_kv_block_bytes(m, SP_KV_TYPE_F16), (size_t)hp->n_layer * tile_f16);
    ASSERT_EQ(sp_kv_block_bytes(m, SP_KV_TYPE_F32), (size_t)hp->n_layer * 2 * tile_f16);
    ASSERT_EQ(sp_kv_block_bytes(m, SP_KV_TYPE_Q8_0),
              (size_t)hp->n_layer * (size_t)sp_kv_q8_tile_bytes(hp->head_dim));
    /* the GPU path refuses it by name, before touching the device API */
    const char *why = sp__model_cpu_only_feature(m);
    ASSERT(why != NULL && strstr(why, "latent") != NULL);
    sp_cuda_api_t never_called;
    memset(&never_called, 0, sizeof never_called);
    ASSERT_OK(sp_gpu_attach(m, &never_called, 0, -1, err, sizeof err));
    ASSERT(m->gpu == NULL && sp_gpu_model_layers(m) == 0);
    sp_model_free(m);
    sp_free(buf);
}

/* 32 sequences together and alone, with F32, F16 and Q8_0 caches (invariance.h):
 * the latent cache (values read from the key tile) keeps the contract. */
TEST(mla_batch_invariance_beside_31_others)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    mla_spec_t sp = {0};
    if (build_mla(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    sp_test_beside_others(m, SP_KV_TYPE_F32, 20, 11, 4243, "deepseek2 f32 cache");
    sp_test_beside_others(m, SP_KV_TYPE_Q8_0, 20, 11, 4243, "deepseek2 q8_0 cache");
    sp_test_beside_others(m, SP_KV_TYPE_F16, 20, 11, 4243, "deepseek2 f16 cache");
    sp_model_free(m);
    sp_free(buf);
}

/* The legacy fused attn_kv_b (value rows read in place, key rows transposed
 * into an F32 copy at load) and the split attn_k_b / attn_v_b holding the
 * same F32 values compute the same model: the products read identical rows,
 * so the logits are bit-identical. */
TEST(mla_legacy_kv_b_matches_split)
{
    char err[512];
    void *b1, *b2;
    sp_model_t *m1, *m2;
    mla_spec_t s1 = {0}, s2 = {0};
    s2.legacy = true;
    if (build_mla(&s1, &m1, &b1, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    if (build_mla(&s2, &m2, &b2, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    ASSERT(m2->mla->wk_owned != NULL && m2->mla->layers[0].wk_b.type == SP_TYPE_F32);
    int32_t toks[9] = {1, 17, 300, 45, 2, 99, 411, 7, 256};
    float *l1 = sp_test_alone_logits(m1, toks, 9, SP_KV_TYPE_F32);
    float *l2 = sp_test_alone_logits(m2, toks, 9, SP_KV_TYPE_F32);
    const int64_t V = sp_model_hparams(m1)->n_vocab;
    ASSERT(memcmp(l1, l2, (size_t)(9 * V) * sizeof(float)) == 0);
    /* a trunk-only file with one multi-token-prediction block counted in
     * block_count: the trunk is the same model */
    mla_spec_t s4 = {0};
    s4.nextn = true;
    void *b4;
    sp_model_t *m4;
    if (build_mla(&s4, &m4, &b4, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    ASSERT(sp_model_hparams(m4)->n_layer == MNL);
    float *l4 = sp_test_alone_logits(m4, toks, 9, SP_KV_TYPE_F32);
    ASSERT(memcmp(l1, l4, (size_t)(9 * V) * sizeof(float)) == 0);
    sp_free(l4);
    sp_model_free(m4);
    sp_free(b4);
    /* and a different gating changes them (the routing is read) */
    mla_spec_t s3 = {0};
    s3.gating = 1;
    void *b3;
    sp_model_t *m3;
    if (build_mla(&s3, &m3, &b3, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    ASSERT(m3->moe->hp.gating == SP_MOE_GATING_SOFTMAX);
    float *l3 = sp_test_alone_logits(m3, toks, 9, SP_KV_TYPE_F32);
    ASSERT(memcmp(l1, l3, (size_t)(9 * V) * sizeof(float)) != 0);
    sp_free(l1);
    sp_free(l2);
    sp_free(l3);
    sp_model_free(m1);
    sp_model_free(m2);
    sp_model_free(m3);
    sp_free(b1);
    sp_free(b2);
    sp_free(b3);
}

static void
expect_refused(const mla_spec_t *sp, const char *needle)
{
    char err[512] = "";
    void *buf;
    sp_model_t *m = NULL;
    sp_status_t st = build_mla(sp, &m, &buf, err, sizeof err);
    if (st == SP_OK || m != NULL || strstr(err, needle) == NULL ||
        strstr(err, "mla-test.gguf") == NULL) {
        SP_TEST_FAIL("expected a refusal naming '%s', got status %d: %s", needle, (int)st, err);
    }
    sp_free(buf);
}

TEST(mla_load_refusals)
{
    static const char *const required[] = {
        "blk.1.attn_q_a.weight",      "blk.0.attn_q_a_norm.weight", "blk.2.attn_q_b.weight",
        "blk.1.attn_kv_a_mqa.weight", "blk.0.attn_kv_a_norm.weight", "blk.2.attn_v_b.weight",
        "blk.1.attn_output.weight",   "blk.0.ffn_gate.weight",      "blk.1.ffn_gate_shexp.weight",
        "blk.2.ffn_down_exps.weight", "blk.1.ffn_gate_inp.weight",
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        mla_spec_t sp = {0};
        sp.drop = required[i];
        expect_refused(&sp, required[i]);
    }
    /* without attn_k_b the file must carry the legacy attn_kv_b */
    mla_spec_t nk = {0};
    nk.drop = "blk.2.attn_k_b.weight";
    expect_refused(&nk, "blk.2.attn_kv_b.weight");
    static const char *const widened[] = {"blk.0.attn_k_b.weight", "blk.1.attn_kv_a_norm.weight",
                                          "blk.2.attn_q_b.weight", "blk.1.exp_probs_b.bias"};
    for (size_t i = 0; i < sizeof widened / sizeof widened[0]; i++) {
        mla_spec_t sp = {0};
        sp.widen = widened[i];
        expect_refused(&sp, widened[i]);
    }
    mla_spec_t kl = {0};
    kl.bad_key_len = true;
    expect_refused(&kl, "deepseek2.attention.key_length");
    mla_spec_t nl = {0};
    nl.no_kv_lora = true;
    expect_refused(&nl, "deepseek2.attention.kv_lora_rank");
    mla_spec_t gf = {0};
    gf.gating = 4;
    expect_refused(&gf, "deepseek2.expert_gating_func");
}

/* The latent kernel (values read from the key tile) against the reference
 * kernel on the two-tile layout it replaced (a value tile holding the same
 * vectors): every output lane from v_lo on agrees within float rounding, for
 * F32, F16 and Q8_0 caches, 45 positions over 3 scattered blocks, 21 query
 * heads (one full group of 16 and a partial one), lanes past the last
 * position holding NaN (never read), and a window. */
TEST(mla_attn_matches_two_tile_kernel)
{
    enum { HD = 48, VLO = 16, NQ = 21, NKV = 45, NB = 4 };
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    static const sp_type_t types[3] = {SP_TYPE_F32, SP_TYPE_F16, SP_TYPE_Q8_0};
    const int32_t blocks[3] = {3, 0, 2}; /* positions 0-15 in block 3, 16-31 in 0, ... */
    float *x = sp_malloc(sizeof(float) * NB * SP_KV_BLOCK * HD);
    float *q = sp_malloc(sizeof(float) * NQ * HD);
    float *o1 = sp_malloc(sizeof(float) * NQ * HD), *o2 = sp_malloc(sizeof(float) * NQ * HD);
    const int64_t sc_n = NQ * sp_attn_scratch_stride(NKV) + sp__mla_attn_scratch_floats(HD);
    float *sc = sp_malloc(sizeof(float) * (size_t)sc_n);
    ASSERT(x && q && o1 && o2 && sc);
    for (int64_t i = 0; i < NQ * HD; i++) {
        q[i] = rng_f(0.5f);
    }
    for (int ti = 0; ti < 3; ti++) {
        for (int64_t window = 0; window <= 20; window += 20) {
            const sp_type_t t = types[ti];
            const size_t elt = t == SP_TYPE_F32 ? 4 : t == SP_TYPE_F16 ? 2 : 1;
            const int64_t tile = t == SP_TYPE_Q8_0 ? sp_kv_q8_tile_bytes(HD)
                                                   : (int64_t)SP_KV_BLOCK * HD;
            const int64_t v_row = t == SP_TYPE_Q8_0 ? sp_kv_q8_row_bytes(HD) : HD;
            char *pool = sp_malloc((size_t)(NB * 2 * tile) * elt);
            ASSERT(pool != NULL);
            memset(pool, 0xff, (size_t)(NB * 2 * tile) * elt); /* NaN in every F32/F16 lane */
            for (int64_t p = 0; p < NKV; p++) {
                float *v = x + p * HD;
                for (int64_t d = 0; d < HD; d++) {
                    v[d] = rng_f(2.0f);
                }
                const int64_t b = blocks[p / SP_KV_BLOCK], lane = p % SP_KV_BLOCK;
                char *kt = pool + (size_t)(b * 2 * tile) * elt;
                char *vr = kt + (size_t)(tile + lane * v_row) * elt;
                if (t == SP_TYPE_Q8_0) {
                    sp_kv_q8_store_key(kt, lane, v, HD);
                    sp_kv_q8_store_value(vr, v, HD);
                } else {
                    for (int64_t d = 0; d < HD; d++) {
                        if (t == SP_TYPE_F32) {
                            ((float *)kt)[d * SP_KV_BLOCK + lane] = v[d];
                            ((float *)vr)[d] = v[d];
                        } else {
                            ((sp_fp16_t *)kt)[d * SP_KV_BLOCK + lane] = sp_fp32_to_fp16(v[d]);
                            ((sp_fp16_t *)vr)[d] = sp_fp32_to_fp16(v[d]);
                        }
                    }
                }
            }
            sp_attn_args_t a = {
                .head_dim = HD, .n_q = NQ, .n_kv = NKV, .q = q, .q_stride = HD, .k = pool,
                .v = pool + (size_t)tile * elt, .blocks = blocks, .k_block_stride = 2 * tile,
                .v_block_stride = 2 * tile, .v_stride = v_row, .scale = 0.3f, .o = o1,
                .o_stride = HD, .scratch = sc, .window = window,
            };
            ref->attn[t](&a);
            a.o = o2;
            sp__mla_attn(k, t, &a, VLO);
            for (int64_t h = 0; h < NQ; h++) {
                for (int64_t d = 0; d < HD; d++) {
                    const float want = d < VLO ? 0.0f : o1[h * HD + d];
                    if (!(fabsf(o2[h * HD + d] - want) <= 1e-5f)) {
                        SP_TEST_FAIL("type %d window %lld head %lld lane %lld: %g vs %g", ti,
                                     (long long)window, (long long)h, (long long)d,
                                     o2[h * HD + d], want);
                    }
                }
            }
            sp_free(pool);
        }
    }
    sp_free(x);
    sp_free(q);
    sp_free(o1);
    sp_free(o2);
    sp_free(sc);
}

/*
 * The latent kernel at every level this CPU has (the baseline copy, AVX2,
 * AVX-512), on a 37-head call (two groups of 16 and a partial one), head_dim
 * 80 (two Q8_0 groups and a partial one, values from lane 16), 70 positions
 * over 5 scattered blocks, unwritten lanes holding NaN (F32/F16) or NaN
 * scales (Q8_0):
 *  - each level against the reference kernel on the two-tile layout (1e-5);
 *  - the AVX2 and AVX-512 copies give the same bits (each output element is
 *    the same FMAs in the same order at both widths; the only level-specific
 *    step, the table's exp, agrees on these arguments);
 *  - a Q8_0 cache against an F32 cache holding its dequantised values, same
 *    level: pass 1 is identical (the dequantised key is exact), pass 3
 *    rounds w * s once per (group, lane) before the FMA with the integer,
 *    where the F32 path fuses w * (q s): each term moves by at most
 *    u |w s q| (u = 2^-24), and the n_kv accumulations after it by at most
 *    u |acc| each, so |difference| <= (n_kv + 2) u max|v| (weights over
 *    their sum: the division keeps it relative, one more u).
 */
TEST(mla_attn_levels_agree)
{
    enum { HD = 80, VLO = 16, NQ = 37, NKV = 70, NB = 6 };
    static const sp_type_t types[3] = {SP_TYPE_F32, SP_TYPE_F16, SP_TYPE_Q8_0};
    const int32_t blocks[5] = {4, 1, 5, 0, 2};
    const sp_cpu_kernels_t *ref = sp_cpu_kernels_ref();
    const sp_cpu_kernels_t *lv[3] = {sp_cpu_kernels_for(SP_CPU_SCALAR),
                                     sp_cpu_kernels_for(SP_CPU_AVX2),
                                     sp_cpu_kernels_for(SP_CPU_AVX512)};
    float *x = sp_malloc(sizeof(float) * NKV * HD), *q = sp_malloc(sizeof(float) * NQ * HD);
    /* out[type][level] (NQ x HD), the reference's, and the F32 path over the dequantised cache */
    float *out = sp_malloc(sizeof(float) * 3 * 3 * NQ * HD);
    float *want = sp_malloc(sizeof(float) * NQ * HD), *deq = sp_malloc(sizeof(float) * NQ * HD);
    const int64_t sc_n = NQ * sp_attn_scratch_stride(NKV) + sp__mla_attn_scratch_floats(HD);
    float *sc = sp_malloc(sizeof(float) * (size_t)sc_n);
    ASSERT(x && q && out && want && deq && sc && lv[0] != NULL);
    for (int64_t i = 0; i < NQ * HD; i++) {
        q[i] = rng_f(0.5f);
    }
    float vmax = 0.0f;
    for (int64_t i = 0; i < NKV * HD; i++) {
        x[i] = rng_f(2.0f);
        vmax = fabsf(x[i]) > vmax ? fabsf(x[i]) : vmax;
    }
    const int64_t t8 = sp_kv_q8_tile_bytes(HD), r8 = sp_kv_q8_row_bytes(HD);
    const int64_t t32 = (int64_t)SP_KV_BLOCK * HD;
    /* per block: key tile then value tile; F32, F16, Q8_0, and F32 of the Q8_0 values */
    char *p32 = sp_malloc((size_t)(NB * 2 * t32) * 4), *p16 = sp_malloc((size_t)(NB * 2 * t32) * 2);
    char *p8 = sp_malloc((size_t)(NB * 2 * t8)), *pd = sp_malloc((size_t)(NB * 2 * t32) * 4);
    ASSERT(p32 && p16 && p8 && pd);
    memset(p32, 0xff, (size_t)(NB * 2 * t32) * 4);
    memset(p16, 0xff, (size_t)(NB * 2 * t32) * 2);
    memset(p8, 0xff, (size_t)(NB * 2 * t8));
    memset(pd, 0xff, (size_t)(NB * 2 * t32) * 4);
    for (int64_t p = 0; p < NKV; p++) {
        const int64_t b = blocks[p / SP_KV_BLOCK], l = p % SP_KV_BLOCK;
        const float *v = x + p * HD;
        char *k8 = p8 + 2 * b * t8;
        sp_kv_q8_store_key(k8, l, v, HD);
        sp_kv_q8_store_value(k8 + t8 + l * r8, v, HD);
        for (int64_t d = 0; d < HD; d++) {
            float *k32 = (float *)p32 + 2 * b * t32, *kd = (float *)pd + 2 * b * t32;
            sp_fp16_t *k16 = (sp_fp16_t *)p16 + 2 * b * t32;
            k32[d * SP_KV_BLOCK + l] = k32[t32 + l * HD + d] = v[d];
            k16[d * SP_KV_BLOCK + l] = k16[t32 + l * HD + d] = sp_fp32_to_fp16(v[d]);
            kd[d * SP_KV_BLOCK + l] = kd[t32 + l * HD + d] = sp_kv_q8_key(k8, l, d, HD);
        }
    }
    const float tol_q8 = (float)(NKV + 2) * 0x1p-24f * vmax;
    for (int ti = 0; ti < 3; ti++) {
        const sp_type_t t = types[ti];
        const size_t elt = t == SP_TYPE_F32 ? 4 : t == SP_TYPE_F16 ? 2 : 1;
        const int64_t tile = t == SP_TYPE_Q8_0 ? t8 : t32;
        char *pool = t == SP_TYPE_F32 ? p32 : t == SP_TYPE_F16 ? p16 : p8;
        sp_attn_args_t a = {
            .head_dim = HD, .n_q = NQ, .n_kv = NKV, .q = q, .q_stride = HD, .k = pool,
            .v = pool + (size_t)tile * elt, .blocks = blocks, .k_block_stride = 2 * tile,
            .v_block_stride = 2 * tile, .v_stride = t == SP_TYPE_Q8_0 ? r8 : HD,
            .scale = 0.3f, .o = want, .o_stride = HD, .scratch = sc,
        };
        ref->attn[t](&a);
        for (int l = 0; l < 3; l++) {
            if (lv[l] == NULL) {
                printf("skipped: mla_attn_levels_agree: no %s level on this CPU\n",
                       l == 1 ? "AVX2" : "AVX-512");
                continue;
            }
            float *o = out + (ti * 3 + l) * NQ * HD;
            a.o = o;
            sp__mla_attn(lv[l], t, &a, VLO);
            for (int64_t i = 0; i < NQ * HD; i++) {
                const float w = i % HD < VLO ? 0.0f : want[i];
                if (!(fabsf(o[i] - w) <= 1e-5f)) {
                    SP_TEST_FAIL("type %d level %d head %lld lane %lld: %g vs reference %g", ti,
                                 l, (long long)(i / HD), (long long)(i % HD), o[i], w);
                }
            }
            if (l == 2 && lv[1] != NULL &&
                memcmp(o, out + (ti * 3 + 1) * NQ * HD, sizeof(float) * NQ * HD) != 0) {
                SP_TEST_FAIL("type %d: the AVX-512 copy's bits differ from the AVX2 copy's", ti);
            }
            if (t == SP_TYPE_Q8_0) {
                sp_attn_args_t ad = a;
                ad.k = pd;
                ad.v = pd + (size_t)t32 * 4;
                ad.k_block_stride = ad.v_block_stride = 2 * t32;
                ad.v_stride = HD;
                ad.o = deq;
                sp__mla_attn(lv[l], SP_TYPE_F32, &ad, VLO);
                for (int64_t i = 0; i < NQ * HD; i++) {
                    if (!(fabsf(o[i] - deq[i]) <= tol_q8)) {
                        SP_TEST_FAIL("level %d head %lld lane %lld: q8_0 %g vs f32 of its values "
                                     "%g (bound %g)", l, (long long)(i / HD), (long long)(i % HD),
                                     o[i], deq[i], tol_q8);
                    }
                }
            }
        }
    }
    sp_free(p32);
    sp_free(p16);
    sp_free(p8);
    sp_free(pd);
    sp_free(x);
    sp_free(q);
    sp_free(out);
    sp_free(want);
    sp_free(deq);
    sp_free(sc);
}
