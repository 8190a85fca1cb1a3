/*
 * dispatch.c - picks the CPU kernel table at run time.
 *
 * x86-64: cpuid says what the CPU can do and XGETBV says whether the OS saves
 * the YMM/ZMM registers on a context switch; a level is usable only when both
 * do. AArch64: NEON (Advanced SIMD) is part of the base architecture, the
 * dot-product extension is read from getauxval(AT_HWCAP) (HWCAP_ASIMDDP).
 * Which SIMD files exist is fixed at compile time (the x86 files are never
 * built for arm64, nor the NEON files for x86), which of them run at run time.
 * One table per level is built on first use (pthread_once) and never changes
 * afterwards, so callers may keep the pointer and share it between threads.
 * SAMPAN_CPU=scalar|avx2|avx2-vnni|avx512|amx (x86) or scalar|neon|dotprod (arm64)
 * is read once and can only lower the level.
 *
 * AVX-VNNI without AVX-512 (Intel Alder Lake and later clients, the E-core Xeons): the
 * "avx2-vnni" table is the AVX2 level's (its level number, its packed layouts) with the
 * kernels avxvnni_*.c speed up with VPDPBUSD; the same bits. It is the default there, and
 * SAMPAN_CPU=avx2-vnni picks it on any CPU that has AVX-VNNI (an AVX-512 one included, to
 * test and time it), while SAMPAN_CPU=avx2 keeps the plain AVX2 table, what AVX2-only CPUs
 * run.
 *
 * AMX: besides cpuid (AMX-TILE, AMX-INT8) and XCR0 (XTILECFG, XTILEDATA), Linux
 * hands the 8 KiB tile state to a process only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM, kernel 5.16+); the request is made once, here, for the
 * whole process, and a refusal leaves the CPU at the AVX-512 level.
 */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/repack_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "sampan/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SP_X86 1
#else
#define SP_X86 0
#endif

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20) /* the kernel's value, for old headers */
#endif
#endif

/* The names SAMPAN_CPU accepts, indexed by level: the two SIMD levels mean
 * AVX2 / AVX-512 on x86 and NEON / NEON with dot product on arm64. */
#if defined(__aarch64__)
static const char *const level_names[] = {"scalar", "neon", "dotprod"};
#else
static const char *const level_names[] = {"scalar", "avx2", "avx512", "amx"};
#endif
#define N_LEVELS ((int)(sizeof(level_names) / sizeof(level_names[0])))

static sp_cpu_features_t features;
static sp_cpu_kernels_t tables[SP_CPU_TOP + 1];
static bool table_ok[SP_CPU_TOP + 1];
static sp_cpu_kernels_t avx2_vnni; /* built where features.avx_vnni */
static const sp_cpu_kernels_t *chosen;

/* SAMPAN_CPU's name of the AVX2 level's AVX-VNNI table (x86 only). */
#define AVX2_VNNI_NAME "avx2-vnni"
static pthread_once_t once = PTHREAD_ONCE_INIT;

#if SP_X86
static uint64_t
xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Ask Linux for the AMX tile data state (XFEATURE_XTILEDATA = 18); without it
 * the first tile instruction faults. */
static bool
request_amx_state(void)
{
#if defined(__linux__) && defined(__x86_64__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}
#endif

static void
detect(sp_cpu_features_t *f)
{
    memset(f, 0, sizeof(*f));
#if SP_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        return;
    }
    bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28);
    bool f16c = c & (1u << 29);
    if (!osxsave || !avx) {
        return;
    }
    uint64_t xcr0 = xgetbv0();
    bool ymm_os = (xcr0 & 0x6) == 0x6;    /* SSE + AVX state */
    bool zmm_os = (xcr0 & 0xe6) == 0xe6;  /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        return;
    }
    bool avx2 = b & (1u << 5);
    bool f512 = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
    bool vnni = c & (1u << 11);
    bool amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
    bool tile_os = (xcr0 & 0x60000) == 0x60000; /* XTILECFG + XTILEDATA */
    unsigned max_sub = a;
    bool bf16 = false, avx_vnni = false;
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        avx_vnni = a & (1u << 4);
        bf16 = a & (1u << 5);
    }
    f->avx2 = avx2 && fma && f16c && ymm_os;
    f->avx_vnni = f->avx2 && avx_vnni;
    f->avx512 = f->avx2 && f512 && dq && bw && vl && zmm_os;
    f->avx512_vnni = f->avx512 && vnni;
    f->avx512_bf16 = f->avx512 && bf16;
    f->amx_int8 = f->avx512_vnni && amx_tile && amx_int8 && tile_os && request_amx_state();
#elif defined(__aarch64__)
    f->neon = true; /* Advanced SIMD is mandatory in AArch64 */
    f->dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
}

sp_cpu_level_t
sp__cpu_level_from_env(const char *value, sp_cpu_level_t best)
{
    sp_cpu_level_t want = best;
    if (value == NULL || value[0] == '\0') {
        return best;
    }
    for (int l = SP_CPU_SCALAR; l < N_LEVELS; l++) {
        if (strcmp(value, level_names[l]) == 0) {
            want = (sp_cpu_level_t)l;
        }
    }
#if SP_X86
    if (strcmp(value, AVX2_VNNI_NAME) == 0) {
        want = SP_CPU_AVX2; /* its table is the AVX2 level's (table_for_env) */
    }
#endif
    return want < best ? want : best;
}

void
sp__cpu_build_table(sp_cpu_kernels_t *k, sp_cpu_level_t level, bool has_vnni, bool has_bf16)
{
    memset(k, 0, sizeof(*k));
    k->level = level;
    /* every level starts from the reference and overrides what it speeds up */
    sp__ref_register(k);
    sp__kquants_register_ref(k);
    sp__q32_register_ref(k);
    sp__kquants2_register_ref(k);
    sp__attn_register_ref(k);
    k->name = "scalar";
#if defined(__aarch64__)
    (void)has_vnni;
    (void)has_bf16;
    if (level >= SP_CPU_NEON) {
        sp__neon_register(k);
        sp__attn_register_neon(k);
        k->name = "neon";
    }
    if (level >= SP_CPU_DOTPROD) {
        sp__neon_dotprod_register(k);
        k->name = "dotprod";
    }
#else
    if (level >= SP_CPU_AVX2) {
        sp__avx2_register(k);
        sp__kquants_register_avx2(k);
        sp__q32_register_avx2(k);
        sp__q32_panels_register_avx2(k);
        sp__kquants2_register_avx2(k);
        sp__attn_register_avx2(k);
        sp__repack_register_avx2(k);
        sp__kpack_register_avx2(k); /* Q6_K, Q5_K packed (avx2_kpack.c) */
        k->name = "avx2";
    }
    if (level >= SP_CPU_AVX512) {
        /* The AVX-512 panels unpack row-major Q4_0, IQ4_NL and Q8_0 blocks themselves, faster
         * than the AVX2 packed kernels; Q4_K and IQ4_XS stay packed, where the AVX2 packed
         * kernels beat the AVX-512 row-major ones (prefill 1.5-1.7x on a Zen 5: BENCHMARKS.md,
         * "Ten types on an AVX-512 host"). With VNNI: IQ4_XS's packed prefill takes the 16-row
         * VPDPBUSD panels (avx512_q4panel.c; one token stays on the AVX2 packed kernel), IQ4_NL
         * and MXFP4 are packed again and read as those panels at any token count, Q4_K's
         * packed gemm is avx512_repack.c's and the Q2_K / Q6_K gemms avx512_kpanel.c's; Q8_0
         * and Q4_0 are packed again, in 16-row VNNI panels (SP_REPACK_PANEL16) read by
         * avx512_qgemm.c at any token count. */
        k->repack_gemm[SP_TYPE_Q4_0] = NULL;
        k->repack_gemm[SP_TYPE_IQ4_NL] = NULL;
        k->repack_gemm[SP_TYPE_Q8_0] = NULL;
        /* Q6_K stays row-major: its VNNI row panels (avx512_kpanel.c) prefill at 2x the AVX2
         * packed kernel. Q5_K, with no VNNI panel, keeps the AVX2 packed one (1.4x the
         * AVX-512 row kernel): docs/design.md */
        k->repack_gemm[SP_TYPE_Q6_K] = NULL;
        sp__avx512_register(k, has_vnni, has_bf16);
        sp__kquants_register_avx512(k, has_vnni, has_bf16);
        sp__q32_register_avx512(k, has_vnni);
        if (has_vnni) {
            sp__q4panel_register_avx512(k); /* IQ4_XS, IQ4_NL, MXFP4 packed: VNNI panels */
        }
        sp__kquants2_register_avx512(k);
        sp__attn_register_avx512(k);
        sp__repack_register_avx512(k, has_vnni);
        sp__kpanels_register_avx512(k, has_vnni);
        if (has_vnni) {
            sp__avx512_qgemm_packed_register(k); /* Q8_0, Q4_0 packed at load: 16-row panels */
        }
        k->name = has_vnni ? (has_bf16 ? "avx512-vnni-bf16" : "avx512-vnni")
                           : (has_bf16 ? "avx512-bf16" : "avx512");
    }
    if (level >= SP_CPU_AMX) {
        /* The AVX-512 table with the integer products of the packed 16-row panels on AMX
         * tiles (amx.c); the same panels, the same bits. Only built where the CPU has
         * VNNI too. */
        sp__amx_register(k);
        k->name = has_bf16 ? "amx-avx512-vnni-bf16" : "amx-avx512-vnni";
    }
#endif
}

const char *
sp_cpu_level_name(sp_cpu_level_t level)
{
    return (int)level >= 0 && (int)level < N_LEVELS ? level_names[level] : "?";
}

/* The table SAMPAN_CPU=env picks at `level` (sp__cpu_level_from_env's): the AVX-VNNI one at the
 * AVX2 level where the CPU has it and either env names it or nothing higher than AVX2 was
 * asked for and the CPU has no AVX-512 (its default there). */
static const sp_cpu_kernels_t *
table_for_env(const char *env, sp_cpu_level_t level)
{
#if SP_X86
    if (level == SP_CPU_AVX2 && features.avx_vnni) {
        const bool named = env != NULL && strcmp(env, AVX2_VNNI_NAME) == 0;
        const bool plain = env != NULL && strcmp(env, "avx2") == 0;
        if (named || (!plain && !features.avx512)) {
            return &avx2_vnni;
        }
    }
#else
    (void)env;
#endif
    return &tables[level];
}

static void
init_once(void)
{
    detect(&features);
    sp_cpu_level_t best = SP_CPU_SCALAR;
    if (features.avx2 || features.neon) {
        best = SP_CPU_AVX2;
    }
    if (features.avx512 || features.dotprod) {
        best = SP_CPU_AVX512;
    }
    if (features.amx_int8) {
        best = SP_CPU_AMX;
    }
    for (int l = SP_CPU_SCALAR; l <= (int)best; l++) {
        sp__cpu_build_table(&tables[l], (sp_cpu_level_t)l, features.avx512_vnni,
                            features.avx512_bf16);
        table_ok[l] = true;
    }
#if SP_X86
    if (features.avx_vnni) {
        sp__cpu_build_table(&avx2_vnni, SP_CPU_AVX2, false, false);
        sp__avxvnni_register(&avx2_vnni);
        avx2_vnni.name = AVX2_VNNI_NAME;
    }
#endif
    const char *env = getenv("SAMPAN_CPU");
    const sp_cpu_level_t level = sp__cpu_level_from_env(env, best);
    chosen = table_for_env(env, level);
    bool known = false;
    char names[80] = "";
    for (int l = SP_CPU_SCALAR; l < N_LEVELS; l++) {
        known = known || (env != NULL && strcmp(env, level_names[l]) == 0);
        strcat(names, l == 0 ? "" : l + 1 == N_LEVELS ? " or " : ", ");
        strcat(names, level_names[l]);
#if SP_X86
        if (l == SP_CPU_AVX2) {
            known = known || (env != NULL && strcmp(env, AVX2_VNNI_NAME) == 0);
            strcat(names, ", " AVX2_VNNI_NAME);
        }
#endif
    }
    const bool set = env != NULL && env[0] != '\0';
    const bool vnni_missing =
        SP_X86 && set && strcmp(env, AVX2_VNNI_NAME) == 0 && !features.avx_vnni;
    if (set && !known) {
        SP_LOG_WARN("SAMPAN_CPU=%s is not %s; using %s", env, names, chosen->name);
    } else if (vnni_missing ||
               (set && sp__cpu_level_from_env(env, (sp_cpu_level_t)(N_LEVELS - 1)) > best)) {
        /* a level above what this CPU (or its OS) runs: capped, and said so */
        SP_LOG_WARN("SAMPAN_CPU=%s: this CPU lacks it; using %s", env, chosen->name);
    }
}

const sp_cpu_features_t *
sp__cpu_features(void)
{
    pthread_once(&once, init_once);
    return &features;
}

const sp_cpu_kernels_t *
sp_cpu_kernels(void)
{
    pthread_once(&once, init_once);
    return chosen;
}

const sp_cpu_kernels_t *
sp_cpu_kernels_avx2_vnni(void)
{
    pthread_once(&once, init_once);
    return features.avx_vnni ? &avx2_vnni : NULL;
}

const sp_cpu_kernels_t *
sp_cpu_kernels_for(sp_cpu_level_t level)
{
    pthread_once(&once, init_once);
    if ((int)level < 0 || level > SP_CPU_TOP || !table_ok[level]) {
        return NULL;
    }
    return &tables[level];
}

const sp_cpu_kernels_t *
sp_cpu_kernels_ref(void)
{
    pthread_once(&once, init_once);
    return &tables[SP_CPU_SCALAR];
}

void
sp_cpu_gemm(const sp_cpu_kernels_t *k, sp_type_t wtype, int64_t n, const void *w,
            size_t w_stride, int64_t r0, int64_t r1, const void *x, size_t x_stride,
            int64_t n_tok, float *y, int64_t ldy)
{
    if (r1 <= r0 || n_tok <= 0) {
        return;
    }
    if (k->gemm[wtype] != NULL) {
        k->gemm[wtype](n, w, w_stride, r0, r1, x, x_stride, n_tok, y, ldy);
        return;
    }
    sp_vec_dot_fn dot = k->vec_dot[wtype];
    const char *wb = w, *xb = x;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t r = r0; r < r1; r++) {
            dot(n, &y[t * ldy + r], wb + (size_t)r * w_stride, xb + (size_t)t * x_stride);
        }
    }
}
