"""A sweep's trials in TensorBoard's HParams view (``<output.dir>/tensorboard``), read back from the
event files as TensorBoard's hparams plugin reads them, against ``trials.csv``; a driver run again
after a kill neither repeats nor loses a trial there. Trials are simulated in this process
(:class:`test_sweep_driver.FakeTrial`)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from test_sweep_driver import _driver

pytest.importorskip("optuna")

SPACE = {"optimizer.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
         "data.batch_size": {"type": "categorical", "choices": [8, 16]}}
SWEEP = {"space": SPACE, "sampler": {"name": "random", "seed": 1},
         "pruner": {"name": "threshold", "warmup_epochs": 1, "options": {"upper": 1.0}}}


def _value(lr, epoch):
    return lr * 100 / epoch  # over the threshold (pruned) when lr > 0.02


def hparams_runs(board: Path) -> dict[str, dict]:
    """Each run folder of ``board``: its session starts (trial id, parameters) and scalars, as
    TensorBoard loads them (``EventFileLoader``: a ``simple_value`` becomes a scalar tensor)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata
    from tensorboard.util import tensor_util

    runs = {}
    for folder in sorted(p for p in board.iterdir() if p.is_dir()):
        run = runs[folder.name] = {"sessions": [], "scalars": {}}
        for path in sorted(folder.glob("events.out.tfevents.*")):
            for event in EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
                        info = metadata.parse_session_start_info_plugin_data(
                            value.metadata.plugin_data.content)
                        params = {k: getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()}
                        run["sessions"].append((info.group_name, params))
                    elif value.metadata.plugin_data.plugin_name == "scalars":  # as migrated
                        run["scalars"].setdefault(value.tag, []).append(
                            float(tensor_util.make_ndarray(value.tensor)))
    return runs


def _check_against_trials_csv(out: Path) -> list[dict]:
    """Every COMPLETE trial of trials.csv is one run with its parameters and objective; no other
    trial is. Returns the CSV's rows."""
    rows = list(csv.DictReader((out / "trials.csv").open()))
    complete = {f"trial-{int(r['number']):04d}": r for r in rows if r["state"] == "COMPLETE"}
    runs = hparams_runs(out / "tensorboard")
    assert sorted(runs) == sorted(complete), (sorted(runs), [(r["number"], r["state"]) for r in rows])
    for name, row in complete.items():
        (trial_id, params), = runs[name]["sessions"]  # exactly one session start per trial
        assert trial_id == name
        assert params == {"optimizer.learning_rate": pytest.approx(float(row["optimizer.learning_rate"])),
                          "data.batch_size": float(row["data.batch_size"])}, (name, params, row)
        assert runs[name]["scalars"] == {"val_loss": [pytest.approx(float(row["value"]), rel=1e-6)]}
    return rows


def test_every_complete_trial_is_in_the_hparams_view_with_its_parameters_and_objective(
        tmp_path, monkeypatch):
    driver, _, _ = _driver(tmp_path, monkeypatch, value=_value, trials=5, parallel=2,
                           fails=(2,), **SWEEP)
    assert driver.run() == 0
    rows = _check_against_trials_csv(tmp_path / "out")
    assert {r["state"] for r in rows} == {"COMPLETE", "PRUNED", "FAIL"}  # only COMPLETE ones shown


def test_a_rerun_after_a_kill_writes_each_trial_once(tmp_path, monkeypatch):
    driver, _, _ = _driver(tmp_path, monkeypatch, value=_value, trials=3, **SWEEP)
    assert driver.run() == 0
    out = tmp_path / "out"
    board = out / "tensorboard"
    kept = sorted(board.iterdir())
    assert len(kept) >= 2, kept
    # killed just after trial 0 was told: its run missing, its half-written copy left behind
    shutil.rmtree(kept[0])
    (out / ".tensorboard-tmp" / kept[0].name).mkdir(parents=True)
    (out / ".tensorboard-tmp" / kept[0].name / "events.out.tfevents.0.half").write_bytes(b"\0")
    files = {p: p.stat().st_mtime_ns for run in kept[1:] for p in run.iterdir()}
    again, started, _ = _driver(tmp_path, monkeypatch, value=_value, trials=3, **SWEEP)
    assert again.run() == 0 and not started  # written when the driver starts
    _check_against_trials_csv(out)
    assert [p.name.startswith("events.out.tfevents.") for p in (board / kept[0].name).iterdir()] == [True]
    assert {p: p.stat().st_mtime_ns for p in files} == files  # the others are not written again


def test_a_run_that_cannot_be_written_does_not_end_the_sweep(tmp_path, monkeypatch):
    driver, _, _ = _driver(tmp_path, monkeypatch, value=lambda lr, e: lr, trials=2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tensorboard").write_text("a file where the folder goes")
    assert driver.run() == 0
    assert (tmp_path / "out" / "trials.csv").read_text().count("COMPLETE") == 2
