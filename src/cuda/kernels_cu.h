/*
 * kernels_cu.h - launchers of kernels.cu, for api.cu (nvcc only). Each
 * enqueues on stream s and returns the launch status; the semantics are those
 * of the op of the same name in cuda_api.h.
 */
#ifndef SP_CUDA_KERNELS_CU_H
#define SP_CUDA_KERNELS_CU_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_api.h"

/* Passed to kernels by value: plain copies of the ABI's structs. */
typedef struct sp_cu_kv_args {
    void *data;
    int f16;
    int64_t n_head_kv, head_dim, tile_elems, block_elems;
} sp_cu_kv_args_t;

typedef struct sp_cu_rows_args {
    int64_t n_rows;
    const int32_t *pos, *bt, *btab;
} sp_cu_rows_args_t;

cudaError_t sp_cu_to_f16(cudaStream_t s, int type, const void *src, void *dst, int64_t n);
cudaError_t sp_cu_embed(cudaStream_t s, const void *table, int64_t n_embd, const int32_t *tok,
                        int64_t n_rows, float *x);
cudaError_t sp_cu_add_rmsnorm(cudaStream_t s, float *x, const float *add, const float *w,
                              const int32_t *rows, int64_t n_rows, int64_t n, float eps, void *out,
                              int out_f16);
cudaError_t sp_cu_bias(cudaStream_t s, float *y, const float *bias, int64_t n_rows, int64_t n_out);
cudaError_t sp_cu_rope_cs(cudaStream_t s, const int32_t *pos, int64_t n_rows,
                          const float *inv_freq, int64_t n_rot, double mscale, float *cs);
cudaError_t sp_cu_rope(cudaStream_t s, float *v, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                       int64_t n_rot, const float *cs, int neox);
cudaError_t sp_cu_kv_write(cudaStream_t s, const sp_cu_kv_args_t *kv, int64_t il, const float *k,
                           const float *v, const sp_cu_rows_args_t *r);
cudaError_t sp_cu_attn(cudaStream_t s, const sp_cu_kv_args_t *kv, int64_t il, const float *q,
                       int64_t n_head, float scale, int64_t window, float softcap,
                       const float *sinks, const sp_cu_rows_args_t *r, void *out);
cudaError_t sp_cu_head_rmsnorm(cudaStream_t s, float *v, int64_t n_rows, int64_t n_heads,
                               int64_t head_dim, const float *w, float eps);
cudaError_t sp_cu_gelu_mul(cudaStream_t s, const float *g, const float *u, int64_t n, void *out);
cudaError_t sp_cu_softcap(cudaStream_t s, float *x, int64_t n, float cap);
cudaError_t sp_cu_scale(cudaStream_t s, float *x, int64_t n, float f);
cudaError_t sp_cu_swiglu(cudaStream_t s, const float *g, const float *u, int64_t n, void *out);
cudaError_t sp_cu_softmax(cudaStream_t s, float *x, int64_t n_rows, int64_t n);
cudaError_t sp_cu_qsplit_to_f16(cudaStream_t s, int type, const void *src, void *dst, int64_t n);
cudaError_t sp_cu_gemv_q(cudaStream_t s, int type, const void *w, int64_t n_out, int64_t n_in,
                         const void *x, int64_t n_rows, float *y, const float *bias);
cudaError_t sp_cu_topk(cudaStream_t s, const float *x, int64_t n_rows, int64_t n, int k,
                       int32_t *idx, float *val);

#endif /* SP_CUDA_KERNELS_CU_H */
