#!/usr/bin/python3
"""llamacpp_ref.py - llama.cpp as an independent oracle: its raw logits for a GGUF model and
token ids, and its quantizer (llama_model_quantize, the code behind llama-quantize).

    import llamacpp_ref as L
    ok, why = L.available()              # False + reason when no prebuilt llama.cpp is found
    x = L.logits("m.gguf", [1, 2, 3], kv_type="f32")   # np.float32 (n_tok, n_vocab)
    L.quantize("m-f32.gguf", "m-q4km.gguf", "Q4_K_M")  # writes what llama-quantize writes

The library is the prebuilt llama.cpp that the npm package node-llama-cpp ships
(@node-llama-cpp/linux-x64, bins/linux-x64/libllama*.so and libggml*.so), looked for under
tests/node/node_modules first and bench/node_modules second (or $SAMPAN_LLAMACPP_DIR). The
ctypes declarations below are written from llama.h of exactly that build (llama.cpp release
v0.4.0, ggml 0.23.0, node-llama-cpp 3.21.1); other builds are refused because the structs
passed by value change between releases, and a wrong layout would silently set the wrong
fields.

Isolation: by default each call runs in a child Python process (this file's command-line
mode), so an abort inside llama.cpp (it calls abort() on some internal asserts) shows up as
an error of that call instead of killing the whole test file; the child also keeps
llama.cpp's global state (backends, log callback) out of the test process.
Threads: llama.cpp's CPU backend with n_threads threads (default 1) inside the call.
Memory: the model and a context of len(tokens) positions live only for the call; the
logits come back as a fresh NumPy array.
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The build these declarations were written for (checked before anything is called).
NLC_VERSION = "3.21.1"
LLAMA_RELEASE = "v0.4.0"
GGML_VERSION = "0.23.0"

_PKG = os.path.join("node_modules", "@node-llama-cpp", "linux-x64")
_BINS = os.path.join("bins", "linux-x64")
SEARCH = [os.path.join(ROOT, "tests", "node", _PKG), os.path.join(ROOT, "bench", _PKG)]

# ggml_type numbers (ggml.h) for the KV cache choice and for reading tensor types.
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
             "q8_1": 9, "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14,
             "q8_k": 15, "iq2_xxs": 16, "iq2_xs": 17, "iq3_xxs": 18, "iq1_s": 19,
             "iq4_nl": 20, "iq3_s": 21, "iq2_s": 22, "iq4_xs": 23, "i8": 24, "i16": 25,
             "i32": 26, "i64": 27, "f64": 28, "iq1_m": 29, "bf16": 30, "tq1_0": 34,
             "tq2_0": 35, "mxfp4": 39, "nvfp4": 40, "q1_0": 41, "q2_0": 42}
GGML_TYPE_NAME = {v: k for k, v in GGML_TYPE.items()}

# llama_ftype numbers (llama.h): the "mixes" of llama-quantize.
FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
         "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
         "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "Q2_K_S": 21, "IQ4_NL": 25, "IQ4_XS": 30,
         "BF16": 32, "MXFP4_MOE": 38}

_LIBS = ["libggml-base.so", "libggml.v0.4.0.so", "libllama.v0.4.0.so"]


def _pkg_ok(pkg):
    """None when `pkg` holds the expected build, else why not."""
    bins = os.path.join(pkg, _BINS)
    for f in _LIBS:
        if not os.path.isfile(os.path.join(bins, f)):
            return f"{os.path.join(bins, f)} missing"
    try:
        with open(os.path.join(pkg, "package.json")) as f:
            ver = json.load(f).get("version")
        with open(os.path.join(bins, "_nlcBuildMetadata.json")) as f:
            rel = json.load(f)["buildOptions"]["llamaCpp"]["release"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{pkg}: unreadable package metadata ({e})"
    if ver != NLC_VERSION or rel != LLAMA_RELEASE:
        return (f"{pkg}: node-llama-cpp {ver} / llama.cpp {rel}, the declarations here are "
                f"for {NLC_VERSION} / {LLAMA_RELEASE}")
    return None


def find_libdir():
    """(directory of the .so files, None) or (None, reason)."""
    cands = ([os.environ["SAMPAN_LLAMACPP_DIR"]] if os.environ.get("SAMPAN_LLAMACPP_DIR")
             else SEARCH)
    why = []
    for pkg in cands:
        if not os.path.isdir(pkg):
            why.append(f"{pkg} absent")
            continue
        bad = _pkg_ok(pkg)
        if bad is None:
            return os.path.join(pkg, _BINS), None
        why.append(bad)
    return None, "no prebuilt llama.cpp (" + "; ".join(why) + ")"


def tensor_types(path):
    """{tensor name: ggml type name} of a GGUF file (its header only; any tensor type)."""
    import mmap
    import struct
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    pos = 4  # after the magic

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def skip_str():
        nonlocal pos
        (n,) = take("<Q")
        pos += n

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(vt):
        nonlocal pos
        if vt in scalar:
            pos += scalar[vt]
        elif vt == 8:
            skip_str()
        elif vt == 9:
            et, n = take("<IQ")
            if et in scalar:
                pos += scalar[et] * n
            else:
                for _ in range(n):
                    skip_value(et)
        else:
            raise ValueError(f"{path}: metadata value type {vt}")

    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    _, n_t, n_kv = take("<IQQ")
    for _ in range(n_kv):
        skip_str()
        (vt,) = take("<I")
        skip_value(vt)
    out = {}
    for _ in range(n_t):
        (n,) = take("<Q")
        name = bytes(data[pos:pos + n]).decode()
        pos += n
        (nd,) = take("<I")
        take(f"<{nd}Q")
        tt, _ = take("<IQ")
        out[name] = GGML_TYPE_NAME.get(tt, f"type{tt}")
    data.close()
    return out


def available():
    """(True, libdir) or (False, reason): whether the oracle can run here."""
    d, why = find_libdir()
    return (True, d) if d else (False, why)


# ---- ctypes declarations (from llama.h / ggml.h of release v0.4.0) ------------------------

c_int32, c_uint32, c_float, c_bool, c_void_p, c_char_p = (
    ctypes.c_int32, ctypes.c_uint32, ctypes.c_float, ctypes.c_bool, ctypes.c_void_p,
    ctypes.c_char_p)


class ModelParams(ctypes.Structure):
    _fields_ = [("devices", c_void_p), ("tensor_buft_overrides", c_void_p),
                ("n_gpu_layers", c_int32), ("split_mode", c_int32), ("load_mode", c_int32),
                ("lazy_mode", c_int32), ("main_gpu", c_int32), ("tensor_split", c_void_p),
                ("progress_callback", c_void_p), ("progress_callback_user_data", c_void_p),
                ("kv_overrides", c_void_p), ("vocab_only", c_bool), ("check_tensors", c_bool),
                ("use_extra_bufts", c_bool), ("no_host", c_bool), ("no_alloc", c_bool),
                ("load_mtp", c_bool)]


class ContextParams(ctypes.Structure):
    _fields_ = [("n_ctx", c_uint32), ("n_batch", c_uint32), ("n_ubatch", c_uint32),
                ("n_seq_max", c_uint32), ("n_rs_seq", c_uint32), ("n_outputs_max", c_uint32),
                ("n_outputs_max_per_seq", c_uint32), ("n_threads", c_int32),
                ("n_threads_batch", c_int32), ("ctx_type", c_int32),
                ("rope_scaling_type", c_int32), ("pooling_type", c_int32),
                ("attention_type", c_int32), ("flash_attn_type", c_int32),
                ("rope_freq_base", c_float), ("rope_freq_scale", c_float),
                ("yarn_ext_factor", c_float), ("yarn_attn_factor", c_float),
                ("yarn_beta_fast", c_float), ("yarn_beta_slow", c_float),
                ("yarn_orig_ctx", c_uint32), ("defrag_thold", c_float),
                ("cb_eval", c_void_p), ("cb_eval_user_data", c_void_p),
                ("type_k", c_int32), ("type_v", c_int32),
                ("abort_callback", c_void_p), ("abort_callback_data", c_void_p),
                ("embeddings", c_bool), ("offload_kqv", c_bool), ("no_perf", c_bool),
                ("op_offload", c_bool), ("swa_full", c_bool), ("kv_unified", c_bool),
                ("samplers", c_void_p), ("n_samplers", ctypes.c_size_t),
                ("ctx_other", c_void_p)]


class QuantizeParams(ctypes.Structure):
    _fields_ = [("nthread", c_int32), ("ftype", c_int32), ("output_tensor_type", c_int32),
                ("token_embedding_type", c_int32), ("allow_requantize", c_bool),
                ("quantize_output_tensor", c_bool), ("only_copy", c_bool), ("pure", c_bool),
                ("keep_split", c_bool), ("dry_run", c_bool), ("imatrix", c_void_p),
                ("kv_overrides", c_void_p), ("tt_overrides", c_void_p),
                ("prune_layers", c_void_p), ("max_buf_size", ctypes.c_size_t)]


class Batch(ctypes.Structure):
    _fields_ = [("n_tokens", c_int32), ("token", ctypes.POINTER(c_int32)),
                ("embd", ctypes.POINTER(c_float)), ("pos", ctypes.POINTER(c_int32)),
                ("n_seq_id", ctypes.POINTER(c_int32)),
                ("seq_id", ctypes.POINTER(ctypes.POINTER(c_int32))),
                ("logits", ctypes.POINTER(ctypes.c_int8))]


# Sizes and offsets measured with the C compiler on llama.h v0.4.0 (x86-64): a mismatch
# means the declarations above are wrong.
_LAYOUT = [(ModelParams, 80, "load_mtp", 77), (ContextParams, 160, "ctx_other", 152),
           (ContextParams, 160, "type_k", 104), (QuantizeParams, 64, "max_buf_size", 56),
           (Batch, 56, "logits", 48)]

_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, c_char_p, c_void_p)


class _Lib:
    """The loaded libraries (one per process)."""

    def __init__(self, libdir):
        for cls, size, field, off in _LAYOUT:
            if ctypes.sizeof(cls) != size or getattr(cls, field).offset != off:
                raise RuntimeError(f"ctypes layout of {cls.__name__} does not match llama.h")
        mode = ctypes.RTLD_GLOBAL
        self.base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=mode)
        self.ggml = ctypes.CDLL(os.path.join(libdir, "libggml.v0.4.0.so"), mode=mode)
        self.llama = ctypes.CDLL(os.path.join(libdir, "libllama.v0.4.0.so"), mode=mode)
        self.base.ggml_version.restype = c_char_p
        got = self.base.ggml_version().decode()
        if got != GGML_VERSION:
            raise RuntimeError(f"ggml {got} in {libdir}, expected {GGML_VERSION}")
        # llama.cpp's log goes to a buffer: errors quote its last lines.
        self.log = []

        def on_log(level, text, ud):
            if text:
                self.log.append(text.decode("utf-8", "replace"))
                del self.log[:-200]
        self._cb = _LOG_CB(on_log)
        L = self.llama
        L.llama_log_set.argtypes = [_LOG_CB, c_void_p]
        L.llama_log_set(self._cb, None)
        self.ggml.ggml_backend_load_all_from_path.argtypes = [c_char_p]
        self.ggml.ggml_backend_load_all_from_path(libdir.encode())
        L.llama_backend_init()
        L.llama_model_default_params.restype = ModelParams
        L.llama_context_default_params.restype = ContextParams
        L.llama_model_quantize_default_params.restype = QuantizeParams
        L.llama_model_load_from_file.argtypes = [c_char_p, ModelParams]
        L.llama_model_load_from_file.restype = c_void_p
        L.llama_model_free.argtypes = [c_void_p]
        L.llama_init_from_model.argtypes = [c_void_p, ContextParams]
        L.llama_init_from_model.restype = c_void_p
        L.llama_free.argtypes = [c_void_p]
        L.llama_model_get_vocab.argtypes = [c_void_p]
        L.llama_model_get_vocab.restype = c_void_p
        L.llama_vocab_n_tokens.argtypes = [c_void_p]
        L.llama_vocab_n_tokens.restype = c_int32
        L.llama_batch_init.argtypes = [c_int32, c_int32, c_int32]
        L.llama_batch_init.restype = Batch
        L.llama_batch_free.argtypes = [Batch]
        L.llama_decode.argtypes = [c_void_p, Batch]
        L.llama_decode.restype = c_int32
        L.llama_get_logits_ith.argtypes = [c_void_p, c_int32]
        L.llama_get_logits_ith.restype = ctypes.POINTER(c_float)
        L.llama_model_quantize.argtypes = [c_char_p, c_char_p, ctypes.POINTER(QuantizeParams)]
        L.llama_model_quantize.restype = c_uint32

    def tail(self, n=8):
        return " | ".join(s.strip() for s in self.log[-n:] if s.strip())


_lib = None


def _load():
    global _lib
    if _lib is None:
        d, why = find_libdir()
        if d is None:
            raise RuntimeError(why)
        _lib = _Lib(d)
    return _lib


_FLASH = {None: -1, False: 0, True: 1}


def _logits_here(path, tokens, kv_type, n_threads, flash_attn, ubatch):
    """The work of logits() in this process."""
    lib = _load()
    L = lib.llama
    if kv_type not in ("f32", "f16", "bf16", "q8_0"):
        raise ValueError(f"kv_type {kv_type!r}: f32, f16, bf16 or q8_0")
    tokens = [int(t) for t in tokens]
    n = len(tokens)
    if n == 0:
        raise ValueError("no tokens")
    ub = n if not ubatch else int(ubatch)
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    # No extra buffer types (the repacked and AMX weight layouts): on a CPU with AMX this
    # build's AMX buffer type aborts on some models' graphs (ggml-backend.cpp:
    # GGML_ASSERT(*cur_backend_id != -1)), and the oracle needs only llama.cpp's plain
    # kernels, the same on every CPU.
    mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(os.fsencode(path), mp)
    if not model:
        raise RuntimeError(f"llama.cpp cannot load {path}: {lib.tail()}")
    ctx = None
    batch = None
    try:
        nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        bad = [t for t in tokens if not 0 <= t < nv]
        if bad:
            raise ValueError(f"token {bad[0]} outside the vocabulary of {nv}")
        cp = L.llama_context_default_params()
        cp.n_ctx = max(n, 16)
        cp.n_batch = max(ub, 1)
        cp.n_ubatch = max(ub, 1)
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.type_k = cp.type_v = GGML_TYPE[kv_type]
        cp.flash_attn_type = _FLASH[flash_attn]
        cp.no_perf = True
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise RuntimeError(f"llama.cpp cannot make a context for {path}: {lib.tail()}")
        out = np.empty((n, nv), dtype=np.float32)
        batch = L.llama_batch_init(ub, 0, 1)
        for start in range(0, n, ub):
            m = min(ub, n - start)
            batch.n_tokens = m
            for i in range(m):
                batch.token[i] = tokens[start + i]
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}: {lib.tail()}")
            for i in range(m):
                p = L.llama_get_logits_ith(ctx, i)
                if not p:
                    raise RuntimeError(f"no logits for position {start + i}: {lib.tail()}")
                out[start + i] = np.ctypeslib.as_array(p, shape=(nv,))
        return out
    finally:
        if batch is not None:
            L.llama_batch_free(batch)
        if ctx:
            L.llama_free(ctx)
        L.llama_model_free(model)


def _quantize_here(src, dst, ftype, nthread, pure):
    lib = _load()
    L = lib.llama
    code = ftype if isinstance(ftype, int) else FTYPE.get(str(ftype).upper())
    if code is None:
        raise ValueError(f"unknown ftype {ftype!r} (one of {', '.join(FTYPE)})")
    qp = L.llama_model_quantize_default_params()
    qp.nthread = nthread
    qp.ftype = code
    qp.pure = bool(pure)
    rc = L.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(qp))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {ftype} failed: {lib.tail()}")


def _child(mode, args, timeout):
    """Run this file's command-line mode in a child process; raise its error text."""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), mode] + args,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        if r.returncode < 0:
            msg = f"llama.cpp died (signal {-r.returncode}): {r.stderr.strip()[-400:]}"
        raise RuntimeError(msg)


def logits(path, tokens, kv_type="f32", n_threads=1, flash_attn=False, ubatch=0,
           isolate=True, timeout=300):
    """llama.cpp's raw logits, np.float32 of shape (len(tokens), n_vocab): row p is the
    output after tokens[0..p] at positions 0..p (one sequence, all positions output).
    kv_type: the K and V cache type (f32, f16, bf16, q8_0). flash_attn: False, True or
    None (llama.cpp decides). ubatch: positions per llama_decode call (0: all at once; 1:
    one token at a time, the decode path). Raises RuntimeError with llama.cpp's own message
    when it refuses the model."""
    if not isolate:
        return _logits_here(path, tokens, kv_type, n_threads, flash_attn, ubatch)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.npy")
        _child("logits", [path, out, kv_type, str(n_threads), repr(flash_attn), str(ubatch),
                          ",".join(str(int(t)) for t in tokens)], timeout)
        return np.load(out)


def quantize(src, dst, ftype, nthread=1, pure=False, isolate=True, timeout=600):
    """Write `dst` from `src` with llama_model_quantize and its default parameters (what
    `llama-quantize src dst FTYPE` writes, per-tensor mix included). ftype: a name of FTYPE
    ("Q4_K_M", ...) or a llama_ftype number; pure: every tensor in the ftype's base type."""
    if not isolate:
        return _quantize_here(src, dst, ftype, nthread, pure)
    _child("quantize", [src, dst, str(ftype), str(nthread), "1" if pure else "0"], timeout)


def _main(argv):
    mode = argv[0] if argv else ""
    try:
        if mode == "logits" and len(argv) == 8:
            path, out, kv, nt, fa, ub, toks = argv[1:]
            fa = {"None": None, "False": False, "True": True}[fa]
            x = _logits_here(path, [int(t) for t in toks.split(",") if t], kv, int(nt), fa,
                             int(ub))
            np.save(out, x)
        elif mode == "quantize" and len(argv) == 6:
            src, dst, ft, nt, pure = argv[1:]
            _quantize_here(src, dst, int(ft) if ft.isdigit() else ft, int(nt), pure == "1")
        elif mode == "check":
            ok, d = available()
            print(d)
            return 0 if ok else 1
        else:
            print("usage: llamacpp_ref.py logits MODEL OUT.npy KV THREADS FLASH UBATCH T,T,.. |"
                  " quantize SRC DST FTYPE THREADS PURE | check", file=sys.stderr)
            return 2
    except (RuntimeError, ValueError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
