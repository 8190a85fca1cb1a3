/*
 * test_swa.c - the two-part KV pool (sliding-window layers keep their window
 * only): random gemma2 / gemma3 models (window 8) run sequences of up to 90
 * positions (more than ten windows), batched and shuffled, through a pool
 * whose sliding part is far too small to keep every position, with the
 * scheduler's own table code (sched/swa.h) releasing blocks as the window
 * moves and handing them to other sequences at once. Every row's logits must
 * be bit-identical to the sequence alone on a full one-part cache (sp_ctx):
 * the sliding layers never read outside their window, and a released block
 * reused elsewhere must not be read. Also: the pool's refusals, a step's
 * checks of the sliding table, and the usable length of a cached prefix.
 *
 * Single-threaded test code; everything it allocates is freed per test.
 */
#include "test.h"

#include "core/alloc.h"
#include "engine/batch.h"
#include "engine/model.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "sampan/log.h"
#include "sched/blocks.h"
#include "sched/sched.h"
#include "sched/swa.h"

#define DEMO "models/stories260K.gguf"
#define WINDOW 8

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t
rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

#define MAX_BUFS 64
static void *bufs[MAX_BUFS];
static int n_bufs;

static void
tensor(sp_gguf_writer_t *w, const char *name, sp_type_t type, int64_t n_in, int64_t n_out,
       float amp)
{
    const int64_t ne[2] = {n_in, n_out};
    const size_t row = sp_row_size(type, n_in);
    float *src = sp_malloc((size_t)n_in * sizeof(float));
    char *data = sp_malloc(row * (size_t)n_out);
    ASSERT(src && data && n_bufs < MAX_BUFS);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++) {
            src[i] = amp * ((float)(rnd() & 0xffff) / 32768.0f - 1.0f);
        }
        if (type == SP_TYPE_F32) {
            memcpy(data + (size_t)r * row, src, (size_t)n_in * sizeof(float));
        } else {
            ASSERT(sp_quantize_row(type, src, data + (size_t)r * row, n_in));
        }
    }
    sp_free(src);
    bufs[n_bufs++] = data;
    ASSERT_OK(sp_gguf_writer_add_tensor(w, name, type, n_out == 1 ? 1 : 2, ne, data));
}

/* gemma2 (sliding layers 0 and 2, soft-capped scores) or gemma3 (pattern 2:
 * sliding layers 0 and 2, per-head q/k norms): 4 layers, 4 heads of 32 over
 * 2 KV heads, a window of WINDOW positions, the demo's tokenizer. *buf holds
 * the in-memory file until the model is freed. */
static sp_model_t *
load_gemma(const char *arch, void **buf)
{
    char err[512], key[128], name[96];
    sp_gguf_t *demo, *g;
    sp_gguf_writer_t *w;
    size_t len;
    const int64_t H = 4, HKV = 2, HD = 32, E = 64, FF = 96, NL = 4, V = 512;
    const bool g3 = strcmp(arch, "gemma3") == 0;
    ASSERT_OK(sp_gguf_open(DEMO, &demo, err, sizeof err));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, demo));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", arch));
#define KU(suffix, v)                                                           \
    snprintf(key, sizeof key, "%s.%s", arch, suffix);                           \
    ASSERT_OK(sp_gguf_writer_set_u32(w, key, (uint32_t)(v)))
#define KF(suffix, v)                                                           \
    snprintf(key, sizeof key, "%s.%s", arch, suffix);                           \
    ASSERT_OK(sp_gguf_writer_set_f32(w, key, v))
    KU("context_length", 512);
    KU("embedding_length", E);
    KU("feed_forward_length", FF);
    KU("block_count", NL);
    KU("attention.head_count", H);
    KU("attention.head_count_kv", HKV);
    KU("attention.key_length", HD);
    KU("attention.value_length", HD);
    KU("attention.sliding_window", WINDOW);
    KF("attention.layer_norm_rms_epsilon", 1e-6f);
    KF("final_logit_softcapping", 3.0f);
    if (g3) {
        KU("attention.sliding_window_pattern", 2);
        KF("rope.freq_base", 1000000.0f);
    } else {
        KF("rope.freq_base", 10000.0f);
        KF("attn_logit_softcapping", 1.5f);
    }
#undef KU
#undef KF
    n_bufs = 0;
    rng = 0x13198a2e03707344ull;
    tensor(w, "token_embd.weight", SP_TYPE_Q8_0, E, V, 0.2f);
    tensor(w, "output_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
    for (int64_t l = 0; l < NL; l++) {
#define T(suffix, type, n_in, n_out, amp)                                       \
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);           \
    tensor(w, name, type, n_in, n_out, amp)
        T("attn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("ffn_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("attn_q.weight", SP_TYPE_Q8_0, E, H * HD, 0.2f);
        T("attn_k.weight", SP_TYPE_Q8_0, E, HKV * HD, 0.2f);
        T("attn_v.weight", SP_TYPE_Q8_0, E, HKV * HD, 0.2f);
        T("ffn_gate.weight", SP_TYPE_Q8_0, E, FF, 0.2f);
        T("ffn_up.weight", SP_TYPE_Q8_0, E, FF, 0.2f);
        if (g3) {
            T("attn_q_norm.weight", SP_TYPE_F32, HD, 1, 1.0f);
            T("attn_k_norm.weight", SP_TYPE_F32, HD, 1, 1.0f);
        }
        T("post_attention_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("post_ffw_norm.weight", SP_TYPE_F32, E, 1, 1.0f);
        T("attn_output.weight", SP_TYPE_Q8_0, H * HD, E, 0.1f);
        T("ffn_down.weight", SP_TYPE_Q8_0, FF, E, 0.1f);
#undef T
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, &len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(demo);
    for (int i = 0; i < n_bufs; i++) sp_free(bufs[i]);
    ASSERT_OK(sp_gguf_open_mem(*buf, len, "gemma.gguf", &g, err, sizeof err));
    sp_model_t *m;
    if (sp_model_load_gguf(g, &m, err, sizeof err) != SP_OK) SP_TEST_FAIL("%s: %s", arch, err);
    const sp_hparams_t *hp = sp_model_hparams(m);
    ASSERT(hp->n_swa == WINDOW && hp->layer_swa[0] && !hp->layer_swa[1] && hp->layer_swa[2]);
    return m;
}

/* Every position's logits of tokens[0..n) alone, on a full one-part cache. */
static float *
alone_logits(const sp_model_t *m, const int32_t *toks, int64_t n, sp_kv_type_t kv_type)
{
    char err[256];
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 1;
    cp.logits_all = true;
    cp.kv_type = kv_type;
    sp_ctx_t *c;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    ASSERT_OK(sp_ctx_eval(c, toks, n, 0));
    const int64_t V = sp_model_hparams(m)->n_vocab;
    float *out = sp_malloc((size_t)(n * V) * sizeof(float));
    memcpy(out, sp_ctx_logits_all(c), (size_t)(n * V) * sizeof(float));
    sp_ctx_destroy(c);
    return out;
}

#define N_SEQ 6
#define MAX_LEN 90
#define PER_SEQ ((MAX_LEN + SP_KV_BLOCK - 1) / SP_KV_BLOCK)
#define MAX_CHUNK 13

/*
 * N_SEQ sequences of 60..90 positions, prompts fed in chunks of 1..13 then
 * decoded, shuffled every step, on a two-part pool whose sliding part holds
 * what the windows need (per sequence: a chunk's blocks plus the window's,
 * plus the block the chunk's first position straddles) and nothing more:
 * without releasing, it runs out after a few blocks per sequence.
 */
static void
run_two_part(const sp_model_t *m, sp_kv_type_t kv_type)
{
    char err[256];
    const int64_t V = sp_model_hparams(m)->n_vocab;
    int32_t toks[N_SEQ][MAX_LEN];
    int32_t table[N_SEQ][2 * PER_SEQ]; /* global ids, then the sliding table */
    sp_swa_table_t swa[N_SEQ];
    int64_t len[N_SEQ], prompt[N_SEQ], chunk[N_SEQ], done[N_SEQ];
    float *ref[N_SEQ];
    rng = 0x082efa98ec4e6c89ull;
    for (int s = 0; s < N_SEQ; s++) {
        len[s] = 60 + (s * 11) % 31;
        prompt[s] = 5 + (s * 17) % 50;
        chunk[s] = 1 + (s * 5) % MAX_CHUNK;
        done[s] = 0;
        for (int64_t i = 0; i < len[s]; i++) toks[s][i] = (int32_t)(1 + rnd() % (V - 1));
        ref[s] = alone_logits(m, toks[s], len[s], kv_type);
        for (int64_t i = 0; i < PER_SEQ; i++) table[s][i] = (int32_t)(s * PER_SEQ + i);
        swa[s] = (sp_swa_table_t){table[s] + PER_SEQ, PER_SEQ, 0, 0};
    }
    /* A row of k tokens at pos reads and writes entries first(pos) ..
     * (pos + k - 1) / 16: at most (WINDOW - 1 + k - 1) / 16 + 2 blocks. */
    const int64_t per_seq_swa = (WINDOW + MAX_CHUNK - 2) / SP_KV_BLOCK + 2;
    const int64_t n_swa = N_SEQ * per_seq_swa;
    ASSERT(n_swa <= N_SEQ * PER_SEQ / 2); /* half of every position, or less */
    sp_kv_pool_params_t kp = {N_SEQ * PER_SEQ, kv_type};
    sp_kv_pool_t *kv;
    ASSERT_OK(sp_kv_pool_create_split(m, &kp, n_swa, &kv, err, sizeof err));
    ASSERT_EQ(sp_kv_pool_n_swa_blocks(kv), n_swa);
    sp_blocks_t *sb;
    ASSERT_OK(sp_blocks_create(n_swa, &sb, err, sizeof err));
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_seqs = N_SEQ;
    bp.max_ctx = MAX_LEN;
    bp.n_threads = 2;
    sp_batch_t *b;
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));

    sp_batch_seq_t rows[N_SEQ];
    int idx[N_SEQ], max_held = 0;
    for (int step = 0; step < 400; step++) {
        int n = 0;
        for (int s = 0; s < N_SEQ; s++) {
            if (done[s] < len[s]) idx[n++] = s;
        }
        if (n == 0) break;
        for (int i = n - 1; i > 0; i--) {
            const int j = (int)(rnd() % (uint32_t)(i + 1)), t = idx[i];
            idx[i] = idx[j];
            idx[j] = t;
        }
        for (int i = 0; i < n; i++) {
            const int s = idx[i];
            int64_t k = done[s] < prompt[s] ? chunk[s] : 1;
            if (done[s] < prompt[s] && done[s] + k > prompt[s]) k = prompt[s] - done[s];
            sp_swa_trim(sb, &swa[s], sp_swa_first(WINDOW, done[s]));
            if (!sp_swa_cover(sb, &swa[s], (done[s] + k + SP_KV_BLOCK - 1) / SP_KV_BLOCK)) {
                SP_TEST_FAIL("step %d seq %d pos %lld: the sliding part ran out (%lld held)",
                             step, s, (long long)done[s], (long long)sp_swa_held(&swa[s]));
            }
            const int64_t held = sp_swa_held(&swa[s]);
            ASSERT(held <= per_seq_swa);
            max_held = held > max_held ? (int)held : max_held;
            rows[i] = (sp_batch_seq_t){toks[s] + done[s], k, done[s], table[s], PER_SEQ,
                                       (step + s) % 3 != 0, 0, NULL};
        }
        ASSERT_OK(sp_batch_eval(b, kv, rows, n));
        for (int i = 0; i < n; i++) {
            const int s = idx[i];
            const float *lg = sp_batch_logits(b, i);
            const int64_t last = rows[i].pos + rows[i].n_tokens - 1;
            if (rows[i].logits &&
                (lg == NULL || memcmp(lg, ref[s] + last * V, (size_t)V * sizeof(float)) != 0)) {
                SP_TEST_FAIL("kv %s step %d seq %d pos %lld: differs from the full cache",
                             sp_kv_type_name(kv_type), step, s, (long long)last);
            }
            done[s] += rows[i].n_tokens;
        }
    }
    /* The global blocks grew with each sequence (all PER_SEQ taken by the
     * longest) while its sliding blocks stayed within the window's. */
    for (int s = 0; s < N_SEQ; s++) {
        ASSERT_EQ(done[s], len[s]);
        ASSERT(sp_swa_held(&swa[s]) <= (WINDOW - 1) / SP_KV_BLOCK + 2);
        sp_swa_release(sb, &swa[s]);
        sp_free(ref[s]);
    }
    ASSERT(max_held >= 2);
    char why[256];
    if (!sp_blocks_check(sb, why, sizeof why)) SP_TEST_FAIL("%s", why);
    sp_blocks_stats_t st;
    sp_blocks_get_stats(sb, &st);
    ASSERT_EQ(st.n_free, n_swa);
    sp_batch_destroy(b);
    sp_blocks_destroy(sb);
    sp_kv_pool_destroy(kv);
}

TEST(swa_two_part_pool_matches_full_cache)
{
    const char *archs[] = {"gemma2", "gemma3"};
    for (int a = 0; a < 2; a++) {
        void *buf = NULL;
        sp_model_t *m = load_gemma(archs[a], &buf);
        run_two_part(m, SP_KV_TYPE_F32);
        run_two_part(m, SP_KV_TYPE_Q8_0);
        sp_model_free(m);
        sp_free(buf);
    }
}

/*
 * Prefix reuse after the window moved, as the scheduler does it: sequence A
 * (70 positions) publishes each full block in both parts under the global
 * chain's key and releases its sliding blocks as its window moves (the
 * published ones stay cached); B shares A's first 64 positions then goes
 * its own way. B takes the usable prefix - the 4 global blocks and only the
 * sliding blocks its next token's window reads, the others -1 - and computes
 * from position 64: its logits must equal B alone on a full cache. With the
 * sliding block the window needs evicted, the usable prefix shrinks.
 */
TEST(swa_prefix_reuse_after_the_window_moved)
{
    char err[256];
    void *buf = NULL;
    sp_model_t *m = load_gemma("gemma3", &buf);
    const int64_t V = sp_model_hparams(m)->n_vocab;
    enum { LA = 70, LB = 90, SHARED = 64, NB = 6 };
    int32_t a[LA], bt[LB];
    rng = 0x452821e638d01377ull;
    for (int i = 0; i < LB; i++) bt[i] = (int32_t)(1 + rnd() % (V - 1));
    memcpy(a, bt, SHARED * sizeof(int32_t));
    for (int i = SHARED; i < LA; i++) a[i] = (int32_t)(1 + rnd() % (V - 1));
    float *ref = alone_logits(m, bt, LB, SP_KV_TYPE_F32);

    sp_kv_pool_params_t kp = {2 * NB, SP_KV_TYPE_F32};
    sp_kv_pool_t *kv;
    ASSERT_OK(sp_kv_pool_create_split(m, &kp, 8, &kv, err, sizeof err));
    sp_blocks_t *gb, *sb;
    ASSERT_OK(sp_blocks_create(2 * NB, &gb, err, sizeof err));
    ASSERT_OK(sp_blocks_create(8, &sb, err, sizeof err));
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_seqs = 1;
    bp.max_ctx = LB;
    bp.n_threads = 1;
    sp_batch_t *b;
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));

    /* A: 7 positions a step, publishing full blocks, its window trimmed. */
    int32_t ta[2 * NB];
    sp_swa_table_t sa = {ta + NB, NB, 0, 0};
    uint64_t h = 0, ser = SP_BLOCKS_ROOT;
    int64_t published = 0;
    for (int64_t i = 0; i < NB; i++) ta[i] = sp_blocks_alloc(gb);
    for (int64_t pos = 0; pos < LA; pos += 7) {
        sp_swa_trim(sb, &sa, sp_swa_first(WINDOW, pos));
        ASSERT(sp_swa_cover(sb, &sa, (pos + 7 + SP_KV_BLOCK - 1) / SP_KV_BLOCK));
        sp_batch_seq_t r = {a + pos, 7, pos, ta, NB, false, 0, NULL};
        ASSERT_OK(sp_batch_eval(b, kv, &r, 1));
        for (; (published + 1) * SP_KV_BLOCK <= pos + 7; published++) {
            const int32_t *t = a + published * SP_KV_BLOCK;
            const uint64_t hh = sp_blocks_hash(h, t);
            ASSERT(sa.ids[published] >= 0); /* still held: published before trimming */
            sp_blocks_publish(sb, sa.ids[published], hh, ser, t);
            ser = sp_blocks_publish(gb, ta[published], hh, ser, t);
            h = hh;
        }
    }
    sp_swa_release(sb, &sa);
    for (int64_t i = NB - 1; i >= 0; i--) sp_blocks_unref(gb, ta[i]);

    for (int evict = 0; evict < 2; evict++) {
        /* B: match the global chain, note which sliding blocks are cached. */
        uint8_t have[NB];
        int64_t k = 0;
        h = 0;
        ser = SP_BLOCKS_ROOT;
        uint64_t hs[NB], ps[NB];
        for (; k < (LB - 1) / SP_KV_BLOCK; k++) {
            const int32_t *t = bt + k * SP_KV_BLOCK;
            uint64_t hh = sp_blocks_hash(h, t), ns = 0, ss = 0;
            if (sp_blocks_probe(gb, hh, ser, t, &ns) < 0) break;
            have[k] = sp_blocks_probe(sb, hh, ser, t, &ss) >= 0;
            hs[k] = hh;
            ps[k] = ser;
            h = hh;
            ser = ns;
        }
        ASSERT_EQ(k, SHARED / SP_KV_BLOCK);
        const int64_t use = sp_swa_usable_prefix(WINDOW, k, have);
        /* Position 64's window is 57..64: sliding block 3 only. */
        ASSERT_EQ(use, evict ? 0 : 4);
        int32_t tb[2 * NB];
        sp_swa_table_t sbt = {tb + NB, NB, 0, 0};
        const int64_t first = sp_swa_first(WINDOW, use * SP_KV_BLOCK);
        sp_swa_trim(sb, &sbt, first);
        for (int64_t i = 0; i < use; i++) {
            uint64_t ns = 0;
            tb[i] = sp_blocks_lookup(gb, hs[i], ps[i], bt + i * SP_KV_BLOCK, &ns);
            ASSERT(tb[i] >= 0);
            if (i >= first) {
                tb[NB + i] = sp_blocks_lookup(sb, hs[i], ps[i], bt + i * SP_KV_BLOCK, &ns);
                ASSERT(tb[NB + i] >= 0 && sbt.n == i);
                sbt.n++;
            }
        }
        for (int64_t i = use; i < NB; i++) {
            tb[i] = sp_blocks_alloc(gb);
            ASSERT(tb[i] >= 0);
        }
        if (!evict) {
            ASSERT(first == 3 && tb[NB] == -1 && tb[NB + 2] == -1);
        }
        for (int64_t pos = use * SP_KV_BLOCK; pos < LB;) {
            const int64_t n = pos < SHARED ? 16 : 1;
            sp_swa_trim(sb, &sbt, sp_swa_first(WINDOW, pos));
            ASSERT(sp_swa_cover(sb, &sbt, (pos + n + SP_KV_BLOCK - 1) / SP_KV_BLOCK));
            sp_batch_seq_t r = {bt + pos, n, pos, tb, NB, true, 0, NULL};
            ASSERT_OK(sp_batch_eval(b, kv, &r, 1));
            const float *lg = sp_batch_logits(b, 0);
            if (memcmp(lg, ref + (pos + n - 1) * V, (size_t)V * sizeof(float)) != 0) {
                SP_TEST_FAIL("evict %d: B at %lld differs from B alone", evict,
                             (long long)(pos + n - 1));
            }
            pos += n;
        }
        sp_swa_release(sb, &sbt);
        for (int64_t i = NB - 1; i >= 0; i--) sp_blocks_unref(gb, tb[i]);
        if (!evict) {
            /* Drop the cached sliding block position 64's window needs: as
             * if other sequences had reclaimed it (its global one stays). */
            uint64_t ns = 0;
            const int32_t id = sp_blocks_lookup(sb, hs[3], ps[3], bt + 48, &ns);
            ASSERT(id >= 0);
            int32_t taken[8];
            int n_taken = 0;
            while (n_taken < 8 && (taken[n_taken] = sp_blocks_alloc(sb)) >= 0) {
                n_taken++; /* every other block: the LRU is empty after */
            }
            sp_blocks_unref(sb, id); /* back to the LRU, alone there */
            ASSERT_EQ(sp_blocks_alloc(sb), id); /* reclaimed: no longer cached */
            sp_blocks_unref(sb, id);
            while (n_taken > 0) sp_blocks_unref(sb, taken[--n_taken]);
        }
    }
    sp_free(ref);
    sp_batch_destroy(b);
    sp_blocks_destroy(gb);
    sp_blocks_destroy(sb);
    sp_kv_pool_destroy(kv);
    sp_model_free(m);
    sp_free(buf);
}

/* The bytes of a two-part pool: the global blocks without the sliding
 * layers, the sliding blocks with them only; refusals. */
TEST(swa_two_part_pool_sizes_and_refusals)
{
    char err[256];
    void *buf = NULL;
    sp_model_t *m = load_gemma("gemma2", &buf);
    const size_t bb = sp_kv_block_bytes(m, SP_KV_TYPE_F32);
    const size_t sbb = sp_kv_swa_block_bytes(m, SP_KV_TYPE_F32);
    /* 2 of 4 layers slide: half of each block. */
    ASSERT_EQ((uint64_t)sbb * 2, (uint64_t)bb);
    sp_kv_pool_params_t kp = {10, SP_KV_TYPE_F32};
    const size_t one = sp_kv_pool_bytes(m, &kp);
    const size_t split = sp_kv_pool_bytes_split(m, &kp, 4);
    ASSERT_EQ((uint64_t)(one - 10 * bb + 10 * (bb - sbb) + 4 * sbb + 4 * sizeof(uint32_t)),
              (uint64_t)split);
    ASSERT_EQ(sp_kv_pool_check_split(m, &kp, -1, err, sizeof err), SP_ERR_INVALID);
    sp_kv_pool_t *kv;
    ASSERT_OK(sp_kv_pool_create_split(m, &kp, 4, &kv, err, sizeof err));

    /* A step's sliding entries inside the window must be valid ids, and no
     * sliding block written twice; entries before the window are never read. */
    sp_batch_params_t bp = sp_batch_default_params();
    bp.max_seqs = 2;
    bp.max_ctx = 64;
    bp.n_threads = 1;
    sp_batch_t *b;
    ASSERT_OK(sp_batch_create(m, &bp, &b, err, sizeof err));
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = 3 + i;
    int32_t t0[6] = {0, 1, 2, 0, 1, 2}; /* 3 global, then 3 sliding */
    sp_batch_seq_t s = {toks, 40, 0, t0, 3, true, 0, NULL};
    ASSERT_OK(sp_batch_eval(b, kv, &s, 1));
    int32_t t1[6] = {0, 1, 2, -1, -1, 4}; /* position 40 reads 33..40: entry 2 */
    sp_batch_seq_t d = {toks, 1, 40, t1, 3, true, 0, NULL};
    ASSERT_EQ(sp_batch_eval(b, kv, &d, 1), SP_ERR_INVALID); /* 4 is outside the part */
    t1[5] = 2;
    ASSERT_OK(sp_batch_eval(b, kv, &d, 1));
    int32_t t2[6] = {3, 4, 5, -1, -1, 2}; /* a second sequence writing sliding block 2 too */
    sp_batch_seq_t two[2] = {{toks, 1, 40, t1, 3, true, 0, NULL},
                             {toks, 1, 40, t2, 3, true, 0, NULL}};
    ASSERT_EQ(sp_batch_eval(b, kv, two, 2), SP_ERR_INVALID);
    t2[5] = 3;
    ASSERT_OK(sp_batch_eval(b, kv, two, 2));
    t2[5] = -1; /* inside its window */
    ASSERT_EQ(sp_batch_eval(b, kv, two, 2), SP_ERR_INVALID);
    sp_batch_destroy(b);
    sp_kv_pool_destroy(kv);
    sp_model_free(m);
    sp_free(buf);

    /* A model without sliding layers has no sliding part. */
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    ASSERT_EQ(sp_kv_swa_block_bytes(m, SP_KV_TYPE_F32), 0);
    ASSERT_EQ(sp_kv_pool_create_split(m, &kp, 4, &kv, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "sliding") != NULL);
    ASSERT_EQ(sp_kv_pool_bytes_split(m, &kp, 4), 0);
    sp_model_free(m);
}

/* The usable length of a cached prefix: the window of the token after it
 * must be cached in the sliding part. */
TEST(swa_usable_prefix_and_table)
{
    uint8_t have[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    ASSERT_EQ(sp_swa_usable_prefix(20, 8, have), 8);
    /* After 8 blocks (128 positions) a window of 20 reads 109..128: entries 6, 7. */
    have[0] = have[1] = have[5] = 0;
    ASSERT_EQ(sp_swa_usable_prefix(20, 8, have), 8);
    have[6] = 0; /* 7 blocks read 93..112: entries 5, 6 - missing; 5 blocks: 61..80: 3, 4 */
    ASSERT_EQ(sp_swa_usable_prefix(20, 8, have), 5);
    have[3] = 0; /* 3 blocks read 29..48: entries 1, 2 - 1 missing; then 1 block: entry 0 */
    ASSERT_EQ(sp_swa_usable_prefix(20, 8, have), 0);
    ASSERT_EQ(sp_swa_first(8, 7), 0);
    ASSERT_EQ(sp_swa_first(8, 23), 1);
    ASSERT_EQ(sp_swa_first(8, 24), 1);
    ASSERT_EQ(sp_swa_first(8, 39), 2);

    /* Trim releases, cover takes, release returns everything. */
    char err[128];
    sp_blocks_t *b;
    ASSERT_OK(sp_blocks_create(3, &b, err, sizeof err));
    int32_t ids[10];
    sp_swa_table_t t = {ids, 10, 0, 0};
    ASSERT(sp_swa_cover(b, &t, 3));
    ASSERT(!sp_swa_cover(b, &t, 4));
    sp_swa_trim(b, &t, 2);
    ASSERT_EQ(sp_swa_held(&t), 1);
    ASSERT(ids[0] == -1 && ids[1] == -1);
    ASSERT(sp_swa_cover(b, &t, 5));
    ASSERT_EQ(sp_swa_held(&t), 3);
    sp_swa_trim(b, &t, 7); /* past the assigned ones: the next start at 7 */
    ASSERT_EQ(sp_swa_held(&t), 0);
    ASSERT_EQ(t.n, 7);
    ASSERT(sp_swa_cover(b, &t, 9));
    sp_swa_release(b, &t);
    sp_blocks_stats_t st;
    sp_blocks_get_stats(b, &st);
    ASSERT_EQ(st.n_free, 3);
    sp_blocks_destroy(b);
}

/* The scheduler's split of a --kv-blocks budget (gemma2 here: 2 of 4 layers
 * slide, so a sliding block and a global block are half a whole one each):
 * per slot the window's block, 2 more and a speculative row's block, plus a
 * step's rows; the rest of the memory in global blocks. Its estimate equals
 * what create allocates, and --kv-swa-full or a budget too small to gain
 * keep one part. */
TEST(swa_sched_sizing_and_estimate)
{
    char err[256];
    void *buf = NULL;
    sp_model_t *m = load_gemma("gemma2", &buf);
    sp_log_set_level(SP_LOG_LEVEL_WARN);
    struct {
        int64_t kv_blocks;
        bool full;
        int64_t want_blocks, want_swa;
    } cases[] = {
        {40, false, 80 - 20, 4 * (1 + 2 + 1) + 64 / 16}, /* 20 sliding, (40 x 2 - 20) global */
        {40, true, 40, 0},
        {16, false, 16, 0}, /* 20 sliding blocks would not fit in 16 whole ones */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sp_sched_params_t p = sp_sched_default_params();
        p.n_slots = 4;
        p.prefill_chunk = 64;
        p.kv_blocks = cases[i].kv_blocks;
        p.kv_swa_full = cases[i].full;
        p.n_threads = 1;
        sp_sched_mem_t est;
        ASSERT_OK(sp_sched_estimate(m, &p, &est, err, sizeof err));
        ASSERT_EQ(est.kv_blocks, cases[i].want_blocks);
        ASSERT_EQ(est.kv_swa_blocks, cases[i].want_swa);
        size_t before = sp_alloc_bytes_in_use();
        sp_sched_t *s;
        ASSERT_OK(sp_sched_create(m, &p, &s, err, sizeof err));
        const size_t got = sp_alloc_bytes_in_use() - before;
        sp_sched_stats_t st;
        sp_sched_get_stats(s, &st);
        sp_sched_destroy(s);
        ASSERT_EQ(sp_alloc_bytes_in_use(), before);
        ASSERT_EQ(st.kv_blocks_total, cases[i].want_blocks);
        ASSERT_EQ(st.kv_swa_blocks_total, cases[i].want_swa);
        /* The pool's bytes: the same memory either way, give or take a block. */
        const size_t bb = sp_kv_block_bytes(m, SP_KV_TYPE_F32);
        ASSERT(est.kv_bytes <= (uint64_t)(cases[i].kv_blocks + 1) * bb + 4096);
        ASSERT(est.kv_bytes + bb >= (uint64_t)cases[i].kv_blocks * bb);
        /* The estimate: within the bounds the scheduler's own test allows
         * (a few private objects bounded from above). */
        const double diff = (double)(est.kv_bytes + est.scratch_bytes) - (double)got;
        if (diff > 0.05 * (double)got + 65536.0 || -diff > 0.05 * (double)got + 65536.0) {
            SP_TEST_FAIL("case %zu: estimate %llu, allocated %zu", i,
                         (unsigned long long)(est.kv_bytes + est.scratch_bytes), got);
        }
    }
    sp_model_free(m);
    sp_free(buf);
}

/*
 * sp_ctx keeps the window only too: with n_ctx 512 and steps of 5 rows the
 * sliding layers get a ring of 3 blocks (the step's rows, the window of 8,
 * the block the first row straddles) instead of 32. 90 positions fed in
 * steps of 5, then one at a time, give logits bit-identical to the one-part
 * cache; a rewind whose window is still in the ring works, one whose window
 * was overwritten is refused; the context's size grows with n_ctx by the
 * global layers' blocks only.
 */
TEST(swa_ctx_ring_matches_full_cache)
{
    char err[256];
    const char *archs[] = {"gemma2", "gemma3"};
    for (int a = 0; a < 2; a++) {
        void *buf = NULL;
        sp_model_t *m = load_gemma(archs[a], &buf);
        const int64_t V = sp_model_hparams(m)->n_vocab, n = 90;
        int32_t toks[90];
        for (int64_t i = 0; i < n; i++) {
            toks[i] = (int32_t)(1 + (i * 37 + a) % (V - 1));
        }
        float *want = alone_logits(m, toks, n, SP_KV_TYPE_F32);
        sp_ctx_params_t cp = sp_ctx_default_params();
        cp.n_ctx = 512;
        cp.n_batch = 5;
        cp.n_threads = 1;
        cp.logits_all = true;
        sp_ctx_t *c;
        ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
        ASSERT_OK(sp_ctx_eval(c, toks, n, 0));
        if (memcmp(sp_ctx_logits_all(c), want, (size_t)(n * V) * sizeof(float)) != 0) {
            SP_TEST_FAIL("%s: ring prefill differs from the full cache", archs[a]);
        }
        for (int64_t i = 0; i < n; i++) { /* again, one position per step */
            ASSERT_OK(sp_ctx_eval(c, &toks[i], 1, i));
        }
        if (memcmp(sp_ctx_logits_all(c), want, (size_t)(n * V) * sizeof(float)) != 0) {
            SP_TEST_FAIL("%s: ring decode differs from the full cache", archs[a]);
        }
        /* rewind to 85: its window (78..85) is still in the ring; to 40: overwritten */
        ASSERT_OK(sp_ctx_eval(c, &toks[85], 5, 85));
        if (memcmp(sp_ctx_logits_all(c) + 85 * V, want + 85 * V, (size_t)(5 * V) * sizeof(float)) !=
            0) {
            SP_TEST_FAIL("%s: rewind within the ring differs", archs[a]);
        }
        ASSERT_EQ(sp_ctx_eval(c, &toks[40], 1, 40), SP_ERR_INVALID);
        sp_ctx_destroy(c);
        /* 2048 more positions cost the global layers' blocks, not whole blocks */
        sp_ctx_params_t big = cp;
        big.logits_all = false;
        big.n_ctx = 2048;
        const size_t s1 = sp_ctx_bytes(m, &big);
        big.n_ctx = 4096;
        const size_t s2 = sp_ctx_bytes(m, &big);
        const size_t whole = 128 * sp_kv_block_bytes(m, SP_KV_TYPE_F32);
        const size_t global = whole - 128 * sp_kv_swa_block_bytes(m, SP_KV_TYPE_F32);
        if (!(s2 > s1 && s2 - s1 < whole && s2 - s1 >= global)) {
            SP_TEST_FAIL("%s: sizes %zu -> %zu (whole blocks %zu, global %zu)", archs[a], s1, s2,
                         whole, global);
        }
        sp_free(want);
        sp_model_free(m);
        sp_free(buf);
    }
}
