"""What a finished run produced (:class:`RunResult`), its ``metrics.json`` and the end-of-run summary."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerasdist._files import write_json_atomic
from kerasdist._version import __version__


@dataclass
class RunResult:
    """What a finished run produced. Times in seconds, throughput in examples/s.

    ``epochs`` is the number of whole epochs trained through (the global step over the steps per
    epoch, rounded down), not the recipe's ``trainer.epochs``: after an early stop it is the epoch
    the run stopped at. ``extra`` holds ``epochs_planned`` (``trainer.epochs``) and ``stopped``
    (:func:`stop_reason`) for a run of :func:`kerasdist.training.run_session`.
    """

    history: dict[str, list[float]]
    evaluation: dict[str, float]
    throughput: dict[str, float]
    wall_time_s: float
    run_dir: Path
    model_path: Path | None
    metrics_path: Path
    initial_epoch: int
    epochs: int
    num_replicas: int
    strategy: str
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, path: Path) -> RunResult:
        """Rebuild a result from a ``metrics.json`` written by :func:`write_metrics`."""
        import json

        data = json.loads(Path(path).read_text(encoding="utf-8"))
        model_path = Path(data["model_path"]) if data.get("model_path") else None
        return cls(**{k: data[k] for k in _SAVED}, run_dir=Path(path).parent, model_path=model_path,
                   metrics_path=Path(path), extra={k: v for k, v in data.items()
                                                   if k not in (*_SAVED, "model_path", "versions")})


_SAVED = ("history", "evaluation", "throughput", "wall_time_s", "initial_epoch", "epochs",
          "num_replicas", "strategy")
"""The :class:`RunResult` fields ``metrics.json`` holds under their own names, in its order."""


def write_metrics(result: RunResult, recipe) -> Path:
    """Write ``metrics.json`` (atomically) from a :class:`RunResult`."""
    import keras
    import tensorflow as tf

    data = {
        **{k: getattr(result, k) for k in _SAVED},
        "model_path": str(result.model_path) if result.model_path else None,
        "versions": {"kerasdist": __version__, "tensorflow": tf.__version__,
                     "keras": keras.__version__, "python": sys.version.split()[0]},
        **result.extra,
    }
    return write_json_atomic(result.metrics_path, data)


def stop_reason(*, steps: int, start_step: int, steps_per_epoch: int, epochs: int,
                callbacks=()) -> dict[str, Any]:
    """Why a run that returned normally stopped where it did (a preempted or failed run raises
    instead).

    Args:
        steps: the global step reached (``optimizer.iterations``).
        start_step: the global step the run resumed from (0 for a fresh run).
        steps_per_epoch: global steps per epoch.
        epochs: the recipe's ``trainer.epochs``.
        callbacks: the recipe's callbacks; the first with a positive ``stopped_epoch`` (Keras's
            ``EarlyStopping``) is named as the one that stopped the run.

    Returns:
        ``{"reason", "epoch", "step", "by"}``: ``reason`` is ``"done"`` (every epoch trained in
        this run), ``"already_complete"`` (the checkpoint held every epoch: nothing trained) or
        ``"early_stop"`` (a callback set ``model.stop_training``); ``epoch`` the 1-based epoch the
        run ended in; ``step`` the global step; ``by`` the stopping callback's class name, or None.
    """
    total = epochs * steps_per_epoch
    if steps >= total:
        reason = "already_complete" if start_step >= total else "done"
    else:
        reason = "early_stop"
    by = next((type(c).__name__ for c in callbacks if (getattr(c, "stopped_epoch", 0) or 0) > 0),
              None) if reason == "early_stop" else None
    epoch = -(-steps // steps_per_epoch) if steps_per_epoch else 0  # the epoch it ended in
    return {"reason": reason, "epoch": epoch, "step": steps, "by": by}


def _epochs_line(result: RunResult) -> list[str]:
    """The ``epochs`` and ``steps`` lines: what was trained, of how many, and why it stopped."""
    planned = result.extra.get("epochs_planned")
    stopped = result.extra.get("stopped") or {}
    if planned is None:  # a metrics.json of an earlier kerasdist
        return [f"epochs             {result.initial_epoch} -> {result.epochs}"]
    spe = result.extra.get("steps_per_epoch") or 0
    step, start = stopped.get("step", 0), result.extra.get("start_step", 0)
    reason = stopped.get("reason")
    if reason == "early_stop":
        who = stopped.get("by") or "a callback"
        why = (f"stopped early by {who} after epoch {result.epochs}" if step % max(spe, 1) == 0
               else f"stopped early by {who} in epoch {stopped.get('epoch')}, at step {step}")
    elif reason == "already_complete":
        why = "already complete: nothing trained"
    else:
        why = "done"
    return [f"epochs             {result.initial_epoch} -> {result.epochs} of {planned} ({why})",
            f"steps              {start} -> {step} of {planned * spe}"]


def _wall_line(session_s: float, command_s: float | None) -> str:
    if command_s is None or command_s < session_s:
        return f"wall time          {session_s:.1f} s"
    return (f"wall time          {command_s:.1f} s since the command started: training session "
            f"{session_s:.1f} s, the rest {command_s - session_s:.1f} s (start-up, checks, "
            "cluster start and stop)")


SLOW_FACTOR = 1.5
"""A task whose mean steps/s is this many times below the median of the tasks' is named."""


def slow_tasks(tasks: dict | None) -> list[str]:
    """One summary line per task of ``metrics.json``'s ``tasks`` whose mean steps/s over the
    epochs is more than :data:`SLOW_FACTOR` times below the median task's (2 or more tasks)."""
    import statistics

    rates = {task: statistics.fmean(f["steps_per_sec"]) for task, f in (tasks or {}).items()
             if f.get("steps_per_sec")}
    median = statistics.median(rates.values()) if len(rates) > 1 else 0.0
    return [f"slow task          {task}: {rate:.2f} steps/s, "
            f"{median / rate if rate else float('inf'):.1f}x below the median task's "
            f"{median:.2f} steps/s" for task, rate in rates.items() if rate * SLOW_FACTOR < median]


def summary_text(result: RunResult, *, tensorboard: bool | None = None,
                 command_s: float | None = None) -> str:
    """The one-screen summary printed at the end of ``kerasdist fit``.

    Args:
        result: the finished run.
        tensorboard: whether the run wrote TensorBoard logs (``output.tensorboard``); None =
            whether ``<run_dir>/tensorboard`` exists. Without logs no ``tensorboard`` line.
        command_s: seconds since the command started (the wall time the user waited, a local
            cluster's start and the checks before it included); None: not shown. The
            ``wall time`` line then splits it: the training session (``wall_time_s``, from
            the run directory's check to the saved model) and the rest (imports, checks, a
            local cluster's start and stop).
    """
    from kerasdist.strategies import registry
    from kerasdist.training.rundir import RunDir

    run_dir = RunDir(result.run_dir)
    ev = result.evaluation
    ps = result.extra.get("parameter_server")  # None: nothing trained in this run
    sync = (ps or {}).get("sync")
    where = (f"{result.num_replicas} replica(s)" if not registry.get(result.strategy).traits.needs_ps
             else f"{result.num_replicas} worker(s)" if ps is None
             else f"{result.num_replicas} worker(s), asynchronous" if not sync
             else f"{result.num_replicas} worker(s), synchronous: {sync['replicas_to_aggregate']} "
                  f"of {sync['num_workers']} gradients per step, {sync['dropped']} dropped")
    lines = ["", "=" * 64, "kerasdist run summary", "-" * 64,
             f"strategy           {result.strategy} ({where})", *_epochs_line(result)]
    for key in sorted(ev):
        lines.append(f"held-out {key:<10}{ev[key]:.4f}")
    tp = result.throughput
    trained = (result.extra.get("stopped") or {}).get("reason") != "already_complete"
    lines += [f"throughput         {tp['examples_per_sec']:.1f} examples/s "
              f"({tp['timed_steps']} timed steps, compile/trace excluded)" if trained else
              "throughput         - (nothing trained in this run)",
              _wall_line(result.wall_time_s, command_s),
              f"model              {result.model_path or '(not saved)'}",
              f"metrics            {result.metrics_path}",
              f"checkpoints        {run_dir.checkpoints}"]
    lines += slow_tasks(result.extra.get("tasks"))
    if tensorboard is None:
        tensorboard = run_dir.tensorboard.is_dir()
    if tensorboard:
        lines.append(f"tensorboard        tensorboard --logdir {run_dir.tensorboard}")
    lines.append("=" * 64)
    return "\n".join(lines)
