"""test_repository.py - `sampan serve --model-repository DIR` as a black box on 127.0.0.1 (free
port): a temporary repository with the demo model as stories/1/model.gguf, a corrupt model
beside it and a bad config.json; /v2/repository/index (READY and UNAVAILABLE with reasons);
completions, /v1/models and KServe routes on the repository model; control mode explicit
(load, unload while a stream is in flight, reload, load errors); path traversal in the load
URL and a model directory symlinked out of the repository refused. Last line:
    repository: N passed, N failed, N skipped"""
import http.client
import json
import os
import shutil
import tempfile
import threading
import time

from common import ROOT, RepoServer, Suite, binary, run

s = Suite("repository")
exe = binary()
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")


def make_repo(tmp):
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "stories", "1"))
    # A copy, not a symlink: a link out of the repository is refused by design.
    shutil.copy(DEMO, os.path.join(repo, "stories", "1", "model.gguf"))
    with open(os.path.join(repo, "stories", "config.json"), "w") as f:
        json.dump({"name": "stories", "backend": "llm"}, f)
    os.makedirs(os.path.join(repo, "broken", "1"))
    with open(os.path.join(repo, "broken", "config.json"), "w") as f:
        json.dump({"name": "broken", "backend": "llm"}, f)
    with open(os.path.join(repo, "broken", "1", "model.gguf"), "wb") as f:
        f.write(b"NOTAGGUF" * 64)
    os.makedirs(os.path.join(repo, "badcfg", "1"))
    with open(os.path.join(repo, "badcfg", "config.json"), "w") as f:
        json.dump({"name": "badcfg", "backend": "llm", "bogus_field": 1}, f)
    # A model directory outside the repository, linked in.
    outside = os.path.join(tmp, "outside")
    os.makedirs(os.path.join(outside, "1"))
    shutil.copy(DEMO, os.path.join(outside, "1", "model.gguf"))
    with open(os.path.join(outside, "config.json"), "w") as f:
        json.dump({"name": "escape", "backend": "llm"}, f)
    os.symlink(outside, os.path.join(repo, "escape"))
    return repo


def index(srv, body=None):
    st, b = srv.req("POST", "/v2/repository/index", body)
    return st, {(e["name"], e.get("version")): e for e in b} if st == 200 else b


def complete(srv, model="stories"):
    return srv.req("POST", "/v1/completions",
                   {"model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})


def test_none_mode(repo):
    srv = RepoServer(repo)
    try:
        st, ix = index(srv)
        s.case("index 200", st == 200, str(st))
        e = ix.get(("stories", "1"), {})
        s.case("index: stories v1 READY", e.get("state") == "READY" and e.get("reason") == "", str(e))
        e = ix.get(("broken", "1"), {})
        s.case("index: corrupt model UNAVAILABLE with reason",
               e.get("state") == "UNAVAILABLE" and "GGUF" in e.get("reason", ""), str(e))
        e = ix.get(("badcfg", None), {})
        s.case("index: bad config UNAVAILABLE naming the field",
               e.get("state") == "UNAVAILABLE" and "bogus_field" in e.get("reason", ""), str(e))
        e = ix.get(("escape", None)) or ix.get(("escape", "1")) or {}
        s.case("index: model linked out of the repository UNAVAILABLE",
               e.get("state", "UNAVAILABLE") == "UNAVAILABLE", str(e))
        st, ixr = index(srv, {"ready": True})
        s.case("index ready=true lists only READY", st == 200 and list(ixr) == [("stories", "1")],
               str(list(ixr)))
        st, b = complete(srv)
        s.case("completion on the repository model", st == 200 and b["model"] == "stories"
               and len(b["choices"][0]["text"]) > 0, str(b)[:200])
        st, b = srv.req("GET", "/v1/models")
        ids = [m["id"] for m in b["data"]] if st == 200 else []
        s.case("/v1/models lists the ready model only", ids == ["stories"], str(ids))
        st, b = complete(srv, "broken")
        s.case("completion on the broken model 404", st == 404, str(st))
        st, b = srv.req("GET", "/v2/models/stories/versions/1")
        s.case("KServe metadata of version 1", st == 200 and b.get("versions") == ["1"], str(b)[:200])
        st, _ = srv.req("GET", "/v2/models/stories/versions/2")
        s.case("KServe unknown version 404", st == 404, str(st))
        st, b = srv.req("POST", "/v2/repository/models/stories/unload")
        s.case("unload refused in mode none", st == 400 and "explicit" in b.get("error", ""), str(b))
    finally:
        s.case("none mode: clean exit", srv.stop() == 0)


def test_explicit_mode(repo):
    srv = RepoServer(repo, "--model-control-mode", "explicit")
    try:
        st, ix = index(srv)
        e = ix.get(("stories", "1"), {}) if st == 200 else {}
        s.case("explicit: nothing loaded at start",
               e.get("state") == "UNAVAILABLE" and e.get("reason") == "not loaded", str(e))
        st, _ = complete(srv)
        s.case("explicit: completion before load 404", st == 404, str(st))
        st, b = srv.req("POST", "/v2/repository/models/stories/load")
        s.case("explicit: load 200", st == 200, str(b))
        st, b = complete(srv)
        s.case("explicit: completion after load", st == 200, str(b)[:200])
        st, ix = index(srv)
        s.case("explicit: index READY after load", ix.get(("stories", "1"), {}).get("state") == "READY")

        # Unload while a stream is in flight: the stream finishes, new requests get 404.
        result = {}

        def stream():
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
            try:
                c.request("POST", "/v1/completions", body=json.dumps(
                    {"model": "stories", "prompt": "Once", "max_tokens": 200, "stream": True,
                     "ignore_eos": True}), headers={"Content-Type": "application/json"})
                r = c.getresponse()
                result["status"] = r.status
                result["body"] = r.read().decode(errors="replace")
            except Exception as ex:  # noqa: BLE001 - reported as a failed case
                result["error"] = repr(ex)
            finally:
                c.close()

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(0.05)
        st, b = srv.req("POST", "/v2/repository/models/stories/unload")
        s.case("explicit: unload 200", st == 200, str(b))
        st2, _ = complete(srv)
        t.join(20)
        s.case("explicit: in-flight stream finished after unload",
               result.get("status") == 200 and "[DONE]" in result.get("body", ""),
               str(result)[:200])
        s.case("explicit: completion after unload 404", st2 == 404, str(st2))
        st, ix = index(srv)
        e = ix.get(("stories", "1"), {})
        s.case("explicit: index UNAVAILABLE unloaded",
               e.get("state") == "UNAVAILABLE" and e.get("reason") == "unloaded", str(e))
        st, b = srv.req("POST", "/v2/repository/models/stories/load")
        st2, b2 = complete(srv)
        s.case("explicit: reload serves again", st == 200 and st2 == 200, f"{b} {str(b2)[:100]}")

        st, b = srv.req("POST", "/v2/repository/models/broken/load")
        s.case("explicit: load of a corrupt model 400 with reason",
               st == 400 and "GGUF" in b.get("error", ""), str(b))
        st, b = srv.req("POST", "/v2/repository/models/badcfg/load")
        s.case("explicit: load with a bad config 400 naming the field",
               st == 400 and "bogus_field" in b.get("error", ""), str(b))
        st, b = srv.req("POST", "/v2/repository/models/nosuch/load")
        s.case("explicit: load of an unknown model 404", st == 404, str(b))
        st, b = srv.req("POST", "/v2/repository/models/escape/load")
        st2, _ = complete(srv, "escape")
        s.case("explicit: model linked out of the repository refused",
               st in (400, 404) and st2 == 404, f"{st} {b} {st2}")
        for path in ("/v2/repository/models/../load", "/v2/repository/models/%2e%2e/load",
                     "/v2/repository/models/..%2fstories/load",
                     "/v2/repository/models/%2fetc/load"):
            st, b = srv.req("POST", path)
            s.case(f"explicit: traversal {path} refused", st in (400, 404), f"{st} {b}")
        st, b = srv.req("POST", "/v2/repository/models/stories/load",
                        {"parameters": {"config": 7}})
        s.case("explicit: non-string config override 400", st == 400, str(b))
        st, b = srv.req("POST", "/v2/repository/models/nosuch/unload")
        s.case("explicit: unload of an unknown model 404", st == 404, str(b))
    finally:
        s.case("explicit mode: clean exit", srv.stop() == 0)


def two_model_repo(tmp, name):
    repo = os.path.join(tmp, name)
    for m in ("alpha", "beta"):
        os.makedirs(os.path.join(repo, m, "1"))
        shutil.copy(DEMO, os.path.join(repo, m, "1", "model.gguf"))
        with open(os.path.join(repo, m, "config.json"), "w") as f:
            json.dump({"name": m, "backend": "llm"}, f)
    return repo


def test_poll_eviction(tmp):
    """Two models and a budget for one: poll mode must not reload the evicted one on every
    rescan (each load evicting the other, forever); it loads again when a request wants it."""
    repo = two_model_repo(tmp, "evict")
    srv = RepoServer(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.1",
                     "--memory-budget", "10M")
    try:
        s.case("poll+budget: one model evicted at start",
               srv.wait_log(r"event=model_evicted", 3) is not None, srv.text()[-300:])
        time.sleep(1.5)  # about 15 rescans
        n0 = srv.text().count("event=model_evicted")
        s.case("poll+budget: no load/evict loop across rescans", n0 == 1, f"{n0} evictions")
        st, ix = index(srv)
        states = sorted(e["state"] for e in ix.values()) if st == 200 else []
        s.case("poll+budget: one READY, the evicted one UNAVAILABLE until asked for",
               states == ["READY", "UNAVAILABLE"], str(ix))
        evicted = [k[0] for k, e in ix.items() if e["state"] == "UNAVAILABLE"] if st == 200 else []
        st, b = complete(srv, evicted[0] if evicted else "alpha")
        s.case("poll+budget: a request loads the evicted model on demand", st == 200, str(b)[:200])
        time.sleep(1.0)
        n1 = srv.text().count("event=model_evicted")
        s.case("poll+budget: after that demand, one more eviction and then none", n1 == 2,
               f"{n1} evictions")
    finally:
        s.case("poll+budget: clean exit", srv.stop() == 0)


def test_poll_second_file(tmp):
    """A second *.gguf beside a served version: the loaded model keeps serving (the directory is
    ambiguous now, which the index says); removing it leaves the model as it was."""
    repo = two_model_repo(tmp, "second")
    srv = RepoServer(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.1")
    try:
        st, b = complete(srv, "alpha")
        s.case("poll: alpha serves", st == 200, str(b)[:200])
        loads = srv.text().count("event=model_ready model=alpha")
        shutil.copy(DEMO, os.path.join(repo, "alpha", "1", "extra.gguf"))
        time.sleep(0.8)
        st, b = complete(srv, "alpha")
        s.case("poll: a second .gguf beside it: still serves", st == 200, str(b)[:200])
        st, ix = index(srv)
        e = ix.get(("alpha", "1"), {}) if st == 200 else {}
        s.case("poll: the index says READY and why the directory cannot load again",
               e.get("state") == "READY" and "more than one" in e.get("reason", "")
               and tmp not in e.get("reason", ""), str(e))
        os.remove(os.path.join(repo, "alpha", "1", "extra.gguf"))
        time.sleep(0.8)
        st, b = complete(srv, "alpha")
        st2, ix = index(srv)
        e = ix.get(("alpha", "1"), {}) if st2 == 200 else {}
        s.case("poll: the extra file removed: serves, reason cleared, not reloaded",
               st == 200 and e.get("state") == "READY" and e.get("reason") == ""
               and srv.text().count("event=model_ready model=alpha") == loads, str(e))
        n = srv.text().count("event=model_ready model=beta")
        s.case("poll: the untouched model was never reloaded", n == 1, f"{n} loads")
    finally:
        s.case("poll second file: clean exit", srv.stop() == 0)


def test_load_key_file(tmp):
    """A load request's encryption_key_file names a key in --key-dir only; errors never tell a
    file's size or contents, nor the server's paths."""
    key = os.path.join(tmp, "k.key")
    rc, _, err = run([exe, "encrypt", "--gen-key", key])
    enc = os.path.join(tmp, "m.gguf.enc")
    rc2, _, err2 = run([exe, "encrypt", DEMO, enc, "--key-file", key])
    if rc or rc2:
        s.case("keys: encrypted model made", False, err + err2)
        return
    repo = os.path.join(tmp, "keyrepo")
    os.makedirs(os.path.join(repo, "sealed", "1"))
    shutil.copy(enc, os.path.join(repo, "sealed", "1", "model.gguf.enc"))
    with open(os.path.join(repo, "sealed", "config.json"), "w") as f:
        json.dump({"name": "sealed", "backend": "llm"}, f)
    # The operator's config.json may name any key file; answers still show no server path.
    os.makedirs(os.path.join(repo, "sealed2", "1"))
    shutil.copy(enc, os.path.join(repo, "sealed2", "1", "model.gguf.enc"))
    with open(os.path.join(repo, "sealed2", "config.json"), "w") as f:
        json.dump({"name": "sealed2", "backend": "llm", "parameters": {
            "encryption_key_file": {"string_value": os.path.join(tmp, "secret.txt")}}}, f)
    kd = os.path.join(tmp, "keydir")
    os.makedirs(kd)
    shutil.copy(key, os.path.join(kd, "good.key"))
    secret = os.path.join(tmp, "secret.txt")
    with open(secret, "w") as f:
        f.write("S" * 1234)
    shutil.copy(secret, os.path.join(kd, "bad.key"))

    def load(srv, kf=None, env=None):
        p = {}
        if kf is not None:
            p["encryption_key_file"] = {"string_value": kf}
        if env is not None:
            p["encryption_key_env"] = {"string_value": env}
        return srv.req("POST", "/v2/repository/models/sealed/load",
                       {"parameters": {"config": json.dumps({"parameters": p})}})

    def clean(b):
        t = json.dumps(b)
        return "1234" not in t and tmp not in t and "SSSS" not in t

    srv = RepoServer(repo, "--model-control-mode", "explicit")
    try:
        for kf in ("/etc/shadow", secret, "../../secret.txt", "good.key"):
            st, b = load(srv, kf)
            s.case(f"keys: no --key-dir: a load naming {os.path.basename(kf)} refused, telling "
                   "neither size nor path", st == 400 and "key-dir" in json.dumps(b) and clean(b),
                   f"{st} {b}")
        st, b = srv.req("POST", "/v2/repository/models/sealed2/load")
        s.case("keys: config.json's absolute key file: the answer names it without its directory",
               st == 400 and clean(b) and ".../secret.txt" in json.dumps(b), f"{st} {b}")
        st, b = load(srv, env="HOME")
        s.case("keys: a load may not choose an environment variable", st == 400 and clean(b)
               and "may not choose an environment variable" in json.dumps(b), f"{st} {b}")
        st, b = srv.req("POST", "/v2/repository/models/sealed/load",
                        {"parameters": {"config": json.dumps(
                            {"parameters": {"chat_template_file": {"string_value": "../secret.txt"}}})}})
        s.case("a load may not name a chat_template_file (compile errors would quote it)",
               st == 400 and clean(b) and "may not name a file" in json.dumps(b), f"{st} {b}")
    finally:
        s.case("keys: clean exit (no --key-dir)", srv.stop() == 0)
    srv = RepoServer(repo, "--model-control-mode", "explicit", "--key-dir", kd)
    try:
        for kf in ("/etc/shadow", secret, "../secret.txt", "nosuch.key"):
            st, b = load(srv, kf)
            s.case(f"keys: --key-dir: {kf if not kf.startswith(tmp) else 'an absolute path'} "
                   "refused, telling neither size nor path", st == 400 and clean(b), f"{st} {b}")
        st, b = load(srv, "bad.key")
        s.case("keys: --key-dir: a file that is not a key: 400 without its size or path",
               st == 400 and clean(b) and "a key must be 64 hex" in json.dumps(b), f"{st} {b}")
        st, b = load(srv, "good.key")
        st2, b2 = complete(srv, "sealed")
        s.case("keys: --key-dir: the key named by a load request decrypts the model",
               st == 200 and st2 == 200, f"{st} {b} {st2} {str(b2)[:120]}")
        s.case("keys: the log keeps the full story (the key file's path)",
               os.path.join(kd, "bad.key") in srv.text() or "bad.key" in srv.text())
    finally:
        s.case("keys: clean exit (--key-dir)", srv.stop() == 0)


def main():
    if exe is None:
        s.skip("repository", "build/sampan not built")
        return
    rc, _, err = run([exe, "serve", "--model-repository", "/nonexistent", "--model-control-mode",
                      "sometimes", "--port", "0"], timeout=10)
    s.case("unknown control mode refused with a clear error",
           rc == 2 and "none, poll or explicit" in err, err.strip()[:200])
    rc, _, err = run([exe, "serve", "--model-repository", "/nonexistent/h13repo", "--port", "0"],
                     timeout=10)
    s.case("missing repository root: exit 1", rc == 1, f"{rc} {err.strip()[-200:]}")
    tmp = tempfile.mkdtemp(prefix="sampan-repo-")
    try:
        repo = make_repo(tmp)
        s.guard("none mode", test_none_mode, repo)
        s.guard("explicit mode", test_explicit_mode, repo)
        s.guard("poll eviction", test_poll_eviction, tmp)
        s.guard("poll second file", test_poll_second_file, tmp)
        s.guard("load key file", test_load_key_file, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
s.finish()
