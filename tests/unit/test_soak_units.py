"""tools/soak.py without running anything: the outcome classifier, the option checks, the plan, the
recipes it writes and the table writer (issue 39). The soak itself: tests/multiprocess/test_soak.py."""

from __future__ import annotations

import struct
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import soak  # noqa: E402 - tools/ is not a package
import soak_plan  # noqa: E402
import soak_report  # noqa: E402
from soak_report import Expectation, Outcome  # noqa: E402

pytestmark = pytest.mark.timeout(60)

OK = Expectation(0, files=("metrics.json", "model.keras"))
BAD = Expectation(2, needle="labels must be in", forbid=("Traceback",))


# --- classifier ---------------------------------------------------------------------------------

@pytest.mark.parametrize("expected, kwargs, outcome, reason", [
    (OK, dict(exit_code=0, present=["metrics.json", "model.keras"]), "success", ""),
    (OK, dict(exit_code=1, present=["metrics.json", "model.keras"]), "spurious",
     "exit 1 (expected 0)"),
    (OK, dict(exit_code=0, present=["metrics.json"]), "spurious", "no model.keras"),
    (OK, dict(exit_code=-9, present=[]), "spurious", "exit -9 (expected 0)"),
    (OK, dict(exit_code=None, timed_out=True), "spurious", "hang"),
    (OK, dict(exit_code=None, aborted=True), "aborted", "interrupted"),
    (BAD, dict(exit_code=2, console="error: labels must be in [0, 2)"), "expected_failure", ""),
    (BAD, dict(exit_code=2, console="error: something else"), "spurious", "without 'labels must be in'"),
    (BAD, dict(exit_code=2, console="labels must be in [0, 2)\nTraceback (most recent"), "spurious",
     "'Traceback'"),
    (BAD, dict(exit_code=0, console="labels must be in"), "spurious", "exit 0 (expected 2)"),
    (Expectation(130), dict(exit_code=130), "expected_failure", ""),
    (Expectation(130), dict(exit_code=130, leftover=2), "spurious", "2 process(es) of the run still"),
    (OK, dict(exit_code=0, present=["metrics.json", "model.keras"], leftover=1), "spurious",
     "still running after it ended"),
    (Expectation(130), dict(exit_code=0), "spurious", "exit 0 (expected 130)"),
])
def test_classify(expected, kwargs, outcome, reason):
    verdict = soak_report.classify(expected, **{"console": "", **kwargs})
    assert verdict.outcome == Outcome(outcome)
    assert reason in verdict.reason


def test_a_wrong_expectation_is_spurious():
    """A bad-label run judged as if it had to succeed: the harness must call it spurious."""
    spec = soak_plan.RunSpec(index=1, strategy="default", source="csv", mlflow=False, hog=False,
                             kind="bad_label")
    assert spec.expectation().exit_code == 2
    normal = soak_plan.RunSpec(index=1, strategy="default", source="csv", mlflow=False, hog=False)
    verdict = soak_report.classify(normal.expectation(), exit_code=2, console="labels must be in")
    assert verdict.outcome == Outcome.SPURIOUS


def test_first_meaningful_line_skips_known_noise():
    console = ("kerasdist: training\n"
               "W0000 Your input ran out of data; interrupting training (error?)\n"
               "\x1b[31mkerasdist: attempt 1/1 failed: task worker:0 exited with code 0\x1b[0m\n"
               "Traceback (most recent call last):\n")
    assert soak_report.first_meaningful_line(console) == \
        "kerasdist: attempt 1/1 failed: task worker:0 exited with code 0"
    assert soak_report.first_meaningful_line("a\nlast line\n\n") == "last line"
    assert soak_report.first_meaningful_line("") == ""


# --- options ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, flag", [
    (["--timeout-s", "0"], "--timeout-s"),
    (["--timeout-s", "nan"], "--timeout-s"),
    (["--timeout-s", "ten"], "--timeout-s"),
    (["--mlflow-fraction", "1.5"], "--mlflow-fraction"),
    (["--mlflow-fraction", "half"], "--mlflow-fraction"),
    (["--hog", "--hog-fraction", "-0.1"], "--hog-fraction"),
    (["--hog-fraction", "0.5"], "--hog-fraction"),
    (["--hog-processes", "2"], "--hog-processes"),
    (["--hog", "--hog-processes", "0"], "--hog-processes"),
    (["--runs-per-strategy", "0"], "--runs-per-strategy"),
    (["--runs-per-strategy", "2.5"], "--runs-per-strategy"),
    (["--runs", "default=x"], "--runs"),
    (["--runs", "gpu=3"], "--runs"),
    (["--runs", "default=-1"], "--runs"),
    (["--runs", ","], "--runs"),
    (["--runs", "default=1", "--runs-per-strategy", "1"], "--runs"),
    (["--runs", "default=0"], "--runs"),
    (["--strategies", "default,horovod"], "--strategies"),
    (["--strategies", ""], "--strategies"),
    (["--sources", "tfds"], "--sources"),
    (["--expected-failures", "-1"], "--expected-failures"),
    (["--failure-kinds", "segfault"], "--failure-kinds"),
    (["--seed", "-3"], "--seed"),
    (["--report", "table.txt"], "--report"),
    (["--report", "/no/such/folder/reliability.md"], "--report"),
])
def test_bad_options_exit_2_naming_the_flag(argv, flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        soak.parse_args([*argv, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_out_must_be_new_or_empty(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(SystemExit) as exc:
        soak.parse_args(["--out", str(tmp_path)])
    assert exc.value.code == 2 and "argument --out" in capsys.readouterr().err


def test_good_options(tmp_path):
    args = soak.parse_args(["--runs-per-strategy", "3", "--strategies", "default,multi_worker",
                            "--hog", "--out", str(tmp_path / "out"), "--timeout-s", "90"])
    assert args.counts == {"default": 3, "multi_worker": 3}
    assert args.hog_fraction == 0.5 and args.hog_processes == 1 and args.timeout_s == 90.0
    args = soak.parse_args(["--out", str(tmp_path / "out2")])
    assert args.counts == soak_plan.FULL_RUNS and args.hog_fraction == 0.0
    args = soak.parse_args(["--runs", "parameter_server=5", "--out", str(tmp_path)])  # empty: fine
    assert args.counts == {"parameter_server": 5}


# --- plan and recipes ---------------------------------------------------------------------------

def test_plan_counts_fractions_and_interleaving():
    counts = {"default": 4, "mirrored": 4, "multi_worker": 8, "parameter_server": 8}
    specs = soak_plan.plan(counts, mlflow_fraction=0.5, hog_fraction=0.25, failures=2, seed=7)
    assert [s.index for s in specs] == list(range(1, len(specs) + 1))
    for strategy, n in counts.items():
        mine = [s for s in specs if s.strategy == strategy]
        assert len(mine) == n + 2
        assert sum(s.mlflow for s in mine) == round((n + 2) * 0.5)
        assert sum(s.hog for s in mine) == round((n + 2) * 0.25)
        assert Counter(s.kind for s in mine) == {"normal": n, "bad_label": 1, "sigint": 1}
        assert {s.source for s in mine if s.kind == "normal"} == set(soak_plan.SOURCES)
    assert all(s.source == "csv" for s in specs if s.kind == "bad_label")
    # interleaved: the first run of every strategy comes before the second of any
    assert {s.strategy for s in specs[:4]} == set(counts)
    assert specs == soak_plan.plan(counts, mlflow_fraction=0.5, hog_fraction=0.25, failures=2, seed=7)
    assert specs != soak_plan.plan(counts, mlflow_fraction=0.5, hog_fraction=0.25, failures=2, seed=8)


def test_one_run_and_one_failure_per_strategy_still_cover_every_source_and_kind():
    specs = soak_plan.plan({s: 1 for s in soak_plan.STRATEGIES}, failures=1)
    assert {s.kind for s in specs if s.kind != "normal"} == set(soak_plan.FAILURE_KINDS)
    assert {s.source for s in specs if s.kind == "normal"} == set(soak_plan.SOURCES)


@pytest.mark.parametrize("strategy", soak_plan.STRATEGIES)
@pytest.mark.parametrize("source, kind", [("memory", "normal"), ("csv", "normal"),
                                          ("image_folder", "sigint"), ("csv", "bad_label")])
def test_every_recipe_validates(tmp_path, strategy, source, kind):
    from kerasdist.config import load_recipe

    spec = soak_plan.RunSpec(index=3, strategy=strategy, source=source, mlflow=kind == "normal",
                             hog=False, kind=kind, seed=5)
    path = soak_plan.write_recipe(tmp_path / "r.yaml", soak_plan.recipe(
        spec, data_dir=tmp_path / "data", run_dir=tmp_path / "run"))
    recipe = load_recipe(path)
    assert recipe.strategy.kind == strategy and recipe.trainer.seed == 5
    assert (recipe.output.tracking is not None) == spec.mlflow


def test_data_and_png(tmp_path):
    soak_plan.write_data(tmp_path, seed=1)
    assert len(list((tmp_path / "csv").glob("train-*.csv"))) == 4
    bad = (tmp_path / "csv_bad_label" / "train-000.csv").read_text().splitlines()
    assert bad[0] == "a,b,c,d,y" and bad[6].endswith(f",{soak_plan.BAD_LABEL}")
    png = (tmp_path / "images" / "train" / "class_1" / "000.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (8, 8)
    length = struct.unpack(">I", png[33:37])[0]
    assert png[37:41] == b"IDAT"
    rows = zlib.decompress(png[41:41 + length])
    assert len(rows) == 8 * 9 and rows[0::9] == b"\x00" * 8  # filter byte 0 before each row


# --- table and report -----------------------------------------------------------------------------

def _record(index, strategy, outcome, *, hog=False, kind="normal", seconds=10.0, reason=""):
    return {"index": index, "strategy": strategy, "source": "csv", "kind": kind, "mlflow": True,
            "hog": hog, "outcome": outcome, "reason": reason, "seconds": seconds,
            "log": f"spurious/{index}/console.log", "first_line": "boom"}


RECORDS = [_record(1, "default", "success", seconds=6.0),
           _record(2, "multi_worker", "spurious", hog=True, reason="exit 1 (expected 0)"),
           _record(3, "multi_worker", "success", seconds=20.0),
           _record(4, "default", "expected_failure", kind="bad_label", hog=True),
           _record(5, "default", "aborted")]


def test_summary_counts_per_strategy_and_hog():
    rows = dict(soak_report.summarize(RECORDS))
    assert rows["strategy default"]["runs"] == 2  # the aborted run is not counted
    assert rows["strategy default"]["expected_failure"] == 1
    assert rows["strategy multi_worker"]["spurious"] == 1
    assert rows["hog on"]["runs"] == 2 and rows["hog off"]["runs"] == 2
    assert rows["all"] == {"runs": 4, "success": 2, "expected_failure": 1, "spurious": 1,
                           "median_s": 13.0, "max_s": 20.0}
    text = soak_report.table(RECORDS)
    assert "| strategy multi_worker | 2 | 1 | 0 | **1** | 20.0 / 20.0 |" in text
    assert soak_report.estimate_s(RECORDS, {"default": 10, "multi_worker": 2}) == 100.0
    assert soak_report.estimate_s(RECORDS, {"parameter_server": 1}) is None


META = {"date": "2026-11-27 12:00 UTC", "commit": "abc1234", "cores": 2, "load": "2.00",
        "command": "python tools/soak.py --runs-per-strategy 1", "seconds": 120.0, "partial": False,
        "out": "runs/soak"}


def test_report_section_is_written_replaced_and_never_duplicated(tmp_path):
    doc = tmp_path / "reliability.md"
    first = soak_report.section(RECORDS, META)
    soak_report.write_section(doc, first)
    text = doc.read_text()
    assert text.startswith("# Reliability") and text.count(soak_report.BEGIN_MARK) == 1
    assert "abc1234" in text and "python tools/soak.py --runs-per-strategy 1" in text
    assert "run 2 (multi_worker, csv, normal, mlflow on, hog on): exit 1 (expected 0)" in text
    doc.write_text(text.replace("# Reliability", "# Reliability\n\nKept by hand.") + "\nAfter.\n")
    second = soak_report.section(RECORDS[:1], {**META, "commit": "def5678", "partial": True})
    soak_report.write_section(doc, second)
    text = doc.read_text()
    assert text.count(soak_report.BEGIN_MARK) == 1 and text.count(soak_report.END_MARK) == 1
    assert "def5678" in text and "abc1234" not in text and "Interrupted" in text
    assert "Kept by hand." in text and text.rstrip().endswith("After.")


def test_report_section_is_appended_to_a_doc_without_one(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nOld text.\n")
    soak_report.write_section(doc, soak_report.section(RECORDS, META))
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nOld text.\n\n" + soak_report.BEGIN_MARK)


def test_report_refuses_a_broken_marker_pair(tmp_path):
    doc = tmp_path / "reliability.md"
    doc.write_text(f"x\n{soak_report.BEGIN_MARK}\nno end\n")
    with pytest.raises(ValueError, match="without"):
        soak_report.write_section(doc, soak_report.section(RECORDS, META))
    assert doc.read_text() == f"x\n{soak_report.BEGIN_MARK}\nno end\n"
