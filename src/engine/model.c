/*
 * model.c - loading a llama-family GGUF model and running its forward pass.
 *
 * Load: read hyper-parameters from `<arch>.*` keys, check them (RELIABILITY.md
 * G17: layer and head counts, divisibility) before sizing anything, then find
 * every tensor and check its shape and type against them. Weights stay in the
 * read-only mapping; the model only keeps typed pointers (llama2.c's
 * memory_map_weights, with the checks it lacked).
 *
 * Forward: a batch of B tokens is a B x n_embd matrix. Every projection is one
 * matrix product over all B rows (prefill), split by weight rows across the
 * thread pool; projections that read the same input (q/k/v, gate/up) run as
 * one job so a decode step pays few pool wake-ups. Activations are converted
 * once per product to the weight type's dot-product format (Q8_0, Q8_K or F32).
 *
 * Batch invariance: each output element is one vec_dot over one weight row and
 * one activation row (the kernel contract), attention for a token reads only
 * its own row and the cache, and every reduction runs in a fixed order. So a
 * position's logits are bit-identical whether it was computed in a prefill
 * batch, a decode step, or with any thread count.
 */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/pool.h"
#include "kernels/kernels.h"

#define MAX_HEADS 4096
#define MAX_CTX (1 << 24)
#define DEFAULT_CTX_CAP 4096

/* A weight matrix: n_out rows of n_in elements, row-major in the mapping. */
typedef struct weight {
    const void *data;
    sp_type_t type;
    int64_t n_in;      /* ne[0] */
    int64_t n_out;     /* ne[1] */
    size_t row_bytes;
} weight_t;

typedef struct layer {
    const float *attn_norm; /* (n_embd) */
    weight_t wq;            /* (n_head * head_dim, n_embd) */
    weight_t wk;            /* (n_head_kv * head_dim, n_embd) */
    weight_t wv;            /* (n_head_kv * head_dim, n_embd) */
    weight_t wo;            /* (n_embd, n_head * head_dim) */
    const float *bq, *bk, *bv; /* biases (qwen2) or NULL */
    const float *ffn_norm;  /* (n_embd) */
    weight_t w_gate;        /* (n_ff, n_embd) */
    weight_t w_up;          /* (n_ff, n_embd) */
    weight_t w_down;        /* (n_embd, n_ff) */
} layer_t;

struct sp_model {
    sp_gguf_t *gguf;
    sp_hparams_t hp;
    sp_tokenizer_t *tok;
    weight_t tok_embd;         /* (n_vocab, n_embd) */
    weight_t output;           /* (n_vocab, n_embd); == tok_embd when tied */
    const float *output_norm;  /* (n_embd) */
    const float *rope_freqs;   /* (n_rot / 2) frequency divisors (Llama 3) or NULL */
    layer_t *layers;           /* (n_layer) */
    size_t weight_bytes;
};

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct arch_info {
    const char *name;
    sp_rope_type_t rope_type;
} arch_info_t;

static const arch_info_t archs[] = {
    {"llama", SP_ROPE_NORMAL},
    {"mistral", SP_ROPE_NORMAL},
    {"qwen2", SP_ROPE_NEOX},
};

/* Read an integer hyper-parameter `<arch>.<suffix>`; dflt < 0 means required. */
static sp_status_t
get_hp_int(const sp_gguf_t *g, const char *arch, const char *suffix, int64_t dflt, int64_t lo,
           int64_t hi, int64_t *out, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    sp_status_t st = sp_gguf_get_int(g, key, out, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        if (dflt < 0) {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s'",
                           sp_gguf_path(g), key);
        }
        *out = dflt;
    } else if (st != SP_OK) {
        return st;
    }
    if (*out < lo || *out > hi) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: key '%s' = %lld out of range [%lld, %lld]", sp_gguf_path(g), key,
                       (long long)*out, (long long)lo, (long long)hi);
    }
    return SP_OK;
}

static sp_status_t
get_hp_float(const sp_gguf_t *g, const char *arch, const char *suffix, double dflt, double lo,
             double hi, float *out, char *err, size_t err_len)
{
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    sp_status_t st = sp_gguf_get_float(g, key, &v, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        v = dflt;
    } else if (st != SP_OK) {
        return st;
    }
    if (!isfinite(v) || v < lo || v > hi) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s' = %g out of range [%g, %g]",
                       sp_gguf_path(g), key, v, lo, hi);
    }
    *out = (float)v;
    return SP_OK;
}

static sp_status_t
load_hparams(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    sp_str_t arch;
    sp_status_t st;

    memset(hp, 0, sizeof *hp);
    st = sp_gguf_get_str(g, "general.architecture", &arch, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing 'general.architecture'", path);
    }
    if (st != SP_OK) {
        return st;
    }
    const arch_info_t *ai = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        if (sp_str_eq_c(arch, archs[i].name)) {
            ai = &archs[i];
        }
    }
    if (ai == NULL) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: general.architecture '%.*s' is not supported (llama, mistral, qwen2)",
                       path, (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    }
    snprintf(hp->arch, sizeof hp->arch, "%s", ai->name);
    hp->rope_type = ai->rope_type;

#define HP_INT(field, suffix, dflt, lo, hi)                                             \
    do {                                                                                \
        st = get_hp_int(g, hp->arch, suffix, dflt, lo, hi, &hp->field, err, err_len);   \
        if (st != SP_OK) return st;                                                     \
    } while (0)

    HP_INT(n_embd, "embedding_length", -1, 1, 1 << 20);
    HP_INT(n_layer, "block_count", -1, 1, SP_MAX_LAYERS);
    HP_INT(n_head, "attention.head_count", -1, 1, MAX_HEADS);
    HP_INT(n_head_kv, "attention.head_count_kv", hp->n_head, 1, hp->n_head);
    HP_INT(n_ff, "feed_forward_length", -1, 1, 1 << 22);
    HP_INT(n_ctx_train, "context_length", -1, 1, MAX_CTX);
    if (hp->n_head % hp->n_head_kv != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: attention.head_count (%lld) is not a multiple of head_count_kv (%lld)",
                       path, (long long)hp->n_head, (long long)hp->n_head_kv);
    }
    /* Without an explicit key_length, heads must split the width evenly. */
    char kl_key[96];
    snprintf(kl_key, sizeof kl_key, "%s.attention.key_length", hp->arch);
    if (hp->n_embd % hp->n_head != 0 && sp_gguf_find_key(g, kl_key) < 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: embedding_length (%lld) is not a multiple of head_count (%lld)", path,
                       (long long)hp->n_embd, (long long)hp->n_head);
    }
    HP_INT(head_dim, "attention.key_length", hp->n_embd / hp->n_head, 2, 1 << 14);
    int64_t v_len;
    st = get_hp_int(g, hp->arch, "attention.value_length", hp->head_dim, 1, 1 << 14, &v_len, err,
                    err_len);
    if (st != SP_OK) {
        return st;
    }
    if (v_len != hp->head_dim) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: attention.value_length %lld != key_length %lld is not supported", path,
                       (long long)v_len, (long long)hp->head_dim);
    }
    HP_INT(n_rot, "rope.dimension_count", hp->head_dim, 2, hp->head_dim);
    if (hp->n_rot % 2 != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: rope.dimension_count %lld is odd", path,
                       (long long)hp->n_rot);
    }
#undef HP_INT
    st = get_hp_float(g, hp->arch, "attention.layer_norm_rms_epsilon", 1e-5, 0, 1, &hp->norm_eps,
                      err, err_len);
    if (st == SP_OK) {
        st = get_hp_float(g, hp->arch, "rope.freq_base", 10000.0, 1e-3, 1e12, &hp->rope_base, err,
                          err_len);
    }
    if (st != SP_OK) {
        return st;
    }

    /* RoPE scaling: only linear (position interpolation) changes our math. */
    char key[128];
    sp_str_t stype = {0};
    hp->rope_scale = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    st = sp_gguf_get_str(g, key, &stype, err, err_len);
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
        return st;
    }
    bool linear = st == SP_OK && sp_str_eq_c(stype, "linear");
    if (st == SP_OK && !linear && !sp_str_eq_c(stype, "none")) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: %s '%.*s' is not supported (none, linear)", path, key,
                       (int)(stype.len > 32 ? 32 : stype.len), stype.ptr);
    }
    if (linear || st == SP_ERR_NOT_FOUND) {
        /* Older files carry only rope.scale_linear. */
        const char *suffix = linear ? "rope.scaling.factor" : "rope.scale_linear";
        st = get_hp_float(g, hp->arch, suffix, 1.0, 1e-3, 1e6, &hp->rope_scale, err, err_len);
        if (st != SP_OK) {
            return st;
        }
        if (hp->rope_scale == 0.0f) {
            hp->rope_scale = 1.0f;
        }
    }
    return SP_OK;
}

/* Find a tensor and check it is a (n_out x n_in) matrix of a computable type. */
static sp_status_t
get_weight(const sp_model_t *m, const char *name, int64_t n_in, int64_t n_out, bool required,
           weight_t *w, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(m->gguf);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(m->gguf, name);
    memset(w, 0, sizeof *w);
    if (t == NULL) {
        return required ? sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor '%s'", path, name)
                        : SP_ERR_NOT_FOUND;
    }
    int64_t ne2 = t->n_dims > 2 ? t->ne[2] * t->ne[3] : 1;
    if (t->ne[0] != n_in || t->ne[1] != n_out || ne2 != 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld]", path,
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)ne2,
                       (long long)n_in, (long long)n_out);
    }
    const sp_type_traits_t *tr = sp_type_traits(t->type);
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    if (tr == NULL || !tr->supported || k->vec_dot[t->type] == NULL) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has type %s, which the engine cannot compute with "
                       "(f32 f16 bf16 q8_0 q4_0 q4_k q6_k)", path, name, sp_type_name(t->type));
    }
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = sp_row_size(t->type, n_in);
    return SP_OK;
}

/* A 1-D F32 vector of n elements (norm weights, biases). */
static sp_status_t
get_vector(const sp_model_t *m, const char *name, int64_t n, bool required, const float **out,
           char *err, size_t err_len)
{
    const char *path = sp_gguf_path(m->gguf);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(m->gguf, name);
    *out = NULL;
    if (t == NULL) {
        return required ? sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor '%s'", path, name)
                        : SP_OK;
    }
    if (t->type != SP_TYPE_F32 || t->ne[0] != n || t->ne[1] * t->ne[2] * t->ne[3] != 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s' must be f32 [%lld], found %s [%lld, %lld]", path, name,
                       (long long)n, sp_type_name(t->type), (long long)t->ne[0],
                       (long long)t->ne[1]);
    }
    if (((uintptr_t)t->data & 3) != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tensor '%s' data is misaligned", path,
                       name);
    }
    *out = t->data;
    return SP_OK;
}

static sp_status_t
load_weights(sp_model_t *m, char *err, size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    const int64_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const char *path = sp_gguf_path(m->gguf);
    sp_status_t st;
    char name[96];

    const sp_gguf_tensor_t *te = sp_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (te == NULL) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'", path);
    }
    m->hp.n_vocab = te->ne[1];
    if (m->hp.n_vocab < 1 || m->hp.n_vocab > (1 << 24)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: token_embd.weight vocabulary %lld out of range",
                       path, (long long)m->hp.n_vocab);
    }
    st = get_weight(m, "token_embd.weight", hp->n_embd, hp->n_vocab, true, &m->tok_embd, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    st = get_weight(m, "output.weight", hp->n_embd, hp->n_vocab, false, &m->output, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        m->output = m->tok_embd;
        m->hp.tied_output = true;
    } else if (st != SP_OK) {
        return st;
    }
    st = get_vector(m, "output_norm.weight", hp->n_embd, true, &m->output_norm, err, err_len);
    if (st == SP_OK) {
        st = get_vector(m, "rope_freqs.weight", hp->n_rot / 2, false, &m->rope_freqs, err, err_len);
    }
    if (st != SP_OK) {
        return st;
    }

    m->layers = sp_calloc((size_t)hp->n_layer, sizeof(layer_t));
    if (m->layers == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        layer_t *L = &m->layers[il];
#define W(field, nm, n_in, n_out)                                                        \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                \
    if ((st = get_weight(m, name, n_in, n_out, true, &L->field, err, err_len)) != SP_OK) \
        return st;
#define V(field, nm, suffix, n, req)                                                     \
    snprintf(name, sizeof name, "blk.%lld." nm "." suffix, (long long)il);               \
    if ((st = get_vector(m, name, n, req, &L->field, err, err_len)) != SP_OK)            \
        return st;
        V(attn_norm, "attn_norm", "weight", hp->n_embd, true);
        W(wq, "attn_q", hp->n_embd, q_dim);
        W(wk, "attn_k", hp->n_embd, kv_dim);
        W(wv, "attn_v", hp->n_embd, kv_dim);
        W(wo, "attn_output", q_dim, hp->n_embd);
        V(bq, "attn_q", "bias", q_dim, false);
        V(bk, "attn_k", "bias", kv_dim, false);
        V(bv, "attn_v", "bias", kv_dim, false);
        V(ffn_norm, "ffn_norm", "weight", hp->n_embd, true);
        W(w_gate, "ffn_gate", hp->n_embd, hp->n_ff);
        W(w_up, "ffn_up", hp->n_embd, hp->n_ff);
        W(w_down, "ffn_down", hp->n_ff, hp->n_embd);
#undef W
#undef V
    }
    for (int64_t i = 0; i < sp_gguf_n_tensors(m->gguf); i++) {
        m->weight_bytes += sp_gguf_tensor(m->gguf, i)->nbytes;
    }
    return SP_OK;
}

sp_status_t
sp_model_load_gguf(sp_gguf_t *g, sp_model_t **out, char *err, size_t err_len)
{
    sp_status_t st;
    *out = NULL;
    sp_model_t *m = sp_calloc(1, sizeof *m);
    if (m == NULL) {
        sp_gguf_close(g);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    m->gguf = g;
    if ((st = load_hparams(g, &m->hp, err, err_len)) != SP_OK ||
        (st = load_weights(m, err, err_len)) != SP_OK ||
        (st = sp_tokenizer_from_gguf(g, &m->tok, err, err_len)) != SP_OK) {
        goto fail;
    }
    sp_gguf_prefault(g);
    if (sp_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        st = sp_errf(err, err_len, SP_ERR_FORMAT,
                     "%s: tokenizer has %d tokens but token_embd.weight only %lld rows",
                     sp_gguf_path(g), sp_tokenizer_n_vocab(m->tok), (long long)m->hp.n_vocab);
        goto fail;
    }
    *out = m;
    return SP_OK;
fail:
    sp_model_free(m);
    return st;
}

sp_status_t
sp_model_load(const char *path, sp_model_t **out, char *err, size_t err_len)
{
    sp_gguf_t *g;
    *out = NULL;
    sp_status_t st = sp_gguf_open(path, &g, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    return sp_model_load_gguf(g, out, err, err_len);
}

void
sp_model_free(sp_model_t *m)
{
    if (m == NULL) {
        return;
    }
    sp_tokenizer_destroy(m->tok);
    sp_free(m->layers);
    sp_gguf_close(m->gguf);
    sp_free(m);
}

const sp_hparams_t *
sp_model_hparams(const sp_model_t *m)
{
    return &m->hp;
}

const sp_tokenizer_t *
sp_model_tokenizer(const sp_model_t *m)
{
    return m->tok;
}

const sp_gguf_t *
sp_model_gguf(const sp_model_t *m)
{
    return m->gguf;
}

size_t
sp_model_weight_bytes(const sp_model_t *m)
{
    return m->weight_bytes;
}

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

struct sp_ctx {
    const sp_model_t *m;
    const sp_cpu_kernels_t *k;
    sp_pool_t *pool;
    int64_t n_ctx;
    int64_t n_batch;
    bool logits_all;

    /* KV cache of kv_type (F32 or F16), one region of n_ctx_pad positions per
     * (layer, KV head), so attention streams contiguous memory instead of
     * striding over the other heads' rows. Values are rows of head_dim; keys
     * are blocks of SP_ATTN_BLOCK positions stored transposed (kernels.h). */
    void *k_cache;
    void *v_cache;
    int64_t n_ctx_pad; /* n_ctx rounded up to whole key blocks */
    sp_type_t kv_type;
    size_t kv_elt;     /* bytes per cache element */

    /* activations, n_batch rows each */
    float *x;          /* (n_batch, n_embd) residual stream */
    float *xn;         /* (n_batch, n_embd) normalised input of a sub-layer */
    float *q;          /* (n_batch, n_head * head_dim) */
    float *kv_k;       /* (n_batch, n_head_kv * head_dim) */
    float *kv_v;       /* (n_batch, n_head_kv * head_dim) */
    float *att;        /* (n_batch, n_head * head_dim) attention output */
    float *ff_gate;    /* (n_batch, n_ff) */
    float *ff_up;      /* (n_batch, n_ff) */
    float *proj;       /* (n_batch, n_embd) output of wo / w_down */
    void *act;         /* (n_batch, act_stride) activations in the dot-product format */
    size_t act_stride; /* bytes per row of act */
    float *scores;     /* (n_threads, scores_stride) attention scratch */
    int64_t scores_stride;
    float attn_scale;  /* 1 / sqrt(head_dim) */
    float *rope_cs;    /* (n_batch, n_rot) cos/sin pairs per position */
    float *inv_freq;   /* (n_rot / 2) */
    float *logits;     /* (n_vocab), or (n_ctx, n_vocab) with logits_all */
    double *embd_sum;  /* (n_embd) sp_ctx_embed's pooled sum */
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
    sp_pool_destroy(c->pool);
    sp_free(c->k_cache);
    sp_free(c->v_cache);
    sp_free(c->x);
    sp_free(c->xn);
    sp_free(c->q);
    sp_free(c->kv_k);
    sp_free(c->kv_v);
    sp_free(c->att);
    sp_free(c->ff_gate);
    sp_free(c->ff_up);
    sp_free(c->proj);
    sp_free(c->act);
    sp_free(c->scores);
    sp_free(c->rope_cs);
    sp_free(c->inv_freq);
    sp_free(c->logits);
    sp_free(c->embd_sum);
    sp_free(c);
}

/* Allocate rows x cols elements of elt bytes, 64-byte aligned; NULL on
 * overflow or OOM. */
static void *
alloc_rows(int64_t rows, int64_t cols, size_t elt)
{
    size_t n, bytes;
    if (sp_mul_size((size_t)rows, (size_t)cols, &n) != 0 || sp_mul_size(n, elt, &bytes) != 0) {
        return NULL;
    }
    return sp_malloc_aligned(bytes, 64);
}

static float *
alloc_f32(int64_t rows, int64_t cols)
{
    return alloc_rows(rows, cols, sizeof(float));
}

sp_status_t
sp_ctx_create(const sp_model_t *m, const sp_ctx_params_t *p, sp_ctx_t **out, char *err,
              size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    sp_ctx_t *c;
    sp_status_t st;

    *out = NULL;
    if (p->n_ctx < 0 || p->n_ctx > MAX_CTX || p->n_batch < 0 || p->n_batch > 65536) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "context size %lld or batch %lld out of range",
                       (long long)p->n_ctx, (long long)p->n_batch);
    }
    c = sp_calloc(1, sizeof *c);
    if (c == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    c->m = m;
    c->k = sp_cpu_kernels();
    c->n_ctx = p->n_ctx > 0 ? p->n_ctx
                            : (hp->n_ctx_train < DEFAULT_CTX_CAP ? hp->n_ctx_train : DEFAULT_CTX_CAP);
    c->n_batch = p->n_batch > 0 ? p->n_batch : 512;
    if (c->n_batch > c->n_ctx) {
        c->n_batch = c->n_ctx;
    }
    c->logits_all = p->logits_all;
    if ((st = sp_pool_create(p->n_threads, &c->pool)) != SP_OK) {
        goto oom;
    }

    const int64_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const int64_t B = c->n_batch;
    int64_t max_in = hp->n_embd;
    if (hp->n_ff > max_in) max_in = hp->n_ff;
    if (q_dim > max_in) max_in = q_dim;
    /* Every dot-product format takes at most 4 bytes per element (F32). */
    c->act_stride = ((size_t)max_in * 4 + 63) & ~(size_t)63;

    c->kv_type = p->kv_f16 ? SP_TYPE_F16 : SP_TYPE_F32;
    c->kv_elt = p->kv_f16 ? sizeof(sp_fp16_t) : sizeof(float);
    c->n_ctx_pad = sp_attn_scratch_stride(c->n_ctx);
    c->k_cache = alloc_rows(hp->n_layer * c->n_ctx_pad, kv_dim, c->kv_elt);
    c->v_cache = alloc_rows(hp->n_layer * c->n_ctx_pad, kv_dim, c->kv_elt);
    c->x = alloc_f32(B, hp->n_embd);
    c->xn = alloc_f32(B, hp->n_embd);
    c->q = alloc_f32(B, q_dim);
    c->kv_k = alloc_f32(B, kv_dim);
    c->kv_v = alloc_f32(B, kv_dim);
    c->att = alloc_f32(B, q_dim);
    c->ff_gate = alloc_f32(B, hp->n_ff);
    c->ff_up = alloc_f32(B, hp->n_ff);
    c->proj = alloc_f32(B, hp->n_embd);
    c->act = alloc_f32(B, (int64_t)c->act_stride / 4);
    /* Scores of one (token, KV head) item: every query head of the group. */
    c->scores_stride = hp->n_head / hp->n_head_kv * sp_attn_scratch_stride(c->n_ctx);
    c->scores = alloc_f32(sp_pool_n_threads(c->pool), c->scores_stride);
    c->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    c->rope_cs = alloc_f32(B, hp->n_rot);
    c->inv_freq = alloc_f32(1, hp->n_rot / 2);
    c->logits = alloc_f32(c->logits_all ? c->n_ctx : 1, hp->n_vocab);
    c->embd_sum = sp_calloc((size_t)hp->n_embd, sizeof(double));
    if (!c->k_cache || !c->v_cache || !c->x || !c->xn || !c->q || !c->kv_k || !c->kv_v || !c->att ||
        !c->ff_gate || !c->ff_up || !c->proj || !c->act || !c->scores || !c->rope_cs ||
        !c->inv_freq || !c->logits || !c->embd_sum) {
        goto oom;
    }
    /* theta_i = pos / scale * base^(-2i / n_rot) / freq_factor_i, in double
     * so the table does not depend on float rounding of the power. */
    for (int64_t i = 0; i < hp->n_rot / 2; i++) {
        double f = pow((double)hp->rope_base, -2.0 * (double)i / (double)hp->n_rot);
        if (m->rope_freqs != NULL) {
            f /= m->rope_freqs[i];
        }
        c->inv_freq[i] = (float)(f / hp->rope_scale);
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
    return c->k->name;
}

const float *
sp_ctx_logits(const sp_ctx_t *c)
{
    return c->logits_all ? NULL : c->logits;
}

const float *
sp_ctx_logits_all(const sp_ctx_t *c)
{
    return c->logits_all ? c->logits : NULL;
}

/* ------------------------------------------------------------------------ */
/* Parallel jobs                                                             */
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
    const weight_t *w[3];
    float *y[3];
    const float *bias[3];
    const void *x;
    size_t x_stride;
    int64_t n_tok;
    int64_t chunk;            /* rows per work item */
    int64_t n_chunks[3];
    int64_t total_chunks;
} mm_job_t;

static void
mm_job_run(void *arg, int64_t item, int ith)
{
    mm_job_t *j = arg;
    int wi = 0;
    (void)ith;
    while (item >= j->n_chunks[wi]) {
        item -= j->n_chunks[wi++];
    }
    const weight_t *w = j->w[wi];
    const int64_t r0 = item * j->chunk;
    const int64_t r1 = r0 + j->chunk < w->n_out ? r0 + j->chunk : w->n_out;
    sp_cpu_gemm(j->k, w->type, w->n_in, w->data, w->row_bytes, r0, r1, j->x, j->x_stride, j->n_tok,
                j->y[wi], w->n_out);
    if (j->bias[wi] != NULL) {
        for (int64_t t = 0; t < j->n_tok; t++) {
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
 */
static void
matmul(sp_ctx_t *c, int n_w, const weight_t *const *w, float *const *y, const float *const *bias,
       const float *x, int64_t x_stride, int64_t n_tok)
{
    const sp_cpu_kernels_t *k = c->k;
    sp_type_t act_type = k->vec_dot_type[w[0]->type];
    for (int i = 1; i < n_w; i++) {
        if (k->vec_dot_type[w[i]->type] != act_type) { /* mixed formats: one at a time */
            for (int jj = 0; jj < n_w; jj++) {
                matmul(c, 1, &w[jj], &y[jj], &bias[jj], x, x_stride, n_tok);
            }
            return;
        }
    }

    const void *xa = x;
    size_t xa_stride = (size_t)x_stride * sizeof(float);
    if (act_type != SP_TYPE_F32) {
        act_job_t aj = {k->from_float[act_type], x, w[0]->n_in, x_stride, c->act, c->act_stride, n_tok};
        sp_pool_run(c->pool, act_job_run, &aj, n_tok);
        xa = c->act;
        xa_stride = c->act_stride;
    }

    mm_job_t j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.n_w = n_w;
    j.x = xa;
    j.x_stride = xa_stride;
    j.n_tok = n_tok;
    int nth = sp_pool_n_threads(c->pool);
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) {
        rows += w[i]->n_out;
    }
    /* About 8 items per thread balances load; at least 16 rows per item keeps
     * tiles full. Any split gives the same bits (kernel contract). */
    int64_t chunk = rows / ((int64_t)nth * 8);
    chunk = chunk < 16 ? 16 : (chunk + 15) & ~(int64_t)15;
    j.chunk = chunk;
    for (int i = 0; i < n_w; i++) {
        j.w[i] = w[i];
        j.y[i] = y[i];
        j.bias[i] = bias[i];
        j.n_chunks[i] = (w[i]->n_out + chunk - 1) / chunk;
        j.total_chunks += j.n_chunks[i];
    }
    sp_pool_run(c->pool, mm_job_run, &j, j.total_chunks);
}

static void
matmul1(sp_ctx_t *c, const weight_t *w, float *y, const float *x, int64_t x_stride, int64_t n_tok)
{
    const weight_t *ws[1] = {w};
    float *ys[1] = {y};
    const float *bs[1] = {NULL};
    matmul(c, 1, ws, ys, bs, x, x_stride, n_tok);
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
            int64_t b = type == SP_ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

/* Embedding rows of the batch, converted to F32, and the RoPE cos/sin of each
 * position (shared by all layers), one token per chunk. */
typedef struct embed_job {
    sp_ctx_t *c;
    const int32_t *tokens;
    int64_t pos0;
} embed_job_t;

static void
embed_job_run(void *arg, int64_t t, int ith)
{
    embed_job_t *j = arg;
    sp_ctx_t *c = j->c;
    const sp_model_t *m = c->m;
    const sp_hparams_t *hp = &m->hp;
    (void)ith;
    c->k->to_float[m->tok_embd.type]((const char *)m->tok_embd.data +
                                         (size_t)j->tokens[t] * m->tok_embd.row_bytes,
                                     c->x + t * hp->n_embd, hp->n_embd);
    float *cs = c->rope_cs + t * hp->n_rot;
    for (int64_t i = 0; i < hp->n_rot / 2; i++) {
        double theta = (double)(j->pos0 + t) * (double)c->inv_freq[i];
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

/* Per row t: x += proj (when add), then xn = RMSNorm(x) * w (when w). The
 * residual add and the next sub-layer's norm share one pass over the row. */
typedef struct add_norm_job {
    sp_ctx_t *c;
    bool add;
    const float *w;
} add_norm_job_t;

static void
add_norm_job_run(void *arg, int64_t t, int ith)
{
    add_norm_job_t *j = arg;
    sp_ctx_t *c = j->c;
    const sp_hparams_t *hp = &c->m->hp;
    const int64_t E = hp->n_embd;
    float *x = c->x + t * E;
    (void)ith;
    if (j->add) {
        const float *p = c->proj + t * E;
        for (int64_t i = 0; i < E; i++) {
            x[i] += p[i];
        }
    }
    if (j->w != NULL) {
        c->k->rmsnorm(c->xn + t * E, x, j->w, E, hp->norm_eps);
    }
}

static void
add_norm_rows(sp_ctx_t *c, bool add, const float *w, int64_t n_tok)
{
    add_norm_job_t j = {c, add, w};
    sp_pool_run(c->pool, add_norm_job_run, &j, n_tok);
}

/* silu(gate) * up, in place into gate. Element-wise, so any split gives the
 * same bits. */
#define SWIGLU_CHUNK 16384 /* a decode step (n_ff elements) runs inline: no pool wake-up */

typedef struct swiglu_job {
    const sp_cpu_kernels_t *k;
    float *gate;
    const float *up;
    int64_t n;
} swiglu_job_t;

static void
swiglu_job_run(void *arg, int64_t chunk, int ith)
{
    swiglu_job_t *j = arg;
    const int64_t lo = chunk * SWIGLU_CHUNK;
    const int64_t n = lo + SWIGLU_CHUNK < j->n ? SWIGLU_CHUNK : j->n - lo;
    (void)ith;
    j->k->swiglu(j->gate + lo, j->up + lo, n);
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                 */
/* ------------------------------------------------------------------------ */

/* RoPE q and k of every token, then copy k and v into the cache. */
typedef struct rope_job {
    sp_ctx_t *c;
    int64_t il;
    int64_t pos0;
    int64_t n_tok;
} rope_job_t;

static void
rope_job_run(void *arg, int64_t t, int ith)
{
    rope_job_t *j = arg;
    sp_ctx_t *c = j->c;
    const sp_hparams_t *hp = &c->m->hp;
    const int64_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd, q_dim = hp->n_head * hd;
    const float *cs = c->rope_cs + t * hp->n_rot;
    float *kt = c->kv_k + t * kv_dim;
    (void)ith;
    rope(c->q + t * q_dim, hp->n_head, hd, hp->n_rot, cs, hp->rope_type);
    rope(kt, hp->n_head_kv, hd, hp->n_rot, cs, hp->rope_type);
    const float *vt = c->kv_v + t * kv_dim;
    const int64_t pos = j->pos0 + t;
    for (int64_t g = 0; g < hp->n_head_kv; g++) {
        const int64_t region = (j->il * hp->n_head_kv + g) * c->n_ctx_pad * hd; /* elements */
        const float *kg = kt + g * hd;
        char *vdst = (char *)c->v_cache + (size_t)(region + pos * hd) * c->kv_elt;
        if (c->kv_type == SP_TYPE_F32) {
            float *kc = (float *)c->k_cache + region;
            for (int64_t d = 0; d < hd; d++) {
                kc[sp_attn_k_index(pos, d, hd)] = kg[d];
            }
            memcpy(vdst, vt + g * hd, (size_t)hd * sizeof(float));
        } else {
            sp_fp16_t *kc = (sp_fp16_t *)c->k_cache + region;
            for (int64_t d = 0; d < hd; d++) {
                kc[sp_attn_k_index(pos, d, hd)] = sp_fp32_to_fp16(kg[d]);
            }
            c->k->from_float[SP_TYPE_F16](vt + g * hd, vdst, hd);
        }
    }
}

/*
 * One work item = one (token, KV head): the kernel computes all query heads of
 * the group together, so each cache row is loaded once for the group. Items
 * are ordered KV-head-major (consecutive items of a thread reuse one head's
 * rows, which stay in L2) and, within a head, latest token first: causal cost
 * grows with the position, so the pool hands out the big items first and the
 * small ones last and the threads finish together (longest-first scheduling).
 * With few items (decode with fewer KV heads than threads, e.g. multi-query
 * attention) each group's query heads are split over n_split items so every
 * thread gets work. Every query head's result depends only on its token and
 * the cache (the kernel contract), so neither the order nor the split
 * changes a bit.
 */
typedef struct attn_job {
    sp_ctx_t *c;
    int64_t il;
    int64_t pos0;
    int64_t n_tok;
    int64_t n_split;   /* parts of each KV head's query group */
    int64_t per_chunk; /* items per pool chunk */
} attn_job_t;

static void
attn_job_run(void *arg, int64_t chunk, int ith)
{
    attn_job_t *j = arg;
    sp_ctx_t *c = j->c;
    const sp_hparams_t *hp = &c->m->hp;
    const int64_t hd = hp->head_dim, q_dim = hp->n_head * hd;
    const int64_t group = hp->n_head / hp->n_head_kv;
    const int64_t part = (group + j->n_split - 1) / j->n_split; /* query heads per item */
    const int64_t n_items = j->n_tok * hp->n_head_kv * j->n_split;
    const int64_t lo = chunk * j->per_chunk;
    const int64_t hi = lo + j->per_chunk < n_items ? lo + j->per_chunk : n_items;

    for (int64_t item = lo; item < hi; item++) {
        const int64_t g = item / (j->n_tok * j->n_split);
        const int64_t r = item % (j->n_tok * j->n_split);
        const int64_t t = j->n_tok - 1 - r / j->n_split;
        const int64_t h0 = g * group + (r % j->n_split) * part; /* first query head */
        const int64_t n_q = (g + 1) * group - h0 < part ? (g + 1) * group - h0 : part;
        const int64_t pos = j->pos0 + t;
        if (n_q <= 0) {
            continue;
        }
        const size_t off = (size_t)((j->il * hp->n_head_kv + g) * c->n_ctx_pad * hd) * c->kv_elt;
        sp_attn_args_t a = {
            .head_dim = hd,
            .n_q = n_q,
            .n_kv = pos + 1,
            .q = c->q + t * q_dim + h0 * hd,
            .q_stride = hd,
            .k = (const char *)c->k_cache + off,
            .v = (const char *)c->v_cache + off,
            .v_stride = hd,
            .scale = c->attn_scale,
            .o = c->att + t * q_dim + h0 * hd,
            .o_stride = hd,
            .scratch = c->scores + (int64_t)ith * c->scores_stride,
        };
        c->k->attn[c->kv_type](&a);
    }
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                   */
/* ------------------------------------------------------------------------ */

/* The transformer layers over tokens at pos0..pos0+B-1: afterwards c->x holds
 * the B hidden states (before the final norm) and the cache those positions. */
static void
forward_layers(sp_ctx_t *c, const int32_t *tokens, int64_t B, int64_t pos0)
{
    const sp_model_t *m = c->m;
    const sp_hparams_t *hp = &m->hp;
    const int64_t E = hp->n_embd, q_dim = hp->n_head * hp->head_dim;

    embed_job_t ej = {c, tokens, pos0};
    sp_pool_run(c->pool, embed_job_run, &ej, B);
    add_norm_rows(c, false, m->layers[0].attn_norm, B);

    for (int64_t il = 0; il < hp->n_layer; il++) {
        const layer_t *L = &m->layers[il];

        const weight_t *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *yqkv[3] = {c->q, c->kv_k, c->kv_v};
        const float *bqkv[3] = {L->bq, L->bk, L->bv};
        matmul(c, 3, wqkv, yqkv, bqkv, c->xn, E, B);

        rope_job_t rj = {c, il, pos0, B};
        sp_pool_run(c->pool, rope_job_run, &rj, B);
        /* A few items per chunk keep a long prefill within the pool's chunk
         * limit. */
        const int64_t group = hp->n_head / hp->n_head_kv, nth = sp_pool_n_threads(c->pool);
        int64_t n_split = 1;
        while (B * hp->n_head_kv * n_split < 2 * nth && n_split < group) {
            n_split++;
        }
        const int64_t n_items = B * hp->n_head_kv * n_split;
        attn_job_t aj = {c, il, pos0, B, n_split, 1 + n_items / 16384};
        sp_pool_run(c->pool, attn_job_run, &aj, (n_items + aj.per_chunk - 1) / aj.per_chunk);

        matmul1(c, &L->wo, c->proj, c->att, q_dim, B);
        add_norm_rows(c, true, L->ffn_norm, B);

        const weight_t *wgu[2] = {&L->w_gate, &L->w_up};
        float *ygu[2] = {c->ff_gate, c->ff_up};
        const float *bgu[2] = {NULL, NULL};
        matmul(c, 2, wgu, ygu, bgu, c->xn, E, B);
        swiglu_job_t sj = {c->k, c->ff_gate, c->ff_up, B * hp->n_ff};
        sp_pool_run(c->pool, swiglu_job_run, &sj, (sj.n + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK);
        matmul1(c, &L->w_down, c->proj, c->ff_gate, hp->n_ff, B);
        /* The residual add, and the next layer's input norm when there is one. */
        add_norm_rows(c, true, il + 1 < hp->n_layer ? m->layers[il + 1].attn_norm : NULL, B);
    }
}

static void
forward_batch(sp_ctx_t *c, const int32_t *tokens, int64_t B, int64_t pos0, bool last_chunk)
{
    const sp_model_t *m = c->m;
    const sp_hparams_t *hp = &m->hp;
    const int64_t E = hp->n_embd;

    forward_layers(c, tokens, B, pos0);
    /* Logits: every row with logits_all, else only the last row of the call. */
    if (c->logits_all) {
        add_norm_rows(c, false, m->output_norm, B);
        matmul1(c, &m->output, c->logits + pos0 * hp->n_vocab, c->xn, E, B);
    } else if (last_chunk) {
        c->k->rmsnorm(c->xn, c->x + (B - 1) * E, m->output_norm, E, hp->norm_eps);
        matmul1(c, &m->output, c->logits, c->xn, E, 1);
    }
}

sp_status_t
sp_ctx_eval(sp_ctx_t *c, const int32_t *tokens, int64_t n, int64_t pos)
{
    if (n <= 0 || pos < 0 || pos > c->n_ctx || n > c->n_ctx - pos) {
        return SP_ERR_INVALID;
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->m->hp.n_vocab) {
            return SP_ERR_INVALID;
        }
    }
    for (int64_t done = 0; done < n; done += c->n_batch) {
        int64_t b = n - done < c->n_batch ? n - done : c->n_batch;
        forward_batch(c, tokens + done, b, pos + done, done + b == n);
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
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            return SP_ERR_INVALID;
        }
    }
    double *sum = c->embd_sum;
    memset(sum, 0, (size_t)E * sizeof(double));
    for (int64_t done = 0; done < n; done += c->n_batch) {
        const int64_t b = n - done < c->n_batch ? n - done : c->n_batch;
        forward_layers(c, tokens + done, b, done);
        add_norm_rows(c, false, c->m->output_norm, b);
        /* Positions are added in order whatever the chunking, so the sum (and
         * the embedding) does not depend on n_batch or the thread count. */
        for (int64_t t = 0; t < b; t++) {
            const float *xn = c->xn + t * E;
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
