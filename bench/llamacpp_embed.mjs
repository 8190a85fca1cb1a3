// llama.cpp's embeddings (the prebuilt node-llama-cpp in bench/node_modules) of
// texts, for comparing an encoder's vectors with Sampan's:
//
//   node bench/llamacpp_embed.mjs MODEL.gguf TEXT...
//
// Prints one JSON array: per text, the pooled vector as llama.cpp returns it
// (the model's pooling type; not normalised here).
import { getLlama } from 'node-llama-cpp';

const [modelPath, ...texts] = process.argv.slice(2);
if (!modelPath || texts.length === 0) {
  console.error('usage: node bench/llamacpp_embed.mjs MODEL.gguf TEXT...');
  process.exit(2);
}
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath });
const ctx = await model.createEmbeddingContext({ threads: 1 });
const out = [];
for (const t of texts) {
  const e = await ctx.getEmbeddingFor(t);
  out.push(Array.from(e.vector));
}
console.log(JSON.stringify(out));
await ctx.dispose();
await model.dispose();
