/*
 * backends/onnx/ox.h - the ONNX backend's internal types: tensors, the graph
 * (values and nodes), the operator table, the run context.
 *
 * Threads: a loaded graph (sp_ox_graph_t) is read-only after load; one run
 * context (sp_ox_run_t, its buffer pool) belongs to one model instance, and
 * the server never runs two batches on one instance at once, so nothing
 * here takes a lock.
 * Memory: the graph owns its constants and the decoded protobuf (attributes
 * point into it); a run context owns its pool of activation buffers, which
 * stays allocated between batches and is freed with the instance.
 */
#ifndef SP_BACKENDS_ONNX_OX_H
#define SP_BACKENDS_ONNX_OX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "onnx.pb-c.h"

#define OX_MAX_DIMS 8
#define OX_MAX_IO 16 /* inputs or outputs of one node */
/* floats of a QDQConv / QDQMatMul's quantization parameters (qdq.c fuse_one) */
#define OX_QP_LEN 12
/* Elements of one computed tensor: 2^34 floats (64 GiB) is past any real model and keeps byte
 * counts far from overflow. The fuzz target lowers sp_ox_graph_t.max_numel. */
#define OX_MAX_RUN_NUMEL ((int64_t)1 << 34)

/* ONNX TensorProto.DataType values the backend computes with. */
enum {
    OX_FLOAT = 1,
    OX_UINT8 = 2,
    OX_INT8 = 3,
    OX_INT16 = 5,   /* internal: widened quantized weights (ops_quant.c, qdq.c) */
    OX_INT32 = 6,
    OX_INT64 = 7,
    OX_BOOL = 9,
    OX_FLOAT16 = 10,
    OX_DOUBLE = 11,
};

typedef struct sp_ox_tensor {
    int32_t dtype; /* OX_FLOAT, ... */
    int32_t nd;
    int64_t dims[OX_MAX_DIMS];
    void *data;    /* 64-byte aligned; owned by the graph (constants) or the pool */
    size_t cap;    /* bytes allocated at data */
} sp_ox_tensor_t;

typedef struct sp_ox_value {
    char *name;           /* borrowed from the protobuf */
    bool is_const;        /* an initializer, a Constant, or folded at load */
    bool is_input;        /* a graph input the caller feeds */
    bool is_output;       /* a graph output */
    int32_t last_use;     /* index in order[] of the last node reading it (-1: none) */
    int32_t etype;        /* element type inferred at load (dtype.c); 0: a value made later */
    int32_t def;          /* index in order[] of the node computing it (-1: none) */
    sp_ox_tensor_t t;        /* constants: the data; others: filled during a run */
} sp_ox_value_t;

struct sp_ox_node;
struct sp_ox_run;

/* One operator. check runs at load (attributes, constant inputs); run computes
 * the outputs, allocating them with sp_ox_out. Both return 0, or -1 with err. */
typedef struct sp_ox_op {
    const char *name;
    const char *const *attrs; /* the attributes it understands (NULL-terminated) */
    int min_in, max_in, min_out, max_out;
    int (*check)(struct sp_ox_node *n, char *err, size_t err_len);
    int (*run)(struct sp_ox_run *r, struct sp_ox_node *n, const sp_ox_tensor_t *const *in, int n_in,
               sp_ox_tensor_t *const *out, int n_out);
} sp_ox_op_t;

typedef struct sp_ox_node {
    const Onnx__NodeProto *p; /* attributes, name, op_type */
    const sp_ox_op_t *op;
    int64_t opset;
    int32_t n_in, n_out;
    int32_t in[OX_MAX_IO];    /* value indices; -1 = an omitted optional input */
    int32_t out[OX_MAX_IO];
    bool dead;                /* folded or fused away */
    /* Fusions: Conv/Gemm/MatMul followed by Relu; MatMul followed by Add of a bias. */
    int fused_relu;
    int32_t fused_bias;       /* value index of a [N] bias constant, -1 none */
    /* Conv followed by Add of another activation (ResNet's residual): the Add's other input
     * (value index, -1 none) is added after the bias and before fused_relu, which then stands
     * for a Relu after the Add. fused_add_node is the dead Add (node index), run on its own
     * when the shapes turn out not to match at run time (a broadcasting Add). */
    int32_t fused_add;
    int32_t fused_add_node;
    char label[96];           /* "node 'name' (Conv)" for messages */
} sp_ox_node_t;

typedef struct sp_ox_graph {
    Onnx__ModelProto *proto;
    int64_t opset;            /* the default domain's */
    int32_t n_values, n_nodes;
    sp_ox_value_t *values;
    sp_ox_node_t *nodes;
    int32_t *order;           /* live nodes in execution order */
    int32_t n_order;
    int32_t n_inputs, n_outputs;
    int32_t inputs[OX_MAX_IO];  /* value indices of the fed inputs, graph order */
    int32_t outputs[OX_MAX_IO];
    uint64_t const_bytes;
    int n_folded, n_fused;
    bool keep_residual_add;   /* set before prepare: no Conv+Add fusion (the GPU executor runs
                               * the Add itself) */
    int64_t max_numel;        /* elements one computed tensor may have (OX_MAX_RUN_NUMEL) */
} sp_ox_graph_t;

/* A free buffer of the pool. */
typedef struct sp_ox_buf {
    void *data;
    size_t cap;
} sp_ox_buf_t;

/* An arena memory plan for one set of input shapes (graph.c): each activation's offset in the
 * run's arena, from its liveness interval and its size at those shapes. */
#define OX_MAX_PLANS 8 /* plans kept per run context (least recently used one replaced) */
typedef struct sp_ox_plan {
    int32_t nd[OX_MAX_IO];
    int64_t dims[OX_MAX_IO][OX_MAX_DIMS]; /* the fed inputs' shapes (the key) */
    size_t *off, *size;       /* per value; size 0: not in the arena */
    int32_t *alias;           /* per value: 1 + the value whose buffer it took over in the
                               * recording run (oneDNN's residual accumulation), 0 none */
    int n_shared;             /* values with an alias */
    size_t peak;              /* arena bytes the plan needs */
    size_t sum;               /* bytes of all its activations side by side */
    size_t pool;              /* bytes the pool held after the recording run (inputs, activations
                               * and temporaries of every shape so far): what it kept before */
    uint64_t used;            /* run counter when last used */
    uint64_t outs_sig;        /* which values were kept to the end (is_output) when made */
} sp_ox_plan_t;

typedef struct sp_ox_run {
    sp_ox_graph_t *g;
    const sp_ox_node_t *node;    /* the node being run, for messages */
    char *err;
    size_t err_len;
    sp_ox_buf_t *free_bufs;
    int32_t n_free, cap_free;
    void *scratch;            /* im2col and packing space, grown on demand */
    size_t scratch_cap;
    int n_threads;            /* threads a GEMM may use (0 or 1: the caller's only) */
    struct sp_ox_dnnl *dnnl;  /* the oneDNN engine's state (dnnl.c), NULL: our own runtime */
    /* The arena plan (graph.c; our own runtime only: oneDNN's convolution takes over its
     * residual input's buffer, which a fixed-offset plan cannot express). */
    bool no_arena;            /* set by the owner: the pool only */
    sp_ox_plan_t plans[OX_MAX_PLANS];
    int32_t n_plans;
    const sp_ox_plan_t *plan; /* during a run that follows a plan, else NULL */
    size_t *rec;              /* during a run that records sizes: bytes per value, else NULL */
    int32_t *rec_first;       /* ... and per value: 1 + the order index of its first buffer (a
                               * fused group's head writes the group's last value early) */
    int32_t *rec_alias;       /* ... and per value: 1 + the value whose buffer it took over */
    int32_t at;               /* order index of the node being run */
    uint32_t *handed;         /* per value: the run counter when its slot was handed out */
    uint64_t runs;            /* run counter */
    void *arena;
    size_t arena_cap;
    bool trim_pool;           /* a plan was made: free the pool's idle buffers once */
    uint64_t plans_made;      /* for the owner's log line */
    const sp_ox_plan_t *last_made;
} sp_ox_run_t;

/* ---- load.c ---- */
/* Read, decode and check path (a model in dir), build the graph. 0 or -1 with err. */
int sp_ox_graph_load(const char *path, const char *dir, sp_ox_graph_t **out, char *err, size_t err_len);
void sp_ox_graph_free(sp_ox_graph_t *g);
/* Decode a TensorProto (initializer or attribute) into t (data malloc'd, aligned). */
int sp_ox_tensor_from_proto(const Onnx__TensorProto *tp, const char *dir, const char *what,
                         sp_ox_tensor_t *t, char *err, size_t err_len);

/* ---- shape.c ---- */
/* Static shape inference over the ordered graph (symbolic batch): folds Shape chains to
 * constants, gives single-symbol Reshape targets a constant -1 form, checks MatMul/Gemm and
 * broadcasting where sizes are known. 0, or -1 with err naming the node. */
int sp_ox_infer_shapes(sp_ox_graph_t *g, char *err, size_t err_len);

/* ---- dtype.c ---- */
/* Element types of every value from the inputs, the initializers and each operator's type rule,
 * over the ordered graph (before fusion); sets sp_ox_value_t.etype. A rule broken (inputs of two
 * types where the operator takes one, a zero point of the wrong type, an output declared with
 * another type) is -1 with err naming the node, the operator and both types. */
int sp_ox_infer_types(sp_ox_graph_t *g, char *err, size_t err_len);

/* ---- graph.c ---- */
/* Order, fold, fuse and plan a loaded graph. */
int sp_ox_graph_prepare(sp_ox_graph_t *g, char *err, size_t err_len);
/* Run the whole graph: inputs already set in g->values[inputs[i]].t by the caller
 * (in pool buffers). Output values stay set until sp_ox_run_release. */
int sp_ox_graph_run(sp_ox_run_t *r);
void sp_ox_run_release_all(sp_ox_run_t *r);
void sp_ox_run_free(sp_ox_run_t *r);
/* Run one node with our own operators (the reference; dnnl.c falls back to it). */
int sp_ox_run_node_own(sp_ox_run_t *r, sp_ox_node_t *n);
/* A Conv's fused residual Add and the Relu after it, on the plain conv(+bias) result in out. */
int sp_ox_fused_add(sp_ox_run_t *r, const sp_ox_node_t *n, sp_ox_tensor_t *out);

/* ---- plan.c ---- */
/* Before a run's nodes (inputs set): follow the plan of these input shapes, or record the sizes
 * for one (none for oneDNN runs or no_arena). After them: make the plan of a recorded run that
 * succeeded; no plan is followed outside a run. */
void sp_ox_plan_begin(sp_ox_run_t *r);
void sp_ox_plan_end(sp_ox_run_t *r, bool ok);
/* Whether value `to` may take over value `from`'s buffer (from is read for the last time by the
 * node computing to, as oneDNN's residual accumulation does): always outside plans (pool
 * buffers) and in a recording run (which notes it, so that the plan gives from's slot the
 * lifetime of both); in a planned run only when the plan was made with that take-over. */
bool sp_ox_plan_take(sp_ox_run_t *r, int32_t from, int32_t to);

/* ---- tensor helpers (ops_util.c) ---- */
size_t sp_ox_dtype_size(int32_t dtype);
const char *sp_ox_dtype_name(int32_t dtype);
int64_t sp_ox_numel(const sp_ox_tensor_t *t);
void *sp_ox_aligned_alloc(size_t bytes);
/* Give out a tensor of that type and shape from the pool (data uninitialized). */
int sp_ox_out(sp_ox_run_t *r, sp_ox_tensor_t *t, int32_t dtype, int32_t nd, const int64_t *dims);
void sp_ox_pool_put(sp_ox_run_t *r, sp_ox_tensor_t *t);
void *sp_ox_scratch(sp_ox_run_t *r, size_t bytes);
int sp_ox_fail(sp_ox_run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sp_ox_shape_str(const int64_t *dims, int nd, char *buf, size_t len);

/* Attributes (absent -> default). */
const Onnx__AttributeProto *sp_ox_attr(const sp_ox_node_t *n, const char *name);
int64_t sp_ox_attr_i(const sp_ox_node_t *n, const char *name, int64_t def);
float sp_ox_attr_f(const sp_ox_node_t *n, const char *name, float def);
const char *sp_ox_attr_s(const sp_ox_node_t *n, const char *name, const char *def);
/* Integer list: count in *n_out (0 when absent); NULL when absent. */
const int64_t *sp_ox_attr_ints(const sp_ox_node_t *n, const char *name, size_t *n_out);

/* A constant integer tensor's values as int64 (shape inputs). -1 with err when not integer. */
int sp_ox_tensor_ints(sp_ox_run_t *r, const sp_ox_tensor_t *t, int64_t *vals, int64_t max, int64_t *n);

/* The operator table (ops.c): NULL when the operator is not supported. */
const sp_ox_op_t *sp_ox_op_find(const char *op_type);

/* GEMM (gemm.c): C[M,N] = A[M,K] * B[K,N] (+ C when accumulate), row-major with
 * leading dimensions; A and B may be given transposed. */
void sp_ox_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
              int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate);
/* The same over up to n_threads threads (small products stay on the caller's). */
void sp_ox_sgemm_par(int n_threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                  int accumulate);

/* ---- quantized operators (ops_quant.c, qgemm.c, qdq.c) ---- */
const sp_ox_op_t *sp_ox_quant_op_find(const char *op_type); /* also ops_more.c's */
const sp_ox_op_t *sp_ox_more_op_find(const char *op_type);  /* ConvTranspose, Resize */
float sp_ox_half_to_float(uint16_t h);
uint16_t sp_ox_float_to_half(float f); /* round half to even; past 65504 -> inf */
uint16_t sp_ox_double_to_half(double d); /* the same from double, rounded once */
/* A scale (FLOAT, nonzero, finite; 1 value or ch per-axis values) and its zero point
 * (UINT8/INT8, or INT32 when zp_int32_ok; as many values). 0, or -1 with err. */
int sp_ox_check_qparams(const sp_ox_tensor_t *s, const sp_ox_tensor_t *z, int64_t ch, bool zp_int32_ok,
                        char *err, size_t err_len);
/* C[i][j] = sum_k A[i][k] B[k][j], exact int32: A int16 rows of kp (a multiple of 16) elements,
 * B packed in panels of 16 columns (sp_ox_qpack_rows; element (k, j) of panel jb at
 * ((jb * kp/2 + k/2) * 16 + j % 16) * 2 + k % 2). */
size_t sp_ox_qpanel_elems(int64_t n, int64_t kp); /* int16 elements of B's panels */
void sp_ox_qpack_rows(const int16_t *rows, int64_t n, int64_t kp, int16_t *panel); /* rows [n][kp] */
void sp_ox_qgemm(int n_threads, int64_t m, int64_t n, int64_t kp, const int16_t *a, const int16_t *b,
                 int32_t *c, int64_t ldc);
const char *sp_ox_qgemm_kernel(void); /* "avx2" or "scalar": the one sp_ox_qgemm uses */
typedef struct sp_ox_qgeom {
    int64_t ih, iw, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
} sp_ox_qgeom_t;
int sp_ox_qconv_geom(sp_ox_run_t *r, const sp_ox_node_t *n, const int64_t *xdims, int32_t xnd,
                     const int64_t *wdims, sp_ox_qgeom_t *g);
/* The float epilogue of a fused convolution: out = acc * mult[c] + bias[c] (relu). */
typedef struct sp_ox_qepi {
    const float *mult, *bias;
    int relu;
    float *out;
} sp_ox_qepi_t;
/* Integer convolution of x16 [batch, c, ih, iw] (zero point subtracted) with weight rows w16
 * [m][kp]: into acc [batch, m, oh*ow] as int32, or with epi, straight into epi->out as float. */
int sp_ox_qconv_acc(sp_ox_run_t *r, const int16_t *x16, int64_t batch, int64_t c, const int16_t *w16,
                    int64_t m, int64_t group, int64_t kp, const sp_ox_qgeom_t *g, int32_t *acc,
                    const sp_ox_qepi_t *epi);
void sp_ox_dequant_row(const int32_t *acc, int64_t n, float mult, float bias, int relu, float *y);
/* Before folding: check the constant scales and zero points of the quantized operators (load
 * errors naming the node) and fuse QuantizeLinear->DequantizeLinear->Conv/MatMul/Gemm with
 * DequantizeLinear'd constant weights into integer operators (qdq.c). */
int sp_ox_qdq_prepare(sp_ox_graph_t *g, char *err, size_t err_len);

#endif /* SP_BACKENDS_ONNX_OX_H */
