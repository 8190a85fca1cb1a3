"""test_ollama.py - Ollama's API (/api/...) against the real server with the demo model:

- /api/version, /api/tags, /api/ps, /api/show: the shapes Ollama's clients read, with the
  model's real metadata (architecture, context length, parameter count, file size);
- /api/embed: unit vectors equal to /v1/embeddings' for the same inputs, the timing fields
  in nanoseconds and consistent with the wall time, truncate and options.num_ctx honoured
  (a prompt cut to num_ctx tokens equals the embedding of those tokens), dimensions;
  /api/embeddings (the older route) gives the same vector;
- ":latest" (Ollama's default tag) names the model;
- errors in Ollama's shape {"error": "..."} with the right status: unknown model 404,
  bad fields 400, a keep_alive that is not a duration refused;
- keep_alive: a model given "1s" shows in /api/ps with expires_at about a second ahead, is
  unloaded about a second after its request (and not before), and the next request loads it
  again (a --model model from its file, a repository model from its directory); an empty
  prompt with keep_alive 0 unloads it ("unload"), an empty prompt loads it;
  --keep-alive sets the default for every request, the OpenAI routes' too;
- the tenants' model lists apply (a model outside the key's list is not listed, and is refused: 403);
- /api/chat and /api/generate: NDJSON framing (stream true by default, one object per line,
  done false until the last, which has done_reason and the timings), the same text streamed and
  not; each sampler option gives the answer the OpenAI route gives with the same field and seed
  (so it reaches the sampler); num_predict and stop honoured; format json and a schema give JSON
  that parses (and follows the schema); unsupported options, template, images,
  think on a model without reasoning refused with 400 (raw and context: test_ollama_generate.py);
  the requests counted in /metrics;
- with a template that has thinking markup and renders tools: /api/show lists the thinking and
  tools capabilities, think false/true reaches the template's enable_thinking and "high" its
  reasoning_effort, tools and a tool-call history (Ollama's object arguments, tool_name) are
  rendered (the prompt's token count says so).
"""
import json
import math
import os
import tempfile
import time

import http.client

from common import DEMO_MODEL, Server, Suite, binary, chat_repository, http_json, keys_add, keyed_request

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
        ("keep_alive garbage", "/api/embed", {"model": "stories260K", "input": "x",
                                              "keep_alive": "soon"}, 400),
        ("bad JSON", "/api/show", "{", 400),
    ]:
        if body == "{":
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


def ndjson(port, path, body, timeout=60):
    """POST body; returns (status, content type, list of parsed lines, raw bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        lines = raw.split(b"\n")
        return r.status, r.getheader("Content-Type"), [json.loads(x) for x in lines if x], raw
    finally:
        c.close()


def chat(port, msgs, **kw):
    st, b = http_json(port, "POST", "/api/chat", dict({"model": "stories260K", "messages": msgs,
                                                       "stream": False}, **kw))
    return st, b


def oai_chat(port, msgs, **kw):
    st, b = http_json(port, "POST", "/v1/chat/completions",
                      dict({"model": "stories260K", "messages": msgs}, **kw))
    return b["choices"][0]["message"]["content"] if st == 200 else (st, b)


TIMINGS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
           "eval_count", "eval_duration")


def timings_ok(b, wall_ns):
    return all(isinstance(b.get(k), int) and b[k] >= 0 for k in TIMINGS) and \
        0 < b["total_duration"] <= wall_ns and \
        b["load_duration"] + b["prompt_eval_duration"] + b["eval_duration"] <= b["total_duration"]


srv = Server()
try:
    port = srv.port
    U = [{"role": "user", "content": "Once upon a time"}]
    t0 = time.monotonic_ns()
    st, ctype, lines, raw = ndjson(port, "/api/chat", {"model": "stories260K", "messages": U,
                                                       "options": {"temperature": 0, "num_predict": 12}})
    wall = time.monotonic_ns() - t0
    last = lines[-1] if lines else {}
    s.case("/api/chat streams by default: application/x-ndjson, one object per line",
           st == 200 and ctype.startswith("application/x-ndjson") and raw.endswith(b"\n")
           and len(lines) >= 3 and all(x["done"] is False for x in lines[:-1]) and last.get("done") is True,
           (st, ctype, raw[:300]))
    s.case("stream: each part names the model, has created_at and a message",
           all(x["model"] == "stories260K" and x["created_at"].endswith("Z") and
               x["message"]["role"] == "assistant" for x in lines), lines[:2])
    s.case("stream: the last line has done_reason length, eval_count 12, the timings in ns",
           last.get("done_reason") == "length" and last.get("eval_count") == 12 and timings_ok(last, wall),
           last)
    streamed = "".join(x["message"]["content"] for x in lines)
    st, one = chat(port, U, options={"temperature": 0, "num_predict": 12})
    s.case("stream false: one object, the same greedy text as streamed",
           st == 200 and one["done"] is True and one["message"]["content"] == streamed
           and one["eval_count"] == 12, (streamed, one))
    s.case("greedy /api/chat is /v1/chat/completions' greedy answer",
           one["message"]["content"] == oai_chat(port, U, temperature=0, max_tokens=12), one)

    st, ctype, glines, _ = ndjson(port, "/api/generate", {"model": "stories260K", "prompt": "Once upon a time",
                                                          "options": {"temperature": 0, "num_predict": 12}})
    s.case("/api/generate streams `response` parts; the text is chat's for the same user text",
           st == 200 and all("response" in x for x in glines) and glines[-1]["done"] is True
           and "".join(x["response"] for x in glines) == streamed, glines[-1:])
    st, g = http_json(port, "POST", "/api/generate", {"model": "stories260K", "prompt": "Once upon a time",
                                                      "system": "You tell stories.", "stream": False,
                                                      "options": {"temperature": 0, "num_predict": 12}})
    st2, c2 = chat(port, [{"role": "system", "content": "You tell stories."}] + U,
                   options={"temperature": 0, "num_predict": 12})
    s.case("/api/generate system + prompt = /api/chat with a system and a user message",
           st == 200 and st2 == 200 and g["response"] == c2["message"]["content"]
           and g["prompt_eval_count"] == c2["prompt_eval_count"], (g, c2))

    # Each sampler option reaches the sampler: the same answer as the OpenAI route's field.
    for opt, oai, val in [("top_k", "top_k", 5), ("top_p", "top_p", 0.5), ("min_p", "min_p", 0.2),
                          ("repeat_penalty", "repetition_penalty", 1.5),
                          ("presence_penalty", "presence_penalty", 1.5),
                          ("frequency_penalty", "frequency_penalty", 1.5)]:
        st, a = chat(port, U, options={"temperature": 1, "seed": 7, "num_predict": 32, opt: val})
        want = oai_chat(port, U, temperature=1, seed=7, max_tokens=32, **{oai: val})
        s.case(f"options.{opt} = OpenAI's {oai} (same seed, same text)",
               st == 200 and a["message"]["content"] == want, (a, want))
    st, a = chat(port, U, options={"temperature": 1, "seed": 11, "num_predict": 32})
    st2, b = chat(port, U, options={"temperature": 1, "seed": 11, "num_predict": 32})
    others = [chat(port, U, options={"temperature": 1, "seed": k, "num_predict": 32})[1]["message"]["content"]
              for k in (12, 13, 14)]
    s.case("seed + temperature: reproducible, and another seed changes the text",
           a["message"]["content"] == b["message"]["content"]
           and any(o != a["message"]["content"] for o in others), (a, others))
    st, k1 = chat(port, U, options={"temperature": 1, "top_k": 1, "seed": 5, "num_predict": 12})
    s.case("top_k 1 is greedy", k1["message"]["content"] == streamed, k1)
    word = streamed.split()[1]
    st, cut = chat(port, U, options={"temperature": 0, "num_predict": 12, "stop": [word]})
    s.case("options.stop: the text ends before the stop string, done_reason stop",
           st == 200 and cut["message"]["content"] == streamed[:streamed.index(word)]
           and cut["done_reason"] == "stop", (cut, word))
    st, lim = chat(port, U, options={"num_predict": 3, "num_ctx": 256, "unknown_option": 1})
    s.case("num_predict 3: eval_count 3, length; num_ctx within the context and unknown options accepted",
           st == 200 and lim["eval_count"] == 3 and lim["done_reason"] == "length", lim)

    # The tiny model may wander inside the object until num_predict: the grammar is the one the
    # OpenAI route's json_object compiles (the same text), and a finished answer parses.
    st, j = chat(port, U, format="json", options={"temperature": 0, "num_predict": 64})
    want = oai_chat(port, U, temperature=0, max_tokens=64, response_format={"type": "json_object"})
    ok = st == 200 and j["message"]["content"] == want and j["message"]["content"].lstrip().startswith("{")
    if ok and j["done_reason"] == "stop":
        try:
            ok = isinstance(json.loads(j["message"]["content"]), dict)
        except ValueError:
            ok = False
    s.case("format json: OpenAI's json_object grammar (the same text), an object", ok, (j, want))
    schema = {"type": "object", "properties": {"age": {"type": "integer"}, "name": {"type": "string"}},
              "required": ["age", "name"]}
    st, j = chat(port, U, format=schema, options={"temperature": 0, "num_predict": 200})
    try:
        v = json.loads(j["message"]["content"])
        ok = st == 200 and isinstance(v["age"], int) and isinstance(v["name"], str)
    except (ValueError, KeyError, TypeError):
        ok = False
    s.case("format schema: the object follows it", ok, j)
    st, ld = http_json(port, "POST", "/api/generate", {"model": "stories260K"})
    s.case("empty prompt: the model is loaded, done_reason load",
           st == 200 and ld["done"] is True and ld["done_reason"] == "load", ld)

    for name, path, body in [
        ("mirostat", "/api/chat", {"messages": U, "options": {"mirostat": 2}}),
        ("typical_p", "/api/chat", {"messages": U, "options": {"typical_p": 0.5}}),
        ("num_gpu", "/api/chat", {"messages": U, "options": {"num_gpu": 1}}),
        ("repeat_last_n other than 64", "/api/chat", {"messages": U, "options": {"repeat_last_n": 8}}),
        ("num_ctx over the context", "/api/chat", {"messages": U, "options": {"num_ctx": 100000}}),
        ("options not an object", "/api/chat", {"messages": U, "options": [1]}),
        ("num_predict below -2", "/api/chat", {"messages": U, "options": {"num_predict": -3}}),
        ("temperature out of range", "/api/chat", {"messages": U, "options": {"temperature": 9}}),
        ("format neither json nor a schema", "/api/chat", {"messages": U, "format": "xml"}),
        ("think on a model without reasoning", "/api/chat", {"messages": U, "think": True}),
        ("images", "/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
        ("keep_alive not a duration", "/api/chat", {"messages": U, "keep_alive": "5 minutes"}),
        ("template", "/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}),
        ("suffix on a model without FIM tokens", "/api/generate", {"prompt": "x", "suffix": "y"}),
        ("stream not a boolean", "/api/generate", {"prompt": "x", "stream": "yes"}),
    ]:
        st, b = http_json(port, "POST", path, dict({"model": "stories260K"}, **body))
        s.case(f"refused: {name}: 400 {{\"error\"}}", ollama_error(st, b, 400), (st, b))
    st, b = http_json(port, "POST", "/api/chat", {"model": "nope", "messages": U})
    s.case("chat: unknown model 404 {\"error\"}", ollama_error(st, b, 404), (st, b))

    st, m = http_json(port, "GET", "/metrics")
    text = m.decode() if isinstance(m, bytes) else str(m)
    n = sum(float(l.split()[-1]) for l in text.splitlines()
            if l.startswith('sampan_request_success_total{model="stories260K"'))
    s.case("the Ollama requests are counted in /metrics like the OpenAI ones", n >= 20, n)
finally:
    srv.stop()


def ps_models(port):
    st, b = http_json(port, "GET", "/api/ps")
    return b["models"] if st == 200 else None


def parse_time(t):
    """Ollama's RFC 3339 time (nanoseconds, Z) as unix seconds."""
    import datetime
    head, _, frac = t.rstrip("Z").partition(".")
    d = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return d.timestamp() + (float("0." + frac) if frac else 0.0)


def wait_unloaded(port, limit):
    """Seconds until /api/ps is empty, polling every 50 ms; None past limit seconds."""
    t0 = time.time()
    while time.time() - t0 < limit:
        if ps_models(port) == []:
            return time.time() - t0
        time.sleep(0.05)
    return None


# keep_alive: the model's idle unload.
srv = Server()
try:
    port = srv.port
    t0 = time.time()
    st, g = http_json(port, "POST", "/api/generate", {"model": "stories260K", "prompt": "Once",
                                                      "stream": False, "keep_alive": "1s",
                                                      "options": {"num_predict": 4, "temperature": 0}})
    done = time.time()
    ps = ps_models(port) or [{}]
    exp = parse_time(ps[0]["expires_at"]) if "expires_at" in ps[0] else 0
    # The deadline is one second after the request ended: between its start + 1 s and now + 1 s.
    s.case("keep_alive \"1s\": /api/ps lists the model, expires_at one second after the request",
           st == 200 and len(ps) == 1 and t0 + 1 - 0.05 <= exp <= time.time() + 1 + 0.05,
           (st, ps, t0, exp))
    gone = wait_unloaded(port, 6)
    since = time.time() - done
    # Not before the second is up (from the answer's arrival, which follows the request's end).
    s.case("keep_alive \"1s\": unloaded after about a second, not before",
           gone is not None and 0.9 <= since, (gone, since))
    st, tags = http_json(port, "GET", "/api/tags")
    s.case("unloaded: still in /api/tags (it loads on its next request)",
           st == 200 and [m["name"] for m in tags["models"]] == ["stories260K"], tags)
    st, g2 = http_json(port, "POST", "/api/generate", {"model": "stories260K", "prompt": "Once",
                                                       "stream": False, "options": {"num_predict": 4, "temperature": 0}})
    ps = ps_models(port) or [{}]
    s.case("the next request loads it again (load_duration), the same answer; no keep_alive: "
           "the server's default (loaded for good)",
           st == 200 and g2.get("response") == g.get("response") and g2["load_duration"] > 0
           and len(ps) == 1 and ps[0]["expires_at"].startswith("2318"), (g2, ps))
    st, u = http_json(port, "POST", "/api/generate", {"model": "stories260K", "keep_alive": 0})
    s.case("empty prompt, keep_alive 0: done_reason unload, and unloaded",
           st == 200 and u["done"] is True and u["done_reason"] == "unload"
           and wait_unloaded(port, 5) is not None, u)
    st, ld = http_json(port, "POST", "/api/generate", {"model": "stories260K"})
    s.case("empty prompt: loads it again (done_reason load, listed in /api/ps)",
           st == 200 and ld["done_reason"] == "load" and len(ps_models(port) or []) == 1, ld)
    st, c = http_json(port, "POST", "/api/chat", {"model": "stories260K", "messages": [], "keep_alive": -1})
    s.case("keep_alive -1: kept (a far expires_at)", st == 200 and
           (ps_models(port) or [{}])[0].get("expires_at", "").startswith("2318"), c)
finally:
    srv.stop()

# A repository model: unloaded the same way, and loaded again from its directory on demand.
tmp = tempfile.mkdtemp(prefix="sampan-ollama-repo-")
repo = chat_repository(tmp, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
srv = Server("--model-repository", repo, model=None)
try:
    port = srv.port
    st, u = http_json(port, "POST", "/api/chat", {"model": "chat", "messages": [], "keep_alive": 0})
    gone = wait_unloaded(port, 5)
    st2, idx = http_json(port, "POST", "/v2/repository/index", {})
    entry = [e for e in (idx if st2 == 200 else []) if e.get("name") == "chat"]
    s.case("repository model, keep_alive 0: unloaded (the index says why: keep_alive)",
           st == 200 and u["done_reason"] == "unload" and gone is not None and len(entry) == 1
           and "keep_alive" in entry[0].get("reason", ""), (u, entry))
    st, c = http_json(port, "POST", "/api/chat", {"model": "chat", "stream": False, "messages": [
        {"role": "user", "content": "Once"}], "options": {"num_predict": 2}})
    s.case("repository model: the next request loads it again", st == 200 and c["load_duration"] > 0
           and len(ps_models(port) or []) == 1, c)
finally:
    srv.stop()

# --keep-alive: the default for every request (here an OpenAI one).
srv = Server("--keep-alive", "0.5")
try:
    port = srv.port
    st, _ = http_json(port, "POST", "/v1/completions", {"model": "stories260K", "prompt": "Once",
                                                         "max_tokens": 2})
    s.case("--keep-alive 0.5: a model used by /v1/completions is unloaded when idle",
           st == 200 and wait_unloaded(port, 5) is not None, st)
    st, b = http_json(port, "POST", "/v1/completions", {"model": "stories260K", "prompt": "Once",
                                                         "max_tokens": 2})
    s.case("--keep-alive: the next request loads it again", st == 200 and b["choices"][0]["text"] != "",
           (st, b))
finally:
    srv.stop()

# A template with thinking markup that renders enable_thinking, reasoning_effort, tools and
# tool calls: what reaches it shows in prompt_eval_count.
tmp = tempfile.mkdtemp(prefix="sampan-ollama-tmpl-")
tmpl = os.path.join(tmp, "think.jinja")
with open(tmpl, "w") as f:
    f.write("{{ bos_token }}{% if tools %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}"
            "{% endif %}{% if reasoning_effort is defined %}effort {{ reasoning_effort }} {% endif %}"
            "{% for m in messages %}{{ m.role }}: {{ m.content }}"
            "{% if m.tool_calls %}{% for c in m.tool_calls %} call {{ c.function.name }}"
            " {{ c.function.arguments }}{% endfor %}{% endif %}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: <think>"
            "{% if enable_thinking is defined and not enable_thinking %} nothing to think </think>"
            "{% endif %}{% endif %}")
srv = Server("--chat-template-file", tmpl)
try:
    port = srv.port
    U = [{"role": "user", "content": "Once upon a time"}]
    st, sh = http_json(port, "POST", "/api/show", {"model": "stories260K"})
    s.case("/api/show: thinking and tools capabilities from the template",
           st == 200 and "thinking" in sh["capabilities"] and "tools" in sh["capabilities"], sh.get("capabilities"))

    def count(**kw):
        st, b = http_json(port, "POST", "/api/chat", dict({"model": "stories260K", "messages": U, "stream": False,
                                                           "options": {"num_predict": 1}}, **kw))
        return b["prompt_eval_count"] if st == 200 else (st, b)

    base, on, off, high = count(), count(think=True), count(think=False), count(think="high")
    s.case("think false closes the thinking in the template (more prompt), think true does not",
           isinstance(off, int) and on == base and off > base, (base, on, off))
    s.case("think \"high\": the template's reasoning_effort", isinstance(high, int) and high > base, (base, high))
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    with_tools = count(tools=[weather])
    s.case("tools are rendered by the template", isinstance(with_tools, int) and with_tools > base,
           (base, with_tools))
    hist = U + [{"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    st, b = http_json(port, "POST", "/api/chat", {"model": "stories260K", "messages": hist, "stream": False,
                                                  "tools": [weather], "options": {"num_predict": 1}})
    st2, tk = http_json(port, "POST", "/apply-template", {"model": "stories260K", "messages": [
        U[0], {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "content": "sunny"}], "tools": [weather]})
    st3, n = http_json(port, "POST", "/tokenize", {"content": tk.get("prompt", ""), "add_special": False,
                                                   "parse_special": True}) if st2 == 200 else (st2, {})
    s.case("a tool-call history (object arguments, tool_name): the OpenAI rendering of it",
           st == 200 and st3 == 200 and b["prompt_eval_count"] == len(n["tokens"]), (b, tk))
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
