/*
 * repack_k56.c - the scalar row dot over the packed Q6_K form (repack_impl.h), which
 * repack.c's packed_gemm_ref runs for sp__repack_q6_k_gemm_ref: the unit tests' oracle for
 * avx2_kpack.c. It reads a row's values back through the packed layout and runs the reference
 * vec_dot's integer sums and float sequence (kquants_impl.h's Q6_K finish), so its results are
 * the reference's bits on the original rows. Q5_K's row dot is Q4_K's with the qh bit
 * (repack.c's sp__repack_row_dot_q45k): the two forms share the header.
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
float
sp__repack_row_dot_q6k(int64_t n, const uint8_t *g, int r, const sp_block_q8_k *y)
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
