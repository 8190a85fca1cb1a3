/*
 * mla.h - multi-head latent attention (general.architecture deepseek2:
 * DeepSeek-V2/V2-Lite/V3, Moonlight, Kimi-style files), engine-private like
 * model_impl.h: its hyper-parameters and weights as loaded from GGUF and the
 * two halves of an attention layer that batch.c calls around its RoPE, cache
 * write and attention kernels.
 *
 * The cache holds the compressed latent, not per-head keys and values: the
 * layer is run as multi-query attention with one KV "head" of width
 * D = n_rot + kv_lora_rank (hp->head_dim; hp->n_head_kv is 1). A position's
 * key is [k_pe (n_rot, roped), c = RMSNorm(kv_a)(kv_lora_rank)] and its value
 * the same vector; a query head is [q_pe (roped), wk_b_h q_nope_h] (the key
 * up-projection absorbed into the query), so q.k = q_pe.k_pe + q_nope.(W_k c)
 * as in the expanded form. The attention output of a head is the weighted sum
 * of the values; its latent part (after the first n_rot lanes, which are
 * ignored) goes through wv_b_h to the head's v_dim outputs, then wo.
 * docs/design.md, "Multi-head latent attention" has the layout and the memory arithmetic.
 *
 * Threads: the products run on the caller's pool; the model part is
 * immutable after load. Memory: the model part (and, for files with the
 * legacy fused attn_kv_b, an F32 transposed copy of its key rows) is owned by
 * the model; per-step buffers live in the batch's scratch, sized at create by
 * sp__mla_scratch_bytes.
 */
#ifndef SP_ENGINE_MLA_H
#define SP_ENGINE_MLA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "engine/model_impl.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"

/* n_mat matrices (1, or one per head) of n_out rows of n_in elements,
 * mat_bytes apart (GGUF ne = [n_in, n_out, n_mat]). */
typedef struct sp_mla_w {
    const void *data;
    sp_type_t type;
    int64_t n_in, n_out, n_mat;
    size_t row_bytes, mat_bytes;
} sp_mla_w_t;

typedef struct sp_mla_layer {
    sp_mla_w_t wq_a;        /* (q_lora, n_embd) when q_lora > 0 */
    const float *q_a_norm;  /* (q_lora) */
    sp_mla_w_t wq_b;        /* (n_head * (nope + n_rot), q_lora) */
    sp_mla_w_t wq;          /* (n_head * (nope + n_rot), n_embd) when q_lora == 0 */
    sp_mla_w_t wkv_a;       /* (kv_lora + n_rot, n_embd): c, then k_pe */
    const float *kv_a_norm; /* (kv_lora) */
    sp_mla_w_t wk_b;        /* n_head x (kv_lora, nope) */
    sp_mla_w_t wv_b;        /* n_head x (v_dim, kv_lora) */
    sp_mla_w_t wo;          /* (n_embd, n_head * v_dim) */
} sp_mla_layer_t;

struct sp_mla_model {
    sp_mla_layer_t *layers; /* (n_layer) */
    float *wk_owned;        /* the transposed key rows of a legacy attn_kv_b, or NULL */
};

/* Whether general.architecture names an MLA architecture. */
bool sp__mla_arch(const char *arch);

/* The attention hyper-parameters of an MLA file, in place of load_hparams'
 * key_length / value_length / rope.dimension_count reading: hp->mla_*, n_rot,
 * head_dim = n_rot + kv_lora_rank (the latent width) and n_head_kv = 1.
 * hp->arch, n_embd and n_head must be set. Errors name the file and key. */
sp_status_t sp__mla_hparams(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len);

/* The attention tensors of every layer into m->mla, and the query scale and
 * YaRN cos/sin factor as llama.cpp computes them for deepseek2 (after the
 * generic hyper-parameters, YaRN included, are loaded). */
sp_status_t sp__mla_load(sp_model_t *m, char *err, size_t err_len);
void sp__mla_free(struct sp_mla_model *mla); /* NULL is a no-op */

/* Bytes of scratch for steps of up to max_rows rows (0 without MLA). */
size_t sp__mla_scratch_bytes(const sp_model_t *m, int64_t max_rows);

/* Layer il's queries, keys and values of rows xn[0..n_rows) (n_embd each,
 * normalised): q (n_rows, n_head * head_dim), k and v (n_rows, head_dim), in
 * the layout above, before RoPE (which rotates the first n_rot lanes of each
 * head in the NORMAL order, as batch.c's rope does for every model). */
void sp__mla_qkv(const sp_model_t *m, int64_t il, sp_pool_t *pool, const sp_cpu_kernels_t *k,
                 void *scratch, int64_t max_rows, const float *xn, float *q, float *kv_k,
                 float *kv_v, int64_t n_rows);

/* proj (n_rows, n_embd) = wo (wv_b of each head's latent output), from att
 * (n_rows, n_head * head_dim) as the attention kernels left it. */
void sp__mla_out(const sp_model_t *m, int64_t il, sp_pool_t *pool, const sp_cpu_kernels_t *k,
                 void *scratch, int64_t max_rows, const float *att, float *proj, int64_t n_rows);

/*
 * mla_attn.c: attention over the latent cache kept once per position (the
 * pool's latent layers have a key tile and no value tile: the value is the
 * key). a as for the kernels (kernels.h) with v, v_block_stride and v_stride
 * unused; output lanes below v_lo (the rotated part) are set to 0. a->scratch
 * holds n_q * sp_attn_scratch_stride(n_kv) + sp__mla_attn_scratch_floats(head_dim)
 * floats.
 */
int64_t sp__mla_attn_scratch_floats(int64_t head_dim);
void sp__mla_attn(const sp_cpu_kernels_t *k, sp_type_t type, const sp_attn_args_t *a,
                  int64_t v_lo);

#endif /* SP_ENGINE_MLA_H */
