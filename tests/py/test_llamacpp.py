#!/usr/bin/python3
"""test_llamacpp.py - the engine's logits against llama.cpp's (an independent implementation,
run through tests/py/llamacpp_ref.py) on the same GGUF files and the same token ids.

Part 1, MODELS: random-weight models of each architecture the engine runs (shapes from
tools/gguf_gen.py ORACLE_SHAPES) in each tensor type it computes. Adding a row is one line:
("arch", "type") in MODELS (gguf_gen must be able to write the arch and type).

Part 2, MIXES: llama.cpp's quantizer (llama_model_quantize, what llama-quantize writes) turns an
F32 random model into its mixed-type files (Q4_K_M, Q3_K_M, IQ4_XS, ...). The engine either
matches llama.cpp on the file or refuses it with a load error that names a tensor of the file
and that tensor's type. A refusal is a failure when the type is one MODELS shows the engine
computing, so the table needs no edit when a kernel lands: the case turns from "refused" into
"matches" by itself.

Part 3, OURS: `sampan quantize IN OUT MIX` writes the same per-tensor types as llama.cpp's
quantizer for the same source model (both files' tensor types read back), and llama.cpp loads
our file and agrees with the engine on it.

Tolerance. llama.cpp is run twice per file, with an F32 and with an F16 KV cache. The spread
S = max |logits_f16kv - logits_f32kv| is llama.cpp's own difference when one rounding of
relative size 2^-11 is added to each K and V value (and, without flash attention, to Q): it
measures how much this model, these weights and these tokens amplify a rounding-sized change
(for quantized weights most of S comes from activation-quantization steps that the change
flips, cascading through the layers). The engine differs from llama.cpp by changes of the
same kind: float32 summation order (2^-24), and llama.cpp rounding every activation it
multiplies with F16 / BF16 weights to F16 / BF16 (2^-11 / 2^-8) where the engine keeps
float32, and for quantized weights the same activation-quantization flips. Those are
injected at every matrix product (7 per layer) instead of at K and V only (2-3 per layer), so
about sqrt(7/3) ~ 1.5 times more of it, and the maximum over 32 x 512 logits is a noisy
statistic (measured ratios engine-vs-llama.cpp over S: 0.0 to 1.14 over the MODELS rows).
Hence max |engine - llama.cpp (F32 KV)| <= K_MAX * S with K_MAX = 3, and the rms difference
<= K_MAX * rms spread. A broken kernel gives differences of the order of the logits' own
spread (std >= 1, checked per model, about 4 here), far above that.

Top-1. Where the max difference is within tol, the two engines can only disagree on a
position whose two candidates are within 2 * tol of each other in llama.cpp's logits (a near
tie); such a flip is allowed, at most MAX_FLIPS_FRAC of the positions (one in 8), and every
allowed flip is listed. Any flip at a clear margin fails.

Needs build/sampan and llama.cpp's libraries (tests/node or bench node_modules, see
llamacpp_ref.py); without either every case is a visible "skip".
"""
import os
import re
import sys
import tempfile

import numpy as np

from common import ROOT, Suite, binary, run

import gguf_gen
import llamacpp_ref as L

# (architecture, weight type): one model each, shape gguf_gen.ORACLE_SHAPES[arch]. Every type
# on llama; the other architectures with F32 and the types whose kernels they reach in a way
# llama does not (qwen2's biases beside a few block layouts; mistral's window beside a K-quant).
MODELS = [
    ("llama", "f32"),
    ("llama", "f16"),
    ("llama", "bf16"),
    ("llama", "q8_0"),
    ("llama", "q4_0"),
    ("llama", "q4_k"),
    ("llama", "q6_k"),
    ("llama", "q5_k"),
    ("llama", "q3_k"),
    ("llama", "iq4_xs"),
    ("llama", "q2_k"),
    ("llama", "q4_1"),
    ("llama", "q5_0"),
    ("llama", "q5_1"),
    ("llama", "iq4_nl"),
    ("llama", "mxfp4"),
    ("mistral", "f32"),
    ("mistral", "q4_k"),
    ("qwen2", "f32"),
    ("qwen2", "bf16"),
    ("qwen2", "q8_0"),
    ("qwen2", "q4_k"),
    ("qwen2", "iq4_nl"),
    # mixture of experts (engine/moe.c): "mixtral" is a llama file with experts
    ("mixtral", "f32"),
    ("mixtral", "f16"),
    ("mixtral", "q8_0"),
    ("mixtral", "q4_k"),
    ("qwen2moe", "f32"),
    ("qwen2moe", "q8_0"),
    ("qwen2moe", "q4_k"),
    ("qwen3moe", "f32"),
    ("qwen3moe", "q8_0"),
    ("qwen3moe", "q4_k"),
    # YaRN RoPE (rope.scaling.type yarn)
    ("llama-yarn", "f32"),
    ("llama-yarn", "q8_0"),
    ("qwen3", "f32"),
    ("qwen3", "q8_0"),
    ("gemma2", "f32"),
    ("gemma2", "q4_k"),
    ("gemma3", "f32"),
    ("gemma3", "q8_0"),
    ("phi3", "f32"),
    ("phi3", "q6_k"),
    ("smollm3", "f32"),
    ("smollm3", "q4_0"),
    ("granite", "f32"),
    ("granite", "q8_0"),
    ("olmo2", "f32"),
    ("olmo2", "q4_k"),
    # gemma4: per-layer inputs, two shared-KV layers, 64/128-wide sliding/global heads
    ("gemma4", "f32"),
    ("gemma4", "f16"),
    ("gemma4", "q8_0"),
    ("gemma4", "q4_k"),
    # gemma4's mixture-of-experts variant (26B-A4B's layout): router on its own normed input,
    # experts (gate/up fused) beside the dense MLP, per-expert output scales, three more norms
    ("gemma4-moe", "f32"),
    ("gemma4-moe", "f16"),
    ("gemma4-moe", "q8_0"),
    ("gemma4-moe", "q4_k"),
    # gpt-oss: MXFP4 experts (the type is the other matrices'), sinks, a window of 8 on the
    # even layers (shorter than N_TOKENS, so it cuts in), output bias, YaRN
    ("gpt-oss", "f32"),
    ("gpt-oss", "f16"),
    ("gpt-oss", "q8_0"),
    ("gpt-oss", "q4_k"),
    ("gpt-oss", "mxfp4"),
    # deepseek2: latent attention through q_lora, sigmoid gating with the selection bias and
    # expert groups, normalised and scaled weights, one leading dense layer, YaRN with the
    # deepseek2 mscale; and V2-Lite's form (q through attn_q, softmax, two shared experts).
    # No F16 row for the V3 form: llama.cpp rounds every activation it multiplies with F16
    # weights to F16, and on that file one such rounding flips an expert choice whose gap is
    # 0.8% (its logits then differ from the float64 reference by 12 at that position, while
    # the engine's differ by 3e-5), a change the F16-KV spread does not measure. Shapes of
    # 96/128 elements rule out the 256-element K-quant blocks: Q4_0 instead.
    ("deepseek2", "f32"),
    ("deepseek2", "q8_0"),
    ("deepseek2", "q4_0"),
    ("deepseek2-lite", "f32"),
    ("deepseek2-lite", "f16"),
    ("deepseek2-lite", "q8_0"),
]

# (architecture, llama-quantize file type): llama.cpp quantizes the arch's F32 model.
MIXES = [
    ("llama", "Q4_K_M"),
    ("llama", "Q4_K_S"),
    ("llama", "Q5_K_M"),
    ("llama", "Q3_K_M"),
    ("llama", "Q6_K"),
    ("llama", "Q8_0"),
    ("llama", "Q4_0"),
    ("llama", "Q2_K"),
    ("llama", "IQ4_XS"),
    ("llama", "Q4_1"),
    ("llama", "Q5_0"),
    ("llama", "Q5_1"),
    ("llama", "IQ4_NL"),
    ("mistral", "Q4_K_M"),
    ("qwen2", "Q4_K_M"),
    ("qwen2", "Q8_0"),
    ("gpt-oss", "Q8_0"),
    ("gpt-oss", "Q4_K_M"),
    ("gpt-oss", "MXFP4_MOE"),
]

# (architecture, mix): `sampan quantize` of the arch's F32 model, compared with llama.cpp's.
OURS = [
    ("llama", "Q4_K_M"),
    ("llama", "Q5_K_M"),
    ("llama", "Q6_K"),
    ("llama", "Q8_0"),
    ("llama", "Q4_0"),
    ("llama", "Q3_K_M"),
    ("llama", "Q2_K"),
    ("llama", "IQ4_XS"),
    ("mistral", "Q4_K_M"),
    ("qwen2", "Q4_K_M"),
    ("qwen2", "Q5_K_M"),
]

# Per-tensor type plans (`sampan quantize --dry-run`) against llama.cpp's files:
# (label, gguf_gen config, mixes). 12 layers exercise the more-bits layer pattern; rows of
# 320 and 400 the fallbacks (q4_k -> q5_0, q6_k -> q8_0, output -> q8_0, and f16 where no
# 32-block fits); the grouped-query shapes (4:1 and 2:1) the GQA rules.
PLAN_MIXES = ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
              "Q5_1", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q2_K", "IQ4_NL", "IQ4_XS", "F16", "BF16"]
GQA_MIXES = ["Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS"]
# the mixes whose types need 256-element rows (the others fit rows of 320 and 400 as they are)
FALLBACK_MIXES = ["Q4_K_M", "Q4_K_S", "Q5_K_S", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_XS"]
PLAN_SHAPES = [
    ("llama 12 layers", dict(preset="llama-256", n_layers=12), PLAN_MIXES),
    ("llama rows 320/400", dict(arch="llama", dim=320, n_layers=3, n_heads=5, n_kv_heads=1,
                                ff=400, vocab=512, tied=False), FALLBACK_MIXES),
    ("mistral", dict(preset="mistral-256"), GQA_MIXES),
    ("qwen2", dict(preset="qwen2-256"), GQA_MIXES),
]

N_TOKENS = 32
EMBD_SCALE = 4.0   # gguf_gen --embd-scale: logits with a std of about 4 across the vocabulary
K_MAX = 3.0        # tolerance = K_MAX x llama.cpp's own F16-vs-F32 KV spread (see above)
MAX_FLIPS_FRAC = 1 / 8

s = Suite("llamacpp")
exe = binary()
ok_lib, libdir = L.available()
ENGINE_TYPES = {t for _, t in MODELS}


def tokens_for(n_vocab, seed):
    rng = np.random.default_rng(seed)
    return [1] + [int(t) for t in rng.integers(3, n_vocab, N_TOKENS - 1)]


def engine_logits(path, toks, out):
    """(logits, None) or (None, the engine's error line)."""
    if os.path.exists(out):
        os.remove(out)
    rc, so, se = run([exe, "eval", "-m", path, "--tokens", ",".join(map(str, toks)), "-t", "1",
                      "--kv-type", "f32", "--logits-out", out], timeout=120)
    if rc != 0:
        lines = (se or so).strip().splitlines()
        return None, lines[-1] if lines else f"exit {rc}"
    a = np.fromfile(out, dtype="<f4")
    if a.size % len(toks):
        return None, f"logits file of {a.size} floats for {len(toks)} tokens"
    return a.reshape(len(toks), -1), None


def compare(name, path, toks, tmp):
    """Engine vs llama.cpp on one file; one case line. Returns the engine's error or None."""
    ref = L.logits(path, toks, kv_type="f32")
    ref16 = L.logits(path, toks, kv_type="f16")
    std = float(ref.std(axis=1).min())
    s.case(f"{name}: llama.cpp logits well spread", std >= 1.0,
           f"min std over positions {std:.2f} >= 1")
    got, err = engine_logits(path, toks, os.path.join(tmp, "eng.logits"))
    if got is None:
        return err
    if got.shape != ref.shape:
        s.case(f"{name}: engine vs llama.cpp", False, f"shape {got.shape} vs {ref.shape}")
        return None
    spread = float(np.abs(ref16 - ref).max())
    spread_rms = float(np.sqrt(np.mean((ref16 - ref) ** 2)))
    d = np.abs(got.astype(np.float64) - ref)
    dmax, drms = float(d.max()), float(np.sqrt(np.mean(d ** 2)))
    tol, tol_rms = K_MAX * spread, K_MAX * spread_rms
    top_r, top_e = ref.argmax(axis=1), got.argmax(axis=1)
    flips = [int(p) for p in np.nonzero(top_r != top_e)[0]]
    gaps = [float(ref[p, top_r[p]] - ref[p, top_e[p]]) for p in flips]
    near = all(g <= 2 * tol for g in gaps)
    ok = (spread > 0 and dmax <= tol and drms <= tol_rms and near and
          len(flips) <= max(1, int(N_TOKENS * MAX_FLIPS_FRAC)))
    flip_s = ", ".join(f"pos {p} gap {g:.3f}" for p, g in zip(flips, gaps)) or "none"
    s.case(f"{name}: engine matches llama.cpp", ok,
           f"max diff {dmax:.2e} <= {tol:.2e} (= {K_MAX:g} x F16-KV spread {spread:.2e}), rms "
           f"{drms:.2e} <= {tol_rms:.2e}; top-1 flips {len(flips)}/{len(toks)}: {flip_s}")
    return None


def model_cfg(arch, wtype, seed):
    # llama.cpp sets token attributes by a general.name containing "phi3", looking up an
    # <|endoftext|> token the synthetic vocabulary lacks: name phi3 models without it.
    label = "phi-three" if arch == "phi3" else arch
    return dict(preset=gguf_gen.ORACLE_SHAPES[arch], type=wtype, embd_scale=EMBD_SCALE, seed=seed,
                name=f"oracle-{label}-{wtype}")


REFUSAL = re.compile(r"tensor '([^']+)' has type (\w+)")


def check_refusal(name, path, err):
    """The engine refused `path`: the message must name a tensor of the file with its type,
    and that type must be one the engine is not shown to compute (MODELS)."""
    m = REFUSAL.search(err)
    types = L.tensor_types(path)
    if not m:
        s.case(f"{name}: engine refuses clearly", False, f"no tensor and type named: {err}")
        return
    tname, ttype = m.group(1), m.group(2)
    ok = types.get(tname) == ttype and ttype not in ENGINE_TYPES
    s.case(f"{name}: engine refuses clearly (type not computed yet)", ok,
           f"{err.strip()[:200]}; file has {tname} as {types.get(tname)}")


def part_models(tmp):
    for i, (arch, wtype) in enumerate(MODELS):
        name = f"{arch} {wtype}"
        path = os.path.join(tmp, f"{arch}-{wtype}.gguf")
        c = gguf_gen.generate(path, model_cfg(arch, wtype, 100 + i))
        err = compare(name, path, tokens_for(c["vocab"], i), tmp)
        if err is not None:
            s.case(f"{name}: engine runs it", False, err)
        os.remove(path)


def f32_model(tmp, arch):
    path = os.path.join(tmp, f"{arch}-f32-src.gguf")
    if not os.path.exists(path):
        # experts F32 too: llama.cpp's quantizer does not requantize gpt-oss's MXFP4 experts
        gguf_gen.generate(path, dict(model_cfg(arch, "f32", 7), expert_type="f32"))
    return path


def part_mixes(tmp):
    for i, (arch, mix) in enumerate(MIXES):
        name = f"{arch} llama.cpp {mix}"
        src = f32_model(tmp, arch)
        dst = os.path.join(tmp, f"{arch}-{mix}.gguf")
        try:
            L.quantize(src, dst, mix)
        except RuntimeError as e:
            s.case(f"{name}: llama.cpp quantizes", False, str(e)[:300])
            continue
        kinds = sorted(set(L.tensor_types(dst).values()))
        toks = tokens_for(gguf_gen.resolve(model_cfg(arch, "f32", 7))["vocab"], 50 + i)
        err = compare(f"{name} [{' '.join(kinds)}]", dst, toks, tmp)
        if err is not None:
            check_refusal(name, dst, err)
        os.remove(dst)


PLAN_LINE = re.compile(r"^\s*\[\s*\d+/\s*\d+\]\s+(\S+)\s+(\S+)\s+->\s+(\S+)")


def part_plans(tmp):
    for k, (label, cfg, mixes) in enumerate(PLAN_SHAPES):
        src = os.path.join(tmp, f"plan-{k}.gguf")
        gguf_gen.generate(src, dict(cfg, type="f32", seed=30 + k))
        for mix in mixes:
            name = f"{label} {mix}: sampan quantize's plan equals llama.cpp's types"
            rc, so, se = run([exe, "quantize", src, os.path.join(tmp, "never.gguf"), mix,
                              "--dry-run"], timeout=120)
            plan = {m.group(1): m.group(3) for m in map(PLAN_LINE.match, so.splitlines()) if m}
            if rc != 0 or not plan:
                s.case(name, False, (se or so).strip()[-300:])
                continue
            theirs = os.path.join(tmp, "plan-theirs.gguf")
            L.quantize(src, theirs, mix)
            b = L.tensor_types(theirs)
            os.remove(theirs)
            diff = [f"{t}: ours {plan.get(t)} llama.cpp {b.get(t)}"
                    for t in sorted(set(plan) | set(b)) if plan.get(t) != b.get(t)]
            s.case(name, not diff, "; ".join(diff[:6]) or
                   f"{len(b)} tensors, types {' '.join(sorted(set(b.values())))}")
        os.remove(src)


WRITE_REFUSAL = re.compile(r"puts tensor '([^']+)' in (\w+), which this build cannot write")


def part_ours(tmp):
    for i, (arch, mix) in enumerate(OURS):
        name = f"{arch} sampan quantize {mix}"
        src = f32_model(tmp, arch)
        ours = os.path.join(tmp, f"{arch}-{mix}-ours.gguf")
        theirs = os.path.join(tmp, f"{arch}-{mix}-theirs.gguf")
        rc, so, se = run([exe, "quantize", src, ours, mix, "--threads", "1", "--no-progress"],
                         timeout=300)
        if rc != 0:
            m = WRITE_REFUSAL.search(se)
            if m and m.group(2) not in ENGINE_TYPES:
                # the plan is checked by part_plans; writing waits for the quantizer
                s.skip(f"{name}: writes the file", f"waits for a {m.group(2)} quantizer: "
                       f"{se.strip()[-200:]}")
            else:
                s.case(f"{name}: writes the file", False, (se or so).strip()[-300:])
            continue
        L.quantize(src, theirs, mix)
        a, b = L.tensor_types(ours), L.tensor_types(theirs)
        diff = [f"{k}: ours {a.get(k)} llama.cpp {b.get(k)}" for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)]
        s.case(f"{name}: per-tensor types equal llama.cpp's", not diff,
               "; ".join(diff[:6]) or f"{len(a)} tensors, types {sorted(set(a.values()))}")
        toks = tokens_for(gguf_gen.resolve(model_cfg(arch, "f32", 7))["vocab"], 80 + i)
        err = compare(f"{name} (our file)", ours, toks, tmp)
        if err is not None:
            s.case(f"{name}: engine runs our file", False, err)
        for p in (ours, theirs):
            os.remove(p)


def main():
    if exe is None:
        s.skip("llama.cpp oracle", "build/sampan not built")
        s.finish()
    if not ok_lib:
        s.skip("llama.cpp oracle", libdir)
        s.finish()
    print(f"llama.cpp from {libdir}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        s.guard("models", part_models, tmp)
        s.guard("llama.cpp mixes", part_mixes, tmp)
        s.guard("sampan quantize plans", part_plans, tmp)
        s.guard("sampan quantize mixes", part_ours, tmp)
    s.finish()


if __name__ == "__main__":
    main()
