"""docs/api.md's command: tools/api_docs.py builds the Python API reference from the docstrings
with pdoc (in a subprocess: pdoc's renderer settings are process-wide)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = """
import sys
sys.path.insert(0, {tools!r})
import api_docs
mods = api_docs.public_modules()
assert "kerasdist.config.loader" in mods and not any("._" in m for m in mods), mods
api_docs.build({out!r}, ["kerasdist", "kerasdist.config.loader"])
"""


@pytest.mark.timeout(240)
def test_api_reference_pages_hold_the_docstrings(tmp_path):
    out = tmp_path / "api"
    done = subprocess.run([sys.executable, "-c", BUILD.format(tools=str(ROOT / "tools"),
                                                              out=str(out))],
                          capture_output=True, text=True, timeout=220, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    package = (out / "kerasdist.html").read_text()
    assert "enable" in package and "load_recipe" in package
    loader = (out / "kerasdist" / "config" / "loader.html").read_text()
    # the Google-style sections rendered as sections, not as plain text
    assert "json_schema" in loader and "Returns" in loader and "oneOf" in loader
