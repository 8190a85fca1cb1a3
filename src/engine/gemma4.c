/*
 * gemma4.c - loading the gemma4 architecture (Gemma 4's text model, dense
 * variants) as llama.cpp names and reads it: the hyper-parameters beyond the
 * common ones and every tensor, shape-checked. The forward pass is batch.c's
 * (docs/design.md, "gemma4" lists what gemma4 computes differently).
 *
 * What a gemma4 file adds to gemma3: sliding and global layers with their own
 * head widths (attention.key_length_swa), rotated dims
 * (rope.dimension_count_swa) and KV head counts (head_count_kv may be a
 * per-layer array), the layer kinds as a per-layer array
 * (attention.sliding_window_pattern), a per-layer FFN width
 * (feed_forward_length array: the "double-wide" MLP of the shared layers),
 * the last attention.shared_kv_layers layers keeping no cache of their own,
 * per-layer token inputs (embedding_length_per_layer_input), a value norm,
 * an optional value projection (absent: v = k), an optional scalar per layer
 * output, and rope_freqs applied to the global layers only.
 *
 * The mixture-of-experts variant (26B-A4B, expert_count >= 2): moe.c loads
 * the router and experts, this file the dense MLP beside them and the three
 * extra norms (the block: sp__moe_ffn_gemma4). Not loaded: the vision and
 * audio encoders, which llama.cpp's converter writes to a separate mmproj
 * file that this loader never reads.
 *
 * Threads: called once at load, by the loading thread. Memory: the model's
 * `ones` vector (freed by sp_model_free); the weights stay in the mapping.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "engine/model_impl.h"
#include "engine/moe.h"

#define MAX_WIDTH (1 << 14)

/* `<arch>.<suffix>` as an integer, or as an array of one integer per layer
 * (llama.cpp's get_key_or_arr): out[il] for every layer, each in [lo, hi]. */
static sp_status_t
get_per_layer(const sp_gguf_t *g, const sp_hparams_t *hp, const char *suffix, int64_t dflt,
              int64_t lo, int64_t hi, int32_t *out, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", hp->arch, suffix);
    const char *path = sp_gguf_path(g);
    const int64_t ki = sp_gguf_find_key(g, key);
    if (ki < 0) {
        if (dflt < 0) {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s'", path, key);
        }
        for (int64_t il = 0; il < hp->n_layer; il++) {
            out[il] = (int32_t)dflt;
        }
        return SP_OK;
    }
    if (sp_gguf_kv_type(g, ki) == SP_GGUF_TYPE_ARRAY) {
        sp_gguf_arr_t a;
        sp_status_t st = sp_gguf_get_arr(g, key, &a, err, err_len);
        if (st != SP_OK) {
            return st;
        }
        if (a.data == NULL || a.n != (uint64_t)hp->n_layer ||
            a.elem_type == SP_GGUF_TYPE_FLOAT32 || a.elem_type == SP_GGUF_TYPE_FLOAT64) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: key '%s' must be an integer or an array of %lld integers (one "
                           "per layer)", path, key, (long long)hp->n_layer);
        }
        for (int64_t il = 0; il < hp->n_layer; il++) {
            const int64_t v = sp_gguf_arr_int(&a, (uint64_t)il);
            if (v < lo || v > hi) {
                return sp_errf(err, err_len, SP_ERR_FORMAT,
                               "%s: key '%s'[%lld] = %lld out of range [%lld, %lld]", path, key,
                               (long long)il, (long long)v, (long long)lo, (long long)hi);
            }
            out[il] = (int32_t)v;
        }
        return SP_OK;
    }
    int64_t v;
    sp_status_t st = sp_gguf_get_int(g, key, &v, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    if (v < lo || v > hi) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s' = %lld out of range [%lld, %lld]",
                       path, key, (long long)v, (long long)lo, (long long)hi);
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        out[il] = (int32_t)v;
    }
    return SP_OK;
}

sp_status_t
sp__gemma4_layer_sizes(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len)
{
    sp_status_t st;
    if ((st = get_per_layer(g, hp, "attention.head_count_kv", hp->n_head, 1, hp->n_head,
                            hp->layer_n_head_kv, err, err_len)) != SP_OK ||
        (st = get_per_layer(g, hp, "feed_forward_length", -1, 1, 1 << 22, hp->layer_n_ff, err,
                            err_len)) != SP_OK) {
        return st;
    }
    hp->n_head_kv = 0;
    hp->n_ff = 0;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        if (hp->n_head % hp->layer_n_head_kv[il] != 0) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: attention.head_count (%lld) is not a multiple of layer %lld's "
                           "head_count_kv (%d)", sp_gguf_path(g), (long long)hp->n_head,
                           (long long)il, hp->layer_n_head_kv[il]);
        }
        hp->n_head_kv = hp->layer_n_head_kv[il] > hp->n_head_kv ? hp->layer_n_head_kv[il]
                                                                : hp->n_head_kv;
        hp->n_ff = hp->layer_n_ff[il] > hp->n_ff ? hp->layer_n_ff[il] : hp->n_ff;
    }
    return SP_OK;
}

sp_status_t
sp__gemma4_hparams(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    char key[128];
    sp_status_t st;
    int64_t n_shared, v_len_swa;

    /* No query scale (the q norm does it), gemma's embedding scale and GELU. */
    hp->attn_scale = 1.0f;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->ffn_act = SP_FFN_GELU;
    hp->v_norm = true;
    hp->rope_freqs_global = true;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", hp->arch);
    if (sp_gguf_find_key(g, key) < 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s'", path, key);
    }
    if ((st = sp__hp_float(g, hp->arch, "final_logit_softcapping", 0.0, 0, 1e6, &hp->final_softcap,
                           err, err_len)) != SP_OK ||
        (st = sp__hp_int(g, hp->arch, "attention.sliding_window", -1, 1, SP_MAX_CTX, &hp->n_swa,
                         err, err_len)) != SP_OK ||
        (st = sp__hp_int(g, hp->arch, "attention.key_length_swa", -1, 2, MAX_WIDTH,
                         &hp->head_dim_swa, err, err_len)) != SP_OK ||
        (st = sp__hp_int(g, hp->arch, "attention.value_length_swa", -1, 1, MAX_WIDTH, &v_len_swa,
                         err, err_len)) != SP_OK ||
        (st = sp__hp_int(g, hp->arch, "rope.dimension_count_swa", hp->n_rot, 2, hp->head_dim_swa,
                         &hp->n_rot_swa, err, err_len)) != SP_OK ||
        (st = sp__hp_float(g, hp->arch, "rope.freq_base_swa", 10000.0, 1e-3, 1e12,
                           &hp->rope_base_swa, err, err_len)) != SP_OK ||
        (st = sp__hp_int(g, hp->arch, "attention.shared_kv_layers", 0, 0, hp->n_layer - 1,
                         &n_shared, err, err_len)) != SP_OK ||
        (st = sp__hp_int(g, hp->arch, "embedding_length_per_layer_input", -1, 0, MAX_WIDTH,
                         &hp->n_embd_pl, err, err_len)) != SP_OK) {
        return st;
    }
    if (v_len_swa != hp->head_dim_swa) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: %s.attention.value_length_swa %lld != key_length_swa %lld (gemma4 "
                       "needs equal key and value widths)", path, hp->arch, (long long)v_len_swa,
                       (long long)hp->head_dim_swa);
    }
    if (hp->n_rot_swa % 2 != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: %s.rope.dimension_count_swa %lld is odd",
                       path, hp->arch, (long long)hp->n_rot_swa);
    }
    hp->rope_scale_swa = 1.0f; /* llama.cpp: the sliding layers' scale is 1 */

    /* The layer kinds: one bool (or integer) per layer, true = sliding; a single value
     * applies to every layer (get_key_or_arr). */
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch);
    const int64_t ki = sp_gguf_find_key(g, key);
    if (ki < 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s'", path, key);
    }
    if (sp_gguf_kv_type(g, ki) == SP_GGUF_TYPE_BOOL) {
        bool all;
        if ((st = sp_gguf_get_bool(g, key, &all, err, err_len)) != SP_OK) {
            return st;
        }
        for (int64_t il = 0; il < hp->n_layer; il++) {
            hp->layer_swa[il] = all;
        }
    } else {
        int32_t *kind = sp_malloc((size_t)hp->n_layer * sizeof(int32_t));
        if (kind == NULL) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
        }
        st = get_per_layer(g, hp, "attention.sliding_window_pattern", -1, 0, 1, kind, err,
                           err_len);
        for (int64_t il = 0; st == SP_OK && il < hp->n_layer; il++) {
            hp->layer_swa[il] = kind[il] != 0;
        }
        sp_free(kind);
        if (st != SP_OK) {
            return st;
        }
    }

    /* Shared KV: the last n_shared layers read the cache of the last earlier layer of their
     * kind (llama.cpp: n_layer_kv - 2 for a sliding layer, n_layer_kv - 1 for a global
     * one), which must have the same kind (the head width and window come with it). */
    hp->n_layer_kv = hp->n_layer - n_shared;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        hp->layer_kv_src[il] = (int32_t)il;
    }
    if (n_shared > 0) {
        if (hp->n_layer_kv < 2) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: %s.attention.shared_kv_layers %lld leaves %lld layers with a "
                           "cache (at least 2 needed)", path, hp->arch, (long long)n_shared,
                           (long long)hp->n_layer_kv);
        }
        for (int64_t il = hp->n_layer_kv; il < hp->n_layer; il++) {
            const int64_t src = hp->n_layer_kv - (hp->layer_swa[il] ? 2 : 1);
            if (hp->layer_swa[src] != hp->layer_swa[il] ||
                hp->layer_n_head_kv[src] != hp->layer_n_head_kv[il]) {
                return sp_errf(err, err_len, SP_ERR_FORMAT,
                               "%s: layer %lld shares the KV cache of layer %lld, which is of "
                               "another kind (sliding_window_pattern / head_count_kv)",
                               path, (long long)il, (long long)src);
            }
            hp->layer_kv_src[il] = (int32_t)src;
        }
    }
    return SP_OK;
}

sp_status_t
sp__gemma4_load_weights(sp_model_t *m, char *err, size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    const char *path = sp_gguf_path(m->gguf);
    const int64_t E = hp->n_embd, P = hp->n_embd_pl;
    sp_status_t st;
    char name[96];

    if (P > 0) {
        if ((st = sp__model_weight(m, "per_layer_token_embd.weight", P * hp->n_layer, hp->n_vocab,
                                   true, &m->pl_tok_embd, err, err_len)) != SP_OK ||
            (st = sp__model_weight(m, "per_layer_model_proj.weight", E, P * hp->n_layer, true,
                                   &m->pl_model_proj, err, err_len)) != SP_OK ||
            (st = sp__model_vector(m, "per_layer_proj_norm.weight", P, true, &m->pl_proj_norm,
                                   err, err_len)) != SP_OK) {
            return st;
        }
    }
    bool any_global = false;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        any_global |= !hp->layer_swa[il];
    }
    if (any_global && m->rope_freqs == NULL) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: missing tensor 'rope_freqs.weight' (the global layers' RoPE factors)",
                       path);
    }
    /* The mixture-of-experts variant (26B-A4B: expert_count >= 2): every layer's
     * experts and router, beside its dense MLP (engine/moe.c). */
    if ((st = sp__moe_load(m, false, err, err_len)) != SP_OK) {
        return st;
    }
    m->ones = sp_malloc((size_t)sp__head_dim_max(hp) * sizeof(float));
    m->layers = sp_calloc((size_t)hp->n_layer, sizeof(sp_layer_t));
    if (m->ones == NULL || m->layers == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int64_t i = 0; i < sp__head_dim_max(hp); i++) {
        m->ones[i] = 1.0f;
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        sp_layer_t *L = &m->layers[il];
        const int64_t hd = sp__layer_head_dim(hp, il), q_dim = hp->n_head * hd;
        const int64_t kv_dim = sp__layer_n_head_kv(hp, il) * hd, ff = sp__layer_n_ff(hp, il);
#define W(field, nm, n_in, n_out, req)                                                       \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                    \
    st = sp__model_weight(m, name, n_in, n_out, req, &L->field, err, err_len);               \
    if (st != SP_OK && !(st == SP_ERR_NOT_FOUND && !(req))) return st;
#define V(field, nm, n, req)                                                                 \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                    \
    if ((st = sp__model_vector(m, name, n, req, &L->field, err, err_len)) != SP_OK) return st;
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)il);
        if (m->moe == NULL && sp_gguf_find_tensor(m->gguf, name) != NULL) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tensor '%s' (a router) in a file without %s.expert_count >= 2",
                           path, name, hp->arch);
        }
        V(attn_norm, "attn_norm", E, true);
        W(wq, "attn_q", E, q_dim, true);
        V(attn_q_norm, "attn_q_norm", hd, true);
        if (il < sp__n_layer_kv(hp)) {
            /* A layer that shares an earlier cache never reads its own k/v tensors (a file may
             * still carry them: ignored, as llama.cpp does). */
            W(wk, "attn_k", E, kv_dim, true);
            W(wv, "attn_v", E, kv_dim, false); /* absent: the values are the keys */
            V(attn_k_norm, "attn_k_norm", hd, true);
        }
        W(wo, "attn_output", q_dim, E, true);
        V(attn_post_norm, "post_attention_norm", E, true);
        V(ffn_norm, "ffn_norm", E, true);
        W(w_gate, "ffn_gate", E, ff, true);
        W(w_up, "ffn_up", E, ff, true);
        W(w_down, "ffn_down", ff, E, true);
        V(ffn_post_norm, "post_ffw_norm", E, true);
        if (sp__moe_layer(m, il)) {
            /* the experts themselves are moe.c's (sp__moe_load) */
            V(ffn_pre_norm_2, "pre_ffw_norm_2", E, true);
            V(ffn_post_norm_1, "post_ffw_norm_1", E, true);
            V(ffn_post_norm_2, "post_ffw_norm_2", E, true);
        }
        V(out_scale, "layer_output_scale", 1, false);
        if (P > 0) {
            W(pl_gate, "inp_gate", E, P, true);
            W(pl_proj, "proj", P, E, true);
            V(pl_post_norm, "post_norm", E, true);
        }
#undef W
#undef V
    }
    return SP_OK;
}
