"""The supervisor's monitor loop decides on one reading of every task's exit code per poll
(issue 39): a member that exits 0 between two reads of one poll is a finished task, not a failed
one. Driven with fake tasks whose exit code changes on a scripted read, no process started."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerasdist._signals import StopRequests
from kerasdist.launch.plan import LaunchSpec, TaskState
from kerasdist.launch.supervisor import Supervisor

pytestmark = pytest.mark.timeout(30)


class _Task:
    """A task whose ``returncode()`` answers from a script: one value per call, the last one
    repeated (``[None, 0]``: running at the first read, exited 0 from the second on)."""

    def __init__(self, name: str, codes: list[int | None]):
        self.name, self._codes, self.reads = name, list(codes), 0
        self.tf_config = None

    def returncode(self):
        self.reads += 1
        return self._codes.pop(0) if len(self._codes) > 1 else self._codes[0]


class _Launcher:
    def __init__(self, tasks):
        self.tasks = tasks


def _supervisor(tmp_path: Path, members: list[_Task]) -> Supervisor:
    spec = LaunchSpec(plan=lambda workers, attempt: [], workers=len(members), log_dir=tmp_path)
    supervisor = Supervisor(spec)
    supervisor._launcher = _Launcher(members)
    supervisor._members = list(members)
    supervisor._states = {id(t): TaskState.RUNNING for t in members}
    return supervisor


def test_a_member_that_exits_0_between_two_reads_is_a_success(tmp_path):
    # worker:0 is still running at its first read and has exited 0 at every read after it: the
    # race of issue 39 (a finished multi-worker run reported "task worker:0 exited with code 0")
    chief = _Task("worker:0", [None, 0])
    other = _Task("worker:1", [0])
    supervisor = _supervisor(tmp_path, [chief, other])
    assert supervisor._watch(StopRequests()) is None
    assert supervisor._states[id(chief)] is TaskState.SUCCEEDED


def test_a_member_that_fails_is_still_reported(tmp_path):
    ok = _Task("worker:0", [None, 0])
    bad = _Task("worker:1", [None, None, 1])
    supervisor = _supervisor(tmp_path, [ok, bad])
    assert supervisor._watch(StopRequests()) is bad
    assert supervisor._states[id(bad)] is TaskState.FAILED
    assert supervisor._states[id(ok)] is TaskState.SUCCEEDED


def test_a_killed_member_is_named_before_one_that_exited_with_an_error(tmp_path):
    first = _Task("worker:0", [None, 1])
    killed = _Task("worker:1", [None, -9])
    supervisor = _supervisor(tmp_path, [first, killed])
    assert supervisor._watch(StopRequests()) is killed
