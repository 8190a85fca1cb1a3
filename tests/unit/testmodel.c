/* testmodel.c - random-weight llama-shaped models for the whole-model tests (testmodel.h). */
#include "testmodel.h"

#include "test.h"

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "tools/tools.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define TM_DEMO "models/stories260K.gguf"
#define TM_MAX_TENSORS 160

typedef struct {
    uint64_t rng;
    void *bufs[TM_MAX_TENSORS];
    int n_bufs;
} tm_state_t;

static float
tm_rand(tm_state_t *s)
{
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return (float)((s->rng >> 16) & 0xffff) / 32768.0f - 1.0f;
}

static void
tm_add_x(tm_state_t *s, sp_gguf_writer_t *w, const char *name, sp_type_t type, int64_t n_in,
         int64_t n_out, int64_t n_exp, float amp)
{
    const int64_t ne[3] = {n_in, n_out, n_exp};
    const size_t row = sp_row_size(type, n_in);
    float *src = sp_malloc((size_t)n_in * sizeof(float));
    char *data = sp_malloc(row * (size_t)(n_out * n_exp));
    ASSERT(src && data && s->n_bufs < TM_MAX_TENSORS);
    for (int64_t r = 0; r < n_out * n_exp; r++) {
        for (int64_t i = 0; i < n_in; i++)
            src[i] = amp * tm_rand(s);
        if (type == SP_TYPE_F32)
            memcpy(data + (size_t)r * row, src, (size_t)n_in * sizeof(float));
        else
            ASSERT(sp_quantize_row(type, src, data + (size_t)r * row, n_in));
    }
    sp_free(src);
    s->bufs[s->n_bufs++] = data;
    ASSERT_OK(sp_gguf_writer_add_tensor(w, name, type, n_exp > 1 ? 3 : n_out == 1 ? 1 : 2, ne,
                                        data));
}

static void
tm_add(tm_state_t *s, sp_gguf_writer_t *w, const char *name, sp_type_t type, int64_t n_in,
       int64_t n_out, float amp)
{
    tm_add_x(s, w, name, type, n_in, n_out, 1, amp);
}

void
sp_test_llama_gguf(const sp_test_llama_t *sp, void **buf, size_t *len)
{
    char err[512], key[128];
    sp_gguf_t *demo;
    sp_gguf_writer_t *w;
    tm_state_t *s = sp_calloc(1, sizeof *s);
    ASSERT(s != NULL);
    const int64_t E = sp->n_embd, V = 512, QD = sp->n_head * sp->head_dim,
                  KVD = sp->n_head_kv * sp->head_dim;
    ASSERT_OK(sp_gguf_open(TM_DEMO, &demo, err, sizeof err));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", sp->arch));
#define U32(suffix, v)                                                                         \
    snprintf(key, sizeof key, "%s.%s", sp->arch, suffix);                                      \
    ASSERT_OK(sp_gguf_writer_set_u32(w, key, (uint32_t)(v)))
#define F32(suffix, v)                                                                         \
    snprintf(key, sizeof key, "%s.%s", sp->arch, suffix);                                      \
    ASSERT_OK(sp_gguf_writer_set_f32(w, key, (v)))
    U32("context_length", sp->n_ctx);
    U32("embedding_length", E);
    U32("feed_forward_length", sp->n_ff);
    U32("block_count", sp->n_layer);
    U32("attention.head_count", sp->n_head);
    U32("attention.head_count_kv", sp->n_head_kv);
    if (sp->rope_dim) {
        U32("rope.dimension_count", sp->head_dim);
    }
    F32("rope.freq_base", 10000.0f);
    F32("attention.layer_norm_rms_epsilon", sp->rms_eps);
    if (sp->n_expert >= 2) {
        U32("expert_count", sp->n_expert);
        U32("expert_used_count", sp->n_expert_used);
        U32("expert_feed_forward_length", sp->n_ff_exp);
        if (sp->n_ff_shexp > 0) {
            U32("expert_shared_feed_forward_length", sp->n_ff_shexp);
        }
    }
#undef U32
#undef F32
    s->rng = sp->seed;
    tm_add(s, w, "token_embd.weight", sp->type, E, V, 1.0f);
    tm_add(s, w, "output.weight", sp->type, E, V, sp->amp_output);
    tm_add(s, w, "output_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
    for (int64_t l = 0; l < sp->n_layer; l++) {
        char name[96];
#define T(suffix, ty, n_in, n_out, amp)                                                        \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);                          \
    tm_add(s, w, name, ty, n_in, n_out, amp)
        T("attn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("attn_q.weight", sp->type, E, QD, sp->amp_in);
        T("attn_k.weight", sp->type, E, KVD, sp->amp_in);
        T("attn_v.weight", sp->type, E, KVD, sp->amp_in);
        if (sp->qkv_bias) {
            T("attn_q.bias", SP_TYPE_F32, QD, 1, 0.1f);
            T("attn_k.bias", SP_TYPE_F32, KVD, 1, 0.1f);
            T("attn_v.bias", SP_TYPE_F32, KVD, 1, 0.1f);
        }
        T("attn_output.weight", sp->type, QD, E, sp->amp_out);
        T("ffn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        if (sp->n_expert >= 2) {
            const int64_t NE = sp->n_expert, F = sp->n_ff_exp, FS = sp->n_ff_shexp;
#define TX(suffix, ty, n_in, n_out, n_exp, amp)                                                \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);                          \
    tm_add_x(s, w, name, ty, n_in, n_out, n_exp, amp)
            TX("ffn_gate_inp.weight", SP_TYPE_F32, E, NE, 1, 1.0f);
            TX("ffn_gate_exps.weight", sp->type, E, F, NE, sp->amp_in);
            TX("ffn_up_exps.weight", sp->type, E, F, NE, sp->amp_in);
            TX("ffn_down_exps.weight", sp->type, F, E, NE, sp->amp_out);
            if (FS > 0) {
                TX("ffn_gate_inp_shexp.weight", SP_TYPE_F32, E, 1, 1, 0.3f);
                TX("ffn_gate_shexp.weight", sp->type, E, FS, 1, sp->amp_in);
                TX("ffn_up_shexp.weight", sp->type, E, FS, 1, sp->amp_in);
                TX("ffn_down_shexp.weight", sp->type, FS, E, 1, sp->amp_out);
            }
#undef TX
        } else {
            T("ffn_gate.weight", sp->type, E, sp->n_ff, sp->amp_in);
            T("ffn_up.weight", sp->type, E, sp->n_ff, sp->amp_in);
            T("ffn_down.weight", sp->type, sp->n_ff, E, sp->amp_out);
        }
#undef T
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < s->n_bufs; i++)
        sp_free(s->bufs[i]);
    sp_free(s);
}

/* A vector or matrix of base + amp * uniform(-1, 1), F32 (norms, RoPE factors). */
static void
tm_add_f32(tm_state_t *s, sp_gguf_writer_t *w, const char *name, int64_t n_in, int64_t n_out,
           float base, float amp)
{
    const int64_t ne[2] = {n_in, n_out};
    float *data = sp_malloc((size_t)(n_in * n_out) * sizeof(float));
    ASSERT(data != NULL && s->n_bufs < TM_MAX_TENSORS);
    for (int64_t i = 0; i < n_in * n_out; i++)
        data[i] = base + amp * tm_rand(s);
    s->bufs[s->n_bufs++] = data;
    ASSERT_OK(sp_gguf_writer_add_tensor(w, name, SP_TYPE_F32, n_out == 1 ? 1 : 2, ne, data));
}

static bool
tm_is(const sp_test_arch_t *sp, const char *arch)
{
    return strcmp(sp->arch, arch) == 0;
}

void
sp_test_arch_gguf(const sp_test_arch_t *sp, void **buf, size_t *len)
{
    enum { H = 4, HKV = 2, HD = 32, E = 64, FF = 96, NL = 4, V = 512 };
    char err[512], key[128], name[96];
    sp_gguf_t *demo;
    sp_gguf_writer_t *w;
    tm_state_t *s = sp_calloc(1, sizeof *s);
    ASSERT(s != NULL);
    const bool gemma = strncmp(sp->arch, "gemma", 5) == 0, phi3 = tm_is(sp, "phi3");
    const bool olmo2 = tm_is(sp, "olmo2");
    const bool head_norm = tm_is(sp, "qwen3") || tm_is(sp, "gemma3");
    ASSERT_OK(sp_gguf_open(TM_DEMO, &demo, err, sizeof err));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", sp->arch));
#define U32(suffix, v)                                                                         \
    snprintf(key, sizeof key, "%s.%s", sp->arch, suffix);                                      \
    ASSERT_OK(sp_gguf_writer_set_u32(w, key, (uint32_t)(v)))
#define F32(suffix, v)                                                                         \
    snprintf(key, sizeof key, "%s.%s", sp->arch, suffix);                                      \
    ASSERT_OK(sp_gguf_writer_set_f32(w, key, (v)))
    U32("context_length", 512);
    U32("embedding_length", E);
    U32("feed_forward_length", FF);
    U32("block_count", NL);
    U32("attention.head_count", H);
    U32("attention.head_count_kv", HKV);
    U32("attention.key_length", HD);
    U32("attention.value_length", HD);
    F32("rope.freq_base", tm_is(sp, "gemma3") ? 1000000.0f : 10000.0f);
    F32("attention.layer_norm_rms_epsilon", 1e-6f);
    if (gemma || phi3) {
        U32("attention.sliding_window", 8);
    }
    if (gemma) {
        U32("attention.sliding_window_pattern", 2);
        F32("final_logit_softcapping", sp->final_softcap);
    }
    if (tm_is(sp, "gemma2")) {
        F32("attn_logit_softcapping", sp->attn_softcap);
    }
    if (tm_is(sp, "granite")) {
        F32("embedding_scale", 3.0f);
        F32("attention.scale", 0.1f);
        F32("residual_scale", 0.5f);
        F32("logit_scale", 4.0f);
    }
    if (phi3) {
        U32("rope.scaling.original_context_length", 64);
        F32("rope.scaling.attn_factor", 1.2f);
    }
    if (sp->yarn) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", sp->arch);
        ASSERT_OK(sp_gguf_writer_set_str(w, key, "yarn"));
        F32("rope.scaling.factor", 4.0f);
        U32("rope.scaling.original_context_length", 64);
    }
#undef U32
#undef F32
    s->rng = sp->seed;
    tm_add(s, w, "token_embd.weight", sp->type, E, V, sp->amp_embd);
    tm_add_f32(s, w, "output_norm.weight", E, 1, sp->norm_base, sp->norm_amp);
    if (sp->amp_output > 0.0f && !gemma) {
        tm_add(s, w, "output.weight", sp->type, E, V, sp->amp_output);
    }
    if (phi3) {
        tm_add_f32(s, w, "rope_factors_long.weight", HD / 2, 1, 3.0f, 2.0f);
        tm_add_f32(s, w, "rope_factors_short.weight", HD / 2, 1, 1.0f, 0.5f);
    }
    for (int l = 0; l < NL; l++) {
#define T(suffix, n_in, n_out, amp)                                                            \
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                        \
    tm_add(s, w, name, sp->type, n_in, n_out, amp)
#define N(suffix, n)                                                                           \
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                        \
    tm_add_f32(s, w, name, n, 1, sp->norm_base, sp->norm_amp)
        if (!olmo2) {
            N("attn_norm.weight", E);
            N("ffn_norm.weight", E);
        }
        if (phi3) {
            T("attn_qkv.weight", E, (H + 2 * HKV) * HD, sp->amp_in);
            T("ffn_up.weight", E, 2 * FF, sp->amp_in); /* the gate rows, then the up rows */
        } else {
            T("attn_q.weight", E, H * HD, sp->amp_in);
            T("attn_k.weight", E, HKV * HD, sp->amp_in);
            T("attn_v.weight", E, HKV * HD, sp->amp_in);
            T("ffn_gate.weight", E, FF, sp->amp_in);
            T("ffn_up.weight", E, FF, sp->amp_in);
        }
        T("attn_output.weight", H * HD, E, sp->amp_out);
        T("ffn_down.weight", FF, E, sp->amp_out);
        if (head_norm) {
            N("attn_q_norm.weight", HD);
            N("attn_k_norm.weight", HD);
        } else if (olmo2) {
            N("attn_q_norm.weight", H * HD);
            N("attn_k_norm.weight", HKV * HD);
        }
        if (gemma || olmo2) {
            N("post_attention_norm.weight", E);
            N("post_ffw_norm.weight", E);
        }
#undef T
#undef N
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < s->n_bufs; i++)
        sp_free(s->bufs[i]);
    sp_free(s);
}

void
sp_test_check_inspect_repack(const char *name, const void *buf, size_t len, size_t want)
{
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/%s.gguf", sp_test_tmpdir(), name);
    snprintf(out, sizeof out, "%s/%s.json", sp_test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL && fwrite(buf, 1, len, f) == len);
    fclose(f);
    fflush(stdout);
    FILE *saved = fdopen(dup(fileno(stdout)), "w");
    ASSERT(freopen(out, "w", stdout) != NULL);
    char *argv[] = {"inspect", path, "--json", NULL};
    const int rc = sp_cmd_inspect(3, argv);
    fflush(stdout);
    ASSERT(dup2(fileno(saved), fileno(stdout)) >= 0);
    fclose(saved);
    ASSERT_EQ(rc, 0);
    static char text[1 << 16];
    f = fopen(out, "r");
    ASSERT(f != NULL);
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char key[64];
    snprintf(key, sizeof key, "\"repack_bytes\": %zu,", want);
    if (strstr(text, key) == NULL)
        SP_TEST_FAIL("inspect does not report %s", key);
}
