"""test_openai_params.py - OpenAI request fields that must either work or be refused, against the
real `sampan serve` with the demo model:

- logit_bias: -100 on the greedy token removes it, +100 on another token forces it, and a biased
  request gives the same tokens alone and in a batch of concurrent requests;
- best_of (other than n), and suffix on a model without FIM tokens: 400 saying so; best_of == n works;
- developer role: rendered as the system prompt (the same prompt tokens and greedy answer);
- content as a list of text parts; an image part is a 400 naming it;
- a list of prompts (texts or token arrays) in one completions request: choice p*n+j is prompt
  p's, each the same as that prompt alone (greedy);
- stream_options.include_usage, max_completion_tokens, parallel_tool_calls: false (two calls forced
  by a grammar come back as one), user (logged as a hash, never the id), metadata and service_tier
  (checked; bad values are 400s).
"""
import json
import threading

from common import OTHERS, Server, Suite, binary, http_json

s = Suite("openai-params")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

srv = Server("--parallel", "8", "--ctx-size", "1024")
port = srv.port
M = "stories260K"


def comp(body):
    return http_json(port, "POST", "/v1/completions", dict({"model": M}, **body), timeout=30)


def chat(body):
    return http_json(port, "POST", "/v1/chat/completions", dict({"model": M}, **body), timeout=30)


def tokens(text):
    st, r = http_json(port, "POST", "/tokenize", {"model": M, "content": text, "add_special": False})
    return r["tokens"] if st == 200 else None


def generated_ids(prompt, text):
    """The ids of text generated after prompt: the tokens of prompt + text past the prompt's."""
    p, full = tokens(prompt), tokens(prompt + text)
    return full[len(p):] if full[:len(p)] == p else None


def logit_bias():
    prompt = "Once upon a time, there was a little"
    st, r = comp({"prompt": prompt, "max_tokens": 1, "temperature": 0})
    top = r["choices"][0]["text"]
    top_ids = generated_ids(prompt, top)
    ok = st == 200 and top_ids is not None and len(top_ids) == 1
    s.case("logit_bias: the greedy token is one token", ok, f"{st} {r} {top_ids}")
    if not ok:
        return
    g = top_ids[0]
    st, r = comp({"prompt": prompt, "max_tokens": 1, "temperature": 0, "logit_bias": {str(g): -100}})
    s.case("logit_bias -100 on the greedy token removes it", st == 200 and r["choices"][0]["text"] != top,
           f"{st} {r}")
    forced = generated_ids(prompt, " zebra")[0]  # an unlikely next piece
    st, r = comp({"prompt": prompt, "max_tokens": 1, "temperature": 0, "logit_bias": {str(forced): 100}})
    got = generated_ids(prompt, r["choices"][0]["text"]) if st == 200 else None
    s.case("logit_bias +100 forces a token", got == [forced], f"{st} {r} {got} vs {forced}")
    # sampled too: +100 dominates any temperature-1 draw
    st, r = comp({"prompt": prompt, "max_tokens": 4, "temperature": 1.0, "seed": 3,
                  "logit_bias": {str(forced): 100}})
    st1, one = comp({"prompt": prompt, "max_tokens": 1, "temperature": 0, "logit_bias": {str(forced): 100}})
    s.case("logit_bias +100 forces every sampled token",
           st == 200 and r["choices"][0]["text"] == one["choices"][0]["text"] * 4, f"{r} {one}")
    # the same alone and in a batch (batch invariance): greedy and seeded, 12 tokens
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0.8, "seed": 11,
            "logit_bias": {str(g): -100, str(forced): 5.5}}
    st, alone = comp(body)
    results = {}

    def other(i):
        results[i] = comp({"prompt": OTHERS[i % len(OTHERS)], "max_tokens": 24, "temperature": 1.0,
                           "seed": i})

    ts = [threading.Thread(target=other, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    st2, batched = comp(body)
    for t in ts:
        t.join()
    s.case("logit_bias: the same tokens alone and in a batch",
           st == 200 and st2 == 200 and alone["choices"][0]["text"] == batched["choices"][0]["text"],
           f"{alone} vs {batched}")
    for bad, needle in (({"99999": 1}, "not a token id"), ({"5": 101}, "[-100, 100]"),
                        ({"x": 1}, "not a token id"), ([1], "must be an object")):
        st, r = comp({"prompt": "x", "max_tokens": 1, "logit_bias": bad})
        s.case(f"logit_bias {json.dumps(bad)}: 400",
               st == 400 and r["error"]["param"] == "logit_bias" and needle in r["error"]["message"], str(r))


def refused_and_simple():
    st, r = comp({"prompt": "Once", "max_tokens": 2, "best_of": 3})
    s.case("best_of other than n: 400 saying so",
           st == 400 and r["error"]["param"] == "best_of" and "not supported" in r["error"]["message"], str(r))
    st, r = comp({"prompt": "Once", "max_tokens": 2, "best_of": 2, "n": 2})
    s.case("best_of == n: served", st == 200 and len(r["choices"]) == 2, str(r)[:200])
    st, r = comp({"prompt": "Once", "max_tokens": 2, "suffix": "The end."})
    s.case("suffix on a model without FIM tokens: 400", st == 400 and r["error"]["param"] == "suffix", str(r))
    st, r = chat({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3,
                  "max_tokens": 50})
    s.case("max_completion_tokens wins over max_tokens", st == 200 and r["usage"]["completion_tokens"] <= 3,
           str(r)[:200])


def roles_and_parts():
    base = [{"role": "user", "content": "Tell me a story"}]
    st1, a = chat({"messages": [{"role": "system", "content": "You are kind."}] + base, "max_tokens": 8,
                   "temperature": 0})
    st2, b = chat({"messages": [{"role": "developer", "content": "You are kind."}] + base, "max_tokens": 8,
                   "temperature": 0})
    s.case("developer role renders as the system prompt",
           st1 == 200 and st2 == 200 and a["usage"] == b["usage"]
           and a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"], f"{a} {b}")
    st3, c = chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me "},
                                                             {"type": "text", "text": "a story"}]}],
                   "max_tokens": 8, "temperature": 0})
    st4, d = chat({"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 8,
                   "temperature": 0})
    s.case("content as text parts: the parts joined",
           st3 == 200 and c["choices"][0]["message"]["content"] == d["choices"][0]["message"]["content"],
           f"{c} {d}")
    st, r = chat({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:x"}}]}],
        "max_tokens": 2})
    s.case("an image part: 400 naming it", st == 400 and "'image_url' parts are not supported"
           in r["error"]["message"], str(r))


def prompt_lists():
    prompts = ["Once upon a time", "The little dog", "Tom had a red ball"]
    st, r = comp({"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2})
    ok = st == 200 and len(r["choices"]) == 6 and [c["index"] for c in r["choices"]] == list(range(6))
    singles = []
    for p in prompts:
        _, one = comp({"prompt": p, "max_tokens": 6, "temperature": 0})
        singles.append(one)
    ok = ok and all(r["choices"][i]["text"] == singles[i // 2]["choices"][0]["text"] for i in range(6))
    ok = ok and r["usage"]["prompt_tokens"] == sum(x["usage"]["prompt_tokens"] for x in singles)
    s.case("a list of prompts: choice p*n+j is prompt p's (greedy), usage sums the prompts", ok, str(r)[:400])
    ids = [tokens(p) for p in prompts[:2]]
    st, r2 = comp({"prompt": ids, "max_tokens": 6, "temperature": 0})
    ok = st == 200 and len(r2["choices"]) == 2
    for i in range(2):
        _, one = comp({"prompt": ids[i], "max_tokens": 6, "temperature": 0})
        ok = ok and r2["choices"][i]["text"] == one["choices"][0]["text"]
    s.case("a list of token arrays: one choice each, as alone", ok, str(r2)[:300])
    st, r3 = comp({"prompt": ["a", 5], "max_tokens": 2})
    s.case("a mixed list: 400", st == 400 and r3["error"]["param"] == "prompt", str(r3))


def stream_usage():
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/chat/completions", json.dumps({
        "model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True}}), {"Content-Type": "application/json"})
    raw = c.getresponse().read().decode()
    c.close()
    evs = [json.loads(x[6:]) for x in raw.split("\n") if x.startswith("data: {")]
    last = evs[-1] if evs else {}
    s.case("stream_options.include_usage: a last chunk with usage and no choices",
           last.get("choices") == [] and last.get("usage", {}).get("completion_tokens", 0) > 0, raw[-300:])


def tools_and_misc():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    two = ('root ::= "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": {}}</tool_call>'
           '<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": {\\"a\\": 1}}</tool_call>"')
    res = {}
    for par in (True, False):
        st, r = chat({"messages": [{"role": "user", "content": "call"}], "tools": [tool], "grammar": two,
                      "max_tokens": 300, "parallel_tool_calls": par})
        res[par] = (st, r)
    calls = {p: len((r["choices"][0]["message"].get("tool_calls") or [])) if st == 200 else -1
             for p, (st, r) in res.items()}
    s.case("parallel_tool_calls: two calls, or only the first with false", calls == {True: 2, False: 1},
           f"{calls} {res[False][1]}"[:400])
    secret = "alice@example.com"
    st, r = chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "user": secret,
                  "metadata": {"k": "v"}, "service_tier": "flex"})
    srv.wait_log(r"metadata_pairs=1", 3.0)
    log = "".join(srv.log)
    s.case("user, metadata, service_tier accepted; the user id is logged only as a hash",
           st == 200 and "user=" in log and secret not in log, str(r)[:200])
    for body, param in (({"user": 5}, "user"), ({"metadata": {"k": 1}}, "metadata"),
                        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
                        ({"service_tier": "gold"}, "service_tier"), ({"parallel_tool_calls": "no"},
                                                                     "parallel_tool_calls")):
        st, r = chat(dict({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, **body))
        s.case(f"{param} malformed: 400", st == 400 and r["error"]["param"] == param, str(r))


try:
    for fn in (logit_bias, refused_and_simple, roles_and_parts, prompt_lists, stream_usage, tools_and_misc):
        fn()
finally:
    rc = srv.stop()
    s.case("server exits 0", rc == 0, "".join(srv.log)[-300:])
s.finish()
