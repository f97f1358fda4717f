"""Issue 30, point 2 (and its parts of 3 and 6): the Keras-native training config of a recipe.

The optimizer, its schedule, the loss, the metrics and the callbacks are Keras names, Keras
configs ``{class_name, config}`` or import paths, built with Keras's own lookups; a bad one exits 2
before anything is written; a resumed run continues its schedule at the exact step and refuses
another schedule; ``model.from`` fine-tunes a saved model with ``model.trainable_layers``."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import validate_recipe
from kerasdist.errors import RecipeError

pytestmark = pytest.mark.timeout(240)

USER_MODULE = '''
import json, os
import keras

def build():
    return keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(4, name="body"),
                             keras.layers.Dense(1, name="head")], name="two_layers")

class Recorder(keras.callbacks.Callback):
    """Appends one line per epoch end (epoch, learning rate) to `filename`."""
    def __init__(self, filename, tag="rec"):
        super().__init__()
        self.filename, self.tag = filename, tag
    def on_epoch_end(self, epoch, logs=None):
        lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        with open(self.filename, "a") as f:
            f.write(json.dumps({"epoch": epoch, "lr": lr, "tag": self.tag}) + "\\n")

class NotACallback:
    pass

class Configured(keras.callbacks.Callback):
    def __init__(self, every=1):
        super().__init__()
        self.every = every
    def get_config(self):
        return {"every": self.every}

def halve(epoch, lr):
    return lr / 2.0
'''

LINEAR = """
model: {{name: linear}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {optimizer}
trainer: {{epochs: {epochs}, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
callbacks: {callbacks}
"""

COSINE = ("{name: adamw, params: {weight_decay: 1.0e-4}, learning_rate: {class_name: CosineDecay, "
          "config: {initial_learning_rate: 0.01, decay_steps: 8, warmup_target: 0.05, "
          "warmup_steps: 2}}}")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    folder = tmp_path / "pkgs"
    folder.mkdir()
    (folder / "kd_cfg_user.py").write_text(USER_MODULE)
    (folder / "kd_cfg_broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(folder))
    return "kd_cfg_user"


def _recipe(write_recipe, run_dir, *, optimizer="{name: sgd, learning_rate: 0.1}", epochs=1,
            callbacks="[]", name="recipe.yaml"):
    return str(write_recipe(LINEAR.format(run_dir=run_dir, optimizer=optimizer, epochs=epochs,
                                          callbacks=callbacks), name=name))


def _digest(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())["weights_sha256"]


# ------------------------------------------------------------------------ shape, at load time
def test_the_keras_form_of_an_optimizer_reads_as_name_params_and_learning_rate():
    recipe = validate_recipe({"optimizer": {
        "class_name": "AdamW", "module": "keras.optimizers", "registered_name": None,
        "config": {"name": "adamw", "learning_rate": 0.01, "weight_decay": 0.1}}})
    assert (recipe.optimizer.name, recipe.optimizer.learning_rate) == ("AdamW", 0.01)
    assert recipe.optimizer.params == {"weight_decay": 0.1}


def test_recipes_written_before_keep_their_meaning():
    recipe = validate_recipe({"optimizer": {"name": "sgd", "learning_rate": 0.5, "momentum": 0.9,
                                            "nesterov": True}, "model": {"loss": "mse"}})
    assert recipe.optimizer.model_dump() == {
        "name": "sgd", "params": {}, "learning_rate": 0.5, "momentum": 0.9, "nesterov": True,
        "scale_lr_by_replicas": False}
    assert recipe.model.loss == "mse" and recipe.callbacks == []


@pytest.mark.parametrize(("section", "expected"), [
    ({"optimizer": {"class_name": "Adam", "name": "adam"}}, "not both. Received: keys"),
    ({"optimizer": {"params": {"learning_rate": 1}}}, "optimizer.params.learning_rate"),
    ({"optimizer": {"scale_lr_by_replicas": True, "learning_rate": {
        "class_name": "ExponentialDecay", "config": {}}}}, "scale_lr_by_replicas"),
    ({"optimizer": {"name": "pkg.mod:a:b"}}, "optimizer.name: not an import path"),
    ({"model": {"loss": " "}}, "model.loss: an empty identifier"),
    ({"model": {"metrics": ["acc", "1pkg:x"]}}, "model.metrics.1: not an import path"),
    ({"callbacks": ["Early Stopping"]}, "callbacks.0: a Keras callback class name"),
    ({"model": {"from": "missing.keras"}}, "model.from does not exist"),
    ({"model": {"from": "recipe.yaml"}}, "ending in .keras"),
])
def test_malformed_training_config_is_refused_at_load_naming_the_field(section, expected):
    with pytest.raises(RecipeError, match="invalid recipe") as info:
        validate_recipe(section)
    assert expected in str(info.value)


# ---------------------------------------------------------------------- built with Keras here
def test_objects_are_built_by_keras_from_names_configs_and_import_paths(user_module, tmp_path):
    import keras

    from kerasdist.training import keras_objects as ko

    recipe = validate_recipe({"optimizer": {"name": "adamw", "params": {"weight_decay": 1e-4},
                              "learning_rate": {"class_name": "CosineDecay", "config": {
                                  "initial_learning_rate": 5e-4, "decay_steps": 400,
                                  "warmup_target": 2e-3, "warmup_steps": 40}}}})
    optimizer = ko.make_optimizer(recipe.optimizer)
    assert isinstance(optimizer, keras.optimizers.AdamW) and optimizer.weight_decay == 1e-4
    schedule = optimizer._learning_rate
    assert float(schedule(0)) == pytest.approx(5e-4) and float(schedule(40)) == pytest.approx(2e-3)
    sgd = ko.make_optimizer(validate_recipe({"optimizer": {"name": "sgd", "momentum": 0.9,
                                                           "nesterov": True}}).optimizer)
    assert isinstance(sgd, keras.optimizers.SGD) and (sgd.momentum, sgd.nesterov) == (0.9, True)
    loss = ko.make_loss(validate_recipe({"model": {"loss": {
        "class_name": "SparseCategoricalCrossentropy", "config": {"from_logits": True}}}}).model.loss)
    assert loss.get_config()["from_logits"] is True
    metrics = ko.make_metrics(validate_recipe({"model": {"metrics": [
        "accuracy", {"class_name": "SparseTopKCategoricalAccuracy", "config": {"k": 2}}]}})
        .model.metrics)
    assert metrics[0] == "accuracy" and metrics[1].get_config()["k"] == 2
    # a plain name keeps its spelling in the logs, as compile(metrics=["mae"]) gives
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=ko.make_metrics(["mae", "MeanSquaredError"]))
    logs = model.evaluate(np.zeros((4, 1)), np.zeros((4, 1)), verbose=0, return_dict=True)
    assert sorted(logs) == ["MeanSquaredError", "loss", "mae"]
    callbacks = ko.make_callbacks(validate_recipe({"callbacks": [
        "TerminateOnNaN", {"class_name": "CSVLogger", "config": {"filename": "train.csv"}},
        {"class_name": f"{user_module}:Recorder", "config": {"filename": "rec.jsonl"}},
        {"class_name": "LearningRateScheduler", "config": {"schedule": f"{user_module}:halve"}},
        {"class_name": "ModelCheckpoint", "config": {"filepath": "/abs/best.keras"}}]}).callbacks,
        tmp_path / "run")
    assert [type(c).__name__ for c in callbacks] == [
        "TerminateOnNaN", "CSVLogger", "Recorder", "LearningRateScheduler", "ModelCheckpoint"]
    assert callbacks[1].filename == str(tmp_path / "run" / "train.csv")  # inside the run dir
    assert callbacks[2].filename == str(tmp_path / "run" / "rec.jsonl")
    assert callbacks[3].schedule(0, 1.0) == 0.5 and callbacks[4].filepath == "/abs/best.keras"
    assert not (tmp_path / "run").exists()  # building writes nothing


@pytest.mark.parametrize(("section", "expected"), [
    ({"optimizer": {"name": "nosuchopt"}}, "optimizer: Keras cannot build this optimizer"),
    ({"optimizer": {"name": "adam", "params": {"bogus": 1}}}, "Received: {'name': 'adam', "
                                                              "'params': {'bogus': 1}}"),
    ({"optimizer": {"learning_rate": {"class_name": "NoSuchDecay", "config": {}}}},
     "optimizer.learning_rate: must give a keras.optimizers.schedules.LearningRateSchedule"),
    ({"optimizer": {"learning_rate": {"class_name": "ExponentialDecay", "config": {"x": 1}}}},
     "optimizer.learning_rate: Keras cannot build this schedule"),
    ({"optimizer": {"name": "kd_cfg_user:Recorder"}}, "must name a keras.optimizers.Optimizer"),
    ({"model": {"loss": "no_such_loss"}}, "model.loss: Could not interpret loss"),
    ({"model": {"metrics": ["acc", {"class_name": "NoSuchMetric"}]}}, "model.metrics.1: unknown"),
    ({"callbacks": [{"class_name": "EarlyStopping", "config": {"patience": 1, "oops": 2}}]},
     "callbacks.0: EarlyStopping cannot be built from its config"),
    ({"callbacks": ["NoSuchCallback"]}, "callbacks.0: not a Keras callback"),
    ({"callbacks": ["BackupAndRestore"]}, "callbacks.0: BackupAndRestore is not accepted"),
    ({"callbacks": ["kd_cfg_user:NotACallback"]}, "callbacks.0: must name a keras.callbacks"),
    ({"callbacks": ["kd_cfg_user:Missing"]}, "module 'kd_cfg_user' has no 'Missing'"),
    ({"callbacks": ["kd_cfg_broken:X"]}, "raised RuntimeError: broken on purpose"),
    ({"callbacks": ["kd_cfg_nowhere:X"]}, "callbacks.0: cannot import module 'kd_cfg_nowhere'"),
])
def test_what_keras_cannot_build_is_a_recipe_error_naming_the_field(user_module, tmp_path,
                                                                     section, expected):
    from kerasdist.training.keras_objects import check_training_config

    with pytest.raises(RecipeError) as info:
        check_training_config(validate_recipe(section), tmp_path / "run")
    assert expected in str(info.value) and "Received:" in str(info.value)


# ------------------------------------------------------------------------- kerasdist fit, CLI
def test_fit_trains_with_a_schedule_and_recipe_callbacks_writing_inside_the_run_dir(
        user_module, write_recipe, tmp_path):
    run_dir = tmp_path / "run"
    callbacks = (f"[TerminateOnNaN, {{class_name: CSVLogger, config: {{filename: train.csv}}}}, "
                 f"{{class_name: '{user_module}:Recorder', config: {{filename: lr.jsonl}}}}]")
    assert main(["fit", _recipe(write_recipe, run_dir, optimizer=COSINE, epochs=2,
                                callbacks=callbacks)]) == 0
    with open(run_dir / "train.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["epoch"] for row in rows] == ["0", "1"] and "loss" in rows[0]
    lrs = [json.loads(line)["lr"] for line in (run_dir / "lr.jsonl").read_text().splitlines()]
    # 4 steps per epoch: CosineDecay after warm-up, evaluated at optimizer.iterations 4 and 8
    import keras

    schedule = keras.optimizers.schedules.CosineDecay(0.01, 8, warmup_target=0.05, warmup_steps=2)
    assert lrs == pytest.approx([float(schedule(4)), float(schedule(8))], rel=1e-6)


def test_a_resumed_run_continues_the_schedule_at_its_exact_step(write_recipe, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(["fit", _recipe(write_recipe, whole, optimizer=COSINE, epochs=2)]) == 0
    assert main(["fit", _recipe(write_recipe, split, optimizer=COSINE, epochs=1)]) == 0
    assert main(["fit", _recipe(write_recipe, split, optimizer=COSINE, epochs=2)]) == 0
    assert json.loads((split / "metrics.json").read_text())["start_step"] == 4
    assert _digest(split) == _digest(whole)


def test_a_changed_schedule_on_resume_exits_2_naming_the_field_and_writes_nothing(
        write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["fit", _recipe(write_recipe, run_dir, optimizer=COSINE)]) == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    other = COSINE.replace("decay_steps: 8", "decay_steps: 80")
    capsys.readouterr()
    assert main(["fit", _recipe(write_recipe, run_dir, optimizer=other, epochs=2)]) == \
        EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "optimizer.learning_rate: the schedule changed" in err and "'decay_steps': 80" in err
    assert main(["fit", _recipe(write_recipe, run_dir, epochs=2,
                                optimizer="{name: adamw, learning_rate: 0.01}")]) == EXIT_BAD_INPUT
    assert "Received: learning_rate=0.01" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_callback_keras_cannot_build_exits_2_before_anything_is_written(write_recipe, tmp_path,
                                                                          capsys):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir, callbacks="[{class_name: EarlyStopping, config: "
                     "{patience: 1, patiense: 2}}]")
    assert main(["fit", recipe]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "callbacks.0: EarlyStopping cannot be built" in err and "'patiense': 2" in err
    assert not run_dir.exists()
    assert main(["validate", recipe]) == 0  # shape only: nothing imported, and it says so
    assert "callbacks: checked for shape only (--import builds them" in capsys.readouterr().out
    assert main(["validate", "--import", recipe]) == EXIT_BAD_INPUT
    assert "callbacks.0: EarlyStopping" in capsys.readouterr().err


def test_early_stopping_ends_the_run_at_the_epoch_it_stops(write_recipe, tmp_path):
    run_dir = tmp_path / "run"
    # min_delta 1e9 (written out: YAML 1.1 reads 1.0e9 as a string): no epoch improves enough,
    # so it stops after epoch 1 + patience 1
    callbacks = ("[{class_name: EarlyStopping, config: {monitor: loss, patience: 1, "
                 "min_delta: 1000000000.0}}]")
    assert main(["fit", _recipe(write_recipe, run_dir, epochs=5, callbacks=callbacks)]) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_steps"] == 2 * 4


def test_model_from_a_saved_model_trains_only_the_trainable_layers(user_module, write_recipe,
                                                                   tmp_path):
    import keras

    first, second = tmp_path / "first", tmp_path / "second"
    base = LINEAR.replace("model: {{name: linear}}", "model: {{name: '{user}:build', loss: mse"
                          "{extra}}}")
    text = base.format(user=user_module, extra="", run_dir=first, optimizer="{name: sgd, "
                       "learning_rate: 0.05}", epochs=1, callbacks="[]")
    assert main(["fit", str(write_recipe(text, name="a.yaml"))]) == 0
    saved = keras.saving.load_model(first / "model.keras", compile=False)
    extra = f", from: '{first / 'model.keras'}', trainable_layers: [head]"
    text = base.format(user=user_module, extra=extra, run_dir=second, optimizer="{name: sgd, "
                       "learning_rate: 0.05}", epochs=1, callbacks="[]")
    assert main(["fit", str(write_recipe(text, name="b.yaml"))]) == 0
    tuned = keras.saving.load_model(second / "model.keras", compile=False)
    for layer, same in (("body", True), ("head", False)):
        equal = all(np.array_equal(a, b) for a, b in zip(
            saved.get_layer(layer).get_weights(), tuned.get_layer(layer).get_weights(), strict=True))
        assert equal is same, layer
    bad = base.format(user=user_module, extra=extra.replace("[head]", "[neck*]"), run_dir=tmp_path
                      / "third", optimizer="{name: sgd}", epochs=1, callbacks="[]")
    assert main(["fit", str(write_recipe(bad, name="c.yaml"))]) == EXIT_BAD_INPUT
    assert not (tmp_path / "third").exists()



def test_python_callbacks_a_task_can_rebuild_travel_in_the_recipe(user_module):
    """Point 3: the refusal of Python callbacks for local clusters is lifted for those a child
    task can rebuild from a recipe entry; the others stay refused (returned as kept)."""
    import importlib

    import keras

    from kerasdist.launch.run import send_callbacks_by_path

    recipe = validate_recipe({"cluster": {"kind": "local", "workers": 2},
                              "strategy": {"kind": "multi_worker"}, "callbacks": ["TerminateOnNaN"]})
    configured = importlib.import_module(user_module).Configured(every=3)
    history = keras.callbacks.History()  # Keras's own: no get_config, cannot be rebuilt
    sent, kept = send_callbacks_by_path(recipe, [
        configured, {"class_name": "EarlyStopping", "config": {"patience": 2}}, history])
    assert kept == [history]
    assert sent.model_dump(mode="json")["callbacks"] == [
        "TerminateOnNaN", {"class_name": f"{user_module}:Configured", "config": {"every": 3}},
        {"class_name": "EarlyStopping", "config": {"patience": 2}}]
    from kerasdist.training.keras_objects import make_callbacks

    rebuilt = make_callbacks(sent.callbacks, "/unused")[1]
    assert type(rebuilt) is type(configured) and rebuilt.every == 3


def test_mirrored_runs_the_schedule_and_recipe_callbacks_on_two_replicas(user_module,
                                                                         write_recipe, tmp_path):
    """Point 3 under strategy mirrored (2 logical CPUs, 2 replicas in this process)."""
    run_dir = tmp_path / "run"
    text = LINEAR.format(run_dir=run_dir, optimizer=COSINE, epochs=3, callbacks=(
        "[{class_name: CSVLogger, config: {filename: train.csv}}, {class_name: EarlyStopping, "
        "config: {monitor: loss, patience: 1, min_delta: 1000000000.0}}, "
        f"{{class_name: '{user_module}:Recorder', config: {{filename: lr.jsonl}}}}]"))
    text += "strategy: {kind: mirrored}\n"
    assert main(["fit", str(write_recipe(text))]) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["num_replicas"] == 2 and metrics["global_steps"] == 8  # stopped after 2 of 3
    assert _csv_rows(run_dir) == ["0", "1"]
    assert len((run_dir / "lr.jsonl").read_text().splitlines()) == 2


def _csv_rows(run_dir):
    with open(run_dir / "train.csv") as handle:
        return [row["epoch"] for row in csv.DictReader(handle)]


def test_reduce_lr_on_plateau_lowers_the_rate_and_a_resume_keeps_the_lowered_rate(
        user_module, write_recipe, tmp_path):
    """The checkpoint holds the learning rate a callback left; resuming with the recipe's
    unchanged constant keeps it (before, the recipe's value was always assigned back)."""
    run_dir = tmp_path / "run"
    callbacks = ("[{class_name: ReduceLROnPlateau, config: {monitor: loss, factor: 0.5, "
                 "patience: 0, min_delta: 1000000000.0, min_lr: 0.0}}, "
                 f"{{class_name: '{user_module}:Recorder', config: {{filename: lr.jsonl}}}}]")
    assert main(["fit", _recipe(write_recipe, run_dir, epochs=3, callbacks=callbacks)]) == 0
    assert main(["fit", _recipe(write_recipe, run_dir, epochs=4, callbacks=callbacks)]) == 0
    lrs = [json.loads(line)["lr"] for line in (run_dir / "lr.jsonl").read_text().splitlines()]
    # epochs 2 and 3 do not improve by 1e9: halved; epoch 4 (a new callback, no best yet) keeps it
    assert lrs == pytest.approx([0.1, 0.05, 0.025, 0.025])


def _board_step_calls(monkeypatch, tmp_path, **board):
    """How often Keras's own ``TensorBoard.on_train_batch_end`` ran in a 2 x 5-step fit with
    kerasdist's :class:`EpochTensorBoard`; and the tags of the train event file."""
    import keras
    import numpy as np
    import tensorflow as tf

    from kerasdist.keras.callbacks import EpochTensorBoard

    calls = []
    original = keras.callbacks.TensorBoard.on_train_batch_end
    monkeypatch.setattr(keras.callbacks.TensorBoard, "on_train_batch_end",
                        lambda self, batch, logs=None: (calls.append(batch),
                                                        original(self, batch, logs)))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.ones((20, 3), np.float32)
    model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0,
              callbacks=[EpochTensorBoard(log_dir=str(tmp_path / "tb"), **board)])
    tags = set()
    for path in (tmp_path / "tb" / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags |= {value.tag for value in event.summary.value}
    return len(calls), tags


def test_epoch_tensorboard_skips_the_step_hooks_that_write_nothing(monkeypatch, tmp_path):
    calls, tags = _board_step_calls(monkeypatch, tmp_path)
    assert calls == 1  # the first step (it writes the graph), then none of the 10
    assert "epoch_loss" in tags  # the epoch summaries are still written


def test_epoch_tensorboard_is_kerass_own_when_it_profiles_or_writes_per_step(monkeypatch, tmp_path):
    assert _board_step_calls(monkeypatch, tmp_path / "a", profile_batch=2)[0] == 10
    calls, tags = _board_step_calls(monkeypatch, tmp_path / "b", update_freq=1)
    assert calls == 10 and "batch_loss" in tags
