/*
 * attn_bench.c - single-thread speed of the attention kernel per level.
 *
 *   make BUILD=build build/libsampan.a
 *   cc -O2 -march=native -I. -Iinclude -Isrc -D_GNU_SOURCE -pthread bench/attn_bench.c \
 *      build/libsampan.a -lm -o build/attn_bench
 *   ./build/attn_bench [n_kv [head_dim [n_q [level]]]]   (default 512 64 8: TinyLlama at 512;
 *                                                          level scalar|avx2|avx512: only that one)
 *   ./build/attn_bench paged [n_kv [level]]  the engine's paged layout (engine/kv.c): a block
 *                                           holds 16 positions of every layer and KV head
 *                                           (TinyLlama: 22 x 4 x (K, V)), so one head's tiles
 *                                           are a whole block apart; F32 and F16 caches on
 *                                           4 KiB pages and on huge pages, and a plain read
 *                                           of the same tiles (cold only)
 *   ./build/attn_bench mla [n_kv [level]]   the latent shape of DeepSeek-V2-Lite (16 heads,
 *                                           576 = 64 rotated + 512 latent): the two-tile
 *                                           kernel (k->attn) vs engine/mla_attn.c
 *
 * One call = one token, the n_q query heads of one KV head, over n_kv cache
 * rows (F32, F16 and Q8_0 cache). Prints ns per call, ns per (query head, row) and
 * the cache read rate (K and V bytes per call / time), warm (one block
 * re-read from the caches: the compute rate) and cold (blocks from memory).
 * The plain mode's cold copies are contiguous per head, a stream the hardware
 * prefetcher follows; a decode's tiles lie a whole block apart, so `paged` is
 * the decode's case (the two disagreed about where to fetch the values:
 * docs/design.md, "The AVX-VNNI Q8_0 gemm without a sign step; decode values
 * fetched in pass 3"). Thread CPU time, best of 5 repetitions. Not a test:
 * nothing here asserts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "bench/read_sum.h"
#include "core/alloc.h"
#include "engine/mla.h"
#include "kernels/kernels.h"

static int64_t
cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * The latent layout (engine/mla_attn.c): one tile per block, the value read
 * from the key, against the two-tile layout the shared kernels need (a value
 * tile repeating the key). Same numbers in both; cold (blocks from memory, as
 * in decode) only: the warm case of the main mode measures the same compute.
 * Per level and cache type, the two kernels alternate within each repetition.
 */
/*
 * The engine's layout: blocks of 16 positions, each holding every layer's and KV head's key
 * and value tiles (SLOTS of them, TinyLlama's 22 layers x 4 heads); a call reads one slot's
 * tiles over a sequence of consecutive blocks, as a decode step does for one layer and head.
 * Calls go over the slots and sequences of a 352 MiB pool (176 MiB at F16) in turn, so the
 * tiles come from memory. On 4 KiB pages (MADV_NOHUGEPAGE, as kv.c's malloc'd pool has them
 * where THP is "madvise") and on huge pages (MADV_HUGEPAGE): a plain read of the tiles, and
 * the F32 / F16 kernels.
 */
static int
paged_main(int64_t n_kv, const char *only)
{
    enum { HD = 64, NQ = 8, SLOTS = 88, NBLOCKS = 512 };
    if (n_kv < 1 || n_kv > NBLOCKS * 4) { /* at least 4 sequences of blocks, so calls go cold */
        fprintf(stderr, "usage: attn_bench paged [n_kv (<= %d) [level]]\n", NBLOCKS * 4);
        return 2;
    }
    const int64_t nb = (n_kv + 15) / 16, n_seq = NBLOCKS / nb;
    float *q = sp_malloc(sizeof(float) * NQ * HD), *o = sp_malloc(sizeof(float) * NQ * HD);
    float *scratch =
        sp_malloc_aligned((size_t)(NQ * sp_attn_scratch_stride(n_kv)) * sizeof(float), 64);
    int32_t *blocks = sp_malloc(sizeof(int32_t) * NBLOCKS);
    if (!q || !o || !scratch || !blocks) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int i = 0; i < NBLOCKS; i++)
        blocks[i] = i;
    srand(1);
    for (int64_t i = 0; i < NQ * HD; i++)
        q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    printf("paged: n_kv %lld, head_dim %d, %d query heads, tiles %d slots apart; "
           "cold (a %d-block pool in turn)\n",
           (long long)n_kv, HD, NQ, SLOTS, NBLOCKS);
    uint64_t keep = 0;
    for (int f16 = 0; f16 < 2; f16++) {
        const size_t elt = f16 ? sizeof(sp_fp16_t) : sizeof(float);
        const int64_t tile = 16 * HD, bstride = SLOTS * 2 * tile; /* elements */
        const size_t bytes = (size_t)(NBLOCKS * bstride) * elt;
        for (int huge = 0; huge < 2; huge++) {
            char *map = mmap(NULL, bytes + SP_HUGE_PAGE, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (map == MAP_FAILED) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            char *pool =
                (char *)(((uintptr_t)map + SP_HUGE_PAGE - 1) & ~(uintptr_t)(SP_HUGE_PAGE - 1));
            (void)madvise(pool, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
            for (size_t i = 0; i < bytes / elt; i++) {
                const float v = (float)(i % 1013) / 1013.0f - 0.5f;
                if (f16)
                    ((sp_fp16_t *)pool)[i] = sp_fp32_to_fp16(v);
                else
                    ((float *)pool)[i] = v;
            }
            /* l = SP_CPU_SCALAR: the plain read (of the F32 pool) instead of the scalar
             * kernel (minutes at this size); then each SIMD level's kernel */
            for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
                const int read = l == SP_CPU_SCALAR;
                const sp_cpu_kernels_t *k = read ? NULL : sp_cpu_kernels_for((sp_cpu_level_t)l);
                if (read ? f16 != 0
                         : k == NULL ||
                            (only != NULL &&
                             strcmp(only, sp_cpu_level_name((sp_cpu_level_t)l)) != 0)) {
                    continue;
                }
                int64_t best = INT64_MAX, calls = n_seq * SLOTS;
                for (int r = 0; r < 5; r++) {
                    int64_t t0 = cpu_ns();
                    for (int64_t c = 0; c < calls; c++) {
                        const int64_t seq = c % n_seq, slot = (c / n_seq) % SLOTS;
                        const char *kb = pool + (size_t)(slot * 2 * tile) * elt;
                        if (read) {
                            for (int64_t bi = 0; bi < nb; bi++) {
                                const float *kt =
                                    (const float *)kb + blocks[seq * nb + bi] * bstride;
                                keep += sp_read_sum(kt, (size_t)tile * elt) +
                                    sp_read_sum(kt + tile, (size_t)tile * elt);
                            }
                            continue;
                        }
                        sp_attn_args_t a = {
                            .head_dim = HD,
                            .n_q = NQ,
                            .n_kv = n_kv,
                            .q = q,
                            .q_stride = HD,
                            .k = kb,
                            .v = kb + (size_t)tile * elt,
                            .blocks = blocks + seq * nb,
                            .k_block_stride = bstride,
                            .v_block_stride = bstride,
                            .v_stride = HD,
                            .scale = 0.125f,
                            .o = o,
                            .o_stride = HD,
                            .scratch = scratch,
                        };
                        k->attn[f16 ? SP_TYPE_F16 : SP_TYPE_F32](&a);
                    }
                    const int64_t dt = (cpu_ns() - t0) / calls;
                    best = dt < best ? dt : best;
                }
                const double rd = 2.0 * (double)(nb * tile) * (double)elt;
                printf("%-18s %-4s %-9s %10.0f ns/call  %6.1f GB/s of K+V\n",
                       read ? "plain read" : k->name, f16 ? "f16" : "f32",
                       huge ? "huge" : "4k-pages", (double)best, rd / (double)best);
            }
            munmap(map, bytes + SP_HUGE_PAGE);
        }
    }
    return keep == 12345; /* the reads' sums kept */
}

static int
mla_main(int64_t n_kv, const char *only)
{
    enum { HD = 576, VLO = 64, NQ = 16 };
    if (n_kv < 1 || n_kv > (1 << 20)) {
        fprintf(stderr, "usage: attn_bench mla [n_kv [level]]\n");
        return 2;
    }
    const int64_t nblk = (n_kv + 15) / 16;
    /* per copy: nblk blocks of (key tile, value tile), F32 / F16 / Q8_0 */
    const int64_t t32 = 16 * HD, t8 = sp_kv_q8_tile_bytes(HD), row8 = sp_kv_q8_row_bytes(HD);
    const int64_t copy_bytes = nblk * 2 * t32 * 4;
    const int64_t n_copies = ((int64_t)256 << 20) / copy_bytes + 1;
    float *q = sp_malloc(sizeof(float) * NQ * HD), *o = sp_malloc(sizeof(float) * NQ * HD);
    float *c32 = sp_malloc((size_t)(n_copies * nblk * 2 * t32) * sizeof(float));
    sp_fp16_t *c16 = sp_malloc((size_t)(n_copies * nblk * 2 * t32) * sizeof(sp_fp16_t));
    char *c8 = sp_malloc((size_t)(n_copies * nblk * 2 * t8));
    const int64_t sc_n = NQ * sp_attn_scratch_stride(n_kv) + sp__mla_attn_scratch_floats(HD);
    float *scratch = sp_malloc_aligned((size_t)sc_n * sizeof(float), 64);
    int32_t *blocks = sp_malloc((size_t)nblk * sizeof(int32_t));
    if (!q || !o || !c32 || !c16 || !c8 || !scratch || !blocks) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    srand(1);
    for (int64_t i = 0; i < NQ * HD; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    /* block ids 0, 2, 4, ...: each block's key tile, then its value tile */
    for (int64_t i = 0; i < nblk; i++) blocks[i] = (int32_t)(2 * i);
    float row[HD];
    for (int64_t c = 0; c < n_copies; c++) {
        for (int64_t p = 0; p < nblk * 16; p++) {
            const int64_t b = c * nblk + p / 16, l = p % 16;
            for (int64_t d = 0; d < HD; d++) row[d] = (float)((p * 7 + d * 13 + c) % 1013) / 1013.0f - 0.5f;
            for (int64_t d = 0; d < HD; d++) {
                c32[2 * b * t32 + d * 16 + l] = row[d];
                c32[(2 * b + 1) * t32 + l * HD + d] = row[d];
                c16[2 * b * t32 + d * 16 + l] = sp_fp32_to_fp16(row[d]);
                c16[(2 * b + 1) * t32 + l * HD + d] = sp_fp32_to_fp16(row[d]);
            }
            sp_kv_q8_store_key(c8 + 2 * b * t8, l, row, HD);
            sp_kv_q8_store_value(c8 + (2 * b + 1) * t8 + l * row8, row, HD);
        }
    }
    printf("mla: n_kv %lld, %d heads, head_dim %d (values from %d), cold (%lld copies), "
           "ns per call, best of 5\n",
           (long long)n_kv, NQ, HD, VLO, (long long)n_copies);
    for (int lv = SP_CPU_SCALAR; lv <= SP_CPU_TOP; lv++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)lv);
        if (k == NULL || (only != NULL && strcmp(only, sp_cpu_level_name((sp_cpu_level_t)lv)) != 0)) continue;
        for (int kind = 0; kind < 3; kind++) {
            const sp_type_t kt = kind == 2 ? SP_TYPE_Q8_0 : kind == 1 ? SP_TYPE_F16 : SP_TYPE_F32;
            const int64_t reps = lv == SP_CPU_SCALAR ? 2 : n_copies;
            int64_t best[2] = {INT64_MAX, INT64_MAX};
            for (int r = 0; r < 5; r++) {
                for (int which = 0; which < 2; which++) {
                    int64_t t0 = cpu_ns();
                    for (int64_t i = 0; i < reps; i++) {
                        const int64_t c = i % n_copies;
                        const void *base = kind == 2   ? (const void *)(c8 + c * nblk * 2 * t8)
                                           : kind == 1 ? (const void *)(c16 + c * nblk * 2 * t32)
                                                       : (const void *)(c32 + c * nblk * 2 * t32);
                        const int64_t tile = kind == 2 ? t8 : t32;
                        const size_t elt = kind == 2 ? 1 : kind == 1 ? 2 : 4;
                        sp_attn_args_t a = {
                            .head_dim = HD, .n_q = NQ, .n_kv = n_kv, .q = q, .q_stride = HD,
                            .k = base, .v = (const char *)base + tile * (int64_t)elt,
                            .blocks = blocks, .k_block_stride = tile, .v_block_stride = tile,
                            .v_stride = kind == 2 ? row8 : HD, .scale = 0.07f, .o = o,
                            .o_stride = HD, .scratch = scratch,
                        };
                        if (which == 0) {
                            k->attn[kt](&a);
                        } else {
                            sp__mla_attn(k, kt, &a, VLO);
                        }
                    }
                    const int64_t dt = (cpu_ns() - t0) / reps;
                    best[which] = dt < best[which] ? dt : best[which];
                }
            }
            printf("%-18s %-4s two-tile %10lld  latent %10lld  latent/two-tile time %.2f\n",
                   k->name, kind == 2 ? "q8_0" : kind == 1 ? "f16" : "f32", (long long)best[0],
                   (long long)best[1], (double)best[1] / (double)best[0]);
        }
    }
    return 0;
}

int
main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "paged") == 0) {
        return paged_main(argc > 2 ? atoll(argv[2]) : 576, argc > 3 ? argv[3] : NULL);
    }
    if (argc > 1 && strcmp(argv[1], "mla") == 0) {
        return mla_main(argc > 2 ? atoll(argv[2]) : 4096, argc > 3 ? argv[3] : NULL);
    }
    const int64_t n_kv = argc > 1 ? atoll(argv[1]) : 512;
    const int64_t hd = argc > 2 ? atoll(argv[2]) : 64;
    const int64_t n_q = argc > 3 ? atoll(argv[3]) : 8;
    const char *only = argc > 4 ? argv[4] : NULL;
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
    for (int l = SP_CPU_SCALAR; l <= SP_CPU_TOP; l++) {
        const sp_cpu_kernels_t *k = sp_cpu_kernels_for((sp_cpu_level_t)l);
        if (k == NULL || (only != NULL && strcmp(only, sp_cpu_level_name((sp_cpu_level_t)l)) != 0)) continue;
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
