#!/usr/bin/python3
"""test_encoder.py - BERT / nomic-bert encoders and rerankers, end to end through the server.

Random-weight encoders are written by tools/gguf_gen.py (with the bge WordPiece vocabulary
of tests/data/tokenizer) and served by `sampan serve`; their /v1/embeddings vectors and
/v1/rerank scores are compared with the float64 NumPy reference tests/ref/ref_encoder.py,
which reads the same file. Also: the token sequences (text input = [CLS] text [SEP], a
rerank pair = [CLS] query [SEP] document [SEP]), batch invariance (an input's vector is
the same bits alone and among other inputs), the response shapes (float and base64, the
rerank order, top_n, return_documents), and the refusals (a generative route on an
encoder, embeddings of a reranker, a reranking by an embedding model, bad bodies).

Tolerance. All weights are F32, so the engine and the reference compute the same function
and differ only by float32 rounding in the engine (unit roundoff u = 6e-8). A dot product
of at most max(dim, ff) = 128 terms has a relative rounding error of about sqrt(128) u =
7e-7 (rounding errors add like a random walk; the worst case 128 u = 7.6e-6 is not
reached by random data); a token's path crosses about 10 such products, and the LayerNorm
after every sub-layer keeps the scale O(1) so they add up to about sqrt(10) * 7e-7 = 2e-6.
The vectors have unit length and the scores are O(1): max |engine - reference| <= 1e-5
(vectors), <= 1e-5 * max(1, |score|) (scores), a 5x margin over that estimate (measured:
about 1e-7). A wrong formula moves results by more: the tanh GELU instead of erf moves
these vectors by 3.4e-5, a missing document token type moves a score by 0.3.
"""
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

from common import ROOT, Server, Suite, binary, http_json

import gguf_gen
from ref_encoder import Encoder

VOCAB = os.path.join(ROOT, "tests", "data", "tokenizer", "ggml-vocab-bert-bge.gguf")
TOL = 1e-5

s = Suite("encoder")
if binary() is None:
    s.skip("all", "build/sampan is not built")
    s.finish()
    sys.exit(0)

tmp = tempfile.mkdtemp(prefix="sampan-enc-")


def gen(name, **cfg):
    path = os.path.join(tmp, name + ".gguf")
    base = dict(arch="bert", vocab_from=VOCAB, dim=64, n_heads=4, n_layers=2, ff=128, ctx=128)
    base.update(cfg)
    gguf_gen.generate(path, base)
    return path


def tokenize(path, text, bos=True):
    """`sampan tokenize` ids of text (with [CLS] ... [SEP] when bos)."""
    r = subprocess.run([binary(), "tokenize", "-m", path] + ([] if bos else ["--no-bos"]),
                       input=text.encode(), capture_output=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.decode())
    return [int(x) for x in r.stdout.split()]


def f32(x):
    return np.asarray(x, dtype=np.float64)


bert_cls = gen("bert_cls", pooling="cls")
bert_mean = gen("bert_mean", pooling="mean", seed=2)
bert_last = gen("bert_last", pooling="last", seed=3)
nomic = gen("nomic", arch="nomic-bert", pooling="mean", ff=96, seed=4)
rank = gen("rank", pooling="rank", seed=5)
none_pool = gen("none", pooling="none", seed=6)

texts = ["hello world", "The quick brown fox jumps over the lazy dog.",
         "embeddings of encoders, tested against a NumPy reference"]

srv = Server(model=f"bert-cls={bert_cls}", *[
    "--model", f"bert-mean={bert_mean}", "--model", f"bert-last={bert_last}",
    "--model", f"nomic={nomic}", "--model", f"rank={rank}", "--model", f"none={none_pool}",
    "--model", f"stories260K={os.path.join(ROOT, 'models', 'stories260K.gguf')}"],
    start_timeout=30)
P = srv.port
try:
    # ---- embeddings against the reference ---------------------------------------------
    for name, path in (("bert-cls", bert_cls), ("bert-mean", bert_mean), ("bert-last", bert_last),
                       ("nomic", nomic)):
        ref = Encoder(path)
        st, b = http_json(P, "POST", "/v1/embeddings", {"model": name, "input": texts})
        ok = st == 200 and len(b["data"]) == len(texts)
        worst = 0.0
        for i, t in enumerate(texts):
            if not ok:
                break
            ids = tokenize(path, t)
            e = f32(b["data"][i]["embedding"])
            r = ref.embed(ids)
            worst = max(worst, float(np.max(np.abs(e - r))))
        s.case(f"{name}: /v1/embeddings equals the float64 reference", ok and worst <= TOL,
               f"status {st}, max error {worst:.2e}")
        if name == "bert-cls":
            ids = tokenize(path, texts[0])
            n_usage = sum(len(tokenize(path, t)) for t in texts)
            s.case("usage counts the [CLS] text [SEP] tokens",
                   st == 200 and b["usage"]["prompt_tokens"] == n_usage and ids[0] == 101
                   and ids[-1] == 102, f"{b.get('usage') if st == 200 else b}, ids {ids}")
            # token-id input gives the same vector as the text it stands for
            st2, b2 = http_json(P, "POST", "/v1/embeddings", {"model": name, "input": ids})
            s.case("token-id input equals text input",
                   st2 == 200 and b2["data"][0]["embedding"] == b["data"][0]["embedding"], str(st2))

    # the reference itself tells the poolings apart (the test can fail)
    ref = Encoder(bert_cls)
    ids = tokenize(bert_cls, texts[1])
    h = ref.hidden(ids)
    s.case("reference: CLS, mean and last poolings differ",
           np.max(np.abs(h[0] - h.mean(0))) > 1e-2 and np.max(np.abs(h[0] - h[-1])) > 1e-2)

    # ---- base64 and batch invariance ---------------------------------------------------
    st, b = http_json(P, "POST", "/v1/embeddings",
                      {"model": "nomic", "input": texts[1], "encoding_format": "base64"})
    alone = b["data"][0]["embedding"] if st == 200 else ""
    st2, b2 = http_json(P, "POST", "/v1/embeddings",
                        {"model": "nomic", "input": [texts[0], texts[2] * 3, texts[1]],
                         "encoding_format": "base64"})
    s.case("batch invariance: an input's bytes alone == among others",
           st == 200 and st2 == 200 and b2["data"][2]["embedding"] == alone, f"{st} {st2}")
    st3, b3 = http_json(P, "POST", "/v1/embeddings", {"model": "nomic", "input": texts[1]})
    dec = struct.unpack(f"<{len(base64.b64decode(alone)) // 4}f", base64.b64decode(alone)) \
        if alone else ()
    s.case("base64 decodes to the float answer",
           st3 == 200 and len(dec) == 64 and
           np.max(np.abs(f32(dec) - f32(b3["data"][0]["embedding"]))) <= 1e-7)
    st, b = http_json(P, "POST", "/v1/embeddings", {"model": "nomic", "input": "x", "dimensions": 32})
    s.case("dimensions other than the model's is 400", st == 400 and b["error"]["param"] == "dimensions",
           str(b))
    st, b = http_json(P, "POST", "/v1/embeddings", {"model": "nomic", "input": "x", "dimensions": 64})
    s.case("dimensions equal to the model's is accepted", st == 200, str(st))

    # ---- rerank ---------------------------------------------------------------------
    ref = Encoder(rank)
    query = "what is a fox"
    docs = ["a fox is an animal", "the stock market fell", {"text": "foxes live in dens"},
            "lazy dogs sleep all day"]
    dtexts = [d["text"] if isinstance(d, dict) else d for d in docs]
    st, b = http_json(P, "POST", "/v1/rerank", {"model": "rank", "query": query, "documents": docs})
    q_ids = tokenize(rank, query)
    want = []
    for i, d in enumerate(dtexts):
        ids = q_ids + tokenize(rank, d, bos=False) + [102]
        want.append(float(ref.embed(ids)[0]))
    ok = st == 200 and b.get("object") == "list" and len(b["results"]) == len(docs)
    worst = 0.0
    if ok:
        for r in b["results"]:
            worst = max(worst, abs(r["relevance_score"] - want[r["index"]]) / max(1.0, abs(want[r["index"]])))
        order = [r["index"] for r in b["results"]]
        ok = order == sorted(range(len(docs)), key=lambda i: -want[i]) and \
            all("document" not in r for r in b["results"])
    s.case("rerank: scores equal the reference, best first", ok and worst <= TOL,
           f"status {st}, error {worst:.2e}, {b}")
    # the second segment's token type matters (types 0/1 from the [SEP]): scoring the
    # pair with type 0 everywhere in the reference gives other numbers
    ref_sep = ref.sep
    ref.sep = -1
    ids = q_ids + tokenize(rank, dtexts[0], bos=False) + [102]
    no_types = float(ref.embed(ids)[0])
    ref.sep = ref_sep
    s.case("reference: token type 1 for the document changes the score",
           abs(no_types - want[0]) > 1e-3, f"{no_types} vs {want[0]}")
    exp_usage = sum(len(q_ids) + len(tokenize(rank, d, bos=False)) + 1 for d in dtexts)
    s.case("rerank: usage counts every pair's tokens",
           st == 200 and b["usage"]["prompt_tokens"] == exp_usage, str(b.get("usage")))
    for path in ("/rerank", "/v1/reranking"):
        st, b = http_json(P, "POST", path, {"model": "rank", "query": query, "documents": docs,
                                            "top_n": 2, "return_documents": True})
        ok = st == 200 and len(b["results"]) == 2 and \
            all(r["document"]["text"] == dtexts[r["index"]] for r in b["results"]) and \
            b["results"][0]["relevance_score"] >= b["results"][1]["relevance_score"]
        s.case(f"{path}: top_n and return_documents", ok, str(b))
    st, b = http_json(P, "POST", "/v1/rerank", {"model": "rank", "query": query, "texts": dtexts,
                                                "return_text": True, "top_n": 0})
    s.case("rerank: TEI's texts / return_text, top_n 0", st == 200 and b["results"] == [], str(b))

    # ---- refusals --------------------------------------------------------------------
    def refused(name, method_path, body, param=None, status=400):
        st, b = http_json(P, "POST", method_path, body)
        ok = st == status and isinstance(b, dict) and "error" in b and \
            (param is None or b["error"].get("param") == param)
        s.case(name, ok, f"{st} {b}")

    refused("rerank with an embedding model is 400", "/v1/rerank",
            {"model": "bert-cls", "query": "q", "documents": ["d"]}, "model")
    refused("rerank with a generative model is 400", "/v1/rerank",
            {"model": "stories260K", "query": "q", "documents": ["d"]}, "model")
    refused("embeddings of a reranker is 400", "/v1/embeddings", {"model": "rank", "input": "x"},
            "model")
    refused("embeddings with pooling none is 400", "/v1/embeddings",
            {"model": "none", "input": "x"}, "model")
    refused("completions on an encoder is 400", "/v1/completions",
            {"model": "bert-cls", "prompt": "x"}, "model")
    refused("chat on a reranker is 400", "/v1/chat/completions",
            {"model": "rank", "messages": [{"role": "user", "content": "x"}]}, "model")
    refused("rerank: missing query is 400", "/v1/rerank", {"model": "rank", "documents": ["d"]},
            "query")
    refused("rerank: empty documents is 400", "/v1/rerank",
            {"model": "rank", "query": "q", "documents": []}, "documents")
    refused("rerank: a document that is a number is 400", "/v1/rerank",
            {"model": "rank", "query": "q", "documents": ["a", 5]}, "documents")
    refused("rerank: negative top_n is 400", "/v1/rerank",
            {"model": "rank", "query": "q", "documents": ["d"], "top_n": -1}, "top_n")
    refused("rerank: return_documents not a boolean is 400", "/v1/rerank",
            {"model": "rank", "query": "q", "documents": ["d"], "return_documents": "yes"},
            "return_documents")
    refused("rerank: a pair longer than the context is 400", "/v1/rerank",
            {"model": "rank", "query": "q", "documents": ["word " * 200]}, "documents")
    refused("embeddings: an input longer than the context is 400", "/v1/embeddings",
            {"model": "bert-cls", "input": "word " * 200})
    # ---- KServe v2 infer -----------------------------------------------------------------
    st, b = http_json(P, "POST", "/v2/models/nomic/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [3], "data": texts}]})
    st2, b2 = http_json(P, "POST", "/v1/embeddings", {"model": "nomic", "input": texts})
    ok = st == 200 and st2 == 200 and b["outputs"][0]["name"] == "embedding" and \
        b["outputs"][0]["datatype"] == "FP32" and b["outputs"][0]["shape"] == [3, 64]
    if ok:
        flat = f32(b["outputs"][0]["data"])
        want = f32([d["embedding"] for d in b2["data"]]).reshape(-1)
        ok = float(np.max(np.abs(flat - want))) <= 1e-7
    s.case("KServe infer: FP32 [3, 64] 'embedding' equals /v1/embeddings", ok, f"{st} {str(b)[:300]}")
    st, b = http_json(P, "POST", "/v2/models/bert-cls/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [texts[0]]}]})
    ok = st == 200 and b["outputs"][0]["shape"] == [1, 1, 64]
    if ok:
        ref = Encoder(bert_cls)
        ok = float(np.max(np.abs(f32(b["outputs"][0]["data"]) -
                                 ref.embed(tokenize(bert_cls, texts[0]))))) <= TOL
    s.case("KServe infer: shape [1, 1] -> [1, 1, 64], equals the reference", ok, f"{st} {str(b)[:300]}")
    st, b = http_json(P, "GET", "/v2/models/nomic")
    s.case("KServe metadata: an encoder's output is embedding FP32 [-1, 64]",
           st == 200 and b["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 64]}],
           str(b))

    def ks_refused(name, path, body):
        st, b = http_json(P, "POST", path, body)
        s.case(name, st == 400 and isinstance(b, dict) and "error" in b, f"{st} {b}")

    one = {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]}
    ks_refused("KServe: generation parameters on an encoder are 400", "/v2/models/nomic/infer",
               {"inputs": [one], "parameters": {"max_tokens": 4}})
    ks_refused("KServe: an unknown output of an encoder is 400", "/v2/models/nomic/infer",
               {"inputs": [one], "outputs": [{"name": "text_output"}]})
    ks_refused("KServe: another input on an encoder is 400", "/v2/models/nomic/infer",
               {"inputs": [one, {"name": "temperature", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    ks_refused("KServe: infer of a reranker is 400", "/v2/models/rank/infer", {"inputs": [one]})
    ks_refused("KServe: generate on an encoder is 400", "/v2/models/nomic/generate",
               {"text_input": "x"})

    # ---- llama.cpp's embeddings of the same files (node-llama-cpp's prebuilt) ------------
    # llama.cpp is not float64-exact: on these models its vectors are 1e-4 from the float64
    # reference (ours: 1e-7), consistent with intermediates rounded once to F16 somewhere
    # (2^-11 = 4.9e-4 relative on O(1) values) and, for bert, its tanh GELU (3e-5 to 8e-5
    # above). So max |sampan - llama.cpp| <= 1e-3 after both are scaled to unit length;
    # a missing embedding, bias, RoPE or a different pooling moves entries by 1e-2 or more.
    if shutil.which("node") is None or not os.path.isdir(
            os.path.join(ROOT, "bench", "node_modules", "node-llama-cpp")):
        s.skip("llama.cpp embeddings", "node or bench/node_modules/node-llama-cpp is missing")
    else:
        for name, path in (("nomic", nomic), ("bert-cls", bert_cls), ("bert-mean", bert_mean)):
            r = subprocess.run(["node", os.path.join(ROOT, "bench", "llamacpp_embed.mjs"), path]
                               + texts, capture_output=True, text=True, timeout=120, cwd=ROOT)
            st, b = http_json(P, "POST", "/v1/embeddings", {"model": name, "input": texts})
            try:
                theirs = [f32(v) / np.linalg.norm(v) for v in json.loads(r.stdout)]
                worst = max(float(np.max(np.abs(f32(d["embedding"]) - v)))
                            for d, v in zip(b["data"], theirs))
                s.case(f"{name}: equals llama.cpp's embedding", st == 200 and worst <= 1e-3,
                       f"max difference {worst:.2e}")
            except (ValueError, KeyError, TypeError) as e:
                s.case(f"{name}: equals llama.cpp's embedding", False, f"{e}: {r.stderr[-400:]}")

    # ---- the official openai npm SDK -----------------------------------------------------
    node_dir = os.path.join(ROOT, "tests", "node")
    if shutil.which("node") is None or not os.path.isdir(os.path.join(node_dir, "node_modules",
                                                                        "openai")):
        s.skip("openai SDK embeddings", "node or tests/node/node_modules/openai is missing")
    else:
        r = subprocess.run(["node", "encoder_sdk.mjs", str(P), "nomic"] + texts, cwd=node_dir,
                           capture_output=True, text=True, timeout=60)
        try:
            out = json.loads(r.stdout)
            ref = Encoder(nomic)
            worst = max(float(np.max(np.abs(f32(v) - ref.embed(tokenize(nomic, t)))))
                        for v, t in zip(out["base64"], texts))
            same = all(np.max(np.abs(f32(x) - f32(y))) <= 1e-7
                       for x, y in zip(out["base64"], out["float"]))
            ok = worst <= TOL and same and out["model"] == "nomic" and len(out["base64"]) == 3
            s.case("openai SDK: embeddings (base64 default and float) equal the reference", ok,
                   f"max error {worst:.2e}, same {same}")
        except (ValueError, KeyError) as e:
            s.case("openai SDK: embeddings (base64 default and float) equal the reference", False,
                   f"{e}: {r.stdout[-300:]} {r.stderr[-500:]}")

    st, b = http_json(P, "GET", "/health")
    s.case("the server is still up after the refusals", st == 200, str(st))
finally:
    srv.stop()


# ---- every kernel level this CPU has, and two threads -------------------------------------
with open("/proc/cpuinfo") as f:
    flags = f.read()
for level in ("scalar", "avx2", "avx512"):
    if level != "scalar" and f" {level}" not in flags.replace("avx512f", "avx512"):
        s.skip(f"SAMPAN_CPU={level}", "this CPU lacks it")
        continue
    os.environ["SAMPAN_CPU"] = level
    try:
        sv = Server("--threads", "2", model=f"nomic={nomic}", start_timeout=30)
    finally:
        del os.environ["SAMPAN_CPU"]
    try:
        st, b = http_json(sv.port, "POST", "/v1/embeddings", {"model": "nomic", "input": texts})
        ref = Encoder(nomic)
        worst = max(float(np.max(np.abs(f32(d["embedding"]) - ref.embed(tokenize(nomic, t)))))
                    for d, t in zip(b["data"], texts)) if st == 200 else 1.0
        s.case(f"SAMPAN_CPU={level}, 2 threads: nomic-bert equals the reference",
               worst <= TOL and "lacks it" not in sv.text(), f"status {st}, max error {worst:.2e}")
    finally:
        sv.stop()


# ---- load-time refusals (a model file is untrusted) ---------------------------------------
def load_error(path):
    """The server's log when it serves only this file (it stops when the load fails)."""
    try:
        r = subprocess.run([binary(), "serve", "--model", f"m={path}", "--port", "0"],
                           capture_output=True, text=True, timeout=30, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "(the server kept running)"
    return r.stderr if r.returncode != 0 else "(exit 0)"


bad = gen("causal", pooling="mean")
with open(bad, "rb") as f:
    data = bytearray(f.read())
key = b"bert.attention.causal"
i = data.find(key)
# the bool value follows the key and its 4-byte type: set it to true
data[i + len(key) + 4] = 1
with open(bad, "wb") as f:
    f.write(data)
err = load_error(bad)
s.case("a causal bert file is refused at load", "attention.causal = true" in err, err[-300:])
bad2 = gen("nopos", pooling="mean")
with open(bad2, "rb") as f:
    data = bytearray(f.read())
i = data.find(b"position_embd.weight")
data[i:i + 8] = b"xosition"
with open(bad2, "wb") as f:
    f.write(data)
err = load_error(bad2)
s.case("a bert file without position_embd is refused at load",
       "missing tensor 'position_embd.weight'" in err, err[-300:])

shutil.rmtree(tmp, ignore_errors=True)
s.finish()
