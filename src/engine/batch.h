/*
 * batch.h - one forward pass over many sequences at once, through a paged KV
 * cache. This is what the scheduler (continuous batching) drives.
 *
 * The KV pool (sp_kv_pool_t) is one allocation, sized at start, of n_blocks
 * blocks; a block holds SP_KV_BLOCK consecutive positions of one sequence for
 * every layer and KV head (keys transposed in SP_ATTN_BLOCK lanes as the
 * attention kernels want them, values as rows). The pool only stores: which
 * block belongs to whom, reference counts, prefix sharing and eviction are the
 * scheduler's business (a block table is just an array of block ids).
 *
 * A step (sp_batch_eval) takes n_seqs entries, each "these new tokens of a
 * sequence at positions pos..pos+n-1, whose cache lives in these blocks": any
 * mix of prefill chunks and single decode tokens. All rows go through each
 * weight product together (one weight read per step), each row's attention
 * reads its own sequence's blocks (positions 0..its own position), and the new
 * keys/values are written into the blocks before attention reads them.
 *
 * Batch invariance (hard contract): a row's logits depend only on its token,
 * its position and the cache contents of its own sequence, never on the other
 * rows of the step, their number, order or the thread count. Same bits as
 * sp_ctx_eval (which is built on this with a private pool).
 */
#ifndef SP_ENGINE_BATCH_H
#define SP_ENGINE_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "engine/model.h"
#include "sampan/status.h"

#define SP_KV_BLOCK 16 /* positions per block: equal to SP_ATTN_BLOCK (kernels.h) */

typedef struct sp_kv_pool sp_kv_pool_t;

typedef struct sp_kv_pool_params {
    int64_t n_blocks;  /* > 0 */
    sp_kv_type_t type; /* F32 (default), F16 or Q8_0 (model.h); Q8_0 refuses a model
                          with GPU layers (SP_ERR_UNSUPPORTED: the device keeps F32/F16) */
} sp_kv_pool_params_t;

/* Bytes one block takes for this model (all layers, K and V) with a cache of
 * this type: for sizing the pool from a memory budget (0 for a type outside
 * the enum). Per position, layer and KV head: 2 head_dim x 4 (F32), x 2
 * (F16), 2 (head_dim + 2 ceil(head_dim / 32)) (Q8_0). */
size_t sp_kv_block_bytes(const sp_model_t *m, sp_kv_type_t type);
/* The part of sp_kv_block_bytes that the sliding-window layers take (0 for a
 * model without them): a two-part pool's sliding block; the global block is
 * the difference. */
size_t sp_kv_swa_block_bytes(const sp_model_t *m, sp_kv_type_t type);
sp_status_t sp_kv_pool_create(const sp_model_t *m, const sp_kv_pool_params_t *p,
                              sp_kv_pool_t **out, char *err, size_t err_len);
void sp_kv_pool_destroy(sp_kv_pool_t *kv);
/* Heap bytes sp_kv_pool_create(m, p) allocates (the cache, a mark per block and
 * the object), without allocating them; 0 when create would refuse p. */
size_t sp_kv_pool_bytes(const sp_model_t *m, const sp_kv_pool_params_t *p);
/* The error sp_kv_pool_create(m, p) would give (status and message), or SP_OK,
 * without allocating. */
sp_status_t sp_kv_pool_check(const sp_model_t *m, const sp_kv_pool_params_t *p, char *err,
                             size_t err_len);
int64_t sp_kv_pool_n_blocks(const sp_kv_pool_t *kv);
/*
 * A pool of two parts for a model with sliding-window layers: p->n_blocks
 * blocks hold the global layers only and a second id space of n_swa_blocks
 * blocks the sliding layers, so a sequence needs sliding blocks for its window
 * only (sp_batch_seq_t.blocks). n_swa_blocks 0 is sp_kv_pool_create.
 * SP_ERR_INVALID for a model without sliding layers, SP_ERR_UNSUPPORTED for
 * one with GPU layers. _bytes and _check as for one part.
 */
sp_status_t sp_kv_pool_create_split(const sp_model_t *m, const sp_kv_pool_params_t *p,
                                    int64_t n_swa_blocks, sp_kv_pool_t **out, char *err,
                                    size_t err_len);
size_t sp_kv_pool_bytes_split(const sp_model_t *m, const sp_kv_pool_params_t *p,
                              int64_t n_swa_blocks);
sp_status_t sp_kv_pool_check_split(const sp_model_t *m, const sp_kv_pool_params_t *p,
                                   int64_t n_swa_blocks, char *err, size_t err_len);
/* The sliding part's blocks of a two-part pool; 0 for a one-part pool. */
int64_t sp_kv_pool_n_swa_blocks(const sp_kv_pool_t *kv);
/*
 * One sequence's sliding blocks kept as a ring (a private cache that only
 * moves forward or goes back a little: sp_ctx, the scheduler's draft slots):
 * sliding entry i (positions 16 i .. 16 i + 15) lives in ring block
 * base + i % n_ring, and ring_entry[r] (n_ring of them, -1 at first) records
 * which entry ring block base + r holds. The smallest ring for steps of up to
 * n_rows rows: sp_kv_ring_blocks(n_swa, n_rows).
 *
 * sp_kv_ring_step prepares the sliding table tab (n_tab entries, the second
 * half of sp_batch_seq_t.blocks) for a step writing positions pos..pos+n-1:
 * the entries from the window of pos to the block of pos + n - 1 are the
 * ring's, every other one -1 (never read). false, and nothing changed, when
 * that range is longer than the ring or an entry holding positions before pos
 * was overwritten by a later one (a rewind further back than the ring
 * reaches): the caller recomputes from an earlier position (0 always works).
 */
int64_t sp_kv_ring_blocks(int64_t n_swa, int64_t n_rows);
bool sp_kv_ring_step(int64_t n_swa, int64_t n_ring, int32_t base, int64_t *ring_entry,
                     int32_t *tab, int64_t n_tab, int64_t pos, int64_t n);
/* Copy block src's contents to dst (copy-on-write of a shared partial block;
 * of a two-part pool, the global part's block). Ids outside the pool, or
 * dst == src, do nothing. Not during a step. */
void sp_kv_pool_copy_block(sp_kv_pool_t *kv, int32_t dst, int32_t src);
/* The same in the sliding part of a two-part pool (host and device layers);
 * nothing for a one-part pool or ids outside the sliding part. */
void sp_kv_pool_copy_swa_block(sp_kv_pool_t *kv, int32_t dst, int32_t src);

typedef struct sp_batch sp_batch_t; /* activation buffers + thread pool for steps */

typedef struct sp_batch_params {
    int64_t max_tokens; /* most rows (tokens) per step; default 512 */
    int64_t max_seqs;   /* most sequences per step; default 64 (at most max_tokens) */
    int64_t max_ctx;    /* longest sequence (positions); default the model's, capped at 4096 */
    int n_threads;      /* 0 = one per core */
    int64_t max_logits; /* most logit rows per step (sp_batch_seq_t.n_logits summed);
                           default max_seqs; speculative decoding needs k + 1 per sequence */
} sp_batch_params_t;

sp_batch_params_t sp_batch_default_params(void);
sp_status_t sp_batch_create(const sp_model_t *m, const sp_batch_params_t *p, sp_batch_t **out,
                            char *err, size_t err_len);
void sp_batch_destroy(sp_batch_t *b);
/* Check p as sp_batch_create does (the same errors) and give in *out the values
 * it would use: defaults applied, max_seqs capped at max_tokens and n_threads
 * the number of pool threads it would start. */
sp_status_t sp_batch_resolve(const sp_model_t *m, const sp_batch_params_t *p,
                             sp_batch_params_t *out, char *err, size_t err_len);
/* Heap bytes sp_batch_create(m, p) allocates, without allocating them: every
 * activation buffer (for the resolved sizes above) and the thread pool's
 * bookkeeping (its object bounded from above; thread stacks are not heap and
 * not counted). 0 when create would refuse p, SIZE_MAX when a size overflows. */
size_t sp_batch_bytes(const sp_model_t *m, const sp_batch_params_t *p);

struct sp_lora;

typedef struct sp_batch_seq {
    const int32_t *tokens;  /* n_tokens new tokens (>= 1) */
    int64_t n_tokens;
    int64_t pos;            /* position of tokens[0]; the blocks already hold 0..pos-1 */
    const int32_t *blocks;  /* block ids covering positions 0..pos+n_tokens-1, in order;
                               with a two-part pool (sp_kv_pool_create_split) 2 n_blocks
                               ids: this table of the global part, then the sliding part's
                               table (blocks + n_blocks, same indexing: entry i holds
                               positions 16i..16i+15 of the sliding layers), of which only
                               the entries the step reads or writes must be valid, from
                               the block of position pos + 1 - n_swa (the window's start
                               for tokens[0]; 0 when negative) to that of
                               pos + n_tokens - 1. Earlier ones are never read (their
                               blocks may be freed and reused elsewhere; -1 is fine). */
    int64_t n_blocks;       /* >= ceil((pos + n_tokens) / SP_KV_BLOCK) */
    bool logits;            /* keep the logits of the last token */
    int32_t n_logits;       /* with logits: of the last n_logits tokens (0 = 1), in order:
                               a speculative verification reads every draft position's
                               (CPU layers only: not with a GPU binding) */
    const struct sp_lora *lora; /* an adapter of this model (engine/lora.h) applied to this
                               sequence's rows, or NULL; CPU layers only (not with a GPU
                               binding). Rows without one keep the base model's bits. */
} sp_batch_seq_t;

/*
 * Run one step. SP_ERR_INVALID (nothing computed) for bad ids, too many
 * tokens/sequences, too few blocks, a block id outside the pool, or a position
 * past max_ctx, or a block written twice in the step (two sequences of one
 * step must not write the same block; a sequence writes the blocks holding
 * pos..pos+n_tokens-1, and only reads the others, so a full block may be
 * shared), or an adapter (lora) of another model or on a model with a GPU
 * binding. The pool must come from the same model. One step at a time per
 * batch and per pool; blocks may come from anywhere in the pool, in any order.
 */
sp_status_t sp_batch_eval(sp_batch_t *b, sp_kv_pool_t *kv, const sp_batch_seq_t *seqs,
                          int64_t n_seqs);
/* n_vocab logits of seqs[i] after the last step (NULL unless seqs[i].logits,
 * and NULL for every i after a rejected step). Valid until the next step.
 * For a sequence whose step returned candidates (sp_batch_candidates > 0)
 * it is the row they stand for: their values, -inf elsewhere (built on the
 * call, O(n_vocab)). */
const float *sp_batch_logits(const sp_batch_t *b, int64_t i);

/*
 * Sampling on the device (GPU path only; docs/cuda.md "Candidates"). Like
 * sp_batch_eval, but cand_k[i] (0..SP_BATCH_MAX_CANDIDATES; NULL = all 0)
 * says that sequence i's sampler needs only its cand_k[i] best logits
 * (sp_gen_candidates decides): a model whose output runs on the GPU then
 * returns those, ids and values, instead of the n_vocab row, and
 * sp_batch_candidates gives them. 0, a CPU model, a partial offload or
 * $SAMPAN_CUDA_CANDIDATES=0: the row as always (sp_batch_candidates is 0).
 * SP_ERR_INVALID for a cand_k out of range.
 */
#define SP_BATCH_MAX_CANDIDATES 64
sp_status_t sp_batch_eval_cand(sp_batch_t *b, sp_kv_pool_t *kv, const sp_batch_seq_t *seqs,
                               int64_t n_seqs, const int32_t *cand_k);
/* The candidates of seqs[i] after the last step: *ids and *vals get k
 * entries, best first (larger value, then lower id), valid until the next
 * step; returns k (cand_k[i]), or 0 when the row came back instead. */
int32_t sp_batch_candidates(const sp_batch_t *b, int64_t i, const int32_t **ids,
                            const float **vals);
/* With n_logits > 1: the logits of the row's j-th kept token (j < n_logits). */
const float *sp_batch_logits_at(const sp_batch_t *b, int64_t i, int64_t j);

/*
 * fn(ctx, item, ith) for every item in [0, n_items) on the batch's threads
 * (core/pool.h: the caller is thread 0, ith < sp_batch_n_threads indexes
 * per-thread scratch). For the work between steps that is per sequence,
 * such as sampling each row's logits, so it does not run on one core while
 * the others wait. Not during a step (one caller at a time, as the step).
 * label: what a profile counts the run under (core/pool.h).
 */
void sp_batch_parallel(sp_batch_t *b, const char *label, sp_pool_fn fn, void *ctx,
                       int64_t n_items);
/* Adds the batch's pool jobs from now on to prof (NULL stops): its steps' stages, each under
 * its label (embed, norm, quantize, qkv, rope, attention, attn_out, ffn_gate_up, ffn_act,
 * ffn_down, output, the MoE / MLA / gemma4 / LoRA stages; core/pool.h). */
void sp_batch_profile(sp_batch_t *b, sp_pool_prof_t *prof);
int sp_batch_n_threads(const sp_batch_t *b);

#endif /* SP_ENGINE_BATCH_H */
