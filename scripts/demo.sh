#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build,
# and serve the shipped demo model (sampan serve).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
make -j"$(nproc)" >/dev/null
# The main job: the server with the shipped demo model on http://127.0.0.1:8000
# (pass flags through, e.g. --port 9000; `sampan run` for a one-off story).
exec ./build/sampan serve "$@"
