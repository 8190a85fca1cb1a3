"""test_liveness.py - one expensive request never holds the event loop, and limits answer 400.

- a 0.4 MB json_schema (9,999 required properties) and a 7.8 MB chat are prepared off the
  loop: while each runs, /live probes (one loop thread, the default) answer within 100 ms
  (a liveness bound, not a speed target: the work itself used to hold the loop for seconds);
- both answer 400 naming the limit they exceed (the grammar's rules, the template's output),
  not 413 (that one is for a body over --max-body-bytes);
- a grammar over the matcher's limits answers 400 with code limit_exceeded;
- a client that disconnects while its request is being prepared leaves the server serving
  (run with SAMPAN_BIN=build-san/sampan for the use-after-free check under ASan).
"""
import json
import socket
import threading
import time

from common import Server, Suite, binary, http_json

s = Suite("liveness")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()

PROBE_MS = 100


def big_schema(n=9999):
    props = {f"p{i:04d}": {"type": "integer"} for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)}


def big_chat_body():
    text = "lorem ipsum dolor sit amet " * (7_800_000 // 27)
    return {"model": "stories260K", "max_tokens": 4,
            "messages": [{"role": "user", "content": text}]}


def probe_while(port, fn):
    """Run fn() in a thread and probe GET /live until it returns (at most 60 s); returns
    (fn's result, latencies of the probes in ms)."""
    out = {}

    def job():
        try:
            out["r"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the case
            out["r"] = ("exception", repr(e))

    t = threading.Thread(target=job)
    t.start()
    lat = []
    end = time.time() + 60
    while t.is_alive() and time.time() < end and len(lat) < 5000:
        t0 = time.perf_counter()
        st, _ = http_json(port, "GET", "/live", timeout=10)
        lat.append((time.perf_counter() - t0) * 1000 if st == 200 else 1e9)
        time.sleep(0.01)
    t.join(60)
    return out.get("r"), lat


def post_raw(port, path, body, timeout=60):
    """POST a pre-encoded JSON body; (status, parsed answer)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw
    finally:
        c.close()


def err_of(b):
    return b.get("error", {}) if isinstance(b, dict) else {}


srv = Server()
P = srv.port
try:
    schema_body = json.dumps({"model": "stories260K", "max_tokens": 4,
                              "messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "big",
                                                                  "schema": big_schema()}}}).encode()
    (st, b), lat = probe_while(P, lambda: post_raw(P, "/v1/chat/completions", schema_body))
    s.case("9,999-property schema (%d KB): /live answers within %d ms while it compiles"
           % (len(schema_body) // 1024, PROBE_MS),
           len(lat) > 0 and max(lat) < PROBE_MS, f"{len(lat)} probes, max {max(lat or [0]):.1f} ms")
    e = err_of(b)
    s.case("9,999-property schema: 400 naming the grammar's limit (not 413)",
           st == 400 and e.get("code") == "limit_exceeded" and "more than" in e.get("message", ""),
           f"{st} {str(b)[:300]}")

    chat_body = json.dumps(big_chat_body()).encode()
    (st, b), lat = probe_while(P, lambda: post_raw(P, "/v1/chat/completions", chat_body))
    s.case("7.8 MB chat: /live answers within %d ms while it renders" % PROBE_MS,
           len(lat) > 0 and max(lat) < PROBE_MS, f"{len(lat)} probes, max {max(lat or [0]):.1f} ms")
    e = err_of(b)
    s.case("7.8 MB chat: 400 naming the template's output limit (not 413)",
           st == 400 and e.get("code") == "limit_exceeded" and "output" in e.get("message", ""),
           f"{st} {str(b)[:300]}")

    # A grammar whose start state holds more stacks than the matcher allows.
    alts = " | ".join(f'"w{i}"' for i in range(5000))
    st, b = http_json(P, "POST", "/v1/completions",
                      {"model": "stories260K", "prompt": "Once", "max_tokens": 2,
                       "grammar": f"root ::= {alts}\n"})
    e = err_of(b)
    s.case("grammar over the matcher's limits: 400 limit_exceeded (not 413)",
           st == 400 and e.get("code") == "limit_exceeded" and e.get("param") == "grammar",
           f"{st} {str(b)[:300]}")

    # Clients that leave while their request is being prepared.
    for k in range(3):
        so = socket.create_connection(("127.0.0.1", P), timeout=10)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(chat_body)}\r\n\r\n").encode()
        so.sendall(head + chat_body)
        time.sleep(0.05 * k)
        so.close()
    time.sleep(0.5)
    st, b = http_json(P, "POST", "/v1/chat/completions",
                      {"model": "stories260K", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "Once"}]})
    s.case("clients that left during preparation: the server still answers", st == 200, f"{st} {str(b)[:200]}")
    st, _ = http_json(P, "GET", "/live")
    s.case("/live after them", st == 200)
finally:
    rc = srv.stop()
s.case("server exits cleanly", rc == 0, f"exit {rc} {srv.text()[-800:] if rc else ''}")
s.finish()
