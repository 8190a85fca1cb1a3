#!/usr/bin/python3
"""bench/onnx_bench.py - ONNX backend throughput: ResNet-50 (224x224) and a BERT-base encoder (12 layers,
hidden 768, 128 tokens), random weights (tests/py/onnx_models.py), at batch 1, 8 and 32 on N
threads: Sampan's plugin on oneDNN and on its own runtime, and OpenCV's DNN module (cv2.dnn, same
file, cv2.setNumThreads(N)), all in this one process, interleaved (each round times every
executor once, in turn), so a burst of other work on the host lands on all of them alike.

    /usr/bin/python3 bench/onnx_bench.py [--threads 2] [--batches 1,8,32] [--rounds 3]
                                   [--models resnet50,bert] [--own-max-batch 8] [--dir DIR]
                                   [--engines onednn,bf16,own,own-pool,opencv]
                                   [--int8] [--base-plugin PATH]

Executors: "onednn" (FP32), "bf16" (oneDNN with precision bf16, when the CPU has AVX512-BF16 or
AMX), "own" (our runtime, its activations in the arena plan of backends/onnx/plan.c), "own-pool"
(our runtime with SAMPAN_ONNX_ARENA=0: activations from the buffer pool, as before the plan; not
run unless --engines names it), "opencv". --engines picks (and only loads) some of them; the
last line gives the process's peak RSS, so one engine per process compares memory. Prints one line per (model, batch, executor): the median latency of one batch over the rounds,
the range, and items (images or sequences) per second from the median; then each executor's
throughput relative to OpenCV's. Outputs are compared once per model and batch: oneDNN and our
own runtime against OpenCV (ResNet) or numpy in float64 (BERT: OpenCV 4.6 cannot run it, see
onnx_models.py), and the worst difference printed.
--own-max-batch: our own runtime is slow at large batches (minutes for BERT at 32); above this
batch it is left out (and said so).
--int8: each model also as `sampan optimize --precision int8`'s INT8 file (calibrated on 16 random
inputs of the model's shape: images for ResNet-50, hidden states N(0, 1) for BERT; the tool's
default method): executors "int8" (oneDNN's int8 primitives) and "int8-own" (our integer kernels,
up to --own-max-batch), each with its accuracy change against FP32 oneDNN on the same input: the
max relative difference (max |int8 - fp32| / max |fp32|), the cosine of the flattened outputs and,
for ResNet-50, the top-1 agreement (random weights: there are no labels; bench/onnx_quant.py's
digits model has real ones).
--base-plugin: another build's libsampan_onnx.so (e.g. the commit before a change) as executor
"base" (oneDNN, FP32; with --int8 also "base-int8"), loaded beside this build's: before/after in one
process."""
import os

# libgomp (oneDNN's threads; also pulled in by cv2) reads this once when it loads: as `sampan`
# sets it in main(), before anything else.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

import numpy as np  # noqa: E402

from onnx_models import build_bert, build_resnet, numpy_run  # noqa: E402
from onnx_plugin import Plugin  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="resnet50,bert")
    ap.add_argument("--own-max-batch", type=int, default=8)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--engines", default="onednn,bf16,own,opencv")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--base-plugin", default=None)
    a = ap.parse_args()
    engines = set(a.engines.split(","))
    unknown = engines - {"onednn", "bf16", "own", "own-pool", "opencv"}
    if unknown:
        sys.exit(f"unknown engines {sorted(unknown)}")
    import cv2
    cv2.setNumThreads(a.threads)
    plugin = Plugin(os.path.join(ROOT, "build", "backends", "libsampan_onnx.so"))
    base = Plugin(a.base_plugin) if a.base_plugin else None
    work = a.dir or tempfile.mkdtemp(prefix="sampan-onnx-bench-")
    rng = np.random.default_rng(1)
    batches = [int(b) for b in a.batches.split(",")]
    print(f"# bench/onnx_bench.py threads={a.threads} rounds={a.rounds} cpu="
          f"{open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}"
          f" load={os.getloadavg()[0]:.1f}", flush=True)
    for model in a.models.split(","):
        vd = os.path.join(work, model, "1")
        os.makedirs(vd, exist_ok=True)
        path = os.path.join(vd, "model.onnx")
        if model == "resnet50":
            shape, out, unit = (3, 224, 224), "logits", "images"
            if not os.path.exists(path):
                build_resnet(path, rng)
        elif model == "bert":
            shape, out, unit = (1, 128, 768), "encoded", "sequences"
            if not os.path.exists(path):
                build_bert(path, rng)
        else:
            sys.exit(f"unknown model {model}")
        cfg = {"parameters": {"engine": {"string_value": "onednn"}}}
        # plan_at_load false: a load-time run of our own runtime at the largest batch takes minutes
        own_cfg = {"parameters": {"engine": {"string_value": "own"}, "plan_at_load": {"string_value": "false"}}}
        m_dnnl = m_bf16 = m_own = m_pool = None
        if "onednn" in engines:
            m_dnnl = plugin.load(vd, config=cfg, max_batch_size=max(batches), n_threads=a.threads)
        try:
            bf_cfg = {"parameters": {"engine": {"string_value": "onednn"}, "precision": {"string_value": "bf16"}}}
            if "bf16" in engines:
                m_bf16 = plugin.load(vd, config=bf_cfg, max_batch_size=max(batches), n_threads=a.threads)
        except Exception as e:  # a CPU without BF16: said, and left out
            print(f"{model}: bf16 left out: {e}")
            m_bf16 = None
        if "own" in engines:
            m_own = plugin.load(vd, config=own_cfg, max_batch_size=max(batches), n_threads=a.threads)
        if "own-pool" in engines:
            os.environ["SAMPAN_ONNX_ARENA"] = "0"  # read at load
            m_pool = plugin.load(vd, config=own_cfg, max_batch_size=max(batches), n_threads=a.threads)
            del os.environ["SAMPAN_ONNX_ARENA"]
        m_base = base.load(vd, config=cfg, max_batch_size=max(batches), n_threads=a.threads) if base else None
        m_int8 = m_int8own = m_base8 = None
        if a.int8:
            if not os.path.exists(os.path.join(vd, "model_int8.onnx")):
                calib = os.path.join(work, "calib.npy")
                np.save(calib, np.random.default_rng(7).standard_normal((16,) + shape).astype(np.float32))
                subprocess.run([os.path.join(ROOT, "build", "sampan"), "optimize", path, "--precision", "int8",
                                "--calib", calib, "--batch", "8", "--threads", str(a.threads)], check=True)
            q_cfg = {"parameters": {"engine": {"string_value": "onednn"}, "precision": {"string_value": "int8"}}}
            # plan_at_load false for our own kernels: their load-time run at the largest batch
            # would take minutes, and they are timed only up to --own-max-batch
            qo_cfg = {"parameters": {"engine": {"string_value": "own"}, "precision": {"string_value": "int8"},
                                     "plan_at_load": {"string_value": "false"}}}
            m_int8 = plugin.load(vd, config=q_cfg, max_batch_size=max(batches), n_threads=a.threads)
            m_int8own = plugin.load(vd, config=qo_cfg, max_batch_size=max(batches), n_threads=a.threads)
            if base is not None:
                m_base8 = base.load(vd, config=q_cfg, max_batch_size=max(batches), n_threads=a.threads)
        net = cv2.dnn.readNetFromONNX(path) if model == "resnet50" and "opencv" in engines else None
        if net is not None:
            net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        for b in batches:
            x = rng.standard_normal((b,) + shape).astype(np.float32)
            runs = {}
            if m_dnnl is not None:
                runs["onednn"] = lambda: m_dnnl.run([x])[out]
            if m_base is not None:
                runs["base"] = lambda: m_base.run([x])[out]
            if m_int8 is not None:
                runs["int8"] = lambda: m_int8.run([x])[out]
                if m_base8 is not None:
                    runs["base-int8"] = lambda: m_base8.run([x])[out]
                if b <= a.own_max_batch:
                    runs["int8-own"] = lambda: m_int8own.run([x])[out]
            if m_bf16 is not None:
                runs["bf16"] = lambda: m_bf16.run([x])[out]
            if b <= a.own_max_batch and m_own is not None:
                runs["own"] = lambda: m_own.run([x])[out]
            if b <= a.own_max_batch and m_pool is not None:
                runs["own-pool"] = lambda: m_pool.run([x])[out]
            if net is not None:
                def cv_run():
                    net.setInput(x)
                    return net.forward()
                runs["opencv"] = cv_run
            # Warm-up (primitive creation, weight packing, OpenCV's first-run setup, the arena
            # plan's recording run) and outputs.
            res = {k: f() for k, f in runs.items()}
            if "own" in res and "own-pool" in res:
                print(f"{model} batch {b}: own (arena) and own-pool outputs identical: "
                      f"{bool(np.array_equal(res['own'], res['own-pool']))}", flush=True)
            if not runs:
                continue
            if net is not None:
                ref = res["opencv"].astype(np.float64)
                rname = "opencv"
            else:
                ref = numpy_run(path, {"hidden": x})[out] if b <= 8 and model == "bert" else None
                rname = "numpy-f64"
            for k in ("int8", "int8-own"):
                if k in res and "onednn" in res:
                    q, f = res[k].astype(np.float64).ravel(), res["onednn"].astype(np.float64).ravel()
                    cos = float(q @ f / (np.linalg.norm(q) * np.linalg.norm(f)))
                    rel = float(np.abs(q - f).max() / np.abs(f).max())
                    agree = (f", top-1 agreement {float((res[k].argmax(-1) == res['onednn'].argmax(-1)).mean()):.3f}"
                             if model == "resnet50" else "")
                    print(f"{model} batch {b}: {k} vs fp32: max rel diff {rel:.2e}, cosine {cos:.6f}{agree}, "
                          f"max |diff| {float(np.abs(q - f).max()):.2e}", flush=True)
            if "int8" in res and "int8-own" in res:
                print(f"{model} batch {b}: int8 oneDNN vs int8 own max |diff| "
                      f"{float(np.abs(res['int8'] - res['int8-own']).max()):.2e}", flush=True)
            if ref is not None:
                scale = max(1.0, float(np.abs(ref).max()))
                for k, v in res.items():
                    if k.startswith("int8"):
                        continue
                    if k != rname:
                        print(f"{model} batch {b}: {k} vs {rname} max |diff| "
                              f"{float(np.abs(v - ref).max()):.2e} (scale {scale:.2f})", flush=True)
            times = {k: [] for k in runs}
            for _ in range(a.rounds):
                for k, f in runs.items():
                    t = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items()}
            for k, v in times.items():
                print(f"{model} batch {b:>2} {k:<7} {med[k] * 1000:9.1f} ms/batch "
                      f"[{min(v) * 1000:.1f}-{max(v) * 1000:.1f}]  {b / med[k]:8.2f} {unit}/s", flush=True)
            if "opencv" in med and "onednn" in med:
                print(f"{model} batch {b:>2} ratio onednn/opencv {med['opencv'] / med['onednn']:.2f}x"
                      + (f"  own/opencv {med['opencv'] / med['own']:.2f}x" if "own" in med else ""), flush=True)
            if "own" in med and "own-pool" in med:
                print(f"{model} batch {b:>2} ratio own(arena)/own-pool {med['own-pool'] / med['own']:.3f}x",
                      flush=True)
            if "own" in med and "onednn" in med:
                print(f"{model} batch {b:>2} ratio onednn/own {med['own'] / med['onednn']:.2f}x", flush=True)
            if "bf16" in med and "onednn" in med:
                print(f"{model} batch {b:>2} ratio bf16/onednn(fp32) {med['onednn'] / med['bf16']:.2f}x", flush=True)
            if "base" in med:
                print(f"{model} batch {b:>2} ratio onednn/base {med['base'] / med['onednn']:.2f}x", flush=True)
            if "base-int8" in med:
                print(f"{model} batch {b:>2} ratio int8/base-int8 {med['base-int8'] / med['int8']:.2f}x", flush=True)
            if "int8" in med and "onednn" in med:
                print(f"{model} batch {b:>2} ratio int8/onednn(fp32) {med['onednn'] / med['int8']:.2f}x"
                      + (f"  int8/opencv {med['opencv'] / med['int8']:.2f}x" if "opencv" in med else "")
                      + (f"  int8/int8-own {med['int8-own'] / med['int8']:.2f}x" if "int8-own" in med else ""),
                      flush=True)
            if b > a.own_max_batch:
                print(f"{model} batch {b:>2} own: left out (above --own-max-batch {a.own_max_batch})")
        # The resident set with the models still loaded, after their last batch (steady state;
        # the peak below includes each new shape's first run, which plans the arena).
        rss = [ln for ln in open("/proc/self/status") if ln.startswith(("VmRSS", "VmHWM"))]
        print(f"# {model}: " + ", ".join(" ".join(ln.split()) for ln in rss), flush=True)
        for mm in (m_dnnl, m_own, m_pool, m_bf16, m_base, m_int8, m_int8own, m_base8):
            if mm is not None:
                mm.close()
        for ln in plugin.log:
            if "activation_plan" in ln:
                print(f"# {ln}")
        plugin.log.clear()
    import resource
    print(f"# load at the end {os.getloadavg()[0]:.1f}; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
