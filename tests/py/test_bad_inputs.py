"""test_bad_inputs.py - every row of ../shared/RELIABILITY.md's bad-input tables (2a GGUF files
G1-G20, 2b request parameters P1-P16, 2c HTTP protocol and server surface H1-H13, 2d
repository, paths and IPC R1-R7) as cases named by their id, run against the real binary
($SAMPAN_BIN, default build/sampan; tests/run.sh also runs it against the ASan+UBSan build).

  GGUF rows: files written by this script (a tiny valid llama model built with struct, then
      broken one field at a time) and checked with `sampan inspect` (the reader) or `sampan run`
      (the whole load: hyper-parameters, vocabulary, template): refused with exit status 1 and
      one error line naming the file, no sanitizer report.
  Request rows: `sampan serve` on the demo model (tests/py/common.py Server); each bad request
      must get its 4xx with a JSON error object, and the server must still answer /live.
  Protocol rows: raw sockets (oversized heads, chunked bodies, slow clients, pipelining and
      desync, smuggling headers, disconnects, keys, CORS, log injection).
  Repository rows: a temporary Triton-style repository with traversal names, symlinks out of
      it, a FIFO, a directory and /dev/zero as model files.

Rows that do not apply to Sampan (P16 base64 embeddings, R3 manifests, R5 runtime path APIs,
G20 CUDA sizes, ...) still get a case that checks the safe behaviour holds (the field is
ignored or refused, the route does not exist, the digest is checked), or a skip with the
reason. Every server is stopped at the end and must exit cleanly with no sanitizer report.

Prints "bad-inputs: N cases run" and, last, "bad-inputs: N passed, N failed, N skipped".
"""
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from common import DEMO_MODEL, ROOT, Server, Suite, binary, raw_exchange

os.environ.setdefault("ASAN_OPTIONS", "detect_leaks=1")
os.environ.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")

s = Suite("bad-inputs")
exe = binary()
T0 = time.time()
SAN_RE = re.compile(r"AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:")
TMP = tempfile.mkdtemp(prefix="sp-bad-inputs-")


def case(cid, name, ok, detail=""):
    return s.case(f"{cid} {name}", bool(ok), str(detail)[:600] if not ok else "")


def xfail(cid, name, ok, bug):
    """A known bug: a failure is reported as a skip naming the bug; a pass is a pass (fixed)."""
    if ok:
        return s.case(f"{cid} {name}", True, "known bug fixed: " + bug)
    s.skip(f"{cid} {name}", "expected failure, known bug: " + bug)
    return False


def skip(cid, name, why):
    s.skip(f"{cid} {name}", why)


def sanitizer_free(text):
    return SAN_RE.search(text) is None


# ================================================================ HTTP helpers

def http_req(port, method, path, body=None, headers=None, timeout=10):
    """(status, headers dict with lower-case names, body bytes); body may be bytes or JSON."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def responses(buf):
    """Split a byte stream into [(status, headers, body)] (Content-Length or chunked)."""
    out = []
    while buf.startswith(b"HTTP/1."):
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            break
        head = buf[:end].decode("latin-1").split("\r\n")
        st = int(head[0].split()[1])
        h = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            h[k.strip().lower()] = v.strip()
        rest = buf[end + 4:]
        if st == 100:
            buf = rest
            continue
        if "content-length" in h:
            n = int(h["content-length"])
            body, buf = rest[:n], rest[n:]
        elif h.get("transfer-encoding") == "chunked":
            body, o = b"", 0
            while True:
                e = rest.find(b"\r\n", o)
                if e < 0:
                    break
                n = int(rest[o:e].split(b";")[0] or b"0", 16)
                if n == 0:
                    o = e + 4
                    break
                body += rest[e + 2:e + 2 + n]
                o = e + 2 + n + 2
            buf = rest[o:]
        else:
            body, buf = rest, b""
        out.append((st, h, body))
    return out


def err_obj(body):
    """The error object of a JSON error answer ({"error": {...}} or KServe's {"error": "..."})."""
    try:
        j = json.loads(body)
    except (ValueError, TypeError):
        return None
    e = j.get("error") if isinstance(j, dict) else None
    if isinstance(e, str):
        return {"message": e}
    return e if isinstance(e, dict) and isinstance(e.get("message"), str) else None


def alive(port):
    try:
        return http_req(port, "GET", "/live", timeout=5)[0] == 200
    except OSError:
        return False


def rejected(port, got, want, param=None, needle=None):
    """A 4xx (want: a status or a tuple) with a JSON error object, the server still alive."""
    st, _, body = got
    e = err_obj(body)
    wants = want if isinstance(want, tuple) else (want,)
    ok = st in wants and e is not None and alive(port)
    if ok and param is not None:
        ok = e.get("param") == param
    if ok and needle is not None:
        ok = needle.lower() in e.get("message", "").lower()
    return ok, f"status {st}, want {want}; {body[:200]!r}"


def completion(**kw):
    b = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    b.update(kw)
    return {k: v for k, v in b.items() if v is not ...}


def stop_server(srv, name):
    """Stop a server; the case passes when it exits 0 and logged no sanitizer report."""
    rc = srv.stop()
    log = srv.text()
    bad = SAN_RE.search(log)
    case("--", f"{name}: clean exit, no sanitizer report", rc == 0 and not bad,
         f"exit {rc}; " + (log[max(0, bad.start() - 200):bad.start() + 1500] if bad else log[-800:]))


# ================================================================ GGUF writer

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
          U64: "<Q", I64: "<q", F64: "<d"}
GT_F32, GT_Q8_0 = 0, 8


def gstr(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def value(vtype, v, et=None):
    """Encoded type + value of one metadata entry."""
    out = struct.pack("<I", vtype)
    if vtype == STR:
        return out + gstr(v)
    if vtype == ARR:
        out += struct.pack("<IQ", et, len(v))
        if et == STR:
            return out + b"".join(gstr(x) for x in v)
        return out + b"".join(struct.pack(SCALAR[et], x) for x in v)
    return out + struct.pack(SCALAR[vtype], v)


class Gguf:
    """A tiny llama model (1 layer, 32 wide, 260-token SPM vocabulary, F32 zeros) whose every
    header field can be broken before write()."""

    def __init__(self):
        self.magic, self.version, self.alignment = b"GGUF", 3, 32
        self.n_kv = self.n_tensors = None  # None: the real counts
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581a"]
        types = [2, 3, 3] + [6] * 256 + [1]
        d, ff = 32, 64
        self.kv = [  # (key bytes, encoded value)
            ("general.architecture", value(STR, "llama")),
            ("general.name", value(STR, "bad-inputs")),
            ("general.alignment", value(U32, 32)),
            ("llama.context_length", value(U32, 64)),
            ("llama.embedding_length", value(U32, d)),
            ("llama.feed_forward_length", value(U32, ff)),
            ("llama.block_count", value(U32, 1)),
            ("llama.attention.head_count", value(U32, 2)),
            ("llama.attention.head_count_kv", value(U32, 2)),
            ("llama.attention.layer_norm_rms_epsilon", value(F32, 1e-5)),
            ("llama.rope.freq_base", value(F32, 10000.0)),
            ("llama.rope.dimension_count", value(U32, d // 2)),
            ("llama.vocab_size", value(U32, len(toks))),
            ("tokenizer.ggml.model", value(STR, "llama")),
            ("tokenizer.ggml.tokens", value(ARR, toks, STR)),
            ("tokenizer.ggml.scores", value(ARR, [0.0] * 259 + [-1.0], F32)),
            ("tokenizer.ggml.token_type", value(ARR, types, I32)),
            ("tokenizer.ggml.unknown_token_id", value(U32, 0)),
            ("tokenizer.ggml.bos_token_id", value(U32, 1)),
            ("tokenizer.ggml.eos_token_id", value(U32, 2)),
        ]
        self.n_vocab = len(toks)
        self.tensors = [["token_embd.weight", [d, len(toks)], GT_F32]]
        for name, ne in (("attn_norm", [d]), ("attn_q", [d, d]), ("attn_k", [d, d]),
                         ("attn_v", [d, d]), ("attn_output", [d, d]), ("ffn_norm", [d]),
                         ("ffn_gate", [d, ff]), ("ffn_up", [d, ff]), ("ffn_down", [ff, d])):
            self.tensors.append([f"blk.0.{name}.weight", ne, GT_F32])
        self.tensors.append(["output_norm.weight", [d], GT_F32])
        self.offsets = None  # None: running aligned sums
        self.raw_kv = []     # extra raw entries appended after self.kv
        self.tail = b""      # bytes after the data

    def set(self, key, enc):
        for i, (k, _) in enumerate(self.kv):
            if k == key:
                self.kv[i] = (key, enc)
                return self
        self.kv.append((key, enc))
        return self

    def drop(self, key):
        self.kv = [(k, v) for k, v in self.kv if k != key]
        return self

    @staticmethod
    def nbytes(ne, t):
        """Data bytes (F32 size for types we do not write); 0 for shapes that are broken on purpose."""
        if min(ne) < 0 or max(ne) >= 1 << 20:
            return 0
        n = 1
        for x in ne:
            n *= x
        return n // 32 * 34 if t == GT_Q8_0 else n * 4

    def build(self):
        kvb = [gstr(k) + v for k, v in self.kv] + self.raw_kv
        offs, off = [], 0
        for name, ne, t in self.tensors:
            off = (off + 31) // 32 * 32
            offs.append(off)
            off += self.nbytes(ne, t)
        if self.offsets is not None:
            offs = self.offsets
        head = bytearray(self.magic + struct.pack(
            "<IQQ", self.version, len(self.tensors) if self.n_tensors is None else self.n_tensors,
            len(kvb) if self.n_kv is None else self.n_kv))
        for b in kvb:
            head += b
        for (name, ne, t), o in zip(self.tensors, offs):
            head += gstr(name) + struct.pack("<I", len(ne)) + b"".join(
                struct.pack("<Q", x & (2 ** 64 - 1)) for x in ne) + struct.pack("<IQ", t, o)
        head += b"\0" * (-len(head) % 32)
        return bytes(head) + b"\0" * off + self.tail

    def write(self, name):
        p = os.path.join(TMP, name)
        with open(p, "wb") as f:
            f.write(self.build())
        return p


def cli(args, timeout=60):
    try:
        r = subprocess.run([exe] + args, capture_output=True, text=True, errors="replace",
                           timeout=timeout, cwd=ROOT)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout} s"


def load_with(tool, path):
    if tool == "inspect":
        return cli(["inspect", path])
    return cli(["run", "-m", path, "-p", "a", "-n", "1", "-t", "1", "-c", "16", "--temp", "0"])


def refused(tool, path, needle=None):
    """(ok, detail): exit status 1, a message naming the file, no sanitizer report."""
    rc, out, err = load_with(tool, path)
    base = os.path.basename(path)
    msg = err.strip().splitlines()[-1] if err.strip() else ""
    ok = rc == 1 and base in err and sanitizer_free(err)
    if ok and needle:
        ok = re.search(needle, err, re.I) is not None
    return ok, f"exit {rc}: {msg[:300]}" if ok else f"exit {rc}: {err[-1500:]}"


def g_case(cid, name, tool, model, needle=None):
    p = model.write(f"{cid}-{re.sub(r'[^a-z0-9]+', '-', name.lower())[:40]}.gguf")
    ok, detail = refused(tool, p, needle)
    case(cid, name, ok, detail)


def gguf_cases():
    base = Gguf()
    good = base.write("base.gguf")
    rc, out, err = load_with("run", good)
    if not case("G0", "the crafted base model loads and generates (so each break below is the "
                "cause of its refusal)", rc == 0 and sanitizer_free(err), err[-800:]):
        return
    # G1 magic and versions
    m = Gguf(); m.magic = b"FUGG"; g_case("G1", "bad magic FUGG", "inspect", m, "magic")
    for v in (0, 1, 4, 0x03000000):
        m = Gguf(); m.version = v
        g_case("G1", f"version {v:#x}", "inspect", m, "version")
    # G2, G3 counts
    for n in (2 ** 64 - 1, 0x1D1D1D1D1D1D1D1D):
        m = Gguf(); m.n_tensors = n; g_case("G2", f"n_tensors {n:#x}", "inspect", m)
    for n in (2 ** 63, 0xFFFFFFFF):
        m = Gguf(); m.n_kv = n; g_case("G3", f"n_kv {n:#x}", "inspect", m)
    # G4 key and string lengths
    for n in (2 ** 64 - 1, 2 ** 63, 1 << 30):
        m = Gguf(); m.raw_kv.append(struct.pack("<Q", n) + b"k" * 8)
        g_case("G4", f"key length {n:#x}", "inspect", m)
        m = Gguf(); m.raw_kv.append(gstr("x.s") + struct.pack("<IQ", STR, n) + b"v" * 8)
        g_case("G4", f"string value length {n:#x}", "inspect", m)
        m = Gguf(); m.tensors[0][0] = "x"
        m.raw_kv.append(gstr("x.arr") + struct.pack("<IIQ", ARR, STR, 1) + struct.pack("<Q", n))
        g_case("G4", f"array string length {n:#x}", "inspect", m)
    # G5 array counts
    for n, et in ((2 ** 62, U64), (2 ** 61, U64), (2 ** 63 + 1, U32), (2 ** 64 - 1, U8)):
        m = Gguf(); m.raw_kv.append(gstr("x.arr") + struct.pack("<IIQ", ARR, et, n) + b"\0" * 16)
        g_case("G5", f"array of {n:#x} elements of type {et}", "inspect", m)
    # G6 nested arrays, unknown types
    m = Gguf(); m.raw_kv.append(gstr("x.nest") + struct.pack("<IIQ", ARR, ARR, 1) +
                                struct.pack("<IQ", U8, 1) + b"\0")
    g_case("G6", "array of arrays", "inspect", m)
    for t in (13, 255, 0xFFFFFFFF):
        m = Gguf(); m.raw_kv.append(gstr("x.t") + struct.pack("<I", t) + b"\0" * 8)
        g_case("G6", f"value type {t}", "inspect", m)
        m = Gguf(); m.raw_kv.append(gstr("x.t") + struct.pack("<IIQ", ARR, t, 1) + b"\0" * 8)
        g_case("G6", f"array element type {t}", "inspect", m)
    # G7 keys and names
    m = Gguf(); m.raw_kv.append(gstr("") + value(U32, 1)); g_case("G7", "empty key", "inspect", m)
    m = Gguf(); m.raw_kv.append(gstr("general.name") + value(STR, "again"))
    g_case("G7", "duplicate key", "inspect", m)
    m = Gguf(); m.tensors[2][0] = m.tensors[1][0]
    g_case("G7", "duplicate tensor name", "inspect", m)
    m = Gguf(); m.tensors.append(["t" * 64, [32], GT_F32])
    g_case("G7", "tensor name of 64 bytes", "inspect", m)
    # G8 n_dims
    for nd in (5, 0xFFFFFFFF):
        m = Gguf()
        m.tensors[1][1] = [32, 1, 1, 1, 1] if nd == 5 else [32]
        data = m.build()
        # patch n_dims of tensor 1 in place (after its name)
        name = m.tensors[1][0].encode()
        i = data.index(gstr(name)) + 8 + len(name)
        data = data[:i] + struct.pack("<I", nd) + data[i + 4:]
        p = os.path.join(TMP, f"G8-ndims-{nd}.gguf")
        with open(p, "wb") as f:
            f.write(data)
        ok, detail = refused("inspect", p, "dim")
        case("G8", f"n_dims {nd:#x}", ok, detail)
    # G9 negative dims and products past int64
    m = Gguf(); m.tensors[1][1] = [-32]; g_case("G9", "ne[0] = -32", "inspect", m)
    m = Gguf(); m.tensors.append(["big", [2 ** 42 + 1, 2 ** 22, 1, 1], GT_F32])
    g_case("G9", "element count (2^42+1) x 2^22 overflows", "inspect", m)
    m = Gguf(); m.tensors.append(["big", [2 ** 62, 4], GT_F32])
    g_case("G9", "byte size 2^62 x 4 x 4 overflows", "inspect", m)
    # G10 types and block sizes
    for t in (40, 2 ** 31, 0xFFFFFFFF):
        m = Gguf(); m.tensors[1][2] = t; g_case("G10", f"tensor type {t:#x}", "inspect", m)
    m = Gguf(); m.tensors.append(["q", [33], GT_Q8_0])
    g_case("G10", "Q8_0 row of 33 (not a multiple of 32)", "inspect", m)
    # G11 offsets
    real = [o for o in _offsets(Gguf())]
    for label, fix in (("overlap", lambda o: o[:2] + [o[1]] + o[3:]),
                       ("backwards", lambda o: [o[1], o[0]] + o[2:]),
                       ("misaligned", lambda o: o[:1] + [o[1] + 4] + o[2:]),
                       ("past EOF", lambda o: o[:-1] + [o[-1] + (1 << 30)]),
                       ("gap", lambda o: o[:1] + [x + 32 for x in o[1:]])):
        m = Gguf(); m.offsets = fix(list(real)); g_case("G11", f"offsets {label}", "inspect", m)
    m = Gguf(); data = m.build()[:-4]
    p = os.path.join(TMP, "G11-last-short.gguf")
    open(p, "wb").write(data)
    ok, detail = refused("inspect", p)
    case("G11", "last tensor ends 4 bytes past the end of the file", ok, detail)
    # G12 sums that wrap
    m = Gguf(); m.tensors += [["i8a", [0x7FFFFFFFFFFFFFC0], 24], ["i8b", [0x7FFFFFFFFFFFFFC0], 24]]
    g_case("G12", "two I8 tensors of 0x7FFFFFFFFFFFFFC0 bytes", "inspect", m)
    m = Gguf(); m.tensors += [["fa", [0x1FFFFFFFFFFFFFF0], GT_F32], ["fb", [0x1FFFFFFFFFFFFFF0], GT_F32]]
    g_case("G12", "two F32 tensors whose padded sizes wrap size_t", "inspect", m)
    # G13 alignment
    for label, enc in (("0", value(U32, 0)), ("13", value(U32, 13)), ("2^30", value(U32, 1 << 30)),
                       ("stored as INT32", value(I32, 32)), ("stored as STRING", value(STR, "32"))):
        m = Gguf().set("general.alignment", enc)
        g_case("G13", f"general.alignment {label}", "inspect", m, "align")
    # G14 element types of the vocabulary arrays
    m = Gguf().set("tokenizer.ggml.scores", value(ARR, [0] * 260, U8))
    g_case("G14", "tokenizer scores stored as UINT8", "run", m)
    m = Gguf().set("tokenizer.ggml.token_type", value(ARR, [1] * 260, U8))
    g_case("G14", "tokenizer token_type stored as UINT8", "run", m)
    m = Gguf().set("tokenizer.ggml.tokens", value(ARR, list(range(260)), U32))
    g_case("G14", "tokenizer tokens stored as UINT32", "run", m)
    # G15 vocabulary consistency
    m = Gguf().set("tokenizer.ggml.tokens", value(ARR, [], STR)).set(
        "tokenizer.ggml.scores", value(ARR, [], F32)).set("tokenizer.ggml.token_type", value(ARR, [], I32))
    g_case("G15", "vocabulary of 0 tokens", "run", m)
    m = Gguf().set("tokenizer.ggml.token_type", value(ARR, [1] * 100, I32))
    g_case("G15", "token_type length differs from tokens", "run", m)
    m = Gguf().set("tokenizer.ggml.scores", value(ARR, [0.0] * 300, F32))
    g_case("G15", "scores length differs from tokens", "run", m)
    m = Gguf().set("tokenizer.ggml.bos_token_id", value(U32, 260))
    g_case("G15", "BOS id = n_vocab", "run", m)
    m = Gguf().set("tokenizer.ggml.eos_token_id", value(I64, -5))
    g_case("G15", "EOS id -5", "run", m)
    m = Gguf().set("tokenizer.ggml.padding_token_id", value(U64, 1 << 31))
    g_case("G15", "padding id 2^31", "run", m)
    for label, key, enc in (("EOS id 0xFFFFFFFF (GGUF's 'none')", "tokenizer.ggml.eos_token_id", value(U32, 0xFFFFFFFF)),
                            ("llama.vocab_size 2^31 (the vocabulary is the token list)", "llama.vocab_size",
                             value(U32, 1 << 31))):
        p = Gguf().set(key, enc).write(f"G15-{key}.gguf")
        rc, out, err = load_with("run", p)
        case("G15", f"{label}: loads with the 260-token vocabulary, nothing sized from it",
             rc == 0 and "vocab=260" in err and sanitizer_free(err), f"exit {rc}: {err[-600:]}")
    # G16 token texts
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581a"]
    for label, bad in (("<0x-1>", "<0x-1>"), ("<0xZZ>", "<0xZZ>"), ("<0x100>", "<0x100>")):
        t = list(toks); t[3 + 0x41] = bad
        m = Gguf().set("tokenizer.ggml.tokens", value(ARR, t, STR))
        g_case("G16", f"byte token text {label}", "run", m)
    t = list(toks); t[-1] = "\u2581" + "a" * 4096
    m = Gguf().set("tokenizer.ggml.tokens", value(ARR, t, STR))
    p = m.write("G16-long-token.gguf")
    rc, out, err = load_with("run", p)
    case("G16", "a 4 KiB token: refused, or loaded and usable (bounded), never a crash",
         rc in (0, 1) and sanitizer_free(err) and (rc == 0 or "G16-long-token.gguf" in err),
         f"exit {rc}: {err[-600:]}")
    # G17 hyper-parameters
    for label, key, enc in (("block_count 100000", "llama.block_count", value(U32, 100000)),
                            ("block_count 0", "llama.block_count", value(U32, 0)),
                            ("head_count 0", "llama.attention.head_count", value(U32, 0)),
                            ("head_count_kv 0", "llama.attention.head_count_kv", value(U32, 0)),
                            ("n_embd 32 with 3 heads", "llama.attention.head_count", value(U32, 3)),
                            ("head_count_kv does not divide head_count",
                             "llama.attention.head_count_kv", value(U32, 3)),
                            ("context_length 0", "llama.context_length", value(U32, 0)),
                            ("embedding_length 0", "llama.embedding_length", value(U32, 0)),
                            ("rope dimension 1000", "llama.rope.dimension_count", value(U32, 1000)),
                            ("architecture unknown", "general.architecture", value(STR, "gpt-j"))):
        g_case("G17", label, "run", Gguf().set(key, enc))
    # G18 truncations and byte flips (a sample; fuzz_gguf and fuzz_model cover the rest)
    data = Gguf().build()
    head_end = data.index(b"output_norm.weight") + 64
    cuts = sorted(set(list(range(0, 64)) + list(range(64, head_end, 97)) +
                  [head_end + 1000, len(data) // 2, len(data) - 1]))
    rng = random.Random(18)
    flips = []
    for i in range(60):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(0, head_end)] ^= 1 << rng.randrange(8)
        flips.append(bytes(b))

    def one(job):
        kind, i, payload = job
        p = os.path.join(TMP, f"G18-{kind}-{i}.gguf")
        with open(p, "wb") as f:
            f.write(payload)
        rc, _, err = load_with("inspect" if kind == "cut" else "run", p)
        if kind == "cut":
            return rc == 1 and os.path.basename(p) in err and sanitizer_free(err), f"{p}: exit {rc} {err[-400:]}"
        return rc in (0, 1) and sanitizer_free(err), f"{p}: exit {rc} {err[-800:]}"

    jobs = [("cut", n, data[:n]) for n in cuts] + [("flip", i, b) for i, b in enumerate(flips)]
    with ThreadPoolExecutor(2) as pool:
        res = list(pool.map(one, jobs))
    bad_cuts = [d for (k, _, _), (ok, d) in zip(jobs, res) if k == "cut" and not ok]
    bad_flips = [d for (k, _, _), (ok, d) in zip(jobs, res) if k == "flip" and not ok]
    case("G18", f"{len(cuts)} truncated files (every prefix under 64 bytes, then every 97th "
         "through the header) are refused naming the file", not bad_cuts, bad_cuts[:2])
    case("G18", f"{len(flips)} files with 1-4 random bit flips in the header: loaded or refused, "
         "never a crash", not bad_flips, bad_flips[:2])
    # G20: CPU build; the host-side sizes of a 2^31+ dimension must not be truncated
    m = Gguf().set("llama.embedding_length", value(U32, (1 << 31) + 32))
    g_case("G20", "embedding_length 2^31+32 (32-bit truncation would give 32)", "run", m)
    m = Gguf(); m.tensors.append(["huge", [(1 << 31) + 32, 2], GT_F32])
    g_case("G20", "a tensor with ne[0] = 2^31+32 (past the end of the file)", "inspect", m)


def _offsets(m):
    offs, off = [], 0
    for name, ne, t in m.tensors:
        off = (off + 31) // 32 * 32
        offs.append(off)
        off += Gguf.nbytes(ne, t)
    return offs


def g19_template():
    """G19: a model whose tokenizer.chat_template is hostile; served, then asked to chat."""
    bombs = {
        "loop bomb": "{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}",
        "recursion bomb": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "memory bomb": "{% set s = 'xxxxxxxxxxxxxxxx' %}{% for i in range(64) %}{% set s = s ~ s %}{% endfor %}{{ s }}",
        "SSTI": "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    }
    for label, tpl in bombs.items():
        p = Gguf().set("tokenizer.chat_template", value(STR, tpl)).write(
            f"G19-{label.replace(' ', '-')}.gguf")
        try:
            srv = Server("--parallel", "1", model=f"bomb={p}", start_timeout=30)
        except RuntimeError as e:
            # Refusing the template at load is also safe.
            case("G19", f"chat template {label}: refused at load or bounded at render",
                 "bomb" in str(e) and sanitizer_free(str(e)), str(e)[-600:])
            continue
        try:
            t = time.time()
            st, _, b = http_req(srv.port, "POST", "/v1/chat/completions",
                                {"model": "bomb", "messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 2}, timeout=30)
            took = time.time() - t
            text = b.decode("utf-8", "replace")
            ok = (400 <= st < 500 and err_obj(b) is not None) or (st == 200 and "uid=" not in text)
            case("G19", f"chat template {label}: 4xx or inert output within 10 s, no code run",
                 ok and took < 10 and alive(srv.port), f"status {st} after {took:.1f} s: {text[:300]}")
        finally:
            stop_server(srv, f"G19 {label}")


# ================================================================ requests (2b)

def request_cases(srv):
    P = srv.port

    def post(path, body, headers=None, timeout=20):
        return http_req(P, "POST", path, body, headers, timeout=timeout)

    def comp(body, **kw):
        return post("/v1/completions", body, **kw)

    # P1 huge prompts: refused before reading or before tokenizing everything
    r = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2147483648\r\n\r\n")[0]
    rs = responses(r)
    ok = len(rs) == 1 and rs[0][0] == 413 and err_obj(rs[0][2]) is not None and alive(P)
    case("P1", "Content-Length 2^31: 413 before the body is read", ok, r[:300])
    t = time.time()
    got = comp(completion(prompt="hello " * 300000))
    ok, d = rejected(P, got, 400, "prompt")
    case("P1", "a 1.8 MB prompt: 400 (longer than the context), decided fast",
         ok and time.time() - t < 10, f"{d}; {time.time() - t:.1f} s")
    ok, d = rejected(P, comp(completion(prompt=[5] * 100000)), 400, "prompt")
    case("P1", "100,000 token ids: 400 (longer than the context)", ok, d)
    ok, d = rejected(P, comp(completion(max_tokens=4096)), 400, "max_tokens")
    case("P1", "prompt + max_tokens over n_ctx: 400", ok, d)
    # P2 empty and non-object
    for label, body in (("empty prompt", completion(prompt="")), ("prompt null", completion(prompt=None)),
                        ("prompt missing", completion(prompt=...)), ("empty token list", completion(prompt=[]))):
        ok, d = rejected(P, comp(body), 400, "prompt")
        case("P2", label, ok, d)
    ok, d = rejected(P, post("/v1/chat/completions", {"model": "stories260K", "messages": []}), 400, "messages")
    case("P2", "messages: []", ok, d)
    for label, raw in (("body [1,2,3]", b"[1,2,3]"), ("body \"str\"", b'"str"'), ("body 5", b"5"),
                       ("body null", b"null"), ("empty body", b"")):
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                     "/v2/models/stories260K/generate", "/v2/models/stories260K/infer"):
            ok, d = rejected(P, post(path, raw), 400)
            case("P2", f"{label} on {path}", ok, d)
    # P3 out-of-vocabulary ids
    for ids in ([999999], [-1], [1, 2 ** 31], [1.5]):
        ok, d = rejected(P, comp(completion(prompt=ids)), 400, "prompt")
        case("P3", f"token ids {ids}: 400", ok, d)
    st, _, b = comp(completion(prompt=[999999]))
    case("P3", "the message says out of vocabulary", "out of vocabulary" in b.decode(), b[:200])
    # P4 n, best_of
    ok, d = rejected(P, comp(completion(n=10 ** 6)), 400, "n")
    case("P4", "n = 10^6: 400", ok, d)
    ok, d = rejected(P, comp(completion(n=0)), 400, "n")
    case("P4", "n = 0: 400", ok, d)
    t = time.time()
    st, _, b = comp(completion(best_of=10 ** 6, n_cmpl=10 ** 6))
    j = json.loads(b) if st == 200 else {}
    ok = (st == 400 and err_obj(b)) or (st == 200 and len(j.get("choices", [])) == 1)
    case("P4", "best_of / n_cmpl = 10^6 (not supported): refused or ignored (one choice), fast",
         ok and time.time() - t < 10 and alive(P), f"status {st}: {b[:200]!r}")
    # P5 logprobs
    for v in (10 ** 9, -1, 21):
        ok, d = rejected(P, comp(completion(logprobs=v)), 400, "logprobs")
        case("P5", f"completions logprobs = {v}: 400", ok, d)
    for v in (10 ** 9, -1):
        ok, d = rejected(P, post("/v1/chat/completions", {"model": "stories260K", "messages": [
            {"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": v}), 400, "top_logprobs")
        case("P5", f"chat top_logprobs = {v}: 400", ok, d)
    st, _, b = comp(completion(n_probs=10 ** 9, prompt_logprobs=-1))
    case("P5", "n_probs / prompt_logprobs (not supported): ignored, no huge answer",
         st == 200 and len(b) < 4096 and alive(P), f"status {st}, {len(b)} bytes")
    # P6 integer ranges
    for key, v in (("max_tokens", -1), ("max_tokens", 10 ** 12), ("max_tokens", 0), ("max_tokens", "8"),
                   ("top_k", 10 ** 12), ("top_k", -5), ("seed", 2 ** 64), ("seed", 1.5), ("timeout", -1),
                   ("priority", 10 ** 30)):
        # Integers past 64 bits are refused by the JSON parser itself (no param then).
        ok, d = rejected(P, comp(completion(**{key: v})), 400, key if abs(v if isinstance(v, (int, float)) else 0) < 2 ** 63 else None)
        case("P6", f"{key} = {v!r}: 400", ok, d)
    st, _, b = comp(completion(n_keep=-1, n_discard=10 ** 12, dry_allowed_length=-5))
    case("P6", "n_keep / n_discard / dry_allowed_length (not supported): ignored", st == 200 and alive(P),
         f"status {st}: {b[:200]!r}")
    # P7 floats
    for key, raw in (("temperature", b"NaN"), ("temperature", b"Infinity"), ("temperature", b"1e309"),
                     ("temperature", b"-1"), ("temperature", b"2.5"), ("top_p", b"0"), ("top_p", b"1.5"),
                     ("presence_penalty", b"-1e309"), ("frequency_penalty", b"3"), ("min_p", b"-0.1")):
        body = b'{"model":"stories260K","prompt":"x","max_tokens":1,"%s":%s}' % (key.encode(), raw)
        ok, d = rejected(P, comp(body), 400)
        case("P7", f"{key} = {raw.decode()}: 400", ok, d)
    base = comp(completion(max_tokens=6))
    lb = comp(completion(max_tokens=6, logit_bias={"999999": 100, "-1": -100, "5": "x"}))
    same = base[0] == 200 and lb[0] == 200 and json.loads(base[2])["choices"][0]["text"] == \
        json.loads(lb[2])["choices"][0]["text"]
    case("P7", "logit_bias with out-of-range ids (not supported): ignored, output unchanged",
         same or (lb[0] == 400 and err_obj(lb[2])), f"{base[2][:120]!r} vs {lb[2][:120]!r}")
    # P8 grammars
    for label, g in (("60k nested (", "root ::= " + "(" * 60000 + "\"a\"" + ")" * 60000),
                     ("5000-rule chain", "\n".join(f"r{i} ::= r{i + 1}" for i in range(5000)) + "\nr5000 ::= \"a\""),
                     ("(\"a\"*)*", 'root ::= ("a"*)*'), ("{0,1000000}", 'root ::= "a"{0,1000000}')):
        t = time.time()
        st, _, b = comp(completion(grammar=g))
        ok = (st == 400 and err_obj(b)) or st == 200
        case("P8", f"grammar {label} (grammars not supported): refused or ignored within 10 s",
             ok and time.time() - t < 10 and alive(P), f"status {st}: {b[:200]!r}")
    deep = {"type": "object"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    ok, d = rejected(P, comp(completion(response_format={"type": "json_schema", "json_schema": {"schema": deep}})), 400)
    case("P8", "response_format json_schema nested 200 deep: 400", ok, d)
    # P9 schemas
    for label, sch in (("$ref cycle", {"$ref": "#"}),
                       ("deep pattern", {"type": "string", "pattern": "(" * 5000 + "a" + ")" * 5000})):
        ok, d = rejected(P, comp(completion(response_format={"type": "json_schema",
                                                            "json_schema": {"name": "x", "schema": sch}})), 400)
        case("P9", f"JSON schema with a {label}: 400", ok, d)
    # P10 nesting
    for label, raw in (("body [[[...]]] 10^5 deep", b"[" * 100000 + b"]" * 100000),
                       ("object 10^5 deep", b'{"a":' * 100000 + b"1" + b"}" * 100000),
                       ("unclosed 10^5 [", b"[" * 100000),
                       ("prompt field 150 deep", b'{"model":"stories260K","prompt":' + b"[" * 150 + b"]" * 150 + b"}")):
        ok, d = rejected(P, comp(raw), 400)
        case("P10", f"{label}: 400", ok, d)
    for label, raw in (("infer data 10^5 deep", b'{"inputs":[{"name":"text_input","datatype":"BYTES","shape":[1],"data":'
                        + b"[" * 100000 + b'"x"' + b"]" * 100000 + b"}]}"),
                       ("infer parameters 10^5 deep", b'{"parameters":{"a":' + b"[" * 100000 + b"]" * 100000 +
                        b'},"inputs":[{"name":"text_input","datatype":"BYTES","shape":[1],"data":["x"]}]}')):
        ok, d = rejected(P, post("/v2/models/stories260K/infer", raw), 400)
        case("P10", f"KServe {label}: 400", ok, d)
    # P11 stop
    ok, d = rejected(P, comp(completion(stop=["a"] * 100000)), 400, "stop")
    case("P11", "stop with 10^5 strings: 400", ok, d)
    ok, d = rejected(P, comp(completion(stop="a" * 1000000)), 400, "stop")
    case("P11", "a 1 MB stop string: 400", ok, d)
    ok, d = rejected(P, post("/v2/models/stories260K/generate",
                             {"text_input": "x", "parameters": {"stop": ["a"] * 100000}}), 400)
    case("P11", "KServe generate stop with 10^5 strings: 400", ok, d)
    # P12 tools
    for label, tools in (("malformed pattern", [{"type": "function", "function": {"name": "f", "parameters": {
                            "type": "object", "properties": {"a": {"type": "string", "pattern": "(((("}}}}}]),
                         ("bad type", [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]),
                         ("not a list", "x")):
        st, _, b = post("/v1/chat/completions", {"model": "stories260K", "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": "x"}], "tools": tools})
        ok = (st == 400 and err_obj(b)) or (st == 200 and "tool_calls" not in b.decode())
        case("P12", f"tools with a {label} (tool calling not supported): refused or ignored",
             ok and alive(P), f"status {st}: {b[:200]!r}")
    skip("P12", "a tool-call output parser that backtracks", "no tool-call parser: model output is "
         "returned as text, never parsed")
    # P13 strings
    for label, raw in (("invalid UTF-8", b'{"model":"stories260K","prompt":"\xff\xfe\xc0\xaf"}'),
                       ("overlong UTF-8 for /", b'{"model":"stories260K","prompt":"\xc0\xaf"}'),
                       ("lone surrogate", b'{"model":"stories260K","prompt":"\\ud800"}'),
                       ("lone low surrogate in chat", b'{"model":"stories260K","messages":[{"role":"user","content":"\\udc00"}]}')):
        path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
        ok, d = rejected(P, post(path, raw), 400)
        case("P13", f"{label}: 400", ok, d)
    for label, body in (("NUL in a prompt", completion(prompt="a\u0000b")),
                        ("NUL in a chat message", {"model": "stories260K", "max_tokens": 2,
                                                   "messages": [{"role": "user", "content": "a\u0000b"}]}),
                        ("NUL in the model name", completion(model="stories260K\u0000x"))):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        st, _, b = post(path, body)
        case("P13", f"{label}: refused (4xx) or handled (200), consistently",
             st in (200, 400, 404) and (st == 200 or err_obj(b)) and alive(P), f"status {st}: {b[:200]!r}")
    tail = b"".join(struct.pack("<I", len(x)) + x for x in (b"\xff\xfe\x00\xc3", b"\xf0\x9f\x98"))
    head = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2],
                                   "parameters": {"binary_data_size": len(tail)}}],
                       "parameters": {"max_tokens": 2}}).encode()
    st, _, b = post("/v2/models/stories260K/infer", head + tail,
                    {"Inference-Header-Content-Length": str(len(head))})
    case("P13", "KServe binary BYTES with invalid UTF-8 and NUL: answered without a crash",
         st in (200, 400) and alive(P), f"status {st}: {b[:200]!r}")
    # P14 KServe tensors
    t1 = {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]}
    for label, inputs, needle in (
            ("shape [16, 2^60+2]", [dict(t1, shape=[16, 2 ** 60 + 2])], None),
            ("shape [2^62, 2^62] (product overflows)", [dict(t1, shape=[2 ** 62, 2 ** 62])], "too large"),
            ("negative dimension", [dict(t1, shape=[-1])], None),
            ("element count differs from data", [dict(t1, shape=[2])], None),
            ("datatype mismatch (INT32 data as BYTES)", [dict(t1, datatype="INT32")], None),
            ("FP32 element a string", [t1, {"name": "temperature", "datatype": "FP32", "shape": [1], "data": ["x"]}], None)):
        ok, d = rejected(P, post("/v2/models/stories260K/infer", {"inputs": inputs}), 400, needle=needle)
        case("P14", f"{label}: 400", ok, d)
    ok, d = rejected(P, post("/v2/models/stories260K/infer", {"inputs": [t1], "outputs": [
        {"name": "text_output"}, {"name": "text_output"}]}), 400, needle="duplicate")
    case("P14", "duplicate output names: 400", ok, d)
    # P15 binary extension
    head = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 5}}]}).encode()
    tail = struct.pack("<I", 1) + b"x"
    for label, hv in (("> body", str(len(head) + len(tail) + 1)), ("negative", "-1"), ("2^64", str(2 ** 64)),
                      ("not a number", "12abc"), ("empty", "")):
        ok, d = rejected(P, post("/v2/models/stories260K/infer", head + tail,
                                 {"Inference-Header-Content-Length": hv}), 400)
        case("P15", f"Inference-Header-Content-Length {label}: 400", ok, d)
    head = json.dumps({"inputs": [t1, {"name": "temperature", "datatype": "FP32", "shape": [1000000],
                                       "parameters": {"binary_data_size": 1000000}}]}).encode()
    ok, d = rejected(P, post("/v2/models/stories260K/infer", head + b"\0" * 1000000,
                             {"Inference-Header-Content-Length": str(len(head))}), 400)
    case("P15", "1 MB of bytes declared as 10^6 FP32 (4 MB): 400", ok, d)
    r, _ = raw_exchange(P, b"POST /v2/models/stories260K/infer HTTP/1.1\r\nHost: x\r\n"
                        b"Inference-Header-Content-Length: 2\r\nContent-Length: %d\r\n\r\n" % (9 << 20)
                        + b"\0" * (9 << 20), timeout=20)
    rs = responses(r)
    case("P15", "a 9 MiB binary body (over the 8 MiB limit): 413",
         rs and rs[0][0] == 413 and err_obj(rs[0][2]) and alive(P), r[:200])
    # P16 base64 embeddings / tensors
    st0, _, b0 = comp(completion(max_tokens=6))
    st, _, b = comp(completion(max_tokens=6, prompt_embeds="AAAAAAAAAAA=", prompt_embeds_b64="AAAA"))
    same = st == 200 and st0 == 200 and json.loads(b)["choices"][0]["text"] == json.loads(b0)["choices"][0]["text"]
    case("P16", "prompt_embeds (base64 embeddings are not accepted): ignored, output unchanged",
         same or (st == 400 and err_obj(b)), f"{b0[:100]!r} vs {b[:100]!r}")
    ok, d = rejected(P, post("/v2/models/stories260K/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": "eHh4", "parameters": {"content_type": "base64"}}]}), 400)
    case("P16", "KServe tensor data as a base64 string: 400", ok, d)


# ================================================================ protocol (2c)

def protocol_cases(srv):
    P = srv.port
    # H1 headers
    r, _ = raw_exchange(P, b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    rs = responses(r)
    case("H1", "one 1 MiB header: 431", rs and rs[0][0] == 431 and err_obj(rs[0][2]) and alive(P), r[:200])
    r, _ = raw_exchange(P, b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(10000)) + b"\r\n")
    rs = responses(r)
    case("H1", "10,000 headers: 431", rs and rs[0][0] == 431 and alive(P), r[:200])
    r, _ = raw_exchange(P, b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 400) for i in range(60)) + b"\r\n")
    rs = responses(r)
    case("H1", "60 headers of 400 bytes (24 KiB in all, over 16 KiB): 431", rs and rs[0][0] == 431, r[:200])
    # H2 URI
    for n in (8193, 100000):
        r, _ = raw_exchange(P, b"GET /" + b"a" * n + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        rs = responses(r)
        case("H2", f"request target of {n + 1} bytes: 414", rs and rs[0][0] == 414 and alive(P), r[:200])
    # H3 body limits
    r, took = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n", timeout=5)
    rs = responses(r)
    case("H3", "Content-Length over the limit: 413 before the body is sent",
         rs and rs[0][0] == 413 and took is not None, r[:200])
    r, _ = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"
                        b'{"model":"stories260K","prompt":"x"}', timeout=5)
    rs = responses(r)
    case("H3", "a body with no Content-Length: read as no body (400), the rest refused as a request",
         rs and rs[0][0] == 400 and all(x[0] >= 400 for x in rs) and alive(P), [x[0] for x in rs])
    # H4 chunked
    body = b"1\r\na\r\n" * 1000000 + b"0\r\n\r\n"
    r, _ = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body, timeout=30)
    rs = responses(r)
    case("H4", "10^6 one-byte chunks: 400 (at most 65536 chunks) or 413", rs and rs[0][0] in (400, 413) and alive(P), r[:200])
    for label, chunk in (("size ffffffffffffffff", b"ffffffffffffffff\r\nabc\r\n0\r\n\r\n"),
                         ("size 10000000000000000 (65 bits)", b"10000000000000000\r\nabc\r\n"),
                         ("bad hex", b"zz\r\nabc\r\n0\r\n\r\n"),
                         ("missing CRLF after data", b"3\r\nabcXX0\r\n\r\n"),
                         ("negative size", b"-1\r\nabc\r\n0\r\n\r\n")):
        r, _ = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk, timeout=5)
        rs = responses(r)
        case("H4", f"chunk {label}: 400 or 413, then closed", rs and rs[0][0] in (400, 413) and alive(P), r[:200])
    # H6 methods, versions, fuzzed request lines
    for label, req in (("TRACE", b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n"),
                       ("CONNECT", b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
                       ("garbage method", b"FOO\x01 /live HTTP/1.1\r\n\r\n"),
                       ("HTTP/9.9", b"GET /live HTTP/9.9\r\n\r\n"),
                       ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
                       ("binary request line", bytes(range(256)) + b"\r\n\r\n")):
        r, _ = raw_exchange(P, req, timeout=5)
        rs = responses(r)
        case("H6", f"{label}: a 4xx or 5xx refusal (not 500), then closed",
             (not rs or (400 <= rs[0][0] < 600 and rs[0][0] != 500)) and alive(P), r[:200])
    # RFC 9112 3.2.2: a server accepts the absolute form and routes it by its path.
    r, _ = raw_exchange(P, b"GET http://evil.example/live HTTP/1.1\r\nConnection: close\r\n\r\n",
                        timeout=5)
    rs = responses(r)
    case("H6", "absolute-form target: routed by its path (/live: 200)",
         bool(rs) and rs[0][0] == 200 and b"ok" in rs[0][2] and alive(P), r[:200])
    routes = ["/", "/live", "/health", "/stats", "/metrics", "/v1/models", "/v1/models/stories260K",
              "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v2", "/v2/health/live",
              "/v2/health/ready", "/v2/models/stories260K", "/v2/models/stories260K/ready",
              "/v2/models/stories260K/versions/1", "/v2/models/stories260K/infer",
              "/v2/models/stories260K/generate", "/v2/repository/index",
              "/v2/repository/models/stories260K/load"]
    methods = [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE"]
    rng = random.Random(6)
    fails, n = [], 0
    for path in routes:
        for m in methods:
            line = m + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
            variants = [line]
            b = bytearray(line)
            for _ in range(3):
                b[rng.randrange(len(b))] = rng.randrange(256)
            variants.append(bytes(b))
            for v in variants:
                n += 1
                r, _ = raw_exchange(P, v, timeout=10, half_close=True)
                rs = responses(r)
                if r and (not rs or rs[0][0] == 500 or not (100 <= rs[0][0] < 600)):
                    fails.append((v[:80], r[:120]))
    case("H6", f"{n} request lines ({len(routes)} routes x {len(methods)} methods, as sent and "
         "with 3 random bytes changed): answered or closed, never a 500", not fails and alive(P), fails[:3])
    # H7 pipelining and desync
    c = completion(max_tokens=2)
    cb = json.dumps(c).encode()
    r, _ = raw_exchange(P, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (len(cb), cb))
    rs = responses(r)
    case("H7", "three pipelined requests: answered in order",
         [x[0] for x in rs] == [200, 200, 200] and b"text_completion" in rs[1][2] and b"list" in rs[2][2],
         [x[0] for x in rs])
    flood = b"GET /live HTTP/1.1\r\n\r\n" * 200
    r, _ = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n\x00*\x00" + flood, timeout=10)
    rs = responses(r)
    case("H7", "desync bytes \\x00*\\x00 then a flood of 200 requests: one 200, one 400, closed",
         [x[0] for x in rs] == [200, 400] and alive(P), [x[0] for x in rs][:6])
    # H8 smuggling
    for label, req in (("Content-Length and Transfer-Encoding",
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                       ("two Content-Length headers",
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x"),
                       ("Content-Length with a sign", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}"),
                       ("Transfer-Encoding: chunked, identity",
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"),
                       ("obsolete line folding in Transfer-Encoding",
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n")):
        r, _ = raw_exchange(P, req, timeout=5)
        rs = responses(r)
        case("H8", f"{label}: 400, then closed", len(rs) == 1 and rs[0][0] == 400 and alive(P), [x[0] for x in rs])
    # H9 disconnects
    def stats():
        st, _, b = http_req(P, "GET", "/stats")
        m = json.loads(b)["models"]["stories260K"]
        return m["running"] + m["waiting"], m["jobs_cancelled"], m["kv_blocks_used"]

    def settled(cancelled_before, need_cancel=True, timeout=3):
        end = time.time() + timeout
        while time.time() < end:
            active, cancelled, used = stats()
            if active == 0 and used == 0 and (cancelled > cancelled_before or not need_cancel):
                return True
            time.sleep(0.05)
        return False

    _, c0, _ = stats()
    sk = socket.create_connection(("127.0.0.1", P), timeout=10)
    body = json.dumps(completion(max_tokens=400, stream=True, temperature=1, ignore_eos=True)).encode()
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while b"data:" not in got:
        b = sk.recv(4096)
        if not b:
            break
        got += b
    sk.close()
    case("H9", "client disconnects mid-stream: the sequence is cancelled and its KV blocks freed",
         b"data:" in got and settled(c0), got[:100])
    _, c0, _ = stats()
    sk = socket.create_connection(("127.0.0.1", P), timeout=10)
    body = json.dumps(completion(prompt=[1] + [300] * 400, max_tokens=100, ignore_eos=True)).encode()
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    sk.close()
    # A FIN right after the request cannot be told from a half-close (shutdown(SHUT_WR)), whose
    # request is answered: the sequence may run to its end (100 tokens; slow under ASan) before
    # the failed write shows the client gone. Cancelled or done, it must end and free its blocks.
    case("H9", "client disconnects right after sending (during prefill): the sequence ends and "
         "its KV blocks are freed", settled(c0, need_cancel=False, timeout=20), stats())
    # H12 CORS (off by default)
    st, h, _ = http_req(P, "OPTIONS", "/v1/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    st2, h2, _ = http_req(P, "GET", "/v1/models", headers={"Origin": "https://evil.example"})
    case("H12", "OPTIONS and GET from Origin https://evil.example: no Access-Control-Allow-* (CORS off)",
         not any(k.startswith("access-control-allow") for k in list(h) + list(h2)), (h, h2))
    # H13 log injection: control bytes reach the server decoded from JSON (model name, prompt
    # with --log-prompts, user) and percent-encoded in the URL; raw ones in a head are refused.
    marker = "inj%d" % random.randrange(10 ** 6)
    nasty = "\r\nts=0 level=error event=forged \x1b[2J\x1b]0;title\x07 \u2028"
    raw_exchange(P, b"GET /v1/models/" + marker.encode() + b"%0d%0aevent=forged%1b[31m?q=%0a HTTP/1.1\r\n"
                 b"Host: x\r\nX-Request-Id: " + marker.encode() + b"\r\n\r\n", timeout=5)
    r, _ = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\nUser-Agent: a\x1b[31mred\r\n\r\n", timeout=5)
    raw_head = responses(r)
    http_req(P, "POST", "/v1/completions", completion(model=marker + nasty), {"X-Request-Id": marker})
    http_req(P, "POST", "/v1/completions", completion(prompt=marker + nasty, user=nasty, max_tokens=1),
             {"X-Request-Id": marker})
    http_req(P, "POST", "/v1/chat/completions", {"model": "stories260K", "max_tokens": 1, "messages": [
        {"role": "user", "content": marker + nasty}]}, {"X-Request-Id": marker})
    http_req(P, "POST", "/v2/models/" + marker + "%0d%0aevent=forged/infer", {"inputs": []})
    time.sleep(0.3)
    log = srv.text().splitlines()
    lines = [ln for ln in log if marker in ln]
    bad = [ln for ln in log if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", ln) or "event=forged" in ln.split(" ", 3)[2:3]
           or re.match(r"^\s*(ts=0|event=forged)", ln)]
    case("H13", "CR, LF and ANSI escapes in the URL, model name, prompt, user and chat message: "
         "logged escaped, one line each", len(lines) >= 4 and not bad, (len(lines), lines[:4], bad[:3]))
    case("H13", "an ESC byte in a header value: the head is refused (400)",
         raw_head and raw_head[0][0] == 400 and alive(P), r[:120])
    # H5 slow clients (last: they take seconds)
    slow_cases(P)


def slow_cases(P):
    """H5 on the main server, started with --header-timeout 1 --body-timeout 1 --idle-timeout 2."""
    results = {}

    def head_trickle():
        parts = [bytes([b]) for b in b"GET /live HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\r\n"]
        r, took = raw_exchange(P, None, chunks=parts, gap=0.25, timeout=10)
        results["head"] = (r, took)

    def body_trickle():
        body = json.dumps(completion()).encode()
        parts = [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)] + \
            [bytes([b]) for b in body]
        r, took = raw_exchange(P, None, chunks=parts, gap=0.25, timeout=10)
        results["body"] = (r, took)

    def idle():
        sk = socket.create_connection(("127.0.0.1", P), timeout=10)
        t = time.time()
        sk.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        try:
            while True:
                b = sk.recv(4096)
                if not b:
                    break
                data += b
        except socket.timeout:
            results["idle"] = (data, None)
            return
        finally:
            sk.close()
        results["idle"] = (data, time.time() - t)

    def silent():
        sk = socket.create_connection(("127.0.0.1", P), timeout=10)
        t = time.time()
        try:
            b = sk.recv(4096)
            results["silent"] = (b, time.time() - t)
        except socket.timeout:
            results["silent"] = (b"", None)
        finally:
            sk.close()

    ths = [threading.Thread(target=f) for f in (head_trickle, body_trickle, idle, silent)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    r, took = results["head"]
    rs = responses(r)
    case("H5", "head at 4 bytes/s: 408 and closed at the 1 s header deadline",
         rs and rs[0][0] == 408 and took is not None and took < 4, (r[:120], took))
    r, took = results["body"]
    rs = responses(r)
    case("H5", "body at 4 bytes/s: 408 and closed at the 1 s body deadline",
         rs and rs[0][0] == 408 and took is not None and took < 4, (r[:120], took))
    r, took = results["idle"]
    rs = responses(r)
    case("H5", "idle keep-alive connection: closed after the 2 s idle timeout",
         rs and rs[0][0] == 200 and took is not None and 1.5 < took < 6, took)
    r, took = results["silent"]
    case("H5", "a connection that never sends a byte: closed at the header deadline",
         took is not None and took < 4 and (r == b"" or r.startswith(b"HTTP/1.1 408")), (r[:80], took))


def auth_cases():
    """H10, H11 on a server with --api-key (one legacy key) and H12 with --cors-origins."""
    key = "sk-test-" + "k" * 32
    try:
        srv = Server("--api-key", key, "--cors-origins", "https://good.example")
    except RuntimeError as e:
        case("H10", "server with --api-key starts", False, str(e)[-600:])
        return
    P = srv.port
    try:
        ans = {}
        for label, hdr, path in (("no key", {}, "/v1/models"),
                                 ("wrong key", {"Authorization": "Bearer sk-wrong"}, "/v1/models"),
                                 ("key without Bearer", {"Authorization": key}, "/v1/models"),
                                 ("key in the query string", {}, "/v1/models?api_key=" + key),
                                 ("key in another header", {"Api-Key": key}, "/v1/models"),
                                 ("last byte differs", {"Authorization": "Bearer " + key[:-1] + "j"}, "/v1/models"),
                                 ("prefix of the key", {"Authorization": "Bearer " + key[:-1]}, "/v1/models"),
                                 ("key plus a byte", {"Authorization": "Bearer " + key + "k"}, "/v1/models"),
                                 ("empty Bearer", {"Authorization": "Bearer "}, "/v1/models")):
            st, h, b = http_req(P, "GET", path, headers=hdr)
            e = err_obj(b) or {}
            ans[label] = (st, e.get("message"), e.get("code"))
        first = ans["no key"]
        case("H10", "missing, wrong, misplaced and almost-right keys all get the same 401",
             first[0] == 401 and all(v == first for v in ans.values()), ans)
        st, _, _ = http_req(P, "GET", "/v1/models", headers={"Authorization": "Bearer " + key})
        st2, _, _ = http_req(P, "GET", "/v1/models", headers={"X-Api-Key": key})
        case("H10", "the right key works (Authorization: Bearer and X-Api-Key)", st == 200 and st2 == 200, (st, st2))
        skip("H10", "timing of the key comparison", "not measurable reliably on a shared 2-core "
             "machine; the comparison hashes the key (SHA-256) and compares digests with "
             "CRYPTO_memcmp (src/serving/tenants.c)")
        routes = [("GET", "/v1/models"), ("GET", "/v1/models/stories260K"), ("POST", "/v1/completions"),
                  ("POST", "/v1/chat/completions"), ("POST", "/v1/embeddings"), ("GET", "/stats"),
                  ("GET", "/metrics"), ("GET", "/v2"), ("GET", "/v2/models/stories260K"),
                  ("GET", "/v2/models/stories260K/ready"), ("POST", "/v2/models/stories260K/infer"),
                  ("POST", "/v2/models/stories260K/generate"), ("POST", "/v2/models/stories260K/generate_stream"),
                  ("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/stories260K/load"),
                  ("POST", "/v2/repository/models/stories260K/unload"), ("POST", "/tokenize"),
                  ("POST", "/invocations"), ("GET", "/v1/../stats"), ("GET", "//stats"), ("GET", "/STATS"),
                  ("GET", "/stats?x=/live"), ("GET", "/live/../stats")]
        got = {}
        for m, path in routes:
            st, _, b = http_req(P, m, path, body={} if m == "POST" else None)
            got[f"{m} {path}"] = st
        case("H11", f"{len(routes)} non-public routes, aliases and unknown paths without a key: 401",
             all(v == 401 for v in got.values()), {k: v for k, v in got.items() if v != 401})
        pub = {p: http_req(P, "GET", p)[0] for p in ("/live", "/health", "/v2/health/live", "/v2/health/ready")}
        case("H11", "the health routes stay public", all(v == 200 for v in pub.values()), pub)
        st, h, _ = http_req(P, "OPTIONS", "/v1/completions", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        st2, h2, _ = http_req(P, "OPTIONS", "/v1/completions", headers={
            "Origin": "https://good.example", "Access-Control-Request-Method": "POST"})
        case("H12", "--cors-origins https://good.example: evil.example gets no Access-Control-Allow-*, "
             "good.example gets its origin back",
             not any(k.startswith("access-control-allow") for k in h)
             and h2.get("access-control-allow-origin") == "https://good.example", (st, h, st2, h2))
    finally:
        stop_server(srv, "H10/H11 auth server")


def tenants_cases():
    """R3's digest rule applied to the file we do read: key hashes in the tenants file."""
    p = os.path.join(TMP, "tenants.json")
    for label, keyhash in (("sha256:../../x", "sha256:../../x"),
                           ("upper-case hex", "sha256:" + hashlib.sha256(b"k").hexdigest().upper()),
                           ("63 hex digits", "sha256:" + hashlib.sha256(b"k").hexdigest()[:63]),
                           ("md5:", "md5:" + hashlib.md5(b"k").hexdigest())):
        with open(p, "w") as f:
            json.dump({"tenants": [{"name": "t", "keys": [keyhash]}]}, f)
        rc, out, err = cli(["serve", "--tenants", p, "--port", "0"], timeout=20)
        case("R3", f"tenants file key hash {label}: refused at start naming the file",
             rc not in (0, None) and "tenants.json" in err and sanitizer_free(err), f"exit {rc}: {err[-300:]}")


# ================================================================ repository (2d)

def repo_cases():
    tmp = os.path.join(TMP, "r")
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "good", "1"))
    shutil.copy(DEMO_MODEL, os.path.join(repo, "good", "1", "model.gguf"))
    with open(os.path.join(repo, "good", "config.json"), "w") as f:
        json.dump({"name": "good", "backend": "llm"}, f)
    # G18-style: a corrupt file beside a good one
    os.makedirs(os.path.join(repo, "corrupt", "1"))
    with open(os.path.join(repo, "corrupt", "1", "model.gguf"), "wb") as f:
        f.write(Gguf().build()[:700])
    # R2 symlinks out of the repository
    outside = os.path.join(tmp, "outside")
    os.makedirs(os.path.join(outside, "1"))
    shutil.copy(DEMO_MODEL, os.path.join(outside, "1", "model.gguf"))
    os.symlink(outside, os.path.join(repo, "dirlink"))
    os.makedirs(os.path.join(repo, "filelink", "1"))
    os.symlink(os.path.join(outside, "1", "model.gguf"), os.path.join(repo, "filelink", "1", "model.gguf"))
    os.makedirs(os.path.join(repo, "verlink"))
    os.symlink(os.path.join(outside, "1"), os.path.join(repo, "verlink", "1"))
    # R4 special files as models
    os.makedirs(os.path.join(repo, "fifo", "1"))
    os.mkfifo(os.path.join(repo, "fifo", "1", "model.gguf"))
    os.makedirs(os.path.join(repo, "dir", "1", "model.gguf"))
    os.makedirs(os.path.join(repo, "zero", "1"))
    os.symlink("/dev/zero", os.path.join(repo, "zero", "1", "model.gguf"))
    with open(os.path.join(outside, "config.json"), "w") as f:
        json.dump({"backend": "llm"}, f)
    for name in ("corrupt", "filelink", "verlink", "fifo", "dir", "zero"):
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump({"name": name, "backend": "llm"}, f)
    before = tree_digest(repo)
    try:
        srv = Server("--model-repository", repo, "--model-control-mode", "explicit", "--load-timeout", "10",
                     model=None, start_timeout=30)
    except RuntimeError as e:
        case("R4", "a repository server starts beside a FIFO, a directory and /dev/zero", False, str(e)[-600:])
        return
    P = srv.port
    try:
        def load(name, body=None, timeout=20):
            t = time.time()
            st, _, b = http_req(P, "POST", f"/v2/repository/models/{name}/load", body or {}, timeout=timeout)
            return st, b, time.time() - t

        st, b, _ = load("good")
        case("--", "repository: the good model loads (so the refusals below are specific)", st == 200, b[:200])
        st, b, _ = load("corrupt")
        e = err_obj(b) or {}
        ok = 400 <= st < 500 and e and http_req(P, "POST", "/v1/completions", completion(model="good"))[0] == 200
        case("G18", "a truncated model in the repository: load refused, the loaded model keeps serving",
             ok, f"{st} {b[:200]!r}")
        # R1 names
        for name in ("..", ".", "..%2F..%2Fetc", "%2e%2e", "%2E%2E%2Fgood", "good%00x", "..%5C..%5Cx", "a" * 200,
                     "%C0%AE%C0%AE", "good%2F..%2F..%2F..%2Fetc", "~root", "good%0d%0ax"):
            st, b, _ = load(name)
            case("R1", f"load of model name {name[:40]!r}: 4xx", 400 <= st < 500 and err_obj(b) and alive(P),
                 f"{st} {b[:160]!r}")
        for path in ("/v2/models/..%2F..%2Fetc%2Fpasswd/infer", "/v2/models/%2e%2e/versions/1/infer",
                     "/v2/models/good/versions/..%2F1/infer", "/v2/models/good/versions/-1/infer",
                     "/v2/models/good/versions/1e3/infer", "/v2/models/good/versions/99999999999999999999/infer"):
            st, _, b = http_req(P, "POST", path, {"inputs": []})
            case("R1", f"POST {path}: 4xx", 400 <= st < 500 and err_obj(b), f"{st} {b[:160]!r}")
        st, _, b = http_req(P, "POST", "/v1/completions", completion(model="../../etc/passwd"))
        case("R1", "OpenAI model '../../etc/passwd': 404", st == 404 and err_obj(b), f"{st} {b[:160]!r}")
        # R2 symlinks
        for name in ("dirlink", "filelink", "verlink"):
            st, b, _ = load(name)
            msg = (err_obj(b) or {}).get("message", "")
            case("R2", f"{name}: a model reached through a symlink out of the repository is refused",
                 400 <= st < 500 and re.search(r"outside|link|escape", msg), f"{st} {b[:200]!r}")
        # R4 special files
        for name in ("fifo", "dir", "zero"):
            st, b, took = load(name)
            msg = (err_obj(b) or {}).get("message", "")
            case("R4", f"model file that is a {name}: refused within 5 s (not a regular file)",
                 400 <= st < 500 and re.search(r"regular|no \*\.gguf", msg) and took < 5 and alive(P),
                 f"{st} after {took:.1f} s: {b[:200]!r}")
        # R5 no runtime path API
        for path, body in (("/v2/logging", {"log_file": "/tmp/x"}), ("/v2/trace/setting", {"trace_file": "/tmp/x"}),
                           ("/v2/models/good/trace/setting", {"trace_file": "/tmp/x"}),
                           ("/v2/repository/models/good/load", {"parameters": {"file:1/model.gguf": "AAAA"}}),
                           ("/v2/repository/models/good/load", {"parameters": {"config": json.dumps(
                               {"parameters": {"model_file": {"string_value": "/etc/passwd"}}})}}),
                           ("/v2/repository/models/good/load", {"parameters": {"config": json.dumps(
                               {"parameters": {"model_file": {"string_value": "../../outside/1/model.gguf"}}})}})):
            st, _, b = http_req(P, "POST", path, body)
            # Triton's file: override is not implemented: refused, or ignored (nothing written).
            ok = 400 <= st < 500 or (st == 200 and "file:" in json.dumps(body) and tree_digest(repo) == before)
            case("R5", f"POST {path} {json.dumps(body)[:60]}: no path or file is taken from a request",
                 ok and alive(P), f"{st} {b[:200]!r}")
        # R6 error messages
        leaks = []
        for m, path, body in (("POST", "/v2/repository/models/corrupt/load", {}),
                              ("POST", "/v2/repository/models/fifo/load", {}),
                              ("POST", "/v2/repository/models/dirlink/load", {}),
                              ("POST", "/v2/repository/index", {}),
                              ("GET", "/v2/models/corrupt", None), ("GET", "/stats", None)):
            st, _, b = http_req(P, m, path, body)
            t = b.decode("utf-8", "replace")
            if tmp in t or TMP in t or re.search(r"0x[0-9a-f]{8,}", t) or "/dev/" in t:
                leaks.append((path, t[:200]))
        case("R6", "error answers and the index never quote absolute paths or addresses",
             not leaks, str(leaks[:1]))
        # R7 sockets of the process
        g = re.search(r"event=grpc_listening url=grpcs?://127\.0\.0\.1:(\d+)", srv.text())
        ports = [P] + ([int(g.group(1))] if g else [])
        case("R7", "the process listens only on its HTTP and gRPC ports on 127.0.0.1, no other "
             "socket", *listening_only(srv.p.pid, ports))
    finally:
        stop_server(srv, "repository server")


def tree_digest(root):
    """SHA-256 over every path and regular file's bytes under root (links not followed)."""
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            h.update(p.encode())
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def listening_only(pid, ports):
    """(ok, detail): the listening TCP sockets of pid are 127.0.0.1 on exactly these ports; no
    listening unix socket."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]", t)
            if m:
                inodes.add(m.group(1))
        listen = []
        for proto in ("tcp", "tcp6"):
            if not os.path.exists(f"/proc/net/{proto}"):
                continue
            with open(f"/proc/net/{proto}") as f:
                for line in f.readlines()[1:]:
                    p = line.split()
                    if p[9] in inodes and p[3] == "0A":
                        ip, pt = p[1].split(":")
                        listen.append((proto, ip, int(pt, 16)))
        unix = []
        with open("/proc/net/unix") as f:
            for line in f.readlines()[1:]:
                p = line.split()
                if len(p) >= 7 and p[6] in inodes and p[5] == "01" and p[3] == "00010000":
                    unix.append(p[-1])
    except OSError as e:
        return False, str(e)
    ok = sorted(listen) == sorted(("tcp", "0100007F", p) for p in ports) and not unix
    return ok, (listen, unix)


def r4_cli_cases():
    """R4 on the command line: --model NAME=FILE where FILE is not a regular file."""
    fifo = os.path.join(TMP, "model.fifo")
    os.mkfifo(fifo)
    d = os.path.join(TMP, "model.dir")
    os.makedirs(d, exist_ok=True)
    for label, path in (("/dev/zero", "/dev/zero"), ("/dev/random", "/dev/random"), ("a FIFO", fifo),
                        ("a directory", d)):
        t = time.time()
        rc, _, err = cli(["serve", "--model", f"x={path}", "--port", "0", "--threads", "1"], timeout=20)
        took = time.time() - t
        case("R4", f"serve --model x={label}: refused within 10 s naming the file",
             rc not in (0, None) and path in err and took < 10 and sanitizer_free(err),
             f"exit {rc} after {took:.1f} s: {err[-300:]}")


def r7_bind_cases():
    rc, _, err = cli(["serve", "--host", "0.0.0.0", "--port", "0"], timeout=20)
    case("R7", "--host 0.0.0.0 without API keys: refused at start (--insecure-open needed)",
         rc not in (0, None) and sanitizer_free(err), f"exit {rc}: {err[-300:]}")


# ================================================================ main

if exe is None:
    s.skip("all", "sampan not built ($SAMPAN_BIN or build/sampan)")
    s.finish()

ONLY = set(os.environ.get("SP_BAD_ONLY", "G,P,H,R").split(","))  # sections, for debugging
print(f"bad-inputs: binary {exe}", flush=True)
if "G" in ONLY:
    s.guard("GGUF cases", gguf_cases)
    s.guard("G19", g19_template)
if "P" in ONLY or "H" in ONLY:
    main = None
    try:
        main = Server("--header-timeout", "1", "--body-timeout", "1", "--idle-timeout", "2",
                      "--parallel", "2", "--log-requests", "all", "--log-prompts", start_timeout=30)
        if "P" in ONLY:
            s.guard("request cases", request_cases, main)
        if "H" in ONLY:
            s.guard("protocol cases", protocol_cases, main)
    except RuntimeError as e:
        case("--", "the request server starts", False, str(e)[-800:])
    finally:
        if main:
            stop_server(main, "request server")
if "H" in ONLY:
    s.guard("auth cases", auth_cases)
if "R" in ONLY:
    s.guard("tenants cases", tenants_cases)
    s.guard("repository cases", repo_cases)
    s.guard("R4", r4_cli_cases)
    s.guard("R7", r7_bind_cases)
shutil.rmtree(TMP, ignore_errors=True)
print(f"bad-inputs: {s.passed + s.failed} cases run ({time.time() - T0:.0f} s)", flush=True)
s.finish()
