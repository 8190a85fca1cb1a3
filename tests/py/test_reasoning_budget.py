"""test_reasoning_budget.py - the reasoning budget (llama-server's reasoning_budget /
reasoning_budget_tokens, Anthropic's thinking.budget_tokens) against the real server.

The demo model is a tiny story model that never closes a thinking part by itself: given a
prompt that opens one (a DeepSeek-R1-style template ends the generation prompt with
"<think>\\n"), everything it writes is reasoning until max_tokens. So:
- without a budget, no content ever comes (the test would fail if the budget were ignored);
- with a budget of N, the reasoning is exactly what the first N tokens were without one
  (greedy: forcing starts only after them), then the close marker, then content;
- 0 gives no reasoning at all; reasoning_budget_message ends the reasoning with the message;
- a Qwen3-style template, where the model writes <think> itself (a GBNF grammar makes it),
  gets the same limit from its open marker on;
- streamed deltas add up to the same split; sequences of different budgets running in one
  batch each get what they get alone (the budget is per sequence);
- bad values are 400s naming the field; harmony (no forcible close marker) refuses a budget;
- Anthropic's thinking.budget_tokens (at least 1024: a server with a longer context) is the same
  budget; --reasoning-budget is the default of requests that set none.
"""
import json
import os
import shutil
import tempfile
import threading

from common import ROOT, RepoServer, Suite, binary, http_json

s = Suite("reasoning_budget")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

DEMO = os.path.join(ROOT, "models", "stories260K.gguf")
# the templates' families are read from their text, as for a downloaded model: these are
# test_reasoning.py's (ChatML with <think> for earlier turns' reasoning; gpt-oss harmony)
CHATML = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
          "\n</think>\n\n{% endif %}{% if m.content %}{{ m.content }}{% endif %}<|im_end|>\n"
          "{% endfor %}")
TEMPLATES = {
    "r1": CHATML + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
    "think": CHATML + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "oss": ("{%- for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>"
            "final<|message|>{{ m.content }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>"
            "{{ m.content }}<|end|>{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|start|>assistant{% endif %}"),
}
PROMPT = [{"role": "user", "content": "Once upon a time"}]
# Qwen3-style: the model opens the part itself; the grammar lets any text but '<' follow,
# so only the close marker (forced, or never) ends it.
THINK_GRAMMAR = 'root ::= "<think>" [^<]* "</think>" [^<]*'


def make_repo(tmp):
    repo = os.path.join(tmp, "repo")
    for name, tpl in TEMPLATES.items():
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(DEMO, os.path.join(repo, name, "1", "model.gguf"))
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump({"name": name, "backend": "llm",
                       "parameters": {"chat_template": {"string_value": tpl}}}, f)
    return repo


def chat(port, model="r1", **kw):
    body = dict({"model": model, "messages": PROMPT, "max_tokens": 80, "temperature": 0}, **kw)
    st, r = http_json(port, "POST", "/v1/chat/completions", body, timeout=60)
    if st != 200:
        return st, r, None
    return st, r, r["choices"][0]


def parts(c):
    m = c["message"] if c else {}
    return (m.get("reasoning_content") or ""), (m.get("content") or "")


def stream(port, **kw):
    import http.client
    body = dict({"model": "r1", "messages": PROMPT, "max_tokens": 80, "temperature": 0,
                 "stream": True}, **kw)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    raw = c.getresponse().read().decode()
    c.close()
    rs, cs = "", ""
    for line in raw.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            for ch in json.loads(line[6:]).get("choices", []):
                d = ch.get("delta", {})
                rs += d.get("reasoning_content") or ""
                cs += d.get("content") or ""
    return rs, cs


def budget_cases(port):
    N = 12
    _, r, c = chat(port, max_tokens=N)
    cut, none = parts(c)
    s.case("no budget, max_tokens N: N tokens of reasoning, no content (finish length)",
           c and c["finish_reason"] == "length" and cut and not none, str(r)[:400])
    _, r, c = chat(port)
    full, content = parts(c)
    s.case("no budget: the model never closes its thinking (the budget test can fail)",
           c and full.startswith(cut) and len(full) > len(cut) and not content, str(r)[:400])
    for key in ("reasoning_budget", "reasoning_budget_tokens", "thinking_budget_tokens"):
        _, r, c = chat(port, **{key: N})
        rb, cb = parts(c)
        s.case(f"{key} {N}: the reasoning is the first {N} tokens, then the answer follows",
               rb == cut and cb.strip() != "" and "</think>" not in cb, str(r)[:500])
    _, r, c = chat(port, reasoning_budget=N, logprobs=True)
    toks = [t["token"] for t in (c or {}).get("logprobs", {}).get("content", [])] if c else []
    text = "".join(toks)
    at = text.find("</think>")
    s.case("the close marker comes right after the budget's tokens (token by token)",
           at > 0 and toks and len("".join(toks[:N])) <= at < len("".join(toks[:N + 8])),
           str(toks)[:500])
    _, r, c = chat(port, reasoning_budget=0)
    r0, c0 = parts(c)
    s.case("budget 0: no reasoning, only an answer", r0 == "" and c0.strip() != "", str(r)[:400])
    _, r, c = chat(port, reasoning_budget=-1)
    s.case("budget -1: no limit (as without one)", parts(c) == (full, content), str(r)[:300])
    _, r, c = chat(port, reasoning_budget=5, reasoning_budget_message=" Time is up.")
    rm, cm = parts(c)
    _, _, c5 = chat(port, max_tokens=5)
    s.case("reasoning_budget_message ends the reasoning, before the close marker",
           rm.endswith("Time is up.") and rm.startswith(parts(c5)[0]) and cm.strip() != "",
           str(r)[:400])
    rs, cs = stream(port, reasoning_budget=N)
    s.case("streamed: the deltas add up to the same reasoning and answer",
           rs == cut and cs.strip() != "" and cs.strip() == parts(chat(port, reasoning_budget=N)[2])[1],
           repr((rs, cs))[:400])
    # the Qwen3-style template: the part opens at the generated <think>
    _, r, c = chat(port, "think", grammar=THINK_GRAMMAR, max_tokens=60)
    tfull, tcontent = parts(c)
    _, r2, c2 = chat(port, "think", grammar=THINK_GRAMMAR, max_tokens=60, reasoning_budget=6)
    tb, tc = parts(c2)
    s.case("<think> written by the model: no budget, thinking to the end",
           tfull and not tcontent, str(r)[:300])
    s.case("<think> written by the model: the budget closes it, the answer follows",
           tb and tfull.startswith(tb) and len(tb) < len(tfull) and tc.strip() != "",
           str(r2)[:400])


def batch_cases(port):
    """Two requests at once (one batch with --parallel 2): different budgets each get their own."""
    alone = {b: parts(chat(port, reasoning_budget=b)[2]) for b in (4, 20)}
    alone[None] = parts(chat(port)[2])
    got = {}

    def job(b):
        kw = {} if b is None else {"reasoning_budget": b}
        got[b] = parts(chat(port, **kw)[2])
    for pair in ((4, 20), (4, None)):
        ts = [threading.Thread(target=job, args=(b,)) for b in pair]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        s.case(f"budgets {pair} in one batch: each as alone",
               all(got.get(b) == alone[b] for b in pair), repr(got)[:500])


def error_cases(port):
    for body, param in (({"reasoning_budget": -2}, "reasoning_budget"),
                        ({"reasoning_budget_tokens": "5"}, "reasoning_budget_tokens"),
                        ({"reasoning_budget": 5, "thinking_budget_tokens": 6}, "thinking_budget_tokens"),
                        ({"reasoning_budget": 5, "reasoning_budget_message": 3}, "reasoning_budget_message"),
                        ({"reasoning_budget": 5, "reasoning_budget_message": "x" * 2000},
                         "reasoning_budget_message")):
        st, r, _ = chat(port, **body)
        s.case(f"{json.dumps(body)[:60]} is a 400 naming {param}",
               st == 400 and r["error"]["param"] == param, str(r)[:300])
    st, r, _ = chat(port, "oss", reasoning_budget=5)
    s.case("harmony thinking: a budget is a 400 saying why",
           st == 400 and r["error"]["param"] == "reasoning_budget" and "harmony" in r["error"]["message"],
           str(r)[:300])
    st, r, _ = chat(port, "oss", reasoning_budget=-1, max_tokens=4)
    s.case("harmony thinking: -1 (no limit) is fine", st == 200, str(r)[:300])


def anthropic_cases(port):
    """thinking.budget_tokens (Anthropic's minimum is 1024; this server's context is 1200) is
    enforced: the thinking block is the first 1024 tokens (the OpenAI route's reasoning with
    max_tokens 1024 and no budget, the same prompt), then a text block follows."""
    body = {"model": "r1", "max_tokens": 1100, "temperature": 0, "messages": PROMPT,
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    st, r = http_json(port, "POST", "/v1/messages", body, timeout=120)
    blocks = r.get("content", []) if st == 200 else []
    think = "".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking")
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    _, _, c = chat(port, max_tokens=1024)
    cut, _ = parts(c)
    s.case("anthropic thinking.budget_tokens 1024: thinking = the first 1024 tokens, then text",
           st == 200 and think == cut and text.strip() != "", str(r)[:500])
    _, _, c = chat(port, max_tokens=1100)
    s.case("without the budget the same request would only think",
           parts(c)[1] == "", str(c)[:300])


with tempfile.TemporaryDirectory() as tmp:
    repo = make_repo(tmp)
    srv = RepoServer(repo, "--parallel", "2")
    try:
        for fn in (budget_cases, batch_cases, error_cases):
            s.guard(fn.__name__, lambda fn=fn: fn(srv.port))
    finally:
        rc = srv.stop()
        s.case("server exits cleanly", rc == 0, f"exit {rc}")
    srv = RepoServer(repo, "--parallel", "1", "--ctx-size", "1200")
    try:
        s.guard("anthropic_cases", lambda: anthropic_cases(srv.port))
    finally:
        srv.stop()
    srv = RepoServer(repo, "--parallel", "1", "--reasoning-budget", "12")
    try:
        _, r, c = chat(srv.port, max_tokens=12, reasoning_budget=20)
        cut12, _ = parts(c)
        _, r, c = chat(srv.port)
        s.case("--reasoning-budget 12: the default for requests that set none",
               parts(c)[0] == cut12 and parts(c)[1].strip() != "", str(r)[:300])
        _, r, c = chat(srv.port, reasoning_budget=20)
        s.case("--reasoning-budget: a request's own budget wins",
               len(parts(c)[0]) > len(cut12) and parts(c)[0].startswith(cut12), str(r)[:300])
        st, r, _ = chat(srv.port, "oss", max_tokens=4)
        s.case("--reasoning-budget: harmony models are left without one (no 400)", st == 200, str(r)[:300])
    finally:
        srv.stop()
s.finish()
