#!/usr/bin/env bash
# Module boundaries (STYLE.md): who may include whom. Fails on a forbidden #include.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
check() { # dir, forbidden-pattern, reason
    local hits
    hits=$(grep -rnE "#include \"($2)" "$1" 2>/dev/null || true)
    if [ -n "$hits" ]; then echo "$hits"; echo "  ^ $3"; bad=1; fi
}
check src/core    'engine/|kernels/|server/|sched/|repo/|backends/|tools/' "core depends on libc only"
check src/kernels 'engine/|server/|sched/|repo/|backends/|tools/|core/pool' "kernels are pure math"
check src/engine  'kernels/cpu/|kernels/cuda/|server/|sched/|tools/' "engine sees kernels.h only"
[ $bad -eq 0 ] && echo "check-includes: ok"
exit $bad
