"""The one module through which kerasdist's code outside the mends reaches Keras and TensorFlow
internals: every ``keras.src`` / ``tensorflow.python`` import and every read of a private attribute
of a Keras or TF object that ``kerasdist/keras/`` and ``kerasdist/training/`` need (the mends in
this package import their own targets). Upgrading Keras or TF means checking this file and the
mends; ruff's banned-API rule (TID251, ``pyproject.toml``) refuses such an import anywhere else.

Each name says what it is and why no public API does the job. Importing this module imports
Keras (and TensorFlow): import it inside functions, as ``kerasdist/keras/`` does.
"""

from __future__ import annotations

import contextlib

# Builds a model by tracing its call on symbolic inputs (Keras's own build path): no public API.
from keras.src.backend import compute_output_spec

# Keras's predict: joins and converts the batches' outputs (ragged kept): no public function.
from keras.src.backend.tensorflow.trainer import (
    convert_to_np_if_not_ragged,  # outputs to NumPy, RaggedTensors left as they are
    potentially_ragged_concat,  # batch outputs concatenated, ragged ones too
)

# class_weight -> per-example weights for arrays; Keras applies it only in its data adapters.
from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

# The same class_weight mapping over a tf.data pipeline (Keras's dataset adapter), ditto.
from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn

# Logs to Python floats, as fit/evaluate return them: private in Keras.
from keras.src.utils.python_utils import pythonify_logs

__all__ = [
    "backing_variable", "backup_initial_epoch", "class_weight_to_sample_weights",
    "cluster_resolver", "compute_output_spec", "configure_coordination_heartbeat",
    "convert_to_np_if_not_ragged", "direct_merge_calls",
    "flatten_layers", "flatten_metrics_in_order", "learning_rate_setting",
    "make_class_weight_map_fn", "op_determinism", "potentially_ragged_concat", "pythonify_logs",
    "remote_value_event", "symbolic_build",
]


def op_determinism(enabled: bool | None = None) -> bool:
    """Whether TF's op determinism (``tf.config.experimental.enable_op_determinism``) is on;
    with ``enabled``, first turn it on or off (TF's public API can only turn it on). Returns the
    state before the call."""
    from tensorflow.python.framework import config

    was = config.is_op_determinism_enabled()
    if enabled is True:
        config.enable_op_determinism()
    elif enabled is False:
        config.disable_op_determinism()
    return was


def flatten_layers(model) -> list:
    """Every layer of ``model``, nested ones included, itself first (``Layer._flatten_layers``;
    ``model.layers`` lists only the direct children)."""
    return list(model._flatten_layers())


def symbolic_build(model, data_batch) -> None:
    """Create the model's, its metrics' and its optimizer's variables from a batch spec, as Keras's
    ``fit`` does before its first step (``Trainer._symbolic_build``; no public API builds the
    compiled metrics and the optimizer together)."""
    model._symbolic_build(data_batch=data_batch)


def flatten_metrics_in_order(model, logs: dict) -> list:
    """``evaluate(return_dict=False)``'s list: ``logs`` in Keras's ``metrics_names`` order
    (``Trainer._flatten_metrics_in_order``)."""
    return model._flatten_metrics_in_order(logs)


def backup_initial_epoch(model):
    """The epoch ``BackupAndRestore`` restored the model to (``model._initial_epoch``, set by its
    ``on_train_begin``), or None."""
    return getattr(model, "_initial_epoch", None)


def cluster_resolver(strategy):
    """The strategy's cluster resolver: ``ParameterServerStrategy``'s public
    ``cluster_resolver`` is None, its ``_cluster_resolver`` holds it."""
    return strategy.cluster_resolver or getattr(strategy, "_cluster_resolver", None)


def remote_value_event(value):
    """The ``threading.Event`` a scheduled call's ``RemoteValue`` sets when its result came
    (``RemoteValueImpl._status_available_event``), or None: TF's public ``fetch`` has no
    timeout."""
    return getattr(value, "_status_available_event", None)


def backing_variable(variable):
    """The TensorFlow variable (or sharded variable) behind a Keras variable (``Variable._value``;
    the public ``value`` may be a cast copy under autocast), else ``variable`` itself."""
    value = getattr(variable, "_value", None)
    return variable if value is None else value


def learning_rate_setting(optimizer):
    """The learning rate as given to the optimizer: a ``LearningRateSchedule`` or the variable
    (``BaseOptimizer._learning_rate``; the public ``learning_rate`` evaluates a schedule)."""
    return optimizer._learning_rate


def configure_coordination_heartbeat(cluster_spec, *, heartbeat_timeout_s: float) -> bool:
    """Configure TensorFlow's coordination service (the chief/worker heartbeats of
    ``MultiWorkerMirroredStrategy``) as the strategy itself would
    (``CollectiveAllReduceExtended._initialize_multi_worker``, which leaves a configured service
    alone), but with a heartbeat timeout of ``heartbeat_timeout_s`` seconds instead of TF's fixed
    10 s; call it before the strategy is built. No public API sets the timeout.

    Returns:
        False, configuring nothing, when the service is already configured in this process or
        the cluster has no chief/worker job.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    ctx = context.context()
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    if ctx.coordination_service is not None or not jobs:
        return False
    ctx.configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(heartbeat_timeout_s * 1000))
    return True


def abort_collective_ops(message: str) -> None:
    """Make every collective op of this process fail now with ``DeadlineExceededError(message)``,
    the ongoing ones included (``context.abort_collective_ops``, what
    ``MultiWorkerMirroredStrategy``'s own check-health thread calls on a lost peer; no public API
    does it). Later collectives of this process fail too: only a new process can run them again.
    """
    from tensorflow.python.eager import context
    from tensorflow.python.framework import errors

    context.context().abort_collective_ops(errors.DEADLINE_EXCEEDED, message)


@contextlib.contextmanager
def direct_merge_calls():
    """While open, TF's ``maybe_merge_call`` (``tf.__internal__.distribute.interim``, which Keras's
    TF optimizer calls assuming a replica context) calls its function directly in cross-replica
    context: for Keras's unmodified optimizer code run inside a mend's own ``merge_call``, while
    the replicas wait (no replica sees the swap; undone on exit)."""
    import tensorflow as tf

    interim = tf.__internal__.distribute.interim
    original = interim.maybe_merge_call

    def maybe_merge_call(fn, strategy, *args, **kwargs):
        if tf.distribute.in_cross_replica_context():
            return fn(strategy, *args, **kwargs)
        return original(fn, strategy, *args, **kwargs)

    interim.maybe_merge_call = maybe_merge_call
    try:
        yield
    finally:
        interim.maybe_merge_call = original
