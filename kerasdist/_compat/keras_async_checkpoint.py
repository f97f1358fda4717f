"""Mend: TensorFlow's asynchronous checkpoint fails on its second save of a Keras 3 variable.

Upstream: no Keras issue found; written reproduction (Keras 3.15, TF 2.21, CPU, one process): a
compiled model, ``ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)`` and
``tf.train.CheckpointManager(ckpt, folder).save(options=tf.train.CheckpointOptions(
enable_async=True))`` twice: the second save raises "tf.function only supports singleton
tf.Variables created on the first call". TF's ``AsyncCheckpointHelper`` copies the values to
the host through a ``tf.function`` after the first save, and Keras's
``Variable._copy_trackable_to_cpu`` creates a new ``tf.Variable`` on every call.

Mend: :func:`cpu_copies` (a ``with`` block, restored after it): a Keras variable's host copy is
the host copy of the ``tf.Variable`` it wraps (TF's own ``_copy_trackable_to_cpu``, made once and
assigned at each save). Same checkpoint keys and values: a Keras variable saves its
``tf.Variable``'s value under ``VARIABLE_VALUE`` either way.

Probe: :func:`bug_present` reads Keras's ``Variable._copy_trackable_to_cpu`` source (it still
creates a ``tf.Variable``); ``tests/unit/test_compat.py`` fails when that changes.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

NAME = "keras-async-checkpoint"
ISSUE = "no upstream issue; reproduction in this module's docstring"


def _variable_class():
    from keras.src.backend.tensorflow.core import Variable

    return Variable


def bug_present() -> bool:
    """Whether Keras's ``Variable._copy_trackable_to_cpu`` still creates a ``tf.Variable`` on
    every call (reads its source; runs no TensorFlow op)."""
    source = "".join(inspect.getsource(_variable_class()._copy_trackable_to_cpu).split())
    return "object_map[self]=tf.Variable(" in source


def _copy_trackable_to_cpu(self, object_map):
    self.value._copy_trackable_to_cpu(object_map)
    object_map[self] = object_map[self.value]


@contextlib.contextmanager
def cpu_copies() -> Iterator[bool]:
    """Within the block, asynchronous checkpoint saves copy Keras variables to the host through
    the ``tf.Variable`` each wraps (no variable created after the first save).

    Yields:
        True when the patch is in effect; False when :func:`bug_present` is False (nothing
        patched). The original method is back on exit, also after an error.
    """
    if not bug_present():
        yield False
        return
    variable = _variable_class()
    original = variable.__dict__["_copy_trackable_to_cpu"]
    variable._copy_trackable_to_cpu = _copy_trackable_to_cpu
    try:
        yield True
    finally:
        variable._copy_trackable_to_cpu = original
