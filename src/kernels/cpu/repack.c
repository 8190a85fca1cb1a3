/*
 * repack.c - the packed (row-interleaved) form of Q4_0, IQ4_NL, MXFP4, Q8_0, Q4_K, IQ4_XS, Q6_K and
 * Q5_K weights (the last two's scalar gemms in repack_k56.c):
 * sizes, packing and unpacking (level-independent: the layouts are kernels.h's and
 * repack_impl.h's), and the scalar gemms over it that the unit tests use as the oracle of
 * the SIMD ones.
 *
 * Pure functions on caller memory, any thread, no heap.
 */
#include "kernels/cpu/repack_impl.h"

#include <string.h>

#include "kernels/cpu/kquants_impl.h"
#include "kernels/cpu/q32_impl.h"

/* One packed type: elements per block, bytes of a file block, of a packed block of 8 rows,
 * and where a block's quant bytes start in the file's block and in the packed one (the
 * header before them, hdr bytes a row: F16 d, or MXFP4's one E8M0 byte). */
typedef struct {
    int qk, blk, pblk, qs_bytes, qs_src, qs_dst;
} rp_shape_t;

static bool
shape_of(sp_type_t type, rp_shape_t *s)
{
    switch (type) {
    case SP_TYPE_Q4_0:
    case SP_TYPE_IQ4_NL:
        *s = (rp_shape_t){32, 18, SP_REPACK_BLOCK_BYTES, 16, 2, SP_REPACK_ROWS * 2};
        return true;
    case SP_TYPE_MXFP4:
        *s = (rp_shape_t){32, 17, SP_REPACK_MXFP4_BLOCK_BYTES, 16, 1, SP_REPACK_ROWS};
        return true;
    case SP_TYPE_Q8_0:
        *s = (rp_shape_t){32, 34, SP_REPACK_Q8_0_BLOCK_BYTES, 32, 2, SP_REPACK_ROWS * 2};
        return true;
    case SP_TYPE_Q4_K:
        *s = (rp_shape_t){SP_QK_K, (int)sizeof(sp_block_q4_k), SP_REPACK_Q4K_BLOCK_BYTES, 128,
                          (int)offsetof(sp_block_q4_k, qs), SP_REPACK_Q4K_QS};
        return true;
    case SP_TYPE_IQ4_XS:
        *s = (rp_shape_t){SP_QK_K, (int)sizeof(sp_block_iq4_xs), SP_REPACK_IQ4XS_BLOCK_BYTES, 128,
                          (int)offsetof(sp_block_iq4_xs, qs), SP_REPACK_IQ4XS_QS};
        return true;
    case SP_TYPE_Q6_K: /* "quant bytes": ql then qh, 192 a row, moved to "6+2" bytes */
        *s = (rp_shape_t){SP_QK_K, (int)sizeof(sp_block_q6_k), SP_REPACK_Q6K_BLOCK_BYTES, 192,
                          (int)offsetof(sp_block_q6_k, ql), SP_REPACK_Q6K_Q};
        return true;
    case SP_TYPE_Q5_K: /* "quant bytes": qh then qs, 160 a row */
        *s = (rp_shape_t){SP_QK_K, (int)sizeof(sp_block_q5_k), SP_REPACK_Q5K_BLOCK_BYTES, 160,
                          (int)offsetof(sp_block_q5_k, qh), SP_REPACK_Q5K_QH};
        return true;
    default:
        return false;
    }
}

_Static_assert(sizeof(sp_block_q4_0) == 18 && sizeof(sp_block_iq4_nl) == 18 &&
                   offsetof(sp_block_q4_0, qs) == 2 && offsetof(sp_block_iq4_nl, qs) == 2,
               "Q4_0 and IQ4_NL share one block shape");
_Static_assert(SP_REPACK_BLOCK_BYTES == SP_REPACK_ROWS * 18, "a packed block is 8 blocks");
_Static_assert(sizeof(sp_block_mxfp4) == 17 && offsetof(sp_block_mxfp4, e) == 0 &&
                   offsetof(sp_block_mxfp4, qs) == 1 &&
                   SP_REPACK_MXFP4_BLOCK_BYTES == SP_REPACK_ROWS * 17,
               "MXFP4: one E8M0 byte, then IQ4_NL's 16 quant bytes");
_Static_assert(SP_REPACK_Q8_0_BLOCK_BYTES == SP_REPACK_ROWS * 34, "a packed block is 8 blocks");
_Static_assert(offsetof(sp_block_q4_k, d) == 0 && offsetof(sp_block_q4_k, dmin) == 2 &&
                   offsetof(sp_block_q4_k, scales) == 4 && offsetof(sp_block_q4_k, qs) == 16,
               "the Q4_K block layout the packing assumes");
_Static_assert(offsetof(sp_block_q6_k, ql) == 0 && offsetof(sp_block_q6_k, qh) == 128 &&
                   offsetof(sp_block_q6_k, scales) == 192 && offsetof(sp_block_q6_k, d) == 208 &&
                   SP_REPACK_Q6K_BLOCK_BYTES == SP_REPACK_ROWS * 210,
               "the Q6_K block layout the packing assumes");
_Static_assert(offsetof(sp_block_q5_k, scales) == 4 && offsetof(sp_block_q5_k, qh) == 16 &&
                   offsetof(sp_block_q5_k, qs) == 48,
               "Q5_K: Q4_K's header, then qh and qs");
_Static_assert(offsetof(sp_block_iq4_xs, d) == 0 && offsetof(sp_block_iq4_xs, scales_h) == 2 &&
                   offsetof(sp_block_iq4_xs, scales_l) == 4 && offsetof(sp_block_iq4_xs, qs) == 8,
               "the IQ4_XS block layout the packing assumes");

/* IQ4_XS's sub-block scale j (0..63, biased by 32): low 4 bits in scales_l, nibble j % 2 of
 * byte j / 2; high 2 bits in bits 2j, 2j+1 of scales_h (little-endian). */
static uint8_t
iq4xs_scale(const uint8_t *blk, int j)
{
    const unsigned h = (unsigned)blk[2] | (unsigned)blk[3] << 8;
    return (uint8_t)(((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((h >> (2 * j)) & 3) << 4));
}

static size_t
row8_group_bytes(sp_type_t type, int64_t n)
{
    rp_shape_t s;
    if (!shape_of(type, &s) || n <= 0 || n % s.qk != 0 || n > SP_REPACK_MAX_N) {
        return 0;
    }
    return (size_t)(n / s.qk) * (size_t)s.pblk;
}


/* The inverse of sp__q4k_unpack_scales (kquants_impl.h): 8 six-bit scales and mins back to
 * the GGUF's 12 bytes. Every one of the 96 bits is one of the 16 fields, so this and the
 * unpacking are inverse bijections. */
static void
q4k_pack_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[SP_K_SCALE_SIZE])
{
    for (int i = 0; i < 4; i++) {
        out[i] = (uint8_t)((sc[i] & 0x3f) | ((sc[4 + i] >> 4) << 6));
        out[4 + i] = (uint8_t)((m[i] & 0x3f) | ((m[4 + i] >> 4) << 6));
        out[8 + i] = (uint8_t)((sc[4 + i] & 0x0f) | ((m[4 + i] & 0x0f) << 4));
    }
}

/* 8 bytes as one word and back (SWAR below: the byte fields never carry into a neighbour) */
static uint64_t
ld8(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void
st8(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

#define B8(x) (UINT64_C(0x0101010101010101) * (x)) /* byte x in every byte of a word */

/* A Q6_K block's 192 quant bytes (ql then qh) as its 256 six-bit values (the file's q + 32,
 * 0..63: ql's nibble and qh's two bits, where ref_kquants.c's unpacking finds them), and back.
 * Every bit is one value's: the two are inverse bijections. The packing runs this once per row
 * and super-block of every Q6_K tensor at load, so a word (eight values) at a time. */
static void
q6k_values(const uint8_t *qlh, uint8_t q[256])
{
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l += 8) {
            const uint64_t ql = ld8(qlh + 64 * h + l), ql2 = ld8(qlh + 64 * h + 32 + l);
            const uint64_t qh = ld8(qlh + 128 + 32 * h + l);
            uint8_t *o = q + 128 * h + l;
            st8(o, (ql & B8(0x0f)) | (qh & B8(3)) << 4);
            st8(o + 32, (ql2 & B8(0x0f)) | (qh >> 2 & B8(3)) << 4);
            st8(o + 64, (ql >> 4 & B8(0x0f)) | (qh >> 4 & B8(3)) << 4);
            st8(o + 96, (ql2 >> 4 & B8(0x0f)) | (qh >> 6 & B8(3)) << 4);
        }
    }
}

static void
q6k_from_values(const uint8_t q[256], uint8_t *qlh)
{
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l += 8) {
            const uint8_t *v = q + 128 * h + l;
            const uint64_t v0 = ld8(v), v1 = ld8(v + 32), v2 = ld8(v + 64), v3 = ld8(v + 96);
            st8(qlh + 64 * h + l, (v0 & B8(0x0f)) | (v2 & B8(0x0f)) << 4);
            st8(qlh + 64 * h + 32 + l, (v1 & B8(0x0f)) | (v3 & B8(0x0f)) << 4);
            st8(qlh + 128 + 32 * h + l, (v0 >> 4 & B8(3)) | (v1 >> 4 & B8(3)) << 2 |
                                            (v2 >> 4 & B8(3)) << 4 | (v3 >> 4 & B8(3)) << 6);
        }
    }
}

/* The values as repack_impl.h's "6+2" bytes, in place of the 192 quant bytes, and back. */
static void
q6k_to_v6(uint8_t *qlh)
{
    uint8_t q[256];
    q6k_values(qlh, q);
    for (int J = 0; J < 8; J++) {
        const uint64_t top = ld8(q + 32 * J + 24);
        for (int m = 0; m < 3; m++) {
            st8(qlh + 24 * J + 8 * m, ld8(q + 32 * J + 8 * m) | (top >> (2 * m) & B8(3)) << 6);
        }
    }
}

static void
q6k_from_v6(uint8_t *v)
{
    uint8_t q[256];
    for (int J = 0; J < 8; J++) {
        uint64_t top = 0;
        for (int m = 0; m < 3; m++) {
            const uint64_t w = ld8(v + 24 * J + 8 * m);
            st8(q + 32 * J + 8 * m, w & B8(0x3f));
            top |= (w >> 6 & B8(3)) << (2 * m);
        }
        st8(q + 32 * J + 24, top);
    }
    q6k_from_values(q, v);
}

/* The non-quant part of row r's block: scales (and Q4_K's mins) to / from a packed block. */
static void
put_header(sp_type_t type, int r, const uint8_t *blk, uint8_t *pb)
{
    if (type == SP_TYPE_IQ4_XS) {
        memcpy(pb + 2 * r, blk, 2);
        for (int j = 0; j < 8; j++) {
            pb[SP_REPACK_IQ4XS_SC + 8 * j + r] = iq4xs_scale(blk, j);
        }
        return;
    }
    if (type == SP_TYPE_MXFP4) {
        pb[r] = blk[0];
        return;
    }
    if (type == SP_TYPE_Q6_K) {
        memcpy(pb + SP_REPACK_Q6K_D + 2 * r, blk + offsetof(sp_block_q6_k, d), 2);
        for (int k = 0; k < 16; k++) {
            pb[SP_REPACK_Q6K_SC + 16 * (k / 2) + 2 * r + k % 2] =
                blk[offsetof(sp_block_q6_k, scales) + (size_t)k];
        }
        return;
    }
    if (type != SP_TYPE_Q4_K && type != SP_TYPE_Q5_K) { /* Q5_K: Q4_K's header */
        memcpy(pb + 2 * r, blk, 2);
        return;
    }
    uint8_t sc[8], m[8];
    memcpy(pb + SP_REPACK_Q4K_D + 2 * r, blk, 2);
    memcpy(pb + SP_REPACK_Q4K_DMIN + 2 * r, blk + 2, 2);
    sp__q4k_unpack_scales(blk + 4, sc, m);
    for (int j = 0; j < 8; j++) {
        pb[SP_REPACK_Q4K_SC + 8 * j + r] = sc[j];
        pb[SP_REPACK_Q4K_M + 8 * r + j] = m[j];
    }
}

static void
get_header(sp_type_t type, int r, const uint8_t *pb, uint8_t *blk)
{
    if (type == SP_TYPE_IQ4_XS) {
        unsigned h = 0;
        memcpy(blk, pb + 2 * r, 2);
        memset(blk + 4, 0, 4);
        for (int j = 0; j < 8; j++) {
            const unsigned ls = pb[SP_REPACK_IQ4XS_SC + 8 * j + r];
            blk[4 + j / 2] |= (uint8_t)((ls & 0x0f) << (4 * (j % 2)));
            h |= ((ls >> 4) & 3) << (2 * j);
        }
        blk[2] = (uint8_t)(h & 0xff);
        blk[3] = (uint8_t)(h >> 8);
        return;
    }
    if (type == SP_TYPE_MXFP4) {
        blk[0] = pb[r];
        return;
    }
    if (type == SP_TYPE_Q6_K) {
        memcpy(blk + offsetof(sp_block_q6_k, d), pb + SP_REPACK_Q6K_D + 2 * r, 2);
        for (int k = 0; k < 16; k++) {
            blk[offsetof(sp_block_q6_k, scales) + (size_t)k] =
                pb[SP_REPACK_Q6K_SC + 16 * (k / 2) + 2 * r + k % 2];
        }
        return;
    }
    if (type != SP_TYPE_Q4_K && type != SP_TYPE_Q5_K) {
        memcpy(blk, pb + 2 * r, 2);
        return;
    }
    uint8_t sc[8], m[8];
    memcpy(blk, pb + SP_REPACK_Q4K_D + 2 * r, 2);
    memcpy(blk + 2, pb + SP_REPACK_Q4K_DMIN + 2 * r, 2);
    for (int j = 0; j < 8; j++) {
        sc[j] = pb[SP_REPACK_Q4K_SC + 8 * j + r];
        m[j] = pb[SP_REPACK_Q4K_M + 8 * r + j];
    }
    q4k_pack_scales(sc, m, blk + 4);
}

static void
row8_pack(sp_type_t type, int64_t n, const void *src, size_t src_stride, int64_t n_rows,
               int64_t g0, int64_t g1, void *dst)
{
    rp_shape_t s;
    const size_t gb = row8_group_bytes(type, n);
    if (gb == 0 || !shape_of(type, &s)) {
        return;
    }
    const int64_t nb = n / s.qk;
    uint8_t blk[sizeof(sp_block_q6_k)]; /* the largest block of a packed type */
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *out = (uint8_t *)dst + (size_t)g * gb;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *pb = out + (size_t)b * (size_t)s.pblk;
            for (int r = 0; r < SP_REPACK_ROWS; r++) {
                const int64_t row = g * SP_REPACK_ROWS + r;
                if (row < n_rows) {
                    memcpy(blk, (const uint8_t *)src + (size_t)row * src_stride + (size_t)b * s.blk,
                           (size_t)s.blk);
                } else {
                    memset(blk, 0, (size_t)s.blk); /* a zero row: scales 0 */
                }
                put_header(type, r, blk, pb);
                if (type == SP_TYPE_Q6_K) {
                    q6k_to_v6(blk + s.qs_src);
                }
                for (int j = 0; j < s.qs_bytes; j += 8) { /* 8 bytes share a 64-bit lane */
                    memcpy(pb + s.qs_dst + sp__repack_chunk_off(r, j), blk + s.qs_src + j, 8);
                }
            }
        }
    }
}

static void
row8_unpack_row(sp_type_t type, int64_t n, const void *packed, int64_t r, void *dst)
{
    rp_shape_t s;
    const size_t gb = row8_group_bytes(type, n);
    if (gb == 0 || !shape_of(type, &s)) {
        return;
    }
    const int64_t nb = n / s.qk;
    const uint8_t *g = (const uint8_t *)packed + (size_t)(r / SP_REPACK_ROWS) * gb;
    const int rr = (int)(r % SP_REPACK_ROWS);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = g + (size_t)b * (size_t)s.pblk;
        uint8_t *o = (uint8_t *)dst + (size_t)b * (size_t)s.blk;
        get_header(type, rr, pb, o);
        for (int j = 0; j < s.qs_bytes; j += 8) {
            memcpy(o + s.qs_src + j, pb + s.qs_dst + sp__repack_chunk_off(rr, j), 8);
        }
        if (type == SP_TYPE_Q6_K) {
            q6k_from_v6(o + s.qs_src);
        }
    }
}

/* ---- SP_REPACK_PANEL16 (Q8_0, Q4_0) ------------------------------------------------------ */

/* Bytes of one row's block in the file (34 for Q8_0, 18 for Q4_0): the F16 scale, then the
 * quant bytes. */
static size_t
p16_file_block(sp_type_t type)
{
    return 2 + sp__p16_row_qs(type);
}

static size_t
p16_group_bytes(sp_type_t type, int64_t n)
{
    if ((type != SP_TYPE_Q8_0 && type != SP_TYPE_Q4_0) || n <= 0 || n % SP_QK8_0 != 0 ||
        n > SP_REPACK_MAX_N) {
        return 0;
    }
    return (size_t)((n / SP_QK8_0 + 1) / 2) * sp__p16_pair_bytes_of(type);
}

/* Q8_0's quants are stored + 128 (q ^ 0x80), the unsigned operand of VPDPBUSD; Q4_0's raw
 * nibbles already are (q + 8), so its bytes are the file's, only moved. */
static uint8_t
p16_code(sp_type_t type, uint8_t file_byte)
{
    return type == SP_TYPE_Q8_0 ? (uint8_t)(file_byte ^ 0x80) : file_byte;
}

static void
p16_pack(sp_type_t type, int64_t n, const void *src, size_t src_stride, int64_t n_rows,
         int64_t g0, int64_t g1, void *dst)
{
    const size_t gb = p16_group_bytes(type, n), fb = p16_file_block(type);
    const int qb = (int)sp__p16_row_qs(type);
    const int64_t nb = n / SP_QK8_0, nb_pad = (nb + 1) / 2 * 2;
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *out = (uint8_t *)dst + (size_t)g * gb;
        for (int64_t b = 0; b < nb_pad; b++) {
            uint8_t *qs = out + sp__p16_qs_off_of(type, b), *d = out + sp__p16_d_off_of(type, b);
            for (int i = 0; i < SP_P16_ROWS; i++) {
                const int64_t row = g * SP_P16_ROWS + i;
                uint8_t blk[34];
                if (row < n_rows && b < nb) {
                    memcpy(blk, (const uint8_t *)src + (size_t)row * src_stride + (size_t)b * fb, fb);
                } else {
                    memset(blk, 0, fb); /* a zero row or the pad block: scale 0 */
                }
                memcpy(d + 2 * i, blk, 2);
                for (int j = 0; j < qb; j++) {
                    qs[sp__p16_elem_off(type, i, j)] = p16_code(type, blk[2 + j]);
                }
            }
        }
    }
}

static void
p16_unpack_row(sp_type_t type, int64_t n, const void *packed, int64_t r, void *dst)
{
    const size_t gb = p16_group_bytes(type, n), fb = p16_file_block(type);
    const int qb = (int)sp__p16_row_qs(type);
    const uint8_t *g = (const uint8_t *)packed + (size_t)(r / SP_P16_ROWS) * gb;
    const int i = (int)(r % SP_P16_ROWS);
    for (int64_t b = 0; b < n / SP_QK8_0; b++) {
        uint8_t *o = (uint8_t *)dst + (size_t)b * fb;
        memcpy(o, g + sp__p16_d_off_of(type, b) + 2 * i, 2);
        for (int j = 0; j < qb; j++) {
            /* the code is its own inverse (XOR, or none) */
            o[2 + j] = p16_code(type, g[sp__p16_qs_off_of(type, b) + sp__p16_elem_off(type, i, j)]);
        }
    }
}

/* ---- either layout ------------------------------------------------------------------- */

int
sp_repack_layout_rows(sp_repack_layout_t layout)
{
    return layout == SP_REPACK_ROW8 ? SP_REPACK_ROWS : layout == SP_REPACK_PANEL16 ? SP_P16_ROWS : 0;
}

size_t
sp_repack_group_bytes_in(sp_repack_layout_t layout, sp_type_t type, int64_t n)
{
    return layout == SP_REPACK_ROW8      ? row8_group_bytes(type, n)
           : layout == SP_REPACK_PANEL16 ? p16_group_bytes(type, n)
                                         : 0;
}

size_t
sp_repack_bytes_in(sp_repack_layout_t layout, sp_type_t type, int64_t n, int64_t n_rows)
{
    const size_t gb = sp_repack_group_bytes_in(layout, type, n);
    const int rows = sp_repack_layout_rows(layout);
    if (gb == 0 || n_rows <= 0) {
        return 0;
    }
    return gb * (size_t)((n_rows + rows - 1) / rows);
}

void
sp_repack_pack_in(sp_repack_layout_t layout, sp_type_t type, int64_t n, const void *src,
                  size_t src_stride, int64_t n_rows, int64_t g0, int64_t g1, void *dst)
{
    if (sp_repack_group_bytes_in(layout, type, n) == 0) {
        return;
    }
    if (layout == SP_REPACK_PANEL16) {
        p16_pack(type, n, src, src_stride, n_rows, g0, g1, dst);
    } else {
        row8_pack(type, n, src, src_stride, n_rows, g0, g1, dst);
    }
}

void
sp_repack_unpack_row_in(sp_repack_layout_t layout, sp_type_t type, int64_t n, const void *packed,
                        int64_t r, void *dst)
{
    if (sp_repack_group_bytes_in(layout, type, n) == 0) {
        return;
    }
    if (layout == SP_REPACK_PANEL16) {
        p16_unpack_row(type, n, packed, r, dst);
    } else {
        row8_unpack_row(type, n, packed, r, dst);
    }
}

size_t
sp_repack_group_bytes(sp_type_t type, int64_t n)
{
    return sp_repack_group_bytes_in(SP_REPACK_ROW8, type, n);
}

size_t
sp_repack_bytes(sp_type_t type, int64_t n, int64_t n_rows)
{
    return sp_repack_bytes_in(SP_REPACK_ROW8, type, n, n_rows);
}

void
sp_repack_pack(sp_type_t type, int64_t n, const void *src, size_t src_stride, int64_t n_rows,
               int64_t g0, int64_t g1, void *dst)
{
    sp_repack_pack_in(SP_REPACK_ROW8, type, n, src, src_stride, n_rows, g0, g1, dst);
}

void
sp_repack_unpack_row(sp_type_t type, int64_t n, const void *packed, int64_t r, void *dst)
{
    sp_repack_unpack_row_in(SP_REPACK_ROW8, type, n, packed, r, dst);
}

/* Row i of a panel group against one Q8_0 activation row: ref.c's vec_dot order (Q8_0 or
 * Q4_0, whose element j sits in the low nibble for j < 16, else the high one). */
static float
p16_row_dot(sp_type_t type, int64_t n, const uint8_t *g, int i, const sp_block_q8_0 *x)
{
    float sum = 0.0f;
    for (int64_t b = 0; b < n / SP_QK8_0; b++) {
        const uint8_t *qs = g + sp__p16_qs_off_of(type, b);
        int32_t isum = 0;
        for (int j = 0; j < SP_QK8_0; j++) {
            const uint8_t c = qs[sp__p16_elem_off(type, i, j)];
            const int32_t q = type == SP_TYPE_Q8_0 ? (int32_t)c - 128
                              : j < 16            ? (int32_t)(c & 0x0f) - 8
                                                  : (int32_t)(c >> 4) - 8;
            isum += q * (int32_t)x[b].qs[j];
        }
        sp_fp16_t wd;
        memcpy(&wd, g + sp__p16_d_off_of(type, b) + 2 * i, sizeof wd);
        const float d = sp_fp16_to_fp32(wd) * sp_fp16_to_fp32(x[b].d);
        sum += (float)isum * d;
    }
    return sum;
}

static void
p16_gemm_ref(sp_type_t type, int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
             const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    for (int64_t t = 0; t < n_tok; t++) {
        const void *xt = (const uint8_t *)x + (size_t)t * x_stride;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *g = (const uint8_t *)w + (size_t)(r / SP_P16_ROWS) * w_stride;
            y[t * ldy + r] = p16_row_dot(type, n, g, (int)(r % SP_P16_ROWS), xt);
        }
    }
}

void
sp__repack_q8_0_p16_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                             const void *x, size_t x_stride, int64_t n_tok, float *y,
                             int64_t ldy)
{
    p16_gemm_ref(SP_TYPE_Q8_0, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_q4_0_p16_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                             const void *x, size_t x_stride, int64_t n_tok, float *y,
                             int64_t ldy)
{
    p16_gemm_ref(SP_TYPE_Q4_0, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

/* One row's dot product with one Q8_0 activation row, in the reference's order: Q4_0 and
 * Q8_0 as ref.c's vec_dot (one serial float sum over the blocks), IQ4_NL and MXFP4 as
 * q32_impl.h's contract (eight partial sums by block index mod 8, then the fixed tree). */
static float
packed_row_dot(sp_type_t type, int64_t n, const uint8_t *g, int r, const sp_block_q8_0 *x)
{
    const bool mx = type == SP_TYPE_MXFP4, nl = type == SP_TYPE_IQ4_NL || mx;
    const bool q8 = type == SP_TYPE_Q8_0;
    const int8_t *grid = mx ? sp__kvalues_mxfp4 : sp__kvalues_iq4nl;
    const size_t pblk = q8   ? SP_REPACK_Q8_0_BLOCK_BYTES
                        : mx ? SP_REPACK_MXFP4_BLOCK_BYTES
                             : SP_REPACK_BLOCK_BYTES;
    float sum = 0.0f, acc[SP_Q32_LANES] = {0.0f};
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *pb = g + (size_t)b * pblk;
        const uint8_t *qs = pb + SP_REPACK_ROWS * (mx ? 1 : 2);
        int32_t isum = 0;
        if (q8) {
            for (int j = 0; j < 32; j++) {
                isum += (int32_t)(int8_t)qs[sp__repack_chunk_off(r, j)] * (int32_t)x[b].qs[j];
            }
        } else {
            for (int j = 0; j < 16; j++) {
                const uint8_t q = qs[sp__repack_chunk_off(r, j)];
                const int32_t lo = nl ? grid[q & 0x0f] : (q & 0x0f) - 8;
                const int32_t hi = nl ? grid[q >> 4] : (q >> 4) - 8;
                isum += lo * (int32_t)x[b].qs[j] + hi * (int32_t)x[b].qs[j + 16];
            }
        }
        float d;
        if (mx) { /* d = x.d * e8m0_half(e) */
            d = sp_fp16_to_fp32(x[b].d) * sp__e8m0_half(pb[r]);
        } else {
            sp_fp16_t wd;
            memcpy(&wd, pb + 2 * r, sizeof wd);
            d = sp_fp16_to_fp32(wd) * sp_fp16_to_fp32(x[b].d);
        }
        if (nl) {
            const float blk = d * (float)isum;
            acc[b % SP_Q32_LANES] = acc[b % SP_Q32_LANES] + blk;
        } else {
            sum += (float)isum * d;
        }
    }
    return nl ? sp__q32_sum_lanes(acc) : sum;
}

/* Q4_K (q5 false) or Q5_K row r of a packed group against one Q8_K row: the reference
 * vec_dots' integer sums (sub-block j of 32: qs nibble j & 1, for Q5_K with qh bit j as bit 4;
 * scale sc[j], min m[j] against bsums[2j] + bsums[2j + 1]) and their common scale-and-min
 * float sequence (sp__q4k_vec_dot_ref's, ref_kquants2.c's), read through the packed layout:
 * the two forms share the header, only the values differ. */
float
sp__repack_row_dot_q45k(int64_t n, const uint8_t *g, int r, const sp_block_q8_k *y, bool q5)
{
    const size_t bb = q5 ? SP_REPACK_Q5K_BLOCK_BYTES : SP_REPACK_Q4K_BLOCK_BYTES;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        const uint8_t *pb = g + (size_t)b * bb;
        const uint8_t *qs = pb + (q5 ? SP_REPACK_Q5K_QS : SP_REPACK_Q4K_QS);
        int32_t sumi = 0, summs = 0;
        for (int j = 0; j < 8; j++) {
            const int shift = 4 * (j & 1);
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) {
                const uint8_t q = qs[sp__repack_chunk_off(r, 32 * (j / 2) + l)];
                int32_t v = (q >> shift) & 0xF;
                if (q5) {
                    v |= ((pb[SP_REPACK_Q5K_QH + sp__repack_chunk_off(r, l)] >> j) & 1) << 4;
                }
                dot += v * y[b].qs[32 * j + l];
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

/* IQ4_XS row r of a packed group against one Q8_K row: sumi = sum_j (ls_j - 32) dot_j, then
 * d = y.d * x.d; blk = d * sumi; sumf = sumf + blk (ref_kquants2.c's finish_scale). */
static float
packed_row_dot_iq4xs(int64_t n, const uint8_t *g, int r, const sp_block_q8_k *y)
{
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / SP_QK_K; b++) {
        const uint8_t *pb = g + (size_t)b * SP_REPACK_IQ4XS_BLOCK_BYTES;
        const uint8_t *qs = pb + SP_REPACK_IQ4XS_QS;
        int32_t sumi = 0;
        for (int j = 0; j < 8; j++) {
            int32_t dot = 0;
            for (int l = 0; l < 16; l++) {
                const uint8_t q = qs[sp__repack_chunk_off(r, 16 * j + l)];
                dot += sp__kvalues_iq4nl[q & 0x0f] * y[b].qs[32 * j + l] +
                       sp__kvalues_iq4nl[q >> 4] * y[b].qs[32 * j + 16 + l];
            }
            sumi += ((int32_t)pb[SP_REPACK_IQ4XS_SC + 8 * j + r] - 32) * dot;
        }
        sp_fp16_t wd;
        memcpy(&wd, pb + 2 * r, sizeof wd);
        const float d = y[b].d * sp_fp16_to_fp32(wd);
        const float blk = d * (float)sumi;
        sumf = sumf + blk;
    }
    return sumf;
}

static void
packed_gemm_ref(sp_type_t type, int64_t n, const void *w, size_t w_stride, int64_t r0,
                int64_t r1, const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    for (int64_t t = 0; t < n_tok; t++) {
        const void *xt = (const uint8_t *)x + (size_t)t * x_stride;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *g = (const uint8_t *)w + (size_t)(r / SP_REPACK_ROWS) * w_stride;
            const int rr = (int)(r % SP_REPACK_ROWS);
            y[t * ldy + r] = type == SP_TYPE_Q4_K     ? sp__repack_row_dot_q45k(n, g, rr, xt, false)
                             : type == SP_TYPE_Q5_K   ? sp__repack_row_dot_q45k(n, g, rr, xt, true)
                             : type == SP_TYPE_Q6_K   ? sp__repack_row_dot_q6k(n, g, rr, xt)
                             : type == SP_TYPE_IQ4_XS ? packed_row_dot_iq4xs(n, g, rr, xt)
                                                      : packed_row_dot(type, n, g, rr, xt);
        }
    }
}

void
sp__repack_q6_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_Q6_K, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_q5_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_Q5_K, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_q4_0_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_Q4_0, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_iq4_nl_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                           const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_IQ4_NL, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_mxfp4_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                          const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_MXFP4, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_q8_0_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_Q8_0, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_q4_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                         const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_Q4_K, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

void
sp__repack_iq4_xs_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                           const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy)
{
    packed_gemm_ref(SP_TYPE_IQ4_XS, n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
}

sp_gemm_fn
sp__repack_gemm_ref(sp_type_t type)
{
    switch (type) {
    case SP_TYPE_Q4_0: return sp__repack_q4_0_gemm_ref;
    case SP_TYPE_IQ4_NL: return sp__repack_iq4_nl_gemm_ref;
    case SP_TYPE_MXFP4: return sp__repack_mxfp4_gemm_ref;
    case SP_TYPE_Q8_0: return sp__repack_q8_0_gemm_ref;
    case SP_TYPE_Q4_K: return sp__repack_q4_k_gemm_ref;
    case SP_TYPE_IQ4_XS: return sp__repack_iq4_xs_gemm_ref;
    case SP_TYPE_Q6_K: return sp__repack_q6_k_gemm_ref;
    case SP_TYPE_Q5_K: return sp__repack_q5_k_gemm_ref;
    default: return NULL;
    }
}
