#!/usr/bin/env bash
# bench/tokenize_bench.sh - tokenizer throughput, ours beside llama.cpp's
# (node-llama-cpp's prebuilt build), same vocabularies, same texts, same run.
#
#   bench/tokenize_bench.sh [--runs N] [--no-llamacpp]
#
# Vocabularies: tests/data/tokenizer/ggml-vocab-{llama-spm,gpt-2,deepseek-llm,
# deepseek-coder,falcon,starcoder,bert-bge}.gguf; texts: the corpus files in
# ../shared/testdata/models/corpus (or $CORPUS). Both sides tokenize the whole
# file without BOS and without parsing specials, best of N runs, one after the
# other (never in parallel). Prints a markdown table (MB/s = 10^6 bytes/s) and
# whether the two token sequences are identical (FNV-1a hash of the ids); the
# raw JSON lines go to bench/out/tokenize-<stamp>/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=5
DO_LLAMACPP=1
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --no-llamacpp) DO_LLAMACPP=0; shift ;;
    *) echo "usage: bench/tokenize_bench.sh [--runs N] [--no-llamacpp]" >&2; exit 2 ;;
    esac
done
BUILD=${BUILD:-build}
CORPUS=${CORPUS:-../shared/testdata/models/corpus}
VOCABS="llama-spm gpt-2 deepseek-llm deepseek-coder falcon starcoder bert-bge"
make -s BUILD="$BUILD" "$BUILD/libsampan.a"
cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/tokenize_bench.c "$BUILD/libsampan.a" \
    -lpcre2-8 -lm -pthread -o "$BUILD/tokenize_bench"
OUT=bench/out/tokenize-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
FILES=$(ls "$CORPUS"/*.txt)
for v in $VOCABS; do
    m=tests/data/tokenizer/ggml-vocab-$v.gguf
    "$BUILD/tokenize_bench" -m "$m" --runs "$RUNS" $FILES > "$OUT/$v.sampan.jsonl"
    if [ "$DO_LLAMACPP" = 1 ]; then
        node bench/tokenize_bench.mjs -m "$m" --runs "$RUNS" $FILES \
            > "$OUT/$v.llamacpp.jsonl" 2> "$OUT/$v.llamacpp.log" || true
    fi
done
/usr/bin/python3 - "$OUT" $VOCABS <<'PY'
import json, os, sys
out, vocabs = sys.argv[1], sys.argv[2:]
def load(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
rows = ["| vocabulary | text | MB | tokens | sampan MB/s | llama.cpp MB/s | ratio | same ids |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
for v in vocabs:
    ours = load(f"{out}/{v}.sampan.jsonl")
    theirs = {r["file"]: r for r in load(f"{out}/{v}.llamacpp.jsonl")}
    for r in ours:
        t = theirs.get(r["file"])
        name = os.path.basename(r["file"])
        if t:
            rows.append(f"| {v} | {name} | {r['bytes']/1e6:.2f} | {r['tokens']} | {r['mb_s']:.1f} | "
                        f"{t['mb_s']:.1f} | {r['mb_s']/t['mb_s']:.1f}x | "
                        f"{'yes' if t['hash'] == r['hash'] and t['tokens'] == r['tokens'] else 'NO'} |")
        else:
            rows.append(f"| {v} | {name} | {r['bytes']/1e6:.2f} | {r['tokens']} | {r['mb_s']:.1f} | - | - | - |")
table = "\n".join(rows)
open(f"{out}/table.md", "w").write(table + "\n")
print(table)
PY
echo "results: $OUT"
