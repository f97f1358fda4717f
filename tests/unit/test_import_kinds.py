"""Issue 42 item 6: an object a recipe names by import path is checked against the kind its field
documents *before* it is built or called; schedules are evaluated before training; a callback
whose ``__init__`` raises is bad input; ``launch --task-timeout-s 0`` is refused.

Each refusal exits 2 naming the field, with "Received:", and leaves nothing behind: the marker
files below are written only when the user's object is built or called."""

from __future__ import annotations

import argparse
import time

import pytest

from kerasdist.cli import EXIT_BAD_INPUT, main
from kerasdist.config import validate_recipe
from kerasdist.errors import DataError, RecipeError

pytestmark = pytest.mark.timeout(240)

MODULE = '''
import pathlib
import keras

MARKER = pathlib.Path({marker!r})

class Boom:
    """Not a Keras object: building it leaves a mark."""
    def __init__(self, *args, **kwargs):
        MARKER.write_text("built")
    def __call__(self, *args, **kwargs):
        MARKER.write_text("called")

def boom(*args, **kwargs):
    MARKER.write_text("called")

def no_args():
    MARKER.write_text("called")

class Angry(keras.callbacks.Callback):
    def __init__(self, mood="bad"):
        raise RuntimeError("refuses to start: " + mood)

class Negative(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return -0.1
    def get_config(self):
        return {{}}
'''

LINEAR = """
model: {{name: linear{model}}}
data: {{source: {{kind: synthetic_linear, num_examples: 200}}, train_split: train,
        eval_split: test, batch_size: 50}}
optimizer: {optimizer}
trainer: {{epochs: 1, verbose: 0}}
output: {{run_dir: '{run_dir}', tensorboard: false}}
callbacks: {callbacks}
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    folder = tmp_path / "pkgs"
    folder.mkdir()
    marker = tmp_path / "marker.txt"
    (folder / "kd_kinds_user.py").write_text(MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(folder))
    return marker


def _recipe(write_recipe, run_dir, *, optimizer="{name: sgd, learning_rate: 0.1}",
            callbacks="[]", model=""):
    return str(write_recipe(LINEAR.format(run_dir=run_dir, optimizer=optimizer,
                                          callbacks=callbacks, model=model)))


def test_a_popen_callback_never_runs_under_validate_import_or_fit(write_recipe, tmp_path,
                                                                 capsys):
    touched = tmp_path / "X"
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir, callbacks=(
        f"[{{class_name: 'subprocess:Popen', config: {{args: [touch, '{touched}']}}}}]"))
    validated = main(["validate", "--import", recipe])
    validate_err = capsys.readouterr().err
    fitted = main(["fit", recipe])
    fit_err = capsys.readouterr().err
    time.sleep(1.0)  # a Popen started by either command would have touched X by now
    assert not touched.exists(), "the recipe's command ran"
    assert (validated, fitted) == (EXIT_BAD_INPUT, EXIT_BAD_INPUT)
    for err in (validate_err, fit_err):
        assert "callbacks.0.class_name: must name a keras.callbacks.Callback subclass" in err, err
        assert "class subprocess.Popen" in err and "Received: 'subprocess:Popen'" in err, err
    assert not run_dir.exists()


@pytest.mark.parametrize(("section", "field", "what"), [
    ({"model": {"name": "kd_kinds_user:Boom", "loss": "mse"}}, "model.name",
     "a keras.Model subclass"),
    ({"model": {"loss": "kd_kinds_user:Boom"}}, "model.loss", "a keras.losses.Loss subclass"),
    ({"model": {"loss": "kd_kinds_user:no_args"}}, "model.loss", "a function (y_true, y_pred)"),
    ({"model": {"metrics": ["kd_kinds_user:Boom"]}}, "model.metrics.0",
     "a keras.metrics.Metric subclass"),
    ({"optimizer": {"name": "kd_kinds_user:Boom"}}, "optimizer.name",
     "a keras.optimizers.Optimizer subclass"),
    ({"optimizer": {"learning_rate": {"class_name": "kd_kinds_user:Boom", "config": {"a": 1}}}},
     "optimizer.learning_rate.class_name", "LearningRateSchedule subclass"),
    ({"callbacks": ["kd_kinds_user:Boom"]}, "callbacks.0", "a keras.callbacks.Callback subclass"),
    ({"callbacks": ["kd_kinds_user:boom"]}, "callbacks.0", "a keras.callbacks.Callback subclass"),
    ({"callbacks": [{"class_name": "LearningRateScheduler", "config": {
        "schedule": "kd_kinds_user:Boom"}}]}, "callbacks.0.config.schedule",
     "a function (epoch, lr)"),
    ({"callbacks": [{"class_name": "LearningRateScheduler", "config": {
        "schedule": "subprocess:call"}}]}, "callbacks.0.config.schedule", "standard library"),
    ({"model": {"loss": "os:popen"}}, "model.loss", "standard library"),
])
def test_an_import_path_of_another_kind_is_refused_unbuilt_and_uncalled(
        user_module, tmp_path, section, field, what):
    from kerasdist.training.keras_objects import check_training_config

    with pytest.raises(RecipeError) as info:
        check_training_config(validate_recipe(section), tmp_path / "run")
    message = str(info.value)
    assert f"{field}: " in message and what in message and "Received:" in message, \
        message
    assert not user_module.exists(), user_module.read_text()


@pytest.mark.parametrize("function", ["kd_kinds_user:Boom", "kd_kinds_user:no_args",
                                      "os:popen"])
def test_a_data_function_of_another_kind_is_refused_uncalled(user_module, function):
    from kerasdist.data.sources.python import load_function

    config = validate_recipe({"data": {"source": {"kind": "python", "function": function}}}).data
    with pytest.raises(DataError, match=r"^data.source.function: .*Received:"):
        load_function(config)
    assert not user_module.exists()


def test_a_model_builder_of_another_kind_exits_2_under_fit_and_nothing_is_built(
        user_module, write_recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    recipe = str(write_recipe(LINEAR.format(run_dir=run_dir, optimizer="{name: sgd}",
                                            callbacks="[]", model="")
                              .replace("name: linear", "name: 'kd_kinds_user:Boom', loss: mse")))
    assert main(["fit", recipe]) == EXIT_BAD_INPUT
    assert "model.name: must name a function returning an uncompiled keras.Model" in \
        capsys.readouterr().err
    assert not user_module.exists() and not run_dir.exists()


def test_a_callback_whose_init_raises_exits_2_naming_it(user_module, write_recipe, tmp_path,
                                                         capsys):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir, callbacks=(
        "[TerminateOnNaN, {class_name: 'kd_kinds_user:Angry', config: {mood: grumpy}}]"))
    assert main(["fit", recipe]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "callbacks.1: building Angry raised RuntimeError: refuses to start: grumpy" in err, err
    assert "Received: {'class_name': 'kd_kinds_user:Angry'" in err and "Traceback" not in err
    assert not run_dir.exists()


@pytest.mark.parametrize(("schedule", "needle"), [
    ("{class_name: ExponentialDecay, config: {initial_learning_rate: -0.1, decay_steps: 10, "
     "decay_rate: 0.5}}", "the rate at step 0 is -0.1"),
    ("{class_name: PiecewiseConstantDecay, config: {boundaries: [4], values: [0.1, -0.1]}}",
     "the rate at step 5 is -0.1"),
    ("{class_name: ExponentialDecay, config: {initial_learning_rate: .nan, decay_steps: 10, "
     "decay_rate: 0.5}}", "the rate at step 0 is nan"),
    ("{class_name: PiecewiseConstantDecay, config: {boundaries: [4], values: [0.0, 0.0]}}",
     "every rate checked is 0"),
    ("{class_name: 'kd_kinds_user:Negative'}", "the rate at step 0 is -0.1"),
])
def test_a_schedule_without_a_positive_finite_rate_exits_2_naming_the_field(
        user_module, write_recipe, tmp_path, capsys, schedule, needle):
    run_dir = tmp_path / "run"
    recipe = _recipe(write_recipe, run_dir, optimizer=f"{{name: sgd, learning_rate: {schedule}}}")
    assert main(["validate", "--import", recipe]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "optimizer.learning_rate: a learning rate must be finite and > 0" in err, err
    assert needle in err and "Received:" in err, err
    assert main(["fit", recipe]) == EXIT_BAD_INPUT
    assert not run_dir.exists()


@pytest.mark.parametrize("schedule", [
    # Keras's own forms that touch 0 at one point: warm-up from 0, cosine decay to 0
    "{class_name: CosineDecay, config: {initial_learning_rate: 0.0, decay_steps: 8, "
    "warmup_target: 0.05, warmup_steps: 2}}",
    "{class_name: CosineDecay, config: {initial_learning_rate: 0.01, decay_steps: 8}}",
    "{class_name: PiecewiseConstantDecay, config: {boundaries: [4], values: [0.1, 0.01]}}",
])
def test_keras_schedules_that_train_are_accepted(write_recipe, tmp_path, schedule):
    recipe = _recipe(write_recipe, tmp_path / "run",
                     optimizer=f"{{name: sgd, learning_rate: {schedule}}}")
    assert main(["validate", "--import", recipe]) == 0


def test_launch_task_timeout_0_is_refused_as_the_message_says():
    from kerasdist.cli_ops import task_timeout_s

    with pytest.raises(argparse.ArgumentTypeError, match=r"more than 0.*Received: '0'"):
        task_timeout_s("0")
    assert task_timeout_s("none") is None and task_timeout_s("2.5") == 2.5
