#!/usr/bin/python3
"""test_tstats.py - Triton's statistics, repository and health surface (docs/design.md)
against `sampan serve --model-repository` with the identity backend and the demo LLM (with a
LoRA adapter made by tools/lora_gen.py), tenants from `sampan keys add`:

  - GET /v2/models/{m}[/versions/{v}]/stats and /v2/models/stats: Triton's documented JSON
    shape (extension_statistics.md: model_stats[] with name, version, last_inference,
    inference_count, execution_count, inference_stats {success, fail, queue, compute_input,
    compute_infer, compute_output, cache_hit, cache_miss} of {count, ns}, batch_stats[] with
    batch_size and the three compute durations), the counts exactly those of the requests sent
    (N successes of known batch sizes, 1 failure; LLM requests too), durations consistent (the
    phases of a request inside its success time), unknown model/version 404, a tenant sees only
    its models; with the response cache, a miss and a hit counted as Triton counts them;
  - gRPC ModelStatistics, RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload through
    @grpc/grpc-js (tests/node/grpc_client.mjs): the same numbers as REST, the admin scope as on
    REST (an infer key is refused on both), bad parameters refused;
  - grpc.health.v1.Health with @grpc/grpc-js and proto/health.proto (tests/node/health_client.mjs):
    Check of the server and of a model, NOT_FOUND for an unknown one, Watch seeing an unload
    turn SERVING into NOT_SERVING;
  - /metrics: the nv_inference_* names only with --metrics-compat triton, equal to the
    statistics; the new vLLM histograms (request_prompt_tokens, request_generation_tokens,
    request_prefill_time_seconds, request_decode_time_seconds) and vllm:lora_requests_info
    naming the adapter while its requests run and wait; `promtool check metrics` parses it.
Last line:
    tstats: N passed, N failed, N skipped"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import http.client

from common import (DEMO_MODEL, NODE_DIR, ROOT, Server, Suite, binary, free_port, grpc_client,
                    have_grpc_client, keyed_request, keys_add)

s = Suite("tstats")
PLUGINS = os.path.join(os.path.dirname(binary() or ""), "backends")
DUR = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
       "cache_hit", "cache_miss")

IDENT = {"name": "ident", "backend": "identity", "max_batch_size": 8,
         "input": [{"name": "f", "data_type": "TYPE_FP32", "dims": [3]}],
         "output": [{"name": "f_out", "data_type": "TYPE_FP32", "dims": [3]}]}


def infer_body(rows):
    return {"inputs": [{"name": "f", "datatype": "FP32", "shape": [rows, 3],
                        "data": [float(i) for i in range(rows * 3)]}]}


def shape_ok(ms):
    """One $model_stat as Triton documents it: every field, every duration {count, ns}."""
    if not isinstance(ms, dict):
        return False
    if not (isinstance(ms.get("name"), str) and isinstance(ms.get("version"), str)):
        return False
    for k in ("last_inference", "inference_count", "execution_count"):
        if not isinstance(ms.get(k), int) or ms[k] < 0:
            return False
    ist = ms.get("inference_stats")
    if not isinstance(ist, dict) or set(ist) != set(DUR):
        return False
    for d in ist.values():
        if set(d) != {"count", "ns"} or not all(isinstance(d[x], int) and d[x] >= 0 for x in d):
            return False
    if not isinstance(ms.get("batch_stats"), list):
        return False
    for b in ms["batch_stats"]:
        if set(b) != {"batch_size", "compute_input", "compute_infer", "compute_output"}:
            return False
    return True


def stat(port, key, path):
    st, _, b = keyed_request(port, "GET", path, key=key)
    return st, b


def test_rest(srv, admin, tenant_key):
    port = srv.port
    # Before any request: zero counts, the documented shape.
    st, b = stat(port, admin, "/v2/models/ident/stats")
    ms = (b or {}).get("model_stats", [None])[0] if st == 200 else None
    s.case("stats before traffic: Triton's shape, zero counts, last_inference 0",
           st == 200 and shape_ok(ms) and ms["name"] == "ident" and ms["version"] == "1" and
           ms["inference_count"] == 0 and ms["last_inference"] == 0 and
           all(d["count"] == 0 for d in ms["inference_stats"].values()) and ms["batch_stats"] == [],
           f"{st} {b}")
    # Traffic: batch sizes 1, 2, 2, 3 one at a time (no dynamic batching: a batch per
    # request), and one request refused (a wrong shape).
    rows = [1, 2, 2, 3]
    t0 = time.time()
    codes = [keyed_request(port, "POST", "/v2/models/ident/infer", infer_body(r), key=admin)[0]
             for r in rows]
    bad = keyed_request(port, "POST", "/v2/models/ident/infer",
                        {"inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 4],
                                     "data": [1, 2, 3, 4]}]}, key=admin)[0]
    t1 = time.time()
    st, b = stat(port, admin, "/v2/models/ident/stats")
    ms = b["model_stats"][0] if st == 200 and b.get("model_stats") else {}
    ist = ms.get("inference_stats", {})
    s.case("traffic answered (4 x 200, the bad shape 400)", codes == [200] * 4 and bad == 400,
           f"{codes} {bad}")
    s.case("stats after traffic: still Triton's shape", shape_ok(ms), json.dumps(ms)[:400])
    s.case("success.count = 4, fail.count = 1 (exactly the requests sent)",
           ist.get("success", {}).get("count") == 4 and ist.get("fail", {}).get("count") == 1,
           json.dumps(ist))
    s.case("inference_count = rows inferred (8), execution_count = batches (4)",
           ms.get("inference_count") == sum(rows) and ms.get("execution_count") == 4,
           f"{ms.get('inference_count')} {ms.get('execution_count')}")
    s.case("queue, compute_input/infer/output counted once per successful request",
           all(ist.get(k, {}).get("count") == 4
               for k in ("queue", "compute_input", "compute_infer", "compute_output")),
           json.dumps(ist))
    # A request's phases lie inside its time from arrival to answer, so their sums do too;
    # and the success time lies inside the wall time the test measured around them.
    phases = sum(ist[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output")) \
        if shape_ok(ms) else -1
    s.case("durations: phases <= success time <= the test's wall time; infer time > 0",
           0 <= phases <= ist["success"]["ns"] <= (t1 - t0) * 1e9 and
           ist["compute_infer"]["ns"] > 0 if phases >= 0 else False,
           f"phases {phases} success {ist.get('success')} wall {(t1 - t0) * 1e9:.0f}")
    s.case("last_inference: unix milliseconds within the traffic's window",
           int(t0 * 1000) - 1000 <= ms.get("last_inference", 0) <= int(t1 * 1000) + 1000,
           f"{ms.get('last_inference')} [{t0 * 1000:.0f}, {t1 * 1000:.0f}]")
    bs = {x["batch_size"]: x for x in ms.get("batch_stats", [])}
    s.case("batch_stats: sizes 1, 2, 3 with 1, 2, 1 executions, ascending",
           [x["batch_size"] for x in ms.get("batch_stats", [])] == [1, 2, 3] and
           all(bs[k]["compute_infer"]["count"] == n and bs[k]["compute_input"]["count"] == n and
               bs[k]["compute_output"]["count"] == n for k, n in ((1, 1), (2, 2), (3, 1))),
           json.dumps(ms.get("batch_stats")))
    s.case("batch_stats' infer time adds up to compute_infer's",
           sum(x["compute_infer"]["ns"] for x in bs.values()) == ist.get("compute_infer", {}).get("ns"),
           "")
    # The LLM: two completions (one OpenAI, one KServe generate), counted the same way.
    for body in ({"model": "stories", "prompt": "Once upon a time", "max_tokens": 5},):
        keyed_request(port, "POST", "/v1/completions", body, key=admin)
    keyed_request(port, "POST", "/v2/models/stories/generate", {"text_input": "Once", "max_tokens": 3},
                  key=admin)
    keyed_request(port, "POST", "/v1/completions", {"model": "stories", "prompt": "x", "max_tokens": -1},
                  key=admin)
    st, b = stat(port, admin, "/v2/models/stories/versions/1/stats")
    lm = b["model_stats"][0] if st == 200 and b.get("model_stats") else {}
    li = lm.get("inference_stats", {})
    s.case("LLM stats: 2 successes, 1 failure, queue and compute_infer per success",
           shape_ok(lm) and li["success"]["count"] == 2 and li["fail"]["count"] == 1 and
           li["queue"]["count"] == 2 and li["compute_infer"]["count"] == 2 and
           lm["inference_count"] == 2 and lm["execution_count"] == 2, json.dumps(lm)[:600])
    st, b = stat(port, admin, "/v2/models/stats")
    names = [m["name"] for m in (b or {}).get("model_stats", [])]
    s.case("GET /v2/models/stats: every ready model version",
           st == 200 and names == ["ident", "identc", "stories"],
           f"{st} {names}")
    st, b = stat(port, admin, "/v2/models/ident/versions/7/stats")
    s.case("an unknown version: 404 with an error", st == 404 and "error" in (b or {}), f"{st} {b}")
    st, b = stat(port, admin, "/v2/models/nosuch/stats")
    s.case("an unknown model: 404 with an error", st == 404 and "error" in (b or {}), f"{st} {b}")
    st, b = stat(port, tenant_key, "/v2/models/stats")
    s.case("a tenant limited to ident sees ident only",
           st == 200 and [m["name"] for m in b["model_stats"]] == ["ident"], f"{st} {b}")
    st, b = stat(port, tenant_key, "/v2/models/stories/stats")
    s.case("... and another model's stats are 404 to it", st == 404, f"{st} {b}")
    st, _, b = keyed_request(port, "GET", "/v2", key=admin)
    s.case("server metadata lists the statistics extension",
           st == 200 and "statistics" in b.get("extensions", []), f"{b}")
    return ms


def test_cache(srv, admin):
    """The same request twice to a model whose answers are cached: a miss that ran, then a hit
    that did not (Triton: successes both, inferences and phases only for the one that ran)."""
    codes = [keyed_request(srv.port, "POST", "/v2/models/identc/infer", infer_body(2), key=admin)[0]
             for _ in range(2)]
    st, b = stat(srv.port, admin, "/v2/models/identc/stats")
    ms = b["model_stats"][0] if st == 200 and b.get("model_stats") else {}
    ist = ms.get("inference_stats", {})
    s.case("response cache: cache_miss 1, cache_hit 1, success 2; inference_count 2 (rows of the "
           "one that ran), execution_count 1, queue/compute counted once",
           codes == [200, 200] and shape_ok(ms) and ist["cache_miss"]["count"] == 1 and
           ist["cache_hit"]["count"] == 1 and ist["success"]["count"] == 2 and
           ms["inference_count"] == 2 and ms["execution_count"] == 1 and
           ist["queue"]["count"] == 1 and ist["compute_infer"]["count"] == 1 and
           ist["cache_miss"]["ns"] > 0 and ist["cache_hit"]["ns"] > 0, f"{codes} {json.dumps(ms)[:500]}")


def test_grpc(srv, gport, admin, infer_key, rest_ms):
    A = {"authorization": f"Bearer {admin}"}
    I = {"authorization": f"Bearer {infer_key}"}
    r = grpc_client(gport, [
        {"method": "ModelStatistics", "request": {"name": "ident"}, "metadata": A},
        {"method": "ModelStatistics", "request": {}, "metadata": A},
        {"method": "ModelStatistics", "request": {"name": "nosuch"}, "metadata": A},
        {"method": "ModelStatistics", "request": {"version": "1"}, "metadata": A},
        {"method": "RepositoryIndex", "request": {}, "metadata": A},
        {"method": "RepositoryIndex", "request": {}, "metadata": I},
        {"method": "RepositoryIndex", "request": {"repository_name": "other"}, "metadata": A},
        {"method": "RepositoryModelLoad", "request": {"model_name": "ident",
                                                      "parameters": {"bogus": {"bool_param": True}}},
         "metadata": A},
        {"method": "RepositoryModelUnload", "request": {"model_name": "ident"}, "metadata": I},
        {"method": "RepositoryModelUnload", "request": {"model_name": "ident"}, "metadata": A},
        {"method": "RepositoryIndex", "request": {"ready": True}, "metadata": A},
        {"method": "RepositoryModelLoad", "request": {"model_name": "ident"}, "metadata": A},
        {"method": "RepositoryIndex", "request": {"ready": True}, "metadata": A},
        {"method": "ModelStatistics", "request": {"name": "ident", "version": "1"}, "metadata": A},
    ])
    g = r[0].get("response", {}).get("model_stats", [{}])[0] if r[0].get("code") == 0 else {}
    gi, ri = g.get("inference_stats", {}), rest_ms.get("inference_stats", {})
    s.case("ModelStatistics: the REST numbers, field by field (incl. cache_hit/cache_miss)",
           g.get("name") == "ident" and g.get("version") == "1" and
           all(g.get(k) == rest_ms.get(k) for k in ("inference_count", "execution_count",
                                                    "last_inference")) and
           all(gi.get(k) == ri.get(k) for k in DUR) and
           [(x["batch_size"], x["compute_infer"]) for x in g.get("batch_stats", [])] ==
           [(x["batch_size"], x["compute_infer"]) for x in rest_ms.get("batch_stats", [])],
           f"{r[0]}"[:800])
    allm = [m["name"] for m in r[1].get("response", {}).get("model_stats", [])]
    s.case("ModelStatistics without a name: every model", allm == ["ident", "identc", "stories"],
           str(r[1])[:300])
    s.case("ModelStatistics of an unknown model: NOT_FOUND", r[2].get("code") == 5, str(r[2]))
    s.case("ModelStatistics with a version but no name: INVALID_ARGUMENT", r[3].get("code") == 3,
           str(r[3]))
    idx = {m["name"]: m for m in r[4].get("response", {}).get("models", [])}
    s.case("RepositoryIndex: both models READY, version 1",
           r[4].get("code") == 0 and idx.get("ident", {}).get("state") == "READY" and
           idx.get("stories", {}).get("version") == "1", str(r[4])[:400])
    s.case("RepositoryIndex with an infer-only key: PERMISSION_DENIED (as REST's 403)",
           r[5].get("code") == 7, str(r[5]))
    st, _, _ = keyed_request(srv.port, "POST", "/v2/repository/index", {}, key=infer_key)
    s.case("... and REST refuses it the same", st == 403, str(st))
    s.case("RepositoryIndex of another repository name: NOT_FOUND", r[6].get("code") == 5, str(r[6]))
    s.case("RepositoryModelLoad with an unknown parameter: INVALID_ARGUMENT naming it",
           r[7].get("code") == 3 and "bogus" in r[7].get("details", ""), str(r[7]))
    s.case("RepositoryModelUnload with an infer key: PERMISSION_DENIED", r[8].get("code") == 7, str(r[8]))
    ready1 = [m["name"] for m in r[10].get("response", {}).get("models", [])]
    ready2 = [m["name"] for m in r[12].get("response", {}).get("models", [])]
    s.case("RepositoryModelUnload, then RepositoryIndex(ready) lists the others only",
           r[9].get("code") == 0 and r[9].get("response") == {} and ready1 == ["identc", "stories"],
           f"{r[9]} {ready1}")
    s.case("RepositoryModelLoad brings it back (ready again)",
           r[11].get("code") == 0 and ready2 == ["ident", "identc", "stories"], f"{r[11]} {ready2}")
    g2 = r[13].get("response", {}).get("model_stats", [{}])[0] if r[13].get("code") == 0 else {}
    s.case("a reloaded version's statistics start from zero (as Triton's)",
           g2.get("inference_count") == 0 and
           g2.get("inference_stats", {}).get("success", {}).get("count") == 0, str(r[13])[:300])


def health(gport, calls):
    inp = {"addr": f"127.0.0.1:{gport}", "calls": calls}
    p = subprocess.run(["node", os.path.join(NODE_DIR, "health_client.mjs")], input=json.dumps(inp),
                       capture_output=True, text=True, timeout=60, cwd=NODE_DIR)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout)


def test_health(srv, gport, admin):
    A = {"authorization": f"Bearer {admin}"}
    r = health(gport, [
        {"check": ""},
        {"check": "inference.GRPCInferenceService"},
        {"check": "ident", "metadata": A},
        {"check": "nosuch", "metadata": A},
        {"watch": "ident", "metadata": A, "until": "NOT_SERVING", "timeout_ms": 15000,
         "on_first": {"url": f"http://127.0.0.1:{srv.port}/v2/repository/models/ident/unload",
                      "method": "POST", "headers": {"authorization": f"Bearer {admin}"}}},
        {"check": "ident", "metadata": A},
        {"check": ""},
    ])
    s.case("Health.Check(\"\"): SERVING without a key (Kubernetes probes send none)",
           r[0].get("code") == 0 and r[0].get("status") == "SERVING", str(r[0]))
    s.case("Health.Check(the service's name): SERVING", r[1].get("status") == "SERVING", str(r[1]))
    s.case("Health.Check(a ready model): SERVING", r[2].get("status") == "SERVING", str(r[2]))
    s.case("Health.Check(an unknown model): NOT_FOUND", r[3].get("code") == 5, str(r[3]))
    s.case("Health.Watch sees the unload: SERVING, then NOT_SERVING",
           r[4].get("code") == 0 and r[4].get("statuses") == ["SERVING", "NOT_SERVING"] and
           r[4].get("http_status") == 200, str(r[4]))
    s.case("Health.Check after the unload: NOT_SERVING; the server still SERVING",
           r[5].get("status") == "NOT_SERVING" and r[6].get("status") == "SERVING",
           f"{r[5]} {r[6]}")
    st, _, _ = keyed_request(srv.port, "POST", "/v2/repository/models/ident/load", {}, key=admin)
    s.case("ident loads again", st == 200, str(st))


def lora_busy(port, admin):
    """A stream of 12 sequences of 480 tokens on stories:alpha (4 run at once, the rest wait):
    scraped after its first event, while it still runs."""
    out = {}

    def long_stream():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps(
            {"model": "stories:alpha", "prompt": "Once", "max_tokens": 480, "n": 12,
             "stream": True, "ignore_eos": True}).encode(),
            headers={"Content-Type": "application/json", "authorization": f"Bearer {admin}"})
        r = c.getresponse()
        out["status"] = r.status
        r.read(1)  # the first event has begun: the request runs
        out["first"].set()
        r.read()
        out["done"] = time.time()
        c.close()

    out["first"] = threading.Event()
    t = threading.Thread(target=long_stream)
    t.start()
    out["first"].wait(30)
    st, _, m = keyed_request(port, "GET", "/metrics", key=admin)
    scraped = time.time()
    t.join(120)
    text = m.decode() if isinstance(m, bytes) else str(m)
    return text, out.get("done", 0) > scraped


def test_metrics(srv, admin, ms_rest):
    st, _, m = keyed_request(srv.port, "GET", "/metrics", key=admin)
    text = m.decode() if isinstance(m, bytes) else str(m)

    def val(name, **lab):
        want = ",".join(f'{k}="{v}"' for k, v in lab.items())
        for line in text.split("\n"):
            if line.startswith(name + "{") and want in line:
                return float(line.rsplit(" ", 1)[1])
        return None

    ist = ms_rest["inference_stats"]
    s.case("nv_inference_request_success/failure/count/exec_count equal the statistics",
           val("nv_inference_request_success", model="stories", version="1") == 2 and
           val("nv_inference_request_failure", model="stories", version="1") == 1 and
           val("nv_inference_count", model="stories", version="1") == 2 and
           val("nv_inference_exec_count", model="stories", version="1") == 2, "")
    have = all(f"# TYPE {n}\n" in text for n in (
        "nv_inference_request_success counter", "nv_inference_request_failure counter",
        "nv_inference_count counter", "nv_inference_exec_count counter",
        "nv_inference_request_duration_us counter", "nv_inference_queue_duration_us counter",
        "nv_inference_compute_input_duration_us counter",
        "nv_inference_compute_infer_duration_us counter",
        "nv_inference_compute_output_duration_us counter",
        "nv_inference_pending_request_count gauge"))
    s.case("every nv_inference_* family with Triton's type and labels model, version",
           have and val("nv_inference_pending_request_count", model="ident", version="1") == 0,
           "")
    s.case("the new vLLM histograms: prompt/generation lengths, prefill/decode times (2 requests)",
           val("vllm:request_prompt_tokens_count", model_name="stories") == 2 and
           val("vllm:request_generation_tokens_sum", model_name="stories") == 8 and
           val("vllm:request_prefill_time_seconds_count", model_name="stories") == 2 and
           val("vllm:request_decode_time_seconds_count", model_name="stories") == 2,
           "")
    idle = [l for l in text.split("\n") if l.startswith("vllm:lora_requests_info{")]
    s.case("vllm:lora_requests_info idle: no adapter running or waiting, max_lora set",
           len(idle) == 1 and 'running_lora_adapters=""' in idle[0] and
           'waiting_lora_adapters=""' in idle[0] and 'max_lora="' in idle[0], str(idle))
    busy, still_running = lora_busy(srv.port, admin)
    info = [l for l in busy.split("\n") if l.startswith("vllm:lora_requests_info{")]
    if not still_running:
        s.skip("vllm:lora_requests_info busy", "the stream ended before the scrape (a machine too fast)")
    else:
        s.case("vllm:lora_requests_info busy: alpha running and waiting (12 sequences, 4 slots)",
               len(info) == 1 and 'running_lora_adapters="alpha"' in info[0] and
               'waiting_lora_adapters="alpha"' in info[0], str(info))
    promtool = shutil.which("promtool")
    if promtool is None:
        s.skip("promtool check metrics", "promtool not installed")
    else:
        p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        # Exit 1 is a parse error; 3 lists lint findings, which here may only be about the
        # compatibility names that Triton and vLLM chose (no _total, ':' in names).
        lint = [l for l in (p.stdout + p.stderr).split("\n") if l.strip()]
        foreign = [l for l in lint if not (l.startswith("nv_inference_") or l.startswith("vllm:"))]
        s.case("promtool check metrics parses it; lint findings only on Triton's/vLLM's names",
               p.returncode in (0, 3) and not foreign, "\n".join(foreign[:5]) + p.stderr[-300:])


def test_no_flag(repo, admin_tenants):
    srv = Server("--model-repository", repo, "--tenants", admin_tenants, "--grpc-port", "off",
                 model=None)
    try:
        time.sleep(0.2)
        key = open(os.path.join(os.path.dirname(repo), "admin.key")).read().strip()
        st, _, m = keyed_request(srv.port, "GET", "/metrics", key=key)
        text = m.decode() if isinstance(m, bytes) else str(m)
        s.case("without --metrics-compat: no nv_inference_* and no vllm: names",
               st == 200 and "nv_inference_" not in text and "vllm:" not in text, str(st))
    finally:
        srv.stop()


def main():
    if binary() is None or not os.path.isfile(os.path.join(PLUGINS, "libsampan_identity.so")):
        s.skip("tstats", "build/sampan or the identity backend plugin missing")
        s.finish()
        return
    try:
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import lora_gen
    except ImportError as e:
        s.skip("tstats", f"tools/lora_gen.py needs numpy ({e})")
        s.finish()
        return
    tmp = tempfile.mkdtemp(prefix="sampan-tstats-")
    try:
        repo = os.path.join(tmp, "repo")
        os.makedirs(os.path.join(repo, "ident", "1"))
        with open(os.path.join(repo, "ident", "config.json"), "w") as f:
            json.dump(IDENT, f)
        os.makedirs(os.path.join(repo, "identc", "1"))
        with open(os.path.join(repo, "identc", "config.json"), "w") as f:
            json.dump(dict(IDENT, name="identc", response_cache={"enable": True}), f)
        os.makedirs(os.path.join(repo, "stories", "1"))
        os.makedirs(os.path.join(repo, "stories", "adapters"))
        shutil.copy(DEMO_MODEL, os.path.join(repo, "stories", "1", "model.gguf"))
        with open(os.path.join(repo, "stories", "config.json"), "w") as f:
            json.dump({"name": "stories", "backend": "llm"}, f)
        lora_gen.make(DEMO_MODEL, os.path.join(repo, "stories", "adapters", "alpha.gguf"),
                      rank=4, alpha=8, strength=0.25, seed=3)
        tenants = os.path.join(tmp, "tenants.json")
        admin = keys_add(tenants, "ops", "--scopes", "infer,admin,metrics")
        with open(os.path.join(tmp, "admin.key"), "w") as f:
            f.write(admin)
        infer_key = keys_add(tenants, "app", "--scopes", "infer")
        tenant_key = keys_add(tenants, "fraud-team", "--scopes", "infer", "--models", "ident")
        gport = free_port()
        srv = Server("--model-repository", repo, "--model-control-mode", "explicit",
                     "--tenants", tenants, "--grpc-port", str(gport), "--metrics-compat",
                     "vllm,triton", "--parallel", "4", "--response-cache-bytes", "1048576",
                     model=None)
        try:
            for name in ("ident", "identc", "stories"):
                st, _, b = keyed_request(srv.port, "POST", f"/v2/repository/models/{name}/load", {},
                                         key=admin)
                s.case(f"load {name} (explicit mode)", st == 200, f"{st} {b}")
            ms = s.guard("rest", test_rest, srv, admin, tenant_key) or {}
            s.guard("cache", test_cache, srv, admin)
            if have_grpc_client() and os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@grpc",
                                                                 "proto-loader")):
                s.guard("grpc", test_grpc, srv, gport, admin, infer_key, ms)
                s.guard("health", test_health, srv, gport, admin)
            else:
                s.skip("grpc and health", "node or tests/node/node_modules/@grpc missing")
            if ms:
                s.guard("metrics", test_metrics, srv, admin, ms)
        finally:
            s.case("server exits cleanly", srv.stop() == 0, srv.text()[-1500:])
        s.guard("no flag", test_no_flag, repo, tenants)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


if __name__ == "__main__":
    main()
