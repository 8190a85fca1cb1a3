/*
 * backends/onnx/optimize.c - `sampan optimize` (the entry sp_onnx_optimize_main, which the
 * sampan binary dlopens: the binary never links the ONNX protobuf tables).
 *
 * From model.onnx it writes, beside it:
 *   model_fp16.onnx  every FLOAT initializer of 16+ elements stored as FLOAT16 and widened by a
 *                    Cast node (valid ONNX for any runtime; this one folds the Cast at load, so
 *                    the CPU computes in FP32 from FP16-rounded weights at half the file size).
 *   model_int8.onnx  QDQ form: weights of Conv, MatMul and Gemm as INT8 constants, symmetric,
 *                    one scale per output channel, behind DequantizeLinear; each of those
 *                    operators' activation input behind QuantizeLinear -> DequantizeLinear with a
 *                    scale calibrated on the user's data (UINT8 after non-negative activations,
 *                    else symmetric INT8). qdq.c fuses both into integer Conv/MatMul/Gemm.
 * Calibration: the FP32 graph runs over a .npy file of inputs (first dimension = samples);
 * for each quantized activation a 2048-bin histogram of |x| over [0, max|x|] gives the
 * clipping threshold T: the given percentile of |x| (default 99.99), the KL-divergence
 * minimum of the quantized against the reference distribution ("entropy", as TensorRT's
 * calibrator), or the maximum.
 * With --eval X.npy (and --labels y.npy), the FP32, FP16 and INT8 models run in this process
 * on the held-out set, interleaved repeats timed with the same threads: time per batch,
 * speed-up, top-1 agreement with FP32 and accuracy.
 *
 * Threads: single-threaded except the GEMMs (--threads). Memory: whole .npy files in memory.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "dnnl.h"
#include "ox.h"

#define HBINS 2048

static int
errf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#include <stdarg.h>
static int
errf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- .npy (version 1/2, little-endian f4, i8 or i4, C order) ---- */

typedef struct npy {
    int32_t dtype; /* OX_FLOAT, OX_INT64, OX_INT32 */
    int32_t nd;
    int64_t dims[OX_MAX_DIMS];
    int64_t numel;
    void *data;
} npy_t;

static int
npy_read(const char *path, npy_t *a, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (f == NULL) return errf(err, err_len, "%s: %s", path, strerror(errno));
    unsigned char h[12];
    int rc = -1;
    char *hdr = NULL;
    if (fread(h, 1, 10, f) != 10 || memcmp(h, "\x93NUMPY", 6) != 0) {
        errf(err, err_len, "%s: not a .npy file", path);
        goto done;
    }
    size_t hl = h[8] | (size_t)h[9] << 8;
    if (h[6] >= 2) {
        if (fread(h + 10, 1, 2, f) != 2) goto bad;
        hl |= (size_t)h[10] << 16 | (size_t)h[11] << 24;
    }
    if (hl > 1 << 20) goto bad;
    hdr = calloc(1, hl + 1);
    if (hdr == NULL || fread(hdr, 1, hl, f) != hl) goto bad;
    if (strstr(hdr, "'fortran_order': False") == NULL) {
        errf(err, err_len, "%s: Fortran-ordered arrays are not read (save with C order)", path);
        goto done;
    }
    const char *d = strstr(hdr, "'descr':");
    if (d && strstr(d, "'<f4'") == d + 9) a->dtype = OX_FLOAT;
    else if (d && strstr(d, "'<i8'") == d + 9) a->dtype = OX_INT64;
    else if (d && strstr(d, "'<i4'") == d + 9) a->dtype = OX_INT32;
    else {
        errf(err, err_len, "%s: element type must be float32, int64 or int32 (little-endian)", path);
        goto done;
    }
    const char *s = strstr(hdr, "'shape':");
    s = s ? strchr(s, '(') : NULL;
    if (s == NULL) goto bad;
    s++;
    a->numel = 1;
    while (*s && *s != ')') {
        while (*s == ' ' || *s == ',') s++;
        if (*s == ')') break;
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || v > (1LL << 34) || a->nd >= OX_MAX_DIMS) goto bad;
        a->dims[a->nd++] = v;
        a->numel *= v;
        if (a->numel > (1LL << 34)) goto bad;
        s = end;
    }
    size_t es = sp_ox_dtype_size(a->dtype), bytes = (size_t)a->numel * es;
    a->data = malloc(bytes ? bytes : 1);
    if (a->data == NULL || fread(a->data, 1, bytes, f) != bytes) {
        errf(err, err_len, "%s: shorter than its header says", path);
        goto done;
    }
    rc = 0;
    goto done;
bad:
    errf(err, err_len, "%s: malformed .npy header", path);
done:
    if (rc) {
        free(a->data);
        a->data = NULL;
    }
    free(hdr);
    fclose(f);
    return rc;
}

/* ---- running a graph on rows of an array ---- */

typedef struct model {
    sp_ox_graph_t *g;
    sp_ox_run_t r;
    char err[1024];
} model_t;

typedef struct act {
    char *name;
    int32_t value;      /* in the FP32 graph */
    float amax, amin;
    uint64_t hist[HBINS];
    float thr;
    bool seen;          /* written by a calibration run */
} act_t;

static int
model_open(model_t *m, const char *path, const char *dir, int threads, act_t *keep, int n_keep, char *err,
           size_t err_len)
{
    memset(m, 0, sizeof *m);
    if (sp_ox_graph_load(path, dir, &m->g, err, err_len)) return -1;
    /* calibration: the activations are kept as outputs before the graph is prepared, so that no
     * fusion writes over them or skips them (a projection residual is an Add's input, which the
     * Conv+Add fusion would never write) */
    for (int a = 0; a < n_keep; a++) {
        keep[a].value = -1;
        for (int32_t v = 0; v < m->g->n_values; v++) {
            if (m->g->values[v].name && strcmp(m->g->values[v].name, keep[a].name) == 0) {
                keep[a].value = v;
                if (!m->g->values[v].is_const) m->g->values[v].is_output = true;
                break;
            }
        }
    }
    if (sp_ox_graph_prepare(m->g, err, err_len)) {
        char tmp[900];
        snprintf(tmp, sizeof tmp, "%s", err);
        errf(err, err_len, "%s: %s", path, tmp);
        sp_ox_graph_free(m->g);
        m->g = NULL;
        return -1;
    }
    if (m->g->n_inputs != 1 || m->g->values[m->g->inputs[0]].t.dtype != OX_FLOAT) {
        errf(err, err_len, "%s: optimize takes models with one FLOAT input (this one has %d inputs)",
             path, m->g->n_inputs);
        sp_ox_graph_free(m->g);
        m->g = NULL;
        return -1;
    }
    m->r.g = m->g;
    m->r.n_threads = threads;
    m->r.err = m->err;
    m->r.err_len = sizeof m->err;
    return 0;
}

static void
model_close(model_t *m)
{
    if (m->g == NULL) return;
    sp_ox_run_free(&m->r);
    sp_ox_graph_free(m->g);
    m->g = NULL;
}

/* Run rows [r0, r0 + n) of x; outputs stay set until sp_ox_run_release_all. */
static int
model_run(model_t *m, const npy_t *x, int64_t r0, int64_t n, char *err, size_t err_len)
{
    sp_ox_value_t *v = &m->g->values[m->g->inputs[0]];
    int64_t dims[OX_MAX_DIMS], per = x->dims[0] ? x->numel / x->dims[0] : 0;
    for (int i = 0; i < x->nd; i++) dims[i] = x->dims[i];
    dims[0] = n;
    if (sp_ox_out(&m->r, &v->t, OX_FLOAT, x->nd, dims)) return errf(err, err_len, "%s", m->err);
    memcpy(v->t.data, (const float *)x->data + r0 * per, (size_t)(n * per) * sizeof(float));
    if (sp_ox_graph_run(&m->r)) {
        sp_ox_run_release_all(&m->r);
        return errf(err, err_len, "%s", m->err);
    }
    return 0;
}

/* The batch a model takes: its input's first dimension when fixed, else up to `want`. */
static int64_t
model_batch(const model_t *m, int64_t want)
{
    const Onnx__GraphProto *gp = m->g->proto->graph;
    const char *name = m->g->values[m->g->inputs[0]].name;
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (strcmp(vi->name, name) != 0 || !vi->type || !vi->type->tensor_type || !vi->type->tensor_type->shape) continue;
        const Onnx__TensorShapeProto *sh = vi->type->tensor_type->shape;
        if (sh->n_dim > 0 && sh->dim[0]->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
            sh->dim[0]->dim_value > 0) return sh->dim[0]->dim_value;
    }
    return want;
}

/* ---- protobuf building ---- */

static char *
xstrdup(const char *s)
{
    char *p = strdup(s ? s : "");
    if (p == NULL) abort(); /* a CLI out of memory on a few bytes: nothing to recover */
    return p;
}

static void *
xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (p == NULL) abort();
    return p;
}

static char *
cat2(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = xmalloc(la + lb + 1);
    memcpy(p, a, la);
    memcpy(p + la, b, lb + 1);
    return p;
}

static Onnx__TensorProto *
new_tensor(const char *name, int32_t dtype, int nd, const int64_t *dims, const void *data, size_t bytes)
{
    Onnx__TensorProto *t = xmalloc(sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = xstrdup(name);
    t->n_dims = (size_t)nd;
    t->dims = xmalloc((size_t)(nd ? nd : 1) * sizeof *t->dims);
    for (int i = 0; i < nd; i++) t->dims[i] = dims[i];
    t->has_data_type = 1;
    t->data_type = dtype;
    t->has_raw_data = 1;
    t->raw_data.len = bytes;
    t->raw_data.data = xmalloc(bytes);
    memcpy(t->raw_data.data, data, bytes);
    return t;
}

static Onnx__NodeProto *
new_node(const char *op, const char *name, int n_in, const char *const *in, const char *out)
{
    Onnx__NodeProto *n = xmalloc(sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = xstrdup(op);
    n->name = xstrdup(name);
    n->n_input = (size_t)n_in;
    n->input = xmalloc((size_t)n_in * sizeof *n->input);
    for (int i = 0; i < n_in; i++) n->input[i] = xstrdup(in[i]);
    n->n_output = 1;
    n->output = xmalloc(sizeof *n->output);
    n->output[0] = xstrdup(out);
    return n;
}

static void
add_attr_i(Onnx__NodeProto *n, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = xmalloc(sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = xstrdup(name);
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->has_i = 1;
    a->i = v;
    Onnx__AttributeProto **na = realloc(n->attribute, (n->n_attribute + 1) * sizeof *na);
    if (na == NULL) abort();
    n->attribute = na;
    n->attribute[n->n_attribute++] = a;
}

typedef struct nodelist {
    Onnx__NodeProto **v;
    size_t n, cap;
} nodelist_t;

static void
push_node(nodelist_t *l, Onnx__NodeProto *n)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        Onnx__NodeProto **nv = realloc(l->v, l->cap * sizeof *nv);
        if (nv == NULL) abort();
        l->v = nv;
    }
    l->v[l->n++] = n;
}

static void
push_init(Onnx__GraphProto *gp, Onnx__TensorProto *t)
{
    Onnx__TensorProto **nv = realloc(gp->initializer, (gp->n_initializer + 1) * sizeof *nv);
    if (nv == NULL) abort();
    gp->initializer = nv;
    gp->initializer[gp->n_initializer++] = t;
}

static bool
is_graph_input(const Onnx__GraphProto *gp, const char *name)
{
    for (size_t i = 0; i < gp->n_input; i++) {
        if (strcmp(gp->input[i]->name, name) == 0) return true;
    }
    return false;
}

static Onnx__TensorProto *
find_init(const Onnx__GraphProto *gp, const char *name, size_t *idx)
{
    for (size_t i = 0; i < gp->n_initializer; i++) {
        if (gp->initializer[i]->name && strcmp(gp->initializer[i]->name, name) == 0) {
            if (idx) *idx = i;
            return gp->initializer[i];
        }
    }
    return NULL;
}

static Onnx__ModelProto *
proto_read(const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        errf(err, err_len, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    uint8_t *buf = NULL;
    Onnx__ModelProto *mp = NULL;
    if (fstat(fileno(f), &st) == 0 && st.st_size > 0 && (buf = malloc((size_t)st.st_size)) != NULL &&
        fread(buf, 1, (size_t)st.st_size, f) == (size_t)st.st_size) {
        mp = onnx__model_proto__unpack(NULL, (size_t)st.st_size, buf);
    }
    if (mp == NULL) errf(err, err_len, "%s: cannot read the model", path);
    free(buf);
    fclose(f);
    return mp;
}

static int
proto_write(const Onnx__ModelProto *mp, const char *path, size_t *bytes, char *err, size_t err_len)
{
    size_t n = onnx__model_proto__get_packed_size(mp);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL) return errf(err, err_len, "out of memory");
    onnx__model_proto__pack(mp, buf);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(buf);
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return errf(err, err_len, "%s: %s", path, strerror(errno));
    }
    *bytes = n;
    return 0;
}

/* A FLOAT initializer's values (raw_data or float_data), NULL otherwise. */
static const float *
init_floats(const Onnx__TensorProto *t, int64_t *numel)
{
    if (!t->has_data_type || t->data_type != OX_FLOAT || t->has_data_location) return NULL;
    int64_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++) n *= t->dims[i];
    *numel = n;
    if (t->has_raw_data) return t->raw_data.len == (size_t)n * 4 ? (const float *)t->raw_data.data : NULL;
    return t->n_float_data == (size_t)n ? t->float_data : NULL;
}

/* ---- FP16 ---- */

static int
write_fp16(const char *in, const char *out, size_t *bytes, int64_t *n_conv, int64_t *n_inf, char *err,
           size_t err_len)
{
    Onnx__ModelProto *mp = proto_read(in, err, err_len);
    if (mp == NULL) return -1;
    Onnx__GraphProto *gp = mp->graph;
    nodelist_t nl = {0};
    *n_conv = *n_inf = 0;
    for (size_t i = 0; i < gp->n_initializer; i++) {
        Onnx__TensorProto *t = gp->initializer[i];
        int64_t numel;
        const float *v = init_floats(t, &numel);
        if (v == NULL || numel < 16 || is_graph_input(gp, t->name)) continue;
        uint16_t *h = xmalloc((size_t)numel * 2);
        for (int64_t k = 0; k < numel; k++) {
            h[k] = sp_ox_float_to_half(v[k]);
            if ((h[k] & 0x7c00) == 0x7c00 && isfinite(v[k])) {
                h[k] = (uint16_t)((h[k] & 0x8000) | 0x7bff); /* saturate to +-65504 */
                (*n_inf)++;
            }
        }
        char *orig = t->name;
        Onnx__TensorProto *nt = new_tensor("", OX_FLOAT16, (int)t->n_dims, t->dims, h, (size_t)numel * 2);
        free(nt->name);
        nt->name = cat2(orig, "__fp16");
        const char *cin[1] = {nt->name};
        Onnx__NodeProto *cast = new_node("Cast", nt->name, 1, cin, orig);
        add_attr_i(cast, "to", OX_FLOAT);
        push_node(&nl, cast);
        onnx__tensor_proto__free_unpacked(t, NULL);
        gp->initializer[i] = nt;
        free(h);
        (*n_conv)++;
    }
    for (size_t i = 0; i < gp->n_node; i++) push_node(&nl, gp->node[i]);
    free(gp->node);
    gp->node = nl.v;
    gp->n_node = nl.n;
    int rc = proto_write(mp, out, bytes, err, err_len);
    onnx__model_proto__free_unpacked(mp, NULL);
    return rc;
}

/* ---- INT8: which nodes, calibration ---- */

typedef struct qnode {
    size_t node;        /* index in graph.node */
    int64_t waxis;      /* weight axis of the output channels */
} qnode_t;


typedef struct respair {
    size_t node, add; /* the earlier branch's last node (Conv or its BatchNormalization), the Add */
    int side, act;    /* which Add input; its activation */
} respair_t;

static int64_t
node_int(const Onnx__NodeProto *n, const char *name, int64_t def)
{
    for (size_t i = 0; i < n->n_attribute; i++) {
        if (strcmp(n->attribute[i]->name, name) == 0) return n->attribute[i]->i;
    }
    return def;
}

static float
node_float(const Onnx__NodeProto *n, const char *name, float def)
{
    for (size_t i = 0; i < n->n_attribute; i++) {
        if (strcmp(n->attribute[i]->name, name) == 0) return n->attribute[i]->f;
    }
    return def;
}

/* Conv, MatMul and Gemm with a constant FLOAT weight the runtime's QDQ fusion takes. */
static bool
quantizable(const Onnx__GraphProto *gp, const Onnx__NodeProto *n, int64_t *waxis)
{
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0) return false;
    if (n->n_input < 2 || n->n_output != 1 || !n->input[0][0]) return false;
    size_t wi;
    const Onnx__TensorProto *w = find_init(gp, n->input[1], &wi);
    int64_t numel;
    if (w == NULL || init_floats(w, &numel) == NULL || is_graph_input(gp, w->name)) return false;
    if (strcmp(n->op_type, "Conv") == 0) {
        *waxis = 0;
        return w->n_dims == 3 || w->n_dims == 4;
    }
    if (w->n_dims != 2) return false;
    if (strcmp(n->op_type, "MatMul") == 0) {
        *waxis = 1;
        return true;
    }
    if (strcmp(n->op_type, "Gemm") == 0) {
        if (node_int(n, "transA", 0) || node_float(n, "alpha", 1.0f) != 1.0f) return false;
        if (n->n_input > 2 && n->input[2][0] && node_float(n, "beta", 1.0f) != 1.0f) return false;
        *waxis = node_int(n, "transB", 0) ? 0 : 1;
        return true;
    }
    return false;
}

static double
kl_threshold(const uint64_t *hist, int nq)
{
    /* TensorRT's entropy calibration: for each candidate i (bins kept), the reference P is
     * hist[0..i) with everything beyond folded into its last bin; the candidate Q is hist[0..i)
     * merged into nq levels and spread back evenly over each level's nonzero bins; the i of
     * least KL(P || Q) wins (a bin where P > 0 and Q = 0 counts with Q = 1e-12). Returns i. */
    double best = INFINITY;
    int best_i = HBINS;
    double *q = malloc(HBINS * sizeof *q), *suffix = malloc((HBINS + 1) * sizeof *suffix);
    if (!q || !suffix) {
        free(q);
        free(suffix);
        return HBINS;
    }
    suffix[HBINS] = 0;
    for (int k = HBINS - 1; k >= 0; k--) suffix[k] = suffix[k + 1] + (double)hist[k];
    for (int i = nq; i <= HBINS; i++) {
        double psum = suffix[0];
        if (psum <= 0) break;
        for (int j = 0; j < nq; j++) {
            int lo = (int)((int64_t)j * i / nq), hi = (int)((int64_t)(j + 1) * i / nq);
            double s = 0;
            int nz = 0;
            for (int k = lo; k < hi; k++) {
                s += (double)hist[k];
                nz += hist[k] != 0;
            }
            for (int k = lo; k < hi; k++) q[k] = hist[k] && nz ? s / nz : 0;
        }
        double qsum = suffix[0] - suffix[i], kl = 0;
        for (int k = 0; k < i; k++) {
            double pk = (double)hist[k] + (k == i - 1 ? suffix[i] : 0);
            if (pk <= 0) continue;
            double pp = pk / psum, qq = q[k] > 0 && qsum > 0 ? q[k] / qsum : 1e-12;
            kl += pp * log(pp / qq);
        }
        if (kl < best) {
            best = kl;
            best_i = i;
        }
    }
    free(q);
    free(suffix);
    return best_i;
}

static void
hist_add(act_t *a, const float *x, int64_t n)
{
    if (!(a->amax > 0)) return;
    double w = a->amax / HBINS;
    for (int64_t i = 0; i < n; i++) {
        double v = fabs((double)x[i]);
        if (!(v == v)) continue;
        int64_t b = (int64_t)(v / w);
        a->hist[b >= HBINS ? HBINS - 1 : b]++;
    }
}

typedef struct opts {
    const char *model, *out_fp16, *out_int8, *calib, *eval, *labels;
    const char *method;
    double percentile;
    int threads, repeat, batch;
    int weight_bits; /* 8, or 7 (weights in [-63, 63]) */
    bool fp16, int8;
} opts_t;

static int
calibrate(const opts_t *o, const char *dir, act_t *acts, int n_acts, const npy_t *cx, char *err, size_t err_len)
{
    model_t m;
    if (model_open(&m, o->model, dir, o->threads, acts, n_acts, err, err_len)) return -1;
    int rc = -1;
    for (int a = 0; a < n_acts; a++) {
        if (acts[a].value < 0) {
            errf(err, err_len, "calibration: activation '%s' is not computed by the prepared graph", acts[a].name);
            goto done;
        }
        acts[a].amax = 0;
        acts[a].amin = 0;
    }
    int64_t rows = cx->dims[0], b = model_batch(&m, o->batch);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t r0 = 0; r0 < rows; r0 += b) {
            int64_t n = rows - r0 < b ? rows - r0 : b;
            if (model_batch(&m, 0) > 0 && n != b) break; /* a fixed batch: whole batches only */
            if (model_run(&m, cx, r0, n, err, err_len)) goto done;
            for (int a = 0; a < n_acts; a++) {
                const sp_ox_tensor_t *t = &m.g->values[acts[a].value].t;
                if (t->data == NULL || t->dtype != OX_FLOAT) continue;
                acts[a].seen = true;
                const float *x = t->data;
                int64_t cnt = sp_ox_numel(t);
                if (pass == 0) {
                    for (int64_t i = 0; i < cnt; i++) {
                        if (x[i] > acts[a].amax) acts[a].amax = x[i];
                        if (x[i] < acts[a].amin) acts[a].amin = x[i];
                    }
                } else {
                    hist_add(&acts[a], x, cnt);
                }
            }
            sp_ox_run_release_all(&m.r);
        }
        if (pass == 0) {
            for (int a = 0; a < n_acts; a++) {
                if (!acts[a].seen) {
                    errf(err, err_len, "calibration: activation '%s' was not computed as FLOAT by any run",
                         acts[a].name);
                    goto done;
                }
                float mx = fmaxf(acts[a].amax, -acts[a].amin);
                acts[a].amax = mx; /* the histogram range: [0, max|x|] */
                acts[a].amin = acts[a].amin < 0 ? -1.0f : 0.0f; /* only the sign matters from here */
            }
        }
    }
    for (int a = 0; a < n_acts; a++) {
        act_t *ac = &acts[a];
        double w = ac->amax / HBINS, thr = ac->amax;
        uint64_t total = 0;
        for (int i = 0; i < HBINS; i++) total += ac->hist[i];
        if (total && strcmp(o->method, "percentile") == 0) {
            uint64_t want = (uint64_t)ceil(o->percentile / 100.0 * (double)total), cum = 0;
            for (int i = 0; i < HBINS; i++) {
                cum += ac->hist[i];
                if (cum >= want) {
                    thr = (i + 1) * w;
                    break;
                }
            }
        } else if (total && strcmp(o->method, "entropy") == 0) {
            thr = kl_threshold(ac->hist, ac->amin < 0 ? 128 : 256) * w;
        }
        ac->thr = thr > 0 ? (float)thr : 1.0f;
    }
    rc = 0;
done:
    model_close(&m);
    return rc;
}

/* Readers of value v: node inputs plus graph outputs. */
static size_t
readers_of(const Onnx__GraphProto *gp, const char *v)
{
    size_t cnt = 0;
    for (size_t i = 0; i < gp->n_node; i++) {
        for (size_t k = 0; k < gp->node[i]->n_input; k++) cnt += strcmp(gp->node[i]->input[k], v) == 0;
    }
    for (size_t i = 0; i < gp->n_output; i++) cnt += strcmp(gp->output[i]->name, v) == 0;
    return cnt;
}

static long
producer_idx(const Onnx__GraphProto *gp, const char *v)
{
    for (size_t i = 0; i < gp->n_node; i++) {
        if (gp->node[i]->n_output >= 1 && strcmp(gp->node[i]->output[0], v) == 0) return (long)i;
    }
    return -1;
}

/* The node making v, read only once, when it is a quantized Conv or a BatchNormalization of one
 * (a Conv output read only by it): the branch of a residual Add the runtime fuses; else -1. */
static long
conv_branch(const Onnx__GraphProto *gp, const char *v, const qnode_t *qn, int nq)
{
    long p = producer_idx(gp, v);
    if (p < 0 || readers_of(gp, v) != 1) return -1;
    long c = p;
    if (strcmp(gp->node[p]->op_type, "BatchNormalization") == 0) {
        if (gp->node[p]->n_input < 1 || readers_of(gp, gp->node[p]->input[0]) != 1) return -1;
        c = producer_idx(gp, gp->node[p]->input[0]);
    }
    if (c < 0 || strcmp(gp->node[c]->op_type, "Conv") != 0) return -1;
    for (int q = 0; q < nq; q++) {
        if (qn[q].node == (size_t)c) return p;
    }
    return -1;
}

/* Q -> DQ of activation a (its calibrated threshold; u8 when it was never negative); returns
 * the DQ output's name. A signed activation is symmetric INT8, or with u8_signed (--weight-bits
 * 7) UINT8 with zero point 128 and the same step: an s8 source would make oneDNN halve the
 * weights on CPUs without VNNI, a u8 one with 7-bit weights is exact there (dnnl.c isa_vnni). */
static char *
emit_pair(Onnx__GraphProto *gp, nodelist_t *nl, const act_t *a, bool u8_signed)
{
    bool nonneg = a->amin >= 0, u8 = nonneg || u8_signed;
    float s = a->thr / (nonneg ? 255.0f : 127.0f);
    int64_t one = 1;
    uint8_t z = nonneg ? 0 : u8 ? 128 : 0;
    char *ns = cat2(a->name, "__act_scale"), *nz = cat2(a->name, "__act_zp");
    char *nqv = cat2(a->name, "__q"), *dq = cat2(a->name, "__dq");
    push_init(gp, new_tensor(ns, OX_FLOAT, 0, &one, &s, 4));
    push_init(gp, new_tensor(nz, u8 ? OX_UINT8 : OX_INT8, 0, &one, &z, 1));
    const char *qin[3] = {a->name, ns, nz}, *dqin[3] = {nqv, ns, nz};
    push_node(nl, new_node("QuantizeLinear", nqv, 3, qin, nqv));
    push_node(nl, new_node("DequantizeLinear", dq, 3, dqin, dq));
    free(ns); free(nz); free(nqv);
    return dq;
}

static int
write_int8(const opts_t *o, const char *dir, const npy_t *cx, size_t *bytes, int *n_q, int *n_acts_out,
           char *err, size_t err_len)
{
    Onnx__ModelProto *mp = proto_read(o->model, err, err_len);
    if (mp == NULL) return -1;
    Onnx__GraphProto *gp = mp->graph;
    int rc = -1;
    qnode_t *qn = xmalloc((gp->n_node + 1) * sizeof *qn);
    act_t *acts = xmalloc((2 * gp->n_node + 1) * sizeof *acts);
    respair_t *rp = xmalloc((gp->n_node + 1) * sizeof *rp);
    int nq = 0, na = 0, nr = 0;
    nodelist_t nl = {0};
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const char *d = mp->opset_import[i]->domain;
        if ((!d || !d[0] || strcmp(d, "ai.onnx") == 0) && mp->opset_import[i]->version < 13) {
            errf(err, err_len, "%s: opset %lld: per-channel DequantizeLinear needs opset 13 or later "
                 "(re-export the model with opset >= 13)", o->model, (long long)mp->opset_import[i]->version);
            goto done;
        }
    }
    for (size_t i = 0; i < gp->n_node; i++) {
        int64_t ax;
        if (!quantizable(gp, gp->node[i], &ax)) continue;
        qn[nq++] = (qnode_t){i, ax};
        const char *x = gp->node[i]->input[0];
        int k = 0;
        while (k < na && strcmp(acts[k].name, x) != 0) k++;
        if (k == na) acts[na++].name = xstrdup(gp->node[i]->input[0]);
    }
    if (nq == 0) {
        errf(err, err_len, "%s: no Conv, MatMul or Gemm with constant weights to quantize", o->model);
        goto done;
    }
    /* Projection residuals: an Add of two convolution branches (ResNet's downsample blocks; an
     * identity block adds an activation that already has a pair, its next convolution's input).
     * The earlier branch gets a calibrated pair of its own, so that both of the Add's inputs
     * have a scale: the runtime fuses the Add into the later convolution (graph.c) and keeps the
     * block INT8 (qdq.c absorbs the pair into the earlier one; dnnl.c sums it quantized). */
    for (size_t i = 0; i < gp->n_node; i++) {
        Onnx__NodeProto *n = gp->node[i];
        if (strcmp(n->op_type, "Add") != 0 || n->n_input != 2 || strcmp(n->input[0], n->input[1]) == 0) continue;
        long pa = conv_branch(gp, n->input[0], qn, nq), pb = conv_branch(gp, n->input[1], qn, nq);
        if (pa < 0 || pb < 0) continue;
        int side = pa < pb ? 0 : 1;
        rp[nr++] = (respair_t){(size_t)(pa < pb ? pa : pb), i, side, na};
        acts[na++].name = xstrdup(n->input[side]);
    }
    if (calibrate(o, dir, acts, na, cx, err, err_len)) goto done;
    /* weights: per-channel symmetric INT8 behind DequantizeLinear(axis) */
    bool *wdone = xmalloc(gp->n_initializer + 1);
    for (int q = 0; q < nq; q++) {
        Onnx__NodeProto *n = gp->node[qn[q].node];
        size_t wi;
        Onnx__TensorProto *w = find_init(gp, n->input[1], &wi);
        if (w == NULL || wdone[wi]) continue; /* shared weight: quantized once (same axis) */
        int64_t numel;
        const float *v = init_floats(w, &numel);
        int64_t ax = qn[q].waxis, ch = w->dims[ax], inner = 1;
        for (size_t d = (size_t)ax + 1; d < w->n_dims; d++) inner *= w->dims[d];
        float *sc = xmalloc((size_t)ch * sizeof *sc);
        int8_t *wq = xmalloc((size_t)numel), *zp = xmalloc((size_t)ch);
        for (int64_t i = 0; i < numel; i++) {
            int64_t c = (i / inner) % ch;
            sc[c] = fmaxf(sc[c], fabsf(v[i]));
        }
        /* --weight-bits 7: [-63, 63], so that two u8 x s8 products fit the int16 that
         * oneDNN's int8 kernels pair them in on CPUs without VNNI (2 * 255 * 63 < 32767): exact
         * and on oneDNN there, at one bit of weight precision (docs/backends.md) */
        float wmax = o->weight_bits == 7 ? 63.0f : 127.0f;
        for (int64_t c = 0; c < ch; c++) sc[c] = sc[c] > 0 ? sc[c] / wmax : 1.0f;
        for (int64_t i = 0; i < numel; i++) {
            float r = rintf(v[i] / sc[(i / inner) % ch]);
            wq[i] = (int8_t)(r > wmax ? wmax : r < -wmax ? -wmax : r);
        }
        char *orig = xstrdup(w->name);
        char *nq8 = cat2(orig, "__int8"), *nsc = cat2(orig, "__scale"), *nzp = cat2(orig, "__zp");
        Onnx__TensorProto *tq = new_tensor(nq8, OX_INT8, (int)w->n_dims, w->dims, wq, (size_t)numel);
        onnx__tensor_proto__free_unpacked(w, NULL);
        gp->initializer[wi] = tq;
        wdone[wi] = true;
        push_init(gp, new_tensor(nsc, OX_FLOAT, 1, &ch, sc, (size_t)ch * 4));
        push_init(gp, new_tensor(nzp, OX_INT8, 1, &ch, zp, (size_t)ch));
        const char *din[3] = {nq8, nsc, nzp};
        Onnx__NodeProto *dq = new_node("DequantizeLinear", nq8, 3, din, orig);
        add_attr_i(dq, "axis", ax);
        push_node(&nl, dq);
        free(orig); free(nq8); free(nsc); free(nzp); free(sc); free(wq); free(zp);
    }
    free(wdone);
    /* activations: Q -> DQ before the first quantized reader; readers take the DQ output */
    bool *emitted = xmalloc((size_t)na + 1);
    char **dqname = xmalloc(((size_t)na + 1) * sizeof *dqname);
    for (size_t i = 0; i < gp->n_node; i++) {
        Onnx__NodeProto *n = gp->node[i];
        int q = 0;
        while (q < nq && qn[q].node != i) q++;
        if (q < nq) {
            int k = 0;
            while (k < na && strcmp(acts[k].name, n->input[0]) != 0) k++;
            if (!emitted[k]) {
                dqname[k] = emit_pair(gp, &nl, &acts[k], o->weight_bits == 7);
                emitted[k] = true;
            }
            free(n->input[0]);
            n->input[0] = xstrdup(dqname[k]);
        }
        push_node(&nl, n);
        for (int j = 0; j < nr; j++) {
            if (rp[j].node != i) continue;
            /* right after the branch's last node; the Add (later) reads the DQ output */
            int k = rp[j].act;
            dqname[k] = emit_pair(gp, &nl, &acts[k], o->weight_bits == 7);
            emitted[k] = true;
            Onnx__NodeProto *add = gp->node[rp[j].add];
            free(add->input[rp[j].side]);
            add->input[rp[j].side] = xstrdup(dqname[k]);
        }
    }
    for (int k = 0; k < na; k++) {
        if (emitted[k]) free(dqname[k]);
    }
    free(emitted);
    free(dqname);
    free(gp->node);
    gp->node = nl.v;
    gp->n_node = nl.n;
    nl.v = NULL;
    *n_q = nq;
    *n_acts_out = na;
    rc = proto_write(mp, o->out_int8, bytes, err, err_len);
done:
    free(nl.v);
    free(qn);
    free(rp);
    for (int k = 0; k < na; k++) free(acts[k].name);
    free(acts);
    onnx__model_proto__free_unpacked(mp, NULL);
    return rc;
}

/* ---- evaluation ---- */

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Run the whole set; top-1 classes into cls (when not NULL); seconds into *secs. */
static int
eval_pass(model_t *m, const npy_t *x, int64_t batch, int64_t *cls, double *secs, char *err, size_t err_len)
{
    int64_t rows = x->dims[0];
    double t0 = now_s();
    for (int64_t r0 = 0; r0 < rows; r0 += batch) {
        int64_t n = rows - r0 < batch ? rows - r0 : batch;
        if (model_run(m, x, r0, n, err, err_len)) return -1;
        const sp_ox_tensor_t *y = &m->g->values[m->g->outputs[0]].t;
        int64_t per = n ? sp_ox_numel(y) / n : 0;
        if (y->dtype != OX_FLOAT || per < 1 || per * n != sp_ox_numel(y)) {
            sp_ox_run_release_all(&m->r);
            return errf(err, err_len, "the first output is not FLOAT scores with one row per sample");
        }
        for (int64_t i = 0; cls && i < n; i++) {
            const float *s = (const float *)y->data + i * per;
            int64_t b = 0;
            for (int64_t k = 1; k < per; k++) {
                if (s[k] > s[b]) b = k;
            }
            cls[r0 + i] = b;
        }
        sp_ox_run_release_all(&m->r);
    }
    *secs = now_s() - t0;
    return 0;
}

static int
cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int
evaluate(const opts_t *o, const char *dir, char *err, size_t err_len)
{
    npy_t x, lab = {0};
    if (npy_read(o->eval, &x, err, err_len)) return -1;
    int rc = -1;
    if (x.dtype != OX_FLOAT || x.nd < 1 || x.dims[0] < 1) {
        errf(err, err_len, "%s: FLOAT samples along the first dimension expected", o->eval);
        free(x.data);
        return -1;
    }
    if (o->labels && npy_read(o->labels, &lab, err, err_len)) {
        free(x.data);
        return -1;
    }
    if (o->labels && (lab.dtype == OX_FLOAT || lab.numel != x.dims[0])) {
        errf(err, err_len, "%s: one integer label per sample expected (%lld samples)", o->labels, (long long)x.dims[0]);
        goto out;
    }
    const char *names[3] = {"fp32", "fp16", "int8"};
    const char *paths[3] = {o->model, o->fp16 ? o->out_fp16 : NULL, o->int8 ? o->out_int8 : NULL};
    model_t m[3];
    memset(m, 0, sizeof m);
    int64_t rows = x.dims[0];
    int64_t *cls[3] = {0};
    double *times[3] = {0};
    for (int i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        if (model_open(&m[i], paths[i], dir, o->threads, NULL, 0, err, err_len)) goto close;
        cls[i] = xmalloc((size_t)rows * sizeof *cls[i]);
        times[i] = xmalloc((size_t)o->repeat * sizeof *times[i]);
    }
    int64_t batch = model_batch(&m[0], o->batch);
    /* one untimed pass each (buffers, caches), then interleaved timed repeats */
    for (int i = 0; i < 3; i++) {
        double s;
        if (paths[i] && eval_pass(&m[i], &x, batch, cls[i], &s, err, err_len)) goto close;
    }
    for (int rpt = 0; rpt < o->repeat; rpt++) {
        for (int i = 0; i < 3; i++) {
            if (paths[i] && eval_pass(&m[i], &x, batch, NULL, &times[i][rpt], err, err_len)) goto close;
        }
    }
    printf("held-out set %s: %lld samples, batch %lld, %d threads, %d timed passes each (median), "
           "integer kernel %s\n", o->eval, (long long)rows, (long long)batch, o->threads, o->repeat,
           sp_ox_qgemm_kernel());
    printf("  %-5s %12s %9s %16s %10s\n", "model", "ms/batch", "speed-up", "top-1 agreement", "accuracy");
    double base = 0;
    for (int i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        qsort(times[i], (size_t)o->repeat, sizeof(double), cmp_d);
        double med = times[i][o->repeat / 2], per_batch = med * 1e3 / (double)((rows + batch - 1) / batch);
        if (i == 0) base = med;
        int64_t agree = 0, right = 0;
        for (int64_t k = 0; k < rows; k++) {
            agree += cls[i][k] == cls[0][k];
            if (o->labels) {
                int64_t l = lab.dtype == OX_INT64 ? ((int64_t *)lab.data)[k] : ((int32_t *)lab.data)[k];
                right += cls[i][k] == l;
            }
        }
        char acc[32] = "-";
        if (o->labels) snprintf(acc, sizeof acc, "%.4f", (double)right / (double)rows);
        printf("  %-5s %12.3f %8.2fx %16.4f %10s\n", names[i], per_batch, base / med, (double)agree / (double)rows, acc);
    }
    rc = 0;
close:
    for (int i = 0; i < 3; i++) {
        model_close(&m[i]);
        free(cls[i]);
        free(times[i]);
    }
out:
    free(x.data);
    free(lab.data);
    return rc;
}

/* ---- the command ---- */

static const char usage[] =
    "usage: sampan optimize MODEL.onnx [options]\n"
    "  writes MODEL_fp16.onnx and (with --calib) MODEL_int8.onnx beside the model\n"
    "  --precision LIST     fp16, int8 or fp16,int8 (default: fp16, and int8 when --calib is given)\n"
    "  --calib FILE.npy     calibration inputs, float32, samples along the first dimension\n"
    "  --method NAME        percentile (default), entropy (KL divergence) or max\n"
    "  --percentile P       the percentile of |x| kept (default 99.99)\n"
    "  --weight-bits 8|7    INT8 weights in [-127, 127] (default) or [-63, 63]: exact on oneDNN's\n"
    "                       int8 kernels of CPUs without VNNI (AVX2), one bit less precise\n"
    "  --eval FILE.npy      held-out inputs: accuracy and speed of each model in this process\n"
    "  --labels FILE.npy    their integer labels (int64 or int32): accuracy next to agreement\n"
    "  --threads N          GEMM threads (default 2)\n"
    "  --batch N            rows per run (default 64; a model with a fixed batch uses it)\n"
    "  --repeat N           timed passes over the held-out set per model (default 5)\n"
    "  --fp16-out FILE, --int8-out FILE   other output paths\n";

__attribute__((visibility("default"))) int
sp_onnx_optimize_main(int argc, char **argv)
{
    opts_t o = {.method = "percentile", .percentile = 99.99, .threads = 2, .repeat = 5, .batch = 64,
                .weight_bits = 8};
    const char *prec = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = a[0] == '-' && strcmp(a, "--help") != 0 && strcmp(a, "-h") != 0;
        if (takes && v == NULL) {
            fprintf(stderr, "sampan optimize: %s needs a value\n%s", a, usage);
            return 2;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(a, "--precision") == 0) prec = v;
        else if (strcmp(a, "--calib") == 0) o.calib = v;
        else if (strcmp(a, "--method") == 0) o.method = v;
        else if (strcmp(a, "--percentile") == 0) o.percentile = atof(v);
        else if (strcmp(a, "--weight-bits") == 0) o.weight_bits = atoi(v);
        else if (strcmp(a, "--eval") == 0) o.eval = v;
        else if (strcmp(a, "--labels") == 0) o.labels = v;
        else if (strcmp(a, "--threads") == 0) o.threads = atoi(v);
        else if (strcmp(a, "--batch") == 0) o.batch = atoi(v);
        else if (strcmp(a, "--repeat") == 0) o.repeat = atoi(v);
        else if (strcmp(a, "--fp16-out") == 0) o.out_fp16 = v;
        else if (strcmp(a, "--int8-out") == 0) o.out_int8 = v;
        else if (a[0] == '-') {
            fprintf(stderr, "sampan optimize: unknown option %s\n%s", a, usage);
            return 2;
        } else if (o.model == NULL) {
            o.model = a;
            continue;
        } else {
            fprintf(stderr, "sampan optimize: one model at a time (%s)\n", a);
            return 2;
        }
        i++;
    }
    if (o.model == NULL) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(o.method, "percentile") && strcmp(o.method, "entropy") && strcmp(o.method, "max")) {
        fprintf(stderr, "sampan optimize: --method %s (percentile, entropy or max)\n", o.method);
        return 2;
    }
    if (!(o.percentile > 50.0 && o.percentile <= 100.0) || o.threads < 1 || o.threads > 64 ||
        o.batch < 1 || o.repeat < 1 || o.repeat > 1000) {
        fprintf(stderr, "sampan optimize: --percentile in (50, 100], --threads 1..64, --batch >= 1, "
                "--repeat 1..1000\n");
        return 2;
    }
    if (o.weight_bits != 7 && o.weight_bits != 8) {
        fprintf(stderr, "sampan optimize: --weight-bits 8 or 7\n");
        return 2;
    }
    if (prec) {
        o.fp16 = strstr(prec, "fp16") != NULL;
        o.int8 = strstr(prec, "int8") != NULL;
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%s", prec);
        for (char *t = strtok(tmp, ","); t; t = strtok(NULL, ",")) {
            if (strcmp(t, "fp16") && strcmp(t, "int8")) {
                fprintf(stderr, "sampan optimize: --precision %s: fp16 and/or int8\n", prec);
                return 2;
            }
        }
    } else {
        o.fp16 = true;
        o.int8 = o.calib != NULL;
    }
    if (o.int8 && o.calib == NULL) {
        fprintf(stderr, "sampan optimize: int8 needs calibration inputs (--calib FILE.npy)\n");
        return 2;
    }
    /* default outputs: beside the model, MODEL_fp16.onnx / MODEL_int8.onnx */
    char dir[4096], base[4096], f16[4200], i8[4200];
    snprintf(dir, sizeof dir, "%s", o.model);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    snprintf(base, sizeof base, "%s", o.model);
    size_t bl = strlen(base);
    if (bl > 5 && strcmp(base + bl - 5, ".onnx") == 0) base[bl - 5] = 0;
    snprintf(f16, sizeof f16, "%s_fp16.onnx", base);
    snprintf(i8, sizeof i8, "%s_int8.onnx", base);
    if (!o.out_fp16) o.out_fp16 = f16;
    if (!o.out_int8) o.out_int8 = i8;
    char err[2048];
    /* the FP32 model must load in this runtime first: everything below trusts its structure */
    model_t m0;
    if (model_open(&m0, o.model, dir, o.threads, NULL, 0, err, sizeof err)) {
        fprintf(stderr, "sampan optimize: %s\n", err);
        return 1;
    }
    model_close(&m0);
    struct stat st;
    size_t in_bytes = stat(o.model, &st) == 0 ? (size_t)st.st_size : 0;
    if (o.fp16) {
        size_t b;
        int64_t nconv, ninf;
        if (write_fp16(o.model, o.out_fp16, &b, &nconv, &ninf, err, sizeof err)) {
            fprintf(stderr, "sampan optimize: fp16: %s\n", err);
            return 1;
        }
        printf("fp16: %s: %lld initializers stored as FLOAT16, %zu -> %zu bytes (%.2fx)%s\n", o.out_fp16,
               (long long)nconv, in_bytes, b, in_bytes ? (double)b / (double)in_bytes : 0.0,
               ninf ? " (some weights beyond 65504 saturated)" : "");
    }
    if (o.int8) {
        npy_t cx;
        if (npy_read(o.calib, &cx, err, sizeof err)) {
            fprintf(stderr, "sampan optimize: %s\n", err);
            return 1;
        }
        if (cx.dtype != OX_FLOAT || cx.nd < 1 || cx.dims[0] < 1) {
            fprintf(stderr, "sampan optimize: %s: FLOAT samples along the first dimension expected\n", o.calib);
            free(cx.data);
            return 1;
        }
        size_t b;
        int nq, na;
        int rc = write_int8(&o, dir, &cx, &b, &nq, &na, err, sizeof err);
        if (rc) {
            fprintf(stderr, "sampan optimize: int8: %s\n", err);
            free(cx.data);
            return 1;
        }
        printf("int8: %s: %d Conv/MatMul/Gemm with per-channel INT8 weights, %d activations "
               "calibrated (%s%s) on %lld samples, %zu -> %zu bytes (%.2fx)\n", o.out_int8, nq, na,
               o.method, strcmp(o.method, "percentile") == 0 ? " of |x|" : "", (long long)cx.dims[0],
               in_bytes, b, in_bytes ? (double)b / (double)in_bytes : 0.0);
        if (o.weight_bits == 8 && sp_ox_dnnl_built() && !sp_ox_dnnl_int8_vnni()) {
            /* what the user would otherwise find out from --eval's speed-up alone */
            printf("int8: note: this CPU has no VNNI, where oneDNN's int8 kernels are exact only for "
                   "weights in [-64, 64]: served here, this file's Conv/MatMul run on the own integer "
                   "kernels; --weight-bits 7 keeps them on oneDNN (docs/backends.md)\n");
        }
        free(cx.data);
    }
    if (o.eval && evaluate(&o, dir, err, sizeof err)) {
        fprintf(stderr, "sampan optimize: eval: %s\n", err);
        return 1;
    }
    return 0;
}
