/*
 * lora.h - LoRA adapters: low-rank corrections to a model's layer
 * projections, read from GGUF adapter files and applied per sequence by the
 * batched forward pass (batch.h, sp_batch_seq_t.lora).
 *
 * The file convention is llama.cpp's (convert_lora_to_gguf.py):
 *   general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (float),
 *   general.architecture equal to the base model's;
 *   tensors "<base weight name>.lora_a" and ".lora_b" in pairs, e.g.
 *   blk.3.attn_q.weight.lora_a  ne = [n_in, rank]   (A: rank rows of n_in)
 *   blk.3.attn_q.weight.lora_b  ne = [rank, n_out]  (B: n_out rows of rank)
 * for any of attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down,
 * in F32, F16, BF16 or Q8_0.
 *
 * A projection y = W x becomes y = W x + scale * B (A x) with
 * scale = alpha / rank (1 when alpha is 0 or absent), rank of that pair: the
 * same math as merging W' = W + scale * B A, without touching W.
 *
 * An adapter is validated against one model (names, shapes, ranks, types,
 * values) and its matrices are converted to F32 into memory it owns, so the
 * file is closed after load. It is immutable and reference-counted: the
 * registry holds one reference, every scheduler job using it another, and the
 * last release frees it (on any thread: it is only memory).
 */
#ifndef SP_ENGINE_LORA_H
#define SP_ENGINE_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "engine/model.h"
#include "sampan/status.h"

typedef struct sp_lora sp_lora_t;

/* The projections of a layer an adapter may correct, in the order the
 * forward pass runs them. */
typedef enum sp_lora_proj {
    SP_LORA_Q = 0, SP_LORA_K, SP_LORA_V, SP_LORA_O, SP_LORA_GATE, SP_LORA_UP, SP_LORA_DOWN,
    SP_LORA_N_PROJ
} sp_lora_proj_t;

#define SP_LORA_MAX_RANK 1024 /* and at most min(n_in, n_out) of the projection */

/* One corrected projection, row-major F32: a is A (rank, n_in); bt is B
 * transposed, (rank, n_out), so the second product runs over outputs in
 * SIMD lanes. */
typedef struct sp_lora_mat {
    const float *a;
    const float *bt;
    int64_t rank; /* 0: this projection has no correction */
    int64_t n_in, n_out;
    float scale;
} sp_lora_mat_t;

typedef struct sp_lora_info {
    int64_t n_pairs;           /* corrected projections */
    int64_t rank_min, rank_max;
    double alpha;              /* as in the file (0 when absent) */
    size_t bytes;              /* F32 matrices held */
} sp_lora_info_t;

/* Load path and validate it against m. Errors name the file and, for a tensor,
 * the tensor: "adapters/x.gguf: tensor 'blk.0.attn_q.weight.lora_a' has shape
 * [...], expected [64, r] with 1 <= r <= 64". */
sp_status_t sp_lora_load(const sp_model_t *m, const char *path, sp_lora_t **out, char *err,
                         size_t err_len);
/* Same from an open file (not taken: the caller closes it; nothing of it is
 * kept). */
sp_status_t sp_lora_load_gguf(const sp_model_t *m, const sp_gguf_t *g, sp_lora_t **out, char *err,
                              size_t err_len);
void sp_lora_ref(sp_lora_t *l);
void sp_lora_release(sp_lora_t *l); /* NULL is a no-op; the last one frees */

/* A process-wide serial, never reused: the prefix cache keys blocks by it, so
 * a reloaded file (new serial) never meets the old one's cached keys. */
uint64_t sp_lora_id(const sp_lora_t *l);
const sp_model_t *sp_lora_model(const sp_lora_t *l);
void sp_lora_get_info(const sp_lora_t *l, sp_lora_info_t *out);
/* The correction of layer il's projection p (rank 0 when there is none). */
const sp_lora_mat_t *sp_lora_mat(const sp_lora_t *l, int64_t il, sp_lora_proj_t p);

/* ---- engine-internal: the forward pass (batch.c) applies the corrections */

struct sp_batch_seq;
struct sp_pool;
struct sp_cpu_kernels;

/* One projection of one layer over a step's rows: for every row t whose
 * sequence (seqs[row_seq[t]]) carries an adapter correcting this projection,
 * y_t += scale * B (A x_t). tmp gives each row tmp_stride >= the rank floats
 * of scratch. Rows without one are untouched, so they keep the base bits. */
typedef struct sp_lora_apply {
    const struct sp_batch_seq *seqs;
    const int32_t *row_seq;
    int64_t n_rows;
    int64_t il;
    sp_lora_proj_t p;
    const float *x;
    int64_t x_stride; /* floats */
    float *y;
    int64_t y_stride; /* floats */
    float *tmp;
    int64_t tmp_stride; /* floats */
} sp_lora_apply_t;

void sp__lora_apply(struct sp_pool *pool, const struct sp_cpu_kernels *k, const sp_lora_apply_t *a);

#endif /* SP_ENGINE_LORA_H */
