/*
 * q8_ceiling.c - how fast the integer products of a Q8_0 gemm can go on this x86 CPU without
 * VNNI, next to how fast the AVX2 wide gemm (avx2_q8gemm.c) goes. Answers one question: how
 * close is the AVX2 Q8_0 prefill kernel to what the instruction set allows on this CPU, and
 * which form of the same exact block sums is the fastest?
 *
 *   make BUILD=build build/q8_ceiling        (a bench tool, not part of `all`; x86-64)
 *   ./build/q8_ceiling
 *
 * 1. The core clock: a chain of dependent 64-bit adds (one cycle each) timed against the TSC,
 *    so "cycles" below are core cycles (the TSC ticks at the nominal rate, not the boost one).
 * 2. Instruction throughputs, each loop of independent operations written in inline asm (the
 *    compiler's scheduling and register allocation out of the picture): VPMADDUBSW, VPMADDWD,
 *    VPSIGNB alone and mixed, the adds beside them.
 * 3. The inner loops of three exact forms of the Q8_0 block sum, in inline asm with every
 *    operand in L1, as MACs (multiply-adds) per cycle:
 *    - "int8, 1 token": the wide kernel's loop: per 32 MACs a broadcast of 4 activation
 *      bytes, VPSIGNB with the weights from memory, VPMADDUBSW against |w| in a register,
 *      VPMADDWD against ones (the widening), VPADDD into the block sum;
 *    - "int8 tile 2x4": the same four operations with 2 row groups x 4 tokens in registers, so
 *      one broadcast serves two groups and the weights are loaded once per 4 tokens;
 *    - "int16 2x4": weights and activations widened to int16 beforehand, VPMADDWD + VPADDD
 *      only (16 MACs per multiply instead of 32 per two), the same 2 x 4 tile. (A kernel built
 *      on it was faster alone but not inside the engine: docs/design.md.)
 *    - "int8 xor-sign": the sign applied by VPXOR + VPSUBB with a per-weight mask (-1 where
 *      w < 0, made once per block) instead of VPSIGNB, to move it off the multiply pipes;
 *    - "offset split": the activations made unsigned once per token (x + 128 = 16 uh + ul,
 *      two nibble planes), the raw signed weights as VPMADDUBSW's signed operand (no sign
 *      step), ul and uh products added in int16 over the block, widened once per block and
 *      128 * sum(w) of each row taken off;
 *    None of these counts the reference's per-block float step (a broadcast of the token's
 *    scale, two multiplies, a convert, an add), which every form pays the same; the lines
 *    marked "+ float step" add it to the 1-token loops, one step per 8 rows x 32 MACs.
 * 4. The kernel itself: sp__repack_q8_0_gemm_wide_avx2 on a 256-row slice x 512 tokens of a
 *    2048-wide matrix (the slice a prefill work item gets; weights and activations in L2),
 *    thread CPU time (qbench.h), best of 5, as GMAC/s and MACs per cycle at the clock of step 1.
 *
 * Not a test: nothing asserts; the numbers depend on the CPU and the host's load (run it on a
 * quiet host: a thread preempted mid-loop reads slow, and one whose clock calibration ran
 * while the core was shared reads impossibly fast, above 2 multiplies a cycle).
 */
#include "qbench.h"

#include <stdint.h>
#include <x86intrin.h>

#include "kernels/cpu/repack_impl.h"

#define ITERS 20000000L

static double tsc_per_cycle, tsc_hz;
static int32_t scratch[1024] __attribute__((aligned(64)));

/* Core cycles per call of body (run ITERS times), best of 3. */
#define TIME_ASM(cycles, body)                                                                 \
    do {                                                                                       \
        double best_ = 1e30;                                                                   \
        for (int r_ = 0; r_ < 3; r_++) {                                                       \
            const uint64_t t0_ = __rdtsc();                                                    \
            for (long i_ = 0; i_ < ITERS; i_++) {                                              \
                __asm__ volatile(body ::"r"(scratch)                                           \
                                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",     \
                                   "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",          \
                                   "xmm13", "xmm14", "xmm15", "memory");                       \
            }                                                                                  \
            const double c_ = (double)(__rdtsc() - t0_) / tsc_per_cycle / (double)ITERS;       \
            best_ = c_ < best_ ? c_ : best_;                                                   \
        }                                                                                      \
        (cycles) = best_;                                                                      \
    } while (0)

/* Eight independent instances of "op src, ymm14, dst" (dst = ymm0..7): a throughput loop. */
#define X8(op)                                                                                 \
    op " %%ymm15,%%ymm14,%%ymm0\n\t" op " %%ymm15,%%ymm14,%%ymm1\n\t" op                        \
       " %%ymm15,%%ymm14,%%ymm2\n\t" op " %%ymm15,%%ymm14,%%ymm3\n\t" op                        \
       " %%ymm15,%%ymm14,%%ymm4\n\t" op " %%ymm15,%%ymm14,%%ymm5\n\t" op                        \
       " %%ymm15,%%ymm14,%%ymm6\n\t" op " %%ymm15,%%ymm14,%%ymm7\n\t"
#define Y8(op)                                                                                 \
    op " %%ymm15,%%ymm14,%%ymm8\n\t" op " %%ymm15,%%ymm14,%%ymm9\n\t" op                        \
       " %%ymm15,%%ymm14,%%ymm10\n\t" op " %%ymm15,%%ymm14,%%ymm11\n\t" op                      \
       " %%ymm15,%%ymm14,%%ymm12\n\t" op " %%ymm15,%%ymm14,%%ymm13\n\t" op                      \
       " %%ymm15,%%ymm14,%%ymm8\n\t" op " %%ymm15,%%ymm14,%%ymm9\n\t"

/* int8, 1 token: one 32-MAC unit of slice k (|w| of slice k in ymm<k>, w at scratch + 32 k, the
 * token's 4 bytes at scratch + 512 + 4 k), ones16 in ymm15, the block sum in ymm8 */
#define I8(k)                                                                                 \
    "vpbroadcastd 512+4*" #k "(%0),%%ymm12\n\t"                                                \
    "vpsignb 32*" #k "(%0),%%ymm12,%%ymm13\n\t"                                                \
    "vpmaddubsw %%ymm13,%%ymm" #k ",%%ymm13\n\t"                                               \
    "vpmaddwd %%ymm15,%%ymm13,%%ymm13\n\t"                                                     \
    "vpaddd %%ymm13,%%ymm8,%%ymm8\n\t"
#define I8_TOKEN I8(0) I8(1) I8(2) I8(3) I8(4) I8(5) I8(6) I8(7)

/* int8 with the sign by mask: x ^ m - m (m at scratch + 32 k) in place of VPSIGNB */
#define XS(k)                                                                                  \
    "vpbroadcastd 512+4*" #k "(%0),%%ymm12\n\t"                                                \
    "vpxor 32*" #k "(%0),%%ymm12,%%ymm13\n\t"                                                  \
    "vpsubb 32*" #k "(%0),%%ymm13,%%ymm13\n\t"                                                 \
    "vpmaddubsw %%ymm13,%%ymm" #k ",%%ymm13\n\t"                                               \
    "vpmaddwd %%ymm15,%%ymm13,%%ymm13\n\t"                                                     \
    "vpaddd %%ymm13,%%ymm8,%%ymm8\n\t"
#define XS_TOKEN XS(0) XS(1) XS(2) XS(3) XS(4) XS(5) XS(6) XS(7)

/* offset split: u = x + 128 = 16 uh + ul (uh, ul in 0..15, a token's nibble planes at scratch
 * + 512 and + 544), the raw signed weights of slice k in ymm<k> as VPMADDUBSW's signed operand
 * (no sign step), the pair sums of ul and uh added in int16 (8 slices: at most 8 * 2 * 15 * 128
 * = 30720), then widened once a block: ones16 in ymm15, 16s in ymm14, 128 * sum(w) of the rows
 * at scratch + 704 subtracted; the block sum in ymm8 */
#define OS0                                                                                    \
    "vpbroadcastd 512(%0),%%ymm12\n\tvpbroadcastd 544(%0),%%ymm13\n\t"                          \
    "vpmaddubsw %%ymm0,%%ymm12,%%ymm8\n\tvpmaddubsw %%ymm0,%%ymm13,%%ymm9\n\t"
#define OS(k)                                                                                  \
    "vpbroadcastd 512+4*" #k "(%0),%%ymm12\n\tvpbroadcastd 544+4*" #k "(%0),%%ymm13\n\t"        \
    "vpmaddubsw %%ymm" #k ",%%ymm12,%%ymm12\n\tvpmaddubsw %%ymm" #k ",%%ymm13,%%ymm13\n\t"       \
    "vpaddw %%ymm12,%%ymm8,%%ymm8\n\tvpaddw %%ymm13,%%ymm9,%%ymm9\n\t"
#define OS_TOKEN                                                                               \
    OS0 OS(1) OS(2) OS(3) OS(4) OS(5) OS(6) OS(7)                                              \
    "vpmaddwd %%ymm15,%%ymm8,%%ymm8\n\tvpmaddwd %%ymm14,%%ymm9,%%ymm9\n\t"                     \
    "vpaddd %%ymm9,%%ymm8,%%ymm8\n\tvpsubd 704(%0),%%ymm8,%%ymm8\n\t"

/* the reference's float step of one block and token, 8 rows: d = w.d * x.d (the token's
 * scale broadcast), sum += (float)isum * d; the block sum in ymm8, the float sum in ymm11 */
#define FSTEP                                                                                  \
    "vbroadcastss 600(%0),%%ymm9\n\tvmulps 640(%0),%%ymm9,%%ymm9\n\t"                            \
    "vcvtdq2ps %%ymm8,%%ymm10\n\tvmulps %%ymm10,%%ymm9,%%ymm9\n\tvaddps %%ymm9,%%ymm11,%%ymm11\n\t"

/* int8 tile: w of the two groups in ymm0/1, |w| in ymm2/3, ones16 in ymm4, the broadcast in
 * ymm5, products in ymm6/7, the 8 block sums (2 groups x 4 tokens) in ymm8..15 */
#define I8U(acc, w, aw, tmp)                                                                   \
    "vpsignb " w ",%%ymm5," tmp "\n\tvpmaddubsw " tmp "," aw "," tmp "\n\t"                     \
    "vpmaddwd %%ymm4," tmp "," tmp "\n\tvpaddd " tmp "," acc "," acc "\n\t"
#define I8T(off, a0, a1)                                                                       \
    "vpbroadcastd 512+" #off "(%0),%%ymm5\n\t" I8U(a0, "%%ymm0", "%%ymm2", "%%ymm6")          \
        I8U(a1, "%%ymm1", "%%ymm3", "%%ymm7")
#define I8K(o)                                                                                 \
    "vmovdqa " #o "(%0),%%ymm0\n\tvmovdqa " #o "+32(%0),%%ymm1\n\t"                            \
    "vmovdqa " #o "+64(%0),%%ymm2\n\tvmovdqa " #o "+96(%0),%%ymm3\n\t"                          \
    I8T(0, "%%ymm8", "%%ymm9") I8T(4, "%%ymm10", "%%ymm11") I8T(8, "%%ymm12", "%%ymm13")       \
        I8T(12, "%%ymm14", "%%ymm15")

/* int16 tile: widened weights of the two groups in ymm0/1, a token's pair broadcast in ymm2/3,
 * products in ymm4..7, the 8 block sums in ymm8..15 */
#define I16P(o)                                                                                \
    "vmovdqa " #o "(%0),%%ymm0\n\tvmovdqa " #o "+32(%0),%%ymm1\n\t"                            \
    "vpbroadcastd 512(%0),%%ymm2\n\tvpbroadcastd 516(%0),%%ymm3\n\t"                           \
    "vpmaddwd %%ymm2,%%ymm0,%%ymm4\n\tvpmaddwd %%ymm2,%%ymm1,%%ymm5\n\t"                        \
    "vpmaddwd %%ymm3,%%ymm0,%%ymm6\n\tvpmaddwd %%ymm3,%%ymm1,%%ymm7\n\t"                        \
    "vpaddd %%ymm4,%%ymm8,%%ymm8\n\tvpaddd %%ymm5,%%ymm9,%%ymm9\n\t"                            \
    "vpaddd %%ymm6,%%ymm10,%%ymm10\n\tvpaddd %%ymm7,%%ymm11,%%ymm11\n\t"                        \
    "vpbroadcastd 520(%0),%%ymm2\n\tvpbroadcastd 524(%0),%%ymm3\n\t"                           \
    "vpmaddwd %%ymm2,%%ymm0,%%ymm4\n\tvpmaddwd %%ymm2,%%ymm1,%%ymm5\n\t"                        \
    "vpmaddwd %%ymm3,%%ymm0,%%ymm6\n\tvpmaddwd %%ymm3,%%ymm1,%%ymm7\n\t"                        \
    "vpaddd %%ymm4,%%ymm12,%%ymm12\n\tvpaddd %%ymm5,%%ymm13,%%ymm13\n\t"                        \
    "vpaddd %%ymm6,%%ymm14,%%ymm14\n\tvpaddd %%ymm7,%%ymm15,%%ymm15\n\t"

static void
calibrate(void)
{
    /* the fewest ticks of 10 runs: a run that lost the core to another thread only reads more */
    const long n = 10000000L;
    tsc_per_cycle = 1e30;
    for (int r = 0; r < 10; r++) {
        uint64_t a = 1;
        const uint64_t t0 = __rdtsc();
        for (long i = 0; i < n; i++) {
            __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(a));
        }
        const double t = (double)(__rdtsc() - t0) / (4.0 * (double)n);
        tsc_per_cycle = t < tsc_per_cycle ? t : tsc_per_cycle;
    }
    /* the TSC's own rate, over 0.2 s of wall time */
    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    const uint64_t s0 = __rdtsc();
    double dt;
    do {
        clock_gettime(CLOCK_MONOTONIC, &w1);
        dt = (double)(w1.tv_sec - w0.tv_sec) + 1e-9 * (double)(w1.tv_nsec - w0.tv_nsec);
    } while (dt < 0.2);
    tsc_hz = (double)(__rdtsc() - s0) / dt;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

typedef struct {
    int64_t rows, n, toks;
    size_t rb, gb;
    const uint8_t *p, *x;
    float *y;
} kernel_call_t;

static void
kernel_call(void *ctx)
{
    const kernel_call_t *c = ctx;
    sp__repack_q8_0_gemm_wide_avx2(c->n, c->p, c->gb, 0, c->rows, c->x, c->rb, c->toks, c->y,
                                   c->rows);
}

/* The wide kernel on rows x n weights, toks tokens: seconds per call, best of 5 (thread CPU
 * time, qbench.h); 0 when the buffers cannot be had. */
static double
kernel_seconds(int64_t rows, int64_t n, int64_t toks)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_for(SP_CPU_AVX2);
    const size_t rb = sp_row_size(SP_TYPE_Q8_0, n), gb = sp_repack_group_bytes(SP_TYPE_Q8_0, n);
    uint8_t *w = malloc(rb * (size_t)rows), *x = malloc(rb * (size_t)toks);
    uint8_t *p = aligned_alloc(64, (sp_repack_bytes(SP_TYPE_Q8_0, n, rows) + 63) & ~(size_t)63);
    float *f = malloc(sizeof(float) * (size_t)n);
    float *y = malloc(sizeof(float) * (size_t)(rows * toks));
    double best = 0.0;
    if (k != NULL && w && x && p && f && y) {
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < n; i++)
                f[i] = 0.05f * qbench_rnd(&rng);
            sp_quantize_row(SP_TYPE_Q8_0, f, w + (size_t)r * rb, n);
        }
        for (int64_t t = 0; t < toks; t++) {
            for (int64_t i = 0; i < n; i++)
                f[i] = qbench_rnd(&rng);
            k->from_float[SP_TYPE_Q8_0](f, x + (size_t)t * rb, n);
        }
        sp_repack_pack(SP_TYPE_Q8_0, n, w, rb, rows, 0, (rows + 7) / 8, p);
        kernel_call_t c = {rows, n, toks, rb, gb, p, x, y};
        best = qbench_best(kernel_call, &c, 1, 5);
    }
    free(w);
    free(x);
    free(p);
    free(f);
    free(y);
    return best;
}

int
main(void)
{
    if (sp_cpu_kernels_for(SP_CPU_AVX2) == NULL) {
        printf("q8_ceiling: this CPU has no AVX2 level; nothing to measure\n");
        return 0;
    }
    calibrate();
    printf("core clock: %.2f GHz (%.3f TSC ticks per cycle)\n\n", tsc_hz / tsc_per_cycle * 1e-9,
           tsc_per_cycle);
    __asm__ volatile("vpxor %%ymm15,%%ymm15,%%ymm15\n\tvpxor %%ymm14,%%ymm14,%%ymm14" ::
                         : "xmm14", "xmm15");

    printf("instruction throughput (independent operations, operations per cycle)\n");
/* 16 operations a call: the two 8-operation halves given */
#define OPS(label, x8, y8)                                                                     \
    do {                                                                                       \
        double ops_c;                                                                          \
        TIME_ASM(ops_c, x8 y8);                                                                \
        printf("  %-32s %.2f\n", label, 16 / ops_c);                                           \
    } while (0)
    OPS("VPMADDUBSW", X8("vpmaddubsw"), Y8("vpmaddubsw"));
    OPS("VPMADDWD", X8("vpmaddwd"), Y8("vpmaddwd"));
    OPS("VPSIGNB", X8("vpsignb"), Y8("vpsignb"));
    OPS("VPADDD", X8("vpaddd"), Y8("vpaddd"));
    OPS("VPMADDUBSW + VPMADDWD", X8("vpmaddubsw"), Y8("vpmaddwd"));
    OPS("VPMADDUBSW + VPSIGNB", X8("vpmaddubsw"), Y8("vpsignb"));
    OPS("VPMADDWD + VPADDD", X8("vpmaddwd"), Y8("vpaddd"));
    OPS("VPMADDUBSW + VPSHUFB", X8("vpmaddubsw"), Y8("vpshufb"));
    printf("\n");

    double c;
    printf("exact Q8_0 block-sum loops, operands in L1 (MACs per cycle; the float step only where said)\n");
    __asm__ volatile("vpcmpeqw %%ymm15,%%ymm15,%%ymm15\n\tvpsrlw $15,%%ymm15,%%ymm15" ::
                         : "xmm15");
    TIME_ASM(c, I8_TOKEN I8_TOKEN I8_TOKEN I8_TOKEN);
    printf("  int8, 1 token x 8 rows           %.1f   (the kernel's loop)\n", 4 * 256 / c);
    __asm__ volatile("vpcmpeqw %%ymm4,%%ymm4,%%ymm4\n\tvpsrlw $15,%%ymm4,%%ymm4" ::: "xmm4");
    TIME_ASM(c, I8K(0) I8K(128) I8K(256) I8K(384));
    printf("  int8 tile 2 groups x 4 tokens    %.1f\n", 4 * 256 / c);
    TIME_ASM(c, I16P(0) I16P(64) I16P(128) I16P(192));
    printf("  int16 tile 2 groups x 4 tokens   %.1f\n", 4 * 128 / c);
    __asm__ volatile("vpcmpeqw %%ymm15,%%ymm15,%%ymm15\n\tvpsrlw $15,%%ymm15,%%ymm15" ::
                         : "xmm15");
    TIME_ASM(c, XS_TOKEN XS_TOKEN XS_TOKEN XS_TOKEN);
    printf("  int8 xor-sign, 1 token x 8 rows  %.1f\n", 4 * 256 / c);
    TIME_ASM(c, I8_TOKEN FSTEP I8_TOKEN FSTEP I8_TOKEN FSTEP I8_TOKEN FSTEP);
    printf("  int8, 1 token, + float step      %.1f   (the kernel's loop whole)\n", 4 * 256 / c);
    TIME_ASM(c, XS_TOKEN FSTEP XS_TOKEN FSTEP XS_TOKEN FSTEP XS_TOKEN FSTEP);
    printf("  int8 xor-sign, + float step      %.1f\n", 4 * 256 / c);
    __asm__ volatile("vpcmpeqw %%ymm15,%%ymm15,%%ymm15\n\tvpsrlw $15,%%ymm15,%%ymm15\n\t"
                     "vpsllw $4,%%ymm15,%%ymm14" ::: "xmm14", "xmm15");
    TIME_ASM(c, OS_TOKEN OS_TOKEN OS_TOKEN OS_TOKEN);
    printf("  offset split, 1 token x 8 rows   %.1f\n", 4 * 256 / c);
    TIME_ASM(c, OS_TOKEN FSTEP OS_TOKEN FSTEP OS_TOKEN FSTEP OS_TOKEN FSTEP);
    printf("  offset split, + float step       %.1f\n\n", 4 * 256 / c);

    const int64_t rows = 256, n = 2048, toks = 512;
    const double s = kernel_seconds(rows, n, toks);
    if (s > 0) {
        const double macs = (double)rows * (double)n * (double)toks;
        const double core_hz = tsc_hz / tsc_per_cycle;
        printf("kernel sp__repack_q8_0_gemm_wide_avx2, %lld x %lld, %lld tokens: %.2f ms, "
               "%.1f GMAC/s, %.1f MACs per cycle at %.2f GHz\n",
               (long long)rows, (long long)n, (long long)toks, s * 1e3, macs / s * 1e-9,
               macs / s / core_hz, core_hz * 1e-9);
    }
    return 0;
}
