"""What the supervisor does after a failed attempt: the restart and shrink rules as one pure function
(:func:`next_attempt`; :class:`kerasdist.launch.supervisor.Supervisor` acts on the answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from kerasdist.errors import BAD_INPUT, TaskFailedError, TrainingError
from kerasdist.launch.plan import Failure, bad_input_error, tagged


@dataclass(frozen=True)
class NextAttempt:
    """The next attempt: its worker count, whether it spends a restart, and the log line."""

    workers: int
    restart: bool
    message: str


def next_attempt(failure: Failure, *, workers: int, full: int, fewest: int, restarts_left: int,
                 previous_lost: set[str], number: int, what: str) -> NextAttempt:
    """Decide the attempt after attempt ``number`` failed with ``failure``: a failure the same
    input repeats ends the run (``bad_input``: the task's own error class; ``fatal``:
    :class:`~kerasdist.errors.TrainingError`); a worker lost again right after its restart shrinks
    the run (``min_workers`` allowing, no restart spent); while restarts are left the cluster
    restarts at full size; with none left it shrinks, else the run fails.

    Args:
        failure: how the attempt failed (its class and the worker tasks it lost).
        workers: workers of the failed attempt; ``full``: the run's ``workers``; ``fewest``:
            its ``min_workers`` (``full`` when not elastic).
        restarts_left: restarts left before this decision (>= 0).
        previous_lost: worker tasks the attempt before the failed one lost (empty for the first).
        number: the failed attempt's number (1 for the first); ``what``: the run, for messages.

    Returns:
        The :class:`NextAttempt`.

    Raises:
        KerasdistError subclass named by the task (bad input, exit 2), TrainingError (a
        ``fatal`` failure), TaskFailedError (no restart left and no shrink allowed).
    """
    if failure.failure_class == BAD_INPUT:
        raise bad_input_error(failure.error)(f"{failure.first_line}: {failure.message}")
    if not failure.retryable:
        error = f"{failure.error}: " if failure.error else ""
        raise tagged(TrainingError(f"{failure.first_line}; not restarted (a "
                                   f"{failure.failure_class} error fails the same way again): "
                                   f"{error}{failure.message}"), failure)
    left = workers - len(failure.lost)  # a preemption loses no worker: never a shrink
    can_shrink = bool(failure.lost) and fewest <= left < workers
    again = set(failure.lost) & previous_lost
    if can_shrink and again:
        return NextAttempt(left, False, (
            f"{', '.join(sorted(again))} was lost again after its restart: continuing on {left} "
            f"workers (min_workers={fewest}), resuming from the last backup at its exact step "
            "with the same global batch"))
    if restarts_left > 0:
        return NextAttempt(full, True, (
            f"restarting the cluster ({restarts_left - 1} restart(s) left): {full} workers, "
            "resuming from the last backup"))
    if can_shrink:
        return NextAttempt(left, False, (
            f"no restart left for {', '.join(failure.lost) or 'the lost task'}: continuing on "
            f"{left} workers (min_workers={fewest}), resuming from the last backup at its exact "
            "step with the same global batch"))
    raise tagged(TaskFailedError(f"{what} failed after {number} attempt(s): {failure.report}"),
                 failure)


__all__ = ["NextAttempt", "next_attempt"]
