"""test_ollama_node.py - the `ollama` npm client (pinned in tests/node/package-lock.json) against
the real `sampan serve`: runs `npm ci` in tests/node when node_modules is missing, then
tests/node/ollama.test.mjs, and repeats its summary line as "ollama-node: N passed, ...".
Skipped only when node itself is absent."""
import os
import re
import shutil

from common import ROOT, Suite, binary, run

s = Suite("ollama-node")
exe = binary()
node_dir = os.path.join(ROOT, "tests", "node")
if shutil.which("node") is None:
    s.skip("ollama-client", "node is not installed")
    s.finish()
if exe is None:
    s.skip("ollama-client", "build/sampan not built")
    s.finish()
if not os.path.isdir(os.path.join(node_dir, "node_modules", "ollama")):
    rc, out, err = run(["npm", "ci", "--prefix", node_dir, "--no-audit", "--no-fund", "--prefer-offline"],
                       timeout=300)
    if not s.case("npm ci (ollama)", rc == 0, (out + err)[-400:]):
        s.finish()
rc, out, err = run(["node", os.path.join(node_dir, "ollama.test.mjs")], timeout=120,
                   env={"SAMPAN_BIN": exe})
print(out, end="")
m = re.search(r"node-ollama: (\d+) passed, (\d+) failed", out)
if not m:
    s.case("ollama client suite ran", False, err[-800:])
else:
    s.passed += int(m.group(1))
    s.failed += int(m.group(2))
    if rc != 0 and int(m.group(2)) == 0:
        s.case("ollama client exit status", False, f"exit {rc}")
s.finish()
