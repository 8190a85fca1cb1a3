/*
 * ctx.c - sp_ctx (declared in model.h): one sequence over a loaded model.
 *
 * sp_ctx is one sequence run by the batched forward pass (batch.c) with a
 * private KV pool of ceil(n_ctx / SP_KV_BLOCK) blocks and the block table
 * 0, 1, 2, ...: one attention path for the single-sequence API and the
 * scheduler, so a sequence's logits are bit-identical either way, and (as
 * batch.c explains) whether a position was computed in a prefill chunk, a
 * decode step, or with any thread count.
 *
 * A model with sliding-window layers gets a two-part pool (kv.c) when that
 * is smaller: the global layers keep n_ctx positions, the sliding layers a
 * ring of n_ring blocks, enough for one step's rows and their window. Entry
 * i of the sliding table (positions 16 i .. 16 i + 15) lives in ring block
 * i % n_ring; ring_entry records which entry each ring block holds, so a
 * step that would read an entry a later one has overwritten (a rewind far
 * behind the window) is refused (SP_ERR_INVALID) instead of reading another
 * position's keys. Logits are bit-identical to the one-part pool's (batch.c).
 *
 * Threads: one context is used by one thread at a time (its batch owns a
 * thread pool for the step's products); any number of contexts may share a
 * model. Memory: every buffer is allocated at create, nothing per call.
 */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "engine/gpu.h"
#include "engine/model.h"
#include "engine/model_impl.h"

struct sp_ctx {
    const sp_model_t *m;
    sp_batch_t *b;       /* activations and threads, n_batch rows */
    sp_kv_pool_t *kv;    /* the sequence's cache */
    int32_t *blocks;     /* 0, 1, 2, ...: the identity block table; with a ring, the
                            sliding table (n_blocks entries) follows */
    int64_t n_blocks;
    int64_t n_ring;      /* sliding blocks of a two-part pool, or 0: one part */
    int64_t *ring_entry; /* (n_ring) the sliding entry each ring block holds, or -1 */
    int64_t n_ctx;
    int64_t n_batch;
    bool logits_all;
    float *logits;       /* (n_ctx, n_vocab) with logits_all, else NULL */
    double *embd_sum;    /* (n_embd) sp_ctx_embed's pooled sum */
    sp_enc_run_t *enc;   /* an encoder's run state (b, kv, blocks are NULL then) */
};

sp_ctx_params_t
sp_ctx_default_params(void)
{
    sp_ctx_params_t p = {0, 512, 0, false, false};
    return p;
}

void
sp_ctx_destroy(sp_ctx_t *c)
{
    if (c == NULL) {
        return;
    }
    sp__enc_run_destroy(c->enc);
    sp_batch_destroy(c->b);
    sp_kv_pool_destroy(c->kv);
    sp_free(c->blocks);
    sp_free(c->ring_entry);
    sp_free(c->logits);
    sp_free(c->embd_sum);
    sp_free(c);
}

sp_status_t
sp_ctx_resolve(const sp_model_t *m, const sp_ctx_params_t *p, sp_ctx_params_t *out, char *err,
               size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    if (p->n_ctx < 0 || p->n_ctx > SP_MAX_CTX || p->n_batch < 0 || p->n_batch > 65536) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "context size %lld or batch %lld out of range",
                       (long long)p->n_ctx, (long long)p->n_batch);
    }
    sp_ctx_params_t r = *p;
    r.n_ctx = p->n_ctx > 0 ? p->n_ctx
                           : (hp->n_ctx_train < SP_DEFAULT_CTX_CAP ? hp->n_ctx_train
                                                                   : SP_DEFAULT_CTX_CAP);
    r.n_batch = p->n_batch > 0 ? p->n_batch : 512;
    if (m->enc != NULL && r.n_ctx > hp->n_ctx_train) {
        r.n_ctx = hp->n_ctx_train; /* an encoder has no positions past its training length */
    }
    if (r.n_batch > r.n_ctx) {
        r.n_batch = r.n_ctx;
    }
    *out = r;
    return SP_OK;
}

/* What a context is made of, for sp_ctx_create and sp_ctx_bytes alike. */
typedef struct ctx_layout {
    sp_ctx_params_t p;       /* resolved */
    int64_t n_blocks;        /* of the private pool: n_ctx positions */
    int64_t n_ring;          /* sliding ring blocks (two-part pool), or 0 */
    sp_batch_params_t bp;    /* one sequence of up to n_batch rows */
    sp_kv_pool_params_t kp;
    size_t blocks_bytes, logits_bytes, embd_sum_bytes; /* SIZE_MAX on overflow */
} ctx_layout_t;

static sp_status_t
ctx_layout(const sp_model_t *m, const sp_ctx_params_t *p, ctx_layout_t *L, char *err,
           size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    sp_status_t st = sp_ctx_resolve(m, p, &L->p, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    L->n_blocks = (L->p.n_ctx + SP_KV_BLOCK - 1) / SP_KV_BLOCK;
    L->bp = (sp_batch_params_t){L->p.n_batch, 1, L->p.n_ctx, p->n_threads, 0};
    L->kp = (sp_kv_pool_params_t){L->n_blocks, p->kv_type};
    /* Sliding layers keep a ring of blocks: one step's rows (n_batch) and the window
     * of its first row, plus the block that row straddles; used when smaller. */
    L->n_ring = 0;
    if (m->enc == NULL && sp_kv_swa_block_bytes(m, p->kv_type) > 0) {
        const int64_t ring = sp_kv_ring_blocks(hp->n_swa, L->p.n_batch);
        L->n_ring = ring < L->n_blocks ? ring : 0;
    }
    if ((st = sp_kv_pool_check_split(m, &L->kp, L->n_ring, err, err_len)) != SP_OK) {
        return st; /* e.g. a Q8_0 cache asked of a model with GPU layers */
    }
    /* n_ctx <= SP_MAX_CTX and n_embd is bounded at load: only the logits can overflow. */
    L->blocks_bytes = (size_t)L->n_blocks * (L->n_ring > 0 ? 2 : 1) * sizeof(int32_t) +
                      (size_t)L->n_ring * sizeof(int64_t);
    L->logits_bytes = 0;
    if (L->p.logits_all && (sp_mul_size((size_t)L->p.n_ctx, (size_t)hp->n_vocab,
                                        &L->logits_bytes) != 0 ||
                            sp_mul_size(L->logits_bytes, sizeof(float), &L->logits_bytes) != 0)) {
        L->logits_bytes = SIZE_MAX;
    }
    L->embd_sum_bytes = (size_t)hp->n_embd * sizeof(double);
    return SP_OK;
}

size_t
sp_ctx_bytes(const sp_model_t *m, const sp_ctx_params_t *p)
{
    ctx_layout_t L;
    if (ctx_layout(m, p, &L, NULL, 0) != SP_OK) {
        return 0;
    }
    if (m->enc != NULL) {
        return sizeof(sp_ctx_t) + sp__enc_run_bytes(m, L.p.n_ctx, p->n_threads);
    }
    const size_t batch = sp_batch_bytes(m, &L.bp);
    const size_t pool = sp_kv_pool_bytes_split(m, &L.kp, L.n_ring);
    if (batch == 0 || pool == 0) {
        return 0; /* create would fail on them */
    }
    const size_t parts[] = {sizeof(sp_ctx_t), batch, pool, L.blocks_bytes, L.logits_bytes,
                            L.embd_sum_bytes};
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (sp_add_size(total, parts[i], &total) != 0) {
            return SIZE_MAX; /* a SIZE_MAX part (an overflow) ends here too */
        }
    }
    return total;
}

sp_status_t
sp_ctx_create(const sp_model_t *m, const sp_ctx_params_t *p, sp_ctx_t **out, char *err,
              size_t err_len)
{
    sp_ctx_t *c;
    ctx_layout_t L;

    *out = NULL;
    sp_status_t st = ctx_layout(m, p, &L, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    c = sp_calloc(1, sizeof *c);
    if (c == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    c->m = m;
    c->n_ctx = L.p.n_ctx;
    c->n_batch = L.p.n_batch;
    c->logits_all = L.p.logits_all;
    c->n_blocks = L.n_blocks;

    if (m->enc != NULL) {
        /* An encoder runs whole texts (encoder.c): no cache, no step batch. */
        if (sp__enc_run_create(m, c->n_ctx, p->n_threads, &c->enc) != SP_OK) {
            goto oom;
        }
        *out = c;
        return SP_OK;
    }
    char sub[256];
    if (sp_batch_create(m, &L.bp, &c->b, sub, sizeof sub) != SP_OK ||
        sp_kv_pool_create_split(m, &L.kp, L.n_ring, &c->kv, sub, sizeof sub) != SP_OK) {
        goto oom;
    }
    /* calloc(1, SIZE_MAX) fails like the overflow it stands for. */
    c->n_ring = L.n_ring;
    c->blocks = sp_calloc(1, (size_t)c->n_blocks * (c->n_ring > 0 ? 2 : 1) * sizeof(int32_t));
    c->ring_entry = c->n_ring > 0 ? sp_malloc((size_t)c->n_ring * sizeof(int64_t)) : NULL;
    if (c->n_ring > 0 && c->ring_entry == NULL) {
        goto oom;
    }
    for (int64_t r = 0; r < c->n_ring; r++) {
        c->ring_entry[r] = -1;
    }
    c->logits = c->logits_all ? sp_calloc(1, L.logits_bytes) : NULL;
    c->embd_sum = sp_calloc(1, L.embd_sum_bytes);
    if (c->blocks == NULL || (c->logits_all && c->logits == NULL) || c->embd_sum == NULL) {
        goto oom;
    }
    for (int64_t i = 0; i < c->n_blocks; i++) {
        c->blocks[i] = (int32_t)i;
    }
    *out = c;
    return SP_OK;
oom:
    sp_ctx_destroy(c);
    return sp_errf(err, err_len, SP_ERR_NOMEM,
                   "out of memory creating a context (n_ctx %lld, n_batch %lld)", (long long)p->n_ctx,
                   (long long)p->n_batch);
}

int64_t
sp_ctx_n_ctx(const sp_ctx_t *c)
{
    return c->n_ctx;
}

const char *
sp_ctx_kernels_name(const sp_ctx_t *c)
{
    return c->enc != NULL ? sp__enc_run_kernels_name(c->enc) : sp__batch_kernels_name(c->b);
}

const float *
sp_ctx_logits(const sp_ctx_t *c)
{
    return c->logits_all || c->enc != NULL ? NULL : sp__batch_logits_buf(c->b);
}

const float *
sp_ctx_logits_all(const sp_ctx_t *c)
{
    return c->logits_all ? c->logits : NULL;
}

/* One step of the sequence: tokens at pos..pos+n-1 (n <= n_batch). */
static sp_status_t
ctx_step(sp_ctx_t *c, const int32_t *tokens, int64_t n, int64_t pos, sp_batch_out_t out,
         bool logits)
{
    SP_ASSERT(n >= 1 && n <= c->n_batch && pos >= 0 && pos + n <= c->n_ctx); /* the private pool */
    if (c->n_ring > 0 && !sp_kv_ring_step(c->m->hp.n_swa, c->n_ring, 0, c->ring_entry,
                                           c->blocks + c->n_blocks, c->n_blocks, pos, n)) {
        return SP_ERR_INVALID; /* a rewind further back than the ring reaches */
    }
    sp_batch_seq_t s = {tokens, n, pos, c->blocks, c->n_blocks, logits, 0, NULL};
    float *all = out == SP_BATCH_OUT_ALL ? c->logits + pos * c->m->hp.n_vocab : NULL;
    return sp__batch_run(c->b, c->kv, &s, 1, out, all);
}

sp_status_t
sp_ctx_profile(sp_ctx_t *c, sp_pool_prof_t *prof)
{
    if (c->enc != NULL) {
        return SP_ERR_UNSUPPORTED;
    }
    sp_batch_profile(c->b, prof);
    return SP_OK;
}

sp_status_t
sp_ctx_eval(sp_ctx_t *c, const int32_t *tokens, int64_t n, int64_t pos)
{
    if (c->enc != NULL) {
        return SP_ERR_UNSUPPORTED; /* an encoder does not generate */
    }
    if (tokens == NULL || n <= 0 || pos < 0 || pos > c->n_ctx || n > c->n_ctx - pos) {
        return SP_ERR_INVALID;
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->m->hp.n_vocab) {
            return SP_ERR_INVALID;
        }
    }
    /* Logits: every row with logits_all, else only the last row of the call. */
    const sp_batch_out_t out = c->logits_all ? SP_BATCH_OUT_ALL : SP_BATCH_OUT_SEQ;
    for (int64_t done = 0; done < n; done += c->n_batch) {
        const int64_t b = n - done < c->n_batch ? n - done : c->n_batch;
        sp_status_t st = ctx_step(c, tokens + done, b, pos + done, out, done + b == n);
        if (st != SP_OK) {
            return st;
        }
    }
    return SP_OK;
}

sp_status_t
sp_ctx_embed(sp_ctx_t *c, const int32_t *tokens, int64_t n, float *out)
{
    const sp_hparams_t *hp = &c->m->hp;
    const int64_t E = hp->n_embd;
    if (tokens == NULL || out == NULL || n <= 0 || n > c->n_ctx) {
        return SP_ERR_INVALID;
    }
    if (c->enc != NULL) {
        return sp__enc_run_embed(c->enc, tokens, n, out); /* the file's pooling */
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            return SP_ERR_INVALID;
        }
    }
    double *sum = c->embd_sum;
    memset(sum, 0, (size_t)E * sizeof(double));
    for (int64_t done = 0; done < n; done += c->n_batch) {
        const int64_t b = n - done < c->n_batch ? n - done : c->n_batch;
        sp_status_t st = ctx_step(c, tokens + done, b, done, SP_BATCH_OUT_HIDDEN, false);
        if (st != SP_OK) {
            return st;
        }
        /* Positions are added in order whatever the chunking, so the sum (and
         * the embedding) does not depend on n_batch or the thread count. */
        const float *hid = sp__batch_hidden(c->b);
        for (int64_t t = 0; t < b; t++) {
            const float *xn = hid + t * E;
            for (int64_t i = 0; i < E; i++) {
                sum[i] += xn[i];
            }
        }
    }
    double ss = 0.0;
    for (int64_t i = 0; i < E; i++) {
        sum[i] /= (double)n;
        ss += sum[i] * sum[i];
    }
    /* An all-zero mean has no direction: return it as is rather than NaNs. */
    const double inv = ss > 0.0 ? 1.0 / sqrt(ss) : 0.0;
    for (int64_t i = 0; i < E; i++) {
        out[i] = (float)(sum[i] * inv);
    }
    return SP_OK;
}
