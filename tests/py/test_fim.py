"""test_fim.py - fill-in-the-middle: /v1/completions `suffix`, llama-server's POST /infill and
Ollama's /api/generate `suffix`.

The demo model's GGUF is copied with FIM keys added (tokenizer.ggml.fim_pre/suf/mid_token_id,
or the older prefix/suffix/middle_token_id; a third copy adds fim_rep/fim_sep for the
repository layout), pointing at ordinary tokens of its vocabulary. What the engine is given
is checked through greedy decoding: a request with a suffix must answer exactly what the
same request answers with the documented token sequence given as ids (and a different
order must not), with the same prompt_tokens. The unmodified model refuses both with a
400 that says why.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

from common import ROOT, RepoServer, Suite, binary, http_json

sys.path.insert(0, os.path.join(ROOT, "tools"))
import gguf_gen  # noqa: E402  (kv_bytes, _skip_value: the GGUF record layout)

s = Suite("fim")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

DEMO = os.path.join(ROOT, "models", "stories260K.gguf")
BOS, PRE, SUF, MID, REP, SEP = 1, 300, 301, 302, 303, 304


def with_kvs(src, dst, kvs):
    """Copy a GGUF file adding uint32 key/values (the data section re-aligned)."""
    buf = open(src, "rb").read()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, align = 24, 32
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + klen].decode()
        (vtype,) = struct.unpack_from("<I", buf, pos + 8 + klen)
        vpos = pos + 8 + klen + 4
        if key == "general.alignment":
            (align,) = struct.unpack_from("<I", buf, vpos)
        pos = gguf_gen._skip_value(buf, vpos, vtype)
    kv_end = pos
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * nd + 4 + 8
    data = (pos + align - 1) // align * align
    extra = b"".join(gguf_gen.kv_bytes(k, gguf_gen.T_UINT32, v) for k, v in kvs.items())
    head = buf[:4] + struct.pack("<IQQ", version, n_tensors, n_kv + len(kvs)) + buf[24:kv_end] \
        + extra + buf[kv_end:pos]
    head += b"\0" * ((-len(head)) % align)
    with open(dst, "wb") as f:
        f.write(head + buf[data:])


MODELS = {
    "fim": {"tokenizer.ggml.fim_pre_token_id": PRE, "tokenizer.ggml.fim_suf_token_id": SUF,
            "tokenizer.ggml.fim_mid_token_id": MID},
    "fimold": {"tokenizer.ggml.prefix_token_id": PRE, "tokenizer.ggml.suffix_token_id": SUF,
               "tokenizer.ggml.middle_token_id": MID},
    "fimrepo": {"tokenizer.ggml.fim_pre_token_id": PRE, "tokenizer.ggml.fim_suf_token_id": SUF,
                "tokenizer.ggml.fim_mid_token_id": MID, "tokenizer.ggml.fim_rep_token_id": REP,
                "tokenizer.ggml.fim_sep_token_id": SEP},
    "plain": {},
}


def make_repo(tmp):
    repo = os.path.join(tmp, "repo")
    for name, kvs in MODELS.items():
        os.makedirs(os.path.join(repo, name, "1"))
        out = os.path.join(repo, name, "1", "model.gguf")
        if kvs:
            with_kvs(DEMO, out, kvs)
        else:
            shutil.copy(DEMO, out)
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump({"name": name, "backend": "llm"}, f)
    return repo


def toks(port, text):
    st, r = http_json(port, "POST", "/tokenize",
                      {"model": "fim", "content": text, "add_special": False, "parse_special": False})
    assert st == 200, r
    return r["tokens"]


def complete(port, model, prompt, **kw):
    body = dict({"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0}, **kw)
    return http_json(port, "POST", "/v1/completions", body, timeout=60)


def answer(r):
    return (r["choices"][0]["text"], r["usage"]["prompt_tokens"]) if "choices" in r else r


def suffix_cases(port):
    pre, suf = "Once upon a time, a girl", " and they lived happily."
    want = [BOS, PRE] + toks(port, pre) + [SUF] + toks(port, suf) + [MID]
    for model in ("fim", "fimold"):
        st, r = complete(port, model, pre, suffix=suf)
        st2, r2 = complete(port, model, want)
        s.case(f"{model}: suffix = [BOS, PRE, prefix, SUF, suffix, MID] given as ids",
               st == 200 and st2 == 200 and answer(r) == answer(r2)
               and r["usage"]["prompt_tokens"] == len(want), f"{r} {r2}")
    swapped = [BOS, SUF] + toks(port, suf) + [PRE] + toks(port, pre) + [MID]
    _, r3 = complete(port, "fim", swapped)
    _, r = complete(port, "fim", pre, suffix=suf)
    s.case("the check can fail: another order answers otherwise", answer(r3) != answer(r), f"{r3}")
    _, r4 = complete(port, "fim", toks(port, pre), suffix=suf)
    s.case("a prompt of ids with a suffix: the ids are the prefix (same tokens as its text)",
           answer(r4) == answer(r) and answer(r4)[1] == len(want), str(r4)[:300])
    _, r5 = complete(port, "fim", pre, suffix="")
    _, r6 = complete(port, "fim", pre)
    s.case("an empty suffix is no suffix", answer(r5) == answer(r6), f"{r5} {r6}")
    st, r = complete(port, "plain", pre, suffix=suf)
    s.case("a model without FIM tokens: 400 naming suffix and why",
           st == 400 and r["error"]["param"] == "suffix" and "FIM tokens" in r["error"]["message"],
           str(r)[:300])
    st, r = complete(port, "fim", pre, suffix=3)
    s.case("a suffix that is not a string: 400", st == 400 and r["error"]["param"] == "suffix", str(r))
    st, r = http_json(port, "POST", "/v1/chat/completions",
                      {"model": "fim", "messages": [{"role": "user", "content": "x"}], "suffix": "y"})
    s.case("chat with a suffix: 400 (it is a completions field)",
           st == 400 and r["error"]["param"] == "suffix", str(r)[:300])


def ollama_cases(port):
    pre, suf = "Once upon a time, a girl", " and they lived happily."
    _, c = complete(port, "fim", pre, suffix=suf)
    st, r = http_json(port, "POST", "/api/generate",
                      {"model": "fim", "prompt": pre, "suffix": suf, "stream": False,
                       "options": {"temperature": 0, "num_predict": 12}}, timeout=60)
    s.case("ollama /api/generate suffix: the same fill-in-the-middle as completions' suffix",
           st == 200 and r["response"] == c["choices"][0]["text"]
           and r["prompt_eval_count"] == c["usage"]["prompt_tokens"], f"{r} {c}")
    st, r = http_json(port, "POST", "/api/generate", {"model": "plain", "prompt": pre, "suffix": suf})
    s.case("ollama suffix on a model without FIM tokens: 400 {\"error\"} saying why",
           st == 400 and set(r) == {"error"} and "FIM tokens" in r["error"], str(r)[:300])


def infill(port, **kw):
    body = dict({"model": "fim", "input_prefix": "Once upon a time, a girl",
                 "input_suffix": " and they lived happily.", "n_predict": 12, "temperature": 0}, **kw)
    return http_json(port, "POST", "/infill", body, timeout=60)


def infill_cases(port):
    pre, suf, mid = "Once upon a time, a girl", " and they lived happily.", " named"
    st, r = infill(port)
    _, c = complete(port, "fim", pre, suffix=suf)
    s.case("/infill: llama-server's shape, the same text as completions' suffix",
           st == 200 and r.get("content") == c["choices"][0]["text"] and r.get("stop") is True
           and r.get("stop_type") in ("eos", "limit") and r.get("tokens_predicted") == 12
           and r.get("tokens_evaluated") == c["usage"]["prompt_tokens"], f"{r} {c}")
    st, r = infill(port, prompt=mid)
    want = [BOS, PRE] + toks(port, pre) + toks(port, mid) + [SUF] + toks(port, suf) + [MID]
    _, c = complete(port, "fim", want)
    s.case("/infill prompt: the middle starts with it (PRE prefix prompt SUF suffix MID)",
           st == 200 and r["content"] == c["choices"][0]["text"]
           and r["tokens_evaluated"] == len(want), f"{r} {c}")
    extra = [{"filename": "a.txt", "text": "The dog ran."}, {"text": "The cat sat."}]
    st, r = infill(port, model="fimrepo", input_extra=extra)
    want = ([REP] + toks(port, "myproject\n") + [SEP] + toks(port, "a.txt\n") + toks(port, "The dog ran.")
            + [SEP] + toks(port, "tmp\n") + toks(port, "The cat sat.") + [SEP] + toks(port, "filename\n")
            + [BOS, PRE] + toks(port, pre) + [SUF] + toks(port, suf) + [MID])
    _, c = complete(port, "fimrepo", want)
    s.case("/infill input_extra with repo/file tokens: the repository layout first",
           st == 200 and r["content"] == c["choices"][0]["text"]
           and r["tokens_evaluated"] == len(want), f"{r} {c}")
    st, r = infill(port, input_extra=extra)
    want = (toks(port, "\n\n--- snippet ---\n\n") + toks(port, "The dog ran.")
            + toks(port, "\n\n--- snippet ---\n\n") + toks(port, "The cat sat.")
            + [BOS, PRE] + toks(port, pre) + [SUF] + toks(port, suf) + [MID])
    _, c = complete(port, "fim", want)
    s.case("/infill input_extra without file tokens: snippet separators",
           st == 200 and r["content"] == c["choices"][0]["text"]
           and r["tokens_evaluated"] == len(want), f"{r} {c}")
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/infill", json.dumps({"model": "fim", "input_prefix": pre, "input_suffix": suf,
                                                "n_predict": 12, "temperature": 0, "stream": True}),
                 {"Content-Type": "application/json"})
    raw = conn.getresponse().read().decode()
    conn.close()
    evs = [json.loads(x[6:]) for x in raw.split("\n") if x.startswith("data: ")]
    st, r = infill(port)
    s.case("/infill streamed: content chunks add up, the last one stops",
           evs and "".join(e["content"] for e in evs) == r["content"] and evs[-1]["stop"] is True
           and all(not e["stop"] for e in evs[:-1]) and "[DONE]" not in raw, raw[:400])
    for body, param in (({"input_prefix": None}, "input_prefix"), ({"input_suffix": 5}, "input_suffix"),
                        ({"input_extra": {"text": "x"}}, "input_extra"),
                        ({"input_extra": [{"filename": "a"}]}, "input_extra"),
                        ({"n_predict": 0}, "n_predict"), ({"logprobs": 2}, "logprobs"),
                        ({"n_probs": 3}, "n_probs"), ({"model": "plain"}, "input_prefix")):
        st, r = infill(port, **body)
        s.case(f"/infill {json.dumps(body)[:50]}: 400 naming {param}",
               st == 400 and r["error"]["param"] == param, str(r)[:300])


with tempfile.TemporaryDirectory() as tmp:
    repo = make_repo(tmp)
    srv = RepoServer(repo, "--parallel", "2")
    try:
        for fn in (suffix_cases, infill_cases, ollama_cases):
            s.guard(fn.__name__, lambda fn=fn: fn(srv.port))
    finally:
        rc = srv.stop()
        s.case("server exits cleanly", rc == 0, f"exit {rc}")
s.finish()
