#!/usr/bin/env python3
"""spec_target.py - a larger model "shaped" to agree with the demo model, for benchmarking
speculative decoding with the demo model as the draft (BENCHMARKS.md, "Speculative decoding").

    tools/spec_target.py models/stories260K.gguf OUT.gguf --extra-layers 120 --scale 0.05

OUT has the demo model's vocabulary, embeddings, output head and its five layers unchanged,
followed by --extra-layers random layers of the same shape (tools/gguf_gen.py's init) whose
output projections (attn_output, ffn_down) are multiplied by --scale: each adds a small
perturbation to the residual stream, so OUT costs about (5 + extra) / 5 times the demo model
per token and its greedy choices mostly, not always, match the demo model's (the draft's
acceptance rate falls as --scale grows). No trained larger model shares the demo model's
512-token vocabulary; this one stands in for it, honestly labelled.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import gguf_gen  # noqa: E402
from gguf_read import GGUF  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--extra-layers", type=int, default=120)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    base = GGUF(a.base)
    kv = base.kv
    arch = kv["general.architecture"]
    n_base = int(kv[f"{arch}.block_count"])
    dim = int(kv[f"{arch}.embedding_length"])
    n_heads = int(kv[f"{arch}.attention.head_count"])
    cfg = dict(arch=arch, name="spec-target", dim=dim, n_layers=n_base + a.extra_layers,
               n_heads=n_heads, n_kv_heads=int(kv[f"{arch}.attention.head_count_kv"]),
               head_dim=dim // n_heads, ff=int(kv[f"{arch}.feed_forward_length"]),
               ctx=int(kv[f"{arch}.context_length"]), eps=float(kv[f"{arch}.attention.layer_norm_rms_epsilon"]),
               rope_base=float(kv[f"{arch}.rope.freq_base"]), tied="output.weight" not in base.tensors,
               type="f32", embd_type="f32", output_type="f32", vocab_from=a.base, seed=a.seed)
    gguf_gen.generate(a.out, cfg)
    out = GGUF(a.out)
    with open(a.out, "r+b") as f:
        def put(name, arr):
            t = out.tensors[name]
            data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
            assert len(data) == t.nbytes, name
            f.seek(out.data_offset + t.offset)
            f.write(data)
        for name, t in base.tensors.items():  # the demo model's own tensors, unchanged
            assert t.type == 0, f"{name}: only F32 bases are supported"
            put(name, np.frombuffer(base.buf, np.float32, t.nbytes // 4, base.data_offset + t.offset))
        for i in range(n_base, n_base + a.extra_layers):
            for w in ("attn_output", "ffn_down"):
                name = f"blk.{i}.{w}.weight"
                t = out.tensors[name]
                x = np.frombuffer(out.buf, np.float32, t.nbytes // 4, out.data_offset + t.offset)
                put(name, x * np.float32(a.scale))
    print(f"{a.out}: {n_base} layers of {a.base} + {a.extra_layers} scaled by {a.scale}")


if __name__ == "__main__":
    main()
