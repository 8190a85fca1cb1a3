#!/usr/bin/python3
"""plot_serving.py - `sampan bench --save-result` JSON files to one SVG figure.

    bench/plot_serving.py RESULT.json [RESULT.json ...] [-o serving.svg] [--title TEXT]

Six panels: the distributions (CDFs) of time to first token, inter-token latency and
end-to-end latency of every run, and against concurrency: output tokens/s, TTFT p50 and
p99, and mean time per output token. Runs are grouped into series by their "label" (or
"model_id" when unlabelled); a series' points are its runs at different concurrencies.
Reads the keys of vLLM's benchmark_serving too (ttfts, itls, ...; e2els when present).

Writes SVG directly (no plotting library: the test machine needs none), so the figure
is a text file that diffs and renders in any browser.
"""
import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#17becf", "#7f7f7f", "#bcbd22"]
PW, PH = 360, 250          # one panel's plot area
ML, MR, MT, MB = 62, 16, 30, 44
COLS, ROWS = 3, 2


def load(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        if not isinstance(d, dict) or "ttfts" not in d:
            sys.exit(f"plot_serving: {p}: not a benchmark result (no 'ttfts')")
        d["_path"] = p
        d["_series"] = d.get("label") or d.get("model_id") or os.path.basename(p)
        runs.append(d)
    return runs


def nice_ticks(lo, hi, n=5):
    """About n round tick values covering [lo, hi] (linear)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    t = math.floor(lo / step) * step
    out = []
    while t <= hi + step * 1e-9:
        out.append(t)
        t += step
    return out


def log_ticks(lo, hi):
    out = []
    e = math.floor(math.log10(lo))
    while 10 ** e <= hi * 1.0001:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if lo * 0.9999 <= v <= hi * 1.0001:
                out.append(v)
        e += 1
    return out or [lo, hi]


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


class Panel:
    def __init__(self, svg, col, row, title, xlabel, ylabel):
        self.svg = svg
        self.x0 = col * (PW + ML + MR) + ML
        self.y0 = row * (PH + MT + MB) + MT + 30
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel

    def axes(self, xlo, xhi, ylo, yhi, xlog=False, xticks=None):
        self.xlo, self.xhi, self.ylo, self.yhi, self.xlog = xlo, xhi, ylo, yhi, xlog
        s, x0, y0 = self.svg, self.x0, self.y0
        s.append(f'<rect x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" stroke="#444"/>')
        s.append(f'<text x="{x0 + PW / 2}" y="{y0 - 8}" text-anchor="middle" font-weight="bold">'
                 f'{escape(self.title)}</text>')
        s.append(f'<text x="{x0 + PW / 2}" y="{y0 + PH + 34}" text-anchor="middle">'
                 f'{escape(self.xlabel)}</text>')
        s.append(f'<text transform="translate({x0 - 46},{y0 + PH / 2}) rotate(-90)" '
                 f'text-anchor="middle">{escape(self.ylabel)}</text>')
        for t in xticks or (log_ticks(xlo, xhi) if xlog else nice_ticks(xlo, xhi)):
            if not (xlo <= t <= xhi):
                continue
            x = self.px(t)
            s.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + PH}" stroke="#ddd"/>')
            s.append(f'<text x="{x:.1f}" y="{y0 + PH + 15}" text-anchor="middle" font-size="10">'
                     f'{fmt(t)}</text>')
        for t in nice_ticks(ylo, yhi):
            if not (ylo <= t <= yhi):
                continue
            y = self.py(t)
            s.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PW}" y2="{y:.1f}" stroke="#ddd"/>')
            s.append(f'<text x="{x0 - 5}" y="{y + 3:.1f}" text-anchor="end" font-size="10">'
                     f'{fmt(t)}</text>')

    def px(self, v):
        if self.xlog:
            f = (math.log10(v) - math.log10(self.xlo)) / (math.log10(self.xhi) - math.log10(self.xlo))
        else:
            f = (v - self.xlo) / (self.xhi - self.xlo)
        return self.x0 + max(0.0, min(1.0, f)) * PW

    def py(self, v):
        f = (v - self.ylo) / (self.yhi - self.ylo)
        return self.y0 + PH - max(0.0, min(1.0, f)) * PH

    def line(self, pts, color, dash=None, marker=False):
        if not pts:
            return
        d = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in pts)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.svg.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.6"{extra}/>')
        if marker:
            for x, y in pts:
                self.svg.append(f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="3" fill="{color}"/>')

    def empty(self, why):
        self.axes(0, 1, 0, 1)
        self.svg.append(f'<text x="{self.x0 + PW / 2}" y="{self.y0 + PH / 2}" text-anchor="middle" '
                        f'fill="#888">{escape(why)}</text>')


def cdf_points(values_ms, floor):
    v = sorted(max(x, floor) for x in values_ms)
    n = len(v)
    if n == 0:
        return []
    step = max(1, n // 400)  # at most ~400 vertices per curve
    pts = [(v[i], (i + 1) / n) for i in range(0, n, step)]
    if pts[-1][1] != 1.0:
        pts.append((v[-1], 1.0))
    return [(v[0], 0.0)] + pts


def run_samples(r, key):
    ok = [e == "" for e in r.get("errors", [""] * len(r["ttfts"]))]
    if key == "itl":
        return [x * 1e3 for lst, good in zip(r.get("itls", []), ok) if good for x in lst]
    arr = r.get({"ttft": "ttfts", "e2el": "e2els"}[key], [])
    return [x * 1e3 for x, good in zip(arr, ok) if good]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("-o", "--out", default="serving.svg")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    runs = load(a.results)
    series = []
    for r in runs:
        if r["_series"] not in series:
            series.append(r["_series"])
    color = {s: COLORS[i % len(COLORS)] for i, s in enumerate(series)}
    concs = sorted({int(r.get("max_concurrency") or 1) for r in runs})
    dashes = {c: [None, "6,3", "2,2", "8,3,2,3"][i % 4] for i, c in enumerate(concs)}

    width = COLS * (PW + ML + MR)
    height = ROWS * (PH + MT + MB) + 30 + 20 + 16 * (len(runs) // 3 + 1)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    title = a.title or "sampan bench: " + ", ".join(series)
    svg.append(f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15" '
               f'font-weight="bold">{escape(title)}</text>')

    # Top row: latency CDFs (log x: the tails matter, and ITLs span decades).
    for col, (key, name) in enumerate([("ttft", "Time to first token"),
                                       ("itl", "Inter-token latency"),
                                       ("e2el", "End-to-end latency")]):
        p = Panel(svg, col, 0, name + " (CDF)", "ms (log scale)", "fraction of samples")
        data = [(r, run_samples(r, key)) for r in runs]
        allv = [x for _, v in data for x in v if x > 0]
        if not allv:
            p.empty("no samples" if key != "e2el" else "no e2els in these results")
            continue
        floor = max(min(allv), 1e-3)
        lo = 10 ** math.floor(math.log10(floor))
        hi = 10 ** math.ceil(math.log10(max(allv) * 1.0001))
        p.axes(lo, hi, 0, 1, xlog=True)
        for r, v in data:
            c = int(r.get("max_concurrency") or 1)
            p.line(cdf_points(v, floor), color[r["_series"]], dashes[c])

    # Bottom row: against concurrency, one line per series.
    def by_series(fn):
        out = {}
        for r in runs:
            out.setdefault(r["_series"], []).append((int(r.get("max_concurrency") or 1), fn(r)))
        return {s: sorted(v) for s, v in out.items()}

    clo, chi = concs[0], concs[-1]
    if clo == chi:
        clo, chi = max(clo / 2, 0.5), chi * 2
    xl = "concurrent streams (log scale)"
    panels = [
        ("Output throughput", "output tokens/s", [("", lambda r: r.get("output_throughput", 0), None)]),
        ("Time to first token", "ms (solid p50, dashed p99)",
         [("p50", lambda r: r.get("median_ttft_ms", 0), None),
          ("p99", lambda r: r.get("p99_ttft_ms", 0), "6,3")]),
        ("Time per output token", "ms (mean)", [("", lambda r: r.get("mean_tpot_ms", 0), None)]),
    ]
    for col, (name, ylabel, curves) in enumerate(panels):
        p = Panel(svg, col, 1, name, xl, ylabel)
        ymax = max((fn(r) or 0) for _, fn, _ in curves for r in runs) or 1
        p.axes(clo, chi, 0, ymax * 1.1, xlog=True, xticks=concs)
        for _, fn, dash in curves:
            for s, pts in by_series(fn).items():
                p.line(pts, color[s], dash, marker=True)

    # Legend: colour = series, dash = concurrency (CDF panels).
    y = ROWS * (PH + MT + MB) + 30 + 14
    x = ML
    for s in series:
        svg.append(f'<rect x="{x}" y="{y - 9}" width="14" height="10" fill="{color[s]}"/>')
        svg.append(f'<text x="{x + 18}" y="{y}">{escape(str(s))}</text>')
        x += 30 + 7 * len(str(s))
    for c in concs:
        d = dashes[c]
        extra = f' stroke-dasharray="{d}"' if d else ""
        svg.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 26}" y2="{y - 4}" stroke="#333" '
                   f'stroke-width="1.6"{extra}/>')
        svg.append(f'<text x="{x + 30}" y="{y}">c={c}</text>')
        x += 70
    y += 16
    for r in runs:
        svg.append(f'<text x="{ML}" y="{y}" font-size="10" fill="#555">'
                   f'{escape(os.path.basename(r["_path"]))}: {escape(str(r["_series"]))}, '
                   f'c={r.get("max_concurrency")}, {r.get("completed")} requests, '
                   f'{r.get("output_throughput", 0):.1f} tok/s, date {escape(str(r.get("date")))}'
                   f'</text>')
        y += 14
    svg.append("</svg>")
    # The height reserved for the run lines may be short for many runs: fix it up.
    svg[0] = svg[0].replace(f'height="{height}"', f'height="{max(height, y + 6)}"')
    svg[1] = svg[1].replace(f'height="{height}"', f'height="{max(height, y + 6)}"')
    with open(a.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"plot_serving: wrote {a.out} ({len(runs)} runs)")


if __name__ == "__main__":
    main()
