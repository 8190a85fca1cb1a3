// The official openai SDK's embeddings.create against a running `sampan serve`
// (tests/py/test_encoder.py starts it with an encoder model and compares).
//
//   node encoder_sdk.mjs PORT MODEL TEXT...
//
// Prints one JSON line: {base64: [[...]], float: [[...]], usage, model}, the
// vectors as the SDK returns them with its default encoding (base64, which it
// decodes) and with encoding_format "float".
import OpenAI from 'openai';

const [port, model, ...input] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0 });
const a = await client.embeddings.create({ model, input });
const b = await client.embeddings.create({ model, input, encoding_format: 'float' });
console.log(JSON.stringify({
  base64: a.data.map((d) => Array.from(d.embedding)),
  float: b.data.map((d) => d.embedding),
  usage: a.usage,
  model: a.model,
}));
