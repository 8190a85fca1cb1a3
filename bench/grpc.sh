#!/usr/bin/env bash
# bench/grpc.sh - KServe v2 ModelInfer over gRPC against the same calls over REST: the identity
# model and the fraud model (the credit-card XGBoost model of tests/data/xgboost/), served by one
# `sampan serve` on loopback with both ports, one row per request.
#
#   bench/grpc.sh [--quick] [--duration S] [--warmup S] [--reps N] [--wait-quiet SECS]
#                 [--server-cpus 0] [--gen-cpus 1] [--closed 64] [--grpc-connections 4]
#                 [--rates "1000 5000"] [--protocols "rest-json rest-binary grpc"]
#                 [--models "ident fraud"] [--servers "unbatched batched"] [--perf]
#                 [--skip jitter]
#
# Servers (a repository each, with two models, max_batch_size 64 in both):
#   unbatched  no dynamic_batching: every request is its own execute()
#   batched    dynamic_batching max_queue_delay_microseconds 100 (bench/fraud.sh's "batched")
# Models: "ident" (the identity plugin, input__0 FP32 [30] copied to output__0: no model work,
# the front end's own cost) and "fraud" (xgboost, creditcard-depth3-50trees.json; every answer
# checked against creditcard-depth3-50trees.test-pred.csv by both generators).
# Protocols (the same 344 rows of creditcard-test.csv, 30 FP32 features each, cycled):
#   rest-json    bench/kserve_load, POST /v2/models/M/infer with a JSON body
#   rest-binary  bench/kserve_load --binary: Triton's binary tensor extension (120 raw bytes)
#   grpc         bench/grpc_load: ModelInfer with raw_input_contents (120 raw bytes), HTTP/2
#   grpc-typed   bench/grpc_load --typed: contents.fp32_contents (not in the default list)
# For every server, model and protocol (protocols interleaved, so a burst of other work on the
# machine does not land on one of them):
#   closed loop  --closed requests in flight back to back: REST on that many keep-alive
#                connections (one request each at a time), gRPC as that many streams over
#                --grpc-connections HTTP/2 connections: throughput and p50/p99
#   open loop    Poisson arrivals at each of --rates req/s, latency from the scheduled send time
#                (no coordinated omission): REST on 256 connections, gRPC on --grpc-connections
#
# CPUs, machine load, results: as bench/fraud.sh. The server is pinned to --server-cpus and the
# generator to --gen-cpus (taskset); before every run the script waits (at most --wait-quiet s)
# for the machine to be under 10% busy and records the busy share before and the CPU that other
# processes used during the run; the server's CPU time per request comes from /proc.
# jitter: bench/xgb_floor --jitter on both CPUs at once first (how long the machine itself takes
# CPUs away), when xgb_floor is built (libxgboost-dev).
# --perf: `perf record` the unbatched server under the closed loop of the fraud model, once over
# gRPC and once over REST binary (not measured runs): perf-grpc*.txt, perf-rest*.txt.
#
# Results: bench/out/grpc-<stamp>/ (raw JSON per run, server logs, results.json, table.md) and
# bench/out/grpc-latest -> it. --quick: 0.5 s warm-up, 2 s runs, 1 round (a smoke test).
# Environment: BUILD=build (the script runs `make BUILD=$BUILD all bench-tools`).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DURATION=10 WARMUP=2 DRAIN=2 WAIT_QUIET=60 SCPUS=0 GCPUS=1 CLOSED=64 GCONNS=4 REPS=1
RATES="1000 5000" PROTOCOLS="rest-json rest-binary grpc" MODELS="ident fraud"
SERVERS="unbatched batched" PERF=0 SKIP="" QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) DURATION=2 WARMUP=0.5 REPS=1 QUICK=1; shift ;;
        --reps) REPS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --warmup) WARMUP=$2; shift 2 ;;
        --wait-quiet) WAIT_QUIET=$2; shift 2 ;;
        --server-cpus) SCPUS=$2; shift 2 ;;
        --gen-cpus) GCPUS=$2; shift 2 ;;
        --closed) CLOSED=$2; shift 2 ;;
        --grpc-connections) GCONNS=$2; shift 2 ;;
        --rates) RATES=$2; shift 2 ;;
        --protocols) PROTOCOLS=$2; shift 2 ;;
        --models) MODELS=$2; shift 2 ;;
        --servers) SERVERS=$2; shift 2 ;;
        --perf) PERF=1; shift ;;
        --skip) SKIP=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "grpc.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
skipped() { [[ " $SKIP " == *" $1 "* ]]; }
for p in $PROTOCOLS; do
    case "$p" in rest-json|rest-binary|grpc|grpc-typed) ;; *) echo "grpc.sh: unknown protocol $p" >&2; exit 2 ;; esac
done
for m in $MODELS; do
    case "$m" in ident|fraud) ;; *) echo "grpc.sh: unknown model $m" >&2; exit 2 ;; esac
done
for s in $SERVERS; do
    case "$s" in unbatched|batched) ;; *) echo "grpc.sh: unknown server $s" >&2; exit 2 ;; esac
done

say() { printf '[grpc %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

D=tests/data/xgboost
MODEL=$D/creditcard-depth3-50trees.json
CSV=$D/creditcard-test.csv
EXPECT=$D/creditcard-depth3-50trees.test-pred.csv
SAMPAN=$BUILD/sampan
LOAD=$BUILD/kserve_load
GLOAD=$BUILD/grpc_load
FLOOR=$BUILD/xgb_floor

say "make BUILD=$BUILD all bench-tools"
make -s BUILD="$BUILD" all bench-tools > /dev/null || { say "build failed"; exit 1; }
[ -x "$GLOAD" ] && [ -x "$LOAD" ] || { say "$GLOAD or $LOAD is missing"; exit 1; }
if [[ " $MODELS " == *" fraud "* ]] && [ ! -f "$BUILD/backends/libsampan_xgboost.so" ]; then
    say "the xgboost backend is missing: install libxgboost-dev (scripts/deps.sh) or --models ident"
    exit 1
fi

# The tree the binaries were built from (HEAD can move while the benchmark runs).
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then COMMIT="$COMMIT+dirty"; fi
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=bench/out/grpc-$STAMP
mkdir -p "$OUT/repos" "$OUT/runs"
say "results in $OUT"

# ---- machine load and ports (bench/lib.sh) --------------------------------------------------
. bench/lib.sh # the working directory is the repository root (cd above)

# ---- servers --------------------------------------------------------------------------------
# mkrepo NAME DYNAMIC-BATCHING-JSON-OR-EMPTY: both models in one repository.
mkrepo() {
    local db=""
    [ -n "$2" ] && db=", \"dynamic_batching\": $2"
    mkdir -p "$OUT/repos/$1/fraud/1" "$OUT/repos/$1/ident/1"
    cp "$MODEL" "$OUT/repos/$1/fraud/1/"
    printf '{"name": "fraud", "backend": "xgboost", "max_batch_size": 64%s}\n' "$db" \
        > "$OUT/repos/$1/fraud/config.json"
    printf '{"name": "ident", "backend": "identity", "max_batch_size": 64%s,
 "input": [{"name": "input__0", "data_type": "TYPE_FP32", "dims": [30]}],
 "output": [{"name": "output__0", "data_type": "TYPE_FP32", "dims": [30]}]}\n' "$db" \
        > "$OUT/repos/$1/ident/config.json"
}
mkrepo unbatched ""
mkrepo batched '{"max_queue_delay_microseconds": 100}'

SPID="" SPORT="" GPORT="" SNAME=""
stop_server() {
    [ -n "$SPID" ] || return 0
    kill -TERM "$SPID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SPID" 2>/dev/null || true
    wait "$SPID" 2>/dev/null || true
    SPID=""
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

start_server() { # repo name
    stop_server
    SNAME=$1
    SPORT=$(free_port)
    GPORT=$(free_port)
    # OMP_WAIT_POLICY=passive: XGBoost's OpenMP team must not spin on a shared machine;
    # --drain-timeout 2: stopping never hangs the script; per-client limits off: every connection
    # of the load generator comes from 127.0.0.1.
    OMP_WAIT_POLICY=passive taskset -c "$SCPUS" "$SAMPAN" serve --model-repository "$OUT/repos/$1" \
        --host 127.0.0.1 --port "$SPORT" --grpc-port "$GPORT" --log-requests none \
        --max-connections 4096 --max-conns-per-client 0 --conn-rate-per-client 0 \
        --drain-timeout 2 > "$OUT/server-$1.log" 2>&1 &
    SPID=$!
    local m code
    for _ in $(seq 200); do
        local ok=1
        for m in $MODELS; do
            code=$(curl -s -o /dev/null -w '%{http_code}' \
                "http://127.0.0.1:$SPORT/v2/models/$m/ready" || true)
            [ "$code" = 200 ] || ok=0
        done
        if [ "$ok" = 1 ] && grep -q 'event=grpc_listening' "$OUT/server-$1.log"; then
            return 0
        fi
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    say "server $1 did not become ready (see $OUT/server-$1.log)"
    tail -5 "$OUT/server-$1.log" >&2
    exit 1
}

# Batches and completed requests of a model so far (GET /stats).
server_counts() {
    curl -s "http://127.0.0.1:$SPORT/stats" | "$PYTHON" -c '
import json, sys
m = json.load(sys.stdin)["models"][sys.argv[1]]
print(m["steps"], m["jobs_done"])' "$1" 2>/dev/null || echo "0 0"
}

# gen_cmd PROTO MODEL: the generator command line for a protocol (in GEN).
gen_cmd() {
    local proto=$1 model=$2
    local expect=()
    [ "$model" = fraud ] && expect=(--expect "$EXPECT")
    case "$proto" in
        rest-json) GEN=("$LOAD" --url "http://127.0.0.1:$SPORT" --model "$model" --csv "$CSV" "${expect[@]}") ;;
        rest-binary) GEN=("$LOAD" --url "http://127.0.0.1:$SPORT" --model "$model" --csv "$CSV" "${expect[@]}" --binary) ;;
        grpc) GEN=("$GLOAD" --addr "127.0.0.1:$GPORT" --model "$model" --csv "$CSV" "${expect[@]}" --connections "$GCONNS") ;;
        grpc-typed) GEN=("$GLOAD" --addr "127.0.0.1:$GPORT" --model "$model" --csv "$CSV" "${expect[@]}" --connections "$GCONNS" --typed) ;;
    esac
}

# run KIND NAME MODEL PROTO generator-args...: one measured run on the current server; its JSON
# gets the kind, model, protocol, the machine's load, the server's CPU time, context switches
# and the mean rows per batch added.
run() {
    local kind=$1 name=$2 model=$3 proto=$4; shift 4
    local busy j0 j1 s0 s1 t0 t1 c0 c1 b0 b1 x0 x1 rc=0
    wait_quiet
    busy=$QUIET_BUSY
    read -r c0 c1 <<< "$(server_counts "$model")"
    x0=$(ctx_switches "$SPID")
    j0=$(busy_jiffies); s0=$(proc_jiffies "$SPID"); t0=$(date +%s.%N)
    local limit
    limit=$("$PYTHON" -c "import math; print(math.ceil($WARMUP + $DURATION + $DRAIN + 15))")
    gen_cmd "$proto" "$model"
    timeout "$limit" taskset -c "$GCPUS" "${GEN[@]}" --warmup "$WARMUP" --duration "$DURATION" \
        --drain "$DRAIN" --label "$name" --json "$OUT/runs/$name.json" "$@" \
        2> "$OUT/runs/$name.log" || rc=$?
    t1=$(date +%s.%N); s1=$(proc_jiffies "$SPID"); j1=$(busy_jiffies)
    x1=$(ctx_switches "$SPID")
    read -r b0 b1 <<< "$(server_counts "$model")"
    cat "$OUT/runs/$name.log" >&2
    [ -s "$OUT/runs/$name.json" ] || { say "$name: no result (exit $rc)"; return 0; }
    "$PYTHON" - "$OUT/runs/$name.json" <<EOF
import json, os, sys
p = sys.argv[1]; r = json.load(open(p))
hz = os.sysconf("SC_CLK_TCK"); wall = $t1 - $t0
server = ($s1 - $s0) / hz; gen = r["generator_cpu_s"]
other = max(0.0, ($j1 - $j0) / hz - server - gen)
r["server_name"] = "$SNAME"; r["exit"] = $rc; r["kind"] = "$kind"
r["model"] = "$model"; r["proto"] = "$proto"
r["machine"] = {"busy_pct_before": $busy, "quiet_wait_s": $QUIET_WAITED,
                "other_cpu_pct_during": round(100 * other / (wall * os.cpu_count()), 1)}
r["server_cpu_pct"] = round(100 * server / wall, 1)
batches = $b0 - $c0; reqs = $b1 - $c1
r["batches"] = batches; r["mean_rows_per_batch"] = round(reqs / batches, 2) if batches else 0
# Over the whole run (warm-up and drain included), per request the server completed.
r["server_ctx_switches_per_req"] = round(($x1 - $x0) / reqs, 2) if reqs else 0
r["server_cpu_us_per_req"] = round(1e6 * server / reqs, 1) if reqs else 0
json.dump(r, open(p, "w"))
EOF
}

# perf_closed PROTO: `perf record` of the current server while a closed loop of the fraud model
# runs over PROTO (not measured): perf-<proto>*.txt.
perf_closed() {
    local proto=$1 tag=${1%%-*}
    say "perf record of the $SNAME server under the $proto closed loop (${DURATION}s)"
    perf record -o "$OUT/perf-$tag.data" -F 250 --call-graph dwarf,8192 -p "$SPID" \
        -- sleep "$DURATION" > /dev/null 2>&1 &
    local pp=$!
    gen_cmd "$proto" fraud
    timeout $(( ${DURATION%.*} + 10 )) taskset -c "$GCPUS" "${GEN[@]}" --closed "$CLOSED" \
        --warmup 0 --duration "$DURATION" --label "perf-$tag" > "$OUT/perf-$tag-run.json" \
        2> /dev/null || true
    wait "$pp" || true
    local r="perf report -i $OUT/perf-$tag.data --no-children"
    $r --sort dso,symbol --stdio -g none --percent-limit 0.3 2>/dev/null | grep -v '^$' |
        sed 's/  *$//' > "$OUT/perf-$tag.txt" || true
    $r --sort dso --stdio -g none 2>/dev/null | grep -v '^$' > "$OUT/perf-$tag-dso.txt" || true
    perf report -i "$OUT/perf-$tag.data" --children --sort symbol --stdio -g none \
        --percent-limit 1 2>/dev/null | grep -v '^$' | sed 's/  *$//' | head -200 \
        > "$OUT/perf-$tag-children.txt" || true
    rm -f "$OUT/perf-$tag.data"
}

# ---- jitter ---------------------------------------------------------------------------------
JITTER_S=5
[ "$QUICK" = 1 ] && JITTER_S=2
if ! skipped jitter && [ -x "$FLOOR" ]; then
    wait_quiet
    say "jitter: a clock-reading loop on CPU $SCPUS and CPU $GCPUS at once for ${JITTER_S}s" \
        "(machine ${QUIET_BUSY}% busy before)"
    taskset -c "$SCPUS" "$FLOOR" --jitter "$JITTER_S" > "$OUT/runs/jitter-server-cpu.json" &
    jp=$!
    taskset -c "$GCPUS" "$FLOOR" --jitter "$JITTER_S" > "$OUT/runs/jitter-generator-cpu.json"
    wait "$jp"
fi

# ---- the runs -------------------------------------------------------------------------------
for rep in $(seq 1 "$REPS"); do
    for s in $SERVERS; do
        start_server "$s"
        say "round $rep/$REPS: server $s on 127.0.0.1:$SPORT (REST) and :$GPORT (gRPC)," \
            "CPU $SCPUS; generator on CPU $GCPUS"
        for m in $MODELS; do
            for p in $PROTOCOLS; do
                run closed "c-$s-$m-$p-r$rep" "$m" "$p" --closed "$CLOSED"
            done
            for rate in $RATES; do
                for p in $PROTOCOLS; do
                    case "$p" in rest-*) conns=(--connections 256) ;; *) conns=() ;; esac
                    run open "o-$s-$m-$p-$rate-r$rep" "$m" "$p" --rate "$rate" "${conns[@]}"
                done
            done
        done
        if [ "$PERF" = 1 ] && [ "$s" = unbatched ] && [ "$rep" = 1 ] && command -v perf > /dev/null; then
            perf_closed grpc
            perf_closed rest-binary
        fi
    done
done
stop_server

# ---- report ---------------------------------------------------------------------------------
"$PYTHON" - "$OUT" "$SCPUS" "$GCPUS" "$DURATION" "$WARMUP" "$CLOSED" "$GCONNS" "$REPS" "$COMMIT" <<'EOF'
import json, os, sys
out, scpus, gcpus, dur, warm, closed, gconns, reps, commit = sys.argv[1:]
sys.path.insert(0, "bench")
from runs import group, load_runs, machine, med, rng
runs = load_runs(out)
meta = {**machine(out), "server_cpus": scpus,
        "generator_cpus": gcpus, "duration_s": float(dur), "warmup_s": float(warm),
        "reps": int(reps), "closed": int(closed), "grpc_connections": int(gconns),
        "commit": commit, "loadavg": open("/proc/loadavg").read().split()[:3]}
def load(rs):
    return "%d%% / %.0f%%" % (max(r["machine"]["busy_pct_before"] for r in rs),
                              max(r["machine"]["other_cpu_pct_during"] for r in rs))
PROTO = {"rest-json": "REST JSON", "rest-binary": "REST binary", "grpc": "gRPC raw",
         "grpc-typed": "gRPC typed"}
PORDER = ["rest-json", "rest-binary", "grpc", "grpc-typed"]
MORDER = {"ident": 0, "fraud": 1}
SORDER = {"unbatched": 0, "batched": 1}
def key(r):
    return (MORDER.get(r["model"], 9), SORDER.get(r["server_name"], 9),
            r.get("offered_rps", 0), PORDER.index(r["proto"]))
def p99(rs):
    return med([r["latency_ms"]["p99"] for r in rs])

L = []
L.append("Machine: %s, %d CPUs, kernel %s; server pinned to CPU %s, generator to CPU %s; "
         "%s s measured after %s s warm-up per run, %s round(s); commit %s; load average at "
         "the end %s." % (meta["cpu"], meta["cpus"], meta["kernel"], scpus, gcpus, dur, warm,
                          reps, commit, " ".join(meta["loadavg"])))
L.append("")
ju = [runs.get("jitter-server-cpu"), runs.get("jitter-generator-cpu")]
if all(ju):
    L.append("Platform jitter (a clock-reading loop on each CPU at once, %.0f s): " % ju[0]["seconds"] +
             "; ".join("%s CPU: %d gaps over 100 us (%.1f ms lost), %d over 1 ms, longest %.2f ms" % (
                 n, j["gaps_over_100us"], j["lost_ms"], j["gaps_over_1ms"], j["max_gap_ms"])
                 for n, j in zip(["server", "generator"], ju)) + ".")
    L.append("")

gc, go = group(runs, "closed"), group(runs, "open")
# The summary: one line per model and server.
if gc or go:
    rates = sorted({int(r["offered_rps"]) for rs in go.values() for r in rs})
    protos = [p for p in PORDER if any(rs[0]["proto"] == p for rs in list(gc.values()) + list(go.values()))]
    L.append("**Summary**: closed-loop throughput (req/s, %s in flight) and p99 end to end (ms) "
             "of the open loop at each rate; medians of the rounds." % closed)
    L.append("")
    hdr = ["model", "server"] + ["%s req/s" % PROTO[p] for p in protos]
    if "grpc" in protos and "rest-binary" in protos:
        hdr.append("gRPC / REST binary")
    for rt in rates:
        hdr += ["%s p99 @ %d" % (PROTO[p], rt) for p in protos]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|---|---|" + "---:|" * (len(hdr) - 2))
    combos = sorted({(rs[0]["model"], rs[0]["server_name"]) for rs in list(gc.values()) + list(go.values())},
                    key=lambda x: (MORDER.get(x[0], 9), SORDER.get(x[1], 9)))
    for m, s in combos:
        row = [m, s]
        thr = {}
        for p in protos:
            rs = gc.get("c-%s-%s-%s" % (s, m, p))
            thr[p] = med([r["achieved_rps"] for r in rs]) if rs else None
            err = sum(r["errors"] for r in rs) if rs else 0
            row.append("-" if rs is None else "%.0f%s" % (thr[p], " (%d err)" % err if err else ""))
        if "grpc" in protos and "rest-binary" in protos:
            row.append("%.2f" % (thr["grpc"] / thr["rest-binary"]) if thr["grpc"] and thr["rest-binary"] else "-")
        for rt in rates:
            for p in protos:
                rs = go.get("o-%s-%s-%s-%d" % (s, m, p, rt))
                if not rs:
                    row.append("-")
                    continue
                err = sum(r["errors"] for r in rs)
                row.append("%.2f%s" % (p99(rs), " (%d err)" % err if err else ""))
        L.append("| " + " | ".join(row) + " |")
    L.append("")

if gc:
    L.append("**Closed loop** (%s requests in flight: REST on %s keep-alive connections, gRPC as "
             "%s streams over %s HTTP/2 connections)" % (closed, closed, closed, gconns))
    L.append("")
    L.append("| model | server | protocol | req/s | p50 ms | p99 ms | p99.9 ms | server queue p99 ms "
             "| rows/batch | server CPU | server CPU us/req | ctx sw/req | generator CPU | errors "
             "| busy before / other CPU during (max) |")
    L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in sorted(gc, key=lambda k: key(gc[k][0])):
        rs = gc[k]
        r0 = rs[0]
        L.append("| %s | %s | %s | %s | %s | %s | %s | %.3f | %.1f | %.0f%% | %.0f | %.1f | %.0f%% | %d | %s |" % (
            r0["model"], r0["server_name"], PROTO[r0["proto"]],
            rng([r["achieved_rps"] for r in rs], "%.0f"),
            rng([r["latency_ms"]["p50"] for r in rs], "%.2f"),
            rng([r["latency_ms"]["p99"] for r in rs], "%.2f"),
            rng([r["latency_ms"]["p999"] for r in rs], "%.1f"),
            med([r["server_queue_ms"]["p99"] for r in rs]),
            med([r["mean_rows_per_batch"] for r in rs]), med([r["server_cpu_pct"] for r in rs]),
            med([r["server_cpu_us_per_req"] for r in rs]),
            med([r["server_ctx_switches_per_req"] for r in rs]),
            med([r["generator_cpu_pct"] for r in rs]), sum(r["errors"] for r in rs), load(rs)))
    L.append("")

if go:
    L.append("**Open loop, Poisson arrivals** (latency from the scheduled send time; REST on 256 "
             "keep-alive connections, gRPC on %s HTTP/2 connections)" % gconns)
    L.append("")
    L.append("| model | server | protocol | offered req/s | achieved | p50 ms | p99 ms | p99.9 ms "
             "| p99 from actual send ms | generator lag p99 ms | rows/batch | server CPU us/req "
             "| errors | busy before / other CPU during (max) |")
    L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in sorted(go, key=lambda k: key(go[k][0])):
        rs = go[k]
        r0 = rs[0]
        errs = sum(r["errors"] for r in rs)
        bl = sum(r["backlogged"] for r in rs)
        L.append("| %s | %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %.1f | %.0f | %s | %s |" % (
            r0["model"], r0["server_name"], PROTO[r0["proto"]], r0["offered_rps"],
            med([r["achieved_rps"] for r in rs]),
            rng([r["latency_ms"]["p50"] for r in rs], "%.3f"),
            rng([r["latency_ms"]["p99"] for r in rs], "%.2f"),
            rng([r["latency_ms"]["p999"] for r in rs], "%.1f"),
            rng([r["latency_from_send_ms"]["p99"] for r in rs], "%.2f"),
            rng([r["send_lag_ms"]["p99"] for r in rs], "%.2f"),
            med([r["mean_rows_per_batch"] for r in rs]),
            med([r["server_cpu_us_per_req"] for r in rs]),
            str(errs) + (" (backlogged %d)" % bl if bl else ""), load(rs)))
    L.append("")
json.dump({"meta": meta, "runs": runs}, open(os.path.join(out, "results.json"), "w"), indent=1)
open(os.path.join(out, "table.md"), "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
ln -sfn "grpc-$STAMP" bench/out/grpc-latest
say "done: $OUT/results.json, $OUT/table.md"
