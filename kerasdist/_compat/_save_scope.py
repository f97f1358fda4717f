"""A thread-local flag: inside the chief-aware callbacks, ``Model.save`` runs Keras's own code
(:mod:`keras_chief_saves` reads it, :mod:`keras_chief_callbacks` sets it)."""

from __future__ import annotations

import threading

_LOCAL = threading.local()


def inside() -> bool:
    """True within a :class:`passthrough` block of this thread."""
    return getattr(_LOCAL, "inside", False)


class passthrough:
    """``with passthrough():`` saves run Keras's own code (used by the chief-aware callbacks)."""

    def __enter__(self):
        self.previous = inside()
        _LOCAL.inside = True

    def __exit__(self, *exc):
        _LOCAL.inside = self.previous
