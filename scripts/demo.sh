#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build,
# and serve the shipped demo model (sampan serve).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
# Build with one progress line per compiled file ("[12/180] src/api/openai.c"); the full
# output goes to build/demo-make.log and is shown when the build fails.
mkdir -p build
total=$(make -n 2>/dev/null | grep -c -E ' -c [^ ]+\.c ' || true)
n=0
set +e
make -j"$(nproc)" 2>&1 | tee build/demo-make.log | while IFS= read -r line; do
    if [[ $line =~ \ -c\ ([^ ]+\.c)\  ]]; then
        n=$((n + 1))
        printf '[%d/%d] %s\n' "$n" "$total" "${BASH_REMATCH[1]}"
    fi
done
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
    tail -n 40 build/demo-make.log
    echo "demo: the build failed (full log: build/demo-make.log)" >&2
    exit "$rc"
fi
echo "demo: built build/sampan; serving the demo model (a 260K-parameter toy that writes children's stories)"
# The main job: the server with the shipped demo model on http://127.0.0.1:8000
# (pass flags through, e.g. --port 9000; `sampan run` for a one-off story).
exec ./build/sampan serve "$@"
