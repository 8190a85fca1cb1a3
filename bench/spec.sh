#!/usr/bin/env bash
# bench/spec.sh - speculative decoding: decode speed with and without a draft model.
#
#   bench/spec.sh [--extra-layers 120] [--scale 0.05] [--tokens 128] [--prompts 8]
#
# The target is tools/spec_target.py's "shaped" model: the demo model's five layers plus
# --extra-layers small-output random layers (about 25x its cost per token at 120), so the demo
# model (models/stories260K.gguf) can draft for it. For each setting (no draft; draft with
# 2, 4 and 6 proposals) one server runs on CPU 0 (--threads 1, --parallel 4) and `sampan bench`
# on CPU 1 sends greedy streamed completions (ignore_eos, --tokens each) at concurrency 1 and
# 4; the acceptance rate and tokens per verification come from the server's /metrics.
# Results: bench/out/spec-<stamp>/ (bench JSON per run, table.md). BUILD=build by default.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${PYTHON:-/usr/bin/python3}
EXTRA=120 SCALE=0.05 TOKENS=128 PROMPTS=8
while [ $# -gt 0 ]; do
    case "$1" in
        --extra-layers) EXTRA=$2; shift 2 ;;
        --scale) SCALE=$2; shift 2 ;;
        --tokens) TOKENS=$2; shift 2 ;;
        --prompts) PROMPTS=$2; shift 2 ;;
        *) echo "usage: bench/spec.sh [--extra-layers N] [--scale S] [--tokens N] [--prompts N]" >&2
           exit 2 ;;
    esac
done
OUT=bench/out/spec-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
make -s BUILD="$BUILD" all
SAMPAN=$BUILD/sampan
DRAFT=models/stories260K.gguf
"$PY" tools/spec_target.py "$DRAFT" "$OUT/target.gguf" --extra-layers "$EXTRA" --scale "$SCALE"

SPID=""
stop() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null; SPID=""; }
trap stop EXIT
port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for conf in plain k2 k4 k6; do
    args=()
    [ "$conf" != plain ] && args=(--draft-model "$DRAFT" --spec-tokens "${conf#k}")
    P=$(port)
    taskset -c 0 "$SAMPAN" serve --model "target=$OUT/target.gguf" --port "$P" --threads 1 \
        --parallel 4 --grpc-port off --log-requests none "${args[@]}" > "$OUT/server-$conf.log" 2>&1 &
    SPID=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$P/health" > /dev/null && break; sleep 0.1; done
    for c in 1 4; do
        taskset -c 1 "$SAMPAN" bench --url "http://127.0.0.1:$P" --model target --concurrency "$c" \
            --num-prompts "$PROMPTS" --prompt-tokens 32 --output-tokens "$TOKENS" --temperature 0 \
            --label "$conf-c$c" --save-result "$OUT/$conf-c$c.json" > "$OUT/$conf-c$c.txt" 2>&1
    done
    curl -s "http://127.0.0.1:$P/metrics" | grep '^sampan_spec_decode' > "$OUT/$conf-metrics.txt" || true
    stop
done

"$PY" - "$OUT" "$EXTRA" "$SCALE" "$TOKENS" <<'EOF'
import json, os, sys
out, extra, scale, tokens = sys.argv[1:]
def metric(conf, name):
    try:
        for line in open(os.path.join(out, f"{conf}-metrics.txt")):
            if line.startswith(name + "{"):
                return float(line.split()[-1])
    except OSError:
        pass
    return None
rows = ["| setting | concurrency | output tok/s | vs no draft | mean TPOT ms | acceptance | tokens per verification |",
        "|---|---:|---:|---:|---:|---:|---:|"]
base = {}
for conf in ("plain", "k2", "k4", "k6"):
    for c in (1, 4):
        try:
            r = json.load(open(os.path.join(out, f"{conf}-c{c}.json")))
        except OSError:
            continue
        tps = r.get("output_throughput", 0)
        if conf == "plain":
            base[c] = tps
        acc = metric(conf, "sampan_spec_decode_acceptance_rate")
        tpv = metric(conf, "sampan_spec_decode_tokens_per_verification")
        rows.append("| %s | %d | %.1f | %.2fx | %.2f | %s | %s |" % (
            "no draft" if conf == "plain" else f"draft, {conf[1:]} proposals", c, tps,
            tps / base[c] if base.get(c) else 0, r.get("mean_tpot_ms", 0),
            "-" if acc is None or conf == "plain" else "%.2f" % acc,
            "-" if tpv is None or conf == "plain" else "%.2f" % tpv))
text = (f"Target: tools/spec_target.py, 5 + {extra} layers, scale {scale}; draft: "
        f"models/stories260K.gguf; greedy, {tokens} tokens per request.\n\n" + "\n".join(rows) + "\n")
open(os.path.join(out, "table.md"), "w").write(text)
print(text)
EOF
echo "results in $OUT"
