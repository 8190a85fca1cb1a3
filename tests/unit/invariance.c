/* invariance.c - the batch-invariance check the whole-model tests share (invariance.h). */
#include "invariance.h"

#include "test.h"

#include "core/alloc.h"
#include "engine/batch.h"

float *
sp_test_alone_logits(const sp_model_t *m, const int32_t *toks, int64_t n, sp_kv_type_t kv_type)
{
    char err[512];
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 1;
    cp.n_threads = 1;
    cp.logits_all = true;
    cp.kv_type = kv_type;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    for (int64_t i = 0; i < n; i++) ASSERT_OK(sp_ctx_eval(c, toks + i, 1, i));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *o = sp_malloc((size_t)(n * V) * sizeof(float));
    ASSERT(o != NULL);
    memcpy(o, sp_ctx_logits_all(c), (size_t)(n * V) * sizeof(float));
    sp_ctx_destroy(c);
    return o;
}

void
sp_test_beside_others(const sp_model_t *m, sp_kv_type_t kv_type, int len, int prompt, uint64_t seed,
                      const char *what)
{
    enum { NS = 32, MAX_LEN = 32 };
    ASSERT(prompt >= 1 && prompt < len && len <= MAX_LEN);
    char err[512];
    const int64_t V = sp_model_hparams(m)->n_vocab;
    static int32_t toks[NS][MAX_LEN];
    float *ref[NS];
    uint64_t r = seed ? seed : 1;
    for (int s = 0; s < NS; s++) {
        for (int i = 0; i < len; i++) {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            toks[s][i] = (int32_t)(1 + (uint32_t)(r >> 16) % (uint32_t)(V - 1));
        }
        ref[s] = sp_test_alone_logits(m, toks[s], len, kv_type);
    }
    /* Two blocks per sequence (len <= 32 = 2 x SP_ATTN_BLOCK), handed out in
     * reverse pairs so the block table is not the identity. */
    sp_kv_pool_params_t kp = {NS * 2, kv_type};
    sp_kv_pool_t *kv;
    ASSERT_OK(sp_kv_pool_create(m, &kp, &kv, err, sizeof err));
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_tokens = NS * prompt;
    bp.max_seqs = NS;
    bp.max_ctx = MAX_LEN;
    bp.n_threads = 2;
    sp_batch_t *b;
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));
    static int32_t blocks[NS][2];
    for (int s = 0; s < NS; s++) {
        blocks[s][0] = (int32_t)(2 * s + 1);
        blocks[s][1] = (int32_t)(2 * s);
    }
    sp_batch_seq_t seqs[NS];
    for (int s = 0; s < NS; s++) {
        seqs[s] = (sp_batch_seq_t){toks[s], prompt, 0, blocks[s], 2, true, 0, NULL};
    }
    ASSERT_OK(sp_batch_eval(b, kv, seqs, NS));
    for (int s = 0; s < NS; s++) {
        if (memcmp(sp_batch_logits(b, s), ref[s] + (prompt - 1) * V, (size_t)V * 4) != 0) {
            SP_TEST_FAIL("%s: seq %d prefill beside 31 others differs from alone", what, s);
        }
    }
    for (int p = prompt; p < len; p++) {
        for (int s = 0; s < NS; s++) {
            const int q = (p % 2) ? NS - 1 - s : s; /* other neighbours every step */
            seqs[s] = (sp_batch_seq_t){toks[q] + p, 1, p, blocks[q], 2, true, 0, NULL};
        }
        ASSERT_OK(sp_batch_eval(b, kv, seqs, NS));
        for (int s = 0; s < NS; s++) {
            const int q = (p % 2) ? NS - 1 - s : s;
            if (memcmp(sp_batch_logits(b, s), ref[q] + p * V, (size_t)V * 4) != 0) {
                SP_TEST_FAIL("%s: seq %d pos %d beside 31 others differs from alone", what, q, p);
            }
        }
    }
    /* The sequences differ, so their logits do (the comparison can fail). */
    ASSERT(memcmp(ref[0] + (len - 1) * V, ref[1] + (len - 1) * V, (size_t)V * 4) != 0);
    for (int s = 0; s < NS; s++) sp_free(ref[s]);
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
}
