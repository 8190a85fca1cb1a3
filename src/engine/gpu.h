/*
 * gpu.h - the engine's GPU path: a model's weights on one device, the device
 * part of a KV pool and the device part of a batch. Loading the CUDA library
 * is cuda/loader.h's (included here for the callers that bind models).
 * Everything here is plain C inside sampan; the CUDA work happens behind the
 * op table of cuda_api.h (libsampan_cuda.so, or the host emulation
 * tests/gpu/fake_cuda.c in tests).
 *
 * How the engine uses it (engine/batch.c): a model with a GPU binding
 * (sp_gpu_attach) runs layers 0..n_gpu-1 on the device and the rest on the
 * CPU (partial offload; all of them when it fits). A KV pool of such a model
 * keeps the GPU layers' blocks on the device (same block ids, same
 * block-major layout) and only the CPU layers' blocks in host memory. A step
 * embeds the rows on the CPU, uploads them, runs the GPU layers, and either
 * computes the logits (or final hidden states) on the device (full offload)
 * or downloads the residual stream for the CPU layers.
 *
 * Errors: a CUDA failure makes the step return SP_ERR_DEVICE (the scheduler
 * fails the step's requests with it), logs the driver's message once, and
 * marks the device unhealthy for good (sp_loader_device_healthy); nothing
 * aborts. Not thread-safe per object: one step at a time per batch and pool,
 * as for the CPU.
 */
#ifndef SP_ENGINE_GPU_H
#define SP_ENGINE_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_api.h"
#include "cuda/loader.h"
#include "engine/batch.h"
#include "engine/model.h"
#include "sampan/status.h"

/* ---- sizing, without a GPU ---- */

/* Device bytes of the weights of layers [0, n_gpu) as $SAMPAN_CUDA_WEIGHTS
 * will hold them (F16; with native or both the Q8_0/Q4_0 matrices quantised,
 * or both) plus, when n_gpu is every layer, the output matrix and norm; the
 * norms and biases in F32. */
uint64_t sp_gpu_weight_bytes(const sp_model_t *m, int64_t n_gpu);
/* Device bytes of a KV pool of n_blocks for n_gpu layers (and its pad block). */
uint64_t sp_gpu_kv_bytes(const sp_model_t *m, int64_t n_gpu, int64_t n_blocks, bool f16);
/* The same for a two-part pool (n_swa_blocks > 0, kv.c): the global GPU
 * layers' n_blocks and the sliding GPU layers' n_swa_blocks, each part with
 * its pad block (none for a part without a GPU layer). */
uint64_t sp_gpu_kv_bytes_split(const sp_model_t *m, int64_t n_gpu, int64_t n_blocks,
                               int64_t n_swa_blocks, bool f16);
/* Device bytes of a batch's buffers (p resolved, as sp_batch_resolve gives). */
uint64_t sp_gpu_batch_bytes(const sp_model_t *m, const sp_batch_params_t *p);
/* The most layers (0..n_layer) whose weights plus `per_layer` bytes each
 * (the KV pool's share) plus `fixed` bytes fit in budget: the partial
 * offload split. */
int64_t sp_gpu_fit_layers(const sp_model_t *m, uint64_t budget, uint64_t fixed,
                          uint64_t per_layer);

/* ---- binding a model ---- */

/* Upload layers [0, n_gpu) of m (n_gpu < 0: all) to device ordinal, through
 * api (NULL = sp_loader_api()). F16/BF16/F32/Q8_0/Q4_0 weights are uploaded as
 * stored and dequantised to F16 on the device; other types are dequantised
 * on the CPU first. $SAMPAN_CUDA_WEIGHTS=native keeps Q8_0/Q4_0 matrices
 * quantised instead, =both keeps both copies (gpu.c; SP_ERR_INVALID for
 * another value). Before any context, pool or batch of m is created; m then
 * owns the binding (sp_model_free releases it). Batches read
 * $SAMPAN_CUDA_GRAPHS (0 turns decode graphs off), $SAMPAN_CUDA_PINNED (0:
 * pageable copies) and $SAMPAN_CUDA_CANDIDATES (0: always whole logits rows)
 * when created; attach refuses a bad value of any of them. */
sp_status_t sp_gpu_attach(sp_model_t *m, const sp_cuda_api_t *api, int ordinal, int64_t n_gpu,
                          char *err, size_t err_len);
/* Layers on the GPU (0 without a binding), the device, and its bytes in use. */
int64_t sp_gpu_model_layers(const sp_model_t *m);
int sp_gpu_model_ordinal(const sp_model_t *m);
uint64_t sp_gpu_model_device_bytes(const sp_model_t *m);
/* How the weights are held: "f16", "native" or "both" ("" without a binding). */
const char *sp_gpu_model_weights(const sp_model_t *m);
/* Weight bytes one step of n_rows reads on the device (the quantised bytes
 * where gemv_q runs, the F16 ones where cuBLAS does): the bandwidth bound. */
uint64_t sp_gpu_model_step_bytes(const sp_model_t *m, int64_t n_rows);

/* ---- engine internals (engine/batch.c, engine/kv.c) ---- */

typedef struct sp_gpu_model sp_gpu_model_t;
typedef struct sp_gpu_kv sp_gpu_kv_t;
typedef struct sp_gpu_batch sp_gpu_batch_t;

/* n_swa_blocks > 0: a two-part pool (the sliding GPU layers in a part of
 * their own, with its own block ids). */
sp_status_t sp__gpu_kv_create(sp_gpu_model_t *g, int64_t n_blocks, int64_t n_swa_blocks, bool f16,
                              sp_gpu_kv_t **out, char *err, size_t err_len);
void sp__gpu_kv_destroy(sp_gpu_kv_t *kv);
/* Copy block src to dst within the global part, or the sliding one (swa). */
void sp__gpu_kv_copy_block(sp_gpu_kv_t *kv, bool swa, int32_t dst, int32_t src);
sp_status_t sp__gpu_batch_create(sp_gpu_model_t *g, const sp_batch_params_t *p,
                                 sp_gpu_batch_t **out, char *err, size_t err_len);
void sp__gpu_batch_destroy(sp_gpu_batch_t *b);

/* One step's GPU part. x: the rows embedded by the CPU (n_rows, n_embd).
 * Partial offload: x_out gets the residual stream after the GPU layers.
 * Full offload, by `out`: SP_BATCH_OUT_SEQ fills logits (rows of the
 * sequences that asked, in order) and seq_out; SP_BATCH_OUT_ALL fills logits
 * with every row's; SP_BATCH_OUT_HIDDEN fills hidden (n_rows, n_embd) after
 * output_norm. */
typedef struct sp_gpu_step {
    const sp_batch_seq_t *seqs;
    int64_t n_seqs;
    int64_t n_rows;
    const float *x;
    const int64_t *row_pos;
    const int32_t *row_seq;
    int out; /* sp_batch_out_t */
    float *x_out;
    float *logits;
    int64_t *seq_out;
    float *hidden;
    /* Candidates (full offload, SP_BATCH_OUT_SEQ, $SAMPAN_CUDA_CANDIDATES on):
     * cand_k[i] in 1..SP_CUDA_MAX_CANDIDATES asks for sequence i's k best
     * logits instead of its row (0: the row); cand_n[i] is set to k where
     * they came (sp__gpu_batch_cand reads them) and left alone elsewhere,
     * where the row is in logits as always. NULL: every row whole. */
    const int32_t *cand_k;
    int32_t *cand_n;
} sp_gpu_step_t;

#define SP_CUDA_MAX_CANDIDATES 64 /* the topk op's limit */

sp_status_t sp__gpu_batch_run(sp_gpu_batch_t *b, sp_gpu_kv_t *kv, const sp_gpu_step_t *s);

/* Candidates of the last step's logits row `row` (seq_out's numbering):
 * k ids and values, best first (ties to the lower id), valid until the next
 * step; returns k, or 0 when that step returned none. */
int sp__gpu_batch_cand(const sp_gpu_batch_t *b, int64_t row, const int32_t **ids,
                       const float **vals);

/* Pin the host buffer [p, p + bytes) for the batch's copies (the engine's
 * x, logits, hidden rows) until sp__gpu_batch_destroy, which must come
 * before the buffer is freed. Whole pages (sp_gpu_host_round): a buffer
 * sharing a page with another pinned one cannot be registered. When pinning
 * is off ($SAMPAN_CUDA_PINNED=0) or fails (logged as event=gpu_pin_fallback)
 * the buffer is simply used pageable. */
void sp__gpu_batch_pin(sp_gpu_batch_t *b, void *p, size_t bytes, const char *what);
/* The host page size, and bytes rounded up to whole pages (SIZE_MAX on overflow). */
size_t sp_gpu_host_page(void);
size_t sp_gpu_host_round(size_t bytes);
/* Host bytes pinned on the model's device context now (0 without a binding). */
uint64_t sp_gpu_model_pinned_bytes(const sp_model_t *m);

#endif /* SP_ENGINE_GPU_H */
