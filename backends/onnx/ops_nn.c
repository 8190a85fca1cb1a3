/*
 * backends/onnx/ops_nn.c - the operators with weights or windows: Conv
 * (im2col + sp_ox_sgemm, 1-D and 2-D, groups, dilations, padding, fused bias
 * and Relu), MaxPool/AveragePool (1-D and 2-D), GlobalAveragePool and
 * GlobalMaxPool, BatchNormalization (inference), Gemm and MatMul (numpy
 * batch broadcasting, fused bias and Relu).
 *
 * Threads: none. Memory: outputs from the run's pool; im2col columns in the
 * run's scratch buffer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static int
check_window(sp_ox_node_t *n, char *err, size_t err_len)
{
    const char *ap = sp_ox_attr_s(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "SAME_UPPER") && strcmp(ap, "SAME_LOWER") &&
        strcmp(ap, "VALID")) {
        snprintf(err, err_len, "auto_pad \"%s\"", ap);
        return -1;
    }
    size_t c;
    sp_ox_attr_ints(n, "kernel_shape", &c);
    if (c > 2) {
        snprintf(err, err_len, "%zu-D windows are not supported (1-D and 2-D)", c);
        return -1;
    }
    if (n->n_out > 1) {
        snprintf(err, err_len, "the Indices output is not supported");
        return -1;
    }
    if (sp_ox_attr_i(n, "storage_order", 0) != 0) {
        snprintf(err, err_len, "storage_order 1 is not supported");
        return -1;
    }
    return 0;
}

/* Fill g from x's spatial dims (rank 3 or 4), kernel dims and the node's
 * strides/dilations/pads/auto_pad; ceil_mode for pools. */
int
sp_ox_geometry(sp_ox_run_t *r, const sp_ox_node_t *n, const sp_ox_tensor_t *x, const int64_t *kern, int nk,
         bool pool, geom_t *g)
{
    int sp = x->nd - 2;
    if (sp < 1 || sp > 2 || nk != sp) {
        return sp_ox_fail(r, "input of rank %d with a %d-D kernel (1-D and 2-D only)", x->nd, nk);
    }
    size_t cs, cd, cp;
    const int64_t *st = sp_ox_attr_ints(n, "strides", &cs);
    const int64_t *dl = sp_ox_attr_ints(n, "dilations", &cd);
    const int64_t *pd = sp_ox_attr_ints(n, "pads", &cp);
    if ((st && cs != (size_t)sp) || (dl && cd != (size_t)sp) || (pd && cp != (size_t)sp * 2)) {
        return sp_ox_fail(r, "strides, dilations or pads do not match the kernel's rank");
    }
    int64_t in[2] = {1, 1}, k[2] = {1, 1}, s[2] = {1, 1}, d[2] = {1, 1}, pb[2] = {0, 0},
            pe[2] = {0, 0}, o[2] = {1, 1};
    const char *ap = sp_ox_attr_s(n, "auto_pad", "NOTSET");
    bool ceil_mode = pool && sp_ox_attr_i(n, "ceil_mode", 0);
    for (int i = 0; i < sp; i++) {
        int j = i + 2 - sp;
        in[j] = x->dims[2 + i];
        k[j] = kern[i];
        s[j] = st ? st[i] : 1;
        d[j] = dl ? dl[i] : 1;
        if (k[j] < 1 || s[j] < 1 || d[j] < 1 || k[j] > 1 << 20 || s[j] > 1 << 20 || d[j] > 1 << 20) {
            return sp_ox_fail(r, "kernel %lld, stride %lld, dilation %lld", (long long)k[j],
                           (long long)s[j], (long long)d[j]);
        }
        int64_t ext = (k[j] - 1) * d[j] + 1;
        if (strcmp(ap, "SAME_UPPER") == 0 || strcmp(ap, "SAME_LOWER") == 0) {
            o[j] = (in[j] + s[j] - 1) / s[j];
            int64_t tot = (o[j] - 1) * s[j] + ext - in[j];
            if (tot < 0) tot = 0;
            pb[j] = strcmp(ap, "SAME_UPPER") == 0 ? tot / 2 : (tot + 1) / 2;
            pe[j] = tot - pb[j];
            continue;
        }
        if (strcmp(ap, "NOTSET") == 0 && pd) {
            pb[j] = pd[i];
            pe[j] = pd[i + sp];
            if (pb[j] < 0 || pe[j] < 0 || pb[j] > 1 << 20 || pe[j] > 1 << 20) return sp_ox_fail(r, "pads out of range");
        }
        int64_t span = in[j] + pb[j] + pe[j] - ext;
        if (span < 0) return sp_ox_fail(r, "the window (%lld) is larger than the padded input (%lld)", (long long)ext, (long long)(in[j] + pb[j] + pe[j]));
        o[j] = (ceil_mode ? (span + s[j] - 1) / s[j] : span / s[j]) + 1;
        if (ceil_mode && (o[j] - 1) * s[j] >= in[j] + pb[j]) o[j]--;
    }
    *g = (geom_t){in[0], in[1], k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], o[0], o[1], pe[0], pe[1]};
    return 0;
}

static int
out_nchw_typed(sp_ox_run_t *r, const sp_ox_tensor_t *x, int64_t c, const geom_t *g, sp_ox_tensor_t *out,
               int32_t dtype)
{
    int64_t d[4] = {x->dims[0], c, g->oh, g->ow};
    if (x->nd == 3) d[2] = g->ow;
    return sp_ox_out(r, out, dtype, x->nd, d);
}

static int
out_nchw(sp_ox_run_t *r, const sp_ox_tensor_t *x, int64_t c, const geom_t *g, sp_ox_tensor_t *out)
{
    return out_nchw_typed(r, x, c, g, out, OX_FLOAT);
}

static int
run_conv(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
         sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0], *w = in[1], *b = ni > 2 ? in[2] : NULL;
    if (x->dtype != OX_FLOAT || w->dtype != OX_FLOAT || (b && b->dtype != OX_FLOAT)) {
        return sp_ox_fail(r, "%s tensors are not supported (FLOAT only)", sp_ox_dtype_name(x->dtype));
    }
    int64_t group = sp_ox_attr_i(n, "group", 1);
    if (w->nd != x->nd || x->nd < 3) return sp_ox_fail(r, "weights of rank %d for input of rank %d", w->nd, x->nd);
    int64_t c = x->dims[1], m = w->dims[0];
    if (group < 1 || c % group || m % group || w->dims[1] != c / group) {
        return sp_ox_fail(r, "%lld input channels, weights [%lld, %lld, ...], group %lld",
                       (long long)c, (long long)m, (long long)w->dims[1], (long long)group);
    }
    if (b && sp_ox_numel(b) != m) return sp_ox_fail(r, "bias of %lld values for %lld channels", (long long)sp_ox_numel(b), (long long)m);
    size_t nk;
    const int64_t *ks = sp_ox_attr_ints(n, "kernel_shape", &nk);
    int64_t kern[2];
    for (int i = 0; i < x->nd - 2 && i < 2; i++) {
        kern[i] = w->dims[2 + i];
        if (ks && (nk != (size_t)(x->nd - 2) || ks[i] != kern[i])) return sp_ox_fail(r, "kernel_shape differs from the weights");
    }
    geom_t g;
    if (sp_ox_geometry(r, n, x, kern, x->nd - 2, false, &g) || out_nchw(r, x, m, &g, out[0])) return -1;
    int64_t cg = c / group, mg = m / group, kk = cg * g.kh * g.kw, hw = g.oh * g.ow;
    bool direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 &&
                  g.oh == g.ih && g.ow == g.iw;
    float *col = NULL;
    if (!direct && kk * hw > 0) {
        col = sp_ox_scratch(r, (size_t)(kk * hw) * sizeof(float));
        if (col == NULL) return -1;
    }
    const float *xd = x->data, *wd = w->data;
    float *yd = out[0]->data;
    for (int64_t nb = 0; nb < x->dims[0]; nb++) {
        for (int64_t gi = 0; gi < group; gi++) {
            const float *xs = xd + (nb * c + gi * cg) * g.ih * g.iw;
            const float *src = xs;
            if (!direct) {
                /* im2col: row (ci, ky, kx), column (oy, ox). */
                for (int64_t ci = 0; ci < cg; ci++) {
                    for (int64_t ky = 0; ky < g.kh; ky++) {
                        for (int64_t kx = 0; kx < g.kw; kx++) {
                            float *dst = col + ((ci * g.kh + ky) * g.kw + kx) * hw;
                            for (int64_t oy = 0; oy < g.oh; oy++) {
                                int64_t iy = oy * g.sh - g.pt + ky * g.dh;
                                float *drow = dst + oy * g.ow;
                                if (iy < 0 || iy >= g.ih) {
                                    memset(drow, 0, (size_t)g.ow * sizeof *drow);
                                    continue;
                                }
                                const float *srow = xs + (ci * g.ih + iy) * g.iw;
                                for (int64_t xo = 0; xo < g.ow; xo++) {
                                    int64_t ix = xo * g.sw - g.pl + kx * g.dw;
                                    drow[xo] = ix >= 0 && ix < g.iw ? srow[ix] : 0.0f;
                                }
                            }
                        }
                    }
                }
                src = col;
            }
            float *ys = yd + (nb * m + gi * mg) * hw;
            sp_ox_sgemm_par(r->n_threads, 0, 0, mg, hw, kk, wd + gi * mg * kk, kk, src, hw, ys, hw, 0);
            for (int64_t o = 0; o < mg; o++) {
                float bias = b ? ((const float *)b->data)[gi * mg + o] : 0.0f;
                float *row = ys + o * hw;
                if (n->fused_relu && n->fused_add < 0) {
                    for (int64_t i = 0; i < hw; i++) row[i] = fmaxf(row[i] + bias, 0.0f);
                } else if (b) {
                    for (int64_t i = 0; i < hw; i++) row[i] += bias;
                }
            }
        }
    }
    /* The residual Add, then the Relu after it (graph.c's Conv+Add fusion). */
    return n->fused_add >= 0 ? sp_ox_fused_add(r, n, out[0]) : 0;
}

static int
check_conv(sp_ox_node_t *n, char *err, size_t err_len)
{
    return check_window(n, err, err_len);
}

static int
run_pool(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *x, sp_ox_tensor_t *out, bool is_max)
{
    /* MaxPool of UINT8/INT8 (opset 12; onnxruntime's QOperator models pool quantized tensors):
     * the maximum of 8-bit values is one of them, so it is computed on their exact float values
     * and stored back in the input's type. */
    bool q8 = is_max && (x->dtype == OX_UINT8 || x->dtype == OX_INT8);
    if (x->dtype != OX_FLOAT && !q8) {
        return sp_ox_fail(r, "%s tensors are not supported (FLOAT%s)", sp_ox_dtype_name(x->dtype),
                          is_max ? ", UINT8 or INT8" : " only");
    }
    size_t nk;
    const int64_t *ks = sp_ox_attr_ints(n, "kernel_shape", &nk);
    if (ks == NULL) return sp_ox_fail(r, "kernel_shape is required");
    geom_t g;
    if (sp_ox_geometry(r, n, x, ks, (int)nk, true, &g) || out_nchw_typed(r, x, x->dims[1], &g, out, x->dtype)) {
        return -1;
    }
    bool incl = sp_ox_attr_i(n, "count_include_pad", 0) != 0;
    int64_t planes = x->dims[0] * x->dims[1];
    const float *xd = x->data;
    float *yd = out->data;
    const uint8_t *xu = x->data;
    const int8_t *xi = x->data;
    /* count_include_pad counts the window's cells inside the padded input. */
    int64_t pbh = g.pt, pbw = g.pl, peh = g.pb_end, pew = g.pr_end;
    for (int64_t p = 0; p < planes; p++) {
        int64_t xo0 = p * g.ih * g.iw, yo0 = p * g.oh * g.ow;
        for (int64_t oy = 0; oy < g.oh; oy++) {
            for (int64_t xo = 0; xo < g.ow; xo++) {
                float mx = -INFINITY;
                double sum = 0;
                int64_t cnt = 0, cnt_pad = 0;
                for (int64_t ky = 0; ky < g.kh; ky++) {
                    int64_t iy = oy * g.sh - g.pt + ky * g.dh;
                    for (int64_t kx = 0; kx < g.kw; kx++) {
                        int64_t ix = xo * g.sw - g.pl + kx * g.dw;
                        if (iy >= -pbh && iy < g.ih + peh && ix >= -pbw && ix < g.iw + pew) cnt_pad++;
                        if (iy < 0 || iy >= g.ih || ix < 0 || ix >= g.iw) continue;
                        int64_t at = xo0 + iy * g.iw + ix;
                        float v = !q8 ? xd[at] : x->dtype == OX_UINT8 ? (float)xu[at] : (float)xi[at];
                        mx = v > mx ? v : mx;
                        sum += v;
                        cnt++;
                    }
                }
                int64_t yat = yo0 + oy * g.ow + xo;
                if (q8) {
                    /* a window with no cell inside the input (only padding): the type's minimum */
                    if (x->dtype == OX_UINT8) ((uint8_t *)out->data)[yat] = cnt ? (uint8_t)mx : 0;
                    else ((int8_t *)out->data)[yat] = cnt ? (int8_t)mx : INT8_MIN;
                    continue;
                }
                yd[yat] = is_max ? mx
                                 : (float)(sum / (double)((incl ? cnt_pad : cnt) ? (incl ? cnt_pad : cnt) : 1));
            }
        }
    }
    return 0;
}

static int
run_maxpool(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
            sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    return run_pool(r, n, in[0], out[0], true);
}

static int
run_avgpool(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
            sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    return run_pool(r, n, in[0], out[0], false);
}

static int
run_global(sp_ox_run_t *r, const sp_ox_tensor_t *x, sp_ox_tensor_t *out, bool is_max)
{
    if (x->dtype != OX_FLOAT || x->nd < 3) return sp_ox_fail(r, "FLOAT [N, C, ...] input only");
    int64_t d[OX_MAX_DIMS], hw = 1;
    for (int i = 0; i < x->nd; i++) {
        d[i] = i < 2 ? x->dims[i] : 1;
        if (i >= 2) hw *= x->dims[i];
    }
    if (sp_ox_out(r, out, OX_FLOAT, x->nd, d)) return -1;
    int64_t planes = x->dims[0] * x->dims[1];
    for (int64_t p = 0; p < planes; p++) {
        const float *s = (const float *)x->data + p * hw;
        double acc = 0;
        float mx = -INFINITY;
        for (int64_t i = 0; i < hw; i++) {
            acc += s[i];
            mx = s[i] > mx ? s[i] : mx;
        }
        ((float *)out->data)[p] = is_max ? mx : (float)(acc / (double)(hw ? hw : 1));
    }
    return 0;
}

static int
run_gap(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)ni; (void)no;
    return run_global(r, in[0], out[0], false);
}

static int
run_gmp(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)ni; (void)no;
    return run_global(r, in[0], out[0], true);
}

static int
check_bn(sp_ox_node_t *n, char *err, size_t err_len)
{
    if (sp_ox_attr_i(n, "training_mode", 0) != 0 || sp_ox_attr_i(n, "spatial", 1) != 1 || n->n_out != 1) {
        snprintf(err, err_len, "training mode (training_mode 1, spatial 0, running statistics "
                 "outputs) is not supported: inference only");
        return -1;
    }
    return 0;
}

static int
run_bn(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    const sp_ox_tensor_t *x = in[0];
    if (x->nd < 2) return sp_ox_fail(r, "input of rank %d", x->nd);
    int64_t c = x->dims[1];
    for (int k = 0; k < 5; k++) {
        if (in[k]->dtype != OX_FLOAT) {
            return sp_ox_fail(r, "%s tensors are not supported (FLOAT only)", sp_ox_dtype_name(in[k]->dtype));
        }
        if (k && sp_ox_numel(in[k]) != c) return sp_ox_fail(r, "input %d has %lld values for %lld channels", k, (long long)sp_ox_numel(in[k]), (long long)c);
    }
    float eps = sp_ox_attr_f(n, "epsilon", 1e-5f);
    if (sp_ox_out(r, out[0], OX_FLOAT, x->nd, x->dims)) return -1;
    int64_t hw = 1;
    for (int i = 2; i < x->nd; i++) hw *= x->dims[i];
    const float *sc = in[1]->data, *bb = in[2]->data, *mean = in[3]->data, *var = in[4]->data;
    for (int64_t nb = 0; nb < x->dims[0]; nb++) {
        for (int64_t ci = 0; ci < c; ci++) {
            float s = sc[ci] / sqrtf(var[ci] + eps), t = bb[ci] - mean[ci] * s;
            const float *p = (const float *)x->data + (nb * c + ci) * hw;
            float *q = (float *)out[0]->data + (nb * c + ci) * hw;
            for (int64_t i = 0; i < hw; i++) q[i] = p[i] * s + t;
        }
    }
    return 0;
}

static void
finish_rows(float *y, int64_t rows, int64_t cols, const float *bias, int relu)
{
    for (int64_t i = 0; i < rows; i++) {
        float *row = y + i * cols;
        if (bias) {
            for (int64_t j = 0; j < cols; j++) row[j] += bias[j];
        }
        if (relu) {
            for (int64_t j = 0; j < cols; j++) row[j] = fmaxf(row[j], 0.0f);
        }
    }
}

static int
run_gemm(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *a = in[0], *b = in[1], *c = ni > 2 ? in[2] : NULL;
    if (a->dtype != OX_FLOAT || b->dtype != OX_FLOAT || (c && c->dtype != OX_FLOAT)) {
        return sp_ox_fail(r, "%s tensors are not supported (FLOAT only)", sp_ox_dtype_name(a->dtype));
    }
    if (a->nd != 2 || b->nd != 2) return sp_ox_fail(r, "A and B must be 2-D");
    int ta = sp_ox_attr_i(n, "transA", 0) != 0, tb = sp_ox_attr_i(n, "transB", 0) != 0;
    float alpha = sp_ox_attr_f(n, "alpha", 1.0f), beta = sp_ox_attr_f(n, "beta", 1.0f);
    int64_t m = ta ? a->dims[1] : a->dims[0], k = ta ? a->dims[0] : a->dims[1];
    int64_t kb = tb ? b->dims[1] : b->dims[0], nn = tb ? b->dims[0] : b->dims[1];
    if (k != kb) return sp_ox_fail(r, "A has K %lld, B %lld", (long long)k, (long long)kb);
    int64_t d[2] = {m, nn};
    if (sp_ox_out(r, out[0], OX_FLOAT, 2, d)) return -1;
    float *y = out[0]->data;
    sp_ox_sgemm_par(r->n_threads, ta, tb, m, nn, k, a->data, a->dims[1], b->data, b->dims[1], y, nn, 0);
    if (alpha != 1.0f) {
        for (int64_t i = 0; i < m * nn; i++) y[i] *= alpha;
    }
    if (c) {
        sp_ox_tensor_t yt = *out[0];
        const sp_ox_tensor_t *pair[2] = {&yt, c};
        int64_t bd[OX_MAX_DIMS];
        int32_t bnd;
        if (sp_ox_bcast_shape(r, pair, 2, bd, &bnd) || bnd != 2 || bd[0] != m || bd[1] != nn) {
            return sp_ox_fail(r, "C does not broadcast to [%lld, %lld]", (long long)m, (long long)nn);
        }
        int64_t c0 = c->nd == 2 ? c->dims[0] : 1, c1 = c->nd >= 1 ? c->dims[c->nd - 1] : 1;
        const float *cd = c->data;
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < nn; j++) {
                y[i * nn + j] += beta * cd[(c0 == 1 ? 0 : i) * c1 + (c1 == 1 ? 0 : j)];
            }
        }
    }
    finish_rows(y, m, nn, NULL, n->fused_relu);
    return 0;
}

static int
run_matmul(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    const sp_ox_tensor_t *a = in[0], *b = in[1];
    if (a->dtype != OX_FLOAT || b->dtype != OX_FLOAT) {
        return sp_ox_fail(r, "%s tensors are not supported (FLOAT only)", sp_ox_dtype_name(a->dtype));
    }
    if (a->nd < 1 || b->nd < 1) return sp_ox_fail(r, "scalar operands");
    /* 1-D operands are promoted to matrices and the added dimension dropped. */
    sp_ox_tensor_t A = *a, B = *b;
    if (a->nd == 1) {
        A.nd = 2;
        A.dims[0] = 1;
        A.dims[1] = a->dims[0];
    }
    if (b->nd == 1) {
        B.nd = 2;
        B.dims[0] = b->dims[0];
        B.dims[1] = 1;
    }
    int64_t m = A.dims[A.nd - 2], k = A.dims[A.nd - 1], kb = B.dims[B.nd - 2], nn = B.dims[B.nd - 1];
    if (k != kb) {
        char s1[128], s2[128];
        sp_ox_shape_str(a->dims, a->nd, s1, sizeof s1);
        sp_ox_shape_str(b->dims, b->nd, s2, sizeof s2);
        return sp_ox_fail(r, "cannot multiply %s by %s", s1, s2);
    }
    sp_ox_tensor_t ba = A, bb = B;
    ba.nd -= 2;
    bb.nd -= 2;
    const sp_ox_tensor_t *pair[2] = {&ba, &bb};
    int64_t d[OX_MAX_DIMS];
    int32_t bnd;
    if (sp_ox_bcast_shape(r, pair, 2, d, &bnd)) return -1;
    if (bnd + 2 > OX_MAX_DIMS) return sp_ox_fail(r, "too many dimensions");
    int64_t batch = 1;
    for (int i = 0; i < bnd; i++) batch *= d[i];
    int32_t ond = bnd;
    if (a->nd > 1) d[ond++] = m;
    if (b->nd > 1) d[ond++] = nn;
    if (sp_ox_out(r, out[0], OX_FLOAT, ond, d)) return -1;
    float *y = out[0]->data;
    int64_t idx[OX_MAX_DIMS] = {0};
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t oa = 0, ob = 0, sa = 1, sb = 1;
        for (int i = bnd - 1; i >= 0; i--) {
            int ia = i - (bnd - ba.nd), ib = i - (bnd - bb.nd);
            if (ia >= 0) {
                if (ba.dims[ia] != 1) oa += idx[i] * sa;
                sa *= ba.dims[ia];
            }
            if (ib >= 0) {
                if (bb.dims[ib] != 1) ob += idx[i] * sb;
                sb *= bb.dims[ib];
            }
        }
        sp_ox_sgemm_par(r->n_threads, 0, 0, m, nn, k, (const float *)a->data + oa * m * k, k,
                 (const float *)b->data + ob * k * nn, nn, y + bi * m * nn, nn, 0);
        for (int i = bnd - 1; i >= 0; i--) {
            if (++idx[i] < d[i]) break;
            idx[i] = 0;
        }
    }
    const float *bias = NULL;
    if (n->fused_bias >= 0) {
        const sp_ox_tensor_t *bt = &r->g->values[n->fused_bias].t;
        if (b->nd != 2 || sp_ox_numel(bt) != nn) return sp_ox_fail(r, "fused bias does not match");
        bias = bt->data;
    }
    finish_rows(y, batch * (a->nd > 1 ? m : 1), nn, bias, n->fused_relu);
    return 0;
}

static const char *const A_CONV[] = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", NULL};
static const char *const A_MAXPOOL[] = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides", NULL};
static const char *const A_AVGPOOL[] = {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides", NULL};
static const char *const A_BN[] = {"epsilon", "momentum", "training_mode", "spatial", NULL};
static const char *const A_GEMM[] = {"alpha", "beta", "transA", "transB", NULL};
static const char *const A_NONE[] = {NULL};

static const sp_ox_op_t nn_ops[] = {
    {"Conv", A_CONV, 2, 3, 1, 1, check_conv, run_conv},
    {"MaxPool", A_MAXPOOL, 1, 1, 1, 2, check_window, run_maxpool},
    {"AveragePool", A_AVGPOOL, 1, 1, 1, 1, check_window, run_avgpool},
    {"GlobalAveragePool", A_NONE, 1, 1, 1, 1, NULL, run_gap},
    {"GlobalMaxPool", A_NONE, 1, 1, 1, 1, NULL, run_gmp},
    {"BatchNormalization", A_BN, 5, 5, 1, 5, check_bn, run_bn},
    {"Gemm", A_GEMM, 2, 3, 1, 1, NULL, run_gemm},
    {"MatMul", A_NONE, 2, 2, 1, 1, NULL, run_matmul},
};

const sp_ox_op_t *
sp_ox_nn_op_find(const char *op_type)
{
    for (size_t i = 0; i < sizeof nn_ops / sizeof nn_ops[0]; i++) {
        if (strcmp(nn_ops[i].name, op_type) == 0) return &nn_ops[i];
    }
    return NULL;
}
