#!/usr/bin/env bash
# scripts/minimal-rootfs.sh OUT [SAMPAN [BACKENDS_DIR]] - the root file system of the minimal image:
# the binary, the backend plugins, every shared library they load (their ldd closure, with the
# dynamic loader), the CA certificates (for the OTLP exporter's HTTPS), an empty /tmp and the
# demo model as a one-model repository at /models. deploy/Dockerfile's `minimal` target puts
# OUT on `FROM scratch`; tests/py/test_image.py builds the same image from this tree's build.
# Nothing else is in it: no shell, no package manager, no libc tools.
set -euo pipefail
out=${1:?usage: minimal-rootfs.sh OUT [SAMPAN [BACKENDS_DIR]]}
bin=${2:-build/sampan}
backends=${3:-$(dirname "$bin")/backends}
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$bin" ] || { echo "minimal-rootfs: $bin is not an executable (make first)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/usr/lib/sampan/backends" "$out/etc/ssl/certs" "$out/tmp" \
         "$out/models/stories260K/1"
chmod 1777 "$out/tmp"
cp "$bin" "$out/usr/local/bin/sampan"
elfs=("$bin")
if [ -d "$backends" ]; then
    for so in "$backends"/libsampan_*.so; do
        [ -e "$so" ] || continue
        cp "$so" "$out/usr/lib/sampan/backends/"
        elfs+=("$so")
    done
fi
# Every library of the closure at the path the loader found it (the soname's path, the file
# behind the symlink), so the default search path finds it in the image too.
missing=$(for e in "${elfs[@]}"; do ldd "$e"; done | awk '/not found/ {print $1}' | sort -u)
if [ -n "$missing" ]; then
    echo "minimal-rootfs: libraries not found: $missing" >&2
    exit 1
fi
for lib in $(for e in "${elfs[@]}"; do ldd "$e"; done |
             awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u); do
    mkdir -p "$out$(dirname "$lib")"
    cp -L "$lib" "$out$lib"
done
# /lib64 -> the loader's real directory on merged-/usr systems: the ELF interpreter path.
interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [ -n "$interp" ] && [ ! -e "$out$interp" ]; then
    mkdir -p "$out$(dirname "$interp")"
    cp -L "$interp" "$out$interp"
fi
cp -L /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/ca-certificates.crt"
cp "$root/models/stories260K.gguf" "$out/models/stories260K/1/stories260K.gguf"
printf '{"backend": "llm"}\n' > "$out/models/stories260K/config.json"
# A numeric user only (USER 10001:10001); /etc/passwd names it for tools that look.
printf 'sampan:x:10001:10001::/nonexistent:/sbin/nologin\n' > "$out/etc/passwd"
printf 'sampan:x:10001:\n' > "$out/etc/group"
chmod -R a+rX "$out"
