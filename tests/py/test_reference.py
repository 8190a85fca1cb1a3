#!/usr/bin/python3
"""test_reference.py - the engine's logits against the independent NumPy reference.

Part 1 (always runs): checks of the reference and the generator themselves:
  - greedy decoding of models/stories260K.gguf with the reference reproduces llama2.c's
    output (tests/data/stories260K.greedy-256.txt), which validates the reference (GGUF
    reading, RMSNorm, normal RoPE, grouped-query attention, SwiGLU) against llama2.c;
  - NeoX RoPE equals normal RoPE on permuted dimensions; the reference's one-token-at-a-
    time path equals its prefill;
  - every quantizer of tools/gguf_gen.py round-trips through the reference's dequantizers
    (written separately from the block layouts) within the format's error;
  - metadata, shapes and --vocab-from of generated files.
Part 2 (needs build/sampan, else skipped): random-weight models of several shapes and every
tensor type are run through `sampan eval` (prefill and decode, 1 and 2 threads, and prefill
with the lower kernel levels SAMPAN_CPU=scalar and avx2) and compared with the reference.

Error measure. For engine logits a and reference logits b (one row per position):
    err = max over positions p of  max_v |a[p,v] - b[p,v]| / max_v |b[p,v]|
F32, F16 and BF16 weights: the engine multiplies them with float32 activations and the
reference reads the exact same weight values, so the only difference is float32 rounding
(measured: about 2e-6 for these shapes): err <= 1e-4.

Quantized weights (Q8_0, Q4_0, Q4_K, Q6_K): the reference also reads the exact stored
weights, but the engine first quantizes each activation row to Q8_0 (for Q8_0/Q4_0) or
Q8_K (for Q4_K/Q6_K). Derivation of the tolerance:
  - each such quantization adds rounding noise of relative rms eps (for Q8_0 with a block
    amax about 2.5x the rms: eps ~ 2.5 / (127 sqrt(12)) ~ 0.006; Q8_K about 0.009). The
    reference emulates the same quantization (act_quant=True) and measures eps on the
    actual activations of this model and these tokens;
  - a token's path goes through 4 quantized products per layer (qkv, output, gate/up,
    down) and the output matrix, so about 4L+1 independent noises of relative size eps
    reach the logits: relative error ~ eps * sqrt(4L + 1) (measured 1.0-1.6x that with
    the max-based err above);
  - the engine's float32 arithmetic moves some values across rounding boundaries, and a
    changed activation changes later roundings (the difference cascades), so the engine
    does not follow the emulated reference exactly: it is just another draw of the same
    noise (measured: float32 vs float64 emulation differ by 0 to 0.02 here).
  Hence tol = 3 * eps * sqrt(4L + 1) (about 0.05-0.08 for these 2-layer models), and the
  engine must be within tol of both the plain and the emulating reference; the emulating
  reference itself must be within tol of the plain one (a check of the derivation).
  Decoding errors of the weights (wrong nibble, scale or sign) give err of order 1 (tried:
  dropping the high bits of Q4_K scales 4..7 gives 1.1, reversed mins 1.6).
  The emulation follows the engine's rounding conventions, so in practice the engine
  matches it to ~3e-7 ("tight" on the line); "a rounding difference cascaded" on the line
  is allowed but says the match was not exact.

Determinism (batch invariance): the same tokens with 1 or 2 threads, and through one
prefill batch or one decode step at a time, give bit-identical logits for every type.
"""
import os
import sys
import tempfile

import numpy as np

from common import ROOT, Suite, binary, run

import gguf_gen
from gguf_read import GGUF
from quants import ACT_QUANT, TYPE_NUM, dequantize
from ref_forward import RefModel, detokenize, greedy

N_TOKENS = 20
FLOAT_TOL = 1e-4
CPU_LEVELS = ("scalar", "avx2")  # besides the default (best) level

SHAPES = {
    "a-llama-gqa-tied": dict(arch="llama", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ff=160,
                             vocab=300, tied=True, seed=11),
    "b-qwen2-bias-neox-untied": dict(arch="qwen2", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                     ff=176, vocab=300, tied=False, qkv_bias=True,
                                     rope_base=1000000.0, eps=1e-6, seed=12),
    "c-odd-hd48-h3-ff200-v301-rope2": dict(arch="llama", dim=144, n_layers=2, n_heads=3,
                                           n_kv_heads=1, ff=200, vocab=301, rope_scale=2.0,
                                           tied=False, seed=13),
    "d-mha-3layers": dict(arch="llama", dim=64, n_layers=3, n_heads=4, n_kv_heads=4, ff=128,
                          vocab=300, tied=True, seed=14),
    # n_heads * head_dim != dim (attention.key_length / value_length in the file)
    "e-hd32-qdim128-dim64": dict(arch="llama", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                 head_dim=32, ff=96, vocab=300, tied=False, seed=15),
    # qwen3: per-head q/k RMSNorm before NeoX RoPE, head_dim 32 over dim 64
    "f-qwen3-qknorm-hd32": dict(arch="qwen3", dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                head_dim=32, ff=160, vocab=300, tied=True, rope_base=1000000.0,
                                eps=1e-6, seed=16),
}
# 256 wide: every row length is a multiple of the K-quant super-block
QSHAPE = dict(arch="llama", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ff=512, vocab=320,
              tied=False, seed=21)


def err(a, b):
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())


def models():
    """(name, generator config, weight type) for every engine case."""
    out = [(n + "-f32", dict(c, type="f32"), "f32") for n, c in SHAPES.items()]
    for t in ("f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"):
        out.append((f"w256-{t}", dict(QSHAPE, type=t), t))
    out.append(("w256-q4_k-q6_k-output", dict(QSHAPE, type="q4_k", output_type="q6_k"), "q4_k"))
    out.append(("w256-qwen2-bias-tied-q8_0",
                dict(QSHAPE, arch="qwen2", qkv_bias=True, tied=True, type="q8_0", seed=22),
                "q8_0"))
    return out


# ---- part 1: the reference and the generator ------------------------------------

def check_stories(s):
    path = os.path.join(ROOT, "models", "stories260K.gguf")
    want_path = os.path.join(ROOT, "tests", "data", "stories260K.greedy-256.txt")
    if not os.path.exists(path) or not os.path.exists(want_path):
        s.skip("ref stories260K greedy", "models/stories260K.gguf or its greedy text missing")
        return
    m = RefModel(path)
    ids = greedy(m, [1], 255)
    want = open(want_path, "rb").read()
    k = 0
    while k < len(ids) and want.startswith(detokenize(m.tokens, ids[:k + 1])):
        k += 1
    s.case("ref stories260K greedy == llama2.c", k >= 60, f"{k}/{len(ids)} tokens match")


def check_rope(s):
    """NeoX rotation of (x[i], x[i+h]) is the normal rotation of (x[2i], x[2i+1]) after
    interleaving the two halves; both keep norms and make q.k depend on p_q - p_k only."""
    m = RefModel.__new__(RefModel)
    m.n_rot, m.rope_base, m.rope_scale, m.dtype = 16, 10000.0, 2.0, np.float64
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 2, 16))
    pos = np.array([0, 1, 7, 30, 100])
    perm = np.stack([np.arange(8), np.arange(8, 16)], axis=1).reshape(-1)  # 0,8,1,9,...
    m.neox = True
    a = m.rope(x, pos)
    m.neox = False
    b = m.rope(x[..., perm], pos)
    ok = np.allclose(a[..., perm], b, atol=1e-12)
    ok &= np.allclose(np.linalg.norm(a, axis=-1), np.linalg.norm(x, axis=-1))
    q, k = rng.standard_normal((1, 1, 16)), rng.standard_normal((1, 1, 16))
    d1 = (m.rope(q, np.array([9])) * m.rope(k, np.array([4]))).sum()
    d2 = (m.rope(q, np.array([25])) * m.rope(k, np.array([20]))).sum()
    ok &= abs(d1 - d2) < 1e-9
    # the rotation at position 2 with scale 2 is the rotation at position 1 unscaled
    c = m.rope(x, np.array([2] * 5))
    m.rope_scale = 1.0
    ok &= np.allclose(c, m.rope(x, np.array([1] * 5)), atol=1e-12)
    s.case("ref rope: neox == permuted normal, relative, linear scaling", bool(ok))


def check_ref_decode(s, tmp):
    p = os.path.join(tmp, "selfcheck.gguf")
    gguf_gen.generate(p, dict(SHAPES["b-qwen2-bias-neox-untied"], type="f32"))
    m = RefModel(p)
    toks = [1, 17, 250, 3, 99, 42, 7]
    full = m.session().forward(toks)
    sess = m.session()
    step = np.concatenate([sess.forward(toks[:3])] + [sess.forward([t]) for t in toks[3:]])
    e = err(step, full)
    s.case("ref decode == prefill (reference self-consistency)", e < 1e-12, f"err {e:.1e}")


# rms error of a round trip relative to the rms of the data, and the largest error
# relative to the largest |value| of its block: bounds of each format for Gaussian data
ROUNDTRIP = {
    "f16": (3e-4, 2 ** -11, 1), "bf16": (2.5e-3, 2 ** -8, 1), "q8_0": (8e-3, 0.6 / 127, 32),
    "q4_0": (0.11, 1.05 / 8, 32), "q4_k": (0.10, 0.12, 32), "q6_k": (0.03, 0.6 / 31 + 0.01, 16),
}


def check_roundtrip(s):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((8, 512)) * 0.05).astype(np.float32)
    x[0, :256] = np.abs(x[0, :256])        # one all-positive super-block (Q4_K min = 0)
    sp = x[:2].copy()                       # special rows, checked apart from the bounds
    sp[0, :32] = 0.0                        # a zero block
    sp[1, 40] = 3.0                         # an outlier (largest of its blocks)
    for t, (rms_b, max_b, blk) in ROUNDTRIP.items():
        raw = gguf_gen.encode(x, t)
        y = dequantize(raw, TYPE_NUM[t], x.size).reshape(x.shape)
        d = np.abs(y - x)
        rms = float(np.sqrt((d ** 2).mean() / (x.astype(np.float64) ** 2).mean()))
        if t in ("f16", "bf16"):
            worst = float((d / np.maximum(np.abs(x), 1e-30)).max())
        else:
            bm = np.abs(x).reshape(-1, blk).max(axis=1, keepdims=True)
            worst = float((d.reshape(-1, blk) / np.maximum(bm, 1e-30)).max())
        ysp = dequantize(gguf_gen.encode(sp, t), TYPE_NUM[t], sp.size).reshape(sp.shape)
        special = bool(np.all(ysp[0, :32] == 0) and abs(ysp[1, 40] - 3.0) < 0.01 * 3.0)
        ok = rms <= rms_b and worst <= max_b and special and \
            len(raw) == x.shape[0] * gguf_gen.row_bytes(t, x.shape[1])
        s.case(f"gen {t} round trip through the reference dequantizer", ok,
               f"rms {rms:.2e} <= {rms_b:.0e}, max/block-amax {worst:.2e} <= {max_b:.2e}, "
               f"zero block and outlier {'ok' if special else 'WRONG'}")


def check_generated_file(s, tmp):
    p = os.path.join(tmp, "meta.gguf")
    cfg = gguf_gen.generate(p, dict(SHAPES["c-odd-hd48-h3-ff200-v301-rope2"], type="q8_0",
                                    dim=192, n_heads=4, head_dim=48, ff=224))
    g = GGUF(p)
    kv, a = g.kv, "llama"
    ok = (kv["general.architecture"] == a and kv[f"{a}.embedding_length"] == 192
          and kv[f"{a}.attention.head_count"] == 4 and kv[f"{a}.attention.head_count_kv"] == 1
          and kv[f"{a}.rope.dimension_count"] == 48 and kv[f"{a}.rope.scaling.type"] == "linear"
          and kv[f"{a}.rope.scaling.factor"] == 2.0 and kv[f"{a}.feed_forward_length"] == 224
          and kv[f"{a}.vocab_size"] == 301 and len(kv["tokenizer.ggml.tokens"]) == 301
          and kv["tokenizer.ggml.model"] == "llama" and kv["tokenizer.ggml.bos_token_id"] == 1
          and g.version == 3 and g.alignment == 32 and g.data_offset % 32 == 0)
    t = g.tensors
    ok &= (t["token_embd.weight"].ne == (192, 301) and t["blk.1.attn_q.weight"].ne == (192, 192)
           and t["blk.0.attn_k.weight"].ne == (192, 48)
           and t["blk.0.attn_output.weight"].ne == (192, 192)
           and t["blk.0.ffn_down.weight"].ne == (224, 192) and t["output.weight"].ne == (192, 301)
           and t["blk.0.attn_norm.weight"].type == 0 and t["blk.0.ffn_gate.weight"].type == 8
           and len(t) == 2 + 2 * 9 + 1)
    ok &= all(x.offset % 32 == 0 for x in t.values())
    last = max(t.values(), key=lambda x: x.offset)
    ok &= os.path.getsize(p) == g.data_offset + last.offset + last.nbytes
    toks = kv["tokenizer.ggml.tokens"]
    ok &= toks[:3] == ["<unk>", "<s>", "</s>"] and toks[3] == "<0x00>" and len(set(toks)) == 301
    s.case("gen metadata, shapes, alignment, synthetic vocab", bool(ok), cfg["name"])

    p2 = os.path.join(tmp, "bias.gguf")
    gguf_gen.generate(p2, dict(SHAPES["b-qwen2-bias-neox-untied"], type="f32"))
    g2 = GGUF(p2)
    ok = (g2.kv["general.architecture"] == "qwen2" and "blk.1.attn_v.bias" in g2.tensors
          and g2.tensors["blk.0.attn_k.bias"].ne == (32,) and "output.weight" in g2.tensors
          and g2.kv["qwen2.rope.freq_base"] == 1000000.0)
    s.case("gen qwen2 biases, untied output", bool(ok))

    # --vocab-from: the tokenizer keys come over unchanged and set the vocabulary size
    srcs = [p2]
    spm = os.path.join(ROOT, "tests", "data", "tokenizer", "ggml-vocab-llama-spm.gguf")
    if os.path.exists(spm):
        srcs.append(spm)
    for src in srcs:
        p3 = os.path.join(tmp, "vocab.gguf")
        gguf_gen.generate(p3, dict(SHAPES["a-llama-gqa-tied"], type="f16", vocab_from=src))
        g3, gs = GGUF(p3), GGUF(src)
        keys = [k for k in gs.kv if k.startswith("tokenizer.")]
        same = all(k in g3.kv and g3.kv_types[k] == gs.kv_types[k]
                   and np.array_equal(np.asarray(g3.kv[k]), np.asarray(gs.kv[k])) for k in keys)
        n = len(gs.kv["tokenizer.ggml.tokens"])
        ok = same and g3.tensors["token_embd.weight"].ne == (64, n) and \
            g3.kv["llama.vocab_size"] == n
        s.case(f"gen --vocab-from {os.path.basename(src)}", bool(ok),
               f"{len(keys)} keys, {n} tokens")
    if len(srcs) == 1:
        s.skip("gen --vocab-from ggml-vocab-llama-spm.gguf", "tests/data/tokenizer has no copy")

    # the command line
    p4 = os.path.join(tmp, "cli.gguf")
    rc, out, errs = run([sys.executable, os.path.join(ROOT, "tools", "gguf_gen.py"), p4,
                         "--preset", "tiny", "--type", "q4_0", "--untied", "--rope-scale", "4",
                         "--seed", "3"])
    ok = rc == 0 and "wrote" in out
    if ok:
        g4 = GGUF(p4)
        ok = g4.tensors["blk.0.attn_q.weight"].type == 2 and "output.weight" in g4.tensors and \
            g4.kv["llama.rope.scaling.factor"] == 4.0
    last = (out + errs).strip().splitlines()
    s.case("gen command line", bool(ok), last[-1] if last else "")


# ---- part 2: the engine -----------------------------------------------------------

def engine_logits(exe, path, toks, decode, threads, out, n_vocab, cpu=None):
    args = [exe, "eval", "-m", path, "--tokens", ",".join(map(str, toks)), "-t", str(threads),
            "--logits-out", out]
    if decode:
        args.append("--decode")
    if os.path.exists(out):
        os.remove(out)
    rc, so, se = run(args, timeout=120, env={"SAMPAN_CPU": cpu} if cpu else None)
    if rc != 0:
        tail = (se or so).strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"`{' '.join(args[:2])} ... {'--decode' if decode else ''} -t "
                           f"{threads}{' SAMPAN_CPU=' + cpu if cpu else ''}` exit {rc}: {tail[0]}")
    a = np.fromfile(out, dtype="<f4")
    if a.size != len(toks) * n_vocab:
        raise RuntimeError(f"logits file has {a.size} floats, want {len(toks)} x {n_vocab}")
    return a.reshape(len(toks), n_vocab).astype(np.float64)


def check_engine_model(s, exe, tmp, name, cfg, wtype):
    path = os.path.join(tmp, name + ".gguf")
    c = gguf_gen.generate(path, cfg)
    rng = np.random.default_rng(cfg["seed"])
    toks = [1] + [int(t) for t in rng.integers(3, c["vocab"], N_TOKENS - 1)]
    plain = RefModel(path).session().forward(toks)
    quant = ACT_QUANT[TYPE_NUM[wtype]] is not None
    if quant:
        em = RefModel(path, act_quant=True)
        emul = em.session().forward(toks)
        eps = float(np.sqrt(np.mean(em.act_err2)))
        tol = 3 * eps * np.sqrt(4 * c["n_layers"] + 1)
        e = err(emul, plain)
        s.case(f"{name} emulated act quant vs plain ref (derivation check)", e <= tol,
               f"err {e:.2e} <= tol {tol:.2e}, eps {eps:.4f}")
    else:
        tol = FLOAT_TOL
    out = os.path.join(tmp, name + ".logits")
    runs = {}
    for decode in (False, True):
        for th in (1, 2):
            runs[decode, th] = engine_logits(exe, path, toks, decode, th, out, c["vocab"])
    pre = runs[False, 1]
    e = err(pre, plain)
    s.case(f"{name} prefill vs reference", e <= tol, f"err {e:.2e} <= {tol:.1e}")
    if quant:
        e = err(pre, emul)
        how = "tight" if e <= 1e-4 else "a rounding difference cascaded"
        s.case(f"{name} prefill vs emulating reference", e <= tol,
               f"err {e:.2e} <= {tol:.1e}, {how}")
    # the lower kernel levels (SAMPAN_CPU) against the same reference
    for cpu in CPU_LEVELS:
        lv = engine_logits(exe, path, toks, False, 2, out, c["vocab"], cpu)
        e = err(lv, emul if quant else plain)
        s.case(f"{name} prefill SAMPAN_CPU={cpu} vs {'emulating ' if quant else ''}reference",
               e <= tol, f"err {e:.2e} <= {tol:.1e}")
    # Batch invariance is a product promise (docs/design.md): a position's
    # logits do not depend on whether it was computed in a prefill batch or a
    # decode step, so the two must be bit-identical for every type.
    dec = runs[True, 1]
    same = np.array_equal(dec, pre)
    s.case(f"{name} decode vs prefill bit-identical", same,
           "" if same else f"err {err(dec, pre):.1e}")
    for decode in (False, True):
        mode = "decode" if decode else "prefill"
        same = np.array_equal(runs[decode, 1], runs[decode, 2])
        e = err(runs[decode, 2], runs[decode, 1])
        s.case(f"{name} {mode} threads 1 vs 2 bit-identical", same,
               "" if same else f"err {e:.1e}")


def main():
    s = Suite("reference")
    with tempfile.TemporaryDirectory(prefix="sampan-ref-") as tmp:
        s.guard("ref stories260K greedy", check_stories, s)
        s.guard("ref rope", check_rope, s)
        s.guard("ref decode == prefill", check_ref_decode, s, tmp)
        s.guard("gen round trip", check_roundtrip, s)
        s.guard("gen files", check_generated_file, s, tmp)
        exe = binary()
        for name, cfg, wtype in models():
            if exe is None:
                s.skip(f"{name} vs engine", "build/sampan not built (make)")
                continue
            s.guard(f"{name} vs engine", check_engine_model, s, exe, tmp, name, cfg, wtype)
    s.finish()


if __name__ == "__main__":
    main()
