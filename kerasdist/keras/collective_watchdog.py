"""One watchdog per multi-worker process bounds how long a worker waits in the cluster's
collectives (``strategy.timeout_s``), in place of TensorFlow's per-collective timeout, which
starts a thread per collective op that sleeps the whole timeout even when the op finished at once
(``BaseCollectiveExecutor::CompleteParamsAsync``/``ExecuteAsync`` call
``SchedNonBlockingClosureAfter``: a new detached thread per call on Linux, two per collective), so
a worker's thread count grows with ``timeout_s`` (figures in ``docs/hosts.md``).

Here one thread holds one deadline, armed when a training or validation step starts
(:func:`step_guard`) or around a barrier (:meth:`CollectiveWatchdog.guard`) and cleared when it
ends. When it passes, the watchdog aborts this process's collective ops (as TensorFlow's own
check-health thread does on a lost peer): the waiting collective raises ``DeadlineExceededError``,
:func:`kerasdist.strategies.multi_worker.peer_error` names the lost task, and the worker exits 1
(only a new process can run collectives again). A dead, frozen or partitioned peer is also caught
by TensorFlow's coordination-service heartbeats
(:func:`kerasdist.strategies.multi_worker.configure_heartbeat`); the watchdog bounds a peer that is
alive but does not come to the collective.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

from kerasdist._log import get_logger

log = get_logger("training")


def _abort(message: str) -> None:
    from kerasdist._compat import internals

    internals.abort_collective_ops(message)


class CollectiveWatchdog:
    """A deadline for the collective this worker waits in, checked by one daemon thread.

    Args:
        timeout_s: seconds a training or validation step may take (``strategy.timeout_s``); a
            guard may give its own limit.
        abort: ``abort(message)`` called once when a deadline passes (default: abort this
            process's collective ops with ``DeadlineExceededError(message)``).

    Attributes:
        fired: what was guarded when the deadline passed (e.g. ``'training step 7'``), else None.
    """

    def __init__(self, timeout_s: float, *, abort: Callable[[str], None] = _abort):
        self.timeout_s = float(timeout_s)
        self._abort = abort
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        self._limit = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.fired: str | None = None

    def arm(self, what: str, limit_s: float | None = None) -> None:
        """Start a deadline ``limit_s`` seconds (default ``timeout_s``) from now for ``what``."""
        limit = self.timeout_s if limit_s is None else float(limit_s)
        with self._cond:
            if self._closed:
                return
            self._deadline, self._what, self._limit = time.monotonic() + limit, what, limit
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="kerasdist-collective-watchdog")
                self._thread.start()
            self._cond.notify()

    def disarm(self) -> None:
        """Clear the deadline (the guarded work ended)."""
        with self._cond:
            self._deadline = None

    @contextlib.contextmanager
    def guard(self, what: str, limit_s: float | None = None):
        """``arm`` on entry, ``disarm`` on exit (also when the guarded code raises)."""
        self.arm(what, limit_s)
        try:
            yield self
        finally:
            self.disarm()

    def close(self) -> None:
        """Stop the thread (a deadline set then never fires)."""
        with self._cond:
            self._closed, self._deadline = True, None
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._deadline is None:
                        self._cond.wait()
                        continue
                    left = self._deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._closed:
                    return
                self._deadline, self.fired, limit = None, self._what, self._limit
            message = (f"Collective has timed out: no progress for {limit:.0f} s in "
                       f"{self.fired} (kerasdist collective watchdog, strategy.timeout_s); a "
                       "peer task is lost or hung.")
            log.error(message)
            self._abort(message)


def step_guard(watchdog: CollectiveWatchdog, *, first_step_factor: float = 1.0):
    """A Keras callback that guards every training and validation step with ``watchdog``.

    The first step of each epoch and of each evaluation gets ``first_step_factor`` x
    ``watchdog.timeout_s`` (it may trace the step function, and it waits for the slowest
    worker's epoch boundary); every other step gets ``watchdog.timeout_s``. Place it after every
    other callback: it arms last at a step's start and clears last at its end, so the end-of-step
    callbacks that all-reduce (the preemption vote) are guarded too.

    Returns:
        A ``keras.callbacks.Callback``.
    """
    import keras

    def limit(batch):
        return watchdog.timeout_s * (first_step_factor if batch == 0 else 1.0)

    class CollectiveStepGuard(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            watchdog.arm(f"training step {batch + 1} of the epoch", limit(batch))

        def on_test_batch_begin(self, batch, logs=None):
            watchdog.arm(f"validation step {batch + 1}", limit(batch))

        def disarm(self, *args, **kwargs):  # a step, a training or an evaluation ended
            watchdog.disarm()

        on_train_batch_end = on_test_batch_end = on_train_end = on_test_end = disarm

    return CollectiveStepGuard()
