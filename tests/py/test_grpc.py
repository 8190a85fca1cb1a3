"""test_grpc.py - the KServe v2 gRPC service (inference.GRPCInferenceService, docs/grpc.md)
through a real client: @grpc/grpc-js with proto/grpc_service.proto loaded by
@grpc/proto-loader (tests/node/grpc_client.mjs), against `sampan serve --grpc-port N` with
the identity backend, the XGBoost credit-card model and the demo LLM.

Every method answers (ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata,
ModelInfer with typed and raw contents, ModelStreamInfer for an LLM token by token and for a
tensor model); gRPC and REST give the same answers (fraud scores, greedy LLM text); bad
messages get the right status codes with a message naming the field (wrong datatype,
shape/data mismatch, unknown datatype, missing fields, unknown model, malformed protobuf,
over --max-body-bytes, bad or missing API key, broken frames sent over raw HTTP/2: no message,
a truncated frame, a compressed flag, an unknown method, a wrong content type, two messages
on a unary call, oversized headers); a cancelled stream cancels its job; gRPC requests count
in the model's metrics; TLS (ALPN h2) when HTTP has TLS; --grpc-port checks. The server
must be alive after every bad input. Last line:
    grpc: N passed, N failed, N skipped"""
import base64
import csv
import json
import os
import shutil
import struct
import subprocess
import tempfile

from common import DEMO_MODEL, ROOT, Server, Suite, binary, free_port, grpc_client, have_grpc_client, http_json

s = Suite("grpc")
DATA = os.path.join(ROOT, "tests", "data", "xgboost")
PLUGINS = os.path.join(os.path.dirname(binary() or ""), "backends")
KEY = "grpc-test-key-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}


def b64(b):
    return base64.b64encode(b).decode()


def bytes_el(*strs):
    """BYTES tensor raw layout: 4-byte little-endian length before each element."""
    return b"".join(struct.pack("<I", len(x)) + x for x in strs)


def ident_req(**kw):
    r = {"model_name": "ident", "id": "req-1", "inputs": [
        {"name": "f", "datatype": "FP32", "shape": [2, 3],
         "contents": {"fp32_contents": [1.5, -2, 3, 4, 5, 6.25]}},
        {"name": "i", "datatype": "INT64", "shape": [2, 1], "contents": {"int64_contents": [9, -7]}},
        {"name": "s", "datatype": "BYTES", "shape": [2, 1],
         "contents": {"bytes_contents": [b64("héllo".encode()), b64(b"")]}}]}
    r.update(kw)
    return r


def ident_raw():
    return {"model_name": "ident", "inputs": [
        {"name": "f", "datatype": "FP32", "shape": [1, 3]},
        {"name": "i", "datatype": "INT64", "shape": [1, 1]},
        {"name": "s", "datatype": "BYTES", "shape": [1, 1]}],
        "raw_input_contents": [b64(struct.pack("<3f", 1, 2, 3)), b64(struct.pack("<q", 42)),
                               b64(bytes_el(b"raw"))]}


def outputs(resp):
    """{name: raw bytes} of a ModelInferResponse."""
    outs = resp.get("outputs", [])
    raw = resp.get("raw_output_contents", [])
    return {o["name"]: base64.b64decode(raw[i]) for i, o in enumerate(outs) if i < len(raw)}


def text_of(resp):
    raw = outputs(resp).get("text_output", b"")
    return raw[4:].decode("utf-8", "replace") if len(raw) >= 4 else ""


def llm_req(prompt, max_tokens, rid=""):
    return {"model_name": "stories260K", "id": rid, "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1],
         "contents": {"bytes_contents": [b64(prompt.encode())]}},
        {"name": "max_tokens", "datatype": "INT32", "shape": [1], "contents": {"int_contents": [max_tokens]}},
        {"name": "temperature", "datatype": "FP32", "shape": [1], "contents": {"fp32_contents": [0]}}]}


def frame(msg, flag=0):
    return bytes([flag]) + struct.pack(">I", len(msg)) + msg


def model(repo, name, cfg, files=()):
    os.makedirs(os.path.join(repo, name, "1"))
    for f in files:
        shutil.copy(os.path.join(DATA, f), os.path.join(repo, name, "1", f))
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump(dict({"name": name}, **cfg), f)


IDENT = {"backend": "identity", "max_batch_size": 8,
         "input": [{"name": "f", "data_type": "TYPE_FP32", "dims": [3]},
                   {"name": "i", "data_type": "TYPE_INT64", "dims": [1]},
                   {"name": "s", "data_type": "TYPE_STRING", "dims": [1]}],
         "output": [{"name": "f_out", "data_type": "TYPE_FP32", "dims": [3]},
                    {"name": "i_out", "data_type": "TYPE_INT64", "dims": [1]},
                    {"name": "s_out", "data_type": "TYPE_STRING", "dims": [1]}]}


def stats_success(port, name):
    st, b = http_json(port, "GET", "/stats", headers=AUTH)
    m = (b or {}).get("models", {}).get(name, {}) if st == 200 else {}
    return m.get("requests_success", -1)


def test_methods(srv, gport, have_xgb):
    before = stats_success(srv.port, "ident")
    calls = [
        {"method": "ServerLive", "request": {}, "metadata": AUTH},
        {"method": "ServerReady", "request": {}, "metadata": AUTH},
        {"method": "ServerMetadata", "request": {}, "metadata": AUTH},
        {"method": "ModelReady", "request": {"name": "ident"}, "metadata": AUTH},
        {"method": "ModelReady", "request": {"name": "ident", "version": "1"}, "metadata": AUTH},
        {"method": "ModelReady", "request": {"name": "nosuchmodel"}, "metadata": AUTH},
        {"method": "ModelMetadata", "request": {"name": "ident"}, "metadata": AUTH},
        {"method": "ModelMetadata", "request": {"name": "stories260K"}, "metadata": AUTH},
        {"method": "ModelInfer", "request": ident_req(), "metadata": AUTH},
        {"method": "ModelInfer", "request": ident_raw(), "metadata": AUTH},
    ]
    r = grpc_client(gport, calls)
    s.case("ServerLive: live", r[0].get("code") == 0 and r[0]["response"]["live"] is True, str(r[0]))
    s.case("ServerReady: ready", r[1].get("code") == 0 and r[1]["response"]["ready"] is True, str(r[1]))
    m = r[2].get("response", {})
    s.case("ServerMetadata: name, version, extensions as on GET /v2",
           m.get("name") == "sampan" and m.get("version") and "binary_tensor_data" in m.get("extensions", []),
           str(r[2]))
    s.case("ModelReady: ready (newest and version 1)",
           r[3].get("response", {}).get("ready") is True and r[4].get("response", {}).get("ready") is True,
           f"{r[3]} {r[4]}")
    s.case("ModelReady: an unknown model is NOT_FOUND with its name",
           r[5].get("code") == 5 and "nosuchmodel" in r[5].get("details", ""), str(r[5]))
    mm = r[6].get("response", {})
    s.case("ModelMetadata: a tensor model's inputs and outputs",
           [t["name"] for t in mm.get("inputs", [])] == ["f", "i", "s"] and
           mm.get("inputs", [{}])[0].get("datatype") == "FP32" and
           mm.get("inputs", [{}])[0].get("shape") == [-1, 3] and mm.get("versions") == ["1"], str(r[6])[:300])
    lm = r[7].get("response", {})
    s.case("ModelMetadata: the LLM's text_input and text_output",
           any(t["name"] == "text_input" and t["datatype"] == "BYTES" for t in lm.get("inputs", [])) and
           any(t["name"] == "text_output" for t in lm.get("outputs", [])), str(r[7])[:300])
    o = outputs(r[8].get("response", {}))
    s.case("ModelInfer (typed contents): FP32, INT64 and BYTES come back unchanged, with the id",
           r[8].get("code") == 0 and r[8]["response"].get("id") == "req-1" and
           r[8]["response"].get("model_name") == "ident" and
           o.get("f_out") == struct.pack("<6f", 1.5, -2, 3, 4, 5, 6.25) and
           o.get("i_out") == struct.pack("<2q", 9, -7) and
           o.get("s_out") == bytes_el("héllo".encode(), b""), str(r[8])[:400])
    o = outputs(r[9].get("response", {}))
    shapes = [x.get("shape") for x in r[9].get("response", {}).get("outputs", [])]
    s.case("ModelInfer (raw_input_contents): the same bytes and shapes back",
           r[9].get("code") == 0 and o.get("f_out") == struct.pack("<3f", 1, 2, 3) and
           o.get("i_out") == struct.pack("<q", 42) and o.get("s_out") == bytes_el(b"raw") and
           shapes == [[1, 3], [1, 1], [1, 1]], str(r[9])[:400])
    after = stats_success(srv.port, "ident")
    s.case("gRPC requests count in the model's metrics (/stats requests_success)",
           after >= before + 2, f"{before} -> {after}")

    if have_xgb:
        data = list(csv.reader(open(os.path.join(DATA, "creditcard-test.csv"))))[1:]
        pred = list(csv.reader(open(os.path.join(DATA, "creditcard-depth3-50trees.test-pred.csv"))))[1:]
        feats = [[float(v) for v in row[1:31]] for row in data[:16]]
        exp = [float(p[2]) for p in pred[:16]]
        flat = [v for row in feats for v in row]
        req = {"model_name": "fraud", "inputs": [{"name": "input__0", "datatype": "FP32",
                                                  "shape": [16, 30], "contents": {"fp32_contents": flat}}]}
        rr = grpc_client(gport, [{"method": "ModelInfer", "request": req, "metadata": AUTH}])[0]
        raw = outputs(rr.get("response", {}))
        got = list(struct.unpack(f"<{len(next(iter(raw.values()), b'')) // 4}f",
                                 next(iter(raw.values()), b""))) if raw else []
        st, rb = http_json(srv.port, "POST", "/v2/models/fraud/infer",
                           {"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [16, 30],
                                        "data": flat}]}, headers=AUTH)
        rest = rb["outputs"][0]["data"] if st == 200 else []
        s.case("ModelInfer fraud (XGBoost): the expected scores, equal to REST's",
               len(got) == 16 and all(abs(a - b) < 1e-5 for a, b in zip(got, exp)) and
               all(abs(a - b) < 1e-6 for a, b in zip(got, rest)), f"{got[:3]} {exp[:3]} {rest[:3]}")
    else:
        s.skip("ModelInfer fraud", "libsampan_xgboost.so not built")


def test_llm(srv, gport):
    prompt = "Once upon a time"
    st, rb = http_json(srv.port, "POST", "/v2/models/stories260K/generate",
                       {"text_input": prompt, "max_tokens": 12, "temperature": 0}, headers=AUTH)
    rest_text = rb.get("text_output") if st == 200 else None
    calls = [
        {"method": "ModelInfer", "request": llm_req(prompt, 12, "u1"), "metadata": AUTH},
        {"method": "ModelStreamInfer", "requests": [llm_req(prompt, 12, "s1")], "metadata": AUTH},
        {"method": "ModelStreamInfer", "metadata": AUTH, "requests": [
            ident_req(id="a"), dict(ident_req(id="b"), model_name="nosuchmodel"), ident_raw()]},
        {"method": "ModelStreamInfer", "metadata": AUTH, "requests": [
            dict(llm_req(prompt, 8, "bad"), inputs=[{"name": "text_input", "datatype": "BYTES", "shape": [2],
                                                     "contents": {"bytes_contents": [b64(b"a"), b64(b"b")]}}])]},
        {"method": "ModelStreamInfer", "metadata": AUTH, "requests": [llm_req(prompt, 500, "c")],
         "cancel_after_responses": 1},
    ]
    r = grpc_client(gport, calls)
    s.case("ModelInfer on the LLM: text_output equals REST generate's (greedy)",
           r[0].get("code") == 0 and rest_text and text_of(r[0]["response"]) == rest_text,
           f"{str(r[0])[:300]} rest={rest_text!r}")
    resps = r[1].get("responses", [])
    inf = [x.get("infer_response") or {} for x in resps]
    text = "".join(text_of(x) for x in inf)
    last = inf[-1] if inf else {}
    final = last.get("parameters", {}).get("triton_final_response", {}).get("bool_param")
    fin = outputs(last).get("finish_reason", b"")[4:].decode()
    s.case("ModelStreamInfer on the LLM: several responses, the text equals REST's",
           r[1].get("code") == 0 and len(resps) >= 3 and text == rest_text and
           all(x.get("id") == "s1" for x in inf), f"{len(resps)} {text!r} vs {rest_text!r} {r[1].get('details')}")
    s.case("... the last response has finish_reason and triton_final_response = true",
           final is True and fin in ("length", "stop") and
           all(x.get("parameters", {}).get("triton_final_response", {}).get("bool_param") is False
               for x in inf[:-1]), f"{final} {fin!r}")
    resps = r[2].get("responses", [])
    errs = [x for x in resps if x.get("error_message")]
    oks = [x for x in resps if not x.get("error_message")]
    s.case("ModelStreamInfer on a tensor model: one response per request, a bad one is its own error",
           r[2].get("code") == 0 and len(oks) == 2 and len(errs) == 1 and
           "nosuchmodel" in errs[0]["error_message"] and (errs[0].get("infer_response") or {}).get("id") == "b",
           str(r[2])[:500])
    e = r[3].get("responses", [{}])
    s.case("ModelStreamInfer: two prompts in one LLM request is an error_message naming the shape",
           r[3].get("code") == 0 and len(e) == 1 and "shape" in e[0].get("error_message", ""), str(r[3])[:300])
    s.case("a cancelled stream ends CANCELLED at the client",
           r[4].get("code") == 1, str(r[4])[:300])
    m = srv.wait_log(r"event=client_disconnect", timeout=5)
    s.case("... and cancels the job on the server (event=client_disconnect)", m is not None)


def test_bad(srv, gport, max_body):
    big = max_body // 4 + 1024
    calls = [
        {"method": "ModelInfer", "request": ident_req(inputs=[
            {"name": "f", "datatype": "FP32", "shape": [1, 3], "contents": {"int_contents": [1, 2, 3]}}])},
        {"method": "ModelInfer", "request": ident_req(inputs=[
            {"name": "f", "datatype": "FP32", "shape": [1, 3], "contents": {"fp32_contents": [1, 2]}}])},
        {"method": "ModelInfer", "request": dict(ident_raw(), raw_input_contents=[
            b64(struct.pack("<2f", 1, 2)), b64(struct.pack("<q", 1)), b64(bytes_el(b"x"))])},
        {"method": "ModelInfer", "request": ident_req(inputs=[
            {"name": "f", "datatype": "FP33", "shape": [1, 3], "contents": {"fp32_contents": [1, 2, 3]}}])},
        {"method": "ModelInfer", "request": ident_req(model_name="")},
        {"method": "ModelInfer", "request": ident_req(model_name="nosuchmodel")},
        {"method": "ModelInfer", "request": ident_req(inputs=[])},
        {"method": "ModelInfer", "request": ident_req(inputs=[
            {"name": "f", "datatype": "FP32", "shape": [1, 3], "contents": {"fp32_contents": [1, 2, 3]}}])},
        {"method": "ModelInfer", "raw": b64(b"\x0a\xff\xff\xff\xff\x0f")},
        {"method": "ModelInfer", "request": {"model_name": "ident", "inputs": [
            {"name": "f", "datatype": "FP32", "shape": [1, big]}],
            "raw_input_contents": [b64(b"\0" * (big * 4))]}},
        {"method": "ModelInfer", "request": ident_req(inputs=[
            {"name": "f", "datatype": "INT8", "shape": [1], "contents": {"int_contents": [300]}}])},
        {"method": "ModelInfer", "request": ident_req(inputs=[
            {"name": "f", "datatype": "FP16", "shape": [1], "contents": {"fp32_contents": [1]}}])},
        {"method": "ModelInfer", "request": dict(ident_raw(), raw_input_contents=[b64(b"x")])},
        {"method": "ModelReady", "request": {"name": "a/b"}},
        {"method": "ModelInfer", "request": dict(llm_req("Hi", 2), parameters={"timeout": {"string_param": "soon"}})},
    ]
    for c in calls:
        c.setdefault("metadata", AUTH)
    r = grpc_client(gport, calls)
    cases = [
        ("wrong datatype field (int_contents for FP32): INVALID_ARGUMENT naming fp32_contents", 3, "fp32_contents"),
        ("shape/contents mismatch: INVALID_ARGUMENT with the counts", 3, "holds 3 elements"),
        ("shape/raw bytes mismatch: INVALID_ARGUMENT naming the input", 3, "'f'"),
        ("unknown datatype: INVALID_ARGUMENT", 3, "FP33"),
        ("missing model_name: INVALID_ARGUMENT", 3, "name"),
        ("unknown model: NOT_FOUND", 5, "nosuchmodel"),
        ("no inputs: INVALID_ARGUMENT", 3, "inputs"),
        ("a missing input: INVALID_ARGUMENT naming it", 3, "'i'"),
        ("malformed protobuf: INVALID_ARGUMENT", 3, "malformed"),
        (f"a message over --max-body-bytes ({max_body}): RESOURCE_EXHAUSTED", 8, "--max-body-bytes"),
        ("INT8 value out of range: INVALID_ARGUMENT", 3, "out of range"),
        ("FP16 in typed contents: INVALID_ARGUMENT (raw only)", 3, "raw_input_contents"),
        ("raw_input_contents count != inputs: INVALID_ARGUMENT", 3, "raw_input_contents"),
        ("a model name with a slash: INVALID_ARGUMENT", 3, "name"),
        ("a bad scheduling parameter: INVALID_ARGUMENT naming it", 3, "timeout"),
    ]
    for (name, code, needle), res in zip(cases, r):
        s.case(name, res.get("code") == code and needle in res.get("details", ""), str(res)[:300])

    # Authentication: the HTTP keys, from the metadata.
    r = grpc_client(gport, [
        {"method": "ModelInfer", "request": ident_raw()},
        {"method": "ModelInfer", "request": ident_raw(), "metadata": {"authorization": "Bearer wrong"}},
        {"method": "ModelInfer", "request": ident_raw(), "metadata": {"x-api-key": KEY}},
        {"method": "ModelMetadata", "request": {"name": "ident"}},
        {"method": "ModelStreamInfer", "requests": [ident_raw()]},
        {"method": "ServerLive", "request": {}},
    ])
    s.case("no API key: UNAUTHENTICATED", r[0].get("code") == 16, str(r[0]))
    s.case("a wrong API key: UNAUTHENTICATED", r[1].get("code") == 16, str(r[1]))
    s.case("x-api-key metadata works as on HTTP", r[2].get("code") == 0, str(r[2])[:200])
    s.case("ModelMetadata without a key: UNAUTHENTICATED", r[3].get("code") == 16, str(r[3]))
    s.case("ModelStreamInfer without a key: the stream ends UNAUTHENTICATED", r[4].get("code") == 16, str(r[4]))
    s.case("ServerLive needs no key (like /v2/health/live)", r[5].get("code") == 0, str(r[5]))

    # Broken frames over raw HTTP/2 (node:http2).
    P = "/inference.GRPCInferenceService/"
    ok_msg = frame(b"\x0a\x05ident")  # ModelReadyRequest{name: "ident"}
    h = [
        {"h2": {"path": P + "NoSuchMethod", "headers": AUTH, "body": b64(frame(b""))}},
        {"h2": {"path": P + "ModelReady", "headers": AUTH, "body": ""}},
        {"h2": {"path": P + "ModelReady", "headers": AUTH, "body": b64(ok_msg[:-2])}},
        {"h2": {"path": P + "ModelReady", "headers": AUTH, "body": b64(frame(b"\x0a\x05ident", flag=1))}},
        {"h2": {"path": P + "ModelReady", "headers": dict(AUTH, **{"content-type": "application/json"}),
                "body": b64(ok_msg)}},
        {"h2": {"path": P + "ModelReady", "headers": AUTH, "body": b64(ok_msg + ok_msg)}},
        {"h2": {"path": P + "ModelReady", "headers": AUTH, "body": b64(ok_msg)}},
        {"h2": {"path": P + "ModelReady", "headers": dict(AUTH, **{"x-api-key": "k" * 20000}),
                "body": b64(ok_msg)}},
        {"h2": {"path": P + "ModelInfer", "headers": AUTH, "body": b64(b"\0\x7f\xff\xff\xff")},
         "timeout_ms": 5000},
    ]
    r = grpc_client(gport, h)

    def status(res):
        t = (res.get("trailers") or {}).get("grpc-status") or (res.get("headers") or {}).get("grpc-status")
        return int(t) if t is not None else None

    def message(res):
        return (res.get("trailers") or {}).get("grpc-message") or (res.get("headers") or {}).get("grpc-message") or ""

    s.case("raw HTTP/2: an unknown method is UNIMPLEMENTED", status(r[0]) == 12, str(r[0])[:300])
    s.case("raw HTTP/2: no message at all is INVALID_ARGUMENT", status(r[1]) == 3 and "no message" in message(r[1]),
           str(r[1])[:300])
    s.case("raw HTTP/2: a truncated frame is INVALID_ARGUMENT", status(r[2]) == 3 and "truncated" in message(r[2]),
           str(r[2])[:300])
    s.case("raw HTTP/2: a compressed message is UNIMPLEMENTED", status(r[3]) == 12, str(r[3])[:300])
    s.case("raw HTTP/2: a wrong content-type is INVALID_ARGUMENT", status(r[4]) == 3, str(r[4])[:300])
    s.case("raw HTTP/2: two messages on a unary call are UNIMPLEMENTED", status(r[5]) == 12, str(r[5])[:300])
    body = base64.b64decode(r[6].get("body", ""))
    s.case("raw HTTP/2: a well-formed call answers (status 0, one framed message)",
           status(r[6]) == 0 and body[:1] == b"\0" and struct.unpack(">I", body[1:5])[0] == len(body) - 5,
           str(r[6])[:300])
    s.case("raw HTTP/2: headers over --max-header-bytes are refused (RESOURCE_EXHAUSTED or reset)",
           status(r[7]) == 8 or r[7].get("error") or r[7].get("rst"), str(r[7])[:300])
    s.case("raw HTTP/2: a length prefix of 2 GiB is RESOURCE_EXHAUSTED at once",
           status(r[8]) == 8, str(r[8])[:300])
    r = grpc_client(gport, [{"method": "ServerLive", "request": {}}])
    s.case("the server is alive after every bad input", r[0].get("code") == 0, str(r[0]))


def test_tls(tmp, have_plugins_repo):
    if shutil.which("openssl") is None:
        s.skip("TLS", "openssl command missing")
        return
    key, crt = os.path.join(tmp, "k.pem"), os.path.join(tmp, "c.pem")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-addext", "basicConstraints=critical,CA:TRUE"], capture_output=True, text=True)
    if r.returncode != 0:
        s.skip("TLS", r.stderr[-200:])
        return
    gport = free_port()
    srv = Server("--tls-cert", crt, "--tls-key", key, "--grpc-port", str(gport))
    try:
        s.case("with --tls-cert the gRPC port is TLS (log says grpcs://)",
               srv.wait_log(r"event=grpc_listening url=grpcs://") is not None)
        r = grpc_client(gport, [{"method": "ServerLive", "request": {}},
                           {"method": "ModelReady", "request": {"name": "stories260K"}}], ca=crt)
        s.case("gRPC over TLS (ALPN h2) with grpc-js: ServerLive and ModelReady",
               r[0].get("code") == 0 and r[1].get("response", {}).get("ready") is True, str(r)[:300])
        r = grpc_client(gport, [{"method": "ServerLive", "request": {}, "deadline_ms": 3000}])
        s.case("plain-text gRPC on the TLS port fails (no fallback)", r[0].get("code") != 0, str(r[0])[:200])
    finally:
        s.case("TLS server exits cleanly", srv.stop() == 0)


def test_flags():
    rc = subprocess.run([binary(), "serve", "--grpc-port", "abc", "--port", "0"], capture_output=True,
                        text=True, timeout=20)
    s.case("--grpc-port abc is a usage error (exit 2)", rc.returncode == 2 and "--grpc-port" in rc.stderr,
           rc.stderr[-200:])
    srv = Server("--grpc-port", "off")
    try:
        s.case("--grpc-port off: no gRPC listener", "grpc_listening" not in srv.text())
    finally:
        srv.stop()


def main():
    if not have_grpc_client():
        s.skip("grpc", "node or tests/node/node_modules/@grpc/grpc-js missing (npm ci in tests/node)")
        s.finish()
        return
    if not os.path.isfile(os.path.join(PLUGINS, "libsampan_identity.so")):
        s.skip("grpc", f"backend plugins not built in {PLUGINS}")
        s.finish()
        return
    tmp = tempfile.mkdtemp(prefix="sampan-grpc-")
    repo = os.path.join(tmp, "repo")
    try:
        have_xgb = os.path.isfile(os.path.join(PLUGINS, "libsampan_xgboost.so"))
        model(repo, "ident", IDENT)
        if have_xgb:
            model(repo, "fraud", {"backend": "xgboost", "max_batch_size": 64},
                  ["creditcard-depth3-50trees.json"])
        shutil.copy(DEMO_MODEL, os.path.join(tmp, "stories260K.gguf"))
        os.makedirs(os.path.join(repo, "stories260K", "1"))
        shutil.copy(DEMO_MODEL, os.path.join(repo, "stories260K", "1", "model.gguf"))
        with open(os.path.join(repo, "stories260K", "config.json"), "w") as f:
            json.dump({"name": "stories260K"}, f)
        gport = free_port()
        max_body = 1 << 20
        srv = Server("--model-repository", repo, "--api-key", KEY, "--grpc-port", str(gport),
                     "--max-body-bytes", str(max_body), "--max-header-bytes", "8192", model=None)
        try:
            s.case("the gRPC port is announced (event=grpc_listening)",
                   srv.wait_log(rf"event=grpc_listening url=grpc://127\.0\.0\.1:{gport}") is not None)
            s.guard("methods", test_methods, srv, gport, have_xgb)
            s.guard("llm", test_llm, srv, gport)
            s.guard("bad input", test_bad, srv, gport, max_body)
            s.case("the access log marks gRPC calls (proto=grpc grpc_method=...)",
                   srv.wait_log(r"proto=grpc grpc_method=ModelInfer") is not None)
        finally:
            s.case("server exits cleanly (SIGTERM drains the gRPC calls too)", srv.stop() == 0,
                   srv.text()[-1500:])
        s.guard("tls", test_tls, tmp, True)
        s.guard("flags", test_flags)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


if __name__ == "__main__":
    main()
