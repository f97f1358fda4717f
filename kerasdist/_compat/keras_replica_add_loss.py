"""Mend: under MirroredStrategy the replicas overwrite each other's ``add_loss`` values.

Upstream: no Keras issue found; reproduction (Keras 3.15 / TF 2.21): a layer calling
``self.add_loss(0.5 * mean(x**2))`` followed by ``BatchNormalization(synchronized=True)``, trained
under ``MirroredStrategy`` with 2 replicas, ends 0.022 (max abs) from the strategy-free weights.
Cause: ``Layer.add_loss`` appends to ``self._losses``, one list per layer object, which the replica
threads share and each replica's outermost call clears. The threads switch at a cross-replica
sync: the first replica adds its value and waits in the synchronized layer's all-reduce, the
second clears the list and adds its own, and the first then reads the second's value in
``compute_loss``. Any sync between an ``add_loss`` and the loss does it.

Mend: inside a MirroredStrategy replica thread (outside Keras's stateless scope), the values a
layer adds are moved at once to a per-thread store (a ``threading.local``), read back by
``_get_own_losses`` and cleared by ``_clear_losses`` with Keras's list; Keras's ``add_loss`` still
validates and records them. Probe: :func:`bug_present` reads ``Layer.add_loss`` (it still appends
to ``self._losses``). Proof: ``tests/integration/test_replica_add_loss.py``.
"""

from __future__ import annotations

import functools
import inspect
import threading

from kerasdist._compat import _patch

NAME = "keras-replica-add-loss"
ISSUE = "no upstream issue found; reproduction in this module's docstring"
_LOCAL = threading.local()
_METHODS = ("add_loss", "_get_own_losses", "_clear_losses")


def _layer_class():
    from keras.src.layers.layer import Layer

    return Layer


def _diverted() -> bool:
    """True in a MirroredStrategy replica thread, outside Keras's stateless scope."""
    if type(threading.current_thread()).__name__ != "_MirroredReplicaThread":
        return False
    from keras.src.backend import in_stateless_scope

    return not in_stateless_scope()


def _own(layer) -> list:
    """This thread's ``add_loss`` values of ``layer``."""
    store = getattr(_LOCAL, "losses", None)
    if store is None:
        store = _LOCAL.losses = {}
    return store.setdefault(id(layer), [])


def _mended(name, original):
    if name == "add_loss":
        def method(self, loss):
            if not _diverted():
                return original(self, loss)
            before = len(self._losses)
            result = original(self, loss)  # validates; appends to the shared list
            _own(self).extend(self._losses[before:])
            del self._losses[before:]
            return result
    elif name == "_get_own_losses":
        def method(self):
            losses = original(self)
            return losses + _own(self)[:] if _diverted() else losses
    else:
        def method(self):
            original(self)  # clears Keras's list, then each sublayer (through this method)
            if _diverted():
                _own(self).clear()

    method = functools.wraps(original)(method)
    return method


def bug_present() -> bool:
    """Whether ``Layer.add_loss`` still appends to the per-object ``self._losses`` list."""
    return "self._losses.extend" in inspect.getsource(_layer_class().add_loss)


def _patches():
    layer = _layer_class()
    return [_patch.Patch(layer, name, functools.partial(_mended, name)) for name in _METHODS]


installed, install, uninstall = _patch.functions(__name__)  # see _patch.functions
