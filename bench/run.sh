#!/usr/bin/env bash
# bench/run.sh - the engine benchmark, side by side with llama.cpp, same machine, same run.
#
#   bench/run.sh [--types "f16 q8_0 q4_0"] [--prompt 512] [--gen 64] [--runs 3]
#                [--threads 2] [--quick] [--no-llamacpp] [--no-sampan] [--wait-quiet SECS]
#                [--shape tinyllama|moe-1b] [--no-repack] [--llamacpp-cpu VARIANT]
#                [--kv-type f32|f16|q8_0]
#
# For each type it runs, one after the other (never in parallel: the machine has
# 2 cores and both engines use both):
#   - our engine:  $SAMPAN eval -m FILE --tokens IDS --gen G -t 2 --profile   (RUNS processes;
#                  the profile, two clock reads per pool job, is about 0.05% of a step here, and
#                  gives the table of where the decode step went; left out for a SAMPAN=...
#                  binary that does not know the flag)
#   - llama.cpp:   node bench/llamacpp.mjs -m FILE --tokens IDS --gen G -t 2 (RUNS runs)
# on the same TinyLlama-1.1B-shaped random-weight model (--shape moe-1b: a 1B-class
# Qwen3-MoE shape, 8 experts, top-2; tools/gguf_gen.py's presets) and the same prompt ids,
# --llamacpp-cpu VARIANT runs llama.cpp with only that one of the prebuilt package's CPU backend
# variants (haswell = AVX2+FMA+F16C, skylakex / icelake / zen4 = AVX-512 kinds, sse42, x64, ...;
# bench/llamacpp_cpu.sh) instead of the best one for this CPU: with SAMPAN_CPU=avx2 in the
# environment, both engines at the AVX2 level on an AVX-512 host. The table says which variant
# ggml loaded and at which level our engine ran. --kv-type: our engine's KV cache type (default
# its own default, F32; llama.cpp's cache is F16 by default, so f16 compares like with like).
# Plus, for our engine, bench/step_bench: each decode step paired with a plain read of the
# weight bytes it streams (its share of the read, which the host's drift between minutes
# does not move).
# Plus bench/membw (read/copy bandwidth) before and after, and prints a markdown
# table with the decode limit = read bandwidth (2 threads) / weight bytes read per
# token. Results: bench/out/<stamp>/ (raw logs, results.json, table.md) and
# bench/out/latest -> that folder.
#
# Models are made once with tools/gguf_gen.py into bench/models/ (about 4 GB for
# the three) and reused. Environment:
#   BUILD=build          build folder of the engine (`make BUILD=...`), membw goes there too
#   SAMPAN=...          an engine binary to use as is (default: make $BUILD/sampan first)
#   STEP_BENCH=...      a step_bench binary to use as is (default: make $BUILD/step_bench, unless
#                       SAMPAN is given: then no paired share unless this is given too)
#   PYTHON=/usr/bin/python3 (Debian's, with python3-numpy for the generator)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

TYPES="f16 q8_0 q4_0"
PROMPT=512
GEN=64
RUNS=3
THREADS=2
DO_LLAMACPP=1
DO_SAMPAN=1
WAIT_QUIET=0
REPACK_ARG=            # --no-repack: the engine keeps the file's weight layout (A/B)
KV_TYPE=               # --kv-type: our engine's KV cache type (empty: its default)
BUILD=${BUILD:-build}
SAMPAN_GIVEN=${SAMPAN:+1}
SAMPAN=${SAMPAN:-$BUILD/sampan}
PYTHON=${PYTHON:-/usr/bin/python3}
VOCAB_FROM=${VOCAB_FROM:-}
SHAPE=tinyllama
LLAMACPP_CPU=          # --llamacpp-cpu: one of the prebuilt's libggml-cpu-VARIANT.so only

while [ $# -gt 0 ]; do
    case "$1" in
    --types) TYPES=$2; shift 2 ;;
    --shape) SHAPE=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --quick) PROMPT=128; GEN=16; RUNS=1; shift ;;
    --no-llamacpp) DO_LLAMACPP=0; shift ;;
    --no-sampan) DO_SAMPAN=0; shift ;;
    --no-repack) REPACK_ARG=--no-repack; shift ;;
    --kv-type)
        case "$2" in f32|f16|q8_0) KV_TYPE=$2 ;;
        *) echo "run.sh: --kv-type must be f32, f16 or q8_0" >&2; exit 2 ;; esac
        shift 2 ;;
    --wait-quiet) WAIT_QUIET=$2; shift 2 ;;
    --llamacpp-cpu) LLAMACPP_CPU=$2; shift 2 ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# cpu_busy_pct and busy_jiffies (bench/lib.sh): other work on the machine makes both engines
# (whose threads wait on each other) much slower, so it is recorded. The wait below is this
# script's own, stricter than lib.sh's (5% busy, and none unless --wait-quiet is given).
. "$ROOT/bench/lib.sh"

# Before each timed command: wait (up to WAIT_QUIET s) until the machine is idle.
wait_quiet() {
    [ "$WAIT_QUIET" -gt 0 ] || return 0
    local start=$SECONDS b
    while :; do
        b=$(cpu_busy_pct)
        if [ "$b" -le 5 ]; then return 0; fi
        if [ $(( SECONDS - start )) -ge "$WAIT_QUIET" ]; then
            say "still ${b}% busy after ${WAIT_QUIET}s of waiting; running anyway"
            return 0
        fi
    done
}

# measured NAME CMD...: run CMD with stderr to NAME.log, and write NAME.cpu with
# the wall time, the command's own CPU time, and the CPU time that everything
# else on the machine used meanwhile (other work steals cycles from threads that
# wait on each other, so this says how far a number can be trusted).
measured() {
    local name=$1; shift
    wait_quiet
    local j0 j1 t0 t1 rc=0 tf
    tf=$(mktemp)
    j0=$(busy_jiffies); t0=$(date +%s.%N)
    { TIMEFORMAT='%U %S'; time "$@" 2> "$name.log"; } 2> "$tf" || rc=$?
    t1=$(date +%s.%N); j1=$(busy_jiffies)
    read -r u s < "$tf" || true
    rm -f "$tf"
    "$PYTHON" -c "
import json, os
hz = os.sysconf('SC_CLK_TCK'); wall = $t1 - $t0; own = ${u:-0} + ${s:-0}
busy = ($j1 - $j0) / hz; other = max(0.0, busy - own)
json.dump({'wall_s': round(wall, 3), 'own_cpu_s': round(own, 3), 'other_cpu_s': round(other, 3),
           'other_pct_of_machine': round(100 * other / (wall * os.cpu_count()), 1)},
          open('$name.cpu', 'w'))"
    return $rc
}

# ---- tools ------------------------------------------------------------------
mkdir -p "$BUILD" bench/models bench/out
if [ "$DO_SAMPAN" = 1 ] && [ -z "$SAMPAN_GIVEN" ]; then
    say "make $SAMPAN (incremental: the numbers are for the tree as it is)"
    make BUILD="$BUILD" "$SAMPAN" > "$BUILD/bench-make.log" 2>&1 || {
        tail -20 "$BUILD/bench-make.log" >&2; say "build failed"; exit 1; }
fi
# step_bench: each decode step paired with a plain read of its weight bytes (the share that
# the host's drift between minutes cannot move; bench/step_bench.c)
# (built from the tree like $SAMPAN; with SAMPAN=... given, only when STEP_BENCH=... is too)
if [ -z "${STEP_BENCH:-}" ] && [ "$DO_SAMPAN" = 1 ] && [ -z "$SAMPAN_GIVEN" ]; then
    STEP_BENCH=$BUILD/step_bench
    make BUILD="$BUILD" "$STEP_BENCH" >> "$BUILD/bench-make.log" 2>&1 || {
        tail -20 "$BUILD/bench-make.log" >&2; say "building $STEP_BENCH failed"; exit 1; }
fi
# where each decode step went (eval --profile); a SAMPAN=... binary older than the flag runs
# without it (no such table then)
PROFILE_ARG=
if [ "$DO_SAMPAN" = 1 ] && "$SAMPAN" eval --help 2>/dev/null | grep -q -- '--profile'; then
    PROFILE_ARG=--profile
fi
MEMBW=$BUILD/membw
if [ ! -x "$MEMBW" ] || [ bench/membw.c -nt "$MEMBW" ] || [ bench/read_sum.h -nt "$MEMBW" ]; then
    say "building $MEMBW"
    ${CC:-cc} -std=c11 -O3 -march=native -Wall -Wextra -pthread -o "$MEMBW" bench/membw.c
fi
if [ "$DO_LLAMACPP" = 1 ] && [ ! -d bench/node_modules/@node-llama-cpp/linux-x64 ]; then
    say "installing node-llama-cpp (prebuilt CPU binaries, no download or build at run time)"
    # --omit=optional: skip the CUDA/Vulkan/other-platform binaries; the
    # linux-x64 CPU one is a direct dependency. npm does not run the package's
    # postinstall (which could try to fetch or build llama.cpp) unless allowed,
    # and NODE_LLAMA_CPP_SKIP_DOWNLOAD makes sure of it.
    (cd bench && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional --no-audit --no-fund >&2)
fi
export NODE_LLAMA_CPP_SKIP_DOWNLOAD=true
LLAMACPP_MJS=bench/llamacpp.mjs
LLAMACPP_NODE_OPTS=()
if [ "$DO_LLAMACPP" = 1 ] && [ -n "$LLAMACPP_CPU" ]; then
    . "$ROOT/bench/llamacpp_cpu.sh"
    llamacpp_cpu_mirror bench/node_modules "$LLAMACPP_CPU" "bench/out/llamacpp-cpu-$LLAMACPP_CPU" ||
        exit 2
    LLAMACPP_MJS=bench/out/llamacpp-cpu-$LLAMACPP_CPU/llamacpp.mjs
    LLAMACPP_NODE_OPTS=(--preserve-symlinks --preserve-symlinks-main)
    say "llama.cpp with only its $LLAMACPP_CPU CPU backend ($LLAMACPP_MJS)"
fi

# ---- models -----------------------------------------------------------------
if [ -z "$VOCAB_FROM" ]; then
    for v in tests/data/tokenizer/ggml-vocab-llama-spm.gguf \
             ../shared/testdata/tokenizer/ggml-vocab-llama-spm.gguf; do
        if [ -f "$v" ]; then VOCAB_FROM=$v; break; fi
    done
fi
case "$SHAPE" in
tinyllama|moe-1b) ;;
*) echo "bench/run.sh: --shape must be tinyllama or moe-1b" >&2; exit 2 ;;
esac
model_path() { echo "bench/models/$SHAPE-random-$1.gguf"; }
for t in $TYPES; do
    f=$(model_path "$t")
    if [ ! -s "$f" ]; then
        say "generating $f ($SHAPE shape, random weights, $t)"
        args=(--preset "$SHAPE" --type "$t" --seed 1 -q)
        if [ -n "$VOCAB_FROM" ]; then args+=(--vocab-from "$VOCAB_FROM"); fi
        "$PYTHON" tools/gguf_gen.py "$f.tmp" "${args[@]}"
        mv "$f.tmp" "$f"
    fi
done

# ---- run --------------------------------------------------------------------
STAMP=$(date +%Y%m%d-%H%M%S)
RAW=bench/out/$STAMP
mkdir -p "$RAW"
say "results in $RAW"

# The same prompt ids for both engines: xorshift, ids in [3, 32000).
IDS=$("$PYTHON" -c "
x = 2463534242
ids = []
for _ in range($PROMPT):
    x ^= (x << 13) & 0xffffffff; x ^= x >> 17; x ^= (x << 5) & 0xffffffff
    ids.append(3 + x % (32000 - 3))
print(','.join(map(str, ids)))")
echo "$IDS" > "$RAW/prompt.txt"

BUSY_BEFORE=$(cpu_busy_pct)
if [ "$BUSY_BEFORE" -gt 10 ]; then
    say "warning: the CPUs were ${BUSY_BEFORE}% busy before the run; numbers will be low"
fi

say "membw (read/copy bandwidth, 1 and 2 threads)"
wait_quiet
"$MEMBW" --json --runs 10 > "$RAW/membw.json"
cat "$RAW/membw.json" >&2

for t in $TYPES; do
    f=$(model_path "$t")
    echo "$ROOT/$f" > "$RAW/$t.model"
    cat "$f" > /dev/null   # into the page cache, so no run pays for the disk
    wait_quiet
    "$MEMBW" --json --runs 5 --size 512 > "$RAW/membw-$t.json"   # the bandwidth right now
    if [ "$DO_SAMPAN" = 1 ]; then
        for r in $(seq 1 "$RUNS"); do
            say "sampan $t run $r/$RUNS"
            measured "$RAW/$t.sampan.$r" \
                "$SAMPAN" eval -m "$f" --tokens "$IDS" --gen "$GEN" -t "$THREADS" $REPACK_ARG \
                ${KV_TYPE:+--kv-type "$KV_TYPE"} $PROFILE_ARG > /dev/null || {
                say "sampan failed on $t (see $RAW/$t.sampan.$r.log)"; break; }
            grep -E '^(prefill|decode):' "$RAW/$t.sampan.$r.log" >&2 || true
        done
        if [ -n "${STEP_BENCH:-}" ]; then
            say "sampan $t: decode steps paired with reads of their weights (step_bench)"
            wait_quiet
            repack=1
            if [ -n "$REPACK_ARG" ]; then repack=0; fi
            if SAMPAN_REPACK=$repack "$STEP_BENCH" -m "$f" --prompt "$PROMPT" --gen "$GEN" \
                   -t "$THREADS" ${KV_TYPE:+--kv-type "$KV_TYPE"} --json \
                   > "$RAW/$t.step.json" 2> "$RAW/$t.step.log"; then
                cat "$RAW/$t.step.json" >&2
            else
                say "step_bench failed on $t (see $RAW/$t.step.log)"; rm -f "$RAW/$t.step.json"
            fi
        fi
    fi
    if [ "$DO_LLAMACPP" = 1 ]; then
        say "llama.cpp $t ($RUNS runs in one process)"
        measured "$RAW/$t.llamacpp" \
            node "${LLAMACPP_NODE_OPTS[@]}" "$LLAMACPP_MJS" -m "$f" --tokens "$IDS" \
            --gen "$GEN" -t "$THREADS" --runs "$RUNS" ${LLAMACPP_CPU:+--cpu-variant "$LLAMACPP_CPU"} \
            > "$RAW/$t.llamacpp.json" || {
            say "llama.cpp failed on $t (see $RAW/$t.llamacpp.log)"; rm -f "$RAW/$t.llamacpp.json"; }
        grep -E '^llama.cpp (run|CPU backend)' "$RAW/$t.llamacpp.log" >&2 || true
    fi
done

say "membw again (after)"
wait_quiet
"$MEMBW" --json --runs 10 > "$RAW/membw-after.json"
BUSY_AFTER=$(cpu_busy_pct)

# ---- report -----------------------------------------------------------------
NODE_LLAMA=$(node -e "
const p = require('$ROOT/bench/node_modules/node-llama-cpp/package.json');
const i = require('$ROOT/bench/node_modules/node-llama-cpp/llama/llama.cpp.info.json');
console.log(JSON.stringify({node_llama_cpp: p.version, llama_cpp: i}))" 2>/dev/null || echo null)
"$PYTHON" - "$RAW/meta.json" <<EOF
import json, platform, subprocess, sys
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
lscpu = dict(l.split(":", 1) for l in sh("LC_ALL=C lscpu").splitlines() if ":" in l)
flags = lscpu.get("Flags", "").split()
meta = {
    "stamp": "$STAMP", "types": "$TYPES".split(), "prompt_tokens": $PROMPT, "gen_tokens": $GEN,
    "runs": $RUNS, "threads": $THREADS,
    "cpu": lscpu.get("Model name", "").strip(), "cpus": lscpu.get("CPU(s)", "").strip(),
    "simd_flags": [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))],
    "kernel": platform.release(), "mem_total_kb": sh("grep MemTotal /proc/meminfo"),
    "cpu_busy_pct_before": $BUSY_BEFORE, "cpu_busy_pct_after": $BUSY_AFTER,
    "sampan": sh("$SAMPAN --version 2>&1 | head -1") if $DO_SAMPAN else None,
    "sampan_commit": sh("git rev-parse --short HEAD") + ("+dirty" if sh("git status --porcelain --untracked-files=no") else ""),
    "peer": json.loads('''$NODE_LLAMA'''),
    "sampan_cpu_env": "${SAMPAN_CPU:-}" or None, "llamacpp_cpu_variant": "$LLAMACPP_CPU" or None,
    "sampan_kv_type": "$KV_TYPE" or None,
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
"$PYTHON" bench/report.py "$RAW"
ln -sfn "$STAMP" bench/out/latest
say "done: $RAW/results.json, $RAW/table.md"
