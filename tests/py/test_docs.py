#!/usr/bin/env python3
"""test_docs.py - the documentation keeps up with the code it describes.

- README's quick start names every Debian package scripts/deps.sh may install (the build set
  and the --test set), so a user knows what the two set-up commands put on the machine.
- Every long option `sampan serve --help` prints is documented in README.md or docs/*.md.
- Every route the server registers (src/**/*.c: sp_router_add calls) appears in docs/api.md
  or README.md.
"""
import glob
import os
import re

from common import ROOT, Suite, binary, run

s = Suite("docs")

readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
docs = readme + "".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))))

# --- packages: need+=(a b c) and need=(...) lines of scripts/deps.sh
deps = open(os.path.join(ROOT, "scripts", "deps.sh")).read()
pkgs = []
for m in re.finditer(r"need\+?=\(([^)]*)\)", deps):
    pkgs += m.group(1).split()
pkgs = sorted(set(pkgs))
qs = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0] if "## Quick start" in readme else ""
missing = [p for p in pkgs if not re.search(r"(?<![\w.+-])" + re.escape(p) + r"(?![\w.+-])", qs)]
s.case(f"README quick start names the {len(pkgs)} packages scripts/deps.sh installs", pkgs and not missing,
       f"missing: {missing}")

# --- flags of sampan serve
exe = binary()
if exe is None:
    s.skip("serve flags documented", "sampan not built")
else:
    rc, out, err = run([exe, "serve", "--help"])
    flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", out)))
    undoc = [f for f in flags if not re.search(re.escape(f) + r"(?![a-z0-9-])", docs)]
    s.case(f"every one of the {len(flags)} `sampan serve` flags is documented (README.md, docs/)",
           rc == 0 and len(flags) > 20 and not undoc, f"undocumented: {undoc}")

# --- routes
routes = set()
for path in glob.glob(os.path.join(ROOT, "src", "**", "*.c"), recursive=True):
    for m in re.finditer(r'sp_router_add\([^,]+,\s*SP_HTTP_\w+,\s*"([^"]+)"', open(path).read()):
        routes.add(m.group(1))
api = open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8").read() + readme


def documented(route):
    # {name} segments may be spelt {model}, {m}, <model>, MODEL, ... in prose
    pat = re.escape(route)
    pat = re.sub(r"\\\{[^}]*\\\}", r"[^/\\s`]+", pat)
    return re.search(pat + r"(?![\w/])", api) is not None


undoc = sorted(r for r in routes if not documented(r))
s.case(f"every one of the {len(routes)} routes is in docs/api.md or README.md", routes and not undoc,
       f"undocumented: {undoc}")
s.finish()
