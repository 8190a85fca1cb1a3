// The official openai SDK (v6) against the real `sampan serve` on 127.0.0.1.
//
// Starts the server on a free port with the demo model, checks the SDK's
// parsed objects field by field, and compares greedy (temperature 0) text
// with `sampan run` on the same prompt. Last line:
//   node-openai: N passed, N failed, N skipped
//
// Env: SAMPAN_BIN (default build/sampan), SAMPAN_MODEL (default the demo model).
import { spawn, execFileSync } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const bin = process.env.SAMPAN_BIN || path.join(root, 'build/sampan');
const modelFile = process.env.SAMPAN_MODEL || path.join(root, 'models/stories260K.gguf');
const MODEL = 'stories260K';
const PROMPT = 'Once upon a time';

let passed = 0, failed = 0;
const results = [];

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
    results.push(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    results.push(`FAIL ${name}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
  }
  console.log(results[results.length - 1]);
}

// The greedy continuation `sampan run` prints after the prompt.
function golden(prompt, n) {
  const out = execFileSync(bin, ['run', '-m', modelFile, '-p', prompt, '-n', String(n), '--temp', '0',
    '-t', '1'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 20000 });
  assert(out.startsWith(prompt) && out.endsWith('\n'), 'sampan run echoes the prompt, ends the line');
  return out.slice(prompt.length, -1);
}

async function startServer() {
  const srv = spawn(bin, ['serve', '--model', `${MODEL}=${modelFile}`, '--port', '0', '--threads', '1',
    '--parallel', '4'], { stdio: ['ignore', 'ignore', 'pipe'] });
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

function checkUsage(u, completion) {
  assert(u && Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, 'usage.prompt_tokens');
  if (completion !== undefined) eq(u.completion_tokens, completion, 'usage.completion_tokens');
  eq(u.total_tokens, u.prompt_tokens + u.completion_tokens, 'usage.total_tokens');
}

async function main() {
  const { srv, port } = await startServer();
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0,
    timeout: 30000 });
  const gold24 = golden(PROMPT, 24);

  await test('models.list', async () => {
    const page = await client.models.list();
    const ids = page.data.map((m) => m.id);
    eq(ids, [MODEL], 'model ids');
    eq(page.data[0].object, 'model', 'object');
    assert(Number.isInteger(page.data[0].created), 'created');
    eq(page.data[0].owned_by, 'sampan', 'owned_by');
    const one = await client.models.retrieve(MODEL);
    eq(one.id, MODEL, 'retrieve id');
  });

  await test('completions: greedy text equals sampan run', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 24, temperature: 0 });
    assert(r.id.startsWith('cmpl-'), 'id');
    eq(r.object, 'text_completion', 'object');
    eq(r.model, MODEL, 'model');
    assert(Number.isInteger(r.created), 'created');
    eq(r.choices.length, 1, 'choices');
    eq(r.choices[0].index, 0, 'index');
    eq(r.choices[0].text, gold24, 'text');
    eq(r.choices[0].finish_reason, 'length', 'finish_reason');
    eq(r.choices[0].logprobs, null, 'logprobs');
    checkUsage(r.usage, 24);
  });

  await test('completions: streaming', async () => {
    const stream = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 24, temperature: 0,
      stream: true, stream_options: { include_usage: true } });
    let text = '', finish = null, usage = null, chunks = 0;
    for await (const c of stream) {
      chunks++;
      eq(c.object, 'text_completion', 'chunk object');
      if (c.usage) { usage = c.usage; eq(c.choices.length, 0, 'usage chunk choices'); }
      for (const ch of c.choices) {
        text += ch.text;
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    assert(chunks >= 24, `one chunk per token (got ${chunks})`);
    eq(text, gold24, 'streamed text');
    eq(finish, 'length', 'finish_reason');
    checkUsage(usage, 24);
  });

  await test('completions: stop string is not split and not returned', async () => {
    const full = golden(PROMPT, 40);
    const stop = 'Lily';
    const cut = full.indexOf(stop);
    assert(cut > 0, 'the golden text contains the stop string');
    for (const stream of [false, true]) {
      const r = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 40, temperature: 0,
        stop: [stop, 'zzz-never'], stream });
      let text = '', finish = null;
      if (stream) {
        for await (const c of r) for (const ch of c.choices) { text += ch.text; finish = ch.finish_reason || finish; }
      } else {
        text = r.choices[0].text; finish = r.choices[0].finish_reason;
      }
      eq(text, full.slice(0, cut), `text before the stop string (stream=${stream})`);
      eq(finish, 'stop', 'finish_reason');
    }
  });

  await test('completions: n choices and logprobs', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 8, temperature: 0,
      n: 2, logprobs: 3 });
    eq(r.choices.map((c) => c.index), [0, 1], 'indices');
    for (const c of r.choices) {
      const lp = c.logprobs;
      eq(c.text, gold24.slice(0, c.text.length), 'greedy text');
      eq(lp.tokens.length, 8, 'tokens');
      eq(lp.token_logprobs.length, 8, 'token_logprobs');
      eq(lp.top_logprobs.length, 8, 'top_logprobs');
      eq(lp.text_offset.length, 8, 'text_offset');
      eq(lp.tokens.join(''), c.text, 'tokens spell the text');
      for (let i = 0; i < 8; i++) {
        assert(lp.token_logprobs[i] <= 0, 'logprob <= 0');
        const top = Object.entries(lp.top_logprobs[i]);
        assert(top.length >= 1 && top.length <= 3, 'top count');
        // greedy: the chosen token is the most likely one
        const best = Math.max(...top.map(([, v]) => v));
        assert(Math.abs(best - lp.token_logprobs[i]) < 1e-5, 'greedy picks the top token');
        if (i) assert(lp.text_offset[i] === lp.text_offset[i - 1] + lp.tokens[i - 1].length, 'text_offset');
      }
    }
    checkUsage(r.usage, 16);
  });

  await test('completions: sampling with a seed is reproducible, n differ', async () => {
    const ask = () => client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 20, temperature: 1,
      seed: 1234, n: 3 });
    const a = await ask(), b = await ask();
    eq(a.choices.map((c) => c.text), b.choices.map((c) => c.text), 'same seed, same texts');
    const distinct = new Set(a.choices.map((c) => c.text));
    assert(distinct.size > 1, 'the n choices are not all identical');
  });

  await test('chat: non-streaming and streaming agree', async () => {
    const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me a story.' }];
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 20, temperature: 0 });
    assert(r.id.startsWith('chatcmpl-'), 'id');
    eq(r.object, 'chat.completion', 'object');
    eq(r.choices[0].message.role, 'assistant', 'role');
    assert(typeof r.choices[0].message.content === 'string' && r.choices[0].message.content.length > 0, 'content');
    assert(['stop', 'length'].includes(r.choices[0].finish_reason), 'finish_reason');
    checkUsage(r.usage);
    assert(r.usage.completion_tokens <= 20, 'max_tokens respected');
    const s = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 20, temperature: 0,
      stream: true, stream_options: { include_usage: true } });
    let text = '', role = null, finish = null, usage = null;
    for await (const c of s) {
      eq(c.object, 'chat.completion.chunk', 'chunk object');
      if (c.usage) usage = c.usage;
      for (const ch of c.choices) {
        if (ch.delta.role) role = ch.delta.role;
        if (ch.delta.content) text += ch.delta.content;
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    eq(role, 'assistant', 'first delta role');
    eq(text, r.choices[0].message.content, 'streamed content');
    eq(finish, r.choices[0].finish_reason, 'finish_reason');
    eq(usage, r.usage, 'usage');
  });

  await test('chat: logprobs with top_logprobs', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }],
      max_completion_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3 });
    const content = r.choices[0].logprobs.content;
    eq(content.length, r.usage.completion_tokens, 'one entry per token');
    let bytes = [];
    for (const e of content) {
      assert(typeof e.token === 'string', 'token');
      assert(e.logprob <= 0, 'logprob');
      assert(Array.isArray(e.bytes), 'bytes');
      eq(e.top_logprobs.length, 3, 'top_logprobs');
      assert(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5, 'greedy = top 1');
      for (const t of e.top_logprobs) assert(Array.isArray(t.bytes) && typeof t.token === 'string', 'top entry');
      bytes = bytes.concat(e.bytes);
    }
    eq(Buffer.from(bytes).toString('utf8'), r.choices[0].message.content, 'bytes spell the content');
  });

  await test('chat: n choices', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 5, temperature: 0.9, seed: 5, n: 3 });
    eq(r.choices.map((c) => c.index), [0, 1, 2], 'indices');
    for (const c of r.choices) eq(c.message.role, 'assistant', 'role');
  });

  await test('chat: response_format json_object', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'JSON please' }],
      max_tokens: 60, temperature: 0, response_format: { type: 'json_object' } });
    const text = r.choices[0].message.content.trim();
    assert(text.startsWith('{'), `starts an object: ${JSON.stringify(text)}`);
    if (r.choices[0].finish_reason === 'stop') JSON.parse(text);
  });

  await test('embeddings: base64 (SDK default) and float agree, unit length', async () => {
    const a = await client.embeddings.create({ model: MODEL, input: ['hello world', 'a cat'] });
    eq(a.object, 'list', 'object');
    eq(a.data.length, 2, 'data');
    eq(a.model, MODEL, 'model');
    assert(a.usage.prompt_tokens > 0 && a.usage.total_tokens === a.usage.prompt_tokens, 'usage');
    const b = await client.embeddings.create({ model: MODEL, input: 'hello world', encoding_format: 'float' });
    const ea = a.data[0].embedding, eb = b.data[0].embedding;
    eq(a.data[0].index, 0, 'index');
    eq(a.data[1].index, 1, 'index');
    eq(ea.length, eb.length, 'dimensions');
    assert(ea.length > 0, 'non-empty');
    let norm = 0, diff = 0;
    for (let i = 0; i < ea.length; i++) { norm += ea[i] * ea[i]; diff = Math.max(diff, Math.abs(ea[i] - eb[i])); }
    assert(Math.abs(norm - 1) < 1e-3, `unit length (|e|^2 = ${norm})`);
    assert(diff < 1e-6, 'base64 and float give the same vector');
  });

  await test('errors: unknown model is 404, bad parameters are 400 naming the field', async () => {
    try {
      await client.completions.create({ model: 'nope', prompt: 'x' });
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.NotFoundError, `NotFoundError, got ${e}`);
      eq(e.status, 404, 'status');
      eq(e.code, 'model_not_found', 'code');
    }
    for (const [body, param] of [[{ max_tokens: -5 }, 'max_tokens'], [{ temperature: 'hot' }, 'temperature'],
      [{ n: 1000000 }, 'n'], [{ logprobs: 1e9 }, 'logprobs'], [{ top_p: 7 }, 'top_p'], [{ stop: [1, 2] }, 'stop']]) {
      try {
        await client.completions.create({ model: MODEL, prompt: 'x', ...body });
        throw new Error(`no error for ${JSON.stringify(body)}`);
      } catch (e) {
        assert(e instanceof OpenAI.BadRequestError, `BadRequestError for ${JSON.stringify(body)}, got ${e}`);
        eq(e.param, param, 'param');
        eq(e.type, 'invalid_request_error', 'type');
      }
    }
  });

  srv.kill('SIGTERM');
  const [code] = await once(srv, 'exit');
  await test('SIGTERM exits 0', async () => eq(code, 0, 'exit code'));
  for (const r of results) if (r.startsWith('FAIL')) console.log(r);
  console.log(`node-openai: ${passed} passed, ${failed} failed, 0 skipped`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.log(`FAIL setup: ${e && e.stack ? e.stack : e}`);
  console.log(`node-openai: ${passed} passed, ${failed + 1} failed, 0 skipped`);
  process.exit(1);
});
