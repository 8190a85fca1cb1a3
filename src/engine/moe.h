/*
 * moe.h - the mixture-of-experts feed-forward block (engine-private, like
 * model_impl.h): its hyper-parameters and weights as loaded from GGUF, the
 * routing (router logits, top-k, gating weights) and the batched expert
 * products the forward pass (batch.c) calls in place of the dense FFN.
 *
 * Names follow llama.cpp's GGUF conventions: `<arch>.expert_count`,
 * `<arch>.expert_used_count`, `<arch>.expert_feed_forward_length`,
 * `<arch>.expert_shared_feed_forward_length`; tensors blk.N.ffn_gate_inp
 * (router), ffn_{gate,up,down}_exps (3-D: one matrix per expert),
 * ffn_{gate,up,down}_exps.bias, ffn_gate_inp.bias (gpt-oss),
 * ffn_{gate,up,down}_shexp and ffn_gate_inp_shexp (shared expert, qwen2moe;
 * deepseek2's shared experts have no gate), exp_probs_b.bias (selection bias).
 *
 * Threads: sp__moe_ffn runs its products on the caller's pool; the model part
 * is immutable after load and shared by every batch. Memory: the model part
 * is one allocation owned by the model; every per-step buffer lives in the
 * batch's scratch (sp__moe_scratch_bytes, sized at create).
 */
#ifndef SP_ENGINE_MOE_H
#define SP_ENGINE_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"

#define SP_MOE_MAX_EXPERTS 512
#define SP_MOE_MAX_USED 64

/* How the router's logits become the experts' weights (llama.cpp's
 * expert_gating_func). */
typedef enum sp_moe_gating {
    SP_MOE_GATING_SOFTMAX = 0,        /* softmax over all experts, top-k of the
                                         probabilities, their probabilities */
    SP_MOE_GATING_SOFTMAX_WEIGHT = 1, /* top-k of the logits, softmax over those k */
    SP_MOE_GATING_SIGMOID = 2,        /* sigmoid of each logit, top-k, their sigmoids
                                         (deepseek2's expert_gating_func 2) */
} sp_moe_gating_t;

/* The experts' activation of (gate, up). */
typedef enum sp_moe_act {
    SP_MOE_ACT_SILU = 0,       /* silu(gate) * up */
    SP_MOE_ACT_SWIGLU_OAI = 1, /* gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
                                  g * sigmoid(alpha g) * (u + 1) */
    SP_MOE_ACT_GELU = 2,       /* gelu(gate) * up, gelu's tanh form (gemma4) */
} sp_moe_act_t;

typedef struct sp_moe_hparams {
    int64_t n_expert;      /* experts per layer (>= 2) */
    int64_t n_expert_used; /* k: experts each row runs (1..n_expert) */
    int64_t n_ff_exp;      /* an expert's feed-forward width */
    int64_t n_ff_shexp;    /* the shared expert's width; 0 = no shared expert */
    sp_moe_gating_t gating;
    bool norm_w;           /* divide the k weights by their sum (at least 2^-14) */
    float w_scale;         /* multiply the weights by this; 0 or 1 = not at all */
    sp_moe_act_t act;
    float oai_alpha;       /* SP_MOE_ACT_SWIGLU_OAI's constants */
    float oai_limit;
    int64_t n_dense_lead;  /* layers 0..n_dense_lead-1 run the dense FFN (deepseek2) */
    int64_t n_group;       /* expert groups (> 1: only the n_group_used groups with the
                              largest sum of their two best scores compete; deepseek2) */
    int64_t n_group_used;
} sp_moe_hparams_t;

/* A 3-D expert tensor: n_expert matrices of n_out rows of n_in elements, each
 * row-major, expert after expert (GGUF ne = [n_in, n_out, n_expert]). */
typedef struct sp_experts {
    const void *data;
    sp_type_t type;
    int64_t n_in;
    int64_t n_out;
    int64_t n_expert;
    size_t row_bytes;
    size_t expert_bytes;
    /* The load-time packed copy (engine/repack_weights.c) or NULL: expert e's matrix in the
     * kernel table's packed form (kernels.h, repack_layout[type]) at packed + e *
     * packed_expert_bytes, groups of sp_repack_layout_rows(layout) rows packed_stride bytes
     * apart. Only moe.c's products read it; data stays the file's rows. */
    const void *packed;
    size_t packed_stride;
    size_t packed_expert_bytes;
} sp_experts_t;

typedef struct sp_moe_layer {
    sp_experts_t router;      /* ffn_gate_inp: (n_expert, n_embd), as one "expert" */
    const float *router_b;    /* (n_expert) or NULL */
    const float *sel_b;       /* (n_expert) exp_probs_b: added to the gated scores for the
                                 choice only, the weights stay unbiased (deepseek2), or NULL */
    sp_experts_t gate, up;    /* (n_expert, n_ff_exp, n_embd); from a fused ffn_gate_up_exps
                                 (gemma4) two views of it: expert_bytes spans both halves */
    sp_experts_t down;        /* (n_expert, n_embd, n_ff_exp) */
    const float *gate_b, *up_b; /* (n_expert, n_ff_exp) or NULL */
    const float *down_b;        /* (n_expert, n_embd) or NULL */
    const float *down_s;        /* (n_expert) ffn_down_exps.scale: expert e's output times
                                   down_s[e] (gemma4's per-expert scale) or NULL */
    const float *router_s;      /* (n_embd) ffn_gate_inp.scale (gemma4: the router reads
                                   RMSNorm(x) / sqrt(n_embd) * router_s), or NULL */
    /* the shared expert (n_ff_shexp > 0): a dense SwiGLU FFN every row runs,
     * scaled by sigmoid(sh_inp . x) when sh_inp is present */
    sp_experts_t sh_gate, sh_up, sh_down, sh_inp;
} sp_moe_layer_t;

struct sp_moe_model {
    sp_moe_hparams_t hp;
    sp_moe_layer_t *layers; /* (n_layer) */
};

/*
 * Read `<arch>.expert_count` and, for a MoE model, the rest of the MoE
 * hyper-parameters and every layer's MoE tensors (shape, type, bounds) into
 * m->moe. A dense model (no expert_count, or one of 0 or 1: llama.cpp's rule)
 * keeps m->moe NULL; `required` makes that an error (qwen3moe, qwen2moe, gpt-oss).
 * m->hp must be loaded. Errors name the file and the key or tensor.
 */
sp_status_t sp__moe_load(sp_model_t *m, bool required, char *err, size_t err_len);
void sp__moe_free(struct sp_moe_model *moe); /* NULL is a no-op */
/* Whether layer il runs the MoE block (a MoE model past its leading dense layers). */
bool sp__moe_layer(const sp_model_t *m, int64_t il);

/* Bytes of scratch sp__moe_ffn needs for steps of up to max_rows rows (0 for
 * a dense model). */
size_t sp__moe_scratch_bytes(const sp_model_t *m, int64_t max_rows);

/*
 * out[r] = the MoE block of layer il applied to x[r] (n_rows rows of n_embd,
 * already normalised), for r < n_rows <= max_rows; scratch as sized by
 * sp__moe_scratch_bytes(m, max_rows). Each row's result depends on that row alone (batch invariance: see
 * moe.c's opening comment).
 */
void sp__moe_ffn(const sp_model_t *m, int64_t il, sp_pool_t *pool, const sp_cpu_kernels_t *k,
                 void *scratch, int64_t max_rows, const float *x, float *out, int64_t n_rows);

/*
 * gemma4's feed-forward block of a layer with experts (llama.cpp's gemma4 graph):
 * `res` (n_rows of n_embd) is the residual stream after attention, `ffn` holds
 * on entry the shared dense MLP's output (batch.c ran it on RMSNorm(res) *
 * ffn_norm) and on return RMSNorm(ffn) * post_ffw_norm_1 + RMSNorm(moe) *
 * post_ffw_norm_2, where moe is the experts' block over RMSNorm(res) *
 * pre_ffw_norm_2, routed by RMSNorm(res) / sqrt(n_embd) * ffn_gate_inp.scale.
 * Per row, so batch invariant as sp__moe_ffn.
 */
void sp__moe_ffn_gemma4(const sp_model_t *m, int64_t il, sp_pool_t *pool,
                        const sp_cpu_kernels_t *k, void *scratch, int64_t max_rows,
                        const float *res, float *ffn, int64_t n_rows);

/*
 * The routing of one row, exposed for tests: from the router's n_expert
 * logits (bias already added), the k chosen experts (ids, by decreasing
 * selection score; equal scores: the lower id first) and their weights.
 * probs is n_expert floats of scratch.
 */
void sp__moe_route(const sp_moe_hparams_t *hp, const float *logits, float *probs, int32_t *ids,
                   float *weights);
/* The same with a selection bias (n_expert, or NULL) added to the gated scores
 * for the choice only, and the expert groups of hp. */
void sp__moe_route_ex(const sp_moe_hparams_t *hp, const float *logits, const float *sel_bias,
                      float *probs, int32_t *ids, float *weights);

#endif /* SP_ENGINE_MOE_H */
