"""test_onnx_node.py - ONNX's own operator test cases (Debian's libonnx-testdata:
/usr/share/libonnx-testdata/data/node/test_*/model.onnx with test_data_set_*/input_*.pb and
output_*.pb) through the ONNX backend plugin, in-process over the backend ABI (onnx_plugin.py).

Every case whose graph uses only operators the backend lists is run: a load error that says
"not supported" (an attribute, a data type, a mode or a rank the backend does not do), or the
same refusal of a data type when the node runs, counts as skipped with its reason, never as a
pass; any other load error, a run error, a wrong shape or
type, or a value out of tolerance is a failure. Cases using other operators are not counted.

Tolerance (float outputs): the expected values were computed in float32 or float64 by numpy;
ours are float32 with other summation orders. With unit roundoff u = 2^-24, a sum of K terms
differs by at most K*u*sum|terms|; the node cases reduce over at most a few hundred terms of
values of order 1 (K*u < 2^-14), and libm's exp/erf/pow/tanh are within 2 ulp. So each element
must satisfy |got - want| <= 2^-13 * (|want| + max(1, max|want|)): twice that bound, on the
output's own scale. Integer and boolean outputs must be exact.

The cases run on the plugin's default engine (oneDNN when it was built with libdnnl-dev), and all
of them once more on our own runtime ("own:" names), so that both engines pass the same suite;
there each data set runs twice, the second time on the arena memory plan the first run made
(backends/onnx/plan.c), which must give the same bits. Last line:
    onnx-node: N passed, N failed, N skipped"""
import glob
import os
import re
import sys

from common import Suite, binary

s = Suite("onnx-node")
DATA = "/usr/share/libonnx-testdata/data/node"
PLUGIN = os.path.join(os.path.dirname(binary() or "build/sampan"), "backends", "libsampan_onnx.so")

# The operators of the backend's table (backends/onnx/ops.c and ops_nn.c, docs/backends.md).
SUPPORTED = {
    "Add", "Sub", "Mul", "Div", "Pow", "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "Gelu",
    "Erf", "HardSwish", "HardSigmoid", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal",
    "Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split",
    "Slice", "Gather", "Shape", "Expand", "Where", "Cast", "Constant", "Softmax", "LogSoftmax",
    "ReduceMean", "ReduceSum", "ReduceMax", "LayerNormalization", "Pad", "Conv", "MaxPool",
    "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "Gemm", "MatMul",
    # ops_quant.c
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearMatMul",
    "ConvInteger", "QLinearConv",
    # ops_more.c
    "ConvTranspose", "Resize",
}
TOL = 2.0 ** -13
# The config that selects our own runtime instead of oneDNN.
OWN = {"parameters": {"engine": {"string_value": "own"}}}


def compare(got, want):
    import numpy as np
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"type {got.dtype}, expected {want.dtype}"
    if want.dtype.kind in "biu":
        bad = np.flatnonzero(got != want)
        return f"{bad.size} elements differ" if bad.size else None
    w = want.astype(np.float64)
    g = got.astype(np.float64)
    scale = max(1.0, float(np.nanmax(np.abs(w[np.isfinite(w)]))) if np.isfinite(w).any() else 1.0)
    ok = np.isclose(g, w, rtol=TOL, atol=TOL * scale, equal_nan=True) | (g == w)
    if ok.all():
        return None
    i = int(np.flatnonzero(~ok.ravel())[0])
    return f"{int((~ok).sum())} elements out of tolerance, first {g.ravel()[i]} vs {w.ravel()[i]}"


def run_case(plugin, d, ops, config=None):
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx_plugin import BackendError
    name = os.path.basename(d) if config is None else "own:" + os.path.basename(d)
    try:
        m = plugin.load(d, config=config)
    except BackendError as e:
        if "not supported" in str(e):
            s.skip(name, str(e).split(": ", 1)[-1])
        else:
            s.case(name, False, f"load: {e}")
        return
    try:
        for ds in sorted(glob.glob(os.path.join(d, "test_data_set_*"))):
            ins = [numpy_helper.to_array(onnx.load_tensor(f))
                   for f in sorted(glob.glob(os.path.join(ds, "input_*.pb")))]
            want = [numpy_helper.to_array(onnx.load_tensor(f))
                    for f in sorted(glob.glob(os.path.join(ds, "output_*.pb")))]
            try:
                got = m.run(ins)
            except BackendError as e:
                # Element types follow ONNX's rules at load (dtype.c); a type the rules allow
                # but a kernel does not compute is refused when the node runs: a skip like a
                # load-time refusal.
                if "not supported" in str(e):
                    s.skip(name, f"run: {e}")
                else:
                    s.case(name, False, f"run: {e}")
                return
            names = [o[0] for o in m.outputs]
            for n, w in zip(names, want):
                why = compare(got[n], w)
                if why:
                    s.case(name, False, f"{os.path.basename(ds)} output '{n}': {why}")
                    return
            if config is not None:
                # Our own runtime: the first run recorded the sizes and made the arena plan
                # (backends/onnx/plan.c); the second follows it and must give the same bits.
                again = m.run(ins)
                for n in names:
                    if not np.array_equal(again[n], got[n], equal_nan=got[n].dtype.kind == "f"):
                        s.case(name, False, f"{os.path.basename(ds)} output '{n}': the run on the "
                               "arena plan differs from the first")
                        return
        s.passed += 1
    finally:
        m.close()


def main():
    if not os.path.isdir(DATA):
        s.skip("onnx node cases", f"{DATA} missing (apt-get install libonnx-testdata)")
        s.finish()
    _, onnx = s.need("onnx node cases", ("numpy", "onnx"), (PLUGIN,), "python3-onnx python3-numpy")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from onnx_plugin import Plugin
    plugin = Plugin(PLUGIN)
    cases = []
    for d in sorted(glob.glob(os.path.join(DATA, "test_*"))):
        path = os.path.join(d, "model.onnx")
        if not os.path.isfile(path):
            continue
        try:
            ops = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
        except Exception:  # a model python-onnx cannot read is not one of ours to judge
            continue
        if not ops or not ops <= SUPPORTED:
            continue
        cases.append((d, ops))
    # Every case on the default engine (oneDNN when the plugin has it), then the cases of the
    # operators oneDNN takes once more on our own runtime (the fallback and the reference).
    for d, ops in cases:
        s.guard(os.path.basename(d), run_case, plugin, d, ops)
    engines = " ".join(re.findall(r"engine=\w+", " ".join(plugin.log)))
    n_dnnl = sum(1 for line in plugin.log if "onednn_primitives" in line)
    if "engine=onednn" in engines:
        print(f"onnx-node: {n_dnnl} cases ran oneDNN primitives", flush=True)
        # 36 of the 50 cases with its operators (ONNX 1.12's data); the others are 1-D or 3-D
        # windows, UINT8, Gemm's scalar or matrix C, opset 1: our own runtime's, or refused.
        s.case("oneDNN ran the cases of its operators", n_dnnl >= 30, f"{n_dnnl} cases")
    else:
        s.skip("the oneDNN engine", "the plugin was built without libdnnl-dev: own runtime only")
    # Every case once more on our own runtime, each data set twice (the second run on the arena
    # plan the first made).
    for d, ops in cases:
        s.guard("own:" + os.path.basename(d), run_case, plugin, d, ops, OWN)
    print(f"onnx-node: {len(cases)} cases again on the own runtime, twice each", flush=True)
    print(f"onnx-node: {len(cases)} cases use only supported operators", flush=True)
    s.case("the supported operators have test cases", len(cases) > 300, f"{len(cases)} cases")
    s.finish()


if __name__ == "__main__":
    main()
