// Tool calls and structured output through the official openai SDK (v6), against a running
// `sampan serve` with the demo model on 127.0.0.1:$SAMPAN_PORT (tests/py/test_structured.py
// starts it). Last line:  node-tools: N passed, N failed, N skipped
import OpenAI from 'openai';

const port = process.env.SAMPAN_PORT;
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0,
  timeout: 30000 });
const MODEL = 'stories260K';
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

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather for a city',
    parameters: {
      type: 'object', additionalProperties: false, required: ['city', 'unit'],
      properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } },
    },
  },
};
const checkArgs = (a) => typeof a.city === 'string' && a.city.length <= 12 && ['c', 'f'].includes(a.unit)
  && Object.keys(a).length === 2;

await test('tool_choice required: tool_calls parsed by the SDK, round trip with role tool', async () => {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await client.chat.completions.create({ model: MODEL, messages, tools: [weather],
    tool_choice: 'required', max_tokens: 80, seed: 1 });
  const c = r.choices[0];
  assert(c.finish_reason === 'tool_calls', `finish ${c.finish_reason}`);
  const call = c.message.tool_calls[0];
  assert(call.type === 'function' && call.function.name === 'get_weather', JSON.stringify(call));
  assert(checkArgs(JSON.parse(call.function.arguments)), call.function.arguments);
  // send the call and a result back, as an application would
  messages.push(c.message);
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' });
  const r2 = await client.chat.completions.create({ model: MODEL, messages, tools: [weather],
    max_tokens: 8, seed: 2 });
  assert(typeof r2.choices[0].message.content === 'string', 'a text answer after the tool result');
  assert(r2.usage.prompt_tokens > r.usage.prompt_tokens, 'the tool turn is in the prompt');
});

await test('streamed tool call deltas accumulate (stream helper)', async () => {
  const stream = client.chat.completions.stream({ model: MODEL, stream: true,
    messages: [{ role: 'user', content: 'Weather?' }], tools: [weather],
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 80, seed: 3 });
  const done = await stream.finalChatCompletion();
  const c = done.choices[0];
  assert(c.finish_reason === 'tool_calls', `finish ${c.finish_reason}`);
  const call = c.message.tool_calls[0];
  assert(call.id.startsWith('call_') && call.function.name === 'get_weather', JSON.stringify(call));
  assert(checkArgs(JSON.parse(call.function.arguments)), call.function.arguments);
});

await test('response_format json_schema through the SDK', async () => {
  const schema = { type: 'object', required: ['name', 'n'], additionalProperties: false,
    properties: { name: { type: 'string', maxLength: 10 }, n: { type: 'integer' } } };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ model: MODEL, max_tokens: 60, seed,
      messages: [{ role: 'user', content: 'A cat' }],
      response_format: { type: 'json_schema', json_schema: { name: 'cat', schema, strict: true } } });
    const v = JSON.parse(r.choices[0].message.content);
    assert(typeof v.name === 'string' && Number.isInteger(v.n) && Object.keys(v).length === 2,
      r.choices[0].message.content);
  }
});

await test('a bad schema is a 400 BadRequestError naming the parameter', async () => {
  try {
    await client.chat.completions.create({ model: MODEL, max_tokens: 8,
      messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'x',
        schema: { type: 'string', pattern: '(?<=a)b' } } } });
    throw new Error('no error');
  } catch (e) {
    assert(e.status === 400 && e.param === 'response_format.json_schema.schema', `${e.status} ${e.param}`);
    assert(/lookbehind/.test(e.message), e.message);
  }
});

console.log(`node-tools: ${passed} passed, ${failed} failed, 0 skipped`);
process.exit(failed ? 1 : 0);
