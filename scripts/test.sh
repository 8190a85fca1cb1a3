#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: install what is missing,
# build (release and ASan+UBSan), run every test. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh --test
exec ./tests/run.sh "$@"
