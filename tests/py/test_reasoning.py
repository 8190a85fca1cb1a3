"""test_reasoning.py - reasoning_content and tool calls per template family, against the real
server. The demo model is a tiny story model; a GBNF `grammar` makes it write exactly the text a
reasoning model of each family writes (its vocabulary spells any bytes), and each model of a
small repository carries a chat template of one family, so the server picks the family from
the template as it would for a downloaded model:

- <think> (Qwen3-style): reasoning_content apart, in the answer and in streamed deltas (no
  content delta ever holds part of a tag); reasoning_format "none" keeps it inline; a prompt
  ending inside <think> (DeepSeek-R1-style) starts the answer in the thinking;
- tool calls after thinking (Hermes), gpt-oss harmony channels (analysis, final, a call to
  functions.NAME), Qwen3-Coder XML with typed parameters; an unparseable call stays content;
- the server flag --reasoning-format none;
- the official `openai` npm SDK reads reasoning_content and tool_calls unchanged
  (tests/node/reasoning.test.mjs), when node is there.
"""
import json
import os
import re
import shutil
import tempfile

from common import ROOT, RepoServer, Suite, binary, http_json, run

s = Suite("reasoning")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

DEMO = os.path.join(ROOT, "models", "stories260K.gguf")

CHATML = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
          "\n</think>\n\n{% endif %}{% if m.content %}{{ m.content }}{% endif %}"
          "{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>\n{{ tc.function | tojson }}"
          "\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}")
TEMPLATES = {
    # Qwen3-style: thinking in <think>, calls in <tool_call>
    "think": CHATML + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    # DeepSeek-R1 / QwQ-style: the generation prompt opens the thinking
    "r1": CHATML + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
    # gpt-oss harmony
    "oss": ("{%- for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>"
            "final<|message|>{{ m.content }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>"
            "{{ m.content }}<|end|>{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|start|>assistant{% endif %}"),
    # Qwen3-Coder XML calls
    "coder": ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
              "{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>\n<function="
              "{{ tc.function.name }}>\n<parameter=args>\n{{ tc.function.arguments }}\n</parameter>"
              "\n</function>\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}


def lit(text):
    """A GBNF grammar whose only sentence is text."""
    return "root ::= " + json.dumps(text)


def make_repo(tmp):
    repo = os.path.join(tmp, "repo")
    for name, tpl in TEMPLATES.items():
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(DEMO, os.path.join(repo, name, "1", "model.gguf"))
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump({"name": name, "backend": "llm",
                       "parameters": {"chat_template": {"string_value": tpl}}}, f)
    return repo


def chat(port, model, text, **kw):
    body = dict({"model": model, "messages": [{"role": "user", "content": "What is 2+2?"}],
                 "grammar": lit(text), "max_tokens": 400, "temperature": 0}, **kw)
    return http_json(port, "POST", "/v1/chat/completions", body, timeout=60)


def stream(port, model, text, **kw):
    import http.client
    body = dict({"model": model, "messages": [{"role": "user", "content": "What is 2+2?"}],
                 "grammar": lit(text), "max_tokens": 400, "temperature": 0, "stream": True}, **kw)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    out = []
    for line in raw.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                out.append(dict(ch.get("delta", {}), _finish=ch.get("finish_reason")))
    return r.status, out


def joined(ds, key):
    return "".join(d[key] for d in ds if isinstance(d.get(key), str))


THINK = "<think>\nI add two and two.\n</think>\n\nFour."


def think_cases(port):
    st, r = chat(port, "think", THINK)
    m = r["choices"][0]["message"] if st == 200 else {}
    s.case("<think>: reasoning_content apart from content",
           m.get("reasoning_content") == "I add two and two." and m.get("content") == "Four."
           and r["choices"][0]["finish_reason"] == "stop", str(r)[:400])
    st, ds = stream(port, "think", THINK)
    contents = [d["content"] for d in ds if isinstance(d.get("content"), str)]
    s.case("<think> streamed: reasoning_content and content deltas add up",
           st == 200 and joined(ds, "reasoning_content") == "I add two and two."
           and "".join(contents) == "Four." and ds[-1]["_finish"] == "stop", str(ds)[:600])
    s.case("<think> streamed: no content delta holds a tag or part of one",
           all("<" not in c and ">" not in c for c in contents) and len(contents) >= 1, str(contents))
    st, r = chat(port, "think", THINK, reasoning_format="none")
    m = r["choices"][0]["message"] if st == 200 else {}
    s.case("reasoning_format none keeps the thinking in content",
           m.get("content") == THINK and "reasoning_content" not in m, str(r)[:400])
    st, ds = stream(port, "think", THINK, reasoning_format="none")
    s.case("reasoning_format none streamed: the raw text",
           joined(ds, "content") == THINK and joined(ds, "reasoning_content") == "", str(ds)[:400])
    st, r = chat(port, "think", THINK, reasoning_format="thoughts")
    s.case("a bad reasoning_format is a 400 naming it",
           st == 400 and r["error"]["param"] == "reasoning_format", str(r)[:300])
    st, r = chat(port, "r1", "I add.\n</think>\n\nFour.")
    m = r["choices"][0]["message"] if st == 200 else {}
    s.case("a prompt ending in <think> starts the answer in the thinking",
           m.get("reasoning_content") == "I add." and m.get("content") == "Four.", str(r)[:400])
    # a cut at the budget: the thinking so far
    st, r = chat(port, "think", THINK, max_tokens=16)
    m = r["choices"][0]["message"] if st == 200 else {}
    rc = m.get("reasoning_content") or ""
    s.case("thinking cut by max_tokens is reasoning_content, finish length",
           r["choices"][0]["finish_reason"] == "length" and not m.get("content")
           and rc and "I add two and two.".startswith(rc), str(r)[:400])


CALL = ('<think>\nCall it.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>')


def tool_cases(port):
    st, r = chat(port, "think", CALL, tools=[WEATHER])
    c = r["choices"][0] if st == 200 else {}
    m = c.get("message", {})
    call = (m.get("tool_calls") or [{}])[0]
    s.case("thinking then a Hermes call: reasoning_content, tool_calls, content null",
           c.get("finish_reason") == "tool_calls" and m.get("content") is None
           and m.get("reasoning_content") == "Call it."
           and call.get("type") == "function" and call["function"]["name"] == "get_weather"
           and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
           and call["id"].startswith("call_"), str(r)[:500])
    st, ds = stream(port, "think", CALL, tools=[WEATHER])
    tcs = [t for d in ds for t in (d.get("tool_calls") or [])]
    args = "".join(t.get("function", {}).get("arguments", "") for t in tcs)
    s.case("streamed: reasoning deltas, then tool_call deltas, finish tool_calls",
           joined(ds, "reasoning_content") == "Call it." and joined(ds, "content") == ""
           and tcs and tcs[0]["function"]["name"] == "get_weather"
           and json.loads(args) == {"city": "Paris"} and ds[-1]["_finish"] == "tool_calls",
           str(ds)[:600])
    bad = '<tool_call>\n{"name": get_weather}\n</tool_call>'
    st, r = chat(port, "think", bad, tools=[WEATHER])
    c = r["choices"][0] if st == 200 else {}
    s.case("an unparseable call stays content (finish stop, no tool_calls)",
           c.get("message", {}).get("content") == bad and "tool_calls" not in c.get("message", {})
           and c.get("finish_reason") == "stop", str(r)[:400])
    xml = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
    st, r = chat(port, "coder", "Looking.\n" + xml, tools=[WEATHER])
    c = r["choices"][0] if st == 200 else {}
    call = (c.get("message", {}).get("tool_calls") or [{}])[0]
    s.case("Qwen3-Coder XML call, parameters typed by the tool's schema",
           c.get("finish_reason") == "tool_calls" and c["message"]["content"] == "Looking.\n"
           and json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3},
           str(r)[:500])
    # a forced call in a family whose markers a grammar cannot write: the grammar's form, parsed
    body = {"model": "coder", "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [WEATHER], "tool_choice": "required", "max_tokens": 120, "seed": 1}
    st, r = http_json(port, "POST", "/v1/chat/completions", body, timeout=60)
    c = r["choices"][0] if st == 200 else {}
    call = (c.get("message", {}).get("tool_calls") or [{}])[0]
    s.case("tool_choice required under a Qwen3-Coder template: the forced call is parsed",
           c.get("finish_reason") == "tool_calls" and call["function"]["name"] == "get_weather"
           and isinstance(json.loads(call["function"]["arguments"]), dict), str(r)[:500])


HARMONY = ("<|channel|>analysis<|message|>Simple sum.<|end|><|start|>assistant<|channel|>final"
           "<|message|>2 + 2 = 4.")
HARMONY_CALL = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
                "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}")


def harmony_cases(port):
    st, r = chat(port, "oss", HARMONY)
    m = r["choices"][0]["message"] if st == 200 else {}
    s.case("harmony: analysis channel is reasoning_content, final is content",
           m.get("reasoning_content") == "Simple sum." and m.get("content") == "2 + 2 = 4.",
           str(r)[:400])
    st, ds = stream(port, "oss", HARMONY)
    s.case("harmony streamed: no channel markup in any delta",
           joined(ds, "reasoning_content") == "Simple sum." and joined(ds, "content") == "2 + 2 = 4."
           and all("<|" not in (d.get("content") or "") for d in ds), str(ds)[:500])
    st, r = chat(port, "oss", HARMONY_CALL, tools=[WEATHER])
    c = r["choices"][0] if st == 200 else {}
    call = (c.get("message", {}).get("tool_calls") or [{}])[0]
    s.case("harmony: a commentary message to functions.NAME is a tool call",
           c.get("finish_reason") == "tool_calls" and c["message"]["reasoning_content"] == "Need weather."
           and call["function"]["name"] == "get_weather"
           and json.loads(call["function"]["arguments"]) == {"city": "Paris"}, str(r)[:500])


def node_sdk(port):
    if shutil.which("node") is None:
        s.skip("openai SDK reasoning", "node is not installed")
        return
    node_dir = os.path.join(ROOT, "tests", "node")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        s.skip("openai SDK reasoning", "tests/node/node_modules missing (npm ci)")
        return
    rc, out, err = run(["node", os.path.join(node_dir, "reasoning.test.mjs")], timeout=90,
                       env={"SAMPAN_PORT": str(port)})
    print(out, end="")
    m = re.search(r"node-reasoning: (\d+) passed, (\d+) failed", out)
    if not m:
        s.case("openai SDK reasoning ran", False, (out + err)[-600:])
    else:
        s.passed += int(m.group(1))
        s.failed += int(m.group(2))


with tempfile.TemporaryDirectory() as tmp:
    repo = make_repo(tmp)
    srv = RepoServer(repo, "--parallel", "2")
    try:
        s.case("the families read from the templates are logged",
               srv.wait_log(r"model=\"?oss\"? .*tool_calls=harmony reasoning=harmony") is not None
               and srv.wait_log(r"model=\"?coder\"? .*tool_calls=qwen3-coder reasoning=none")
               is not None, srv.text()[-1500:])
        for fn in (think_cases, tool_cases, harmony_cases, node_sdk):
            s.guard(fn.__name__, lambda fn=fn: fn(srv.port))
    finally:
        rc = srv.stop()
        s.case("server exits cleanly", rc == 0, f"exit {rc}")
    srv = RepoServer(repo, "--parallel", "1", "--reasoning-format", "none")
    try:
        st, r = chat(srv.port, "think", THINK)
        s.case("--reasoning-format none: the thinking stays in content",
               st == 200 and r["choices"][0]["message"]["content"] == THINK, str(r)[:300])
        st, r = chat(srv.port, "think", THINK, reasoning_format="auto")
        s.case("the request's reasoning_format overrides the flag",
               st == 200 and r["choices"][0]["message"].get("reasoning_content") == "I add two and two.",
               str(r)[:300])
    finally:
        srv.stop()
    rc, out, err = run([binary(), "serve", "--reasoning-format", "bogus", "--port", "0"], timeout=20)
    s.case("--reasoning-format bogus is refused", rc != 0 and "--reasoning-format: unknown value 'bogus'" in (out + err),
           (out + err)[-300:])
s.finish()
