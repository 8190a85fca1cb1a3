#!/usr/bin/python3
"""onnx_quant.py - FP32 vs FP16 vs INT8 ONNX models through `sampan optimize`'s held-out report
(the three models loaded and timed interleaved in one process, same threads):

  resnet   a ResNet-style CNN, random weights (python3-onnx helpers): stem conv 3->64 (stride 2)
           + BN + Relu, two basic blocks of 64 channels (conv-BN-relu-conv-BN + identity, relu),
           one of 128 (stride 2, 1x1 projection), global average pool, FC 128->1000; inputs
           3x64x64 (--size). Calibration: 64 random inputs; held out: 64 others. With random
           weights "accuracy" is only top-1 agreement with FP32.
  digits   the MLP of tests/py/test_onnx_quant.py (sklearn digits, 64-64-10): accuracy too.

    bench/onnx_quant.py [--threads 2] [--size 64] [--batch 8] [--repeat 5] [--sampan build/sampan]
Prints each report; numbers for BENCHMARKS.md."""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper as nh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resnet(path, size):
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(name, x, cin, cout, k, stride=1, relu=True):
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        inits.append(nh.from_array(w, name + "_w"))
        nodes.append(h.make_node("Conv", [x, name + "_w"], [name + "_c"], pads=[k // 2] * 4, strides=[stride] * 2))
        for p, v in [("s", 1 + 0.1 * rng.standard_normal(cout)), ("b", 0.1 * rng.standard_normal(cout)),
                     ("m", 0.1 * rng.standard_normal(cout)), ("v", 1 + 0.1 * rng.random(cout))]:
            inits.append(nh.from_array(v.astype(np.float32), f"{name}_{p}"))
        nodes.append(h.make_node("BatchNormalization", [name + "_c"] + [f"{name}_{p}" for p in "sbmv"], [name + "_n"]))
        if not relu:
            return name + "_n"
        nodes.append(h.make_node("Relu", [name + "_n"], [name + "_r"]))
        return name + "_r"

    def block(name, x, cin, cout, stride):
        a = conv(name + "a", x, cin, cout, 3, stride)
        b = conv(name + "b", a, cout, cout, 3, 1, relu=False)
        sc = x if stride == 1 and cin == cout else conv(name + "p", x, cin, cout, 1, stride, relu=False)
        nodes.append(h.make_node("Add", [b, sc], [name + "_add"]))
        nodes.append(h.make_node("Relu", [name + "_add"], [name + "_out"]))
        return name + "_out"
    y = conv("stem", "x", 3, 64, 3, 2)
    y = block("b1", y, 64, 64, 1)
    y = block("b2", y, 64, 64, 1)
    y = block("b3", y, 64, 128, 2)
    nodes.append(h.make_node("GlobalAveragePool", [y], ["gap"]))
    nodes.append(h.make_node("Flatten", ["gap"], ["flat"]))
    inits.append(nh.from_array((rng.standard_normal((128, 1000)) * 0.05).astype(np.float32), "fc_w"))
    inits.append(nh.from_array(np.zeros(1000, np.float32), "fc_b"))
    nodes.append(h.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]))
    g = h.make_graph(nodes, "resnet_style", [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, size, size])],
                     [h.make_tensor_value_info("logits", T.FLOAT, ["N", 1000])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="2")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", default="8")
    ap.add_argument("--repeat", default="5")
    ap.add_argument("--sampan", default=os.path.join(ROOT, "build", "sampan"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sampan-bench-quant-")
    rng = np.random.default_rng(1)
    model = os.path.join(tmp, "resnet.onnx")
    resnet(model, a.size)
    np.save(os.path.join(tmp, "rc.npy"), rng.standard_normal((64, 3, a.size, a.size)).astype(np.float32))
    np.save(os.path.join(tmp, "re.npy"), rng.standard_normal((64, 3, a.size, a.size)).astype(np.float32))
    common = ["--threads", a.threads, "--batch", a.batch, "--repeat", a.repeat]
    for method in ["percentile", "entropy"]:
        print(f"== resnet-style CNN 3x{a.size}x{a.size}, calibration {method}", flush=True)
        subprocess.run([a.sampan, "optimize", model, "--calib", os.path.join(tmp, "rc.npy"), "--method", method,
                        "--eval", os.path.join(tmp, "re.npy")] + common, check=True)
    sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
    try:
        from sklearn.datasets import load_digits
        from sklearn.neural_network import MLPClassifier
        import warnings
        from test_onnx_quant import export_mlp
    except ImportError as e:
        print(f"digits: skipped ({e})")
        return
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(x))
    tr, te = perm[:1000], perm[1000:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=300, random_state=0).fit(x[tr], y[tr])
    dm = os.path.join(tmp, "digits.onnx")
    export_mlp(clf, dm)
    np.save(os.path.join(tmp, "dc.npy"), x[tr[:200]])
    np.save(os.path.join(tmp, "de.npy"), x[te])
    np.save(os.path.join(tmp, "dl.npy"), y[te])
    print("== digits MLP 64-64-10 (sklearn digits, 797 held out), calibration entropy", flush=True)
    subprocess.run([a.sampan, "optimize", dm, "--calib", os.path.join(tmp, "dc.npy"), "--method", "entropy",
                    "--eval", os.path.join(tmp, "de.npy"), "--labels", os.path.join(tmp, "dl.npy"),
                    "--threads", a.threads, "--batch", "64", "--repeat", "20"], check=True)


if __name__ == "__main__":
    main()
