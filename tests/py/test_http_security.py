"""test_http_security.py - the HTTP transport and its authorisation under attack, as a black box.

Scopes: with tenants keys of one scope each (infer, admin, metrics), every admin and metrics
route (/v2/repository/index, .../models/M/load, .../models/M/unload, /metrics, /stats) is sent
with path variants ("//", a trailing "/", "%2F", "." and ".." segments, the absolute form):
each is refused (400/404) or reaches the same route under the same scope check, never a
bypass (an infer key's unload must leave the model loaded). Connections: a per-client cap
(--max-conns-per-client) and rate (--conn-rate-per-client) answer 429, and at the global cap
(--max-connections) the oldest idle connection is closed so that a new client is served.
Parsing (RFC 9112): whitespace before a header colon, a protocol other than HTTP/x.y, chunk
data or a chunked body not followed by CRLF, a bare CR ending the head: 400; the absolute
form is routed by its path; a chunk larger than --max-body-bytes: 413 at once. Half-close: a
request followed by shutdown(SHUT_WR) is answered in full. Last line:
    http_security: N passed, N failed, N skipped"""
import base64
import json
import os
import shutil
import socket
import tempfile
import time

from common import ROOT, Server, Suite, binary, free_port, grpc_client, have_grpc_client, keys_add, raw_exchange

s = Suite("http_security")
exe = binary()
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")


def grpc_calls(port, calls):
    """grpc_client(), or None when node or @grpc/grpc-js is missing."""
    return grpc_client(port, calls) if have_grpc_client() else None


def status_of(resp):
    if not resp.startswith(b"HTTP/1."):
        return None
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def body_of(resp):
    head, _, body = resp.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        out = b""
        while body:
            size, _, rest = body.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out += rest[:n]
            body = rest[n + 2:]
        return out
    return body


def call(port, method, target, key=None, body=b""):
    """One request with an exact request target; the status code (None: no answer)."""
    hdr = b"Authorization: Bearer " + key.encode() + b"\r\n" if key else b""
    data = (method.encode() + b" " + target.encode() + b" HTTP/1.1\r\nHost: x\r\n" + hdr +
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    r, _ = raw_exchange(port, data, timeout=30)
    return status_of(r), r


def add_key(path, name, scopes):
    return keys_add(path, name, "--scopes", scopes)


def variants(path):
    """Spellings of path: empty segments, %2F, dot segments, the absolute form."""
    segs = path.strip("/").split("/")
    rest = "/".join(segs[1:])
    v = ["/" + path, path + "/", path + "//", "/" + "//".join(segs), path.replace("/", "///", 1),
         "/" + "%2F".join(segs), "/" + segs[0] + "%2F" + rest, "/" + segs[0] + "%2f" + rest,
         "/./" + path[1:], "/" + segs[0] + "/./" + rest, path + "/.",
         "/" + segs[0] + "/x/../" + rest, "/../" + path[1:], path + "/..", path + "/x/..",
         "/" + segs[0] + "/x/%2e%2e/" + rest, "/" + segs[0] + "/x/.%2E/" + rest,
         "/" + segs[0] + "/%2e/" + rest,
         "http://h" + path, "http://h/" + path, "HTTP://h:1" + path + "/"]
    return v


def test_scopes(tmp):
    tenants = os.path.join(tmp, "tenants.json")
    k_inf = add_key(tenants, "inf", "infer")
    k_adm = add_key(tenants, "adm", "admin")
    k_met = add_key(tenants, "met", "metrics")
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "other", "1"))
    shutil.copy(DEMO, os.path.join(repo, "other", "1", "model.gguf"))
    with open(os.path.join(repo, "other", "config.json"), "w") as f:
        json.dump({"name": "other"}, f)
    gport = free_port()
    srv = Server("--tenants", tenants, "--model-repository", repo, "--model-control-mode",
                 "explicit", "--grpc-port", str(gport))
    P = srv.port
    try:
        def other_ready():
            return call(P, "GET", "/v2/models/other/ready", k_inf)[0] == 200

        def reload_other():
            call(P, "POST", "/v2/repository/models/other/load", k_adm)
            end = time.time() + 20
            while time.time() < end and not other_ready():
                time.sleep(0.1)
            return other_ready()

        s.case("the model under test is ready", reload_other())
        # The canonical paths first: the checks the variants must meet.
        s.case("canonical: an infer key gets 403 on /v2/repository/index, an admin key 200",
               call(P, "POST", "/v2/repository/index", k_inf)[0] == 403 and
               call(P, "POST", "/v2/repository/index", k_adm)[0] == 200)
        s.case("canonical: an infer key gets 403 on /metrics and /stats, a metrics key 200",
               all(call(P, "GET", p, k_inf)[0] == 403 and call(P, "GET", p, k_met)[0] == 200
                   for p in ("/metrics", "/stats")))
        routes = [("POST", "/v2/repository/index", k_adm), ("GET", "/metrics", k_met),
                  ("GET", "/stats", k_met), ("POST", "/v2/repository/models/other/load", k_adm),
                  ("POST", "/v2/repository/models/other/unload", k_adm)]
        for method, path, k_ok in routes:
            bypass, inconsistent, unloaded, n = [], [], [], 0
            for v in variants(path):
                n += 1
                st_none = call(P, method, v)[0]
                st_inf = call(P, method, v, k_inf)[0]
                if st_inf not in (400, 403, 404) or st_none not in (400, 401, 404):
                    bypass.append((v, st_none, st_inf))
                if path.endswith("/unload") and not other_ready():
                    unloaded.append(v)
                    reload_other()
                st_ok = call(P, method, v, k_ok)[0]
                # Same route, same check: 403 for the wrong scope means the right one passes;
                # a refused spelling is refused whatever the key.
                if (st_inf == 403 and not (200 <= (st_ok or 0) < 300)) or \
                        (st_inf != 403 and st_ok != st_inf):
                    inconsistent.append((v, st_inf, st_ok))
                if path.endswith("/unload") and st_ok == 200:
                    reload_other()
            s.case(f"{method} {path}: {n} spellings with no key and an infer key: refused "
                   "(400/401/403/404), never a bypass", not bypass, bypass[:4])
            if path.endswith("/unload"):
                s.case(f"{path}: no spelling lets an infer key unload the model", not unloaded,
                       unloaded[:4])
            s.case(f"{method} {path}: each spelling reaches the same route under the same "
                   "check, or is refused for every key", not inconsistent, inconsistent[:4])
        st, r = call(P, "GET", "/v2/repository/x/../../metrics", k_inf)
        s.case("a dot segment is answered 400 with a JSON error",
               st == 400 and b"segment" in r and r.rstrip().endswith(b"}"), r[:200])
        s.case("public routes stay public in any spelling (//live, /health/)",
               call(P, "GET", "//live")[0] == 200 and call(P, "GET", "/health/")[0] == 200)
        s.case("an unknown path still asks for a key (401), then 404",
               call(P, "GET", "/nope")[0] == 401 and call(P, "GET", "/nope", k_inf)[0] == 404)
        s.case("the model is still loaded at the end", other_ready())
        # gRPC methods become requests on the same routes and meet the same check.
        def md(key):
            return {"authorization": f"Bearer {key}"}
        r = grpc_calls(gport, [
            {"method": "ServerLive", "request": {}},
            {"method": "ModelMetadata", "request": {"name": "other"}, "metadata": md(k_adm)},
            {"method": "ModelMetadata", "request": {"name": "other"}, "metadata": md(k_met)},
            {"method": "ModelMetadata", "request": {"name": "other"}, "metadata": md(k_inf)},
            {"method": "ModelMetadata", "request": {"name": ".."}, "metadata": md(k_inf)},
            {"method": "ModelMetadata", "request": {"name": "."}, "metadata": md(k_inf)},
            {"method": "ModelInfer", "request": {"model_name": "other", "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1],
                 "contents": {"bytes_contents": [base64.b64encode(b"Once").decode()]}}]},
             "metadata": md(k_met)},
            {"method": "ModelReady", "request": {"name": ".."}, "metadata": md(k_inf)},
        ])
        if r is None:
            s.skip("gRPC scopes", "node or tests/node/node_modules/@grpc/grpc-js missing")
        else:
            codes = [x.get("code") for x in r]
            s.case("gRPC: ServerLive needs no key; ModelMetadata and ModelInfer refuse admin- and "
                   "metrics-only keys (PERMISSION_DENIED) and serve an infer key",
                   codes[0] == 0 and codes[1] == 7 and codes[2] == 7 and codes[3] == 0 and
                   codes[6] == 7, codes)
            s.case("gRPC: a model name '.' or '..' is refused (INVALID_ARGUMENT; ModelReady: not "
                   "ready), as its REST path is",
                   codes[4] == 3 and codes[5] == 3 and codes[7] == 0 and
                   r[7].get("response", {}).get("ready") is False, str(r[4:8])[:400])
    finally:
        srv.stop()


def test_per_client_cap():
    gport = free_port()
    srv = Server("--max-conns-per-client", "20", "--conn-rate-per-client", "0", "--grpc-port",
                 str(gport))
    P = srv.port
    socks = []
    try:
        for _ in range(20):
            socks.append(socket.create_connection(("127.0.0.1", P), timeout=5))
        time.sleep(0.2)
        r, t = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
        s.case("the 21st connection from one address is answered 429 and closed",
               status_of(r) == 429 and t is not None and b"max-conns-per-client" in r, r[:200])
        g = grpc_calls(gport, [{"method": "ServerLive", "request": {}}])
        if g is None:
            s.skip("gRPC per-client cap", "node or tests/node/node_modules/@grpc/grpc-js missing")
        else:
            s.case("... and a gRPC connection from it is refused too (UNAVAILABLE)",
                   g[0].get("code") == 14, str(g[0])[:200])
        socks.pop(0).close()
        time.sleep(0.2)
        r, _ = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
        s.case("with one of the 20 closed, a new connection is served", status_of(r) == 200, r[:100])
        if g is not None:
            g = grpc_calls(gport, [{"method": "ServerLive", "request": {}}])
            s.case("... and so is a gRPC call", g[0].get("code") == 0, str(g[0])[:200])
        s.case("the refusal is logged", srv.wait_log(r"event=connection_refused peer=127\.0\.0\.1 "
                                                     r"reason=\"?too many connections") is not None)
    finally:
        for k in socks:
            k.close()
        srv.stop()


def test_per_client_rate():
    srv = Server("--conn-rate-per-client", "5", "--max-conns-per-client", "0")
    P = srv.port
    try:
        codes = []
        for _ in range(10):
            r, _ = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
            codes.append(status_of(r))
        s.case("--conn-rate-per-client 5: a burst of 10 connections gets 5 served, then 429",
               codes[:5] == [200] * 5 and 429 in codes[5:], codes)
        time.sleep(1.5)
        r, _ = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
        s.case("... and after a pause the client is served again", status_of(r) == 200, r[:100])
    finally:
        srv.stop()


def test_idle_eviction():
    srv = Server("--max-connections", "4", "--max-conns-per-client", "0",
                 "--conn-rate-per-client", "0")
    P = srv.port
    socks = []
    try:
        # A: a request head in progress (not idle); B: served once, now idle (keep-alive);
        # C, D: opened, nothing sent.
        a = socket.create_connection(("127.0.0.1", P), timeout=5)
        a.sendall(b"GET /live HTTP/1.1\r\n")
        b = socket.create_connection(("127.0.0.1", P), timeout=5)
        b.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        got_b = b.recv(4096)
        time.sleep(0.1)
        c = socket.create_connection(("127.0.0.1", P), timeout=5)
        time.sleep(0.1)
        d = socket.create_connection(("127.0.0.1", P), timeout=5)
        socks = [a, b, c, d]
        time.sleep(0.2)
        r, _ = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
        s.case("at --max-connections, a new client is served (an idle connection made room)",
               status_of(got_b) == 200 and status_of(r) == 200, r[:100])
        b.settimeout(3)
        try:
            closed = b.recv(100) == b""
        except OSError:
            closed = True
        s.case("... the connection idle longest (the kept-alive one) was the one closed", closed)
        a.sendall(b"Host: x\r\nConnection: close\r\n\r\n")
        a.settimeout(5)
        ra = b""
        try:
            while True:
                k = a.recv(4096)
                if not k:
                    break
                ra += k
        except OSError:
            pass
        s.case("... a connection in the middle of its request head was not closed",
               status_of(ra) == 200, ra[:100])
    finally:
        for k in socks:
            k.close()
        srv.stop()


def completion_body(**kw):
    b = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 8,
         "temperature": 0}
    b.update(kw)
    return json.dumps(b).encode()


def test_parsing_and_halfclose():
    srv = Server("--max-body-bytes", "4096")
    P = srv.port
    try:
        r, _ = raw_exchange(P, b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        s.case("control: a plain request is served", status_of(r) == 200, r[:80])
        for label, req in (
                ("a space between a header name and the colon",
                 b"GET /live HTTP/1.1\r\nHost : x\r\n\r\n"),
                ("a space at the end of a header name, before other headers",
                 b"GET /live HTTP/1.1\r\nHost: x\r\nAccept : */*\r\n\r\n"),
                ("protocol HXYZ/1.1", b"GET /live HXYZ/1.1\r\nHost: x\r\n\r\n"),
                ("protocol XTTP/1.1", b"GET /live XTTP/1.1\r\nHost: x\r\n\r\n"),
                ("protocol Http/1.1 (the name is case-sensitive)",
                 b"GET /live Http/1.1\r\nHost: x\r\n\r\n"),
                ("a bare CR ending the head", b"GET /live HTTP/1.1\r\nHost: x\r\n\rX")):
            r, _ = raw_exchange(P, req, timeout=5)
            s.case(f"{label}: 400", status_of(r) == 400, r[:120])
        body = completion_body()
        half = len(body) // 2

        def chunked(sep1, tail=b"0\r\n\r\n"):
            return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                    b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
                    b"%x\r\n" % half + body[:half] + sep1 +
                    b"%x\r\n" % (len(body) - half) + body[half:] + b"\r\n" + tail)

        r, _ = raw_exchange(P, chunked(b"\r\n"), timeout=30)
        s.case("control: a valid chunked body is served", status_of(r) == 200, r[:120])
        whole = chunked(b"\r\n")
        cut = whole.index(body[:half]) + half + 1
        r, _ = raw_exchange(P, None, chunks=[whole[:cut], whole[cut:]], timeout=30, gap=0.2)
        s.case("control: a chunked body split at its CRLF is served", status_of(r) == 200, r[:120])
        r, _ = raw_exchange(P, chunked(b"XY"), timeout=10)
        s.case("chunk data followed by XY instead of CRLF: 400", status_of(r) == 400, r[:120])
        whole = chunked(b"\rY")
        cut = whole.index(body[:half]) + half + 1
        r, _ = raw_exchange(P, None, chunks=[whole[:cut], whole[cut:]], timeout=10, gap=0.2)
        s.case("chunk data then CR in one read and a wrong byte in the next: 400",
               status_of(r) == 400, r[:120])
        r, _ = raw_exchange(P, chunked(b"\r\n", tail=b"0\r\n\rX"), timeout=10)
        s.case("a chunked body ended by CR and a byte other than LF: 400", status_of(r) == 400,
               r[:120])
        # Absolute form: routed by its path.
        r, _ = raw_exchange(P, b"GET http://example.com/v1/models HTTP/1.1\r\nHost: x\r\n"
                   b"Connection: close\r\n\r\n")
        s.case("absolute-form GET http://example.com/v1/models: routed by its path (200)",
               status_of(r) == 200 and b"stories260K" in r, r[:160])
        r, _ = raw_exchange(P, b"GET http://example.com:8080 HTTP/1.1\r\nHost: x\r\nConnection: close"
                   b"\r\n\r\n")
        s.case("absolute-form without a path: the path is / (200)", status_of(r) == 200, r[:100])
        r, _ = raw_exchange(P, b"POST http://h/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                   b"%d\r\nConnection: close\r\n\r\n" % len(body) + body, timeout=30)
        s.case("absolute-form POST of a completion: 200", status_of(r) == 200, r[:160])
        # A chunk larger than the body limit: 413 now, not a 408 after --body-timeout.
        r, t = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                   b"\r\n\r\n100000\r\n" + b"x" * 100, timeout=5)
        s.case("a chunk size over --max-body-bytes: 413 at once", status_of(r) == 413 and
               t is not None and t < 3, (r[:120], t))
        r, t = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                   b"\r\n\r\n800\r\n" + b"x" * 0x800 + b"\r\n801\r\n", timeout=5)
        s.case("chunks adding up to more than --max-body-bytes: 413 at the chunk that cannot fit",
               status_of(r) == 413 and t is not None and t < 3, (r[:120], t))
        # Half-close: the request is answered, then the connection closes.
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
        r, t = raw_exchange(P, req, timeout=30, half_close=True)
        doc = None
        try:
            doc = json.loads(body_of(r))
        except ValueError:
            pass
        s.case("a request then shutdown(SHUT_WR): the whole answer, then the close",
               status_of(r) == 200 and doc is not None and doc.get("object") == "text_completion"
               and t is not None, r[:160])
        sbody = completion_body(stream=True)
        r, t = raw_exchange(P, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                   % len(sbody) + sbody, timeout=30, half_close=True)
        s.case("a streamed request then shutdown(SHUT_WR): the stream to its [DONE]",
               status_of(r) == 200 and b"data: [DONE]" in body_of(r) and t is not None, r[-160:])
        r, t = raw_exchange(P, req + b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n", timeout=30, half_close=True)
        s.case("two pipelined requests then shutdown(SHUT_WR): both answered, then the close",
               r.count(b"HTTP/1.1 200") == 2 and t is not None, r[:200])
        s.case("the server served everything without a crash", srv.p.poll() is None)
    finally:
        srv.stop()


if exe is None or not os.path.isfile(DEMO):
    s.skip("all", "build/sampan or the demo model is missing")
else:
    tmp = tempfile.mkdtemp(prefix="sampan-httpsec-")
    try:
        s.guard("scopes", test_scopes, tmp)
        s.guard("per-client cap", test_per_client_cap)
        s.guard("per-client rate", test_per_client_rate)
        s.guard("idle eviction", test_idle_eviction)
        s.guard("parsing and half-close", test_parsing_and_halfclose)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
s.finish()
