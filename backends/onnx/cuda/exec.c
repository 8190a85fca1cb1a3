/*
 * backends/onnx/cuda/exec.c - the ONNX GPU executor's host side: the ABI of
 * gpu_api.h on top of the device operations of dev.h.
 *
 * Load: every constant is uploaded once (FP32, or FP16 with opt->fp16),
 * BatchNormalization's four vectors become one scale and one shift per
 * channel, and each node's static parts are checked (value types, constant
 * inputs where the executor needs them), so an unsupported graph fails at
 * load naming the node. Run: nodes in order; shapes are computed here (the
 * batch dimension is free), each output comes from a pool of device buffers
 * (best fit, kept between runs, freed at unload) and goes back after the
 * value's last reader: the pool's size is the peak of live activations.
 * Reshape, Flatten, Squeeze and Unsqueeze are views: the output shares its
 * input's buffer, which goes back when the last value using it dies.
 * Convolutions get a plan per input shape (descriptors and an algorithm
 * measured once), cached per node; one workspace serves them all.
 *
 * Threads: one executor per model instance, one run at a time.
 * Errors: a device error fails the run (or the load) with the node named;
 * a poisoned context fails every later run with its first message.
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu_api.h"
#include "dev.h"
#include "half.h"

#define PLANS_PER_NODE 64 /* conv shapes remembered per node (batch sizes the batcher forms) */
#define ALGO_BUCKETS 16   /* batch buckets 1, 2, 3-4, 5-8, ... 2^15: one measured algorithm each */

typedef struct xval {
    int dt;                /* OXD_F32 / OXD_F16 / OXD_I64 */
    int nd;
    int64_t dims[SP_OXG_MAX_DIMS];
    void *p;               /* device data */
    int32_t owner;         /* value whose buffer p lies in (itself unless a view); -1 none */
    int32_t refs;          /* as an owner: live values using its buffer */
    void *buf;             /* as an owner: its buffer (p may be cleared before the views die) */
    size_t cap;            /* as an owner: bytes of its buffer */
    const int64_t *host;   /* INT64 constants and inputs: the host copy (Gather's bounds) */
} xval_t;

typedef struct plan {
    int64_t n, c, h, w;
    void *p;
    size_t ws;
} plan_t;

typedef struct nodex {
    /* The algorithm cuDNN measured for this node per bucket of batch sizes (and the spatial size
     * it was measured at; zeros: none yet): the dynamic batcher forms every size from 1 to
     * max_batch_size, and measuring each would stall the first batches of every size. */
    int algo[ALGO_BUCKETS];
    int64_t algo_hw[ALGO_BUCKETS][3];
    plan_t plans[PLANS_PER_NODE];
    int n_plans, next_plan;
    void *bn_scale, *bn_shift; /* BatchNormalization folded at load (device, compute type) */
} nodex_t;

typedef struct pbuf {
    void *p;
    size_t cap;
} pbuf_t;

typedef struct exec {
    oxd_t *d;
    sp_oxg_graph_t g;      /* copies of values and nodes (labels borrowed? copied below) */
    sp_oxg_value_t *vdesc;
    sp_oxg_node_t *ndesc;
    char *labels;
    xval_t *v;
    nodex_t *nx;
    int fdt;               /* float compute type */
    size_t ws_limit;
    void *ws;
    size_t ws_cap;
    pbuf_t *free_bufs;
    int32_t n_free, cap_free;
    uint64_t const_bytes, pool_bytes;
    int64_t *host_idx;     /* scratch for Gather's normalised indices */
    size_t host_idx_cap;
    char *err;
    size_t err_len;
    const sp_oxg_node_t *node;
} exec_t;

static int
fail(exec_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int
fail(exec_t *e, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (e->node) snprintf(e->err, e->err_len, "%s: %s", e->node->label, msg);
    else snprintf(e->err, e->err_len, "%s", msg);
    return -1;
}

static int
dev_fail(exec_t *e)
{
    return fail(e, "%s", oxd_error(e->d));
}

static size_t
dt_size(int dt)
{
    return dt == OXD_F16 ? 2 : dt == OXD_I64 ? 8 : 4;
}

static int64_t
numel(const xval_t *x)
{
    int64_t n = 1;
    for (int i = 0; i < x->nd; i++) n *= x->dims[i];
    return n;
}

static void
shape_str(const int64_t *dims, int nd, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < nd && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* ---- the activation pool ---- */

static void
pool_put(exec_t *e, void *p, size_t cap)
{
    if (e->n_free == e->cap_free) {
        int32_t c = e->cap_free ? e->cap_free * 2 : 32;
        pbuf_t *nb = realloc(e->free_bufs, (size_t)c * sizeof *nb);
        if (nb == NULL) {
            oxd_free(e->d, p);
            e->pool_bytes -= cap;
            return;
        }
        e->free_bufs = nb;
        e->cap_free = c;
    }
    e->free_bufs[e->n_free++] = (pbuf_t){p, cap};
}

static void
pool_trim(exec_t *e)
{
    for (int32_t i = 0; i < e->n_free; i++) {
        oxd_free(e->d, e->free_bufs[i].p);
        e->pool_bytes -= e->free_bufs[i].cap;
    }
    e->n_free = 0;
}

/* A device buffer of at least bytes: the best-fitting free one, else a new one (after giving
 * the free ones back when the device is full). */
static int
pool_get(exec_t *e, size_t bytes, void **p, size_t *cap)
{
    int32_t best = -1;
    for (int32_t i = 0; i < e->n_free; i++) {
        if (e->free_bufs[i].cap >= bytes && (best < 0 || e->free_bufs[i].cap < e->free_bufs[best].cap)) best = i;
    }
    if (best >= 0) {
        *p = e->free_bufs[best].p;
        *cap = e->free_bufs[best].cap;
        e->free_bufs[best] = e->free_bufs[--e->n_free];
        return 0;
    }
    size_t want = (bytes + 255) / 256 * 256;
    if (want == 0) want = 256;
    if (oxd_alloc(e->d, want, p)) {
        pool_trim(e);
        if (oxd_alloc(e->d, want, p)) return dev_fail(e);
    }
    *cap = want;
    e->pool_bytes += want;
    return 0;
}

/* Value v gets a fresh buffer for dt and dims. */
static int
out_alloc(exec_t *e, int32_t v, int dt, int nd, const int64_t *dims)
{
    xval_t *x = &e->v[v];
    int64_t n = 1;
    for (int i = 0; i < nd; i++) {
        if (dims[i] < 0 || dims[i] > ((int64_t)1 << 34)) return fail(e, "result dimension %lld", (long long)dims[i]);
        n *= dims[i];
        if (n > ((int64_t)1 << 34)) return fail(e, "result of more than 2^34 elements");
    }
    x->dt = dt;
    x->nd = nd;
    for (int i = 0; i < nd; i++) x->dims[i] = dims[i];
    if (pool_get(e, (size_t)n * dt_size(dt), &x->p, &x->cap)) return -1;
    x->buf = x->p;
    x->owner = v;
    x->refs = 1;
    return 0;
}

/* Value v is dead: its buffer goes back when no view uses it any more. */
static void
release(exec_t *e, int32_t v)
{
    xval_t *x = &e->v[v];
    if (x->owner < 0 || e->vdesc[v].kind == SP_OXG_CONST) return;
    xval_t *o = &e->v[x->owner];
    if (--o->refs == 0) {
        pool_put(e, o->buf, o->cap);
        o->buf = NULL;
    }
    x->owner = -1;
    x->p = NULL;
}

/* ---- load ---- */

static int
upload_const(exec_t *e, int32_t vi)
{
    const sp_oxg_value_t *d = &e->vdesc[vi];
    xval_t *x = &e->v[vi];
    x->nd = d->nd;
    memcpy(x->dims, d->dims, sizeof x->dims);
    x->owner = -1;
    int64_t n = numel(x);
    if (n < 0) return fail(e, "constant of negative size");
    const void *src = d->data;
    void *tmp = NULL;
    if (d->dtype == SP_OXG_INT64) {
        x->dt = OXD_I64;
        int64_t *copy = malloc((size_t)(n ? n : 1) * 8);
        if (copy == NULL) return fail(e, "out of host memory");
        if (n) memcpy(copy, d->data, (size_t)n * 8);
        x->host = copy;
    } else if (d->dtype == SP_OXG_FLOAT) {
        x->dt = e->fdt;
        if (e->fdt == OXD_F16) {
            uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
            if (h == NULL) return fail(e, "out of host memory");
            for (int64_t i = 0; i < n; i++) h[i] = oxh_from_f32(((const float *)d->data)[i]);
            src = tmp = h;
        }
    } else {
        return fail(e, "constant of ONNX type %d", (int)d->dtype);
    }
    size_t bytes = (size_t)n * dt_size(x->dt);
    int rc = 0;
    if (oxd_alloc(e->d, bytes ? bytes : 1, &x->p) || (bytes && oxd_h2d(e->d, x->p, src, bytes))) {
        rc = dev_fail(e);
    } else {
        e->const_bytes += bytes ? bytes : 1;
    }
    free(tmp);
    return rc;
}

/* Upload n floats (host, FP32) as the compute type into a new device buffer. */
static int
upload_floats(exec_t *e, const float *h, int64_t n, void **p)
{
    size_t bytes = (size_t)n * dt_size(e->fdt);
    uint16_t *tmp = NULL;
    const void *src = h;
    if (e->fdt == OXD_F16) {
        tmp = malloc((size_t)n * 2);
        if (tmp == NULL) return fail(e, "out of host memory");
        for (int64_t i = 0; i < n; i++) tmp[i] = oxh_from_f32(h[i]);
        src = tmp;
    }
    int rc = oxd_alloc(e->d, bytes, p) || oxd_h2d(e->d, *p, src, bytes) ? dev_fail(e) : 0;
    if (rc == 0) e->const_bytes += bytes;
    free(tmp);
    return rc;
}

static bool
is_const(const exec_t *e, int32_t v)
{
    return v >= 0 && e->vdesc[v].kind == SP_OXG_CONST;
}

/* BatchNormalization with constant parameters: y = x * scale' + shift' per channel. */
static int
prepare_bn(exec_t *e, int32_t k)
{
    const sp_oxg_node_t *n = &e->ndesc[k];
    for (int i = 1; i < 5; i++) {
        if (!is_const(e, n->in[i]) || e->vdesc[n->in[i]].dtype != SP_OXG_FLOAT) {
            return fail(e, "BatchNormalization with parameters computed at run time is not supported on the GPU");
        }
    }
    int64_t c = 1;
    for (int j = 0; j < e->vdesc[n->in[1]].nd; j++) c *= e->vdesc[n->in[1]].dims[j];
    for (int i = 2; i < 5; i++) {
        int64_t m = 1;
        for (int j = 0; j < e->vdesc[n->in[i]].nd; j++) m *= e->vdesc[n->in[i]].dims[j];
        if (m != c) return fail(e, "BatchNormalization parameters of %lld and %lld values", (long long)c, (long long)m);
    }
    float *s = malloc((size_t)(c ? c : 1) * sizeof *s), *t = malloc((size_t)(c ? c : 1) * sizeof *t);
    int rc = -1;
    if (s && t) {
        const float *sc = e->vdesc[n->in[1]].data, *b = e->vdesc[n->in[2]].data;
        const float *mean = e->vdesc[n->in[3]].data, *var = e->vdesc[n->in[4]].data;
        for (int64_t i = 0; i < c; i++) {
            s[i] = sc[i] / sqrtf(var[i] + n->f[0]);
            t[i] = b[i] - mean[i] * s[i];
        }
        rc = upload_floats(e, s, c, &e->nx[k].bn_scale) || upload_floats(e, t, c, &e->nx[k].bn_shift) ? -1 : 0;
    } else {
        fail(e, "out of host memory");
    }
    free(s);
    free(t);
    return rc;
}

/* Static checks: value types through the graph (FLOAT everywhere but Gather's indices and the
 * shape-only ops), operator parameters, constants where the executor needs them. */
static int
check_node(exec_t *e, int32_t k, int *vdt)
{
    const sp_oxg_node_t *n = &e->ndesc[k];
    for (int i = 0; i < n->n_in; i++) {
        if (n->in[i] >= e->g.n_values) return fail(e, "input value %d out of range", (int)n->in[i]);
    }
    for (int i = 0; i < n->n_out; i++) {
        if (n->out[i] < 0 || n->out[i] >= e->g.n_values) return fail(e, "output value %d out of range", (int)n->out[i]);
    }
    if (n->n_in < 1 || n->n_out < 1 || n->in[0] < 0) return fail(e, "node without input or output");
    int in0 = vdt[n->in[0]];
    int out_dt = SP_OXG_FLOAT;
    bool float_in = true;
    switch (n->op) {
    case SP_OXG_CONV:
        /* weights and bias may be computed (or fed) at run time: cuDNN reads them as any tensor */
        if (n->n_in < 2 || n->in[1] < 0) return fail(e, "Conv without weights");
        if (is_const(e, n->in[1]) && e->vdesc[n->in[1]].nd != 4) {
            return fail(e, "%d-D convolution is not supported on the GPU (2-D only)", e->vdesc[n->in[1]].nd - 2);
        }
        if (n->i[0] != n->i[2] || n->i[1] != n->i[3]) {
            return fail(e, "asymmetric pads [%lld, %lld, %lld, %lld] are not supported on the GPU (cuDNN)",
                        (long long)n->i[0], (long long)n->i[1], (long long)n->i[2], (long long)n->i[3]);
        }
        break;
    case SP_OXG_BATCHNORM:
        if (n->n_in < 5) return fail(e, "BatchNormalization with %d inputs", (int)n->n_in);
        if (prepare_bn(e, k)) return -1;
        break;
    case SP_OXG_GEMM: case SP_OXG_MATMUL:
        if (n->n_in < 2 || n->in[1] < 0) return fail(e, "two inputs needed");
        if (n->bias >= 0 && !is_const(e, n->bias)) return fail(e, "fused bias is not a constant");
        break;
    case SP_OXG_UNARY:
        if (n->sub < 0 || n->sub >= SP_OXG_N_UNARY) return fail(e, "unary operation %d", (int)n->sub);
        break;
    case SP_OXG_BINARY:
        if (n->sub < 0 || n->sub >= SP_OXG_N_BINARY || n->n_in != 2 || n->in[1] < 0) return fail(e, "binary operation %d", (int)n->sub);
        break;
    case SP_OXG_VIEW: case SP_OXG_TRANSPOSE: case SP_OXG_CONCAT:
        float_in = false;
        out_dt = in0;
        for (int i = 1; i < n->n_in; i++) {
            if (n->op == SP_OXG_CONCAT && n->in[i] >= 0 && vdt[n->in[i]] != in0) return fail(e, "Concat of FLOAT and INT64 tensors");
        }
        break;
    case SP_OXG_GATHER:
        if (n->n_in != 2 || n->in[1] < 0) return fail(e, "Gather needs data and indices");
        if (vdt[n->in[1]] != SP_OXG_INT64 || (e->vdesc[n->in[1]].kind == SP_OXG_ACT)) {
            return fail(e, "Gather indices must be INT64 and a constant or a graph input on the GPU");
        }
        float_in = false;
        out_dt = in0;
        break;
    case SP_OXG_LAYERNORM:
        if (n->n_out > 3) return fail(e, "LayerNormalization with %d outputs", (int)n->n_out);
        if (n->n_in < 2 || n->in[1] < 0) return fail(e, "LayerNormalization needs a scale");
        for (int i = 1; i < n->n_out; i++) vdt[n->out[i]] = SP_OXG_FLOAT; /* Mean, InvStdDev */
        break;
    case SP_OXG_POOL: case SP_OXG_GLOBAL_POOL: case SP_OXG_SOFTMAX: case SP_OXG_REDUCE:
        break;
    default:
        return fail(e, "operator code %d is not supported by the GPU executor", (int)n->op);
    }
    if (float_in) {
        for (int i = 0; i < n->n_in; i++) {
            if (n->in[i] >= 0 && vdt[n->in[i]] != SP_OXG_FLOAT) return fail(e, "INT64 input %d is not supported on the GPU", i);
        }
    }
    if (n->n_out != 1 && n->op != SP_OXG_LAYERNORM) return fail(e, "%d outputs are not supported on the GPU", (int)n->n_out);
    vdt[n->out[0]] = out_dt;
    return 0;
}

static void
exec_free(void *p)
{
    exec_t *e = p;
    if (e == NULL) return;
    if (e->d) {
        oxd_bind(e->d); /* frees go to the executor's device, whichever thread unloads */
        for (int32_t k = 0; e->nx && k < e->g.n_nodes; k++) {
            for (int i = 0; i < e->nx[k].n_plans; i++) oxd_conv_plan_free(e->d, e->nx[k].plans[i].p);
            oxd_free(e->d, e->nx[k].bn_scale);
            oxd_free(e->d, e->nx[k].bn_shift);
        }
        for (int32_t v = 0; e->v && v < e->g.n_values; v++) {
            if (e->vdesc[v].kind == SP_OXG_CONST) {
                oxd_free(e->d, e->v[v].p);
                free((void *)e->v[v].host);
            } else {
                release(e, v);
            }
        }
        pool_trim(e);
        oxd_free(e->d, e->ws);
        oxd_close(e->d);
    }
    free(e->free_bufs);
    free(e->host_idx);
    free(e->v);
    free(e->nx);
    free(e->vdesc);
    free(e->ndesc);
    free(e->labels);
    free(e);
}

static int
exec_load(const sp_oxg_graph_t *g, const sp_oxg_options_t *opt, void **out, char *err, size_t err_len)
{
    *out = NULL;
    exec_t *e = calloc(1, sizeof *e);
    if (e == NULL) return snprintf(err, err_len, "out of memory"), -1;
    e->err = err;
    e->err_len = err_len;
    e->fdt = opt->fp16 ? OXD_F16 : OXD_F32;
    e->ws_limit = opt->workspace_limit ? opt->workspace_limit : (size_t)256 << 20;
    e->g = *g;
    size_t lab = 0;
    for (int32_t k = 0; k < g->n_nodes; k++) lab += strlen(g->nodes[k].label ? g->nodes[k].label : "") + 1;
    e->vdesc = malloc(sizeof *e->vdesc * (size_t)(g->n_values + 1));
    e->ndesc = malloc(sizeof *e->ndesc * (size_t)(g->n_nodes + 1));
    e->labels = malloc(lab + 1);
    e->v = calloc((size_t)g->n_values + 1, sizeof *e->v);
    e->nx = calloc((size_t)g->n_nodes + 1, sizeof *e->nx);
    int *vdt = calloc((size_t)g->n_values + 1, sizeof *vdt);
    char *used = calloc((size_t)g->n_values + 1, 1);
    if (!e->vdesc || !e->ndesc || !e->labels || !e->v || !e->nx || !vdt || !used) {
        free(vdt);
        free(used);
        exec_free(e);
        return snprintf(err, err_len, "out of memory"), -1;
    }
    memcpy(e->vdesc, g->values, sizeof *e->vdesc * (size_t)g->n_values);
    memcpy(e->ndesc, g->nodes, sizeof *e->ndesc * (size_t)g->n_nodes);
    char *lp = e->labels;
    for (int32_t k = 0; k < g->n_nodes; k++) {
        const char *l = g->nodes[k].label ? g->nodes[k].label : "";
        strcpy(lp, l);
        e->ndesc[k].label = lp;
        lp += strlen(l) + 1;
    }
    e->g.values = e->vdesc;
    e->g.nodes = e->ndesc;
    for (int32_t v = 0; v < g->n_values; v++) {
        e->v[v].owner = -1;
        e->vdesc[v].data = e->vdesc[v].kind == SP_OXG_CONST ? g->values[v].data : NULL;
        vdt[v] = e->vdesc[v].dtype;
    }
    int rc = -1;
    char derr[512];
    if (oxd_open(opt->device, &e->d, derr, sizeof derr)) {
        snprintf(err, err_len, "%s", derr);
        goto done;
    }
    /* Only the constants a node reads (or the graph returns) go to the device: shape and axes
     * inputs were read at lowering. */
    for (int32_t k = 0; k < g->n_nodes; k++) {
        const sp_oxg_node_t *n = &e->ndesc[k];
        for (int i = 0; i < n->n_in && i < SP_OXG_MAX_IO; i++) {
            if (n->in[i] >= 0 && n->in[i] < g->n_values) used[n->in[i]] = 1;
        }
        if (n->bias >= 0 && n->bias < g->n_values) used[n->bias] = 1;
    }
    for (int32_t v = 0; v < g->n_values; v++) {
        if (e->vdesc[v].kind == SP_OXG_CONST && (used[v] || e->vdesc[v].is_output) && upload_const(e, v)) goto done;
    }
    for (int32_t k = 0; k < g->n_nodes; k++) {
        e->node = &e->ndesc[k];
        if (check_node(e, k, vdt)) goto done;
    }
    e->node = NULL;
    rc = 0;
done:
    /* the host description is the caller's: forget its data pointers */
    for (int32_t v = 0; v < g->n_values; v++) e->vdesc[v].data = NULL;
    free(vdt);
    free(used);
    if (rc) {
        exec_free(e);
        return -1;
    }
    *out = e;
    return 0;
}

/* ---- run: one function per operator ---- */

static const xval_t *
in_val(exec_t *e, int i)
{
    int32_t v = e->node->in[i];
    return v >= 0 ? &e->v[v] : NULL;
}

static int
window(exec_t *e, int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe, int auto_pad,
       int ceil_mode, int64_t *out, int64_t *pad_b, int64_t *pad_e)
{
    if (k < 1 || s < 1 || d < 1) return fail(e, "kernel %lld, stride %lld, dilation %lld", (long long)k, (long long)s, (long long)d);
    int64_t ext = (k - 1) * d + 1;
    if (auto_pad >= 2) {
        *out = (in + s - 1) / s;
        int64_t tot = (*out - 1) * s + ext - in;
        if (tot < 0) tot = 0;
        *pad_b = auto_pad == 2 ? tot / 2 : (tot + 1) / 2;
        *pad_e = tot - *pad_b;
        return 0;
    }
    if (auto_pad == 1) pb = pe = 0;
    int64_t span = in + pb + pe - ext;
    if (span < 0) return fail(e, "the window (%lld) is larger than the padded input (%lld)", (long long)ext, (long long)(in + pb + pe));
    *out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
    if (ceil_mode && (*out - 1) * s >= in + pb) (*out)--;
    *pad_b = pb;
    *pad_e = pe;
    return 0;
}

static int
run_conv(exec_t *e, int32_t k)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0), *w = in_val(e, 1), *b = n->n_in > 2 ? in_val(e, 2) : NULL;
    if (x->nd != 4 || w->nd != 4) {
        return fail(e, "input of rank %d, weights of rank %d: 2-D convolutions (rank 4) only are supported on the GPU", x->nd, w->nd);
    }
    int64_t c = x->dims[1], m = w->dims[0], group = n->i[8] ? n->i[8] : 1;
    if (group < 1 || c % group || m % group || w->dims[1] != c / group) {
        return fail(e, "%lld input channels, weights [%lld, %lld, ...], group %lld", (long long)c, (long long)m,
                    (long long)w->dims[1], (long long)group);
    }
    if (b && numel(b) != m) return fail(e, "bias of %lld values for %lld channels", (long long)numel(b), (long long)m);
    oxd_conv_t cv = {.dt = e->fdt, .n = x->dims[0], .c = c, .h = x->dims[2], .w = x->dims[3], .k = m,
                     .r = w->dims[2], .s = w->dims[3], .sh = n->i[4], .sw = n->i[5], .dh = n->i[6],
                     .dw = n->i[7], .group = group};
    int64_t pe;
    if (window(e, cv.h, cv.r, cv.sh, cv.dh, n->i[0], n->i[2], (int)n->i[9], 0, &cv.oh, &cv.pad_h, &pe) ||
        window(e, cv.w, cv.s, cv.sw, cv.dw, n->i[1], n->i[3], (int)n->i[9], 0, &cv.ow, &cv.pad_w, &pe)) return -1;
    if (n->i[9] >= 2 && (cv.pad_h * 2 != (cv.oh - 1) * cv.sh + (cv.r - 1) * cv.dh + 1 - cv.h ||
                         cv.pad_w * 2 != (cv.ow - 1) * cv.sw + (cv.s - 1) * cv.dw + 1 - cv.w)) {
        /* SAME padding that is odd in total is asymmetric: cuDNN cannot. */
        int64_t th = (cv.oh - 1) * cv.sh + (cv.r - 1) * cv.dh + 1 - cv.h, tw = (cv.ow - 1) * cv.sw + (cv.s - 1) * cv.dw + 1 - cv.w;
        if ((th > 0 && th % 2) || (tw > 0 && tw % 2)) return fail(e, "auto_pad gives asymmetric pads here, not supported on the GPU (cuDNN)");
    }
    nodex_t *nx = &e->nx[k];
    plan_t *pl = NULL;
    for (int i = 0; i < nx->n_plans && !pl; i++) {
        plan_t *q = &nx->plans[i];
        if (q->n == cv.n && q->c == cv.c && q->h == cv.h && q->w == cv.w) pl = q;
    }
    if (pl == NULL) {
        /* a new shape: plan it once (cuDNN measures the algorithms), evicting round-robin */
        if (nx->n_plans == PLANS_PER_NODE) {
            pl = &nx->plans[nx->next_plan];
            nx->next_plan = (nx->next_plan + 1) % PLANS_PER_NODE;
            oxd_conv_plan_free(e->d, pl->p);
            pl->p = NULL;
        } else {
            pl = &nx->plans[nx->n_plans++];
        }
        pl->n = cv.n;
        pl->c = cv.c;
        pl->h = cv.h;
        pl->w = cv.w;
        int bucket = 0;
        while (bucket < ALGO_BUCKETS - 1 && ((int64_t)1 << bucket) < cv.n) bucket++;
        int algo = -1;
        if (nx->algo_hw[bucket][0] == cv.c && nx->algo_hw[bucket][1] == cv.h && nx->algo_hw[bucket][2] == cv.w) {
            algo = nx->algo[bucket];
        }
        if (oxd_conv_plan(e->d, &cv, e->ws_limit, &algo, &pl->p, &pl->ws)) {
            int rc = dev_fail(e);
            *pl = nx->plans[--nx->n_plans];
            if (nx->next_plan >= nx->n_plans) nx->next_plan = 0;
            return rc;
        }
        nx->algo[bucket] = algo;
        nx->algo_hw[bucket][0] = cv.c;
        nx->algo_hw[bucket][1] = cv.h;
        nx->algo_hw[bucket][2] = cv.w;
    }
    if (pl->ws > e->ws_cap) {
        oxd_free(e->d, e->ws);
        e->ws = NULL;
        e->ws_cap = 0;
        if (oxd_alloc(e->d, pl->ws, &e->ws)) return dev_fail(e);
        e->ws_cap = pl->ws;
    }
    int64_t od[4] = {cv.n, m, cv.oh, cv.ow};
    if (out_alloc(e, n->out[0], e->fdt, 4, od)) return -1;
    if (oxd_conv(e->d, pl->p, x->p, w->p, b ? b->p : NULL, n->relu, e->v[n->out[0]].p, pl->ws ? e->ws : NULL, pl->ws)) return dev_fail(e);
    return 0;
}

static int
run_pool(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0);
    if (x->nd != 4) return fail(e, "input of rank %d (the GPU pools 2-D windows, rank 4)", x->nd);
    oxd_pool_t p = {.max = n->sub == 0, .n = x->dims[0], .c = x->dims[1], .h = x->dims[2], .w = x->dims[3],
                    .kh = n->i[0], .kw = n->i[1], .sh = n->i[6], .sw = n->i[7], .dh = n->i[10] ? n->i[10] : 1,
                    .dw = n->i[11] ? n->i[11] : 1, .count_pad = (int)n->i[9]};
    if (window(e, p.h, p.kh, p.sh, p.dh, n->i[2], n->i[4], (int)n->i[12], (int)n->i[8], &p.oh, &p.pad_t, &p.pad_b) ||
        window(e, p.w, p.kw, p.sw, p.dw, n->i[3], n->i[5], (int)n->i[12], (int)n->i[8], &p.ow, &p.pad_l, &p.pad_r)) return -1;
    int64_t od[4] = {p.n, p.c, p.oh, p.ow};
    if (out_alloc(e, n->out[0], e->fdt, 4, od)) return -1;
    return oxd_pool(e->d, e->fdt, &p, x->p, e->v[n->out[0]].p) ? dev_fail(e) : 0;
}

static int
run_global_pool(exec_t *e)
{
    const xval_t *x = in_val(e, 0);
    if (x->nd < 3) return fail(e, "input of rank %d", x->nd);
    int64_t od[SP_OXG_MAX_DIMS], hw = 1;
    od[0] = x->dims[0];
    od[1] = x->dims[1];
    for (int i = 2; i < x->nd; i++) {
        od[i] = 1;
        hw *= x->dims[i];
    }
    if (hw == 0) return fail(e, "empty spatial dimensions");
    if (out_alloc(e, e->node->out[0], e->fdt, x->nd, od)) return -1;
    int op = e->node->sub == 0 ? SP_OXG_RMAX : SP_OXG_RMEAN;
    return oxd_reduce(e->d, e->fdt, op, x->p, e->v[e->node->out[0]].p, od[0] * od[1], hw, 1) ? dev_fail(e) : 0;
}

static int
run_bn(exec_t *e, int32_t k)
{
    const xval_t *x = in_val(e, 0);
    if (x->nd < 2) return fail(e, "input of rank %d", x->nd);
    int64_t inner = 1;
    for (int i = 2; i < x->nd; i++) inner *= x->dims[i];
    int64_t c = 1;
    for (int j = 0; j < e->vdesc[e->node->in[1]].nd; j++) c *= e->vdesc[e->node->in[1]].dims[j];
    if (x->dims[1] != c) return fail(e, "%lld channels, parameters for %lld", (long long)x->dims[1], (long long)c);
    if (out_alloc(e, e->node->out[0], e->fdt, x->nd, x->dims)) return -1;
    return oxd_affine(e->d, e->fdt, x->p, e->nx[k].bn_scale, e->nx[k].bn_shift, e->v[e->node->out[0]].p,
                      x->dims[0], c, inner, 0) ? dev_fail(e) : 0;
}

/* Fill y ([rows, n], row-major) with c broadcast to it (unidirectional numpy broadcasting). */
static int
fill_broadcast(exec_t *e, const xval_t *c, void *y, int64_t rows, int64_t n)
{
    if (c->nd > 2) return fail(e, "C of rank %d", c->nd);
    int64_t cr = c->nd == 2 ? c->dims[0] : 1, cc = c->nd >= 1 ? c->dims[c->nd - 1] : 1;
    if ((cr != 1 && cr != rows) || (cc != 1 && cc != n)) {
        char a[64];
        shape_str(c->dims, c->nd, a, sizeof a);
        return fail(e, "C %s does not broadcast to [%lld, %lld]", a, (long long)rows, (long long)n);
    }
    int64_t dims[2] = {rows, n}, sx[2] = {cr == 1 ? 0 : cc, cc == 1 ? 0 : 1}, sy[2] = {n, 1};
    return oxd_copy(e->d, dt_size(e->fdt), 2, dims, c->p, sx, y, sy) ? dev_fail(e) : 0;
}

static int
run_gemm(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *a = in_val(e, 0), *b = in_val(e, 1), *c = n->n_in > 2 ? in_val(e, 2) : NULL;
    if (a->nd != 2 || b->nd != 2) return fail(e, "Gemm of rank %d and %d inputs", a->nd, b->nd);
    int ta = (int)n->i[0], tb = (int)n->i[1];
    int64_t m = ta ? a->dims[1] : a->dims[0], k = ta ? a->dims[0] : a->dims[1];
    int64_t kb = tb ? b->dims[1] : b->dims[0], nn = tb ? b->dims[0] : b->dims[1];
    if (k != kb) return fail(e, "inner dimensions %lld and %lld", (long long)k, (long long)kb);
    int64_t od[2] = {m, nn};
    if (out_alloc(e, n->out[0], e->fdt, 2, od)) return -1;
    void *y = e->v[n->out[0]].p;
    float beta = 0;
    if (c && n->f[1] != 0) {
        if (fill_broadcast(e, c, y, m, nn)) return -1;
        beta = n->f[1];
    }
    if (m && nn && oxd_gemm(e->d, e->fdt, ta, tb, m, nn, k, n->f[0], a->p, a->dims[1], 0, b->p, b->dims[1], 0,
                            beta, y, nn, 0, 1)) return dev_fail(e);
    if (n->relu && oxd_unary(e->d, e->fdt, SP_OXG_RELU, 0, 0, y, y, m * nn)) return dev_fail(e);
    return 0;
}

static int
run_matmul(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *a = in_val(e, 0), *b = in_val(e, 1);
    if (a->nd < 1 || b->nd < 1) return fail(e, "MatMul of a scalar");
    /* numpy: 1-D A is a row [1, K], 1-D B a column [K, 1]; those dims leave the result */
    int64_t ad[SP_OXG_MAX_DIMS + 1], bd[SP_OXG_MAX_DIMS + 1];
    int an = a->nd, bn = b->nd;
    memcpy(ad, a->dims, sizeof a->dims);
    memcpy(bd, b->dims, sizeof b->dims);
    if (an == 1) { ad[1] = ad[0]; ad[0] = 1; an = 2; }
    if (bn == 1) { bd[1] = 1; bn = 2; }
    int64_t m = ad[an - 2], k = ad[an - 1], kb = bd[bn - 2], nn = bd[bn - 1];
    if (k != kb) return fail(e, "inner dimensions %lld and %lld", (long long)k, (long long)kb);
    int nb = (an > bn ? an : bn) - 2;
    int64_t batch[SP_OXG_MAX_DIMS], nbatch = 1, a_b = 1, b_b = 1;
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - (an - 2)), ib = i - (nb - (bn - 2));
        int64_t da = ia >= 0 ? ad[ia] : 1, db = ib >= 0 ? bd[ib] : 1;
        if (da != db && da != 1 && db != 1) return fail(e, "batch dimensions %lld and %lld do not broadcast", (long long)da, (long long)db);
        batch[i] = da > db ? da : db;
        if (da == 0 || db == 0) batch[i] = 0;
        nbatch *= batch[i];
        a_b *= da;
        b_b *= db;
    }
    if ((a_b != 1 && a_b != nbatch) || (b_b != 1 && b_b != nbatch)) {
        return fail(e, "partly broadcast batch dimensions are not supported on the GPU");
    }
    int64_t od[SP_OXG_MAX_DIMS];
    int ond = 0;
    for (int i = 0; i < nb; i++) od[ond++] = batch[i];
    if (a->nd > 1) od[ond++] = m;
    if (b->nd > 1) od[ond++] = nn;
    if (ond > SP_OXG_MAX_DIMS) return fail(e, "result of rank %d", ond);
    if (out_alloc(e, n->out[0], e->fdt, ond, od)) return -1;
    void *y = e->v[n->out[0]].p;
    float beta = 0;
    /* B shared by the whole batch and A contiguous: one product of nbatch*m rows */
    int64_t rows = m, gb = nbatch, sa = m * k, sb = k * nn, sc = m * nn;
    if (b_b == 1 && a_b == nbatch) {
        rows = m * nbatch;
        gb = 1;
    }
    if (b_b == 1) sb = 0;
    if (a_b == 1) sa = 0;
    if (n->bias >= 0) {
        const xval_t *bias = &e->v[n->bias];
        if (numel(bias) != nn) return fail(e, "bias of %lld values for %lld columns", (long long)numel(bias), (long long)nn);
        int64_t dims[2] = {nbatch * m, nn}, sx[2] = {0, 1}, sy[2] = {nn, 1};
        if (oxd_copy(e->d, dt_size(e->fdt), 2, dims, bias->p, sx, y, sy)) return dev_fail(e);
        beta = 1;
    }
    if (rows && nn && gb && oxd_gemm(e->d, e->fdt, 0, 0, rows, nn, k, 1.0f, a->p, k, sa, b->p, nn, sb, beta, y, nn, sc, gb)) {
        return dev_fail(e);
    }
    if (n->relu && oxd_unary(e->d, e->fdt, SP_OXG_RELU, 0, 0, y, y, nbatch * m * nn)) return dev_fail(e);
    return 0;
}

static int
run_unary(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0);
    if (out_alloc(e, n->out[0], e->fdt, x->nd, x->dims)) return -1;
    return oxd_unary(e->d, e->fdt, n->sub, n->f[0], n->f[1], x->p, e->v[n->out[0]].p, numel(x)) ? dev_fail(e) : 0;
}

static int
run_binary(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *a = in_val(e, 0), *b = in_val(e, 1);
    int nd = a->nd > b->nd ? a->nd : b->nd;
    int64_t dims[SP_OXG_MAX_DIMS], sa[SP_OXG_MAX_DIMS], sb[SP_OXG_MAX_DIMS];
    int64_t ra = 1, rb = 1;
    for (int i = nd - 1; i >= 0; i--) {
        int ia = i - (nd - a->nd), ib = i - (nd - b->nd);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char x[96], y[96];
            shape_str(a->dims, a->nd, x, sizeof x);
            shape_str(b->dims, b->nd, y, sizeof y);
            return fail(e, "shapes %s and %s do not broadcast", x, y);
        }
        dims[i] = da == 1 ? db : da;
        sa[i] = da == 1 ? 0 : ra;
        sb[i] = db == 1 ? 0 : rb;
        ra *= da;
        rb *= db;
    }
    if (out_alloc(e, n->out[0], e->fdt, nd, dims)) return -1;
    if (numel(&e->v[n->out[0]]) == 0) return 0;
    return oxd_binary(e->d, e->fdt, n->sub, nd, dims, sa, sb, a->p, b->p, e->v[n->out[0]].p) ? dev_fail(e) : 0;
}

static int
norm_axis(exec_t *e, int64_t axis, int nd, int *out)
{
    if (axis < -nd || axis >= (nd ? nd : 1)) return fail(e, "axis %lld for rank %d", (long long)axis, nd);
    *out = (int)(axis < 0 ? axis + nd : axis);
    return 0;
}

static int
run_view(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0);
    int64_t od[SP_OXG_MAX_DIMS], total = numel(x);
    int ond = 0;
    switch (n->sub) {
    case SP_OXG_RESHAPE: {
        int64_t cnt = n->i[0], known = 1;
        int infer = -1;
        if (cnt < 0 || cnt > SP_OXG_MAX_DIMS) return fail(e, "target shape of %lld dimensions", (long long)cnt);
        for (int i = 0; i < cnt; i++) {
            int64_t d = n->i[1 + i];
            if (d == 0 && !n->i[9]) {
                if (i >= x->nd) return fail(e, "0 copies dimension %d of a rank-%d input", i, x->nd);
                d = x->dims[i];
            }
            if (d == -1) {
                if (infer >= 0) return fail(e, "two -1 dimensions");
                infer = i;
                d = 1;
            } else if (d < 0) {
                return fail(e, "dimension %lld", (long long)d);
            }
            od[i] = d;
            known *= d;
        }
        if (infer >= 0) {
            if (known == 0 || total % known) return fail(e, "cannot infer -1 for %lld elements", (long long)total);
            od[infer] = total / known;
        }
        ond = (int)cnt;
        break;
    }
    case SP_OXG_FLATTEN: {
        int axis = 0;
        if (n->i[0] < -x->nd || n->i[0] > x->nd) return fail(e, "axis %lld for rank %d", (long long)n->i[0], x->nd);
        axis = (int)(n->i[0] < 0 ? n->i[0] + x->nd : n->i[0]);
        od[0] = od[1] = 1;
        for (int i = 0; i < x->nd; i++) od[i < axis ? 0 : 1] *= x->dims[i];
        ond = 2;
        break;
    }
    case SP_OXG_SQUEEZE: {
        bool drop[SP_OXG_MAX_DIMS] = {0};
        for (int i = 0; i < n->i[0]; i++) {
            int a = 0;
            if (norm_axis(e, n->i[1 + i], x->nd, &a)) return -1;
            if (x->dims[a] != 1) return fail(e, "dimension %d is %lld, not 1", a, (long long)x->dims[a]);
            drop[a] = true;
        }
        for (int i = 0; i < x->nd; i++) {
            if (n->i[0] ? !drop[i] : x->dims[i] != 1) od[ond++] = x->dims[i];
        }
        break;
    }
    case SP_OXG_UNSQUEEZE: {
        int r = x->nd + (int)n->i[0];
        if (n->i[0] < 0 || r > SP_OXG_MAX_DIMS) return fail(e, "result of rank %d", r);
        bool ins[SP_OXG_MAX_DIMS] = {0};
        for (int i = 0; i < n->i[0]; i++) {
            int a = 0;
            if (norm_axis(e, n->i[1 + i], r, &a)) return -1;
            if (ins[a]) return fail(e, "axis %d given twice", a);
            ins[a] = true;
        }
        for (int i = 0, j = 0; i < r; i++) od[i] = ins[i] ? 1 : x->dims[j++];
        ond = r;
        break;
    }
    default:
        return fail(e, "view %d", (int)n->sub);
    }
    int64_t t = 1;
    for (int i = 0; i < ond; i++) t *= od[i];
    if (t != total) {
        char a[96], b[96];
        shape_str(x->dims, x->nd, a, sizeof a);
        shape_str(od, ond, b, sizeof b);
        return fail(e, "cannot view %s as %s", a, b);
    }
    xval_t *y = &e->v[n->out[0]];
    y->dt = x->dt;
    y->nd = ond;
    memcpy(y->dims, od, sizeof od);
    y->p = x->p;
    if (x->owner >= 0) {
        y->owner = x->owner;
        e->v[x->owner].refs++;
    } else {
        y->owner = -1; /* a view of a constant: nothing to give back */
    }
    return 0;
}

static int
run_transpose(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0);
    int perm[SP_OXG_MAX_DIMS];
    bool seen[SP_OXG_MAX_DIMS] = {0};
    if (n->i[0] != 0 && n->i[0] != x->nd) return fail(e, "perm of %lld for rank %d", (long long)n->i[0], x->nd);
    for (int i = 0; i < x->nd; i++) {
        int64_t p = n->i[0] ? n->i[1 + i] : x->nd - 1 - i;
        if (p < 0 || p >= x->nd || seen[p]) return fail(e, "perm is not a permutation");
        seen[p] = true;
        perm[i] = (int)p;
    }
    int64_t st[SP_OXG_MAX_DIMS], od[SP_OXG_MAX_DIMS], sx[SP_OXG_MAX_DIMS], sy[SP_OXG_MAX_DIMS], s = 1;
    for (int i = x->nd - 1; i >= 0; i--) {
        st[i] = s;
        s *= x->dims[i];
    }
    for (int i = 0; i < x->nd; i++) {
        od[i] = x->dims[perm[i]];
        sx[i] = st[perm[i]];
    }
    s = 1;
    for (int i = x->nd - 1; i >= 0; i--) {
        sy[i] = s;
        s *= od[i];
    }
    if (out_alloc(e, n->out[0], x->dt, x->nd, od)) return -1;
    if (numel(x) == 0) return 0;
    return oxd_copy(e->d, dt_size(x->dt), x->nd, od, x->p, sx, e->v[n->out[0]].p, sy) ? dev_fail(e) : 0;
}

static int
run_concat(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x0 = in_val(e, 0);
    int axis = 0;
    if (x0->nd == 0) return fail(e, "Concat of scalars");
    if (norm_axis(e, n->i[0], x0->nd, &axis)) return -1;
    int64_t od[SP_OXG_MAX_DIMS];
    memcpy(od, x0->dims, sizeof od);
    od[axis] = 0;
    for (int i = 0; i < n->n_in; i++) {
        const xval_t *x = in_val(e, i);
        if (x == NULL) continue;
        bool ok = x->nd == x0->nd;
        for (int j = 0; ok && j < x->nd; j++) ok = j == axis || x->dims[j] == x0->dims[j];
        if (!ok) return fail(e, "input %d's shape does not match input 0's", i);
        od[axis] += x->dims[axis];
    }
    if (out_alloc(e, n->out[0], x0->dt, x0->nd, od)) return -1;
    int64_t sy[SP_OXG_MAX_DIMS], s = 1;
    for (int j = x0->nd - 1; j >= 0; j--) {
        sy[j] = s;
        s *= od[j];
    }
    size_t es = dt_size(x0->dt);
    int64_t off = 0;
    for (int i = 0; i < n->n_in; i++) {
        const xval_t *x = in_val(e, i);
        if (x == NULL) continue;
        int64_t sx[SP_OXG_MAX_DIMS];
        s = 1;
        for (int j = x->nd - 1; j >= 0; j--) {
            sx[j] = s;
            s *= x->dims[j];
        }
        if (s && oxd_copy(e->d, es, x->nd, x->dims, x->p, sx, (char *)e->v[n->out[0]].p + (size_t)(off * sy[axis]) * es, sy)) {
            return dev_fail(e);
        }
        off += x->dims[axis];
    }
    return 0;
}

static int
run_softmax(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0);
    int axis = 0;
    if (norm_axis(e, n->i[0], x->nd, &axis)) return -1;
    int64_t outer = 1, mid = 1, inner = 1;
    for (int i = 0; i < x->nd; i++) {
        if (i < axis) outer *= x->dims[i];
        else if (i == axis || !n->i[1]) mid *= x->dims[i];
        else inner *= x->dims[i];
    }
    if (out_alloc(e, n->out[0], e->fdt, x->nd, x->dims)) return -1;
    if (outer * mid * inner == 0) return 0;
    return oxd_softmax(e->d, e->fdt, x->p, e->v[n->out[0]].p, outer, mid, inner, n->sub) ? dev_fail(e) : 0;
}

static int
run_reduce(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0);
    bool red[SP_OXG_MAX_DIMS] = {0};
    if (n->i[0] < 0 || n->i[0] > SP_OXG_MAX_DIMS) return fail(e, "%lld axes", (long long)n->i[0]);
    for (int i = 0; i < n->i[0]; i++) {
        int a = 0;
        if (norm_axis(e, n->i[1 + i], x->nd, &a)) return -1;
        red[a] = true;
    }
    if (n->i[0] == 0) {
        for (int i = 0; i < x->nd; i++) red[i] = true;
    }
    int first = -1, last = -1;
    for (int i = 0; i < x->nd; i++) {
        if (red[i]) {
            if (first < 0) first = i;
            last = i;
        }
    }
    int64_t outer = 1, mid = 1, inner = 1, od[SP_OXG_MAX_DIMS];
    int ond = 0;
    for (int i = 0; i < x->nd; i++) {
        if (red[i] != (i >= first && i <= last && first >= 0)) {
            return fail(e, "reducing axes that are not adjacent is not supported on the GPU");
        }
        if (first < 0 || i < first) outer *= x->dims[i];
        else if (i <= last) mid *= x->dims[i];
        else inner *= x->dims[i];
        if (!red[i]) od[ond++] = x->dims[i];
        else if (n->i[9]) od[ond++] = 1;
    }
    if (mid == 0 && n->sub == SP_OXG_RMAX) return fail(e, "ReduceMax over an empty axis");
    if (out_alloc(e, n->out[0], e->fdt, ond, od)) return -1;
    if (outer * inner == 0) return 0;
    return oxd_reduce(e->d, e->fdt, n->sub, x->p, e->v[n->out[0]].p, outer, mid, inner) ? dev_fail(e) : 0;
}

static int
run_layernorm(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0), *s = in_val(e, 1), *b = n->n_in > 2 ? in_val(e, 2) : NULL;
    int axis = 0;
    if (norm_axis(e, n->i[0], x->nd, &axis)) return -1;
    int64_t rows = 1, cols = 1;
    for (int i = 0; i < x->nd; i++) *(i < axis ? &rows : &cols) *= x->dims[i];
    int64_t ns = numel(s), nb = b ? numel(b) : 0;
    if ((ns != cols && ns != 1) || (b && nb != cols && nb != 1)) {
        return fail(e, "Scale/B have %lld/%lld values for %lld normalized elements", (long long)ns, (long long)nb, (long long)cols);
    }
    if (out_alloc(e, n->out[0], e->fdt, x->nd, x->dims)) return -1;
    /* Mean and InvStdDev: the input's shape with the normalized dimensions 1 */
    int64_t sd[SP_OXG_MAX_DIMS];
    for (int i = 0; i < x->nd; i++) sd[i] = i < axis ? x->dims[i] : 1;
    for (int k = 1; k < n->n_out; k++) {
        if (out_alloc(e, n->out[k], e->fdt, x->nd, sd)) return -1;
    }
    if (rows * cols == 0) return 0;
    return oxd_layernorm(e->d, e->fdt, x->p, s->p, ns == 1 ? 0 : 1, b ? b->p : NULL, nb == 1 ? 0 : 1, e->v[n->out[0]].p,
                         n->n_out > 1 ? e->v[n->out[1]].p : NULL, n->n_out > 2 ? e->v[n->out[2]].p : NULL, rows, cols,
                         n->f[0]) ? dev_fail(e) : 0;
}

static int
run_gather(exec_t *e)
{
    const sp_oxg_node_t *n = e->node;
    const xval_t *x = in_val(e, 0), *ix = in_val(e, 1);
    int axis = 0;
    if (x->nd == 0) return fail(e, "Gather from a scalar");
    if (norm_axis(e, n->i[0], x->nd, &axis)) return -1;
    if (x->nd - 1 + ix->nd > SP_OXG_MAX_DIMS) return fail(e, "result of rank %d", x->nd - 1 + ix->nd);
    int64_t ni = numel(ix), na = x->dims[axis], outer = 1, inner = 1;
    for (int i = 0; i < axis; i++) outer *= x->dims[i];
    for (int i = axis + 1; i < x->nd; i++) inner *= x->dims[i];
    if ((size_t)ni > e->host_idx_cap) {
        int64_t *p = realloc(e->host_idx, (size_t)ni * 8);
        if (p == NULL) return fail(e, "out of host memory");
        e->host_idx = p;
        e->host_idx_cap = (size_t)ni;
    }
    for (int64_t i = 0; i < ni; i++) {
        int64_t v = ix->host[i];
        if (v < -na || v >= na) return fail(e, "index %lld out of range [%lld, %lld)", (long long)v, (long long)-na, (long long)na);
        e->host_idx[i] = v < 0 ? v + na : v;
    }
    int64_t od[SP_OXG_MAX_DIMS];
    int ond = 0;
    for (int i = 0; i < axis; i++) od[ond++] = x->dims[i];
    for (int i = 0; i < ix->nd; i++) od[ond++] = ix->dims[i];
    for (int i = axis + 1; i < x->nd; i++) od[ond++] = x->dims[i];
    if (out_alloc(e, n->out[0], x->dt, ond, od)) return -1;
    if (ni * outer * inner == 0) return 0;
    void *didx;
    size_t cap;
    if (pool_get(e, (size_t)ni * 8, &didx, &cap)) return -1;
    int rc = oxd_h2d(e->d, didx, e->host_idx, (size_t)ni * 8) ||
             oxd_gather(e->d, dt_size(x->dt), x->p, didx, e->v[n->out[0]].p, outer, na, inner, ni) ? dev_fail(e) : 0;
    /* the copy is stream-ordered before the gather; later pool users come after it too */
    pool_put(e, didx, cap);
    return rc;
}

static int
run_node(exec_t *e, int32_t k)
{
    switch (e->node->op) {
    case SP_OXG_CONV: return run_conv(e, k);
    case SP_OXG_POOL: return run_pool(e);
    case SP_OXG_GLOBAL_POOL: return run_global_pool(e);
    case SP_OXG_BATCHNORM: return run_bn(e, k);
    case SP_OXG_GEMM: return run_gemm(e);
    case SP_OXG_MATMUL: return run_matmul(e);
    case SP_OXG_UNARY: return run_unary(e);
    case SP_OXG_BINARY: return run_binary(e);
    case SP_OXG_VIEW: return run_view(e);
    case SP_OXG_TRANSPOSE: return run_transpose(e);
    case SP_OXG_CONCAT: return run_concat(e);
    case SP_OXG_SOFTMAX: return run_softmax(e);
    case SP_OXG_REDUCE: return run_reduce(e);
    case SP_OXG_LAYERNORM: return run_layernorm(e);
    case SP_OXG_GATHER: return run_gather(e);
    default: return fail(e, "operator code %d", (int)e->node->op);
    }
}

/* An input from the host: FLOAT goes up as FP32 and is converted on the device for FP16. */
static int
upload_input(exec_t *e, const sp_oxg_io_t *io)
{
    if (io->value < 0 || io->value >= e->g.n_values || e->vdesc[io->value].kind != SP_OXG_INPUT) {
        return fail(e, "value %d is not a graph input", (int)io->value);
    }
    if (io->dtype != e->vdesc[io->value].dtype || io->nd < 0 || io->nd > SP_OXG_MAX_DIMS) {
        return fail(e, "input %d: type %d of rank %d", (int)io->value, (int)io->dtype, (int)io->nd);
    }
    xval_t *x = &e->v[io->value];
    int dt = io->dtype == SP_OXG_INT64 ? OXD_I64 : e->fdt;
    if (out_alloc(e, io->value, dt, io->nd, io->dims)) return -1;
    int64_t n = numel(x);
    size_t hb = (size_t)n * (io->dtype == SP_OXG_INT64 ? 8 : 4);
    if (hb != io->bytes) return fail(e, "input %d: %zu bytes for %lld elements", (int)io->value, io->bytes, (long long)n);
    x->host = io->dtype == SP_OXG_INT64 ? io->data : NULL;
    if (n == 0) return 0;
    if (dt != OXD_F16) return oxd_h2d(e->d, x->p, io->data, hb) ? dev_fail(e) : 0;
    void *tmp;
    size_t cap;
    if (pool_get(e, hb, &tmp, &cap)) return -1;
    int rc = oxd_h2d(e->d, tmp, io->data, hb) || oxd_convert(e->d, OXD_F16, x->p, OXD_F32, tmp, n) ? dev_fail(e) : 0;
    pool_put(e, tmp, cap);
    return rc;
}

static int
download_output(exec_t *e, sp_oxg_io_t *io, void *(*alloc)(size_t))
{
    if (io->value < 0 || io->value >= e->g.n_values) return fail(e, "output value %d", (int)io->value);
    const xval_t *x = &e->v[io->value];
    if (x->p == NULL && e->vdesc[io->value].kind != SP_OXG_CONST) return fail(e, "output %d was not computed", (int)io->value);
    int64_t n = numel(x);
    io->dtype = x->dt == OXD_I64 ? SP_OXG_INT64 : SP_OXG_FLOAT;
    io->nd = x->nd;
    memcpy(io->dims, x->dims, sizeof io->dims);
    io->bytes = (size_t)n * (x->dt == OXD_I64 ? 8 : 4);
    io->data = alloc(io->bytes ? io->bytes : 1);
    if (io->data == NULL) return fail(e, "out of host memory for %zu bytes", io->bytes);
    if (n == 0) return 0;
    if (x->dt != OXD_F16) return oxd_d2h(e->d, io->data, x->p, io->bytes) ? dev_fail(e) : 0;
    void *tmp;
    size_t cap;
    if (pool_get(e, io->bytes, &tmp, &cap)) return -1;
    int rc = oxd_convert(e->d, OXD_F32, tmp, OXD_F16, x->p, n) || oxd_d2h(e->d, io->data, tmp, io->bytes) ? dev_fail(e) : 0;
    pool_put(e, tmp, cap);
    return rc;
}

static int
exec_run(void *p, const sp_oxg_io_t *in, int32_t n_in, sp_oxg_io_t *out, int32_t n_out, void *(*alloc)(size_t),
         char *err, size_t err_len)
{
    exec_t *e = p;
    e->err = err;
    e->err_len = err_len;
    e->node = NULL;
    int rc = -1;
    for (int32_t i = 0; i < n_out; i++) out[i].data = NULL;
    if (oxd_bind(e->d)) return dev_fail(e);
    for (int32_t i = 0; i < n_in; i++) {
        if (upload_input(e, &in[i])) goto done;
    }
    for (int32_t k = 0; k < e->g.n_nodes; k++) {
        e->node = &e->ndesc[k];
        for (int i = 0; i < e->node->n_in; i++) {
            int32_t v = e->node->in[i];
            if (v >= 0 && e->v[v].p == NULL && !(e->vdesc[v].kind == SP_OXG_CONST)) {
                fail(e, "input %d has no value (a graph input not given?)", i);
                goto done;
            }
        }
        if (run_node(e, k)) goto done;
        for (int i = 0; i < e->node->n_in + e->node->n_out; i++) {
            int32_t v = i < e->node->n_in ? e->node->in[i] : e->node->out[i - e->node->n_in];
            if (v >= 0 && !e->vdesc[v].is_output && e->vdesc[v].last_use <= k) release(e, v);
        }
    }
    e->node = NULL;
    for (int32_t i = 0; i < n_out; i++) {
        if (download_output(e, &out[i], alloc)) goto done;
    }
    rc = 0;
done:
    e->node = NULL;
    for (int32_t v = 0; v < e->g.n_values; v++) {
        release(e, v);
        if (e->vdesc[v].kind == SP_OXG_INPUT) e->v[v].host = NULL;
    }
    return rc;
}

static uint64_t
exec_device_bytes(void *p)
{
    const exec_t *e = p;
    return e->const_bytes + e->pool_bytes + e->ws_cap;
}

static int
exec_probe(int32_t device, char *err, size_t err_len)
{
    return oxd_probe(device, err, err_len);
}

static const sp_oxg_api_t api = {
    .abi_version = SP_OXG_ABI_VERSION,
    .struct_size = sizeof(sp_oxg_api_t),
    .probe = exec_probe,
    .load = exec_load,
    .run = exec_run,
    .device_bytes = exec_device_bytes,
    .unload = exec_free,
};

__attribute__((visibility("default"))) const sp_oxg_api_t *
sp_oxg_get_api(uint32_t abi_version)
{
    return abi_version == SP_OXG_ABI_VERSION ? &api : NULL;
}
