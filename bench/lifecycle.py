#!/usr/bin/python3
"""lifecycle.py - model lifecycle benchmark of `sampan serve`: cold load, time to first token,
explicit and on-demand loads from a repository, and the swap time between two models under the
LRU memory budget.

    bench/lifecycle.py [--sampan build/sampan] [--n 5] [--models demo,1b] [--cache cold,warm]
                       [--sections start,explicit,lazy,fresh,swap] [--threads 2]
                       [--wait-quiet SECS] [--out DIR]

Models: "demo" is models/stories260K.gguf; "1b" is the TinyLlama-1.1B-shaped random-weight Q8_0
file of bench/run.sh (bench/models/tinyllama-random-q8_0.gguf, made with the same
tools/gguf_gen.py invocation when missing: /usr/bin/python3 with numpy, about a minute).

Sections, each repeated --n times (one server at a time, never in parallel: 2 cores):
  start     `sampan serve --model NAME=FILE --port 0 --threads 2`: spawn to the `event=ready` log
            line, spawn to the first /health 200 (polled every 2 ms once the port is known), the
            `model_ready ... load_ms` of the log, then the time to first token (TTFT) of the first
            streamed completion after ready and of a second one.
  explicit  a repository in explicit mode: the server is started and ready, then
            POST /v2/repository/models/NAME/load (time to its 200), its load_ms, TTFT after it
            (first and second request).
  lazy      a repository (control mode none) whose model has "load_on_demand": true: TTFT of the
            first request (load + first token) and of the second.
  fresh     "start" (warm) on a copy of the file made just before (shutil.copyfile, i.e. sendfile, synced, not
            read back): the page cache as a download or copy leaves it. On this machine (ext4,
            Linux 6.18) such a file is mapped with 4 KiB pages, while one read from disk gets
            2 MiB mappings (the "2 MiB-mapped" column, FilePmdMapped of /proc/PID/smaps_rollup).
  swap      a repository with two models, a and b (the same weights in two files, so two inodes
            and two sets of page-cache pages), both "load_on_demand": true, with
            --memory-budget cpu=1.5x one model's /stats memory_bytes (read from a first server
            without a budget): only one fits. A first request loads a; then requests alternate
            b, a, b, ... (each evicts the other model and loads its own), and every such request
            is followed by the same request again (no swap). Warm page cache: both files are
            read first and fit in memory.

--cache cold drops the page cache (`sync; echo 1 > /proc/sys/vm/drop_caches`, needs root) before
each repetition: before the spawn in "start" (so the binary and its libraries are cold too), after
the server is ready and before the load in "explicit" and "lazy". If it cannot, those rows are
marked "warm (drop failed)". --cache warm reads the file once first. Before anything else, when
it can, the script drops the page cache and reads every model file back, so that "warm" means
"read from disk earlier", whoever wrote the file last (see "fresh").

TTFT: request start (before connecting) to the first `data:` event whose choices[0].text is not
empty; a /v1/completions request with "stream": true, max_tokens 8, temperature 0, ignore_eos, the
prompt "Once upon a time". The time to the [DONE] event is recorded too.

Every wait is bounded (--timeout seconds); servers bind 127.0.0.1 on a free port (--port 0, read
from the `event=listening url=...` line) and are stopped (SIGTERM, then SIGKILL) at the end of each
repetition and at exit, errors included. Results: OUT/results.json (every repetition, the machine,
the other load), OUT/table.md, OUT/*.log (server stderr); OUT defaults to
bench/out/lifecycle-<stamp>/. Standard library only (fincore(1) is used when present to record
how much of the model file was in the page cache).
"""
import argparse
import atexit
import http.client
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join("models", "stories260K.gguf")
Q8 = os.path.join("bench", "models", "tinyllama-random-q8_0.gguf")
PROMPT = "Once upon a time"

_servers = []  # every Server still running, stopped at exit whatever happens


def say(msg):
    print(f"[lifecycle {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ machine

def busy_jiffies():
    """Non-idle jiffies of the whole machine (user nice system irq softirq steal)."""
    with open("/proc/stat") as f:
        a = f.readline().split()
    return sum(int(a[i]) for i in (1, 2, 3, 6, 7, 8))


def proc_cpu_jiffies(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])  # utime, stime (fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return 0


def faults(pid):
    """(minor, major) page faults of PID so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[7]), int(rest[9])  # minflt, majflt (fields 10 and 12)
    except (OSError, IndexError, ValueError):
        return None, None


def pmd_mapped_mib(pid):
    """File pages PID maps with 2 MiB (PMD) entries, in MiB; None when unknown."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("FilePmdMapped:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info():
    lscpu = dict(l.split(":", 1) for l in sh("LC_ALL=C lscpu").splitlines() if ":" in l)
    dirty = sh("git status --porcelain --untracked-files=no")
    return {
        "cpu": lscpu.get("Model name", "").strip(), "cpus": os.cpu_count(),
        "kernel": platform.release(), "mem_total": sh("grep MemTotal /proc/meminfo"),
        "sampan_commit": sh("git rev-parse --short HEAD") + ("+dirty" if dirty else ""),
        "python": platform.python_version(),
    }


def cpu_busy_pct(secs=1.0):
    """Share of all CPUs busy over SECS seconds (whatever runs)."""
    def read():
        with open("/proc/stat") as f:
            a = [int(x) for x in f.readline().split()[1:9]]
        return sum(a), a[3] + a[4]  # total, idle + iowait
    t0, i0 = read()
    time.sleep(secs)
    t1, i1 = read()
    return 100.0 * (1 - (i1 - i0) / max(1, t1 - t0))


def wait_quiet(limit):
    """Wait up to LIMIT seconds for the machine to be under 5% busy; the busy share when
    done waiting."""
    end = time.monotonic() + limit
    busy = cpu_busy_pct()
    while busy > 5 and time.monotonic() < end:
        busy = cpu_busy_pct()
    if busy > 5 and limit > 0:
        say(f"still {busy:.0f}% busy after {limit:.0f} s of waiting; running anyway")
    return round(busy, 1)


def drop_caches():
    """True when the page cache was dropped (root only)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def warm_file(path):
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def resident_bytes(path):
    """Bytes of PATH in the page cache (fincore), or None without fincore."""
    if shutil.which("fincore") is None:
        return None
    out = sh(f"fincore --bytes --noheadings --output RES '{path}'")
    try:
        return int(out.split()[0])
    except (IndexError, ValueError):
        return None


# ------------------------------------------------------------------ server

class Server:
    """One `sampan serve` process; its stderr lines are kept with the time they arrived."""

    def __init__(self, sampan, args, log_path, timeout):
        self.timeout = timeout
        self.lines = []  # (monotonic seconds, line)
        self.cv = threading.Condition()
        self.log = open(log_path, "w")
        self.t_spawn = time.monotonic()
        self.proc = subprocess.Popen([sampan, "serve", "--port", "0", "--host", "127.0.0.1"] + args,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, cwd=ROOT)
        _servers.append(self)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.cpu_jiffies = 0
        _, m = self.wait_line(r"event=listening url=http://127\.0\.0\.1:(\d+)")
        self.port = int(m.group(1))

    def _read(self):
        for raw in self.proc.stderr:
            t = time.monotonic()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.write(line + "\n")
            with self.cv:
                self.lines.append((t, line))
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def mark(self):
        with self.cv:
            return len(self.lines)

    def wait_line(self, pattern, since=0, timeout=None):
        """(arrival time, match) of the first line from index SINCE matching PATTERN."""
        rx = re.compile(pattern)
        end = time.monotonic() + (timeout or self.timeout)
        with self.cv:
            i = since
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i][1])
                    if m:
                        return self.lines[i][0], m
                    i += 1
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and i >= len(self.lines)):
                    tail = "\n".join(l for _, l in self.lines[-5:])
                    raise RuntimeError(f"no log line /{pattern}/ (exit {self.proc.poll()}):\n{tail}")
                self.cv.wait(min(left, 0.5))

    def find_all(self, pattern, since=0):
        rx = re.compile(pattern)
        with self.cv:
            return [m for _, l in self.lines[since:] for m in [rx.search(l)] if m]

    def stop(self):
        if self in _servers:
            _servers.remove(self)
        if self.proc.poll() is None:
            self.cpu_jiffies = proc_cpu_jiffies(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.reader.join(timeout=5)
        self.log.close()
        return self.proc.returncode


def stop_all():
    for srv in list(_servers):
        try:
            srv.stop()
        except Exception:  # at exit: make sure the next one is still killed
            srv.proc.kill()


atexit.register(stop_all)


def _on_signal(sig, frame):
    raise SystemExit(128 + sig)


signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


# ------------------------------------------------------------------ HTTP

def request(port, method, path, body=None, timeout=120):
    """(status, parsed body or raw bytes, seconds)."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        dt = time.monotonic() - t0
        try:
            return r.status, (json.loads(raw) if raw else None), dt
        except ValueError:
            return r.status, raw, dt
    finally:
        c.close()


def wait_health(port, t_spawn, timeout):
    """Seconds from T_SPAWN to the first /health 200, polling every 2 ms."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return time.monotonic() - t_spawn
        except OSError:
            pass
        time.sleep(0.002)
    raise RuntimeError(f"/health not 200 after {timeout} s")


def ttft(port, model, timeout=120):
    """One streamed completion: {ttft_ms, done_ms, text_events}; raises on any error."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"{model}: HTTP {r.status}: {r.read()[:300]!r}")
        first, events = None, 0
        for _ in range(10000):  # 8 tokens give about 20 lines; bounded anyway
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = time.monotonic() - t0
                if first is None:
                    raise RuntimeError(f"{model}: no text before [DONE]")
                return {"ttft_ms": round(first * 1e3, 3), "done_ms": round(done * 1e3, 3),
                        "text_events": events}
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(f"{model}: error event {ev['error']}")
            if ev["choices"] and ev["choices"][0].get("text"):
                events += 1
                if first is None:
                    first = time.monotonic() - t0
        raise RuntimeError(f"{model}: stream ended without [DONE]")
    finally:
        c.close()


def model_stats(port, name):
    st, b, _ = request(port, "GET", "/stats")
    if st != 200:
        raise RuntimeError(f"/stats: HTTP {st}")
    return b["models"].get(name), b


# ------------------------------------------------------------------ repositories

def link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def make_repo(path, models):
    """PATH/NAME/config.json and PATH/NAME/1/model.gguf (a hard link of FILE) per
    NAME: (FILE, extra config)."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    for name, (file, extra) in models.items():
        os.makedirs(os.path.join(path, name, "1"))
        link_or_copy(file, os.path.join(path, name, "1", "model.gguf"))
        cfg = {"name": name, "backend": "llm"}
        cfg.update(extra)
        with open(os.path.join(path, name, "config.json"), "w") as f:
            json.dump(cfg, f)
    return path


def second_copy(file, workdir):
    """A copy of FILE with its own inode (made once), so the two swap models do not share
    page-cache pages."""
    dst = os.path.join(workdir, os.path.basename(file).replace(".gguf", "") + "-copy.gguf")
    if not (os.path.isfile(dst) and os.path.getsize(dst) == os.path.getsize(file)):
        say(f"copying {file} -> {dst}")
        shutil.copyfile(file, dst + ".tmp")
        os.replace(dst + ".tmp", dst)
    return dst


# ------------------------------------------------------------------ sections

class Bench:
    def __init__(self, a):
        self.a = a
        self.out = a.out
        self.workdir = os.path.join(ROOT, "bench", "models", "lifecycle")
        os.makedirs(self.workdir, exist_ok=True)
        self.runs = []  # every repetition, as dicts
        self.n_log = 0
        self.server_jiffies = 0
        self.copies = {}  # model file -> its second copy for the swap
        self.read_back = False  # whether every file was dropped and read back first
        self.busy_before = {}  # section -> % of the machine busy just before it

    def log_path(self, tag):
        self.n_log += 1
        return os.path.join(self.out, f"{self.n_log:03d}-{tag}.log")

    def server(self, args, tag):
        return Server(self.a.sampan, ["--threads", str(self.a.threads)] + args,
                      self.log_path(tag), self.a.timeout)

    def finish(self, srv):
        rc = srv.stop()
        self.server_jiffies += srv.cpu_jiffies
        if rc not in (0, None):
            say(f"warning: server exited with {rc} (log {srv.log.name})")

    def prepare_cache(self, cache, file):
        """'cold', 'warm', 'warm (drop failed)' or 'fresh copy'; for cold, the page cache is
        dropped now; 'fresh' leaves it as the copy left it."""
        if cache == "fresh":
            return "fresh copy"
        if cache == "cold":
            if drop_caches():
                return "cold"
            say("cannot drop the page cache (not root?): measuring with a warm one")
            warm_file(file)
            return "warm (drop failed)"
        warm_file(file)
        return "warm"

    def load_line(self, srv, name, since):
        m = srv.wait_line(rf"event=model_ready model={re.escape(name)} .*memory_mib=([\d.]+) "
                          r".*load_ms=([\d.]+)", since)[1]
        return float(m.group(2)), float(m.group(1))

    # -- 1a/1b: process start
    def start(self, label, file, cache):
        name = label
        for rep in range(self.a.n):
            state = self.prepare_cache(cache, file)
            res0 = resident_bytes(file)
            srv = self.server(["--model", f"{name}={file}"], f"start-{label}-{cache}")
            try:
                t_health = wait_health(srv.port, srv.t_spawn, self.a.timeout)
                t_ready, _ = srv.wait_line(r"event=ready\b")
                load_ms, mem_mib = self.load_line(srv, name, 0)
                pid = srv.proc.pid
                rss, pmd, f0 = rss_bytes(pid), pmd_mapped_mib(pid), faults(pid)
                first = ttft(srv.port, name)
                f1 = faults(pid)
                second = ttft(srv.port, name)
                f2 = faults(pid)
            finally:
                self.finish(srv)
            r = {"section": "start", "model": label, "file": file, "cache": state, "rep": rep,
                 "resident_before": res0,
                 "ready_ms": round((t_ready - srv.t_spawn) * 1e3, 3),
                 "health_ms": round(t_health * 1e3, 3), "load_ms": load_ms,
                 "memory_mib": mem_mib, "rss_after_ready": rss, "pmd_mapped_mib": pmd,
                 "faults_at_ready": f0, "faults_after_first": f1, "faults_after_second": f2,
                 "ttft_first_ms": first["ttft_ms"], "done_first_ms": first["done_ms"],
                 "ttft_second_ms": second["ttft_ms"], "done_second_ms": second["done_ms"]}
            self.record(r)

    # -- a file just written: its page cache is as the copy left it (not read back)
    def fresh(self, label, file):
        dst = os.path.join(self.workdir, "fresh-" + os.path.basename(file))
        say(f"copying {file} -> {dst} (shutil.copyfile)")
        shutil.copyfile(file, dst)
        os.sync()  # no writeback while measuring
        try:
            self.start(label, dst, "fresh")
        finally:
            os.unlink(dst)

    # -- 1c: explicit load
    def explicit(self, label, file, cache):
        repo = make_repo(os.path.join(self.workdir, f"repo-explicit-{label}"), {label: (file, {})})
        for rep in range(self.a.n):
            srv = self.server(["--model-repository", repo, "--model-control-mode", "explicit"],
                              f"explicit-{label}-{cache}")
            try:
                srv.wait_line(r"event=ready\b")
                state = self.prepare_cache(cache, file)
                res0 = resident_bytes(file)
                mark = srv.mark()
                st, b, dt = request(srv.port, "POST", f"/v2/repository/models/{label}/load",
                                    timeout=self.a.timeout)
                if st != 200:
                    raise RuntimeError(f"load {label}: HTTP {st} {b}")
                load_ms, mem_mib = self.load_line(srv, label, mark)
                ms, _ = model_stats(srv.port, label)
                first = ttft(srv.port, label)
                second = ttft(srv.port, label)
            finally:
                self.finish(srv)
            self.record({"section": "explicit", "model": label, "file": file, "cache": state,
                         "rep": rep, "resident_before": res0,
                         "load_request_ms": round(dt * 1e3, 3), "load_ms": load_ms,
                         "stats_load_ms": ms and ms.get("load_ms"), "memory_mib": mem_mib,
                         "memory_bytes": ms and ms.get("memory_bytes"),
                         "ttft_first_ms": first["ttft_ms"], "ttft_second_ms": second["ttft_ms"]})

    # -- 1d: load on demand
    def lazy(self, label, file, cache):
        repo = make_repo(os.path.join(self.workdir, f"repo-lazy-{label}"),
                         {label: (file, {"load_on_demand": True})})
        for rep in range(self.a.n):
            srv = self.server(["--model-repository", repo], f"lazy-{label}-{cache}")
            try:
                t_ready, _ = srv.wait_line(r"event=ready\b")
                if srv.find_all(r"event=model_ready"):
                    raise RuntimeError("a load_on_demand model was loaded at start")
                state = self.prepare_cache(cache, file)
                res0 = resident_bytes(file)
                mark = srv.mark()
                first = ttft(srv.port, label)
                load_ms, mem_mib = self.load_line(srv, label, mark)
                second = ttft(srv.port, label)
            finally:
                self.finish(srv)
            self.record({"section": "lazy", "model": label, "file": file, "cache": state,
                         "rep": rep, "resident_before": res0,
                         "ready_ms": round((t_ready - srv.t_spawn) * 1e3, 3),
                         "load_ms": load_ms, "memory_mib": mem_mib,
                         "ttft_first_ms": first["ttft_ms"], "done_first_ms": first["done_ms"],
                         "ttft_second_ms": second["ttft_ms"]})

    # -- 2: swap under the LRU budget
    def swap(self, label, file):
        copy = self.copies[file]
        lazy = {"load_on_demand": True}
        repo = make_repo(os.path.join(self.workdir, f"repo-swap-{label}"),
                         {"a": (file, lazy), "b": (copy, lazy)})
        warm_file(file)
        warm_file(copy)
        # One model's charge, from a server without a budget.
        srv = self.server(["--model-repository", repo], f"swap-probe-{label}")
        try:
            srv.wait_line(r"event=ready\b")
            ttft(srv.port, "a")
            one = model_stats(srv.port, "a")[0]["memory_bytes"]
        finally:
            self.finish(srv)
        budget = int(one * 1.5)
        srv = self.server(["--model-repository", repo, "--memory-budget", f"cpu={budget}"],
                          f"swap-{label}")
        try:
            srv.wait_line(r"event=ready\b")
            ttft(srv.port, "a")  # loads a; the first request of a process pays one-time costs
            cur = "a"
            for rep in range(self.a.n):
                nxt = "b" if cur == "a" else "a"
                ev0 = model_stats(srv.port, nxt)[1]["evictions"]
                mark = srv.mark()
                sw = ttft(srv.port, nxt)
                pmd = pmd_mapped_mib(srv.proc.pid)
                load_ms, mem_mib = self.load_line(srv, nxt, mark)
                evicted = srv.find_all(rf"event=model_evicted model={cur} ", mark)
                stats = model_stats(srv.port, nxt)[1]
                ev1 = stats["evictions"]
                if ev1 != ev0 + 1 or not evicted:
                    raise RuntimeError(f"request to {nxt} did not evict {cur} "
                                       f"(evictions {ev0} -> {ev1})")
                mark = srv.mark()
                same = ttft(srv.port, nxt)
                if srv.find_all(r"event=model_(ready|evicted)", mark):
                    raise RuntimeError(f"the repeated request to {nxt} loaded or evicted")
                self.record({"section": "swap", "model": label, "file": file, "copy": copy,
                             "cache": "warm", "rep": rep, "to": nxt, "evicted": cur,
                             "memory_bytes_one": one, "budget_bytes": budget,
                             "reserved_bytes": stats["devices"][0]["reserved_bytes"],
                             "load_ms": load_ms, "memory_mib": mem_mib, "pmd_mapped_mib": pmd,
                             "ttft_swap_ms": sw["ttft_ms"], "ttft_noswap_ms": same["ttft_ms"],
                             "overhead_ms": round(sw["ttft_ms"] - same["ttft_ms"], 3)})
                cur = nxt
        finally:
            self.finish(srv)

    def record(self, r):
        self.runs.append(r)
        keys = [k for k in r if k.endswith("_ms")]
        say(f"{r['section']} {r['model']} {r['cache']} #{r['rep']}: " +
            " ".join(f"{k[:-3]}={r[k]}" for k in keys))


# ------------------------------------------------------------------ report

def cell(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    if not vals:
        return "-"
    med = statistics.median(vals)
    return f"{med:.1f} ({min(vals):.1f}-{max(vals):.1f})"


def summarize(runs):
    groups = {}
    for r in runs:
        groups.setdefault((r["section"], r["model"], r["cache"]), []).append(r)
    load = ["| path | model | page cache | to ready ms | spawn to /health 200 ms | load_ms (log) "
            "| TTFT 1st request ms | TTFT 2nd request ms | 2 MiB-mapped MiB |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    swap = ["| model | memory_bytes of one | budget | swap request TTFT ms | load_ms in the swap "
            "| same request, no swap, TTFT ms | swap overhead ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    names = {"start": "process start (`--model`)", "explicit": "explicit `POST .../load`",
             "lazy": "`load_on_demand`, first request"}
    summary = []
    for (sec, model, cache), rows in groups.items():
        n = len(rows)
        if sec == "swap":
            one, budget = rows[0]["memory_bytes_one"], rows[0]["budget_bytes"]
            swap.append(f"| {model} | {one / 2**20:.1f} MiB | {budget / 2**20:.1f} MiB | "
                        f"{cell(rows, 'ttft_swap_ms')} | {cell(rows, 'load_ms')} | "
                        f"{cell(rows, 'ttft_noswap_ms')} | {cell(rows, 'overhead_ms')} |")
        else:
            ready = {"start": cell(rows, "ready_ms"), "explicit": cell(rows, "load_request_ms"),
                     "lazy": "-"}[sec]
            health = cell(rows, "health_ms") if sec == "start" else "-"
            load.append(f"| {names[sec]} | {model} | {cache} | {ready} | {health} | "
                        f"{cell(rows, 'load_ms')} | {cell(rows, 'ttft_first_ms')} | "
                        f"{cell(rows, 'ttft_second_ms')} | {cell(rows, 'pmd_mapped_mib')} |")
        agg = {"section": sec, "model": model, "cache": cache, "n": n}
        for k in sorted({k for r in rows for k in r if k.endswith("_ms")}):
            vals = [r[k] for r in rows if r.get(k) is not None]
            if vals:
                agg[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        summary.append(agg)
    md = "\n".join(load)
    if len(swap) > 2:
        md += "\n\n" + "\n".join(swap)
    return md, summary


# ------------------------------------------------------------------ main

def ensure_q8(path):
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return
    vocab = None
    for v in ("tests/data/tokenizer/ggml-vocab-llama-spm.gguf",
              "../shared/testdata/tokenizer/ggml-vocab-llama-spm.gguf"):
        if os.path.isfile(os.path.join(ROOT, v)):
            vocab = v
            break
    cmd = ["/usr/bin/python3", "tools/gguf_gen.py", path + ".tmp", "--preset", "tinyllama",
           "--type", "q8_0", "--seed", "1", "-q"] + (["--vocab-from", vocab] if vocab else [])
    say("generating " + path + ": " + " ".join(cmd))
    os.makedirs(os.path.dirname(os.path.join(ROOT, path)), exist_ok=True)
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=1800)
    os.replace(os.path.join(ROOT, path + ".tmp"), os.path.join(ROOT, path))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sampan", default=os.environ.get("SAMPAN", "build/sampan"))
    ap.add_argument("--n", type=int, default=5, help="repetitions of each measurement")
    ap.add_argument("--models", default="demo,1b", help="demo, 1b or both")
    ap.add_argument("--q8", default=Q8, help="the 1B Q8_0 file (made when missing)")
    ap.add_argument("--cache", default="cold,warm")
    ap.add_argument("--sections", default="start,explicit,lazy,fresh,swap")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120, help="seconds for any one wait")
    ap.add_argument("--wait-quiet", type=float, default=0,
                    help="before each section, wait up to this many seconds for <5%% CPU use")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.chdir(ROOT)
    if not (1 <= a.n <= 100):
        ap.error("--n must be 1 to 100")
    if not os.access(a.sampan, os.X_OK):
        ap.error(f"{a.sampan} not found: make BUILD=... first (or --sampan PATH)")
    a.sampan = os.path.abspath(a.sampan)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a.out = a.out or os.path.join("bench", "out", f"lifecycle-{stamp}")
    os.makedirs(a.out, exist_ok=True)
    models = []
    for m in a.models.split(","):
        if m == "demo":
            models.append(("demo", DEMO))
        elif m == "1b":
            ensure_q8(a.q8)
            models.append(("1b-q8_0", a.q8))
        else:
            ap.error(f"unknown model {m}")
    sections = a.sections.split(",")
    caches = a.cache.split(",")
    say(f"results in {a.out}")

    b = Bench(a)
    if "swap" in sections:
        for _, file in models:
            b.copies[file] = second_copy(file, b.workdir)
    # A file's page cache keeps the shape its writer gave it: one just generated or copied is
    # mapped with 4 KiB pages, one read from disk with 2 MiB pages where the file system allows
    # (see the "fresh" section). Start from files read back from disk, whoever wrote them last.
    files = [f for _, f in models] + list(b.copies.values())
    b.read_back = drop_caches()
    for f in files:
        warm_file(f)
    if not b.read_back:
        say("cannot drop the page cache: files stay as their writers left them in the cache")
    info = machine_info()  # sampan_commit: of this checkout, which may not be the binary's
    info["sampan_binary"] = a.sampan
    info["sampan_version"] = sh(f"'{a.sampan}' --version 2>&1 | head -1")
    info["page_cache_read_back"] = b.read_back
    info["loadavg_before"] = open("/proc/loadavg").read().split()[:3]
    j0, t0, own0 = busy_jiffies(), time.monotonic(), os.times()
    err = None
    try:
        for label, file in models:
            for sec in ("start", "explicit", "lazy"):
                if sec in sections:
                    for cache in caches:
                        b.busy_before[f"{sec}/{label}/{cache}"] = wait_quiet(a.wait_quiet)
                        getattr(b, sec)(label, file, cache)
            if "fresh" in sections:
                b.busy_before[f"fresh/{label}"] = wait_quiet(a.wait_quiet)
                b.fresh(label, file)
            if "swap" in sections:
                b.busy_before[f"swap/{label}"] = wait_quiet(a.wait_quiet)
                b.swap(label, file)
    except Exception as e:  # report what was measured, then fail
        err = f"{type(e).__name__}: {e}"
        say("error: " + err)
    finally:
        stop_all()
    own1 = os.times()
    wall = time.monotonic() - t0
    hz = os.sysconf("SC_CLK_TCK")
    own = (own1.user - own0.user) + (own1.system - own0.system) + b.server_jiffies / hz
    other = max(0.0, (busy_jiffies() - j0) / hz - own)
    info["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    info["other_load_pct"] = round(100 * other / (wall * (os.cpu_count() or 1)), 1)
    info["wall_s"] = round(wall, 1)
    info["busy_pct_before_sections"] = b.busy_before
    md, summary = summarize(b.runs)
    settings = {k: v for k, v in vars(a).items()}
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"stamp": stamp, "settings": settings, "machine": info, "error": err,
                   "summary": summary, "runs": b.runs}, f, indent=1)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    print(f"\nmedian (min-max) of {a.n}; other load {info['other_load_pct']}% of the machine; "
          f"results: {a.out}/results.json")
    if err:
        print(f"\nerror: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
