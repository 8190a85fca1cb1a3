/*
 * testmodel.h - random-weight, llama-shaped GGUF models built in memory for the whole-model
 * tests (test_batch.c, test_repack_model.c, test_moe_pack.c): the demo model's tokenizer and metadata, the
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

/* Writes the GGUF bytes to NAME.gguf in the test's temporary folder, runs
 * `sampan inspect --json` on it and fails the test unless it reports repack_bytes == want
 * (the bytes the load packed). */
void sp_test_check_inspect_repack(const char *name, const void *buf, size_t len, size_t want);

#endif /* SP_TEST_TESTMODEL_H */
