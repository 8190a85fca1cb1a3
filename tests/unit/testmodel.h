/*
 * testmodel.h - random-weight GGUF models built in memory for the whole-model tests
 * (test_batch.c, test_repack_model.c, test_moe_pack.c, tests/gpu/host_test.c): the demo
 * model's tokenizer and metadata, the
 * shapes and weight type of a spec, weights drawn uniform in [-amp, amp) from one xorshift
 * stream in tensor order (so a spec and seed always give the same bytes).
 */
#ifndef SP_TEST_TESTMODEL_H
#define SP_TEST_TESTMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

typedef struct sp_test_llama {
    const char *arch;       /* "llama", "qwen2": the metadata key prefix */
    sp_type_t type;         /* every projection, token_embd and output */
    int64_t n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer;
    uint32_t n_ctx;         /* <arch>.context_length */
    float rms_eps;
    bool rope_dim;          /* write <arch>.rope.dimension_count = head_dim */
    bool qkv_bias;          /* F32 q/k/v biases (amplitude 0.1) */
    float amp_output;       /* output.weight (token_embd: 1.0) */
    float amp_in;           /* q, k, v, gate, up */
    float amp_out;          /* attn_output, ffn_down */
    uint64_t seed;
    /* Mixture of experts (n_expert >= 2): the FFN of every layer is an F32 router
     * ffn_gate_inp (amplitude 1) and 3-D ffn_{gate,up,down}_exps of n_ff_exp rows in `type`
     * instead of the dense ffn_gate/up/down; n_ff_shexp > 0 adds qwen2moe's shared expert
     * (arch "qwen2moe"; its F32 gate ffn_gate_inp_shexp). */
    int64_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
} sp_test_llama_t;

/* The GGUF bytes of the spec's model (n_vocab: the demo's 512) into *buf (sp_free). */
void sp_test_llama_gguf(const sp_test_llama_t *spec, void **buf, size_t *len);

/* The architectures past the llama family, as llama.cpp's converter lays them out, for the
 * whole-model tests of the CPU engine (test_batch.c) and of the CUDA path on its host emulation
 * (tests/gpu/host_test.c): 4 layers, n_embd 64, 4 heads of 32 over 2 KV heads (GQA), n_ff 96,
 * context_length 512, the demo's tokenizer (512 tokens); F32 norms, the matrices in `type`.
 * Every feature of the architecture is on:
 *   qwen3    per-head q/k norms
 *   gemma2   layers 0 and 2 slide over a window of 8, attention scores soft-capped
 *            (attn_softcap), post-attention and post-FFN norms, GELU, the embedding times
 *            sqrt(n_embd), final logits soft-capped (final_softcap), output tied
 *   gemma3   as gemma2 without the attention cap, with per-head q/k norms, the global layers
 *            on RoPE base 1e6 and the sliding ones on 10000
 *   phi3     fused q/k/v and gate/up matrices, every layer sliding over 8, LongRoPE: short
 *            factors in [0.5, 1.5), long ones in [1, 5), original context 64, attention
 *            factor 1.2 (a context past 64 uses the long set)
 *   smollm3  layer 3 without RoPE
 *   granite  embedding scale 3, attention scale 0.1, residual scale 0.5, logits / 4
 *   olmo2    no pre-norms, post-norms, q/k norms over the whole projections
 *   llama / qwen2 with yarn: rope.scaling.type yarn, factor 4 over an original context of 64
 *            (attention factor 1 + 0.1 ln 4)
 * Weights uniform in [-amp, amp) (norms base + amp), one xorshift stream from seed in tensor
 * order. */
typedef struct sp_test_arch {
    const char *arch;
    sp_type_t type;          /* token_embd, output and every projection */
    uint64_t seed;
    float amp_embd;          /* token_embd */
    float amp_output;        /* output.weight; 0: none (tied to token_embd; gemma never has one) */
    float amp_in;            /* q, k, v, gate, up */
    float amp_out;           /* attn_output, ffn_down */
    float norm_base, norm_amp; /* every norm's weights */
    float final_softcap;     /* gemma: final_logit_softcapping */
    float attn_softcap;      /* gemma2: attn_logit_softcapping */
    bool yarn;
} sp_test_arch_t;

/* The GGUF bytes of the spec's model into *buf (sp_free). */
void sp_test_arch_gguf(const sp_test_arch_t *spec, void **buf, size_t *len);

/* Writes the GGUF bytes to NAME.gguf in the test's temporary folder, runs
 * `sampan inspect --json` on it and fails the test unless it reports repack_bytes == want
 * (the bytes the load packed). */
void sp_test_check_inspect_repack(const char *name, const void *buf, size_t len, size_t want);

#endif /* SP_TEST_TESTMODEL_H */
