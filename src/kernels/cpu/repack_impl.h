/*
 * repack_impl.h - private to the packed-weight kernels (cpu/repack.c, avx2_repack.c) and
 * their unit test: where a quant byte of a packed group lives, and the per-level gemms over
 * the packed form. Header only, no state.
 */
#ifndef SP_KERNELS_CPU_REPACK_IMPL_H
#define SP_KERNELS_CPU_REPACK_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_impl.h"

/* Bytes of one block of a packed Q4_0 / IQ4_NL group: 8 F16 scales, then 8 x 16 quant bytes. */
#define SP_REPACK_BLOCK_BYTES (SP_REPACK_ROWS * 2 + SP_REPACK_ROWS * 16)
/* MXFP4: the 8 rows' E8M0 bytes, then 8 x 16 quant bytes as IQ4_NL's (136 bytes, the 8 x 17 of
 * the file). Only the AVX-512 VNNI level packs it (avx512_q4panel.c). */
#define SP_REPACK_MXFP4_BLOCK_BYTES (SP_REPACK_ROWS + SP_REPACK_ROWS * 16)
/* Q8_0: 8 F16 scales, then 8 x 32 quant bytes (eight 32-byte chunks). */
#define SP_REPACK_Q8_0_BLOCK_BYTES (SP_REPACK_ROWS * 2 + SP_REPACK_ROWS * 32)
/* Q4_K, per 256-element super-block: 8 F16 d, 8 F16 dmin, the 6-bit scales unpacked to
 * bytes sc[j][r] (sub-block major: one 8-byte load gives sub-block j of the 8 rows), the
 * mins m[r][j] (row major: the rows' min vectors for VPMADDWD against the token's sub-block
 * sums), then 8 x 128 quant bytes. 1184 bytes for the 8 x 144 of the file (+2.8%): the
 * 96 bits of a row's packed scales are 16 six-bit fields, so unpacking them is a bijection
 * and the repack stays exactly invertible. */
#define SP_REPACK_Q4K_D 0
#define SP_REPACK_Q4K_DMIN 16
#define SP_REPACK_Q4K_SC 32
#define SP_REPACK_Q4K_M 96
#define SP_REPACK_Q4K_QS 160
#define SP_REPACK_Q4K_BLOCK_BYTES (SP_REPACK_Q4K_QS + SP_REPACK_ROWS * 128)

/* IQ4_XS, per super-block: 8 F16 d, the 6-bit sub-block scales (unbiased, 0..63) as bytes
 * sc[j][r] (the file's scales_h / scales_l hold exactly these 48 bits), then 8 x 128 quant
 * bytes (sub-block j's 16 bytes are the row's bytes 16 j .. 16 j + 15, as IQ4_NL's blocks).
 * 1104 bytes for the file's 8 x 136 (+1.5%). */
#define SP_REPACK_IQ4XS_SC 16
#define SP_REPACK_IQ4XS_QS 80
#define SP_REPACK_IQ4XS_BLOCK_BYTES (SP_REPACK_IQ4XS_QS + SP_REPACK_ROWS * 128)

/* Q6_K, per super-block (repack_k56.c; docs/design.md): 8 F16 d, the signed 8-bit
 * sub-block scales as bytes sc[p][r][e] (byte 16 p + 2 r + e is the scale of sub-block 2 p + e
 * of row r: one 16-byte load and VPMOVSXBW give the int16 scales of sub-blocks 2p, 2p + 1 of the
 * 8 rows, the VPMADDWD operand against the token's bsums pair and, spread by one VPSHUFB, the
 * one that widens a row set's pair sums), then each row's 256 six-bit values (the file's
 * q + 32, 0..63) as 192 "6+2" bytes by the chunk rule (sp__repack_chunk_off): for value group J
 * (elements 32 J .. 32 J + 31), byte 24 J + 8 m + i (m = 0..2, i = 0..7) holds element
 * 32 J + 8 m + i in bits 0-5 and bits 2m, 2m + 1 of element 32 J + 24 + i in bits 6-7. So the
 * three 32-byte loads of a row set's value group give the first 24 elements with one AND each
 * and the last 8 from the three top bit pairs (repack.c's q6k_to_v6; avx2_kpack.c): about
 * 3 vector operations per 32 values where the file's ql / qh split takes about 4.25.
 * The file's bits only moved: 1680 bytes, the 8 x 210 of the file. */
#define SP_REPACK_Q6K_D 0
#define SP_REPACK_Q6K_SC 16
#define SP_REPACK_Q6K_Q 144
#define SP_REPACK_Q6K_BLOCK_BYTES (SP_REPACK_Q6K_Q + SP_REPACK_ROWS * 192)

/* Q5_K, per super-block: Q4_K's header (8 F16 d, 8 F16 dmin, the unpacked 6-bit scales
 * sc[j][r] and mins m[r][j]), then the 8 x 32 qh bytes and the 8 x 128 qs bytes by the chunk
 * rule (the row's qh then qs, as the file's bytes 16..175). 1440 bytes for the file's 8 x 176
 * (+2.3%, the scales unpacked as Q4_K's). */
#define SP_REPACK_Q5K_QH SP_REPACK_Q4K_QS
#define SP_REPACK_Q5K_QS (SP_REPACK_Q5K_QH + SP_REPACK_ROWS * 32)
#define SP_REPACK_Q5K_BLOCK_BYTES (SP_REPACK_Q5K_QS + SP_REPACK_ROWS * 128)

/* SP_REPACK_PANEL16 (kernels.h): rows per group, bytes per pair of blocks, and where block b's
 * quant bytes and F16 scales start within a group. Q8_0 has 32 quant bytes per row and block
 * (pairs of 1088 bytes), Q4_0 16 (pairs of 576 bytes: 9 cache lines); the _of forms take the
 * type, the plain ones are Q8_0's. */
#define SP_P16_ROWS 16
#define SP_P16_PAIR_BYTES (2 * SP_P16_ROWS * 32 + 2 * SP_P16_ROWS * 2)
#define SP_P16_Q4_PAIR_BYTES (2 * SP_P16_ROWS * 16 + 2 * SP_P16_ROWS * 2)

/* How far ahead (bytes, in the group's own stream, running on into the next group) the
 * one-token tiles of the packed gemms prefetch: with one token a tile reads each weight byte
 * once, in address order, and computes little on it, so the loads must already be in flight.
 * The hardware's streamer restarts at every 4 KiB page; on the Emerald Rapids class VM the
 * products without the prefetch ran at 45-65% of a plain read of the same bytes (process CPU
 * time, bench/decode_bench.c --layers 22), with it at 71-83% (Q4_0, Q8_0, Q4_K; AVX2 and
 * AVX-512). 2-12 KiB measured alike on a quiet host, 1 KiB a little lower. Prefetches
 * never fault, so the last group's run past the matrix end is harmless. */
#define SP_PF_ONE_TOKEN 4096

/* quant bytes per row and block: 16 for Q4_0 (two nibbles a byte), else 32 (Q8_0) */
static inline size_t
sp__p16_row_qs(sp_type_t type)
{
    return type == SP_TYPE_Q4_0 ? 16 : 32;
}

static inline size_t
sp__p16_pair_bytes_of(sp_type_t type)
{
    return 2 * SP_P16_ROWS * (sp__p16_row_qs(type) + 2);
}

static inline size_t
sp__p16_qs_off_of(sp_type_t type, int64_t b)
{
    return (size_t)(b / 2) * sp__p16_pair_bytes_of(type) +
           (size_t)(b & 1) * (SP_P16_ROWS * sp__p16_row_qs(type));
}

static inline size_t
sp__p16_d_off_of(sp_type_t type, int64_t b)
{
    return (size_t)(b / 2) * sp__p16_pair_bytes_of(type) + 2 * SP_P16_ROWS * sp__p16_row_qs(type) +
           (size_t)(b & 1) * (SP_P16_ROWS * 2);
}

static inline size_t
sp__p16_qs_off(int64_t b)
{
    return sp__p16_qs_off_of(SP_TYPE_Q8_0, b);
}

static inline size_t
sp__p16_d_off(int64_t b)
{
    return sp__p16_d_off_of(SP_TYPE_Q8_0, b);
}

/* Offset, within a block's quant bytes of the panel form, of the byte that holds element j of
 * row i: Q8_0 byte 64 (j / 4) + 4 i + j % 4 (one byte an element); Q4_0 the file's byte
 * j % 16 of the row at 64 ((j % 16) / 4) + 4 i + j % 4, its low nibble for j < 16, high
 * nibble for j >= 16 (the AND / shift of one register gives G_m and G_{m+4}). */
static inline size_t
sp__p16_elem_off(sp_type_t type, int i, int j)
{
    const int jj = type == SP_TYPE_Q4_0 ? j % 16 : j;
    return (size_t)(64 * (jj / 4) + 4 * i + jj % 4);
}

/* Offset, from the start of a packed block's quant bytes, of quant byte j of row r (0..7)
 * of the group: chunk (r >> 1 & 1) + 2 (j >> 3) (32 bytes each), 64-bit lane
 * (r & 1) | (r >> 2) << 1 within it. Rows {0,1,4,5} and {2,3,6,7} share chunks so that one
 * VPHADDD of the two chunks' sums puts rows 0..7 in lane order (avx2_repack.c). The same
 * rule for every packed type: a row's 8 consecutive quant bytes sit in one 64-bit lane. */
static inline size_t
sp__repack_chunk_off(int r, int j)
{
    const int chunk = ((r >> 1) & 1) + 2 * (j >> 3);
    const int lane = (r & 1) | ((r >> 2) << 1);
    return (size_t)(32 * chunk + 8 * lane + (j & 7));
}

/* Q4_0 / IQ4_NL: offset of quant byte j (0..15) of row r within a packed block. */
static inline size_t
sp__repack_qs_off(int r, int j)
{
    return SP_REPACK_ROWS * 2 + sp__repack_chunk_off(r, j);
}

/* The scalar gemms over the packed form: the reference's order of operations, so their
 * results equal the reference vec_dot's bits (the unit test's oracle for the SIMD ones). */
void sp__repack_q4_0_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
void sp__repack_iq4_nl_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                float *y, int64_t ldy);
void sp__repack_mxfp4_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0,
                               int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                               float *y, int64_t ldy);
void sp__repack_q8_0_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
/* Q4_K x Q8_K: kquants_impl.h's fixed float sequence per super-block. */
void sp__repack_q4_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
/* IQ4_XS x Q8_K: sp__iq4xs_vec_dot_ref's integer sums and float sequence. */
void sp__repack_iq4_xs_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                float *y, int64_t ldy);
/* Q8_0 in SP_REPACK_PANEL16 (w = group 0, w_stride = the group bytes): ref.c's serial block
 * sum read through the panel form. */
void sp__repack_q8_0_p16_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                  int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                  float *y, int64_t ldy);
/* Q4_0 in SP_REPACK_PANEL16: the same, ref.c's Q4_0 serial block sum. */
void sp__repack_q4_0_p16_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                  int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                  float *y, int64_t ldy);
/* Q6_K / Q5_K x Q8_K (repack_k56.c): kquants_impl.h's / kquants2_impl.h's integer sums and
 * float sequence read through the packed layouts above. */
void sp__repack_q6_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
void sp__repack_q5_k_gemm_ref(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
/* The scalar packed gemm of a type (NULL: no packed form): the tests' oracle. */
sp_gemm_fn sp__repack_gemm_ref(sp_type_t type);
/* Row r (0..7) of a packed group against one Q8_K row, the scalar references' per-row dots:
 * Q4_K (q5 false) or Q5_K (repack.c), Q6_K (repack_k56.c). */
float sp__repack_row_dot_q45k(int64_t n, const uint8_t *g, int r, const sp_block_q8_k *y,
                              bool q5);
float sp__repack_row_dot_q6k(int64_t n, const uint8_t *g, int r, const sp_block_q8_k *y);

/* AVX2 (avx2_repack.c): fills repack_gemm of Q4_0, IQ4_NL, Q8_0, Q4_K and IQ4_XS. */
void sp__repack_register_avx2(sp_cpu_kernels_t *k);
/* AVX2 (avx2_kpack.c): fills repack_gemm of Q6_K and Q5_K (the packed forms above). */
void sp__kpack_register_avx2(sp_cpu_kernels_t *k);
/* Its Q5_K gemm (the AVX-512 level's, and the AMX level's for few tokens). */
void sp__kpack_q5_k_gemm_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                              const void *x, size_t x_stride, int64_t n_tok, float *y,
                              int64_t ldy);
/* Its IQ4_XS gemm (the AVX-512 VNNI panels' fallback for few tokens). */
void sp__repack_iq4_xs_gemm_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                 int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                 float *y, int64_t ldy);
/* AVX2 (avx2_q8gemm.c, q8gemm_x86.h): packed Q8_0 for many tokens, the chunk's tokens against
 * each block of a group (avx2_repack.c's Q8_0 gemm hands it calls of 8 tokens and up, and the
 * few-token tiles below that: RPX_BY_TOKENS). */
void sp__repack_q8_0_gemm_wide_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                    int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                    float *y, int64_t ldy);
/* The same loop order over packed Q4_0 (avx2_q4gemm.c), for the same calls. */
void sp__repack_q4_0_gemm_wide_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                    int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                    float *y, int64_t ldy);
/* Packed Q4_K, Q5_K and Q6_K x Q8_K in the same loop order (avx2_kwide.c), for the same
 * calls. */
void sp__repack_q5_k_gemm_wide_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                    int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                    float *y, int64_t ldy);
void sp__repack_q4_k_gemm_wide_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                    int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                    float *y, int64_t ldy);
void sp__repack_q6_k_gemm_wide_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                    int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                    float *y, int64_t ldy);
/* avx2_kpack.c's packed Q6_K tiles of 1 to 4 tokens, for any token count. */
void sp__kpack_q6_k_gemm_few_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                  int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                  float *y, int64_t ldy);
/* avx2_repack.c's packed Q4_K tiles of 1 to 4 tokens, for any token count. */
void sp__repack_q4_k_gemm_few_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                   int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                   float *y, int64_t ldy);
/* avx2_repack.c's packed Q4_0 tiles of 1 to 4 tokens, for any token count. */
void sp__repack_q4_0_gemm_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                               int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                               float *y, int64_t ldy);
/* avx2_repack.c's packed Q8_0 tiles of 1 to 4 tokens, for any token count. */
void sp__repack_q8_0_gemm_few_avx2(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                   int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                   float *y, int64_t ldy);
/* AVX2 + AVX-VNNI (avxvnni_q8gemm.c): the wide gemm with VPDPBUSD (the same bits), and the
 * "avx2-vnni" table's changes to the AVX2 table (dispatch.c). */
void sp__repack_q8_0_gemm_wide_avxvnni(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                       int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                       float *y, int64_t ldy);
void sp__repack_q4_0_gemm_wide_avxvnni(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                       int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                       float *y, int64_t ldy);
/* The same for Q4_K, Q5_K and Q6_K (avxvnni_kwide.c, kwide_x86.h with VPDPBUSD). */
void sp__repack_q4_k_gemm_wide_avxvnni(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                       int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                       float *y, int64_t ldy);
void sp__repack_q5_k_gemm_wide_avxvnni(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                       int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                       float *y, int64_t ldy);
void sp__repack_q6_k_gemm_wide_avxvnni(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                       int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                       float *y, int64_t ldy);
void sp__avxvnni_register(sp_cpu_kernels_t *k);
/* AVX-512 VNNI (avx512_q4panel.c): repack_gemm of IQ4_XS, IQ4_NL and MXFP4, 16-row panels
 * (two packed groups) for prefill and decode. */
void sp__q4panel_register_avx512(sp_cpu_kernels_t *k);
/* AVX-512 VNNI (avx512_qgemm.c): repack_gemm of Q8_0 and Q4_0 in SP_REPACK_PANEL16. */
void sp__avx512_qgemm_packed_register(sp_cpu_kernels_t *k);
/* Its packed gemm of Q8_0 or Q4_0 (else NULL): the AMX kernels' path for few tokens. */
sp_gemm_fn sp__avx512_qgemm_packed(sp_type_t type);
/* AMX-INT8 (amx_qgemm.c): repack_gemm of Q8_0 and Q4_0 over the same panels, on tiles of 16
 * tokens from AMX_MIN_TOK tokens (fewer: the VNNI kernel above), a last partial tile on tiles
 * from AMX_MIN_REM tokens (fewer: VNNI). Measured: docs/design.md, "AMX-INT8 tiles for the
 * packed Q8_0 and Q4_0 panels". */
#define AMX_MIN_TOK 16
#define AMX_MIN_REM 12
void sp__amx_qgemm_register(sp_cpu_kernels_t *k);
/* Its tile kernel for any token count, no VNNI fallback (tests, benches); NULL for other types. */
sp_gemm_fn sp__amx_qgemm_tiles(sp_type_t type);
/* AVX-512 (avx512_repack.c): the VNNI packed gemm of Q4_K, only where has_vnni (else the
 * AVX2 one stays). */
void sp__repack_register_avx512(sp_cpu_kernels_t *k, bool has_vnni);
/* Its Q4_K gemm (the AMX level's kernel for few tokens). */
void sp__repack_q4_k_gemm_avx512(int64_t n, const void *w, size_t w_stride, int64_t r0,
                                 int64_t r1, const void *x, size_t x_stride, int64_t n_tok,
                                 float *y, int64_t ldy);
/* AMX-INT8 (amx_kquants.c): repack_gemm of Q4_K and Q5_K from the 8-row packed forms, calls of
 * at least SP_AMX_Q4K_MIN_TOK / SP_AMX_Q5K_MIN_TOK tokens on tiles; fewer go to the AVX-512
 * VNNI Q4_K gemm above / the AVX2 packed Q5_K one (the crossovers measured on a Xeon with AMX:
 * docs/design.md, "AMX-INT8 tiles for Q4_K and Q5_K prefill"). */
#define SP_AMX_Q4K_MIN_TOK 12
#define SP_AMX_Q5K_MIN_TOK 5
void sp__amx_kquants_register(sp_cpu_kernels_t *k);

#endif /* SP_KERNELS_CPU_REPACK_IMPL_H */
