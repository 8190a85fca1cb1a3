#!/usr/bin/python3
"""test_quant_types.py - the 32-element block types Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 end to end.

Part 1 (always runs): tools/gguf_gen.py's quantizers round-trip through the reference's
dequantizers (tests/ref/quants.py, written separately from the layouts) within each format's
per-element error, derived from its rule (block amax A, block range R = max - min):
  q4_1 / q5_1: q = round((x - min) / d), d = R / 15 (31): |err| <= d / 2, plus the half
               rounding of d and min (2^-11 of 15 d + |min|) -> R / 30 + 2^-10 A (R / 62 ...);
  q5_0:        d = A / 16, |err| <= d / 2 except the cap q - 16 <= 15 at x = -max: <= d,
               plus 16 d 2^-11 -> A / 16 (1 + 2^-7);
  iq4_nl:      the nearest of 16 grid points (-127 .. 113) at scale A / 127: half the widest
               gap (24 units) or, for elements of the other sign than the largest one, the
               clip at 113 (up to 14 units) -> 14 A / 127, plus the half rounding of the scale
               (2^-11 of 127 units);
  mxfp4:       A < 16 units of the half scale 2^(e - 128); the widest gap (8 -> 12 units) and
               the clip above 12 units both keep |err| < 4 units / 2 ... < A / 4.
Part 2 (needs build/sampan): `sampan quantize` of an F32 model to each type writes what ggml's
rules give: the same bytes as gguf_gen's NumPy version of the rule for q4_1, q5_0, q5_1 (both
do the same float32 operations), the same exponents and nearest-point quants for mxfp4, and for
iq4_nl quants that are the nearest grid points for the stored scale (up to the scale's half
rounding: 254 |d| 2^-11). Where llama.cpp's libraries are present (tests/py/llamacpp_ref.py), llama.cpp's own quantizer
(llama_model_quantize, what llama-quantize writes) turns the same F32 model into its Q4_1, Q5_0,
Q5_1 and IQ4_NL files, and every block of every tensor that both files store in that type
must be byte-identical to ours; and ggml's quantizer entry point (ggml_quantize_chunk) on the
same float rows must give our bytes for all five types (MXFP4 included: llama.cpp has no MXFP4
file type outside mixture-of-experts models).
Then random-weight models of each type run through `sampan eval`
(prefill and decode, 1 and 2 threads, the lower CPU levels) against the reference with activation
quantization emulated; the tolerance is test_reference.py's: 3 eps sqrt(4 L + 1), eps the
measured relative rms noise of the activation quantization (Q8_0 rules for Q5_0 / IQ4_NL /
MXFP4, Q8_1 for Q4_1 / Q5_1: the same quants and scale). Decode must equal prefill bit for bit
and 2 threads must equal 1 (batch invariance).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from common import ROOT, Suite, binary, run

import gguf_gen
from gguf_read import GGUF
from quants import IQ4_NL_GRID, TYPE_NUM, dequantize
from ref_forward import RefModel

import llamacpp_ref as L

TYPES = ("q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4")
CPU_LEVELS = ("scalar", "avx2")
N_TOKENS = 16
SHAPE = dict(arch="llama", dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ff=224, vocab=320,
             tied=False, seed=31)


def err(a, b):
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())


def elem_bound(t, blocks):
    """Per-element bound of |dequant(quant(x)) - x| for (nb, 32) float64 blocks (docstring)."""
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    rng = blocks.max(axis=1, keepdims=True) - blocks.min(axis=1, keepdims=True)
    mn = np.abs(blocks.min(axis=1, keepdims=True))
    if t == "q4_1":
        return rng / 30 * (1 + 1e-5) + (rng + mn) * 2 ** -11
    if t == "q5_1":
        return rng / 62 * (1 + 1e-5) + (rng + mn) * 2 ** -11
    if t == "q5_0":
        return amax / 16 * (1 + 2 ** -7 + 1e-5)
    if t == "iq4_nl":
        return amax / 127 * (14 + 127 * 2 ** -10)
    return amax / 4 * (1 + 1e-6)


def check_gen_roundtrip(s):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 512)) * 0.05).astype(np.float32)
    x[1, 64:96] += 0.03                      # an offset block (the min / max types)
    x[2, :32] = 0.0                          # a zero block
    x[3, 40] = 3.0                           # an outlier
    for t in TYPES:
        raw = gguf_gen.encode(x, t)
        y = dequantize(raw, TYPE_NUM[t], x.size).reshape(x.shape)
        b = x.astype(np.float64).reshape(-1, 32)
        e = np.abs(y.reshape(-1, 32) - b)
        bound = elem_bound(t, b)
        worst = float((e / np.maximum(bound, 1e-300)).max())
        ok = worst <= 1.0 and np.all(y[2, :32] == 0) and \
            len(raw) == x.shape[0] * gguf_gen.row_bytes(t, x.shape[1])
        s.case(f"gen {t} round trip through the reference dequantizer", bool(ok),
               f"worst error / bound {worst:.3f}")


def check_quantize_tool(s, exe, tmp):
    src = os.path.join(tmp, "f32.gguf")
    gguf_gen.generate(src, dict(SHAPE, type="f32"))
    gs = GGUF(src)
    name = "blk.0.ffn_up.weight"
    x = gs.array(name, np.float32).astype(np.float32)
    for t in TYPES:
        dst = os.path.join(tmp, f"quantized-{t}.gguf")
        rc, out, errs = run([exe, "quantize", src, dst, t, "--threads", "2"], timeout=120)
        if rc != 0:
            s.case(f"sampan quantize {t}", False, (errs or out).strip().splitlines()[-1:])
            continue
        g = GGUF(dst)
        tt = g.tensors[name].type
        raw = g.raw(g.tensors[name])
        mine = gguf_gen.encode(x, t)
        y = dequantize(raw, tt, x.size).reshape(-1, 32)
        b = x.astype(np.float64).reshape(-1, 32)
        if t in ("q4_1", "q5_0", "q5_1"):
            ok = tt == TYPE_NUM[t] and bytes(raw) == mine
            detail = "bytes equal gguf_gen's NumPy rule" if ok else "bytes differ"
        elif t == "mxfp4":
            e = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 17)[:, 0]
            e_mine = np.frombuffer(mine, dtype=np.uint8).reshape(-1, 17)[:, 0]
            half = np.ldexp(1.0, e.astype(np.int32) - 128)[:, None]
            grid = np.array([0, 1, 2, 3, 4, 6, 8, 12, -1, -2, -3, -4, -6, -8, -12], np.float64)
            best = np.abs(b[:, :, None] - half[:, :, None] * grid).min(axis=2)
            ok = tt == TYPE_NUM[t] and np.array_equal(e, e_mine) and \
                np.all(np.abs(y - b) <= best + np.abs(b) * 2 ** -23)
            detail = "exponents equal, quants nearest"
        else:
            d = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 18)[:, :2].copy().view("<f2")
            d = d.astype(np.float64)
            best = np.abs(b[:, :, None] - d[:, :, None] * IQ4_NL_GRID).min(axis=2)
            slack = 254 * np.abs(d) * 2 ** -11 * (1 + 2 ** -10) + 1e-6 * np.abs(b)
            ok = tt == TYPE_NUM[t] and np.all(np.abs(y - b) <= best + slack)
            detail = "quants nearest for the stored scale"
        ok &= g.kv.get("general.file_type") == gguf_gen.FILE_TYPE[t]
        s.case(f"sampan quantize {t}: ggml's rule", bool(ok), detail)


LLAMACPP_MIX = {"q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1", "iq4_nl": "IQ4_NL"}

# ggml's own quantizer entry point (libggml-base.so, ggml.h: ggml_quantize_chunk), run in a
# child process like every llama.cpp call of llamacpp_ref.py (an abort there fails one case).
_GGML_QUANTIZE = r"""
import ctypes, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1] + "/libggml-base.so")
f = lib.ggml_quantize_chunk
f.restype = ctypes.c_size_t
f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
              ctypes.c_int64, ctypes.c_void_p]
x = np.ascontiguousarray(np.load(sys.argv[3]), dtype=np.float32)
out = np.zeros(int(sys.argv[4]), dtype=np.uint8)
n = f(int(sys.argv[2]), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
if n != out.size:
    sys.exit(f"ggml_quantize_chunk wrote {n} bytes, expected {out.size}")
out.tofile(sys.argv[5])
"""


def ggml_quantize(libdir, t, x, tmp):
    """ggml's bytes for the (rows, n) float32 matrix x in type t."""
    src, dst = os.path.join(tmp, "ggml-in.npy"), os.path.join(tmp, "ggml-out.bin")
    np.save(src, x)
    size = x.shape[0] * gguf_gen.row_bytes(t, x.shape[1])
    r = subprocess.run([sys.executable, "-c", _GGML_QUANTIZE, libdir, str(TYPE_NUM[t]), src,
                        str(size), dst], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"ggml_quantize_chunk({t}): {(r.stderr or r.stdout).strip()[-300:]}")
    return np.fromfile(dst, dtype=np.uint8)


def check_vs_llamacpp_quantizer(s, exe, tmp):
    ok_lib, libdir = L.available()  # libdir: the reason when not ok
    if not ok_lib:
        s.skip("sampan quantize vs llama.cpp's quantizer", libdir)
        return
    src = os.path.join(tmp, "f32-oracle.gguf")
    gguf_gen.generate(src, dict(preset=gguf_gen.ORACLE_SHAPES["llama"], type="f32", seed=3))
    for t, mix in LLAMACPP_MIX.items():
        theirs = os.path.join(tmp, f"theirs-{t}.gguf")
        ours = os.path.join(tmp, f"ours-{t}.gguf")
        L.quantize(src, theirs, mix)
        rc, out, errs = run([exe, "quantize", src, ours, t, "--threads", "2"], timeout=120)
        if rc != 0:
            s.case(f"sampan quantize {t} == llama.cpp {mix}", False, (errs or out)[-200:])
            continue
        a, b = GGUF(theirs), GGUF(ours)
        size = gguf_gen.TYPES[t][2]
        total = same = 0
        for name, ta in a.tensors.items():
            tb = b.tensors.get(name)
            if tb is None or ta.type != TYPE_NUM[t] or tb.type != ta.type:
                continue
            ra = np.frombuffer(a.raw(ta), dtype=np.uint8).reshape(-1, size)
            rb = np.frombuffer(b.raw(tb), dtype=np.uint8).reshape(-1, size)
            total += ra.shape[0]
            same += int(np.all(ra == rb, axis=1).sum())
        s.case(f"sampan quantize {t} == llama.cpp {mix} byte for byte", total > 0 and
               same == total, f"{same}/{total} blocks identical")
    # every type (MXFP4 included) against ggml_quantize_chunk on the same float rows
    g32 = GGUF(src)
    for t in TYPES:
        ours = os.path.join(tmp, f"ours-{t}.gguf")
        if not os.path.exists(ours):
            rc, out, errs = run([exe, "quantize", src, ours, t, "--threads", "2"], timeout=120)
            if rc != 0:
                s.case(f"sampan quantize {t} == ggml_quantize_chunk", False, (errs or out)[-200:])
                continue
        b = GGUF(ours)
        size = gguf_gen.TYPES[t][2]
        total = same = 0
        for name, tb in b.tensors.items():
            if tb.type != TYPE_NUM[t]:
                continue
            x = g32.array(name, np.float32).astype(np.float32)
            theirs = ggml_quantize(libdir, t, x, tmp).reshape(-1, size)
            mine = np.frombuffer(b.raw(tb), dtype=np.uint8).reshape(-1, size)
            total += mine.shape[0]
            same += int(np.all(mine == theirs, axis=1).sum())
        s.case(f"sampan quantize {t} == ggml_quantize_chunk byte for byte", total > 0 and
               same == total, f"{same}/{total} blocks identical")


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
        raise RuntimeError(f"`sampan eval` exit {rc}: {tail[0]}")
    a = np.fromfile(out, dtype="<f4")
    return a.reshape(len(toks), n_vocab).astype(np.float64)


def check_engine(s, exe, tmp, t):
    path = os.path.join(tmp, f"model-{t}.gguf")
    c = gguf_gen.generate(path, dict(SHAPE, type=t))
    g = GGUF(path)
    if g.tensors["blk.0.attn_q.weight"].type != TYPE_NUM[t]:
        raise RuntimeError("the generator did not write the type")
    rng = np.random.default_rng(c["seed"])
    toks = [1] + [int(v) for v in rng.integers(3, c["vocab"], N_TOKENS - 1)]
    plain = RefModel(path).session().forward(toks)
    em = RefModel(path, act_quant=True)
    emul = em.session().forward(toks)
    eps = float(np.sqrt(np.mean(em.act_err2)))
    tol = 3 * eps * np.sqrt(4 * c["n_layers"] + 1)
    out = os.path.join(tmp, f"{t}.logits")
    runs = {}
    for decode in (False, True):
        for th in (1, 2):
            runs[decode, th] = engine_logits(exe, path, toks, decode, th, out, c["vocab"])
    pre = runs[False, 1]
    e1, e2 = err(pre, plain), err(pre, emul)
    s.case(f"{t} prefill vs reference", e1 <= tol and e2 <= tol,
           f"err {e1:.2e} (emulating: {e2:.2e}, {'tight' if e2 <= 1e-4 else 'cascaded'}) "
           f"<= tol {tol:.2e}, eps {eps:.4f}")
    for cpu in CPU_LEVELS:
        lv = engine_logits(exe, path, toks, False, 2, out, c["vocab"], cpu)
        e = err(lv, emul)
        s.case(f"{t} prefill SAMPAN_CPU={cpu} vs emulating reference", e <= tol,
               f"err {e:.2e} <= {tol:.1e}")
    s.case(f"{t} decode vs prefill bit-identical", bool(np.array_equal(runs[True, 1], pre)))
    same = all(np.array_equal(runs[d, 1], runs[d, 2]) for d in (False, True))
    s.case(f"{t} threads 1 vs 2 bit-identical", same)


def main():
    s = Suite("quant_types")
    with tempfile.TemporaryDirectory(prefix="sampan-qt-") as tmp:
        s.guard("gen round trip", check_gen_roundtrip, s)
        exe = binary()
        if exe is None:
            s.skip("quant types vs engine", "build/sampan not built (make)")
        else:
            s.guard("sampan quantize", check_quantize_tool, s, exe, tmp)
            s.guard("sampan quantize vs llama.cpp", check_vs_llamacpp_quantizer, s, exe, tmp)
            for t in TYPES:
                s.guard(f"{t} vs engine", check_engine, s, exe, tmp, t)
    s.finish()


if __name__ == "__main__":
    main()
