/*
 * ref_attn.c - scalar reference for attention (F32, F16 and Q8_0 caches) and
 * the element-wise ops (exp, RMSNorm, SwiGLU); the Q8_0 cache's quantiser.
 *
 * The oracle for cpu/avx2_attn.c and cpu/avx512_attn.c: dot products, the
 * softmax sum and the weighted sum of values accumulate in double, and exp is
 * libm's expf, so the reference is within a few float roundings of the exact
 * result whatever the context length.
 */
#include "kernels/cpu/cpu_impl.h"

#include <math.h>
#include <string.h>

/* ---- the Q8_0 cache's layout (kernels.h) ---------------------------------- */

/* F16 at any byte address: value rows are 2 + n bytes per group and v_stride
 * may be odd, so scales are not always 2-byte aligned. */
static inline float
load_half(const void *p)
{
    sp_fp16_t h;
    memcpy(&h, p, sizeof h);
    return sp_fp16_to_fp32(h);
}

/* GGUF's Q8_0 rule, as q8_0_from_float in ref.c (so a value row with
 * head_dim % 32 == 0 has the same bytes as sp_quantize_row): d = amax / 127
 * rounded to F16, q = round(x / d) with the clamp applied before the int
 * conversion (NaN and huge quotients must not reach it). Writes
 * q[i * q_step] for the n elements and returns d. */
static sp_fp16_t
q8_group(const float *x, int64_t n, int8_t *q, int64_t q_step)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        amax = fmaxf(amax, fabsf(x[i]));
    }
    const sp_fp16_t dh = sp_fp32_to_fp16(amax / 127.0f);
    const float d = sp_fp16_to_fp32(dh);
    for (int64_t i = 0; i < n; i++) {
        float v = d != 0.0f ? x[i] / d : 0.0f; /* d == 0: all zero or below half's range */
        v = fminf(fmaxf(v, -127.0f), 127.0f); /* fmaxf(NaN, lo) = lo */
        q[i * q_step] = (int8_t)roundf(v);
    }
    return dh;
}

void
sp_kv_q8_store_key(void *tile, int64_t lane, const float *k, int64_t head_dim)
{
    int8_t *q = tile;
    char *scales = (char *)tile + SP_ATTN_BLOCK * head_dim;
    for (int64_t g = 0; g * SP_QK8_0 < head_dim; g++) {
        const int64_t d0 = g * SP_QK8_0;
        const int64_t n = head_dim - d0 < SP_QK8_0 ? head_dim - d0 : SP_QK8_0;
        const sp_fp16_t d = q8_group(k + d0, n, q + d0 * SP_ATTN_BLOCK + lane, SP_ATTN_BLOCK);
        memcpy(scales + 2 * (g * SP_ATTN_BLOCK + lane), &d, sizeof d);
    }
}

void
sp_kv_q8_store_value(void *row, const float *v, int64_t head_dim)
{
    char *b = row;
    for (int64_t d0 = 0; d0 < head_dim; d0 += SP_QK8_0) {
        const int64_t n = head_dim - d0 < SP_QK8_0 ? head_dim - d0 : SP_QK8_0;
        const sp_fp16_t d = q8_group(v + d0, n, (int8_t *)(b + 2), 1);
        memcpy(b, &d, sizeof d);
        b += 2 + n;
    }
}

float
sp_kv_q8_key(const void *tile, int64_t lane, int64_t d, int64_t head_dim)
{
    const int8_t q = ((const int8_t *)tile)[d * SP_ATTN_BLOCK + lane];
    const char *s = (const char *)tile + SP_ATTN_BLOCK * head_dim +
                    2 * ((d / SP_QK8_0) * SP_ATTN_BLOCK + lane);
    return (float)q * load_half(s);
}

float
sp_kv_q8_value(const void *row, int64_t d)
{
    const char *b = (const char *)row + (d / SP_QK8_0) * (2 + SP_QK8_0);
    return (float)((const int8_t *)b)[2 + d % SP_QK8_0] * load_half(b);
}

/* ---- attention ----------------------------------------------------------- */

/* Cache element i, in float (F32, F16). */
static inline float
kv_at(sp_type_t type, const void *base, int64_t i)
{
    if (type == SP_TYPE_F16) {
        return sp_fp16_to_fp32(((const sp_fp16_t *)base)[i]);
    }
    return ((const float *)base)[i];
}

/* Key (p, d) and value (p, d) through the block table, in float. */
static inline float
key_at(sp_type_t type, const sp_attn_args_t *a, int64_t p, int64_t d)
{
    if (type == SP_TYPE_Q8_0) {
        const char *tile =
            (const char *)a->k + (int64_t)a->blocks[p / SP_ATTN_BLOCK] * a->k_block_stride;
        return sp_kv_q8_key(tile, p % SP_ATTN_BLOCK, d, a->head_dim);
    }
    return kv_at(type, a->k, sp_attn_k_offset(a, p, d));
}

static inline float
value_at(sp_type_t type, const sp_attn_args_t *a, int64_t p, int64_t d)
{
    if (type == SP_TYPE_Q8_0) {
        return sp_kv_q8_value((const char *)a->v + sp_attn_v_offset(a, p), d);
    }
    return kv_at(type, a->v, sp_attn_v_offset(a, p) + d);
}

/* Two passes per query: scores (soft-capped) and their max with the sink,
 * then exp, sum and the weighted sum of values, over the positions the
 * window leaves (kernels.h). */
static void
attn_ref(sp_type_t type, const sp_attn_args_t *a)
{
    const int64_t hd = a->head_dim, n_kv = a->n_kv, lo = sp_attn_first(a);
    for (int64_t h = 0; h < a->n_q; h++) {
        const float *q = a->q + h * a->q_stride;
        float *o = a->o + h * a->o_stride;
        float *sc = a->scratch + h * sp_attn_scratch_stride(n_kv);
        float mx = a->sinks != NULL ? a->sinks[h] : -INFINITY;
        for (int64_t p = lo; p < n_kv; p++) {
            double s = 0.0;
            for (int64_t d = 0; d < hd; d++) {
                s += (double)q[d] * key_at(type, a, p, d);
            }
            sc[p] = (float)s * a->scale;
            if (a->softcap > 0.0f) {
                sc[p] = sp_attn_softcap(sc[p], a->softcap);
            }
            mx = sc[p] > mx ? sc[p] : mx;
        }
        double sum = a->sinks != NULL ? (double)expf(a->sinks[h] - mx) : 0.0;
        for (int64_t p = lo; p < n_kv; p++) {
            sc[p] = expf(sc[p] - mx);
            sum += sc[p];
        }
        for (int64_t d = 0; d < hd; d++) {
            double acc = 0.0;
            for (int64_t p = lo; p < n_kv; p++) {
                acc += (double)sc[p] * value_at(type, a, p, d);
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
attn_q8_0(const sp_attn_args_t *a)
{
    attn_ref(SP_TYPE_Q8_0, a);
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
    k->attn[SP_TYPE_Q8_0] = attn_q8_0;
    k->exp_f32 = exp_f32;
    k->rmsnorm = rmsnorm;
    k->swiglu = swiglu;
}
