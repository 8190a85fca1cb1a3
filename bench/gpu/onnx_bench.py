"""bench/gpu/onnx_bench.py - ResNet-50 (224x224, random weights, tests/py/onnx_gpu_models.py) on the
ONNX backend's GPU executor (libsampan_onnx_cuda.so: cuDNN, cuBLAS), for bench/gpu/run.sh.

    python3 bench/gpu/onnx_bench.py BUILD_DIR [SECONDS_PER_POINT] [--emulate]

--emulate runs the same steps on the host emulation (libfake_onnx_cuda.so, a fake NVML GPU) with
a narrow 32x32 copy of the graph: tests/py/test_onnx_gpu.py does, so that the one GPU run does not
stop on an argument or a setup error. Its numbers mean nothing.

1. In-process over the backend ABI (tests/py/onnx_plugin.py), KIND_GPU: batch 1, 8 and 32 in FP32
   and FP16; per point a warm-up run (the convolution algorithms are measured there, once per
   shape), then runs for about SECONDS_PER_POINT (default 3): images/s and the median and p90
   latency of one batch (host to host: upload, graph, download). One line per point:
       RESULT onnx label=resnet50-fp16 batch=8 images_s=... ms_p50=... ms_p90=...
2. Through `sampan serve` (the model in a repository, KIND_GPU, FP16, max_batch_size 32): 32
   concurrent clients each posting one image (KServe v2 binary tensors) for about 2 x SECONDS,
   once with the dynamic batcher (max_queue_delay_microseconds 2000) and once without:
       RESULT onnx-serve label=dynamic-batching images_s=... ms_p50=... ms_p90=...
       RESULT onnx-serve label=unbatched ...
Exit status 0 when every point ran."""
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))


def timed(fn, seconds):
    fn()  # warm-up: algorithm search, pool growth
    lat = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(lat) < 3:
        t = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t)
    return lat


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


SIZE = 224


def serve_bench(build, repo, label, seconds, clients=32):
    import numpy as np
    port = free_port()
    log = open(os.path.join(repo, f"serve-{label}.log"), "w")
    p = subprocess.Popen([os.path.join(build, "sampan"), "serve", "--model-repository", repo, "--port", str(port)],
                         stdout=log, stderr=log, cwd=ROOT)
    try:
        ready = False
        for _ in range(600):  # the load includes the upload and, on the first batch, cuDNN's search
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/v2/models/resnet/ready")
                ready = c.getresponse().status == 200
                c.close()
            except OSError:
                pass
            if ready or p.poll() is not None:
                break
            time.sleep(0.2)
        if not ready:
            print(f"FAIL serve {label}: model not ready (log {log.name})")
            return False
        x = np.random.default_rng(1).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
        head = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, SIZE, SIZE],
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "outputs": [{"name": "probs", "parameters": {"binary_data": True}}]}).encode()
        body = head + x.tobytes()
        hdr = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
        lat, errors = [], []
        lock = threading.Lock()

        def client(stop):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            first = True
            while time.perf_counter() < stop:
                t = time.perf_counter()
                try:
                    c.request("POST", "/v2/models/resnet/infer", body, hdr)
                    r = c.getresponse()
                    r.read()
                    ok = r.status == 200
                except OSError as e:
                    ok = False
                    r = e
                with lock:
                    if not ok:
                        errors.append(str(getattr(r, "status", r)))
                    elif not first:
                        lat.append(time.perf_counter() - t)
                first = False
            c.close()

        # warm-up, not counted: the batcher forms batches of many sizes, and the first batch of
        # each size bucket has cuDNN measure its convolution algorithms
        for measured in (False, True):
            if not measured:
                warm = max(1.0, seconds / 2)
            lat.clear()
            t0 = time.perf_counter()
            th = [threading.Thread(target=client, args=(t0 + (seconds if measured else warm),)) for _ in range(clients)]
            for t in th:
                t.start()
            for t in th:
                t.join()
        wall = time.perf_counter() - t0
        if errors or not lat:
            print(f"FAIL serve {label}: {len(errors)} errors ({errors[:3]}), {len(lat)} answers")
            return False
        lat.sort()
        print(f"RESULT onnx-serve label={label} clients={clients} images_s={len(lat) / wall:.1f} "
              f"ms_p50={1e3 * lat[len(lat) // 2]:.2f} ms_p90={1e3 * lat[int(len(lat) * 0.9)]:.2f}", flush=True)
        return True
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()


def main():
    import numpy as np
    from onnx_gpu_models import build_resnet50
    from onnx_plugin import Plugin
    global SIZE
    args = [a for a in sys.argv[1:] if a != "--emulate"]
    emulate = "--emulate" in sys.argv
    build = args[0] if args else "build-gpu"
    seconds = float(args[1]) if len(args) > 1 else 3.0
    tmp = tempfile.mkdtemp(prefix="onnx-gpu-bench-")
    repo = os.path.join(tmp, "repo")
    vdir = os.path.join(repo, "resnet", "1")
    os.makedirs(vdir)
    if emulate:
        SIZE = 32
        os.environ["SAMPAN_ONNX_CUDA_LIB"] = os.path.abspath(os.path.join(build, "libfake_onnx_cuda.so"))
        os.environ["SAMPAN_NVML_LIB"] = os.path.abspath(os.path.join(build, "libfake_nvml.so"))
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        build_resnet50(os.path.join(vdir, "model.onnx"), np.random.default_rng(50), size=32, width=4, classes=10)
    else:
        build_resnet50(os.path.join(vdir, "model.onnx"), np.random.default_rng(50))
    plugin = Plugin(os.path.join(build, "backends", "libsampan_onnx.so"))
    ok = True
    rng = np.random.default_rng(2)
    for prec in ("fp32", "fp16"):
        cfg = {"instance_group": [{"kind": "KIND_GPU", "count": 1}],
               "parameters": {"precision": {"string_value": prec}}}
        try:
            m = plugin.load(vdir, config=cfg, max_batch_size=32)
        except Exception as e:
            print(f"FAIL load resnet50 {prec}: {e}")
            ok = False
            continue
        for b in (1, 8, 32):
            x = [rng.standard_normal((b, 3, SIZE, SIZE)).astype(np.float32)]
            try:
                lat = timed(lambda: m.run(x, ["probs"]), seconds)
            except Exception as e:
                print(f"FAIL resnet50 {prec} batch {b}: {e}")
                ok = False
                continue
            lat.sort()
            print(f"RESULT onnx label=resnet50-{prec} batch={b} images_s={b * len(lat) / sum(lat):.1f} "
                  f"ms_p50={1e3 * statistics.median(lat):.2f} ms_p90={1e3 * lat[int(len(lat) * 0.9)]:.2f}", flush=True)
        m.close()
    for label, batching in (("dynamic-batching", True), ("unbatched", False)):
        cfg = {"name": "resnet", "backend": "onnx", "max_batch_size": 32,
               "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}],
               "parameters": {"precision": {"string_value": "fp16"}}}
        if batching:
            cfg["dynamic_batching"] = {"max_queue_delay_microseconds": 2000}
        with open(os.path.join(repo, "resnet", "config.json"), "w") as f:
            json.dump(cfg, f)
        ok &= serve_bench(build, repo, label, max(1.5, 2 * seconds))
    print(f"onnx-bench: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
