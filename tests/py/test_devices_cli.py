"""test_devices_cli.py - `sampan devices`: the CPU line, the --json shape, bad options, and
(when the build has it) the fake NVML library through SAMPAN_NVML_LIB and CUDA_VISIBLE_DEVICES."""
import json
import os

from common import Suite, binary, run

s = Suite("devices-cli")
exe = binary()
if exe is None:
    s.skip("all", "build/sampan not built")
    s.finish()

NO_GPU = {"SAMPAN_NVML_LIB": "/nonexistent/libnvidia-ml.so.1"}
KEYS = {"index", "device", "kind", "id", "name", "ordinal", "nvml_index", "mig_slot", "parent",
        "mig_enabled", "source", "total_bytes", "budget_bytes", "used_bytes", "free_bytes",
        "utilization"}

rc, out, err = run([exe, "devices"], timeout=30, env=NO_GPU)
lines = out.splitlines()
s.case("table exits 0", rc == 0, err)
s.case("header and cpu line", len(lines) >= 2 and lines[0].startswith("DEVICE")
       and lines[1].startswith("cpu ") and "GiB" in lines[1], out)
s.case("no-NVML note", "note: no NVML" in out, out)

rc, out, err = run([exe, "devices", "--json"], timeout=30, env=NO_GPU)
doc = None
try:
    doc = json.loads(out)
except ValueError as e:
    s.case("--json parses", False, f"{e}: {out!r}")
if doc is not None:
    devs = doc.get("devices", [])
    cpu = devs[0] if devs else {}
    s.case("--json shape", rc == 0 and doc.get("budget_fraction") == 0.8 and len(devs) == 1
           and set(cpu) == KEYS and cpu["kind"] == "cpu" and "no NVML" in (doc.get("note") or ""),
           out)
    s.case("cpu figures add up", cpu.get("total_bytes", 0) > 0
           and cpu["budget_bytes"] == int(cpu["total_bytes"] * 0.8)
           and cpu["free_bytes"] <= cpu["total_bytes"] and cpu["used_bytes"] <= cpu["total_bytes"],
           cpu)

rc, out, _ = run([exe, "devices", "--json", "--budget", "0.5"], timeout=30, env=NO_GPU)
s.case("--budget 0.5", rc == 0 and json.loads(out)["budget_fraction"] == 0.5, out)
for bad in (["--budget", "0"], ["--budget", "1.5"], ["--budget", "x"], ["--budget"], ["--nope"]):
    rc, _, err = run([exe, "devices", *bad], timeout=30, env=NO_GPU)
    s.case(f"bad option {' '.join(bad)} -> 2", rc == 2 and err.strip() != "", err)

fake = os.path.join(os.path.dirname(exe), "libfake_nvml.so")
if not os.path.isfile(fake):
    s.skip("fake NVML", f"{fake} not built (make unit builds it)")
else:
    env = {"SAMPAN_NVML_LIB": fake}
    rc, out, err = run([exe, "devices", "--json"], timeout=30, env=dict(env, CUDA_VISIBLE_DEVICES=""))
    s.case("CUDA_VISIBLE_DEVICES='' hides GPUs", rc == 0 and len(json.loads(out)["devices"]) == 1, out)
    rc, out, err = run([exe, "devices", "--json"], timeout=30,
                       env=dict(env, CUDA_VISIBLE_DEVICES="MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001,0"))
    devs = json.loads(out)["devices"] if rc == 0 else []
    s.case("fake NVML: split GPU, MIG instance, GPU 0",
           [d["kind"] for d in devs] == ["cpu", "gpu", "mig", "gpu"]
           and [d["ordinal"] for d in devs] == [-1, -1, 0, 1]
           and devs[2]["total_bytes"] == 20 << 30 and devs[3]["utilization"] == 37, out)
    rc, out, err = run([exe, "devices"], timeout=30, env=dict(env, CUDA_VISIBLE_DEVICES="1"))
    # A CUDA process opens one MIG instance: the second has no cuda:N and the note says so.
    s.case("table shows cuda:N and MIG rows", rc == 0 and "cuda:0   mig" in out
           and "mig1.2   mig" in out and "cuda:1" not in out and "MIG mode" in out
           and "note: 2 MIG instances visible" in out, out)
    rc, out, err = run([exe, "devices"], timeout=30, env=dict(env, FAKE_NVML_INIT_FAIL="1"))
    s.case("init failure is a note", rc == 0 and "note: NVML init failed" in out, out)

s.finish()
