/*
 * cuda_api.h - the C ABI between sampan and its CUDA library (libsampan_cuda.so).
 *
 * Why a library behind a table: the sampan binary must start and serve on a
 * machine without a GPU, a driver or the CUDA runtime. So nothing in it links
 * against CUDA; src/cuda/loader.c dlopens libsampan_cuda.so (built by
 * `make cuda` with nvcc, linked against cudart and cuBLAS) on first use and
 * asks it for this table through one exported symbol, sp_cuda_get_api. When
 * the library, the runtime or a GPU is missing, the loader says why and the
 * GPU backend is simply unavailable.
 *
 * The table is op-level: memory, copies and one entry per kernel, each on a
 * per-device context (a CUDA stream and a cuBLAS handle). The forward pass
 * that strings the ops together (src/engine/gpu.c) is plain C inside sampan, so
 * the same orchestration runs against tests/gpu/fake_cuda.c, a host
 * emulation of this table, in CI without a GPU.
 *
 * Versioning (as include/sampan/backend.h does for plugins): abi_version must
 * equal SP_CUDA_ABI_VERSION exactly (a change of any member's meaning bumps
 * it) and struct_size must be at least the caller's sizeof(sp_cuda_api_t)
 * (members are only ever appended).
 *
 * Conventions for every op:
 *   - Pointers named d_* are device addresses (from alloc); the others host.
 *   - Ops are enqueued on the context's stream and return at once; a launch
 *     failure is reported by the op itself, an execution failure by the next
 *     synchronising call (d2h, sync).
 *   - Return 0 on success or a negative sp_status_t (SP_ERR_DEVICE for a CUDA
 *     or cuBLAS error, SP_ERR_NOMEM for an allocation, SP_ERR_INVALID for
 *     arguments); last_error(ctx) then holds one line naming the op and the
 *     driver's message. A CUDA error makes the context unhealthy for good:
 *     every later call fails at once with the first message (a sticky error
 *     such as an illegal address poisons the CUDA context anyway). Nothing
 *     ever aborts the process.
 *   - Activations are F32 row-major; GEMM inputs are F16; weights are F16 in
 *     the device (dequantised at load by to_f16), or Q8_0/Q4_0 blocks in the
 *     split layout below (gemv_q reads them as they are).
 *
 * Graphs (appended members): graph_begin starts capturing the context's
 * stream; the ops enqueued until graph_end are recorded, not run, and
 * graph_end instantiates them as one graph that graph_launch replays.
 * What a captured op reads or writes through a device pointer is read or
 * written at each launch; every other argument (counts, scales, layer
 * numbers, the pointers themselves) is frozen at capture. Synchronous calls
 * (alloc, h2d, d2h, sync) are refused while capturing. A failure of the
 * capture itself (something in it could not be captured) is SP_ERR_UNSUPPORTED
 * and does not make the context unhealthy: the caller may run the same ops
 * eagerly instead. A CUDA error in a launch is like any op's (SP_ERR_DEVICE,
 * unhealthy for good).
 */
#ifndef SP_CUDA_API_H
#define SP_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

/* 2: attn takes a sliding window and a soft-cap; head_rmsnorm, gelu_mul and
 * softcap appended.
 * 3: rope_cs takes the attention factor (LongRoPE's, YaRN's), attn per-head
 * sink logits (gpt-oss); scale appended (granite). */
#define SP_CUDA_ABI_VERSION 3u
#define SP_CUDA_SYMBOL "sp_cuda_get_api"
#define SP_CUDA_LIB_NAME "libsampan_cuda.so"

typedef struct sp_cuda_ctx sp_cuda_ctx_t; /* one device: stream, cuBLAS handle, counters */
typedef struct sp_cuda_graph sp_cuda_graph_t; /* an instantiated graph of one context */

/* Most rows gemv_q takes in one call. */
#define SP_CUDA_GEMV_MAX_ROWS 8

/* The paged KV cache of the layers held on one device, with the host pool's
 * block-major layout (engine/batch.c): block b, layer il, KV head g has its key
 * tile (head_dim rows of SP_KV_BLOCK lanes, transposed) at element
 * b * block_elems + (il * n_head_kv + g) * 2 * tile_elems, its value tile
 * (SP_KV_BLOCK rows of head_dim) right after. */
typedef struct sp_cuda_kv {
    void *d_data;
    int f16;             /* elements are F16 (else F32) */
    int64_t n_blocks;
    int64_t n_layer;     /* layers in this pool */
    int64_t n_head_kv;
    int64_t head_dim;
    int64_t tile_elems;  /* SP_KV_BLOCK * head_dim */
    int64_t block_elems; /* n_layer * n_head_kv * 2 * tile_elems */
} sp_cuda_kv_t;

/* The rows of one step, in device memory (gpu.c uploads them in one copy). */
typedef struct sp_cuda_rows {
    int64_t n_rows;
    const int32_t *d_pos;   /* (n_rows) position of each row */
    const int32_t *d_bt;    /* (n_rows) offset into d_btab of the row's sequence's table */
    const int32_t *d_btab;  /* block tables of the step's sequences, concatenated */
} sp_cuda_rows_t;

typedef struct sp_cuda_api {
    uint32_t abi_version;   /* SP_CUDA_ABI_VERSION */
    uint32_t struct_size;   /* sizeof(sp_cuda_api_t) of the library */
    const char *name;       /* "cuda" (or "fake" for the host emulation) */

    /* ---- devices and contexts ---- */
    /* Number of CUDA devices (0 with a reason in err when there is no driver
     * or no GPU: then the return is SP_ERR_DEVICE). */
    int (*device_count)(int *n, char *err, size_t err_len);
    /* Name, compute capability and memory of device ordinal. */
    int (*device_info)(int ordinal, char *name, size_t name_len, int *cc_major, int *cc_minor,
                       uint64_t *total_bytes, uint64_t *free_bytes, char *err, size_t err_len);
    /* A context on device ordinal: its own stream and cuBLAS handle. */
    int (*ctx_create)(int ordinal, sp_cuda_ctx_t **out, char *err, size_t err_len);
    void (*ctx_destroy)(sp_cuda_ctx_t *c); /* NULL is a no-op; frees nothing it allocated */
    const char *(*last_error)(const sp_cuda_ctx_t *c); /* "" when none */
    int (*healthy)(const sp_cuda_ctx_t *c);            /* 0 after any CUDA error */
    uint64_t (*bytes_in_use)(const sp_cuda_ctx_t *c);  /* sum of live alloc() sizes */

    /* ---- memory: plain cudaMalloc, never managed memory ---- */
    int (*alloc)(sp_cuda_ctx_t *c, size_t bytes, void **d_out);
    void (*free)(sp_cuda_ctx_t *c, void *d_ptr); /* NULL is a no-op */
    /* Synchronous copies (h2d and d2h wait for the stream first). */
    int (*h2d)(sp_cuda_ctx_t *c, void *d_dst, const void *src, size_t bytes);
    int (*d2h)(sp_cuda_ctx_t *c, void *dst, const void *d_src, size_t bytes);
    int (*d2d)(sp_cuda_ctx_t *c, void *d_dst, const void *d_src, size_t bytes); /* enqueued */
    int (*sync)(sp_cuda_ctx_t *c);

    /* ---- ops (enqueued) ---- */
    /* d_dst[0..n) = F16 of n elements of `type` (SP_TYPE_F32, F16, BF16, Q8_0,
     * Q4_0; n a multiple of the block size). */
    int (*to_f16)(sp_cuda_ctx_t *c, int type, const void *d_src, void *d_dst, int64_t n);
    /* x[t] = F32 of table row tok[t], table F16 (n_vocab, n_embd). */
    int (*embed)(sp_cuda_ctx_t *c, const void *d_table, int64_t n_embd, const int32_t *d_tok,
                 int64_t n_rows, float *d_x);
    /* For each output row i: (x[src] += add[src] when d_add), then, when d_w,
     * out[i] = x[src] / rms(x[src]) * w with src = d_rows ? d_rows[i] : i,
     * out in F16 (out_f16) or F32. rms = sqrt(mean(x^2) + eps). d_add and
     * d_rows are never given together. out may be x itself (F32, no rows):
     * an in-place norm (gemma's post-norms). */
    int (*add_rmsnorm)(sp_cuda_ctx_t *c, float *d_x, const float *d_add, const float *d_w,
                       const int32_t *d_rows, int64_t n_rows, int64_t n, float eps, void *d_out,
                       int out_f16);
    /* y (n_rows, n_out) F32 = x (n_rows, n_in) F16 times w (n_out, n_in) F16
     * transposed, F32 accumulation (cublasGemmEx), plus bias (n_out) F32 when given. */
    int (*gemm)(sp_cuda_ctx_t *c, const void *d_w, int64_t n_out, int64_t n_in, const void *d_x,
                int64_t n_rows, float *d_y, const float *d_bias);
    /* cs (n_rows, n_rot) = (cos, sin) of pos * inv_freq[i] times mscale, in
     * double and rounded once, as the CPU's table (mscale: the attention
     * factor of LongRoPE and YaRN, 1 for none). */
    int (*rope_cs)(sp_cuda_ctx_t *c, const int32_t *d_pos, int64_t n_rows, const float *d_inv_freq,
                   int64_t n_rot, double mscale, float *d_cs);
    /* Rotate n_heads heads of head_dim in each row of v (row stride n_heads * head_dim). */
    int (*rope)(sp_cuda_ctx_t *c, float *d_v, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                int64_t n_rot, const float *d_cs, int neox);
    /* Write each row's k and v (n_rows, n_head_kv * head_dim) into layer il of kv:
     * block d_btab[d_bt[t] + pos / SP_KV_BLOCK], lane pos % SP_KV_BLOCK. */
    int (*kv_write)(sp_cuda_ctx_t *c, const sp_cuda_kv_t *kv, int64_t il, const float *d_k,
                    const float *d_v, const sp_cuda_rows_t *rows);
    /* Causal paged attention of every row over positions first..pos of its
     * sequence in layer il: q (n_rows, n_head * head_dim) F32, out the same
     * shape in F16. first = max(0, pos + 1 - window) for window > 0 (a sliding
     * window, as the CPU's sp_attn_first; earlier positions are never read),
     * else 0. softcap > 0: each score s = scale q.k becomes softcap
     * tanh(s / softcap) before the softmax (gemma2). d_sinks (n_head) F32 or
     * NULL: head h's sink logit joins the softmax's max and denominator with
     * no value (gpt-oss; kernels.h sp_attn_args_t). */
    int (*attn)(sp_cuda_ctx_t *c, const sp_cuda_kv_t *kv, int64_t il, const float *d_q,
                int64_t n_head, float scale, int64_t window, float softcap,
                const float *d_sinks, const sp_cuda_rows_t *rows, void *d_out_f16);
    /* out[i] = F16(silu(g[i]) * u[i]). */
    int (*swiglu)(sp_cuda_ctx_t *c, const float *d_g, const float *d_u, int64_t n, void *d_out_f16);
    /* Row-wise softmax in place, n_rows of n. */
    int (*softmax)(sp_cuda_ctx_t *c, float *d_x, int64_t n_rows, int64_t n);
    /* The k largest of each row (values descending, ties to the lower index):
     * idx and val (n_rows, k); k = 1 is greedy's argmax. k <= 64. */
    int (*topk)(sp_cuda_ctx_t *c, const float *d_x, int64_t n_rows, int64_t n, int k,
                int32_t *d_idx, float *d_val);

    /* ---- appended (same ABI version: struct_size says they are there) ---- */

    /* ---- graphs (see the header comment) ---- */
    /* Start capturing the context's stream (one capture at a time). */
    int (*graph_begin)(sp_cuda_ctx_t *c);
    /* End the capture and instantiate it into *out. Always ends the capture,
     * also after a failed op or on an unhealthy context (then *out = NULL
     * and the status says why: SP_ERR_UNSUPPORTED for a capture that cannot
     * be made, SP_ERR_DEVICE when the context failed). */
    int (*graph_end)(sp_cuda_ctx_t *c, sp_cuda_graph_t **out);
    /* Enqueue one replay of g on the context's stream. */
    int (*graph_launch)(sp_cuda_ctx_t *c, sp_cuda_graph_t *g);
    void (*graph_destroy)(sp_cuda_ctx_t *c, sp_cuda_graph_t *g); /* NULL is a no-op */

    /* ---- quantised weights, split layout (cuda_common.h sp_cu_qsplit_*):
     * the quants of every row first, row r at r * n_in bytes (Q8_0) or
     * r * n_in / 2 (Q4_0, each 32-element block's 16 bytes as in GGUF), then
     * at sp_cu_qsplit_scales_off the F16 scales, one per 32 elements, in
     * order. Why not the GGUF blocks as stored: 34- and 18-byte blocks give
     * 2-byte alignment, the split layout 16-byte vector loads. ---- */
    /* d_dst[0..n) = F16 of the n elements of a split-layout buffer
     * (type SP_TYPE_Q8_0 or Q4_0, n a multiple of 32). */
    int (*qsplit_to_f16)(sp_cuda_ctx_t *c, int type, const void *d_src, void *d_dst, int64_t n);
    /* y (n_rows, n_out) F32 = x (n_rows, n_in) F16 times w (n_out, n_in) in
     * the split layout of `type` transposed, plus bias (n_out) when given:
     * the blocks dequantised in registers, F32 accumulation. 1 <= n_rows <=
     * SP_CUDA_GEMV_MAX_ROWS, n_in a multiple of 32, d_w and d_x 16-byte
     * aligned. For decode: it reads the weights once, at their stored size. */
    int (*gemv_q)(sp_cuda_ctx_t *c, int type, const void *d_w, int64_t n_out, int64_t n_in,
                  const void *d_x, int64_t n_rows, float *d_y, const float *d_bias);

    /* ---- pinned host memory (appended): cudaHostRegister over memory the
     * caller allocated, so a step's copies to and from it are DMA transfers
     * at full link speed instead of going through the driver's pageable
     * staging. Why register rather than cudaMallocHost: the buffers the copies
     * touch are the engine's own (the residual stream, the logits the sampler
     * reads); pinning them in place needs no second allocator in the engine
     * and no host memcpy per step. ptr and bytes should cover whole pages
     * (registration pins pages; two ranges sharing a page collide). A failure
     * (pinned memory exhausted, not supported) is SP_ERR_NOMEM or
     * SP_ERR_UNSUPPORTED with last_error set and does NOT make the context
     * unhealthy: the caller keeps using the memory pageable. Not while
     * capturing. ---- */
    int (*host_register)(sp_cuda_ctx_t *c, void *ptr, size_t bytes);
    /* Undo host_register(ptr); before the memory is freed. Works on an
     * unhealthy context too (errors ignored); unknown ptr is a no-op.
     * ctx_destroy unregisters whatever is left. */
    void (*host_unregister)(sp_cuda_ctx_t *c, void *ptr);
    /* Bytes registered through c and not yet unregistered. */
    uint64_t (*pinned_bytes)(const sp_cuda_ctx_t *c);

    /* ---- the architectures past the llama family (ABI 2) ---- */
    /* In place, each of the n_heads heads of head_dim in each row of v (row
     * stride n_heads * head_dim): h = h / rms(h) * w, w (head_dim) F32, rms =
     * sqrt(mean(h^2) + eps) (qwen3's and gemma3's q/k norms; n_heads = 1 with
     * head_dim the whole row is olmo2's). */
    int (*head_rmsnorm)(sp_cuda_ctx_t *c, float *d_v, int64_t n_rows, int64_t n_heads,
                        int64_t head_dim, const float *d_w, float eps);
    /* out[i] = F16(gelu(g[i]) * u[i]), gelu's tanh form as the CPU's (gemma):
     * gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
    int (*gelu_mul)(sp_cuda_ctx_t *c, const float *d_g, const float *d_u, int64_t n,
                    void *d_out_f16);
    /* In place over n floats: x = cap tanh(x / cap), cap > 0 (gemma's final
     * logit soft-capping). */
    int (*softcap)(sp_cuda_ctx_t *c, float *d_x, int64_t n, float cap);

    /* ---- ABI 3 ---- */
    /* In place over n floats: x = x * s, one rounding (granite's residual
     * scale on a sub-layer's output, 1 / logit_scale on the logits). */
    int (*scale)(sp_cuda_ctx_t *c, float *d_x, int64_t n, float s);
} sp_cuda_api_t;

typedef const sp_cuda_api_t *(*sp_cuda_get_api_fn)(uint32_t abi_version);

#endif /* SP_CUDA_API_H */
