#!/usr/bin/python3
"""bench/onnx_verbose_shapes.py - where an ONNX model's time goes inside oneDNN, per convolution
shape. `run` loads DIR's model (parameters.precision PREC) on the oneDNN engine, runs batch B twice
to warm up and three times between two marker lines, with oneDNN's verbose log on (stdout; oneDNN
flushes each line); `sum` adds up the `exec` lines between the markers of such a log, by primitive
implementation and by convolution shape:

    ONEDNN_MAX_CPU_ISA=AVX2 ONEDNN_VERBOSE=1 /usr/bin/python3 bench/onnx_verbose_shapes.py run DIR int8 8 > int8.log
    /usr/bin/python3 bench/onnx_verbose_shapes.py sum int8.log

ONEDNN_VERBOSE must be in the environment before oneDNN loads (it is read once)."""
import collections
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

import numpy as np  # noqa: E402
from onnx_plugin import Plugin  # noqa: E402


def run(d, prec, batch):
    p = Plugin(os.path.join(ROOT, "build", "backends", "libsampan_onnx.so"))
    m = p.load(d, config={"parameters": {"precision": {"string_value": prec}}}, max_batch_size=batch, n_threads=2)
    shape = [batch] + [int(v) for v in m.inputs[0][2]]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    for _ in range(2):
        m.run([x])
    print("=== TIMED", flush=True)
    for _ in range(3):
        m.run([x])
    print("=== END", flush=True)
    m.close()


def summarize(path):
    lines = open(path, errors="replace").read().split("\n")
    a, b = lines.index("=== TIMED"), lines.index("=== END")
    by_impl = collections.defaultdict(lambda: [0, 0.0])
    by_shape = collections.defaultdict(float)
    for ln in lines[a:b]:
        f = ln.split(",")
        if not ln.startswith("onednn_verbose,exec") or len(f) < 6:
            continue
        t = float(f[-1])
        by_impl[f"{f[3]} {f[4]}"][0] += 1
        by_impl[f"{f[3]} {f[4]}"][1] += t
        if f[3] == "convolution":
            by_shape[f[-2]] += t
    for k, (n, t) in sorted(by_impl.items(), key=lambda kv: -kv[1][1]):
        print(f"{t / 3:9.2f} ms/run {n // 3:4d}/run  {k}")
    print(f"{sum(v[1] for v in by_impl.values()) / 3:9.2f} ms/run in oneDNN")
    for k, t in sorted(by_shape.items(), key=lambda kv: -kv[1]):
        print(f"{t / 3:9.2f} ms/run  {k}")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "run" and os.environ.get("ONEDNN_VERBOSE") == "1":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "sum":
        summarize(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
