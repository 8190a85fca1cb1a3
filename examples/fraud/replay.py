#!/usr/bin/env python3
"""Replays credit-card transactions against a Sampan fraud model (KServe v2 JSON).

  python3 examples/fraud/replay.py [--url http://127.0.0.1:8000] [--rate 500] [--duration 10]

1. Scores every held-out transaction once and prints the AUC and the accuracy at
   0.5 (and, with the expected predictions at hand, the largest difference from
   what XGBoost itself computed).
2. Sends transactions at --rate requests per second for --duration seconds
   (open loop: each request has a scheduled start, so a slow server shows up as
   latency, not as a lower request rate) and prints latency percentiles.

Standard library only. Latencies are measured from the scheduled start to the
parsed response, so they include this client's own time (a few hundred
microseconds of Python per request).
"""
import argparse
import csv
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "xgboost")


def load_rows(path):
    """(features, label) per row: 30 floats Time, V1..V28, Amount, and Class."""
    rows = []
    with open(path, newline="") as f:
        r = csv.reader(f)
        header = next(r)
        first = header.index("Time")
        last = header.index("Amount")
        cls = header.index("Class")
        for line in r:
            rows.append(([float(v) for v in line[first:last + 1]], int(float(line[cls]))))
    return rows


def load_expected(path):
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        return [float(line["pred"]) for line in csv.DictReader(f)]


def auc(scores, labels):
    """Area under the ROC curve: the Mann-Whitney statistic, ties as half."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    n_pos = sum(labels)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    rank_sum = sum(r for r, y in zip(ranks, labels) if y == 1)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


class Client:
    """One keep-alive connection; infer() returns the scores of the rows sent."""

    def __init__(self, url, model, input_name, output_name, timeout):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.path = "/v2/models/%s/infer" % model
        self.input_name, self.output_name = input_name, output_name
        self.timeout = timeout
        self.conn = None

    def infer(self, features):
        body = json.dumps({
            "inputs": [{"name": self.input_name, "datatype": "FP32",
                        "shape": [len(features), len(features[0])],
                        "data": [v for row in features for v in row]}],
            "outputs": [{"name": self.output_name}],
        }).encode()
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                data = resp.read()
                break
            except (ConnectionError, http.client.HTTPException):
                # The server may close an idle keep-alive connection: reconnect once.
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        if resp.status != 200:
            raise RuntimeError("HTTP %d: %s" % (resp.status, data[:300].decode(errors="replace")))
        out = json.loads(data)["outputs"]
        scores = next(o for o in out if o["name"] == self.output_name)["data"]
        if len(scores) != len(features):
            raise RuntimeError("%d scores for %d rows" % (len(scores), len(features)))
        return scores


def score_all(args, rows):
    """Every row once, --rows-per-request at a time."""
    c = Client(args.url, args.model, args.input_name, args.output_name, args.timeout)
    scores = []
    for i in range(0, len(rows), args.rows_per_request):
        chunk = rows[i:i + args.rows_per_request]
        scores.extend(c.infer([f for f, _ in chunk]))
    return scores


def replay(args, rows):
    """Open loop: request i is due at t0 + i / rate; worker w takes i = w mod workers."""
    n_total = max(1, int(args.rate * args.duration))
    lat, svc, errors = [], [], []
    lock = threading.Lock()
    t0 = time.perf_counter() + 0.2

    def worker(w):
        c = Client(args.url, args.model, args.input_name, args.output_name, args.timeout)
        my_lat, my_svc = [], []
        for i in range(w, n_total, args.concurrency):
            due = t0 + i / args.rate
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            start = time.perf_counter()
            k = (i * args.rows_per_request) % len(rows)
            chunk = [rows[(k + j) % len(rows)][0] for j in range(args.rows_per_request)]
            try:
                c.infer(chunk)
            except Exception as e:  # noqa: BLE001 - counted and reported, the replay goes on
                with lock:
                    errors.append(str(e))
                continue
            end = time.perf_counter()
            my_lat.append(end - due)
            my_svc.append(end - start)
        with lock:
            lat.extend(my_lat)
            svc.extend(my_svc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return sorted(lat), sorted(svc), errors, n_total, elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="fraud")
    ap.add_argument("--input-name", default="transaction")
    ap.add_argument("--output-name", default="fraud_probability")
    ap.add_argument("--data", default=os.path.join(DATA, "creditcard-test.csv"),
                    help="CSV with Time, V1..V28, Amount, Class columns")
    ap.add_argument("--expected",
                    default=os.path.join(DATA, "creditcard-depth3-50trees.test-pred.csv"),
                    help="XGBoost's own predictions for --data (row_index,Class,pred)")
    ap.add_argument("--rate", type=float, default=200, help="requests per second (default 200)")
    ap.add_argument("--duration", type=float, default=5, help="seconds of replay (0 = none)")
    ap.add_argument("--rows-per-request", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8, help="connections (default 8)")
    ap.add_argument("--timeout", type=float, default=10)
    args = ap.parse_args()
    if args.rate <= 0 or args.concurrency < 1 or args.rows_per_request < 1:
        ap.error("--rate, --concurrency and --rows-per-request must be positive")

    rows = load_rows(args.data)
    labels = [y for _, y in rows]
    try:
        scores = score_all(args, rows)
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        print("error: %s: %s" % (args.url, e), file=sys.stderr)
        return 1
    acc = sum((s >= 0.5) == (y == 1) for s, y in zip(scores, labels)) / len(rows)
    print("scored %d transactions (%d frauds): AUC %.4f, accuracy at 0.5 %.4f"
          % (len(rows), sum(labels), auc(scores, labels), acc))
    status = 0
    expected = load_expected(args.expected) if args.data.endswith("creditcard-test.csv") else None
    if expected is not None and len(expected) == len(scores):
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(scores, expected))
        print("largest relative difference from XGBoost's own predictions: %.2g" % diff)
        if diff > 1e-5:
            print("MISMATCH: the server's scores differ from XGBoost's", file=sys.stderr)
            status = 1

    if args.duration > 0:
        lat, svc, errors, n_total, elapsed = replay(args, rows)
        pct = "p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f"
        print("replay: %d requests of %d row(s) at %.0f/s target, %.0f/s done, %d errors"
              % (n_total, args.rows_per_request, args.rate, len(lat) / elapsed, len(errors)))
        if lat:
            for what, v in (("scheduled start", lat), ("actual send", svc)):
                qs = tuple(percentile(v, q) * 1e3 for q in (50, 90, 99, 99.9, 100))
                print("latency ms (from %s):%s %s" % (what, " " * (15 - len(what)), pct % qs))
        if errors:
            print("first error: %s" % errors[0], file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
