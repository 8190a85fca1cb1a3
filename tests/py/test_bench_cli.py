"""test_bench_cli.py - `sampan bench` against a real `sampan serve` (demo model, free port):
the result JSON has vLLM's keys and its counts add up, chat works, errors (unknown model,
no server, bad flags) are clear and exit non-zero, --max-seconds bounds a run, and
bench/plot_serving.py turns the results into a well-formed SVG. A few seconds in all."""
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

from common import ROOT, Suite, binary, run, Server, free_port

s = Suite("bench_cli")
exe = binary()
MODEL = os.path.join(ROOT, "models", "stories260K.gguf")

KEYS = ["date", "backend", "model_id", "num_prompts", "request_rate", "max_concurrency", "duration",
        "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
        "errors"] + [f"{st}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                     for st in ("mean", "median", "std", "p99")]


def bench(url, *args, timeout=30):
    return run([exe, "bench", "--url", url, "--no-progress", *args], timeout=timeout)


def main_cases(srv, tmp):
    url = f"http://127.0.0.1:{srv.port}"
    out = os.path.join(tmp, "c4.json")
    t = time.time()
    rc, _, err = bench(url, "--concurrency", "4", "--num-prompts", "8", "--output-tokens", "16",
                       "--prompt-tokens", "24", "--shared-prefix", "16", "--label", "sampan",
                       "--save-result", out)
    s.case("completions: exit 0", rc == 0, err.strip().splitlines()[-1] if rc else "")
    s.case("completions: summary on stderr", "Serving Benchmark Result" in err and
           re.search(r"Successful requests:\s+8\b", err) is not None)
    d = json.load(open(out))
    missing = [k for k in KEYS if k not in d]
    s.case("json: vLLM keys present", not missing, f"missing {missing}")
    s.case("json: settings", d["num_prompts"] == 8 and d["max_concurrency"] == 4 and
           d["model_id"] == "stories260K" and d["request_rate"] == "inf" and d["backend"] == "openai",
           str({k: d[k] for k in ("num_prompts", "max_concurrency", "model_id", "request_rate")}))
    s.case("json: every request completed", d["completed"] == 8 and d["failed"] == 0 and
           d["errors"] == [""] * 8, f"completed {d['completed']}, errors {set(d['errors'])}")
    lens_ok = all(len(d[k]) == 8 for k in ("input_lens", "output_lens", "ttfts", "itls", "errors"))
    s.case("json: one entry per request", lens_ok)
    s.case("json: exactly 16 tokens each (ignore_eos)", d["output_lens"] == [16] * 8,
           str(d["output_lens"]))
    s.case("json: totals add up", d["total_output_tokens"] == sum(d["output_lens"]) == 128 and
           d["total_input_tokens"] == sum(d["input_lens"]) and
           d["total_input_tokens"] >= 8 * 24,
           f"in {d['total_input_tokens']} out {d['total_output_tokens']}")
    ttfts, e2els = d["ttfts"], d["e2els"]
    s.case("json: 0 < ttft <= e2el < wall time",
           all(0 < a <= b < time.time() - t + 1 for a, b in zip(ttfts, e2els)))
    n_itl = sum(len(x) for x in d["itls"])
    s.case("json: up to 15 ITLs per request, none negative",
           all(len(x) <= 15 and min(x, default=0) >= 0 for x in d["itls"]) and n_itl > 0,
           f"{n_itl} ITLs")
    mean = sum(ttfts) / 8 * 1e3
    s.case("json: stats match the samples", abs(d["mean_ttft_ms"] - mean) < 1e-3 * max(1, mean) and
           d["median_ttft_ms"] <= d["p99_ttft_ms"] <= max(ttfts) * 1e3 + 1e-6 and
           abs(d["output_throughput"] * d["duration"] - 128) < 1e-3,
           f"mean {d['mean_ttft_ms']:.3f} vs {mean:.3f}")

    chat = os.path.join(tmp, "chat.json")
    rc, _, err = bench(url, "--endpoint", "chat", "--concurrency", "2", "--num-prompts", "2",
                       "--output-tokens", "4", "--prompt-tokens", "8", "--label", "chat",
                       "--save-result", chat)
    d2 = json.load(open(chat)) if rc == 0 else {}
    s.case("chat: exit 0, 2 completed, 4 tokens each",
           rc == 0 and d2["completed"] == 2 and d2["output_lens"] == [4, 4] and
           d2["backend"] == "openai-chat", err.strip().splitlines()[-1] if rc else "")

    bad = os.path.join(tmp, "bad.json")
    rc, _, err = bench(url, "--model", "nope", "--num-prompts", "3", "--concurrency", "2",
                       "--output-tokens", "4", "--save-result", bad)
    d3 = json.load(open(bad)) if os.path.exists(bad) else {}
    s.case("unknown model: exit 1, 404 counted and printed",
           rc == 1 and d3.get("failed") == 3 and d3.get("completed") == 0 and
           "HTTP 404" in err and all("404" in e for e in d3.get("errors", [])), err[-300:])

    cut = os.path.join(tmp, "cut.json")
    t = time.time()
    rc, _, err = bench(url, "--num-prompts", "64", "--concurrency", "2", "--output-tokens", "400",
                       "--max-seconds", "0.3", "--save-result", cut)
    took = time.time() - t
    d4 = json.load(open(cut)) if os.path.exists(cut) else {}
    total = sum(d4.get(k, 0) for k in ("completed", "failed", "cut_off", "not_started"))
    s.case("--max-seconds: stops in time, counts add up",
           took < 5 and total == 64 and d4.get("not_started", 0) > 0 and d4.get("failed") == 0 and
           len(d4.get("ttfts", [])) == 64 - d4.get("not_started", 0),
           f"{took:.2f} s, {str({k: d4.get(k) for k in ('completed', 'cut_off', 'not_started')})}")

    svg = os.path.join(tmp, "serving.svg")
    rc, o, e = run([sys.executable, os.path.join(ROOT, "bench", "plot_serving.py"), out, chat, "-o",
                    svg], timeout=30)
    ok = rc == 0 and os.path.exists(svg)
    if ok:
        root = ET.parse(svg).getroot()
        ok = root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) >= 6
    s.case("plot_serving.py: an SVG with the curves", ok, (o + e)[-300:])


class FakeServer:
    """A minimal HTTP server on a thread: answers GET /v1/models, then each POST with
    `mode`: "json" (200 without events), "silent" (never answers), "endless" (an SSE line
    that never ends), "split" (a valid stream cut into 1-byte writes)."""

    def __init__(self, mode):
        self.mode = mode
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.ls.settimeout(0.2)
        self.port = self.ls.getsockname()[1]
        self.stop_flag = False
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self):
        while not self.stop_flag:
            try:
                c, _ = self.ls.accept()
            except OSError:
                continue
            threading.Thread(target=self.conn, args=(c,), daemon=True).start()

    def conn(self, c):
        c.settimeout(10)
        try:
            while not self.stop_flag:
                d = b""
                while b"\r\n\r\n" not in d:
                    x = c.recv(65536)
                    if not x:
                        return
                    d += x
                head, _, rest = d.partition(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                while len(rest) < n:
                    rest += c.recv(65536)
                if head.startswith(b"GET"):
                    body = b'{"data":[{"id":"m"}]}'
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                elif self.mode == "json":
                    body = b'{"choices":[{"text":"hi"}]}'
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                elif self.mode == "silent":
                    time.sleep(5)
                    return
                elif self.mode == "endless":
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: ")
                    for _ in range(2048):  # 2 MiB, over the 1 MiB line bound
                        c.sendall(b"x" * 1024)
                    return
                else:  # split: 3 tokens and usage, close-delimited, one byte per write
                    ev = b"".join(b'data: {"choices":[{"text":"t%d"}]}\n\n' % i for i in range(3))
                    ev += (b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}'
                           b'\n\ndata: [DONE]\n\n')
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                              b"Connection: close\r\n\r\n")
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    for i in range(len(ev)):
                        c.sendall(ev[i:i + 1])
                    return
        except OSError:
            pass
        finally:
            c.close()

    def stop(self):
        self.stop_flag = True
        self.ls.close()


def fake_server_cases(tmp):
    for mode, args, want_rc, needle in (
            ("json", [], 1, "without server-sent events"),
            ("silent", ["--timeout", "0.5"], 1, "no data from the server for 0.5 s"),
            ("endless", [], 1, "over 1048576 bytes"),
            ("split", [], 0, "Successful requests:")):
        f = FakeServer(mode)
        out = os.path.join(tmp, f"fake-{mode}.json")
        t = time.time()
        rc, _, err = bench(f"http://127.0.0.1:{f.port}", "--num-prompts", "2", "--concurrency", "2",
                           "--output-tokens", "3", "--save-result", out, *args, timeout=20)
        took = time.time() - t
        f.stop()
        ok = rc == want_rc and needle in err and took < 5
        if ok and mode == "split":
            d = json.load(open(out))
            ok = d["completed"] == 2 and d["output_lens"] == [3, 3] and d["input_lens"] == [5, 5] \
                and all(len(x) == 2 for x in d["itls"])
        s.case(f"hostile server ({mode}): exit {want_rc}, clear message, bounded", ok,
               f"rc {rc}, {took:.1f} s: " + err.strip()[-160:])


def no_server_cases():
    url = f"http://127.0.0.1:{free_port()}"
    t = time.time()
    rc, _, err = bench(url, "--num-prompts", "4", "--concurrency", "4")
    s.case("no server: exit 1 at once with a clear message",
           rc == 1 and time.time() - t < 5 and "cannot connect" in err and "refused" in err,
           err.strip()[-200:])
    for args, why in ((["--concurrency", "0"], "range"), (["--endpoint", "embeddings"], "endpoint"),
                      (["--url", "https://x"], "https"), (["--shared-prefix", "80"], "prefix > prompt"),
                      (["--goodput", "ttft"], "goodput"), (["--bogus"], "unknown")):
        rc, _, err = run([exe, "bench", "--url", url, *args], timeout=10)
        s.case(f"bad usage ({why}): exit 2 with a message", rc == 2 and "sampan bench:" in err,
               err.strip()[:200])


if exe is None:
    s.skip("bench", "build/sampan is not built")
else:
    no_server_cases()
    srv = None
    try:
        srv = Server()
        with tempfile.TemporaryDirectory(prefix="sampan-bench-") as tmp:
            s.guard("bench against sampan serve", main_cases, srv, tmp)
            s.guard("bench against hostile servers", fake_server_cases, tmp)
    except Exception as ex:  # a server that does not start fails the suite, not the runner
        s.case("sampan serve starts", False, str(ex))
    finally:
        if srv is not None:
            srv.stop()
s.finish()
