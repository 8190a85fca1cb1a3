#!/usr/bin/python3
"""test_dense.py - the architectures beyond the llama family (qwen3, gemma2, gemma3, phi3,
smollm3, granite, olmo2) against the NumPy reference, and their loading errors.

Per architecture a random-weight model from tools/gguf_gen.py (tensor names and metadata as
llama.cpp's converter writes them) runs through `sampan eval` (prefill with 1 and 2 threads,
decode one token at a time, the scalar and AVX2 kernel levels) and is compared with
tests/ref/ref_forward.py. The 40 tokens run well past the sliding windows (8 positions),
so windowed layers attend to a strict suffix.

Tolerance: F32 weights, so the engine and the reference read the same values and differ only
by float32 rounding, as in test_reference.py: err <= 1e-4 (measured about 5e-7). Soft-capping
(c tanh(s / c), derivative <= 1), post-norms and GELU do not amplify relative errors.

Each feature must matter, or the comparison would not test it: the reference with the
feature switched off (window ignored, soft-caps off, RoPE on every smollm3 layer, phi3's
other LongRoPE factor set) must differ from the engine by far more than the tolerance.

Batch invariance: decode vs prefill and 1 vs 2 threads bit-identical here; the same tokens
alone and beside up to 31 other sequences in tests/unit/test_batch.c
(batch_matches_sequences_alone_dense_archs).

Loading: a missing tensor, a malformed key and half of LongRoPE's factor pair are refused
with the file and the tensor or key named; an unknown architecture with the supported list.
"""
import copy
import os
import tempfile

import numpy as np

from common import Suite, binary, run

import gguf_gen
from ref_forward import RefModel

N_TOKENS = 40
TOL = 1e-4
FEATURE_MIN = 100 * TOL  # a switched-off feature must move the logits at least this much

CASES = {
    "qwen3": dict(preset="qwen3-tiny", seed=31),
    "gemma2": dict(preset="gemma2-tiny", seed=32),
    # pattern 3 over 3 layers: layers 0 and 1 slide with the local base, layer 2 is global
    # with the linearly scaled base
    "gemma3": dict(preset="gemma3-tiny", seed=33, final_softcap=5.0),
    # context 256 > original 64: the long factors and the attention factor
    "phi3-long": dict(preset="phi3-tiny", seed=34, swa=12),
    "smollm3": dict(preset="smollm3-tiny", seed=35),
    "granite": dict(preset="granite-tiny", seed=38),
    "olmo2": dict(preset="olmo2-tiny", seed=39),
    "gemma2-q8_0": dict(preset="gemma2-tiny", seed=36, dim=256, ff=512, type="q8_0"),
}


def err(a, b):
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())


def engine(exe, path, toks, out, n_vocab, threads=1, decode=False, cpu=None, ctx=None):
    args = [exe, "eval", "-m", path, "--tokens", ",".join(map(str, toks)), "-t", str(threads),
            "--logits-out", out]
    if decode:
        args.append("--decode")
    if ctx:
        args += ["-c", str(ctx)]
    if os.path.exists(out):
        os.remove(out)
    rc, so, se = run(args, timeout=120, env={"SAMPAN_CPU": cpu} if cpu else None)
    if rc != 0:
        raise RuntimeError(f"sampan eval exit {rc}: {(se or so).strip()[-300:]}")
    return np.fromfile(out, dtype="<f4").reshape(len(toks), n_vocab).astype(np.float64)


def switched_off(path, toks, name, ctx):
    """Reference logits with the architecture's distinguishing features off, one at a time:
    [(feature, logits)]."""
    out = []
    m = RefModel(path, n_ctx=ctx)
    if any(m.swa):
        r = copy.copy(m)
        r.swa = [0] * r.n_layer
        out.append(("sliding window", r.session().forward(toks)))
    if m.attn_softcap or m.final_softcap:
        r = copy.copy(m)
        r.attn_softcap = r.final_softcap = 0.0
        out.append(("soft-capping", r.session().forward(toks)))
    if not all(m.use_rope):
        r = copy.copy(m)
        r.use_rope = [True] * r.n_layer
        out.append(("no-RoPE layers", r.session().forward(toks)))
    if "rope_factors_long.weight" in m.w:
        r = copy.copy(m)
        r.rope_factors = m.w["rope_factors_short.weight"]
        out.append(("the long factor set", r.session().forward(toks)))
    for label, part in (("q/k norms", ("attn_q_norm", "attn_k_norm")),
                        ("post-norms", ("post_attention_norm", "post_ffw_norm"))):
        if any(k.endswith(part[0] + ".weight") for k in m.w):
            r = copy.copy(m)
            r.w = {k: v for k, v in m.w.items() if not any(x in k for x in part)}
            out.append((label, r.session().forward(toks)))
    if m.arch == "granite":
        r = copy.copy(m)
        r.residual_scale = r.logit_scale = r.embd_scale = 1.0
        out.append(("the granite scales", r.session().forward(toks)))
    if len(set(m.layer_rope)) > 1:
        r = copy.copy(m)
        r.layer_rope = [m.layer_rope[-1]] * r.n_layer
        out.append(("the local RoPE base", r.session().forward(toks)))
    return out


def check_arch(s, exe, tmp, name, cfg):
    path = os.path.join(tmp, name + ".gguf")
    c = gguf_gen.generate(path, cfg)
    rng = np.random.default_rng(cfg["seed"])
    toks = [1] + [int(t) for t in rng.integers(3, c["vocab"], N_TOKENS - 1)]
    ctx = 256 if name.startswith("phi3") else None
    ref = RefModel(path, n_ctx=ctx or N_TOKENS + 1).session().forward(toks)
    quant = c["type"] != "f32"
    tol = TOL
    if quant:
        # as test_reference.py: 3 eps sqrt(4L + 1) against the emulating reference
        em = RefModel(path, act_quant=True, n_ctx=ctx or N_TOKENS + 1)
        ref = em.session().forward(toks)
        eps = float(np.sqrt(np.mean(em.act_err2)))
        tol = 3 * eps * np.sqrt(4 * c["n_layers"] + 1)
    out = os.path.join(tmp, name + ".logits")
    pre = engine(exe, path, toks, out, c["vocab"], ctx=ctx)
    e = err(pre, ref)
    s.case(f"{name} prefill vs reference", e <= tol, f"err {e:.2e} <= {tol:.1e}")
    for cpu in ("scalar", "avx2"):
        lv = engine(exe, path, toks, out, c["vocab"], threads=2, cpu=cpu, ctx=ctx)
        e = err(lv, ref)
        s.case(f"{name} prefill SAMPAN_CPU={cpu} vs reference", e <= tol,
               f"err {e:.2e} <= {tol:.1e}")
    dec = engine(exe, path, toks, out, c["vocab"], decode=True, ctx=ctx)
    same = np.array_equal(dec, pre)
    s.case(f"{name} decode vs prefill bit-identical", same, "" if same else f"{err(dec, pre):.1e}")
    two = engine(exe, path, toks, out, c["vocab"], threads=2, ctx=ctx)
    same = np.array_equal(two, pre)
    s.case(f"{name} threads 1 vs 2 bit-identical", same, "" if same else f"{err(two, pre):.1e}")
    if not quant:
        for feat, alt in switched_off(path, toks, name, ctx or N_TOKENS + 1):
            e = err(pre, alt)
            s.case(f"{name} {feat} matters", e >= FEATURE_MIN,
                   f"engine vs reference without it: {e:.2e} >= {FEATURE_MIN:.0e}")


def check_phi3_short(s, exe, tmp):
    """A context within the original one: the short factors (eval's default context is the
    tokens + 1 = 41 <= 64)."""
    path = os.path.join(tmp, "phi3-short.gguf")
    c = gguf_gen.generate(path, dict(preset="phi3-tiny", seed=37))
    toks = list(range(1, N_TOKENS + 1))
    ref = RefModel(path, n_ctx=N_TOKENS + 1).session().forward(toks)
    a = engine(exe, path, toks, os.path.join(tmp, "p.logits"), c["vocab"])
    e = err(a, ref)
    s.case("phi3 short factors (context 41 <= 64) vs reference", e <= TOL, f"err {e:.2e}")
    longref = RefModel(path, n_ctx=256).session().forward(toks)
    e = err(a, longref)
    s.case("phi3 short vs long factors differ", e >= FEATURE_MIN, f"{e:.2e}")


def load_error(exe, path):
    rc, so, se = run([exe, "eval", "-m", path, "--tokens", "1,2"], timeout=60)
    return rc, (se + so).strip()


def write_variant(path, cfg, drop=(), kv_extra=(), shapes=None):
    """gguf_gen's file with tensors dropped, metadata records added and tensor shapes
    replaced (shapes: name -> ne)."""
    tl, md = gguf_gen.tensor_list, gguf_gen.metadata
    shapes = shapes or {}
    gguf_gen.tensor_list = lambda c: [(t[0], shapes.get(t[0], t[1])) + tuple(t[2:])
                                      for t in tl(c) if t[0] not in drop]
    gguf_gen.metadata = lambda c, r: md(c, r) + list(kv_extra)
    try:
        gguf_gen.generate(path, cfg)
    finally:
        gguf_gen.tensor_list, gguf_gen.metadata = tl, md


def check_errors(s, exe, tmp):
    cases = [
        ("gemma2 without a post-attention norm", dict(preset="gemma2-tiny"),
         ["blk.1.post_attention_norm.weight"], [], "blk.1.post_attention_norm.weight"),
        ("qwen3 without a k norm", dict(preset="qwen3-tiny"), ["blk.0.attn_k_norm.weight"], [],
         "blk.0.attn_k_norm.weight"),
        ("phi3 with only the long factors", dict(preset="phi3-tiny"),
         ["rope_factors_short.weight"], [], "rope_factors_short.weight"),
        ("phi3 without attn_qkv", dict(preset="phi3-tiny"), ["blk.0.attn_qkv.weight"], [],
         "blk.0.attn_q.weight"),
        ("gemma3 sliding_window as a string", dict(preset="gemma3-tiny", swa=0), [],
         [gguf_gen.kv_bytes("gemma3.attention.sliding_window", gguf_gen.T_STRING, "8")],
         "gemma3.attention.sliding_window"),
        ("granite without logit_scale", dict(preset="granite-tiny", granite_scales=()), [], [],
         "granite.logit_scale"),
        ("gemma2 soft-cap out of range", dict(preset="gemma2-tiny", attn_softcap=-1.0), [], [],
         "gemma2.attn_logit_softcapping"),
    ]
    for i, (what, cfg, drop, extra, want) in enumerate(cases):
        path = os.path.join(tmp, f"bad{i}.gguf")
        write_variant(path, cfg, drop, extra)
        rc, msg = load_error(exe, path)
        ok = rc != 0 and rc < 128 and want in msg and path in msg
        s.case(f"refused: {what}", ok, msg.splitlines()[-1][:200] if msg else f"rc {rc}")
    # olmo2's q norm spans the whole projection: a per-head one is a wrong shape
    path = os.path.join(tmp, "olmo2-qnorm.gguf")
    write_variant(path, dict(preset="olmo2-tiny"), shapes={"blk.0.attn_q_norm.weight": (16,)})
    rc, msg = load_error(exe, path)
    ok = rc != 0 and rc < 128 and "blk.0.attn_q_norm.weight" in msg and path in msg
    s.case("refused: olmo2 with a per-head q norm", ok, msg.splitlines()[-1][:200] if msg else "")
    path = os.path.join(tmp, "unknown.gguf")
    write_variant(path, dict(preset="tiny"), (), [])
    with open(path, "r+b") as f:  # rename the architecture in place: llama -> llamb
        data = f.read()
        k = data.index(b"llama", data.index(b"general.architecture"))
        f.seek(k)
        f.write(b"llamb")
    rc, msg = load_error(exe, path)
    ok = rc != 0 and "llamb" in msg and "gemma3" in msg and "smollm3" in msg and path in msg
    s.case("refused: unknown architecture, supported list named", ok, msg[-200:])


def main():
    s = Suite("dense")
    exe = binary()
    with tempfile.TemporaryDirectory(prefix="sampan-dense-") as tmp:
        if exe is None:
            s.skip("dense architectures vs engine", "build/sampan not built (make)")
        else:
            for name, cfg in CASES.items():
                s.guard(f"{name} vs engine", check_arch, s, exe, tmp, name, cfg)
            s.guard("phi3 short factors", check_phi3_short, s, exe, tmp)
            s.guard("loading errors", check_errors, s, exe, tmp)
    s.finish()


if __name__ == "__main__":
    main()
