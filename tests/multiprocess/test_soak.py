"""tools/soak.py for real (issue 39), in short forms: one ordinary run per strategy and one
deliberately failing run per strategy end with 0 spurious failures; a run judged against a wrong
expectation is counted as spurious with its logs kept (so this test can fail); a run over the
timeout is killed with every process it started and counted as a hang.

The option checks, the classifier and the table writer: tests/unit/test_soak_units.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import soak  # noqa: E402 - tools/ is not a package
import soak_plan  # noqa: E402
from soak_report import Expectation  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended]


def _spurious_logs(out: Path) -> str:
    return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(out.glob("spurious/*/console.log")))


@pytest.mark.timeout(1500)
def test_a_short_soak_has_no_spurious_failure(tmp_path):
    out = tmp_path / "soak"
    done = subprocess.run([sys.executable, str(TOOLS / "soak.py"), "--runs-per-strategy", "1",
                           "--expected-failures", "1", "--timeout-s", "300", "--out", str(out)],
                          capture_output=True, text=True, timeout=1400, cwd=tmp_path)
    detail = f"{done.stdout[-4000:]}\n{done.stderr[-3000:]}\n{_spurious_logs(out)}"
    assert done.returncode == 0, detail
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(records) == 8, detail
    assert sorted(r["outcome"] for r in records) == ["expected_failure"] * 4 + ["success"] * 4, detail
    assert {r["kind"] for r in records} == {"normal", "bad_label", "sigint"}
    assert {r["strategy"] for r in records} == set(soak_plan.STRATEGIES)
    assert not (out / "spurious").exists()
    assert not list((out / "work").iterdir())  # every run dir removed
    summary = (out / "summary.md").read_text()
    assert "| all | 8 | 4 | 4 | 0 |" in summary, summary


class _WronglyExpected(soak_plan.RunSpec):
    """A bad-label run (exit 2 with its message) that the harness is told must succeed."""

    def expectation(self) -> Expectation:
        return Expectation(0, files=("metrics.json", "model.keras"))


@pytest.mark.timeout(300)
def test_a_run_against_a_wrong_expectation_is_spurious_with_its_logs_kept(tmp_path):
    soak_plan.write_data(tmp_path / "data")
    (tmp_path / "work").mkdir()
    runner = soak.Soak(tmp_path, timeout_s=240, hog=soak.Hog())
    spec = _WronglyExpected(index=1, strategy="multi_worker", source="csv", mlflow=False,
                            hog=False, kind="bad_label")
    record = runner.run(spec)
    assert record["outcome"] == "spurious" and record["reason"] == "exit 2 (expected 0)", record
    assert "labels must be in" in record["first_line"]
    kept = tmp_path / "spurious" / spec.name / "console.log"
    assert record["log"] == str(kept) and "labels must be in" in kept.read_text()
    assert json.loads((tmp_path / "runs.jsonl").read_text())["outcome"] == "spurious"


@pytest.mark.timeout(300)
def test_a_run_over_the_timeout_is_killed_with_its_cluster_and_counted_as_a_hang(tmp_path,
                                                                                    monkeypatch):
    soak_plan.write_data(tmp_path / "data")
    (tmp_path / "work").mkdir()
    monkeypatch.setattr(soak, "SIGINT_MARK", Path("never-written"))  # trains its 2000 epochs
    runner = soak.Soak(tmp_path, timeout_s=45, hog=soak.Hog())
    spec = soak_plan.RunSpec(index=1, strategy="multi_worker", source="memory", mlflow=False,
                             hog=False, kind="sigint")
    record = runner.run(spec)
    assert record["outcome"] == "spurious" and record["reason"] == "hang", record
    assert 45 <= record["seconds"] < 120
    deadline = time.monotonic() + 15  # a task killed by its parent's death may take a moment
    while (left := soak._running_in(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the killed run still running: {left}"


@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_run_writes_the_partial_table_and_exits_130(tmp_path):
    out, report = tmp_path / "soak", tmp_path / "reliability.md"
    proc = subprocess.Popen([sys.executable, str(TOOLS / "soak.py"), "--runs-per-strategy", "2",
                             "--strategies", "multi_worker", "--out", str(out), "--report",
                             str(report)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not list(out.glob("work/*/run.json")) and time.monotonic() < deadline:
        time.sleep(0.2)  # the first run has started writing its run dir
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted; the partial table follows" in output
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert records[-1]["outcome"] == "aborted", records
    assert "Interrupted: partial results" in report.read_text()
    deadline = time.monotonic() + 15
    while (left := soak._running_in(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the interrupted run still running: {left}"
