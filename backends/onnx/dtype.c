/*
 * backends/onnx/dtype.c - element-type inference at load.
 *
 * Every value gets its element type before anything runs: graph inputs and initializers carry
 * theirs, and each node's outputs follow from its inputs by the operator's type rule (ONNX's
 * type constraints: "T" shared by inputs and output, Shape gives INT64, Cast gives its "to",
 * QuantizeLinear gives its zero point's type, and so on). A node whose inputs break the rule
 * (Add of FLOAT and INT64, MatMul of FLOAT16 and FLOAT, a zero point of another type than its
 * quantized tensor, a Slice with INT32 starts and INT64 ends) and a graph output declared with
 * another type than the graph computes are load errors naming the node, the operator and the
 * two types, instead of a failure at the first request.
 *
 * Rules check what ONNX allows, not what our kernels implement: a type the kernels do not do
 * (a FLOAT16 Conv) still loads here and is refused with "not supported" when it runs, as before.
 * The inferred type is kept (sp_ox_value_t.etype) and graph.c holds the run to it: a folded
 * constant or a computed activation of another type is an error, so the rules below and the
 * kernels cannot drift apart unnoticed.
 *
 * Threads: load time only. Memory: none.
 */
#include <stdio.h>
#include <string.h>

#include "ox.h"

typedef struct tctx {
    sp_ox_graph_t *g;
    const sp_ox_node_t *n;
    char *err;
    size_t err_len;
} tctx_t;

/* The inferred type of input k (0: absent, or unknown). */
static int32_t
in_t(const tctx_t *c, int k)
{
    if (k >= c->n->n_in || c->n->in[k] < 0) return 0;
    return c->g->values[c->n->in[k]].etype;
}

static const char *
in_name(const tctx_t *c, int k)
{
    return c->g->values[c->n->in[k]].name;
}

/* Inputs a and b (when both are present and known) have one type. */
static int
same(tctx_t *c, int a, int b)
{
    int32_t ta = in_t(c, a), tb = in_t(c, b);
    if (ta == 0 || tb == 0 || ta == tb) return 0;
    snprintf(c->err, c->err_len, "%s: input %d '%.60s' is %s and input %d '%.60s' is %s; the "
             "operator takes one element type for both", c->n->label, a, in_name(c, a),
             sp_ox_dtype_name(ta), b, in_name(c, b), sp_ox_dtype_name(tb));
    return -1;
}

/* Every present input from first on has input first's type. */
static int
same_from(tctx_t *c, int first)
{
    for (int k = first + 1; k < c->n->n_in; k++) {
        if (same(c, first, k)) return -1;
    }
    return 0;
}

/* Input k (when present and known) is of type a or b (b 0: a only). what names the input. */
static int
one_of(tctx_t *c, int k, int32_t a, int32_t b, const char *what)
{
    int32_t t = in_t(c, k);
    if (b == a) b = 0;
    if (t == 0 || t == a || (b && t == b)) return 0;
    snprintf(c->err, c->err_len, "%s: %s '%.60s' is %s where %s%s%s is expected", c->n->label, what,
             in_name(c, k), sp_ox_dtype_name(t), sp_ox_dtype_name(a), b ? " or " : "",
             b ? sp_ox_dtype_name(b) : "");
    return -1;
}

static bool
is_op(const char *name, const char *const *list)
{
    for (; *list; list++) {
        if (strcmp(name, *list) == 0) return true;
    }
    return false;
}

/* Operators whose inputs and outputs all share one type T (Clip's bounds, Gemm's C, Conv's bias
 * and Concat's pieces included). */
static const char *const SAME_ALL[] = {
    "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Gelu", "Erf", "HardSwish",
    "HardSigmoid", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity", "Softmax",
    "LogSoftmax", "MatMul", "Gemm", "Conv", "ConvTranspose", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "Clip", "Concat", "Flatten", "Transpose", NULL,
};

/* The Constant node's type, from whichever value attribute it has. */
static int32_t
constant_type(const sp_ox_node_t *n)
{
    const Onnx__AttributeProto *a = sp_ox_attr(n, "value");
    if (a && a->t) return a->t->data_type;
    if (sp_ox_attr(n, "value_float") || sp_ox_attr(n, "value_floats")) return OX_FLOAT;
    if (sp_ox_attr(n, "value_int") || sp_ox_attr(n, "value_ints")) return OX_INT64;
    return 0;
}

/* The rule of one node: checks its inputs, sets ot[] (0: unknown). */
static int
rule(tctx_t *c, int32_t *ot)
{
    const sp_ox_node_t *n = c->n;
    const char *op = n->op->name;
    int32_t t0 = in_t(c, 0);
    for (int k = 0; k < n->n_out; k++) ot[k] = t0;
    if (is_op(op, SAME_ALL)) return same_from(c, 0);
    if (strcmp(op, "MaxPool") == 0) {
        if (n->n_out > 1) ot[1] = OX_INT64; /* the indices */
        return 0;
    }
    if (strcmp(op, "BatchNormalization") == 0) {
        /* opset 15: scale and bias one type, mean and variance one type (each may differ from
         * X's); the running statistics of training mode are of the mean's type */
        for (int k = 1; k < n->n_out; k++) ot[k] = in_t(c, 3);
        return same(c, 1, 2) || same(c, 3, 4);
    }
    if (strcmp(op, "Pow") == 0) return 0; /* the exponent may be of any numeric type */
    if (strcmp(op, "Reshape") == 0 || strcmp(op, "Expand") == 0) return one_of(c, 1, OX_INT64, 0, "shape");
    if (strcmp(op, "Squeeze") == 0 || strcmp(op, "Unsqueeze") == 0 || strncmp(op, "Reduce", 6) == 0) {
        return one_of(c, 1, OX_INT64, 0, "axes");
    }
    if (strcmp(op, "Split") == 0) return one_of(c, 1, OX_INT64, 0, "split");
    if (strcmp(op, "Slice") == 0) {
        for (int k = 1; k < n->n_in; k++) {
            if (one_of(c, k, OX_INT32, OX_INT64, "index input") || same(c, 1, k)) return -1;
        }
        return 0;
    }
    if (strcmp(op, "Gather") == 0) return one_of(c, 1, OX_INT32, OX_INT64, "indices");
    if (strcmp(op, "Shape") == 0) {
        ot[0] = OX_INT64;
        return 0;
    }
    if (strcmp(op, "Where") == 0) {
        ot[0] = in_t(c, 1) ? in_t(c, 1) : in_t(c, 2);
        return one_of(c, 0, OX_BOOL, 0, "condition") || same(c, 1, 2);
    }
    if (strcmp(op, "Cast") == 0) {
        ot[0] = (int32_t)sp_ox_attr_i(n, "to", 0); /* check_cast refused the unsupported ones */
        return 0;
    }
    if (strcmp(op, "Constant") == 0) {
        ot[0] = constant_type(n);
        return 0;
    }
    if (strcmp(op, "LayerNormalization") == 0) {
        int32_t stash = (int32_t)sp_ox_attr_i(n, "stash_type", OX_FLOAT);
        for (int k = 1; k < n->n_out; k++) ot[k] = stash; /* mean and inverse deviation */
        return same_from(c, 0);
    }
    if (strcmp(op, "Pad") == 0) {
        return one_of(c, 1, OX_INT64, 0, "pads") || same(c, 0, 2) ||
               one_of(c, 3, OX_INT32, OX_INT64, "axes");
    }
    if (strcmp(op, "Resize") == 0) {
        return one_of(c, 2, OX_FLOAT, 0, "scales") || one_of(c, 3, OX_INT64, 0, "sizes");
    }
    if (strcmp(op, "QuantizeLinear") == 0) {
        /* y has the zero point's type: UINT8 without one */
        int32_t zt = in_t(c, 2);
        if (zt != 0 && zt != OX_UINT8 && zt != OX_INT8) {
            snprintf(c->err, c->err_len, "%s: zero point '%.60s' is %s; quantizing to it is not "
                     "supported (UINT8 or INT8; the input is %s)", n->label, in_name(c, 2),
                     sp_ox_dtype_name(zt), sp_ox_dtype_name(t0));
            return -1;
        }
        ot[0] = n->n_in > 2 && n->in[2] >= 0 ? zt : OX_UINT8;
        if (t0 == OX_FLOAT16 || t0 == OX_FLOAT) return one_of(c, 1, t0, OX_FLOAT, "scale");
        return one_of(c, 1, OX_FLOAT, OX_FLOAT16, "scale");
    }
    if (strcmp(op, "DequantizeLinear") == 0) {
        ot[0] = in_t(c, 1); /* the scale's type */
        return one_of(c, 1, OX_FLOAT, OX_FLOAT16, "scale") || same(c, 0, 2);
    }
    if (strcmp(op, "DynamicQuantizeLinear") == 0) {
        ot[0] = OX_UINT8;
        if (n->n_out > 1) ot[1] = OX_FLOAT;
        if (n->n_out > 2) ot[2] = OX_UINT8;
        return one_of(c, 0, OX_FLOAT, 0, "input");
    }
    if (strcmp(op, "MatMulInteger") == 0 || strcmp(op, "ConvInteger") == 0) {
        ot[0] = OX_INT32;
        return one_of(c, 0, OX_UINT8, OX_INT8, "input") || one_of(c, 1, OX_UINT8, OX_INT8, "input") ||
               same(c, 0, 2) || same(c, 1, 3);
    }
    if (strcmp(op, "QLinearMatMul") == 0 || strcmp(op, "QLinearConv") == 0) {
        ot[0] = in_t(c, 7); /* y's zero point */
        return one_of(c, 0, OX_UINT8, OX_INT8, "input") || one_of(c, 3, OX_UINT8, OX_INT8, "input") ||
               one_of(c, 7, OX_UINT8, OX_INT8, "output zero point") || same(c, 0, 2) ||
               same(c, 3, 5) || one_of(c, 1, OX_FLOAT, 0, "scale") || one_of(c, 4, OX_FLOAT, 0, "scale") ||
               one_of(c, 6, OX_FLOAT, 0, "scale") || one_of(c, 8, OX_INT32, 0, "bias");
    }
    /* An operator added to the table without a rule here: refused, so that no value goes
     * untyped (the node suite loads every operator of the table). */
    snprintf(c->err, c->err_len, "%s: no element-type rule for the operator (dtype.c)", n->label);
    return -1;
}

/* The node computing value v ("an input or initializer" when none). */
static const char *
producer(const sp_ox_graph_t *g, int32_t v)
{
    for (int32_t k = 0; k < g->n_nodes; k++) {
        for (int j = 0; j < g->nodes[k].n_out; j++) {
            if (g->nodes[k].out[j] == v) return g->nodes[k].label;
        }
    }
    return "an input or initializer";
}

/* The file's value_info: the element type it declares for a value against the inferred one. A
 * file that says one thing and computes another is untrusted input (a consumer trusting the
 * declaration would read the bytes as the wrong type): refused, naming the value and both
 * types. Entries without a tensor type or element type, or naming no value of the graph (an
 * exporter's leftover for a removed value), say nothing about the run and are passed over. */
static int
check_value_info(const sp_ox_graph_t *g, const Onnx__GraphProto *gp, char *err, size_t err_len)
{
    for (size_t i = 0; i < gp->n_value_info; i++) {
        const Onnx__ValueInfoProto *vi = gp->value_info[i];
        const Onnx__TypeProto *ty = vi ? vi->type : NULL;
        if (vi == NULL || vi->name == NULL || ty == NULL || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
            ty->tensor_type == NULL || ty->tensor_type->elem_type == 0) {
            continue;
        }
        int32_t decl = ty->tensor_type->elem_type;
        /* a linear search: value_info is read once at load, and strcmp over a few thousand
         * names per entry stays in the milliseconds for BERT-sized graphs */
        for (int32_t v = 0; v < g->n_values; v++) {
            const sp_ox_value_t *val = &g->values[v];
            if (val->name == NULL || strcmp(val->name, vi->name) != 0) continue;
            if (val->etype != 0 && val->etype != decl) {
                snprintf(err, err_len, "value_info '%.60s' declares %s, but %s computes it as %s", val->name,
                         sp_ox_dtype_name(decl), producer(g, v), sp_ox_dtype_name(val->etype));
                return -1;
            }
            break;
        }
    }
    return 0;
}

int
sp_ox_infer_types(sp_ox_graph_t *g, char *err, size_t err_len)
{
    for (int32_t v = 0; v < g->n_values; v++) {
        sp_ox_value_t *val = &g->values[v];
        val->etype = val->is_const || val->is_input ? val->t.dtype : 0;
    }
    tctx_t c = {g, NULL, err, err_len};
    for (int32_t o = 0; o < g->n_order; o++) {
        const sp_ox_node_t *n = &g->nodes[g->order[o]];
        c.n = n;
        int32_t ot[OX_MAX_IO] = {0};
        if (rule(&c, ot)) return -1;
        for (int k = 0; k < n->n_out; k++) g->values[n->out[k]].etype = ot[k];
    }
    const Onnx__GraphProto *gp = g->proto->graph;
    if (check_value_info(g, gp, err, err_len)) return -1;
    for (int32_t i = 0; i < g->n_outputs && (size_t)i < gp->n_output; i++) {
        const Onnx__TypeProto *ty = gp->output[i]->type;
        const sp_ox_value_t *val = &g->values[g->outputs[i]];
        if (ty == NULL || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || ty->tensor_type == NULL) {
            continue;
        }
        int32_t decl = ty->tensor_type->elem_type;
        if (decl == 0 || val->etype == 0 || decl == val->etype) continue;
        const char *by = producer(g, g->outputs[i]);
        snprintf(err, err_len, "output '%.60s' is declared %s, but %s computes it as %s", val->name,
                 sp_ox_dtype_name(decl), by, sp_ox_dtype_name(val->etype));
        return -1;
    }
    return 0;
}
