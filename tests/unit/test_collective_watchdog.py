"""The multi-worker collective watchdog (kerasdist.keras.collective_watchdog): one thread, one
deadline; it aborts the process's collectives once when a guarded wait outlasts its limit, and
never for a guarded wait that ended in time."""

from __future__ import annotations

import threading
import time

import pytest

from kerasdist.keras.collective_watchdog import CollectiveWatchdog, step_guard


class Aborts:
    def __init__(self):
        self.messages = []
        self.called = threading.Event()

    def __call__(self, message):
        self.messages.append(message)
        self.called.set()


def test_a_wait_longer_than_its_limit_aborts_once_naming_what_was_guarded():
    aborts = Aborts()
    watchdog = CollectiveWatchdog(0.2, abort=aborts)
    started = time.monotonic()
    watchdog.arm("training step 7 of the epoch")
    assert aborts.called.wait(5)
    assert time.monotonic() - started >= 0.2
    time.sleep(0.3)  # the deadline is spent: no second abort
    watchdog.close()
    assert len(aborts.messages) == 1
    assert watchdog.fired == "training step 7 of the epoch"
    assert "Collective has timed out" in aborts.messages[0]  # classified as a lost peer
    assert "training step 7" in aborts.messages[0] and "strategy.timeout_s" in aborts.messages[0]


def test_waits_that_end_in_time_never_abort():
    aborts = Aborts()
    watchdog = CollectiveWatchdog(0.3, abort=aborts)
    for step in range(20):  # 20 steps of 0.05 s: 1 s in all, each far within 0.3 s
        with watchdog.guard(f"training step {step}"):
            time.sleep(0.05)
    time.sleep(0.5)
    watchdog.close()
    assert aborts.messages == [] and watchdog.fired is None


def test_a_guard_gives_its_own_limit_and_clears_when_the_guarded_code_raises():
    aborts = Aborts()
    watchdog = CollectiveWatchdog(0.1, abort=aborts)
    with watchdog.guard("the barrier before epoch 2", limit_s=0.6):
        time.sleep(0.3)  # over timeout_s, within the barrier's own limit
    with pytest.raises(RuntimeError), watchdog.guard("training step 1"):
        raise RuntimeError("step failed")
    time.sleep(0.3)
    watchdog.close()
    assert aborts.messages == []


def test_one_thread_for_every_guard():
    watchdog = CollectiveWatchdog(5, abort=Aborts())
    before = threading.active_count()
    for step in range(200):
        with watchdog.guard(f"training step {step}"):
            pass
    assert threading.active_count() - before <= 1
    watchdog.close()
    assert threading.active_count() <= before


def test_step_guard_arms_each_step_and_gives_the_first_of_an_epoch_the_boundary_limit():
    armed = []

    class Recording(CollectiveWatchdog):
        def arm(self, what, limit_s=None):
            armed.append((what, limit_s))

        def disarm(self):
            armed.append(("disarm", None))

    guard = step_guard(Recording(10, abort=Aborts()), first_step_factor=3)
    guard.on_train_batch_begin(0)
    guard.on_train_batch_end(0)
    guard.on_train_batch_begin(1)
    guard.on_train_batch_end(1)
    guard.on_test_batch_begin(0)
    guard.on_test_batch_end(0)
    assert armed == [("training step 1 of the epoch", 30), ("disarm", None),
                     ("training step 2 of the epoch", 10), ("disarm", None),
                     ("validation step 1", 30), ("disarm", None)]


def test_a_new_run_closes_the_watchdog_an_earlier_run_left_armed(monkeypatch):
    """The registered strategy object is shared by the runs of a process: building it again
    closes the earlier run's watchdog, so a deadline a failed step left armed never aborts the
    collectives of the next run."""
    from kerasdist.strategies import multi_worker

    fired = []
    monkeypatch.setattr(multi_worker, "build", lambda config, cluster_resolver=None: object())
    strategy = multi_worker.MultiWorkerStrategy()
    config = multi_worker.MultiWorkerStrategyConfig(timeout_s=0.2)
    strategy.build(config)
    first = strategy.watchdog
    first._abort = fired.append
    first.arm("training step 3 of the epoch")  # the step raised: never disarmed
    strategy.build(config)
    assert strategy.watchdog is not first
    time.sleep(0.5)
    assert fired == []
    strategy.watchdog.close()
