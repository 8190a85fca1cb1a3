/*
 * backends/onnx/shape.c - static shape inference at load, with symbolic dimensions.
 *
 * Every value gets a rank and dimensions where it can: a dimension is a known size (>= 0) or a
 * symbol (the graph inputs' dim_param names, "N" for the batch, one symbol per name; or a fresh
 * symbol for a size that depends on data or on rules not written here). Small INT64 vectors
 * (what Shape produces and exporters cut up with Gather/Slice/Concat/Unsqueeze/Squeeze/Cast)
 * also get their contents, symbols included. With that, at load:
 *   - a Shape chain whose value needs no symbol becomes a constant (the ordinary constant
 *     folding then folds its readers);
 *   - a Reshape whose target holds exactly one symbol (BERT exports: [N, S, 12, 64] built from
 *     Shape(x)[0]) gets a constant target with -1 there, which is the same reshape for every
 *     batch size, so the Shape/Gather/Unsqueeze/Concat chain is left without readers and is
 *     removed;
 *   - MatMul/Gemm inner dimensions and elementwise broadcasting are checked where both sides
 *     are known, a mismatch being a load error naming the node.
 * Rules are conservative: a dimension is known only when the operator's arithmetic gives it
 * exactly; anything else is a fresh symbol (equal to nothing), an unknown rank stops the
 * inference downstream, and nothing is folded from it.
 *
 * Threads: load time only. Memory: a temporary array per graph, freed before returning.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"

/* Symbols live far below any literal a shape vector may hold (-1, 0, sizes). */
#define SYM_BASE (-((int64_t)1 << 50))
#define IS_SYM(x) ((x) <= SYM_BASE)

typedef struct vshape {
    int32_t nd;                 /* -1: rank unknown */
    int64_t d[OX_MAX_DIMS];
    int32_t sn;                 /* contents of a small INT64 vector: -1 unknown */
    bool scalar;                /* sn == 1 and the value is 0-D */
    int64_t s[OX_MAX_DIMS];
} vshape_t;

typedef struct sctx {
    sp_ox_graph_t *g;
    vshape_t *v;
    int64_t next_sym;
    const char *names[64];      /* dim_param names, symbol SYM_BASE - i */
    int n_names;
    char *err;
    size_t err_len;
} sctx_t;

static int64_t
fresh(sctx_t *c)
{
    return c->next_sym--;
}

static int64_t
named(sctx_t *c, const char *name)
{
    for (int i = 0; i < c->n_names; i++) {
        if (strcmp(c->names[i], name) == 0) return SYM_BASE - i;
    }
    if (c->n_names == 64) return fresh(c);
    c->names[c->n_names] = name;
    return SYM_BASE - c->n_names++;
}

static void
dims_str(const vshape_t *s, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < s->nd && o < len; i++) {
        if (IS_SYM(s->d[i])) o += (size_t)snprintf(buf + o, len - o, "%s?", i ? ", " : "");
        else o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)s->d[i]);
    }
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* A constant's shape and, for a small integer vector, its values. */
static void
from_const(vshape_t *s, const sp_ox_tensor_t *t)
{
    s->nd = t->nd;
    for (int i = 0; i < t->nd; i++) s->d[i] = t->dims[i];
    s->sn = -1;
    int64_t n = sp_ox_numel(t);
    if ((t->dtype == OX_INT64 || t->dtype == OX_INT32) && t->nd <= 1 && n <= OX_MAX_DIMS && t->data) {
        s->sn = (int32_t)n;
        s->scalar = t->nd == 0;
        for (int64_t i = 0; i < n; i++) {
            s->s[i] = t->dtype == OX_INT64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
        }
    }
}

/* numpy broadcasting of a and b into o; -1 with the error when known sizes clash. */
static int
broadcast(sctx_t *c, const sp_ox_node_t *n, const vshape_t *a, const vshape_t *b, vshape_t *o)
{
    if (a->nd < 0 || b->nd < 0) return 0;
    int nd = a->nd > b->nd ? a->nd : b->nd;
    o->nd = nd;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->nd), ib = i - (nd - b->nd);
        int64_t x = ia >= 0 ? a->d[ia] : 1, y = ib >= 0 ? b->d[ib] : 1;
        if (x == y) o->d[i] = x;
        else if (x == 1) o->d[i] = y;
        else if (y == 1) o->d[i] = x;
        else if (!IS_SYM(x) && !IS_SYM(y)) {
            char s1[128], s2[128];
            dims_str(a, s1, sizeof s1);
            dims_str(b, s2, sizeof s2);
            snprintf(c->err, c->err_len, "%s: shapes %s and %s do not broadcast", n->label, s1, s2);
            return -1;
        } else if (!IS_SYM(x) || !IS_SYM(y)) {
            o->d[i] = IS_SYM(x) ? y : x; /* a symbol meeting a size > 1 must be that size */
        } else {
            o->d[i] = fresh(c);
        }
    }
    return 0;
}

static bool
is_op(const sp_ox_node_t *n, const char *name)
{
    return strcmp(n->op->name, name) == 0;
}

/* The constant integer input k of n (axes of opset 13 and later), or NULL. */
static const vshape_t *
const_ints(sctx_t *c, const sp_ox_node_t *n, int k)
{
    if (k >= n->n_in || n->in[k] < 0 || !c->g->values[n->in[k]].is_const) return NULL;
    const vshape_t *s = &c->v[n->in[k]];
    return s->sn >= 0 ? s : NULL;
}

static int
infer(sctx_t *c, const sp_ox_node_t *n)
{
    vshape_t *o = &c->v[n->out[0]];
    const vshape_t *x = n->n_in > 0 && n->in[0] >= 0 ? &c->v[n->in[0]] : NULL;
    if (x == NULL) return 0;
    for (int k = 1; k < n->n_in; k++) {
        if (n->in[k] < 0 && k < 2) return 0; /* an omitted second operand: nothing inferred */
    }
    static const char *const same[] = {
        "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "Gelu", "Erf", "HardSwish", "HardSigmoid",
        "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity", "Cast", "Softmax",
        "LogSoftmax", "BatchNormalization", "LayerNormalization", NULL};
    for (const char *const *s = same; *s; s++) {
        if (is_op(n, *s) && x) {
            o->nd = x->nd;
            memcpy(o->d, x->d, sizeof o->d);
            if ((is_op(n, "Identity") || (is_op(n, "Cast") && sp_ox_attr_i(n, "to", 0) == OX_INT64)) &&
                x->sn >= 0) {
                o->sn = x->sn;
                o->scalar = x->scalar;
                memcpy(o->s, x->s, sizeof o->s);
            }
            return 0;
        }
    }
    if ((is_op(n, "Add") || is_op(n, "Sub") || is_op(n, "Mul") || is_op(n, "Div") || is_op(n, "Pow")) &&
        n->n_in == 2 && n->in[1] >= 0) {
        return broadcast(c, n, x, &c->v[n->in[1]], o);
    }
    if (is_op(n, "MatMul")) {
        const vshape_t *b = &c->v[n->in[1]];
        if (x->nd < 2 || b->nd < 2) return 0;
        int64_t k = x->d[x->nd - 1], kb = b->d[b->nd - 2];
        if (k != kb && !IS_SYM(k) && !IS_SYM(kb)) {
            char s1[128], s2[128];
            dims_str(x, s1, sizeof s1);
            dims_str(b, s2, sizeof s2);
            snprintf(c->err, c->err_len, "%s: cannot multiply %s by %s", n->label, s1, s2);
            return -1;
        }
        vshape_t ba = *x, bb = *b;
        ba.nd -= 2;
        bb.nd -= 2;
        if (broadcast(c, n, &ba, &bb, o)) return -1;
        o->d[o->nd++] = x->d[x->nd - 2];
        o->d[o->nd++] = b->d[b->nd - 1];
        return 0;
    }
    if (is_op(n, "Gemm")) {
        const vshape_t *b = &c->v[n->in[1]];
        if (x->nd != 2 || b->nd != 2) return 0;
        int ta = sp_ox_attr_i(n, "transA", 0) != 0, tb = sp_ox_attr_i(n, "transB", 0) != 0;
        int64_t k = x->d[ta ? 0 : 1], kb = b->d[tb ? 1 : 0];
        if (k != kb && !IS_SYM(k) && !IS_SYM(kb)) {
            snprintf(c->err, c->err_len, "%s: A has K %lld, B %lld", n->label, (long long)k, (long long)kb);
            return -1;
        }
        o->nd = 2;
        o->d[0] = x->d[ta ? 1 : 0];
        o->d[1] = b->d[tb ? 0 : 1];
        return 0;
    }
    bool conv = is_op(n, "Conv"), pool = is_op(n, "MaxPool") || is_op(n, "AveragePool");
    bool global = is_op(n, "GlobalAveragePool") || is_op(n, "GlobalMaxPool");
    if ((conv || pool || global) && x->nd >= 3) {
        o->nd = x->nd;
        o->d[0] = x->d[0];
        o->d[1] = x->d[1];
        if (conv) {
            const vshape_t *w = &c->v[n->in[1]];
            o->d[1] = w->nd >= 1 ? w->d[0] : fresh(c);
        }
        /* Spatial sizes: the window arithmetic stays at run time (symbols here). */
        for (int i = 2; i < x->nd; i++) o->d[i] = global ? 1 : fresh(c);
        return 0;
    }
    if (is_op(n, "Flatten") && x->nd >= 0) {
        int64_t axis = sp_ox_attr_i(n, "axis", 1);
        if (axis < 0) axis += x->nd;
        if (axis < 0 || axis > x->nd) return 0;
        o->nd = 2;
        for (int part = 0; part < 2; part++) {
            int64_t p = 1;
            int syms = 0;
            int64_t sym = 0;
            for (int i = part ? (int)axis : 0; i < (part ? x->nd : axis); i++) {
                if (IS_SYM(x->d[i])) {
                    syms++;
                    sym = x->d[i];
                } else {
                    p *= x->d[i];
                }
            }
            o->d[part] = syms == 0 ? p : syms == 1 && p == 1 ? sym : fresh(c);
        }
        return 0;
    }
    if (is_op(n, "Transpose") && x->nd >= 0) {
        size_t np;
        const int64_t *perm = sp_ox_attr_ints(n, "perm", &np);
        if (perm && (int)np != x->nd) return 0;
        o->nd = x->nd;
        for (int i = 0; i < x->nd; i++) {
            int64_t p = perm ? perm[i] : x->nd - 1 - i;
            if (p < 0 || p >= x->nd) {
                o->nd = -1;
                return 0;
            }
            o->d[i] = x->d[p];
        }
        return 0;
    }
    if (is_op(n, "Reshape")) {
        const vshape_t *t = &c->v[n->in[1]];
        if (t->sn < 0 || t->scalar) return 0;
        bool allowzero = sp_ox_attr_i(n, "allowzero", 0) != 0;
        o->nd = t->sn;
        int minus = -1;
        for (int i = 0; i < t->sn; i++) {
            int64_t e = t->s[i];
            if (e == 0 && !allowzero) {
                if (x->nd < 0 || i >= x->nd) {
                    o->nd = -1;
                    return 0;
                }
                o->d[i] = x->d[i];
            } else if (e == -1) {
                minus = i;
                o->d[i] = fresh(c);
            } else {
                o->d[i] = e; /* a size or a symbol */
            }
        }
        /* -1 with everything else and the input known: the division, exactly. */
        if (minus >= 0 && x->nd >= 0) {
            int64_t in = 1, rest = 1;
            bool known = true;
            for (int i = 0; i < x->nd; i++) known = known && !IS_SYM(x->d[i]), in *= IS_SYM(x->d[i]) ? 1 : x->d[i];
            for (int i = 0; i < o->nd; i++) {
                if (i != minus) known = known && !IS_SYM(o->d[i]), rest *= IS_SYM(o->d[i]) ? 1 : o->d[i];
            }
            if (known && rest > 0 && in % rest == 0) o->d[minus] = in / rest;
        }
        return 0;
    }
    if (is_op(n, "Shape") && x->nd >= 0) {
        int64_t nd = x->nd, s = sp_ox_attr_i(n, "start", 0), e = sp_ox_attr_i(n, "end", nd);
        if (s < 0) s += nd;
        if (e < 0) e += nd;
        s = s < 0 ? 0 : s > nd ? nd : s;
        e = e < 0 ? 0 : e > nd ? nd : e;
        int64_t len = e > s ? e - s : 0;
        o->nd = 1;
        o->d[0] = len;
        o->sn = (int32_t)len;
        o->scalar = false;
        for (int64_t i = 0; i < len; i++) o->s[i] = x->d[s + i];
        return 0;
    }
    if (is_op(n, "Gather") && x->nd >= 1) {
        const vshape_t *idx = &c->v[n->in[1]];
        int64_t axis = sp_ox_attr_i(n, "axis", 0);
        if (axis < 0) axis += x->nd;
        if (axis < 0 || axis >= x->nd || idx->nd < 0 || x->nd - 1 + idx->nd > OX_MAX_DIMS) return 0;
        o->nd = 0;
        for (int i = 0; i < axis; i++) o->d[o->nd++] = x->d[i];
        for (int i = 0; i < idx->nd; i++) o->d[o->nd++] = idx->d[i];
        for (int i = (int)axis + 1; i < x->nd; i++) o->d[o->nd++] = x->d[i];
        const vshape_t *ci = const_ints(c, n, 1);
        if (x->sn >= 0 && !x->scalar && axis == 0 && ci) {
            for (int i = 0; i < ci->sn; i++) {
                int64_t k = ci->s[i] < 0 ? ci->s[i] + x->sn : ci->s[i];
                if (k < 0 || k >= x->sn) return 0;
                o->s[i] = x->s[k];
            }
            o->sn = ci->sn;
            o->scalar = ci->scalar;
        }
        return 0;
    }
    if (is_op(n, "Unsqueeze") || is_op(n, "Squeeze")) {
        size_t na = 0;
        const int64_t *axes = sp_ox_attr_ints(n, "axes", &na);
        const vshape_t *ca = const_ints(c, n, 1);
        if (ca) {
            axes = ca->s;
            na = (size_t)ca->sn;
        }
        if (x->nd < 0 || axes == NULL || na == 0) return 0;
        bool unsq = is_op(n, "Unsqueeze");
        int ond = unsq ? x->nd + (int)na : x->nd - (int)na;
        if (ond < 0 || ond > OX_MAX_DIMS) return 0;
        bool mark[OX_MAX_DIMS] = {false};
        for (size_t i = 0; i < na; i++) {
            int64_t a = axes[i] < 0 ? axes[i] + (unsq ? ond : x->nd) : axes[i];
            if (a < 0 || a >= (unsq ? ond : x->nd) || mark[a]) return 0;
            mark[a] = true;
        }
        o->nd = ond;
        for (int i = 0, j = 0; i < (unsq ? ond : x->nd); i++) {
            if (unsq) o->d[i] = mark[i] ? 1 : x->d[j++];
            else if (!mark[i]) o->d[j++] = x->d[i];
        }
        if (x->sn >= 0) { /* a scalar to a 1-vector or back */
            if (unsq && x->scalar && ond == 1) {
                o->sn = 1;
                o->s[0] = x->s[0];
            } else if (!unsq && !x->scalar && x->sn == 1 && ond == 0) {
                o->sn = 1;
                o->scalar = true;
                o->s[0] = x->s[0];
            }
        }
        return 0;
    }
    if (is_op(n, "Concat")) {
        int64_t axis = sp_ox_attr_i(n, "axis", 0);
        int nd = x->nd;
        if (nd < 1) return 0;
        if (axis < 0) axis += nd;
        if (axis < 0 || axis >= nd) return 0;
        vshape_t r = *x;
        r.sn = -1;
        bool vec = nd == 1;
        int32_t sn = 0;
        int64_t sv[OX_MAX_DIMS];
        for (int k = 0; k < n->n_in; k++) {
            const vshape_t *a = &c->v[n->in[k]];
            if (a->nd != nd) return 0;
            if (k > 0) {
                int64_t x1 = r.d[axis], x2 = a->d[axis];
                r.d[axis] = IS_SYM(x1) || IS_SYM(x2) ? fresh(c) : x1 + x2;
            }
            if (vec && a->sn >= 0 && !a->scalar && sn + a->sn <= OX_MAX_DIMS) {
                memcpy(sv + sn, a->s, (size_t)a->sn * sizeof *sv);
                sn += a->sn;
            } else {
                vec = false;
            }
        }
        *o = r;
        if (vec) {
            o->sn = sn;
            o->scalar = false;
            memcpy(o->s, sv, sizeof sv);
        }
        return 0;
    }
    if (is_op(n, "Slice") && x->nd >= 0) {
        o->nd = x->nd;
        for (int i = 0; i < x->nd; i++) o->d[i] = fresh(c);
        /* A slice of a shape vector (opset 10 and later: inputs), steps 1. */
        const vshape_t *st = const_ints(c, n, 1), *en = const_ints(c, n, 2);
        const vshape_t *ax = const_ints(c, n, 3), *sp = const_ints(c, n, 4);
        bool plain = (n->n_in < 4 || n->in[3] < 0 || (ax && ax->sn == 1 && ax->s[0] == 0)) &&
                     (n->n_in < 5 || n->in[4] < 0 || (sp && sp->sn == 1 && sp->s[0] == 1));
        if (x->sn >= 0 && !x->scalar && st && en && st->sn == 1 && en->sn == 1 && plain) {
            int64_t len = x->sn, b = st->s[0], e = en->s[0];
            if (b < 0) b += len;
            if (e < 0) e += len;
            b = b < 0 ? 0 : b > len ? len : b;
            e = e < 0 ? 0 : e > len ? len : e;
            o->sn = e > b ? (int32_t)(e - b) : 0;
            o->scalar = false;
            for (int i = 0; i < o->sn; i++) o->s[i] = x->s[b + i];
            o->d[0] = o->sn;
        }
        return 0;
    }
    if ((is_op(n, "ReduceMean") || is_op(n, "ReduceSum") || is_op(n, "ReduceMax")) && x->nd >= 0) {
        size_t na = 0;
        const int64_t *axes = sp_ox_attr_ints(n, "axes", &na);
        const vshape_t *ca = const_ints(c, n, 1);
        if (ca) {
            axes = ca->s;
            na = (size_t)ca->sn;
        }
        bool keep = sp_ox_attr_i(n, "keepdims", 1) != 0;
        if (n->n_in > 1 && n->in[1] >= 0 && ca == NULL) return 0; /* axes known per call */
        if (na == 0 && sp_ox_attr_i(n, "noop_with_empty_axes", 0)) {
            o->nd = x->nd;
            memcpy(o->d, x->d, sizeof o->d);
            return 0;
        }
        bool mark[OX_MAX_DIMS] = {false};
        for (size_t i = 0; i < na; i++) {
            int64_t a = axes[i] < 0 ? axes[i] + x->nd : axes[i];
            if (a < 0 || a >= x->nd) return 0;
            mark[a] = true;
        }
        o->nd = 0;
        for (int i = 0; i < x->nd; i++) {
            bool red = na == 0 || mark[i];
            if (!red) o->d[o->nd++] = x->d[i];
            else if (keep) o->d[o->nd++] = 1;
        }
        return 0;
    }
    return 0; /* not inferred: rank unknown */
}

/* Make value v a constant INT64 tensor holding s's contents. */
static int
make_const(sp_ox_graph_t *g, sp_ox_value_t *v, const vshape_t *s)
{
    sp_ox_tensor_t t = {0};
    t.dtype = OX_INT64;
    t.nd = s->scalar ? 0 : 1;
    t.dims[0] = s->sn;
    t.data = sp_ox_aligned_alloc(sizeof(int64_t) * (size_t)(s->sn ? s->sn : 1));
    if (t.data == NULL) return -1;
    t.cap = sizeof(int64_t) * (size_t)(s->sn ? s->sn : 1);
    memcpy(t.data, s->s, sizeof(int64_t) * (size_t)s->sn);
    v->t = t;
    v->is_const = true;
    g->const_bytes += t.cap;
    return 0;
}

int
sp_ox_infer_shapes(sp_ox_graph_t *g, char *err, size_t err_len)
{
    sctx_t c = {.g = g, .next_sym = SYM_BASE - 64, .err = err, .err_len = err_len};
    /* Room for the Reshape targets added below (at most one per node). */
    c.v = calloc((size_t)g->n_values + (size_t)g->n_nodes + 1, sizeof *c.v);
    if (c.v == NULL) {
        snprintf(err, err_len, "out of memory inferring shapes");
        return -1;
    }
    int rc = -1;
    for (int32_t i = 0; i < g->n_values; i++) {
        c.v[i].nd = -1;
        c.v[i].sn = -1;
        if (g->values[i].is_const) from_const(&c.v[i], &g->values[i].t);
    }
    /* The fed inputs: their declared shapes, dim_param names as symbols. */
    const Onnx__GraphProto *gp = g->proto->graph;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        int32_t vi = g->inputs[k];
        for (size_t i = 0; i < gp->n_input; i++) {
            const Onnx__ValueInfoProto *in = gp->input[i];
            if (strcmp(in->name, g->values[vi].name) != 0 || in->type == NULL ||
                in->type->tensor_type == NULL || in->type->tensor_type->shape == NULL) {
                continue;
            }
            const Onnx__TensorShapeProto *sh = in->type->tensor_type->shape;
            c.v[vi].nd = (int32_t)sh->n_dim;
            for (size_t d = 0; d < sh->n_dim && d < OX_MAX_DIMS; d++) {
                const Onnx__TensorShapeProto__Dimension *dm = sh->dim[d];
                if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dm->dim_value >= 0) {
                    c.v[vi].d[d] = dm->dim_value;
                } else if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                           dm->dim_param && *dm->dim_param) {
                    c.v[vi].d[d] = named(&c, dm->dim_param);
                } else {
                    c.v[vi].d[d] = fresh(&c);
                }
            }
        }
    }
    int n_rewritten = 0;
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        if (n->dead) continue;
        bool outs_const = true;
        for (int k = 0; k < n->n_out; k++) outs_const = outs_const && g->values[n->out[k]].is_const;
        if (outs_const) continue;
        if (n->n_out < 1 || infer(&c, n)) goto done;
        vshape_t *s = &c.v[n->out[0]];
        sp_ox_value_t *ov = &g->values[n->out[0]];
        /* A shape vector known whole: a constant from here on (its readers fold). */
        if (s->sn >= 0 && n->n_out == 1 && !ov->is_output) {
            bool known = true;
            for (int i = 0; i < s->sn; i++) known = known && !IS_SYM(s->s[i]);
            if (known && (is_op(n, "Shape") || is_op(n, "Gather") || is_op(n, "Concat") ||
                          is_op(n, "Slice") || is_op(n, "Unsqueeze") || is_op(n, "Squeeze") ||
                          is_op(n, "Cast") || is_op(n, "Identity"))) {
                if (make_const(g, ov, s)) {
                    snprintf(err, err_len, "out of memory folding shapes");
                    goto done;
                }
                n->dead = true;
                g->n_folded++;
                continue;
            }
        }
        /* Reshape to a target with one symbol (and no 0 or -1): -1 there instead. */
        if (is_op(n, "Reshape") && !g->values[n->in[1]].is_const) {
            const vshape_t *t = &c.v[n->in[1]];
            int syms = 0, at = -1;
            bool plain = t->sn > 0 && !t->scalar;
            for (int i = 0; plain && i < t->sn; i++) {
                if (IS_SYM(t->s[i])) syms++, at = i;
                else if (t->s[i] <= 0) plain = false;
            }
            if (plain && syms == 1) {
                vshape_t tt = *t;
                tt.s[at] = -1;
                int32_t nv = g->n_values++;
                sp_ox_value_t *v = &g->values[nv];
                memset(v, 0, sizeof *v);
                v->name = "";
                v->last_use = -1;
                if (make_const(g, v, &tt)) {
                    g->n_values--;
                    snprintf(err, err_len, "out of memory folding shapes");
                    goto done;
                }
                n->in[1] = nv;
                n_rewritten++;
            }
        }
    }
    g->n_folded += n_rewritten;
    rc = 0;
done:
    free(c.v);
    return rc;
}
