# shellcheck shell=bash
# bench/llamacpp_cpu.sh - run node-llama-cpp's prebuilt llama.cpp with ONE chosen CPU backend
# variant (sourced by bench/run.sh; the caller defines say()).
#
# The prebuilt package ships one libggml-cpu-VARIANT.so per CPU family (x64, sse42, sandybridge,
# haswell = AVX2+FMA+F16C, skylakex, icelake, zen4, ...) beside its addon, and ggml loads the
# variant that scores best on this CPU from that folder. To compare our AVX2 kernels with
# llama.cpp's AVX2 ones on an AVX-512 host, llamacpp_cpu_mirror builds, under bench/out/, a
# mirror of bench/node_modules made of symlinks in which the addon's folder lists every file but
# the other libggml-cpu-*.so, and node runs with --preserve-symlinks (so the package resolves, and
# the addon's folder is taken, at the mirror's path). node_modules itself is never changed.
# bench/llamacpp.mjs --cpu-variant then checks, from /proc/self/maps, that ggml loaded that one.

LLAMACPP_PKG_REL=@node-llama-cpp/linux-x64
LLAMACPP_BINS_REL=$LLAMACPP_PKG_REL/bins/linux-x64

# The variants the package ships, one per line.
llamacpp_cpu_variants() {
    local f
    for f in "$1/$LLAMACPP_BINS_REL"/libggml-cpu-*.so; do
        f=${f##*/libggml-cpu-}; echo "${f%.so}"
    done
}

# llamacpp_cpu_mirror NODE_MODULES VARIANT OUTDIR: (re)makes OUTDIR/node_modules and
# OUTDIR/llamacpp.mjs; prints nothing. Fails when the package does not ship VARIANT.
llamacpp_cpu_mirror() {
    local nm=$1 variant=$2 out=$3 e f
    nm=$(cd "$nm" && pwd -P)
    if [ ! -f "$nm/$LLAMACPP_BINS_REL/libggml-cpu-$variant.so" ]; then
        echo "llama.cpp CPU variant '$variant' is not shipped; the package has:" \
             "$(llamacpp_cpu_variants "$nm" | tr '\n' ' ')" >&2
        return 2
    fi
    rm -rf "$out"
    mkdir -p "$out/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
    for e in "$nm"/* "$nm"/.[!.]*; do
        [ -e "$e" ] || continue
        case "${e##*/}" in @node-llama-cpp) continue ;; esac
        ln -s "$e" "$out/node_modules/${e##*/}"
    done
    for e in "$nm"/@node-llama-cpp/*; do
        case "${e##*/}" in linux-x64) continue ;; esac
        ln -s "$e" "$out/node_modules/@node-llama-cpp/${e##*/}"
    done
    for e in "$nm/$LLAMACPP_PKG_REL"/*; do
        case "${e##*/}" in bins) continue ;; esac
        ln -s "$e" "$out/node_modules/$LLAMACPP_PKG_REL/${e##*/}"
    done
    for f in "$nm/$LLAMACPP_BINS_REL"/*; do
        case "${f##*/}" in
        libggml-cpu-"$variant".so) ;;
        libggml-cpu-*.so) continue ;;   # the variants ggml must not see
        esac
        ln -s "$f" "$out/node_modules/$LLAMACPP_BINS_REL/${f##*/}"
    done
    ln -s "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/llamacpp.mjs" "$out/llamacpp.mjs"
}
