"""Mend: under a multi-replica strategy, Keras 3 hands custom steps a loss divided by the replicas.

Upstream: no Keras issue found; reproduction (Keras 3.15 / TF 2.21, ``MirroredStrategy`` with 2
replicas or ``MultiWorkerMirroredStrategy`` with 2 workers): a ``train_step``/``test_step`` written
as Keras's "customizing fit" guide shows reports half the single-process loss, and a model whose
``compute_loss`` adds a term of its own ends with weights 1e-3 away from the single-process run.
Cause: Keras divides every loss by ``num_replicas_in_sync`` inside ``compute_loss``
(``scale_loss_for_distribution``) so that the all-reduce *sum* of the gradients is the mean; its
own ``train_step`` multiplies the value back for its loss tracker, users' steps do not, and a term
a user adds is not divided.

Mend: during the steps of Keras's own ``fit``/``evaluate`` (a user's ``strategy.run`` loop is
untouched) with 2+ replicas of a mirrored strategy, ``scale_loss_for_distribution`` and
``unscale_loss_for_distribution`` are the identity, so every loss a step sees is the per-replica
mean, as in one process, and the optimizer divides the all-reduced gradient sum by the replicas
instead (:mod:`kerasdist._compat.keras_replica_apply`). Probe: :func:`bug_present` reads
``scale_loss_for_distribution`` (it still divides by ``num_replicas_in_sync``).
"""

from __future__ import annotations

import functools
import inspect
import threading

from kerasdist._compat import _patch

NAME = "keras-replica-loss"
ISSUE = "no upstream issue found; reproduction in this module's docstring"
_STATE = threading.Lock(), {"depth": 0}
_FUNCTIONS = ("scale_loss_for_distribution", "unscale_loss_for_distribution")
_REDUCTIONS = ("sum", "sum_over_batch_size", "mean", "mean_with_sample_weight")


def _loss_module():
    from keras.src.losses import loss

    return loss


def _trainer_class():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer


def bug_present() -> bool:
    """Whether Keras still divides losses by ``num_replicas_in_sync`` (source check)."""
    function = getattr(_loss_module(), "scale_loss_for_distribution", None)
    if function is None:
        return False
    function = getattr(function, "__wrapped__", function)
    return "num_replicas_in_sync" in inspect.getsource(function)


def in_keras_step() -> bool:
    """True while a Keras ``fit``/``evaluate`` step function runs or is traced (any thread)."""
    return _STATE[1]["depth"] > 0


def replicated(strategy=None) -> bool:
    """A ``MirroredStrategy``/``MultiWorkerMirroredStrategy`` with 2 or more replicas in sync."""
    import tensorflow as tf

    if strategy is None:
        if not tf.distribute.has_strategy():
            return False
        strategy = tf.distribute.get_strategy()
    return (isinstance(strategy, (tf.distribute.MirroredStrategy,
                                  tf.distribute.MultiWorkerMirroredStrategy))
            and strategy.num_replicas_in_sync > 1)


def unscaled_losses() -> bool:
    """Whether losses of the step being traced are per-replica means (this mend in effect)."""
    return installed() and in_keras_step() and replicated()


def _identity_in_steps(original):
    unscale = original.__name__.startswith("unscale")

    @functools.wraps(original)
    def function(value):
        if unscaled_losses():
            return _reported(value) if unscale else value
        return original(value)

    return function


_REPLICA = threading.local()


def _notes():
    """This replica thread's notes on the step function being traced: ``[entry, ...]``, one per
    reduced loss (a dict for ``mean_with_sample_weight``, None for another reduction)."""
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    notes = getattr(_REPLICA, "notes", None)
    if notes is None or notes[0] is not graph:
        notes = _REPLICA.notes = (graph, [])
    return notes[1]


def _weighted_mean_note():
    """The step's note when it reduced exactly one loss, with ``mean_with_sample_weight``."""
    notes = _notes()
    return notes[0] if len(notes) == 1 and notes[0] is not None else None


def _global_sums(note):
    """``(weight sum, examples)`` of the global batch: one all-reduce a step, kept in the note."""
    import tensorflow as tf

    if note["global"] is None:
        context = tf.distribute.get_replica_context()
        note["global"] = tuple(context.all_reduce(tf.distribute.ReduceOp.SUM,
                                                  [note["weights"], note["examples"]]))
    return note["global"]


def take_weight_sums():
    """``(local, global)`` sample-weight sums (scalar tensors of the loss's dtype) when the step this
    replica thread traces reduced exactly one loss, with ``mean_with_sample_weight``; else None.
    Forgets the step's notes (:mod:`kerasdist._compat.keras_replica_apply` calls it once a step, to
    weigh this replica's gradient by the local sum and divide the all-reduced sum by the global
    one: the global batch's weighted mean, as in one process)."""
    note = _weighted_mean_note()
    sums = None if note is None else (note["weights"], _global_sums(note)[0])
    _REPLICA.notes = None
    return sums


def _reported(value):
    """The value Keras's loss trackers record (weighted by this replica's examples) for the step's
    one ``mean_with_sample_weight`` loss: this replica's share of the global weighted mean, so the
    tracker's all-replica mean is the strategy-free value. Other steps: ``value`` unchanged."""
    import tensorflow as tf

    note = _weighted_mean_note()
    if note is None or tf.distribute.get_replica_context() is None:
        return value
    weights, examples = _global_sums(note)
    factor = tf.math.divide_no_nan(note["weights"] * examples, weights * note["examples"])
    return value * tf.cast(factor, value.dtype)


def _exact_reduce(original):
    """Keras's ``reduce_values``; in a replicated Keras step, ``"sum"`` is scaled by the replicas.

    The optimizer divides the all-reduced gradient sum by the replicas (:mod:`keras_replica_apply`):
    right for the mean reductions, so a replica's ``"sum"`` loss becomes ``replicas * (its sum)``.
    ``mean_with_sample_weight`` returns the replica's weighted mean and notes its weight sum and
    examples, for :func:`_reported` and :func:`take_weight_sums` (exact for uneven weights).
    """

    @functools.wraps(original)
    def reduce_values(values, sample_weight=None, reduction="sum_over_batch_size"):
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        plain = (reduction is None or reduction == "none" or tuple(values.shape) in ((), (0,))
                 or reduction not in _REDUCTIONS)
        if plain or not unscaled_losses() or context is None:
            return original(values, sample_weight, reduction)
        if reduction == "mean_with_sample_weight" and sample_weight is not None:
            loss = original(values, sample_weight, reduction)  # the replica's weighted mean
            _notes().append({"weights": tf.reduce_sum(tf.cast(sample_weight, loss.dtype)),
                             "examples": tf.cast(tf.shape(values)[0], loss.dtype),
                             "global": None})
            return loss
        _notes().append(None)
        if reduction != "sum":
            return original(values, sample_weight, reduction)  # the replica's mean
        total = tf.reduce_sum(values)
        return total * tf.cast(context.num_replicas_in_sync, total.dtype)

    return reduce_values


def _counted(step_function):
    @functools.wraps(step_function)
    def run(*args, **kwargs):
        lock, state = _STATE
        with lock:
            state["depth"] += 1
        try:
            return step_function(*args, **kwargs)
        finally:
            with lock:
                state["depth"] -= 1

    run._kerasdist_counted = True
    return run


def _wrap_maker(attribute: str, original):
    @functools.wraps(original)
    def make(self, *args, **kwargs):
        returned = original(self, *args, **kwargs)  # Keras 3.15 sets the attribute, returns None
        function = getattr(self, attribute, None)
        if function is not None and not getattr(function, "_kerasdist_counted", False):
            setattr(self, attribute, _counted(function))
        return getattr(self, attribute) if returned is not None else returned

    return make


def _patches():
    module, trainer = _loss_module(), _trainer_class()
    return ([_patch.Patch(module, name, _identity_in_steps) for name in _FUNCTIONS]
            + [_patch.Patch(module, "reduce_values", _exact_reduce)]
            + [_patch.Patch(trainer, maker, functools.partial(_wrap_maker, attribute))
               for maker, attribute in (("make_train_function", "train_function"),
                                        ("make_test_function", "test_function"))])


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
