#!/usr/bin/python3
"""report.py - turn one bench/run.sh run into a markdown table and a JSON file.

    bench/report.py RAWDIR            (RAWDIR as written by bench/run.sh)
    bench/report.py --bytes FILE.gguf (weight bytes read per decoded token)

RAWDIR holds meta.json (machine, versions, settings), membw.json (bench/membw
--json, before and after: membw.json, membw-after.json), and for each type T:
T.model (path of the GGUF), T.llamacpp.json (bench/llamacpp.mjs output),
T.sampan.N.log (stderr of `sampan eval`, one file per run).

Decode limit (tokens/s) = read bandwidth with 2 threads / bytes of weights read
per token. Per token every weight matrix is read once, except the token
embedding, of which only one row is read (unless it doubles as the output
matrix, when all of it is). The KV cache is not counted (at 512-576 positions it
is about 12 MB per token for this shape, 0.5-2% of the weights).
Standard library only.
"""
import json
import os
import re
import struct
import sys

# ggml type -> (elements per block, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136), 30: ("BF16", 1, 2), 39: ("MXFP4", 32, 17),
}
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def unpack(self, fmt):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, data)[0]

    def string(self):
        n = self.unpack("<Q")
        if n > 1 << 24:
            raise ValueError("implausible GGUF string length")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, vtype):
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype = self.unpack("<I")
            n = self.unpack("<Q")
            if etype in _SCALAR:  # skip numeric arrays without decoding them
                self.f.seek(n * struct.calcsize(_SCALAR[etype]), os.SEEK_CUR)
                return None
            for _ in range(n):
                self.value(etype)
            return None
        raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_tensors(path):
    """(metadata scalars, [(name, dims, ggml type, bytes)]) of a GGUF file."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}")
        n_tensors = r.unpack("<Q")
        n_kv = r.unpack("<Q")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.unpack("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            nd = r.unpack("<I")
            dims = [r.unpack("<Q") for _ in range(nd)]
            ttype = r.unpack("<I")
            r.unpack("<Q")  # offset
            if ttype not in GGML_TYPES:
                raise ValueError(f"{path}: tensor {name} has unknown type {ttype}")
            _, blk, bsz = GGML_TYPES[ttype]
            n = 1
            for d in dims:
                n *= d
            tensors.append((name, dims, ttype, n // blk * bsz))
    return meta, tensors


def bytes_per_token(path):
    meta, tensors = gguf_tensors(path)
    names = {t[0] for t in tensors}
    tied = "output.weight" not in names
    total = sum(t[3] for t in tensors)
    per_token = 0
    types = {}
    arch = meta.get("general.architecture", "")
    n_exp = meta.get(f"{arch}.expert_count", 0)
    n_used = meta.get(f"{arch}.expert_used_count", 0)
    for name, dims, ttype, nbytes in tensors:
        if name == "token_embd.weight" and not tied:
            per_token += nbytes // dims[1]  # one row of [dim, vocab]
        elif "_exps." in name and n_exp > 0:
            per_token += nbytes * n_used // n_exp  # a token reads the experts it is routed to
        else:
            per_token += nbytes
        if len(dims) == 2:
            tname = GGML_TYPES[ttype][0]
            types[tname] = types.get(tname, 0) + 1
    return {"file_bytes": os.path.getsize(path), "tensor_bytes": total,
            "read_bytes_per_token": per_token, "tied_output": tied, "matrix_types": types,
            "n_tensors": len(tensors)}


_LINE = re.compile(r"^(prefill|decode): (\d+) tokens in ([\d.]+) ms \(([\d.]+) tok/s\)")
# `sampan eval --profile`'s tables (src/tools/generate.c): a head line, then a stage a line
_PROF_HEAD = re.compile(r"^profile: ([a-z ]+), (\d+) tokens, ([\d.]+) ms")
_PROF_ROW = re.compile(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)%$")
_PROF_OUT = re.compile(r"^\(outside jobs\)\s+-\s+(-?[\d.]+)\s+(-?[\d.]+)%$")
# the stages that are weight products (engine/batch.c's, moe.c's and mla.c's labels)
PRODUCT_STAGES = ("qkv", "attn_out", "ffn_gate_up", "ffn_down", "output", "per_layer_in",
                  "per_layer_gate", "per_layer_proj", "moe_products", "mla_products")


def parse_sampan_lines(lines):
    """The timing lines of `sampan eval`'s stderr, and with --profile each phase's stages:
    out["profile"][phase] = {"stages": {label: {calls, ms, share, tail}}, "outside_share"}
    (ms and calls per token for the decode, shares and tails in %)."""
    out, phase = {}, None
    for line in lines:
        line = line.strip()
        m = _LINE.match(line)
        if m:
            out[m.group(1)] = {"tokens": int(m.group(2)), "ms": float(m.group(3)),
                               "tok_s": float(m.group(4))}
            phase = None
            continue
        m = _PROF_HEAD.match(line)
        if m:
            phase = m.group(1)
            out.setdefault("profile", {})[phase] = {"stages": {}, "outside_share": None}
            continue
        if phase is None:
            continue
        m = _PROF_ROW.match(line)
        if m:
            out["profile"][phase]["stages"][m.group(1)] = {
                "calls": float(m.group(2)), "ms": float(m.group(3)),
                "share": float(m.group(4)), "tail": float(m.group(5))}
            continue
        m = _PROF_OUT.match(line)
        if m:
            out["profile"][phase]["outside_share"] = float(m.group(2))
            phase = None
    return out


def parse_sampan_log(path):
    """parse_sampan_lines of a log file (bench/run.sh's $RAW/TYPE.sampan.N.log)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_sampan_lines(f)


def decode_split(run):
    """A run's decode profile as shares of the step (%): products, attention, the other stages,
    outside the jobs, and the attention's tail; None without one."""
    p = run.get("profile", {}).get("decode")
    if not p or not p["stages"] or p["outside_share"] is None:
        return None
    st = p["stages"]
    prod = sum(v["share"] for k, v in st.items() if k in PRODUCT_STAGES)
    att = st.get("attention", {}).get("share", 0.0)
    rest = sum(v["share"] for k, v in st.items()
               if k not in PRODUCT_STAGES and k != "attention")
    return {"products": prod, "attention": att, "other_stages": rest,
            "outside": p["outside_share"], "attention_tail": st.get("attention", {}).get("tail")}


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _load_opt(path):
    return _load(path) if os.path.exists(path) else None


def _other_pct(row):
    """Other processes' share of the machine during the runs whose numbers the
    table shows (each engine's best prefill and best decode run); for an old
    llamacpp.mjs without per-run figures, over its whole process."""
    vals = []
    s_runs = [r for r in row.get("sampan", {}).get("runs", []) if r.get("cpu")]
    if s_runs:
        best_p = max(s_runs, key=lambda r: r["prefill"]["tok_s"])
        vals.append(best_p["cpu"]["other_pct_of_machine"])
        d_runs = [r for r in s_runs if "decode" in r]
        if d_runs:
            vals.append(max(d_runs, key=lambda r: r["decode"]["tok_s"])["cpu"]
                        ["other_pct_of_machine"])
    lc = row.get("llamacpp", {})
    l_runs = lc.get("runs", [])
    if l_runs and all("other_pct_of_machine" in r for r in l_runs):
        vals.append(max(l_runs, key=lambda r: r["prefill_tok_s"])["other_pct_of_machine"])
        vals.append(max(l_runs, key=lambda r: r["decode_tok_s"])["other_pct_of_machine"])
    elif lc.get("cpu"):
        vals.append(lc["cpu"]["other_pct_of_machine"])
    return max(vals) if vals else None


def summarize(raw):
    meta = _load(os.path.join(raw, "meta.json"))
    bw = _load(os.path.join(raw, "membw.json"))
    bw_after = None
    if os.path.exists(os.path.join(raw, "membw-after.json")):
        bw_after = _load(os.path.join(raw, "membw-after.json"))

    def read2(b):
        # best 2-thread read over both page kinds and one or two streams per thread (membw's
        # read_two_streams_*, absent from files older than it): the achievable bandwidth
        keys = ("read_4k", "read_thp", "read_two_streams_4k", "read_two_streams_thp")
        return max(b[k][1] for k in keys if k in b)

    read_bw = read2(bw) if bw_after is None else max(read2(bw), read2(bw_after))
    near = {}
    for t in meta["types"]:
        p = os.path.join(raw, f"membw-{t}.json")
        if os.path.exists(p):
            near[t] = read2(_load(p))
    # The limit uses the best bandwidth seen in the whole run: what the machine
    # can deliver (the host's other tenants make it vary from minute to minute).
    read_bw = max([read_bw] + list(near.values()))
    rows = []
    for t in meta["types"]:
        with open(os.path.join(raw, f"{t}.model"), encoding="utf-8") as f:
            model = f.read().strip()
        b = bytes_per_token(model)
        limit = read_bw * 1e9 / b["read_bytes_per_token"]
        row = {"type": t, "model": model, **b, "decode_limit_tok_s": limit,
               "read_bw_2t_gb_s_before_runs": near.get(t)}
        lj = os.path.join(raw, f"{t}.llamacpp.json")
        if os.path.exists(lj):
            lc = _load(lj)
            row["llamacpp"] = {"prefill_tok_s": lc["best"]["prefill_tok_s"],
                               "cpu": _load_opt(os.path.join(raw, f"{t}.llamacpp.cpu")),
                               "decode_tok_s": lc["best"]["decode_tok_s"],
                               "runs": lc["runs"], "threads": lc["threads"],
                               "flash_attention": lc["flash_attention"],
                               "cpu_backend": lc.get("cpu_backend"),
                               "release": lc.get("llama_cpp_release"),
                               "first_generated": lc["first_generated"]}
        logs = sorted(p for p in os.listdir(raw) if p.startswith(f"{t}.sampan.") and
                      p.endswith(".log"))
        runs = []
        for p in logs:
            r = parse_sampan_log(os.path.join(raw, p))
            if "prefill" in r:
                r["cpu"] = _load_opt(os.path.join(raw, p[:-4] + ".cpu"))
                runs.append(r)
        if runs:
            row["sampan"] = {
                "prefill_tok_s": max(r["prefill"]["tok_s"] for r in runs),
                "decode_tok_s": max((r["decode"]["tok_s"] for r in runs if "decode" in r),
                                    default=None),
                "runs": runs,
            }
        sj = os.path.join(raw, f"{t}.step.json")
        if os.path.exists(sj):
            row["sampan_step_read"] = _load(sj)  # bench/step_bench.c --json
        rows.append(row)
    result = {"meta": meta, "membw": bw, "membw_after": bw_after,
              "read_bw_2t_gb_s": read_bw, "results": rows}
    return result


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def table(result):
    lines = []
    lines.append(f"Read bandwidth (2 threads, best of the run): {result['read_bw_2t_gb_s']:.1f} GB/s"
                 " (just before each type's runs: " +
                 ", ".join(f"{r['type'].upper()} {r['read_bw_2t_gb_s_before_runs']:.1f}"
                           for r in result["results"] if r.get("read_bw_2t_gb_s_before_runs"))
                 + ")")
    meta = result.get("meta", {})
    backends = sorted({b for r in result["results"]
                       for b in (r.get("llamacpp", {}).get("cpu_backend") or [])})
    lines.append("Levels: Sampan " + (f"SAMPAN_CPU={meta['sampan_cpu_env']}"
                                      if meta.get("sampan_cpu_env") else "its best for this CPU") +
                 (f", KV cache {meta['sampan_kv_type']}" if meta.get("sampan_kv_type") else
                  ", KV cache f32 (its default)") +
                 "; llama.cpp " + (", ".join(backends) if backends else "-") +
                 (f" (--llamacpp-cpu {meta['llamacpp_cpu_variant']})"
                  if meta.get("llamacpp_cpu_variant") else ""))
    lines.append("")
    lines.append("| type | weights read/token | decode limit | sampan decode | llama.cpp decode "
                 "| sampan prefill | llama.cpp prefill | decode vs llama.cpp "
                 "| prefill vs llama.cpp | sampan step vs read, paired | other load |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    def paired(st):
        # bench/step_bench.c: median (p10-p90) of read time / step time over adjacent pairs,
        # then (files since it has it) the median with the cache's bytes counted as read too
        if not st:
            return "-"
        out = (f"{100 * st['share_median']:.0f}% ({100 * st['share_p10']:.0f}-"
               f"{100 * st['share_p90']:.0f}%)")
        if "share_with_cache_median" in st:
            out += f"; {100 * st['share_with_cache_median']:.0f}% with the cache"
        return out

    for r in result["results"]:
        lim = r["decode_limit_tok_s"]
        s = r.get("sampan", {})
        lc = r.get("llamacpp", {})
        sd, ld = s.get("decode_tok_s"), lc.get("decode_tok_s")
        sp, lp = s.get("prefill_tok_s"), lc.get("prefill_tok_s")

        near = r.get("read_bw_2t_gb_s_before_runs")

        def pct(v):
            # share of the run's limit, then of the read measured just before this type's runs
            # (on a host whose bandwidth drifts between minutes the two differ by a third)
            if v is None:
                return "-"
            now = (f" / {100 * v * r['read_bytes_per_token'] / (near * 1e9):.0f}%"
                   if near else "")
            return f"{v:.1f} ({100 * v / lim:.0f}%{now})"

        lines.append(
            f"| {r['type'].upper()} | {r['read_bytes_per_token'] / 1e6:.0f} MB | {lim:.1f} tok/s "
            f"| {pct(sd)} | {pct(ld)} | {_f(sp)} | {_f(lp)} "
            f"| {_f(sd / ld if sd and ld else None, '{:.2f}x')} "
            f"| {_f(sp / lp if sp and lp else None, '{:.2f}x')} "
            f"| {paired(r.get('sampan_step_read'))} "
            f"| {_f(_other_pct(r), '{:.0f}%')} |")
    split = []
    for r in result["results"]:
        runs = [x for x in r.get("sampan", {}).get("runs", []) if "decode" in x]
        best = max(runs, key=lambda x: x["decode"]["tok_s"]) if runs else None
        d = decode_split(best) if best else None
        if d:
            split.append(f"| {r['type'].upper()} | {d['products']:.1f}% | {d['attention']:.1f}% "
                         f"| {_f(d['attention_tail'], '{:.1f}%')} | {d['other_stages']:.1f}% "
                         f"| {d['outside']:.1f}% |")
    if split:
        lines.append("")
        lines.append("Where Sampan's decode step went (`sampan eval --profile`, its best decode run):")
        lines.append("")
        lines.append("| type | weight products | attention | attention tail | other stages "
                     "| outside jobs |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
        lines.extend(split)
    lines.append("")
    lines.append("decode and prefill in tokens/s, best of the runs; (n% / m%) = share of the decode "
                 "limit (the run's best read bandwidth / weight bytes read per token), then of the "
                 "read measured just before the type's runs;\n"
                 "sampan step vs read, paired = bench/step_bench.c: each decode step (same prompt "
                 "length) paired with a plain read of the weight bytes it streams, a few ms apart; "
                 "median (10th-90th percentile) of read time / step time, which the host's drift "
                 "between minutes does not move;\n"
                 "other load = the most CPU that other processes took during the runs shown, as a "
                 "share of the machine (above a few % the numbers are low, both engines' threads "
                 "wait on each other);\n"
                 "where the decode step went: shares of the step's wall time, the weight products "
                 "(every matrix), the attention over the cache, the other stages (norms, rope, "
                 "activation conversion, SwiGLU, embedding), the rest outside the pool's jobs; "
                 "attention tail = the share of the attention the calling thread waited for the "
                 "other threads' last items.")
    return "\n".join(lines)


def main(argv):
    if len(argv) == 3 and argv[1] == "--bytes":
        print(json.dumps(bytes_per_token(argv[2]), indent=1))
        return 0
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    raw = argv[1]
    result = summarize(raw)
    out = os.path.join(raw, "results.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    text = table(result)
    with open(os.path.join(raw, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
