#!/usr/bin/python3
"""test_gemma4.py - the gemma4 architecture (dense) against the NumPy reference, and its
loading errors.

A random-weight model from tools/gguf_gen.py (preset gemma4-tiny: names and metadata as
llama.cpp's converter writes them; layers S S S G S G with 32-wide sliding heads over 2 KV
heads and 64-wide global heads over 1, a quarter of each global head rotated through
rope_freqs, the last two layers reading the caches of layers 2 and 3 with a double-wide
FFN, per-layer inputs, no attn_v on the global layers, a scalar per layer output, a window
of 8, final soft-capping) runs through `sampan eval` (prefill with 1 and 2 threads, decode
one token at a time, the scalar and AVX2 kernel levels) and is compared with
tests/ref/ref_forward.py over 40 tokens (well past the window).

Tolerance, F32 weights: the engine and the reference read the same values and differ only by
float32 rounding, as in test_dense.py: err <= 1e-4 (measured about 3e-6). Q8_0 weights: the
reference emulates the engine's activation quantization; each quantized product input adds
a relative error eps (measured by the reference), independent between products, so
err <= 3 eps sqrt(n) with n the products with their own quantized input: per layer h (q/k/v),
the attention output, h (gate/up), the gated FFN activation, x (the per-layer input gate)
and the gated per-layer input (6), plus the embedding's per-layer projection and the output.

Each feature must matter, or the comparison would not test it: the reference with the
feature switched off (value norm, per-layer inputs, layer output scales, rope_freqs, the
window, soft-capping) must differ from the engine by far more than the tolerance. Shared KV
layers have no k/v weights, so they cannot be switched off; a wrong cache read shows in the
comparison itself.

Batch invariance: decode vs prefill and 1 vs 2 threads bit-identical here; the same tokens
alone and beside up to 31 others in tests/unit/test_batch.c
(batch_matches_sequences_alone_gemma4). llama.cpp itself: tests/py/test_llamacpp.py's gemma4
rows.

The mixture-of-experts variant (26B-A4B's layout, preset gemma4-moe-tiny: 8 experts, top 2,
beside the dense MLP; docs/design.md): F32 with gate/up fused and apart, and Q8_0 (two
more quantized product inputs per layer in the tolerance), the routing margin checked far
above float32 rounding, and the experts, per-expert scales, router input scale and experts'
input norm each shown to matter.

Loading: missing tensors and keys, malformed per-layer arrays, mismatched shared layers and
broken expert layouts are refused with the file and the tensor or key named.
"""
import copy
import os
import tempfile

import numpy as np

from common import Suite, binary

import gguf_gen
from ref_forward import RefModel
from test_dense import engine, err, load_error

N_TOKENS = 40
TOL = 1e-4
FEATURE_MIN = 100 * TOL


def switched_off(m, toks):
    """[(feature, reference logits with it off)]."""
    out = []
    for label, key in (("value norm", "v_norm"), ("per-layer inputs", "pl"),
                       ("layer output scales", "out_scale")):
        r = copy.copy(m)
        r.g4 = dict(m.g4, **{key: False})
        out.append((label, r.session().forward(toks)))
    r = copy.copy(m)
    r.w = {k: v for k, v in m.w.items() if k != "rope_freqs.weight"}
    out.append(("rope_freqs (partial rotation)", r.session().forward(toks)))
    r = copy.copy(m)
    r.swa = [0] * m.n_layer
    out.append(("sliding window", r.session().forward(toks)))
    r = copy.copy(m)
    r.final_softcap = 0.0
    out.append(("final soft-capping", r.session().forward(toks)))
    return out


def switched_off_moe(m, toks):
    """[(feature, reference logits with it off)] for the mixture-of-experts variant."""
    out = []
    for label, key in (("experts", "moe"), ("per-expert scales", "exp_scale")):
        r = copy.copy(m)
        r.g4 = dict(m.g4, **{key: False})
        out.append((label, r.session().forward(toks)))
    for label, name in (("router input scale", "ffn_gate_inp.scale"),
                        ("experts' input norm", "pre_ffw_norm_2.weight")):
        r = copy.copy(m)
        r.w = {k: (np.ones_like(v) * (np.sqrt(m.n_embd) if "scale" in name else 1.0)
                   if k.endswith(name) else v) for k, v in m.w.items()}
        out.append((label, r.session().forward(toks)))
    return out


def check_model(s, exe, tmp, name, cfg):
    path = os.path.join(tmp, name + ".gguf")
    c = gguf_gen.generate(path, cfg)
    rng = np.random.default_rng(cfg["seed"])
    toks = [1] + [int(t) for t in rng.integers(3, c["vocab"], N_TOKENS - 1)]
    quant = c["type"] != "f32"
    m = RefModel(path, act_quant=quant, n_ctx=N_TOKENS + 1)
    ref = m.session().forward(toks)
    tol = TOL
    if quant:
        eps = float(np.sqrt(np.mean(m.act_err2)))
        # with experts, two more quantized inputs per layer (experts' input, gated activation)
        tol = 3 * eps * np.sqrt((8 if c["n_expert"] else 6) * c["n_layers"] + 2)
    spread = float(ref.std(axis=1).min())
    s.case(f"{name} reference logits well spread", spread >= 1.0, f"min std {spread:.2f}")
    if c["n_expert"]:
        # float32 routing picks the float64 reference's experts only with a clear gap
        s.case(f"{name} routing margin far above float32 rounding", m.route_margin > 1e-4,
               f"smallest top-k gap {m.route_margin:.1e} > 1e-04")
    out = os.path.join(tmp, name + ".logits")
    pre = engine(exe, path, toks, out, c["vocab"])
    e = err(pre, ref)
    s.case(f"{name} prefill vs reference", e <= tol, f"err {e:.2e} <= {tol:.1e}")
    for cpu in ("scalar", "avx2"):
        lv = engine(exe, path, toks, out, c["vocab"], threads=2, cpu=cpu)
        e = err(lv, ref)
        s.case(f"{name} prefill SAMPAN_CPU={cpu} vs reference", e <= tol,
               f"err {e:.2e} <= {tol:.1e}")
    dec = engine(exe, path, toks, out, c["vocab"], decode=True)
    same = np.array_equal(dec, pre)
    s.case(f"{name} decode vs prefill bit-identical", same, "" if same else f"{err(dec, pre):.1e}")
    two = engine(exe, path, toks, out, c["vocab"], threads=2)
    same = np.array_equal(two, pre)
    s.case(f"{name} threads 1 vs 2 bit-identical", same, "" if same else f"{err(two, pre):.1e}")
    if not quant:
        for feat, alt in (switched_off_moe if c["n_expert"] else switched_off)(m, toks):
            e = err(pre, alt)
            s.case(f"{name} {feat} matters", e >= FEATURE_MIN,
                   f"engine vs reference without it: {e:.2e} >= {FEATURE_MIN:.0e}")


def write_variant(path, cfg, drop=(), replace=None):
    """gguf_gen's file with tensors dropped and metadata records replaced or added
    (replace: key -> record, None = drop the key)."""
    tl, md = gguf_gen.tensor_list, gguf_gen.metadata
    replace = replace or {}

    def meta(c, r):
        kv = md(c, r)
        for key, rec in replace.items():
            kv = [x for x in kv if not x.startswith(gguf_gen._s(key))]
            if rec is not None:
                kv.append(rec)
        return kv
    gguf_gen.tensor_list = lambda c: [t for t in tl(c) if t[0] not in drop]
    gguf_gen.metadata = meta
    try:
        gguf_gen.generate(path, cfg)
    finally:
        gguf_gen.tensor_list, gguf_gen.metadata = tl, md


def check_errors(s, exe, tmp):
    kvb, A, I32, U32, B = (gguf_gen.kv_bytes, gguf_gen.T_ARRAY, gguf_gen.T_INT32,
                           gguf_gen.T_UINT32, gguf_gen.T_BOOL)
    cfg = dict(preset="gemma4-tiny")
    cases = [
        ("without per_layer_model_proj", ["per_layer_model_proj.weight"], {},
         "per_layer_model_proj.weight"),
        ("without a layer's per-layer gate", ["blk.2.inp_gate.weight"], {},
         "blk.2.inp_gate.weight"),
        ("without rope_freqs", ["rope_freqs.weight"], {}, "rope_freqs.weight"),
        ("without a cached layer's k norm", ["blk.3.attn_k_norm.weight"], {},
         "blk.3.attn_k_norm.weight"),
        ("without key_length_swa", [], {"gemma4.attention.key_length_swa": None},
         "gemma4.attention.key_length_swa"),
        ("without embedding_length_per_layer_input", [],
         {"gemma4.embedding_length_per_layer_input": None},
         "gemma4.embedding_length_per_layer_input"),
        ("value_length_swa != key_length_swa", [],
         {"gemma4.attention.value_length_swa": kvb("gemma4.attention.value_length_swa", U32, 16)},
         "gemma4.attention.value_length_swa"),
        ("sliding_window_pattern of the wrong length", [],
         {"gemma4.attention.sliding_window_pattern":
          kvb("gemma4.attention.sliding_window_pattern", A, [True] * 5, B)},
         "gemma4.attention.sliding_window_pattern"),
        ("head_count_kv not dividing head_count", [],
         {"gemma4.attention.head_count_kv":
          kvb("gemma4.attention.head_count_kv", A, [2, 2, 2, 3, 2, 3], I32)},
         "head_count_kv"),
        ("feed_forward_length array with a zero", [],
         {"gemma4.feed_forward_length":
          kvb("gemma4.feed_forward_length", A, [128, 128, 0, 128, 256, 256], I32)},
         "gemma4.feed_forward_length"),
        # 3 shared layers: layer 3 (global) would read layer 2 (sliding)
        ("a shared layer reading a layer of the other kind", [],
         {"gemma4.attention.shared_kv_layers": kvb("gemma4.attention.shared_kv_layers", U32, 3)},
         "layer 3 shares the KV cache of layer 2"),
        ("a router without expert_count", [], {"gemma4.expert_count": None,
                                               "gemma4.expert_used_count": None},
         "blk.0.ffn_gate_inp.weight"),
        ("experts without expert_feed_forward_length", [],
         {"gemma4.expert_feed_forward_length": None}, "gemma4.expert_feed_forward_length"),
        ("experts without the router input scale", ["blk.1.ffn_gate_inp.scale"], {},
         "blk.1.ffn_gate_inp.scale"),
        ("experts without pre_ffw_norm_2", ["blk.2.pre_ffw_norm_2.weight"], {},
         "blk.2.pre_ffw_norm_2.weight"),
        ("experts without post_ffw_norm_1", ["blk.0.post_ffw_norm_1.weight"], {},
         "blk.0.post_ffw_norm_1.weight"),
        ("experts without their down matrices", ["blk.3.ffn_down_exps.weight"], {},
         "blk.3.ffn_down_exps.weight"),
        ("expert_used_count over expert_count", [],
         {"gemma4.expert_used_count": kvb("gemma4.expert_used_count", U32, 9)},
         "gemma4.expert_used_count"),
    ]
    for i, (what, drop, repl, want) in enumerate(cases):
        path = os.path.join(tmp, f"bad{i}.gguf")
        moe = "expert" in what or "router" in what
        write_variant(path, dict(preset="gemma4-moe-tiny") if moe else cfg, drop, repl)
        rc, msg = load_error(exe, path)
        ok = rc != 0 and rc < 128 and want in msg and path in msg
        s.case(f"refused: gemma4 {what}", ok, msg.splitlines()[-1][:200] if msg else f"rc {rc}")


def main():
    s = Suite("gemma4")
    exe = binary()
    with tempfile.TemporaryDirectory(prefix="sampan-gemma4-") as tmp:
        if exe is None:
            s.skip("gemma4 vs engine", "build/sampan not built (make)")
        else:
            s.guard("gemma4 f32 vs engine", check_model, s, exe, tmp, "gemma4",
                    dict(preset="gemma4-tiny", seed=41))
            s.guard("gemma4 q8_0 vs engine", check_model, s, exe, tmp, "gemma4-q8_0",
                    dict(preset="gemma4-tiny", seed=42, dim=128, ff=256, type="q8_0"))
            s.guard("gemma4 moe f32 vs engine", check_model, s, exe, tmp, "gemma4-moe",
                    dict(preset="gemma4-moe-tiny", seed=49))
            s.guard("gemma4 moe gate/up apart f32 vs engine", check_model, s, exe, tmp,
                    "gemma4-moe-split", dict(preset="gemma4-moe-tiny", seed=44, split_exps=True))
            s.guard("gemma4 moe q8_0 vs engine", check_model, s, exe, tmp, "gemma4-moe-q8_0",
                    dict(preset="gemma4-moe-tiny", seed=45, dim=128, ff=256, ff_exp=64,
                         type="q8_0"))
            s.guard("loading errors", check_errors, s, exe, tmp)
    s.finish()


if __name__ == "__main__":
    main()
