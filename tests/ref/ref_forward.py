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

Other architectures (as llama.cpp reads and computes them):
    qwen3:   NeoX RoPE; per-head RMSNorm of q and k (attn_q_norm / attn_k_norm) before RoPE.
    gemma2:  x = token_embd[token] * sqrt(n_embd); NeoX RoPE; q scaled by 1/sqrt(head_dim)
             (1/sqrt(n_embd/n_head) for the 46-layer 27B); scores soft-capped s = c tanh(s/c)
             (attn_logit_softcapping); layers il % P < P-1 (P = sliding_window_pattern, 2)
             attend only to the last sliding_window positions; post_attention_norm after
             attention and post_ffw_norm after the FFN, both before their residual add; FFN
             gelu_tanh(gate) * up; logits soft-capped (final_logit_softcapping). Norm weights
             are used as stored (the converter already added gemma's +1).
    gemma3:  gemma2 without attention soft-capping, plus q/k norms; P defaults to 6; sliding
             layers use rope.freq_base_swa (10000) unscaled, the others rope.freq_base with
             the file's linear scaling; final soft-capping only when the key is present.
    phi3:    fused attn_qkv (q rows, k rows, v rows) and ffn_up (gate rows, up rows); NeoX
             RoPE with frequencies divided by rope_factors_long when the context exceeds
             rope.scaling.original_context_length, else rope_factors_short, and cos/sin times
             rope.scaling.attn_factor; a sliding window when attention.sliding_window is set.
    smollm3: llama, except that layers il with (il + 1) % 4 == 0 use no RoPE.
    granite: llama with x = token_embd[token] * embedding_scale, the scores' scale
             attention.scale, each sub-layer output times residual_scale before its residual
             add, logits divided by logit_scale (absent or 0 optional keys: no scaling); no
             RoPE at all when rope.scaling.finetuned is false (llama.cpp's reading).
    olmo2:   no attn_norm / ffn_norm (the sub-layers read x itself); RMSNorm of the whole q
             and k projections (attn_q_norm / attn_k_norm of n_head*head_dim and
             n_head_kv*head_dim) before NeoX RoPE; post-norms as gemma.

Mixture of experts (llama with expert_count >= 2, i.e. Mixtral; qwen2moe; qwen3moe = qwen3's
attention with experts), in place of the dense FFN, for each row h:
    p = softmax(Wr h)                    (Wr = ffn_gate_inp, one row per expert)
    S = the k experts of largest p       (k = expert_used_count; equal p: lower id)
    w_e = p_e for e in S, divided by their sum (llama/Mixtral, qwen3moe; not qwen2moe)
    ffn(h) = sum_{e in S} w_e Wdown_e (silu(Wgate_e h) * Wup_e h)
    qwen2moe adds the shared expert: sigmoid(ws . h) Wdown_s (silu(Wgate_s h) * Wup_s h)
gpt-oss (llama.cpp's build of it): NeoX RoPE (YaRN), q/k/v and attention output biases;
each query head h has a sink logit z_h (attn_sinks) that joins the softmax's normaliser but
has no value: o_h = sum_p e^(s_p) v_p / (e^(z_h) + sum_p e^(s_p)); layers il % P < P - 1
(P = sliding_window_pattern, default 2: the even layers) attend only to the last
sliding_window positions, all with the same RoPE; the FFN's pre-norm is the tensor named
post_attention_norm (no ffn_norm); experts in every layer, routed by
    l = Wr h + br;  S = the k largest l;  w = softmax(l_S)   (no normalisation afterwards)
    ffn(h) = sum_{e in S} w_e (Wdown_e a_e + bdown_e), with g = Wgate_e h + bgate_e,
    u = Wup_e h + bup_e, a_e = min(g, 7) sigmoid(1.702 min(g, 7)) (clip(u, -7, 7) + 1).
gemma4 (llama.cpp's build of the dense models): layers are sliding (S) or global (G) by the
bool array attention.sliding_window_pattern; S layers have heads of key_length_swa, rotate
rope.dimension_count_swa dims with rope.freq_base_swa (10000) unscaled; G layers have heads
of key_length, rotate rope.dimension_count dims with rope.freq_base (linear scaling) and the
frequencies divided by rope_freqs (1e30 entries: pairs that do not rotate); head_count_kv
and feed_forward_length may be per-layer arrays. x = token_embd[token] * sqrt(n_embd). Per
layer: q = RMSNorm_heads(Wq h) * q_norm, k likewise with k_norm, v = RMSNorm_heads(Wv h)
without weight (Wv absent: v is the raw k projection), NeoX RoPE on q and k; attention
softmax(q . k) (scale 1) over the window; post_attention_norm, residual; gemma's GELU FFN
with post_ffw_norm, residual. The last attention.shared_kv_layers layers compute only q and
attend over the cache of layer n_kv - 2 (S) or n_kv - 1 (G), n_kv = n_layer - shared.
Per-layer inputs (embedding_length_per_layer_input P > 0): before the layers,
pl = (RMSNorm((W_plproj x0) / sqrt(n_embd)) * per_layer_proj_norm (per layer slice of P)
+ per_layer_token_embd[token] * sqrt(P)) / sqrt(2), x0 the scaled embedding; after each
layer's FFN residual x += RMSNorm(Wproj (gelu(Wgate x) * pl[layer])) * post_norm. Then x
times layer_output_scale when the layer has one. Logits soft-capped as gemma3.
gemma4 with experts (expert_count >= 2, 26B-A4B): the FFN residual adds
RMSNorm(RMSNorm(mlp) * post_ffw_norm_1 + RMSNorm(moe) * post_ffw_norm_2) * post_ffw_norm, mlp
the dense GELU MLP above, moe = sum_{e in S} w_e s_e Wdown_e (gelu(Wgate_e h2) * Wup_e h2),
h2 = RMSNorm(x) * pre_ffw_norm_2, routed by l = Wr (RMSNorm(x) / sqrt(n_embd) * r) with
r = ffn_gate_inp.scale: softmax, the k largest, normalised; s_e = ffn_down_exps.scale[e].

RefModel.route_margin records the smallest gap between the k-th and (k+1)-th routing
score seen (relative to the largest score): tests check it is far above float32 rounding,
so the engine's float32 routing picks the same experts as this float64 oracle.

deepseek2 (multi-head latent attention, llama.cpp's build of it, computed here in the expanded
form): per row h, q = Wqb RMSNorm(Wqa h) (or Wq h), each head [q_nope, q_pe]; kv_a = Wkva h,
c = RMSNorm(kv_a[:r]), k_pe = kv_a[r:] (one RoPE part for all heads, NORMAL pairs); head i's
key [Wk_i c, k_pe] and value Wv_i c (attn_k_b / attn_v_b or the fused attn_kv_b); scores times
kq_scale (init_deepseek2 has llama.cpp's YaRN mscale arithmetic); layers below
leading_dense_block_count run the dense FFN, the others experts routed by softmax or sigmoid
scores plus exp_probs_b (choice only), the best expert groups, weights normalised / scaled as
the file says, plus the ungated shared experts.

YaRN (rope.scaling.type yarn, llama.cpp's rope with ext_factor 1): pair i's frequency f_i
becomes f_i (s (1 - r_i) + r_i) with s = 1 / factor and r_i a ramp from 1 (pairs below the
beta_fast = 32 correction dimension: unchanged) to 0 (above beta_slow = 1's: interpolated);
cos and sin are multiplied by 1 + 0.1 ln(factor).

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
    def __init__(self, path, act_quant=False, dtype=np.float64, n_ctx=None):
        g = GGUF(path)
        self.dtype = dtype  # float64 is the oracle; float32 only to study rounding effects
        self.gguf = g
        kv = g.kv
        a = kv["general.architecture"]
        self.arch = a
        if a not in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3",
                     "granite", "olmo2", "qwen2moe", "qwen3moe", "gpt-oss", "gemma4", "deepseek2"):
            raise ValueError(f"arch {a} not supported by the reference")
        self.n_embd = int(kv[f"{a}.embedding_length"])
        self.n_layer = int(kv[f"{a}.block_count"])
        self.n_head = int(kv[f"{a}.attention.head_count"])
        # gemma4 may give these per layer (arrays): the largest here, the list in g4
        hkv = kv.get(f"{a}.attention.head_count_kv", self.n_head)
        ffk = kv[f"{a}.feed_forward_length"]
        self.n_head_kv = int(np.max(hkv))
        self.n_ff = int(np.max(ffk))
        self.head_dim = int(kv.get(f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(kv.get(f"{a}.rope.dimension_count", self.head_dim))
        self.eps = float(kv.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(kv.get(f"{a}.rope.freq_base", 10000.0))
        self.rope_scale = 1.0
        if kv.get(f"{a}.rope.scaling.type", "linear") == "linear":
            self.rope_scale = float(kv.get(f"{a}.rope.scaling.factor", 1.0)) or 1.0
        self.yarn = None
        if kv.get(f"{a}.rope.scaling.type") == "yarn":
            factor = float(kv.get(f"{a}.rope.scaling.factor", 1.0)) or 1.0
            orig = int(kv.get(f"{a}.rope.scaling.original_context_length",
                              kv[f"{a}.context_length"]))
            self.yarn = (factor, orig, 32.0, 1.0)
        self.neox = a in ("qwen2", "qwen3", "gemma2", "gemma3", "phi3", "olmo2", "qwen2moe",
                          "qwen3moe", "gpt-oss", "gemma4")
        self.gptoss = a == "gpt-oss"
        self.n_expert = int(kv.get(f"{a}.expert_count", 0)) \
            if a in ("llama", "mistral", "qwen2moe", "qwen3moe", "gpt-oss", "gemma4") else 0
        if self.n_expert <= 1:
            self.n_expert = 0  # llama.cpp: 0 or 1 expert is a dense model
        self.n_expert_used = int(kv.get(f"{a}.expert_used_count", 0))
        self.norm_w = a not in ("qwen2moe", "gpt-oss")
        self.route_margin = np.inf
        self.n_ctx_train = int(kv.get(f"{a}.context_length", 2048))
        # the context the engine runs with (sampan eval: the trained one, capped at 4096)
        self.n_ctx = n_ctx or min(self.n_ctx_train, 4096)
        L = self.n_layer
        self.embd_scale = np.sqrt(self.n_embd) if a in ("gemma2", "gemma3") else 1.0
        self.q_scale = 1.0 / np.sqrt(self.head_dim)
        if (a, L) in (("gemma2", 46), ("gemma3", 62)):
            self.q_scale = 1.0 / np.sqrt(self.n_embd // self.n_head)
        self.attn_softcap = float(kv.get(f"{a}.attn_logit_softcapping", 50.0)) \
            if a == "gemma2" else 0.0
        self.final_softcap = float(kv.get(f"{a}.final_logit_softcapping",
                                          30.0 if a == "gemma2" else 0.0)) \
            if a in ("gemma2", "gemma3") else 0.0
        self.gelu = a in ("gemma2", "gemma3")
        # per layer: sliding window (0 = none), RoPE base and scale, RoPE on or off
        n_swa = int(kv.get(f"{a}.attention.sliding_window", 4096 if a == "gemma2" else 0))
        self.swa = [0] * L
        if a in ("gemma2", "gemma3") and n_swa > 0:
            P = int(kv.get(f"{a}.attention.sliding_window_pattern", 2 if a == "gemma2" else 6))
            self.swa = [n_swa if (P == 0 or il % P < P - 1) else 0 for il in range(L)]
        elif a == "gpt-oss":
            P = int(kv.get(f"{a}.attention.sliding_window_pattern", 2))
            self.swa = [n_swa if (P == 0 or il % P < P - 1) else 0 for il in range(L)]
        elif a == "phi3" and n_swa > 0:
            self.swa = [n_swa] * L
        base_swa = float(kv.get(f"{a}.rope.freq_base_swa",
                                self.rope_base if a == "gemma2" else 10000.0))
        self.layer_rope = [(base_swa, 1.0) if (self.swa[il] and a == "gemma3")
                           else (self.rope_base, self.rope_scale) for il in range(L)]
        self.use_rope = [not (a == "smollm3" and (il + 1) % 4 == 0) for il in range(L)]
        self.residual_scale, self.logit_scale = 1.0, 1.0
        if a == "granite":
            self.embd_scale = float(kv.get(f"{a}.embedding_scale", 0.0)) or 1.0
            self.q_scale = float(kv.get(f"{a}.attention.scale", 0.0)) or self.q_scale
            self.residual_scale = float(kv.get(f"{a}.residual_scale", 0.0)) or 1.0
            self.logit_scale = float(kv[f"{a}.logit_scale"])
            if not kv.get(f"{a}.rope.scaling.finetuned", True):
                self.use_rope = [False] * L
        self.rope_attn_factor = float(kv.get(f"{a}.rope.scaling.attn_factor", 1.0))
        self.mla = None
        if a == "deepseek2":
            self.init_deepseek2(kv)
        self.n_ctx_orig = int(kv.get(f"{a}.rope.scaling.original_context_length",
                                     self.n_ctx_train))

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
        self.g4 = None
        if a == "gemma4":
            self._init_gemma4(kv, hkv, ffk)
        self.out_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        self.n_vocab = self.w["token_embd.weight"].shape[0]
        self.tokens = kv.get("tokenizer.ggml.tokens")
        # LongRoPE: the factor set the context length picks (llama.cpp: long above the
        # original context)
        self.rope_factors = self.w.get("rope_freqs.weight")
        if "rope_factors_long.weight" in self.w:
            self.rope_factors = self.w["rope_factors_long.weight" if self.n_ctx > self.n_ctx_orig
                                       else "rope_factors_short.weight"]
        # fused matrices split into the separate ones
        for L in range(self.n_layer):
            p = f"blk.{L}."
            if p + "attn_qkv.weight" in self.w:
                qkv = self.w.pop(p + "attn_qkv.weight")
                self.aq.update({p + n: self.aq[p + "attn_qkv.weight"]
                                for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight")})
                nq, nk = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
                self.w[p + "attn_q.weight"] = qkv[:nq]
                self.w[p + "attn_k.weight"] = qkv[nq:nq + nk]
                self.w[p + "attn_v.weight"] = qkv[nq + nk:]
            if p + "ffn_gate.weight" not in self.w and p + "ffn_up.weight" in self.w:
                gu = self.w[p + "ffn_up.weight"]
                self.aq[p + "ffn_gate.weight"] = self.aq[p + "ffn_up.weight"]
                self.w[p + "ffn_gate.weight"] = gu[:self.n_ff]
                self.w[p + "ffn_up.weight"] = gu[self.n_ff:]

    def _init_gemma4(self, kv, hkv, ffk):
        a, L = "gemma4", self.n_layer
        kinds = kv[f"{a}.attention.sliding_window_pattern"]
        kinds = [bool(k) for k in (kinds if np.ndim(kinds) else [kinds] * L)]
        n_swa = int(kv[f"{a}.attention.sliding_window"])
        hd_s = int(kv[f"{a}.attention.key_length_swa"])
        rot_s = int(kv.get(f"{a}.rope.dimension_count_swa", self.n_rot))
        shared = int(kv.get(f"{a}.attention.shared_kv_layers", 0))
        n_kv = L - shared
        per = lambda v: [int(x) for x in (v if np.ndim(v) else [v] * L)]  # noqa: E731
        self.g4 = dict(
            hd=[hd_s if k else self.head_dim for k in kinds],
            rot=[rot_s if k else self.n_rot for k in kinds],
            nkv=per(hkv), ff=per(ffk), n_kv=n_kv,
            src=[il if il < n_kv else n_kv - (2 if kinds[il] else 1) for il in range(L)],
            rope=[(float(kv.get(f"{a}.rope.freq_base_swa", 10000.0)), 1.0) if k
                  else (self.rope_base, self.rope_scale) for k in kinds],
            n_pl=int(kv[f"{a}.embedding_length_per_layer_input"]),
            v_norm=True, pl=True, out_scale=True, shared_kv=True,
            moe=self.n_expert > 0, exp_scale=True)
        self.swa = [n_swa if k else 0 for k in kinds]
        self.embd_scale = np.sqrt(self.n_embd)
        self.q_scale = 1.0
        self.final_softcap = float(kv.get(f"{a}.final_logit_softcapping", 0.0))
        self.gelu = True

    def rope_g4(self, x, pos, il):
        """gemma4's NeoX RoPE of layer il: its width, base, scale and (global layers) the
        rope_freqs divisors."""
        n_rot = self.g4["rot"][il]
        base, scale = self.g4["rope"][il]
        half = n_rot // 2
        inv_freq = base ** (-2.0 * np.arange(half, dtype=np.float64) / n_rot)
        if not self.swa[il] and "rope_freqs.weight" in self.w:
            inv_freq = inv_freq / self.w["rope_freqs.weight"][:half].astype(np.float64)
        theta = (pos.astype(np.float64) / scale)[:, None] * inv_freq[None, :]
        cos = np.cos(theta)[:, None, :].astype(self.dtype)
        sin = np.sin(theta)[:, None, :].astype(self.dtype)
        y = x.copy()
        x0, x1 = x[..., :half], x[..., half:2 * half]
        y[..., :half] = x0 * cos - x1 * sin
        y[..., half:2 * half] = x0 * sin + x1 * cos
        return y

    def init_deepseek2(self, kv):
        """deepseek2's hyper-parameters. The attention is computed in the expanded form
        (per-head keys [W_k c, k_pe] and values W_v c from the latent c), not the engine's
        absorbed one. Scales as llama.cpp sets them (llama-context.cpp's yarn_attn_factor and
        the deepseek2 graph's kq_scale): with s the YaRN factor, L = yarn_log_multiplier / 0.1
        and a = rope.scaling.attn_factor, A = a (L != 0 ? 1 : mscale(s)) / (1 + 0.1 ln s),
        cos/sin times A (1 + 0.1 ln s), kq_scale = (A (1 + 0.1 ln s)(1 + 0.1 L ln s))^2 /
        sqrt(qk)."""
        a = self.arch
        r = int(kv[f"{a}.attention.kv_lora_rank"])
        k_len = int(kv[f"{a}.attention.key_length"])
        v_len = int(kv[f"{a}.attention.value_length"])
        if f"{a}.attention.key_length_mla" in kv:
            k_len = int(kv[f"{a}.attention.key_length_mla"])
            v_len = int(kv[f"{a}.attention.value_length_mla"])
        rot = int(kv[f"{a}.rope.dimension_count"])
        self.mla = dict(kv_lora=r, q_lora=int(kv.get(f"{a}.attention.q_lora_rank", 0)),
                        nope=k_len - rot, v=v_len, qk=k_len)
        self.n_rot = rot
        self.head_dim = k_len
        self.n_head_kv = self.n_head
        self.neox = False
        self.n_expert = int(kv.get(f"{a}.expert_count", 0))
        self.n_dense_lead = int(kv.get(f"{a}.leading_dense_block_count", 0))
        self.gating = int(kv.get(f"{a}.expert_gating_func", 1)) or 1
        self.norm_w = bool(kv.get(f"{a}.expert_weights_norm", False))
        self.w_scale = float(kv.get(f"{a}.expert_weights_scale", 0.0))
        self.n_group = int(kv.get(f"{a}.expert_group_count", 0))
        self.n_group_used = int(kv.get(f"{a}.expert_group_used_count", 0))
        L = float(kv.get(f"{a}.rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        att = float(kv.get(f"{a}.rope.scaling.attn_factor", 1.0))

        def mscale(sc, m):
            return 1.0 if sc <= 1.0 else 0.1 * m * np.log(sc) + 1.0
        if self.yarn:
            sf = self.yarn[0]
            A = (1.0 if L != 0.0 else mscale(sf, 1.0)) / (1.0 + 0.1 * np.log(sf)) * att
            cs = A * (1.0 + 0.1 * np.log(sf))
            ms = cs * (1.0 + 0.1 * L * np.log(sf))
            # self.rope multiplies by rope_attn_factor and by YaRN's 1 + 0.1 ln s
            self.rope_attn_factor = cs / (1.0 + 0.1 * np.log(sf)) if sf > 1.0 else cs
        else:
            ln = np.log(self.rope_scale)
            ms = att * (1.0 + 0.1 * ln) * (1.0 + 0.1 * L * ln)
            self.rope_attn_factor = att
        self.q_scale = ms * ms / np.sqrt(k_len)

    def mla_attention(self, sess, L, h, pos, mask):
        """deepseek2's attention of layer L over rows h (n, n_embd), expanded form."""
        p, ml, n, nh = f"blk.{L}.", self.mla, h.shape[0], self.n_head
        r, nope, rot, qk, vd = ml["kv_lora"], ml["nope"], self.n_rot, ml["qk"], ml["v"]
        if ml["q_lora"]:
            q = self.matmul(self.rmsnorm(self.matmul(h, p + "attn_q_a.weight"),
                                         p + "attn_q_a_norm.weight"), p + "attn_q_b.weight")
        else:
            q = self.matmul(h, p + "attn_q.weight")
        q = q.reshape(n, nh, qk)
        kva = self.matmul(h, p + "attn_kv_a_mqa.weight")
        c = self.rmsnorm(kva[:, :r], p + "attn_kv_a_norm.weight")
        k_pe = self.rope(kva[:, None, r:], pos)                     # (n, 1, rot)
        q_pe = self.rope(q[:, :, nope:], pos)                       # (n, nh, rot)
        if p + "attn_k_b.weight" in self.w:
            wk = self.w[p + "attn_k_b.weight"]                       # (nh, r, nope)
            wv = self.w[p + "attn_v_b.weight"]                       # (nh, vd, r)
            k_nope = np.einsum("tr,hrd->thd", c, wk)
            v = np.einsum("tr,hvr->thv", c, wv)
        else:
            kvb = self.matmul(c, p + "attn_kv_b.weight").reshape(n, nh, nope + vd)
            k_nope, v = kvb[:, :, :nope], kvb[:, :, nope:]
        k = np.concatenate([k_nope, np.repeat(k_pe, nh, axis=1)], axis=2)
        qq = np.concatenate([q[:, :, :nope], q_pe], axis=2)
        sess.k[L] = k if sess.k[L] is None else np.concatenate([sess.k[L], k])
        sess.v[L] = v if sess.v[L] is None else np.concatenate([sess.v[L], v])
        sc = np.einsum("thd,shd->hts", qq, sess.k[L]) * self.dtype(self.q_scale)
        sc = np.where(mask[None], -np.inf, sc)
        sc = np.exp(sc - sc.max(axis=2, keepdims=True))
        sc /= sc.sum(axis=2, keepdims=True)
        att = np.einsum("hts,shd->thd", sc, sess.v[L]).reshape(n, nh * vd)
        return self.matmul(att, p + "attn_output.weight")

    def moe_deepseek2(self, h, p):
        """deepseek2's experts: softmax or sigmoid scores, the selection bias and the expert
        groups for the choice only, weights normalised and scaled as the file says, plus the
        ungated shared experts."""
        k, ne = self.n_expert_used, self.n_expert
        logits = self.matmul(h, p + "ffn_gate_inp.weight")
        if self.gating == 2:
            probs = 1.0 / (1.0 + np.exp(-logits))
        elif self.gating == 3:  # softmax over the chosen logits (below)
            probs = logits.copy()
        else:
            z = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = z / z.sum(axis=1, keepdims=True)
        bias = self.w.get(p + "exp_probs_b.bias")
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            sel_s = probs[t] + (bias.reshape(-1) if bias is not None else 0.0)
            if self.n_group > 1:
                per = ne // self.n_group
                grp = sel_s.reshape(self.n_group, per)
                gsc = np.sort(grp, axis=1)[:, -2:].sum(axis=1)
                keep = np.argsort(-gsc, kind="stable")[:self.n_group_used]
                masked = np.full_like(grp, -np.inf)
                masked[keep] = grp[keep]
                sel_s = masked.reshape(-1)
            order = np.argsort(-sel_s, kind="stable")
            sel = order[:k]
            if k < ne and np.isfinite(sel_s[order[k]]):
                gap = (sel_s[order[k - 1]] - sel_s[order[k]]) / abs(sel_s[order[0]])
                self.route_margin = min(self.route_margin, float(gap))
            w = probs[t, sel]
            if self.gating == 3:
                w = np.exp(w - w.max())
                w = w / w.sum()
            if self.norm_w:
                w = w / max(w.sum(), 6.103515625e-5)
            if self.w_scale not in (0.0, 1.0):
                w = w * self.w_scale
            x = h[t:t + 1]
            for e, we in zip(sel, w):
                g = self.matmul_e(x, p + "ffn_gate_exps.weight", e)
                u = self.matmul_e(x, p + "ffn_up_exps.weight", e)
                y = self.matmul_e(g / (1.0 + np.exp(-g)) * u, p + "ffn_down_exps.weight", e)
                out[t] += we * y[0]
        if p + "ffn_gate_shexp.weight" in self.w:
            g = self.matmul(h, p + "ffn_gate_shexp.weight")
            u = self.matmul(h, p + "ffn_up_shexp.weight")
            out = out + self.matmul(g / (1.0 + np.exp(-g)) * u, p + "ffn_down_shexp.weight")
        return out

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

    def rmsnorm_heads(self, x, wname):
        """Per-head RMSNorm of x (n, heads, head_dim)."""
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w[wname]

    def moe(self, h, p):
        """The mixture-of-experts block of layer prefix p over rows h (n, n_embd)."""
        k = self.n_expert_used
        logits = self.matmul(h, p + "ffn_gate_inp.weight")
        if getattr(self, "gptoss", False):
            return self.moe_oai(h, p, logits + self.w[p + "ffn_gate_inp.bias"])
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = z / z.sum(axis=1, keepdims=True)
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            order = np.argsort(-probs[t], kind="stable")  # stable: equal scores, lower id first
            sel = order[:k]
            if k < self.n_expert:
                gap = (probs[t, order[k - 1]] - probs[t, order[k]]) / probs[t, order[0]]
                self.route_margin = min(self.route_margin, float(gap))
            w = probs[t, sel]
            if self.norm_w:
                w = w / max(w.sum(), 6.103515625e-5)
            x = h[t:t + 1]
            for e, we in zip(sel, w):
                g = self.matmul_e(x, p + "ffn_gate_exps.weight", e)
                u = self.matmul_e(x, p + "ffn_up_exps.weight", e)
                y = self.matmul_e(g / (1.0 + np.exp(-g)) * u, p + "ffn_down_exps.weight", e)
                out[t] += we * y[0]
        if p + "ffn_gate_shexp.weight" in self.w:
            g = self.matmul(h, p + "ffn_gate_shexp.weight")
            u = self.matmul(h, p + "ffn_up_shexp.weight")
            y = self.matmul(g / (1.0 + np.exp(-g)) * u, p + "ffn_down_shexp.weight")
            s = h @ self.w[p + "ffn_gate_inp_shexp.weight"].reshape(-1)
            out = out + y / (1.0 + np.exp(-s))[:, None]
        return out

    def moe_gemma4(self, x, p):
        """gemma4's experts over the residual rows x (n, n_embd): the router reads
        RMSNorm(x) / sqrt(n_embd) * ffn_gate_inp.scale, the experts RMSNorm(x) * pre_ffw_norm_2;
        softmax, top-k, weights normalised; gelu(gate) * up (gate and up fused or apart),
        down, times the expert's ffn_down_exps.scale."""
        k, E = self.n_expert_used, self.n_embd
        xr = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        xr = xr / np.sqrt(E) * self.w[p + "ffn_gate_inp.scale"]
        logits = self.matmul(xr, p + "ffn_gate_inp.weight")
        h = self.rmsnorm(x, p + "pre_ffw_norm_2.weight")
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = z / z.sum(axis=1, keepdims=True)
        fused = p + "ffn_gate_up_exps.weight" in self.w
        dscale = self.w.get(p + "ffn_down_exps.scale") if self.g4["exp_scale"] else None
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            order = np.argsort(-probs[t], kind="stable")
            sel = order[:k]
            if k < self.n_expert:
                gap = (probs[t, order[k - 1]] - probs[t, order[k]]) / probs[t, order[0]]
                self.route_margin = min(self.route_margin, float(gap))
            w = probs[t, sel] / max(probs[t, sel].sum(), 6.103515625e-5)
            r = h[t:t + 1]
            for e, we in zip(sel, w):
                if fused:
                    gu = self.matmul_e(r, p + "ffn_gate_up_exps.weight", e)
                    g, u = np.split(gu, 2, axis=1)
                else:
                    g = self.matmul_e(r, p + "ffn_gate_exps.weight", e)
                    u = self.matmul_e(r, p + "ffn_up_exps.weight", e)
                a = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3))) * u
                y = self.matmul_e(a, p + "ffn_down_exps.weight", e)[0]
                if dscale is not None:
                    y = y * dscale[e]
                out[t] += we * y
        return out

    def moe_oai(self, h, p, logits):
        """gpt-oss's experts: top-k of the logits, softmax over those, biases, clamped SwiGLU."""
        k, lim, alpha = self.n_expert_used, 7.0, 1.702
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            order = np.argsort(-logits[t], kind="stable")  # equal logits: lower id first
            sel = order[:k]
            if k < self.n_expert:  # gap relative to the largest logit's size
                gap = (logits[t, order[k - 1]] - logits[t, order[k]]) / np.abs(logits[t]).max()
                self.route_margin = min(self.route_margin, float(gap))
            z = np.exp(logits[t, sel] - logits[t, sel].max())
            w = z / z.sum()
            x = h[t:t + 1]
            for e, we in zip(sel, w):
                g = self.matmul_e(x, p + "ffn_gate_exps.weight", e) + \
                    self.w[p + "ffn_gate_exps.bias"][e]
                u = self.matmul_e(x, p + "ffn_up_exps.weight", e) + \
                    self.w[p + "ffn_up_exps.bias"][e]
                g = np.minimum(g, lim)
                u = np.clip(u, -lim, lim)
                a = g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)
                y = self.matmul_e(a, p + "ffn_down_exps.weight", e) + \
                    self.w[p + "ffn_down_exps.bias"][e]
                out[t] += we * y[0]
        return out

    def matmul_e(self, x, wname, e):
        """x times expert e's matrix of a 3-D expert tensor (n_expert, rows, ne0)."""
        f = self.aq[wname]
        if f is not None:
            xq = f(x).astype(self.dtype)
            self.act_err2.append(float(np.sum((xq - x) ** 2) / max(np.sum(x * x), 1e-300)))
            x = xq
        return x @ self.w[wname][e].T

    def rope(self, x, pos, base=None, scale=None):
        """x (n, heads, head_dim), pos (n,) -> rotated copy."""
        half = self.n_rot // 2
        base = self.rope_base if base is None else base
        scale = self.rope_scale if scale is None else scale
        i = np.arange(half, dtype=np.float64)
        inv_freq = base ** (-2.0 * i / self.n_rot)
        factors = getattr(self, "rope_factors", None)
        if factors is not None:
            inv_freq = inv_freq / factors.astype(np.float64)
        mscale = getattr(self, "rope_attn_factor", 1.0)
        if getattr(self, "yarn", None):
            factor, orig, fast, slow = self.yarn

            def corr(turns):
                return self.n_rot * np.log(orig / (turns * 2 * np.pi)) / (2 * np.log(base))
            lo = max(0.0, np.floor(corr(fast)))
            hi = min(self.n_rot - 1.0, np.ceil(corr(slow)))
            ramp = 1.0 - np.clip((i - lo) / max(hi - lo, 0.001), 0.0, 1.0)
            inv_freq = inv_freq * ((1.0 / factor) * (1.0 - ramp) + ramp)
            mscale = mscale * (1.0 + 0.1 * np.log(factor) if factor > 1.0 else 1.0)
        theta = (pos.astype(np.float64) / scale)[:, None] * inv_freq[None, :]
        cos = (np.cos(theta) * mscale)[:, None, :].astype(self.dtype)
        sin = (np.sin(theta) * mscale)[:, None, :].astype(self.dtype)
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
        if m.mla:  # per-head keys and values of their own widths (mla_attention)
            self.k = [None] * m.n_layer
            self.v = [None] * m.n_layer

    def forward_gemma4(self, tokens):
        m, g4 = self.m, self.m.g4
        n, L, E, P = len(tokens), m.n_layer, m.n_embd, m.g4["n_pl"]
        pos = np.arange(self.pos, self.pos + n)
        n_keys = self.pos + n
        mask = np.arange(n_keys)[None, :] > pos[:, None]
        nh = m.n_head

        def gelu(g):
            return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))

        def rms(x):
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + m.eps)

        x = m.w["token_embd.weight"][tokens] * m.dtype(m.embd_scale)
        pl = None
        if P and g4["pl"]:
            proj = (m.matmul(x, "per_layer_model_proj.weight") / np.sqrt(E)).reshape(n, L, P)
            proj = rms(proj) * m.w["per_layer_proj_norm.weight"]
            te = m.w["per_layer_token_embd.weight"][tokens].reshape(n, L, P) * np.sqrt(P)
            pl = (proj + te) / np.sqrt(2.0)
        for il in range(L):
            p = f"blk.{il}."
            hd, nkv = g4["hd"][il], g4["nkv"][il]
            group = nh // nkv
            h = m.rmsnorm(x, p + "attn_norm.weight")
            q = m.rmsnorm_heads(m.matmul(h, p + "attn_q.weight").reshape(n, nh, hd),
                                p + "attn_q_norm.weight")
            q = m.rope_g4(q, pos, il)
            src = g4["src"][il] if g4["shared_kv"] else il
            if il < g4["n_kv"] or not g4["shared_kv"]:
                k = m.matmul(h, p + "attn_k.weight").reshape(n, nkv, hd)
                v = m.matmul(h, p + "attn_v.weight").reshape(n, nkv, hd) \
                    if p + "attn_v.weight" in m.w else k.copy()
                k = m.rope_g4(m.rmsnorm_heads(k, p + "attn_k_norm.weight"), pos, il)
                if g4["v_norm"]:
                    v = rms(v)
                if self.k[il].shape[0] == 0:  # this layer's head layout
                    self.k[il] = self.v[il] = np.zeros((0, nkv, hd), m.dtype)
                self.k[il] = np.concatenate([self.k[il], k])
                self.v[il] = np.concatenate([self.v[il], v])
            kk = np.repeat(self.k[src], group, axis=1)
            vv = np.repeat(self.v[src], group, axis=1)
            sc = np.einsum("thd,shd->hts", q, kk) * m.dtype(m.q_scale)
            lmask = mask
            if m.swa[il]:
                lmask = mask | (pos[:, None] - np.arange(n_keys)[None, :] >= m.swa[il])
            sc = np.where(lmask[None], -np.inf, sc)
            sc = np.exp(sc - sc.max(axis=2, keepdims=True))
            sc /= sc.sum(axis=2, keepdims=True)
            att = np.einsum("hts,shd->thd", sc, vv).reshape(n, nh * hd)
            x = x + m.rmsnorm(m.matmul(att, p + "attn_output.weight"),
                              p + "post_attention_norm.weight")
            h = m.rmsnorm(x, p + "ffn_norm.weight")
            a = gelu(m.matmul(h, p + "ffn_gate.weight")) * m.matmul(h, p + "ffn_up.weight")
            y = m.matmul(a, p + "ffn_down.weight")
            if g4["moe"]:  # the dense MLP and the experts, each normed, summed
                y = m.rmsnorm(y, p + "post_ffw_norm_1.weight") + \
                    m.rmsnorm(m.moe_gemma4(x, p), p + "post_ffw_norm_2.weight")
            x = x + m.rmsnorm(y, p + "post_ffw_norm.weight")
            if pl is not None:
                gt = gelu(m.matmul(x, p + "inp_gate.weight")) * pl[:, il]
                x = x + m.rmsnorm(m.matmul(gt, p + "proj.weight"), p + "post_norm.weight")
            if g4["out_scale"] and p + "layer_output_scale.weight" in m.w:
                x = x * m.w[p + "layer_output_scale.weight"][0]
        self.pos += n
        h = m.rmsnorm(x, "output_norm.weight")
        logits = m.matmul(h, m.out_name)
        if m.final_softcap:
            logits = m.final_softcap * np.tanh(logits / m.final_softcap)
        return logits

    def forward(self, tokens):
        """Logits (len(tokens), n_vocab), float64, for tokens at positions pos, pos+1, ..."""
        m = self.m
        if m.g4 is not None:
            tokens = np.asarray(tokens, dtype=np.int64)
            if tokens.min() < 0 or tokens.max() >= m.n_vocab:
                raise ValueError("token id outside the vocabulary")
            return self.forward_gemma4(tokens)
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        if tokens.min() < 0 or tokens.max() >= m.n_vocab:
            raise ValueError("token id outside the vocabulary")
        pos = np.arange(self.pos, self.pos + n)
        x = m.w["token_embd.weight"][tokens] * m.dtype(m.embd_scale)
        hd, nh, nkv = m.head_dim, m.n_head, m.n_head_kv
        group = nh // nkv
        # causal mask over all keys so far: query t (position pos[t]) sees keys 0..pos[t]
        n_keys = self.pos + n
        mask = np.arange(n_keys)[None, :] > pos[:, None]
        for L in range(m.n_layer):
            p = f"blk.{L}."
            h = m.rmsnorm(x, p + "attn_norm.weight") if p + "attn_norm.weight" in m.w else x
            if m.mla:
                x = x + m.mla_attention(self, L, h, pos, mask)
                h = m.rmsnorm(x, p + "ffn_norm.weight")
                if L >= m.n_dense_lead:
                    x = x + m.moe_deepseek2(h, p)
                    continue
                g = m.matmul(h, p + "ffn_gate.weight")
                u = m.matmul(h, p + "ffn_up.weight")
                x = x + m.matmul(g / (1.0 + np.exp(-g)) * u, p + "ffn_down.weight")
                continue
            q = m.matmul(h, p + "attn_q.weight")
            k = m.matmul(h, p + "attn_k.weight")
            v = m.matmul(h, p + "attn_v.weight")
            if p + "attn_q.bias" in m.w:
                q = q + m.w[p + "attn_q.bias"]
                k = k + m.w[p + "attn_k.bias"]
                v = v + m.w[p + "attn_v.bias"]
            if p + "attn_q_norm.weight" in m.w and len(m.w[p + "attn_q_norm.weight"]) == nh * hd:
                q = m.rmsnorm(q, p + "attn_q_norm.weight")  # the whole projection (olmo2)
                k = m.rmsnorm(k, p + "attn_k_norm.weight")
            q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
            if p + "attn_q_norm.weight" in m.w and len(m.w[p + "attn_q_norm.weight"]) == hd:
                q = m.rmsnorm_heads(q, p + "attn_q_norm.weight")
                k = m.rmsnorm_heads(k, p + "attn_k_norm.weight")
            if m.use_rope[L]:
                base, scale = m.layer_rope[L]
                q = m.rope(q, pos, base, scale)
                k = m.rope(k, pos, base, scale)
            self.k[L] = np.concatenate([self.k[L], k])
            self.v[L] = np.concatenate([self.v[L], v])
            # (keys, nh, hd): query head h reads kv head h // group
            kk = np.repeat(self.k[L], group, axis=1)
            vv = np.repeat(self.v[L], group, axis=1)
            s = np.einsum("thd,shd->hts", q, kk) * m.dtype(m.q_scale)
            if m.attn_softcap:
                s = m.attn_softcap * np.tanh(s / m.attn_softcap)
            lmask = mask
            if m.swa[L]:  # query at p sees keys p - window + 1 .. p
                lmask = mask | (pos[:, None] - np.arange(n_keys)[None, :] >= m.swa[L])
            s = np.where(lmask[None], -np.inf, s)
            sink = m.w.get(p + "attn_sinks.weight")
            mx = s.max(axis=2, keepdims=True)
            if sink is not None:  # (nh,) one logit per query head, in the max and the sum
                mx = np.maximum(mx, sink[:, None, None])
            s = np.exp(s - mx)
            den = s.sum(axis=2, keepdims=True)
            if sink is not None:
                den = den + np.exp(sink[:, None, None] - mx)
            s /= den
            att = np.einsum("hts,shd->thd", s, vv).reshape(n, nh * hd)
            o = m.matmul(att, p + "attn_output.weight")
            if p + "attn_output.bias" in m.w:
                o = o + m.w[p + "attn_output.bias"]
            if m.gptoss:  # post_attention_norm is the FFN's pre-norm
                x = x + o
                h = m.rmsnorm(x, p + "post_attention_norm.weight")
                x = x + m.moe(h, p)
                continue
            if p + "post_attention_norm.weight" in m.w:
                o = m.rmsnorm(o, p + "post_attention_norm.weight")
            x = x + o * m.residual_scale
            h = m.rmsnorm(x, p + "ffn_norm.weight") if p + "ffn_norm.weight" in m.w else x
            if m.n_expert:
                x = x + m.moe(h, p)
                continue
            g = m.matmul(h, p + "ffn_gate.weight")
            u = m.matmul(h, p + "ffn_up.weight")
            if m.gelu:  # the tanh approximation
                a = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
            else:
                a = g / (1.0 + np.exp(-g))
            o = m.matmul(a * u, p + "ffn_down.weight")
            if p + "post_ffw_norm.weight" in m.w:
                o = m.rmsnorm(o, p + "post_ffw_norm.weight")
            x = x + o * m.residual_scale
        self.pos += n
        h = m.rmsnorm(x, "output_norm.weight")
        logits = m.matmul(h, m.out_name) / m.logit_scale
        if m.final_softcap:
            logits = m.final_softcap * np.tanh(logits / m.final_softcap)
        return logits


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
