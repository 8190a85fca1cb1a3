/*
 * avx512_simd.h - small inline pieces the AVX-512 VNNI panel kernels share (avx512_qgemm.c,
 * avx512_q4panel.c, avx512_kpanel.c, avx512_repack.c): unaligned scalar loads, a broadcast of 8
 * bytes, VPDPBUSD with the embedded broadcast operand, the 16 rows x 4 dwords transpose that
 * turns a panel's row pieces into one register per dword, and the K-quants' float step of a
 * super-block for 8 rows. Include only from files built with the AVX-512 flags (the Makefile's
 * AVX512_FLAGS).
 */
#ifndef SP_KERNELS_CPU_AVX512_SIMD_H
#define SP_KERNELS_CPU_AVX512_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define SP512_INLINE static inline __attribute__((always_inline))

SP512_INLINE int32_t
sp512_ld_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

SP512_INLINE float
sp512_ld_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the 8 bytes at p in every 64-bit lane */
SP512_INLINE __m512i
sp512_bcast8(const uint8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi64(v);
}

/* acc += w (unsigned bytes) . the 4 signed bytes at p broadcast to every lane. Written as asm
 * so the broadcast is the instruction's embedded {1to16} memory operand: compilers emit a
 * separate VPBROADCASTD, one more op per VPDPBUSD, and the prefill loops are limited by how
 * many ops the core can issue. */
SP512_INLINE __m512i
sp512_dpbusd_bcast(__m512i acc, __m512i w, const uint8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0"
            : "+v"(acc)
            : "v"(w), "m"(*(const uint8_t(*)[4])p));
    return acc;
}

/* Four 16-byte pieces (at offset off) of each of 16 rows rp[] -> v[0..3], v[g] lane i = dword
 * g of row i. Register m collects rows m, 4 + m, 8 + m, 12 + m in its 128-bit lanes, so the
 * two unpack levels leave the rows in order. */
SP512_INLINE void
sp512_transpose16x4(const uint8_t *const rp[16], size_t off, __m512i v[4])
{
    __m512i z[4];
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        __m512i a = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[m] + off)));
        a = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(rp[4 + m] + off)), 1);
        a = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(rp[8 + m] + off)), 2);
        z[m] = _mm512_inserti32x4(a, _mm_loadu_si128((const __m128i *)(rp[12 + m] + off)), 3);
    }
    const __m512i u0 = _mm512_unpacklo_epi32(z[0], z[1]), u1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i u2 = _mm512_unpacklo_epi32(z[2], z[3]), u3 = _mm512_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm512_unpacklo_epi64(u0, u2);
    v[1] = _mm512_unpackhi_epi64(u0, u2);
    v[2] = _mm512_unpacklo_epi64(u1, u3);
    v[3] = _mm512_unpackhi_epi64(u1, u3);
}

/*
 * The float step of a K-quant super-block for 8 rows (avx512_repack.c's Q4_K tile and
 * avx512_kpanel.c's panels; kquants_impl.h's sequence, lane-wise): si holds row r's exact scaled
 * sum in dword r of its low 256 bits after the caller's fold, mm the mins sum of row r in dword
 * 2r; rows_idx puts [sumi rows 0..7, summs rows 0..7] in order, xt is the Q8_K token (its d
 * first), dw [d0..d7, dmin0..dmin7] of the weights. Returns blk = y.d * x.d * sumi -
 * y.d * x.dmin * summs per row: [d, dm] = y.d * [x.d, x.dmin]; [a, c] = [d, dm] * [sumi, summs].
 */
SP512_INLINE __m256
sp512_kquant_blk(__m512i si, __m512i mm, __m512i rows_idx, const uint8_t *xt, __m512 dw)
{
    const __m512 f = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(si, rows_idx, mm));
    const __m512 ac = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sp512_ld_f32(xt)), dw), f);
    return _mm256_sub_ps(_mm512_castps512_ps256(ac), _mm512_extractf32x8_ps(ac, 1));
}

#endif /* SP_KERNELS_CPU_AVX512_SIMD_H */
