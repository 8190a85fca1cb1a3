// OpenAI's Responses API through the official `openai` SDK, unchanged, against a running
// `sampan serve` on 127.0.0.1:$SAMPAN_PORT with an API key ($SAMPAN_KEY) and the demo model under a
// ChatML template with <think> and <tool_call> markup as "chat" (tests/py/test_responses.py starts
// it). A GBNF `grammar` (an extra body field the SDK passes through) makes the model write a given
// text; json_schema outputs are validated with ajv.
// Last line:  node-responses: N passed, N failed
import OpenAI from 'openai';
import Ajv from 'ajv';

const port = process.env.SAMPAN_PORT;
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: process.env.SAMPAN_KEY,
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
  type: 'function', name: 'get_weather', description: 'Weather for a city', strict: true,
  parameters: { type: 'object', additionalProperties: false, required: ['city'],
    properties: { city: { type: 'string', maxLength: 12 } } },
};

await test('responses.create: a message output item, output_text, usage, status', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Hello', instructions: 'Be brief.',
    temperature: 0, max_output_tokens: 40, grammar: lit('Hi there.'), metadata: { run: 'a' } });
  assert(r.object === 'response' && r.id.startsWith('resp_') && r.status === 'completed',
    JSON.stringify(r));
  assert(r.output.length === 1 && r.output[0].type === 'message' && r.output[0].id.startsWith('msg_') &&
    r.output[0].role === 'assistant' && r.output[0].content[0].type === 'output_text', JSON.stringify(r.output));
  assert(r.output_text === 'Hi there.', r.output_text);
  assert(r.usage.input_tokens > 0 && r.usage.output_tokens > 0 &&
    r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, JSON.stringify(r.usage));
  assert(r.instructions === 'Be brief.' && r.metadata.run === 'a' && r.model === MODEL &&
    typeof r.created_at === 'number', JSON.stringify(r));
});

await test('max_output_tokens: status incomplete, reason max_output_tokens', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Hello', temperature: 0,
    max_output_tokens: 2, grammar: lit('one two three four five') });
  assert(r.status === 'incomplete' && r.incomplete_details.reason === 'max_output_tokens' &&
    r.usage.output_tokens === 2, JSON.stringify(r));
});

await test('stream: the documented event order, sequence numbers, the same text', async () => {
  const s = await client.responses.create({ model: MODEL, input: 'Hello', temperature: 0,
    max_output_tokens: 40, stream: true, grammar: lit('One two three.') });
  const types = [];
  const seqs = [];
  let text = '', done = null, completed = null;
  for await (const e of s) {
    types.push(e.type);
    seqs.push(e.sequence_number);
    if (e.type === 'response.output_text.delta') text += e.delta;
    if (e.type === 'response.output_text.done') done = e.text;
    if (e.type === 'response.completed') completed = e.response;
  }
  const want = ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added'];
  assert(want.every((t, i) => types[i] === t), types.join(','));
  const tail = ['response.output_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.completed'];
  assert(tail.every((t, i) => types.at(i - 4) === t), types.join(','));
  assert(types.slice(4, -4).every((t) => t === 'response.output_text.delta') && types.length > 8,
    types.join(','));
  assert(seqs.every((n, i) => n === i), seqs.join(','));
  assert(text === 'One two three.' && done === text && completed.output[0].content[0].text === text &&
    completed.status === 'completed' && completed.usage.output_tokens > 0, `${text} ${JSON.stringify(completed)}`);
});

await test('responses.stream: the SDK rebuilds the response from the events (finalResponse)', async () => {
  const think = '<think>\nCount.\n</think>\n\nThree.';
  const stream = client.responses.stream({ model: MODEL, input: 'Hello', temperature: 0,
    max_output_tokens: 200, grammar: lit(think) });
  let text = '';
  stream.on('response.output_text.delta', (e) => { text += e.delta; });
  const r = await stream.finalResponse();
  assert(text === 'Three.', `deltas: ${JSON.stringify(text)}`);
  // (the SDK's stream helper adds no output_text convenience when nothing is auto-parsed)
  const msg = r.output.find((o) => o.type === 'message');
  assert(msg && msg.content[0].text === 'Three.' && r.status === 'completed', JSON.stringify(r));
  assert(r.output[0].type === 'reasoning' && r.output[0].content[0].text === 'Count.',
    JSON.stringify(r.output));
});

await test('function tools: a function_call item, then function_call_output with previous_response_id',
  async () => {
    const r = await client.responses.create({ model: MODEL, input: 'Weather in Paris?', temperature: 0,
      max_output_tokens: 60, tools: [weather], tool_choice: 'required' });
    const call = r.output.find((o) => o.type === 'function_call');
    assert(call && call.name === 'get_weather' && call.call_id.startsWith('call_') &&
      call.id.startsWith('fc_') && call.status === 'completed', JSON.stringify(r.output));
    const args = JSON.parse(call.arguments);
    assert(typeof args.city === 'string' && args.city.length <= 12 &&
      Object.keys(args).join() === 'city', call.arguments);
    const r2 = await client.responses.create({ model: MODEL, previous_response_id: r.id,
      temperature: 0, max_output_tokens: 20, tools: [weather], grammar: lit('It is warm.'),
      input: [{ type: 'function_call_output', call_id: call.call_id, output: '21 C and sunny' }] });
    assert(r2.status === 'completed' && r2.previous_response_id === r.id &&
      r2.output_text === 'It is warm.', JSON.stringify(r2));
    // the call, its result and the first question are all in the prompt
    assert(r2.usage.input_tokens > r.usage.input_tokens + 10, `${r2.usage.input_tokens} ${r.usage.input_tokens}`);
  });

await test('stream with a tool: function_call_arguments.delta / .done and the item', async () => {
  const s = await client.responses.create({ model: MODEL, input: 'Weather?', temperature: 0,
    max_output_tokens: 60, tools: [weather], tool_choice: { type: 'function', name: 'get_weather' },
    stream: true });
  let args = '', done = null, item = null;
  const types = [];
  for await (const e of s) {
    types.push(e.type);
    if (e.type === 'response.function_call_arguments.delta') args += e.delta;
    if (e.type === 'response.function_call_arguments.done') done = e.arguments;
    if (e.type === 'response.output_item.done' && e.item.type === 'function_call') item = e.item;
  }
  assert(item && done === args && item.arguments === args && typeof JSON.parse(args).city === 'string',
    `${args} ${JSON.stringify(item)}`);
  assert(types.at(-1) === 'response.completed', types.join(','));
});

await test('text.format json_schema: the output validates (ajv)', async () => {
  const schema = { type: 'object', additionalProperties: false, required: ['name', 'age'],
    properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer', minimum: 0, maximum: 120 } } };
  const r = await client.responses.create({ model: MODEL, input: 'A person', temperature: 0,
    max_output_tokens: 80, text: { format: { type: 'json_schema', name: 'person', schema, strict: true } } });
  const v = new Ajv().compile(schema);
  const out = JSON.parse(r.output_text);
  assert(v(out), `${r.output_text} ${JSON.stringify(v.errors)}`);
  assert(r.text.format.type === 'json_schema' && r.text.format.name === 'person', JSON.stringify(r.text));
});

await test('retrieve and delete; a deleted response is 404', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Keep me', temperature: 0,
    max_output_tokens: 8 });
  const g = await client.responses.retrieve(r.id);
  assert(g.id === r.id && g.output_text === r.output_text && g.status === r.status, JSON.stringify(g));
  await client.responses.delete(r.id);
  try {
    await client.responses.retrieve(r.id);
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof OpenAI.NotFoundError && e.status === 404, String(e));
  }
});

await test('responses.inputItems.list: the chained conversation, paged by the SDK', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'First question', temperature: 0,
    max_output_tokens: 40, grammar: lit('First answer.') });
  const r2 = await client.responses.create({ model: MODEL, previous_response_id: r.id, temperature: 0,
    max_output_tokens: 40, grammar: lit('Second answer.'),
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Second question' }] }] });
  const page = await client.responses.inputItems.list(r2.id, { order: 'asc' });
  const texts = page.data.map((i) => `${i.role}:${i.content[0].text}`);
  assert(JSON.stringify(texts) === JSON.stringify(['user:First question', 'assistant:First answer.',
    'user:Second question']), JSON.stringify(page.data));
  assert(page.data.every((i) => i.type === 'message' && typeof i.id === 'string') && !page.has_more,
    JSON.stringify(page.data));
  // limit 1: the SDK's auto-pagination follows after / has_more, newest first by default
  const seen = [];
  for await (const item of client.responses.inputItems.list(r2.id, { limit: 1 })) seen.push(item.id);
  assert(JSON.stringify(seen) === JSON.stringify(page.data.map((i) => i.id).reverse()), JSON.stringify(seen));
});

await test('store false: nothing kept (retrieve 404, previous_response_id 404)', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Forget me', temperature: 0,
    max_output_tokens: 4, store: false });
  assert(r.store === false, JSON.stringify(r));
  for (const f of [() => client.responses.retrieve(r.id),
    () => client.responses.create({ model: MODEL, input: 'again', previous_response_id: r.id })]) {
    try {
      await f();
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.NotFoundError, String(e));
    }
  }
});

await test('errors: a web_search tool and an image part are BadRequestError', async () => {
  for (const body of [{ tools: [{ type: 'web_search' }] },
    { input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }]) {
    try {
      await client.responses.create({ model: MODEL, input: 'x', ...body });
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.BadRequestError && e.status === 400 && /not supported/.test(e.message),
        String(e));
    }
  }
});

console.log(`node-responses: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
