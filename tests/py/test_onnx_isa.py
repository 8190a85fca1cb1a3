"""test_onnx_isa.py - which oneDNN implementations the ONNX plugin's primitives get, at the CPU's
own ISA and capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, an AVX2-only CPU: no AVX-512, no VNNI).

A layout or post-op oneDNN has no JIT kernel for silently runs on its reference implementation
(`ref:`, or `simple_` for pooling, in ONEDNN_VERBOSE's exec lines): same results, 20x slower (ResNet-50's projection blocks
once went from 35 to 800 ms that way). This builds a small ResNet (bottleneck blocks with
projection shortcuts, tests/py/onnx_models.build_resnet), its INT8 file from `sampan optimize`
(which puts a calibrated Q -> DQ pair on each projection residual), and runs FP32 and INT8 on
oneDNN at batch 1 and 4 in child processes (the variables are read when oneDNN starts) with
ONEDNN_VERBOSE=1: no convolution, matmul, inner product or pooling may be `ref:`, and every
convolution of the INT8 file must be a oneDNN primitive (as many created as for FP32, no
fallbacks: the projection pairs stay on oneDNN). The AVX2 case is skipped, with a line saying
so, when the CPU has no AVX2 or oneDNN ignored the cap (its ISA line does not say AVX2).
Last line: "onnx-isa: N passed, N failed, N skipped"."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from common import ROOT, Suite, binary, run

s = Suite("onnx-isa")
PLUGIN = os.path.join(os.path.dirname(binary() or os.path.join(ROOT, "build", "sampan")), "backends",
                      "libsampan_onnx.so")
CHECKED = ("convolution", "matmul", "inner_product", "pooling", "pooling_v2")


def child(d):
    """Runs in the child: FP32 then INT8 on oneDNN, batch 1 and 4; prints the stats lines."""
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from onnx_plugin import Plugin
    p = Plugin(PLUGIN)
    x = np.random.default_rng(3).standard_normal((4, 3, 32, 32)).astype(np.float32)
    for prec in ("fp32", "int8"):
        p.log.clear()
        m = p.load(d, config={"parameters": {"engine": {"string_value": "onednn"},
                                             "precision": {"string_value": prec}}}, max_batch_size=4, n_threads=2)
        try:
            for b in (1, 4):
                m.run([x[:b]])
        finally:
            m.close()
        st = [ln for ln in p.log if "onednn_primitives" in ln]
        mode = next((ln.split("onednn_int8=")[1].split()[0] for ln in p.log if "onednn_int8=" in ln), "?")
        print(f"STATS {prec} int8={mode} {st[-1] if st else 'none'}", flush=True)


def main():
    try:
        import numpy as np
        import onnx
    except ImportError as e:
        s.skip("onnx isa", f"{e} (apt-get install python3-onnx python3-numpy)")
        s.finish()
    if not binary() or not os.path.isfile(PLUGIN):
        s.skip("onnx isa", "build/sampan or the ONNX plugin is not built")
        s.finish()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from onnx_models import build_resnet
    tmp = tempfile.mkdtemp(prefix="sampan-onnx-isa-")
    try:
        d = os.path.join(tmp, "1")
        os.makedirs(d)
        path = os.path.join(d, "model.onnx")
        build_resnet(path, np.random.default_rng(5), blocks=(1, 1), width=8, size=32, classes=10)
        calib = os.path.join(tmp, "calib.npy")
        np.save(calib, np.random.default_rng(6).standard_normal((8, 3, 32, 32)).astype(np.float32))
        rc, out, err = run([binary(), "optimize", path, "--precision", "int8", "--calib", calib, "--threads", "2"])
        s.case("sampan optimize writes the INT8 file", rc == 0, err[-300:] or out[-300:])
        if rc != 0:
            s.finish()
        # a pair on each projection residual: a Q -> DQ whose DQ output an Add reads
        g = onnx.load(os.path.join(d, "model_int8.onnx")).graph
        adds = {i for n in g.node if n.op_type == "Add" for i in n.input}
        dq_of = {n.input[0]: n.output[0] for n in g.node if n.op_type == "DequantizeLinear"}
        pairs = [n for n in g.node if n.op_type == "QuantizeLinear" and dq_of.get(n.output[0]) in adds]
        s.case("optimize: a calibrated pair on each projection residual (2 blocks)", len(pairs) == 2,
               f"{len(pairs)} pairs")
        # --weight-bits 7: weights in [-63, 63] and every activation UINT8 (signed ones with zero
        # point 128): what oneDNN computes exactly without VNNI (dnnl.c isa_vnni)
        d7 = os.path.join(tmp, "w7", "1")
        os.makedirs(d7)
        shutil.copy(path, os.path.join(d7, "model.onnx"))
        rc, out, err = run([binary(), "optimize", path, "--precision", "int8", "--calib", calib, "--threads", "2",
                            "--weight-bits", "7", "--int8-out", os.path.join(d7, "model_int8.onnx")])
        from onnx import numpy_helper
        g7 = onnx.load(os.path.join(d7, "model_int8.onnx")).graph
        w7 = [numpy_helper.to_array(t) for t in g7.initializer if t.name.endswith("__int8")]
        zps = [numpy_helper.to_array(t) for t in g7.initializer if t.name.endswith("__act_zp")]
        s.case("optimize --weight-bits 7: weights within [-63, 63] (63 reached), activations UINT8",
               rc == 0 and w7 and max(int(np.abs(w.astype(np.int32)).max()) for w in w7) == 63 and zps and
               all(z.dtype == np.uint8 for z in zps) and any(int(z) == 128 for z in zps),
               err[-300:] or f"{len(w7)} weights, zero points {[(z.dtype.name, int(z)) for z in zps]}")
        # without VNNI (the AVX2 cap) an 8-bit file gets a note saying where it will run; a 7-bit one not
        if "avx2" in open("/proc/cpuinfo").read().split():
            cap = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
            rc8, out8, _ = run([binary(), "optimize", path, "--precision", "int8", "--calib", calib, "--threads", "2",
                                "--int8-out", os.path.join(tmp, "cap8.onnx")], env=cap)
            rc7, out7, _ = run([binary(), "optimize", path, "--precision", "int8", "--calib", calib, "--threads", "2",
                                "--weight-bits", "7", "--int8-out", os.path.join(tmp, "cap7.onnx")], env=cap)
            s.case("optimize at the AVX2 cap: a note for the 8-bit file (own kernels there), none for --weight-bits 7",
                   rc8 == 0 and rc7 == 0 and "no VNNI" in out8 and "--weight-bits 7" in out8 and "no VNNI" not in out7,
                   out8[-300:])
        here = os.path.abspath(__file__)
        cpu_avx2 = "avx2" in open("/proc/cpuinfo").read().split()
        for isa in ("default", "AVX2"):
            env = dict(os.environ, ONEDNN_VERBOSE="1", OMP_WAIT_POLICY="passive")
            env.pop("ONEDNN_MAX_CPU_ISA", None)
            if isa == "AVX2":
                if not cpu_avx2:
                    s.skip("oneDNN capped at AVX2", "this CPU has no AVX2")
                    continue
                env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
            for bits, dd in (("8-bit", d), ("7-bit", d7)):
                p = subprocess.run([sys.executable, here, "--child", dd], env=env, capture_output=True, text=True,
                                   timeout=300)
                lines = p.stdout.splitlines()
                isa_line = next((ln for ln in lines if ln.startswith("onednn_verbose,info,cpu,isa:")), "")
                if p.returncode != 0:
                    s.case(f"oneDNN {isa}, {bits} weights: the child ran", False, p.stderr[-500:])
                    continue
                if isa == "AVX2" and ("AVX2" not in isa_line or "512" in isa_line):
                    s.skip("oneDNN capped at AVX2", f"oneDNN ignored ONEDNN_MAX_CPU_ISA ({isa_line or 'no ISA line'})")
                    break
                impls = {}
                for ln in lines:
                    f = ln.split(",")
                    if ln.startswith("onednn_verbose,exec,cpu,") and len(f) > 4 and f[3] in CHECKED:
                        impls.setdefault(f"{f[3]} {f[4]}", 0)
                        impls[f"{f[3]} {f[4]}"] += 1
                st = {k: (int(c), int(f)) for k, c, f in
                      re.findall(r"STATS (\w+) .*?created=(\d+) .*?fallbacks=(\d+)", p.stdout)}
                mode = (re.findall(r"STATS int8 int8=(\S+)", p.stdout) or ["?"])[0]
                # 8-bit weights without VNNI (int8=u8_w7): the own exact kernels run the INT8
                # convolutions (oneDNN's would saturate), so the pools read plain NCHW and may take
                # oneDNN's simple_nchw: speed, not correctness; the 7-bit file stays on oneDNN
                own8 = bits == "8-bit" and mode != "vnni"
                # ref*: the reference kernels; simple_*: plain C++ loops (pooling on NCHW)
                refs = {k: v for k, v in impls.items() if k.split()[1].startswith(("ref", "simple"))}
                if own8:
                    refs = {k: v for k, v in refs.items() if not k.startswith("pooling")}
                s.case(f"oneDNN {isa}, {bits} weights: no reference (ref:, simple_) convolution, matmul or pooling",
                       bool(impls) and not refs, f"{isa_line.split(':', 1)[-1]}; {impls}")
                if own8:
                    ok = "int8" in st and st["int8"][1] > 0
                    what = "the INT8 convolutions on the own exact kernels (no VNNI: fallbacks counted)"
                else:
                    ok = "fp32" in st and "int8" in st and st["int8"] == st["fp32"] and st["int8"][1] == 0
                    what = "every INT8 convolution a oneDNN primitive (projection pairs included)"
                s.case(f"oneDNN {isa}, {bits} weights (int8={mode}): {what}", ok, str(st))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
