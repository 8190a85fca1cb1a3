#!/usr/bin/env python3
"""Finds circles of objects that call each other, from the symbols of the built objects.

An edge A -> B means "object A uses a symbol that object B defines" (`nm -g`: an undefined
symbol of A that is defined in B). A strongly connected component of more than one object is
a circle: none of its files can be understood, tested or moved without the others. The same
pass over folders (an edge when any object of folder X uses one of folder Y) checks the layers
of docs/design.md from the symbols' side, whatever the #include lines say.

    scripts/check-cycles.py [BUILD_DIR]      (default build/; exits 1 on any circle)

It reads BUILD_DIR/src/**/*.o whose source (src/**/*.c beside BUILD_DIR) still exists, so it
runs after `make`; objects left from files since moved or deleted are skipped. Objects of the generated protobuf code
and the CPU kernels' per-ISA files are included like every other.
"""
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", "-g", "--defined-only", obj], capture_output=True, text=True,
                         check=True).stdout
    defined = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
    out = subprocess.run(["nm", "-g", "--undefined-only", obj], capture_output=True, text=True,
                         check=True).stdout
    used = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
    return defined, used


def sccs(nodes, edges):
    """Tarjan's algorithm, iterative (a few hundred nodes, but no recursion limit to think of)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on_stack.discard(w); comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    root = os.path.join(build, "src")
    objs = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".o"))
    objs = [o for o in objs if not o.endswith("/main.o")]  # main only calls down
    # An object whose source is gone (a file moved or deleted since that build) is not part of
    # the tree: skip it rather than report circles through code that no longer exists.
    top = os.path.dirname(os.path.abspath(build))
    live = [o for o in objs
            if os.path.exists(os.path.join(top, os.path.relpath(o, build)[:-2] + ".c"))]
    stale = len(objs) - len(live)
    objs = live
    if not objs:
        print(f"check-cycles: no objects under {root} (run make first)")
        return 1
    owner, uses = {}, {}
    for o in objs:
        name = os.path.relpath(o, build)[:-2]  # src/engine/model
        defined, used = symbols(o)
        uses[name] = used
        for s in defined:
            owner.setdefault(s, name)
    edges, why = {}, {}
    for a, used in uses.items():
        for s in used:
            b = owner.get(s)
            if b and b != a:
                edges.setdefault(a, set()).add(b)
                why.setdefault((a, b), s)
    bad = 0
    for comp in sccs(sorted(uses), edges):
        if len(comp) < 2:
            continue
        bad += 1
        print(f"check-cycles: circle of {len(comp)} objects:")
        for a in comp:
            for b in sorted(edges.get(a, ())):
                if b in comp:
                    print(f"    {a} -> {b}  ({why[(a, b)]})")
    folder = lambda n: os.path.dirname(n)
    fedges, fwhy = {}, {}
    for a, bs in edges.items():
        for b in bs:
            fa, fb = folder(a), folder(b)
            if fa != fb:
                fedges.setdefault(fa, set()).add(fb)
                fwhy.setdefault((fa, fb), f"{a} -> {b} ({why[(a, b)]})")
    for comp in sccs(sorted({folder(n) for n in uses}), fedges):
        if len(comp) < 2:
            continue
        bad += 1
        print(f"check-cycles: circle of {len(comp)} folders:")
        for a in comp:
            for b in sorted(fedges.get(a, ())):
                if b in comp:
                    print(f"    {a} -> {b}  e.g. {fwhy[(a, b)]}")
    if bad:
        return 1
    note = f", {stale} stale objects without a source skipped" if stale else ""
    print(f"check-cycles: ok ({len(uses)} objects, {sum(len(v) for v in edges.values())} edges, "
          f"no circle{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
