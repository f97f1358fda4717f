"""The last resort of a kerasdist process whose main thread is blocked for good in native code.

TensorFlow's ``ClusterCoordinator`` can block the thread that runs it with no way back (after a
lost worker it waits in ``update_server_def`` for that worker; a Python signal does not wake it).
The supervisor then calls :func:`abandon`: the failure is reported by whoever owns the process's
exit (the CLI, the network-namespace child: :func:`reporting_to`) and the process ends with the
failure's exit code without unwinding the blocked thread. In a process kerasdist does not own (a
library call that keeps its coordinator in the caller's interpreter) :func:`abandon` logs the
failure and ends nothing. Nothing is lost: the last complete checkpoint stays the resume point,
and ``model.keras`` and ``metrics.json`` are written atomically at the end of a run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator

from kerasdist import errors
from kerasdist._log import get_logger

log = get_logger("launch")

_REPORTERS: list[Callable[[BaseException], object]] = []


@contextlib.contextmanager
def reporting_to(report: Callable[[BaseException], object]) -> Iterator[None]:
    """Within the block, :func:`abandon` reports its error with ``report(err)`` (the innermost
    block wins): the CLI's failure printer, the namespace child's result pipe."""
    _REPORTERS.append(report)
    try:
        yield
    finally:
        _REPORTERS.remove(report)


def owns_process() -> bool:
    """Whether this process is kerasdist's own (a reporter is registered: the CLI, the namespace
    child), so that :func:`abandon` may end it."""
    return bool(_REPORTERS)


def abandon(err: BaseException) -> None:
    """In a process kerasdist owns (:func:`owns_process`): report ``err`` and end the process now
    with its exit code (:func:`errors.exit_code`: 1 for
    :class:`~kerasdist.errors.TaskFailedError`), leaving any blocked thread where it is.

    In the user's own interpreter (no reporter: a library call) ``err`` is logged at ERROR level
    and nothing is ended: a library call never ends its caller's interpreter (module docs).
    """
    if not _REPORTERS:
        log.error(f"failed: {err}. The coordinator thread stays blocked in TensorFlow; this "
                  "interpreter is not ended by kerasdist (run the recipe with `kerasdist fit`, or "
                  "without extra callbacks, to have it ended and the failure raised)")
        return
    try:
        _REPORTERS[-1](err)
    except Exception as report_error:  # the exit must still happen
        log.error(f"could not report the failure ({report_error!r}): {err}")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        from kerasdist import _native_log

        _native_log.drain()  # the failure line may still sit in the stderr filter's pipe
    os._exit(errors.exit_code(errors.classify(err), err))
