"""The console of a run kerasdist launches locally: which task's log is the run's progress
(:func:`chief_log`) and its echo while the cluster runs (:func:`chief_echo`; issue 42 item 2)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from kerasdist.launch.echo import Echo


def chief_log(recipe) -> Path | None:
    """The log file of the task of a local cluster whose progress is the run's (the task that
    writes the outputs, in a process of its own): ``worker-0.log`` under ``multi_worker``,
    ``chief-0.log`` for an elastic parameter-server run (its coordinator is task ``chief:0``);
    None where that task is not a task of the local cluster (a parameter-server coordinator in
    the launching process, whose output is the console already; Ray, which forwards its
    workers' output itself)."""
    from kerasdist.launch.coordinator import elastic
    from kerasdist.strategies import registry
    from kerasdist.training.rundir import RunDir

    if not recipe.cluster.traits.supervised:
        return None
    topology = registry.for_recipe(recipe).traits.topology
    if topology == "peers":
        return RunDir.of(recipe).logs / "worker-0.log"
    if topology == "coordinator" and elastic(recipe):
        return RunDir.of(recipe).logs / "chief-0.log"
    return None


@contextlib.contextmanager
def chief_echo(recipe, *, echo: bool):
    """While a local cluster runs, its chief's new log lines on the console (Keras's progress,
    one line an epoch; kerasdist's notices: resume, early stop; TensorFlow's start-up noise left
    out), without a prefix: one task speaks. Nothing with ``echo`` False (``fit --quiet``)."""
    path = chief_log(recipe) if echo else None
    if path is None:
        yield
        return
    with Echo() as shown:
        shown.follow(path)
        yield


__all__ = ["chief_echo", "chief_log"]
