"""test_tensor_models.py - tensor models (backend plugins) through `sampan serve` as a black box:
the XGBoost backend reproduces the expected predictions of the agaricus and credit-card
models (JSON and UBJ files) through POST /v2/models/{m}/infer, in JSON and with Triton's
binary tensor extension; the identity backend echoes every type; metadata from the backend;
per-request errors (missing input, wrong type, wrong feature count) are 400s that do not
disturb other requests; concurrent single-row requests are merged by the dynamic batcher
(batches < requests in /stats) and each gets its own rows; OpenAI and generate routes refuse
tensor models; an unknown backend is a clear load error. Skips visibly when the plugins are
not built. Last line:
    tensor-models: N passed, N failed, N skipped"""
import csv
import http.client
import json
import math
import os
import shutil
import struct
import tempfile
import threading

from common import ROOT, Server, Suite, binary

s = Suite("tensor-models")
DATA = os.path.join(ROOT, "tests", "data", "xgboost")
PLUGINS = os.path.join(os.path.dirname(binary() or ""), "backends")


def req(srv, method, path, body=None, headers=None, raw=False):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        b = r.read()
        hdrs = dict((k.lower(), v) for k, v in r.getheaders())
        if raw:
            return r.status, hdrs, b
        try:
            return r.status, hdrs, json.loads(b) if b else None
        except ValueError:
            return r.status, hdrs, b
    finally:
        c.close()


def model(repo, name, cfg, files):
    os.makedirs(os.path.join(repo, name, "1"))
    for f in files:
        shutil.copy(os.path.join(DATA, f), os.path.join(repo, name, "1", f))
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump(dict({"name": name}, **cfg), f)


def agaricus_rows(n_features=127, limit=None):
    rows = []
    for line in open(os.path.join(DATA, "agaricus.txt.test")):
        parts = line.split()
        x = [math.nan] * n_features  # absent = missing (LibSVM), as the expected values assume
        for p in parts[1:]:
            i, v = p.split(":")
            x[int(i)] = float(v)
        rows.append(x)
        if limit and len(rows) >= limit:
            break
    return rows


def infer_json(srv, name, rows, n_features):
    flat = [v for r in rows for v in r]
    body = {"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [len(rows), n_features],
                        "data": flat}]}
    return req(srv, "POST", f"/v2/models/{name}/infer", body)


def infer_binary(srv, name, rows, n_features):
    """JSON has no NaN: missing values travel in the binary tensor extension."""
    n = len(rows)
    head = json.dumps({"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [n, n_features],
                                   "parameters": {"binary_data_size": n * n_features * 4}}]}).encode()
    tail = struct.pack(f"<{n * n_features}f", *[v for r in rows for v in r])
    return req(srv, "POST", f"/v2/models/{name}/infer", head + tail,
               {"Inference-Header-Content-Length": str(len(head)),
                "Content-Type": "application/octet-stream"})


def close(a, b, tol=1e-6):
    return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b)) and len(a) == len(b)


def test_xgboost(srv):
    exp = [float(l) for l in open(os.path.join(DATA, "agaricus-depth2-2trees.test-pred.txt"))]
    rows = agaricus_rows()
    got = []
    ok = True
    for i in range(0, len(rows), 64):  # batches of at most max_batch_size rows
        st, _, b = infer_binary(srv, "agaricus", rows[i:i + 64], 127)
        ok &= st == 200
        got += b["outputs"][0]["data"] if st == 200 else []
    s.case("agaricus (JSON model): all 1611 expected predictions through /infer", ok and
           close(got, exp), f"{len(got)} got, first {got[:3]} vs {exp[:3]}")
    st, _, b = infer_binary(srv, "agaricus_ubj", rows[:64], 127)
    s.case("agaricus (UBJ model): the same predictions", st == 200 and
           close(b["outputs"][0]["data"], exp[:64]), str(b)[:200])
    exp20 = [float(l) for l in open(os.path.join(DATA, "agaricus-depth4-20trees.test-pred.txt"))]
    st, _, b = infer_binary(srv, "agaricus20", rows[:64], 127)
    s.case("agaricus 20 trees: expected predictions", st == 200 and
           close(b["outputs"][0]["data"], exp20[:64]), str(b)[:200])

    data = list(csv.reader(open(os.path.join(DATA, "creditcard-test.csv"))))[1:]
    pred = list(csv.reader(open(os.path.join(DATA, "creditcard-depth3-50trees.test-pred.csv"))))[1:]
    feats = [[float(v) for v in r[1:31]] for r in data]
    exp_cc = [float(p[2]) for p in pred]
    got = []
    for i in range(0, len(feats), 64):
        st, _, b = infer_json(srv, "fraud", feats[i:i + 64], 30)
        got += b["outputs"][0]["data"] if st == 200 else []
    s.case("credit card: all 344 expected predictions", close(got, exp_cc), f"{got[:3]} {exp_cc[:3]}")

    # Binary tensor extension: FP32 rows in the binary tail, output asked as binary too.
    n = 8
    head = json.dumps({"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [n, 30],
                                   "parameters": {"binary_data_size": n * 30 * 4}}],
                       "outputs": [{"name": "output__0", "parameters": {"binary_data": True}}]}
                      ).encode()
    tail = struct.pack(f"<{n * 30}f", *[v for r in feats[:n] for v in r])
    st, h, b = req(srv, "POST", "/v2/models/fraud/infer", head + tail,
                   {"Inference-Header-Content-Length": str(len(head)),
                    "Content-Type": "application/octet-stream"}, raw=True)
    hl = int(h.get("inference-header-content-length", "0"))
    vals = struct.unpack(f"<{n}f", b[hl:hl + 4 * n]) if st == 200 and len(b) >= hl + 4 * n else []
    s.case("binary tensors in and out", st == 200 and close(list(vals), exp_cc[:n], 1e-6),
           f"{st} {b[:200]!r}")

    st, _, b = req(srv, "GET", "/v2/models/fraud")
    s.case("metadata: FP32 [-1, 30] in, FP32 [-1] out, platform xgboost",
           st == 200 and b["platform"] == "xgboost" and
           b["inputs"][0]["shape"] == [-1, 30] and b["outputs"][0]["datatype"] == "FP32", str(b))
    st, _, b = infer_json(srv, "fraud", [[1.0] * 29], 29)
    s.case("wrong feature count: 400 naming the input", st == 400 and "input__0" in json.dumps(b),
           str(b))
    st, _, b = req(srv, "POST", "/v2/models/fraud/infer",
                   {"inputs": [{"name": "input__0", "datatype": "INT32", "shape": [1, 30],
                                "data": [1] * 30}]})
    s.case("wrong datatype: 400", st == 400 and "FP32" in json.dumps(b), str(b))
    st, _, b = req(srv, "POST", "/v2/models/fraud/infer",
                   {"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 30],
                                "data": [1] * 30}]})
    s.case("unknown input: 400", st == 400, str(b))
    st, _, b = req(srv, "POST", "/v2/models/fraud/infer",
                   {"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [65, 30],
                                "data": [0.5] * (65 * 30)}]})
    s.case("more rows than max_batch_size: 400", st == 400, str(b))

    # Concurrent single rows: merged into fewer batches, each answer its own row.
    st, _, before = req(srv, "GET", "/stats")
    b0 = before["models"]["fraud"]["steps"]
    results = [None] * 64

    def one(i):
        st, _, b = infer_json(srv, "fraud", [feats[i]], 30)
        results[i] = b["outputs"][0]["data"][0] if st == 200 else None

    ts = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    _, _, after = req(srv, "GET", "/stats")
    batches = after["models"]["fraud"]["steps"] - b0
    s.case("64 concurrent single-row requests: each gets its own prediction",
           close(results, exp_cc[:64]) if None not in results else False, str(results[:4]))
    s.case("... merged by the dynamic batcher (fewer batches than requests)",
           0 < batches < 64, f"{batches} batches")

    st, _, b = req(srv, "POST", "/v1/completions", {"model": "fraud", "prompt": "x"})
    s.case("the OpenAI routes refuse a tensor model", st == 400 and "infer" in json.dumps(b))
    st, _, b = req(srv, "POST", "/v2/models/fraud/generate", {"text_input": "x"})
    s.case("generate refuses a tensor model", st == 400)


def test_identity(srv):
    body = {"inputs": [
        {"name": "f", "datatype": "FP32", "shape": [2, 3], "data": [1.5, -2, 3, 4, 5, 6.25]},
        {"name": "i", "datatype": "INT64", "shape": [2, 1], "data": [9007199254740991, -7]},
        {"name": "s", "datatype": "BYTES", "shape": [2, 1], "data": ["héllo", ""]}]}
    st, _, b = req(srv, "POST", "/v2/models/ident/infer", body)
    outs = {o["name"]: o for o in b.get("outputs", [])} if st == 200 else {}
    s.case("identity: FP32, INT64 and BYTES come back unchanged",
           outs.get("f_out", {}).get("data") == [1.5, -2, 3, 4, 5, 6.25] and
           outs.get("i_out", {}).get("data") == [9007199254740991, -7] and
           outs.get("s_out", {}).get("data") == ["héllo", ""], str(b)[:300])
    st, _, b = req(srv, "POST", "/v2/models/ident/infer",
                   {"inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]})
    s.case("identity: a missing input is 400 naming it", st == 400 and "'i'" in json.dumps(b), str(b))
    # Queue policy: a lone request waits for the 0.5 s batching delay, but its queue
    # timeout (1 ms, REJECT) ends it first: 429, and it never ran.
    one = {"inputs": [{"name": "f", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
                      {"name": "i", "datatype": "INT64", "shape": [1, 1], "data": [1]},
                      {"name": "s", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]}
    st, _, b = req(srv, "POST", "/v2/models/ident_timeout/infer", one)
    s.case("default_queue_policy: a request past its queue timeout is rejected (429)",
           st == 429 and "timeout" in json.dumps(b).lower(), f"{st} {b}")
    st, _, b = req(srv, "POST", "/v2/models/ident_timeout/infer",
                   dict(one, parameters={"timeout": 0, "priority": 1}))
    s.case("... priority levels accepted in the request", st in (200, 429), f"{st} {b}")


def main():
    if not os.path.isfile(os.path.join(PLUGINS, "libsampan_identity.so")):
        s.skip("tensor models", f"backend plugins not built in {PLUGINS}")
        s.finish()
        return
    tmp = tempfile.mkdtemp(prefix="sampan-tensor-")
    repo = os.path.join(tmp, "repo")
    try:
        batching = {"max_batch_size": 64, "dynamic_batching": {"max_queue_delay_microseconds": 2000}}
        have_xgb = os.path.isfile(os.path.join(PLUGINS, "libsampan_xgboost.so"))
        if have_xgb:
            model(repo, "agaricus", dict(batching, backend="xgboost"), ["agaricus-depth2-2trees.json"])
            model(repo, "agaricus_ubj", dict(batching, backend="xgboost"), ["agaricus-depth2-2trees.ubj"])
            model(repo, "agaricus20", dict(batching, backend="xgboost"), ["agaricus-depth4-20trees.json"])
            model(repo, "fraud", dict(batching, backend="xgboost"), ["creditcard-depth3-50trees.json"])
        model(repo, "ident", {"backend": "identity", "max_batch_size": 8,
                              "input": [{"name": "f", "data_type": "TYPE_FP32", "dims": [3]},
                                        {"name": "i", "data_type": "TYPE_INT64", "dims": [1]},
                                        {"name": "s", "data_type": "TYPE_STRING", "dims": [1]}],
                              "output": [{"name": "f_out", "data_type": "TYPE_FP32", "dims": [3]},
                                         {"name": "i_out", "data_type": "TYPE_INT64", "dims": [1]},
                                         {"name": "s_out", "data_type": "TYPE_STRING", "dims": [1]}]},
              [])
        ident_io = {"input": [{"name": "f", "data_type": "TYPE_FP32", "dims": [3]},
                              {"name": "i", "data_type": "TYPE_INT64", "dims": [1]},
                              {"name": "s", "data_type": "TYPE_STRING", "dims": [1]}],
                    "output": [{"name": "f_out", "data_type": "TYPE_FP32", "dims": [3]},
                               {"name": "i_out", "data_type": "TYPE_INT64", "dims": [1]},
                               {"name": "s_out", "data_type": "TYPE_STRING", "dims": [1]}]}
        model(repo, "ident_timeout", dict(ident_io, backend="identity", max_batch_size=8,
                                          dynamic_batching={
                                              "max_queue_delay_microseconds": 500000,
                                              "priority_levels": 2, "default_priority_level": 2,
                                              "default_queue_policy": {
                                                  "timeout_action": "REJECT",
                                                  "default_timeout_microseconds": 1000,
                                                  "allow_timeout_override": True,
                                                  "max_queue_size": 4}}), [])
        model(repo, "ghost", {"backend": "nosuchbackend"}, [])
        srv = Server("--model-repository", repo, model=None)
        try:
            st, _, ix = req(srv, "POST", "/v2/repository/index")
            ix = {e["name"]: e for e in ix} if st == 200 else {}
            s.case("an unknown backend is a clear load error",
                   ix.get("ghost", {}).get("state") == "UNAVAILABLE" and
                   "libsampan_nosuchbackend.so" in ix.get("ghost", {}).get("reason", ""),
                   str(ix.get("ghost")))
            if have_xgb:
                s.guard("xgboost", test_xgboost, srv)
            else:
                s.skip("xgboost", "libsampan_xgboost.so not built (libxgboost-dev missing)")
            s.guard("identity", test_identity, srv)
        finally:
            s.case("server exits cleanly", srv.stop() == 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
