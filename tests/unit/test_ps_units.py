"""Parameter-server pieces that need no servers: partitioners, inputs, steps rules, stats, opt-in."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist import keras as dispatch
from kerasdist._compat import keras_ps_atomic_assign
from kerasdist.cluster.inprocess import start_inprocess_cluster
from kerasdist.config import ParameterServerStrategyConfig
from kerasdist.data import make_dataset_fn
from kerasdist.errors import ClusterError
from kerasdist.keras import ps_input as ps_data
from kerasdist.keras import ps_loop
from kerasdist.strategies import parameter_server


def _context(worker: int, workers: int = 2):
    return tf.distribute.InputContext(num_input_pipelines=workers,
                                      input_pipeline_id=tf.constant(worker, tf.int64),
                                      num_replicas_in_sync=1)


def _batches(ds) -> list[list[int]]:
    return [np.asarray(b[0] if isinstance(b, tuple) else b).ravel().tolist() for b in ds]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, shape, expected", [
    ("none", (1024, 1024), None),
    ("min_size", (1024, 1024), [3, 1]),  # 4 MiB, >= 256 KiB a shard: capped at 3 shards
    ("min_size", (16, 16), [1, 1]),  # 1 KiB: one shard
    ("fixed", (16, 16), [3, 1]),  # 3 shards whatever the size
    ("max_shards", (16, 16), [3, 1]),  # the earlier name of fixed
    ("max_shards", (2, 16), [2, 1]),  # never more shards than rows
])
def test_partitioner_choice(kind, shape, expected):
    config = ParameterServerStrategyConfig(variable_partitioning=kind)
    partitioner = parameter_server.make_partitioner(config, num_ps=3)
    if expected is None:
        assert partitioner is None
    else:
        assert list(partitioner(tf.TensorShape(shape), tf.float32)) == expected


@pytest.mark.timeout(60)
def test_strategy_without_ps_is_refused_before_connecting():
    spec = tf.train.ClusterSpec({"worker": ["localhost:1"], "chief": ["localhost:2"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief",
                                                                     task_id=0, rpc_layer="grpc")
    with pytest.raises(ClusterError, match=r"Received: ps=0, worker=1"):
        parameter_server.build(ParameterServerStrategyConfig(), cluster_resolver=resolver)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": 0}, "Received: num_workers=0"),
    ({"num_workers": 2, "inter_op_threads": 2}, r"num_workers \+ 1 = 3.*inter_op_threads=2"),
])
def test_inprocess_cluster_rejects_bad_counts(kwargs, message):
    with pytest.raises(ClusterError, match=message):
        start_inprocess_cluster(**kwargs)


@pytest.mark.timeout(60)
def test_steps_rules():
    fn_input = ps_data.to_ps_input(lambda ctx: None, num_workers=2)
    with pytest.raises(ValueError, match=r"`steps_per_epoch` is required.*"
                                         r"Received: steps_per_epoch=None"):
        ps_data.resolve_steps(None, fn_input, argument="steps_per_epoch", training=True)
    with pytest.raises(ValueError, match=r"positive int. Received: steps_per_epoch=0"):
        ps_data.resolve_steps(0, fn_input, argument="steps_per_epoch", training=True)
    assert ps_data.resolve_steps(None, fn_input, argument="steps", training=False) is None
    finite = ps_data.to_ps_input(tf.data.Dataset.range(10).batch(4), num_workers=2)
    assert ps_data.resolve_steps(None, finite, argument="steps_per_epoch", training=True) == 3
    endless = ps_data.to_ps_input(tf.data.Dataset.range(10).repeat(), num_workers=2)
    with pytest.raises(ValueError, match="infinite dataset"):
        ps_data.resolve_steps(None, endless, argument="steps_per_epoch", training=True)
    repeated_fn = ps_data.probe_infinite(
        ps_data.to_ps_input(lambda ctx: tf.data.Dataset.range(3).repeat(), num_workers=2),
        num_workers=2, replicas=1)
    with pytest.raises(ValueError, match="Received: validation_steps=None"):
        ps_data.resolve_steps(None, repeated_fn, argument="validation_steps", training=False)


@pytest.mark.timeout(60)
def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"Received: y=array"):
        ps_data.to_ps_input(tf.data.Dataset.range(4), np.zeros(4), num_workers=2)
    with pytest.raises(ValueError, match=r"Received: x=str"):
        ps_data.to_ps_input("data.csv", num_workers=2)


@pytest.mark.timeout(60)
def test_dataset_input_gives_workers_disjoint_batches():
    ps_input = ps_data.to_ps_input(tf.data.Dataset.range(10).batch(2), num_workers=2)
    first, second = (_batches(ps_input.dataset_fn(_context(i))) for i in (0, 1))
    assert first == [[0, 1], [4, 5], [8, 9]] and second == [[2, 3], [6, 7]]


@pytest.mark.timeout(60)
def test_array_input_gives_workers_disjoint_examples():
    x = np.arange(11, dtype=np.float32)
    ps_input = ps_data.to_ps_input(x, x, batch_size=2, shuffle=True, num_workers=2)
    assert ps_input.batches == 3 + 3  # 6 and 5 examples, batches of 2
    seen = [sorted(v for b in _batches(ps_input.dataset_fn(_context(i))) for v in b)
            for i in (0, 1)]
    assert seen == [list(range(0, 11, 2)), list(range(1, 11, 2))]


@pytest.mark.timeout(60)
def test_kerasdist_dataset_fn_shards_by_worker_tensor():
    x = np.arange(64, dtype=np.float32).reshape(64, 1)
    fn = make_dataset_fn(x, np.zeros(64, np.int64), global_batch_size=8, training=True)
    seen = [{v for b in _batches(fn(_context(i))) for v in b} for i in (0, 1)]
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 64


@pytest.mark.timeout(60)
def test_worker_index_seeded_shuffle_traces_with_global_seed_zero():
    x = np.arange(16, dtype=np.float32).reshape(16, 1)
    fn = make_dataset_fn(x, np.zeros(16, np.int64), global_batch_size=4, training=True)
    ps_input = ps_data.to_ps_input(fn, num_workers=2)
    traced = tf.function(lambda i: ps_data.worker_dataset(ps_input, _context(0), repeat=False)
                         .reduce(tf.constant(0.0), lambda a, b: a + tf.reduce_sum(b[0])))
    tf.random.set_seed(0)  # keras.utils.set_random_seed(0): seed + worker tensor used to fail
    try:
        assert float(traced(tf.constant(0))) == sum(range(0, 16, 2))
    finally:
        tf.random.set_seed(None)


@pytest.mark.timeout(60)
def test_stats_arithmetic():
    # Counter rows per worker: [steps, staleness_sum, examples, staleness_max].
    stats = ps_loop.PSStats.from_counters([[1, 0, 32, 0], [2, 3, 64, 2]])
    stats.completed_steps = 3
    stats.epoch_seconds, stats.epoch_examples = [5.0], [96]
    # A lost worker's call re-run: the counters hold one step more than the loop completed.
    other = ps_loop.PSStats.from_counters([[0, 0, 0, 0], [2, 2, 64, 1]])
    other.completed_steps = 1
    other.epoch_seconds, other.epoch_examples = [2.0], [32]
    stats.merge(other)
    logs = stats.logs(global_step=7)
    assert logs["ps_steps"] == 4 and logs["ps_steps_worker_0"] == 1
    assert logs["ps_steps_worker_1"] == 4 and logs["ps_staleness_max"] == 2
    assert logs["ps_staleness_mean"] == pytest.approx(5 / 5)  # over the counted steps
    assert "ps_examples_per_sec" not in logs  # one throughput rule: ThroughputMeter's
    summary = stats.summary(global_step=7)
    assert summary["steps_per_worker"] == [1, 4] and summary["examples"] == 160
    assert summary["steps"] == 4 and stats.counted_steps == 5
    assert summary["whole_epoch_examples_per_sec"] == pytest.approx(32 / 2.0)  # epochs 2..n
    assert ps_loop.PSStats.from_counters([[3, 0, 96, 0]]).steps == 3  # no loop figure: counters


@pytest.mark.timeout(60)
def test_atomic_updates_patch_only_the_given_variables():
    from keras.src.backend.tensorflow.core import Variable

    original = Variable.assign_add
    var, other = keras.Variable(1.0), keras.Variable(1.0)
    with keras_ps_atomic_assign.atomic_updates([var]) as patched:
        assert patched == [var] and "assign_add" in var.__dict__
        assert "assign_add" not in other.__dict__ and Variable.assign_add is original
        var.assign_add(2.0)
        var.assign_sub(0.5)
    assert "assign_add" not in var.__dict__ and "assign_add" not in Variable.__dict__
    assert float(var.numpy()) == pytest.approx(2.5)


@pytest.fixture
def restore_dispatch():
    was = dispatch.is_enabled()
    yield
    (dispatch.enable if was else dispatch.disable)()


@pytest.mark.timeout(120)
def test_enable_is_idempotent_and_leaves_other_strategies_to_keras(restore_dispatch):
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    dispatch.disable()
    keras_fit = TensorFlowTrainer.__dict__["fit"]
    dispatch.enable()
    dispatch.enable()
    wrapped = TensorFlowTrainer.__dict__["fit"]
    assert dispatch.is_enabled() and wrapped is not keras_fit
    from kerasdist._compat import _patch

    assert _patch.original(TensorFlowTrainer, "fit") is keras_fit
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and not hasattr(history, "ps_stats")
    dispatch.disable()
    assert TensorFlowTrainer.__dict__["fit"] is keras_fit and not dispatch.is_enabled()


@pytest.mark.timeout(60)
def test_ps_fit_refuses_a_model_of_another_strategy():
    from kerasdist.keras import ps_fit as ps

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"ParameterServerStrategy.scope\(\). "
                                         r"Received: distribute_strategy=_Default"):
        ps.fit(model, np.ones((4, 2)), np.ones((4, 1)))


def test_a_stopping_coordinator_waits_for_calls_in_flight_only_so_long(monkeypatch):
    """Issue 33 (1): ``join`` has no timeout, so a stop that joined a frozen worker's call
    waited for ever; :func:`ps_stop.joined` gives up once a stop is asked and its bound is
    past, and joins as before otherwise."""
    import time

    from kerasdist.keras import ps_stop

    class Coordinator:
        def __init__(self, done):
            self._done, self.joined = done, False

        def done(self):
            return self._done

        def join(self):
            self.joined = True

    stuck, finished = Coordinator(False), Coordinator(True)
    asked_at = time.monotonic() + 0.3
    start = time.monotonic()
    assert ps_stop.joined(stuck, lambda: time.monotonic() > asked_at, 0.3) is False
    assert not stuck.joined and 0.6 <= time.monotonic() - start < 2.5
    assert ps_stop.joined(finished, lambda: True, 0.3) is True and finished.joined


def test_a_stopping_coordinator_does_not_wait_for_logs_left_on_a_frozen_worker(monkeypatch):
    """Issue 33 (1): a call's logs stay on the worker that ran it until fetched, and the copy
    from a worker frozen after its call ended never comes (``RemoteValue.fetch`` has no
    timeout): :func:`ps_stop.fetched` gives up :data:`ps_stop.STOP_JOIN_S` after a stop was
    asked; without a stop it waits, and returns the logs or raises the call's error."""
    import threading
    import time

    from kerasdist.keras import ps_stop

    monkeypatch.setattr(ps_stop, "STOP_JOIN_S", 0.3)
    frozen = threading.Event()

    class Value:
        def __init__(self, fetch):
            self.fetch = fetch

    def never():
        frozen.wait()

    def fails():
        raise RuntimeError("the call failed")

    start = time.monotonic()
    assert ps_stop.fetched(Value(never), lambda: True) is ps_stop.STUCK
    assert 0.3 <= time.monotonic() - start < 2.5
    assert ps_stop.fetched(Value(lambda: {"loss": 1.0}), lambda: False) == {"loss": 1.0}
    with pytest.raises(RuntimeError, match="the call failed"):
        ps_stop.fetched(Value(fails), lambda: False)
    frozen.set()  # the left thread ends


def test_the_first_stop_request_runs_the_watch_hook_once():
    """The parameter-server loop keeps freed functions registered from the first SIGTERM/Ctrl-C
    on (``kerasdist._compat.tf_frozen_task``): the watch calls its hook once, in the handler."""
    import signal

    from kerasdist.keras.preemption import PreemptionWatch

    calls = []
    watch = PreemptionWatch(object(), on_request=lambda: calls.append("stop"))
    watch._on_signal(signal.SIGTERM, None)
    watch._on_signal(signal.SIGTERM, None)
    assert watch.requested and calls == ["stop"]
