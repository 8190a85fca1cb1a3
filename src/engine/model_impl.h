/*
 * model_impl.h - the engine's private view of a loaded model and of a KV
 * pool, shared by model.c (loading), ctx.c (sp_ctx), kv.c (the pool),
 * batch.c (the forward pass) and gpu.c (the GPU binding). Not for use
 * outside src/engine.
 */
#ifndef SP_ENGINE_MODEL_IMPL_H
#define SP_ENGINE_MODEL_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/str.h"

#include "engine/batch.h"
#include "engine/model.h"
#include "kernels/kernels.h"

/* A weight matrix: n_out rows of n_in elements, row-major in the mapping. */
typedef struct sp_weight {
    const void *data;
    sp_type_t type;
    int64_t n_in;      /* ne[0] */
    int64_t n_out;     /* ne[1] */
    size_t row_bytes;
    /* The load-time packed copy (engine/repack_weights.c) or NULL: only the matrix
     * products read it; everything else reads data. */
    const void *packed;
    size_t packed_stride; /* bytes of one packed group of rows */
} sp_weight_t;

typedef struct sp_layer {
    const float *attn_norm; /* (n_embd), or NULL: the layer input as it is (olmo2) */
    sp_weight_t wq;         /* (n_head * head_dim, n_embd) */
    sp_weight_t wk;         /* (n_head_kv * head_dim, n_embd) */
    sp_weight_t wv;         /* (n_head_kv * head_dim, n_embd) */
    sp_weight_t wo;         /* (n_embd, n_head * head_dim) */
    const float *bq, *bk, *bv; /* biases (qwen2, gpt-oss) or NULL */
    const float *bo;           /* (n_embd) attention output bias (gpt-oss) or NULL */
    const float *attn_sinks;   /* (n_head) per-query-head sink logits (gpt-oss) or NULL */
    const float *attn_q_norm, *attn_k_norm; /* (head_dim) per-head RMSNorm of q and k
                                                before RoPE (qwen3, gemma3) or NULL */
    const float *attn_post_norm; /* (n_embd) RMSNorm of the attention output before the
                                    residual add (gemma), or NULL */
    const float *ffn_norm;  /* (n_embd), or NULL as attn_norm */
    sp_weight_t w_gate;     /* (n_ff, n_embd) */
    sp_weight_t w_up;       /* (n_ff, n_embd) */
    sp_weight_t w_down;     /* (n_embd, n_ff) */
    const float *ffn_post_norm; /* (n_embd) likewise after the FFN (gemma), or NULL */
    /* gemma4: the per-layer input's gate (n_embd_pl, n_embd) and projection back
     * (n_embd, n_embd_pl) with its norm (n_embd) (n_embd_pl > 0), and the scalar the
     * layer's output is multiplied by (or NULL) */
    sp_weight_t pl_gate;
    sp_weight_t pl_proj;
    const float *pl_post_norm;
    const float *out_scale;
    /* gemma4 with experts (n_embd each, NULL elsewhere): the experts' input norm, and
     * the norms of the shared MLP's and of the experts' outputs (moe.c) */
    const float *ffn_pre_norm_2, *ffn_post_norm_1, *ffn_post_norm_2;
} sp_layer_t;

struct sp_model {
    sp_gguf_t *gguf;
    sp_hparams_t hp;
    sp_tokenizer_t *tok;
    sp_weight_t tok_embd;      /* (n_vocab, n_embd) */
    sp_weight_t output;        /* (n_vocab, n_embd); == tok_embd when tied */
    const float *output_norm;  /* (n_embd) */
    const float *rope_freqs;   /* (n_rot / 2) frequency divisors (Llama 3) or NULL */
    const float *rope_long;    /* (n_rot / 2) LongRoPE divisors above n_ctx_orig (phi3) */
    const float *rope_short;   /* (n_rot / 2) ... up to n_ctx_orig; both or neither */
    sp_layer_t *layers;        /* (n_layer) */
    /* Mixture-of-experts FFN of every layer (engine/moe.h) or NULL: dense
     * (then the layers' w_gate/w_up/w_down are empty). */
    struct sp_moe_model *moe;
    /* Multi-head latent attention of every layer (engine/mla.h) or NULL; the
     * layers' wq/wk/wv/wo are empty then. */
    struct sp_mla_model *mla;
    size_t weight_bytes;
    void *packed_mem;    /* the packed weights, one allocation (owned) or NULL */
    size_t packed_bytes;
    /* The file's pages of the packed tensors given back after packing (repack_weights.c);
     * originals_zeroed: some were anonymous memory and read as zeros until
     * sp__model_refill_originals writes them back from the packed copy. */
    size_t released_bytes;
    bool originals_zeroed;
    /* The GPU binding (engine/gpu.h: sp_gpu_attach) or NULL: layers
     * 0..n_gpu-1 then run on that device. Owned: sp_model_free releases it
     * through gpu_release, the hook the binder installed with it, so model.c
     * frees the binding without knowing who made it. */
    struct sp_gpu_model *gpu;
    void (*gpu_release)(struct sp_gpu_model *gpu);
    /* A bert / nomic-bert encoder (encoder.c) or NULL; layers is NULL then. */
    struct sp_encoder *enc;
    /* gemma4 (gemma4.c): per-layer token embeddings (n_vocab, n_layer * n_embd_pl), the
     * projection of the embedding to the same width and its norm (n_embd_pl); `ones`
     * (the largest head width) is the weight of the value heads' RMSNorm. Owned: ones. */
    sp_weight_t pl_tok_embd;
    sp_weight_t pl_model_proj;
    const float *pl_proj_norm;
    float *ones;
};

/* Pack the model's packable projection weights for the current kernel table
 * (repack_weights.c); a no-op when repacking is off or nothing is packable. */
sp_status_t sp__model_repack(sp_model_t *m, char *err, size_t err_len);
/* Before anything but batch.c's packed products reads the GGUF bytes of packed weights again
 * (the GPU upload): rewrite those the repack released from anonymous memory (unpacking the
 * packed copy, which is exactly invertible). A no-op when none were. Not thread-safe. */
sp_status_t sp__model_refill_originals(sp_model_t *m, char *err, size_t err_len);

/* Per-layer sizes (model.h: gemma4 varies them by layer; every other architecture has
 * one value, the hparams' own). */
static inline int64_t
sp__layer_head_dim(const sp_hparams_t *hp, int64_t il)
{
    return hp->layer_swa[il] && hp->head_dim_swa > 0 ? hp->head_dim_swa : hp->head_dim;
}

static inline int64_t
sp__layer_n_rot(const sp_hparams_t *hp, int64_t il)
{
    return hp->layer_swa[il] && hp->n_rot_swa > 0 ? hp->n_rot_swa : hp->n_rot;
}

static inline int64_t
sp__layer_n_head_kv(const sp_hparams_t *hp, int64_t il)
{
    return hp->layer_n_head_kv[il] > 0 ? hp->layer_n_head_kv[il] : hp->n_head_kv;
}

static inline int64_t
sp__layer_n_ff(const sp_hparams_t *hp, int64_t il)
{
    return hp->layer_n_ff[il] > 0 ? hp->layer_n_ff[il] : hp->n_ff;
}

/* Layers with a KV cache of their own (0..n-1); a later layer reads sp__layer_kv_src's. */
static inline int64_t
sp__n_layer_kv(const sp_hparams_t *hp)
{
    return hp->n_layer_kv > 0 ? hp->n_layer_kv : hp->n_layer;
}

static inline int64_t
sp__layer_kv_src(const sp_hparams_t *hp, int64_t il)
{
    return il < sp__n_layer_kv(hp) ? il : hp->layer_kv_src[il];
}

/* The widest head (the KV tiles' size) and rotation (the RoPE tables' width). */
static inline int64_t
sp__head_dim_max(const sp_hparams_t *hp)
{
    return hp->head_dim_swa > hp->head_dim ? hp->head_dim_swa : hp->head_dim;
}

static inline int64_t
sp__n_rot_max(const sp_hparams_t *hp)
{
    return hp->n_rot_swa > hp->n_rot ? hp->n_rot_swa : hp->n_rot;
}

/* gemma4.c: the hyper-parameters beyond the common ones (load_hparams calls the first
 * after n_head, the second with the architecture's other keys) and the weights. */
sp_status_t sp__gemma4_layer_sizes(const sp_gguf_t *g, sp_hparams_t *hp, char *err,
                                   size_t err_len);
sp_status_t sp__gemma4_hparams(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len);
sp_status_t sp__gemma4_load_weights(sp_model_t *m, char *err, size_t err_len);

/* The KV pool (kv.c creates it, batch.c's forward pass reads and writes it;
 * the layout is batch.c's opening comment). */
struct sp_kv_pool {
    const sp_model_t *m;
    sp_type_t type;      /* F32, F16 or Q8_0 (the attention table's index) */
    size_t elt;          /* bytes per element; 1 for Q8_0, whose "elements" are bytes */
    int64_t n_blocks;
    int64_t tile_elems;  /* one (layer, head) key or value tile: SP_KV_BLOCK * head_dim
                            (Q8_0: sp_kv_q8_tile_bytes, kernels.h) */
    int64_t v_row;       /* elements from one value row to the next (Q8_0: bytes) */
    int64_t block_elems; /* (n_layer - layer0) * n_head_kv * n_tiles tiles */
    int64_t n_tiles;     /* tiles per (layer, head): 2 (key, value), or 1 for a latent cache
                            (deepseek2: the value is the key, engine/mla_attn.c) */
    /* A model with a GPU binding keeps layers 0..layer0-1 of every block in
     * the device pool `gpu` (same block ids, same layout) and only the CPU
     * layers here. */
    int64_t layer0;
    struct sp_gpu_kv *gpu;
    void *data;
    /* Per block, the step that last wrote it: finds two writers of one block
     * in a step without a per-step allocation. */
    uint32_t *mark;
    uint32_t epoch;
    /* A two-part pool (n_swa_blocks > 0; with a GPU binding the GPU layers'
     * two parts are on the device, gpu.c, and these hold the CPU layers'): data and
     * block_elems are then the global layers' part, swa_data the sliding
     * layers' (n_swa_blocks blocks of swa_block_elems, same layout), with its
     * own marks. slot[il]: the layer's index within its part's block (il -
     * layer0 for a one-part pool). */
    int64_t n_swa_blocks;
    int64_t swa_block_elems;
    void *swa_data;
    uint32_t *swa_mark;
    int32_t *slot;
};

/* Whether layer il lives in the sliding part of a two-part pool. */
static inline bool
sp__kv_in_swa(const sp_kv_pool_t *kv, int64_t il)
{
    return kv->n_swa_blocks > 0 && kv->m->hp.layer_swa[il];
}

/* Element offset of (block, layer, head)'s key tile in its part's data (the
 * global or the sliding part); its value tile follows (none in a latent cache). */
static inline int64_t
sp__kv_tile(const sp_kv_pool_t *kv, int64_t block, int64_t il, int64_t g, int64_t n_head_kv)
{
    const int64_t be = sp__kv_in_swa(kv, il) ? kv->swa_block_elems : kv->block_elems;
    return block * be + ((int64_t)kv->slot[il] * n_head_kv + g) * kv->n_tiles * kv->tile_elems;
}

/* Tiles per (layer, KV head) of a block: the latent cache (multi-head latent
 * attention) keeps its key tile only, since its value is the same vector. */
static inline int64_t
sp__kv_n_tiles(const sp_model_t *m)
{
    return m->mla != NULL ? 1 : 2;
}

/* The data of layer il's part. */
static inline void *
sp__kv_data(const sp_kv_pool_t *kv, int64_t il)
{
    return sp__kv_in_swa(kv, il) ? kv->swa_data : kv->data;
}

/* Hyper-parameter reads (hparams.c): `<arch>.<suffix>` in [lo, hi], dflt
 * when absent (for integers, dflt < 0 means required); an error names the
 * file and the key. */
sp_status_t sp__hp_int(const sp_gguf_t *g, const char *arch, const char *suffix, int64_t dflt,
                       int64_t lo, int64_t hi, int64_t *out, char *err, size_t err_len);
sp_status_t sp__hp_double(const sp_gguf_t *g, const char *arch, const char *suffix, double dflt,
                          double lo, double hi, double *out, char *err, size_t err_len);
sp_status_t sp__hp_float(const sp_gguf_t *g, const char *arch, const char *suffix, double dflt,
                         double lo, double hi, float *out, char *err, size_t err_len);

/* model.c's tensor lookups (shape and type checked; required == false:
 * SP_ERR_NOT_FOUND / a NULL vector when absent), shared with encoder.c. */
sp_status_t sp__model_weight(const sp_model_t *m, const char *name, int64_t n_in, int64_t n_out,
                             bool required, sp_weight_t *w, char *err, size_t err_len);
sp_status_t sp__model_vector(const sp_model_t *m, const char *name, int64_t n, bool required,
                             const float **out, char *err, size_t err_len);

/* Encoders (encoder.c): the architecture test, the loader (hyper-parameters
 * and weights into m; the tokenizer is model.c's), the tokenizer's [SEP]
 * afterwards, and the per-context run state behind sp_ctx_embed. */
typedef struct sp_encoder sp_encoder_t;
typedef struct sp_enc_run sp_enc_run_t;
bool sp__encoder_arch(sp_str_t arch);
sp_status_t sp__encoder_load(sp_model_t *m, sp_str_t arch, char *err, size_t err_len);
void sp__encoder_set_sep(sp_encoder_t *e, int32_t sep);
void sp__encoder_free(sp_encoder_t *e);
sp_status_t sp__enc_run_create(const sp_model_t *m, int64_t n_ctx, int n_threads,
                               sp_enc_run_t **out);
size_t sp__enc_run_bytes(const sp_model_t *m, int64_t n_ctx, int n_threads);
void sp__enc_run_destroy(sp_enc_run_t *r);
sp_status_t sp__enc_run_embed(sp_enc_run_t *r, const int32_t *tokens, int64_t n, float *out);
const char *sp__enc_run_kernels_name(const sp_enc_run_t *r);
/* The first feature of m that the CUDA path (gpu.c) does not implement, in
 * words ("per-head q/k norms (qwen3)"), or NULL for a plain llama-family
 * model: sp_gpu_attach refuses a model that has one. */
const char *sp__model_cpu_only_feature(const sp_model_t *m);

#define SP_MAX_CTX (1 << 24)
#define SP_DEFAULT_CTX_CAP 4096

/* What a step leaves besides the cache writes (sp_ctx needs more than the
 * scheduler's per-sequence logits). */
typedef enum sp_batch_out {
    SP_BATCH_OUT_SEQ,    /* logits of the sequences that asked (sp_batch_eval) */
    SP_BATCH_OUT_ALL,    /* logits of every row, rows in order, into all_logits */
    SP_BATCH_OUT_HIDDEN, /* no logits: every row's final hidden state after
                          * output_norm, see sp__batch_hidden */
} sp_batch_out_t;

sp_status_t sp__batch_run(sp_batch_t *b, sp_kv_pool_t *kv, const sp_batch_seq_t *seqs,
                          int64_t n_seqs, sp_batch_out_t out, float *all_logits);
/* Rows of n_embd after a SP_BATCH_OUT_HIDDEN step. */
const float *sp__batch_hidden(const sp_batch_t *b);
/* The logits buffer (max_seqs rows of n_vocab); row 0 is a one-sequence step's. */
const float *sp__batch_logits_buf(const sp_batch_t *b);
const char *sp__batch_kernels_name(const sp_batch_t *b);
/* Bytes between the rows of activations converted for a product (n elements in the weights'
 * dot-product format t): the format's own row rounded up to a cache line, so the rows lie
 * densely. The gemms size their token chunks by this stride (a chunk's activations kept in
 * L2 while the weights sweep): a stride sized for the widest F32 row (4 bytes an element)
 * gave Q8_0 activations 5 tokens a chunk where 60 fit (docs/design.md, "Dense activation
 * rows"). */
static inline size_t
sp__act_row_stride(sp_type_t t, int64_t n)
{
    return (sp_row_size(t, n) + 63) & ~(size_t)63;
}

/* Weight rows per pool work item of a product over `rows` weight rows (all the
 * matrices of one job) and n_tok activation rows on n_threads threads: the split
 * batch.c's products use (engine/split.c; bench/decode_bench.c measures it). A multiple of 16,
 * whatever the split the bits are the same (kernel contract). */
int64_t sp__batch_mm_chunk(int64_t rows, int n_threads, int64_t n_tok);

/*
 * The work items of one product job over n_w (<= 3) matrices of rows[i] rows each and n_tok
 * tokens. Below 2 * SP_MM_TOK_BLOCK tokens an item takes every token and a range of rows:
 * items of `chunk` rows (sp__batch_mm_chunk of all the rows) in matrix order, except the job's
 * last `tail` rows (the end of its last matrix, about one item per thread), which go in items
 * of `fine` rows (a quarter of an item) so that the threads run out of work within a fine item
 * of each other instead of a whole one. From 2 * SP_MM_TOK_BLOCK tokens (prefill, large
 * batches) the tokens are cut too, in blocks of SP_MM_TOK_BLOCK, and the rows in as few items
 * as keep ~8 items a thread (at most SP_MM_ROWS_MAX rows, a few MiB of weights): a gemm call
 * prepares its activations (the AVX-512 panels' records, the AVX2 gemms' scales and sums) for
 * its tokens whatever its rows, so that work shrinks with the row items. A row item's token
 * blocks are consecutive items (the threads on them share its weights in cache); the last row
 * item's come in quarter blocks, the fine tail.
 * Items never cross a matrix; all but the last of each are whole tiles of 16 rows. Any split
 * gives the same bits (kernel contract). engine/split.c; batch.c's products and the benches.
 */
#define SP_MM_SPLIT_MAX_W 3
#define SP_MM_TOK_BLOCK 64
#define SP_MM_ROWS_MAX 1024
typedef struct sp_mm_split {
    int n_w;
    int64_t rows[SP_MM_SPLIT_MAX_W];
    int64_t n_items[SP_MM_SPLIT_MAX_W]; /* row items of each matrix */
    int64_t chunk, fine;
    int64_t head;    /* rows of the last matrix before its fine tail */
    int64_t n_head;  /* items of chunk rows in the last matrix */
    int64_t n_row;   /* row items (of a token block) */
    int64_t n_tok;   /* tokens of the job */
    int64_t tb;      /* tokens of a block; 0: one block of every token */
    int64_t n_tb;    /* token blocks */
    int64_t tb_tail; /* tokens of the last block's pieces */
    int64_t total;   /* items of the job */
} sp_mm_split_t;

void sp__mm_split_init(sp_mm_split_t *s, int n_w, const int64_t *rows, int n_threads,
                       int64_t n_tok);
/* Item `item` (< s->total): matrix *wi, its rows [*r0, *r1), tokens [*t0, *t1). */
void sp__mm_split_item(const sp_mm_split_t *s, int64_t item, int *wi, int64_t *r0, int64_t *r1,
                       int64_t *t0, int64_t *t1);

#endif /* SP_ENGINE_MODEL_IMPL_H */
