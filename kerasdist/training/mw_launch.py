"""Supervise a local multi-worker cluster: start the workers, watch them, restart after a failure.

One *attempt* starts every worker (``python -m kerasdist fit <run_dir>/logs/recipe.json``, each
with its own ``TF_CONFIG`` in its environment only) on fresh localhost ports and waits:

* all workers exit 0: done (the chief wrote ``metrics.json``);
* a worker dies or fails: the survivors get a few seconds to fail on their own (their collectives
  fail within ``strategy.timeout_s``, naming the lost task), then every task is stopped and the
  failure is reported, naming the task and how it ended (killed by a signal, exit code, the task a
  survivor lost); the next attempt resumes from the last backup, up to ``cluster.max_restarts``;
* a worker exits 130 (preempted by SIGTERM after saving): reported as such, restarted the same way;
* the launcher itself gets SIGTERM or Ctrl-C: it forwards SIGTERM to the workers, which save a
  checkpoint at an agreed step and exit; it waits up to :data:`STOP_GRACE_S` seconds, then raises
  ``KeyboardInterrupt`` (the CLI exits 130; re-running the command finishes the run).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from kerasdist.cluster.launcher import LocalLauncher, Task, describe_exit, terminate_on_sigterm
from kerasdist.cluster.spec import local_cluster
from kerasdist.training.fit import say
from kerasdist.training.multi_worker import EXIT_PREEMPTED

STOP_GRACE_S = 60.0
"""Seconds the workers get to save a checkpoint and exit after SIGTERM, before SIGKILL."""
SURVIVOR_GRACE_S = 10.0
"""Seconds the other workers get to fail on their own after one failed (so their logs say why)."""


def _first_failure(launcher: LocalLauncher, tasks: list[Task]) -> Task | None:
    """Poll until a task fails (returned; one killed by a signal first) or all exit 0 (None)."""
    while True:
        failed = launcher.failed()
        if failed:
            return min(failed, key=lambda t: (t.returncode() >= 0, tasks.index(t)))
        if all(t.returncode() == 0 for t in tasks):
            return None
        time.sleep(0.2)


def _wait_for_survivors(tasks: list[Task], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(t.returncode() is None for t in tasks):
        time.sleep(0.2)


def _why(launcher: LocalLauncher, task: Task) -> str:
    """How one task ended, in words, with the lost peer a survivor named in its log."""
    code = task.returncode()
    if code == EXIT_PREEMPTED:
        return f"task {task.name} was preempted (SIGTERM; a checkpoint was saved)"
    text = f"task {task.name} {describe_exit(code)}"
    match = re.search(r"lost (task [^;\n]+?|contact with a peer task) during training",
                      launcher.tail(task, lines=60))
    return f"{text} (it {match.group(0).split(' during')[0]})" if match else text


def describe_failure(launcher: LocalLauncher, first: Task) -> str:
    """The failure report of one attempt: the first failed task, then what the others did."""
    others = [t for t in launcher.tasks if t is not first and t.returncode() not in (None, 0)]
    lines = [_why(launcher, first)] + [f"then {_why(launcher, t)}" for t in others]
    return "; ".join(lines) + f"; log {first.log_path}:\n{launcher.tail(first)}"


def _clean_scratch(recipe, tasks: list[Task]) -> None:
    """Delete the scratch folders of stopped non-chief tasks (local tasks share this machine)."""
    from kerasdist.training.mw_callbacks import temp_dir
    from kerasdist.training.outputs import CHECKPOINT_DIR

    for task in tasks:
        shutil.rmtree(temp_dir(Path(recipe.output.run_dir) / CHECKPOINT_DIR, task.name),
                      ignore_errors=True)


def run_attempt(recipe, args: list[str], log_dir: Path) -> str | None:
    """Start the workers once and wait; return None on success, else the failure report.

    Raises:
        KeyboardInterrupt: SIGTERM or Ctrl-C; the workers were asked to save and stop first.
    """
    spec = local_cluster(workers=recipe.cluster.workers)
    with LocalLauncher(log_dir=log_dir, threads_per_task=recipe.cluster.threads_per_task) as \
            launcher, terminate_on_sigterm():
        tasks = [launcher.start(spec.for_task("worker", i), args) for i in range(spec.num("worker"))]
        say(f"local cluster: {len(tasks)} workers started (worker:0 is the chief); logs in {log_dir}")
        try:
            first = _first_failure(launcher, tasks)
        except KeyboardInterrupt:
            say(f"interrupted: the workers save a checkpoint and stop (up to {STOP_GRACE_S:.0f} s)")
            launcher.stop_all(grace_s=STOP_GRACE_S)
            _clean_scratch(recipe, tasks)
            raise
        if first is None:
            return None
        _wait_for_survivors(tasks, min(SURVIVOR_GRACE_S, recipe.strategy.timeout_s + 5))
        launcher.stop_all()
        _clean_scratch(recipe, tasks)
        return describe_failure(launcher, first)
