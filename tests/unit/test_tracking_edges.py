"""Issue 42 item 7 (tracking edges): the default MLflow store stays inside a run directory whose
name holds ``?`` or ``#``; a tracking URI of a scheme MLflow has no store for is refused by
``validate`` (exit 2, before ``fit`` would write the run directory)."""

from __future__ import annotations

import os

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main

pytestmark = pytest.mark.timeout(240)

mlflow = pytest.importorskip("mlflow")

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: 1, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false, tracking: {tracking}}}
"""


@pytest.fixture(autouse=True)
def _no_mlflow_telemetry(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


def test_the_default_store_stays_inside_a_run_dir_named_with_question_and_hash(write_recipe,
                                                                               tmp_path):
    run_dir = tmp_path / "runs" / "r?x#y"
    recipe = write_recipe(LINEAR.format(run_dir=run_dir, tracking="{kind: mlflow}"))
    assert main(["fit", str(recipe)]) == 0
    assert (run_dir / "mlflow.db").is_file()
    assert (run_dir / "mlartifacts").is_dir()
    assert os.listdir(tmp_path / "runs") == ["r?x#y"]  # nothing beside it


@pytest.mark.parametrize("uri", ["foo://bar", "s3://bucket/x", "bogus:thing"])
def test_an_unknown_tracking_uri_scheme_is_refused_by_validate(write_recipe, tmp_path, capsys,
                                                               uri):
    run_dir = tmp_path / "run"
    recipe = write_recipe(LINEAR.format(run_dir=run_dir,
                                        tracking=f"{{kind: mlflow, uri: '{uri}'}}"))
    assert main(["validate", str(recipe)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "output.tracking.uri: MLflow has no tracking store for the scheme" in err, err
    assert f"Received: uri={uri!r}" in err
    assert main(["fit", str(recipe)]) == EXIT_BAD_INPUT
    assert not run_dir.exists()


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "sqlite:///x.db", "databricks",
                                 "postgresql+psycopg2://u@h/db", "file:///tmp/mlruns", "./mlruns"])
def test_mlflow_tracking_uris_pass_validate(write_recipe, tmp_path, uri):
    recipe = write_recipe(LINEAR.format(run_dir=tmp_path / "run",
                                        tracking=f"{{kind: mlflow, uri: '{uri}'}}"))
    assert main(["validate", str(recipe)]) == 0


def test_after_overwrite_the_moved_run_names_its_new_place(write_recipe, tmp_path):
    """The second ``fit`` runs as a command of its own, as a user runs it (in one process,
    MLflow keeps its engine of the moved ``mlflow.db`` cached by URI: a second run there fails
    "attempt to write a readonly database", before this change too)."""
    import json
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    recipe = write_recipe(LINEAR.format(run_dir=run_dir, tracking="{kind: mlflow}"))
    assert main(["fit", str(recipe)]) == 0
    first = json.loads((run_dir / "tracking.json").read_text())["run_id"]
    done = subprocess.run([sys.executable, "-m", "kerasdist", "fit", str(recipe), "--overwrite"],
                          capture_output=True, text=True, timeout=200,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    (moved,) = tmp_path.glob("run.old-*")
    record = json.loads((moved / "tracking.json").read_text())
    assert record["run_id"] == first and record["uri"] == f"sqlite:///{moved / 'mlflow.db'}"
    old_run = mlflow.MlflowClient(tracking_uri=record["uri"]).get_run(first)
    assert old_run.data.tags["kerasdist.run_dir"] == str(moved)
    assert json.loads((run_dir / "tracking.json").read_text())["run_id"] != first
