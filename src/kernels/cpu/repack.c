/*
 * repack.c - the packed (row-interleaved) form of Q4_0 and IQ4_NL weights: sizes, packing
 * and unpacking (level-independent: the layout is kernels.h's), and the scalar gemms over
 * it that the unit tests use as the oracle of the SIMD ones.
 *
 * Pure functions on caller memory, any thread, no heap.
 */
#include "kernels/cpu/repack_impl.h"

#include <string.h>

#include "kernels/cpu/q32_impl.h"

/* Both packed types are a 2-byte F16 scale and 16 quant bytes per 32 elements. */
static bool
packable(sp_type_t type)
{
    return type == SP_TYPE_Q4_0 || type == SP_TYPE_IQ4_NL;
}

_Static_assert(sizeof(sp_block_q4_0) == 18 && sizeof(sp_block_iq4_nl) == 18 &&
                   offsetof(sp_block_q4_0, qs) == 2 && offsetof(sp_block_iq4_nl, qs) == 2,
               "Q4_0 and IQ4_NL share one block shape");
_Static_assert(SP_REPACK_BLOCK_BYTES == SP_REPACK_ROWS * 18, "a packed block is 8 blocks");

size_t
sp_repack_group_bytes(sp_type_t type, int64_t n)
{
    if (!packable(type) || n <= 0 || n % 32 != 0 || n > SP_REPACK_MAX_N) {
        return 0;
    }
    return (size_t)(n / 32) * SP_REPACK_BLOCK_BYTES;
}

size_t
sp_repack_bytes(sp_type_t type, int64_t n, int64_t n_rows)
{
    const size_t gb = sp_repack_group_bytes(type, n);
    if (gb == 0 || n_rows <= 0) {
        return 0;
    }
    return gb * (size_t)((n_rows + SP_REPACK_ROWS - 1) / SP_REPACK_ROWS);
}

void
sp_repack_pack(sp_type_t type, int64_t n, const void *src, size_t src_stride, int64_t n_rows,
               int64_t g0, int64_t g1, void *dst)
{
    const size_t gb = sp_repack_group_bytes(type, n);
    const int64_t nb = n / 32;
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *out = (uint8_t *)dst + (size_t)g * gb;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *pb = out + (size_t)b * SP_REPACK_BLOCK_BYTES;
            for (int r = 0; r < SP_REPACK_ROWS; r++) {
                const int64_t row = g * SP_REPACK_ROWS + r;
                uint8_t blk[18];
                if (row < n_rows) {
                    memcpy(blk, (const uint8_t *)src + (size_t)row * src_stride + (size_t)b * 18,
                           18);
                } else {
                    memset(blk, 0, sizeof blk); /* a zero row: scale 0 */
                }
                memcpy(pb + 2 * r, blk, 2);
                for (int j = 0; j < 16; j++) {
                    pb[sp__repack_qs_off(r, j)] = blk[2 + j];
                }
            }
        }
    }
}

void
sp_repack_unpack_row(sp_type_t type, int64_t n, const void *packed, int64_t r, void *dst)
{
    const size_t gb = sp_repack_group_bytes(type, n);
    const int64_t nb = n / 32;
    const uint8_t *g = (const uint8_t *)packed + (size_t)(r / SP_REPACK_ROWS) * gb;
    const int rr = (int)(r % SP_REPACK_ROWS);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_BLOCK_BYTES;
        uint8_t *o = (uint8_t *)dst + (size_t)b * 18;
        memcpy(o, pb + 2 * rr, 2);
        for (int j = 0; j < 16; j++) {
            o[2 + j] = pb[sp__repack_qs_off(rr, j)];
        }
    }
}

/* One row's dot product with one Q8_0 activation row, in the reference's order: Q4_0 as
 * ref.c's vec_dot (one serial float sum over the blocks), IQ4_NL as q32_impl.h's contract
 * (eight partial sums by block index mod 8, then the fixed tree). */
static float
packed_row_dot(bool nl, int64_t n, const uint8_t *g, int r, const sp_block_q8_0 *x)
{
    float sum = 0.0f, acc[SP_Q32_LANES] = {0.0f};
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_BLOCK_BYTES;
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            const uint8_t q = pb[sp__repack_qs_off(r, j)];
            const int32_t lo = nl ? sp__kvalues_iq4nl[q & 0x0f] : (q & 0x0f) - 8;
            const int32_t hi = nl ? sp__kvalues_iq4nl[q >> 4] : (q >> 4) - 8;
            isum += lo * (int32_t)x[b].qs[j] + hi * (int32_t)x[b].qs[j + 16];
        }
        sp_fp16_t wd;
        memcpy(&wd, pb + 2 * r, sizeof wd);
        const float d = sp_fp16_to_fp32(wd) * sp_fp16_to_fp32(x[b].d);
        if (nl) {
            const float blk = d * (float)isum;
            acc[b % SP_Q32_LANES] = acc[b % SP_Q32_LANES] + blk;
        } else {
            sum += (float)isum * d;
        }
    }
    return nl ? sp__q32_sum_lanes(acc) : sum;
}

static void
packed_gemm_ref(bool nl, int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    for (int64_t t = 0; t < n_tok; t++) {
        const sp_block_q8_0 *xt =
            (const sp_block_q8_0 *)((const uint8_t *)x + (size_t)t * x_stride);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *g = (const uint8_t *)w + (size_t)(r / SP_REPACK_ROWS) * w_stride;
            y[t * ldy + r] = packed_row_dot(nl, n, g, (int)(r % SP_REPACK_ROWS), xt);
        }
    }
}

void
sp__repack_q4_0_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(false, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_iq4_nl_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                           const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(true, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}
