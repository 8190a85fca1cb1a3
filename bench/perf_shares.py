#!/usr/bin/env python3
"""perf_shares.py - where a decode's time goes, from a cpu-clock `perf record -g` of `sampan eval`.

    perf record -F 999 -e cpu-clock -g -o q4_0.data \\
        ./build/sampan eval -m MODEL.gguf --random 1 --gen 64 -t 2
    bench/perf_shares.py q4_0.data DECODE_MS

Only the samples of the last DECODE_MS milliseconds (the 'decode: ... in X ms' line) count, so
model load and load-time repacking stay out. Each sample goes to the category of its leaf
symbol: weight products, activation conversion, attention, norms/rope/SwiGLU, pool wait/spin
(yields, spins, futex, the hypervisor's irq path under them), the rest. Prints the shares and
the four hottest symbols (TOP=N in the environment: N). cpu-clock needs no hardware counters (virtual machines often lack them).
"""
import os
import re
import subprocess
import sys
from collections import Counter

CATS = [
    ("products", r"gemv|gemm|fused_|qgemm|rows8|vec_dot|tile|panel|p16_|f16_|_4x1|_1x1|rp_|_two$"),
    ("act-convert", r"from_float|quantize|q8_records"),
    ("attention", r"attn"),
    ("norm/rope/swiglu", r"norm|rope|swiglu|softcap|exp"),
    ("pool wait/spin", r"sched_yield|worker|drain|sp_pool|futex|pvm_irq|cond_wait|clock_gettime|schedule|syscall"),
]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: perf_shares.py PERF.data DECODE_MS")
    data, ms = sys.argv[1], float(sys.argv[2])
    out = subprocess.run(["perf", "script", "-i", data, "-F", "time,ip,sym"],
                         capture_output=True, text=True, check=True).stdout
    rows, t, leaf = [], None, False
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+):\s*$", line)
        if m:
            t, leaf = float(m.group(1)), True
            continue
        m = re.match(r"\s+[0-9a-f]+\s+(\S+)", line)
        if m and leaf:
            rows.append((t, m.group(1)))
            leaf = False
    if not rows:
        sys.exit("no samples")
    start = max(r[0] for r in rows) - ms / 1000.0
    c = Counter(s for ts, s in rows if ts >= start)
    tot = sum(c.values())
    shares = {name: 0 for name, _ in CATS}
    shares["rest"] = 0
    for sym, n in c.items():
        name = next((k for k, rx in CATS if re.search(rx, sym)), "rest")
        shares[name] += n
    print("%d samples: " % tot + " ".join("%s=%.1f%%" % (k, 100.0 * v / tot) for k, v in shares.items()))
    print("top: " + ", ".join("%s %.1f%%" % (s, 100.0 * n / tot) for s, n in c.most_common(int(os.environ.get("TOP", "4")))))


if __name__ == "__main__":
    main()
