"""test_onnx_gpu.py - the ONNX backend's GPU path (docs/cuda.md "ONNX models on the GPU"): the plugin with a KIND_GPU
config.json, in-process over the backend ABI (onnx_plugin.py), on two executor libraries:

- build/libfake_onnx_cuda.so, the host emulation of the device operations (tests/gpu/
  fake_onnx_dev.c) linked with the real host executor (backends/onnx/cuda/exec.c): always;
- the real libsampan_onnx_cuda.so (cuDNN, cuBLAS): compiled here for one architecture when nvcc is
  on the machine (or taken from $ONNX_GPU_LIB), loaded, and without a GPU it must refuse with the
  CUDA runtime's reason: a visible "skipped" line for everything that needs a GPU. With a GPU
  (bench/gpu/run.sh) the same checks run on it, and ResNet-50 itself at 224x224.

Checked on each library: ONNX's operator test cases (Debian's libonnx-testdata) whose operators the
executor lists, against their expected outputs (a refusal naming "on the GPU" or "not supported"
is counted, never passed); a ResNet-50-shaped CNN and a BERT-style encoder against the CPU runtime
in FP32 and FP16, at several batch sizes. On the emulation only: the convolution plan cache (one
algorithm search per node and input shape), the activation pool (allocations do not grow from run
to run, peak far below the number of values, all freed at unload), injected device faults (the
request fails naming the node, the executor stays failed, unload is clean), device out of memory
at load and at run (an error, not sticky), the library missing or off, no device, an operator the
executor lacks, and config.json errors.

Tolerances. FP32: every executor sums in float32 (the emulation in double) in its own order; a dot
product of K terms differs by at most K*u*sum|terms| (u = 2^-24) and errors add up over the D layers
of the deepest path, so outputs must agree within D*Kmax*u of the output's scale (max(1, max|ref|)).
Node cases: as tests/py/test_onnx_node.py (2^-13 of the scale). FP16: weights, inputs and every
activation are rounded to binary16 (u16 = 2^-11) with float accumulation: each layer adds at most
about 3 u16 relative (its input, its weights, its output), so within 3*D*u16 of the scale.
Last line:
    onnx-gpu: N passed, N failed, N skipped"""
import ctypes
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from common import ROOT, Suite, binary

s = Suite("onnx-gpu")
BUILD = os.path.dirname(binary() or os.path.join(ROOT, "build", "sampan"))
PLUGIN = os.path.join(BUILD, "backends", "libsampan_onnx.so")
FAKE = os.path.join(BUILD, "libfake_onnx_cuda.so")
DATA = "/usr/share/libonnx-testdata/data/node"
GPU = {"instance_group": [{"kind": "KIND_GPU", "count": 1}]}
U32, U16 = 2.0 ** -24, 2.0 ** -11
# The operators the GPU executor runs (backends/onnx/gpu.c's lowering).
GPU_OPS = {
    "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization",
    "Gemm", "MatMul", "Relu", "Sigmoid", "Tanh", "Gelu", "Erf", "Clip", "HardSwish", "LeakyRelu",
    "HardSigmoid", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity", "Add", "Sub", "Mul",
    "Div", "Pow", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Softmax",
    "LogSoftmax", "ReduceSum", "ReduceMean", "ReduceMax", "LayerNormalization", "Gather",
}
NODE_TOL = 2.0 ** -13

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def use_lib(path):
    os.environ["SAMPAN_ONNX_CUDA_LIB"] = path


def close(got, ref, tol):
    import numpy as np
    g, r = got.astype(np.float64), ref.astype(np.float64)
    if g.shape != r.shape:
        return False, f"shape {g.shape} vs {r.shape}"
    scale = max(1.0, float(np.abs(r).max()) if r.size else 1.0)
    err = float(np.abs(g - r).max()) if r.size else 0.0
    return err <= tol * scale, f"max error {err:.3g}, allowed {tol * scale:.3g}"


def node_cases(plugin, label, budget_s=None):
    """ONNX's operator cases on the GPU path. Returns (passed, refused, failed); with budget_s,
    stops (saying so) once that many seconds have gone (each load on a GPU creates its cuDNN
    and cuBLAS handles: the GPU run's time is counted)."""
    import time
    t0 = time.monotonic()
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx_plugin import BackendError
    passed = refused = failed = 0
    for d in sorted(glob.glob(os.path.join(DATA, "test_*"))):
        path = os.path.join(d, "model.onnx")
        if not os.path.isfile(path):
            continue
        try:
            ops = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
        except Exception:
            continue
        if not ops or not ops <= GPU_OPS:
            continue
        name = os.path.basename(d)
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            print(f"{label}: node cases stopped after {budget_s} s ({passed + refused + failed} run)", flush=True)
            break
        try:
            m = plugin.load(d, config=GPU)
        except BackendError as e:
            if "not supported" in str(e) or "on the GPU" in str(e):
                refused += 1
            else:
                failed += 1
                print(f"FAIL {label} {name}: load: {e}")
            continue
        ok = True
        try:
            for ds in sorted(glob.glob(os.path.join(d, "test_data_set_*"))):
                ins = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(ds, "input_*.pb")))]
                want = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(ds, "output_*.pb")))]
                try:
                    got = m.run(ins)
                except BackendError as e:
                    if "not supported" in str(e) or "on the GPU" in str(e):
                        refused += 1
                    else:
                        failed += 1
                        print(f"FAIL {label} {name}: run: {e}")
                    ok = None
                    break
                for (n, _, _), w in zip(m.outputs, want):
                    g = got[n]
                    if g.dtype != w.dtype or g.shape != w.shape:
                        why = f"{g.dtype}{g.shape} vs {w.dtype}{w.shape}"
                    elif w.dtype.kind in "biu":
                        why = None if (g == w).all() else "integers differ"
                    else:
                        wf, gf = w.astype(np.float64), g.astype(np.float64)
                        fin = np.isfinite(wf)
                        sc = max(1.0, float(np.abs(wf[fin]).max())) if fin.any() else 1.0
                        good = np.isclose(gf, wf, rtol=NODE_TOL, atol=NODE_TOL * sc, equal_nan=True) | (gf == wf)
                        why = None if good.all() else f"{int((~good).sum())} elements out of tolerance"
                    if why:
                        print(f"FAIL {label} {name} output '{n}': {why}")
                        ok = False
                        break
                if not ok:
                    break
        finally:
            m.close()
        if ok:
            passed += 1
        elif ok is False:
            failed += 1
    return passed, refused, failed


def model_dirs(tmp, rng, full=False):
    from onnx_gpu_models import build_encoder, build_resnet50
    dirs = {}
    for name in ("resnet", "encoder"):
        dirs[name] = os.path.join(tmp, name, "1")
        os.makedirs(dirs[name])
    if full:
        build_resnet50(os.path.join(dirs["resnet"], "model.onnx"), rng)
        depth, kmax = 54, 9 * 512
    else:
        build_resnet50(os.path.join(dirs["resnet"], "model.onnx"), rng, size=32, width=4, classes=10)
        depth, kmax = 54, 9 * 32
    build_encoder(os.path.join(dirs["encoder"], "model.onnx"), rng)
    return dirs, {"resnet": (depth, kmax), "encoder": (12, 64)}


def against_cpu(plugin, label, dirs, bounds, rng, batches=(1, 3, 8), full=False):
    """The two models on the GPU path against the CPU runtime, FP32 and FP16."""
    import numpy as np
    size = 224 if full else 32
    cpu = {k: plugin.load(v, max_batch_size=64) for k, v in dirs.items()}
    for prec in ("fp32", "fp16"):
        cfg = dict(GPU, parameters={"precision": {"string_value": prec}})
        for k, d in dirs.items():
            depth, kmax = bounds[k]
            tol = depth * kmax * U32 if prec == "fp32" else 3 * depth * U16
            g = plugin.load(d, config=cfg, max_batch_size=64)
            worst, ok = "", True
            for b in batches:
                if k == "resnet":
                    x = [rng.standard_normal((b, 3, size, size)).astype(np.float32)]
                else:
                    x = [rng.integers(0, 50, (b, 16)).astype(np.int64)]
                want, got = cpu[k].run(x), g.run(x)
                for n in want:
                    good, why = close(got[n], want[n], tol)
                    ok &= good
                    if not good or not worst:
                        worst = f"batch {b} {n}: {why}"
            g.close()
            s.case(f"{label}: {k} {prec} == CPU runtime (batches {list(batches)})", ok, worst)
    for m in cpu.values():
        m.close()


def fake_checks(plugin, dirs, rng):
    import numpy as np
    from onnx_plugin import BackendError
    fake = ctypes.CDLL(FAKE)
    fake.fake_oxd_live.restype = ctypes.c_long
    fake.fake_oxd_plans.restype = ctypes.c_long
    use_lib(FAKE)
    x = lambda b: [rng.standard_normal((b, 3, 32, 32)).astype(np.float32)]  # noqa: E731
    base = fake.fake_oxd_live()
    m = plugin.load(dirs["resnet"], config=GPU, max_batch_size=16)
    s.case("load logs placement=gpu", any("placement=gpu device=cuda:0" in line and "precision=fp32" in line
                                                 for line in plugin.log[-3:]), plugin.log[-1][:200])
    after_load = fake.fake_oxd_live()
    # plan cache: one algorithm search per convolution and input shape
    import onnx
    n_conv = sum(1 for n in onnx.load(os.path.join(dirs["resnet"], "model.onnx")).graph.node if n.op_type == "Conv")
    p0 = fake.fake_oxd_plans()
    m.run(x(1))
    p1 = fake.fake_oxd_plans()
    live1 = fake.fake_oxd_live()
    m.run(x(1))
    p2 = fake.fake_oxd_plans()
    live2 = fake.fake_oxd_live()
    m.run(x(3))
    p3 = fake.fake_oxd_plans()
    m.run(x(4))
    p4 = fake.fake_oxd_plans()
    m.run(x(1))
    p5 = fake.fake_oxd_plans()
    got = (p1 - p0, p2 - p1, p3 - p2, p4 - p3, p5 - p4)
    s.case("conv algorithms: measured once per node and batch bucket (1, 1, 3, 4 reuses 3's, 1)",
           got == (n_conv, 0, n_conv, 0, 0), f"{n_conv} convolutions; searches per run {got}")
    pool = live1 - after_load
    s.case("activation pool reused between runs", live2 == live1, f"{live1 - after_load} then {live2 - after_load} buffers")
    s.case("activation pool peak far below the values' count (liveness)", 0 < pool <= 12,
           f"{pool} device buffers (pool + workspace) for {n_conv} convolutions")
    # out of memory at run: an error, not sticky
    os.environ["FAKE_OXD_MEM_LIMIT"] = "1"
    try:
        m.run(x(8))
        s.case("device out of memory at run is an error", False, "ran")
    except BackendError as e:
        s.case("device out of memory at run is an error", "out of memory" in str(e), str(e))
    del os.environ["FAKE_OXD_MEM_LIMIT"]
    try:
        m.run(x(2))
        s.case("after out of memory the model runs again", True)
    except BackendError as e:
        s.case("after out of memory the model runs again", False, str(e))
    # an injected device fault: the request fails naming the node; the executor stays failed
    os.environ["FAKE_OXD_FAIL"] = "conv"
    try:
        m.run(x(1))
        s.case("injected conv fault fails the request", False, "ran")
    except BackendError as e:
        s.case("injected conv fault fails the request naming the node", "(Conv)" in str(e) and "illegal memory access" in str(e), str(e))
    del os.environ["FAKE_OXD_FAIL"]
    try:
        m.run(x(1))
        s.case("a failed device stays failed", False, "ran")
    except BackendError as e:
        s.case("a failed device stays failed (first message)", "illegal memory access" in str(e), str(e))
    m.close()
    s.case("unload frees every device allocation", fake.fake_oxd_live() == base, f"{fake.fake_oxd_live() - base} left")
    # out of memory at load
    os.environ["FAKE_OXD_MEM_LIMIT"] = "20000"
    try:
        plugin.load(dirs["resnet"], config=GPU, max_batch_size=16).close()
        s.case("device out of memory at load is a load error", False, "loaded")
    except BackendError as e:
        s.case("device out of memory at load is a load error", "out of memory" in str(e) and "cudaMalloc" in str(e), str(e))
    del os.environ["FAKE_OXD_MEM_LIMIT"]
    s.case("a failed load frees what it allocated", fake.fake_oxd_live() == base, f"{fake.fake_oxd_live() - base} left")

    def load_error(name, want, d=dirs["resnet"], config=GPU):
        try:
            plugin.load(d, config=config, max_batch_size=16).close()
            s.case(name, False, "loaded")
        except BackendError as e:
            s.case(name, all(w in str(e) for w in want), str(e))

    os.environ["FAKE_OXD_NO_DEVICE"] = "1"
    load_error("no device: KIND_GPU load error with the reason", ["GPU backend unavailable", "no CUDA device"])
    del os.environ["FAKE_OXD_NO_DEVICE"]
    use_lib("")
    load_error("SAMPAN_ONNX_CUDA_LIB empty: GPU off", ["GPU backend off"])
    use_lib("/nonexistent/libsampan_onnx_cuda.so")
    load_error("library missing: load error", ["cannot load libsampan_onnx_cuda.so", "make cuda"])
    use_lib(PLUGIN)
    load_error("a library without the symbol: load error", ["no sp_oxg_get_api"])
    use_lib(FAKE)
    load_error("KIND_CPU and KIND_GPU mixed: load error", ["both KIND_GPU and KIND_CPU"],
               config={"instance_group": [{"kind": "KIND_GPU"}, {"kind": "KIND_CPU"}]})
    load_error("two GPUs: load error", ["several GPUs"], config={"instance_group": [{"kind": "KIND_GPU", "gpus": [0, 1]}]})
    load_error("precision int3: load error", ["parameters.precision", "int3"],
               config=dict(GPU, parameters={"precision": {"string_value": "int3"}}))
    load_error("parameters.engine on a GPU model: load error", ["parameters.engine", "KIND_GPU"],
               config=dict(GPU, parameters={"engine": {"string_value": "onednn"}}))
    load_error("GPU 1 of one: load error", ["device 1 does not exist"], config={"instance_group": [{"kind": "KIND_GPU", "gpus": [1]}]})
    # an operator the executor lacks (the CPU runs it): a load error naming node and operator
    from onnx import TensorProto, helper
    wd = os.path.join(os.path.dirname(dirs["resnet"]), "..", "where", "1")
    os.makedirs(wd, exist_ok=True)
    from onnx import numpy_helper
    g = helper.make_graph(
        [helper.make_node("Pad", ["a", "pads"], ["y"], mode="constant", name="pad")], "w",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
        [numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "pads")])
    mm = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    mm.ir_version = 7
    with open(os.path.join(wd, "model.onnx"), "wb") as f:
        f.write(mm.SerializeToString())
    try:
        plugin.load(wd).close()
        cpu_ok = True
    except BackendError:
        cpu_ok = False
    try:
        plugin.load(wd, config=GPU).close()
        s.case("unsupported operator on the GPU: load error", False, "loaded")
    except BackendError as e:
        s.case("unsupported operator on the GPU: load error naming node and operator",
               cpu_ok and "node 'pad' (Pad)" in str(e) and "not supported by the GPU executor" in str(e), f"{e} (the CPU loads it: {cpu_ok})")
    s.case("nothing left allocated on the emulated device", fake.fake_oxd_live() == base, f"{fake.fake_oxd_live() - base} left")


def bench_dry_run():
    """bench/gpu/onnx_bench.py --emulate: every step of the GPU benchmark, on the host emulation and
    a fake NVML GPU, through `sampan serve` too, so the one GPU run does not stop on a setup error."""
    nvml = os.path.join(BUILD, "libfake_nvml.so")
    sampan = os.path.join(BUILD, "sampan")
    if not os.path.isfile(nvml):
        subprocess.run(["make", f"BUILD={BUILD}", nvml], cwd=ROOT, capture_output=True, timeout=120)
    if not (os.path.isfile(nvml) and os.path.isfile(sampan)):
        s.skip("bench/gpu/onnx_bench.py on the emulation", f"{nvml} or {sampan} not built (make all cuda-tests)")
        return
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu", "onnx_bench.py"), BUILD, "0.05", "--emulate"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    n = out.count("RESULT onnx ")
    n_serve = out.count("RESULT onnx-serve ")
    s.case("bench/gpu/onnx_bench.py runs on the emulation (6 points, 2 served)", r.returncode == 0 and n == 6 and n_serve == 2,
           out[-1500:])


def real_library(plugin, dirs, bounds, rng):
    """The real libsampan_onnx_cuda.so: built here for one architecture unless given."""
    from onnx_plugin import BackendError
    lib = os.environ.get("ONNX_GPU_LIB")
    if not lib:
        nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
        if nvcc is None:
            s.skip("real GPU executor", "no nvcc on this machine: libsampan_onnx_cuda.so not built")
            return
        # `make cuda` (tests/py/test_cuda.py runs it first) leaves the full library: use it when
        # it is up to date, else compile one architecture into a folder of its own (so that a
        # later `make cuda` never takes the one-architecture objects for its own)
        full = os.path.join(BUILD, "libsampan_onnx_cuda.so")
        q = subprocess.run(["make", "-q", f"NVCC={nvcc}", f"BUILD={BUILD}", full], cwd=ROOT, capture_output=True, timeout=60)
        if os.path.exists(full) and q.returncode == 0:
            lib = full
            s.case("libsampan_onnx_cuda.so built by make cuda (sm_80/89/90) and up to date", True, lib)
        else:
            cb = os.path.join(BUILD, "onnx-cuda-check")
            lib = os.path.join(cb, "libsampan_onnx_cuda.so")
            r = subprocess.run(["make", f"NVCC={nvcc}", f"CUDA_BUILD={cb}", "CUDA_ARCHS=80", "CUDA_PTX=", lib],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
            if not s.case("make: nvcc compiles and links libsampan_onnx_cuda.so (sm_80)",
                          r.returncode == 0 and os.path.exists(lib), (r.stdout + r.stderr)[-1500:]):
                return
    use_lib(os.path.abspath(lib))
    try:
        m = plugin.load(dirs["resnet"], config=GPU, max_batch_size=16)
    except BackendError as e:
        msg = str(e)
        if "no CUDA device" in msg or "does not exist" in msg:
            s.case("real library loads and refuses with the runtime's reason", "GPU backend unavailable" in msg, msg)
            s.skip("real GPU executor: node cases, ResNet-50, encoder on a GPU", "no GPU here (bench/gpu/run.sh runs them)")
        else:
            s.case("real library loads a model", False, msg)
        return
    m.close()
    s.case("real library loads a model on the GPU", True, plugin.log[-1][:200])
    passed, refused, failed = node_cases(plugin, "gpu", budget_s=45)
    print(f"onnx-gpu (real GPU): node cases {passed} passed, {refused} refused, {failed} failed", flush=True)
    s.case("real GPU: ONNX node cases", failed == 0 and passed > 100, f"{passed} passed, {refused} refused, {failed} failed")
    against_cpu(plugin, "real GPU", dirs, bounds, rng)
    if os.environ.get("ONNX_GPU_FULL"):
        tmp = tempfile.mkdtemp()
        fdirs, fbounds = model_dirs(tmp, rng, full=True)
        against_cpu(plugin, "real GPU ResNet-50 224x224", {"resnet": fdirs["resnet"]}, fbounds, rng, batches=(2,), full=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    try:
        import numpy as np
        import onnx  # noqa: F401
    except ImportError as e:
        s.skip("onnx gpu", f"{e} (apt-get install python3-onnx python3-numpy)")
        s.finish()
    for f in (PLUGIN, FAKE):
        if not os.path.isfile(f):
            s.case(f"{f} built (make unit)", False)
            s.finish()
    from onnx_plugin import Plugin
    plugin = Plugin(PLUGIN)
    rng = np.random.default_rng(22)
    tmp = tempfile.mkdtemp()
    try:
        dirs, bounds = model_dirs(tmp, rng)
        only_real = os.environ.get("ONNX_GPU_LIB") is not None
        if not only_real:
            use_lib(FAKE)
            if os.path.isdir(DATA):
                passed, refused, failed = node_cases(plugin, "emulation")
                print(f"onnx-gpu (emulation): node cases {passed} passed, {refused} refused, {failed} failed", flush=True)
                s.case("emulation: ONNX node cases", failed == 0 and passed > 100, f"{passed} passed, {refused} refused, {failed} failed")
            else:
                s.skip("emulation: ONNX node cases", f"{DATA} missing (apt-get install libonnx-testdata)")
            s.guard("emulation vs CPU", against_cpu, plugin, "emulation", dirs, bounds, rng)
            s.guard("emulation host logic", fake_checks, plugin, dirs, rng)
            s.guard("bench on the emulation", bench_dry_run)
        s.guard("real library", real_library, plugin, dirs, bounds, rng)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


if __name__ == "__main__":
    main()
