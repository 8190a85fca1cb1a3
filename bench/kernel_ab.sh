#!/usr/bin/env bash
# bench/kernel_ab.sh - A/B of the AVX2 packed gemms in one process: revision REV's
# avx2_repack.c and avx2_q8gemm.c against this tree's (bench/kernel_ab.c says what is timed).
#
#   bench/kernel_ab.sh REV [TYPE ROWS ...]        e.g. bench/kernel_ab.sh HEAD~1 q8_0 65536
#   AB_THREADS=2 bench/kernel_ab.sh REV ...       two threads, half the rows each
#
# REV is checked out in a temporary git worktree (removed at exit), its two objects are built
# there with this Makefile's flags, their entry points renamed old_* (objcopy), and linked
# with this tree's build/libsampan.a into build/kernel_ab. x86-64 with AVX2 only.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bench/kernel_ab.sh REV [TYPE ROWS ...]" >&2; exit 2; }
REV=$1
shift
BUILD=${BUILD:-build}
TMP=$(mktemp -d)
cleanup() {
    git worktree remove --force "$TMP/wt" >/dev/null 2>&1 || true
    rm -rf "$TMP"
}
trap cleanup EXIT
git worktree add -q --detach "$TMP/wt" "$REV"
OBJS=(src/kernels/cpu/avx2_repack.o src/kernels/cpu/avx2_q8gemm.o)
make -s -C "$TMP/wt" BUILD=build "${OBJS[@]/#/build/}"
RENAME=()
for s in sp__repack_register_avx2 sp__repack_q8_0_gemm_wide_avx2 sp__repack_iq4_xs_gemm_avx2; do
    RENAME+=(--redefine-sym "$s=old_$s")
done
for o in "${OBJS[@]}"; do
    objcopy "${RENAME[@]}" "$TMP/wt/build/$o" "$TMP/old_$(basename "$o")"
done
make -s BUILD="$BUILD" "$BUILD/libsampan.a"

cc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc -Ibench -pthread -o "$BUILD/kernel_ab" bench/kernel_ab.c \
    "$TMP"/old_*.o "$BUILD/libsampan.a" -lm
echo "kernel_ab: $(git rev-parse --short "$REV") (old) against the working tree (new), $(lscpu | sed -n 's/^Model name: *//p')"
"$BUILD/kernel_ab" "$@"
