"""engine_check.py - what the architecture tests (test_gptoss.py, test_mla.py, test_moe.py)
share: the engine's logits at every run mode and kernel level against one reference, the
quantized tolerance, and broken GGUF files made from a good one and refused.

Not a test itself (the suite runs tests/py/test_*.py).
"""
import os

import numpy as np

from common import run
from test_reference import engine_logits, err


def quant_tol(ref, n_layers):
    """The tolerance against the reference that emulates the engine's Q8_0 activations:
    3 eps sqrt(4L + 1) from the measured activation noise eps (test_reference.py derives it)."""
    eps = float(np.sqrt(np.mean(ref.act_err2)))
    return 3 * eps * np.sqrt(4 * n_layers + 1)


def check_runs(s, exe, path, toks, want, tol, out, n_vocab, label, emulating):
    """Prefill and decode at 1 and 2 threads: the 1-thread prefill and each lower kernel level
    (SAMPAN_CPU) within tol of want, all four runs bit-identical. Returns the 1-thread
    prefill's logits."""
    runs = {}
    for decode in (False, True):
        for th in (1, 2):
            runs[decode, th] = engine_logits(exe, path, toks, decode, th, out, n_vocab)
    e = err(runs[False, 1], want)
    s.case(f"{label} prefill vs {'emulating ' if emulating else ''}reference", e <= tol,
           f"err {e:.2e} <= {tol:.1e}")
    for cpu in ("scalar", "avx2"):
        lv = engine_logits(exe, path, toks, False, 2, out, n_vocab, cpu)
        e = err(lv, want)
        s.case(f"{label} prefill SAMPAN_CPU={cpu} vs reference", e <= tol,
               f"err {e:.2e} <= {tol:.1e}")
    same = all(np.array_equal(runs[k], runs[False, 1]) for k in runs)
    s.case(f"{label} prefill/decode x 1/2 threads bit-identical", same)
    return runs[False, 1]


def renamed_away(raw, name):
    """The file raw with its first occurrence of name (a tensor or key, bytes) renamed: the
    last letter becomes X, so the name is missing and the layout stays valid."""
    j = raw.index(name)
    return raw[:j] + name[:-1] + b"X" + raw[j + len(name):]


def first_dim_set(raw, tname, n):
    """The file raw with tensor tname's first dimension set to n: the u64 after the name and
    the u32 dimension count."""
    j = raw.index(tname) + len(tname) + 4
    return raw[:j] + n.to_bytes(8, "little") + raw[j + 8:]


def check_refused(s, exe, tmp, cases):
    """Each (what, file bytes, needle) is refused by `sampan eval`: a non-zero exit, no crash,
    and a message naming the file and the needle (the missing or wrong piece)."""
    for what, data, needle in cases:
        q = os.path.join(tmp, "bad-case.gguf")
        with open(q, "wb") as f:
            f.write(data)
        rc, so, se = run([exe, "eval", "-m", q, "--tokens", "1,2", "--logits-out",
                          os.path.join(tmp, "x.logits")], timeout=60)
        msg = (se + so).strip()
        ok = rc != 0 and needle in msg and "bad-case.gguf" in msg and rc != -11 and rc < 128
        s.case(f"refuses {what}", ok, msg.splitlines()[-1] if msg else f"rc {rc}")
