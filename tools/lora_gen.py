#!/usr/bin/python3
"""lora_gen.py - write a random LoRA adapter for a GGUF model (llama.cpp's adapter convention).

Used by the LoRA tests (tests/unit/test_lora.c, tests/py/test_lora.py) and the adapter
benchmark. NumPy only (Debian's python3-numpy).

    tools/lora_gen.py BASE.gguf OUT.gguf [--rank 8] [--alpha F] [--targets q,k,v,o,gate,up,down]
        [--layers all|0,2,...] [--type f32|f16|bf16|q8_0] [--strength 1.0] [--seed N]
        [--merge MERGED.gguf] [--corrupt KIND]

The file: general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (default the
rank, so scale = alpha / rank = 1), general.architecture copied from the base; for each
target projection W (n_out rows of n_in) of each chosen layer the tensors
    blk.N.<proj>.weight.lora_a   ne = [n_in, rank]   A: rank rows of n_in
    blk.N.<proj>.weight.lora_b   ne = [rank, n_out]  B: n_out rows of rank
so that W' = W + (alpha / rank) * B @ A. A is normal(0, 1/sqrt(n_in)) and B is
normal(0, strength/sqrt(rank)), so with scale 1 the correction B A x is about `strength`
times as large as a unit projection of x: large enough to change a model's answers.
Each tensor has its own generator seeded by (seed, crc32(name)).

--merge writes the base model with every corrected weight replaced by W + scale * B A in
F32 (computed in float64 from the values stored in the adapter), the other tensors and
all metadata copied: a plain model that must answer like base + adapter.

--corrupt writes a bad adapter for the validation tests: shape (lora_a with the wrong
n_in), rank (lora_b's rank different from lora_a's), missing-b (a lora_a without its
lora_b), name (a tensor that is no projection), nan (a NaN in a lora_b), type (a q4_0
tensor), not-adapter (general.type = "model"), arch (general.architecture = "qwen2"),
layer (a layer the base does not have).
"""
import argparse
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "ref"))

from gguf_gen import (ALIGNMENT, T_FLOAT32, T_STRING, T_UINT32, TYPES, _skip_value,  # noqa: E402
                      encode, gguf_header, kv_bytes, row_bytes)
from gguf_read import GGUF  # noqa: E402

PROJ = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
        "up": "ffn_up", "down": "ffn_down"}
CORRUPT = ["shape", "rank", "missing-b", "name", "nan", "type", "not-adapter", "arch", "layer"]


def write_gguf(path, kvs, tensors):
    """kvs: raw records; tensors: [(name, ne, type name, raw bytes)]."""
    offs, off = [], 0
    for _, _, _, raw in tensors:
        off = (off + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        offs.append(off)
        off += len(raw)
    head = gguf_header(kvs, tensors, offs)
    with open(path, "wb") as f:
        f.write(head)
        for (_, _, _, raw), o in zip(tensors, offs):
            f.write(b"\0" * (len(head) + o - f.tell()))
            f.write(raw)


def raw_kvs(path):
    """Every raw key/value record of a GGUF file, as (key, bytes)."""
    with open(path, "rb") as f:
        buf = f.read()
    _, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, recs = 24, []
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + klen].decode("utf-8")
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos = _skip_value(buf, pos + 4, vtype)
        recs.append((key, buf[start:pos]))
    return recs


def round_trip(x, tname):
    """The values a reader gets back after storing x (rows, n) as tname."""
    if tname == "f32":
        return x.astype(np.float32).astype(np.float64)
    from quants import TYPE_INFO, dequantize  # tests/ref
    code = TYPES[tname][0]
    assert code in TYPE_INFO
    return dequantize(memoryview(encode(x, tname)), code, x.size).reshape(x.shape)


def make(base_path, out, rank=8, alpha=None, targets="q,k,v,o,gate,up,down", layers="all",
         ttype="f32", strength=1.0, seed=1, merge=None, corrupt=None):
    """Write the adapter (and the merged model); returns {weight name: scale * B @ A}."""
    g = GGUF(base_path)
    arch = g.kv["general.architecture"]
    n_layer = int(g.kv[f"{arch}.block_count"])
    alpha = float(rank if alpha is None else alpha)
    chosen = range(n_layer) if layers == "all" else [int(v) for v in layers.split(",")]
    kvs = [
        kv_bytes("general.architecture", T_STRING, "qwen2" if corrupt == "arch" else arch),
        kv_bytes("general.type", T_STRING, "model" if corrupt == "not-adapter" else "adapter"),
        kv_bytes("general.alignment", T_UINT32, ALIGNMENT),
        kv_bytes("adapter.type", T_STRING, "lora"),
        kv_bytes("adapter.lora.alpha", T_FLOAT32, alpha),
    ]
    tensors, deltas = [], {}
    for il in chosen:
        for key in targets.split(","):
            wname = f"blk.{il}.{PROJ[key]}.weight"
            n_in, n_out = g.tensors[wname].ne[:2]  # no need to read the weights
            rng_a = np.random.default_rng([seed, zlib.crc32((wname + ".lora_a").encode())])
            rng_b = np.random.default_rng([seed, zlib.crc32((wname + ".lora_b").encode())])
            a = rng_a.standard_normal((rank, n_in)) / np.sqrt(n_in)
            b = rng_b.standard_normal((n_out, rank)) * strength / np.sqrt(rank)
            a, b = round_trip(a, ttype), round_trip(b, ttype)
            deltas[wname] = (alpha / rank) * (b @ a)
            a_ne, b_ne = [n_in, rank], [rank, n_out]
            ta = tb = ttype
            raw_a, raw_b = encode(a, ttype), encode(b, ttype)
            if not tensors and corrupt == "shape":
                a_ne = [n_in + 1, rank]
                raw_a = encode(np.zeros((rank, n_in + 1)), "f32")
                ta = "f32"
            if not tensors and corrupt == "rank":
                b_ne = [rank + 1, n_out]
                raw_b = encode(np.zeros((n_out, rank + 1)), "f32")
                tb = "f32"
            if not tensors and corrupt == "nan":
                bb = b.copy()
                bb[0, 0] = np.nan
                raw_b, tb = encode(bb, "f32"), "f32"
            if not tensors and corrupt == "type":
                raw_b = encode(np.zeros((n_out, 32)), "q4_0")
                b_ne, tb = [32, n_out], "q4_0"
            tensors.append((wname + ".lora_a", a_ne, ta, raw_a))
            if not (corrupt == "missing-b" and len(tensors) == 1):
                tensors.append((wname + ".lora_b", b_ne, tb, raw_b))
    if corrupt == "name":
        tensors.append(("output.weight.lora_a", [4, 4], "f32", encode(np.zeros((4, 4)), "f32")))
    if corrupt == "layer":
        tensors.append((f"blk.{n_layer}.attn_q.weight.lora_a", [4, 4], "f32",
                        encode(np.zeros((4, 4)), "f32")))
    write_gguf(out, kvs, tensors)
    if merge:
        merged = []
        for name, t in g.tensors.items():
            ne = list(t.ne)
            if name in deltas:
                w = g.array(name) + deltas[name]
                merged.append((name, ne, "f32", encode(w, "f32")))
            else:
                tname = {v[0]: k for k, v in TYPES.items()}[t.type]
                merged.append((name, ne, tname, bytes(g.raw(t))))
        write_gguf(merge, [raw for key, raw in raw_kvs(base_path) if key != "general.alignment"]
                   + [kv_bytes("general.alignment", T_UINT32, ALIGNMENT)], merged)
    g.close()
    return deltas


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random LoRA adapter (GGUF) for a model.")
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, help="default: the rank (scale 1)")
    ap.add_argument("--targets", default="q,k,v,o,gate,up,down")
    ap.add_argument("--layers", default="all")
    ap.add_argument("--type", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--strength", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--merge", help="also write the base with the adapter merged (F32)")
    ap.add_argument("--corrupt", choices=CORRUPT)
    a = ap.parse_args(argv)
    for k in a.targets.split(","):
        if k not in PROJ:
            ap.error(f"unknown target {k!r} (q, k, v, o, gate, up, down)")
    if a.type == "q8_0":
        row_bytes("q8_0", a.rank)  # lora_b rows are `rank` long: must be a multiple of 32
    make(a.base, a.out, a.rank, a.alpha, a.targets, a.layers, a.type, a.strength, a.seed, a.merge,
         a.corrupt)


if __name__ == "__main__":
    main()
