"""test_structured.py - structured output and tool calls against the real server with the demo
model (a tiny story model: only the constraint makes its output valid).

- response_format json_schema: for several schemas (objects, arrays, enums, nesting, required
  and optional fields) over many seeds, every answer parses and validates (a small validator
  below, the subset docs/structured-output.md lists);
- a GBNF `grammar` on /v1/completions and /v1/chat/completions;
- tool calls: tool_choice required and named give `tool_calls` whose arguments validate,
  also streamed; tools render into the chat template with role tool messages;
- bad schemas and grammars get 400 with a JSON error naming the parameter;
- the official `openai` npm SDK round trip (tests/node/tools.test.mjs), when node is there.
"""
import json
import os
import re
import shutil
import time

from common import ROOT, Server, Suite, binary, http_json, run

s = Suite("structured")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

DEADLINE = time.time() + 50  # the suite stays under a minute on 2 cores


def validate(v, sc, root=None, depth=0):
    """True when v validates against sc (the subset the server supports)."""
    root = sc if root is None else root
    if depth > 64:
        return False
    if sc is True or sc == {}:
        return True
    if "$ref" in sc:
        ref = sc["$ref"]
        if ref == "#":
            return validate(v, root, root, depth + 1)
        key = ref.split("/")[-1].replace("~1", "/").replace("~0", "~")
        defs = root.get("$defs", root.get("definitions", {}))
        return validate(v, defs[key], root, depth + 1)
    if "const" in sc:
        return v == sc["const"] and type(v) == type(sc["const"])
    if "enum" in sc:
        return any(v == e and type(v) == type(e) for e in sc["enum"])
    if "anyOf" in sc:
        return any(validate(v, x, root, depth + 1) for x in sc["anyOf"])
    if "oneOf" in sc:
        return sum(1 for x in sc["oneOf"] if validate(v, x, root, depth + 1)) == 1
    t = sc.get("type")
    types = t if isinstance(t, list) else [t] if t else None
    if types is None:
        types = ["object"] if "properties" in sc else ["array"] if "items" in sc else None
    if types is None:
        return True

    def one(ty):
        if ty == "null":
            return v is None
        if ty == "boolean":
            return isinstance(v, bool)
        if ty == "integer":
            return isinstance(v, int) and not isinstance(v, bool) and v >= sc.get("minimum", v)
        if ty == "number":
            return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= sc.get("minimum", v)
        if ty == "string":
            return isinstance(v, str) and sc.get("minLength", 0) <= len(v) <= sc.get("maxLength", 1 << 30)
        if ty == "array":
            return (isinstance(v, list) and sc.get("minItems", 0) <= len(v) <= sc.get("maxItems", 1 << 30)
                    and all(validate(x, sc.get("items", True), root, depth + 1) for x in v))
        if ty == "object":
            if not isinstance(v, dict):
                return False
            props = sc.get("properties", {})
            if any(r not in v for r in sc.get("required", [])):
                return False
            for k, x in v.items():
                if k in props:
                    if not validate(x, props[k], root, depth + 1):
                        return False
                elif sc.get("additionalProperties", True) is False:
                    return False
            return True
        return False
    return any(one(ty) for ty in types)


SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
        "pet": {"enum": ["cat", "dog", None]}}, "required": ["name", "age"],
        "additionalProperties": False},
    "list": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
    "enum": {"enum": ["red", "green", "blue", 7, True]},
    "nested": {"type": "object", "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 12},
        "items": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "id": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["id", "ok"]}},
        "meta": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
            "k": {"const": "v"}}, "required": ["k"]}]}},
        "required": ["title", "items", "meta"]},
    "optional_only": {"type": "object", "properties": {"a": {"type": "boolean"},
                                                       "b": {"type": "string", "maxLength": 5}}},
    "tree": {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "maxItems": 2,
                                           "items": {"$ref": "#/$defs/node"}}},
        "required": ["v", "kids"]}}},
}

srv = Server("--parallel", "4", "--ctx-size", "2048")
port = srv.port


def chat(body):
    b = dict({"model": "stories260K", "messages": [{"role": "user", "content": "Tell me about a cat"}]},
             **body)
    return http_json(port, "POST", "/v1/chat/completions", b, timeout=30)


def schema_runs():
    for name, sc in SCHEMAS.items():
        bad = []
        n_ok = 0
        seeds = range(8)
        for seed in seeds:
            if time.time() > DEADLINE:
                break
            rf = {"type": "json_schema", "json_schema": {"name": name, "schema": sc, "strict": True}}
            route = seed % 2
            if route == 0:
                st, r = chat({"response_format": rf, "max_tokens": 96, "seed": seed, "temperature": 1.0})
                text = r["choices"][0]["message"]["content"] if st == 200 else None
            else:
                st, r = http_json(port, "POST", "/v1/completions", {
                    "model": "stories260K", "prompt": "Once upon a time", "max_tokens": 96,
                    "seed": seed, "response_format": rf}, timeout=30)
                text = r["choices"][0]["text"] if st == 200 else None
            try:
                v = json.loads(text)
                ok = validate(v, sc)
            except (TypeError, ValueError):
                ok = False
            if ok:
                n_ok += 1
            else:
                bad.append((seed, st, text if text is not None else r))
        s.case(f"json_schema {name}: {n_ok} seeds parse and validate", not bad and n_ok > 0,
               str(bad[:2]))


def greedy_and_n():
    sc = SCHEMAS["person"]
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": sc}}
    st, r = chat({"response_format": rf, "max_tokens": 64, "temperature": 0, "n": 3, "seed": 5})
    ok = st == 200 and len(r["choices"]) == 3 and all(
        validate(json.loads(c["message"]["content"]), sc) for c in r["choices"])
    s.case("json_schema greedy with n=3: every choice validates", ok, str(r)[:300])
    # streamed: the concatenated deltas validate
    code, raw = stream_chat({"response_format": rf, "max_tokens": 64, "seed": 9})
    text = "".join(d.get("content") or "" for d in deltas(raw))
    try:
        good = validate(json.loads(text), sc)
    except ValueError:
        good = False
    s.case("json_schema streamed: the deltas join into a valid object", code == 200 and good, text[:200])


def stream_chat(body):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    b = dict({"model": "stories260K", "stream": True,
              "messages": [{"role": "user", "content": "What is the weather?"}]}, **body)
    c.request("POST", "/v1/chat/completions", body=json.dumps(b),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    return r.status, raw


def deltas(raw):
    out = []
    for line in raw.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                out.append(dict(ch.get("delta", {}), _finish=ch.get("finish_reason")))
    return out


def grammar_cases():
    g = 'root ::= ("yes" | "no") ", " [a-z]{2,6} "."'
    pat = re.compile(r"^(yes|no), [a-z]{2,6}\.$")
    texts = []
    for seed in range(6):
        st, r = http_json(port, "POST", "/v1/completions", {
            "model": "stories260K", "prompt": "Once", "max_tokens": 20, "seed": seed, "grammar": g})
        texts.append((st, r["choices"][0]["text"] if st == 200 else r,
                      r["choices"][0]["finish_reason"] if st == 200 else None))
    s.case("grammar on completions: every text matches and ends the generation (stop)",
           all(st == 200 and pat.match(t) and f == "stop" for st, t, f in texts), str(texts[:3]))
    st, r = chat({"grammar": 'root ::= [A-Z] [a-z]+ " " [0-9]{3}', "max_tokens": 24, "seed": 3})
    t = r["choices"][0]["message"]["content"] if st == 200 else ""
    s.case("grammar on chat", st == 200 and re.match(r"^[A-Z][a-z]+ [0-9]{3}$", t), str(r)[:200])


def error_cases():
    cases = [
        ("grammar syntax", "/v1/completions", {"grammar": 'root ::= "a'}, "grammar", "line 1"),
        ("grammar undefined rule", "/v1/completions", {"grammar": "root ::= x"}, "grammar", "'x'"),
        ("grammar left recursion", "/v1/completions", {"grammar": 'root ::= root "a" | "b"'},
         "grammar", "left-recursive"),
        ("grammar not a string", "/v1/completions", {"grammar": 5}, "grammar", "GBNF"),
        ("schema pattern", "/v1/chat/completions",
         {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
             "type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a)"}}}}}},
         "response_format.json_schema.schema", "lookahead '(?=' is not supported (at offset 2 of the pattern) (at /properties/s)"),
        ("schema format", "/v1/chat/completions",
         {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
             "type": "string", "format": "hostname"}}}}, "response_format.json_schema.schema", "format 'hostname'"),
        ("schema if/then", "/v1/chat/completions",
         {"response_format": {"type": "json_schema", "json_schema": {"schema": {"if": {}}}}},
         "response_format.json_schema.schema", "'if'"),
        ("schema bad ref", "/v1/chat/completions",
         {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/x/y"}}}},
         "response_format.json_schema.schema", "$ref"),
        ("json_schema not an object", "/v1/chat/completions",
         {"response_format": {"type": "json_schema", "json_schema": 3}}, "response_format.json_schema",
         "must be an object"),
        ("grammar with response_format", "/v1/completions",
         {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar", "combined"),
        ("tool_choice unknown function", "/v1/chat/completions",
         {"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "'g'"),
        # Limits of the request's own grammar: 400 (413 is for bodies over --max-body-bytes).
        ("grammar over the element limit", "/v1/completions", {"grammar": "root ::= " + " ".join(['"a"{4096}'] * 70)},
         "grammar", "elements"),
        ("schema over the node limit", "/v1/chat/completions",
         {"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": list(range(10001))}}}},
         "response_format.json_schema.schema", "10000"),
        ("forced tool call over the grammar's limits", "/v1/chat/completions",
         {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
             "type": "object", "properties": {f"s{i}": {"type": "string", "maxLength": 4096}
                                              for i in range(10)}}}}],
          "tool_choice": "required"}, "tools", "more than"),
        ("tool_choice without tools", "/v1/chat/completions", {"tool_choice": "required"},
         "tool_choice", "needs 'tools'"),
        ("tools malformed", "/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools",
         "tools[0]"),
        ("tool parameters unsupported", "/v1/chat/completions",
         {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
             "type": "object", "properties": {"d": {"type": "string", "format": "ipv6"}}}}}],
          "tool_choice": "required"}, "tools", "format 'ipv6'"),
    ]
    for name, path, extra, param, needle in cases:
        body = dict({"model": "stories260K", "max_tokens": 8}, **extra)
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": "hi"}]
        else:
            body["prompt"] = "Once"
        st, r = http_json(port, "POST", path, body)
        err = r.get("error", {}) if isinstance(r, dict) else {}
        # A grammar over the compiler's size limits says which limit (code limit_exceeded).
        code = "limit_exceeded" if name in ("grammar over the element limit",
                                            "forced tool call over the grammar's limits") else None
        s.case(f"400 {name}", st == 400 and err.get("param") == param and needle in err.get("message", "")
               and err.get("code") == code, f"{st} {r}")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
        "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]}}}


def tool_cases():
    bad = []
    for seed in range(6):
        choice = "required" if seed % 2 else {"type": "function", "function": {"name": "get_time"}}
        st, r = chat({"tools": [WEATHER, TIME], "tool_choice": choice, "max_tokens": 160, "seed": seed})
        try:
            c = r["choices"][0]
            calls = c["message"]["tool_calls"]
            fn = calls[0]["function"]
            args = json.loads(fn["arguments"])
            want = WEATHER if fn["name"] == "get_weather" else TIME
            ok = (c["finish_reason"] == "tool_calls" and calls[0]["type"] == "function"
                  and calls[0]["id"].startswith("call_") and len(calls) == 1
                  and (choice == "required" or fn["name"] == "get_time")
                  and validate(args, want["function"]["parameters"]))
        except (KeyError, TypeError, ValueError, IndexError):
            ok = False
        if not ok:
            bad.append((seed, st, r))
    s.case("forced tool calls (required / named): arguments parse and validate", not bad, str(bad[:1])[:400])
    # streamed: the first tool delta has id, type and name; arguments arrive after; finish tool_calls
    code, raw = stream_chat({"tools": [WEATHER], "tool_choice": "required", "max_tokens": 160, "seed": 4})
    ds = deltas(raw)
    tcs = [d["tool_calls"][0] for d in ds if d.get("tool_calls")]
    args = "".join(t.get("function", {}).get("arguments", "") for t in tcs)
    try:
        ok = (code == 200 and tcs and tcs[0].get("id", "").startswith("call_")
              and tcs[0]["function"]["name"] == "get_weather" and ds[-1]["_finish"] == "tool_calls"
              and validate(json.loads(args), WEATHER["function"]["parameters"]))
    except ValueError:
        ok = False
    s.case("streamed tool call deltas", ok, raw[-600:])
    # tool_choice none: plain content, no tool_calls
    st, r = chat({"tools": [WEATHER], "tool_choice": "none", "max_tokens": 12, "seed": 1})
    s.case("tool_choice none: content only", st == 200 and "tool_calls" not in r["choices"][0]["message"]
           and r["choices"][0]["finish_reason"] in ("stop", "length"), str(r)[:300])
    # auto: the demo model does not call tools; the answer is content (streamed too)
    st, r = chat({"tools": [WEATHER], "max_tokens": 12, "seed": 1})
    s.case("tool_choice auto with a model that answers in text", st == 200
           and isinstance(r["choices"][0]["message"]["content"], str), str(r)[:300])
    code, raw = stream_chat({"tools": [WEATHER], "max_tokens": 12, "seed": 1})
    text = "".join(d.get("content") or "" for d in deltas(raw))
    s.case("tool_choice auto streamed: content deltas", code == 200 and len(text) > 0, raw[-300:])
    # the round trip: assistant tool_calls and a role tool message go back into the template
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]
    st, r = http_json(port, "POST", "/v1/chat/completions", {
        "model": "stories260K", "messages": msgs, "tools": [WEATHER], "max_tokens": 8, "seed": 2})
    s.case("role tool and assistant tool_calls render", st == 200 and
           r["usage"]["prompt_tokens"] > 40, str(r)[:300])


def node_sdk():
    if shutil.which("node") is None:
        s.skip("openai SDK tool calls", "node is not installed")
        return
    node_dir = os.path.join(ROOT, "tests", "node")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        s.skip("openai SDK tool calls", "tests/node/node_modules missing (npm ci)")
        return
    rc, out, err = run(["node", os.path.join(node_dir, "tools.test.mjs")], timeout=60,
                       env={"SAMPAN_PORT": str(port)})
    print(out, end="")
    m = re.search(r"node-tools: (\d+) passed, (\d+) failed", out)
    if not m:
        s.case("openai SDK tool calls ran", False, (out + err)[-600:])
    else:
        s.passed += int(m.group(1))
        s.failed += int(m.group(2))


try:
    for fn in (schema_runs, greedy_and_n, grammar_cases, error_cases, tool_cases, node_sdk):
        s.guard(fn.__name__, fn)
    s.case("server still healthy", http_json(port, "GET", "/health")[0] == 200)
finally:
    rc = srv.stop()
    s.case("server exits cleanly", rc == 0, f"exit {rc}")
s.finish()
