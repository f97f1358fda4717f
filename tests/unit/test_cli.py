"""The CLI: commands, exit codes, and that bad input writes nothing and trains nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: 1, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
"""


def test_validate_prints_resolved_recipe(write_recipe, capsys):
    path = write_recipe("trainer: {epochs: 2}")
    assert main(["validate", str(path), "--set", "data.batch_size=16"]) == 0
    out = capsys.readouterr().out
    assert "valid recipe" in out and "batch_size: 16" in out and "epochs: 2" in out


def test_validate_json(write_recipe, capsys):
    assert main(["validate", str(write_recipe("{}")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["batch_size"] == 128


def test_schema_is_json(capsys):
    assert main(["schema"]) == 0
    assert "properties" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("text, needle", [
    ("model: [", "malformed YAML"),
    ("data: {batchsize: 3}", "data.batchsize: unknown key"),
    ("strategy: {kind: nope}", "strategy.kind"),
])
def test_bad_recipes_exit_2_with_message(write_recipe, capsys, tmp_path, text, needle):
    run_dir = tmp_path / "run"
    path = write_recipe(text + f"\noutput: {{run_dir: '{run_dir}'}}\n" if "[" not in text else text)
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not run_dir.exists()


def test_missing_recipe_file(capsys, tmp_path):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == EXIT_BAD_INPUT
    assert "cannot read recipe file" in capsys.readouterr().err


def test_missing_data_file_writes_nothing(write_recipe, tmp_path, capsys):
    (tmp_path / "idx").mkdir()
    run_dir = tmp_path / "run"
    path = write_recipe(f"data: {{source: {{kind: idx, path: '{tmp_path / 'idx'}'}}}}\n"
                        f"output: {{run_dir: '{run_dir}'}}\n")
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    assert "t10k-images-idx3-ubyte" in capsys.readouterr().err
    assert not run_dir.exists()


def test_batch_not_divisible_by_replicas_writes_nothing(write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir) + "strategy: {kind: mirrored, logical_cpus: 2}")
    assert main(["fit", str(path), "--set", "data.batch_size=51"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "divisible by the number of replicas (2)" in err and "batch_size=51" in err
    assert not run_dir.exists()


def test_run_dir_of_another_model_is_refused_unless_overwrite(write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir))
    assert main(["fit", str(path)]) == 0
    metrics_before = (run_dir / "metrics.json").read_bytes()
    other = ["--set", "model.params.units=2"]
    assert main(["fit", str(path), *other]) == EXIT_BAD_INPUT
    assert "holds a checkpoint of a different model" in capsys.readouterr().err
    assert (run_dir / "metrics.json").read_bytes() == metrics_before
    assert main(["fit", str(path), *other, "--overwrite"]) == 0
    assert json.loads((run_dir / "run.json").read_text())["fingerprint"]["model"]["params"] == {
        "units": 2}


def test_python_dash_m_entry_point():
    done = subprocess.run([sys.executable, "-m", "kerasdist", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("kerasdist ")


# ------------------------------------------------------------- flags, run directory, summary
@pytest.mark.parametrize("flags, needle", [
    (["--task-index", "3"], "--task-index: cluster role flags, but strategy 'default'"),
    (["--job-name", "worker", "--worker-hosts", "h:1"], "--job-name, --worker-hosts: cluster role"),
    (["--ps-hosts", "h:1"], "Received: --ps-hosts=h:1"),
])
def test_role_flags_on_a_one_process_strategy_exit_2(write_recipe, tmp_path, capsys, flags, needle):
    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir))
    assert main(["fit", str(path), *flags]) == EXIT_BAD_INPUT
    assert needle in capsys.readouterr().err
    assert not run_dir.exists()


def test_role_flags_without_job_name_exit_2(write_recipe, tmp_path, capsys):
    path = write_recipe(LINEAR.format(run_dir=tmp_path / "run") + "strategy: {kind: multi_worker}\n"
                        "cluster: {kind: tf_config}\n")
    assert main(["fit", str(path), "--task-index", "1"]) == EXIT_BAD_INPUT
    assert "--task-index needs --job-name" in capsys.readouterr().err


@pytest.mark.parametrize("make, needle", [
    (lambda tmp: (tmp / "afile").write_text("x") and tmp / "afile", "exists and is not a directory"),
    (lambda tmp: (tmp / "afile").write_text("x") and tmp / "afile" / "run", "is not a directory, so"),
    (lambda tmp: tmp / ("n" * 300) / "run", "more than this filesystem allows"),
])
def test_unusable_run_dir_exits_2_naming_it(write_recipe, tmp_path, capsys, make, needle):
    run_dir = make(tmp_path)
    path = write_recipe(LINEAR.format(run_dir=run_dir))
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert needle in err and "output.run_dir" in err and "Traceback" not in err


def test_unwritable_run_dir_parent_exits_2(unprivileged):
    """A run dir whose parent this user cannot write: exit 2 naming the folder, nothing made. As
    root, `kerasdist fit` runs as an unprivileged user (root writes anywhere)."""
    base = unprivileged.base
    home = base / "home"
    home.mkdir()
    unprivileged.own(home)
    parent = base / "ro"
    parent.mkdir()
    recipe = base / "recipe.yaml"
    recipe.write_text(LINEAR.format(run_dir=parent / "run"), encoding="utf-8")
    parent.chmod(0o555)
    done = subprocess.run([*unprivileged.argv, sys.executable, "-m", "kerasdist", "fit",
                           str(recipe)], capture_output=True, text=True, timeout=300, cwd=home,
                          env={**os.environ, "HOME": str(home)})
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-3000:]
    assert f"'{parent}' is not writable by this user" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not (parent / "run").exists()


def test_summary_has_no_tensorboard_line_without_tensorboard(tmp_path):
    from kerasdist.training.result import RunResult, summary_text

    result = RunResult(history={}, evaluation={"loss": 1.0}, throughput={"examples_per_sec": 1.0,
                       "timed_steps": 1}, wall_time_s=1.0, run_dir=tmp_path, model_path=None,
                       metrics_path=tmp_path / "metrics.json", initial_epoch=0, epochs=1,
                       num_replicas=1, strategy="default")
    assert "tensorboard" not in summary_text(result, tensorboard=False)
    assert "tensorboard" not in summary_text(result)  # no <run_dir>/tensorboard
    assert "tensorboard --logdir" in summary_text(result, tensorboard=True)


def test_fit_summary_without_tensorboard(write_recipe, tmp_path, capsys):
    path = write_recipe(LINEAR.format(run_dir=tmp_path / "run"))
    assert main(["fit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "kerasdist run summary" in out and "tensorboard" not in out


def test_validate_check_data_reports_bad_labels(write_recipe, tmp_path, capsys):
    import numpy as np

    x = np.zeros((32, 28, 28), np.uint8)
    y = np.arange(32) % 10
    y[7] = 255
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x, y_test=y)
    path = write_recipe(f"data: {{source: {{kind: npz, path: '{tmp_path / 'd.npz'}'}}, train_split: train, "
                        f"eval_split: test, batch_size: 8}}\noutput: {{run_dir: '{tmp_path / 'run'}'}}\n")
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    assert main(["validate", str(path), "--check-data"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "labels must be in [0, 10)" in err and "Received: label 255" in err
    assert not (tmp_path / "run").exists()
    y[7] = 3
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x, y_test=y)
    assert main(["validate", str(path), "--check-data"]) == 0
    assert "model, data and run dir checked" in capsys.readouterr().out


def test_a_local_cluster_far_past_the_cores_is_refused_before_anything_starts(
        write_recipe, tmp_path, capsys):
    """``cluster.workers: 1000`` once started 250 processes before anything stopped it."""
    import psutil

    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir)
                        + "strategy: {kind: multi_worker}\ncluster: {kind: local, workers: 1000}")
    before = len(psutil.Process().children(recursive=True))
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "cluster.workers=1000" in err and "1000 tasks" in err
    assert "cluster.allow_oversubscription=true" in err
    assert not run_dir.exists() and len(psutil.Process().children(recursive=True)) == before

    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(3)\n")
    assert main(["launch", "--workers", "500", "--ps", "2", "--log-dir", str(tmp_path / "logs"),
                 str(script)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--workers 500 --ps 2" in err and "--allow-oversubscription" in err
    assert not (tmp_path / "logs").exists()


def test_task_bound_scales_with_cores_and_can_be_passed():
    from kerasdist.errors import ClusterError
    from kerasdist.launch.processes import check_task_count

    check_task_count(8, allowed=False, what="x", flag="f", cores=1)  # at least 8 in all
    check_task_count(16, allowed=False, what="x", flag="f", cores=4)  # 4 per core
    with pytest.raises(ClusterError, match="17 tasks .* 4 CPU core"):
        check_task_count(17, allowed=False, what="x", flag="f", cores=4)
    check_task_count(17, allowed=True, what="x", flag="f", cores=4)


def test_validate_checks_tf_config_for_a_tf_config_cluster(write_recipe, capsys, monkeypatch):
    path = write_recipe("strategy: {kind: parameter_server}\ncluster: {kind: tf_config}")
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h1:1"]}, "task": {"type": "worker"')
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT
    assert "TF_CONFIG is not valid JSON" in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h1:1"], "chief": ["h0:1"]},
                                                "task": {"type": "chief", "index": 0}}))
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT  # parameter server without a ps
    assert "ps" in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["h1:1", "h2:1"], "ps": ["h3:1"], "chief": ["h0:1"]},
        "task": {"type": "worker", "index": 1}}))
    assert main(["validate", str(path)]) == 0
    assert "TF_CONFIG checked: this task is worker:1 of a cluster of chief x1, worker x2, ps x1" \
        in capsys.readouterr().out
    monkeypatch.delenv("TF_CONFIG")
    assert main(["validate", str(path)]) == 0
    assert "TF_CONFIG is not set here" in capsys.readouterr().out


def test_item_ids_past_the_embedding_table_are_refused_before_anything_is_written(
        tmp_path, capsys):
    """recipes/embedding_ps.yaml with data.source.num_items larger than the model's item table."""
    from pathlib import Path

    run_dir = tmp_path / "run"
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "embedding_ps.yaml"
    sets = ["model.params.num_items=1000", "data.source.num_items=2000", "data.source.num_examples=5000",
            "data.shuffle_buffer=5000", "data.eval_split=test[:1000]", "cluster={kind: this_process}",
            "strategy={kind: default}", f"output.run_dir={run_dir}"]
    assert main(["fit", str(recipe), *[a for s in sets for a in ("--set", s)]]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "data.train_split 'train'" in err and "Embedding" in err and "is not in [0, 1000)" in err
    assert not run_dir.exists()


def test_validate_refuses_a_worker_count_the_global_batch_does_not_divide(write_recipe, capsys):
    """Issue 33 (7): ``validate`` runs fit's own preflight checks (batch vs known replicas)."""
    path = write_recipe("model: {name: mnist_cnn}\ndata: {source: embedded, batch_size: 64}\n"
                        "strategy: {kind: multi_worker}\n"
                        "cluster: {kind: local, workers: 3, min_workers: 2}\n")
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "data.batch_size" in err and "(3)" in err and "Received: batch_size=64" in err
    assert main(["validate", str(path), "--set", "cluster.workers=4"]) == 0
    assert main(["validate", str(path), "--set", "cluster.workers=1000"]) == EXIT_BAD_INPUT
    assert "cluster.workers=1000" in capsys.readouterr().err  # the task bound, as fit says it


@pytest.mark.parametrize("value, needle", [
    ("1000000000000", "less than or equal to 1024"), ("-5", "greater than or equal to 0"),
    ("true", "not a boolean (true/false). Received: threads_per_task=true")])
def test_threads_per_task_out_of_range_exits_2_naming_the_field(write_recipe, tmp_path, capsys,
                                                                  value, needle):
    """Issue 33 (6): refused by the recipe, naming cluster.threads_per_task, before any task
    starts or the run directory is written (it used to blame model.params, or start the tasks)."""
    run_dir = tmp_path / "run"
    path = write_recipe(LINEAR.format(run_dir=run_dir)
                        + "strategy: {kind: parameter_server}\ncluster: {kind: local, ps: 1}")
    for command in ("validate", "fit"):
        assert main([command, str(path), "--set", f"cluster.threads_per_task={value}"]) == \
            EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "cluster.threads_per_task" in err and needle in err and "model.params" not in err
    assert not run_dir.exists()


@pytest.mark.parametrize("value", ["-5", "1025", "two"])
def test_launch_threads_per_task_out_of_range_exits_2_before_anything(tmp_path, capsys, value):
    """Issue 33 (6): ``--threads-per-task -5`` used to start the tasks (TF aborts them: counted
    as lost, retried), and ``--dry-run`` printed it as valid."""
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(3)\n")
    for extra in (["--dry-run"], []):
        with pytest.raises(SystemExit) as exited:
            main(["launch", "--threads-per-task", value, "--log-dir", str(tmp_path / "logs"),
                  *extra, str(script)])
        assert exited.value.code == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "--threads-per-task" in err and f"Received: '{value}'" in err
    assert not (tmp_path / "logs").exists()


def test_training_error_is_a_kerasdist_error_that_exits_1(capsys):
    """TrainingError is a KerasdistError (and still a RuntimeError), but a failure during training:
    class fatal, exit code 1, its message without a traceback; other KerasdistErrors exit 2."""
    from kerasdist.cli import _failed
    from kerasdist.errors import FATAL, KerasdistError, RecipeError, TrainingError, classify

    err = TrainingError("the training loss became nan")
    assert isinstance(err, KerasdistError) and isinstance(err, RuntimeError)
    assert classify(err) == FATAL and _failed(err) == 1
    err_text = capsys.readouterr().err
    assert "kerasdist: failed: the training loss became nan" in err_text
    assert "Traceback" not in err_text
    assert _failed(RecipeError("bad")) == EXIT_BAD_INPUT


def test_an_interrupt_names_a_checkpoint_only_for_fit(capsys):
    """``kerasdist conformance`` (or ``launch``, ``bench``) interrupted said "the latest checkpoint
    is kept, re-run to resume", which only ``fit`` does."""
    from kerasdist.cli import _failed

    assert _failed(KeyboardInterrupt("SIGTERM received"), command="conformance") == 130
    said = capsys.readouterr().err
    assert "interrupted. SIGTERM received" in said and "checkpoint" not in said
    assert _failed(KeyboardInterrupt("SIGTERM received"), command="fit") == 130
    assert "the latest checkpoint is kept, re-run to resume" in capsys.readouterr().err
