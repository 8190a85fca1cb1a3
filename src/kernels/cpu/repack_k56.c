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
 * q + 32), from its "6+2" bytes (repack_impl.h): the low 6 bits of byte 24 J + t for the first
 * 24 elements of value group J, the top bit pairs of bytes 24 J + 8 m + i for element
 * 32 J + 24 + i. */
static int32_t
q6k_elem(const uint8_t *pb, int r, int e)
{
    const int J = e / 32, t = e % 32;
    const uint8_t *q = pb + SP_REPACK_Q6K_Q;
    if (t < 24) {
        return q[sp__repack_chunk_off(r, 24 * J + t)] & 0x3f;
    }
    int32_t v = 0;
    for (int m = 0; m < 3; m++) {
        v |= (int32_t)(q[sp__repack_chunk_off(r, 24 * J + 8 * m + t - 24)] >> 6) << (2 * m);
    }
    return v;
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
