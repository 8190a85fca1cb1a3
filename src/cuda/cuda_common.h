/*
 * cuda_common.h - per-element math shared by the CUDA kernels (nvcc) and the
 * host code that must agree with them (gcc): index math of the paged KV
 * cache, half/bfloat conversions, dequantisation of one element, RoPE pairs.
 *
 * Why shared: no GPU is there in CI, so what can be checked on the CPU is
 * checked on the CPU. Every function here is SP_HD (__host__ __device__ under
 * nvcc, plain static inline under a C compiler); tests/gpu/host_test.c runs
 * them against the engine's own layouts and reference kernels, and the host
 * emulation of the ABI (tests/gpu/fake_cuda.c) is built from them. A kernel
 * that indexes through these functions has its index math tested even where
 * it never ran.
 *
 * This header may not include kernels/kernels.h (its _Static_asserts are C11,
 * not C++): the type numbers and block layouts are repeated here and
 * host_test.c checks them against kernels.h.
 */
#ifndef SP_CUDA_COMMON_H
#define SP_CUDA_COMMON_H

#include <stdint.h>

#if defined(__CUDACC__)
#define SP_HD __host__ __device__ __forceinline__
#else
#define SP_HD static inline
#endif

#define SP_CU_KV_BLOCK 16 /* positions per KV block: engine/batch.h SP_KV_BLOCK */
#define SP_CU_MAX_HEAD_DIM 256
#define SP_CU_MAX_TOPK 64

/* GGML type numbers (kernels.h sp_type_t) of the types to_f16 reads. */
enum {
    SP_CU_F32 = 0,
    SP_CU_F16 = 1,
    SP_CU_Q4_0 = 2,
    SP_CU_Q8_0 = 8,
    SP_CU_BF16 = 30,
};

#define SP_CU_QK 32 /* elements per Q8_0 / Q4_0 block */

typedef struct sp_cu_block_q8_0 {
    uint16_t d; /* F16 scale */
    int8_t qs[SP_CU_QK];
} sp_cu_block_q8_0;

typedef struct sp_cu_block_q4_0 {
    uint16_t d;
    uint8_t qs[SP_CU_QK / 2];
} sp_cu_block_q4_0;

/* ---- half and bfloat, on bit patterns (exact, round to nearest even) ---- */

SP_HD float
sp_cu_bits_to_f32(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.u = u;
    return v.f;
}

SP_HD uint32_t
sp_cu_f32_to_bits(float f)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.f = f;
    return v.u;
}

SP_HD float
sp_cu_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) { /* inf, NaN */
        return sp_cu_bits_to_f32(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0) {
        if (man == 0) {
            return sp_cu_bits_to_f32(sign);
        }
        /* subnormal: man * 2^-24, exact in float */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return sp_cu_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

SP_HD uint16_t
sp_cu_f32_to_f16(float f)
{
    const uint32_t x = sp_cu_f32_to_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) { /* NaN: keep it quiet and a NaN */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) { /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal or 0 */
        if (ax < 0x33000000u) { /* below 2^-25: rounds to 0 */
            return (uint16_t)sign;
        }
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) {
            r++;
        }
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
        r++; /* may carry into the exponent: still right */
    }
    return (uint16_t)(sign | r);
}

SP_HD float
sp_cu_bf16_to_f32(uint16_t h)
{
    return sp_cu_bits_to_f32((uint32_t)h << 16);
}

/* ---- dequantisation of element j (0..31) of a block ---- */

SP_HD float
sp_cu_q8_0_elem(const sp_cu_block_q8_0 *b, int j)
{
    return sp_cu_f16_to_f32(b->d) * (float)b->qs[j];
}

SP_HD float
sp_cu_q4_0_elem(const sp_cu_block_q4_0 *b, int j)
{
    const int q = j < SP_CU_QK / 2 ? (b->qs[j] & 0x0f) : (b->qs[j - SP_CU_QK / 2] >> 4);
    return sp_cu_f16_to_f32(b->d) * (float)(q - 8);
}

/* ---- quantised weights in the split layout (cuda_api.h qsplit_to_f16, gemv_q) ---- */

#define SP_CU_QSPLIT_ALIGN 256 /* the scales start this aligned (cudaMalloc's alignment) */

/* Bytes of the quants of n elements (n a multiple of SP_CU_QK). */
SP_HD int64_t
sp_cu_qsplit_qs_bytes(int type, int64_t n)
{
    return type == SP_CU_Q4_0 ? n / 2 : n;
}

/* Offset of the F16 scales. */
SP_HD int64_t
sp_cu_qsplit_scales_off(int type, int64_t n)
{
    const int64_t q = sp_cu_qsplit_qs_bytes(type, n);
    return (q + SP_CU_QSPLIT_ALIGN - 1) / SP_CU_QSPLIT_ALIGN * SP_CU_QSPLIT_ALIGN;
}

/* Bytes of the whole buffer. */
SP_HD int64_t
sp_cu_qsplit_bytes(int type, int64_t n)
{
    return sp_cu_qsplit_scales_off(type, n) + n / SP_CU_QK * 2;
}

/* The quant of element i of a split-layout buffer (-128..127, or -8..7 for
 * Q4_0). Within a Q4_0 block, byte j holds elements j (low nibble) and
 * j + 16 (high), as in the GGUF block. */
SP_HD int
sp_cu_qsplit_q(int type, const void *buf, int64_t i)
{
    const uint8_t *b = (const uint8_t *)buf;
    if (type == SP_CU_Q4_0) {
        const int64_t j = i % SP_CU_QK;
        const uint8_t byte = b[i / SP_CU_QK * (SP_CU_QK / 2) + j % (SP_CU_QK / 2)];
        return (j < SP_CU_QK / 2 ? (byte & 0x0f) : (byte >> 4)) - 8;
    }
    return ((const int8_t *)b)[i];
}

/* The scale of element i of a split-layout buffer of n elements. */
SP_HD float
sp_cu_qsplit_scale(int type, const void *buf, int64_t n, int64_t i)
{
    const uint16_t *d = (const uint16_t *)((const uint8_t *)buf + sp_cu_qsplit_scales_off(type, n));
    return sp_cu_f16_to_f32(d[i / SP_CU_QK]);
}

/* Element i of a split-layout buffer of n elements. */
SP_HD float
sp_cu_qsplit_elem(int type, const void *buf, int64_t n, int64_t i)
{
    return sp_cu_qsplit_scale(type, buf, n, i) * (float)sp_cu_qsplit_q(type, buf, i);
}

/* ---- paged KV cache ---- */

/* Element offset of the key tile of (block, layer il, KV head g). */
SP_HD int64_t
sp_cu_kv_tile(int64_t block, int64_t il, int64_t g, int64_t n_head_kv, int64_t tile_elems,
              int64_t block_elems)
{
    return block * block_elems + (il * n_head_kv + g) * 2 * tile_elems;
}

/* Offset of key (lane, d) within a key tile: transposed, SP_CU_KV_BLOCK lanes per row. */
SP_HD int64_t
sp_cu_key_in_tile(int64_t lane, int64_t d)
{
    return d * SP_CU_KV_BLOCK + lane;
}

/* Offset of value (lane, d) from the key tile's start: the value tile follows it. */
SP_HD int64_t
sp_cu_val_in_tile(int64_t lane, int64_t d, int64_t head_dim, int64_t tile_elems)
{
    return tile_elems + lane * head_dim + d;
}

/* ---- RoPE ---- */

/* The pair (a, b) that rotation i (0 <= i < n_rot / 2) of a head turns. */
SP_HD void
sp_cu_rope_pair(int64_t i, int64_t n_rot, int neox, int64_t *a, int64_t *b)
{
    *a = neox ? i : 2 * i;
    *b = neox ? i + n_rot / 2 : 2 * i + 1;
}

SP_HD float
sp_cu_silu_mul(float g, float u, float e_neg_g)
{
    /* e_neg_g = e^-g, passed in so the device can use its fast exp. */
    return g / (1.0f + e_neg_g) * u;
}

/* gelu(g) * u in the CPU's tanh form (engine/batch.c geglu), with t =
 * tanh(sp_cu_gelu_arg(g)) passed in so each side uses its own tanhf. */
SP_HD float
sp_cu_gelu_arg(float g)
{
    return 0.7978845608028654f * (g + 0.044715f * g * g * g); /* sqrt(2 / pi) (...) */
}

SP_HD float
sp_cu_gelu_mul(float g, float u, float t)
{
    return 0.5f * g * (1.0f + t) * u;
}

/* The first position a row at pos sees through a sliding window (0: none):
 * kernels.h sp_attn_first with n_kv = pos + 1. */
SP_HD int64_t
sp_cu_attn_first(int64_t pos, int64_t window)
{
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

#endif /* SP_CUDA_COMMON_H */
