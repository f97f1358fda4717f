"""Issue 42 item 3: the summary and ``metrics.json`` say the epochs and steps actually trained and
why the run stopped (done, stopped early by a callback, already complete); a parameter-server
run is counted one way on the screen (workers), not as 1 replica in one line and 2 in another."""

from __future__ import annotations

import json

import pytest

from kerasdist.cli import main

pytestmark = pytest.mark.timeout(240)

MODULE = '''
import keras

class StopAtStep(keras.callbacks.Callback):
    """Stops training after global step `step` (mid-epoch)."""
    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0
    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.step:
            self.model.stop_training = True
'''

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {{name: sgd, learning_rate: 0.1}}
trainer: {{epochs: {epochs}, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
callbacks: {callbacks}
"""

# min_delta 1e9 (written out: YAML 1.1 reads 1.0e9 as a string): no epoch improves enough, so
# EarlyStopping stops after epoch 1 + patience 1 = epoch 2 (4 steps per epoch)
EARLY = ("[{class_name: EarlyStopping, config: {monitor: loss, patience: 1, "
         "min_delta: 1000000000.0}}]")


def _fit(write_recipe, run_dir, capsys, *, epochs, callbacks="[]"):
    recipe = write_recipe(LINEAR.format(run_dir=run_dir, epochs=epochs, callbacks=callbacks))
    capsys.readouterr()
    assert main(["fit", str(recipe)]) == 0
    return capsys.readouterr().out, json.loads((run_dir / "metrics.json").read_text())


def test_an_early_stop_is_reported_as_trained_in_the_summary_and_metrics(write_recipe, tmp_path,
                                                                         capsys):
    out, metrics = _fit(write_recipe, tmp_path / "run", capsys, epochs=5, callbacks=EARLY)
    assert "epochs             0 -> 2 of 5 (stopped early by EarlyStopping after epoch 2)" in out, \
        out
    assert "steps              0 -> 8 of 20" in out, out
    assert (metrics["epochs"], metrics["epochs_planned"], metrics["global_steps"]) == (2, 5, 8)
    assert metrics["stopped"] == {"reason": "early_stop", "epoch": 2, "step": 8,
                                  "by": "EarlyStopping"}


def test_a_callback_stopping_mid_epoch_is_reported_at_its_step(write_recipe, tmp_path, capsys,
                                                               monkeypatch):
    (tmp_path / "kd42_stopper.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    out, metrics = _fit(write_recipe, tmp_path / "run", capsys, epochs=3, callbacks=(
        "[{class_name: 'kd42_stopper:StopAtStep', config: {step: 6}}]"))
    assert "epochs             0 -> 1 of 3 (stopped early by a callback in epoch 2, at step 6)" \
        in out, out
    assert (metrics["epochs"], metrics["global_steps"]) == (1, 6)
    assert metrics["stopped"]["reason"] == "early_stop"


def test_a_run_that_trained_every_epoch_says_done_and_a_rerun_says_already_complete(
        write_recipe, tmp_path, capsys):
    out, metrics = _fit(write_recipe, tmp_path / "run", capsys, epochs=2)
    assert "epochs             0 -> 2 of 2 (done)" in out and "steps              0 -> 8 of 8" in out
    assert metrics["stopped"]["reason"] == "done" and metrics["epochs"] == 2
    out, metrics = _fit(write_recipe, tmp_path / "run", capsys, epochs=2)
    assert "epochs             2 -> 2 of 2 (already complete: nothing trained)" in out, out
    assert metrics["stopped"]["reason"] == "already_complete"


def test_a_parameter_server_run_counts_its_workers_the_same_way_on_every_line(caplog):
    from kerasdist.data.inputs import _batch_words
    from kerasdist.training.result import RunResult, summary_text

    words = _batch_words(32, 1, 2, asynchronous=True)
    assert "replica" not in words and "2 worker(s)" in words
    assert _batch_words(32, 2, 2, asynchronous=False).startswith("global batch 32 = 2 replica(s)")
    result = RunResult(history={}, evaluation={}, throughput={"examples_per_sec": 1.0,
                                                               "timed_steps": 1},
                       wall_time_s=1.0, run_dir=".", model_path=None, metrics_path="m.json",
                       initial_epoch=0, epochs=1, num_replicas=2, strategy="parameter_server")
    text = summary_text(result, tensorboard=False)
    assert "parameter_server (2 worker(s))\n" in text and "replica" not in text  # nothing trained
    result.extra["parameter_server"] = {"global_step": 1}
    text = summary_text(result, tensorboard=False)
    assert "parameter_server (2 worker(s), asynchronous)" in text and "replica" not in text


def test_the_wall_time_counts_from_the_command_start_with_the_session_split_out(write_recipe,
                                                                                tmp_path, capsys):
    from kerasdist.training.result import RunResult, summary_text

    out, metrics = _fit(write_recipe, tmp_path / "run", capsys, epochs=1)
    assert "s since the command started: training session " in out, out
    result = RunResult(history={}, evaluation={}, throughput={"examples_per_sec": 1.0,
                                                               "timed_steps": 1},
                       wall_time_s=44.0, run_dir=".", model_path=None, metrics_path="m.json",
                       initial_epoch=0, epochs=1, num_replicas=2, strategy="multi_worker")
    assert "wall time          66.0 s since the command started: training session 44.0 s, " \
           "the rest 22.0 s (start-up, checks, cluster start and stop)" in summary_text(
               result, tensorboard=False, command_s=66.0)
