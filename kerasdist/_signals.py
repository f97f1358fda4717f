"""Signals as exceptions, so ``finally`` blocks run (stop children, keep outputs whole).

* :func:`terminate_on_sigterm`: SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``).
* :func:`stop_requests`: SIGINT and SIGTERM are recorded and raised where a polling loop checks,
  never lost inside a weakref callback or ``__del__`` (where Python drops an exception).
* :func:`startup`: SIGINT and SIGTERM during start-up (before training) raise
  :class:`kerasdist.errors.Interrupted` (exit code 130 / 143), also while the main thread is
  blocked in native code, where Python runs no signal handler: TensorFlow iterating a
  ``tf.data`` pipeline (the counting pass over a ``Dataset.from_generator`` split), connecting to
  a cluster. A watcher thread learns of the signal through ``signal.set_wakeup_fd`` (written by
  the C-level handler at once); when the main thread has not left the start-up block
  :data:`STARTUP_GRACE_S` seconds later, the process is ended as :func:`kerasdist._exit.abandon`
  ends one (its failure reported by the CLI in one line) -- in a process kerasdist owns only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STARTUP_GRACE_S = 3.0
"""Seconds the main thread gets to leave a :func:`startup` block after SIGINT/SIGTERM before the
watcher ends the process (it is blocked in native code)."""

STARTUP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_PHASES: list[str] = []
"""What the main thread is doing in the :func:`startup` blocks it is in, innermost last."""


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

    handler.kerasdist_handler = True  # a startup() block may replace it (it ends the same way)

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


class StopRequests:
    """The SIGINT / SIGTERM received within a :func:`stop_requests` block, raised by :meth:`check`."""

    def __init__(self):
        self.signum: int | None = None

    def _record(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def check(self) -> None:
        """Raise for the first signal received, if any.

        Raises:
            Terminated: SIGTERM was received.
            KeyboardInterrupt: SIGINT was received.
        """
        if self.signum == signal.SIGTERM:
            raise Terminated()
        if self.signum is not None:
            raise KeyboardInterrupt()


@contextmanager
def stop_requests() -> Iterator[StopRequests]:
    """Within the block, SIGINT and SIGTERM only record themselves; the loop that owns the block
    calls :meth:`StopRequests.check` where stopping is safe. A handler that raises lands wherever
    the main thread is, and an exception raised inside a weakref callback or ``__del__`` (an
    SQLAlchemy session's clean-up) is printed as "Exception ignored" and dropped: the stop would
    be lost. The previous handlers are restored on exit; off the main thread nothing changes (and
    nothing is recorded)."""
    requests = StopRequests()
    previous: dict[int, object] = {}
    try:
        for signum in STARTUP_SIGNALS:
            previous[signum] = signal.signal(signum, requests._record)
    except ValueError:  # not in the main thread
        pass
    try:
        yield requests
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def startup(during: str, *, grace_s: float = STARTUP_GRACE_S) -> Iterator[None]:
    """Within the block (start-up: nothing to save yet), SIGINT and SIGTERM raise
    :class:`kerasdist.errors.Interrupted` in the main thread (exit code 130 / 143), and end the
    process ``grace_s`` seconds later when the main thread is blocked in native code (module
    docs). Nested blocks only name their phase for the message. Off the main thread the block
    changes nothing; an ignored signal, or one with a handler kerasdist did not install (Ray's,
    the user's), is left alone; handlers installed inside the block (a launcher's) take over while
    they last.

    Args:
        during: what the block does, for the message: "counting the examples of ...".
        grace_s: seconds the main thread gets to leave the block after a signal (default
            :data:`STARTUP_GRACE_S`).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _PHASES.append(during)
    try:
        if len(_PHASES) > 1:
            yield
        else:
            with _StartupGuard(grace_s):
                yield
    finally:
        _PHASES.pop()


def _replaceable(handler) -> bool:
    """Whether a :func:`startup` block takes over a signal whose handler is ``handler``: the
    default action, Python's Ctrl-C handler or kerasdist's own; never an ignored signal nor a
    handler someone else installed (Ray's, the user's)."""
    return (handler in (signal.SIG_DFL, signal.default_int_handler)
            or getattr(handler, "kerasdist_handler", False))


def _phase() -> str:
    return _PHASES[-1] if _PHASES else "starting"


class _StartupGuard:
    """The handlers and watcher thread of the outermost :func:`startup` block."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.left = threading.Event()
        self._previous: dict[int, object] = {}

    def _raise(self, signum, frame):
        from kerasdist.errors import Interrupted

        raise Interrupted(signum, _phase())

    def __enter__(self) -> _StartupGuard:
        for signum in STARTUP_SIGNALS:
            if _replaceable(signal.getsignal(signum)):
                self._previous[signum] = signal.signal(signum, self._raise)
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = None
        if self._previous_fd != -1:  # someone else's (an asyncio loop's): theirs, no watcher
            signal.set_wakeup_fd(self._previous_fd)
        elif self._previous:
            self._thread = threading.Thread(target=self._watch, name="kerasdist-startup-signals",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.left.set()
        if self._thread is not None:
            signal.set_wakeup_fd(self._previous_fd)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")  # wakes the watcher, which ends
        if self._thread is not None:
            self._thread.join(timeout=self.grace_s + 1)
        os.close(self._write)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._read)

    def _watch(self) -> None:
        while not self.left.is_set():
            try:
                received = os.read(self._read, 64)
            except OSError:
                return
            for signum in received:
                if signum in STARTUP_SIGNALS and signal.getsignal(signum) == self._raise:
                    self._end_if_blocked(signum)

    def _end_if_blocked(self, signum: int) -> None:
        """The main thread got ``grace_s`` seconds to raise :class:`Interrupted` and leave the
        block; still in it, it is blocked in native code: end the process (a process kerasdist
        owns), else say why the signal has no effect yet."""
        if self.left.wait(self.grace_s):
            return
        from kerasdist import _exit
        from kerasdist._log import get_logger
        from kerasdist.errors import Interrupted

        during = _phase()
        err = Interrupted(signum, f"{during} (blocked in native code; ended {self.grace_s:.0f} s "
                                  "after the signal)")
        if _exit.owns_process():
            _exit.abandon(err)
        else:
            get_logger("launch").warning(f"{err}: the main thread is blocked in native code, "
                                         "where Python handles no signal; it raises "
                                         "KeyboardInterrupt once it returns")
