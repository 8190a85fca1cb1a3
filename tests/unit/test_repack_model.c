/*
 * test_repack_model.c - load-time weight repacking at the model level: a random-weight
 * llama-shaped model with Q4_0 (and one with IQ4_NL) projections, loaded with and without
 * the repack. The packed copy exists exactly when the kernel table has a packed gemm; the
 * greedy tokens are the same either way; IQ4_NL's logits are the same bits (the packed and
 * row kernels share q32_impl.h's order of operations); and with the repack on, one prefill
 * of all positions gives the bits of evaluating them one at a time (batch invariance of the
 * packed gemm, decode tiles against prefill tiles).
 */
#include "test.h"

#include "core/alloc.h"
#include "engine/model.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tools/tools.h"

#include <unistd.h>

#define RM_DEMO "models/stories260K.gguf"
#define RM_MAX_T 40

static uint64_t rm_rng = 0x9e3779b97f4a7c15ull;

static float
rm_rand(void)
{
    rm_rng ^= rm_rng << 13;
    rm_rng ^= rm_rng >> 7;
    rm_rng ^= rm_rng << 17;
    return (float)((rm_rng >> 16) & 0xffff) / 32768.0f - 1.0f;
}

static void *rm_bufs[RM_MAX_T];
static int rm_nbufs;

static void
rm_add(sp_gguf_writer_t *w, const char *name, sp_type_t type, int64_t n_in, int64_t n_out,
       float amp)
{
    const int64_t ne[2] = {n_in, n_out};
    const size_t row = sp_row_size(type, n_in);
    float *src = sp_malloc((size_t)n_in * sizeof(float));
    char *data = sp_malloc(row * (size_t)n_out);
    ASSERT(src && data && rm_nbufs < RM_MAX_T);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++)
            src[i] = amp * rm_rand();
        if (type == SP_TYPE_F32)
            memcpy(data + (size_t)r * row, src, (size_t)n_in * sizeof(float));
        else
            ASSERT(sp_quantize_row(type, src, data + (size_t)r * row, n_in));
    }
    sp_free(src);
    rm_bufs[rm_nbufs++] = data;
    ASSERT_OK(sp_gguf_writer_add_tensor(w, name, type, n_out == 1 ? 1 : 2, ne, data));
}

/* llama, n_embd 128, 4 heads of 32 over 2 KV heads (k/v: 64 rows), 2 layers, n_ff 224
 * (28 groups of 8 rows), the output 512 x 128, all projections in `type`; weights large
 * enough that the logits are well spread. The GGUF bytes go to *buf. */
static void
rm_build(sp_type_t type, void **buf, size_t *len)
{
    char err[512];
    sp_gguf_t *demo;
    sp_gguf_writer_t *w;
    const int64_t E = 128, H = 4, HKV = 2, HD = 32, FF = 224, NL = 2, V = 512;
    ASSERT_OK(sp_gguf_open(RM_DEMO, &demo, err, sizeof err));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", "llama"));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.context_length", 256));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)E));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)FF));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)NL));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)H));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)HKV));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)HD));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
    rm_nbufs = 0;
    rm_rng = 0x5151u;
    rm_add(w, "token_embd.weight", type, E, V, 1.0f);
    rm_add(w, "output.weight", type, E, V, 0.5f);
    rm_add(w, "output_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
    for (int64_t l = 0; l < NL; l++) {
        char name[96];
#define T(suffix, ty, n_in, n_out, amp)                                                        \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);                          \
    rm_add(w, name, ty, n_in, n_out, amp)
        T("attn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("attn_q.weight", type, E, H * HD, 0.3f);
        T("attn_k.weight", type, E, HKV * HD, 0.3f);
        T("attn_v.weight", type, E, HKV * HD, 0.3f);
        T("attn_output.weight", type, H * HD, E, 0.2f);
        T("ffn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("ffn_gate.weight", type, E, FF, 0.3f);
        T("ffn_up.weight", type, E, FF, 0.3f);
        T("ffn_down.weight", type, FF, E, 0.2f);
#undef T
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < rm_nbufs; i++)
        sp_free(rm_bufs[i]);
}

static sp_model_t *
rm_load(const void *buf, size_t len, bool repack)
{
    char err[512];
    sp_gguf_t *g;
    sp_model_t *m;
    sp_model_set_repack(repack);
    ASSERT_OK(sp_gguf_open_mem(buf, len, "repack.gguf", &g, err, sizeof err));
    if (sp_model_load_gguf(g, &m, err, sizeof err) != SP_OK)
        SP_TEST_FAIL("model: %s", err);
    sp_model_set_repack(true);
    return m;
}

#define RM_PROMPT 12
#define RM_GEN 12

/* Prefill RM_PROMPT tokens (all logits kept), then RM_GEN greedy tokens; or, one_by_one,
 * every position evaluated alone. Fills logits (RM_PROMPT x V) and gen. */
static void
rm_run(const sp_model_t *m, bool one_by_one, float *logits, int32_t *gen)
{
    char err[512];
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 64; /* logits_all: row p = the logits after position p */
    cp.n_threads = 2;
    cp.logits_all = true;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    int32_t toks[RM_PROMPT];
    for (int i = 0; i < RM_PROMPT; i++)
        toks[i] = (int32_t)(1 + (i * 37) % (V - 1));
    if (one_by_one) {
        for (int i = 0; i < RM_PROMPT; i++) {
            ASSERT_OK(sp_ctx_eval(c, &toks[i], 1, i));
            memcpy(logits + (size_t)i * V, sp_ctx_logits_all(c) + (size_t)i * V,
                   sizeof(float) * (size_t)V);
        }
    } else {
        ASSERT_OK(sp_ctx_eval(c, toks, RM_PROMPT, 0));
        memcpy(logits, sp_ctx_logits_all(c), sizeof(float) * (size_t)(RM_PROMPT * V));
    }
    const float *last = logits + (size_t)(RM_PROMPT - 1) * V;
    for (int i = 0; i < RM_GEN; i++) {
        int32_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (last[v] > last[best])
                best = (int32_t)v;
        gen[i] = best;
        ASSERT_OK(sp_ctx_eval(c, &best, 1, RM_PROMPT + i));
        last = sp_ctx_logits_all(c) + (size_t)(RM_PROMPT + i) * V;
    }
    sp_ctx_destroy(c);
}

/* `sampan inspect --json` on the file reports the bytes the load packed. */
static void
rm_check_inspect(const void *buf, size_t len, size_t want)
{
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/repack.gguf", sp_test_tmpdir());
    snprintf(out, sizeof out, "%s/repack.json", sp_test_tmpdir());
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

static void
rm_check(sp_type_t type)
{
    void *buf;
    size_t len;
    rm_build(type, &buf, &len);
    sp_model_t *plain = rm_load(buf, len, false), *packed = rm_load(buf, len, true);
    ASSERT_EQ(sp_model_repack_bytes(plain), 0);
    if (sp_cpu_kernels()->repack_gemm[type] == NULL) {
        ASSERT_EQ(sp_model_repack_bytes(packed), 0);
    } else { /* 2 layers x (q 128 + k 64 + v 64 + o 128 + gate/up/down 224, 224, 128 rows)
              * + output 512 rows, each 16 + 4 x 18 bytes of a group per 8 rows, 64-aligned */
        ASSERT(sp_model_repack_bytes(packed) >= (size_t)(2 * (128 + 64 + 64 + 128 + 224 * 2 + 128) + 512) / 8 * 4 * 144);
    }
    rm_check_inspect(buf, len, sp_model_repack_bytes(packed));
    const int64_t V = sp_model_hparams(plain)->n_vocab;
    float *la = sp_malloc(sizeof(float) * (size_t)(RM_PROMPT * V));
    float *lb = sp_malloc(sizeof(float) * (size_t)(RM_PROMPT * V));
    float *lc = sp_malloc(sizeof(float) * (size_t)(RM_PROMPT * V));
    int32_t ga[RM_GEN], gb[RM_GEN], gc[RM_GEN];
    rm_run(plain, false, la, ga);
    rm_run(packed, false, lb, gb);
    rm_run(packed, true, lc, gc);
    for (int i = 0; i < RM_GEN; i++) {
        if (ga[i] != gb[i])
            SP_TEST_FAIL("%s: greedy token %d: %d without repack, %d with", sp_type_name(type), i,
                         ga[i], gb[i]);
    }
    if (memcmp(lb, lc, sizeof(float) * (size_t)(RM_PROMPT * V)) != 0)
        SP_TEST_FAIL("%s repacked: prefill logits differ from one-by-one evaluation",
                     sp_type_name(type));
    if (type == SP_TYPE_IQ4_NL && memcmp(la, lb, sizeof(float) * (size_t)(RM_PROMPT * V)) != 0)
        SP_TEST_FAIL("iq4_nl: logits with and without repack differ");
    /* spread check: a flat distribution could not tell the kernels apart */
    double mean = 0, var = 0;
    for (int64_t v = 0; v < V; v++)
        mean += la[v] / (double)V;
    for (int64_t v = 0; v < V; v++)
        var += (la[v] - mean) * (la[v] - mean) / (double)V;
    ASSERT(var >= 1.0);
    sp_free(la);
    sp_free(lb);
    sp_free(lc);
    sp_model_free(plain);
    sp_model_free(packed);
    sp_free(buf);
}

TEST(repack_model_q4_0)
{
    rm_check(SP_TYPE_Q4_0);
}

TEST(repack_model_iq4_nl)
{
    rm_check(SP_TYPE_IQ4_NL);
}
