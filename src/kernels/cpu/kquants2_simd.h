/*
 * kquants2_simd.h - AVX2 unpacking of whole Q2_K / Q3_K / Q5_K / IQ4_XS super-blocks for
 * avx512_kquants2.c (compiled with its target flags, which include AVX2 + F16C; the AVX2 kernels
 * of avx2_kquants2.c unpack a chunk at a time in their own order instead). Pure register code,
 * no state.
 *
 * Every unpack gives the super-block as the dot product of kquants2_impl.h sees it:
 *   q[k]  (k = 0..7): the 32 quants of elements 32k..32k+31, one per byte (signed for IQ4_XS,
 *         Q3_K's offset by +4 to 0..7);
 *   sc16: 16 int16 scales, word g for elements 16g..16g+15;
 *   mn16: 16 int16 mins (zero for the scale-only types).
 */
#ifndef SP_KERNELS_CPU_KQUANTS2_SIMD_H
#define SP_KERNELS_CPU_KQUANTS2_SIMD_H

#include <immintrin.h>

#include "kernels/cpu/kquants2_impl.h"
#include "kernels/cpu/kquants_impl.h"

#define KQ2_INLINE static inline __attribute__((always_inline))

/* 8 uint8 per-32 values -> 16 int16 per-16 values (each twice), minus `bias`. */
KQ2_INLINE __m256i
kq2_widen_pairs(uint64_t v8, int bias)
{
    const __m128i w = _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)v8)),
                                    _mm_set1_epi16((short)bias));
    return _mm256_set_m128i(_mm_unpackhi_epi16(w, w), _mm_unpacklo_epi16(w, w));
}

/* The 2-bit planes of Q2_K / Q3_K: element 128h + 32j + l at byte 32h + l, bits 2j. */
KQ2_INLINE void
kq2_unpack_2bit(const uint8_t *qs, __m256i q[8])
{
    const __m256i m3 = _mm256_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        q[4 * h + 0] = _mm256_and_si256(v, m3);
        q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
        q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
        q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
    }
}

KQ2_INLINE void
kq2_unpack_q2k(const sp_block_q2_k *x, __m256i q[8], __m256i *sc16, __m256i *mn16)
{
    kq2_unpack_2bit(x->qs, q);
    const __m128i s = _mm_loadu_si128((const __m128i *)x->scales);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    *sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, m4));
    *mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
}

/* Q3_K's quants come back offset by +4 (0..7, unsigned: bit 2 is the hmask bit), so the dot
 * products need no sign handling; the tile subtracts 4 * sum_g sc[g] * bsums[g] (exact). */
KQ2_INLINE void
kq2_unpack_q3k(const sp_block_q3_k *x, __m256i q[8], __m256i *sc16, __m256i *mn16)
{
    kq2_unpack_2bit(x->qs, q);
    /* element 32k + l: bit k of hmask[l] moved to bit 2 */
    const __m256i hm = _mm256_loadu_si256((const __m256i *)x->hmask);
    const __m256i four = _mm256_set1_epi8(4);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i h = k <= 2 ? _mm256_slli_epi16(hm, 2 - k) : _mm256_srli_epi16(hm, k - 2);
        q[k] = _mm256_or_si256(q[k], _mm256_and_si256(h, four));
    }
    /* the scales of sp__q3k_unpack_scales built in registers: through a byte array on the
     * stack the vector load waited on four narrower stores (a failed store forward) */
    uint32_t a[3];
    memcpy(a, x->scales, sizeof(a));
    const __m128i sc = _mm_setr_epi32(
        (int)((a[0] & 0x0f0f0f0fu) | ((a[2] & 0x03030303u) << 4)),
        (int)((a[1] & 0x0f0f0f0fu) | (((a[2] >> 2) & 0x03030303u) << 4)),
        (int)(((a[0] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 4) & 0x03030303u) << 4)),
        (int)(((a[1] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 6) & 0x03030303u) << 4)));
    *sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(sc), _mm256_set1_epi16(32));
    *mn16 = _mm256_setzero_si256();
}

KQ2_INLINE void
kq2_unpack_q5k(const sp_block_q5_k *x, __m256i q[8], __m256i *sc16, __m256i *mn16)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++) {
        /* 64 elements: low nibbles are sub-block 2h, high nibbles 2h+1; bit 4 from qh bit j */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        const int j0 = 2 * h, j1 = 2 * h + 1;
        const __m256i h0 = j0 <= 4 ? _mm256_slli_epi16(qh, 4 - j0) : _mm256_srli_epi16(qh, j0 - 4);
        const __m256i h1 = j1 <= 4 ? _mm256_slli_epi16(qh, 4 - j1) : _mm256_srli_epi16(qh, j1 - 4);
        q[j0] = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(h0, b4));
        q[j1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                _mm256_and_si256(h1, b4));
    }
    uint64_t sc, m;
    sp__q4k_unpack_scales_u64(x->scales, &sc, &m);
    *sc16 = kq2_widen_pairs(sc, 0);
    *mn16 = kq2_widen_pairs(m, 0);
}

KQ2_INLINE void
kq2_unpack_iq4xs(const sp_block_iq4_xs *x, __m256i q[8], __m256i *sc16, __m256i *mn16)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)sp_iq4nl_values));
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++) {
        /* sub-blocks 2h (bytes 0-15) and 2h+1 (bytes 16-31); per sub-block the low nibbles are
         * elements 0-15, the high nibbles 16-31 */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        const __m256i lo = _mm256_and_si256(v, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        q[2 * h] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20));
        q[2 * h + 1] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    /* scale ib: nibble ib % 2 of scales_l[ib / 2] | bits 2ib..2ib+1 of scales_h << 4, minus 32;
     * one int32 lane per sub-block, then (s & 0xFFFF) | s << 16 makes the lane the two int16
     * words of its two 16-element groups */
    uint32_t l4;
    memcpy(&l4, x->scales_l, sizeof(l4));
    const __m128i nib = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(l4 & 0x0f0f0f0fu)),
                                          _mm_cvtsi32_si128((int)((l4 >> 4) & 0x0f0f0f0fu)));
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x->scales_h), shifts),
                                        _mm256_set1_epi32(3));
    const __m256i s32 = _mm256_sub_epi32(
        _mm256_or_si256(_mm256_cvtepu8_epi32(nib), _mm256_slli_epi32(hb, 4)),
        _mm256_set1_epi32(32));
    *sc16 = _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF)),
                            _mm256_slli_epi32(s32, 16));
    *mn16 = _mm256_setzero_si256();
}

#endif /* SP_KERNELS_CPU_KQUANTS2_SIMD_H */
