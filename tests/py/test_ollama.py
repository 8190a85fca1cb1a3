"""test_ollama.py - Ollama's API (/api/...) against the real server with the demo model:

- /api/version, /api/tags, /api/ps, /api/show: the shapes Ollama's clients read, with the
  model's real metadata (architecture, context length, parameter count, file size);
- /api/embed: unit vectors equal to /v1/embeddings' for the same inputs, the timing fields
  in nanoseconds and consistent with the wall time, truncate and options.num_ctx honoured
  (a prompt cut to num_ctx tokens equals the embedding of those tokens), dimensions;
  /api/embeddings (the older route) gives the same vector;
- ":latest" (Ollama's default tag) names the model;
- errors in Ollama's shape {"error": "..."} with the right status: unknown model 404,
  bad fields 400, keep_alive other than "keep loaded" refused, not ignored;
- the tenants' model lists apply (a model outside the key's list is not listed, and is refused: 403).
"""
import json
import math
import os
import tempfile
import time

from common import DEMO_MODEL, Server, Suite, binary, http_json, keys_add, keyed_request

s = Suite("ollama")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()


def ollama_error(st, b, status):
    return st == status and isinstance(b, dict) and set(b) == {"error"} and isinstance(b["error"], str)


def norm(v):
    return math.sqrt(sum(x * x for x in v))


srv = Server()
try:
    port = srv.port
    st, b = http_json(port, "GET", "/api/version")
    s.case("/api/version: a version string", st == 200 and isinstance(b.get("version"), str)
           and b["version"].count(".") == 2, b)

    st, tags = http_json(port, "GET", "/api/tags")
    m = (tags or {}).get("models", [{}])[0]
    s.case("/api/tags lists the model with its details",
           st == 200 and len(tags["models"]) == 1 and m["name"] == "stories260K"
           and m["model"] == "stories260K" and m["size"] == os.path.getsize(DEMO_MODEL)
           and len(m["digest"]) == 64 and m["details"]["format"] == "gguf"
           and m["details"]["family"] == "llama" and m["details"]["quantization_level"] == "F32"
           and m["details"]["parameter_size"].endswith("K"), tags)

    st, ps = http_json(port, "GET", "/api/ps")
    p = (ps or {}).get("models", [{}])[0]
    s.case("/api/ps: the loaded model, its context and memory",
           st == 200 and p.get("name") == "stories260K" and p["context_length"] == 512
           and p["size"] > 0 and p["size_vram"] == 0 and p["digest"] == m.get("digest"), ps)

    st, sh = http_json(port, "POST", "/api/show", {"model": "stories260K:latest"})
    info = (sh or {}).get("model_info", {})
    s.case("/api/show (\":latest\"): metadata, details, capabilities",
           st == 200 and info.get("general.architecture") == "llama"
           and info.get("llama.context_length") == 512 and info.get("tokenizer.ggml.tokens") is None
           and "tokenizer.ggml.tokens" in info and "completion" in sh["capabilities"]
           and sh["details"]["family"] == "llama" and isinstance(sh["template"], str), sh)
    st, shv = http_json(port, "POST", "/api/show", {"name": "stories260K", "verbose": True})
    s.case("/api/show verbose (older `name`): the vocabulary too",
           st == 200 and len(shv["model_info"]["tokenizer.ggml.tokens"]) == 512, st)

    # /api/embed against /v1/embeddings: the same pipeline, so the same vectors.
    texts = ["Once upon a time", "a cat sat"]
    t0 = time.monotonic_ns()
    st, e = http_json(port, "POST", "/api/embed", {"model": "stories260K", "input": texts})
    wall = time.monotonic_ns() - t0
    st2, o = http_json(port, "POST", "/v1/embeddings", {"model": "stories260K", "input": texts})
    same = st == 200 and st2 == 200 and len(e["embeddings"]) == 2 and all(
        all(abs(a - b) <= 1e-6 for a, b in zip(e["embeddings"][i], o["data"][i]["embedding"]))
        for i in range(2))
    # The vectors are written with 9 significant digits: 1e-6 absolute covers that.
    s.case("/api/embed: the vectors of /v1/embeddings, unit length", same and all(
        abs(norm(v) - 1) < 1e-5 for v in e["embeddings"]), (st, st2))
    s.case("/api/embed: timing in nanoseconds within the wall time, prompt_eval_count",
           st == 200 and 0 < e["total_duration"] <= wall and 0 <= e["load_duration"] <= e["total_duration"]
           and e["prompt_eval_count"] == o["usage"]["prompt_tokens"] and e["model"] == "stories260K",
           {k: e.get(k) for k in ("total_duration", "load_duration", "prompt_eval_count")})
    st, le = http_json(port, "POST", "/api/embeddings", {"model": "stories260K", "prompt": texts[0]})
    s.case("/api/embeddings (older route): {embedding} of the first text",
           st == 200 and set(le) == {"embedding"} and
           all(abs(a - b) <= 1e-6 for a, b in zip(le["embedding"], e["embeddings"][0])), st)
    st, d = http_json(port, "POST", "/api/embed", {"model": "stories260K", "input": texts[0], "dimensions": 8})
    v = e["embeddings"][0][:8]
    want = [x / norm(v) for x in v]
    s.case("/api/embed dimensions: the first 8 values, back to unit length",
           st == 200 and len(d["embeddings"][0]) == 8 and
           all(abs(a - b) <= 1e-5 for a, b in zip(d["embeddings"][0], want)), d)

    # num_ctx cuts (truncate, the default) or refuses (truncate false) a longer input.
    long = "Once upon a time there was a little girl named Lily who loved to play outside"
    st, tk = http_json(port, "POST", "/tokenize", {"content": long, "add_special": True})
    ids = tk["tokens"][:4]
    st, cut = http_json(port, "POST", "/api/embed", {"model": "stories260K", "input": long,
                                                     "options": {"num_ctx": 4}})
    st2, ref = http_json(port, "POST", "/v1/embeddings", {"model": "stories260K", "input": [ids]})
    s.case("options.num_ctx with truncate: the embedding of the first num_ctx tokens",
           st == 200 and st2 == 200 and cut["prompt_eval_count"] == 4 and
           all(abs(a - b) <= 1e-6 for a, b in zip(cut["embeddings"][0], ref["data"][0]["embedding"])),
           (st, st2, cut.get("prompt_eval_count") if isinstance(cut, dict) else cut))
    st, b = http_json(port, "POST", "/api/embed", {"model": "stories260K", "input": long,
                                                   "options": {"num_ctx": 4}, "truncate": False})
    s.case("truncate false: a longer input is a 400", ollama_error(st, b, 400) and "truncate" in b["error"], b)

    # Errors: Ollama's shape, the right status.
    for name, path, body, status in [
        ("unknown model", "/api/embed", {"model": "nope", "input": "x"}, 404),
        ("unknown model (show)", "/api/show", {"model": "nope"}, 404),
        ("no model", "/api/embed", {"input": "x"}, 400),
        ("input not a string", "/api/embed", {"model": "stories260K", "input": 3}, 400),
        ("empty input", "/api/embed", {"model": "stories260K", "input": ""}, 400),
        ("num_ctx over the model's", "/api/embed", {"model": "stories260K", "input": "x",
                                                      "options": {"num_ctx": 100000}}, 400),
        ("dimensions over the model's", "/api/embed", {"model": "stories260K", "input": "x",
                                                         "dimensions": 100000}, 400),
        ("keep_alive 5m (a timed unload)", "/api/embed", {"model": "stories260K", "input": "x",
                                                         "keep_alive": "5m"}, 400),
        ("keep_alive 0 (unload now)", "/api/embed", {"model": "stories260K", "input": "x",
                                                     "keep_alive": 0}, 400),
        ("keep_alive garbage", "/api/embed", {"model": "stories260K", "input": "x",
                                              "keep_alive": "soon"}, 400),
        ("bad JSON", "/api/show", "{", 400),
    ]:
        if body == "{":
            import http.client
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("POST", path, body=b"{", headers={"Content-Type": "application/json"})
            r = c.getresponse()
            st, b = r.status, json.loads(r.read())
        else:
            st, b = http_json(port, "POST", path, body)
        s.case(f"error: {name}: {status} {{\"error\": ...}}", ollama_error(st, b, status), (st, b))
    st, b = http_json(port, "POST", "/api/embed", {"model": "stories260K", "input": "x", "keep_alive": -1})
    st2, b2 = http_json(port, "POST", "/api/embed", {"model": "stories260K", "input": "x", "keep_alive": "-1m"})
    s.case("keep_alive negative (keep loaded): accepted", st == 200 and st2 == 200, (st, st2))
finally:
    srv.stop()

# Tenants: a key limited to another model sees nothing and gets 403.
tmp = tempfile.mkdtemp(prefix="sampan-ollama-")
keys = os.path.join(tmp, "tenants.json")
k_other = keys_add(keys, "other", "--models", "someone-else")
k_all = keys_add(keys, "all")
srv = Server("--tenants", keys)
try:
    st, _, b = keyed_request(srv.port, "GET", "/api/tags", key=k_other)
    s.case("tenant limited to another model: /api/tags is empty", st == 200 and b["models"] == [], b)
    st, _, b = keyed_request(srv.port, "POST", "/api/embed", {"model": "stories260K", "input": "x"}, key=k_other)
    s.case("tenant limited to another model: /api/embed is 403", ollama_error(st, b, 403), (st, b))
    st, _, b = keyed_request(srv.port, "GET", "/api/tags", key=k_all)
    s.case("tenant with every model: listed", st == 200 and len(b["models"]) == 1, b)
    st, _, b = keyed_request(srv.port, "GET", "/api/tags")
    s.case("no key: 401 in Ollama's shape", ollama_error(st, b, 401), (st, b))
finally:
    srv.stop()
s.finish()
