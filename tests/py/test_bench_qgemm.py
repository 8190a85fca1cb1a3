"""test_bench_qgemm.py - bench/qgemm_shape_bench.c still runs: every quantized type's gemm at every
x86 level this CPU has, on the weights each table's gemm reads (the AVX2 table's packed 8-row
groups, the AVX-512 table's own layouts), each A/B against the kernel its file keeps giving the
same bits (the avx2-vnni table, where the CPU has AVX-VNNI, against the AVX2 table's).

The tool is how the kernel files' "new against prev" numbers in BENCHMARKS.md are made; it is built
by hand and nothing else runs it, so a kernel table change that it does not follow (as when the
AVX2 Q8_0 gemm began to read packed groups and the tool still handed it row-major blocks, and
crashed) would go unnoticed. Checked at 8 tokens (the timings are not looked at): exit 0, one line
for each of its 12 types x 2 widths at each level it prints, the AVX2 level always (avx2-vnni: Q8_0,
Q4_0, Q4_K, Q5_K and Q6_K, the gemms it changes), every A/B line
"same bits", no "no gemm". x86-64 only. A few seconds."""
import os
import platform
import re

from common import ROOT, Suite, binary, run

s = Suite("bench_qgemm")
exe = binary()
if exe is None:
    s.skip("all", "sampan not built")
    s.finish()
if platform.machine() not in ("x86_64", "AMD64"):
    s.skip("all", f"x86-64 only (this is {platform.machine()})")
    s.finish()
build = os.path.relpath(os.path.dirname(exe), ROOT)
make_extra = ["SANITIZER=1"] if "san" in os.path.basename(build) else []
rc, out, err = run(["make", f"BUILD={build}", *make_extra, f"{build}/qgemm_shape_bench"],
                   timeout=300)
if not s.case("make qgemm_shape_bench", rc == 0, (out + err)[-2000:]):
    s.finish()

TYPES = ["q4_0", "q8_0", "q4_k", "q2_k", "iq4_xs", "mxfp4", "q3_k", "q5_k", "q4_1", "q5_0",
         "iq4_nl", "q6_k"]
rc, out, err = run([os.path.join(ROOT, build, "qgemm_shape_bench"), "8"], timeout=240)
s.case("runs: exit 0", rc == 0, "" if rc == 0 else f"rc {rc}\n{out[-1500:]}\n{err[-1500:]}")

line_re = re.compile(r"^(\S+)\s+(\S+)\s+K=(\d+)\s+(\d+) tok\s+(.*)$")
seen = {}
bad = []
for line in out.splitlines():
    m = line_re.match(line)
    if m is None:
        bad.append(f"not a result line: {line}")
        continue
    level, typ, width, tok, rest = m.groups()
    seen.setdefault(level, set()).add((typ, int(width)))
    if tok != "8":
        bad.append(f"tokens {tok}: {line}")
    if "no gemm" in rest or "GMAC/s" not in rest:
        bad.append(f"no timing: {line}")
    if "new/prev" in rest and "same bits" not in rest:
        bad.append(f"A/B bits differ: {line}")
    rates = [float(v) for v in re.findall(r"(\d+\.\d+)(?= GMAC/s| +new)", rest)]
    if not rates or min(rates) <= 0.0:
        bad.append(f"no positive rate: {line}")
s.case("every line a timing, every A/B the same bits", not bad, "\n".join(bad[:10]))

want = {(t, w) for t in TYPES for w in (2048, 5632)}
s.case("the AVX2 level: every type at both widths", seen.get("avx2") == want,
       f"levels {sorted(seen)}; avx2 missing {sorted(want - seen.get('avx2', set()))}")
# the AVX2 level's AVX-VNNI table (where the CPU has AVX-VNNI) times only the types whose gemm it
# changes, against the AVX2 table's
vnni_want = {(t, w) for t in ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k") for w in (2048, 5632)}
s.case("the avx2-vnni table, where printed: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K at both widths against "
       "the AVX2 gemms",
       seen.get("avx2-vnni", vnni_want) == vnni_want, str(seen.get("avx2-vnni")))
others = {lv: sorted(want - got) for lv, got in seen.items()
          if lv not in ("avx2", "avx2-vnni") and got != want}
s.case(f"the other levels printed ({', '.join(sorted(set(seen) - {'avx2', 'avx2-vnni'})) or 'none here'}): "
       "every type at both widths", not others, str(others))
s.finish()
