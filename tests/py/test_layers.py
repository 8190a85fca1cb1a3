"""test_layers.py - the two layer checks fail on what they are meant to catch.

scripts/check-includes.sh and scripts/check-cycles.py run on the real tree at the start of every
test run (tests/run.sh); this suite proves each one fails on a small tree that breaks its rule
(a forbidden #include, a private header from another folder, two objects calling each other,
two folders using each other) and passes on one that keeps it."""
import os
import shutil
import subprocess
import tempfile

from common import ROOT, Suite

s = Suite("layers")
INC = os.path.join(ROOT, "scripts", "check-includes.sh")
CYC = os.path.join(ROOT, "scripts", "check-cycles.py")


def tree(files):
    d = tempfile.mkdtemp(prefix="sp-layers-")
    for path, text in files.items():
        p = os.path.join(d, path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    return d


def includes(files):
    d = tree(files)
    try:
        r = subprocess.run(["bash", INC, d], capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr
    finally:
        shutil.rmtree(d)


def cycles(files):
    """Compiles each src/**.c of files to an object under build/ and runs check-cycles on it."""
    d = tree(files)
    try:
        for path in files:
            if path.endswith(".c"):
                obj = os.path.join(d, "build", path[:-2] + ".o")
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                subprocess.run(["cc", "-c", "-o", obj, os.path.join(d, path)], check=True,
                               timeout=60)
        r = subprocess.run(["python3", CYC, os.path.join(d, "build")], capture_output=True,
                           text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr
    finally:
        shutil.rmtree(d)


rc, out = includes({"src/core/a.c": '#include "core/a.h"\n', "src/engine/b.c": '#include "core/a.h"\n'
                    '#include "kernels/kernels.h"\n'})
s.case("includes: a tree that keeps the table passes", rc == 0 and "ok" in out, out)
rc, out = includes({"src/sched/s.c": '#include "http/http.h"\n'})
s.case("includes: sched including http fails, naming file and line",
       rc == 1 and "src/sched/s.c:1" in out and "http/http.h" in out, out)
rc, out = includes({"src/core/c.c": '#include <stdio.h>\n#include "engine/model.h"\n'})
s.case("includes: core including engine fails", rc == 1 and "src/core/c.c:2" in out, out)
rc, out = includes({"src/engine/g.c": '#include "text/tokenizer_impl.h"\n'})
s.case("includes: another folder's private header fails", rc == 1 and "private header" in out, out)
rc, out = includes({"src/engine/k.c": '#include "kernels/cpu/cpu_impl.h"\n'})
s.case("includes: kernels/cpu from the engine fails", rc == 1 and "kernels/cpu" in out, out)
rc, out = includes({"src/newfloor/n.c": '#include "core/a.h"\n'})
s.case("includes: a folder missing from the table fails", rc == 1 and "not in the layer table" in out,
       out)

if shutil.which("cc") is None or shutil.which("nm") is None:
    s.skip("cycles", "no cc or nm")
else:
    rc, out = cycles({"src/a/x.c": "int y(void); int x(void) { return y(); }\n",
                      "src/a/y.c": "int y(void) { return 1; }\n",
                      "src/b/z.c": "int x(void); int z(void) { return x(); }\n"})
    s.case("cycles: a call graph without circles passes", rc == 0 and "no circle" in out, out)
    rc, out = cycles({"src/a/x.c": "int y(void); int x(void) { return y(); }\n",
                      "src/a/y.c": "int x(void); int y(void) { return x(); }\n"})
    s.case("cycles: two objects calling each other fail, naming both and a symbol",
           rc == 1 and "src/a/x -> src/a/y  (y)" in out and "src/a/y -> src/a/x  (x)" in out, out)
    rc, out = cycles({"src/a/x.c": "int z(void); int x(void) { return z(); }\n",
                      "src/a/w.c": "int w(void) { return 2; }\n",
                      "src/b/z.c": "int w(void); int z(void) { return w(); }\n"})
    s.case("cycles: two folders using each other fail (no object circle)",
           rc == 1 and "circle of 2 folders" in out and "circle of 2 objects" not in out, out)
    rc, out = cycles({})
    s.case("cycles: no objects is an error, not a pass", rc == 1, out)
    # an object left from a deleted source (a stale build) is not part of the tree
    d = tree({"src/a/x.c": "int y(void); int x(void) { return y(); }\n",
              "src/a/y.c": "int x(void); int y(void) { return x(); }\n"})
    try:
        for f in ("x", "y"):
            os.makedirs(os.path.join(d, "build", "src", "a"), exist_ok=True)
            subprocess.run(["cc", "-c", "-o", os.path.join(d, "build", "src", "a", f + ".o"),
                            os.path.join(d, "src", "a", f + ".c")], check=True, timeout=60)
        os.remove(os.path.join(d, "src", "a", "y.c"))
        r = subprocess.run(["python3", CYC, os.path.join(d, "build")], capture_output=True,
                           text=True, timeout=60)
        s.case("cycles: an object whose source is gone is skipped",
               r.returncode == 0 and "1 stale objects" in r.stdout, r.stdout + r.stderr)
    finally:
        shutil.rmtree(d)

s.finish()
