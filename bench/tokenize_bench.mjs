#!/usr/bin/env node
// tokenize_bench.mjs - llama.cpp's tokenizer (the prebuilt one node-llama-cpp
// carries) on the same files as bench/tokenize_bench.c: vocab-only load, the
// whole text tokenized without BOS and without parsing specials, best of N
// runs; one JSON line per file with MB/s (10^6 bytes/s of UTF-8), the token
// count and the FNV-1a hash of the ids (same formula as the C side).
//
//   node bench/tokenize_bench.mjs -m VOCAB.gguf [--runs N] FILE...
//
// Never builds or downloads anything (build "never", skipDownload).

import { performance } from "node:perf_hooks";
import { readFileSync } from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const args = process.argv.slice(2);
let model = null, runs = 5;
const files = [];
for (let i = 0; i < args.length; i++) {
    if (args[i] === "-m") model = args[++i];
    else if (args[i] === "--runs") runs = Number(args[++i]);
    else files.push(args[i]);
}
if (!model || files.length === 0 || !(runs >= 1)) {
    process.stderr.write("usage: node bench/tokenize_bench.mjs -m VOCAB.gguf [--runs N] FILE...\n");
    process.exit(2);
}

const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
    logLevel: LlamaLogLevel.error, progressLogs: false,
});
const m = await llama.loadModel({ modelPath: model, gpuLayers: 0, vocabOnly: true });
for (const f of files) {
    const buf = readFileSync(f);
    const text = buf.toString("utf8");
    let ids = m.tokenize(text, false);
    let best = Infinity;
    for (let r = 0; r < runs; r++) {
        const t0 = performance.now();
        ids = m.tokenize(text, false);
        best = Math.min(best, performance.now() - t0);
    }
    let h = 0xcbf29ce484222325n;
    for (const id of ids)
        h = ((h ^ BigInt(id >>> 0)) * 0x100000001b3n) & 0xffffffffffffffffn;
    process.stdout.write(JSON.stringify({
        impl: "llama.cpp", file: f, bytes: buf.length, tokens: ids.length,
        best_ms: Number(best.toFixed(3)), mb_s: Number((buf.length / best / 1e3).toFixed(2)),
        hash: h.toString(16).padStart(16, "0"),
    }) + "\n");
}
await m.dispose();
await llama.dispose();
