/*
 * model.c - loading a llama-family GGUF model; sp_ctx, one sequence over it.
 *
 * Load: read hyper-parameters from `<arch>.*` keys, check them (RELIABILITY.md
 * G17: layer and head counts, divisibility) before sizing anything, then find
 * every tensor and check its shape and type against them. Weights stay in the
 * read-only mapping; the model only keeps typed pointers (llama2.c's
 * memory_map_weights, with the checks it lacked).
 *
 * Contexts: sp_ctx is one sequence run by the batched forward pass (batch.c)
 * with a private KV pool of ceil(n_ctx / SP_KV_BLOCK) blocks and the block
 * table 0, 1, 2, ...: one attention path for the single-sequence API and the
 * scheduler, so a sequence's logits are bit-identical either way, and (as
 * batch.c explains) whether a position was computed in a prefill chunk, a
 * decode step, or with any thread count.
 */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "crypto/enc.h"
#include "engine/gpu.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"

#define MAX_HEADS 4096

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
    HP_INT(n_ctx_train, "context_length", -1, 1, SP_MAX_CTX);
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
           sp_weight_t *w, char *err, size_t err_len)
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

    m->layers = sp_calloc((size_t)hp->n_layer, sizeof(sp_layer_t));
    if (m->layers == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        sp_layer_t *L = &m->layers[il];
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

static void
release_plain(void *user)
{
    sp_enc_plain_free(user);
}

static bool
has_enc_suffix(const char *path)
{
    size_t n = strlen(path);
    return n >= 4 && strcmp(path + n - 4, ".enc") == 0;
}

sp_status_t
sp_model_load_ex(const char *path, const sp_enc_key_src_t *keys, sp_model_t **out, char *err,
                 size_t err_len)
{
    sp_gguf_t *g;
    sp_status_t st;
    *out = NULL;
    /* The magic decides; the .enc suffix only makes a file that lost its magic
     * fail as "bad header" instead of "not a GGUF file" (a missing file still
     * fails in sp_gguf_open, with its errno). */
    bool enc = path != NULL && sp_enc_file_is_encrypted(path);
    if (!enc && path != NULL && has_enc_suffix(path) && access(path, F_OK) == 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: bad header: not an encrypted model file (no SPENC1 magic)", path);
    }
    if (enc) {
        sp_enc_key_t key;
        sp_enc_plain_t *plain;
        if ((st = sp_enc_key_load(keys, path, &key, err, err_len)) != SP_OK) {
            return st;
        }
        st = sp_enc_decrypt_file(path, &key, &plain, err, err_len);
        sp_enc_key_wipe(&key);
        if (st != SP_OK) {
            return st;
        }
        /* g owns plain from here, on success and on failure alike. */
        st = sp_gguf_open_mem_owned(sp_enc_plain_data(plain), sp_enc_plain_size(plain), path,
                                    release_plain, plain, &g, err, err_len);
    } else {
        st = sp_gguf_open(path, &g, err, err_len);
    }
    if (st != SP_OK) {
        return st;
    }
    return sp_model_load_gguf(g, out, err, err_len);
}

sp_status_t
sp_model_load(const char *path, sp_model_t **out, char *err, size_t err_len)
{
    return sp_model_load_ex(path, NULL, out, err, err_len);
}

void
sp_model_free(sp_model_t *m)
{
    if (m == NULL) {
        return;
    }
    sp__gpu_model_free(m->gpu);
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
    sp_batch_t *b;       /* activations and threads, n_batch rows */
    sp_kv_pool_t *kv;    /* the sequence's cache */
    int32_t *blocks;     /* 0, 1, 2, ...: the identity block table */
    int64_t n_blocks;
    int64_t n_ctx;
    int64_t n_batch;
    bool logits_all;
    float *logits;       /* (n_ctx, n_vocab) with logits_all, else NULL */
    double *embd_sum;    /* (n_embd) sp_ctx_embed's pooled sum */
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
    sp_batch_destroy(c->b);
    sp_kv_pool_destroy(c->kv);
    sp_free(c->blocks);
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
    if ((st = sp_kv_pool_check(m, &L->kp, err, err_len)) != SP_OK) {
        return st; /* e.g. a Q8_0 cache asked of a model with GPU layers */
    }
    /* n_ctx <= SP_MAX_CTX and n_embd is bounded at load: only the logits can overflow. */
    L->blocks_bytes = (size_t)L->n_blocks * sizeof(int32_t);
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
    const size_t batch = sp_batch_bytes(m, &L.bp), pool = sp_kv_pool_bytes(m, &L.kp);
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

    char sub[256];
    if (sp_batch_create(m, &L.bp, &c->b, sub, sizeof sub) != SP_OK ||
        sp_kv_pool_create(m, &L.kp, &c->kv, sub, sizeof sub) != SP_OK) {
        goto oom;
    }
    /* calloc(1, SIZE_MAX) fails like the overflow it stands for. */
    c->blocks = sp_calloc(1, L.blocks_bytes);
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
    return sp__batch_kernels_name(c->b);
}

const float *
sp_ctx_logits(const sp_ctx_t *c)
{
    return c->logits_all ? NULL : sp__batch_logits_buf(c->b);
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
    sp_batch_seq_t s = {tokens, n, pos, c->blocks, c->n_blocks, logits, 0, NULL};
    float *all = out == SP_BATCH_OUT_ALL ? c->logits + pos * c->m->hp.n_vocab : NULL;
    return sp__batch_run(c->b, c->kv, &s, 1, out, all);
}

sp_status_t
sp_ctx_eval(sp_ctx_t *c, const int32_t *tokens, int64_t n, int64_t pos)
{
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
