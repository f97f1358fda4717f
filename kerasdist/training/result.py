"""What a finished run produced (:class:`RunResult`), its ``metrics.json`` and the end-of-run summary."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerasdist._version import __version__
from kerasdist.training import outputs


@dataclass
class RunResult:
    """What a finished run produced. Times in seconds, throughput in examples/s."""

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
        known = {"history", "evaluation", "throughput", "wall_time_s", "initial_epoch", "epochs",
                 "num_replicas", "strategy", "model_path", "versions"}
        model_path = Path(data["model_path"]) if data.get("model_path") else None
        return cls(history=data["history"], evaluation=data["evaluation"],
                   throughput=data["throughput"], wall_time_s=data["wall_time_s"],
                   run_dir=Path(path).parent, model_path=model_path, metrics_path=Path(path),
                   initial_epoch=data["initial_epoch"], epochs=data["epochs"],
                   num_replicas=data["num_replicas"], strategy=data["strategy"],
                   extra={k: v for k, v in data.items() if k not in known})


def write_metrics(result: RunResult, recipe) -> Path:
    """Write ``metrics.json`` (atomically) from a :class:`RunResult`."""
    import keras
    import tensorflow as tf

    data = {
        "history": result.history,
        "evaluation": result.evaluation,
        "throughput": result.throughput,
        "wall_time_s": result.wall_time_s,
        "initial_epoch": result.initial_epoch,
        "epochs": result.epochs,
        "num_replicas": result.num_replicas,
        "strategy": result.strategy,
        "model_path": str(result.model_path) if result.model_path else None,
        "versions": {"kerasdist": __version__, "tensorflow": tf.__version__,
                     "keras": keras.__version__, "python": sys.version.split()[0]},
        **result.extra,
    }
    return outputs.write_json_atomic(result.metrics_path, data)


def summary_text(result: RunResult, *, tensorboard: bool | None = None) -> str:
    """The one-screen summary printed at the end of ``kerasdist fit``.

    Args:
        result: the finished run.
        tensorboard: whether the run wrote TensorBoard logs (``output.tensorboard``); None =
            whether ``<run_dir>/tensorboard`` exists. Without logs no ``tensorboard`` line.
    """
    from kerasdist.training.rundir import RunDir

    run_dir = RunDir(result.run_dir)
    ev = result.evaluation
    lines = ["", "=" * 64, "kerasdist run summary", "-" * 64,
             f"strategy           {result.strategy} ({result.num_replicas} replica(s))",
             f"epochs             {result.initial_epoch} -> {result.epochs}"]
    for key in sorted(ev):
        lines.append(f"held-out {key:<10}{ev[key]:.4f}")
    tp = result.throughput
    lines += [f"throughput         {tp['examples_per_sec']:.1f} examples/s "
              f"({tp['timed_steps']} timed steps, compile/trace excluded)",
              f"wall time          {result.wall_time_s:.1f} s",
              f"model              {result.model_path or '(not saved)'}",
              f"metrics            {result.metrics_path}",
              f"checkpoints        {run_dir.checkpoints}"]
    if tensorboard is None:
        tensorboard = run_dir.tensorboard.is_dir()
    if tensorboard:
        lines.append(f"tensorboard        tensorboard --logdir {run_dir.tensorboard}")
    lines.append("=" * 64)
    return "\n".join(lines)
