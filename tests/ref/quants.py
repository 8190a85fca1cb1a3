"""quants.py - dequantizers for the eleven tensor types, and emulation of the activation
quantization the engine applies before quantized dot products.

Written from the block layouts (src/kernels/kernels.h, the GGUF/ggml format
definitions), independently of the C kernels and of tools/gguf_gen.py's quantizers.
Every function is vectorised over blocks.
"""
import numpy as np

# ggml type number -> (name, elements per block, bytes per block)
TYPE_INFO = {
    0: ("f32", 1, 4),
    1: ("f16", 1, 2),
    2: ("q4_0", 32, 18),
    8: ("q8_0", 32, 34),
    10: ("q2_k", 256, 84),
    11: ("q3_k", 256, 110),
    12: ("q4_k", 256, 144),
    13: ("q5_k", 256, 176),
    14: ("q6_k", 256, 210),
    23: ("iq4_xs", 256, 136),
    30: ("bf16", 1, 2),
}
TYPE_NUM = {v[0]: k for k, v in TYPE_INFO.items()}

_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])
_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
_Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])
assert (_Q8_0.itemsize, _Q4_0.itemsize, _Q4_K.itemsize, _Q6_K.itemsize) == (34, 18, 144, 210)
_Q2_K = np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")])
_Q3_K = np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")])
_Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32),
                  ("qs", "u1", 128)])
_IQ4_XS = np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)])
assert (_Q2_K.itemsize, _Q3_K.itemsize, _Q5_K.itemsize, _IQ4_XS.itemsize) == (84, 110, 176, 136)
# IQ4_NL / IQ4_XS levels (ggml's kvalues_iq4nl)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.int32)


def _f64(a):
    return a.astype(np.float64)


def deq_q8_0(buf, n):
    b = np.frombuffer(buf, dtype=_Q8_0, count=n // 32)
    return (_f64(b["d"])[:, None] * b["qs"]).reshape(-1)


def deq_q4_0(buf, n):
    b = np.frombuffer(buf, dtype=_Q4_0, count=n // 32)
    qs = b["qs"]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32) - 8  # j, then j + 16
    return (_f64(b["d"])[:, None] * q).reshape(-1)


def q4_k_scales(s):
    """(nb, 12) packed bytes -> (sc, m), each (nb, 8) in 0..63."""
    s = s.astype(np.int32)
    sc = np.empty((s.shape[0], 8), dtype=np.int32)
    m = np.empty_like(sc)
    sc[:, :4] = s[:, 0:4] & 63
    m[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    m[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, m


def deq_q4_k(buf, n):
    b = np.frombuffer(buf, dtype=_Q4_K, count=n // 256)
    nb = b.shape[0]
    sc, m = q4_k_scales(b["scales"])
    qs = b["qs"].reshape(nb, 4, 32)
    # each 32-byte group holds 64 values: low nibbles first (sub-block 2j), then high (2j+1)
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float64)
    d = _f64(b["d"])[:, None] * sc
    dm = _f64(b["dmin"])[:, None] * m
    return (d[:, :, None] * q - dm[:, :, None]).reshape(-1)


def deq_q6_k(buf, n):
    b = np.frombuffer(buf, dtype=_Q6_K, count=n // 256)
    nb = b.shape[0]
    ql = b["ql"].reshape(nb, 2, 64).astype(np.int32)
    qh = b["qh"].reshape(nb, 2, 32).astype(np.int32)
    lo, hi = ql[:, :, :32], ql[:, :, 32:]
    # per 128-value half: four runs of 32 (k = 0..3); low 4 bits from ql, top 2 from qh bits 2k
    q = np.stack([
        (lo & 0xF) | ((qh & 3) << 4),
        (hi & 0xF) | (((qh >> 2) & 3) << 4),
        (lo >> 4) | (((qh >> 4) & 3) << 4),
        (hi >> 4) | (((qh >> 6) & 3) << 4),
    ], axis=2).reshape(nb, 256) - 32
    sc = np.repeat(b["scales"].astype(np.float64), 16, axis=1)  # scale of element e is e // 16
    return (_f64(b["d"])[:, None] * sc * q).reshape(-1)


def _two_bit(qs):
    """(nb, 64) Q2_K/Q3_K quant bytes -> (nb, 256) values 0..3: element 128h + 32j + l is bits
    2j..2j+1 of byte 32h + l."""
    nb = qs.shape[0]
    q = qs.reshape(nb, 2, 1, 32).astype(np.int32) >> (2 * np.arange(4).reshape(1, 1, 4, 1))
    return (q & 3).reshape(nb, 256)


def deq_q2_k(buf, n):
    b = np.frombuffer(buf, dtype=_Q2_K, count=n // 256)
    nb = b.shape[0]
    q = _two_bit(b["qs"]).reshape(nb, 16, 16)
    sc = (b["scales"] & 0xF).astype(np.float64)       # per 16 elements
    m = (b["scales"] >> 4).astype(np.float64)
    d = _f64(b["d"])[:, None] * sc
    dm = _f64(b["dmin"])[:, None] * m
    return (d[:, :, None] * q - dm[:, :, None]).reshape(-1)


def deq_q3_k(buf, n):
    b = np.frombuffer(buf, dtype=_Q3_K, count=n // 256)
    nb = b.shape[0]
    lo = _two_bit(b["qs"])
    # bit 2 of element e: hmask[e % 32] bit e // 32; clear means the value is lowered by 4
    hm = b["hmask"].astype(np.int32)[:, None, :] >> np.arange(8).reshape(1, 8, 1)
    q = lo - 4 * (1 - (hm & 1).reshape(nb, 256))
    s = b["scales"].astype(np.int32)
    # 16 six-bit scales: low nibble of scale j in byte j % 8 (high nibble for j >= 8), top two
    # bits in byte 8 + j % 4 at bit 2 * (j // 4); stored + 32
    j = np.arange(16)
    low = (s[:, j % 8] >> (4 * (j // 8))) & 0xF
    high = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    sc = (low | (high << 4)) - 32
    d = _f64(b["d"])[:, None] * sc
    return (d[:, :, None] * q.reshape(nb, 16, 16)).reshape(-1)


def deq_q5_k(buf, n):
    b = np.frombuffer(buf, dtype=_Q5_K, count=n // 256)
    nb = b.shape[0]
    sc, m = q4_k_scales(b["scales"])
    qs = b["qs"].reshape(nb, 4, 32)
    lo = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.int32)
    # fifth bit of element 32j + l: bit j of qh[l]
    hi = (b["qh"].astype(np.int32)[:, None, :] >> np.arange(8).reshape(1, 8, 1)) & 1
    q = (lo | (hi << 4)).astype(np.float64)
    d = _f64(b["d"])[:, None] * sc
    dm = _f64(b["dmin"])[:, None] * m
    return (d[:, :, None] * q - dm[:, :, None]).reshape(-1)


def deq_iq4_xs(buf, n):
    b = np.frombuffer(buf, dtype=_IQ4_XS, count=n // 256)
    nb = b.shape[0]
    ib = np.arange(8)
    low = (b["scales_l"].astype(np.int32)[:, ib // 2] >> (4 * (ib % 2))) & 0xF
    high = (b["scales_h"].astype(np.int32)[:, None] >> (2 * ib)) & 3
    sc = (low | (high << 4)) - 32                                  # (nb, 8)
    qs = b["qs"].reshape(nb, 8, 16)
    idx = np.concatenate([qs & 0xF, qs >> 4], axis=2)              # elements 0-15, then 16-31
    v = IQ4_VALUES[idx].astype(np.float64)
    return ((_f64(b["d"])[:, None] * sc)[:, :, None] * v).reshape(-1)


def dequantize(buf, ttype, n):
    """Raw bytes of n elements of ggml type ttype -> float64 array of n."""
    if ttype == 0:
        return np.frombuffer(buf, dtype="<f4", count=n).astype(np.float64)
    if ttype == 1:
        return np.frombuffer(buf, dtype="<f2", count=n).astype(np.float64)
    if ttype == 30:
        u = np.frombuffer(buf, dtype="<u2", count=n).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    fn = {2: deq_q4_0, 8: deq_q8_0, 10: deq_q2_k, 11: deq_q3_k, 12: deq_q4_k, 13: deq_q5_k,
          14: deq_q6_k, 23: deq_iq4_xs}.get(ttype)
    if fn is None:
        raise ValueError(f"type {ttype} not supported by the reference")
    return fn(buf, n)


# ---- activation quantization (emulated) -----------------------------------------
#
# Quantized weights are multiplied with activations that the engine first converts:
# Q8_0 / Q4_0 weights with Q8_0 activations (llama.cpp's rule: blocks of 32, d = amax / 127
# stored as half, q = round-half-even(x * (127 / amax)) with the unrounded scale, q = 0 where
# the half is 0), the 256-element types (Q2_K..Q6_K, IQ4_XS) with Q8_K
# activations (blocks of 256, float d = amax / 127, q = round-half-even(x * (127 / amax)),
# clamped to +-127). The functions return the values the dot product effectively sees
# (q * d), in float64; the input is first rounded to float32, as in the engine.

def fake_q8_0(x):
    shp = x.shape
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    dh = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    iscale = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=dh > 0)
    q = np.clip(np.rint(b * iscale[:, None]), -127, 127)  # float32 product, half to even
    return (q.astype(np.float64) * dh.astype(np.float64)[:, None]).reshape(shp)


def fake_q8_k(x):
    shp = x.shape
    b = x.astype(np.float32).reshape(-1, 256)
    amax = np.abs(b).max(axis=1)
    iscale = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.clip(np.rint(b * iscale[:, None]), -127, 127)
    d = amax / np.float32(127)
    return (q.astype(np.float64) * d.astype(np.float64)[:, None]).reshape(shp)


# weight type -> activation emulation (None: activations stay float32 for F32/F16/BF16)
ACT_QUANT = {0: None, 1: None, 30: None, 8: fake_q8_0, 2: fake_q8_0, 10: fake_q8_k, 11: fake_q8_k,
             12: fake_q8_k, 13: fake_q8_k, 14: fake_q8_k, 23: fake_q8_k}
