#!/usr/bin/env bash
# bench/serving.sh - `sampan bench` at several concurrencies, results as JSON and one SVG.
#
#   bench/serving.sh                                   # the demo model, sampan serve started here
#   bench/serving.sh --model bench/models/tinyllama-random-q8_0.gguf --threads 2
#   bench/serving.sh --url http://127.0.0.1:8080 --label llama.cpp   # a server already running
#   bench/serving.sh --server llamacpp --model FILE --threads 2     # the node-llama-cpp peer
#   bench/serving.sh --server llama-server --llama-server /tmp/llama-build/bin/llama-server \
#       --model FILE --threads 2 --ctx-size 256                      # a llama-server you built
#   LD_LIBRARY_PATH=/tmp/llama-build-avx2/bin bench/serving.sh --server llama-server ...
#       # the same binary on an AVX2-only libggml-cpu built beside it (BENCHMARKS.md "AVX2 level")
#
# Options (defaults are the scheduler issue's serving benchmark):
#   --concurrency "1 8 32"   the sweep            --prompts-per-stream 4   num_prompts = c x this
#   --prompt-tokens 64       --shared-prefix 32    --output-tokens 128      --max-seconds 600
#   --timeout 60             a request silent this long fails (sampan bench --timeout)
#   --model FILE --threads N --parallel N --ctx-size N (sampan serve; --parallel defaults to
#                                                    the largest concurrency, --ctx-size to 1024)
#   --kv-blocks N                                   sampan serve's KV pool (default: its own)
#   --server sampan|llamacpp|llama-server           which server to start (llamacpp:
#                                                    bench/llamacpp_server.mjs, same flags, label
#                                                    llama.cpp, its batch stats per level saved;
#                                                    llama-server: llama.cpp's own server, label
#                                                    llama-server, see below)
#   --llama-server BIN                              its binary (default $LLAMA_SERVER), started
#                                                    with --threads/--threads-batch N, --parallel
#                                                    N, --ctx-size parallel x ctx-size (one
#                                                    unified KV cache, as sampan's pool),
#                                                    --cont-batching --metrics --no-webui
#   --server-args "ARGS"                            more arguments for the started server
#   --url URL --label NAME                          bench a running server instead
#   --endpoint completions|chat                     --out DIR (default bench/out/serving-<stamp>)
# Each concurrency runs once (one after the other, same prompts: --seed 1) and writes
# DIR/<label>-c<N>.json; bench/plot_serving.py draws DIR/serving.svg from all of them.
# The server's own count of generated tokens is read from its /metrics before and after each level
# (sampan_generation_tokens_total, llama-server's llamacpp:tokens_predicted_total) into
# DIR/<label>-c<N>.server and the table's "server tok/s" column: llama-server answers many
# random-weight streams with a 500 after generating them, which the client counts as failed.
# For llama-server, DIR/llama-server.cpu lists the ggml libraries it mapped (which libggml-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

CONC="1 8 32" PPS=4 PT=64 SP=32 OT=128 MAXS=600 TMO=60 MODEL=models/stories260K.gguf THREADS=2 PARALLEL="" CTX=1024
URL="" LABEL="" EP=completions OUT="" BUILD=${BUILD:-build} KVB="" SERVER=sampan
LLAMA_SERVER=${LLAMA_SERVER:-} SERVER_ARGS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --concurrency) CONC=$2; shift 2 ;;
        --prompts-per-stream) PPS=$2; shift 2 ;;
        --prompt-tokens) PT=$2; shift 2 ;;
        --shared-prefix) SP=$2; shift 2 ;;
        --output-tokens) OT=$2; shift 2 ;;
        --max-seconds) MAXS=$2; shift 2 ;;
        --timeout) TMO=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --parallel) PARALLEL=$2; shift 2 ;;
        --ctx-size) CTX=$2; shift 2 ;;
        --url) URL=$2; shift 2 ;;
        --kv-blocks) KVB=$2; shift 2 ;;
        --server) SERVER=$2; shift 2 ;;
        --llama-server) LLAMA_SERVER=$2; shift 2 ;;
        --server-args) SERVER_ARGS=$2; shift 2 ;;
        --label) LABEL=$2; shift 2 ;;
        --endpoint) EP=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "serving.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
SAMPAN=${SAMPAN:-$BUILD/sampan}
if [ -z "${SAMPAN_NO_BUILD:-}" ]; then make -s "BUILD=$BUILD" "$BUILD/sampan" >&2; fi
OUT=${OUT:-bench/out/serving-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

spid=""
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null; true; }
trap cleanup EXIT

if [ -z "$URL" ]; then
    [ -f "$MODEL" ] || { echo "serving.sh: no model file $MODEL" >&2; exit 1; }
    case "$SERVER" in
        sampan) LABEL=${LABEL:-sampan} ;;
        llamacpp) LABEL=${LABEL:-llama.cpp} ;;
        llama-server)
            LABEL=${LABEL:-llama-server}
            [ -x "$LLAMA_SERVER" ] || { echo "serving.sh: --server llama-server needs --llama-server BIN (or \$LLAMA_SERVER), an executable" >&2; exit 2; } ;;
        *) echo "serving.sh: --server is sampan, llamacpp or llama-server" >&2; exit 2 ;;
    esac
    max=1
    for c in $CONC; do [ "$c" -gt "$max" ] && max=$c; done
    PARALLEL=${PARALLEL:-$max}
    name=$(basename "$MODEL" .gguf)
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # SERVER_ARGS is split on spaces on purpose: it is a list of arguments.
    # shellcheck disable=SC2086
    if [ "$SERVER" = llamacpp ]; then
        node bench/llamacpp_server.mjs -m "$MODEL" --name "$name" --port "$port" --threads "$THREADS" \
            --parallel "$PARALLEL" --ctx-size "$CTX" --queue 4096 $SERVER_ARGS >"$OUT/serve.log" 2>&1 &
    elif [ "$SERVER" = llama-server ]; then
        "$LLAMA_SERVER" -m "$MODEL" --alias "$name" --host 127.0.0.1 --port "$port" \
            --threads "$THREADS" --threads-batch "$THREADS" --parallel "$PARALLEL" \
            --ctx-size $((PARALLEL * CTX)) --kv-unified --cont-batching --metrics --no-webui \
            $SERVER_ARGS >"$OUT/serve.log" 2>&1 &
    else
        "$SAMPAN" serve --model "$name=$MODEL" --port "$port" --threads "$THREADS" --parallel "$PARALLEL" \
            --ctx-size "$CTX" --queue 4096 ${KVB:+--kv-blocks "$KVB"} $SERVER_ARGS >"$OUT/serve.log" 2>&1 &
    fi
    spid=$!
    URL="http://127.0.0.1:$port"
    for _ in $(seq 600); do # model load: up to 60 s
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health" || true)" = 200 ] && break
        kill -0 "$spid" 2>/dev/null || { cat "$OUT/serve.log" >&2; exit 1; }
        sleep 0.1
    done
    if [ "$SERVER" = llama-server ]; then
        # Which ggml libraries it runs (LD_LIBRARY_PATH can put another libggml-cpu first,
        # e.g. an AVX2-only build on an AVX-512 host; its log does not say).
        grep -o '/[^ ]*libggml[^ ]*' "/proc/$spid/maps" 2>/dev/null | sort -u > "$OUT/llama-server.cpu" || true
        sed 's/^/serving.sh: llama-server uses /' "$OUT/llama-server.cpu" >&2
    fi
fi
LABEL=${LABEL:-server}

# The server's count of generated tokens so far (its /metrics; empty when it has none).
server_tokens() {
    curl -s "$URL/metrics" 2>/dev/null | awk '
        $1 == "llamacpp:tokens_predicted_total" || $1 ~ /^sampan_generation_tokens_total([{]|$)/ { s += $2; n++ }
        END { if (n) printf "%.0f\n", s }' || true
}

rc=0
for c in $CONC; do
    echo "serving.sh: $LABEL, concurrency $c" >&2
    before=$(server_tokens)
    "$SAMPAN" bench --url "$URL" --endpoint "$EP" --concurrency "$c" --num-prompts $((c * PPS)) \
        --prompt-tokens "$PT" --shared-prefix "$SP" --output-tokens "$OT" --max-seconds "$MAXS" \
        --timeout "$TMO" --seed 1 --label "$LABEL" --no-progress --save-result "$OUT/$LABEL-c$c.json" \
        2> >(tee "$OUT/$LABEL-c$c.txt" >&2) || rc=1
    after=$(server_tokens)
    if [ -n "$before" ] && [ -n "$after" ]; then
        echo "$((after - before))" >"$OUT/$LABEL-c$c.server"
    fi
    if [ "$SERVER" = llamacpp ]; then # cumulative decode-batch counts after this level
        curl -s "$URL/stats" >"$OUT/$LABEL-c$c.stats" || true
    fi
done
/usr/bin/python3 bench/plot_serving.py "$OUT"/*.json -o "$OUT/serving.svg" >&2 || rc=1
/usr/bin/python3 - "$OUT" <<'EOF'
import glob, json, os, sys
rows = []
for p in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(p))
    rows.append((d.get("label") or d["model_id"], d["max_concurrency"], d, p[:-len(".json")] + ".server"))
print("| server | streams | requests | output tok/s | server tok/s | TTFT p50 ms | TTFT p99 ms | TPOT mean ms | ITL p99 ms | E2EL p99 ms | failed |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for label, c, d, sp in sorted(rows, key=lambda r: (r[0], r[1])):
    # generated tokens by the server's /metrics over the level's duration ("-": no count)
    srv = "-"
    if os.path.exists(sp) and d["duration"] > 0:
        srv = f"{int(open(sp).read()) / d['duration']:.1f}"
    print(f"| {label} | {c} | {d['completed']} | {d['output_throughput']:.1f} | {srv} | {d['median_ttft_ms']:.1f} | "
          f"{d['p99_ttft_ms']:.1f} | {d['mean_tpot_ms']:.2f} | {d['p99_itl_ms']:.2f} | "
          f"{d['p99_e2el_ms']:.1f} | {d['failed'] + d.get('cut_off', 0)} |")
EOF
echo "serving.sh: results in $OUT" >&2
exit $rc
