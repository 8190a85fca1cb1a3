// llama.cpp's tokenizer (the prebuilt node-llama-cpp in bench/node_modules) on
// test strings, for making tokenizer test vectors:
//
//   node bench/llamacpp_tokenize.mjs VOCAB.gguf STRINGS.inp > STRINGS.out
//
// STRINGS.inp holds the strings separated by "\n__ggml_vocab_test__\n" (the
// tests/data/tokenizer format); each output line is " id id ..." for one
// string, without BOS/EOS and with special-token texts not parsed. A
// vocabulary-only GGUF is enough (llama.cpp's vocab_only load).
import fs from 'node:fs';
import { getLlama } from 'node-llama-cpp';

const [vocab, inp] = process.argv.slice(2);
if (!vocab || !inp) {
  console.error('usage: node bench/llamacpp_tokenize.mjs VOCAB.gguf STRINGS.inp');
  process.exit(2);
}
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const model = await llama.loadModel({ modelPath: vocab, vocabOnly: true });
const texts = fs.readFileSync(inp, 'utf8').split('\n__ggml_vocab_test__\n');
for (const t of texts) {
  const ids = Array.from(model.tokenize(t, false));
  process.stdout.write(ids.map((id) => ` ${id}`).join('') + '\n');
}
