"""test_eval_profile.py - `sampan eval --profile`: where a prefill's and a decode's time went,
stage by stage (core/pool.h's profile, the engine's labels).

Checked: on the demo model (F32, 5 layers) the prefill's table has every stage of a llama step
with the calls the step makes (one qkv, rope, attention, attn_out, ffn_gate_up, ffn_act and
ffn_down a layer, two norms a layer and one more, one embed and one output) and the decode's the
same per token; the shares and "(outside jobs)" add up to the wall time; without the flag no
table. On a generated Q4_0 model one "quantize" run per product (its activations become Q8_0);
on a generated mixture-of-experts model the MoE stages; an encoder (which eval does not run)
refused with a message. bench/report.py (bench/run.sh's table) parses the same output into the
decode's split (products, attention, other stages, outside), which adds up to the step, and
prints its table only for profiled runs. A few seconds."""
import os
import sys
import tempfile

from common import ROOT, DEMO_MODEL, Suite, binary, run

sys.path.insert(0, os.path.join(ROOT, "bench"))
import gguf_gen  # noqa: E402  (tools/, on common's path)
import report  # noqa: E402

s = Suite("eval_profile")
exe = binary()
if exe is None:
    s.skip("all", "sampan not built")
    s.finish()

def profiles(err):
    """{phase: (rows {label: (calls, ms, share, tail)}, outside share)} from eval's stderr,
    read by bench/report.py's parser (the one bench/run.sh's table uses)."""
    prof = report.parse_sampan_lines(err.splitlines()).get("profile", {})
    return {ph: ({k: (v["calls"], v["ms"], v["share"], v["tail"]) for k, v in p["stages"].items()},
                 p["outside_share"]) for ph, p in prof.items()}


def evaluate(model, *args):
    rc, out, err = run([exe, "eval", "-m", model, "--random", "24", "--gen", "6", "-t", "2",
                        *args], timeout=120)
    return rc, err


rc, err = evaluate(DEMO_MODEL, "--profile")
p = profiles(err)
n_layer = 5
want = {"embed": 1, "norm": 2 * n_layer + 1, "qkv": n_layer, "rope": n_layer,
        "attention": n_layer, "attn_out": n_layer, "ffn_gate_up": n_layer, "ffn_act": n_layer,
        "ffn_down": n_layer, "output": 1}
for phase in ("prefill", "decode"):
    rows, outside = p.get(phase, ({}, None))
    calls = {k: v[0] for k, v in rows.items()}
    ok = rc == 0 and calls == want and outside is not None
    s.case(f"demo model, {phase}: every stage, the step's calls", ok,
           "" if ok else f"rc {rc} {calls} (want {want}) {err[-1500:]}")
    total = sum(v[2] for v in rows.values()) + (outside or 0.0)
    ok = rc == 0 and abs(total - 100.0) <= 0.1 * (len(rows) + 1) and \
        all(0 <= v[2] <= 100 and 0 <= v[3] <= 100 and v[1] >= 0 for v in rows.values())
    s.case(f"demo model, {phase}: the shares and the outside add up to the wall time", ok,
           "" if ok else f"{total} {rows} {outside}")

rc, err = evaluate(DEMO_MODEL)
s.case("without --profile: no table", rc == 0 and "profile:" not in err and "decode:" in err,
       err[-800:])

# bench/report.py reads the same output back (bench/run.sh runs eval with --profile)
with tempfile.TemporaryDirectory() as tmp:
    logs = []
    for args in (["--profile"], []):
        rc, err = evaluate(DEMO_MODEL, *args)
        logs.append(os.path.join(tmp, f"demo{len(logs)}.log"))
        with open(logs[-1], "w", encoding="utf-8") as f:
            f.write(err)
    run_p, run_plain = (report.parse_sampan_log(x) for x in logs)
    d = report.decode_split(run_p)
    ok = (d is not None and "decode" in run_p and d["attention"] > 0 and d["products"] > 0 and
          abs(d["products"] + d["attention"] + d["other_stages"] + d["outside"] - 100) < 1.5 and
          set(run_p["profile"]["prefill"]["stages"]) == set(want) and
          "profile" not in run_plain and report.decode_split(run_plain) is None)
    s.case("report.py: the profile parsed, the decode split adds up", ok,
           "" if ok else f"{d} {run_p.get('profile')} {run_plain}")
    row = {"type": "f32", "read_bytes_per_token": 1e6, "decode_limit_tok_s": 1000.0,
           "sampan": {"decode_tok_s": run_p["decode"]["tok_s"],
                      "prefill_tok_s": run_p["prefill"]["tok_s"], "runs": [run_p]}}
    plain = dict(row, type="q8_0", sampan=dict(row["sampan"], runs=[run_plain]))
    t = report.table({"read_bw_2t_gb_s": 36.0, "results": [row, plain], "meta": {}})
    part = t.split("Where Sampan's decode step went")[-1]
    ok = ("Where Sampan's decode step went" in t and "| F32 | " in part and
          "| Q8_0 | " not in part)
    s.case("report.py: the decode split table, a row only for a profiled run", ok, "" if ok else t)

with tempfile.TemporaryDirectory() as tmp:
    q4 = os.path.join(tmp, "tiny-q4_0.gguf")
    gguf_gen.generate(q4, dict(preset="tiny", type="q4_0", seed=5))
    rc, err = evaluate(q4, "--profile")
    rows = profiles(err).get("decode", ({}, None))[0]
    products = sum(rows.get(k, (0,))[0] for k in ("qkv", "attn_out", "ffn_gate_up", "ffn_down",
                                                  "output"))
    ok = rc == 0 and "quantize" in rows and products > 0 and rows["quantize"][0] == products
    s.case("Q4_0: one quantize run per product", ok, "" if ok else f"rc {rc} {rows} {err[-800:]}")

    moe = os.path.join(tmp, "moe.gguf")
    gguf_gen.generate(moe, dict(preset="qwen2moe-tiny", type="q8_0", seed=3))
    rc, err = evaluate(moe, "--profile")
    rows = profiles(err).get("decode", ({}, None))[0]
    ok = rc == 0 and all(k in rows for k in ("moe_products", "moe_route", "moe_combine",
                                             "attention", "qkv"))
    s.case("mixture of experts: its stages", ok, "" if ok else f"rc {rc} {rows} {err[-800:]}")

    bert = os.path.join(tmp, "bert.gguf")
    gguf_gen.generate(bert, dict(arch="bert", dim=64, n_heads=4, n_layers=2, ff=128, ctx=128,
                                 pooling="cls", vocab_from=os.path.join(
                                     ROOT, "tests", "data", "tokenizer",
                                     "ggml-vocab-bert-bge.gguf")))
    rc, out, err = run([exe, "eval", "-m", bert, "--tokens", "101,2000,102", "--profile"],
                       timeout=60)
    s.case("an encoder: refused, named", rc == 1 and "encoder" in err, f"rc {rc} {err[-500:]}")
s.finish()
