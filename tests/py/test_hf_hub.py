"""test_hf_hub.py - models by name from Hugging Face (`sampan pull`, `list`, `rm`,
`serve --model hf://...`; docs/design.md) against a hub stand-in on loopback: a Python
http.server that answers the tree API and the resolve URLs with the hub's headers
(X-Repo-Commit, X-Linked-Etag, X-Linked-Size) and a redirect to a /blob URL on another
host name (localhost), which honours Range. Checked:
  - an exact file, a :QUANT (case-insensitive), the default choice (Q4_K_M), a missing
    quant (an error listing the files), a split model (every part fetched; serve refuses it);
  - the hub cache layout: blobs/SHA256, snapshots/COMMIT/FILE -> ../../blobs/SHA256,
    refs/main;
  - a connection cut half way: the retry asks for the rest with Range and the file is
    whole; cut on every try: the .incomplete file is kept and a later pull resumes it;
  - a wrong checksum: refused, nothing left in the cache;
  - HF_HUB_OFFLINE with the cache (no request made) and without (an error naming it);
  - a private repository without, with a wrong and with the right HF_TOKEN, and the token
    never sent to the storage host;
  - hostile answers: listed paths with '..' or '/' never used, a bad ETag, a redirect
    loop, an oversized header; hf:// references with '..' refused;
  - `list` (table and --json) and `rm` of a file and of a repository;
  - `serve --model hf://ORG/REPO:QUANT` then a completion.
Last line:
    hf_hub: N passed, N failed, N skipped"""
import hashlib
import json
import os
import shutil
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from common import DEMO_MODEL, Server, Suite, binary, http_json, run

s = Suite("hf_hub")
_case = s.case
s.case = lambda name, ok, detail="": _case(name, ok, "" if ok else detail)  # details of failures
MODEL = open(DEMO_MODEL, "rb").read()
TOKEN = "hf_secret_test_token"


def commit_of(name):
    return hashlib.sha1(name.encode()).hexdigest()


class Hub:
    """The stand-in's state: repositories, their files and modes, and a request log."""

    def __init__(self):
        self.repos = {}
        self.log = []          # (method, path, headers)
        self.cut = {}          # sha -> how many more GETs to cut half way
        self.corrupt = set()   # shas served with one byte changed
        self.lock = threading.Lock()

    def add(self, repo, files, private=False, pages=1, extra_listing=()):
        self.repos[repo] = {"files": dict(files), "private": private, "commit": commit_of(repo),
                            "pages": pages, "extra": list(extra_listing)}

    def blob(self, sha):
        for r in self.repos.values():
            for data in r["files"].values():
                if isinstance(data, bytes) and hashlib.sha256(data).hexdigest() == sha:
                    return data
        return None

    def requests(self, prefix):
        with self.lock:
            return [e for e in self.log if e[1].startswith(prefix)]


HUB = Hub()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def authorised(self, repo):
        if not repo["private"]:
            return True
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            self.send(401, b'{"error":"Invalid username or password."}',
                      [("X-Error-Code", "RepoNotFound")])
            return False
        return True

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        u = urlsplit(self.path)
        path = unquote(u.path)
        with HUB.lock:
            HUB.log.append((self.command, path, dict(self.headers)))
        parts = path.strip("/").split("/")
        if path.startswith("/api/models/"):
            repo_id = "/".join(parts[2:4])
            repo = HUB.repos.get(repo_id)
            if repo is None:
                return self.send(401, b"{}", [("X-Error-Code", "RepoNotFound")])
            if not self.authorised(repo):
                return
            items = list(repo["extra"])
            for p, data in sorted(repo["files"].items()):
                if isinstance(data, bytes):
                    items.append({"type": "file", "path": p, "size": len(data),
                                  "oid": hashlib.sha1(data).hexdigest(),
                                  "lfs": {"oid": hashlib.sha256(data).hexdigest(),
                                          "size": len(data)}})
            items.append({"type": "directory", "path": "sub", "oid": "0" * 40, "size": 0})
            page = int((u.query.split("cursor=")[1]) if "cursor=" in u.query else 0)
            per = (len(items) + repo["pages"] - 1) // repo["pages"]
            chunk = items[page * per:(page + 1) * per]
            hdrs = [("Content-Type", "application/json")]
            if page + 1 < repo["pages"]:
                hdrs.append(("Link", f'<http://127.0.0.1:{PORT}{u.path}?recursive=true&'
                                     f'cursor={page + 1}>; rel="next"'))
            return self.send(200, json.dumps(chunk).encode(), hdrs)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = "/".join(parts[:2])
            repo = HUB.repos.get(repo_id)
            if repo is None:
                return self.send(401, b"{}", [("X-Error-Code", "RepoNotFound")])
            if not self.authorised(repo):
                return
            fname = "/".join(parts[4:])
            data = repo["files"].get(fname)
            if data is None:
                return self.send(404, b"{}", [("X-Error-Code", "EntryNotFound")])
            if data == "loop":
                return self.send(302, b"", [("X-Repo-Commit", repo["commit"]),
                                            ("X-Linked-Etag", '"' + "0" * 64 + '"'),
                                            ("X-Linked-Size", "10"),
                                            ("Location", f"http://127.0.0.1:{PORT}/loop")])
            if data == "badetag":
                return self.send(302, b"", [("X-Repo-Commit", repo["commit"]),
                                            ("X-Linked-Etag", '"../../../etc/passwd"'),
                                            ("X-Linked-Size", "10"), ("Location", "/blob/x")])
            if data == "bighdr":
                return self.send(302, b"", [("X-Repo-Commit", "a" * 5000)])
            sha = hashlib.sha256(data).hexdigest()
            return self.send(302, b"", [
                ("X-Repo-Commit", repo["commit"]), ("X-Linked-Etag", f'"{sha}"'),
                ("X-Linked-Size", str(len(data))), ("ETag", '"deadbeef"'),
                ("Location", f"http://localhost:{PORT}/blob/{sha}")])
        if path == "/loop":
            return self.send(302, b"", [("Location", f"http://127.0.0.1:{PORT}/loop")])
        if parts[0] == "blob" and len(parts) == 2:
            data = HUB.blob(parts[1])
            if data is None:
                return self.send(404)
            if parts[1] in HUB.corrupt:
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            start = 0
            rng = self.headers.get("Range")
            code = 200
            hdrs = []
            if rng and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
                code = 206
                hdrs.append(("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}"))
            body = data[start:]
            with HUB.lock:
                cut = HUB.cut.get(parts[1], 0) > 0
                if cut:
                    HUB.cut[parts[1]] -= 1
            if cut:
                self.send_response(code)
                for k, v in hdrs:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            return self.send(code, body, hdrs)
        self.send(404)


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
PORT = srv.server_address[1]
threading.Thread(target=srv.serve_forever, daemon=True).start()
ENDPOINT = f"http://127.0.0.1:{PORT}"

# Files: distinct bytes per name (the demo model plus a tag), so each has its own sha256.
def variant(tag):
    return MODEL + tag.encode()


Q4 = variant("q4")
Q8 = variant("q8")
HUB.add("org/tiny", {"tiny-Q2_K.gguf": variant("q2"), "tiny-Q4_K_M.gguf": Q4,
                     "tiny-Q8_0.gguf": Q8, "mmproj-tiny-Q8_0.gguf": variant("mm"),
                     "README.md": b"hello"}, pages=2)
HUB.add("org/exact", {"models/stories260K.gguf": MODEL})
HUB.add("org/split", {"big-Q4_K_M-00001-of-00002.gguf": variant("s1"),
                      "big-Q4_K_M-00002-of-00002.gguf": variant("s2")})
HUB.add("org/cut", {"cut-Q8_0.gguf": variant("cut")})
HUB.add("org/cutall", {"c-Q8_0.gguf": variant("cutall")})
HUB.add("org/bad", {"bad-Q8_0.gguf": variant("bad")})
HUB.add("org/private", {"p-Q4_K_M.gguf": variant("priv")}, private=True)
HUB.add("org/hostile", {"h-Q4_K_M.gguf": variant("h"), "etag.gguf": "badetag",
                        "loop.gguf": "loop", "big.gguf": "bighdr"},
        extra_listing=[{"type": "file", "path": "../../evil-Q4_K_M.gguf", "size": 1},
                       {"type": "file", "path": "/abs-Q4_K_M.gguf", "size": 1},
                       {"type": "file", "path": "a/./b-Q4_K_M.gguf", "size": 1}])

TMP = tempfile.mkdtemp(prefix="sampan-hf-")
HOME = os.path.join(TMP, "hf")


def env(**kw):
    e = {"HF_HOME": HOME, "HF_ENDPOINT": ENDPOINT, "HF_TOKEN": "", "HF_HUB_OFFLINE": "",
         "HF_HUB_CACHE": "", "SAMPAN_HF_RETRIES": "3"}
    e.update(kw)
    return e


def pull(ref, **kw):
    return run([binary(), "pull", ref], timeout=60, env=env(**kw))


def pull_on_tty(ref, cache):
    """sampan pull with stderr on a pseudo-terminal; returns (exit code, what it wrote there)."""
    import pty
    import subprocess
    master, slave = pty.openpty()
    p = subprocess.Popen([binary(), "pull", ref], stdout=subprocess.DEVNULL, stderr=slave,
                         env=dict(os.environ, **env(HF_HUB_CACHE=cache)))
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    return p.wait(60), b"".join(chunks).decode(errors="replace")


def repo_dir(repo):
    return os.path.join(HOME, "hub", "models--" + repo.replace("/", "--"))


def check_layout(name, repo, file, data, out):
    rd = repo_dir(repo)
    sha = hashlib.sha256(data).hexdigest()
    snap = os.path.join(rd, "snapshots", commit_of(repo), file)
    blob = os.path.join(rd, "blobs", sha)
    ok = (out.strip() == snap and os.path.islink(snap) and
          os.path.realpath(snap) == os.path.realpath(blob) and
          not os.path.isabs(os.readlink(snap)) and open(blob, "rb").read() == data and
          open(os.path.join(rd, "refs", "main")).read() == commit_of(repo))
    s.case(name, ok, f"out={out.strip()!r} link={os.readlink(snap) if os.path.islink(snap) else None}")


def cases():
    # -- exact file, quant, default, missing quant
    rc, out, err = pull("hf://org/exact/models/stories260K.gguf")
    s.case("exact file pulled", rc == 0, err[-400:])
    if rc == 0:
        check_layout("exact file: hub cache layout", "org/exact", "models/stories260K.gguf",
                     MODEL, out)
    rc, out, err = pull("hf://org/tiny:q8_0")
    s.case(":q8_0 (any case) pulled", rc == 0, err[-400:])
    if rc == 0:
        check_layout(":q8_0 picks tiny-Q8_0.gguf, not the mmproj", "org/tiny", "tiny-Q8_0.gguf",
                     Q8, out)
    s.case("the listing was read over two pages",
           len([e for e in HUB.requests("/api/models/org/tiny/tree/main")]) >= 2)
    rc, out, err = pull("hf://org/tiny")
    s.case("no quant: Q4_K_M", rc == 0 and out.strip().endswith("tiny-Q4_K_M.gguf"), out + err[-300:])
    rc, out, err = pull("hf://org/tiny:Q5_K_S")
    s.case("a missing quant is an error listing the files",
           rc == 1 and "Q5_K_S" in err and "tiny-Q8_0.gguf" in err, err[-300:])
    rc, out, err = pull("hf://org/nothere:Q4_K_M")
    s.case("an unknown repository is an error", rc == 1 and "org/nothere" in err, err[-300:])
    rc, out, err = pull("hf://org/exact/missing.gguf")
    s.case("an unknown file is an error (404)", rc == 1 and "404" in err, err[-300:])

    # -- HF_HUB_CACHE, and the progress bar on a terminal (stderr a pty)
    other = os.path.join(TMP, "othercache")
    rc, out, err = pull("hf://org/tiny:Q2_K", HF_HUB_CACHE=other)
    s.case("HF_HUB_CACHE places the cache",
           rc == 0 and out.strip().startswith(other + "/models--org--tiny/snapshots/"), err[-300:])
    rc, tty_err = pull_on_tty("hf://org/tiny:Q2_K", os.path.join(TMP, "ttycache"))
    s.case("a progress bar on a terminal (bytes, rate, ETA)",
           rc == 0 and "\r" in tty_err and "100%" in tty_err and "MiB" in tty_err and
           "/s" in tty_err and "ETA" in tty_err, repr(tty_err[-300:]))

    # -- split model
    rc, out, err = pull("hf://org/split:Q4_K_M")
    rd = os.path.join(repo_dir("org/split"), "snapshots", commit_of("org/split"))
    s.case("split model: every part fetched",
           rc == 0 and out.strip().endswith("-00001-of-00002.gguf") and
           os.path.isfile(os.path.join(rd, "big-Q4_K_M-00002-of-00002.gguf")), err[-300:])

    # -- resume after a cut connection
    cut = variant("cut")
    HUB.cut[hashlib.sha256(cut).hexdigest()] = 1
    rc, out, err = pull("hf://org/cut:Q8_0")
    gets = [e for e in HUB.requests("/blob/" + hashlib.sha256(cut).hexdigest()) if e[0] == "GET"]
    ranges = [e[2].get("Range") for e in gets]
    s.case("a cut connection is resumed with Range",
           rc == 0 and len(gets) == 2 and ranges[0] is None and ranges[1] is not None and
           ranges[1] != "bytes=0-" and "hf_retry" in err, f"rc={rc} ranges={ranges} {err[-300:]}")
    if rc == 0:
        check_layout("the resumed file is whole", "org/cut", "cut-Q8_0.gguf", cut, out)

    ca = variant("cutall")
    sha = hashlib.sha256(ca).hexdigest()
    HUB.cut[sha] = 2
    rc, out, err = pull("hf://org/cutall:Q8_0", SAMPAN_HF_RETRIES="2")
    inc = os.path.join(repo_dir("org/cutall"), "blobs", sha + ".incomplete")
    kept = os.path.isfile(inc) and 0 < os.path.getsize(inc) < len(ca)
    s.case("cut on every try: an error, the .incomplete file kept",
           rc == 1 and kept and "pull again" in err, err[-300:])
    n0 = len(HUB.requests("/blob/" + sha))
    rc, out, err = pull("hf://org/cutall:Q8_0")
    later = HUB.requests("/blob/" + sha)[n0:]
    s.case("a later pull resumes the .incomplete file",
           rc == 0 and len(later) == 1 and (later[0][2].get("Range") or "").startswith("bytes=")
           and later[0][2]["Range"] != "bytes=0-" and not os.path.exists(inc), err[-300:])
    if rc == 0:
        check_layout("the file resumed by a later pull is whole", "org/cutall", "c-Q8_0.gguf",
                     ca, out)

    # -- wrong checksum
    bad = variant("bad")
    HUB.corrupt.add(hashlib.sha256(bad).hexdigest())
    rc, out, err = pull("hf://org/bad:Q8_0")
    blobs = os.path.join(repo_dir("org/bad"), "blobs")
    s.case("a wrong checksum is refused and deleted",
           rc == 1 and "checksum mismatch" in err and
           not [f for f in os.listdir(blobs) if not f.endswith(".lock")], err[-300:])

    # -- offline
    n0 = len(HUB.log)
    rc, out, err = pull("hf://org/tiny:Q8_0", HF_HUB_OFFLINE="1")
    s.case("offline: the cached file, no request",
           rc == 0 and out.strip().endswith("tiny-Q8_0.gguf") and len(HUB.log) == n0, err[-300:])
    rc, out, err = pull("hf://org/tiny:Q2_K", HF_HUB_OFFLINE="1")
    s.case("offline: a file not cached is an error naming it",
           rc == 1 and "HF_HUB_OFFLINE" in err and "Q2_K" in err and len(HUB.log) == n0,
           err[-300:])
    rc, out, err = pull("hf://org/tiny:Q8_0", HF_HUB_OFFLINE="1", HF_HOME=os.path.join(TMP, "empty"))
    s.case("offline without a cache: an error naming the repository",
           rc == 1 and "org/tiny" in err and "not in the cache" in err, err[-300:])

    # -- private repository
    rc, out, err = pull("hf://org/private:Q4_K_M")
    s.case("private without HF_TOKEN: 401, says to set it",
           rc == 1 and "401" in err and "gated or private" in err and "HF_TOKEN" in err, err[-300:])
    rc, out, err = pull("hf://org/private:Q4_K_M", HF_TOKEN="hf_wrong")
    s.case("private with a wrong HF_TOKEN: refused", rc == 1 and "refused" in err, err[-300:])
    rc, out, err = pull("hf://org/private:Q4_K_M", HF_TOKEN=TOKEN)
    s.case("private with HF_TOKEN: pulled", rc == 0, err[-300:])
    psha = hashlib.sha256(variant("priv")).hexdigest()
    leaked = [e for e in HUB.requests("/blob/" + psha) if "Authorization" in e[2]]
    authed = [e for e in HUB.requests("/org/private/resolve/") if "Authorization" in e[2]]
    s.case("the token goes to the hub, never to the storage host", authed and not leaked)
    os.makedirs(os.path.join(TMP, "tokhome"), exist_ok=True)
    shutil.copytree(os.path.join(HOME, "hub"), os.path.join(TMP, "tokhome", "hub"))
    with open(os.path.join(TMP, "tokhome", "token"), "w") as f:
        f.write(TOKEN + "\n")
    rc, out, err = pull("hf://org/private:Q4_K_M", HF_HOME=os.path.join(TMP, "tokhome"))
    s.case("the token from HF_HOME/token", rc == 0, err[-300:])

    # -- hostile answers
    rc, out, err = pull("hf://org/hostile:Q4_K_M")
    s.case("listed paths with '..', '/' or '.' are never used",
           rc == 0 and out.strip().endswith("/h-Q4_K_M.gguf") and
           not os.path.exists(os.path.join(HOME, "evil-Q4_K_M.gguf")) and
           not os.path.exists(os.path.join(HOME, "hub", "evil-Q4_K_M.gguf")), out + err[-300:])
    rc, out, err = pull("hf://org/hostile/etag.gguf")
    s.case("an ETag that is not hex is refused", rc == 1 and "X-Linked-Etag" in err, err[-300:])
    rc, out, err = pull("hf://org/hostile/big.gguf")
    s.case("an oversized header is refused", rc == 1 and "too long" in err, err[-300:])
    rc, out, err = pull("hf://org/hostile/loop.gguf", SAMPAN_HF_RETRIES="1")
    s.case("a redirect loop stops (at most 5 redirects)",
           rc == 1 and "redirect" in err.lower() and len(HUB.requests("/loop")) <= 6, err[-300:])
    for ref in ("hf://org/hostile/../x.gguf", "hf://org/hostile//x.gguf", "hf://../x/y",
                "hf://org", "hf://org/re po"):
        rc, out, err = pull(ref)
        s.case(f"bad reference {ref} refused (exit 2)", rc == 2, err[-200:])

    # -- list and rm
    rc, out, err = run([binary(), "list"], env=env())
    s.case("list: a table with repo, file, size, revision",
           rc == 0 and "org/tiny" in out and "tiny-Q8_0.gguf" in out and "MiB" in out and
           commit_of("org/tiny")[:12] + " main" in out, out[-600:] + err[-200:])
    rc, out, err = run([binary(), "list", "--json"], env=env())
    rows = json.loads(out) if rc == 0 else []
    q8 = [r for r in rows if r["repo"] == "org/tiny" and r["file"] == "tiny-Q8_0.gguf"]
    s.case("list --json", q8 and q8[0]["size"] == len(Q8) and q8[0]["ref"] == "main", out[:300])
    rc, out, err = run([binary(), "rm", "hf://org/tiny/tiny-Q8_0.gguf"], env=env())
    rd = repo_dir("org/tiny")
    s.case("rm a file: its link and blob are gone, the others stay",
           rc == 0 and not os.path.exists(os.path.join(rd, "blobs", hashlib.sha256(Q8).hexdigest()))
           and os.path.exists(os.path.join(rd, "blobs", hashlib.sha256(Q4).hexdigest())),
           out + err)
    rc, out, err = run([binary(), "list"], env=env())
    s.case("list after rm", rc == 0 and "tiny-Q8_0.gguf" not in out and "tiny-Q4_K_M.gguf" in out)
    rc, out, err = run([binary(), "rm", "hf://org/exact"], env=env())
    s.case("rm a repository", rc == 0 and not os.path.exists(repo_dir("org/exact")), out + err)
    rc, out, err = run([binary(), "rm", "hf://org/exact"], env=env())
    s.case("rm of what is not cached: exit 1", rc == 1 and "not in the cache" in err, err)

    # -- serve
    os.environ.update(env())
    try:
        srv_ = Server(model="hf://org/tiny:Q4_K_M", start_timeout=60)
        try:
            st, body = http_json(srv_.port, "POST", "/v1/completions",
                                 {"model": "tiny:Q4_K_M", "prompt": "Once upon a time",
                                  "max_tokens": 8, "temperature": 0})
            s.case("serve --model hf://org/tiny:Q4_K_M answers a completion",
                   st == 200 and body["choices"][0]["text"], str(body)[:300])
        finally:
            srv_.stop()
    except RuntimeError as e:
        s.case("serve --model hf://org/tiny:Q4_K_M answers a completion", False, str(e)[-500:])
    # a --config file naming an hf:// model, served offline from the cache
    cfg = os.path.join(TMP, "serve.json")
    with open(cfg, "w") as f:
        json.dump({"models": {"story": "hf://org/tiny:Q4_K_M"}}, f)
    os.environ["HF_HUB_OFFLINE"] = "1"
    n0 = len(HUB.log)
    try:
        srv_ = Server("--config", cfg, model=None, start_timeout=60)
        try:
            st, body = http_json(srv_.port, "POST", "/v1/completions",
                                 {"model": "story", "prompt": "Once upon a time",
                                  "max_tokens": 4, "temperature": 0})
            s.case("--config models: {name: hf://...} served offline from the cache",
                   st == 200 and len(HUB.log) == n0, str(body)[:300])
        finally:
            srv_.stop()
    except RuntimeError as e:
        s.case("--config models: {name: hf://...} served offline from the cache", False,
               str(e)[-500:])
    os.environ["HF_HUB_OFFLINE"] = ""
    rc, out, err = run([binary(), "serve", "--model", "hf://org/split:Q4_K_M", "--port", "0"],
                       timeout=60, env=env())
    s.case("serve refuses a split model clearly", rc != 0 and "split in 2 files" in err, err[-300:])


if binary() is None:
    s.skip("all", "build/sampan not built")
else:
    try:
        s.guard("cases", cases)
    finally:
        srv.shutdown()
        shutil.rmtree(TMP, ignore_errors=True)
s.finish()
