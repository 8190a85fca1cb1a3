"""gguf_read.py - a small GGUF v2/v3 reader for the NumPy reference (trusted test files only).

    g = GGUF("model.gguf")
    g.kv["llama.embedding_length"]          -> python value (arrays as lists / NumPy arrays)
    g.tensors["blk.0.attn_q.weight"]        -> Tensor(name, ne, type, offset, nbytes)
    g.raw(t)                                -> the tensor's bytes (a memoryview of the file)
    g.array(name)                           -> float64 array of shape ne[::-1] (dequantized)
"""
import mmap
import struct
from collections import namedtuple

import numpy as np

from quants import TYPE_INFO, dequantize

_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
        11: "<q", 12: "<d"}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
       11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9

Tensor = namedtuple("Tensor", "name ne type offset nbytes")


class GGUF:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        b = self.buf
        if b[:4] != b"GGUF":
            raise ValueError(f"{path}: bad magic")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
        if self.version not in (2, 3):
            raise ValueError(f"{path}: unsupported version {self.version}")
        self.pos = 24
        self.kv = {}
        self.kv_types = {}
        for _ in range(n_kv):
            key = self._str()
            (vt,) = self._unpack("<I")
            self.kv_types[key] = vt
            self.kv[key] = self._value(vt)
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._str()
            (nd,) = self._unpack("<I")
            ne = self._unpack(f"<{nd}Q")
            ttype, off = self._unpack("<IQ")
            blck, size = TYPE_INFO[ttype][1:]
            n = int(np.prod(ne))
            self.tensors[name] = Tensor(name, tuple(ne), ttype, off, n // blck * size)
        self.alignment = int(self.kv.get("general.alignment", 32))
        self.data_offset = (self.pos + self.alignment - 1) // self.alignment * self.alignment
        for t in self.tensors.values():
            if t.offset % self.alignment or self.data_offset + t.offset + t.nbytes > len(b):
                raise ValueError(f"{path}: tensor {t.name} outside the file or misaligned")

    def _unpack(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def _str(self):
        (n,) = self._unpack("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def _value(self, vt):
        if vt == STRING:
            return self._str()
        if vt == ARRAY:
            et, n = self._unpack("<IQ")
            if et == STRING:
                return [self._str() for _ in range(n)]
            if et == ARRAY:
                raise ValueError(f"{self.path}: nested array")
            dt = np.dtype(_NP[et])
            a = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos).copy()
            self.pos += n * dt.itemsize
            return a
        (v,) = self._unpack(_FMT[vt])
        return v

    def raw(self, t):
        if isinstance(t, str):
            t = self.tensors[t]
        start = self.data_offset + t.offset
        return memoryview(self.buf)[start:start + t.nbytes]

    def array(self, name, dtype=np.float64):
        """Dequantized tensor, NumPy shape = ne reversed (rows of ne[0] values)."""
        t = self.tensors[name]
        x = dequantize(self.raw(t), t.type, int(np.prod(t.ne)))
        return x.astype(dtype, copy=False).reshape(t.ne[::-1])

    def close(self):
        self.buf.close()
