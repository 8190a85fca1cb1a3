#!/usr/bin/env python3
"""test_s3_repository.py - `--model-repository s3://BUCKET/PREFIX` against an S3 stand-in on loopback.

tests/py/s3_standin.py answers ListObjectsV2 and GetObject and checks every request's SigV4
signature with its own implementation. Checked: a repository in the bucket loads and serves the
same greedy text as the model file served directly; listings are paged (continuation tokens);
poll mode sees a new version and a removed one; a restart downloads nothing that did not change
(the mirror's manifest); a wrong secret, a wrong checksum (ETag), a key that would leave the
repository and a store that fails a download each give a clear error naming what failed, and
the server neither crashes nor serves a half-synced model.
"""
import hashlib
import json
import os
import shutil
import tempfile
import time

from common import DEMO_MODEL, Server, Suite, binary, greedy, http_json
from s3_standin import S3Standin

s = Suite("s3-repository")


def until(fn, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    return None


def index(srv):
    st, body = http_json(srv.port, "POST", "/v2/repository/index", {})
    return {(e["name"], e.get("version", "")): e for e in body} if st == 200 else {}


def serve(tmp, *extra):
    return Server("--model-repository", "s3://models/repo", "--repository-cache", os.path.join(tmp, "cache"),
                  *extra, model=None, start_timeout=30)


def env_for(st, secret=None):
    os.environ.update({"AWS_ACCESS_KEY_ID": st.access_key, "AWS_SECRET_ACCESS_KEY": secret or st.secret,
                       "AWS_REGION": st.region, "AWS_ENDPOINT_URL": st.endpoint})


def failed_start(tmp, what):
    """A server whose start must fail: (exit status, None when it never listened; its log)."""
    try:
        srv = serve(tmp)
    except RuntimeError as e:
        return None, str(e)
    # it listened, then its start-up loads failed: it exits with status 1 by itself
    try:
        srv.p.wait(15)
    except Exception:
        pass
    return srv.stop(), srv.text()


if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()
    raise SystemExit(0)

demo = open(DEMO_MODEL, "rb").read()
tmp = tempfile.mkdtemp(prefix="sampan-s3-")
st = S3Standin(max_keys=2)
try:
    st.put("models", "repo/demo/config.json", b'{"backend": "llm"}\n')
    st.put("models", "repo/demo/1/model.gguf", demo)
    st.put("models", "repo/demo/", b"")         # a "folder" marker object: ignored
    st.put("models", "other/x/config.json", b"{}")  # outside the prefix: never fetched
    env_for(st)

    # --- the reference: the same file served directly
    ref = Server()
    rs, want = http_json(ref.port, "POST", "/v1/completions", greedy("Once upon a time", 16))
    ref.stop()

    srv = serve(tmp, "--model-control-mode", "poll", "--repository-poll-secs", "0.3")
    ix = index(srv)
    s.case("the bucket's repository loads: demo version 1 READY", ix.get(("demo", "1"), {}).get("state") == "READY",
           str(ix))
    rc, got = http_json(srv.port, "POST", "/v1/completions", dict(greedy("Once upon a time", 16), model="demo"))
    s.case("a completion from the S3 repository equals the file served directly",
           rc == 200 and rs == 200 and got["choices"][0]["text"] == want["choices"][0]["text"],
           f"{got} vs {want}")
    pages = [q for m, p, q in st.log if "list-type=2" in q]
    s.case("the listing is paged (continuation tokens, 2 keys a page)",
           any("continuation-token=" in q for q in pages), str(pages[:4]))
    s.case("objects outside the prefix are never fetched", not any(p.startswith("/models/other") for _, p, _ in st.log))

    # --- poll mode: a new version appears, a removed one goes
    st.put("models", "repo/demo/2/model.gguf", demo)
    ok = until(lambda: index(srv).get(("demo", "2"), {}).get("state") == "READY")
    s.case("poll: a version uploaded to the bucket is served", ok, str(index(srv)))
    st.delete("models", "repo/demo/1/model.gguf")
    ok = until(lambda: ("demo", "1") not in index(srv) or index(srv)[("demo", "1")].get("state") != "READY")
    s.case("poll: a version deleted from the bucket is unloaded", ok, str(index(srv)))
    gets_before = sum(1 for _, p, q in st.log if not q)

    # --- a store that fails a download: the sync fails, what is served keeps serving
    st.put("models", "repo/demo/3/model.gguf", demo)
    st.fail_get.add("repo/demo/3/model.gguf")
    m = srv.wait_log(r"event=repository_sync_failed.*repo/demo/3/model\.gguf.*InternalError", 10)
    rc, _ = http_json(srv.port, "POST", "/v1/completions", dict(greedy("Once", 4), model="demo"))
    s.case("a failed download is logged with the key and the store's error; serving goes on",
           m is not None and rc == 200 and ("demo", "3") not in index(srv), srv.text()[-600:])
    st.fail_get.clear()
    st.delete("models", "repo/demo/3/model.gguf")
    time.sleep(0.8)
    rc_stop = srv.stop()
    s.case("clean exit", rc_stop == 0, rc_stop)

    # --- a restart downloads nothing that did not change (the mirror's manifest)
    n_get = sum(1 for _, p, q in st.log if not q)
    srv = serve(tmp)
    ready = index(srv).get(("demo", "2"), {}).get("state") == "READY"
    srv.stop()
    s.case("restart: served from the mirror, no object downloaded again",
           ready and sum(1 for _, p, q in st.log if not q) == n_get and "event=s3_fetched" not in srv.text(),
           f"{n_get} -> {sum(1 for _, p, q in st.log if not q)}")

    # --- a wrong checksum (the ETag is not the bytes' MD5): refused, nothing half-written
    st.put("models", "repo/demo/4/model.gguf", demo)
    st.lie_etag.add("repo/demo/4/model.gguf")
    rc, log = failed_start(os.path.join(tmp, "fresh"), "etag")
    s.case("a checksum mismatch fails the start, naming the key and both digests",
           rc != 0 and "checksum mismatch" in log and "repo/demo/4/model.gguf" in log
           and hashlib.md5(demo).hexdigest() in log, log[-500:])
    leftovers = [f for d, _, fs in os.walk(os.path.join(tmp, "fresh")) for f in fs if f.endswith(".part")]
    s.case("no partial file is left behind", not leftovers, str(leftovers))
    st.lie_etag.clear()
    st.delete("models", "repo/demo/4/model.gguf")

    # --- a key that would leave the repository
    st.put("models", "repo/demo/../../escape.gguf", b"x")
    rc, log = failed_start(os.path.join(tmp, "esc"), "dotdot")
    s.case("a key with a '..' segment is refused by name", rc != 0 and "cannot be a path" in log
           and "escape.gguf" in log, log[-400:])
    s.case("nothing was written outside the mirror", not os.path.exists(os.path.join(tmp, "escape.gguf"))
           and not os.path.exists(os.path.join(tmp, "esc", "escape.gguf")))
    st.delete("models", "repo/demo/../../escape.gguf")

    # --- credentials
    env_for(st, secret="wrong-secret")
    rc, log = failed_start(os.path.join(tmp, "badkey"), "secret")
    s.case("a wrong secret: the start fails with the store's SignatureDoesNotMatch",
           rc != 0 and "SignatureDoesNotMatch" in log and "s3://models/repo/" in log, log[-400:])
    s.case("the secret never appears in the log", "wrong-secret" not in log)
    env_for(st)
    os.environ["AWS_ACCESS_KEY_ID"] = "AKIDOTHER"
    rc, log = failed_start(os.path.join(tmp, "badid"), "key id")
    s.case("an unknown key id: InvalidAccessKeyId", rc != 0 and "InvalidAccessKeyId" in log, log[-300:])
    env_for(st)
    st.buckets.pop("models")
    rc, log = failed_start(os.path.join(tmp, "gone"), "bucket")
    s.case("a missing bucket: NoSuchBucket", rc != 0 and "NoSuchBucket" in log, log[-300:])
finally:
    st.close()
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"):
        os.environ.pop(k, None)
    shutil.rmtree(tmp, ignore_errors=True)
s.finish()
