"""test_spec_swa.py - a speculative-decoding draft with sliding-window layers keeps only a
ring of blocks per slot for them (sched.c, draft_ring_step), through `sampan serve`
(127.0.0.1, free port). Models from tools/gguf_gen.py: a gemma3-shaped target (3 layers, two
sliding over 8 positions) and a gemma2-shaped draft (every other layer sliding over 8), the
same synthetic vocabulary, context 512 and --step-tokens 16, so a draft slot would hold 32
blocks and the ring holds 4 (positions wrap around it many times in 150 tokens):
  - the sched_ready log line names the ring (draft_swa_ring_blocks=4), and 0 with
    --kv-swa-full (whole slots, the layout before);
  - the target drafting for itself with the ring: every proposal accepted (the draft's
    logits are the model's bits, so its sliding layers read exactly their window);
  - the gemma2 draft, ring vs whole slots: the same proposals and acceptances
    (GET /stats spec counters equal over the same sequential requests: rejections rewind
    the draft inside its ring), and every greedy text identical to the model alone, one at
    a time and four at once.
Last line:
    spec_swa: N passed, N failed, N skipped"""
import http.client
import json
import os
import sys
import tempfile
import threading

from common import ROOT, Suite, Server, run

s = Suite("spec_swa")

PROMPTS = ["hello world this is a long prompt about things",
           "another prompt that starts somewhere else entirely",
           "the third one has its own words in it too",
           "and a fourth, with numbers 12345 and more text"]
N_TOKENS = 150


def complete(port, prompt, n=N_TOKENS, timeout=120):
    b = {"model": "g3", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
    r = c.getresponse()
    d = json.loads(r.read())
    c.close()
    return d["choices"][0]["text"] if r.status == 200 else f"status {r.status}: {d}"


def spec_stats(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/stats")
    d = json.loads(c.getresponse().read())["models"]["g3"]
    c.close()
    return {k: v for k, v in d.items() if k.startswith("spec")}


def texts(port):
    """Each prompt alone, then the four at once: (alone, together)."""
    alone = [complete(port, p) for p in PROMPTS]
    out = [None] * len(PROMPTS)

    def job(i):
        out[i] = complete(port, PROMPTS[i])

    ts = [threading.Thread(target=job, args=(i,)) for i in range(len(PROMPTS))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return alone, out


def serve(path, draft=None, full=False):
    extra = ["--parallel", "4", "--step-tokens", "16"]
    if draft:
        extra += ["--draft-model", draft, "--spec-tokens", "4"]
    if full:
        extra.append("--kv-swa-full")
    return Server(*extra, model=f"g3={path}")


def ring_blocks(srv):
    m = srv.wait_log(r"event=sched_ready.*draft_swa_ring_blocks=(\d+)")
    return int(m.group(1)) if m else -1


def main():
    with tempfile.TemporaryDirectory() as tmp:
        g3, g2 = os.path.join(tmp, "g3.gguf"), os.path.join(tmp, "g2.gguf")
        for path, preset, seed in ((g3, "gemma3-tiny", "7"), (g2, "gemma2-tiny", "9")):
            rc, _, err = run([sys.executable, os.path.join(ROOT, "tools", "gguf_gen.py"), path,
                              "--preset", preset, "--ctx", "512", "--untied", "--seed", seed,
                              "-q"], timeout=60)
            if not s.case(f"{preset} written", rc == 0 and os.path.exists(path), err[-300:]):
                return
        srv = serve(g3)
        try:
            want = texts(srv.port)
        finally:
            srv.stop()
        s.case("the model alone answers", all(not t.startswith("status") for t in want[0]),
               repr(want[0][0][:80]))

        srv = serve(g3, draft=g3)
        try:
            ring = ring_blocks(srv)
            got = texts(srv.port)
            st = spec_stats(srv.port)
        finally:
            s.case("self draft: clean exit", srv.stop() == 0)
        s.case("self draft: the draft's sliding layers keep a ring of 4 blocks", ring == 4, ring)
        s.case("self draft: texts identical to the model alone", got == want,
               "" if got == want else repr(got)[:200])
        s.case("self draft: every proposal accepted",
               st.get("spec_draft_tokens", 0) > 100 and
               st.get("spec_accepted_tokens") == st.get("spec_draft_tokens"), st)

        runs = {}
        for mode in ("ring", "full"):
            srv = serve(g3, draft=g2, full=(mode == "full"))
            try:
                ring = ring_blocks(srv)
                alone = [complete(srv.port, p) for p in PROMPTS]
                st = spec_stats(srv.port)  # sequential requests only: deterministic
                _, together = texts(srv.port)
                runs[mode] = (ring, alone, together, st)
            finally:
                s.case(f"gemma2 draft, {mode}: clean exit", srv.stop() == 0)
        (rr, ra, rt, rs), (fr, fa, ft, fs) = runs["ring"], runs["full"]
        s.case("gemma2 draft: a ring of 4 blocks, none with --kv-swa-full",
               rr == 4 and fr == 0, (rr, fr))
        s.case("gemma2 draft: texts identical to the model alone (ring, whole slots)",
               ra == want[0] and fa == want[0] and rt == want[1] and ft == want[1],
               "" if ra == want[0] and rt == want[1] else repr([ra, rt])[:200])
        s.case("gemma2 draft: proposals rejected and accepted (the ring is rewound)",
               0 < rs.get("spec_accepted_tokens", 0) < rs.get("spec_draft_tokens", 0), rs)
        s.case("gemma2 draft: the same proposals and acceptances with the ring as with whole slots",
               rs == fs, (rs, fs))


if __name__ == "__main__":
    main()
    s.finish()
