/*
 * test_quant_mix.c - the per-tensor types of llama.cpp's mixes (tools/quant_mix.c) on a
 * synthetic 12-layer model written in reverse layer order, and the mix names of
 * `sampan quantize`. tests/py/test_llamacpp.py compares the same plans with llama.cpp's own
 * quantizer; this file pins the rules where llama.cpp is not installed.
 */
#include "test.h"

#include <unistd.h>

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tools/quant_mix.h"
#include "tools/tools.h"

#define N_LAYER 12

static const char *
tmp_path(const char *name)
{
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", sp_test_tmpdir(), name);
    return buf[k];
}

/* llama, 12 layers, 8 heads over 2 KV heads (GQA 4); no output.weight (tied); attn_q rows
 * of 320 (not a multiple of 256); layers written last to first, so a rule that counted in
 * file order would pick the wrong layers. */
static const char *
make_model(void)
{
    static float zeros[320 * 4], norm[256];
    sp_gguf_writer_t *wr = NULL;
    ASSERT_OK(sp_gguf_writer_create(&wr));
    ASSERT_OK(sp_gguf_writer_set_str(wr, "general.architecture", "llama"));
    ASSERT_OK(sp_gguf_writer_set_u32(wr, "llama.block_count", N_LAYER));
    ASSERT_OK(sp_gguf_writer_set_u32(wr, "llama.attention.head_count", 8));
    ASSERT_OK(sp_gguf_writer_set_u32(wr, "llama.attention.head_count_kv", 2));
    int64_t ne_m[2] = {256, 4}, ne_q[2] = {320, 4}, ne_n[1] = {256};
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "token_embd.weight", SP_TYPE_F32, 2, ne_m, zeros));
    for (int l = N_LAYER - 1; l >= 0; l--) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        ASSERT_OK(sp_gguf_writer_add_tensor(wr, name, SP_TYPE_F32, 1, ne_n, norm));
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        ASSERT_OK(sp_gguf_writer_add_tensor(wr, name, SP_TYPE_F32, 2, ne_q, zeros));
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        ASSERT_OK(sp_gguf_writer_add_tensor(wr, name, SP_TYPE_F32, 2, ne_m, zeros));
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        ASSERT_OK(sp_gguf_writer_add_tensor(wr, name, SP_TYPE_F16, 2, ne_m, zeros));
    }
    const char *path = tmp_path("mix.gguf");
    char err[256];
    ASSERT_OK(sp_gguf_writer_write(wr, path, err, sizeof err));
    sp_gguf_writer_destroy(wr);
    return path;
}

static sp_type_t plan_types[1 + 4 * N_LAYER];
static const char *plan_why[1 + 4 * N_LAYER];

static void
plan(const sp_gguf_t *g, const char *mix, bool pure)
{
    const sp_quant_mix_t *m = sp_quant_mix_find(mix);
    ASSERT(m != NULL);
    ASSERT_EQ(sp_gguf_n_tensors(g), 1 + 4 * N_LAYER);
    char err[256];
    ASSERT_OK(sp_quant_mix_plan(m, g, pure, plan_types, plan_why, err, sizeof err));
}

static sp_type_t
type_of(const sp_gguf_t *g, const char *name)
{
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        if (sp_str_eq_c(sp_gguf_tensor(g, i)->name, name)) {
            return plan_types[i];
        }
    }
    SP_TEST_FAIL("no tensor %s", name);
    return SP_TYPE_COUNT;
}

static sp_type_t
layer_type(const sp_gguf_t *g, int l, const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, what);
    return type_of(g, name);
}

/* Layers 0, 3, 6, 9, 10, 11 of 12: the first and last eighth and every third between. */
static bool
more_bits_layer(int l)
{
    return l == 0 || l == 3 || l == 6 || l == 9 || l == 10 || l == 11;
}

TEST(quant_mix_q4_k_m_layers_output_and_fallback)
{
    sp_gguf_t *g = NULL;
    char err[256];
    ASSERT_OK(sp_gguf_open(make_model(), &g, err, sizeof err));
    plan(g, "Q4_K_M", false);
    ASSERT_EQ(type_of(g, "token_embd.weight"), SP_TYPE_Q6_K); /* tied: the output rule */
    for (int l = 0; l < N_LAYER; l++) {
        sp_type_t want = more_bits_layer(l) ? SP_TYPE_Q6_K : SP_TYPE_Q4_K;
        ASSERT_EQ(layer_type(g, l, "attn_v"), want);
        ASSERT_EQ(layer_type(g, l, "ffn_down"), want);
        ASSERT_EQ(layer_type(g, l, "attn_q"), SP_TYPE_Q5_0); /* 320: q4_k -> q5_0 */
        ASSERT_EQ(layer_type(g, l, "attn_norm"), SP_TYPE_F32);
    }
    /* the same in lower case; --pure: the base type everywhere, fallback still applied */
    plan(g, "q4_k_m", true);
    ASSERT_EQ(type_of(g, "token_embd.weight"), SP_TYPE_Q4_K);
    ASSERT_EQ(layer_type(g, 11, "attn_v"), SP_TYPE_Q4_K);
    ASSERT_EQ(layer_type(g, 0, "attn_q"), SP_TYPE_Q5_0);
    sp_gguf_close(g);
}

TEST(quant_mix_other_mixes)
{
    sp_gguf_t *g = NULL;
    char err[256];
    ASSERT_OK(sp_gguf_open(make_model(), &g, err, sizeof err));
    plan(g, "Q5_K_M", false);
    ASSERT_EQ(layer_type(g, 3, "attn_v"), SP_TYPE_Q6_K);
    ASSERT_EQ(layer_type(g, 4, "ffn_down"), SP_TYPE_Q5_K);
    ASSERT_EQ(layer_type(g, 4, "attn_q"), SP_TYPE_Q5_1); /* q5_k -> q5_1 */
    plan(g, "Q3_K_M", false);
    ASSERT_EQ(layer_type(g, 1, "attn_v"), SP_TYPE_Q5_K); /* the first two */
    ASSERT_EQ(layer_type(g, 2, "attn_v"), SP_TYPE_Q4_K);
    ASSERT_EQ(layer_type(g, 0, "ffn_down"), SP_TYPE_Q4_K); /* 12 / 16 = 0 layers get q5_k */
    ASSERT_EQ(layer_type(g, 0, "attn_q"), SP_TYPE_Q4_0); /* q3_k -> q4_0 */
    plan(g, "Q4_K_S", false);
    ASSERT_EQ(layer_type(g, 3, "attn_v"), SP_TYPE_Q5_K);
    ASSERT_EQ(layer_type(g, 4, "attn_v"), SP_TYPE_Q4_K);
    ASSERT_EQ(layer_type(g, 0, "ffn_down"), SP_TYPE_Q5_K); /* the first eighth: layer 0 */
    ASSERT_EQ(layer_type(g, 1, "ffn_down"), SP_TYPE_Q4_K);
    plan(g, "IQ4_XS", false);
    ASSERT_EQ(layer_type(g, 7, "attn_v"), SP_TYPE_Q5_K); /* grouped-query attention >= 4 */
    ASSERT_EQ(layer_type(g, 0, "ffn_down"), SP_TYPE_Q5_K);
    ASSERT_EQ(layer_type(g, 1, "ffn_down"), SP_TYPE_IQ4_XS);
    ASSERT_EQ(layer_type(g, 1, "attn_q"), SP_TYPE_IQ4_NL);
    plan(g, "Q8_0", false);
    ASSERT_EQ(type_of(g, "token_embd.weight"), SP_TYPE_Q8_0); /* output rule keeps q8_0 */
    ASSERT_EQ(layer_type(g, 5, "attn_q"), SP_TYPE_Q8_0);
    plan(g, "Q4_0", false);
    ASSERT_EQ(type_of(g, "token_embd.weight"), SP_TYPE_Q6_K);
    ASSERT_EQ(layer_type(g, 5, "attn_v"), SP_TYPE_Q4_0);
    plan(g, "F16", false);
    ASSERT_EQ(layer_type(g, 5, "attn_q"), SP_TYPE_F16);
    ASSERT_EQ(layer_type(g, 5, "attn_norm"), SP_TYPE_F32);
    ASSERT(sp_quant_mix_find("Q4_K_X") == NULL);
    sp_gguf_close(g);
}

static int
quantize(const char *in, const char *out, const char *type, const char *extra)
{
    char *argv[] = {"quantize", (char *)in, (char *)out, (char *)type, "--threads", "1",
                    "--no-progress", (char *)extra, NULL};
    int rc = sp_cmd_quantize(extra ? 8 : 7, argv);
    fflush(stdout);
    return rc;
}

TEST(quant_mix_command_line)
{
    const char *in = make_model();
    const char *out = tmp_path("mix-out.gguf");
    char err[256];
    sp_gguf_t *g = NULL;
    int64_t v;
    /* "Q4_0" is the mix (output q6_k), "q4_0" the single type */
    ASSERT_EQ(quantize(in, out, "Q4_0", NULL), 0);
    ASSERT_OK(sp_gguf_open(out, &g, err, sizeof err));
    ASSERT_EQ(sp_gguf_find_tensor(g, "token_embd.weight")->type, SP_TYPE_Q6_K);
    ASSERT_EQ(sp_gguf_find_tensor(g, "blk.3.attn_v.weight")->type, SP_TYPE_Q4_0);
    ASSERT_EQ(sp_gguf_find_tensor(g, "blk.3.ffn_down.weight")->type, SP_TYPE_Q4_0); /* from f16 */
    ASSERT_OK(sp_gguf_get_int(g, "general.file_type", &v, err, sizeof err));
    ASSERT_EQ(v, 2);
    sp_gguf_close(g);
    ASSERT_EQ(quantize(in, out, "q4_0", NULL), 0);
    ASSERT_OK(sp_gguf_open(out, &g, err, sizeof err));
    ASSERT_EQ(sp_gguf_find_tensor(g, "token_embd.weight")->type, SP_TYPE_Q4_0);
    sp_gguf_close(g);
    ASSERT_EQ(quantize(in, out, "q8_0", "--pure"), 2); /* --pure is for mixes */
    /* a mix needing a type this build cannot write is refused before writing */
    const char *never = tmp_path("never.gguf");
    float row[256] = {0};
    unsigned char blk[512];
    bool q5k = sp_quantize_row(SP_TYPE_Q5_K, row, blk, 256);
    bool q5_1 = sp_quantize_row(SP_TYPE_Q5_1, row, blk, 32);
    bool q5_0 = sp_quantize_row(SP_TYPE_Q5_0, row, blk, 32);
    ASSERT_EQ(quantize(in, never, "Q4_K_M", "--pure"), q5_0 ? 0 : 1); /* attn_q in q5_0 */
    ASSERT_EQ(quantize(in, never, "Q5_K_M", NULL), q5k && q5_1 ? 0 : 1);
    if (!(q5k && q5_1)) {
        ASSERT(access(never, F_OK) != 0);
    }
    /* --dry-run writes nothing, whatever the types */
    const char *dry = tmp_path("dry.gguf");
    ASSERT_EQ(quantize(in, dry, "Q3_K_M", "--dry-run"), 0);
    ASSERT(access(dry, F_OK) != 0);
}
