"""ref_encoder.py - a float64 NumPy reference of the BERT / nomic-bert encoder forward pass.

Written from the model definitions (BERT: Devlin et al.; nomic-bert: rotary attention
and SwiGLU, the same block otherwise), reading the tensors by the names llama.cpp's
converter gives them, independently of src/engine/encoder.c:

    x = tok_embd[ids] + token_types[types] (+ position_embd[0..n), bert)
    x = LN(x; token_embd_norm)
    per layer:  q, k, v = x Wq + bq, ...  (nomic-bert: x Wqkv split in three, NeoX RoPE on q, k)
                a = softmax(q k^T / sqrt(d)) v per head, every position sees every position
                x = LN(x + a Wo + bo; attn_output_norm)
                f = gelu_erf(x Wup + bup) Wdown + bdown   (bert)
                    (silu(x Wgate) * (x Wup)) Wdown       (nomic-bert)
                x = LN(x + f; layer_output_norm)
    pooling: mean / first / last row, unit length; rank: tanh(cls x0 + b) -> cls.output.

    m = Encoder("model.gguf")
    m.embed(ids) -> np.ndarray (n_embd,) unit length, or (n_cls_out,) scores for a reranker
"""
import math

import numpy as np

from gguf_read import GGUF

_erf = np.vectorize(math.erf)


def _ln(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class Encoder:
    def __init__(self, path):
        g = GGUF(path)
        self.g = g
        a = g.kv["general.architecture"]
        if a not in ("bert", "nomic-bert"):
            raise ValueError(f"{path}: {a} is not an encoder")
        self.arch = a
        self.n_embd = int(g.kv[f"{a}.embedding_length"])
        self.n_head = int(g.kv[f"{a}.attention.head_count"])
        self.n_layer = int(g.kv[f"{a}.block_count"])
        self.eps = float(g.kv.get(f"{a}.attention.layer_norm_epsilon", 1e-12))
        self.base = float(g.kv.get(f"{a}.rope.freq_base", 10000.0))
        self.pooling = int(g.kv.get(f"{a}.pooling_type", 0))
        self.sep = int(g.kv.get("tokenizer.ggml.seperator_token_id", 102))
        self.t = {}

    def w(self, name):
        if name not in self.t:
            self.t[name] = self.g.array(name) if name in self.g.tensors else None
        return self.t[name]

    def _rope(self, x, n):
        """NeoX RoPE over (n, heads, hd): pairs (i, i + hd/2), theta_i = p * base^(-2i/hd)."""
        hd = x.shape[-1]
        half = hd // 2
        inv = self.base ** (-2.0 * np.arange(half) / hd)
        th = np.arange(n)[:, None] * inv[None, :]
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

    def hidden(self, ids):
        ids = np.asarray(ids)
        n, E, H = len(ids), self.n_embd, self.n_head
        hd = E // H
        w = self.w
        x = w("token_embd.weight")[ids].copy()
        tt = w("token_types.weight")
        if tt is not None:
            types = np.zeros(n, dtype=np.int64)
            if self.pooling == 4 and tt.shape[0] >= 2:
                seps = np.nonzero(ids == self.sep)[0]
                if len(seps):
                    types[seps[0] + 1:] = 1
            x += tt[types]
        if self.arch == "bert":
            x += w("position_embd.weight")[:n]
        x = _ln(x, w("token_embd_norm.weight"), w("token_embd_norm.bias"), self.eps)

        def lin(x, name):
            y = x @ w(name + ".weight").T
            b = w(name + ".bias")
            return y + b if b is not None else y

        for il in range(self.n_layer):
            p = f"blk.{il}."
            if w(p + "attn_qkv.weight") is not None:
                qkv = lin(x, p + "attn_qkv")
                q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
            else:
                q, k, v = lin(x, p + "attn_q"), lin(x, p + "attn_k"), lin(x, p + "attn_v")
            q, k, v = (t.reshape(n, H, hd) for t in (q, k, v))
            if self.arch == "nomic-bert":
                q, k = self._rope(q, n), self._rope(k, n)
            s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", s, v).reshape(n, E)
            x = _ln(x + lin(att, p + "attn_output"), w(p + "attn_output_norm.weight"),
                    w(p + "attn_output_norm.bias"), self.eps)
            if self.arch == "nomic-bert":
                g = lin(x, p + "ffn_gate")
                h = g / (1.0 + np.exp(-g)) * lin(x, p + "ffn_up")
            else:
                u = lin(x, p + "ffn_up")
                h = 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))
            x = _ln(x + lin(h, p + "ffn_down"), w(p + "layer_output_norm.weight"),
                    w(p + "layer_output_norm.bias"), self.eps)
        return x

    def embed(self, ids):
        x = self.hidden(ids)
        if self.pooling == 4:
            h = x[0]
            if self.w("cls.weight") is not None:
                h = np.tanh(h @ self.w("cls.weight").T + self.w("cls.bias"))
            y = h @ self.w("cls.output.weight").T
            b = self.w("cls.output.bias")
            return y + b if b is not None else y
        v = {1: x.mean(axis=0), 2: x[0], 3: x[-1]}[self.pooling]
        nrm = np.linalg.norm(v)
        return v / nrm if nrm > 0 else v
