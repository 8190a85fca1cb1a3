"""test_model_file_faults.py - a served model file changed under `sampan serve` (a copy of the
demo model in a temporary repository, 127.0.0.1, free port):
  - truncated while served, with the default private copy: the server stays up and every answer
    is the one from before; with --model-copy-max 0 (the file mapped and guarded): the server
    stays up, every answer is the one from before or a clear 5xx, and restoring the file brings
    it back;
  - overwritten in place with different weights of the same size: no answer is ever neither the
    old weights' nor the new ones', the new ones' appear only after a logged reload, and they do
    appear (both modes);
  - a --model model (not from a repository) truncated: served on from its copy;
  - an encrypted model replaced on disk (renamed over): loaded again, in mode none.
Every loop is bounded in count and time. Last line:
    model_file_faults: N passed, N failed, N skipped"""
import datetime
import json
import os
import shutil
import struct
import tempfile
import time

from common import DEMO_MODEL, RepoServer, Server, Suite, binary, http_json, run

s = Suite("model_file_faults")
exe = binary()
PROMPT = "Once upon a time"
DATA_OFFSET = 14400  # the demo model's tensor data (`sampan inspect`): all F32


def make_repo(tmp, name="repo"):
    repo = os.path.join(tmp, name)
    os.makedirs(os.path.join(repo, "stories", "1"))
    shutil.copy(DEMO_MODEL, os.path.join(repo, "stories", "1", "model.gguf"))
    with open(os.path.join(repo, "stories", "config.json"), "w") as f:
        f.write('{"name": "stories", "backend": "llm"}')
    return repo, os.path.join(repo, "stories", "1", "model.gguf")


def altered_bytes():
    """The demo model with other weights of the same size: every F32 of the tensor data
    negated except the norms' (negating keeps every value finite)."""
    raw = bytearray(open(DEMO_MODEL, "rb").read())
    n = (len(raw) - DATA_OFFSET) // 4
    vals = struct.unpack_from(f"<{n}f", raw, DATA_OFFSET)
    # Negate only the first 131072 bytes (token_embd.weight, at offset 0 of the data).
    k = 131072 // 4
    struct.pack_into(f"<{k}f", raw, DATA_OFFSET, *[-v for v in vals[:k]])
    return bytes(raw)


def complete(port, model="stories"):
    st, b = http_json(port, "POST", "/v1/completions",
                      {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0},
                      timeout=30)
    text = b["choices"][0]["text"] if st == 200 and isinstance(b, dict) else None
    return st, text, b


def answer_with(path):
    """The greedy answer of a fresh server on a copy of `path` (the expected one)."""
    tmp = tempfile.mkdtemp(prefix="sp-mff-ref-")
    try:
        p = os.path.join(tmp, "m.gguf")
        shutil.copy(path, p)
        srv = Server(model=f"stories={p}")
        try:
            return complete(srv.port)[1]
        finally:
            srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def overwrite(path, data):
    """Write data over the file in place (same inode, like `cp` over it without O_TRUNC)."""
    with open(path, "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_truncate(tmp, old, mode, extra):
    repo, path = make_repo(tmp, f"repo-trunc-{mode}")
    srv = RepoServer(repo, *extra)
    try:
        st, first, _ = complete(srv.port)
        s.case(f"{mode}: the model answers before", st == 200 and first == old, f"{st} {first!r}")
        emb_req = {"model": "stories", "input": PROMPT}
        st, e0 = http_json(srv.port, "POST", "/v1/embeddings", emb_req)
        s.case(f"{mode}: an embedding before", st == 200, str(e0)[:200])
        os.truncate(path, 100000)
        st, e1 = http_json(srv.port, "POST", "/v1/embeddings", emb_req)
        s.case(f"{mode}: truncated: the embedding is the one from before or a clear 5xx",
               (st == 200 and e1 == e0) or (st >= 500 and "changed on disk" in json.dumps(e1)),
               f"{st} {str(e1)[:200]}")
        results, messages = [], []
        end = time.time() + 4
        for _ in range(40):
            if time.time() > end:
                break
            st, text, body = complete(srv.port)
            results.append((st, text))
            if st >= 500 and isinstance(body, dict):
                messages.append(body.get("error", {}).get("message", ""))
            time.sleep(0.1)
        alive = srv.p.poll() is None
        s.case(f"{mode}: truncated under the server: the server stays up", alive,
               f"rc={srv.p.returncode}")
        bad = [r for r in results if not ((r[0] == 200 and r[1] == old) or r[0] >= 500)]
        if mode == "copy":
            s.case("copy: truncated: every answer is the one from before (the private copy)",
                   results and all(r == (200, old) for r in results), str(results[:4]))
        else:
            s.case("mapped: truncated: every answer is the one from before or a clear 5xx",
                   results and not bad, str(bad[:3]))
            s.case("mapped: truncated: the 5xx answers say the model file changed",
                   all("model file changed on disk" in m for m in messages) and
                   len(messages) == len([r for r in results if r[0] >= 500]), str(messages[:2]))
        s.case(f"{mode}: the change is detected and logged",
               srv.wait_log(r"event=model_file_changed model=stories", 3) is not None)
        s.case(f"{mode}: the failed reload is logged",
               srv.wait_log(r"event=model_reload_failed model=stories", 3) is not None)
        st, ix = srv.req("POST", "/v2/repository/index")
        if mode == "copy":
            e = [x for x in ix if x.get("name") == "stories"] if st == 200 else []
            s.case("copy: truncated: the index still says READY", e and e[0]["state"] == "READY",
                   str(ix))
        else:
            e = [x for x in ix if x.get("name") == "stories"] if st == 200 else []
            s.case("mapped: truncated: the index says why it does not serve, without the "
                   "repository's path",
                   e and e[0]["state"] == "UNAVAILABLE" and "changed on disk" in e[0]["reason"]
                   and tmp not in e[0]["reason"], str(ix)[:300])
        # The file restored: it loads again and answers as before.
        shutil.copy(DEMO_MODEL, path + ".new")
        os.replace(path + ".new", path)
        got = None
        for _ in range(60):
            st, got, _ = complete(srv.port)
            if st == 200 and got == old:
                break
            time.sleep(0.1)
        s.case(f"{mode}: the file restored: answers as before", got == old, repr(got))
        s.case(f"{mode}: still up at the end", srv.p.poll() is None)
    finally:
        s.case(f"{mode} truncate: clean exit", srv.stop() == 0)


def test_overwrite(tmp, old, new, mode, extra):
    repo, path = make_repo(tmp, f"repo-over-{mode}")
    srv = RepoServer(repo, *extra)
    try:
        st, first, _ = complete(srv.port)
        s.case(f"{mode}: overwrite: the model answers before", st == 200 and first == old)
        overwrite(path, altered_bytes())
        seen, first_new = [], None
        end = time.time() + 6
        for _ in range(80):
            if time.time() > end:
                break
            st, text, _ = complete(srv.port)
            seen.append((st, text))
            if text == new and first_new is None:
                first_new = time.time()
            if st == 200 and text == new and len([x for x in seen if x[1] == new]) >= 3:
                break
            time.sleep(0.05)
        reloaded = srv.wait_log(r"event=model_reloaded model=stories", 2) is not None
        strange = [x for x in seen if x[0] == 200 and x[1] not in (old, new)]
        errors = [x for x in seen if x[0] != 200]
        s.case(f"{mode}: overwritten same size: no answer from weights that are neither",
               not strange, str(strange[:3]))
        if mode == "copy":
            s.case("copy: overwritten: no error while the copy serves", not errors, str(errors[:3]))
        else:
            s.case("mapped: overwritten: errors, if any, are 5xx",
                   all(x[0] >= 500 for x in errors), str(errors[:3]))
        s.case(f"{mode}: overwritten: a reload is logged", reloaded)
        s.case(f"{mode}: overwritten: the new weights serve after it",
               seen and seen[-1] == (200, new), str(seen[-3:]))
        # The new weights answer only once the reload is done (its log line's time).
        m = srv.wait_log(r"ts=(\S+) level=info event=model_reloaded model=stories", 1)
        t_reload = None
        if m:
            t_reload = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                tzinfo=datetime.timezone.utc).timestamp()
        s.case(f"{mode}: overwritten: the new weights answer only after the reload",
               t_reload is not None and first_new is not None and first_new >= t_reload - 0.005,
               f"reload at {t_reload}, first new answer at {first_new}")
    finally:
        s.case(f"{mode} overwrite: clean exit", srv.stop() == 0)


def test_pinned_truncate(tmp, old):
    p = os.path.join(tmp, "pinned.gguf")
    shutil.copy(DEMO_MODEL, p)
    srv = Server(model=f"stories={p}")
    try:
        os.truncate(p, 50000)
        results = [complete(srv.port)[:2] for _ in range(5)]
        time.sleep(1.5)
        results += [complete(srv.port)[:2] for _ in range(3)]
        s.case("--model: truncated: served on from its copy",
               all(r == (200, old) for r in results) and srv.p.poll() is None, str(results[:3]))
        s.case("--model: truncated: the failed reload is logged",
               srv.wait_log(r"event=model_reload_failed model=stories", 3) is not None)
    finally:
        s.case("--model truncate: clean exit", srv.stop() == 0)


def test_encrypted_replaced(tmp, old, new):
    """An encrypted model (decrypted into memory at load) replaced on disk by another file: the
    server notices and loads the new one (mode none: no rescan would)."""
    key = os.path.join(tmp, "k.key")
    if not os.path.exists(key):
        run([exe, "encrypt", "--gen-key", key])
    enc_old, enc_new = os.path.join(tmp, "old.enc"), os.path.join(tmp, "new.enc")
    alt = os.path.join(tmp, "alt.gguf")
    for src, dst in ((DEMO_MODEL, enc_old), (alt, enc_new)):
        rc, _, err = run([exe, "encrypt", src, dst, "--key-file", key])
        if rc:
            s.case("encrypted: files made", False, err)
            return
    repo = os.path.join(tmp, "repo-enc")
    os.makedirs(os.path.join(repo, "stories", "1"))
    path = os.path.join(repo, "stories", "1", "model.gguf.enc")
    shutil.copy(enc_old, path)
    with open(os.path.join(repo, "stories", "config.json"), "w") as f:
        f.write('{"name": "stories", "backend": "llm", "parameters": {"encryption_key_file": '
                '{"string_value": "%s"}}}' % key)
    srv = RepoServer(repo)
    try:
        st, first, _ = complete(srv.port)
        s.case("encrypted: answers before", st == 200 and first == old, f"{st} {first!r}")
        shutil.copy(enc_new, path + ".tmp")
        os.replace(path + ".tmp", path)
        got, other = None, []
        for _ in range(60):
            st, got, _ = complete(srv.port)
            if got == new:
                break
            if (st, got) != (200, old):
                other.append((st, got))
            time.sleep(0.1)
        s.case("encrypted: until the reload, the old weights answer", not other, str(other[:3]))
        s.case("encrypted: replaced on disk: the new file is loaded", got == new, repr(got))
        s.case("encrypted: the reload is logged",
               srv.wait_log(r"event=model_reloaded model=stories", 2) is not None)
    finally:
        s.case("encrypted: clean exit", srv.stop() == 0)


def main():
    if exe is None:
        s.skip("all", "build/sampan not built")
        s.finish()
    tmp = tempfile.mkdtemp(prefix="sp-mff-")
    try:
        alt = os.path.join(tmp, "alt.gguf")
        with open(alt, "wb") as f:
            f.write(altered_bytes())
        s.case("the altered model is the same size",
               os.path.getsize(alt) == os.path.getsize(DEMO_MODEL))
        old = answer_with(DEMO_MODEL)
        new = answer_with(alt)
        s.case("the altered weights answer differently", old and new and old != new,
               f"{old!r} vs {new!r}")
        for mode, extra in (("copy", ()), ("mapped", ("--model-copy-max", "0"))):
            s.guard(f"{mode} truncate", test_truncate, tmp, old, mode, extra)
            s.guard(f"{mode} overwrite", test_overwrite, tmp, old, new, mode, extra)
        s.guard("--model truncate", test_pinned_truncate, tmp, old)
        s.guard("encrypted replaced", test_encrypted_replaced, tmp, old, new)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
