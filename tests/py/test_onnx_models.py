"""test_onnx_models.py - whole models through the ONNX plugin on both engines (oneDNN and our own
runtime), in-process over the backend ABI (onnx_plugin.py): a small ResNet (the bottleneck
structure of ResNet-50: stride-2 downsampling, projection shortcuts, the residual Add fused into
the convolution as oneDNN's sum post-op) compared with OpenCV's DNN module, and a small BERT
encoder compared with a float64 numpy evaluation of the same graph (OpenCV 4.6 cannot run it:
onnx_models.py). Batch sizes change between calls (new primitives), the per-node primitive cache
stays bounded (max_batch_size input shapes per node, at least 4), BF16 runs where the CPU has it (else a
clear load error, and the case is skipped), bad engine/precision parameters are load errors, the
BERT graph's Shape chains fold at load (static shape inference with a symbolic batch), and shapes
that cannot match are load errors naming the node.

Tolerances. FP32: both engines compute in float32 with other summation orders than the
references; with u = 2^-24 a K-term dot product differs by at most K*u*sum|terms|, K <= 4608 here
(3x3x512) and activations of order 1 through the depth (weights N(0, 1/fan_in)), so 2^-12 of the
output's scale (max(1, max|ref|)) leaves a wide margin over 4608 * 2^-24 ~ 2^-12 per layer...
per layer that bound is the worst case of all terms aligning; random signs make it sqrt(K)*u,
so 2^-12 holds through the ~20 layers (measured: below 2^-20).
BF16: oneDNN rounds the convolution inputs and weights to bfloat16 (8 significant bits, unit
roundoff 2^-9) and accumulates in float32: each product is off by up to 2^-8 relative, random
in sign, so a layer's output by about 2^-8 of its scale, and the errors of ~20 layers add up
to at most 20 * 2^-8 < 2^-3 of the output's scale: the bound used."""
import os
import re
import sys
import tempfile

from common import Suite, binary

s = Suite("onnx-models")
PLUGIN = os.path.join(os.path.dirname(binary() or "build/sampan"), "backends", "libsampan_onnx.so")
TOL = 2.0 ** -12
TOL_BF16 = 2.0 ** -3


def eng(name, **extra):
    p = {"engine": {"string_value": name}}
    for k, v in extra.items():
        p[k] = {"string_value": v}
    return {"parameters": p}


def worst(got, ref):
    import numpy as np
    scale = max(1.0, float(np.abs(ref).max()))
    return float(np.abs(got.astype(np.float64) - ref).max()) / scale


def stats(plugin):
    """The last 'onednn_primitives' debug line's counters."""
    for line in reversed(plugin.log):
        if "onednn_primitives" in line:
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
    return None


def main():
    cv2, np, _ = s.need("onnx models", ("cv2", "numpy", "onnx"), (PLUGIN,),
                        "python3-onnx python3-opencv python3-numpy")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from onnx_models import build_bert, build_resnet, numpy_run
    from onnx_plugin import BackendError, Plugin
    plugin = Plugin(PLUGIN)
    work = tempfile.mkdtemp(prefix="sampan-onnx-models-")
    rng = np.random.default_rng(7)

    rdir = os.path.join(work, "resnet")
    os.makedirs(rdir)
    rpath = os.path.join(rdir, "model.onnx")
    build_resnet(rpath, rng, blocks=(1, 2, 1, 1), width=8, size=48, classes=10)
    x = rng.standard_normal((5, 3, 48, 48)).astype(np.float32)
    net = cv2.dnn.readNetFromONNX(rpath)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setInput(x)
    ref = net.forward().astype(np.float64)

    # Which engine the plugin defaults to: oneDNN when it was built with it.
    m = plugin.load(rdir, max_batch_size=8, n_threads=2)
    default = re.search(r"engine=(\w+)", " ".join(plugin.log)).group(1)
    m.close()
    have_dnnl = default == "onednn"
    print(f"onnx-models: default engine {default}", flush=True)
    engines = ["onednn", "own"] if have_dnnl else ["own"]
    if not have_dnnl:
        s.skip("oneDNN engine", "the plugin was built without libdnnl-dev")

    for e in engines:
        m = plugin.load(rdir, config=eng(e), max_batch_size=8, n_threads=2)
        try:
            for b in (5, 1, 3, 5):
                got = m.run([x[:b]])["logits"]
                w = worst(got, ref[:b])
                s.case(f"resnet {e} batch {b} vs OpenCV", got.shape == (b, 10) and w <= TOL,
                       f"shape {got.shape}, worst {w:.2e} of scale (tolerance {TOL:.1e})")
        finally:
            m.close()

    bdir = os.path.join(work, "bert")
    os.makedirs(bdir)
    bpath = os.path.join(bdir, "model.onnx")
    build_bert(bpath, rng, layers=2, hidden=64, heads=4, seq=16)
    h = rng.standard_normal((3, 1, 16, 64)).astype(np.float32)
    bref = numpy_run(bpath, {"hidden": h})["encoded"]
    # Static shape inference: the BERT graph's Shape/Gather/Unsqueeze/Concat chains (6 nodes
    # per Reshape, 4 Reshapes per layer) fold at load, so the nodes that run are the graph's
    # less those chains and the fused ones.
    plugin.log.clear()
    plugin.load(bdir, config=eng("own"), max_batch_size=4).close()
    info = {k: int(v) for k, v in re.findall(r"\b(nodes|run|fused)=(\d+)", plugin.log[0])}
    want = info["nodes"] - 6 * 4 * 2 - info["fused"]
    s.case("BERT's Shape chains fold at load (symbolic batch)", info["run"] == want,
           f"{info}, expected run={want}")
    for e in engines:
        m = plugin.load(bdir, config=eng(e), max_batch_size=4, n_threads=2)
        try:
            for b in (3, 1, 2):
                got = m.run([h[:b]])["encoded"]
                w = worst(got, bref[:b])
                s.case(f"bert {e} batch {b} vs numpy", got.shape == (b, 16, 64) and w <= TOL,
                       f"shape {got.shape}, worst {w:.2e} of scale")
            if e == "onednn":
                # 2 layers: 2 LayerNorms and 1 GELU each, spelled out in elementary operators
                st = stats(plugin)
                s.case("bert on oneDNN: its LayerNorm and GELU chains run as primitives",
                       st is not None and st.get("groups") == 6, f"{st}")
        finally:
            m.close()
    if have_dnnl:
        native_norms(plugin, work)

    if have_dnnl:
        # The primitive cache: one entry per input shape per node, max_batch_size of them (at
        # least 4): at max_batch_size 4, four batch sizes fill it, a fifth evicts (cached stops
        # growing), results stay right throughout, and a batch size still cached creates nothing.
        # (plan_at_load false: the shapes are made by these runs alone, in this order.)
        plugin.log.clear()
        m = plugin.load(rdir, config=eng("onednn", plan_at_load="false"), max_batch_size=4, n_threads=1)
        try:
            seen, ok = [], True
            for b in (1, 2, 3, 4, 5, 1, 2):
                xb = np.concatenate([x, x])[:b]
                got = m.run([xb])["logits"]
                ok = ok and worst(got, np.concatenate([ref, ref])[:b]) <= TOL
                seen.append(stats(plugin))
            full, after = seen[3], seen[4]
            s.case("batch sizes 1..5 and back: right results", ok)
            s.case("primitive cache bounded: a fifth shape evicts, cached stays",
                   full and after and after["cached"] == full["cached"] and after["evicted"] > 0
                   and full["evicted"] == 0, f"after 4 shapes {full}, after 5 {after}")
            s.case("an evicted shape is created again", seen[5]["created"] > after["created"],
                   f"{seen[5]}")
            n_before = len(plugin.log)
            m.run([x[:5]])
            s.case("a cached shape creates nothing (no new debug line)", len(plugin.log) == n_before)
        finally:
            m.close()

        # BF16 where the CPU has it (AVX512-BF16 or AMX), else a clear refusal.
        try:
            m = plugin.load(rdir, config=eng("onednn", precision="bf16"), max_batch_size=8, n_threads=2)
        except BackendError as err:
            ok = "no BF16" in str(err)
            s.case("bf16 on a CPU without it: a load error saying so", ok, str(err))
            s.skip("bf16 resnet vs OpenCV", "this CPU has no AVX512-BF16/AMX")
        else:
            try:
                got = m.run([x])["logits"]
                w = worst(got, ref)
                s.case("bf16 resnet vs OpenCV (FP32)", w <= TOL_BF16,
                       f"worst {w:.2e} of scale (tolerance {TOL_BF16:.1e})")
                s.case("bf16 is really in use (differs from FP32)", w > 2.0 ** -20, f"worst {w:.2e}")
            finally:
                m.close()
            m = plugin.load(bdir, config=eng("onednn", precision="bf16"), max_batch_size=4, n_threads=2)
            try:
                got = m.run([h])["encoded"]
                w = worst(got, bref)
                s.case("bf16 bert vs numpy", w <= TOL_BF16 and w > 2.0 ** -20,
                       f"worst {w:.2e} of scale (tolerance {TOL_BF16:.1e})")
            finally:
                m.close()

    # Shapes known at load are checked at load, the error naming the node.
    from onnx import TensorProto, helper
    for name, nodes, inits, msg in (
            ("matmul_k", [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
             [helper.make_tensor("w", TensorProto.FLOAT, [5, 3], [0.0] * 15)],
             "node 'proj' (MatMul): cannot multiply [?, 4] by [5, 3]"),
            ("broadcast", [helper.make_node("Add", ["x", "b"], ["y"], name="bias")],
             [helper.make_tensor("b", TensorProto.FLOAT, [3], [0.0] * 3)],
             "node 'bias' (Add): shapes [?, 4] and [3] do not broadcast")):
        d = os.path.join(work, name)
        os.makedirs(d)
        g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        mp.ir_version = 7
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(mp.SerializeToString())
        try:
            plugin.load(d).close()
            s.case(f"load-time shape check: {name}", False, "loaded")
        except BackendError as err:
            s.case(f"load-time shape check: {name}", msg in str(err), str(err))

    for cfg, want in ((eng("gpu"), "expected \"onednn\" or \"own\""),
                      (eng("own", precision="int4"), "fp32, fp16, int8 or bf16"),
                      (eng("own", precision="bf16"), "needs the oneDNN engine")):
        try:
            plugin.load(rdir, config=cfg, max_batch_size=8).close()
            s.case(f"refused: {cfg['parameters']}", False, "loaded")
        except BackendError as err:
            s.case(f"refused: {cfg['parameters']}", want in str(err), str(err))
    s.finish()


def native_norms(plugin, work):
    """LayerNormalization (opset 17), Gelu (erf and tanh forms) and Softmax (last axis) as single
    operators: oneDNN's layer normalization, eltwise and softmax primitives against our own
    operators (float64 statistics), within TOL of the scale: FP32 sums of 48 terms and exp/erf
    evaluations agree far closer than 2^-12."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(9)
    d = os.path.join(work, "norms")
    os.makedirs(d)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], epsilon=1e-5, axis=-1),
             helper.make_node("Gelu", ["ln"], ["ge"]),
             helper.make_node("Gelu", ["ge"], ["gt"], approximate="tanh"),
             helper.make_node("Softmax", ["gt"], ["y"], axis=-1)]
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 48).astype(np.float32), "g"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, 48).astype(np.float32), "b")]
    g = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 48])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 48])], inits)
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    mp.ir_version = 9
    with open(os.path.join(d, "model.onnx"), "wb") as f:
        f.write(mp.SerializeToString())
    x = (rng.standard_normal((3, 5, 48)) * 3).astype(np.float32)
    outs = {}
    for e in ("own", "onednn"):
        plugin.log.clear()
        # plan_at_load false: the primitives counted are the ones of this run
        m = plugin.load(d, config=eng(e, plan_at_load="false"), max_batch_size=4, n_threads=2)
        try:
            outs[e] = m.run([x])["y"].astype(np.float64)
            if e == "onednn":
                st = stats(plugin)
                s.case("LayerNormalization, Gelu, Softmax run as oneDNN primitives",
                       st is not None and st["created"] == 4 and st["fallbacks"] == 0, f"{st}")
        finally:
            m.close()
    w = worst(outs["onednn"], outs["own"])
    s.case("LayerNormalization/Gelu/Softmax: oneDNN = own", w <= TOL, f"worst {w:.2e} of scale")


if __name__ == "__main__":
    main()
