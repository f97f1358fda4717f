"""Mend for keras-team/keras#19246: ``steps_per_execution`` > 1 fails under 2+ replicas.

Upstream: https://github.com/keras-team/keras/issues/19246. Reproduction (Keras 3.15 / TF 2.21): a
Dense model compiled with ``steps_per_execution=4`` trains without a strategy, but under
``MirroredStrategy`` with 2 logical CPUs or ``MultiWorkerMirroredStrategy`` with 2 workers the
first step fails with ``InvalidArgumentError: You must feed a value for placeholder tensor
'while/body/.../while/cond/Placeholder'``. Cause: Keras's TF trainer runs the steps of one call in
a ``tf.while_loop`` and wraps each in a ``tf.cond`` (so a last, partial group stops when the
iterator runs dry), and a replicated step's ``merge_call`` does not work in a conditional branch.

Mend: with 2+ replicas in sync, the loop's own condition asks whether the iterator has a next
batch (``get_next_as_optional``) and the body always runs one step on it; only the fetch of the
following batch is conditional (none after the group's last step, so no batch is lost). The step
(``strategy.run`` + ``reduce_per_replica``), callbacks, epoch iterator and logs are Keras's own.
Probe: :func:`bug_present` reads ``TensorFlowTrainer._make_function`` (the step still in a
``tf.cond``).
"""

from __future__ import annotations

import functools
import inspect

from kerasdist._compat import _patch

NAME = "keras#19246"
ISSUE = "https://github.com/keras-team/keras/issues/19246"


def _trainer_module():
    from keras.src.backend.tensorflow import trainer

    return trainer


def bug_present() -> bool:
    """Whether Keras's multi-step loop still runs the step inside a ``tf.cond`` (source check)."""
    source = inspect.getsource(_patch.original(_trainer_module().TensorFlowTrainer, "_make_function"))
    return "def has_next" in source and "tf.cond(" in source


def _replicas(model) -> int:
    strategy = getattr(model, "distribute_strategy", None)
    return int(getattr(strategy, "num_replicas_in_sync", 1) or 1)


def _one_step(model, step_function):
    """``strategy.run(step)`` + Keras's log reduction, traced once (as Keras's own one step)."""
    import tensorflow as tf

    reduce_per_replica = _trainer_module().reduce_per_replica

    def one_step_on_data(data):
        outputs = model.distribute_strategy.run(step_function, args=(data,))
        return reduce_per_replica(outputs, model.distribute_strategy, reduction="auto")

    if model.run_eagerly:
        return one_step_on_data
    return tf.function(one_step_on_data, reduce_retracing=True, jit_compile=model.jit_compile)


def _multi_step(model, one_step_on_data):
    """Up to ``steps_per_execution`` steps in a loop whose condition, not a ``tf.cond``, stops it.

    Returns a ``tf.experimental.Optional`` of the last step's logs (empty: no batch was left).
    """
    import tensorflow as tf

    steps = model.steps_per_execution

    def multi_step_on_iterator(iterator):
        # The Optional's element spec is only known once the body is traced; the loop variable
        # is a variant tensor either way, so the spec is filled in during that trace.
        last = tf.experimental.Optional.empty(None)

        def cond(step, outputs, following):
            return tf.logical_and(tf.less(step, steps), following.has_value())

        def body(step, outputs, following):
            logs = tf.experimental.Optional.from_value(one_step_on_data(following.get_value()))
            last._element_spec = logs.element_spec
            after = tf.cond(tf.less(step + 1, steps), iterator.get_next_as_optional,
                            lambda: following)
            return step + 1, logs, after

        _, outputs, _ = tf.while_loop(
            cond, body, loop_vars=[tf.constant(0), last, iterator.get_next_as_optional()])
        outputs._element_spec = last.element_spec
        return outputs

    if model.run_eagerly:
        return multi_step_on_iterator
    return tf.function(multi_step_on_iterator, reduce_retracing=True)


def _mended(original):
    @functools.wraps(original)
    def _make_function(self, step_function):
        function = original(self, step_function)
        if self.steps_per_execution == 1 or _replicas(self) < 2:
            return function
        import tensorflow as tf

        one_step_on_data = _one_step(self, step_function)
        autoconvert = getattr(self, "_autoconvert_optionals", None)
        if autoconvert is not None:
            one_step_on_data = autoconvert(one_step_on_data)
        multi_step_on_iterator = _multi_step(self, one_step_on_data)

        def run(iterator):
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                outputs = multi_step_on_iterator(iterator)
                if not outputs.has_value():
                    raise StopIteration
                return outputs.get_value()
            return function(iterator)  # a list of batches (Keras's PyDataset path)

        return run

    return _make_function


def _patches():
    return [_patch.Patch(_trainer_module().TensorFlowTrainer, "_make_function", _mended)]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
