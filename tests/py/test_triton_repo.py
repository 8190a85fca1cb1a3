"""test_triton_repo.py - a Triton model repository written as Triton's documentation writes one
(every model described by a config.pbtxt) served by `sampan serve --model-repository` as a black
box: the FIL backend's documented config for an XGBoost model (mapped onto the xgboost backend)
reproduces the credit-card model's expected predictions; an LLM config.pbtxt for the demo model
generates; a broken config.pbtxt and a directory without a config are load errors in the
repository index that name the file and line, and strict readiness (the default) makes /health
and /v2/health/ready answer 503 together, while --strict-readiness false answers 200 from both;
GET /v2/models/{m}/config answers Triton's JSON and the gRPC ModelConfig method (official
@grpc/grpc-js client) the same config. Last line:
    triton-repo: N passed, N failed, N skipped"""
import csv
import json
import os
import shutil
import tempfile

from common import (DEMO_MODEL, ROOT, Server, Suite, binary, free_port, grpc_client,
                    have_grpc_client, http_json)

s = Suite("triton-repo")
DATA = os.path.join(ROOT, "tests", "data", "xgboost")
PLUGINS = os.path.join(os.path.dirname(binary() or ""), "backends")

# The FIL backend's documented example (triton-inference-server/fil_backend README), with the
# credit-card model's 30 features: list forms, comments and map entries as its users write them.
FIL_PBTXT = """# an XGBoost model through Triton's FIL backend
backend: "fil"
max_batch_size: 64
input [
 {
    name: "input__0"
    data_type: TYPE_FP32
    dims: [ 30 ]
  }
]
output [
 {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }
]
instance_group [{ kind: KIND_AUTO }]
parameters [
  {
    key: "model_type"
    value: { string_value: "xgboost_json" }
  },
  {
    key: "output_class"
    value: { string_value: "false" }
  },
  {
    key: "storage_type"
    value: { string_value: "AUTO" }
  }
]

dynamic_batching {
  max_queue_delay_microseconds: 2000
}
"""

LLM_PBTXT = """name: "stories"
backend: "llm"
max_batch_size: 0
model_transaction_policy { decoupled: True }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "context_length" value: { string_value: "256" } }
parameters { key: "max_tokens" value: { string_value: "16" } }
"""

BROKEN_PBTXT = """backend: "llm"
max_batch_size: 0
instance_group [ { kind: KIND_SOMETIMES } ]
"""


def put(repo, rel, text):
    p = os.path.join(repo, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)


def close(a, b, tol=1e-6):
    # XGBoost computes in float32 (relative rounding 6e-8 per operation, summed over 50 trees
    # stays under 1e-6) and the expected file prints 9 significant digits.
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def check_config(cfg, where):
    s.case(f"{where}: Triton's JSON for the FIL model (name, mapped backend, every field printed)",
           cfg.get("name") == "fraud" and cfg.get("backend") == "xgboost" and
           cfg.get("platform") == "" and cfg.get("max_batch_size") == 64 and
           cfg["input"][0]["name"] == "input__0" and cfg["input"][0]["data_type"] == "TYPE_FP32" and
           cfg["input"][0]["format"] == "FORMAT_NONE" and cfg["input"][0]["dims"] == [30] and
           cfg["output"][0]["dims"] == [1] and
           cfg["instance_group"][0]["kind"] == "KIND_AUTO" and
           cfg["instance_group"][0]["count"] == 1 and
           cfg["version_policy"] == {"latest": {"num_versions": 1}} and
           cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 2000 and
           cfg["parameters"]["model_file"]["string_value"] == "xgboost.json",
           json.dumps(cfg)[:600])


def main():
    have_xgb = os.path.isfile(os.path.join(PLUGINS, "libsampan_xgboost.so"))
    tmp = tempfile.mkdtemp(prefix="sampan-triton-")
    try:
        repo = os.path.join(tmp, "models")
        if have_xgb:
            put(repo, "fraud/config.pbtxt", FIL_PBTXT)
            os.makedirs(os.path.join(repo, "fraud", "1"))
            shutil.copy(os.path.join(DATA, "creditcard-depth3-50trees.json"),
                        os.path.join(repo, "fraud", "1", "xgboost.json"))
        put(repo, "stories/config.pbtxt", LLM_PBTXT)
        os.makedirs(os.path.join(repo, "stories", "1"))
        shutil.copy(DEMO_MODEL, os.path.join(repo, "stories", "1", "model.gguf"))
        put(repo, "broken/config.pbtxt", BROKEN_PBTXT)
        os.makedirs(os.path.join(repo, "broken", "1"))
        os.makedirs(os.path.join(repo, "noconfig", "1"))
        put(repo, "resnet/config.pbtxt", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
        put(repo, "resnet/1/model.onnx", "not an ONNX file: the onnx backend must say so")
        put(repo, "pymodel/config.pbtxt", 'backend: "python"\n')
        put(repo, "pymodel/1/model.py", "print('never run')\n")

        gport = free_port()
        srv = Server("--model-repository", repo, "--grpc-port", str(gport), model=None)
        try:
            st, ix = http_json(srv.port, "POST", "/v2/repository/index")
            ix = {e["name"]: e for e in ix} if st == 200 else {}
            s.case("the LLM's config.pbtxt loads", ix.get("stories", {}).get("state") == "READY",
                   str(ix.get("stories")))
            br = ix.get("broken", {})
            s.case("a broken config.pbtxt is a load error naming file, line, column and field",
                   br.get("state") == "UNAVAILABLE" and
                   "broken/config.pbtxt:3:26: instance_group[0].kind: \"KIND_SOMETIMES\" is not one of"
                   in br.get("reason", ""), str(br))
            nc = ix.get("noconfig", {})
            s.case("a directory without a config is listed with the reason (not ignored)",
                   nc.get("state") == "UNAVAILABLE" and
                   "no config.pbtxt or config.json" in nc.get("reason", ""), str(nc))
            on = ix.get("resnet", {})
            # onnxruntime_onnx is the onnx plugin: it reads the file and refuses it by name
            # (or, where the plugin was not built, the load error says that)
            s.case("platform onnxruntime_onnx: served by the onnx backend, which refuses a bad file by name",
                   on.get("state") == "UNAVAILABLE" and
                   (("resnet/1/model.onnx" in on.get("reason", "") and "not an ONNX model" in on.get("reason", ""))
                    or "onnx backend not built" in on.get("reason", "")), str(on))
            py = ix.get("pymodel", {})
            s.case("backend python: refused with the reason, naming the file and line",
                   py.get("state") == "UNAVAILABLE" and
                   "pymodel/config.pbtxt:1:1: backend: \"python\": Python models" in py.get("reason", ""),
                   str(py))
            st_h, b_h = http_json(srv.port, "GET", "/health")
            st_r, _ = http_json(srv.port, "GET", "/v2/health/ready")
            s.case("strict readiness (default): /health and /v2/health/ready both 503",
                   st_h == 503 and st_r == 503 and (b_h or {}).get("status") == "models_not_ready",
                   f"/health {st_h} {b_h}, /v2/health/ready {st_r}")

            st, b = http_json(srv.port, "POST", "/v2/models/stories/generate",
                              {"text_input": "Once upon a time", "parameters": {"temperature": 0}})
            s.case("the LLM generates through Triton's generate route",
                   st == 200 and isinstance(b.get("text_output"), str) and b["text_output"] != "",
                   str(b)[:300])
            st, cfg = http_json(srv.port, "GET", "/v2/models/stories/config")
            s.case("GET /v2/models/stories/config: the LLM's config",
                   st == 200 and cfg.get("name") == "stories" and cfg.get("backend") == "llm" and
                   cfg.get("model_transaction_policy") == {"decoupled": True} and
                   cfg["parameters"]["context_length"] == {"string_value": "256"},
                   json.dumps(cfg)[:400])
            st, b = http_json(srv.port, "GET", "/v2/models/broken/config")
            s.case("the config of a model that is not loaded: a 4xx with a JSON error",
                   st in (400, 404) and "error" in (b or {}), f"{st} {b}")

            if have_xgb:
                data = list(csv.reader(open(os.path.join(DATA, "creditcard-test.csv"))))[1:]
                pred = list(csv.reader(open(os.path.join(DATA, "creditcard-depth3-50trees.test-pred.csv"))))[1:]
                feats = [[float(v) for v in r[1:31]] for r in data]
                exp = [float(p[2]) for p in pred]
                got = []
                for i in range(0, len(feats), 64):
                    rows = feats[i:i + 64]
                    st, b = http_json(srv.port, "POST", "/v2/models/fraud/infer",
                                      {"inputs": [{"name": "input__0", "datatype": "FP32",
                                                   "shape": [len(rows), 30],
                                                   "data": [v for r in rows for v in r]}]})
                    got += b["outputs"][0]["data"] if st == 200 else []
                s.case("FIL config.pbtxt: all 344 expected credit-card predictions", close(got, exp),
                       f"{len(got)} got, {got[:3]} vs {exp[:3]}")
                st, cfg = http_json(srv.port, "GET", "/v2/models/fraud/config")
                check_config(cfg if st == 200 else {"status": st}, "GET /v2/models/fraud/config")
                st, cfg1 = http_json(srv.port, "GET", "/v2/models/fraud/versions/1/config")
                s.case("the versioned route answers the same", st == 200 and cfg1 == cfg, f"{st}")
            else:
                s.skip("FIL model", "libsampan_xgboost.so not built (libxgboost-dev missing)")

            if have_grpc_client():
                calls = [{"method": "ModelConfig", "request": {"name": "stories"}},
                         {"method": "ModelConfig", "request": {"name": "nosuch"}},
                         {"method": "ServerReady", "request": {}}]
                if have_xgb:
                    calls.append({"method": "ModelConfig", "request": {"name": "fraud", "version": "1"}})
                r = grpc_client(gport, calls)
                c0 = (r[0].get("response") or {}).get("config") or {}
                s.case("gRPC ModelConfig: the LLM's config message",
                       r[0].get("code") == 0 and c0.get("name") == "stories" and
                       c0.get("backend") == "llm" and
                       c0.get("model_transaction_policy", {}).get("decoupled") is True and
                       c0.get("parameters", {}).get("max_tokens", {}).get("string_value") == "16",
                       json.dumps(r[0])[:400])
                s.case("gRPC ModelConfig of an unknown model: NOT_FOUND", r[1].get("code") == 5,
                       str(r[1])[:200])
                s.case("gRPC ServerReady agrees with /v2/health/ready (false)",
                       r[2].get("code") == 0 and r[2]["response"].get("ready") is False, str(r[2]))
                if have_xgb:
                    c3 = (r[3].get("response") or {}).get("config") or {}
                    if c3:
                        # proto-loader (oneofs: true) adds the oneof's name and its unset members
                        vp = c3.get("version_policy") or {}
                        c3["version_policy"] = {"latest": vp.get("latest")}
                    check_config(c3, "gRPC ModelConfig")
            else:
                s.skip("gRPC ModelConfig", "node or @grpc/grpc-js missing (npm ci in tests/node)")
        finally:
            s.case("server exits cleanly", srv.stop() == 0)

        srv = Server("--model-repository", repo, "--strict-readiness", "false", model=None)
        try:
            st_h, _ = http_json(srv.port, "GET", "/health")
            st_r, _ = http_json(srv.port, "GET", "/v2/health/ready")
            s.case("--strict-readiness false: both 200 beside the broken models",
                   st_h == 200 and st_r == 200, f"/health {st_h}, /v2/health/ready {st_r}")
        finally:
            s.case("server exits cleanly (lenient)", srv.stop() == 0)

        # Only good models: ready under the default.
        shutil.rmtree(os.path.join(repo, "broken"))
        for d in ("noconfig", "resnet", "pymodel"):
            shutil.rmtree(os.path.join(repo, d))
        srv = Server("--model-repository", repo, model=None)
        try:
            st_h, _ = http_json(srv.port, "GET", "/health")
            st_r, _ = http_json(srv.port, "GET", "/v2/health/ready")
            s.case("strict readiness with every model loaded: both 200",
                   st_h == 200 and st_r == 200, f"/health {st_h}, /v2/health/ready {st_r}")
        finally:
            s.case("server exits cleanly (all good)", srv.stop() == 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
