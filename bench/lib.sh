# bench/lib.sh - what the benchmark scripts share (bench/fraud.sh, bench/grpc.sh, bench/run.sh): the
# machine's load from /proc, waiting for a quiet machine, a process's CPU time and context
# switches, a free port. Sourced; the caller defines say() and sets PYTHON and WAIT_QUIET.

# Share of all CPUs busy over one second, from /proc/stat.
cpu_busy_pct() {
    local a b
    read -r -a a < <(head -1 /proc/stat)
    sleep 1
    read -r -a b < <(head -1 /proc/stat)
    local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
    for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
    echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}
# Non-idle jiffies of the whole machine so far.
busy_jiffies() {
    local a i total=0
    read -r -a a < <(head -1 /proc/stat)
    for i in 1 2 3 6 7 8; do total=$(( total + a[i] )); done
    echo "$total"
}
# Jiffies a process has used (user + system), 0 when it is gone.
proc_jiffies() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    s=${s##*) }
    read -r -a f <<< "$s"
    echo $(( f[11] + f[12] ))
}
# Waits (at most WAIT_QUIET s) until the machine is under 10% busy; sets QUIET_BUSY (the last
# busy %) and QUIET_WAITED (seconds waited). A running server is idle meanwhile, so it does not
# count against quiet.
QUIET_WAITED=0 QUIET_BUSY=0
wait_quiet() {
    local start=$SECONDS b
    while :; do
        b=$(cpu_busy_pct)
        if [ "$b" -le 10 ] || [ "$WAIT_QUIET" -le 0 ]; then break; fi
        if [ $(( SECONDS - start )) -ge "$WAIT_QUIET" ]; then
            say "still ${b}% busy after ${WAIT_QUIET}s of waiting; running anyway"
            break
        fi
    done
    QUIET_WAITED=$(( SECONDS - start ))
    QUIET_BUSY=$b
}

# Context switches (voluntary + involuntary) of all of a process's threads so far.
ctx_switches() {
    cat /proc/"$1"/task/*/status 2>/dev/null |
        awk '/^(non)?voluntary_ctxt_switches/ { n += $2 } END { print n + 0 }'
}

# A free TCP port on 127.0.0.1.
free_port() {
    "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
