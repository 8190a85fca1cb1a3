"""test_status_page.py - GET /, the status page (src/api/status_page.html, embedded at
build time by tools/embed.py), on a `sampan serve` on 127.0.0.1 (free port).

HTTP part (always): the headers (HTML, a strict Content-Security-Policy whose script and style
hashes match the page, nosniff, no-cache), HEAD, no URL to any other host and nothing loaded
from elsewhere (no CDN, no font, no external script or stylesheet).

Browser part (when Debian's `chromium` is installed; scripts/deps.sh --test installs it, and
without it the part is skipped with a visible line): headless Chromium loads the page after some
completions, lets it poll /stats a few times (--virtual-time-budget) and dumps the DOM, which
must show the model and its state, the cpu device and the very numbers /stats gives (the
page puts the raw value of every figure in a data-value attribute); a model whose name is
markup must show as text; the page must log no CSP violation or script error. Then a
screenshot (1280x900 PNG, not blank) while traffic runs. With --api-key the page must ask for
the key. Keep the screenshot with SAMPAN_KEEP_SCREENSHOT=1 (its path is printed). Last line:
    status-page: N passed, N failed, N skipped"""
import base64
import hashlib
import html.parser
import http.client
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading

from common import ROOT, Suite, binary, Server

s = Suite("status-page")
exe = binary()
MODEL = os.path.join(ROOT, "models", "stories260K.gguf")
NAME = "stories260K"
# A second model whose name is markup (no space, '"', '/', '\\' or '=': valid for --model
# NAME=FILE): the page must show these characters as text and create no element from them.
EVIL = "<b>&amp;'x<script>"
KEY = "status-page-key"


def req(port, method, path, body=None, headers=None, timeout=30):
    """One request: (status, headers dict (lower-case), body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        h = {"Content-Type": "application/json"} if data else {}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def stats(port, headers=None):
    st, _, b = req(port, "GET", "/stats", headers=headers)
    return json.loads(b) if st == 200 else None


def complete(port, model, n=24):
    return req(port, "POST", "/v1/completions",
               {"model": model, "prompt": "Once upon a time", "max_tokens": n, "temperature": 0})[0]


# ---------------------------------------------------------------- DOM dump parsing

class Dom(html.parser.HTMLParser):
    """Every element of a --dump-dom with its attributes, its text (descendants included)
    and its ancestors, enough to ask "the cell of field F in the row of model M"."""
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
            "track", "wbr"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.els, self.open = [], []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": [], "up": [x["i"] for x in self.open],
             "i": len(self.els)}
        self.els.append(e)
        if tag not in self.VOID:
            self.open.append(e)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID and self.open:
            self.open.pop()

    def handle_endtag(self, tag):
        for k in range(len(self.open) - 1, -1, -1):
            if self.open[k]["tag"] == tag:
                del self.open[k:]
                break

    def handle_data(self, data):
        for e in self.open:
            e["text"].append(data)

    def find(self, within=None, tag=None, **attrs):
        """Elements (of this tag) whose attributes have these values (None: present with
        any value); within: only descendants of that element. Attribute names use _ for - (class_: class)."""
        out = []
        for e in self.els:
            if within is not None and within["i"] not in e["up"]:
                continue
            if tag is not None and e["tag"] != tag:
                continue
            names = {a: a.rstrip("_").replace("_", "-") for a in attrs}  # class_ -> class
            if all((names[a] in e["attrs"]) if v is None else e["attrs"].get(names[a]) == v
                   for a, v in attrs.items()):
                out.append(e)
        return out

    def one(self, within=None, tag=None, **attrs):
        found = self.find(within, tag, **attrs)
        return found[0] if found else None

    @staticmethod
    def text(e):
        return "".join(e["text"]).strip() if e else None


# ---------------------------------------------------------------- Chromium

def chromium():
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return None


def browse(url, tmp, mode, budget_ms=5000):
    """Headless Chromium on url; mode is ["--dump-dom"] or ["--screenshot=FILE"]. Returns
    (returncode, stdout, console lines). --virtual-time-budget lets the page's timers run
    (and poll /stats) for budget_ms of virtual time before the dump or the screenshot."""
    env = dict(os.environ, HOME=tmp, XDG_CONFIG_HOME=tmp, XDG_CACHE_HOME=tmp)
    args = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--hide-scrollbars", "--mute-audio", f"--user-data-dir={tmp}/profile",
            "--enable-logging=stderr", "--v=0", "--window-size=1280,900",
            f"--virtual-time-budget={budget_ms}", *mode, url]
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
    except subprocess.TimeoutExpired:
        return -9, "", ["chromium timed out"]
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    return r.returncode, r.stdout, console


def png_size(path):
    """(width, height) of a PNG file, None if it is not one."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


# ---------------------------------------------------------------- HTTP checks

def http_checks(port):
    st, h, body = req(port, "GET", "/")
    s.case("GET / is 200 text/html; charset=utf-8",
           st == 200 and h.get("content-type") == "text/html; charset=utf-8",
           f"{st} {h.get('content-type')}")
    s.case("GET /: X-Content-Type-Options: nosniff", h.get("x-content-type-options") == "nosniff",
           h.get("x-content-type-options"))
    s.case("GET /: Cache-Control: no-cache", h.get("cache-control") == "no-cache",
           h.get("cache-control"))
    csp = h.get("content-security-policy", "")
    dirs = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    s.case("GET /: CSP default-src is 'none' or 'self'",
           dirs.get("default-src") in (["'none'"], ["'self'"]), csp)
    s.case("GET /: CSP has no 'unsafe-inline' or 'unsafe-eval' and no other origin",
           csp and "unsafe" not in csp and "http" not in csp and "*" not in csp, csp)
    s.case("GET /: CSP connect-src 'self' (the /stats poll)", dirs.get("connect-src") == ["'self'"],
           csp)
    page = body.decode("utf-8", "replace")
    for tag in ("script", "style"):
        blocks = re.findall(r"<%s>(.*?)</%s>" % (tag, tag), page, re.S)
        want = sorted("'sha256-%s'" % base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()
                      for b in blocks)
        s.case(f"GET /: CSP {tag}-src allows exactly the page's inline {tag} (by hash)",
               blocks and sorted(dirs.get(f"{tag}-src", [])) == want,
               f"{len(blocks)} blocks, {dirs.get(f'{tag}-src')}")
    urls = re.findall(r"https?://[^\s\"'<>)]*", page, re.I)
    s.case("GET /: no http(s) URL at all in the page (no CDN)", not urls, urls[:5])
    ext = re.findall(r"<script[^>]*\bsrc\s*=|<link[^>]*stylesheet|@import|url\(\s*['\"]?(?!data:)"
                     r"|<iframe|<img[^>]*\bsrc\s*=|@font-face", page, re.I)
    s.case("GET /: nothing loaded from elsewhere (script src, stylesheet, import, url(), font)",
           not ext, ext[:5])
    s.case("GET /: small and self-contained (< 256 KiB, ends with </html>)",
           0 < len(body) < 256 * 1024 and page.rstrip().endswith("</html>"), len(body))
    st2, h2, b2 = req(port, "HEAD", "/")
    s.case("HEAD / is 200 with the same Content-Length and no body",
           st2 == 200 and h2.get("content-length") == str(len(body)) and b2 == b"",
           f"{st2} {h2.get('content-length')} {len(b2)}")
    st3, _, _ = req(port, "GET", "/?interval=1")
    s.case("GET /?interval=1 (the page's own parameter) is 200", st3 == 200, st3)
    st4, _, _ = req(port, "POST", "/", {})
    s.case("POST / is 405", st4 == 405, st4)
    return page


# ---------------------------------------------------------------- browser checks

def dom_checks(port, tmp):
    """The page after a few polls, against /stats read right after (no traffic in between)."""
    rc, out, console = browse(f"http://127.0.0.1:{port}/?interval=0.5", tmp, ["--dump-dom"], 4000)
    st = stats(port)
    s.case("chromium --dump-dom ran", rc == 0 and "<body" in out, f"rc={rc} {len(out)} bytes")
    dom = Dom(out)
    body = dom.one(data_status=None)
    s.case("page fetched /stats (body data-status=ok, data-samples >= 2)",
           body and body["attrs"].get("data-status") == "ok"
           and int(body["attrs"].get("data-samples", "0")) >= 2,
           body and body["attrs"])
    bad = [c for c in console if re.search(r"Content.Security.Policy|Uncaught|Error", c)]
    s.case("no CSP violation or script error in the console", not bad, bad[:3])
    m = st["models"][NAME]
    row = dom.one(data_model=NAME)
    s.case(f"models table has a row for {NAME}", row is not None)
    if row is None:
        return
    name = dom.one(row, data_field="name")
    s.case("row shows the model name", Dom.text(name) == NAME, Dom.text(name))
    want_state = "READY"
    for e in st.get("registry") or []:
        if e.get("name") == NAME and str(e.get("version")) == str(m.get("version")):
            want_state = e.get("state")
    state = dom.one(row, data_field="state")
    s.case(f"row shows state {want_state}", Dom.text(state) == want_state, Dom.text(state))
    ver = dom.one(row, data_field="version")
    s.case("row shows the version", Dom.text(ver) == str(m["version"]), Dom.text(ver))
    for field in ("tokens_generated", "memory_bytes", "instances", "kv_blocks_used"):
        cell = dom.one(row, data_field=field)
        got = cell and cell["attrs"].get("data-value")
        s.case(f"row's {field} is /stats' ({m.get(field)})", got == str(m.get(field)),
               f"page {got}")
    tok = dom.one(row, data_field="tokens_generated")
    s.case("tokens_generated is shown grouped (e.g. 1,234)",
           Dom.text(tok) == f"{m['tokens_generated']:,}", Dom.text(tok))
    evil = dom.one(data_model=EVIL)
    s.case("a model named like markup has its row, its name shown as text",
           evil is not None and Dom.text(dom.one(evil, data_field="name")) == EVIL,
           evil and Dom.text(dom.one(evil, data_field="name")))
    s.case("... and no element was made from it (no <b>, one <script>)",
           not dom.find(tag="b") and len(dom.find(tag="script")) == 1)
    dev = dom.one(data_device="cpu")
    d = next((x for x in st.get("devices", []) if x.get("id") == "cpu"), None)
    s.case("devices table has a row for cpu", dev is not None and d is not None)
    if dev is not None and d is not None:
        s.case("device kind cpu", Dom.text(dom.one(dev, data_field="kind")) == "cpu")
        for field in ("reserved_bytes", "budget_bytes", "total_bytes"):
            cell = dom.one(dev, data_field=field)
            got = cell and cell["attrs"].get("data-value")
            s.case(f"device {field} is /stats' ({d.get(field)})", got == str(d.get(field)),
                   f"page {got}")
        s.case("device bar has the 80%-of-budget marker", bool(dom.find(dev, class_="mark")))
    q = dom.one(data_queue=NAME)
    s.case(f"queues table has a row for {NAME} with the three tiers",
           q is not None and all(dom.one(q, data_field=t) for t in ("premium", "standard", "batch")))
    sv = st.get("server")
    if isinstance(sv, dict) and isinstance(sv.get("version"), str):
        got = Dom.text(dom.one(id="server-version"))
        s.case("header shows the server version", got == sv["version"], got)
    else:
        s.skip("header shows the server version", "/stats has no server.version yet")
    reg = st.get("registry")
    if isinstance(reg, list):
        missing = [e for e in reg if not any(
            Dom.text(dom.one(r, data_field="state")) == e.get("state")
            for r in dom.find(data_model=e.get("name"), data_version=str(e.get("version"))))]
        s.case("every registry entry has a row with its state", not missing, missing[:3])
    else:
        s.skip("every registry entry has a row with its state", "/stats has no registry yet")
    spark = dom.find(row, class_="cellspark")
    s.case("row has a tokens/s sparkline (inline SVG)",
           spark and dom.find(spark[0], tag="svg") and dom.find(spark[0], tag="path"))


def screenshot_check(port, tmp):
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            try:
                complete(port, NAME, 48)
            except OSError:
                return

    threads = [threading.Thread(target=traffic, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    shot = os.path.join(tmp, "status.png")
    try:
        rc, _, console = browse(f"http://127.0.0.1:{port}/?interval=0.5", tmp,
                                [f"--screenshot={shot}"], 8000)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    size = os.path.getsize(shot) if os.path.exists(shot) else 0
    s.case("chromium --screenshot wrote a PNG", rc == 0 and size > 0, f"rc={rc} {size} bytes")
    s.case("screenshot is 1280x900", png_size(shot) == (1280, 900) if size else False,
           png_size(shot) if size else None)
    # A blank 1280x900 page compresses to a few KB; tables, text and charts do not.
    s.case("screenshot is not blank (> 20 KB)", size > 20 * 1024, f"{size} bytes")
    bad = [c for c in console if re.search(r"Content.Security.Policy|Uncaught|Error", c)]
    s.case("no CSP violation or script error while screenshotting", not bad, bad[:3])
    if KEEP:
        print(f"     screenshot kept: {shot}", flush=True)


def key_checks(tmp):
    k = Server("--api-key", KEY)
    try:
        st, _, _ = req(k.port, "GET", "/stats")
        s.case("with --api-key, /stats without the key is 401", st == 401, st)
        st, _, _ = req(k.port, "GET", "/", headers={"Authorization": f"Bearer {KEY}"})
        s.case("with --api-key, GET / with the key is 200", st == 200, st)
        st, _, _ = req(k.port, "GET", "/")
        if st != 200:
            s.skip("browser: the page asks for the API key",
                   f"GET / without the key is {st}: serve.c's is_public() does not list \"/\"")
            return
        if BROWSER is None:
            s.skip("browser: the page asks for the API key", "chromium not installed")
            return
        rc, out, _ = browse(f"http://127.0.0.1:{k.port}/", tmp, ["--dump-dom"], 3000)
        dom = Dom(out)
        body = dom.one(data_status=None)
        form = dom.one(id="auth")
        s.case("browser: /stats is 401, the page says so (data-status=auth)",
               body is not None and body["attrs"].get("data-status") == "auth",
               body and body["attrs"])
        s.case("browser: ... and shows the key field", form is not None and
               "hidden" not in form["attrs"] and dom.one(form, id="auth-key") is not None)
    finally:
        s.case("key server exits 0", k.stop() == 0)


# ---------------------------------------------------------------- main

if exe is None:
    s.skip("all", "build/sampan not built")
    s.finish()

def main_server(tmp):
    srv = Server("--model", f"{EVIL}={MODEL}")
    try:
        s.guard("http", http_checks, srv.port)
        codes = [complete(srv.port, NAME) for _ in range(4)] + [complete(srv.port, EVIL)]
        s.case("traffic: 5 completions are 200", codes == [200] * 5, codes)
        if BROWSER is None:
            s.skip("browser: DOM and screenshot",
                   "chromium not installed (Debian package `chromium`; scripts/deps.sh --test)")
        else:
            s.guard("browser: DOM", dom_checks, srv.port, tmp)
            s.guard("browser: screenshot", screenshot_check, srv.port, tmp)
    finally:
        s.case("server exits 0", srv.stop() == 0)


BROWSER = chromium()
KEEP = os.environ.get("SAMPAN_KEEP_SCREENSHOT") == "1"
tmp = tempfile.mkdtemp(prefix="sampan-status-")
try:
    s.guard("server", main_server, tmp)
    s.guard("api key", key_checks, tmp)
finally:
    if not KEEP:
        shutil.rmtree(tmp, ignore_errors=True)
s.finish()
