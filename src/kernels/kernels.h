/*
 * kernels.h - tensor types and the CPU kernel table.
 *
 * Types use GGML's numbering, because that is what GGUF files store. The block
 * structs below are the exact on-disk layouts of the GGUF format; they are
 * read straight out of the memory-mapped file.
 *
 * Kernels are pure math on (pointer, length): no I/O, no model, no logging.
 * The scalar reference (cpu/ref*.c) exists for every op and is the oracle for
 * the SIMD versions (cpu/avx2*.c, cpu/avx512*.c), which cpu/dispatch.c picks at
 * run time from cpuid (arm64: NEON, and getauxval for the dot-product extension).
 * SAMPAN_CPU=scalar|avx2|avx512 (arm64: scalar|neon|dotprod) forces a lower level.
 *
 * Batch invariance: every kernel that produces a dot product must give the
 * bit-identical result for a given (weight row, activation row) whatever the
 * number of rows or tokens in the call, so a request's tokens never depend on
 * what else is in the batch.
 */
#ifndef SP_KERNELS_H
#define SP_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- types ------------------------------------------------------------- */

typedef enum sp_type {
    SP_TYPE_F32 = 0,
    SP_TYPE_F16 = 1,
    SP_TYPE_Q4_0 = 2,
    SP_TYPE_Q4_1 = 3,
    SP_TYPE_Q5_0 = 6,
    SP_TYPE_Q5_1 = 7,
    SP_TYPE_Q8_0 = 8,
    SP_TYPE_Q8_1 = 9,
    SP_TYPE_Q2_K = 10,
    SP_TYPE_Q3_K = 11,
    SP_TYPE_Q4_K = 12,
    SP_TYPE_Q5_K = 13,
    SP_TYPE_Q6_K = 14,
    SP_TYPE_Q8_K = 15,
    SP_TYPE_IQ4_NL = 20,
    SP_TYPE_IQ4_XS = 23,
    SP_TYPE_I8 = 24,
    SP_TYPE_I16 = 25,
    SP_TYPE_I32 = 26,
    SP_TYPE_I64 = 27,
    SP_TYPE_F64 = 28,
    SP_TYPE_BF16 = 30,
    SP_TYPE_MXFP4 = 39,
    SP_TYPE_COUNT = 40, /* upper bound of the table, not a type */
} sp_type_t;

typedef uint16_t sp_fp16_t; /* IEEE half, bit pattern */
typedef uint16_t sp_bf16_t; /* bfloat16, bit pattern */

#define SP_QK4_0 32
#define SP_QK8_0 32
#define SP_QK_K 256
#define SP_K_SCALE_SIZE 12

/* x[j] = (q[j] - 8) * d; qs[j] low nibble holds element j, high nibble element j + 16. */
typedef struct {
    sp_fp16_t d;
    uint8_t qs[SP_QK4_0 / 2];
} sp_block_q4_0;

/* x[j] = qs[j] * d */
typedef struct {
    sp_fp16_t d;
    int8_t qs[SP_QK8_0];
} sp_block_q8_0;

/* 8 sub-blocks of 32, 6-bit scales and mins packed in `scales`:
 * x = d * sc * q - dmin * m, q in 0..15. */
typedef struct {
    sp_fp16_t d;
    sp_fp16_t dmin;
    uint8_t scales[SP_K_SCALE_SIZE];
    uint8_t qs[SP_QK_K / 2];
} sp_block_q4_k;

/* 16 sub-blocks of 16, int8 scales: x = d * sc * (q - 32), q in 0..63
 * (low 4 bits in ql, high 2 bits in qh). */
typedef struct {
    uint8_t ql[SP_QK_K / 2];
    uint8_t qh[SP_QK_K / 4];
    int8_t scales[SP_QK_K / 16];
    sp_fp16_t d;
} sp_block_q6_k;

/* 16 sub-blocks of 16: scales[k] low nibble = scale, high nibble = min;
 * x = d * sc * q - dmin * m, q in 0..3 (2 bits, four 32-element runs per 32 bytes of qs). */
typedef struct {
    uint8_t scales[SP_QK_K / 16];
    uint8_t qs[SP_QK_K / 4];
    sp_fp16_t d;
    sp_fp16_t dmin;
} sp_block_q2_k;

/* 16 sub-blocks of 16, 6-bit scales packed in `scales` (stored + 32):
 * x = d * (sc - 32) * q, q in -4..3 (low 2 bits in qs, bit 2 in hmask, set = no -4). */
typedef struct {
    uint8_t hmask[SP_QK_K / 8];
    uint8_t qs[SP_QK_K / 4];
    uint8_t scales[SP_K_SCALE_SIZE];
    sp_fp16_t d;
} sp_block_q3_k;

/* Q4_K's layout plus a fifth bit per element in qh: x = d * sc * q - dmin * m, q in 0..31. */
typedef struct {
    sp_fp16_t d;
    sp_fp16_t dmin;
    uint8_t scales[SP_K_SCALE_SIZE];
    uint8_t qh[SP_QK_K / 8];
    uint8_t qs[SP_QK_K / 2];
} sp_block_q5_k;

/* 8 sub-blocks of 32, 6-bit scales (low 4 bits in scales_l, high 2 in scales_h, stored + 32):
 * x = d * (sc - 32) * kv[q], q a 4-bit index into the non-linear table kv (sp_iq4nl_values). */
typedef struct {
    sp_fp16_t d;
    uint16_t scales_h;
    uint8_t scales_l[SP_QK_K / 64];
    uint8_t qs[SP_QK_K / 2];
} sp_block_iq4_xs;

/* Activation format for K-quant dot products: x = qs * d; bsums[i] = sum of qs[16i..16i+15]. */
typedef struct {
    float d;
    int8_t qs[SP_QK_K];
    int16_t bsums[SP_QK_K / 16];
} sp_block_q8_k;

/* The other 32-element blocks (cpu/ref_q32.c; q32_impl.h has their numerics). The 5-bit
 * types keep element j's fifth bit in bit j of qh (little-endian 32 bits), its low four bits
 * in qs like Q4_0. */
#define SP_QK32 32

/* x[j] = q[j] * d + m, q in 0..15 (nibbles as in Q4_0). */
typedef struct {
    sp_fp16_t d;
    sp_fp16_t m;
    uint8_t qs[SP_QK32 / 2];
} sp_block_q4_1;

/* x[j] = (q[j] - 16) * d, q in 0..31. */
typedef struct {
    sp_fp16_t d;
    uint8_t qh[4];
    uint8_t qs[SP_QK32 / 2];
} sp_block_q5_0;

/* x[j] = q[j] * d + m, q in 0..31. */
typedef struct {
    sp_fp16_t d;
    sp_fp16_t m;
    uint8_t qh[4];
    uint8_t qs[SP_QK32 / 2];
} sp_block_q5_1;

/* Activation format of Q4_1 / Q5_1 products: x = qs * d, s = d * sum(qs) (as half). */
typedef struct {
    sp_fp16_t d;
    sp_fp16_t s;
    int8_t qs[SP_QK32];
} sp_block_q8_1;

/* x[j] = d * kvalues_iq4nl[q[j]] (a fixed non-linear 16-entry grid, q32_impl.h). */
typedef struct {
    sp_fp16_t d;
    uint8_t qs[SP_QK32 / 2];
} sp_block_iq4_nl;

/* OCP MX FP4: x[j] = 2^(e - 127) * e2m1(q[j]); e is an E8M0 exponent. */
typedef struct {
    uint8_t e;
    uint8_t qs[SP_QK32 / 2];
} sp_block_mxfp4;

_Static_assert(sizeof(sp_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(sp_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(sp_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(sp_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(sp_block_iq4_nl) == 18, "iq4_nl layout");
_Static_assert(sizeof(sp_block_mxfp4) == 17, "mxfp4 layout");
_Static_assert(sizeof(sp_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(sp_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(sp_block_q4_k) == 144, "q4_k layout");
_Static_assert(sizeof(sp_block_q6_k) == 210, "q6_k layout");
_Static_assert(sizeof(sp_block_q8_k) == 292, "q8_k layout");
_Static_assert(sizeof(sp_block_q2_k) == 84, "q2_k layout");
_Static_assert(sizeof(sp_block_q3_k) == 110, "q3_k layout");
_Static_assert(sizeof(sp_block_q5_k) == 176, "q5_k layout");
_Static_assert(sizeof(sp_block_iq4_xs) == 136, "iq4_xs layout");

/* Convert n values; n is a multiple of the type's block size. */
typedef void (*sp_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*sp_from_float_fn)(const float *src, void *dst, int64_t n);
/* *s = dot(w[0..n), x[0..n)), w in the weight type, x in its vec_dot_type. */
typedef void (*sp_vec_dot_fn)(int64_t n, float *s, const void *w, const void *x);

/* Static facts about a type; every type the GGUF reader can name has one. */
typedef struct sp_type_traits {
    const char *name;      /* "q4_0" */
    int64_t blck_size;     /* elements per block */
    size_t type_size;      /* bytes per block */
    bool is_quantized;
    bool supported;        /* the engine can compute with it */
} sp_type_traits_t;

/* NULL for a type number the table does not know (the reader rejects those). */
const sp_type_traits_t *sp_type_traits(int type);
/* Bytes of one row of n elements; n must be a multiple of blck_size. */
size_t sp_row_size(sp_type_t type, int64_t n);
const char *sp_type_name(int type); /* "unknown" when not in the table */
/* The names of the types the engine computes with, space-separated ("f32 f16 q4_0 ...",
 * for error messages); returns the length it needed (snprintf's rule: truncated when >= len). */
size_t sp_type_supported_list(char *buf, size_t len);
/* Parse "q8_0", "F16", ... to a type; -1 when unknown. */
int sp_type_from_name(const char *name);

/* Scalar half/bfloat conversions (exact, round-to-nearest-even). */
float sp_fp16_to_fp32(sp_fp16_t h);
sp_fp16_t sp_fp32_to_fp16(float f);
float sp_bf16_to_fp32(sp_bf16_t h);
sp_bf16_t sp_fp32_to_bf16(float f);

/* ---- the CPU kernel table ---------------------------------------------- */

/* Levels are ordinal per architecture: an arm64 build has NEON at 1 and NEON
 * with the dot-product extension at 2 (the x86 files are not built there). */
typedef enum sp_cpu_level {
    SP_CPU_SCALAR = 0,
    SP_CPU_AVX2 = 1,   /* AVX2 + FMA + F16C */
    SP_CPU_AVX512 = 2, /* AVX-512 F/BW/VL (+ VNNI, BF16 where the CPU has them) */
    SP_CPU_AMX = 3,    /* AVX-512 with VNNI + AMX-INT8 tiles (Sapphire Rapids and later) */
    SP_CPU_NEON = 1,   /* arm64: Advanced SIMD */
    SP_CPU_DOTPROD = 2, /* arm64: Advanced SIMD + SDOT (armv8.2-a dotprod) */
    SP_CPU_TOP = 3,    /* the highest level number; loops over levels stop here (an arm64
                        * build has no level 3: sp_cpu_kernels_for gives NULL) */
} sp_cpu_level_t;

/* The name SAMPAN_CPU uses for a level ("scalar", "avx2", "avx512", "amx"; on arm64
 * "scalar", "neon", "dotprod"), or "?" for a number that is no level here. */
const char *sp_cpu_level_name(sp_cpu_level_t level);

/*
 * Matrix product over a range of weight rows:
 *   y[t * ldy + r] = dot(w row r, x row t)   for r in [r0, r1), t in [0, n_tok)
 * w rows are w_stride bytes apart, x rows (already in vec_dot_type) x_stride
 * bytes apart. Each result must equal vec_dot's bit for bit (batch invariance).
 * Implementations may use up to about 512 KiB of stack for packed weight panels
 * and activation scratch (no heap, no per-thread state); call them on threads
 * with ordinary (>= 1 MiB) stacks. The AVX-512 VNNI Q8_0 / Q4_0 gemms also
 * equal the scalar reference bit for bit (they keep its order of operations).
 */
typedef void (*sp_gemm_fn)(int64_t n, const void *w, size_t w_stride, int64_t r0, int64_t r1,
                           const void *x, size_t x_stride, int64_t n_tok, float *y, int64_t ldy);

/*
 * Attention of one token for the n_q query heads that share one KV head
 * (grouped-query attention), over cache positions 0..n_kv-1 (causal: n_kv is
 * the token's position + 1):
 *   o_h = sum_p softmax_p(scale * q_h . k_p) v_p
 * The cache is paged: positions 16i..16i+15 (one SP_ATTN_BLOCK) live in
 * block blocks[i], anywhere in memory (a paged KV pool, or a contiguous cache
 * with blocks = 0, 1, 2, ...). That block's keys start at
 * k + blocks[i] * k_block_stride elements, transposed (head_dim rows of
 * SP_ATTN_BLOCK lanes; element (p, d) at sp_attn_k_offset), so the scores of
 * a block are lane-wise FMAs with no horizontal sums; the lanes of the last
 * block past n_kv may hold anything (they are computed and ignored). Its
 * values start at v + blocks[i] * v_block_stride, rows of head_dim v_stride
 * elements apart. Both in the table index's type (F32, F16 or Q8_0, below). Every
 * operation reads a block through its id, in position order, so where the
 * blocks live never changes a bit.
 * Three optional changes (zero / NULL = off), for gemma, phi3 and gpt-oss:
 *   window > 0: a sliding window, the token (at position n_kv - 1) sees only
 *     positions n_kv - window .. n_kv - 1 (sp_attn_first); earlier positions
 *     are never read, so their blocks may hold anything;
 *   softcap > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap)
 *     before the softmax (logit soft-capping);
 *   sinks: one logit per query head of the call (sinks[h] for q row h) that
 *     joins the softmax's max and denominator but has no value: o_h =
 *     sum_p e^(s_p - m) v_p / (e^(sink_h - m) + sum_p e^(s_p - m)).
 * Each o_h depends only on q_h, the cache, n_kv, scale and these, with a fixed order
 * of operations: not on n_q, the other rows of the call, or the thread (batch
 * invariance). scratch: n_q * sp_attn_scratch_stride(n_kv) floats, 64-byte
 * aligned, for the scores.
 */
#define SP_ATTN_BLOCK 16

typedef struct sp_attn_args {
    int64_t head_dim;
    int64_t n_q;
    int64_t n_kv;
    const float *q;     /* n_q rows of head_dim, q_stride floats apart */
    int64_t q_stride;
    const void *k;      /* key base: block id b's keys at k + b * k_block_stride */
    const void *v;      /* value base: block id b's rows at v + b * v_block_stride */
    const int32_t *blocks;  /* ceil(n_kv / SP_ATTN_BLOCK) block ids, in position order */
    int64_t k_block_stride; /* elements per block id step, keys (>= SP_ATTN_BLOCK * head_dim) */
    int64_t v_block_stride; /* elements per block id step, values */
    int64_t v_stride;   /* elements between value rows within a block */
    float scale;
    float *o;           /* n_q rows of head_dim, o_stride floats apart */
    int64_t o_stride;
    float *scratch;
    int64_t window;     /* > 0: sliding window of this many positions; 0 = all */
    float softcap;      /* > 0: scores soft-capped at this; 0 = none */
    const float *sinks; /* n_q per-head sink logits (q row order), or NULL */
} sp_attn_args_t;

/* The first position a token sees: n_kv - window under a sliding window. */
static inline int64_t
sp_attn_first(const sp_attn_args_t *a)
{
    return a->window > 0 && a->n_kv > a->window ? a->n_kv - a->window : 0;
}

/* The soft-capped score (the scalar rule every kernel applies, in float). */
static inline float
sp_attn_softcap(float s, float cap)
{
    return cap * tanhf(s / cap);
}

static inline int64_t
sp_attn_k_index(int64_t p, int64_t d, int64_t head_dim)
{
    return (p / SP_ATTN_BLOCK) * SP_ATTN_BLOCK * head_dim + d * SP_ATTN_BLOCK + p % SP_ATTN_BLOCK;
}

/* Element offsets of key (p, d) and of value row p through the block table. */
static inline int64_t
sp_attn_k_offset(const sp_attn_args_t *a, int64_t p, int64_t d)
{
    return (int64_t)a->blocks[p / SP_ATTN_BLOCK] * a->k_block_stride + d * SP_ATTN_BLOCK +
           p % SP_ATTN_BLOCK;
}

static inline int64_t
sp_attn_v_offset(const sp_attn_args_t *a, int64_t p)
{
    return (int64_t)a->blocks[p / SP_ATTN_BLOCK] * a->v_block_stride +
           (p % SP_ATTN_BLOCK) * a->v_stride;
}

static inline int64_t
sp_attn_scratch_stride(int64_t n_kv)
{
    return (n_kv + SP_ATTN_BLOCK - 1) & ~(int64_t)(SP_ATTN_BLOCK - 1);
}

/*
 * The Q8_0 KV cache (attn[SP_TYPE_Q8_0]): GGUF's Q8_0 numbers (groups of 32
 * along head_dim, one F16 scale each, d = amax / 127, x = q * d with q an
 * int8 in [-127, 127]), laid out per block of SP_ATTN_BLOCK positions and
 * one (layer, KV head). G = ceil(head_dim / 32) groups; the last one is
 * head_dim % 32 long when head_dim is not a multiple of 32. For this type
 * the args' element offsets and strides (k_block_stride, v_block_stride,
 * v_stride, sp_attn_k_offset, sp_attn_v_offset) count bytes.
 *   Key tile: q as int8 [head_dim][SP_ATTN_BLOCK lanes] (transposed like F32
 *     and F16 keys: sp_attn_k_offset is q's byte), then the scales as F16
 *     [G][SP_ATTN_BLOCK lanes]: key (lane j, d) = q[d][j] * s[d / 32][j].
 *     So each position is quantised on its own (a later position never
 *     rescales an earlier one), and the kernels widen one row of 16 int8
 *     lanes and multiply it by the group's 16 scales: the same lane-wise FMAs
 *     as F32 keys.
 *   Value rows (v_stride bytes apart): G blocks {F16 d, int8 q[n_g]}; with
 *     head_dim % 32 == 0 exactly a row of GGUF sp_block_q8_0.
 * Both tiles are sp_kv_q8_tile_bytes(head_dim) = 16 (head_dim + 2 G) bytes:
 * 1.0625 bytes per element against F16's 2 for head_dim 64 or 128. A
 * dequantised element (int8 x F16 scale) is exact in float, so the kernels
 * are F32 attention over exactly these values and the reference (which
 * reads them through sp_kv_q8_key / sp_kv_q8_value) stays the oracle.
 */
static inline int64_t
sp_kv_q8_groups(int64_t head_dim)
{
    return (head_dim + SP_QK8_0 - 1) / SP_QK8_0;
}

static inline int64_t
sp_kv_q8_row_bytes(int64_t head_dim)
{
    return head_dim + 2 * sp_kv_q8_groups(head_dim);
}

/* Bytes of one key tile, and of one value tile of SP_ATTN_BLOCK rows. */
static inline int64_t
sp_kv_q8_tile_bytes(int64_t head_dim)
{
    return SP_ATTN_BLOCK * sp_kv_q8_row_bytes(head_dim);
}

/* Quantise one position's key k[0..head_dim) into lane `lane` of a key tile,
 * and one value into a value row (the reference's Q8_0 rounding: NaN and
 * huge values clamp, never undefined behaviour). */
void sp_kv_q8_store_key(void *tile, int64_t lane, const float *k, int64_t head_dim);
void sp_kv_q8_store_value(void *row, const float *v, int64_t head_dim);
/* The dequantised key (lane, d) of a key tile, and element d of a value row. */
float sp_kv_q8_key(const void *tile, int64_t lane, int64_t d, int64_t head_dim);
float sp_kv_q8_value(const void *row, int64_t d);

typedef void (*sp_attn_fn)(const sp_attn_args_t *a);
/* y[i] = e^x[i]; exp(-inf) = 0, NaN stays NaN; y may equal x. */
typedef void (*sp_exp_fn)(float *y, const float *x, int64_t n);
/* out = x / rms(x) * w, rms = sqrt(mean(x^2) + eps); out may equal x. */
typedef void (*sp_rmsnorm_fn)(float *out, const float *x, const float *w, int64_t n, float eps);
/* g[i] = silu(g[i]) * u[i], silu(g) = g / (1 + e^-g). */
typedef void (*sp_swiglu_fn)(float *g, const float *u, int64_t n);

/*
 * Load-time repacked weights (cpu/repack.c, docs/design.md). A packed matrix keeps
 * the GGUF numbers of its type but interleaves SP_REPACK_ROWS rows per group, so one load
 * feeds that many output rows: group g, block b starts at
 *   g * sp_repack_group_bytes(type, n) + b * SP_REPACK_ROWS * type_size
 * and holds the 8 rows' scales (F16, row order) then their 8 x 16 quant bytes in four
 * 32-byte chunks: chunk c holds bytes 8 * (c / 2) .. + 7 of rows {0,1,4,5} (c even) or
 * {2,3,6,7} (c odd), 8 bytes per row in that order. The row count is padded up to a
 * whole group with zero rows (scale 0). Q4_0 and IQ4_NL have this packed form, MXFP4 too
 * with its 8 E8M0 bytes (one a row) in place of the F16 scales; Q8_0
 * (eight chunks per block), Q4_K, IQ4_XS and Q5_K (per 256-element super-block, their 6-bit
 * sub-block scales stored unpacked as bytes) and Q6_K (its 8-bit scales regrouped by sub-block
 * pair, its six-bit values moved to "6+2" bytes) follow the same chunk rule, laid out in
 * cpu/repack_impl.h. Every packed form unpacks to the file's bytes exactly. The
 * table's repack_gemm[type] computes from the packed base (w = group 0, w_stride =
 * the group bytes) the scalar reference's bits: IQ4_NL's, MXFP4's, Q4_K's, IQ4_XS's, Q6_K's and
 * Q5_K's are every level's, Q4_0's and Q8_0's are the reference's serial block sum (as the AVX-512 VNNI
 * gemm), which the AVX2 row kernels' per-lane FMA order is not (last-bit differences).
 */
#define SP_REPACK_ROWS 8
#define SP_REPACK_MAX_N 65536 /* longest row a packed form takes (the kernels' scratch) */

/*
 * Which packed form a kernel table reads (its repack_layout[type]); a load packs each type
 * in the form of the table it runs with (sp_cpu_kernels(), fixed for the process).
 *   SP_REPACK_ROW8     the 8-row form above (every type above; the AVX2 kernels').
 *   SP_REPACK_PANEL16  Q8_0 and Q4_0, the AVX-512 VNNI panels' form: groups of 16 rows;
 *     per pair of blocks (2p, 2p + 1): block 2p's quant bytes, block 2p + 1's, then the two
 *     blocks' 16 F16 scales each (row order).
 *     Q8_0: 1088 bytes a pair (17 cache lines), 8 x 64 quant bytes a block; byte
 *     64 g + 4 i + e is element 4 g + e of row i, stored as q ^ 0x80 (= q + 128, the
 *     unsigned operand of VPDPBUSD: the sign handling done once).
 *     Q4_0: 576 bytes a pair (9 cache lines), 4 x 64 quant bytes a block; byte
 *     64 m + 4 i + e is the file's quant byte 4 m + e of row i, unchanged: its low nibble
 *     is element 4 m + e (+ 8, already unsigned), its high nibble element 16 + 4 m + e, so
 *     one AND 0x0f of register m gives the panel operand G_m and a shift by 4 and an AND
 *     give G_{m+4}.
 *     An odd last block is padded to a pair with a zero block (Q8_0 quants 0x80, Q4_0 0x00,
 *     scales 0) and the rows to 16 with zero rows. The same bytes as the file (34 / 18 per
 *     row and block) when the block count is even and the rows a multiple of 16.
 *     cpu/repack.c packs and unpacks it; avx512_qgemm.c computes from it.
 */
typedef enum {
    SP_REPACK_ROW8 = 0,
    SP_REPACK_PANEL16 = 1,
} sp_repack_layout_t;

/* Bytes of one packed group of rows of n elements, and of a whole packed matrix of
 * n_rows rows; 0 when the type has no packed form or n is out of range. */
size_t sp_repack_group_bytes(sp_type_t type, int64_t n);
size_t sp_repack_bytes(sp_type_t type, int64_t n, int64_t n_rows);
/* Pack groups [g0, g1) of the n_rows rows at src (rows src_stride bytes apart) into the
 * packed matrix dst (whole groups; rows past n_rows become zero rows). Groups are
 * independent, so threads may pack disjoint ranges. */
void sp_repack_pack(sp_type_t type, int64_t n, const void *src, size_t src_stride,
                    int64_t n_rows, int64_t g0, int64_t g1, void *dst);
/* Row r of a packed matrix back in the GGUF layout (sp_row_size bytes at dst). */
void sp_repack_unpack_row(sp_type_t type, int64_t n, const void *packed, int64_t r, void *dst);
/* The same for any layout (the functions above are the SP_REPACK_ROW8 ones); a layout
 * groups sp_repack_layout_rows(layout) rows (0 for an unknown layout). */
int sp_repack_layout_rows(sp_repack_layout_t layout);
size_t sp_repack_group_bytes_in(sp_repack_layout_t layout, sp_type_t type, int64_t n);
size_t sp_repack_bytes_in(sp_repack_layout_t layout, sp_type_t type, int64_t n, int64_t n_rows);
void sp_repack_pack_in(sp_repack_layout_t layout, sp_type_t type, int64_t n, const void *src,
                       size_t src_stride, int64_t n_rows, int64_t g0, int64_t g1, void *dst);
void sp_repack_unpack_row_in(sp_repack_layout_t layout, sp_type_t type, int64_t n,
                             const void *packed, int64_t r, void *dst);

typedef struct sp_cpu_kernels {
    const char *name;         /* "scalar", "avx2", "avx512", "avx512-vnni" ... */
    sp_cpu_level_t level;
    /* Per weight type: the format activations are converted to, the converter
     * for that format, and the dot product. NULL vec_dot = not supported. */
    sp_type_t vec_dot_type[SP_TYPE_COUNT];
    sp_from_float_fn from_float[SP_TYPE_COUNT]; /* indexed by the activation type */
    sp_vec_dot_fn vec_dot[SP_TYPE_COUNT];       /* indexed by the weight type */
    sp_to_float_fn to_float[SP_TYPE_COUNT];     /* dequantize, indexed by type */
    /* (optional) tiled product, indexed by weight type; NULL = loop vec_dot. */
    sp_gemm_fn gemm[SP_TYPE_COUNT];
    /* (optional) gemm over the packed form above, indexed by weight type; NULL = this
     * level does not use packed weights for the type (keep the rows as they are). */
    sp_gemm_fn repack_gemm[SP_TYPE_COUNT];
    /* the packed form repack_gemm reads (zero: SP_REPACK_ROW8) */
    sp_repack_layout_t repack_layout[SP_TYPE_COUNT];
    /* Attention, indexed by the KV cache type (F32, F16, Q8_0); element-wise ops. */
    sp_attn_fn attn[SP_TYPE_COUNT];
    sp_exp_fn exp_f32;
    sp_rmsnorm_fn rmsnorm;
    sp_swiglu_fn swiglu;
} sp_cpu_kernels_t;

/* The best table for this CPU, honouring SAMPAN_CPU; computed once, never NULL. */
const sp_cpu_kernels_t *sp_cpu_kernels(void);
/* The table for one level, or NULL when this CPU lacks it (tests walk all). */
const sp_cpu_kernels_t *sp_cpu_kernels_for(sp_cpu_level_t level);
/* The AVX2 level's table with AVX-VNNI products ("avx2-vnni": VPDPBUSD on 256-bit registers,
 * the same bits as the AVX2 table), or NULL where the CPU has no AVX-VNNI (and on arm64). The
 * default table on CPUs with AVX-VNNI and no AVX-512; SAMPAN_CPU=avx2-vnni picks it on any
 * CPU that has it, SAMPAN_CPU=avx2 the plain AVX2 table. Its `level` is SP_CPU_AVX2. */
const sp_cpu_kernels_t *sp_cpu_kernels_avx2_vnni(void);

/* The reference (scalar) table. */
const sp_cpu_kernels_t *sp_cpu_kernels_ref(void);

/* Run the table's gemm, or vec_dot row by row when it has none. Use it for
 * decode too (n_tok = 1): the SIMD gemms stream several weight rows at once
 * and beat a vec_dot loop, with the same bits. */
void sp_cpu_gemm(const sp_cpu_kernels_t *k, sp_type_t wtype, int64_t n, const void *w,
                 size_t w_stride, int64_t r0, int64_t r1, const void *x, size_t x_stride,
                 int64_t n_tok, float *y, int64_t ldy);

/* ---- reference quantizers (also used by `sampan quantize`) --------------- */

/* Quantize n floats to `type` (F16, BF16, Q8_0, Q4_0, Q8_K, Q2_K..Q6_K, IQ4_XS, and ggml's
 * reference rules for Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4; Q8_1 is the activation rule of
 * cpu/ref_q32.c);
 * returns false when the type has no quantizer. Q8_0 here is the weight rule
 * (q = round(x / d) with the stored half d); the activations of Q8_0 / Q4_0
 * products go through from_float[SP_TYPE_Q8_0] instead (llama.cpp's rule,
 * cpu/ref.c), which can differ by one in a quant. */
bool sp_quantize_row(sp_type_t type, const float *src, void *dst, int64_t n);
/* Dequantize with the reference code; false when unsupported. */
bool sp_dequantize_row(sp_type_t type, const void *src, float *dst, int64_t n);

#endif /* SP_KERNELS_H */
