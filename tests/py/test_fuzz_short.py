"""test_fuzz_short.py - a short, bounded libFuzzer run of every tests/fuzz/fuzz_*.c target.

Builds the targets with `make fuzz` (clang, libFuzzer + ASan + UBSan, into build-fuzz/) and
runs each for SP_FUZZ_SECONDS (default 8) seconds from its seed corpus (the
tests/fuzz/corpus/NAME folder its source names; inputs up to 4096 bytes or the largest seed)
with its dictionary (tests/fuzz/NAME.dict, when
there is one), two targets at a time, mutating into a scratch folder so the checked-in corpus
never changes. A crash, leak, hang or sanitizer report fails the case; its input is kept in
build-fuzz/artifacts/TARGET/ and the case prints the command that replays it. Where clang or
its libFuzzer runtime is missing every case is skipped, with the reason. Longer runs:
docs/security.md ("Fuzzing and the bad-input suite").
"""
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from common import ROOT, Suite, run

s = Suite("fuzz-short")
SECONDS = int(os.environ.get("SP_FUZZ_SECONDS", "8"))
PARALLEL = max(1, min(2, os.cpu_count() or 1))
FUZZ_DIR = os.path.join(ROOT, "tests", "fuzz")
targets = sorted(f[:-2] for f in os.listdir(FUZZ_DIR) if f.startswith("fuzz_") and f.endswith(".c"))


def libfuzzer_missing():
    """Why libFuzzer cannot be used here, or None."""
    if shutil.which("clang") is None:
        return "clang is not installed (apt-get install clang)"
    d = tempfile.mkdtemp(prefix="sp-fuzz-probe-")
    try:
        src = os.path.join(d, "probe.c")
        with open(src, "w") as f:
            f.write("#include <stddef.h>\n#include <stdint.h>\n"
                    "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\n"
                    "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n")
        r = subprocess.run(["clang", "-fsanitize=fuzzer,address,undefined", src, "-o",
                            os.path.join(d, "probe")], capture_output=True, text=True)
        if r.returncode != 0:
            return "clang has no libFuzzer runtime: " + r.stderr.strip().splitlines()[-1][:200]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return None


why = libfuzzer_missing()
if why:
    for t in targets:
        s.skip(t, why)
    s.finish()

t0 = time.time()
rc, out, err = run(["make", f"-j{os.cpu_count() or 1}", "fuzz"], timeout=1800)
if not s.case("make fuzz", rc == 0, (out + err)[-2000:] if rc else f"{time.time() - t0:.0f} s"):
    s.finish()


def max_len(seeds):
    """-max_len for a run: 4096, or the largest seed where one is larger (libFuzzer cuts every
    seed to -max_len, and a model seed cut short no longer loads)."""
    sizes = [os.path.getsize(os.path.join(seeds, f)) for f in os.listdir(seeds)] \
        if seeds and os.path.isdir(seeds) else []
    return max([4096] + sizes)


def fuzz(t):
    """Run one target; returns (ok, detail)."""
    src = open(os.path.join(FUZZ_DIR, t + ".c"), encoding="utf-8").read()
    m = re.search(r"tests/fuzz/corpus/([A-Za-z0-9_-]+)", src)
    name = m.group(1) if m else None
    seeds = os.path.join(FUZZ_DIR, "corpus", name) if name else None
    exe = os.path.join(ROOT, "build-fuzz", t)
    if not os.path.isfile(exe):
        return False, f"{exe} was not built"
    art = os.path.join(ROOT, "build-fuzz", "artifacts", t)
    os.makedirs(art, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"sp-{t}-")
    args = [exe, f"-max_total_time={SECONDS}", f"-max_len={max_len(seeds)}", "-timeout=10",
            "-rss_limit_mb=2048", "-print_final_stats=0", f"-artifact_prefix={art}/", work]
    if name and os.path.isfile(os.path.join(FUZZ_DIR, name + ".dict")):
        args.insert(1, f"-dict={os.path.join(FUZZ_DIR, name + '.dict')}")
    if seeds and os.path.isdir(seeds):
        args.append(seeds)
    start = time.time()
    rc, _, err = run(args, timeout=SECONDS + 120)
    shutil.rmtree(work, ignore_errors=True)
    runs = re.findall(r"Done (\d+) runs", err)
    if rc == 0 and runs:
        return True, f"{runs[-1]} runs in {time.time() - start:.0f} s"
    crash = re.findall(r"Test unit written to (\S+)", err)
    replay = f"; replay: {exe} {crash[-1]}" if crash else ""
    # The cause first (the harness's own message, the sanitizer's headline), then the tail.
    why = [l for l in err.splitlines()
           if l.startswith("fuzz harness:") or "ERROR: AddressSanitizer" in l
           or "runtime error:" in l or "ERROR: LeakSanitizer" in l]
    return False, "\n".join(why[:4] + ["..."]) + "\n" + err[-3000:] + replay


with ThreadPoolExecutor(PARALLEL) as pool:
    results = list(pool.map(fuzz, targets))
for t, (ok, detail) in zip(targets, results):
    s.case(t, ok, detail)
print(f"fuzz-short: {len(targets)} targets, {SECONDS} s each, {PARALLEL} at a time, "
      f"{time.time() - t0:.0f} s in all", flush=True)
s.finish()
