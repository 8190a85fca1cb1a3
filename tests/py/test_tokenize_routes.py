"""test_tokenize_routes.py - llama-server's POST /apply-template, /tokenize and /detokenize,
and `sampan serve --chat-template-file`, against the real server with the demo model:

- /tokenize gives the ids of `sampan tokenize` (add_special and parse_special as asked),
  with_pieces gives each id's text; /detokenize turns ids back into the text;
- /apply-template renders the model's template; its prompt, tokenized, is the prompt that
  /v1/chat/completions counts; chat_template_kwargs reach the template;
- chat_template_kwargs and reasoning_effort reach the real Qwen3 template (enable_thinking
  false: the empty thinking block) and gpt-oss template (its "Reasoning:" line), through both
  /apply-template and /v1/chat/completions (the same prompt token count); bad values are 400;
- --chat-template-file replaces the file's template, and a missing or broken file stops the
  server with an error naming the file;
- with two models served, `model` picks one and leaving it out is a 400;
- bad inputs: 4xx with a JSON error body.
"""
import json
import os
import shutil
import subprocess
import tempfile

from common import DEMO_MODEL, ROOT, RepoServer, Server, Suite, binary, http_json

s = Suite("tokenize-routes")
exe = binary()
if exe is None:
    s.skip("all", "sampan not built")
    s.finish()


def cli_tokenize(text, *flags):
    r = subprocess.run([exe, "tokenize", "-m", DEMO_MODEL, *flags], input=text.encode(),
                       capture_output=True, timeout=60, cwd=ROOT)
    return [int(x) for x in r.stdout.split()]


def is_error(st, body, status):
    return st == status and isinstance(body, dict) and isinstance(body.get("error"), dict) \
        and isinstance(body["error"].get("message"), str)


tmp = tempfile.mkdtemp(prefix="sampan-tmpl-")
tmpl = os.path.join(tmp, "mine.jinja")
with open(tmpl, "w") as f:
    f.write("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
            "{% if tools %}tools={{ tools | length }}\n{% endif %}"
            "{% if add_generation_prompt %}[assistant]{{ flavor | default('plain') }}{% endif %}")

srv = Server()
try:
    text = "Hello world <s> once upon a time"
    st, b = http_json(srv.port, "POST", "/tokenize", {"content": text})
    s.case("/tokenize: the ids of `sampan tokenize --no-bos --special`",
           st == 200 and b["tokens"] == cli_tokenize(text, "--no-bos", "--special"), b)
    st, b2 = http_json(srv.port, "POST", "/tokenize",
                       {"content": text, "parse_special": False, "add_special": True})
    s.case("/tokenize add_special, parse_special false: BOS first, <s> as text",
           st == 200 and b2["tokens"] == cli_tokenize(text) and b2["tokens"][0] == 1
           and 1 not in b2["tokens"][1:], b2)
    st, b3 = http_json(srv.port, "POST", "/tokenize", {"content": text, "with_pieces": True})
    st, d = http_json(srv.port, "POST", "/detokenize", {"tokens": b["tokens"]})
    ok = st == 200 and [t["id"] for t in b3["tokens"]] == b["tokens"]
    s.case("/tokenize with_pieces: {id, piece}, the pieces spell what /detokenize gives",
           ok and "".join(t["piece"] for t in b3["tokens"]) == d["content"], (b3, d))
    plain = "Once upon a time, there was a tiny llama."
    st, t = http_json(srv.port, "POST", "/tokenize", {"content": plain})
    st, d = http_json(srv.port, "POST", "/detokenize", {"tokens": t["tokens"]})
    # SentencePiece writes the space it puts in front of the text (llama-server does too)
    s.case("/detokenize gives the text back", st == 200 and d["content"] == " " + plain, d)
    st, d = http_json(srv.port, "POST", "/detokenize", {"tokens": []})
    s.case("/detokenize of no tokens is empty", st == 200 and d == {"content": ""}, d)

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    st, a = http_json(srv.port, "POST", "/apply-template", {"messages": msgs})
    ok = st == 200 and isinstance(a.get("prompt"), str) and "Hi there" in a["prompt"]
    s.case("/apply-template renders the messages", ok, a)
    if ok:
        st, t = http_json(srv.port, "POST", "/tokenize",
                          {"content": a["prompt"], "add_special": True})
        st2, c = http_json(srv.port, "POST", "/v1/chat/completions",
                           {"model": "stories260K", "messages": msgs, "max_tokens": 1})
        # the chat route adds BOS only when the rendered text does not start with it
        n = len(t["tokens"]) - (1 if a["prompt"].startswith("<s>") else 0)
        s.case("/apply-template's prompt is what /v1/chat/completions is fed",
               st2 == 200 and c["usage"]["prompt_tokens"] == n, (n, c.get("usage")))
    bad = [
        ("/tokenize", {"content": 5}, 400, "content"),
        ("/tokenize", {"content": "x", "add_special": "yes"}, 400, "add_special"),
        ("/tokenize", {"content": "x", "model": "nope"}, 404, None),
        ("/detokenize", {"tokens": [1, 99999999]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens"),
        ("/detokenize", {}, 400, "tokens"),
        ("/apply-template", {"messages": []}, 400, "messages"),
        ("/apply-template", {"messages": [{"role": "user", "content": 3}]}, 400, "messages"),
        ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
        ("/apply-template", {"messages": msgs, "tools": {}}, 400, "tools"),
        ("/apply-template", {"messages": msgs, "chat_template_kwargs": []}, 400,
         "chat_template_kwargs"),
    ]
    for path, body, status, param in bad:
        st, b = http_json(srv.port, "POST", path, body)
        s.case(f"{path} {json.dumps(body)[:60]} -> {status}",
               is_error(st, b, status) and (param is None or b["error"].get("param") == param),
               (st, b))
    for path in ("/tokenize", "/detokenize", "/apply-template"):
        st, b = http_json(srv.port, "POST", path, None)
        s.case(f"{path} without a body -> 400", is_error(st, b, 400), (st, b))
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
        c.request("POST", path, body=b"{not json", headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        s.case(f"{path} with broken JSON -> 400 JSON", r.status == 400 and
               isinstance(json.loads(raw).get("error"), dict), raw)
finally:
    srv.stop()

# --chat-template-file, and two models
srv = Server("--chat-template-file", tmpl, "--model", f"second={DEMO_MODEL}")
try:
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    st, b = http_json(srv.port, "POST", "/apply-template", {"messages": msgs})
    s.case("two models: 'model' is required", is_error(st, b, 400) and
           "stories260K" in b["error"]["message"] and "second" in b["error"]["message"], b)
    st, b = http_json(srv.port, "POST", "/apply-template", {"messages": msgs, "model": "second"})
    s.case("--chat-template-file replaces the file's template",
           st == 200 and b["prompt"] == "<s>[user]Hi\n[assistant]Hello\n[assistant]plain", b)
    st, b = http_json(srv.port, "POST", "/apply-template",
                      {"messages": msgs, "model": "stories260K", "add_generation_prompt": False,
                       "tools": [{"type": "function", "function": {"name": "f"}}]})
    s.case("tools reach the template", st == 200 and
           b["prompt"] == "<s>[user]Hi\n[assistant]Hello\ntools=1\n", b)
    st, b = http_json(srv.port, "POST", "/apply-template",
                      {"messages": msgs, "model": "second",
                       "chat_template_kwargs": {"flavor": "spicy"}})
    s.case("chat_template_kwargs reach the template",
           st == 200 and b["prompt"].endswith("[assistant]spicy"), b)
    st, b = http_json(srv.port, "POST", "/tokenize", {"content": "Hi", "model": "second"})
    s.case("/tokenize with a model picked", st == 200 and b["tokens"] == cli_tokenize("Hi", "--no-bos"), b)
finally:
    srv.stop()

# chat_template_kwargs and reasoning_effort, through /apply-template and /v1/chat/completions:
# the demo model served twice from a repository, with the real Qwen3 and gpt-oss templates.
TEMPLATE_DIR = os.path.join(ROOT, "tests", "data", "chat")
repo = os.path.join(tmp, "repo")
for name, path in (("qwen3", os.path.join(TEMPLATE_DIR, "Qwen-Qwen3-0.6B.jinja")),
                   ("oss", os.path.join(TEMPLATE_DIR, "templates", "openai-gpt-oss-120b.jinja"))):
    os.makedirs(os.path.join(repo, name, "1"))
    shutil.copy(DEMO_MODEL, os.path.join(repo, name, "1", "model.gguf"))
    with open(path) as f:
        tpl = f.read()
    # qwen3's template inline; gpt-oss's as a file beside the model (chat_template_file)
    if name == "oss":
        os.makedirs(os.path.join(repo, name, "templates"))
        shutil.copy(path, os.path.join(repo, name, "templates", "chat.jinja"))
        params = {"chat_template_file": {"string_value": "templates/chat.jinja"}}
    else:
        params = {"chat_template": {"string_value": tpl}}
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump({"name": name, "backend": "llm", "parameters": params}, f)
# chat_template_file that cannot be used: the model is UNAVAILABLE with the reason, the others serve
BAD_TEMPLATE_FILES = {
    "escape": ({"chat_template_file": {"string_value": "../../outside.jinja"}}, "outside the repository"),
    "absent": ({"chat_template_file": {"string_value": "none.jinja"}}, "none.jinja"),
    "both": ({"chat_template_file": {"string_value": "t.jinja"},
              "chat_template": {"string_value": "x"}}, "only one of chat_template and chat_template_file"),
    "absolute": ({"chat_template_file": {"string_value": "/etc/hostname"}}, "relative"),
}
with open(os.path.join(tmp, "outside.jinja"), "w") as f:
    f.write("{{ messages }}")
for name, (params, _) in BAD_TEMPLATE_FILES.items():
    os.makedirs(os.path.join(repo, name, "1"))
    shutil.copy(DEMO_MODEL, os.path.join(repo, name, "1", "model.gguf"))
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump({"name": name, "backend": "llm", "parameters": params}, f)
srv = RepoServer(repo)
try:
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    st, index = http_json(srv.port, "POST", "/v2/repository/index", {})
    states = {m["name"]: m for m in index} if st == 200 else {}
    for name, (_, why) in BAD_TEMPLATE_FILES.items():
        m = states.get(name, {})
        s.case(f"parameters.chat_template_file ({name}): UNAVAILABLE naming why",
               m.get("state") == "UNAVAILABLE" and why in m.get("reason", ""), m)
    s.case("parameters.chat_template_file: the model with a usable file is READY",
           states.get("oss", {}).get("state") == "READY", states.get("oss"))

    def rendered(model, **kw):
        st, b = http_json(srv.port, "POST", "/apply-template", dict({"model": model, "messages": msgs}, **kw))
        return b.get("prompt") if st == 200 and isinstance(b, dict) else None

    def fed(prompt, model):
        """The prompt tokens the chat route counts for this rendered prompt."""
        st, t = http_json(srv.port, "POST", "/tokenize",
                          {"model": model, "content": prompt, "add_special": True})
        return len(t["tokens"]) - (1 if prompt.startswith("<s>") else 0) if st == 200 else None

    def chat_prompt_tokens(model, **kw):
        st, c = http_json(srv.port, "POST", "/v1/chat/completions",
                          dict({"model": model, "messages": msgs, "max_tokens": 1}, **kw), timeout=60)
        return c["usage"]["prompt_tokens"] if st == 200 else (st, c)

    plain = rendered("qwen3")
    off = rendered("qwen3", chat_template_kwargs={"enable_thinking": False})
    s.case("Qwen3 template, enable_thinking false: the empty thinking block after the "
           "generation prompt, as the template writes it",
           plain is not None and plain.endswith("<|im_start|>assistant\n")
           and off == plain + "<think>\n\n</think>\n\n", (plain, off))
    if off is not None and plain is not None:
        n_off, n_plain = fed(off, "qwen3"), fed(plain, "qwen3")
        got = chat_prompt_tokens("qwen3", chat_template_kwargs={"enable_thinking": False})
        s.case("/v1/chat/completions with chat_template_kwargs is fed the /apply-template prompt",
               n_off != n_plain and got == n_off, (n_plain, n_off, got))
        got = chat_prompt_tokens("qwen3")
        s.case("/v1/chat/completions without chat_template_kwargs: the plain prompt",
               got == n_plain, (n_plain, got))

    efforts = {e: rendered("oss", reasoning_effort=e) for e in ("low", "medium", "high")}
    default = rendered("oss")
    s.case("gpt-oss template: reasoning_effort reaches it (Reasoning: low/medium/high)",
           all(p is not None and f"Reasoning: {e}\n" in p for e, p in efforts.items())
           and default is not None and "Reasoning: medium\n" in default, efforts)
    kwfirst = rendered("oss", reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})
    s.case("chat_template_kwargs.reasoning_effort wins over the top-level one",
           kwfirst is not None and "Reasoning: low\n" in kwfirst, kwfirst)
    if efforts["high"] is not None and efforts["medium"] is not None:
        n_high, n_med = fed(efforts["high"], "oss"), fed(efforts["medium"], "oss")
        got = chat_prompt_tokens("oss", reasoning_effort="high")
        s.case("/v1/chat/completions with reasoning_effort high is fed the /apply-template prompt",
               n_high != n_med and got == n_high, (n_med, n_high, got))

    for path in ("/apply-template", "/v1/chat/completions"):
        for key, val in (("chat_template_kwargs", [1]), ("chat_template_kwargs", "x"),
                         ("reasoning_effort", "extreme"), ("reasoning_effort", 3)):
            st, b = http_json(srv.port, "POST", path,
                              {"model": "oss", "messages": msgs, "max_tokens": 1, key: val})
            s.case(f"{path} {key}={json.dumps(val)} -> 400 naming it",
                   is_error(st, b, 400) and b["error"].get("param") == key, (st, b))
finally:
    srv.stop()

for name, body, want in [
    ("missing.jinja", None, "missing.jinja"),
    ("broken.jinja", "line one\n{% for m in messages %}never closed", "broken.jinja"),
]:
    path = os.path.join(tmp, name)
    if body is not None:
        with open(path, "w") as f:
            f.write(body)
    r = subprocess.run([exe, "serve", "--port", "0", "--threads", "1", "--chat-template-file", path],
                       capture_output=True, text=True, timeout=30, cwd=ROOT)
    s.case(f"--chat-template-file {name}: the server stops naming the file",
           r.returncode != 0 and want in r.stderr and "--chat-template-file" in r.stderr,
           r.stderr[-400:])
s.finish()
