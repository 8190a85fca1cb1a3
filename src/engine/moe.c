/*
 * moe.c - the mixture-of-experts feed-forward block: loading its tensors from
 * GGUF and running it over the rows of a forward step (batch.c calls
 * sp__moe_ffn where a dense model runs its SwiGLU FFN).
 *
 * One step, for each chunk of up to MOE_CHUNK_ROWS rows:
 *   1. router logits: one product of ffn_gate_inp over the rows (+ bias);
 *   2. per row, the k experts and their weights (sp__moe_route): softmax
 *      then top-k, or top-k then softmax over the k; normalised and scaled as
 *      the architecture says; equal scores go to the lower expert id;
 *   3. the (row, expert) pairs ("slots") are bucketed by expert, experts in
 *      increasing id and each expert's rows in row order, and the rows are
 *      gathered (converted to the weights' dot-product format on the way);
 *   4. for every expert with rows, one batched product of its slice of
 *      ffn_gate_exps and ffn_up_exps over all its rows, the activation, then
 *      one product of its ffn_down_exps slice: all experts' products of a
 *      projection run as one pool job, split by (expert, range of weight rows);
 *   5. per row, the sum over its k slots in rank order of weight * output,
 *      then the shared expert (a dense FFN every row runs, gated by a sigmoid)
 *      when the architecture has one.
 *
 * gemma4 (sp__moe_ffn_gemma4) wraps the same pass: the experts read their own
 * normed input, the router another (its own norm and scale), and the result
 * is normed and added to the dense MLP's output that batch.c computed.
 *
 * Batch invariance: every product element is one vec_dot of a weight row and
 * the slot's own activation row (the gemm contract in kernels.h), the routing
 * and the activation of a row read only that row, and the weighted sum runs in
 * the row's own rank order. So a row's output is bit-identical whatever other
 * rows share the step, which experts they choose, how many rows an expert
 * gets, the chunking and the thread count.
 *
 * Threads: the products, conversions and per-row passes run on the caller's
 * pool; the bucketing is a few thousand integer operations on the calling
 * thread. Memory: nothing is allocated per step; the scratch (sized by
 * sp__moe_scratch_bytes at batch create) is carved into the buffers below.
 */
#include "engine/moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"

/* Rows per pass: bounds the scratch (slots = rows * k) while keeping enough
 * rows per expert for the batched products to reuse each weight read. */
#define MOE_CHUNK_ROWS 256

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct moe_arch {
    const char *name;
    bool required;       /* a MoE block in every layer (else only with expert_count >= 2) */
    bool shared;         /* a shared expert with a sigmoid gate (qwen2moe) */
    bool biases;         /* router and expert biases (gpt-oss) */
    sp_moe_gating_t gating;
    bool norm_w;
    sp_moe_act_t act;
} moe_arch_t;

/* As llama.cpp's graph builders call build_moe_ffn for each architecture. */
static const moe_arch_t moe_archs[] = {
    {"llama", false, false, false, SP_MOE_GATING_SOFTMAX, true, SP_MOE_ACT_SILU},
    {"mistral", false, false, false, SP_MOE_GATING_SOFTMAX, true, SP_MOE_ACT_SILU},
    {"qwen2moe", true, true, false, SP_MOE_GATING_SOFTMAX, false, SP_MOE_ACT_SILU},
    {"qwen3moe", true, false, false, SP_MOE_GATING_SOFTMAX, true, SP_MOE_ACT_SILU},
    {"gpt-oss", true, false, true, SP_MOE_GATING_SOFTMAX_WEIGHT, false, SP_MOE_ACT_SWIGLU_OAI},
    /* gating, norm and scale from the file's keys (deepseek_keys) */
    {"deepseek2", true, true, false, SP_MOE_GATING_SOFTMAX, false, SP_MOE_ACT_SILU},
    /* gemma4 26B-A4B: experts beside a shared dense MLP that batch.c runs, a router
     * input of its own and a per-expert output scale (sp__moe_ffn_gemma4) */
    {"gemma4", false, false, false, SP_MOE_GATING_SOFTMAX, true, SP_MOE_ACT_GELU},
};

/* An n_expert x (n_out x n_in) tensor (n_expert 1: a plain matrix, which
 * may also be stored 1-D when n_out is 1). */
static sp_status_t
get_experts(const sp_gguf_t *g, const char *name, int64_t n_in, int64_t n_out, int64_t n_expert,
            bool required, sp_experts_t *w, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(g, name);
    memset(w, 0, sizeof *w);
    if (t == NULL && required) {
        /* Files converted before April 2024 keep one 2-D tensor per expert
         * (blk.N.ffn_gate.E.weight), which llama.cpp no longer reads either. */
        char legacy[96];
        const char *exps = strstr(name, "_exps.weight");
        if (exps != NULL && (size_t)(exps - name) < 64) {
            snprintf(legacy, sizeof legacy, "%.*s.0.weight", (int)(exps - name), name);
            if (sp_gguf_find_tensor(g, legacy) != NULL) {
                return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                               "%s: missing tensor '%s': the file stores each expert apart "
                               "('%s', the pre-2024 layout); convert it again with a current "
                               "llama.cpp", path, name, legacy);
            }
        }
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor '%s'", path, name);
    }
    if (t == NULL) {
        return SP_OK;
    }
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_expert || t->ne[3] != 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected "
                       "[%lld, %lld, %lld]", path, name, (long long)t->ne[0], (long long)t->ne[1],
                       (long long)t->ne[2], (long long)t->ne[3], (long long)n_in,
                       (long long)n_out, (long long)n_expert);
    }
    const sp_type_traits_t *tr = sp_type_traits(t->type);
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    if (tr == NULL || !tr->supported || k->vec_dot[t->type] == NULL) {
        char types[256];
        sp_type_supported_list(types, sizeof types);
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has type %s, which the engine cannot compute with (%s)",
                       path, name, sp_type_name(t->type), types);
    }
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->n_expert = n_expert;
    w->row_bytes = sp_row_size(t->type, n_in);
    w->expert_bytes = w->row_bytes * (size_t)n_out;
    if (t->nbytes != w->expert_bytes * (size_t)n_expert) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tensor '%s' holds %zu bytes, expected %zu",
                       path, name, t->nbytes, w->expert_bytes * (size_t)n_expert);
    }
    return SP_OK;
}

/* F32 biases: rows of n (one per expert, or one). */
static sp_status_t
get_bias(const sp_gguf_t *g, const char *name, int64_t n, int64_t rows, bool required,
         const float **out, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(g, name);
    *out = NULL;
    if (t == NULL) {
        return required ? sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor '%s'", path,
                                  name)
                        : SP_OK;
    }
    if (t->type != SP_TYPE_F32 || t->ne[0] != n || t->ne[1] != rows || t->ne[2] * t->ne[3] != 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s' must be f32 [%lld, %lld], found %s [%lld, %lld, %lld]",
                       path, name, (long long)n, (long long)rows, sp_type_name(t->type),
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2]);
    }
    if (((uintptr_t)t->data & 3) != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tensor '%s' data is misaligned", path,
                       name);
    }
    *out = t->data;
    return SP_OK;
}

/* `<arch>.<suffix>` as an integer; *found false (and *out untouched) when absent. */
static sp_status_t
get_key_int(const sp_gguf_t *g, const char *arch, const char *suffix, int64_t *out, bool *found,
            char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    sp_status_t st = sp_gguf_get_int(g, key, out, err, err_len);
    *found = st == SP_OK;
    return st == SP_ERR_NOT_FOUND ? SP_OK : st;
}

static sp_status_t
load_layers(sp_model_t *m, const moe_arch_t *a, struct sp_moe_model *moe, char *err,
            size_t err_len)
{
    const sp_gguf_t *g = m->gguf;
    const sp_moe_hparams_t *mh = &moe->hp;
    const int64_t E = m->hp.n_embd, F = mh->n_ff_exp, NE = mh->n_expert, FS = mh->n_ff_shexp;
    char name[96];
    sp_status_t st;
    const bool ds = strcmp(a->name, "deepseek2") == 0, g4 = strcmp(a->name, "gemma4") == 0;
    for (int64_t il = mh->n_dense_lead; il < m->hp.n_layer; il++) {
        sp_moe_layer_t *L = &moe->layers[il];
#define X(field, nm, n_in, n_out, n_exp, req)                                             \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                 \
    if ((st = get_experts(g, name, n_in, n_out, n_exp, req, &L->field, err, err_len)) != SP_OK) \
        return st;
#define B(field, nm, n, rows, req)                                                        \
    snprintf(name, sizeof name, "blk.%lld." nm ".bias", (long long)il);                   \
    if ((st = get_bias(g, name, n, rows, req, &L->field, err, err_len)) != SP_OK)         \
        return st;
        X(router, "ffn_gate_inp", E, NE, 1, true);
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_up_exps.weight", (long long)il);
        if (g4 && sp_gguf_find_tensor(g, name) != NULL) {
            /* One tensor per layer, each expert's gate rows then its up rows (the
             * converter's fused gate_up_proj; llama.cpp splits the product the same way). */
            X(gate, "ffn_gate_up_exps", E, 2 * F, NE, true);
            L->gate.n_out = F;
            L->up = L->gate;
            L->up.data = (const char *)L->gate.data + (size_t)F * L->gate.row_bytes;
        } else {
            X(gate, "ffn_gate_exps", E, F, NE, true);
            X(up, "ffn_up_exps", E, F, NE, true);
        }
        X(down, "ffn_down_exps", F, E, NE, true);
        if (g4) {
            snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.scale", (long long)il);
            if ((st = get_bias(g, name, E, 1, true, &L->router_s, err, err_len)) != SP_OK) {
                return st;
            }
            snprintf(name, sizeof name, "blk.%lld.ffn_down_exps.scale", (long long)il);
            if ((st = get_bias(g, name, NE, 1, false, &L->down_s, err, err_len)) != SP_OK) {
                return st;
            }
        }
        if (a->biases) {
            B(router_b, "ffn_gate_inp", NE, 1, true);
            B(gate_b, "ffn_gate_exps", F, NE, true);
            B(up_b, "ffn_up_exps", F, NE, true);
            B(down_b, "ffn_down_exps", E, NE, true);
        }
        if (FS > 0) {
            X(sh_gate, "ffn_gate_shexp", E, FS, 1, true);
            X(sh_up, "ffn_up_shexp", E, FS, 1, true);
            X(sh_down, "ffn_down_shexp", FS, E, 1, true);
            if (!ds) {
                X(sh_inp, "ffn_gate_inp_shexp", E, 1, 1, true);
            }
        }
        if (ds) {
            snprintf(name, sizeof name, "blk.%lld.exp_probs_b.bias", (long long)il);
            if ((st = get_bias(g, name, NE, 1, false, &L->sel_b, err, err_len)) != SP_OK) {
                return st;
            }
        }
#undef X
#undef B
    }
    return SP_OK;
}

/* deepseek2's keys: leading dense layers, shared experts (each n_ff_exp
 * wide), gating function, weight norm and scale, expert groups; defaults as
 * llama.cpp's (softmax gating, no norm, no scale, no groups). */
static sp_status_t
deepseek_keys(const sp_model_t *m, sp_moe_hparams_t *mh, char *err, size_t err_len)
{
    const sp_gguf_t *g = m->gguf;
    const char *path = sp_gguf_path(g), *arch = m->hp.arch;
    char key[128];
    int64_t v;
    bool found;
    sp_status_t st;
#define KEY(suffix, lo, hi, dflt, req)                                                        \
    if ((st = get_key_int(g, arch, suffix, &v, &found, err, err_len)) != SP_OK) return st;   \
    if (!found && (req))                                                                     \
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s.%s'", path, \
                       arch, suffix);                                                        \
    if (!found) v = (dflt);                                                                  \
    if (v < (lo) || v > (hi))                                                                \
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s.%s' = %lld out of range "    \
                       "[%lld, %lld]", path, arch, suffix, (long long)v, (long long)(lo),     \
                       (long long)(hi));
    KEY("leading_dense_block_count", 0, m->hp.n_layer, 0, false);
    mh->n_dense_lead = v;
    KEY("expert_shared_count", 0, 64, 0, true);
    mh->n_ff_shexp = mh->n_ff_exp * v;
    /* llama.cpp's numbers: 0 (absent) and 1 softmax, 2 sigmoid, 3 softmax over the
     * chosen; 4 (sqrt-softplus) is refused by the range */
    KEY("expert_gating_func", 0, 3, 0, false);
    mh->gating = v == 2   ? SP_MOE_GATING_SIGMOID
                 : v == 3 ? SP_MOE_GATING_SOFTMAX_WEIGHT
                          : SP_MOE_GATING_SOFTMAX;
    KEY("expert_group_count", 0, mh->n_expert, 0, false);
    mh->n_group = v;
    KEY("expert_group_used_count", 0, mh->n_group, 0, false);
    mh->n_group_used = v;
#undef KEY
    if (mh->n_group > 1 && (mh->n_expert % mh->n_group != 0 || mh->n_expert / mh->n_group < 2 ||
                            mh->n_group_used < 1 || mh->n_group_used >= mh->n_group)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: '%s.expert_group_count' %lld / 'expert_group_used_count' %lld do not "
                       "split %lld experts into groups of at least 2 with 1 <= used < groups",
                       path, arch, (long long)mh->n_group, (long long)mh->n_group_used,
                       (long long)mh->n_expert);
    }
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    st = sp_gguf_get_bool(g, key, &mh->norm_w, err, err_len);
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
        return st;
    }
    double scale = 0.0;
    snprintf(key, sizeof key, "%s.expert_weights_scale", arch);
    st = sp_gguf_get_float(g, key, &scale, err, err_len);
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
        return st;
    }
    if (!isfinite(scale) || scale < 0.0 || scale > 1e6) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s' = %g out of range [0, 1e6]",
                       path, key, scale);
    }
    mh->w_scale = (float)scale;
    return SP_OK;
}

bool
sp__moe_layer(const sp_model_t *m, int64_t il)
{
    return m->moe != NULL && il >= m->moe->hp.n_dense_lead;
}

sp_status_t
sp__moe_load(sp_model_t *m, bool required, char *err, size_t err_len)
{
    const sp_gguf_t *g = m->gguf;
    const char *path = sp_gguf_path(g), *arch = m->hp.arch;
    const moe_arch_t *a = NULL;
    m->moe = NULL;
    for (size_t i = 0; i < sizeof moe_archs / sizeof moe_archs[0]; i++) {
        if (strcmp(arch, moe_archs[i].name) == 0) {
            a = &moe_archs[i];
        }
    }
    required |= a != NULL && a->required;
    if (a == NULL) {
        if (required) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                           "%s: architecture '%s' has no mixture-of-experts support", path, arch);
        }
        return SP_OK; /* a dense-only architecture: expert keys mean nothing to it */
    }
    int64_t n_expert = 0, n_used = 0;
    bool found;
    sp_status_t st = get_key_int(g, arch, "expert_count", &n_expert, &found, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    if (!found || n_expert <= 1) {
        if (required) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: '%s.expert_count' is %s, a %s model needs at least 2 experts",
                           path, arch, found ? "under 2" : "missing", arch);
        }
        return SP_OK; /* llama.cpp's rule: 0 or 1 expert is a dense model */
    }
    if (n_expert > SP_MOE_MAX_EXPERTS) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: '%s.expert_count' = %lld is over %d", path,
                       arch, (long long)n_expert, SP_MOE_MAX_EXPERTS);
    }
    if ((st = get_key_int(g, arch, "expert_used_count", &n_used, &found, err, err_len)) != SP_OK) {
        return st;
    }
    if (!found || n_used < 1 || n_used > n_expert || n_used > SP_MOE_MAX_USED) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: '%s.expert_used_count' is %s (needs 1..%lld, at most %d)", path, arch,
                       found ? "out of range" : "missing", (long long)n_expert, SP_MOE_MAX_USED);
    }
    struct sp_moe_model *moe = sp_calloc(1, sizeof *moe);
    if (moe == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    sp_moe_hparams_t *mh = &moe->hp;
    mh->n_expert = n_expert;
    mh->n_expert_used = n_used;
    mh->gating = a->gating;
    mh->norm_w = a->norm_w;
    mh->w_scale = 0.0f;
    mh->act = a->act;
    mh->oai_alpha = 1.702f;
    mh->oai_limit = 7.0f;
    /* An expert's width: its own key, else the dense width (Mixtral under
     * llama keeps it in feed_forward_length; qwen2moe's fallback is llama.cpp's). */
    int64_t ff = 0;
    st = get_key_int(g, arch, "expert_feed_forward_length", &ff, &found, err, err_len);
    if (st == SP_OK && !found && strcmp(arch, "gemma4") == 0) {
        /* its dense width is the shared MLP's, not the experts' */
        st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s.%s'", path,
                     arch, "expert_feed_forward_length");
    } else if (st == SP_OK && !found) {
        ff = strcmp(arch, "qwen2moe") == 0 ? m->hp.n_ff / n_used : m->hp.n_ff;
    }
    if (st == SP_OK && (ff < 1 || ff > (1 << 22))) {
        st = sp_errf(err, err_len, SP_ERR_FORMAT,
                     "%s: expert feed-forward length %lld out of range [1, %d]", path,
                     (long long)ff, 1 << 22);
    }
    mh->n_ff_exp = ff;
    if (st == SP_OK && strcmp(arch, "deepseek2") == 0) {
        st = deepseek_keys(m, mh, err, err_len);
    } else if (st == SP_OK && a->shared) {
        st = get_key_int(g, arch, "expert_shared_feed_forward_length", &ff, &found, err, err_len);
        mh->n_ff_shexp = found ? ff : m->hp.n_ff;
        if (st == SP_OK && (mh->n_ff_shexp < 1 || mh->n_ff_shexp > (1 << 22))) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT,
                         "%s: '%s.expert_shared_feed_forward_length' %lld out of range", path,
                         arch, (long long)mh->n_ff_shexp);
        }
    }
    if (st == SP_OK) {
        moe->layers = sp_calloc((size_t)m->hp.n_layer, sizeof *moe->layers);
        st = moe->layers == NULL ? sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path)
                                 : load_layers(m, a, moe, err, err_len);
    }
    if (st != SP_OK) {
        sp__moe_free(moe);
        return st;
    }
    m->moe = moe;
    return SP_OK;
}

void
sp__moe_free(struct sp_moe_model *moe)
{
    if (moe == NULL) {
        return;
    }
    sp_free(moe->layers);
    sp_free(moe);
}

/* ------------------------------------------------------------------------ */
/* Routing                                                                   */
/* ------------------------------------------------------------------------ */

/* ids[0..k) = the k largest of s[0..n) by decreasing value, the lower index
 * first among equals. NaN never beats a number (a NaN score can only be
 * taken when nothing else is left). */
static void
top_k(const float *s, int64_t n, int64_t k, int32_t *ids)
{
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; e++) {
            bool taken = false;
            for (int64_t i = 0; i < j; i++) {
                taken |= ids[i] == e;
            }
            if (taken) {
                continue;
            }
            if (best < 0 || s[e] > s[best] || (isnan(s[best]) && !isnan(s[e]))) {
                best = e;
            }
        }
        ids[j] = (int32_t)best;
    }
}

/* In place: v[0..n) = softmax(v). */
static void
softmax(float *v, int64_t n)
{
    float mx = v[0];
    for (int64_t i = 1; i < n; i++) {
        mx = v[i] > mx ? v[i] : mx;
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        v[i] = expf(v[i] - mx);
        sum += v[i];
    }
    for (int64_t i = 0; i < n; i++) {
        v[i] /= sum;
    }
}

void
sp__moe_route(const sp_moe_hparams_t *hp, const float *logits, float *probs, int32_t *ids,
              float *weights)
{
    sp__moe_route_ex(hp, logits, NULL, probs, ids, weights);
}

void
sp__moe_route_ex(const sp_moe_hparams_t *hp, const float *logits, const float *sel_bias,
                 float *probs, int32_t *ids, float *weights)
{
    const int64_t n = hp->n_expert, k = hp->n_expert_used;
    memcpy(probs, logits, (size_t)n * sizeof(float));
    if (hp->gating == SP_MOE_GATING_SOFTMAX) {
        softmax(probs, n);
    } else if (hp->gating == SP_MOE_GATING_SIGMOID) {
        for (int64_t e = 0; e < n; e++) {
            probs[e] = 1.0f / (1.0f + expf(-probs[e]));
        }
    }
    /* The choice reads the scores plus the selection bias, with the groups
     * outside the best n_group_used masked; the weights read probs. */
    float sel[SP_MOE_MAX_EXPERTS];
    for (int64_t e = 0; e < n; e++) {
        sel[e] = sel_bias != NULL ? probs[e] + sel_bias[e] : probs[e];
    }
    if (hp->n_group > 1) {
        const int64_t per = n / hp->n_group;
        float gs[SP_MOE_MAX_EXPERTS];
        int32_t two[2], keep[SP_MOE_MAX_EXPERTS];
        for (int64_t gi = 0; gi < hp->n_group; gi++) {
            top_k(sel + gi * per, per, 2, two);
            gs[gi] = sel[gi * per + two[0]] + sel[gi * per + two[1]];
        }
        top_k(gs, hp->n_group, hp->n_group_used, keep);
        for (int64_t gi = 0; gi < hp->n_group; gi++) {
            bool kept = false;
            for (int64_t j = 0; j < hp->n_group_used; j++) {
                kept |= keep[j] == gi;
            }
            for (int64_t e = 0; e < per && !kept; e++) {
                sel[gi * per + e] = -INFINITY;
            }
        }
    }
    top_k(sel, n, k, ids);
    for (int64_t j = 0; j < k; j++) {
        weights[j] = probs[ids[j]];
    }
    if (hp->gating == SP_MOE_GATING_SOFTMAX_WEIGHT) {
        softmax(weights, k);
    }
    if (hp->norm_w) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            sum += weights[j];
        }
        sum = sum < 6.103515625e-5f ? 6.103515625e-5f : sum; /* the smallest normal half */
        for (int64_t j = 0; j < k; j++) {
            weights[j] /= sum;
        }
    }
    if (hp->w_scale != 0.0f && hp->w_scale != 1.0f) {
        for (int64_t j = 0; j < k; j++) {
            weights[j] *= hp->w_scale;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Scratch                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct moe_buf {
    int64_t rows;      /* rows per pass */
    float *logits;     /* (rows, n_expert) router output */
    float *probs;      /* (rows, n_expert) routing scratch */
    float *wts;        /* (rows, k) */
    int32_t *sel;      /* (rows, k) chosen experts */
    int32_t *slot_of;  /* (rows, k) the slot of (row, rank) */
    int32_t *slot_row; /* (rows * k) the row of each slot (slots bucketed by expert) */
    int32_t *slot_exp; /* (rows * k) its expert */
    int64_t *off;      /* (n_expert + 1) first slot of each expert */
    int64_t *cur;      /* (n_expert) bucketing cursors */
    int32_t *active;   /* (n_expert) experts with slots, increasing */
    void *act;         /* (max(rows * k, rows), act_stride) activations in dot-product format */
    size_t act_stride;
    float *yg, *yu;    /* (rows * k, n_ff_exp) or (rows, n_ff_shexp), the larger */
    float *yd;         /* (rows * k, n_embd) expert outputs */
    float *sh;         /* (rows) shared expert gate logits */
    float *g4_x, *g4_r, *g4_y; /* gemma4: (rows, n_embd) the experts' input, the router's
                                  input, the experts' output; NULL elsewhere */
} moe_buf_t;

static size_t
round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Lay the buffers out from base (NULL: only count); returns the bytes. */
static size_t
carve(const sp_model_t *m, int64_t max_rows, char *base, moe_buf_t *b)
{
    const sp_moe_hparams_t *mh = &m->moe->hp;
    const int64_t R = max_rows < MOE_CHUNK_ROWS ? max_rows : MOE_CHUNK_ROWS;
    const int64_t NE = mh->n_expert, K = mh->n_expert_used, S = R * K, E = m->hp.n_embd;
    int64_t widest = E > mh->n_ff_exp ? E : mh->n_ff_exp;
    widest = widest > mh->n_ff_shexp ? widest : mh->n_ff_shexp;
    int64_t ff_rows = S * mh->n_ff_exp > R * mh->n_ff_shexp ? S * mh->n_ff_exp
                                                           : R * mh->n_ff_shexp;
    size_t off = 0;
    moe_buf_t tmp;
    if (b == NULL) {
        b = &tmp;
    }
    b->rows = R;
    b->act_stride = round64((size_t)widest * 4); /* every dot-product format: <= 4 bytes */
#define TAKE(field, bytes)                                                    \
    do {                                                                      \
        b->field = base != NULL ? (void *)(base + off) : NULL;                \
        off += round64(bytes);                                                \
    } while (0)
    TAKE(logits, (size_t)(R * NE) * sizeof(float));
    TAKE(probs, (size_t)(R * NE) * sizeof(float));
    TAKE(wts, (size_t)S * sizeof(float));
    TAKE(sel, (size_t)S * sizeof(int32_t));
    TAKE(slot_of, (size_t)S * sizeof(int32_t));
    TAKE(slot_row, (size_t)S * sizeof(int32_t));
    TAKE(slot_exp, (size_t)S * sizeof(int32_t));
    TAKE(off, (size_t)(NE + 1) * sizeof(int64_t));
    TAKE(cur, (size_t)NE * sizeof(int64_t));
    TAKE(active, (size_t)NE * sizeof(int32_t));
    TAKE(act, (size_t)S * b->act_stride);
    TAKE(yg, (size_t)ff_rows * sizeof(float));
    TAKE(yu, (size_t)ff_rows * sizeof(float));
    TAKE(yd, (size_t)S * (size_t)E * sizeof(float));
    TAKE(sh, (size_t)R * sizeof(float));
    const bool g4 = strcmp(m->hp.arch, "gemma4") == 0;
    TAKE(g4_x, g4 ? (size_t)(R * E) * sizeof(float) : 0);
    TAKE(g4_r, g4 ? (size_t)(R * E) * sizeof(float) : 0);
    TAKE(g4_y, g4 ? (size_t)(R * E) * sizeof(float) : 0);
#undef TAKE
    return off;
}

size_t
sp__moe_scratch_bytes(const sp_model_t *m, int64_t max_rows)
{
    if (m->moe == NULL || max_rows < 1) {
        return 0;
    }
    return carve(m, max_rows, NULL, NULL);
}

/* ------------------------------------------------------------------------ */
/* Jobs                                                                      */
/* ------------------------------------------------------------------------ */

/* dst row t = src row map[t] (or t) converted to the format `type`. */
typedef struct conv_job {
    const sp_cpu_kernels_t *k;
    sp_type_t type;
    const float *src;
    int64_t src_stride; /* floats */
    const int32_t *map;
    int64_t n;          /* elements per row */
    char *dst;
    size_t dst_stride;
} conv_job_t;

static void
conv_job_run(void *arg, int64_t t, int ith)
{
    conv_job_t *j = arg;
    (void)ith;
    const float *s = j->src + (j->map != NULL ? j->map[t] : t) * j->src_stride;
    if (j->type == SP_TYPE_F32) {
        memcpy(j->dst + (size_t)t * j->dst_stride, s, (size_t)j->n * sizeof(float));
    } else {
        j->k->from_float[j->type](s, j->dst + (size_t)t * j->dst_stride, j->n);
    }
}

static void
convert(sp_pool_t *pool, const sp_cpu_kernels_t *k, sp_type_t type, const float *src,
        int64_t src_stride, const int32_t *map, int64_t n, int64_t rows, void *dst,
        size_t dst_stride)
{
    conv_job_t j = {k, type, src, src_stride, map, n, dst, dst_stride};
    sp_pool_run_as(pool, "quantize", conv_job_run, &j, rows);
}

/* Up to two expert tensors over the same gathered activations: for every
 * active expert e, y rows off[e]..off[e+1] = act rows off[e].. times e's slice.
 * Items are (tensor, active expert, range of weight rows). */
typedef struct xmm_job {
    const sp_cpu_kernels_t *k;
    int n_w;
    const sp_experts_t *w[2];
    float *y[2];
    const void *x;
    size_t x_stride;
    const int32_t *active;
    int64_t n_active;
    const int64_t *off;
    int64_t chunk;
    int64_t n_chunks[2];
} xmm_job_t;

static void
xmm_job_run(void *arg, int64_t item, int ith)
{
    xmm_job_t *j = arg;
    int wi = 0;
    (void)ith;
    while (item >= j->n_active * j->n_chunks[wi]) {
        item -= j->n_active * j->n_chunks[wi++];
    }
    const sp_experts_t *w = j->w[wi];
    const int64_t e = j->active[item / j->n_chunks[wi]];
    const int64_t r0 = (item % j->n_chunks[wi]) * j->chunk;
    const int64_t r1 = r0 + j->chunk < w->n_out ? r0 + j->chunk : w->n_out;
    const int64_t s0 = j->off[e], n_tok = j->off[e + 1] - s0;
    const void *x = (const char *)j->x + (size_t)s0 * j->x_stride;
    if (w->packed != NULL && j->k->repack_gemm[w->type] != NULL) {
        /* expert e's load-time packed copy (the scalar reference's bits: kernels.h) */
        const char *pe = (const char *)w->packed + (size_t)e * w->packed_expert_bytes;
        j->k->repack_gemm[w->type](w->n_in, pe, w->packed_stride, r0, r1, x, j->x_stride,
                                   n_tok, j->y[wi] + s0 * w->n_out, w->n_out);
        return;
    }
    sp_cpu_gemm(j->k, w->type, w->n_in, (const char *)w->data + (size_t)e * w->expert_bytes,
                w->row_bytes, r0, r1, x, j->x_stride, n_tok, j->y[wi] + s0 * w->n_out, w->n_out);
}

static void
experts_mm(sp_pool_t *pool, const sp_cpu_kernels_t *k, int n_w, const sp_experts_t *const *w,
           float *const *y, const void *x, size_t x_stride, const int32_t *active,
           int64_t n_active, const int64_t *off)
{
    xmm_job_t j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.n_w = n_w;
    j.x = x;
    j.x_stride = x_stride;
    j.active = active;
    j.n_active = n_active;
    j.off = off;
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) {
        rows += w[i]->n_out * n_active;
    }
    /* The products' item size over all the experts' rows (engine/split.c; it does not
     * depend on the token count, which varies by expert here); any split gives the same bits
     * (the gemm contract). Items stay within one expert's matrix: the dense products' fine
     * tail (sp_mm_split_t) is not used here. */
    const int64_t chunk = sp__batch_mm_chunk(rows, sp_pool_n_threads(pool), 1);
    j.chunk = chunk;
    int64_t total = 0;
    for (int i = 0; i < n_w; i++) {
        j.w[i] = w[i];
        j.y[i] = y[i];
        j.n_chunks[i] = (w[i]->n_out + chunk - 1) / chunk;
        total += n_active * j.n_chunks[i];
    }
    sp_pool_run_as(pool, "moe_products", xmm_job_run, &j, total);
}

/* Convert rows (through map) to the tensors' format and run the products:
 * one conversion when both tensors read the same format. */
static void
experts_apply(sp_pool_t *pool, const sp_cpu_kernels_t *k, moe_buf_t *b, int n_w,
              const sp_experts_t *const *w, float *const *y, const float *src, int64_t src_stride,
              const int32_t *map, int64_t n_rows, const int32_t *active, int64_t n_active,
              const int64_t *off)
{
    const sp_type_t t0 = k->vec_dot_type[w[0]->type];
    if (n_w == 2 && k->vec_dot_type[w[1]->type] != t0) {
        experts_apply(pool, k, b, 1, &w[0], &y[0], src, src_stride, map, n_rows, active,
                      n_active, off);
        experts_apply(pool, k, b, 1, &w[1], &y[1], src, src_stride, map, n_rows, active,
                      n_active, off);
        return;
    }
    const size_t xs = sp__act_row_stride(t0, w[0]->n_in);
    SP_ASSERT(xs <= b->act_stride); /* every format: at most 4 bytes an element */
    convert(pool, k, t0, src, src_stride, map, w[0]->n_in, n_rows, b->act, xs);
    experts_mm(pool, k, n_w, w, y, b->act, xs, active, n_active, off);
}

/* Routing of each row of the pass. */
typedef struct route_job {
    const sp_moe_hparams_t *hp;
    moe_buf_t *b;
    const float *router_b;
    const float *sel_b;
} route_job_t;

static void
route_job_run(void *arg, int64_t r, int ith)
{
    route_job_t *j = arg;
    const int64_t NE = j->hp->n_expert, K = j->hp->n_expert_used;
    float *lg = j->b->logits + r * NE;
    (void)ith;
    if (j->router_b != NULL) {
        for (int64_t e = 0; e < NE; e++) {
            lg[e] += j->router_b[e];
        }
    }
    sp__moe_route_ex(j->hp, lg, j->sel_b, j->b->probs + r * NE, j->b->sel + r * K,
                     j->b->wts + r * K);
}

/* The activation of each slot, in place into yg: biases, then SwiGLU. */
typedef struct act_job {
    const sp_cpu_kernels_t *k;
    const sp_moe_hparams_t *hp;
    float *yg;
    const float *yu;
    int64_t n;                  /* width */
    const int32_t *slot_exp;    /* NULL: no biases (shared expert) */
    const float *gate_b, *up_b; /* (n_expert, n) or NULL */
} act_job_t;

static void
act_job_run(void *arg, int64_t s, int ith)
{
    act_job_t *j = arg;
    float *g = j->yg + s * j->n;
    float *u = (float *)j->yu + s * j->n; /* the biases go into up in place */
    (void)ith;
    if (j->slot_exp != NULL && j->gate_b != NULL) {
        const float *gb = j->gate_b + j->slot_exp[s] * j->n, *ub = j->up_b + j->slot_exp[s] * j->n;
        for (int64_t i = 0; i < j->n; i++) {
            g[i] += gb[i];
            u[i] += ub[i];
        }
    }
    if (j->hp->act == SP_MOE_ACT_SWIGLU_OAI) {
        const float alpha = j->hp->oai_alpha, lim = j->hp->oai_limit;
        for (int64_t i = 0; i < j->n; i++) {
            const float x = g[i] < lim ? g[i] : lim;
            const float y = u[i] < -lim ? -lim : (u[i] > lim ? lim : u[i]);
            g[i] = x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
        }
    } else if (j->hp->act == SP_MOE_ACT_GELU) {
        const float c = 0.7978845608028654f; /* sqrt(2 / pi), as batch.c's dense geglu */
        for (int64_t i = 0; i < j->n; i++) {
            const float x = g[i];
            g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
        }
    } else {
        j->k->swiglu(g, u, j->n);
    }
}

/* The experts' pass: out row r = sum over ranks q (in rank order) of
 * w_q (y_slot + down bias). The shared pass (shared != NULL): out row r +=
 * sigmoid(the row's shared gate logit) * shared row r (no gate: 1). */
typedef struct combine_job {
    const sp_moe_hparams_t *hp;
    const moe_buf_t *b;
    const float *down_b;
    const float *down_s; /* (n_expert) or NULL */
    const float *shared; /* (rows, n_embd) or NULL */
    bool shared_gate;
    float *out;
    int64_t E;
} combine_job_t;

static void
combine_job_run(void *arg, int64_t r, int ith)
{
    combine_job_t *j = arg;
    const moe_buf_t *b = j->b;
    const int64_t K = j->hp->n_expert_used, E = j->E;
    float *o = j->out + r * E;
    (void)ith;
    if (j->shared != NULL) {
        const float *y = j->shared + r * E;
        const float gw = j->shared_gate ? 1.0f / (1.0f + expf(-b->sh[r])) : 1.0f;
        for (int64_t i = 0; i < E; i++) {
            o[i] += gw * y[i];
        }
        return;
    }
    for (int64_t i = 0; i < E; i++) {
        o[i] = 0.0f;
    }
    for (int64_t q = 0; q < K; q++) {
        const int64_t s = b->slot_of[r * K + q];
        const float w = b->wts[r * K + q];
        const float *y = b->yd + s * E;
        if (j->down_s != NULL) {
            /* llama.cpp scales the expert's output, then weighs it */
            const float ds = j->down_s[b->sel[r * K + q]];
            for (int64_t i = 0; i < E; i++) {
                o[i] += w * (y[i] * ds);
            }
        } else if (j->down_b != NULL) {
            const float *db = j->down_b + b->sel[r * K + q] * E;
            for (int64_t i = 0; i < E; i++) {
                o[i] += w * (y[i] + db[i]);
            }
        } else {
            for (int64_t i = 0; i < E; i++) {
                o[i] += w * y[i];
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The block                                                                 */
/* ------------------------------------------------------------------------ */

/* xr: the router's input rows (gemma4), or NULL: x. */
static void
moe_pass(const sp_model_t *m, const sp_moe_layer_t *L, sp_pool_t *pool,
         const sp_cpu_kernels_t *k, moe_buf_t *b, const float *x, const float *xr, float *out,
         int64_t R)
{
    const sp_moe_hparams_t *hp = &m->moe->hp;
    const int64_t E = m->hp.n_embd, NE = hp->n_expert, K = hp->n_expert_used, S = R * K;
    static const int32_t one_active[1] = {0};
    const int64_t all_rows[2] = {0, R};

    /* 1-2: router logits, then each row's experts and weights. */
    const sp_experts_t *wr[1] = {&L->router};
    float *yr[1] = {b->logits};
    experts_apply(pool, k, b, 1, wr, yr, xr != NULL ? xr : x, E, NULL, R, one_active, 1,
                  all_rows);
    route_job_t rj = {hp, b, L->router_b, L->sel_b};
    sp_pool_run_as(pool, "moe_route", route_job_run, &rj, R);

    /* 3: bucket the slots by expert (counting sort: experts by id, rows in order). */
    memset(b->off, 0, (size_t)(NE + 1) * sizeof(int64_t));
    for (int64_t s = 0; s < S; s++) {
        SP_ASSERT(b->sel[s] >= 0 && b->sel[s] < NE); /* top_k picks k distinct valid ids */
        b->off[b->sel[s] + 1]++;
    }
    int64_t n_active = 0;
    for (int64_t e = 0; e < NE; e++) {
        if (b->off[e + 1] > 0) {
            b->active[n_active++] = (int32_t)e;
        }
        b->off[e + 1] += b->off[e];
        b->cur[e] = b->off[e];
    }
    for (int64_t r = 0; r < R; r++) {
        for (int64_t q = 0; q < K; q++) {
            const int32_t e = b->sel[r * K + q];
            const int64_t s = b->cur[e]++;
            b->slot_row[s] = (int32_t)r;
            b->slot_exp[s] = e;
            b->slot_of[r * K + q] = (int32_t)s;
        }
    }

    /* 4: gate and up of every expert over its rows, the activation, down. */
    const sp_experts_t *wgu[2] = {&L->gate, &L->up};
    float *ygu[2] = {b->yg, b->yu};
    experts_apply(pool, k, b, 2, wgu, ygu, x, E, b->slot_row, S, b->active, n_active, b->off);
    act_job_t aj = {k, hp, b->yg, b->yu, hp->n_ff_exp, b->slot_exp, L->gate_b, L->up_b};
    sp_pool_run_as(pool, "ffn_act", act_job_run, &aj, S);
    const sp_experts_t *wd[1] = {&L->down};
    float *yd[1] = {b->yd};
    experts_apply(pool, k, b, 1, wd, yd, b->yg, hp->n_ff_exp, NULL, S, b->active, n_active,
                  b->off);

    combine_job_t cj = {hp, b, L->down_b, L->down_s, NULL, false, out, E};
    sp_pool_run_as(pool, "moe_combine", combine_job_run, &cj, R);

    /* 5: the shared expert over all rows, into yd (the experts' outputs are
     * consumed: R <= S rows fit), added with its gate in a second pass. */
    if (hp->n_ff_shexp > 0) {
        const sp_experts_t *sgu[2] = {&L->sh_gate, &L->sh_up};
        float *sy[2] = {b->yg, b->yu};
        experts_apply(pool, k, b, 2, sgu, sy, x, E, NULL, R, one_active, 1, all_rows);
        act_job_t sa = {k, hp, b->yg, b->yu, hp->n_ff_shexp, NULL, NULL, NULL};
        sp_pool_run_as(pool, "ffn_act", act_job_run, &sa, R);
        const sp_experts_t *sd[1] = {&L->sh_down};
        float *syd[1] = {b->yd};
        experts_apply(pool, k, b, 1, sd, syd, b->yg, hp->n_ff_shexp, NULL, R, one_active, 1,
                      all_rows);
        const bool gated = L->sh_inp.data != NULL;
        if (gated) {
            const sp_experts_t *si[1] = {&L->sh_inp};
            float *ysi[1] = {b->sh};
            experts_apply(pool, k, b, 1, si, ysi, x, E, NULL, R, one_active, 1, all_rows);
        }
        combine_job_t sj = {hp, b, NULL, NULL, b->yd, gated, out, E};
        sp_pool_run_as(pool, "moe_combine", combine_job_run, &sj, R);
    }
}

void
sp__moe_ffn(const sp_model_t *m, int64_t il, sp_pool_t *pool, const sp_cpu_kernels_t *k,
            void *scratch, int64_t max_rows, const float *x, float *out, int64_t n_rows)
{
    SP_ASSERT(sp__moe_layer(m, il) && il < m->hp.n_layer && n_rows <= max_rows);
    moe_buf_t b;
    carve(m, max_rows, scratch, &b); /* as sp__moe_scratch_bytes(m, max_rows) sized it */
    const sp_moe_layer_t *L = &m->moe->layers[il];
    const int64_t E = m->hp.n_embd;
    for (int64_t r0 = 0; r0 < n_rows; r0 += b.rows) {
        const int64_t R = n_rows - r0 < b.rows ? n_rows - r0 : b.rows;
        moe_pass(m, L, pool, k, &b, x + r0 * E, NULL, out + r0 * E, R);
    }
}

/* gemma4, before the experts: row r's expert input, router input, and the
 * shared MLP's output normed in place. */
typedef struct g4_job {
    const sp_model_t *m;
    const sp_layer_t *L;
    const sp_moe_layer_t *ML;
    const sp_cpu_kernels_t *k;
    const moe_buf_t *b;
    const float *res;
    float *ffn;
} g4_job_t;

static void
g4_pre_job_run(void *arg, int64_t r, int ith)
{
    g4_job_t *j = arg;
    const int64_t E = j->m->hp.n_embd;
    const float eps = j->m->hp.norm_eps, inv = 1.0f / sqrtf((float)E);
    const float *x = j->res + r * E;
    float *xr = j->b->g4_r + r * E;
    (void)ith;
    j->k->rmsnorm(j->b->g4_x + r * E, x, j->L->ffn_pre_norm_2, E, eps);
    j->k->rmsnorm(xr, x, j->ML->router_s, E, eps);
    for (int64_t i = 0; i < E; i++) {
        xr[i] *= inv;
    }
    j->k->rmsnorm(j->ffn + r * E, j->ffn + r * E, j->L->ffn_post_norm_1, E, eps);
}

/* After the experts: ffn row r += RMSNorm(experts' row r) * post_ffw_norm_2. */
static void
g4_post_job_run(void *arg, int64_t r, int ith)
{
    g4_job_t *j = arg;
    const int64_t E = j->m->hp.n_embd;
    float *y = j->b->g4_y + r * E, *o = j->ffn + r * E;
    (void)ith;
    j->k->rmsnorm(y, y, j->L->ffn_post_norm_2, E, j->m->hp.norm_eps);
    for (int64_t i = 0; i < E; i++) {
        o[i] += y[i];
    }
}

void
sp__moe_ffn_gemma4(const sp_model_t *m, int64_t il, sp_pool_t *pool, const sp_cpu_kernels_t *k,
                   void *scratch, int64_t max_rows, const float *res, float *ffn, int64_t n_rows)
{
    SP_ASSERT(sp__moe_layer(m, il) && il < m->hp.n_layer && n_rows <= max_rows);
    moe_buf_t b;
    carve(m, max_rows, scratch, &b);
    SP_ASSERT(b.g4_x != NULL);
    const sp_moe_layer_t *ML = &m->moe->layers[il];
    const int64_t E = m->hp.n_embd;
    for (int64_t r0 = 0; r0 < n_rows; r0 += b.rows) {
        const int64_t R = n_rows - r0 < b.rows ? n_rows - r0 : b.rows;
        g4_job_t j = {m, &m->layers[il], ML, k, &b, res + r0 * E, ffn + r0 * E};
        sp_pool_run_as(pool, "norm", g4_pre_job_run, &j, R);
        moe_pass(m, ML, pool, k, &b, b.g4_x, b.g4_r, b.g4_y, R);
        sp_pool_run_as(pool, "norm", g4_post_job_run, &j, R);
    }
}
