"""SIGTERM as an exception, so ``finally`` blocks run (stop children, keep outputs whole)."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM (:func:`terminate_on_sigterm`);
    a ``KeyboardInterrupt``, so the CLI exits 130 as for Ctrl-C."""

    def __init__(self, message: str = "SIGTERM received"):
        super().__init__(message)


@contextmanager
def terminate_on_sigterm(*, unless_handled: bool = False) -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread; the previous
    handler is restored on exit. Off the main thread, or with ``unless_handled`` when a Python
    handler is already installed (a launcher's, a training loop's), SIGTERM is left alone."""

    def handler(signum, frame):
        raise Terminated()

    if unless_handled and callable(signal.getsignal(signal.SIGTERM)):
        yield
        return
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not in the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
