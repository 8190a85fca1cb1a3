/*
 * test_lora.c - LoRA adapters (engine/lora.h) on the demo model: every kind
 * of bad adapter file is refused with the file and the tensor named; a
 * sequence with an adapter gives the logits of a model whose weights have
 * the adapter merged (W + scale B A, built here); rows of a step with
 * different adapters (and none) are bit-identical to each sequence run alone,
 * and a row without an adapter is bit-identical to the base model. The NumPy
 * reference comparison is tests/py/test_lora.py.
 */
#include "test.h"

#include <math.h>
#include <stdio.h>

#include "core/alloc.h"
#include "engine/batch.h"
#include "gguf/gguf.h"
#include "engine/lora.h"
#include "engine/model.h"
#include "kernels/kernels.h"

#define DEMO "models/stories260K.gguf"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float
rng_normal(void)
{
    /* Sum of 4 uniforms, centred and scaled to unit variance: normal enough. */
    double s = 0;
    for (int i = 0; i < 4; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        s += (double)(rng_state >> 11) / 9007199254740992.0;
    }
    return (float)((s - 2.0) * sqrt(3.0));
}

static const char *const projs[SP_LORA_N_PROJ] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                  "ffn_gate", "ffn_up", "ffn_down"};

/* An adapter made here: per (layer, projection) A (rank, n_in) and B (n_out, rank). */
typedef struct gen_adapter {
    int64_t n_layer;
    int64_t rank;
    float alpha;
    float *a[8][SP_LORA_N_PROJ], *b[8][SP_LORA_N_PROJ];
    int64_t n_in[8][SP_LORA_N_PROJ], n_out[8][SP_LORA_N_PROJ];
} gen_adapter_t;

static void
gen_free(gen_adapter_t *g)
{
    for (int il = 0; il < 8; il++) {
        for (int p = 0; p < SP_LORA_N_PROJ; p++) {
            sp_free(g->a[il][p]);
            sp_free(g->b[il][p]);
        }
    }
}

/* Random A, B for the projections in mask (bit p), every layer of m. */
static void
gen_make(gen_adapter_t *g, const sp_model_t *m, int64_t rank, float alpha, unsigned mask,
         float strength)
{
    const sp_gguf_t *gg = sp_model_gguf(m);
    memset(g, 0, sizeof *g);
    g->n_layer = sp_model_hparams(m)->n_layer;
    g->rank = rank;
    g->alpha = alpha;
    ASSERT(g->n_layer <= 8);
    for (int il = 0; il < g->n_layer; il++) {
        for (int p = 0; p < SP_LORA_N_PROJ; p++) {
            if (!(mask & (1u << p))) continue;
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, projs[p]);
            const sp_gguf_tensor_t *t = sp_gguf_find_tensor(gg, name);
            ASSERT(t != NULL);
            const int64_t n_in = t->ne[0], n_out = t->ne[1];
            g->n_in[il][p] = n_in;
            g->n_out[il][p] = n_out;
            g->a[il][p] = sp_malloc((size_t)(rank * n_in) * sizeof(float));
            g->b[il][p] = sp_malloc((size_t)(rank * n_out) * sizeof(float));
            ASSERT(g->a[il][p] && g->b[il][p]);
            for (int64_t i = 0; i < rank * n_in; i++) g->a[il][p][i] = rng_normal() / sqrtf((float)n_in);
            for (int64_t i = 0; i < rank * n_out; i++) {
                g->b[il][p][i] = strength * rng_normal() / sqrtf((float)rank);
            }
        }
    }
}

enum { BAD_NONE, BAD_SHAPE, BAD_RANK, BAD_MISSING_B, BAD_NAME, BAD_NAN, BAD_TYPE, BAD_NOT_ADAPTER,
       BAD_ARCH, BAD_LAYER, BAD_EMPTY, BAD_ALPHA };

/* The adapter as a GGUF file in memory (free with sp_free). */
static void *
gen_file(const gen_adapter_t *g, int bad, size_t *len)
{
    sp_gguf_writer_t *w;
    char err[256];
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", bad == BAD_ARCH ? "qwen2" : "llama"));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.type", bad == BAD_NOT_ADAPTER ? "model" : "adapter"));
    ASSERT_OK(sp_gguf_writer_set_str(w, "adapter.type", "lora"));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "adapter.lora.alpha", bad == BAD_ALPHA ? NAN : g->alpha));
    static char names[8 * SP_LORA_N_PROJ * 2][96];
    static float junk[64 * 64];
    int nn = 0, first = 1;
    for (int il = 0; il < g->n_layer && bad != BAD_EMPTY; il++) {
        for (int p = 0; p < SP_LORA_N_PROJ; p++) {
            if (g->a[il][p] == NULL) continue;
            int64_t ne_a[2] = {g->n_in[il][p], g->rank}, ne_b[2] = {g->rank, g->n_out[il][p]};
            const float *da = g->a[il][p], *db = g->b[il][p];
            sp_type_t tb = SP_TYPE_F32;
            if (first && bad == BAD_SHAPE) ne_a[0] += 1, da = junk;
            if (first && bad == BAD_RANK) ne_b[0] += 1, db = junk;
            if (first && bad == BAD_NAN) junk[0] = NAN, junk[1] = 1, ne_b[0] = g->rank, db = junk;
            if (first && bad == BAD_TYPE) tb = SP_TYPE_Q4_0, ne_b[0] = 32, db = junk;
            snprintf(names[nn], 96, "blk.%d.%s.weight.lora_a", il, projs[p]);
            ASSERT_OK(sp_gguf_writer_add_tensor(w, names[nn++], SP_TYPE_F32, 2, ne_a, da));
            if (!(first && bad == BAD_MISSING_B)) {
                snprintf(names[nn], 96, "blk.%d.%s.weight.lora_b", il, projs[p]);
                ASSERT_OK(sp_gguf_writer_add_tensor(w, names[nn++], tb, 2, ne_b, db));
            }
            first = 0;
        }
    }
    const int64_t ne4[2] = {4, 4};
    if (bad == BAD_NAME) ASSERT_OK(sp_gguf_writer_add_tensor(w, "output.weight.lora_a", SP_TYPE_F32, 2, ne4, junk));
    if (bad == BAD_LAYER) ASSERT_OK(sp_gguf_writer_add_tensor(w, "blk.5.attn_q.weight.lora_a", SP_TYPE_F32, 2, ne4, junk));
    void *buf;
    ASSERT_OK(sp_gguf_writer_write_mem(w, &buf, len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    return buf;
}

static sp_status_t
load_adapter(const sp_model_t *m, const gen_adapter_t *g, int bad, sp_lora_t **out, char *err,
             size_t err_len)
{
    size_t len;
    void *buf = gen_file(g, bad, &len);
    sp_gguf_t *gg;
    sp_status_t st = sp_gguf_open_mem(buf, len, "adapters/x.gguf", &gg, err, err_len);
    if (st == SP_OK) {
        st = sp_lora_load_gguf(m, gg, out, err, err_len);
        sp_gguf_close(gg);
    }
    sp_free(buf);
    return st;
}

TEST(lora_bad_files_named)
{
    sp_model_t *m;
    char err[512];
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    gen_adapter_t g;
    gen_make(&g, m, 4, 8.0f, 0x7f, 1.0f);
    struct { int bad; const char *want; } cases[] = {
        {BAD_SHAPE, "tensor 'blk.0.attn_q.weight.lora_a' has shape [65, 4], expected [64, r]"},
        {BAD_RANK, "tensor 'blk.0.attn_q.weight.lora_b' has rank 5 but its lora_a has rank 4"},
        {BAD_MISSING_B, "tensor 'blk.0.attn_q.weight.lora_a' has no matching lora_b"},
        {BAD_NAME, "tensor 'output.weight.lora_a' is not a LoRA tensor of this model"},
        {BAD_NAN, "tensor 'blk.0.attn_q.weight.lora_b' holds a NaN"},
        {BAD_TYPE, "tensor 'blk.0.attn_q.weight.lora_b' has type q4_0"},
        {BAD_NOT_ADAPTER, "not a LoRA adapter: general.type is 'model'"},
        {BAD_ARCH, "general.architecture 'qwen2' does not match the model's 'llama'"},
        {BAD_LAYER, "tensor 'blk.5.attn_q.weight.lora_a' is not a LoRA tensor of this model"},
        {BAD_EMPTY, "no lora_a/lora_b tensors"},
        {BAD_ALPHA, "adapter.lora.alpha"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sp_lora_t *l = (sp_lora_t *)1;
        err[0] = '\0';
        sp_status_t st = load_adapter(m, &g, cases[i].bad, &l, err, sizeof err);
        if (st == SP_OK || l != NULL || strstr(err, "adapters/x.gguf: ") != err ||
            strstr(err, cases[i].want) == NULL) {
            SP_TEST_FAIL("case %d: status %d, error '%s', want '%s'", cases[i].bad, (int)st, err,
                         cases[i].want);
        }
    }
    /* A rank above min(n_in, n_out) (attn_k is 32 rows) is refused too. */
    gen_adapter_t big;
    gen_make(&big, m, 33, 0, 1u << SP_LORA_K, 1.0f);
    sp_lora_t *l = NULL;
    ASSERT(load_adapter(m, &big, BAD_NONE, &l, err, sizeof err) != SP_OK);
    ASSERT(strstr(err, "blk.0.attn_k.weight.lora_a' has shape [64, 33], expected [64, r] with "
                       "1 <= r <= 32") != NULL);
    gen_free(&big);
    /* A good one loads; its info and references. */
    ASSERT_OK(load_adapter(m, &g, BAD_NONE, &l, err, sizeof err));
    sp_lora_info_t info;
    sp_lora_get_info(l, &info);
    ASSERT_EQ(info.n_pairs, 5 * 7);
    ASSERT_EQ(info.rank_max, 4);
    ASSERT(sp_lora_mat(l, 2, SP_LORA_UP)->scale == 2.0f); /* alpha 8 / rank 4 */
    sp_lora_t *l2 = NULL;
    ASSERT_OK(load_adapter(m, &g, BAD_NONE, &l2, err, sizeof err));
    ASSERT(sp_lora_id(l2) != sp_lora_id(l));
    sp_lora_ref(l);
    sp_lora_release(l);
    sp_lora_release(l);
    sp_lora_release(l2);
    sp_lora_release(NULL);
    /* A file that does not exist names itself. */
    ASSERT(sp_lora_load(m, "/nonexistent/a.gguf", &l, err, sizeof err) != SP_OK);
    ASSERT(strstr(err, "/nonexistent/a.gguf") != NULL);
    gen_free(&g);
    sp_model_free(m);
}

/* The demo model with W + scale B A merged into every corrected weight, F32. */
static sp_model_t *
merged_model(const sp_model_t *m, const gen_adapter_t *g, void **buf_out)
{
    const sp_gguf_t *gg = sp_model_gguf(m);
    sp_gguf_writer_t *w;
    char err[256];
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, gg));
    float *merged[8][SP_LORA_N_PROJ] = {{0}};
    const double scale = g->alpha != 0 ? g->alpha / (double)g->rank : 1.0;
    for (int64_t i = 0; i < sp_gguf_n_tensors(gg); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(gg, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const void *data = t->data;
        for (int il = 0; il < g->n_layer; il++) {
            for (int p = 0; p < SP_LORA_N_PROJ; p++) {
                char wn[96];
                snprintf(wn, sizeof wn, "blk.%d.%s.weight", il, projs[p]);
                if (g->a[il][p] == NULL || strcmp(wn, name) != 0) continue;
                ASSERT(t->type == SP_TYPE_F32);
                const int64_t n_in = t->ne[0], n_out = t->ne[1];
                float *mw = sp_malloc((size_t)(n_in * n_out) * sizeof(float));
                ASSERT(mw != NULL);
                memcpy(mw, t->data, (size_t)(n_in * n_out) * sizeof(float));
                for (int64_t o = 0; o < n_out; o++) {
                    for (int64_t c = 0; c < n_in; c++) {
                        double s = 0;
                        for (int64_t r = 0; r < g->rank; r++) {
                            s += (double)g->b[il][p][o * g->rank + r] * g->a[il][p][r * n_in + c];
                        }
                        mw[o * n_in + c] = (float)(mw[o * n_in + c] + scale * s);
                    }
                }
                merged[il][p] = mw;
                data = mw;
            }
        }
        ASSERT_OK(sp_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, data));
    }
    size_t len;
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf_out, &len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    for (int il = 0; il < 8; il++) {
        for (int p = 0; p < SP_LORA_N_PROJ; p++) sp_free(merged[il][p]);
    }
    sp_gguf_t *mg;
    sp_model_t *mm;
    ASSERT_OK(sp_gguf_open_mem(*buf_out, len, "merged", &mg, err, sizeof err));
    ASSERT_OK(sp_model_load_gguf(mg, &mm, err, sizeof err));
    return mm;
}

#define LEN 40
#define PER_SEQ 3 /* blocks per sequence: 48 positions */

/* Logits of every position of toks[0..LEN) for model m (adapter l or NULL),
 * one sequence, prefill of 17 then decode: (LEN, n_vocab). */
static float *
run_alone(const sp_model_t *m, const sp_lora_t *l, const int32_t *toks, int threads)
{
    char err[256];
    const int64_t V = sp_model_hparams(m)->n_vocab;
    sp_kv_pool_params_t kp = {PER_SEQ, false};
    sp_kv_pool_t *kv;
    ASSERT_OK(sp_kv_pool_create(m, &kp, &kv, err, sizeof err));
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_ctx = 64;
    bp.n_threads = threads;
    sp_batch_t *b;
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));
    const int32_t blocks[PER_SEQ] = {0, 1, 2};
    float *out = sp_malloc((size_t)(LEN * V) * sizeof(float));
    ASSERT(out != NULL);
    for (int64_t pos = 0; pos < LEN;) {
        /* One token at a time: every position's logits, as decode computes them. */
        sp_batch_seq_t s = {toks + pos, 1, pos, blocks, PER_SEQ, true, 0, l};
        ASSERT_OK(sp_batch_eval(b, kv, &s, 1));
        memcpy(out + pos * V, sp_batch_logits(b, 0), (size_t)V * sizeof(float));
        pos++;
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    return out;
}

TEST(lora_matches_merged_weights)
{
    sp_model_t *m;
    char err[512];
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    int32_t toks[LEN];
    for (int i = 0; i < LEN; i++) toks[i] = 1 + (i * 37) % 500;
    /* Two shapes: every projection at rank 8 (scale 2), and attention only at rank 3. */
    const struct { int64_t rank; float alpha; unsigned mask; } cfg[2] = {{8, 16, 0x7f}, {3, 0, 0x0f}};
    for (int c = 0; c < 2; c++) {
        gen_adapter_t g;
        gen_make(&g, m, cfg[c].rank, cfg[c].alpha, cfg[c].mask, 0.5f);
        sp_lora_t *l;
        ASSERT_OK(load_adapter(m, &g, BAD_NONE, &l, err, sizeof err));
        void *buf;
        sp_model_t *mm = merged_model(m, &g, &buf);
        float *base = run_alone(m, NULL, toks, 1);
        float *with = run_alone(m, l, toks, 1);
        float *want = run_alone(mm, NULL, toks, 1);
        double max_diff = 0, max_change = 0;
        for (int64_t i = 0; i < LEN * V; i++) {
            max_diff = fmax(max_diff, fabs((double)with[i] - want[i]));
            max_change = fmax(max_change, fabs((double)want[i] - base[i]));
        }
        /* F32 throughout; the two orders of summation differ by rounding only. */
        if (max_diff > 2e-4 || max_change < 0.5) {
            SP_TEST_FAIL("config %d: max |adapter - merged| = %g, max change from base %g", c,
                         max_diff, max_change);
        }
        sp_free(base);
        sp_free(with);
        sp_free(want);
        sp_model_free(mm);
        sp_free(buf);
        sp_lora_release(l);
        gen_free(&g);
    }
    sp_model_free(m);
}

/* Three sequences (no adapter, adapter A, adapter B) in shared steps: mixed
 * prefill chunks and decode rows, in changing order, 1 and 2 threads: every
 * row bit-identical to its sequence alone. A lora of another model, or with
 * no adapter at all, keeps the contract. */
TEST(lora_batch_invariance_mixed)
{
    sp_model_t *m;
    char err[512];
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    gen_adapter_t ga, gb;
    gen_make(&ga, m, 8, 8, 0x7f, 0.7f);
    gen_make(&gb, m, 16, 32, 0x55, 0.7f);
    sp_lora_t *la, *lb;
    ASSERT_OK(load_adapter(m, &ga, BAD_NONE, &la, err, sizeof err));
    ASSERT_OK(load_adapter(m, &gb, BAD_NONE, &lb, err, sizeof err));
    const sp_lora_t *ls[3] = {NULL, la, lb};
    int32_t toks[3][LEN];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < LEN; i++) toks[s][i] = 1 + (i * 37 + s * 11) % 500;
    }
    /* Every sequence has the same tokens in the second half of the test: the
     * adapters alone make them differ. */
    float *ref[3];
    for (int s = 0; s < 3; s++) ref[s] = run_alone(m, ls[s], toks[s], 1);
    float *plain = run_alone(m, NULL, toks[1], 1);
    ASSERT(memcmp(plain, ref[1], (size_t)V * sizeof(float)) != 0); /* the adapter changes it */
    sp_free(plain);

    for (int threads = 1; threads <= 2; threads++) {
        sp_kv_pool_params_t kp = {3 * PER_SEQ, false};
        sp_kv_pool_t *kv;
        ASSERT_OK(sp_kv_pool_create(m, &kp, &kv, err, sizeof err));
        sp_batch_params_t bp = sp_batch_default_params();
        bp.max_ctx = 64;
        bp.n_threads = threads;
        sp_batch_t *b;
        ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));
        int32_t blocks[3][PER_SEQ];
        for (int s = 0; s < 3; s++) {
            for (int k = 0; k < PER_SEQ; k++) blocks[s][k] = (int32_t)((2 - s) * PER_SEQ + k);
        }
        int64_t done[3] = {0, 0, 0};
        const int64_t chunk[3] = {5, 9, 13};
        for (int step = 0; step < 100; step++) {
            sp_batch_seq_t seqs[3];
            int idx[3], n = 0;
            for (int k = 0; k < 3; k++) {
                const int s = (k + step) % 3; /* a different order every step */
                if (done[s] >= LEN) continue;
                int64_t take = done[s] < 20 ? chunk[s] : 1;
                if (done[s] + take > LEN) take = LEN - done[s];
                seqs[n] = (sp_batch_seq_t){toks[s] + done[s], take, done[s], blocks[s], PER_SEQ,
                                           true, 0, ls[s]};
                idx[n++] = s;
            }
            if (n == 0) break;
            ASSERT_OK(sp_batch_eval(b, kv, seqs, n));
            for (int i = 0; i < n; i++) {
                const int s = idx[i];
                const int64_t last = seqs[i].pos + seqs[i].n_tokens - 1;
                if (memcmp(sp_batch_logits(b, i), ref[s] + last * V, (size_t)V * sizeof(float)) != 0) {
                    SP_TEST_FAIL("threads %d step %d seq %d pos %lld differs from the sequence alone",
                                 threads, step, s, (long long)last);
                }
                done[s] += seqs[i].n_tokens;
            }
        }
        for (int s = 0; s < 3; s++) ASSERT_EQ(done[s], LEN);

        /* An adapter of another model is refused, nothing computed. */
        sp_model_t *m2;
        ASSERT_OK(sp_model_load(DEMO, &m2, err, sizeof err));
        sp_lora_t *l2;
        ASSERT_OK(load_adapter(m2, &ga, BAD_NONE, &l2, err, sizeof err));
        sp_batch_seq_t bad = {toks[0], 1, 0, blocks[0], PER_SEQ, true, 0, l2};
        ASSERT_EQ(sp_batch_eval(b, kv, &bad, 1), SP_ERR_INVALID);
        sp_lora_release(l2);
        sp_model_free(m2);
        sp_batch_destroy(b);
        sp_kv_pool_destroy(kv);
    }
    for (int s = 0; s < 3; s++) sp_free(ref[s]);
    sp_lora_release(la);
    sp_lora_release(lb);
    gen_free(&ga);
    gen_free(&gb);
    sp_model_free(m);
}
