// Structured output through the clients people use, unchanged, against a running `sampan serve`
// with the demo model on 127.0.0.1:$SAMPAN_PORT (tests/py/test_structured_clients.py starts it):
// the openai SDK's chat.completions.parse with zodResponseFormat and zodFunction (zod 4: integers
// with min/max, positive numbers, string formats, regex, enums, nullable), the Vercel AI SDK's
// generateObject and streamText (ai + @ai-sdk/openai-compatible), LangChain's withStructuredOutput
// (@langchain/openai). Each result is checked with zod and with ajv on the JSON schema the client
// sent. Last line:  node-clients: N passed, N failed, N skipped
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { generateObject, generateText, jsonSchema, streamText } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import Ajv2020 from 'ajv/dist/2020.js';
import AjvDraft7 from 'ajv';
import addFormats from 'ajv-formats';

const port = process.env.SAMPAN_PORT;
const baseURL = `http://127.0.0.1:${port}/v1`;
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
// ajv for the draft the schema names (zod writes draft-07 for openai, 2020-12 by default)
function ajvCheck(schema, value) {
  const draft7 = typeof schema.$schema === 'string' && schema.$schema.includes('draft-07');
  const ajv = draft7 ? new AjvDraft7({ strict: false }) : new Ajv2020({ strict: false });
  addFormats(ajv);
  const check = ajv.compile(schema);
  if (!check(value)) throw new Error(`ajv: ${JSON.stringify(check.errors).slice(0, 300)} in ${JSON.stringify(value)}`);
}

// What the issue reported as 400s: integers with bounds, string formats and patterns.
const Person = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(120),
  score: z.number().positive(),
  ratio: z.number().min(-1).max(1),
  email: z.string().email().max(64), // unbounded repeats of zod's pattern capped to fit
  id: z.string().uuid(),
  born: z.string().datetime().max(32), // the demo model would write fraction digits to the budget
  day: z.iso.date(),
  ip: z.ipv4(),
  code: z.string().regex(/^[A-Z]{3}-\d{2}$/),
  pet: z.enum(['cat', 'dog', 'none']),
  nick: z.string().max(6).nullable(),
  tags: z.array(z.string().max(5)).min(1).max(3),
  count: z.number().int().multipleOf(5),
});

const openai = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'Describe a person.' }];

await test('openai chat.completions.parse + zodResponseFormat: parsed, zod- and ajv-valid', async () => {
  const rf = zodResponseFormat(Person, 'person');
  for (const seed of [1, 2, 3]) {
    const r = await openai.chat.completions.parse({ model: MODEL, messages, response_format: rf, seed,
      max_completion_tokens: 1500 });
    const p = r.choices[0].message.parsed;
    assert(p !== null, r.choices[0].message.content);
    Person.parse(p); // throws when invalid
    ajvCheck(rf.json_schema.schema, p);
  }
});

await test('openai zodFunction tool with tool_choice: parsed_arguments valid', async () => {
  const tool = zodFunction({ name: 'book', parameters: z.object({
    nights: z.number().int().min(1).max(14), date: z.iso.date(), email: z.string().email().max(40),
    rooms: z.array(z.enum(['single', 'double'])).min(1).max(2),
  }) });
  for (const seed of [4, 5]) {
    const r = await openai.chat.completions.parse({ model: MODEL, seed, max_completion_tokens: 300,
      messages: [{ role: 'user', content: 'Book a room' }], tools: [tool],
      tool_choice: { type: 'function', function: { name: 'book' } } });
    const call = r.choices[0].message.tool_calls[0];
    assert(call.function.name === 'book', JSON.stringify(call));
    const a = call.function.parsed_arguments;
    assert(Number.isInteger(a.nights) && a.nights >= 1 && a.nights <= 14, JSON.stringify(a));
    ajvCheck(tool.function.parameters, a);
  }
});

await test('Vercel AI SDK generateObject (openai-compatible, structured outputs): zod-valid', async () => {
  const provider = createOpenAICompatible({ name: 'sampan', baseURL, apiKey: 'unused',
    supportsStructuredOutputs: true });
  const schema = Person.omit({ born: true, ip: true });
  for (const seed of [6, 7]) {
    const { object, request } = await generateObject({ model: provider.chatModel(MODEL), schema, seed,
      maxOutputTokens: 500, maxRetries: 0, prompt: 'Describe a person.' });
    schema.parse(object);
    const sent = JSON.parse(request.body.constructor === String ? request.body : JSON.stringify(request.body));
    ajvCheck(sent.response_format.json_schema.schema, object);
  }
  // a plain JSON schema through the AI SDK's jsonSchema helper
  const js = { type: 'object', additionalProperties: false, required: ['n', 'when'],
    properties: { n: { type: 'integer', minimum: 10, maximum: 20 }, when: { type: 'string', format: 'date-time' } } };
  const { object } = await generateObject({ model: provider.chatModel(MODEL), schema: jsonSchema(js), seed: 8,
    maxOutputTokens: 200, maxRetries: 0, prompt: 'When?' });
  ajvCheck(js, object);
});

await test('Vercel AI SDK streamText: the streamed text is the whole answer (greedy, = generateText)', async () => {
  // includeUsage: the provider asks for stream_options.include_usage
  const provider = createOpenAICompatible({ name: 'sampan', baseURL, apiKey: 'unused', includeUsage: true });
  const args = { model: provider.chatModel(MODEL), prompt: 'Once upon a time', temperature: 0,
    maxOutputTokens: 40, maxRetries: 0 };
  const r = streamText(args);
  let streamed = '', parts = 0;
  for await (const t of r.textStream) {
    streamed += t;
    parts++;
  }
  const whole = await generateText(args);
  const usage = await r.usage;
  assert(parts > 1, `one text part only: ${parts}`);
  assert(streamed.length > 0 && streamed === whole.text, `streamed ${JSON.stringify(streamed)} != ${JSON.stringify(whole.text)}`);
  assert(await r.finishReason === 'length', `finish ${await r.finishReason}`);
  assert(usage.outputTokens === 40, `usage ${JSON.stringify(usage)}`);
});

await test('LangChain ChatOpenAI.withStructuredOutput (json schema and function calling): zod-valid', async () => {
  const llm = new ChatOpenAI({ model: MODEL, apiKey: 'unused', configuration: { baseURL }, maxRetries: 0,
    maxTokens: 1500, temperature: 1 });
  const schema = Person.omit({ born: true, tags: true });
  for (const method of ['jsonSchema', 'functionCalling']) {
    const structured = llm.withStructuredOutput(schema, { name: 'person', method });
    const out = await structured.invoke('Describe a person.');
    schema.parse(out);
  }
});

console.log(`node-clients: ${passed} passed, ${failed} failed, 0 skipped`);
process.exit(failed ? 1 : 0);
