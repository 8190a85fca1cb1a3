/*
 * backends/onnx/qdq.c - quantized graphs at load, before constant folding:
 *
 * 1. The constant scales and zero points of QuantizeLinear, DequantizeLinear,
 *    QLinearMatMul and QLinearConv are checked (type, shape, a zero or
 *    non-finite scale): a malformed model is a load error naming the node,
 *    not a run error on the first request.
 * 2. The QDQ form that `sampan optimize` writes (and other quantizers:
 *    onnxruntime's, TensorRT's) is fused into integer operators:
 *        x -> QuantizeLinear(sx, zx) -> DequantizeLinear(sx, zx) -+
 *        Wq (INT8 constant) -> DequantizeLinear(sw[c], zw[c]) ----+-> Conv / MatMul / Gemm
 *    becomes one node computing  y[c] = sx * sw[c] * sum((xq - zx) (Wq - zw[c])) + b[c]
 *    with the exact integer product of qgemm.c: the same value as the QDQ
 *    graph's float convolution of dequantized operands, up to the float
 *    rounding of that one sum (the QDQ graph's own float sum rounds at each
 *    term). A BatchNormalization after a Conv is folded into the per-channel
 *    multiplier and bias, an Add of a constant [N] after MatMul into the
 *    bias, and a Relu after any of them into the node.
 *    The weights are widened to int16 rows (zero point subtracted, K padded
 *    to 16) once here; activations are quantized per run.
 *    The replaced Quantize/DequantizeLinear nodes are marked dead when
 *    nothing else reads them, so folding never dequantizes the weights.
 *
 * Threads: load time only (the graph is not shared yet); the fused operators
 * run like any other (qgemm.c may split a product over threads).
 * Memory: new constants (packed weights, multipliers, biases) belong to the graph.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"

static bool
is_op(const sp_ox_node_t *n, const char *name)
{
    return n && !n->dead && strcmp(n->op->name, name) == 0;
}

static bool
cst(const sp_ox_graph_t *g, int32_t v)
{
    return v >= 0 && g->values[v].is_const;
}

static const sp_ox_tensor_t *
cval(const sp_ox_graph_t *g, int32_t v)
{
    return cst(g, v) ? &g->values[v].t : NULL;
}

/* ---- 1. checks of constant quantization parameters ---- */

static int
check_pair(const sp_ox_graph_t *g, const sp_ox_node_t *n, int si, int ch, const char *what, char *err,
           size_t err_len)
{
    if (si >= n->n_in || !cst(g, n->in[si])) return 0;
    const sp_ox_tensor_t *s = cval(g, n->in[si]);
    const sp_ox_tensor_t *z = si + 1 < n->n_in ? cval(g, n->in[si + 1]) : NULL;
    int64_t c = ch >= 0 ? ch : sp_ox_numel(s);
    char tmp[256];
    if (sp_ox_check_qparams(s, z, c, strcmp(n->op->name, "DequantizeLinear") == 0, tmp, sizeof tmp)) {
        snprintf(err, err_len, "%s: %s: %s", n->label, what, tmp);
        return -1;
    }
    return 0;
}

/* A fed graph input's fixed dimension (from the file's declared shape), -1 when unknown. */
static int64_t
input_dim(const sp_ox_graph_t *g, int32_t v, int64_t axis, int32_t *rank)
{
    *rank = -1;
    if (v < 0 || !g->values[v].is_input) return -1;
    const Onnx__GraphProto *gp = g->proto->graph;
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (strcmp(vi->name, g->values[v].name) != 0 || !vi->type || !vi->type->tensor_type ||
            !vi->type->tensor_type->shape) continue;
        const Onnx__TensorShapeProto *sh = vi->type->tensor_type->shape;
        *rank = (int32_t)sh->n_dim;
        if (axis < 0) axis += (int64_t)sh->n_dim;
        if (axis < 0 || axis >= (int64_t)sh->n_dim) return -1;
        const Onnx__TensorShapeProto__Dimension *d = sh->dim[axis];
        return d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ? d->dim_value : -1;
    }
    return -1;
}

static int
check_params(const sp_ox_graph_t *g, char *err, size_t err_len)
{
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const sp_ox_node_t *n = &g->nodes[i];
        const char *t = n->op->name;
        if (strcmp(t, "QuantizeLinear") == 0 || strcmp(t, "DequantizeLinear") == 0) {
            if (check_pair(g, n, 1, -1, "scale and zero point", err, err_len)) return -1;
            const sp_ox_tensor_t *x = cval(g, n->in[0]), *s = cval(g, n->in[1]);
            if (x && s && sp_ox_numel(s) > 1) {
                int64_t axis = sp_ox_attr_i(n, "axis", 1);
                if (axis < 0) axis += x->nd;
                if (axis < 0 || axis >= x->nd || x->dims[axis] != sp_ox_numel(s)) {
                    snprintf(err, err_len, "%s: %lld scales for axis %lld of a tensor of rank %d", n->label,
                             (long long)sp_ox_numel(s), (long long)sp_ox_attr_i(n, "axis", 1), x->nd);
                    return -1;
                }
            }
            int32_t rank;
            int64_t dim = s && sp_ox_numel(s) > 1 ? input_dim(g, n->in[0], sp_ox_attr_i(n, "axis", 1), &rank) : -1;
            if (dim > 0 && dim != sp_ox_numel(s)) {
                snprintf(err, err_len, "%s: %lld scales for axis %lld of %lld elements (input '%.60s')", n->label,
                         (long long)sp_ox_numel(s), (long long)sp_ox_attr_i(n, "axis", 1), (long long)dim,
                         g->values[n->in[0]].name);
                return -1;
            }
            const sp_ox_tensor_t *z = n->n_in > 2 ? cval(g, n->in[2]) : NULL;
            if (x && z && strcmp(t, "DequantizeLinear") == 0 && z->dtype != x->dtype) {
                snprintf(err, err_len, "%s: zero point %s for input %s", n->label,
                         sp_ox_dtype_name(z->dtype), sp_ox_dtype_name(x->dtype));
                return -1;
            }
        } else if (strcmp(t, "QLinearMatMul") == 0 || strcmp(t, "QLinearConv") == 0) {
            bool conv = t[7] == 'C';
            const sp_ox_tensor_t *w = cval(g, n->in[3]);
            int ch = w && w->nd >= 1 ? (int)(conv ? w->dims[0] : w->dims[w->nd - 1]) : -1;
            if (check_pair(g, n, 1, 0, "x_scale and x_zero_point", err, err_len) ||
                check_pair(g, n, 4, ch, "w_scale and w_zero_point", err, err_len) ||
                check_pair(g, n, 6, 0, "y_scale and y_zero_point", err, err_len)) return -1;
        }
    }
    return 0;
}

/* ---- 2. fusion ---- */

/* A new constant value (data zeroed); -1 on out of memory. */
static int32_t
new_const(sp_ox_graph_t *g, int32_t dtype, int32_t nd, const int64_t *dims)
{
    int32_t v = g->n_values;
    sp_ox_value_t *val = &g->values[v];
    memset(val, 0, sizeof *val);
    val->name = "";
    val->is_const = true;
    val->last_use = -1;
    val->t.dtype = dtype;
    val->t.nd = nd;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) {
        val->t.dims[i] = dims[i];
        n *= dims[i];
    }
    size_t bytes = (size_t)n * sp_ox_dtype_size(dtype);
    val->t.data = sp_ox_aligned_alloc(bytes);
    if (val->t.data == NULL) return -1;
    memset(val->t.data, 0, (bytes + 63) / 64 * 64);
    val->t.cap = bytes;
    g->const_bytes += bytes;
    g->n_values++;
    return v;
}

typedef struct fuse_ctx {
    sp_ox_graph_t *g;
    int32_t *producer; /* value -> node index, -1 */
    int32_t *uses;     /* value -> readers among live nodes (+1 for a graph output) */
} fuse_ctx_t;

static sp_ox_node_t *
producer_of(const fuse_ctx_t *c, int32_t v)
{
    return v >= 0 && c->producer[v] >= 0 ? &c->g->nodes[c->producer[v]] : NULL;
}

static sp_ox_node_t *
sole_reader(const fuse_ctx_t *c, int32_t v)
{
    if (c->uses[v] != 1 || c->g->values[v].is_output) return NULL;
    for (int32_t i = 0; i < c->g->n_nodes; i++) {
        sp_ox_node_t *n = &c->g->nodes[i];
        if (n->dead) continue;
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] == v) return n;
        }
    }
    return NULL;
}

static float
f32_at(const sp_ox_tensor_t *t, int64_t i)
{
    return ((const float *)t->data)[sp_ox_numel(t) == 1 ? 0 : i];
}

static int32_t
zp_at(const sp_ox_tensor_t *t, int64_t i)
{
    if (t == NULL) return 0;
    int64_t k = sp_ox_numel(t) == 1 ? 0 : i;
    return t->dtype == OX_UINT8 ? ((const uint8_t *)t->data)[k] : ((const int8_t *)t->data)[k];
}

static const sp_ox_op_t qconv_op, qmm_op;

/* The activation side: x -> Q(sx, zx) -> DQ(sx, zx) -> here. Fills the float input and
 * [sx, zx, lo, hi]. */
static bool
match_act(const fuse_ctx_t *c, int32_t v, int32_t *xf, float *qp, sp_ox_node_t **dq_out, sp_ox_node_t **q_out)
{
    const sp_ox_graph_t *g = c->g;
    sp_ox_node_t *dq = producer_of(c, v);
    if (!is_op(dq, "DequantizeLinear") || dq->n_in < 2) return false;
    sp_ox_node_t *q = producer_of(c, dq->in[0]);
    if (!is_op(q, "QuantizeLinear") || q->n_in < 2) return false;
    const sp_ox_tensor_t *s1 = cval(g, dq->in[1]), *s2 = cval(g, q->in[1]);
    const sp_ox_tensor_t *z1 = dq->n_in > 2 ? cval(g, dq->in[2]) : NULL, *z2 = q->n_in > 2 ? cval(g, q->in[2]) : NULL;
    if (!s1 || !s2 || sp_ox_numel(s1) != 1 || sp_ox_numel(s2) != 1 || f32_at(s1, 0) != f32_at(s2, 0)) return false;
    if ((dq->n_in > 2 && dq->in[2] >= 0 && !z1) || (q->n_in > 2 && q->in[2] >= 0 && !z2)) return false;
    int32_t t1 = z1 ? z1->dtype : OX_UINT8, t2 = z2 ? z2->dtype : OX_UINT8;
    if (t1 != t2 || zp_at(z1, 0) != zp_at(z2, 0) || (t1 != OX_UINT8 && t1 != OX_INT8)) return false;
    *xf = q->in[0];
    qp[0] = f32_at(s1, 0);
    qp[1] = (float)zp_at(z1, 0);
    qp[2] = t1 == OX_UINT8 ? 0.0f : -128.0f;
    qp[3] = t1 == OX_UINT8 ? 255.0f : 127.0f;
    *dq_out = dq;
    *q_out = q;
    return true;
}

/* The weight side: a constant INT8/UINT8 -> DQ(sw per tensor or per `axis`) -> here. */
static sp_ox_node_t *
match_w(const fuse_ctx_t *c, int32_t v, int64_t axis, int32_t nd)
{
    const sp_ox_graph_t *g = c->g;
    sp_ox_node_t *dq = producer_of(c, v);
    if (!is_op(dq, "DequantizeLinear") || dq->n_in < 2) return NULL;
    const sp_ox_tensor_t *w = cval(g, dq->in[0]), *s = cval(g, dq->in[1]);
    const sp_ox_tensor_t *z = dq->n_in > 2 ? cval(g, dq->in[2]) : NULL;
    if (!w || !s || (w->dtype != OX_INT8 && w->dtype != OX_UINT8) || w->nd != nd) return NULL;
    if (dq->n_in > 2 && dq->in[2] >= 0 && (!z || z->dtype != w->dtype)) return NULL;
    if (sp_ox_numel(s) != 1) {
        int64_t a = sp_ox_attr_i(dq, "axis", 1);
        if (a < 0) a += nd;
        if (a != axis || s->nd != 1 || sp_ox_numel(s) != w->dims[axis]) return NULL;
    }
    return dq;
}

static void
mark_dead_if_unused(fuse_ctx_t *c, sp_ox_node_t *n)
{
    if (n == NULL || n->dead) return;
    for (int k = 0; k < n->n_out; k++) {
        if (c->uses[n->out[k]] > 0) return;
    }
    n->dead = true;
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] >= 0) c->uses[n->in[k]]--;
    }
}

static void
set_inputs(fuse_ctx_t *c, sp_ox_node_t *n, const int32_t *in, int n_in)
{
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] >= 0) c->uses[n->in[k]]--;
    }
    for (int k = 0; k < n_in; k++) {
        n->in[k] = in[k];
        if (in[k] >= 0) c->uses[in[k]]++;
    }
    n->n_in = n_in;
}

/* Absorb a following node: n takes over its output. */
static void
absorb(fuse_ctx_t *c, sp_ox_node_t *n, sp_ox_node_t *next)
{
    for (int k = 0; k < next->n_in; k++) {
        if (next->in[k] >= 0) c->uses[next->in[k]]--;
    }
    n->out[0] = next->out[0];
    next->dead = true;
    c->g->n_fused++;
}

/* Whether v is read, and only by Add nodes: an output pair before a residual Add, not the input
 * pair of the next Conv / MatMul (which that node's own fusion takes). */
static bool
only_adds_read(const fuse_ctx_t *c, int32_t v)
{
    if (c->uses[v] < 1 || c->g->values[v].is_output) return false;
    for (int32_t i = 0; i < c->g->n_nodes; i++) {
        const sp_ox_node_t *n = &c->g->nodes[i];
        if (n->dead) continue;
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] == v && strcmp(n->op->name, "Add") != 0) return false;
        }
    }
    return true;
}

static int
fuse_one(fuse_ctx_t *c, sp_ox_node_t *n, char *err, size_t err_len)
{
    sp_ox_graph_t *g = c->g;
    const char *t = n->op->name;
    bool conv = strcmp(t, "Conv") == 0, gemm = strcmp(t, "Gemm") == 0, mm = strcmp(t, "MatMul") == 0;
    if (!conv && !gemm && !mm) return 0;
    if (n->n_out != 1 || n->n_in < 2) return 0;
    bool trans_b = gemm && sp_ox_attr_i(n, "transB", 0);
    if (gemm && (sp_ox_attr_i(n, "transA", 0) || sp_ox_attr_f(n, "alpha", 1.0f) != 1.0f ||
                 (n->n_in > 2 && n->in[2] >= 0 && sp_ox_attr_f(n, "beta", 1.0f) != 1.0f))) {
        return 0;
    }
    int32_t xf;
    /* [sx, zx, lo, hi, K or C/group, kh, kw, group, so, zo, lo_o, hi_o]: the last four, an
     * output Q -> DQ pair absorbed below (so 0: none) */
    float qp[OX_QP_LEN] = {0};
    sp_ox_node_t *dqx, *qx;
    if (!match_act(c, n->in[0], &xf, qp, &dqx, &qx)) return 0;
    int32_t wnd = conv ? -1 : 2;
    int64_t waxis = conv ? 0 : (trans_b ? 0 : 1);
    sp_ox_node_t *dqw = NULL;
    if (conv) {
        sp_ox_node_t *p = producer_of(c, n->in[1]);
        const sp_ox_tensor_t *w0 = p && is_op(p, "DequantizeLinear") ? cval(g, p->in[0]) : NULL;
        if (w0 && (w0->nd == 3 || w0->nd == 4)) wnd = w0->nd;
    }
    if (wnd < 0 || (dqw = match_w(c, n->in[1], waxis, wnd)) == NULL) return 0;
    const sp_ox_tensor_t *w = cval(g, dqw->in[0]), *sw = cval(g, dqw->in[1]);
    const sp_ox_tensor_t *zw = dqw->n_in > 2 ? cval(g, dqw->in[2]) : NULL;
    /* rows: output channels (Conv, Gemm transB) or columns of B (MatMul, Gemm) */
    int64_t m = w->dims[waxis], k = sp_ox_numel(w) / (m ? m : 1), kp = (k + 15) / 16 * 16;
    const sp_ox_tensor_t *b = NULL;
    if ((conv || gemm) && n->n_in > 2 && n->in[2] >= 0) {
        b = cval(g, n->in[2]);
        if (!b || b->dtype != OX_FLOAT || sp_ox_numel(b) != m || (gemm && b->nd == 2 && b->dims[0] != 1)) return 0;
    }
    if (conv) {
        int64_t group = sp_ox_attr_i(n, "group", 1);
        if (group < 1 || m % group) return 0;
        qp[4] = (float)w->dims[1];
        qp[5] = w->nd == 4 ? (float)w->dims[2] : 1.0f;
        qp[6] = (float)w->dims[w->nd - 1];
        qp[7] = (float)group;
    } else {
        qp[4] = (float)k;
    }
    /* Conv: weight rows (A of the product); MatMul/Gemm: B's panels, one more copy of
     * the rows, packed below (its dims still say [m, kp]) */
    int64_t dm = m, dq8 = OX_QP_LEN;
    int64_t prows = conv ? m : (int64_t)(sp_ox_qpanel_elems(m, kp) / (size_t)kp);
    int64_t dwp[2] = {prows, kp};
    int32_t vw = new_const(g, OX_INT16, 2, dwp), vm = new_const(g, OX_FLOAT, 1, &dm);
    int32_t vb = new_const(g, OX_FLOAT, 1, &dm), vq = new_const(g, OX_FLOAT, 1, &dq8);
    if (vw < 0 || vm < 0 || vb < 0 || vq < 0) {
        snprintf(err, err_len, "%s: out of memory packing the weights", n->label);
        return -1;
    }
    int16_t *pw = g->values[vw].t.data;
    float *mult = g->values[vm].t.data, *bias = g->values[vb].t.data;
    memcpy(g->values[vq].t.data, qp, sizeof qp);
    int16_t *rows = pw;
    if (!conv) {
        rows = calloc((size_t)(m * kp + 1), sizeof *rows);
        if (rows == NULL) {
            snprintf(err, err_len, "%s: out of memory packing the weights", n->label);
            return -1;
        }
    }
    for (int64_t o = 0; o < m; o++) {
        int32_t z = zp_at(zw, o);
        for (int64_t i = 0; i < k; i++) {
            /* element (o, i) of the rows-along-K view */
            int64_t src = waxis == 0 ? o * k + i : i * m + o;
            int32_t q = w->dtype == OX_UINT8 ? ((const uint8_t *)w->data)[src] : ((const int8_t *)w->data)[src];
            rows[o * kp + i] = (int16_t)(q - z);
        }
        mult[o] = qp[0] * f32_at(sw, o);
        bias[o] = b ? ((const float *)b->data)[o] : 0.0f;
    }
    if (!conv) {
        sp_ox_qpack_rows(rows, m, kp, pw);
        free(rows);
        g->values[vw].t.dims[0] = m;
    }
    int32_t ins[4] = {xf, vw, vm, vq};
    set_inputs(c, n, ins, 4);
    n->in[4] = vb; /* bias: always present (zeros without one) */
    n->n_in = 5;
    c->uses[vb]++;
    n->op = conv ? &qconv_op : &qmm_op;
    g->n_fused++;
    mark_dead_if_unused(c, dqw);
    mark_dead_if_unused(c, dqx);
    mark_dead_if_unused(c, qx);
    /* what follows: BatchNormalization (Conv), Add of a constant [m] (MatMul), then Relu */
    sp_ox_node_t *next = sole_reader(c, n->out[0]);
    if (conv && is_op(next, "BatchNormalization") && next->n_out == 1 && next->n_in == 5 && next->in[0] == n->out[0]) {
        const sp_ox_tensor_t *p[4];
        bool ok = true;
        for (int i = 0; i < 4; i++) {
            p[i] = cval(g, next->in[1 + i]);
            ok = ok && p[i] && p[i]->dtype == OX_FLOAT && sp_ox_numel(p[i]) == m;
        }
        if (ok) {
            float eps = sp_ox_attr_f(next, "epsilon", 1e-5f);
            for (int64_t o = 0; o < m; o++) {
                const float *sc = p[0]->data, *be = p[1]->data, *mu = p[2]->data, *var = p[3]->data;
                float s = sc[o] / sqrtf(var[o] + eps);
                mult[o] *= s;
                bias[o] = (bias[o] - mu[o]) * s + be[o];
            }
            absorb(c, n, next);
            next = sole_reader(c, n->out[0]);
        }
    }
    if (mm && is_op(next, "Add") && next->n_in == 2 && next->in[0] != next->in[1]) {
        int32_t other = next->in[0] == n->out[0] ? next->in[1] : next->in[0];
        const sp_ox_tensor_t *bt = cval(g, other);
        if (bt && bt->dtype == OX_FLOAT && bt->nd == 1 && bt->dims[0] == m) {
            for (int64_t o = 0; o < m; o++) bias[o] += ((const float *)bt->data)[o];
            absorb(c, n, next);
            next = sole_reader(c, n->out[0]);
        }
    }
    if (is_op(next, "Relu")) {
        n->fused_relu = 1;
        absorb(c, n, next);
        next = sole_reader(c, n->out[0]);
    }
    /* An output Q -> DQ pair (sampan optimize writes one on a projection block's residual, so
     * that the Add can stay INT8): the node rounds its output to that grid, and on oneDNN writes
     * it quantized (dnnl.c find_chains). Conv only: QDQMatMul's readers do not chain. */
    sp_ox_node_t *dqo = conv && is_op(next, "QuantizeLinear") && next->in[0] == n->out[0] && next->n_out == 1
                            ? sole_reader(c, next->out[0]) : NULL;
    int32_t yf;
    float qo[4];
    sp_ox_node_t *dq2, *q2;
    if (is_op(dqo, "DequantizeLinear") && dqo->in[0] == next->out[0] && dqo->n_out == 1 &&
        only_adds_read(c, dqo->out[0]) &&
        match_act(c, dqo->out[0], &yf, qo, &dq2, &q2) && yf == n->out[0] && q2 == next && qo[0] > 0.0f) {
        float *vqp = g->values[vq].t.data;
        memcpy(vqp + 8, qo, sizeof qo);
        absorb(c, n, next);
        absorb(c, n, dqo);
    }
    return 0;
}

int
sp_ox_qdq_prepare(sp_ox_graph_t *g, char *err, size_t err_len)
{
    if (check_params(g, err, err_len)) return -1;
    int32_t cand = 0;
    bool any_dq = false;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const char *t = g->nodes[i].op->name;
        cand += strcmp(t, "Conv") == 0 || strcmp(t, "MatMul") == 0 || strcmp(t, "Gemm") == 0;
        any_dq |= strcmp(t, "DequantizeLinear") == 0;
    }
    if (!any_dq || cand == 0) return 0;
    /* Room for 4 new constants per candidate, keeping the spare slots graph.c's fusions use
     * (one per node). */
    size_t cap = (size_t)g->n_values + (size_t)cand * 4 + (size_t)g->n_nodes + 1;
    sp_ox_value_t *nv = realloc(g->values, cap * sizeof *nv);
    if (nv == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    g->values = nv;
    memset(nv + g->n_values, 0, (cap - (size_t)g->n_values) * sizeof *nv);
    fuse_ctx_t c = {g, malloc(cap * sizeof(int32_t)), calloc(cap, sizeof(int32_t))};
    int rc = -1;
    if (c.producer == NULL || c.uses == NULL) {
        snprintf(err, err_len, "out of memory");
        goto done;
    }
    for (size_t v = 0; v < cap; v++) c.producer[v] = -1;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const sp_ox_node_t *n = &g->nodes[i];
        if (n->dead) continue;
        for (int k = 0; k < n->n_out; k++) c.producer[n->out[k]] = i;
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] >= 0) c.uses[n->in[k]]++;
        }
    }
    for (int32_t i = 0; i < g->n_outputs; i++) c.uses[g->outputs[i]]++;
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        if (!n->dead && fuse_one(&c, n, err, err_len)) goto done;
    }
    rc = 0;
done:
    free(c.producer);
    free(c.uses);
    return rc;
}

/* ---- the fused operators ---- */

/* Quantize x to int16 (minus the zero point): q = clamp(rint(x / sx) + zx, lo, hi) - zx,
 * QuantizeLinear's arithmetic (a true division, round half to even). */
static void
quantize16_scalar(const float *x, int64_t n, const float *qp, int16_t *dst)
{
    float s = qp[0], z = qp[1], lo = qp[2], hi = qp[3];
    for (int64_t i = 0; i < n; i++) {
        float q = rintf(x[i] / s) + z;
        q = q < lo ? lo : q > hi ? hi : q;
        if (q != q) q = z; /* NaN: the zero point (0 after subtraction) */
        dst[i] = (int16_t)(q - z);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* The same, 8 at a time: vdivps and vroundps are the IEEE operations rintf and / are. */
__attribute__((target("avx2"))) static void
quantize16_avx2(const float *x, int64_t n, const float *qp, int16_t *dst)
{
    __m256 s = _mm256_set1_ps(qp[0]), z = _mm256_set1_ps(qp[1]), lo = _mm256_set1_ps(qp[2]),
           hi = _mm256_set1_ps(qp[3]);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 q = _mm256_add_ps(_mm256_round_ps(_mm256_div_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), z);
        /* max/min return the second operand for NaN: lo then... order chosen so NaN -> z */
        __m256 nan = _mm256_cmp_ps(q, q, _CMP_UNORD_Q);
        q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
        q = _mm256_blendv_ps(q, z, nan);
        __m256i k = _mm256_cvtps_epi32(_mm256_sub_ps(q, z));
        __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
        _mm_storeu_si128((__m128i *)(dst + i), p);
    }
    quantize16_scalar(x + i, n - i, qp, dst + i);
}
#endif

static void
quantize16(const float *x, int64_t n, const float *qp, int16_t *dst)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (strcmp(sp_ox_qgemm_kernel(), "scalar") != 0) {
        quantize16_avx2(x, n, qp, dst);
        return;
    }
#endif
    quantize16_scalar(x, n, qp, dst);
}

static int
run_qconv(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
          sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    const sp_ox_tensor_t *x = in[0], *w = in[1];
    const float *mult = in[2]->data, *qp = in[3]->data, *bias = in[4]->data;
    if (x->dtype != OX_FLOAT) return sp_ox_fail(r, "input of type %s (FLOAT expected)", sp_ox_dtype_name(x->dtype));
    int64_t m = w->dims[0], kp = w->dims[1], cg = (int64_t)qp[4], group = (int64_t)qp[7];
    int64_t wd[4] = {m, cg, (int64_t)qp[5], (int64_t)qp[6]};
    if (x->nd == 3) wd[2] = wd[3];
    if ((x->nd != 4 && x->nd != 3) || x->dims[1] != cg * group) {
        char b[128];
        sp_ox_shape_str(x->dims, x->nd, b, sizeof b);
        return sp_ox_fail(r, "input %s for %lld input channels", b, (long long)(cg * group));
    }
    sp_ox_qgeom_t g;
    if (sp_ox_qconv_geom(r, n, x->dims, x->nd, wd, &g)) return -1;
    int64_t d[4] = {x->dims[0], m, g.oh, g.ow};
    if (x->nd == 3) d[2] = g.ow;
    if (sp_ox_out(r, out[0], OX_FLOAT, x->nd, d)) return -1;
    sp_ox_tensor_t x16 = {0};
    if (sp_ox_out(r, &x16, OX_INT16, x->nd, x->dims)) return -1;
    quantize16(x->data, sp_ox_numel(x), qp, x16.data);
    /* With a fused residual Add (graph.c), fused_relu is the Relu after that Add. */
    sp_ox_qepi_t epi = {mult, bias, n->fused_relu && n->fused_add < 0, out[0]->data};
    int rc = sp_ox_qconv_acc(r, x16.data, x->dims[0], x->dims[1], w->data, m, group, kp, &g, NULL, &epi);
    sp_ox_pool_put(r, &x16);
    if (rc == 0 && n->fused_add >= 0) rc = sp_ox_fused_add(r, n, out[0]);
    if (rc == 0 && qp[8] > 0.0f) {
        /* the absorbed output pair: DQ(Q(y)) = so * (clamp(rint(y / so) + zo, lo, hi) - zo) */
        float *o = out[0]->data;
        for (int64_t i = 0, cnt = sp_ox_numel(out[0]); i < cnt; i++) {
            float q = fminf(fmaxf(rintf(o[i] / qp[8]) + qp[9], qp[10]), qp[11]);
            o[i] = (q - qp[9]) * qp[8];
        }
    }
    return rc;
}

static int
run_qmm(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
        sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    const sp_ox_tensor_t *x = in[0], *w = in[1];
    const float *mult = in[2]->data, *qp = in[3]->data, *bias = in[4]->data;
    int64_t m = w->dims[0], kp = w->dims[1], k = (int64_t)qp[4];
    if (x->dtype != OX_FLOAT) return sp_ox_fail(r, "input of type %s (FLOAT expected)", sp_ox_dtype_name(x->dtype));
    if (x->nd < 1 || x->dims[x->nd - 1] != k || (strcmp(n->p->op_type, "Gemm") == 0 && x->nd != 2)) {
        char b[128];
        sp_ox_shape_str(x->dims, x->nd, b, sizeof b);
        return sp_ox_fail(r, "input %s for %lld inner elements", b, (long long)k);
    }
    int64_t rows = k ? sp_ox_numel(x) / k : 0, d[OX_MAX_DIMS];
    for (int i = 0; i < x->nd; i++) d[i] = x->dims[i];
    d[x->nd - 1] = m;
    if (sp_ox_out(r, out[0], OX_FLOAT, x->nd, d)) return -1;
    int16_t *x16 = sp_ox_scratch(r, (size_t)(rows * kp + 1) * sizeof *x16);
    if (x16 == NULL) return -1;
    const float *xd = x->data;
    for (int64_t i = 0; i < rows; i++) {
        quantize16(xd + i * k, k, qp, x16 + i * kp);
        memset(x16 + i * kp + k, 0, (size_t)(kp - k) * sizeof *x16);
    }
    int32_t *acc = malloc((size_t)(rows * m + 1) * sizeof *acc);
    if (acc == NULL) return sp_ox_fail(r, "out of memory");
    sp_ox_qgemm(r->n_threads, rows, m, kp, x16, w->data, acc, m);
    float *y = out[0]->data;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < m; j++) {
            float v = (float)acc[i * m + j] * mult[j] + bias[j];
            y[i * m + j] = n->fused_relu && !(v > 0.0f) ? 0.0f : v;
        }
    }
    free(acc);
    return 0;
}

/* Internal operators (never looked up by name: the fusion sets them). */
static const char *const A_FUSED[] = {NULL};
static const sp_ox_op_t qconv_op = {"QDQConv", A_FUSED, 5, 5, 1, 1, NULL, run_qconv};
static const sp_ox_op_t qmm_op = {"QDQMatMul", A_FUSED, 5, 5, 1, 1, NULL, run_qmm};
