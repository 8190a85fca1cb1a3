#!/usr/bin/python3
"""test_speculative.py - speculative decoding (a draft model proposes, the model verifies)
through `sampan serve`: the output must be identical to the model alone, greedy and sampled
(seed for seed), with stop strings, several choices, log-probabilities, JSON mode, streaming
and concurrent requests, whatever the draft proposes. Three drafts cover the acceptance
paths: the model itself (every proposal accepted), its Q4_0 quantisation (most accepted, the
rest rejected at varying depths) and a random-weight model with the same vocabulary (almost
all rejected). Also: the counters in /stats and /metrics, and the configuration errors
(another vocabulary, a missing draft, a bad num_speculative_tokens) in words that name them.
Last line: speculative: N passed, N failed, N skipped"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from common import ROOT, Suite, binary, run, Server, RepoServer, http_json

s = Suite("speculative")
MODEL = os.path.join(ROOT, "models", "stories260K.gguf")
exe = binary()

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park. They",
           "One day, a big bird"]


def complete(port, **kw):
    body = dict({"model": "stories260K", "max_tokens": 48}, **kw)
    return http_json(port, "POST", "/v1/completions", body, timeout=60)


def stream_text(port, **kw):
    import http.client
    body = dict({"model": "stories260K", "max_tokens": 40, "stream": True}, **kw)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out = []
    for line in r:
        line = line.strip()
        if line.startswith(b"data: ") and line[6:] != b"[DONE]":
            ev = json.loads(line[6:])
            out.append(ev["choices"][0].get("text", ""))
    c.close()
    return "".join(out)


def requests():
    """(label, body) of every request compared between the servers."""
    out = []
    for i, p in enumerate(PROMPTS):
        out.append((f"greedy {i}", dict(prompt=p, temperature=0)))
        out.append((f"sampled {i}", dict(prompt=p, temperature=0.9, top_p=0.95, seed=11 + i)))
    out.append(("stop string", dict(prompt=PROMPTS[0], temperature=0, stop=[" park"])))
    out.append(("n=3 sampled", dict(prompt=PROMPTS[1], temperature=1.0, seed=5, n=3)))
    out.append(("logprobs", dict(prompt=PROMPTS[2], temperature=0, logprobs=3, max_tokens=16)))
    out.append(("penalties", dict(prompt=PROMPTS[3], temperature=0.7, seed=3,
                                  frequency_penalty=0.8, presence_penalty=0.4)))
    out.append(("max_tokens 1", dict(prompt=PROMPTS[0], temperature=0, max_tokens=1)))
    out.append(("max_tokens 5", dict(prompt=PROMPTS[0], temperature=0, max_tokens=5)))
    out.append(("json_object", dict(prompt="{\"name\": \"", temperature=0.5, seed=2,
                                    response_format={"type": "json_object"}, max_tokens=40)))
    return out


def strip(ans):
    """The parts of an answer that must match: choices' text, finish reasons, logprobs."""
    if not isinstance(ans, dict) or "choices" not in ans:
        return ans
    return [(c.get("text"), c.get("finish_reason"), c.get("logprobs")) for c in ans["choices"]]


def make_drafts(tmp):
    drafts = {"self": MODEL}
    q4 = os.path.join(tmp, "draft-q4_0.gguf")
    rc, _, err = run([exe, "quantize", MODEL, q4, "q4_0"], timeout=120)
    if rc == 0:
        drafts["q4_0"] = q4
    else:
        s.case("quantize a Q4_0 draft", False, err[-300:])
    rnd = os.path.join(tmp, "draft-random.gguf")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gguf_gen.py"), "--dim", "64",
                        "--n-layers", "2", "--n-heads", "4", "--n-kv-heads", "2", "--ff", "128",
                        "--vocab-from", MODEL, "--seed", "9", "-q", rnd],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        drafts["random"] = rnd
    else:
        s.case("generate a random-weight draft", False, (p.stdout + p.stderr)[-300:])
    return drafts


def compare(srv, name, cases, want):
    """Every case on srv against the model alone; returns the acceptance rate of the greedy
    cases (sent first: with sampling the model draws what the greedy draft did not propose)."""
    same, rate = 0, None
    for label, body in cases:
        if rate is None and body.get("temperature", 1) != 0:
            st, stats = http_json(srv.port, "GET", "/stats")
            m = stats["models"]["stories260K"]
            rate = m["spec_accepted_tokens"] / max(1, m["spec_draft_tokens"])
        st, got = complete(srv.port, **body)
        if st == 200 and strip(got) == want[label]:
            same += 1
        else:
            s.case(f"draft {name}: {label} identical to the model alone", False,
                   f"{st} {json.dumps(strip(got))[:300]} vs {json.dumps(want[label])[:300]}")
    s.case(f"draft {name}: {same}/{len(cases)} answers identical to the model alone",
           same == len(cases))
    return rate


def main():
    if exe is None or not os.path.exists(MODEL):
        s.skip("speculative", "build/sampan or models/stories260K.gguf is missing")
        return
    tmp = tempfile.mkdtemp(prefix="sp-spec-")
    try:
        run_all(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_all(tmp):
    drafts = make_drafts(tmp)
    cases = requests()
    plain = Server("--parallel", "4")
    try:
        want = {}
        for label, body in cases:
            st, got = complete(plain.port, **body)
            want[label] = strip(got) if st == 200 else ("status", st)
        s.case("the model alone answers every case", all(w and w[0] != "status"
                                                           for w in want.values()))
        want_stream = stream_text(plain.port, prompt=PROMPTS[0], temperature=0.8, seed=4)
    finally:
        plain.stop()

    rates = {}
    for name, path in drafts.items():
        k = "5" if name == "random" else "4"
        srv = Server("--parallel", "4", "--draft-model", path, "--spec-tokens", k)
        try:
            rates[name] = compare(srv, name, cases, want)
            s.case(f"draft {name}: streamed text identical",
                   stream_text(srv.port, prompt=PROMPTS[0], temperature=0.8, seed=4) == want_stream)
            # Four at once: each sequence verifies its own proposals in a shared step.
            got, errs = {}, []

            def one(label, body):
                try:
                    st, ans = complete(srv.port, **body)
                    got[label] = strip(ans) if st == 200 else ("status", st)
                except Exception as e:  # noqa: BLE001 - reported below
                    errs.append(repr(e))
            threads = [threading.Thread(target=one, args=c) for c in cases[:8]]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
            s.case(f"draft {name}: 8 concurrent requests identical to the model alone",
                   not errs and all(got.get(l) == want[l] for l, _ in cases[:8]), errs[:2])
            st, stats = http_json(srv.port, "GET", "/stats")
            m = stats["models"]["stories260K"]
            s.case(f"draft {name}: /stats counts verifications and proposals",
                   m["spec_verifications"] > 0 and m["spec_draft_tokens"] >= m["spec_verifications"]
                   and 0 <= m["spec_accepted_tokens"] <= m["spec_draft_tokens"],
                   {k: v for k, v in m.items() if k.startswith("spec")})
            st, metrics = http_json(srv.port, "GET", "/metrics")
            text = metrics.decode() if isinstance(metrics, bytes) else str(metrics)
            s.case(f"draft {name}: /metrics has the acceptance rate",
                   "sampan_spec_decode_acceptance_rate{" in text and
                   "sampan_spec_decode_tokens_per_verification{" in text)
        finally:
            s.case(f"draft {name}: clean exit", srv.stop() == 0)
    s.case("greedy, the model drafting for itself: every proposal accepted",
           rates.get("self") == 1.0, rates)
    if "q4_0" in rates:
        s.case("greedy, the Q4_0 draft: most accepted, some rejected", 0.5 < rates["q4_0"] < 1.0,
               rates)
    if "random" in rates:
        s.case("greedy, the random draft: few accepted", rates["random"] < 0.3, rates)

    # Configuration errors, named.
    vocab_only = os.path.join(ROOT, "tests", "data", "tokenizer", "ggml-vocab-gpt-2.gguf")
    rc, _, err = run([exe, "serve", "--model", MODEL, "--port", "0", "--draft-model",
                      vocab_only], timeout=30)
    s.case("a draft that cannot be loaded stops the server with its name",
           rc != 0 and "draft model" in err, err.strip()[-200:])
    rc, _, err = run([exe, "serve", "--model", MODEL, "--port", "0", "--draft-model", MODEL,
                      "--spec-tokens", "0"], timeout=30)
    s.case("--spec-tokens 0 is a usage error", rc == 2 and "spec-tokens" in err,
           err.strip()[-200:])
    if "random" in drafts:
        other = os.path.join(tmp, "other-vocab.gguf")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gguf_gen.py"), "--dim", "64",
                        "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "2", "--ff", "64",
                        "--vocab", "300", "-q", other], capture_output=True, timeout=120)
        rc, _, err = run([exe, "serve", "--model", MODEL, "--port", "0", "--draft-model", other],
                         timeout=30)
        s.case("a draft with another vocabulary is refused, saying so",
               rc != 0 and "vocabulary" in err, err.strip()[-200:])

    # Through the repository: parameters.draft_model names another model.
    repo = os.path.join(tmp, "repo")
    for name, cfg in (("stories", {"parameters": {"draft_model": {"string_value": "draft"},
                                                  "num_speculative_tokens": {"string_value": "3"}}}),
                      ("draft", {}),
                      ("nodraft", {"parameters": {"draft_model": {"string_value": "missing"}}}),
                      ("badk", {"parameters": {"draft_model": {"string_value": "draft"},
                                               "num_speculative_tokens": {"string_value": "99"}}})):
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(drafts.get("q4_0", MODEL) if name == "draft" else MODEL,
                    os.path.join(repo, name, "1", "model.gguf"))
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump(dict({"name": name, "backend": "llm"}, **cfg), f)
    srv = RepoServer(repo, "--parallel", "2")
    try:
        st, idx = srv.req("POST", "/v2/repository/index", {})
        by = {e["name"]: e for e in idx} if isinstance(idx, list) else {}
        s.case("repository: a model with a draft is READY", by.get("stories", {}).get("state") == "READY",
               by.get("stories"))
        s.case("repository: a missing draft model is named in the reason",
               by.get("nodraft", {}).get("state") == "UNAVAILABLE" and
               "missing" in by.get("nodraft", {}).get("reason", "") and
               repo not in by.get("nodraft", {}).get("reason", ""), by.get("nodraft"))
        s.case("repository: num_speculative_tokens out of range is named",
               by.get("badk", {}).get("state") == "UNAVAILABLE" and
               "num_speculative_tokens" in by.get("badk", {}).get("reason", ""), by.get("badk"))
        st, got = http_json(srv.port, "POST", "/v1/completions",
                            {"model": "stories", "prompt": PROMPTS[0], "temperature": 0,
                             "max_tokens": 48}, timeout=60)
        s.case("repository: the drafted model answers like the model alone",
               st == 200 and strip(got) == want["greedy 0"], strip(got))
        st, stats = srv.req("GET", "/stats")
        m = stats["models"].get("stories", {})
        s.case("repository: its proposals are counted", m.get("spec_verifications", 0) > 0, m)
    finally:
        s.case("repository: clean exit", srv.stop() == 0)


main()
s.finish()
