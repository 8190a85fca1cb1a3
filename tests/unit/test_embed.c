/*
 * test_embed.c - sp_ctx_embed on the demo model (stories260K): mean pooling of
 * the output-normed hidden states, unit length, independent of n_batch and the
 * thread count, and its argument checks.
 */
#include "test.h"

#include "core/alloc.h"
#include "engine/model.h"
#include "kernels/kernels.h"

#define DEMO "models/stories260K.gguf"

static sp_ctx_t *
make_ctx(const sp_model_t *m, int64_t n_ctx, int64_t n_batch, int n_threads, bool logits_all)
{
    char err[512];
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_threads = n_threads;
    cp.logits_all = logits_all;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    return c;
}

/*
 * The output matrix is linear, so the mean of the logits over the positions is
 * W_out times the mean of the normed hidden states, which the embedding is up
 * to its (positive) length s: mean_logits = s * W_out e. Checking that against
 * an ordinary logits_all evaluation tests the pooling without reaching into the
 * engine. The demo model is F32, so both sides are float32 rounding apart.
 */
TEST(embed_is_mean_of_normed_hidden_states)
{
    char err[512];
    sp_model_t *m;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const sp_hparams_t *hp = sp_model_hparams(m);
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    int32_t toks[16];
    int64_t n = sp_tokenizer_encode(sp_model_tokenizer(m), "hello", 5, true, false, toks, 16);
    ASSERT(n >= 2);

    float *e = sp_malloc((size_t)E * sizeof(float));
    sp_ctx_t *c = make_ctx(m, 64, 64, 1, false);
    ASSERT_OK(sp_ctx_embed(c, toks, n, e));
    sp_ctx_destroy(c);
    double norm = 0.0;
    for (int64_t i = 0; i < E; i++) norm += (double)e[i] * e[i];
    ASSERT_NEAR(sqrt(norm), 1.0, 1e-6);

    /* Mean logits over the n positions from a plain evaluation. */
    c = make_ctx(m, 64, 64, 1, true);
    ASSERT_OK(sp_ctx_eval(c, toks, n, 0));
    const float *lg = sp_ctx_logits_all(c);
    double *mean = sp_calloc((size_t)V, sizeof(double));
    for (int64_t p = 0; p < n; p++) {
        for (int64_t v = 0; v < V; v++) mean[v] += lg[p * V + v] / (double)n;
    }
    sp_ctx_destroy(c);

    /* z = W_out e, in double from the file's weights. */
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(sp_model_gguf(m), "output.weight");
    if (t == NULL) t = sp_gguf_find_tensor(sp_model_gguf(m), "token_embd.weight");
    ASSERT(t != NULL && t->ne[0] == E && t->ne[1] == V);
    float *row = sp_malloc((size_t)E * sizeof(float));
    double *z = sp_calloc((size_t)V, sizeof(double));
    double zz = 0.0, mz = 0.0, mmax = 0.0;
    for (int64_t v = 0; v < V; v++) {
        const char *w = (const char *)t->data + (size_t)v * sp_row_size(t->type, E);
        ASSERT(sp_dequantize_row(t->type, w, row, E));
        for (int64_t i = 0; i < E; i++) z[v] += (double)row[i] * e[i];
        zz += z[v] * z[v];
        mz += mean[v] * z[v];
        mmax = fabs(mean[v]) > mmax ? fabs(mean[v]) : mmax;
    }
    const double s = mz / zz; /* least-squares length */
    ASSERT(s > 0.0);
    double worst = 0.0;
    for (int64_t v = 0; v < V; v++) {
        double d = fabs(mean[v] - s * z[v]);
        worst = d > worst ? d : worst;
    }
    if (!(worst <= 1e-5 * mmax)) {
        SP_TEST_FAIL("mean logits differ from s * W_out e by %g (max |logit| %g)", worst, mmax);
    }
    sp_free(z);
    sp_free(row);
    sp_free(mean);
    sp_free(e);
    sp_model_free(m);
}

/* The result must not depend on n_batch, the thread count, logits_all or what
 * the context held before, bit for bit. */
TEST(embed_same_bits_for_batch_and_threads)
{
    char err[512];
    sp_model_t *m;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const int64_t E = sp_model_hparams(m)->n_embd;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)(1 + (i * 53) % 500);
    float *ref = sp_malloc((size_t)E * sizeof(float));
    float *e = sp_malloc((size_t)E * sizeof(float));
    const int64_t batches[4] = {64, 7, 1, 40};
    for (int mode = 0; mode < 4; mode++) {
        sp_ctx_t *c = make_ctx(m, 64, batches[mode], 1 + (mode & 1), mode == 3);
        /* Something else in the cache first: embed must replace it. */
        ASSERT_OK(sp_ctx_eval(c, toks + 3, 20, 0));
        ASSERT_OK(sp_ctx_embed(c, toks, 40, mode == 0 ? ref : e));
        if (mode > 0 && memcmp(ref, e, (size_t)E * sizeof(float)) != 0) {
            SP_TEST_FAIL("embedding differs in mode %d (n_batch %lld)", mode,
                         (long long)batches[mode]);
        }
        sp_ctx_destroy(c);
    }
    sp_free(e);
    sp_free(ref);
    sp_model_free(m);
}

TEST(embed_rejects_bad_arguments)
{
    char err[512];
    sp_model_t *m;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const int64_t E = sp_model_hparams(m)->n_embd;
    float *e = sp_malloc((size_t)E * sizeof(float));
    sp_ctx_t *c = make_ctx(m, 16, 8, 1, false);
    int32_t toks[17];
    for (int i = 0; i < 17; i++) toks[i] = 1 + i;
    ASSERT_EQ(sp_ctx_embed(c, toks, 0, e), SP_ERR_INVALID);
    ASSERT_EQ(sp_ctx_embed(c, toks, -1, e), SP_ERR_INVALID);
    ASSERT_EQ(sp_ctx_embed(c, toks, 17, e), SP_ERR_INVALID); /* n > n_ctx */
    ASSERT_EQ(sp_ctx_embed(c, NULL, 2, e), SP_ERR_INVALID);
    ASSERT_EQ(sp_ctx_embed(c, toks, 2, NULL), SP_ERR_INVALID);
    toks[3] = 512; /* vocabulary is 512 */
    ASSERT_EQ(sp_ctx_embed(c, toks, 5, e), SP_ERR_INVALID);
    toks[3] = -1;
    ASSERT_EQ(sp_ctx_embed(c, toks, 5, e), SP_ERR_INVALID);
    toks[3] = 4;
    ASSERT_OK(sp_ctx_embed(c, toks, 16, e)); /* exactly n_ctx, two chunks */
    sp_ctx_destroy(c);
    sp_free(e);
    sp_model_free(m);
}
