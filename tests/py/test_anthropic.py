"""test_anthropic.py - Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens)
against the real server, raw over HTTP: the message object, the stream's event names and order
(message_start, content_block_start, ping, content_block_delta, content_block_stop,
message_delta, message_stop) with each `event:` line matching its data's type, stop reasons
(end_turn, max_tokens, stop_sequence with the sequence named, tool_use), tool_use blocks and a
tool_result round trip, thinking blocks, count_tokens against the usage of a real call, the
error shape ({"type": "error", "error": {"type", "message"}}) from validation, from shared
code (bad key, unknown model, malformed body) and for refused content (image, document), keys
given as x-api-key or Bearer mapped to the tenants, a tenant's token quota (429
rate_limit_error), an error after the stream started (an `event: error`), and the same metrics
and access log as the OpenAI routes. Then the official @anthropic-ai/sdk (tests/node/anthropic.test.mjs), when node
is there.

The demo model is a tiny story model; a GBNF `grammar` (Sampan's extension field) makes it write
exactly a given text, and a repository model carries a ChatML template with <think> and
<tool_call> markup, so reasoning and tool calls are parsed as for a downloaded model.
"""
import http.client
import json
import os
import re
import tempfile

from common import Server, Suite, binary, chat_repository, grammar_literal, keys_add, node_suite

s = Suite("anthropic")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

CHATML = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
          "\n</think>\n\n{% endif %}{% if m.content %}{{ m.content }}{% endif %}"
          "{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>\n{{ tc.function | tojson }}"
          "\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "additionalProperties": False,
                            "required": ["city"],
                            "properties": {"city": {"type": "string", "maxLength": 12}}}}


lit = grammar_literal


def post(port, path, body, key, header="x-api-key", raw=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        h = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
        if key is not None:
            h[header] = key if header == "x-api-key" else f"Bearer {key}"
        c.request("POST", path, body=raw if raw is not None else json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, r.getheader("content-type") or "", data
    finally:
        c.close()


def msg(port, key, **kw):
    body = dict({"model": "chat", "max_tokens": 16, "temperature": 0,
                 "messages": [{"role": "user", "content": "Hi"}]}, **kw)
    st, _, data = post(port, "/v1/messages", body, key)
    try:
        return st, json.loads(data)
    except ValueError:
        return st, data


def events(port, key, **kw):
    """A streamed call: (status, [(event line, data object)])."""
    body = dict({"model": "chat", "max_tokens": 16, "temperature": 0, "stream": True,
                 "messages": [{"role": "user", "content": "Hi"}]}, **kw)
    st, ctype, data = post(port, "/v1/messages", body, key)
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame.strip():
            continue
        name = re.search(r"^event: (.*)$", frame, re.M)
        d = re.search(r"^data: (.*)$", frame, re.M)
        out.append((name.group(1) if name else None, json.loads(d.group(1)) if d else None))
    return st, ctype, out


def is_error(st, b, status, etype):
    return (st == status and isinstance(b, dict) and b.get("type") == "error" and
            b.get("error", {}).get("type") == etype and isinstance(b["error"].get("message"), str))


def shape_checks(port, key):
    st, r = msg(port, key)
    s.case("a message: id msg_..., type message, role assistant, text block, usage",
           st == 200 and r["id"].startswith("msg_") and r["type"] == "message" and
           r["role"] == "assistant" and r["model"] == "chat" and r["content"][0]["type"] == "text" and
           r["stop_reason"] in ("end_turn", "max_tokens") and r["stop_sequence"] is None and
           r["usage"]["input_tokens"] > 0 and 0 < r["usage"]["output_tokens"] <= 16, str(r)[:300])
    st, ctype, evs = events(port, key)
    names = [n for n, _ in evs]
    text = "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta")
    s.case("stream: text/event-stream, each event line names its data's type",
           st == 200 and ctype.startswith("text/event-stream") and
           all(d is not None and d["type"] == n for n, d in evs), str(evs)[:300])
    want = ["message_start", "content_block_start", "ping"]
    s.case("stream: message_start, content_block_start, ping, deltas, content_block_stop, "
           "message_delta, message_stop",
           names[:3] == want and set(names[3:-3]) == {"content_block_delta"} and
           names[-3:] == ["content_block_stop", "message_delta", "message_stop"], str(names))
    md = evs[-2][1] if len(evs) >= 2 else {}
    s.case("stream: the same text and usage as the one-shot answer (greedy)",
           text == r["content"][0]["text"] and
           evs[0][1]["message"]["usage"]["input_tokens"] == r["usage"]["input_tokens"] and
           md.get("usage", {}).get("output_tokens") == r["usage"]["output_tokens"] and
           md.get("delta", {}).get("stop_reason") == r["stop_reason"], f"{text!r} {md}")
    # stop reasons
    st, r = msg(port, key, grammar=lit("Hello world. Bye."), stop_sequences=["zzz", "world"],
                max_tokens=40)
    s.case("stop_sequences: the text stops before it; stop_reason stop_sequence names it",
           st == 200 and r["content"][0]["text"] == "Hello " and
           r["stop_reason"] == "stop_sequence" and r["stop_sequence"] == "world", str(r)[:300])
    st, _, evs = events(port, key, grammar=lit("Hello world. Bye."), stop_sequences=["world"],
                        max_tokens=40)
    md = [d for n, d in evs if n == "message_delta"]
    s.case("stream: message_delta carries stop_sequence",
           md and md[0]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "world"},
           str(md))
    st, r = msg(port, key, grammar=lit("Hello world. Bye."), max_tokens=40)
    s.case("the end of the text: end_turn", st == 200 and r["stop_reason"] == "end_turn" and
           r["content"][0]["text"] == "Hello world. Bye.", str(r)[:200])
    st, r = msg(port, key, grammar=lit("Hello world. Bye."), max_tokens=2)
    s.case("max_tokens reached: stop_reason max_tokens, output_tokens 2",
           st == 200 and r["stop_reason"] == "max_tokens" and r["usage"]["output_tokens"] == 2,
           str(r)[:200])
    # a job that fails after the stream started (its deadline, Sampan's `timeout` in ms)
    st, _, evs = events(port, key, max_tokens=400, timeout=5)
    last = evs[-1] if evs else (None, None)
    s.case("an error after the stream started: an `event: error` in Anthropic's shape ends it",
           st == 200 and last[0] == "error" and is_error(200, last[1], 200, "overloaded_error") and
           "deadline" in last[1]["error"]["message"] and "message_stop" not in [n for n, _ in evs],
           str(evs[-2:])[:300])
    # system as blocks, and count_tokens against the real prompt
    conv = dict(system=[{"type": "text", "text": "Be brief."}],
                messages=[{"role": "user", "content": [{"type": "text", "text": "One"},
                                                       {"type": "text", "text": " two"}]}])
    st, r = msg(port, key, **conv)
    st2, _, data = post(port, "/v1/messages/count_tokens", dict(model="chat", **conv), key)
    c = json.loads(data) if st2 == 200 else {}
    st3, r3 = msg(port, key, messages=conv["messages"])
    s.case("count_tokens: input_tokens equals the usage of the same call; the system counts",
           st == st2 == 200 and c == {"input_tokens": r["usage"]["input_tokens"]} and
           r3["usage"]["input_tokens"] < c["input_tokens"], f"{c} {r.get('usage')} {r3.get('usage')}")


def tool_checks(port, key):
    st, r = msg(port, key, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                max_tokens=60, messages=[{"role": "user", "content": "Weather in Paris?"}])
    blk = [b for b in r.get("content", []) if b.get("type") == "tool_use"] if st == 200 else []
    s.case("tool_choice tool: a tool_use block (toolu_ id, name, input per the schema), "
           "stop_reason tool_use",
           len(blk) == 1 and blk[0]["id"].startswith("toolu_") and blk[0]["name"] == "get_weather"
           and isinstance(blk[0]["input"].get("city"), str) and len(blk[0]["input"]["city"]) <= 12
           and set(blk[0]["input"]) == {"city"} and r["stop_reason"] == "tool_use"
           and r["stop_sequence"] is None, str(r)[:400])
    if not blk:
        return
    turns = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": r["content"]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": blk[0]["id"],
                                           "content": "21 C and sunny"}]}]
    st2, r2 = msg(port, key, tools=[WEATHER], messages=turns, max_tokens=8)
    st3, _, c = post(port, "/v1/messages/count_tokens",
                     {"model": "chat", "tools": [WEATHER], "messages": turns}, key)
    st4, _, c4 = post(port, "/v1/messages/count_tokens",
                      {"model": "chat", "tools": [WEATHER], "messages": turns[:1]}, key)
    s.case("tool_result round trip: a text answer; the call and its result are in the prompt",
           st2 == 200 and r2["content"][0]["type"] == "text" and st3 == st4 == 200 and
           json.loads(c)["input_tokens"] == r2["usage"]["input_tokens"] >
           json.loads(c4)["input_tokens"] + 10, f"{r2} {c} {c4}")
    st, _, evs = events(port, key, tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=60,
                        messages=[{"role": "user", "content": "Weather?"}])
    starts = [d["content_block"] for n, d in evs if n == "content_block_start"]
    js = "".join(d["delta"]["partial_json"] for n, d in evs
                 if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    md = [d for n, d in evs if n == "message_delta"]
    s.case("stream: a tool_use block, input {} at its start, the input in input_json_delta",
           st == 200 and starts and starts[-1]["type"] == "tool_use" and starts[-1]["input"] == {}
           and isinstance(json.loads(js or "null"), dict) and md and
           md[0]["delta"]["stop_reason"] == "tool_use", str(evs)[:500])
    # the calls the model writes itself (auto), two of them; disable_parallel_tool_use keeps one
    two = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    st, r = msg(port, key, tools=[WEATHER], grammar=lit(two), max_tokens=300)
    st2, r2 = msg(port, key, tools=[WEATHER], grammar=lit(two), max_tokens=300,
                  tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    s.case("auto: the model's own calls are tool_use blocks; disable_parallel_tool_use keeps one",
           st == st2 == 200 and [b["input"]["city"] for b in r["content"]] == ["Paris", "Rome"] and
           [b["input"]["city"] for b in r2["content"]] == ["Paris"], f"{r} {r2}"[:500])
    fn = {"type": "function", "function": {"name": WEATHER["name"],
                                           "parameters": WEATHER["input_schema"]}}
    oai = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "tools": [fn],
           "grammar": lit(two), "max_tokens": 300, "temperature": 0}
    st, _, d1 = post(port, "/v1/chat/completions", oai, key)
    st2, _, d2 = post(port, "/v1/chat/completions", dict(oai, parallel_tool_calls=False), key)
    st3, _, d3 = post(port, "/v1/chat/completions", dict(oai, parallel_tool_calls="no"), key)
    n1 = len(json.loads(d1)["choices"][0]["message"]["tool_calls"]) if st == 200 else 0
    n2 = len(json.loads(d2)["choices"][0]["message"]["tool_calls"]) if st2 == 200 else 0
    s.case("the same hook on OpenAI's route: parallel_tool_calls false keeps one call; "
           "a non-boolean is a 400", (n1, n2, st3) == (2, 1, 400), f"{n1} {n2} {st3} {d3[:200]}")
    st, r = msg(port, key, tools=[WEATHER], grammar=lit(two), max_tokens=300,
                tool_choice={"type": "none"})
    s.case("tool_choice none: the markup stays text, no tool_use",
           st == 200 and [b["type"] for b in r["content"]] == ["text"] and
           r["stop_reason"] == "end_turn", str(r)[:300])


def thinking_checks(port, key):
    think = "<think>\nI add two and two.\n</think>\n\nFour."
    on = {"type": "enabled", "budget_tokens": 1024}
    st, r = msg(port, key, grammar=lit(think), max_tokens=2000, thinking=on)
    s.case("thinking enabled: a thinking block, then the text",
           st == 200 and [b["type"] for b in r["content"]] == ["thinking", "text"] and
           r["content"][0]["thinking"] == "I add two and two." and r["content"][1]["text"] == "Four.",
           str(r)[:300])
    st, r = msg(port, key, grammar=lit(think), max_tokens=2000)
    s.case("thinking not enabled: no thinking block, the text alone",
           st == 200 and r["content"] == [{"type": "text", "text": "Four."}], str(r)[:300])
    st, _, evs = events(port, key, grammar=lit(think), max_tokens=2000, thinking=on)
    starts = [(d["index"], d["content_block"]["type"]) for n, d in evs if n == "content_block_start"]
    stops = [d["index"] for n, d in evs if n == "content_block_stop"]
    th = "".join(d["delta"].get("thinking", "") for n, d in evs if n == "content_block_delta")
    tx = "".join(d["delta"].get("text", "") for n, d in evs if n == "content_block_delta")
    s.case("stream: thinking_delta in block 0, text_delta in block 1, each stopped",
           st == 200 and starts == [(0, "thinking"), (1, "text")] and stops == [0, 1] and
           th == "I add two and two." and tx == "Four.", str(evs)[:500])
    st, r = msg(port, key, grammar=lit(think), max_tokens=1000,
                thinking={"type": "enabled", "budget_tokens": 1000})
    s.case("thinking.budget_tokens under 1024: 400", is_error(st, r, 400, "invalid_request_error")
           and "budget_tokens" in r["error"]["message"], str(r)[:300])
    st, r = msg(port, key, max_tokens=1500, thinking={"type": "enabled", "budget_tokens": 1500})
    s.case("thinking.budget_tokens not under max_tokens: 400",
           is_error(st, r, 400, "invalid_request_error"), str(r)[:300])


def error_checks(port, key):
    st, _, data = post(port, "/v1/messages", {"model": "chat", "messages": [
        {"role": "user", "content": "x"}]}, key)
    b = json.loads(data)
    s.case("max_tokens missing: 400 in Anthropic's shape",
           is_error(st, b, 400, "invalid_request_error") and "max_tokens" in b["error"]["message"],
           str(b))
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    st, b = msg(port, key, messages=[{"role": "user", "content": [img, {"type": "text", "text": "?"}]}])
    s.case("an image block: 400 that says images are not supported",
           is_error(st, b, 400, "invalid_request_error") and "image" in b["error"]["message"], str(b))
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    st, b = msg(port, key, messages=[{"role": "user", "content": [doc]}])
    s.case("a document block: 400", is_error(st, b, 400, "invalid_request_error") and
           "document" in b["error"]["message"], str(b))
    st, b = msg(port, key, tools=[{"type": "web_search_20250305", "name": "web_search"}])
    s.case("a server tool: 400", is_error(st, b, 400, "invalid_request_error") and
           "server tools" in b["error"]["message"], str(b))
    st, b = msg(port, key, temperature=1.5)
    s.case("temperature over 1 (Anthropic's range): 400",
           is_error(st, b, 400, "invalid_request_error") and "temperature" in b["error"]["message"],
           str(b))
    st, b = msg(port, key, messages=[{"role": "user", "content": "a"},
                                      {"role": "assistant", "content": "b"}])
    s.case("an assistant prefill last: 400 (not silently answered as a new turn)",
           is_error(st, b, 400, "invalid_request_error") and "prefill" in b["error"]["message"], str(b))
    st, b = msg(port, key, model="nope")
    s.case("an unknown model: 404 not_found_error", is_error(st, b, 404, "not_found_error"), str(b))
    st, _, data = post(port, "/v1/messages", None, key, raw=b"{not json")
    s.case("a malformed body: 400 in Anthropic's shape",
           is_error(st, json.loads(data), 400, "invalid_request_error"), data[:200])
    st, _, data = post(port, "/v1/messages", {"model": "chat", "max_tokens": 4, "messages": [
        {"role": "user", "content": "x"}]}, "sk-wrong")
    s.case("a wrong x-api-key: 401 authentication_error",
           is_error(st, json.loads(data), 401, "authentication_error"), data[:200])
    st, _, data = post(port, "/v1/messages", {"model": "chat", "max_tokens": 4, "messages": [
        {"role": "user", "content": "x"}]}, key, header="authorization")
    s.case("the key as Authorization: Bearer works too", st == 200, data[:200])
    st, _, data = post(port, "/v1/chat/completions", {"model": "nope", "messages": [
        {"role": "user", "content": "x"}]}, key)
    b = json.loads(data)
    s.case("the OpenAI routes keep OpenAI's error shape", st == 404 and "type" not in b and
           b["error"].get("code") == "model_not_found", str(b))


def node_sdk(port, key):
    node_suite(s, "anthropic.test.mjs", "node-anthropic", "@anthropic-ai/sdk", {"SAMPAN_PORT": str(port), "SAMPAN_KEY": key})


with tempfile.TemporaryDirectory() as tmp:
    tenants = os.path.join(tmp, "tenants.json")
    key = keys_add(tenants, "acme", "--scopes", "infer,metrics")
    key_tpm = keys_add(tenants, "tiny", "--tpm", "60")
    repo = chat_repository(tmp, CHATML)
    srv = Server("--tenants", tenants, "--model-repository", repo, "--parallel", "2",
                 "--log-requests", "all", model=None)
    try:
        s.guard("shapes", shape_checks, srv.port, key)
        s.guard("tools", tool_checks, srv.port, key)
        s.guard("thinking", thinking_checks, srv.port, key)
        s.guard("errors", error_checks, srv.port, key)
        s.guard("sdk", node_sdk, srv.port, key)
        body = {"model": "chat", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
        st, _, data = post(srv.port, "/v1/messages", body, key_tpm)
        st2, _, data2 = post(srv.port, "/v1/messages", dict(body, max_tokens=4), key_tpm)
        s.case("the tenant's token quota: 429 rate_limit_error in Anthropic's shape; within it, 200",
               is_error(st, json.loads(data), 429, "rate_limit_error") and st2 == 200,
               f"{st} {data[:300]} {st2}")
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
        c.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"})
        metrics = c.getresponse().read().decode()
        c.close()
        ok = re.search(r'sampan_request_success_total\{model="chat"[^}]*\} (\d+)', metrics)
        s.case("the requests are in the model's metrics", ok is not None and int(ok.group(1)) >= 10,
               ok.group(0) if ok else metrics[:300])
        s.case("the access log names the route, tenant and model",
               srv.wait_log(r"event=request .*path=\"?/v1/messages\"? status=200 .*tenant=acme .*"
                            r"model=\"?chat") is not None,
               "".join(l for l in srv.log if "/v1/messages" in l)[-400:])
    finally:
        srv.stop()
s.finish()
