#!/usr/bin/env python3
"""gen-chat-expected.py - the expected prompts of tests/unit/test_chat_templates.c.

Renders every template in tests/data/chat/templates/ with every case of
tests/data/chat/conversations.json the way Hugging Face transformers'
apply_chat_template does (Jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and HF's
{% generation %} block; a `tojson` that keeps
non-ASCII text; the globals raise_exception and strftime_now; `tools` and
`documents` always passed, None when absent), and writes
tests/data/chat/expected.json: {template: {case: {"out": text} | {"error": text}}}.

    /usr/bin/python3 scripts/gen-chat-expected.py          # rewrite expected.json
    /usr/bin/python3 scripts/gen-chat-expected.py --check  # compare, exit 1 on a difference

Needs Debian's python3-jinja2 (the reference; scripts/deps.sh --test installs it).
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat")


class Generation(Extension):
    """HF's {% generation %}...{% endgeneration %}: marks the assistant's text for
    training masks; rendering writes the body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, src, conv, case):
    kwargs = dict(case.get("extra", {}))
    kwargs.update(bos_token=conv["bos_token"], eos_token=conv["eos_token"])
    try:
        t = env.from_string(src)
        out = t.render(messages=case["messages"], tools=case.get("tools"), documents=None,
                       add_generation_prompt=case["add_generation_prompt"], **kwargs)
        return {"out": out}
    except Exception as e:  # the template's own raise_exception, or a type error
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    conv = json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))
    env = make_env(conv["now"])
    tdir = os.path.join(DATA, "templates")
    result = {}
    for name in sorted(os.listdir(tdir)):
        if not name.endswith(".jinja"):
            continue
        src = open(os.path.join(tdir, name), encoding="utf-8").read()
        result[name] = {c["name"]: render(env, src, conv, c) for c in conv["cases"]}
    text = json.dumps(result, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    path = os.path.join(DATA, "expected.json")
    if "--check" in sys.argv[1:]:
        old = open(path, encoding="utf-8").read()
        if old != text:
            print("expected.json differs from python3-jinja2's renders", file=sys.stderr)
            return 1
        print(f"expected.json matches python3-jinja2 {jinja2.__version__}")
        return 0
    open(path, "w", encoding="utf-8").write(text)
    n_err = sum(1 for t in result.values() for r in t.values() if "error" in r)
    print(f"{len(result)} templates x {len(conv['cases'])} cases, {n_err} raise an error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
