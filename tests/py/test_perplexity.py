#!/usr/bin/python3
"""test_perplexity.py - `sampan perplexity` against the independent NumPy reference.

The tool's windows are rebuilt here from `sampan tokenize --no-bos` of the same text (BOS,
then the next n_ctx - 1 text tokens; consecutive windows), every window goes through the
reference forward pass (tests/ref/ref_forward.py, float64), and the negative log-likelihood
of each scored prediction (the second half of each window, or all with --score-all) is
summed. The engine computes in float32; over ~100 predictions the NLL sum agrees to about
1e-6 relative, so the check is 1e-4 relative on the sum and on the perplexity. Also: the
F16 KV cache changes the perplexity by less than 0.5% (its rounding is 2^-11 relative), and
bad arguments are usage errors naming the problem.
"""
import json
import math
import os
import subprocess
import tempfile

import numpy as np

from common import ROOT, Suite, binary, run
from ref_forward import RefModel

s = Suite("perplexity")
MODEL = os.path.join(ROOT, "models", "stories260K.gguf")
TEXT = os.path.join(ROOT, "tests", "data", "corpus", "tinystories-sample.txt")
exe = binary()


def ppl_json(*args):
    rc, out, err = run([exe, "perplexity", "-m", MODEL, "-f", TEXT, "--json", *args], timeout=120)
    if rc != 0:
        raise RuntimeError(f"exit {rc}: {err[-400:]}")
    return json.loads(out)


def reference(n_ctx, chunks, score_all):
    """(nll_sum, tokens_scored) from the NumPy reference, windows as the tool builds them."""
    text = open(TEXT, "rb").read()
    p = subprocess.run([exe, "tokenize", "-m", MODEL, "--no-bos"], input=text,
                       capture_output=True, timeout=60)
    ids = [int(t) for t in p.stdout.split()]
    m = RefModel(MODEL)
    per = n_ctx - 1  # stories260K adds BOS
    first = 0 if score_all else n_ctx // 2
    total, n = 0.0, 0
    for k in range(chunks):
        w = [1] + ids[k * per:(k + 1) * per]
        logits = m.session().forward(w)
        for j in range(first, len(w) - 1):
            row = logits[j]
            mx = row.max()
            total += -(row[w[j + 1]] - mx - math.log(np.exp(row - mx).sum()))
            n += 1
    return total, n


if exe is None or not os.path.exists(MODEL) or not os.path.exists(TEXT):
    s.skip("perplexity", "build/sampan, models/stories260K.gguf or the corpus is missing")
    s.finish()

for n_ctx, chunks, score_all in ((64, 3, False), (48, 2, True)):
    args = ["-c", str(n_ctx), "--chunks", str(chunks)] + (["--score-all"] if score_all else [])
    label = " ".join(args)
    try:
        got = ppl_json(*args)
    except RuntimeError as e:
        s.case(f"{label}: runs", False, str(e))
        continue
    want_sum, want_n = reference(n_ctx, chunks, score_all)
    s.case(f"{label}: scores the same predictions as the reference", got["tokens_scored"] == want_n,
           (got["tokens_scored"], want_n))
    rel = abs(got["nll_sum"] - want_sum) / want_sum
    s.case(f"{label}: NLL sum within 1e-4 of the reference", rel < 1e-4,
           f"{got['nll_sum']:.6f} vs {want_sum:.6f} (rel {rel:.2e})")
    want_ppl = math.exp(want_sum / want_n)
    s.case(f"{label}: perplexity within 1e-4 of the reference",
           abs(got["perplexity"] - want_ppl) / want_ppl < 1e-4, f"{got['perplexity']:.6f} vs {want_ppl:.6f}")

try:
    f32 = ppl_json("-c", "128", "--chunks", "20")
    f16 = ppl_json("-c", "128", "--chunks", "20", "--kv-f16")
    d = abs(f16["perplexity"] - f32["perplexity"]) / f32["perplexity"]
    s.case("F16 KV cache: perplexity within 0.5% of F32", d < 0.005 and f16["kv"] == "f16",
           f"{f32['perplexity']:.5f} vs {f16['perplexity']:.5f} ({100 * d:.3f}%)")
    s.case("plausible value for stories260K on TinyStories (2..20)", 2 < f32["perplexity"] < 20,
           f32["perplexity"])
except RuntimeError as e:
    s.case("F16 KV cache: runs", False, str(e))

# Bad arguments: usage errors (exit 2) with a message, nothing loaded.
for args, want in ((["-c", "4"], "-c expects"), (["-c", "100000"], "more than the model's context"),
                   (["--chunks", "0"], "--chunks expects"), (["--bogus"], "usage")):
    rc, out, err = run([exe, "perplexity", "-m", MODEL, "-f", TEXT, *args], timeout=60)
    s.case(f"{' '.join(args)} is a usage error", rc == 2 and want in err, (rc, err.strip()[:120]))
rc, out, err = run([exe, "perplexity", "-m", MODEL, "-f", "/nonexistent/text.txt"], timeout=60)
s.case("a missing text file is named", rc == 1 and "/nonexistent/text.txt" in err, err.strip()[:120])
tiny = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
tiny.write("Once upon a time there was a cat.")
tiny.close()
rc, out, err = run([exe, "perplexity", "-m", MODEL, "-f", tiny.name, "-c", "64"], timeout=60)
os.unlink(tiny.name)
s.case("a text shorter than one window says so", rc == 2 and "fewer than one window" in err,
       (rc, err.strip()[:160]))
s.finish()
