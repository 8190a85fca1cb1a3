#!/usr/bin/env bash
# Runs every suite and ends with one summary line:
#   total: N passed, N failed, N skipped
#
#   0. the layer checks (scripts/check-includes.sh, scripts/check-cycles.py on the release build)
#   1. C unit tests, release build            (build/test_unit); then the engine-level ones
#      (kernels, K-quants, attention, forward, batch) again at each CPU kernel level below the
#      best (SAMPAN_CPU=scalar, avx2, avx2-vnni, ...), a level this CPU lacks as one skipped line
#   2. C unit tests, ASan + UBSan build       (build-san/test_unit), and the bad-input, HTTP
#      security and liveness suites (SAN_SUITES) against build-san/sampan
#   3. Python suites in tests/py/test_*.py    (NumPy reference, CLI checks)
#   4. arm64: the cross build's kernel and engine tests under qemu-aarch64 (tests/arm64.sh;
#      one skipped line without the cross compiler or qemu)
# Each suite prints "<suite>: N passed, N failed, N skipped" as its last line.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
PY=${PYTHON:-/usr/bin/python3}
passed=0; failed=0; skipped=0; broken=0
times=() # "seconds suite" of each Python suite, for the time line at the end

tally() { # parse the last "N passed, N failed, N skipped" line of a log
    local line
    line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
    # Each failing test's line and the lines just before it that are not passing tests or log
    # lines (its assertion messages), kept for the end: CI shows only the tail of the output,
    # and the summary must say which test failed.
    grep -E -B 4 '^(\[[^]]*\] )*FAIL' "$1" | grep -v -E '^(\[[^]]*\] )*(ok |ts=)|^--$' |
        sed "s|^|$2: |" | head -n 40 >>"$log/failures.txt"
    if [ -z "$line" ]; then broken=$((broken + 1)); echo "run: $2 printed no summary"; return; fi
    passed=$((passed + $(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line")))
    failed=$((failed + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")))
    if grep -q skipped <<<"$line"; then
        skipped=$((skipped + $(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$line")))
    fi
}

log=$(mktemp -d)
echo "== build (release)"
make -j"$JOBS" unit >"$log/build.txt" 2>&1 || { cat "$log/build.txt"; echo "total: 0 passed, 1 failed"; exit 1; }
# The layers of docs/design.md: the never-include table on the sources, and no circle of objects
# (or folders) calling each other in the symbols of the release build.
echo "== layers (scripts/check-includes.sh, scripts/check-cycles.py)"
{
    lp=0; lf=0
    if ./scripts/check-includes.sh; then lp=$((lp + 1)); else lf=$((lf + 1)); fi
    if "$PY" scripts/check-cycles.py build; then lp=$((lp + 1)); else lf=$((lf + 1)); fi
    echo "layers: $lp passed, $lf failed, 0 skipped"
} 2>&1 | tee "$log/layers.txt"; tally "$log/layers.txt" layers
echo "== unit tests (release)"
./build/test_unit 2>&1 | tee "$log/unit.txt"; tally "$log/unit.txt" unit

# The engine-level tests at the lower kernel levels too, so a machine with AVX-512 also runs
# the AVX2 and scalar paths through the whole engine (about 10 s of CPU time a level). The
# levels come from the dispatcher itself (cpuid and XGETBV), through kernels_cpu_levels.
ENGINE_TESTS=(test_kernels.c test_kquants.c test_attn.c test_forward.c test_batch.c test_repack_model.c test_moe_pack.c)
levels=$(./build/test_unit kernels_cpu_levels 2>&1 | sed -n 's/^ *cpu levels: *//p' | tail -n 1)
if [ -z "$levels" ]; then
    broken=$((broken + 1)); echo "run: kernels_cpu_levels printed no levels"
fi
best=${levels##* }
for lvl in scalar avx2 avx2-vnni avx512 amx; do
    [ -n "$levels" ] && [ "$lvl" != "$best" ] || continue
    echo "== unit tests, engine level, SAMPAN_CPU=$lvl"
    if grep -qw "$lvl" <<<"$levels"; then
        SAMPAN_CPU=$lvl ./build/test_unit "${ENGINE_TESTS[@]}" 2>&1 |
            sed "s/^/[$lvl] /" | tee "$log/unit-$lvl.txt"
    else
        echo "[$lvl] unit: 0 passed, 0 failed, 1 skipped (this CPU has no $lvl)" |
            tee "$log/unit-$lvl.txt"
    fi
    tally "$log/unit-$lvl.txt" "unit-$lvl"
done

# The official npm clients the suites drive (openai, @grpc/grpc-js, ...; tests/node's lock
# file), installed once before any suite, so that the sanitizer suites below have them too; a
# suite whose client is missing says so in a skipped line. node-llama-cpp is there only for
# its prebuilt llama.cpp (tests/py/llamacpp_ref.py): NODE_LLAMA_CPP_SKIP_DOWNLOAD keeps its
# install from downloading or building anything, and --omit=optional leaves out its GPU and
# other-platform binaries (the linux-x64 one is a direct dependency; so is re2-wasm, the
# kubernetes-models validator's optional regex engine, so that it stays).
if [ ! -d tests/node/node_modules ] && command -v npm >/dev/null 2>&1; then
    echo "== npm ci (tests/node)"
    NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --prefix tests/node --omit=optional --no-audit \
        --no-fund --prefer-offline >"$log/npm.txt" 2>&1 ||
        { tail -n 20 "$log/npm.txt"; echo "run: npm ci in tests/node failed; the suites that need it skip"; }
fi

# test_hf_hub.py: the hub client against a hostile stand-in; test_onnx_server.py: the ONNX
# plugin (ASan build) parsing files and requests in the server.
# test_image_inputs.py: the JPEG and PNG decoders fed truncated, corrupt and oversized images.
SAN_SUITES=(test_bad_inputs.py test_http_security.py test_liveness.py test_hf_hub.py test_onnx_server.py
            test_image_inputs.py)
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
    echo "== build (ASan+UBSan)"
    make -j"$JOBS" SANITIZER=1 unit >"$log/build-san.txt" 2>&1 || { cat "$log/build-san.txt"; echo "total: 0 passed, 1 failed"; exit 1; }
    echo "== unit tests (ASan+UBSan)"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        SAMPAN_TEST_SANITIZER=1 ./build-san/test_unit 2>&1 | sed 's/^/[san] /' | tee "$log/unit-san.txt"
    tally "$log/unit-san.txt" unit-san
    # The suites whose faults are memory faults (RELIABILITY.md's bad-input tables, the HTTP
    # transport's attacks and half-closes, requests freed while prepared on a worker) run
    # against the sanitizer build of the binary; the loop below skips them then: one run each,
    # under ASan+UBSan.
    for t in "${SAN_SUITES[@]}"; do
        echo "== tests/py/$t (ASan+UBSan binary)"
        SAMPAN_BIN=build-san/sampan ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
            "$PY" "tests/py/$t" 2>&1 | sed 's/^/[san] /' | tee "$log/san-py.txt"
        tally "$log/san-py.txt" "$t-san"
    done
    san_done=1
fi

for t in tests/py/test_*.py; do
    [ -e "$t" ] || continue
    [ "${san_done:-0}" = 1 ] && [[ " ${SAN_SUITES[*]} " == *" ${t##*/} "* ]] && continue
    echo "== $t"
    t0=$SECONDS
    "$PY" "$t" 2>&1 | tee "$log/py.txt"; tally "$log/py.txt" "$t"
    times+=("$((SECONDS - t0)) $t")
done

echo "== arm64 (cross build, qemu-aarch64)"
t0=$SECONDS
./tests/arm64.sh 2>&1 | tee "$log/arm64.txt"; tally "$log/arm64.txt" arm64
times+=("$((SECONDS - t0)) arm64")

if [ -s "$log/failures.txt" ]; then
    echo "failures (each failing line and the messages just before it, per suite):"
    head -n 200 "$log/failures.txt"
fi
rm -rf "$log"
# The suite must stay under 30 minutes on 2 cores: the wall time, and the slowest suites.
echo "time: $SECONDS s in all; slowest suites (s): $(printf '%s\n' "${times[@]}" | sort -rn | head -n 5 | tr '\n' ' ')"
echo "total: $passed passed, $((failed + broken)) failed, $skipped skipped"
[ $((failed + broken)) -eq 0 ]
