/*
 * backends/onnx/gpu_api.h - the C ABI between the ONNX plugin
 * (libsampan_onnx.so, plain C, never links CUDA) and its GPU executor
 * (libsampan_onnx_cuda.so, built by `make cuda` with nvcc, cuDNN and cuBLAS;
 * or the host emulation libfake_onnx_cuda.so the tests use).
 *
 * The plugin lowers its prepared graph (ox.h: ordered, folded, fused) into
 * the flat description below: values (constants with their host data,
 * graph inputs and outputs, activations) and nodes with an operator code
 * and integer/float attributes already read from the ONNX protobuf. The
 * library knows nothing of protobuf or of ox.h, so the two sides change
 * independently; the only contract is this header.
 *
 * Versioning: one symbol, sp_oxg_get_api(SP_OXG_ABI_VERSION), returns the
 * table or NULL for another version; struct_size lets members be appended.
 * Threads: one executor belongs to one model instance and runs one batch at
 * a time (as the CPU run context). Memory: load uploads every constant once;
 * the host description may be freed after load returns.
 */
#ifndef SP_BACKENDS_ONNX_GPU_API_H
#define SP_BACKENDS_ONNX_GPU_API_H

#include <stddef.h>
#include <stdint.h>

#define SP_OXG_ABI_VERSION 1
#define SP_OXG_MAX_DIMS 8
#define SP_OXG_MAX_IO 16
#define SP_OXG_N_INTS 24

/* Value dtypes: ONNX TensorProto codes (only these two). */
#define SP_OXG_FLOAT 1
#define SP_OXG_INT64 7

enum sp_oxg_kind { SP_OXG_ACT = 0, SP_OXG_CONST = 1, SP_OXG_INPUT = 2 };

typedef struct sp_oxg_value {
    int32_t kind;        /* sp_oxg_kind */
    int32_t is_output;   /* a graph output (kept until the run returns) */
    int32_t dtype;       /* SP_OXG_FLOAT or SP_OXG_INT64 */
    int32_t nd;          /* constants: their shape */
    int64_t dims[SP_OXG_MAX_DIMS];
    const void *data;    /* constants: host data (float or int64), read during load only */
    int32_t last_use;    /* index in nodes[] of its last reader (-1: none) */
} sp_oxg_value_t;

/* Operators. Attributes per op (i[] = ints, f[] = floats); shapes are the
 * executor's job at run time, since the batch dimension is free. */
enum sp_oxg_op {
    SP_OXG_CONV = 1,  /* in: x, W, [B]. i: pads t,l,b,r [0..3], strides [4,5], dilations [6,7], group [8],
                       * auto_pad [9] (0 NOTSET, 1 VALID, 2 SAME_UPPER, 3 SAME_LOWER) */
    SP_OXG_POOL,      /* sub 0 max, 1 avg. i: kernel [0,1], pads [2..5], strides [6,7], ceil_mode [8],
                       * count_include_pad [9], dilations [10,11], auto_pad [12] */
    SP_OXG_GLOBAL_POOL, /* sub 0 max, 1 avg */
    SP_OXG_BATCHNORM, /* in: x, scale, B, mean, var (constants). f[0] epsilon */
    SP_OXG_GEMM,      /* in: A, B, [C]. i[0] transA, i[1] transB; f[0] alpha, f[1] beta */
    SP_OXG_MATMUL,    /* in: A, B */
    SP_OXG_UNARY,     /* sub sp_oxg_unary; f[0], f[1] its parameters */
    SP_OXG_BINARY,    /* sub sp_oxg_binary, numpy broadcasting */
    SP_OXG_VIEW,      /* same data, new shape. sub sp_oxg_view; i as below */
    SP_OXG_TRANSPOSE, /* i[0] n, i[1..] perm (n 0: reversed) */
    SP_OXG_CONCAT,    /* i[0] axis */
    SP_OXG_SOFTMAX,   /* sub 0 softmax, 1 log-softmax. i[0] axis, i[1] 1: opset >= 13 (one axis),
                       * 0: the input coerced to 2D at axis */
    SP_OXG_REDUCE,    /* sub sp_oxg_reduce. i[0] n axes (0: all), i[1..8] axes, i[9] keepdims */
    SP_OXG_LAYERNORM, /* in: x, scale, [B]. i[0] axis; f[0] epsilon */
    SP_OXG_GATHER,    /* in: data, indices (a constant or a graph input). i[0] axis */
};

enum sp_oxg_unary {
    SP_OXG_RELU, SP_OXG_SIGMOID, SP_OXG_TANH, SP_OXG_GELU /* f[0] 1: tanh approximation */,
    SP_OXG_ERF, SP_OXG_CLIP /* f[0] min, f[1] max */, SP_OXG_HARDSWISH,
    SP_OXG_LEAKYRELU /* f[0] alpha */, SP_OXG_HARDSIGMOID /* f[0] alpha, f[1] beta */,
    SP_OXG_SQRT, SP_OXG_EXP, SP_OXG_LOG, SP_OXG_NEG, SP_OXG_ABS, SP_OXG_RECIP, SP_OXG_IDENTITY,
    SP_OXG_N_UNARY
};
enum sp_oxg_binary { SP_OXG_ADD, SP_OXG_SUB, SP_OXG_MUL, SP_OXG_DIV, SP_OXG_POW, SP_OXG_N_BINARY };
enum sp_oxg_reduce { SP_OXG_RSUM, SP_OXG_RMEAN, SP_OXG_RMAX };
enum sp_oxg_view {
    SP_OXG_RESHAPE,   /* i[0] n, i[1..8] shape (0 copies, -1 infers), i[9] allowzero */
    SP_OXG_FLATTEN,   /* i[0] axis */
    SP_OXG_SQUEEZE,   /* i[0] n axes (0: every 1), i[1..8] axes */
    SP_OXG_UNSQUEEZE, /* i[0] n axes, i[1..8] axes */
};

typedef struct sp_oxg_node {
    int32_t op, sub;
    int32_t n_in, n_out;
    int32_t in[SP_OXG_MAX_IO];   /* value indices; -1 an omitted optional input */
    int32_t out[SP_OXG_MAX_IO];
    int32_t relu;                /* a fused Relu after Conv/Gemm/MatMul */
    int32_t bias;                /* MatMul: value index of a fused [N] bias constant, -1 none */
    int64_t i[SP_OXG_N_INTS];
    float f[4];
    const char *label;           /* "node 'name' (Conv)", for messages */
} sp_oxg_node_t;

typedef struct sp_oxg_graph {
    int32_t n_values, n_nodes;
    const sp_oxg_value_t *values;
    const sp_oxg_node_t *nodes;  /* in execution order */
} sp_oxg_graph_t;

typedef struct sp_oxg_options {
    int32_t device;              /* CUDA ordinal */
    int32_t fp16;                /* 1: weights and activations FP16 (FP32 accumulation) */
    uint64_t workspace_limit;    /* bytes a convolution's algorithm may use as workspace */
} sp_oxg_options_t;

/* A host tensor crossing the ABI: inputs are read, outputs are filled
 * (data from the alloc callback given to run). */
typedef struct sp_oxg_io {
    int32_t value;               /* graph value index */
    int32_t dtype;               /* SP_OXG_FLOAT or SP_OXG_INT64 */
    int32_t nd;
    int64_t dims[SP_OXG_MAX_DIMS];
    void *data;
    size_t bytes;
} sp_oxg_io_t;

typedef struct sp_oxg_api {
    uint32_t abi_version;
    uint32_t struct_size;
    /* "" or the reason no device can be used (driver, no GPU), checked before load. */
    int (*probe)(int32_t device, char *err, size_t err_len);
    /* Upload the constants, check every node's static parts. 0 or -1 with err. */
    int (*load)(const sp_oxg_graph_t *g, const sp_oxg_options_t *opt, void **exec, char *err,
                size_t err_len);
    /* Run one batch: inputs uploaded, outputs downloaded into alloc'd host memory
     * (on failure the outputs already allocated are still set, for the caller to free). */
    int (*run)(void *exec, const sp_oxg_io_t *in, int32_t n_in, sp_oxg_io_t *out, int32_t n_out,
               void *(*alloc)(size_t), char *err, size_t err_len);
    /* Device bytes held now: constants, activation pool, workspace. */
    uint64_t (*device_bytes)(void *exec);
    void (*unload)(void *exec);
} sp_oxg_api_t;

typedef const sp_oxg_api_t *(*sp_oxg_get_api_fn)(uint32_t abi_version);

#endif /* SP_BACKENDS_ONNX_GPU_API_H */
