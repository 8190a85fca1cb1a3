/*
 * test_gptoss.c - the gpt-oss architecture as the loader reads it and the
 * batched forward pass runs it: what loads (alternating sliding window, sinks,
 * output bias, post_attention_norm as the FFN's pre-norm, MXFP4 experts with
 * biases, the moe.c row), batch invariance of a whole model (a sequence alone
 * and beside 31 others, past the window: bit-identical logits), and the
 * refusals of broken files (file and tensor or key named). The logits
 * themselves are checked against the float64 reference in
 * tests/py/test_gptoss.py and against llama.cpp in tests/py/test_llamacpp.py.
 * Single-threaded test; models are built in memory and freed by each test.
 */
#include "test.h"
#include "invariance.h"

#include <math.h>

#include "core/alloc.h"
#include "engine/batch.h"
#include "engine/gpu.h"
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

#define GE 64    /* embedding */
#define GH 4     /* query heads */
#define GHKV 2
#define GHD 32   /* head_dim: q is 128 wide over a 64 model, as gpt-oss's q is wider */
#define GFF 64   /* expert width (a multiple of MXFP4's 32) */
#define GNE 8
#define GK 2
#define GNL 2
#define GSWA 4   /* window of layer 0 (pattern 2: even layers slide) */
#define GV 512

#define MAX_BUFS 64
static void *bufs[MAX_BUFS];
static int n_bufs;

/* faults for the refusal tests */
typedef struct gptoss_spec {
    const char *drop;      /* omit this tensor */
    const char *widen;     /* this tensor gets one more element per row */
    bool no_window;        /* no attention.sliding_window key */
    bool one_expert;       /* expert_count 1 */
} gptoss_spec_t;

static void
add_t(sp_gguf_writer_t *w, const gptoss_spec_t *sp, const char *name, sp_type_t type, int n_dims,
      int64_t n_in, int64_t n_out, int64_t n_exp, float amp, float bias)
{
    if (sp->drop != NULL && strcmp(sp->drop, name) == 0) {
        return;
    }
    if (sp->widen != NULL && strcmp(sp->widen, name) == 0) {
        n_in += type == SP_TYPE_F32 ? 1 : 32;
    }
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

/* A gpt-oss model with the demo's tokenizer: Q8_0 attention, MXFP4 experts,
 * F32 router, biases, sinks and norms, YaRN keys. *buf is the GGUF image (the
 * caller frees it after the model). */
static sp_status_t
build_gptoss(const gptoss_spec_t *sp, sp_model_t **out, void **buf, char *err, size_t err_len)
{
    sp_gguf_t *demo, *g;
    sp_gguf_writer_t *w;
    size_t len;
    ASSERT_OK(sp_gguf_open(DEMO, &demo, err, err_len));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", "gpt-oss"));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.context_length", 512));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.embedding_length", GE));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.feed_forward_length", GFF));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.expert_feed_forward_length", GFF));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.block_count", GNL));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.attention.head_count", GH));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.attention.head_count_kv", GHKV));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.attention.key_length", GHD));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.attention.value_length", GHD));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.expert_count", sp->one_expert ? 1 : GNE));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.expert_used_count", sp->one_expert ? 1 : GK));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "gpt-oss.rope.freq_base", 150000.0f));
    ASSERT_OK(sp_gguf_writer_set_str(w, "gpt-oss.rope.scaling.type", "yarn"));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "gpt-oss.rope.scaling.factor", 4.0f));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.rope.scaling.original_context_length", 64));
    if (!sp->no_window) {
        ASSERT_OK(sp_gguf_writer_set_u32(w, "gpt-oss.attention.sliding_window", GSWA));
    }
    n_bufs = 0;
    rng_state = 0x5eed0055ull;
    add_t(w, sp, "token_embd.weight", SP_TYPE_F32, 2, GE, GV, 1, 1.0f, 0.0f);
    add_t(w, sp, "output.weight", SP_TYPE_F32, 2, GE, GV, 1, 0.3f, 0.0f);
    add_t(w, sp, "output_norm.weight", SP_TYPE_F32, 1, GE, 1, 1, 0.2f, 1.0f);
    for (int64_t l = 0; l < GNL; l++) {
        char name[96];
#define T(suffix, type, nd, n_in, n_out, n_exp, amp, bias)                       \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);             \
    add_t(w, sp, name, type, nd, n_in, n_out, n_exp, amp, bias)
        T("attn_norm.weight", SP_TYPE_F32, 1, GE, 1, 1, 0.2f, 1.0f);
        T("attn_q.weight", SP_TYPE_Q8_0, 2, GE, GH * GHD, 1, 0.3f, 0.0f);
        T("attn_k.weight", SP_TYPE_Q8_0, 2, GE, GHKV * GHD, 1, 0.3f, 0.0f);
        T("attn_v.weight", SP_TYPE_Q8_0, 2, GE, GHKV * GHD, 1, 0.3f, 0.0f);
        T("attn_q.bias", SP_TYPE_F32, 1, GH * GHD, 1, 1, 0.2f, 0.0f);
        T("attn_k.bias", SP_TYPE_F32, 1, GHKV * GHD, 1, 1, 0.2f, 0.0f);
        T("attn_v.bias", SP_TYPE_F32, 1, GHKV * GHD, 1, 1, 0.2f, 0.0f);
        T("attn_output.weight", SP_TYPE_Q8_0, 2, GH * GHD, GE, 1, 0.1f, 0.0f);
        T("attn_output.bias", SP_TYPE_F32, 1, GE, 1, 1, 0.2f, 0.0f);
        T("attn_sinks.weight", SP_TYPE_F32, 1, GH, 1, 1, 2.0f, 1.0f);
        T("post_attention_norm.weight", SP_TYPE_F32, 1, GE, 1, 1, 0.2f, 1.0f);
        T("ffn_gate_inp.weight", SP_TYPE_F32, 2, GE, GNE, 1, 0.5f, 0.0f);
        T("ffn_gate_inp.bias", SP_TYPE_F32, 1, GNE, 1, 1, 0.5f, 0.0f);
        T("ffn_gate_exps.weight", SP_TYPE_MXFP4, 3, GE, GFF, GNE, 0.3f, 0.0f);
        T("ffn_up_exps.weight", SP_TYPE_MXFP4, 3, GE, GFF, GNE, 0.3f, 0.0f);
        T("ffn_down_exps.weight", SP_TYPE_MXFP4, 3, GFF, GE, GNE, 0.2f, 0.0f);
        T("ffn_gate_exps.bias", SP_TYPE_F32, 2, GFF, GNE, 1, 0.5f, 0.0f);
        T("ffn_up_exps.bias", SP_TYPE_F32, 2, GFF, GNE, 1, 0.5f, 0.0f);
        T("ffn_down_exps.bias", SP_TYPE_F32, 2, GE, GNE, 1, 0.2f, 0.0f);
#undef T
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, &len, err, err_len));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < n_bufs; i++) sp_free(bufs[i]);
    ASSERT_OK(sp_gguf_open_mem(*buf, len, "gptoss-test.gguf", &g, err, err_len));
    return sp_model_load_gguf(g, out, err, err_len);
}

TEST(gptoss_loads_its_layout)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    gptoss_spec_t sp = {0};
    if (build_gptoss(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    const sp_hparams_t *hp = sp_model_hparams(m);
    ASSERT(strcmp(hp->arch, "gpt-oss") == 0 && hp->rope_type == SP_ROPE_NEOX);
    ASSERT(hp->head_dim == GHD && hp->n_swa == GSWA);
    ASSERT(hp->layer_swa[0] == 1 && hp->layer_swa[1] == 0); /* even layers slide */
    ASSERT(hp->rope_yarn && hp->yarn_factor == 4.0f && hp->yarn_orig_ctx == 64);
    /* the architecture's own hyper-parameters are read after YaRN's */
    ASSERT(fabsf(hp->attn_scale - 1.0f / sqrtf((float)GHD)) < 1e-7f);
    ASSERT(hp->rope_base_swa == hp->rope_base && hp->rope_scale_swa == hp->rope_scale);
    const sp_gguf_tensor_t *pan = sp_gguf_find_tensor(sp_model_gguf(m), "blk.1.post_attention_norm.weight");
    ASSERT(pan != NULL && m->layers[1].ffn_norm == (const float *)pan->data);
    for (int l = 0; l < GNL; l++) {
        ASSERT(m->layers[l].bo != NULL && m->layers[l].attn_sinks != NULL);
        ASSERT(m->layers[l].bq != NULL && m->layers[l].attn_post_norm == NULL);
    }
    ASSERT(m->moe != NULL);
    const sp_moe_hparams_t *mh = &m->moe->hp;
    ASSERT(mh->n_expert == GNE && mh->n_expert_used == GK && mh->n_ff_exp == GFF);
    ASSERT(mh->gating == SP_MOE_GATING_SOFTMAX_WEIGHT && !mh->norm_w);
    ASSERT(mh->act == SP_MOE_ACT_SWIGLU_OAI && mh->n_ff_shexp == 0);
    const sp_moe_layer_t *L = &m->moe->layers[1];
    ASSERT(L->gate.type == SP_TYPE_MXFP4 && L->router_b && L->gate_b && L->up_b && L->down_b);
    /* the GPU path has the sinks, the output bias and YaRN, but no MoE block: the
     * whole model stays on the CPU, the device API never called */
    ASSERT(sp__model_cpu_only_feature(m) == NULL);
    sp_cuda_api_t never_called;
    memset(&never_called, 0, sizeof never_called); /* a NULL op would crash if used */
    ASSERT_OK(sp_gpu_attach(m, &never_called, 0, -1, err, sizeof err));
    ASSERT(m->gpu == NULL && sp_gpu_model_layers(m) == 0);
    sp_model_free(m);
    sp_free(buf);
}

/* 32 sequences prefilled together then decoded together, past the window of 4:
 * every row's logits are the bits of the sequence run alone (invariance.h). */
TEST(gptoss_batch_invariance_beside_31_others)
{
    char err[512];
    void *buf;
    sp_model_t *m;
    gptoss_spec_t sp = {0};
    if (build_gptoss(&sp, &m, &buf, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s", err);
    sp_test_beside_others(m, SP_KV_TYPE_F32, 12, 7, 4243, "gpt-oss");
    sp_model_free(m);
    sp_free(buf);
}

static void
expect_refused(const gptoss_spec_t *sp, const char *needle)
{
    char err[512] = "";
    void *buf;
    sp_model_t *m = NULL;
    sp_status_t st = build_gptoss(sp, &m, &buf, err, sizeof err);
    if (st == SP_OK || m != NULL || strstr(err, needle) == NULL ||
        strstr(err, "gptoss-test.gguf") == NULL) {
        SP_TEST_FAIL("expected a refusal naming '%s', got status %d: %s", needle, (int)st, err);
    }
    sp_free(buf);
}

TEST(gptoss_load_refusals)
{
    static const char *const required[] = {
        "blk.1.attn_sinks.weight",      "blk.0.attn_output.bias",
        "blk.1.post_attention_norm.weight", "blk.0.attn_q.bias",
        "blk.1.ffn_gate_inp.bias",      "blk.0.ffn_gate_exps.bias",
        "blk.1.ffn_up_exps.bias",       "blk.0.ffn_down_exps.bias",
        "blk.1.ffn_down_exps.weight",   "blk.0.ffn_gate_inp.weight",
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        gptoss_spec_t sp = {0};
        sp.drop = required[i];
        expect_refused(&sp, required[i]);
    }
    static const char *const widened[] = {"blk.0.attn_sinks.weight", "blk.1.attn_output.bias",
                                          "blk.0.ffn_down_exps.bias", "blk.1.ffn_up_exps.weight"};
    for (size_t i = 0; i < sizeof widened / sizeof widened[0]; i++) {
        gptoss_spec_t sp = {0};
        sp.widen = widened[i];
        expect_refused(&sp, widened[i]);
    }
    gptoss_spec_t nw = {0};
    nw.no_window = true;
    expect_refused(&nw, "gpt-oss.attention.sliding_window");
    gptoss_spec_t one = {0};
    one.one_expert = true;
    expect_refused(&one, "expert_count");
}
