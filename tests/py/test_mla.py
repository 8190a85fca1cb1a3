#!/usr/bin/python3
"""test_mla.py - the deepseek2 architecture (multi-head latent attention): the generator's files,
the engine's logits against the float64 NumPy reference (tests/ref/ref_forward.py, which computes
the attention in the expanded form: per-head keys and values from the latent, where the engine
caches the latent and absorbs the key up-projection into the query), and broken files refused.

Models: tools/gguf_gen.py's deepseek2-tiny (V2-Lite's layout: q through attn_q, softmax gating,
two shared experts), deepseek2-v3-tiny (q through q_lora, sigmoid gating with the selection
bias, 4 expert groups of which 2 compete, normalised weights scaled by 2.5, YaRN x4 over 64 with
the deepseek2 log multiplier) and deepseek2-legacy-tiny (the fused attn_kv_b); 24 tokens.

Tolerances (as test_gptoss.py derives them):
  - F32 or F16 weights: engine and reference read the same weight values and only float32
    rounding differs (about 1e-6 relative over these depths; measured 1e-6 to 3e-6), so
    err <= 1e-4;
  - Q8_0 experts: the engine quantizes those products' inputs to Q8_0; the reference emulates
    that, and the remaining difference comes from inputs that round to the other Q8_0 step,
    bounded by tol = 3 eps sqrt(4L + 1) from the measured activation noise eps;
  - routing: the reference records the smallest gap between the k-th and (k+1)-th selection
    score relative to the largest; float32 moves a score by about 1e-6 of that, so a gap over
    1e-4 cannot flip a choice (the case fails rather than passing by luck);
  - the features are exercised: the reference without the selection bias, without the expert
    groups, without the shared experts, with the generic YaRN scales instead of deepseek2's,
    or with softmax gating instead of sigmoid differs from the engine by far more than the
    tolerance (so a test with one of them dropped fails).
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

CASES = [
    ("lite-f32", dict(preset="deepseek2-tiny", seed=61, type="f32")),
    ("lite-f16", dict(preset="deepseek2-tiny", seed=62, type="f16")),
    ("v3-f32", dict(preset="deepseek2-v3-tiny", seed=63, type="f32")),
    ("v3-f16", dict(preset="deepseek2-v3-tiny", seed=64, type="f16")),
    ("v3-f32+q8_0-experts", dict(preset="deepseek2-v3-tiny", seed=65, type="f32",
                                 expert_type="q8_0")),
    ("legacy-kv_b-f32", dict(preset="deepseek2-legacy-tiny", seed=66, type="f32")),
]


def check_generated(s, tmp):
    p = os.path.join(tmp, "gen.gguf")
    gguf_gen.generate(p, dict(preset="deepseek2-v3-tiny", seed=3))
    g = GGUF(p)
    kv, t = g.kv, g.tensors
    a = "deepseek2"
    ok = (kv["general.architecture"] == a and kv[f"{a}.attention.kv_lora_rank"] == 64
          and kv[f"{a}.attention.q_lora_rank"] == 48
          and kv[f"{a}.attention.key_length"] == 80 and kv[f"{a}.attention.value_length"] == 64
          and kv[f"{a}.attention.key_length_mla"] == 48
          and kv[f"{a}.attention.value_length_mla"] == 32
          and kv[f"{a}.attention.head_count_kv"] == 1
          and kv[f"{a}.rope.dimension_count"] == 16
          and kv[f"{a}.leading_dense_block_count"] == 1
          and kv[f"{a}.expert_shared_count"] == 1 and kv[f"{a}.expert_gating_func"] == 2
          and kv[f"{a}.expert_weights_norm"] is True
          and kv[f"{a}.expert_group_count"] == 4 and kv[f"{a}.expert_group_used_count"] == 2
          and abs(kv[f"{a}.rope.scaling.yarn_log_multiplier"] - 0.0707) < 1e-6
          and t["blk.0.attn_k_b.weight"].ne == (32, 64, 4)
          and t["blk.0.attn_v_b.weight"].ne == (64, 32, 4)
          and t["blk.0.attn_kv_a_mqa.weight"].ne == (64, 80)
          and t["blk.1.attn_q_b.weight"].ne == (48, 4 * 48)
          and "blk.0.ffn_gate.weight" in t and "blk.0.ffn_gate_inp.weight" not in t
          and t["blk.1.exp_probs_b.bias"].ne == (8,)
          and t["blk.2.ffn_gate_shexp.weight"].ne == (64, 32)
          and "blk.1.ffn_gate_inp_shexp.weight" not in t)
    g.close()
    s.case("gen deepseek2 metadata and tensor shapes", bool(ok))


def check_engine(s, exe, tmp, name, cfg):
    path = os.path.join(tmp, f"{name}.gguf")
    c = gguf_gen.generate(path, cfg)
    quant = c["type"] not in ("f32", "f16") or c["expert_type"] not in ("f32", "f16")
    rng = np.random.default_rng(c["seed"])
    toks = [1] + [int(t) for t in rng.integers(3, c["vocab"], N_TOKENS - 1)]
    ref = RefModel(path, act_quant=quant)
    want = ref.session().forward(toks)
    label = f"deepseek2 {name}"
    tol = quant_tol(ref, c["n_layers"]) if quant else FLOAT_TOL
    s.case(f"{label} logits well spread", float(want.std(axis=1).min()) >= 1.0,
           f"min std {float(want.std(axis=1).min()):.2f} >= 1")
    s.case(f"{label} routing margin far above float32 rounding", ref.route_margin > MARGIN,
           f"smallest top-k gap {ref.route_margin:.1e} > {MARGIN:.0e}")
    out = os.path.join(tmp, f"{name}.logits")
    got = check_runs(s, exe, path, toks, want, tol, out, c["vocab"], label, quant)
    if name != "v3-f32":
        return
    # Each feature changes the logits by far more than the tolerance: the reference with it
    # taken away no longer matches the engine.
    for what in ("selection bias", "expert groups", "shared experts", "deepseek2 YaRN scales",
                 "sigmoid gating"):
        r = RefModel(path)
        if what == "selection bias":
            for L in range(r.n_layer):
                r.w.pop(f"blk.{L}.exp_probs_b.bias", None)
        elif what == "expert groups":
            r.n_group = 0
        elif what == "shared experts":
            for L in range(r.n_layer):
                r.w.pop(f"blk.{L}.ffn_gate_shexp.weight", None)
        elif what == "deepseek2 YaRN scales":
            r.q_scale = 1.0 / np.sqrt(r.mla["qk"])
            r.rope_attn_factor = 1.0
        else:
            r.gating = 1
        e = err(got, r.session().forward(toks))
        s.case(f"{label}: the reference without the {what} is far off", e > 100 * tol,
               f"err {e:.2e} > {100 * tol:.1e}")


def check_refusals(s, exe, tmp):
    """Broken deepseek2 files are refused with the file and the missing piece named."""
    p = os.path.join(tmp, "bad.gguf")
    gguf_gen.generate(p, dict(preset="deepseek2-v3-tiny", seed=5))
    raw = open(p, "rb").read()
    cases = []
    for tname in (b"blk.1.attn_kv_a_mqa.weight", b"blk.0.attn_q_a_norm.weight",
                  b"blk.2.attn_v_b.weight", b"blk.0.ffn_up.weight",
                  b"blk.2.ffn_down_shexp.weight"):
        cases.append((f"missing {tname.decode()}", renamed_away(raw, tname), tname.decode()))
    # attn_k_b renamed away: then the file must carry the legacy attn_kv_b
    tname = b"blk.1.attn_k_b.weight"
    bad = renamed_away(raw, tname)
    cases.append(("missing attn_k_b and attn_kv_b", bad, "blk.1.attn_kv_b.weight"))
    key = b"deepseek2.attention.kv_lora_rank"
    bad = renamed_away(raw, key)
    cases.append(("no kv_lora_rank key", bad, key.decode()))
    # the selection bias of layer 2 claiming 7 experts (the padding keeps the layout valid):
    # its first dimension is the u64 after the name and the u32 dimension count
    tname = b"blk.2.exp_probs_b.bias"
    bad = first_dim_set(raw, tname, 7)
    cases.append(("selection bias of the wrong size", bad, tname.decode()))
    check_refused(s, exe, tmp, cases)


def main():
    s = Suite("mla")
    with tempfile.TemporaryDirectory(prefix="sampan-mla-") as tmp:
        s.guard("gen deepseek2 files", check_generated, s, tmp)
        exe = binary()
        if exe is None:
            s.skip("deepseek2 vs engine", "build/sampan not built (make)")
        else:
            for name, cfg in CASES:
                s.guard(f"deepseek2 {name} vs engine", check_engine, s, exe, tmp, name, cfg)
            s.guard("deepseek2 refusals", check_refusals, s, exe, tmp)
    s.finish()


if __name__ == "__main__":
    main()
