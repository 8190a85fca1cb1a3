"""common.py - small helpers shared by the Python test files (tests/py/test_*.py).

    from common import ROOT, binary, run, Suite, Server
    s = Suite("reference")
    s.case("name", ok, "detail")      # one line per case
    s.skip("name", "why")
    s.finish()                        # last line: "reference: N passed, N failed, N skipped"

Tests run with Debian's /usr/bin/python3 (+ python3-numpy); tests/run.sh tallies the
summary line. The binary is $SAMPAN_BIN or build/sampan under the repository root.
"""
import atexit
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools"))


def binary():
    """Path of the sampan binary, or None when it has not been built."""
    p = os.environ.get("SAMPAN_BIN") or os.path.join(ROOT, "build", "sampan")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


def run(args, timeout=120, env=None):
    """Run a command from the repository root; returns (returncode, stdout, stderr) as
    text. `env` adds to the current environment. Never raises for a non-zero exit; a
    timeout is returned as returncode -9 with a note in stderr."""
    full_env = dict(os.environ, **env) if env else None
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                           env=full_env)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        return -9, e.stdout or "", f"timed out after {timeout} s"


class Suite:
    def __init__(self, name):
        self.name = name
        self.passed = self.failed = self.skipped = 0

    def case(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        tag = "ok  " if ok else "FAIL"
        print(f"{tag} {name}" + (f"  ({detail})" if detail else ""), flush=True)
        return ok

    def skip(self, name, why):
        self.skipped += 1
        print(f"skip {name}  ({why})", flush=True)

    def guard(self, name, fn, *args, **kw):
        """Run fn; an exception is a failed case named `name` (with the traceback)."""
        try:
            return fn(*args, **kw)
        except Exception as e:  # a crash in a case must not hide the other cases
            traceback.print_exc()
            self.case(name, False, f"{type(e).__name__}: {e}")
            return None

    def need(self, what, modules=(), files=(), hint=""):
        """Import `modules` and check `files` exist, or print one skipped line for `what` and end
        the suite (the Debian packages to install in `hint`). Returns the modules, in order."""
        import importlib
        try:
            got = [importlib.import_module(m) for m in modules]
        except ImportError as e:
            self.skip(what, f"{e}" + (f" (apt-get install {hint})" if hint else ""))
            self.finish()
        for f in files:
            if not os.path.isfile(f):
                self.skip(what, f"{f} not built")
                self.finish()
        return got

    def finish(self):
        print(f"{self.name}: {self.passed} passed, {self.failed} failed, {self.skipped} skipped",
              flush=True)
        sys.exit(1 if self.failed else 0)


DEMO_MODEL = os.path.join(ROOT, "models", "stories260K.gguf")


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


_live_servers = set()


def _kill_live_servers():
    # A suite that dies on an exception leaves no server behind (one that did held the default
    # gRPC port and failed a later suite).
    for p in list(_live_servers):
        if p.poll() is None:
            p.kill()
            p.wait()


atexit.register(_kill_live_servers)


class Server:
    """A `sampan serve` on 127.0.0.1 and a free port (--port 0; the port is read from its
    `event=listening url=...` log line), ready when it logs `event=ready`. Its stderr is
    collected by a thread; stop() sends SIGTERM and waits (kills after 10 s). model=None
    leaves --model out (e.g. when `extra` names a --model-repository)."""

    def __init__(self, *extra, model=f"stories260K={DEMO_MODEL}", start_timeout=10):
        args = [binary(), "serve", *(["--model", model] if model else []), "--port", "0",
                "--threads", "1", *extra]
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  cwd=ROOT, text=True)
        _live_servers.add(self.p)
        self.log = []
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.p.stderr:
                self.log.append(line)
                m = re.search(r"url\"?[=:]\"?https?://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                if "event=ready" in line or '"event":"ready"' in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(start_timeout) or self.port is None:
            self.stop()
            raise RuntimeError("server did not start: " + "".join(self.log))

    def text(self):
        return "".join(self.log)

    def wait_log(self, pattern, timeout=3.0):
        end = time.time() + timeout
        while time.time() < end:
            m = re.search(pattern, self.text())
            if m:
                return m
            time.sleep(0.02)
        return None

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode


def http_json(port, method, path, body=None, timeout=20, headers=None):
    """One request to 127.0.0.1:port with a JSON body (None: no body); returns (status, the
    parsed JSON answer, or the raw bytes when it is not JSON, or None when empty)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        c.request(method, path, body=data,
                  headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        r = c.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw) if raw else None
        except ValueError:
            return r.status, raw
    finally:
        c.close()


def keyed_request(port, method, path, body=None, key=None, header="authorization", timeout=30):
    """One request with an API key (Bearer in Authorization, or the bare key in another header
    such as x-api-key); returns (status, lower-cased headers, the parsed JSON answer or the raw
    bytes, None when empty)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        if key is not None:
            h[header] = f"Bearer {key}" if header == "authorization" else key
        c.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        raw = r.read()
        try:
            b = json.loads(raw) if raw else None
        except ValueError:
            b = raw
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), b
    finally:
        c.close()


def keys_add(tenants_path, name, *opts):
    """`sampan keys add` into a tenants file; returns the new key (raises when refused)."""
    rc, out, err = run([binary(), "keys", "add", "--tenants", tenants_path, "--name", name, *opts],
                       timeout=30)
    if rc != 0:
        raise RuntimeError(f"keys add {name}: {err}")
    return out.strip()


def raw_exchange(port, data, timeout=10, half_close=False, chunks=None, gap=0.0):
    """Send raw bytes (or a list of chunks with a gap between them) and read until the server
    closes or the timeout. Returns (bytes received, seconds until close or None on timeout)."""
    sk = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t = time.time()
    out = b""
    try:
        for part in (chunks if chunks is not None else [data]):
            try:
                sk.sendall(part)
            except OSError:
                break  # the server answered early and closed
            if gap:
                time.sleep(gap)
        if half_close:
            try:
                sk.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        while True:
            try:
                b = sk.recv(65536)
            except socket.timeout:
                return out, None
            except OSError:
                break
            if not b:
                break
            out += b
    finally:
        sk.close()
    return out, time.time() - t


NODE_DIR = os.path.join(ROOT, "tests", "node")


def have_grpc_client():
    """node and @grpc/grpc-js (tests/node, installed by npm ci) are there."""
    return shutil.which("node") is not None and \
        os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@grpc", "grpc-js"))


def grpc_client(port, calls, ca=None, timeout=90):
    """Run gRPC calls through tests/node/grpc_client.mjs (the official @grpc/grpc-js client);
    returns its list of results. ca: a CA file for TLS."""
    inp = {"addr": f"127.0.0.1:{port}", "calls": calls}
    if ca:
        inp["ca"] = ca
    r = subprocess.run(["node", os.path.join(NODE_DIR, "grpc_client.mjs")], input=json.dumps(inp),
                       capture_output=True, text=True, timeout=timeout, cwd=NODE_DIR)
    if r.returncode != 0:
        raise RuntimeError(f"grpc_client.mjs failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def grammar_literal(text):
    """A GBNF grammar whose only sentence is text (Sampan's `grammar` extension field makes the
    tiny demo model write exactly that)."""
    return "root ::= " + json.dumps(text)


def chat_repository(root, template, name="chat"):
    """A model repository under root with the demo model as `name` version 1, served with the
    chat template `template` (a Jinja string: e.g. ChatML with <think> and <tool_call> markup,
    so reasoning and tool calls are parsed as for a downloaded model). Returns the repository."""
    repo = os.path.join(root, "repo")
    os.makedirs(os.path.join(repo, name, "1"))
    shutil.copy(DEMO_MODEL, os.path.join(repo, name, "1", "model.gguf"))
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump({"name": name, "backend": "llm",
                   "parameters": {"chat_template": {"string_value": template}}}, f)
    return repo


def node_suite(suite, script, tag, package, env, timeout=120):
    """Run tests/node/SCRIPT (an official client's suite against a running server; env gives it
    the port and key) and add its counts, read from its last line "TAG: N passed, N failed", to
    suite. Skipped when node or the npm package (tests/node/node_modules/PACKAGE) is missing."""
    if shutil.which("node") is None:
        suite.skip(package, "node is not installed")
        return
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", package)):
        suite.skip(package, "tests/node/node_modules missing (npm ci)")
        return
    rc, out, err = run(["node", os.path.join(NODE_DIR, script)], timeout=timeout, env=env)
    print(out, end="")
    m = re.search(tag + r": (\d+) passed, (\d+) failed", out)
    if not m:
        suite.case(f"{package} suite ran", False, (out + err)[-800:])
    else:
        suite.passed += int(m.group(1))
        suite.failed += int(m.group(2))


class RepoServer(Server):
    """sampan serve --model-repository REPO (and no --model) on a free port."""

    def __init__(self, repo, *extra):
        super().__init__("--model-repository", repo, *extra, model=None)

    def req(self, method, path, body=None, timeout=20):
        return http_json(self.port, method, path, body, timeout)


def stream_completion(port, body, on_first=None, timeout=60):
    """POST /v1/completions with stream=True on 127.0.0.1:port: (status, text, error message or
    None); on_first() runs when the first text arrives."""
    body = dict(body, stream=True)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        data = r.read()
        c.close()
        return r.status, "", data.decode(errors="replace")
    text, err = [], None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        payload = line[6:]
        if payload == b"[DONE]":
            break
        ev = json.loads(payload)
        if "error" in ev:
            err = ev["error"].get("message", "error")
            continue
        t = ev["choices"][0].get("text", "")
        if t and on_first and not text:
            on_first()
        text.append(t)
    c.close()
    return 200, "".join(text), err


def greedy(prompt, n, **kw):
    """A greedy completion request body for the demo model."""
    return dict({"model": "stories260K", "prompt": prompt, "max_tokens": n, "temperature": 0}, **kw)


# Prompts for the demo model, distinct from each other (batch neighbours in the engine tests).
OTHERS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day",
          "Tom had a red ball", "The sun was hot", "A big bird", "Mom said"]

# A greedy request whose text must not depend on what runs beside it (batch invariance).
TARGET = greedy("Once upon a time, there was a little girl named", 40, ignore_eos=True)


def run_together(port, n_others, seed, other_tokens=(8, 48), target=TARGET, model="stories260K"):
    """The target (TARGET: a greedy request) streamed beside n_others concurrent greedy and
    sampled requests of other prompts; returns the target's (status, text, error)."""
    rnd = random.Random(seed)
    out = {}
    threads = []
    pos = rnd.randrange(n_others + 1)
    for i in range(n_others + 1):
        if i == pos:
            def job():
                out["t"] = stream_completion(port, target)
        else:
            body = greedy(rnd.choice(OTHERS), rnd.randrange(*other_tokens), ignore_eos=True,
                          temperature=rnd.choice([0, 0.8]), seed=rnd.randrange(1000), model=model)
            def job(b=body):
                stream_completion(port, b)
        threads.append(threading.Thread(target=job))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out.get("t", (0, None, "no answer"))
