"""test_tracing.py - OpenTelemetry tracing of `sampan serve` (docs/tracing.md) against a
collector stand-in: a Python http.server on loopback that receives the OTLP/HTTP JSON
(POST /v1/traces) and keeps every span. Checked:
  - the span tree: one trace per request, one server span whose parent is the incoming
    traceparent's span, children queue, prefill, decode, response (LLM) or queue, compute,
    response (tensor model) under it, nested in time, with HTTP semantic-convention
    attributes (method, route, status, scheme, client address), model, version, tenant,
    token counts, the service name and the tracestate;
  - the response's traceparent keeps the incoming trace id and names the server span; the
    access log line names the trace;
  - sampling: ratio 1 (all), 0 (none unless the parent was sampled), 0.5 (some), and a
    parent's unsampled flag is obeyed;
  - a malformed traceparent is ignored (a new trace, 200), never an error;
  - a collector that is down or hangs never delays or fails requests, spans are dropped
    and counted in /metrics, and the server still stops promptly;
  - the exporter (libcurl): headers from OTEL_EXPORTER_OTLP_[TRACES_]HEADERS (percent-decoded,
    the traces variant first, values never logged), a retry after 503 that waits for the
    answer's Retry-After, HTTPS with the CA from OTEL_EXPORTER_OTLP_CERTIFICATE (and a failure
    without it), and the proxy from http_proxy (the collector's name resolved by the proxy);
  - tracing off: no traceparent header; bad flags are start-up errors (exit 2).
Last line:
    tracing: N passed, N failed, N skipped"""
import http.client
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common import ROOT, Server, Suite, binary, run, free_port

s = Suite("tracing")
PLUGINS = os.path.join(os.path.dirname(binary() or ""), "backends")
TP_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$")


class Collector:
    """An OTLP/HTTP collector stand-in on 127.0.0.1. mode "ok" answers 200 {}; "hang"
    holds each POST for `hold` seconds before answering (a collector that stopped
    reading); "fail" answers 500. `script`: statuses for the first POSTs (e.g. [503]),
    each with `retry_after` when given; 200 afterwards. `tls`: (certfile, keyfile) to
    serve HTTPS. It also serves as an HTTP proxy stand-in: a proxied POST's path is the
    absolute URL."""

    def __init__(self, mode="ok", hold=3.0, script=None, retry_after=None, tls=None):
        self.posts = []  # (path, headers, parsed body)
        self.times = []  # arrival time of each POST
        self.lock = threading.Lock()
        script = list(script or [])
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                with outer.lock:
                    outer.posts.append((self.path, dict(self.headers), body))
                    outer.times.append(time.time())
                    code = script.pop(0) if script else None
                if mode == "hang":
                    time.sleep(hold)
                if code is None:
                    code = 500 if mode == "fail" else 200
                try:
                    self.send_response(code)
                    if code != 200 and retry_after is not None:
                        self.send_header("Retry-After", str(retry_after))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the exporter gave up first

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if tls:
            import ssl
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.url = f"https://localhost:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def spans(self):
        """Every span received: dicts with the OTLP fields plus "_resource" attributes."""
        out = []
        with self.lock:
            posts = list(self.posts)
        for _, _, body in posts:
            for rs in (body or {}).get("resourceSpans", []):
                res = attrs(rs.get("resource", {}))
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        out.append(dict(sp, _resource=res, _scope=ss.get("scope", {})))
        return out

    def trace(self, tid, n=1, timeout=5.0):
        """Spans of trace tid once at least n arrived (or what there is at the timeout)."""
        end = time.time() + timeout
        while True:
            got = [sp for sp in self.spans() if sp.get("traceId") == tid]
            if len(got) >= n or time.time() > end:
                return got
            time.sleep(0.05)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def attrs(obj):
    """OTLP attributes (typed AnyValue) as a dict of Python values."""
    out = {}
    for a in obj.get("attributes", []):
        v = a.get("value", {})
        if "stringValue" in v:
            out[a["key"]] = v["stringValue"]
        elif "intValue" in v:
            out[a["key"]] = int(v["intValue"])  # a string in OTLP JSON
        elif "doubleValue" in v:
            out[a["key"]] = float(v["doubleValue"])
        elif "boolValue" in v:
            out[a["key"]] = bool(v["boolValue"])
    return out


def req(port, method, path, body=None, headers=None, timeout=30):
    """(status, lower-case headers, parsed JSON or bytes, seconds taken)."""
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        try:
            b = json.loads(raw) if raw else None
        except ValueError:
            b = raw
        return r.status, hdrs, b, time.time() - t0
    finally:
        c.close()


def rand_hex(n):
    return os.urandom(n).hex()


def completion(port, headers=None, max_tokens=4, stream=False):
    return req(port, "POST", "/v1/completions",
               {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": max_tokens,
                "stream": stream}, headers)


def metric(port, name, **labels):
    st, _, b, _ = req(port, "GET", "/metrics", headers={"Authorization": "Bearer k1"})
    text = b.decode() if isinstance(b, bytes) else ""
    total = None
    for line in text.split("\n"):
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})? ([0-9.e+]+)$", line)
        if not m or m.group(1) != name:
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(lab.get(k) == v for k, v in labels.items()):
            total = (total or 0) + float(m.group(3))
    return total


def by_name(spans):
    out = {}
    for sp in spans:
        out.setdefault(sp["name"], []).append(sp)
    return out


def ns(sp, k):
    return int(sp[k])  # unix nanoseconds as a decimal string


# ------------------------------------------------------------------ cases

def test_llm_tree(col, srv):
    tid, pid = rand_hex(16), rand_hex(8)
    hdr = {"traceparent": f"00-{tid}-{pid}-01", "tracestate": "vendor1=abc,vendor2=x:y",
           "Authorization": "Bearer k1", "User-Agent": "trace-test/1"}
    st, h, b, _ = completion(srv.port, hdr)
    s.case("a traced completion answers 200", st == 200, str(st))
    m = TP_RE.match(h.get("traceparent", ""))
    s.case("the response's traceparent keeps the trace id, names a new span, sampled",
           m is not None and m.group(1) == tid and m.group(2) != pid and m.group(3) == "01",
           h.get("traceparent"))
    s.case("the tracestate comes back", h.get("tracestate") == "vendor1=abc,vendor2=x:y",
           h.get("tracestate"))
    server_id = m.group(2) if m else None
    spans = col.trace(tid, n=5)
    names = by_name(spans)
    s.case("one trace: server span + queue, prefill, decode, response",
           sorted(sp["name"] for sp in spans) ==
           sorted(["POST /v1/completions", "queue", "prefill", "decode", "response"]),
           str(sorted(sp["name"] for sp in spans)))
    root = names.get("POST /v1/completions", [None])[0]
    if root is None:
        s.case("server span present", False, str([sp["name"] for sp in spans]))
        return
    a = attrs(root)
    s.case("server span: kind SERVER, id as in traceparent, parent = the caller's span",
           root.get("kind") == 2 and root.get("spanId") == server_id and
           root.get("parentSpanId") == pid, json.dumps(root)[:300])
    usage = b.get("usage", {}) if isinstance(b, dict) else {}
    want = {"http.request.method": "POST", "http.route": "/v1/completions",
            "http.response.status_code": 200, "url.path": "/v1/completions", "url.scheme": "http",
            "client.address": "127.0.0.1", "server.address": "127.0.0.1",
            "server.port": srv.port, "user_agent.original": "trace-test/1",
            "sampan.model": "stories260K", "sampan.model.version": "1",
            "sampan.tenant": "default", "sampan.outcome": "length",
            "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
            "gen_ai.usage.output_tokens": usage.get("completion_tokens")}
    bad = {k: (a.get(k), v) for k, v in want.items() if a.get(k) != v}
    s.case("server span attributes (HTTP conventions, model, version, tenant, tokens)",
           not bad and isinstance(a.get("client.port"), int) and
           a.get("sampan.request_id") == h.get("x-request-id"), str(bad))
    s.case("no error status on a 200", "status" not in root or root["status"].get("code", 0) != 2)
    kids = [sp for sp in spans if sp is not root]
    s.case("children: same trace, parent = the server span, kind INTERNAL",
           all(k.get("parentSpanId") == server_id and k.get("kind") == 1 for k in kids) and
           all(k.get("traceId") == tid for k in kids), json.dumps(kids)[:300])
    s.case("every span carries the tracestate and W3C flags (sampled)",
           all(sp.get("traceState") == "vendor1=abc,vendor2=x:y" and sp.get("flags", 0) & 1
               for sp in spans) and root.get("flags", 0) & 0x300 == 0x300)
    t0, t1 = ns(root, "startTimeUnixNano"), ns(root, "endTimeUnixNano")
    order = [names[n][0] for n in ("queue", "prefill", "decode", "response")]
    nested = all(t0 <= ns(k, "startTimeUnixNano") <= ns(k, "endTimeUnixNano") <= t1 for k in kids)
    seq = all(ns(order[i], "endTimeUnixNano") <= ns(order[i + 1], "startTimeUnixNano")
              for i in range(3))
    s.case("children nested in the server span and in order queue < prefill < decode < response",
           nested and seq, str([(k["name"], ns(k, "startTimeUnixNano") - t0,
                                 ns(k, "endTimeUnixNano") - t0) for k in kids]))
    s.case("times are unix nanoseconds (within a minute of now)",
           abs(t0 / 1e9 - time.time()) < 60 and t1 >= t0, str(t0))
    s.case("decode counts the output tokens, prefill the prompt tokens",
           attrs(names["decode"][0]).get("gen_ai.usage.output_tokens") ==
           usage.get("completion_tokens") and
           attrs(names["prefill"][0]).get("gen_ai.usage.input_tokens") == usage.get("prompt_tokens"),
           f"{attrs(names['decode'][0])} {attrs(names['prefill'][0])} {usage}")
    s.case("resource: service.name from --otel-service-name, scope sampan",
           root["_resource"].get("service.name") == "trace-test" and
           root["_resource"].get("telemetry.sdk.language") == "c" and
           root["_scope"].get("name") == "sampan", str(root["_resource"]))
    with col.lock:
        path, headers, _ = col.posts[0]
    s.case("POST /v1/traces with Content-Type application/json",
           path == "/v1/traces" and headers.get("Content-Type") == "application/json",
           f"{path} {headers.get('Content-Type')}")
    s.case("the access log line names the trace",
           srv.wait_log(r"event=request .*trace_id=" + tid + " span_id=" + (server_id or "x"))
           is not None)


def test_roots_and_stream(col, srv):
    auth = {"Authorization": "Bearer k1"}
    tids = []
    for i in range(3):
        st, h, _, _ = completion(srv.port, auth, max_tokens=2, stream=(i == 2))
        m = TP_RE.match(h.get("traceparent", ""))
        tids.append(m.group(1) if m and st == 200 else None)
    s.case("without a traceparent each request starts its own sampled trace (ratio 1)",
           None not in tids and len(set(tids)) == 3, str(tids))
    ok = True
    detail = ""
    for tid in tids:
        spans = col.trace(tid, n=5) if tid else []
        roots = [sp for sp in spans if sp.get("kind") == 2]
        if len(roots) != 1 or "parentSpanId" in roots[0] and roots[0]["parentSpanId"]:
            ok = False
            detail = json.dumps(spans)[:300]
        if {sp["name"] for sp in spans} != {"POST /v1/completions", "queue", "prefill", "decode",
                                            "response"}:
            ok = False
            detail = str([sp["name"] for sp in spans])
    s.case("one root span per trace (no parent), full tree for a streamed request too", ok, detail)
    # Malformed traceparents: ignored, a new trace, never an error.
    bad = ["00-" + "0" * 32 + "-" + rand_hex(8) + "-01",          # zero trace id
           "00-" + rand_hex(16) + "-" + "0" * 16 + "-01",         # zero parent id
           "00-" + rand_hex(16).upper() + "-" + rand_hex(8) + "-01",  # uppercase
           "ff-" + rand_hex(16) + "-" + rand_hex(8) + "-01",      # version ff
           "00-" + rand_hex(16) + "-" + rand_hex(8) + "-01-extra",  # version 00 is exact
           "00-xyz", "garbage", "00_" + rand_hex(16) + "_" + rand_hex(8) + "_01"]
    results = []
    for v in bad:
        st, h, _, _ = req(srv.port, "GET", "/v1/models", headers=dict(auth, traceparent=v,
                                                                     tracestate="k=v"))
        m = TP_RE.match(h.get("traceparent", ""))
        results.append((st, m.group(1) if m else None, m.group(3) if m else None, v))
    s.case("a malformed traceparent is ignored: 200, a new sampled trace",
           all(st == 200 and t and t not in v and f == "01" for st, t, f, v in results),
           str([r for r in results if not (r[0] == 200 and r[1])]))
    t = results[0][1]
    spans = col.trace(t, n=1)
    s.case("... its span has no parent and no tracestate",
           len(spans) == 1 and not spans[0].get("parentSpanId") and "traceState" not in spans[0]
           and spans[0]["name"] == "GET /v1/models", json.dumps(spans)[:300])
    # Future versions: extra fields after the flags are allowed and ignored.
    tid, pid = rand_hex(16), rand_hex(8)
    st, h, _, _ = req(srv.port, "GET", "/v1/models",
                      headers=dict(auth, traceparent=f"01-{tid}-{pid}-01-what-ever"))
    m = TP_RE.match(h.get("traceparent", ""))
    s.case("a later traceparent version with extra fields is accepted (forward compatible)",
           m is not None and m.group(1) == tid, h.get("traceparent"))
    # The parent said "not sampled": obeyed, the trace id still propagates.
    tid, pid = rand_hex(16), rand_hex(8)
    st, h, _, _ = completion(srv.port, dict(auth, traceparent=f"00-{tid}-{pid}-00"), max_tokens=2)
    m = TP_RE.match(h.get("traceparent", ""))
    s.case("an unsampled parent: trace id kept, flags 00 in the answer",
           st == 200 and m is not None and m.group(1) == tid and m.group(3) == "00",
           h.get("traceparent"))
    # A 404 and a 401: spans with the status, the 4xx not marked as an error.
    tid = rand_hex(16)
    st, h, _, _ = req(srv.port, "GET", "/no/such/route",
                      headers=dict(auth, traceparent=f"00-{tid}-{rand_hex(8)}-01"))
    sp = col.trace(tid, n=1)
    a = attrs(sp[0]) if sp else {}
    s.case("a 404: span named after the method only, status code, no http.route, not an error",
           st == 404 and sp and sp[0]["name"] == "GET" and a.get("http.response.status_code") == 404
           and "http.route" not in a and sp[0].get("status", {}).get("code", 0) != 2,
           json.dumps(sp)[:300])
    time.sleep(1.3)  # one flush interval: the unsampled trace would have arrived by now
    s.case("... and nothing exported for the unsampled trace",
           not [x for x in col.spans() if x["traceId"] == m.group(1)] if m else False)
    n = metric(srv.port, "sampan_trace_spans_exported_total")
    s.case("/metrics counts the exported spans", n is not None and n >= 20, str(n))
    d = metric(srv.port, "sampan_trace_spans_dropped_total")
    s.case("/metrics: nothing dropped with a healthy collector", d == 0, str(d))


def test_ratio_zero(col):
    srv = Server("--otlp-endpoint", col.url, "--trace-sample-ratio", "0")
    try:
        st, h, _, _ = completion(srv.port, max_tokens=2)
        m = TP_RE.match(h.get("traceparent", ""))
        s.case("ratio 0: a new trace is not sampled (flags 00), still propagated",
               st == 200 and m is not None and m.group(3) == "00", h.get("traceparent"))
        tid, pid = rand_hex(16), rand_hex(8)
        st, h, _, _ = completion(srv.port, {"traceparent": f"00-{tid}-{pid}-01"}, max_tokens=2)
        spans = col.trace(tid, n=5)
        s.case("ratio 0: a sampled parent is still honoured (parent-based), full tree",
               st == 200 and len(spans) == 5 and h.get("traceparent", "").endswith("-01"),
               str([x["name"] for x in spans]))
        time.sleep(1.3)
        s.case("ratio 0: nothing exported for the unsampled root",
               not [x for x in col.spans() if m and x["traceId"] == m.group(1)])
    finally:
        s.case("ratio 0 server exits cleanly", srv.stop() == 0)


def test_ratio_half(col):
    srv = Server("--otlp-endpoint", col.url, "--trace-sample-ratio", "0.5")
    try:
        flags = []
        for _ in range(40):
            st, h, _, _ = req(srv.port, "GET", "/live")
            m = TP_RE.match(h.get("traceparent", ""))
            flags.append((m.group(1), m.group(3)) if m else (None, None))
        n = sum(1 for _, f in flags if f == "01")
        s.case("ratio 0.5: some but not all of 40 new traces sampled", 5 <= n <= 35, str(n))
        sampled = {t for t, f in flags if f == "01"}
        end = time.time() + 5
        while time.time() < end and not sampled <= {x["traceId"] for x in col.spans()}:
            time.sleep(0.05)
        got = {x["traceId"] for x in col.spans()}
        s.case("ratio 0.5: exactly the sampled ones are exported",
               sampled <= got and not ({t for t, f in flags if f == "00"} & got))
    finally:
        s.case("ratio 0.5 server exits cleanly", srv.stop() == 0)


def test_collector_down():
    # A port with nothing listening: connections are refused at once.
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        dead = so.getsockname()[1]
    srv = Server("--otlp-endpoint", f"http://127.0.0.1:{dead}", "--api-key", "k1")
    try:
        times = []
        for _ in range(5):
            st, h, _, dt = completion(srv.port, {"Authorization": "Bearer k1"}, max_tokens=2)
            times.append((st, dt))
        s.case("collector down: requests succeed, none slowed (< 2 s each)",
               all(st == 200 and dt < 2 for st, dt in times), str(times))
        end = time.time() + 6
        d = 0
        while time.time() < end:
            d = metric(srv.port, "sampan_trace_spans_dropped_total", reason="export_failed") or 0
            if d >= 25:
                break
            time.sleep(0.2)
        s.case("collector down: the spans are dropped and counted (export_failed)", d >= 25, str(d))
        s.case("collector down: one warning line names the failure",
               srv.wait_log(r"event=trace_export_failed .*error=") is not None)
    finally:
        t0 = time.time()
        rc = srv.stop()
        s.case("collector down: the server still stops promptly", rc == 0 and time.time() - t0 < 6,
               f"rc={rc} {time.time() - t0:.1f}s")


def test_collector_hangs():
    col = Collector("hang", hold=4.0)
    srv = Server("--otlp-endpoint", col.url, "--otlp-timeout", "0.5", "--otlp-max-queue", "12")
    try:
        times = []
        for _ in range(8):
            st, h, _, dt = completion(srv.port, max_tokens=2)
            times.append((st, dt))
        s.case("collector hangs: requests succeed and are not slowed (< 2 s each)",
               all(st == 200 and dt < 2 for st, dt in times), str(times))
        q = metric(srv.port, "sampan_trace_spans_dropped_total", reason="queue_full") or 0
        s.case("collector hangs: a full export queue drops spans and counts them", q > 0, str(q))
    finally:
        t0 = time.time()
        rc = srv.stop()
        s.case("collector hangs: the server still stops promptly (bounded flush)",
               rc == 0 and time.time() - t0 < 8, f"rc={rc} {time.time() - t0:.1f}s")
        col.close()


def test_tensor(col):
    if not os.path.isfile(os.path.join(PLUGINS, "libsampan_identity.so")):
        s.skip("tensor model spans", f"backend plugins not built in {PLUGINS}")
        return
    tmp = tempfile.mkdtemp(prefix="sampan-trace-")
    try:
        d = os.path.join(tmp, "repo", "ident")
        os.makedirs(os.path.join(d, "1"))
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"name": "ident", "backend": "identity", "max_batch_size": 8,
                       "dynamic_batching": {"max_queue_delay_microseconds": 2000},
                       "input": [{"name": "f", "data_type": "TYPE_FP32", "dims": [2]}],
                       "output": [{"name": "f_out", "data_type": "TYPE_FP32", "dims": [2]}]}, f)
        gport = free_port()
        srv = Server("--model-repository", os.path.join(tmp, "repo"), "--otlp-endpoint", col.url,
                     "--grpc-port", str(gport), model=None)
        try:
            s.guard("gRPC call traced", grpc_traced, col, gport)
            tid, pid = rand_hex(16), rand_hex(8)
            st, h, b, _ = req(srv.port, "POST", "/v2/models/ident/infer",
                              {"inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 2],
                                           "data": [1, 2]}]},
                              {"traceparent": f"00-{tid}-{pid}-01"})
            spans = col.trace(tid, n=4)
            names = by_name(spans)
            root = names.get("POST /v2/models/{model}/infer", [None])[0]
            s.case("tensor model: server span + queue, compute, response",
                   st == 200 and sorted(names) == sorted(["POST /v2/models/{model}/infer", "queue",
                                                          "compute", "response"]),
                   f"{st} {sorted(names)}")
            if root:
                a = attrs(root)
                kids = [x for x in spans if x is not root]
                s.case("tensor model: route, model, version, parents",
                       a.get("http.route") == "/v2/models/{model}/infer" and
                       a.get("sampan.model") == "ident" and a.get("sampan.model.version") == "1"
                       and root.get("parentSpanId") == pid and
                       all(k.get("parentSpanId") == root["spanId"] for k in kids), str(a))
                q, c = names["queue"][0], names["compute"][0]
                s.case("tensor model: the queue ends where compute begins",
                       ns(q, "endTimeUnixNano") == ns(c, "startTimeUnixNano") and
                       ns(root, "startTimeUnixNano") <= ns(q, "startTimeUnixNano"),
                       f"{ns(q, 'endTimeUnixNano')} {ns(c, 'startTimeUnixNano')}")
        finally:
            s.case("tensor model server exits cleanly", srv.stop() == 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def grpc_traced(col, gport):
    """A gRPC ModelInfer with traceparent metadata is traced like the REST call it becomes."""
    client = os.path.join(ROOT, "tests", "node", "grpc_client.mjs")
    mods = os.path.join(ROOT, "tests", "node", "node_modules", "@grpc", "grpc-js")
    if not shutil.which("node") or not os.path.isfile(client) or not os.path.isdir(mods):
        s.skip("gRPC call traced", "node, tests/node/grpc_client.mjs or @grpc/grpc-js missing")
        return
    tid, pid = rand_hex(16), rand_hex(8)
    calls = {"addr": f"127.0.0.1:{gport}", "calls": [{
        "method": "ModelInfer", "metadata": {"traceparent": f"00-{tid}-{pid}-01"},
        "deadline_ms": 10000,
        "request": {"model_name": "ident", "inputs": [{
            "name": "f", "datatype": "FP32", "shape": [1, 2],
            "contents": {"fp32_contents": [1, 2]}}]}}]}
    import subprocess
    p = subprocess.run(["node", client], input=json.dumps(calls), capture_output=True, text=True,
                       timeout=30, cwd=ROOT)
    try:
        res = json.loads(p.stdout)[0]
    except (ValueError, IndexError):
        res = {"stdout": p.stdout[-300:], "stderr": p.stderr[-300:]}
    spans = col.trace(tid, n=4)
    root = [x for x in spans if x.get("kind") == 2]
    s.case("gRPC: the call's traceparent metadata starts a server span under the caller's span, "
           "with queue and compute children",
           res.get("code") == 0 and len(root) == 1 and root[0].get("parentSpanId") == pid and
           {x["name"] for x in spans} >= {"queue", "compute", "response"},
           f"{res} {[x['name'] for x in spans]}")
    got = (res.get("metadata") or {}).get("traceparent", "")
    s.case("gRPC: the response metadata carries the server span's traceparent",
           len(root) == 1 and got == f"00-{tid}-{root[0].get('spanId')}-01", got)


class EnvSet:
    """Environment variables set for the servers started inside the block (Server()
    inherits os.environ), restored afterwards."""

    def __init__(self, **kv):
        self.kv = kv
        self.old = {}

    def __enter__(self):
        for k, v in self.kv.items():
            self.old[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *a):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


NO_PROXY_ENV = dict(http_proxy=None, https_proxy=None, HTTPS_PROXY=None, all_proxy=None,
                    ALL_PROXY=None, no_proxy=None, NO_PROXY=None)


def one_trace(srv, col, timeout=8.0):
    """One sampled completion; the spans of its trace received by col."""
    tid = rand_hex(16)
    st, _, _, _ = completion(srv.port, {"traceparent": f"00-{tid}-{rand_hex(8)}-01"},
                             max_tokens=2)
    return st, col.trace(tid, n=1, timeout=timeout)


def test_export_headers():
    col = Collector()
    env = dict(NO_PROXY_ENV, OTEL_EXPORTER_OTLP_HEADERS="x-general=g1",
               OTEL_EXPORTER_OTLP_TRACES_HEADERS="Authorization=Bearer%20s3cr3t-v4lue , "
                                                 "x-tenant = t%2C1,x-empty=")
    try:
        with EnvSet(**env):
            srv = Server("--otlp-endpoint", col.url + "/otlp/")
        try:
            st, spans = one_trace(srv, col)
            with col.lock:
                posts = list(col.posts)
            h = {k.lower(): v for k, v in posts[-1][1].items()} if posts else {}
            s.case("headers: OTEL_EXPORTER_OTLP_TRACES_HEADERS sent, percent-decoded, trimmed",
                   st == 200 and spans and h.get("authorization") == "Bearer s3cr3t-v4lue"
                   and h.get("x-tenant") == "t,1" and h.get("x-empty") == "",
                   str(h))
            s.case("headers: the traces variable wins over OTEL_EXPORTER_OTLP_HEADERS",
                   bool(h) and "x-general" not in h, str(h))
            s.case("headers: the prefix path gets /v1/traces, JSON body",
                   bool(posts) and posts[-1][0] == "/otlp/v1/traces" and
                   h.get("content-type") == "application/json" and posts[-1][2] is not None,
                   str(posts[-1][:1]) if posts else "no post")
            s.case("headers: the start-up line names the headers, never their values",
                   srv.wait_log(r"event=tracing .*headers=\"?Authorization,x-tenant,x-empty")
                   is not None and "s3cr3t" not in srv.text(), srv.text()[-600:])
        finally:
            s.case("headers server exits cleanly", srv.stop() == 0)
        with EnvSet(**dict(env, OTEL_EXPORTER_OTLP_TRACES_HEADERS=None)):
            srv = Server("--otlp-endpoint", col.url)
        try:
            st, spans = one_trace(srv, col)
            with col.lock:
                h = {k.lower(): v for k, v in col.posts[-1][1].items()}
            s.case("headers: OTEL_EXPORTER_OTLP_HEADERS alone is used",
                   st == 200 and spans and h.get("x-general") == "g1", str(h))
        finally:
            srv.stop()
    finally:
        col.close()
    for bad, why in (("novalue", "not key=value"), ("bad key=v", "not key=value"),
                     ("k=a%0d%0aInjected: 1", "control characters")):
        rc, out, err = run([binary(), "serve", "--port", "0", "--otlp-endpoint",
                            "http://127.0.0.1:4318"], timeout=20,
                           env={"OTEL_EXPORTER_OTLP_HEADERS": bad})
        s.case(f"headers: malformed {bad!r} is a start-up error (exit 2) naming the variable",
               rc == 2 and "OTEL_EXPORTER_OTLP_HEADERS" in err and why in err,
               f"rc={rc} {err[-200:]}")


def test_export_retry():
    # 503 with Retry-After: 1, then 200: the batch arrives twice, a second apart, and counts
    # as exported once.
    col = Collector(script=[503], retry_after=1)
    try:
        with EnvSet(**NO_PROXY_ENV):
            srv = Server("--otlp-endpoint", col.url)
        try:
            st, spans = one_trace(srv, col)
            end = time.time() + 6
            while time.time() < end and len(col.times) < 2:
                time.sleep(0.05)
            with col.lock:
                posts, times = list(col.posts), list(col.times)
            s.case("retry: 503 then 200, the same body twice",
                   st == 200 and len(posts) == 2 and posts[0][2] == posts[1][2] and spans,
                   f"{len(posts)} posts")
            gap = times[1] - times[0] if len(times) == 2 else 0
            s.case("retry: the second try waits for Retry-After (>= 1 s, < 3 s)",
                   0.95 <= gap < 3, f"{gap:.2f}s")
            end = time.time() + 3
            ex = 0
            while time.time() < end:
                ex = metric(srv.port, "sampan_trace_spans_exported_total") or 0
                if ex >= len(spans) > 0:
                    break
                time.sleep(0.1)
            failed = metric(srv.port, "sampan_trace_spans_dropped_total", reason="export_failed")
            s.case("retry: the spans count as exported, none as failed",
                   ex >= len(spans) > 0 and not failed, f"exported={ex} failed={failed}")
        finally:
            s.case("retry server exits cleanly", srv.stop() == 0)
    finally:
        col.close()


def make_cert(tmp):
    """A self-signed certificate for localhost (the openssl command); (cert, key) or None."""
    if not shutil.which("openssl"):
        return None
    cert, key = os.path.join(tmp, "c.pem"), os.path.join(tmp, "k.pem")
    rc, _, _ = run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", key, "-out", cert], timeout=60)
    return (cert, key) if rc == 0 else None


def test_export_https():
    tmp = tempfile.mkdtemp(prefix="sampan-otlp-tls-")
    try:
        pair = make_cert(tmp)
        if pair is None:
            s.skip("https export", "no openssl command")
            return
        col = Collector(tls=pair)
        try:
            with EnvSet(**NO_PROXY_ENV, OTEL_EXPORTER_OTLP_CERTIFICATE=pair[0]):
                srv = Server("--otlp-endpoint", col.url)
            try:
                st, spans = one_trace(srv, col)
                s.case("https: spans arrive over TLS, the server checked with "
                       "OTEL_EXPORTER_OTLP_CERTIFICATE", st == 200 and len(spans) >= 1,
                       f"{st} {len(spans)}")
            finally:
                s.case("https server exits cleanly", srv.stop() == 0)
            # Without the CA the certificate is not trusted: nothing arrives, the failure is
            # counted and logged.
            n0 = len(col.posts)
            with EnvSet(**NO_PROXY_ENV, OTEL_EXPORTER_OTLP_CERTIFICATE=None,
                        OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=None):
                srv = Server("--otlp-endpoint", col.url, "--otlp-timeout", "1")
            try:
                st, _ = one_trace(srv, col, timeout=0.2)
                m = srv.wait_log(r"event=trace_export_failed .*error=", timeout=8)
                s.case("https: an untrusted certificate fails the export, which is logged",
                       st == 200 and m is not None and len(col.posts) == n0,
                       srv.text()[-400:])
            finally:
                srv.stop()
        finally:
            col.close()
        rc, _, err = run([binary(), "serve", "--port", "0", "--otlp-endpoint",
                          "https://127.0.0.1:4318"], timeout=20,
                         env={"OTEL_EXPORTER_OTLP_CERTIFICATE": os.path.join(tmp, "none.pem")})
        s.case("https: a CA file that cannot be read is a start-up error",
               rc == 2 and "OTEL_EXPORTER_OTLP_CERTIFICATE" in err, f"rc={rc} {err[-200:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_export_proxy():
    # The proxy is the stand-in: it receives the POST in absolute form for a host name that
    # only it "resolves" (.invalid never resolves), and answers 200 itself.
    col = Collector()
    try:
        env = dict(NO_PROXY_ENV, http_proxy=col.url, no_proxy="")
        with EnvSet(**env):
            srv = Server("--otlp-endpoint", "http://collector.invalid:4318")
        try:
            st, spans = one_trace(srv, col)
            with col.lock:
                path = col.posts[-1][0] if col.posts else ""
            s.case("proxy: http_proxy carries the export (absolute-form target)",
                   st == 200 and spans and path == "http://collector.invalid:4318/v1/traces",
                   path)
        finally:
            s.case("proxy server exits cleanly", srv.stop() == 0)
    finally:
        col.close()


def test_off_and_flags():
    srv = Server()
    try:
        st, h, _, _ = completion(srv.port, {"traceparent": f"00-{rand_hex(16)}-{rand_hex(8)}-01"},
                                 max_tokens=1)
        s.case("tracing off (no --otlp-endpoint): no traceparent in the answer",
               st == 200 and "traceparent" not in h, str(h.get("traceparent")))
        z = metric(srv.port, "sampan_trace_spans_exported_total")
        s.case("tracing off: the counters exist and are 0", z == 0, str(z))
    finally:
        s.case("tracing-off server exits cleanly", srv.stop() == 0)
    for args, want in ((["--otlp-endpoint", "ftp://127.0.0.1:4318"], "http:// or https://"),
                       (["--otlp-endpoint", "http://127.0.0.1:99999"], "bad port"),
                       (["--otlp-endpoint", "http://:4318"], "no host"),
                       (["--otlp-endpoint", "http://127.0.0.1:4318", "--trace-sample-ratio", "2"],
                        "trace-sample-ratio")):
        rc, out, err = run([binary(), "serve", "--port", "0", *args], timeout=20)
        s.case(f"bad flag {' '.join(args[-2:])}: exit 2 with a clear message",
               rc == 2 and want in err, f"rc={rc} {err[:200]}")


def main():
    if binary() is None:
        s.skip("tracing", "sampan not built")
        s.finish()
    col = Collector()
    try:
        srv = Server("--otlp-endpoint", col.url, "--otel-service-name", "trace-test",
                     "--api-key", "k1", "--log-requests", "all")
        try:
            s.guard("LLM span tree", test_llm_tree, col, srv)
            s.guard("roots, sampling, malformed", test_roots_and_stream, col, srv)
        finally:
            s.case("server exits cleanly", srv.stop() == 0)
        s.guard("ratio 0", test_ratio_zero, col)
        s.guard("ratio 0.5", test_ratio_half, col)
        s.guard("tensor model", test_tensor, col)
    finally:
        col.close()
    s.guard("collector down", test_collector_down)
    s.guard("collector hangs", test_collector_hangs)
    s.guard("export headers", test_export_headers)
    s.guard("export retry", test_export_retry)
    s.guard("export https", test_export_https)
    s.guard("export proxy", test_export_proxy)
    s.guard("tracing off, flags", test_off_and_flags)
    s.finish()


if __name__ == "__main__":
    main()
