"""test_structured_clients.py - structured output through real clients and the JSON Schema corpus,
against the real `sampan serve` with the demo model (only the grammar makes its output valid):

- tests/node/schema_corpus.test.mjs: every supported keyword in combination through
  response_format, tool parameters and vLLM's structured_outputs / guided_* fields, outputs
  validated with ajv + ajv-formats; refused constructs answer 400 naming them; schema bombs are a
  quick 400;
- tests/node/structured_clients.test.mjs: the openai SDK's chat.completions.parse with zod
  (zodResponseFormat, zodFunction), the Vercel AI SDK's generateObject, LangChain's
  withStructuredOutput, each result checked with zod and ajv.

Each node file's summary line is repeated as cases. Skipped when node or tests/node/node_modules
is absent.
"""
import os
import re
import shutil

from common import ROOT, Server, Suite, binary, run

s = Suite("structured-clients")
node_dir = os.path.join(ROOT, "tests", "node")
if binary() is None:
    s.skip("all", "sampan not built")
    s.finish()
if shutil.which("node") is None:
    s.skip("all", "node is not installed")
    s.finish()
if not os.path.isdir(os.path.join(node_dir, "node_modules", "ajv-formats")):
    s.skip("all", "tests/node/node_modules missing (npm ci)")
    s.finish()

srv = Server("--parallel", "4", "--ctx-size", "4096")
try:
    for script, tag in (("schema_corpus.test.mjs", "node-schema"),
                        ("structured_clients.test.mjs", "node-clients")):
        rc, out, err = run(["node", os.path.join(node_dir, script)], timeout=120,
                           env={"SAMPAN_PORT": str(srv.port)})
        print(out, end="")
        m = re.search(tag + r": (\d+) passed, (\d+) failed", out)
        if not m:
            s.case(f"{script} ran", False, (out + err)[-800:])
            continue
        s.passed += int(m.group(1))
        s.failed += int(m.group(2))
        if rc != 0 and int(m.group(2)) == 0:
            s.case(f"{script} exit status", False, f"exit {rc}: {err[-400:]}")
finally:
    rc = srv.stop()
    s.case("server exits 0", rc == 0, "".join(srv.log)[-400:])
s.finish()
