#!/usr/bin/python3
"""test_lora.py - LoRA adapters served with their base model (docs/lora.md), against the real
server on 127.0.0.1 (free port) with the demo model and adapters made by tools/lora_gen.py:

  - a repository stories/1/model.gguf with stories/adapters/{alpha,beta}.gguf loads both at
    start (a corrupt adapters/bad.gguf beside them is skipped with its error logged);
    /v1/models lists "stories:alpha" and "stories:beta" with their parent;
  - greedy answers of "stories", "stories:alpha" and "stories:beta" equal the NumPy reference
    (tests/ref, W + scale B A in float64), and "stories:alpha" equals a model file with the
    adapter merged into its weights (served as another repository model);
  - the base and both adapters in concurrent requests (one batch: the batch-size histogram
    sees steps of several sequences) each give their own answer, and a long prompt shared by
    base and adapter requests (full KV blocks in the prefix cache) does not leak between them;
  - KServe generate with "stories:alpha" gives the OpenAI answer; an unknown adapter is 404;
    embeddings with an adapter are refused;
  - run-time POST /v2/repository/models/stories:gamma/load and .../unload (in the default
    control mode), reload of a changed file, and an unload while a stream uses the adapter:
    the stream finishes with the same text, new requests get 404;
  - bad adapter files refused at load with the file and the tensor named (shape, rank,
    missing lora_b, a NaN, a wrong type, a foreign tensor, not an adapter, another
    architecture).
Last line:
    lora: N passed, N failed, N skipped"""
import http.client
import json
import os
import shutil
import tempfile
import threading
import time

from common import ROOT, RepoServer, Suite, binary, http_json

s = Suite("lora")
exe = binary()
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")
N_NEW = 24
PROMPT = [1, 403, 407, 261, 378]          # BOS "Once upon a time" in the demo vocabulary
LONG = [1] + [(i * 37) % 500 + 3 for i in range(40)]  # 41 tokens: two full KV blocks


def main():
    if exe is None or not os.path.isfile(DEMO):
        s.skip("lora", "build/sampan or models/stories260K.gguf missing")
        return
    try:
        import numpy  # noqa: F401
        import lora_gen
        from ref_forward import RefModel, greedy
    except ImportError as e:
        s.skip("lora", f"numpy missing ({e})")
        return
    tmp = tempfile.mkdtemp(prefix="sampan-lora-")
    try:
        run(tmp, lora_gen, RefModel, greedy)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def completion(port, model, prompt, n=N_NEW, stream=False, timeout=30):
    st, body = http_json(port, "POST", "/v1/completions",
                         {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                          "logprobs": 0}, timeout=timeout)
    return st, body


def ref_text(m, prompt, n, pieces):
    from ref_forward import detokenize
    s_ = m.session()
    logits = s_.forward(prompt)[-1]
    ids = []
    for _ in range(n):
        t = int(logits.argmax())
        if t == 2:  # EOS: the server stops there
            break
        ids.append(t)
        logits = s_.forward([t])[-1]
    return ids, detokenize(pieces, ids, strip_first_space=False).decode("utf-8", "replace")


def run(tmp, lora_gen, RefModel, greedy):
    repo = os.path.join(tmp, "repo")
    ad_dir = os.path.join(repo, "stories", "adapters")
    os.makedirs(os.path.join(repo, "stories", "1"))
    os.makedirs(ad_dir)
    os.makedirs(os.path.join(repo, "merged", "1"))
    shutil.copy(DEMO, os.path.join(repo, "stories", "1", "model.gguf"))
    for name in ("stories", "merged"):
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump({"name": name, "backend": "llm"}, f)
    alpha = os.path.join(ad_dir, "alpha.gguf")
    beta = os.path.join(ad_dir, "beta.gguf")
    # alpha: every projection, rank 8, alpha 16 (scale 2); beta: attention only, rank 16, f16.
    lora_gen.make(DEMO, alpha, rank=8, alpha=16, strength=0.25, seed=3,
                  merge=os.path.join(repo, "merged", "1", "model.gguf"))
    lora_gen.make(DEMO, beta, rank=16, targets="q,k,v,o", ttype="f16", strength=0.5, seed=4)
    lora_gen.make(DEMO, os.path.join(ad_dir, "bad.gguf"), corrupt="rank")

    base = RefModel(DEMO)
    pieces = base.tokens
    want = {"stories": ref_text(base, PROMPT, N_NEW, pieces),
            "stories:alpha": ref_text(RefModel(DEMO).apply_lora(alpha), PROMPT, N_NEW, pieces),
            "stories:beta": ref_text(RefModel(DEMO).apply_lora(beta), PROMPT, N_NEW, pieces)}
    s.case("reference: the adapters change the answer",
           len({w[1] for w in want.values()}) == 3, str({k: v[1][:30] for k, v in want.items()}))

    srv = RepoServer(repo, "--parallel", "4")
    try:
        port = srv.port
        m = srv.wait_log(r"event=adapter_load_failed model=stories adapter=bad error=.*bad\.gguf: "
                         r"tensor 'blk\.0\.attn_q\.weight\.lora_b' has rank 9")
        s.case("start: a bad adapter file is skipped with its file and tensor logged", m is not None)
        st, body = srv.req("GET", "/v1/models")
        ids = {d["id"]: d for d in body["data"]} if st == 200 else {}
        s.case("/v1/models lists base:adapter entries with their parent",
               ids.get("stories:alpha", {}).get("parent") == "stories" and "stories:beta" in ids
               and "stories:bad" not in ids and "stories" in ids, str(sorted(ids)))
        st, body = srv.req("GET", "/v1/models/stories:alpha")
        s.case("GET /v1/models/stories:alpha", st == 200 and body.get("id") == "stories:alpha",
               f"{st} {body}")

        # Per-request switching, against the reference.
        got = {}
        for model in ("stories", "stories:alpha", "stories:beta", "stories:alpha", "stories"):
            st, body = completion(port, model, PROMPT)
            got.setdefault(model, []).append(body["choices"][0]["text"] if st == 200 else f"{st}")
            if st == 200 and body.get("model") != model:
                s.case(f"{model}: response names the model", False, body.get("model"))
        for model, (ids_, text) in want.items():
            s.case(f"{model} == NumPy reference", got[model][0] == text,
                   f"got {got[model][0]!r} want {text!r}")
        s.case("switching back and forth gives the same answers",
               all(len(set(v)) == 1 for v in got.values()), str(got))
        st, body = completion(port, "merged", PROMPT)
        s.case("stories:alpha == the merged-weights model",
               st == 200 and body["choices"][0]["text"] == got["stories:alpha"][0],
               f"{body['choices'][0]['text']!r}" if st == 200 else str(st))

        # One batch: the base and both adapters concurrently, twice over.
        models = ["stories", "stories:alpha", "stories:beta"] * 2
        res = [None] * len(models)
        gate = threading.Barrier(len(models))

        def worker(i):
            gate.wait(5)
            st_, b_ = completion(port, models[i], PROMPT, n=N_NEW)
            res[i] = b_["choices"][0]["text"] if st_ == 200 else st_

        before = batch_steps(port)
        th = [threading.Thread(target=worker, args=(i,)) for i in range(len(models))]
        for t in th:
            t.start()
        for t in th:
            t.join(30)
        after = batch_steps(port)
        s.case("concurrent base + 2 adapters: each its own answer",
               all(res[i] == got[models[i]][0] for i in range(len(models))), str(res))
        if before is None or after is None:
            s.skip("concurrent requests shared steps", "no sampan_batch_size in /metrics")
        else:
            s.case("concurrent requests shared steps (batch size > 1)",
                   after[1] - before[1] > 0, f"steps with >1 sequence: {after[1] - before[1]}")

        # Prefix cache: the same long prompt with and without adapters.
        outs = {}
        for model in ("stories", "stories:alpha", "merged", "stories:beta", "stories"):
            st, body = completion(port, model, LONG, n=12)
            outs.setdefault(model, []).append(body["choices"][0]["text"] if st == 200 else st)
        _, want_long_a = ref_text(RefModel(DEMO).apply_lora(alpha), LONG, 12, pieces)
        _, want_long_b = ref_text(RefModel(DEMO).apply_lora(beta), LONG, 12, pieces)
        s.case("prefix cache: an adapter never reuses the base's KV blocks",
               outs["stories:alpha"][0] == outs["merged"][0] == want_long_a
               and outs["stories:beta"][0] == want_long_b
               and outs["stories"][0] == outs["stories"][1],
               str(outs))

        # KServe.
        st, body = srv.req("POST", "/v2/models/stories:alpha/generate",
                           {"text_input": "Once upon a time",
                            "parameters": {"max_tokens": 8, "temperature": 0}})
        st2, oai = completion(port, "stories:alpha", "Once upon a time", n=8)
        s.case("KServe generate on stories:alpha == OpenAI's answer",
               st == 200 and body.get("model_name") == "stories:alpha" and st2 == 200
               and body.get("text_output") == oai["choices"][0]["text"], f"{st} {body} {oai}")
        st, body = srv.req("POST", "/v2/models/stories:nope/generate", {"text_input": "Once"})
        s.case("KServe: unknown adapter is 404", st == 404, f"{st} {body}")
        st, body = completion(port, "stories:nope", PROMPT)
        s.case("OpenAI: unknown adapter is 404 model_not_found",
               st == 404 and body["error"]["code"] == "model_not_found", f"{st} {body}")
        st, body = srv.req("POST", "/v1/embeddings", {"model": "stories:alpha", "input": "hi"})
        s.case("embeddings with an adapter are refused", st == 400, f"{st} {body}")

        # Run-time load and unload.
        gamma = os.path.join(ad_dir, "gamma.gguf")
        st, body = completion(port, "stories:gamma", PROMPT)
        s.case("not yet loaded: 404", st == 404, str(st))
        lora_gen.make(DEMO, gamma, rank=4, strength=0.3, seed=9)
        st, body = srv.req("POST", "/v2/repository/models/stories:gamma/load")
        s.case("load stories:gamma at run time", st == 200, f"{st} {body}")
        _, want_g = ref_text(RefModel(DEMO).apply_lora(gamma), PROMPT, N_NEW, pieces)
        st, body = completion(port, "stories:gamma", PROMPT)
        s.case("stories:gamma answers like the reference",
               st == 200 and body["choices"][0]["text"] == want_g, f"{st} {body}")
        lora_gen.make(DEMO, gamma, rank=4, strength=0.3, seed=10)  # changed file, same name
        st, _ = srv.req("POST", "/v2/repository/models/stories:gamma/load")
        _, want_g2 = ref_text(RefModel(DEMO).apply_lora(gamma), PROMPT, N_NEW, pieces)
        st2, body = completion(port, "stories:gamma", PROMPT)
        s.case("reloading a changed adapter serves the new one",
               st == 200 and st2 == 200 and body["choices"][0]["text"] == want_g2
               and want_g2 != want_g, f"{st} {st2}")
        st, _ = srv.req("POST", "/v2/repository/models/stories:gamma/unload")
        st2, _ = completion(port, "stories:gamma", PROMPT)
        st3, _ = srv.req("POST", "/v2/repository/models/stories:gamma/unload")
        s.case("unload: 200, then requests 404, a second unload 404",
               (st, st2, st3) == (200, 404, 404), f"{st} {st2} {st3}")
        st, body = srv.req("POST", "/v2/repository/models/stories:../load")
        s.case("a bad adapter name is 400", st == 400, f"{st} {body}")

        unload_during_stream(srv, port, got["stories:alpha"][0])

        # Bad files at run-time load: the file and the tensor named.
        cases = {"shape": "tensor 'blk.0.attn_q.weight.lora_a' has shape [65, 8]",
                 "rank": "tensor 'blk.0.attn_q.weight.lora_b' has rank 9 but its lora_a has rank 8",
                 "missing-b": "tensor 'blk.0.attn_q.weight.lora_a' has no matching lora_b",
                 "nan": "tensor 'blk.0.attn_q.weight.lora_b' holds a NaN",
                 "type": "tensor 'blk.0.attn_q.weight.lora_b' has type q4_0",
                 "name": "tensor 'output.weight.lora_a' is not a LoRA tensor of this model",
                 "layer": "tensor 'blk.5.attn_q.weight.lora_a' is not a LoRA tensor",
                 "not-adapter": "not a LoRA adapter: general.type is 'model'",
                 "arch": "general.architecture 'qwen2' does not match the model's 'llama'"}
        for kind, msg in cases.items():
            nm = "bad-" + kind
            lora_gen.make(DEMO, os.path.join(ad_dir, nm + ".gguf"), corrupt=kind)
            st, body = srv.req("POST", f"/v2/repository/models/stories:{nm}/load")
            err = body.get("error", "") if isinstance(body, dict) else str(body)
            s.case(f"bad adapter ({kind}) refused naming file and tensor",
                   st == 400 and f"stories/adapters/{nm}.gguf: " in err and msg in err
                   and repo not in err, f"{st} {err}")
        st, body = completion(port, "stories", PROMPT)
        s.case("the base still serves after the refusals",
               st == 200 and body["choices"][0]["text"] == got["stories"][0], str(st))
    finally:
        rc = srv.stop()
        s.case("server exits cleanly", rc == 0, f"exit {rc}")


def batch_steps(port):
    """(steps, steps with more than one sequence) of the model stories, from /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode()
    finally:
        c.close()
    one = total = None
    for line in text.splitlines():
        if line.startswith("sampan_batch_size_bucket{") and 'model="stories"' in line:
            if 'le="1"' in line:
                one = int(float(line.split()[-1]))
        if line.startswith("sampan_batch_size_count{") and 'model="stories"' in line:
            total = int(float(line.split()[-1]))
    if one is None or total is None:
        return None
    return total, total - one


def unload_during_stream(srv, port, want_prefix):
    """Stream from stories:alpha, unload alpha after the first tokens: the stream ends
    normally with the same text as before (first N_NEW tokens), new requests get 404."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    text, finish, unloaded = "", None, None
    try:
        c.request("POST", "/v1/completions",
                  body=json.dumps({"model": "stories:alpha", "prompt": PROMPT, "max_tokens": 200,
                                   "temperature": 0, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        deadline = time.time() + 30
        while time.time() < deadline:
            line = r.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                break
            ev = json.loads(line[6:])
            ch = ev["choices"][0]
            text += ch.get("text", "")
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
            if unloaded is None and len(text) > 0:
                unloaded = srv.req("POST", "/v2/repository/models/stories:alpha/unload")[0]
    finally:
        c.close()
    s.case("unload while streaming: the stream finishes on the adapter it started with",
           unloaded == 200 and finish in ("length", "stop") and text.startswith(want_prefix),
           f"unload {unloaded} finish {finish} text {text[:60]!r}")
    st, _ = completion(port, "stories:alpha", PROMPT)
    s.case("after the unload: 404", st == 404, str(st))
    m = srv.wait_log(r"event=adapter_unloaded model=stories version=1 adapter=alpha")
    s.case("the unload is logged", m is not None)


main()
s.finish()
