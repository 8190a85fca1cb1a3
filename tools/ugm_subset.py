#!/usr/bin/python3
"""ugm_subset.py - a small t5 (Unigram) vocabulary cut from a big one, for tokenizer tests.

    tools/ugm_subset.py BIG.gguf STRINGS.inp OUT.gguf

Keeps the specials (ids 0-3 and the mask token), the lowest-scoring normal token (the
unknown token's score derives from it) and every token whose text occurs in a variant of a
test string (as written, NFC/NFKC/NFKD, with a leading space, spaces collapsed; spaces as
U+2581): the tokens the Viterbi lattice of those strings can use. Scores, types, the
precompiled charsmap and the tokenizer flags are copied; special ids are renumbered. Whether
the subset is complete is checked by tokenizing the strings with llama.cpp on both files
(bench/llamacpp_tokenize.mjs) and comparing the ids through OUT.gguf.map (the old id of each
new one). NumPy only.
"""
import os
import struct
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'ref'))
sys.path.insert(0, os.path.join(ROOT, 'tools'))
import numpy as np
from gguf_read import GGUF
from gguf_gen import kv_bytes, T_STRING, T_ARRAY, T_FLOAT32, T_INT32, T_UINT32, T_BOOL, T_UINT8
src, inp, dst = sys.argv[1:4]
g = GGUF(src)
toks = g.kv['tokenizer.ggml.tokens']; scores = np.asarray(g.kv['tokenizer.ggml.scores']); types = np.asarray(g.kv['tokenizer.ggml.token_type'])
texts = open(inp, encoding='utf-8').read().split("\n__ggml_vocab_test__\n")
variants = []
for t in texts:
    for f in (t, unicodedata.normalize('NFKC', t), unicodedata.normalize('NFKD', t), unicodedata.normalize('NFC', t)):
        for v in (f, ' ' + f, ' '.join(f.split()), ' ' + ' '.join(f.split())):
            variants.append(v.replace(' ', '\u2581'))
blob = '\x00'.join(variants)
keep = set(range(4)) | {int(g.kv['tokenizer.ggml.mask_token_id'])}
normal = [i for i in range(len(toks)) if types[i] == 1]
keep.add(min(normal, key=lambda i: scores[i]))  # the unknown score is the lowest normal score - 10
for i, s in enumerate(toks):
    if s and s in blob:
        keep.add(i)
old = sorted(keep)
new_of = {o: n for n, o in enumerate(old)}
kvs = []
for k, v in g.kv.items():
    vt = g.kv_types[k]
    if k == 'tokenizer.ggml.tokens':
        kvs.append(kv_bytes(k, T_ARRAY, [toks[i] for i in old], T_STRING))
    elif k == 'tokenizer.ggml.scores':
        kvs.append(kv_bytes(k, T_ARRAY, [float(scores[i]) for i in old], T_FLOAT32))
    elif k == 'tokenizer.ggml.token_type':
        kvs.append(kv_bytes(k, T_ARRAY, [int(types[i]) for i in old], T_INT32))
    elif k == 'tokenizer.ggml.precompiled_charsmap':
        kvs.append(kv_bytes(k, T_ARRAY, [int(x) & 0xff for x in v], T_UINT8))
    elif k.endswith('_token_id'):
        kvs.append(kv_bytes(k, T_UINT32, new_of[int(v)]))
    elif k.startswith('tokenizer.') or k == 'general.architecture':
        if vt == T_STRING: kvs.append(kv_bytes(k, T_STRING, v))
        elif vt == T_BOOL: kvs.append(kv_bytes(k, T_BOOL, bool(v)))
        elif vt == T_UINT32: kvs.append(kv_bytes(k, T_UINT32, int(v)))
        else: raise SystemExit(f'type {vt} of {k}')
kvs.append(kv_bytes('general.name', T_STRING, 'nomic-bert-moe vocabulary subset for tests'))
kvs.append(kv_bytes('general.alignment', T_UINT32, 32))
head = bytearray(b'GGUF' + struct.pack('<IQQ', 3, 0, len(kvs)))
for kv in kvs: head += kv
head += b'\0' * (-len(head) % 32)
open(dst, 'wb').write(head)
open(dst + '.map', 'w').write(' '.join(str(o) for o in old))
print(len(old), 'tokens,', len(head), 'bytes')
