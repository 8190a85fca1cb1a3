"""test_onnx_plan.py - the ONNX backend's load-time element types (backends/onnx/dtype.c) and its
arena memory plan (backends/onnx/plan.c), in-process through the backend ABI (onnx_plugin.py).

Types: graphs that break an operator's type rule (Add of FLOAT and INT64, MatMul of FLOAT16 and
FLOAT, a QuantizeLinear zero point of INT32, Slice starts and ends of two types, an output
declared with another type than computed, Where with a FLOAT condition) fail to load with an
error naming the node, the operator and both types; type-correct mixes (Cast, Shape, Where,
Gather with INT32 indices, QuantizeLinear/DequantizeLinear) load and run.

Plan: a branching CNN (a residual Add, Concat, Split, MatMul with a bias, Softmax) on our own
runtime. The first run at an input shape records sizes and makes a plan (a log line with
activation_arena_bytes <= activation_sum_bytes); later runs follow it. Outputs at every batch size
must be bit-identical to the first (recording) run's: the same kernels on the same inputs, only
the addresses differ. More batch sizes than the plans kept (8) replace the least recently used,
and the results stay identical. The oneDNN engine makes no plan (its convolution takes its
residual's buffer). Last line: onnx-plan: N passed, N failed, N skipped"""
import os
import re
import sys
import tempfile

from common import Suite, binary

s = Suite("onnx-plan")
PLUGIN = os.path.join(os.path.dirname(binary() or "build/sampan"), "backends", "libsampan_onnx.so")
OWN = {"parameters": {"engine": {"string_value": "own"}}}


def save(d, nodes, inputs, outputs, inits=(), opset=17, value_info=()):
    from onnx import helper
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.onnx"), "wb") as f:
        f.write(m.SerializeToString())
    return d


def type_cases(plugin, root):
    import numpy as np
    from onnx import TensorProto as TP, helper, numpy_helper
    from onnx_plugin import BackendError
    vi = helper.make_tensor_value_info
    bad = {
        "add_float_int64": ([helper.make_node("Add", ["x", "k"], ["y"], name="mix")],
                            [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2])],
                            [numpy_helper.from_array(np.array([1, 2], np.int64), "k")],
                            ["'mix' (Add)", "FLOAT", "INT64"]),
        "matmul_half_float": ([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                              [vi("x", TP.FLOAT16, [1, 2])], [vi("y", TP.FLOAT16, [1, 2])],
                              [numpy_helper.from_array(np.ones((2, 2), np.float32), "w")],
                              ["'mm' (MatMul)", "FLOAT16", "FLOAT"]),
        "quantize_zp_int32": ([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q")],
                              [vi("x", TP.FLOAT, [2])], [vi("y", TP.INT32, [2])],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
                               numpy_helper.from_array(np.array(0, np.int32), "z")],
                              ["'q' (QuantizeLinear)", "zero point", "INT32"]),
        "slice_index_types": ([helper.make_node("Slice", ["x", "b", "e"], ["y"], name="sl")],
                              [vi("x", TP.FLOAT, [4])], [vi("y", TP.FLOAT, [2])],
                              [numpy_helper.from_array(np.array([1], np.int32), "b"),
                               numpy_helper.from_array(np.array([3], np.int64), "e")],
                              ["'sl' (Slice)", "INT32", "INT64"]),
        "output_declared_other": ([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                  [vi("x", TP.FLOAT, [2])], [vi("y", TP.INT64, [2])], [],
                                  ["output 'y'", "declared INT64", "'r' (Relu)", "FLOAT"]),
        "where_float_condition": ([helper.make_node("Where", ["c", "x", "x"], ["y"], name="w")],
                                  [vi("c", TP.FLOAT, [2]), vi("x", TP.FLOAT, [2])],
                                  [vi("y", TP.FLOAT, [2])], [], ["'w' (Where)", "FLOAT", "BOOL"]),
        "concat_types": ([helper.make_node("Concat", ["x", "k"], ["y"], axis=0, name="cat")],
                         [vi("x", TP.INT32, [2])], [vi("y", TP.INT32, [4])],
                         [numpy_helper.from_array(np.array([1, 2], np.int64), "k")],
                         ["'cat' (Concat)", "INT32", "INT64"]),
    }
    for name, (nodes, ins, outs, inits, want) in bad.items():
        d = save(os.path.join(root, name), nodes, ins, outs, inits)
        try:
            plugin.load(d).close()
            s.case(f"types: {name} is a load error", False, "it loaded")
        except BackendError as e:
            msg = str(e)
            s.case(f"types: {name} is a load error naming node, operator and types",
                   all(w in msg for w in want), msg)
    # value_info: an intermediate declared with another type than computed is refused, naming the
    # value, the producing node and both types; a right declaration (and one for a value the
    # graph does not have: an exporter's leftover) loads.
    chain = [helper.make_node("Relu", ["x"], ["h"], name="r1"), helper.make_node("Neg", ["h"], ["y"], name="n")]
    d = save(os.path.join(root, "value_info_bad"), chain, [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2])],
             value_info=[vi("h", TP.INT64, [2])])
    try:
        plugin.load(d).close()
        s.case("types: value_info declaring INT64 for a FLOAT intermediate is a load error", False, "it loaded")
    except BackendError as e:
        msg = str(e)
        s.case("types: value_info declaring INT64 for a FLOAT intermediate is a load error naming "
               "file, value, node and types",
               all(w in msg for w in ["model.onnx", "value_info 'h'", "INT64", "'r1' (Relu)", "FLOAT"]), msg)
    d = save(os.path.join(root, "value_info_ok"), chain, [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2])],
             value_info=[vi("h", TP.FLOAT, [2]), vi("gone", TP.INT64, [2])])
    try:
        m = plugin.load(d)
        y = m.run([np.array([1.5, -2.0], np.float32)])["y"]
        m.close()
        s.case("types: right value_info (and one for a missing value) loads and runs",
               np.array_equal(y, np.array([-1.5, 0.0], np.float32)), repr(y))
    except BackendError as e:
        s.case("types: right value_info (and one for a missing value) loads and runs", False, str(e))
    # Type-correct mixes load and compute the inferred types.
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Cast", ["shp"], ["shpf"], to=TP.FLOAT, name="cast"),
        helper.make_node("ReduceSum", ["shpf"], ["n"], keepdims=0, name="count"),
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=0, name="gather"),
        helper.make_node("Cast", ["g"], ["gb"], to=TP.BOOL, name="tobool"),
        helper.make_node("Where", ["gb", "g", "n"], ["w"], name="where"),
        helper.make_node("QuantizeLinear", ["w", "qs", "qz"], ["q"], name="quant"),
        helper.make_node("DequantizeLinear", ["q", "qs", "qz"], ["y"], name="dequant"),
    ]
    d = save(os.path.join(root, "mix_ok"), nodes, [vi("x", TP.FLOAT, [3])], [vi("y", TP.FLOAT, [2])],
             [numpy_helper.from_array(np.array([2, 0], np.int32), "idx"),
              numpy_helper.from_array(np.array(0.25, np.float32), "qs"),
              numpy_helper.from_array(np.array(3, np.int8), "qz")])
    try:
        m = plugin.load(d)
        y = m.run([np.array([1.5, 0.0, 0.0], np.float32)])["y"]
        m.close()
        # Gather [x[2], x[0]] = [0, 1.5]; Where(g != 0, g, 3) = [3, 1.5]; both on the 0.25 grid
        s.case("types: Shape/Cast/Gather(INT32)/Where/Quantize(INT8) load and run",
               y.dtype == np.float32 and np.array_equal(y, np.array([3.0, 1.5], np.float32)), repr(y))
    except BackendError as e:
        s.case("types: Shape/Cast/Gather(INT32)/Where/Quantize(INT8) load and run", False, str(e))


def build_net(d, rng):
    import numpy as np
    from onnx import TensorProto as TP, helper, numpy_helper
    inits = []

    def w(name, shape):
        inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, shape).astype(np.float32), name))
        return name

    nodes = [
        helper.make_node("Conv", ["x", w("w1", (8, 3, 3, 3)), w("b1", (8,))], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", w("w2", (8, 8, 3, 3))], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["r1", w("w3", (8, 8, 1, 1))], ["c3"]),
        helper.make_node("Add", ["c2", "c3"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["r2"]),
        helper.make_node("Split", ["r2"], ["sa", "sb"], axis=1, num_outputs=2),
        helper.make_node("Sigmoid", ["sa"], ["ga"]),
        helper.make_node("Mul", ["ga", "sb"], ["gated"]),
        helper.make_node("Concat", ["gated", "r1"], ["cat"], axis=1),
        helper.make_node("MaxPool", ["cat"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", w("fc", (12, 5))], ["mm"]),
        helper.make_node("Add", ["mm", w("fcb", (5,))], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
    ]
    vi = helper.make_tensor_value_info
    return save(d, nodes, [vi("x", TP.FLOAT, ["N", 3, 16, 16])],
                [vi("prob", TP.FLOAT, ["N", 5]), vi("r1", TP.FLOAT, ["N", 8, 16, 16])], inits, opset=18)


def plan_cases(plugin, root):
    import numpy as np
    rng = np.random.default_rng(7)
    d = build_net(os.path.join(root, "net"), rng)
    # plan_at_load false: the plans are made by these runs alone (counted below)
    m = plugin.load(d, config={"parameters": dict(OWN["parameters"], plan_at_load={"string_value": "false"})},
                    max_batch_size=16)
    xs = {b: rng.standard_normal((b, 3, 16, 16)).astype(np.float32) for b in range(1, 11)}
    first = {}
    plan_lines = []
    identical = True
    detail = ""
    # batch 1, 2 twice each; then 3..10 (10 shapes > 8 plans kept), then 1 and 2 again (evicted
    # and planned anew)
    for b in [1, 1, 2, 2, 1] + list(range(3, 11)) + [1, 2, 1]:
        n_log = len(plugin.log)
        out = m.run([xs[b]])
        plan_lines += [ln for ln in plugin.log[n_log:] if "activation_plan" in ln]
        if b not in first:
            first[b] = out
            continue
        for k in out:
            if not np.array_equal(out[k], first[b][k]):
                identical = False
                detail = f"batch {b} output {k} differs by {np.abs(out[k] - first[b][k]).max()}"
    s.case("plan: outputs bit-identical between the recording run and the planned runs", identical,
           detail)
    peaks_ok = bool(plan_lines)
    for ln in plan_lines:
        mt = re.search(r"activation_arena_bytes=(\d+) activation_sum_bytes=(\d+)", ln)
        peaks_ok = peaks_ok and mt is not None and 0 < int(mt.group(1)) <= int(mt.group(2))
    s.case("plan: a log line per plan with activation_arena_bytes <= activation_sum_bytes", peaks_ok,
           plan_lines[0] if plan_lines else "no activation_plan line")
    # 10 shapes and 8 kept: 1 and 2 come back after eviction, so 12 plans are made in all
    s.case("plan: one plan per new input shape, the least recently used replaced past 8",
           len(plan_lines) == 12, f"{len(plan_lines)} plans made")
    # Against numpy for one batch: the plan did not change what is computed (float tolerance: a
    # sum of at most 72 products of values below 4, u = 2^-24, and the softmax's exp: 1e-5).
    x = xs[2]
    ref = reference(x, d)
    got = m.run([x])["prob"]
    s.case("plan: batch 2 matches numpy within 1e-5", np.abs(got - ref).max() < 1e-5,
           f"max diff {np.abs(got - ref).max():.3g}")
    m.close()

    # At load (the default): the declared shapes, batch 1 and max_batch_size, are planned by a run
    # of zeros each; the load line reports them, and requests at those batch sizes make no plan.
    n_log = len(plugin.log)
    m = plugin.load(d, config=OWN, max_batch_size=6)
    load_line = next((ln for ln in plugin.log[n_log:] if "activation_arena=" in ln), "")
    mt = re.search(r"planned_at_load=(\d+) activation_arena_bytes=(\d+)", load_line)
    s.case("plan at load: the load line reports 2 plans (batch 1 and max_batch_size) and their bytes",
           mt is not None and mt.group(1) == "2" and int(mt.group(2)) > 0, load_line)
    n_log = len(plugin.log)
    got = {}
    got[6] = m.run([np.concatenate([xs[3], xs[3]])])["prob"]
    got[1] = m.run([xs[1]])["prob"]
    s.case("plan at load: batch 1 and 6 requests make no new plan",
           not any("activation_plan" in ln for ln in plugin.log[n_log:]), str(plugin.log[n_log:]))
    ref6 = reference(np.concatenate([xs[3], xs[3]]), d)
    s.case("plan at load: batch 6 on the load-time plan matches numpy within 1e-5",
           np.abs(got[6] - ref6).max() < 1e-5, f"max diff {np.abs(got[6] - ref6).max():.3g}")
    m.close()
    from onnx_plugin import BackendError
    try:
        bad = dict(OWN["parameters"], plan_at_load={"string_value": "maybe"})
        plugin.load(d, config={"parameters": bad}).close()
        s.case("plan at load: plan_at_load \"maybe\" is a load error", False, "it loaded")
    except BackendError as e:
        s.case("plan at load: plan_at_load \"maybe\" is a load error", "plan_at_load" in str(e), str(e))

    # The oneDNN engine plans too (its outputs, reorders and the residual's buffer, which its
    # convolution takes over: the plan gives that slot the life of both values). Outputs of the
    # planned runs are bit-identical to the recording run's and match numpy: oneDNN's sums in
    # another order than numpy's float64, bounded as for our own runtime (72 products of values
    # below 4 in float: 1e-5 on the probabilities), with a margin for its blocked summation: 1e-4.
    try:
        m = plugin.load(d, config={"parameters": {"engine": {"string_value": "onednn"},
                                                  "plan_at_load": {"string_value": "false"}}},
                        max_batch_size=16)
    except BackendError as e:
        s.skip("plan: the oneDNN engine plans", str(e))
        return
    n_log = len(plugin.log)
    first, identical, detail = {}, True, ""
    for b in (1, 1, 4, 4, 1, 4):
        out = m.run([xs[b]])["prob"]
        if b not in first:
            first[b] = out
        elif not np.array_equal(out, first[b]):
            identical, detail = False, f"batch {b} differs by {np.abs(out - first[b]).max()}"
    lines = [ln for ln in plugin.log[n_log:] if "activation_plan" in ln]
    s.case("plan: the oneDNN engine makes one plan per shape", len(lines) == 2, str(lines))
    shared = [int(x) for ln in lines for x in re.findall(r"shared_buffers=(\d+)", ln)]
    s.case("plan: on oneDNN the residual Add's buffer is taken over and planned (shared_buffers >= 1)",
           len(shared) == 2 and min(shared) >= 1, str(lines))
    s.case("plan: oneDNN planned runs are bit-identical to the recording run", identical, detail)
    ref4 = reference(xs[4], d)
    s.case("plan: oneDNN batch 4 on its plan matches numpy within 1e-4",
           np.abs(first[4] - ref4).max() < 1e-4, f"max diff {np.abs(first[4] - ref4).max():.3g}")
    m.close()


def reference(x, d):
    import numpy as np
    import onnx
    from onnx import numpy_helper
    mp = onnx.load(os.path.join(d, "model.onnx"))
    W = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in mp.graph.initializer}
    x = x.astype(np.float64)

    def conv(x, w, b=None, pad=0):
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        y = np.zeros((n, o, h, wd))
        for i in range(kh):
            for j in range(kw):
                y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
        return y + (b[None, :, None, None] if b is not None else 0)

    r1 = np.maximum(conv(x, W["w1"], W["b1"], 1), 0)
    r2 = np.maximum(conv(r1, W["w2"], None, 1) + conv(r1, W["w3"]), 0)
    gated = 1 / (1 + np.exp(-r2[:, :4])) * r2[:, 4:]
    cat = np.concatenate([gated, r1], axis=1)
    n, c, h, wd = cat.shape
    p = cat.reshape(n, c, h // 2, 2, wd // 2, 2).max(axis=(3, 5))
    logits = p.mean(axis=(2, 3)) @ W["fc"] + W["fcb"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def seq_cases(plugin, root):
    """An encoder-like graph with a free sequence dimension besides the batch: x [N, S, 8] ->
    MatMul [8, 6] + bias -> Relu -> Softmax over the last axis -> y [N, S, 6]. Planned at load at
    the sequence length config.json fixes, or at parameters.plan_dims.x; a request of another
    length still runs (its plan is made on its first batch, counted by made_after_load=)."""
    import numpy as np
    from onnx import TensorProto as TP, helper, numpy_helper
    from onnx_plugin import BackendError
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    vi = helper.make_tensor_value_info
    d = save(os.path.join(root, "seq"), [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["y"], name="sm", axis=-1)],
        [vi("x", TP.FLOAT, ["N", "S", 8])], [vi("y", TP.FLOAT, ["N", "S", 6])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])

    def ref(x):
        h = np.maximum(x.astype(np.float64) @ w + b, 0)
        e = np.exp(h - h.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def load_line(n_log):
        return next((ln for ln in plugin.log[n_log:] if "activation_arena=" in ln), "")

    for engine in ("own", "onednn"):
        base = {"engine": {"string_value": engine}}
        # Without a planning size: the load says how to give one and plans nothing.
        n_log = len(plugin.log)
        try:
            m = plugin.load(d, config={"parameters": base}, max_batch_size=4)
        except BackendError as e:
            s.skip(f"seq plan ({engine})", str(e))
            continue
        skipped = [ln for ln in plugin.log[n_log:] if "plan_at_load=skipped" in ln]
        s.case(f"seq plan ({engine}): without a size the load logs plan_dims.x and plans nothing",
               len(skipped) == 1 and "plan_dims.x" in skipped[0] and
               "planned_at_load" not in load_line(n_log), str(plugin.log[n_log:]))
        m.close()
        # parameters.plan_dims.x "16,8": batch 1 and 4 at 16 tokens planned at load; requests at
        # 16 make no plan, a request at 5 tokens runs and makes one (made_after_load=1).
        n_log = len(plugin.log)
        m = plugin.load(d, config={"parameters": dict(base, **{"plan_dims.x": {"string_value": "16,8"}})},
                        max_batch_size=4)
        ll = load_line(n_log)
        s.case(f"seq plan ({engine}): plan_dims.x \"16,8\" plans batch 1 and 4 at load",
               "planned_at_load=2" in ll, ll)
        n_log = len(plugin.log)
        x16 = rng.standard_normal((4, 16, 8)).astype(np.float32)
        got16 = m.run([x16])["y"]
        got16b = m.run([x16[:1]])["y"]
        s.case(f"seq plan ({engine}): requests of the planned shapes make no plan",
               not any("activation_plan" in ln for ln in plugin.log[n_log:]), str(plugin.log[n_log:]))
        x5 = rng.standard_normal((2, 5, 8)).astype(np.float32)
        got5 = m.run([x5])["y"]
        lines = [ln for ln in plugin.log[n_log:] if "activation_plan" in ln]
        s.case(f"seq plan ({engine}): another length runs and is planned then (made_after_load=1)",
               len(lines) == 1 and "made_after_load=1" in lines[0] and "[2, 5, 8]" in lines[0], str(lines))
        # float: 8 products of values below ~4 and the softmax's exp: 1e-5 of probabilities <= 1
        err = max(np.abs(got16 - ref(x16)).max(), np.abs(got16b - ref(x16[:1])).max(),
                  np.abs(got5 - ref(x5)).max())
        s.case(f"seq plan ({engine}): outputs at 16 and 5 tokens match numpy within 1e-5", err < 1e-5,
               f"max diff {err:.3g}")
        m.close()

    # config.json fixing the length (dims [12, 8] for the graph's [N, S, 8]) plans it at load.
    n_log = len(plugin.log)
    cfg = {"parameters": OWN["parameters"],
           "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [12, 8]}]}
    m = plugin.load(d, config=cfg, max_batch_size=2)
    ll = load_line(n_log)
    s.case("seq plan: a length fixed in config.json dims is planned at load", "planned_at_load=2" in ll, ll)
    n_log = len(plugin.log)
    x12 = rng.standard_normal((2, 12, 8)).astype(np.float32)
    got = m.run([x12])["y"]
    s.case("seq plan: a request at the fixed length makes no plan and matches numpy",
           not any("activation_plan" in ln for ln in plugin.log[n_log:]) and
           np.abs(got - ref(x12)).max() < 1e-5, str(plugin.log[n_log:]))
    try:
        m.run([x12[:, :5]])
        s.case("seq plan: another length than config.json fixes is an error", False, "it ran")
    except BackendError as e:
        s.case("seq plan: another length than config.json fixes is an error", "[-1,12,8]" in
               str(e).replace(" ", "") or "12" in str(e), str(e))
    m.close()

    # Bad plan_dims and unknown parameters: load errors naming them.
    bad = [("plan_dims.x", "16", "has 2 dimensions past the batch"),
           ("plan_dims.x", "16,9", "dimension 2 of input \"x\" is 8, not 9"),
           ("plan_dims.x", "0,8", "positive sizes"),
           ("plan_dims.x", "16,,8", "positive sizes"),
           ("plan_dims.z", "16,8", "the model has no input \"z\""),
           ("precison", "int8", "parameters.precison is not a setting of the onnx backend"),
           ("intra_op_thread_count", "2", "parameters.intra_op_thread_count is not a setting")]
    for key, val, want in bad:
        try:
            plugin.load(d, config={"parameters": {key: {"string_value": val}}}, max_batch_size=4).close()
            s.case(f"parameters.{key} \"{val}\" is a load error", False, "it loaded")
        except BackendError as e:
            s.case(f"parameters.{key} \"{val}\" is a load error", want in str(e), str(e))


def main():
    if not os.path.exists(PLUGIN):
        s.skip("onnx plan", f"{PLUGIN} is not built")
        s.finish()
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as e:
        s.skip("onnx plan", f"python3 onnx/numpy missing: {e}")
        s.finish()
    sys.path.insert(0, os.path.dirname(__file__))
    from onnx_plugin import Plugin
    plugin = Plugin(PLUGIN)
    with tempfile.TemporaryDirectory() as root:
        s.guard("types", type_cases, plugin, root)
        s.guard("plan", plan_cases, plugin, root)
        s.guard("seq plan", seq_cases, plugin, root)
    s.finish()


main()
