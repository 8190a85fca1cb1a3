"""test_kserve.py - the KServe v2 / Open Inference Protocol routes of `sampan serve` as a black
box on 127.0.0.1 (free port): server and model metadata, readiness, version routes, infer with
JSON tensors and with the binary tensor data extension (BYTES in, BYTES out), Triton's generate
and generate_stream, every validation error (shape, datatype, nesting, binary lengths, header
length), 404s, and a client that disconnects mid-stream. Greedy outputs are compared with
`sampan run --temp 0` on the same prompt. http.client and raw sockets only. Last line:
    kserve: N passed, N failed, N skipped"""
import http.client
import json
import os
import socket
import struct
import threading
import time

from common import ROOT, Suite, binary, run, Server

s = Suite("kserve")
exe = binary()
MODEL = os.path.join(ROOT, "models", "stories260K.gguf")
NAME = "stories260K"
BASE = f"/v2/models/{NAME}"


def req(method, path, body=None, headers=None, timeout=10):
    """One request: (status, headers dict (lower-case), body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", P, timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def jbody(b):
    try:
        return json.loads(b)
    except Exception:
        return None


def error_of(b):
    """The protocol's error shape: {"error": "<string>"}; None if it is not that."""
    j = jbody(b)
    if isinstance(j, dict) and isinstance(j.get("error"), str) and len(j) == 1:
        return j["error"]
    return None


def alive():
    try:
        return req("GET", "/v2/health/live")[0] == 200
    except OSError:
        return False


def golden(prompt, n):
    """Greedy continuation from `sampan run` (it prints the prompt, then the text)."""
    rc, out, err = run([exe, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1"],
                       timeout=60)
    if rc != 0 or not out.startswith(prompt):
        raise RuntimeError(f"sampan run failed: {rc} {err[-300:]}")
    return out[len(prompt):].rstrip("\n")


def bytes_elems(*items):
    """BYTES tensor data in the binary format: 4-byte little-endian length + bytes each."""
    out = b""
    for x in items:
        x = x.encode() if isinstance(x, str) else x
        out += struct.pack("<I", len(x)) + x
    return out


def parse_bytes(buf):
    out, o = [], 0
    while o < len(buf):
        (n,) = struct.unpack_from("<I", buf, o)
        out.append(buf[o + 4:o + 4 + n])
        o += 4 + n
    return out


def binary_request(path, head, tail, header_len=None, extra_headers=None):
    hj = json.dumps(head).encode()
    hdrs = {"Inference-Header-Content-Length": str(len(hj) if header_len is None else header_len),
            "Content-Type": "application/octet-stream"}
    hdrs.update(extra_headers or {})
    return req("POST", path, body=hj + tail, headers=hdrs)


def split_binary_response(h, b):
    n = int(h.get("inference-header-content-length", len(b)))
    return json.loads(b[:n]), b[n:]


def text_in(data, shape=None, **kw):
    t = {"name": "text_input", "datatype": "BYTES", "shape": shape or [len(data)], "data": data}
    t.update(kw)
    return t


def scalar(name, dt, v):
    return {"name": name, "datatype": dt, "shape": [1], "data": [v]}


if exe is None:
    s.skip("all", "build/sampan not built")
    s.finish()

srv = Server("--parallel", "2", "--max-body-bytes", "1048576")
P = srv.port
PROMPT, PROMPT2, N = "Once upon a time", "Tom and his dog", 24


def case_error(name, want, got):
    st, _, b = got
    e = error_of(b)
    s.case(name, st == want and e is not None and alive(), f"status {st}, want {want}; {b[:200]!r}")
    return e or ""


def routes():
    st, _, b = req("GET", "/v2")
    j = jbody(b) or {}
    s.case("GET /v2: server metadata {name, version, extensions}",
           st == 200 and j.get("name") == "sampan" and isinstance(j.get("version"), str)
           and {"binary_tensor_data", "generate"} <= set(j.get("extensions", [])), b[:200])
    for path in ("/v2/health/live", "/v2/health/ready"):
        s.case(f"GET {path} is 200", req("GET", path)[0] == 200)
    for path in (BASE, BASE + "/versions/1"):
        st, _, b = req("GET", path)
        j = jbody(b) or {}
        ins = {t["name"]: t for t in j.get("inputs", [])}
        outs = {t["name"]: t for t in j.get("outputs", [])}
        s.case(f"GET {path}: model metadata",
               st == 200 and j.get("name") == NAME and j.get("versions") == ["1"]
               and isinstance(j.get("platform"), str)
               and ins.get("text_input", {}).get("datatype") == "BYTES"
               and ins.get("max_tokens", {}).get("datatype") == "INT32"
               and ins.get("temperature", {}).get("datatype") == "FP32"
               and outs.get("text_output", {}).get("datatype") == "BYTES"
               and all(isinstance(t.get("shape"), list) for t in j.get("inputs", [])), b[:300])
    for path in (BASE + "/ready", BASE + "/versions/1/ready"):
        st, _, b = req("GET", path)
        s.case(f"GET {path} is 200 {{ready: true}}", st == 200 and (jbody(b) or {}).get("ready") is True, b)
    st, _, b = req("HEAD", BASE)
    s.case("HEAD on model metadata is 200 without a body", st == 200 and b == b"", st)
    # 404s and 405
    for path in ("/v2/models/nope", "/v2/models/nope/ready", BASE + "/versions/2",
                 BASE + "/versions/2/ready", "/v2/models/nope/versions/1"):
        case_error(f"GET {path} is 404 {{error}}", 404, req("GET", path))
    for suffix in ("/infer", "/generate", "/generate_stream"):
        case_error(f"POST unknown model {suffix} is 404", 404,
                   req("POST", "/v2/models/nope" + suffix, {"text_input": "x"}))
        case_error(f"POST version 7 {suffix} is 404", 404,
                   req("POST", BASE + "/versions/7" + suffix, {"text_input": "x"}))
    case_error("unknown /v2 route is 404 {error}", 404, req("GET", "/v2/nothing/here"))
    case_error("GET on infer is 405 {error}", 405, req("GET", BASE + "/infer"))


s.guard("routes", routes)


def golden_outputs():
    want, want2 = golden(PROMPT, N), golden(PROMPT2, N)
    s.case("sampan run gives a non-empty greedy continuation", len(want) > 10, repr(want))
    # generate
    st, h, b = req("POST", BASE + "/generate",
                   {"text_input": PROMPT, "parameters": {"max_tokens": N, "temperature": 0}})
    j = jbody(b) or {}
    s.case("generate: greedy text equals sampan run", st == 200 and j.get("text_output") == want,
           f"{j.get('text_output')!r} vs {want!r}")
    s.case("generate: model_name, model_version, finish_reason, usage",
           j.get("model_name") == NAME and j.get("model_version") == "1"
           and j.get("finish_reason") == "length" and j.get("usage", {}).get("completion_tokens") == N
           and h.get("content-type", "").startswith("application/json"), b[:300])
    st, _, b = req("POST", BASE + "/versions/1/generate",
                   {"text_input": PROMPT, "max_tokens": N, "temperature": 0, "id": "g1"})
    j = jbody(b) or {}
    s.case("generate: top-level inputs, version route, id echoed",
           st == 200 and j.get("text_output") == want and j.get("id") == "g1", b[:200])
    # generate_stream
    st, h, b = req("POST", BASE + "/generate_stream",
                   {"text_input": PROMPT, "parameters": {"max_tokens": N, "temperature": 0}})
    events = [json.loads(e[6:]) for e in b.decode().split("\n\n") if e.startswith("data: ")]
    text = "".join(e.get("text_output", "") for e in events)
    s.case("generate_stream: text/event-stream, one event per token, text equals sampan run",
           st == 200 and h.get("content-type", "").startswith("text/event-stream")
           and len(events) >= N // 2 and text == want, f"{len(events)} events, {text!r}")
    s.case("generate_stream: every event has model_name/model_version; the last has finish_reason",
           events and all(e.get("model_name") == NAME and e.get("model_version") == "1" for e in events)
           and events[-1].get("finish_reason") == "length"
           and all("finish_reason" not in e for e in events[:-1])
           and b.endswith(b"\n\n") and b.count(b"data: ") == len(events), b[-200:])
    # infer (JSON tensors), a batch of two prompts
    body = {"id": "req-7", "inputs": [text_in([PROMPT, PROMPT2]), scalar("max_tokens", "INT32", N),
                                      scalar("temperature", "FP32", 0.0)]}
    st, h, b = req("POST", BASE + "/infer", body)
    j = jbody(b) or {}
    outs = {o["name"]: o for o in j.get("outputs", [])}
    to = outs.get("text_output", {})
    s.case("infer: JSON tensors, batch of 2, greedy texts equal sampan run",
           st == 200 and to.get("data") == [want, want2] and to.get("datatype") == "BYTES"
           and to.get("shape") == [2], b[:400])
    s.case("infer: model_name, model_version, id, finish_reason output",
           j.get("model_name") == NAME and j.get("model_version") == "1" and j.get("id") == "req-7"
           and outs.get("finish_reason", {}).get("data") == ["length", "length"], b[:400])
    # settings as request parameters, only the requested output, nested [1,1] shape
    body = {"parameters": {"max_tokens": N, "temperature": 0},
            "inputs": [text_in([[PROMPT]], shape=[1, 1])], "outputs": [{"name": "text_output"}]}
    st, _, b = req("POST", BASE + "/versions/1/infer", body)
    j = jbody(b) or {}
    s.case("infer: parameters, nested data, only the requested output",
           st == 200 and [o["name"] for o in j.get("outputs", [])] == ["text_output"]
           and j["outputs"][0]["data"] == [want] and j["outputs"][0]["shape"] == [1, 1], b[:300])
    # binary tensor data: BYTES in, BYTES out
    tail = bytes_elems(PROMPT) + struct.pack("<i", N) + struct.pack("<f", 0.0)
    head = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                        "parameters": {"binary_data_size": len(bytes_elems(PROMPT))}},
                       {"name": "max_tokens", "datatype": "INT32", "shape": [1],
                        "parameters": {"binary_data_size": 4}},
                       {"name": "temperature", "datatype": "FP32", "shape": [1],
                        "parameters": {"binary_data_size": 4}}],
            "outputs": [{"name": "text_output", "parameters": {"binary_data": True}},
                        {"name": "finish_reason"}]}
    st, h, b = binary_request(BASE + "/infer", head, tail)
    try:
        j, btail = split_binary_response(h, b)
    except Exception:
        j, btail = {}, b""
    outs = {o["name"]: o for o in j.get("outputs", [])}
    to = outs.get("text_output", {})
    size = to.get("parameters", {}).get("binary_data_size")
    s.case("binary: response has Inference-Header-Content-Length and a binary tail",
           st == 200 and "inference-header-content-length" in h and size == len(btail)
           and "data" not in to, (st, h, b[:300]))
    s.case("binary: BYTES out round-trips the greedy text", parse_bytes(btail) == [want.encode()],
           btail[:100])
    s.case("binary: outputs not asked as binary stay JSON",
           outs.get("finish_reason", {}).get("data") == ["length"], j)
    # binary_data_output for all outputs, JSON inputs
    body = {"parameters": {"binary_data_output": True, "max_tokens": N, "temperature": 0},
            "inputs": [text_in([PROMPT, PROMPT2])]}
    st, h, b = req("POST", BASE + "/infer", body)
    try:
        j, btail = split_binary_response(h, b)
        sizes = [o["parameters"]["binary_data_size"] for o in j["outputs"]]
        parts = parse_bytes(btail[:sizes[0]]), parse_bytes(btail[sizes[0]:])
    except Exception:
        parts = None
    s.case("binary_data_output: every output in the tail, in order",
           st == 200 and h.get("content-type") == "application/octet-stream"
           and parts == ([want.encode(), want2.encode()], [b"length", b"length"]), b[:300])
    # non-ASCII BYTES through the binary path and back (the model may not know it; it must not crash)
    tail = bytes_elems("Ünïcödé 😀")
    head = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                        "parameters": {"binary_data_size": len(tail)}}],
            "parameters": {"max_tokens": 4, "temperature": 0, "binary_data_output": True}}
    st, h, b = binary_request(BASE + "/infer", head, tail)
    s.case("binary: UTF-8 prompt in the tail is accepted", st == 200, b[:200])


s.guard("golden outputs", golden_outputs)


def validation():
    def infer(inputs, **kw):
        body = {"inputs": inputs}
        body.update(kw)
        return req("POST", BASE + "/infer", body)

    t1 = text_in(["x"])
    bad = [
        ("shape count mismatch", [text_in(["a"], shape=[2])], "shape [2] has 2"),
        ("nesting not as the shape", [text_in([["a", "b", "c"], ["d"]], shape=[2, 2])], "nesting"),
        ("negative dimension", [text_in(["a"], shape=[-1])], "shape[0]"),
        ("shape a string", [text_in(["a"], shape="1")], "shape"),
        ("shape with a float", [text_in(["a"], shape=[1.5])], "shape[0]"),
        ("17 dimensions", [text_in(["a"], shape=[1] * 17)], "dimensions"),
        ("huge dims overflow", [text_in(["a"], shape=[2 ** 62, 2 ** 62])], "too large"),
        ("huge dim, one element", [text_in(["a"], shape=[10 ** 15])], "elements"),
        ("huge dim product just past int64", [text_in(["a"], shape=[2 ** 32, 2 ** 32])], "too large"),
        ("unknown datatype", [{"name": "text_input", "datatype": "FLOAT32", "shape": [1], "data": [1]}],
         "datatype"),
        ("lower-case datatype", [{"name": "text_input", "datatype": "bytes", "shape": [1], "data": ["a"]}],
         "datatype"),
        ("text_input as INT32", [{"name": "text_input", "datatype": "INT32", "shape": [1], "data": [1]}],
         "BYTES"),
        ("max_tokens as INT64 (declared INT32)", [t1, scalar("max_tokens", "INT64", 4)], "datatype"),
        ("INT32 element out of range", [t1, scalar("max_tokens", "INT32", 2 ** 40)], "data[0]"),
        ("INT8 element 300", [{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}], "INT8"),
        ("UINT8 element -1", [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [-1]}], "UINT8"),
        ("BOOL element 1", [{"name": "x", "datatype": "BOOL", "shape": [1], "data": [1]}], "BOOL"),
        ("FP32 element a string", [t1, scalar("temperature", "FP32", "0.5")], "FP32"),
        ("FP32 element 1e300", [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1e300]}], "FP32"),
        ("FP16 element 1e6", [{"name": "x", "datatype": "FP16", "shape": [1], "data": [1e6]}], "FP16"),
        ("BYTES element a number", [text_in([5])], "string"),
        ("data an object", [text_in({"a": 1})], "data"),
        ("data missing", [{"name": "text_input", "datatype": "BYTES", "shape": [1]}], "data"),
        ("name missing", [{"datatype": "BYTES", "shape": [1], "data": ["a"]}], "name"),
        ("duplicate inputs", [t1, t1], "duplicate"),
        ("missing text_input", [scalar("max_tokens", "INT32", 4)], "text_input"),
        ("unknown input", [t1, scalar("bogus", "INT32", 4)], "bogus"),
        ("max_tokens with two elements", [t1, {"name": "max_tokens", "datatype": "INT32", "shape": [2],
                                               "data": [1, 2]}], "one element"),
        ("max_tokens 0", [t1, scalar("max_tokens", "INT32", 0)], "max_tokens"),
        ("temperature -1", [t1, scalar("temperature", "FP32", -1.0)], "temperature"),
        ("empty prompt", [text_in([""])], "empty"),
        ("no prompts (shape [0])", [text_in([], shape=[0])], "prompts"),
        ("too many prompts", [text_in(["a"] * 200)], "prompts"),
    ]
    for name, inputs, needle in bad:
        e = case_error(f"infer: {name} is 400", 400, infer(inputs))
        s.case(f"infer: {name}: message names it ({needle!r})", needle.lower() in e.lower(), e)
    for name, body, needle in [
        ("inputs missing", {"id": "1"}, "inputs"),
        ("inputs empty", {"inputs": []}, "inputs"),
        ("id a number", {"id": 5, "inputs": [t1]}, "id"),
        ("parameters a list", {"parameters": [1], "inputs": [t1]}, "parameters"),
        ("binary_data_output a string", {"parameters": {"binary_data_output": "yes"}, "inputs": [t1]},
         "binary_data_output"),
        ("unknown output", {"inputs": [t1], "outputs": [{"name": "logits"}]}, "logits"),
        ("duplicate output", {"inputs": [t1], "outputs": [{"name": "text_output"}] * 2}, "duplicate"),
        ("binary_data a number", {"inputs": [t1], "outputs": [{"name": "text_output",
                                                               "parameters": {"binary_data": 1}}]},
         "binary_data"),
        ("parameters.max_tokens huge", {"parameters": {"max_tokens": 10 ** 12}, "inputs": [t1]},
         "parameters.max_tokens"),
        ("parameters.max_tokens past the context", {"parameters": {"max_tokens": 4000}, "inputs": [t1]},
         "max_tokens"),
    ]:
        e = case_error(f"infer: {name} is 400", 400, req("POST", BASE + "/infer", body))
        s.case(f"infer: {name}: message names it ({needle!r})", needle.lower() in e.lower(), e)
    for name, raw in [("malformed JSON", b'{"inputs": ['), ("empty body", b""), ("a list", b"[1]"),
                      ("deeply nested", b"[" * 5000 + b"]" * 5000)]:
        case_error(f"infer: {name} is 400", 400, req("POST", BASE + "/infer", raw))

    # binary extension errors
    def bin_in(size, dt="BYTES", shape=(1,), name="text_input"):
        return {"name": name, "datatype": dt, "shape": list(shape), "parameters": {"binary_data_size": size}}

    good = bytes_elems("hello")
    cases = [
        ("truncated binary tail", {"inputs": [bin_in(len(good))]}, good[:-2], None, "left"),
        ("header length past the body", {"inputs": [t1]}, b"", 10 ** 6, "past the end"),
        ("header length not a number", {"inputs": [t1]}, b"", "12x", "Inference-Header-Content-Length"),
        ("header length huge", {"inputs": [t1]}, b"", "99999999999999999999999", "Inference-Header"),
        ("tail not claimed", {"inputs": [t1]}, b"abc", None, "not claimed"),
        ("BYTES element longer than its data", {"inputs": [bin_in(9)]}, struct.pack("<I", 100) + b"hello",
         None, "claims"),
        ("BYTES length cut short", {"inputs": [bin_in(7)]}, good[:4] + b"hel", None, "claims"),
        ("BYTES data after the elements", {"inputs": [bin_in(len(good) + 3)]}, good + b"xyz", None,
         "follow"),
        ("BYTES count too large for its size", {"inputs": [bin_in(8, shape=(1000,))]}, b"\0" * 8, None,
         "cannot hold"),
        ("INT32 size not 4 x count", {"inputs": [{**bin_in(3, "INT32", name="max_tokens")}, t1]}, b"\1\0\0",
         None, "needs"),
        ("huge shape with a small binary size", {"inputs": [bin_in(4, "FP32", (2 ** 40,), "x")]},
         b"\0" * 4, None, "needs"),
        ("negative binary_data_size", {"inputs": [bin_in(-4)]}, b"", None, "binary_data_size"),
        ("binary_data_size and data", {"inputs": [{**t1, "parameters": {"binary_data_size": 0}}]}, b"",
         None, "not both"),
        ("BOOL byte 2", {"inputs": [bin_in(1, "BOOL", name="ignore_eos"), t1]}, b"\2", None, "BOOL"),
    ]
    for name, head, tail, hl, needle in cases:
        e = case_error(f"binary: {name} is 400", 400, binary_request(BASE + "/infer", head, tail, hl))
        s.case(f"binary: {name}: message says so ({needle!r})", needle.lower() in e.lower(), e)
    e = case_error("binary: binary_data_size without the header is 400", 400,
                   req("POST", BASE + "/infer", {"inputs": [bin_in(9)]}))
    s.case("... and says the header is needed", "Inference-Header-Content-Length" in e, e)

    # generate errors
    for name, body, needle in [
        ("text_input missing", {"parameters": {}}, "text_input"),
        ("text_input a number", {"text_input": 5}, "text_input"),
        ("text_input empty", {"text_input": ""}, "empty"),
        ("unknown top-level input", {"text_input": "x", "bad_words": ""}, "bad_words"),
        ("parameters a string", {"text_input": "x", "parameters": "x"}, "parameters"),
        ("temperature a string", {"text_input": "x", "parameters": {"temperature": "hot"}},
         "parameters.temperature"),
        ("max_tokens negative", {"text_input": "x", "max_tokens": -1}, "max_tokens"),
        ("stop with 100 strings", {"text_input": "x", "stop": ["a"] * 100}, "stop"),
        ("seed a float", {"text_input": "x", "seed": 1.5}, "seed"),
    ]:
        for route in ("/generate", "/generate_stream"):
            e = case_error(f"{route}: {name} is 400", 400, req("POST", BASE + route, body))
            s.case(f"{route}: {name}: message names it ({needle!r})", needle.lower() in e.lower(), e)
    case_error("generate: malformed JSON is 400", 400, req("POST", BASE + "/generate", b"{"))
    case_error("generate: empty body is 400", 400, req("POST", BASE + "/generate", b""))


s.guard("validation", validation)


def sampling():
    body = {"text_input": PROMPT, "parameters": {"max_tokens": 12, "temperature": 0.9, "seed": 7}}
    a = jbody(req("POST", BASE + "/generate", body)[2]) or {}
    b = jbody(req("POST", BASE + "/generate", body)[2]) or {}
    s.case("generate: the same seed gives the same text", a.get("text_output") and
           a.get("text_output") == b.get("text_output"), (a, b))
    st, _, r = req("POST", BASE + "/generate",
                   {"text_input": PROMPT, "max_tokens": 40, "temperature": 0, "stop": ["little"]})
    j = jbody(r) or {}
    s.case("generate: a stop string ends the text before it, finish_reason stop",
           st == 200 and "little" not in j.get("text_output", "x") and j.get("finish_reason") == "stop", r)
    # JSON integers stop at 2^63 - 1 (jansson): a larger UINT64 comes through the binary tail.
    st, _, r = binary_request(BASE + "/infer",
                              {"inputs": [text_in([PROMPT]),
                                          {"name": "stop", "datatype": "BYTES", "shape": [1, 1],
                                           "data": [["little"]]},
                                          {"name": "seed", "datatype": "UINT64", "shape": [1],
                                           "parameters": {"binary_data_size": 8}},
                                          scalar("ignore_eos", "BOOL", True)],
                               "parameters": {"max_tokens": 40, "temperature": 0}},
                              struct.pack("<Q", 2 ** 63 + 5))
    j = jbody(r) or {}
    outs = {o["name"]: o["data"] for o in j.get("outputs", [])}
    s.case("infer: stop (BYTES [1,1]), UINT64 seed above 2^63, BOOL input",
           st == 200 and "little" not in outs.get("text_output", ["little"])[0]
           and outs.get("finish_reason") == ["stop"], r[:300])


s.guard("sampling", sampling)


def scheduling():
    """priority and timeout: Triton's schedule-policy parameters (docs/api.md)."""
    gen = BASE + "/generate"
    for where, body in (("parameters", {"text_input": PROMPT, "parameters": {"priority": "gold"}}),
                        ("top level", {"text_input": PROMPT, "priority": "gold"})):
        e = case_error(f"priority: unknown tier ({where}) is 400", 400, req("POST", gen, body))
        s.case(f"priority: the error names the parameter ({where})", "priority" in e, e)
    e = case_error("priority: a negative level is 400 (Triton's levels are >= 0)", 400,
                   req("POST", gen, {"text_input": PROMPT, "parameters": {"priority": -1}}))
    s.case("priority: the negative level's error names the parameter", "priority" in e, e)
    case_error("priority: a bad tier in infer parameters is 400", 400,
               req("POST", BASE + "/infer", {"parameters": {"priority": "gold"},
                                             "inputs": [text_in([PROMPT])]}))
    case_error("timeout: 0 is 400", 400,
               req("POST", gen, {"text_input": PROMPT, "parameters": {"timeout": 0}}))
    case_error("timeout: a string is 400", 400,
               req("POST", gen, {"text_input": PROMPT, "timeout": "1s"}))
    ok = []
    for pr in ("premium", "standard", "batch", 0, 1, 2, 3, None):
        body = {"text_input": PROMPT, "max_tokens": 4, "temperature": 0, "priority": pr}
        st, _, b = req("POST", gen, body)
        ok.append((pr, st))
    s.case("priority: tier names and Triton levels 0..3 are accepted",
           all(st == 200 for _, st in ok), str(ok))
    # A batch of 8 long generations at Triton level 3 runs (and waits) in the batch tier.
    seen = {}

    def watch():
        end = time.time() + 10
        while time.time() < end and not seen.get("done"):
            c = http.client.HTTPConnection("127.0.0.1", P, timeout=5)
            c.request("GET", "/stats")
            d = json.loads(c.getresponse().read())["models"][NAME]
            c.close()
            for k in ("running_by_tier", "waiting_by_tier"):
                for t, v in d[k].items():
                    if v:
                        seen[t] = True
            time.sleep(0.002)

    w = threading.Thread(target=watch)
    w.start()
    st, _, b = req("POST", BASE + "/infer",
                   {"parameters": {"priority": 3, "max_tokens": 400, "ignore_eos": True},
                    "inputs": [text_in([PROMPT] * 8)]}, timeout=60)
    seen["done"] = True
    w.join(15)
    s.case("priority: level 3 runs in the batch tier (GET /stats)",
           st == 200 and seen.get("batch") and not seen.get("premium") and not seen.get("standard"),
           f"status {st}, tiers seen {sorted(k for k in seen if k != 'done')}")
    # timeout is in microseconds, as Triton's: 3000 us cannot generate 480 tokens.
    body = {"text_input": PROMPT, "max_tokens": 480, "ignore_eos": True,
            "parameters": {"timeout": 3000}}
    st, _, b = req("POST", gen, body)
    e = error_of(b) or ""
    s.case("timeout: parameters.timeout (us) ends generate with a deadline error",
           st == 503 and "deadline" in e, f"status {st} {b[:200]!r}")
    st, _, b = req("POST", BASE + "/generate_stream", dict(body, parameters=None, timeout=3000))
    events = [json.loads(x[6:]) for x in b.decode().split("\n\n") if x.startswith("data: ")]
    s.case("timeout: a top-level timeout ends a stream with a data: {error} event",
           st == 200 and events and "deadline" in events[-1].get("error", ""), b[-200:])
    st, _, b = req("POST", BASE + "/infer",
                   {"parameters": {"timeout": 3000, "max_tokens": 480, "ignore_eos": True},
                    "inputs": [text_in([PROMPT])]})
    s.case("timeout: infer parameters.timeout is enforced",
           st == 503 and "deadline" in (error_of(b) or ""), f"status {st} {b[:200]!r}")
    st, _, b = req("POST", gen, {"text_input": PROMPT, "max_tokens": 8, "timeout": 60000000})
    s.case("timeout: a generous timeout does not cut a short request", st == 200, b[:200])


s.guard("scheduling", scheduling)


def disconnect():
    c = socket.create_connection(("127.0.0.1", P), timeout=5)
    body = json.dumps({"text_input": PROMPT, "max_tokens": 480, "ignore_eos": True,
                       "temperature": 0}).encode()
    c.sendall(b"POST %s/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
              % (BASE.encode(), len(body), body))
    buf = b""
    while b"data: " not in buf:
        d = c.recv(4096)
        if not d:
            break
        buf += d
    c.close()
    m = srv.wait_log(r"event=job_cancelled reason=cancelled prompt_tokens=\d+ completion_tokens=(\d+)")
    s.case("generate_stream starts with 200 and an SSE event", buf.startswith(b"HTTP/1.1 200")
           and b"text/event-stream" in buf and b"data: {" in buf, buf[:200])
    s.case("disconnect mid-stream is seen (client_disconnect logged)", "event=client_disconnect" in srv.text())
    s.case("disconnect cancels the job before max_tokens", m is not None and int(m.group(1)) < 480,
           m.group(0) if m else srv.text()[-300:])
    s.case("the server still serves after the disconnect",
           req("POST", BASE + "/generate", {"text_input": PROMPT, "max_tokens": 4})[0] == 200)


s.guard("disconnect", disconnect)

rc = srv.stop()
s.case("server exits 0 on SIGTERM", rc == 0, rc)


def key_and_queue():
    """A second server: an API key, one slot and no queue."""
    global P
    d = Server("--api-key", "sekret", "--parallel", "1", "--queue", "0")
    P = d.port
    auth = {"Authorization": "Bearer sekret"}
    try:
        case_error("api key: /v2 model metadata without the key is 401 {error}", 401, req("GET", BASE))
        s.case("api key: /v2/health/live needs none", req("GET", "/v2/health/live")[0] == 200)
        s.case("api key: with the key metadata is 200", req("GET", BASE, headers=auth)[0] == 200)
        case_error("queue: a batch larger than slots + queue is 400 {error}", 400,
                   req("POST", BASE + "/infer", {"inputs": [text_in(["a", "b"])]}, headers=auth))
        # While a long stream holds the one slot, another request is 429. The stream takes
        # ~70 ms here; three tries make a descheduled client harmless.
        got = None
        for _ in range(3):
            c = socket.create_connection(("127.0.0.1", P), timeout=5)
            body = json.dumps({"text_input": PROMPT, "max_tokens": 480, "ignore_eos": True}).encode()
            c.sendall(b"POST %s/generate_stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (BASE.encode(), len(body), body))
            c.recv(64)
            got = req("POST", BASE + "/generate", {"text_input": PROMPT}, headers=auth)
            c.close()
            if got[0] == 429:
                break
            time.sleep(0.2)
        case_error("queue: with the slot busy and no queue, generate is 429 {error}", 429, got)
        ra = got[1].get("retry-after", "")
        s.case("queue: ... with Retry-After (seconds from the drain rate, 1..60)",
               ra.isdigit() and 1 <= int(ra) <= 60, got[1])
    finally:
        s.case("second server exits 0", d.stop() == 0)


s.guard("api key and queue", key_and_queue)


def deadline():
    """A third server: a request deadline that ends generations early."""
    global P
    d = Server("--request-timeout", "0.005")
    P = d.port
    try:
        body = {"text_input": PROMPT, "max_tokens": 480, "ignore_eos": True}
        st, _, b = req("POST", BASE + "/generate", body)
        s.case("deadline: generate past --request-timeout is 503 {error}",
               st == 503 and error_of(b) is not None, b[:200])
        st, h, b = req("POST", BASE + "/generate_stream", body)
        events = [json.loads(e[6:]) for e in b.decode().split("\n\n") if e.startswith("data: ")]
        s.case("deadline: a stream that started ends with a data: {error} event",
               st == 200 and events and set(events[-1]) == {"error"}, b[-200:])
    finally:
        s.case("third server exits 0", d.stop() == 0)


s.guard("deadline", deadline)
s.finish()
