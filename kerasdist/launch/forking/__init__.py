"""The fork path of a local fit: tasks forked from a launcher that imported TensorFlow once (time
to first step). On by default where it applies; ``KERASDIST_FORK_TASKS=0`` turns it off.

The package holds every fork of kerasdist: this module (whether the fork path applies, the recipe
checked in a forked child that reports its verdict on a pipe, the first attempt's tasks forked),
:mod:`.process` (a forked process made to stand where a started one would) and :mod:`.netns` (the
isolated launcher forked into a fresh network namespace). The command imports ``tensorflow`` and
``keras`` but starts no TensorFlow runtime (``MultiWorkerMirroredStrategy`` must be the first
runtime op of its process, and the runtime's threads would not survive a fork). It applies only
to a local ``fit`` from kerasdist's own command, without tracking, ``multi_worker`` or
``parameter_server``; once the launcher may have started TensorFlow's runtime, nothing more is
forked (:func:`spend`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from kerasdist.launch.forking import process
from kerasdist.launch.forking.process import ForkedTask

if TYPE_CHECKING:
    from kerasdist.config import Recipe

ENV = "KERASDIST_FORK_TASKS"
"""``0`` turns the fork path off (every task then starts as ``python -m kerasdist``)."""

_STATE = {"warm": False, "spent": False}


def enabled() -> bool:
    """The switch (:data:`ENV`, default on) and a platform with ``fork`` and ``/proc``."""
    return (os.environ.get(ENV, "1") not in ("0", "")
            and sys.platform.startswith("linux") and hasattr(os, "fork"))


def applies(recipe: Recipe) -> bool:
    """Whether this ``fit`` may fork its checks, its namespace child and its tasks (see the
    module docs)."""
    from kerasdist import _exit
    from kerasdist.strategies import registry

    if not enabled() or not _exit.owns_process() or not recipe.cluster.traits.supervised:
        return False
    if recipe.output.tracking is not None:
        return False
    return registry.for_recipe(recipe).traits.topology in ("peers", "coordinator")


def ready(argv: Sequence[str]) -> bool:
    """Whether :func:`start` may fork the task ``argv`` now: this process imported TensorFlow
    for it (:func:`check_recipe`), has not spent the fork path, and ``argv`` is
    ``python -m kerasdist ...`` started from the main thread."""
    return list(argv[:3]) == [sys.executable, "-m", "kerasdist"] and launcher_ready()


def launcher_ready() -> bool:
    """Whether the namespace child of an isolated local cluster may be forked from this process
    now (:mod:`.netns`): as :func:`ready`, for the launcher itself."""
    return (_STATE["warm"] and not _STATE["spent"]
            and threading.current_thread() is threading.main_thread() and not _runtime_started())


def _runtime_started() -> bool:
    """TensorFlow's runtime started in this process (:mod:`kerasdist._compat.tf_runtime`): what
    is forked from it would inherit a runtime without its threads. Nothing is forked from then on
    (:func:`spend`)."""
    from kerasdist._compat import tf_runtime

    if tf_runtime.started():
        spend()
        return True
    return False


def spend() -> None:
    """Fork no more tasks from this process (the first attempt's tasks have started)."""
    _STATE["spent"] = True


def _import_tensorflow() -> None:
    """``import tensorflow, keras`` here, with ``TF_CPP_MIN_LOG_LEVEL`` as the tasks get it
    (:meth:`~kerasdist.launch.processes.LocalLauncher.start_process`): TensorFlow reads it once,
    at import. This process's own environment is left as it was."""
    before = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        if before is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)


def check_recipe(recipe: Recipe) -> None:
    """:func:`kerasdist.training.checks.check_recipe_here`: in a forked child where
    :func:`applies`, else here.

    Raises:
        the check's own error (same class and message), e.g. DataError (exit code 2).
    """
    from kerasdist._log import get_logger
    from kerasdist.training.checks import check_recipe_here

    if not applies(recipe):
        check_recipe_here(recipe)
        return
    _import_tensorflow()
    if _runtime_started():  # a data check ran a TF op here (a function source, say)
        get_logger("launch").debug("TensorFlow's runtime started in this process during the data "
                                   "checks: checking here; the tasks start as new processes")
        check_recipe_here(recipe)
        return
    verdict = _check_in_child(recipe)
    if verdict is None:  # the child died without a verdict: check here, start tasks as before
        get_logger("launch").warning("the forked recipe check ended without a verdict; "
                                     "checking here (the tasks start as new processes)")
        spend()
        check_recipe_here(recipe)
        return
    if not verdict.get("ok"):
        from kerasdist.launch import status

        raise status.rebuild(verdict)
    _STATE["warm"] = True


def _check_in_child(recipe: Recipe) -> dict | None:
    from kerasdist.launch import status
    from kerasdist.training.checks import check_recipe_here

    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = process.fork()
    if pid == 0:  # the child: check, report, exit; never returns
        code = 1
        try:
            os.close(read_fd)
            process.die_with(parent)
            atexit._clear()
            try:
                check_recipe_here(recipe)
                verdict, code = {"ok": True}, 0
            except (Exception, KeyboardInterrupt) as err:
                verdict, code = {"ok": False, **status.record(err)}, 2
            with os.fdopen(write_fd, "w", encoding="utf-8") as pipe:
                pipe.write(json.dumps(verdict))
            process.flush()
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    try:
        return json.loads(data.decode("utf-8")) if data else None
    except ValueError:
        return None


def start(argv: Sequence[str], *, env: dict, log_path: Path) -> ForkedTask:
    """Fork the task ``argv`` (``python -m kerasdist ARGS``; :func:`ready` said yes) with the
    environment ``env`` (the whole of it, as a started task gets it), its standard output and
    error appended to ``log_path``."""
    process.flush()
    parent = os.getpid()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        pid = process.fork()
        if pid == 0:  # the child: never returns
            process.run(parent, lambda: _task_body(argv), name=f"kd-{log_path.stem}",
                           env=env, log_fd=log_fd)
    finally:
        os.close(log_fd)
    return ForkedTask(pid, argv)


def _task_body(argv: Sequence[str]) -> int:
    from kerasdist._timeline import mark

    mark("forked")  # KERASDIST_TIMELINE: this task was forked (tests, the profile)
    return _run(list(argv[3:]))


def _run(args: list[str]) -> int:
    """``python -m kerasdist ARGS`` here: its exit code as the interpreter would give it, after
    the non-daemon threads ended and the ``atexit`` hooks ran (as at an interpreter's exit)."""
    import runpy

    sys.argv = ["-m", *args]  # runpy puts the module's path first, as `python -m` does
    code = 0
    try:
        runpy.run_module("kerasdist", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    return process.finish(code)


__all__ = ["ENV", "ForkedTask", "applies", "check_recipe", "enabled", "launcher_ready", "ready",
           "spend", "start"]
