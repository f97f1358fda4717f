"""How a task tells its launcher how it ended: a small JSON status file, not a log to parse.

The launcher sets ``KERASDIST_STATUS_FILE`` in each child's environment only; the child's CLI writes
``{"class": ..., "exit_code": ..., "message": ..., "lost_tasks": [...]}`` there when it fails
(classes from :func:`kerasdist.errors.classify`). A task that leaves no status file was killed
(signal, out-of-memory killer) and counts as a lost peer.

A local cluster's namespace child (:mod:`kerasdist.launch.isolation`) reports its end the same
way, over a pipe: :func:`record` on its side, :func:`rebuild` on its launcher's.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from kerasdist import _log, errors
from kerasdist._files import read_json
from kerasdist.errors import PEER_LOST, Preempted, TrainingError, classify, exit_code

STATUS_ENV = _log.LAUNCHED_ENV  # its presence also tells a task it has a log of its own


def summary(err: BaseException, limit: int = 1500) -> str:
    """The error's own message, shortened: a TensorFlow graph error keeps its first line and its
    last lines (where TF puts the actual error, e.g. ``indices[3] = 12 is not in [0, 10)``),
    without the Python traceback of the node in between."""
    text = str(err)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if len(text) <= limit or len(lines) < 5:
        return text[:limit]
    return "\n".join([lines[0], "...", *lines[-3:]])[:limit]


def report(err: BaseException) -> str:
    """Write this process's failure to the status file its launcher named (if any); return the
    failure class."""
    failure = classify(err)
    path = os.environ.get(STATUS_ENV)
    if path:
        data = {"class": failure, "exit_code": exit_code(failure, err), "error": type(err).__name__,
                "message": summary(err), "lost_tasks": list(getattr(err, "lost_tasks", []))}
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    return failure


def read(path: Path | None) -> dict[str, Any] | None:
    """A task's status, or None if it wrote none (then it was killed)."""
    return None if path is None else read_json(path)


def failure_class(path: Path | None) -> str:
    """The failure class a task reported; ``peer_lost`` when it reported none."""
    status = read(path)
    return status.get("class", PEER_LOST) if status else PEER_LOST


def record(err: BaseException) -> dict[str, Any]:
    """``err`` as JSON-ready data for :func:`rebuild`: its class name and module, message,
    ``step`` (of :class:`~kerasdist.errors.Preempted`) and failure class."""
    return {"error": type(err).__name__, "module": type(err).__module__, "message": str(err),
            "step": getattr(err, "step", None), "class": classify(err),
            "task": getattr(err, "task", None), "task_error": getattr(err, "error", None),
            "task_detail": getattr(err, "detail", None)}


def rebuild(result: dict) -> BaseException:
    """:func:`_rebuild`, with the failed task's name and error class (``task``, ``error``
    attributes) put back where :func:`record` had them."""
    err = _rebuild(result)
    if result.get("task"):
        with contextlib.suppress(AttributeError):  # a class that refuses new attributes
            err.task, err.error = result["task"], result.get("task_error") or ""
            err.detail = result.get("task_detail") or ""
    return err


def _rebuild(result: dict) -> BaseException:
    """The exception a process reported with :func:`record` (``error``, ``module``, ``message``,
    ``step``), rebuilt with the same class where it is kerasdist's, TensorFlow's or a builtin;
    else a :class:`TrainingError` naming the original class (the same failure class and exit
    code 1)."""
    name, module, message = result["error"], result.get("module", ""), result.get("message", "")
    if name == "Preempted":
        return Preempted(int(result.get("step") or 0))
    if name in ("KeyboardInterrupt", "Terminated", "Interrupted"):
        return KeyboardInterrupt(message)
    found = None
    if module.startswith("kerasdist"):
        found = getattr(errors, name, None)
    elif module == "builtins":
        found = getattr(builtins, name, None)
    elif module.startswith("tensorflow"):
        import tensorflow as tf

        op_error = getattr(tf.errors, name, None)
        if isinstance(op_error, type) and issubclass(op_error, tf.errors.OpError):
            return op_error(None, None, message)
    if isinstance(found, type) and issubclass(found, Exception):
        with contextlib.suppress(TypeError):
            return found(message)
    return TrainingError(f"{name}: {message}")
