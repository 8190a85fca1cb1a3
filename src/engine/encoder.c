/*
 * encoder.c - BERT and nomic-bert encoders: loading from GGUF (tensor and key
 * names as llama.cpp's converter writes them) and the bidirectional forward
 * pass behind sp_ctx_embed (encoder.h).
 *
 * Forward pass of one text of n tokens (every row sees all n positions):
 *   x = tok_embd[id] + token_types[type] (+ position_embd[pos], bert)
 *   x = LayerNorm(x) * token_embd_norm.weight + .bias
 *   per layer:
 *     q, k, v = x Wq + bq, ... (nomic-bert: one fused attn_qkv product)
 *     nomic-bert: NeoX RoPE on q and k at positions 0..n-1
 *     a = softmax(q k^T / sqrt(head_dim)) v per head, over all n positions
 *     x = LayerNorm(x + a Wo + bo)                    (attn_output_norm)
 *     f = GELU(x Wup + bup) Wdown + bdown             (bert)
 *       = (SiLU(x Wgate) * (x Wup)) Wdown             (nomic-bert)
 *     x = LayerNorm(x + f)                            (layer_output_norm)
 *   pooling (`<arch>.pooling_type`): mean over positions, the first row (CLS)
 *   or the last, scaled to unit length; or, for a reranker (rank), the CLS row
 *   through tanh(cls) and cls.output, the raw scores (llama.cpp applies no
 *   sigmoid either).
 * GELU is the exact erf form of the original BERT (llama.cpp uses the tanh
 * approximation; the two differ by under 1e-3 per activation).
 *
 * Token types: 0 everywhere, except for a reranker with two or more types,
 * where the tokens after the first [SEP] (the document of a
 * "[CLS] query [SEP] document [SEP]" pair) take type 1, as the model was
 * trained (llama.cpp keeps type 0 for every token).
 *
 * Batch invariance: a run holds one text; its products use the kernels'
 * gemm, whose rows do not depend on the other rows of the call, and its
 * attention the paged kernel over a private contiguous key/value copy, one
 * (row, head) per call. So a text's vector is the same bits whatever else a
 * request or the server is doing, for any thread count.
 *
 * Threads: a run (sp_enc_run_t) belongs to one context, used by one thread at
 * a time; it owns a thread pool for the products. Memory: every buffer is
 * allocated when the run is created, sized for n_ctx positions.
 */
#include "engine/encoder.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "core/pool.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"

#define MAX_HEADS 4096
#define MAX_TYPES 16

typedef enum enc_arch { ENC_BERT, ENC_NOMIC } enc_arch_t;

typedef struct enc_layer {
    sp_weight_t wqkv;               /* fused (nomic-bert) or data == NULL */
    const float *bqkv;
    sp_weight_t wq, wk, wv;         /* separate (bert) */
    const float *bq, *bk, *bv;
    sp_weight_t wo;
    const float *bo;
    const float *attn_norm, *attn_norm_b;  /* attn_output_norm */
    sp_weight_t up, gate, down;     /* gate only for nomic-bert */
    const float *up_b, *down_b;
    const float *out_norm, *out_norm_b;    /* layer_output_norm */
} enc_layer_t;

struct sp_encoder {
    enc_arch_t arch;
    sp_pooling_t pooling;
    int64_t n_types;           /* rows of token_types (0: none) */
    int64_t n_cls_out;         /* reranker outputs */
    int32_t sep;               /* the tokenizer's [SEP], -1 when none */
    sp_weight_t type_embd;     /* (n_types, n_embd) or data == NULL */
    sp_weight_t pos_embd;      /* (n_ctx_train, n_embd), bert */
    const float *embd_norm, *embd_norm_b;
    sp_weight_t cls;           /* (n_embd, n_embd) or data == NULL */
    const float *cls_b;
    sp_weight_t cls_out;       /* (n_cls_out, n_embd), rank */
    const float *cls_out_b;
    enc_layer_t *layers;
};

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

bool
sp__encoder_arch(sp_str_t arch)
{
    return sp_str_eq_c(arch, "bert") || sp_str_eq_c(arch, "nomic-bert");
}

void
sp__encoder_free(struct sp_encoder *e)
{
    if (e != NULL) {
        sp_free(e->layers);
        sp_free(e);
    }
}

static sp_status_t
load_hparams(sp_model_t *m, sp_encoder_t *e, char *err, size_t err_len)
{
    const sp_gguf_t *g = m->gguf;
    const char *path = sp_gguf_path(g);
    sp_hparams_t *hp = &m->hp;
    const char *a = hp->arch;
    sp_status_t st;
    int64_t v;
#define KI(field, suffix, dflt, lo, hi)                                                            \
    if ((st = sp__hp_int(g, a, suffix, dflt, lo, hi, &hp->field, err, err_len)) != SP_OK) return st;
    KI(n_embd, "embedding_length", -1, 1, 1 << 16);
    KI(n_layer, "block_count", -1, 1, SP_MAX_LAYERS);
    KI(n_head, "attention.head_count", -1, 1, MAX_HEADS);
    KI(n_ff, "feed_forward_length", -1, 1, 1 << 20);
    KI(n_ctx_train, "context_length", -1, 1, SP_MAX_CTX);
#undef KI
    if ((st = sp__hp_int(g, a, "attention.head_count_kv", hp->n_head, 1, MAX_HEADS, &v, err,
                         err_len)) != SP_OK) {
        return st;
    }
    if (v != hp->n_head) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: %s with head_count_kv %lld != head_count %lld is not supported", path,
                       a, (long long)v, (long long)hp->n_head);
    }
    hp->n_head_kv = hp->n_head;
    if (hp->n_embd % hp->n_head != 0 || hp->n_embd / hp->n_head < 2) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: embedding_length (%lld) is not a multiple of head_count (%lld)", path,
                       (long long)hp->n_embd, (long long)hp->n_head);
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    hp->n_rot = hp->head_dim;
    if (e->arch == ENC_NOMIC && hp->n_rot % 2 != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: head size %lld is odd (RoPE)", path,
                       (long long)hp->n_rot);
    }
    hp->rope_type = SP_ROPE_NEOX;
    hp->rope_scale = 1.0f;
    if ((st = sp__hp_float(g, a, "attention.layer_norm_epsilon", 1e-12, 0, 1, &hp->norm_eps, err,
                           err_len)) != SP_OK ||
        (st = sp__hp_float(g, a, "rope.freq_base", 10000.0, 1e-3, 1e12, &hp->rope_base, err,
                           err_len)) != SP_OK) {
        return st;
    }
    char key[128];
    bool causal = false;
    snprintf(key, sizeof key, "%s.attention.causal", a);
    st = sp_gguf_get_bool(g, key, &causal, err, err_len);
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
        return st;
    }
    if (causal) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: %s = true: a causal %s is not supported (encoders attend both ways)",
                       path, key, a);
    }
    /* A file without the key gives no single vector per text (llama.cpp's
     * "unspecified" falls back to none for these architectures too). */
    if ((st = sp__hp_int(g, a, "pooling_type", SP_POOLING_NONE, SP_POOLING_NONE, SP_POOLING_RANK,
                         &v, err, err_len)) != SP_OK) {
        return st;
    }
    e->pooling = (sp_pooling_t)v;
    e->n_cls_out = 1;
    snprintf(key, sizeof key, "%s.classifier.output_labels", a);
    sp_gguf_arr_t labels;
    st = sp_gguf_get_arr(g, key, &labels, err, err_len);
    if (st == SP_OK) {
        if (labels.n < 1 || labels.n > (uint64_t)hp->n_embd) {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: %s has %llu labels (1..%lld)", path,
                           key, (unsigned long long)labels.n, (long long)hp->n_embd);
        }
        e->n_cls_out = (int64_t)labels.n;
    } else if (st != SP_ERR_NOT_FOUND) {
        return st;
    }
    return SP_OK;
}

sp_status_t
sp__encoder_load(sp_model_t *m, sp_str_t arch, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(m->gguf);
    sp_hparams_t *hp = &m->hp;
    sp_status_t st;
    char name[96];

    memset(hp, 0, sizeof *hp);
    snprintf(hp->arch, sizeof hp->arch, "%s", sp_str_eq_c(arch, "bert") ? "bert" : "nomic-bert");
    sp_encoder_t *e = sp_calloc(1, sizeof *e);
    if (e == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    m->enc = e;
    e->arch = sp_str_eq_c(arch, "bert") ? ENC_BERT : ENC_NOMIC;
    e->sep = -1;
    if ((st = load_hparams(m, e, err, err_len)) != SP_OK) {
        return st;
    }
    const int64_t E = hp->n_embd, F = hp->n_ff;

    const sp_gguf_tensor_t *te = sp_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (te == NULL) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'", path);
    }
    hp->n_vocab = te->ne[1];
    if (hp->n_vocab < 1 || hp->n_vocab > (1 << 24)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: token_embd.weight vocabulary %lld out of range", path,
                       (long long)hp->n_vocab);
    }
    if ((st = sp__model_weight(m, "token_embd.weight", E, hp->n_vocab, true, &m->tok_embd, err,
                               err_len)) != SP_OK) {
        return st;
    }
    m->output = m->tok_embd;
    hp->tied_output = true;
    const sp_gguf_tensor_t *tt = sp_gguf_find_tensor(m->gguf, "token_types.weight");
    if (tt != NULL) {
        e->n_types = tt->ne[1];
        if (e->n_types < 1 || e->n_types > MAX_TYPES) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: token_types.weight has %lld types (1..%d)", path,
                           (long long)e->n_types, MAX_TYPES);
        }
        if ((st = sp__model_weight(m, "token_types.weight", E, e->n_types, true, &e->type_embd, err,
                                   err_len)) != SP_OK) {
            return st;
        }
    }
    if (e->arch == ENC_BERT &&
        (st = sp__model_weight(m, "position_embd.weight", E, hp->n_ctx_train, true, &e->pos_embd,
                               err, err_len)) != SP_OK) {
        return st;
    }
    if ((st = sp__model_vector(m, "token_embd_norm.weight", E, true, &e->embd_norm, err,
                               err_len)) != SP_OK ||
        (st = sp__model_vector(m, "token_embd_norm.bias", E, true, &e->embd_norm_b, err,
                               err_len)) != SP_OK) {
        return st;
    }
    if (e->pooling == SP_POOLING_RANK) {
        st = sp__model_weight(m, "cls.weight", E, E, false, &e->cls, err, err_len);
        if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
            return st;
        }
        if ((st = sp__model_vector(m, "cls.bias", E, false, &e->cls_b, err, err_len)) != SP_OK ||
            (st = sp__model_weight(m, "cls.output.weight", E, e->n_cls_out, true, &e->cls_out, err,
                                   err_len)) != SP_OK ||
            (st = sp__model_vector(m, "cls.output.bias", e->n_cls_out, false, &e->cls_out_b, err,
                                   err_len)) != SP_OK) {
            return st;
        }
    }

    e->layers = sp_calloc((size_t)hp->n_layer, sizeof *e->layers);
    if (e->layers == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        enc_layer_t *L = &e->layers[il];
#define W(field, nm, n_in, n_out, req)                                                       \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                    \
    st = sp__model_weight(m, name, n_in, n_out, req, &L->field, err, err_len);               \
    if (st != SP_OK && (req || st != SP_ERR_NOT_FOUND))                                      \
        return st;
#define V(field, nm, suffix, n, req)                                                         \
    snprintf(name, sizeof name, "blk.%lld." nm "." suffix, (long long)il);                   \
    if ((st = sp__model_vector(m, name, n, req, &L->field, err, err_len)) != SP_OK)          \
        return st;
        W(wqkv, "attn_qkv", E, 3 * E, false);
        if (L->wqkv.data != NULL) {
            V(bqkv, "attn_qkv", "bias", 3 * E, false);
        } else {
            W(wq, "attn_q", E, E, true);
            W(wk, "attn_k", E, E, true);
            W(wv, "attn_v", E, E, true);
            V(bq, "attn_q", "bias", E, false);
            V(bk, "attn_k", "bias", E, false);
            V(bv, "attn_v", "bias", E, false);
        }
        W(wo, "attn_output", E, E, true);
        V(bo, "attn_output", "bias", E, false);
        V(attn_norm, "attn_output_norm", "weight", E, true);
        V(attn_norm_b, "attn_output_norm", "bias", E, true);
        W(up, "ffn_up", E, F, true);
        V(up_b, "ffn_up", "bias", F, false);
        if (e->arch == ENC_NOMIC) {
            W(gate, "ffn_gate", E, F, true);
        }
        W(down, "ffn_down", F, E, true);
        V(down_b, "ffn_down", "bias", E, false);
        V(out_norm, "layer_output_norm", "weight", E, true);
        V(out_norm_b, "layer_output_norm", "bias", E, true);
#undef W
#undef V
        if (sp_gguf_find_tensor(m->gguf, (snprintf(name, sizeof name, "blk.%lld.ffn_up_exps.weight",
                                                   (long long)il), name)) != NULL) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                           "%s: mixture-of-experts encoder layers are not supported", path);
        }
    }
    for (int64_t i = 0; i < sp_gguf_n_tensors(m->gguf); i++) {
        m->weight_bytes += sp_gguf_tensor(m->gguf, i)->nbytes;
    }
    return SP_OK;
}

/* After the tokenizer is loaded: its [SEP] splits a reranker's pair. */
void
sp__encoder_set_sep(struct sp_encoder *e, int32_t sep)
{
    e->sep = sep;
}

bool
sp_model_is_encoder(const sp_model_t *m)
{
    return m->enc != NULL;
}

sp_pooling_t
sp_model_pooling(const sp_model_t *m)
{
    return m->enc != NULL ? m->enc->pooling : SP_POOLING_MEAN;
}

int64_t
sp_model_n_cls_out(const sp_model_t *m)
{
    return m->enc != NULL && m->enc->pooling == SP_POOLING_RANK ? m->enc->n_cls_out : 0;
}

const char *
sp_pooling_name(sp_pooling_t p)
{
    static const char *const names[] = {"none", "mean", "cls", "last", "rank"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

/* ------------------------------------------------------------------------ */
/* Running                                                                   */
/* ------------------------------------------------------------------------ */

struct sp_enc_run {
    const sp_model_t *m;
    const sp_cpu_kernels_t *k;
    sp_pool_t *pool;
    int64_t n_ctx;      /* most positions */
    int64_t n_pad;      /* n_ctx rounded up to SP_ATTN_BLOCK */
    float *x;           /* (n_ctx, E) the residual stream */
    float *qkv;         /* (n_ctx, 3E): q | k | v of each row */
    float *att;         /* (n_ctx, E) attention output, then projections */
    float *ff_up;       /* (n_ctx, F) */
    float *ff_gate;     /* (n_ctx, F) */
    float *kt;          /* n_head tiles of (n_pad, head_dim), keys transposed per block */
    float *vt;          /* (n_pad, E) values, padding rows zero */
    float *scores;      /* n_threads * scores_stride */
    int64_t scores_stride;
    void *act;          /* converted activations, n_ctx rows of act_stride bytes */
    size_t act_stride;
    int32_t *blocks;    /* 0, 1, 2, ... */
    float *cs;          /* (n_ctx, head_dim) RoPE cos/sin (nomic-bert) */
    float *head;        /* (2E) the classification head's scratch */
    double *sum;        /* (E) mean pooling */
};

typedef struct enc_layout {
    size_t parts[14];
    size_t act_stride;
    int64_t n_pad, scores_stride;
} enc_layout_t;

static int
enc_layout(const sp_model_t *m, int64_t n_ctx, int n_threads, enc_layout_t *L)
{
    const sp_hparams_t *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd, F = (size_t)hp->n_ff, N = (size_t)n_ctx;
    const size_t wide = 3 * E > F ? 3 * E : F;
    L->n_pad = sp_attn_scratch_stride(n_ctx);
    L->scores_stride = sp_attn_scratch_stride(n_ctx);
    /* A converted row is never larger than the F32 row (every activation
     * format packs at most 4 bytes per element), rounded to 64 bytes. */
    L->act_stride = (wide * sizeof(float) + 63) & ~(size_t)63;
    const size_t f = sizeof(float);
    size_t *p = L->parts;
    /* n_ctx <= SP_MAX_CTX and widths <= 2^20: no product overflows size_t. */
    p[0] = N * E * f;                         /* x */
    p[1] = N * 3 * E * f;                     /* qkv */
    p[2] = N * E * f;                         /* att */
    p[3] = N * F * f;                         /* ff_up */
    p[4] = N * F * f;                         /* ff_gate */
    p[5] = (size_t)L->n_pad * E * f;          /* kt */
    p[6] = (size_t)L->n_pad * E * f;          /* vt */
    p[7] = (size_t)n_threads * (size_t)L->scores_stride * f;
    p[8] = N * L->act_stride;                 /* act */
    p[9] = (size_t)(L->n_pad / SP_ATTN_BLOCK) * sizeof(int32_t);
    p[10] = N * (size_t)hp->head_dim * f;     /* cs */
    p[11] = 2 * E * f;                        /* head */
    p[12] = E * sizeof(double);               /* sum */
    p[13] = sizeof(sp_enc_run_t);
    (void)wide;
    return 0;
}

size_t
sp__enc_run_bytes(const sp_model_t *m, int64_t n_ctx, int n_threads)
{
    enc_layout_t L;
    if (n_threads <= 0) {
        n_threads = sp_pool_cpu_count();
    }
    enc_layout(m, n_ctx, n_threads, &L);
    size_t total = 0;
    for (size_t i = 0; i < sizeof L.parts / sizeof L.parts[0]; i++) {
        total += L.parts[i];
    }
    return total;
}

void
sp__enc_run_destroy(sp_enc_run_t *r)
{
    if (r == NULL) {
        return;
    }
    sp_pool_destroy(r->pool);
    sp_free(r->x);
    sp_free(r->qkv);
    sp_free(r->att);
    sp_free(r->ff_up);
    sp_free(r->ff_gate);
    sp_free(r->kt);
    sp_free(r->vt);
    sp_free(r->scores);
    sp_free(r->act);
    sp_free(r->blocks);
    sp_free(r->cs);
    sp_free(r->head);
    sp_free(r->sum);
    sp_free(r);
}

sp_status_t
sp__enc_run_create(const sp_model_t *m, int64_t n_ctx, int n_threads, sp_enc_run_t **out)
{
    *out = NULL;
    sp_enc_run_t *r = sp_calloc(1, sizeof *r);
    if (r == NULL) {
        return SP_ERR_NOMEM;
    }
    r->m = m;
    r->k = sp_cpu_kernels();
    r->n_ctx = n_ctx;
    if (sp_pool_create(n_threads, &r->pool) != SP_OK) {
        sp__enc_run_destroy(r);
        return SP_ERR_NOMEM;
    }
    enc_layout_t L;
    enc_layout(m, n_ctx, sp_pool_n_threads(r->pool), &L);
    r->n_pad = L.n_pad;
    r->scores_stride = L.scores_stride;
    r->act_stride = L.act_stride;
    const size_t *p = L.parts;
    r->x = sp_malloc_aligned(p[0], 64);
    r->qkv = sp_malloc_aligned(p[1], 64);
    r->att = sp_malloc_aligned(p[2], 64);
    r->ff_up = sp_malloc_aligned(p[3], 64);
    r->ff_gate = sp_malloc_aligned(p[4], 64);
    r->kt = sp_malloc_aligned(p[5], 64);
    r->vt = sp_malloc_aligned(p[6], 64);
    r->scores = sp_malloc_aligned(p[7], 64);
    r->act = sp_malloc_aligned(p[8], 64);
    r->blocks = sp_malloc_aligned(p[9], 64);
    r->cs = sp_malloc_aligned(p[10], 64);
    r->head = sp_malloc_aligned(p[11], 64);
    r->sum = sp_malloc_aligned(p[12], 64);
    if (!r->x || !r->qkv || !r->att || !r->ff_up || !r->ff_gate || !r->kt || !r->vt ||
        !r->scores || !r->act || !r->blocks || !r->cs || !r->head || !r->sum) {
        sp__enc_run_destroy(r);
        return SP_ERR_NOMEM;
    }
    /* Padding lanes and rows are read by the attention kernel (and ignored):
     * zero keeps them finite. */
    memset(r->kt, 0, p[5]);
    memset(r->vt, 0, p[6]);
    for (int64_t i = 0; i < r->n_pad / SP_ATTN_BLOCK; i++) {
        r->blocks[i] = (int32_t)i;
    }
    *out = r;
    return SP_OK;
}

const char *
sp__enc_run_kernels_name(const sp_enc_run_t *r)
{
    return r->k->name;
}

/* ---- products ----------------------------------------------------------- */

typedef struct conv_job {
    sp_from_float_fn conv;
    const float *x;
    int64_t n_in, x_stride;
    void *dst;
    size_t dst_stride;
} conv_job_t;

static void
conv_job_run(void *arg, int64_t t, int ith)
{
    conv_job_t *j = arg;
    (void)ith;
    j->conv(j->x + t * j->x_stride, (char *)j->dst + (size_t)t * j->dst_stride, j->n_in);
}

typedef struct prod_job {
    const sp_cpu_kernels_t *k;
    const sp_weight_t *w;
    const float *bias;
    const void *x;
    size_t x_stride;
    int64_t n_tok, chunk;
    float *y;
    int64_t ldy;
} prod_job_t;

static void
prod_job_run(void *arg, int64_t item, int ith)
{
    prod_job_t *j = arg;
    (void)ith;
    const int64_t r0 = item * j->chunk;
    const int64_t r1 = r0 + j->chunk < j->w->n_out ? r0 + j->chunk : j->w->n_out;
    sp_cpu_gemm(j->k, j->w->type, j->w->n_in, j->w->data, j->w->row_bytes, r0, r1, j->x,
                j->x_stride, j->n_tok, j->y, j->ldy);
    if (j->bias != NULL) {
        for (int64_t t = 0; t < j->n_tok; t++) {
            for (int64_t c = r0; c < r1; c++) {
                j->y[t * j->ldy + c] += j->bias[c];
            }
        }
    }
}

/* y[t * ldy + c] = x_t . w_c (+ bias_c) for n rows of x (x_stride floats apart). */
static void
product(sp_enc_run_t *r, const sp_weight_t *w, const float *bias, const float *x,
        int64_t x_stride, int64_t n, float *y, int64_t ldy)
{
    const sp_cpu_kernels_t *k = r->k;
    const sp_type_t at = k->vec_dot_type[w->type];
    const void *xa = x;
    size_t xs = (size_t)x_stride * sizeof(float);
    if (at != SP_TYPE_F32) {
        xs = sp__act_row_stride(at, w->n_in);
        SP_ASSERT(xs <= r->act_stride); /* every format: at most 4 bytes an element */
        conv_job_t cj = {k->from_float[at], x, w->n_in, x_stride, r->act, xs};
        sp_pool_run(r->pool, conv_job_run, &cj, n);
        xa = r->act;
    }
    int64_t chunk = w->n_out / ((int64_t)sp_pool_n_threads(r->pool) * 8);
    chunk = chunk < 16 ? 16 : (chunk + 15) & ~(int64_t)15;
    prod_job_t j = {k, w, bias, xa, xs, n, chunk, y, ldy};
    sp_pool_run(r->pool, prod_job_run, &j, (w->n_out + chunk - 1) / chunk);
}

/* ---- element-wise -------------------------------------------------------- */

/* out = (x - mean) / sqrt(var + eps) * w + b over n elements (double sums). */
static void
layer_norm(float *out, const float *x, const float *w, const float *b, int64_t n, float eps)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
    }
    const double mean = s / (double)n;
    double v = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = x[i] - mean;
        v += d * d;
    }
    const double inv = 1.0 / sqrt(v / (double)n + (double)eps);
    for (int64_t i = 0; i < n; i++) {
        out[i] = (float)(((double)x[i] - mean) * inv) * w[i] + b[i];
    }
}

typedef struct norm_job {
    sp_enc_run_t *r;
    const float *add;  /* (n, E) added to x first, or NULL */
    const float *w, *b;
} norm_job_t;

static void
norm_job_run(void *arg, int64_t t, int ith)
{
    norm_job_t *j = arg;
    const int64_t E = j->r->m->hp.n_embd;
    float *x = j->r->x + t * E;
    (void)ith;
    if (j->add != NULL) {
        for (int64_t i = 0; i < E; i++) {
            x[i] += j->add[t * E + i];
        }
    }
    layer_norm(x, x, j->w, j->b, E, j->r->m->hp.norm_eps);
}

static void
add_norm(sp_enc_run_t *r, const float *add, const float *w, const float *b, int64_t n)
{
    norm_job_t j = {r, add, w, b};
    sp_pool_run(r->pool, norm_job_run, &j, n);
}

typedef struct embd_job {
    sp_enc_run_t *r;
    const int32_t *tokens;
    int64_t type_from;  /* rows >= type_from take type 1 */
} embd_job_t;

static void
add_row(const sp_cpu_kernels_t *k, const sp_weight_t *w, int64_t row, float *dst, float *tmp)
{
    k->to_float[w->type]((const char *)w->data + (size_t)row * w->row_bytes, tmp, w->n_in);
    for (int64_t i = 0; i < w->n_in; i++) {
        dst[i] += tmp[i];
    }
}

static void
embd_job_run(void *arg, int64_t t, int ith)
{
    embd_job_t *j = arg;
    sp_enc_run_t *r = j->r;
    const sp_model_t *m = r->m;
    const sp_encoder_t *e = m->enc;
    const int64_t E = m->hp.n_embd;
    float *x = r->x + t * E;
    /* The thread's score row is free here: a conversion scratch of E floats
     * (scores_stride >= E is not guaranteed, so use the row's own att slot). */
    float *tmp = r->att + t * E;
    (void)ith;
    r->k->to_float[m->tok_embd.type]((const char *)m->tok_embd.data +
                                         (size_t)j->tokens[t] * m->tok_embd.row_bytes,
                                     x, E);
    if (e->type_embd.data != NULL) {
        add_row(r->k, &e->type_embd, t >= j->type_from ? 1 : 0, x, tmp);
    }
    if (e->pos_embd.data != NULL) {
        add_row(r->k, &e->pos_embd, t, x, tmp);
    }
    layer_norm(x, x, e->embd_norm, e->embd_norm_b, E, m->hp.norm_eps);
    if (e->arch == ENC_NOMIC) {
        /* NeoX RoPE cos/sin of position t: theta_i = t * base^(-2i / n_rot). */
        const int64_t half = m->hp.n_rot / 2;
        float *cs = r->cs + t * m->hp.head_dim;
        for (int64_t i = 0; i < half; i++) {
            const double f = pow((double)m->hp.rope_base, -2.0 * (double)i / (double)m->hp.n_rot);
            const double th = (double)t * f;
            cs[2 * i] = (float)cos(th);
            cs[2 * i + 1] = (float)sin(th);
        }
    }
}

/* Per head h: RoPE (nomic-bert) of every row's q and k, then k into h's
 * transposed tiles and v into the value rows. */
typedef struct kv_job {
    sp_enc_run_t *r;
    int64_t n;
} kv_job_t;

static void
rope_head(float *v, int64_t n_rot, const float *cs)
{
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
    }
}

static void
kv_job_run(void *arg, int64_t h, int ith)
{
    kv_job_t *j = arg;
    sp_enc_run_t *r = j->r;
    const sp_hparams_t *hp = &r->m->hp;
    const int64_t E = hp->n_embd, hd = hp->head_dim;
    float *kt = r->kt + h * r->n_pad * hd;
    (void)ith;
    for (int64_t t = 0; t < j->n; t++) {
        float *q = r->qkv + t * 3 * E + h * hd;
        float *k = q + E;
        const float *v = q + 2 * E;
        if (r->m->enc->arch == ENC_NOMIC) {
            rope_head(q, hp->n_rot, r->cs + t * hd);
            rope_head(k, hp->n_rot, r->cs + t * hd);
        }
        for (int64_t d = 0; d < hd; d++) {
            kt[sp_attn_k_index(t, d, hd)] = k[d];
        }
        memcpy(r->vt + t * E + h * hd, v, (size_t)hd * sizeof(float));
    }
}

typedef struct att_job {
    sp_enc_run_t *r;
    int64_t n;
    float scale;
} att_job_t;

/* Item = (row t, head h): row t's head h over all n positions. */
static void
att_job_run(void *arg, int64_t item, int ith)
{
    att_job_t *j = arg;
    sp_enc_run_t *r = j->r;
    const sp_hparams_t *hp = &r->m->hp;
    const int64_t E = hp->n_embd, hd = hp->head_dim;
    const int64_t t = item / hp->n_head, h = item % hp->n_head;
    sp_attn_args_t a = {
        .head_dim = hd,
        .n_q = 1,
        .n_kv = j->n,
        .q = r->qkv + t * 3 * E + h * hd,
        .q_stride = hd,
        .k = r->kt + h * r->n_pad * hd,
        .v = r->vt + h * hd,
        .blocks = r->blocks,
        .k_block_stride = SP_ATTN_BLOCK * hd,
        .v_block_stride = SP_ATTN_BLOCK * E,
        .v_stride = E,
        .scale = j->scale,
        .o = r->att + t * E + h * hd,
        .o_stride = hd,
        .scratch = r->scores + (int64_t)ith * r->scores_stride,
    };
    r->k->attn[SP_TYPE_F32](&a);
}

typedef struct ffn_job {
    sp_enc_run_t *r;
    int64_t n;
    bool swiglu;
} ffn_job_t;

/* Row t's activation: GELU(up) in place (bert) or SiLU(gate) * up into gate. */
static void
ffn_job_run(void *arg, int64_t t, int ith)
{
    ffn_job_t *j = arg;
    const int64_t F = j->r->m->hp.n_ff;
    (void)ith;
    if (j->swiglu) {
        j->r->k->swiglu(j->r->ff_gate + t * F, j->r->ff_up + t * F, F);
        return;
    }
    float *u = j->r->ff_up + t * F;
    for (int64_t i = 0; i < F; i++) {
        u[i] = 0.5f * u[i] * (1.0f + erff(u[i] * 0.70710678118654752f));
    }
}

sp_status_t
sp__enc_run_embed(sp_enc_run_t *r, const int32_t *tokens, int64_t n, float *out)
{
    const sp_model_t *m = r->m;
    const sp_encoder_t *e = m->enc;
    const sp_hparams_t *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    if (tokens == NULL || out == NULL || n <= 0 || n > r->n_ctx) {
        return SP_ERR_INVALID;
    }
    if (e->pos_embd.data != NULL && n > hp->n_ctx_train) {
        return SP_ERR_INVALID; /* no position embedding past the trained length */
    }
    if (e->pooling == SP_POOLING_NONE) {
        return SP_ERR_UNSUPPORTED;
    }
    int64_t type_from = n;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            return SP_ERR_INVALID;
        }
        if (type_from == n && e->pooling == SP_POOLING_RANK && e->n_types >= 2 && e->sep >= 0 &&
            tokens[i] == e->sep) {
            type_from = i + 1;
        }
    }
    embd_job_t ej = {r, tokens, type_from};
    sp_pool_run(r->pool, embd_job_run, &ej, n);

    const float scale = (float)(1.0 / sqrt((double)hp->head_dim));
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const enc_layer_t *L = &e->layers[il];
        if (L->wqkv.data != NULL) {
            product(r, &L->wqkv, L->bqkv, r->x, E, n, r->qkv, 3 * E);
        } else {
            product(r, &L->wq, L->bq, r->x, E, n, r->qkv, 3 * E);
            product(r, &L->wk, L->bk, r->x, E, n, r->qkv + E, 3 * E);
            product(r, &L->wv, L->bv, r->x, E, n, r->qkv + 2 * E, 3 * E);
        }
        kv_job_t kj = {r, n};
        sp_pool_run(r->pool, kv_job_run, &kj, hp->n_head);
        att_job_t aj = {r, n, scale};
        sp_pool_run(r->pool, att_job_run, &aj, n * hp->n_head);
        /* The projection reads att and writes qkv's first E columns (free now). */
        product(r, &L->wo, L->bo, r->att, E, n, r->qkv, 3 * E);
        /* add_norm reads its addend densely: move the projection into att. */
        for (int64_t t = 0; t < n; t++) {
            memcpy(r->att + t * E, r->qkv + t * 3 * E, (size_t)E * sizeof(float));
        }
        add_norm(r, r->att, L->attn_norm, L->attn_norm_b, n);

        product(r, &L->up, L->up_b, r->x, E, n, r->ff_up, F);
        const float *hidden = r->ff_up;
        if (e->arch == ENC_NOMIC) {
            product(r, &L->gate, NULL, r->x, E, n, r->ff_gate, F);
            hidden = r->ff_gate;
        }
        ffn_job_t fj = {r, n, e->arch == ENC_NOMIC};
        sp_pool_run(r->pool, ffn_job_run, &fj, n);
        product(r, &L->down, L->down_b, hidden, F, n, r->att, E);
        add_norm(r, r->att, L->out_norm, L->out_norm_b, n);
    }

    const float *row = NULL;
    switch (e->pooling) {
    case SP_POOLING_CLS:
    case SP_POOLING_RANK:
        row = r->x;
        break;
    case SP_POOLING_LAST:
        row = r->x + (n - 1) * E;
        break;
    case SP_POOLING_MEAN:
        memset(r->sum, 0, (size_t)E * sizeof(double));
        for (int64_t t = 0; t < n; t++) { /* in position order: fixed bits */
            for (int64_t i = 0; i < E; i++) {
                r->sum[i] += r->x[t * E + i];
            }
        }
        break;
    case SP_POOLING_NONE:
        SP_ASSERT(0);
        break;
    }
    if (e->pooling == SP_POOLING_RANK) {
        const float *h = row;
        if (e->cls.data != NULL) {
            product(r, &e->cls, e->cls_b, row, E, 1, r->head, E);
            for (int64_t i = 0; i < E; i++) {
                r->head[i] = tanhf(r->head[i]);
            }
            h = r->head;
        }
        product(r, &e->cls_out, e->cls_out_b, h, E, 1, r->head + E, e->n_cls_out);
        memset(out, 0, (size_t)E * sizeof(float));
        memcpy(out, r->head + E, (size_t)e->n_cls_out * sizeof(float));
        return SP_OK;
    }
    double ss = 0.0;
    for (int64_t i = 0; i < E; i++) {
        const double v = row != NULL ? (double)row[i] : r->sum[i] / (double)n;
        r->sum[i] = v;
        ss += v * v;
    }
    /* As for generative models: unit length; an all-zero vector stays zero. */
    const double inv = ss > 0.0 ? 1.0 / sqrt(ss) : 0.0;
    for (int64_t i = 0; i < E; i++) {
        out[i] = (float)(r->sum[i] * inv);
    }
    return SP_OK;
}
