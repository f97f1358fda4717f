"""Issue 30, point 4 (one process): ``output.tracking: {kind: mlflow}`` with the default URI, a
SQLite store inside the run directory; a resumed run continues the same MLflow run."""

from __future__ import annotations

import json
import os
import time

import portpicker
import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import validate_recipe
from kerasdist.errors import RecipeError

pytestmark = pytest.mark.timeout(240)

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(autouse=True)
def _no_mlflow_telemetry(monkeypatch):
    """MLflow sends usage telemetry unless told not to (and then sets no session variable)."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: {epochs}, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false, tracking: {{kind: mlflow}}}}
"""


@pytest.mark.slow  # over 30 s: not in the fast subset
def test_default_tracking_is_one_mlflow_run_in_the_run_dir_that_a_resume_continues(
        write_recipe, tmp_path):
    run_dir = tmp_path / "run"
    assert main(["fit", str(write_recipe(LINEAR.format(run_dir=run_dir, epochs=1)))]) == 0
    record = json.loads((run_dir / "tracking.json").read_text())
    assert record["uri"] == f"sqlite:///{run_dir / 'mlflow.db'}"
    assert main(["fit", str(write_recipe(LINEAR.format(run_dir=run_dir, epochs=2)))]) == 0
    assert json.loads((run_dir / "tracking.json").read_text()) == record
    client = mlflow.MlflowClient(tracking_uri=record["uri"])
    runs = client.search_runs([record["experiment_id"]])
    assert [r.info.run_id for r in runs] == [record["run_id"]]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["optimizer.learning_rate"] == "0.1"
    assert run.data.params["trainer.epochs"] == "1"  # MLflow params never change ...
    assert run.data.tags["kerasdist.changed.trainer.epochs"] == "1 -> 2"  # ... so: a tag
    assert run.data.tags["kerasdist.strategy"] == "default"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [4, 8]  # one per epoch, at the global step
    assert [m.step for m in client.get_metric_history(run.info.run_id, "examples_per_sec")] == \
        [4, 8]
    assert "final_loss" in run.data.metrics
    artifacts = sorted(a.path for a in client.list_artifacts(run.info.run_id))
    assert artifacts == ["metrics.json", "model.keras"]
    assert (run_dir / "mlartifacts").is_dir()  # artifacts stay inside the run directory


def test_a_network_tracking_uri_is_refused_for_an_isolated_local_cluster():
    from kerasdist import tracking

    uri = f"http://127.0.0.1:{portpicker.pick_unused_port()}"
    recipe = validate_recipe({"output": {"tracking": {"kind": "mlflow", "uri": uri}}})
    with pytest.raises(RecipeError, match="output.tracking.uri: a local cluster runs in a "
                                          "private network namespace"):
        tracking.check(recipe, isolated=True)  # before any request


# ------------------------------------------------ issue 39: the store is checked before writing
@pytest.mark.timeout(60)
def test_an_unreachable_server_is_refused_in_seconds_naming_the_uri_unless_not_required(
        caplog, capsys):
    from kerasdist import tracking

    uri = f"http://127.0.0.1:{portpicker.pick_unused_port()}"  # nothing listens there
    recipe = validate_recipe({"output": {"tracking": {"kind": "mlflow", "uri": uri}}})
    start = time.monotonic()
    with pytest.raises(RecipeError) as raised:
        tracking.check(recipe)
    assert time.monotonic() - start < 20
    message = str(raised.value)
    assert message.startswith("output.tracking.uri: the MLflow tracking store cannot be used")
    assert f"Received: uri='{uri}'" in message and "output.tracking.required: false" in message
    assert not {"MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"} & set(os.environ)
    optional = validate_recipe({"output": {"tracking": {"kind": "mlflow", "uri": uri,
                                                        "required": False}}})
    untracked = tracking.check(optional)
    assert untracked.output.tracking is None and untracked.model == optional.model
    printed = capsys.readouterr()
    assert "training without tracking" in caplog.text + printed.out + printed.err


def test_an_unusable_tracking_uri_is_bad_input():
    from kerasdist import tracking

    uri = "sqlite:////no/such/folder/mlflow.db"
    recipe = validate_recipe({"output": {"tracking": {"kind": "mlflow", "uri": uri}}})
    with pytest.raises(RecipeError, match="output.tracking.uri") as raised:
        tracking.check(recipe)
    assert "directory '/no/such/folder' of the SQLite file" in str(raised.value)
    # a scheme MLflow has no store for is refused earlier, when the recipe is loaded
    with pytest.raises(RecipeError, match="output.tracking.uri.*nosuchscheme"):
        validate_recipe({"output": {"tracking": {"kind": "mlflow", "uri": "nosuchscheme://h/x"}}})


@pytest.mark.timeout(120)
def test_validate_check_data_and_fit_refuse_an_unreachable_server_writing_nothing(
        write_recipe, tmp_path, capsys):
    uri = f"http://127.0.0.1:{portpicker.pick_unused_port()}"
    text = LINEAR.format(run_dir=tmp_path / "run", epochs=1).replace(
        "tracking: {kind: mlflow}", f"tracking: {{kind: mlflow, uri: '{uri}'}}")
    path = write_recipe(text)
    assert main(["validate", "--check-data", str(path)]) == EXIT_BAD_INPUT
    assert "output.tracking.uri" in capsys.readouterr().err
    assert main(["fit", str(path)]) == EXIT_BAD_INPUT
    assert f"Received: uri='{uri}'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(240)
def test_an_optional_unreachable_tracker_warns_and_the_run_trains_untracked(
        write_recipe, tmp_path, capsys):
    uri = f"http://127.0.0.1:{portpicker.pick_unused_port()}"
    run_dir = tmp_path / "run"
    text = LINEAR.format(run_dir=run_dir, epochs=1).replace(
        "tracking: {kind: mlflow}", f"tracking: {{kind: mlflow, uri: '{uri}', required: false}}")
    assert main(["fit", str(write_recipe(text))]) == 0
    printed = capsys.readouterr()
    assert "training without tracking" in printed.out + printed.err
    assert (run_dir / "model.keras").is_file() and not (run_dir / "tracking.json").exists()


def test_an_unknown_tracking_kind_is_refused_at_load(write_recipe, tmp_path, capsys):
    text = LINEAR.format(run_dir=tmp_path / "run", epochs=1).replace("kind: mlflow", "kind: wandb")
    assert main(["validate", str(write_recipe(text))]) == EXIT_BAD_INPUT
    assert "output.tracking.kind" in capsys.readouterr().err
