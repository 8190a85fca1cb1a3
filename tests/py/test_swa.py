"""test_swa.py - sliding-window layers keep only their window in the KV cache, through
`sampan serve` (127.0.0.1, free port) with a small random gemma3 model from tools/gguf_gen.py
(3 layers, two of them sliding over 8 positions, untied output so greedy text does not
repeat one token):
  - the same --kv-blocks memory runs more long sequences at once than with --kv-swa-full
    (every position kept, the old layout): four concurrent 200-token generations run
    together without a preemption, where the full layout must preempt (GET /stats), and
    GET /metrics shows the sliding part's gauges;
  - the greedy texts are the same with and without the two-part pool, alone and four at a
    time (the sliding layers never read outside their window);
  - prefix reuse after the window has moved many times gives the same text as the first
    run and as the full layout, with prefix hits counted; after other sequences reclaimed
    the small sliding part's cached blocks, the match is cut (prefix_swa_cut_blocks in
    GET /stats) and the text is still the same; no block is left held.
Last line:
    swa: N passed, N failed, N skipped"""
import http.client
import json
import os
import re
import sys
import tempfile
import threading
import time

from common import ROOT, Suite, Server, run

s = Suite("swa")

PROMPTS = ["hello world this is a long prompt about things",
           "another prompt that starts somewhere else entirely",
           "the third one has its own words in it too",
           "and a fourth, with numbers 12345 and more text"]


def body(prompt, n, model="g3"):
    return {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
            "ignore_eos": True}


def complete(port, b, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    r = c.getresponse()
    d = json.loads(r.read())
    c.close()
    return r.status, d


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return data


def stats(port):
    return json.loads(get(port, "/stats"))["models"]["g3"]


def metric(text, name):
    """The value of a sample of the model g3 (0 when absent)."""
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*model=\"g3\"[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def steps_over(text, k):
    """Steps with more than k sequences, from the sampan_batch_size histogram."""
    total = metric(text, "sampan_batch_size_count")
    m = re.search(r"^sampan_batch_size_bucket\{[^}]*model=\"g3\"[^}]*le=\"%d\"\} (\S+)$" % k,
                  text, re.M)
    return total - float(m.group(1)) if m else -1


def wait_idle(port, limit=20):
    end = time.time() + limit
    while True:
        d = stats(port)
        if (d["running"] == 0 and d["waiting"] == 0 and d["kv_blocks_used"] == 0) or \
                time.time() > end:
            return d
        time.sleep(0.05)


def together(port, n, model="g3"):
    """The four prompts at once, n tokens each: their texts in prompt order."""
    out = [None] * len(PROMPTS)

    def job(i):
        st, d = complete(port, body(PROMPTS[i], n, model))
        out[i] = d["choices"][0]["text"] if st == 200 else f"status {st}: {d}"

    ts = [threading.Thread(target=job, args=(i,)) for i in range(len(PROMPTS))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g3.gguf")
        rc, out, err = run([sys.executable, os.path.join(ROOT, "tools", "gguf_gen.py"), path,
                            "--preset", "gemma3-tiny", "--ctx", "512", "--untied", "--seed", "7",
                            "-q"], timeout=60)
        if not s.case("model written", rc == 0 and os.path.exists(path), err[-300:]):
            return
        # 40 whole blocks; a sequence of ~10 prompt + 200 tokens needs 14 of them: two fit
        # at once with every position kept, all four with the sliding layers' window only.
        common = ("--parallel", "4", "--kv-blocks", "40", "--step-tokens", "64")
        results = {}
        long_prompt = " ".join(f"word{i}" for i in range(40))  # far more than 8 positions
        for mode in ("full", "swa"):
            extra = ("--kv-swa-full",) if mode == "full" else ()
            srv = Server(*common, *extra, model=f"g3={path}")
            try:
                ready = srv.wait_log(r"event=sched_ready.*kv_swa_blocks=(\d+)")
                nswa = int(ready.group(1)) if ready else -1
                r = results[mode] = {"nswa": nswa}
                st, d = complete(srv.port, body(PROMPTS[0], 200))
                r["alone"] = d["choices"][0]["text"] if st == 200 else None
                r["together"] = together(srv.port, 200)
                m = get(srv.port, "/metrics")
                r["over2"] = steps_over(m, 2)
                r["preempt"] = stats(srv.port)["preemptions"]
                r["cap_swa"] = metric(m, "sampan_kv_cache_sliding_capacity_blocks")
                r["cap"] = metric(m, "sampan_kv_cache_capacity_blocks")
                # Prefix reuse: the same long prompt twice; the second run takes its cached
                # blocks, the sliding ones of the last window included.
                before = stats(srv.port)
                st, d1 = complete(srv.port, body(long_prompt, 40))
                st2, d2 = complete(srv.port, body(long_prompt, 40))
                after = stats(srv.port)
                r["prefix"] = (d1["choices"][0]["text"], d2["choices"][0]["text"])
                r["prefix_prompt"] = d1["usage"]["prompt_tokens"]
                r["hits"] = after["prefix_hits"] - before["prefix_hits"]
                r["cached"] = after["prompt_tokens_cached"] - before["prompt_tokens_cached"]
                # Other long sequences churn the small sliding part (its cached blocks are
                # reclaimed oldest first) while the global part keeps the prompt's blocks:
                # the match is cut to a prefix whose window is still cached, or to none.
                together(srv.port, 90)
                before = stats(srv.port)
                st3, d3 = complete(srv.port, body(long_prompt, 40))
                after = stats(srv.port)
                r["prefix3"] = d3["choices"][0]["text"]
                r["hits3"] = after["prefix_hits"] - before["prefix_hits"]
                r["cut3"] = after.get("prefix_swa_cut_blocks", 0) - before.get("prefix_swa_cut_blocks", 0)
                d = wait_idle(srv.port)
                r["idle"] = (d["kv_blocks_used"], d["kv_swa_blocks_used"])
                m = get(srv.port, "/metrics")
                r["used_gauge"] = metric(m, "sampan_kv_cache_sliding_used_blocks")
            finally:
                srv.stop()
        f, w = results["full"], results["swa"]
        s.case("full: one part (no sliding blocks)", f["nswa"] == 0 and f["cap_swa"] == 0,
               f"{f['nswa']} {f['cap_swa']}")
        s.case("swa: a small sliding part, more global blocks in the same memory",
               0 < w["nswa"] == w["cap_swa"] < 40 and w["cap"] > 40,
               f"sliding {w['nswa']} / {w['cap_swa']}, global {w['cap']}")
        s.case("full: four long sequences do not fit (preempted)", f["preempt"] > 0,
               str(f["preempt"]))
        s.case("swa: four long sequences fit (no preemption, steps with all four)",
               w["preempt"] == 0 and w["over2"] > 0, f"{w['preempt']} {w['over2']}")
        s.case("same text alone", w["alone"] is not None and w["alone"] == f["alone"],
               "" if w["alone"] == f["alone"] else f"{w['alone']!r:.200} != {f['alone']!r:.200}")
        s.case("text alone varies (not one token repeated)",
               w["alone"] is not None and len(set(w["alone"])) > 5)
        s.case("same texts four at a time", w["together"] == f["together"],
               "" if w["together"] == f["together"]
               else f"{w['together']!r:.300} != {f['together']!r:.300}")
        s.case("four at a time = alone", w["together"][0] == w["alone"])
        s.case("prefix reuse: prompt longer than several windows", w["prefix_prompt"] > 40,
               str(w["prefix_prompt"]))
        s.case("prefix reuse: hits after the window moved", w["hits"] > 0 and w["cached"] >= 32,
               f"hits {w['hits']} cached {w['cached']}")
        s.case("prefix reuse: same text with and without the reuse",
               w["prefix"][0] == w["prefix"][1] == f["prefix"][0],
               "" if w["prefix"][0] == w["prefix"][1] == f["prefix"][0]
               else f"{w['prefix']!r:.300} vs {f['prefix'][0]!r:.200}")
        s.case("prefix reuse: the match is cut where the sliding part lost the window",
               w["cut3"] > 0 and w["hits3"] + w["cut3"] == w["hits"] and f["cut3"] == 0,
               f"swa: hits {w['hits3']} + cut {w['cut3']} of {w['hits']}; full: cut {f['cut3']}")
        s.case("prefix reuse: same text after the cut", w["prefix3"] == f["prefix"][0])
        s.case("no block held when idle", w["idle"] == (0, 0) and f["idle"] == (0, 0),
               f"{w['idle']} {f['idle']}")
        s.case("sliding used gauge back to 0", w["used_gauge"] == 0, str(w["used_gauge"]))


def gemma4():
    """gemma4: sliding layers with their own head width, and shared layers that read an
    earlier layer's cache (its part's blocks): the same texts with and without the split."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g4.gguf")
        rc, out, err = run([sys.executable, os.path.join(ROOT, "tools", "gguf_gen.py"), path,
                            "--preset", "gemma4-tiny", "--ctx", "512", "--seed", "7", "-q"],
                           timeout=60)
        if not s.case("gemma4: model written", rc == 0 and os.path.exists(path), err[-300:]):
            return
        texts = {}
        for mode in ("full", "swa"):
            extra = ("--kv-swa-full",) if mode == "full" else ()
            srv = Server("--parallel", "4", "--kv-blocks", "40", "--step-tokens", "64", *extra,
                         model=f"g4={path}")
            try:
                ready = srv.wait_log(r"event=sched_ready.*kv_swa_blocks=(\d+)")
                # the log-probabilities, not only the text: a repetitive text could hide a
                # wrong cache read; the arithmetic is the same, so they must be equal
                st, d = complete(srv.port, dict(body(PROMPTS[0], 120, model="g4"), logprobs=1))
                texts[mode] = (int(ready.group(1)) if ready else -1,
                               d["choices"][0]["logprobs"]["token_logprobs"] if st == 200 else None,
                               together(srv.port, 120, model="g4"))
            finally:
                srv.stop()
        (nf, af, tf), (nw, aw, tw) = texts["full"], texts["swa"]
        s.case("gemma4: a sliding part is made", nf == 0 and nw > 0, f"{nf} {nw}")
        s.case("gemma4: the same log-probabilities alone with the split (past the window)",
               aw is not None and len(aw) == 120 and aw == af, f"{aw!r:.120} / {af!r:.120}")
        s.case("gemma4: the same texts four at a time with the split", tw == tf,
               f"{tw!r:.200} / {tf!r:.200}")


s.guard("swa", main)
s.guard("swa gemma4", gemma4)
s.finish()
