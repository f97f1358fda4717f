"""Keras's own ``optimizer(gradient_accumulation_steps=k)`` under every tf.distribute strategy
(keras#20582, mended by ``kerasdist._compat.keras_20582_grad_accum``; not kerasdist's recipe
accumulation, which tests/integration/test_accumulation.py covers).

Oracle: a small Dense model trained with ``SGD(momentum=0.9)`` or ``Adam``, ``k = 2``, for 5
micro-steps on fixed global batches of 8 (two updates, then one micro-step left in the
accumulators) ends with every variable -- weights, ``iteration``, learning rate, slots, gradient
accumulators -- bit-for-bit identical on every replica and allclose (rtol 1e-5, atol 1e-6: float32
sums in another order; measured max abs difference 6e-8) to a strategy-free run of the same
optimizer on the same global batches. Parameter server: refused before any variable changes, by
kerasdist's ``fit`` and in a user's own ``ClusterCoordinator`` loop (why: the mend's docstring).
The 2-worker MultiWorkerMirroredStrategy case: tests/multiprocess/test_keras_grad_accum_mwms.py.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

pytest_plugins = ["kerasdist.testing"]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kerasdist_enabled")]

K, BATCH, MICRO_STEPS = 2, 8, 5
RTOL, ATOL = 1e-5, 1e-6
STRATEGIES = {
    "one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "mirrored": lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
    "mirrored_one_device": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
    "multi_worker_one_worker": lambda: tf.distribute.MultiWorkerMirroredStrategy(),
}


def _optimizer(name: str):
    if name == "sgd":
        return keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=K)
    return keras.optimizers.Adam(0.05, gradient_accumulation_steps=K)


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * MICRO_STEPS, 4)).astype("float32")
    return x, np.tanh(x @ rng.normal(size=(4, 2))).astype("float32")


def _model(optimizer: str):
    """Same initial weights every call; compiled with MSE (call under the strategy's scope)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(2)])
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5 for w in model.weights])
    model.compile(_optimizer(optimizer), "mse")
    return model


def _per_replica(strategy, model) -> list[list[np.ndarray]]:
    """Every model and optimizer variable, in a fixed order, as its value on each replica."""
    variables = list(model.weights) + list(model.optimizer.variables)
    return [[np.asarray(t) for t in strategy.experimental_local_results(getattr(v, "value", v))]
            for v in variables]


def _fit(strategy, optimizer: str):
    with strategy.scope():
        model = _model(optimizer)
    model.fit(*_data(), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model


@functools.cache
def _reference(optimizer: str) -> tuple[np.ndarray, ...]:
    strategy = tf.distribute.get_strategy()
    return tuple(values[0] for values in _per_replica(strategy, _fit(strategy, optimizer)))


def _assert_matches_reference(strategy, model, optimizer: str):
    values = _per_replica(strategy, model)
    assert len(values[0]) == strategy.num_replicas_in_sync
    for replicas in values:  # identical on every replica
        assert all(np.array_equal(replicas[0], other) for other in replicas[1:])
    reference = _reference(optimizer)
    assert len(values) == len(reference)
    for replicas, expected in zip(values, reference, strict=True):
        np.testing.assert_allclose(replicas[0], expected, rtol=RTOL, atol=ATOL)


# First in this module: it runs in a process of its own (in-process cluster), and
# tests/conftest.py's isolation leaves pytest's setup stack inconsistent when such a test is the
# last of its folder after in-process tests ("previous item was not torn down properly").
@pytest.mark.timeout(180)
def test_parameter_server_refuses_before_any_variable_changes(ps_strategy):
    """kerasdist's PS ``fit`` and a user's own ``ClusterCoordinator`` loop are refused with an
    error naming the argument, the strategy and the value; nothing is trained."""
    from kerasdist.errors import UnsupportedFeatureError

    coordinator = tf.distribute.coordinator.ClusterCoordinator(ps_strategy)
    with ps_strategy.scope():
        model = _model("sgd")
        model.optimizer.build(model.trainable_variables)
    before = [np.asarray(v) for v in model.weights]
    with pytest.raises(UnsupportedFeatureError, match="gradient_accumulation_steps.*"
                                                      "ParameterServerStrategy"):
        model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)  # kerasdist's PS fit
    x, y = (tf.constant(a[:BATCH]) for a in _data())

    @tf.function
    def step():
        def replica_step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        ps_strategy.run(replica_step)

    with pytest.raises(ValueError, match=r"`gradient_accumulation_steps` is not supported under "
                                         r"ParameterServerStrategy: .* Received: "
                                         r"gradient_accumulation_steps=2"):
        coordinator.schedule(step)  # a user's own loop: refused when the step is traced
    coordinator.join()
    assert int(model.optimizer._iterations.numpy()) == 0
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(before, model.weights, strict=True))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("strategy_name", list(STRATEGIES))
def test_fit_equals_the_strategy_free_run(strategy_name, optimizer):
    strategy = STRATEGIES[strategy_name]()
    model = _fit(strategy, optimizer)
    _assert_matches_reference(strategy, model, optimizer)
    assert int(model.optimizer._iterations.numpy()) == MICRO_STEPS  # every micro-step counted
    assert int(model.optimizer.iterations.numpy()) == MICRO_STEPS // K  # Keras: the updates
    accumulators = [np.asarray(a) for a in model.optimizer._accumulated_gradients]
    assert any(np.abs(a).max() > 0 for a in accumulators)  # the 5th micro-step waits in them


def _custom_loop(strategy, optimizer: str):
    """A user's ``strategy.run`` loop (TF's custom-training guide), not Keras ``fit``."""
    with strategy.scope():
        model = _model(optimizer)
        # Built before the loop, as fit does: Keras 3.15 cannot build it lazily inside a
        # mirrored tf.function step with 2 replicas, with or without accumulation.
        model.optimizer.build(model.trainable_variables)
    x, y = _data()
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))

    @tf.function
    def step(batch):
        def replica_step(features, targets):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(features) - targets), axis=-1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(replica_step, args=batch)

    for batch in dataset:
        step(batch)
    return model


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy_name", ["mirrored", "mirrored_one_device"])
def test_custom_strategy_run_loop_equals_the_strategy_free_run(strategy_name):
    strategy = STRATEGIES[strategy_name]()
    _assert_matches_reference(strategy, _custom_loop(strategy, "sgd"), "sgd")


@pytest.mark.timeout(60)
def test_only_accumulating_optimizers_under_mirrored_strategies_are_mended():
    from kerasdist._compat import keras_20582_grad_accum as mend

    assert mend.installed()

    def mended(strategy, **options) -> bool:
        with strategy.scope():
            optimizer = keras.optimizers.SGD(**options)
        answers = strategy.run(lambda: mend._replica_context_to_mend(optimizer) is not None)
        return all(strategy.experimental_local_results(answers))

    assert mended(STRATEGIES["mirrored"](), gradient_accumulation_steps=K)
    assert not mended(STRATEGIES["mirrored"]())  # Keras's own apply
    assert not mended(STRATEGIES["one_device"](), gradient_accumulation_steps=K)
    assert not mended(tf.distribute.get_strategy(), gradient_accumulation_steps=K)
