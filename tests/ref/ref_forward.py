"""ref_forward.py - the llama-family forward pass in NumPy, float64, as an oracle for the engine.

Independent of the C code: own GGUF reader (gguf_read.py), own dequantizers (quants.py),
the math written from the model definition:

    x = token_embd[token]
    per layer:
        h = rmsnorm(x) * attn_norm
        q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)
        RoPE(q, k) at position p: theta_i = (p / scale) * base^(-2i / n_rot), i < n_rot / 2
            llama ("normal"): rotate (x[2i], x[2i+1])
            qwen2 ("NeoX"):   rotate (x[i], x[i + n_rot/2])
        attention, causal, query head h uses kv head h // (n_head / n_head_kv),
            softmax(q . k / sqrt(head_dim)) v
        x = x + Wo attn
        h = rmsnorm(x) * ffn_norm
        x = x + Wdown (silu(Wgate h) * Wup h)
    logits = Wout (rmsnorm(x) * output_norm)   (Wout = token_embd without output.weight)

rmsnorm(x) = x / sqrt(mean(x^2) + eps). Weights are dequantized to float64 and all arithmetic
is float64. With act_quant=True, the input of every matrix product with a quantized weight
is first passed through the same activation quantization the engine uses (Q8_0 for
Q8_0/Q4_0 weights, Q8_K for Q4_K/Q6_K), emulated in quants.py.

    m = RefModel("model.gguf")            # .apply_lora("adapter.gguf") merges a LoRA adapter
    s = m.session()
    logits = s.forward([1, 5, 9])          # (3, n_vocab), then s.forward([7]) continues
"""
import numpy as np

from gguf_read import GGUF
from quants import ACT_QUANT, block_offsets, q8_1_s_correction


class RefModel:
    def __init__(self, path, act_quant=False, dtype=np.float64):
        g = GGUF(path)
        self.dtype = dtype  # float64 is the oracle; float32 only to study rounding effects
        self.gguf = g
        kv = g.kv
        a = kv["general.architecture"]
        self.arch = a
        if a not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"arch {a} not supported by the reference")
        self.n_embd = int(kv[f"{a}.embedding_length"])
        self.n_layer = int(kv[f"{a}.block_count"])
        self.n_head = int(kv[f"{a}.attention.head_count"])
        self.n_head_kv = int(kv.get(f"{a}.attention.head_count_kv", self.n_head))
        self.n_ff = int(kv[f"{a}.feed_forward_length"])
        self.head_dim = int(kv.get(f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(kv.get(f"{a}.rope.dimension_count", self.head_dim))
        self.eps = float(kv.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(kv.get(f"{a}.rope.freq_base", 10000.0))
        self.rope_scale = 1.0
        if kv.get(f"{a}.rope.scaling.type", "linear") == "linear":
            self.rope_scale = float(kv.get(f"{a}.rope.scaling.factor", 1.0)) or 1.0
        self.neox = a == "qwen2"
        self.n_ctx = int(kv.get(f"{a}.context_length", 2048))

        self.act_quant = act_quant
        self.act_err2 = []  # squared relative rms error of each emulated activation quantization
        self.w = {}     # name -> float64 array (rows, ne[0])
        self.aq = {}    # name -> activation quantizer for products with that weight, or None
        self.moff = {}  # name -> (rows, blocks) offsets m of Q4_1 / Q5_1 weights (act_quant)
        for name, t in g.tensors.items():
            self.w[name] = g.array(name, dtype)
            self.aq[name] = ACT_QUANT[t.type] if act_quant else None
            m = block_offsets(g.raw(t), t.type, int(np.prod(t.ne))) if act_quant else None
            if m is not None:
                self.moff[name] = m.reshape(self.w[name].shape[0], -1)
        self.out_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        self.n_vocab = self.w["token_embd.weight"].shape[0]
        self.tokens = kv.get("tokenizer.ggml.tokens")

    def apply_lora(self, path):
        """Merge a LoRA adapter (llama.cpp's GGUF convention) into the weights, in float64:
        W += scale * B @ A with scale = alpha / rank (1 without alpha), A = <W>.lora_a
        (rank rows of n_in), B = <W>.lora_b (n_out rows of rank). Applying y = W x + scale B (A x)
        is the same math; the engine does that without touching W."""
        a = GGUF(path)
        if a.kv.get("general.type") != "adapter" or a.kv.get("adapter.type") != "lora":
            raise ValueError(f"{path}: not a LoRA adapter")
        alpha = float(a.kv.get("adapter.lora.alpha", 0.0))
        for name in a.tensors:
            if not name.endswith(".lora_a"):
                continue
            wname = name[:-len(".lora_a")]
            A = a.array(name)                  # (rank, n_in)
            B = a.array(wname + ".lora_b")     # (n_out, rank)
            rank = A.shape[0]
            scale = alpha / rank if alpha else 1.0
            self.w[wname] = self.w[wname] + (scale * (B @ A)).astype(self.dtype)
        a.close()
        return self

    def session(self):
        return Session(self)

    # ---- building blocks ----
    def rmsnorm(self, x, wname):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w[wname]

    def matmul(self, x, wname):
        """x (n, ne0) times the weight's rows: (n, rows)."""
        f = self.aq[wname]
        corr = None
        if f is not None:
            xq = f(x).astype(self.dtype)
            # relative rms error this quantization injects (test tolerances are derived from it)
            self.act_err2.append(float(np.sum((xq - x) ** 2) / max(np.sum(x * x), 1e-300)))
            if wname in self.moff:  # Q8_1's s meets the weight blocks' offsets m
                corr = q8_1_s_correction(x) @ self.moff[wname].T
            x = xq
        y = x @ self.w[wname].T
        return y if corr is None else y + corr

    def rope(self, x, pos):
        """x (n, heads, head_dim), pos (n,) -> rotated copy."""
        half = self.n_rot // 2
        i = np.arange(half, dtype=np.float64)
        inv_freq = self.rope_base ** (-2.0 * i / self.n_rot)
        theta = (pos.astype(np.float64) / self.rope_scale)[:, None] * inv_freq[None, :]
        cos = np.cos(theta)[:, None, :].astype(self.dtype)
        sin = np.sin(theta)[:, None, :].astype(self.dtype)
        y = x.copy()
        if self.neox:
            x0, x1 = x[..., :half], x[..., half:2 * half]
            y[..., :half] = x0 * cos - x1 * sin
            y[..., half:2 * half] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
            y[..., 0:2 * half:2] = x0 * cos - x1 * sin
            y[..., 1:2 * half:2] = x0 * sin + x1 * cos
        return y


class Session:
    """One sequence with its KV cache; forward() appends tokens."""

    def __init__(self, m):
        self.m = m
        self.pos = 0
        self.k = [np.zeros((0, m.n_head_kv, m.head_dim), m.dtype) for _ in range(m.n_layer)]
        self.v = [np.zeros((0, m.n_head_kv, m.head_dim), m.dtype) for _ in range(m.n_layer)]

    def forward(self, tokens):
        """Logits (len(tokens), n_vocab), float64, for tokens at positions pos, pos+1, ..."""
        m = self.m
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        if tokens.min() < 0 or tokens.max() >= m.n_vocab:
            raise ValueError("token id outside the vocabulary")
        pos = np.arange(self.pos, self.pos + n)
        x = m.w["token_embd.weight"][tokens].copy()
        hd, nh, nkv = m.head_dim, m.n_head, m.n_head_kv
        group = nh // nkv
        # causal mask over all keys so far: query t (position pos[t]) sees keys 0..pos[t]
        n_keys = self.pos + n
        mask = np.arange(n_keys)[None, :] > pos[:, None]
        for L in range(m.n_layer):
            p = f"blk.{L}."
            h = m.rmsnorm(x, p + "attn_norm.weight")
            q = m.matmul(h, p + "attn_q.weight")
            k = m.matmul(h, p + "attn_k.weight")
            v = m.matmul(h, p + "attn_v.weight")
            if p + "attn_q.bias" in m.w:
                q = q + m.w[p + "attn_q.bias"]
                k = k + m.w[p + "attn_k.bias"]
                v = v + m.w[p + "attn_v.bias"]
            q = m.rope(q.reshape(n, nh, hd), pos)
            k = m.rope(k.reshape(n, nkv, hd), pos)
            v = v.reshape(n, nkv, hd)
            self.k[L] = np.concatenate([self.k[L], k])
            self.v[L] = np.concatenate([self.v[L], v])
            # (keys, nh, hd): query head h reads kv head h // group
            kk = np.repeat(self.k[L], group, axis=1)
            vv = np.repeat(self.v[L], group, axis=1)
            s = np.einsum("thd,shd->hts", q, kk) / m.dtype(np.sqrt(hd))
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(axis=2, keepdims=True))
            s /= s.sum(axis=2, keepdims=True)
            att = np.einsum("hts,shd->thd", s, vv).reshape(n, nh * hd)
            x = x + m.matmul(att, p + "attn_output.weight")
            h = m.rmsnorm(x, p + "ffn_norm.weight")
            g = m.matmul(h, p + "ffn_gate.weight")
            u = m.matmul(h, p + "ffn_up.weight")
            x = x + m.matmul(g / (1.0 + np.exp(-g)) * u, p + "ffn_down.weight")
        self.pos += n
        h = m.rmsnorm(x, "output_norm.weight")
        return m.matmul(h, m.out_name)


def forward_all(path, tokens, act_quant=False):
    """Logits of every position of one prefill, (len(tokens), n_vocab)."""
    return RefModel(path, act_quant).session().forward(tokens)


def greedy(model, first, n_new):
    """Greedy continuation: feed `first`, then each argmax, one token at a time."""
    s = model.session()
    logits = s.forward(first)[-1]
    out = []
    for _ in range(n_new):
        t = int(np.argmax(logits))
        out.append(t)
        logits = s.forward([t])[-1]
    return out


def detokenize(pieces, ids, strip_first_space=True):
    """SPM pieces -> bytes: '\u2581' is a space, <0xNN> is the byte NN."""
    out = bytearray()
    for i, t in enumerate(ids):
        p = pieces[t]
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            out.append(int(p[3:5], 16))
            continue
        s = p.replace("\u2581", " ")
        if i == 0 and strip_first_space and s.startswith(" "):
            s = s[1:]
        out += s.encode("utf-8")
    return bytes(out)
