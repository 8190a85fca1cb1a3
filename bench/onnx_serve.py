#!/usr/bin/python3
"""bench/onnx_serve.py - ResNet-50 (random weights, tests/py/onnx_models.py) through `sampan
serve`: images/s with the dynamic batcher against unbatched, on one server holding both
configurations of the same file (KServe v2 binary tensors, one 224x224 image per request, on
127.0.0.1 and a free port).

    /usr/bin/python3 bench/onnx_serve.py [--clients 8] [--seconds 10] [--rounds 3]
                                         [--threads 2] [--delay-us 2000] [--dir DIR]

Models: "batched" (max_batch_size 8, dynamic_batching max_queue_delay_microseconds --delay-us)
and "unbatched" (max_batch_size 8, no dynamic_batching: each request its own execute). Each
round runs --clients closed-loop clients (threads, one connection each, request after response)
for --seconds on one model, then on the other; prints images/s and the median and p90 latency per
round and model, and the ratio of the medians of images/s."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

import numpy as np  # noqa: E402

from common import Server  # noqa: E402
from onnx_models import build_resnet  # noqa: E402


def load(port, model, body, head_len, seconds, clients):
    stop = time.time() + seconds
    lat, errors = [], []
    lock = threading.Lock()

    def client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        while time.time() < stop:
            t = time.perf_counter()
            c.request("POST", f"/v2/models/{model}/infer", body,
                      {"Inference-Header-Content-Length": str(head_len),
                       "Content-Type": "application/octet-stream"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                with lock:
                    errors.append(r.status)
                break
            mine.append(time.perf_counter() - t)
        c.close()
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    return len(lat) / wall, lat, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--delay-us", type=int, default=2000)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    work = a.dir or tempfile.mkdtemp(prefix="sampan-onnx-serve-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "resnet50.onnx")
    if not os.path.exists(src):
        build_resnet(src, np.random.default_rng(1))
    repo = os.path.join(work, "repo")
    for name, extra in (("batched", {"dynamic_batching": {"max_queue_delay_microseconds": a.delay_us}}),
                        ("unbatched", {})):
        d = os.path.join(repo, name, "1")
        os.makedirs(d, exist_ok=True)
        if not os.path.exists(os.path.join(d, "model.onnx")):
            os.symlink(src, os.path.join(d, "model.onnx"))
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump(dict({"name": name, "backend": "onnx", "max_batch_size": 8}, **extra), f)
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)
    head = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 224, 224],
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    body = head + x.tobytes()
    srv = Server("--model-repository", repo, "--threads", str(a.threads), model=None, start_timeout=120)
    try:
        print(f"# bench/onnx_serve.py clients={a.clients} seconds={a.seconds} threads={a.threads} "
              f"delay_us={a.delay_us} load={os.getloadavg()[0]:.1f}", flush=True)
        for m in ("batched", "unbatched"):  # warm-up: primitives, packed weights, pools
            load(srv.port, m, body, len(head), 2, 2)
        ips = {"batched": [], "unbatched": []}
        for rnd in range(a.rounds):
            for m in ("batched", "unbatched"):
                rate, lat, errors = load(srv.port, m, body, len(head), a.seconds, a.clients)
                if errors:
                    sys.exit(f"{m}: HTTP {errors[:5]}")
                lat.sort()
                ips[m].append(rate)
                print(f"round {rnd} {m:<9} {rate:7.2f} images/s  p50 {lat[len(lat) // 2] * 1000:7.1f} ms"
                      f"  p90 {lat[int(len(lat) * 0.9)] * 1000:7.1f} ms  ({len(lat)} requests)", flush=True)
        b, u = statistics.median(ips["batched"]), statistics.median(ips["unbatched"])
        print(f"median images/s: batched {b:.2f}, unbatched {u:.2f}, ratio {b / u:.2f}x")
        print(f"# load at the end {os.getloadavg()[0]:.1f}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
