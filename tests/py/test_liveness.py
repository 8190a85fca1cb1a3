"""test_liveness.py - one expensive request never holds the event loop, and limits answer 400.

- a 0.4 MB json_schema (9,999 required properties) and a 7.8 MB chat are prepared off the
  loop: while each runs, /live probes (one loop thread, the default) answer within 100 ms
  (a liveness bound, not a speed target: the work itself used to hold the loop for seconds);
- both answer 400 naming the limit they exceed (the grammar's rules, the template's output),
  not 413 (that one is for a body over --max-body-bytes);
- llama-server's /apply-template (the same 7.8 MB chat: 400 at the template's output limit)
  and /tokenize (a 4 MB text) are parsed, rendered and tokenized off the loop: /live within
  the same 100 ms while each runs;
- a grammar over the matcher's limits answers 400 with code limit_exceeded;
- a client that disconnects while its request is being prepared leaves the server serving
  (run with SAMPAN_BIN=build-san/sampan for the use-after-free check under ASan);
- KServe's LLM routes (generate, generate_stream, infer with a BYTES text_input in JSON or in
  the binary tail): a 4 MB prompt is parsed and tokenized off the loop (/live within the same
  100 ms), a 100 KB body decoded on a worker is still served, and clients that leave during
  that preparation leave the server serving;
- statuses: a BYTES prompt that is not UTF-8 is 400 on KServe infer; a model whose weights
  hold NaN (tools/gguf_gen.py --poison) answers 500 (a model fault, logged), never 400 and
  never an embedding of nulls, and its readiness and the server's then say not ready.
"""
import http.client
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time

from common import ROOT, Server, Suite, binary, http_json, run

s = Suite("liveness")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

PROBE_MS = 100


def big_schema(n=9999):
    props = {f"p{i:04d}": {"type": "integer"} for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)}


def big_chat_body():
    text = "lorem ipsum dolor sit amet " * (7_800_000 // 27)
    return {"model": "stories260K", "max_tokens": 4,
            "messages": [{"role": "user", "content": text}]}


def probe_while(port, fn):
    """Run fn() in a thread and probe GET /live until it returns (at most 60 s); returns
    (fn's result, latencies of the probes in ms)."""
    out = {}

    def job():
        try:
            out["r"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the case
            out["r"] = ("exception", repr(e))

    t = threading.Thread(target=job)
    t.start()
    lat = []
    end = time.time() + 60
    while t.is_alive() and time.time() < end and len(lat) < 5000:
        t0 = time.perf_counter()
        st, _ = http_json(port, "GET", "/live", timeout=10)
        lat.append((time.perf_counter() - t0) * 1000 if st == 200 else 1e9)
        time.sleep(0.01)
    t.join(60)
    return out.get("r"), lat


def post_raw(port, path, body, timeout=60):
    """POST a pre-encoded body; (status, parsed answer)."""
    return post_with(port, path, body, {"Content-Type": "application/json"}, timeout)


def post_with(port, path, body, headers, timeout=60, decode=True):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        raw = r.read()
        if not decode:
            return r.status, raw
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw
    finally:
        c.close()


def reset(so):
    """Leave as a vanished client does: a reset, not a FIN (the server answers a request
    followed by a FIN, since a FIN may be a half-close; docs/api.md)."""
    so.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    so.close()


def err_of(b):
    return b.get("error", {}) if isinstance(b, dict) else {}


srv = Server()
P = srv.port
try:
    schema_body = json.dumps({"model": "stories260K", "max_tokens": 4,
                              "messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "big",
                                                                  "schema": big_schema()}}}).encode()
    (st, b), lat = probe_while(P, lambda: post_raw(P, "/v1/chat/completions", schema_body))
    s.case("9,999-property schema (%d KB): /live answers within %d ms while it compiles"
           % (len(schema_body) // 1024, PROBE_MS),
           len(lat) > 0 and max(lat) < PROBE_MS, f"{len(lat)} probes, max {max(lat or [0]):.1f} ms")
    e = err_of(b)
    s.case("9,999-property schema: 400 naming the grammar's limit (not 413)",
           st == 400 and e.get("code") == "limit_exceeded"
           and ("more than" in e.get("message", "") or "passes 1 MiB" in e.get("message", "")),
           f"{st} {str(b)[:300]}")

    chat_body = json.dumps(big_chat_body()).encode()
    (st, b), lat = probe_while(P, lambda: post_raw(P, "/v1/chat/completions", chat_body))
    s.case("7.8 MB chat: /live answers within %d ms while it renders" % PROBE_MS,
           len(lat) > 0 and max(lat) < PROBE_MS, f"{len(lat)} probes, max {max(lat or [0]):.1f} ms")
    e = err_of(b)
    s.case("7.8 MB chat: 400 naming the template's output limit (not 413)",
           st == 400 and e.get("code") == "limit_exceeded" and "output" in e.get("message", ""),
           f"{st} {str(b)[:300]}")

    # llama-server's routes: a multi-MB body is parsed, rendered and tokenized off the loop too.
    tmpl_body = json.dumps({"model": "stories260K",
                            "messages": big_chat_body()["messages"]}).encode()
    (st, b), lat = probe_while(P, lambda: post_raw(P, "/apply-template", tmpl_body))
    s.case("%.1f MB /apply-template: /live answers within %d ms while it renders"
           % (len(tmpl_body) / 1e6, PROBE_MS),
           len(lat) > 0 and max(lat) < PROBE_MS, f"{len(lat)} probes, max {max(lat or [0]):.1f} ms")
    e = err_of(b)
    s.case("%.1f MB /apply-template: 400 naming the template's output limit" % (len(tmpl_body) / 1e6),
           st == 400 and e.get("param") == "messages" and e.get("code") == "limit_exceeded"
           and "output over" in e.get("message", ""),
           f"{st} {str(b)[:300]}")
    tok_text = "lorem ipsum dolor sit amet " * (4_000_000 // 27)
    tok_body = json.dumps({"content": tok_text}).encode()
    # The answer (~2.5 M ids, 10 MB) is decoded after the probes: decoding it in the client's
    # thread holds Python's lock, which would delay the probes on this side, not the server's.
    (st, raw), lat = probe_while(P, lambda: post_with(P, "/tokenize", tok_body,
                                                      {"Content-Type": "application/json"},
                                                      decode=False))
    try:
        b = json.loads(raw)
    except ValueError:
        b = raw
    s.case("%.1f MB /tokenize: /live answers within %d ms while it tokenizes"
           % (len(tok_body) / 1e6, PROBE_MS),
           len(lat) > 0 and max(lat) < PROBE_MS, f"{len(lat)} probes, max {max(lat or [0]):.1f} ms")
    toks = b.get("tokens") if isinstance(b, dict) else None
    s.case("%.1f MB /tokenize: 200 with at least one token per repeated phrase" % (len(tok_body) / 1e6),
           st == 200 and isinstance(toks, list) and len(toks) >= 4_000_000 // 27,
           f"{st} {str(b)[:300]}")

    # Clients that leave while their /tokenize or /apply-template body is parsed or worked on
    # (run with SAMPAN_BIN=build-san/sampan for the use-after-free check under ASan).
    for k, wait in enumerate((0.02, 0.1, 0.3, 0.6)):
        path, body = ("/tokenize", tok_body) if k % 2 == 0 else ("/apply-template", tmpl_body)
        so = socket.create_connection(("127.0.0.1", P), timeout=10)
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        so.sendall(head + body)
        time.sleep(wait)
        reset(so)
    s.case("clients left during /tokenize and /apply-template (logged as aborted)",
           srv.wait_log(r"path=/(tokenize|apply-template) .*aborted=true", 10) is not None,
           srv.text()[-600:])
    time.sleep(0.5)
    st, b = http_json(P, "POST", "/tokenize", {"content": "Once upon"})
    s.case("clients that left /tokenize and /apply-template: the server still answers",
           st == 200 and isinstance(b, dict) and len(b.get("tokens", [])) > 0, f"{st} {str(b)[:200]}")

    # A grammar whose start state holds more stacks than the matcher allows.
    alts = " | ".join(f'"w{i}"' for i in range(5000))
    st, b = http_json(P, "POST", "/v1/completions",
                      {"model": "stories260K", "prompt": "Once", "max_tokens": 2,
                       "grammar": f"root ::= {alts}\n"})
    e = err_of(b)
    s.case("grammar over the matcher's limits: 400 limit_exceeded (not 413)",
           st == 400 and e.get("code") == "limit_exceeded" and e.get("param") == "grammar",
           f"{st} {str(b)[:300]}")

    # Clients that leave while their request is being prepared (parsed, or compiled).
    for k in range(6):
        body = chat_body if k % 2 == 0 else schema_body
        so = socket.create_connection(("127.0.0.1", P), timeout=10)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        so.sendall(head + body)
        time.sleep(0.03 * k if k % 2 == 0 else 0.1 * k)
        reset(so)
    s.case("clients left while their requests were being prepared (logged)",
           srv.wait_log(r"event=client_disconnect rid=\S+ stage=(parse|prepare)", 10) is not None,
           srv.text()[-600:])
    time.sleep(0.5)
    st, b = http_json(P, "POST", "/v1/chat/completions",
                      {"model": "stories260K", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "Once"}]})
    s.case("clients that left during preparation: the server still answers", st == 200, f"{st} {str(b)[:200]}")
    st, _ = http_json(P, "GET", "/live")
    s.case("/live after them", st == 200)

    # KServe infer: BYTES elements are text, and text is UTF-8.
    def infer_bytes(prompt):
        tail = struct.pack("<I", len(prompt)) + prompt + struct.pack("<i", 2)
        head = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                       "parameters": {"binary_data_size": len(tail) - 4}},
                                      {"name": "max_tokens", "datatype": "INT32", "shape": [1],
                                       "parameters": {"binary_data_size": 4}}]}).encode()
        return post_with(P, "/v2/models/stories260K/infer", head + tail,
                         {"Content-Type": "application/octet-stream",
                          "Inference-Header-Content-Length": str(len(head))})
    st, b = infer_bytes("Once upon".encode())
    s.case("KServe infer, a UTF-8 BYTES prompt: 200", st == 200, f"{st} {str(b)[:200]}")
    for label, raw in (("a lone continuation byte", b"Once \x80 upon"), ("an overlong '/'", b"\xc0\xaf"),
                       ("a surrogate", b"a\xed\xa0\x80"), ("a cut sequence", b"abc\xe2\x82")):
        st, b = infer_bytes(raw)
        s.case(f"KServe infer, a BYTES prompt with {label}: 400 naming UTF-8",
               st == 400 and "UTF-8" in str(b), f"{st} {str(b)[:200]}")
finally:
    rc = srv.stop()
s.case("server exits cleanly", rc == 0, f"exit {rc} {srv.text()[-800:] if rc else ''}")


def kserve_cases():
    """KServe's LLM routes: a several-MB prompt is decoded and tokenized off the loop."""
    # --ctx-size 65536: a 4 MB prompt passes the 64-bytes-per-token guard, so it reaches the
    # tokenizer (~2.5 M tokens here, then refused as longer than the context).
    k = Server("--ctx-size", "65536")
    kp = k.port
    try:
        text = "lorem ipsum dolor sit amet " * (4_000_000 // 27)
        gen_body = json.dumps({"text_input": text, "max_tokens": 2}).encode()
        infer_json = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                             "data": [text]}]}).encode()
        raw = text.encode()
        tail = struct.pack("<I", len(raw)) + raw
        bin_head = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                           "parameters": {"binary_data_size": len(tail)}}]}).encode()
        big = [("generate", "/v2/models/stories260K/generate", gen_body, {}, "text_input: "),
               ("generate_stream", "/v2/models/stories260K/generate_stream", gen_body, {}, "text_input: "),
               ("infer (JSON BYTES)", "/v2/models/stories260K/infer", infer_json, {},
                "inputs[0] ('text_input').data[0]: "),
               ("infer (binary BYTES)", "/v2/models/stories260K/infer", bin_head + tail,
                {"Content-Type": "application/octet-stream",
                 "Inference-Header-Content-Length": str(len(bin_head))},
                "inputs[0] ('text_input').data[0]: ")]
        for label, path, body, hdrs, where in big:
            headers = dict({"Content-Type": "application/json"}, **hdrs)
            (st, b), lat = probe_while(kp, lambda: post_with(kp, path, body, headers))
            s.case("KServe %s, a %.1f MB prompt: /live answers within %d ms while it is parsed and "
                   "tokenized" % (label, len(body) / 1e6, PROBE_MS),
                   len(lat) > 0 and max(lat) < PROBE_MS, f"{len(lat)} probes, max {max(lat or [0]):.1f} ms")
            msg = b.get("error", "") if isinstance(b, dict) else ""
            s.case(f"KServe {label}, a 4 MB prompt: 400 with the tokenizer's count, naming the input",
                   st == 400 and msg.startswith(where + "the prompt has ")
                   and "tokens, the context holds 65536" in msg, f"{st} {str(b)[:300]}")

        # A large body whose prompt is short: decoded on a worker, then served as usual.
        long_id = "i" * 100_000
        st, b = http_json(kp, "POST", "/v2/models/stories260K/generate",
                          {"text_input": "Once upon", "max_tokens": 2, "id": long_id})
        s.case("KServe generate, a 100 KB body (its id): 200, the id echoed",
               st == 200 and isinstance(b, dict) and b.get("id") == long_id
               and isinstance(b.get("text_output"), str), f"{st} {str(b)[:200]}")
        st, b = http_json(kp, "POST", "/v2/models/stories260K/infer",
                          {"id": long_id, "inputs": [{"name": "text_input", "datatype": "BYTES",
                                                      "shape": [1], "data": ["Once upon"]}],
                           "parameters": {"max_tokens": 2}})
        s.case("KServe infer, a 100 KB body (its id): 200, the id echoed",
               st == 200 and isinstance(b, dict) and b.get("id") == long_id
               and [o.get("name") for o in b.get("outputs", [])] == ["text_output", "finish_reason"],
               f"{st} {str(b)[:200]}")
        st, b = post_raw(kp, "/v2/models/stories260K/generate", b'{"text_input": "' + b"a" * 100_000)
        s.case("KServe generate, a 100 KB body that is not JSON: 400 from the parser",
               st == 400 and isinstance(b, dict) and "error" in b, f"{st} {str(b)[:200]}")
        st, b = post_raw(kp, "/v2/models/nosuch/generate", gen_body)
        s.case("KServe generate, a 4 MB body for an unknown model: 404", st == 404, f"{st} {str(b)[:200]}")

        # Clients that leave while their body is parsed or their prompt tokenized (the later
        # ones while a worker tokenizes: ~0.3 s in a release build, seconds under ASan).
        for i, wait in enumerate((0.02, 0.06, 0.15, 0.3, 0.8, 1.5)):
            path, body, ctype, extra = (
                ("/v2/models/stories260K/generate", gen_body, "application/json", "") if i % 3 == 0 else
                ("/v2/models/stories260K/generate_stream", gen_body, "application/json", "") if i % 3 == 1 else
                ("/v2/models/stories260K/infer", bin_head + tail, "application/octet-stream",
                 f"Inference-Header-Content-Length: {len(bin_head)}\r\n"))
            so = socket.create_connection(("127.0.0.1", kp), timeout=10)
            head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n{extra}"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            so.sendall(head + body)
            time.sleep(wait)
            reset(so)
        s.case("KServe: clients left while their bodies were parsed or prompts tokenized (logged)",
               k.wait_log(r"event=client_disconnect rid=\S+ stage=parse", 10) is not None
               and k.wait_log(r"event=client_disconnect rid=\S+ stage=prepare", 10) is not None,
               k.text()[-600:])
        time.sleep(0.5)
        st, b = http_json(kp, "POST", "/v2/models/stories260K/generate",
                          {"text_input": "Once", "max_tokens": 2})
        s.case("KServe: clients that left during preparation: the server still answers",
               st == 200 and isinstance(b, dict) and "text_output" in b, f"{st} {str(b)[:200]}")
        st, _ = http_json(kp, "GET", "/live")
        s.case("KServe: /live after them", st == 200)
    finally:
        rc = k.stop()
    s.case("KServe server exits cleanly", rc == 0, f"exit {rc} {k.text()[-800:] if rc else ''}")


s.guard("kserve", kserve_cases)


def nan_model(tmp):
    path = os.path.join(tmp, "nan.gguf")
    rc, _, err = run([sys.executable, os.path.join(ROOT, "tools", "gguf_gen.py"), path,
                      "--poison", "output_norm.weight", "--seed", "3", "-q"], timeout=60)
    return path if rc == 0 and os.path.exists(path) else None


def model_not_ready_server_ready(port):
    """A model fault is the model's: its own readiness says so, the server's does not (every
    replica has the same file, so a pod-wide 503 would take all models out everywhere)."""
    st_m, _ = http_json(port, "GET", "/v2/models/nan/ready")
    st_r, _ = http_json(port, "GET", "/v2/health/ready")
    st_h, b_h = http_json(port, "GET", "/health")
    return (st_m == 400 and st_r == 200 and st_h == 200), f"{st_m} {st_r} {st_h} {b_h}"


def nan_cases():
    with tempfile.TemporaryDirectory() as tmp:
        path = nan_model(tmp)
        if not s.case("NaN model written (gguf_gen.py --poison)", path is not None):
            return
        for what in ("completions", "embeddings"):
            d = Server(model=f"nan={path}")
            try:
                st0, _ = http_json(d.port, "GET", "/v2/models/nan/ready")
                if what == "completions":
                    st, b = http_json(d.port, "POST", "/v1/completions",
                                      {"model": "nan", "prompt": "hello", "max_tokens": 3})
                    ok = st == 500 and "NaN" in err_of(b).get("message", "")
                else:
                    st, b = http_json(d.port, "POST", "/v1/embeddings", {"model": "nan", "input": "hello"})
                    ok = (st == 500 and isinstance(b, dict) and "data" not in b
                          and "NaN" in err_of(b).get("message", ""))
                s.case(f"NaN model, {what}: 500 model fault (not 400, no nulls)", st0 == 200 and ok,
                       f"ready before {st0}; {st} {str(b)[:300]}")
                s.case(f"NaN model, {what}: logged as event=model_fault",
                       d.wait_log(r"event=model_fault model=nan") is not None, d.text()[-500:])
                ok, detail = model_not_ready_server_ready(d.port)
                s.case(f"NaN model, {what}: the model's readiness says not ready, the server's stays ready",
                       ok, detail)
                st, _ = http_json(d.port, "GET", "/live")
                s.case(f"NaN model, {what}: still live", st == 200)
            finally:
                d.stop()


s.guard("nan model", nan_cases)
s.finish()
