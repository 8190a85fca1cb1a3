"""test_lifecycle.py - model lifecycle of `sampan serve --model-repository` as a black box on
127.0.0.1 (free ports), with temporary repositories of demo-model copies:
  - poll mode: hot reload under load (two clients stream the whole time; no request fails,
    v2's answers follow v1's, v1 is freed once its streams end), a corrupt v3 keeps v2
    serving with the error in the index, added and removed models picked up;
  - the memory budget: LRU eviction with a budget that fits two of three models, an evicted
    model coming back on its next request, a load refused when too big, memory returned on
    unload;
  - load_on_demand (the first request waits for the load), instance groups (work spread
    over instances), config parameters applied (context length, sampling defaults),
    KIND_GPU without a GPU refused with a clear reason.
Every loop is bounded in count and time. Last line:
    lifecycle: N passed, N failed, N skipped"""
import http.client
import json
import os
import shutil
import tempfile
import threading
import time

import common
from common import ROOT, Suite

s = Suite("lifecycle")
DEMO = os.path.join(ROOT, "models", "stories260K.gguf")


class RepoServer(common.RepoServer):
    def index(self):
        st, b = self.req("POST", "/v2/repository/index")
        return {(e["name"], e.get("version")): e for e in b} if st == 200 else {}

    def stats(self):
        return self.req("GET", "/stats")[1]

    def complete(self, model, **kw):
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
        body.update(kw)
        return self.req("POST", "/v1/completions", body)

    def stream(self, model):
        """One KServe generate_stream: (ok, versions seen, error text)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            body = json.dumps({"text_input": "Once upon a time", "max_tokens": 12,
                               "temperature": 0}).encode()
            c.request("POST", f"/v2/models/{model}/generate_stream", body=body,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            raw = r.read().decode("utf-8", "replace")
            if r.status != 200:
                return False, set(), f"{r.status} {raw[:200]}"
            versions, finished = set(), False
            for line in raw.split("\n"):
                if not line.startswith("data: "):
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    return False, versions, ev["error"]
                versions.add(ev.get("model_version"))
                finished |= bool(ev.get("finish_reason"))
            return finished, versions, "" if finished else "no finish event"
        except Exception as e:  # a dropped connection is a failure, not a crash of the test
            return False, set(), repr(e)
        finally:
            c.close()


def write_model(repo, name, versions=(1,), config=None, data=None):
    """repo/name/config.json and one copy of the demo model per version. A version directory
    is filled under a hidden name and renamed into place, as an operator would, so a poll
    never sees it half written."""
    os.makedirs(os.path.join(repo, name), exist_ok=True)
    for v in versions:
        tmp = os.path.join(repo, name, f".tmp{v}")
        os.makedirs(tmp)
        dst = os.path.join(tmp, "model.gguf")
        if data is None:
            shutil.copy(DEMO, dst)
        else:
            with open(dst, "wb") as f:
                f.write(data)
        os.rename(tmp, os.path.join(repo, name, str(v)))
    cfg = {"name": name, "backend": "llm"}
    cfg.update(config or {})
    path = os.path.join(repo, name, "config.json")
    with open(path + ".tmp", "w") as f:
        json.dump(cfg, f)
    os.rename(path + ".tmp", path)


def until(fn, timeout=10.0, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def state(srv, name, version):
    return srv.index().get((name, str(version)), {}).get("state")


# ------------------------------------------------------------------ poll mode

def test_poll(tmp):
    repo = os.path.join(tmp, "poll")
    write_model(repo, "hot")
    srv = RepoServer(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.2",
                     "--http-threads", "2")
    try:
        s.case("poll: v1 READY at start", state(srv, "hot", 1) == "READY", str(srv.index()))
        results = [[], []]
        stop = threading.Event()

        def client(out):
            end = time.time() + 40
            for _ in range(2000):
                if stop.is_set() or time.time() > end:
                    break
                out.append(srv.stream("hot"))

        threads = [threading.Thread(target=client, args=(results[i],)) for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.8)
        write_model(repo, "hot", versions=(2,))
        swapped = until(lambda: state(srv, "hot", 2) == "READY" and
                        ("hot", "1") not in srv.index(), timeout=15)
        time.sleep(0.8)  # some requests on v2
        stop.set()
        for t in threads:
            t.join(60)
        s.case("poll: v2 READY and v1 gone from the index", bool(swapped), str(srv.index()))
        failures = [r for res in results for r in res if not r[0]]
        total = sum(len(r) for r in results)
        s.case("hot reload: no request failed while v1 was replaced by v2",
               total > 10 and not failures, f"{total} requests, failures: {failures[:3]}")
        ordered = True
        for res in results:
            seq = [max(v) for ok, v, _ in res if ok and v]
            ordered &= seq == sorted(seq) and bool(seq) and seq[-1] == "2"
        seen = {v for res in results for ok, vs, _ in res for v in vs}
        s.case("hot reload: v2's answers follow v1's in each client", ordered and seen == {"1", "2"},
               f"seen {seen}")
        s.case("hot reload: v1 freed after its streams ended",
               srv.wait_log(r"event=model_freed model=hot version=1", 10) is not None)
        st = srv.stats()
        s.case("hot reload: /stats shows v2 only with v2's memory reserved",
               st["models"]["hot"]["version"] == "2" and "hot@1" not in st["models"] and
               st["devices"][0]["reserved_bytes"] == st["models"]["hot"]["memory_bytes"],
               json.dumps(st["devices"]))

        # A corrupt v3: v2 keeps serving, the index says why v3 is not.
        write_model(repo, "hot", versions=(3,), data=b"GGUF" + b"\xff" * 60)
        e3 = until(lambda: srv.index().get(("hot", "3"), {}).get("state") == "UNAVAILABLE" and
                   srv.index()[("hot", "3")].get("reason") not in ("", "loading", "not loaded")
                   and srv.index()[("hot", "3")], timeout=10)
        s.case("corrupt v3: UNAVAILABLE with the load error", bool(e3), str(e3))
        s.case("corrupt v3: v2 still READY in the index", state(srv, "hot", 2) == "READY",
               str(srv.index()))
        ok, versions, err = srv.stream("hot")
        s.case("corrupt v3: requests still answered by v2", ok and versions == {"2"},
               f"{versions} {err}")
        time.sleep(1.0)  # five more polls
        n_fail = srv.text().count("event=model_load_failed model=hot version=3")
        s.case("corrupt v3: not retried at every poll", n_fail == 1, f"{n_fail} load attempts")

        # Added and removed models.
        write_model(repo, "added")
        s.case("poll: an added model becomes READY",
               until(lambda: state(srv, "added", 1) == "READY", timeout=10))
        st, b = srv.complete("added")
        s.case("poll: the added model answers", st == 200, str(b)[:200])
        shutil.rmtree(os.path.join(repo, "added"))
        gone = until(lambda: srv.complete("added")[0] == 404, timeout=10)
        s.case("poll: a removed model is no longer served", bool(gone))
        st, b = srv.req("GET", "/v1/models")
        s.case("poll: /v1/models follows", [m["id"] for m in b["data"]] == ["hot"], str(b))
    finally:
        s.case("poll: clean exit", srv.stop() == 0)


# ------------------------------------------------------------------ memory budget

def model_bytes(repo):
    srv = RepoServer(repo, "--model-control-mode", "explicit")
    try:
        srv.req("POST", "/v2/repository/models/a/load")
        return srv.stats()["models"]["a"]["memory_bytes"]
    finally:
        srv.stop()


def test_budget(tmp):
    repo = os.path.join(tmp, "budget")
    for n in ("a", "b", "c"):
        write_model(repo, n)
    one = model_bytes(repo)
    s.case("budget: a model's estimate is reported", one > os.path.getsize(DEMO), str(one))
    srv = RepoServer(repo, "--model-control-mode", "explicit", "--memory-budget",
                     f"cpu={int(one * 2.5)}")
    try:
        for n in ("a", "b"):
            st, b = srv.req("POST", f"/v2/repository/models/{n}/load")
            s.case(f"budget: load {n}", st == 200, str(b))
        time.sleep(0.01)
        st, _ = srv.complete("a")  # a is now more recently used than b
        s.case("budget: a used", st == 200)
        st, b = srv.req("POST", "/v2/repository/models/c/load")
        s.case("budget: load c with two loaded evicts one", st == 200, str(b))
        ix = srv.index()
        s.case("budget: the least recently used (b) was evicted",
               ix[("b", "1")]["state"] == "UNAVAILABLE" and "make room" in ix[("b", "1")]["reason"]
               and ix[("a", "1")]["state"] == "READY" and ix[("c", "1")]["state"] == "READY",
               str(ix))
        st = srv.stats()
        s.case("budget: reserved memory within the budget",
               st["devices"][0]["reserved_bytes"] <= st["devices"][0]["budget_bytes"] and
               st["evictions"] == 1, json.dumps(st["devices"]))
        st, b = srv.complete("b")
        s.case("budget: an evicted model loads again on its next request", st == 200, str(b)[:200])
        ix = srv.index()
        s.case("budget: ... evicting the next least recently used (a)",
               ix[("a", "1")]["state"] == "UNAVAILABLE" and ix[("b", "1")]["state"] == "READY" and
               ix[("c", "1")]["state"] == "READY", str(ix))
        st, b = srv.req("POST", "/v2/repository/models/b/unload")
        s.case("budget: unload", st == 200, str(b))
        freed = until(lambda: srv.stats()["devices"][0]["reserved_bytes"] == one, timeout=5)
        s.case("budget: unload returns the memory", bool(freed), json.dumps(srv.stats()["devices"]))
    finally:
        s.case("budget: clean exit", srv.stop() == 0)

    srv = RepoServer(repo, "--model-control-mode", "explicit", "--memory-budget", f"cpu={one // 2}")
    try:
        st, b = srv.req("POST", "/v2/repository/models/a/load")
        err = (b or {}).get("error", "") if isinstance(b, dict) else str(b)
        s.case("too big: load refused with a clear error",
               st == 400 and "memory budget" in err and "needs" in err, err)
        s.case("too big: index says why",
               "memory budget" in srv.index().get(("a", "1"), {}).get("reason", ""))
        s.case("too big: nothing reserved", srv.stats()["devices"][0]["reserved_bytes"] == 0)
    finally:
        s.case("too big: clean exit", srv.stop() == 0)


# ------------------------------------------------------------------ config

def test_config(tmp):
    repo = os.path.join(tmp, "config")
    write_model(repo, "lazy", config={"load_on_demand": True})
    write_model(repo, "twice", config={"instance_group": [{"count": 2, "kind": "KIND_CPU"}]})
    write_model(repo, "tuned", config={"parameters": {
        "context_length": {"string_value": "96"},
        "temperature": {"string_value": "0"},
        "max_tokens": {"string_value": "5"}}})
    write_model(repo, "gpu", config={"instance_group": [{"count": 1, "kind": "KIND_GPU"}]})
    srv = RepoServer(repo, "--parallel", "2")
    try:
        e = srv.index().get(("lazy", "1"), {})
        s.case("load_on_demand: not loaded at start", e.get("state") == "UNAVAILABLE" and
               "first request" in e.get("reason", ""), str(e))
        st, b = srv.req("GET", "/v1/models")
        lz = [m for m in b["data"] if m["id"] == "lazy"]
        s.case("load_on_demand: listed in /v1/models, not ready", lz and lz[0]["ready"] is False,
               str(b))
        st, b = srv.complete("lazy")
        s.case("load_on_demand: the first request waits and succeeds", st == 200, str(b)[:200])
        s.case("load_on_demand: READY afterwards", state(srv, "lazy", 1) == "READY")

        outs = []
        ts = [threading.Thread(target=lambda: outs.append(srv.complete("twice", max_tokens=24)[0]))
              for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        m = srv.stats()["models"]["twice"]
        s.case("instance_group count 2: two instances", m["instances"] == 2, str(m["instances"]))
        s.case("instance_group: requests spread over both instances",
               outs == [200] * 8 and all(j > 0 for j in m["instance_jobs_done"]),
               f"{outs} {m['instance_jobs_done']}")

        st, b = srv.req("GET", "/v1/models/tuned")
        s.case("parameters: context_length applied", st == 200 and b["max_model_len"] == 96, str(b))
        r1 = srv.req("POST", "/v1/completions", {"model": "tuned", "prompt": "Once upon a time"})
        r2 = srv.req("POST", "/v1/completions", {"model": "tuned", "prompt": "Once upon a time"})
        s.case("parameters: max_tokens default applied",
               r1[0] == 200 and r1[1]["usage"]["completion_tokens"] == 5, str(r1)[:200])
        s.case("parameters: temperature 0 default (same text twice)",
               r1[0] == r2[0] == 200 and r1[1]["choices"][0]["text"] == r2[1]["choices"][0]["text"])
        r3 = srv.req("POST", "/v1/completions", {"model": "tuned", "prompt": "Once upon a time",
                                                 "max_tokens": 2})
        s.case("parameters: a request's own value wins",
               r3[0] == 200 and r3[1]["usage"]["completion_tokens"] == 2, str(r3)[:200])

        e = srv.index().get(("gpu", "1"), {})
        s.case("KIND_GPU without a GPU: UNAVAILABLE with the reason",
               e.get("state") == "UNAVAILABLE" and "GPU" in e.get("reason", ""), str(e))
    finally:
        s.case("config: clean exit", srv.stop() == 0)


def test_gpu_placement(tmp):
    """Placement and budgets on GPUs and MIG instances, through the fake NVML the unit build
    makes: the budget of the named device is checked. The CUDA backend is switched off here
    (SAMPAN_CUDA_LIB empty; tests/py/test_cuda.py runs it on an emulated device), so a load
    that fits ends with that clear error and leaves nothing reserved."""
    from common import binary
    fake = os.path.join(os.path.dirname(binary()), "libfake_nvml.so")
    if not os.path.isfile(fake):
        s.skip("gpu placement", f"{fake} not built (make unit builds it)")
        return
    repo = os.path.join(tmp, "gpu")
    write_model(repo, "mig", config={"instance_group": [{"count": 2, "kind": "KIND_GPU",
                                                         "gpus": [1]}]})
    write_model(repo, "nogpu", config={"instance_group": [{"kind": "KIND_GPU", "gpus": [7]}]})
    old = dict(os.environ)
    os.environ["SAMPAN_NVML_LIB"] = fake
    os.environ["SAMPAN_CUDA_LIB"] = ""
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        srv = RepoServer(repo, "--model-control-mode", "explicit")
        try:
            devs = srv.stats()["devices"]
            s.case("gpu: /stats lists the CPU, GPUs and MIG instances with budgets",
                   [d["kind"] for d in devs] == ["cpu", "gpu", "gpu", "mig", "mig"] and
                   devs[3]["budget_bytes"] == int(devs[3]["total_bytes"] * 0.8), json.dumps(devs))
            st, b = srv.req("POST", "/v2/repository/models/mig/load")
            s.case("gpu: placement on MIG instance cuda:1 fits, then needs the CUDA backend",
                   st == 400 and "GPU backend" in b.get("error", ""), str(b))
            s.case("gpu: nothing left reserved",
                   all(d["reserved_bytes"] == 0 for d in srv.stats()["devices"]))
            st, b = srv.req("POST", "/v2/repository/models/nogpu/load")
            s.case("gpu: a GPU that is not visible is a clear error",
                   st == 400 and "no GPU 7" in b.get("error", ""), str(b))
        finally:
            s.case("gpu: clean exit", srv.stop() == 0)
        srv = RepoServer(repo, "--model-control-mode", "explicit", "--memory-budget",
                         "50%,cuda:1=1K")
        try:
            devs = srv.stats()["devices"]
            s.case("gpu: --memory-budget per device",
                   devs[3]["budget_bytes"] == 1024 and
                   devs[1]["budget_bytes"] == devs[1]["total_bytes"] // 2, json.dumps(devs))
            st, b = srv.req("POST", "/v2/repository/models/mig/load")
            err = b.get("error", "") if isinstance(b, dict) else ""
            s.case("gpu: too big for the MIG instance's budget, named in the error",
                   st == 400 and "budget" in err and "MIG-aaaaaaaa" in err, err)
        finally:
            s.case("gpu: clean exit (budget)", srv.stop() == 0)
        from common import run
        rc, _, err = run([binary(), "serve", "--model-repository", repo, "--port", "0",
                          "--memory-budget", "cuda:9=1G"], timeout=20)
        s.case("gpu: a budget for an unknown device is refused at start",
               rc == 2 and "cuda:9" in err, err.strip()[-200:])
        rc, _, err = run([binary(), "serve", "--model-repository", repo, "--port", "0",
                          "--memory-budget", "lots"], timeout=20)
        s.case("gpu: a bad budget is refused at start", rc == 2 and "memory-budget" in err,
               err.strip()[-200:])
    finally:
        os.environ.clear()
        os.environ.update(old)


def main():
    tmp = tempfile.mkdtemp(prefix="sampan-life-")
    try:
        s.guard("poll", test_poll, tmp)
        s.guard("budget", test_budget, tmp)
        s.guard("config", test_config, tmp)
        s.guard("gpu placement", test_gpu_placement, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
