"""Bench arithmetic on hand-made measurements: ratios, their basis, sweep table."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from kerasdist.bench.command import _assemble
from kerasdist.bench.report import markdown_table
from kerasdist.bench.runner import Measurement
from kerasdist.config import load_recipe

pytestmark = pytest.mark.timeout(120)
RECIPE = Path(__file__).parents[2] / "recipes" / "mnist_cnn.yaml"


def _run(name, rate, *, epoch_level=None, tf_keras_ps=False, acc=(0.9, 0.99), ends=(10.0, 20.0)):
    throughput = {"examples_per_sec": rate, "epoch_end_s": list(ends)}
    if tf_keras_ps:
        throughput["timed_epochs"] = 1
    ps = {"whole_epoch_examples_per_sec": epoch_level} if epoch_level is not None else None
    return Measurement(name, 0, 30.0, 900.0, {"throughput": throughput, "val_accuracy": list(acc),
                                              "final_accuracy": acc[-1], "ps": ps})


def test_ratios_use_whole_epoch_figures_against_tf_keras_ps_and_per_step_otherwise():
    rows = {"plain_keras": [_run("p0", 800.0), _run("p1", 1000.0), _run("p2", 900.0)],
            "tf_keras_parameter_server": [_run("t0", 1000.0, tf_keras_ps=True, acc=(0.98,))],
            "tf_keras_multi_worker": [_run("m0", 500.0)],
            "parameter_server": [_run("s0", 1200.0, epoch_level=1100.0)]}
    kinds = {"plain_keras": "baseline", "tf_keras_parameter_server": "baseline",
             "tf_keras_multi_worker": "baseline", "parameter_server": "strategy"}
    result = _assemble(load_recipe(str(RECIPE)), rows, kinds, [], target=0.98, workers=2,
                       repeats=3)
    plain = result["rows"]["plain_keras"]["summary"]
    assert (plain["examples_per_sec_median"], plain["examples_per_sec_min"],
            plain["examples_per_sec_max"]) == (900.0, 800.0, 1000.0)
    ps = result["rows"]["parameter_server"]["summary"]
    # Per-step figure against plain Keras; whole-epoch figure against tf_keras PS; no MWMS ratio.
    assert ps["ratio_examples_per_sec"] == {"plain_keras": pytest.approx(1200 / 900),
                                            "tf_keras_parameter_server": pytest.approx(1.1)}
    assert ps["ratio_basis"] == {"tf_keras_parameter_server": "whole epochs 2..n"}
    assert ps["ratio_time_to_target_vs_plain_keras"] == pytest.approx(1.0)
    table = markdown_table(result)
    assert "1.10x tf_keras_parameter_server (whole epochs 2..n)" in table
    assert "whole epochs: 1100.0" in table


def test_step_clock_excludes_each_epochs_first_step_and_the_time_between_epochs(monkeypatch):
    from kerasdist.keras import timing

    ticks = iter([0.0,                  # train_begin
                  1.0, 3.0, 4.0,        # epoch 1: steps end at 1 (untimed), 3, 4
                  10.0,                 # epoch_end (validation included in epoch_end_s)
                  20.0, 21.0,           # epoch 2: steps end at 20 (untimed), 21
                  22.0])                # epoch_end
    # Replace the module's view of `time` only (not the real time module pytest also uses).
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    clock = timing.StepClock(global_batch_size=8)
    clock.train_begin()
    for steps in (3, 2):
        clock.epoch_begin()
        for _ in range(steps):
            clock.step_end()
        clock.epoch_end()
    summary = clock.summary()
    assert (summary["timed_steps"], summary["timed_seconds"]) == (3, 4.0)
    assert summary["examples_per_sec"] == pytest.approx(3 * 8 / 4.0)
    assert summary["epoch_end_s"] == [10.0, 22.0]
    assert summary["epoch_examples_per_sec"] == [pytest.approx(2 * 8 / 3.0), pytest.approx(8.0)]
