/*
 * test_batch.c - the multi-sequence forward pass over a paged KV pool
 * (engine/batch.h): every row's logits must be bit-identical to the same
 * sequence run alone in its own sp_ctx, whatever else is in the step (other
 * sequences' prefill chunks and decode tokens, 1 to 32 of them, in any
 * order), wherever its blocks live, after a block copy (prefix sharing) and
 * with 1 or 2 threads. Two models: the demo (stories260K, 8 heads over 4 KV
 * heads, F32) and a random-weight qwen2-shaped GQA model (8 heads over 2 KV
 * heads, Q8_0 weights, QKV bias, NeoX RoPE) built here in memory.
 */
#include "test.h"

#include "core/alloc.h"
#include "core/pool.h"
#include "engine/batch.h"
#include "engine/gpu.h"
#include "gguf/gguf.h"
#include "engine/model.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"
#include "testmodel.h"

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

/* ---- models ---------------------------------------------------------------- */

typedef struct test_model {
    sp_model_t *m;
    void *buf;       /* the in-memory GGUF (GQA model), freed after the model */
} test_model_t;

static void
load_demo(test_model_t *tm)
{
    char err[512];
    tm->buf = NULL;
    ASSERT_OK(sp_model_load(DEMO, &tm->m, err, sizeof err));
}

/* Tensor data kept alive until the writer has written. */
#define MAX_TENSORS 256
static void *tensor_bufs[MAX_TENSORS];
static int n_tensor_bufs;

static void
add_random(sp_gguf_writer_t *w, const char *name, sp_type_t type, int64_t n_in, int64_t n_out,
           float amp)
{
    const int64_t ne[2] = {n_in, n_out};
    const size_t row = sp_row_size(type, n_in);
    float *src = sp_malloc((size_t)n_in * sizeof(float));
    char *data = sp_malloc(row * (size_t)n_out);
    ASSERT(src && data && n_tensor_bufs < MAX_TENSORS);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++) {
            src[i] = amp * ((float)(rng_u32() & 0xffff) / 32768.0f - 1.0f);
        }
        if (type == SP_TYPE_F32) {
            memcpy(data + (size_t)r * row, src, (size_t)n_in * sizeof(float));
        } else {
            ASSERT(sp_quantize_row(type, src, data + (size_t)r * row, n_in));
        }
    }
    sp_free(src);
    tensor_bufs[n_tensor_bufs++] = data;
    ASSERT_OK(sp_gguf_writer_add_tensor(w, name, type, n_out == 1 ? 1 : 2, ne, data));
}

/* A 3-D tensor of random values: n_exp matrices of n_out rows of n_in (experts). */
static void
add_random3(sp_gguf_writer_t *w, const char *name, sp_type_t type, int64_t n_in, int64_t n_out,
            int64_t n_exp, float amp)
{
    const int64_t ne[3] = {n_in, n_out, n_exp};
    const size_t row = sp_row_size(type, n_in);
    float *src = sp_malloc((size_t)n_in * sizeof(float));
    char *data = sp_malloc(row * (size_t)(n_out * n_exp));
    ASSERT(src && data && n_tensor_bufs < MAX_TENSORS);
    for (int64_t r = 0; r < n_out * n_exp; r++) {
        for (int64_t i = 0; i < n_in; i++) {
            src[i] = amp * ((float)(rng_u32() & 0xffff) / 32768.0f - 1.0f);
        }
        ASSERT(sp_quantize_row(type, src, data + (size_t)r * row, n_in));
    }
    sp_free(src);
    tensor_bufs[n_tensor_bufs++] = data;
    ASSERT_OK(sp_gguf_writer_add_tensor(w, name, type, 3, ne, data));
}

/* The head size load_gqa uses, n_embd = 8 of them (the Q8_0 KV cache test
 * sets 40: one whole group of 32 and a partial one). */
static int64_t gqa_head_dim = 16;

/* qwen2, n_embd 128, 8 heads of 16 over 2 KV heads, 2 layers, n_ff 160,
 * Q8_0 matrices, the demo's tokenizer (512 tokens); testmodel.c builds it. */
static void
load_gqa(test_model_t *tm)
{
    char err[512];
    sp_gguf_t *g;
    size_t len;
    const sp_test_llama_t spec = {
        .arch = "qwen2", .type = SP_TYPE_Q8_0, .n_embd = 8 * gqa_head_dim, .n_head = 8,
        .n_head_kv = 2, .head_dim = gqa_head_dim, .n_ff = 160, .n_layer = 2, .n_ctx = 512,
        .rms_eps = 1e-6f, .qkv_bias = true, .amp_output = 0.3f, .amp_in = 0.2f,
        .amp_out = 0.1f, .seed = 0x1234567u};
    sp_test_llama_gguf(&spec, &tm->buf, &len);
    ASSERT_OK(sp_gguf_open_mem(tm->buf, len, "gqa.gguf", &g, err, sizeof err));
    if (sp_model_load_gguf(g, &tm->m, err, sizeof err) != SP_OK) SP_TEST_FAIL("gqa model: %s", err);
    const sp_hparams_t *hp = sp_model_hparams(tm->m);
    ASSERT(hp->n_head == 8 && hp->n_head_kv == 2 && hp->rope_type == SP_ROPE_NEOX);
}

static void
free_model(test_model_t *tm)
{
    sp_model_free(tm->m);
    sp_free(tm->buf);
}

/* Logits after every position of toks[0..n), the sequence alone in an sp_ctx
 * (one thread). Caller frees. */
static float *
ctx_logits(const sp_model_t *m, const int32_t *toks, int64_t n, sp_kv_type_t kv_type)
{
    char err[512];
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 1;
    cp.logits_all = true;
    cp.kv_type = kv_type;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    ASSERT_OK(sp_ctx_eval(c, toks, n, 0));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *out = sp_malloc((size_t)(n * V) * sizeof(float));
    memcpy(out, sp_ctx_logits_all(c), (size_t)(n * V) * sizeof(float));
    sp_ctx_destroy(c);
    return out;
}

/* ---- scenario: many sequences, prefill chunks and decode steps mixed ------- */

#define MAX_SEQ 32
#define MAX_LEN 80
#define MAX_BLK (MAX_LEN / SP_KV_BLOCK + 1)

typedef struct scenario {
    int n_seqs;
    bool shuffle;   /* a different order of the sequences every step */
    int layout;     /* 0: blocks in order, 1: reversed, 2: scattered */
    int n_threads;
    sp_kv_type_t kv_type;
} scenario_t;

static void
run_scenario(const sp_model_t *m, const scenario_t *sc)
{
    char err[512];
    const int64_t V = sp_model_hparams(m)->n_vocab;
    int32_t toks[MAX_SEQ][MAX_LEN];
    int64_t len[MAX_SEQ], prompt[MAX_SEQ], chunk[MAX_SEQ], done[MAX_SEQ];
    int32_t blocks[MAX_SEQ][MAX_BLK];
    float *ref[MAX_SEQ];
    ASSERT(sc->n_seqs <= MAX_SEQ);

    rng_state = 0xabcdef12345ull + (uint64_t)sc->n_seqs;
    for (int s = 0; s < sc->n_seqs; s++) {
        prompt[s] = 1 + (s * 7 + 3) % 37;           /* 1..37 prompt tokens */
        len[s] = prompt[s] + 4 + (s * 5) % 11;      /* then 4..14 decode steps */
        chunk[s] = 1 + (s * 3) % 13;                /* prompt fed in chunks of this */
        done[s] = 0;
        for (int64_t i = 0; i < len[s]; i++) toks[s][i] = (int32_t)(1 + rng_u32() % (V - 1));
        ref[s] = ctx_logits(m, toks[s], len[s], sc->kv_type);
    }

    /* The pool: every sequence's blocks, laid out per sc->layout among spare ones. */
    const int64_t per_seq = MAX_BLK, n_pool = 2 * sc->n_seqs * per_seq + 3;
    sp_kv_pool_params_t kp = {n_pool, sc->kv_type};
    sp_kv_pool_t *kv;
    ASSERT_OK(sp_kv_pool_create(m, &kp, &kv, err, sizeof err));
    for (int s = 0; s < sc->n_seqs; s++) {
        for (int64_t i = 0; i < per_seq; i++) {
            const int64_t lin = s * per_seq + i;
            const int64_t id = sc->layout == 0 ? lin
                             : sc->layout == 1 ? n_pool - 1 - lin
                                               : (lin * 13 + 5) % n_pool; /* 13 coprime */
            blocks[s][i] = (int32_t)id;
        }
    }
    ASSERT(n_pool % 13 != 0);

    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_tokens = 512;
    bp.max_seqs = MAX_SEQ;
    bp.max_ctx = MAX_LEN;
    bp.n_threads = sc->n_threads;
    sp_batch_t *b;
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));

    sp_batch_seq_t seqs[MAX_SEQ];
    int idx[MAX_SEQ];
    for (int step = 0; step < 200; step++) {
        int n = 0;
        for (int s = 0; s < sc->n_seqs; s++) {
            if (done[s] < len[s]) idx[n++] = s;
        }
        if (n == 0) break;
        if (sc->shuffle) {
            for (int i = n - 1; i > 0; i--) {
                const int j = (int)(rng_u32() % (uint32_t)(i + 1));
                const int t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
            }
        }
        for (int i = 0; i < n; i++) {
            const int s = idx[i];
            int64_t k = done[s] < prompt[s] ? chunk[s] : 1;
            if (done[s] < prompt[s] && done[s] + k > prompt[s]) k = prompt[s] - done[s];
            seqs[i] = (sp_batch_seq_t){toks[s] + done[s], k, done[s], blocks[s], per_seq,
                                       (step + s) % 3 != 0, 0, NULL};
        }
        ASSERT_OK(sp_batch_eval(b, kv, seqs, n));
        for (int i = 0; i < n; i++) {
            const int s = idx[i];
            const float *lg = sp_batch_logits(b, i);
            const int64_t last = seqs[i].pos + seqs[i].n_tokens - 1;
            if (!seqs[i].logits) {
                ASSERT(lg == NULL);
            } else if (lg == NULL || memcmp(lg, ref[s] + last * V, (size_t)V * sizeof(float)) != 0) {
                SP_TEST_FAIL("%d seqs (shuffle %d layout %d threads %d kv %s): step %d seq %d "
                             "pos %lld differs from the sequence alone", sc->n_seqs, sc->shuffle,
                             sc->layout, sc->n_threads, sp_kv_type_name(sc->kv_type), step, s,
                             (long long)last);
            }
            done[s] += seqs[i].n_tokens;
        }
    }
    for (int s = 0; s < sc->n_seqs; s++) {
        ASSERT_EQ(done[s], len[s]);
        sp_free(ref[s]);
    }
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
}

static void
scenarios(const sp_model_t *m)
{
    const int sizes[] = {1, 2, 8, 32};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        scenario_t sc = {sizes[i], false, 0, 2, SP_KV_TYPE_F32};
        run_scenario(m, &sc);
        sc.shuffle = true;
        sc.layout = (int)(1 + i % 2);
        run_scenario(m, &sc);
    }
    scenario_t one = {8, true, 2, 1, SP_KV_TYPE_F32};
    run_scenario(m, &one);
    scenario_t f16 = {8, true, 2, 2, SP_KV_TYPE_F16};
    run_scenario(m, &f16);
    scenario_t q8 = {8, true, 2, 2, SP_KV_TYPE_Q8_0};
    run_scenario(m, &q8);
}

TEST(batch_matches_sequences_alone_demo)
{
    test_model_t tm;
    load_demo(&tm);
    scenarios(tm.m);
    free_model(&tm);
}

TEST(batch_matches_sequences_alone_gqa_q8_0)
{
    test_model_t tm;
    load_gqa(&tm);
    scenarios(tm.m);
    free_model(&tm);
}

/* A Q8_0 KV cache with head_dim 40 (a whole Q8_0 group and a partial one; the
 * demo's 8 and the gqa model's 16 only have partial ones): every row the same
 * bits in any batch, order, layout and thread count as alone. */
TEST(batch_q8_0_cache_head_dim_40)
{
    test_model_t tm;
    gqa_head_dim = 40;
    load_gqa(&tm);
    gqa_head_dim = 16;
    ASSERT_EQ(sp_model_hparams(tm.m)->head_dim, 40);
    for (int i = 0; i < 3; i++) {
        scenario_t sc = {i == 0 ? 1 : 8, i > 0, i, 1 + i % 2, SP_KV_TYPE_Q8_0};
        run_scenario(tm.m, &sc);
    }
    free_model(&tm);
}

/* ---- prefix sharing: a shared full block and a copied partial block ------- */

/* Copy-on-write copies a block's bytes whatever the cache type (Q8_0 blocks
 * included: their scales live inside the block). */
static void
copy_block_case(sp_kv_type_t kt)
{
    char err[512];
    test_model_t tm;
    load_gqa(&tm);
    const sp_model_t *m = tm.m;
    const int64_t V = sp_model_hparams(m)->n_vocab;
    /* A: 20 prompt tokens then 6 more; B: A's first 20 then 10 of its own. */
    int32_t a[26], bt[30];
    rng_state = 777;
    for (int i = 0; i < 26; i++) a[i] = (int32_t)(1 + rng_u32() % (V - 1));
    for (int i = 0; i < 30; i++) bt[i] = i < 20 ? a[i] : (int32_t)(1 + rng_u32() % (V - 1));
    float *ra = ctx_logits(m, a, 26, kt), *rb = ctx_logits(m, bt, 30, kt);

    sp_kv_pool_params_t kp = {8, kt};
    sp_kv_pool_t *kv;
    ASSERT_OK(sp_kv_pool_create(m, &kp, &kv, err, sizeof err));
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_ctx = 64;
    bp.n_threads = 2;
    sp_batch_t *b;
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));

    int32_t ta[2] = {5, 2}, tb[2] = {5, 6}; /* block 5 shared (full); B's partial copied to 6 */
    sp_batch_seq_t s = {a, 20, 0, ta, 2, true, 0, NULL};
    ASSERT_OK(sp_batch_eval(b, kv, &s, 1));
    ASSERT(memcmp(sp_batch_logits(b, 0), ra + 19 * V, (size_t)V * sizeof(float)) == 0);
    sp_kv_pool_copy_block(kv, 6, 2); /* copy-on-write before either writes position 20 */
    sp_batch_seq_t two[2] = {{a + 20, 3, 20, ta, 2, true, 0, NULL}, {bt + 20, 1, 20, tb, 2, true, 0, NULL}};
    ASSERT_OK(sp_batch_eval(b, kv, two, 2));
    ASSERT(memcmp(sp_batch_logits(b, 0), ra + 22 * V, (size_t)V * sizeof(float)) == 0);
    ASSERT(memcmp(sp_batch_logits(b, 1), rb + 20 * V, (size_t)V * sizeof(float)) == 0);
    /* B runs on past its copied block into a fresh one, A decodes. */
    int32_t tb3[3] = {5, 6, 0};
    for (int64_t p = 21, q = 23; p < 30; p++) {
        sp_batch_seq_t st[2] = {{bt + p, 1, p, tb3, 3, true, 0, NULL},
                                {a + q, 1, q, ta, 2, true, 0, NULL}};
        const int n = q < 26 ? 2 : 1;
        ASSERT_OK(sp_batch_eval(b, kv, st, n));
        ASSERT(memcmp(sp_batch_logits(b, 0), rb + p * V, (size_t)V * sizeof(float)) == 0);
        if (n == 2) {
            ASSERT(memcmp(sp_batch_logits(b, 1), ra + q * V, (size_t)V * sizeof(float)) == 0);
            q++;
        }
    }
    /* Out-of-range copies are ignored, not a crash. */
    sp_kv_pool_copy_block(kv, -1, 0);
    sp_kv_pool_copy_block(kv, 0, 8);
    sp_free(ra);
    sp_free(rb);
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    free_model(&tm);
}

TEST(batch_copy_block_prefix_sharing)
{
    for (int kt = 0; kt < SP_KV_TYPE_COUNT; kt++) {
        copy_block_case((sp_kv_type_t)kt);
    }
}

/* ---- validation ------------------------------------------------------------ */

TEST(batch_rejects_bad_steps)
{
    char err[512];
    test_model_t tm, tg;
    load_demo(&tm);
    load_gqa(&tg);
    const sp_model_t *m = tm.m;
    const int64_t V = sp_model_hparams(m)->n_vocab;

    sp_kv_pool_t *kv, *kv_other;
    sp_kv_pool_params_t kp = {6, false};
    ASSERT(sp_kv_pool_create(m, &(sp_kv_pool_params_t){0, false}, &kv, err, sizeof err) ==
           SP_ERR_INVALID);
    ASSERT(kv == NULL && strstr(err, "n_blocks") != NULL);
    ASSERT(sp_kv_pool_create(m, &(sp_kv_pool_params_t){(int64_t)1 << 40, false}, &kv, err,
                             sizeof err) == SP_ERR_INVALID);
    ASSERT_OK(sp_kv_pool_create(m, &kp, &kv, err, sizeof err));
    ASSERT_OK(sp_kv_pool_create(tg.m, &kp, &kv_other, err, sizeof err));
    ASSERT_EQ(sp_kv_pool_n_blocks(kv), 6);
    ASSERT(sp_kv_block_bytes(m, SP_KV_TYPE_F32) == 2 * sp_kv_block_bytes(m, SP_KV_TYPE_F16));
    {
        /* Q8_0: per (layer, KV head) two tiles of 16 rows of head_dim int8 + one F16
         * scale per 32 (kernels.h); a type outside the enum is refused. */
        const sp_hparams_t *hp = sp_model_hparams(m);
        const size_t row = (size_t)hp->head_dim + 2 * (size_t)((hp->head_dim + 31) / 32);
        ASSERT_EQ(sp_kv_block_bytes(m, SP_KV_TYPE_Q8_0),
                  (size_t)hp->n_layer * (size_t)hp->n_head_kv * 2 * SP_KV_BLOCK * row);
        sp_kv_pool_t *kv_bad;
        ASSERT(sp_kv_pool_create(m, &(sp_kv_pool_params_t){4, (sp_kv_type_t)7}, &kv_bad, err,
                                 sizeof err) == SP_ERR_INVALID && kv_bad == NULL);
    }

    sp_batch_t *b;
    sp_batch_params_t bp = {8, 2, 40, 1, 0};
    ASSERT(sp_batch_create(m, &(sp_batch_params_t){-1, 2, 40, 1, 0}, &b, err, sizeof err) ==
           SP_ERR_INVALID);
    ASSERT(b == NULL);
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));

    int32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    int32_t t0[3] = {0, 1, 2}, t1[3] = {3, 4, 5};
    sp_batch_seq_t ok = {toks, 4, 0, t0, 1, true, 0, NULL};
    ASSERT_OK(sp_batch_eval(b, kv, &ok, 1));
    ASSERT(sp_batch_logits(b, 0) != NULL);
    ASSERT(sp_batch_logits(b, 1) == NULL && sp_batch_logits(b, -1) == NULL);
    float *want = ctx_logits(m, toks, 5, SP_KV_TYPE_F32);
    /* W: a valid sequence that would overwrite position 2 with another token
     * if the bad steps it comes with were computed. */
#define W {toks + 5, 1, 2, t0, 1, true, 0, NULL}

    struct {
        const char *what;
        sp_batch_seq_t s[3];
        int64_t n;
        sp_kv_pool_t *kv;
    } bad[] = {
        {"no sequences", {W}, 0, kv},
        {"more than max_seqs", {W, {toks, 1, 0, t1, 1, true, 0, NULL},
                                {toks, 1, 0, t1 + 1, 1, true, 0, NULL}}, 3, kv},
        {"more than max_tokens", {W, {toks, 8, 0, t1, 1, true, 0, NULL}}, 2, kv},
        {"zero tokens", {{toks, 0, 4, t0, 1, true, 0, NULL}}, 1, kv},
        {"NULL tokens", {{NULL, 1, 4, t0, 1, true, 0, NULL}}, 1, kv},
        {"NULL blocks", {{toks, 1, 4, NULL, 1, true, 0, NULL}}, 1, kv},
        {"token id = n_vocab", {{(int32_t[]){(int32_t)V}, 1, 4, t0, 1, true, 0, NULL}}, 1, kv},
        {"negative token id", {{(int32_t[]){-1}, 1, 4, t0, 1, true, 0, NULL}}, 1, kv},
        {"negative position", {{toks, 1, -1, t0, 1, true, 0, NULL}}, 1, kv},
        {"past max_ctx", {{toks, 2, 39, t0, 3, true, 0, NULL}}, 1, kv},
        {"too few blocks", {{toks, 2, 15, t0, 1, true, 0, NULL}}, 1, kv},
        {"block id outside the pool", {{toks, 1, 16, (int32_t[]){0, 6}, 2, true, 0, NULL}}, 1, kv},
        {"negative block id", {{toks, 1, 0, (int32_t[]){-1}, 1, true, 0, NULL}}, 1, kv},
        {"two writers of one block", {W, {toks, 1, 3, t0, 1, true, 0, NULL}}, 2, kv},
        {"one block twice in a table", {{toks, 2, 15, (int32_t[]){3, 3}, 2, true, 0, NULL}}, 1, kv},
        {"pool of another model", {W}, 1, kv_other},
        {"n_logits > n_tokens", {{toks, 2, 0, t0, 1, true, 3, NULL}}, 1, kv},
        {"negative n_logits", {{toks, 2, 0, t0, 1, true, -1, NULL}}, 1, kv},
        {"more kept logits than max_logits", {{toks, 3, 0, t0, 1, true, 3, NULL}}, 1, kv},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* The valid first sequence of a bad step must not be computed. */
        if (sp_batch_eval(b, bad[i].kv, bad[i].s, bad[i].n) != SP_ERR_INVALID) {
            SP_TEST_FAIL("bad step accepted: %s", bad[i].what);
        }
        ASSERT(sp_batch_logits(b, 0) == NULL);
    }
#undef W
    ASSERT(sp_batch_eval(b, NULL, &ok, 1) == SP_ERR_INVALID);
    ASSERT(sp_batch_eval(b, kv, NULL, 1) == SP_ERR_INVALID);
    ASSERT(sp_batch_eval(NULL, kv, &ok, 1) == SP_ERR_INVALID);
    /* Nothing was written: position 4 continues the sequence exactly. */
    sp_batch_seq_t next = {toks + 4, 1, 4, t0, 1, true, 0, NULL};
    ASSERT_OK(sp_batch_eval(b, kv, &next, 1));
    ASSERT(memcmp(sp_batch_logits(b, 0), want + 4 * V, (size_t)V * sizeof(float)) == 0);

    /* n_logits: the logits of the last n_logits tokens, each bit-identical to the
     * position's logits computed any other way (what a speculative verification
     * reads); with room for them (max_logits) besides one per other sequence. */
    sp_batch_t *b2;
    ASSERT_OK(sp_batch_create(m, &(sp_batch_params_t){8, 2, 40, 1, 6}, &b2, err, sizeof err));
    sp_batch_seq_t two_rows[2] = {{toks, 5, 0, t0, 1, true, 5, NULL},
                                  {toks, 1, 0, t1, 1, true, 0, NULL}};
    ASSERT_OK(sp_batch_eval(b2, kv, two_rows, 2));
    for (int j = 0; j < 5; j++) {
        const float *l = sp_batch_logits_at(b2, 0, j);
        ASSERT(l != NULL && memcmp(l, want + j * V, (size_t)V * sizeof(float)) == 0);
    }
    ASSERT(sp_batch_logits_at(b2, 0, 5) == NULL && sp_batch_logits_at(b2, 0, -1) == NULL);
    ASSERT(sp_batch_logits(b2, 0) == sp_batch_logits_at(b2, 0, 0));
    ASSERT(memcmp(sp_batch_logits(b2, 1), want, (size_t)V * sizeof(float)) == 0);
    ASSERT(sp_batch_logits_at(b2, 1, 1) == NULL);
    sp_batch_destroy(b2);

    sp_free(want);
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    sp_kv_pool_destroy(kv_other);
    free_model(&tm);
    free_model(&tg);
}

/* ---- the architectures beyond the llama family ------------------------------- */

/* A random model of one architecture (testmodel.h says what each has on): Q8_0
 * matrices, F32 norms in [-1, 1), small caps for gemma (the caps bend these logits);
 * phi3's contexts here (80 and 256) exceed its original 64, so its long factors are used. */
static void
load_dense(test_model_t *tm, const char *arch)
{
    char err[512];
    sp_gguf_t *g;
    size_t len;
    const bool gemma = strncmp(arch, "gemma", 5) == 0;
    const sp_test_arch_t spec = {
        .arch = arch, .type = SP_TYPE_Q8_0, .seed = 0x7654321u,
        .amp_embd = gemma ? 0.2f : 1.0f, .amp_output = strcmp(arch, "olmo2") == 0 ? 0.3f : 0.0f,
        .amp_in = 0.2f, .amp_out = 0.1f, .norm_base = 0.0f, .norm_amp = 1.0f,
        .final_softcap = 3.0f, .attn_softcap = 1.5f,
    };
    sp_test_arch_gguf(&spec, &tm->buf, &len);
    ASSERT_OK(sp_gguf_open_mem(tm->buf, len, "dense.gguf", &g, err, sizeof err));
    if (sp_model_load_gguf(g, &tm->m, err, sizeof err) != SP_OK) {
        SP_TEST_FAIL("%s model: %s", arch, err);
    }
    ASSERT(strcmp(sp_model_hparams(tm->m)->arch, arch) == 0);
}

/* Each row's logits bit-identical to its sequence alone, beside 1 to 31
 * others, shuffled, in scattered blocks, with F32, F16 and Q8_0 caches: with
 * sliding windows (the sequences here run to 80 positions past a window of
 * 8), soft-caps, post-norms, q/k norms, fused matrices, LongRoPE and no-RoPE
 * layers. */
TEST(batch_matches_sequences_alone_dense_archs)
{
    const char *archs[] = {"qwen3", "gemma2", "gemma3", "phi3", "smollm3", "granite", "olmo2"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        test_model_t tm;
        load_dense(&tm, archs[i]);
        scenario_t big = {32, true, 2, 2, SP_KV_TYPE_F32};
        run_scenario(tm.m, &big);
        scenario_t f16 = {8, true, 1, 2, SP_KV_TYPE_F16};
        run_scenario(tm.m, &f16);
        scenario_t q8 = {8, true, 2, 1, SP_KV_TYPE_Q8_0};
        run_scenario(tm.m, &q8);
        free_model(&tm);
    }
}

/* gemma4 as llama.cpp's converter lays it out (F32 norms, Q8_0 matrices), the
 * demo's tokenizer: layers S S S G S G (S: sliding, window 8, heads of 32 over
 * 2 KV heads; G: global, heads of 64 over 1 KV head, a quarter of each head
 * rotated through rope_freqs), the last two layers reading the caches of
 * layers 2 and 3 with a double-wide FFN, per-layer inputs of 32, no attn_v on
 * the global layers (values = keys), a scalar per layer output. */
static void
load_gemma4_ex(test_model_t *tm, bool moe)
{
    char err[512], name[96];
    sp_gguf_t *demo, *g;
    sp_gguf_writer_t *w;
    size_t len;
    enum { H = 4, E = 64, FF = 96, NL = 6, NKV = 4, V = 512, P = 32, HDS = 32, HDG = 64 };
    enum { NEXP = 8, FFE = 32 };
    static const bool swa[NL] = {true, true, true, false, true, false};
    static const int32_t n_kv[NL] = {2, 2, 2, 1, 2, 1};
    static const int32_t ff[NL] = {FF, FF, FF, FF, 2 * FF, 2 * FF};
    static float rope_freqs[HDG / 2];
    for (int i = 0; i < HDG / 2; i++) {
        rope_freqs[i] = i < HDG / 8 ? 1.0f : 1e30f; /* a quarter of the pairs rotate */
    }
    ASSERT_OK(sp_gguf_open(DEMO, &demo, err, sizeof err));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", "gemma4"));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.context_length", 512));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.embedding_length", E));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.block_count", NL));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.attention.head_count", H));
    ASSERT_OK(sp_gguf_writer_set_arr(w, "gemma4.attention.head_count_kv", SP_GGUF_TYPE_INT32,
                                     NL, n_kv));
    ASSERT_OK(sp_gguf_writer_set_arr(w, "gemma4.feed_forward_length", SP_GGUF_TYPE_INT32, NL,
                                     ff));
    ASSERT_OK(sp_gguf_writer_set_arr(w, "gemma4.attention.sliding_window_pattern",
                                     SP_GGUF_TYPE_BOOL, NL, swa));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.attention.key_length", HDG));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.attention.value_length", HDG));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.attention.key_length_swa", HDS));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.attention.value_length_swa", HDS));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.rope.dimension_count", HDG));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.rope.dimension_count_swa", HDS));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "gemma4.rope.freq_base", 1000000.0f));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "gemma4.rope.freq_base_swa", 10000.0f));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.attention.sliding_window", 8));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.attention.shared_kv_layers", 2));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.embedding_length_per_layer_input", P));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "gemma4.attention.layer_norm_rms_epsilon", 1e-6f));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "gemma4.final_logit_softcapping", 3.0f));
    if (moe) {
        ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.expert_count", NEXP));
        ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.expert_used_count", 2));
        ASSERT_OK(sp_gguf_writer_set_u32(w, "gemma4.expert_feed_forward_length", FFE));
    }
    n_tensor_bufs = 0;
    rng_state = 0x5eed4u;
    add_random(w, "token_embd.weight", SP_TYPE_Q8_0, E, V, 0.2f);
    add_random(w, "output_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
    ASSERT_OK(sp_gguf_writer_add_tensor(w, "rope_freqs.weight", SP_TYPE_F32, 1,
                                        (const int64_t[]){HDG / 2, 1}, rope_freqs));
    add_random(w, "per_layer_token_embd.weight", SP_TYPE_Q8_0, P * NL, V, 1.0f);
    add_random(w, "per_layer_model_proj.weight", SP_TYPE_Q8_0, E, P * NL, 0.2f);
    add_random(w, "per_layer_proj_norm.weight", SP_TYPE_F32, P, 1, 1.0f);
    for (int64_t l = 0; l < NL; l++) {
        const int64_t hd = swa[l] ? HDS : HDG;
#define T(suffix, type, n_in, n_out, amp)                                     \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);         \
    add_random(w, name, type, n_in, n_out, amp)
        T("attn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("attn_q.weight", SP_TYPE_Q8_0, E, H * hd, 0.2f);
        T("attn_q_norm.weight", SP_TYPE_F32, hd, 1, 1.0f);
        if (l < NKV) {
            T("attn_k.weight", SP_TYPE_Q8_0, E, n_kv[l] * hd, 0.2f);
            if (swa[l]) {
                T("attn_v.weight", SP_TYPE_Q8_0, E, n_kv[l] * hd, 0.2f);
            }
            T("attn_k_norm.weight", SP_TYPE_F32, hd, 1, 1.0f);
        }
        T("attn_output.weight", SP_TYPE_Q8_0, H * hd, E, 0.1f);
        T("post_attention_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("ffn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("ffn_gate.weight", SP_TYPE_Q8_0, E, ff[l], 0.2f);
        T("ffn_up.weight", SP_TYPE_Q8_0, E, ff[l], 0.2f);
        T("ffn_down.weight", SP_TYPE_Q8_0, ff[l], E, 0.1f);
        T("post_ffw_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        if (moe) {
            /* the experts beside the MLP: layers 0, 2, 4 with gate and up fused (the
             * converter's layout), the others apart */
            T("ffn_gate_inp.weight", SP_TYPE_F32, E, NEXP, 1.0f);
            T("ffn_gate_inp.scale", SP_TYPE_F32, E, 1, 8.0f);
            T("pre_ffw_norm_2.weight", SP_TYPE_F32, E, 1, 1.0f);
            T("post_ffw_norm_1.weight", SP_TYPE_F32, E, 1, 1.0f);
            T("post_ffw_norm_2.weight", SP_TYPE_F32, E, 1, 1.0f);
            T("ffn_down_exps.scale", SP_TYPE_F32, NEXP, 1, 1.0f);
            snprintf(name, sizeof name, "blk.%lld.ffn_down_exps.weight", (long long)l);
            add_random3(w, name, SP_TYPE_Q8_0, FFE, E, NEXP, 0.2f);
            if (l % 2 == 0) {
                snprintf(name, sizeof name, "blk.%lld.ffn_gate_up_exps.weight", (long long)l);
                add_random3(w, name, SP_TYPE_Q8_0, E, 2 * FFE, NEXP, 0.2f);
            } else {
                snprintf(name, sizeof name, "blk.%lld.ffn_gate_exps.weight", (long long)l);
                add_random3(w, name, SP_TYPE_Q8_0, E, FFE, NEXP, 0.2f);
                snprintf(name, sizeof name, "blk.%lld.ffn_up_exps.weight", (long long)l);
                add_random3(w, name, SP_TYPE_Q8_0, E, FFE, NEXP, 0.2f);
            }
        }
        T("layer_output_scale.weight", SP_TYPE_F32, 1, 1, 1.0f);
        T("inp_gate.weight", SP_TYPE_Q8_0, E, P, 0.2f);
        T("proj.weight", SP_TYPE_Q8_0, P, E, 0.2f);
        T("post_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
#undef T
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, &tm->buf, &len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < n_tensor_bufs; i++) sp_free(tensor_bufs[i]);
    ASSERT_OK(sp_gguf_open_mem(tm->buf, len, "gemma4.gguf", &g, err, sizeof err));
    if (sp_model_load_gguf(g, &tm->m, err, sizeof err) != SP_OK) {
        SP_TEST_FAIL("gemma4 model: %s", err);
    }
    ASSERT(sp_model_hparams(tm->m)->n_layer_kv == NKV);
}

static void
load_gemma4(test_model_t *tm)
{
    load_gemma4_ex(tm, false);
}

/* gemma4's per-layer sizes, shared caches and per-layer inputs keep the
 * contract: each row's logits bit-identical to its sequence alone, beside 1
 * to 31 others, with F32, F16 and Q8_0 caches. */
TEST(batch_matches_sequences_alone_gemma4)
{
    test_model_t tm;
    load_gemma4(&tm);
    scenario_t big = {32, true, 2, 2, SP_KV_TYPE_F32};
    run_scenario(tm.m, &big);
    scenario_t f16 = {8, true, 1, 2, SP_KV_TYPE_F16};
    run_scenario(tm.m, &f16);
    scenario_t q8 = {8, true, 2, 1, SP_KV_TYPE_Q8_0};
    run_scenario(tm.m, &q8);
    free_model(&tm);
}

/* gemma4's mixture-of-experts variant (experts beside the dense MLP, the router
 * on its own normed input, per-expert scales, gate/up fused or apart, here with
 * the per-layer inputs and shared caches too): the same contract. */
TEST(batch_matches_sequences_alone_gemma4_moe)
{
    test_model_t tm;
    load_gemma4_ex(&tm, true);
    scenario_t big = {32, true, 2, 2, SP_KV_TYPE_F32};
    run_scenario(tm.m, &big);
    scenario_t q8 = {8, true, 2, 1, SP_KV_TYPE_Q8_0};
    run_scenario(tm.m, &q8);
    free_model(&tm);
}

/* The CUDA path keeps gemma4 with experts on the CPU (as every MoE model: no
 * layer on the device, the API never called), and names the feature. */
TEST(gpu_attach_keeps_gemma4_moe_on_cpu)
{
    test_model_t tm;
    char err[512] = "";
    static const sp_cuda_api_t never_called;
    load_gemma4_ex(&tm, true);
    ASSERT_OK(sp_gpu_attach(tm.m, &never_called, 0, -1, err, sizeof err));
    ASSERT_EQ(sp_gpu_model_layers(tm.m), 0);
    const char *f = sp__model_cpu_only_feature(tm.m);
    if (f == NULL || strstr(f, "gemma4") == NULL || strstr(f, "mixture of experts") == NULL) {
        SP_TEST_FAIL("%s", f != NULL ? f : "(no feature named)");
    }
    free_model(&tm);
}

/* The CUDA path refuses gemma4 by name. */
TEST(gpu_attach_refuses_gemma4)
{
    test_model_t tm;
    char err[512] = "";
    static const sp_cuda_api_t never_called;
    load_gemma4(&tm);
    ASSERT_EQ(sp_gpu_attach(tm.m, &never_called, 0, -1, err, sizeof err), SP_ERR_UNSUPPORTED);
    if (strstr(err, "gemma4.gguf") == NULL || strstr(err, "gemma4 architecture") == NULL) {
        SP_TEST_FAIL("%s", err);
    }
    free_model(&tm);
}

/* The CUDA path runs every dense architecture but gemma4 (test_cuda_host compares them
 * with this engine): none of them names a CPU-only feature (gemma4 is refused above). */
TEST(gpu_attach_accepts_dense_features)
{
    const char *ok[] = {"qwen3", "gemma2", "gemma3", "smollm3", "phi3", "granite", "olmo2"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        test_model_t tm;
        load_dense(&tm, ok[i]);
        const char *f = sp__model_cpu_only_feature(tm.m);
        if (f != NULL) {
            SP_TEST_FAIL("%s: named CPU-only for %s", ok[i], f);
        }
        free_model(&tm);
    }
}

/* The row split of a product (sp__batch_mm_chunk): whole tiles of 16 rows, at least one
 * item per 16 rows however few rows or many threads, about 8 items per thread otherwise,
 * and never more than SP_POOL_MAX_CHUNKS items. */
TEST(batch_mm_chunk_split)
{
    static const int64_t rows[] = {1, 15, 16, 17, 100, 256, 2560, 11264, 32000, 152064,
                                   (int64_t)1 << 26};
    static const int threads[] = {1, 2, 3, 8, 64, 512};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            for (int64_t n_tok = 1; n_tok <= 64; n_tok *= 64) {
                const int64_t c = sp__batch_mm_chunk(rows[i], threads[t], n_tok);
                const int64_t items = (rows[i] + c - 1) / c;
                ASSERT(c >= 16 && c % 16 == 0);
                ASSERT(items >= 1 && items <= SP_POOL_MAX_CHUNKS);
                if (rows[i] <= 16 * threads[t]) {
                    ASSERT(c == 16); /* fewer rows than threads' worth of tiles: finest split */
                } else {
                    /* enough items to keep every thread busy, not so many that claiming costs */
                    ASSERT(items >= (int64_t)threads[t] || c == 16);
                    ASSERT(items <= 9 * (int64_t)threads[t] + 1);
                }
            }
        }
    }
}

/* A product job's work items (sp_mm_split_t): in matrix order, each matrix's rows covered
 * once from 0 in non-empty items that start on 16-row tiles, items of at most `chunk` rows,
 * the job's last rows (about one item per thread of the last matrix) in items of at most
 * `fine` = a quarter of an item, none of that on one thread, and never more than
 * SP_POOL_MAX_CHUNKS items. */
TEST(batch_mm_split_items)
{
    static const int64_t jobs[][3] = {{1, 0, 0},     {15, 0, 0},        {16, 0, 0},
                                      {17, 0, 0},    {300, 0, 0},       {2048, 0, 0},
                                      {32000, 0, 0}, {152064, 0, 0},    {2048, 256, 256},
                                      {5632, 5632, 0}, {1, 15, 17},     {16, 16, 16},
                                      {4096, 512, 17}, {(int64_t)1 << 22, 0, 0}};
    static const int threads[] = {1, 2, 3, 8, 64, 512};
    for (size_t ji = 0; ji < sizeof jobs / sizeof jobs[0]; ji++) {
        const int n_w = jobs[ji][2] ? 3 : jobs[ji][1] ? 2 : 1;
        int64_t all = 0;
        for (int i = 0; i < n_w; i++) {
            all += jobs[ji][i];
        }
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            for (int64_t n_tok = 1; n_tok <= 64; n_tok *= 64) {
                sp_mm_split_t s;
                sp__mm_split_init(&s, n_w, jobs[ji], threads[t], n_tok);
                ASSERT(s.chunk == sp__batch_mm_chunk(all, threads[t], n_tok));
                const int64_t quarter = (s.chunk / 4 + 15) & ~(int64_t)15;
                ASSERT(s.fine == (quarter < 16 ? 16 : quarter) && s.fine <= s.chunk);
                ASSERT(s.total >= 1 && s.total <= SP_POOL_MAX_CHUNKS);
                int wi_prev = 0;
                int64_t next = 0, fine_rows = 0;
                for (int64_t item = 0; item < s.total; item++) {
                    int wi;
                    int64_t r0, r1, t0, t1;
                    sp__mm_split_item(&s, item, &wi, &r0, &r1, &t0, &t1);
                    ASSERT(t0 == 0 && t1 == n_tok); /* below 2 * SP_MM_TOK_BLOCK: all tokens */
                    if (wi != wi_prev) {
                        ASSERT(wi == wi_prev + 1 && next == jobs[ji][wi_prev]);
                        wi_prev = wi;
                        next = 0;
                    }
                    ASSERT(r0 == next && r1 > r0 && r1 <= jobs[ji][wi]);
                    ASSERT(r0 % 16 == 0 && r1 - r0 <= s.chunk);
                    if (wi == n_w - 1 && r0 >= s.head) {
                        ASSERT(r1 - r0 <= s.fine);
                        fine_rows += r1 - r0;
                    }
                    next = r1;
                }
                ASSERT(wi_prev == n_w - 1 && next == jobs[ji][n_w - 1]);
                const int64_t last = jobs[ji][n_w - 1];
                if (threads[t] == 1 || s.fine == s.chunk) {
                    ASSERT(fine_rows == 0 || s.fine == s.chunk); /* the plain split */
                } else {
                    /* the tail: the last threads' worth of items, or the whole last matrix */
                    const int64_t want = (int64_t)threads[t] * s.chunk;
                    ASSERT(fine_rows >= (last < want ? last : want));
                    ASSERT(fine_rows < want + 16);
                }
            }
        }
    }
}

/* From 2 * SP_MM_TOK_BLOCK tokens a product's items cut the tokens too: every (matrix, row,
 * token) in exactly one item, rows from 16-row tiles in items of at most SP_MM_ROWS_MAX rows,
 * tokens within blocks of SP_MM_TOK_BLOCK, a row item's token pieces consecutive items (the
 * last row item's in quarter blocks on more than one thread), and the row items few: at most
 * one per matrix more than ~8 items a thread ask for, unless the row cap cuts them. */
TEST(batch_mm_split_token_blocks)
{
    static const int64_t jobs[][3] = {{1, 0, 0},       {300, 0, 0}, {2048, 0, 0},
                                      {2048, 256, 256}, {5632, 5632, 0}, {1, 15, 17}};
    static const int threads[] = {1, 2, 3, 8, 64};
    static const int64_t toks[] = {2 * SP_MM_TOK_BLOCK, 2 * SP_MM_TOK_BLOCK + 1, 200, 512, 1000};
    for (size_t ji = 0; ji < sizeof jobs / sizeof jobs[0]; ji++) {
        const int n_w = jobs[ji][2] ? 3 : jobs[ji][1] ? 2 : 1;
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            for (size_t ki = 0; ki < sizeof toks / sizeof toks[0]; ki++) {
                const int64_t n_tok = toks[ki];
                sp_mm_split_t s;
                sp__mm_split_init(&s, n_w, jobs[ji], threads[t], n_tok);
                ASSERT(s.tb == SP_MM_TOK_BLOCK && s.total >= 1);
                ASSERT(s.total <= SP_POOL_MAX_CHUNKS);
                const int64_t n_tb = (n_tok + SP_MM_TOK_BLOCK - 1) / SP_MM_TOK_BLOCK;
                int64_t all = 0;
                for (int i = 0; i < n_w; i++) {
                    all += jobs[ji][i];
                }
                const int64_t n_ri = ((int64_t)threads[t] * 8 + n_tb - 1) / n_tb;
                ASSERT(s.chunk <= SP_MM_ROWS_MAX);
                ASSERT(s.n_row <= n_ri + n_w || s.chunk == SP_MM_ROWS_MAX);
                ASSERT(s.n_row <= all / SP_MM_ROWS_MAX + n_ri + n_w);
                int prev_wi = -1;
                int64_t prev_r0 = -1, prev_t1 = 0;
                uint8_t *seen[3] = {NULL, NULL, NULL};
                for (int i = 0; i < n_w; i++) {
                    seen[i] = calloc((size_t)(jobs[ji][i] * n_tok), 1);
                    ASSERT(seen[i] != NULL);
                }
                for (int64_t item = 0; item < s.total; item++) {
                    int wi;
                    int64_t r0, r1, t0, t1;
                    sp__mm_split_item(&s, item, &wi, &r0, &r1, &t0, &t1);
                    ASSERT(wi >= 0 && wi < n_w && r0 % 16 == 0 && r1 > r0);
                    ASSERT(r1 <= jobs[ji][wi] && r1 - r0 <= s.chunk);
                    ASSERT(t0 >= 0 && t1 > t0 && t1 <= n_tok && t0 % 16 == 0);
                    ASSERT(t0 / SP_MM_TOK_BLOCK == (t1 - 1) / SP_MM_TOK_BLOCK); /* one block */
                    if (wi == prev_wi && r0 == prev_r0) {
                        ASSERT(t0 == prev_t1); /* the row item's next piece */
                    } else {
                        ASSERT(t0 == 0 && (prev_wi < 0 || prev_t1 == n_tok));
                    }
                    if (item >= s.total - (n_tok + 15) / 16 && threads[t] > 1) {
                        ASSERT(t1 - t0 <= SP_MM_TOK_BLOCK / 4); /* the fine tail */
                    }
                    prev_wi = wi;
                    prev_r0 = r0;
                    prev_t1 = t1;
                    for (int64_t r = r0; r < r1; r++) {
                        for (int64_t tt = t0; tt < t1; tt++) {
                            uint8_t *c = &seen[wi][r * n_tok + tt];
                            ASSERT(*c == 0);
                            *c = 1;
                        }
                    }
                }
                for (int i = 0; i < n_w; i++) {
                    for (int64_t e = 0; e < jobs[ji][i] * n_tok; e++) {
                        ASSERT(seen[i][e] == 1);
                    }
                    free(seen[i]);
                }
            }
        }
    }
}

/*
 * One-token products split the way batch.c splits them (sp_mm_split_t items claimed
 * from the pool) on a 64-thread pool, far more threads than this machine's cores, must give
 * each row vec_dot's bits: the one-token tiles group rows by the item's size (the AVX2 float
 * tile takes 8 rows (r1 - r0) / 8 apart), so every split must give each row the same
 * operations, and every row of every item must be written once. Rows: fewer than the
 * threads, 1, tile edges, several items per thread.
 * Row-layout F16 and Q4_0 through the table's gemm and, where the level has one, the packed
 * Q4_0 and Q4_K gemms; run at every level by tests/run.sh (SAMPAN_CPU).
 */
typedef struct split_job {
    const sp_cpu_kernels_t *k;
    sp_type_t type;
    int64_t n, rows;
    sp_mm_split_t split;
    const void *w;
    size_t ws;
    bool packed;
    const void *x;
    float *y;
} split_job;

static void
split_job_run(void *arg, int64_t item, int ith)
{
    split_job *j = arg;
    (void)ith;
    int wi;
    int64_t r0, r1, t0, t1;
    sp__mm_split_item(&j->split, item, &wi, &r0, &r1, &t0, &t1);
    ASSERT(t0 == 0 && t1 == 1);
    if (j->packed) {
        j->k->repack_gemm[j->type](j->n, j->w, j->ws, r0, r1, j->x, 0, 1, j->y, j->rows);
    } else {
        sp_cpu_gemm(j->k, j->type, j->n, j->w, j->ws, r0, r1, j->x, 0, 1, j->y, j->rows);
    }
}

TEST(batch_one_token_split_64_threads)
{
    static const int64_t row_counts[] = {1, 7, 16, 17, 63, 300, 1100};
    static const sp_type_t types[] = {SP_TYPE_F16, SP_TYPE_Q4_0, SP_TYPE_Q4_K};
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    const int64_t n = 512, max_rows = 1100;
    sp_pool_t *pool;
    ASSERT_OK(sp_pool_create(64, &pool));
    float *wf = sp_malloc(sizeof(float) * (size_t)(n * max_rows));
    float *xf = sp_malloc(sizeof(float) * (size_t)n);
    float *want = sp_malloc(sizeof(float) * (size_t)max_rows);
    float *got = sp_malloc(sizeof(float) * (size_t)max_rows);
    ASSERT(wf && xf && want && got);
    for (int64_t i = 0; i < n * max_rows; i++) {
        wf[i] = (float)((int32_t)(rng_u32() % 2001) - 1000) * 1e-3f;
    }
    for (int64_t i = 0; i < n; i++) {
        xf[i] = (float)((int32_t)(rng_u32() % 2001) - 1000) * 1e-3f;
    }
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const sp_type_t type = types[ti];
        const size_t rs = sp_row_size(type, n);
        uint8_t *w = sp_malloc(rs * (size_t)max_rows);
        ASSERT(w);
        for (int64_t r = 0; r < max_rows; r++) {
            ASSERT(sp_quantize_row(type, wf + r * n, w + (size_t)r * rs, n));
        }
        const sp_type_t xt = k->vec_dot_type[type];
        uint8_t *x = sp_malloc(sp_row_size(xt, n));
        ASSERT(x);
        k->from_float[xt](xf, x, n);
        for (int packed = 0; packed < 2; packed++) {
            if (packed ? k->repack_gemm[type] == NULL : k->gemm[type] == NULL) {
                continue; /* Q4_K goes only packed here; a level without a packed form */
            }
            for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
                const int64_t rows = row_counts[ri];
                split_job j = {.k = k, .type = type, .n = n, .rows = rows, .w = w, .ws = rs,
                               .packed = packed != 0, .x = x, .y = got};
                sp__mm_split_init(&j.split, 1, &rows, 64, 1);
                uint8_t *pw = NULL;
                if (packed) {
                    /* the table's own packed form (Q4_0: 16-row panels at AVX-512 VNNI) */
                    const sp_repack_layout_t lay = k->repack_layout[type];
                    const int gr = sp_repack_layout_rows(lay);
                    pw = sp_malloc(sp_repack_bytes_in(lay, type, n, rows));
                    ASSERT(pw);
                    sp_repack_pack_in(lay, type, n, w, rs, rows, 0, (rows + gr - 1) / gr, pw);
                    j.w = pw;
                    j.ws = sp_repack_group_bytes_in(lay, type, n);
                }
                /* each row alone: vec_dot (the packed gemms give the reference's bits) */
                const sp_cpu_kernels_t *dk = packed ? sp_cpu_kernels_ref() : k;
                for (int64_t r = 0; r < rows; r++) {
                    dk->vec_dot[type](n, &want[r], w + (size_t)r * rs, x);
                }
                for (int rep = 0; rep < 3; rep++) {
                    for (int64_t r = 0; r < rows; r++) {
                        got[r] = -12345.0f;
                    }
                    sp_pool_run(pool, split_job_run, &j, j.split.total);
                    for (int64_t r = 0; r < rows; r++) {
                        if (memcmp(&got[r], &want[r], sizeof(float)) != 0) {
                            SP_TEST_FAIL("%s %s%s rows %" PRId64 " item %" PRId64
                                         ": y[%" PRId64 "] = %.9g, vec_dot %.9g",
                                         k->name, sp_type_name(type), packed ? " packed" : "",
                                         rows, j.split.chunk, r, got[r], want[r]);
                        }
                    }
                }
                sp_free(pw);
            }
        }
        sp_free(x);
        sp_free(w);
    }
    sp_free(wf);
    sp_free(xf);
    sp_free(want);
    sp_free(got);
    sp_pool_destroy(pool);
}
