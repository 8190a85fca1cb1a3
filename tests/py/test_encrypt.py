"""test_encrypt.py - encrypted model files end to end: `sampan encrypt --gen-key`, `sampan
encrypt` of the demo model, `sampan decrypt --check`, `sampan run -m FILE.gguf.enc` with
SAMPAN_MODEL_KEY, `sampan serve --model NAME=FILE.gguf.enc` giving the same greedy completion
as the plain file, and a model repository whose config.json names the key (a key file outside
the repository, an environment variable) beside models with a wrong key, a flipped byte, a cut
file and no key, each UNAVAILABLE with its reason while the others serve. Last line:
    encrypt: N passed, N failed, N skipped"""
import json
import os
import shutil
import stat
import subprocess
import tempfile

from common import ROOT, Server, Suite, binary, http_json, run

s = Suite("encrypt")
exe = binary()
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")
PROMPT = "Once upon a time"
CHUNK = 64 << 10  # small chunks, so the demo model has 19 of them


def req(port, method, path, body=None):
    return http_json(port, method, path, body)


def complete(port, model):
    st, b = req(port, "POST", "/v1/completions",
                {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    return b["choices"][0]["text"] if st == 200 else f"HTTP {st}: {b}"


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_cli(tmp):
    key = os.path.join(tmp, "model.key")
    rc, _, err = run([exe, "encrypt", "--gen-key", key])
    s.case("gen-key writes a key", rc == 0 and os.path.getsize(key) == 65, err)
    s.case("gen-key: mode 0600", mode(key) == 0o600, oct(mode(key)))
    before = open(key).read()
    rc, _, err = run([exe, "encrypt", "--gen-key", key])
    s.case("gen-key never replaces a key", rc == 1 and "refusing to overwrite" in err
           and open(key).read() == before, err)

    enc = os.path.join(tmp, "demo.gguf.enc")
    rc, _, err = run([exe, "encrypt", DEMO, enc, "--key-file", key, "--chunk-size", "64K"])
    s.case("encrypt the demo model", rc == 0 and os.path.exists(enc), err)
    with open(enc, "rb") as f:
        head = f.read(8)
    s.case("output: SPENC1 magic, mode 0600, no temp file left",
           head == b"SPENC1\0\0" and mode(enc) == 0o600 and sorted(os.listdir(tmp)) ==
           ["demo.gguf.enc", "model.key"], f"{head!r} {oct(mode(enc))} {os.listdir(tmp)}")
    rc, _, err = run([exe, "encrypt", enc, os.path.join(tmp, "x.enc"), "--key-file", key])
    s.case("encrypt refuses an encrypted file", rc == 1 and "already encrypted" in err, err)
    notgguf = os.path.join(tmp, "notgguf.bin")
    with open(notgguf, "wb") as f:
        f.write(b"NOTAGGUF" * 100)
    rc, _, err = run([exe, "encrypt", notgguf, os.path.join(tmp, "y.enc"), "--key-file", key])
    s.case("encrypt refuses a broken GGUF", rc == 1 and "not a GGUF" in err
           and not os.path.exists(os.path.join(tmp, "y.enc")), err)
    os.unlink(notgguf)
    rc, _, err = run([exe, "encrypt", DEMO, os.path.join(tmp, "z.enc")])
    s.case("encrypt without a key: usage", rc == 2, err)

    rc, _, err = run([exe, "decrypt", enc, "--check", "--key-file", key])
    s.case("decrypt --check", rc == 0 and "ok, 1185600 bytes" in err, err)
    other = os.path.join(tmp, "other.key")
    run([exe, "encrypt", "--gen-key", other])
    rc, _, err = run([exe, "decrypt", enc, "--check", "--key-file", other])
    s.case("decrypt --check with another key: wrong key", rc == 1 and "wrong key" in err, err)
    back = os.path.join(tmp, "back.gguf")
    rc, _, err = run([exe, "decrypt", enc, back, "--key-file", key])
    s.case("decrypt writes the original bytes (mode 0600)",
           rc == 0 and open(back, "rb").read() == open(DEMO, "rb").read()
           and mode(back) == 0o600, err)
    os.unlink(back)

    hexkey = open(key).read().strip()
    args = [exe, "run", "-m", None, "-p", PROMPT, "-n", "32", "--temp", "0", "-t", "1"]
    rc0, plain_out, err0 = run(args[:3] + [DEMO] + args[4:])
    rc, enc_out, err = run(args[:3] + [enc] + args[4:], env={"SAMPAN_MODEL_KEY": hexkey})
    s.case("sampan run -m FILE.gguf.enc with SAMPAN_MODEL_KEY: same greedy text",
           rc0 == 0 and rc == 0 and enc_out == plain_out and len(enc_out) > 20,
           f"{enc_out!r} vs {plain_out!r} {err[-300:]}")
    env = dict(os.environ)
    env.pop("SAMPAN_MODEL_KEY", None)
    r = subprocess.run(args[:3] + [enc] + args[4:], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=60)
    s.case("sampan run without a key says how to give one",
           r.returncode == 1 and "is encrypted: set SAMPAN_MODEL_KEY" in r.stderr, r.stderr)
    return key, other, enc, hexkey


def test_serve_model(key, other, enc, hexkey):
    os.environ["SAMPAN_MODEL_KEY"] = hexkey
    try:
        srv = Server("--model", f"plain={DEMO}", model=f"demo={enc}")
    finally:
        del os.environ["SAMPAN_MODEL_KEY"]
    try:
        a, b = complete(srv.port, "plain"), complete(srv.port, "demo")
        s.case("serve --model demo=FILE.gguf.enc: same greedy completion as the plain file",
               a == b and len(a) > 10, f"{b!r} vs {a!r}")
    finally:
        s.case("serve --model: clean exit", srv.stop() == 0)
    # A wrong key on the command line is a start-up failure naming the cause.
    env = dict(os.environ, SAMPAN_MODEL_KEY=open(other).read().strip())
    r = subprocess.run([exe, "serve", "--model", f"demo={enc}", "--port", "0", "--threads", "1"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=30)
    s.case("serve --model with a wrong SAMPAN_MODEL_KEY fails to start with 'wrong key'",
           r.returncode != 0 and "wrong key" in r.stderr, r.stderr[-400:])


def test_repository(tmp, key, other, enc):
    repo = os.path.join(tmp, "repo")

    def model(name, params=None, src=enc, fname="model.gguf.enc"):
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(src, os.path.join(repo, name, "1", fname))
        cfg = {"name": name, "backend": "llm"}
        if params:
            cfg["parameters"] = {k: {"string_value": v} for k, v in params.items()}
        with open(os.path.join(repo, name, "config.json"), "w") as f:
            json.dump(cfg, f)
        return os.path.join(repo, name, "1", fname)

    model("plain", src=DEMO, fname="model.gguf")
    model("keyfile", {"encryption_key_file": key})          # absolute, outside the repository
    model("keyenv", {"encryption_key_env": "SP_TEST_ENC_KEY"})
    os.makedirs(os.path.join(repo, "relkey", "keys"))
    shutil.copy(key, os.path.join(repo, "relkey", "keys", "k"))
    os.chmod(os.path.join(repo, "relkey", "keys", "k"), 0o600)
    model("relkey", {"encryption_key_file": "keys/k"})       # relative to the model directory
    model("wrongkey", {"encryption_key_file": other})
    model("nokey")
    p = model("tampered", {"encryption_key_file": key})
    with open(p, "r+b") as f:
        f.seek(80 + 5 * (CHUNK + 16) + 1000)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    p = model("truncated", {"encryption_key_file": key})
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 100)

    os.environ["SP_TEST_ENC_KEY"] = open(key).read().strip()
    try:
        srv = Server("--model-repository", repo, model=None, start_timeout=30)
    finally:
        del os.environ["SP_TEST_ENC_KEY"]
    try:
        st, b = req(srv.port, "POST", "/v2/repository/index")
        ix = {e["name"]: e for e in b} if st == 200 else {}
        for name in ("plain", "keyfile", "keyenv", "relkey"):
            e = ix.get(name, {})
            s.case(f"repository: {name} READY", e.get("state") == "READY", str(e))
        for name, want in (("wrongkey", "wrong key"), ("tampered", "chunk 5 of 19 failed authentication"),
                           ("truncated", "truncated: expected 19 chunks, found 18"),
                           ("nokey", "is encrypted: set parameters.encryption_key_file")):
            e = ix.get(name, {})
            s.case(f"repository: {name} UNAVAILABLE with '{want}'",
                   e.get("state") == "UNAVAILABLE" and want in e.get("reason", ""), str(e))
            s.case(f"repository: {name}: the log names the file",
                   f"{name}/1/model.gguf.enc" in srv.text() and want in srv.text())
        ref = complete(srv.port, "plain")
        for name in ("keyfile", "keyenv", "relkey"):
            got = complete(srv.port, name)
            s.case(f"repository: {name} completes like the plain model", got == ref and len(ref) > 10,
                   f"{got!r} vs {ref!r}")
        st, _ = req(srv.port, "POST", "/v1/completions", {"model": "wrongkey", "prompt": "x"})
        s.case("repository: the wrong-key model answers 404, the others keep serving",
               st == 404 and complete(srv.port, "plain") == ref, str(st))
    finally:
        s.case("repository: clean exit", srv.stop() == 0)


def main():
    if exe is None:
        s.skip("all", "build/sampan not built")
        s.finish()
    tmp = tempfile.mkdtemp(prefix="sp-enc-")
    try:
        keys = s.guard("cli", test_cli, tmp)
        if keys:
            key, other, enc, hexkey = keys
            s.guard("serve --model", test_serve_model, key, other, enc, hexkey)
            s.guard("repository", test_repository, tmp, key, other, enc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
