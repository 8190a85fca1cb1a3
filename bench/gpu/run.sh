#!/usr/bin/env bash
# bench/gpu/run.sh - the one GPU check, for a machine with an NVIDIA GPU (written for an
# H200, sm_90), within 8 minutes. Prints PASS/FAIL lines and ends with
#   gpu-run: N passed, N failed
#
#   1. builds sampan and the CUDA library (make cuda), -j of the machine
#   2. the kernel test: every CUDA op against the CPU reference kernels (tests/gpu/kernel_test.c)
#   3. the host tests (the GPU path on the host emulation; sanity that the build is the same)
#   4. the demo model (stories260K) greedy on the GPU == on the CPU, 200 tokens
#   5. `sampan serve` with a repository model placed KIND_GPU: the same completion as on the CPU
#   6. a random-weight 1.1B llama (tools/gguf_gen.py --preset tinyllama, F16): GPU vs CPU greedy,
#      then decode at batch 1, 8, 64, prefill 512, the D2D copy bandwidth and decode's share of it
#
# Usage: bench/gpu/run.sh [BUILD_DIR]   (default build-gpu; set PYTHON for another python3)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu}
PY=${PYTHON:-/usr/bin/python3}
J=$(nproc)
T0=$(date +%s)
pass=0; fail=0
ok() { echo "PASS $*"; pass=$((pass + 1)); }
ko() { echo "FAIL $*"; fail=$((fail + 1)); }
elapsed() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
finish() { elapsed "done"; echo "gpu-run: $pass passed, $fail failed"; exit $(( fail > 0 )); }

elapsed "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 \
    || echo "(no nvidia-smi)"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -n 2

elapsed "1. build"
if make BUILD="$B" -j"$J" all >"/tmp/gpu-build-$$.log" 2>&1 &&
   make BUILD="$B" -j"$J" cuda >>"/tmp/gpu-build-$$.log" 2>&1; then
    ok "build (sampan, libsampan_cuda.so for sm_80/89/90, tests)"
else
    tail -n 30 "/tmp/gpu-build-$$.log"; ko "build"; finish
fi

elapsed "2. kernel test"
if timeout 120 "$B/gpu_kernel_test" "$B/libsampan_cuda.so" | tee "/tmp/gpu-kt-$$.log" &&
   grep -q " 0 failed, 0 skipped" "/tmp/gpu-kt-$$.log"; then
    ok "kernel test"
else
    ko "kernel test"
fi

elapsed "3. host tests (fake device)"
if timeout 60 "$B/test_cuda_host" "$B/libfake_cuda.so" | tail -n 1 | grep -q " 0 failed"; then
    ok "host tests"
else
    ko "host tests"
fi

export SAMPAN_CUDA_LIB="$PWD/$B/libsampan_cuda.so"
elapsed "4. demo model, greedy GPU vs CPU"
if timeout 120 "$B/gpu_bench" check models/stories260K.gguf 200; then
    ok "demo model greedy"
else
    ko "demo model greedy"
fi

elapsed "5. sampan serve, KIND_GPU repository model"
if timeout 120 "$PY" - "$B/sampan" <<'EOF'
import json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.request
binary = sys.argv[1]
tmp = tempfile.mkdtemp()
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def serve(args):
    p = port()
    log = open(os.path.join(tmp, "serve-%d.log" % p), "w")
    proc = subprocess.Popen([binary, "serve", "--port", str(p)] + args, stdout=log, stderr=log)
    for _ in range(300):
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/v2/health/ready" % p, timeout=1)
            return proc, p, log.name
        except Exception:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    print(open(log.name).read()[-2000:])
    raise SystemExit("server did not become ready")
def complete(p):
    body = json.dumps({"model": "stories", "prompt": "Once upon a time", "max_tokens": 64,
                       "temperature": 0}).encode()
    r = urllib.request.urlopen(urllib.request.Request(
        "http://127.0.0.1:%d/v1/completions" % p, body, {"Content-Type": "application/json"}),
        timeout=60)
    return json.load(r)["choices"][0]["text"]
repo = os.path.join(tmp, "repo")
os.makedirs(os.path.join(repo, "stories", "1"))
shutil.copy("models/stories260K.gguf", os.path.join(repo, "stories", "1", "model.gguf"))
with open(os.path.join(repo, "stories", "config.json"), "w") as f:
    json.dump({"backend": "llm", "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}]}, f)
cpu, pc, _ = serve(["--model", "stories=models/stories260K.gguf"])
gpu, pg, glog = serve(["--model-repository", repo])
try:
    a, b = complete(pc), complete(pg)
    placed = "event=gpu_placement" in open(glog).read()
    print("cpu: %r\ngpu: %r\ngpu placement logged: %s" % (a[:120], b[:120], placed))
    sys.exit(0 if a == b and placed else 1)
finally:
    cpu.terminate(); gpu.terminate(); cpu.wait(10); gpu.wait(10)
EOF
then
    ok "serve KIND_GPU completion equals the CPU's"
else
    ko "serve KIND_GPU"
fi

elapsed "6. random-weight 1.1B llama (F16)"
M="$B/tinyllama-random-f16.gguf"
if [ ! -s "$M" ]; then
    timeout 200 "$PY" tools/gguf_gen.py "$M" --preset tinyllama --type f16 -q || { rm -f "$M"; ko "gguf_gen"; finish; }
fi
ls -la "$M"
if timeout 120 "$B/gpu_bench" check "$M" 16; then
    ok "1.1B greedy GPU vs CPU (16 tokens)"
else
    ko "1.1B greedy GPU vs CPU (random weights: a near tie can part them; see the logits)"
fi
timeout 180 "$B/gpu_bench" perf "$M" | tee "/tmp/gpu-perf-$$.log"
grep -q "^PASS decode batch 1" "/tmp/gpu-perf-$$.log" && ok "decode bandwidth target" || ko "decode bandwidth target"
grep -q "^PASS batched decode" "/tmp/gpu-perf-$$.log" && ok "batched decode scaling" || ko "batched decode scaling"
finish
