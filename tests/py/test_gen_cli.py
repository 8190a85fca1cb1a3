"""test_gen_cli.py - `sampan run` through sp_gen: the greedy demo text byte for byte, --stop
(cut before the first stop string, finish reason), --json (Python's json accepts the output at
temperature 0 and 1 with several seeds), seed determinism and bad flags."""
import json
import os
import subprocess

from common import ROOT, Suite, binary

s = Suite("gen-cli")
exe = binary()
MODEL = os.path.join(ROOT, "models", "stories260K.gguf")
REF = os.path.join(ROOT, "tests", "data", "stories260K.greedy-256.txt")


def gen(*args):
    """(returncode, stdout bytes, stderr text) of `sampan run -m MODEL -t 1 args`."""
    r = subprocess.run([exe, "run", "-m", MODEL, "-t", "1", *args], capture_output=True,
                       timeout=60, cwd=ROOT)
    return r.returncode, r.stdout, r.stderr.decode(errors="replace")


def finish(err):
    for line in err.splitlines():
        if line.startswith("finish: "):
            return line[len("finish: "):]
    return None


if exe is None:
    s.skip("all", "build/sampan not built")
    s.finish()

ref = open(REF, "rb").read()
prompt = b"Once upon a time"

# The greedy demo: prompt + continuation + "\n", a prefix of llama2.c's text.
rc, out, err = gen("-p", prompt.decode(), "-n", "120", "--temp", "0")
s.case("greedy with prompt matches llama2.c", rc == 0 and out.endswith(b"\n") and
       ref.startswith(out[:-1]) and len(out) > 300, out[:80])
s.case("finish length at -n", finish(err) == "length", finish(err))
rc2, out2, _ = gen("-n", "120", "--temp", "0")
s.case("greedy without prompt matches llama2.c", rc2 == 0 and ref.startswith(out2[:-1]) and
       len(out2) > 300, out2[:80])

# --stop: the text is cut before the first occurrence in the generated part.
full = out[len(prompt):-1]
for stops in (["Lily"], ["ball."], ["park", "Lily's"], ["\n"], [" to the park.\"", "zzz"],
              ["e, r"]):
    args = []
    for st in stops:
        args += ["--stop", st]
    rc, got, err = gen("-p", prompt.decode(), "-n", "120", "--temp", "0", *args)
    cut = min((full.find(st.encode()) for st in stops if full.find(st.encode()) >= 0),
              default=-1)
    want = prompt + (full[:cut] if cut >= 0 else full) + b"\n"
    s.case(f"--stop {stops!r}", rc == 0 and got == want and
           finish(err) == ("stop" if cut >= 0 else "length"), f"{got[-40:]!r} {finish(err)}")

# --json: one JSON object, whatever the temperature and seed.
for temp, seed, n in (("0", "0", "200"), ("0", "0", "9"), ("1", "1", "200"), ("1", "2", "200"),
                      ("1", "3", "80"), ("0.8", "4", "300"), ("1.3", "5", "150")):
    rc, got, err = gen("-n", n, "--temp", temp, "--seed", seed, "--json")
    try:
        obj = json.loads(got.decode("utf-8"))
        ok = rc == 0 and isinstance(obj, dict)
        detail = f"{finish(err)}, {len(got)} bytes"
    except ValueError as e:
        ok, detail = False, f"{e}: {got[:200]!r}"
    s.case(f"--json temp {temp} seed {seed} -n {n}", ok, detail)
rc, got, err = gen("-p", "Once", "-n", "120", "--temp", "1", "--seed", "9", "--json",
                   "--stop", "zzzz")
s.case("--json after a prompt", rc == 0 and isinstance(json.loads(got.decode()[len("Once"):]),
                                                      dict), got[:80])

# The same seed gives the same text; another seed another.
a = gen("-n", "80", "--temp", "1", "--seed", "42")[1]
b = gen("-n", "80", "--temp", "1", "--seed", "42")[1]
c = gen("-n", "80", "--temp", "1", "--seed", "43")[1]
s.case("seed determinism", a == b and a != c, a[:60])

# Bad flags: a clear error naming the parameter, no crash.
rc, _, err = gen("-n", "5", "--stop", "")
s.case("empty --stop rejected", rc != 0 and "stop[0]" in err and "empty" in err, err.strip()[-80:])
rc, _, err = gen("-n", "5", *sum((["--stop", "x"] for _ in range(17)), []))
s.case("17 --stop rejected", rc == 2 and "at most 16" in err, err.strip()[-80:])
rc, _, err = gen("-n", "5", "--stop", "x" * 257)
s.case("long --stop rejected", rc != 0 and "longer than 256" in err, err.strip()[-80:])
rc, _, err = gen("-n", "5", "--temp", "-1")
s.case("bad temperature rejected", rc != 0 and "temperature" in err, err.strip()[-80:])

s.finish()
