/*
 * ref_attn.c - scalar reference for attention and the element-wise ops
 * (exp, RMSNorm, SwiGLU).
 *
 * The oracle for cpu/avx2_attn.c and cpu/avx512_attn.c: dot products, the
 * softmax sum and the weighted sum of values accumulate in double, and exp is
 * libm's expf, so the reference is within a few float roundings of the exact
 * result whatever the context length.
 */
#include "kernels/cpu/cpu_impl.h"

#include <math.h>

/* Cache element i, in float. */
static inline float
kv_at(sp_type_t type, const void *base, int64_t i)
{
    if (type == SP_TYPE_F16) {
        return sp_fp16_to_fp32(((const sp_fp16_t *)base)[i]);
    }
    return ((const float *)base)[i];
}

/* Two passes per query: scores and their max, then exp, sum and the
 * weighted sum of values. */
static void
attn_ref(sp_type_t type, const sp_attn_args_t *a)
{
    const int64_t hd = a->head_dim, n_kv = a->n_kv;
    for (int64_t h = 0; h < a->n_q; h++) {
        const float *q = a->q + h * a->q_stride;
        float *o = a->o + h * a->o_stride;
        float *sc = a->scratch + h * sp_attn_scratch_stride(n_kv);
        float mx = -INFINITY;
        for (int64_t p = 0; p < n_kv; p++) {
            double s = 0.0;
            for (int64_t d = 0; d < hd; d++) {
                s += (double)q[d] * kv_at(type, a->k, sp_attn_k_offset(a, p, d));
            }
            sc[p] = (float)s * a->scale;
            mx = sc[p] > mx ? sc[p] : mx;
        }
        double sum = 0.0;
        for (int64_t p = 0; p < n_kv; p++) {
            sc[p] = expf(sc[p] - mx);
            sum += sc[p];
        }
        for (int64_t d = 0; d < hd; d++) {
            double acc = 0.0;
            for (int64_t p = 0; p < n_kv; p++) {
                acc += (double)sc[p] * kv_at(type, a->v, sp_attn_v_offset(a, p) + d);
            }
            o[d] = (float)(acc / sum);
        }
    }
}

static void
attn_f32(const sp_attn_args_t *a)
{
    attn_ref(SP_TYPE_F32, a);
}

static void
attn_f16(const sp_attn_args_t *a)
{
    attn_ref(SP_TYPE_F16, a);
}

static void
exp_f32(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        y[i] = expf(x[i]);
    }
}

static void
rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
    }
    const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) {
        out[i] = x[i] * scale * w[i];
    }
}

static void
swiglu(float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void
sp__attn_register_ref(sp_cpu_kernels_t *k)
{
    k->attn[SP_TYPE_F32] = attn_f32;
    k->attn[SP_TYPE_F16] = attn_f16;
    k->exp_f32 = exp_f32;
    k->rmsnorm = rmsnorm;
    k->swiglu = swiglu;
}
