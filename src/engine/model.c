/*
 * model.c - loading a GGUF model of one of the dense architectures the
 * forward pass runs (SUPPORTED_ARCHS; the contexts that run one sequence over
 * it are ctx.c's).
 *
 * Load: read hyper-parameters from `<arch>.*` keys, check them (RELIABILITY.md
 * G17: layer and head counts, divisibility) before sizing anything, then find
 * every tensor and check its shape and type against them. Weights stay in the
 * read-only mapping; the model only keeps typed pointers (llama2.c's
 * memory_map_weights, with the checks it lacked).
 */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "crypto/enc.h"
#include "engine/mla.h"
#include "engine/model_impl.h"
#include "engine/moe.h"
#include "engine/yarn.h"
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
    {"qwen3", SP_ROPE_NEOX},
    /* mixture of experts (engine/moe.c; Mixtral is llama with expert_count) */
    {"qwen2moe", SP_ROPE_NEOX},
    {"qwen3moe", SP_ROPE_NEOX},
    {"gemma2", SP_ROPE_NEOX},
    {"gemma3", SP_ROPE_NEOX},
    {"gemma4", SP_ROPE_NEOX}, /* dense; per-layer sizes and inputs: gemma4.c */
    {"phi3", SP_ROPE_NEOX},
    {"smollm3", SP_ROPE_NORMAL},
    {"granite", SP_ROPE_NORMAL},
    {"olmo2", SP_ROPE_NEOX},
    /* gpt-oss: experts in every layer, alternating sliding window, attention
     * sinks and output bias, YaRN */
    {"gpt-oss", SP_ROPE_NEOX},
    /* multi-head latent attention (engine/mla.c), dense then MoE layers */
    {"deepseek2", SP_ROPE_NORMAL},
};

/* The list the refusal of an unknown architecture names. */
#define SUPPORTED_ARCHS \
    "llama, mistral, qwen2, qwen3, gemma2, gemma3, gemma4, phi3, smollm3, granite, olmo2, qwen2moe, " \
    "qwen3moe, gpt-oss, deepseek2, bert, nomic-bert"

static bool
arch_is(const sp_hparams_t *hp, const char *name)
{
    return strcmp(hp->arch, name) == 0;
}

/*
 * What the architectures beyond the llama family read (llama.cpp's reading of
 * the same keys, with its defaults): the query scale, gemma's embedding
 * scale, soft-caps and sliding-window layers (layer il slides when
 * il % P < P - 1 for the pattern P, every layer when P is 0), gemma3's RoPE
 * base of the sliding layers, phi3's LongRoPE keys and window, smollm3's
 * no-RoPE layers.
 */
static sp_status_t
load_arch_hparams(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len)
{
    sp_status_t st = SP_OK;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = 1.0f;
    hp->ffn_act = SP_FFN_SILU;
    hp->rope_base_swa = hp->rope_base;
    hp->rope_scale_swa = hp->rope_scale;
    hp->n_ctx_orig = hp->n_ctx_train;
    hp->rope_attn_factor = 1.0f;
    hp->residual_scale = 1.0f;
    hp->logit_scale = 1.0f;
    const bool g2 = arch_is(hp, "gemma2"), g3 = arch_is(hp, "gemma3");
    if (g2 || g3) {
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->ffn_act = SP_FFN_GELU;
        /* The 27B models scale by the width per head instead of head_dim. */
        if (hp->n_layer == (g2 ? 46 : 62)) {
            hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
        }
        if ((st = sp__hp_float(g, hp->arch, "final_logit_softcapping", g2 ? 30.0 : 0.0, 0, 1e6,
                               &hp->final_softcap, err, err_len)) != SP_OK) {
            return st;
        }
        if (g2 &&
            (st = sp__hp_float(g, hp->arch, "attn_logit_softcapping", 50.0, 0, 1e6,
                               &hp->attn_softcap, err, err_len)) != SP_OK) {
            return st;
        }
        if ((st = sp__hp_int(g, hp->arch, "attention.sliding_window", g2 ? 4096 : 0, 0, SP_MAX_CTX,
                             &hp->n_swa, err, err_len)) != SP_OK) {
            return st;
        }
        if (hp->n_swa > 0) {
            int64_t period;
            if ((st = sp__hp_int(g, hp->arch, "attention.sliding_window_pattern", g2 ? 2 : 6, 0,
                                 SP_MAX_LAYERS, &period, err, err_len)) != SP_OK) {
                return st;
            }
            for (int64_t il = 0; il < hp->n_layer; il++) {
                hp->layer_swa[il] = period == 0 || il % period < period - 1;
            }
            if (g3) {
                /* Sliding layers: their own base (10000 unless the file says), unscaled. */
                hp->rope_scale_swa = 1.0f;
                if ((st = sp__hp_float(g, hp->arch, "rope.freq_base_swa", 10000.0, 1e-3, 1e12,
                                       &hp->rope_base_swa, err, err_len)) != SP_OK) {
                    return st;
                }
            } else if ((st = sp__hp_float(g, hp->arch, "rope.freq_base_swa", hp->rope_base, 1e-3,
                                          1e12, &hp->rope_base_swa, err, err_len)) != SP_OK) {
                return st;
            }
        }
    } else if (arch_is(hp, "gemma4")) {
        return sp__gemma4_hparams(g, hp, err, err_len);
    } else if (arch_is(hp, "gpt-oss")) {
        /* A window is required; every other layer slides (pattern 2: layer il
         * slides when il is even), both kinds with the same RoPE. */
        int64_t period;
        if ((st = sp__hp_int(g, hp->arch, "attention.sliding_window", -1, 1, SP_MAX_CTX, &hp->n_swa,
                             err, err_len)) != SP_OK ||
            (st = sp__hp_int(g, hp->arch, "attention.sliding_window_pattern", 2, 0, SP_MAX_LAYERS,
                             &period, err, err_len)) != SP_OK ||
            (st = sp__hp_float(g, hp->arch, "rope.freq_base_swa", hp->rope_base, 1e-3, 1e12,
                               &hp->rope_base_swa, err, err_len)) != SP_OK) {
            return st;
        }
        for (int64_t il = 0; il < hp->n_layer; il++) {
            hp->layer_swa[il] = period == 0 || il % period < period - 1;
        }
    } else if (arch_is(hp, "phi3")) {
        if ((st = sp__hp_int(g, hp->arch, "attention.sliding_window", 0, 0, SP_MAX_CTX, &hp->n_swa,
                             err, err_len)) != SP_OK ||
            (st = sp__hp_int(g, hp->arch, "rope.scaling.original_context_length", hp->n_ctx_train,
                             1, SP_MAX_CTX, &hp->n_ctx_orig, err, err_len)) != SP_OK ||
            (st = sp__hp_float(g, hp->arch, "rope.scaling.attn_factor", 1.0, 1e-3, 1e3,
                               &hp->rope_attn_factor, err, err_len)) != SP_OK) {
            return st;
        }
        for (int64_t il = 0; il < hp->n_layer && hp->n_swa > 0; il++) {
            hp->layer_swa[il] = 1;
        }
    } else if (arch_is(hp, "granite")) {
        /* logit_scale is required (as llama.cpp reads it); the others are optional, 0 in the
         * file meaning none like an absent key. */
        float attn_scale = 0.0f, embd_scale = 0.0f, res_scale = 0.0f;
        int64_t n_expert;
        bool finetuned = true;
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.finetuned", hp->arch);
        st = sp_gguf_get_bool(g, key, &finetuned, err, err_len);
        if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
            return st;
        }
        snprintf(key, sizeof key, "%s.logit_scale", hp->arch);
        if (sp_gguf_find_key(g, key) < 0) {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s'",
                           sp_gguf_path(g), key);
        }
        if ((st = sp__hp_float(g, hp->arch, "logit_scale", 1.0, 1e-6, 1e6, &hp->logit_scale, err,
                               err_len)) != SP_OK ||
            (st = sp__hp_float(g, hp->arch, "attention.scale", 0.0, 0, 1e6, &attn_scale, err,
                               err_len)) != SP_OK ||
            (st = sp__hp_float(g, hp->arch, "embedding_scale", 0.0, 0, 1e6, &embd_scale, err,
                               err_len)) != SP_OK ||
            (st = sp__hp_float(g, hp->arch, "residual_scale", 0.0, 0, 1e6, &res_scale, err,
                               err_len)) != SP_OK ||
            (st = sp__hp_int(g, hp->arch, "expert_count", 0, 0, 1 << 16, &n_expert, err,
                             err_len)) != SP_OK) {
            return st;
        }
        if (n_expert > 0) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                           "%s: granite with %s.expert_count %lld (mixture of experts) is not "
                           "supported", sp_gguf_path(g), hp->arch, (long long)n_expert);
        }
        hp->attn_scale = attn_scale > 0.0f ? attn_scale : hp->attn_scale;
        hp->embd_scale = embd_scale > 0.0f ? embd_scale : 1.0f;
        hp->residual_scale = res_scale > 0.0f ? res_scale : 1.0f;
        /* llama.cpp fills granite's RoPE pattern with rope.scaling.finetuned: false = no
         * layer rotates. */
        for (int64_t il = 0; il < hp->n_layer && !finetuned; il++) {
            hp->layer_nope[il] = 1;
        }
    } else if (arch_is(hp, "olmo2")) {
        hp->qk_norm_full = true;
        if ((st = sp__hp_int(g, hp->arch, "attention.sliding_window", 0, 0, SP_MAX_CTX, &hp->n_swa,
                             err, err_len)) != SP_OK) {
            return st;
        }
        if (hp->n_swa > 0) {
            /* olmo3: pattern 4 by default; sliding layers keep the base, unscaled. */
            int64_t period;
            if ((st = sp__hp_int(g, hp->arch, "attention.sliding_window_pattern", 4, 0,
                                 SP_MAX_LAYERS, &period, err, err_len)) != SP_OK ||
                (st = sp__hp_float(g, hp->arch, "rope.freq_base_swa", hp->rope_base, 1e-3, 1e12,
                                   &hp->rope_base_swa, err, err_len)) != SP_OK) {
                return st;
            }
            hp->rope_scale_swa = 1.0f;
            for (int64_t il = 0; il < hp->n_layer; il++) {
                hp->layer_swa[il] = period == 0 || il % period < period - 1;
            }
        }
    } else if (arch_is(hp, "smollm3")) {
        for (int64_t il = 0; il < hp->n_layer; il++) {
            hp->layer_nope[il] = (il + 1) % 4 == 0;
        }
    }
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
                       "%s: general.architecture '%.*s' is not supported (" SUPPORTED_ARCHS ")",
                       path, (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    }
    snprintf(hp->arch, sizeof hp->arch, "%s", ai->name);
    hp->rope_type = ai->rope_type;

#define HP_INT(field, suffix, dflt, lo, hi)                                                        \
    do {                                                                                           \
        st = sp__hp_int(g, hp->arch, suffix, dflt, lo, hi, &hp->field, err, err_len);              \
        if (st != SP_OK) return st;                                                                \
    } while (0)

    HP_INT(n_embd, "embedding_length", -1, 1, 1 << 20);
    HP_INT(n_layer, "block_count", -1, 1, SP_MAX_LAYERS);
    HP_INT(n_head, "attention.head_count", -1, 1, MAX_HEADS);
    if (arch_is(hp, "gemma4")) {
        /* KV heads and FFN width may be per-layer arrays (their largest go in hp). */
        if ((st = sp__gemma4_layer_sizes(g, hp, err, err_len)) != SP_OK) {
            return st;
        }
    } else {
        HP_INT(n_head_kv, "attention.head_count_kv", hp->n_head, 1, hp->n_head);
        HP_INT(n_ff, "feed_forward_length", -1, 1, 1 << 22);
    }
    HP_INT(n_ctx_train, "context_length", -1, 1, SP_MAX_CTX);
    if (hp->n_head % hp->n_head_kv != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: attention.head_count (%lld) is not a multiple of head_count_kv (%lld)",
                       path, (long long)hp->n_head, (long long)hp->n_head_kv);
    }
    if (sp__mla_arch(hp->arch)) {
        /* The latent cache's head; the per-head widths are hp->mla_* (mla.c). */
        if ((st = sp__mla_hparams(g, hp, err, err_len)) != SP_OK) {
            return st;
        }
        goto widths_done;
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
    st = sp__hp_int(g, hp->arch, "attention.value_length", hp->head_dim, 1, 1 << 14, &v_len, err,
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
widths_done:
#undef HP_INT
    st = sp__hp_float(g, hp->arch, "attention.layer_norm_rms_epsilon", 1e-5, 0, 1, &hp->norm_eps,
                      err, err_len);
    if (st == SP_OK) {
        st = sp__hp_float(g, hp->arch, "rope.freq_base", 10000.0, 1e-3, 1e12, &hp->rope_base, err,
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
    if (st == SP_OK && sp_str_eq_c(stype, "yarn")) {
        /* then the architecture's own keys, as for any other scaling */
        st = sp__yarn_load(g, hp, err, err_len);
        return st == SP_OK ? load_arch_hparams(g, hp, err, err_len) : st;
    }
    if (st == SP_OK && !linear && !sp_str_eq_c(stype, "none")) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: %s '%.*s' is not supported (none, linear, yarn)", path, key,
                       (int)(stype.len > 32 ? 32 : stype.len), stype.ptr);
    }
    if (linear || st == SP_ERR_NOT_FOUND) {
        /* Older files carry only rope.scale_linear. */
        const char *suffix = linear ? "rope.scaling.factor" : "rope.scale_linear";
        st = sp__hp_float(g, hp->arch, suffix, 1.0, 1e-3, 1e6, &hp->rope_scale, err, err_len);
        if (st != SP_OK) {
            return st;
        }
        if (hp->rope_scale == 0.0f) {
            hp->rope_scale = 1.0f;
        }
    }
    return load_arch_hparams(g, hp, err, err_len);
}

/* Rows r0..r0+n-1 of w as a matrix of their own (a fused tensor's part). */
static sp_weight_t
weight_rows(const sp_weight_t *w, int64_t r0, int64_t n)
{
    sp_weight_t v = *w;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.n_out = n;
    return v;
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
    st = sp__model_weight(m, "token_embd.weight", hp->n_embd, hp->n_vocab, true, &m->tok_embd, err,
                          err_len);
    if (st != SP_OK) {
        return st;
    }
    /* gemma2 always multiplies by the embedding (llama.cpp ignores an output.weight). */
    st = arch_is(hp, "gemma2") ? SP_ERR_NOT_FOUND
                               : sp__model_weight(m, "output.weight", hp->n_embd, hp->n_vocab,
                                                  false, &m->output, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        m->output = m->tok_embd;
        m->hp.tied_output = true;
    } else if (st != SP_OK) {
        return st;
    }
    st = sp__model_vector(m, "output_norm.weight", hp->n_embd, true, &m->output_norm, err, err_len);
    if (st == SP_OK) {
        /* gemma4's factors span the global layers' whole head (n_rot may be less). */
        st = sp__model_vector(m, "rope_freqs.weight",
                              (arch_is(hp, "gemma4") ? hp->head_dim : hp->n_rot) / 2, false,
                              &m->rope_freqs, err, err_len);
    }
    if (st == SP_OK && arch_is(hp, "gemma4")) {
        st = sp__gemma4_load_weights(m, err, err_len);
        for (int64_t i = 0; st == SP_OK && i < sp_gguf_n_tensors(m->gguf); i++) {
            m->weight_bytes += sp_gguf_tensor(m->gguf, i)->nbytes;
        }
        return st;
    }
    if (st == SP_OK && arch_is(hp, "phi3")) {
        st = sp__model_vector(m, "rope_factors_long.weight", hp->n_rot / 2, false, &m->rope_long,
                              err, err_len);
        if (st == SP_OK) {
            st = sp__model_vector(m, "rope_factors_short.weight", hp->n_rot / 2, false,
                                  &m->rope_short, err, err_len);
        }
        if (st == SP_OK && (m->rope_long == NULL) != (m->rope_short == NULL)) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: tensor 'rope_factors_%s.weight' is missing (LongRoPE needs both "
                           "factor sets)", path, m->rope_long == NULL ? "long" : "short");
        }
    }
    if (st != SP_OK) {
        return st;
    }
    const bool olmo2 = arch_is(hp, "olmo2");
    const bool qk_norm = arch_is(hp, "qwen3") || arch_is(hp, "qwen3moe") || arch_is(hp, "gemma3") || olmo2;
    const bool post_norms = arch_is(hp, "gemma2") || arch_is(hp, "gemma3") || olmo2;
    const bool phi3 = arch_is(hp, "phi3");
    const bool gptoss = arch_is(hp, "gpt-oss");
    const bool mla = sp__mla_arch(hp->arch);

    m->layers = sp_calloc((size_t)hp->n_layer, sizeof(sp_layer_t));
    if (m->layers == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    /* The MoE block replaces the dense FFN where the file has experts. */
    if ((st = sp__moe_load(m, false, err, err_len)) != SP_OK) {
        return st;
    }
    /* Latent attention replaces q/k/v/o (and sets the query scale). */
    if (mla && (st = sp__mla_load(m, err, err_len)) != SP_OK) {
        return st;
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        sp_layer_t *L = &m->layers[il];
#define W(field, nm, n_in, n_out)                                                        \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                \
    if ((st = sp__model_weight(m, name, n_in, n_out, true, &L->field, err, err_len)) != SP_OK) \
        return st;
#define V(field, nm, suffix, n, req)                                                     \
    snprintf(name, sizeof name, "blk.%lld." nm "." suffix, (long long)il);               \
    if ((st = sp__model_vector(m, name, n, req, &L->field, err, err_len)) != SP_OK)            \
        return st;
        if (gptoss) {
            /* gpt-oss names its FFN pre-norm post_attention_norm (it normalises
             * the sum after the attention's residual add, i.e. the FFN input). */
            V(attn_norm, "attn_norm", "weight", hp->n_embd, true);
            V(ffn_norm, "post_attention_norm", "weight", hp->n_embd, true);
            V(bo, "attn_output", "bias", hp->n_embd, true);
            V(attn_sinks, "attn_sinks", "weight", hp->n_head, true);
        } else if (!olmo2) { /* olmo2 has no pre-norms */
            V(attn_norm, "attn_norm", "weight", hp->n_embd, true);
            V(ffn_norm, "ffn_norm", "weight", hp->n_embd, true);
        }
        snprintf(name, sizeof name, "blk.%lld.attn_qkv.weight", (long long)il);
        if (mla) {
            /* the attention tensors are mla.c's (sp__mla_load) */
        } else if (phi3 && sp_gguf_find_tensor(m->gguf, name) != NULL) {
            /* One matrix: q rows, then k rows, then v rows. */
            sp_weight_t qkv;
            if ((st = sp__model_weight(m, name, hp->n_embd, q_dim + 2 * kv_dim, true, &qkv,
                                       err, err_len)) != SP_OK) {
                return st;
            }
            L->wq = weight_rows(&qkv, 0, q_dim);
            L->wk = weight_rows(&qkv, q_dim, kv_dim);
            L->wv = weight_rows(&qkv, q_dim + kv_dim, kv_dim);
        } else {
            W(wq, "attn_q", hp->n_embd, q_dim);
            W(wk, "attn_k", hp->n_embd, kv_dim);
            W(wv, "attn_v", hp->n_embd, kv_dim);
        }
        if (!mla) {
            W(wo, "attn_output", q_dim, hp->n_embd);
        }
        if (post_norms) {
            V(attn_post_norm, "post_attention_norm", "weight", hp->n_embd, true);
            V(ffn_post_norm, "post_ffw_norm", "weight", hp->n_embd, true);
        }
        if (!mla) {
            V(bq, "attn_q", "bias", q_dim, gptoss);
            V(bk, "attn_k", "bias", kv_dim, gptoss);
            V(bv, "attn_v", "bias", kv_dim, gptoss);
        }
        if (arch_is(hp, "granite")) {
            /* llama.cpp adds these biases when present; this engine has no place for them. */
            static const char *const biases[] = {"attn_output", "ffn_gate", "ffn_up", "ffn_down"};
            for (size_t i = 0; i < sizeof biases / sizeof biases[0]; i++) {
                snprintf(name, sizeof name, "blk.%lld.%s.bias", (long long)il, biases[i]);
                if (sp_gguf_find_tensor(m->gguf, name) != NULL) {
                    return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                                   "%s: tensor '%s' (a granite bias) is not supported", path, name);
                }
            }
        }
        if (qk_norm) {
            V(attn_q_norm, "attn_q_norm", "weight", olmo2 ? q_dim : hp->head_dim, true);
            V(attn_k_norm, "attn_k_norm", "weight", olmo2 ? kv_dim : hp->head_dim, true);
        }
        if (sp__moe_layer(m, il)) {
            continue; /* the experts are moe.c's (sp__moe_load) */
        }
        if (phi3) {
            /* ffn_up holds the gate rows, then the up rows. */
            sp_weight_t gu;
            snprintf(name, sizeof name, "blk.%lld.ffn_up.weight", (long long)il);
            if ((st = sp__model_weight(m, name, hp->n_embd, 2 * hp->n_ff, true, &gu, err,
                                       err_len)) != SP_OK) {
                return st;
            }
            L->w_gate = weight_rows(&gu, 0, hp->n_ff);
            L->w_up = weight_rows(&gu, hp->n_ff, hp->n_ff);
        } else {
            W(w_gate, "ffn_gate", hp->n_embd, hp->n_ff);
            W(w_up, "ffn_up", hp->n_embd, hp->n_ff);
        }
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
    sp_str_t arch = {0};
    if (sp_gguf_get_str(g, "general.architecture", &arch, NULL, 0) == SP_OK &&
        sp__encoder_arch(arch)) {
        st = sp__encoder_load(m, arch, err, err_len); /* bert, nomic-bert: encoder.c */
    } else if ((st = load_hparams(g, &m->hp, err, err_len)) == SP_OK) {
        st = load_weights(m, err, err_len);
    }
    if (st != SP_OK || (st = sp_tokenizer_from_gguf(g, &m->tok, err, err_len)) != SP_OK) {
        goto fail;
    }
    if (m->enc != NULL) {
        sp__encoder_set_sep(m->enc, sp_tokenizer_sep(m->tok));
    }
    sp_gguf_prefault(g);
    if ((st = sp__model_repack(m, err, err_len)) != SP_OK) {
        goto fail;
    }
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
    if (m->gpu != NULL) {
        SP_ASSERT(m->gpu_release != NULL); /* a binding always comes with its release hook */
        m->gpu_release(m->gpu);
    }
    sp_tokenizer_destroy(m->tok);
    sp__encoder_free(m->enc);
    sp_free(m->layers);
    sp_free(m->ones);
    sp__moe_free(m->moe);
    sp__mla_free(m->mla);
    sp_free(m->packed_mem);
    sp_gguf_close(m->gguf);
    sp_free(m);
}

const char *
sp__model_cpu_only_feature(const sp_model_t *m)
{
    /* What the CUDA path (gpu.c) runs besides the llama family: per-head and
     * whole-projection q/k norms, pre- and post-norms each optional (olmo2
     * has post-norms only), sliding windows (every block kept on the device),
     * attention and final soft-capping, GELU, the embedding, query, residual
     * and logit scales, the sliding layers' own RoPE base, layers without
     * RoPE, LongRoPE and YaRN tables with their attention factor, attention
     * sinks and an output bias. Everything else is named here. */
    const sp_hparams_t *hp = &m->hp;
    if (arch_is(hp, "gemma4")) {
        return m->moe != NULL ? "the gemma4 architecture with mixture of experts (experts "
                                "beside a dense MLP, per-layer head sizes)"
                              : "the gemma4 architecture (per-layer inputs, shared KV layers, "
                                "per-layer head sizes)";
    }
    if (m->mla != NULL) {
        return "multi-head latent attention (deepseek2)";
    }
    if (hp->head_dim_swa > 0 || hp->n_rot_swa > 0 || hp->n_layer_kv > 0 || hp->v_norm ||
        hp->n_embd_pl > 0) {
        return "per-layer head sizes, shared KV layers or value norms";
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        if (hp->layer_n_head_kv[il] > 0 || hp->layer_n_ff[il] > 0) {
            return "per-layer head sizes, shared KV layers or value norms";
        }
    }
    if (hp->ffn_act != SP_FFN_SILU && hp->ffn_act != SP_FFN_GELU) {
        return "a feed-forward activation other than SiLU and GELU";
    }
    return NULL;
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

