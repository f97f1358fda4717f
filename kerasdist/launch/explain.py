"""The last paragraph of a failed run: what failed, whether a re-run helps, where the logs are.

A run that fails at runtime ends its console output with one short paragraph::

    kerasdist: the run failed.
      what:      task worker:1, InternalError: Unable to parse request
      step:      the latest checkpoint is at global step 40 (runs/x/checkpoints)
      retryable: yes: a lost task or a transient TensorFlow RPC error; re-run the same command
                 to resume from global step 40 (cluster.max_restarts: 2 restarts it by itself)
      logs:      runs/x/logs (worker-1.log)

Whether a failure is retryable is its failure class (:func:`kerasdist.errors.classify`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kerasdist.errors import RETRYABLE, classify

_TASK_IN_MESSAGE = re.compile(r"/job:(chief|worker|ps|evaluator)/replica:\d+/task:(\d+)")
_TASK_NAMED = re.compile(r"\btask (chief|worker|ps|evaluator):(\d+)")
_NOISE = ("Traceback", "File \"", "During handling", "The above exception", "From /job:",
          "Additional GRPC error", ":{", "[[")
RUN: dict = {}
"""What the CLI's command knows of the run, for the paragraph of its failure: ``run_dir``,
``logs``, ``max_restarts`` (set by ``fit`` and ``launch`` once their input is checked)."""
WIDTH = 100
"""Characters of the error line shown."""


def latest_step(checkpoints: Path | None) -> int | None:
    """The global step of the newest complete checkpoint in ``checkpoints`` (``ckpt-N.index``
    with its data file; checkpoints are numbered by global step), or None when there is none."""
    if checkpoints is None:
        return None
    steps = []
    try:
        names = os.listdir(checkpoints)
    except OSError:
        return None
    for name in names:
        match = re.fullmatch(r"ckpt-(\d+)\.index", name)
        if match and any(n.startswith(f"ckpt-{match.group(1)}.data-") for n in names):
            steps.append(int(match.group(1)))
    return max(steps) if steps else None


def failed_task(err: BaseException) -> str | None:
    """The task the failure came from: the ``task`` attribute the launcher set, else a task the
    message names (``task worker:1`` in kerasdist's words, ``/job:worker/replica:0/task:1`` in
    TensorFlow's)."""
    task = getattr(err, "task", None)
    if task:
        return str(task)
    text = str(err)
    for pattern in (_TASK_NAMED, _TASK_IN_MESSAGE):
        match = pattern.search(text)
        if match:
            return f"{match.group(1)}:{match.group(2)}"
    return None


def error_line(err: BaseException) -> str:
    """The one line that matters: the first line of the error's own message that is not a
    traceback frame nor empty, shortened to :data:`WIDTH` characters; the class name first
    (the task's own class and message where the launcher reported them: ``error``,
    ``detail``)."""
    name = getattr(err, "error", None) or type(err).__name__
    line = ""
    for candidate in (getattr(err, "detail", None) or str(err)).splitlines():
        candidate = candidate.strip()
        if candidate and not candidate.startswith(_NOISE):
            line = candidate
            break
    if len(line) > WIDTH:
        line = line[:WIDTH - 3] + "..."
    return f"{name}: {line}" if line else name


def brief(err: BaseException, lines: int = 6) -> str:
    """The error's message cut to its first ``lines`` non-empty lines (each at most 300
    characters), saying how many more there were: TensorFlow's remote errors carry hundreds of
    lines of gRPC detail that the task logs keep."""
    text = [line.rstrip()[:300] for line in str(err).splitlines() if line.strip()]
    more = len(text) - lines
    kept = "\n".join(text[:lines])
    return kept + (f"\n... ({more} more line(s): --debug, or the task logs)" if more > 0 else "")


def paragraph(err: BaseException, *, run_dir: Path | None, logs: Path | None = None,
              max_restarts: int | None = None) -> str:
    """The closing paragraph of a run that failed with ``err`` (see the module docs).

    Args:
        err: the error the run ended with (as the CLI received it).
        run_dir: the run directory (its ``checkpoints/`` give the resume step), or None (a
            ``kerasdist launch`` of a script: the script owns its checkpoints).
        logs: where the task logs are (default ``<run_dir>/logs``); None and no run_dir: the
            console only.
        max_restarts: the run's ``cluster.max_restarts`` (None: not a cluster kerasdist restarts).

    Returns:
        Four to five lines, the first ``kerasdist: the run failed.``
    """
    task = failed_task(err)
    what = f"task {task}, {error_line(err)}" if task else error_line(err)
    checkpoints = Path(run_dir) / "checkpoints" if run_dir is not None else None
    step = latest_step(checkpoints)
    lines = ["kerasdist: the run failed.", f"  what:      {what}"]
    if run_dir is not None:
        lines.append(f"  step:      the latest checkpoint is at global step {step} ({checkpoints})"
                     if step is not None else "  step:      no checkpoint was written yet")
    resume = (f"resume from global step {step}" if step is not None
              else "start again from step 0")
    if classify(err) in RETRYABLE:
        how = (f"re-run the same command to {resume}" if run_dir is not None
               else "re-run the same command (the script resumes from its own checkpoints)")
        if max_restarts == 0:
            how += "; set cluster.max_restarts (e.g. 2) to restart it by itself"
        elif max_restarts:
            how += f"; the {max_restarts} restart(s) of cluster.max_restarts were spent"
        lines.append("  retryable: yes: a lost task or a transient TensorFlow RPC error; " + how)
    else:
        lines.append("  retryable: no: a deterministic error (the same input fails the same "
                     f"way); fix it, then a re-run will {resume}")
    logs = logs if logs is not None else (Path(run_dir) / "logs" if run_dir is not None else None)
    if logs is not None and Path(logs).is_dir():
        own = f" ({task.replace(':', '-')}.log)" if task and \
            (Path(logs) / f"{task.replace(':', '-')}.log").exists() else ""
        lines.append(f"  logs:      {logs}{own}")
    return "\n".join(lines)


__all__ = ["brief", "error_line", "failed_task", "latest_step", "paragraph"]
