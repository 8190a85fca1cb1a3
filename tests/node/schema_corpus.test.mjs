// The JSON Schema corpus against a running `sampan serve` with the demo model on
// 127.0.0.1:$SAMPAN_PORT (tests/py/test_structured_clients.py starts it): every supported keyword,
// alone and in combination, through response_format json_schema, tool parameters and vLLM's
// structured_outputs / guided_* fields; each output validated with ajv + ajv-formats (not just
// parsed). The demo model is a tiny story model, so only the grammar makes its output valid.
// Then the refused constructs (400 naming them) and schema bombs (a quick 400, not a hang).
// Last line:  node-schema: N passed, N failed, N skipped
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const port = process.env.SAMPAN_PORT;
const base = `http://127.0.0.1:${port}/v1`;
const MODEL = 'stories260K';
let passed = 0, failed = 0;

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

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
async function post(path, body) {
  const r = await fetch(base + path, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body), signal: AbortSignal.timeout(60000) });
  return { status: r.status, body: await r.json() };
}
function validates(schema, text) {
  let v;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON: ${text}`);
  }
  const check = ajv.compile(schema);
  if (!check(v)) throw new Error(`${JSON.stringify(check.errors).slice(0, 300)} in ${text}`);
  return v;
}

const CORPUS = {
  integers: {
    type: 'object', additionalProperties: false, required: ['a', 'b', 'c', 'd', 'e'],
    properties: {
      a: { type: 'integer', minimum: 1, maximum: 10 },
      b: { type: 'integer', exclusiveMinimum: -5, exclusiveMaximum: 5 },
      c: { type: 'integer', multipleOf: 7 },
      d: { type: 'integer', minimum: 100, maximum: 1000, multipleOf: 25 },
      e: { type: 'integer', minimum: -9007199254740991, maximum: 9007199254740991 },
    },
  },
  numbers: {
    type: 'object', additionalProperties: false, required: ['p', 'f', 'm', 'n', 'x'],
    properties: {
      p: { type: 'number', exclusiveMinimum: 0 },
      f: { type: 'number', minimum: -1.5, maximum: 2.25 },
      m: { type: 'number', multipleOf: 0.01, minimum: 0, maximum: 1 },
      n: { type: ['number', 'null'], maximum: -0.5 },
      x: { type: 'number', exclusiveMaximum: 100, exclusiveMinimum: 99 },
    },
  },
  strings: {
    type: 'object', additionalProperties: false,
    required: ['s', 'email', 'uuid', 'dt', 'date', 'time', 'uri', 'ip', 'code', 'loose', 'capped'],
    properties: {
      s: { type: 'string', minLength: 2, maxLength: 5 },
      email: { type: 'string', format: 'email' },
      uuid: { type: 'string', format: 'uuid' },
      dt: { type: 'string', format: 'date-time' },
      date: { type: 'string', format: 'date' },
      time: { type: 'string', format: 'time' },
      uri: { type: 'string', format: 'uri' },
      ip: { type: 'string', format: 'ipv4' },
      code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}(?:\\.[a-f]+)?$' },
      loose: { type: 'string', pattern: 'x+y' },
      capped: { type: 'string', pattern: '^[a-z]+(?:\\.[a-z]+)*@[a-z]+\\.[a-z]{2,}$', maxLength: 24 },
    },
  },
  arrays: {
    type: 'object', additionalProperties: false, required: ['tags', 'digits', 'flags', 'any'],
    properties: {
      tags: { type: 'array', uniqueItems: true, items: { type: 'string', enum: ['red', 'green', 'blue'] } },
      digits: { type: 'array', minItems: 1, maxItems: 3, items: { type: 'integer', minimum: 0, maximum: 9 } },
      flags: { type: 'array', uniqueItems: true, minItems: 1, items: { type: 'boolean' } },
      any: { type: 'array', maxItems: 2 },
    },
  },
  combinators: {
    type: 'object', additionalProperties: false, required: ['any', 'one', 'all', 'c', 'e', 'u'],
    properties: {
      any: { anyOf: [{ type: 'string', format: 'date' }, { type: 'integer', minimum: 0, maximum: 3 }] },
      one: { oneOf: [{ type: 'null' }, { type: 'boolean' }] },
      all: { allOf: [{ type: 'object', properties: { x: { type: 'integer', maximum: 0 } }, required: ['x'] },
        { properties: { y: { type: 'string', maxLength: 3 } }, required: ['y'] }] },
      c: { const: 'fixed' },
      e: { enum: ['a', 1, null, true] },
      u: { type: ['string', 'integer', 'null'], maxLength: 4, minimum: 5 },
    },
  },
  refs: {
    $defs: {
      node: { type: 'object', additionalProperties: false, required: ['v', 'kids'],
        properties: { v: { type: 'integer', minimum: 0, maximum: 99 },
          kids: { type: 'array', maxItems: 2, items: { $ref: '#/$defs/node' } } } },
    },
    type: 'object', required: ['root'], properties: { root: { $ref: '#/$defs/node' }, note: { type: 'string', maxLength: 4 } },
    additionalProperties: false,
  },
  // oneOf whose branches exclude each other: different types, const/enum values, and a tagged
  // union (a required const discriminator, through $defs as pydantic writes it)
  one_of: {
    $defs: {
      circle: { type: 'object', additionalProperties: false, required: ['shape', 'r'],
        properties: { shape: { const: 'circle' }, r: { type: 'integer', minimum: 1, maximum: 9 } } },
      square: { type: 'object', additionalProperties: false, required: ['shape', 'side'],
        properties: { shape: { type: 'string', enum: ['square'] }, side: { type: 'integer', minimum: 1, maximum: 9 } } },
    },
    type: 'object', additionalProperties: false, required: ['item', 'size', 'unit'],
    properties: {
      item: { oneOf: [{ $ref: '#/$defs/circle' }, { $ref: '#/$defs/square' }] },
      size: { oneOf: [{ type: 'integer', minimum: 0, maximum: 5 }, { type: 'string', maxLength: 3 }, { type: 'null' }] },
      unit: { oneOf: [{ const: 'cm' }, { enum: ['in', 'ft'] }] },
    },
  },
  optional_order: {
    type: 'object', required: ['z', 'a'], additionalProperties: { type: 'integer' },
    properties: { z: { type: 'integer', minimum: 1, maximum: 3 }, m: { type: 'boolean' }, a: { type: 'string', format: 'date' } },
  },
};

const SEEDS = [1, 2, 3];
const messages = [{ role: 'user', content: 'Tell me about a cat' }];

for (const [name, schema] of Object.entries(CORPUS)) {
  await test(`response_format json_schema ${name}: ${SEEDS.length} seeds validate (ajv)`, async () => {
    for (const seed of SEEDS) {
      const r = await post('/chat/completions', { model: MODEL, messages, seed, temperature: 1, max_tokens: 400,
        response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } } });
      assert(r.status === 200, JSON.stringify(r.body));
      const v = validates(schema, r.body.choices[0].message.content);
      if (schema.required && schema.properties) {
        // properties come in the schema's order
        const order = Object.keys(schema.properties);
        const got = Object.keys(v).filter((k) => order.includes(k));
        assert(got.every((k, i) => i === 0 || order.indexOf(got[i - 1]) < order.indexOf(k)),
          `order ${got} vs ${order}`);
      }
    }
  });
}

await test('tool parameters: the same keywords in a forced call validate', async () => {
  for (const seed of SEEDS) {
    const schema = CORPUS.strings;
    const r = await post('/chat/completions', { model: MODEL, messages, seed, max_tokens: 400,
      tools: [{ type: 'function', function: { name: 'save', parameters: schema } }], tool_choice: 'required' });
    assert(r.status === 200, JSON.stringify(r.body));
    const call = r.body.choices[0].message.tool_calls[0];
    validates(schema, call.function.arguments);
  }
});

await test('vLLM structured_outputs.json and guided_json (object and JSON text) validate', async () => {
  const schema = CORPUS.integers;
  for (const [i, extra] of [{ structured_outputs: { json: schema } }, { guided_json: schema },
    { guided_json: JSON.stringify(schema) }].entries()) {
    const r = await post('/completions', { model: MODEL, prompt: 'Once upon a time', seed: i, max_tokens: 200, ...extra });
    assert(r.status === 200, JSON.stringify(r.body));
    validates(schema, r.body.choices[0].text);
  }
});

await test('vLLM regex / choice / grammar / json_object (both spellings)', async () => {
  const re = '[A-Z][a-z]{2,5} (cat|dog)s? [0-9]{1,3}!';
  const full = new RegExp(`^(?:${re})$`);
  for (const extra of [{ guided_regex: re }, { structured_outputs: { regex: re } }]) {
    for (const seed of SEEDS) {
      const r = await post('/completions', { model: MODEL, prompt: 'Once', seed, max_tokens: 40, ...extra });
      assert(r.status === 200 && full.test(r.body.choices[0].text), JSON.stringify(r.body));
    }
  }
  const choices = ['yes', 'no', 'maybe "so"'];
  for (const extra of [{ guided_choice: choices }, { structured_outputs: { choice: choices } }]) {
    const r = await post('/chat/completions', { model: MODEL, messages, seed: 4, max_tokens: 20, ...extra });
    assert(r.status === 200 && choices.includes(r.body.choices[0].message.content), JSON.stringify(r.body));
  }
  const gbnf = 'root ::= "n=" [0-9] [0-9]?';
  for (const extra of [{ guided_grammar: gbnf }, { structured_outputs: { grammar: gbnf } }]) {
    const r = await post('/completions', { model: MODEL, prompt: 'Once', seed: 5, max_tokens: 20, ...extra });
    assert(r.status === 200 && /^n=[0-9]{1,2}$/.test(r.body.choices[0].text), JSON.stringify(r.body));
  }
  const r = await post('/completions', { model: MODEL, prompt: 'Once', seed: 6, max_tokens: 60,
    structured_outputs: { json_object: true } });
  assert(r.status === 200, JSON.stringify(r.body));
  const v = JSON.parse(r.body.choices[0].text);
  assert(typeof v === 'object' && v !== null && !Array.isArray(v), r.body.choices[0].text);
});

const REFUSED = [
  [{ type: 'string', pattern: '^(?=a)a$' }, 'lookahead'],
  [{ type: 'string', pattern: '(a)\\1' }, 'backreference'],
  [{ type: 'string', pattern: '\\bcat' }, 'word boundary'],
  [{ type: 'string', format: 'hostname' }, "format 'hostname'"],
  [{ type: 'array', uniqueItems: true, items: { type: 'string' } }, 'uniqueItems'],
  [{ not: { type: 'string' } }, "'not'"],
  [{ type: 'number', multipleOf: 0.3 }, 'multipleOf'],
  [{ type: 'integer', minimum: 5, maximum: 1 }, 'no value'],
  [{ type: 'string', pattern: '^a+$', minLength: 3 }, "'minLength' beside a 'pattern'"],
  [{ type: 'string', pattern: '^abc+$', maxLength: 2 }, "'maxLength' is below every match"],
  [{ allOf: [{ type: 'string' }, { type: 'integer' }] }, "disagree on 'type'"],
  [{ oneOf: [{ type: 'integer' }, { type: 'number' }] }, "'oneOf' branches 0 and 1"],
  [{ oneOf: [{ type: 'object', properties: { k: { const: 1 } }, required: ['k'] },
    { type: 'object', properties: { k: { const: 1 } }, required: ['k'] }] }, "'oneOf' branches 0 and 1"],
  [{ type: 'object', properties: { a: { type: 'string' } }, patternProperties: { '^x': {} } }, 'patternProperties'],
];

await test('refused constructs: 400 naming the construct and where it is', async () => {
  for (const [schema, needle] of REFUSED) {
    const wrapped = { type: 'object', properties: { f: schema }, required: ['f'] };
    const r = await post('/chat/completions', { model: MODEL, messages, max_tokens: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: wrapped } } });
    assert(r.status === 400, `${JSON.stringify(schema)}: ${r.status}`);
    const m = r.body.error.message;
    assert(m.includes(needle) && m.includes('/properties/f') && r.body.error.param ===
      'response_format.json_schema.schema', `${JSON.stringify(schema)}: ${m}`);
  }
  // the same in tool parameters and guided_json, naming their fields
  const r = await post('/chat/completions', { model: MODEL, messages, max_tokens: 5,
    tools: [{ type: 'function', function: { name: 'f', parameters: REFUSED[0][0] } }], tool_choice: 'required' });
  assert(r.status === 400 && r.body.error.message.includes('lookahead'), JSON.stringify(r.body));
  const g = await post('/completions', { model: MODEL, prompt: 'x', max_tokens: 5, guided_json: REFUSED[3][0] });
  assert(g.status === 400 && g.body.error.param === 'guided_json', JSON.stringify(g.body));
  const x = await post('/completions', { model: MODEL, prompt: 'x', max_tokens: 5, guided_regex: 'a(?<=b)' });
  assert(x.status === 400 && x.body.error.param === 'guided_regex' && x.body.error.message.includes('lookbehind'),
    JSON.stringify(x.body));
  const two = await post('/completions', { model: MODEL, prompt: 'x', max_tokens: 5, guided_regex: 'a',
    response_format: { type: 'json_object' } });
  assert(two.status === 400, JSON.stringify(two.body));
  const tag = await post('/completions', { model: MODEL, prompt: 'x', max_tokens: 5,
    structured_outputs: { structural_tag: '{}' } });
  assert(tag.status === 400 && tag.body.error.message.includes('structural_tag'), JSON.stringify(tag.body));
});

await test('schema bombs: a quick 400 (limit_exceeded where a limit was hit), never a hang', async () => {
  const t0 = Date.now();
  let deep = { type: 'null' };
  for (let i = 0; i < 200; i++) deep = { type: 'array', items: deep };
  const props = {};
  for (let i = 0; i < 4000; i++) props[`p${i}`] = { type: 'number', minimum: -i - 0.123457, maximum: 987654321 + i + 0.654321 };
  const bombs = [
    [deep, null],
    [{ type: 'object', properties: props }, 'limit_exceeded'],
    [{ type: 'string', pattern: '^((((a{4096}){4096}){4096}){4096})$' }, null],
    [{ type: 'string', pattern: '('.repeat(100) + 'a' + ')'.repeat(100) }, 'limit_exceeded'],
    [{ type: 'integer', multipleOf: 997, minimum: 1 }, null],
  ];
  for (const [schema, code] of bombs) {
    const r = await post('/chat/completions', { model: MODEL, messages, max_tokens: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'b', schema } } });
    assert(r.status === 400, `${JSON.stringify(schema).slice(0, 80)}: ${r.status}`);
    assert(code === null || r.body.error.code === code, JSON.stringify(r.body).slice(0, 300));
  }
  assert(Date.now() - t0 < 20000, `bombs took ${Date.now() - t0} ms`);
});

console.log(`node-schema: ${passed} passed, ${failed} failed, 0 skipped`);
process.exit(failed ? 1 : 0);
