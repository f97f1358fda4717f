"""Mend: TensorFlow's asynchronous checkpoint fails on its second save of a Keras 3 variable.

Upstream: no Keras issue found. Reproduction (Keras 3.15, TF 2.21, CPU, one process): a compiled
model's ``tf.train.CheckpointManager(tf.train.Checkpoint(model=model), folder).save(options=
tf.train.CheckpointOptions(enable_async=True))`` twice: the second raises "tf.function only
supports singleton tf.Variables created on the first call" (TF copies the values to the host in a
``tf.function`` after the first save; Keras's ``Variable._copy_trackable_to_cpu`` creates a
``tf.Variable`` on every call).

Mend: :func:`cpu_copies` (a ``with`` block): a Keras variable's host copy is that of the
``tf.Variable`` it wraps (TF's own, made once). Same checkpoint keys and values. Probe:
:func:`bug_present` reads the Keras method's source; ``tests/unit/test_compat.py`` fails when it
changes.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

from kerasdist._compat import _patch

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
    with _patch.swapped(_variable_class(), "_copy_trackable_to_cpu",
                        lambda _: _copy_trackable_to_cpu):
        yield True
