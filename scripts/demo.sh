#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build,
# and generate a story with the shipped demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
make -j"$(nproc)" >/dev/null
exec ./build/sampan run -m models/stories260K.gguf -p "${PROMPT:-Once upon a time}" -n "${N:-200}" "$@"
