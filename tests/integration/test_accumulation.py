"""Gradient accumulation (``trainer.gradient_accumulation_steps``, kerasdist.keras.accumulation):
k micro-batches per optimizer update equal one update on the whole batch, under the default strategy
and MirroredStrategy on 2 logical CPUs; the recipe path; refusals."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist import fit
from kerasdist.config import validate_recipe
from kerasdist.errors import RecipeError
from kerasdist.keras.accumulation import accumulate_gradients, accumulation_steps
from kerasdist.training.model import build_compiled_model

pytestmark = pytest.mark.integration
K, BATCH = 4, 16


class _BatchSeen(keras.layers.Layer):
    """Identity that records the batch size of its last training call."""

    def build(self, input_shape):
        self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int32",
                                    aggregation="only_first_replica")

    def call(self, x, training=None):
        if training:
            self.seen.assign(tf.shape(x)[0])
        return x


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(BATCH, 4)).astype("float32"), rng.integers(0, 3, BATCH)


def _trained(steps: int, batch_size: int, strategy=None):
    """A small nonlinear classifier (same initial weights every call) after one epoch of SGD."""
    x, y = _data()
    with (strategy or tf.distribute.get_strategy()).scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), _BatchSeen(),
                                  keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.5), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        accumulate_gradients(model, steps)
    history = model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return model, history.history


def _close(a, b) -> bool:
    """Same trainable weights (``_BatchSeen``'s record is not one)."""
    return all(np.allclose(u, v, atol=1e-6) for u, v in zip(
        a.trainable_weights, b.trainable_weights, strict=True))


@pytest.mark.timeout(180)
def test_k_micro_batches_equal_one_sgd_step_on_the_whole_batch():
    accumulated, hist = _trained(K, BATCH)
    whole, whole_hist = _trained(1, BATCH)
    every_micro_batch, _ = _trained(1, BATCH // K)  # what applying every micro-batch would do
    assert int(accumulated.optimizer.iterations.numpy()) == 1  # one update: the global step
    assert int(accumulated.layers[0].seen.numpy()) == BATCH // K  # the model saw micro-batches
    assert int(whole.layers[0].seen.numpy()) == BATCH
    assert _close(accumulated, whole)
    assert not _close(accumulated, every_micro_batch)
    assert hist["loss"] == pytest.approx(whole_hist["loss"], rel=1e-5)  # full-batch mean loss
    assert hist["accuracy"] == whole_hist["accuracy"]


@pytest.mark.isolated  # a process of its own: TF caches collective shapes by instance key, so a
@pytest.mark.timeout(180)  # later MirroredStrategy with another model in this process would clash
def test_mirrored_two_replicas_accumulate_then_all_reduce_once():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    accumulated, hist = _trained(K // 2, BATCH, strategy)  # 8 per replica, micro-batches of 4
    whole, whole_hist = _trained(1, BATCH)  # one device, one step on all 16
    every_micro_batch, _ = _trained(1, BATCH // 2, strategy)
    assert strategy.num_replicas_in_sync == 2
    assert int(accumulated.optimizer.iterations.numpy()) == 1
    assert _close(accumulated, whole)
    assert not _close(accumulated, every_micro_batch)
    assert hist["loss"] == pytest.approx(whole_hist["loss"], rel=1e-5)


def _linear_recipe(run_dir, *, batch_size, steps, **strategy):
    return validate_recipe({
        "model": {"name": "linear"},
        "data": {"source": {"kind": "synthetic_linear", "num_examples": 256},
                 "train_split": "train", "eval_split": "test", "batch_size": batch_size},
        "optimizer": {"name": "sgd", "learning_rate": 0.05},
        "strategy": strategy or {"kind": "default"},
        "trainer": {"epochs": 2, "verbose": 0, "gradient_accumulation_steps": steps},
        "output": {"run_dir": str(run_dir), "tensorboard": False},
    })


class _Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.steps = accumulation_steps(self.model)


@pytest.mark.isolated  # its MirroredStrategy instances must not share a process with other tests
@pytest.mark.timeout(240)
def test_recipe_on_mirrored_counts_optimizer_updates_and_matches_unaccumulated(tmp_path):
    mirrored = {"kind": "mirrored", "logical_cpus": 2}
    seen = _Steps()
    accumulated = fit(_linear_recipe(tmp_path / "k2", batch_size=32, steps=2, **mirrored),
                      callbacks=[seen])
    plain = fit(_linear_recipe(tmp_path / "k1", batch_size=32, steps=1, **mirrored))
    assert seen.steps == 2  # the recipe's model accumulates
    spe = accumulated.extra["steps_per_epoch"]
    assert accumulated.extra["global_steps"] == 2 * spe == plain.extra["global_steps"]
    ckpts = {p.name for p in (tmp_path / "k2" / "checkpoints").glob("ckpt-*.index")}
    assert ckpts == {f"ckpt-{spe}.index", f"ckpt-{2 * spe}.index"}  # numbered by updates
    a = keras.saving.load_model(accumulated.model_path, compile=False)
    b = keras.saving.load_model(plain.model_path, compile=False)
    assert _close(a, b)
    assert accumulated.throughput["examples_per_sec"] > 0


def test_batch_that_does_not_split_into_micro_batches_is_refused():
    recipe = _linear_recipe("unused", batch_size=30, steps=4)
    with pytest.raises(RecipeError, match="gradient_accumulation_steps"):
        build_compiled_model(recipe, num_replicas=1)
    with pytest.raises(RecipeError, match=r"2 x 4 = 8"):
        build_compiled_model(_linear_recipe("unused", batch_size=20, steps=4), num_replicas=2)
    from kerasdist.strategies.multi_worker import MultiWorkerStrategy

    two_workers = validate_recipe({"strategy": {"kind": "multi_worker"}, "data": {"batch_size": 36},
                                   "cluster": {"kind": "local", "workers": 2},
                                   "trainer": {"gradient_accumulation_steps": 4}})
    with pytest.raises(RecipeError, match=r"2 x 4 = 8"):  # before any worker process starts
        MultiWorkerStrategy().preflight(two_workers)


def test_schema_refuses_zero_steps_and_parameter_server_refuses_accumulation():
    from kerasdist.strategies.parameter_server import ParameterServerStrategy

    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        validate_recipe({"trainer": {"gradient_accumulation_steps": 0}})
    recipe = validate_recipe({"strategy": {"kind": "parameter_server"},
                              "cluster": {"kind": "local", "ps": 1},
                              "trainer": {"gradient_accumulation_steps": 2}})
    with pytest.raises(RecipeError, match="trainer.gradient_accumulation_steps"):
        ParameterServerStrategy().make_input(recipe, tf_strategy=None)
