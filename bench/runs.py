"""runs.py - what the report steps of bench/fraud.sh and bench/grpc.sh share: the runs of one
benchmark directory, the machine they ran on, and the median-and-range of repeated rounds.
Standard library only; the scripts run from the repository root and import it from bench/."""
import glob
import json
import os
import platform
import statistics
import subprocess

med = statistics.median


def load_runs(out):
    """{name: result} of every out/runs/NAME.json, in name order."""
    runs = {}
    for p in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
        runs[os.path.basename(p)[:-5]] = json.load(open(p))
    return runs


def machine(out):
    """The stamp (out's name), CPU model, CPU count and kernel of this machine."""
    text = subprocess.run("LC_ALL=C lscpu", shell=True, capture_output=True, text=True).stdout
    lscpu = dict(l.split(":", 1) for l in text.splitlines() if ":" in l)
    return {"stamp": os.path.basename(out), "cpu": lscpu.get("Model name", "").strip(),
            "cpus": os.cpu_count(), "kernel": platform.release()}


def group(runs, kind):
    """Runs of a kind grouped by their name without the -rN (round) suffix."""
    g = {}
    for k, r in runs.items():
        if r.get("kind") == kind:
            g.setdefault(k.rsplit("-r", 1)[0], []).append(r)
    return g


def rng(vals, fmt):
    """The median of vals with their range in brackets (just the value for one round)."""
    if len(vals) == 1:
        return fmt % vals[0]
    return (fmt + " (" + fmt + "-" + fmt + ")") % (med(vals), min(vals), max(vals))
