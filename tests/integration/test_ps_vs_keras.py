"""ParameterServerStrategy ``fit``/``evaluate``/``predict`` give what strategy-free Keras gives.

Each test compares a model under ``ParameterServerStrategy`` (in-process cluster: 2 ps, 2 workers,
``kerasdist.enable()``) with a strategy-free copy holding the same weights, on the same data.
Tolerances: predictions ``rtol=1e-6, atol=1e-6`` (the same float32 ops on the same batches);
metrics and losses ``rtol=1e-5, atol=1e-6`` (sums accumulated in another order across workers).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

pytest_plugins = ["kerasdist.testing"]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kerasdist_enabled")]

N, FEATURES = 203, 4  # 203: the last batch of 16 is partial
RNG = np.random.default_rng(7)
X = RNG.standard_normal((N, FEATURES)).astype(np.float32)
X2 = RNG.standard_normal((N, 3)).astype(np.float32)
Y = ((X[:, 0] + 0.7 * RNG.standard_normal(N)) > 0).astype(np.float32)[:, None]
SW = RNG.uniform(0.0, 2.0, N).astype(np.float32)
METRIC_TOL = {"rtol": 1e-5, "atol": 1e-6}
PRED_TOL = {"rtol": 1e-6, "atol": 1e-6}


def _twin(build, ps_strategy, compile_kwargs=None):
    """(model under ps_strategy, strategy-free model with the same weights), both compiled with
    ``compile_kwargs()`` when given."""
    with ps_strategy.scope():
        model = build()
        if compile_kwargs:
            model.compile(**compile_kwargs())
    reference = build()
    if compile_kwargs:
        reference.compile(**compile_kwargs())
    reference.set_weights(model.get_weights())
    return model, reference


class MeanBatchMax(keras.metrics.Metric):
    """A custom metric that depends on the batching: the mean over batches of max(y_pred)."""

    def __init__(self, name="mean_batch_max", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable((), initializer="zeros", dtype="float32", name="total")
        self.batches = self.add_variable((), initializer="zeros", dtype="float32", name="batches")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.max(y_pred))
        self.batches.assign_add(1.0)

    def result(self):
        return self.total / self.batches


def _classifier():
    inputs = keras.Input((FEATURES,))
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))


def _every_metric():
    return {"optimizer": "sgd", "loss": "binary_crossentropy", "weighted_metrics": [],
            "metrics": ["accuracy", keras.metrics.AUC(name="auc"),
                        keras.metrics.Precision(name="precision"),
                        keras.metrics.Recall(name="recall"),
                        keras.metrics.PrecisionAtRecall(0.5, name="precision_at_recall"),
                        keras.metrics.F1Score(average="macro", threshold=0.5, name="f1"),
                        MeanBatchMax()]}


@pytest.mark.timeout(180)
def test_evaluate_equals_keras_for_every_metric(ps_strategy):
    model, reference = _twin(_classifier, ps_strategy, compile_kwargs=_every_metric)
    dataset = tf.data.Dataset.from_tensor_slices((X, Y, SW)).batch(16)
    cases = {"arrays": ((X, Y), {"batch_size": 16}),
             "arrays, sample_weight": ((X, Y), {"batch_size": 16, "sample_weight": SW}),
             "arrays, first 5 batches": ((X, Y), {"batch_size": 16, "steps": 5}),
             "dataset, sample_weight": ((dataset,), {}),
             "dataset, first 3 batches": ((dataset,), {"steps": 3})}
    for name, (args, kwargs) in cases.items():
        got = model.evaluate(*args, verbose=0, return_dict=True, **kwargs)
        want = reference.evaluate(*args, verbose=0, return_dict=True, **kwargs)
        assert set(got) == set(want), name
        for key in want:
            np.testing.assert_allclose(got[key], want[key], **METRIC_TOL, err_msg=f"{name}: {key}")
    listed = model.evaluate(X, Y, batch_size=16, verbose=0)
    np.testing.assert_allclose(listed, reference.evaluate(X, Y, batch_size=16, verbose=0),
                               **METRIC_TOL)  # the list in Keras's metrics_names order


class GuideModel(keras.Model):
    """Keras's "customizing what happens in fit" guide: custom train/test steps returning
    ``{m.name: m.result() for m in self.metrics}``, plus an overridden ``compute_loss``."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.5 * keras.ops.mean(keras.ops.square(y_pred))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}  # compile_metrics: a nested dict


class CustomEvalModel(keras.Model):
    """A custom ``test_step`` whose logs are not the model's metrics: Keras returns them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prediction_mean = keras.metrics.Mean(name="prediction_mean")

    def test_step(self, data):
        x, _ = data
        self.prediction_mean.update_state(self(x, training=False))
        return {"mean_of_predictions": self.prediction_mean.result()}


def _functional(cls):
    def build():
        inputs = keras.Input((FEATURES,))
        return cls(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))
    return build


def _no_learning():
    return {"optimizer": keras.optimizers.SGD(0.0), "loss": "binary_crossentropy",
            "metrics": ["accuracy"]}


@pytest.mark.timeout(180)
def test_custom_steps_and_compute_loss_report_as_keras(ps_strategy):
    # Every step sees the whole data set (one batch of N, one per worker), learning rate 0: the
    # epoch's loss and accuracy are the same numbers whichever worker ran which step.
    full = tf.data.Dataset.from_tensor_slices((X, Y)).batch(N).repeat(2)
    model, reference = _twin(_functional(GuideModel), ps_strategy, compile_kwargs=_no_learning)
    got = model.fit(full, epochs=2, verbose=1).history
    want = reference.fit(full, epochs=2, verbose=0, shuffle=False).history
    assert {"loss", "accuracy"} <= set(got)  # flattened as Keras flattens compile_metrics
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(got[key], want[key], **METRIC_TOL, err_msg=key)
    evaluated = model.evaluate(X, Y, batch_size=16, verbose=0, return_dict=True)
    expected = reference.evaluate(X, Y, batch_size=16, verbose=0, return_dict=True)
    assert set(evaluated) == set(expected)
    for key in expected:  # Keras's test_step and the overridden compute_loss
        np.testing.assert_allclose(evaluated[key], expected[key], **METRIC_TOL, err_msg=key)

    model, reference = _twin(_functional(CustomEvalModel), ps_strategy, compile_kwargs=lambda: {
        "optimizer": "sgd", "loss": "binary_crossentropy"})
    for kwargs in ({"return_dict": True}, {}):
        got = model.evaluate(X, Y, batch_size=16, verbose=0, **kwargs)
        want = reference.evaluate(X, Y, batch_size=16, verbose=0, **kwargs)
        if kwargs:
            assert set(got) == set(want) == {"mean_of_predictions"}
            got, want = got["mean_of_predictions"], want["mean_of_predictions"]
        np.testing.assert_allclose(got, want, **METRIC_TOL)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x)


def _two_in_two_out():
    a, b = keras.Input((FEATURES,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Dense(5, activation="relu")(keras.layers.Concatenate()([a, b]))
    return keras.Model([a, b], {"scores": keras.layers.Dense(2, name="scores")(hidden),
                                "value": keras.layers.Dense(1, name="value")(hidden)})


class _Batches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rows = 0

    def on_predict_batch_end(self, batch, logs=None):
        self.rows += len(logs["outputs"])


def _assert_same(got, want):
    keras.tree.assert_same_structure(got, want)
    for g, w in zip(keras.tree.flatten(got), keras.tree.flatten(want), strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, **PRED_TOL)


@pytest.mark.timeout(180)
def test_predict_equals_keras_in_input_order(ps_strategy):
    model, reference = _twin(_two_in_two_out, ps_strategy)  # not compiled: predict needs none
    for x in ([X, X2], (X, X2), {"a": X, "b": X2}):
        _assert_same(model.predict(x, batch_size=16, verbose=0),
                     reference.predict(x, batch_size=16, verbose=0))
    _assert_same(model.predict([X, X2], batch_size=16, steps=5, verbose=0),
                 reference.predict([X, X2], batch_size=16, steps=5, verbose=0))  # first 80 rows

    with ps_strategy.scope():
        model = Subclassed()  # unbuilt: built on the coordinator, as Keras builds on a batch
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(10)
    counter = _Batches()
    got = model.predict(dataset, verbose=0, callbacks=[counter])
    reference = Subclassed()
    reference(X[:1])  # built by a call, as Keras builds it
    reference.set_weights(model.get_weights())
    _assert_same(got, reference.predict(dataset, verbose=0))
    assert counter.rows == N

    def dataset_fn(context):  # worker w's pipeline: rows w, w+2, ... in batches of 8
        return tf.data.Dataset.from_tensor_slices(X).shard(
            context.num_input_pipelines, context.input_pipeline_id).batch(8)

    by_worker = np.concatenate([X[0::2], X[1::2]])  # documented order: worker, then batch
    _assert_same(model.predict(dataset_fn, verbose=0), reference.predict(by_worker, verbose=0))


def _probability():
    inputs = keras.Input((1,))
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid",
                                                  kernel_initializer="zeros")(inputs))


@pytest.mark.timeout(180)
def test_class_weight_weighs_examples_on_the_workers(ps_strategy):
    # (a) Every x is 1 and each worker's one batch holds 16 of each class, so unweighted gradients
    # cancel exactly (the prediction stays 0.5); weighting class 0 by 0 leaves only class 1's
    # (absent from the dict: weight 1.0, Keras's array mapping).
    x, y = np.ones((64, 1), np.float32), np.tile([0, 0, 1, 1], 16).astype(np.float32)
    for class_weight, low, high in (({0: 0.0}, 0.9, 1.0), (None, 0.5, 0.5)):
        with ps_strategy.scope():
            model = _probability()
            model.compile(keras.optimizers.SGD(4.0), "binary_crossentropy")
        model.fit(x, y, batch_size=32, epochs=4, class_weight=class_weight, verbose=0)
        prediction = float(model.predict(x[:1], verbose=0)[0, 0])
        assert low - 1e-6 <= prediction <= high + 1e-6, (class_weight, prediction)

    # (b) The reported loss is Keras's weighted loss (a tf.data.Dataset: weights mapped on the
    # workers' pipelines); learning rate 0 and a whole-data batch make it independent of timing.
    full = tf.data.Dataset.from_tensor_slices((X, Y)).batch(N).repeat(2)
    weights = {0: 0.25, 1: 3.0}
    model, reference = _twin(_classifier, ps_strategy, compile_kwargs=_no_learning)
    got = model.fit(full, epochs=1, class_weight=weights, verbose=0).history["loss"]
    want = reference.fit(full, epochs=1, class_weight=weights, verbose=0,
                         shuffle=False).history["loss"]
    unweighted = reference.fit(full, epochs=1, verbose=0, shuffle=False).history["loss"]
    np.testing.assert_allclose(got, want, **METRIC_TOL)
    assert abs(got[0] - unweighted[0]) > 0.05

    # (c) Refused up front as Keras refuses, naming `class_weight` and what was received.
    refusals = [((x, y), {"class_weight": {"zero": 1.0}}, r"class_weight.*Received"),
                ((x, y), {"class_weight": {0: 1.0}, "sample_weight": np.ones(64)},
                 r"class_weight.*sample_weight"),
                ((x, (y, y)), {"class_weight": {0: 1.0}}, r"class_weight.*single output")]
    with ps_strategy.scope():
        model = _probability()
        model.compile("sgd", "binary_crossentropy")
    for args, kwargs, message in refusals:
        with pytest.raises(ValueError, match=message):
            model.fit(*args, epochs=1, verbose=0, **kwargs)
