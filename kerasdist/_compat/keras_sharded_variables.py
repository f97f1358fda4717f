"""Mend: Keras 3 variables cannot be sharded by a ``ParameterServerStrategy`` partitioner.

Upstream: no Keras issue found; reproduction (Keras 3.15 / TF 2.21, CPU): 2 workers and 2 ps,
``ParameterServerStrategy(resolver, variable_partitioner=FixedShardsPartitioner(2))``, two
``Dense`` layers compiled in its scope, one scheduled ``train_step``: ``AttributeError:
'ShardedVariable' object has no attribute 'handle'`` inside ``tape.gradient``. Cause: under a
partitioner the ``tf.Variable`` inside a Keras ``Variable`` becomes a ``ShardedVariable`` (one
resource variable per ps task, split along axis 0), but Keras's ``Variable`` declares itself a
resource variable, so ``GradientTape.gradient`` asks it for one ``handle``.

Mend (every patch is inert unless a Keras variable holds a ``ShardedVariable``):

* ``tape.gradient`` differentiates such a variable through its shards and returns one full-shape
  gradient (dense shards concatenated, or one ``IndexedSlices`` with each shard's indices shifted
  by its row offset); the optimizer's ``update_step`` runs once per shard, on its ps
  (:func:`_update_step_by_shard`).
* optimizer slots of a sharded variable are created without colocation, so the partitioner splits
  them as the variable, shard i on the ps task of the variable's shard i.
* the variable takes a subclass whose ``numpy()`` concatenates the shards and which checkpoints as
  TensorFlow checkpoints a ``ShardedVariable`` (one full-shape tensor in slices under the unsharded
  key: N ps restore onto M ps or one variable).
* ``keras.ops.take(variable, indices, axis=0)`` (``Embedding``) becomes ``tf.nn.embedding_lookup``
  on the shards: each ps gathers its own rows.

Probe: :func:`bug_present` reads Keras's ``Variable.handle`` (still ``self.value.handle``).
Source: ``tf.distribute.experimental.partitioners`` and ``ShardedVariable`` (TF API docs).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

from kerasdist._compat import _patch

NAME = "keras-sharded-variables"
ISSUE = "no upstream issue found; reproduction in this module's docstring"


def bug_present() -> bool:
    """Whether Keras's TensorFlow ``Variable.handle`` is still ``self.value.handle`` as is."""
    from keras.src.backend.tensorflow.core import Variable

    source = "".join(inspect.getsource(Variable.handle.fget).split())
    return "returnself.value.handle" in source and "Sharded" not in source


def _patched():
    """``(owner, attribute)`` of every function this mend replaces."""
    from keras.src.backend.tensorflow import numpy as tf_numpy
    from keras.src.backend.tensorflow.core import Variable
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from tensorflow.python.distribute.parameter_server_strategy import ParameterServerStrategyExtended
    from tensorflow.python.eager import backprop

    return ((backprop, "_handle_or_self"), (tf_numpy, "take"),
            (TFOptimizer, "add_variable_from_reference"),
            (ParameterServerStrategyExtended, "_update"), (Variable, "_initialize"),
            (TFOptimizer, "_distributed_tf_update_step"))


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions


def sharded_value(variable):
    """The ``ShardedVariable`` a Keras variable holds, or None (also for non-Keras objects)."""
    from keras.src.backend.common.variables import Variable
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    if isinstance(variable, Variable):
        value = getattr(variable, "_value", None)
        if isinstance(value, ShardedVariable):
            return value
    return None


def _combine(sharded, grads):
    """One gradient of ``sharded``'s full shape from its shards' gradients (None: unconnected)."""
    import tensorflow as tf

    if all(g is None for g in grads):
        return None
    shards = sharded.variables
    if all(isinstance(g, tf.IndexedSlices) for g in grads):
        offsets = [offset[0] for offset in sharded._var_offsets]
        indices = [tf.cast(g.indices, tf.int64) + offset
                   for g, offset in zip(grads, offsets, strict=True)]
        return tf.IndexedSlices(tf.concat([g.values for g in grads], axis=0),
                                tf.concat(indices, axis=0),
                                tf.constant(sharded.shape.as_list(), tf.int64))
    dense = [tf.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g)
             for g, v in zip(grads, shards, strict=True)]
    return tf.concat(dense, axis=0)


def _gradient_source_class():
    from tensorflow.python.framework import composite_tensor, composite_tensor_gradient

    class _Gradient(composite_tensor_gradient.CompositeTensorGradient):
        def get_gradient_components(self, value):
            return [shard.handle for shard in value.sharded.variables]

        def replace_gradient_components(self, value, component_grads):
            return _combine(value.sharded, list(component_grads))

    class ShardedGradientSource(composite_tensor.CompositeTensor):
        """What ``tape.gradient`` differentiates in place of a sharded Keras variable."""

        __composite_gradient__ = _Gradient()

        def __init__(self, sharded):
            self.sharded = sharded

        @property
        def _type_spec(self):  # never packed or unpacked: only the gradient protocol is used
            return self.sharded._type_spec

    return ShardedGradientSource


def _patches():
    makers = (_handle_or_self, _take, _add_variable_from_reference, _update, _initialize,
              _update_step_by_shard)
    return [_patch.Patch(owner, attribute, functools.partial(_wrapped, make))
            for make, (owner, attribute) in zip(makers, _patched(), strict=True)]


def _wrapped(make, original):
    return functools.wraps(original)(make(original))


def _handle_or_self(original):
    source_class = _gradient_source_class()

    def handle_or_self(x):
        sharded = sharded_value(x)
        return original(x) if sharded is None else source_class(sharded)

    return handle_or_self


def _take(original):
    import tensorflow as tf

    def take(x, indices, axis=None):
        sharded = sharded_value(x)
        if sharded is None or axis != 0 or isinstance(indices, (tf.SparseTensor, tf.RaggedTensor)):
            return original(x, indices, axis=axis)
        indices = tf.convert_to_tensor(indices)
        if not indices.dtype.is_integer:
            indices = tf.cast(indices, "int32")
        indices = tf.where(indices < 0, indices + tf.cast(sharded.shape[0], indices.dtype),
                           indices)
        return tf.nn.embedding_lookup(sharded, indices)  # each ps gathers its own rows

    return take


def _add_variable_from_reference(original):
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        sharded = sharded_value(reference_variable)
        if sharded is None:
            return original(self, reference_variable, name=name, initializer=initializer)
        # No colocation (TF cannot colocate with a container): the partitioner splits the slot
        # exactly as the variable (same shape and dtype); its shards go to the same ps tasks.
        with _same_ps_tasks(self._distribution_strategy, sharded):
            return BaseOptimizer.add_variable_from_reference(
                self, reference_variable, name=name, initializer=initializer)

    return add_variable_from_reference


def _update(original):
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    def update(self, var, fn, args, kwargs, group):
        if not isinstance(var, ShardedVariable):
            return original(self, var, fn, args, kwargs, group)
        # Each shard's update runs on its own ps: ShardedVariable's assign/scatter ops slice
        # the full-shape update and write every shard where it lives.
        with distribute_lib.UpdateContext(var.variables[0].device):
            result = fn(var, *self._select_single_value(args),
                        **self._select_single_value(kwargs))
            return result if group else tf.nest.map_structure(self._local_results, result)

    return update


def _update_step_by_shard(original):
    """Keras's optimizers update densely (``ops.subtract(gradient, m)`` densifies an
    ``IndexedSlices``). On a sharded variable that math would run on the worker, reading every
    shard of the variable and of its slots and writing them back each step; here each shard is
    updated on its own ps instead, with the optimizer's own ``update_step`` applied to the shard,
    its slots' shards and its slice of the gradient. Every built-in Keras optimizer's update is
    elementwise in the variable, so this equals the whole-variable update."""
    def step(self, distribution, grads_and_vars, learning_rate):
        from tensorflow.python.distribute.sharded_variable import ShardedVariable

        rest = []
        for grad, var in grads_and_vars:
            if isinstance(var, ShardedVariable) and grad is not None:
                _update_shards(self, grad, var, learning_rate)
            else:
                rest.append((grad, var))
        return original(self, distribution, rest, learning_rate)

    return step


def _update_shards(optimizer, grad, sharded, learning_rate):
    import tensorflow as tf

    index = optimizer._get_variable_index(sharded)
    count = len(optimizer._trainable_variables)
    # The optimizer's per-variable slot lists (``_momentums``, ``momentums``, ...): lists whose
    # entry for this variable is another variable sharded like it.
    slot_lists = {name: value for name, value in vars(optimizer).items()
                  if isinstance(value, list) and len(value) == count
                  and sharded_value(value[index]) is not None
                  and sharded_value(value[index]) is not sharded}
    keys = optimizer._trainable_variables_indices
    try:
        for number, (offset, shard) in enumerate(zip(sharded._var_offsets, sharded.variables,
                                                     strict=True)):
            for name, slot_list in slot_lists.items():
                # a plain copy set past Keras's attribute tracking: the tracked lists are never
                # modified (a replaced item would make them unsaveable)
                view = list(slot_list)
                view[index] = sharded_value(slot_list[index]).variables[number]
                object.__setattr__(optimizer, name, view)
            keys[optimizer._var_key(shard)] = index
            with tf.device(shard.device):
                optimizer.update_step(_gradient_slice(grad, offset[0], shard), shard,
                                      learning_rate)
            del keys[optimizer._var_key(shard)]
    finally:
        for name, slot_list in slot_lists.items():
            object.__setattr__(optimizer, name, slot_list)


def _gradient_slice(grad, start, shard):
    """The part of a full-shape gradient that falls on ``shard`` (rows ``start`` onwards)."""
    import tensorflow as tf

    rows = shard.shape[0]
    if isinstance(grad, tf.IndexedSlices):
        indices = tf.cast(grad.indices, tf.int64) - start
        mine = tf.logical_and(indices >= 0, indices < rows)
        return tf.IndexedSlices(tf.boolean_mask(grad.values, mine),
                                tf.boolean_mask(indices, mine),
                                tf.constant(shard.shape.as_list(), tf.int64))
    begin = [start] + [0] * (len(shard.shape) - 1)
    return tf.slice(tf.convert_to_tensor(grad), begin, shard.shape.as_list())


def _initialize(original):
    def initialize(self, value):
        original(self, value)
        if sharded_value(self) is not None and not getattr(self, _patch.MARK, False):
            self.__class__ = _sharded_class(type(self))

    return initialize


@functools.lru_cache(maxsize=None)
def _sharded_class(base):
    """The subclass of ``base`` (``keras.Variable``) a variable takes once it holds a
    ``ShardedVariable``."""
    import numpy as np
    import tensorflow as tf

    class ShardedKerasVariable(base):
        """A Keras TensorFlow ``Variable`` whose value is split over ps tasks (kerasdist mend)."""

        _kerasdist_mend = True

        def numpy(self):
            return tf.convert_to_tensor(self._value).numpy()

        def __array__(self, dtype=None, copy=None):
            return np.asarray(self.numpy(), dtype=dtype)  # always a fresh array

        # Defining this (and not ``_serialize_to_tensors``) on the class makes TensorFlow's
        # checkpointing use the ShardedVariable's own slice saveables.
        def _gather_saveables_for_checkpoint(self):
            return self._value._gather_saveables_for_checkpoint()

    return ShardedKerasVariable


@contextlib.contextmanager
def _same_ps_tasks(strategy, sharded):
    """Within the block, a ``ParameterServerStrategy`` places new variables' shards round-robin
    from the ps task that holds ``sharded``'s first shard, so a slot's shard i sits beside the
    variable's shard i (TF places shards of one variable on consecutive ps tasks). Restores the
    strategy's placement counter on exit; a no-op for other strategies."""
    import tensorflow as tf

    extended = getattr(strategy, "extended", None)
    count = getattr(extended, "_variable_count", None)
    device = tf.DeviceSpec.from_string(sharded.variables[0].device or "") if count is not None else None
    if device is None or device.job != "ps" or device.task is None:
        yield
        return
    extended._variable_count = device.task
    try:
        yield
    finally:
        extended._variable_count = count
