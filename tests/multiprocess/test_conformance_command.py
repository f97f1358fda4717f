"""``kerasdist conformance`` as a user runs it: the matrix page and its JSON from two strategies
started at once (the parallel path of :func:`kerasdist.conformance.driver.run_matrix`, which
tests/conformance drives through its own fixture), exit 0; bad names exit 2 before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(400)
def test_two_strategies_at_once_write_the_matrix_and_exit_0(tmp_path):
    out = tmp_path / "matrix.md"
    done = subprocess.run([sys.executable, "-m", "kerasdist", "conformance", "--strategies",
                           "default,mirrored", "--cases", "sequential,batchnorm", "--out", str(out),
                           "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = json.loads(out.with_suffix(".json").read_text())["cells"]
    assert set(cells) == {"sequential", "batchnorm"}
    assert {s: cells["sequential"][s]["status"] for s in ("default", "mirrored")} == {
        "default": "pass", "mirrored": "pass"}
    assert set(cells["batchnorm"]) == {"default", "mirrored"}
    page = out.read_text()
    assert "| `sequential` | pass | pass |" in page
    assert "the columns run at the same time unless `--sequential`" in page
    # both columns ran: each strategy's own processes wrote its results
    for strategy in ("default", "mirrored"):
        assert list((tmp_path / "work" / "results" / strategy).glob("sequential.*.json"))


@pytest.mark.parametrize("flag, value, field", [("--strategies", "default,nope", "--strategies"),
                                                ("--cases", "no_such_case", "--cases")])
def test_unknown_names_exit_2_before_anything_runs(tmp_path, flag, value, field):
    done = subprocess.run([sys.executable, "-m", "kerasdist", "conformance", flag, value, "--out",
                           str(tmp_path / "m.md"), "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert field in done.stderr and value in done.stderr
    assert not (tmp_path / "m.md").exists() and not (tmp_path / "work").exists()
