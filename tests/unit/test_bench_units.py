"""Bench arithmetic on hand-made measurements: ratios, their basis, sweep table."""

from __future__ import annotations

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
    if epoch_level is not None:
        throughput["epoch_level_examples_per_sec"] = epoch_level
    return Measurement(name, 0, 30.0, 900.0, {"throughput": throughput, "val_accuracy": list(acc),
                                              "final_accuracy": acc[-1]})


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
