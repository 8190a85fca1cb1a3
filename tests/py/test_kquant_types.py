#!/usr/bin/python3
"""test_kquant_types.py - the 256-element super-block types Q2_K, Q3_K, Q5_K and IQ4_XS end to end.

Part 1 (always runs): tools/gguf_gen.py's quantizers for these types round-trip through the
reference's dequantizers (tests/ref/quants.py, written separately from the block layouts) within
the format's error, a zero block stays zero and an outlier survives. Bounds, per element relative
to the largest magnitude (amax) of its sub-block, from the format:
  - Q5_K: 31 steps over [min(lo, 0), hi] (a range of at most 2 amax): |err| <= amax / 31, plus the
    rounding of the 6-bit sub-block scale (a small sub-block's scale may be off by half a unit of
    63): bound 2 / 31; RMS about range / 31 / sqrt(12), bound 0.06.
  - Q3_K: levels -4..3 with the largest element at -4: the far side reaches only 3/4 amax (error
    up to amax / 4), elsewhere step / 2 = amax / 8; plus 6-bit scale rounding: bound 0.3, RMS 0.2.
  - IQ4_XS: levels -127..113 (gaps of at most 24) with the largest at -127: error up to 14 / 127
    at the far end, 12 / 127 between levels; plus scale rounding: bound 0.15, RMS 0.12.
  - Q2_K: 3 steps over the range (at most 2 amax): |err| <= amax / 3; plus 4-bit scale rounding:
    bound 0.4, RMS 0.4.
Part 2 (needs build/sampan): random-weight models with these types (and a mix of them, as
Q3_K_M / Q4_K_M files mix types) through `sampan eval` against tests/ref/ref_forward.py, with the
tolerance derivation of test_reference.py (the engine quantizes activations to Q8_K for all of
them; the reference emulates that with act_quant=True), at every CPU level, with prefill/decode
and thread-count bit-identity.
"""
import os
import tempfile

import numpy as np

from common import Suite, binary

import gguf_gen
from quants import TYPE_NUM, dequantize
from test_reference import QSHAPE, check_engine_model

# type: (RMS bound, max |err| / sub-block amax bound, sub-block length); see the docstring
ROUNDTRIP = {
    "q5_k": (0.06, 2 / 31, 32),
    "q3_k": (0.2, 0.3, 16),
    "iq4_xs": (0.12, 0.15, 32),
    "q2_k": (0.4, 0.4, 16),
}


def check_roundtrip(s):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((8, 512)) * 0.05).astype(np.float32)
    x[0, :256] = np.abs(x[0, :256])        # one all-positive super-block (min = 0)
    x[1, 256:] = -np.abs(x[1, 256:])       # one all-negative super-block
    sp = x[:2].copy()                       # special rows, checked apart from the bounds
    sp[0, :32] = 0.0                        # a zero sub-block
    sp[1, 40] = 3.0                         # an outlier (largest of its super-block)
    for t, (rms_b, max_b, blk) in ROUNDTRIP.items():
        raw = gguf_gen.encode(x, t)
        y = dequantize(raw, TYPE_NUM[t], x.size).reshape(x.shape)
        d = np.abs(y - x)
        rms = float(np.sqrt((d ** 2).mean() / (x.astype(np.float64) ** 2).mean()))
        bm = np.abs(x).reshape(-1, blk).max(axis=1, keepdims=True)
        worst = float((d.reshape(-1, blk) / np.maximum(bm, 1e-30)).max())
        ysp = dequantize(gguf_gen.encode(sp, t), TYPE_NUM[t], sp.size).reshape(sp.shape)
        # the outlier sits at the end level of its scales: within the step of the 6-bit (4-bit
        # for Q2_K) scale rounding, 3 %
        special = bool(np.all(ysp[0, :32] == 0) and abs(ysp[1, 40] - 3.0) < 0.03 * 3.0)
        ok = rms <= rms_b and worst <= max_b and special and \
            len(raw) == x.shape[0] * gguf_gen.row_bytes(t, x.shape[1])
        s.case(f"gen {t} round trip through the reference dequantizer", ok,
               f"rms {rms:.2e} <= {rms_b:.2e}, max/block-amax {worst:.2e} <= {max_b:.2e}, "
               f"zero block and outlier {'ok' if special else 'WRONG'}")


def models():
    out = [(f"w256-{t}", dict(QSHAPE, type=t), t) for t in ("q5_k", "q3_k", "iq4_xs", "q2_k")]
    # mixed files, as llama-quantize writes them: Q3_K matrices with a Q5_K output and an IQ4_XS
    # embedding; Q5_K with Q2_K output and Q3_K embedding (qwen2 with bias)
    out.append(("w256-q3_k-embd-iq4_xs-out-q5_k",
                dict(QSHAPE, type="q3_k", embd_type="iq4_xs", output_type="q5_k", seed=23),
                "q3_k"))
    out.append(("w256-qwen2-q5_k-embd-q3_k-out-q2_k",
                dict(QSHAPE, arch="qwen2", qkv_bias=True, type="q5_k", embd_type="q3_k",
                     output_type="q2_k", seed=24), "q5_k"))
    return out


def main():
    s = Suite("kquant_types")
    with tempfile.TemporaryDirectory(prefix="sampan-kqt-") as tmp:
        s.guard("gen round trip", check_roundtrip, s)
        exe = binary()
        for name, cfg, wtype in models():
            if exe is None:
                s.skip(f"{name} vs engine", "build/sampan not built (make)")
                continue
            s.guard(f"{name} vs engine", check_engine_model, s, exe, tmp, name, cfg, wtype)
    s.finish()


if __name__ == "__main__":
    main()
