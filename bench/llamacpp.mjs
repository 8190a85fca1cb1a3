#!/usr/bin/env node
// llamacpp.mjs - the llama.cpp half of the side-by-side engine benchmark.
//
// Loads a GGUF with the prebuilt llama.cpp that the npm package node-llama-cpp
// carries (@node-llama-cpp/linux-x64, CPU build), on the CPU only, with a fixed
// number of threads, and measures:
//   prefill: one evaluation of N prompt token ids (ids given directly, so the
//            tokenizer plays no part), up to the first sampled token;
//   decode:  G greedy tokens after that, one token per evaluation.
// Best of R runs (the sequence is cleared between runs). Prints one JSON object
// on stdout; llama.cpp's own log goes to stderr.
//
//   node bench/llamacpp.mjs -m FILE [--prompt 512] [--gen 64] [--threads 2]
//        [--runs 3] [--seed 1] [--tokens 1,2,3|@FILE] [--flash-attn auto|on|off]
//        [--cpu-variant NAME]
//
// Prints on stderr which CPU backend variant ggml loaded (libggml-cpu-NAME.so, the one
// that scores best on this CPU among those in the addon's folder); --cpu-variant NAME
// fails unless it is exactly that one (bench/run.sh --llamacpp-cpu runs this script
// from a mirror of the package in which only that variant is present).
//
// Never builds or downloads anything: build "never", skipDownload, prebuilt
// binaries only (set NODE_LLAMA_CPP_SKIP_DOWNLOAD=true for `npm install` too).

import { performance } from "node:perf_hooks";
import { readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import os from "node:os";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function usage(msg)
{
    if (msg)
        process.stderr.write(`llamacpp.mjs: ${msg}\n`);
    process.stderr.write("usage: node bench/llamacpp.mjs -m FILE [--prompt N] [--gen N] " +
        "[--threads N] [--runs N] [--seed N] [--tokens 1,2,3|@FILE] [--flash-attn auto|on|off] " +
        "[--cpu-variant NAME]\n");
    process.exit(2);
}

function parseArgs(argv)
{
    const o = { model: null, prompt: 512, gen: 64, threads: 2, runs: 3, seed: 1, tokens: null,
                flashAttn: "auto", cpuVariant: null };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        const next = () => {
            if (i + 1 >= argv.length)
                usage(`${a} needs a value`);
            return argv[++i];
        };
        const int = () => {
            const v = Number(next());
            if (!Number.isInteger(v) || v < 0)
                usage(`${a} needs a non-negative integer`);
            return v;
        };
        switch (a) {
        case "-m": case "--model": o.model = next(); break;
        case "-p": case "--prompt": o.prompt = int(); break;
        case "-n": case "--gen": o.gen = int(); break;
        case "-t": case "--threads": o.threads = int(); break;
        case "-r": case "--runs": o.runs = int(); break;
        case "--seed": o.seed = int(); break;
        case "--tokens": o.tokens = next(); break;
        case "--flash-attn": o.flashAttn = next(); break;
        case "--cpu-variant": o.cpuVariant = next(); break;
        case "-h": case "--help": usage(); break;
        default: usage(`unknown argument ${a}`);
        }
    }
    if (!o.model)
        usage("-m FILE is required");
    if (o.prompt < 1 || o.runs < 1 || o.threads < 1)
        usage("--prompt, --runs and --threads must be at least 1");
    if (!["auto", "on", "off"].includes(o.flashAttn))
        usage("--flash-attn is auto, on or off");
    return o;
}

// Deterministic prompt ids in [3, vocab): skips the usual unk/bos/eos ids so no
// special-token path is taken. xorshift32, so the same seed gives the same ids.
// CPU seconds the whole machine has spent busy (all CPUs), from /proc/stat.
// USER_HZ is 100 on every Linux this runs on.
function machineBusySeconds()
{
    const f = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).map(Number);
    // user nice system idle iowait irq softirq steal
    return (f[1] + f[2] + f[3] + f[6] + f[7] + f[8]) / 100;
}

// The libggml-cpu-*.so files mapped into this process.
function loadedCpuBackends()
{
    return [...new Set(readFileSync("/proc/self/maps", "utf8").split("\n")
        .map(l => l.match(/(libggml-cpu-[\w-]+\.so)/)?.[1]).filter(Boolean))];
}

function randomTokens(n, vocab, seed)
{
    let x = (seed >>> 0) || 1;
    const ids = [];
    for (let i = 0; i < n; i++) {
        x ^= x << 13; x >>>= 0;
        x ^= x >>> 17;
        x ^= x << 5; x >>>= 0;
        ids.push(3 + (x % (vocab - 3)));
    }
    return ids;
}

async function main()
{
    const o = parseArgs(process.argv.slice(2));
    // The package's exports map hides package.json: read it beside dist/.
    const require = createRequire(import.meta.url);
    const pkgJson = join(dirname(require.resolve("node-llama-cpp")), "..", "package.json");
    const pkgVersion = JSON.parse(readFileSync(pkgJson, "utf8")).version;

    const llama = await getLlama({
        gpu: false,                  // CPU backend only: no CUDA/Vulkan/Metal probing
        build: "never",              // never compile llama.cpp from source
        usePrebuiltBinaries: true,   // the binaries shipped in @node-llama-cpp/linux-x64
        skipDownload: true,          // and never fetch a llama.cpp release
        maxThreads: o.threads,       // the thread splitter's cap for this process
        logLevel: LlamaLogLevel.warn,
        progressLogs: false,
    });
    if (llama.gpu !== false)
        throw new Error(`expected a CPU-only llama, got gpu=${llama.gpu}`);
    // Which of the shipped CPU backend variants ggml picked (the backends are loaded by now).
    const cpuBackends = loadedCpuBackends();
    process.stderr.write(`llama.cpp CPU backend: ${cpuBackends.join(", ") || "none found"}\n`);
    if (o.cpuVariant !== null &&
        (cpuBackends.length !== 1 || cpuBackends[0] !== `libggml-cpu-${o.cpuVariant}.so`))
        throw new Error(`--cpu-variant ${o.cpuVariant}: ggml loaded ${cpuBackends.join(", ") || "none"}`);

    const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0, useMmap: true });
    if (model.gpuLayers !== 0)
        throw new Error(`expected 0 GPU layers, got ${model.gpuLayers}`);

    const md = model.fileInfo.metadata;
    const vocab = md?.[md?.general?.architecture]?.vocab_size ?? md?.tokenizer?.ggml?.tokens?.length;
    if (!Number.isInteger(vocab) || vocab < 4)
        throw new Error("cannot read the vocabulary size from the file");
    let prompt;
    if (o.tokens) {
        // "1,2,3" (as `sampan eval --tokens` takes it) or @FILE with the same list or a JSON array
        const text = o.tokens.startsWith("@") ? readFileSync(o.tokens.slice(1), "utf8") : o.tokens;
        prompt = text.trim().replace(/^\[|\]$/g, "").split(",").map(Number);
        if (prompt.length === 0 || !prompt.every(t => Number.isInteger(t) && t >= 0 && t < vocab))
            usage("--tokens: expected comma-separated token ids inside the vocabulary");
    } else {
        prompt = randomTokens(o.prompt, vocab, o.seed);
    }

    const contextSize = prompt.length + o.gen + 16;
    const context = await model.createContext({
        contextSize,
        batchSize: prompt.length,          // the whole prompt in one batch (n_batch = n_ubatch)
        sequences: 1,
        threads: { ideal: o.threads, min: o.threads },
        flashAttention: o.flashAttn === "auto" ? undefined : o.flashAttn === "on",
    });
    const sequence = context.getSequence();

    const runs = [];
    let threadsSeen = new Set();
    let generated = null;
    for (let r = 0; r < o.runs; r++) {
        await sequence.clearHistory();
        const out = [];
        const busy0 = machineBusySeconds(), cpu0 = process.cpuUsage();
        const t0 = performance.now();
        // temperature 0 = greedy; yieldEogToken so an end-of-generation id does
        // not cut the decode short (random weights produce any id).
        const it = sequence.evaluate(prompt, { temperature: 0, yieldEogToken: true });
        let step = await it.next();
        const t1 = performance.now();
        threadsSeen.add(context.currentThreads);
        if (!step.done)
            out.push(step.value);
        for (let g = 0; g < o.gen && !step.done; g++) {
            step = await it.next();
            if (!step.done)
                out.push(step.value);
        }
        const t2 = performance.now();
        threadsSeen.add(context.currentThreads);
        await it.return();
        const cpu1 = process.cpuUsage(cpu0);
        const own = (cpu1.user + cpu1.system) / 1e6;
        const other = Math.max(0, machineBusySeconds() - busy0 - own);
        const decoded = out.length - 1; // evaluations after the first sampled token
        runs.push({
            prefill_ms: t1 - t0,
            prefill_tok_s: prompt.length / ((t1 - t0) / 1e3),
            decode_tokens: decoded,
            decode_ms: t2 - t1,
            decode_tok_s: decoded / ((t2 - t1) / 1e3),
            // CPU that other processes took meanwhile, as a share of the machine
            other_pct_of_machine: Math.round(1000 * other / ((t2 - t0) / 1e3 * os.cpus().length)) / 10,
        });
        generated ??= out;
        process.stderr.write(`llama.cpp run ${r + 1}/${o.runs}: prefill ${prompt.length} tokens ` +
            `in ${(t1 - t0).toFixed(1)} ms, decode ${decoded} tokens in ${(t2 - t1).toFixed(1)} ms\n`);
    }

    const best = {
        prefill_tok_s: Math.max(...runs.map(r => r.prefill_tok_s)),
        decode_tok_s: Math.max(...runs.map(r => r.decode_tok_s)),
    };
    const result = {
        engine: "llama.cpp",
        node_llama_cpp: pkgVersion,
        llama_cpp_release: llama.llamaCppRelease,
        build_type: llama.buildType,
        gpu: llama.gpu,
        gpu_layers: model.gpuLayers,
        system_info: llama.systemInfo,
        cpu_backend: cpuBackends,
        cpu_variant_requested: o.cpuVariant,
        threads: [...threadsSeen],
        flash_attention: context.flashAttention,
        model: o.model,
        model_bytes: statSync(o.model).size,
        context_size: context.contextSize,
        batch_size: context.batchSize,
        prompt_tokens: prompt.length,
        gen_tokens: o.gen,
        first_generated: generated.slice(0, 16),
        runs,
        best,
    };
    process.stdout.write(JSON.stringify(result, null, 2) + "\n");
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((e) => {
    process.stderr.write(`llamacpp.mjs: ${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
});
