/*
 * backends/onnx/ops_quant.c - the quantized operators: QuantizeLinear,
 * DequantizeLinear (per tensor and per axis), DynamicQuantizeLinear,
 * MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv; and FLOAT16
 * conversions (Cast and FLOAT16 initializers use them).
 *
 * Numerics, as ONNX specifies: quantization is saturate(round(x / scale) +
 * zero_point) with round half to even (rintf under the default rounding
 * mode); integer products are exact (qgemm.c: zero points subtracted, int16
 * operands, int32 sums); requantization multiplies the int32 sum by the
 * float32 product scale_a * scale_b / scale_y in double, rounds half to
 * even and saturates to the output type.
 *
 * Threads: none of its own (qgemm.c may split a product).
 * Memory: outputs from the run's pool; widened operands in per-call buffers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"
#include "ops.h"

/* ---- FLOAT16 ---- */

float
sp_ox_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: value man * 2^-24, exact in float */
            float f = (float)man * 0x1p-24f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t
sp_ox_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0)); /* inf, nan */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504: inf */
    if (ax < 0x38800000u) {
        /* subnormal half (or zero): value / 2^-24 rounded half to even */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint16_t)rintf(a * 0x1p24f));
    }
    /* normal: drop 13 mantissa bits, round half to even (a carry into the exponent is right) */
    uint32_t r = ax - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

uint16_t
sp_ox_double_to_half(double d)
{
    /* Rounding to float first could round twice: round the double to the half grid directly
     * (a half has 11 significant bits; its spacing at |d| is 2^(e-10), at least 2^-24). */
    if (isnan(d)) return 0x7e00;
    float f = (float)d;
    if (fabs(d) >= 65520.0 || fabs(d) < 0x1p-26 || (double)f == d) return sp_ox_float_to_half(f);
    int e;
    frexp(fabs(d), &e); /* |d| in [2^(e-1), 2^e) */
    double ulp = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
    double q = nearbyint(d / ulp) * ulp; /* default rounding: half to even */
    return sp_ox_float_to_half((float)q); /* exact: q is on the half grid */
}

/* ---- helpers ---- */

static bool
is_q8(int32_t t)
{
    return t == OX_UINT8 || t == OX_INT8;
}

static int32_t
q8_at(const sp_ox_tensor_t *t, int64_t i)
{
    return t->dtype == OX_UINT8 ? ((const uint8_t *)t->data)[i] : ((const int8_t *)t->data)[i];
}

static int32_t
int_at(const sp_ox_tensor_t *t, int64_t i)
{
    return t->dtype == OX_INT32 ? ((const int32_t *)t->data)[i] : q8_at(t, i);
}

static void
qrange(int32_t t, int32_t *lo, int32_t *hi)
{
    *lo = t == OX_UINT8 ? 0 : t == OX_INT8 ? -128 : INT32_MIN;
    *hi = t == OX_UINT8 ? 255 : t == OX_INT8 ? 127 : INT32_MAX;
}

static void
q8_put(sp_ox_tensor_t *t, int64_t i, double v)
{
    int32_t lo, hi;
    qrange(t->dtype, &lo, &hi);
    if (v != v) v = 0; /* NaN (an infinite scale ratio times 0): converting it is undefined */
    double q = v < lo ? lo : v > hi ? hi : v;
    if (t->dtype == OX_UINT8) ((uint8_t *)t->data)[i] = (uint8_t)q;
    else if (t->dtype == OX_INT8) ((int8_t *)t->data)[i] = (int8_t)q;
    else ((int32_t *)t->data)[i] = (int32_t)q;
}

/* Scale and zero point of a per-tensor (1 value) or per-axis (1-D of ch values) quantization.
 * ch <= 0: per-tensor only. */
int
sp_ox_check_qparams(const sp_ox_tensor_t *s, const sp_ox_tensor_t *z, int64_t ch, bool zp_int32_ok,
                    char *err, size_t err_len)
{
    int64_t ns = sp_ox_numel(s);
    if (s->dtype != OX_FLOAT) {
        snprintf(err, err_len, "scale of type %s (FLOAT expected)", sp_ox_dtype_name(s->dtype));
        return -1;
    }
    bool per_tensor = ns == 1 && s->nd <= 1;
    if (!per_tensor && !(s->nd == 1 && ch > 0 && ns == ch)) {
        char b[96];
        sp_ox_shape_str(s->dims, s->nd, b, sizeof b);
        snprintf(err, err_len, "scale of shape %s: one value, or one per channel (%lld)", b, (long long)ch);
        return -1;
    }
    for (int64_t i = 0; i < ns; i++) {
        float v = ((const float *)s->data)[i];
        if (!(v != 0.0f) || !isfinite(v)) {
            snprintf(err, err_len, "scale[%lld] is %g (a nonzero finite number is needed)", (long long)i, (double)v);
            return -1;
        }
    }
    if (z) {
        if (!is_q8(z->dtype) && !(zp_int32_ok && z->dtype == OX_INT32)) {
            snprintf(err, err_len, "zero point of type %s (UINT8 or INT8)", sp_ox_dtype_name(z->dtype));
            return -1;
        }
        if (sp_ox_numel(z) != ns || z->nd != s->nd) {
            snprintf(err, err_len, "zero point of %lld values for a scale of %lld", (long long)sp_ox_numel(z), (long long)ns);
            return -1;
        }
    }
    return 0;
}

static int
qparams(sp_ox_run_t *r, const sp_ox_tensor_t *s, const sp_ox_tensor_t *z, int64_t ch, bool zp_int32_ok)
{
    return sp_ox_check_qparams(s, z, ch, zp_int32_ok, r->err, r->err_len);
}

static int
norm_axis(sp_ox_run_t *r, int64_t axis, int32_t nd, int64_t *out)
{
    if (axis < -nd || axis >= (nd ? nd : 1)) return sp_ox_fail(r, "axis %lld for rank %d", (long long)axis, nd);
    *out = axis < 0 ? axis + nd : axis;
    return 0;
}

/* y[i] = (float)acc[i] * mult + bias (two roundings, as written), then max(y, 0) with relu
 * (NaN -> 0). The AVX2 version does the same operations 8 at a time. */
static void
dequant_scalar(const int32_t *acc, int64_t n, float mult, float bias, int relu, float *y)
{
    for (int64_t i = 0; i < n; i++) {
        float v = (float)acc[i] * mult + bias;
        y[i] = relu && !(v > 0.0f) ? 0.0f : v;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
__attribute__((target("avx2"))) static void
dequant_avx2(const int32_t *acc, int64_t n, float mult, float bias, int relu, float *y)
{
    __m256 m = _mm256_set1_ps(mult), b = _mm256_set1_ps(bias), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc + i))), m), b);
        if (relu) v = _mm256_max_ps(v, zero); /* max(NaN, 0) = 0: the second operand */
        _mm256_storeu_ps(y + i, v);
    }
    dequant_scalar(acc + i, n - i, mult, bias, relu, y + i);
}
#endif

void
sp_ox_dequant_row(const int32_t *acc, int64_t n, float mult, float bias, int relu, float *y)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (strcmp(sp_ox_qgemm_kernel(), "scalar") != 0) {
        dequant_avx2(acc, n, mult, bias, relu, y);
        return;
    }
#endif
    dequant_scalar(acc, n, mult, bias, relu, y);
}

/* ---- QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear ---- */

static int
run_quantize(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
             sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0], *s = in[1], *z = ni > 2 ? in[2] : NULL;
    if (x->dtype != OX_FLOAT && x->dtype != OX_INT32 && x->dtype != OX_FLOAT16) {
        return sp_ox_fail(r, "input of type %s is not supported", sp_ox_dtype_name(x->dtype));
    }
    int64_t axis = 0;
    if (sp_ox_numel(s) != 1 || s->nd > 1) {
        if (norm_axis(r, sp_ox_attr_i(n, "axis", 1), x->nd, &axis)) return -1;
    }
    if (qparams(r, s, z, x->nd ? x->dims[axis] : 0, false)) return -1;
    if (sp_ox_attr_i(n, "saturate", 1) != 1) return sp_ox_fail(r, "saturate 0 (float8 only) is not supported");
    int32_t ot = z ? z->dtype : OX_UINT8;
    if (sp_ox_out(r, out[0], ot, x->nd, x->dims)) return -1;
    int64_t ns = sp_ox_numel(s), inner = 1, total = sp_ox_numel(x);
    for (int d = (int)axis + 1; d < x->nd; d++) inner *= x->dims[d];
    const float *sv = s->data;
    for (int64_t i = 0; i < total; i++) {
        int64_t c = ns == 1 ? 0 : (i / inner) % ns;
        float v = x->dtype == OX_FLOAT ? ((const float *)x->data)[i]
                  : x->dtype == OX_INT32 ? (float)((const int32_t *)x->data)[i]
                                         : sp_ox_half_to_float(((const uint16_t *)x->data)[i]);
        float q = rintf(v / sv[c]);
        q8_put(out[0], i, isnan(q) ? 0.0 : (double)q + (z ? q8_at(z, c) : 0));
    }
    return 0;
}

static int
run_dequantize(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
               sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0], *s = in[1], *z = ni > 2 ? in[2] : NULL;
    if (!is_q8(x->dtype) && x->dtype != OX_INT32) {
        return sp_ox_fail(r, "input of type %s is not supported", sp_ox_dtype_name(x->dtype));
    }
    int64_t axis = 0;
    if (sp_ox_numel(s) != 1 || s->nd > 1) {
        if (norm_axis(r, sp_ox_attr_i(n, "axis", 1), x->nd, &axis)) return -1;
    }
    if (qparams(r, s, z, x->nd ? x->dims[axis] : 0, true)) return -1;
    if (z && z->dtype != x->dtype) {
        return sp_ox_fail(r, "zero point %s for input %s", sp_ox_dtype_name(z->dtype), sp_ox_dtype_name(x->dtype));
    }
    if (sp_ox_out(r, out[0], OX_FLOAT, x->nd, x->dims)) return -1;
    int64_t ns = sp_ox_numel(s), inner = 1, total = sp_ox_numel(x);
    for (int d = (int)axis + 1; d < x->nd; d++) inner *= x->dims[d];
    const float *sv = s->data;
    float *y = out[0]->data;
    for (int64_t i = 0; i < total; i++) {
        int64_t c = ns == 1 ? 0 : (i / inner) % ns;
        y[i] = (float)((int64_t)int_at(x, i) - (z ? int_at(z, c) : 0)) * sv[c];
    }
    return 0;
}

static int
run_dynquant(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
             sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)ni; (void)no;
    const sp_ox_tensor_t *x = in[0];
    if (x->dtype != OX_FLOAT) return sp_ox_fail(r, "input of type %s is not supported", sp_ox_dtype_name(x->dtype));
    int64_t total = sp_ox_numel(x), one = 1;
    const float *xv = x->data;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < total; i++) {
        if (isnan(xv[i])) return sp_ox_fail(r, "NaN in the input");
        lo = fminf(lo, xv[i]);
        hi = fmaxf(hi, xv[i]);
    }
    float scale = (hi - lo) / 255.0f;
    float zpf = scale > 0 ? rintf(fminf(fmaxf(0.0f - lo / scale, 0.0f), 255.0f)) : 0.0f;
    if (sp_ox_out(r, out[0], OX_UINT8, x->nd, x->dims) || sp_ox_out(r, out[1], OX_FLOAT, 0, &one) ||
        sp_ox_out(r, out[2], OX_UINT8, 0, &one)) return -1;
    for (int64_t i = 0; i < total; i++) {
        q8_put(out[0], i, scale > 0 ? (double)rintf(xv[i] / scale) + zpf : zpf);
    }
    *(float *)out[1]->data = scale;
    *(uint8_t *)out[2]->data = (uint8_t)zpf;
    return 0;
}

/* ---- integer MatMul (MatMulInteger, QLinearMatMul) ---- */

static int64_t
pad16(int64_t k)
{
    return (k + 15) / 16 * 16;
}

/* numpy matmul of rank >= 2 operands with broadcast batch dimensions: C = (A - za) (B - zb)
 * as int32. za: scalar or per row of A (M values); zb: scalar or per column of B (N). */
static int
int_matmul(sp_ox_run_t *r, const sp_ox_tensor_t *a, const sp_ox_tensor_t *b, const sp_ox_tensor_t *za,
           const sp_ox_tensor_t *zb, int32_t **acc_out, int64_t *dims, int32_t *nd_out)
{
    if (!is_q8(a->dtype) || !is_q8(b->dtype)) {
        return sp_ox_fail(r, "operands of types %s and %s (UINT8 or INT8)", sp_ox_dtype_name(a->dtype),
                          sp_ox_dtype_name(b->dtype));
    }
    if (a->nd < 2 || b->nd < 2) return sp_ox_fail(r, "1-D operands are not supported");
    int64_t m = a->dims[a->nd - 2], k = a->dims[a->nd - 1], n = b->dims[b->nd - 1];
    if (b->dims[b->nd - 2] != k) {
        return sp_ox_fail(r, "inner dimensions %lld and %lld differ", (long long)k, (long long)b->dims[b->nd - 2]);
    }
    if (za && ((sp_ox_numel(za) != 1 && sp_ox_numel(za) != m) || za->dtype != a->dtype)) {
        return sp_ox_fail(r, "A's zero point: %lld values of %s", (long long)sp_ox_numel(za), sp_ox_dtype_name(za->dtype));
    }
    if (zb && ((sp_ox_numel(zb) != 1 && sp_ox_numel(zb) != n) || zb->dtype != b->dtype)) {
        return sp_ox_fail(r, "B's zero point: %lld values of %s", (long long)sp_ox_numel(zb), sp_ox_dtype_name(zb->dtype));
    }
    /* batch dimensions: broadcast right-aligned */
    int32_t ba = a->nd - 2, bb = b->nd - 2, nb = ba > bb ? ba : bb;
    int64_t batch = 1;
    for (int d = 0; d < nb; d++) {
        int64_t x = d - (nb - ba) >= 0 ? a->dims[d - (nb - ba)] : 1;
        int64_t y = d - (nb - bb) >= 0 ? b->dims[d - (nb - bb)] : 1;
        if (x != y && x != 1 && y != 1) return sp_ox_fail(r, "batch dimensions %lld and %lld do not broadcast", (long long)x, (long long)y);
        dims[d] = x == 1 ? y : x;
        batch *= dims[d];
    }
    dims[nb] = m;
    dims[nb + 1] = n;
    *nd_out = nb + 2;
    if (batch * m * n > r->g->max_numel || m * k > r->g->max_numel || n * k > r->g->max_numel) {
        return sp_ox_fail(r, "product too large");
    }
    int64_t kp = pad16(k);
    int16_t *aw = calloc((size_t)(m * kp + 1), sizeof *aw), *bw = calloc((size_t)(n * kp + 1), sizeof *bw);
    int16_t *bp = malloc((sp_ox_qpanel_elems(n, kp) + 1) * sizeof *bp);
    int32_t *acc = malloc((size_t)(batch * m * n + 1) * sizeof *acc);
    if (!aw || !bw || !acc || !bp) {
        free(aw); free(bw); free(acc); free(bp);
        return sp_ox_fail(r, "out of memory");
    }
    int64_t idx[OX_MAX_DIMS] = {0};
    for (int64_t t = 0; t < batch; t++) {
        int64_t oa = 0, ob = 0, sa = 1, sb = 1;
        for (int d = nb - 1; d >= 0; d--) {
            int da = d - (nb - ba), db = d - (nb - bb);
            if (da >= 0) {
                if (a->dims[da] != 1) oa += idx[d] * sa;
                sa *= a->dims[da];
            }
            if (db >= 0) {
                if (b->dims[db] != 1) ob += idx[d] * sb;
                sb *= b->dims[db];
            }
        }
        for (int64_t i = 0; i < m; i++) {
            int32_t z = za ? q8_at(za, sp_ox_numel(za) == 1 ? 0 : i) : 0;
            for (int64_t kk = 0; kk < k; kk++) aw[i * kp + kk] = (int16_t)(q8_at(a, (oa * m + i) * k + kk) - z);
        }
        for (int64_t kk = 0; kk < k; kk++) {
            for (int64_t j = 0; j < n; j++) {
                int32_t z = zb ? q8_at(zb, sp_ox_numel(zb) == 1 ? 0 : j) : 0;
                bw[j * kp + kk] = (int16_t)(q8_at(b, (ob * k + kk) * n + j) - z);
            }
        }
        sp_ox_qpack_rows(bw, n, kp, bp);
        sp_ox_qgemm(r->n_threads, m, n, kp, aw, bp, acc + t * m * n, n);
        for (int d = nb - 1; d >= 0; d--) {
            if (++idx[d] < dims[d]) break;
            idx[d] = 0;
        }
    }
    free(aw);
    free(bw);
    free(bp);
    *acc_out = acc;
    return 0;
}

static int
run_matmulint(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
              sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)no;
    int64_t dims[OX_MAX_DIMS + 2];
    int32_t nd;
    int32_t *acc;
    if (int_matmul(r, in[0], in[1], ni > 2 ? in[2] : NULL, ni > 3 ? in[3] : NULL, &acc, dims, &nd)) return -1;
    if (nd > OX_MAX_DIMS || sp_ox_out(r, out[0], OX_INT32, nd, dims)) {
        free(acc);
        return nd > OX_MAX_DIMS ? sp_ox_fail(r, "result of rank %d", nd) : -1;
    }
    memcpy(out[0]->data, acc, (size_t)sp_ox_numel(out[0]) * sizeof *acc);
    free(acc);
    return 0;
}

static int
run_qlinear_matmul(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
                   sp_ox_tensor_t *const *out, int no)
{
    (void)n; (void)ni; (void)no;
    const sp_ox_tensor_t *a = in[0], *sa = in[1], *za = in[2], *b = in[3], *sb = in[4], *zb = in[5],
                         *sy = in[6], *zy = in[7];
    int64_t ncol = b->nd >= 1 ? b->dims[b->nd - 1] : 0;
    if (qparams(r, sa, za, 0, false) || qparams(r, sb, zb, ncol, false) || qparams(r, sy, zy, 0, false)) return -1;
    int64_t dims[OX_MAX_DIMS + 2];
    int32_t nd;
    int32_t *acc;
    /* per-column B zero point: int_matmul takes it per column */
    if (int_matmul(r, a, b, za, zb, &acc, dims, &nd)) return -1;
    if (nd > OX_MAX_DIMS || sp_ox_out(r, out[0], zy->dtype, nd, dims)) {
        free(acc);
        return nd > OX_MAX_DIMS ? sp_ox_fail(r, "result of rank %d", nd) : -1;
    }
    int64_t total = sp_ox_numel(out[0]), nsb = sp_ox_numel(sb);
    float fa = *(const float *)sa->data, fy = *(const float *)sy->data;
    int32_t y0 = q8_at(zy, 0);
    for (int64_t i = 0; i < total; i++) {
        float mult = fa * ((const float *)sb->data)[nsb == 1 ? 0 : i % ncol] / fy;
        q8_put(out[0], i, rint((double)acc[i] * (double)mult) + y0);
    }
    free(acc);
    return 0;
}

/* ---- integer convolution (ConvInteger, QLinearConv; the fused QConv of qdq.c) ---- */

int
sp_ox_qconv_geom(sp_ox_run_t *r, const sp_ox_node_t *n, const int64_t *xdims, int32_t xnd,
                 const int64_t *wdims, sp_ox_qgeom_t *g)
{
    int sp = xnd - 2;
    if (sp < 1 || sp > 2) return sp_ox_fail(r, "input of rank %d (1-D and 2-D convolutions only)", xnd);
    size_t cs, cd, cp, ck;
    const int64_t *st = sp_ox_attr_ints(n, "strides", &cs);
    const int64_t *dl = sp_ox_attr_ints(n, "dilations", &cd);
    const int64_t *pd = sp_ox_attr_ints(n, "pads", &cp);
    const int64_t *ks = sp_ox_attr_ints(n, "kernel_shape", &ck);
    if ((st && cs != (size_t)sp) || (dl && cd != (size_t)sp) || (pd && cp != (size_t)sp * 2) ||
        (ks && ck != (size_t)sp)) {
        return sp_ox_fail(r, "strides, dilations, pads or kernel_shape do not match the input's rank");
    }
    const char *ap = sp_ox_attr_s(n, "auto_pad", "NOTSET");
    bool same = strcmp(ap, "SAME_UPPER") == 0 || strcmp(ap, "SAME_LOWER") == 0;
    if (!same && strcmp(ap, "NOTSET") && strcmp(ap, "VALID")) return sp_ox_fail(r, "auto_pad \"%s\" is not supported", ap);
    int64_t in[2] = {1, 1}, k[2] = {1, 1}, s[2] = {1, 1}, d[2] = {1, 1}, pb[2] = {0, 0}, o[2] = {1, 1};
    for (int i = 0; i < sp; i++) {
        int j = i + 2 - sp;
        in[j] = xdims[2 + i];
        k[j] = wdims[2 + i];
        if (ks && ks[i] != k[j]) return sp_ox_fail(r, "kernel_shape differs from the weights");
        s[j] = st ? st[i] : 1;
        d[j] = dl ? dl[i] : 1;
        if (k[j] < 1 || s[j] < 1 || d[j] < 1 || k[j] > 1 << 20 || s[j] > 1 << 20 || d[j] > 1 << 20) {
            return sp_ox_fail(r, "kernel %lld, stride %lld, dilation %lld", (long long)k[j], (long long)s[j], (long long)d[j]);
        }
        int64_t ext = (k[j] - 1) * d[j] + 1, pe = 0;
        if (same) {
            o[j] = (in[j] + s[j] - 1) / s[j];
            int64_t tot = (o[j] - 1) * s[j] + ext - in[j];
            if (tot < 0) tot = 0;
            pb[j] = strcmp(ap, "SAME_UPPER") == 0 ? tot / 2 : (tot + 1) / 2;
            continue;
        }
        if (strcmp(ap, "NOTSET") == 0 && pd) {
            pb[j] = pd[i];
            pe = pd[i + sp];
            if (pb[j] < 0 || pe < 0 || pb[j] > 1 << 20 || pe > 1 << 20) return sp_ox_fail(r, "pads out of range");
        }
        int64_t span = in[j] + pb[j] + pe - ext;
        if (span < 0) return sp_ox_fail(r, "the window is larger than the padded input");
        o[j] = span / s[j] + 1;
    }
    *g = (sp_ox_qgeom_t){in[0], in[1], k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], o[0], o[1]};
    return 0;
}

/* acc[nb][m][oh*ow] = conv(x16, w16): x16 [N, C, H, W] with the zero point subtracted; w16 rows
 * of kp = pad16(C/group * kh * kw) per output channel. */
int
sp_ox_qconv_acc(sp_ox_run_t *r, const int16_t *x16, int64_t batch, int64_t c, const int16_t *w16,
                int64_t m, int64_t group, int64_t kp, const sp_ox_qgeom_t *g, int32_t *acc,
                const sp_ox_qepi_t *epi)
{
    int64_t cg = c / group, mg = m / group, kk = cg * g->kh * g->kw, hw = g->oh * g->ow;
    /* all images' columns in one product (one thread split per node, not per image) */
    int64_t cols = batch * hw;
    if (cols > r->g->max_numel || mg * cols > r->g->max_numel) return sp_ox_fail(r, "product too large");
    size_t pe = sp_ox_qpanel_elems(cols, kp);
    int16_t *colp = sp_ox_scratch(r, (pe + 1) * sizeof *colp);
    if (colp == NULL) return -1;
    int32_t *tmp = malloc((size_t)(mg * cols + 1) * sizeof *tmp);
    if (tmp == NULL) return sp_ox_fail(r, "out of memory");
    for (int64_t gi = 0; gi < group; gi++) {
        /* im2col straight into qgemm's panels: column (n, oy, ox), row q = (ci, ky, kx) at
         * ((col / 16) * 16 * kp + (q / 2) * 32 + (col % 16) * 2 + q % 2); padding rows
         * (kk..kp) and columns (cols..) stay zero */
        if (kp > kk || cols % 16) memset(colp, 0, pe * sizeof *colp);
        for (int64_t nb = 0; nb < batch; nb++) {
            const int16_t *xs = x16 + (nb * c + gi * cg) * g->ih * g->iw;
            for (int64_t q = 0; q < kk; q++) {
                int64_t ci = q / (g->kh * g->kw), ky = q / g->kw % g->kh, kx = q % g->kw;
                int16_t *dq = colp + (q >> 1) * 32 + (q & 1);
                /* the columns whose ix = xo * sw - pl + kx * dw falls inside [0, iw): [x0, x1) */
                int64_t base = kx * g->dw - g->pl, x0 = 0, x1 = g->ow;
                while (x0 < g->ow && x0 * g->sw + base < 0) x0++;
                while (x1 > x0 && (x1 - 1) * g->sw + base >= g->iw) x1--;
                for (int64_t oy = 0; oy < g->oh; oy++) {
                    int64_t iy = oy * g->sh - g->pt + ky * g->dh;
                    int64_t col = nb * hw + oy * g->ow;
                    bool rowok = iy >= 0 && iy < g->ih;
                    int64_t a0 = rowok ? x0 : g->ow, a1 = rowok ? x1 : g->ow;
                    for (int64_t xo = 0; xo < a0; xo++, col++) dq[(col >> 4) * 16 * kp + (col & 15) * 2] = 0;
                    if (a1 > a0) {
                        const int16_t *src = xs + (ci * g->ih + iy) * g->iw + a0 * g->sw + base;
                        /* within one panel the destination steps by 2; across panels it jumps */
                        int64_t xo = a0;
                        while (xo < a1) {
                            int16_t *d = dq + (col >> 4) * 16 * kp + (col & 15) * 2;
                            int64_t run = 16 - (col & 15);
                            if (run > a1 - xo) run = a1 - xo;
                            if (g->sw == 1) {
                                for (int64_t t = 0; t < run; t++) d[2 * t] = src[t];
                            } else {
                                for (int64_t t = 0; t < run; t++) d[2 * t] = src[t * g->sw];
                            }
                            src += run * g->sw;
                            col += run;
                            xo += run;
                        }
                    }
                    for (int64_t xo = a1 > a0 ? a1 : a0; xo < g->ow; xo++, col++) dq[(col >> 4) * 16 * kp + (col & 15) * 2] = 0;
                }
            }
        }
        sp_ox_qgemm(r->n_threads, mg, cols, kp, w16 + gi * mg * kp, colp, tmp, cols);
        for (int64_t nb = 0; nb < batch; nb++) {
            for (int64_t o = 0; o < mg; o++) {
                int64_t ch = gi * mg + o, at = (nb * m + ch) * hw;
                if (epi) sp_ox_dequant_row(tmp + o * cols + nb * hw, hw, epi->mult[ch], epi->bias[ch], epi->relu, epi->out + at);
                else memcpy(acc + at, tmp + o * cols + nb * hw, (size_t)hw * sizeof *tmp);
            }
        }
    }
    free(tmp);
    return 0;
}

/* Widen a quantized tensor (minus its zero point, per channel along dim 0 when zch > 1). */
static void
widen(const sp_ox_tensor_t *t, const sp_ox_tensor_t *z, int16_t *dst)
{
    int64_t total = sp_ox_numel(t), nz = z ? sp_ox_numel(z) : 0, per = nz > 1 ? total / nz : total;
    for (int64_t i = 0; i < total; i++) {
        dst[i] = (int16_t)(q8_at(t, i) - (z ? q8_at(z, nz > 1 ? i / per : 0) : 0));
    }
}

/* The shared part of ConvInteger and QLinearConv: int32 sums into *acc (malloc'd). */
static int
int_conv(sp_ox_run_t *r, const sp_ox_node_t *n, const sp_ox_tensor_t *x, const sp_ox_tensor_t *zx,
         const sp_ox_tensor_t *w, const sp_ox_tensor_t *zw, sp_ox_qgeom_t *g, int32_t **acc_out)
{
    if (!is_q8(x->dtype) || !is_q8(w->dtype)) {
        return sp_ox_fail(r, "operands of types %s and %s (UINT8 or INT8)", sp_ox_dtype_name(x->dtype), sp_ox_dtype_name(w->dtype));
    }
    int64_t group = sp_ox_attr_i(n, "group", 1);
    if (w->nd != x->nd || x->nd < 3) return sp_ox_fail(r, "weights of rank %d for input of rank %d", w->nd, x->nd);
    int64_t c = x->dims[1], m = w->dims[0];
    if (group < 1 || c % group || m % group || w->dims[1] != c / group) {
        return sp_ox_fail(r, "%lld input channels, weights [%lld, %lld, ...], group %lld", (long long)c,
                          (long long)m, (long long)w->dims[1], (long long)group);
    }
    if (zx && (sp_ox_numel(zx) != 1 || zx->dtype != x->dtype)) return sp_ox_fail(r, "x's zero point must be one value of x's type");
    if (zw && ((sp_ox_numel(zw) != 1 && sp_ox_numel(zw) != m) || zw->dtype != w->dtype)) {
        return sp_ox_fail(r, "w's zero point must be one value or one per output channel, of w's type");
    }
    if (sp_ox_qconv_geom(r, n, x->dims, x->nd, w->dims, g)) return -1;
    int64_t kk = sp_ox_numel(w) / (m ? m : 1), kp = pad16(kk), hw = g->oh * g->ow;
    int64_t xn = sp_ox_numel(x);
    if (x->dims[0] * m * hw > r->g->max_numel || hw * kp > r->g->max_numel) return sp_ox_fail(r, "result too large");
    int16_t *x16 = malloc((size_t)(xn + 1) * sizeof *x16), *w16 = calloc((size_t)(m * kp + 1), sizeof *w16);
    int16_t *wt = malloc((size_t)(m * kk + 1) * sizeof *wt);
    int32_t *acc = malloc((size_t)(x->dims[0] * m * hw + 1) * sizeof *acc);
    int rc = -1;
    if (!x16 || !w16 || !wt || !acc) {
        sp_ox_fail(r, "out of memory");
        goto done;
    }
    widen(x, zx, x16);
    widen(w, zw, wt);
    for (int64_t o = 0; o < m; o++) memcpy(w16 + o * kp, wt + o * kk, (size_t)kk * sizeof *wt);
    rc = sp_ox_qconv_acc(r, x16, x->dims[0], c, w16, m, group, kp, g, acc, NULL);
done:
    free(x16);
    free(w16);
    free(wt);
    if (rc) free(acc);
    else *acc_out = acc;
    return rc;
}

static int
run_convint(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
            sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    sp_ox_qgeom_t g;
    int32_t *acc;
    const sp_ox_tensor_t *x = in[0], *w = in[1];
    if (int_conv(r, n, x, ni > 2 ? in[2] : NULL, w, ni > 3 ? in[3] : NULL, &g, &acc)) return -1;
    int64_t d[4] = {x->dims[0], w->dims[0], g.oh, g.ow};
    if (x->nd == 3) d[2] = g.ow;
    if (sp_ox_out(r, out[0], OX_INT32, x->nd, d)) {
        free(acc);
        return -1;
    }
    memcpy(out[0]->data, acc, (size_t)sp_ox_numel(out[0]) * sizeof *acc);
    free(acc);
    return 0;
}

static int
run_qlinear_conv(sp_ox_run_t *r, sp_ox_node_t *n, const sp_ox_tensor_t *const *in, int ni,
                 sp_ox_tensor_t *const *out, int no)
{
    (void)no;
    const sp_ox_tensor_t *x = in[0], *sx = in[1], *zx = in[2], *w = in[3], *sw = in[4], *zw = in[5],
                         *sy = in[6], *zy = in[7], *b = ni > 8 ? in[8] : NULL;
    int64_t m = w->nd ? w->dims[0] : 0;
    if (qparams(r, sx, zx, 0, false) || qparams(r, sw, zw, m, false) || qparams(r, sy, zy, 0, false)) return -1;
    if (b && (b->dtype != OX_INT32 || sp_ox_numel(b) != m)) return sp_ox_fail(r, "B must be %lld INT32 values", (long long)m);
    sp_ox_qgeom_t g;
    int32_t *acc;
    if (int_conv(r, n, x, zx, w, zw, &g, &acc)) return -1;
    int64_t d[4] = {x->dims[0], m, g.oh, g.ow};
    if (x->nd == 3) d[2] = g.ow;
    if (sp_ox_out(r, out[0], zy->dtype, x->nd, d)) {
        free(acc);
        return -1;
    }
    int64_t hw = g.oh * g.ow, nsw = sp_ox_numel(sw);
    float fx = *(const float *)sx->data, fy = *(const float *)sy->data;
    int32_t y0 = q8_at(zy, 0);
    for (int64_t nb = 0; nb < x->dims[0]; nb++) {
        for (int64_t o = 0; o < m; o++) {
            float mult = fx * ((const float *)sw->data)[nsw == 1 ? 0 : o] / fy;
            int32_t bias = b ? ((const int32_t *)b->data)[o] : 0;
            int64_t base = (nb * m + o) * hw;
            for (int64_t i = 0; i < hw; i++) {
                int32_t v = (int32_t)((uint32_t)acc[base + i] + (uint32_t)bias);
                q8_put(out[0], base + i, rint((double)v * (double)mult) + y0);
            }
        }
    }
    free(acc);
    return 0;
}

/* ---- the table ---- */

static const char *const A_NONE[] = {NULL};
static const char *const A_QL[] = {"axis", "saturate", NULL};
static const char *const A_DQL[] = {"axis", NULL};
static const char *const A_QCONV[] = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", NULL};

static const sp_ox_op_t quant_ops[] = {
    {"QuantizeLinear", A_QL, 2, 3, 1, 1, NULL, run_quantize},
    {"DequantizeLinear", A_DQL, 2, 3, 1, 1, NULL, run_dequantize},
    {"DynamicQuantizeLinear", A_NONE, 1, 1, 3, 3, NULL, run_dynquant},
    {"MatMulInteger", A_NONE, 2, 4, 1, 1, NULL, run_matmulint},
    {"QLinearMatMul", A_NONE, 8, 8, 1, 1, NULL, run_qlinear_matmul},
    {"ConvInteger", A_QCONV, 2, 4, 1, 1, NULL, run_convint},
    {"QLinearConv", A_QCONV, 8, 9, 1, 1, NULL, run_qlinear_conv},
};

const sp_ox_op_t *
sp_ox_quant_op_find(const char *op_type)
{
    for (size_t i = 0; i < sizeof quant_ops / sizeof quant_ops[0]; i++) {
        if (strcmp(quant_ops[i].name, op_type) == 0) return &quant_ops[i];
    }
    return sp_ox_more_op_find(op_type); /* ops_more.c: ConvTranspose, Resize */
}
