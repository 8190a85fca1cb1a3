#!/usr/bin/python3
"""bench/onnx_runtime_b.py - MatMulInteger with B computed at run time (a graph input, as attention's
K and V in a dynamically quantized encoder): our integer kernel (which packs B per run) against
oneDNN's int8 matmul (B narrowed to s8 and reordered into its layout per run), interleaved in one
process, for A of M rows and B [K, N]. Outputs must be equal (exact int32 sums on both sides).

    /usr/bin/python3 bench/onnx_runtime_b.py [--threads 2] [--rounds 7] [--k 768] [--n 768]
                                            [--rows 1,4,16,64,256,1024]
Prints the median and the fastest ms per run and own/oneDNN (a loaded host: the fastest of
many rounds is the steadier one); picks dnnl.c's OX_DNNL_RUN_B_ROWS."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from onnx_plugin import Plugin  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--rows", default="1,4,16,64,256,1024")
    ap.add_argument("--plugin", default=os.path.join(ROOT, "build", "backends", "libsampan_onnx.so"))
    a = ap.parse_args()
    p = Plugin(a.plugin)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as d:
        node = h.make_node("MatMulInteger", ["x", "w", "zx", "zw"], ["y"])
        g = h.make_graph([node], "rb", [h.make_tensor_value_info("x", T.UINT8, ["M", a.k]),
                                       h.make_tensor_value_info("w", T.UINT8, [a.k, a.n])],
                         [h.make_tensor_value_info("y", T.INT32, ["M", a.n])],
                         [nh.from_array(np.array(3, np.uint8), "zx"), nh.from_array(np.array(128, np.uint8), "zw")])
        mp = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
        mp.ir_version = 8
        onnx.save(mp, os.path.join(d, "model.onnx"))
        ms = {e: p.load(d, config={"parameters": {"engine": {"string_value": e}}}, n_threads=a.threads)
              for e in ("own", "onednn")}
        print(f"# MatMulInteger A [M, {a.k}] u8, run-time B [{a.k}, {a.n}] u8 zp 128, threads={a.threads}, "
              f"load={os.getloadavg()[0]:.1f}", flush=True)
        for m in [int(x) for x in a.rows.split(",")]:
            x = rng.integers(0, 256, (m, a.k)).astype(np.uint8)
            w = rng.integers(28, 228, (a.k, a.n)).astype(np.uint8)
            out = {e: mm.run([x, w])["y"] for e, mm in ms.items()}
            same = np.array_equal(out["own"], out["onednn"])
            times = {e: [] for e in ms}
            for _ in range(a.rounds):
                for e, mm in ms.items():
                    t = time.perf_counter()
                    mm.run([x, w])
                    times[e].append(time.perf_counter() - t)
            med = {e: statistics.median(v) * 1000 for e, v in times.items()}
            best = {e: min(v) * 1000 for e, v in times.items()}
            print(f"M={m:>5} median own {med['own']:8.2f} ms  onednn {med['onednn']:8.2f} ms  "
                  f"own/onednn {med['own'] / med['onednn']:.2f}x | min own {best['own']:8.2f} onednn "
                  f"{best['onednn']:8.2f} own/onednn {best['own'] / best['onednn']:.2f}x  equal={same}", flush=True)
        for mm in ms.values():
            mm.close()


main()
