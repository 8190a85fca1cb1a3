#!/usr/bin/python3
"""test_gptoss.py - the gpt-oss architecture: the generator's files, the engine's logits against
the float64 NumPy reference (tests/ref/ref_forward.py), and broken files refused.

Models: tools/gguf_gen.py's gpt-oss-tiny (2 layers, layer 0 with a window of 8 positions and
24 tokens, so the window cuts in; 4 query heads of 32 over a 64 model; sinks; q/k/v and output
biases; 8 experts, top-2, router and expert biases; YaRN x4 over an original context of 64).

Tolerances (as test_moe.py derives them):
  - all F32 (experts too) or F16: engine and reference read the same weight values and only
    float32 rounding differs (about 1e-6 relative over these depths), so err <= 1e-4;
  - MXFP4 experts (the gpt-oss files people download) or Q8_0 attention: the engine
    quantizes those products' inputs to Q8_0; the reference emulates that, and the remaining
    difference comes from inputs that round to the other Q8_0 step, bounded by
    tol = 3 eps sqrt(4L + 1) from the measured activation noise eps;
  - routing: the reference records the smallest gap between the k-th and (k+1)-th router
    logit relative to the largest; float32 moves a logit by about 1e-6 of that, so a gap over
    1e-4 cannot flip a choice (the case fails rather than passing by luck);
  - the features are exercised: the reference without the sinks, without the window, or with
    post_attention_norm read as gemma's post-norm differs from the engine by far more than
    the tolerance (so a test with one of them dropped fails).
"""
import os
import tempfile

import numpy as np

from common import Suite, binary

import gguf_gen
from gguf_read import GGUF
from ref_forward import RefModel
from engine_check import check_refused, check_runs, first_dim_set, quant_tol, renamed_away
from test_reference import err

N_TOKENS = 24
FLOAT_TOL = 1e-4
MARGIN = 1e-4

# (name, generator config): the experts' type is --expert-type (gpt-oss default: mxfp4)
CASES = [
    ("f32", dict(preset="gpt-oss-tiny", seed=51, type="f32", expert_type="f32")),
    ("f16", dict(preset="gpt-oss-tiny", seed=52, type="f16", expert_type="f16")),
    ("f32+mxfp4", dict(preset="gpt-oss-tiny", seed=53, type="f32")),
    ("q8_0+mxfp4", dict(preset="gpt-oss-tiny", seed=54, type="q8_0")),
    ("4-layers-top4", dict(preset="gpt-oss-tiny", seed=55, type="f32", expert_type="f32",
                           n_layers=4, n_expert_used=4, swa=5)),
]


def check_generated(s, tmp):
    p = os.path.join(tmp, "gen.gguf")
    gguf_gen.generate(p, dict(preset="gpt-oss-tiny", seed=3))
    g = GGUF(p)
    kv, t = g.kv, g.tensors
    ok = (kv["general.architecture"] == "gpt-oss" and kv["gpt-oss.expert_count"] == 8
          and kv["gpt-oss.expert_used_count"] == 2
          and kv["gpt-oss.expert_feed_forward_length"] == 64
          and kv["gpt-oss.attention.sliding_window"] == 8
          and kv["gpt-oss.attention.key_length"] == 32
          and kv["gpt-oss.rope.scaling.type"] == "yarn"
          and t["blk.0.ffn_gate_exps.weight"].type == 39  # MXFP4
          and t["blk.1.ffn_down_exps.weight"].ne == (64, 64, 8)
          and t["blk.0.ffn_gate_inp.weight"].type == 0
          and t["blk.0.ffn_gate_inp.bias"].ne == (8,)
          and t["blk.1.ffn_up_exps.bias"].ne == (64, 8)
          and t["blk.1.ffn_down_exps.bias"].ne == (64, 8)
          and t["blk.0.attn_sinks.weight"].ne == (4,)
          and t["blk.0.attn_output.bias"].ne == (64,)
          and t["blk.0.attn_q.bias"].ne == (128,)
          and "blk.0.post_attention_norm.weight" in t and "blk.0.ffn_norm.weight" not in t)
    g.close()
    s.case("gen gpt-oss metadata and tensor shapes", bool(ok))


def check_engine(s, exe, tmp, name, cfg):
    path = os.path.join(tmp, f"{name}.gguf")
    c = gguf_gen.generate(path, cfg)
    quant = c["type"] != "f32" and c["type"] != "f16" or c["expert_type"] not in ("f32", "f16")
    rng = np.random.default_rng(c["seed"])
    toks = [1] + [int(t) for t in rng.integers(3, c["vocab"], N_TOKENS - 1)]
    ref = RefModel(path, act_quant=quant)
    want = ref.session().forward(toks)
    label = f"gpt-oss {name}"
    tol = quant_tol(ref, c["n_layers"]) if quant else FLOAT_TOL
    s.case(f"{label} routing margin far above float32 rounding", ref.route_margin > MARGIN,
           f"smallest top-k gap {ref.route_margin:.1e} > {MARGIN:.0e}")
    out = os.path.join(tmp, f"{name}.logits")
    got = check_runs(s, exe, path, toks, want, tol, out, c["vocab"], label, quant)
    if name != "f32":
        return
    # Each feature changes the logits by far more than the tolerance: the reference with it
    # taken away no longer matches the engine.
    for what in ("sinks", "window", "ffn pre-norm as post-norm", "output bias"):
        r = RefModel(path)
        for L in range(r.n_layer):
            p = f"blk.{L}."
            if what == "sinks":
                del r.w[p + "attn_sinks.weight"]
            elif what == "output bias":
                del r.w[p + "attn_output.bias"]
        if what == "window":
            r.swa = [0] * r.n_layer
        if what == "ffn pre-norm as post-norm":
            r.gptoss = False
            for L in range(r.n_layer):
                r.w[f"blk.{L}.ffn_norm.weight"] = np.ones(r.n_embd)
        e = err(got, r.session().forward(toks))
        s.case(f"{label}: the reference without the {what} is far off", e > 100 * tol,
               f"err {e:.2e} > {100 * tol:.1e}")


def check_refusals(s, exe, tmp):
    """Broken gpt-oss files are refused with the file and the missing piece named."""
    p = os.path.join(tmp, "bad.gguf")
    gguf_gen.generate(p, dict(preset="gpt-oss-tiny", seed=5))
    raw = open(p, "rb").read()
    cases = []
    for tname in (b"blk.1.attn_sinks.weight", b"blk.0.attn_output.bias",
                  b"blk.1.ffn_gate_inp.bias", b"blk.0.ffn_down_exps.bias"):
        cases.append((f"missing {tname.decode()}", renamed_away(raw, tname), tname.decode()))
    key = b"gpt-oss.attention.sliding_window"
    bad = renamed_away(raw, key)
    cases.append(("no sliding_window key", bad, key.decode()))
    # the sinks of layer 0 claiming 5 heads: its first dimension is the u64 after the name
    # and the u32 dimension count
    tname = b"blk.0.attn_sinks.weight"
    bad = first_dim_set(raw, tname, 5)
    cases.append(("sinks of the wrong size", bad, tname.decode()))
    check_refused(s, exe, tmp, cases)


def main():
    s = Suite("gptoss")
    with tempfile.TemporaryDirectory(prefix="sampan-gptoss-") as tmp:
        s.guard("gen gpt-oss files", check_generated, s, tmp)
        exe = binary()
        if exe is None:
            s.skip("gpt-oss vs engine", "build/sampan not built (make)")
        else:
            for name, cfg in CASES:
                s.guard(f"gpt-oss {name} vs engine", check_engine, s, exe, tmp, name, cfg)
            s.guard("gpt-oss refusals", check_refusals, s, exe, tmp)
    s.finish()


if __name__ == "__main__":
    main()
