#!/usr/bin/env bash
# The arm64 suite (tests/run.sh runs it): cross-builds build-arm64/test_unit_arm64 with
# Debian's aarch64 gcc (`make ARCH=arm64 unit-arm64`) and runs it under qemu-aarch64 (user
# mode, its default cpu "max" has the dot-product extension): the NEON kernel checks once
# (each test walks every level the dispatcher has: scalar, neon, dotprod), then the engine
# tests on the demo model at each level (SAMPAN_CPU=scalar, neon, dotprod), and the dispatch on
# an emulated CPU without the dot-product extension. Correctness only:
# nothing here times anything. Without the cross compiler or qemu it prints one skipped line.
# Ends with "arm64: N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
CROSS=${CROSS:-aarch64-linux-gnu-}
# The loader and libc must come from one package: with Debian's multiarch arm64 libc installed
# (the engine's libpcre2-dev:arm64 brings it) the binary runs against / (its ld.so finds the
# multiarch PCRE2 and libcrypto); the cross toolchain's own copy under /usr/aarch64-linux-gnu
# would load the multiarch libc.so.6 of a different build, and forked children then hang.
if [ -e /lib/aarch64-linux-gnu/libc.so.6 ]; then
    SYSROOT=${ARM64_SYSROOT:-/}
else
    SYSROOT=${ARM64_SYSROOT:-/usr/aarch64-linux-gnu}
fi
if ! command -v "${CROSS}gcc" >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
    echo "arm64: 0 passed, 0 failed, 1 skipped (no ${CROSS}gcc or qemu-aarch64: scripts/deps.sh --test installs them)"
    exit 0
fi
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
if ! make -j"$(nproc)" ARCH=arm64 CROSS="$CROSS" unit-arm64 >"$log/build.txt" 2>&1; then
    tail -n 30 "$log/build.txt"
    echo "arm64: 0 passed, 1 failed, 0 skipped (cross build failed)"
    exit 1
fi
run() { # label, env..., -- test selections...
    local label=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" qemu-aarch64 -L "$SYSROOT" build-arm64/test_unit_arm64 "$@" 2>&1 |
        sed "s/^/[$label] /" | tee -a "$log/all.txt"
}
# Kernels: the dispatcher, every product against the reference (the quantised ones bit for
# bit), batch invariance of the gemms, both K-quant families and the 32-element block types,
# the NEON attention over F32 / F16 / Q8_0 caches (head_dim tails, sliding window, soft-cap,
# sinks, a 4097-position context, paged block layouts, batch invariance) and the element-wise
# ops. The big-shape sweeps (kernels_gemm_large_shapes, attn_matches_reference_all_shapes: half a
# minute and more under qemu) are left to the native suites; attn_matches_reference_tails
# is the shape sweep's tails at a tenth of its cost.
KERNEL_TESTS=(kernels_fp16 kernels_bf16 kernels_q4_0_layout kernels_quantize_round_trip
              kernels_q8_0 kernels_q_products kernels_vec_dot_vs_reference
              kernels_gemm_is_batch_invariant kernels_q_neon_is_the_reference
              kernels_neon_covers_every_type kernels_dispatch
              kernels_env_level kernels_cpu_levels test_kquants.c test_kquants2.c test_q32.c
              attn_exp_matches_expf attn_matches_reference_tails attn_window_softcap_sinks
              attn_matches_reference_peaked_and_long attn_q8_0_cache_layout
              attn_rmsnorm_and_swiglu)
run kernels SP_TEST_TIMEOUT=600 -- "${KERNEL_TESTS[@]}"
# The engine on the demo model at each level: the greedy text against llama2.c's reference,
# prefill / decode / threads bit identity, a context ending inside a KV block (the F16-cache
# sweep of test_forward takes half a minute a level under qemu: left to the native suites).
for lvl in scalar neon dotprod; do
    run "$lvl" SAMPAN_CPU=$lvl SP_TEST_TIMEOUT=600 -- demo_model_greedy prefill_decode_and_threads forward_context_ending
done
# A CPU without the dot-product extension (qemu's cortex-a53): the dispatcher must not pick
# the SDOT table there (it would die of SIGILL), and the NEON products still match.
run a53 QEMU_CPU=cortex-a53 -- kernels_dispatch kernels_cpu_levels kernels_q_neon_is_the_reference \
    kernels_neon_covers_every_type
grep -q '^\[a53\]   cpu levels: scalar neon$' "$log/all.txt" || {
    echo "[a53] the dispatcher did not report exactly scalar and neon"
    echo "[a53] unit: 0 passed, 1 failed, 0 skipped" >>"$log/all.txt"
}
p=0; f=0; s=0
while read -r line; do
    p=$((p + $(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line")))
    f=$((f + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")))
    s=$((s + $(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$line")))
done < <(grep -E 'unit: [0-9]+ passed, [0-9]+ failed' "$log/all.txt")
runs=$(grep -cE 'unit: [0-9]+ passed' "$log/all.txt")
[ "$runs" -ge 5 ] || f=$((f + 5 - runs)) # a run that crashed before its summary
echo "arm64: $p passed, $f failed, $s skipped"
[ "$f" -eq 0 ]
