/*
 * backends/onnx/dnnl.h - the ONNX backend's oneDNN engine (dnnl.c): Conv, MaxPool,
 * AveragePool, GlobalAveragePool, Gemm, MatMul, qdq.c's INT8 QDQConv/QDQMatMul, Softmax,
 * LayerNormalization, Gelu (and LayerNorm/GELU spelled out in elementary operators) run as
 * oneDNN primitives on the CPU, every other operator on our own runtime (graph.c, ops*.c),
 * which stays the reference.
 *
 * Threads: one state per instance (its stream and primitive cache), used by one run at a time
 * like the run context it hangs on. oneDNN's threads (Debian builds it on OpenMP) are bounded
 * by the instance's n_threads at the start of each run.
 * Memory: primitives, their packed weights and the per-value layouts belong to the state and
 * are freed with the run context (sp_ox_run_free).
 */
#ifndef SP_BACKENDS_ONNX_DNNL_H
#define SP_BACKENDS_ONNX_DNNL_H

#include <stdbool.h>
#include <stdint.h>

#include "ox.h"

/* Primitives kept per node (input shapes, i.e. batch sizes, seen most recently): the model's
 * max_batch_size, within these bounds. */
#define OX_DNNL_CACHE 4
#define OX_DNNL_CACHE_MAX 64

typedef struct sp_ox_dnnl_stats {
    uint64_t created;   /* primitives created */
    uint64_t evicted;   /* dropped from a full per-node cache */
    uint64_t cached;    /* alive now */
    uint64_t fallbacks; /* node runs oneDNN had no implementation for (run by our own) */
    uint64_t groups;    /* LayerNorm / GELU chains of elementary operators found at attach */
    uint64_t chained;   /* INT8 convolutions writing their output quantized for the next ones */
    uint64_t scratchpad_bytes; /* the largest scratchpad a primitive asked for (user-managed: the
                                * run context's scratch buffer, one for all primitives) */
} sp_ox_dnnl_stats_t;

/* Whether this build has oneDNN (SP_HAVE_DNNL). */
bool sp_ox_dnnl_built(void);
/* Whether the CPU has BF16 arithmetic oneDNN uses (AVX512-BF16 or AMX). */
bool sp_ox_dnnl_has_bf16(void);
/* Whether oneDNN's int8 kernels are exact for any 8-bit operands on this CPU (VNNI); without
 * it only u8 sources with weights in [-64, 64] run there (dnnl.c isa_vnni). */
bool sp_ox_dnnl_int8_vnni(void);
/* Attach a oneDNN state to r (after the graph is prepared), keeping cache_cap primitives per
 * node (clamped to OX_DNNL_CACHE..OX_DNNL_CACHE_MAX). 0, or -1 with err. */
int sp_ox_dnnl_attach(sp_ox_run_t *r, bool bf16, int cache_cap, char *err, size_t err_len);
void sp_ox_dnnl_free(sp_ox_run_t *r);
/* At the start of a run: every value plain, oneDNN's threads bounded. */
void sp_ox_dnnl_begin(sp_ox_run_t *r);
/* Run node n (order position o) on oneDNN: 1 done, 0 not taken (run it on our own), -1 error. */
int sp_ox_dnnl_run(sp_ox_run_t *r, sp_ox_node_t *n, int32_t o);
/* Reorder value v back to the plain (row-major) layout if oneDNN left it blocked. */
int sp_ox_dnnl_plain(sp_ox_run_t *r, int32_t v);
int sp_ox_dnnl_plain_inputs(sp_ox_run_t *r, const sp_ox_node_t *n);
void sp_ox_dnnl_get_stats(const sp_ox_run_t *r, sp_ox_dnnl_stats_t *s);

#endif /* SP_BACKENDS_ONNX_DNNL_H */
