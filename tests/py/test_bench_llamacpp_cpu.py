"""test_bench_llamacpp_cpu.py - bench/run.sh --llamacpp-cpu: the mirror of node-llama-cpp's
package that bench/llamacpp_cpu.sh builds holds exactly one libggml-cpu variant and leaves
node_modules as it was, an unknown variant is refused with the list of shipped ones, and
bench/llamacpp.mjs run from the mirror loads that variant (checked from its /proc/self/maps) and
refuses to run when --cpu-variant names another. The haswell variant (AVX2 + FMA + F16C) is the
one every machine the suite runs on has. Skipped when node or the package is missing. A few
seconds (two node processes on the 260K-parameter demo model)."""
import json
import os
import shutil
import subprocess
import tempfile

from common import ROOT, Suite, DEMO_MODEL, run

s = Suite("bench_llamacpp_cpu")
NM = os.path.join(ROOT, "bench", "node_modules")
BINS = os.path.join(NM, "@node-llama-cpp", "linux-x64", "bins", "linux-x64")
VARIANT = "haswell"


def sh(script, timeout=60):
    """bash with bench/llamacpp_cpu.sh sourced; say() as run.sh defines it."""
    return run(["bash", "-c", "set -euo pipefail; say() { echo \"$*\" >&2; }; "
                ". bench/llamacpp_cpu.sh; " + script], timeout=timeout)


def listing(d):
    return sorted(os.listdir(d))


def cases(tmp):
    before = listing(BINS)
    rc, out, err = sh("llamacpp_cpu_variants bench/node_modules")
    shipped = out.split()
    ok = rc == 0 and VARIANT in shipped and sorted(shipped) == sorted(
        f[len("libggml-cpu-"):-3] for f in before if f.startswith("libggml-cpu-"))
    s.case("variants: the package's libggml-cpu-*.so", ok, "" if ok else out + err)

    mirror = os.path.join(tmp, "m")
    rc, _, err = sh(f"llamacpp_cpu_mirror bench/node_modules nosuchcpu '{mirror}'")
    s.case("unknown variant: exit 2, the shipped ones listed",
           rc == 2 and "nosuchcpu" in err and VARIANT in err, err.strip())

    rc, _, err = sh(f"llamacpp_cpu_mirror bench/node_modules {VARIANT} '{mirror}'")
    mbins = os.path.join(mirror, "node_modules", "@node-llama-cpp", "linux-x64", "bins",
                         "linux-x64")
    if not s.case("mirror: made", rc == 0 and os.path.isdir(mbins), err.strip()):
        return
    cpu = [f for f in listing(mbins) if f.startswith("libggml-cpu-")]
    s.case("mirror: exactly the chosen variant", cpu == [f"libggml-cpu-{VARIANT}.so"], str(cpu))
    others = [f for f in before if not f.startswith("libggml-cpu-")]
    s.case("mirror: every other file of the addon's folder", sorted(
        f for f in listing(mbins) if not f.startswith("libggml-cpu-")) == others)
    s.case("node_modules unchanged", listing(BINS) == before)

    mjs = os.path.join(mirror, "llamacpp.mjs")
    node = ["node", "--preserve-symlinks", "--preserve-symlinks-main", mjs, "-m", DEMO_MODEL,
            "--prompt", "8", "--gen", "2", "--runs", "1", "-t", "1"]
    env = {"NODE_LLAMA_CPP_SKIP_DOWNLOAD": "true"}
    rc, out, err = run(node + ["--cpu-variant", VARIANT], timeout=120, env=env)
    line = f"llama.cpp CPU backend: libggml-cpu-{VARIANT}.so"
    ok = rc == 0 and line in err
    res = None
    if ok:
        try:
            res = json.loads(out)
        except ValueError:
            ok = False
    s.case(f"llamacpp.mjs from the mirror loads {VARIANT}", ok and
           res["cpu_backend"] == [f"libggml-cpu-{VARIANT}.so"] and
           res["cpu_variant_requested"] == VARIANT and res["runs"][0]["decode_tokens"] >= 1,
           err.strip().splitlines()[-1] if err.strip() else "")
    rc, out, err = run(node + ["--cpu-variant", "x64"], timeout=120, env=env)
    s.case("--cpu-variant another than the one loaded: refused",
           rc != 0 and f"ggml loaded libggml-cpu-{VARIANT}.so" in err and out.strip() == "",
           err.strip().splitlines()[-1] if err.strip() else "")


if shutil.which("node") is None:
    s.skip("llamacpp cpu variant", "node is not installed")
elif not os.path.isdir(BINS):
    s.skip("llamacpp cpu variant", "bench/node_modules has no @node-llama-cpp/linux-x64 (npm ci)")
elif not os.path.exists(os.path.join(BINS, f"libggml-cpu-{VARIANT}.so")):
    s.skip("llamacpp cpu variant", f"the package ships no {VARIANT} variant")
elif "avx2" not in open("/proc/cpuinfo").read():
    s.skip("llamacpp cpu variant", "this CPU has no AVX2")
else:
    with tempfile.TemporaryDirectory(prefix="sampan-llcpu-") as tmp:
        s.guard("llamacpp cpu variant", cases, tmp)
s.finish()
