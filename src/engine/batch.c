/*
 * batch.c - the forward pass: one step over the rows (tokens) of many
 * sequences, with the KV cache in a paged pool (kv.c). sp_ctx (ctx.c) is this
 * with one sequence, a private pool and the block table 0, 1, 2, ...
 *
 * Pool layout: block-major. One block is SP_KV_BLOCK positions of every
 * (layer, KV head): for each (layer, head) in order, a key tile (head_dim
 * rows of SP_KV_BLOCK lanes, transposed as the attention kernels want) then a
 * value tile (SP_KV_BLOCK rows of head_dim). So one (layer, head) of one block
 * is contiguous for K and for V (the kernels stream it), a block is one range
 * of memory (copying it for copy-on-write is one memcpy), and the kernels find
 * block id b of (layer, head) at base + b * block_elems. A two-part pool
 * (kv.c) has two such arrays, the global layers' and the sliding layers',
 * each with its own block ids; a sequence then has two block tables and the
 * sliding one needs only the blocks of its window (docs/design.md, "KV cache with sliding windows").
 *
 * A step: every row is embedded; every weight product runs over all rows at
 * once, split by weight rows across the thread pool (one weight read per step,
 * whatever the number of sequences); projections that read the same input
 * (q/k/v, gate/up) run as one job so a decode step pays few pool wake-ups.
 * Activations are converted once per product to the weight type's dot-product
 * format (Q8_0, Q8_K or F32). After the k/v products each row's key and value
 * go into its own sequence's block slot, and attention runs per (row, KV head)
 * over that sequence's blocks, positions 0..the row's position. Logits are
 * computed only for the rows that asked, gathered into one output product.
 *
 * Batch invariance: each product element is one vec_dot over one weight row
 * and one activation row (the kernel contract), attention for a row reads only
 * its own row and its sequence's cache through the block table in position
 * order, and every reduction runs in a fixed order. So a row's logits are
 * bit-identical whatever the other rows of the step, their number and order,
 * where the blocks live, and the thread count.
 *
 * Nothing is allocated per step: every buffer is sized at create for
 * max_tokens rows, max_seqs sequences and max_ctx positions.
 */
#include "engine/batch.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "core/pool.h"
#include "engine/gpu.h"
#include "engine/lora.h"
#include "engine/mla.h"
#include "engine/model_impl.h"
#include "engine/moe.h"
#include "engine/yarn.h"
#include "kernels/kernels.h"

_Static_assert(SP_KV_BLOCK == SP_ATTN_BLOCK, "a pool block is one attention key block");

#define MAX_STEP_ROWS 65536

/* ------------------------------------------------------------------------ */
/* Batch                                                                     */
/* ------------------------------------------------------------------------ */

struct sp_batch {
    const sp_model_t *m;
    const sp_cpu_kernels_t *k;
    sp_pool_t *pool;
    sp_gpu_batch_t *gpu; /* the device part when the model has a GPU binding */
    int64_t max_tokens;
    int64_t max_seqs;
    int64_t max_ctx;
    int64_t max_logits;

    /* activations, max_tokens rows each */
    float *x;          /* (rows, n_embd) residual stream */
    float *xn;         /* (rows, n_embd) normalised input of a sub-layer */
    float *q;          /* (rows, n_head * head_dim) */
    float *kv_k;       /* (rows, n_head_kv * head_dim) */
    float *kv_v;       /* (rows, n_head_kv * head_dim) */
    float *att;        /* (rows, n_head * head_dim) attention output */
    float *ff_gate;    /* (rows, n_ff) */
    float *ff_up;      /* (rows, n_ff) */
    float *proj;       /* (rows, n_embd) output of wo / w_down */
    void *act;         /* (rows, act_stride) activations in the dot-product format */
    size_t act_stride; /* bytes per row of act */
    float *scores;     /* (n_threads, scores_stride) attention scratch */
    int64_t scores_stride;
    float attn_scale;  /* the model's query scale (1 / sqrt(head_dim) for most) */
    float *rope_cs;    /* (rows, 2 rope_w) cos/sin pairs per row's position: the global
                          table, then the sliding layers' when rope_swa */
    float *inv_freq;   /* (2, rope_w / 2): global, then sliding layers */
    int64_t rope_w;    /* the widest rotation (gemma4's two kinds rotate different widths) */
    float *pl;         /* gemma4: (rows, n_layer * n_embd_pl) per-layer inputs, or unused */
    float *pl_tmp;     /* gemma4: (rows, n_layer * n_embd_pl) scratch: token rows, gates */
    bool rope_swa;     /* the sliding layers rotate with their own base or scale */
    float *logits;     /* (max_logits, n_vocab) */
    void *moe_buf;     /* the MoE block's scratch (engine/moe.h) or NULL: dense */
    void *mla_buf;     /* latent attention's scratch (engine/mla.h) or NULL */

    /* the current step, rows in order of the sequences */
    int32_t *row_tok;  /* (max_tokens) */
    int64_t *row_pos;  /* (max_tokens) */
    int32_t *row_seq;  /* (max_tokens) index into seqs */
    int32_t *order;    /* (max_tokens) rows by decreasing position (attention order) */
    int64_t *seq_out;  /* (max_seqs) logits row of sequence i, or -1 */
    int64_t *seq_nl;   /* (max_seqs) its kept logit rows (in seq_out's allocation) */
    int32_t *cand_n;   /* (max_seqs) GPU only: candidates the last step kept for sequence i
                          instead of its logits row (0: the row), or NULL */
    const int32_t *cand_req; /* during sp_batch_eval_cand: its cand_k */
    const sp_batch_seq_t *seqs;
    sp_kv_pool_t *kv;
    int64_t n_seqs;    /* of the last step (0 after a rejected one) */
};

sp_batch_params_t
sp_batch_default_params(void)
{
    sp_batch_params_t p = {512, 64, 0, 0, 0};
    return p;
}

/* Threads sp_pool_create(n) starts. core/pool.c resolves n <= 0 itself and
 * has no helper for it (and is not this file's): this is its rule, kept in
 * step by hand, and sp_batch_create passes the resolved count to the pool so
 * the two can never disagree about the scores buffer. */
static int
pool_threads(int n)
{
    if (n <= 0) {
        n = sp_pool_cpu_count();
    }
    return n > 512 ? 512 : n;
}

/* Heap bytes of sp_pool_create(n): the pool object, the thread handles and
 * one start argument per worker (each worker frees its own when it starts, so
 * some may still be held when create returns: counted). pool.c keeps its
 * struct private; 256 bytes bounds it from above (about 150 on x86-64). */
static size_t
pool_bytes(int n)
{
    return 256 + (size_t)n * sizeof(pthread_t) + (size_t)(n - 1) * 16;
}

/* Every buffer of a batch. batch_layout sizes them all and both sp_batch_create
 * (which allocates exactly these sizes) and sp_batch_bytes (which adds them
 * up) read that one list, so the estimate cannot drift from create. */
enum {
    BUF_X, BUF_XN, BUF_Q, BUF_KV_K, BUF_KV_V, BUF_ATT, BUF_FF_GATE, BUF_FF_UP, BUF_PROJ, BUF_ACT,
    BUF_SCORES, BUF_ROPE_CS, BUF_INV_FREQ, BUF_PL, BUF_PL_TMP, BUF_LOGITS, BUF_ROW_TOK, BUF_ROW_POS, BUF_ROW_SEQ,
    BUF_ORDER, BUF_SEQ_OUT, BUF_CAND_N, BUF_MOE, BUF_MLA, BUF_COUNT
};

typedef struct batch_layout {
    sp_batch_params_t p;     /* resolved: defaults applied, n_threads the pool's */
    size_t act_stride;       /* bytes per row of act */
    int64_t scores_stride;   /* floats per thread of scores */
    size_t bytes[BUF_COUNT]; /* SIZE_MAX where the size overflows (the allocation then fails) */
} batch_layout_t;

/* rows x cols elements of elt bytes; 64 for an empty buffer (a valid pointer
 * all the same), SIZE_MAX on overflow. */
static size_t
buf_bytes(int64_t rows, int64_t cols, size_t elt)
{
    size_t n, bytes;
    if (rows < 0 || cols < 0 || sp_mul_size((size_t)rows, (size_t)cols, &n) != 0 ||
        sp_mul_size(n, elt, &bytes) != 0) {
        return SIZE_MAX;
    }
    return bytes > 0 ? bytes : 64;
}

sp_status_t
sp_batch_resolve(const sp_model_t *m, const sp_batch_params_t *p, sp_batch_params_t *out,
                 char *err, size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    if (p->max_tokens < 0 || p->max_tokens > MAX_STEP_ROWS || p->max_seqs < 0 ||
        p->max_seqs > MAX_STEP_ROWS || p->max_ctx < 0 || p->max_ctx > SP_MAX_CTX) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "batch: max_tokens %lld, max_seqs %lld or max_ctx %lld out of range",
                       (long long)p->max_tokens, (long long)p->max_seqs, (long long)p->max_ctx);
    }
    sp_batch_params_t r;
    r.max_tokens = p->max_tokens > 0 ? p->max_tokens : 512;
    r.max_seqs = p->max_seqs > 0 ? p->max_seqs : 64;
    r.max_ctx = p->max_ctx > 0 ? p->max_ctx
                               : (hp->n_ctx_train < SP_DEFAULT_CTX_CAP ? hp->n_ctx_train
                                                                       : SP_DEFAULT_CTX_CAP);
    if (r.max_seqs > r.max_tokens) {
        r.max_seqs = r.max_tokens; /* every sequence of a step brings a token */
    }
    if (p->max_logits < 0 || p->max_logits > MAX_STEP_ROWS) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "batch: max_logits %lld out of range",
                       (long long)p->max_logits);
    }
    r.max_logits = p->max_logits > r.max_seqs ? p->max_logits : r.max_seqs;
    if (r.max_logits > r.max_tokens) {
        r.max_logits = r.max_tokens; /* a kept logit row is a row of the step */
    }
    r.n_threads = pool_threads(p->n_threads);
    *out = r;
    return SP_OK;
}

static sp_status_t
batch_layout(const sp_model_t *m, const sp_batch_params_t *p, batch_layout_t *L, char *err,
             size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    sp_status_t st = sp_batch_resolve(m, p, &L->p, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    /* The widest layer sizes (gemma4 varies them by layer; model_impl.h). */
    const int64_t hd = sp__head_dim_max(hp);
    const int64_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const int64_t R = L->p.max_tokens, S = L->p.max_seqs;
    const int64_t pl_dim = hp->n_layer * hp->n_embd_pl;
    int64_t max_in = hp->n_embd, min_kv = hp->n_head_kv;
    if (hp->n_ff > max_in) max_in = hp->n_ff;
    if (q_dim > max_in) max_in = q_dim;
    if (hp->n_embd_pl > max_in) max_in = hp->n_embd_pl;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        min_kv = sp__layer_n_head_kv(hp, il) < min_kv ? sp__layer_n_head_kv(hp, il) : min_kv;
    }
    /* Every dot-product format takes at most 4 bytes per element (F32). */
    L->act_stride = ((size_t)max_in * 4 + 63) & ~(size_t)63;
    /* Scores of one (row, KV head) item: every query head of the largest group. */
    L->scores_stride = hp->n_head / min_kv * sp_attn_scratch_stride(L->p.max_ctx);
    if (m->mla != NULL) {
        L->scores_stride += sp__mla_attn_scratch_floats(sp__head_dim_max(hp)); /* mla_attn.c */
    }

    size_t *B = L->bytes;
    B[BUF_X] = buf_bytes(R, hp->n_embd, sizeof(float));
    B[BUF_XN] = buf_bytes(R, hp->n_embd, sizeof(float));
    B[BUF_Q] = buf_bytes(R, q_dim, sizeof(float));
    B[BUF_KV_K] = buf_bytes(R, kv_dim, sizeof(float));
    B[BUF_KV_V] = buf_bytes(R, kv_dim, sizeof(float));
    B[BUF_ATT] = buf_bytes(R, q_dim, sizeof(float));
    B[BUF_FF_GATE] = buf_bytes(R, hp->n_ff, sizeof(float));
    B[BUF_FF_UP] = buf_bytes(R, hp->n_ff, sizeof(float));
    B[BUF_PROJ] = buf_bytes(R, hp->n_embd, sizeof(float));
    B[BUF_ACT] = buf_bytes(R, (int64_t)L->act_stride, 1);
    B[BUF_SCORES] = buf_bytes(L->p.n_threads, L->scores_stride, sizeof(float));
    B[BUF_ROPE_CS] = buf_bytes(R, 2 * sp__n_rot_max(hp), sizeof(float));
    B[BUF_INV_FREQ] = buf_bytes(2, sp__n_rot_max(hp) / 2, sizeof(float));
    B[BUF_PL] = buf_bytes(pl_dim > 0 ? R : 0, pl_dim, sizeof(float));
    B[BUF_PL_TMP] = buf_bytes(pl_dim > 0 ? R : 0, pl_dim, sizeof(float));
    B[BUF_LOGITS] = buf_bytes(L->p.max_logits, hp->n_vocab, sizeof(float));
    B[BUF_ROW_TOK] = buf_bytes(R, 1, sizeof(int32_t));
    B[BUF_ROW_POS] = buf_bytes(R, 1, sizeof(int64_t));
    B[BUF_ROW_SEQ] = buf_bytes(R, 1, sizeof(int32_t));
    B[BUF_ORDER] = buf_bytes(R, 1, sizeof(int32_t));
    B[BUF_SEQ_OUT] = buf_bytes(S, 2, sizeof(int64_t)); /* seq_out, then seq_nl */
    B[BUF_CAND_N] = 0;
    B[BUF_MOE] = sp__moe_scratch_bytes(m, R);
    B[BUF_MLA] = sp__mla_scratch_bytes(m, R);
    if (m->gpu != NULL) {
        /* The buffers the device copies to and from are pinned (gpu.h): whole
         * pages of their own. Candidates exist on the GPU path only. */
        B[BUF_X] = sp_gpu_host_round(B[BUF_X]);
        B[BUF_XN] = sp_gpu_host_round(B[BUF_XN]);
        B[BUF_LOGITS] = sp_gpu_host_round(B[BUF_LOGITS]);
        B[BUF_CAND_N] = buf_bytes(S, 1, sizeof(int32_t));
    }
    return SP_OK;
}

size_t
sp_batch_bytes(const sp_model_t *m, const sp_batch_params_t *p)
{
    batch_layout_t L;
    if (batch_layout(m, p, &L, NULL, 0) != SP_OK) {
        return 0;
    }
    size_t total = sizeof(sp_batch_t) + pool_bytes(L.p.n_threads);
    for (int i = 0; i < BUF_COUNT; i++) {
        if (sp_add_size(total, L.bytes[i], &total) != 0) {
            return SIZE_MAX;
        }
    }
    return total;
}

void
sp_batch_destroy(sp_batch_t *b)
{
    if (b == NULL) {
        return;
    }
    sp_pool_destroy(b->pool);
    sp__gpu_batch_destroy(b->gpu);
    sp_free(b->x);
    sp_free(b->xn);
    sp_free(b->q);
    sp_free(b->kv_k);
    sp_free(b->kv_v);
    sp_free(b->att);
    sp_free(b->ff_gate);
    sp_free(b->ff_up);
    sp_free(b->proj);
    sp_free(b->act);
    sp_free(b->scores);
    sp_free(b->rope_cs);
    sp_free(b->inv_freq);
    sp_free(b->pl);
    sp_free(b->pl_tmp);
    sp_free(b->logits);
    sp_free(b->row_tok);
    sp_free(b->row_pos);
    sp_free(b->row_seq);
    sp_free(b->order);
    sp_free(b->seq_out);
    sp_free(b->cand_n);
    sp_free(b->moe_buf);
    sp_free(b->mla_buf);
    sp_free(b);
}

sp_status_t
sp_batch_create(const sp_model_t *m, const sp_batch_params_t *p, sp_batch_t **out, char *err,
                size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    *out = NULL;
    batch_layout_t L;
    sp_status_t st = batch_layout(m, p, &L, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    sp_batch_t *b = sp_calloc(1, sizeof *b);
    if (b == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    b->m = m;
    b->k = sp_cpu_kernels();
    b->max_tokens = L.p.max_tokens;
    b->max_seqs = L.p.max_seqs;
    b->max_logits = L.p.max_logits;
    b->max_ctx = L.p.max_ctx;
    b->act_stride = L.act_stride;
    b->scores_stride = L.scores_stride;
    b->attn_scale = hp->attn_scale;
    /* The resolved count: the pool starts exactly the threads scores is sized for. */
    if (sp_pool_create(L.p.n_threads, &b->pool) != SP_OK) {
        goto oom;
    }
    /* sp_malloc_aligned refuses SIZE_MAX (an overflowed size): that is an OOM here. */
    const size_t *B = L.bytes;
    const size_t host_align = m->gpu != NULL ? sp_gpu_host_page() : 64; /* pinned: pages */
    b->x = sp_malloc_aligned(B[BUF_X], host_align);
    b->xn = sp_malloc_aligned(B[BUF_XN], host_align);
    b->q = sp_malloc_aligned(B[BUF_Q], 64);
    b->kv_k = sp_malloc_aligned(B[BUF_KV_K], 64);
    b->kv_v = sp_malloc_aligned(B[BUF_KV_V], 64);
    b->att = sp_malloc_aligned(B[BUF_ATT], 64);
    b->ff_gate = sp_malloc_aligned(B[BUF_FF_GATE], 64);
    b->ff_up = sp_malloc_aligned(B[BUF_FF_UP], 64);
    b->proj = sp_malloc_aligned(B[BUF_PROJ], 64);
    b->act = sp_malloc_aligned(B[BUF_ACT], 64);
    b->scores = sp_malloc_aligned(B[BUF_SCORES], 64);
    b->rope_cs = sp_malloc_aligned(B[BUF_ROPE_CS], 64);
    b->inv_freq = sp_malloc_aligned(B[BUF_INV_FREQ], 64);
    b->pl = sp_malloc_aligned(B[BUF_PL], 64);
    b->pl_tmp = sp_malloc_aligned(B[BUF_PL_TMP], 64);
    b->logits = sp_malloc_aligned(B[BUF_LOGITS], host_align);
    b->row_tok = sp_malloc_aligned(B[BUF_ROW_TOK], 64);
    b->row_pos = sp_malloc_aligned(B[BUF_ROW_POS], 64);
    b->row_seq = sp_malloc_aligned(B[BUF_ROW_SEQ], 64);
    b->order = sp_malloc_aligned(B[BUF_ORDER], 64);
    b->seq_out = sp_malloc_aligned(B[BUF_SEQ_OUT], 64);
    b->seq_nl = b->seq_out ? b->seq_out + L.p.max_seqs : NULL;
    if (B[BUF_MOE] > 0 && (b->moe_buf = sp_malloc_aligned(B[BUF_MOE], 64)) == NULL) {
        goto oom;
    }
    if (B[BUF_MLA] > 0 && (b->mla_buf = sp_malloc_aligned(B[BUF_MLA], 64)) == NULL) {
        goto oom;
    }
    if (!b->x || !b->xn || !b->q || !b->kv_k || !b->kv_v || !b->att || !b->ff_gate || !b->ff_up ||
        !b->proj || !b->act || !b->scores || !b->rope_cs || !b->inv_freq || !b->pl || !b->pl_tmp || !b->logits ||
        !b->row_tok || !b->row_pos || !b->row_seq || !b->order || !b->seq_out) {
        goto oom;
    }
    /* theta_i = pos / scale * base^(-2i / n_rot) / freq_factor_i, in double
     * so the table does not depend on float rounding of the power. The
     * factors: Llama 3's rope_freqs, or LongRoPE's set for this context
     * length (long above the original context, as llama.cpp chooses). */
    const float *factors = m->rope_freqs;
    if (m->rope_long != NULL) {
        factors = b->max_ctx > hp->n_ctx_orig ? m->rope_long : m->rope_short;
    }
    /* gemma4: the sliding layers rotate n_rot_swa dims without the factors (which
     * are the global layers' own: their 1e30 entries leave dims unrotated). */
    b->rope_swa = hp->rope_base_swa != hp->rope_base || hp->rope_scale_swa != hp->rope_scale ||
                  (hp->n_rot_swa > 0 && hp->n_rot_swa != hp->n_rot) ||
                  (hp->rope_freqs_global && factors != NULL);
    b->rope_w = sp__n_rot_max(hp);
    const int64_t n_rot_swa = hp->n_rot_swa > 0 ? hp->n_rot_swa : hp->n_rot;
    for (int64_t i = 0; i < hp->n_rot / 2; i++) {
        const double e = -2.0 * (double)i / (double)hp->n_rot;
        double f = pow((double)hp->rope_base, e);
        if (factors != NULL) {
            f /= factors[i];
        }
        f *= sp__yarn_mix(hp, i); /* 1 without YaRN */
        b->inv_freq[i] = (float)(f / hp->rope_scale);
    }
    for (int64_t i = 0; i < n_rot_swa / 2; i++) {
        const double e = -2.0 * (double)i / (double)n_rot_swa;
        double fs = pow((double)hp->rope_base_swa, e);
        if (factors != NULL && !hp->rope_freqs_global) {
            fs /= factors[i];
        }
        b->inv_freq[b->rope_w / 2 + i] = (float)(fs / hp->rope_scale_swa);
    }
    if (m->gpu != NULL) {
        b->cand_n = sp_calloc((size_t)L.p.max_seqs, sizeof(int32_t));
        if (b->cand_n == NULL) {
            goto oom;
        }
        st = sp__gpu_batch_create(m->gpu, &L.p, &b->gpu, err, err_len);
        if (st != SP_OK) {
            sp_batch_destroy(b);
            return st;
        }
        sp__gpu_batch_pin(b->gpu, b->x, B[BUF_X], "x");
        sp__gpu_batch_pin(b->gpu, b->xn, B[BUF_XN], "hidden");
        sp__gpu_batch_pin(b->gpu, b->logits, B[BUF_LOGITS], "logits");
    }
    *out = b;
    return SP_OK;
oom:
    sp_batch_destroy(b);
    return sp_errf(err, err_len, SP_ERR_NOMEM,
                   "out of memory creating a batch (max_tokens %lld, max_seqs %lld, max_ctx %lld)",
                   (long long)p->max_tokens, (long long)p->max_seqs, (long long)p->max_ctx);
}

const float *
sp_batch_logits(const sp_batch_t *b, int64_t i)
{
    if (b == NULL || i < 0 || i >= b->n_seqs || b->seq_out[i] < 0) {
        return NULL;
    }
    float *row = b->logits + b->seq_out[i] * b->m->hp.n_vocab;
    const int32_t *ids;
    const float *vals;
    const int32_t k = sp_batch_candidates(b, i, &ids, &vals);
    if (k > 0) {
        /* Only candidates came back: the row they stand for (batch.h). */
        for (int64_t t = 0; t < b->m->hp.n_vocab; t++) {
            row[t] = -INFINITY;
        }
        for (int32_t j = 0; j < k; j++) {
            row[ids[j]] = vals[j];
        }
    }
    return row;
}

int32_t
sp_batch_candidates(const sp_batch_t *b, int64_t i, const int32_t **ids, const float **vals)
{
    if (b == NULL || b->cand_n == NULL || i < 0 || i >= b->n_seqs || b->seq_out[i] < 0 ||
        b->cand_n[i] <= 0 || sp__gpu_batch_cand(b->gpu, b->seq_out[i], ids, vals) <= 0) {
        return 0;
    }
    return b->cand_n[i];
}

const float *
sp_batch_logits_at(const sp_batch_t *b, int64_t i, int64_t j)
{
    const float *l = sp_batch_logits(b, i);
    if (l == NULL || j < 0 || j >= b->seq_nl[i]) {
        return NULL;
    }
    return l + j * b->m->hp.n_vocab;
}

void
sp_batch_parallel(sp_batch_t *b, const char *label, sp_pool_fn fn, void *ctx, int64_t n_items)
{
    sp_pool_run_as(b->pool, label, fn, ctx, n_items);
}

void
sp_batch_profile(sp_batch_t *b, sp_pool_prof_t *prof)
{
    sp_pool_profile(b->pool, prof);
}

int
sp_batch_n_threads(const sp_batch_t *b)
{
    return sp_pool_n_threads(b->pool);
}

const float *
sp__batch_hidden(const sp_batch_t *b)
{
    return b->xn;
}

const float *
sp__batch_logits_buf(const sp_batch_t *b)
{
    return b->logits;
}

const char *
sp__batch_kernels_name(const sp_batch_t *b)
{
    return b->gpu != NULL ? "cuda" : b->k->name;
}

/* ------------------------------------------------------------------------ */
/* Weight products                                                           */
/* ------------------------------------------------------------------------ */

/* Convert n_tok activation rows to the dot-product format. */
typedef struct act_job {
    sp_from_float_fn conv;
    const float *x;
    int64_t n_in;
    int64_t x_stride; /* floats between input rows */
    void *dst;
    size_t dst_stride;
    int64_t n_tok;
} act_job_t;

static void
act_job_run(void *arg, int64_t t, int ith)
{
    act_job_t *j = arg;
    (void)ith;
    j->conv(j->x + t * j->x_stride, (char *)j->dst + t * j->dst_stride, j->n_in);
}

/* Up to three products sharing one converted input (q/k/v or gate/up). */
typedef struct mm_job {
    const sp_cpu_kernels_t *k;
    int n_w;
    const sp_weight_t *w[3];
    float *y[3];
    const float *bias[3];
    const void *x;
    size_t x_stride;
    int64_t n_tok;
    sp_mm_split_t split; /* the work items (model_impl.h) */
} mm_job_t;

static void
mm_job_run(void *arg, int64_t item, int ith)
{
    mm_job_t *j = arg;
    (void)ith;
    int wi;
    int64_t r0, r1, t0, t1;
    sp__mm_split_item(&j->split, item, &wi, &r0, &r1, &t0, &t1);
    const sp_weight_t *w = j->w[wi];
    const void *x = (const char *)j->x + (size_t)t0 * j->x_stride;
    float *y = j->y[wi] + t0 * w->n_out;
    if (w->packed != NULL && j->k->repack_gemm[w->type] != NULL) { /* load-time packed copy */
        j->k->repack_gemm[w->type](w->n_in, w->packed, w->packed_stride, r0, r1, x, j->x_stride,
                                   t1 - t0, y, w->n_out);
    } else {
        sp_cpu_gemm(j->k, w->type, w->n_in, w->data, w->row_bytes, r0, r1, x, j->x_stride,
                    t1 - t0, y, w->n_out);
    }
    if (j->bias[wi] != NULL) {
        for (int64_t t = t0; t < t1; t++) {
            float *yt = j->y[wi] + t * w->n_out;
            for (int64_t r = r0; r < r1; r++) {
                yt[r] += j->bias[wi][r];
            }
        }
    }
}

/*
 * y_i = x W_i^T (+ b_i) for n_w weights that share the input x (n_tok rows of
 * n_in floats, x_stride floats apart). Outputs are dense (n_tok, n_out_i).
 * Each work item is a range of weight rows times every activation row (times a block
 * of them from 2 * SP_MM_TOK_BLOCK rows on), so below that the weights are read once per
 * step however many rows (sequences) it has.
 */
static void
matmul(sp_batch_t *b, const char *label, int n_w, const sp_weight_t *const *w, float *const *y,
       const float *const *bias, const float *x, int64_t x_stride, int64_t n_tok)
{
    const sp_cpu_kernels_t *k = b->k;
    sp_type_t act_type = k->vec_dot_type[w[0]->type];
    for (int i = 1; i < n_w; i++) {
        if (k->vec_dot_type[w[i]->type] != act_type) { /* mixed formats: one at a time */
            for (int jj = 0; jj < n_w; jj++) {
                matmul(b, label, 1, &w[jj], &y[jj], &bias[jj], x, x_stride, n_tok);
            }
            return;
        }
    }

    const void *xa = x;
    size_t xa_stride = (size_t)x_stride * sizeof(float);
    if (act_type != SP_TYPE_F32) {
        const size_t dst_stride = sp__act_row_stride(act_type, w[0]->n_in);
        SP_ASSERT(dst_stride <= b->act_stride); /* every format: at most 4 bytes an element */
        act_job_t aj = {k->from_float[act_type], x, w[0]->n_in, x_stride, b->act, dst_stride,
                        n_tok};
        sp_pool_run_as(b->pool, "quantize", act_job_run, &aj, n_tok);
        xa = b->act;
        xa_stride = dst_stride;
    }

    mm_job_t j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.n_w = n_w;
    j.x = xa;
    j.x_stride = xa_stride;
    j.n_tok = n_tok;
    int64_t rows[SP_MM_SPLIT_MAX_W];
    for (int i = 0; i < n_w; i++) {
        j.w[i] = w[i];
        j.y[i] = y[i];
        j.bias[i] = bias[i];
        rows[i] = w[i]->n_out;
    }
    sp__mm_split_init(&j.split, n_w, rows, sp_pool_n_threads(b->pool), n_tok);
    sp_pool_run_as(b->pool, label, mm_job_run, &j, j.split.total);
}

static void
matmul1(sp_batch_t *b, const char *label, const sp_weight_t *w, float *y, const float *x,
        int64_t x_stride, int64_t n_tok)
{
    const sp_weight_t *ws[1] = {w};
    float *ys[1] = {y};
    const float *bs[1] = {NULL};
    matmul(b, label, 1, ws, ys, bs, x, x_stride, n_tok);
}

/* After the products of projections p0..p0+n_w-1 (same input x): add the LoRA
 * corrections of the rows whose sequence carries an adapter (engine/lora.h).
 * A row's correction reads only its own input, so batch invariance holds and
 * rows without an adapter keep their bits. The converted activations (act)
 * are dead once a product is done, and every rank is at most the projection's
 * n_in, so act's rows hold each row's A x. */
static void
lora_rows(sp_batch_t *b, const sp_batch_seq_t *seqs, int64_t il, sp_lora_proj_t p0, int n_w,
          float *const *y, const sp_weight_t *const *w, const float *x, int64_t x_stride,
          int64_t n_tok)
{
    for (int i = 0; i < n_w; i++) {
        sp_lora_apply_t a = {seqs, b->row_seq, n_tok, il, (sp_lora_proj_t)(p0 + i), x, x_stride,
                             y[i], w[i]->n_out, b->act, (int64_t)(b->act_stride / sizeof(float))};
        sp__lora_apply(b->pool, b->k, &a);
    }
}

/* ------------------------------------------------------------------------ */
/* Element-wise ops                                                          */
/* ------------------------------------------------------------------------ */

/* Rotate n_heads heads of head_dim at one position; cs holds (cos, sin) pairs.
 * (Scalar: a few thousand elements per token, under 0.2% of a step.) */
static void
rope(float *v, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs,
     sp_rope_type_t type)
{
    const int64_t half = n_rot / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *x = v + h * head_dim;
        for (int64_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            int64_t a = type == SP_ROPE_NEOX ? i : 2 * i;
            int64_t bb = type == SP_ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = x[a], x1 = x[bb];
            x[a] = x0 * c - x1 * s;
            x[bb] = x0 * s + x1 * c;
        }
    }
}

/* Embedding rows, converted to F32, and the RoPE cos/sin of each row's
 * position (shared by all layers), one row per chunk. */
static void
embed_job_run(void *arg, int64_t t, int ith)
{
    sp_batch_t *b = arg;
    const sp_model_t *m = b->m;
    const sp_hparams_t *hp = &m->hp;
    (void)ith;
    /* The row of the embedding matrix read below (validate checked the ids). */
    SP_ASSERT(b->row_tok[t] >= 0 && b->row_tok[t] < hp->n_vocab);
    float *x = b->x + t * hp->n_embd;
    b->k->to_float[m->tok_embd.type]((const char *)m->tok_embd.data +
                                         (size_t)b->row_tok[t] * m->tok_embd.row_bytes,
                                     x, hp->n_embd);
    if (hp->embd_scale != 1.0f) {
        for (int64_t i = 0; i < hp->n_embd; i++) {
            x[i] *= hp->embd_scale;
        }
    }
    /* cos and sin times the attention factor (LongRoPE's, YaRN's; 1 otherwise). */
    const double mscale = (double)hp->rope_attn_factor * (hp->rope_yarn ? hp->rope_mscale : 1.0);
    for (int tab = 0; tab < (b->rope_swa ? 2 : 1); tab++) {
        float *cs = b->rope_cs + (2 * t + tab) * b->rope_w;
        const float *inv = b->inv_freq + tab * (b->rope_w / 2);
        const int64_t n_rot = tab == 1 && hp->n_rot_swa > 0 ? hp->n_rot_swa : hp->n_rot;
        for (int64_t i = 0; i < n_rot / 2; i++) {
            double theta = (double)b->row_pos[t] * (double)inv[i];
            cs[2 * i] = (float)(cos(theta) * mscale);
            cs[2 * i + 1] = (float)(sin(theta) * mscale);
        }
    }
    if (hp->n_embd_pl > 0) {
        /* gemma4: this token's row of per-layer embeddings, for pl_input_job_run */
        const sp_weight_t *w = &m->pl_tok_embd;
        b->k->to_float[w->type]((const char *)w->data + (size_t)b->row_tok[t] * w->row_bytes,
                                b->pl_tmp + t * w->n_in, w->n_in);
    }
}

/* gemma4's per-layer inputs of row t, from pl = the embedding's projection (its
 * product with per_layer_model_proj) and pl_tmp = the token's per-layer embedding:
 * per layer, (RMSNorm(proj / sqrt(n_embd)) * pl_proj_norm + embd * sqrt(n_embd_pl))
 * / sqrt(2), into pl. */
static void
pl_input_job_run(void *arg, int64_t t, int ith)
{
    sp_batch_t *b = arg;
    const sp_model_t *m = b->m;
    const sp_hparams_t *hp = &m->hp;
    const int64_t P = hp->n_embd_pl, W = hp->n_layer * P;
    const float proj_scale = 1.0f / sqrtf((float)hp->n_embd);
    const float embd_scale = sqrtf((float)P), out_scale = 1.0f / sqrtf(2.0f);
    float *x = b->pl + t * W;
    const float *e = b->pl_tmp + t * W;
    (void)ith;
    for (int64_t i = 0; i < W; i++) {
        x[i] *= proj_scale;
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        b->k->rmsnorm(x + il * P, x + il * P, m->pl_proj_norm, P, hp->norm_eps);
    }
    for (int64_t i = 0; i < W; i++) {
        x[i] = (x[i] + e[i] * embd_scale) * out_scale;
    }
}

/* Per row t: x += proj (when add), then xn = RMSNorm(x) * w (when w; a copy
 * of x when only `copy`: a sub-layer without a pre-norm, olmo2). The
 * residual add and the next sub-layer's norm share one pass over the row. */
typedef struct add_norm_job {
    sp_batch_t *b;
    bool add;
    bool copy;
    const float *w;
    const float *post; /* (when add) proj = RMSNorm(proj) * post first (gemma), or NULL */
    const float *scale; /* (when add) then x times *scale (gemma4's layer_output_scale), or NULL */
} add_norm_job_t;

static void
add_norm_job_run(void *arg, int64_t t, int ith)
{
    add_norm_job_t *j = arg;
    sp_batch_t *b = j->b;
    const sp_hparams_t *hp = &b->m->hp;
    const int64_t E = hp->n_embd;
    float *x = b->x + t * E;
    (void)ith;
    if (j->add) {
        float *p = b->proj + t * E;
        if (j->post != NULL) {
            b->k->rmsnorm(p, p, j->post, E, hp->norm_eps);
        }
        if (hp->residual_scale != 1.0f) { /* granite */
            for (int64_t i = 0; i < E; i++) {
                p[i] *= hp->residual_scale;
            }
        }
        for (int64_t i = 0; i < E; i++) {
            x[i] += p[i];
        }
        for (int64_t i = 0; j->scale != NULL && i < E; i++) {
            x[i] *= *j->scale;
        }
    }
    if (j->w != NULL) {
        b->k->rmsnorm(b->xn + t * E, x, j->w, E, hp->norm_eps);
    } else if (j->copy) {
        memcpy(b->xn + t * E, x, (size_t)E * sizeof(float));
    }
}

static void
add_norm_rows(sp_batch_t *b, bool add, const float *w, int64_t n_tok)
{
    add_norm_job_t j = {b, add, false, w, NULL, NULL};
    sp_pool_run_as(b->pool, "norm", add_norm_job_run, &j, n_tok);
}

/* add_norm_rows with the sub-layer output normalised by post before the add. */
static void
add_post_norm_rows(sp_batch_t *b, const float *post, const float *w, bool copy, int64_t n_tok)
{
    add_norm_job_t j = {b, true, copy, w, post, NULL};
    sp_pool_run_as(b->pool, "norm", add_norm_job_run, &j, n_tok);
}

/* add_post_norm_rows with x times *scale after the add (scale may be NULL). */
static void
add_post_norm_scale_rows(sp_batch_t *b, const float *post, const float *scale, const float *w,
                         bool copy, int64_t n_tok)
{
    add_norm_job_t j = {b, true, copy, w, post, scale};
    sp_pool_run_as(b->pool, "norm", add_norm_job_run, &j, n_tok);
}

/* silu(gate) * up, in place into gate. Element-wise, so any split gives the
 * same bits. */
#define SWIGLU_CHUNK 16384 /* a decode step (n_ff elements) runs inline: no pool wake-up */

typedef struct swiglu_job {
    const sp_cpu_kernels_t *k;
    float *gate;
    const float *up;
    int64_t n;
    sp_ffn_act_t act;
} swiglu_job_t;

/* gelu(g) * u with gelu's tanh approximation, gelu(g) = g/2 (1 + tanh(sqrt(2/pi)
 * (g + 0.044715 g^3))) (gemma). Scalar: element-wise, so any split gives
 * the same bits. */
static void
geglu(float *g, const float *u, int64_t n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

static void
swiglu_job_run(void *arg, int64_t chunk, int ith)
{
    swiglu_job_t *j = arg;
    const int64_t lo = chunk * SWIGLU_CHUNK;
    const int64_t n = lo + SWIGLU_CHUNK < j->n ? SWIGLU_CHUNK : j->n - lo;
    (void)ith;
    if (j->act == SP_FFN_GELU) {
        geglu(j->gate + lo, j->up + lo, n);
    } else {
        j->k->swiglu(j->gate + lo, j->up + lo, n);
    }
}

/* gemma4: row t's gate (pl_tmp, n_embd_pl per row after the product) becomes
 * gelu(gate) * the row's per-layer input of layer il. */
typedef struct pl_gate_job {
    sp_batch_t *b;
    int64_t il;
} pl_gate_job_t;

static void
pl_gate_job_run(void *arg, int64_t t, int ith)
{
    pl_gate_job_t *j = arg;
    const sp_hparams_t *hp = &j->b->m->hp;
    const int64_t P = hp->n_embd_pl;
    (void)ith;
    geglu(j->b->pl_tmp + t * P, j->b->pl + (t * hp->n_layer + j->il) * P, P);
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                 */
/* ------------------------------------------------------------------------ */

/* RoPE q and k of every row, then write k and v into the row's slot: block
 * blocks[pos / SP_KV_BLOCK] of its sequence, lane pos % SP_KV_BLOCK. A chunk is a run
 * of rows: a block's key tile keeps a line per dimension holding SP_KV_BLOCK positions,
 * so rows handed out one at a time put neighbouring positions on different threads, and
 * every key store then took its line from the other core (rope ran no faster on two
 * threads than on one; BENCHMARKS.md). */
typedef struct rope_job {
    sp_batch_t *b;
    int64_t il;
    int64_t n_rows;
    int64_t per_chunk; /* rows a chunk */
} rope_job_t;

static void
rope_row(const rope_job_t *j, int64_t t)
{
    sp_batch_t *b = j->b;
    const sp_kv_pool_t *kv = b->kv;
    const sp_hparams_t *hp = &b->m->hp;
    const int64_t hd = sp__layer_head_dim(hp, j->il), n_kv = sp__layer_n_head_kv(hp, j->il);
    const int64_t kv_dim = n_kv * hd, q_dim = hp->n_head * hd, n_rot = sp__layer_n_rot(hp, j->il);
    const bool swa_tab = b->rope_swa && hp->layer_swa[j->il];
    const float *cs = b->rope_cs + (2 * t + (swa_tab ? 1 : 0)) * b->rope_w;
    float *kt = b->kv_k + t * kv_dim;
    float *vt = b->kv_v + t * kv_dim;
    const sp_layer_t *L = &b->m->layers[j->il];
    if (j->il >= sp__n_layer_kv(hp)) {
        /* gemma4's shared layers: only q, attending over an earlier layer's cache. */
        for (int64_t h = 0; h < hp->n_head; h++) {
            float *qh = b->q + t * q_dim + h * hd;
            b->k->rmsnorm(qh, qh, L->attn_q_norm, hd, hp->norm_eps);
        }
        rope(b->q + t * q_dim, hp->n_head, hd, n_rot, cs, hp->rope_type);
        return;
    }
    if (L->wv.data == NULL) {
        memcpy(vt, kt, (size_t)kv_dim * sizeof(float)); /* gemma4 without attn_v: v = k */
    }
    if (hp->v_norm) {
        /* gemma4: RMSNorm of each value head, no weight (ones) */
        for (int64_t g = 0; g < n_kv; g++) {
            b->k->rmsnorm(vt + g * hd, vt + g * hd, b->m->ones, hd, hp->norm_eps);
        }
    }
    if (L->attn_q_norm != NULL && hp->qk_norm_full) {
        /* RMSNorm of the whole q and k projections before the rotation (olmo2). */
        b->k->rmsnorm(b->q + t * q_dim, b->q + t * q_dim, L->attn_q_norm, q_dim, hp->norm_eps);
        b->k->rmsnorm(kt, kt, L->attn_k_norm, kv_dim, hp->norm_eps);
    } else if (L->attn_q_norm != NULL) {
        /* Per-head RMSNorm of q and k before the rotation (qwen3, gemma3). */
        for (int64_t h = 0; h < hp->n_head; h++) {
            float *qh = b->q + t * q_dim + h * hd;
            b->k->rmsnorm(qh, qh, L->attn_q_norm, hd, hp->norm_eps);
        }
        for (int64_t g = 0; g < n_kv; g++) {
            b->k->rmsnorm(kt + g * hd, kt + g * hd, L->attn_k_norm, hd, hp->norm_eps);
        }
    }
    if (!hp->layer_nope[j->il]) {
        rope(b->q + t * q_dim, hp->n_head, hd, n_rot, cs, hp->rope_type);
        rope(kt, n_kv, hd, n_rot, cs, hp->rope_type);
    }
    const int64_t pos = b->row_pos[t];
    SP_ASSERT(pos >= 0 && pos < b->max_ctx); /* the cache rows the buffers were sized for */
    const bool in_swa = sp__kv_in_swa(kv, j->il);
    const sp_batch_seq_t *sq = &b->seqs[b->row_seq[t]];
    const int64_t block = (in_swa ? sq->blocks + sq->n_blocks : sq->blocks)[pos / SP_KV_BLOCK];
    const int64_t lane = pos % SP_KV_BLOCK;
    /* The write lands inside the pool (its part's ids). */
    SP_ASSERT(block >= 0 && block < (in_swa ? kv->n_swa_blocks : kv->n_blocks));
    void *data = sp__kv_data(kv, j->il);
    for (int64_t g = 0; g < n_kv; g++) {
        const int64_t tile = sp__kv_tile(kv, block, j->il, g, hp->n_head_kv); /* elements */
        const float *kg = kt + g * hd;
        /* a latent cache (one tile) keeps no value: it is the key (mla_attn.c) */
        const bool val = kv->n_tiles == 2;
        char *vdst =
            (char *)data + (size_t)(tile + kv->tile_elems + lane * kv->v_row) * kv->elt;
        if (kv->type == SP_TYPE_Q8_0) {
            /* Quantised as stored: keys per position into the lane (kernels.h). */
            sp_kv_q8_store_key((char *)data + tile, lane, kg, hd);
            if (val) {
                sp_kv_q8_store_value(vdst, vt + g * hd, hd);
            }
        } else if (kv->type == SP_TYPE_F32) {
            float *kc = (float *)data + tile;
            for (int64_t d = 0; d < hd; d++) {
                kc[d * SP_KV_BLOCK + lane] = kg[d];
            }
            if (val) {
                memcpy(vdst, vt + g * hd, (size_t)hd * sizeof(float));
            }
        } else {
            sp_fp16_t *kc = (sp_fp16_t *)data + tile;
            for (int64_t d = 0; d < hd; d++) {
                kc[d * SP_KV_BLOCK + lane] = sp_fp32_to_fp16(kg[d]);
            }
            if (val) {
                b->k->from_float[SP_TYPE_F16](vt + g * hd, vdst, hd);
            }
        }
    }
}

static void
rope_job_run(void *arg, int64_t chunk, int ith)
{
    const rope_job_t *j = arg;
    (void)ith;
    const int64_t lo = chunk * j->per_chunk;
    const int64_t hi = lo + j->per_chunk < j->n_rows ? lo + j->per_chunk : j->n_rows;
    for (int64_t t = lo; t < hi; t++) {
        rope_row(j, t);
    }
}

/*
 * One work item = one (row, KV head): the kernel computes all query heads of
 * the group together, so each cache row is loaded once for the group. Items
 * are ordered KV-head-major and, within a head, latest position first (the
 * `order` array): causal cost grows with the position, so the pool hands out
 * the big items first and the small ones last and the threads finish together
 * (longest-first scheduling). With few items (decode with fewer KV heads than
 * threads, e.g. multi-query attention) each group's query heads are split
 * over n_split items so every thread gets work. Every query head's result
 * depends only on its row and its sequence's cache (the kernel contract), so
 * neither the order nor the split changes a bit.
 */
typedef struct attn_job {
    sp_batch_t *b;
    int64_t il;
    int64_t n_tok;
    int64_t n_split;   /* parts of each KV head's query group */
    int64_t per_chunk; /* items per pool chunk */
} attn_job_t;

static void
attn_job_run(void *arg, int64_t chunk, int ith)
{
    attn_job_t *j = arg;
    sp_batch_t *b = j->b;
    const sp_kv_pool_t *kv = b->kv;
    const sp_hparams_t *hp = &b->m->hp;
    const int64_t hd = sp__layer_head_dim(hp, j->il), q_dim = hp->n_head * hd;
    const int64_t n_kv = sp__layer_n_head_kv(hp, j->il), group = hp->n_head / n_kv;
    const int64_t part = (group + j->n_split - 1) / j->n_split; /* query heads per item */
    const int64_t n_items = j->n_tok * n_kv * j->n_split;
    const int64_t src = sp__layer_kv_src(hp, j->il); /* the cache it reads (gemma4 shares) */
    const int64_t lo = chunk * j->per_chunk;
    const int64_t hi = lo + j->per_chunk < n_items ? lo + j->per_chunk : n_items;
    const float *sinks = b->m->layers[j->il].attn_sinks;

    for (int64_t item = lo; item < hi; item++) {
        const int64_t g = item / (j->n_tok * j->n_split);
        const int64_t r = item % (j->n_tok * j->n_split);
        const int64_t t = b->order[r / j->n_split];
        const int64_t h0 = g * group + (r % j->n_split) * part; /* first query head */
        const int64_t n_q = (g + 1) * group - h0 < part ? (g + 1) * group - h0 : part;
        if (n_q <= 0) {
            continue;
        }
        const int64_t tile = sp__kv_tile(kv, 0, src, g, hp->n_head_kv);
        const bool in_swa = sp__kv_in_swa(kv, src);
        const sp_batch_seq_t *sq = &b->seqs[b->row_seq[t]];
        const int64_t be = in_swa ? kv->swa_block_elems : kv->block_elems;
        const char *base = (const char *)sp__kv_data(kv, src) + (size_t)tile * kv->elt;
        sp_attn_args_t a = {
            .head_dim = hd,
            .n_q = n_q,
            .n_kv = b->row_pos[t] + 1,
            .q = b->q + t * q_dim + h0 * hd,
            .q_stride = hd,
            .k = base,
            .v = base + (size_t)kv->tile_elems * kv->elt,
            .blocks = in_swa ? sq->blocks + sq->n_blocks : sq->blocks,
            .k_block_stride = be,
            .v_block_stride = be,
            .v_stride = kv->v_row,
            .scale = b->attn_scale,
            .o = b->att + t * q_dim + h0 * hd,
            .o_stride = hd,
            .scratch = b->scores + (int64_t)ith * b->scores_stride,
            .window = hp->layer_swa[j->il] ? hp->n_swa : 0,
            .softcap = hp->attn_softcap,
            .sinks = sinks != NULL ? sinks + h0 : NULL, /* q row i is head h0 + i */
        };
        if (kv->n_tiles == 1) {
            /* the latent cache: values read from the key tile, the rotated lanes skipped */
            sp__mla_attn(b->k, kv->type, &a, hp->n_rot);
        } else {
            b->k->attn[kv->type](&a);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Step                                                                      */
/* ------------------------------------------------------------------------ */

/* The logits' last step, over n rows: times 1 / logit_scale (granite), then
 * soft-capped c tanh(l / c) (gemma). Per element, so each row's bits are its
 * own. */
typedef struct softcap_job {
    float *logits;
    int64_t n_vocab;
    float inv_scale;
    float cap;
} softcap_job_t;

static void
softcap_job_run(void *arg, int64_t t, int ith)
{
    softcap_job_t *j = arg;
    float *l = j->logits + t * j->n_vocab;
    (void)ith;
    for (int64_t i = 0; i < j->n_vocab && j->inv_scale != 1.0f; i++) {
        l[i] *= j->inv_scale;
    }
    for (int64_t i = 0; i < j->n_vocab && j->cap > 0.0f; i++) {
        l[i] = j->cap * tanhf(l[i] / j->cap);
    }
}

static void
final_softcap(sp_batch_t *b, float *logits, int64_t n_rows)
{
    const sp_hparams_t *hp = &b->m->hp;
    if (hp->final_softcap > 0.0f || hp->logit_scale != 1.0f) {
        softcap_job_t j = {logits, hp->n_vocab, 1.0f / hp->logit_scale, hp->final_softcap};
        sp_pool_run_as(b->pool, "logit_softcap", softcap_job_run, &j, n_rows);
    }
}

/* Restore the min-heap (on position) below node r of order[0..n). */
static void
sift_down(int32_t *order, const int64_t *pos, int64_t r, int64_t n)
{
    for (;;) {
        int64_t c = 2 * r + 1;
        if (c >= n) {
            return;
        }
        if (c + 1 < n && pos[order[c + 1]] < pos[order[c]]) {
            c++;
        }
        if (pos[order[c]] >= pos[order[r]]) {
            return;
        }
        const int32_t tmp = order[r];
        order[r] = order[c];
        order[c] = tmp;
        r = c;
    }
}

/* order[0..n) = rows by decreasing position (heap sort: no allocation; the
 * order only balances the threads, it never changes a result). */
static void
sort_rows_by_pos(int32_t *order, const int64_t *pos, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        order[i] = (int32_t)i;
    }
    for (int64_t r = n / 2 - 1; r >= 0; r--) {
        sift_down(order, pos, r, n);
    }
    for (int64_t end = n - 1; end > 0; end--) { /* the smallest goes to the back */
        const int32_t tmp = order[0];
        order[0] = order[end];
        order[end] = tmp;
        sift_down(order, pos, 0, end);
    }
}

/* The first sliding-part table entry a step of s reads: the block of the
 * window's start for its first token (batch.h). */
static int64_t
swa_first_block(const sp_batch_t *b, const sp_batch_seq_t *s)
{
    const int64_t start = s->pos + 1 - b->m->hp.n_swa;
    return start > 0 ? start / SP_KV_BLOCK : 0;
}

/* The header's contract, checked before anything is computed. */
static sp_status_t
validate(sp_batch_t *b, sp_kv_pool_t *kv, const sp_batch_seq_t *seqs, int64_t n_seqs)
{
    if (kv == NULL || seqs == NULL || n_seqs < 1 || n_seqs > b->max_seqs || kv->m != b->m ||
        (kv->gpu == NULL) != (b->gpu == NULL)) {
        return SP_ERR_INVALID;
    }
    const int64_t n_vocab = b->m->hp.n_vocab;
    int64_t rows = 0, kept = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        const sp_batch_seq_t *s = &seqs[i];
        if (s->tokens == NULL || s->blocks == NULL || s->n_tokens < 1 ||
            s->n_tokens > b->max_tokens - rows || s->pos < 0 || s->pos > b->max_ctx ||
            s->n_tokens > b->max_ctx - s->pos || s->n_logits < 0 || s->n_logits > s->n_tokens ||
            (s->n_logits > 1 && b->gpu != NULL) ||
            (s->lora != NULL && (b->gpu != NULL || sp_lora_model(s->lora) != b->m))) {
            return SP_ERR_INVALID;
        }
        rows += s->n_tokens;
        kept += s->logits ? (s->n_logits > 1 ? s->n_logits : 1) : 0;
        if (kept > b->max_logits) {
            return SP_ERR_INVALID;
        }
        const int64_t need = (s->pos + s->n_tokens + SP_KV_BLOCK - 1) / SP_KV_BLOCK;
        if (s->n_blocks < need) {
            return SP_ERR_INVALID;
        }
        for (int64_t k = 0; k < s->n_tokens; k++) {
            if (s->tokens[k] < 0 || s->tokens[k] >= n_vocab) {
                return SP_ERR_INVALID;
            }
        }
        for (int64_t k = 0; k < need; k++) {
            if (s->blocks[k] < 0 || s->blocks[k] >= kv->n_blocks) {
                return SP_ERR_INVALID;
            }
        }
        if (kv->n_swa_blocks > 0) {
            const int32_t *swa = s->blocks + s->n_blocks;
            for (int64_t k = swa_first_block(b, s); k < need; k++) {
                if (swa[k] < 0 || swa[k] >= kv->n_swa_blocks) {
                    return SP_ERR_INVALID;
                }
            }
        }
    }
    /* No block written twice: by two sequences, or twice in one table. */
    if (++kv->epoch == 0) { /* wrapped: old marks could collide */
        memset(kv->mark, 0, (size_t)kv->n_blocks * sizeof(uint32_t));
        if (kv->swa_mark != NULL) {
            memset(kv->swa_mark, 0, (size_t)kv->n_swa_blocks * sizeof(uint32_t));
        }
        kv->epoch = 1;
    }
    for (int64_t i = 0; i < n_seqs; i++) {
        const sp_batch_seq_t *s = &seqs[i];
        const int64_t first = s->pos / SP_KV_BLOCK;
        const int64_t last = (s->pos + s->n_tokens - 1) / SP_KV_BLOCK;
        for (int64_t k = first; k <= last; k++) {
            if (kv->mark[s->blocks[k]] == kv->epoch) {
                return SP_ERR_INVALID;
            }
            kv->mark[s->blocks[k]] = kv->epoch;
            if (kv->n_swa_blocks > 0) {
                const int32_t id = s->blocks[s->n_blocks + k];
                if (kv->swa_mark[id] == kv->epoch) {
                    return SP_ERR_INVALID;
                }
                kv->swa_mark[id] = kv->epoch;
            }
        }
    }
    return SP_OK;
}

sp_status_t
sp__batch_run(sp_batch_t *b, sp_kv_pool_t *kv, const sp_batch_seq_t *seqs, int64_t n_seqs,
              sp_batch_out_t out, float *all_logits)
{
    if (b == NULL) {
        return SP_ERR_INVALID;
    }
    b->n_seqs = 0;
    sp_status_t st = validate(b, kv, seqs, n_seqs);
    if (st != SP_OK) {
        return st;
    }
    for (int64_t i = 0; i < n_seqs; i++) {
        b->seq_nl[i] = 1; /* more only where the CPU output stage keeps more */
    }
    if (b->cand_n != NULL) {
        memset(b->cand_n, 0, (size_t)n_seqs * sizeof(int32_t));
    }
    const sp_model_t *m = b->m;
    const sp_hparams_t *hp = &m->hp;
    const int64_t E = hp->n_embd;

    /* Rows: the sequences' tokens in order. */
    int64_t R = 0;
    bool lora = false; /* some sequence carries an adapter */
    for (int64_t i = 0; i < n_seqs; i++) {
        lora |= seqs[i].lora != NULL;
        for (int64_t k = 0; k < seqs[i].n_tokens; k++, R++) {
            b->row_tok[R] = seqs[i].tokens[k];
            b->row_pos[R] = seqs[i].pos + k;
            b->row_seq[R] = (int32_t)i;
        }
    }
    SP_ASSERT(R <= b->max_tokens); /* the row buffers hold max_tokens rows */
    sort_rows_by_pos(b->order, b->row_pos, R);
    b->seqs = seqs;
    b->kv = kv;

    sp_pool_run_as(b->pool, "embed", embed_job_run, b, R);
    int64_t il0 = 0; /* the first layer the CPU runs */
    if (b->gpu != NULL) {
        /* Layers 0..n_gpu-1 on the device, from the rows embedded above. */
        sp_gpu_step_t gs = {.seqs = seqs, .n_seqs = n_seqs, .n_rows = R, .x = b->x,
                            .row_pos = b->row_pos, .row_seq = b->row_seq, .out = (int)out,
                            .x_out = b->x,
                            .logits = out == SP_BATCH_OUT_ALL ? all_logits : b->logits,
                            .seq_out = b->seq_out, .hidden = b->xn,
                            .cand_k = out == SP_BATCH_OUT_SEQ ? b->cand_req : NULL,
                            .cand_n = b->cand_n};
        st = sp__gpu_batch_run(b->gpu, kv->gpu, &gs);
        il0 = sp_gpu_model_layers(m);
        if (st != SP_OK || il0 == hp->n_layer) {
            for (int64_t i = 0; out != SP_BATCH_OUT_SEQ && i < n_seqs; i++) {
                b->seq_out[i] = -1;
            }
            b->seqs = NULL;
            b->kv = NULL;
            b->n_seqs = st == SP_OK ? n_seqs : 0;
            return st;
        }
    }
    if (hp->n_embd_pl > 0) {
        /* gemma4's per-layer inputs, from the scaled embeddings (before any layer) */
        matmul1(b, "per_layer_in", &m->pl_model_proj, b->pl, b->x, E, R);
        sp_pool_run_as(b->pool, "per_layer_mix", pl_input_job_run, b, R);
    }
    add_norm_job_t first = {b, false, true, m->layers[il0].attn_norm, NULL, NULL};
    sp_pool_run_as(b->pool, "norm", add_norm_job_run, &first, R);

    const int64_t nth = sp_pool_n_threads(b->pool);
    for (int64_t il = il0; il < hp->n_layer; il++) {
        const sp_layer_t *L = &m->layers[il];
        /* This layer's sizes (gemma4 varies them; model_impl.h). */
        const int64_t n_kv = sp__layer_n_head_kv(hp, il), group = hp->n_head / n_kv;
        const int64_t q_dim = hp->n_head * sp__layer_head_dim(hp, il);
        const int64_t n_ff = sp__layer_n_ff(hp, il);
        int64_t n_split = 1;
        while (R * n_kv * n_split < 2 * nth && n_split < group) {
            n_split++;
        }
        const int64_t n_items = R * n_kv * n_split;

        /* k and v: none for a layer that reads an earlier cache, k alone without attn_v
         * (gemma4: the values are the keys) */
        const sp_weight_t *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *yqkv[3] = {b->q, b->kv_k, b->kv_v};
        const float *bqkv[3] = {L->bq, L->bk, L->bv};
        const int n_proj = il >= sp__n_layer_kv(hp) ? 1 : L->wv.data == NULL ? 2 : 3;
        if (m->mla != NULL) {
            /* Latent attention (engine/mla.h): the same rope, cache and
             * attention below over one latent KV head (LoRA on it is refused at load). */
            sp__mla_qkv(m, il, b->pool, b->k, b->mla_buf, b->max_tokens, b->xn, b->q, b->kv_k,
                        b->kv_v, R);
        } else {
            matmul(b, "qkv", n_proj, wqkv, yqkv, bqkv, b->xn, E, R);
        }
        if (lora) {
            lora_rows(b, seqs, il, SP_LORA_Q, n_proj, yqkv, wqkv, b->xn, E, R);
        }

        /* whole blocks of positions a chunk where there are rows enough for two chunks a
         * thread, fewer rows a chunk below that (a decode batch: one sequence a row) */
        int64_t rope_rows = R / (2 * nth);
        rope_rows = rope_rows < 1 ? 1 : rope_rows > SP_KV_BLOCK ? SP_KV_BLOCK : rope_rows;
        rope_job_t rj = {b, il, R, rope_rows};
        sp_pool_run_as(b->pool, "rope", rope_job_run, &rj, (R + rope_rows - 1) / rope_rows);
        /* A few items per chunk keep a long prefill within the pool's chunk
         * limit. */
        attn_job_t aj = {b, il, R, n_split, 1 + n_items / 16384};
        sp_pool_run_as(b->pool, "attention", attn_job_run, &aj,
                       (n_items + aj.per_chunk - 1) / aj.per_chunk);

        if (m->mla != NULL) {
            sp__mla_out(m, il, b->pool, b->k, b->mla_buf, b->max_tokens, b->att, b->proj, R);
        } else {
            const sp_weight_t *wo[1] = {&L->wo};
            float *yo[1] = {b->proj};
            const float *bo[1] = {L->bo}; /* NULL but for gpt-oss */
            matmul(b, "attn_out", 1, wo, yo, bo, b->att, q_dim, R);
        }
        if (lora) {
            const sp_weight_t *wo[1] = {&L->wo};
            lora_rows(b, seqs, il, SP_LORA_O, 1, &b->proj, wo, b->att, q_dim, R);
        }
        add_post_norm_rows(b, L->attn_post_norm, L->ffn_norm, true, R);

        /* gemma4's experts run beside its dense MLP (sp__moe_ffn_gemma4 below) */
        const bool g4_moe = L->ffn_pre_norm_2 != NULL;
        if (sp__moe_layer(m, il) && !g4_moe) {
            /* Mixture of experts (engine/moe.c); LoRA adapters never carry
             * FFN matrices for such a model (lora.c checks their shapes). */
            sp__moe_ffn(m, il, b->pool, b->k, b->moe_buf, b->max_tokens, b->xn, b->proj, R);
        } else {
            const sp_weight_t *wgu[2] = {&L->w_gate, &L->w_up};
            float *ygu[2] = {b->ff_gate, b->ff_up};
            const float *bgu[2] = {NULL, NULL};
            matmul(b, "ffn_gate_up", 2, wgu, ygu, bgu, b->xn, E, R);
            if (lora) {
                lora_rows(b, seqs, il, SP_LORA_GATE, 2, ygu, wgu, b->xn, E, R);
            }
            swiglu_job_t sj = {b->k, b->ff_gate, b->ff_up, R * n_ff, hp->ffn_act};
            sp_pool_run_as(b->pool, "ffn_act", swiglu_job_run, &sj,
                           (sj.n + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK);
            matmul1(b, "ffn_down", &L->w_down, b->proj, b->ff_gate, n_ff, R);
            if (lora) {
                const sp_weight_t *wd[1] = {&L->w_down};
                lora_rows(b, seqs, il, SP_LORA_DOWN, 1, &b->proj, wd, b->ff_gate, n_ff, R);
            }
            if (g4_moe) {
                /* proj = RMSNorm(mlp) * post_ffw_norm_1 + RMSNorm(experts) * post_ffw_norm_2,
                 * the experts over x (the residual after attention), normed their own way */
                sp__moe_ffn_gemma4(m, il, b->pool, b->k, b->moe_buf, b->max_tokens, b->x,
                                   b->proj, R);
            }
        }
        const float *next_norm = il + 1 < hp->n_layer ? m->layers[il + 1].attn_norm : NULL;
        if (hp->n_embd_pl > 0) {
            /* gemma4: the residual add, then the per-layer input's contribution
             * RMSNorm(Wproj (gelu(Wgate x) * pl_il)) * post_norm added, x times the
             * layer's scale, and the next layer's input norm. */
            add_post_norm_rows(b, L->ffn_post_norm, NULL, false, R);
            matmul1(b, "per_layer_gate", &L->pl_gate, b->pl_tmp, b->x, E, R);
            pl_gate_job_t pj = {b, il};
            sp_pool_run_as(b->pool, "per_layer_act", pl_gate_job_run, &pj, R);
            matmul1(b, "per_layer_proj", &L->pl_proj, b->proj, b->pl_tmp, hp->n_embd_pl, R);
            add_post_norm_scale_rows(b, L->pl_post_norm, L->out_scale, next_norm,
                                     il + 1 < hp->n_layer, R);
        } else {
            /* The residual add (times the layer's scale, gemma4), and the next layer's
             * input norm when there is one. */
            add_post_norm_scale_rows(b, L->ffn_post_norm, L->out_scale, next_norm,
                                     il + 1 < hp->n_layer, R);
        }
    }

    if (out == SP_BATCH_OUT_SEQ) {
        /* Gather the last row of each sequence that asked: one output product
         * over those rows only. */
        int64_t n_out = 0, row = 0;
        for (int64_t i = 0; i < n_seqs; i++) {
            row += seqs[i].n_tokens;
            b->seq_out[i] = -1;
            if (seqs[i].logits) {
                const int64_t nl = seqs[i].n_logits > 1 ? seqs[i].n_logits : 1;
                b->seq_out[i] = n_out;
                b->seq_nl[i] = nl;
                for (int64_t j = 0; j < nl; j++, n_out++) {
                    b->k->rmsnorm(b->xn + n_out * E, b->x + (row - nl + j) * E, m->output_norm, E,
                                  hp->norm_eps);
                }
            }
        }
        if (n_out > 0) {
            matmul1(b, "output", &m->output, b->logits, b->xn, E, n_out);
            final_softcap(b, b->logits, n_out);
        }
    } else {
        add_norm_rows(b, false, m->output_norm, R);
        if (out == SP_BATCH_OUT_ALL) {
            matmul1(b, "output", &m->output, all_logits, b->xn, E, R);
            final_softcap(b, all_logits, R);
        }
        for (int64_t i = 0; i < n_seqs; i++) {
            b->seq_out[i] = -1;
        }
    }
    b->seqs = NULL;
    b->kv = NULL;
    b->n_seqs = n_seqs;
    return SP_OK;
}

sp_status_t
sp_batch_eval(sp_batch_t *b, sp_kv_pool_t *kv, const sp_batch_seq_t *seqs, int64_t n_seqs)
{
    return sp__batch_run(b, kv, seqs, n_seqs, SP_BATCH_OUT_SEQ, NULL);
}

sp_status_t
sp_batch_eval_cand(sp_batch_t *b, sp_kv_pool_t *kv, const sp_batch_seq_t *seqs, int64_t n_seqs,
                   const int32_t *cand_k)
{
    if (b == NULL) {
        return SP_ERR_INVALID;
    }
    for (int64_t i = 0; cand_k != NULL && i < n_seqs; i++) {
        if (cand_k[i] < 0 || cand_k[i] > SP_BATCH_MAX_CANDIDATES) {
            b->n_seqs = 0;
            return SP_ERR_INVALID;
        }
    }
    b->cand_req = cand_k;
    sp_status_t st = sp__batch_run(b, kv, seqs, n_seqs, SP_BATCH_OUT_SEQ, NULL);
    b->cand_req = NULL;
    return st;
}
