"""The supervisor's rules after a failed attempt (:func:`kerasdist.launch.retry.next_attempt`)."""

from __future__ import annotations

import pytest

from kerasdist.errors import (
    BAD_INPUT,
    FATAL,
    PEER_LOST,
    PREEMPTED,
    ClusterError,
    DataError,
    TaskFailedError,
    TrainingError,
)
from kerasdist.launch.plan import Failure
from kerasdist.launch.retry import next_attempt


def _failure(cls=PEER_LOST, lost=("worker:2",), error="", message="it went") -> Failure:
    return Failure(report="task worker:2 was killed by SIGKILL\nlog tail", failure_class=cls,
                   message=message, error=error, lost=tuple(lost))


def _next(failure, *, workers=3, full=3, fewest=3, restarts_left=1, previous_lost=(), number=1):
    return next_attempt(failure, workers=workers, full=full, fewest=fewest,
                        restarts_left=restarts_left, previous_lost=set(previous_lost),
                        number=number, what="the run")


def test_bad_input_raises_the_tasks_own_error_class():
    with pytest.raises(DataError, match="task worker:2 was killed by SIGKILL: label 12"):
        _next(_failure(BAD_INPUT, error="DataError", message="label 12"))


def test_bad_input_of_an_unknown_class_is_a_cluster_error():
    with pytest.raises(ClusterError):
        _next(_failure(BAD_INPUT, error="NoSuchError"))


def test_a_fatal_failure_is_not_restarted_even_with_restarts_left():
    with pytest.raises(TrainingError, match="not restarted .a fatal error.*ValueError: it went"):
        _next(_failure(FATAL, error="ValueError"), restarts_left=5)


def test_a_lost_worker_restarts_at_full_size_while_restarts_are_left():
    nxt = _next(_failure(), workers=2, full=3, fewest=2, restarts_left=2)
    assert (nxt.workers, nxt.restart) == (3, True)
    assert "1 restart(s) left" in nxt.message


def test_a_worker_lost_again_right_after_its_restart_shrinks_without_spending_a_restart():
    nxt = _next(_failure(), fewest=2, restarts_left=2, previous_lost=("worker:2",))
    assert (nxt.workers, nxt.restart) == (2, False)
    assert "worker:2 was lost again after its restart: continuing on 2 workers" in nxt.message


def test_lost_again_without_min_workers_restarts_instead():
    nxt = _next(_failure(), fewest=3, restarts_left=1, previous_lost=("worker:2",))
    assert (nxt.workers, nxt.restart) == (3, True)


def test_no_restart_left_shrinks_down_to_min_workers():
    nxt = _next(_failure(), fewest=2, restarts_left=0)
    assert (nxt.workers, nxt.restart) == (2, False)
    assert nxt.message.startswith("no restart left for worker:2: continuing on 2 workers")


def test_no_restart_left_below_min_workers_fails_the_run():
    with pytest.raises(TaskFailedError, match="the run failed after 4 attempt"):
        _next(_failure(lost=("worker:1", "worker:2")), fewest=2, restarts_left=0, number=4)


def test_a_preemption_loses_no_worker_and_never_shrinks():
    with pytest.raises(TaskFailedError):
        _next(_failure(PREEMPTED, lost=()), fewest=1, restarts_left=0)
    assert _next(_failure(PREEMPTED, lost=()), fewest=1, restarts_left=1).workers == 3
