// Anthropic's Messages API through the official @anthropic-ai/sdk, unchanged, against a running
// `sampan serve` on 127.0.0.1:$SAMPAN_PORT with an API key ($SAMPAN_KEY, sent by the SDK as
// x-api-key) and the demo model under a ChatML template with <think> and <tool_call> markup as
// "chat" (tests/py/test_anthropic.py starts it). A GBNF `grammar` (an extra body field the SDK
// passes through) makes the model write a given text.
// Last line:  node-anthropic: N passed, N failed
import Anthropic from '@anthropic-ai/sdk';

const port = process.env.SAMPAN_PORT;
const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: process.env.SAMPAN_KEY,
  maxRetries: 0, timeout: 60000 });
const MODEL = 'chat';
let passed = 0, failed = 0;

function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}
async function test(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
  }
}

const lit = (text) => `root ::= ${JSON.stringify(text)}`;
const weather = {
  name: 'get_weather', description: 'Weather for a city',
  input_schema: { type: 'object', additionalProperties: false, required: ['city'],
    properties: { city: { type: 'string', maxLength: 12 } } },
};

await test('messages.create: a text block, stop_reason, usage', async () => {
  const r = await client.messages.create({ model: MODEL, max_tokens: 40, temperature: 0,
    system: 'Be brief.', messages: [{ role: 'user', content: 'Hello' }], grammar: lit('Hi there.') });
  assert(r.type === 'message' && r.role === 'assistant' && r.id.startsWith('msg_'), JSON.stringify(r));
  assert(r.content.length === 1 && r.content[0].type === 'text' && r.content[0].text === 'Hi there.',
    JSON.stringify(r.content));
  assert(r.stop_reason === 'end_turn' && r.stop_sequence === null, r.stop_reason);
  assert(r.usage.input_tokens > 0 && r.usage.output_tokens > 0, JSON.stringify(r.usage));
});

await test('stop_sequences: stop_reason stop_sequence with the sequence', async () => {
  const r = await client.messages.create({ model: MODEL, max_tokens: 40, temperature: 0,
    stop_sequences: ['world'], messages: [{ role: 'user', content: 'Hello' }],
    grammar: lit('Hello world.') });
  assert(r.stop_reason === 'stop_sequence' && r.stop_sequence === 'world', JSON.stringify(r));
  assert(r.content[0].text === 'Hello ', JSON.stringify(r.content));
});

await test('messages.stream: text events, finalMessage, the raw event order', async () => {
  const stream = client.messages.stream({ model: MODEL, max_tokens: 40, temperature: 0,
    messages: [{ role: 'user', content: 'Hello' }], grammar: lit('One two three.') });
  let text = '';
  const types = [];
  stream.on('text', (t) => { text += t; });
  stream.on('streamEvent', (e) => { types.push(e.type); });
  const m = await stream.finalMessage();
  assert(text === 'One two three.' && m.content[0].text === text, `${text} ${JSON.stringify(m)}`);
  assert(m.stop_reason === 'end_turn' && m.usage.output_tokens > 0, JSON.stringify(m));
  assert(types[0] === 'message_start' && types[1] === 'content_block_start' &&
    types.at(-3) === 'content_block_stop' && types.at(-2) === 'message_delta' &&
    types.at(-1) === 'message_stop', types.join(','));
});

await test('create({stream: true}) yields the events as an async iterable', async () => {
  const s = await client.messages.create({ model: MODEL, max_tokens: 3, temperature: 0, stream: true,
    messages: [{ role: 'user', content: 'Hello' }], grammar: lit('a b c d e f g h') });
  let delta = null;
  for await (const e of s) {
    if (e.type === 'message_delta') delta = e;
  }
  assert(delta && delta.delta.stop_reason === 'max_tokens' && delta.usage.output_tokens === 3,
    JSON.stringify(delta));
});

await test('tools: tool_use with tool_choice any, then the tool_result round trip', async () => {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await client.messages.create({ model: MODEL, max_tokens: 60, temperature: 0,
    tools: [weather], tool_choice: { type: 'any' }, messages });
  assert(r.stop_reason === 'tool_use', r.stop_reason);
  const use = r.content.find((b) => b.type === 'tool_use');
  assert(use && use.name === 'get_weather' && use.id.startsWith('toolu_') &&
    typeof use.input.city === 'string' && use.input.city.length <= 12, JSON.stringify(r.content));
  messages.push({ role: 'assistant', content: r.content });
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id,
    content: [{ type: 'text', text: '21 C' }] }] });
  const r2 = await client.messages.create({ model: MODEL, max_tokens: 8, temperature: 0,
    tools: [weather], messages });
  assert(r2.content[0].type === 'text', JSON.stringify(r2.content));
  assert(r2.usage.input_tokens > r.usage.input_tokens, 'the call and result are in the prompt');
});

await test('messages.stream with a tool: inputJson events and the parsed input', async () => {
  const stream = client.messages.stream({ model: MODEL, max_tokens: 60, temperature: 0,
    tools: [weather], tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather?' }] });
  let partial = '';
  stream.on('inputJson', (d) => { partial += d; });
  const m = await stream.finalMessage();
  const use = m.content.find((b) => b.type === 'tool_use');
  assert(use && typeof use.input.city === 'string' && JSON.stringify(JSON.parse(partial)) ===
    JSON.stringify(use.input), `${partial} ${JSON.stringify(m.content)}`);
  assert(m.stop_reason === 'tool_use', m.stop_reason);
});

await test('thinking: thinking blocks, one-shot and streamed (thinking events)', async () => {
  const think = '<think>\nCount the words.\n</think>\n\nThree.';
  const args = { model: MODEL, max_tokens: 2048, temperature: 0, grammar: lit(think),
    thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'Hi' }] };
  const r = await client.messages.create(args);
  assert(r.content.map((b) => b.type).join() === 'thinking,text' &&
    r.content[0].thinking === 'Count the words.' && r.content[1].text === 'Three.',
    JSON.stringify(r.content));
  const stream = client.messages.stream(args);
  let th = '';
  stream.on('thinking', (d) => { th += d; });
  const m = await stream.finalMessage();
  assert(th === 'Count the words.' && m.content[0].type === 'thinking' &&
    m.content[1].text === 'Three.', `${th} ${JSON.stringify(m.content)}`);
});

await test('messages.countTokens equals the usage of the same call', async () => {
  const body = { model: MODEL, system: [{ type: 'text', text: 'Be brief.' }], tools: [weather],
    messages: [{ role: 'user', content: 'Count me' }] };
  const c = await client.messages.countTokens(body);
  const r = await client.messages.create({ ...body, max_tokens: 2, temperature: 0 });
  assert(c.input_tokens === r.usage.input_tokens && c.input_tokens > 0,
    `${c.input_tokens} ${r.usage.input_tokens}`);
});

await test('errors: BadRequestError and NotFoundError with Anthropic error bodies', async () => {
  try {
    await client.messages.create({ model: MODEL, max_tokens: 8, messages: [{ role: 'user',
      content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] });
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof Anthropic.BadRequestError && e.status === 400, String(e));
    assert(e.error.type === 'error' && e.error.error.type === 'invalid_request_error' &&
      /image/.test(e.error.error.message), JSON.stringify(e.error));
  }
  try {
    await client.messages.create({ model: 'nope', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] });
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error', String(e));
  }
  const bad = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'sk-wrong', maxRetries: 0 });
  try {
    await bad.messages.create({ model: MODEL, max_tokens: 8, messages: [{ role: 'user', content: 'x' }] });
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error',
      String(e));
  }
});

console.log(`node-anthropic: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
