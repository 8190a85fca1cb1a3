"""test_tenant_isolation.py - what one tenant can take from or learn about the others, as a black
box on `sampan serve --tenants FILE`: tokens per minute charged for streams the client drops (OpenAI
and KServe SSE, gRPC ModelStreamInfer), reserved before the work (an n=16 request against a small limit,
30 requests at once), the tier capping a tensor model's priority level (REST and gRPC), model lists
hiding other models from /v1/models and the KServe metadata routes (REST and gRPC: 404, not 403),
the prefix cache scoped per tenant (--prefix-cache-scope tenant|global), and Retry-After computed
from the queue's drain rate (the LLM scheduler and the tensor batcher). Last line:
    tenant_isolation: N passed, N failed, N skipped"""
import base64
import http.client
import json
import os
import re
import shutil
import tempfile
import threading
import time

from common import ROOT, Server, Suite, binary, free_port, grpc_client, have_grpc_client, keyed_request, keys_add, run

s = Suite("tenant_isolation")
exe = binary()
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")
PLUGINS = os.path.join(os.path.dirname(exe or ""), "backends")
IDENT_IO = {"input": [{"name": "f", "data_type": "TYPE_FP32", "dims": [3]},
                      {"name": "i", "data_type": "TYPE_INT64", "dims": [1]},
                      {"name": "s", "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": "f_out", "data_type": "TYPE_FP32", "dims": [3]},
                       {"name": "i_out", "data_type": "TYPE_INT64", "dims": [1]},
                       {"name": "s_out", "data_type": "TYPE_STRING", "dims": [1]}]}
ONE_ROW = {"inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
                      {"name": "i", "datatype": "INT64", "shape": [1, 1], "data": [1]},
                      {"name": "s", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]}
# About 100 tokens: several full prefix-cache blocks of 16.
LONG_PROMPT = ("Once upon a time there was a little girl named Lily who loved to play in the park "
               "with her friends and her dog Max. One day she found a big red ball under a tree "
               "and she was very happy. She ran to show her mom the ball and her mom smiled.")


def metric(port, key, name, labels):
    """The value of one sample (labels: the exact {...} text), or 0 when absent."""
    _, _, text = keyed_request(port, "GET", "/metrics", key=key)
    text = text.decode() if isinstance(text, bytes) else str(text)
    m = re.search(re.escape(name + labels) + r" ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


def tenant_tokens(port, mkey, tenant):
    return metric(port, mkey, "sampan_tenant_tokens_total", '{tenant="%s"}' % tenant)


def wait_tokens(port, mkey, tenant, at_least, timeout=3.0):
    end = time.time() + timeout
    v = tenant_tokens(port, mkey, tenant)
    while v < at_least and time.time() < end:
        time.sleep(0.05)
        v = tenant_tokens(port, mkey, tenant)
    return v


def model(repo, name, cfg, gguf=False):
    os.makedirs(os.path.join(repo, name, "1"))
    if gguf:
        shutil.copy(DEMO, os.path.join(repo, name, "1", "model.gguf"))
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump(dict({"name": name}, **cfg), f)


def b64(b):
    return base64.b64encode(b).decode()


def llm_grpc_req(prompt, max_tokens):
    return {"model_name": "stories260K", "id": "g", "inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1],
         "contents": {"bytes_contents": [b64(prompt.encode())]}},
        {"name": "max_tokens", "datatype": "INT32", "shape": [1], "contents": {"int_contents": [max_tokens]}},
        {"name": "ignore_eos", "datatype": "BOOL", "shape": [1], "contents": {"bool_contents": [True]}}]}


def ident_grpc_req(name, priority):
    return {"model_name": name, "id": "p", "parameters": {"priority": {"int64_param": priority}},
            "inputs": [
                {"name": "f", "datatype": "FP32", "shape": [1, 3], "contents": {"fp32_contents": [1, 2, 3]}},
                {"name": "i", "datatype": "INT64", "shape": [1, 1], "contents": {"int64_contents": [1]}},
                {"name": "s", "datatype": "BYTES", "shape": [1, 1], "contents": {"bytes_contents": [b64(b"x")]}}]}


# ------------------------------------------------------------------ token quota


def test_dropped_streams(srv, gport, keys):
    port, mkey = srv.port, keys["ops"]
    # REST SSE: read a few chunks of a long stream (8 sequences), then hang up.
    before = tenant_tokens(port, mkey, "drop")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 480, "n": 8,
         "ignore_eos": True, "stream": True}).encode(),
        headers={"Content-Type": "application/json", "authorization": f"Bearer {keys['drop']}"})
    r = c.getresponse()
    got = 0
    while got < 40:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: {"):
            got += 1
    c.sock.shutdown(2)
    c.close()
    full = 8 * (480 + 5)
    after = wait_tokens(port, mkey, "drop", before + got)
    s.case("a dropped SSE stream is charged what was generated before the drop",
           r.status == 200 and got == 40 and before + got <= after < before + full,
           f"status {r.status}, {got} chunks read, charged {after - before} (all: {full})")
    # KServe generate_stream over REST: the same.
    before = tenant_tokens(port, mkey, "drop")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v2/models/stories260K/generate_stream", body=json.dumps(
        {"text_input": "Once upon a time", "max_tokens": 480, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json", "authorization": f"Bearer {keys['drop']}"})
    r = c.getresponse()
    got = 0
    while got < 10:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: {"):
            got += 1
    c.sock.shutdown(2)
    c.close()
    after = wait_tokens(port, mkey, "drop", before + got)
    s.case("a dropped KServe generate_stream is charged what was generated",
           r.status == 200 and got == 10 and after >= before + got,
           f"status {r.status}, {got} events read, charged {after - before}")
    if gport is None:
        s.skip("a cancelled gRPC ModelStreamInfer is charged", "node or @grpc/grpc-js missing")
        return
    before = tenant_tokens(port, mkey, "drop")
    res = grpc_client(gport, [{"method": "ModelStreamInfer", "metadata": {"authorization": f"Bearer {keys['drop']}"},
                               "requests": [llm_grpc_req("Once upon a time", 500)],
                               "cancel_after_responses": 5}])
    n = len(res[0].get("responses", []))
    after = wait_tokens(port, mkey, "drop", before + n)
    s.case("a cancelled gRPC ModelStreamInfer is charged what was generated",
           n >= 5 and after >= before + n, f"{n} responses, charged {after - before} {res[0].get('details')}")


def test_reserve(srv, keys):
    port, mkey = srv.port, keys["ops"]
    st, h, b = keyed_request(port, "POST", "/v1/completions",
                   {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 400, "n": 16,
                    "ignore_eos": True}, key=keys["small"])
    msg = json.dumps(b)
    s.case("n=16, max_tokens=400 against 200 tokens/minute: 429 before any work",
           st == 429 and isinstance(b, dict) and "error" in b and "lower max_tokens or n" in msg and
           h.get("retry-after", "").isdigit(), f"{st} {msg[:300]}")
    s.case("... and nothing is charged", tenant_tokens(port, mkey, "small") == 0,
           str(tenant_tokens(port, mkey, "small")))
    st, h, b = keyed_request(port, "POST", "/v2/models/stories260K/generate",
                   {"text_input": "Once upon a time", "max_tokens": 400}, key=keys["small"])
    s.case("... KServe generate too (429 with a JSON error)",
           st == 429 and isinstance(b, dict) and "tokens" in b.get("error", ""), f"{st} {b}")
    st, _, b = keyed_request(port, "POST", "/v1/completions",
                   {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 20}, key=keys["small"])
    s.case("... a request that fits is served", st == 200, f"{st} {b}")

    # 30 requests at once, each reserving 5 + 200 tokens, against 1000 a minute.
    results = []
    lock = threading.Lock()
    go = threading.Event()

    def one():
        go.wait(10)
        st, _, b = keyed_request(port, "POST", "/v1/completions",
                       {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 200,
                        "ignore_eos": True}, key=keys["conc"])
        with lock:
            results.append((st, b))

    ts = [threading.Thread(target=one) for _ in range(30)]
    for t in ts:
        t.start()
    go.set()
    for t in ts:
        t.join(120)
    codes = [st for st, _ in results]
    served = sum(b["usage"]["total_tokens"] for st, b in results if st == 200)
    charged = wait_tokens(port, mkey, "conc", 1)
    s.case("30 concurrent requests: the tenant's minute overshoots by at most one reservation",
           len(results) == 30 and codes.count(200) >= 1 and served <= 1000 + 205 and
           charged <= 1000 + 205 and all(c in (200, 429) for c in codes),
           f"{codes.count(200)} served, {codes.count(429)} refused, {served} tokens served, {charged} charged")


# ------------------------------------------------------------------ tiers


def test_tiers(srv, gport, keys):
    # ident_prio: level 1 (the top) times out after 1 ms in the queue (REJECT: 429), level 2
    # (the default) waits the 0.2 s batching delay and runs: the answer tells the level used.
    body = dict(ONE_ROW, parameters={"priority": 1})
    st_b, _, b_b = keyed_request(srv.port, "POST", "/v2/models/ident_prio/infer", body, key=keys["batchy"])
    st_p, _, b_p = keyed_request(srv.port, "POST", "/v2/models/ident_prio/infer", body, key=keys["prem"])
    s.case("tensor model: a premium tenant's priority 1 reaches the top level (its 1 ms timeout: 429)",
           st_p == 429, f"{st_p} {b_p}")
    s.case("tensor model: a batch tenant asking priority 1 stays in the lowest level (200)",
           st_b == 200, f"{st_b} {b_b}")
    st, _, b = keyed_request(srv.port, "POST", "/v2/models/ident_prio/infer", body, key=keys["std"])
    s.case("tensor model: a standard tenant cannot ask above the default level (200)", st == 200, f"{st} {b}")
    # LLMs: a batch tenant asking "premium" (OpenAI) or priority 1 (KServe) runs in the batch tier.
    for path, body in (("/v1/completions", {"model": "stories260K", "prompt": "Once", "max_tokens": 480,
                                            "n": 8, "ignore_eos": True, "priority": "premium"}),
                       ("/v2/models/stories260K/generate", {"text_input": "Once", "max_tokens": 480,
                                                            "ignore_eos": True, "parameters": {"priority": 1}})):
        done = []
        t = threading.Thread(target=lambda: done.append(keyed_request(srv.port, "POST", path, body, key=keys["batchy"])[0]))
        t.start()
        seen = {"batch": 0.0, "premium": 0.0}
        for _ in range(40):
            for tier in seen:
                seen[tier] = max(seen[tier], metric(srv.port, keys["ops"], "sampan_requests_running",
                                                    '{model="stories260K",version="1",tier="%s"}' % tier))
            if seen["batch"] or done:
                break
            time.sleep(0.01)
        t.join(60)
        s.case(f"LLM {path}: a batch tenant asking for the top priority runs in the batch tier",
               seen["batch"] >= 1 and seen["premium"] == 0 and done == [200], f"{seen} {done}")
    if gport is None:
        s.skip("tensor model over gRPC: the tier caps the level", "node or @grpc/grpc-js missing")
        return
    res = grpc_client(gport, [
        {"method": "ModelInfer", "request": ident_grpc_req("ident_prio", 1),
         "metadata": {"authorization": f"Bearer {keys['batchy']}"}},
        {"method": "ModelInfer", "request": ident_grpc_req("ident_prio", 1),
         "metadata": {"authorization": f"Bearer {keys['prem']}"}}])
    s.case("tensor model over gRPC ModelInfer: batch tenant capped (OK), premium not (RESOURCE_EXHAUSTED)",
           res[0].get("code") == 0 and res[1].get("code") == 8,
           f"{res[0].get('code')} {res[0].get('details')} / {res[1].get('code')} {res[1].get('details')}")


# ------------------------------------------------------------------ model lists


def test_model_lists(srv, gport, keys):
    port, k, free = srv.port, keys["acme"], keys["std"]
    st, _, b = keyed_request(port, "GET", "/v1/models", key=k)
    ids = sorted(x["id"] for x in b.get("data", [])) if st == 200 else []
    s.case("/v1/models lists only the tenant's models", ids == ["stories260K"], str(ids))
    st, _, b = keyed_request(port, "GET", "/v1/models", key=free)
    ids = sorted(x["id"] for x in b.get("data", [])) if st == 200 else []
    s.case("... a tenant without a list sees every model", "other" in ids and "stories260K" in ids, str(ids))
    paths = ["/v1/models/other", "/v2/models/other", "/v2/models/other/ready", "/v2/models/other/versions/1",
             "/v2/models/other/versions/1/ready", "/v2/models/ident_prio", "/v2/models/nosuch"]
    codes = {p: keyed_request(port, "GET", p, key=k)[0] for p in paths}
    s.case("metadata and readiness of a model outside the list: 404, as for an unknown model",
           all(c == 404 for c in codes.values()), str(codes))
    codes = {p: keyed_request(port, "GET", p, key=k)[0] for p in ("/v1/models/stories260K", "/v2/models/stories260K",
                                                         "/v2/models/stories260K/ready")}
    s.case("... its own models still answer 200", all(c == 200 for c in codes.values()), str(codes))
    codes = {p: keyed_request(port, "GET", p, key=free)[0] for p in paths[:5]}
    s.case("... and other tenants still see the model", all(c == 200 for c in codes.values()), str(codes))
    if gport is None:
        s.skip("gRPC ModelMetadata and ModelReady follow the list", "node or @grpc/grpc-js missing")
        return
    md = {"authorization": f"Bearer {k}"}
    res = grpc_client(gport, [
        {"method": "ModelMetadata", "request": {"name": "other"}, "metadata": md},
        {"method": "ModelReady", "request": {"name": "other"}, "metadata": md},
        {"method": "ModelMetadata", "request": {"name": "stories260K"}, "metadata": md},
        {"method": "ModelReady", "request": {"name": "nosuch"}, "metadata": md}])
    s.case("gRPC ModelMetadata and ModelReady of a model outside the list: as for an unknown model",
           res[0].get("code") == 5 and res[1].get("code") == res[3].get("code") and
           not (res[1].get("response") or {}).get("ready") and res[2].get("code") == 0,
           str([(x.get("code"), x.get("details"), x.get("response", {}).get("ready")) for x in res]))


# ------------------------------------------------------------------ prefix cache


def prefix_counts(port, mkey):
    labels = '{model="stories260K",version="1"}'
    return (metric(port, mkey, "sampan_prefix_cache_queries_total", labels),
            metric(port, mkey, "sampan_prefix_cache_hits_total", labels))


def prefix_after(port, mkey, queries_before):
    """(queries, hits) once the scheduler's figures include the last request's lookups (they are
    copied after each engine step, which can be after the answer went out)."""
    end = time.time() + 3
    q, h = prefix_counts(port, mkey)
    while q <= queries_before and time.time() < end:
        time.sleep(0.02)
        q, h = prefix_counts(port, mkey)
    return q, h


def prefix_case(port, keys, a, b):
    """Hits gained by tenant b on a's prompt, then by a on its own again."""
    prompt = LONG_PROMPT + f" ({a} {b} {time.time()})"  # fresh: nothing cached from before
    body = {"model": "stories260K", "prompt": prompt, "max_tokens": 1}
    mkey = keys["ops"]
    q, _ = prefix_counts(port, mkey)
    st0, _, _ = keyed_request(port, "POST", "/v1/completions", body, key=keys[a])
    q, h0 = prefix_after(port, mkey, q)
    st1, _, _ = keyed_request(port, "POST", "/v1/completions", body, key=keys[b])
    q, h1 = prefix_after(port, mkey, q)
    st2, _, _ = keyed_request(port, "POST", "/v1/completions", body, key=keys[a])
    q, h2 = prefix_after(port, mkey, q)
    return st0 == st1 == st2 == 200, h1 - h0, h2 - h1


def test_prefix_scope(srv, keys):
    ok, other, same = prefix_case(srv.port, keys, "std", "prem")
    s.case("prefix cache (default scope tenant): another tenant gets no hit on a tenant's prompt",
           ok and other == 0, f"hits: other tenant {other}, same tenant {same}")
    s.case("... the same tenant does", ok and same >= 2, f"hits: same tenant {same}")


# ------------------------------------------------------------------ Retry-After


def test_retry_after(tmp, path, keys):
    repo = os.path.join(tmp, "repo_ra")
    model(repo, "ident_q", dict(IDENT_IO, backend="identity", max_batch_size=8, dynamic_batching={
        "max_queue_delay_microseconds": 1000000, "preferred_batch_size": [8],
        "default_queue_policy": {"max_queue_size": 2}}))
    srv = Server("--tenants", path, "--model-repository", repo, "--parallel", "1", "--queue", "8",
                 "--grpc-port", "off")
    try:
        # LLM: one job of 8 long sequences: one runs, seven wait (--queue 8); a request of 2
        # more is refused. Nothing has finished yet, so the 9 sequences ahead of it (its own
        # included) cannot drain in 1 s.
        held = []

        def long_one():
            held.append(keyed_request(srv.port, "POST", "/v1/completions",
                            {"model": "stories260K", "prompt": "Once", "max_tokens": 480, "n": 8,
                             "ignore_eos": True}, key=keys["std"])[0])

        t = threading.Thread(target=long_one)
        t.start()
        st, h, b = None, {}, None
        end = time.time() + 10
        while time.time() < end and t.is_alive():
            waiting = metric(srv.port, keys["ops"], "sampan_requests_waiting",
                             '{model="stories260K",version="1",tier="standard"}')
            if waiting >= 6:  # 6 + 3 > --queue 8: refused
                st, h, b = keyed_request(srv.port, "POST", "/v1/completions",
                               {"model": "stories260K", "prompt": "Once", "max_tokens": 4, "n": 3},
                               key=keys["std"])
                if st == 429:
                    break
            time.sleep(0.01)
        t.join(60)
        ra = h.get("retry-after", "")
        s.case("LLM queue full: 429 with Retry-After from the drain rate (an integer, 2..60 here)",
               st == 429 and ra.isdigit() and 2 <= int(ra) <= 60, f"{st} retry-after={ra!r} {held} {b}")
        if not os.path.isfile(os.path.join(PLUGINS, "libsampan_identity.so")):
            s.skip("tensor batcher Retry-After", "backend plugins not built")
            return
        # Tensor batcher: two rows wait for a batch of 8 (1 s delay); the third is refused.
        out = []

        def row():
            out.append(keyed_request(srv.port, "POST", "/v2/models/ident_q/infer", ONE_ROW, key=keys["std"])[0])

        ts = [threading.Thread(target=row) for _ in range(2)]
        for t in ts:
            t.start()
        end = time.time() + 10
        queued = 0
        while time.time() < end and queued < 2:
            _, _, stats = keyed_request(srv.port, "GET", "/stats", key=keys["ops"])
            queued = (stats or {}).get("models", {}).get("ident_q", {}).get("batcher", {}).get("queued", 0) \
                if isinstance(stats, dict) else 0
            time.sleep(0.01)
        st, h, b = keyed_request(srv.port, "POST", "/v2/models/ident_q/infer", ONE_ROW, key=keys["std"])
        for t in ts:
            t.join(30)
        ra = h.get("retry-after", "")
        s.case("tensor batcher queue full: 429 with Retry-After from the drain rate (2..60 here)",
               st == 429 and ra.isdigit() and 2 <= int(ra) <= 60, f"{st} retry-after={ra!r} {out} {b}")
    finally:
        srv.stop()


def test_prefix_global(path, keys):
    srv = Server("--tenants", path, "--prefix-cache-scope", "global", "--grpc-port", "off")
    try:
        ok, other, same = prefix_case(srv.port, keys, "std", "prem")
        s.case("--prefix-cache-scope global: another tenant's prompt is a hit too",
               ok and other >= 2 and same >= 2, f"hits: other tenant {other}, same tenant {same}")
    finally:
        srv.stop()
    rc, _, err = run([exe, "serve", "--prefix-cache-scope", "nobody", "--port", "0"], timeout=20)
    s.case("--prefix-cache-scope with an unknown value is a usage error",
           rc == 2 and "--prefix-cache-scope" in err, err.strip()[-200:])


def main():
    tmp = tempfile.mkdtemp(prefix="sampan-isolation-")
    try:
        path = os.path.join(tmp, "tenants.json")
        keys = {
            "ops": keys_add(path, "ops", "--scopes", "metrics,admin"),
            "drop": keys_add(path, "drop", "--tpm", "100000"),
            "small": keys_add(path, "small", "--tpm", "200"),
            "conc": keys_add(path, "conc", "--tpm", "1000"),
            "batchy": keys_add(path, "batchy", "--tier", "batch"),
            "std": keys_add(path, "std", "--tier", "standard"),
            "prem": keys_add(path, "prem", "--tier", "premium"),
            "acme": keys_add(path, "acme", "--models", "stories260K"),
        }
        repo = os.path.join(tmp, "repo")
        model(repo, "other", {}, gguf=True)
        have_ident = os.path.isfile(os.path.join(PLUGINS, "libsampan_identity.so"))
        if have_ident:
            model(repo, "ident_prio", dict(IDENT_IO, backend="identity", max_batch_size=8, dynamic_batching={
                "max_queue_delay_microseconds": 200000, "priority_levels": 2, "default_priority_level": 2,
                "priority_queue_policy": {"1": {"timeout_action": "REJECT",
                                                "default_timeout_microseconds": 1000}}}))
        gport = free_port() if have_grpc_client() else None
        srv = Server("--tenants", path, "--model-repository", repo, "--parallel", "2",
                     "--grpc-port", str(gport) if gport else "off")
        try:
            s.guard("dropped streams", test_dropped_streams, srv, gport, keys)
            s.guard("reservations", test_reserve, srv, keys)
            if have_ident:
                s.guard("tiers", test_tiers, srv, gport, keys)
            else:
                s.skip("tiers on tensor models", f"backend plugins not built in {PLUGINS}")
            s.guard("model lists", test_model_lists, srv, gport, keys)
            s.guard("prefix scope", test_prefix_scope, srv, keys)
        finally:
            s.case("server exits cleanly", srv.stop() == 0)
        s.guard("prefix scope global", test_prefix_global, path, keys)
        s.guard("retry-after", test_retry_after, tmp, path, keys)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
