/*
 * ref_kquants2.c - scalar reference for Q2_K, Q3_K, Q5_K and IQ4_XS weights (x Q8_K
 * activations): dequantizers, ggml's reference quantizers (the scale searches of
 * quantize_row_q2_K/q3_K/q5_K_ref and IQ4_XS's non-linear grid search, re-implemented from their
 * description so files we write quantize as llama-quantize's reference path does), and dot
 * products that are the oracle for avx2_kquants2.c / avx512_kquants2.c.
 *
 * Pure functions of their arguments: no state, no allocation (a few KiB of stack), callable from
 * any thread. Dot products follow the contract of kquants2_impl.h: each super-block is unpacked
 * to 256 signed quants plus one scale (and min) per 16 elements, summed exactly in int32, then
 * finished in float in a fixed order.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/kquants2_impl.h"
#include "kernels/cpu/kquants_impl.h"

const int8_t sp_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

/* ggml's all-zero threshold for a group's largest magnitude */
#define GROUP_MAX_EPS 1e-15f

static inline int
clampi(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* Round half to even (ggml's nearest_int, which adds 1.5 * 2^23, rounds the same way in its
 * range). Clamped first so garbage input (inf, NaN -> -1e9) never makes the conversion
 * undefined; callers clamp the result to the quant range. */
static inline int
round_int(float v)
{
    return (int)nearbyintf(fminf(fmaxf(v, -1e9f), 1e9f));
}

/* ---- unpacking to (quants, per-16 scales, per-16 mins) -------------------------------------- */

/* A super-block as the dot product sees it: element i is q[i], group g = i / 16 has integer
 * scale sc[g] and min m[g]: x = d * sc * q - dmin * m (m = 0 for the scale-only types). */
typedef struct {
    int8_t q[SP_QK_K];
    int16_t sc[16];
    int16_t m[16];
} kq_unpacked;

static void
q2k_unpack(const sp_block_q2_k *x, kq_unpacked *u)
{
    /* qs byte 32 * (i / 128) + i % 32 holds element i at bits 2 * ((i % 128) / 32) */
    for (int i = 0; i < SP_QK_K; i++)
        u->q[i] = (int8_t)((x->qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3);
    for (int g = 0; g < 16; g++) {
        u->sc[g] = x->scales[g] & 0xF;
        u->m[g] = x->scales[g] >> 4;
    }
}

static void
q3k_unpack(const sp_block_q3_k *x, kq_unpacked *u)
{
    /* low 2 bits laid out like Q2_K; hmask[i % 32] bit i / 32 set means "no -4" */
    for (int i = 0; i < SP_QK_K; i++) {
        const int lo = (x->qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
        const int hi = (x->hmask[i % 32] >> (i / 32)) & 1;
        u->q[i] = (int8_t)(lo - (hi ? 0 : 4));
    }
    uint8_t sc[16];
    sp__q3k_unpack_scales(x->scales, sc);
    for (int g = 0; g < 16; g++) {
        u->sc[g] = (int16_t)(sc[g] - 32);
        u->m[g] = 0;
    }
}

static void
q5k_unpack(const sp_block_q5_k *x, kq_unpacked *u)
{
    uint8_t sc[8], m[8];
    sp__q4k_unpack_scales(x->scales, sc, m);
    for (int j = 0; j < 8; j++) {
        const uint8_t *q = x->qs + 32 * (j / 2);
        for (int l = 0; l < 32; l++)
            u->q[32 * j + l] =
                (int8_t)(((q[l] >> (4 * (j & 1))) & 0xF) | (((x->qh[l] >> j) & 1) << 4));
        u->sc[2 * j] = u->sc[2 * j + 1] = sc[j];
        u->m[2 * j] = u->m[2 * j + 1] = m[j];
    }
}

static void
iq4xs_unpack(const sp_block_iq4_xs *x, kq_unpacked *u)
{
    uint8_t sc[8];
    sp__iq4xs_unpack_scales(x, sc);
    for (int ib = 0; ib < 8; ib++) {
        for (int j = 0; j < 16; j++) {
            u->q[32 * ib + j] = sp_iq4nl_values[x->qs[16 * ib + j] & 0xF];
            u->q[32 * ib + 16 + j] = sp_iq4nl_values[x->qs[16 * ib + j] >> 4];
        }
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)(sc[ib] - 32);
        u->m[2 * ib] = u->m[2 * ib + 1] = 0;
    }
}

/* sumi = sum_g sc[g] * dot(q, q8) over group g; summs = sum_g m[g] * bsums[g]. Exact. */
static void
kq_block_dot(const kq_unpacked *u, const sp_block_q8_k *y, int32_t *sumi, int32_t *summs)
{
    int32_t si = 0, sm = 0;
    for (int g = 0; g < 16; g++) {
        int32_t dot = 0;
        for (int l = 0; l < 16; l++)
            dot += u->q[16 * g + l] * y->qs[16 * g + l];
        si += u->sc[g] * dot;
        sm += u->m[g] * y->bsums[g];
    }
    *sumi = si;
    *summs = sm;
}

/* ---- dequantizers (ggml's float order: d * sc first, then times q, minus dmin * m) ---------- */

static void
kq_to_float(const kq_unpacked *u, float d, float dmin, float *dst)
{
    for (int g = 0; g < 16; g++) {
        const float ds = d * (float)u->sc[g], dm = dmin * (float)u->m[g];
        for (int l = 0; l < 16; l++)
            *dst++ = ds * (float)u->q[16 * g + l] - dm;
    }
}

void
sp__q2k_to_float_ref(const void *src, float *dst, int64_t n)
{
    const sp_block_q2_k *x = src;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++, dst += SP_QK_K) {
        q2k_unpack(&x[b], &u);
        kq_to_float(&u, sp_fp16_to_fp32(x[b].d), sp_fp16_to_fp32(x[b].dmin), dst);
    }
}

void
sp__q3k_to_float_ref(const void *src, float *dst, int64_t n)
{
    const sp_block_q3_k *x = src;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++, dst += SP_QK_K) {
        q3k_unpack(&x[b], &u);
        kq_to_float(&u, sp_fp16_to_fp32(x[b].d), 0.0f, dst);
    }
}

void
sp__q5k_to_float_ref(const void *src, float *dst, int64_t n)
{
    const sp_block_q5_k *x = src;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++, dst += SP_QK_K) {
        q5k_unpack(&x[b], &u);
        kq_to_float(&u, sp_fp16_to_fp32(x[b].d), sp_fp16_to_fp32(x[b].dmin), dst);
    }
}

void
sp__iq4xs_to_float_ref(const void *src, float *dst, int64_t n)
{
    const sp_block_iq4_xs *x = src;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++, dst += SP_QK_K) {
        iq4xs_unpack(&x[b], &u);
        kq_to_float(&u, sp_fp16_to_fp32(x[b].d), 0.0f, dst);
    }
}

/* ---- dot products --------------------------------------------------------------------------- */

static inline float
finish_scale_min(const sp_block_q8_k *y, sp_fp16_t xd, sp_fp16_t xdmin, int32_t sumi,
                 int32_t summs)
{
    const float d = y->d * sp_fp16_to_fp32(xd);
    const float dm = y->d * sp_fp16_to_fp32(xdmin);
    const float a = d * (float)sumi;
    const float c = dm * (float)summs;
    return a - c;
}

static inline float
finish_scale(const sp_block_q8_k *y, sp_fp16_t xd, int32_t sumi)
{
    const float d = y->d * sp_fp16_to_fp32(xd);
    return d * (float)sumi;
}

void
sp__q2k_vec_dot_ref(int64_t n, float *s, const void *w, const void *xv)
{
    const sp_block_q2_k *x = w;
    const sp_block_q8_k *y = xv;
    float sumf = 0.0f;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        int32_t sumi, summs;
        q2k_unpack(&x[b], &u);
        kq_block_dot(&u, &y[b], &sumi, &summs);
        const float blk = finish_scale_min(&y[b], x[b].d, x[b].dmin, sumi, summs);
        sumf = sumf + blk;
    }
    *s = sumf;
}

void
sp__q3k_vec_dot_ref(int64_t n, float *s, const void *w, const void *xv)
{
    const sp_block_q3_k *x = w;
    const sp_block_q8_k *y = xv;
    float sumf = 0.0f;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        int32_t sumi, summs;
        q3k_unpack(&x[b], &u);
        kq_block_dot(&u, &y[b], &sumi, &summs);
        const float blk = finish_scale(&y[b], x[b].d, sumi);
        sumf = sumf + blk;
    }
    *s = sumf;
}

void
sp__q5k_vec_dot_ref(int64_t n, float *s, const void *w, const void *xv)
{
    const sp_block_q5_k *x = w;
    const sp_block_q8_k *y = xv;
    float sumf = 0.0f;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        int32_t sumi, summs;
        q5k_unpack(&x[b], &u);
        kq_block_dot(&u, &y[b], &sumi, &summs);
        const float blk = finish_scale_min(&y[b], x[b].d, x[b].dmin, sumi, summs);
        sumf = sumf + blk;
    }
    *s = sumf;
}

void
sp__iq4xs_vec_dot_ref(int64_t n, float *s, const void *w, const void *xv)
{
    const sp_block_iq4_xs *x = w;
    const sp_block_q8_k *y = xv;
    float sumf = 0.0f;
    kq_unpacked u;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        int32_t sumi, summs;
        iq4xs_unpack(&x[b], &u);
        kq_block_dot(&u, &y[b], &sumi, &summs);
        const float blk = finish_scale(&y[b], x[b].d, sumi);
        sumf = sumf + blk;
    }
    *s = sumf;
}

/* ---- quantizers ----------------------------------------------------------------------------- */

/*
 * Weighted fit x ~= scale * L + min, L in 0..nmax, min <= 0 (ggml's make_qkx2_quants): start
 * from the min/max grid, then try nstep + 1 stretched grids (nmax + rmin + rdelta * is levels over
 * the range), each with its weighted least-squares (scale, min); keep the smallest weighted error
 * (squared, or absolute with use_mad). Returns the scale, *the_min = -min >= 0; L holds the
 * winning levels.
 */
static float
fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
              float rmin, float rdelta, int nstep, bool use_mad)
{
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(round_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(round_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += w[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

void
sp__q5k_from_float_ref(const float *src, void *dst, int64_t n)
{
    sp_block_q5_k *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        uint8_t L[SP_QK_K];
        float scales[8], mins[8], weights[32];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; j++) {
            const float *x = src + 32 * j;
            float sum_x2 = 0;
            for (int l = 0; l < 32; l++)
                sum_x2 += x[l] * x[l];
            const float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; l++)
                weights[l] = av_x + fabsf(x[l]);
            scales[j] =
                fit_scale_min(32, 31, x, weights, L + 32 * j, &mins[j], -0.5f, 0.1f, 15, false);
            if (scales[j] > max_scale)
                max_scale = scales[j];
            if (mins[j] > max_min)
                max_min = mins[j];
        }
        const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        uint8_t ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = (uint8_t)clampi(round_int(inv_scale * scales[j]), 0, 63);
            lm[j] = (uint8_t)clampi(round_int(inv_min * mins[j]), 0, 63);
        }
        /* Q4_K's packing (kquants_impl.h) */
        for (int j = 0; j < 4; j++) {
            y[b].scales[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
            y[b].scales[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
            y[b].scales[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
        }
        y[b].d = sp_fp32_to_fp16(max_scale / 63.f);
        y[b].dmin = sp_fp32_to_fp16(max_min / 63.f);
        /* Re-quantize against the stored scales; a sub-block whose scale is 0 keeps the fit's
         * levels (they multiply 0). */
        for (int j = 0; j < 8; j++) {
            const float d = sp_fp16_to_fp32(y[b].d) * ls[j];
            if (d == 0.0f)
                continue;
            const float dm = sp_fp16_to_fp32(y[b].dmin) * lm[j];
            for (int i = 0; i < 32; i++)
                L[32 * j + i] = (uint8_t)clampi(round_int((src[32 * j + i] + dm) / d), 0, 31);
        }
        memset(y[b].qh, 0, sizeof(y[b].qh));
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++)
                y[b].qh[l] |= (uint8_t)((L[32 * j + l] >> 4) << j);
        for (int h = 0; h < 4; h++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * h + l] =
                    (uint8_t)((L[64 * h + l] & 0xF) | ((L[64 * h + 32 + l] & 0xF) << 4));
    }
}

/* The 2-bit planes of Q2_K / Q3_K: element i at byte 32 * (i / 128) + i % 32, bits
 * 2 * ((i % 128) / 32). L[i] in 0..3. */
static void
pack_2bit(const uint8_t L[SP_QK_K], uint8_t qs[SP_QK_K / 4])
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *o = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(o[0] | (o[32] << 2) | (o[64] << 4) | (o[96] << 6));
        }
}

void
sp__q2k_from_float_ref(const float *src, void *dst, int64_t n)
{
    sp_block_q2_k *y = dst;
    const float q4scale = 15.f;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        uint8_t L[SP_QK_K];
        float scales[16], mins[16], weights[16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++)
                weights[l] = fabsf(src[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, src + 16 * j, weights, L + 16 * j, &mins[j], -0.5f,
                                      0.1f, 15, true);
            if (scales[j] > max_scale)
                max_scale = scales[j];
            if (mins[j] > max_min)
                max_min = mins[j];
        }
        memset(y[b].scales, 0, sizeof(y[b].scales));
        y[b].d = sp_fp32_to_fp16(0.0f);
        y[b].dmin = sp_fp32_to_fp16(0.0f);
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++)
                y[b].scales[j] = (uint8_t)clampi(round_int(iscale * scales[j]), 0, 15);
            y[b].d = sp_fp32_to_fp16(max_scale / q4scale);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++)
                y[b].scales[j] |= (uint8_t)(clampi(round_int(iscale * mins[j]), 0, 15) << 4);
            y[b].dmin = sp_fp32_to_fp16(max_min / q4scale);
        }
        for (int j = 0; j < 16; j++) {
            const float d = sp_fp16_to_fp32(y[b].d) * (float)(y[b].scales[j] & 0xF);
            if (d == 0.0f)
                continue;
            const float dm = sp_fp16_to_fp32(y[b].dmin) * (float)(y[b].scales[j] >> 4);
            for (int i = 0; i < 16; i++)
                L[16 * j + i] = (uint8_t)clampi(round_int((src[16 * j + i] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[b].qs);
    }
}

/*
 * Symmetric fit x ~= scale * L, L in -nmax..nmax-1 (ggml's make_q3_quants with its RMSE
 * refinement): start from the grid that puts the largest-magnitude value at -nmax, then up to 5
 * passes moving single levels where that raises (sum w x L)^2 / sum w L^2 with w = x^2. L comes
 * back offset by nmax (0..2 nmax - 1).
 */
static float
fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(round_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = clampi(round_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (n_changed == 0)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

void
sp__q3k_from_float_ref(const float *src, void *dst, int64_t n)
{
    sp_block_q3_k *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        int8_t L[SP_QK_K];
        float scales[16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_symmetric(16, 4, src + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        memset(y[b].scales, 0, sizeof(y[b].scales));
        if (max_scale != 0.0f) {
            /* the largest-magnitude scale goes to -32 (stored 0) */
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = clampi(round_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8)
                    y[b].scales[j] = (uint8_t)(l & 0xF);
                else
                    y[b].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[b].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[b].d = sp_fp32_to_fp16(1 / iscale);
        } else {
            y[b].d = sp_fp32_to_fp16(0.0f);
        }
        uint8_t sc[16];
        sp__q3k_unpack_scales(y[b].scales, sc);
        for (int j = 0; j < 16; j++) {
            const float d = sp_fp16_to_fp32(y[b].d) * (float)(sc[j] - 32);
            if (d == 0.0f)
                continue;
            for (int i = 0; i < 16; i++)
                L[16 * j + i] = (int8_t)(clampi(round_int(src[16 * j + i] / d), -4, 3) + 4);
        }
        /* bit 2 to hmask (element i: byte i % 32, bit i / 32), low 2 bits to qs */
        uint8_t lo[SP_QK_K];
        memset(y[b].hmask, 0, sizeof(y[b].hmask));
        for (int i = 0; i < SP_QK_K; i++) {
            y[b].hmask[i % 32] |= (uint8_t)(((L[i] >> 2) & 1) << (i / 32));
            lo[i] = (uint8_t)(L[i] & 3);
        }
        pack_2bit(lo, y[b].qs);
    }
}

/* Index of the table level nearest to v (ties to the lower one, ggml's best_index_int8). */
static int
iq4_nearest(float v)
{
    const int8_t *val = sp_iq4nl_values;
    if (!(v > val[0]))
        return v <= val[0] ? 0 : 8; /* NaN (garbage input) gets the level nearest 0 */
    if (v >= val[15])
        return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < val[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

void
sp__iq4xs_from_float_ref(const float *src, void *dst, int64_t n)
{
    const int8_t *values = sp_iq4nl_values;
    const int ntry = 7;
    sp_block_iq4_xs *y = dst;
    for (int64_t b = 0; b < n / SP_QK_K; b++, src += SP_QK_K) {
        float scales[8], weight[32];
        uint8_t L[SP_QK_K];
        float max_scale = 0, amax_scale = 0;
        /* per sub-block: the best scale for the grid with weights x^2, over 2 ntry + 2 grids */
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = src + 32 * ib;
            for (int j = 0; j < 32; j++)
                weight[j] = xb[j] * xb[j];
            float amax = 0, max = 0;
            for (int j = 0; j < 32; j++) {
                const float ax = fabsf(xb[j]);
                if (ax > amax) {
                    amax = ax;
                    max = xb[j];
                }
            }
            if (amax < GROUP_MAX_EPS) {
                scales[ib] = 0;
                continue;
            }
            float d = -max / values[0];
            float id = 1 / d;
            float sumqx = 0, sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const float q = values[iq4_nearest(id * xb[j])];
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
            float best = d * sumqx;
            for (int itry = -ntry; itry <= ntry; itry++) {
                id = (float)(itry + values[0]) / max;
                sumqx = sumq2 = 0;
                for (int j = 0; j < 32; j++) {
                    const float q = values[iq4_nearest(id * xb[j])];
                    sumqx += weight[j] * q * xb[j];
                    sumq2 += weight[j] * q * q;
                }
                if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            scales[ib] = d;
            if (fabsf(d) > amax_scale) {
                amax_scale = fabsf(d);
                max_scale = d;
            }
        }
        /* 6-bit scales against d = -max_scale / 32 (the largest goes to -32), then every
         * element to the nearest level of its rounded scale (the unrounded float d, as ggml) */
        const float d = -max_scale / 32;
        y[b].d = sp_fp32_to_fp16(d);
        const float id = d != 0.0f ? 1 / d : 0.f;
        y[b].scales_h = 0;
        memset(y[b].scales_l, 0, sizeof(y[b].scales_l));
        for (int ib = 0; ib < 8; ib++) {
            int l = clampi(round_int(id * scales[ib]), -32, 31);
            const float dl = d * (float)l;
            const float idl = dl != 0.0f ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++)
                L[32 * ib + j] = (uint8_t)iq4_nearest(idl * src[32 * ib + j]);
            l += 32;
            y[b].scales_l[ib / 2] |= (uint8_t)((l & 0xF) << (4 * (ib % 2)));
            y[b].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        for (int ib = 0; ib < 8; ib++)
            for (int j = 0; j < 16; j++)
                y[b].qs[16 * ib + j] = (uint8_t)(L[32 * ib + j] | (L[32 * ib + 16 + j] << 4));
    }
}

/* ---- registration and the quantize/dequantize entry points ---------------------------------- */

void
sp__kquants2_register_ref(sp_cpu_kernels_t *k)
{
    static const sp_type_t types[] = {SP_TYPE_Q2_K, SP_TYPE_Q3_K, SP_TYPE_Q5_K, SP_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        k->vec_dot_type[types[i]] = SP_TYPE_Q8_K;
    k->vec_dot[SP_TYPE_Q2_K] = sp__q2k_vec_dot_ref;
    k->vec_dot[SP_TYPE_Q3_K] = sp__q3k_vec_dot_ref;
    k->vec_dot[SP_TYPE_Q5_K] = sp__q5k_vec_dot_ref;
    k->vec_dot[SP_TYPE_IQ4_XS] = sp__iq4xs_vec_dot_ref;
    k->to_float[SP_TYPE_Q2_K] = sp__q2k_to_float_ref;
    k->to_float[SP_TYPE_Q3_K] = sp__q3k_to_float_ref;
    k->to_float[SP_TYPE_Q5_K] = sp__q5k_to_float_ref;
    k->to_float[SP_TYPE_IQ4_XS] = sp__iq4xs_to_float_ref;
}

bool
sp__kquants2_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n)
{
    if (n < 0 || n % SP_QK_K != 0)
        return false;
    switch (type) {
    case SP_TYPE_Q2_K: sp__q2k_from_float_ref(src, dst, n); return true;
    case SP_TYPE_Q3_K: sp__q3k_from_float_ref(src, dst, n); return true;
    case SP_TYPE_Q5_K: sp__q5k_from_float_ref(src, dst, n); return true;
    case SP_TYPE_IQ4_XS: sp__iq4xs_from_float_ref(src, dst, n); return true;
    default: return false;
    }
}

bool
sp__kquants2_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n)
{
    if (n < 0 || n % SP_QK_K != 0)
        return false;
    switch (type) {
    case SP_TYPE_Q2_K: sp__q2k_to_float_ref(src, dst, n); return true;
    case SP_TYPE_Q3_K: sp__q3k_to_float_ref(src, dst, n); return true;
    case SP_TYPE_Q5_K: sp__q5k_to_float_ref(src, dst, n); return true;
    case SP_TYPE_IQ4_XS: sp__iq4xs_to_float_ref(src, dst, n); return true;
    default: return false;
    }
}
