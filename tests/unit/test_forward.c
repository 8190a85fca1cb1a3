/*
 * test_forward.c - forward-pass options on the demo model (stories260K): the
 * F16 KV cache keeps batch invariance and stays close to the F32 cache, and
 * prefill past one key block (16 positions) with uneven chunks matches
 * decode bit for bit, also when the context ends inside a KV block (sp_ctx
 * runs on a private paged pool, engine/batch.h).
 */
#include "test.h"

#include "core/alloc.h"
#include "engine/model.h"

#define DEMO "models/stories260K.gguf"

/* Logits of every position of toks[0..n) in one context (mode 0: one
 * prefill, 1: chunks of 5, 2: one token at a time). Caller frees. */
static int64_t run_n_ctx = 96;

static float *
run(const sp_model_t *m, const int32_t *toks, int64_t n, sp_kv_type_t kv_type, int n_threads,
    int mode)
{
    char err[512];
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = run_n_ctx;
    cp.n_batch = mode == 1 ? 5 : run_n_ctx;
    cp.n_threads = n_threads;
    cp.logits_all = true;
    cp.kv_type = kv_type;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    if (mode == 2) {
        for (int64_t i = 0; i < n; i++) ASSERT_OK(sp_ctx_eval(c, &toks[i], 1, i));
    } else {
        ASSERT_OK(sp_ctx_eval(c, toks, n, 0));
    }
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *out = sp_malloc((size_t)(n * V) * sizeof(float));
    memcpy(out, sp_ctx_logits_all(c), (size_t)(n * V) * sizeof(float));
    sp_ctx_destroy(c);
    return out;
}

TEST(forward_kv_f16_invariant_and_close_to_f32)
{
    char err[512];
    sp_model_t *m;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const int64_t V = sp_model_hparams(m)->n_vocab, N = 70;
    int32_t toks[70];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(1 + (i * 131 + 7) % (V - 1));
    for (int kt = 0; kt < SP_KV_TYPE_COUNT; kt++) { /* F32, F16, Q8_0 */
        float *ref = run(m, toks, N, (sp_kv_type_t)kt, 1, 0);
        /* 4 threads: decode splits each KV head's query group over two items. */
        for (int mode = 0; mode < 6; mode++) {
            const int nth = mode < 3 ? 2 : 4;
            float *lg = run(m, toks, N, (sp_kv_type_t)kt, nth, mode % 3);
            if (memcmp(ref, lg, (size_t)(N * V) * sizeof(float)) != 0) {
                SP_TEST_FAIL("kv %s: logits differ in mode %d with %d threads",
                             sp_kv_type_name((sp_kv_type_t)kt), mode % 3, nth);
            }
            sp_free(lg);
        }
        sp_free(ref);
    }
    /* F16 keys and values round at 2^-11: the logits move by about that,
     * relative to their size, not more. */
    float *a = run(m, toks, N, SP_KV_TYPE_F32, 1, 0), *b = run(m, toks, N, SP_KV_TYPE_F16, 1, 0);
    double worst = 0.0;
    for (int64_t p = 0; p < N; p++) {
        double mx = 0.0, d = 0.0;
        for (int64_t v = 0; v < V; v++) {
            const double x = a[p * V + v], e = fabs(x - b[p * V + v]);
            mx = fabs(x) > mx ? fabs(x) : mx;
            d = e > d ? e : d;
        }
        worst = d / mx > worst ? d / mx : worst;
    }
    if (!(worst > 0.0 && worst < 1e-2)) {
        SP_TEST_FAIL("F16 vs F32 cache: max relative logit difference %g", worst);
    }
    sp_free(a);
    sp_free(b);
    sp_model_free(m);
}

/* n_ctx 37: the private pool's last block is partly past the context; the
 * whole context is used, in one prefill, chunks of 5 and one at a time. */
TEST(forward_context_ending_inside_a_block)
{
    char err[512];
    sp_model_t *m;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const int64_t V = sp_model_hparams(m)->n_vocab, N = 37;
    int32_t toks[37];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(1 + (i * 97 + 3) % (V - 1));
    run_n_ctx = N;
    float *ref = run(m, toks, N, SP_KV_TYPE_F32, 1, 0);
    for (int mode = 1; mode < 3; mode++) {
        float *lg = run(m, toks, N, SP_KV_TYPE_F32, 2, mode);
        if (memcmp(ref, lg, (size_t)(N * V) * sizeof(float)) != 0) {
            SP_TEST_FAIL("n_ctx 37: logits differ in mode %d", mode);
        }
        sp_free(lg);
    }
    /* One past the context is rejected. */
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = N;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    ASSERT(sp_ctx_eval(c, toks, N, 1) == SP_ERR_INVALID);
    ASSERT_OK(sp_ctx_eval(c, toks, N, 0));
    ASSERT(sp_ctx_logits(c) != NULL && sp_ctx_logits_all(c) == NULL);
    ASSERT(memcmp(sp_ctx_logits(c), ref + (N - 1) * V, (size_t)V * sizeof(float)) == 0);
    sp_ctx_destroy(c);
    run_n_ctx = 96;
    sp_free(ref);
    sp_model_free(m);
}
