"""test_response_cache.py - the response cache (--response-cache-bytes, config.json
response_cache.enable) as a black box on 127.0.0.1 (free port): a temporary repository
with identity-backend models and the demo LLM, each with and without the cache.

A hit returns the first answer's bytes (id and created included) and skips compute: the
hit counter in /metrics goes up while the batcher's batches (/stats steps) or the LLM's
tokens_generated do not. Different inputs miss; sampled requests without a seed, streams
and models without response_cache are never cached; a seeded request is; the byte bound
evicts least recently used answers and refuses answers over 1/8 of it. Last line:
    response-cache: N passed, N failed, N skipped"""
import http.client
import json
import os
import re
import shutil
import struct
import tempfile

from common import ROOT, Server, Suite, binary

s = Suite("response-cache")
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")
CACHE_BYTES = 1 << 20


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def make_repo(tmp):
    repo = os.path.join(tmp, "repo")

    def identity(name, dims, cached):
        os.makedirs(os.path.join(repo, name, "1"))
        cfg = {"backend": "identity", "max_batch_size": 8,
               "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": dims}],
               "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": dims}]}
        if cached:
            cfg["response_cache"] = {"enable": True}
        write_json(os.path.join(repo, name, "config.json"), cfg)

    def llm(name, cached):
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(DEMO, os.path.join(repo, name, "1", "model.gguf"))
        cfg = {"backend": "llm"}
        if cached:
            cfg["response_cache"] = {"enable": True}
        write_json(os.path.join(repo, name, "config.json"), cfg)

    identity("ident", [4], True)
    identity("ident_nc", [4], False)
    identity("big", [-1], True)
    llm("stories", True)
    llm("stories_nc", False)
    return repo


class RepoServer(Server):
    def __init__(self, repo, *extra):
        super().__init__("--model-repository", repo, *extra, model=None, start_timeout=30)

    def req(self, method, path, body=None, headers=None, timeout=20):
        """(status, headers dict with lower-case names, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def metric(self, name, **labels):
        _, _, b = self.req("GET", "/metrics")
        total = None
        for line in b.decode().split("\n"):
            m = re.match(r"^([a-z_:]+)(?:\{(.*)\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total = (total or 0) + float(m.group(3))
        return total

    def hits(self, model):
        return self.metric("sampan_response_cache_hits_total", model=model, version="1")

    def misses(self, model):
        return self.metric("sampan_response_cache_misses_total", model=model, version="1")

    def stat(self, model, key):
        _, _, b = self.req("GET", "/stats")
        return json.loads(b)["models"][model][key]


def infer_body(values, shape=None, binary_out=False, rid=None):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape or [1, len(values)],
                        "data": values}]}
    if binary_out:
        body["parameters"] = {"binary_data_output": True}
    if rid is not None:
        body["id"] = rid
    return body


def binary_infer(srv, model, values, shape=None, binary_out=False):
    """The same request with the input as binary tensor data."""
    raw = struct.pack(f"<{len(values)}f", *values)
    head = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape or [1, len(values)],
                        "parameters": {"binary_data_size": len(raw)}}]}
    if binary_out:
        head["parameters"] = {"binary_data_output": True}
    hj = json.dumps(head).encode()
    return srv.req("POST", f"/v2/models/{model}/infer", hj + raw,
                   {"Inference-Header-Content-Length": str(len(hj)),
                    "Content-Type": "application/octet-stream"})


def test_tensor(srv):
    path = "/v2/models/ident/infer"
    b0 = srv.stat("ident", "steps")
    st1, h1, r1 = srv.req("POST", path, infer_body([1, 2, 3, 4]))
    st2, h2, r2 = srv.req("POST", path, infer_body([1, 2, 3, 4]))
    s.case("tensor: both 200", st1 == 200 and st2 == 200, f"{st1} {st2} {r1[:200]}")
    s.case("tensor: the second body is the first's, byte for byte", r1 == r2, f"{r1!r} {r2!r}")
    out = json.loads(r1)["outputs"][0] if st1 == 200 else {}
    s.case("tensor: the answer is right (identity)", out.get("data") == [1, 2, 3, 4], str(out))
    s.case("tensor: one miss, then one hit", srv.misses("ident") == 1 and srv.hits("ident") == 1,
           f"misses {srv.misses('ident')} hits {srv.hits('ident')}")
    s.case("tensor: the hit skipped the batcher (one batch for two requests)",
           srv.stat("ident", "steps") == b0 + 1, f"{b0} -> {srv.stat('ident', 'steps')}")
    s.case("tensor: the hit counts as a success",
           srv.metric("sampan_request_success_total", model="ident") == 2)
    s.case("tensor: the access log marks the hit", srv.wait_log(r"cache=hit") is not None)

    # The same tensor sent as binary data: the same key, so a hit with the same bytes.
    st3, _, r3 = binary_infer(srv, "ident", [1, 2, 3, 4])
    s.case("tensor: binary input of the same tensor is a hit with the same body",
           st3 == 200 and r3 == r1 and srv.hits("ident") == 2, f"{st3} {r3[:120]!r}")

    # A different input misses and computes.
    st4, _, r4 = srv.req("POST", path, infer_body([1, 2, 3, 5]))
    s.case("tensor: a different input misses and computes",
           st4 == 200 and json.loads(r4)["outputs"][0]["data"] == [1, 2, 3, 5] and
           srv.misses("ident") == 2 and srv.stat("ident", "steps") == b0 + 2,
           f"misses {srv.misses('ident')} steps {srv.stat('ident', 'steps')}")

    # Another id: another answer (the id is echoed), so a miss.
    st5, _, r5 = srv.req("POST", path, infer_body([1, 2, 3, 4], rid="req-7"))
    s.case("tensor: another request id misses (the answer echoes the id)",
           st5 == 200 and json.loads(r5).get("id") == "req-7" and srv.misses("ident") == 3,
           f"{r5[:120]!r}")

    # Binary output: body and Inference-Header-Content-Length replayed.
    st6, h6, r6 = srv.req("POST", path, infer_body([9, 8, 7, 6], binary_out=True))
    st7, h7, r7 = srv.req("POST", path, infer_body([9, 8, 7, 6], binary_out=True))
    s.case("tensor: binary output replayed with its header",
           st6 == st7 == 200 and r6 == r7 and
           h6.get("inference-header-content-length") == h7.get("inference-header-content-length")
           is not None and h7.get("content-type") == "application/octet-stream" and
           srv.hits("ident") == 3, f"{h6} {h7}")
    hl = int(h7.get("inference-header-content-length", "0"))
    s.case("tensor: the replayed binary tail holds the values",
           struct.unpack("<4f", r7[hl:hl + 16]) == (9, 8, 7, 6) if len(r7) >= hl + 16 else False)

    # Invalid requests are answered as before (and never looked up).
    st8, _, r8 = srv.req("POST", path, infer_body([1, 2, 3]))
    s.case("tensor: an invalid request is still a 400", st8 == 400, f"{st8} {r8[:160]!r}")

    # A model without response_cache: never cached.
    n0 = srv.stat("ident_nc", "steps")
    a = srv.req("POST", "/v2/models/ident_nc/infer", infer_body([1, 2, 3, 4]))
    b = srv.req("POST", "/v2/models/ident_nc/infer", infer_body([1, 2, 3, 4]))
    s.case("tensor: a model without response_cache computes every time",
           a[0] == b[0] == 200 and srv.stat("ident_nc", "steps") == n0 + 2 and
           srv.hits("ident_nc") == 0 and srv.misses("ident_nc") == 0,
           f"steps {n0} -> {srv.stat('ident_nc', 'steps')}")


def completion(srv, model="stories", **kw):
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 12}
    body.update(kw)
    return srv.req("POST", "/v1/completions", body)


def test_llm(srv):
    t0 = srv.stat("stories", "tokens_generated")
    st1, _, r1 = completion(srv, temperature=0)
    t1 = srv.stat("stories", "tokens_generated")
    st2, _, r2 = completion(srv, temperature=0)
    t2 = srv.stat("stories", "tokens_generated")
    s.case("llm greedy: both 200, generated once", st1 == st2 == 200 and t1 > t0, f"{t0} {t1}")
    s.case("llm greedy: the second body is the first's (id and created too)", r1 == r2,
           f"{r1[:160]!r} {r2[:160]!r}")
    s.case("llm greedy: hit counter 1, no tokens generated for it",
           srv.hits("stories") == 1 and t2 == t1, f"hits {srv.hits('stories')} tokens {t1} -> {t2}")
    # Key order and the fields that do not change the answer do not matter.
    st3, _, r3 = srv.req("POST", "/v1/completions",
                         {"max_tokens": 12, "temperature": 0, "user": "someone",
                          "prompt": "Once upon a time", "model": "stories", "stream": False})
    s.case("llm greedy: reordered keys, user and stream:false hit too",
           st3 == 200 and r3 == r1 and srv.hits("stories") == 2, f"hits {srv.hits('stories')}")

    # Sampled without a seed: never looked up, never stored.
    h0, m0 = srv.hits("stories"), srv.misses("stories")
    t0 = srv.stat("stories", "tokens_generated")
    completion(srv, temperature=1)
    completion(srv, temperature=1)
    s.case("llm temperature 1 without seed: never cached",
           srv.hits("stories") == h0 and srv.misses("stories") == m0 and
           srv.stat("stories", "tokens_generated") > t0)

    # Sampled with a seed: deterministic, so cached.
    st4, _, r4 = completion(srv, temperature=1, seed=1234)
    t4 = srv.stat("stories", "tokens_generated")
    st5, _, r5 = completion(srv, temperature=1, seed=1234)
    s.case("llm temperature 1 with a seed: the second is a hit",
           st4 == st5 == 200 and r4 == r5 and srv.hits("stories") == h0 + 1 and
           srv.stat("stories", "tokens_generated") == t4)

    # Streaming: never answered from the cache (the greedy answer above is stored).
    h0 = srv.hits("stories")
    t0 = srv.stat("stories", "tokens_generated")
    st6, h6, r6 = completion(srv, temperature=0, stream=True)
    s.case("llm stream: streamed, not a hit",
           st6 == 200 and h6.get("content-type", "").startswith("text/event-stream") and
           b"data: [DONE]" in r6 and srv.hits("stories") == h0 and
           srv.stat("stories", "tokens_generated") > t0, f"{h6.get('content-type')}")

    # Chat and KServe generate.
    chat = {"model": "stories", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": 8, "temperature": 0}
    a = srv.req("POST", "/v1/chat/completions", chat)
    tc = srv.stat("stories", "tokens_generated")
    b = srv.req("POST", "/v1/chat/completions", chat)
    s.case("llm chat greedy: identical bodies, no tokens for the second",
           a[0] == b[0] == 200 and a[2] == b[2] and srv.stat("stories", "tokens_generated") == tc,
           f"{a[2][:120]!r}")
    gen = {"text_input": "Once upon a time", "max_tokens": 8, "temperature": 0}
    a = srv.req("POST", "/v2/models/stories/generate", gen)
    tg = srv.stat("stories", "tokens_generated")
    hg = srv.hits("stories")
    b = srv.req("POST", "/v2/models/stories/generate", gen)
    s.case("llm generate greedy: identical bodies, a hit, no tokens",
           a[0] == b[0] == 200 and a[2] == b[2] and srv.hits("stories") == hg + 1 and
           srv.stat("stories", "tokens_generated") == tg, f"{a[2][:120]!r}")
    a = srv.req("POST", "/v2/models/stories/generate_stream", gen)
    s.case("llm generate_stream: never a hit", a[0] == 200 and srv.hits("stories") == hg + 1)

    # A model without response_cache: never cached.
    t0 = srv.stat("stories_nc", "tokens_generated")
    a = completion(srv, "stories_nc", temperature=0)
    t1 = srv.stat("stories_nc", "tokens_generated")
    b = completion(srv, "stories_nc", temperature=0)
    s.case("llm: a model without response_cache generates every time",
           a[0] == b[0] == 200 and srv.stat("stories_nc", "tokens_generated") > t1 > t0 and
           srv.hits("stories_nc") == 0 and srv.misses("stories_nc") == 0)


def test_eviction(srv):
    # Answers of ~96 KiB (a 48 KiB input in the key, a 48 KiB binary output): ten fit in 1 MiB.
    n = 12000
    path = "/v2/models/big/infer"

    def send(i):
        vals = [float(i)] * n
        return binary_infer(srv, "big", vals, shape=[1, n], binary_out=True)

    ev0 = srv.metric("sampan_response_cache_evictions_total")
    first = send(0)
    for i in range(1, 16):
        send(i)
    ent = srv.metric("sampan_response_cache_entries")
    byt = srv.metric("sampan_response_cache_bytes")
    cap = srv.metric("sampan_response_cache_capacity_bytes")
    ev = srv.metric("sampan_response_cache_evictions_total")
    s.case("eviction: the byte bound holds", cap == CACHE_BYTES and 0 < byt <= CACHE_BYTES,
           f"bytes {byt} cap {cap}")
    s.case("eviction: older answers were evicted", ev > ev0 and ent < 16 + 10, f"ev {ev} entries {ent}")
    h0, m0 = srv.hits("big"), srv.misses("big")
    again = send(15)
    s.case("eviction: the newest answer is still there", again[2] and srv.hits("big") == h0 + 1)
    old = send(0)

    def tail(r):  # the binary output (the JSON part has this run's queue and compute times)
        return r[2][int(r[1].get("inference-header-content-length", "0")):]
    s.case("eviction: the oldest is gone (a miss, recomputed, the same values)",
           srv.misses("big") == m0 + 1 and old[0] == 200 and tail(old) == tail(first) and
           len(tail(old)) == 4 * n, f"misses {srv.misses('big')} (was {m0})")
    # An answer over 1/8 of the cache is not stored: asked twice, two misses.
    m0 = srv.misses("big")
    huge = [1.0] * 40000
    a = binary_infer(srv, "big", huge, shape=[1, 40000], binary_out=True)
    b = binary_infer(srv, "big", huge, shape=[1, 40000], binary_out=True)
    s.case("eviction: an answer over 1/8 of the bound is never stored",
           a[0] == b[0] == 200 and srv.misses("big") == m0 + 2, f"{a[0]} {b[0]}")
    _, _, mt = srv.req("GET", "/metrics")
    s.case("metrics: the cache families are exported",
           all(n.encode() in mt for n in ("sampan_response_cache_hits_total",
                                          "sampan_response_cache_misses_total",
                                          "sampan_response_cache_bytes",
                                          "sampan_response_cache_entries",
                                          "sampan_response_cache_evictions_total")))


def test_off_and_flags(repo):
    # Without --response-cache-bytes, response_cache.enable changes nothing.
    srv = RepoServer(repo)
    try:
        a = srv.req("POST", "/v2/models/ident/infer", infer_body([1, 2, 3, 4]))
        b = srv.req("POST", "/v2/models/ident/infer", infer_body([1, 2, 3, 4]))
        s.case("off: no cache without --response-cache-bytes",
               a[0] == b[0] == 200 and srv.hits("ident") == 0 and srv.misses("ident") == 0 and
               srv.metric("sampan_response_cache_capacity_bytes") == 0)
    finally:
        s.case("off: clean exit", srv.stop() == 0)
    # --model models are cached whenever the server has a cache.
    srv = Server("--response-cache-bytes", str(CACHE_BYTES))
    try:
        body = {"model": "stories260K", "prompt": "Once", "max_tokens": 6, "temperature": 0}
        a = srv_req(srv, "/v1/completions", body)
        b = srv_req(srv, "/v1/completions", body)
        _, _, mt = srv_req(srv, "/metrics", None, "GET")
        m = re.search(rb'sampan_response_cache_hits_total\{model="stories260K",version="1"\} (\d+)', mt)
        s.case("--model models are cached when the size is set",
               a[0] == b[0] == 200 and a[2] == b[2] and m and m.group(1) == b"1")
    finally:
        s.case("--model: clean exit", srv.stop() == 0)


def srv_req(srv, path, body, method="POST"):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def main():
    if binary() is None:
        s.skip("response cache", "sampan is not built")
        s.finish()
    bdir = os.path.join(os.path.dirname(binary()), "backends", "libsampan_identity.so")
    if not os.path.exists(bdir):
        s.skip("response cache", "the identity backend is not built")
        s.finish()
    tmp = tempfile.mkdtemp(prefix="sampan-rcache-")
    try:
        repo = make_repo(tmp)
        srv = RepoServer(repo, "--response-cache-bytes", str(CACHE_BYTES))
        try:
            s.guard("tensor", test_tensor, srv)
            s.guard("llm", test_llm, srv)
            s.guard("eviction", test_eviction, srv)
        finally:
            s.case("server exits cleanly", srv.stop() == 0)
        s.guard("off", test_off_and_flags, repo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


if __name__ == "__main__":
    main()
