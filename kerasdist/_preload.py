"""Import TensorFlow and Keras in a background thread, to shorten the time to the first step.

A process that will need them but has other work first (parsing and validating its recipe,
starting servers) overlaps their seconds-long import with that work instead of following it.
The process's own ``import tensorflow`` later waits for this one (Python's import lock); an
error here is left for that import to raise where it is handled.
"""

from __future__ import annotations

import contextlib
import threading


def tensorflow_in_background() -> None:
    """Start importing ``keras`` and ``tensorflow`` in a daemon thread; returns at once."""

    def load() -> None:
        with contextlib.suppress(Exception):  # the caller's own import raises it where handled
            import keras  # noqa: F401
            import tensorflow  # noqa: F401

    threading.Thread(target=load, name="kerasdist-import", daemon=True).start()


__all__ = ["tensorflow_in_background"]
