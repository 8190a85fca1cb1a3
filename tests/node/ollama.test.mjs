// The `ollama` npm client (pinned in package-lock.json) against the real `sampan serve`.
//
// Starts the server on a free port with the demo model and uses the client as an
// application would: chat (one answer and streamed), generate (with context, raw), embed, list, show, ps,
// version; checks each answer field by field (greedy text against `sampan run`'s,
// token counts against options.num_predict, the timing fields' units) and that the
// client raises Ollama's error message. Last line:
//   node-ollama: N passed, N failed, N skipped
//
// Env: SAMPAN_BIN (default build/sampan), SAMPAN_MODEL (default the demo model).
import { spawn, execFileSync } from 'node:child_process';
import path from 'node:path';
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Ollama } from 'ollama';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const bin = process.env.SAMPAN_BIN || path.join(root, 'build/sampan');
const modelFile = process.env.SAMPAN_MODEL || path.join(root, 'models/stories260K.gguf');
const MODEL = 'stories260K';
const PROMPT = 'Once upon a time';

let passed = 0, failed = 0;

function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}
function eq(a, b, what) {
  if (JSON.stringify(a) !== JSON.stringify(b)) {
    throw new Error(`${what}: expected ${JSON.stringify(b)}, got ${JSON.stringify(a)}`);
  }
}

async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
  }
}

// The greedy continuation `sampan run` prints after the prompt (raw text, no template).
function golden(prompt, n) {
  const out = execFileSync(bin, ['run', '-m', modelFile, '-p', prompt, '-n', String(n), '--temp', '0',
    '-t', '1'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 20000 });
  return out.slice(prompt.length, -1);
}

async function startServer(extra) {
  const srv = spawn(bin, ['serve', '--model', `${MODEL}=${modelFile}`, '--port', '0', '--threads', '1',
    '--parallel', '4', ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start: ${log}`)), 10000);
    srv.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/event=ready /) && log.match(/url=http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    srv.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}: ${log}`)); });
  });
  return { srv, port };
}

// The timing fields: integers in nanoseconds, each part within the whole.
function checkTimings(r, wallMs, what) {
  for (const k of ['total_duration', 'load_duration', 'prompt_eval_duration', 'eval_duration',
    'prompt_eval_count', 'eval_count']) {
    assert(Number.isInteger(r[k]) && r[k] >= 0, `${what}: ${k} is a non-negative integer (${r[k]})`);
  }
  assert(r.total_duration > 0 && r.total_duration <= wallMs * 1e6 + 1e6,
    `${what}: total_duration ${r.total_duration} ns within the ${wallMs} ms wall time`);
  assert(r.load_duration + r.prompt_eval_duration + r.eval_duration <= r.total_duration,
    `${what}: load + prompt_eval + eval <= total`);
  assert(r.prompt_eval_count > 0, `${what}: prompt_eval_count`);
}

async function main() {
  // A chat template the tiny model can follow: the user's text is the whole prompt, so the
  // greedy chat answer is `sampan run`'s continuation of it.
  const tmp = fs.mkdtempSync('/tmp/sampan-ollama-');
  const tmpl = path.join(tmp, 'plain.jinja');
  fs.writeFileSync(tmpl, '{{ bos_token }}{% for m in messages %}{% if m.role == "system" %}' +
    '{{ m.content }} {% else %}{{ m.content }}{% endif %}{% endfor %}');
  const { srv, port } = await startServer(['--chat-template-file', tmpl]);
  const ollama = new Ollama({ host: `http://127.0.0.1:${port}` });
  const gold = golden(PROMPT, 24);
  const greedy = { temperature: 0, num_predict: 24 };

  await test('version', async () => {
    const v = await ollama.version();
    assert(/^\d+\.\d+\.\d+$/.test(v.version), `version ${v.version}`);
  });

  await test('list: the served model', async () => {
    const l = await ollama.list();
    eq(l.models.map((m) => m.name), [MODEL], 'names');
    const m = l.models[0];
    eq(m.details.family, 'llama', 'family');
    eq(m.size, fs.statSync(modelFile).size, 'size (the file)');
    assert(/^[0-9a-f]{64}$/.test(m.digest), 'digest');
  });

  await test('show: details, model_info, capabilities', async () => {
    const s = await ollama.show({ model: `${MODEL}:latest` });
    eq(s.model_info['general.architecture'], 'llama', 'architecture');
    eq(s.model_info['llama.context_length'], 512, 'context length');
    assert(s.capabilities.includes('completion'), 'completion capability');
  });

  await test('ps: loaded, with its context', async () => {
    const p = await ollama.ps();
    eq(p.models.length, 1, 'one model');
    eq(p.models[0].context_length, 512, 'context_length');
    assert(p.models[0].size > 0, 'size (memory)');
  });

  await test('embed: unit vectors, one per input', async () => {
    const e = await ollama.embed({ model: MODEL, input: ['Once upon a time', 'a cat'] });
    eq(e.embeddings.length, 2, 'two vectors');
    for (const v of e.embeddings) {
      eq(v.length, 64, 'n_embd');
      const n = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
      assert(Math.abs(n - 1) < 1e-5, `unit length (${n})`);
    }
    assert(e.prompt_eval_count > 0 && e.total_duration > 0, 'counts and timing');
  });

  await test('embeddings (older API): the same vector as embed', async () => {
    const a = await ollama.embeddings({ model: MODEL, prompt: 'a cat' });
    const b = await ollama.embed({ model: MODEL, input: 'a cat' });
    assert(a.embedding.every((x, i) => Math.abs(x - b.embeddings[0][i]) <= 1e-6), 'same vector');
  });

  await test('chat: greedy answer is `sampan run`\'s, num_predict honoured, timings', async () => {
    const t0 = Date.now();
    const r = await ollama.chat({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
      options: greedy });
    eq(r.message.role, 'assistant', 'role');
    eq(r.message.content, gold, 'greedy text');
    eq(r.done, true, 'done');
    eq(r.done_reason, 'length', 'done_reason');
    eq(r.eval_count, 24, 'eval_count');
    eq(r.model, MODEL, 'model');
    assert(!Number.isNaN(Date.parse(r.created_at)), 'created_at');
    checkTimings(r, Date.now() - t0, 'chat');
  });

  await test('chat streamed: the same text in NDJSON parts, then done with the counts', async () => {
    const t0 = Date.now();
    const it = await ollama.chat({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
      options: greedy, stream: true });
    let text = '', parts = 0, last = null;
    for await (const part of it) {
      if (part.done) { last = part; continue; }
      eq(part.message.role, 'assistant', 'part role');
      text += part.message.content;
      parts++;
    }
    eq(text, gold, 'streamed text');
    assert(parts >= 2, `several parts (${parts})`);
    assert(last && last.done_reason === 'length' && last.eval_count === 24, 'last part');
    checkTimings(last, Date.now() - t0, 'chat stream');
  });

  await test('generate: system + prompt through the template, stop honoured', async () => {
    const r = await ollama.generate({ model: MODEL, prompt: PROMPT, options: greedy });
    eq(r.response, gold, 'greedy response');
    const word = gold.trim().split(/\s+/)[2];
    const cut = await ollama.generate({ model: MODEL, prompt: PROMPT,
      options: { ...greedy, stop: [word] } });
    eq(cut.response, gold.slice(0, gold.indexOf(word)), 'cut at the stop string');
    eq(cut.done_reason, 'stop', 'done_reason stop');
  });

  await test('generate streamed', async () => {
    const it = await ollama.generate({ model: MODEL, prompt: PROMPT, options: greedy, stream: true });
    let text = '', last = null;
    for await (const part of it) {
      if (part.done) last = part; else text += part.response;
    }
    eq(text, gold, 'streamed response');
    assert(last && last.eval_count === 24, 'done part');
  });

  await test('chat: seed + temperature reproducible', async () => {
    const req = { model: MODEL, messages: [{ role: 'user', content: PROMPT }],
      options: { temperature: 1.0, seed: 1234, num_predict: 16 } };
    const a = await ollama.chat(req);
    const b = await ollama.chat(req);
    eq(a.message.content, b.message.content, 'same seed, same text');
  });

  await test('chat format json: the content parses as JSON', async () => {
    const r = await ollama.chat({ model: MODEL, messages: [{ role: 'user', content: PROMPT }],
      format: 'json', options: { temperature: 0, num_predict: 64 } });
    if (r.done_reason === 'stop') JSON.parse(r.message.content);
    else assert(r.message.content.trimStart().startsWith('{'), 'a JSON object begins');
  });

  await test('errors: the client raises the server\'s message', async () => {
    let err = null;
    try {
      await ollama.chat({ model: 'nope', messages: [{ role: 'user', content: 'x' }] });
    } catch (e) { err = e; }
    assert(err && err.status_code === 404 && /nope/.test(err.error), `404 with the name (${err})`);
    err = null;
    try {
      await ollama.generate({ model: MODEL, prompt: 'x', context: [1, 2.5] });
    } catch (e) { err = e; }
    assert(err && err.status_code === 400 && /context/.test(err.error), `bad context refused (${err})`);
  });

  await test('generate context: sent back, the next answer continues it', async () => {
    const r = await ollama.generate({ model: MODEL, prompt: PROMPT, options: greedy });
    assert(Array.isArray(r.context) && r.context.length === r.prompt_eval_count + r.eval_count,
      `context: prompt and answer ids (${r.context && r.context.length})`);
    const r2 = await ollama.generate({ model: MODEL, prompt: 'The end', context: r.context, options: greedy });
    assert(r2.prompt_eval_count > r.context.length, 'the context is part of the prompt');
    eq(JSON.stringify(r2.context.slice(0, r.context.length)), JSON.stringify(r.context), 'context prefix');
  });

  await test('generate raw: the prompt as is (sampan run\'s continuation), no context back', async () => {
    const r = await ollama.generate({ model: MODEL, prompt: PROMPT, raw: true, options: greedy });
    eq(r.response, gold, 'raw greedy response');
    assert(r.context === undefined, 'no context with raw');
    let err = null;
    try {
      await ollama.generate({ model: MODEL, prompt: PROMPT, raw: true, system: 'Be brief.' });
    } catch (e) { err = e; }
    assert(err && err.status_code === 400 && /system/.test(err.error), `raw with system refused (${err})`);
  });

  srv.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
  console.log(`node-ollama: ${passed} passed, ${failed} failed, 0 skipped`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.log(`FAIL setup: ${e.stack}`);
  console.log(`node-ollama: ${passed} passed, ${failed + 1} failed, 0 skipped`);
  process.exit(1);
});
