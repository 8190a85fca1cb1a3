#!/usr/bin/env node
// llamacpp_server.mjs - the llama.cpp peer of the serving benchmark: a minimal
// OpenAI-compatible completions server on the prebuilt llama.cpp that the npm
// package node-llama-cpp carries (CPU build), shaped like `llama-server
// --parallel N`:
//
//   node bench/llamacpp_server.mjs -m FILE [--port 8080] [--parallel N] [--threads 2]
//        [--ctx-size 256] [--batch-size 512] [--queue 4096] [--name ID] [--host 127.0.0.1]
//
// One model, ONE LlamaContext with `sequences: N`: node-llama-cpp gathers the
// pending evaluations of all sequences (prompt chunks and one-token decode steps)
// into one llama_decode batch per event-loop cycle ("maximumParallelism"), the
// way llama-server fills one batch from all its slots. --ctx-size is per
// sequence (node-llama-cpp sizes the KV cache as ctx x sequences). A request is
// given a free sequence (the one whose kept tokens share the longest prefix with
// its prompt, and only the rest of the prompt is evaluated - llama-server's
// cache_prompt); requests beyond N wait in arrival order (up to --queue, then 429).
//
// Routes: GET /v1/models, GET /health, GET /stats (decode batches so far),
// POST /v1/completions with `prompt` as a list of token ids (or a string),
// max_tokens, ignore_eos, stream (+ stream_options.include_usage). Decoding is
// always greedy (temperature, top_p, seed are accepted and ignored) with no stop
// strings; the stream has one `data:` chunk per generated token, a final chunk
// with finish_reason, the usage chunk when asked, and `data: [DONE]`.
//
// Never builds or downloads anything (see bench/llamacpp.mjs). Benchmark tooling
// only, bound to 127.0.0.1 by default: not a product server.

import http from "node:http";
import { performance } from "node:perf_hooks";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, join } from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { withLock } from "lifecycle-utils"; // node-llama-cpp's own lock (a dependency of it)

const MAX_BODY = 1 << 20;

function usage(msg)
{
    if (msg)
        process.stderr.write(`llamacpp_server.mjs: ${msg}\n`);
    process.stderr.write("usage: node bench/llamacpp_server.mjs -m FILE [--port N] [--host ADDR] " +
        "[--parallel N] [--threads N] [--ctx-size N] [--batch-size N] [--queue N] [--name ID]\n");
    process.exit(2);
}

function parseArgs(argv)
{
    const o = { model: null, host: "127.0.0.1", port: 8080, parallel: 1, threads: 2, ctx: 256,
                batch: 512, queue: 4096, name: null };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        const next = () => {
            if (i + 1 >= argv.length)
                usage(`${a} needs a value`);
            return argv[++i];
        };
        const int = (lo, hi) => {
            const v = Number(next());
            if (!Number.isInteger(v) || v < lo || v > hi)
                usage(`${a} needs an integer in [${lo}, ${hi}]`);
            return v;
        };
        switch (a) {
        case "-m": case "--model": o.model = next(); break;
        case "--host": o.host = next(); break;
        case "-p": case "--port": o.port = int(0, 65535); break;
        case "-np": case "--parallel": o.parallel = int(1, 256); break;
        case "-t": case "--threads": o.threads = int(1, 256); break;
        case "-c": case "--ctx-size": o.ctx = int(16, 1 << 20); break;
        case "-b": case "--batch-size": o.batch = int(1, 1 << 16); break;
        case "--queue": o.queue = int(0, 1 << 20); break;
        case "--name": o.name = next(); break;
        case "-h": case "--help": usage(); break;
        default: usage(`unknown argument ${a}`);
        }
    }
    if (!o.model)
        usage("-m FILE is required");
    o.name ??= basename(o.model).replace(/\.gguf$/, "");
    return o;
}

const o = parseArgs(process.argv.slice(2));
const require = createRequire(import.meta.url);
const pkgVersion = JSON.parse(readFileSync(join(dirname(require.resolve("node-llama-cpp")), "..",
                                                "package.json"), "utf8")).version;

const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
    maxThreads: o.threads, logLevel: LlamaLogLevel.warn, progressLogs: false,
});
if (llama.gpu !== false)
    throw new Error(`expected a CPU-only llama, got gpu=${llama.gpu}`);
const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0, useMmap: true });
const md = model.fileInfo.metadata;
const vocab = md?.[md?.general?.architecture]?.vocab_size ?? md?.tokenizer?.ggml?.tokens?.length;
if (!Number.isInteger(vocab) || vocab < 4)
    throw new Error("cannot read the vocabulary size from the file");
const context = await model.createContext({
    contextSize: o.ctx,               // per sequence
    batchSize: o.batch,               // llama.cpp n_batch: tokens per llama_decode
    sequences: o.parallel,
    threads: { ideal: o.threads, min: o.threads },
    batching: { dispatchSchedule: "nextCycle", itemPrioritizationStrategy: "maximumParallelism" },
});
const ctxPerSeq = context.contextSize;

// How full the batches are: wrap the binding's batch start (an internal of
// node-llama-cpp 3.x; skipped when it is not there). The same hook drops the
// old tail of sequences given to new requests (see eraseTail).
const realCtx = context._ctx ?? null; // the native context (before the proxy below)
const stats = { batches: 0, batch_tokens: 0, max_batch_tokens: 0, decode_ms: 0, requests: 0, tokens_generated: 0,
                prompt_tokens: 0, prompt_tokens_cached: 0 };
if (context._ctx && typeof context._ctx.initBatch === "function") {
    // The native object's methods are read-only: count through a proxy that
    // calls them on the real object.
    const real = context._ctx;
    try {
        context._ctx = new Proxy(real, {
            get(target, key) {
                const v = target[key];
                if (typeof v !== "function")
                    return v;
                if (key === "initBatch")
                    return (n) => {
                        runPendingErases();
                        stats.batches++;
                        stats.batch_tokens += n;
                        if (n > stats.max_batch_tokens)
                            stats.max_batch_tokens = n;
                        return v.call(target, n);
                    };
                if (key === "decodeBatch")
                    return () => {
                        const t0 = performance.now();
                        return v.call(target).finally(() => { stats.decode_ms += performance.now() - t0; });
                    };
                return v.bind(target);
            },
        });
    } catch (e) {
        process.stderr.write(`llamacpp_server.mjs: batch counting off (${e.message})\n`);
    }
}

// Dropping a sequence's old tail before a new request uses it. node-llama-cpp's
// own eraseContextTokenRanges waits for the context lock, which its batch loop
// holds for as long as any sequence has a decode queued: under steady load a new
// request waits until every other stream has finished (measured: 30 s TTFT at 8
// streams). llama-server removes the cells (llama_memory_seq_rm) between two
// batches; this does the same: the removal runs in the initBatch hook, inside
// the batch loop between two decodes (nothing in flight), or under the lock when
// the loop is idle, whichever comes first.
const pendingErases = [];

function eraseNow(seq, keep)
{
    const ctx = realCtx;
    const n = seq._nextTokenIndex;
    if (keep >= n)
        return keep;
    if (!(keep > 0 && ctx.removeTokenCellsFromSequence(seq._sequenceId, keep, n))) {
        ctx.disposeSequence(seq._sequenceId); // whole sequence: evaluate the whole prompt
        keep = 0;
    }
    seq._contextTokens.splice(keep);
    seq._nextTokenIndex = keep;
    seq._checkpoints?.pruneFromEndToIndex?.(keep - 1);
    return keep;
}

function runPendingErases()
{
    while (pendingErases.length > 0) {
        const e = pendingErases.shift();
        if (!e.done) {
            e.done = true;
            try {
                e.resolve(eraseNow(e.seq, e.keep));
            } catch (err) {
                e.reject(err);
            }
        }
    }
}

// Drops the sequence's tokens from `keep` on; the number of tokens kept.
function eraseTail(seq, keep)
{
    if (keep >= seq.nextTokenIndex)
        return Promise.resolve(keep);
    if (realCtx === null || typeof realCtx.removeTokenCellsFromSequence !== "function" ||
        seq._loadedTokenPredictions?.length)
        return seq.eraseContextTokenRanges([{ start: keep, end: seq.nextTokenIndex }]).then(() => keep);
    return new Promise((resolve, reject) => {
        const e = { seq, keep, done: false, resolve, reject };
        pendingErases.push(e);
        withLock([context, "context"], () => {
            if (!e.done) {
                e.done = true;
                resolve(eraseNow(seq, keep));
            }
        }).catch(reject);
    });
}

// The sequence pool: all N made up front, handed out and back.
const free = [];
for (let i = 0; i < o.parallel; i++)
    free.push(context.getSequence());
const waiting = []; // resolve functions, arrival order

function commonPrefix(seq, prompt)
{
    const kept = seq.contextTokens;
    const n = Math.min(kept.length, prompt.length);
    let i = 0;
    while (i < n && kept[i] === prompt[i])
        i++;
    return i;
}

async function acquire(prompt)
{
    if (free.length === 0)
        await new Promise((resolve) => waiting.push(resolve));
    let best = 0, bestLen = -1;
    for (let i = 0; i < free.length; i++) {
        const l = commonPrefix(free[i], prompt);
        if (l > bestLen) {
            best = i;
            bestLen = l;
        }
    }
    return free.splice(best, 1)[0];
}

function release(seq)
{
    free.push(seq);
    const w = waiting.shift();
    if (w)
        w();
}

function sendJson(res, status, obj)
{
    const body = JSON.stringify(obj);
    res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
    res.end(body);
}

function sendError(res, status, message, type = "invalid_request_error")
{
    sendJson(res, status, { error: { message, type, param: null, code: status } });
}

function readBody(req)
{
    return new Promise((resolve, reject) => {
        const parts = [];
        let n = 0;
        req.on("data", (c) => {
            n += c.length;
            if (n > MAX_BODY) {
                reject(new Error(`request body over ${MAX_BODY} bytes`));
                req.destroy();
                return;
            }
            parts.push(c);
        });
        req.on("end", () => resolve(Buffer.concat(parts).toString("utf8")));
        req.on("error", reject);
    });
}

// Validated request fields, or a string saying what is wrong.
function parseCompletion(body)
{
    let j;
    try {
        j = JSON.parse(body);
    } catch (e) {
        return "body: not JSON";
    }
    if (j === null || typeof j !== "object" || Array.isArray(j))
        return "body: expected a JSON object";
    let prompt = j.prompt;
    if (Array.isArray(prompt) && prompt.length === 1 && Array.isArray(prompt[0]))
        prompt = prompt[0];
    if (typeof prompt === "string") {
        prompt = model.tokenize(prompt, false);
    } else if (!Array.isArray(prompt) || !prompt.every((t) => Number.isInteger(t) && t >= 0 && t < vocab)) {
        return `prompt: expected a string or a list of token ids in [0, ${vocab})`;
    }
    if (prompt.length === 0)
        return "prompt: empty";
    const maxTokens = j.max_tokens ?? 16;
    if (!Number.isInteger(maxTokens) || maxTokens < 1)
        return "max_tokens: expected a positive integer";
    if (prompt.length + maxTokens > ctxPerSeq)
        return `prompt (${prompt.length} tokens) + max_tokens (${maxTokens}) is over the context of ${ctxPerSeq}`;
    return {
        prompt,
        maxTokens,
        stream: j.stream === true,
        includeUsage: j.stream_options?.include_usage === true,
        ignoreEos: j.ignore_eos === true,
    };
}

let nextId = 1;

async function completion(req, res)
{
    let body;
    try {
        body = await readBody(req);
    } catch (e) {
        sendError(res, 413, String(e.message));
        return;
    }
    const q = parseCompletion(body);
    if (typeof q === "string") {
        sendError(res, 400, q);
        return;
    }
    if (free.length === 0 && waiting.length >= o.queue) {
        sendError(res, 429, "queue full", "server_error");
        return;
    }
    let gone = false;
    res.on("close", () => { gone = true; });
    const seq = await acquire(q.prompt);
    const id = `cmpl-${nextId++}`;
    const created = Math.floor(Date.now() / 1000);
    const head = (choices) => ({ id, object: "text_completion", created, model: o.name, choices });
    const out = [];
    let text = "", finish = "length", failed = null, it = null;
    try {
        if (gone)
            return;
        // Keep the longest shared prefix (at least one prompt token is evaluated,
        // as llama-server does, so there are logits to sample from).
        const keep = await eraseTail(seq, Math.min(commonPrefix(seq, q.prompt), q.prompt.length - 1));
        stats.requests++;
        stats.prompt_tokens += q.prompt.length;
        stats.prompt_tokens_cached += keep;
        if (q.stream)
            res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
        it = seq.evaluate(q.prompt.slice(keep), { temperature: 0, yieldEogToken: q.ignoreEos });
        while (out.length < q.maxTokens && !gone) {
            const step = await it.next();
            if (step.done) {
                finish = "stop";
                break;
            }
            const tok = step.value;
            if (!q.ignoreEos && model.isEogToken(tok)) {
                finish = "stop";
                break;
            }
            // The text of this token alone, in the context of the ones before it
            // (SentencePiece leading spaces).
            const last = out.length ? out.slice(-4) : q.prompt.slice(-4);
            const piece = model.detokenize([tok], false, last);
            out.push(tok);
            stats.tokens_generated++;
            if (q.stream)
                res.write(`data: ${JSON.stringify(head([{ index: 0, text: piece, logprobs: null, finish_reason: null }]))}\n\n`);
            else
                text += piece;
        }
    } catch (e) {
        failed = e;
    } finally {
        if (it)
            await it.return();
        release(seq);
    }
    if (gone)
        return;
    const usage = { prompt_tokens: q.prompt.length, completion_tokens: out.length,
                    total_tokens: q.prompt.length + out.length };
    if (failed) {
        const err = { error: { message: String(failed.message ?? failed), type: "server_error", param: null, code: 500 } };
        if (q.stream) {
            res.end(`data: ${JSON.stringify(err)}\n\n`);
        } else {
            sendJson(res, 500, err);
        }
        return;
    }
    if (q.stream) {
        res.write(`data: ${JSON.stringify(head([{ index: 0, text: "", logprobs: null, finish_reason: finish }]))}\n\n`);
        if (q.includeUsage)
            res.write(`data: ${JSON.stringify({ ...head([]), usage })}\n\n`);
        res.end("data: [DONE]\n\n");
    } else {
        sendJson(res, 200, { ...head([{ index: 0, text, logprobs: null, finish_reason: finish }]), usage });
    }
}

const server = http.createServer((req, res) => {
    const url = (req.url ?? "").split("?")[0];
    if (req.method === "GET" && url === "/v1/models") {
        sendJson(res, 200, { object: "list", data: [{ id: o.name, object: "model", created: 0, owned_by: "llama.cpp" }] });
    } else if (req.method === "GET" && url === "/health") {
        sendJson(res, 200, { status: "ok" });
    } else if (req.method === "GET" && url === "/stats") {
        sendJson(res, 200, { ...stats, mean_batch_tokens: stats.batches ? stats.batch_tokens / stats.batches : 0,
                             sequences_free: free.length, waiting: waiting.length });
    } else if (req.method === "POST" && url === "/v1/completions") {
        completion(req, res).catch((e) => {
            if (!res.headersSent)
                sendError(res, 500, String(e.message ?? e), "server_error");
            else
                res.destroy();
        });
    } else {
        sendError(res, 404, `no route ${req.method} ${url}`);
    }
});
server.keepAliveTimeout = 60000;
server.listen(o.port, o.host, () => {
    const a = server.address();
    process.stderr.write(`llamacpp_server.mjs: node-llama-cpp ${pkgVersion}, llama.cpp ${llama.llamaCppRelease?.release ?? "?"}, ` +
        `model ${o.name}, ${o.parallel} sequences x ${ctxPerSeq} ctx, batch ${context.batchSize}, ` +
        `${o.threads} threads, listening on http://${a.address}:${a.port}\n`);
});

async function shutdown()
{
    server.close();
    server.closeAllConnections?.();
    process.stderr.write(`llamacpp_server.mjs: stats ${JSON.stringify({ ...stats,
        mean_batch_tokens: stats.batches ? +(stats.batch_tokens / stats.batches).toFixed(2) : 0 })}\n`);
    await context.dispose();
    await model.dispose();
    await llama.dispose();
    process.exit(0);
}
process.on("SIGINT", shutdown);
process.on("SIGTERM", shutdown);
