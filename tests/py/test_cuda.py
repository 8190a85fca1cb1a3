"""test_cuda.py - the CUDA backend where no GPU is (docs/cuda.md).

- With nvcc: `make cuda` compiles and links libsampan_cuda.so (sm_80, sm_89, sm_90), which loads
  and, without a GPU or driver, refuses with a clear reason.
- The GPU path of sampan on the host emulation of the CUDA library (tests/gpu/fake_cuda.c):
  the host tests (shared math, loader, forward pass vs the CPU, errors; rerun with the CPU
  engine at each kernel level below the best, SAMPAN_CPU=scalar / avx2), the kernel test
  program, and `sampan serve` placing a repository model KIND_GPU on a fake NVML GPU (all layers,
  and gpu_layers 2), answering exactly as the CPU does.
- sampan without a usable GPU: serves CPU models; a KIND_GPU model fails to load with the reason.
- CUDA graphs and quantised weights on the emulation: `sampan serve` captures decode graphs
  (event=gpu_graph_captured) and, with SAMPAN_CUDA_WEIGHTS=native on a Q8_0 model, answers as
  the CPU does on the same file; bad SAMPAN_CUDA_WEIGHTS / SAMPAN_CUDA_GRAPHS values fail the load
  with the reason; bench/gpu/gpu_bench's subcommands (what bench/gpu/run.sh calls on the one GPU
  run) work with the arguments run.sh passes and refuse bad ones.
- Pinned memory and candidates (sampling from the device's top k) on the emulation: the same
  completions (greedy, and seeded top_k sampling with top_p/min_p) with SAMPAN_CUDA_CANDIDATES on
  and off and on the CPU, no pinning fallback logged, bad SAMPAN_CUDA_PINNED / _CANDIDATES values
  fail the load; whether the server's scheduler asks for candidates is read from the log
  (event=gpu_candidates) and reported as skipped when it does not. gpu_bench decode (pageable vs
  pinned copies, rows vs candidates) runs as run.sh calls it.
- On a machine with a GPU the real kernel test and the demo model's greedy check run; elsewhere
  they print "skipped".
"""
import json
import os
import re
import shutil
import tempfile

from common import ROOT, DEMO_MODEL, RepoServer, Server, Suite, binary, http_json, run

s = Suite("cuda")
exe = binary()
if exe is None:
    s.skip("all", "sampan not built")
    s.finish()
bdir = os.path.dirname(exe)
build = os.path.relpath(bdir, ROOT)
nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
san = os.environ.get("SAMPAN_TEST_SANITIZER") == "1" or "san" in os.path.basename(bdir)
make_extra = ["SANITIZER=1"] if san else []

# ---- build: host test programs (C only), and the CUDA library when nvcc is here
rc, out, err = run(["make", f"BUILD={build}", *make_extra, "-j2", "cuda-tests"], timeout=300)
s.case("make cuda-tests (C compiler only)", rc == 0, (out + err)[-2000:])
if rc != 0:
    s.finish()

real_lib = os.path.join(bdir, "libsampan_cuda.so")
if nvcc:
    rc, out, err = run(["make", f"BUILD={build}", *make_extra, f"NVCC={nvcc}", "-j2",
                        f"{build}/libsampan_cuda.so"], timeout=300)
    s.case("make cuda: nvcc compiles and links sm_80/89/90", rc == 0 and os.path.exists(real_lib),
           (out + err)[-3000:])
else:
    s.skip("make cuda", "no nvcc on this machine")

fake = os.path.join(bdir, "libfake_cuda.so")

# ---- the GPU path on the host emulation
rc, out, err = run([os.path.join(bdir, "test_cuda_host"), fake], timeout=180)
last = out.strip().splitlines()[-1] if out.strip() else ""
s.case("host tests (shared math, loader, forward vs CPU, errors)",
       rc == 0 and " 0 failed" in last and " 0 skipped" in last, out[-3000:] + err[-1000:])
# Again with the CPU engine (the reference of the forward comparisons) at each kernel level
# below this CPU's best, so a machine with AVX-512 also checks them against the AVX2 and
# scalar paths; a level this CPU lacks is a skipped line.
m = re.search(r"^cpu kernels: (\S+); levels:(.*)$", out, re.M)
levels = m.group(2).split() if m else []
s.case("host tests report the CPU kernel levels", bool(levels), out[:500])
for lvl in ("scalar", "avx2", "avx512", "amx"):
    if not levels or lvl == levels[-1]:
        continue
    if lvl not in levels:
        s.skip(f"host tests at SAMPAN_CPU={lvl}", f"this CPU has no {lvl}")
        continue
    rc, out, err = run([os.path.join(bdir, "test_cuda_host"), fake], timeout=180,
                       env={"SAMPAN_CPU": lvl})
    last = out.strip().splitlines()[-1] if out.strip() else ""
    s.case(f"host tests at SAMPAN_CPU={lvl} (the CPU engine's {lvl} kernels as reference)",
           rc == 0 and f"cpu kernels: {lvl};" in out and " 0 failed" in last
           and " 0 skipped" in last, out[-3000:] + err[-1000:])
rc, out, err = run([os.path.join(bdir, "gpu_kernel_test"), fake], timeout=60)
s.case("kernel test program on the host emulation", rc == 0 and "76 passed, 0 failed" in out,
       out[-3000:] + err[-1000:])

# ---- the real library: loads; runs the GPU checks only where a GPU is
gpu_ok = False
# The CUDA runtime and cuBLAS keep allocations to the end of the process (libstdc++'s
# emergency pool among them): under LeakSanitizer those are vendor leaks, not ours, and the
# leak report's exit would swallow the program's buffered output.
vendor_env = {"ASAN_OPTIONS": (os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")}
if os.path.exists(real_lib):
    rc, out, err = run([os.path.join(bdir, "gpu_kernel_test"), real_lib], timeout=120,
                       env=vendor_env)
    if "skipped" in out:
        why = out.strip().splitlines()[0]
        s.case("real library loads and says why it cannot run", rc == 0 and
               ("no CUDA device" in why or "cannot load" in why), out)
        s.skip("GPU kernel test", why)
        s.skip("GPU demo model greedy", "no GPU")
    else:
        gpu_ok = True
        s.case("GPU kernel test", rc == 0 and " 0 failed" in out, out[-3000:])
        rc, out, err = run([os.path.join(bdir, "gpu_bench"), "check", DEMO_MODEL, "200"],
                           timeout=120, env=dict(vendor_env, SAMPAN_CUDA_LIB=real_lib))
        s.case("GPU demo model greedy == CPU", rc == 0 and "PASS" in out, out[-2000:])
else:
    s.skip("GPU kernel test", "libsampan_cuda.so not built (no nvcc)")

# ---- sampan serve
prompt = {"model": "stories", "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}


def completion(port, model="stories"):
    st, doc = http_json(port, "POST", "/v1/completions", dict(prompt, model=model), timeout=30)
    return st, (doc or {}).get("choices", [{}])[0].get("text") if isinstance(doc, dict) else doc


def repo_with(tmp, config):
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "stories", "1"), exist_ok=True)
    shutil.copy(DEMO_MODEL, os.path.join(repo, "stories", "1", "model.gguf"))
    with open(os.path.join(repo, "stories", "config.json"), "w") as f:
        json.dump(config, f)
    return repo


saved = {k: os.environ.get(k) for k in ("SAMPAN_CUDA_LIB", "SAMPAN_NVML_LIB",
                                        "CUDA_VISIBLE_DEVICES", "FAKE_CUDA_FAIL_OP",
                                        "SAMPAN_CUDA_WEIGHTS", "SAMPAN_CUDA_GRAPHS",
                                        "SAMPAN_CUDA_PINNED", "SAMPAN_CUDA_CANDIDATES")}
# Seeded sampling that candidates serve exactly (top_k <= 64, no penalties), and sampling
# that needs the whole row (no top_k), next to the greedy prompt.
sampled = [dict(prompt, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1234),
           dict(prompt, temperature=1.3, top_k=8, seed=99),
           dict(prompt, temperature=0.9, top_p=0.9, seed=7)]


def completion_with(port, body):
    st, doc = http_json(port, "POST", "/v1/completions", dict(body, model="stories"), timeout=30)
    return st, (doc or {}).get("choices", [{}])[0].get("text") if isinstance(doc, dict) else doc


def setenv(**kw):
    for k, v in kw.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


ref_text = None
try:
    # CPU server, with the real library (or none) and no GPU: serves as always.
    setenv(SAMPAN_CUDA_LIB=real_lib if os.path.exists(real_lib) else "/nonexistent.so",
           SAMPAN_NVML_LIB="/nonexistent/libnvidia-ml.so.1")
    srv = Server(model=f"stories={DEMO_MODEL}")
    try:
        st, ref_text = completion(srv.port)
        s.case("sampan serves on the CPU without a GPU", st == 200 and bool(ref_text),
               str(ref_text))
        ref_sampled = [completion_with(srv.port, b) for b in sampled]
    finally:
        srv.stop()

    fake_nvml = os.path.join(bdir, "libfake_nvml.so")
    rc, out, err = run(["make", f"BUILD={build}", f"{build}/libfake_nvml.so"], timeout=60)
    with tempfile.TemporaryDirectory() as tmp:
        gpu_cfg = {"backend": "llm", "instance_group": [{"kind": "KIND_GPU", "count": 1,
                                                         "gpus": [0]}]}
        if not gpu_ok:
            # A visible GPU (fake NVML) but no usable CUDA: the load fails with the reason.
            setenv(SAMPAN_NVML_LIB=fake_nvml, CUDA_VISIBLE_DEVICES=None,
                   SAMPAN_CUDA_LIB=real_lib if os.path.exists(real_lib) else "/nonexistent.so")
            srv = RepoServer(repo_with(tmp, gpu_cfg))
            try:
                m = srv.wait_log(r"GPU backend unavailable: [^\n]*", timeout=5)
                s.case("KIND_GPU without CUDA: clear load error", m is not None,
                       srv.text()[-2000:])
                st, _ = completion(srv.port)
                s.case("... and requests get an error, not a crash", st >= 400 and
                       srv.p.poll() is None, str(st))
            finally:
                srv.stop()
        # Fake NVML GPU + fake CUDA library: the whole serve path on the host emulation.
        for layers in (None, "2"):
            cfg = dict(gpu_cfg)
            if layers:
                cfg["parameters"] = {"gpu_layers": {"string_value": layers}}
            setenv(SAMPAN_NVML_LIB=fake_nvml, CUDA_VISIBLE_DEVICES=None, SAMPAN_CUDA_LIB=fake)
            srv = RepoServer(repo_with(tmp, cfg))
            try:
                m = srv.wait_log(r"event=gpu_placement[^\n]*gpu_layers=(\d+)/5", timeout=5)
                want = layers or "5"
                s.case(f"KIND_GPU placement, gpu_layers {want}/5 (fake GPU)",
                       m is not None and m.group(1) == want, srv.text()[-2000:])
                st, text = completion(srv.port)
                s.case(f"KIND_GPU completion equals the CPU's (gpu_layers {want})",
                       st == 200 and text == ref_text, f"{text!r} vs {ref_text!r}")
                if not layers:
                    s.case("KIND_GPU decode runs through CUDA graphs (emulated capture)",
                           srv.wait_log(r"event=gpu_graph_captured", timeout=3) is not None,
                           srv.text()[-2000:])
            finally:
                srv.stop()
        # Pinned memory and candidates: the same completions with candidates on and off, and
        # the CPU's (greedy and seeded sampling).
        texts, used = {}, False
        for cand in ("1", "0"):
            setenv(SAMPAN_NVML_LIB=fake_nvml, CUDA_VISIBLE_DEVICES=None, SAMPAN_CUDA_LIB=fake,
                   SAMPAN_CUDA_CANDIDATES=cand)
            srv = RepoServer(repo_with(tmp, gpu_cfg))
            try:
                srv.wait_log(r"event=gpu_placement", timeout=5)
                texts[cand] = [completion(srv.port)] + [completion_with(srv.port, b)
                                                        for b in sampled]
                log = srv.text()
                if cand == "1":
                    s.case("no pinned-memory fallback logged",
                           "event=gpu_pin_fallback" not in log, log[-1500:])
                    used = "event=gpu_candidates" in log
            finally:
                srv.stop()
        setenv(SAMPAN_CUDA_CANDIDATES=None)
        on, off = texts.get("1") or [], texts.get("0") or []
        # Candidates on and off must agree exactly (the same device logits); against the CPU
        # only greedy must: the GPU path's F16 activations move logits in the last bits, and a
        # seeded draw that lands near a boundary can part there (reported, not required).
        same_cpu = sum(a == b for a, b in zip(on[1:], ref_sampled))
        s.case("serve: greedy and seeded sampling, candidates on == off; greedy == CPU "
               f"(sampled == CPU for {same_cpu}/{len(sampled)})",
               len(on) == len(sampled) + 1 and on == off and on[0] == (200, ref_text) and
               all(st == 200 for st, _ in on),
               f"on {on!r}\noff {off!r}\ncpu {ref_sampled!r}")
        if used:
            s.case("serve: the scheduler asked for candidates (event=gpu_candidates)", True)
        else:
            s.skip("serve: decode through candidates",
                   "the scheduler (src/sched/sched.c) does not call sp_batch_eval_cand yet")
        # Quantised weights kept on the device: a Q8_0 copy of the demo model, served with
        # SAMPAN_CUDA_WEIGHTS=native, answers as the CPU does on the same file.
        q8 = os.path.join(tmp, "stories-q8_0.gguf")
        rc, out, err = run([exe, "quantize", DEMO_MODEL, q8, "q8_0", "--no-progress"], timeout=60)
        if rc == 0:
            setenv(SAMPAN_NVML_LIB="/nonexistent/libnvidia-ml.so.1", SAMPAN_CUDA_LIB="/nonexistent.so")
            srv = Server(model=f"stories={q8}")
            try:
                st, q8_text = completion(srv.port)
            finally:
                srv.stop()
            qrepo = os.path.join(tmp, "qrepo")
            os.makedirs(os.path.join(qrepo, "stories", "1"), exist_ok=True)
            shutil.copy(q8, os.path.join(qrepo, "stories", "1", "model.gguf"))
            with open(os.path.join(qrepo, "stories", "config.json"), "w") as f:
                json.dump(gpu_cfg, f)
            setenv(SAMPAN_NVML_LIB=fake_nvml, CUDA_VISIBLE_DEVICES=None, SAMPAN_CUDA_LIB=fake,
                   SAMPAN_CUDA_WEIGHTS="native")
            srv = RepoServer(qrepo)
            try:
                m = srv.wait_log(r"event=gpu_model_ready[^\n]*weights=native", timeout=5)
                st2, text = completion(srv.port)
                s.case("Q8_0 model, native weights on the GPU: the CPU's completion",
                       m is not None and st == 200 and st2 == 200 and text == q8_text,
                       f"{text!r} vs {q8_text!r}\n" + srv.text()[-1500:])
            finally:
                srv.stop()
            for var, val in (("SAMPAN_CUDA_WEIGHTS", "int3"), ("SAMPAN_CUDA_GRAPHS", "maybe"),
                             ("SAMPAN_CUDA_PINNED", "2"), ("SAMPAN_CUDA_CANDIDATES", "yes")):
                setenv(SAMPAN_CUDA_WEIGHTS=None, SAMPAN_CUDA_GRAPHS=None, SAMPAN_CUDA_PINNED=None,
                       SAMPAN_CUDA_CANDIDATES=None)
                setenv(**{var: val})
                srv = RepoServer(qrepo)
                try:
                    s.case(f"{var}={val}: the load fails with the reason",
                           srv.wait_log(var + r": '" + val + r"' is not", timeout=5) is not None,
                           srv.text()[-2000:])
                finally:
                    srv.stop()
            setenv(SAMPAN_CUDA_WEIGHTS=None, SAMPAN_CUDA_GRAPHS=None, SAMPAN_CUDA_PINNED=None,
                   SAMPAN_CUDA_CANDIDATES=None)
            # gpu_bench as bench/gpu/run.sh calls it, on the emulation.
            gb = os.path.join(bdir, "gpu_bench")
            env = {"SAMPAN_CUDA_LIB": fake}
            for args, extra in ((["check", DEMO_MODEL, "40"], {}),
                                (["graphs", DEMO_MODEL, "40"], {}),
                                (["check", q8, "16"], {"SAMPAN_CUDA_WEIGHTS": "native"}),
                                (["perf", q8, "q8-native-graphs", "1,8,64"],
                                 {"SAMPAN_CUDA_WEIGHTS": "native", "SAMPAN_CUDA_GRAPHS": "1"}),
                                (["perf", q8, "q8-both-eager", "1,8"],
                                 {"SAMPAN_CUDA_WEIGHTS": "both", "SAMPAN_CUDA_GRAPHS": "0"}),
                                (["decode", q8, "q8-f16-graphs", "1,8,64"],
                                 {"SAMPAN_CUDA_WEIGHTS": "f16", "SAMPAN_CUDA_GRAPHS": "1"})):
                rc, out, err = run([gb, *args], timeout=60, env=dict(env, **extra))
                good = rc == 0 and ("PASS" in out if args[0] != "perf" else
                                    "RESULT label=" + args[2] in out and "FAIL perf" not in out)
                if args[0] == "decode":
                    good = good and all(f"RESULT label={args[2]}-{c} " in out for c in
                                        ("pageable-rows", "pinned-rows", "pinned-cand"))
                s.case("gpu_bench " + " ".join(args[:1] + args[2:]) + " (emulated)", good,
                       out[-1500:] + err[-500:])
            for sub in ("perf", "decode"):
                rc, out, err = run([gb, sub, q8, "x", "1,99"], timeout=30, env=env)
                s.case(f"gpu_bench {sub} refuses a bad batch list", rc == 2 and "1,99" in err,
                       out + err)
        else:
            s.skip("Q8_0 native weights", "sampan quantize failed: " + err[-300:])
        # A CUDA error during a step: the request fails with the device's words, the GPU is
        # marked unhealthy in /metrics and /health turns 503 (readiness), nothing aborts.
        setenv(SAMPAN_NVML_LIB=fake_nvml, CUDA_VISIBLE_DEVICES=None, SAMPAN_CUDA_LIB=fake,
               FAKE_CUDA_FAIL_OP="attn")
        srv = RepoServer(repo_with(tmp, gpu_cfg))
        try:
            st0, _ = http_json(srv.port, "GET", "/health")
            st, doc = http_json(srv.port, "POST", "/v1/completions", dict(prompt, model="stories"),
                                timeout=30)
            msg = json.dumps(doc)[:300]
            s.case("CUDA error in a step: the request fails with the device error, no abort",
                   st0 == 200 and st >= 500 and "CUDA error" in msg and srv.p.poll() is None and
                   srv.wait_log(r"event=gpu_error[^\n]*injected failure", timeout=3) is not None,
                   f"{st0} {st} {msg}")
            st, text = http_json(srv.port, "GET", "/metrics")
            text = text.decode() if isinstance(text, bytes) else str(text)
            sick = [l for l in text.splitlines()
                    if l.startswith("sampan_device_healthy{") and l.endswith(" 0")]
            s.case("CUDA error: the GPU is unhealthy in /metrics", len(sick) == 1, sick or text[-400:])
            st, doc = http_json(srv.port, "GET", "/health")
            s.case("CUDA error: /health is 503 device_unhealthy",
                   st == 503 and (doc or {}).get("status") == "device_unhealthy", f"{st} {doc}")
        finally:
            s.case("CUDA error: clean exit", srv.stop() == 0)
            setenv(FAKE_CUDA_FAIL_OP=None)
        cfg = dict(gpu_cfg, parameters={"gpu_layers": {"string_value": "9"}})
        srv = RepoServer(repo_with(tmp, cfg))
        try:
            s.case("gpu_layers out of range: clear error",
                   srv.wait_log(r"gpu_layers: '9' is not", timeout=5) is not None,
                   srv.text()[-2000:])
        finally:
            srv.stop()
        # The Q8_0 KV cache is CPU-only: with GPU layers the load fails with the reason.
        setenv(SAMPAN_NVML_LIB=fake_nvml, CUDA_VISIBLE_DEVICES=None, SAMPAN_CUDA_LIB=fake)
        cfg = dict(gpu_cfg, parameters={"gpu_layers": {"string_value": "2"},
                                        "kv_cache_type": {"string_value": "q8_0"}})
        srv = RepoServer(repo_with(tmp, cfg))
        try:
            s.case("kv_cache_type q8_0 with GPU layers: clear error",
                   srv.wait_log(r"q8_0 runs on the CPU only", timeout=5) is not None,
                   srv.text()[-2000:])
        finally:
            srv.stop()
        # Sliding-window layers on the device keep only their window (the two-part pool,
        # docs/design.md): a gemma3-tiny model (window 8), full and partial offload,
        # answers as with --kv-swa-full (every position kept), prefix reuse included.
        g3 = os.path.join(tmp, "g3repo", "g3", "1", "model.gguf")
        os.makedirs(os.path.dirname(g3), exist_ok=True)
        rc, out, err = run(["/usr/bin/python3", os.path.join(ROOT, "tools", "gguf_gen.py"), g3,
                            "--preset", "gemma3-tiny", "--ctx", "512", "--untied", "--seed", "7",
                            "-q"], timeout=60)
        long_prompt = " ".join(f"word{i}" for i in range(40))
        swa = {}
        for layers in ("-1", "1"):
            for full in (True, False):
                with open(os.path.join(tmp, "g3repo", "g3", "config.json"), "w") as f:
                    json.dump(dict(gpu_cfg, parameters={"gpu_layers": {"string_value": layers}}),
                              f)
                setenv(SAMPAN_NVML_LIB=fake_nvml, CUDA_VISIBLE_DEVICES=None, SAMPAN_CUDA_LIB=fake)
                srv = RepoServer(os.path.join(tmp, "g3repo"), "--parallel", "2", "--kv-blocks",
                                 "40", "--step-tokens", "64",
                                 *(["--kv-swa-full"] if full else []))
                try:
                    m = srv.wait_log(r"event=sched_ready[^\n]*kv_swa_blocks=(\d+)", timeout=10)
                    r = {"nswa": int(m.group(1)) if m else -1, "texts": []}
                    for _ in range(2):  # the second run takes the first's cached blocks
                        st, doc = http_json(srv.port, "POST", "/v1/completions",
                                            {"model": "g3", "prompt": long_prompt,
                                             "max_tokens": 60, "temperature": 0,
                                             "ignore_eos": True, "logprobs": 1}, timeout=60)
                        # the text and its log-probabilities: the device's logits bit for bit
                        r["texts"].append((doc["choices"][0]["text"],
                                           doc["choices"][0]["logprobs"]["token_logprobs"])
                                          if st == 200 else st)
                    st, doc = http_json(srv.port, "GET", "/stats", None, timeout=10)
                    g3_stats = (doc or {}).get("models", {}).get("g3", {}) if st == 200 else {}
                    r["hits"] = g3_stats.get("prefix_hits", -1)
                    r["graphs"] = srv.wait_log(r"event=gpu_graph_captured", timeout=1) is not None
                    swa[(layers, full)] = r
                finally:
                    srv.stop()
        for layers in ("-1", "1"):
            f, w = swa.get((layers, True)), swa.get((layers, False))
            ok = rc == 0 and f is not None and w is not None
            s.case(f"gemma3 gpu_layers {layers}: a sliding part with GPU layers "
                   "(one part with --kv-swa-full)",
                   ok and f["nswa"] == 0 and w["nswa"] > 0,
                   f"{f and f['nswa']} {w and w['nswa']} {err[-300:]}")
            s.case(f"gemma3 gpu_layers {layers}: same greedy text and log-probabilities as every "
                   "position kept, prefix reuse (hits) giving the same, decode graphs",
                   ok and w["texts"] == f["texts"] and w["texts"][0] == w["texts"][1] and
                   isinstance(w["texts"][0], tuple) and len(w["texts"][0][1]) == 60 and
                   w["hits"] > 0 and w["graphs"], f"{f} {w}"[:3000])
finally:
    setenv(**saved)

s.finish()
