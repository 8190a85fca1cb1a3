/*
 * backends/onnx/cuda/half.h - IEEE binary16 conversion on the host: the
 * executor converts FP32 constants to FP16 once at load, and the host
 * emulation stores FP16 tensors as the device would.
 *
 * Round to nearest, ties to even; overflow to infinity; NaN stays NaN.
 */
#ifndef SP_ONNX_CUDA_HALF_H
#define SP_ONNX_CUDA_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint16_t
oxh_from_f32(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
    if (ax < 0x38800000u) {                                  /* subnormal or zero in half */
        if (ax < 0x33000000u) return (uint16_t)sign;         /* below half the smallest subnormal */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(ax >> 23);                   /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax - 0x38000000u) >> 13), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline float
oxh_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0) {
        float f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
        return sign ? -f : f;
    }
    if (e == 31) x = sign | 0x7f800000u | (m << 13);
    else x = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

#endif /* SP_ONNX_CUDA_HALF_H */
