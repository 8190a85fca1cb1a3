/*
 * types.c - the table of tensor types GGUF files can name, and the exact
 * scalar half/bfloat conversions every kernel level shares.
 *
 * Types the engine cannot compute with still have sizes here, so that the
 * reader can validate any file and `sampan inspect` can describe it.
 */
#include "kernels/kernels.h"

#include <string.h>
#include <strings.h>

#define T(id, nm, blck, size, quant, sup) [id] = {nm, blck, size, quant, sup}

static const sp_type_traits_t traits[SP_TYPE_COUNT] = {
    T(SP_TYPE_F32, "f32", 1, 4, false, true),
    T(SP_TYPE_F16, "f16", 1, 2, false, true),
    T(SP_TYPE_Q4_0, "q4_0", 32, 18, true, true),
    T(SP_TYPE_Q4_1, "q4_1", 32, 20, true, false),
    T(SP_TYPE_Q5_0, "q5_0", 32, 22, true, false),
    T(SP_TYPE_Q5_1, "q5_1", 32, 24, true, false),
    T(SP_TYPE_Q8_0, "q8_0", 32, 34, true, true),
    T(SP_TYPE_Q8_1, "q8_1", 32, 36, true, false),
    T(SP_TYPE_Q2_K, "q2_k", 256, 84, true, true),
    T(SP_TYPE_Q3_K, "q3_k", 256, 110, true, true),
    T(SP_TYPE_Q4_K, "q4_k", 256, 144, true, true),
    T(SP_TYPE_Q5_K, "q5_k", 256, 176, true, true),
    T(SP_TYPE_Q6_K, "q6_k", 256, 210, true, true),
    T(SP_TYPE_Q8_K, "q8_k", 256, 292, true, false),
    T(SP_TYPE_IQ4_NL, "iq4_nl", 32, 18, true, false),
    T(SP_TYPE_IQ4_XS, "iq4_xs", 256, 136, true, true),
    T(SP_TYPE_I8, "i8", 1, 1, false, false),
    T(SP_TYPE_I16, "i16", 1, 2, false, false),
    T(SP_TYPE_I32, "i32", 1, 4, false, false),
    T(SP_TYPE_I64, "i64", 1, 8, false, false),
    T(SP_TYPE_F64, "f64", 1, 8, false, false),
    T(SP_TYPE_BF16, "bf16", 1, 2, false, true),
};

const sp_type_traits_t *
sp_type_traits(int type)
{
    if (type < 0 || type >= SP_TYPE_COUNT || traits[type].name == NULL) {
        return NULL;
    }
    return &traits[type];
}

const char *
sp_type_name(int type)
{
    const sp_type_traits_t *t = sp_type_traits(type);
    return t ? t->name : "unknown";
}

int
sp_type_from_name(const char *name)
{
    for (int i = 0; i < SP_TYPE_COUNT; i++) {
        if (traits[i].name != NULL && strcasecmp(traits[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

size_t
sp_row_size(sp_type_t type, int64_t n)
{
    const sp_type_traits_t *t = &traits[type];
    return (size_t)(n / t->blck_size) * t->type_size;
}

/* ---- half and bfloat, bit-exact in C ------------------------------------ */

static inline float
bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t
f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float
sp_fp16_to_fp32(sp_fp16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) { /* inf / nan */
        return bits_to_f32(sign | 0x7f800000u | (mant << 13));
    }
    if (exp == 0) {
        if (mant == 0) {
            return bits_to_f32(sign);
        }
        /* subnormal: value = mant * 2^-24 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

sp_fp16_t
sp_fp32_to_fp16(float f)
{
    uint32_t x = f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf or nan */
        return (sp_fp16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    }
    if (ax >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (sp_fp16_t)(sign | 0x7c00);
    }
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a = bits_to_f32(ax);
        /* adding 0.5 moves the value into a float whose low bits hold the
         * half's subnormal mantissa, rounded to nearest even by the FPU */
        float r = a + 0.5f;
        return (sp_fp16_t)(sign | (f32_to_bits(r) - 0x3f000000u));
    }
    uint32_t mant_odd = (ax >> 13) & 1;
    ax += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round to nearest even */
    return (sp_fp16_t)(sign | (ax >> 13));
}

float
sp_bf16_to_fp32(sp_bf16_t h)
{
    return bits_to_f32((uint32_t)h << 16);
}

sp_bf16_t
sp_fp32_to_bf16(float f)
{
    uint32_t x = f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) { /* nan: keep it a quiet nan */
        return (sp_bf16_t)((x >> 16) | 0x40);
    }
    x += 0x7fffu + ((x >> 16) & 1);
    return (sp_bf16_t)(x >> 16);
}
