"""test_bench_step.py - bench/step_bench.c, the decode step paired with a plain read of the weight
bytes it streams (bench/run.sh's "step vs read, paired" column), and that column in
bench/report.py's table.

step_bench is built with `make build/step_bench` into the binary's build folder. Checked: its
JSON on the demo model (F32: the file's rows) reads exactly the bytes of the model's matrices
counted from the GGUF by bench/report.py's own reader (every 2-D tensor but the embedding tables
a step reads one row of), and echoes the prompt, the pairs, the threads and the level; on a tiny
Q4_0 model (tools/gguf_gen.py) the bytes of the file's rows with SAMPAN_REPACK=0, and with the
load-time repack the packed bytes the load reports (at the default level and at the AVX2
level, whose 8-row groups bound them); on a tiny gemma4 (layers that read an
earlier layer's cache, per-layer inputs, a tied output) the same count; SAMPAN_CPU picks the
level it reports; a mixture-of-experts model and bad arguments are refused with a message. Then
report.py's table prints the paired share's median and 10th-90th percentiles. A few seconds."""
import json
import os
import re
import sys
import tempfile

from common import ROOT, DEMO_MODEL, Suite, binary, run

sys.path.insert(0, os.path.join(ROOT, "bench"))
import gguf_gen  # noqa: E402  (tools/, on common's path)
import report  # noqa: E402

s = Suite("bench_step")
exe = binary()
if exe is None:
    s.skip("all", "sampan not built")
    s.finish()
build = os.path.relpath(os.path.dirname(exe), ROOT)
make_extra = ["SANITIZER=1"] if "san" in os.path.basename(build) else []
rc, out, err = run(["make", f"BUILD={build}", *make_extra, f"{build}/step_bench"], timeout=300)
if not s.case("make step_bench", rc == 0, (out + err)[-2000:]):
    s.finish()
STEP = os.path.join(ROOT, build, "step_bench")


def matrix_bytes(path, round_rows=1):
    """Bytes of the matrices a decode step streams: every 2-D tensor but the embedding tables
    it reads a row of (an untied token embedding, gemma4's per-layer one), rows rounded up to
    round_rows."""
    _, tensors = report.gguf_tensors(path)
    names = {t[0] for t in tensors}
    total = 0
    for name, dims, _, nbytes in tensors:
        if len(dims) != 2 or name == "per_layer_token_embd.weight" or (
                name == "token_embd.weight" and "output.weight" in names):
            continue
        rows = dims[1]
        total += nbytes // rows * (-(-rows // round_rows) * round_rows)
    return total


def step_json(model, *args, env=None):
    rc, out, err = run([STEP, "-m", model, *args, "--json"], timeout=120, env=env)
    try:
        return rc, json.loads(out), err
    except ValueError:
        return rc, None, out + err


def cache_bytes(path, n_kv, elt=4):
    """Bytes of the cache a step at n_kv positions reads: whole blocks of 16 positions, every
    layer's keys and values (2 x head_dim elements a position and KV head); llama only."""
    meta, _ = report.gguf_tensors(path)
    layers, heads = meta["llama.block_count"], meta["llama.attention.head_count"]
    kv_heads = meta.get("llama.attention.head_count_kv", heads)
    hd = meta["llama.embedding_length"] // heads
    return -(-n_kv // 16) * 16 * layers * kv_heads * 2 * hd * elt


rc, j, err = step_json(DEMO_MODEL, "--prompt", "8", "--gen", "6", "-t", "2")
ok = (rc == 0 and j is not None and j["read_bytes"] == matrix_bytes(DEMO_MODEL) and
      j["prompt"] == 8 and j["pairs"] == 6 and j["threads"] == 2 and j["kv_type"] == "f32" and
      j["step_ms_median"] > 0 and j["read_ms_median"] > 0 and
      0 < j["share_p10"] <= j["share_median"] <= j["share_p90"] < 100)
s.case("demo model: the matrices' bytes, the run's settings, ordered shares", ok,
       "" if ok else f"{j} (want {matrix_bytes(DEMO_MODEL)} bytes) {err[-500:]}")

# the second share counts the cache too: the middle pair's step (8 + 3 + 1 positions, one
# block) and, pair by pair, share x (1 + cache / weights): a larger share, by at least the
# first pair's cache (one block) and at most the last pair's (positions 8-13: one block)
want = cache_bytes(DEMO_MODEL, 12)
grow = 1 + want / matrix_bytes(DEMO_MODEL)
ok = (j is not None and j["cache_bytes_mid"] == want and
      abs(j["share_with_cache_median"] - j["share_median"] * grow) <= 1e-3 * grow and
      j["share_with_cache_p10"] <= j["share_with_cache_median"] <= j["share_with_cache_p90"])
s.case("demo model: the cache's bytes a step reads, the share with them", ok,
       "" if ok else f"{j} (want {want} cache bytes, x{grow:.4f})")

rc, j, err = step_json(DEMO_MODEL, "--prompt", "4", "--gen", "2", "-t", "1", "--kv-type", "f16",
                       env={"SAMPAN_CPU": "scalar"})
ok = rc == 0 and j is not None and j["kernels"] == "scalar" and j["kv_type"] == "f16" and \
    j["threads"] == 1
s.case("SAMPAN_CPU=scalar, --kv-type f16, one thread: reported as run", ok,
       "" if ok else f"{j} {err[-500:]}")

with tempfile.TemporaryDirectory() as tmp:
    q4 = os.path.join(tmp, "tiny-q4_0.gguf")
    gguf_gen.generate(q4, dict(preset="tiny", type="q4_0", seed=5))
    rows_bytes = matrix_bytes(q4)
    rc, j, err = step_json(q4, "--prompt", "8", "--gen", "4", env={"SAMPAN_REPACK": "0"})
    ok = rc == 0 and j is not None and j["read_bytes"] == rows_bytes
    s.case("Q4_0, SAMPAN_REPACK=0: the file's rows", ok,
           "" if ok else f"{j} (want {rows_bytes}) {err[-500:]}")
    # Repacked, the step reads the packed copies: exactly the bytes the load reports packing
    # (every matrix of this model is packed), never fewer than the file's rows; the AVX2 form is
    # whole 8-row groups, the AVX-512 VNNI panels 16 rows and pairs of blocks.
    for level in (None, "avx2"):
        rc, j, err = step_json(q4, "--prompt", "8", "--gen", "4",
                               env={"SAMPAN_CPU": level} if level else None)
        m = re.search(r"event=weights_repacked .*?tensors=(\d+) bytes=(\d+)", err)
        packed = int(m.group(2)) if m else -1
        ok = (rc == 0 and j is not None and m is not None and int(m.group(1)) == 15 and
              j["read_bytes"] == packed and rows_bytes <= packed)
        if level == "avx2":
            ok = ok and packed <= matrix_bytes(q4, 8)
        what = j["kernels"] if j else level
        s.case(f"Q4_0 repacked ({what}): the packed bytes the load reports", ok,
               "" if ok else f"{j} (want {packed}, at least {rows_bytes}) {err[-500:]}")

    g4 = os.path.join(tmp, "gemma4.gguf")
    gguf_gen.generate(g4, dict(preset="gemma4-tiny", seed=3))
    rc, j, err = step_json(g4, "--prompt", "8", "--gen", "4")
    ok = rc == 0 and j is not None and j["read_bytes"] == matrix_bytes(g4)
    s.case("gemma4: shared-cache layers, per-layer inputs, tied output", ok,
           "" if ok else f"{j} (want {matrix_bytes(g4)}) {err[-500:]}")

    moe = os.path.join(tmp, "moe.gguf")
    gguf_gen.generate(moe, dict(preset="qwen2moe-tiny", type="q8_0", seed=3))
    rc, out, err = run([STEP, "-m", moe, "--prompt", "4", "--gen", "2"], timeout=60)
    s.case("a mixture-of-experts model is refused", rc == 1 and "dense" in err, f"rc {rc} {err}")

for args in (["--gen", "1"], ["--prompt", "0"], ["-t", "65"], ["--kv-type", "f8"], ["--bogus"],
             []):
    argv = [STEP] + (["-m", DEMO_MODEL] if args != [] else []) + args
    rc, out, err = run(argv, timeout=30)
    s.case(f"refused: {' '.join(args) or 'no model'}", rc == 2 and "usage" in err,
           f"rc {rc} {err}")
rc, out, err = run([STEP, "-m", os.path.join(ROOT, "no-such.gguf")], timeout=30)
s.case("a missing file: rc 1, named", rc == 1 and "no-such.gguf" in err, f"rc {rc} {err}")

# report.py's table: the column from a step_bench result, "-" without one
row = {"type": "q4_0", "read_bytes_per_token": 582e6, "decode_limit_tok_s": 60.0,
       "read_bw_2t_gb_s_before_runs": 35.0, "sampan": {"decode_tok_s": 50.0, "prefill_tok_s": 100},
       "sampan_step_read": {"share_median": 0.913, "share_p10": 0.79, "share_p90": 1.004}}
bare = dict(row, type="q8_0")
del bare["sampan_step_read"]
withkv = dict(row, type="q4_k", sampan_step_read=dict(row["sampan_step_read"],
                                                      share_with_cache_median=0.948))
t = report.table({"read_bw_2t_gb_s": 36.0, "results": [row, bare, withkv], "meta": {}})
lines = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")] for ln in t.splitlines()
         if ln.startswith("| Q")}
header = [c.strip() for c in t.splitlines()[3].split("|")]
col = header.index("sampan step vs read, paired") if "sampan step vs read, paired" in header else -1
ok = (col > 0 and lines["Q4_0"][col] == "91% (79-100%)" and lines["Q8_0"][col] == "-" and
      lines["Q4_K"][col] == "91% (79-100%); 95% with the cache")
s.case("report.py: the paired column", ok, "" if ok else t)
s.finish()
