#!/usr/bin/env bash
# bench/http.sh - the HTTP front end under wrk, side by side with nginx `return 200`.
#
#   bench/http.sh                       # 10 s per run, 256 connections, 2 wrk threads
#   bench/http.sh --quick               # 2 s per run (smoke test)
#   bench/http.sh --duration 30 --connections 256 --threads 2 --workers 2 [--out FILE.md]
#
# Same machine, same wrk settings, one server at a time: Sampan (`sampan serve` with the demo
# model, --http-threads WORKERS) and nginx (Debian nginx-light, worker_processes WORKERS, from
# a temporary config as a normal process: no system service), both on 127.0.0.1 free ports.
# Each route is run against Sampan and then against nginx answering `return 200` with a body
# of the same shape, after a 1 s warm-up each. Routes:
#   GET  /health                               readiness (front end only)
#   GET  /v1/models                            the OpenAI model list (front end + JSON)
#   GET  /v2/models/stories260K/ready          KServe v2 model readiness (front end only)
#   POST /v2/models/stories260K/infer          KServe v2 infer: text_input "Once", max_tokens 1
#                                              (runs the model: tokenize, prefill, one token)
# The markdown table goes to stdout and to bench/out/http-<stamp>.md (or --out).
# Needs wrk and nginx-light (scripts/deps.sh --bench installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=10 CONNS=256 THREADS=2 WORKERS=2 OUT="" BUILD=${BUILD:-build}
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) DURATION=$2; shift 2 ;;
        --connections) CONNS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --quick) DURATION=2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "http.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
for v in "$DURATION" "$CONNS" "$THREADS" "$WORKERS"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "http.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
./scripts/deps.sh --bench # wrk, nginx-light, curl: only those missing
command -v wrk >/dev/null || { echo "http.sh: wrk is missing (scripts/deps.sh --bench)" >&2; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || { echo "http.sh: nginx is missing (scripts/deps.sh --bench)" >&2; exit 1; }

SAMPAN=${SAMPAN:-$BUILD/sampan}
if [ -z "${SAMPAN_NO_BUILD:-}" ]; then make -s "BUILD=$BUILD" "$BUILD/sampan" >&2; fi

tmp=$(mktemp -d /tmp/sampan-http.XXXXXX)
spid="" npid=""
cleanup() {
    [ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
    [ -n "$npid" ] && kill "$npid" 2>/dev/null && wait "$npid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_http() { # url: up to 10 s for a 200
    for _ in $(seq 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)" = 200 ] && return 0
        sleep 0.1
    done
    echo "http.sh: $1 did not answer 200" >&2
    exit 1
}

# ---- the servers
SPORT=$(free_port)
"$SAMPAN" serve --port "$SPORT" --http-threads "$WORKERS" --threads 1 --parallel 4 --queue 4096 \
    --max-connections 8192 --max-conns-per-client 0 --conn-rate-per-client 0 >"$tmp/sampan.log" 2>&1 &
spid=$!
NPORT=$(free_port)
INFER_ANSWER='{"model_name":"stories260K","model_version":"1","outputs":[{"name":"text_output","datatype":"BYTES","shape":[1],"data":[" upon"]},{"name":"finish_reason","datatype":"BYTES","shape":[1],"data":["length"]}]}'
mkdir -p "$tmp/nginx"
cat >"$tmp/nginx.conf" <<EOF
daemon off;
user $(id -un) $(id -gn);
worker_processes $WORKERS;
pid $tmp/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    default_type application/json;
    keepalive_requests 1000000;
    client_body_temp_path $tmp/nginx/body;
    proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi;
    uwsgi_temp_path $tmp/nginx/uwsgi;
    scgi_temp_path $tmp/nginx/scgi;
    server {
        listen 127.0.0.1:$NPORT backlog=4096;
        location = /health { return 200 '{"status":"ok"}'; }
        location = /v1/models { return 200 '{"object":"list","data":[{"id":"stories260K","object":"model","created":1764700000,"owned_by":"sampan","max_model_len":512,"ready":true}]}'; }
        location = /v2/models/stories260K/ready { return 200; }
        location = /v2/models/stories260K/infer { return 200 '$INFER_ANSWER'; }
    }
}
EOF
"$NGINX" -c "$tmp/nginx.conf" -p "$tmp/nginx" &
npid=$!
wait_http "http://127.0.0.1:$SPORT/health"
wait_http "http://127.0.0.1:$NPORT/health"

cat >"$tmp/infer.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs":[{"name":"text_input","datatype":"BYTES","shape":[1],"data":["Once"]},{"name":"max_tokens","datatype":"INT32","shape":[1],"data":[1]},{"name":"temperature","datatype":"FP32","shape":[1],"data":[0]}]}'
EOF
# Check the infer body really is a 200 on Sampan (a 4xx would measure the error path).
code=$(curl -s -o "$tmp/infer.out" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d "$(sed -n "s/^wrk.body = '\(.*\)'$/\1/p" "$tmp/infer.lua")" \
    "http://127.0.0.1:$SPORT/v2/models/stories260K/infer")
[ "$code" = 200 ] || { echo "http.sh: infer answered $code: $(cat "$tmp/infer.out")" >&2; exit 1; }

# ---- wrk runs
# One run: prints "req/s p50 p90 p99 non2xx errors" (latencies in ms).
wrk_run() { # url [lua]
    local script=() out
    [ -n "${2:-}" ] && script=(-s "$2")
    wrk -t"$THREADS" -c"$CONNS" -d1s "${script[@]}" "$1" >/dev/null 2>&1 || true # warm-up
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "${script[@]}" "$1" 2>&1)
    echo "$out" >>"$tmp/wrk.log"
    echo "$out" | awk '
        function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0;
                         if (v ~ /m$/) return v * 60000; if (v ~ /s$/) return v * 1000; return v }
        /Requests\/sec:/ { rps = $2 }
        /^ +50%/ { p50 = ms($2) } /^ +90%/ { p90 = ms($2) } /^ +99%/ { p99 = ms($2) }
        /Non-2xx/ { non = $NF }
        /Socket errors:/ { gsub(/,/, ""); err = $4 + $6 + $8 + $10 }
        END { printf "%d %.3f %.3f %.3f %d %d\n", rps, p50, p90, p99, non, err }'
}

stamp=$(date +%Y%m%d-%H%M%S)
load=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
table="$tmp/table.md"
{
    echo "wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}'), -t$THREADS -c$CONNS -d${DURATION}s (after a 1 s warm-up), $(nproc) CPUs ($cpu), load before: $load; sampan --http-threads $WORKERS, nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') worker_processes $WORKERS; $stamp"
    echo
    echo "| route | server | req/s | p50 ms | p90 ms | p99 ms | non-2xx | socket errors |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
} >"$table"
for route in "GET /health" "GET /v1/models" "GET /v2/models/stories260K/ready" "POST /v2/models/stories260K/infer"; do
    path=${route#* }
    lua=""
    [ "${route%% *}" = POST ] && lua="$tmp/infer.lua"
    for srv in sampan nginx; do
        port=$SPORT
        [ $srv = nginx ] && port=$NPORT
        read -r rps p50 p90 p99 non err < <(wrk_run "http://127.0.0.1:$port$path" "$lua")
        label="Sampan"
        [ $srv = nginx ] && label="nginx \`return 200\`"
        printf '| `%s` | %s | %s | %s | %s | %s | %s | %s |\n' "$route" "$label" "$rps" "$p50" "$p90" \
            "$p99" "$non" "$err" >>"$table"
        echo "http.sh: $route on $srv: $rps req/s, p99 $p99 ms" >&2
    done
done
{ echo; echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"; } >>"$table"
if [ -z "$OUT" ]; then
    mkdir -p bench/out
    OUT="bench/out/http-$stamp.md"
fi
cp "$table" "$OUT"
cp "$tmp/wrk.log" "${OUT%.md}.wrk.log"
cat "$table"
echo "http.sh: wrote $OUT (raw wrk output: ${OUT%.md}.wrk.log)" >&2
