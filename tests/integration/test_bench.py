"""`kerasdist bench` on a tiny recipe: every field of bench.json, a table, valid PNG plots.

No test asserts a speed: the figures are checked for presence and sanity only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]
REPO = Path(__file__).parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--set", "trainer.epochs=2", "--set", "trainer.steps_per_epoch=4",
        "--set", "data.eval_split=test[9000:9128]", "--set", "data.batch_size=32"]


@pytest.mark.slow  # over 30 s: not in the fast subset
def test_bench_tiny_recipe_writes_every_field_and_plots(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", str(REPO / "recipes" / "mnist_cnn.yaml"), *TINY,
                 "--strategies", "default", "--baselines", "plain_keras,raw_step,keras_enable",
                 "--target-accuracy", "0.1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "| row | kind | examples/s" in printed
    result = json.loads((out / "bench.json").read_text())
    env = result["environment"]
    assert {"tensorflow", "keras", "cpu_count", "devices", "python"} <= set(env)
    assert result["settings"]["global_batch_size"] == 32
    assert set(result["rows"]) == {"plain_keras", "raw_step", "keras_enable_default", "default"}
    for name, row in result["rows"].items():
        summary = row["summary"]
        assert summary["succeeded"] == summary["runs"] == 1, name
        assert summary["examples_per_sec_median"] > 0
        assert summary["examples_per_sec_min"] <= summary["examples_per_sec_max"]
        assert summary["peak_rss_mb_median"] > 100  # a TensorFlow process tree
        assert 0 <= summary["final_accuracy_median"] <= 1
        assert summary["time_to_target_s_median"] > 0  # target 0.1 is reached after epoch 1
        run = row["runs"][0]
        assert len(run["figures"]["throughput"]["epoch_end_s"]) == 2
        assert run["figures"]["throughput"]["timed_steps"] == 2 * 3
        assert len(run["figures"]["throughput"]["epoch_examples_per_sec"]) == 2
    summary = result["rows"]["default"]["summary"]
    ratios = summary["ratio_examples_per_sec"]
    assert set(ratios) == {"plain_keras", "raw_step", "keras_enable_default"}
    assert all(v > 0 for v in ratios.values())
    # The lifecycle cost is the default row against the same strategy with only enable().
    assert summary["lifecycle_overhead"] == pytest.approx(1 - ratios["keras_enable_default"])
    enable_recipe = json.loads((out / "recipes" / "keras_enable-r0-default.json").read_text())
    assert enable_recipe["data"]["batch_size"] == 32 and enable_recipe["strategy"]["kind"] == \
        "default"
    for png in ("curves.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
    assert "| default | strategy |" in (out / "bench.md").read_text()


def test_bench_rejects_unknown_names_before_running(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", str(REPO / "recipes" / "mnist_cnn.yaml"), "--strategies", "horovod",
                 "--out", str(out)]) == EXIT_BAD_INPUT
    assert "unknown strategy 'horovod'" in capsys.readouterr().err
    assert not out.exists()
    assert main(["bench", str(REPO / "recipes" / "mnist_cnn.yaml"), "--sweep-workers", "0",
                 "--out", str(out)]) == EXIT_BAD_INPUT
    capsys.readouterr()
    assert main(["bench", str(REPO / "recipes" / "mnist_cnn.yaml"), "--strategies", "multi_worker",
                 "--sweep-workers", "1,2,3", "--out", str(out)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "data.batch_size (64) is not divisible by [3] worker(s)" in err
    assert not out.exists()


@pytest.mark.extended
@pytest.mark.slow
def test_bench_worker_sweep_reuses_the_main_row_and_runs_the_other_counts(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", str(REPO / "recipes" / "mnist_cnn.yaml"), *TINY,
                 "--strategies", "multi_worker", "--baselines", "plain_keras", "--workers", "1",
                 "--sweep-workers", "1,2", "--target-accuracy", "0.1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "Worker sweep (all tasks share this machine's" in printed
    result = json.loads((out / "bench.json").read_text())
    sweep = {p["workers"]: p for p in result["sweep"]}
    assert set(sweep) == {1, 2} and {p["strategy"] for p in result["sweep"]} == {"multi_worker"}
    # The 1-worker point is the main row (same runs), the 2-worker point ran a 2-worker cluster.
    row = result["rows"]["multi_worker"]
    assert sweep[1]["logs"] == [r["log"] for r in row["runs"]]
    assert sweep[1]["examples_per_sec"] == row["summary"]["examples_per_sec_median"]
    assert sweep[2]["logs"] != sweep[1]["logs"] and sweep[2]["returncodes"] == [0]
    recipe = json.loads((out / "recipes" / "sweep-multi_worker-w2-r0.json").read_text())
    assert recipe["cluster"]["workers"] == 2
    for point in sweep.values():
        assert point["succeeded"] == point["runs"] == 1
        assert point["examples_per_sec_min"] <= point["examples_per_sec"] <= point["examples_per_sec_max"]
        assert point["time_to_target_s"] > 0 and 0 <= point["final_accuracy"] <= 1
    assert (out / "sweep.png").read_bytes()[:8] == PNG_MAGIC
    assert "| multi_worker | 2 |" in (out / "bench.md").read_text()


def test_bench_sweep_needs_a_cluster_strategy(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", str(REPO / "recipes" / "mnist_cnn.yaml"), "--strategies", "default",
                 "--sweep-workers", "1,2", "--out", str(out)]) == EXIT_BAD_INPUT
    assert "--sweep-workers sweeps multi_worker and parameter_server" in capsys.readouterr().err
    assert not out.exists()


# 64 s in the README suite (2026-11-27): the extended tier; the suite keeps the bench's own
# smoke test (test_bench_tiny_recipe_writes_every_field_and_plots) and the mode's bad input.
@pytest.mark.extended
@pytest.mark.slow  # over 30 s: not in the fast subset
def test_coordinator_scaling_mode_writes_points_verdict_and_plot(tmp_path, capsys):
    from kerasdist.bench import scaling
    from kerasdist.launch import isolation

    if isolation.unavailable_reason() is not None:
        pytest.skip(f"needs a private network namespace: {isolation.unavailable_reason()}")
    out = tmp_path / "bench"
    code = scaling.main(["1,2", "--steps", "20", "--epochs", "2", "--repeats", "1",
                         "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads((out / "bench.json").read_text())
    part = result["coordinator_scaling"]
    assert part["settings"]["workers"] == [1, 2] and part["settings"]["steps_per_epoch"] == 20
    points = {(p["impl"], p["workers"]): p for p in part["points"]}
    assert set(points) == {("kerasdist", 1), ("kerasdist", 2), ("tf_keras", 1), ("tf_keras", 2)}
    for point in points.values():
        assert point["succeeded"] == point["runs"] == 1 and point["returncodes"] == [0]
        assert point["steps_per_sec_min"] <= point["steps_per_sec"] <= point["steps_per_sec_max"]
        assert point["steps_per_sec"] > 0 and point["steps_per_execution"] >= 1
    figures = json.loads((out / "results" / "scaling-tf_keras-w2-r0.json").read_text())
    assert figures["global_step"] == 2 * 20 and len(figures["epoch_seconds"]) == 2
    assert set(part["saturation"]) == {"kerasdist", "tf_keras"}
    verdicts = {t["name"]: t["verdict"] for t in result["targets"]}
    # Judged only on 3+ repeats (issue 21): one repeat prints n/a, never MET.
    assert verdicts["coordinator_kerasdist_vs_tf_keras"] == "n/a (fewer than 3 repeats)"
    assert verdicts["default_vs_plain_keras"] == "n/a (rows missing)"  # no rows in this run
    assert (out / "coordinator_scaling.png").read_bytes()[:8] == PNG_MAGIC
    table = (out / "bench.md").read_text()
    assert "| kerasdist | 2 |" in table and "coordinator scaling: kerasdist >= tf_keras" in table
    assert "Coordinator scaling (" in printed


@pytest.mark.parametrize("argv", [["0,2"], ["1,x"], ["1,2", "--epochs", "1"],
                                  ["1,2", "--steps", "0"]])
def test_coordinator_scaling_mode_refuses_bad_input_with_exit_2(tmp_path, capsys, argv):
    from kerasdist.bench import scaling

    out = tmp_path / "bench"
    assert scaling.main([*argv, "--out", str(out)]) == EXIT_BAD_INPUT
    assert "Received:" in capsys.readouterr().err
    assert not out.exists()


def test_bench_cli_coordinator_scaling_flag_refuses_bad_counts_with_exit_2(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", str(REPO / "recipes" / "linear_mwms.yaml"), "--coordinator-scaling",
                 "0,x", "--out", str(out)])
    assert code == EXIT_BAD_INPUT and "--coordinator-scaling" in capsys.readouterr().err
    assert not out.exists()
