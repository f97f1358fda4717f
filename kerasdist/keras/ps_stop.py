"""How a parameter-server coordinator stops when a worker does not answer.

TF's ``ClusterCoordinator.join`` and ``RemoteValue.fetch`` have no timeout: a frozen worker
(SIGSTOP, a swapped-out or stalled host) holds a call -- and its caller -- for ever. From a stop
request on (SIGTERM, Ctrl-C, ``model.stop_training``), :mod:`kerasdist.keras.ps_loop` waits for
the calls in flight at most :data:`STOP_JOIN_S` seconds through these helpers, then goes on
without them (the checkpoint that follows holds every step applied).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from kerasdist._log import get_logger

log = get_logger("training")


class Calls:
    """The scheduled calls not yet reported (``pending``: ``(last batch index, RemoteValue)``),
    reported in order to ``callbacks.on_train_batch_end`` with their logs (``last_logs``)."""

    def __init__(self, callbacks, asked):
        self.callbacks, self.asked = callbacks, asked
        self.pending: collections.deque = collections.deque()
        self.last_logs: dict = {}

    def complete(self) -> bool:
        """Report the oldest call; False when a stop was asked and the call (or the copy of
        its logs) did not end :data:`STOP_JOIN_S` later."""
        end, value = self.pending[0]
        logs = fetched(value, self.asked) if ready(value, self.asked) else STUCK
        if logs is STUCK:
            return False
        self.pending.popleft()
        self.last_logs = logs  # the last step's logs: a few scalars
        self.callbacks.on_train_batch_end(end, logs)
        return True

    def complete_all(self) -> bool:
        """:meth:`complete` every pending call (False as soon as one does not end)."""
        while self.pending:
            if not self.complete():
                return False
        return True


STOP_JOIN_S = 15.0  # seconds a stopping coordinator waits for the calls in flight (module docs)


def joined(coordinator, stopping, timeout_s: float | None = None) -> bool:
    """Join every scheduled call (True; their errors raised as ``join`` raises them), unless a
    stop is asked (``stopping()``) and they have not ended ``timeout_s`` (default
    :data:`STOP_JOIN_S`) later (False). Polls ``ClusterCoordinator.done`` (``join`` is not woken
    by a signal)."""
    timeout_s = STOP_JOIN_S if timeout_s is None else timeout_s
    deadline = None
    while not coordinator.done():
        if deadline is None and stopping():
            deadline = time.monotonic() + timeout_s
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    coordinator.join()
    return True


def left_in_flight(run: Any, asked) -> bool:  # run: ps_loop.PSRun (not imported: no cycle)
    """Join every scheduled call (False), unless a stop is asked (``asked()``, or
    ``model.stop_training``) and the calls in flight have not ended :data:`STOP_JOIN_S` later
    (a worker that does not answer: True)."""
    model = run.model
    return not joined(run.coordinator, lambda: model.stop_training or asked())


def go_on_without(run: Any, pending) -> None:
    """Leave the calls in flight of a worker that does not answer: sets ``run.stuck`` and
    ``model.stop_training`` (validation is skipped and the save does not wait for them); says so
    once."""
    if not run.stuck:
        log.warning(f"stopping: {len(pending)} scheduled call(s) still running {STOP_JOIN_S:.0f} "
                    "s after the stop was asked (a worker that does not answer); going on "
                    "without them (the checkpoint holds the steps applied)")
    run.stuck = run.model.stop_training = True


STUCK = object()  # fetched: the copy did not come


def fetched(value, asked):
    """``value.fetch()`` (a call's logs, copied from the worker that ran it), or ``STUCK`` when
    a stop is asked (``asked()``) and the copy has not come :data:`STOP_JOIN_S` seconds later (a
    worker frozen after its call ended holds it for ever: the copy runs in a daemon thread, left
    behind then)."""
    box: dict = {}

    def run():
        try:
            box["logs"] = value.fetch()
        except BaseException as err:  # raised in the loop's thread below
            box["error"] = err

    thread = threading.Thread(target=run, name="kerasdist-ps-fetch", daemon=True)
    thread.start()
    deadline = None
    while thread.is_alive():
        thread.join(0.5)
        if deadline is None and asked():
            deadline = time.monotonic() + STOP_JOIN_S
        if deadline is not None and time.monotonic() > deadline and thread.is_alive():
            return STUCK
    if "error" in box:
        raise box["error"]
    return box["logs"]


def stop_probe(callbacks):
    """``probe() -> bool``: whether a stop (SIGTERM, Ctrl-C) was asked, from the callback that
    turns it into ``model.stop_training`` (:func:`kerasdist.strategies.loops._stop_when_asked`);
    never, without one."""
    for callback in getattr(callbacks, "callbacks", None) or ():
        probe = getattr(callback, "stop_requested", None)
        if callable(probe):
            return probe
    return lambda: False


def ready(value, asked) -> bool:
    """Wait for a scheduled call's result; once ``asked()`` (a stop) give it :data:`STOP_JOIN_S`
    more seconds. False when it did not come (its worker does not answer); without the
    ``RemoteValue``'s internal event, True at once (``fetch`` then waits)."""
    from kerasdist._compat import internals

    event = internals.remote_value_event(value)
    if event is None:
        return True
    while not event.wait(0.5):
        if asked():
            return event.wait(STOP_JOIN_S)
    return True
