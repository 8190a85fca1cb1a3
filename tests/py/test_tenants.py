"""test_tenants.py - API keys and tenants as a black box: `sampan keys add|list|revoke` (hashes
only, mode 0600, fingerprints), and `sampan serve --tenants FILE`: the same 401 for a missing,
wrong or almost-right key, Bearer and x-api-key, public routes, scopes (infer, admin, metrics),
allowed models, requests per second, tokens per minute and concurrency limits (429 with
Retry-After naming the limit), the tenant's tier capping a request's priority, per-tenant
usage in /metrics, reload when the file changes (and a bad file keeping the old table), and
the loopback-only rule without keys. Last line:
    tenants: N passed, N failed, N skipped"""
import http.client
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
import time

from common import ROOT, Server, Suite, binary, keyed_request, run

s = Suite("tenants")
exe = binary()
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")


def req(srv, method, path, body=None, key=None, header="authorization", timeout=30):
    return keyed_request(srv.port, method, path, body, key, header, timeout)


def add(path, name, *opts):
    rc, out, err = run([exe, "keys", "add", "--tenants", path, "--name", name, *opts], timeout=30)
    return rc, out.strip(), err


def complete(srv, key, model="stories260K", **kw):
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 4}
    body.update(kw)
    return req(srv, "POST", "/v1/completions", body, key=key)


def test_cli(tmp):
    path = os.path.join(tmp, "cli.json")
    rc, key, err = add(path, "acme", "--scopes", "infer,metrics", "--tier", "premium", "--rps", "5")
    s.case("keys add prints a new key once", rc == 0 and key.startswith("sk-sampan-") and
           len(key) > 40, err)
    text = open(path).read()
    s.case("the file holds the hash, not the key", key not in text and "sha256:" in text)
    s.case("the file is mode 0600", stat.S_IMODE(os.stat(path).st_mode) == 0o600)
    rc, key2, _ = add(path, "acme")
    rc, out, _ = run([exe, "keys", "list", "--tenants", path, "--json"], timeout=30)
    doc = json.loads(out) if rc == 0 else {}
    t = doc.get("tenants", [{}])[0]
    s.case("keys list: tenant, scopes, tier, two fingerprints",
           t.get("name") == "acme" and t.get("scopes") == "infer,metrics" and
           t.get("tier") == "premium" and len(t.get("keys", [])) == 2, out)
    fp = t["keys"][0] if t.get("keys") else "x"
    rc, _, err = run([exe, "keys", "revoke", "--tenants", path, "--name", "acme", "--key", fp],
                     timeout=30)
    rc2, out, _ = run([exe, "keys", "list", "--tenants", path, "--json"], timeout=30)
    s.case("keys revoke --key removes one key", rc == 0 and
           len(json.loads(out)["tenants"][0]["keys"]) == 1, err + out)
    rc, _, err = run([exe, "keys", "revoke", "--tenants", path, "--name", "nobody"], timeout=30)
    s.case("revoking an unknown tenant fails clearly", rc == 1 and "nobody" in err, err)
    rc, _, err = run([exe, "keys", "add", "--tenants", path, "--name", "x", "--tier", "gold"],
                     timeout=30)
    s.case("a bad tier is refused", rc == 2 and "tier" in err, err)
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        json.dump({"tenants": [{"name": "a", "keys": ["sk-plaintext-key"]}]}, f)
    rc, _, err = run([exe, "keys", "list", "--tenants", bad], timeout=30)
    s.case("a plaintext key in the file is refused naming the field",
           rc == 1 and "tenants[0].keys[0]" in err, err)


def test_server(tmp):
    path = os.path.join(tmp, "tenants.json")
    _, k_acme, _ = add(path, "acme", "--scopes", "infer,metrics", "--tier", "premium",
                       "--models", "stories260K")
    _, k_ops, _ = add(path, "ops", "--scopes", "admin,metrics")
    _, k_slow, _ = add(path, "slow", "--rps", "2", "--burst", "2")
    _, k_tok, _ = add(path, "tok", "--tpm", "60")
    _, k_one, _ = add(path, "one", "--concurrency", "1", "--tier", "batch")
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "other", "1"))
    shutil.copy(DEMO, os.path.join(repo, "other", "1", "model.gguf"))
    with open(os.path.join(repo, "other", "config.json"), "w") as f:
        json.dump({"name": "other"}, f)
    srv = Server("--tenants", path, "--model-repository", repo, "--parallel", "2")
    try:
        st1, h1, b1 = complete(srv, None)
        st2, h2, b2 = complete(srv, k_acme[:-1] + ("A" if k_acme[-1] != "A" else "B"))
        st3, _, b3 = complete(srv, "wrong")
        s.case("missing, wrong and almost-right keys: the same 401",
               st1 == st2 == st3 == 401 and b1 == b2 == b3 and
               h1.get("www-authenticate") == "Bearer", f"{st1} {st2} {st3} {b1}")
        st, _, b = complete(srv, k_acme)
        s.case("a good key (Bearer) infers", st == 200, str(b)[:200])
        st, _, _ = req(srv, "POST", "/v1/completions",
                       {"model": "stories260K", "prompt": "x", "max_tokens": 2}, key=k_acme,
                       header="x-api-key")
        s.case("x-api-key works too", st == 200)
        s.case("/live, /health and the status page need no key",
               all(req(srv, "GET", p)[0] == 200 for p in ("/live", "/health", "/")))
        s.case("/metrics needs the metrics scope", req(srv, "GET", "/metrics")[0] == 401 and
               req(srv, "GET", "/metrics", key=k_acme)[0] == 200 and
               req(srv, "GET", "/metrics", key=k_slow)[0] == 403)
        st, _, b = req(srv, "POST", "/v2/repository/index", key=k_acme)
        s.case("admin routes refuse an infer key (403 naming the scope)",
               st == 403 and "admin" in json.dumps(b), str(b))
        st, _, _ = req(srv, "POST", "/v2/repository/index", key=k_ops)
        s.case("an admin key lists the repository", st == 200)
        st, _, _ = complete(srv, k_ops)
        s.case("an admin-only key cannot infer", st == 403)
        st, _, b = complete(srv, k_acme, model="other")
        s.case("a model outside the tenant's list is refused (403)",
               st == 403 and "may not use" in json.dumps(b), str(b))
        st, _, _ = complete(srv, k_slow, model="other")
        s.case("... other tenants may use it", st == 200)

        time.sleep(1.1)  # a full bucket (2) to start from
        codes, ra = [], None
        for _ in range(6):
            st, h, b = req(srv, "GET", "/v1/models", key=k_slow)
            codes.append(st)
            if st == 429:
                ra = (h.get("retry-after"), json.dumps(b))
        s.case("requests_per_second: 429 with Retry-After naming the limit",
               codes[:2] == [200, 200] and 429 in codes and ra and ra[0] and
               "requests per second" in ra[1], f"{codes} {ra}")
        time.sleep(1.1)
        s.case("... and the bucket refills", req(srv, "GET", "/v1/models", key=k_slow)[0] == 200)

        codes = [complete(srv, k_tok, max_tokens=20)[0] for _ in range(4)]
        st, h, b = complete(srv, k_tok, max_tokens=20)
        s.case("tokens_per_minute: 429 once the minute's tokens are used",
               codes[0] == 200 and st == 429 and "tokens per minute" in json.dumps(b) and
               int(h.get("retry-after", "0")) >= 1, f"{codes} {st} {b}")

        hold = {}

        def long_stream():
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            c.request("POST", "/v1/completions", body=json.dumps(
                {"model": "stories260K", "prompt": "Once", "max_tokens": 480, "n": 12,
                 "stream": True, "ignore_eos": True}).encode(),
                headers={"Content-Type": "application/json", "authorization": f"Bearer {k_one}"})
            r = c.getresponse()
            hold["status"] = r.status
            r.read()
            c.close()

        t = threading.Thread(target=long_stream)
        t.start()
        time.sleep(0.15)
        st, _, b = complete(srv, k_one)
        s.case("max_concurrent: a second request in flight is 429",
               st == 429 and "in flight" in json.dumps(b), f"{st} {b}")
        _, _, mtext = req(srv, "GET", "/metrics", key=k_acme)
        mtext = mtext.decode() if isinstance(mtext, bytes) else str(mtext)
        import re
        m = re.search(r'sampan_requests_running\{model="stories260K",version="1",tier="batch"\} (\d+)',
                      mtext)
        s.case("the batch tenant's request runs in the batch tier", m and int(m.group(1)) >= 1,
               m.group(0) if m else "")
        t.join(60)
        s.case("... and completes", hold.get("status") == 200)
        st, _, _ = complete(srv, k_one, priority="premium")
        s.case("a request cannot ask above its tenant's tier (still served)", st == 200)

        _, _, mtext = req(srv, "GET", "/metrics", key=k_acme)
        mtext = mtext.decode() if isinstance(mtext, bytes) else str(mtext)
        s.case("per-tenant usage in /metrics",
               'sampan_tenant_requests_total{tenant="acme"}' in mtext and
               'sampan_tenant_rejected_total{tenant="slow",limit="requests_per_second"}' in mtext and
               'sampan_tenant_tokens_total{tenant="tok"}' in mtext, "")
        s.case("the access log names the tenant",
               srv.wait_log(r"event=request .*tenant=acme .*model=stories260K", 3) is not None)

        # Reload: revoke acme's key, add a new tenant; the server follows within ~2 s.
        run([exe, "keys", "revoke", "--tenants", path, "--name", "acme"], timeout=30)
        _, k_new, _ = add(path, "newcomer")
        ok = False
        for _ in range(40):
            time.sleep(0.1)
            if complete(srv, k_acme)[0] == 401 and complete(srv, k_new)[0] == 200:
                ok = True
                break
        s.case("a changed file is reloaded: revoked key 401, new key 200", ok)
        with open(path, "w") as f:
            f.write("{not json")
        time.sleep(1.6)
        s.case("a broken file keeps the previous table", complete(srv, k_new)[0] == 200 and
               srv.wait_log(r"event=tenants_reload_failed", 2) is not None)
        n0 = srv.text().count("event=tenants_reloaded")
        srv.p.send_signal(signal.SIGHUP)
        ok = False
        for _ in range(40):
            time.sleep(0.1)
            if srv.text().count("event=tenants_reload_failed") >= 2:
                ok = True  # SIGHUP reread the (still broken) file and kept the old table
                break
        s.case("SIGHUP rereads the file (a broken one still keeps the old table)",
               ok and complete(srv, k_new)[0] == 200 and srv.p.poll() is None,
               f"{n0} {srv.text()[-300:]}")
    finally:
        s.case("server exits cleanly", srv.stop() == 0)


def test_bind(tmp):
    rc, _, err = run([exe, "serve", "--host", "0.0.0.0", "--port", "0"], timeout=20)
    s.case("no keys: a non-loopback bind is refused", rc == 2 and "--insecure-open" in err,
           err.strip()[-300:])
    srv = Server("--host", "127.0.0.1")
    try:
        s.case("no keys on loopback: starts and says so",
               srv.wait_log(r"event=auth mode=none", 2) is not None)
    finally:
        srv.stop()


def main():
    tmp = tempfile.mkdtemp(prefix="sampan-tenants-")
    try:
        s.guard("cli", test_cli, tmp)
        s.guard("server", test_server, tmp)
        s.guard("bind", test_bind, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
