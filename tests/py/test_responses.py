"""test_responses.py - OpenAI's Responses API (POST /v1/responses, GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items with limit, order and after) against the real server, raw over HTTP: the stream's events in their
documented order with each `event:` line matching its data's type and sequence_number counting
from 0, a reasoning output item from <think> markup, store false (nothing kept), stored
responses per tenant (another tenant's id is 404, for GET, DELETE and previous_response_id), the
store's bound (--responses-store: the oldest evicted), a chain of previous_response_id whose
conversation reaches the prompt, the errors (OpenAI's shape) for refused tools, parts and
fields, and the same metrics and access log as the other routes. Then the official `openai` SDK
(tests/node/responses.test.mjs), when node is there.

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

s = Suite("responses")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

CHATML = ("{%- if reasoning_effort == 'high' %}Think very hard about every single word.{% endif %}"
          "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
          "\n</think>\n\n{% endif %}{% if m.content %}{{ m.content }}{% endif %}"
          "{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>\n{{ tc.function | tojson }}"
          "\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
STORE_MAX = 4  # --responses-store: small, so the test sees the oldest evicted


lit = grammar_literal


def call(port, method, path, body, key):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        h = {"Content-Type": "application/json"}
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        c.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=h)
        r = c.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data
    finally:
        c.close()


def create(port, key, **kw):
    body = dict({"model": "chat", "input": "Hi", "temperature": 0, "max_output_tokens": 16}, **kw)
    return call(port, "POST", "/v1/responses", body, key)


def events(port, key, **kw):
    """A streamed call: (status, [(event line, data object)])."""
    body = dict({"model": "chat", "input": "Hi", "temperature": 0, "max_output_tokens": 16,
                 "stream": True}, **kw)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/responses", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    out = []
    for frame in data.split("\n\n"):
        if not frame.strip():
            continue
        name = re.search(r"^event: (.*)$", frame, re.M)
        d = re.search(r"^data: (.*)$", frame, re.M)
        out.append((name.group(1) if name else None, json.loads(d.group(1)) if d else None))
    return r.status, out


def is_error(st, b, status, param=None, word=None):
    e = b.get("error") if isinstance(b, dict) else None
    return (st == status and isinstance(e, dict) and isinstance(e.get("message"), str) and
            (param is None or e.get("param") == param) and
            (word is None or word in e["message"]))


def stream_checks(port, key):
    st, evs = events(port, key, grammar=lit("One two three."), max_output_tokens=40)
    names = [n for n, _ in evs]
    s.case("stream: each event line names its data's type; sequence_number 0, 1, 2, ...",
           st == 200 and all(d is not None and d["type"] == n for n, d in evs) and
           [d["sequence_number"] for _, d in evs] == list(range(len(evs))), str(evs)[:300])
    head = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done",
            "response.output_item.done", "response.completed"]
    s.case("stream: created, in_progress, item added, part added, text deltas, text done, part "
           "done, item done, completed",
           names[:4] == head and names[-4:] == tail and len(names) > 8 and
           set(names[4:-4]) == {"response.output_text.delta"}, str(names))
    text = "".join(d["delta"] for n, d in evs if n == "response.output_text.delta")
    fin = evs[-1][1]["response"] if evs else {}
    st2, one = create(port, key, grammar=lit("One two three."), max_output_tokens=40)
    s.case("stream: the same text, status and usage as the one-shot answer; the same item ids "
           "in its events",
           text == "One two three." and fin["output"][0]["content"][0]["text"] == text and
           st2 == 200 and one["output"][0]["content"][0]["text"] == text and
           fin["usage"] == one["usage"] and fin["status"] == one["status"] == "completed" and
           len({d.get("item_id") for n, d in evs if "item_id" in d}) == 1 and
           evs[2][1]["item"]["id"] == fin["output"][0]["id"], f"{text!r} {fin} {one}"[:500])
    st, r = call(port, "GET", f"/v1/responses/{fin.get('id')}", None, key)
    s.case("a streamed response is stored: GET gives the completed response",
           st == 200 and r == fin, str(r)[:300])
    # reasoning: <think> markup becomes a reasoning item before the message
    think = "<think>\nI add two and two.\n</think>\n\nFour."
    st, r = create(port, key, grammar=lit(think), max_output_tokens=200,
                   reasoning={"effort": "low", "summary": "auto"})
    types = [o["type"] for o in r.get("output", [])] if st == 200 else []
    s.case("reasoning: a reasoning item (the text, and as its summary), then the message",
           types == ["reasoning", "message"] and
           r["output"][0]["content"][0]["text"] == "I add two and two." and
           r["output"][0]["summary"][0]["text"] == "I add two and two." and
           r["output"][1]["content"][0]["text"] == "Four." and
           r["reasoning"] == {"effort": "low", "summary": "auto"}, str(r)[:400])
    st, lo = create(port, key, reasoning={"effort": "low"}, max_output_tokens=1)
    st2, hi = create(port, key, reasoning={"effort": "high"}, max_output_tokens=1)
    s.case("reasoning.effort reaches the template as reasoning_effort (its 'high' branch adds to "
           "the prompt)", st == st2 == 200 and
           hi["usage"]["input_tokens"] > lo["usage"]["input_tokens"] + 5,
           f"{lo.get('usage')} {hi.get('usage')}")
    st, evs = events(port, key, grammar=lit(think), max_output_tokens=200)
    names = [n for n, _ in evs]
    rs = "".join(d["delta"] for n, d in evs if n == "response.reasoning_text.delta")
    added = [d["item"]["type"] for n, d in evs if n == "response.output_item.added"]
    s.case("stream: reasoning_text deltas in item 0, then output_text deltas in item 1",
           st == 200 and rs == "I add two and two." and added == ["reasoning", "message"] and
           names.index("response.reasoning_text.done") < names.index("response.output_text.delta"),
           str(names))
    # an error after the stream started (its deadline, Sampan's `timeout` in ms)
    st, evs = events(port, key, max_output_tokens=400, timeout=5)
    last = evs[-1] if evs else (None, None)
    s.case("an error after the stream started: response.failed ends it, with the error",
           st == 200 and last[0] == "response.failed" and last[1]["response"]["status"] == "failed"
           and "deadline" in last[1]["response"]["error"]["message"] and
           "response.completed" not in [n for n, _ in evs], str(evs[-2:])[:300])


def store_checks(port, key, key2):
    st, r = create(port, key, store=False)
    st2, g = call(port, "GET", f"/v1/responses/{r.get('id')}", None, key)
    st3, c = create(port, key, previous_response_id=r.get("id"))
    s.case("store false: answered, then GET 404 and previous_response_id 404 (OpenAI's shape)",
           st == 200 and r["store"] is False and is_error(st2, g, 404) and
           is_error(st3, c, 404, "previous_response_id", "not found"), f"{g} {c}"[:300])
    st, r = create(port, key, input="The cat sat on the mat and looked at the dog.")
    rid = r.get("id")
    st2, other = call(port, "GET", f"/v1/responses/{rid}", None, key2)
    st3, d = call(port, "DELETE", f"/v1/responses/{rid}", None, key2)
    st4, c = create(port, key2, previous_response_id=rid)
    st5, mine = call(port, "GET", f"/v1/responses/{rid}", None, key)
    s.case("per tenant: another tenant's GET, DELETE and previous_response_id are 404; the "
           "owner still has it",
           st == 200 and is_error(st2, other, 404) and is_error(st3, d, 404) and
           is_error(st4, c, 404, "previous_response_id") and st5 == 200 and mine == r,
           f"{st2} {st3} {st4} {st5}")
    # a chain: each turn's prompt holds the earlier input and output
    st, r2 = create(port, key, previous_response_id=rid, input="And then?")
    st2, r3 = create(port, key, previous_response_id=r2.get("id"), input="And then?")
    st3, alone = create(port, key, input="And then?")
    s.case("previous_response_id: the stored conversation is prepended (the prompt grows by "
           "the earlier turns)",
           st == st2 == st3 == 200 and r2["previous_response_id"] == rid and
           r3["usage"]["input_tokens"] > r2["usage"]["input_tokens"] >
           alone["usage"]["input_tokens"] + 10, f"{r2.get('usage')} {r3.get('usage')} {alone.get('usage')}")
    # input_items: the conversation's input (the chain's earlier input and output, then its own)
    st, li = call(port, "GET", f"/v1/responses/{r3['id']}/input_items?order=asc&limit=100", None, key)
    data = li.get("data", []) if st == 200 else []
    texts = [(i.get("type"), i.get("role"), (i.get("content") or [{}])[0].get("text")) for i in data]
    want = [("message", "user", "The cat sat on the mat and looked at the dog."),
            ("message", "assistant", r["output"][0]["content"][0]["text"]),
            ("message", "user", "And then?"),
            ("message", "assistant", r2["output"][0]["content"][0]["text"]),
            ("message", "user", "And then?")]
    ids = [i.get("id") for i in data]
    s.case("input_items (asc): the chain's items in order, each with an id, OpenAI's list shape",
           st == 200 and li["object"] == "list" and texts == want and len(set(ids)) == 5
           and all(isinstance(i, str) for i in ids) and li["first_id"] == ids[0]
           and li["last_id"] == ids[-1] and li["has_more"] is False
           and data[0]["content"][0]["type"] == "input_text", str(li)[:600])
    st, d1 = call(port, "GET", f"/v1/responses/{r3['id']}/input_items?limit=2", None, key)
    st2, d2 = call(port, "GET", f"/v1/responses/{r3['id']}/input_items?limit=2&after={d1.get('last_id')}",
                   None, key)
    st3, d3 = call(port, "GET", f"/v1/responses/{r3['id']}/input_items?limit=2&after={d2.get('last_id')}",
                   None, key)
    pages = [i["id"] for d in (d1, d2, d3) for i in d.get("data", [])]
    s.case("input_items: desc by default, limit and after page through it (has_more until the end)",
           st == st2 == st3 == 200 and pages == ids[::-1] and d1["has_more"] and d2["has_more"]
           and not d3["has_more"] and len(d3["data"]) == 1, f"{pages} {ids}")
    st, o = call(port, "GET", f"/v1/responses/{r3['id']}/input_items", None, key2)
    st2, bad = call(port, "GET", f"/v1/responses/{r3['id']}/input_items?limit=0", None, key)
    st3, bad2 = call(port, "GET", f"/v1/responses/{r3['id']}/input_items?order=up", None, key)
    st4, bad3 = call(port, "GET", f"/v1/responses/{r3['id']}/input_items?after=msg_nope", None, key)
    s.case("input_items: another tenant's 404; limit 0, order up, an unknown after are 400",
           is_error(st, o, 404) and is_error(st2, bad, 400, "limit") and is_error(st3, bad2, 400, "order")
           and is_error(st4, bad3, 400, "after"), f"{o} {bad} {bad2} {bad3}"[:400])
    st, d = call(port, "DELETE", f"/v1/responses/{rid}", None, key)
    st2, g = call(port, "GET", f"/v1/responses/{rid}", None, key)
    st3, d2 = call(port, "DELETE", f"/v1/responses/{rid}", None, key)
    st4, r4 = create(port, key, previous_response_id=r2["id"], input="More.")
    s.case("DELETE: {id, object, deleted}; then GET and DELETE 404; a later turn still continues "
           "(it stored the whole conversation)",
           st == 200 and d == {"id": rid, "object": "response.deleted", "deleted": True} and
           is_error(st2, g, 404) and is_error(st3, d2, 404) and st4 == 200, f"{d} {g} {r4}"[:300])
    # the bound: STORE_MAX kept, the oldest evicted
    ids = [create(port, key, input=f"n{i}")[1]["id"] for i in range(STORE_MAX + 2)]
    got = [call(port, "GET", f"/v1/responses/{i}", None, key)[0] for i in ids]
    s.case(f"--responses-store {STORE_MAX}: the newest {STORE_MAX} kept, the oldest evicted",
           got == [404] * 2 + [200] * STORE_MAX, str(got))


def error_checks(port, key):
    cases = [
        ("a web_search tool", dict(tools=[{"type": "web_search"}]), "tools", "not supported"),
        ("an image part", dict(input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}]), "input", "images"),
        ("an item_reference", dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input",
         "item_reference"),
        ("include", dict(include=["reasoning.encrypted_content"]), "include", "not supported"),
        ("background", dict(background=True), "background", "not supported"),
        ("truncation auto", dict(truncation="auto"), "truncation", "disabled"),
        ("reasoning effort minimal", dict(reasoning={"effort": "minimal"}), "reasoning", "effort"),
        ("a bad text.format", dict(text={"format": {"type": "json_schema"}}), "text.format", "schema"),
        ("temperature 3", dict(temperature=3), "temperature", None),
        ("a function_call without call_id", dict(input=[{"type": "function_call", "name": "f",
                                                         "arguments": "{}"}]), "input", "call_id"),
        ("input missing", dict(input=None), "input", None),
        ("max_output_tokens 0", dict(max_output_tokens=0), "max_output_tokens", None),
    ]
    for name, kw, param, word in cases:
        st, b = create(port, key, **kw)
        s.case(f"{name}: 400 naming {param}", is_error(st, b, 400, param, word), str(b)[:300])
    st, b = create(port, key, previous_response_id="resp_0000000000000000")
    s.case("an unknown previous_response_id: 404 in OpenAI's shape",
           is_error(st, b, 404, "previous_response_id", "not found") and
           b["error"]["type"] == "invalid_request_error", str(b))
    st, b = call(port, "GET", "/v1/responses/" + "x" * 200, None, key)
    s.case("a too-long id: 404", is_error(st, b, 404), str(b)[:200])
    st, b = create(port, "sk-wrong")
    s.case("a wrong key: 401", st == 401, str(b)[:200])
    st, b = create(port, key, model="nope")
    s.case("an unknown model: 404 model_not_found", st == 404 and
           b["error"].get("code") == "model_not_found", str(b))


def node_sdk(port, key):
    node_suite(s, "responses.test.mjs", "node-responses", "openai", {"SAMPAN_PORT": str(port), "SAMPAN_KEY": key})


with tempfile.TemporaryDirectory() as tmp:
    tenants = os.path.join(tmp, "tenants.json")
    key = keys_add(tenants, "acme", "--scopes", "infer,metrics")
    key2 = keys_add(tenants, "other")
    repo = chat_repository(tmp, CHATML)
    srv = Server("--tenants", tenants, "--model-repository", repo, "--parallel", "2",
                 "--log-requests", "all", "--responses-store", str(STORE_MAX), model=None)
    try:
        s.guard("stream", stream_checks, srv.port, key)
        s.guard("store", store_checks, srv.port, key, key2)
        s.guard("errors", error_checks, srv.port, key)
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
        c.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"})
        metrics = c.getresponse().read().decode()
        c.close()
        done = re.findall(r'sampan_request_success_total\{model="chat"[^}]*\} (\d+)', metrics)
        s.case("the requests are in the model's metrics", sum(int(n) for n in done) >= 10,
               str(done))
        s.case("the access log names the route, tenant and model",
               srv.wait_log(r"event=request .*path=\"?/v1/responses\"? status=200 .*tenant=acme .*"
                            r"model=\"?chat") is not None,
               "".join(l for l in srv.log if "/v1/responses" in l)[-400:])
    finally:
        srv.stop()
    # the SDK suite on its own server: the store's bound there is the default
    srv = Server("--tenants", tenants, "--model-repository", repo, "--parallel", "2", model=None)
    try:
        s.guard("sdk", node_sdk, srv.port, key)
    finally:
        srv.stop()
s.finish()
