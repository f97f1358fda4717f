"""Plain ``model.fit``/``model.evaluate`` under ParameterServerStrategy on an in-process cluster."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist.data import make_dataset_fn

pytest_plugins = ["kerasdist.testing"]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kerasdist_enabled")]

FEATURES, CLASSES, BATCH = 8, 3, 32
PS_KEYS = {"ps_global_step", "ps_steps", "ps_staleness_mean",
           "ps_staleness_max", "ps_steps_worker_0", "ps_steps_worker_1"}


def _data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, FEATURES)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((FEATURES, CLASSES))
    return x, np.argmax(x @ w, axis=1).astype(np.int64)


X_TRAIN, Y_TRAIN = _data(512, seed=1)
X_EVAL, Y_EVAL = _data(300, seed=2)  # 300: the last batch of 32 is partial
TRAIN_FN = make_dataset_fn(X_TRAIN, Y_TRAIN, global_batch_size=BATCH, training=True, repeat=True)
EVAL_FN = make_dataset_fn(X_EVAL, Y_EVAL, global_batch_size=BATCH, training=False)


def _mlp(strategy, **compile_kwargs):
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, "relu"),
                                  keras.layers.Dense(CLASSES)])
        model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], **compile_kwargs)
    return model


class _BatchLog(keras.callbacks.Callback):
    """Records the batch indices of ``on_train_batch_end`` per epoch."""

    def __init__(self):
        super().__init__()
        self.ends: list[list[int]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.ends.append([])

    def on_train_batch_end(self, batch, logs=None):
        self.ends[-1].append(batch)


@pytest.mark.timeout(180)
def test_fit_keeps_keras_semantics_and_reports_ps_figures(ps_strategy, tmp_path, capsys):
    model = _mlp(ps_strategy)
    batches = _BatchLog()
    best = tmp_path / "best.keras"
    callbacks = [batches, keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb")),
                 keras.callbacks.ModelCheckpoint(str(best), monitor="val_loss",
                                                 save_best_only=True)]
    history = model.fit(TRAIN_FN, epochs=3, steps_per_epoch=12, validation_data=EVAL_FN,
                        callbacks=callbacks, verbose=1)
    logs = history.history
    bar = capsys.readouterr().out
    assert "accuracy:" in bar and "loss:" in bar and "ps_" not in bar  # the bar: loss + metrics
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} | PS_KEYS <= set(logs)
    assert all(len(v) == 3 for v in logs.values())
    assert logs["ps_steps"] == [12, 12, 12] and logs["ps_global_step"] == [12, 24, 36]
    for epoch in range(3):
        assert logs["ps_steps_worker_0"][epoch] + logs["ps_steps_worker_1"][epoch] == 12
    assert batches.ends == [list(range(12))] * 3  # the progress bar advanced step by step
    stats = history.ps_stats
    assert stats["global_step"] == stats["steps"] == sum(stats["steps_per_worker"]) == 36
    assert int(model.optimizer.iterations.numpy()) == 36
    assert 0 <= stats["staleness_mean"] <= stats["staleness_max"]
    assert all(0 <= m <= x for m, x in zip(logs["ps_staleness_mean"], logs["ps_staleness_max"], strict=True))
    assert stats["examples"] == 36 * BATCH and stats["whole_epoch_examples_per_sec"] > 0
    assert logs["loss"][-1] < logs["loss"][0] and logs["val_accuracy"][-1] > 0.6
    assert keras.saving.load_model(best).count_params() == model.count_params()
    assert list((tmp_path / "tb").rglob("events.out.tfevents*"))


def _numpy_metrics(model, x, y):
    w1, b1, w2, b2 = model.get_weights()
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return (float(-log_probs[np.arange(len(y)), y].mean()),
            float((logits.argmax(axis=1) == y).mean()))


def _counts(model):
    return {float(v.numpy()) for v in model.metrics_variables if v.name == "count"}


@pytest.mark.timeout(180)
def test_evaluate_aggregates_every_example_once_across_workers(ps_strategy):
    model = _mlp(ps_strategy)
    model.fit(TRAIN_FN, epochs=1, steps_per_epoch=8, verbose=0)
    loss, accuracy = _numpy_metrics(model, X_EVAL, Y_EVAL)
    inputs = {"dataset_fn": (EVAL_FN,), "dataset": (tf.data.Dataset.from_tensor_slices(
        (X_EVAL, Y_EVAL)).batch(64),), "arrays": (X_EVAL, Y_EVAL)}
    for name, args in inputs.items():
        result = model.evaluate(*args, verbose=0, return_dict=True)
        assert result["accuracy"] == pytest.approx(accuracy, abs=1e-6), name
        assert result["loss"] == pytest.approx(loss, rel=1e-4), name
        assert _counts(model) == {300.0}, name  # loss tracker and accuracy counted 300 examples
    loss_first, accuracy_first = model.evaluate(EVAL_FN, steps=3, verbose=0)
    assert _counts(model) == {96.0}
    # Each worker reads its own shard (examples w, w+2, ...) in order; the 3 batches are the first
    # a of worker 0's and the first 3-a of worker 1's, whichever worker was free took the next.
    shards = [np.arange(w, len(Y_EVAL), 2) for w in (0, 1)]
    candidates = []
    for a in range(4):
        rows = np.concatenate([shards[0][:a * BATCH], shards[1][:(3 - a) * BATCH]])
        candidates.append(_numpy_metrics(model, X_EVAL[rows], Y_EVAL[rows])[1])
    assert any(abs(accuracy_first - c) < 1e-6 for c in candidates), (accuracy_first, candidates)


@pytest.mark.timeout(120)
def test_missing_steps_per_epoch_is_a_clear_error(ps_strategy):
    model = _mlp(ps_strategy)
    with pytest.raises(ValueError, match=r"`steps_per_epoch` is required.*"
                                         r"Received: steps_per_epoch=None"):
        model.fit(TRAIN_FN, epochs=1, verbose=0)
    endless = tf.data.Dataset.from_tensor_slices((X_TRAIN, Y_TRAIN)).batch(BATCH).repeat()
    with pytest.raises(ValueError, match=r"infinite dataset.*Received: steps_per_epoch=None"):
        model.fit(endless, epochs=1, verbose=0)
    finite = tf.data.Dataset.from_tensor_slices((X_TRAIN, Y_TRAIN)).batch(BATCH)
    history = model.fit(finite, epochs=1, verbose=0)  # one pass: its 16 batches
    assert history.history["ps_steps"] == [16]


@pytest.mark.timeout(120)
def test_early_stopping_and_steps_per_execution(ps_strategy):
    model = _mlp(ps_strategy, steps_per_execution=2)
    batches = _BatchLog()
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=100.0, patience=0)
    history = model.fit(TRAIN_FN, epochs=5, steps_per_epoch=9, callbacks=[stop, batches],
                        verbose=0)
    assert len(history.history["loss"]) == 2 and model.stop_training
    assert batches.ends == [[1, 3, 5, 7, 8]] * 2  # 4 calls of 2 steps, then 1
    assert history.history["ps_global_step"] == [9, 18]
    assert sum(history.ps_stats["steps_per_worker"]) == 18


class SeenBy(keras.Model):
    """Records, per worker, how often each example id (feature 0) was trained on."""

    def __init__(self, num_examples: int):
        super().__init__()
        self.dense = keras.layers.Dense(2)
        self.seen = self.add_weight(shape=(2, num_examples), initializer="zeros",
                                    trainable=False, name="seen")

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        ids = tf.cast(data[0][:, 0], tf.int64)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        where = tf.stack([tf.fill(tf.shape(ids), worker), ids], axis=1)
        self.seen.assign_add(tf.scatter_nd(where, tf.ones_like(ids, tf.float32),
                                           self.seen.shape))
        return super().train_step(data)


@pytest.mark.timeout(180)
def test_workers_train_on_disjoint_examples(ps_strategy):
    n = 96
    x = np.stack([np.arange(n), np.random.default_rng(3).standard_normal(n)], 1).astype("float32")
    y = (x[:, 1] > 0).astype(np.int64)
    # A dataset_fn and arrays are sharded by example, so the shards stay disjoint over any number
    # of passes. A tf.data.Dataset is sharded by batch after its (re)shuffle: disjoint within a
    # pass, so 6 steps keep every worker inside its first pass (6 batches per shard).
    inputs = {"dataset_fn": ((make_dataset_fn(x, y, global_batch_size=8, training=True,
                                              repeat=True),), {}, 12),
              "dataset": ((tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=1)
                           .batch(8),), {}, 6),
              "arrays": ((x, y), {"batch_size": 8}, 12)}
    for name, (args, kwargs, steps) in inputs.items():
        with ps_strategy.scope():
            model = SeenBy(n)
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(*args, epochs=1, steps_per_epoch=steps, verbose=0, **kwargs)
        seen = model.seen.numpy()
        assert seen.sum() == steps * 8, name
        assert not np.any((seen[0] > 0) & (seen[1] > 0)), name  # no example on both workers


class _Orbax(keras.callbacks.OrbaxCheckpoint):
    """An ``OrbaxCheckpoint`` that needs no orbax package (it is refused before any save)."""

    def __init__(self):
        keras.callbacks.Callback.__init__(self)


def test_orbax_checkpoint_is_refused_by_name_before_anything_is_scheduled(ps_strategy):
    from kerasdist.errors import UnsupportedFeatureError

    model = _mlp(ps_strategy)
    with pytest.raises(UnsupportedFeatureError, match=(
            r"model.fit\(callbacks=...\): OrbaxCheckpoint is not accepted under strategy "
            r"'parameter_server'.*Use trainer.checkpoint .* or ModelCheckpoint")):
        model.fit(TRAIN_FN, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[_Orbax()])
    assert int(model.optimizer.iterations.numpy()) == 0
