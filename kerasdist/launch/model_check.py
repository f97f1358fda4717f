"""The model-against-data check of a fresh local multi-worker run, left to its tasks (issue 42,
item 8: time to first step).

:func:`kerasdist.launch.run.preflight` builds the model against the data in the launching
process (:func:`kerasdist.training.checks.check_recipe_here`): that imports TensorFlow and Keras
there, about 3 s on a quiet machine, before any task starts its own import. Every task runs the
same checks again anyway, right after its strategy starts and before it writes anything
(:func:`kerasdist.training.session.run_session`: the model built under the strategy, checked
against the data; the recipe's callbacks built). A ``MultiWorkerMirroredStrategy`` must be the
first TensorFlow op of its process, so the tasks cannot check before it.

So for a run that can be undone without trace -- a ``local`` cluster of the ``peers`` topology
(``multi_worker``), a run directory that holds no previous run, no ``output.tracking`` -- the
launching process runs every other check (recipe, data splits readable and at least one global
batch, the run directory, cores) and leaves this one to the tasks. A bad model or bad data then
fails every task with the check's own error (class ``bad_input``, exit 2), and
:func:`undo_fresh_run` removes the run directory the launch created: nothing is left written. The
tasks' servers started in the cluster's private network namespace (unreachable from other hosts)
and are stopped with them.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_TASK_PREFIX = re.compile(r"^task \S+ exited with code \d+;.*?\blog \S+: ")


def deferred(recipe, run_dir) -> bool:
    """Whether ``recipe``'s model check is left to its tasks (see module docs)."""
    from kerasdist.strategies import registry

    return (recipe.cluster.kind == "local" and recipe.output.tracking is None
            and registry.for_recipe(recipe).traits.topology == "peers"
            and not _holds_anything(Path(run_dir)))


def _holds_anything(path: Path) -> bool:
    try:
        return any(path.iterdir())
    except FileNotFoundError:
        return False
    except OSError:
        return True


def refused(err: BaseException, run_dir) -> BaseException | None:
    """When ``err`` ended a deferred run before its chief wrote ``run.json`` with a bad-input
    error (the tasks' model or data check): that error with its task prefix dropped (its log is
    removed with the run directory), as the launching process's own check would have raised it;
    else None."""
    from kerasdist.errors import BAD_INPUT, classify
    from kerasdist.training.rundir import RunDir

    if not isinstance(err, Exception) or classify(err) != BAD_INPUT:
        return None
    if RunDir(run_dir).run_info.exists():
        return None
    message = _TASK_PREFIX.sub("", str(err), count=1)
    try:
        return type(err)(message)
    except TypeError:  # a class with another signature: its own message, prefix and all
        return err


def undo_fresh_run(run_dir) -> None:
    """Remove the run directory a deferred run's refusal leaves (its launch created it: the
    task logs of the refused attempt, the lock)."""
    shutil.rmtree(run_dir, ignore_errors=True)


__all__ = ["deferred", "refused", "undo_fresh_run"]
