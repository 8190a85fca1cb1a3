/*
 * backends/onnx/cuda/dev.h - the device operations the ONNX GPU executor
 * (exec.c) strings together. Two implementations: dev.cu (CUDA kernels,
 * cuDNN, cuBLAS; libsampan_onnx_cuda.so) and tests/gpu/fake_onnx_dev.c (a
 * host emulation with fault injection; libfake_onnx_cuda.so), so every line
 * of exec.c runs in CI without a GPU.
 *
 * Every call returns 0, or -1 with the reason kept in the context
 * (oxd_error). A failed allocation is not sticky; any other device error
 * poisons the context (CUDA's sticky errors would anyway): later calls fail
 * at once with the first message.
 * Element types: OXD_F32, OXD_F16 (stored half, computed in float), OXD_I64.
 * Shapes are row-major; strides count elements.
 * Threads: one context per executor, used by one thread at a time.
 */
#ifndef SP_ONNX_CUDA_DEV_H
#define SP_ONNX_CUDA_DEV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { OXD_F32 = 0, OXD_F16 = 1, OXD_I64 = 2 };
#define OXD_MAX_DIMS 8

typedef struct oxd oxd_t;

int oxd_probe(int device, char *err, size_t err_len);
int oxd_open(int device, oxd_t **d, char *err, size_t err_len);
void oxd_close(oxd_t *d);
/* Make the context's device current on the calling thread (a batch may run on any thread). */
int oxd_bind(oxd_t *d);
const char *oxd_error(const oxd_t *d);

int oxd_alloc(oxd_t *d, size_t bytes, void **p);
void oxd_free(oxd_t *d, void *p);
int oxd_h2d(oxd_t *d, void *dst, const void *src, size_t bytes);
int oxd_d2h(oxd_t *d, void *dst, const void *src, size_t bytes); /* waits for the stream */
int oxd_sync(oxd_t *d);

/* dst[i] = src[i] between OXD_F32 and OXD_F16 (either way). */
int oxd_convert(oxd_t *d, int dst_dt, void *dst, int src_dt, const void *src, int64_t n);
/* y = f(x), f one of sp_oxg_unary with parameters a, b. */
int oxd_unary(oxd_t *d, int dt, int op, float a, float b, const void *x, void *y, int64_t n);
/* y[idx] = a[idx . sa] op b[idx . sb] over dims (a broadcast dimension has stride 0). */
int oxd_binary(oxd_t *d, int dt, int op, int nd, const int64_t *dims, const int64_t *sa,
               const int64_t *sb, const void *a, const void *b, void *y);
/* y[idx . sy] = x[idx . sx] over dims; elements of elem bytes (2, 4 or 8). */
int oxd_copy(oxd_t *d, size_t elem, int nd, const int64_t *dims, const void *x, const int64_t *sx,
             void *y, const int64_t *sy);
/* y[o, c, i] = x[o, c, i] * scale[c] + shift[c] (NULL: 1 and 0), then Relu when relu. */
int oxd_affine(oxd_t *d, int dt, const void *x, const void *scale, const void *shift, void *y,
               int64_t outer, int64_t c, int64_t inner, int relu);

typedef struct oxd_pool {
    int max;                      /* 1 max, 0 average */
    int64_t n, c, h, w, oh, ow;
    int64_t kh, kw, pad_t, pad_l, pad_b, pad_r, sh, sw, dh, dw;
    int count_pad;                /* average: divide by the window's cells inside the padded input */
} oxd_pool_t;
int oxd_pool(oxd_t *d, int dt, const oxd_pool_t *p, const void *x, void *y);

/* Over the middle dimension of [outer, n, inner]. */
int oxd_softmax(oxd_t *d, int dt, const void *x, void *y, int64_t outer, int64_t n, int64_t inner,
                int log);
int oxd_reduce(oxd_t *d, int dt, int op, const void *x, void *y, int64_t outer, int64_t n,
               int64_t inner);
/* Rows of cols: (x - mean) / sqrt(var + eps) * scale + bias (bias may be NULL); scale[j * sstep],
 * bias[j * bstep] (step 0: one value for all). mean and inv (NULL: not wanted) get each row's
 * mean and 1 / sqrt(var + eps). */
int oxd_layernorm(oxd_t *d, int dt, const void *x, const void *scale, int64_t sstep, const void *bias,
                  int64_t bstep, void *y, void *mean, void *inv, int64_t rows, int64_t cols, float eps);
/* y[o, j, i] = x[o, idx[j], i]; idx already checked to lie in [0, n_axis). */
int oxd_gather(oxd_t *d, size_t elem, const void *x, const int64_t *idx, void *y, int64_t outer,
               int64_t n_axis, int64_t inner, int64_t n_idx);

/* Row-major C = alpha op(A) op(B) + beta C, batch of strided products, FP32 accumulation. */
int oxd_gemm(oxd_t *d, int dt, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
             const void *a, int64_t lda, int64_t stride_a, const void *b, int64_t ldb,
             int64_t stride_b, float beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch);

/* Convolution, NCHW, symmetric pads (pad_h, pad_w). A plan holds the descriptors and the
 * algorithm for one shape. *algo < 0: measure (cuDNN runs every algorithm once; the fastest
 * within ws_limit) and return the choice in *algo; *algo >= 0: use that algorithm (chosen for
 * a similar shape) unless its workspace for this shape passes ws_limit, then ask cuDNN's
 * heuristics (no measuring) and return what was used. */
typedef struct oxd_conv {
    int dt;
    int64_t n, c, h, w, k, r, s, oh, ow;
    int64_t pad_h, pad_w, sh, sw, dh, dw, group;
} oxd_conv_t;
int oxd_conv_plan(oxd_t *d, const oxd_conv_t *cv, size_t ws_limit, int *algo, void **plan, size_t *ws_bytes);
void oxd_conv_plan_free(oxd_t *d, void *plan);
/* y = conv(x, w) (+ bias[k]) (then Relu); ws: the plan's workspace (or NULL when 0 bytes). */
int oxd_conv(oxd_t *d, void *plan, const void *x, const void *w, const void *bias, int relu,
             void *y, void *ws, size_t ws_bytes);

#ifdef __cplusplus
}
#endif
#endif /* SP_ONNX_CUDA_DEV_H */
