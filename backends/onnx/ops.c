/*
 * backends/onnx/ops.c - the operators that move and combine tensors:
 * elementwise (numpy broadcasting), shape manipulation, reductions,
 * Softmax, LayerNormalization, Pad, Cast, Where, Constant; and the table
 * of every operator (sp_ox_op_find), which also lists ops_nn.c's Conv, pools,
 * BatchNormalization, Gemm and MatMul. Each entry is one implementation
 * behind one function pointer, so a faster one (oneDNN) can replace it.
 *
 * Threads: none; each run writes only its own outputs.
 * Memory: outputs come from the run's pool (sp_ox_out).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"
#include "ops.h"

/* ---- broadcasting ---- */

int
sp_ox_bcast_shape(sp_ox_run_t *r, const sp_ox_tensor_t *const *in, int n, int64_t *dims, int32_t *nd)
{
    int32_t m = 0;
    for (int i = 0; i < n; i++) {
        if (in[i]->nd > m) m = in[i]->nd;
    }
    for (int d = 0; d < m; d++) {
        int64_t v = 1;
        for (int i = 0; i < n; i++) {
            int off = d - (m - in[i]->nd);
            if (off < 0) continue;
            int64_t x = in[i]->dims[off];
            if (x == v || x == 1) continue;
            if (v != 1) {
                char a[128], b[128];
                sp_ox_shape_str(in[0]->dims, in[0]->nd, a, sizeof a);
                sp_ox_shape_str(in[i]->dims, in[i]->nd, b, sizeof b);
                return sp_ox_fail(r, "shapes %s and %s do not broadcast", a, b);
            }
            v = x;
        }
        dims[d] = v;
    }
    *nd = m;
    return 0;
}

/* Call row() for every run of the last output dimension, with each input's
 * pointer and its stride (elements) along that dimension. */
void
sp_ox_bcast_rows(const sp_ox_tensor_t *out, const sp_ox_tensor_t *const *in, int n, sp_ox_row_fn row,
              const void *ctx)
{
    int32_t nd = out->nd;
    int64_t st[4][OX_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        int64_t s = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int off = d - (nd - in[i]->nd);
            int64_t dim = off >= 0 ? in[i]->dims[off] : 1;
            st[i][d] = dim == 1 ? 0 : s;
            s *= dim;
        }
    }
    int64_t inner = nd ? out->dims[nd - 1] : 1;
    int64_t total = sp_ox_numel(out);
    if (total == 0) return;
    int64_t outer = total / inner;
    int64_t idx[OX_MAX_DIMS] = {0};
    size_t osz = sp_ox_dtype_size(out->dtype);
    int64_t istride[4];
    for (int i = 0; i < n; i++) istride[i] = nd ? st[i][nd - 1] : 0;
    for (int64_t o = 0; o < outer; o++) {
        const void *p[4];
        for (int i = 0; i < n; i++) {
            int64_t off = 0;
            for (int d = 0; d < nd - 1; d++) off += idx[d] * st[i][d];
            p[i] = (const char *)in[i]->data + off * (int64_t)sp_ox_dtype_size(in[i]->dtype);
        }
        row((char *)out->data + o * inner * (int64_t)osz, p, istride, inner, ctx);
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < out->dims[d]) break;
            idx[d] = 0;
        }
    }
}

/* ---- binary arithmetic ---- */

typedef enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW } bop_t;

#define BIN_ROW(NAME, T, EXPR)                                                                   \
    static void NAME(void *o, const void *const *in, const int64_t *s, int64_t n, const void *c) \
    {                                                                                            \
        (void)c;                                                                                 \
        T *y = o;                                                                                \
        const T *a = in[0], *b = in[1];                                                          \
        int64_t sa = s[0], sb = s[1];                                                            \
        if (sa == 1 && sb == 1) {                                                                \
            for (int64_t i = 0; i < n; i++) { T x = a[i], z = b[i]; y[i] = (EXPR); }             \
        } else {                                                                                 \
            for (int64_t i = 0; i < n; i++) { T x = a[i * sa], z = b[i * sb]; y[i] = (EXPR); }   \
        }                                                                                        \
    }
BIN_ROW(add_f, float, x + z)
BIN_ROW(sub_f, float, x - z)
BIN_ROW(mul_f, float, x * z)
BIN_ROW(div_f, float, x / z)
BIN_ROW(pow_f, float, powf(x, z))
BIN_ROW(add_l, int64_t, (int64_t)((uint64_t)x + (uint64_t)z))
BIN_ROW(sub_l, int64_t, (int64_t)((uint64_t)x - (uint64_t)z))
BIN_ROW(mul_l, int64_t, (int64_t)((uint64_t)x * (uint64_t)z))
BIN_ROW(div_l, int64_t, z == 0 || (z == -1 && x == INT64_MIN) ? 0 : x / z)
BIN_ROW(add_i, int32_t, (int32_t)((uint32_t)x + (uint32_t)z))
BIN_ROW(sub_i, int32_t, (int32_t)((uint32_t)x - (uint32_t)z))
BIN_ROW(mul_i, int32_t, (int32_t)((uint32_t)x * (uint32_t)z))
BIN_ROW(div_i, int32_t, z == 0 || (z == -1 && x == INT32_MIN) ? 0 : x / z)
BIN_ROW(add_u8, uint8_t, (uint8_t)(x + z))
BIN_ROW(sub_u8, uint8_t, (uint8_t)(x - z))
BIN_ROW(mul_u8, uint8_t, (uint8_t)(x * z))
BIN_ROW(div_u8, uint8_t, z == 0 ? 0 : (uint8_t)(x / z))
BIN_ROW(add_s8, int8_t, (int8_t)(x + z))
BIN_ROW(sub_s8, int8_t, (int8_t)(x - z))
BIN_ROW(mul_s8, int8_t, (int8_t)(x * z))
BIN_ROW(div_s8, int8_t, z == 0 ? 0 : (int8_t)(x / z))

static double
num_at(const void *p, int32_t dtype, int64_t i)
{
    switch (dtype) {
    case OX_FLOAT: return ((const float *)p)[i];
    case OX_INT64: return (double)((const int64_t *)p)[i];
    case OX_INT32: return ((const int32_t *)p)[i];
    case OX_INT8: return ((const int8_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

/* Pow of mixed or integer types: computed in double, stored as the base's type
 * (integer results are exact while they fit in 53 bits). */
static void
pow_any(void *o, const void *const *in, const int64_t *s, int64_t n, const void *c)
{
    const int32_t *t = c;
    for (int64_t i = 0; i < n; i++) {
        double v = pow(num_at(in[0], t[0], i * s[0]), num_at(in[1], t[1], i * s[1]));
        switch (t[0]) {
        case OX_FLOAT: ((float *)o)[i] = (float)v; break;
        case OX_INT64: ((int64_t *)o)[i] = isfinite(v) && fabs(v) < 9.2e18 ? (int64_t)v : 0; break;
        default: ((int32_t *)o)[i] = isfinite(v) && fabs(v) < 2.1e9 ? (int32_t)v : 0; break;
        }
    }
}

/* Pow with an integer exponent tensor: the exponent is read as its own type. */
static void
pow_fl(void *o, const void *const *in, const int64_t *s, int64_t n, const void *c)
{
    (void)c;
    float *y = o;
    const float *a = in[0];
    const int64_t *b = in[1];
    for (int64_t i = 0; i < n; i++) y[i] = powf(a[i * s[0]], (float)b[i * s[1]]);
}

static void
pow_fi(void *o, const void *const *in, const int64_t *s, int64_t n, const void *c)
{
    (void)c;
    float *y = o;
    const float *a = in[0];
    const int32_t *b = in[1];
    for (int64_t i = 0; i < n; i++) y[i] = powf(a[i * s[0]], (float)b[i * s[1]]);
}

static int
run_binary(sp_ox_run_t *r, const sp_ox_tensor_t *const *in, sp_ox_tensor_t *out, bop_t op)
{
    const sp_ox_tensor_t *a = in[0], *b = in[1];
    sp_ox_row_fn fn = NULL;
    int32_t types[2] = {a->dtype, b->dtype};
    bool num_b = b->dtype == OX_FLOAT || b->dtype == OX_INT64 || b->dtype == OX_INT32;
    if (op == B_POW) {
        if (a->dtype == OX_FLOAT) {
            fn = b->dtype == OX_FLOAT ? pow_f : b->dtype == OX_INT64 ? pow_fl
               : b->dtype == OX_INT32 ? pow_fi : NULL;
        } else if ((a->dtype == OX_INT64 || a->dtype == OX_INT32) && num_b) {
            fn = pow_any;
        }
    } else if (a->dtype == b->dtype) {
        static const sp_ox_row_fn tf[] = {add_f, sub_f, mul_f, div_f};
        static const sp_ox_row_fn tl[] = {add_l, sub_l, mul_l, div_l};
        static const sp_ox_row_fn ti[] = {add_i, sub_i, mul_i, div_i};
        static const sp_ox_row_fn tu8[] = {add_u8, sub_u8, mul_u8, div_u8};
        static const sp_ox_row_fn ts8[] = {add_s8, sub_s8, mul_s8, div_s8};
        fn = a->dtype == OX_FLOAT ? tf[op] : a->dtype == OX_INT64 ? tl[op]
           : a->dtype == OX_INT32 ? ti[op] : a->dtype == OX_UINT8 ? tu8[op]
           : a->dtype == OX_INT8 ? ts8[op] : NULL;
    }
    if (fn == NULL) {
        return sp_ox_fail(r, "%s and %s operands are not supported", sp_ox_dtype_name(a->dtype),
                       sp_ox_dtype_name(b->dtype));
    }
    int64_t dims[OX_MAX_DIMS];
    int32_t nd;
    if (sp_ox_bcast_shape(r, in, 2, dims, &nd) || sp_ox_out(r, out, a->dtype, nd, dims)) return -1;
    sp_ox_bcast_rows(out, in, 2, fn, types);
    return 0;
}

#define BIN_OP(NAME, OP)                                                                  \
    static int NAME(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,    \
                    sp_ox_tensor_t *const *out, int no)                                      \
    {                                                                                     \
        (void)n; (void)ni; (void)no;                                                      \
        return run_binary(r, in, out[0], OP);                                             \
    }
BIN_OP(run_add, B_ADD)
BIN_OP(run_sub, B_SUB)
BIN_OP(run_mul, B_MUL)
BIN_OP(run_div, B_DIV)
BIN_OP(run_pow, B_POW)

/* ---- unary float ---- */

typedef enum {
    U_RELU, U_LEAKY, U_SIGMOID, U_TANH, U_GELU, U_GELU_TANH, U_ERF, U_HSWISH, U_HSIGMOID,
    U_SQRT, U_EXP, U_LOG, U_NEG, U_ABS, U_RECIP, U_CLIP,
} uop_t;

static int
run_unary(sp_ox_run_t *r, const sp_ox_tensor_t *x, sp_ox_tensor_t *out, uop_t op, float p0, float p1)
{
    if (x->dtype != OX_FLOAT) return sp_ox_fail(r, "%s input is not supported (FLOAT only)", sp_ox_dtype_name(x->dtype));
    if (sp_ox_out(r, out, OX_FLOAT, x->nd, x->dims)) return -1;
    const float *a = x->data;
    float *y = out->data;
    int64_t n = sp_ox_numel(x);
    switch (op) {
    case U_RELU: for (int64_t i = 0; i < n; i++) y[i] = a[i] > 0 ? a[i] : 0.0f; break;
    case U_LEAKY: for (int64_t i = 0; i < n; i++) y[i] = a[i] >= 0 ? a[i] : a[i] * p0; break;
    case U_SIGMOID: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-a[i])); break;
    case U_TANH: for (int64_t i = 0; i < n; i++) y[i] = tanhf(a[i]); break;
    case U_GELU:
        for (int64_t i = 0; i < n; i++) y[i] = 0.5f * a[i] * (1.0f + erff(a[i] * 0.70710678f));
        break;
    case U_GELU_TANH:
        for (int64_t i = 0; i < n; i++) {
            float v = a[i];
            y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
        }
        break;
    case U_ERF: for (int64_t i = 0; i < n; i++) y[i] = erff(a[i]); break;
    case U_HSWISH:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] * fmaxf(0.0f, fminf(1.0f, a[i] / 6.0f + 0.5f));
        break;
    case U_HSIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = fmaxf(0.0f, fminf(1.0f, p0 * a[i] + p1));
        break;
    case U_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrtf(a[i]); break;
    case U_EXP: for (int64_t i = 0; i < n; i++) y[i] = expf(a[i]); break;
    case U_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(a[i]); break;
    case U_NEG: for (int64_t i = 0; i < n; i++) y[i] = -a[i]; break;
    case U_ABS: for (int64_t i = 0; i < n; i++) y[i] = fabsf(a[i]); break;
    case U_RECIP: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / a[i]; break;
    case U_CLIP:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] < p0 ? p0 : a[i] > p1 ? p1 : a[i];
        break;
    }
    return 0;
}

#define UN_OP(NAME, OP)                                                                   \
    static int NAME(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,    \
                    sp_ox_tensor_t *const *out, int no)                                      \
    {                                                                                     \
        (void)n; (void)ni; (void)no;                                                      \
        return run_unary(r, in[0], out[0], OP, 0, 0);                                     \
    }
UN_OP(run_relu, U_RELU)
UN_OP(run_sigmoid, U_SIGMOID)
UN_OP(run_tanh, U_TANH)
UN_OP(run_erf, U_ERF)
UN_OP(run_hswish, U_HSWISH)
UN_OP(run_sqrt, U_SQRT)
UN_OP(run_exp, U_EXP)
UN_OP(run_log, U_LOG)
UN_OP(run_neg, U_NEG)
UN_OP(run_abs, U_ABS)
UN_OP(run_recip, U_RECIP)

static int
run_leaky(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out,
          int no)
{
    (void)ni; (void)no;
    return run_unary(r, in[0], out[0], U_LEAKY, sp_ox_attr_f(n, "alpha", 0.01f), 0);
}

static int
run_hsigmoid(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
             sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    return run_unary(r, in[0], out[0], U_HSIGMOID, sp_ox_attr_f(n, "alpha", 0.2f),
                     sp_ox_attr_f(n, "beta", 0.5f));
}

static int
check_gelu(sp_ox_node_t *n, char *err, size_t err_len)
{
    const char *a = sp_ox_attr_s(n, "approximate", "none");
    if (strcmp(a, "none") != 0 && strcmp(a, "tanh") != 0) {
        snprintf(err, err_len, "approximate \"%s\" (none or tanh)", a);
        return -1;
    }
    return 0;
}

static int
run_gelu(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out,
         int no)
{
    (void)ni; (void)no;
    bool t = strcmp(sp_ox_attr_s(n, "approximate", "none"), "tanh") == 0;
    return run_unary(r, in[0], out[0], t ? U_GELU_TANH : U_GELU, 0, 0);
}

static int
run_clip(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out,
         int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0];
    double lo = -INFINITY, hi = INFINITY;
    if (n->opset < 11) {
        lo = sp_ox_attr_f(n, "min", -INFINITY);
        hi = sp_ox_attr_f(n, "max", INFINITY);
    } else {
        for (int k = 1; k < ni && k < 3; k++) {
            if (in[k] == NULL) continue;
            if (in[k]->dtype != x->dtype || sp_ox_numel(in[k]) != 1) {
                return sp_ox_fail(r, "input %d must be a scalar of the input's type", k);
            }
            double v = num_at(in[k]->data, in[k]->dtype, 0);
            if (k == 1) lo = v; else hi = v;
        }
    }
    if (x->dtype == OX_FLOAT) return run_unary(r, x, out[0], U_CLIP, (float)lo, (float)hi);
    if (x->dtype != OX_INT64 && x->dtype != OX_INT32 && x->dtype != OX_INT8 && x->dtype != OX_UINT8) {
        return sp_ox_fail(r, "%s input is not supported", sp_ox_dtype_name(x->dtype));
    }
    /* Integers: compared as doubles (exact for every INT32/INT8/UINT8 value, and for INT64 up
     * to 2^53), and the original value kept when inside the bounds. */
    if (sp_ox_out(r, out[0], x->dtype, x->nd, x->dims)) return -1;
    size_t es = sp_ox_dtype_size(x->dtype);
    int64_t cnt = sp_ox_numel(x);
    for (int64_t i = 0; i < cnt; i++) {
        double v = num_at(x->data, x->dtype, i);
        const void *src = (const char *)x->data + i * (int64_t)es;
        if (v < lo || v > hi) {
            int64_t c = (int64_t)(v < lo ? lo : hi); /* a bound of the input's type: finite */
            switch (x->dtype) {
            case OX_INT64: ((int64_t *)out[0]->data)[i] = c; break;
            case OX_INT32: ((int32_t *)out[0]->data)[i] = (int32_t)c; break;
            case OX_INT8: ((int8_t *)out[0]->data)[i] = (int8_t)c; break;
            default: ((uint8_t *)out[0]->data)[i] = (uint8_t)c; break;
            }
        } else {
            memcpy((char *)out[0]->data + i * (int64_t)es, src, es);
        }
    }
    return 0;
}

/* ---- data movement ---- */

static int
copy_as(sp_ox_run_t *r, const sp_ox_tensor_t *x, sp_ox_tensor_t *out, int32_t nd, const int64_t *dims)
{
    if (sp_ox_out(r, out, x->dtype, nd, dims)) return -1;
    size_t bytes = (size_t)sp_ox_numel(x) * sp_ox_dtype_size(x->dtype);
    if (bytes) memcpy(out->data, x->data, bytes);
    return 0;
}

static int
run_identity(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
             sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)ni; (void)no;
    return copy_as(r, in[0], out[0], in[0]->nd, in[0]->dims);
}

static int
norm_axis(sp_ox_run_t *r, int64_t axis, int32_t nd, int64_t *out)
{
    *out = 0;
    if (axis < -(int64_t)nd || axis >= (nd ? nd : 1)) {
        return sp_ox_fail(r, "axis %lld out of range for %d dimensions", (long long)axis, nd);
    }
    *out = axis < 0 ? axis + nd : axis;
    return 0;
}

static int
run_reshape(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
            sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    int64_t shape[OX_MAX_DIMS + 1], k;
    if (sp_ox_tensor_ints(r, in[1], shape, OX_MAX_DIMS, &k)) return -1;
    bool allowzero = sp_ox_attr_i(n, "allowzero", 0) != 0;
    int64_t known = 1, infer = -1;
    for (int64_t i = 0; i < k; i++) {
        if (shape[i] == 0 && !allowzero) {
            if (i >= in[0]->nd) return sp_ox_fail(r, "shape[%lld] = 0 past the input's rank", (long long)i);
            shape[i] = in[0]->dims[i];
        }
        if (shape[i] == -1) {
            if (infer >= 0) return sp_ox_fail(r, "more than one -1 in the shape");
            infer = i;
        } else if (shape[i] < 0) {
            return sp_ox_fail(r, "shape[%lld] = %lld", (long long)i, (long long)shape[i]);
        } else {
            known *= shape[i];
            if (known > ((int64_t)1 << 40)) return sp_ox_fail(r, "shape too large");
        }
    }
    int64_t total = sp_ox_numel(in[0]);
    if (infer >= 0) {
        if (known == 0 || total % known) return sp_ox_fail(r, "cannot infer the -1 dimension");
        shape[infer] = total / known;
        known *= shape[infer];
    }
    if (known != total) {
        char a[128], b[128];
        sp_ox_shape_str(in[0]->dims, in[0]->nd, a, sizeof a);
        sp_ox_shape_str(shape, (int)k, b, sizeof b);
        return sp_ox_fail(r, "cannot reshape %s into %s", a, b);
    }
    return copy_as(r, in[0], out[0], (int32_t)k, shape);
}

static int
run_flatten(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
            sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    int64_t axis = sp_ox_attr_i(n, "axis", 1);
    int32_t nd = in[0]->nd;
    if (axis < -(int64_t)nd || axis > nd) return sp_ox_fail(r, "axis %lld out of range", (long long)axis);
    if (axis < 0) axis += nd;
    int64_t d[2] = {1, 1};
    for (int i = 0; i < nd; i++) d[i < axis ? 0 : 1] *= in[0]->dims[i];
    return copy_as(r, in[0], out[0], 2, d);
}

/* Axes from an attribute (older opsets) or the second input. */
static int
get_axes(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, int idx, int64_t from_opset,
         int64_t *axes, int64_t *k)
{
    *k = 0;
    if (n->opset < from_opset) {
        size_t c;
        const int64_t *a = sp_ox_attr_ints(n, "axes", &c);
        if (c > OX_MAX_DIMS * 2) return sp_ox_fail(r, "too many axes");
        for (size_t i = 0; i < c; i++) axes[i] = a[i];
        *k = (int64_t)c;
        return 0;
    }
    if (ni > idx && in[idx]) return sp_ox_tensor_ints(r, in[idx], axes, OX_MAX_DIMS * 2, k);
    return 0;
}

static int
run_squeeze(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
            sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    int64_t axes[OX_MAX_DIMS * 2], k;
    if (get_axes(r, n, in, ni, 1, 13, axes, &k)) return -1;
    const sp_ox_tensor_t *x = in[0];
    bool drop[OX_MAX_DIMS] = {0};
    for (int64_t i = 0; i < k; i++) {
        int64_t a;
        if (norm_axis(r, axes[i], x->nd, &a)) return -1;
        if (x->dims[a] != 1) return sp_ox_fail(r, "dimension %lld is %lld, not 1", (long long)a, (long long)x->dims[a]);
        drop[a] = true;
    }
    int64_t d[OX_MAX_DIMS];
    int32_t m = 0;
    for (int i = 0; i < x->nd; i++) {
        if (k ? !drop[i] : x->dims[i] != 1) d[m++] = x->dims[i];
    }
    return copy_as(r, x, out[0], m, d);
}

static int
run_unsqueeze(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
              sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    int64_t axes[OX_MAX_DIMS * 2], k;
    if (get_axes(r, n, in, ni, 1, 13, axes, &k)) return -1;
    const sp_ox_tensor_t *x = in[0];
    int32_t m = x->nd + (int32_t)k;
    if (k == 0 || m > OX_MAX_DIMS) return sp_ox_fail(r, "%lld axes for a rank-%d input", (long long)k, x->nd);
    bool ins[OX_MAX_DIMS] = {0};
    for (int64_t i = 0; i < k; i++) {
        int64_t a;
        if (norm_axis(r, axes[i], m, &a)) return -1;
        if (ins[a]) return sp_ox_fail(r, "axis %lld given twice", (long long)axes[i]);
        ins[a] = true;
    }
    int64_t d[OX_MAX_DIMS];
    for (int i = 0, j = 0; i < m; i++) d[i] = ins[i] ? 1 : x->dims[j++];
    return copy_as(r, x, out[0], m, d);
}

/* Strided copy: out[idx] = in[base + sum(idx[d] * st[d])] elementwise, any type. */
static void
gather_strided(const sp_ox_tensor_t *x, sp_ox_tensor_t *out, int64_t base, const int64_t *st)
{
    size_t es = sp_ox_dtype_size(x->dtype);
    int64_t total = sp_ox_numel(out);
    int64_t idx[OX_MAX_DIMS] = {0};
    int32_t nd = out->nd;
    const char *src = x->data;
    char *dst = out->data;
    int64_t off = base;
    for (int64_t i = 0; i < total; i++) {
        memcpy(dst + i * (int64_t)es, src + off * (int64_t)es, es);
        for (int d = nd - 1; d >= 0; d--) {
            off += st[d];
            if (++idx[d] < out->dims[d]) break;
            off -= st[d] * idx[d];
            idx[d] = 0;
        }
    }
}

static void
strides_of(const sp_ox_tensor_t *x, int64_t *st)
{
    int64_t s = 1;
    for (int d = x->nd - 1; d >= 0; d--) {
        st[d] = s;
        s *= x->dims[d];
    }
}

static int
run_transpose(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
              sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    const sp_ox_tensor_t *x = in[0];
    size_t c;
    const int64_t *perm = sp_ox_attr_ints(n, "perm", &c);
    int64_t p[OX_MAX_DIMS], st[OX_MAX_DIMS], ost[OX_MAX_DIMS], d[OX_MAX_DIMS];
    if (perm && c != (size_t)x->nd) return sp_ox_fail(r, "perm has %zu entries for rank %d", c, x->nd);
    bool seen[OX_MAX_DIMS] = {0};
    for (int i = 0; i < x->nd; i++) {
        p[i] = perm ? perm[i] : x->nd - 1 - i;
        if (p[i] < 0 || p[i] >= x->nd || seen[p[i]]) return sp_ox_fail(r, "perm is not a permutation");
        seen[p[i]] = true;
    }
    strides_of(x, st);
    for (int i = 0; i < x->nd; i++) {
        d[i] = x->dims[p[i]];
        ost[i] = st[p[i]];
    }
    if (sp_ox_out(r, out[0], x->dtype, x->nd, d)) return -1;
    gather_strided(x, out[0], 0, ost);
    return 0;
}

static int
run_concat(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
           sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x0 = in[0];
    int64_t axis;
    if (norm_axis(r, sp_ox_attr_i(n, "axis", 0), x0->nd, &axis)) return -1;
    int64_t d[OX_MAX_DIMS];
    memcpy(d, x0->dims, sizeof d);
    d[axis] = 0;
    for (int i = 0; i < ni; i++) {
        if (in[i] == NULL || in[i]->nd != x0->nd || in[i]->dtype != x0->dtype) {
            return sp_ox_fail(r, "input %d differs in rank or type from input 0", i);
        }
        for (int k = 0; k < x0->nd; k++) {
            if (k != axis && in[i]->dims[k] != x0->dims[k]) {
                return sp_ox_fail(r, "input %d has dimension %d of %lld, input 0 %lld", i, k,
                               (long long)in[i]->dims[k], (long long)x0->dims[k]);
            }
        }
        d[axis] += in[i]->dims[axis];
    }
    if (sp_ox_out(r, out[0], x0->dtype, x0->nd, d)) return -1;
    size_t es = sp_ox_dtype_size(x0->dtype);
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < axis; k++) outer *= d[k];
    for (int k = (int)axis + 1; k < x0->nd; k++) inner *= d[k];
    char *dst = out[0]->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int i = 0; i < ni; i++) {
            size_t chunk = (size_t)(in[i]->dims[axis] * inner) * es;
            if (chunk) memcpy(dst, (const char *)in[i]->data + (size_t)o * chunk, chunk);
            dst += chunk;
        }
    }
    return 0;
}

static int
run_split(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
          sp_ox_tensor_t *const *out, int no)
{
    const sp_ox_tensor_t *x = in[0];
    int64_t axis;
    if (norm_axis(r, sp_ox_attr_i(n, "axis", 0), x->nd, &axis)) return -1;
    int64_t sizes[OX_MAX_IO], k = 0;
    if (n->opset < 13) {
        size_t c;
        const int64_t *s = sp_ox_attr_ints(n, "split", &c);
        if (c > OX_MAX_IO) return sp_ox_fail(r, "too many splits");
        for (size_t i = 0; i < c; i++) sizes[i] = s[i];
        k = (int64_t)c;
    } else if (ni > 1 && in[1]) {
        if (sp_ox_tensor_ints(r, in[1], sizes, OX_MAX_IO, &k)) return -1;
    }
    int64_t dim = x->dims[axis];
    int64_t num_outputs = sp_ox_attr_i(n, "num_outputs", no);
    if (num_outputs != no) {
        return sp_ox_fail(r, "num_outputs %lld for %d outputs", (long long)num_outputs, no);
    }
    if (k == 0) {
        /* Equal parts; from opset 18 the last may be smaller (ceil). */
        int64_t parts = no;
        int64_t each = n->opset >= 18 ? (dim + parts - 1) / parts : dim / parts;
        if (n->opset < 18 && dim % parts) return sp_ox_fail(r, "dimension %lld does not split into %lld equal parts", (long long)dim, (long long)parts);
        for (int64_t i = 0; i < parts; i++) {
            int64_t left = dim - i * each;
            sizes[i] = left < each ? (left > 0 ? left : 0) : each;
        }
        k = parts;
    }
    if (k != no) return sp_ox_fail(r, "%lld split sizes for %d outputs", (long long)k, no);
    int64_t sum = 0;
    for (int64_t i = 0; i < k; i++) {
        if (sizes[i] < 0) return sp_ox_fail(r, "negative split size");
        sum += sizes[i];
    }
    if (sum != dim) return sp_ox_fail(r, "split sizes add up to %lld, the dimension is %lld", (long long)sum, (long long)dim);
    size_t es = sp_ox_dtype_size(x->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= x->dims[d];
    for (int d = (int)axis + 1; d < x->nd; d++) inner *= x->dims[d];
    int64_t start = 0;
    for (int i = 0; i < no; i++) {
        int64_t d[OX_MAX_DIMS];
        memcpy(d, x->dims, sizeof d);
        d[axis] = sizes[i];
        if (sp_ox_out(r, out[i], x->dtype, x->nd, d)) return -1;
        size_t chunk = (size_t)(sizes[i] * inner) * es;
        for (int64_t o = 0; o < outer && chunk; o++) {
            memcpy((char *)out[i]->data + (size_t)o * chunk,
                   (const char *)x->data + ((size_t)(o * dim + start) * (size_t)inner) * es, chunk);
        }
        start += sizes[i];
    }
    return 0;
}

static int
run_slice(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
          sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0];
    int64_t starts[OX_MAX_DIMS], ends[OX_MAX_DIMS], axes[OX_MAX_DIMS], steps[OX_MAX_DIMS];
    int64_t ns, ne, na = -1, nst = -1;
    if (n->opset < 10) {
        size_t c1, c2, c3;
        const int64_t *s = sp_ox_attr_ints(n, "starts", &c1), *e = sp_ox_attr_ints(n, "ends", &c2);
        const int64_t *a = sp_ox_attr_ints(n, "axes", &c3);
        if (c1 > OX_MAX_DIMS || c2 > OX_MAX_DIMS || c3 > OX_MAX_DIMS) return sp_ox_fail(r, "too many slice axes");
        if (c1) memcpy(starts, s, c1 * sizeof *s);
        if (c2) memcpy(ends, e, c2 * sizeof *e);
        if (a && c3) memcpy(axes, a, c3 * sizeof *a);
        ns = (int64_t)c1;
        ne = (int64_t)c2;
        if (a) na = (int64_t)c3;
    } else {
        if (ni < 3) return sp_ox_fail(r, "starts and ends are required");
        if (sp_ox_tensor_ints(r, in[1], starts, OX_MAX_DIMS, &ns) ||
            sp_ox_tensor_ints(r, in[2], ends, OX_MAX_DIMS, &ne)) return -1;
        if (ni > 3 && in[3] && sp_ox_tensor_ints(r, in[3], axes, OX_MAX_DIMS, &na)) return -1;
        if (ni > 4 && in[4] && sp_ox_tensor_ints(r, in[4], steps, OX_MAX_DIMS, &nst)) return -1;
    }
    if (ns != ne || (na >= 0 && na != ns) || (nst >= 0 && nst != ns)) {
        return sp_ox_fail(r, "starts, ends, axes and steps differ in length");
    }
    int64_t d[OX_MAX_DIMS], st[OX_MAX_DIMS], ost[OX_MAX_DIMS], base = 0;
    bool done[OX_MAX_DIMS] = {0};
    strides_of(x, st);
    for (int i = 0; i < x->nd; i++) {
        d[i] = x->dims[i];
        ost[i] = st[i];
    }
    for (int64_t i = 0; i < ns; i++) {
        int64_t a = i;
        if (na >= 0 && norm_axis(r, axes[i], x->nd, &a)) return -1;
        if (a >= x->nd) return sp_ox_fail(r, "more slice entries than dimensions");
        if (done[a]) return sp_ox_fail(r, "axis %lld sliced twice", (long long)a);
        done[a] = true;
        int64_t step = nst >= 0 ? steps[i] : 1, dim = x->dims[a];
        if (step == 0) return sp_ox_fail(r, "step 0");
        int64_t s = starts[i], e = ends[i];
        if (s < 0) s = s < -dim ? 0 : s + dim; /* clamp before adding to stay clear of overflow */
        if (e < 0) e = e < -dim ? -1 : e + dim;
        if (step > 0) {
            s = s < 0 ? 0 : s > dim ? dim : s;
            e = e < 0 ? 0 : e > dim ? dim : e;
        } else {
            s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
            e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
            if (starts[i] < -dim) s = -1;
        }
        int64_t len = step > 0 ? (e > s ? (e - s + step - 1) / step : 0)
                               : (s > e ? (s - e + (-step) - 1) / (-step) : 0);
        d[a] = len;
        if (len > 0) base += s * st[a];
        ost[a] = st[a] * step;
    }
    if (sp_ox_out(r, out[0], x->dtype, x->nd, d)) return -1;
    if (sp_ox_numel(out[0]) > 0) gather_strided(x, out[0], base, ost);
    return 0;
}

static int
run_gather(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
           sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    const sp_ox_tensor_t *x = in[0], *ix = in[1];
    int64_t axis;
    if (norm_axis(r, sp_ox_attr_i(n, "axis", 0), x->nd, &axis)) return -1;
    if (ix->dtype != OX_INT64 && ix->dtype != OX_INT32) return sp_ox_fail(r, "indices must be INT32 or INT64");
    int32_t nd = x->nd - 1 + ix->nd;
    if (nd > OX_MAX_DIMS) return sp_ox_fail(r, "result of %d dimensions", nd);
    int64_t d[OX_MAX_DIMS];
    int32_t m = 0;
    for (int i = 0; i < axis; i++) d[m++] = x->dims[i];
    for (int i = 0; i < ix->nd; i++) d[m++] = ix->dims[i];
    for (int i = (int)axis + 1; i < x->nd; i++) d[m++] = x->dims[i];
    if (sp_ox_out(r, out[0], x->dtype, nd, d)) return -1;
    size_t es = sp_ox_dtype_size(x->dtype);
    int64_t outer = 1, inner = 1, dim = x->dims[axis], ni_ = sp_ox_numel(ix);
    for (int i = 0; i < axis; i++) outer *= x->dims[i];
    for (int i = (int)axis + 1; i < x->nd; i++) inner *= x->dims[i];
    size_t chunk = (size_t)inner * es;
    char *dst = out[0]->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j = 0; j < ni_; j++) {
            int64_t k = ix->dtype == OX_INT64 ? ((const int64_t *)ix->data)[j] : ((const int32_t *)ix->data)[j];
            if (k < -dim || k >= dim) return sp_ox_fail(r, "index %lld out of range [%lld, %lld)", (long long)k, (long long)-dim, (long long)dim);
            if (k < 0) k += dim;
            if (chunk) memcpy(dst, (const char *)x->data + ((size_t)(o * dim + k)) * chunk, chunk);
            dst += chunk;
        }
    }
    return 0;
}

static int
run_shape(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
          sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    int64_t nd = in[0]->nd;
    int64_t s = sp_ox_attr_i(n, "start", 0), e = sp_ox_attr_i(n, "end", nd);
    if (s < 0) s += nd;
    if (e < 0) e += nd;
    s = s < 0 ? 0 : s > nd ? nd : s;
    e = e < 0 ? 0 : e > nd ? nd : e;
    int64_t len = e > s ? e - s : 0;
    if (sp_ox_out(r, out[0], OX_INT64, 1, &len)) return -1;
    for (int64_t i = 0; i < len; i++) ((int64_t *)out[0]->data)[i] = in[0]->dims[s + i];
    return 0;
}

static void
copy_row(void *o, const void *const *in, const int64_t *s, int64_t n, const void *c)
{
    size_t es = *(const size_t *)c;
    for (int64_t i = 0; i < n; i++) memcpy((char *)o + i * (int64_t)es, (const char *)in[0] + i * s[0] * (int64_t)es, es);
}

static int
run_expand(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
           sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)ni; (void)no;
    sp_ox_tensor_t shp = {0};
    int64_t k;
    if (sp_ox_tensor_ints(r, in[1], shp.dims, OX_MAX_DIMS, &k)) return -1;
    shp.nd = (int32_t)k;
    for (int i = 0; i < shp.nd; i++) {
        if (shp.dims[i] < 0) return sp_ox_fail(r, "negative dimension in the shape");
    }
    const sp_ox_tensor_t *pair[2] = {in[0], &shp};
    int64_t d[OX_MAX_DIMS];
    int32_t nd;
    if (sp_ox_bcast_shape(r, pair, 2, d, &nd) || sp_ox_out(r, out[0], in[0]->dtype, nd, d)) return -1;
    size_t es = sp_ox_dtype_size(in[0]->dtype);
    sp_ox_bcast_rows(out[0], in, 1, copy_row, &es);
    return 0;
}

static void
where_row(void *o, const void *const *in, const int64_t *s, int64_t n, const void *c)
{
    size_t es = *(const size_t *)c;
    const uint8_t *cond = in[0];
    for (int64_t i = 0; i < n; i++) {
        const char *src = cond[i * s[0]] ? (const char *)in[1] + i * s[1] * (int64_t)es
                                         : (const char *)in[2] + i * s[2] * (int64_t)es;
        memcpy((char *)o + i * (int64_t)es, src, es);
    }
}

static int
run_where(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
          sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)ni; (void)no;
    if (in[0]->dtype != OX_BOOL || in[1]->dtype != in[2]->dtype) {
        return sp_ox_fail(r, "condition must be BOOL and X, Y of one type");
    }
    int64_t d[OX_MAX_DIMS];
    int32_t nd;
    if (sp_ox_bcast_shape(r, in, 3, d, &nd) || sp_ox_out(r, out[0], in[1]->dtype, nd, d)) return -1;
    size_t es = sp_ox_dtype_size(in[1]->dtype);
    sp_ox_bcast_rows(out[0], in, 3, where_row, &es);
    return 0;
}

/* ---- Cast, Constant ---- */

static double
get_num(const sp_ox_tensor_t *t, int64_t i)
{
    switch (t->dtype) {
    case OX_FLOAT: return ((const float *)t->data)[i];
    case OX_INT64: return (double)((const int64_t *)t->data)[i];
    case OX_INT32: return ((const int32_t *)t->data)[i];
    case OX_INT8: return ((const int8_t *)t->data)[i];
    case OX_FLOAT16: return sp_ox_half_to_float(((const uint16_t *)t->data)[i]);
    case OX_DOUBLE: return ((const double *)t->data)[i];
    default: return ((const uint8_t *)t->data)[i];
    }
}

static int
check_cast(sp_ox_node_t *n, char *err, size_t err_len)
{
    int64_t to = sp_ox_attr_i(n, "to", 0);
    if (sp_ox_dtype_size((int32_t)to) == 0 || to == OX_INT16 || to > 16) {
        snprintf(err, err_len, "cast to %s (%lld) is not supported", sp_ox_dtype_name((int32_t)to), (long long)to);
        return -1;
    }
    return 0;
}

static int
run_cast(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
         sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    const sp_ox_tensor_t *x = in[0];
    int32_t to = (int32_t)sp_ox_attr_i(n, "to", 0);
    if (sp_ox_out(r, out[0], to, x->nd, x->dims)) return -1;
    int64_t cnt = sp_ox_numel(x);
    if (x->dtype == to) {
        if (cnt) memcpy(out[0]->data, x->data, (size_t)cnt * sp_ox_dtype_size(to));
        return 0;
    }
    for (int64_t i = 0; i < cnt; i++) {
        double v = get_num(x, i);
        /* Out-of-range float to integer is undefined in C: saturate (ONNX leaves it undefined). */
        switch (to) {
        case OX_FLOAT: ((float *)out[0]->data)[i] = (float)v; break;
        case OX_FLOAT16: ((uint16_t *)out[0]->data)[i] = sp_ox_double_to_half(v); break;
        case OX_DOUBLE: ((double *)out[0]->data)[i] = v; break;
        case OX_BOOL: ((uint8_t *)out[0]->data)[i] = v != 0; break;
        case OX_INT64:
            ((int64_t *)out[0]->data)[i] = isnan(v) ? 0 : v >= 9.2e18 ? INT64_MAX : v <= -9.2e18 ? INT64_MIN : (int64_t)v;
            break;
        case OX_INT32:
            ((int32_t *)out[0]->data)[i] = isnan(v) ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
            break;
        case OX_INT8: ((int8_t *)out[0]->data)[i] = (int8_t)(isnan(v) ? 0 : v > 127 ? 127 : v < -128 ? -128 : v); break;
        default: ((uint8_t *)out[0]->data)[i] = (uint8_t)(isnan(v) ? 0 : v > 255 ? 255 : v < 0 ? 0 : v); break;
        }
    }
    return 0;
}

static int
check_constant(sp_ox_node_t *n, char *err, size_t err_len)
{
    if (n->p->n_attribute != 1) {
        snprintf(err, err_len, "exactly one value attribute is required");
        return -1;
    }
    const Onnx__AttributeProto *a = n->p->attribute[0];
    if (strcmp(a->name, "value") == 0 && a->t == NULL) {
        snprintf(err, err_len, "value has no tensor");
        return -1;
    }
    return 0;
}

static int
run_constant(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
             sp_ox_tensor_t *const *out, int no)
{
    (void)in; (void)ni; (void)no;
    const Onnx__AttributeProto *a = n->p->attribute[0];
    if (strcmp(a->name, "value") == 0) {
        sp_ox_tensor_t t;
        /* External data in a Constant has no folder to be read from: refused. */
        if (a->t->has_data_location && a->t->data_location) return sp_ox_fail(r, "external data in a Constant");
        if (sp_ox_tensor_from_proto(a->t, "/nonexistent", "value", &t, r->err, r->err_len)) return -1;
        int rc = copy_as(r, &t, out[0], t.nd, t.dims);
        free(t.data);
        return rc;
    }
    bool ints = strncmp(a->name, "value_int", 9) == 0;
    bool list = strcmp(a->name, "value_floats") == 0 || strcmp(a->name, "value_ints") == 0;
    int64_t cnt = list ? (int64_t)(ints ? a->n_ints : a->n_floats) : 1;
    if (sp_ox_out(r, out[0], ints ? OX_INT64 : OX_FLOAT, list ? 1 : 0, &cnt)) return -1;
    for (int64_t i = 0; i < cnt; i++) {
        if (ints) ((int64_t *)out[0]->data)[i] = list ? a->ints[i] : a->i;
        else ((float *)out[0]->data)[i] = list ? a->floats[i] : a->f;
    }
    return 0;
}

/* ---- Softmax, reductions, LayerNormalization ---- */

static int
run_softmax_any(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *x, sp_ox_tensor_t *out, bool logsm)
{
    if (x->dtype != OX_FLOAT) return sp_ox_fail(r, "%s input is not supported (FLOAT only)", sp_ox_dtype_name(x->dtype));
    int64_t axis;
    if (norm_axis(r, sp_ox_attr_i(n, "axis", n->opset < 13 ? 1 : -1), x->nd, &axis)) return -1;
    if (sp_ox_out(r, out, OX_FLOAT, x->nd, x->dims)) return -1;
    int64_t outer = 1, len = 1, inner = 1;
    for (int i = 0; i < x->nd; i++) {
        if (i < axis) outer *= x->dims[i];
        else if (i == axis || n->opset < 13) len *= x->dims[i];
        else inner *= x->dims[i];
    }
    const float *a = x->data;
    float *y = out->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j = 0; j < inner; j++) {
            const float *p = a + o * len * inner + j;
            float *q = y + o * len * inner + j;
            float mx = -INFINITY;
            for (int64_t k = 0; k < len; k++) mx = fmaxf(mx, p[k * inner]);
            double sum = 0;
            for (int64_t k = 0; k < len; k++) sum += exp((double)p[k * inner] - mx);
            for (int64_t k = 0; k < len; k++) {
                q[k * inner] = logsm ? (float)((double)p[k * inner] - mx - log(sum))
                                     : (float)(exp((double)p[k * inner] - mx) / sum);
            }
        }
    }
    return 0;
}

static int
run_softmax(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
            sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    return run_softmax_any(r, n, in[0], out[0], false);
}

static int
run_logsoftmax(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
               sp_ox_tensor_t *const *out, int no)
{
    (void)ni; (void)no;
    return run_softmax_any(r, n, in[0], out[0], true);
}

typedef enum { R_MEAN, R_SUM, R_MAX } rop_t;

static int
run_reduce(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *out,
           rop_t op, int64_t axes_input_opset)
{
    const sp_ox_tensor_t *x = in[0];
    if (x->dtype != OX_FLOAT) return sp_ox_fail(r, "%s input is not supported (FLOAT only)", sp_ox_dtype_name(x->dtype));
    int64_t axes[OX_MAX_DIMS * 2], k;
    if (get_axes(r, n, in, ni, 1, axes_input_opset, axes, &k)) return -1;
    bool keep = sp_ox_attr_i(n, "keepdims", 1) != 0;
    bool red[OX_MAX_DIMS] = {0};
    if (k == 0) {
        if (sp_ox_attr_i(n, "noop_with_empty_axes", 0)) {
            return copy_as(r, x, out, x->nd, x->dims);
        }
        for (int i = 0; i < x->nd; i++) red[i] = true;
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t a;
        if (norm_axis(r, axes[i], x->nd, &a)) return -1;
        red[a] = true;
    }
    int64_t d[OX_MAX_DIMS], ost[OX_MAX_DIMS];
    int32_t m = 0;
    int64_t count = 1;
    for (int i = 0; i < x->nd; i++) {
        if (!red[i]) d[m++] = x->dims[i];
        else {
            count *= x->dims[i];
            if (keep) d[m++] = 1;
        }
    }
    if (sp_ox_out(r, out, OX_FLOAT, m, d)) return -1;
    /* Output strides seen from the input's dimensions (0 on reduced ones). */
    int64_t s = 1;
    for (int i = x->nd - 1; i >= 0; i--) {
        ost[i] = red[i] ? 0 : s;
        if (!red[i]) s *= x->dims[i];
    }
    int64_t on = sp_ox_numel(out);
    double *acc = sp_ox_scratch(r, (size_t)(on ? on : 1) * sizeof(double));
    if (acc == NULL) return -1;
    for (int64_t i = 0; i < on; i++) acc[i] = op == R_MAX ? -INFINITY : 0.0;
    int64_t idx[OX_MAX_DIMS] = {0}, off = 0, total = sp_ox_numel(x);
    const float *a = x->data;
    for (int64_t i = 0; i < total; i++) {
        if (op == R_MAX) acc[off] = a[i] > acc[off] || isnan(a[i]) ? a[i] : acc[off];
        else acc[off] += a[i];
        for (int dd = x->nd - 1; dd >= 0; dd--) {
            off += ost[dd];
            if (++idx[dd] < x->dims[dd]) break;
            off -= ost[dd] * idx[dd];
            idx[dd] = 0;
        }
    }
    float *y = out->data;
    for (int64_t i = 0; i < on; i++) {
        y[i] = (float)(op == R_MEAN ? (count ? acc[i] / (double)count : NAN) : acc[i]);
    }
    return 0;
}

static int
run_rmean(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    return run_reduce(r, n, in, ni, out[0], R_MEAN, 18);
}

static int
run_rsum(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    return run_reduce(r, n, in, ni, out[0], R_SUM, 13);
}

static int
run_rmax(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni, sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    return run_reduce(r, n, in, ni, out[0], R_MAX, 18);
}

static int
check_layernorm(sp_ox_node_t *n, char *err, size_t err_len)
{
    if (sp_ox_attr_i(n, "stash_type", 1) != 1) {
        snprintf(err, err_len, "stash_type %lld (only 1, FLOAT)", (long long)sp_ox_attr_i(n, "stash_type", 1));
        return -1;
    }
    return 0;
}

static int
run_layernorm(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
              sp_ox_tensor_t *const *out, int no)
{
    const sp_ox_tensor_t *x = in[0], *sc = in[1], *b = ni > 2 ? in[2] : NULL;
    if (x->dtype != OX_FLOAT || sc->dtype != OX_FLOAT || (b && b->dtype != OX_FLOAT)) {
        return sp_ox_fail(r, "non-FLOAT tensors are not supported");
    }
    int64_t axis;
    if (norm_axis(r, sp_ox_attr_i(n, "axis", -1), x->nd, &axis)) return -1;
    float eps = sp_ox_attr_f(n, "epsilon", 1e-5f);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < x->nd; i++) {
        if (i < axis) outer *= x->dims[i];
        else inner *= x->dims[i];
    }
    /* Scale and B broadcast over the normalized dimensions. */
    int64_t ns = sp_ox_numel(sc), nb = b ? sp_ox_numel(b) : 0;
    if ((ns != inner && ns != 1) || (b && nb != inner && nb != 1)) {
        return sp_ox_fail(r, "Scale/B have %lld/%lld values for %lld normalized elements",
                       (long long)ns, (long long)nb, (long long)inner);
    }
    if (sp_ox_out(r, out[0], OX_FLOAT, x->nd, x->dims)) return -1;
    int64_t sd[OX_MAX_DIMS];
    for (int i = 0; i < x->nd; i++) sd[i] = i < axis ? x->dims[i] : 1;
    for (int k = 1; k < no; k++) {
        if (sp_ox_out(r, out[k], OX_FLOAT, x->nd, sd)) return -1;
    }
    const float *a = x->data, *g = sc->data, *bb = b ? b->data : NULL;
    float *y = out[0]->data;
    for (int64_t o = 0; o < outer; o++) {
        const float *p = a + o * inner;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < inner; i++) mean += p[i];
        mean /= (double)(inner ? inner : 1);
        for (int64_t i = 0; i < inner; i++) var += ((double)p[i] - mean) * ((double)p[i] - mean);
        var /= (double)(inner ? inner : 1);
        float inv = (float)(1.0 / sqrt(var + eps));
        for (int64_t i = 0; i < inner; i++) {
            float v = ((float)(p[i] - mean)) * inv * g[ns == 1 ? 0 : i];
            y[o * inner + i] = bb ? v + bb[nb == 1 ? 0 : i] : v;
        }
        if (no > 1) ((float *)out[1]->data)[o] = (float)mean;
        if (no > 2) ((float *)out[2]->data)[o] = inv;
    }
    return 0;
}

/* ---- Pad ---- */

static int
check_pad(sp_ox_node_t *n, char *err, size_t err_len)
{
    const char *m = sp_ox_attr_s(n, "mode", "constant");
    if (strcmp(m, "constant") && strcmp(m, "reflect") && strcmp(m, "edge")) {
        snprintf(err, err_len, "mode \"%s\" (constant, reflect or edge)", m);
        return -1;
    }
    return 0;
}

static int
run_pad(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
        sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0];
    int64_t pads[OX_MAX_DIMS * 2], np_ = 0, axes[OX_MAX_DIMS], na = -1;
    double cval = 0;
    if (n->opset < 11) {
        size_t c;
        const int64_t *p = sp_ox_attr_ints(n, "pads", &c);
        if (c > OX_MAX_DIMS * 2) return sp_ox_fail(r, "too many pads");
        if (c) memcpy(pads, p, c * sizeof *p);
        np_ = (int64_t)c;
        cval = sp_ox_attr_f(n, "value", 0.0f);
    } else {
        if (ni < 2 || in[1] == NULL) return sp_ox_fail(r, "pads input is required");
        if (sp_ox_tensor_ints(r, in[1], pads, OX_MAX_DIMS * 2, &np_)) return -1;
        if (ni > 2 && in[2]) {
            if (sp_ox_numel(in[2]) != 1 || in[2]->dtype != x->dtype) return sp_ox_fail(r, "constant_value must be a scalar of the input's type");
            cval = get_num(in[2], 0);
        }
        if (ni > 3 && in[3] && sp_ox_tensor_ints(r, in[3], axes, OX_MAX_DIMS, &na)) return -1;
    }
    int64_t pb[OX_MAX_DIMS] = {0}, pe[OX_MAX_DIMS] = {0};
    int64_t nax = na >= 0 ? na : x->nd;
    if (np_ != 2 * nax) return sp_ox_fail(r, "%lld pads for %lld axes", (long long)np_, (long long)nax);
    for (int64_t i = 0; i < nax; i++) {
        int64_t a = i;
        if (na >= 0 && norm_axis(r, axes[i], x->nd, &a)) return -1;
        pb[a] = pads[i];
        pe[a] = pads[i + nax];
    }
    const char *mode = sp_ox_attr_s(n, "mode", "constant");
    int kind = strcmp(mode, "reflect") == 0 ? 1 : strcmp(mode, "edge") == 0 ? 2 : 0;
    int64_t d[OX_MAX_DIMS], st[OX_MAX_DIMS];
    for (int i = 0; i < x->nd; i++) {
        /* pads come from the file or a computed tensor: any int64, so the sum is checked */
        int64_t grown;
        if (__builtin_add_overflow(x->dims[i], pb[i], &grown) || __builtin_add_overflow(grown, pe[i], &d[i])) {
            return sp_ox_fail(r, "pads of dimension %d (%lld, %lld) overflow", i, (long long)pb[i], (long long)pe[i]);
        }
        if (d[i] < 0) return sp_ox_fail(r, "pads make dimension %d negative", i);
        if (kind && x->dims[i] == 0 && d[i] > 0) return sp_ox_fail(r, "%s padding of an empty dimension", mode);
        if (kind == 1 && (pb[i] >= x->dims[i] || pe[i] >= x->dims[i]) && (pb[i] > 0 || pe[i] > 0)) {
            return sp_ox_fail(r, "reflect pads must be smaller than the dimension");
        }
    }
    if (sp_ox_out(r, out[0], x->dtype, x->nd, d)) return -1;
    strides_of(x, st);
    size_t es = sp_ox_dtype_size(x->dtype);
    char cbuf[8];
    switch (x->dtype) {
    case OX_FLOAT: *(float *)cbuf = (float)cval; break;
    case OX_INT64: *(int64_t *)cbuf = (int64_t)cval; break;
    case OX_INT32: *(int32_t *)cbuf = (int32_t)cval; break;
    case OX_DOUBLE: *(double *)cbuf = cval; break;
    case OX_FLOAT16: *(uint16_t *)cbuf = sp_ox_float_to_half((float)cval); break;
    default: cbuf[0] = (char)(int)cval; break;
    }
    int64_t total = sp_ox_numel(out[0]), idx[OX_MAX_DIMS] = {0};
    for (int64_t i = 0; i < total; i++) {
        int64_t off = 0;
        bool pad = false;
        for (int k = 0; k < x->nd; k++) {
            int64_t c = idx[k] - pb[k], dim = x->dims[k];
            if (c < 0 || c >= dim) {
                if (kind == 0) {
                    pad = true;
                    break;
                }
                if (kind == 2) c = c < 0 ? 0 : dim - 1;
                else {
                    int64_t period = 2 * (dim - 1);
                    if (period == 0) c = 0;
                    else {
                        c = ((c % period) + period) % period;
                        if (c >= dim) c = period - c;
                    }
                }
            }
            off += c * st[k];
        }
        memcpy((char *)out[0]->data + i * (int64_t)es, pad ? cbuf : (const char *)x->data + off * (int64_t)es, es);
        for (int k = x->nd - 1; k >= 0; k--) {
            if (++idx[k] < d[k]) break;
            idx[k] = 0;
        }
    }
    return 0;
}

/* ---- the table ---- */

static const char *const A_NONE[] = {NULL};
static const char *const A_ALPHA[] = {"alpha", NULL};
static const char *const A_AB[] = {"alpha", "beta", NULL};
static const char *const A_CLIP[] = {"min", "max", NULL};
static const char *const A_GELU[] = {"approximate", NULL};
static const char *const A_AXIS[] = {"axis", NULL};
static const char *const A_AXES[] = {"axes", NULL};
static const char *const A_RESHAPE[] = {"allowzero", NULL};
static const char *const A_PERM[] = {"perm", NULL};
static const char *const A_SPLIT[] = {"axis", "split", "num_outputs", NULL};
static const char *const A_SLICE[] = {"starts", "ends", "axes", NULL};
static const char *const A_SHAPE[] = {"start", "end", NULL};
static const char *const A_CAST[] = {"to", NULL};
static const char *const A_CONST[] = {"value", "value_float", "value_floats", "value_int", "value_ints", NULL};
static const char *const A_REDUCE[] = {"axes", "keepdims", "noop_with_empty_axes", NULL};
static const char *const A_LN[] = {"axis", "epsilon", "stash_type", NULL};
static const char *const A_PAD[] = {"mode", "pads", "value", NULL};

static const sp_ox_op_t ops[] = {
    {"Add", A_NONE, 2, 2, 1, 1, NULL, run_add},
    {"Sub", A_NONE, 2, 2, 1, 1, NULL, run_sub},
    {"Mul", A_NONE, 2, 2, 1, 1, NULL, run_mul},
    {"Div", A_NONE, 2, 2, 1, 1, NULL, run_div},
    {"Pow", A_NONE, 2, 2, 1, 1, NULL, run_pow},
    {"Relu", A_NONE, 1, 1, 1, 1, NULL, run_relu},
    {"LeakyRelu", A_ALPHA, 1, 1, 1, 1, NULL, run_leaky},
    {"Clip", A_CLIP, 1, 3, 1, 1, NULL, run_clip},
    {"Sigmoid", A_NONE, 1, 1, 1, 1, NULL, run_sigmoid},
    {"Tanh", A_NONE, 1, 1, 1, 1, NULL, run_tanh},
    {"Gelu", A_GELU, 1, 1, 1, 1, check_gelu, run_gelu},
    {"Erf", A_NONE, 1, 1, 1, 1, NULL, run_erf},
    {"HardSwish", A_NONE, 1, 1, 1, 1, NULL, run_hswish},
    {"HardSigmoid", A_AB, 1, 1, 1, 1, NULL, run_hsigmoid},
    {"Sqrt", A_NONE, 1, 1, 1, 1, NULL, run_sqrt},
    {"Exp", A_NONE, 1, 1, 1, 1, NULL, run_exp},
    {"Log", A_NONE, 1, 1, 1, 1, NULL, run_log},
    {"Neg", A_NONE, 1, 1, 1, 1, NULL, run_neg},
    {"Abs", A_NONE, 1, 1, 1, 1, NULL, run_abs},
    {"Reciprocal", A_NONE, 1, 1, 1, 1, NULL, run_recip},
    {"Identity", A_NONE, 1, 1, 1, 1, NULL, run_identity},
    {"Reshape", A_RESHAPE, 2, 2, 1, 1, NULL, run_reshape},
    {"Flatten", A_AXIS, 1, 1, 1, 1, NULL, run_flatten},
    {"Transpose", A_PERM, 1, 1, 1, 1, NULL, run_transpose},
    {"Squeeze", A_AXES, 1, 2, 1, 1, NULL, run_squeeze},
    {"Unsqueeze", A_AXES, 1, 2, 1, 1, NULL, run_unsqueeze},
    {"Concat", A_AXIS, 1, OX_MAX_IO, 1, 1, NULL, run_concat},
    {"Split", A_SPLIT, 1, 2, 1, OX_MAX_IO, NULL, run_split},
    {"Slice", A_SLICE, 1, 5, 1, 1, NULL, run_slice},
    {"Gather", A_AXIS, 2, 2, 1, 1, NULL, run_gather},
    {"Shape", A_SHAPE, 1, 1, 1, 1, NULL, run_shape},
    {"Expand", A_NONE, 2, 2, 1, 1, NULL, run_expand},
    {"Where", A_NONE, 3, 3, 1, 1, NULL, run_where},
    {"Cast", A_CAST, 1, 1, 1, 1, check_cast, run_cast},
    {"Constant", A_CONST, 0, 0, 1, 1, check_constant, run_constant},
    {"Softmax", A_AXIS, 1, 1, 1, 1, NULL, run_softmax},
    {"LogSoftmax", A_AXIS, 1, 1, 1, 1, NULL, run_logsoftmax},
    {"ReduceMean", A_REDUCE, 1, 2, 1, 1, NULL, run_rmean},
    {"ReduceSum", A_REDUCE, 1, 2, 1, 1, NULL, run_rsum},
    {"ReduceMax", A_REDUCE, 1, 2, 1, 1, NULL, run_rmax},
    {"LayerNormalization", A_LN, 2, 3, 1, 3, check_layernorm, run_layernorm},
    {"Pad", A_PAD, 1, 4, 1, 1, check_pad, run_pad},
};

const sp_ox_op_t *
sp_ox_op_find(const char *op_type)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (strcmp(ops[i].name, op_type) == 0) return &ops[i];
    }
    const sp_ox_op_t *q = sp_ox_quant_op_find(op_type);
    return q ? q : sp_ox_nn_op_find(op_type);
}
