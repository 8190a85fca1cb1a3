/*
 * test_repack_model.c - load-time weight repacking at the model level: random-weight
 * llama-shaped models (testmodel.c) with Q4_0, IQ4_NL, MXFP4, Q8_0, Q4_K, IQ4_XS, Q6_K and Q5_K
 * projections, loaded with
 * and without the repack. The packed copy exists exactly when the kernel table has a packed
 * gemm, with the size the layouts give; the greedy tokens are the same either way; IQ4_NL's,
 * Q4_K's and IQ4_XS's logits are the same bits (packed and row kernels share one order of operations);
 * with the repack on, one prefill of all positions gives the bits of evaluating them one at a
 * time, and sequences batched beside others (sp_batch) the bits of each alone.
 * Run at SAMPAN_CPU=avx2 too (tests/run.sh's engine tests; MXFP4 is packed at AVX-512 VNNI only).
 */
#include "test.h"

#include "core/alloc.h"
#include "engine/model.h"
#include "engine/model_impl.h"
#include "crypto/enc.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tools/tools.h"
#include "invariance.h"
#include "testmodel.h"

#include <unistd.h>

/* llama, n_embd E, 4 heads over 2 KV heads, 2 layers, all projections in `type`; weights large
 * enough that the logits are well spread. E = 128, head 32, n_ff 224 (28 groups of 8 rows) for
 * the 32-element types; Q4_K's rows must be whole 256-element super-blocks: E = 256, head 64,
 * n_ff 512. The GGUF bytes go to *buf (testmodel.c). */
static void
rm_build(sp_type_t type, void **buf, size_t *len)
{
    const bool k = type == SP_TYPE_Q4_K || type == SP_TYPE_IQ4_XS || type == SP_TYPE_Q6_K ||
                   type == SP_TYPE_Q5_K;
    const sp_test_llama_t spec = {
        .arch = "llama", .type = type, .n_embd = k ? 256 : 128, .n_head = 4, .n_head_kv = 2,
        .head_dim = k ? 64 : 32, .n_ff = k ? 512 : 224, .n_layer = 2, .n_ctx = 256,
        .rms_eps = 1e-5f, .rope_dim = true, .amp_output = 0.5f, .amp_in = 0.3f,
        .amp_out = 0.2f, .seed = 0x5151u};
    sp_test_llama_gguf(&spec, buf, len);
}

/* The packed bytes the load must report: every projection and the output matrix, each
 * packed tensor 64-byte aligned in the one allocation. */
static size_t
rm_want_bytes(const sp_model_t *m, sp_type_t type)
{
    const sp_hparams_t *hp = sp_model_hparams(m);
    const int64_t E = hp->n_embd, QD = hp->n_head * hp->head_dim,
                  KVD = hp->n_head_kv * hp->head_dim;
    const int64_t shapes[7][2] = {{E, QD},         {E, KVD},   {E, KVD}, {QD, E},
                                  {E, hp->n_ff}, {E, hp->n_ff}, {hp->n_ff, E}};
    const sp_repack_layout_t lay = sp_cpu_kernels()->repack_layout[type];
    size_t total = (sp_repack_bytes_in(lay, type, E, hp->n_vocab) + 63) & ~(size_t)63;
    for (int64_t l = 0; l < hp->n_layer; l++)
        for (int i = 0; i < 7; i++)
            total += (sp_repack_bytes_in(lay, type, shapes[i][0], shapes[i][1]) + 63) & ~(size_t)63;
    return total;
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

/* 30 prompt tokens: at the amx level one whole 16-token tile and a 14-token partial one run on
 * AMX tiles (amx_qgemm.c), so the prefill-vs-one-by-one check covers them too */
#define RM_PROMPT 30
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

static void
rm_check(sp_type_t type)
{
    void *buf;
    size_t len;
    rm_build(type, &buf, &len);
    sp_model_t *plain = rm_load(buf, len, false), *packed = rm_load(buf, len, true);
    ASSERT_EQ(sp_model_repack_bytes(plain), 0);
    const bool packs = sp_cpu_kernels()->repack_gemm[type] != NULL;
    ASSERT_EQ(sp_model_repack_bytes(packed), packs ? rm_want_bytes(packed, type) : 0);
    if (packs) /* sequences beside others in sp_batch: the packed gemm is batch invariant */
        sp_test_beside_others(packed, SP_KV_TYPE_F32, 10, 6, 0x77 + (uint64_t)type,
                              sp_type_name(type));
    sp_test_check_inspect_repack("repack", buf, len, sp_model_repack_bytes(packed));
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
    /* IQ4_NL, MXFP4, Q4_K, IQ4_XS, Q6_K and Q5_K: the packed kernels and the row kernels of every level share one order
     * of operations (q32_impl.h, kquants_impl.h), so the logits are the same bits. Q4_0 and
     * Q8_0: the AVX2 row kernels keep per-lane FMA chains, the packed ones the reference's
     * serial sum, so only the greedy tokens are compared (above). */
    if ((type == SP_TYPE_IQ4_NL || type == SP_TYPE_MXFP4 || type == SP_TYPE_Q4_K ||
         type == SP_TYPE_IQ4_XS || type == SP_TYPE_Q6_K || type == SP_TYPE_Q5_K) &&
        memcmp(la, lb, sizeof(float) * (size_t)(RM_PROMPT * V)) != 0)
        SP_TEST_FAIL("%s: logits with and without repack differ", sp_type_name(type));
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

TEST(repack_model_mxfp4)
{
    rm_check(SP_TYPE_MXFP4);
}

TEST(repack_model_q8_0)
{
    rm_check(SP_TYPE_Q8_0);
}

TEST(repack_model_q4_k)
{
    rm_check(SP_TYPE_Q4_K);
}

/* Bytes of the whole pages of [p, p + len) mapped in this process now (/proc/self/pagemap's
 * present bit: what RSS counts, for file and anonymous pages alike). */
static size_t
rm_resident(const void *p, size_t len)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + len) / page * page;
    FILE *pm = fopen("/proc/self/pagemap", "rb");
    ASSERT(pm != NULL);
    size_t res = 0;
    for (uintptr_t a = lo; a < hi; a += page) {
        uint64_t e = 0;
        ASSERT(fseeko(pm, (off_t)(a / page * 8), SEEK_SET) == 0 && fread(&e, 8, 1, pm) == 1);
        res += (e >> 63) & 1 ? page : 0;
    }
    fclose(pm);
    return res;
}

/* After the repack the file's copy of the packed tensors is given back, for a mapped file
 * (pages out of the process and the page cache; a read faults the file's bytes back), for
 * one read into memory and for a decrypted one (freed; sp__model_refill_originals unpacks them back before the GPU
 * upload would read them). The model computes the same logits either way, and the refilled
 * bytes are the file's. Where the level packs nothing, nothing is released. */
TEST(repack_releases_original_copy)
{
    void *buf;
    size_t len;
    char path[512], err[512];
    rm_build(SP_TYPE_Q8_0, &buf, &len);
    snprintf(path, sizeof path, "%s/release.gguf", sp_test_tmpdir());
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL && fwrite(buf, 1, len, f) == len);
    fclose(f);
    const bool packs = sp_cpu_kernels()->repack_gemm[SP_TYPE_Q8_0] != NULL;
    sp_model_t *ref = rm_load(buf, len, false);
    const int64_t V = sp_model_hparams(ref)->n_vocab;
    float *la = sp_malloc(sizeof(float) * (size_t)(RM_PROMPT * V));
    float *lb = sp_malloc(sizeof(float) * (size_t)(RM_PROMPT * V));
    int32_t ga[RM_GEN], gb[RM_GEN];
    rm_run(ref, false, la, ga);
    /* 0: the mapped file, 1: its private copy, 2: an encrypted file (locked plaintext) */
    char enc_path[600], key_path[600];
    snprintf(enc_path, sizeof enc_path, "%s.enc", path);
    snprintf(key_path, sizeof key_path, "%s/release.key", sp_test_tmpdir());
    sp_enc_key_t key;
    for (int i = 0; i < SP_ENC_KEY_BYTES; i++)
        key.bytes[i] = (uint8_t)(i * 13 + 5);
    ASSERT_OK(sp_enc_encrypt_file(path, enc_path, &key, 64 << 10, err, sizeof err));
    unlink(key_path);
    ASSERT_OK(sp_enc_key_write_file(key_path, &key, err, sizeof err));
    for (int copy = 0; copy < 3; copy++) {
        static const char *const what[3] = {"mapping", "copy", "encrypted"};
        sp_gguf_set_copy_max(copy == 1 ? (size_t)1 << 30 : 0);
        sp_model_t *m;
        if (copy == 2) {
            sp_enc_key_src_t src = {0};
            snprintf(src.file, sizeof src.file, "%s", key_path);
            ASSERT_OK(sp_model_load_ex(enc_path, &src, &m, err, sizeof err));
        } else {
            ASSERT_OK(sp_model_load(path, &m, err, sizeof err));
        }
        sp_gguf_set_copy_max(0);
        ASSERT_EQ(sp_gguf_is_copy(sp_model_gguf(m)), copy == 1);
        const size_t rel = sp_model_repack_released_bytes(m);
        /* the projections and the output matrix of this model, less partial pages */
        if (!packs) {
            ASSERT_EQ(rel, 0);
        } else if (rel < sp_model_repack_bytes(m) / 2) {
            SP_TEST_FAIL("%s: %zu bytes released of %zu packed", what[copy], rel,
                         sp_model_repack_bytes(m));
        }
        const sp_weight_t *wq = &m->layers[0].wq, *out = &m->output;
        const size_t out_bytes = out->row_bytes * (size_t)out->n_out;
        if (packs) /* nothing read them since: still out of memory */
            ASSERT_EQ(rm_resident(out->data, out_bytes), 0);
        rm_run(m, false, lb, gb);
        ASSERT(memcmp(ga, gb, sizeof ga) == 0);
        if (packs)
            ASSERT_EQ(rm_resident(out->data, out_bytes), 0); /* the products read the packed copy */
        ASSERT_OK(sp__model_refill_originals(m, err, sizeof err));
        /* the GGUF bytes are the file's again (refaulted from the file, or refilled) */
        const sp_gguf_t *g = sp_model_gguf(m);
        const sp_gguf_t *gr = sp_model_gguf(ref);
        for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
            const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i), *tr = sp_gguf_tensor(gr, i);
            ASSERT_EQ(t->nbytes, tr->nbytes);
            if (memcmp(t->data, tr->data, t->nbytes) != 0)
                SP_TEST_FAIL("%s: tensor %lld differs from the file after the release",
                             what[copy], (long long)i);
        }
        ASSERT(wq->data != NULL);
        sp_model_free(m);
    }
    sp_free(la);
    sp_free(lb);
    sp_model_free(ref);
    sp_free(buf);
}

TEST(repack_model_iq4_xs)
{
    rm_check(SP_TYPE_IQ4_XS);
}

TEST(repack_model_q6_k)
{
    rm_check(SP_TYPE_Q6_K);
}

TEST(repack_model_q5_k)
{
    rm_check(SP_TYPE_Q5_K);
}
