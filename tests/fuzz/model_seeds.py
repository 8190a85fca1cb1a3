#!/usr/bin/python3
"""model_seeds.py - write the loadable models of the fuzz_model / fuzz_gguf seed corpus.

libFuzzer truncates every seed to -max_len (tests/py/test_fuzz_short.py runs with 4096 bytes,
and without -max_len libFuzzer caps guessed lengths at 1 MiB), so the demo model
(models/stories260K.gguf, 1.2 MB) would reach the target as an unloadable prefix. These seeds
are whole models under 4096 bytes: tools/gguf_gen.py writes them (random weights, f32 or f16)
with the tokenizer copied (--vocab-from) from a 16-token SPM vocabulary written here, since
gguf_gen's synthetic vocabulary needs 260 tokens (about 6 KB of metadata).

    tests/fuzz/model_seeds.py [OUT_DIR]      # default tests/fuzz/corpus/gguf

The output is deterministic (fixed seeds), so rerunning it rewrites the same bytes.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import gguf_gen as gg  # noqa: E402

# <unk> <s> </s>, two byte tokens (the UTF-8 of "ö", for byte fallback), then pieces with
# decreasing scores: enough for the harness's "Hello <s> wörld" to use merges and fallback.
VOCAB = ["<unk>", "<s>", "</s>", "<0xC3>", "<0xB6>", "\u2581", "\u2581H", "e", "l", "o",
         "ll", "\u2581w", "r", "d", "He", "lo"]
TYPES = [2, 3, 3, 6, 6] + [1] * (len(VOCAB) - 5)
SCORES = [0.0] * 5 + [-float(i) for i in range(len(VOCAB) - 5)]

# name -> gguf_gen config; every one loads and runs a forward pass in fuzz_model
MODELS = {
    # llama, grouped-query attention (2 heads over 1 KV head), tied output, f32
    "model_llama_f32.gguf": dict(arch="llama", dim=8, n_layers=1, n_heads=2, n_kv_heads=1,
                                 ff=8, ctx=32, type="f32", seed=7),
    # qwen2: q/k/v biases, separate output matrix, f16 matrices
    "model_qwen2_f16.gguf": dict(arch="qwen2", dim=8, n_layers=1, n_heads=2, n_kv_heads=2,
                                 ff=8, ctx=32, type="f16", tied=False, rope_base=1000000.0,
                                 eps=1e-6, seed=8),
}


def vocab_file(path):
    kvs = [
        gg.kv_bytes("tokenizer.ggml.model", gg.T_STRING, "llama"),
        gg.kv_bytes("tokenizer.ggml.tokens", gg.T_ARRAY, VOCAB, gg.T_STRING),
        gg.kv_bytes("tokenizer.ggml.scores", gg.T_ARRAY, SCORES, gg.T_FLOAT32),
        gg.kv_bytes("tokenizer.ggml.token_type", gg.T_ARRAY, TYPES, gg.T_INT32),
        gg.kv_bytes("tokenizer.ggml.unknown_token_id", gg.T_UINT32, 0),
        gg.kv_bytes("tokenizer.ggml.bos_token_id", gg.T_UINT32, 1),
        gg.kv_bytes("tokenizer.ggml.eos_token_id", gg.T_UINT32, 2),
    ]
    with open(path, "wb") as f:
        f.write(gg.gguf_header(kvs, [], []))


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "corpus", "gguf")
    with tempfile.TemporaryDirectory() as d:
        voc = os.path.join(d, "vocab.gguf")
        vocab_file(voc)
        for name, cfg in MODELS.items():
            path = os.path.join(out, name)
            gg.generate(path, dict(cfg, vocab_from=voc, name=name[:-5]))
            size = os.path.getsize(path)
            print(f"{path}: {size} bytes")
            if size > 4096:
                print(f"model_seeds: {path} is over 4096 bytes", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
