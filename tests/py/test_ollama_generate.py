"""test_ollama_generate.py - Ollama's /api/generate `raw` and `context` against the real server
with the demo model (greedy, so equal token sequences give equal answers):

- raw true: the prompt as is, no template: the answer and prompt_eval_count of /v1/completions
  for the same text; no `context` in the answer (Ollama returns none for raw);
- context: the final line (streamed or not) carries the prompt's ids and the answer's
  (prompt_eval_count + eval_count of them); sent back with a new prompt, the engine gets those
  ids then the new prompt's (its template's text, no second BOS): the same answer as
  /v1/completions given that id sequence; with raw, the ids then the raw text;
- bad contexts and raw with a system prompt are 400s in Ollama's shape.
"""
import json

import http.client

from common import Server, Suite, binary, http_json

s = Suite("ollama_generate")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

OPTS = {"temperature": 0, "num_predict": 10}


def gen(port, **kw):
    return http_json(port, "POST", "/api/generate",
                     dict({"model": "stories260K", "stream": False, "options": OPTS}, **kw), timeout=60)


def complete(port, prompt):
    st, r = http_json(port, "POST", "/v1/completions",
                      {"model": "stories260K", "prompt": prompt, "max_tokens": 10, "temperature": 0},
                      timeout=60)
    return (r["choices"][0]["text"], r["usage"]["prompt_tokens"]) if st == 200 else (st, r)


def toks(port, text, special):
    st, r = http_json(port, "POST", "/tokenize", {"model": "stories260K", "content": text,
                                                  "add_special": False, "parse_special": special})
    assert st == 200, r
    return r["tokens"]


def rendered(port, text):
    st, r = http_json(port, "POST", "/apply-template",
                      {"model": "stories260K", "messages": [{"role": "user", "content": text}]})
    assert st == 200, r
    return r["prompt"]


srv = Server()
try:
    port = srv.port
    P1, P2 = "Once upon a time", "The end"
    st, r = gen(port, prompt=P1, raw=True)
    s.case("raw: the prompt as is (= /v1/completions on the same text), no context back",
           st == 200 and (r["response"], r["prompt_eval_count"]) == complete(port, P1)
           and "context" not in r, str(r)[:300])
    st, t = gen(port, prompt=P1)
    s.case("the check can fail: templated, the prompt is another",
           st == 200 and t["prompt_eval_count"] != r["prompt_eval_count"], str(t)[:300])

    ctx = t.get("context")
    s.case("not raw: context = the prompt's ids and the answer's",
           isinstance(ctx, list) and all(isinstance(x, int) for x in ctx)
           and len(ctx) == t["prompt_eval_count"] + t["eval_count"], str(t)[:400])
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/api/generate", json.dumps({"model": "stories260K", "prompt": P1, "options": OPTS}),
              {"Content-Type": "application/json"})
    lines = [json.loads(x) for x in c.getresponse().read().split(b"\n") if x]
    c.close()
    s.case("streamed: the last line carries the same context, the others none",
           lines and lines[-1].get("context") == ctx and all("context" not in x for x in lines[:-1]),
           str(lines[-1])[:300])
    st, r2 = gen(port, prompt=P2, context=ctx)
    want = ctx + toks(port, rendered(port, P2), True)
    if want[len(ctx)] == 1:  # the template's own BOS text is not repeated after a context
        want = ctx + want[len(ctx) + 1:]
    s.case("context sent back: its ids, then the new prompt's (= completions on those ids)",
           st == 200 and (r2["response"], r2["prompt_eval_count"]) == complete(port, want)
           and len(r2["context"]) == r2["prompt_eval_count"] + r2["eval_count"]
           and r2["context"][:len(ctx)] == ctx, f"{str(r2)[:300]} {complete(port, want)}")
    st, r3 = gen(port, prompt=P2, context=ctx, raw=True)
    s.case("raw with context: the ids, then the raw text",
           st == 200 and (r3["response"], r3["prompt_eval_count"])
           == complete(port, ctx + toks(port, P2, True)), str(r3)[:300])
    for name, body in (("context not a list", {"prompt": "x", "context": "1 2"}),
                       ("context with a non-integer", {"prompt": "x", "context": [1, 2.5]}),
                       ("context outside the vocabulary", {"prompt": "x", "context": [1, 100000]}),
                       ("context longer than the model's context", {"prompt": "x", "context": [5] * 600}),
                       ("raw with a system prompt", {"prompt": "x", "raw": True, "system": "be kind"})):
        st, b = gen(port, **body)
        s.case(f"refused: {name}: 400 {{\"error\"}}",
               st == 400 and isinstance(b, dict) and set(b) == {"error"}, (st, b))
finally:
    rc = srv.stop()
    s.case("server exits cleanly", rc == 0, f"exit {rc}")
s.finish()
