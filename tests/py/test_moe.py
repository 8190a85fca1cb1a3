#!/usr/bin/python3
"""test_moe.py - mixture-of-experts models: the engine's logits against the NumPy reference
(tests/ref/ref_forward.py), and the generator's MoE files.

Models (tools/gguf_gen.py, tensor names and metadata as llama.cpp's converter writes them):
Mixtral-style llama (8 experts, top-2, normalised weights) and qwen2moe (8 experts, top-4,
weights not normalised, a shared expert with a sigmoid gate), in F32, F16 and Q8_0.

Tolerances (same derivation as test_reference.py):
  - F32 / F16 weights: engine and reference read the same weight values; only float32
    rounding differs (about 1e-6 relative), so err <= 1e-4.
  - Q8_0: compared with the reference that emulates the engine's Q8_0 activation
    quantization; tol = 3 eps sqrt(4L + 1) from the measured activation noise eps.
  - Routing must pick the same experts in both: the reference records the smallest gap
    between the k-th and (k+1)-th routing probability (relative to the largest); float32
    rounding moves a probability by about 1e-6 relative, so a gap over 1e-4 cannot flip.
    The check fails (rather than passing by luck) if a model/token choice comes too close.
  - Batch invariance: prefill and one-token-at-a-time decode, 1 and 2 threads, give
    bit-identical logits (the decode rows route alone, the prefill rows share the experts'
    batched products with the other rows).
"""
import os
import sys
import tempfile

import numpy as np

from common import Suite, binary

import gguf_gen
from gguf_read import GGUF
from ref_forward import RefModel
from engine_check import check_refused, check_runs, quant_tol, renamed_away
from test_reference import err

N_TOKENS = 24
FLOAT_TOL = 1e-4
MARGIN = 1e-4

MODELS = {
    "mixtral": dict(preset="mixtral-tiny", seed=31),
    "mixtral-top1": dict(preset="mixtral-tiny", n_expert=4, n_expert_used=1, n_layers=3, seed=32),
    "qwen2moe": dict(preset="qwen2moe-tiny", seed=33),
    "qwen3moe": dict(preset="qwen3moe-tiny", seed=34),
}


def check_generated(s, tmp):
    p = os.path.join(tmp, "gen-q2.gguf")
    gguf_gen.generate(p, dict(preset="qwen2moe-tiny", type="q8_0", seed=3))
    g = GGUF(p)
    kv, t = g.kv, g.tensors
    ok = (kv["general.architecture"] == "qwen2moe" and kv["qwen2moe.expert_count"] == 8
          and kv["qwen2moe.expert_used_count"] == 4
          and kv["qwen2moe.expert_feed_forward_length"] == 64
          and kv["qwen2moe.expert_shared_feed_forward_length"] == 96
          and t["blk.0.ffn_gate_inp.weight"].ne == (64, 8) and t["blk.0.ffn_gate_inp.weight"].type == 0
          and t["blk.1.ffn_gate_exps.weight"].ne == (64, 64, 8)
          and t["blk.1.ffn_down_exps.weight"].ne == (64, 64, 8)
          and t["blk.1.ffn_up_exps.weight"].type == 8
          and t["blk.0.ffn_gate_inp_shexp.weight"].ne == (64,)
          and t["blk.0.ffn_down_shexp.weight"].ne == (96, 64)
          and "blk.0.ffn_gate.weight" not in t and "blk.0.attn_q.bias" in t)
    s.case("gen qwen2moe metadata and tensor shapes", bool(ok))
    p2 = os.path.join(tmp, "gen-mx.gguf")
    gguf_gen.generate(p2, dict(preset="mixtral-tiny", seed=3))
    g2 = GGUF(p2)
    ok = (g2.kv["llama.expert_count"] == 8 and g2.kv["llama.expert_used_count"] == 2
          and g2.kv["llama.feed_forward_length"] == 96
          and "llama.expert_feed_forward_length" not in g2.kv
          and g2.tensors["blk.0.ffn_up_exps.weight"].ne == (64, 96, 8))
    s.case("gen Mixtral-style llama metadata and tensor shapes", bool(ok))


def check_ref_routing(s):
    """The reference's routing on a hand-made row: ties go to the lower id, weights."""
    m = RefModel.__new__(RefModel)
    m.n_expert, m.n_expert_used, m.norm_w, m.route_margin = 4, 2, True, np.inf
    m.dtype, m.aq = np.float64, {}
    E = 4
    eye = np.eye(E)
    # router = identity: logits = h; experts: gate large (silu ~ identity), up = 1, down = e-th unit
    m.w = {"p.ffn_gate_inp.weight": eye,
           "p.ffn_gate_exps.weight": np.stack([eye * 50.0] * 4),
           "p.ffn_up_exps.weight": np.stack([np.ones((E, E))] * 4),
           "p.ffn_down_exps.weight": np.stack([np.outer(eye[e], np.ones(E)) / 50.0
                                               for e in range(4)])}
    m.aq = {k: None for k in m.w}
    h = np.array([[1.0, 3.0, 3.0, 0.5]])  # experts 1 and 2 tie for first: both chosen
    y = m.moe(h, "p.")
    # output row e = w_e * sum(silu(50 h_j)) / 50 ~ w_e * sum(h) for positive h
    ok = y[0, 0] == 0 and y[0, 3] == 0 and abs(y[0, 1] - y[0, 2]) < 1e-12 and y[0, 1] > 0
    h2 = np.array([[2.0, 1.0, 2.0, 2.0]])  # three-way tie for the top: ids 0 and 2 win
    y2 = m.moe(h2, "p.")
    ok &= y2[0, 0] > 0 and y2[0, 2] > 0 and y2[0, 1] == 0 and y2[0, 3] == 0
    s.case("ref routing: ties go to the lower expert id", bool(ok))


def check_engine(s, exe, tmp, name, cfg, wtype):
    path = os.path.join(tmp, f"{name}-{wtype}.gguf")
    c = gguf_gen.generate(path, dict(cfg, type=wtype))
    rng = np.random.default_rng(c["seed"])
    toks = [1] + [int(t) for t in rng.integers(3, c["vocab"], N_TOKENS - 1)]
    ref = RefModel(path, act_quant=wtype == "q8_0")
    want = ref.session().forward(toks)
    label = f"{name} {wtype}"
    tol = quant_tol(ref, c["n_layers"]) if wtype == "q8_0" else FLOAT_TOL
    margin_ok = ref.route_margin > MARGIN
    s.case(f"{label} routing margin far above float32 rounding", margin_ok,
           f"smallest top-k gap {ref.route_margin:.1e} > {MARGIN:.0e}")
    out = os.path.join(tmp, f"{name}-{wtype}.logits")
    check_runs(s, exe, path, toks, want, tol, out, c["vocab"], label, wtype == "q8_0")


def check_refusals(s, exe, tmp):
    """Broken MoE files are refused with the file and the missing piece named."""
    base = dict(preset="mixtral-tiny", seed=5)
    p = os.path.join(tmp, "bad.gguf")
    gguf_gen.generate(p, base)
    g = GGUF(p)
    cases = []
    # expert_used_count over expert_count
    raw = open(p, "rb").read()
    key = b"llama.expert_used_count"
    i = raw.index(key) + len(key) + 4  # after the key and its value type
    bad = raw[:i] + (9).to_bytes(4, "little") + raw[i + 4:]
    cases.append(("expert_used_count 9 > 8", bad, "expert_used_count"))
    # a missing expert tensor: rename blk.1.ffn_up_exps
    bad2 = renamed_away(raw, b"blk.1.ffn_up_exps.weight")  # ffn_up_expX
    cases.append(("missing blk.1.ffn_up_exps", bad2, "blk.1.ffn_up_exps.weight"))
    g.close()
    check_refused(s, exe, tmp, cases)


def main():
    s = Suite("moe")
    with tempfile.TemporaryDirectory(prefix="sampan-moe-") as tmp:
        s.guard("gen moe files", check_generated, s, tmp)
        s.guard("ref routing", check_ref_routing, s)
        exe = binary()
        if exe is None:
            s.skip("moe vs engine", "build/sampan not built (make)")
        else:
            for name, cfg in MODELS.items():
                for wtype in ("f32", "f16", "q8_0"):
                    s.guard(f"{name} {wtype} vs engine", check_engine, s, exe, tmp, name, cfg,
                            wtype)
            s.guard("moe refusals", check_refusals, s, exe, tmp)
    s.finish()


if __name__ == "__main__":
    main()
