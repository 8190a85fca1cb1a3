"""test_onnx_serving.py - an ONNX model through the server's serving features that tensor models
have (issue 22: "served through KServe v2 REST (JSON and binary tensors) and gRPC with the
dynamic batcher, response cache, metrics and tenants"), as a black box on 127.0.0.1 (free ports).

One small MLP (x [batch, 20] -> MatMul+Add -> Relu -> MatMul -> Softmax -> y [batch, 4]) built
with python3-onnx, served by `sampan serve --tenants ... --response-cache-bytes ... --grpc-port`
with dynamic batching (preferred size 4, a long queue delay) and response_cache.enable. Outputs
are compared with a float64 numpy evaluation: 20 + 16 products of values below ~5 in float32 and
a softmax, so 1e-5 on probabilities <= 1 is many times the rounding (about 40 * 2^-24 * 100).

Checks: REST JSON and gRPC (raw_input_contents, with the key in metadata) answers match numpy; a
missing key is 401 (REST) / UNAUTHENTICATED (gRPC); a tenant whose model list excludes the model
gets 403; four concurrent requests run as one batch of 4 (batch_stats); a repeated request is a
response-cache hit (hits +1, executions unchanged, the same bytes); nv_inference_count counts rows;
per-tenant counters name the tenant; the config view lists the graph's tensors (Triton's
auto-complete); a wrong shape is 400 / INVALID_ARGUMENT naming the input.
Last line: onnx-serving: N passed, N failed, N skipped"""
import base64
import json
import os
import re
import shutil
import tempfile
import threading

from common import Server, Suite, binary, free_port, grpc_client, have_grpc_client, keyed_request, keys_add

s = Suite("onnx-serving")
PLUGINS = os.path.join(os.path.dirname(binary() or "build/sampan"), "backends")
TOL = 1e-5


def build_mlp(path, rng):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    w1 = rng.standard_normal((20, 16)).astype(np.float32) * 0.3
    b1 = rng.standard_normal(16).astype(np.float32) * 0.1
    w2 = rng.standard_normal((16, 4)).astype(np.float32) * 0.3
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 20])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with open(path, "wb") as f:
        f.write(m.SerializeToString())

    def ref(x):
        z = np.maximum(x.astype(np.float64) @ w1 + b1, 0) @ w2
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return ref


def metric(srv, key, name, **labels):
    st, _, b = keyed_request(srv.port, "GET", "/metrics", key=key)
    text = b.decode() if isinstance(b, bytes) else ""
    total = None
    for line in text.split("\n"):
        m = re.match(r"^([a-z_:]+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total = (total or 0) + float(m.group(3))
    return total


def body_of(x):
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


def main():
    np, _ = s.need("onnx serving", ("numpy", "onnx"), (os.path.join(PLUGINS, "libsampan_onnx.so"),),
                   "python3-onnx python3-numpy")
    rng = np.random.default_rng(11)
    tmp = tempfile.mkdtemp(prefix="sampan-onnx-serving-")
    try:
        repo = os.path.join(tmp, "repo")
        os.makedirs(os.path.join(repo, "mlp", "1"))
        ref = build_mlp(os.path.join(repo, "mlp", "1", "model.onnx"), rng)
        with open(os.path.join(repo, "mlp", "config.json"), "w") as f:
            json.dump({"name": "mlp", "backend": "onnx", "max_batch_size": 8,
                       "dynamic_batching": {"max_queue_delay_microseconds": 300000, "preferred_batch_size": [4]},
                       "response_cache": {"enable": True}}, f)
        tenants = os.path.join(tmp, "tenants.json")
        k_acme = keys_add(tenants, "acme", "--scopes", "infer,metrics", "--models", "mlp")
        k_other = keys_add(tenants, "other", "--scopes", "infer", "--models", "nothing")
        gport = free_port()
        srv = Server("--model-repository", repo, "--tenants", tenants, "--response-cache-bytes",
                     str(1 << 20), "--grpc-port", str(gport), "--metrics-compat", "triton", model=None, start_timeout=30)
        try:
            def infer(x, key=k_acme):
                return keyed_request(srv.port, "POST", "/v2/models/mlp/infer", body_of(x), key=key)

            x3 = rng.standard_normal((3, 20)).astype(np.float32)
            st, _, b = infer(x3)
            got = np.array(b["outputs"][0]["data"], np.float64).reshape(3, 4) if st == 200 else None
            err = float(np.abs(got - ref(x3)).max()) if got is not None else None
            s.case("REST JSON with a tenant key: 3 rows match numpy within 1e-5",
                   err is not None and err < TOL and b["outputs"][0]["shape"] == [3, 4], f"{st} {err} {str(b)[:200]}")
            st, _, _ = infer(x3, key=None)
            s.case("tenants: no key is 401", st == 401, str(st))
            st, _, b = infer(x3, key=k_other)
            s.case("tenants: a key whose model list excludes mlp is 403", st == 403, f"{st} {b}")

            # The dynamic batcher: four concurrent one-row requests (different rows: no cache hit)
            # run as one batch of 4 (preferred size 4 within the 300 ms delay).
            xs = [rng.standard_normal((1, 20)).astype(np.float32) for _ in range(4)]
            res = [None] * 4

            def one(i):
                res[i] = infer(xs[i])
            th = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            [t.start() for t in th]
            [t.join(60) for t in th]
            ok = all(r is not None and r[0] == 200 for r in res)
            err = max(float(np.abs(np.array(r[2]["outputs"][0]["data"]) - ref(xs[i]).ravel()).max())
                      for i, r in enumerate(res)) if ok else None
            st, _, b = keyed_request(srv.port, "GET", "/v2/models/mlp/stats", key=k_acme)
            ms = b["model_stats"][0] if st == 200 else {}
            bs = {e["batch_size"]: e["compute_infer"]["count"] for e in ms.get("batch_stats", [])}
            s.case("dynamic batcher: four concurrent requests run as one batch of 4, each row right",
                   ok and bs.get(4) == 1 and err < TOL, f"batch_stats {bs} err {err}")

            # The response cache: the same request again is a hit, runs nothing, same bytes.
            hits0 = metric(srv, k_acme, "sampan_response_cache_hits_total", model="mlp") or 0
            exec0 = metric(srv, k_acme, "nv_inference_exec_count", model="mlp")
            c1 = keyed_request(srv.port, "POST", "/v2/models/mlp/infer", body_of(xs[0]), key=k_acme)
            c2 = keyed_request(srv.port, "POST", "/v2/models/mlp/infer", body_of(xs[0]), key=k_acme)
            hits1 = metric(srv, k_acme, "sampan_response_cache_hits_total", model="mlp") or 0
            exec1 = metric(srv, k_acme, "nv_inference_exec_count", model="mlp")
            s.case("response cache: a repeated request is a hit without an execution, same answer",
                   c1[0] == c2[0] == 200 and c1[2] == c2[2] and hits1 - hits0 == 2 and exec1 == exec0,
                   f"hits {hits0}->{hits1} exec {exec0}->{exec1}")
            # Both are hits: xs[0] was answered (and cached) in the batch above. Rows inferred: 3 + 4 (a
            # cache hit computes nothing).
            rows = metric(srv, k_acme, "nv_inference_count", model="mlp")
            s.case("metrics: nv_inference_count counts the rows computed (3 + 4)", rows == 7, str(rows))
            treq = metric(srv, k_acme, "sampan_tenant_requests_total", tenant="acme")
            s.case("metrics: per-tenant requests name the tenant", treq is not None and treq >= 7, str(treq))

            # Triton's auto-complete: config.json declares no tensors; the config view gives the
            # graph's, as Triton prints a config after auto-completing it.
            st, _, b = keyed_request(srv.port, "GET", "/v2/models/mlp/config", key=k_acme)
            ins = [(t.get("name"), t.get("data_type"), t.get("dims")) for t in (b or {}).get("input", [])] \
                if st == 200 else None
            outs = [(t.get("name"), t.get("data_type"), t.get("dims")) for t in (b or {}).get("output", [])] \
                if st == 200 else None
            s.case("config view: inputs and outputs auto-completed from the graph",
                   ins == [("x", "TYPE_FP32", [20])] and outs == [("y", "TYPE_FP32", [4])] and
                   b.get("max_batch_size") == 8 and b.get("backend") == "onnx", f"{st} {str(b)[:300]}")

            st, _, b = keyed_request(srv.port, "POST", "/v2/models/mlp/infer", {"inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, 19], "data": [0.0] * 19}]}, key=k_acme)
            s.case("a wrong shape is a 400 naming the input", st == 400 and "'x'" in json.dumps(b), f"{st} {b}")

            if not have_grpc_client():
                s.skip("gRPC: ModelInfer on the ONNX model", "node or @grpc/grpc-js missing (npm ci in tests/node)")
            else:
                xg = rng.standard_normal((2, 20)).astype(np.float32)
                rq = {"model_name": "mlp", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 20]}],
                      "raw_input_contents": [base64.b64encode(xg.tobytes()).decode()]}
                bad = {"model_name": "mlp", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 19]}],
                       "raw_input_contents": [base64.b64encode(xg[:, :19].tobytes()).decode()]}
                auth = {"authorization": f"Bearer {k_acme}"}
                r = grpc_client(gport, [{"method": "ModelInfer", "request": rq, "metadata": auth},
                                        {"method": "ModelInfer", "request": rq},
                                        {"method": "ModelInfer", "request": bad, "metadata": auth}])
                raw = base64.b64decode((r[0].get("response", {}).get("raw_output_contents") or [""])[0])
                y = np.frombuffer(raw, "<f4") if len(raw) == 2 * 4 * 4 else None
                err = float(np.abs(y - ref(xg).ravel()).max()) if y is not None else None
                s.case("gRPC ModelInfer (raw contents, key in metadata) matches numpy within 1e-5",
                       r[0].get("code") == 0 and err is not None and err < TOL, f"{str(r[0])[:300]} {err}")
                s.case("gRPC without a key is UNAUTHENTICATED (16)", r[1].get("code") == 16, str(r[1])[:200])
                s.case("gRPC with a wrong shape is INVALID_ARGUMENT (3) naming the input",
                       r[2].get("code") == 3 and "'x'" in str(r[2].get("details", "")), str(r[2])[:300])
        finally:
            s.case("server exits cleanly", srv.stop() == 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
