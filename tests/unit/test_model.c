/*
 * test_model.c - the engine end to end on the real demo model (stories260K,
 * llama2.c's pretrained 260K-parameter llama) and on broken hyper-parameters.
 */
#include "test.h"

#include "core/alloc.h"
#include "engine/model.h"

#define DEMO "models/stories260K.gguf"

static char *
read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static int32_t
argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = (int32_t)i;
    }
    return best;
}

/* Greedy-generate n_gen tokens after the prompt; returns the decoded text of
 * prompt and continuation with the leading space of the first piece removed,
 * as llama2.c prints it. */
static void
greedy(const char *prompt, int n_gen, int n_threads, char *out, size_t cap)
{
    char err[512];
    sp_model_t *m;
    sp_ctx_t *c;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_threads = n_threads;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    const sp_tokenizer_t *tok = sp_model_tokenizer(m);
    int32_t toks[512];
    int64_t n = sp_tokenizer_encode(tok, prompt, strlen(prompt), true, false, toks, 512);
    ASSERT(n >= 1 && n < 512 - n_gen);
    ASSERT_EQ(toks[0], 1); /* BOS */
    ASSERT_OK(sp_ctx_eval(c, toks, n, 0));
    for (int i = 0; i < n_gen; i++) {
        toks[n] = argmax(sp_ctx_logits(c), sp_model_hparams(m)->n_vocab);
        ASSERT_OK(sp_ctx_eval(c, &toks[n], 1, n));
        n++;
    }
    size_t len = 0;
    for (int64_t i = 1; i < n; i++) {
        int32_t k = sp_tokenizer_piece(tok, toks[i], false, out + len, (int32_t)(cap - len - 1));
        ASSERT(k >= 0 && (size_t)k < cap - len - 1);
        len += (size_t)k;
    }
    out[len] = '\0';
    if (out[0] == ' ') memmove(out, out + 1, len);
    sp_ctx_destroy(c);
    sp_model_free(m);
}

TEST(demo_model_greedy_matches_llama2c_without_prompt)
{
    char text[8192];
    const char *ref = read_text("tests/data/stories260K.greedy-256.txt");
    greedy("", 100, 1, text, sizeof text);
    ASSERT(strlen(text) > 250); /* 100 tokens of story */
    if (strncmp(ref, text, strlen(text)) != 0) {
        SP_TEST_FAIL("greedy text differs from llama2.c:\n  ours: %s\n  ref:  %.*s", text,
                     (int)strlen(text), ref);
    }
}

TEST(demo_model_greedy_matches_llama2c_with_prompt)
{
    char text[8192];
    const char *ref = read_text("tests/data/stories260K.greedy-256.txt");
    greedy("Once upon a time", 100, 2, text, sizeof text);
    ASSERT(strncmp(text, "Once upon a time, there was a little girl named Lily.", 53) == 0);
    if (strncmp(ref, text, strlen(text)) != 0) {
        SP_TEST_FAIL("greedy text differs from llama2.c:\n  ours: %s\n  ref:  %.*s", text,
                     (int)strlen(text), ref);
    }
}

/* Prefill of a whole sequence and one-token decode steps, with 1 and 2
 * threads, must give the same bits: the batch-invariance promise. */
TEST(prefill_decode_and_threads_are_bit_identical)
{
    char err[512];
    sp_model_t *m;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const int64_t V = sp_model_hparams(m)->n_vocab, N = 24;
    int32_t toks[24];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 37 + 1) % V);
    float *ref = NULL;
    for (int mode = 0; mode < 4; mode++) {
        sp_ctx_t *c;
        sp_ctx_params_t cp = sp_ctx_default_params();
        cp.n_threads = 1 + (mode & 1);
        cp.logits_all = true;
        cp.n_ctx = 64;
        cp.n_batch = mode < 2 ? 64 : 7; /* one batch, or uneven chunks */
        ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
        if (mode == 3) {
            for (int i = 0; i < N; i++) ASSERT_OK(sp_ctx_eval(c, &toks[i], 1, i));
        } else {
            ASSERT_OK(sp_ctx_eval(c, toks, N, 0));
        }
        const float *lg = sp_ctx_logits_all(c);
        if (ref == NULL) {
            ref = sp_malloc((size_t)(N * V) * sizeof(float));
            memcpy(ref, lg, (size_t)(N * V) * sizeof(float));
        } else if (memcmp(ref, lg, (size_t)(N * V) * sizeof(float)) != 0) {
            SP_TEST_FAIL("logits differ in mode %d", mode);
        }
        sp_ctx_destroy(c);
    }
    sp_free(ref);
    sp_model_free(m);
}

TEST(eval_rejects_bad_tokens_and_positions)
{
    char err[512];
    sp_model_t *m;
    sp_ctx_t *c;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 16;
    cp.n_threads = 1;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    int32_t bad[2] = {1, 512};
    ASSERT_EQ(sp_ctx_eval(c, bad, 2, 0), SP_ERR_INVALID);
    bad[1] = -1;
    ASSERT_EQ(sp_ctx_eval(c, bad, 2, 0), SP_ERR_INVALID);
    int32_t ok[1] = {1};
    ASSERT_EQ(sp_ctx_eval(c, ok, 1, 16), SP_ERR_INVALID);
    ASSERT_EQ(sp_ctx_eval(c, ok, 0, 0), SP_ERR_INVALID);
    ASSERT_OK(sp_ctx_eval(c, ok, 1, 15));
    sp_ctx_destroy(c);
    sp_model_free(m);
}

TEST(model_load_missing_file_names_it)
{
    char err[512] = "";
    sp_model_t *m = (sp_model_t *)1;
    ASSERT(sp_model_load("tests/data/no-such-model.gguf", &m, err, sizeof err) != SP_OK);
    ASSERT(m == NULL);
    ASSERT(strstr(err, "no-such-model.gguf") != NULL);
}

/* Rebuild the demo model with one metadata key changed, in memory, and load it. */
typedef void (*mutate_fn)(sp_gguf_writer_t *w);

static sp_status_t
load_mutated(mutate_fn mutate, const char *drop_tensor, char *err, size_t err_len)
{
    char e[512];
    sp_gguf_t *g, *g2;
    sp_gguf_writer_t *w;
    void *buf;
    size_t len;
    ASSERT_OK(sp_gguf_open(DEMO, &g, e, sizeof e));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, g));
    mutate(w);
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (drop_tensor != NULL && strcmp(name, drop_tensor) == 0) continue;
        ASSERT_OK(sp_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data));
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, &buf, &len, e, sizeof e));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(g);
    ASSERT_OK(sp_gguf_open_mem(buf, len, "mutated.gguf", &g2, e, sizeof e));
    sp_model_t *m = (sp_model_t *)1;
    sp_status_t st = sp_model_load_gguf(g2, &m, err, err_len); /* takes g2 */
    if (st == SP_OK) {
        sp_model_free(m);
    } else {
        ASSERT(m == NULL);
    }
    sp_free(buf);
    return st;
}

static void mut_none(sp_gguf_writer_t *w) { (void)w; }
static void mut_layers(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.block_count", 600); }
static void mut_layers6(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.block_count", 6); }
static void mut_heads0(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.attention.head_count", 0); }
static void mut_heads7(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.attention.head_count", 7); }
static void mut_kv3(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", 3); }
static void mut_kv16(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", 16); }
static void mut_arch(sp_gguf_writer_t *w) { sp_gguf_writer_set_str(w, "general.architecture", "gpt-j"); }
static void mut_eps(sp_gguf_writer_t *w) { sp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", NAN); }
static void mut_eps_str(sp_gguf_writer_t *w) { sp_gguf_writer_set_str(w, "llama.attention.layer_norm_rms_epsilon", "x"); }
static void mut_ctx(sp_gguf_writer_t *w) { sp_gguf_writer_set_u64(w, "llama.context_length", 1ull << 40); }
static void mut_rot(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.rope.dimension_count", 7); }
static void mut_scaling(sp_gguf_writer_t *w) { sp_gguf_writer_set_str(w, "llama.rope.scaling.type", "dynamic"); }
static void mut_embd(sp_gguf_writer_t *w) { sp_gguf_writer_set_u32(w, "llama.embedding_length", 65); }

/* RELIABILITY.md G17: hyper-parameters are checked before anything is sized. */
TEST(model_rejects_bad_hparams_with_named_key)
{
    char err[512];
    static const struct {
        mutate_fn fn;
        const char *drop;
        sp_status_t st;
        const char *needle;
    } cases[] = {
        {mut_layers, NULL, SP_ERR_FORMAT, "llama.block_count"},
        {mut_layers6, NULL, SP_ERR_FORMAT, "blk.5.attn_norm.weight"},
        {mut_heads0, NULL, SP_ERR_FORMAT, "llama.attention.head_count"},
        {mut_heads7, NULL, SP_ERR_FORMAT, "head_count"},
        {mut_kv3, NULL, SP_ERR_FORMAT, "head_count_kv"},
        {mut_kv16, NULL, SP_ERR_FORMAT, "head_count_kv"},
        {mut_arch, NULL, SP_ERR_UNSUPPORTED, "gpt-j"},
        {mut_eps, NULL, SP_ERR_FORMAT, "layer_norm_rms_epsilon"},
        {mut_eps_str, NULL, SP_ERR_FORMAT, "layer_norm_rms_epsilon"},
        {mut_ctx, NULL, SP_ERR_FORMAT, "context_length"},
        {mut_rot, NULL, SP_ERR_FORMAT, "rope.dimension_count"},
        {mut_scaling, NULL, SP_ERR_UNSUPPORTED, "rope.scaling.type"},
        {mut_embd, NULL, SP_ERR_FORMAT, "embedding_length"},
        {mut_none, "blk.2.ffn_up.weight", SP_ERR_FORMAT, "blk.2.ffn_up.weight"},
        {mut_none, "output_norm.weight", SP_ERR_FORMAT, "output_norm.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        sp_status_t st = load_mutated(cases[i].fn, cases[i].drop, err, sizeof err);
        if (st != cases[i].st || strstr(err, cases[i].needle) == NULL || strstr(err, "mutated.gguf") == NULL) {
            SP_TEST_FAIL("case %zu: status %d, error '%s' (want %d mentioning '%s')", i, st, err,
                         cases[i].st, cases[i].needle);
        }
    }
    /* The unmodified copy loads, and dropping output.weight makes it tied. */
    ASSERT_OK(load_mutated(mut_none, NULL, err, sizeof err));
    ASSERT_OK(load_mutated(mut_none, "output.weight", err, sizeof err));
}

TEST(model_load_oom_cleans_up)
{
    char err[512];
    size_t base = sp_alloc_bytes_in_use();
    int ok = 0;
    for (int64_t n = 0; n < 10000 && !ok; n++) {
        sp_model_t *m;
        sp_ctx_t *c = NULL;
        sp_alloc_fail_after(n);
        if (sp_model_load(DEMO, &m, err, sizeof err) == SP_OK) {
            sp_ctx_params_t cp = sp_ctx_default_params();
            cp.n_threads = 2;
            if (sp_ctx_create(m, &cp, &c, err, sizeof err) == SP_OK) {
                ok = 1;
                sp_ctx_destroy(c);
            }
            sp_model_free(m);
        }
        sp_alloc_fail_after(-1);
        ASSERT_EQ(sp_alloc_bytes_in_use(), base);
    }
    ASSERT(ok);
}
