/*
 * backends/onnx/ops.h - what the operator files share: broadcasting and the
 * second half of the operator table (ops_nn.c).
 *
 * Threads and memory: as ox.h (no state of its own).
 */
#ifndef SP_BACKENDS_ONNX_OPS_H
#define SP_BACKENDS_ONNX_OPS_H

#include "ox.h"

/* One run of the last dimension: out row o, input pointers and their strides. */
typedef void (*sp_ox_row_fn)(void *o, const void *const *in, const int64_t *stride, int64_t n,
                          const void *ctx);

/* numpy broadcasting of up to 4 inputs: the result shape, or -1 with the error. */
int sp_ox_bcast_shape(sp_ox_run_t *r, const sp_ox_tensor_t *const *in, int n, int64_t *dims, int32_t *nd);
void sp_ox_bcast_rows(const sp_ox_tensor_t *out, const sp_ox_tensor_t *const *in, int n, sp_ox_row_fn row,
                   const void *ctx);

/* Spatial geometry of Conv and the pools, with 1-D as 2-D of height 1. */
typedef struct geom {
    int64_t ih, iw, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    int64_t pb_end, pr_end; /* bottom and right padding */
} geom_t;

/* Fill g from x's spatial dims (rank 3 or 4), the kernel dims and the node's strides,
 * dilations, pads and auto_pad (ceil_mode for pools): 0, or -1 with the error. */
int sp_ox_geometry(sp_ox_run_t *r, const sp_ox_node_t *n, const sp_ox_tensor_t *x, const int64_t *kern,
                   int nk, bool pool, geom_t *g);

/* Conv, pools, BatchNormalization, Gemm, MatMul: NULL for other names. */
const sp_ox_op_t *sp_ox_nn_op_find(const char *op_type);

#endif /* SP_BACKENDS_ONNX_OPS_H */
