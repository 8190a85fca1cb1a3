/*
 * test_moe_pack.c - mixture-of-experts tensors packed at load (engine/repack_weights.c: each
 * expert's slice of ffn_{gate,up,down}_exps and the shared expert in the kernel table's packed
 * form) and moe.c's products over them.
 *
 * The contract: a packed product gives the scalar reference's bits (kernels.h), so the MoE
 * block on packed experts equals the block on the file's rows computed by the reference
 * table, bit for bit, at every level, for any number of rows, an expert chosen by every row
 * and experts chosen by none. IQ4_NL, Q4_K and IQ4_XS rows give those bits at every level as
 * well, so there packed == row-major at each level; Q8_0's and Q4_0's AVX2 row kernels keep
 * per-lane FMA chains (last-bit differences, docs/design.md), so only the reference is
 * compared there. Types without a packed gemm (MXFP4, gpt-oss's experts) stay row-major.
 * Whole models: the packed byte count (load and `sampan inspect`), prefill = one-by-one and
 * batch invariance with packed experts, and the file's copy given back and refilled.
 */
#include "test.h"

#include <math.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/pool.h"
#include "engine/model.h"
#include "engine/model_impl.h"
#include "engine/moe.h"
#include "gguf/gguf.h"
#include "invariance.h"
#include "kernels/kernels.h"
#include "testmodel.h"
#include "tools/tools.h"

#define MP_NE 8 /* experts, 2 used */

static bool
mp_ktype(sp_type_t t)
{
    return t == SP_TYPE_Q4_K || t == SP_TYPE_IQ4_XS || t == SP_TYPE_Q6_K || t == SP_TYPE_Q5_K;
}

/* llama with 8 experts (2 used), or qwen2moe with a shared expert of shexp rows; E = 128 and
 * experts 224 wide (28 groups of 8 rows) for the 32-element types, 256 / 256 for the
 * super-block types (whose reference quantisers dominate the test's time: few layers). */
static void
mp_build(sp_type_t type, int64_t shexp, int64_t n_layer, void **buf, size_t *len)
{
    const bool k = mp_ktype(type);
    const int64_t E = k ? 256 : 128, F = k ? 256 : 224;
    const sp_test_llama_t spec = {
        .arch = shexp > 0 ? "qwen2moe" : "llama", .type = type, .n_embd = E, .n_head = 4,
        .n_head_kv = 2, .head_dim = E / 4, .n_ff = F, .n_layer = n_layer, .n_ctx = 256,
        .rms_eps = 1e-5f, .rope_dim = true, .amp_output = 0.5f, .amp_in = 0.3f, .amp_out = 0.2f,
        .seed = 0x3e3e + (uint64_t)type, .n_expert = MP_NE, .n_expert_used = 2, .n_ff_exp = F,
        .n_ff_shexp = shexp};
    sp_test_llama_gguf(&spec, buf, len);
}

static sp_model_t *
mp_load(const void *buf, size_t len, bool repack)
{
    char err[512];
    sp_gguf_t *g;
    sp_model_t *m;
    sp_model_set_repack(repack);
    ASSERT_OK(sp_gguf_open_mem(buf, len, "moe-pack.gguf", &g, err, sizeof err));
    if (sp_model_load_gguf(g, &m, err, sizeof err) != SP_OK)
        SP_TEST_FAIL("model: %s", err);
    sp_model_set_repack(true);
    return m;
}

/* The expert tensors are packed exactly when the load's table has a packed gemm for the type. */
static bool
mp_check_packed_flags(const sp_model_t *m, sp_type_t type)
{
    const bool packs = sp_cpu_kernels()->repack_gemm[type] != NULL;
    for (int64_t l = 0; l < m->hp.n_layer; l++) {
        const sp_moe_layer_t *L = &m->moe->layers[l];
        const sp_experts_t *xs[3] = {&L->gate, &L->up, &L->down};
        for (int i = 0; i < 3; i++) {
            if ((xs[i]->packed != NULL) != packs)
                SP_TEST_FAIL("%s layer %lld tensor %d: packed %d, the table packs %d",
                             sp_type_name(type), (long long)l, i, xs[i]->packed != NULL, packs);
            if (packs) {
                const sp_repack_layout_t lay = sp_cpu_kernels()->repack_layout[type];
                ASSERT_EQ(xs[i]->packed_stride, sp_repack_group_bytes_in(lay, type, xs[i]->n_in));
                ASSERT_EQ(xs[i]->packed_expert_bytes,
                          (sp_repack_bytes_in(lay, type, xs[i]->n_in, xs[i]->n_out) + 63) &
                              ~(size_t)63);
            }
        }
        ASSERT(L->router.packed == NULL); /* F32: no packed form */
    }
    return packs;
}

enum { MP_ROWS = 37 };

/* The block of layer 0 on MP_ROWS hand-made rows, the router replaced by a one-hot matrix
 * (expert e reads input column e) so the choices are known: every row chooses expert 0 first
 * and one of {1, 2, 3, 5} second (rows r % 4), so expert 0 gets every row and 4, 6 and 7
 * none. Run over the first n rows with table k into y. */
static float mp_onehot[MP_NE * 256];

static void
mp_block(sp_model_t *m, const sp_cpu_kernels_t *k, const float *x, int64_t n, float *y)
{
    const int64_t E = m->hp.n_embd;
    sp_moe_layer_t *L = &m->moe->layers[0];
    const sp_experts_t saved = L->router;
    ASSERT(L->router.type == SP_TYPE_F32 && L->router.n_out == MP_NE && E <= 256);
    memset(mp_onehot, 0, sizeof mp_onehot);
    for (int e = 0; e < MP_NE; e++)
        mp_onehot[e * E + e] = 1.0f;
    L->router.data = mp_onehot;
    const size_t sb = sp__moe_scratch_bytes(m, MP_ROWS);
    void *scratch = sp_malloc_aligned(sb, 64);
    sp_pool_t *pool;
    ASSERT(scratch != NULL);
    ASSERT_OK(sp_pool_create(2, &pool));
    sp__moe_ffn(m, 0, pool, k, scratch, MP_ROWS, x, y, n);
    sp_pool_destroy(pool);
    sp_free(scratch);
    L->router = saved;
}

static void
mp_rows(int64_t E, float *x)
{
    uint64_t s = 0x1234567;
    for (int r = 0; r < MP_ROWS; r++) {
        for (int64_t i = 0; i < E; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            x[r * E + i] = (float)((s >> 16) & 0xffff) / 32768.0f - 1.0f;
        }
        static const int second[4] = {1, 2, 3, 5};
        for (int e = 0; e < MP_NE; e++)
            x[r * E + e] = -2.0f;
        x[r * E + 0] = 3.0f;
        x[r * E + second[r % 4]] = 2.0f + 0.01f * (float)r;
    }
}

/* Packed vs the reference at every level, for row counts 1, 2, 7, 8, 13 and 37. */
static void
mp_block_check(sp_type_t type)
{
    void *buf;
    size_t len;
    mp_build(type, 0, 1, &buf, &len);
    sp_model_t *plain = mp_load(buf, len, false), *packed = mp_load(buf, len, true);
    const bool packs = mp_check_packed_flags(packed, type);
    const int64_t E = plain->hp.n_embd;
    float *x = sp_malloc(sizeof(float) * (size_t)(MP_ROWS * E));
    float *yref = sp_malloc(sizeof(float) * (size_t)(MP_ROWS * E));
    float *yrow = sp_malloc(sizeof(float) * (size_t)(MP_ROWS * E));
    float *y = sp_malloc(sizeof(float) * (size_t)(MP_ROWS * E));
    float *ylvl = sp_malloc(sizeof(float) * (size_t)(MP_ROWS * E));
    ASSERT(x && yref && yrow && y && ylvl);
    mp_rows(E, x);
    mp_block(plain, sp_cpu_kernels_ref(), x, MP_ROWS, yref);
    /* the test can fail: the outputs are spread, and a row's second expert matters */
    double ss = 0;
    for (int64_t i = 0; i < E; i++)
        ss += (double)yref[i] * yref[i];
    ASSERT(ss / (double)E > 1e-6);
    ASSERT(memcmp(yref, yref + E, sizeof(float) * (size_t)E) != 0);
    static const int64_t counts[] = {1, 2, 7, 8, 13, MP_ROWS};
    const bool row_is_ref = type != SP_TYPE_Q8_0 && type != SP_TYPE_Q4_0;
    for (int lvl = SP_CPU_SCALAR; lvl <= SP_CPU_TOP; lvl++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lvl);
        if (k == NULL)
            continue;
        /* the experts were packed in the form the process's table reads; a level whose table
         * reads another form (Q8_0: 16-row panels at AVX-512, 8-row groups at AVX2) cannot run
         * them, and the engine never mixes tables within a process */
        if (packs && k->repack_gemm[type] != NULL &&
            k->repack_layout[type] != sp_cpu_kernels()->repack_layout[type])
            continue;
        /* The reference's products with this level's element-wise ops: SwiGLU and exp are
         * checked against the reference with tolerances (test_attn.c), not bits, and the AVX2
         * SwiGLU moves one of Q6_K's 13 x 256 outputs by an ulp; the products are what the
         * packed kernels must match bit for bit. */
        sp_cpu_kernels_t kref = *sp_cpu_kernels_ref();
        kref.swiglu = k->swiglu;
        kref.exp_f32 = k->exp_f32;
        kref.rmsnorm = k->rmsnorm;
        mp_block(plain, &kref, x, MP_ROWS, ylvl);
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            const int64_t n = counts[c];
            mp_block(packed, k, x, n, y);
            const bool used = packs && k->repack_gemm[type] != NULL;
            /* packed products: the reference's bits; row-major ones where every level's are */
            if ((used || row_is_ref) &&
                memcmp(y, ylvl, sizeof(float) * (size_t)(n * E)) != 0)
                SP_TEST_FAIL("%s %s, %lld rows (packed %d): differs from the reference",
                             sp_type_name(type), k->name, (long long)n, used);
            if (row_is_ref || !used) {
                mp_block(plain, k, x, n, yrow);
                if (memcmp(y, yrow, sizeof(float) * (size_t)(n * E)) != 0)
                    SP_TEST_FAIL("%s %s, %lld rows: packed differs from row-major",
                                 sp_type_name(type), k->name, (long long)n);
            }
        }
    }
    sp_free(x);
    sp_free(yref);
    sp_free(ylvl);
    sp_free(yrow);
    sp_free(y);
    sp_model_free(plain);
    sp_model_free(packed);
    sp_free(buf);
    if (!packs)
        SKIP("the %s table has no packed %s gemm: experts row-major (checked as such)",
             sp_cpu_kernels()->name, sp_type_name(type));
}

TEST(moe_pack_block_q4_k)
{
    mp_block_check(SP_TYPE_Q4_K);
}

TEST(moe_pack_block_iq4_xs)
{
    mp_block_check(SP_TYPE_IQ4_XS);
}

TEST(moe_pack_block_q6_k)
{
    mp_block_check(SP_TYPE_Q6_K);
}

TEST(moe_pack_block_q5_k)
{
    mp_block_check(SP_TYPE_Q5_K);
}

TEST(moe_pack_block_q4_0)
{
    mp_block_check(SP_TYPE_Q4_0);
}

TEST(moe_pack_block_iq4_nl)
{
    mp_block_check(SP_TYPE_IQ4_NL);
}

TEST(moe_pack_block_q8_0)
{
    mp_block_check(SP_TYPE_Q8_0);
}

/* gpt-oss's expert type: no packed form at any level today, so the experts stay row-major
 * and the block is the reference's (the check adapts when a level gains one). */
TEST(moe_pack_block_mxfp4)
{
    mp_block_check(SP_TYPE_MXFP4);
}

/* ---- whole models ----------------------------------------------------------------- */

/* The packed bytes the load must report: the dense attention projections and the output
 * matrix, every expert of every expert tensor and the shared expert, each 64-byte aligned. */
static size_t
mp_want_bytes(const sp_model_t *m, sp_type_t type)
{
    const sp_hparams_t *hp = sp_model_hparams(m);
    const sp_moe_hparams_t *mh = &m->moe->hp;
    const int64_t E = hp->n_embd, QD = hp->n_head * hp->head_dim,
                  KVD = hp->n_head_kv * hp->head_dim, F = mh->n_ff_exp, FS = mh->n_ff_shexp;
#define AL(n_in, n_out)                                                                        \
    ((sp_repack_bytes_in(sp_cpu_kernels()->repack_layout[type], type, (n_in), (n_out)) + 63) &    \
     ~(size_t)63)
    size_t total = AL(E, hp->n_vocab);
    for (int64_t l = 0; l < hp->n_layer; l++) {
        total += AL(E, QD) + 2 * AL(E, KVD) + AL(QD, E);
        total += (size_t)mh->n_expert * (2 * AL(E, F) + AL(F, E));
        if (FS > 0)
            total += 2 * AL(E, FS) + AL(FS, E);
    }
#undef AL
    return total;
}

#define MP_PROMPT 24

/* Logits of MP_PROMPT tokens, one prefill or one token at a time. */
static void
mp_run(const sp_model_t *m, bool one_by_one, float *logits)
{
    char err[512];
    sp_ctx_t *c;
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 2;
    cp.logits_all = true;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    int32_t toks[MP_PROMPT];
    for (int i = 0; i < MP_PROMPT; i++)
        toks[i] = (int32_t)(1 + (i * 53) % (V - 1));
    if (one_by_one) {
        for (int i = 0; i < MP_PROMPT; i++)
            ASSERT_OK(sp_ctx_eval(c, &toks[i], 1, i));
    } else {
        ASSERT_OK(sp_ctx_eval(c, toks, MP_PROMPT, 0));
    }
    memcpy(logits, sp_ctx_logits_all(c), sizeof(float) * (size_t)(MP_PROMPT * V));
    sp_ctx_destroy(c);
}

static void
mp_model_check(sp_type_t type, int64_t shexp, int64_t n_layer)
{
    void *buf;
    size_t len;
    mp_build(type, shexp, n_layer, &buf, &len);
    sp_model_t *plain = mp_load(buf, len, false), *packed = mp_load(buf, len, true);
    const bool packs = mp_check_packed_flags(packed, type);
    ASSERT_EQ(sp_model_repack_bytes(plain), 0);
    ASSERT_EQ(sp_model_repack_bytes(packed), packs ? mp_want_bytes(packed, type) : 0);
    sp_test_check_inspect_repack("moe-pack", buf, len, sp_model_repack_bytes(packed));
    const int64_t V = sp_model_hparams(plain)->n_vocab;
    float *la = sp_malloc(sizeof(float) * (size_t)(MP_PROMPT * V));
    float *lb = sp_malloc(sizeof(float) * (size_t)(MP_PROMPT * V));
    float *lc = sp_malloc(sizeof(float) * (size_t)(MP_PROMPT * V));
    mp_run(plain, false, la);
    mp_run(packed, false, lb);
    mp_run(packed, true, lc);
    if (memcmp(lb, lc, sizeof(float) * (size_t)(MP_PROMPT * V)) != 0)
        SP_TEST_FAIL("%s packed: prefill logits differ from one-by-one", sp_type_name(type));
    /* Q4_K / IQ4_XS: packed and row kernels of every level share the reference's order */
    if (mp_ktype(type) && memcmp(la, lb, sizeof(float) * (size_t)(MP_PROMPT * V)) != 0)
        SP_TEST_FAIL("%s: logits with and without repack differ", sp_type_name(type));
    double mean = 0, var = 0; /* spread: flat logits could not tell kernels apart */
    for (int64_t v = 0; v < V; v++)
        mean += la[v] / (double)V;
    for (int64_t v = 0; v < V; v++)
        var += (la[v] - mean) * (la[v] - mean) / (double)V;
    ASSERT(var >= 1.0);
    /* Q8_0 / Q4_0 at AVX2: the row kernels' FMA chains against the packed serial sums differ
     * by a few ulp per dot product (n / 32 + 8 roundings of 2^-24 of the sum of |terms|);
     * through two layers that stays far below 1e-3 of the logits' spread, while one wrong
     * expert moves them by the spread itself. */
    double dmax = 0;
    for (int64_t i = 0; i < MP_PROMPT * V; i++)
        dmax = fabs((double)la[i] - lb[i]) > dmax ? fabs((double)la[i] - lb[i]) : dmax;
    if (dmax > 1e-3 * sqrt(var))
        SP_TEST_FAIL("%s: logits with and without repack differ by %g (spread %g)",
                     sp_type_name(type), dmax, sqrt(var));
    sp_test_beside_others(packed, SP_KV_TYPE_F32, 10, 6, 0x99 + (uint64_t)type,
                          sp_type_name(type));
    sp_free(la);
    sp_free(lb);
    sp_free(lc);
    sp_model_free(plain);
    sp_model_free(packed);
    sp_free(buf);
}

TEST(moe_pack_model_q4_k)
{
    mp_model_check(SP_TYPE_Q4_K, 0, 1);
}

TEST(moe_pack_model_q6_k_shared_expert)
{
    mp_model_check(SP_TYPE_Q6_K, 256, 1);
}

TEST(moe_pack_model_q5_k)
{
    mp_model_check(SP_TYPE_Q5_K, 0, 1);
}

TEST(moe_pack_model_q8_0_shared_expert)
{
    mp_model_check(SP_TYPE_Q8_0, 160, 2);
}

TEST(moe_pack_model_iq4_xs_shared_expert)
{
    mp_model_check(SP_TYPE_IQ4_XS, 256, 1);
}

/* A file read into memory: the experts' file bytes are freed after packing (the products
 * read the packed copy: the logits do not change), and sp__model_refill_originals gives every
 * tensor the file's bytes back. */
TEST(moe_pack_releases_and_refills_experts)
{
    void *buf;
    size_t len;
    char path[512], err[512];
    mp_build(SP_TYPE_Q4_K, 0, 1, &buf, &len);
    snprintf(path, sizeof path, "%s/moe-release.gguf", sp_test_tmpdir());
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL && fwrite(buf, 1, len, f) == len);
    fclose(f);
    sp_model_t *ref = mp_load(buf, len, false);
    sp_gguf_set_copy_max((size_t)1 << 30);
    sp_model_t *m;
    ASSERT_OK(sp_model_load(path, &m, err, sizeof err));
    sp_gguf_set_copy_max(0);
    ASSERT(sp_gguf_is_copy(sp_model_gguf(m)));
    const bool packs = mp_check_packed_flags(m, SP_TYPE_Q4_K);
    const sp_experts_t *dx = &m->moe->layers[0].down;
    const size_t dx_bytes = dx->expert_bytes * (size_t)dx->n_expert;
    if (packs) {
        /* the experts dominate this model: most of the packed bytes come back */
        if (sp_model_repack_released_bytes(m) < sp_model_repack_bytes(m) / 2)
            SP_TEST_FAIL("%zu bytes released of %zu packed", sp_model_repack_released_bytes(m),
                         sp_model_repack_bytes(m));
        /* freed anonymous memory reads as zeros: the file's copy is gone */
        size_t nz = 0;
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        const uintptr_t lo = ((uintptr_t)dx->data + page - 1) / page * page;
        for (uintptr_t a = lo; a + page <= (uintptr_t)dx->data + dx_bytes; a++)
            nz += *(const unsigned char *)a != 0;
        ASSERT_EQ(nz, 0);
    }
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *la = sp_malloc(sizeof(float) * (size_t)(MP_PROMPT * V));
    float *lb = sp_malloc(sizeof(float) * (size_t)(MP_PROMPT * V));
    mp_run(ref, false, la);
    mp_run(m, false, lb);
    ASSERT(memcmp(la, lb, sizeof(float) * (size_t)(MP_PROMPT * V)) == 0);
    ASSERT_OK(sp__model_refill_originals(m, err, sizeof err));
    const sp_gguf_t *g = sp_model_gguf(m), *gr = sp_model_gguf(ref);
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i), *tr = sp_gguf_tensor(gr, i);
        ASSERT_EQ(t->nbytes, tr->nbytes);
        if (memcmp(t->data, tr->data, t->nbytes) != 0)
            SP_TEST_FAIL("tensor %lld differs from the file after the refill", (long long)i);
    }
    sp_free(la);
    sp_free(lb);
    sp_model_free(m);
    sp_model_free(ref);
    sp_free(buf);
    unlink(path);
}
