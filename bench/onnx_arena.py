#!/usr/bin/python3
"""bench/onnx_arena.py - the activation arena on the oneDNN engine: time and memory.

Time (default): one ResNet-style model directory (e.g. bench/onnx_bench.py --dir's resnet50/1, which
also holds model_int8.onnx), loaded three times in one process on oneDNN: this build with the arena
("arena"), this build with SAMPAN_ONNX_ARENA=0 ("pool"), and --base-plugin (another build, e.g. the
commit before the change, "base"); outputs compared bit for bit, then --rounds interleaved runs at
--batch, the median and the fastest of each and their ratios.

    /usr/bin/python3 bench/onnx_arena.py DIR [--batch 1] [--rounds 40] [--precision fp32|int8]
                                         [--base-plugin PATH] [--base-dir DIR2] [--no-pool] [--time-fp32]
                                         [--max-batch 8] [--input image]
--base-dir: the base build loads DIR2 instead (e.g. an INT8 file from an older `sampan optimize`);
--no-pool: no SAMPAN_ONNX_ARENA=0 load; --time-fp32: the FP32 model on this build is timed in the
same interleaved rounds ("fp32"), for INT8 / FP32 ratios measured in one process.
Memory (--rss PLUGIN): that plugin alone in this process, the model loaded (max_batch_size
--max-batch), then batches 1, max, 1, max: VmRSS and VmHWM after each step (one process per
plugin: run it once per build)."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from onnx_plugin import Plugin  # noqa: E402

PLUGIN = os.path.join(ROOT, "build", "backends", "libsampan_onnx.so")


def rss():
    return ", ".join(" ".join(ln.split()) for ln in open("/proc/self/status") if ln.startswith(("VmRSS", "VmHWM")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--base-plugin", default=None)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rss", default=None)
    ap.add_argument("--base-dir", default=None)
    ap.add_argument("--no-pool", action="store_true")
    ap.add_argument("--time-fp32", action="store_true")
    a = ap.parse_args()
    cfg = {"parameters": {"engine": {"string_value": "onednn"}, "precision": {"string_value": a.precision}}}
    rng = np.random.default_rng(0)
    if a.rss:
        p = Plugin(a.rss)
        print(f"start: {rss()}", flush=True)
        m = p.load(a.dir, config=cfg, max_batch_size=a.max_batch, n_threads=a.threads)
        print(f"loaded: {rss()}", flush=True)
        for b in (1, a.max_batch, 1, a.max_batch):
            m.run([rng.standard_normal((b, 3, 224, 224)).astype(np.float32)])
            print(f"batch {b}: {rss()}", flush=True)
        print("\n".join(ln for ln in p.log if "activation" in ln))
        return
    new = Plugin(PLUGIN)
    ms = {"arena": new.load(a.dir, config=cfg, max_batch_size=a.max_batch, n_threads=a.threads)}
    if not a.no_pool:
        os.environ["SAMPAN_ONNX_ARENA"] = "0"  # read at load
        ms["pool"] = new.load(a.dir, config=cfg, max_batch_size=a.max_batch, n_threads=a.threads)
        del os.environ["SAMPAN_ONNX_ARENA"]
    if a.base_plugin:
        ms["base"] = Plugin(a.base_plugin).load(a.base_dir or a.dir, config=cfg, max_batch_size=a.max_batch,
                                                n_threads=a.threads)
    x = rng.standard_normal((a.batch, 3, 224, 224)).astype(np.float32)
    outs = {k: next(iter(m.run([x]).values())) for k, m in ms.items()}
    print("bit-identical to arena: " + ", ".join(f"{k} {np.array_equal(v, outs['arena'])}" for k, v in outs.items()
                                                 if k != "arena"), flush=True)
    refs = dict(outs)
    if a.precision != "fp32":
        # the FP32 model on this build: how far each build's quantized output is from it
        fcfg = {"parameters": {"engine": {"string_value": "onednn"}, "precision": {"string_value": "fp32"}}}
        fm = new.load(a.dir, config=fcfg, max_batch_size=a.max_batch, n_threads=a.threads)
        refs["fp32"] = next(iter(fm.run([x]).values()))
        if a.time_fp32:
            ms["fp32"] = fm
        else:
            fm.close()
    for k, v in refs.items():
        if k == "arena" or np.array_equal(v, outs["arena"]):
            continue
        d = np.abs(v.astype(np.float64) - outs["arena"]).max() / max(np.abs(v).max(), 1e-30)
        top1 = np.mean(v.reshape(v.shape[0], -1).argmax(1) == outs["arena"].reshape(v.shape[0], -1).argmax(1))
        print(f"arena vs {k}: max |diff| / max |{k}| {d:.4f}, top-1 agreement {top1:.3f}", flush=True)
    if "base" in refs and "fp32" in refs:
        v, f = refs["base"], refs["fp32"]
        d = np.abs(v.astype(np.float64) - f).max() / max(np.abs(f).max(), 1e-30)
        print(f"base vs fp32: max |diff| / max |fp32| {d:.4f}", flush=True)
    t = {k: [] for k in ms}
    for _ in range(a.rounds):
        for k, m in ms.items():
            s = time.perf_counter()
            m.run([x])
            t[k].append(time.perf_counter() - s)
    med = {k: statistics.median(v) for k, v in t.items()}
    best = {k: min(v) for k, v in t.items()}
    for k in ms:
        print(f"{'fp32' if k == 'fp32' else a.precision} batch {a.batch} {k:6} median {med[k] * 1000:8.1f} ms  min {best[k] * 1000:8.1f} ms")
    for k in ms:
        if k != "arena":
            print(f"{k}/arena (time ratio, >1: arena faster) median {med[k] / med['arena']:.2f}x "
                  f"min {best[k] / best['arena']:.2f}x")
    print(f"# load average {os.getloadavg()[0]:.1f}")


main()
