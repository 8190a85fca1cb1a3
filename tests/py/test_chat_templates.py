"""test_chat_templates.py - tests/data/chat/expected.json (the renders that
tests/unit/test_chat_templates.c demands) is still what Debian's python3-jinja2 gives with
Hugging Face's settings: scripts/gen-chat-expected.py --check re-renders every template and
conversation and compares. Skipped where python3-jinja2 is not installed."""
import os
import subprocess
import sys

from common import ROOT, Suite

s = Suite("chat-templates")
try:
    import jinja2  # noqa: F401
except ImportError:
    s.skip("expected.json against python3-jinja2", "python3-jinja2 not installed")
    s.finish()
r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen-chat-expected.py"), "--check"],
                   capture_output=True, text=True, timeout=300, cwd=ROOT)
s.case("expected.json is python3-jinja2's render of every template and conversation",
       r.returncode == 0, (r.stdout + r.stderr).strip()[-300:])
s.finish()
