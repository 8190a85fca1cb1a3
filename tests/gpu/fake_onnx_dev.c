/*
 * tests/gpu/fake_onnx_dev.c - a host emulation of the ONNX GPU executor's
 * device operations (backends/onnx/cuda/dev.h). Linked with exec.c it makes
 * build/libfake_onnx_cuda.so, which exports the same ABI as the real
 * libsampan_onnx_cuda.so, so the plugin's GPU path (lowering, dlopen, the
 * executor's shapes, views, memory pool, convolution plan cache, FP16
 * storage, errors) runs in CI without a GPU.
 *
 * "Device memory" is host memory; FP16 tensors are stored as binary16
 * exactly as on the device and every op rounds its output to it, so FP16
 * results carry the rounding a GPU's would (sums are in double here,
 * float on the GPU: both well inside the FP16 tolerance).
 *
 * Fault injection (environment, read at each call):
 *   FAKE_OXD_FAIL=<op>        that op fails (conv, conv_plan, gemm, unary, binary, copy,
 *                             pool, reduce, softmax, affine, gather, h2d, d2h, open) and
 *                             poisons the context, as a sticky CUDA error would
 *   FAKE_OXD_MEM_LIMIT=<n>    allocations beyond n bytes in all fail (not sticky)
 *   FAKE_OXD_NO_DEVICE=1      probe and open fail as without a GPU
 * Counters for the tests: fake_oxd_live() (allocations not freed), fake_oxd_plans()
 * (measured algorithm searches: plans made without an algorithm to reuse).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../backends/onnx/cuda/dev.h"
#include "../../backends/onnx/cuda/half.h"
#include "../../backends/onnx/gpu_api.h"

struct oxd {
    char err[256];
    int poisoned;
};

typedef struct fplan {
    oxd_conv_t cv;
} fplan_t;

static long live_allocs;
static size_t live_bytes;
static long plans_made;

__attribute__((visibility("default"))) long fake_oxd_live(void) { return live_allocs; }
__attribute__((visibility("default"))) long fake_oxd_plans(void) { return plans_made; }

static int
injected(oxd_t *d, const char *op)
{
    if (d->poisoned) return -1;
    const char *f = getenv("FAKE_OXD_FAIL");
    if (f && strcmp(f, op) == 0) {
        snprintf(d->err, sizeof d->err, "fake device: %s: an illegal memory access was encountered (injected)", op);
        d->poisoned = 1;
        return -1;
    }
    return 0;
}

int
oxd_probe(int device, char *err, size_t err_len)
{
    if (getenv("FAKE_OXD_NO_DEVICE")) {
        snprintf(err, err_len, "no CUDA device (fake device: FAKE_OXD_NO_DEVICE)");
        return -1;
    }
    if (device != 0) {
        snprintf(err, err_len, "CUDA device %d does not exist (fake device: 1 device)", device);
        return -1;
    }
    return 0;
}

int
oxd_open(int device, oxd_t **d, char *err, size_t err_len)
{
    if (oxd_probe(device, err, err_len)) return -1;
    const char *f = getenv("FAKE_OXD_FAIL");
    if (f && strcmp(f, "open") == 0) {
        snprintf(err, err_len, "fake device: cudnnCreate: CUDNN_STATUS_NOT_INITIALIZED (injected)");
        return -1;
    }
    *d = calloc(1, sizeof **d);
    if (*d == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    return 0;
}

void oxd_close(oxd_t *d) { free(d); }
int oxd_bind(oxd_t *d) { return d->poisoned ? -1 : 0; }
const char *oxd_error(const oxd_t *d) { return d->err[0] ? d->err : "fake device: no error"; }

/* Allocations carry their size in front, for the accounting. */
int
oxd_alloc(oxd_t *d, size_t bytes, void **p)
{
    if (d->poisoned) return -1;
    const char *lim = getenv("FAKE_OXD_MEM_LIMIT");
    if (lim && live_bytes + bytes > (size_t)strtoull(lim, NULL, 10)) {
        snprintf(d->err, sizeof d->err, "fake device: cudaMalloc(%zu): out of memory", bytes);
        return -1;
    }
    char *q = malloc(bytes + 64);
    if (q == NULL) {
        snprintf(d->err, sizeof d->err, "fake device: cudaMalloc(%zu): out of memory", bytes);
        return -1;
    }
    memcpy(q, &bytes, sizeof bytes);
    live_allocs++;
    live_bytes += bytes;
    *p = q + 64;
    return 0;
}

void
oxd_free(oxd_t *d, void *p)
{
    (void)d;
    if (p == NULL) return;
    char *q = (char *)p - 64;
    size_t bytes;
    memcpy(&bytes, q, sizeof bytes);
    live_allocs--;
    live_bytes -= bytes;
    free(q);
}

int
oxd_h2d(oxd_t *d, void *dst, const void *src, size_t bytes)
{
    if (injected(d, "h2d")) return -1;
    memcpy(dst, src, bytes);
    return 0;
}

int
oxd_d2h(oxd_t *d, void *dst, const void *src, size_t bytes)
{
    if (injected(d, "d2h")) return -1;
    memcpy(dst, src, bytes);
    return 0;
}

int oxd_sync(oxd_t *d) { return d->poisoned ? -1 : 0; }

static float
ld(int dt, const void *p, int64_t i)
{
    return dt == OXD_F16 ? oxh_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void
st(int dt, void *p, int64_t i, float v)
{
    if (dt == OXD_F16) ((uint16_t *)p)[i] = oxh_from_f32(v);
    else ((float *)p)[i] = v;
}

int
oxd_convert(oxd_t *d, int dst_dt, void *dst, int src_dt, const void *src, int64_t n)
{
    if (injected(d, "convert")) return -1;
    for (int64_t i = 0; i < n; i++) st(dst_dt, dst, i, ld(src_dt, src, i));
    return 0;
}

static float
unary1(int op, float x, float a, float b)
{
    switch (op) {
    case SP_OXG_RELU: return x > 0 ? x : 0;
    case SP_OXG_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case SP_OXG_TANH: return tanhf(x);
    case SP_OXG_GELU:
        if (a != 0) return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
        return 0.5f * x * (1.0f + erff(x * 0.70710678f));
    case SP_OXG_ERF: return erff(x);
    case SP_OXG_CLIP: return x < a ? a : x > b ? b : x;
    case SP_OXG_HARDSWISH: { float t = x / 6.0f + 0.5f; t = t < 0 ? 0 : t > 1 ? 1 : t; return x * t; }
    case SP_OXG_LEAKYRELU: return x >= 0 ? x : a * x;
    case SP_OXG_HARDSIGMOID: { float t = a * x + b; return t < 0 ? 0 : t > 1 ? 1 : t; }
    case SP_OXG_SQRT: return sqrtf(x);
    case SP_OXG_EXP: return expf(x);
    case SP_OXG_LOG: return logf(x);
    case SP_OXG_NEG: return -x;
    case SP_OXG_ABS: return fabsf(x);
    case SP_OXG_RECIP: return 1.0f / x;
    default: return x;
    }
}

int
oxd_unary(oxd_t *d, int dt, int op, float a, float b, const void *x, void *y, int64_t n)
{
    if (injected(d, "unary")) return -1;
    for (int64_t i = 0; i < n; i++) st(dt, y, i, unary1(op, ld(dt, x, i), a, b));
    return 0;
}

/* Offsets of element i of dims under strides s. */
static int64_t
offset(int nd, const int64_t *dims, const int64_t *s, int64_t i)
{
    int64_t o = 0;
    for (int k = nd - 1; k >= 0; k--) {
        o += (i % dims[k]) * s[k];
        i /= dims[k];
    }
    return o;
}

int
oxd_binary(oxd_t *d, int dt, int op, int nd, const int64_t *dims, const int64_t *sa, const int64_t *sb,
           const void *a, const void *b, void *y)
{
    if (injected(d, "binary")) return -1;
    int64_t n = 1;
    for (int k = 0; k < nd; k++) n *= dims[k];
    for (int64_t i = 0; i < n; i++) {
        float u = ld(dt, a, offset(nd, dims, sa, i)), v = ld(dt, b, offset(nd, dims, sb, i)), r;
        switch (op) {
        case SP_OXG_ADD: r = u + v; break;
        case SP_OXG_SUB: r = u - v; break;
        case SP_OXG_MUL: r = u * v; break;
        case SP_OXG_DIV: r = u / v; break;
        default: r = powf(u, v); break;
        }
        st(dt, y, i, r);
    }
    return 0;
}

int
oxd_copy(oxd_t *d, size_t elem, int nd, const int64_t *dims, const void *x, const int64_t *sx, void *y,
         const int64_t *sy)
{
    if (injected(d, "copy")) return -1;
    int64_t n = 1;
    for (int k = 0; k < nd; k++) n *= dims[k];
    for (int64_t i = 0; i < n; i++) {
        memcpy((char *)y + offset(nd, dims, sy, i) * (int64_t)elem, (const char *)x + offset(nd, dims, sx, i) * (int64_t)elem, elem);
    }
    return 0;
}

int
oxd_affine(oxd_t *d, int dt, const void *x, const void *scale, const void *shift, void *y, int64_t outer,
           int64_t c, int64_t inner, int relu)
{
    if (injected(d, "affine")) return -1;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j = 0; j < c; j++) {
            float s = scale ? ld(dt, scale, j) : 1.0f, t = shift ? ld(dt, shift, j) : 0.0f;
            for (int64_t i = 0; i < inner; i++) {
                int64_t k = (o * c + j) * inner + i;
                float v = ld(dt, x, k) * s + t;
                st(dt, y, k, relu && v < 0 ? 0 : v);
            }
        }
    }
    return 0;
}

int
oxd_pool(oxd_t *d, int dt, const oxd_pool_t *p, const void *x, void *y)
{
    if (injected(d, "pool")) return -1;
    for (int64_t pl = 0; pl < p->n * p->c; pl++) {
        for (int64_t oy = 0; oy < p->oh; oy++) {
            for (int64_t ox = 0; ox < p->ow; ox++) {
                float mx = -INFINITY;
                double sum = 0;
                int64_t cnt = 0, cnt_pad = 0;
                for (int64_t ky = 0; ky < p->kh; ky++) {
                    int64_t iy = oy * p->sh - p->pad_t + ky * p->dh;
                    for (int64_t kx = 0; kx < p->kw; kx++) {
                        int64_t ix = ox * p->sw - p->pad_l + kx * p->dw;
                        if (iy >= -p->pad_t && iy < p->h + p->pad_b && ix >= -p->pad_l && ix < p->w + p->pad_r) cnt_pad++;
                        if (iy < 0 || iy >= p->h || ix < 0 || ix >= p->w) continue;
                        float v = ld(dt, x, (pl * p->h + iy) * p->w + ix);
                        mx = v > mx ? v : mx;
                        sum += v;
                        cnt++;
                    }
                }
                int64_t div = p->count_pad ? cnt_pad : cnt;
                st(dt, y, (pl * p->oh + oy) * p->ow + ox, p->max ? mx : (float)(sum / (double)(div ? div : 1)));
            }
        }
    }
    return 0;
}

int
oxd_softmax(oxd_t *d, int dt, const void *x, void *y, int64_t outer, int64_t n, int64_t inner, int lg)
{
    if (injected(d, "softmax")) return -1;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            float mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) mx = fmaxf(mx, ld(dt, x, base + j * inner));
            double s = 0;
            for (int64_t j = 0; j < n; j++) s += exp((double)ld(dt, x, base + j * inner) - mx);
            for (int64_t j = 0; j < n; j++) {
                double v = (double)ld(dt, x, base + j * inner) - mx;
                st(dt, y, base + j * inner, (float)(lg ? v - log(s) : exp(v) / s));
            }
        }
    }
    return 0;
}

int
oxd_reduce(oxd_t *d, int dt, int op, const void *x, void *y, int64_t outer, int64_t n, int64_t inner)
{
    if (injected(d, "reduce")) return -1;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            double s = 0;
            float mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                float v = ld(dt, x, (o * n + j) * inner + i);
                s += v;
                mx = v > mx ? v : mx;
            }
            float r = op == SP_OXG_RMAX ? mx : op == SP_OXG_RMEAN ? (float)(n ? s / (double)n : NAN) : (float)s;
            st(dt, y, o * inner + i, r);
        }
    }
    return 0;
}

int
oxd_layernorm(oxd_t *d, int dt, const void *x, const void *scale, int64_t sstep, const void *bias, int64_t bstep,
              void *y, void *mean_out, void *inv_out, int64_t rows, int64_t cols, float eps)
{
    if (injected(d, "layernorm")) return -1;
    for (int64_t r = 0; r < rows; r++) {
        double s = 0, q = 0;
        for (int64_t j = 0; j < cols; j++) s += ld(dt, x, r * cols + j);
        double mean = s / (double)cols;
        for (int64_t j = 0; j < cols; j++) {
            double t = ld(dt, x, r * cols + j) - mean;
            q += t * t;
        }
        double inv = 1.0 / sqrt(q / (double)cols + eps);
        for (int64_t j = 0; j < cols; j++) {
            double v = (ld(dt, x, r * cols + j) - mean) * inv * ld(dt, scale, j * sstep) + (bias ? ld(dt, bias, j * bstep) : 0);
            st(dt, y, r * cols + j, (float)v);
        }
        if (mean_out) st(dt, mean_out, r, (float)mean);
        if (inv_out) st(dt, inv_out, r, (float)inv);
    }
    return 0;
}

int
oxd_gather(oxd_t *d, size_t elem, const void *x, const int64_t *idx, void *y, int64_t outer, int64_t n_axis,
           int64_t inner, int64_t n_idx)
{
    if (injected(d, "gather")) return -1;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j = 0; j < n_idx; j++) {
            if (idx[j] < 0 || idx[j] >= n_axis) {
                snprintf(d->err, sizeof d->err, "fake device: gather index %lld out of range", (long long)idx[j]);
                d->poisoned = 1;
                return -1;
            }
            memcpy((char *)y + (size_t)((o * n_idx + j) * inner) * elem,
                   (const char *)x + (size_t)((o * n_axis + idx[j]) * inner) * elem, (size_t)inner * elem);
        }
    }
    return 0;
}

int
oxd_gemm(oxd_t *d, int dt, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
         int64_t lda, int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b, float beta, void *c,
         int64_t ldc, int64_t stride_c, int64_t batch)
{
    if (injected(d, "gemm")) return -1;
    for (int64_t p = 0; p < batch; p++) {
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t q = 0; q < k; q++) {
                    float u = ld(dt, a, p * stride_a + (ta ? q * lda + i : i * lda + q));
                    float v = ld(dt, b, p * stride_b + (tb ? j * ldb + q : q * ldb + j));
                    s += (double)u * v;
                }
                int64_t ci = p * stride_c + i * ldc + j;
                double r = alpha * s + (beta != 0 ? beta * (double)ld(dt, c, ci) : 0.0);
                st(dt, c, ci, (float)r);
            }
        }
    }
    return 0;
}

int
oxd_conv_plan(oxd_t *d, const oxd_conv_t *cv, size_t ws_limit, int *algo, void **plan, size_t *ws_bytes)
{
    if (injected(d, "conv_plan")) return -1;
    fplan_t *p = malloc(sizeof *p);
    if (p == NULL) {
        snprintf(d->err, sizeof d->err, "fake device: out of host memory");
        return -1;
    }
    p->cv = *cv;
    *plan = p;
    /* a workspace like an im2col buffer's, within the limit, so that exec.c's handling runs */
    size_t ws = (size_t)(cv->c / cv->group * cv->r * cv->s * cv->oh * cv->ow) * (cv->dt == OXD_F16 ? 2 : 4);
    *ws_bytes = ws <= ws_limit ? ws : 0;
    if (*algo < 0) {
        plans_made++; /* a measured search, as cudnnFindConvolutionForwardAlgorithm */
        *algo = 1;
    }
    return 0;
}

void oxd_conv_plan_free(oxd_t *d, void *plan) { (void)d; free(plan); }

int
oxd_conv(oxd_t *d, void *plan, const void *x, const void *w, const void *bias, int relu, void *y, void *ws,
         size_t ws_bytes)
{
    if (injected(d, "conv")) return -1;
    const oxd_conv_t *c = &((fplan_t *)plan)->cv;
    int dt = c->dt;
    if (ws_bytes) memset(ws, 0xff, ws_bytes); /* the executor must not rely on its contents */
    int64_t cg = c->c / c->group, kg = c->k / c->group;
    for (int64_t b = 0; b < c->n; b++) {
        for (int64_t o = 0; o < c->k; o++) {
            int64_t g = o / kg;
            for (int64_t oy = 0; oy < c->oh; oy++) {
                for (int64_t ox = 0; ox < c->ow; ox++) {
                    double s = bias ? ld(dt, bias, o) : 0;
                    for (int64_t ic = 0; ic < cg; ic++) {
                        for (int64_t ky = 0; ky < c->r; ky++) {
                            int64_t iy = oy * c->sh - c->pad_h + ky * c->dh;
                            if (iy < 0 || iy >= c->h) continue;
                            for (int64_t kx = 0; kx < c->s; kx++) {
                                int64_t ix = ox * c->sw - c->pad_w + kx * c->dw;
                                if (ix < 0 || ix >= c->w) continue;
                                s += (double)ld(dt, x, ((b * c->c + g * cg + ic) * c->h + iy) * c->w + ix) *
                                     ld(dt, w, ((o * cg + ic) * c->r + ky) * c->s + kx);
                            }
                        }
                    }
                    st(dt, y, ((b * c->k + o) * c->oh + oy) * c->ow + ox, relu && s < 0 ? 0.0f : (float)s);
                }
            }
        }
    }
    return 0;
}
