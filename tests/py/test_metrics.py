"""test_metrics.py - GET /metrics and the logs of `sampan serve`, as a black box on 127.0.0.1:
  - the exposition parses (HELP/TYPE once per family, cumulative buckets ending in +Inf equal
    to _count) and its values follow the traffic sent (successes, failures by reason, tokens,
    TTFT counts), per model and version;
  - `promtool check metrics` (Debian's prometheus package) passes on the sampan_ families;
  - --metrics-compat vllm adds vLLM's names (vllm:num_requests_waiting, ...);
  - a real Prometheus on loopback scrapes the server and answers a query for a series;
  - every documented name in docs/metrics.md is exported, and nothing undocumented;
  - logs: x-request-id kept or made, one access line per inference request with model,
    version, tokens and timings, --log-format json lines parse, --log-prompts masks, and a
    CRLF in a model name cannot forge a line.
Tools missing (promtool, prometheus) give visible skip lines. Last line:
    metrics: N passed, N failed, N skipped"""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

from common import ROOT, Server, Suite, free_port

s = Suite("metrics")


def req(srv, method, path, body=None, headers=None, timeout=20):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json", **(headers or {})}
        c.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
    finally:
        c.close()


def parse(text):
    """Prometheus text format -> ({family: type}, {family: help}, [(name, labels, value)]),
    checking the rules a scraper relies on; problems are returned as a list."""
    types, helps, samples, problems = {}, {}, [], []
    for line in text.split("\n"):
        if not line:
            continue
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            if name in helps:
                problems.append(f"two HELP for {name}")
            helps[name] = line
        elif line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            if name in types:
                problems.append(f"two TYPE for {name}")
            types[name] = typ
        else:
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
            if not m:
                problems.append(f"bad line {line!r}")
                continue
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4).replace("+Inf", "inf"))))
    if not text.endswith("\n"):
        problems.append("no final newline")
    # Histograms: cumulative buckets, +Inf last and equal to _count.
    for fam, typ in types.items():
        if typ != "histogram":
            continue
        series = {}
        for name, labels, v in samples:
            if name == fam + "_bucket":
                key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
                series.setdefault(key, []).append((labels["le"], v))
        counts = {tuple(sorted(l.items())): v for n, l, v in samples if n == fam + "_count"}
        for key, bs in series.items():
            vals = [v for _, v in bs]
            if vals != sorted(vals) or bs[-1][0] != "+Inf" or counts.get(key) != vals[-1]:
                problems.append(f"histogram {fam} {key} not cumulative or +Inf != count")
    return types, helps, samples, problems


def value(samples, name, **labels):
    out = [v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items())]
    return sum(out) if out else None


def documented_names():
    """Names in the tables of docs/metrics.md (first column, before any '{')."""
    names = set()
    for line in open(os.path.join(ROOT, "docs", "metrics.md")):
        if line.startswith("| `"):
            for n in re.findall(r"`([a-z0-9_:]+)(?:\{[^`]*\})?`", line.split("|")[1]):
                names.add(n)
    return names


def traffic(srv):
    """Two successes, a stream, a 400 and a KServe generate; returns the completion tokens."""
    tokens = 0
    for _ in range(2):
        st, _, b = req(srv, "POST", "/v1/completions",
                       {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 6})
        tokens += json.loads(b)["usage"]["completion_tokens"] if st == 200 else 0
    st, _, b = req(srv, "POST", "/v1/completions",
                   {"model": "stories260K", "prompt": "Once", "max_tokens": 4, "stream": True})
    tokens += b.count(b'"text_completion"')  # one chunk per token
    req(srv, "POST", "/v1/completions", {"model": "stories260K", "prompt": "x", "max_tokens": -1})
    st, _, b = req(srv, "POST", "/v2/models/stories260K/generate",
                   {"text_input": "Once", "max_tokens": 3})
    return tokens


def test_exposition():
    srv = Server("--metrics-compat", "vllm")
    try:
        traffic(srv)
        st, h, body = req(srv, "GET", "/metrics")
        text = body.decode()
        s.case("GET /metrics 200 with the text format's content type",
               st == 200 and h.get("content-type", "").startswith("text/plain; version=0.0.4"),
               h.get("content-type"))
        types, helps, samples, problems = parse(text)
        s.case("exposition parses: one HELP/TYPE per family, histograms cumulative",
               not problems and set(types) == set(n.split(" ")[2] for n in helps.values()),
               str(problems[:5]))
        lab = {"model": "stories260K", "version": "1"}
        ok = value(samples, "sampan_request_success_total", **lab)
        s.case("successes counted (4: two completions, a stream, a generate)", ok == 4, str(ok))
        bad = value(samples, "sampan_request_failure_total", reason="invalid_request", **lab)
        s.case("the 400 counted as invalid_request", bad == 1, str(bad))
        ttft = value(samples, "sampan_time_to_first_token_seconds_count", **lab)
        e2e = value(samples, "sampan_e2e_request_latency_seconds_count", **lab)
        s.case("TTFT and e2e observed once per success", ttft == 4 and e2e == 4, f"{ttft} {e2e}")
        gen = value(samples, "sampan_generation_tokens_total", **lab)
        s.case("generation tokens counted", gen == 6 + 6 + 4 + 3, str(gen))
        s.case("KV blocks total > 0 and usage ratio in 0..1",
               value(samples, "sampan_kv_cache_capacity_blocks", **lab) > 0 and
               0 <= value(samples, "sampan_kv_cache_usage_ratio", **lab) <= 1)
        s.case("waiting gauge per tier",
               {l["tier"] for n, l, v in samples if n == "sampan_requests_waiting"} ==
               {"premium", "standard", "batch"})
        s.case("model ready and memory", value(samples, "sampan_model_ready", **lab) == 1 and
               value(samples, "sampan_model_memory_bytes", **lab) > 0)
        s.case("device memory: cpu with total >= budget > 0",
               value(samples, "sampan_device_memory_total_bytes", device="cpu") >=
               value(samples, "sampan_device_memory_budget_bytes", device="cpu") > 0)
        s.case("process RSS and HTTP response codes",
               value(samples, "process_resident_memory_bytes") > 1e6 and
               value(samples, "sampan_http_responses_total", code="400") == 1)
        s.case("vLLM names with --metrics-compat vllm",
               all(n in types for n in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                                        "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds",
                                        "vllm:generation_tokens_total", "vllm:request_success_total"))
               and value(samples, "vllm:request_success_total", model_name="stories260K") == 4
               and value(samples, "vllm:time_to_first_token_seconds_count",
                         model_name="stories260K") == 4)
        # Triton's nv_inference_* names need --metrics-compat triton: test_tstats.py.
        doc = {n for n in documented_names() if not n.startswith("nv_inference_")}
        exported = {n for n in types if not n.startswith("vllm:")}
        vllm_doc = {n for n in doc if n.startswith("vllm:")}
        s.case("every documented name is exported", (doc - vllm_doc) <= exported and
               vllm_doc <= set(types), str(sorted((doc - set(types)))))
        s.case("nothing exported is undocumented", exported <= doc, str(sorted(exported - doc)))
        promtool = shutil.which("promtool")
        if promtool is None:
            s.skip("promtool check metrics", "promtool not installed (apt prometheus)")
        else:
            own = "\n".join(l for l in text.split("\n") if "vllm:" not in l) + "\n"
            p = subprocess.run([promtool, "check", "metrics"], input=own, text=True,
                               capture_output=True, timeout=60)
            s.case("promtool check metrics passes on the sampan_ families", p.returncode == 0,
                   (p.stdout + p.stderr)[-500:])
        prometheus_scrape(srv)
    finally:
        s.case("server exits cleanly", srv.stop() == 0)
    srv = Server()
    try:
        _, _, body = req(srv, "GET", "/metrics")
        s.case("no vLLM names by default", b"vllm:" not in body)
        # A request's latency starts when its first bytes arrive, not when it has been parsed:
        # a head sent in two parts 0.4 s apart is a request of at least 0.4 s.
        body = json.dumps({"model": "stories260K", "prompt": "Once", "max_tokens": 1}).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as so:
            so.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n")
            time.sleep(0.4)
            so.sendall(b"Content-Type: application/json\r\nConnection: close\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            answer = b""
            while True:
                chunk = so.recv(65536)
                if not chunk:
                    break
                answer += chunk
        _, _, text = req(srv, "GET", "/metrics")
        _, _, samples, _ = parse(text.decode())
        lab = {"model": "stories260K", "version": "1"}
        e2e_sum = value(samples, "sampan_e2e_request_latency_seconds_sum", **lab)
        s.case("e2e latency counts from the request's first bytes (head split 0.4 s apart)",
               answer.startswith(b"HTTP/1.1 200") and e2e_sum >= 0.4, f"{e2e_sum} {answer[:40]!r}")
    finally:
        srv.stop()


def prometheus_scrape(srv):
    prom = shutil.which("prometheus")
    if prom is None:
        s.skip("prometheus scrape", "prometheus not installed (apt prometheus)")
        return
    tmp = tempfile.mkdtemp(prefix="sampan-prom-")
    port = free_port()
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sampan\n"
                f"    static_configs:\n      - targets: ['127.0.0.1:{srv.port}']\n")
    p = subprocess.Popen([prom, f"--config.file={tmp}/prometheus.yml",
                          f"--storage.tsdb.path={tmp}/data", f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        q = urllib.request.quote('sampan_request_success_total{finished_reason="length"}')
        result, end = None, time.time() + 40
        while time.time() < end and not result:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query={q}",
                                            timeout=5) as r:
                    result = json.load(r)["data"]["result"]
            except Exception:
                pass
        s.case("a real Prometheus scrapes the server and answers a query",
               bool(result) and result[0]["metric"].get("model") == "stories260K" and
               float(result[0]["value"][1]) >= 1, str(result)[:300])
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def test_logs():
    srv = Server("--log-prompts")
    try:
        st, h, _ = req(srv, "POST", "/v1/completions",
                       {"model": "stories260K", "prompt": "write to ann@example.com or 555-123-4567",
                        "max_tokens": 4}, headers={"x-request-id": "client-id-42"})
        s.case("a client's x-request-id is returned", h.get("x-request-id") == "client-id-42")
        line = srv.wait_log(r"event=request rid=client-id-42 .*\n", 5)
        line = line.group(0) if line else ""
        s.case("one access line with model, version, tokens and timings",
               all(k in line for k in ("status=200", "model=stories260K", "version=1",
                                       "completion_tokens=4", "ttft_ms=", "queue_ms=", "duration_ms=")),
               line)
        s.case("--log-prompts masks e-mail and phone numbers",
               "[email]" in line and "[phone]" in line and "ann@example.com" not in line, line)
        st, h, _ = req(srv, "GET", "/v1/models", headers={"x-request-id": "bad id\twith tab"})
        s.case("a bad x-request-id is replaced", re.fullmatch(r"[0-9a-f]+-[0-9a-f]+",
                                                              h.get("x-request-id", "")) is not None,
               h.get("x-request-id"))
        req(srv, "POST", "/v1/completions",
            {"model": "evil\r\nts=x level=error event=forged", "prompt": "x"})
        time.sleep(0.2)
        s.case("a CRLF in a model name cannot forge a log line",
               not any(l.startswith("ts=x") or " event=forged" in l.split("path=")[0]
                       for l in srv.log), "".join(srv.log[-3:]))
        s.case("health probes are not access-logged by default",
               "path=/health" not in srv.text())
    finally:
        srv.stop()
    srv = Server("--log-format", "json")
    try:
        req(srv, "POST", "/v1/completions", {"model": "stories260K", "prompt": "Once", "max_tokens": 2})
        time.sleep(0.2)
        lines = [l for l in srv.log if l.strip()]
        parsed = []
        for l in lines:
            try:
                parsed.append(json.loads(l))
            except ValueError:
                parsed.append(None)
        reqs = [p for p in parsed if p and p.get("event") == "request"]
        s.case("--log-format json: every line is a JSON object", lines and None not in parsed,
               "".join(lines[:3]))
        s.case("--log-format json: the access line has typed fields",
               reqs and reqs[0]["status"] == 200 and reqs[0]["model"] == "stories260K" and
               isinstance(reqs[0]["duration_ms"], float), str(reqs[:1]))
    finally:
        srv.stop()
    srv = Server()
    try:
        req(srv, "POST", "/v1/completions",
            {"model": "stories260K", "prompt": "secret ann@example.com", "max_tokens": 2})
        time.sleep(0.2)
        s.case("prompts are not logged without --log-prompts",
               "secret" not in srv.text() and "prompt=" not in srv.text())
    finally:
        srv.stop()


s.guard("exposition", test_exposition)
s.guard("logs", test_logs)
s.finish()
