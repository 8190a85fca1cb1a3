/*
 * backends/onnx/graph.c - preparing a loaded graph and running it.
 *
 * Prepare: nodes in topological order (a cycle is a load error), constant
 * folding (every node whose inputs are all constants runs once at load and
 * its outputs become constants: the Shape/Gather/Concat/Unsqueeze chains
 * of exported models over initializers), fusion (Conv+BatchNormalization
 * folded into the convolution's weights and bias, Conv/Gemm/MatMul+Relu,
 * MatMul+Add of a [N] bias computed as one GEMM with bias), then liveness:
 * for each value the last node that reads it.
 * Run: nodes in order. The first run at a set of input shapes takes each
 * output from the instance's buffer pool (back to it right after its last
 * reader ran) and records the sizes; later runs at those shapes give each
 * activation its offset in one arena (plan.c). Either way the element type
 * a node computes must be the one inferred at load (dtype.c).
 *
 * Threads: a run context belongs to one instance (never two runs at once).
 * Memory: pool buffers are kept between runs and freed by sp_ox_run_free.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dnnl.h"
#include "ox.h"

int64_t
sp_ox_numel(const sp_ox_tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->nd; i++) n *= t->dims[i];
    return n;
}

void
sp_ox_shape_str(const int64_t *dims, int nd, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < nd && o < len; i++) {
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)dims[i]);
    }
    if (o < len) snprintf(buf + o, len - o, "]");
}

int
sp_ox_fail(sp_ox_run_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->err_len, fmt, ap);
    va_end(ap);
    return -1;
}

/* The value whose tensor t is (-1: a temporary of an operator). */
static int32_t
value_of(const sp_ox_run_t *r, const sp_ox_tensor_t *t)
{
    const sp_ox_graph_t *g = r->g;
    uintptr_t base = (uintptr_t)&g->values[0].t, p = (uintptr_t)t;
    if (g->n_values == 0 || p < base) return -1;
    uintptr_t k = (p - base) / sizeof(sp_ox_value_t);
    if (k >= (uintptr_t)g->n_values || &g->values[k].t != t) return -1;
    return (int32_t)k;
}

static bool
in_arena(const sp_ox_run_t *r, const void *p)
{
    uintptr_t a = (uintptr_t)r->arena, q = (uintptr_t)p;
    return r->arena && q >= a && q < a + r->arena_cap;
}

int
sp_ox_out(sp_ox_run_t *r, sp_ox_tensor_t *t, int32_t dtype, int32_t nd, const int64_t *dims)
{
    if (nd < 0 || nd > OX_MAX_DIMS) return sp_ox_fail(r, "result of %d dimensions", nd);
    int64_t n = 1, max = r->g->max_numel;
    for (int i = 0; i < nd; i++) {
        if (dims[i] < 0 || dims[i] > max) {
            return sp_ox_fail(r, "result dimension %d is %lld", i, (long long)dims[i]);
        }
        n *= dims[i];
        if (n > max) return sp_ox_fail(r, "result of more than %lld elements", (long long)max);
    }
    size_t bytes = (size_t)n * sp_ox_dtype_size(dtype);
    if (t->data) sp_ox_pool_put(r, t);
    int32_t v = r->plan || r->rec ? value_of(r, t) : -1;
    if (v >= 0 && r->rec) {
        if (bytes > r->rec[v]) r->rec[v] = bytes;
        if (r->rec_first[v] == 0) r->rec_first[v] = r->at + 1;
    } else if (v >= 0 && r->plan->size[v] >= bytes && r->handed[v] != (uint32_t)r->runs) {
        /* The value's slot in the arena (once per run: a second result for the same value,
         * while the first may still be read, comes from the pool). */
        r->handed[v] = (uint32_t)r->runs;
        t->data = (char *)r->arena + r->plan->off[v];
        t->cap = r->plan->size[v];
        goto set;
    }
    int32_t best = -1;
    for (int32_t i = 0; i < r->n_free; i++) {
        if (r->free_bufs[i].cap >= bytes && (best < 0 || r->free_bufs[i].cap < r->free_bufs[best].cap)) {
            best = i;
        }
    }
    if (best >= 0) {
        t->data = r->free_bufs[best].data;
        t->cap = r->free_bufs[best].cap;
        r->free_bufs[best] = r->free_bufs[--r->n_free];
    } else {
        t->data = sp_ox_aligned_alloc(bytes);
        t->cap = (bytes + 63) / 64 * 64;
        if (t->data == NULL) return sp_ox_fail(r, "out of memory for %zu bytes", bytes);
    }
set:
    t->dtype = dtype;
    t->nd = nd;
    for (int i = 0; i < nd; i++) t->dims[i] = dims[i];
    return 0;
}

void
sp_ox_pool_put(sp_ox_run_t *r, sp_ox_tensor_t *t)
{
    if (t->data == NULL) return;
    if (in_arena(r, t->data)) {
        /* an arena slot: nothing to give back */
        t->data = NULL;
        t->cap = 0;
        return;
    }
    if (r->n_free == r->cap_free) {
        int32_t c = r->cap_free ? r->cap_free * 2 : 32;
        sp_ox_buf_t *nb = realloc(r->free_bufs, (size_t)c * sizeof *nb);
        if (nb == NULL) {
            free(t->data); /* cannot keep it: give it back to the system */
            t->data = NULL;
            return;
        }
        r->free_bufs = nb;
        r->cap_free = c;
    }
    r->free_bufs[r->n_free].data = t->data;
    r->free_bufs[r->n_free].cap = t->cap;
    r->n_free++;
    t->data = NULL;
    t->cap = 0;
}

void *
sp_ox_scratch(sp_ox_run_t *r, size_t bytes)
{
    if (bytes > r->scratch_cap) {
        free(r->scratch);
        r->scratch = sp_ox_aligned_alloc(bytes);
        r->scratch_cap = r->scratch ? bytes : 0;
        if (r->scratch == NULL) sp_ox_fail(r, "out of memory for %zu bytes of scratch", bytes);
    }
    return r->scratch;
}

void
sp_ox_run_free(sp_ox_run_t *r)
{
    sp_ox_dnnl_free(r);
    for (int32_t i = 0; i < r->n_free; i++) free(r->free_bufs[i].data);
    free(r->free_bufs);
    free(r->scratch);
    for (int32_t i = 0; i < r->n_plans; i++) {
        free(r->plans[i].off);
        free(r->plans[i].size);
        free(r->plans[i].alias);
    }
    free(r->rec);
    free(r->rec_first);
    free(r->rec_alias);
    free(r->handed);
    free(r->arena);
    memset(r, 0, sizeof *r);
}

const Onnx__AttributeProto *
sp_ox_attr(const sp_ox_node_t *n, const char *name)
{
    for (size_t i = 0; i < n->p->n_attribute; i++) {
        const Onnx__AttributeProto *a = n->p->attribute[i];
        if (a->name && strcmp(a->name, name) == 0) return a;
    }
    return NULL;
}

int64_t
sp_ox_attr_i(const sp_ox_node_t *n, const char *name, int64_t def)
{
    const Onnx__AttributeProto *a = sp_ox_attr(n, name);
    return a ? a->i : def;
}

float
sp_ox_attr_f(const sp_ox_node_t *n, const char *name, float def)
{
    const Onnx__AttributeProto *a = sp_ox_attr(n, name);
    return a ? a->f : def;
}

const char *
sp_ox_attr_s(const sp_ox_node_t *n, const char *name, const char *def)
{
    const Onnx__AttributeProto *a = sp_ox_attr(n, name);
    if (a == NULL || !a->has_s) return def;
    /* Strings are bytes in the proto: only NUL-free ones are compared. */
    if (memchr(a->s.data, 0, a->s.len) != NULL || a->s.len > 64) return "?";
    static _Thread_local char buf[72];
    memcpy(buf, a->s.data, a->s.len);
    buf[a->s.len] = 0;
    return buf;
}

const int64_t *
sp_ox_attr_ints(const sp_ox_node_t *n, const char *name, size_t *n_out)
{
    const Onnx__AttributeProto *a = sp_ox_attr(n, name);
    *n_out = a ? a->n_ints : 0;
    return a ? a->ints : NULL;
}

int
sp_ox_tensor_ints(sp_ox_run_t *r, const sp_ox_tensor_t *t, int64_t *vals, int64_t max, int64_t *n)
{
    int64_t k = sp_ox_numel(t);
    if (k > max) return sp_ox_fail(r, "%lld values where at most %lld are expected", (long long)k, (long long)max);
    if (t->dtype != OX_INT64 && t->dtype != OX_INT32) {
        return sp_ox_fail(r, "%s tensor where INT64 values are expected", sp_ox_dtype_name(t->dtype));
    }
    for (int64_t i = 0; i < k; i++) {
        vals[i] = t->dtype == OX_INT64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
    }
    *n = k;
    return 0;
}

/* ---- prepare ---- */

int
sp_ox_run_node_own(sp_ox_run_t *r, sp_ox_node_t *n)
{
    sp_ox_graph_t *g = r->g;
    const sp_ox_tensor_t *in[OX_MAX_IO];
    sp_ox_tensor_t *out[OX_MAX_IO];
    for (int k = 0; k < n->n_in; k++) {
        in[k] = n->in[k] >= 0 ? &g->values[n->in[k]].t : NULL;
        if (in[k] && in[k]->data == NULL) {
            return sp_ox_fail(r, "input '%.60s' has no value", g->values[n->in[k]].name);
        }
    }
    if (n->fused_add >= 0 && g->values[n->fused_add].t.data == NULL) {
        return sp_ox_fail(r, "input '%.60s' has no value", g->values[n->fused_add].name);
    }
    for (int k = 0; k < n->n_out; k++) out[k] = &g->values[n->out[k]].t;
    r->node = n;
    return n->op->run(r, n, in, n->n_in, out, n->n_out);
}

int
sp_ox_fused_add(sp_ox_run_t *r, const sp_ox_node_t *n, sp_ox_tensor_t *out)
{
    const sp_ox_tensor_t *y = &r->g->values[n->fused_add].t;
    bool same = y->dtype == out->dtype && y->nd == out->nd;
    for (int i = 0; same && i < y->nd; i++) same = y->dims[i] == out->dims[i];
    float *o = out->data;
    int64_t cnt = sp_ox_numel(out);
    if (same) {
        const float *yd = y->data;
        for (int64_t i = 0; i < cnt; i++) o[i] += yd[i];
    } else {
        /* A broadcasting Add: the fused-away node runs on its own, inputs in its order. */
        sp_ox_node_t *add = &r->g->nodes[n->fused_add_node];
        sp_ox_tensor_t conv = *out;
        out->data = NULL;
        out->cap = 0;
        const sp_ox_tensor_t *in[2] = {&conv, y};
        if (add->in[0] == n->fused_add) {
            in[0] = y;
            in[1] = &conv;
        }
        sp_ox_tensor_t *outs[1] = {out};
        int rc = add->op->run(r, add, in, 2, outs, 1);
        sp_ox_pool_put(r, &conv);
        if (rc) return -1;
        o = out->data;
        cnt = sp_ox_numel(out);
    }
    if (n->fused_relu) {
        for (int64_t i = 0; i < cnt; i++) o[i] = fmaxf(o[i], 0.0f);
    }
    return 0;
}

static int
topo_sort(sp_ox_graph_t *g, char *err, size_t err_len)
{
    int32_t *producer = malloc((size_t)g->n_values * sizeof *producer);
    int32_t *pending = calloc((size_t)g->n_nodes + 1, sizeof *pending);
    int32_t *stack = malloc(((size_t)g->n_nodes + 1) * sizeof *stack);
    /* consumers as a CSR list: for each value, the nodes reading it */
    int32_t *cstart = calloc((size_t)g->n_values + 1, sizeof *cstart);
    int64_t n_edges = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) n_edges += g->nodes[i].n_in;
    int32_t *cnode = malloc(((size_t)n_edges + 1) * sizeof *cnode);
    g->order = malloc(((size_t)g->n_nodes + 1) * sizeof *g->order);
    int rc = -1;
    if (!producer || !pending || !stack || !cstart || !cnode || !g->order) {
        snprintf(err, err_len, "out of memory ordering the graph");
        goto done;
    }
    for (int32_t v = 0; v < g->n_values; v++) producer[v] = -1;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        for (int k = 0; k < g->nodes[i].n_out; k++) producer[g->nodes[i].out[k]] = i;
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t v = g->nodes[i].in[k];
            if (v >= 0 && producer[v] >= 0) {
                pending[i]++;
                cstart[v + 1]++;
            }
        }
    }
    for (int32_t v = 0; v < g->n_values; v++) cstart[v + 1] += cstart[v];
    int32_t *fill = calloc((size_t)g->n_values + 1, sizeof *fill);
    if (fill == NULL) {
        snprintf(err, err_len, "out of memory ordering the graph");
        goto done;
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t v = g->nodes[i].in[k];
            if (v >= 0 && producer[v] >= 0) cnode[cstart[v] + fill[v]++] = i;
        }
    }
    free(fill);
    int32_t sp = 0;
    /* Ready nodes in file order first, so that the order stays close to the file's. */
    for (int32_t i = g->n_nodes - 1; i >= 0; i--) {
        if (pending[i] == 0) stack[sp++] = i;
    }
    g->n_order = 0;
    while (sp > 0) {
        int32_t i = stack[--sp];
        g->order[g->n_order++] = i;
        for (int k = 0; k < g->nodes[i].n_out; k++) {
            int32_t v = g->nodes[i].out[k];
            for (int32_t e = cstart[v]; e < cstart[v + 1]; e++) {
                if (--pending[cnode[e]] == 0) stack[sp++] = cnode[e];
            }
        }
    }
    if (g->n_order != g->n_nodes) {
        for (int32_t i = 0; i < g->n_nodes; i++) {
            if (pending[i] > 0) {
                snprintf(err, err_len, "%s is part of a cycle", g->nodes[i].label);
                break;
            }
        }
        goto done;
    }
    rc = 0;
done:
    free(producer);
    free(pending);
    free(stack);
    free(cstart);
    free(cnode);
    return rc;
}

static bool
is_float_const(const sp_ox_graph_t *g, int32_t v)
{
    return v >= 0 && g->values[v].is_const && g->values[v].t.dtype == OX_FLOAT;
}

/* Readers of every value among the live nodes (+1 for a graph output). */
static int32_t *
count_uses(const sp_ox_graph_t *g)
{
    int32_t *uses = calloc((size_t)g->n_values + 1, sizeof *uses);
    if (uses == NULL) return NULL;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const sp_ox_node_t *n = &g->nodes[i];
        if (n->dead) continue;
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] >= 0) uses[n->in[k]]++;
        }
        if (n->fused_add >= 0) uses[n->fused_add]++;
    }
    for (int32_t i = 0; i < g->n_outputs; i++) uses[g->outputs[i]]++;
    return uses;
}

/* The live node reading value v (when it has exactly one reader). */
static sp_ox_node_t *
sole_reader(sp_ox_graph_t *g, const int32_t *uses, int32_t v)
{
    if (uses[v] != 1 || g->values[v].is_output) return NULL;
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        if (n->dead) continue;
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] == v) return n;
        }
    }
    return NULL;
}

/* Conv followed by inference BatchNormalization with constant parameters:
 * y = (conv(x, W) + b - mean) * scale / sqrt(var + eps) + beta, which is a
 * convolution with W' = W * s and b' = (b - mean) * s + beta, s = scale /
 * sqrt(var + eps) per output channel. */
static bool
fuse_conv_bn(sp_ox_graph_t *g, sp_ox_node_t *c, sp_ox_node_t *bn, const int32_t *uses)
{
    if (bn->n_out != 1 || c->fused_relu || !is_float_const(g, c->in[1]) || uses[c->in[1]] != 1) {
        return false;
    }
    if (c->n_in > 2 && c->in[2] >= 0 && (!is_float_const(g, c->in[2]) || uses[c->in[2]] != 1)) {
        return false;
    }
    for (int k = 1; k < 5; k++) {
        if (!is_float_const(g, bn->in[k])) return false;
    }
    sp_ox_tensor_t *w = &g->values[c->in[1]].t;
    int64_t oc = w->dims[0];
    for (int k = 1; k < 5; k++) {
        if (sp_ox_numel(&g->values[bn->in[k]].t) != oc) return false;
    }
    const float *scale = g->values[bn->in[1]].t.data, *beta = g->values[bn->in[2]].t.data;
    const float *mean = g->values[bn->in[3]].t.data, *var = g->values[bn->in[4]].t.data;
    float eps = sp_ox_attr_f(bn, "epsilon", 1e-5f);
    int32_t bv;
    if (c->n_in > 2 && c->in[2] >= 0) {
        bv = c->in[2];
    } else {
        bv = g->n_values++;
        sp_ox_value_t *v = &g->values[bv];
        v->name = "";
        v->is_const = true;
        v->last_use = -1;
        v->t.dtype = OX_FLOAT;
        v->t.nd = 1;
        v->t.dims[0] = oc;
        v->t.data = sp_ox_aligned_alloc((size_t)oc * sizeof(float));
        v->t.cap = (size_t)oc * sizeof(float);
        if (v->t.data == NULL) {
            g->n_values--;
            return false;
        }
        memset(v->t.data, 0, (size_t)oc * sizeof(float));
        c->in[2] = bv;
        c->n_in = 3;
    }
    float *b = g->values[bv].t.data, *wd = w->data;
    int64_t per = oc ? sp_ox_numel(w) / oc : 0;
    for (int64_t o = 0; o < oc; o++) {
        float s = scale[o] / sqrtf(var[o] + eps);
        for (int64_t i = 0; i < per; i++) wd[o * per + i] *= s;
        b[o] = (b[o] - mean[o]) * s + beta[o];
    }
    c->out[0] = bn->out[0];
    bn->dead = true;
    return true;
}

/* Whether value v is set before the node at order position o runs: a graph input, or the
 * output of a live node earlier in the order. */
static bool
ready_before(const sp_ox_graph_t *g, int32_t v, int32_t o)
{
    if (g->values[v].is_input) return true;
    for (int32_t p = 0; p < o; p++) {
        const sp_ox_node_t *m = &g->nodes[g->order[p]];
        if (m->dead) continue;
        for (int k = 0; k < m->n_out; k++) {
            if (m->out[k] == v) return true;
        }
    }
    return false;
}

static int
fold_consts(sp_ox_graph_t *g, char *err, size_t err_len)
{
    sp_ox_run_t r = {0};
    r.g = g;
    r.err = err;
    r.err_len = err_len;
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        if (n->dead) continue; /* fused away before folding (qdq.c) */
        bool all_const = true;
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] >= 0 && !g->values[n->in[k]].is_const) all_const = false;
        }
        if (!all_const) continue;
        if (sp_ox_run_node_own(&r, n)) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s", err);
            snprintf(err, err_len, "%s: %s", n->label, tmp);
            sp_ox_run_free(&r);
            return -1;
        }
        for (int k = 0; k < n->n_out; k++) {
            sp_ox_value_t *v = &g->values[n->out[k]];
            if (v->etype && v->t.dtype != v->etype) {
                snprintf(err, err_len, "%s: output %d is %s where %s was inferred", n->label, k,
                         sp_ox_dtype_name(v->t.dtype), sp_ox_dtype_name(v->etype));
                sp_ox_run_free(&r);
                return -1;
            }
            v->is_const = true;
            g->const_bytes += v->t.cap;
        }
        n->dead = true;
        g->n_folded++;
    }
    sp_ox_run_free(&r);
    return 0;
}

/* Nodes none of whose outputs is read (by a live node or as a graph output), until none is
 * left: what shape inference leaves of Shape chains. */
static int
remove_unread(sp_ox_graph_t *g, char *err, size_t err_len)
{
    for (bool changed = true; changed;) {
        changed = false;
        int32_t *uses = count_uses(g);
        if (uses == NULL) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        for (int32_t o = g->n_order - 1; o >= 0; o--) {
            sp_ox_node_t *n = &g->nodes[g->order[o]];
            if (n->dead) continue;
            bool read = false;
            for (int k = 0; k < n->n_out; k++) read = read || uses[n->out[k]] > 0;
            if (read) continue;
            n->dead = true;
            changed = true;
            for (int k = 0; k < n->n_in; k++) {
                if (n->in[k] >= 0) uses[n->in[k]]--;
            }
            if (n->fused_add >= 0) uses[n->fused_add]--;
        }
        free(uses);
    }
    return 0;
}

/* One more fusion done: the count, and the use counts again (NULL when memory ran out). */
static bool
fused(sp_ox_graph_t *g, int32_t **uses)
{
    g->n_fused++;
    free(*uses);
    *uses = count_uses(g);
    return *uses != NULL;
}

/* n takes over next's output and next no longer runs (fused into n). */
static void
absorb(sp_ox_node_t *n, sp_ox_node_t *next)
{
    n->out[0] = next->out[0];
    next->dead = true;
}

/* The order position (after o) of the live QDQConv with an output Q -> DQ pair (qdq.c) making
 * v, else -1. */
static int32_t
qout_producer_at(const sp_ox_graph_t *g, int32_t v, int32_t o)
{
    for (int32_t p = o + 1; p < g->n_order; p++) {
        const sp_ox_node_t *m = &g->nodes[g->order[p]];
        if (m->dead || m->n_out != 1 || m->out[0] != v) continue;
        bool q = strcmp(m->op->name, "QDQConv") == 0 && ((const float *)g->values[m->in[3]].t.data)[8] > 0.0f;
        return q ? p : -1;
    }
    return -1;
}

static int
fold_and_fuse(sp_ox_graph_t *g, char *err, size_t err_len)
{
    if (fold_consts(g, err, err_len) || sp_ox_infer_shapes(g, err, err_len) || fold_consts(g, err, err_len)) {
        return -1;
    }
    int32_t *uses = count_uses(g);
    if (uses == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        if (n->dead) continue;
        const char *t = n->op->name;
        bool conv = strcmp(t, "Conv") == 0, mm = strcmp(t, "MatMul") == 0;
        if (conv) {
            sp_ox_node_t *next = sole_reader(g, uses, n->out[0]);
            if (next && strcmp(next->op->name, "BatchNormalization") == 0 && next->in[0] == n->out[0] &&
                fuse_conv_bn(g, n, next, uses)) {
                if (!fused(g, &uses)) break;
            }
        }
        /* qdq.c's fused INT8 convolution takes the residual Add the same way (its Relu, when it
         * had one right after it, is already inside: then no Add is fused). */
        bool qconv = strcmp(t, "QDQConv") == 0;
        /* (not one with an output Q -> DQ pair: that rounding comes before the Add) */
        bool qout = qconv && ((const float *)g->values[n->in[3]].t.data)[8] > 0.0f;
        if ((conv || qconv) && !qout && !g->keep_residual_add && !n->fused_relu && n->fused_add < 0 &&
            n->n_out == 1) {
            sp_ox_node_t *next = sole_reader(g, uses, n->out[0]);
            if (next && strcmp(next->op->name, "Add") == 0 && next->n_in == 2 && next->n_out == 1 &&
                next->in[0] != next->in[1]) {
                int32_t y = next->in[0] == n->out[0] ? next->in[1] : next->in[0];
                int32_t q = qconv && y >= 0 ? qout_producer_at(g, y, o) : -1;
                if (q > o) {
                    /* The other branch ends in an output pair (sampan optimize's projection
                     * residual) and comes later in the order: this convolution runs after it
                     * instead (its inputs are ready earlier, its only reader is the Add, after
                     * both), and is fused when the loop reaches it there. */
                    int32_t me = g->order[o];
                    memmove(g->order + o, g->order + o + 1, (size_t)(q - o) * sizeof *g->order);
                    g->order[q] = me;
                    o--;
                    continue;
                }
                if (y >= 0 && !g->values[y].is_const && ready_before(g, y, o)) {
                    n->fused_add = y;
                    n->fused_add_node = (int32_t)(next - g->nodes);
                    absorb(n, next);
                    if (!fused(g, &uses)) break;
                }
            }
        }
        if (mm && n->fused_bias < 0 && !n->fused_relu && g->values[n->in[1]].is_const &&
            g->values[n->in[1]].t.nd == 2 && g->values[n->in[1]].t.dtype == OX_FLOAT) {
            sp_ox_node_t *next = sole_reader(g, uses, n->out[0]);
            if (next && strcmp(next->op->name, "Add") == 0) {
                int32_t other = next->in[0] == n->out[0] ? next->in[1] : next->in[0];
                const sp_ox_tensor_t *bt = is_float_const(g, other) ? &g->values[other].t : NULL;
                if (bt && bt->nd == 1 && bt->dims[0] == g->values[n->in[1]].t.dims[1] &&
                    next->in[0] != next->in[1]) {
                    n->fused_bias = other;
                    absorb(n, next);
                    if (!fused(g, &uses)) break;
                }
            }
        }
        if (conv || qconv || mm || strcmp(t, "Gemm") == 0) {
            sp_ox_node_t *next = sole_reader(g, uses, n->out[0]);
            if (next && strcmp(next->op->name, "Relu") == 0 && n->n_out == 1) {
                n->fused_relu = 1;
                absorb(n, next);
                if (!fused(g, &uses)) break;
            }
        }
    }
    if (uses == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    free(uses);
    return 0;
}

int
sp_ox_graph_prepare(sp_ox_graph_t *g, char *err, size_t err_len)
{
    if (topo_sort(g, err, err_len) || sp_ox_infer_types(g, err, err_len) || sp_ox_qdq_prepare(g, err, err_len) ||
        fold_and_fuse(g, err, err_len) || remove_unread(g, err, err_len)) {
        return -1;
    }
    int32_t k = 0;
    for (int32_t o = 0; o < g->n_order; o++) {
        if (!g->nodes[g->order[o]].dead) g->order[k++] = g->order[o];
    }
    g->n_order = k;
    for (int32_t v = 0; v < g->n_values; v++) g->values[v].last_use = g->values[v].def = -1;
    for (int32_t o = 0; o < g->n_order; o++) {
        const sp_ox_node_t *n = &g->nodes[g->order[o]];
        for (int i = 0; i < n->n_out; i++) g->values[n->out[i]].def = o;
        for (int i = 0; i < n->n_in; i++) {
            if (n->in[i] >= 0) g->values[n->in[i]].last_use = o;
        }
        if (n->fused_add >= 0) g->values[n->fused_add].last_use = o;
        /* An output nobody reads goes back to the pool right after its node. */
        for (int i = 0; i < n->n_out; i++) {
            if (g->values[n->out[i]].last_use < o) g->values[n->out[i]].last_use = o;
        }
    }
    return 0;
}

static int
run_nodes(sp_ox_run_t *r)
{
    sp_ox_graph_t *g = r->g;
    if (r->dnnl) sp_ox_dnnl_begin(r);
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        r->at = o;
        /* oneDNN first (1: done, 0: not an operator or shape it takes); our own operators read
         * plain layouts, so oneDNN's blocked activations are reordered back before them. */
        int rc = r->dnnl ? sp_ox_dnnl_run(r, n, o) : 0;
        if (rc == 0) rc = (r->dnnl && sp_ox_dnnl_plain_inputs(r, n)) || sp_ox_run_node_own(r, n) ? -1 : 1;
        if (rc < 0) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s", r->err);
            snprintf(r->err, r->err_len, "%s: %s", n->label, tmp);
            return -1;
        }
        for (int k = 0; k < n->n_out; k++) {
            /* the type inferred at load (dtype.c) is the one computed */
            const sp_ox_value_t *ov = &g->values[n->out[k]];
            if (ov->etype && ov->t.data && ov->t.dtype != ov->etype) {
                return sp_ox_fail(r, "%s: output %d is %s where %s was inferred at load", n->label, k,
                                  sp_ox_dtype_name(ov->t.dtype), sp_ox_dtype_name(ov->etype));
            }
        }
        for (int i = 0; i < n->n_in + n->n_out + 1; i++) {
            int32_t v = i < n->n_in ? n->in[i] : i < n->n_in + n->n_out ? n->out[i - n->n_in] : n->fused_add;
            if (v < 0) continue;
            sp_ox_value_t *val = &g->values[v];
            if (!val->is_const && !val->is_output && val->last_use == o) sp_ox_pool_put(r, &val->t);
        }
    }
    for (int32_t i = 0; r->dnnl && i < g->n_outputs; i++) {
        if (sp_ox_dnnl_plain(r, g->outputs[i])) return -1;
    }
    return 0;
}

int
sp_ox_graph_run(sp_ox_run_t *r)
{
    sp_ox_plan_begin(r);
    int rc = run_nodes(r);
    sp_ox_plan_end(r, rc == 0);
    return rc;
}

void
sp_ox_run_release_all(sp_ox_run_t *r)
{
    for (int32_t v = 0; v < r->g->n_values; v++) {
        if (!r->g->values[v].is_const) sp_ox_pool_put(r, &r->g->values[v].t);
    }
}
