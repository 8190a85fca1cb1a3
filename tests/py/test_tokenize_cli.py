"""test_tokenize_cli.py - `sampan tokenize`: ids on stdout, --no-bos, --special, --decode,
errors, and every test vector of tests/data/tokenizer through the command line."""
import os

from common import ROOT, Suite, binary, run

s = Suite("tokenize-cli")
exe = binary()
TOK = os.path.join(ROOT, "tests", "data", "tokenizer")
SEP = "\n__ggml_vocab_test__\n"


def tok(vocab, text, *flags):
    """(returncode, stdout, stderr) of `sampan tokenize -m vocab flags` fed text (str or bytes)."""
    import subprocess
    data = text.encode() if isinstance(text, str) else text
    r = subprocess.run([exe, "tokenize", "-m", os.path.join(TOK, vocab), *flags], input=data,
                       capture_output=True, timeout=60, cwd=ROOT)
    return r.returncode, r.stdout, r.stderr.decode(errors="replace")


if exe is None:
    s.skip("all", "build/sampan not built")
    s.finish()

spm, gpt2, bert = "ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-bert-bge.gguf"
rc, out, _ = tok(spm, "Hello world")
s.case("spm with BOS", rc == 0 and out == b"1 15043 3186\n", out)
rc, out, _ = tok(spm, "Hello world", "--no-bos")
s.case("spm --no-bos", rc == 0 and out == b"15043 3186\n", out)
rc, out, _ = tok(gpt2, "Hello world")
s.case("gpt-2 adds no BOS", rc == 0 and out == b"15496 995\n", out)
rc, out, _ = tok(gpt2, "<|endoftext|>", "--special")
s.case("gpt-2 --special", rc == 0 and out == b"50256\n", out)
rc, out, _ = tok(gpt2, "<|endoftext|>")
s.case("gpt-2 specials are text without --special", rc == 0 and b"50256" not in out, out)
rc, out, _ = tok(bert, "Hello, World!")
s.case("bert adds [CLS] and [SEP]", rc == 0 and out == b"101 7592 1010 2088 999 102\n", out)
rc, out, _ = tok(gpt2, "")
s.case("empty input", rc == 0 and out == b"\n", out)

text = "Grüße, 世界! 🦙 tabs\tand\nnewlines  ".encode() + b"\xff raw"
for vocab in (spm, gpt2):
    rc, ids, _ = tok(vocab, text, "--no-bos")
    rc2, back, _ = tok(vocab, ids, "--decode")
    want = (b" " if vocab == spm else b"") + text
    s.case(f"{vocab} decode(encode(x)) == x", rc == 0 and rc2 == 0 and back == want, back)
rc, out, _ = tok(gpt2, "50256 15496", "--decode", "--special")
s.case("--decode --special shows control tokens", rc == 0 and out == b"<|endoftext|>Hello", out)
rc, out, _ = tok(gpt2, "50256 15496", "--decode")
s.case("--decode hides control tokens", rc == 0 and out == b"Hello", out)

rc, _, err = tok(gpt2, "99999999", "--decode")
s.case("--decode of a bad id fails", rc == 1 and "not a token id" in err, err)
rc, _, err = tok("ggml-vocab-gpt-2.gguf.inp", "x")
s.case("not a GGUF file fails naming it", rc == 1 and "gpt-2.gguf.inp" in err, err)
rc, _, err = tok(gpt2, "x", "--bogus")
s.case("unknown option is a usage error", rc == 2, err)

# vectors of every vocabulary here through the command line: four per vocabulary spread over
# its file (the first, the last and two between), since each is a process that loads the
# vocabulary; tests/unit/test_tokenizer.c checks every vector in-process. The newer set's
# vocabularies are unpacked into build/testdata/ by `make unit`.
PER_VOCAB = 4
TOK2026 = os.path.join(ROOT, "tests", "data", "tokenizer-2026")
UNPACKED = os.path.join(ROOT, "build", "testdata")
n_files = n_cases = bad = 0
for d in (TOK, TOK2026):
    for name in sorted(os.listdir(d)):
        if not name.endswith(".inp"):
            continue
        vocab = next((p for p in (os.path.join(d, name[:-4]), os.path.join(UNPACKED, name[:-4]))
                      if os.path.exists(p)), None)
        if vocab is None:
            continue
        texts = open(os.path.join(d, name), "rb").read().decode().split(SEP)
        if texts[-1] == "":  # each string ends with SEP, or the last one ends the file
            texts.pop()
        wants = open(os.path.join(d, name[:-4] + ".out")).read().split("\n")
        rc, _, err = tok(vocab, "x", "--no-bos")
        if rc != 0 and "is not supported" in err:
            print(f"  skipped {name[:-4]}: {err.strip()}")
            continue
        picks = sorted({round(k * (len(texts) - 1) / (PER_VOCAB - 1)) for k in range(PER_VOCAB)})
        for i in picks:
            t = texts[i]
            rc, out, err = tok(vocab, t, "--no-bos")
            if rc != 0 or out.decode().split() != wants[i].split():
                bad += 1
                print(f"  MISMATCH {name} case {i} {t!r}\n    want: {wants[i]}\n    got:  {out.decode()}")
            n_cases += 1
        n_files += 1
s.case(f"test vectors through the CLI ({n_cases} vectors, {n_files} vocabularies)",
       bad == 0 and n_files >= 19, f"{bad} mismatches")
s.finish()
