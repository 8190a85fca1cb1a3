"""test_fuzz_short.py - a short, bounded libFuzzer run of every tests/fuzz/fuzz_*.c target.

Builds the targets with `make fuzz` (clang, libFuzzer + ASan + UBSan, into build-fuzz/) and
runs each for SP_FUZZ_SECONDS (default 10) seconds from its seed corpus (the
tests/fuzz/corpus/NAME folder its source names), mutating into a scratch folder so the
checked-in corpus never changes. A crash, leak or sanitizer report fails the case. Without
clang every case is skipped. Longer runs: docs/fuzzing.md.
"""
import os
import re
import shutil
import tempfile

from common import ROOT, Suite, run

s = Suite("fuzz-short")
SECONDS = int(os.environ.get("SP_FUZZ_SECONDS", "10"))
targets = sorted(f[:-2] for f in os.listdir(os.path.join(ROOT, "tests", "fuzz"))
                 if f.startswith("fuzz_") and f.endswith(".c"))

if shutil.which("clang") is None:
    for t in targets:
        s.skip(t, "clang is not installed")
    s.finish()

rc, out, err = run(["make", "fuzz"], timeout=1800)
if not s.case("make fuzz", rc == 0, (out + err)[-2000:] if rc else ""):
    s.finish()

for t in targets:
    src = open(os.path.join(ROOT, "tests", "fuzz", t + ".c"), encoding="utf-8").read()
    m = re.search(r"tests/fuzz/corpus/([A-Za-z0-9_-]+)", src)
    seeds = os.path.join(ROOT, "tests", "fuzz", "corpus", m.group(1)) if m else None
    work = tempfile.mkdtemp(prefix=f"sp-{t}-")
    args = [os.path.join(ROOT, "build-fuzz", t), f"-max_total_time={SECONDS}", "-max_len=4096",
            "-timeout=10", "-rss_limit_mb=2048", f"-artifact_prefix={work}/", work]
    if seeds and os.path.isdir(seeds):
        args.append(seeds)
    rc, out, err = run(args, timeout=SECONDS + 120)
    runs = re.findall(r"Done (\d+) runs", err)
    s.case(t, rc == 0, f"{runs[-1]} runs in {SECONDS} s" if rc == 0 and runs else err[-3000:])
    shutil.rmtree(work, ignore_errors=True)
s.finish()
