/*
 * repack_k56.c - the scalar gemms over the packed forms of Q6_K and Q5_K (repack_impl.h):
 * the unit tests' oracle for the SIMD ones (avx2_kpack.c). Each reads a row's values back
 * through the packed layout and runs the reference vec_dot's integer sums and float sequence
 * (kquants_impl.h's Q6_K finish, kquants2_impl.h's Q5_K one), so its results are the
 * reference's bits on the original rows.
 *
 * Pure functions on caller memory, any thread, no heap.
 */
#include "kernels/cpu/repack_impl.h"

#include <string.h>

/* Element e (0..255) of row r's super-block in a packed Q6_K block, 0..63 (the file's
 * q + 32): ql's nibble and qh's two bits, where the file's q6k_unpack finds them. */
static int32_t
q6k_elem(const uint8_t *pb, int r, int e)
{
    const int h = e / 128, c = (e % 128) / 32, l = e % 32;
    const uint8_t ql = pb[SP_REPACK_Q6K_QL + sp__repack_chunk_off(r, 64 * h + 32 * (c & 1) + l)];
    const uint8_t qh = pb[SP_REPACK_Q6K_QH + sp__repack_chunk_off(r, 32 * h + l)];
    return (int32_t)(((ql >> (4 * (c >> 1))) & 0x0f) | (((qh >> (2 * c)) & 3) << 4));
}

/* Row r against one Q8_K row: ref_kquants.c's sumi = sum_k sc[k] * sum (q - 32) * y, then
 * d = y.d * fp16(x.d); blk = d * sumi; sumf = sumf + blk. */
static float
row_dot_q6k(int64_t n, const uint8_t *g, int r, const sp_block_q8_k *y)
{
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_Q6K_BLOCK_BYTES;
        int32_t sumi = 0;
        for (int k = 0; k < 16; k++) {
            int32_t dot = 0;
            for (int i = 0; i < 16; i++) {
                dot += (q6k_elem(pb, r, 16 * k + i) - 32) * y[b].qs[16 * k + i];
            }
            const int8_t sc = (int8_t)pb[SP_REPACK_Q6K_SC + 16 * (k / 2) + 2 * r + k % 2];
            sumi += sc * dot;
        }
        sp_fp16_t wd;
        memcpy(&wd, pb + SP_REPACK_Q6K_D + 2 * r, sizeof wd);
        const float d = y[b].d * sp_fp16_to_fp32(wd);
        const float blk = d * (float)sumi;
        sumf = sumf + blk;
    }
    return sumf;
}

/* Row r against one Q8_K row: ref_kquants2.c's sums (sub-block j of 32: qs nibble j & 1 and
 * qh bit j, scale sc[j], min m[j] against bsums[2j] + bsums[2j + 1]) and its scale-and-min
 * finish. */
static float
row_dot_q5k(int64_t n, const uint8_t *g, int r, const sp_block_q8_k *y)
{
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_Q5K_BLOCK_BYTES;
        int32_t sumi = 0, summs = 0;
        for (int j = 0; j < 8; j++) {
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) {
                const uint8_t qs = pb[SP_REPACK_Q5K_QS + sp__repack_chunk_off(r, 32 * (j / 2) + l)];
                const uint8_t qh = pb[SP_REPACK_Q5K_QH + sp__repack_chunk_off(r, l)];
                const int32_t q = ((qs >> (4 * (j & 1))) & 0x0f) | (((qh >> j) & 1) << 4);
                dot += q * y[b].qs[32 * j + l];
            }
            sumi += pb[SP_REPACK_Q4K_SC + 8 * j + r] * dot;
            summs += pb[SP_REPACK_Q4K_M + 8 * r + j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        }
        sp_fp16_t wd, wm;
        memcpy(&wd, pb + SP_REPACK_Q4K_D + 2 * r, sizeof wd);
        memcpy(&wm, pb + SP_REPACK_Q4K_DMIN + 2 * r, sizeof wm);
        const float d = y[b].d * sp_fp16_to_fp32(wd);
        const float dm = y[b].d * sp_fp16_to_fp32(wm);
        const float a = d * (float)sumi;
        const float c = dm * (float)summs;
        const float blk = a - c;
        sumf = sumf + blk;
    }
    return sumf;
}

static void
gemm_ref(bool q6, int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    for (int64_t t = 0; t < n_tok; t++) {
        const sp_block_q8_k *xt = (const void *)((const uint8_t *)x + (size_t)t * x_stride);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *g = (const uint8_t *)w + (size_t)(r / SP_REPACK_ROWS) * w_stride;
            const int rr = (int)(r % SP_REPACK_ROWS);
            y[t * ldy + r] = q6 ? row_dot_q6k(n, g, rr, xt) : row_dot_q5k(n, g, rr, xt);
        }
    }
}

void
sp__repack_q6_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    gemm_ref(true, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_q5_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    gemm_ref(false, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}
