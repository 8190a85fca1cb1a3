/*
 * backends/onnx/ops_more.c - ConvTranspose (1-D to 3-D, groups, dilations, pads, auto_pad,
 * output_padding, output_shape) and Resize (nearest and linear, 1-D to 4-D, scales or sizes,
 * every coordinate_transformation_mode and nearest_mode of opsets 10 to 19; cubic with
 * cubic_coeff_a and exclude_outside).
 *
 * ConvTranspose is computed as the scatter that defines it: each input element times each
 * kernel tap added at stride * i - pad + dilation * k; sums in float, in the order of the loops.
 * Resize: per output coordinate, the input coordinate of the mode, then the nearest element or
 * the separable product of 1-D weights (2 linear taps or 4 cubic taps per axis) summed in double.
 *
 * Threads: none. Memory: outputs from the run's pool.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"

/* ---- ConvTranspose ---- */

static int
run_convt(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
          sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0], *w = in[1], *b = ni > 2 ? in[2] : NULL;
    if (x->dtype != OX_FLOAT || w->dtype != OX_FLOAT || (b && b->dtype != OX_FLOAT)) {
        return sp_ox_fail(r, "%s tensors are not supported (FLOAT only)", sp_ox_dtype_name(x->dtype));
    }
    int sp = x->nd - 2;
    if (sp < 1 || sp > 3 || w->nd != x->nd) return sp_ox_fail(r, "input of rank %d, weights of rank %d (1-D to 3-D)", x->nd, w->nd);
    int64_t group = sp_ox_attr_i(n, "group", 1), c = x->dims[1];
    if (group < 1 || c % group || w->dims[0] != c) {
        return sp_ox_fail(r, "%lld input channels, weights [%lld, ...], group %lld", (long long)c, (long long)w->dims[0], (long long)group);
    }
    int64_t mg = w->dims[1], m = mg * group, cg = c / group;
    if (b && sp_ox_numel(b) != m) return sp_ox_fail(r, "bias of %lld values for %lld channels", (long long)sp_ox_numel(b), (long long)m);
    size_t cs, cd, cp, cop, cos, ck;
    const int64_t *st = sp_ox_attr_ints(n, "strides", &cs), *dl = sp_ox_attr_ints(n, "dilations", &cd);
    const int64_t *pd = sp_ox_attr_ints(n, "pads", &cp), *op = sp_ox_attr_ints(n, "output_padding", &cop);
    const int64_t *os = sp_ox_attr_ints(n, "output_shape", &cos), *ks = sp_ox_attr_ints(n, "kernel_shape", &ck);
    if ((st && cs != (size_t)sp) || (dl && cd != (size_t)sp) || (pd && cp != (size_t)sp * 2) ||
        (op && cop != (size_t)sp) || (os && cos != (size_t)sp) || (ks && ck != (size_t)sp)) {
        return sp_ox_fail(r, "strides, dilations, pads, output_padding, output_shape or kernel_shape do not match the rank");
    }
    const char *ap = sp_ox_attr_s(n, "auto_pad", "NOTSET");
    bool same = strcmp(ap, "SAME_UPPER") == 0 || strcmp(ap, "SAME_LOWER") == 0;
    if (!same && strcmp(ap, "NOTSET") && strcmp(ap, "VALID")) return sp_ox_fail(r, "auto_pad \"%s\" is not supported", ap);
    int64_t in_[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1}, pb[3] = {0}, o[3] = {1, 1, 1};
    for (int i = 0; i < sp; i++) {
        in_[i] = x->dims[2 + i];
        k[i] = w->dims[2 + i];
        if (ks && ks[i] != k[i]) return sp_ox_fail(r, "kernel_shape differs from the weights");
        s[i] = st ? st[i] : 1;
        d[i] = dl ? dl[i] : 1;
        int64_t opad = op ? op[i] : 0;
        if (s[i] < 1 || d[i] < 1 || s[i] > 1 << 20 || d[i] > 1 << 20 || opad < 0 || opad > 1 << 20) {
            return sp_ox_fail(r, "stride %lld, dilation %lld, output_padding %lld", (long long)s[i], (long long)d[i], (long long)opad);
        }
        int64_t full = s[i] * (in_[i] - 1) + opad + (k[i] - 1) * d[i] + 1;
        if (k[i] > 1 << 20 || in_[i] > r->g->max_numel) return sp_ox_fail(r, "kernel %lld for input %lld", (long long)k[i], (long long)in_[i]);
        if (os || same) {
            if (os && (os[i] < 0 || os[i] > r->g->max_numel)) return sp_ox_fail(r, "output_shape %lld", (long long)os[i]);
            o[i] = os ? os[i] : in_[i] * s[i];
            int64_t tot = full - o[i];
            /* ONNX: SAME_UPPER puts the extra padding at the end (begin = total / 2); an output
             * longer than the full one is zeros at the end (output_padding) */
            pb[i] = tot <= 0 ? 0 : strcmp(ap, "SAME_UPPER") == 0 ? tot / 2 : tot - tot / 2;
        } else {
            int64_t pe = 0;
            if (pd && strcmp(ap, "NOTSET") == 0) {
                pb[i] = pd[i];
                pe = pd[i + sp];
                if (pb[i] < 0 || pe < 0 || pb[i] > 1 << 20 || pe > 1 << 20) return sp_ox_fail(r, "pads out of range");
            }
            o[i] = full - pb[i] - pe;
        }
        if (o[i] < 0 || o[i] > r->g->max_numel) return sp_ox_fail(r, "output dimension %lld", (long long)o[i]);
    }
    int64_t od[5] = {x->dims[0], m, o[0], o[1], o[2]};
    if (sp_ox_out(r, out[0], OX_FLOAT, x->nd, od)) return -1;
    int64_t osz = o[0] * o[1] * o[2], isz = in_[0] * in_[1] * in_[2], ksz = k[0] * k[1] * k[2];
    float *y = out[0]->data;
    const float *xd = x->data, *wd = w->data;
    for (int64_t nb = 0; nb < x->dims[0]; nb++) {
        for (int64_t oc = 0; oc < m; oc++) {
            float bias = b ? ((const float *)b->data)[oc] : 0.0f;
            float *yo = y + (nb * m + oc) * osz;
            for (int64_t i = 0; i < osz; i++) yo[i] = bias;
        }
        for (int64_t gi = 0; gi < group; gi++) {
            for (int64_t ci = 0; ci < cg; ci++) {
                const float *xs = xd + (nb * c + gi * cg + ci) * isz;
                for (int64_t mo = 0; mo < mg; mo++) {
                    const float *ws = wd + ((gi * cg + ci) * mg + mo) * ksz;
                    float *yo = y + (nb * m + gi * mg + mo) * osz;
                    for (int64_t i0 = 0; i0 < in_[0]; i0++)
                    for (int64_t i1 = 0; i1 < in_[1]; i1++)
                    for (int64_t i2 = 0; i2 < in_[2]; i2++) {
                        float xv = xs[(i0 * in_[1] + i1) * in_[2] + i2];
                        for (int64_t k0 = 0; k0 < k[0]; k0++) {
                            int64_t p0 = i0 * s[0] - pb[0] + k0 * d[0];
                            if (p0 < 0 || p0 >= o[0]) continue;
                            for (int64_t k1 = 0; k1 < k[1]; k1++) {
                                int64_t p1 = i1 * s[1] - pb[1] + k1 * d[1];
                                if (p1 < 0 || p1 >= o[1]) continue;
                                for (int64_t k2 = 0; k2 < k[2]; k2++) {
                                    int64_t p2 = i2 * s[2] - pb[2] + k2 * d[2];
                                    if (p2 < 0 || p2 >= o[2]) continue;
                                    yo[(p0 * o[1] + p1) * o[2] + p2] += xv * ws[(k0 * k[1] + k1) * k[2] + k2];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    return 0;
}

/* ---- Resize ---- */

static int
check_resize(sp_ox_node_t *n, char *err, size_t err_len)
{
    const char *mode = sp_ox_attr_s(n, "mode", "nearest");
    if (strcmp(mode, "nearest") && strcmp(mode, "linear") && strcmp(mode, "cubic")) {
        snprintf(err, err_len, "mode \"%s\" is not supported (nearest, linear, cubic)", mode);
        return -1;
    }
    const char *ct = sp_ox_attr_s(n, "coordinate_transformation_mode", "half_pixel");
    static const char *const cts[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                      "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize", NULL};
    bool ok = false;
    for (int i = 0; cts[i]; i++) ok |= strcmp(ct, cts[i]) == 0;
    if (!ok) {
        snprintf(err, err_len, "coordinate_transformation_mode \"%s\" is not supported", ct);
        return -1;
    }
    const char *nm = sp_ox_attr_s(n, "nearest_mode", "round_prefer_floor");
    if (strcmp(nm, "round_prefer_floor") && strcmp(nm, "round_prefer_ceil") && strcmp(nm, "floor") && strcmp(nm, "ceil")) {
        snprintf(err, err_len, "nearest_mode \"%s\" is not supported", nm);
        return -1;
    }
    if (sp_ox_attr_i(n, "antialias", 0) != 0 || sp_ox_attr(n, "axes") || strcmp(sp_ox_attr_s(n, "keep_aspect_ratio_policy", "stretch"), "stretch")) {
        snprintf(err, err_len, "antialias, axes and keep_aspect_ratio_policy are not supported");
        return -1;
    }
    return 0;
}

typedef struct rs_axis {
    int64_t at[4];    /* input indices of the taps: nearest 1, linear 2, cubic 4 */
    double w[4];      /* their weights */
    bool outside;     /* tf_crop_and_resize: the extrapolation value */
} rs_axis_t;

static int
run_resize(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
           sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0];
    if (x->dtype != OX_FLOAT) return sp_ox_fail(r, "%s input is not supported (FLOAT only)", sp_ox_dtype_name(x->dtype));
    int nd = x->nd;
    if (nd < 1 || nd > 4) return sp_ox_fail(r, "input of rank %d (1 to 4)", nd);
    /* opset 10: (X, scales); 11+: (X, roi, scales, sizes) */
    const sp_ox_tensor_t *roi = NULL, *sc = NULL, *sz = NULL;
    if (n->opset < 11) sc = ni > 1 ? in[1] : NULL;
    else {
        roi = ni > 1 ? in[1] : NULL;
        sc = ni > 2 ? in[2] : NULL;
        sz = ni > 3 ? in[3] : NULL;
    }
    if (sc && sp_ox_numel(sc) == 0) sc = NULL;
    if (roi && sp_ox_numel(roi) == 0) roi = NULL;
    double scale[4];
    int64_t od[4];
    if (sz) {
        int64_t cnt;
        if (sp_ox_tensor_ints(r, sz, od, 4, &cnt)) return -1;
        if (cnt != nd || sc) return sp_ox_fail(r, "sizes must give every dimension, without scales");
        for (int i = 0; i < nd; i++) {
            if (od[i] < 0 || od[i] > r->g->max_numel) return sp_ox_fail(r, "size %lld", (long long)od[i]);
            scale[i] = x->dims[i] ? (double)od[i] / (double)x->dims[i] : 1.0;
        }
    } else {
        if (sc == NULL || sc->dtype != OX_FLOAT || sp_ox_numel(sc) != nd) return sp_ox_fail(r, "scales (one FLOAT per dimension) or sizes are required");
        for (int i = 0; i < nd; i++) {
            float v = ((const float *)sc->data)[i];
            if (!(v > 0) || !isfinite(v)) return sp_ox_fail(r, "scale %g", (double)v);
            scale[i] = v;
            double o = floor((double)x->dims[i] * v);
            if (o > (double)r->g->max_numel) return sp_ox_fail(r, "output too large");
            od[i] = (int64_t)o;
        }
    }
    const char *mode = sp_ox_attr_s(n, "mode", "nearest");
    bool linear = strcmp(mode, "linear") == 0, cubic = strcmp(mode, "cubic") == 0;
    double ca = sp_ox_attr_f(n, "cubic_coeff_a", -0.75f);
    bool excl = sp_ox_attr_i(n, "exclude_outside", 0) != 0;
    char ct[40], nm[24];
    snprintf(ct, sizeof ct, "%s", sp_ox_attr_s(n, "coordinate_transformation_mode", n->opset < 11 ? "asymmetric" : "half_pixel"));
    snprintf(nm, sizeof nm, "%s", sp_ox_attr_s(n, "nearest_mode", n->opset < 11 ? "floor" : "round_prefer_floor"));
    if (n->opset < 11 && !linear) snprintf(nm, sizeof nm, "floor");
    bool crop = strcmp(ct, "tf_crop_and_resize") == 0;
    if (crop && (roi == NULL || roi->dtype != OX_FLOAT || sp_ox_numel(roi) != 2 * nd)) return sp_ox_fail(r, "tf_crop_and_resize needs a FLOAT roi of %d values", 2 * nd);
    float extrap = sp_ox_attr_f(n, "extrapolation_value", 0.0f);
    if (sp_ox_out(r, out[0], OX_FLOAT, nd, od)) return -1;
    if (sp_ox_numel(out[0]) > 0) {
        for (int i = 0; i < nd; i++) {
            if (x->dims[i] == 0) return sp_ox_fail(r, "resizing an empty dimension (%d) to %lld", i, (long long)od[i]);
        }
    }
    /* per axis, per output index: the input indices and weights */
    int64_t tot = 0;
    for (int i = 0; i < nd; i++) tot += od[i];
    rs_axis_t *ax = malloc((size_t)(tot + 1) * sizeof *ax);
    if (ax == NULL) return sp_ox_fail(r, "out of memory");
    rs_axis_t *axp[4];
    int64_t off = 0;
    for (int i = 0; i < nd; i++) {
        axp[i] = ax + off;
        off += od[i];
        int64_t len = x->dims[i];
        double s = scale[i];
        for (int64_t o = 0; o < od[i]; o++) {
            double xo;
            if (strcmp(ct, "half_pixel") == 0) xo = (o + 0.5) / s - 0.5;
            else if (strcmp(ct, "half_pixel_symmetric") == 0) {
                double adj = (double)od[i] / (s * (double)len), center = (double)len / 2;
                xo = center * (1 - adj) + (o + 0.5) / s - 0.5;
            } else if (strcmp(ct, "pytorch_half_pixel") == 0) xo = od[i] > 1 ? (o + 0.5) / s - 0.5 : 0;
            else if (strcmp(ct, "align_corners") == 0) {
                /* the resized length is len * scale before flooring (ONNX's reference) */
                double rl = (double)len * s;
                xo = rl > 1 ? (double)o * (double)(len - 1) / (rl - 1) : 0;
            }
            else if (strcmp(ct, "tf_half_pixel_for_nn") == 0) xo = (o + 0.5) / s;
            else if (crop) {
                double st = ((const float *)roi->data)[i], en = ((const float *)roi->data)[i + nd];
                xo = od[i] > 1 ? st * (len - 1) + o * (en - st) * (len - 1) / (double)(od[i] - 1)
                               : 0.5 * (st + en) * (len - 1);
            } else xo = o / s; /* asymmetric */
            rs_axis_t *a = &axp[i][o];
            if (!isfinite(xo)) {
                free(ax);
                return sp_ox_fail(r, "axis %d: input coordinate %g (scales or roi)", i, xo);
            }
            a->outside = crop && (xo < 0 || xo > (double)(len - 1));
            /* only crop mode reaches far outside, and there the extrapolation value is used:
             * bounding the coordinate keeps every index computation in range */
            if (xo < -4) xo = -4;
            if (xo > (double)len + 4) xo = (double)len + 4;
            if (cubic) {
                /* ONNX's cubic convolution (Keys, coefficient A): taps floor(x)-1 .. floor(x)+2,
                 * edge-clamped; exclude_outside drops taps outside the input and renormalizes */
                double f = floor(xo), t = xo - f, ta = t + 1, tb = 1 - t, tc = 2 - t;
                double c4[4] = {((ca * ta - 5 * ca) * ta + 8 * ca) * ta - 4 * ca,
                                ((ca + 2) * t - (ca + 3)) * t * t + 1,
                                ((ca + 2) * tb - (ca + 3)) * tb * tb + 1,
                                ((ca * tc - 5 * ca) * tc + 8 * ca) * tc - 4 * ca};
                double sum = 0;
                for (int q = 0; q < 4; q++) {
                    int64_t k = (int64_t)f - 1 + q;
                    bool in_range = k >= 0 && k < len;
                    a->w[q] = excl && !in_range ? 0 : c4[q];
                    a->at[q] = k < 0 ? 0 : k >= len ? len - 1 : k;
                    sum += a->w[q];
                }
                if (excl && sum != 0) {
                    for (int q = 0; q < 4; q++) a->w[q] /= sum;
                }
            } else if (linear) {
                double cc = xo < 0 ? 0 : xo > (double)(len - 1) ? (double)(len - 1) : xo;
                int64_t lo = (int64_t)floor(cc);
                if (lo > len - 1) lo = len - 1;
                if (lo < 0) lo = 0;
                a->at[0] = lo;
                a->at[1] = lo + 1 < len ? lo + 1 : lo;
                a->w[1] = cc - (double)lo;
                a->w[0] = 1.0 - a->w[1];
                a->w[2] = a->w[3] = 0;
                a->at[2] = a->at[3] = lo;
            } else {
                double v;
                if (strcmp(nm, "floor") == 0) v = floor(xo);
                else if (strcmp(nm, "ceil") == 0) v = ceil(xo);
                else if (strcmp(nm, "round_prefer_ceil") == 0) v = floor(xo + 0.5);
                else v = xo == floor(xo) + 0.5 ? floor(xo) : floor(xo + 0.5); /* round_prefer_floor */
                int64_t k = (int64_t)(v < 0 ? 0 : v > (double)(len - 1) ? (double)(len - 1) : v);
                for (int q = 0; q < 4; q++) {
                    a->at[q] = k;
                    a->w[q] = q == 0 ? 1 : 0;
                }
            }
        }
    }
    int64_t xs[4] = {1, 1, 1, 1}, total = sp_ox_numel(out[0]), idx[4] = {0};
    for (int i = nd - 2; i >= 0; i--) xs[i] = xs[i + 1] * x->dims[i + 1];
    const float *xd = x->data;
    float *y = out[0]->data;
    for (int64_t e = 0; e < total; e++) {
        bool outside = false;
        for (int i = 0; i < nd; i++) outside |= axp[i][idx[i]].outside;
        if (outside) {
            y[e] = extrap;
        } else {
            /* sum over the 4^nd tap combinations (weight 0 skipped) */
            double acc = 0;
            int ntap = cubic ? 4 : linear ? 2 : 1;
            int combos = 1;
            for (int i = 0; i < nd; i++) combos *= ntap;
            for (int cmb = 0; cmb < combos; cmb++) {
                double wgt = 1;
                int64_t p = 0;
                int rest = cmb;
                for (int i = 0; i < nd && wgt != 0; i++) {
                    const rs_axis_t *a = &axp[i][idx[i]];
                    int q = rest % ntap;
                    rest /= ntap;
                    wgt *= a->w[q];
                    p += a->at[q] * xs[i];
                }
                if (wgt != 0) acc += wgt * xd[p];
            }
            y[e] = (float)acc;
        }
        for (int i = nd - 1; i >= 0; i--) {
            if (++idx[i] < od[i]) break;
            idx[i] = 0;
        }
    }
    free(ax);
    return 0;
}

static const char *const A_CONVT[] = {"auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                                      "output_shape", "pads", "strides", NULL};
static const char *const A_RESIZE[] = {"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                                       "exclude_outside", "extrapolation_value", "antialias", "axes",
                                       "keep_aspect_ratio_policy", NULL};

static int
check_convt(sp_ox_node_t *n, char *err, size_t err_len)
{
    const char *ap = sp_ox_attr_s(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "SAME_UPPER") && strcmp(ap, "SAME_LOWER") && strcmp(ap, "VALID")) {
        snprintf(err, err_len, "auto_pad \"%s\" is not supported", ap);
        return -1;
    }
    return 0;
}

static const sp_ox_op_t more_ops[] = {
    {"ConvTranspose", A_CONVT, 2, 3, 1, 1, check_convt, run_convt},
    {"Resize", A_RESIZE, 1, 4, 1, 1, check_resize, run_resize},
};

const sp_ox_op_t *
sp_ox_more_op_find(const char *op_type)
{
    for (size_t i = 0; i < sizeof more_ops / sizeof more_ops[0]; i++) {
        if (strcmp(more_ops[i].name, op_type) == 0) return &more_ops[i];
    }
    return NULL;
}
