/*
 * quant_mix.c - the per-tensor type choice of llama.cpp's quantization mixes (see
 * quant_mix.h). Written from the behaviour of llama.cpp's quantizer (llama-quant.cpp): the
 * same categories of tensors, the same layer pattern and the same fallbacks, so that a model
 * quantized here and there has the same tensor types.
 *
 * Order matters: the attn_v and ffn_down rules count tensors as they are visited, and
 * llama.cpp visits them sorted by layer number (tensors outside blk.N first) and then by
 * name, whatever the file order. The plan visits them in that order too.
 *
 * Threads: none. Memory: one index array of n_tensors entries, freed before returning.
 */
#include "tools/quant_mix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"

/* LLAMA_FTYPE_* numbers, the identity of a mix */
enum {
    FT_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7, FT_Q5_0 = 8, FT_Q5_1 = 9,
    FT_Q2_K = 10, FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13, FT_Q4_K_S = 14,
    FT_Q4_K_M = 15, FT_Q5_K_S = 16, FT_Q5_K_M = 17, FT_Q6_K = 18, FT_IQ4_NL = 25,
    FT_IQ4_XS = 30, FT_BF16 = 32
};

static const sp_quant_mix_t mixes[] = {
    {"F32", FT_F32, SP_TYPE_F32},         {"F16", FT_F16, SP_TYPE_F16},
    {"BF16", FT_BF16, SP_TYPE_BF16},      {"Q8_0", FT_Q8_0, SP_TYPE_Q8_0},
    {"Q6_K", FT_Q6_K, SP_TYPE_Q6_K},      {"Q5_K_M", FT_Q5_K_M, SP_TYPE_Q5_K},
    {"Q5_K_S", FT_Q5_K_S, SP_TYPE_Q5_K},  {"Q5_1", FT_Q5_1, SP_TYPE_Q5_1},
    {"Q5_0", FT_Q5_0, SP_TYPE_Q5_0},      {"Q4_K_M", FT_Q4_K_M, SP_TYPE_Q4_K},
    {"Q4_K_S", FT_Q4_K_S, SP_TYPE_Q4_K},  {"Q4_1", FT_Q4_1, SP_TYPE_Q4_1},
    {"Q4_0", FT_Q4_0, SP_TYPE_Q4_0},      {"IQ4_NL", FT_IQ4_NL, SP_TYPE_IQ4_NL},
    {"IQ4_XS", FT_IQ4_XS, SP_TYPE_IQ4_XS}, {"Q3_K_L", FT_Q3_K_L, SP_TYPE_Q3_K},
    {"Q3_K_M", FT_Q3_K_M, SP_TYPE_Q3_K},  {"Q3_K_S", FT_Q3_K_S, SP_TYPE_Q3_K},
    {"Q2_K", FT_Q2_K, SP_TYPE_Q2_K},
};

const sp_quant_mix_t *
sp_quant_mix_find(const char *name)
{
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
        if (strcasecmp(name, mixes[i].name) == 0) {
            return &mixes[i];
        }
    }
    return NULL;
}

const sp_quant_mix_t *
sp_quant_mix_at(size_t i)
{
    return i < sizeof mixes / sizeof mixes[0] ? &mixes[i] : NULL;
}

typedef enum cat {
    CAT_OTHER, CAT_OUTPUT, CAT_TOKEN_EMBD, CAT_ATTN_QKV, CAT_ATTN_KV_B, CAT_ATTN_V, CAT_ATTN_K,
    CAT_ATTN_Q, CAT_ATTN_OUT, CAT_FFN_UP, CAT_FFN_GATE, CAT_FFN_DOWN
} cat_t;

static bool
has(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

/* The tensor's role, from its name (first match wins, as in llama.cpp). */
static cat_t
category(const char *name)
{
    static const struct {
        const char *sub;
        cat_t cat;
    } subs[] = {
        {"attn_qkv.weight", CAT_ATTN_QKV},  {"attn_kv_b.weight", CAT_ATTN_KV_B},
        {"attn_v.weight", CAT_ATTN_V},      {"attn_k.weight", CAT_ATTN_K},
        {"attn_q.weight", CAT_ATTN_Q},      {"attn_output.weight", CAT_ATTN_OUT},
        {"ffn_up", CAT_FFN_UP},             {"ffn_gate", CAT_FFN_GATE},
        {"ffn_down", CAT_FFN_DOWN},
    };
    if (strcmp(name, "output.weight") == 0) {
        return CAT_OUTPUT;
    }
    if (strcmp(name, "token_embd.weight") == 0 || strcmp(name, "per_layer_token_embd.weight") == 0) {
        return CAT_TOKEN_EMBD;
    }
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        if (has(name, subs[i].sub)) {
            return subs[i].cat;
        }
    }
    return CAT_OTHER;
}

/* attn_v and the fused projections that contain V: the most quantization-sensitive */
static bool
is_attn_v(cat_t c)
{
    return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B;
}

/* Whether the tensor is quantized at all: 2-D and larger weights, except norms, expert
 * routers, position / token-type embeddings and the small special matrices of some
 * architectures (kept in their source type, as llama.cpp keeps them). */
static bool
quantizable(const char *name, int n_dims)
{
    static const char *const keep[] = {
        "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
        "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
        "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
        "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
        "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
        "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
        ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
        ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
    };
    size_t n = strlen(name);
    if (n_dims < 2 || n < 6 || strcmp(name + n - 6, "weight") != 0) {
        return false;
    }
    if (strcmp(name, "position_embd.weight") == 0 || strcmp(name, "token_types.weight") == 0) {
        return false;
    }
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        if (has(name, keep[i])) {
            return false;
        }
    }
    return true;
}

/* What the rules need to know about the model, and the running counters. */
typedef struct state {
    uint32_t ft;
    bool falcon, tied, is_70b;
    int n_layer, n_expert, n_gqa;
    int n_attn_v, i_attn_v, i_ffn_down, i_ffn_gate, i_ffn_up;
} state;

/* The layers that get more bits in the _M mixes: the first and last eighth, and every
 * third layer in between. */
static bool
more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The layer of an FFN tensor: its visit counter for dense models; from the name when
 * experts make the counter meaningless. */
static sp_status_t
ffn_layer(const state *s, int counter, const char *name, int *out, char *err, size_t err_len)
{
    if (s->n_expert <= 1) {
        *out = counter;
        return SP_OK;
    }
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1 || l < 0 || l >= s->n_layer) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "tensor '%s': no layer in [0, %d) in its name", name, s->n_layer);
    }
    *out = l;
    return SP_OK;
}

static sp_type_t
bump(sp_type_t t, sp_type_t to, const char **why, const char *reason)
{
    if (to != t) {
        *why = reason;
    }
    return to;
}

/* The mix rules for one quantizable tensor; t starts as the base type. */
static sp_status_t
rules(state *s, const sp_gguf_tensor_t *tn, const char *name, cat_t c, sp_type_t *io,
      const char **why, char *err, size_t err_len)
{
    sp_type_t t = *io;
    uint32_t ft = s->ft;
    if (c == CAT_OUTPUT || (s->tied && c == CAT_TOKEN_EMBD)) {
        if (s->falcon || tn->ne[0] % sp_type_traits(t)->blck_size != 0) {
            t = bump(t, SP_TYPE_Q8_0, why, "output matrix, row not a multiple of the block");
        } else if (t != SP_TYPE_Q8_0) {
            t = bump(t, SP_TYPE_Q6_K, why, "output matrix");
        }
    } else if (c == CAT_TOKEN_EMBD) {
        /* the mixes here keep the base type */
    } else if (is_attn_v(c)) {
        const char *r = "attn_v";
        if (ft == FT_Q2_K) {
            t = bump(t, s->n_gqa >= 4 ? SP_TYPE_Q4_K : SP_TYPE_Q3_K, why, r);
        } else if (ft == FT_Q3_K_M) {
            t = bump(t, s->i_attn_v < 2 ? SP_TYPE_Q5_K : SP_TYPE_Q4_K, why, r);
        } else if (ft == FT_Q3_K_L) {
            t = bump(t, SP_TYPE_Q5_K, why, r);
        } else if ((ft == FT_IQ4_NL || ft == FT_IQ4_XS) && s->n_gqa >= 4) {
            t = bump(t, SP_TYPE_Q5_K, why, "attn_v, grouped-query attention");
        } else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && more_bits(s->i_attn_v, s->n_attn_v)) {
            t = bump(t, SP_TYPE_Q6_K, why, "attn_v, more-bits layer");
        } else if (ft == FT_Q4_K_S && s->i_attn_v < 4) {
            t = bump(t, SP_TYPE_Q5_K, why, "attn_v, first layers");
        }
        if (s->is_70b && (t == SP_TYPE_Q3_K || t == SP_TYPE_Q4_K)) {
            /* 8 heads share each V row there: a few more bits cost little */
            t = bump(t, SP_TYPE_Q5_K, why, "attn_v of a 70B model");
        }
        if (s->n_expert == 8) {
            t = bump(t, SP_TYPE_Q8_0, why, "attn_v of an 8-expert model");
        }
        s->i_attn_v++;
    } else if (c == CAT_ATTN_K) {
        if (s->n_expert == 8) {
            t = bump(t, SP_TYPE_Q8_0, why, "attn_k of an 8-expert model");
        }
    } else if (c == CAT_FFN_DOWN) {
        int i, n = s->n_layer;
        sp_status_t st = ffn_layer(s, s->i_ffn_down, name, &i, err, err_len);
        if (st != SP_OK) {
            return st;
        }
        const char *r = "ffn_down, more-bits layer";
        if (ft == FT_Q2_K) {
            t = bump(t, SP_TYPE_Q3_K, why, "ffn_down");
        } else if (ft == FT_Q3_K_M) {
            t = bump(t, i < n / 16 ? SP_TYPE_Q5_K
                        : !s->falcon || more_bits(i, n) ? SP_TYPE_Q4_K : SP_TYPE_Q3_K, why,
                     "ffn_down");
        } else if (ft == FT_Q3_K_L) {
            t = bump(t, s->falcon ? SP_TYPE_Q4_K : SP_TYPE_Q5_K, why, "ffn_down");
        } else if (ft == FT_Q4_K_M) {
            if (s->falcon) {
                t = bump(t, i < n / 16 ? SP_TYPE_Q6_K : more_bits(i, n) ? SP_TYPE_Q5_K
                                                                        : SP_TYPE_Q4_K, why, r);
            } else if (more_bits(i, n)) {
                t = bump(t, SP_TYPE_Q6_K, why, r);
            }
        } else if (i < n / 8 && (ft == FT_IQ4_NL || ft == FT_IQ4_XS)) {
            t = bump(t, SP_TYPE_Q5_K, why, "ffn_down, first layers");
        } else if (ft == FT_Q5_K_M && more_bits(i, n)) {
            t = bump(t, SP_TYPE_Q6_K, why, r);
        } else if (ft == FT_Q4_K_S && !s->falcon && i < n / 8) {
            t = bump(t, SP_TYPE_Q5_K, why, "ffn_down, first layers");
        }
        s->i_ffn_down++;
    } else if (c == CAT_ATTN_OUT) {
        const char *r = "attn_output";
        if (!s->falcon) {
            if (s->n_expert == 8) {
                if (ft == FT_Q2_K || ft == FT_Q3_K_S || ft == FT_Q3_K_M || ft == FT_IQ4_NL ||
                    ft == FT_Q4_K_S || ft == FT_Q4_K_M || ft == FT_IQ4_XS) {
                    t = bump(t, SP_TYPE_Q5_K, why, "attn_output of an 8-expert model");
                }
            } else if (ft == FT_Q2_K) {
                t = bump(t, SP_TYPE_Q3_K, why, r);
            } else if (ft == FT_Q3_K_M) {
                t = bump(t, SP_TYPE_Q4_K, why, r);
            } else if (ft == FT_Q3_K_L) {
                t = bump(t, SP_TYPE_Q5_K, why, r);
            }
        } else if (ft == FT_Q3_K_L) {
            t = bump(t, SP_TYPE_Q4_K, why, r);
        }
    } else if (c == CAT_FFN_GATE || c == CAT_FFN_UP) {
        int i;
        int *ctr = c == CAT_FFN_GATE ? &s->i_ffn_gate : &s->i_ffn_up;
        sp_status_t st = ffn_layer(s, *ctr, name, &i, err, err_len);
        if (st != SP_OK) {
            return st;
        }
        (*ctr)++;
    }
    *io = t;
    return SP_OK;
}

/* A type whose block does not divide the row length falls back to a 32-block type of
 * about the same size, and to f16 when even that does not fit. */
static sp_status_t
fallback(const sp_gguf_tensor_t *tn, const char *name, sp_type_t *io, const char **why,
         char *err, size_t err_len)
{
    sp_type_t t = *io;
    int64_t ne0 = tn->ne[0];
    if (ne0 % sp_type_traits(t)->blck_size == 0) {
        return SP_OK;
    }
    sp_type_t to;
    switch (t) {
    case SP_TYPE_IQ4_XS: to = SP_TYPE_IQ4_NL; break;
    case SP_TYPE_Q2_K:
    case SP_TYPE_Q3_K: to = SP_TYPE_Q4_0; break;
    case SP_TYPE_Q4_K: to = SP_TYPE_Q5_0; break;
    case SP_TYPE_Q5_K: to = SP_TYPE_Q5_1; break;
    case SP_TYPE_Q6_K: to = SP_TYPE_Q8_0; break;
    default:
        if (sp_type_traits(t)->blck_size > 32) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                           "tensor '%s': no fallback for %s with rows of %lld", name,
                           sp_type_name(t), (long long)ne0);
        }
        to = t;
        break;
    }
    if (ne0 % sp_type_traits(to)->blck_size != 0) {
        to = SP_TYPE_F16;
        *why = "row length fits no block, f16";
    } else {
        *why = "row length not a multiple of the block";
    }
    *io = to;
    return SP_OK;
}

/* llama.cpp's visiting order: by layer number (-1 outside blk.N), then by name. */
typedef struct visit {
    int layer;
    int64_t idx;
    const char *name;
} visit;

static int
visit_cmp(const void *a, const void *b)
{
    const visit *x = a, *y = b;
    if (x->layer != y->layer) {
        return x->layer < y->layer ? -1 : 1;
    }
    return strcmp(x->name, y->name);
}

static int64_t
kv_int(const sp_gguf_t *g, const char *arch, const char *suffix, int64_t dflt)
{
    char key[128];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return sp_gguf_get_int(g, key, &v, NULL, 0) == SP_OK ? v : dflt;
}

sp_status_t
sp_quant_mix_plan(const sp_quant_mix_t *mix, const sp_gguf_t *g, bool pure, sp_type_t *types,
                  const char **why, char *err, size_t err_len)
{
    int64_t n = sp_gguf_n_tensors(g);
    state s;
    memset(&s, 0, sizeof s);
    s.ft = mix->ftype;
    s.tied = true;

    char arch[64] = "";
    sp_str_t a;
    if (sp_gguf_get_str(g, "general.architecture", &a, NULL, 0) == SP_OK && a.len < sizeof arch) {
        memcpy(arch, a.ptr, a.len);
        arch[a.len] = '\0';
    }
    s.falcon = strcmp(arch, "falcon") == 0;
    int64_t n_layer = kv_int(g, arch, "block_count", 0);
    int64_t n_head = kv_int(g, arch, "attention.head_count", 0);
    int64_t n_head_kv = kv_int(g, arch, "attention.head_count_kv", n_head);
    int64_t n_expert = kv_int(g, arch, "expert_count", 0);
    if (n_layer < 0 || n_layer > 100000 || n_expert < 0 || n_expert > 100000) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s.block_count or expert_count out of range",
                       arch);
    }
    s.n_layer = (int)n_layer;
    s.n_expert = (int)n_expert;
    s.n_gqa = n_head_kv > 0 && n_head > 0 && n_head / n_head_kv < 1000000 ? (int)(n_head / n_head_kv)
                                                                          : 0;
    /* llama.cpp's 70B type (the attn_v rule): 80 layers of llama with grouped-query
     * attention, or of qwen2 */
    s.is_70b = n_layer == 80 && ((strcmp(arch, "llama") == 0 && n_head != n_head_kv) ||
                                 strcmp(arch, "qwen2") == 0);

    visit *order = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *order);
    char (*names)[SP_GGUF_MAX_NAME] = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *names);
    if (order == NULL || names == NULL) {
        sp_free(order);
        sp_free(names);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory for %lld tensors",
                       (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        snprintf(names[i], sizeof names[i], "%.*s", (int)t->name.len, t->name.ptr);
        order[i].idx = i;
        order[i].name = names[i];
        order[i].layer = -1;
        if (sscanf(names[i], "blk.%d.", &order[i].layer) != 1) {
            order[i].layer = -1;
        }
        cat_t c = category(names[i]);
        if (is_attn_v(c)) {
            s.n_attn_v++;
        }
        if (c == CAT_OUTPUT) {
            s.tied = false;
        }
    }
    qsort(order, (size_t)n, sizeof *order, visit_cmp);

    bool quant_base = sp_type_traits(mix->base)->is_quantized;
    sp_status_t st = SP_OK;
    for (int64_t k = 0; k < n && st == SP_OK; k++) {
        int64_t i = order[k].idx;
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        const char *name = names[i];
        why[i] = NULL;
        if (!quantizable(name, t->n_dims)) {
            types[i] = t->type;
            continue;
        }
        sp_type_t ty = mix->base;
        if (quant_base) {
            if (!pure) {
                st = rules(&s, t, name, category(name), &ty, &why[i], err, err_len);
            }
            if (st == SP_OK) {
                st = fallback(t, name, &ty, &why[i], err, err_len);
            }
        }
        types[i] = ty;
    }
    sp_free(order);
    sp_free(names);
    return st;
}
