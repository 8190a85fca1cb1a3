#!/usr/bin/python3
"""gguf_gen.py - write a random-weight llama-family model (dense or mixture of experts) or a
BERT-family encoder as a GGUF v3 file.

Used by the NumPy reference tests (tests/py/test_reference.py) and to make the
TinyLlama-1.1B-shaped benchmark model. NumPy only (Debian's python3-numpy).

    tools/gguf_gen.py OUT.gguf [--preset tiny|tinyllama|moe-1b|qwen2-tiny|mixtral-tiny|qwen2moe-tiny]
        [--arch llama|qwen2|qwen2moe|qwen3moe|gpt-oss|deepseek2] [--expert-type T] [--swa N] [--n-expert N --n-expert-used K] [--ff-exp N] [--ff-shexp N]
        [--dim N] [--n-layers N] [--n-heads N] [--n-kv-heads N] [--head-dim N] [--ff N]
        [--vocab N] [--ctx N] [--rope-base F] [--rope-scale F] [--eps F] [--tied|--untied]
        [--qkv-bias] [--type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|mxfp4|q2_k|q3_k|q4_k|
                      q5_k|q6_k|iq4_xs]
        [--embd-type T] [--output-type T] [--seed N] [--embd-scale F] [--vocab-from FILE.gguf]
    tools/gguf_gen.py OUT.gguf --arch bert|nomic-bert --vocab-from BERT-VOCAB.gguf
        [--pooling none|mean|cls|last|rank] [--n-cls-out N] [--n-types N] ...

Encoders (bert, nomic-bert) carry the tensors and keys llama.cpp's converter
writes: token_types, position_embd (bert), token_embd_norm (+ bias), per layer
attn_q/k/v (+ bias) or the fused attn_qkv (nomic-bert), attn_output (+ bias),
attn_output_norm, ffn_up (+ bias) / ffn_gate (nomic-bert), ffn_down,
layer_output_norm; a reranker (--pooling rank) adds cls and cls.output.

Weights: matrices are normal(0, 1/sqrt(fan_in)) so that every projection keeps
activations O(1); the embedding / output matrix is normal(0, S/sqrt(dim)) with
S = --embd-scale (default 2) so logits (after the final RMSNorm, whose output has
an rms of about 1) have a standard deviation of about S across the vocabulary
(a larger S spreads the logits further apart: fewer near-ties for top-1); norm
weights are uniform in [0.8, 1.2]; biases are normal(0, 0.2). Each tensor has
its own generator seeded by (seed, crc32(name)), so a tensor's values do not
depend on the order or the set of the other tensors.

Mixture of experts, with tensor names and metadata as llama.cpp's converter writes them:
llama with --n-expert (Mixtral: llama.expert_count, llama.expert_used_count, the experts'
width in feed_forward_length) and qwen2moe (expert_feed_forward_length,
expert_shared_feed_forward_length, a shared expert with its sigmoid gate). Per layer the
router blk.N.ffn_gate_inp.weight [dim, n_expert] (kept F32, as llama.cpp's quantizer keeps
it), the experts as 3-D tensors blk.N.ffn_{gate,up}_exps.weight [dim, ff_exp, n_expert] and
ffn_down_exps.weight [ff_exp, dim, n_expert]; qwen2moe adds ffn_gate_inp_shexp.weight [dim]
(F32) and ffn_{gate,up,down}_shexp.weight.

gpt-oss (--arch gpt-oss) as llama.cpp's converter writes it: experts in every layer with their
width in expert_feed_forward_length (also feed_forward_length), the expert matrices in MXFP4
(--expert-type, default mxfp4; the rest in --type), F32 biases on the router
(ffn_gate_inp.bias [n_expert]) and the experts (ffn_{gate,up}_exps.bias [ff_exp, n_expert],
ffn_down_exps.bias [dim, n_expert]), q/k/v and attention output biases, attn_sinks.weight
[n_heads] (one sink logit per query head, uniform in [-1, 3]), the FFN's pre-norm under the
name post_attention_norm.weight (no ffn_norm), attention.sliding_window (every other layer
slides: the converter writes no pattern key, llama.cpp's default is 2) and optional YaRN keys.

deepseek2 (--arch deepseek2, presets deepseek2-*) as llama.cpp's converter writes it:
multi-head latent attention with attention.kv_lora_rank, attention.q_lora_rank (0: one
attn_q matrix), rope.dimension_count (the decoupled RoPE dims), per layer attn_q_a [dim,
q_lora] + attn_q_a_norm + attn_q_b [q_lora, heads * (nope + rope)] (or attn_q),
attn_kv_a_mqa [dim, kv_lora + rope], attn_kv_a_norm [kv_lora], and either the split
attn_k_b [nope, kv_lora, heads] / attn_v_b [kv_lora, v, heads] of current converters
(head_count_kv 1, key_length kv_lora + rope, value_length kv_lora, key_length_mla
nope + rope, value_length_mla v) or, with mla_split False, the legacy fused attn_kv_b
[kv_lora, heads * (nope + v)] (key_length nope + rope, value_length v); attn_output
[heads * v, dim]. leading_dense_block_count dense layers, then experts with
expert_shared_count shared experts (ffn_{gate,up,down}_shexp, ungated, ff_exp * count wide),
expert_gating_func (1 softmax, 2 sigmoid), expert_weights_norm, expert_weights_scale,
exp_probs_b.bias (the selection bias), expert_group_count / expert_group_used_count, and
YaRN with rope.scaling.yarn_log_multiplier (0.1 * mscale_all_dim, as the converter writes).

The file is written tensor by tensor in chunks of rows, so memory stays at a few
hundred MB whatever the model size.

The quantizers below are written from the block layouts (src/kernels/kernels.h,
the GGUF/ggml definitions). They do not try to be optimal (no iterative scale
search as in llama.cpp); any valid encoding is fine, because the reference
forward pass reads back the stored blocks.
"""
import argparse
import struct
import sys
import time
import zlib

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# GGUF metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)
_SCALAR_FMT = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
               T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
               T_FLOAT64: "<d"}

# tensor types: ggml number, block size, bytes per block
TYPES = {
    "f32": (0, 1, 4),
    "f16": (1, 1, 2),
    "q4_0": (2, 32, 18),
    "q8_0": (8, 32, 34),
    "q2_k": (10, 256, 84),
    "q3_k": (11, 256, 110),
    "q4_k": (12, 256, 144),
    "q5_k": (13, 256, 176),
    "q6_k": (14, 256, 210),
    "iq4_xs": (23, 256, 136),
    "bf16": (30, 1, 2),
    "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24),
    "iq4_nl": (20, 32, 18),
    "mxfp4": (39, 32, 17),
}
# general.file_type (llama_ftype) for a model whose matrices are all of one type
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q2_k": 10, "q3_k": 11, "q4_k": 15,
             "q5_k": 16, "q6_k": 18, "iq4_xs": 30, "bf16": 32,
             "q4_1": 3, "q5_0": 8, "q5_1": 9, "iq4_nl": 25, "mxfp4": 38}

PRESETS = {
    # small llama with grouped-query attention; fast enough for unit tests
    "tiny": dict(arch="llama", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ff=160, vocab=300,
                 ctx=256),
    "qwen3-tiny": dict(arch="qwen3", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                       ff=160, vocab=300, ctx=256, tied=True, rope_base=1000000.0, eps=1e-6),
    "gemma2-tiny": dict(arch="gemma2", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                        ff=160, vocab=300, ctx=256, eps=1e-6, swa=8),
    "gemma3-tiny": dict(arch="gemma3", dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32,
                        ff=160, vocab=300, ctx=256, eps=1e-6, swa=8, swa_pattern=3,
                        rope_base=1000000.0, rope_scale=8.0),
    "phi3-tiny": dict(arch="phi3", dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ff=160, vocab=300,
                      ctx=256, tied=False, longrope=True, orig_ctx=64),
    "smollm3-tiny": dict(arch="smollm3", dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ff=160,
                         vocab=300, ctx=256, tied=True),
    # granite's four scalars: embedding, attention, residual and logit scales
    "granite-tiny": dict(arch="granite", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ff=160,
                         vocab=300, ctx=256, tied=True,
                         granite_scales=(12.0, 0.2, 0.22, 8.0)),
    # no pre-norms: q/k norms over the whole projections, post-norms; untied
    "olmo2-tiny": dict(arch="olmo2", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ff=160,
                       vocab=300, ctx=256, tied=False, rope_base=500000.0, eps=1e-6),
    "qwen2-tiny": dict(arch="qwen2", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ff=160,
                       vocab=300, ctx=256, qkv_bias=True, tied=False, rope_base=1000000.0,
                       eps=1e-6),
    # Mixtral-style MoE under llama: 8 experts, 2 per token
    "mixtral-tiny": dict(arch="llama", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ff=96,
                         vocab=300, ctx=256, n_expert=8, n_expert_used=2, tied=False),
    "qwen2moe-tiny": dict(arch="qwen2moe", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ff=160,
                          vocab=300, ctx=256, n_expert=8, n_expert_used=4, ff_exp=64,
                          ff_shexp=96, qkv_bias=True, tied=False, rope_base=1000000.0, eps=1e-6),
    # One small shape per architecture for the llama.cpp oracle test (tests/py/test_llamacpp.py
    # looks them up as ORACLE_SHAPES[arch]): every row length a multiple of 256 (the K-quant
    # super-block, so llama.cpp's quantizer keeps its chosen types instead of falling back)
    # and head sizes as the real families have them, scaled down.
    "llama-256": dict(arch="llama", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ff=512,
                      vocab=512, ctx=256, tied=True, rope_base=500000.0),
    # Mistral 7B's GGUF files are llama-architecture files: untied output, 4:1 grouped-query
    # attention, RoPE base 1e6
    "mistral-256": dict(arch="llama", dim=256, n_layers=2, n_heads=8, n_kv_heads=2, ff=768,
                        vocab=512, ctx=256, tied=False, rope_base=1000000.0),
    "qwen2-256": dict(arch="qwen2", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ff=512,
                      vocab=512, ctx=256, qkv_bias=True, tied=False, rope_base=1000000.0,
                      eps=1e-6),
    # YaRN context extension (factor 8 over an original context of 64 positions)
    "llama-yarn-256": dict(arch="llama", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ff=512,
                           vocab=512, ctx=512, tied=False, rope_base=10000.0, yarn=8.0,
                           yarn_orig_ctx=64),
    # the MoE families for the oracle: Mixtral (llama, 8 experts, top-2) and Qwen1.5-MoE
    # (qwen2moe: top-4 of 8, unnormalised weights, a gated shared expert)
    "mixtral-256": dict(arch="llama", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ff=256,
                        vocab=512, ctx=256, tied=False, rope_base=1000000.0, n_expert=8,
                        n_expert_used=2),
    "qwen2moe-256": dict(arch="qwen2moe", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ff=512,
                         vocab=512, ctx=256, qkv_bias=True, tied=False, rope_base=1000000.0,
                         eps=1e-6, n_expert=8, n_expert_used=4, ff_exp=256, ff_shexp=512),
    "qwen3moe-tiny": dict(arch="qwen3moe", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                          head_dim=32, ff=192, vocab=300, ctx=256, n_expert=8, n_expert_used=2,
                          ff_exp=64, tied=False, rope_base=1000000.0, eps=1e-6),
    # Qwen3-30B-A3B's layout scaled down: 128-wide heads over a 256 model, top-2 of 8
    "qwen3moe-256": dict(arch="qwen3moe", dim=256, n_layers=2, n_heads=4, n_kv_heads=2,
                         head_dim=128, ff=512, vocab=512, ctx=256, tied=False,
                         rope_base=1000000.0, eps=1e-6, n_expert=8, n_expert_used=2, ff_exp=256),
    # gpt-oss scaled down: 32-wide heads over a 64 model (q is wider than the model, as in
    # gpt-oss-20b), top-2 of 8 experts in MXFP4, a window of 8 on layer 0, YaRN x4 over 64
    "gpt-oss-tiny": dict(arch="gpt-oss", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         head_dim=32, ff=64, vocab=300, ctx=256, n_expert=8, n_expert_used=2,
                         tied=False, rope_base=150000.0, swa=8, yarn=4.0, yarn_orig_ctx=64),
    "gpt-oss-256": dict(arch="gpt-oss", dim=256, n_layers=2, n_heads=8, n_kv_heads=2,
                        head_dim=64, ff=256, vocab=512, ctx=256, n_expert=8, n_expert_used=4,
                        tied=False, rope_base=150000.0, swa=8, yarn=4.0, yarn_orig_ctx=64),
    # DeepSeek-V2-Lite's layout scaled down: q through wq, kv_lora 64 + 16 RoPE dims, 32-wide
    # no-RoPE heads, v 32; one leading dense layer, then top-2 of 8 experts, 2 shared
    "deepseek2-tiny": dict(arch="deepseek2", dim=64, n_layers=3, n_heads=4, ff=128, vocab=300,
                           ctx=256, tied=False, n_expert=8, n_expert_used=2, ff_exp=32,
                           mla=dict(q_lora=0, kv_lora=64, nope=32, rope=16, v=32, split=True,
                                    lead=1, shared=2, gating=1, norm=False, scale=1.0,
                                    probs_b=False, groups=(0, 0), log_mul=0.0)),
    # DeepSeek-V3 / Kimi style: q through q_lora, sigmoid gating with the selection bias,
    # normalised and scaled weights, 4 groups of 2 experts (2 used), YaRN x4 with
    # mscale_all_dim 0.707
    "deepseek2-v3-tiny": dict(arch="deepseek2", dim=64, n_layers=3, n_heads=4, ff=128,
                              vocab=300, ctx=256, tied=False, n_expert=8, n_expert_used=2,
                              ff_exp=32, yarn=4.0, yarn_orig_ctx=64,
                              mla=dict(q_lora=48, kv_lora=64, nope=32, rope=16, v=32,
                                       split=True, lead=1, shared=1, gating=2, norm=True,
                                       scale=2.5, probs_b=True, groups=(4, 2),
                                       log_mul=0.0707)),
    # the legacy fused attn_kv_b
    "deepseek2-legacy-tiny": dict(arch="deepseek2", dim=64, n_layers=2, n_heads=4, ff=128,
                                  vocab=300, ctx=256, tied=False, n_expert=4, n_expert_used=2,
                                  ff_exp=32,
                                  mla=dict(q_lora=32, kv_lora=64, nope=32, rope=16, v=32,
                                           split=False, lead=1, shared=1, gating=1, norm=False,
                                           scale=1.0, probs_b=False, groups=(0, 0),
                                           log_mul=0.0)),
    # for llama.cpp: V3-style at 256, 128-wide latent, 64-wide heads
    "deepseek2-256": dict(arch="deepseek2", dim=256, n_layers=3, n_heads=4, ff=512, vocab=512,
                          ctx=256, tied=False, n_expert=8, n_expert_used=2, ff_exp=128,
                          yarn=4.0, yarn_orig_ctx=64,
                          mla=dict(q_lora=96, kv_lora=128, nope=64, rope=32, v=64, split=True,
                                   lead=1, shared=1, gating=2, norm=True, scale=2.5,
                                   probs_b=True, groups=(4, 2), log_mul=0.0707)),
    "deepseek2-lite-256": dict(arch="deepseek2", dim=256, n_layers=2, n_heads=4, ff=512,
                               vocab=512, ctx=256, tied=False, n_expert=8, n_expert_used=2,
                               ff_exp=128,
                               mla=dict(q_lora=0, kv_lora=128, nope=64, rope=32, v=64,
                                        split=True, lead=1, shared=2, gating=1, norm=False,
                                        scale=1.0, probs_b=False, groups=(0, 0), log_mul=0.0)),
    # TinyLlama-1.1B shape (the benchmark model)
    "tinyllama": dict(arch="llama", dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ff=5632,
                      vocab=32000, ctx=2048, tied=False),
    # A 1B-class mixture of experts (the MoE benchmark model): Qwen3-MoE's layout, 8 experts,
    # top-2, about 0.95 B parameters of which about 0.3 B are active per token
    "moe-1b": dict(arch="qwen3moe", dim=1024, n_layers=16, n_heads=16, n_kv_heads=4,
                   head_dim=128, ff=2816, vocab=32000, ctx=2048, tied=False,
                   rope_base=1000000.0, eps=1e-6, n_expert=8, n_expert_used=2, ff_exp=2048),
}
# The other architectures at the same scale, every feature on: gemma's windows (8 positions,
# shorter than the oracle's 32 tokens), soft-caps and post-norms, gemma3's local/global
# layers, phi3's fused matrices and LongRoPE (the short factors and the attention factor of
# a 4x extension: contexts here stay within the original 1024), smollm3's no-RoPE layer 3.
PRESETS.update({
    "qwen3-256": dict(arch="qwen3", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=128,
                      ff=512, vocab=512, ctx=256, tied=True, rope_base=1000000.0, eps=1e-6),
    "gemma2-256": dict(arch="gemma2", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                       ff=512, vocab=512, ctx=256, eps=1e-6, swa=8),
    "gemma3-256": dict(arch="gemma3", dim=256, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=64,
                       ff=512, vocab=512, ctx=256, eps=1e-6, swa=8, swa_pattern=3,
                       rope_base=1000000.0, rope_scale=8.0),
    "phi3-256": dict(arch="phi3", dim=256, n_layers=2, n_heads=4, n_kv_heads=4, ff=512,
                     vocab=512, ctx=4096, tied=False, longrope=True, orig_ctx=1024),
    "granite-256": dict(arch="granite", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ff=512,
                        vocab=512, ctx=256, tied=True, granite_scales=(6.0, 0.05, 0.5, 2.0)),
    "olmo2-256": dict(arch="olmo2", dim=256, n_layers=2, n_heads=4, n_kv_heads=4, ff=512,
                      vocab=512, ctx=256, tied=False, rope_base=500000.0, eps=1e-6),
    "smollm3-256": dict(arch="smollm3", dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ff=512,
                        vocab=512, ctx=256, tied=False, rope_base=2000000.0),
})
# Gemma 4 (E2B's layout scaled down): sliding layers (S) with 64-wide heads and 2 KV heads,
# global layers (G) with 128-wide heads, 1 KV head and RoPE on a quarter of each head (the
# converter's rope_freqs: 1e30 for the unrotated pairs), the last two layers sharing the cache
# of the last S and G layers with a double-wide FFN, per-layer inputs (32 per layer; 256 in
# the oracle shape, a K-quant super-block), a
# scalar per layer output, no attn_v on the global layers (values = keys), windows of 8
# positions, final soft-capping.
PRESETS.update({
    "gemma4-tiny": dict(arch="gemma4", dim=64, n_layers=6, n_heads=4, n_kv_heads=2, head_dim=32,
                        head_dim_full=64, n_kv_heads_full=1, layer_types="SSSGSG", n_shared=2,
                        n_pl=32, ff=128, vocab=300, ctx=256, eps=1e-6, swa=8,
                        rope_base=1000000.0, final_softcap=30.0, tied=True),
    "gemma4-256": dict(arch="gemma4", dim=256, n_layers=6, n_heads=4, n_kv_heads=2, head_dim=64,
                       head_dim_full=128, n_kv_heads_full=1, layer_types="SSSGSG", n_shared=2,
                       n_pl=256, ff=512, vocab=512, ctx=256, eps=1e-6, swa=8,
                       rope_base=1000000.0, final_softcap=30.0, tied=True),
})
# gemma4's mixture-of-experts variant (26B-A4B's layout, scaled down): no per-layer inputs
# and no shared KV layers (as 26B-A4B), every layer's dense MLP beside 8 experts (top 2)
# with their router (F32), the router input's scale, the per-expert output scale, the
# experts' gate and up fused in ffn_gate_up_exps (the converter's layout), three more norms.
PRESETS.update({
    "gemma4-moe-tiny": dict(arch="gemma4", dim=64, n_layers=4, n_heads=4, n_kv_heads=2,
                            head_dim=32, head_dim_full=64, n_kv_heads_full=1, layer_types="SSSG",
                            n_pl=0, ff=96, vocab=300, ctx=256, eps=1e-6, swa=8,
                            rope_base=1000000.0, final_softcap=30.0, tied=True, n_expert=8,
                            n_expert_used=2, ff_exp=32),
    "gemma4-moe-256": dict(arch="gemma4", dim=256, n_layers=4, n_heads=4, n_kv_heads=2,
                           head_dim=64, head_dim_full=128, n_kv_heads_full=1, layer_types="SSSG",
                           n_pl=0, ff=512, vocab=512, ctx=256, eps=1e-6, swa=8,
                           rope_base=1000000.0, final_softcap=30.0, tied=True, n_expert=8,
                           n_expert_used=2, ff_exp=256),
})
ORACLE_SHAPES = {"llama": "llama-256", "mistral": "mistral-256", "qwen2": "qwen2-256",
                 "qwen3": "qwen3-256", "gemma2": "gemma2-256", "gemma3": "gemma3-256",
                 "phi3": "phi3-256", "smollm3": "smollm3-256", "granite": "granite-256",
                 "olmo2": "olmo2-256", "gemma4": "gemma4-256", "gemma4-moe": "gemma4-moe-256",
                 "mixtral": "mixtral-256", "qwen2moe": "qwen2moe-256",
                 "llama-yarn": "llama-yarn-256", "qwen3moe": "qwen3moe-256",
                 "gpt-oss": "gpt-oss-256", "deepseek2": "deepseek2-256",
                 "deepseek2-lite": "deepseek2-lite-256"}
DEFAULTS = dict(arch="llama", dim=64, n_layers=2, n_heads=4, n_kv_heads=None, head_dim=None,
                ff=None, vocab=300, ctx=256, rope_base=10000.0, rope_scale=1.0, eps=1e-5,
                tied=True, qkv_bias=None, type="f32", embd_type=None, output_type=None, seed=1,
                vocab_from=None, name=None, poison=None, embd_scale=2.0, n_expert=0,
                n_expert_used=0, ff_exp=None, ff_shexp=None, yarn=None, yarn_orig_ctx=None,
                swa=None, swa_pattern=None, attn_softcap=None, final_softcap=None,
                longrope=None, orig_ctx=None, rope_base_swa=None, pooling=None, n_cls_out=1,
                n_types=2, granite_scales=None, expert_type=None,
                head_dim_full=None, n_kv_heads_full=None, layer_types=None, n_shared=0, n_pl=0,
                rot_frac_full=0.25, no_v_global=True, double_wide=True, out_scale=True, mla=None,
                split_exps=False)
MOE_ARCHS = ("qwen2moe", "qwen3moe", "gpt-oss", "deepseek2")  # always mixture of experts (llama is with --n-expert)
ENCODERS = ("bert", "nomic-bert")
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}

# Architectures and what their files carry beyond the llama layout (as llama.cpp's converter
# writes them): per-head q/k norms, gemma's post-attention and post-FFN norms, phi3's fused
# QKV and gate/up matrices, soft-capping and sliding-window keys, LongRoPE factor tensors.
# The encoders (ENCODERS) have their own layout (write_encoder).
ARCHS = {
    "llama": set(),
    "qwen2": set(),
    "qwen3": {"qk_norm", "key_length"},
    "gemma2": {"post_norms", "key_length", "softcap", "tied_only"},
    "gemma3": {"post_norms", "key_length", "qk_norm"},
    "phi3": {"fused"},
    "smollm3": set(),
    "granite": set(),
    "olmo2": {"post_norms", "no_pre_norms", "qk_norm_full"},
    "gemma4": {"gemma4"},  # its own layout: gemma4_tensor_list, gemma4_metadata
    "qwen2moe": set(),
    "qwen3moe": {"qk_norm", "key_length"},
    "gpt-oss": {"gptoss", "key_length"},
    "deepseek2": {"mla"},
    "bert": set(),
    "nomic-bert": set(),
}


# ---- half / bfloat ----------------------------------------------------------

def to_f16(x):
    """float32 -> IEEE half bit patterns (NumPy rounds to nearest even)."""
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def to_bf16(x):
    """float32 -> bfloat16 bit patterns, round to nearest even (no NaN inputs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def _f16_value(d):
    """The value a scale has once stored as half (what the decoder will use)."""
    return d.astype(np.float16).astype(np.float32)


# ---- quantizers: (rows, n) float32 -> (rows, n / blck * size) uint8 --------------

def quant_q8_0(x):
    """Q8_0: 32 int8 per block and a half scale, x = q * d, d = amax / 127."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = amax / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(b * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty((b.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(x.shape[0], -1)


def quant_q4_0(x):
    """Q4_0: x = (q - 8) * d, q in 0..15. The element of largest magnitude maps to
    q = 0 (value -8 * d), so d carries its sign: d = -max / 8."""
    b = x.reshape(-1, 32)
    idx = np.abs(b).argmax(axis=1)
    mx = b[np.arange(b.shape[0]), idx]
    d = mx / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.rint(b * inv[:, None]) + 8, 0, 15).astype(np.uint8)
    out = np.empty((b.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    # byte j: low nibble = element j, high nibble = element j + 16
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(x.shape[0], -1)


def _pack_nibbles(q):
    """(nb, 32) values 0..15 -> (nb, 16) bytes: element j low nibble, j + 16 high."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _pack_fifth_bits(q):
    """(nb, 32) values 0..31 -> (nb, 4) bytes of the little-endian word whose bit j is
    element j's bit 4."""
    bits = ((q >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)
    return bits.sum(axis=1, dtype=np.uint32).astype("<u4").view(np.uint8).reshape(-1, 4)


def _min_max_scale(b, levels):
    """Q4_1 / Q5_1: d = (max - min) / levels, q = trunc((x - min) / d + 0.5) (ggml's rule)."""
    lo, hi = b.min(axis=1), b.max(axis=1)
    d = (hi - lo) / np.float32(levels)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(np.floor((b - lo[:, None]) * inv[:, None] + np.float32(0.5)), levels)
    return d, lo, q.astype(np.uint32)


def quant_q4_1(x):
    """Q4_1: x = q * d + m, q in 0..15, m = the block's minimum."""
    b = x.reshape(-1, 32)
    d, m, q = _min_max_scale(b, 15)
    out = np.empty((b.shape[0], 20), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = to_f16(m).view(np.uint8).reshape(-1, 2)
    out[:, 4:] = _pack_nibbles(q)
    return out.reshape(x.shape[0], -1)


def quant_q5_1(x):
    """Q5_1: x = q * d + m, q in 0..31 (low 4 bits in qs, bit 4 in the 32-bit qh)."""
    b = x.reshape(-1, 32)
    d, m, q = _min_max_scale(b, 31)
    out = np.empty((b.shape[0], 24), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = to_f16(m).view(np.uint8).reshape(-1, 2)
    out[:, 4:8] = _pack_fifth_bits(q)
    out[:, 8:] = _pack_nibbles(q & 0xF)
    return out.reshape(x.shape[0], -1)


def quant_q5_0(x):
    """Q5_0: x = (q - 16) * d, q in 0..31; like Q4_0 the element of largest magnitude maps to
    q = 0 (d = max / -16)."""
    b = x.reshape(-1, 32)
    idx = np.abs(b).argmax(axis=1)
    d = b[np.arange(b.shape[0]), idx] / np.float32(-16)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.floor(b * inv[:, None] + np.float32(16.5)), 0, 31).astype(np.uint32)
    out = np.empty((b.shape[0], 22), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:6] = _pack_fifth_bits(q)
    out[:, 6:] = _pack_nibbles(q & 0xF)
    return out.reshape(x.shape[0], -1)


IQ4_NL_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                       dtype=np.float32)
MXFP4_GRID = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def _nearest(grid, v):
    """(nb, 32) values -> index of the nearest grid value (the first of equals)."""
    return np.abs(v[:, :, None] - grid[None, None, :]).argmin(axis=2).astype(np.uint32)


def quant_iq4_nl(x):
    """IQ4_NL: x = d * grid[q] on a fixed non-linear grid of 16 values. A simple rule (not
    llama-quantize's scale search): the element of largest magnitude on the grid's end -127,
    every element on its nearest grid point for the stored half scale."""
    b = x.reshape(-1, 32)
    idx = np.abs(b).argmax(axis=1)
    d = _f16_value(b[np.arange(b.shape[0]), idx] / np.float32(-127))
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = _nearest(IQ4_NL_GRID, b * inv[:, None])
    out = np.empty((b.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = _pack_nibbles(q)
    return out.reshape(x.shape[0], -1)


def quant_mxfp4(x):
    """MXFP4: x = 2^(e - 127) * E2M1(q); ggml's rule e = floor(log2 amax) - 2 + 127 and each
    element on its nearest grid point (the grid in halves: 2^(e - 128) * MXFP4_GRID)."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    _, ex = np.frexp(amax)                      # amax = m 2^ex, m in [0.5, 1)
    e = np.where(amax > 0, np.clip(ex.astype(np.int64) + 124, 0, 254), 0)
    half = np.ldexp(np.float64(1), (e - 128).astype(np.int32))
    q = _nearest(MXFP4_GRID.astype(np.float64), b.astype(np.float64) / half[:, None])
    out = np.empty((b.shape[0], 17), dtype=np.uint8)
    out[:, 0] = e.astype(np.uint8)
    out[:, 1:] = _pack_nibbles(q)
    return out.reshape(x.shape[0], -1)


def quant_q4_k(x):
    """Q4_K: super-block of 256 = 8 sub-blocks of 32, x = d*sc*q - dmin*m, q in 0..15,
    sc and m 6-bit. Per sub-block: range [min(lo,0), hi] split in 15 steps."""
    b = x.reshape(-1, 8, 32)
    nb = b.shape[0]
    lo = np.minimum(b.min(axis=2), 0.0)        # (nb, 8) <= 0
    hi = b.max(axis=2)
    scale = (hi - lo) / 15.0                    # >= 0
    mins = -lo                                  # >= 0
    d = scale.max(axis=1) / 63.0
    dmin = mins.max(axis=1) / 63.0
    d16, dmin16 = _f16_value(d), _f16_value(dmin)
    inv_d = np.divide(1.0, d16, out=np.zeros_like(d16), where=d16 > 0)
    inv_m = np.divide(1.0, dmin16, out=np.zeros_like(dmin16), where=dmin16 > 0)
    sc = np.clip(np.rint(scale * inv_d[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mins * inv_m[:, None]), 0, 63).astype(np.uint8)
    step = d16[:, None] * sc                    # (nb, 8)
    off = dmin16[:, None] * m
    inv_step = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
    q = np.clip(np.rint((b + off[:, :, None]) * inv_step[:, :, None]), 0, 15).astype(np.uint8)
    out = np.empty((nb, 144), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = to_f16(dmin).view(np.uint8).reshape(-1, 2)
    s = np.zeros((nb, 12), dtype=np.uint8)
    # sub-blocks 0..3: 6 bits in bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7: low
    # 4 bits in bytes 8..11 (scale low nibble, min high nibble), top 2 bits in the top
    # bits of bytes 0..3 (scale) and 4..7 (min).
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    out[:, 4:16] = s
    # 64 elements per 32 bytes: sub-block 2c in the low nibbles, 2c+1 in the high nibbles
    qq = q.reshape(nb, 4, 2, 32)
    out[:, 16:] = (qq[:, :, 0, :] | (qq[:, :, 1, :] << 4)).reshape(nb, 128)
    return out.reshape(x.shape[0], -1)


def quant_q6_k(x):
    """Q6_K: super-block of 256 = 16 sub-blocks of 16, x = d * sc * (q - 32), q in 0..63,
    sc int8."""
    b = x.reshape(-1, 16, 16)
    nb = b.shape[0]
    amax = np.abs(b).max(axis=2)                # (nb, 16)
    scale = amax / 31.0
    d = scale.max(axis=1) / 127.0
    d16 = _f16_value(d)
    inv_d = np.divide(1.0, d16, out=np.zeros_like(d16), where=d16 > 0)
    sc = np.clip(np.rint(scale * inv_d[:, None]), -128, 127).astype(np.int8)
    step = d16[:, None] * sc.astype(np.float32)
    inv_step = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
    q = (np.clip(np.rint(b * inv_step[:, :, None]), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(nb, 2, 4, 32)                 # half, quarter k, l
    out = np.empty((nb, 210), dtype=np.uint8)
    # ql: per half 64 bytes; byte l holds k=0 (low) and k=2 (high), byte l+32 holds k=1, k=3.
    ql = np.empty((nb, 2, 64), dtype=np.uint8)
    ql[:, :, 0:32] = (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:64] = (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)
    # qh: per half 32 bytes; bits 2k..2k+1 of byte l are the top 2 bits of quarter k.
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
          | ((q[:, :, 3] >> 4) << 6))
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = to_f16(d).view(np.uint8).reshape(-1, 2)
    return out.reshape(x.shape[0], -1)


def _inv(a):
    return np.divide(1.0, a, out=np.zeros_like(a), where=a != 0)


def _pack_2bit(q):
    """(nb, 256) values 0..3 -> (nb, 64) bytes: element 128h + 32j + l at bits 2j of byte
    32h + l (Q2_K and Q3_K)."""
    q = q.reshape(q.shape[0], 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def quant_q2_k(x):
    """Q2_K: 16 sub-blocks of 16, x = d*sc*q - dmin*m, q in 0..3, sc and m 4-bit (byte g: scale
    in the low nibble, min in the high). Per sub-block: range [min(lo,0), hi] in 3 steps."""
    b = x.reshape(-1, 16, 16)
    nb = b.shape[0]
    lo = np.minimum(b.min(axis=2), 0.0)
    scale = (b.max(axis=2) - lo) / 3.0
    mins = -lo
    d, dmin = scale.max(axis=1) / 15.0, mins.max(axis=1) / 15.0
    d16, dmin16 = _f16_value(d), _f16_value(dmin)
    sc = np.clip(np.rint(scale * _inv(d16)[:, None]), 0, 15).astype(np.uint8)
    m = np.clip(np.rint(mins * _inv(dmin16)[:, None]), 0, 15).astype(np.uint8)
    step = d16[:, None] * sc
    off = dmin16[:, None] * m
    q = np.clip(np.rint((b + off[:, :, None]) * _inv(step)[:, :, None]), 0, 3)
    out = np.empty((nb, 84), dtype=np.uint8)
    out[:, 0:16] = sc | (m << 4)
    out[:, 16:80] = _pack_2bit(q.reshape(nb, 256))
    out[:, 80:82] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 82:84] = to_f16(dmin).view(np.uint8).reshape(-1, 2)
    return out.reshape(x.shape[0], -1)


def _signed_max(b):
    """The element of largest magnitude along the last axis, with its sign."""
    idx = np.abs(b).argmax(axis=-1)
    return np.take_along_axis(b, idx[..., None], axis=-1)[..., 0]


def quant_q3_k(x):
    """Q3_K: 16 sub-blocks of 16, x = d*sc*q, q in -4..3 (low 2 bits in qs, bit 2 in hmask),
    sc 6-bit signed (stored + 32). The largest-magnitude element of a sub-block maps to -4, the
    largest-magnitude scale to -32."""
    b = x.reshape(-1, 16, 16)
    nb = b.shape[0]
    scale = _signed_max(b) / -4.0
    d = _signed_max(scale) / -32.0
    d16 = _f16_value(d)
    sc = np.clip(np.rint(scale * _inv(d16)[:, None]), -32, 31).astype(np.int32)
    step = d16[:, None] * sc
    q = (np.clip(np.rint(b * _inv(step)[:, :, None]), -4, 3) + 4).astype(np.uint8).reshape(nb, 256)
    out = np.empty((nb, 110), dtype=np.uint8)
    hm = (q >> 2).reshape(nb, 8, 32) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    out[:, 0:32] = np.bitwise_or.reduce(hm, axis=1)    # element e: byte e % 32, bit e // 32
    out[:, 32:96] = _pack_2bit(q & 3)
    u = (sc + 32).astype(np.uint8)                     # 0..63
    s = np.zeros((nb, 12), dtype=np.uint8)
    s[:, 0:8] = (u[:, 0:8] & 0xF) | ((u[:, 8:16] & 0xF) << 4)
    for j in range(16):                                # top 2 bits: byte 8 + j % 4, bit 2 (j // 4)
        s[:, 8 + j % 4] |= (u[:, j] >> 4) << (2 * (j // 4))
    out[:, 96:108] = s
    out[:, 108:110] = to_f16(d).view(np.uint8).reshape(-1, 2)
    return out.reshape(x.shape[0], -1)


def quant_q5_k(x):
    """Q5_K: Q4_K's layout with 31 steps per sub-block and the fifth bit of element 32j + l in
    bit j of qh[l]."""
    b = x.reshape(-1, 8, 32)
    nb = b.shape[0]
    lo = np.minimum(b.min(axis=2), 0.0)
    scale = (b.max(axis=2) - lo) / 31.0
    mins = -lo
    d, dmin = scale.max(axis=1) / 63.0, mins.max(axis=1) / 63.0
    d16, dmin16 = _f16_value(d), _f16_value(dmin)
    sc = np.clip(np.rint(scale * _inv(d16)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mins * _inv(dmin16)[:, None]), 0, 63).astype(np.uint8)
    step = d16[:, None] * sc
    off = dmin16[:, None] * m
    q = np.clip(np.rint((b + off[:, :, None]) * _inv(step)[:, :, None]), 0, 31).astype(np.uint8)
    out = np.empty((nb, 176), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = to_f16(dmin).view(np.uint8).reshape(-1, 2)
    s = np.zeros((nb, 12), dtype=np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    out[:, 4:16] = s
    out[:, 16:48] = np.bitwise_or.reduce((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None],
                                         axis=1)
    qq = (q & 0xF).reshape(nb, 4, 2, 32)
    out[:, 48:] = (qq[:, :, 0, :] | (qq[:, :, 1, :] << 4)).reshape(nb, 128)
    return out.reshape(x.shape[0], -1)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)


def quant_iq4_xs(x):
    """IQ4_XS: 8 sub-blocks of 32, x = d * (sc - 32) * v[i] with v the 16 non-uniform IQ4_NL
    levels (-127..113) and sc 6-bit (low 4 bits in scales_l, top 2 in scales_h). The largest-
    magnitude element maps to -127, the largest-magnitude scale to -32; each element takes the
    nearest level."""
    b = x.reshape(-1, 8, 32)
    nb = b.shape[0]
    scale = _signed_max(b) / -127.0
    d = _signed_max(scale) / -32.0
    d16 = _f16_value(d)
    sc = np.clip(np.rint(scale * _inv(d16)[:, None]), -32, 31).astype(np.int32)
    step = d16[:, None] * sc
    t = b * _inv(step)[:, :, None]
    idx = np.abs(t[..., None] - IQ4_VALUES).argmin(axis=-1).astype(np.uint8)
    out = np.empty((nb, 136), dtype=np.uint8)
    out[:, 0:2] = to_f16(d).view(np.uint8).reshape(-1, 2)
    u = (sc + 32).astype(np.uint16)
    sh = np.bitwise_or.reduce((u >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=1)
    out[:, 2:4] = sh.astype("<u2").view(np.uint8).reshape(-1, 2)
    out[:, 4:8] = ((u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    # per sub-block 16 bytes: element j in the low nibble of byte j, element j + 16 in the high
    out[:, 8:] = (idx[:, :, :16] | (idx[:, :, 16:] << 4)).reshape(nb, 128)
    return out.reshape(x.shape[0], -1)


def encode(x, tname):
    """(rows, n) float32 -> raw bytes of the tensor in type tname."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if tname == "f32":
        return x.astype("<f4").tobytes()
    if tname == "f16":
        return to_f16(x).astype("<f2").tobytes()
    if tname == "bf16":
        return to_bf16(x).astype("<u2").tobytes()
    fn = {"q8_0": quant_q8_0, "q4_0": quant_q4_0, "q2_k": quant_q2_k, "q3_k": quant_q3_k,
          "q4_k": quant_q4_k, "q5_k": quant_q5_k, "q6_k": quant_q6_k, "iq4_xs": quant_iq4_xs,
          "q4_1": quant_q4_1, "q5_0": quant_q5_0, "q5_1": quant_q5_1, "iq4_nl": quant_iq4_nl,
          "mxfp4": quant_mxfp4}[tname]
    return fn(x).tobytes()


def row_bytes(tname, n):
    _, blck, size = TYPES[tname]
    if n % blck:
        raise ValueError(f"row of {n} elements is not a multiple of {tname}'s block of {blck}")
    return n // blck * size


# ---- metadata encoding --------------------------------------------------------

def _s(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_bytes(key, vtype, value, elem_type=None):
    out = _s(key) + struct.pack("<I", vtype)
    if vtype == T_STRING:
        return out + _s(value)
    if vtype == T_ARRAY:
        out += struct.pack("<IQ", elem_type, len(value))
        if elem_type == T_STRING:
            return out + b"".join(_s(v) for v in value)
        fmt = _SCALAR_FMT[elem_type]
        return out + np.asarray(value, dtype=np.dtype(fmt)).tobytes()
    return out + struct.pack(_SCALAR_FMT[vtype], value)


def _skip_value(buf, pos, vtype):
    """Position after one value of vtype starting at pos (for copying raw KVs)."""
    if vtype == T_STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == T_ARRAY:
        et, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if et == T_STRING:
            for _ in range(n):
                (ln,) = struct.unpack_from("<Q", buf, pos)
                pos += 8 + ln
            return pos
        return pos + n * struct.calcsize(_SCALAR_FMT[et])
    return pos + struct.calcsize(_SCALAR_FMT[vtype])


def read_tokenizer_kvs(path):
    """Raw key/value records whose key starts with 'tokenizer.' from a GGUF file, and
    the number of tokens in tokenizer.ggml.tokens."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    pos = 24
    recs, n_tokens = [], None
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + klen].decode("utf-8")
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos = _skip_value(buf, pos + 4, vtype)
        if key.startswith("tokenizer."):
            recs.append((key, buf[start:pos]))
            if key == "tokenizer.ggml.tokens":
                (n_tokens,) = struct.unpack_from("<Q", buf, start + 8 + klen + 4 + 4)
    if n_tokens is None:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens")
    return recs, n_tokens


def synthetic_vocab(n):
    """An SPM-style vocabulary: <unk>, <s>, </s>, 256 byte tokens, then unique pieces."""
    if n < 260:
        raise ValueError("a synthetic vocabulary needs at least 260 tokens")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = list(letters)
    k = 0
    while len(tokens) < n:
        if k == len(words):  # next length: every word extended by every letter
            words = [w + c for w in words for c in letters]
            k = 0
        w = words[k]
        k += 1
        for piece in ("\u2581" + w, w):
            if len(tokens) < n:
                tokens.append(piece)
                types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(n - 259)]
    return tokens, scores, types


# ---- model description -------------------------------------------------------

def resolve(cfg):
    """Fill the derived fields of a config dict (preset, then explicit keys)."""
    c = dict(DEFAULTS)
    if cfg.get("preset"):
        c.update(PRESETS[cfg["preset"]])
    c.update({k: v for k, v in cfg.items() if v is not None and k != "preset"})
    if c["n_kv_heads"] is None:
        c["n_kv_heads"] = c["n_heads"]
    if c["head_dim"] is None:
        if c["dim"] % c["n_heads"]:
            raise ValueError("dim is not a multiple of n_heads; give --head-dim")
        c["head_dim"] = c["dim"] // c["n_heads"]
    if c["ff"] is None:
        c["ff"] = 4 * c["dim"]
    if c["qkv_bias"] is None:
        c["qkv_bias"] = c["arch"] in ("qwen2", "qwen2moe", "gpt-oss")
    if not c["embd_scale"] > 0:
        raise ValueError("embd_scale must be positive")
    if c["n_heads"] % c["n_kv_heads"]:
        raise ValueError("n_heads must be a multiple of n_kv_heads")
    if c["head_dim"] % 2:
        raise ValueError("head_dim must be even (RoPE rotates pairs)")
    if c["arch"] not in ARCHS:
        raise ValueError("arch must be one of " + ", ".join(ARCHS))
    if "tied_only" in ARCHS[c["arch"]]:
        c["tied"] = True  # gemma2 has no output.weight: the embedding is the output matrix
    if "softcap" in ARCHS[c["arch"]]:
        c["attn_softcap"] = 50.0 if c["attn_softcap"] is None else c["attn_softcap"]
        c["final_softcap"] = 30.0 if c["final_softcap"] is None else c["final_softcap"]
    if c["arch"] in MOE_ARCHS and c["n_expert"] < 2:
        raise ValueError(f"{c['arch']} needs --n-expert >= 2")
    if c["n_expert"]:
        if c["arch"] not in ("llama", "gemma4") + MOE_ARCHS:
            raise ValueError(f"{c['arch']} has no experts")
        if not 1 <= c["n_expert_used"] <= c["n_expert"]:
            raise ValueError("--n-expert-used must be in 1..n_expert")
        if c["arch"] == "llama":
            c["ff_exp"] = c["ff"]  # Mixtral keeps the experts' width in feed_forward_length
        elif c["arch"] == "gpt-oss":
            c["ff_exp"] = c["ff"]  # the converter writes intermediate_size as both
        elif c["ff_exp"] is None:
            c["ff_exp"] = c["ff"] // c["n_expert_used"]
        if c["arch"] == "qwen2moe" and c["ff_shexp"] is None:
            c["ff_shexp"] = c["ff"]
    if c["arch"] == "deepseek2":
        if not c["mla"]:
            raise ValueError("deepseek2 needs the mla settings (use a deepseek2-* preset)")
        c["n_kv_heads"] = c["n_heads"]
        c["head_dim"] = c["mla"]["nope"] + c["mla"]["rope"]
        c["qkv_bias"] = False
    if c["arch"] == "gpt-oss":
        if not c["swa"]:
            raise ValueError("gpt-oss needs --swa (llama.cpp requires attention.sliding_window)")
        if not c["qkv_bias"]:
            raise ValueError("gpt-oss always has q/k/v biases")
        c["expert_type"] = c["expert_type"] or "mxfp4"
    if c["arch"] == "gemma4":
        L = c["n_layers"]
        c["layer_types"] = c["layer_types"] or ("SSSSG" * L)[:L]
        c["head_dim_full"] = c["head_dim_full"] or c["head_dim"]
        c["n_kv_heads_full"] = c["n_kv_heads_full"] or c["n_kv_heads"]
        lt, nkv = c["layer_types"], L - c["n_shared"]
        if len(lt) != L or set(lt) - {"S", "G"}:
            raise ValueError("gemma4: layer_types needs one S (sliding) or G (global) per layer")
        if not c["swa"]:
            raise ValueError("gemma4 needs --swa (attention.sliding_window is required)")
        if c["n_heads"] % c["n_kv_heads_full"] or c["head_dim_full"] % 2:
            raise ValueError("gemma4: bad global head layout")
        if c["n_shared"]:  # llama.cpp: shared layers read layer nkv-2 (S) or nkv-1 (G)
            if nkv < 2 or lt[nkv - 2] != "S" or lt[nkv - 1] != "G":
                raise ValueError("gemma4: with shared KV layers, the last two cached layers "
                                 "must be S then G")
        c["tied"] = True if c["tied"] is None else c["tied"]
    if c["arch"] in ENCODERS:
        if c["n_kv_heads"] != c["n_heads"] or c["head_dim"] * c["n_heads"] != c["dim"]:
            raise ValueError("an encoder has n_kv_heads == n_heads and head_dim * n_heads == dim")
        if c["vocab_from"] is None:
            raise ValueError("an encoder needs --vocab-from (a bert vocabulary)")
        c["pooling"] = c["pooling"] or ("rank" if c["n_cls_out"] > 1 else "mean")
        if c["eps"] == DEFAULTS["eps"]:
            c["eps"] = 1e-12
    c["expert_type"] = c["expert_type"] or c["type"]
    for k in ("type", "embd_type", "output_type", "expert_type"):
        if c[k] is not None and c[k] not in TYPES:
            raise ValueError(f"unknown type {c[k]}")
    c["embd_type"] = c["embd_type"] or c["type"]
    c["output_type"] = c["output_type"] or c["type"]
    c["name"] = c["name"] or f"random-{c['arch']}-{c['dim']}x{c['n_layers']}-{c['type']}"
    return c


def encoder_tensor_list(c):
    """tensor_list for bert / nomic-bert."""
    d, ff, nv, w = c["dim"], c["ff"], c["vocab"], c["type"]
    bert = c["arch"] == "bert"
    ts = [("token_embd.weight", (d, nv), c["embd_type"], "embd")]
    if c["n_types"] > 0:
        ts.append(("token_types.weight", (d, c["n_types"]), "f32", "embd"))
    if bert:
        ts.append(("position_embd.weight", (d, c["ctx"]), "f32", "embd"))
    ts.append(("token_embd_norm.weight", (d,), "f32", "norm"))
    ts.append(("token_embd_norm.bias", (d,), "f32", "bias"))
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        if bert:
            for x in "qkv":
                ts.append((p + f"attn_{x}.weight", (d, d), w, "mat"))
                ts.append((p + f"attn_{x}.bias", (d,), "f32", "bias"))
        else:
            ts.append((p + "attn_qkv.weight", (d, 3 * d), w, "mat"))
        ts.append((p + "attn_output.weight", (d, d), w, "mat"))
        if bert:
            ts.append((p + "attn_output.bias", (d,), "f32", "bias"))
        ts.append((p + "attn_output_norm.weight", (d,), "f32", "norm"))
        ts.append((p + "attn_output_norm.bias", (d,), "f32", "bias"))
        ts.append((p + "ffn_up.weight", (d, ff), w, "mat"))
        if bert:
            ts.append((p + "ffn_up.bias", (ff,), "f32", "bias"))
        else:
            ts.append((p + "ffn_gate.weight", (d, ff), w, "mat"))
        ts.append((p + "ffn_down.weight", (ff, d), w, "mat"))
        if bert:
            ts.append((p + "ffn_down.bias", (d,), "f32", "bias"))
        ts.append((p + "layer_output_norm.weight", (d,), "f32", "norm"))
        ts.append((p + "layer_output_norm.bias", (d,), "f32", "bias"))
    if c["pooling"] == "rank":
        ts.append(("cls.weight", (d, d), "f32", "mat"))
        ts.append(("cls.bias", (d,), "f32", "bias"))
        ts.append(("cls.output.weight", (d, c["n_cls_out"]), "f32", "mat"))
        ts.append(("cls.output.bias", (c["n_cls_out"],), "f32", "bias"))
    return ts


def encoder_metadata(c, tok_recs):
    a = c["arch"]
    kv = [
        kv_bytes("general.architecture", T_STRING, a),
        kv_bytes("general.name", T_STRING, c["name"]),
        kv_bytes("general.alignment", T_UINT32, ALIGNMENT),
        kv_bytes("general.file_type", T_UINT32, FILE_TYPE[c["type"]]),
        kv_bytes(f"{a}.context_length", T_UINT32, c["ctx"]),
        kv_bytes(f"{a}.embedding_length", T_UINT32, c["dim"]),
        kv_bytes(f"{a}.feed_forward_length", T_UINT32, c["ff"]),
        kv_bytes(f"{a}.block_count", T_UINT32, c["n_layers"]),
        kv_bytes(f"{a}.attention.head_count", T_UINT32, c["n_heads"]),
        kv_bytes(f"{a}.attention.layer_norm_epsilon", T_FLOAT32, c["eps"]),
        kv_bytes(f"{a}.attention.causal", T_BOOL, False),
        kv_bytes(f"{a}.pooling_type", T_UINT32, POOLING[c["pooling"]]),
        kv_bytes("tokenizer.ggml.token_type_count", T_UINT32, c["n_types"]),
    ]
    if a == "nomic-bert":
        kv.append(kv_bytes(f"{a}.rope.freq_base", T_FLOAT32, c["rope_base"]))
    if c["pooling"] == "rank":
        kv.append(kv_bytes(f"{a}.classifier.output_labels", T_ARRAY,
                           [f"LABEL_{i}" for i in range(c["n_cls_out"])], T_STRING))
    kv.extend(raw for key, raw in tok_recs if key != "tokenizer.ggml.token_type_count")
    return kv


def gemma4_layer(c, i):
    """(head_dim, n_kv_heads, ff, has_kv) of gemma4 layer i."""
    glob = c["layer_types"][i] == "G"
    shared = i >= c["n_layers"] - c["n_shared"]
    ff = c["ff"] * (2 if shared and c["double_wide"] else 1)
    return (c["head_dim_full"] if glob else c["head_dim"],
            c["n_kv_heads_full"] if glob else c["n_kv_heads"], ff, not shared)


def gemma4_tensor_list(c):
    """gemma4's tensors as llama.cpp's converter names them."""
    d, nh, nv, w, P, L = c["dim"], c["n_heads"], c["vocab"], c["type"], c["n_pl"], c["n_layers"]
    ts = [("token_embd.weight", (d, nv), c["embd_type"], "embd"),
          ("rope_freqs.weight", (c["head_dim_full"] // 2,), "f32", "ropeprop")]
    if P:
        ts.append(("per_layer_token_embd.weight", (P * L, nv), c["embd_type"], "embd"))
        ts.append(("per_layer_model_proj.weight", (d, P * L), w, "mat"))
        ts.append(("per_layer_proj_norm.weight", (P,), "f32", "norm"))
    for i in range(L):
        p = f"blk.{i}."
        hd, nkv, ff, has_kv = gemma4_layer(c, i)
        ts.append((p + "attn_norm.weight", (d,), "f32", "norm"))
        ts.append((p + "attn_q.weight", (d, nh * hd), w, "mat"))
        ts.append((p + "attn_q_norm.weight", (hd,), "f32", "norm"))
        if has_kv:
            ts.append((p + "attn_k.weight", (d, nkv * hd), w, "mat"))
            if not (c["no_v_global"] and c["layer_types"][i] == "G"):
                ts.append((p + "attn_v.weight", (d, nkv * hd), w, "mat"))
            ts.append((p + "attn_k_norm.weight", (hd,), "f32", "norm"))
        ts.append((p + "attn_output.weight", (nh * hd, d), w, "mat"))
        ts.append((p + "post_attention_norm.weight", (d,), "f32", "norm"))
        ts.append((p + "ffn_norm.weight", (d,), "f32", "norm"))
        ts.append((p + "ffn_gate.weight", (d, ff), w, "mat"))
        ts.append((p + "ffn_up.weight", (d, ff), w, "mat"))
        ts.append((p + "ffn_down.weight", (ff, d), w, "mat"))
        ts.append((p + "post_ffw_norm.weight", (d,), "f32", "norm"))
        if c["n_expert"]:  # the experts beside the dense MLP (26B-A4B)
            ne, fe, we = c["n_expert"], c["ff_exp"], c["expert_type"]
            ts.append((p + "ffn_gate_inp.weight", (d, ne), "f32", "mat"))
            ts.append((p + "ffn_gate_inp.scale", (d,), "f32", "rscale"))
            ts.append((p + "pre_ffw_norm_2.weight", (d,), "f32", "norm"))
            ts.append((p + "post_ffw_norm_1.weight", (d,), "f32", "norm"))
            ts.append((p + "post_ffw_norm_2.weight", (d,), "f32", "norm"))
            if c["split_exps"]:
                ts.append((p + "ffn_gate_exps.weight", (d, fe, ne), we, "mat"))
                ts.append((p + "ffn_up_exps.weight", (d, fe, ne), we, "mat"))
            else:  # each expert's gate rows, then its up rows
                ts.append((p + "ffn_gate_up_exps.weight", (d, 2 * fe, ne), we, "mat"))
            ts.append((p + "ffn_down_exps.weight", (fe, d, ne), we, "mat"))
            ts.append((p + "ffn_down_exps.scale", (ne,), "f32", "oscale"))
        if c["out_scale"]:
            ts.append((p + "layer_output_scale.weight", (1,), "f32", "oscale"))
        if P:
            ts.append((p + "inp_gate.weight", (d, P), w, "mat"))
            ts.append((p + "proj.weight", (P, d), w, "mat"))
            ts.append((p + "post_norm.weight", (d,), "f32", "norm"))
    ts.append(("output_norm.weight", (d,), "f32", "norm"))
    if not c["tied"]:
        ts.append(("output.weight", (d, nv), c["output_type"], "embd"))
    return ts


def gemma4_metadata(c, kv):
    """The common records kv with gemma4's per-layer keys in place of the scalar ones."""
    a, L = c["arch"], c["n_layers"]
    per_layer = [gemma4_layer(c, i) for i in range(L)]
    drop = [_s(f"{a}.{k}") for k in ("feed_forward_length", "attention.head_count_kv",
                                     "rope.dimension_count", "attention.key_length",
                                     "attention.value_length")]
    kv = [r for r in kv if not any(r.startswith(x) for x in drop)]
    ffs = [f for _, _, f, _ in per_layer]
    kv.append(kv_bytes(f"{a}.feed_forward_length", T_ARRAY, ffs, T_INT32)
              if len(set(ffs)) > 1 else kv_bytes(f"{a}.feed_forward_length", T_UINT32, ffs[0]))
    kv.append(kv_bytes(f"{a}.attention.head_count_kv", T_ARRAY,
                       [n for _, n, _, _ in per_layer], T_INT32))
    kv.append(kv_bytes(f"{a}.attention.key_length", T_UINT32, c["head_dim_full"]))
    kv.append(kv_bytes(f"{a}.attention.value_length", T_UINT32, c["head_dim_full"]))
    kv.append(kv_bytes(f"{a}.attention.key_length_swa", T_UINT32, c["head_dim"]))
    kv.append(kv_bytes(f"{a}.attention.value_length_swa", T_UINT32, c["head_dim"]))
    kv.append(kv_bytes(f"{a}.rope.dimension_count", T_UINT32, c["head_dim_full"]))
    kv.append(kv_bytes(f"{a}.rope.dimension_count_swa", T_UINT32, c["head_dim"]))
    kv.append(kv_bytes(f"{a}.rope.freq_base_swa", T_FLOAT32, c["rope_base_swa"] or 10000.0))
    kv.append(kv_bytes(f"{a}.attention.sliding_window_pattern", T_ARRAY,
                       [t == "S" for t in c["layer_types"]], T_BOOL))
    kv.append(kv_bytes(f"{a}.attention.shared_kv_layers", T_UINT32, c["n_shared"]))
    kv.append(kv_bytes(f"{a}.embedding_length_per_layer_input", T_UINT32, c["n_pl"]))
    return kv


def tensor_list(c):
    """[(name, ne (ne[0] first), type, kind)] in file order. kind picks the init."""
    if c["arch"] in ENCODERS:
        return encoder_tensor_list(c)
    if c["arch"] == "gemma4":
        return gemma4_tensor_list(c)
    d, hd, nh, nkv, ff, nv = c["dim"], c["head_dim"], c["n_heads"], c["n_kv_heads"], c["ff"], \
        c["vocab"]
    w = c["type"]
    ts = [("token_embd.weight", (d, nv), c["embd_type"], "embd")]
    feat = ARCHS[c["arch"]]
    if c["longrope"]:
        ts.append(("rope_factors_long.weight", (hd // 2,), "f32", "ropef"))
        ts.append(("rope_factors_short.weight", (hd // 2,), "f32", "ropef"))
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        if "mla" in feat:
            ts += mla_layer_tensors(c, i)
            continue
        if "no_pre_norms" not in feat:
            ts.append((p + "attn_norm.weight", (d,), "f32", "norm"))
        if "fused" in feat:  # q, k and v rows stacked in one matrix
            ts.append((p + "attn_qkv.weight", (d, (nh + 2 * nkv) * hd), w, "mat"))
        else:
            ts.append((p + "attn_q.weight", (d, nh * hd), w, "mat"))
            ts.append((p + "attn_k.weight", (d, nkv * hd), w, "mat"))
            ts.append((p + "attn_v.weight", (d, nkv * hd), w, "mat"))
        if c["qkv_bias"]:
            ts.append((p + "attn_q.bias", (nh * hd,), "f32", "bias"))
            ts.append((p + "attn_k.bias", (nkv * hd,), "f32", "bias"))
            ts.append((p + "attn_v.bias", (nkv * hd,), "f32", "bias"))
        if "qk_norm" in feat:
            ts.append((p + "attn_q_norm.weight", (hd,), "f32", "norm"))
            ts.append((p + "attn_k_norm.weight", (hd,), "f32", "norm"))
        if "qk_norm_full" in feat:  # over the whole projections
            ts.append((p + "attn_q_norm.weight", (nh * hd,), "f32", "norm"))
            ts.append((p + "attn_k_norm.weight", (nkv * hd,), "f32", "norm"))
        ts.append((p + "attn_output.weight", (nh * hd, d), w, "mat"))
        if "gptoss" in feat:
            ts.append((p + "attn_output.bias", (d,), "f32", "bias"))
            ts.append((p + "attn_sinks.weight", (nh,), "f32", "sink"))
            # gpt-oss's FFN pre-norm, under llama.cpp's name for it
            ts.append((p + "post_attention_norm.weight", (d,), "f32", "norm"))
        if "post_norms" in feat:
            ts.append((p + "post_attention_norm.weight", (d,), "f32", "norm"))
        if "no_pre_norms" not in feat and "gptoss" not in feat:
            ts.append((p + "ffn_norm.weight", (d,), "f32", "norm"))
        if c["n_expert"]:
            ne, fe, we = c["n_expert"], c["ff_exp"], c["expert_type"]
            ts.append((p + "ffn_gate_inp.weight", (d, ne), "f32", "mat"))
            ts.append((p + "ffn_gate_exps.weight", (d, fe, ne), we, "mat"))
            ts.append((p + "ffn_up_exps.weight", (d, fe, ne), we, "mat"))
            ts.append((p + "ffn_down_exps.weight", (fe, d, ne), we, "mat"))
            if "gptoss" in feat:
                ts.append((p + "ffn_gate_inp.bias", (ne,), "f32", "bias"))
                ts.append((p + "ffn_gate_exps.bias", (fe, ne), "f32", "bias"))
                ts.append((p + "ffn_up_exps.bias", (fe, ne), "f32", "bias"))
                ts.append((p + "ffn_down_exps.bias", (d, ne), "f32", "bias"))
            if c["ff_shexp"]:
                fs = c["ff_shexp"]
                ts.append((p + "ffn_gate_inp_shexp.weight", (d,), "f32", "mat"))
                ts.append((p + "ffn_gate_shexp.weight", (d, fs), w, "mat"))
                ts.append((p + "ffn_up_shexp.weight", (d, fs), w, "mat"))
                ts.append((p + "ffn_down_shexp.weight", (fs, d), w, "mat"))
            continue
        if "fused" in feat:  # gate rows, then up rows
            ts.append((p + "ffn_up.weight", (d, 2 * ff), w, "mat"))
        else:
            ts.append((p + "ffn_gate.weight", (d, ff), w, "mat"))
            ts.append((p + "ffn_up.weight", (d, ff), w, "mat"))
        ts.append((p + "ffn_down.weight", (ff, d), w, "mat"))
        if "post_norms" in feat:
            ts.append((p + "post_ffw_norm.weight", (d,), "f32", "norm"))
    ts.append(("output_norm.weight", (d,), "f32", "norm"))
    if not c["tied"]:
        ts.append(("output.weight", (d, nv), c["output_type"], "embd"))
    return ts


def mla_layer_tensors(c, i):
    """A deepseek2 layer's tensors, in the converter's order."""
    d, nh, ml, w = c["dim"], c["n_heads"], c["mla"], c["type"]
    r, qk, nope, v = ml["kv_lora"], ml["nope"] + ml["rope"], ml["nope"], ml["v"]
    p = f"blk.{i}."
    ts = [(p + "attn_norm.weight", (d,), "f32", "norm")]
    if ml["q_lora"]:
        ts.append((p + "attn_q_a.weight", (d, ml["q_lora"]), w, "mat"))
        ts.append((p + "attn_q_a_norm.weight", (ml["q_lora"],), "f32", "norm"))
        ts.append((p + "attn_q_b.weight", (ml["q_lora"], nh * qk), w, "mat"))
    else:
        ts.append((p + "attn_q.weight", (d, nh * qk), w, "mat"))
    ts.append((p + "attn_kv_a_mqa.weight", (d, r + ml["rope"]), w, "mat"))
    ts.append((p + "attn_kv_a_norm.weight", (r,), "f32", "norm"))
    # the per-head up-projections have short rows (nope, kv_lora): where the type's block
    # does not divide them, q8_0, as llama.cpp's quantizer falls back for such rows
    def fit(t, n):
        return t if n % TYPES[t][1] == 0 else "q8_0"
    if ml["split"]:
        ts.append((p + "attn_k_b.weight", (nope, r, nh), fit(w, nope), "mat"))
        ts.append((p + "attn_v_b.weight", (r, v, nh), fit(w, r), "mat"))
    else:
        ts.append((p + "attn_kv_b.weight", (r, nh * (nope + v)), fit(w, r), "mat"))
    ts.append((p + "attn_output.weight", (nh * v, d), w, "mat"))
    ts.append((p + "ffn_norm.weight", (d,), "f32", "norm"))
    if i < ml["lead"]:
        ts.append((p + "ffn_gate.weight", (d, c["ff"]), w, "mat"))
        ts.append((p + "ffn_up.weight", (d, c["ff"]), w, "mat"))
        ts.append((p + "ffn_down.weight", (c["ff"], d), w, "mat"))
        return ts
    ne, fe, we = c["n_expert"], c["ff_exp"], c["expert_type"]
    ts.append((p + "ffn_gate_inp.weight", (d, ne), "f32", "mat"))
    if ml["probs_b"]:
        ts.append((p + "exp_probs_b.bias", (ne,), "f32", "bias"))
    ts.append((p + "ffn_gate_exps.weight", (d, fe, ne), we, "mat"))
    ts.append((p + "ffn_up_exps.weight", (d, fe, ne), we, "mat"))
    ts.append((p + "ffn_down_exps.weight", (fe, d, ne), we, "mat"))
    if ml["shared"]:
        fs = fe * ml["shared"]
        ts.append((p + "ffn_gate_shexp.weight", (d, fs), w, "mat"))
        ts.append((p + "ffn_up_shexp.weight", (d, fs), w, "mat"))
        ts.append((p + "ffn_down_shexp.weight", (fs, d), w, "mat"))
    return ts


def mla_metadata(c):
    """deepseek2's keys beyond the common ones (the converter's names)."""
    a, ml = c["arch"], c["mla"]
    r, rot = ml["kv_lora"], ml["rope"]
    kv = [kv_bytes(f"{a}.attention.q_lora_rank", T_UINT32, ml["q_lora"]),
          kv_bytes(f"{a}.attention.kv_lora_rank", T_UINT32, r)]
    if ml["split"]:
        kv += [kv_bytes(f"{a}.attention.key_length", T_UINT32, r + rot),
               kv_bytes(f"{a}.attention.value_length", T_UINT32, r),
               kv_bytes(f"{a}.attention.key_length_mla", T_UINT32, ml["nope"] + rot),
               kv_bytes(f"{a}.attention.value_length_mla", T_UINT32, ml["v"])]
    else:
        kv += [kv_bytes(f"{a}.attention.key_length", T_UINT32, ml["nope"] + rot),
               kv_bytes(f"{a}.attention.value_length", T_UINT32, ml["v"])]
    kv += [kv_bytes(f"{a}.leading_dense_block_count", T_UINT32, ml["lead"]),
           kv_bytes(f"{a}.expert_shared_count", T_UINT32, ml["shared"]),
           kv_bytes(f"{a}.expert_weights_scale", T_FLOAT32, ml["scale"]),
           kv_bytes(f"{a}.expert_weights_norm", T_BOOL, ml["norm"]),
           kv_bytes(f"{a}.expert_gating_func", T_UINT32, ml["gating"])]
    if ml["groups"][0]:
        kv += [kv_bytes(f"{a}.expert_group_count", T_UINT32, ml["groups"][0]),
               kv_bytes(f"{a}.expert_group_used_count", T_UINT32, ml["groups"][1])]
    if c["yarn"] and ml["log_mul"]:
        kv.append(kv_bytes(f"{a}.rope.scaling.yarn_log_multiplier", T_FLOAT32, ml["log_mul"]))
    return kv


def metadata(c, tok_recs):
    a = c["arch"]
    if a in ENCODERS:
        return encoder_metadata(c, tok_recs)
    kv = [
        kv_bytes("general.architecture", T_STRING, a),
        kv_bytes("general.name", T_STRING, c["name"]),
        kv_bytes("general.alignment", T_UINT32, ALIGNMENT),
        kv_bytes("general.file_type", T_UINT32, FILE_TYPE[c["type"]]),
        kv_bytes(f"{a}.context_length", T_UINT32, c["ctx"]),
        kv_bytes(f"{a}.embedding_length", T_UINT32, c["dim"]),
        kv_bytes(f"{a}.feed_forward_length", T_UINT32, c["ff"]),
        kv_bytes(f"{a}.block_count", T_UINT32, c["n_layers"]),
        kv_bytes(f"{a}.attention.head_count", T_UINT32, c["n_heads"]),
        kv_bytes(f"{a}.attention.head_count_kv", T_UINT32,
                 1 if c["mla"] and c["mla"]["split"] else c["n_kv_heads"]),
        kv_bytes(f"{a}.attention.layer_norm_rms_epsilon", T_FLOAT32, c["eps"]),
        kv_bytes(f"{a}.rope.freq_base", T_FLOAT32, c["rope_base"]),
        kv_bytes(f"{a}.rope.dimension_count", T_UINT32,
                 c["mla"]["rope"] if c["mla"] else c["head_dim"]),
        kv_bytes(f"{a}.vocab_size", T_UINT32, c["vocab"]),
    ]
    if c["mla"]:
        kv += mla_metadata(c)
    elif c["head_dim"] * c["n_heads"] != c["dim"] or "key_length" in ARCHS[a]:
        kv.append(kv_bytes(f"{a}.attention.key_length", T_UINT32, c["head_dim"]))
        kv.append(kv_bytes(f"{a}.attention.value_length", T_UINT32, c["head_dim"]))
    if c["n_expert"]:
        kv.append(kv_bytes(f"{a}.expert_count", T_UINT32, c["n_expert"]))
        kv.append(kv_bytes(f"{a}.expert_used_count", T_UINT32, c["n_expert_used"]))
        if a != "llama":
            kv.append(kv_bytes(f"{a}.expert_feed_forward_length", T_UINT32, c["ff_exp"]))
        if c["ff_shexp"] and not c["mla"]:
            kv.append(kv_bytes(f"{a}.expert_shared_feed_forward_length", T_UINT32,
                               c["ff_shexp"]))
    if c["yarn"]:  # YaRN as llama.cpp's converter writes it
        kv.append(kv_bytes(f"{a}.rope.scaling.type", T_STRING, "yarn"))
        kv.append(kv_bytes(f"{a}.rope.scaling.factor", T_FLOAT32, c["yarn"]))
        kv.append(kv_bytes(f"{a}.rope.scaling.original_context_length", T_UINT32,
                           c["yarn_orig_ctx"] or c["ctx"]))
    elif c["rope_scale"] != 1.0:
        kv.append(kv_bytes(f"{a}.rope.scaling.type", T_STRING, "linear"))
        kv.append(kv_bytes(f"{a}.rope.scaling.factor", T_FLOAT32, c["rope_scale"]))
    if c["granite_scales"]:
        es, ats, rs, ls = c["granite_scales"]
        kv.append(kv_bytes(f"{a}.embedding_scale", T_FLOAT32, es))
        kv.append(kv_bytes(f"{a}.attention.scale", T_FLOAT32, ats))
        kv.append(kv_bytes(f"{a}.residual_scale", T_FLOAT32, rs))
        kv.append(kv_bytes(f"{a}.logit_scale", T_FLOAT32, ls))
    if c["attn_softcap"]:
        kv.append(kv_bytes(f"{a}.attn_logit_softcapping", T_FLOAT32, c["attn_softcap"]))
    if c["final_softcap"]:
        kv.append(kv_bytes(f"{a}.final_logit_softcapping", T_FLOAT32, c["final_softcap"]))
    if c["swa"]:
        kv.append(kv_bytes(f"{a}.attention.sliding_window", T_UINT32, c["swa"]))
    if c["swa_pattern"]:
        kv.append(kv_bytes(f"{a}.attention.sliding_window_pattern", T_UINT32, c["swa_pattern"]))
    if c["rope_base_swa"] and a != "gemma4":
        kv.append(kv_bytes(f"{a}.rope.freq_base_swa", T_FLOAT32, c["rope_base_swa"]))
    if a == "gemma4":
        kv = gemma4_metadata(c, kv)
    if c["longrope"]:
        orig = c["orig_ctx"] or c["ctx"]
        scale = c["ctx"] / orig
        kv.append(kv_bytes(f"{a}.rope.scaling.original_context_length", T_UINT32, orig))
        # the converter's LongRoPE attention factor: sqrt(1 + ln(scale) / ln(orig)), 1 unscaled
        att = float(np.sqrt(1 + np.log(scale) / np.log(orig))) if scale > 1 else 1.0
        kv.append(kv_bytes(f"{a}.rope.scaling.attn_factor", T_FLOAT32, att))
    if tok_recs is not None:
        kv.extend(raw for _, raw in tok_recs)
    else:
        tokens, scores, types = synthetic_vocab(c["vocab"])
        kv += [
            kv_bytes("tokenizer.ggml.model", T_STRING, "llama"),
            kv_bytes("tokenizer.ggml.tokens", T_ARRAY, tokens, T_STRING),
            kv_bytes("tokenizer.ggml.scores", T_ARRAY, scores, T_FLOAT32),
            kv_bytes("tokenizer.ggml.token_type", T_ARRAY, types, T_INT32),
            kv_bytes("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
            kv_bytes("tokenizer.ggml.bos_token_id", T_UINT32, 1),
            kv_bytes("tokenizer.ggml.eos_token_id", T_UINT32, 2),
            kv_bytes("tokenizer.ggml.add_bos_token", T_BOOL, True),
            kv_bytes("tokenizer.ggml.add_eos_token", T_BOOL, False),
        ]
    return kv


def _values(c, name, ne, kind, rng, rows):
    """Next `rows` rows (of ne[0] values) of a tensor's init, float32."""
    n = ne[0]
    if kind == "norm":
        return rng.uniform(0.8, 1.2, size=(rows, n)).astype(np.float32)
    if kind == "ropef":  # LongRoPE frequency divisors, >= 1 as in the released models
        return rng.uniform(1.0, 4.0, size=(rows, n)).astype(np.float32)
    if kind == "ropeprop":  # gemma4's proportional RoPE: a fraction of the pairs rotates
        n_r = int(n * c["rot_frac_full"])
        return np.array([[1.0] * n_r + [1e30] * (n - n_r)] * rows, dtype=np.float32)
    if kind == "rscale":  # gemma4's router input scale: RMSNorm(x) / sqrt(dim) times it,
        # near sqrt(dim) so the router logits spread about 1 (clear expert choices)
        return rng.uniform(0.5, 1.5, size=(rows, n)).astype(np.float32) * np.float32(np.sqrt(n))
    if kind == "oscale":  # gemma4's per-layer output scalar
        return rng.uniform(0.5, 1.5, size=(rows, n)).astype(np.float32)
    if kind == "sink":  # attention sink logits: of the size of the scores they join
        return rng.uniform(-1.0, 3.0, size=(rows, n)).astype(np.float32)
    if kind == "bias":
        return (rng.standard_normal((rows, n), dtype=np.float32) * np.float32(0.2))
    std = (c["embd_scale"] if kind == "embd" else 1.0) / np.sqrt(n)
    return rng.standard_normal((rows, n), dtype=np.float32) * np.float32(std)


def gguf_header(kvs, tensors, offsets):
    """The file's head up to its data: magic, counts, the metadata records kvs, and per tensor
    (name, ne, type name, ...) its info at its data offset, padded to ALIGNMENT."""
    head = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kvs)))
    for kv in kvs:
        head += kv
    for (name, ne, t, *_), o in zip(tensors, offsets):
        head += _s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", TYPES[t][0], o)
    head += b"\0" * (-len(head) % ALIGNMENT)
    return head


def generate(path, cfg, log=None):
    """Write the model described by cfg (keys as DEFAULTS, plus optional 'preset')."""
    c = resolve(cfg)
    tok_recs = None
    if c["vocab_from"]:
        tok_recs, c["vocab"] = read_tokenizer_kvs(c["vocab_from"])
    ts = tensor_list(c)
    kvs = metadata(c, tok_recs)
    sizes, offsets, off = [], [], 0
    for name, ne, t, _ in ts:
        rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        nb = row_bytes(t, ne[0]) * rows
        off = (off + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        offsets.append(off)
        sizes.append(nb)
        off += nb
    head = gguf_header(kvs, ts, offsets)
    total = len(head) + off
    t0 = last = time.time()
    done = 0
    with open(path, "wb") as f:
        f.write(head)
        for i, ((name, ne, t, kind), o, nb) in enumerate(zip(ts, offsets, sizes)):
            f.write(b"\0" * (len(head) + o - f.tell()))
            rng = np.random.default_rng([c["seed"], zlib.crc32(name.encode())])
            rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
            chunk = max(1, (1 << 22) // ne[0])  # about 4M values (16 MB of float32) at a time
            for r0 in range(0, rows, chunk):
                r = min(chunk, rows - r0)
                v = _values(c, name, ne, kind, rng, r)
                if name == c["poison"]:  # a broken model for fault tests: NaN weights
                    v[:] = np.float32("nan")
                f.write(encode(v, t))
            done += nb
            now = time.time()
            if log and (now - last >= 2.0 or i == len(ts) - 1):
                last = now
                log(f"  [{i + 1}/{len(ts)}] {name} {t}: {done / 1e9:.2f}/{off / 1e9:.2f} GB "
                    f"({100.0 * done / max(off, 1):.0f}%, {now - t0:.0f} s)")
        assert f.tell() == total
    return c


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random-weight llama-family GGUF model.")
    ap.add_argument("out")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--arch", choices=sorted(ARCHS))
    ap.add_argument("--swa", type=int, help="attention.sliding_window")
    ap.add_argument("--swa-pattern", type=int, help="attention.sliding_window_pattern")
    ap.add_argument("--longrope", action="store_true", default=None,
                    help="rope_factors_long/short tensors and LongRoPE keys (phi3)")
    ap.add_argument("--orig-ctx", type=int, help="rope.scaling.original_context_length")
    ap.add_argument("--pooling", choices=sorted(POOLING), help="encoders: pooling_type")
    ap.add_argument("--n-cls-out", type=int, help="rerankers: classifier outputs")
    ap.add_argument("--n-types", type=int, help="encoders: token types (0: no token_types)")
    ap.add_argument("--name")
    ap.add_argument("--layer-types", help="gemma4: S (sliding) or G (global) per layer")
    for k in ("dim", "n-layers", "n-heads", "n-kv-heads", "head-dim", "ff", "vocab", "ctx", "seed",
              "n-expert", "n-expert-used", "ff-exp", "ff-shexp", "head-dim-full",
              "n-kv-heads-full", "n-shared", "n-pl"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--yarn-orig-ctx", type=int, help="YaRN original context length")
    for k in ("rope-base", "rope-scale", "eps", "embd-scale", "yarn"):
        ap.add_argument("--" + k, type=float)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tied", dest="tied", action="store_true", default=None)
    g.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--qkv-bias", action="store_true", default=None)
    ap.add_argument("--type", choices=sorted(TYPES))
    ap.add_argument("--embd-type", choices=sorted(TYPES), help="token_embd type (default --type)")
    ap.add_argument("--expert-type", choices=sorted(TYPES),
                    help="expert matrices' type (default --type; gpt-oss: mxfp4)")
    ap.add_argument("--output-type", choices=sorted(TYPES), help="output.weight type")
    ap.add_argument("--vocab-from", help="copy tokenizer.* metadata from this GGUF file")
    ap.add_argument("--poison", metavar="TENSOR",
                    help="fill this tensor with NaN (a broken model, for fault tests; float types)")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    cfg = {k: v for k, v in vars(a).items() if k not in ("out", "quiet")}

    def log(msg):
        if not a.quiet:
            print(msg, flush=True)
    try:
        t0 = time.time()
        c = generate(a.out, cfg, log)
    except (ValueError, OSError) as e:
        print(f"gguf_gen: {e}", file=sys.stderr)
        return 1
    log(f"wrote {a.out}: {c['arch']} dim {c['dim']} layers {c['n_layers']} heads "
        f"{c['n_heads']}/{c['n_kv_heads']} hd {c['head_dim']} ff {c['ff']} vocab {c['vocab']} "
        f"{c['type']} {'tied' if c['tied'] else 'untied'} in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
