// reasoning_content and tool calls through the official openai SDK (v6), against a running
// `sampan serve` on 127.0.0.1:$SAMPAN_PORT whose repository holds the demo model under
// chat templates of several families (tests/py/test_reasoning.py starts it). A GBNF `grammar`
// (an extra body field the SDK passes through) makes the model write a reasoning model's text.
// Last line:  node-reasoning: N passed, N failed
import OpenAI from 'openai';

const port = process.env.SAMPAN_PORT;
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0,
  timeout: 60000 });
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
  type: 'function',
  function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } },
};
const messages = [{ role: 'user', content: 'What is 2+2?' }];
const THINK = '<think>\nI add two and two.\n</think>\n\nFour.';

await test('message.reasoning_content beside message.content', async () => {
  const r = await client.chat.completions.create({ model: 'think', messages, max_tokens: 400,
    temperature: 0, grammar: lit(THINK) });
  const m = r.choices[0].message;
  assert(m.reasoning_content === 'I add two and two.', JSON.stringify(m));
  assert(m.content === 'Four.', JSON.stringify(m));
});

await test('streamed delta.reasoning_content and delta.content', async () => {
  const stream = await client.chat.completions.create({ model: 'think', messages, max_tokens: 400,
    temperature: 0, grammar: lit(THINK), stream: true });
  let reasoning = '', content = '', finish = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    reasoning += ch.delta.reasoning_content ?? '';
    content += ch.delta.content ?? '';
    finish = ch.finish_reason ?? finish;
  }
  assert(reasoning === 'I add two and two.', reasoning);
  assert(content === 'Four.', content);
  assert(finish === 'stop', finish);
});

await test('reasoning then a tool call: the stream helper accumulates tool_calls', async () => {
  const text = '<think>\nCall it.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": ' +
    '{"city": "Paris"}}\n</tool_call>';
  const stream = client.chat.completions.stream({ model: 'think', messages, tools: [weather],
    max_tokens: 400, temperature: 0, grammar: lit(text), stream: true });
  const done = await stream.finalChatCompletion();
  const c = done.choices[0];
  assert(c.finish_reason === 'tool_calls', `finish ${c.finish_reason}`);
  const call = c.message.tool_calls[0];
  assert(call.type === 'function' && call.function.name === 'get_weather', JSON.stringify(call));
  assert(JSON.parse(call.function.arguments).city === 'Paris', call.function.arguments);
});

await test('gpt-oss harmony: analysis as reasoning_content, a call to functions.get_weather', async () => {
  const text = '<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>' +
    'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}';
  const r = await client.chat.completions.create({ model: 'oss', messages, tools: [weather],
    max_tokens: 400, temperature: 0, grammar: lit(text) });
  const m = r.choices[0].message;
  assert(r.choices[0].finish_reason === 'tool_calls', JSON.stringify(r.choices[0]));
  assert(m.reasoning_content === 'Need weather.' && m.content === null, JSON.stringify(m));
  assert(m.tool_calls[0].function.name === 'get_weather', JSON.stringify(m.tool_calls));
  // the answer goes back as history, as an application would send it
  const r2 = await client.chat.completions.create({ model: 'oss', max_tokens: 200, temperature: 0,
    messages: [...messages, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: 'sunny' }],
    grammar: lit('<|channel|>final<|message|>Sunny.') });
  assert(r2.choices[0].message.content === 'Sunny.', JSON.stringify(r2.choices[0]));
});

console.log(`node-reasoning: ${passed} passed, ${failed} failed`);
