"""Synchronous parameter-server training (:mod:`kerasdist.keras.ps_sync`) on the session's
in-process cluster (2 workers, 2 ps).

With K = N the trained weights must equal a strategy-free ``fit`` on the same global batches from
the same initial weights, within the conformance matrix's tolerance (``Case.tolerance``: rtol
2e-4, atol 2e-5; :func:`kerasdist.conformance.oracle.compare_lists`); with K < N the run goes on
and counts what it dropped.
"""

from __future__ import annotations

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist.conformance.oracle import compare_lists
from kerasdist.errors import RecipeError, UnsupportedFeatureError
from kerasdist.keras import ps_sync
from kerasdist.models.seed import mnist_cnn

pytest_plugins = ["kerasdist.testing"]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ps_strategy", "kerasdist_enabled")]

TOLERANCE = (2e-4, 2e-5)  # kerasdist.conformance.case.Case.tolerance (float32)
RNG = np.random.default_rng(5)
partitioners = tf.distribute.experimental.partitioners


def _strategy(cluster, partitioner=None):
    return tf.distribute.ParameterServerStrategy(cluster.cluster_resolver,
                                                 variable_partitioner=partitioner)


def _same_as_strategy_free(strategy, build, x, y, *, batch, epochs, steps=None, k=None):
    """Fit ``build()`` synchronously (K = ``k``) and strategy-free from the same weights on the
    same global batches; return (problems, sync history, sync model)."""
    with strategy.scope():
        model = build()
    reference = build()
    reference.set_weights(model.get_weights())
    ps_sync.sync_replicas(model, k)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    history = model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=0)
    reference.fit(data.repeat() if steps else data, epochs=epochs, steps_per_epoch=steps,
                  verbose=0)
    problems = compare_lists("weights", model.get_weights(), reference.get_weights(), TOLERANCE)
    problems += compare_lists("optimizer", [np.asarray(v) for v in model.optimizer.variables],
                              [np.asarray(v) for v in reference.optimizer.variables], TOLERANCE)
    return problems, history, model


def _embedding_adam():
    model = keras.Sequential([keras.Input((4,), dtype="int64"), keras.layers.Embedding(VOCAB, 8),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.02),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# No id repeats within a global batch of 25: Keras 3's Adam squares each row of an IndexedSlices
# gradient apart, so a repeated id's second moment differs from that of its summed (dense)
# gradient, which the accumulators hold (kerasdist.keras.ps_sync's limits).
VOCAB = 100
IDS = np.concatenate([RNG.permutation(VOCAB).reshape(25, 4) for _ in range(5)]).astype(np.int64)
PARITY = (IDS[:, 0] % 2).astype(np.int64)


@pytest.mark.timeout(120)
def test_the_accumulator_kernels_work_across_coordinator_worker_and_ps(ps_strategy):
    """The raw ops the mode stands on: gradients pushed by scheduled calls on the workers into an
    accumulator on a ps; the coordinator's take waits for K, returns their mean and advances the
    accumulator's step, after which a gradient of the old step is dropped."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(ps_strategy)
    with tf.device("/job:ps/task:1"):
        handle = tf.raw_ops.ResourceConditionalAccumulator(
            dtype=tf.float32, shape=[3], shared_name="kerasdist_test_raw_ops")

    @tf.function
    def push(step, value):
        tf.raw_ops.ResourceAccumulatorApplyGradient(handle=handle, local_step=step,
                                                    gradient=tf.fill([3], value))

    def take(k):
        return tf.raw_ops.ResourceAccumulatorTakeGradient(handle=handle, num_required=k,
                                                          dtype=tf.float32).numpy()

    count = lambda: int(tf.raw_ops.ResourceAccumulatorNumAccumulated(handle=handle))  # noqa: E731
    for value in (1.0, 2.0):
        coordinator.schedule(push, args=(tf.constant(0, tf.int64), tf.constant(value)))
    coordinator.join()
    assert count() == 2
    np.testing.assert_array_equal(take(2), [1.5] * 3)
    coordinator.schedule(push, args=(tf.constant(0, tf.int64), tf.constant(9.0)))
    coordinator.join()
    assert count() == 0  # step 0 was taken: its late gradient is dropped
    taken: list = []
    waiting = threading.Thread(target=lambda: taken.append(take(1)))
    waiting.start()
    time.sleep(0.5)
    assert waiting.is_alive()  # the take waits for a gradient of the current step
    coordinator.schedule(push, args=(tf.constant(1, tf.int64), tf.constant(4.0)))
    coordinator.join()
    waiting.join(30)
    np.testing.assert_array_equal(taken[0], [4.0] * 3)
    tf.raw_ops.ResourceAccumulatorSetGlobalStep(handle=handle, new_global_step=tf.constant(7, tf.int64))
    coordinator.schedule(push, args=(tf.constant(6, tf.int64), tf.constant(1.0)))
    coordinator.join()
    assert count() == 0


@pytest.mark.extended  # intermittent: see docs/parameter-server-sync.md, "What it guarantees"
@pytest.mark.timeout(300)
def test_k_equals_n_gives_the_strategy_free_weights_of_the_seed_cnn(inprocess_ps_cluster):
    # dropout 0: a dropout mask is drawn per replica (as under multi_worker), not comparable
    def build():
        model = mnist_cnn(dropout=0.0, input_shape=(12, 12, 1))
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    x = RNG.random((48, 12, 12, 1)).astype(np.float32)
    y = RNG.integers(0, 10, 48).astype(np.int64)
    problems, history, model = _same_as_strategy_free(_strategy(inprocess_ps_cluster), build, x,
                                                      y, batch=16, epochs=2)
    assert problems == []
    assert history.ps_stats["global_step"] == 6
    # evaluation sends each batch with its call (no per-worker shard): every batch once, 7 of 5
    # examples and 2 of 1 over 2 workers included, the strategy-free loss
    reference = build()
    reference.set_weights(model.get_weights())
    held_out = RNG.random((37, 12, 12, 1)).astype(np.float32), RNG.integers(0, 10, 37)
    np.testing.assert_allclose(model.evaluate(*held_out, batch_size=5, verbose=0),
                               reference.evaluate(*held_out, batch_size=5, verbose=0), rtol=1e-5)
    assert history.ps_stats["sync"] == {"replicas_to_aggregate": 2, "num_workers": 2,
                                        "gradients": 12, "aggregated": 12, "dropped": 0}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partitioner", [None, partitioners.FixedShardsPartitioner(2)],
                         ids=["whole", "sharded"])
def test_k_equals_n_gives_the_strategy_free_weights_of_embedding_adam(inprocess_ps_cluster,
                                                                       partitioner):
    # 125 examples in batches of 25 over 2 workers: slices of 13 and 12 examples
    problems, history, model = _same_as_strategy_free(
        _strategy(inprocess_ps_cluster, partitioner), _embedding_adam, IDS, PARITY, batch=25,
        epochs=3)
    assert problems == []
    assert history.history["ps_sync_dropped"] == [0.0] * 3
    shards = getattr(model.layers[0].embeddings.value, "variables", [None])
    assert len(shards) == (2 if partitioner else 1)


@pytest.mark.timeout(300)
def test_k_below_n_goes_on_and_counts_the_dropped_gradients(inprocess_ps_cluster):
    with _strategy(inprocess_ps_cluster).scope():
        model = _embedding_adam()
    ps_sync.sync_replicas(model, 1)
    history = model.fit(IDS, PARITY, batch_size=25, epochs=4, verbose=0)
    stats = history.ps_stats
    sync = stats["sync"]
    assert stats["global_step"] == 20 and int(model.optimizer.iterations.numpy()) == 20
    assert sync["replicas_to_aggregate"] == 1 and sync["num_workers"] == 2
    assert sync["gradients"] == 40 and 20 <= sync["aggregated"] <= 40
    assert sync["dropped"] == sync["gradients"] - sync["aggregated"]
    assert sum(history.history["ps_sync_dropped"]) == sync["dropped"]
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.timeout(120)
def test_what_the_mode_cannot_honour_is_refused_naming_it(ps_strategy):
    with ps_strategy.scope():
        model = _embedding_adam()
    for bad in (0, 3, 1.5):
        with pytest.raises(RecipeError, match=rf"replicas_to_aggregate.*Received: "
                                              rf"replicas_to_aggregate={bad}"):
            ps_sync.sync_replicas(model, bad)
    ps_sync.sync_replicas(model)
    assert ps_sync.replicas_to_aggregate(model) == 2
    with pytest.raises(UnsupportedFeatureError, match="class_weight"):
        model.fit(IDS, PARITY, batch_size=20, class_weight={0: 1.0, 1: 2.0}, verbose=0)
    with ps_strategy.scope():
        model.compile(keras.optimizers.Adam(), "mse", steps_per_execution=2)
    with pytest.raises(UnsupportedFeatureError, match="steps_per_execution=2"):
        model.fit(IDS, PARITY, batch_size=20, verbose=0)

    class NoApply(keras.Model):
        def train_step(self, data):
            return {"loss": 0.0}

    with ps_strategy.scope():
        inputs = keras.Input((4,), dtype="int64")
        custom = NoApply(inputs, keras.layers.Dense(2)(keras.ops.cast(inputs, "float32")))
        custom.compile(keras.optimizers.SGD(), "mse")
    ps_sync.sync_replicas(custom)
    with pytest.raises(UnsupportedFeatureError, match="exactly once.*Received: 0 applies"):
        custom.fit(IDS, PARITY, batch_size=20, verbose=0)


@pytest.mark.timeout(120)
def test_the_start_line_says_synchronous_with_k_of_n(inprocess_ps_cluster):
    from kerasdist.config.strategy_configs import ParameterServerStrategyConfig
    from kerasdist.strategies import registry

    strategy = registry.get("parameter_server")
    for sync, mode in (({"replicas_to_aggregate": 1}, "synchronous, 1 of 2 gradients per step"),
                       ({}, "synchronous, 2 of 2 gradients per step"), (None, "asynchronous")):
        config = ParameterServerStrategyConfig(sync=sync)
        built = strategy.build(config, cluster_resolver=inprocess_ps_cluster.cluster_resolver)
        assert strategy.describe(built) == f"2 worker(s) and 2 ps ({mode})"
