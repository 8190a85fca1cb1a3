/*
 * avx512_panels.c - the panel gemms' Q8_0 activation records (avx512_panels.h). Built with
 * the AVX-512 flags; called only from the VNNI panel files.
 */
#include "kernels/cpu/avx512_panels.h"

#include <immintrin.h>
#include <string.h>

#include "kernels/kernels.h"

void
sp512_q8_records(const uint8_t *x, size_t xs, int64_t nt, int64_t b0, int64_t nbk, int tw,
                 int32_t off, int64_t lane_kc, uint8_t *xr)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const size_t rec = (size_t)tw * SP512_Q8REC;
    for (int64_t t = 0; t < nt; t++) {
        /* the token's row in memory order (a sequential read), each block's record at its
         * position */
        const sp_block_q8_0 *xb = (const sp_block_q8_0 *)(x + (size_t)t * xs) + b0;
        uint8_t *o = xr + (size_t)(t / tw) * (size_t)nbk * rec;
        const int lane = (int)(t % tw);
        for (int64_t c0 = 0; c0 < nbk; c0 += lane_kc > 0 ? lane_kc : nbk) {
            const int64_t n = lane_kc > 0 && nbk - c0 > lane_kc ? lane_kc : nbk - c0;
            /* lane order: in a chunk of n = 8 full + rem blocks, lane k starts after
             * k * full + min(k, rem) blocks of the lanes before it */
            const int64_t full = n / 8, rem = n % 8;
            for (int64_t w = 0; w < n; w++) {
                const int64_t k = w % 8;
                const int64_t p = lane_kc > 0 ? k * full + (k < rem ? k : rem) + w / 8 : w;
                uint8_t *r = o + (size_t)(c0 + p) * rec;
                const __m256i q = _mm256_loadu_si256((const __m256i *)xb[c0 + w].qs);
                _mm256_storeu_si256((__m256i *)(r + lane * 32), q);
                /* sum of the signed bytes = sum of (x + 128) - 32 * 128, via vpsadbw */
                const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, flip), _mm256_setzero_si256());
                __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
                const int32_t seed = -off * ((int32_t)_mm_cvtsi128_si32(h) - 32 * 128);
                const float dx = _cvtsh_ss(xb[c0 + w].d);
                memcpy(r + tw * 32 + lane * 4, &seed, sizeof seed);
                memcpy(r + tw * 36 + lane * 4, &dx, sizeof dx);
            }
        }
    }
}
