#!/usr/bin/env python3
"""bench/image_serving.py - images/s through `sampan serve` for a small CNN with JPEG inputs:
decode cost against model cost, and the dynamic batcher against unbatched.

Builds (python3-onnx helpers, random weights) a small CNN on 3x96x96 (Conv 3->16 s2 + Relu, Conv
16->32 s2 + Relu, Conv 32->64 s2 + Relu, GlobalAveragePool, Flatten, Gemm 64->100, Softmax) and
serves it four ways from one repository:
  jpeg      JPEG in (320x240, shorter_crop 110 -> 96x96, ImageNet mean/std), dynamic batching
  jpeg_nb   the same without dynamic batching (every request runs alone)
  tensor    the same CNN taking the FP32 tensor (the model's cost alone, plus its 110 KB transfer)
  decode    JPEG in, an Identity model: decoding and preprocessing alone (the tensor comes back)
Clients: C threads, each a keep-alive connection posting one image per request (the binary
tensor extension), for D seconds per model after a warm-up, the models interleaved over --rounds rounds. Prints images/s and mean latency.

    python3 bench/image_serving.py [--clients 8] [--seconds 10] [--threads 1]

The server runs with --threads (HTTP loops); the ONNX instance uses the cores the plugin
picks. Numbers depend on the host: the ones in BENCHMARKS.md were taken on a loaded machine."""
import argparse
import http.client
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
from common import Server  # noqa: E402

S = 96
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def build_cnn(path, rng, image_input=True):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save
    inits, nodes = [], []

    def w(name, shape, fan_in):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), name))
        return name
    x, c = "image", 3
    for i, co in enumerate((16, 32, 64)):
        nodes.append(helper.make_node("Conv", [x, w(f"w{i}", (co, c, 3, 3), c * 9), w(f"b{i}", (co,), 1)],
                                      [f"c{i}"], strides=[2, 2], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x, c = f"r{i}", co
    nodes += [helper.make_node("GlobalAveragePool", [x], ["g"]),
              helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", w("fc", (100, 64), 64), w("fcb", (100,), 1)], ["l"], transB=1),
              helper.make_node("Softmax", ["l"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, S, S])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 100])], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def build_identity(path, rng):
    from onnx import TensorProto, helper, save
    g = helper.make_graph([helper.make_node("Identity", ["image"], ["out"])], "echo",
                          [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, S, S])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3, S, S])])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def model(repo, name, cfg, build, rng):
    d = os.path.join(repo, name, "1")
    os.makedirs(d)
    build(os.path.join(d, "model.onnx"), rng)
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump(dict({"name": name, "backend": "onnx"}, **cfg), f)


def image_cfg(batching):
    cfg = {"max_batch_size": 32,
           "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [3, S, S], "format": "FORMAT_NCHW",
                      "preprocess": {"image": {"resize": "shorter_crop", "shorter_side": 110,
                                               "mean": MEAN, "std": STD}}}]}
    if batching:
        cfg["dynamic_batching"] = {}
    return cfg


def load(port, body, headers, seconds, clients):
    done, lat, stop = [0] * clients, [0.0] * clients, time.time() + seconds
    errors = []

    def run(i):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.time() < stop:
            t0 = time.perf_counter()
            c.request("POST", path, body=body, headers=headers)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                errors.append(r.status)
                return
            lat[i] += time.perf_counter() - t0
            done[i] += 1
        c.close()
    path = headers.pop("_path")
    th = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    t0 = time.time()
    [t.start() for t in th]
    [t.join() for t in th]
    el = time.time() - t0
    n = sum(done)
    headers["_path"] = path
    return n / el, (sum(lat) / n * 1000 if n else 0), errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the four models")
    a = ap.parse_args()
    import cv2
    import numpy as np
    rng = np.random.default_rng(5)
    photo = cv2.GaussianBlur(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8), (9, 9), 3)
    jpg = cv2.imencode(".jpg", photo, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    tensor = rng.standard_normal((1, 3, S, S)).astype(np.float32).tobytes()
    tmp = tempfile.mkdtemp(prefix="sampan-imgbench-")
    repo = os.path.join(tmp, "repo")
    try:
        model(repo, "jpeg", image_cfg(True), build_cnn, np.random.default_rng(1))
        model(repo, "jpeg_nb", image_cfg(False), build_cnn, np.random.default_rng(1))
        model(repo, "tensor", {"max_batch_size": 32, "dynamic_batching": {}}, build_cnn, np.random.default_rng(1))
        model(repo, "decode", image_cfg(True), build_identity, None)
        srv = Server("--model-repository", repo, "--threads", str(a.threads), model=None, start_timeout=60)
        try:
            def img_req(name):
                tail = struct.pack("<I", len(jpg)) + jpg
                head = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1],
                                               "parameters": {"binary_data_size": len(tail)}}],
                                   "outputs": [{"name": "out" if name == "decode" else "probs",
                                                "parameters": {"binary_data": True}}]}).encode()
                return head + tail, {"Inference-Header-Content-Length": str(len(head)),
                                     "Content-Type": "application/octet-stream",
                                     "_path": f"/v2/models/{name}/infer"}
            head = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, S, S],
                                           "parameters": {"binary_data_size": len(tensor)}}],
                               "outputs": [{"name": "probs", "parameters": {"binary_data": True}}]}).encode()
            cases = {n: img_req(n) for n in ("jpeg", "jpeg_nb", "decode")}
            cases["tensor"] = (head + tensor, {"Inference-Header-Content-Length": str(len(head)),
                                               "Content-Type": "application/octet-stream",
                                               "_path": "/v2/models/tensor/infer"})
            cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True,
                                 text=True).stdout.strip()
            print(f"# {cpu}; {os.cpu_count()} CPUs; JPEG {len(jpg)} bytes 320x240 -> 3x{S}x{S}; "
                  f"{a.clients} clients x {a.seconds:.0f} s; --threads {a.threads}")
            for name, (body, hdr) in cases.items():
                load(srv.port, body, dict(hdr), 1.5, a.clients)  # warm-up
            for r in range(a.rounds):
                for name, (body, hdr) in cases.items():
                    ips, ms, errs = load(srv.port, body, dict(hdr), a.seconds, a.clients)
                    print(f"round {r + 1} {name:8s} {ips:8.1f} images/s  mean latency {ms:7.2f} ms"
                          + (f"  errors {errs[:3]}" if errs else ""))
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            c.request("GET", "/v2/models/jpeg/stats")
            ms = json.loads(c.getresponse().read())["model_stats"][0]
            bs = {e["batch_size"]: e["compute_infer"]["count"] for e in ms.get("batch_stats", [])}
            print(f"# jpeg batches by size: {dict(sorted(bs.items()))}")
        finally:
            srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
