/*
 * attn_bench.c - single-thread speed of the attention kernel per level.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -Iinclude -Isrc -D_GNU_SOURCE -pthread bench/attn_bench.c build/libsampan.a -lm \
 *      -o build/attn_bench
 *   ./build/attn_bench [n_kv [head_dim [n_q [level]]]]   (default 512 64 8: TinyLlama at 512;
 *                                                          level scalar|avx2|avx512: only that one)
 *
 * One call = one token, the n_q query heads of one KV head, over n_kv cache
 * rows (F32, F16 and Q8_0 cache). Prints ns per call, ns per (query head, row) and
 * the cache read rate (K and V bytes per call / time), warm (one block
 * re-read from the caches: the compute rate) and cold (blocks from memory, as
 * in decode). Thread CPU time, best of 5 repetitions. Not a test: nothing
 * here asserts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "kernels/kernels.h"

static int64_t
cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int
main(int argc, char **argv)
{
    const int64_t n_kv = argc > 1 ? atoll(argv[1]) : 512;
    const int64_t hd = argc > 2 ? atoll(argv[2]) : 64;
    const int64_t n_q = argc > 3 ? atoll(argv[3]) : 8;
    const char *only = argc > 4 ? argv[4] : NULL;
    const char *level_names[3] = {"scalar", "avx2", "avx512"};
    if (n_kv < 1 || hd < 1 || n_q < 1 || n_kv > (1 << 20) || hd > 4096 || n_q > 64) {
        fprintf(stderr, "usage: attn_bench [n_kv [head_dim [n_q [level]]]]\n");
        return 2;
    }
    /* One (K, V) head block per copy, as the engine's head-major cache lays
     * it out; enough copies for 256 MB so the cold runs read from memory. */
    const int64_t blk = sp_attn_scratch_stride(n_kv) * hd;
    int64_t n_copies = ((int64_t)256 << 20) / (blk * 2 * (int64_t)sizeof(float)) + 1;
    float *q = sp_malloc((size_t)(n_q * hd) * sizeof(float));
    float *o = sp_malloc((size_t)(n_q * hd) * sizeof(float));
    float *kv32 = sp_malloc((size_t)(n_copies * blk * 2) * sizeof(float));
    sp_fp16_t *kv16 = sp_malloc((size_t)(n_copies * blk * 2) * sizeof(sp_fp16_t));
    /* Q8_0 (kernels.h): per copy the key tiles of every block, then the value rows. */
    const int64_t nblk = blk / hd / 16, q8_tile = sp_kv_q8_tile_bytes(hd);
    const int64_t q8_row = sp_kv_q8_row_bytes(hd), q8_copy = 2 * nblk * q8_tile;
    char *kv8 = sp_malloc((size_t)(n_copies * q8_copy));
    float *scratch =
        sp_malloc_aligned((size_t)(n_q * sp_attn_scratch_stride(n_kv)) * sizeof(float), 64);
    /* A contiguous cache through the paged interface: block ids 0, 1, 2, ... */
    int32_t *blocks = sp_malloc((size_t)(blk / hd / 16) * sizeof(int32_t));
    if (!q || !o || !kv32 || !kv16 || !kv8 || !scratch || !blocks) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < blk / hd / 16; i++) blocks[i] = (int32_t)i;
    srand(1);
    for (int64_t i = 0; i < n_q * hd; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int64_t i = 0; i < n_copies * blk * 2; i++) {
        kv32[i] = (float)(i % 1013) / 1013.0f - 0.5f;
        kv16[i] = sp_fp32_to_fp16(kv32[i]);
    }
    for (int64_t c = 0; c < n_copies; c++) {
        /* The same numbers as the F32 copy, quantised as the engine stores them. */
        char *kb = kv8 + c * q8_copy, *vb = kb + nblk * q8_tile;
        const float *k32 = kv32 + 2 * c * blk, *v32 = kv32 + (2 * c + 1) * blk;
        float row[4096];
        for (int64_t p = 0; p < nblk * 16; p++) {
            for (int64_t d = 0; d < hd; d++) row[d] = k32[sp_attn_k_index(p, d, hd)];
            sp_kv_q8_store_key(kb + (p / 16) * q8_tile, p % 16, row, hd);
            sp_kv_q8_store_value(vb + p * q8_row, v32 + p * hd, hd);
        }
    }
    printf("n_kv %lld head_dim %lld n_q %lld (warm: one block in cache; cold: %lld blocks "
           "in turn)\n",
           (long long)n_kv, (long long)hd, (long long)n_q, (long long)n_copies);
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_AVX512; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL || (only != NULL && strcmp(only, level_names[l]) != 0)) continue;
        for (int t = 0; t < 6; t++) {
            const int kind = t % 3, f16 = kind == 1, q8 = kind == 2, cold = t / 3;
            const sp_type_t kt = q8 ? SP_TYPE_Q8_0 : f16 ? SP_TYPE_F16 : SP_TYPE_F32;
            const int64_t reps = l == SP_CPU_SCALAR ? 3 : (cold ? n_copies : 200);
            int64_t best = INT64_MAX;
            for (int r = 0; r < 5; r++) {
                int64_t t0 = cpu_ns();
                for (int64_t i = 0; i < reps; i++) {
                    const int64_t c = cold ? i % n_copies : 0;
                    sp_attn_args_t a = {
                        .head_dim = hd, .n_q = n_q, .n_kv = n_kv, .q = q, .q_stride = hd,
                        .k = q8    ? (const void *)(kv8 + c * q8_copy)
                             : f16 ? (const void *)(kv16 + 2 * c * blk)
                                   : (const void *)(kv32 + 2 * c * blk),
                        .v = q8    ? (const void *)(kv8 + c * q8_copy + nblk * q8_tile)
                             : f16 ? (const void *)(kv16 + (2 * c + 1) * blk)
                                   : (const void *)(kv32 + (2 * c + 1) * blk),
                        .blocks = blocks, .k_block_stride = q8 ? q8_tile : 16 * hd,
                        .v_block_stride = q8 ? q8_tile : 16 * hd, .v_stride = q8 ? q8_row : hd,
                        .scale = 0.125f, .o = o, .o_stride = hd,
                        .scratch = scratch,
                    };
                    k->attn[kt](&a);
                }
                int64_t dt = (cpu_ns() - t0) / reps;
                best = dt < best ? dt : best;
            }
            const double bytes = q8 ? 2.0 * (double)(n_kv * q8_row)
                                    : 2.0 * (double)(n_kv * hd) * (f16 ? 2 : 4);
            printf("%-18s %-4s %-4s %10.0f ns/call  %6.2f ns/(head,row)  %6.1f GB/s of K+V\n",
                   k->name, q8 ? "q8_0" : f16 ? "f16" : "f32", cold ? "cold" : "warm", (double)best,
                   (double)best / (double)(n_q * n_kv), bytes / (double)best);
        }
    }
    return 0;
}
