"""Patch point: the gradient all-reduce of a Keras 3 TensorFlow optimizer (one instance only).

Upstream: Keras 3 has no public way to change how an optimizer all-reduces gradients under a
``tf.distribute`` strategy (Keras 2 had ``gradient_aggregator``); its TensorFlow optimizer does it
in the private method ``_all_reduce_sum_gradients(grads_and_vars)``. kerasdist's 16-bit gradient
compression (:mod:`kerasdist.keras.compression`) replaces that method on **one optimizer instance**;
the class, and so saving and loading, are unchanged.

Probe: :func:`hook_present`; ``tests/unit/test_compat.py`` fails when a Keras release drops or
renames the method, and :func:`replace_all_reduce` raises instead of silently doing nothing.
"""

from __future__ import annotations

import types
from typing import Callable

NAME = "keras-allreduce-hook"
ISSUE = "no public Keras 3 API for gradient aggregation (Keras 2 had gradient_aggregator)"
HOOK = "_all_reduce_sum_gradients"


def hook_present() -> bool:
    """Whether the installed Keras TensorFlow optimizer still all-reduces in :data:`HOOK`."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return callable(getattr(TFOptimizer, HOOK, None))


def replace_all_reduce(optimizer, all_reduce: Callable) -> None:
    """Make ``optimizer`` (one instance) all-reduce with ``all_reduce(self, grads_and_vars)``.

    Raises:
        AttributeError: the optimizer has no :data:`HOOK` (a Keras release changed it).
    """
    if not callable(getattr(optimizer, HOOK, None)):
        raise AttributeError(f"Keras optimizer {type(optimizer).__name__} has no {HOOK}")
    setattr(optimizer, HOOK, types.MethodType(all_reduce, optimizer))
