"""test_onnx_files.py - the ONNX backend's checks of untrusted model files and of config.json
against the graph, in-process through the backend ABI (onnx_plugin.py): external tensor data is
read only from inside the model folder (no "..", no absolute path, no symlink leading out, no
range past the file's end) and, when it is there, gives the right values; tensor data that does
not match its dims, cycles, duplicate definitions, unknown inputs, unsupported opsets, operators
and attributes are load errors naming the file and the node or tensor; declared inputs and
outputs are checked against the graph; fixed batch dimensions are refused with max_batch_size;
wrong inputs at run time are errors, not crashes. Last line:
    onnx-files: N passed, N failed, N skipped"""
import os
import shutil
import sys
import tempfile

from common import Suite, binary

s = Suite("onnx-files")
PLUGIN = os.path.join(os.path.dirname(binary() or "build/sampan"), "backends", "libsampan_onnx.so")


def main():
    np, _ = s.need("onnx files", ("numpy", "onnx"), (PLUGIN,), "python3-onnx")
    from onnx import TensorProto, helper, numpy_helper
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from onnx_plugin import BackendError, Plugin
    plugin = Plugin(PLUGIN)
    tmp = tempfile.mkdtemp(prefix="sampan-onnx-files-")
    F = TensorProto.FLOAT
    vi = helper.make_tensor_value_info

    def write(name, nodes, inits, opset=13, inputs=None, outputs=None, ir=7):
        d = os.path.join(tmp, name, "1")
        os.makedirs(d, exist_ok=True)
        g = helper.make_graph(nodes, name, inputs or [vi("x", F, ["N", 4])],
                              outputs or [vi("y", F, ["N", 4])], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = ir
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(m.SerializeToString())
        return d

    def load_error(d, **kw):
        try:
            plugin.load(d, **kw).close()
            return None
        except BackendError as e:
            return str(e)

    def external(name, location, offset=0, length=None):
        t = TensorProto()
        t.name = "w"
        t.data_type = F
        t.dims.extend([4])
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", str(offset)),
                     ("length", str(16 if length is None else length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return write(name, [helper.make_node("Mul", ["x", "w"], ["y"], name="scale")], [t])

    w = np.array([1.5, -2.0, 0.25, 4.0], np.float32)
    # A good external file: 8 bytes of padding, then the 16 bytes of w.
    d = external("ext_ok", "weights.bin", offset=8)
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        f.write(b"\0" * 8 + w.tobytes())
    m = plugin.load(d)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = m.run([x])["y"]
    m.close()
    s.case("external data inside the folder is read at its offset", np.array_equal(got, x * w),
           str(got))

    outside = os.path.join(tmp, "secret.bin")
    with open(outside, "wb") as f:
        f.write(w.tobytes())
    for name, loc, want in [("ext_dotdot", "../../secret.bin", "relative path inside"),
                            ("ext_abs", outside, "relative path inside"),
                            ("ext_missing", "nothere.bin", "No such file")]:
        e = load_error(external(name, loc))
        s.case(f"external data {loc!r} is refused", e is not None and want in e and "'w'" in e, str(e))
    d = external("ext_link", "link.bin")
    os.symlink(outside, os.path.join(d, "link.bin"))
    e = load_error(d)
    s.case("external data through a symlink leading out is refused",
           e is not None and "outside the model folder" in e, str(e))
    d = external("ext_short", "weights.bin", offset=4)
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        f.write(w.tobytes())
    e = load_error(d)
    s.case("external data past the file's end is refused", e is not None and "past its end" in e, str(e))

    bad = TensorProto()
    bad.name = "w"
    bad.data_type = F
    bad.dims.extend([4])
    bad.raw_data = b"\0" * 12
    e = load_error(write("raw_short", [helper.make_node("Mul", ["x", "w"], ["y"])], [bad]))
    s.case("raw_data shorter than the dims is refused naming the tensor",
           e is not None and "model.onnx" in e and "'w'" in e and "raw_data has 12 bytes" in e, str(e))

    e = load_error(write("cycle", [helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                                   helper.make_node("Relu", ["a"], ["b"], name="n2"),
                                   helper.make_node("Identity", ["a"], ["y"], name="n3")], []))
    s.case("a cycle is refused naming a node on it", e is not None and "cycle" in e and
           ("'n1'" in e or "'n2'" in e), str(e))
    e = load_error(write("dup", [helper.make_node("Relu", ["x"], ["y"], name="a"),
                                 helper.make_node("Relu", ["x"], ["y"], name="b")], []))
    s.case("an output defined twice is refused", e is not None and "defined twice" in e, str(e))
    e = load_error(write("undef", [helper.make_node("Add", ["x", "nope"], ["y"], name="add")], []))
    s.case("an undefined input is refused naming node and input",
           e is not None and "'add'" in e and "'nope'" in e, str(e))
    e = load_error(write("opset", [helper.make_node("Relu", ["x"], ["y"])], [], opset=99))
    s.case("an unsupported opset is refused", e is not None and "opset 99" in e, str(e))
    # Below opset 7 only operators unchanged since are read: Add-6 (broadcast attribute) is
    # refused naming the node, Relu-6 loads; Relu at opset 5 is Relu-1 (consumed_inputs): refused.
    e = load_error(write("opset6add", [helper.make_node("Add", ["x", "x"], ["y"], name="a6")], [], opset=6))
    s.case("opset 6: Add (broadcast attribute before 7) is refused naming the node",
           e is not None and "'a6'" in e and "Add at opset 6" in e, str(e))
    e = load_error(write("opset6relu", [helper.make_node("Relu", ["x"], ["y"], name="r6")], [], opset=6))
    s.case("opset 6: Relu (unchanged since 6) loads", e is None, str(e))
    e = load_error(write("opset5relu", [helper.make_node("Relu", ["x"], ["y"], name="r5")], [], opset=5))
    s.case("opset 5: Relu-1 is refused", e is not None and "Relu at opset 5" in e, str(e))
    e = load_error(write("opset0", [helper.make_node("Relu", ["x"], ["y"])], [], opset=0))
    s.case("opset 0 is refused", e is not None and "opset 0" in e, str(e))
    e = load_error(write("attr", [helper.make_node("Relu", ["x"], ["y"], name="r", bogus=1)], []))
    s.case("an attribute the operator does not read is refused",
           e is not None and "'r'" in e and "attribute 'bogus' is not supported" in e, str(e))
    e = load_error(write("pool3d", [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2])], []))
    s.case("a 3-D pool is refused at load", e is not None and "not supported" in e, str(e))
    e = load_error(write("domain", [helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")], []))
    s.case("an operator of another domain is refused",
           e is not None and "com.example.Relu is not supported" in e, str(e))

    d = write("relu", [helper.make_node("Relu", ["x"], ["y"])], [])
    e = load_error(d, max_batch_size=4, config={"input": [{"name": "x", "data_type": "TYPE_FP32",
                                                           "dims": [5]}]})
    s.case("declared dims that differ from the graph's are refused",
           e is not None and "input[0]" in e and "[5]" in e, str(e))
    e = load_error(d, max_batch_size=4, config={"input": [{"name": "z", "data_type": "TYPE_FP32",
                                                           "dims": [4]}]})
    s.case("a declared input the graph lacks is refused", e is not None and "\"z\"" in e, str(e))
    e = load_error(d, max_batch_size=4, config={"output": [{"name": "y", "data_type": "TYPE_INT64",
                                                            "dims": [4]}]})
    s.case("a declared output of another type is refused", e is not None and "output[0]" in e, str(e))
    d2 = write("fixed", [helper.make_node("Relu", ["x"], ["y"])], [], inputs=[vi("x", F, [2, 4])],
               outputs=[vi("y", F, [2, 4])])
    e = load_error(d2, max_batch_size=4)
    s.case("a fixed first dimension with max_batch_size is refused",
           e is not None and "batch" in e, str(e))
    m = plugin.load(d, max_batch_size=4)
    ok = m.inputs == [("x", "FP32", [4])] and m.outputs == [("y", "FP32", [4])]
    s.case("inputs and outputs come from the graph without the batch dimension", ok,
           f"{m.inputs} {m.outputs}")
    for what, arr in [("wrong width", np.zeros((2, 5), np.float32)),
                      ("wrong type", np.zeros((2, 4), np.int32))]:
        try:
            m.run([arr])
            s.case(f"run: {what} is an error", False, "accepted")
        except BackendError as e:
            s.case(f"run: {what} is an error naming the input", "\"x\"" in str(e), str(e))
    got = m.run([np.array([[-1, 2, -3, 4]], np.float32)])["y"]
    s.case("... and the instance still runs", got.tolist() == [[0, 2, 0, 4]], str(got))
    m.close()

    # Folding and fusion keep the values: 1x1 Conv + BatchNormalization + Relu (fused into the
    # convolution), MatMul + Add (one GEMM with bias), a Reshape target from Constants (folded),
    # against numpy; the load's log line says what was folded and fused.
    rng = np.random.default_rng(3)
    cw = rng.standard_normal((3, 2, 1, 1)).astype(np.float32)
    cb = rng.standard_normal(3).astype(np.float32)
    sc, bb, mu = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, 3).astype(np.float32)
    mw = rng.standard_normal((12, 5)).astype(np.float32)
    mb = rng.standard_normal(5).astype(np.float32)
    arrs = [numpy_helper.from_array(a, n) for a, n in
            ((cw, "cw"), (cb, "cb"), (sc, "sc"), (bb, "bb"), (mu, "mu"), (var, "var"), (mw, "mw"), (mb, "mb"))]
    d = write("fuse", [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "sc", "bb", "mu", "var"], ["n"], epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Constant", [], ["k0"], value=helper.make_tensor("k", TensorProto.INT64, [1], [-1])),
        helper.make_node("Constant", [], ["k1"], value=helper.make_tensor("k", TensorProto.INT64, [1], [12])),
        helper.make_node("Concat", ["k0", "k1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["r", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "mw"], ["mm"]),
        helper.make_node("Add", ["mm", "mb"], ["y"]),
    ], arrs, inputs=[vi("x", F, ["N", 2, 2, 2])], outputs=[vi("y", F, ["N", 5])])
    m = plugin.load(d, max_batch_size=4)
    log = plugin.log[-1] if plugin.log else ""
    xin = rng.standard_normal((3, 2, 2, 2)).astype(np.float32)
    got = m.run([xin])["y"]
    m.close()
    conv = np.einsum("oc,nchw->nohw", cw[:, :, 0, 0], xin) + cb[None, :, None, None]
    bn = (conv - mu[None, :, None, None]) / np.sqrt(var + 1e-3)[None, :, None, None] * \
        sc[None, :, None, None] + bb[None, :, None, None]
    want = np.maximum(bn, 0).reshape(3, 12) @ mw + mb
    # float32 in other operation orders: 3 layers of dot products of at most 12 terms differ by
    # at most 3*12*2^-24 of the sum of |terms| (2^-18.4); 2^-13 of the output's scale is ample
    # and still far below what a wrong fold (a dropped mean, a missing bias) changes.
    err = float(np.abs(got - want).max())
    s.case("fused Conv+BN+Relu and MatMul+Add match numpy",
           err <= 2.0 ** -13 * max(1.0, float(np.abs(want).max())), f"max diff {err}")
    s.case("the load log says 3 nodes folded and 3 fused", "folded=3 fused=3" in log, log)

    # The own engine's n_threads splits large GEMMs in row or column blocks: every element keeps
    # its summation order, so the result is the same to the bit, and matches numpy (K = 300
    # terms: 2^-13). oneDNN (the default engine) promises no such thing: on an AVX2-only CPU (Zen
    # 3) its 64 x 96 product on 3 threads differs in the last bits from 1 thread (its threads
    # split the work in another order), so there the thread counts are held to numpy's bound.
    def on_1_and_3_threads(d, xa, config):
        ys = []
        for n in (1, 3):
            m = plugin.load(d, config=config, n_threads=n)
            ys.append(m.run([xa])["y"])
            m.close()
        return ys

    for shape_a, shape_b in (((64, 300), (300, 96)), ((3, 300), (300, 2000))):
        bw = rng.standard_normal(shape_b).astype(np.float32)
        d = write(f"mt{shape_a[0]}", [helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [numpy_helper.from_array(bw, "w")], inputs=[vi("x", F, list(shape_a))],
                  outputs=[vi("y", F, [shape_a[0], shape_b[1]])])
        xa = rng.standard_normal(shape_a).astype(np.float32)
        want = xa.astype(np.float64) @ bw.astype(np.float64)
        bound = 2.0 ** -13 * float(np.abs(want).max())
        y1, y3 = on_1_and_3_threads(d, xa, {"parameters": {"engine": {"string_value": "own"}}})
        s.case(f"MatMul {shape_a}x{shape_b}, own engine: 3 threads equal 1 thread to the bit, and numpy",
               np.array_equal(y1, y3) and float(np.abs(y1 - want).max()) <= bound,
               f"threads differ by {float(np.abs(y1 - y3).max())}, numpy by {float(np.abs(y1 - want).max())}")
        y1, y3 = on_1_and_3_threads(d, xa, None)
        s.case(f"MatMul {shape_a}x{shape_b}, default engine: 1 and 3 threads within numpy's bound",
               max(float(np.abs(y1 - want).max()), float(np.abs(y3 - want).max())) <= bound,
               f"numpy by {float(np.abs(y1 - want).max())} / {float(np.abs(y3 - want).max())}")
    shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
