/*
 * model.h - a llama-family transformer loaded from GGUF, and the contexts that
 * run it.
 *
 * sp_model_t holds the hyper-parameters, the tokenizer and pointers to the
 * weights inside the read-only mapping; it is immutable after load and may be
 * shared by any number of contexts (and threads). sp_ctx_t holds one
 * sequence's KV cache, all activation buffers (sized at create for the largest
 * batch: nothing is allocated per token) and a thread pool.
 *
 * Supported: general.architecture llama (Llama 2/3, TinyLlama, Mistral, SmolLM),
 * mistral, qwen2 (QKV bias, NeoX RoPE), qwen3 (per-head q/k RMSNorm), gemma2
 * (embedding scale, post-norms, GELU FFN, soft-capping, sliding window on
 * alternating layers), gemma3 (q/k norms, sliding and global layers with two
 * RoPE bases), phi3 (fused QKV and gate/up, LongRoPE), smollm3 (no RoPE on
 * every 4th layer), granite (embedding, attention, residual and logit
 * scales), olmo2 (no pre-norms: q/k norms over the whole projection and
 * post-norms); mixture of experts (engine/moe.h): Mixtral-style llama,
 * qwen2moe, qwen3moe, gpt-oss (attention sinks and output bias, alternating
 * sliding window, MXFP4 experts with biases); gemma4 (dense: per-layer token inputs,
 * layers sharing an earlier layer's KV cache, head sizes per layer kind, value norms;
 * engine/gemma4.c); deepseek2 (multi-head latent attention with a latent KV cache,
 * engine/mla.h; leading dense layers, then experts with shared experts, sigmoid or
 * softmax gating, selection bias and expert groups); encoders bert and nomic-bert for embeddings and
 * reranking (engine/encoder.h). Tied or separate output matrix,
 * grouped-query attention, RoPE with freq base, linear scaling and Llama 3
 * rope_freqs factors from the file.
 */
#ifndef SP_ENGINE_MODEL_H
#define SP_ENGINE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "crypto/enc.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"
#include "sampan/status.h"

#define SP_MAX_LAYERS 512

typedef enum sp_rope_type {
    SP_ROPE_NORMAL = 0, /* rotate adjacent pairs (x[2i], x[2i+1]) */
    SP_ROPE_NEOX = 1,   /* rotate halves (x[i], x[i + n_rot/2]) */
} sp_rope_type_t;

typedef enum sp_ffn_act {
    SP_FFN_SILU = 0, /* silu(gate) * up (SwiGLU) */
    SP_FFN_GELU = 1, /* gelu(gate) * up, the tanh approximation (gemma) */
} sp_ffn_act_t;

typedef struct sp_hparams {
    char arch[32];
    int64_t n_vocab;
    int64_t n_ctx_train;   /* context length the model was trained for */
    int64_t n_embd;        /* model width */
    int64_t n_ff;          /* feed-forward width */
    int64_t n_layer;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;      /* per-head width of q and k (and v) */
    int64_t n_rot;         /* rotated dims per head (<= head_dim) */
    float rope_base;
    float rope_scale;      /* positions are divided by this (linear scaling) */
    float norm_eps;
    sp_rope_type_t rope_type;
    bool tied_output;
    /* YaRN (rope.scaling.type "yarn", engine/yarn.h): rope_scale stays 1,
     * each pair's frequency is blended and cos/sin scaled by rope_mscale */
    bool rope_yarn;
    float yarn_factor;      /* rope.scaling.factor */
    int64_t yarn_orig_ctx;  /* rope.scaling.original_context_length */
    float yarn_beta_fast, yarn_beta_slow;
    float rope_mscale;
    /* Beyond the llama family (gemma2/3, phi3, smollm3; the defaults are the
     * llama computation). */
    float attn_scale;      /* query scale: 1/sqrt(head_dim) unless the architecture says */
    float embd_scale;      /* embeddings times this (gemma: sqrt(n_embd)); 1 = none */
    float attn_softcap;    /* attention scores c tanh(s / c); 0 = none */
    float final_softcap;   /* logits likewise; 0 = none */
    sp_ffn_act_t ffn_act;
    int64_t n_swa;         /* sliding window of the layers marked in layer_swa; 0 = none */
    float rope_base_swa;   /* RoPE base and linear scale of the sliding layers */
    float rope_scale_swa;
    int64_t n_ctx_orig;    /* LongRoPE: long factors above this context, short ones up to it */
    float rope_attn_factor; /* cos and sin times this (LongRoPE's attention factor); 1 = none */
    float residual_scale;  /* sub-layer outputs times this before the residual add (granite);
                              1 = none */
    float logit_scale;     /* logits divided by this (granite); 1 = none */
    bool qk_norm_full;     /* the q/k norms span the whole projection, not a head (olmo2) */
    /* Multi-head latent attention (deepseek2, engine/mla.h); all 0 without.
     * head_dim is then the latent cache width n_rot + mla_kv_lora and
     * n_head_kv 1; the per-head query/key width is mla_nope + n_rot. */
    int64_t mla_kv_lora;   /* attention.kv_lora_rank */
    int64_t mla_q_lora;    /* attention.q_lora_rank; 0 = one query matrix */
    int64_t mla_nope;      /* per-head query/key dims without RoPE */
    int64_t mla_v_dim;     /* per-head value width */
    uint8_t layer_swa[SP_MAX_LAYERS];  /* 1: the layer attends within n_swa positions */
    uint8_t layer_nope[SP_MAX_LAYERS]; /* 1: the layer applies no RoPE (smollm3) */
    /* gemma4 (engine/gemma4.c; 0 / false elsewhere = the uniform layout above): sliding
     * layers with their own head width and rotated dims, KV heads and FFN width per layer
     * (n_head_kv and n_ff are then the largest), layers from n_layer_kv on that keep no
     * cache and read layer_kv_src's, per-layer token inputs of n_embd_pl, a weightless
     * RMSNorm of each value head, rope_freqs on the global layers only. */
    int64_t head_dim_swa;
    int64_t n_rot_swa;
    int64_t n_layer_kv;
    int64_t n_embd_pl;
    bool v_norm;
    bool rope_freqs_global;
    int32_t layer_n_head_kv[SP_MAX_LAYERS];
    int32_t layer_n_ff[SP_MAX_LAYERS];
    int32_t layer_kv_src[SP_MAX_LAYERS];
} sp_hparams_t;

typedef struct sp_model sp_model_t;
typedef struct sp_ctx sp_ctx_t;

/* Load and validate. On failure *out is NULL and err names the file and field.
 * An encrypted file (SPENC1 magic or a .enc name, crypto/enc.h) is decrypted
 * into locked memory with the key from SAMPAN_MODEL_KEY. */
sp_status_t sp_model_load(const char *path, sp_model_t **out, char *err, size_t err_len);
/* Same with the key of an encrypted file taken from `keys` (NULL = SAMPAN_MODEL_KEY;
 * read only when the file is encrypted). Errors name the file and what failed:
 * "<file> is encrypted: set ...", "wrong key", "chunk N of M failed authentication",
 * "truncated: expected N chunks, found M", "bad header". Nothing stays allocated on
 * failure; the plaintext is zeroed and unmapped by sp_model_free. */
sp_status_t sp_model_load_ex(const char *path, const sp_enc_key_src_t *keys, sp_model_t **out,
                             char *err, size_t err_len);
/* Same over an already open GGUF handle, which the model then owns. */
sp_status_t sp_model_load_gguf(sp_gguf_t *g, sp_model_t **out, char *err, size_t err_len);
void sp_model_free(sp_model_t *m); /* NULL is a no-op; contexts must be destroyed first */

const sp_hparams_t *sp_model_hparams(const sp_model_t *m);
const sp_tokenizer_t *sp_model_tokenizer(const sp_model_t *m);
const sp_gguf_t *sp_model_gguf(const sp_model_t *m);
size_t sp_model_weight_bytes(const sp_model_t *m);
/* Load-time weight repacking (engine/repack_weights.c): on by default; off for the
 * whole process with sp_model_set_repack(false) (sampan --no-repack) or the environment
 * SAMPAN_REPACK=0. Applies to models loaded afterwards. The bytes the packed copies of a
 * model take (0 when none), on top of the file's mapping. */
void sp_model_set_repack(bool on);
bool sp_model_repack_enabled(void);
size_t sp_model_repack_bytes(const sp_model_t *m);
/* The bytes of the file's copy of the packed tensors given back after packing (whole pages:
 * dropped from the mapping and the page cache, or freed where the file was read into memory
 * or decrypted); 0 when nothing was packed or the weights are a caller's buffer. */
size_t sp_model_repack_released_bytes(const sp_model_t *m);

/* The KV cache's element type (engine/batch.h; layouts in kernels/kernels.h).
 * SP_KV_TYPE_F16 is 1, so a boolean "half precision" flag converts to the right type. */
typedef enum sp_kv_type {
    SP_KV_TYPE_F32 = 0,  /* 4 bytes per element: exact against the reference */
    SP_KV_TYPE_F16 = 1,  /* 2 bytes: about 5e-4 relative rounding */
    SP_KV_TYPE_Q8_0 = 2, /* GGUF Q8_0 groups of 32 along head_dim, an F16 scale each:
                            1.0625 bytes for head_dim 64/128; CPU layers only */
    SP_KV_TYPE_COUNT
} sp_kv_type_t;

/* "f32", "f16", "q8_0" ("?" outside the enum), and back (-1 when unknown;
 * case-insensitive). */
const char *sp_kv_type_name(sp_kv_type_t t);
int sp_kv_type_from_name(const char *name);

typedef struct sp_ctx_params {
    int64_t n_ctx;     /* KV positions; 0 = the model's, capped at 4096 */
    int64_t n_batch;   /* most tokens per forward call; default 512 */
    int n_threads;     /* 0 = one per core */
    bool logits_all;   /* keep logits of every position (eval, tests) */
    sp_kv_type_t kv_type; /* KV cache type: F16 halves the memory and the attention
                        * reads at about 5e-4 relative rounding of keys and values,
                        * Q8_0 takes about a quarter (docs/design.md, BENCHMARKS.md);
                        * the default F32 keeps the engine exact against the reference */
} sp_ctx_params_t;

sp_ctx_params_t sp_ctx_default_params(void);
sp_status_t sp_ctx_create(const sp_model_t *m, const sp_ctx_params_t *p, sp_ctx_t **out,
                          char *err, size_t err_len);
void sp_ctx_destroy(sp_ctx_t *c);
/* Check p as sp_ctx_create does (the same errors) and give in *out the values it
 * would use: n_ctx with the default applied, n_batch capped at n_ctx. */
sp_status_t sp_ctx_resolve(const sp_model_t *m, const sp_ctx_params_t *p, sp_ctx_params_t *out,
                           char *err, size_t err_len);
/* Heap bytes sp_ctx_create(m, p) allocates, without allocating them: its batch
 * (sp_batch_bytes), its KV pool (sp_kv_pool_bytes), the block table, the
 * logits_all rows and the embedding sum. 0 when create would refuse p,
 * SIZE_MAX when a size overflows. */
size_t sp_ctx_bytes(const sp_model_t *m, const sp_ctx_params_t *p);

/*
 * Run tokens[0..n) at positions pos..pos+n-1 of the context's sequence (the KV
 * cache must already hold positions 0..pos-1; later positions are overwritten).
 * Long inputs are split into n_batch chunks, each processed as a matrix
 * (prefill). Afterwards sp_ctx_logits gives the last position's logits.
 * SP_ERR_INVALID for ids outside the vocabulary or pos + n > n_ctx.
 */
sp_status_t sp_ctx_eval(sp_ctx_t *c, const int32_t *tokens, int64_t n, int64_t pos);
const float *sp_ctx_logits(const sp_ctx_t *c); /* n_vocab floats */
/* With logits_all: n_ctx rows of n_vocab, row p = logits after position p. */
const float *sp_ctx_logits_all(const sp_ctx_t *c);
int64_t sp_ctx_n_ctx(const sp_ctx_t *c);
/* Adds the context's evaluation jobs from now on to prof (NULL stops; sp_batch_profile says
 * what is counted). SP_ERR_UNSUPPORTED for an encoder's context, which does not evaluate. */
sp_status_t sp_ctx_profile(sp_ctx_t *c, sp_pool_prof_t *prof);

/*
 * Embedding of a whole text: evaluate tokens[0..n) at positions 0..n-1
 * (replacing whatever sequence the context held; split into n_batch chunks
 * like sp_ctx_eval), then write to out (n_embd floats) the mean over the n
 * positions of the final hidden states after output_norm (the output matrix is
 * not applied), scaled to unit L2 length.
 *
 * Why mean pooling: a decoder-only model has no [CLS] token, and its last
 * position alone mostly encodes what comes next; the mean over all positions
 * describes the whole text, and unit length makes the dot product of two
 * embeddings their cosine similarity. The positions are summed in order, so the
 * result is bit-identical for any n_batch and thread count. Nothing is
 * allocated per call. Afterwards the logits are stale (none are computed).
 * SP_ERR_INVALID for n < 1, n > n_ctx, ids outside the vocabulary or NULL
 * pointers.
 * An encoder (engine/encoder.h: bert, nomic-bert) pools as its file says
 * (mean, CLS or last position, unit length; SP_ERR_UNSUPPORTED for pooling
 * none); a reranker (pooling rank) writes its sp_model_n_cls_out raw scores to
 * out[0..] and zeroes the rest. sp_ctx_eval refuses an encoder
 * (SP_ERR_UNSUPPORTED).
 */
sp_status_t sp_ctx_embed(sp_ctx_t *c, const int32_t *tokens, int64_t n, float *out);
const char *sp_ctx_kernels_name(const sp_ctx_t *c);

#endif /* SP_ENGINE_MODEL_H */
